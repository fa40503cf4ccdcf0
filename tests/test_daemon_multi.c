/*
 * test_daemon_multi.c - many client processes on one nwcd at once.
 *
 *   test_daemon_multi            8 client processes (fork + exec of this program as "child")
 *                                for a bounded time, each doing a random mix of matvec (1 to 8
 *                                columns), gather, dequant, load, evict and ls on the sample
 *                                model; every reply is checked against the original weights
 *                                (BF16 bits for dequant and gather, an fp64 matvec for matvec).
 *   test_daemon_multi --budget   the same under a 2 MiB budget, smaller than the model (9.4 MiB)
 *                                and than its largest tensor: loads evict in LRU order while
 *                                requests run, nothing is freed under a request, the largest
 *                                tensor is computed on the mapped container (reported so), and
 *                                every reply is still right; explicit loads that cannot fit get
 *                                ENOSPC with a clear message.
 *   ... --cuda                   either of them with --backend cuda (exit 77 without a GPU): the
 *                                same checks (matvec within the kernels' 1e-5 of fp64), every
 *                                resident tensor on cuda:0 in ps, and in budget mode a 2 MiB
 *                                --gpu-budget, so that the device evicts and the largest tensor
 *                                runs on the CPU over the mapped container.  With two GPUs or
 *                                more the children's loads name cuda:0 or cuda:1 at random, so
 *                                that tensors live on both (replicas of one tensor on each,
 *                                requests naming no place computing on either), ps shows them on
 *                                those two only, and the parent checks each device's resident
 *                                bytes against its own budget (devices).
 * The parent checks that the daemon counted batched passes / evictions and still serves.
 */
#include "test_daemon_util.h"

#include "nwc_client.h"

#ifdef NWC_TEST_CUDA
#include <cuda_runtime.h>
#endif

#define NCHILD 8

static int budget_mode, cuda_mode, two_gpus;

static int child(const char *sock, double seconds) {
  nwc_client *c;
  if (nwc_client_connect(sock, &c) < 0) {
    fprintf(stderr, "child %d: connect: %s\n", (int)getpid(), nwc_client_last_error());
    return 1;
  }
  size_t big[2] = {0, 0}, nbig = 0;
  for (size_t i = 0; i < td_nt && nbig < 2; i++)
    if (td_t[i].rows >= 512 && td_t[i].cols >= 512) big[nbig++] = i;
  double t_end = (double)time(NULL) + seconds;
  unsigned long ops[7] = {0}, mapped = 0, batched = 0, nospc = 0, busy = 0;
  while ((double)time(NULL) < t_end && test_failures < 5) {
    int op = (int)test_below(10);
    const td_tensor *t = &td_t[test_below(td_nt)];
    int rc;
    unsigned rf = 0;
    if (op <= 3) { /* matvec, often on the same big tensors so passes are shared */
      if (op <= 2 && nbig) t = &td_t[big[test_below(nbig)]];
      if (t->rows < 2) t = &td_t[big[0]];
      unsigned ncols = test_below(3) ? 1 : 1 + (unsigned)test_below(8);
      float *x = malloc(ncols * t->cols * 4), *y = malloc(ncols * t->rows * 4);
      for (size_t k = 0; k < ncols * t->cols; k++) x[k] = (float)(test_uniform() * 2 - 1);
      rc = nwc_client_matvec(c, "use", t->name, NULL, 1.0f, x, t->cols, ncols, 0, y,
                             ncols * t->rows * 4, &rf);
      CHECK(rc == 0, "matvec %s: %s", t->name, nwc_client_last_error());
      for (unsigned col = 0; rc == 0 && col < ncols; col++) {
        double e = td_matvec_err(t, x + col * t->cols, 1.0, NULL, y + col * t->rows);
        CHECK(e <= 1e-5, "matvec %s col %u/%u: error %.3g", t->name, col, ncols, e);
      }
      free(x), free(y);
      ops[0]++;
    } else if (op == 4) {
      size_t n = t->rows * t->cols;
      uint16_t *b = malloc(n * 2);
      rc = nwc_client_dequant(c, "use", t->name, NWC_CLIENT_BF16, b, n * 2, NULL, NULL, &rf);
      CHECK(rc == 0 && !memcmp(b, t->w, n * 2), "dequant %s: %d %s", t->name, rc,
            rc ? nwc_client_last_error() : "bytes differ");
      free(b);
      ops[1]++;
    } else if (op == 5) {
      uint64_t idx[16];
      size_t n = 1 + test_below(16);
      for (size_t k = 0; k < n; k++) idx[k] = test_below(t->rows);
      float *f = malloc(n * t->cols * 4);
      rc = nwc_client_gather(c, "use", t->name, idx, n, 0, f, n * t->cols * 4, NULL, &rf);
      CHECK(rc == 0, "gather %s: %s", t->name, nwc_client_last_error());
      for (size_t k = 0; rc == 0 && k < n; k++)
        for (uint64_t j = 0; j < t->cols; j++)
          if (f[k * t->cols + j] != nwc_bf16_to_f32(td_w(t, idx[k] * t->cols + j))) {
            CHECK(0, "gather %s row %llu col %llu", t->name, (unsigned long long)idx[k],
                  (unsigned long long)j);
            break;
          }
      free(f);
      ops[2]++;
    } else if (op == 6) { /* with two GPUs onto either of them */
      rc = two_gpus ? nwc_client_load_on(c, "use", t->name, (int)test_below(2), NULL, NULL, NULL)
                    : nwc_client_load(c, "use", t->name, NULL, NULL, NULL);
      if (rc == -ENOSPC) nospc++;
      CHECK(rc == 0 || (budget_mode && rc == -ENOSPC), "load %s: %d %s", t->name, rc,
            nwc_client_last_error());
      ops[3]++;
    } else if (op == 7) {
      rc = nwc_client_evict(c, "use", t->name, NULL);
      if (rc == -EBUSY) busy++;
      CHECK(rc == 0 || rc == -EBUSY, "evict %s: %d %s", t->name, rc, nwc_client_last_error());
      ops[4]++;
    } else if (op == 8 && cuda_mode) { /* everything resident lives on the GPU(s) */
      nwc_client_resident *p;
      size_t n;
      rc = nwc_client_ps(c, &p, &n);
      CHECK(rc == 0, "ps: %d", rc);
      for (size_t k = 0; rc == 0 && k < n; k++)
        CHECK(p[k].device == 0 || (two_gpus && p[k].device == 1), "ps: %s on device %d, not cuda:0%s",
              p[k].tensor, p[k].device, two_gpus ? " or cuda:1" : "");
      if (rc == 0) free(p);
      ops[6]++;
    } else {
      nwc_client_model *m;
      size_t n;
      rc = nwc_client_models(c, &m, &n);
      CHECK(rc == 0 && n == 1 && m[0].tensors == td_nt, "ls: %d", rc);
      if (rc == 0) free(m);
      ops[5]++;
    }
    mapped += !!(rf & NWC_CLIENT_MAPPED);
    batched += !!(rf & NWC_CLIENT_BATCHED);
  }
  printf("child %d: %lu matvec, %lu dequant, %lu gather, %lu load (%lu ENOSPC), %lu evict (%lu busy),"
         " %lu ls, %lu ps; %lu mapped, %lu batched\n",
         (int)getpid(), ops[0], ops[1], ops[2], ops[3], nospc, ops[4], busy, ops[5], ops[6], mapped,
         batched);
  nwc_client_free(c);
  return test_failures ? 1 : 0;
}

int main(int argc, char **argv) {
  int skip = td_open_sample();
  if (argc >= 5 && !strcmp(argv[1], "child")) {
    if (skip) return 1;
    budget_mode = atoi(argv[4]) & 1, cuda_mode = atoi(argv[4]) >> 1 & 1, two_gpus = atoi(argv[4]) >> 2 & 1;
    char seed[32];
    snprintf(seed, sizeof seed, "%s", argv[3]);
    setenv("NWC_SEED", seed, 1);
    test_seed("test_daemon_multi child");
    return child(argv[2], 4.0);
  }
  for (int i = 1; i < argc; i++) {
    budget_mode |= !strcmp(argv[i], "--budget");
    cuda_mode |= !strcmp(argv[i], "--cuda");
  }
  char name[64];
  snprintf(name, sizeof name, "test_daemon_multi%s%s", budget_mode ? " --budget" : "",
           cuda_mode ? " --cuda" : "");
  uint64_t seed = test_seed(name);
  if (skip) return skip;
  if (cuda_mode) {
#ifdef NWC_TEST_CUDA
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
      printf("SKIP: no CUDA device\n");
      return 77;
    }
    two_gpus = ndev >= 2;
    printf("%s: %d GPU%s%s\n", name, ndev, ndev == 1 ? "" : "s",
           two_gpus ? ": loads onto cuda:0 and cuda:1" : ": the steps on two GPUs are skipped");
#else
    printf("SKIP: built without CUDA\n");
    return 77;
#endif
    td_backend = "cuda";
  }
  if (td_mkdir("nwc-multi") < 0) return 1;
  const char *bud[] = {"--budget", "2M", NULL};
  const char *gbud[] = {"--gpu-budget", "2M", NULL};
  pid_t d = td_start_daemon(budget_mode ? (cuda_mode ? gbud : bud) : NULL);
  CHECK(d > 0, "nwcd did not start");
  if (d <= 0) return td_show_log(), 1;
  nwc_client *c;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  CHECK_RC(nwc_client_import(c, "use", getenv("NWC_SAMPLE"), NULL, NULL));
  if (budget_mode) {
    int rc = nwc_client_load(c, "use", NULL, NULL, NULL, NULL);
    CHECK(rc == -ENOSPC && strstr(nwc_client_last_error(), "budget"),
          "loading a model larger than the budget: %d %s", rc, nwc_client_last_error());
    printf("load use: %s\n", nwc_client_last_error());
  }
  pid_t kids[NCHILD];
  for (int i = 0; i < NCHILD; i++) {
    kids[i] = fork();
    if (kids[i] == 0) {
      char s[32], m[8];
      snprintf(s, sizeof s, "%llu", (unsigned long long)(seed + (uint64_t)i + 1));
      snprintf(m, sizeof m, "%d", budget_mode | cuda_mode << 1 | two_gpus << 2);
      execl("/proc/self/exe", argv[0], "child", td_sock, s, m, (char *)NULL);
      _exit(127);
    }
  }
  for (int i = 0; i < NCHILD; i++) {
    int st;
    waitpid(kids[i], &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d failed (status 0x%x)", i, st);
  }
  nwc_client_counters s;
  CHECK_RC(nwc_client_stats(c, &s));
  printf("daemon: %llu requests, %llu errors, %llu loads, %llu evictions, %llu mapped computes, "
         "%llu batched passes (%llu columns), resident %llu of budget %llu\n",
         (unsigned long long)s.requests, (unsigned long long)s.errors, (unsigned long long)s.loads,
         (unsigned long long)s.evictions, (unsigned long long)s.mapped_computes,
         (unsigned long long)s.batched_passes, (unsigned long long)s.batched_columns,
         (unsigned long long)s.resident_bytes, (unsigned long long)s.budget);
  if (cuda_mode)
    printf("daemon: backend %s, %llu bytes on the GPU of budget %llu\n", s.backend,
           (unsigned long long)s.gpu_resident_bytes, (unsigned long long)s.gpu_budget);
  CHECK(!strcmp(s.backend, cuda_mode ? "cuda" : "cpu"), "backend %s", s.backend);
  nwc_client_place *pl = NULL;
  size_t npl = 0;
  CHECK_RC(nwc_client_devices(c, &pl, &npl));
  for (size_t k = 0; k < npl; k++) { /* every place within its own budget (a GPU's is per device) */
    printf("daemon: %s: %llu bytes in %llu tensors of budget %llu\n", pl[k].name,
           (unsigned long long)pl[k].resident_bytes, (unsigned long long)pl[k].resident_tensors,
           (unsigned long long)pl[k].budget);
    CHECK(pl[k].resident_bytes <= pl[k].budget, "%s: resident %llu over its budget %llu", pl[k].name,
          (unsigned long long)pl[k].resident_bytes, (unsigned long long)pl[k].budget);
  }
  free(pl);
  if (budget_mode) {
    CHECK(s.resident_bytes <= s.budget, "resident %llu over budget", (unsigned long long)s.resident_bytes);
    CHECK(s.evictions > 0 && s.mapped_computes > 0, "budget mode: no evictions or no mapped computes");
  }
  nwc_client_free(c);
  CHECK(td_stop_daemon(d) == 0, "SIGTERM exit");
  if (test_failures) td_show_log();
  td_cleanup();
  return test_exit(name);
}
