/*
 * bench_soak.c - nwc-bench soak: nwcd under a long mixed load, watched for what grows.  Starts
 * nwcd (CPU backend) on a temporary store with a host budget below the model's size, imports
 * FILE, then runs N client threads (a connection each) for T seconds of random requests:
 * dequants (checked bit for bit against FILE), gathers, matvecs, listings, loads and evictions,
 * while one more thread imports FILE under a second name and removes it again.  Every second it
 * prints a JSON line with nwcd's VmRSS, its open descriptors and the p50/p99 latency of the
 * listings of that second; at the end a summary: RSS and descriptors after warm-up (the first
 * quarter) against the end, the RSS slope after warm-up (least-squares fits of the samples
 * against time, requests and imports: kB/s, kB per 1000 requests, kB per import; flat is 0
 * within the noise), wrong replies (must be 0), and the p99 of a listing under load against its
 * idle p99 (target: within 10 times).
 *
 *   nwc-bench soak FILE.safetensors [--clients N] [--seconds T] [--budget SIZE] [--nwcd PATH]
 */
#include "bench.h"

#include "nwc_client.h"
#include "nwc_proc.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct soak {
  const char *sock;
  const nwc_st_file *st;
  const nwc_st_tensor *t[256]; /* the BF16 tensors of FILE */
  size_t nt;
  atomic_int stop;
  atomic_long requests, errors, wrong, imports;
  pthread_mutex_t lock; /* ls latencies of the current second */
  double lat[65536];
  size_t nlat;
} soak;

static long proc_fds(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  DIR *d = opendir(path);
  long n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
  if (d) closedir(d);
  return d ? n : -1;
}

/* One listing, timed into the current second's latencies. */
static int timed_ls(soak *s, nwc_client *c) {
  double t0 = nwc_bench_now();
  nwc_client_model *m = NULL;
  size_t n = 0;
  int rc = nwc_client_models(c, &m, &n);
  free(m);
  double dt = nwc_bench_now() - t0;
  pthread_mutex_lock(&s->lock);
  if (s->nlat < sizeof s->lat / sizeof s->lat[0]) s->lat[s->nlat++] = dt;
  pthread_mutex_unlock(&s->lock);
  return rc;
}

static void *client(void *arg) {
  soak *s = arg;
  nwc_client *c;
  if (nwc_client_connect(s->sock, &c) < 0) return NULL;
  unsigned seed = (unsigned)(uintptr_t)&c ^ (unsigned)getpid();
  float *x = NULL, *y = NULL;
  uint16_t *b = NULL;
  while (!atomic_load(&s->stop)) {
    const nwc_st_tensor *t = s->t[rand_r(&seed) % s->nt];
    uint64_t M, K;
    nwc_st_matrix_shape(t, &M, &K);
    int op = rand_r(&seed) % 100, rc = 0;
    if (op < 50) { /* dequant, checked */
      b = realloc(b, M * K * 2);
      rc = nwc_client_dequant(c, "m", t->name, NWC_CLIENT_BF16, b, M * K * 2, NULL, NULL, NULL);
      if (rc == 0 && memcmp(b, nwc_st_data(s->st, t), M * K * 2)) atomic_fetch_add(&s->wrong, 1);
    } else if (op < 70) {
      x = realloc(x, K * 4), y = realloc(y, M * 4);
      for (uint64_t k = 0; k < K; k++) x[k] = (float)((k * 7) % 13) / 13.0f;
      rc = nwc_client_matvec(c, "m", t->name, NULL, 1.0f, x, K, 1, 0, y, M * 4, NULL);
    } else if (op < 80) {
      uint64_t row = (uint64_t)rand_r(&seed) % M;
      b = realloc(b, K * 2);
      rc = nwc_client_gather(c, "m", t->name, &row, 1, NWC_CLIENT_BF16, b, K * 2, NULL, NULL);
      if (rc == 0 && memcmp(b, (const uint8_t *)nwc_st_data(s->st, t) + row * K * 2, K * 2))
        atomic_fetch_add(&s->wrong, 1);
    } else if (op < 95) {
      rc = timed_ls(s, c);
    } else if (op < 98) {
      rc = nwc_client_load(c, "m", t->name, NULL, NULL, NULL);
      if (rc == -ENOSPC || rc == -EBUSY) rc = 0; /* over the budget, or in use: expected */
    } else {
      rc = nwc_client_evict(c, "m", t->name, NULL);
      if (rc == -EBUSY || rc == -ENOENT) rc = 0;
    }
    atomic_fetch_add(&s->requests, 1);
    if (rc < 0) atomic_fetch_add(&s->errors, 1);
  }
  free(x), free(y), free(b);
  nwc_client_free(c);
  return NULL;
}

static void *importer(void *arg) {
  soak *s = arg;
  nwc_client *c;
  if (nwc_client_connect(s->sock, &c) < 0) return NULL;
  const char *file = getenv("NWC_SOAK_FILE");
  while (!atomic_load(&s->stop)) {
    if (nwc_client_import(c, "m2", file, NULL, NULL) < 0) atomic_fetch_add(&s->errors, 1);
    if (nwc_client_remove(c, "m2") < 0) atomic_fetch_add(&s->errors, 1);
    atomic_fetch_add(&s->requests, 2);
    atomic_fetch_add(&s->imports, 1);
    usleep(200000);
  }
  nwc_client_free(c);
  return NULL;
}

/* The least-squares slope of y over x (n points); 0 with fewer than 2 or no spread in x. */
static double slope(const double *x, const double *y, size_t n) {
  double mx = 0, my = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < n; i++) mx += x[i], my += y[i];
  if (n < 2) return 0;
  mx /= (double)n, my /= (double)n;
  for (size_t i = 0; i < n; i++) sxx += (x[i] - mx) * (x[i] - mx), sxy += (x[i] - mx) * (y[i] - my);
  return sxx > 0 ? sxy / sxx : 0;
}

/* p-quantile of the latencies gathered (sorted in place), in microseconds; -1 without any. */
static double take_quantile(soak *s, double p, int clear) {
  pthread_mutex_lock(&s->lock);
  double v = -1;
  if (s->nlat) {
    qsort(s->lat, s->nlat, sizeof s->lat[0], nwc_bench_cmp_double);
    v = s->lat[(size_t)(p * (double)(s->nlat - 1))] * 1e6;
  }
  if (clear) s->nlat = 0;
  pthread_mutex_unlock(&s->lock);
  return v;
}

int nwc_bench_soak(int argc, char **argv) {
  const char *file = NULL, *nwcd = NWCD_PATH, *budget = NULL;
  unsigned clients = 8;
  double seconds = 60;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--clients") && i + 1 < argc) clients = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--budget") && i + 1 < argc) budget = argv[++i];
    else if (!strcmp(argv[i], "--nwcd") && i + 1 < argc) nwcd = argv[++i];
    else if (argv[i][0] != '-' && !file) file = argv[i];
    else {
      fprintf(stderr, "usage: nwc-bench soak FILE.safetensors [--clients N] [--seconds T] "
                      "[--budget SIZE] [--nwcd PATH]\n");
      return 2;
    }
  }
  static soak s;
  nwc_st_file *st = NULL;
  if (!file || nwc_st_open(file, &st) < 0 || clients < 1 || clients > 256 || seconds <= 0)
    return fprintf(stderr, "nwc-bench soak: need a readable FILE, 1..256 clients, T > 0\n"), 2;
  s.st = st;
  uint64_t total = 0;
  for (size_t i = 0; i < st->count && s.nt < 256; i++)
    if (!strcmp(st->tensors[i].dtype, "BF16")) {
      s.t[s.nt++] = &st->tensors[i];
      total += st->tensors[i].end - st->tensors[i].begin;
    }
  if (!s.nt) return fprintf(stderr, "nwc-bench soak: no BF16 tensor in %s\n", file), 1;
  char dir[] = "/tmp/nwc-bench-soak-XXXXXX", store[64], sock[64], conf[64], bud[32];
  if (!mkdtemp(dir)) return 1;
  snprintf(store, sizeof store, "%s/store", dir), snprintf(sock, sizeof sock, "%s/s", dir);
  snprintf(conf, sizeof conf, "%s/nwcd.conf", dir);
  snprintf(bud, sizeof bud, "%llu", (unsigned long long)(total * 0.6 / 2)); /* ~ 60% of blobs */
  FILE *cf = fopen(conf, "w");
  if (cf) fprintf(cf, "[memory]\nhost_budget = %s\n", budget ? budget : bud), fclose(cf);
  setenv("NWCD_CONFIG", conf, 1);
  setenv("NWC_SOAK_FILE", file, 1);
  pid_t pid = nwc_bench_nwcd_start(nwcd, store, sock, "cpu", NULL);
  s.sock = sock;
  pthread_mutex_init(&s.lock, NULL);
  nwc_client *c = NULL;
  int rc = pid > 0 ? nwc_client_connect(sock, &c) : -1;
  if (rc == 0) rc = nwc_client_import(c, "m", file, NULL, NULL);
  if (rc < 0) {
    fprintf(stderr, "nwc-bench soak: %s\n", nwc_client_last_error());
    nwc_bench_nwcd_stop(pid);
    return 1;
  }
  for (int i = 0; i < 2000; i++) timed_ls(&s, c); /* idle latency */
  double idle50 = take_quantile(&s, 0.5, 0), idle99 = take_quantile(&s, 0.99, 1);
  pthread_t th[257];
  for (unsigned i = 0; i < clients; i++) pthread_create(&th[i], NULL, client, &s);
  pthread_create(&th[clients], NULL, importer, &s);
  long rss0 = -1, fd0 = -1, rss = 0, fds = 0;
  double worst99 = 0, t0 = nwc_bench_now();
  size_t cap = (size_t)seconds + 2, nw = 0; /* samples after warm-up: time, requests, imports */
  double *ws = malloc(cap * sizeof *ws), *wr = malloc(cap * sizeof *wr),
         *wi = malloc(cap * sizeof *wi), *wk = malloc(cap * sizeof *wk);
  if (!ws || !wr || !wi || !wk) return fprintf(stderr, "nwc-bench soak: out of memory\n"), 1;
  for (int sec = 1; nwc_bench_now() - t0 < seconds; sec++) {
    usleep(1000000);
    rss = nwc__proc_status_kb(pid, "VmRSS"), fds = proc_fds(pid);
    double p50 = take_quantile(&s, 0.5, 0), p99 = take_quantile(&s, 0.99, 1);
    if (sec >= seconds / 4 && rss0 < 0) rss0 = rss, fd0 = fds; /* after warm-up */
    if (rss0 >= 0 && p99 > worst99) worst99 = p99;
    if (rss0 >= 0 && nw < cap && rss > 0) {
      ws[nw] = nwc_bench_now() - t0, wr[nw] = (double)atomic_load(&s.requests);
      wi[nw] = (double)atomic_load(&s.imports), wk[nw++] = (double)rss;
    }
    printf("{\"bench\":\"soak\",\"second\":%d,\"rss_kb\":%ld,\"fds\":%ld,\"ls_p50_us\":%.0f,"
           "\"ls_p99_us\":%.0f,\"requests\":%ld,\"errors\":%ld,\"wrong\":%ld}\n",
           sec, rss, fds, p50, p99, atomic_load(&s.requests), atomic_load(&s.errors),
           atomic_load(&s.wrong));
  }
  atomic_store(&s.stop, 1);
  for (unsigned i = 0; i <= clients; i++) pthread_join(th[i], NULL);
  printf("{\"bench\":\"soak_summary\",\"clients\":%u,\"seconds\":%.0f,\"budget\":\"%s\","
         "\"rss_kb_warm\":%ld,\"rss_kb_end\":%ld,\"fds_warm\":%ld,\"fds_end\":%ld,"
         "\"requests\":%ld,\"errors\":%ld,\"wrong\":%ld,\"ls_idle_p50_us\":%.0f,"
         "\"ls_idle_p99_us\":%.0f,\"ls_load_worst_p99_us\":%.0f,\"p99_over_idle\":%.1f,"
         "\"imports\":%ld,\"rss_slope_kb_per_s\":%.1f,\"rss_slope_kb_per_1k_requests\":%.2f,"
         "\"rss_slope_kb_per_import\":%.1f}\n",
         clients, seconds, budget ? budget : bud, rss0, rss, fd0, fds,
         atomic_load(&s.requests), atomic_load(&s.errors), atomic_load(&s.wrong), idle50,
         idle99, worst99, idle99 > 0 ? worst99 / idle99 : 0, atomic_load(&s.imports),
         slope(ws, wk, nw), 1000 * slope(wr, wk, nw), slope(wi, wk, nw));
  free(ws), free(wr), free(wi), free(wk);
  nwc_client_free(c);
  nwc_bench_nwcd_stop(pid);
  nwc_st_close(st);
  nwc_bench_remove_dir(dir);
  return atomic_load(&s.wrong) ? 1 : 0;
}
