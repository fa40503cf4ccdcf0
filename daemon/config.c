/*
 * config.c - /etc/nwc/nwcd.conf: nwcd's settings file, parsed with inih (Debian's libinih).
 *
 *   [daemon]   store, socket, socket_mode (octal), backend, threads, log_level, admin_group
 *   [memory]   host_budget (e.g. 8G), gpu_budget (per GPU, for the CUDA backend)
 *   [limits]   max_conn_per_uid, max_inflight (per connection), max_outq (reply bytes queued),
 *              max_outq_uid (reply bytes queued on all connections of one uid),
 *              poll_us (how long the loop polls for the next request; 0 never)
 *   [preload]  models = a, b c   (loaded and pinned at start, before READY=1)
 *
 * Which file: --config PATH, else $NWCD_CONFIG (empty: none), else /etc/nwc/nwcd.conf where it
 * exists; a reload reads the same one (with none, SIGHUP logs that there is nothing to
 * re-read).  Precedence: command-line flags > file > built-in defaults.  main.c reports each
 * flag it sees (nwcd_config_flag) so that the file never overrides one, at start or on reload.
 *
 * Errors: an unknown section or key, a bad value or a line that is not "key = value" is
 * "FILE:LINE: why", fatal at start (exit 2) and, on SIGHUP, logged with nothing changed.  The
 * line numbers come from our own line reader under ini_parse_stream (inih's handler does not
 * get them in Debian's build).
 *
 * Reload (loop thread, SIGHUP): applied at once are host_budget and gpu_budget (residency evicts
 * down to them), the limits, log_level and admin_group; the preload list is read by the service
 * thread (notify.c), whose SIGHUP handler starts its pass after a reload.  store, socket,
 * socket_mode, backend and threads need a restart: a change is logged as not applied.  The
 * active settings are kept until the next successful reload, since nwcd_config's strings point
 * into them.
 */
#include "config.h"

#include "clock.h"
#include "log.h"
#include "nwcd.h"
#include "policy.h"
#include "residency.h"

#include "nwc_error.h"

#include <errno.h>
#include <ini.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *config_path;    /* --config, or NULL: the default where it exists */
static bool no_file;               /* NWCD_CONFIG= (empty): no file, at start nor on reload */
static unsigned flags_set;         /* NWCD_SET_* given on the command line */
static nwcd_settings active;
static pthread_mutex_t active_lock = PTHREAD_MUTEX_INITIALIZER; /* the swap vs the preload copy */

/* ---- parsing ----------------------------------------------------------------------------- */

typedef struct parse_ctx {
  FILE *f;
  const char *path;
  int line;          /* the line the latest chunk belongs to */
  bool line_done;    /* the latest chunk ended its line */
  nwcd_settings *s;
  int err;           /* first error (negative errno), its line and text */
  int err_line;
  char msg[300];
} parse_ctx;

static char *read_line(char *str, int num, void *stream) {
  parse_ctx *p = stream;
  char *r = fgets(str, num, p->f);
  if (!r) return NULL;
  if (p->line_done) p->line++;
  size_t n = strlen(r);
  p->line_done = n && r[n - 1] == '\n';
  return r;
}

static int bad(parse_ctx *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(parse_ctx *p, const char *fmt, ...) {
  if (!p->err) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg, sizeof p->msg, fmt, ap);
    va_end(ap);
    p->err = -EINVAL, p->err_line = p->line;
  }
  return 0; /* inih: error on this line (it keeps going; we report the first) */
}

static int parse_uint(const char *v, int base, unsigned long max, unsigned *out) {
  char *end;
  errno = 0;
  unsigned long x = strtoul(v, &end, base);
  if (errno || end == v || *end || *v == '-' || x > max) return -EINVAL;
  *out = (unsigned)x;
  return 0;
}

/* "error", "warning", "info", "debug" (or 0..3): 0 and *level, or -EINVAL. */
static int parse_log_level(const char *s, int *level) {
  static const char *names[] = {"error", "warning", "info", "debug"};
  for (int i = 0; i < 4; i++)
    if (!strcmp(s, names[i])) return *level = i, 0;
  if (!strcmp(s, "warn")) return *level = NWCD_LOG_WARN, 0;
  if (s[0] >= '0' && s[0] <= '3' && !s[1]) return *level = s[0] - '0', 0;
  return nwc__fail(-EINVAL, "log level '%s' is not error, warning, info or debug", s);
}

static int set_str(parse_ctx *p, char **dst, const char *v, unsigned bit) {
  if (!*v) return bad(p, "empty value");
  free(*dst);
  *dst = strdup(v);
  if (!*dst) return p->err = -ENOMEM, 0;
  p->s->set |= bit;
  return 1;
}

static int set_count(parse_ctx *p, const char *name, const char *v, unsigned long max,
                     unsigned *dst, unsigned bit) {
  if (parse_uint(v, 10, max, dst) < 0 || !*dst)
    return bad(p, "%s: expected a count 1..%lu, got '%s'", name, max, v);
  p->s->set |= bit;
  return 1;
}

static int set_size(parse_ctx *p, const char *name, const char *v, uint64_t *dst, unsigned bit) {
  if (nwcd_parse_size(v, dst) < 0 || !*dst)
    return bad(p, "%s: bad size '%s' (e.g. 512M, 8G, 1.5GiB)", name, v);
  p->s->set |= bit;
  return 1;
}

/* "a, b c": model names separated by commas and/or blanks, each valid and listed once. */
static int set_preload(parse_ctx *p, const char *v) {
  nwcd_settings *s = p->s;
  char *copy = strdup(v), *save = NULL;
  if (!copy) return p->err = -ENOMEM, 0;
  for (char *tok = strtok_r(copy, ", \t", &save); tok; tok = strtok_r(NULL, ", \t", &save)) {
    if (!nwc_model_name_valid(tok)) {
      bad(p, "preload: '%s' is not a valid model name", tok);
      free(copy);
      return 0;
    }
    bool dup = false;
    for (size_t i = 0; i < s->npreload; i++) dup |= !strcmp(s->preload[i], tok);
    if (dup) continue;
    char **a = realloc(s->preload, (s->npreload + 1) * sizeof *a);
    char *name = a ? strdup(tok) : NULL;
    if (a) s->preload = a;
    if (!name) {
      free(copy);
      return p->err = -ENOMEM, 0;
    }
    s->preload[s->npreload++] = name;
  }
  free(copy);
  s->set |= NWCD_SET_PRELOAD;
  return 1;
}

static int on_key(void *user, const char *section, const char *name, const char *v) {
  parse_ctx *p = user;
  nwcd_settings *s = p->s;
  if (!name) return 1; /* a section header alone */
  if (!strcmp(section, "daemon")) {
    if (!strcmp(name, "store")) return set_str(p, &s->store, v, NWCD_SET_STORE);
    if (!strcmp(name, "socket")) return set_str(p, &s->socket, v, NWCD_SET_SOCKET);
    if (!strcmp(name, "backend")) {
      if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "cuda"))
        return bad(p, "backend: expected auto, cpu or cuda, got '%s'", v);
      return set_str(p, &s->backend, v, NWCD_SET_BACKEND);
    }
    if (!strcmp(name, "admin_group"))
      return s->admin_line = p->line, set_str(p, &s->admin_group, v, NWCD_SET_ADMIN);
    if (!strcmp(name, "threads")) return set_count(p, name, v, 1024, &s->threads, NWCD_SET_THREADS);
    if (!strcmp(name, "socket_mode")) {
      if (parse_uint(v, 8, 0777, &s->socket_mode) < 0)
        return bad(p, "socket_mode: expected an octal mode such as 0660, got '%s'", v);
      return s->set |= NWCD_SET_MODE, 1;
    }
    if (!strcmp(name, "log_level")) {
      if (parse_log_level(v, &s->log_level) < 0)
        return bad(p, "log_level: expected error, warning, info or debug, got '%s'", v);
      return s->set |= NWCD_SET_LOGLEVEL, 1;
    }
  } else if (!strcmp(section, "memory")) {
    if (!strcmp(name, "host_budget")) return set_size(p, name, v, &s->budget, NWCD_SET_BUDGET);
    if (!strcmp(name, "gpu_budget")) return set_size(p, name, v, &s->gpu_budget, NWCD_SET_GPU);
  } else if (!strcmp(section, "limits")) {
    if (!strcmp(name, "max_conn_per_uid"))
      return set_count(p, name, v, 100000, &s->max_conn_per_uid, NWCD_SET_CONN);
    if (!strcmp(name, "max_inflight"))
      return set_count(p, name, v, 4096, &s->max_inflight, NWCD_SET_INFLIGHT);
    if (!strcmp(name, "max_outq")) return set_size(p, name, v, &s->max_outq, NWCD_SET_OUTQ);
    if (!strcmp(name, "max_outq_uid"))
      return set_size(p, name, v, &s->max_outq_uid, NWCD_SET_OUTQ_UID);
    if (!strcmp(name, "poll_us")) {
      if (parse_uint(v, 10, 1000000, &s->poll_us) < 0)
        return bad(p, "poll_us: expected microseconds 0..1000000, got '%s'", v);
      return s->set |= NWCD_SET_POLL, 1;
    }
  } else if (!strcmp(section, "preload")) {
    if (!strcmp(name, "models")) return set_preload(p, v);
  } else {
    return bad(p, "unknown section [%s] (daemon, memory, limits, preload)", section);
  }
  static const char *const keys[][2] = {
      {"daemon", "store, socket, socket_mode, backend, threads, log_level, admin_group"},
      {"memory", "host_budget, gpu_budget"},
      {"limits", "max_conn_per_uid, max_inflight, max_outq, max_outq_uid, poll_us"},
      {"preload", "models"}};
  const char *known = "";
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
    if (!strcmp(section, keys[i][0])) known = keys[i][1];
  return bad(p, "unknown key '%s' in [%s] (%s)", name, section, known);
}

static void settings_free(nwcd_settings *s) {
  free(s->store), free(s->socket), free(s->backend), free(s->admin_group);
  for (size_t i = 0; i < s->npreload; i++) free(s->preload[i]);
  free(s->preload);
  memset(s, 0, sizeof *s);
}

/* Parses path into *s (zeroed first).  0, -ENOENT when it does not exist, or -EINVAL / -errno
 * with the detail "PATH:LINE: why". */
static int settings_parse(const char *path, nwcd_settings *s) {
  memset(s, 0, sizeof *s);
  s->log_level = -1;
  parse_ctx p = {.path = path, .s = s, .line_done = true};
  p.f = fopen(path, "re");
  struct stat st;
  int err = !p.f ? errno : fstat(fileno(p.f), &st) < 0 ? errno : S_ISDIR(st.st_mode) ? EISDIR : 0;
  if (err) { /* a directory opens, and reads as an empty file */
    if (p.f) fclose(p.f);
    return nwc__fail(-err, "%s: %s", path, strerror(err));
  }
  int rc = ini_parse_stream(read_line, &p, on_key, &p);
  fclose(p.f);
  if (!p.err && rc > 0) { /* inih refused the line itself (no '=', unclosed [section]) */
    p.err = -EINVAL, p.err_line = rc;
    snprintf(p.msg, sizeof p.msg, "not a 'key = value' line or a [section] header");
  } else if (!p.err && rc < 0) {
    p.err = -ENOMEM, p.err_line = 0;
    snprintf(p.msg, sizeof p.msg, "out of memory");
  }
  if (p.err) {
    settings_free(s);
    return nwc__fail(p.err, "%s:%d: %s", path, p.err_line, p.msg);
  }
  return 0;
}

/* ---- flags, start, reload ----------------------------------------------------------------- */

/* Applies s's admin group (none: only root and nwcd's uid are admins).  A group that does not
 * exist is "PATH:LINE: why" as the file's other errors, with what to do about it. */
static int set_admin_group(const char *path, const nwcd_settings *s) {
  int rc = nwcd_policy_set_admin_group(s->admin_group);
  if (rc < 0) {
    char why[300];
    snprintf(why, sizeof why, "%s", nwc_error_detail());
    rc = nwc__fail(rc, "%s:%d: admin_group: %s%s", path, s->admin_line, why,
                   rc == -ENOENT ? " (create the group, e.g. with systemd-sysusers, or leave "
                                   "admin_group out)" : "");
  }
  return rc;
}

int nwcd_config_flag(nwcd_config *cfg, int opt, const char *arg) {
  (void)cfg;
  int level = 0; /* set by parse_log_level where it succeeds (-O3 cannot tell) */
  switch (opt) {
    case 's': flags_set |= NWCD_SET_STORE; break;
    case 'S': flags_set |= NWCD_SET_SOCKET; break;
    case 'b': flags_set |= NWCD_SET_BACKEND; break;
    case 'B': flags_set |= NWCD_SET_BUDGET; break;
    case 'G': flags_set |= NWCD_SET_GPU; break;
    case 't': flags_set |= NWCD_SET_THREADS; break;
    case 'c': flags_set |= NWCD_SET_CONN; break;
    case 'P': flags_set |= NWCD_SET_POLL; break;
    case 'v': case 'q': flags_set |= NWCD_SET_LOGLEVEL; break;
    case 'C': config_path = arg; break;
    case 'L':
      if (parse_log_level(arg, &level) < 0) {
        fprintf(stderr, "nwcd: --log-level: %s\n", nwc_error_detail());
        return -EINVAL;
      }
      nwcd_log_set_level(level);
      flags_set |= NWCD_SET_LOGLEVEL;
      break;
    default: break;
  }
  return 0;
}

/* The settings the running daemon may change: budget, limits, log level (not under a flag). */
static void apply_runtime(nwcd_config *cfg, const nwcd_settings *s) {
  unsigned use = s->set & ~flags_set;
  if (use & NWCD_SET_BUDGET) __atomic_store_n(&cfg->budget, s->budget, __ATOMIC_RELAXED);
  if (use & NWCD_SET_GPU) cfg->gpu_budget = s->gpu_budget;
  if (use & NWCD_SET_CONN) cfg->max_conn_per_uid = s->max_conn_per_uid;
  if (use & NWCD_SET_INFLIGHT) cfg->max_inflight = s->max_inflight;
  if (use & NWCD_SET_OUTQ) __atomic_store_n(&cfg->max_outq, s->max_outq, __ATOMIC_RELAXED);
  if (use & NWCD_SET_OUTQ_UID)
    __atomic_store_n(&cfg->max_outq_uid, s->max_outq_uid, __ATOMIC_RELAXED);
  if (use & NWCD_SET_POLL) __atomic_store_n(&cfg->poll_us, s->poll_us, __ATOMIC_RELAXED);
  if (use & NWCD_SET_LOGLEVEL) nwcd_log_set_level(s->log_level);
}

int nwcd_config_load(nwcd_config *cfg) {
  /* NWCD_CONFIG=PATH stands for --config PATH; NWCD_CONFIG= (empty) reads no file, so tests
   * do not depend on the machine's /etc/nwc/nwcd.conf. */
  const char *env = getenv("NWCD_CONFIG");
  if (!config_path && env) {
    if (!*env) return no_file = true, 0;
    config_path = env;
  }
  const char *path = config_path ? config_path : NWCD_CONFIG_DEFAULT;
  if (!config_path && access(path, F_OK) != 0) return 0; /* no file: flags and defaults */
  int rc = settings_parse(path, &active);
  if (rc < 0) {
    fprintf(stderr, "nwcd: config %s\n", nwc_error_detail());
    return rc;
  }
  rc = set_admin_group(path, &active);
  if (rc < 0) {
    fprintf(stderr, "nwcd: config %s\n", nwc_error_detail());
    return rc;
  }
  unsigned use = active.set & ~flags_set;
  if (use & NWCD_SET_STORE) cfg->store_dir = active.store;
  if (use & NWCD_SET_SOCKET) cfg->socket_path = active.socket;
  if (use & NWCD_SET_BACKEND) cfg->backend = active.backend;
  if (use & NWCD_SET_THREADS) cfg->threads = active.threads;
  if (active.set & NWCD_SET_MODE) cfg->socket_mode = active.socket_mode;
  apply_runtime(cfg, &active);
  nwcd_log(NWCD_LOG_INFO, "config %s read (%zu preload models)", path, active.npreload);
  nwcd_log(NWCD_LOG_DEBUG, "config: file sets 0x%x, flags 0x%x (flags win); budget %llu, "
           "max_conn_per_uid %u, max_inflight %u, max_outq %llu", active.set, flags_set,
           (unsigned long long)cfg->budget, cfg->max_conn_per_uid, cfg->max_inflight,
           (unsigned long long)cfg->max_outq);
  return 0;
}

int nwcd_config_preload(char ***out, size_t *n) {
  pthread_mutex_lock(&active_lock);
  size_t k = active.npreload;
  char **a = calloc(k ? k : 1, sizeof *a);
  for (size_t i = 0; a && i < k; i++)
    if (!(a[i] = strdup(active.preload[i]))) {
      while (i) free(a[--i]);
      free(a), a = NULL;
    }
  pthread_mutex_unlock(&active_lock);
  if (!a) return -ENOMEM;
  *out = a, *n = k;
  return 0;
}

void nwcd_config_free(void) { settings_free(&active); }

static bool str_differs(const char *a, const char *b) {
  return strcmp(a ? a : "", b ? b : "") != 0;
}

/* Logs a setting that changed in the file but needs a restart (or is under a flag). */
static void not_applied(const char *path, const char *key, const char *was, const char *now,
                        unsigned bit) {
  nwcd_log(NWCD_LOG_WARN, "reload %s: %s changed (%s -> %s): not applied; %s", path, key, was,
           now, (flags_set & bit) ? "a command-line flag sets it" : "restart nwcd for it");
}

int nwcd_config_reload(nwcd *d) {
  const char *path = config_path ? config_path : NWCD_CONFIG_DEFAULT;
  if (no_file || (!config_path && access(path, F_OK) != 0)) { /* as at start: nothing to read */
    nwcd_log(NWCD_LOG_WARN, "reload: no settings file to re-read (%s); nothing changed",
             no_file ? "NWCD_CONFIG is empty" : NWCD_CONFIG_DEFAULT " does not exist; nwcd "
             "--config FILE names one");
    return 0; /* the preload pass sends READY=1, as after a reload */
  }
  uint64_t t0 = nwcd_now_ns();
  nwcd_settings s;
  int rc = settings_parse(path, &s);
  if (rc == 0 && (s.set & NWCD_SET_ADMIN) && str_differs(s.admin_group, active.admin_group)) {
    rc = set_admin_group(path, &s);
    if (rc < 0) settings_free(&s);
  }
  if (rc < 0) {
    nwcd_log(NWCD_LOG_ERR, "reload: %s; nothing changed", nwc_error_detail());
    return rc;
  }
  if (!(s.set & NWCD_SET_ADMIN) && active.admin_group) nwcd_policy_set_admin_group(NULL);
  nwcd_config *cfg = &d->cfg;
  char a[32], b[32];
  if ((s.set & NWCD_SET_STORE) && str_differs(s.store, cfg->store_dir))
    not_applied(path, "store", cfg->store_dir, s.store, NWCD_SET_STORE);
  if ((s.set & NWCD_SET_SOCKET) && str_differs(s.socket, cfg->socket_path))
    not_applied(path, "socket", cfg->socket_path ? cfg->socket_path : "(default)", s.socket,
                NWCD_SET_SOCKET);
  if ((s.set & NWCD_SET_BACKEND) && str_differs(s.backend, cfg->backend))
    not_applied(path, "backend", cfg->backend, s.backend, NWCD_SET_BACKEND);
  if ((s.set & NWCD_SET_THREADS) && s.threads != cfg->threads) {
    snprintf(a, sizeof a, "%u", cfg->threads), snprintf(b, sizeof b, "%u", s.threads);
    not_applied(path, "threads", a, b, NWCD_SET_THREADS);
  }
  if ((s.set & NWCD_SET_MODE) && s.socket_mode != cfg->socket_mode) {
    snprintf(a, sizeof a, "%04o", cfg->socket_mode), snprintf(b, sizeof b, "%04o", s.socket_mode);
    not_applied(path, "socket_mode", a, b, NWCD_SET_MODE);
  }
  uint64_t old_budget = cfg->budget, old_gpu = cfg->gpu_budget;
  apply_runtime(cfg, &s);
  if (cfg->gpu_budget != old_gpu) nwcd_res_set_gpu_budget(d->res, cfg->gpu_budget);
  if (cfg->budget != old_budget) {
    uint64_t used = 0;
    nwcd_res_set_budget(d->res, cfg->budget, &used);
    nwcd_log(NWCD_LOG_INFO, "reload: budget %llu -> %llu MiB, %llu MiB resident%s",
             (unsigned long long)(old_budget >> 20), (unsigned long long)(cfg->budget >> 20),
             (unsigned long long)(used >> 20),
             used > cfg->budget ? " (over: pinned or in use)" : "");
  }
  /* Keep the strings nwcd_config points at (store, socket, backend) from the old settings. */
  pthread_mutex_lock(&active_lock);
  nwcd_settings old = active;
  active = s;
  char **keep[] = {&active.store, &active.socket, &active.backend};
  char **from[] = {&old.store, &old.socket, &old.backend};
  for (int i = 0; i < 3; i++) {
    free(*keep[i]);
    *keep[i] = *from[i], *from[i] = NULL;
  }
  pthread_mutex_unlock(&active_lock);
  settings_free(&old);
  nwcd_log(NWCD_LOG_INFO, "reload %s: applied in %.2f ms (log level %d, %zu preload models)",
           path, (nwcd_now_ns() - t0) / 1e6, nwcd_log_level(), active.npreload);
  return 0;
}


int nwcd_parse_size(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  NWC_RETURN_IF(errno || end == s || !(v >= 0) || !isfinite(v), -EINVAL, "bad size '%s'", s);
  double mult = 1;
  switch (*end) {
    case 'k': case 'K': mult = 1024.0, end++; break;
    case 'm': case 'M': mult = 1048576.0, end++; break;
    case 'g': case 'G': mult = 1073741824.0, end++; break;
    case 't': case 'T': mult = 1099511627776.0, end++; break;
    default: break;
  }
  if (mult > 1 && (*end == 'i' || *end == 'I')) end++;
  if (*end == 'b' || *end == 'B') end++;
  NWC_RETURN_IF(*end, -EINVAL, "bad size '%s' (e.g. 512M, 2G, 1.5GiB)", s);
  NWC_RETURN_IF(v * mult > 1.8e19, -EINVAL, "size '%s' is too large", s);
  *out = (uint64_t)(v * mult);
  return 0;
}
