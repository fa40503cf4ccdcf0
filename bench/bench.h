/*
 * bench.h - what the nwc-bench subcommands share: a monotonic clock, repeat-until-long-enough
 * timing, and loading a safetensors tensor as a BF16 matrix.
 */
#ifndef NWC_BENCH_H
#define NWC_BENCH_H

#include "nwc.h"
#include "safetensors.h"

#include <stdint.h>
#include <sys/types.h>

double nwc_bench_now(void);
/* CPU seconds of the calling thread so far. */
double nwc_bench_thread_cpu(void);

/* Runs fn(arg) until at least min_seconds have passed (and at least 3 times); returns the median
 * seconds per call of 3 such rounds.  A negative return from fn aborts and is returned. */
double nwc_bench_time(int (*fn)(void *), void *arg, double min_seconds);
/* qsort's comparison of two doubles, ascending. */
int nwc_bench_cmp_double(const void *a, const void *b);
/* The median of t[0..n) (t[n / 2] after sorting t in place). */
double nwc_bench_median(double *t, size_t n);


/* Starts the nwcd binary at path on store (created if missing) listening on sock, with
 * --backend backend (NULL: nwcd's default) and log, a log flag (--verbose) whose output goes to
 * this process's stderr (NULL: --quiet, stderr discarded), and waits (up to 10 s: a CUDA
 * backend's start) until sock accepts connections: its pid (-1 if fork failed).  The caller
 * stops it (nwc_bench_nwcd_stop).  bench_nwcd.c. */
pid_t nwc_bench_nwcd_start(const char *nwcd, const char *store, const char *sock,
                           const char *backend, const char *log);
/* n normal BF16 weights (sigma 0.02) into w from a xorshift generator seeded with seed (the
 * same seed, the same weights).  bench_weights.c. */
void nwc_bench_normal_bf16(uint16_t *w, uint64_t n, uint64_t seed);
/* Flushes stdout and stops what nwc_bench_nwcd_start started (SIGTERM, waits for it, SIGKILL
 * after 30 s); nothing more for a pid <= 0. */
void nwc_bench_nwcd_stop(pid_t pid);
/* Removes the directory dir and everything below it (a benchmark's temporary store), saying on
 * stderr when it could not.  bench_nwcd.c. */
void nwc_bench_remove_dir(const char *dir);

/* Subcommands: each parses its own arguments (argv[0] is the subcommand) and returns an exit code. */
int nwc_bench_codec(int argc, char **argv);
int nwc_bench_import(int argc, char **argv); /* bench_import.c */
int nwc_bench_daemon(int argc, char **argv); /* bench_daemon.c */
int nwc_bench_load(int argc, char **argv);   /* bench_load.c */
int nwc_bench_map(int argc, char **argv);    /* bench_map.c */
int nwc_bench_soak(int argc, char **argv);   /* bench_soak.c */
int nwc_bench_gpu_daemon(int argc, char **argv); /* bench_gpu_daemon.c (CUDA builds) */
/* bench_gpu_load.c (CUDA builds): the warm GPU load of model's blobs in store_dir (no daemon may
 * hold the store) taken apart: stages alone, then the loader in the configurations specs names
 * (default set if nspecs is 0), R rounds each; 0 or a negative errno.  _spec: 0 if spec parses. */
int nwc_bench_gpu_load(const char *store_dir, const char *model, unsigned R,
                       const char *const *specs, size_t nspecs);
int nwc_bench_gpu_load_spec(const char *spec);

#endif
