/*
 * nwcctl.c - the command line of nwcd, on libnwc-client: one subcommand per operation, human
 * output in aligned columns with human sizes, --json objects through jansson, a progress bar on
 * a TTY for import and load, .npy files for matvec/gather/dequant data (so numpy can check
 * them), and on failure a one-line error with the daemon's message and a non-zero exit status.
 * A tensor is named MODEL/TENSOR, split at the first '/' (tensor names may hold more).
 */
#include "nwc_client.h"
#include "nwc_escape.h"
#include "nwc_number.h"
#include "size_text.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *prog = "nwcctl";
static const char *cmd = "";
static bool json;
static const char *device_opt; /* load, pin and evict --device, as given */
static bool split_opt;         /* load and pin --split */
static const char *sock_path;   /* --socket, or NULL: NWC_SOCKET or the default */
static nwc_client *conn;        /* connected(): once a command's arguments are known to be good */

static int die(int rc) {
  char safe[4096]; /* names in it came from files: no raw control bytes */
  fprintf(stderr, "%s: %s: %s\n", prog, cmd, nwc__escape(nwc_client_last_error(), safe,
                                                        sizeof safe));
  return rc == -ENOENT ? 3 : 1;
}

/* The connection to nwcd, made at the first call: a command calls it once its arguments are
 * known to be good, so that bad usage is exit 2 whether or not a daemon runs.  NULL after
 * saying why (the command exits 1). */
static nwc_client *connected(void) {
  int rc = conn ? 0 : nwc_client_connect(sock_path, &conn);
  if (rc < 0) die(rc), conn = NULL;
  return conn;
}

/* die() for a request on MODEL/TENSOR: where the tensor is missing because MODEL is (as when
 * MODEL/ was left out of the name), says that instead. */
static int die_tensor(nwc_client *c, int rc, const char *model, const char *tensor) {
  nwc_client_tensor *t = NULL;
  size_t n;
  if (rc != -ENOENT || !tensor || !*tensor || nwc_client_tensors(c, model, &t, &n) != -ENOENT) {
    free(t);
    return die(rc);
  }
  char safe[1024];
  fprintf(stderr, "%s: %s: no model '%s' in the store (a tensor is named MODEL/TENSOR; %s ls "
          "lists the models)\n", prog, cmd, nwc__escape(model, safe, sizeof safe), prog);
  return 3;
}

/* "s" unless n is 1: "%llu tensor%s". */
static const char *plural(uint64_t n) { return n == 1 ? "" : "s"; }

static bool json_lost; /* a value could not be made JSON (a name that is not UTF-8) */

/* json_array_append_new that remembers a value jansson refused (NULL), for json_out. */
static void json_push(json_t *arr, json_t *v) {
  if (!v || json_array_append_new(arr, v) < 0) json_lost = true;
}

/* Prints j; where a value was lost or j cannot be written, says so and exits 1 instead of
 * printing a listing with holes (such as [] for a list whose one name was not UTF-8). */
static void json_out(json_t *j) {
  char *s = j && !json_lost ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
  json_decref(j);
  if (!s) {
    fprintf(stderr, "%s: %s: the reply holds text that is not valid UTF-8: no JSON written\n",
            prog, cmd);
    exit(1);
  }
  puts(s);
  free(s);
}

static int split(const char *arg, char *model, size_t mcap, const char **tensor) {
  const char *slash = strchr(arg, '/');
  size_t n = slash ? (size_t)(slash - arg) : strlen(arg);
  if (n == 0 || n >= mcap) {
    fprintf(stderr, "%s: %s: '%s' is not MODEL or MODEL/TENSOR\n", prog, cmd, arg);
    return -1;
  }
  memcpy(model, arg, n);
  model[n] = 0;
  *tensor = slash ? slash + 1 : NULL;
  return 0;
}

/* split() of a name that must be MODEL/TENSOR. */
static int split_tensor(const char *arg, char *model, size_t mcap, const char **tensor) {
  if (split(arg, model, mcap, tensor) < 0) return -1;
  if (*tensor && **tensor) return 0;
  fprintf(stderr, "%s: %s: expected MODEL/TENSOR, got '%s'\n", prog, cmd, arg);
  return -1;
}

/* Strict parses of a command-line value: 0, or -1 after saying what was expected (bad usage). */
static int parse_u64(const char *what, const char *s, uint64_t max, uint64_t *out) {
  if (!nwc__u64_of(s, max, out)) {
    if (max == UINT64_MAX) fprintf(stderr, "%s: %s: %s: expected a whole number, got '%s'\n", prog, cmd, what, s);
    else fprintf(stderr, "%s: %s: %s: expected 0..%llu, got '%s'\n", prog, cmd, what, (unsigned long long)max, s);
    return -1;
  }
  return 0;
}

static int parse_float(const char *what, const char *s, float *out) {
  char *end;
  errno = 0;
  float v = strtof(s, &end);
  if (!*s || *end || errno || v != v) {
    fprintf(stderr, "%s: %s: %s: expected a number, got '%s'\n", prog, cmd, what, s);
    return -1;
  }
  *out = v;
  return 0;
}

/* An argument that looks like an option the command does not take (a lone "-" is a name). */
static int unknown_option(const char *arg) {
  if (arg[0] != '-' || !arg[1]) return 0;
  fprintf(stderr, "%s: %s: unknown option '%s' (or it needs a value)\n", prog, cmd, arg);
  return 1;
}

/* A required argument left out (what: as the command's usage names it): one line, bad usage. */
static int missing(const char *what) {
  fprintf(stderr, "%s: %s: missing %s (%s %s --help says what it takes)\n", prog, cmd, what, prog,
          cmd);
  return 2;
}

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0; }

static const char *elem_name(unsigned elem) { return (elem & 15) == 1 ? "fp8" : "bf16"; }

static const char *state_name(int s) {
  return s == NWC_CLIENT_RESIDENT ? "resident" : s == NWC_CLIENT_LOADING ? "loading" : "-";
}

static int progress_bar(void *ctx, uint64_t done, uint64_t total) {
  const char *what = ctx;
  if (!isatty(2) || json) return 0;
  int w = 30, k = total ? (int)((double)done / (double)total * w) : w;
  char bar[64];
  for (int i = 0; i < w; i++) bar[i] = i < k ? '#' : '.';
  bar[w] = 0;
  fprintf(stderr, "\r%s [%s] %3.0f%%", what, bar, total ? 100.0 * (double)done / (double)total : 100.0);
  if (done >= total) fputc('\n', stderr);
  return 0;
}

/* ---- .npy --------------------------------------------------------------------------------- */

/* Writes a .npy of the given shape (ndim 0..8); -1 after a line saying why it could not. */
static int npy_write(const char *path, const char *descr, const uint64_t *shape, unsigned ndim,
                     const void *data, size_t bytes) {
  char dims[256] = "";
  for (unsigned d = 0; d < ndim; d++)
    snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%llu%s", (unsigned long long)shape[d],
             ndim == 1 ? "," : d + 1 < ndim ? ", " : "");
  FILE *f = fopen(path, "wb");
  bool ok = f != NULL;
  if (ok) {
    char hdr[512];
    int n = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, dims);
    int total = 10 + n + 1, pad = (64 - total % 64) % 64;
    unsigned hl = (unsigned)(n + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc((int)(hl & 255), f), fputc((int)(hl >> 8), f);
    fwrite(hdr, 1, (size_t)n, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    fwrite(data, 1, bytes, f);
    ok = !(ferror(f) | fclose(f));
  }
  if (!ok) fprintf(stderr, "%s: %s: cannot write %s: %s\n", prog, cmd, path, strerror(errno));
  return ok ? 0 : -1;
}

/* Reads a little-endian float32 .npy of shape (K,) or (n, K) with n <= 64; NULL after a line
 * that says what is wrong with it, *status the exit status for it (3: no such file, else 1). */
static float *npy_read_f32(const char *path, uint64_t *n, uint64_t *K, unsigned *ndim,
                           int *status) {
  struct stat st; /* a FIFO would block the open (and the reads) for ever */
  *status = 1;
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
    fprintf(stderr, "%s: %s: %s is not a regular file\n", prog, cmd, path);
    return NULL;
  }
  FILE *f = fopen(path, "rb");
  if (!f) {
    if (errno == ENOENT) *status = 3;
    fprintf(stderr, "%s: %s: cannot open %s: %s\n", prog, cmd, path, strerror(errno));
    return NULL;
  }
  unsigned char m[10];
  char hdr[4096];
  float *x = NULL;
  const char *why = "is not a .npy file (version 1.0)";
  if (fread(m, 1, 10, f) != 10 || memcmp(m, "\x93NUMPY", 6) || m[6] != 1) goto bad;
  unsigned hl = m[8] | (unsigned)m[9] << 8;
  if (hl >= sizeof hdr || fread(hdr, 1, hl, f) != hl) goto bad;
  hdr[hl] = 0;
  why = "must be float32 ('<f4'), C order";
  if (!strstr(hdr, "'<f4'") || strstr(hdr, "'fortran_order': True")) goto bad;
  /* The shape tuple: (K,) or (n, K), nothing more. */
  why = "has no shape of [K] or [n, K]";
  const char *s = strstr(hdr, "'shape': (");
  if (!s) goto bad;
  s += strlen("'shape': (");
  unsigned long long d[3];
  int nd = 0;
  for (char *end; nd < 3 && *s >= '0' && *s <= '9'; nd++) {
    d[nd] = strtoull(s, &end, 10);
    s = end + strspn(end, " ");
    if (*s == ',') s += 1 + strspn(s + 1, " ");
  }
  if (*s != ')' || nd < 1 || nd > 2) goto bad;
  *n = nd == 2 ? d[0] : 1, *K = d[nd - 1], *ndim = (unsigned)nd;
  char said[160];
  snprintf(said, sizeof said, !*n || !*K ? "is empty (shape %llu x %llu)"
                              : *n > 64  ? "has %llu vectors of %llu, more than the 64 of one "
                                           "matvec (split it)"
                                         : "has %llu x %llu values, more than 2^28 columns",
           (unsigned long long)*n, (unsigned long long)*K);
  why = said;
  if (!*n || !*K || *n > 64 || *K > (1u << 28)) goto bad;
  why = "is too large to read";
  x = malloc(*n * *K * 4);
  if (!x) goto bad;
  why = "holds fewer values than its shape says";
  if (fread(x, 4, *n * *K, f) != *n * *K) goto bad;
  fclose(f);
  return x;
bad:
  fprintf(stderr, "%s: %s: %s %s (x is float32 of shape [K] or [n<=64, K])\n", prog, cmd, path, why);
  free(x);
  fclose(f);
  return NULL;
}

/* A name column's width after name: the longest name so far, so that the columns line up. */
static int widen(int width, const char *name) {
  int n = (int)strlen(name);
  return n > width ? n : width;
}

/* A shape as text ("8002x256", "()" for a scalar) into buf, and as a JSON array (new reference). */
static const char *shape_text(const uint64_t *shape, unsigned ndim, char *buf, size_t cap) {
  snprintf(buf, cap, "%s", ndim ? "" : "()");
  for (unsigned d = 0; d < ndim; d++)
    snprintf(buf + strlen(buf), cap - strlen(buf), "%s%llu", d ? "x" : "", (unsigned long long)shape[d]);
  return buf;
}

static json_t *shape_json(const uint64_t *shape, unsigned ndim) {
  json_t *sh = json_array();
  for (unsigned d = 0; d < ndim; d++) json_array_append_new(sh, json_integer((json_int_t)shape[d]));
  return sh;
}

/* ---- commands ----------------------------------------------------------------------------- */

static int cmd_ls(int argc, char **argv) {
  char buf[4][32];
  nwc_client *c = connected();
  if (!c) return 1;
  if (argc >= 1) {
    nwc_client_tensor *t;
    size_t n;
    int rc = nwc_client_tensors(c, argv[0], &t, &n);
    if (rc < 0) return die(rc);
    json_t *arr = json ? json_array() : NULL;
    /* the name last, as ls -l and ps do: names run long, and the columns before it line up */
    if (!json) printf("%-14s %-7s %-6s %10s %10s %-15s %s\n", "SHAPE", "DTYPE", "ELEM", "RAW", "NWC", "RESIDENT", "TENSOR");
    for (size_t i = 0; i < n; i++) {
      char shape[200];
      if (json) {
        json_push(arr, json_pack("{s:s,s:o,s:s,s:s,s:i,s:I,s:I,s:b}", "name", t[i].name,
                                             "shape", shape_json(t[i].shape, t[i].ndim), "dtype", t[i].dtype, "elem", elem_name(t[i].elem),
                                             "layout", (int)((t[i].elem >> 4) & 15),
                                             "raw_bytes", (json_int_t)t[i].raw_bytes,
                                             "nwc_bytes", (json_int_t)t[i].nwc_bytes,
                                             "resident", t[i].state == NWC_CLIENT_RESIDENT));
      } else {
        char elem[16], state[32];
        snprintf(elem, sizeof elem, "%s/%u", elem_name(t[i].elem), (t[i].elem >> 4) & 15);
        snprintf(state, sizeof state, "%s%s", state_name(t[i].state), t[i].pinned ? " pinned" : "");
        printf("%-14s %-7s %-6s %10s %10s %-15s %s\n", /* DTYPE: up to F8_E4M3 */
               shape_text(t[i].shape, t[i].ndim, shape, sizeof shape), t[i].dtype, elem,
               nwc_size_text(t[i].raw_bytes, buf[0]), nwc_size_text(t[i].nwc_bytes, buf[1]), state,
               t[i].name);
      }
    }
    free(t);
    if (json) json_out(arr);
    return 0;
  }
  nwc_client_model *m;
  size_t n;
  int rc = nwc_client_models(c, &m, &n);
  if (rc < 0) return die(rc);
  json_t *arr = json ? json_array() : NULL;
  int mw = 32;
  for (size_t i = 0; i < n; i++) mw = widen(mw, m[i].name);
  if (!json) printf("%-*s %8s %10s %10s %6s %10s\n", mw, "MODEL", "TENSORS", "RAW", "NWC", "RATIO", "RESIDENT");
  for (size_t i = 0; i < n; i++) {
    if (json)
      json_push(arr, json_pack("{s:s,s:I,s:I,s:I,s:f,s:I}", "name", m[i].name, "tensors",
                                           (json_int_t)m[i].tensors, "raw_bytes", (json_int_t)m[i].raw_bytes,
                                           "nwc_bytes", (json_int_t)m[i].nwc_bytes, "ratio",
                                           ratio(m[i].nwc_bytes, m[i].raw_bytes), "resident_bytes",
                                           (json_int_t)m[i].resident_bytes));
    else
      printf("%-*s %8llu %10s %10s %6.3f %10s\n", mw, m[i].name, (unsigned long long)m[i].tensors,
             nwc_size_text(m[i].raw_bytes, buf[0]), nwc_size_text(m[i].nwc_bytes, buf[1]),
             ratio(m[i].nwc_bytes, m[i].raw_bytes), nwc_size_text(m[i].resident_bytes, buf[2]));
  }
  free(m);
  if (json) json_out(arr);
  return 0;
}

/* A place's name as nwcd says it: "cpu" (host memory, NWC_CLIENT_CPU) or "cuda:N". */
static void place_name(int at, char name[16]) {
  if (at == NWC_CLIENT_CPU) snprintf(name, 16, "cpu");
  else snprintf(name, 16, "cuda:%d", at);
}

/* ps's last lines: the client mappings per place ("maps on cuda:0: 24 of 12 tensors"), places
 * in ps's order of first appearance; nothing when no tensor is mapped. */
static void print_maps_per_place(const nwc_client_resident *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    bool first = p[i].maps > 0;
    for (size_t k = 0; first && k < i; k++) first = !(p[k].maps > 0 && p[k].device == p[i].device);
    if (!first) continue;
    unsigned long maps = 0, tensors = 0;
    for (size_t k = i; k < n; k++)
      if (p[k].device == p[i].device && p[k].maps) maps += p[k].maps, tensors++;
    char where[16];
    place_name(p[i].device, where);
    printf("maps on %s: %lu of %lu tensor%s\n", where, maps, tensors, tensors == 1 ? "" : "s");
  }
}

static int cmd_ps(void) {
  nwc_client *c = connected();
  if (!c) return 1;
  nwc_client_resident *p;
  size_t n;
  int rc = nwc_client_ps(c, &p, &n);
  if (rc < 0) return die(rc);
  char buf[32], where[16];
  json_t *arr = json ? json_array() : NULL;
  int mw = (int)strlen("MODEL");
  for (size_t i = 0; i < n; i++) mw = widen(mw, p[i].model);
  /* the tensor last, as in ls MODEL */
  if (!json) printf("%-*s %-7s %10s %6s %6s %5s %5s %-12s %s\n", mw, "MODEL", "WHERE", "BYTES", "PINNED", "LOCKED", "REFS", "MAPS", "LAST USED", "TENSOR");
  for (size_t i = 0; i < n; i++) {
    place_name(p[i].device, where);
    if (json) {
      json_push(arr, json_pack("{s:s,s:s,s:s,s:I,s:b,s:b,s:b,s:i,s:i,s:I}", "model", p[i].model,
                                           "tensor", p[i].tensor, "where", where, "bytes", (json_int_t)p[i].bytes,
                                           "pinned", p[i].pinned, "locked", p[i].locked, "direct",
                                           p[i].direct, "refs", (int)p[i].refs, "maps", (int)p[i].maps,
                                           "last_used_ms", (json_int_t)p[i].last_used_ms));
    } else {
      char ago[32]; /* at most 12 characters: "59.9 min ago" */
      double ds = (double)(p[i].last_used_ms / 100) / 10; /* tenths of a second, as printed */
      if (p[i].last_used_ms < 0) snprintf(ago, sizeof ago, "never");
      else if (ds < 60) snprintf(ago, sizeof ago, "%.1f s ago", ds);
      else if (ds < 3597) snprintf(ago, sizeof ago, "%.1f min ago", ds / 60); /* < 59.95 */
      else if (ds < 86220) snprintf(ago, sizeof ago, "%.1f h ago", ds / 3600);  /* < 23.95 */
      else snprintf(ago, sizeof ago, "%.1f d ago", ds / 86400);
      printf("%-*s %-7s %10s %6s %6s %5u %5u %-12s %s\n", mw, p[i].model, where, nwc_size_text(p[i].bytes, buf),
             p[i].pinned ? "yes" : "no", p[i].locked ? "yes" : "no", p[i].refs, p[i].maps, ago, p[i].tensor);
    }
  }
  if (!json) print_maps_per_place(p, n);
  free(p);
  if (json) json_out(arr);
  return 0;
}

static int cmd_info(const char *arg) {
  char model[1024];
  const char *tensor;
  if (split_tensor(arg, model, sizeof model, &tensor) < 0) return 2;
  nwc_client *c = connected();
  if (!c) return 1;
  nwc_client_tensor_info i;
  int rc = nwc_client_info(c, model, tensor, &i);
  if (rc < 0) return die_tensor(c, rc, model, tensor);
  char shape[200];
  if (json) {
    json_out(json_pack("{s:s,s:o,s:s,s:s,s:i,s:I,s:I,s:b,s:I,s:I,s:s,s:s,s:I,s:I,s:I,s:b}", "name",
                       i.t.name, "shape", shape_json(i.t.shape, i.t.ndim), "dtype", i.t.dtype, "elem", elem_name(i.t.elem),
                       "layout", (int)((i.t.elem >> 4) & 15), "raw_bytes", (json_int_t)i.t.raw_bytes,
                       "nwc_bytes", (json_int_t)i.t.nwc_bytes, "resident",
                       i.t.state == NWC_CLIENT_RESIDENT, "rows", (json_int_t)i.t.rows, "cols",
                       (json_int_t)i.t.cols, "conversion", i.conversion, "path", i.path, "offset",
                       (json_int_t)i.offset, "chunks", (json_int_t)i.nchunks, "blocks",
                       (json_int_t)i.nblocks, "pinned", i.t.pinned));
    return 0;
  }
  char b0[32], b1[32];
  printf("name        %s/%s\nshape       %s (%s)\nstored as   %llu x %llu %s layout %u\n"
         "conversion  %s\nsize        %s raw, %s nwc (%.3f)\nblocks      %llu, %llu chunks\n"
         "container   %s @ %llu\nresidency   %s%s\n",
         model, i.t.name, shape_text(i.t.shape, i.t.ndim, shape, sizeof shape), i.t.dtype, (unsigned long long)i.t.rows,
         (unsigned long long)i.t.cols, elem_name(i.t.elem), (i.t.elem >> 4) & 15, i.conversion,
         nwc_size_text(i.t.raw_bytes, b0), nwc_size_text(i.t.nwc_bytes, b1), ratio(i.t.nwc_bytes, i.t.raw_bytes),
         (unsigned long long)i.nblocks, (unsigned long long)i.nchunks, i.path,
         (unsigned long long)i.offset, i.t.state ? state_name(i.t.state) : "not resident",
         i.t.pinned ? ", pinned" : "");
  return 0;
}

/* load --device: cpu, cuda:N or N, several of them separated by commas, or all (every GPU). */
#define MAX_PLACES 64

/* The places of --device opt into at[] (NWC_CLIENT_CPU or a device), in order: how many, 0 for
 * all (daemon_places resolves it), or -1 after saying why it is bad usage. */
static int parse_places(const char *opt, int at[MAX_PLACES]) {
  if (!strcmp(opt, "all")) return 0;
  int n = 0;
  for (const char *p = opt;; p++) {
    size_t len = strcspn(p, ",");
    const char *num = len > 5 && !strncmp(p, "cuda:", 5) ? p + 5 : p;
    char *end;
    long v = strtol(num, &end, 10);
    bool cpu = len == 3 && !strncmp(p, "cpu", 3);
    if (n == MAX_PLACES || (!cpu && (num == p + len || end != p + len || v < 0 || v > 255 ||
                                     *num < '0' || *num > '9'))) {
      fprintf(stderr, "%s: %s: --device: expected cpu, cuda:N, a comma-separated list of them or "
              "all, got '%.*s'\n", prog, cmd, (int)len, p);
      return -1;
    }
    at[n++] = cpu ? NWC_CLIENT_CPU : (int)v;
    p += len;
    if (!*p) return n;
  }
}

/* Whether at[0..n) names place p. */
static bool names_place(const int *at, int n, int p) {
  for (int i = 0; i < n; i++)
    if (at[i] == p) return true;
  return false;
}

/* Resolves --device against the places the daemon reports (nwc_client_devices): all becomes
 * every GPU, and a list of n places is checked whole, so that one the daemon lacks fails the
 * command before anything loads.  Returns how many places at[] holds, or -1 after saying why. */
static int daemon_places(nwc_client *c, int at[MAX_PLACES], int n) {
  nwc_client_place *p;
  size_t np;
  int rc = nwc_client_devices(c, &p, &np);
  if (rc == -EOPNOTSUPP && n > 0) return n; /* an older daemon: each load checks its place */
  if (rc < 0) return die(rc), -1;
  char have[256] = "", lack[256] = "", name[16];
  size_t hoff = 0, loff = 0;
  for (size_t i = 0; i < np && hoff < sizeof have; i++)
    hoff += snprintf(have + hoff, sizeof have - hoff, "%s%s", i ? ", " : "", p[i].name);
  int k = n;
  for (size_t i = 0; n == 0 && i < np && k < MAX_PLACES; i++)
    if (!strncmp(p[i].name, "cuda:", 5)) at[k++] = atoi(p[i].name + 5);
  for (int i = 0; i < n && loff < sizeof lack; i++) {
    place_name(at[i], name);
    size_t j = 0;
    while (j < np && strcmp(p[j].name, name)) j++;
    if (j == np) loff += snprintf(lack + loff, sizeof lack - loff, "%s%s", loff ? " nor " : "", name);
  }
  free(p);
  if (!k)
    fprintf(stderr, "%s: %s: --device all: nwcd has no GPU (its places: %s%s)\n", prog, cmd, have,
            strcmp(cmd, "evict") ? "; --device cpu loads into host memory" : "");
  else if (loff)
    fprintf(stderr, "%s: %s: --device %s: nwcd has no %s (its places: %s); nothing done\n", prog,
            cmd, device_opt, lack, have);
  return !k || loff ? -1 : k;
}

/* Prints what cmd did to arg (at place, for a load onto several places, else place NULL): a line,
 * or with --json an object, added to arr when there is one. */
static void print_result(const char *arg, const char *place, const nwc_client_result *r, json_t *arr) {
  char b[32];
  if (json) {
    json_t *o = json_pack("{s:I,s:I,s:I,s:f,s:I,s:I}", "tensors", (json_int_t)r->tensors, "bytes",
                          (json_int_t)r->bytes, "skipped", (json_int_t)r->skipped, "seconds", r->micros / 1e6,
                          "direct", (json_int_t)r->direct, "buffered", (json_int_t)r->buffered);
    if (o && place) json_object_set_new(o, "device", json_string(place));
    if (o && r->raw_bytes && strcmp(cmd, "import")) /* load_places: bytes the daemon read */
      json_object_set_new(o, "read_bytes", json_integer((json_int_t)r->raw_bytes));
    if (arr) json_push(arr, o);
    else json_out(o);
  } else if (!strcmp(cmd, "load")) {
    printf("loaded %s%s%s: %llu tensor%s, %s in %.3f s (%.0f MB/s; %llu O_DIRECT, %llu buffered)\n", arg,
           place ? " on " : "", place ? place : "", (unsigned long long)r->tensors, plural(r->tensors),
           nwc_size_text(r->bytes, b), r->micros / 1e6, r->micros ? r->bytes / (double)r->micros : 0.0,
           (unsigned long long)r->direct, (unsigned long long)r->buffered);
  } else {
    printf("%s %s%s%s: %llu tensor%s, %s%s\n",
           !strcmp(cmd, "evict") ? "evicted" : !strcmp(cmd, "pin") ? "pinned" : "unpinned", arg,
           place ? " on " : "", place ? place : "", (unsigned long long)r->tensors, plural(r->tensors),
           nwc_size_text(r->bytes, b), r->skipped ? " (some in use or pinned were kept)" : "");
  }
}

/* After a split of model over at[0..n): the result, then per place named (GPUs in order, host
 * memory last: the policy's order) the model's replicas there and their bytes as ps lists them;
 * with --json one object with "places". */
static int print_split(nwc_client *c, const char *model, const int *at, int n,
                       const nwc_client_result *r) {
  nwc_client_resident *ps;
  size_t np;
  int rc = nwc_client_ps(c, &ps, &np);
  if (rc < 0) return die(rc);
  char b[32], name[32];
  json_t *places = json ? json_array() : NULL;
  if (!json)
    printf("%s %s split: %llu tensor%s, %s in %.3f s (read %s)\n",
           !strcmp(cmd, "pin") ? "pinned" : "loaded", model, (unsigned long long)r->tensors,
           plural(r->tensors), nwc_size_text(r->bytes, b), r->micros / 1e6,
           nwc_size_text(r->raw_bytes, name));
  for (int k = 0; k <= 256; k++) { /* cuda:0..255, then host memory */
    int p = k < 256 ? k : NWC_CLIENT_CPU;
    if (!names_place(at, n, p)) continue;
    unsigned long long tensors = 0, bytes = 0;
    for (size_t i = 0; i < np; i++)
      if (ps[i].device == p && !strcmp(ps[i].model, model)) tensors++, bytes += ps[i].bytes;
    place_name(p, name);
    if (json)
      json_push(places, json_pack("{s:s,s:I,s:I}", "device", name, "tensors", (json_int_t)tensors,
                                  "bytes", (json_int_t)bytes));
    else
      printf("  %-7s %llu tensor%s, %s\n", name, tensors, plural(tensors), nwc_size_text(bytes, b));
  }
  free(ps);
  if (json)
    json_out(json_pack("{s:I,s:I,s:f,s:I,s:o}", "tensors", (json_int_t)r->tensors, "bytes",
                       (json_int_t)r->bytes, "seconds", r->micros / 1e6, "read_bytes",
                       (json_int_t)r->raw_bytes, "places", places));
  return 0;
}

static int cmd_residency(const char *arg) {
  char model[1024];
  const char *tensor;
  if (split(arg, model, sizeof model, &tensor) < 0) return 2;
  int at[MAX_PLACES], n = 1;
  if (device_opt && (n = parse_places(device_opt, at)) < 0) return 2;
  if (split_opt && (!device_opt || tensor)) {
    fprintf(stderr, "%s: %s: --split spreads a model's tensors over the places of --device: %s\n",
            prog, cmd, tensor ? "name a model, not one tensor" : "name them (--device A,B or all)");
    return 2;
  }
  nwc_client *c = connected();
  if (!c) return 1;
  if (device_opt && n != 1 && (n = daemon_places(c, at, n)) < 0) return 1;
  int rc = 0;
  if (split_opt) { /* one request, each tensor at one place */
    nwc_client_result r;
    unsigned flags = NWC_CLIENT_LOAD_SPLIT | (!strcmp(cmd, "pin") ? NWC_CLIENT_LOAD_PIN : 0);
    rc = nwc_client_load_places(c, model, NULL, at, (size_t)n, flags, progress_bar, (void *)arg, &r);
    return rc < 0 ? die_tensor(c, rc, model, tensor) : print_split(c, model, at, n, &r);
  }
  if (n > 1 && strcmp(cmd, "evict")) { /* load, pin: one request, each blob read once */
    nwc_client_result r;
    rc = nwc_client_load_places(c, model, tensor, at, (size_t)n,
                                !strcmp(cmd, "pin") ? NWC_CLIENT_LOAD_PIN : 0, progress_bar,
                                (void *)arg, &r);
    if (rc == 0) { /* the places named, each once, host memory first */
      char places[MAX_PLACES * 8] = "", name[16];
      for (int p = NWC_CLIENT_CPU, off = 0; p < 256; p++) {
        if (!names_place(at, n, p)) continue;
        place_name(p, name);
        off += snprintf(places + off, sizeof places - off, "%s%s", off ? "," : "", name);
      }
      print_result(arg, places, &r, NULL);
      return 0;
    }
    if (rc != -EOPNOTSUPP) return die_tensor(c, rc, model, tensor);
    rc = 0; /* an older daemon: a load_on per place, below */
  }
  json_t *arr = json && n > 1 ? json_array() : NULL;
  for (int i = 0; i < n && rc == 0; i++) { /* one replica per place, in order */
    nwc_client_result r;
    char place[16];
    place_name(at[i], place);
    if (!strcmp(cmd, "load") && device_opt)
      rc = nwc_client_load_on(c, model, tensor, at[i], progress_bar, (void *)arg, &r);
    else if (!strcmp(cmd, "pin") && device_opt)
      rc = nwc_client_pin_on(c, model, tensor, at[i], progress_bar, (void *)arg, &r);
    else if (!strcmp(cmd, "evict") && device_opt) rc = nwc_client_evict_on(c, model, tensor, at[i], &r);
    else if (!strcmp(cmd, "load")) rc = nwc_client_load(c, model, tensor, progress_bar, (void *)arg, &r);
    else if (!strcmp(cmd, "evict")) rc = nwc_client_evict(c, model, tensor, &r);
    else if (!strcmp(cmd, "pin")) rc = nwc_client_pin(c, model, tensor, &r);
    else rc = nwc_client_unpin(c, model, tensor, &r);
    if (rc == 0) print_result(arg, n > 1 ? place : NULL, &r, arr);
  }
  if (rc < 0) return json_decref(arr), die_tensor(c, rc, model, tensor);
  if (arr) json_out(arr);
  return 0;
}

/* The tensors an import skipped, for its line: "; skipped 2 tensors that nwc does not store:
 * position_ids (I64), e (F32, empty)", the first SKIPPED_SHOWN of them, then how many more. */
#define SKIPPED_SHOWN 8

static void print_skipped(const nwc_client_skipped *v, size_t n, uint64_t count) {
  size_t shown = n < SKIPPED_SHOWN ? n : SKIPPED_SHOWN;
  printf("; skipped %llu tensor%s that nwc does not store: ", (unsigned long long)count, plural(count));
  for (size_t i = 0; i < shown; i++) {
    uint64_t numel = 1;
    for (unsigned d = 0; d < v[i].ndim; d++) numel *= v[i].shape[d];
    printf("%s%s (%s%s)", i ? ", " : "", v[i].name, v[i].dtype, numel ? "" : ", empty");
  }
  if (count > shown)
    printf("%s%llu more (--json lists %s)", shown ? ", and " : "", (unsigned long long)(count - shown),
           count > n ? "the first 1024" : "them");
}

static json_t *skipped_json(const nwc_client_skipped *v, size_t n) {
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_push(arr, json_pack("{s:s,s:s,s:o}", "name", v[i].name, "dtype", v[i].dtype,
                                         "shape", shape_json(v[i].shape, v[i].ndim)));
  return arr;
}

static int cmd_import(int argc, char **argv) {
  nwc_client_import_opts o = {0, NWC_CLIENT_LAYOUT_AUTO, progress_bar, "import"};
  const char *model = NULL, *path = NULL;
  unsigned flags = 0;
  for (int i = 0; i < argc; i++) {
    uint64_t layout;
    if (!strcmp(argv[i], "--strict")) {
      flags |= NWC_CLIENT_IMPORT_STRICT;
    } else if (!strcmp(argv[i], "--elem") && i + 1 < argc) {
      i++;
      if (!strcmp(argv[i], "fp8")) o.elem = 1;
      else if (strcmp(argv[i], "bf16"))
        return fprintf(stderr, "%s: import: --elem: expected bf16 or fp8, got '%s'\n", prog, argv[i]), 2;
    } else if (!strcmp(argv[i], "--layout") && i + 1 < argc) {
      if (!strcmp(argv[++i], "auto")) o.layout = NWC_CLIENT_LAYOUT_AUTO;
      else if (nwc__u64_of(argv[i], 2, &layout)) o.layout = (unsigned)layout;
      else return fprintf(stderr, "%s: import: --layout: expected auto, 0, 1 or 2, got '%s'\n", prog, argv[i]), 2;
    } else if (unknown_option(argv[i])) {
      return 2;
    } else if (!model) {
      model = argv[i];
    } else if (!path) {
      path = argv[i];
    } else {
      return fprintf(stderr, "%s: import: unexpected '%s'\n", prog, argv[i]), 2;
    }
  }
  if (!path) return missing(model ? "FILE.safetensors or INDEX.json" : "MODEL");
  nwc_client *c = connected();
  if (!c) return 1;
  nwc_client_result r;
  nwc_client_skipped *sk;
  size_t nsk;
  int rc = nwc_client_import2(c, model, path, &o, flags, &r, &sk, &nsk);
  if (rc == -EEXIST)
    return fprintf(stderr, "%s: import: %s (%s rm %s removes it; or import under another name)\n",
                   prog, nwc_client_last_error(), prog, model), 1;
  if (rc < 0) return die(rc);
  char b0[32], b1[32];
  if (json) {
    json_out(json_pack("{s:s,s:I,s:I,s:I,s:f,s:f,s:I,s:o}", "name", model, "tensors", (json_int_t)r.tensors,
                       "raw_bytes", (json_int_t)r.raw_bytes, "nwc_bytes", (json_int_t)r.bytes,
                       "ratio", ratio(r.bytes, r.raw_bytes), "seconds", r.micros / 1e6,
                       "skipped", (json_int_t)r.skipped, "skipped_tensors", skipped_json(sk, nsk)));
  } else {
    printf("imported %s: %llu tensor%s, %s -> %s (ratio %.3f) in %.2f s", model,
           (unsigned long long)r.tensors, plural(r.tensors), nwc_size_text(r.raw_bytes, b0), nwc_size_text(r.bytes, b1),
           ratio(r.bytes, r.raw_bytes), r.micros / 1e6);
    if (r.skipped) print_skipped(sk, nsk, r.skipped);
    putchar('\n');
  }
  free(sk);
  return 0;
}

/* pull REF [NAME] and push MODEL REF, each with --plain-http. */
static int cmd_registry(int argc, char **argv) {
  const bool pull = !strcmp(cmd, "pull");
  const char *a[2] = {NULL, NULL};
  unsigned flags = 0;
  int n = 0;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--plain-http")) flags |= NWC_CLIENT_PLAIN_HTTP;
    else if (unknown_option(argv[i])) return 2;
    else if (n < 2) a[n++] = argv[i];
    else return fprintf(stderr, "%s: %s: unexpected '%s'\n", prog, cmd, argv[i]), 2;
  }
  if (n < (pull ? 1 : 2)) return missing(pull ? "REF" : n ? "REF" : "MODEL");
  const char *ref = pull ? a[0] : a[1], *model = pull ? a[1] : a[0];
  nwc_client *c = connected();
  if (!c) return 1;
  nwc_client_result r = {0};
  char digest[73] = "";
  int rc = pull ? nwc_client_pull(c, ref, model, NULL, NULL, flags, progress_bar, (void *)cmd, &r, digest)
                : nwc_client_push(c, model, ref, NULL, NULL, flags, progress_bar, (void *)cmd, &r, digest);
  if (rc < 0) return die(rc);
  char b[32];
  if (json)
    json_out(json_pack("{s:s,s:s,s:s,s:b,s:I,s:I,s:f}", "ref", ref, "model", model ? model : "",
                       "digest", digest, "already", (int)r.skipped, "tensors", (json_int_t)r.tensors,
                       "nwc_bytes", (json_int_t)r.bytes, "seconds", r.micros / 1e6));
  else if (pull && r.skipped)
    printf("already have %s%s%s (%s)\n", ref, model ? " as " : "", model ? model : "", digest);
  else
    printf("%s %s %s %s: %llu tensor%s, %s in %.2f s (%s)\n", pull ? "pulled" : "pushed", pull ? ref : model,
           pull ? "into" : "to", pull ? (model ? model : "its own name") : ref, (unsigned long long)r.tensors,
           plural(r.tensors), nwc_size_text(r.bytes, b), r.micros / 1e6, digest);
  return 0;
}

static void print_line(void *ctx, const char *line) {
  (void)ctx;
  printf("  %s\n", line);
}

static int cmd_rm(const char *model) {
  nwc_client *c = connected();
  if (!c) return 1;
  int rc = nwc_client_remove(c, model);
  if (rc < 0) return die(rc);
  if (json) json_out(json_pack("{s:s}", "removed", model));
  else printf("removed %s\n", model);
  return 0;
}

static int cmd_verify(const char *model) {
  nwc_client *c = connected();
  if (!c) return 1;
  nwc_client_result r;
  int rc = nwc_client_verify(c, model, json ? NULL : print_line, NULL, &r);
  if (rc < 0) return die(rc);
  char b[32];
  if (json)
    json_out(json_pack("{s:I,s:I,s:I,s:I,s:I}", "models", (json_int_t)r.skipped, "tensors",
                       (json_int_t)r.tensors, "chunks", (json_int_t)r.chunks, "bytes",
                       (json_int_t)r.bytes, "problems", (json_int_t)r.problems));
  else
    printf("verified %llu model%s, %llu tensor%s, %llu chunk%s, %s: %llu problem%s\n",
           (unsigned long long)r.skipped, plural(r.skipped), (unsigned long long)r.tensors,
           plural(r.tensors), (unsigned long long)r.chunks, plural(r.chunks), nwc_size_text(r.bytes, b),
           (unsigned long long)r.problems, plural(r.problems));
  return r.problems ? 1 : 0;
}

static int cmd_devices(void) {
  nwc_client *c = connected();
  if (!c) return 1;
  nwc_client_place *p;
  size_t n;
  int rc = nwc_client_devices(c, &p, &n);
  if (rc < 0) return die(rc);
  json_t *arr = json ? json_array() : NULL;
  if (!json)
    printf("%-7s %10s %10s %7s %10s %10s %10s %10s\n", "PLACE", "BUDGET", "USED", "TENSORS",
           "PINNED", "FREE", "TOTAL", "POOL");
  for (size_t i = 0; i < n; i++) {
    if (json) {
      json_push(arr, json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "place", p[i].name,
                                           "budget", (json_int_t)p[i].budget, "resident_bytes",
                                           (json_int_t)p[i].resident_bytes, "resident_tensors",
                                           (json_int_t)p[i].resident_tensors, "pinned_bytes",
                                           (json_int_t)p[i].pinned_bytes, "mem_free",
                                           (json_int_t)p[i].mem_free, "mem_total",
                                           (json_int_t)p[i].mem_total, "pool_idle",
                                           (json_int_t)p[i].pool_idle));
    } else {
      char b[6][32];
      printf("%-7s %10s %10s %7llu %10s %10s %10s %10s\n", p[i].name, nwc_size_text(p[i].budget, b[0]),
             nwc_size_text(p[i].resident_bytes, b[1]), (unsigned long long)p[i].resident_tensors,
             nwc_size_text(p[i].pinned_bytes, b[2]), nwc_size_text(p[i].mem_free, b[3]),
             nwc_size_text(p[i].mem_total, b[4]), nwc_size_text(p[i].pool_idle, b[5]));
    }
  }
  free(p);
  if (json) json_out(arr);
  return 0;
}

static int cmd_stats(void) {
  nwc_client *c = connected();
  if (!c) return 1;
  nwc_client_counters s;
  int rc = nwc_client_stats(c, &s);
  if (rc < 0) return die(rc);
  const uint64_t *v = &s.uptime_ms;
  static const char *names[] = {"uptime_ms", "connections", "conn_total", "requests", "errors",
                                "budget", "resident_bytes", "pinned_bytes", "resident_tensors",
                                "loads", "load_bytes", "load_us", "direct_loads", "buffered_loads",
                                "evictions", "mlock_ok", "mlock_failed", "mapped_computes",
                                "batched_passes", "batched_columns", "threads", "gpu_budget",
                                "gpu_resident_bytes"};
  if (json) {
    json_t *o = json_object();
    json_object_set_new(o, "backend", json_string(s.backend));
    json_object_set_new(o, "daemon", json_string(nwc_client_daemon_version(c)));
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
      json_object_set_new(o, names[i], json_integer((json_int_t)v[i]));
    json_out(o);
    return 0;
  }
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    size_t n = strlen(names[i]);
    bool bytes = (n >= 5 && !strcmp(names[i] + n - 5, "bytes")) || (n >= 6 && !strcmp(names[i] + n - 6, "budget"));
    char h[32];
    printf("%-18s %llu%s%s%s\n", names[i], (unsigned long long)v[i], bytes ? " (" : "",
           bytes ? nwc_size_text(v[i], h) : "", bytes ? ")" : "");
  }
  printf("%-18s %s\n", "backend", s.backend);
  printf("%-18s %s\n", "daemon", nwc_client_daemon_version(c));
  return 0;
}

/* --json of a data command: what it wrote where (out's shape and dtype). */
static void json_written(const char *target, const char *out, const uint64_t *shape, unsigned ndim,
                         const char *dtype, unsigned rflags) {
  json_out(json_pack("{s:s,s:s,s:o,s:s,s:b}", "tensor", target, "out", out, "shape", shape_json(shape, ndim), "dtype",
                     dtype, "mapped", (rflags & NWC_CLIENT_MAPPED) != 0));
}

static int cmd_compute(int argc, char **argv) {
  const char *out = NULL, *target = NULL, *xpath = NULL, *bias = NULL;
  unsigned flags = 0;
  float scale = 1;
  bool scaled = false;
  uint64_t rows[4096];
  size_t nrows = 0;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
    else if (!strcmp(argv[i], "--bf16")) flags |= NWC_CLIENT_BF16;
    else if (!strcmp(argv[i], "--bias") && i + 1 < argc) bias = argv[++i];
    else if (!strcmp(argv[i], "--scale") && i + 1 < argc) {
      if (parse_float("--scale", argv[++i], &scale) < 0) return 2;
      scaled = true;
    } else if (target && !strcmp(cmd, "gather") && (argv[i][0] != '-' || isdigit((unsigned char)argv[i][1]))) {
      if (nrows == 4096) return fprintf(stderr, "%s: gather: at most 4096 rows at once\n", prog), 2;
      if (parse_u64("ROW", argv[i], UINT64_MAX, &rows[nrows++]) < 0) return 2;
    } else if (unknown_option(argv[i])) return 2;
    else if (!target) target = argv[i];
    else if (!strcmp(cmd, "matvec") && !xpath) xpath = argv[i];
    else return fprintf(stderr, "%s: %s: unexpected '%s'\n", prog, cmd, argv[i]), 2;
  }
  bool matvec = !strcmp(cmd, "matvec");
  if ((!matvec && (bias || scaled)) || (matvec && (flags & NWC_CLIENT_BF16)))
    return fprintf(stderr, "%s: %s: --bias and --scale are matvec's, --bf16 gather's and dequant's\n", prog, cmd), 2;
  char model[1024];
  const char *tensor = NULL;
  if (!target) return missing("MODEL/TENSOR");
  if (split_tensor(target, model, sizeof model, &tensor) < 0) return 2;
  if (matvec && !xpath) return missing("X.npy");
  if (!strcmp(cmd, "gather") && !nrows) return missing("ROW");
  if (!out) return missing(matvec ? "-o Y.npy" : "-o OUT.npy");
  uint64_t xn = 0, xk = 0; /* matvec: x is xn x xk */
  unsigned xdim = 0;
  int status;
  float *x = matvec ? npy_read_f32(xpath, &xn, &xk, &xdim, &status) : NULL; /* 3: no such file */
  if (matvec && !x) return status;
  nwc_client *c = connected();
  nwc_client_tensor_info info;
  int rc = c ? nwc_client_info(c, model, tensor, &info) : 0;
  if (!c || rc < 0) return free(x), c ? die_tensor(c, rc, model, tensor) : 1;
  uint64_t M = info.t.rows, K = info.t.cols;
  unsigned rflags = 0;
  const char *descr = flags & NWC_CLIENT_BF16 ? "<u2" : "<f4";
  size_t esz = flags & NWC_CLIENT_BF16 ? 2 : 4;
  int written = -1; /* npy_write's status once the daemon answered */
  if (matvec) {
    if (xk != K) {
      fprintf(stderr, "%s: matvec: x has %llu columns, %s takes %llu\n", prog,
              (unsigned long long)xk, target, (unsigned long long)K);
      free(x);
      return 1;
    }
    size_t cap = xn * M * 4;
    float *y = malloc(cap);
    rc = y ? nwc_client_matvec(c, model, tensor, bias, scale, x, K, (unsigned)xn, 0, y, cap, &rflags) : -ENOMEM;
    uint64_t shape2[2] = {xn, M}, *shape = xdim == 1 ? shape2 + 1 : shape2; /* y is x's rank */
    if (rc == 0) written = npy_write(out, "<f4", shape, xdim, y, cap);
    if (written == 0 && json) json_written(target, out, shape, xdim, "float32", rflags);
    else if (written == 0)
      printf("matvec %s: %llux%llu, %llu column(s) -> %s%s\n", target, (unsigned long long)M,
             (unsigned long long)K, (unsigned long long)xn, out, rflags & NWC_CLIENT_MAPPED ? " (mapped, not resident)" : "");
    free(x), free(y);
  } else {
    uint64_t n = !strcmp(cmd, "gather") ? nrows : M;
    size_t cap = n * K * esz;
    void *buf = malloc(cap ? cap : 1);
    if (!buf) rc = -ENOMEM;
    else if (!strcmp(cmd, "gather")) rc = nwc_client_gather(c, model, tensor, rows, nrows, flags, buf, cap, NULL, &rflags);
    else rc = nwc_client_dequant(c, model, tensor, flags, buf, cap, NULL, NULL, &rflags);
    /* gather: n x K; dequant: the tensor's own shape (a [N] tensor is stored as 1 x N). */
    uint64_t rowcol[2] = {n, K}, numel = 1;
    for (unsigned d = 0; d < info.t.ndim; d++) numel *= info.t.shape[d];
    bool own = !strcmp(cmd, "dequant") && info.t.ndim <= 8 && numel == M * K;
    const uint64_t *shape = own ? info.t.shape : rowcol;
    unsigned ndim = own ? info.t.ndim : 2;
    if (rc == 0) written = npy_write(out, descr, shape, ndim, buf, cap);
    if (written == 0 && json) json_written(target, out, shape, ndim, esz == 2 ? "bf16" : "float32", rflags);
    else if (written == 0) {
      char text[200];
      printf("%s %s: %s %s -> %s%s\n", cmd, target, shape_text(shape, ndim, text, sizeof text),
             esz == 2 ? "bf16" : "float32", out, rflags & NWC_CLIENT_MAPPED ? " (mapped, not resident)" : "");
    }
    free(buf);
  }
  if (rc < 0) return die(rc);
  return written == 0 ? 0 : 1;
}

/* Each command, how many plain arguments it takes (min, max; -1: it parses its own, options
 * included) and its --help. */
static const struct command {
  const char *name;
  int min, max;
  const char *help;
} commands[] = {
    {"ls", 0, 1, "ls [MODEL] [--json]: the models of the store (name, tensors, raw and nwc bytes, ratio,\n"
                 "  resident bytes), or the tensors of MODEL (name, shape, dtype, elem, layout, sizes, residency)"},
    {"ps", 0, 0, "ps [--json]: the resident tensors: where (cpu, cuda:0, ...), bytes, pinned, mlock'ed,\n"
                 "  references, client mappings, last use; then the mappings per place (maps on cuda:0: N of T tensors)"},
    {"devices", 0, 0, "devices [--json]: memory per place, host (cpu) first, then each GPU (cuda:N): budget,\n"
                      "  bytes and tensors resident (used), pinned bytes, free and total memory, and on a GPU\n"
                      "  what the daemon's pool of device copies holds beyond them (pool)"},
    {"info", 1, 1, "info MODEL/TENSOR [--json]: one tensor: shape, storage, container file and offset, residency"},
    {"load", 1, 1, "load MODEL[/TENSOR] [--device PLACES [--split]] [--json]: read a model or one tensor into memory\n"
                   "  (io_uring, checksums checked), host memory or a GPU (default: where it is resident, else\n"
                   "  its last place, else GPU 0 with the cuda backend); PLACES is cpu, cuda:N, a comma-separated\n"
                   "  list of them (one replica on each, all from one read of each blob) or all (every GPU);\n"
                   "  --split puts each tensor of MODEL at ONE of the places instead: tensors in natural name\n"
                   "  order (layers.2 before layers.10), each at the first place in the order cuda:0, cuda:1,\n"
                   "  ..., cpu whose free budget takes it, one already resident at a place named staying\n"
                   "  there, nothing evicted; it prints the tensors and bytes at each place; a tensor that\n"
                   "  fits nowhere fails it with ENOSPC, nothing loaded; a progress bar on a TTY; fails with\n"
                   "  ENOSPC when it cannot fit the daemon's budget"},
    {"evict", 1, 1, "evict MODEL[/TENSOR] [--device PLACES] [--json]: drop from memory, every place, or with --device\n"
                    "  the replicas on the places named (tensors in use or pinned there are kept whole and counted)"},
    {"pin", 1, 1, "pin MODEL[/TENSOR] [--device PLACES [--split]] [--json]: load and keep resident (never evicted\n"
                  "  by LRU); with --device the replica on each place named (as load --device), with --split\n"
                  "  each tensor at its one place (as load --split)"},
    {"unpin", 1, 1, "unpin MODEL[/TENSOR] [--json]: let LRU eviction take it again"},
    {"import", -1, -1, "import MODEL FILE.safetensors|INDEX.json [--elem bf16|fp8] [--layout auto|0|1|2] [--strict]\n"
                       "  [--json]: encode into the store (layout auto, the default: 2 for BF16 matrices of 16 or\n"
                       "  more rows, 0 for the rest); the files are opened here and passed to nwcd, which\n"
                       "  reads only those; tensors of dtypes nwc does not store (integers, BOOL) and empty\n"
                       "  ones are skipped and named, or with --strict fail the import (nothing is stored)"},
    {"pull", -1, -1, "pull REF [NAME] [--plain-http] [--json]: a model from an OCI registry into the store, as NAME\n"
                     "  (default: the name it was pushed under); REF is host[:port]/repository[:tag|@sha256:...];\n"
                     "  nwcd downloads it, checks every chunk and digest, and publishes it whole or not at all;\n"
                     "  a NAME already pulled from the same manifest is left as it is; credentials as docker\n"
                     "  and podman keep them (~/.docker/config.json, auth.json); --plain-http for http://"},
    {"push", -1, -1, "push MODEL REF [--plain-http] [--json]: a stored model to an OCI registry as an artifact\n"
                     "  (docs/oci.md): blobs the registry already has are not sent again"},
    {"rm", 1, 1, "rm MODEL [--json]: remove a model (refused while one of its tensors is in use)"},
    {"verify", 0, 1, "verify [MODEL] [--json]: re-read every chunk and decode every tensor; exit 1 on problems"},
    {"stats", 0, 0, "stats [--json]: the daemon's counters (requests, loads, evictions, O_DIRECT, mlock, batching)"},
    {"matvec", -1, -1, "matvec MODEL/TENSOR X.npy -o Y.npy [--bias TENSOR] [--scale S] [--json]: y = S * W x + bias\n"
                       "  for X float32 of shape [K] or [n, K] (n <= 64); Y float32 [n, M] ([M] for X of shape [K]);\n"
                       "  the bias is a tensor of the same model, named without MODEL/"},
    {"gather", -1, -1, "gather MODEL/TENSOR ROW... -o OUT.npy [--bf16] [--json]: rows by index (at most 4096), float32\n"
                       "  (or BF16 bits as uint16)"},
    {"dequant", -1, -1, "dequant MODEL/TENSOR -o OUT.npy [--bf16] [--json]: the whole tensor in its shape, float32 (or\n"
                        "  BF16 bits as uint16)"},
};

/* Edits (insert, delete, replace one letter) from a to b (Levenshtein; both under 32 letters). */
static unsigned edits(const char *a, const char *b) {
  size_t n = strlen(b);
  unsigned row[32];
  for (size_t k = 0; k <= n; k++) row[k] = (unsigned)k;
  for (size_t i = 0; a[i]; i++) {
    unsigned diag = row[0];
    row[0] = (unsigned)i + 1;
    for (size_t k = 1; k <= n; k++) {
      unsigned up = row[k], best = diag + (a[i] != b[k - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[k - 1] + 1 < best) best = row[k - 1] + 1;
      row[k] = best, diag = up;
    }
  }
  return row[n];
}

/* The command one or two edits from a mistyped one, if exactly one is closest. */
static const char *nearest_command(const char *typed) {
  const char *best = NULL;
  unsigned best_d = 3, ties = 0;
  if (strlen(typed) >= 32) return NULL;
  for (size_t k = 0; k < sizeof commands / sizeof *commands; k++) {
    unsigned d = edits(typed, commands[k].name);
    if (d < best_d) best = commands[k].name, best_d = d, ties = 0;
    else if (d == best_d) ties++;
  }
  return best && !ties ? best : NULL;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: %s [--socket PATH] COMMAND [ARGS] [--json]\n"
          "  ls [MODEL]                 models, or the tensors of MODEL\n"
          "  ps                         resident tensors\n"
          "  devices                    memory per place (host, each GPU)\n"
          "  info MODEL/TENSOR          one tensor\n"
          "  load MODEL[/TENSOR] [--device cpu|cuda:N|A,B|all [--split]]\n"
          "                             read into memory (progress on a TTY)\n"
          "  evict MODEL[/TENSOR]       drop from memory\n"
          "  pin | unpin MODEL[/TENSOR] keep resident (loads first) / release\n"
          "  import MODEL FILE.safetensors|INDEX.json [--elem bf16|fp8] [--layout auto|0|1|2] [--strict]\n"
          "  pull REF [NAME] [--plain-http]  a model from an OCI registry\n"
          "  push MODEL REF [--plain-http]   a model to an OCI registry\n"
          "  rm MODEL                   remove a model from the store\n"
          "  verify [MODEL]             re-read and check every chunk and tensor\n"
          "  stats                      daemon counters\n"
          "  matvec MODEL/TENSOR X.npy -o Y.npy [--bias TENSOR] [--scale S]\n"
          "  gather MODEL/TENSOR ROW... -o OUT.npy [--bf16]\n"
          "  dequant MODEL/TENSOR -o OUT.npy [--bf16]\n"
          "The socket defaults to %s (NWC_SOCKET overrides). COMMAND --help for one command.\n",
          prog, nwc_client_default_socket());
}

int main(int argc, char **argv) {
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (!strcmp(argv[i], "--socket") && i + 1 < argc) sock_path = argv[++i];
    else if (!strcmp(argv[i], "--json")) json = true;
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout), 0;
    else return fprintf(stderr, "%s: unknown option '%s'\n", prog, argv[i]), usage(stderr), 2;
  }
  if (i >= argc) return usage(stderr), 2;
  cmd = argv[i++];
  const struct command *spec = NULL;
  for (size_t k = 0; k < sizeof commands / sizeof *commands; k++)
    if (!strcmp(cmd, commands[k].name)) spec = &commands[k];
  if (!spec) {
    const char *near = nearest_command(cmd);
    fprintf(stderr, "%s: unknown command '%s' (%s%s%s%s --help lists the commands)\n", prog, cmd,
            near ? "did you mean '" : "", near ? near : "", near ? "'? " : "", prog);
    return 2;
  }
  /* Options after the command: --json, --socket, --help anywhere. */
  char **args = calloc((size_t)argc, sizeof *args);
  int nargs = 0;
  if (!args) return fprintf(stderr, "%s: out of memory\n", prog), 1;
  for (; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) json = true;
    else if (!strcmp(argv[i], "--socket") && i + 1 < argc) sock_path = argv[++i];
    else if (!strcmp(argv[i], "--device") && i + 1 < argc &&
             (!strcmp(cmd, "load") || !strcmp(cmd, "pin") || !strcmp(cmd, "evict")))
      device_opt = argv[++i];
    else if (!strcmp(argv[i], "--split") && (!strcmp(cmd, "load") || !strcmp(cmd, "pin")))
      split_opt = true;
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
      return printf("usage: %s [--socket PATH] %s\n", prog, spec->help), free(args), 0;
    else args[nargs++] = argv[i];
  }
  bool bad = false;
  for (int k = 0; spec->max >= 0 && k < nargs; k++) bad |= unknown_option(args[k]);
  if (!bad && spec->max >= 0 && nargs > spec->max) {
    fprintf(stderr, "%s: %s: unexpected '%s' (%s %s --help says what it takes)\n", prog, cmd,
            args[spec->max], prog, cmd);
    bad = true;
  }
  if (!bad && spec->max >= 0 && nargs < spec->min) { /* the usage's first argument: MODEL... */
    const char *what = spec->help + strlen(spec->name) + 1;
    char name[32];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(what, " "), what);
    missing(name);
    bad = true;
  }
  if (bad) return free(args), 2;
  int ret;
  if (!strcmp(cmd, "ls")) ret = cmd_ls(nargs, args);
  else if (!strcmp(cmd, "ps")) ret = cmd_ps();
  else if (!strcmp(cmd, "devices")) ret = cmd_devices();
  else if (!strcmp(cmd, "info")) ret = cmd_info(args[0]);
  else if (!strcmp(cmd, "import")) ret = cmd_import(nargs, args);
  else if (!strcmp(cmd, "rm")) ret = cmd_rm(args[0]);
  else if (!strcmp(cmd, "pull") || !strcmp(cmd, "push")) ret = cmd_registry(nargs, args);
  else if (!strcmp(cmd, "verify")) ret = cmd_verify(nargs ? args[0] : NULL);
  else if (!strcmp(cmd, "stats")) ret = cmd_stats();
  else if (!strcmp(cmd, "matvec") || !strcmp(cmd, "gather") || !strcmp(cmd, "dequant")) ret = cmd_compute(nargs, args);
  else ret = cmd_residency(args[0]);
  nwc_client_free(conn);
  free(args);
  return ret;
}
