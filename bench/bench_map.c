/*
 * bench_map.c - `nwc-bench map FILE.safetensors [--procs N] [--seconds S] [--nwcd PATH]`: what
 * mapping resident tensors (nwc_client_map) buys and costs.  Starts a real nwcd on a temporary
 * store, imports FILE, and prints JSON lines, each side by side with its baseline in this run:
 *   {"bench":"map_call", op matvec|gather1, path local|socket|inproc, p50_us, p99_us, n}
 *        the tensor closest to 512 x 1536: on the mapping in this process, through the socket,
 *        and the codec call on a copy encoded here (in-process)
 *   {"bench":"map_setup", p50_us, p99_us}      nwc_client_map + nwc_client_unmap
 *   {"bench":"map_memory", procs, bytes, pss_bytes, private_copies_bytes, ratio}
 *        N processes map every tensor and read every page: the memory they and nwcd hold for
 *        those pages (the sum of their Pss, /proc/PID/smaps) against N private copies
 *   {"bench":"host_alloc", path anon|memfd, gbps, ratio}
 *        allocate, mlock and fill 256 MiB the old way (posix_memalign) and nwcd's (a memfd)
 */
#include "bench.h"

#include "nwc_client.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* Calls fn(ctx) n times after 10 warm-up calls; prints the JSON line with p50 and p99. */
static void time_calls(const char *head, size_t n, void (*fn)(void *), void *ctx) {
  double *t = malloc(n * sizeof *t);
  for (size_t i = 0; i < n + 10; i++) {
    double t0 = nwc_bench_now();
    fn(ctx);
    if (i >= 10) t[i - 10] = nwc_bench_now() - t0;
  }
  qsort(t, n, sizeof *t, nwc_bench_cmp_double);
  printf("{%s,\"p50_us\":%.2f,\"p99_us\":%.2f,\"n\":%zu}\n", head, t[n / 2] * 1e6,
         t[(size_t)(0.99 * (double)n)] * 1e6, n);
  fflush(stdout);
  free(t);
}

typedef struct call_ctx {
  nwc_client *c;
  nwc_client_mapping *m;
  const char *name;
  nwc_tensor t; /* the in-process copy */
  uint64_t M, K, row;
  float *x, *y;
  uint16_t *out;
} call_ctx;

static void mv_local(void *p) {
  call_ctx *c = p;
  nwc_client_map_matvec(c->m, NULL, 1.0f, c->x, 1, 0, c->y, c->M * 4);
}
static void mv_socket(void *p) {
  call_ctx *c = p;
  nwc_client_matvec(c->c, "bench", c->name, NULL, 1.0f, c->x, c->K, 1, 0, c->y, c->M * 4, NULL);
}
static void mv_inproc(void *p) {
  call_ctx *c = p;
  nwc_matvec(&c->t, c->x, NULL, c->y, NULL);
}
static void g_local(void *p) {
  call_ctx *c = p;
  c->row = (c->row * 7 + 1) % c->M;
  nwc_client_map_gather(c->m, &c->row, 1, NWC_CLIENT_BF16, c->out, c->K * 2);
}
static void g_socket(void *p) {
  call_ctx *c = p;
  c->row = (c->row * 7 + 1) % c->M;
  nwc_client_gather(c->c, "bench", c->name, &c->row, 1, NWC_CLIENT_BF16, c->out, c->K * 2, NULL,
                    NULL);
}
static void g_inproc(void *p) {
  call_ctx *c = p;
  c->row = (c->row * 7 + 1) % c->M;
  nwc_gather(&c->t, &c->row, 1, c->out);
}
static void setup(void *p) {
  call_ctx *c = p;
  nwc_client_mapping *m = NULL;
  if (nwc_client_map(c->c, "bench", c->name, &m) == 0) nwc_client_unmap(m);
}

/* The sum of Pss of pid's nwcd tensor memfd mappings, in bytes. */
static uint64_t memfd_pss(pid_t pid) {
  char path[64], line[512];
  snprintf(path, sizeof path, "/proc/%d/smaps", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  uint64_t sum = 0, kb;
  int in = 0;
  while (fgets(line, sizeof line, f)) {
    uint64_t a, b;
    char perms[8];
    if (sscanf(line, "%" SCNx64 "-%" SCNx64 " %7s", &a, &b, perms) == 3) /* a VMA's first line */
      in = strstr(line, "memfd:nwc-tensor") != NULL;
    else if (in && sscanf(line, "Pss: %" SCNu64, &kb) == 1)
      sum += kb * 1024;
  }
  fclose(f);
  return sum;
}

/* N processes map every tensor and read every page; then the Pss of all of them and nwcd. */
static void memory(const char *sock, pid_t nwcd, const nwc_client_tensor *ts, size_t nt,
                   int procs) {
  int go[2], ready[2];
  if (pipe(go) < 0 || pipe(ready) < 0) return;
  pid_t *kids = calloc((size_t)procs, sizeof *kids);
  uint64_t bytes = 0;
  for (int k = 0; k < procs; k++) {
    fflush(NULL);
    if ((kids[k] = fork()) == 0) {
      close(go[1]), close(ready[0]); /* so that the parent's close of go ends the wait */
      nwc_client *c;
      if (nwc_client_connect(sock, &c) < 0) _exit(1);
      uint64_t b = 0;
      for (size_t i = 0; i < nt; i++) {
        nwc_client_mapping *m;
        if (nwc_client_map(c, "bench", ts[i].name, &m) < 0) _exit(1);
        const nwc_client_map_info *in = nwc_client_mapping_info(m);
        volatile const uint8_t *p = in->base;
        for (uint64_t o = 0; o < in->size; o += 4096) (void)p[o];
        b += in->size; /* kept mapped until the parent has measured */
      }
      if (write(ready[1], &b, sizeof b) != sizeof b) _exit(1);
      char x;
      if (read(go[0], &x, 1) < 0) _exit(1);
      _exit(0);
    }
  }
  for (int k = 0; k < procs; k++)
    if (read(ready[0], &bytes, sizeof bytes) != sizeof bytes) bytes = 0;
  uint64_t pss = memfd_pss(nwcd);
  for (int k = 0; k < procs; k++) pss += memfd_pss(kids[k]);
  close(go[1]);
  for (int k = 0; k < procs; k++) waitpid(kids[k], NULL, 0);
  close(go[0]), close(ready[0]), close(ready[1]);
  printf("{\"bench\":\"map_memory\",\"procs\":%d,\"bytes\":%llu,\"pss_bytes\":%llu,"
         "\"private_copies_bytes\":%llu,\"ratio\":%.3f}\n", procs, (unsigned long long)bytes,
         (unsigned long long)pss, (unsigned long long)bytes * (unsigned long long)procs,
         bytes ? (double)pss / (double)bytes : 0.0);
  fflush(stdout);
  free(kids);
}

/* Allocate, mlock, fill n bytes; anonymous (posix_memalign) or a shared memfd mapping. */
static double host_alloc(size_t n, int memfd, const void *src) {
  double best = 1e9;
  for (int rep = 0; rep < 5; rep++) {
    double t0 = nwc_bench_now();
    void *p = NULL;
    int fd = -1;
    if (!memfd) {
      if (posix_memalign(&p, 4096, n)) return 0;
    } else {
      fd = memfd_create("bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      if (fd < 0 || ftruncate(fd, (off_t)n) < 0) return 0;
      p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) return 0;
    }
    mlock(p, n);
    memcpy(p, src, n);
    double t = nwc_bench_now() - t0;
    if (t < best) best = t;
    if (memfd) munmap(p, n), close(fd);
    else munlock(p, n), free(p);
  }
  return (double)n / best / 1e9;
}

int nwc_bench_map(int argc, char **argv) {
  const char *file = NULL, *nwcd = NWCD_PATH;
  double seconds = 1.0;
  int procs = 4;
  static const char usage[] =
      "usage: nwc-bench map FILE.safetensors [--procs N] [--seconds S] [--nwcd PATH]\n"
      "Starts nwcd on a temporary store, imports FILE, and times calls on a mapped tensor\n"
      "against the socket and in-process, map setup, the memory N mapping processes hold, and\n"
      "memfd against anonymous host allocation.\n";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(usage, stdout), 0;
    if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--procs") && i + 1 < argc) procs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--nwcd") && i + 1 < argc) nwcd = argv[++i];
    else if (!file) file = argv[i];
    else return fprintf(stderr, "nwc-bench map: unexpected '%s'\n", argv[i]), 2;
  }
  if (!file || procs < 1) return fputs(usage, stderr), 2;
  nwc_st_file *st;
  if (nwc_st_open(file, &st) < 0)
    return fprintf(stderr, "nwc-bench map: cannot read %s\n", file), 1;
  const nwc_st_tensor *best = NULL;
  double bestd = 1e300;
  call_ctx cc = {0};
  for (size_t i = 0; i < st->count; i++) {
    uint64_t r, k;
    nwc_st_matrix_shape(&st->tensors[i], &r, &k);
    double dd = fabs(log((double)r / 512)) + fabs(log((double)k / 1536));
    if (!strcmp(st->tensors[i].dtype, "BF16") && r > 1 && dd < bestd)
      bestd = dd, best = &st->tensors[i], cc.M = r, cc.K = k;
  }
  if (!best) return fprintf(stderr, "nwc-bench map: no BF16 matrix in %s\n", file), 1;

  char dir[] = "/tmp/nwc-bench-map-XXXXXX", sock[128], store[128];
  if (!mkdtemp(dir)) return 1;
  snprintf(sock, sizeof sock, "%s/nwcd.sock", dir);
  snprintf(store, sizeof store, "%s/store", dir);
  pid_t pid = nwc_bench_nwcd_start(nwcd, store, sock, NULL, NULL);
  if (pid < 0) return fprintf(stderr, "nwc-bench map: cannot run %s\n", nwcd), 1;
  int rc = nwc_client_connect(sock, &cc.c);
  if (rc == 0) rc = nwc_client_import(cc.c, "bench", file, NULL, NULL);
  cc.name = best->name;
  if (rc == 0) rc = nwc_client_map(cc.c, "bench", cc.name, &cc.m);
  if (rc < 0) {
    fprintf(stderr, "nwc-bench map: %s\n", nwc_client_last_error());
    nwc_bench_nwcd_stop(pid);
    return 1;
  }
  uint16_t *w = malloc(cc.M * cc.K * 2);
  memcpy(w, nwc_st_data(st, best), cc.M * cc.K * 2);
  nwc_tensor_encode(w, cc.M, cc.K, NWC_ELEM_BF16, NULL, &cc.t);
  uint64_t K16 = (cc.K + 15) & ~UINT64_C(15);
  cc.x = calloc(K16, 4), cc.y = malloc(cc.M * 4), cc.out = malloc(K16 * 2);
  for (uint64_t k = 0; k < cc.K; k++) cc.x[k] = (float)sin((double)k);

  size_t n = (size_t)(seconds * 2000) + 100;
  char head[256];
  static const struct {
    const char *op, *path;
    void (*fn)(void *);
  } calls[] = {{"matvec", "inproc", mv_inproc}, {"matvec", "local", mv_local},
               {"matvec", "socket", mv_socket}, {"gather1", "inproc", g_inproc},
               {"gather1", "local", g_local},   {"gather1", "socket", g_socket}};
  for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
    snprintf(head, sizeof head,
             "\"bench\":\"map_call\",\"op\":\"%s\",\"path\":\"%s\",\"rows\":%llu,\"cols\":%llu",
             calls[i].op, calls[i].path, (unsigned long long)cc.M, (unsigned long long)cc.K);
    time_calls(head, n, calls[i].fn, &cc);
  }
  time_calls("\"bench\":\"map_setup\"", n / 4 + 10, setup, &cc);
  nwc_client_unmap(cc.m);

  nwc_client_tensor *ts;
  size_t nt;
  if (nwc_client_tensors(cc.c, "bench", &ts, &nt) == 0) {
    memory(sock, pid, ts, nt, procs);
    free(ts);
  }
  size_t an = (size_t)256 << 20;
  void *src = malloc(an);
  memset(src, 0x3c, an);
  double anon = host_alloc(an, 0, src), mfd = host_alloc(an, 1, src);
  static const char line[] = "{\"bench\":\"host_alloc\",\"path\":\"%s\",\"bytes\":%zu,"
                             "\"gbps\":%.3f,\"ratio\":%.3f}\n";
  printf(line, "anon", an, anon, 1.0);
  printf(line, "memfd", an, mfd, anon > 0 ? mfd / anon : 0.0);
  free(src);

  nwc_client_free(cc.c);
  nwc_bench_nwcd_stop(pid);
  nwc_bench_remove_dir(dir);
  nwc_tensor_release(&cc.t);
  free(w), free(cc.x), free(cc.y), free(cc.out);
  nwc_st_close(st);
  return 0;
}
