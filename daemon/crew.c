/*
 * crew.c - the lanes of one model load end together: a lane that loads a large blob
 * offers it (nwcd_crew_offer) and reads it from the front, claiming each read before it starts
 * (nwcd_split_claim, called by loader.c); a lane that has no tensor left to take helps
 * (nwcd_crew_help): it takes the last part of the offer with the most left, from the back, and
 * loads it with the offer's part function (into the same device copy or host memory, through
 * the helper's own ring or straight into a reused spare: backend_cpu.c), until no offer has a
 * part to spare.  The offering lane withdraws its offer when its own reads are done
 * (nwcd_crew_withdraw): it waits for the parts helpers took, loads itself any part a helper
 * could not (whatever the helper's reason: its own ring or io_uring may be what failed; the
 * owner's error, which names a bad chunk, is then the load's), and counts the helpers' bytes,
 * O_DIRECT bytes and the wait in its load.
 *
 * Why: a model's tensors go to the lanes whole, largest first, so the lanes end unevenly, and
 * the load lasts as long as its slowest lane: a model with one large embedding loaded warm
 * with the embedding's lane alone for most of it, and over twice as fast with the crew
 * (docs/results.md: lanes that run out of tensors help).
 *
 * A part is whole chunks (the checksums' unit: each part is checked on its own; it starts on
 * a chunk, rounded up), at most the crew's part size and at most half of what the owner has not
 * claimed yet, so that the owner still has as much to read as the helper and does not wait for
 * it to start.  Parts get smaller toward the end of a blob, down to one chunk, so that the
 * lanes end close together (docs/results.md: crew parts shrink toward a tensor's end).
 * One lock (the crew's) guards every offer's front (claimed by the owner) and back (taken by
 * helpers); front <= back always, and [0, front) and [back, length) never overlap, so every
 * byte is loaded exactly once.
 */
#include "crew.h"

#include "clock.h"

#include "nwc_error.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct range {
  uint64_t off, len;
} range;

struct nwcd_split {
  nwcd_crew *crew;
  nwcd_split *next;            /* the crew's open offers */
  uint64_t align;              /* parts start at multiples of it */
  uint64_t front, back;        /* the owner claimed [0, front), helpers took [back, the blob's
                                  length) */
  uint64_t taken;              /* bytes helpers took */
  uint64_t direct;             /* of them, read with O_DIRECT */
  unsigned out;                /* parts that helpers are loading */
  range *failed;               /* parts helpers could not load: the owner loads them */
  size_t nfailed, cap;
  int lost;                    /* such a part's error when there was no memory to give it
                                  back, its detail in msg */
  char msg[512];
  nwcd_part_fn fn;
  void *ctx;
};

struct nwcd_crew {
  pthread_mutex_t lock;
  pthread_cond_t done; /* a helper's part ended */
  nwcd_split *open;
  uint64_t part;
  uint64_t parts, bytes; /* what helpers took, for the load's log */
};

static _Thread_local nwcd_crew *tl_crew;

nwcd_crew *nwcd_crew_new(uint64_t part) {
  nwcd_crew *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->done, NULL);
  c->part = part;
  return c;
}

void nwcd_crew_free(nwcd_crew *c) {
  if (!c) return;
  pthread_cond_destroy(&c->done);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

void nwcd_crew_join(nwcd_crew *c) { tl_crew = c; }

nwcd_crew *nwcd_crew_joined(void) { return tl_crew; }

void nwcd_crew_taken(const nwcd_crew *c, uint64_t *parts, uint64_t *bytes) {
  *parts = c->parts, *bytes = c->bytes;
}

nwcd_split *nwcd_crew_offer(nwcd_crew *c, uint64_t length, uint64_t align, nwcd_part_fn fn,
                            void *ctx) {
  if (!c || !align || c->part < align || length < 3 * c->part) return NULL; /* nothing to spare */
  nwcd_split *s = calloc(1, sizeof *s);
  if (!s) return NULL; /* the owner loads it all */
  s->crew = c, s->back = length, s->align = align, s->fn = fn, s->ctx = ctx;
  pthread_mutex_lock(&c->lock);
  s->next = c->open, c->open = s;
  pthread_mutex_unlock(&c->lock);
  return s;
}

uint64_t nwcd_split_claim(nwcd_split *s, uint64_t from, uint64_t len) {
  nwcd_crew *c = s->crew;
  pthread_mutex_lock(&c->lock);
  uint64_t granted = from >= s->back ? 0 : len < s->back - from ? len : s->back - from;
  if (from + granted > s->front) s->front = from + granted;
  pthread_mutex_unlock(&c->lock);
  return granted;
}

/* The start of the part a helper may take from s now, or s->back when none (c->lock held): the
 * crew's part size while the owner has two of them unclaimed, then half of what it has left, so
 * that the last bytes of the load are shared too; a chunk at least, and the owner keeps one. */
static uint64_t spare_part(const nwcd_crew *c, const nwcd_split *s) {
  uint64_t half = (s->back - s->front) / 2, part = half < c->part ? half : c->part;
  return part < s->align ? s->back : (s->back - part + s->align - 1) / s->align * s->align;
}

int nwcd_crew_withdraw(nwcd_split *s, int rc, nwcd_load_info *li) {
  nwcd_crew *c = s->crew;
  uint64_t t0 = nwcd_now_ns();
  pthread_mutex_lock(&c->lock);
  for (nwcd_split **p = &c->open; *p; p = &(*p)->next)
    if (*p == s) {
      *p = s->next;
      break;
    }
  while (s->out) pthread_cond_wait(&c->done, &c->lock);
  pthread_mutex_unlock(&c->lock);
  if (rc == 0 && s->front < s->back)
    rc = nwc__fail(-EIO, "bytes %llu to %llu of the blob were left to no lane",
                   (unsigned long long)s->front, (unsigned long long)s->back);
  if (rc == 0 && s->lost < 0) rc = nwc__fail(s->lost, "%s", s->msg);
  for (size_t i = 0; rc == 0 && i < s->nfailed; i++) { /* its error is the load's */
    nwcd_load_info pl = {0};
    rc = s->fn(s->ctx, s->failed[i].off, s->failed[i].len, &pl);
    s->direct += pl.direct_bytes;
  }
  if (li && rc == 0) { /* the load's: the helpers' parts and the wait for them too */
    li->bytes += s->taken, li->direct_bytes += s->direct;
    li->direct = li->direct_bytes > 0;
    li->micros += (nwcd_now_ns() - t0) / 1000;
  }
  free(s->failed), free(s);
  return rc;
}

/* Gives a part a helper could not load back to its owner (c->lock held); false without memory
 * to record it (the helper's error then stays, in lost). */
static bool give_back(nwcd_split *s, uint64_t off, uint64_t len) {
  if (s->nfailed == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 4;
    range *a = realloc(s->failed, cap * sizeof *a);
    if (!a) return false;
    s->failed = a, s->cap = cap;
  }
  s->failed[s->nfailed++] = (range){off, len};
  return true;
}

void nwcd_crew_help(nwcd_crew *c, nwcd_load_info *sum) {
  pthread_mutex_lock(&c->lock);
  for (;;) {
    nwcd_split *best = NULL;
    for (nwcd_split *s = c->open; s; s = s->next)
      if (spare_part(c, s) < s->back &&
          (!best || s->back - s->front > best->back - best->front))
        best = s;
    if (!best) break;
    uint64_t from = spare_part(c, best), len = best->back - from;
    best->back = from, best->out++, best->taken += len;
    c->parts++, c->bytes += len;
    pthread_mutex_unlock(&c->lock);
    nwcd_load_info li = {0};
    int rc = best->fn(best->ctx, from, len, &li);
    if (sum) nwcd_load_info_add(sum, &li);
    pthread_mutex_lock(&c->lock);
    if (rc == 0) {
      best->direct += li.direct_bytes;
    } else if (!give_back(best, from, len) && !best->lost) {
      best->lost = rc;
      snprintf(best->msg, sizeof best->msg, "%s", nwc_error_detail());
    }
    best->out--;
    pthread_cond_broadcast(&c->done);
  }
  pthread_mutex_unlock(&c->lock);
}
