/*
 * bench_daemon.c - `nwc-bench daemon FILE.safetensors [--seconds S] [--rows M --cols K]`: what
 * going through nwcd costs.  Starts a real nwcd (NWCD_PATH, or --nwcd PATH) on a temporary store,
 * imports FILE through libnwc-client, picks the matrix closest to 512 x 1536, and prints JSON
 * lines:
 *   {"bench":"roundtrip", op matvec|dequant, path inproc|socket, p50_us, p99_us, n}
 *   {"bench":"overhead", op, p50_us, p99_us}          socket minus in-process
 *   {"bench":"throughput", clients 1|4|16, matvec_per_s}   client processes in parallel
 *   {"bench":"load", bytes, load_gbps, read_gbps, ratio}  nwcd load vs a plain read() of the
 *                                                         same container files, same run (warm)
 * In-process means the same codec call (nwc_matvec / nwc_dequant) on the tensor encoded here.
 */
#include "bench.h"

#include "nwc_client.h"
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void pct(double *t, size_t n, double *p50, double *p99) {
  qsort(t, n, sizeof *t, cmp_d);
  *p50 = t[n / 2] * 1e6;
  *p99 = t[(size_t)((double)n * 0.99)] * 1e6;
}

static int connectable(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path) return 0;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
  close(fd);
  return ok;
}

int nwc_bench_daemon(int argc, char **argv) {
  const char *file = NULL, *nwcd = NWCD_PATH;
  double seconds = 1.0;
  uint64_t want_rows = 512, want_cols = 1536;
  static const char usage[] =
      "usage: nwc-bench daemon FILE.safetensors [--seconds S] [--nwcd PATH] [--rows M] [--cols K]\n"
      "Starts nwcd on a temporary store, imports FILE, and times matvec/dequant round trips through\n"
      "the socket against the same calls in-process, throughput with 1/4/16 clients, and load.\n";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(usage, stdout), 0;
    if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--nwcd") && i + 1 < argc) nwcd = argv[++i];
    else if (!strcmp(argv[i], "--rows") && i + 1 < argc) want_rows = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--cols") && i + 1 < argc) want_cols = strtoull(argv[++i], NULL, 0);
    else if (!file) file = argv[i];
    else return fprintf(stderr, "nwc-bench daemon: unexpected '%s'\n", argv[i]), 2;
  }
  if (!file) return fputs(usage, stderr), 2;
  nwc_st_file *st;
  if (nwc_st_open(file, &st) < 0) return fprintf(stderr, "nwc-bench daemon: cannot read %s\n", file), 1;
  const nwc_st_tensor *best = NULL;
  uint64_t M = 0, K = 0;
  double bestd = 1e300;
  for (size_t i = 0; i < st->count; i++) {
    uint64_t r, c;
    nwc_bench_matrix_shape(&st->tensors[i], &r, &c);
    if (strcmp(st->tensors[i].dtype, "BF16") || r < 2) continue;
    double dd = fabs(log((double)r / (double)want_rows)) + fabs(log((double)c / (double)want_cols));
    if (dd < bestd) bestd = dd, best = &st->tensors[i], M = r, K = c;
  }
  if (!best) return fprintf(stderr, "nwc-bench daemon: no BF16 matrix in %s\n", file), 1;

  char dir[] = "/tmp/nwc-bench-daemon-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  char sock[128], store[128];
  snprintf(sock, sizeof sock, "%s/nwcd.sock", dir);
  snprintf(store, sizeof store, "%s/store", dir);
  pid_t pid = fork();
  if (pid == 0) {
    int nul = open("/dev/null", O_WRONLY);
    dup2(nul, 1), dup2(nul, 2);
    execl(nwcd, nwcd, "--store", store, "--socket", sock, "--quiet", (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 500 && !connectable(sock); i++) usleep(10000);
  nwc_client *c = NULL;
  int rc = nwc_client_connect(sock, &c);
  if (rc == 0) rc = nwc_client_import(c, "bench", file, NULL, NULL);
  if (rc < 0) {
    fprintf(stderr, "nwc-bench daemon: %s\n", nwc_client_last_error());
    kill(pid, SIGTERM), waitpid(pid, NULL, 0);
    return 1;
  }
  /* The same tensor in-process. */
  uint16_t *w = malloc(M * K * 2);
  memcpy(w, nwc_st_data(st, best), M * K * 2);
  nwc_tensor t;
  nwc_tensor_encode(w, M, K, NWC_ELEM_BF16, NULL, &t);
  uint64_t K16 = (K + 15) / 16 * 16;
  float *x = calloc(K16, 4), *y = malloc(M * 4);
  uint16_t *deq = malloc(M * K16 * 2), *deq2 = malloc(M * K * 2);
  for (uint64_t k = 0; k < K; k++) x[k] = (float)sin((double)k);
  size_t iters = (size_t)(seconds * 2000) + 100;
  double *tv = malloc(iters * sizeof *tv), p50, p99, in50[2], in99[2];
  const char *ops[2] = {"matvec", "dequant"};
  nwc_client_load(c, "bench", best->name, NULL, NULL, NULL);
  for (int op = 0; op < 2; op++) {
    for (int path = 0; path < 2; path++) {
      size_t n = op == 0 ? iters : iters / 8 + 20;
      for (size_t i = 0; i < n + 10; i++) {
        double t0 = nwc_bench_now();
        if (path == 0) op == 0 ? nwc_matvec(&t, x, NULL, y, NULL) : nwc_dequant(&t, deq);
        else if (op == 0) nwc_client_matvec(c, "bench", best->name, NULL, 1.0f, x, K, 1, 0, y, M * 4, NULL);
        else nwc_client_dequant(c, "bench", best->name, NWC_CLIENT_BF16, deq2, M * K * 2, NULL, NULL, NULL);
        if (i >= 10) tv[i - 10] = nwc_bench_now() - t0;
      }
      pct(tv, n, &p50, &p99);
      if (path == 0) in50[op] = p50, in99[op] = p99;
      printf("{\"bench\":\"roundtrip\",\"op\":\"%s\",\"path\":\"%s\",\"rows\":%llu,\"cols\":%llu,"
             "\"p50_us\":%.2f,\"p99_us\":%.2f,\"n\":%zu}\n", ops[op], path ? "socket" : "inproc",
             (unsigned long long)M, (unsigned long long)K, p50, p99, n);
      if (path == 1)
        printf("{\"bench\":\"overhead\",\"op\":\"%s\",\"p50_us\":%.2f,\"p99_us\":%.2f,"
               "\"target_p50_us\":20,\"target_p99_us\":100}\n", ops[op], p50 - in50[op], p99 - in99[op]);
      fflush(stdout);
    }
  }
  /* Throughput with 1, 4, 16 client processes. */
  int clients[3] = {1, 4, 16};
  for (int ci = 0; ci < 3; ci++) {
    int pfd[2];
    if (pipe(pfd) < 0) break;
    pid_t kids[16];
    for (int k = 0; k < clients[ci]; k++) {
      if ((kids[k] = fork()) == 0) {
        nwc_client *cc;
        uint64_t count = 0;
        if (nwc_client_connect(sock, &cc) == 0) {
          double t_end = nwc_bench_now() + seconds;
          while (nwc_bench_now() < t_end &&
                 nwc_client_matvec(cc, "bench", best->name, NULL, 1.0f, x, K, 1, 0, y, M * 4, NULL) == 0)
            count++;
          nwc_client_free(cc);
        }
        if (write(pfd[1], &count, sizeof count) != sizeof count) _exit(1);
        _exit(0);
      }
    }
    close(pfd[1]);
    uint64_t total = 0, v;
    while (read(pfd[0], &v, sizeof v) == sizeof v) total += v;
    close(pfd[0]);
    for (int k = 0; k < clients[ci]; k++) waitpid(kids[k], NULL, 0);
    nwc_client_counters s;
    nwc_client_stats(c, &s);
    printf("{\"bench\":\"throughput\",\"clients\":%d,\"matvec_per_s\":%.0f,\"batched_passes_total\":%llu}\n",
           clients[ci], (double)total / seconds, (unsigned long long)s.batched_passes);
    fflush(stdout);
  }
  /* Load vs a plain read of the container files. */
  nwc_client_tensor *ts;
  size_t nt;
  if (nwc_client_tensors(c, "bench", &ts, &nt) == 0 && nt) {
    nwc_client_tensor_info info;
    nwc_client_info(c, "bench", ts[0].name, &info);
    double best_load = 1e9, best_read = 1e9;
    uint64_t bytes = 0;
    for (int rep = 0; rep < 3; rep++) {
      nwc_client_evict(c, "bench", NULL, NULL);
      nwc_client_result r;
      double t0 = nwc_bench_now();
      if (nwc_client_load(c, "bench", NULL, NULL, NULL, &r) < 0) break;
      double tl = nwc_bench_now() - t0;
      bytes = r.bytes;
      if (tl < best_load) best_load = tl;
      int fd = open(info.path, O_RDONLY);
      char *buf = malloc(1 << 20);
      t0 = nwc_bench_now();
      while (fd >= 0 && read(fd, buf, 1 << 20) > 0) {
      }
      double tr = nwc_bench_now() - t0;
      if (tr < best_read) best_read = tr;
      free(buf);
      if (fd >= 0) close(fd);
    }
    printf("{\"bench\":\"load\",\"bytes\":%llu,\"load_gbps\":%.3f,\"read_gbps\":%.3f,\"ratio\":%.3f,"
           "\"note\":\"warm page cache; read is the whole container file\"}\n",
           (unsigned long long)bytes, bytes / best_load / 1e9, bytes / best_read / 1e9,
           best_read / best_load);
    free(ts);
  }
  nwc_client_free(c);
  kill(pid, SIGTERM);
  waitpid(pid, NULL, 0);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "nwc-bench daemon: could not remove %s\n", dir);
  nwc_tensor_release(&t);
  free(w), free(x), free(y), free(deq), free(deq2), free(tv);
  nwc_st_close(st);
  return 0;
}
