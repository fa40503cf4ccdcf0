/*
 * pool.h - nwcd's worker threads and their job queue (pool.c): jobs run in order of arrival;
 * the batching rule the pool is given lets it chain jobs that can share one pass (matvecs on one
 * tensor) onto the first of them; parallel regions split one job's work over idle workers.
 */
#ifndef NWCD_POOL_H
#define NWCD_POOL_H

#include "job.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct nwcd_pool nwcd_pool;

/* Runs one job (or a batch: the jobs chained on job->batch) on a worker. */
typedef void (*nwcd_run_fn)(nwcd_job *j);
/* The batching rule: with b NULL, whether the pass of job a, with cols columns so far, may take
 * more jobs; with b, whether the queued job b may join it.  The pool asks it when it pops a, for
 * each job queued behind a in order, and chains those that may onto a->batch. */
typedef bool (*nwcd_batch_fn)(const nwcd_job *a, unsigned cols, const nwcd_job *b);

/* threads workers that run jobs with run, batching by batch (NULL: no batching).  0 and *out,
 * -ENOMEM, or -EAGAIN when a thread cannot be made. */
int nwcd_pool_create(unsigned threads, nwcd_run_fn run, nwcd_batch_fn batch, nwcd_pool **out);
/* Queues a job (any thread). */
void nwcd_pool_submit(nwcd_pool *p, nwcd_job *j);
/* Runs j on the calling thread, unbatched, as a worker would (the loop thread's quick path). */
void nwcd_pool_run_here(nwcd_pool *p, nwcd_job *j);
/* Runs fn(ctx, i) for i in [0, n) on the calling thread and idle workers; returns when all are
 * done.  Call from a worker (or any thread); fn must not fail (record errors in ctx). */
void nwcd_pool_parallel(nwcd_pool *p, uint64_t n, void (*fn)(void *ctx, uint64_t i), void *ctx);
/* Stops the workers after the queue is empty, joins them, frees the pool (NULL: a no-op). */
void nwcd_pool_free(nwcd_pool *p);

#endif
