/*
 * pool.c - nwcd's worker threads and their job queue.
 *
 * Design: one FIFO under a mutex and a condition variable; the loop thread submits, workers pop.
 * A submit signals only when a worker is idle, and after unlocking, so that the woken worker
 * does not block on the mutex the submitter still holds (one futex wake per request at most).
 * When a worker pops a job that the batching rule it was given (pool.h; the daemon's is
 * nwcd_ops_can_batch: matvecs on the same tensor, bias, scale and output, up to 8 columns in
 * all) lets take more, it also takes, from anywhere in the queue, the jobs the rule lets join,
 * chained on job->batch: concurrent matvecs of several clients on one tensor then cost one pass
 * over the compressed weights (nwc_matvec_batch).  Freeing the pool lets the workers finish the
 * queue, then joins them.
 *
 * Parallel regions (nwcd_pool_parallel): a job that is one big piece of work (dequant of a large
 * tensor) splits it into n parts; idle workers take parts before new jobs, and the calling worker
 * takes parts too, so the call finishes even when every other worker is busy (no deadlock).
 */
#include "pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

typedef struct region {
  struct region *next;
  void (*fn)(void *ctx, uint64_t i);
  void *ctx;
  uint64_t n, next_part, done;
  pthread_cond_t cond;
} region;

struct nwcd_pool {
  pthread_mutex_t lock;
  region *regions;
  pthread_cond_t cond;
  nwcd_job *head, *tail;
  bool stop;
  unsigned nthreads, idle; /* idle: workers waiting on cond */
  nwcd_run_fn run;
  nwcd_batch_fn batch; /* or NULL */
  pthread_t threads[];
};

static void *worker(void *arg) {
  nwcd_pool *p = arg;
  pthread_mutex_lock(&p->lock);
  for (;;) {
    while (!p->head && !p->stop && !p->regions) {
      p->idle++;
      pthread_cond_wait(&p->cond, &p->lock);
      p->idle--;
    }
    if (p->regions) { /* parts of a parallel region first */
      region *g = p->regions;
      uint64_t i = g->next_part++;
      if (g->next_part == g->n) p->regions = g->next; /* nothing left to hand out */
      pthread_mutex_unlock(&p->lock);
      g->fn(g->ctx, i);
      pthread_mutex_lock(&p->lock);
      if (++g->done == g->n) pthread_cond_signal(&g->cond);
      continue;
    }
    nwcd_job *j = p->head;
    if (!j) break;
    p->head = j->next;
    if (!p->head) p->tail = NULL;
    j->next = NULL;
    unsigned cols = j->req.ncols;
    if (p->batch && p->batch(j, cols, NULL)) {
      nwcd_job **link = &j->batch, *prev = NULL;
      for (nwcd_job *b = p->head, *next; b && p->batch(j, cols, NULL); b = next) {
        next = b->next;
        if (p->batch(j, cols, b)) {
          if (prev) prev->next = next;
          else p->head = next;
          if (p->tail == b) p->tail = prev;
          b->next = NULL;
          *link = b, link = &b->batch;
          cols += b->req.ncols;
        } else {
          prev = b;
        }
      }
    }
    pthread_mutex_unlock(&p->lock);
    p->run(j);
    pthread_mutex_lock(&p->lock);
  }
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

int nwcd_pool_create(unsigned threads, nwcd_run_fn run, nwcd_batch_fn batch, nwcd_pool **out) {
  nwcd_pool *p = calloc(1, sizeof *p + threads * sizeof(pthread_t));
  if (!p) return -ENOMEM;
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->cond, NULL);
  p->run = run, p->batch = batch;
  for (unsigned i = 0; i < threads; i++) {
    if (pthread_create(&p->threads[i], NULL, worker, p) != 0) {
      nwcd_pool_free(p);
      return -EAGAIN;
    }
    p->nthreads++;
  }
  *out = p;
  return 0;
}

void nwcd_pool_submit(nwcd_pool *p, nwcd_job *j) {
  j->next = NULL;
  pthread_mutex_lock(&p->lock);
  if (p->tail) p->tail->next = j;
  else p->head = j;
  p->tail = j;
  bool wake = p->idle > 0; /* a busy worker finds the job when it comes back for the next */
  pthread_mutex_unlock(&p->lock);
  if (wake) pthread_cond_signal(&p->cond); /* after unlocking: the woken worker gets the lock */
}

void nwcd_pool_run_here(nwcd_pool *p, nwcd_job *j) { p->run(j); }

void nwcd_pool_parallel(nwcd_pool *p, uint64_t n, void (*fn)(void *ctx, uint64_t i), void *ctx) {
  if (n == 0) return;
  if (!p || n == 1 || p->nthreads < 2) {
    for (uint64_t i = 0; i < n; i++) fn(ctx, i);
    return;
  }
  region g = {NULL, fn, ctx, n, 0, 0, PTHREAD_COND_INITIALIZER};
  pthread_mutex_lock(&p->lock);
  region **tail = &p->regions;
  while (*tail) tail = &(*tail)->next;
  *tail = &g;
  pthread_cond_broadcast(&p->cond);
  while (g.next_part < g.n) { /* take parts ourselves too */
    uint64_t i = g.next_part++;
    if (g.next_part == g.n) { /* unlink: nothing left to hand out */
      for (region **r = &p->regions; *r; r = &(*r)->next)
        if (*r == &g) {
          *r = g.next;
          break;
        }
    }
    pthread_mutex_unlock(&p->lock);
    fn(ctx, i);
    pthread_mutex_lock(&p->lock);
    g.done++;
  }
  while (g.done < g.n) pthread_cond_wait(&g.cond, &p->lock);
  pthread_mutex_unlock(&p->lock);
  pthread_cond_destroy(&g.cond);
}

void nwcd_pool_free(nwcd_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->lock);
  p->stop = true;
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
  for (unsigned i = 0; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
  pthread_cond_destroy(&p->cond);
  pthread_mutex_destroy(&p->lock);
  free(p);
}
