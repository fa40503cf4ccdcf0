/*
 * bench_daemon.c - `nwc-bench daemon FILE.safetensors [--seconds S] [--rows M --cols K]`: what
 * going through nwcd costs.  Starts a real nwcd (NWCD_PATH, or --nwcd PATH) on a temporary store,
 * imports FILE through libnwc-client, picks the matrix closest to 512 x 1536, and prints JSON
 * lines:
 *   {"bench":"roundtrip", op matvec|dequant|stats, path inproc|socket|sleep|echo, p50_us, p99_us,
 *    n, cpu_us}
 *   {"bench":"overhead", op, p50_us, p99_us, sleep_*, floor_*}  socket minus in-process

 *   {"bench":"throughput", clients 1|4|16, mode sync|pipelined, depth, matvec_per_s}
 *                                                     client processes in parallel
 * (Loads through nwcd against cat and plain reads, cold and warm: `nwc-bench load`.)
 * In-process means the same codec call (nwc_matvec / nwc_dequant) on the tensor encoded here,
 * so nwcd runs its cpu backend (on a GPU machine too: nwc-bench gpu-daemon times the GPU).
 * "socket" is a connection with libnwc-client's default wait (it polls for the reply before it
 * sleeps), "sleep" a second one set to sleep at once (nwc_client_set_spin 0), timed in a second
 * pass against its own in-process turns (two connections taking turns would be concurrent
 * clients to nwcd: sleep_* in the overhead line).
 * cpu_us is the mean CPU time per call of the process doing the work: this one in-process, nwcd
 * through the socket (all its threads, from /proc/PID/task/TID/schedstat), so that a change in
 * the machine's speed between paths shows as such.
 * The paths of one op take turns in blocks of --turn calls (16), so that they see the same
 * machine (a shared VM's noise moves them together) while each keeps its weights in cache within
 * a block; the first call of each block finds the other path's data in the caches and nwcd's
 * threads asleep, so short turns charge that to the socket, and long ones (--turn 1000) measure
 * the steady state of a client that calls nwcd back to back.  "echo" is the floor of any socket design: a second process
 * that reads the matvec's request bytes and writes back its reply bytes over a socketpair, no
 * daemon; "stats" is nwcd's fixed cost per request (an op that computes nothing).  Pipelined
 * throughput keeps depth matvecs in flight per process (nwc_client_submit_matvec).  --cpu N pins
 * the bench and everything it starts to one CPU: on the dev VM, whose two vCPUs are hyperthreads
 * of one core, a matvec runs 2-3x slower while the other vCPU runs anything, so unpinned the
 * paths differ by what the other vCPU does meanwhile (nwcd idle in-process, the client during
 * a socket call).
 */
#include "bench.h"

#include "nwc_client.h"
#include "nwc_proto.h"
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static void pct(double *t, size_t n, double *p50, double *p99) {
  qsort(t, n, sizeof *t, nwc_bench_cmp_double);
  *p50 = t[n / 2] * 1e6;
  *p99 = t[(size_t)((double)n * 0.99)] * 1e6;
}

/* The echo floor: a child that reads req bytes and answers rep bytes until EOF.  Returns our
 * end of the socketpair (-1 on failure) and *pid. */
/* CPU seconds of all of pid's threads so far (schedstat: nanoseconds on CPU). */
static double proc_cpu(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  double sum = 0;
  for (struct dirent *e; d && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char f[sizeof path + sizeof e->d_name + 16];
    snprintf(f, sizeof f, "%s/%s/schedstat", path, e->d_name);
    FILE *fp = fopen(f, "r");
    unsigned long long ns = 0;
    if (fp && fscanf(fp, "%llu", &ns) != 1) ns = 0;
    if (fp) fclose(fp);
    sum += (double)ns * 1e-9;
  }
  if (d) closedir(d);
  return sum;
}

static int echo_start(size_t req, size_t rep, pid_t *pid) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) return -1;
  if ((*pid = fork()) == 0) {
    close(sv[0]);
    uint8_t *b = calloc(1, req > rep ? req : rep);
    for (;;) {
      for (size_t off = 0; off < req;) {
        ssize_t n = read(sv[1], b + off, req - off);
        if (n <= 0) _exit(0);
        off += (size_t)n;
      }
      if (write(sv[1], b, rep) != (ssize_t)rep) _exit(1);
    }
  }
  close(sv[1]);
  return sv[0];
}

static int echo_once(int fd, uint8_t *b, size_t req, size_t rep) {
  if (write(fd, b, req) != (ssize_t)req) return -1;
  for (size_t off = 0; off < rep;) {
    ssize_t n = read(fd, b + off, rep - off);
    if (n <= 0) return -1;
    off += (size_t)n;
  }
  return 0;
}

/* Matvecs one client process completes in seconds: synchronous (depth 0) or with depth requests
 * in flight. */
static uint64_t client_matvecs(const char *sock, const char *tensor, const float *x, uint64_t K,
                               uint64_t M, unsigned depth, double seconds) {
  nwc_client *cc;
  uint64_t count = 0;
  if (nwc_client_connect(sock, &cc) < 0) return 0;
  float *y = malloc((depth ? depth : 1) * M * 4);
  uint64_t tk[64];
  double t_end = nwc_bench_now() + seconds;
  if (!depth) {
    while (nwc_bench_now() < t_end &&
           nwc_client_matvec(cc, "bench", tensor, NULL, 1.0f, x, K, 1, 0, y, M * 4, NULL) == 0)
      count++;
  } else {
    unsigned n = 0;
    for (; n < depth; n++)
      if (nwc_client_submit_matvec(cc, "bench", tensor, NULL, 1.0f, x, K, 1, 0, y + n * M, M * 4,
                                   &tk[n]) < 0)
        break;
    for (unsigned i = 0; n == depth && nwc_bench_now() < t_end; i = (i + 1) % depth, count++)
      if (nwc_client_wait(cc, tk[i], NULL) < 0 ||
          nwc_client_submit_matvec(cc, "bench", tensor, NULL, 1.0f, x, K, 1, 0, y + i * M, M * 4,
                                   &tk[i]) < 0)
        break;
  }
  nwc_client_free(cc); /* what is still in flight is dropped with the connection */
  free(y);
  return count;
}

int nwc_bench_daemon(int argc, char **argv) {
  const char *file = NULL, *nwcd = NWCD_PATH;
  double seconds = 1.0;
  uint64_t want_rows = 512, want_cols = 1536;
  size_t turn = 16;
  int cpu = -1;
  static const char usage[] =
      "usage: nwc-bench daemon FILE.safetensors [--seconds S] [--nwcd PATH] [--rows M] [--cols K]\n"
      "                         [--turn N] [--cpu N]\n"
      "Starts nwcd on a temporary store, imports FILE, and times matvec/dequant round trips through\n"
      "the socket against the same calls in-process and an echo of the same bytes between two\n"
      "processes, nwcd's fixed cost (stats), throughput with 1/4/16 clients (synchronous and 8\n"
      "pipelined requests in flight each).  --cpu N runs all of it on CPU N (where two vCPUs are\n"
      "hyperthreads of one core, what runs on the sibling slows a matvec by up to 3x).\n";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(usage, stdout), 0;
    if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--nwcd") && i + 1 < argc) nwcd = argv[++i];
    else if (!strcmp(argv[i], "--rows") && i + 1 < argc) want_rows = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--cols") && i + 1 < argc) want_cols = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--turn") && i + 1 < argc) turn = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--cpu") && i + 1 < argc) cpu = atoi(argv[++i]);
    else if (!file) file = argv[i];
    else return fprintf(stderr, "nwc-bench daemon: unexpected '%s'\n", argv[i]), 2;
  }
  if (!file) return fputs(usage, stderr), 2;
  if (cpu >= 0) { /* this process and what it starts (nwcd, the echo, the clients) on one CPU */
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) < 0)
      return fprintf(stderr, "nwc-bench daemon: --cpu %d: %s\n", cpu, strerror(errno)), 2;
  }
  nwc_st_file *st;
  if (nwc_st_open(file, &st) < 0) return fprintf(stderr, "nwc-bench daemon: cannot read %s\n", file), 1;
  const nwc_st_tensor *best = NULL;
  uint64_t M = 0, K = 0;
  double bestd = 1e300;
  for (size_t i = 0; i < st->count; i++) {
    uint64_t r, c;
    nwc_st_matrix_shape(&st->tensors[i], &r, &c);
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
  pid_t pid = nwc_bench_nwcd_start(nwcd, store, sock, "cpu", NULL); /* what in-process runs */
  nwc_client *c = NULL;
  int rc = nwc_client_connect(sock, &c);
  if (rc == 0) rc = nwc_client_import(c, "bench", file, NULL, NULL);
  if (rc < 0) {
    fprintf(stderr, "nwc-bench daemon: %s\n", nwc_client_last_error());
    nwc_bench_nwcd_stop(pid);
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
  nwc_client_load(c, "bench", best->name, NULL, NULL, NULL);
  /* The echo floor moves the matvec's own request and reply bytes. */
  nwc_proto_req mreq = {.op = NWC_OP_MATVEC, .ncols = 1, .scale = 1.0f, .x_bytes = K * 4,
                        .x = (const uint8_t *)x};
  snprintf(mreq.model, sizeof mreq.model, "bench");
  snprintf(mreq.tensor, sizeof mreq.tensor, "%s", best->name);
  nwc_pw pw;
  nwc_pw_init(&pw);
  size_t req_bytes = (size_t)nwc_proto_req_encode(&mreq, &pw);
  nwc_pw_free(&pw);
  size_t rep_bytes = NWC_PROTO_HEADER + 28 + M * 4; /* header, compute record, y */
  pid_t echo_pid = -1;
  int efd = echo_start(req_bytes, rep_bytes, &echo_pid);
  uint8_t *ebuf = calloc(1, req_bytes > rep_bytes ? req_bytes : rep_bytes);
  if (turn < 1) return fputs("nwc-bench daemon: --turn must be at least 1\n", stderr), 2;
  nwc_client *cs = NULL; /* the "sleep" path: a connection that never polls */
  if (nwc_client_connect(sock, &cs) < 0 || nwc_client_set_spin(cs, 0) < 0) {
    fprintf(stderr, "nwc-bench daemon: %s\n", nwc_client_last_error());
    nwc_bench_nwcd_stop(pid);
    return 1;
  }
  /* Round trips: per op, its paths in turns of `turn` calls. */
  /* Two passes, so that the connections do not take turns (nwcd treats a connection whose
   * requests follow another's within 2 ms as concurrent: no loop-thread compute, no ALONE flag):
   * in-process, echo and socket interleaved, then in-process and sleep (the echo comes before the
   * socket: right after a polling client, the echo process would wake on the other vCPU). */
  enum { INPROC, SOCKET, ECHO, INPROC_S, SLEEP, NPATH };
  static const int passes[2][3] = {{INPROC, ECHO, SOCKET}, {INPROC_S, SLEEP, -1}};
  size_t iters = (size_t)(seconds * 2000) + 100;
  double *tv[NPATH];
  for (int p = 0; p < NPATH; p++) tv[p] = malloc((iters + turn) * sizeof **tv);
  static const char *ops[2] = {"matvec", "dequant"};
  static const char *paths[NPATH] = {"inproc", "socket", "echo", "inproc_sleep_pass", "sleep"};
  for (int op = 0; op < 2; op++) {
    size_t n = (op == 0 ? iters : iters / 8 + 20) / turn * turn;
    if (n < turn) n = turn; /* at least one timed turn (tv holds iters + turn) */
    double cpu_s[NPATH] = {0};
    for (int pass = 0; pass < 2; pass++) {
      for (size_t i0 = 0; i0 < n + turn; i0 += turn) { /* the first turn warms up */
        for (int k = 0; k < 3 && passes[pass][k] >= 0; k++) {
          int path = passes[pass][k];
          bool inproc = path == INPROC || path == INPROC_S;
          if (path == ECHO && op != 0) continue;
          double c0 = inproc ? nwc_bench_thread_cpu() : proc_cpu(pid);
          for (size_t i = i0; i < i0 + turn; i++) {
            nwc_client *cc = path == SOCKET ? c : cs;
            double t0 = nwc_bench_now();
            int crc = 0;
            if (inproc && op == 0) crc = nwc_matvec(&t, x, NULL, y, NULL);
            else if (inproc) crc = nwc_dequant(&t, deq);
            else if (path == ECHO)
              echo_once(efd, ebuf, req_bytes, rep_bytes);
            else if (op == 0)
              crc = nwc_client_matvec(cc, "bench", best->name, NULL, 1.0f, x, K, 1, 0, y, M * 4,
                                      NULL);
            else
              crc = nwc_client_dequant(cc, "bench", best->name, NWC_CLIENT_BF16, deq2, M * K * 2,
                                       NULL, NULL, NULL);
            if (crc < 0) { /* a failed call is not a round trip: timing it would report nonsense */
              fprintf(stderr, "nwc-bench daemon: %s %s of %s failed: %s\n", paths[path], ops[op],
                      best->name, inproc ? nwc_error_detail() : nwc_client_last_error());
              nwc_bench_nwcd_stop(pid);
              return 1;
            }
            if (i >= turn) tv[path][i - turn] = nwc_bench_now() - t0;
          }
          double c1 = inproc ? nwc_bench_thread_cpu() : proc_cpu(pid);
          if (i0 >= turn) cpu_s[path] += c1 - c0;
        }
      }
    }
    double p50[NPATH], p99[NPATH];
    for (int path = 0; path < NPATH; path++) {
      if (path == ECHO && op != 0) continue;
      pct(tv[path], n, &p50[path], &p99[path]);
      printf("{\"bench\":\"roundtrip\",\"op\":\"%s\",\"path\":\"%s\",\"rows\":%llu,\"cols\":%llu,"
             "\"p50_us\":%.2f,\"p99_us\":%.2f,\"n\":%zu", ops[op], paths[path],
             (unsigned long long)M, (unsigned long long)K, p50[path], p99[path], n);
      if (path != ECHO) printf(",\"cpu_us\":%.2f", cpu_s[path] * 1e6 / (double)n);
      printf("}\n");
    }
    printf("{\"bench\":\"overhead\",\"op\":\"%s\",\"turn\":%zu,\"p50_us\":%.2f,\"p99_us\":%.2f,"
           "\"sleep_p50_us\":%.2f,\"sleep_p99_us\":%.2f,", ops[op], turn, p50[SOCKET] - p50[INPROC],
           p99[SOCKET] - p99[INPROC], p50[SLEEP] - p50[INPROC_S], p99[SLEEP] - p99[INPROC_S]);
    if (op == 0) printf("\"floor_p50_us\":%.2f,\"floor_p99_us\":%.2f,", p50[ECHO], p99[ECHO]);
    printf("\"target_p50_us\":20,\"target_p99_us\":100}\n");
    fflush(stdout);
  }
  nwc_client_free(cs);
  /* nwcd's fixed cost per request: stats computes nothing. */
  for (size_t i = 0; i < iters + 10; i++) {
    nwc_client_counters sc;
    double t0 = nwc_bench_now();
    nwc_client_stats(c, &sc);
    if (i >= 10) tv[0][i - 10] = nwc_bench_now() - t0;
  }
  double s50, s99;
  pct(tv[0], iters, &s50, &s99);
  printf("{\"bench\":\"roundtrip\",\"op\":\"stats\",\"path\":\"socket\",\"p50_us\":%.2f,"
         "\"p99_us\":%.2f,\"n\":%zu}\n", s50, s99, iters);
  fflush(stdout);
  if (efd >= 0) close(efd), waitpid(echo_pid, NULL, 0);
  free(ebuf);
  /* Throughput with 1, 4, 16 client processes, synchronous and pipelined. */
  static const int clients[3] = {1, 4, 16};
  static const unsigned depths[2] = {0, 8};
  for (int ci = 0; ci < 3; ci++) {
    for (int di = 0; di < 2; di++) {
      int pfd[2];
      if (pipe(pfd) < 0) break;
      pid_t kids[16];
      for (int k = 0; k < clients[ci]; k++) {
        if ((kids[k] = fork()) == 0) {
          uint64_t count = client_matvecs(sock, best->name, x, K, M, depths[di], seconds);
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
      printf("{\"bench\":\"throughput\",\"clients\":%d,\"mode\":\"%s\",\"depth\":%u,"
             "\"matvec_per_s\":%.0f,\"batched_passes_total\":%llu}\n", clients[ci],
             depths[di] ? "pipelined" : "sync", depths[di] ? depths[di] : 1,
             (double)total / seconds, (unsigned long long)s.batched_passes);
      fflush(stdout);
    }
  }
  nwc_client_free(c);
  nwc_bench_nwcd_stop(pid);
  nwc_bench_remove_dir(dir);
  nwc_tensor_release(&t);
  free(w), free(x), free(y), free(deq), free(deq2);
  for (int p = 0; p < NPATH; p++) free(tv[p]);
  nwc_st_close(st);
  return 0;
}
