/*
 * test_service_config.c - /etc/nwc/nwcd.conf handling by a real nwcd:
 *   - start-up errors: unknown section/key (the section's keys named), bad values, a line that
 *     is not key = value, an unknown admin group, a missing --config file and a directory as
 *     --config each exit 2 with "FILE:LINE: why" (or "FILE: why");
 *   - precedence: a flag (--budget, --threads) wins over the file; the file wins over the
 *     defaults (max_conn_per_uid: one connection too many gets EUSERS);
 *   - SIGHUP: a smaller budget evicts down to it; a preload list makes the model resident and
 *     pinned; a changed store path is logged as not applied; a file with an unknown key changes
 *     nothing (logged) and the daemon keeps serving; dropping the preload list unpins; a new
 *     log_level takes effect; without a settings file (NWCD_CONFIG=), SIGHUP says there is
 *     none to re-read, reads no other, and nwcd keeps serving; only nwcd's loop thread takes
 *     SIGHUP (every other thread has it blocked, /proc's SigBlk; not under ThreadSanitizer,
 *     whose runtime owns the kernel's masks).
 * Budgets are drawn per run (seeded) between bounds that keep each step meaningful.
 */
#include "test_service_util.h"

#include <stdbool.h>

typedef struct bad_case {
  const char *text, *expect;
  int line;
} bad_case;

static void start_errors(void) {
  static const bad_case cases[] = {
      {"[daemon]\nthreads = 2\nthreadz = 3\n", "unknown key 'threadz' in [daemon] (store, socket,", 3},
      {"[memory]\nbudget = 1G\n", "unknown key 'budget' in [memory] (host_budget, gpu_budget)", 2},
      {"# c\n[daemon]\n\n[memroy]\nhost_budget = 1G\n", "unknown section [memroy]", 5},
      {"[memory]\nhost_budget = 12Q\n", "host_budget: bad size '12Q'", 2},
      {"[daemon]\nthreads = -1\n", "threads: expected a count", 2},
      {"[daemon]\nbackend = tpu\n", "backend: expected auto, cpu or cuda", 2},
      {"[daemon]\nsocket_mode = 0999\n", "socket_mode: expected an octal mode", 2},
      {"[daemon]\nlog_level = loud\n", "log_level: expected error", 2},
      {"[preload]\nmodels = ok, bad/name\n", "preload: 'bad/name' is not a valid model name", 2},
      {"[limits]\nmax_inflight = 0\n", "max_inflight: expected a count", 2},
      {"[limits]\npoll_us = 2000000\n", "poll_us: expected microseconds 0..1000000", 2},
      {"[daemon]\nstore /var/lib/nwc\n", "not a 'key = value' line", 2},
      {"[daemon]\nadmin_group = no-such-group-nwc\n", "admin_group: group 'no-such-group-nwc' does "
       "not exist (create the group, e.g. with systemd-sysusers, or leave admin_group out)", 2},
  };
  char path[700], expect[900];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ts_write(path, "bad.conf", "%s", cases[i].text);
    ts_log_clear();
    const char *extra[] = {"--config", path, NULL};
    int code = td_daemon_refuses(td_sock, extra);
    CHECK(code == 2, "case %zu: exit %d, expected 2", i, code);
    snprintf(expect, sizeof expect, "%s:%d: %s", path, cases[i].line, cases[i].expect);
    char *log = ts_log();
    CHECK(log && strstr(log, expect), "case %zu: expected '%s' in: %s", i, expect, log ? log : "");
    free(log);
  }
  ts_log_clear();
  char missing[720];
  snprintf(missing, sizeof missing, "%s/missing.conf", td_dir);
  const char *extra[] = {"--config", missing, NULL};
  CHECK(td_daemon_refuses(td_sock, extra) == 2, "a missing --config file is an error");
  char *log = ts_log();
  CHECK(log && strstr(log, "missing.conf: No such file"), "log: %s", log ? log : "");
  free(log);
  /* A directory opens and reads as an empty file: it must be refused, not taken as no settings. */
  ts_log_clear();
  extra[1] = td_dir;
  CHECK(td_daemon_refuses(td_sock, extra) == 2, "a directory as --config is an error");
  log = ts_log();
  CHECK(log && strstr(log, "Is a directory"), "log: %s", log ? log : "");
  free(log);
}

/* SIGHUP to a daemon started with no settings file (NWCD_CONFIG=): it reads none then either
 * (not /etc/nwc/nwcd.conf, nor an error for its absence), says so, and keeps serving. */
#ifndef __SANITIZE_THREAD__
/* The threads of process pid that take SIGHUP (not blocked in their mask, /proc's SigBlk), and
 * whether pid's main thread is one of them; -1 where /proc cannot be read. */
static int sighup_takers(pid_t pid, bool *main_takes) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *dir = opendir(path);
  if (!dir) return -1;
  int n = 0;
  *main_takes = false;
  for (struct dirent *e; (e = readdir(dir));) {
    if (e->d_name[0] == '.') continue;
    char status[384], line[256];
    snprintf(status, sizeof status, "%s/%s/status", path, e->d_name);
    FILE *f = fopen(status, "r");
    unsigned long long blocked = ~0ull;
    while (f && fgets(line, sizeof line, f))
      if (sscanf(line, "SigBlk: %llx", &blocked) == 1) break;
    if (f) fclose(f);
    if (!(blocked >> (SIGHUP - 1) & 1)) n++, *main_takes |= atoi(e->d_name) == (int)pid;
  }
  closedir(dir);
  return n;
}
#endif

static void reload_without_file(void) {
  setenv("NWCD_CONFIG", "", 1);
  ts_log_clear();
  pid_t d = td_start_daemon(NULL);
  CHECK(d > 0, "start without a settings file");
  if (d < 0) return;
#ifndef __SANITIZE_THREAD__
  /* SIGHUP is the loop thread's alone (notify.c): every other thread keeps it blocked.  (Under
   * ThreadSanitizer the kernel's masks are its runtime's, not nwcd's: it showed none taking it.) */
  bool main_takes = false;
  int takers = sighup_takers(d, &main_takes);
  CHECK(takers == 1 && main_takes,
        "%d of nwcd's threads take SIGHUP (the loop thread %s): want the loop thread alone", takers,
        main_takes ? "among them" : "not");
#endif
  kill(d, SIGHUP);
  CHECK(ts_log_wait("reload: no settings file to re-read (NWCD_CONFIG is empty); nothing changed",
                    10000), "SIGHUP without a settings file: not said so");
  nwc_client *c = NULL;
  nwc_client_counters s;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  if (c) CHECK_RC(nwc_client_stats(c, &s));
  nwc_client_free(c);
  char *log = ts_log();
  CHECK(log && !strstr(log, "error:"), "SIGHUP without a settings file logged an error: %s",
        log ? log : "");
  free(log);
  CHECK(td_stop_daemon(d) == 0, "SIGTERM exit after the reload without a file");
}

static int stats(nwc_client *c, nwc_client_counters *s) {
  int rc = nwc_client_stats(c, s);
  CHECK(rc == 0, "stats: %d %s", rc, nwc_client_last_error());
  return rc;
}

/* Polls stats until cond holds (up to 10 s). */
#define WAIT_FOR(c, s, cond)                                                                     \
  do {                                                                                           \
    for (int w_ = 0; w_ < 500; w_++) {                                                           \
      if (stats((c), &(s)) < 0 || (cond)) break;                                                 \
      usleep(20000);                                                                             \
    }                                                                                            \
  } while (0)

int main(void) {
  test_seed("test_service_config");
  if (td_mkdir("nwc-svc-config") < 0) return 1;
  int rc = ts_import_sample();
  if (rc) {
    td_cleanup();
    return rc;
  }
  start_errors();

  /* Precedence: --budget and --threads (td_start_daemon passes --threads 2) over the file. */
  uint64_t flag_budget = (32 + test_below(32)) << 20, file_budget = (64 + test_below(64)) << 20;
  char conf[700];
  ts_write(conf, "nwcd.conf", "[daemon]\nthreads = 3\nlog_level = debug\n[memory]\nhost_budget = %llu\n"
           "[limits]\nmax_conn_per_uid = 2\n", (unsigned long long)file_budget);
  char bflag[32];
  snprintf(bflag, sizeof bflag, "%llu", (unsigned long long)flag_budget);
  const char *extra[] = {"--config", conf, "--budget", bflag, NULL};
  ts_log_clear();
  pid_t d = td_start_daemon(extra);
  CHECK(d > 0, "start with a config");
  if (d < 0) {
    td_show_log();
    td_cleanup();
    return 1;
  }
  nwc_client *c = NULL, *c2 = NULL, *c3 = NULL;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  nwc_client_counters s;
  if (c && stats(c, &s) == 0) {
    CHECK(s.budget == flag_budget, "budget %llu: the flag (%llu) should win over the file",
          (unsigned long long)s.budget, (unsigned long long)flag_budget);
    CHECK(s.threads == 2, "threads %llu: the flag (2) should win over the file (3)",
          (unsigned long long)s.threads);
  }
  CHECK(ts_log_wait("debug:", 10000), "log_level = debug from the file not applied");
  CHECK_RC(nwc_client_connect(td_sock, &c2));
  rc = nwc_client_connect(td_sock, &c3);
  /* -EUSERS even when the client's hello races the daemon's close (the client reads the error
   * frame after a failed send). */
  CHECK(rc == -EUSERS,
        "third connection with max_conn_per_uid = 2: %d %s", rc, nwc_client_last_error());
  CHECK(ts_log_wait("too many connections for uid", 10000), "the refused connection is not logged");
  nwc_client_free(c3), nwc_client_free(c2);
  td_stop_daemon(d);

  /* SIGHUP: budget, preload, store path, a broken file, preload dropped. */
  ts_write(conf, "nwcd.conf", "[memory]\nhost_budget = 256M\n");
  ts_log_clear();
  nwc_client_free(c), c = NULL;
  d = td_start_daemon((const char *[]){"--config", conf, NULL});
  CHECK(d > 0, "start for the reload part");
  if (d < 0) {
    td_show_log();
    td_cleanup();
    return 1;
  }
  CHECK_RC(nwc_client_connect(td_sock, &c));
  nwc_client_result res;
  CHECK_RC(nwc_client_load(c, "use", NULL, NULL, NULL, &res));
  uint64_t resident = 0;
  if (stats(c, &s) == 0) resident = s.resident_bytes;
  CHECK(resident > (4u << 20), "resident after load: %llu", (unsigned long long)resident);
  /* Between a third and two thirds of what is resident (4 KiB multiples). */
  uint64_t small = (resident / 3 + test_below(resident / 3)) & ~UINT64_C(4095);
  ts_write(conf, "nwcd.conf", "[memory]\nhost_budget = %llu\n", (unsigned long long)small);
  uint64_t ev0 = s.evictions;
  kill(d, SIGHUP);
  WAIT_FOR(c, s, s.budget == small);
  CHECK(s.budget == small, "budget after SIGHUP: %llu, expected %llu", (unsigned long long)s.budget,
        (unsigned long long)small);
  CHECK(s.resident_bytes <= small && s.evictions > ev0, "after the smaller budget: %llu resident, "
        "%llu evictions", (unsigned long long)s.resident_bytes, (unsigned long long)(s.evictions - ev0));

  ts_write(conf, "nwcd.conf", "[daemon]\nstore = %s/elsewhere\n[memory]\nhost_budget = 256M\n"
           "[preload]\nmodels = use\n", td_dir);
  kill(d, SIGHUP);
  size_t pinned = 0, n = 0;
  for (int w = 0; w < 500 && pinned < td_nt; w++) n = ts_resident(c, "use", &pinned), usleep(20000);
  CHECK(n == td_nt && pinned == td_nt, "preload by reload: %zu resident, %zu pinned of %zu", n,
        pinned, td_nt);
  CHECK(ts_log_wait("store changed", 10000), "the changed store path is not logged");
  CHECK(ts_log_wait("not applied", 100), "'not applied' missing");

  ts_write(conf, "nwcd.conf", "[memory]\nhost_budget = 8M\nbudget_typo = 1\n");
  kill(d, SIGHUP);
  CHECK(ts_log_wait("unknown key 'budget_typo' in [memory] (host_budget, gpu_budget); nothing changed", 10000),
        "the broken file on reload is not logged");
  if (stats(c, &s) == 0)
    CHECK(s.budget == (256u << 20), "a broken reload changed the budget to %llu",
          (unsigned long long)s.budget);

  ts_write(conf, "nwcd.conf", "[memory]\nhost_budget = 256M\n");
  kill(d, SIGHUP);
  for (int w = 0; w < 500 && pinned; w++) ts_resident(c, "use", &pinned), usleep(20000);
  CHECK(pinned == 0, "preload list dropped: %zu still pinned", pinned);
  CHECK(ts_log_wait("left the list", 10000), "unpin not logged");

  /* log_level by reload: at warning, a load (an info line) is not logged, a refusal would be. */
  ts_write(conf, "nwcd.conf", "[daemon]\nlog_level = warning\n[memory]\nhost_budget = 200M\n");
  kill(d, SIGHUP);
  WAIT_FOR(c, s, s.budget == (200u << 20));
  CHECK(s.budget == (200u << 20), "the log-level reload was not applied");
  ts_log_clear();
  CHECK_RC(nwc_client_load(c, "use", NULL, NULL, NULL, &res));
  char *log = ts_log();
  CHECK(log && !strstr(log, "info:"), "info lines at log_level = warning: %s", log ? log : "");
  free(log);

  nwc_client_free(c);
  CHECK(td_stop_daemon(d) == 0, "SIGTERM exit");
  reload_without_file();
  if (test_failures) td_show_log();
  td_cleanup();
  return test_exit("test_service_config");
}
