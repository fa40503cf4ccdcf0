/*
 * bench_util.c - the clocks, medians and repeat-until-long-enough timer the nwc-bench subcommands
 * share (bench.h), apart from the command's dispatcher (nwc_bench.c) so that the subcommands do
 * not call back into it.
 */
#include "bench.h"

#include <stdlib.h>
#include <time.h>

double nwc_bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double nwc_bench_thread_cpu(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int nwc_bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double nwc_bench_median(double *t, size_t n) {
  qsort(t, n, sizeof *t, nwc_bench_cmp_double);
  return t[n / 2];
}

double nwc_bench_time(int (*fn)(void *), void *arg, double min_seconds) {
  double round_time[3];
  for (int k = 0; k < 3; k++) {
    int n = 0;
    double t0 = nwc_bench_now(), t;
    do {
      int rc = fn(arg);
      if (rc < 0) return rc;
      n++;
      t = nwc_bench_now() - t0;
    } while (t < min_seconds / 3 || n < 1);
    round_time[k] = t / n;
  }
  return nwc_bench_median(round_time, 3);
}
