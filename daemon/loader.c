/*
 * loader.c - the one module of nwcd that owns io_uring: it streams a tensor blob out of its
 * container file in chunk-aligned reads, checks each 1 MiB chunk's XXH3 checksum as it lands
 * (nwc_store_chunk_check), and puts the bytes either
 *   - straight into destination memory (nwcd_load, zero copy: memory populated before, such as
 *     the pages of a spare host copy that backend_cpu.c reuses), or
 *   - into the slots of a ring of pinned, io_uring-registered buffers handed to a sink
 *     (nwcd_ring_load: the GPU path, where the sink starts a cudaMemcpyAsync out of each slot
 *     and gives the slot back once the copy's event has completed), or
 *   - into a file through such a ring, each checked slot written with pwrite(2) (nwcd_load_fd:
 *     host residency, into a fresh memfd).  Writing a memfd makes its pages in the kernel, whole
 *     pages that need no zeroing, with no page fault and no mmap lock, so lanes on several cores
 *     make pages in parallel; faulting a fresh mapping in page by page, as the loads did before,
 *     zeroed every page first and serialized the lanes on the process's mmap lock.  The ring is
 *     the calling thread's (made at its first such load, like its engine), small enough that its
 *     slots stay in the cache between the read, the check and the write.
 * A ring's sink may also take each checked slot to several destinations, so that a blob wanted in
 * several places is read once (load_places: loader_cuda.c copies the slot to each device and
 * writes it into the host copy with nwcd_slot_to_host, the same write as nwcd_load_fd's).
 *
 * Engines: an engine is one io_uring (64 entries).  Host loads use the calling thread's engine,
 * made at the thread's first load and kept until the thread exits (a pthread key frees it), so
 * a worker sets up io_uring once, not per tensor.  A ring has its own engine, because its
 * buffers are registered with that io_uring; one load at a time uses a ring (its mutex).
 *
 * How each read goes (mode NWCD_LOAD_AUTO): the blob's file range is mapped (never touched) and
 * mincore() says whether a read's first, middle and last pages are in the page cache:
 *   cached  -> a buffered read with IOSQE_ASYNC, so that io_uring's workers copy out of the page
 *              cache in parallel instead of the submitting thread copying inline; or, in a hot
 *              load (nwcd_load_opts.hot: the GPU's, in as many lanes as cores), one such read at
 *              a time without IOSQE_ASYNC, which the loading thread copies inside
 *              io_uring_enter and checks at once, while the bytes are in its own cache (a
 *              worker's copy leaves them in another core's: checking them there ran at under 5
 *              GB/s per thread on the H200 host, against over 60 for bytes in a core's L2);
 *              with nwcd_load_opts.piece, such a read is copied that many bytes at a time and
 *              each piece's chunks checked as it lands, so that a ring slot larger than a
 *              core's L2 (4 MiB, for fewer and larger copies to the GPU) is still checked hot;
 *   not     -> an O_DIRECT read (no double caching of what nwcd keeps resident), many at once.
 * O_DIRECT refused at open (EINVAL: tmpfs on old kernels, ramfs, some FUSE) or by a read
 * (EINVAL: file systems that accept the flag and refuse the I/O) sends the reads buffered for
 * the rest of the load; a short O_DIRECT read whose rest is not page aligned finishes buffered.
 * Blobs of at most 4 MiB are read buffered with no probe and no IOSQE_ASYNC: the reads are
 * submitted inline, so a cached one is copied at once by the submitting thread (for them the
 * second descriptor, the mapping and the hand-offs to workers cost more than they save: measured
 * in CPU time on the sample model, whose tensors are 4 KiB to 3 MiB) and an uncached one goes
 * to io_uring's workers, still several in flight; what they leave in the page cache is small,
 * and the bytes of a large model are in larger tensors, which take the path above.
 * NWCD_LOAD_DIRECT skips the probe; NWCD_LOAD_BUFFERED uses no O_DIRECT at all.  A packed blob
 * (docs/store.md: one of the small blobs that share pages, its offset or length not a multiple of
 * 4096) is read buffered in every mode, exactly its bytes: O_DIRECT could only read whole pages,
 * its neighbours' bytes with it, and it is smaller than NWC_STORE_PACK_MAX.  A load with
 * nwcd_load_opts.split (an offer to a crew of lanes, crew.c) claims each read before it starts
 * and ends where the crew's helpers took the rest of the blob over.
 *
 * States of one read (up to depth of them in flight, 32 by default, 1-4 MiB each):
 *
 *   FREE ──(next range of the blob; a ring slot if a ring load)──► IN FLIGHT
 *   IN FLIGHT ──short read, or a hot piece (its chunks checked)──► IN FLIGHT (the rest)
 *   IN FLIGHT ──EINVAL from O_DIRECT──► IN FLIGHT (resubmitted buffered)
 *   IN FLIGHT ──all bytes──► chunks checked ──► (ring: slot to the sink) ──► FREE, progress
 *   IN FLIGHT ──error, 0 bytes (file ends early)──► FREE, the load FAILS
 *
 * Checks: the reads that one wait for completions returned are checked together, chunk by chunk,
 * by the submitting thread and (on machines of 8 cores and more: one per 8, at most 3) helper
 * threads of the engine, so that one thread's hashing does not cap a warm load; the submitter
 * waits for the batch, then hands slots on and reports.  A mismatch is recorded in its read and
 * checked again by the submitter, whose thread-local detail then names the chunk.
 *
 * Once the load has failed nothing new is submitted; what is in flight is reaped (and ring slots
 * taken back) before returning.  Invariants: an O_DIRECT read is of a blob whose offset and length
 * are multiples of 4096 (the store's large blobs; packed ones are read buffered) into a
 * 4096-aligned destination, so every O_DIRECT read is legal; a
 * chunk is checked only after all of its bytes arrived; progress counts checked bytes only, so
 * it is monotonic and ends at the blob's length; nwcd_load and nwcd_ring_load return only with
 * no read in flight and, for a ring, every slot back from the sink, except that a queued ring
 * load (nwcd_load_opts.queued) that succeeded leaves the slots whose sink work is still running
 * with the sink: the ring's next load reclaims them as it needs slots, so that the sink's work
 * on one blob's last slots (the GPU's copies) runs on while the next blob is read.
 */
#include "loader.h"

#include "clock.h"
#include "crew.h"

#include "nwc_error.h"

#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifdef __SANITIZE_THREAD__
#include <sanitizer/tsan_interface.h> /* __tsan_acquire, __tsan_release: the rings' order below */
#endif

#define ENTRIES 64u           /* io_uring entries = the most reads in flight */
#define DEPTH_DEFAULT 32u
#define READ_MAX (4u << 20)   /* default largest read, and the default ring slot */
#define RING_DEFAULT (256u << 20)
#define RING_SLOTS_MAX 1024u  /* registered buffers (UIO_MAXIOV) */
#define PAGE 4096u
#define SMALL_BLOB (4u << 20) /* read buffered, submitted inline, no probe (auto mode) */
#define CHECKERS_MAX 4u
#define FD_RING (8u << 20)    /* a thread's staging ring for nwcd_load_fd, in slots of: */
#define FD_SLOT (1u << 20)

struct load;

/* Threads that check chunks with the submitting thread: each batch of completed reads is split
 * over them chunk by chunk (fork and join: the submitter takes part and waits for the rest). */
typedef struct team team;
typedef struct helper {
  team *t;
  unsigned id;
  pthread_t th;
} helper;

struct team {
  helper h[CHECKERS_MAX - 1];
  unsigned n;    /* helpers running */
  unsigned want; /* of them, how many check the current batch (ids below it) */
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  uint64_t gen;       /* batches started */
  unsigned busy;      /* helpers still on the current batch */
  bool stop;
  struct load *batch; /* the load whose ready reads are being checked */
};

typedef struct engine {
  struct io_uring uring;
  bool broken; /* io_uring_enter failed in a way that left the queue unusable */
  team tm;
} engine;

struct nwcd_ring {
  pthread_mutex_t lock; /* held for the length of one load */
  engine eng;
  uint8_t *mem;
  uint64_t slot_size;
  unsigned nslots, nfree;
  unsigned *free_slots;
  bool fixed; /* mem is registered with eng (one buffer per slot) */
};

enum { VIA_DIRECT, VIA_CACHE };

typedef struct rd {
  uint64_t off;                /* blob offset of the read's first byte */
  uint32_t len, done, checked; /* bytes asked, arrived, and checked (whole chunks) already */
  uint8_t *dst;       /* where byte 0 of the read lands */
  int slot;           /* ring slot, -1 for a host load */
  uint8_t via;
  bool busy;
  _Atomic uint64_t bad; /* the first chunk that failed its check, or UINT64_MAX */
} rd;

typedef struct load {
  const nwc_tensor_info *ti;
  engine *eng;
  uint8_t *dst;            /* host load */
  nwcd_ring *ring;         /* ring load */
  const nwcd_sink *sink;
  int fd_direct, fd_cache; /* -1 where not open */
  bool direct_refused;     /* a read got EINVAL from O_DIRECT */
  bool async;              /* more than one read: page-cache reads go to io_uring's workers */
  bool hot;                /* nwcd_load_opts.hot: page-cache reads one at a time, inline */
  bool queued;             /* nwcd_load_opts.queued: the sink may keep slots at the end */
  uint64_t piece;          /* nwcd_load_opts.piece: a hot read's bytes copied at a time */
  uint8_t *map;            /* the blob's file range mapped for mincore, or NULL */
  unsigned mode, depth, inflight, nfree;
  nwcd_split *split;       /* nwcd_load_opts.split: reads claimed from it */
  uint64_t start, end;     /* the bytes to load: nwcd_load_opts.from and .to; end moves down
                              to where a split's helpers took over */
  uint64_t span;           /* end - start as asked: the total that progress reports */
  uint64_t cs, read_size, next, checked, direct_bytes;
  uint64_t wait_ns, check_ns, sink_ns, drain_ns; /* nwcd_load_info's */
  nwcd_progress_fn progress;
  void *ctx;
  int err;
  unsigned checkers;             /* threads checking chunks, this one included */
  unsigned nready;               /* reads whose bytes are all in, to check */
  rd *ready[ENTRIES];
  uint64_t ready_start[ENTRIES + 1]; /* their chunks, numbered in a row */
  atomic_uint_fast64_t next_chunk;   /* of those, the next to check */
  unsigned free_rd[ENTRIES];
  rd rds[ENTRIES];
} load;

static _Thread_local nwcd_progress_fn tl_observer;
static _Thread_local void *tl_observer_ctx;
static _Thread_local engine *tl_engine;
static pthread_key_t tl_engine_key;
static pthread_once_t tl_engine_once = PTHREAD_ONCE_INIT;
static _Thread_local nwcd_ring *tl_ring; /* nwcd_load_fd's staging ring */
static pthread_key_t tl_ring_key;
static pthread_once_t tl_ring_once = PTHREAD_ONCE_INIT;

void nwcd_load_observe(nwcd_progress_fn fn, void *ctx) {
  tl_observer = fn;
  tl_observer_ctx = ctx;
}

/* ---- checking chunks ---------------------------------------------------------------------- */

/* Checks chunk c of the blob, which lies in r's bytes; a mismatch is recorded in r (the
 * submitting thread names it afterwards: the detail is thread-local). */
static void check_chunk(struct load *L, rd *r, uint64_t c) {
  if (nwc_store_chunk_check(L->ti, c, r->dst + (c * L->cs - r->off)) == 0) return;
  uint64_t was = atomic_load(&r->bad);
  while (c < was && !atomic_compare_exchange_weak(&r->bad, &was, c)) {}
}

/* Checks the ready reads' chunks that no thread has taken yet. */
static void check_chunks(struct load *L) {
  uint64_t total = L->ready_start[L->nready];
  unsigned k = 0;
  for (uint64_t i; (i = atomic_fetch_add(&L->next_chunk, 1)) < total;) {
    while (L->ready_start[k + 1] <= i) k++;
    rd *r = L->ready[k];
    uint64_t c = (r->off + r->checked) / L->cs + (i - L->ready_start[k]);
    check_chunk(L, r, c);
  }
}

static void *helper_main(void *arg) {
  helper *h = arg;
  team *t = h->t;
  uint64_t seen = 0;
  pthread_mutex_lock(&t->mu);
  for (;;) {
    while (!t->stop && t->gen == seen) pthread_cond_wait(&t->go, &t->mu);
    if (t->stop) break;
    seen = t->gen;
    bool mine = h->id < t->want;
    pthread_mutex_unlock(&t->mu);
    if (mine) check_chunks(t->batch);
    pthread_mutex_lock(&t->mu);
    if (--t->busy == 0) pthread_cond_signal(&t->done);
  }
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

/* Grows the team to n helpers (as many as can be started). */
static void team_grow(team *t, unsigned n) {
  if (!t->n && n) {
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->go, NULL);
    pthread_cond_init(&t->done, NULL);
  }
  while (t->n < n) {
    t->h[t->n] = (helper){t, t->n, 0};
    if (pthread_create(&t->h[t->n].th, NULL, helper_main, &t->h[t->n])) break;
    t->n++;
  }
}

static void team_stop(team *t) {
  if (!t->n) return;
  pthread_mutex_lock(&t->mu);
  t->stop = true;
  pthread_cond_broadcast(&t->go);
  pthread_mutex_unlock(&t->mu);
  for (unsigned i = 0; i < t->n; i++) pthread_join(t->h[i].th, NULL);
  pthread_cond_destroy(&t->go);
  pthread_cond_destroy(&t->done);
  pthread_mutex_destroy(&t->mu);
  t->n = 0;
}

/* Checks every chunk of the ready reads, on the team when there are two chunks per checker. */
static void check_ready(struct load *L) {
  L->ready_start[0] = 0;
  for (unsigned k = 0; k < L->nready; k++) {
    rd *r = L->ready[k];
    L->ready_start[k + 1] = L->ready_start[k] + (r->len - r->checked + L->cs - 1) / L->cs;
  }
  atomic_store(&L->next_chunk, 0);
  team *t = &L->eng->tm;
  bool share = L->checkers > 1 && L->ready_start[L->nready] >= 2 * L->checkers; /* worth a wake */
  if (share) team_grow(t, L->checkers - 1);
  if (!share || !t->n) {
    check_chunks(L);
    return;
  }
  pthread_mutex_lock(&t->mu);
  t->batch = L, t->busy = t->n, t->gen++;
  t->want = L->checkers - 1; /* helpers beyond it (grown by an earlier load) sit this one out */
  pthread_cond_broadcast(&t->go);
  pthread_mutex_unlock(&t->mu);
  check_chunks(L);
  pthread_mutex_lock(&t->mu);
  while (t->busy) pthread_cond_wait(&t->done, &t->mu);
  pthread_mutex_unlock(&t->mu);
}

/* ---- engines ------------------------------------------------------------------------------ */

/* liburing maps and unmaps a ring's memory by its own system calls, which ThreadSanitizer does
 * not see: a ring made where one that another thread had closed lay looked like memory the two
 * threads shared without synchronization (test_loader under TSan).  The kernel orders the unmap
 * before the map; under TSan every ring's end releases (before its unmap) and every ring's start
 * acquires (after its map) one address, so that TSan knows it too. */
#ifdef __SANITIZE_THREAD__
static char rings_order;
#define RINGS_RELEASE() __tsan_release(&rings_order)
#define RINGS_ACQUIRE() __tsan_acquire(&rings_order)
#else
#define RINGS_RELEASE() ((void)0)
#define RINGS_ACQUIRE() ((void)0)
#endif

static int engine_init(engine *e) {
  e->broken = false;
  int rc = io_uring_queue_init(ENTRIES, &e->uring, 0);
  NWC_RETURN_IF(rc < 0, rc, "io_uring_queue_init: %s", strerror(-rc));
  RINGS_ACQUIRE();
  return 0;
}

/* The engine's ring closed (engine_init may make a new one); the release comes first, so that it
 * precedes the unmap that lets another thread's ring take the address. */
static void engine_ring_exit(engine *e) {
  RINGS_RELEASE();
  io_uring_queue_exit(&e->uring);
}

static void engine_close(engine *e) {
  team_stop(&e->tm);
  engine_ring_exit(e);
}

static void engine_free(void *p) {
  engine_close(p);
  free(p);
}

static void make_engine_key(void) { pthread_key_create(&tl_engine_key, engine_free); }

/* The calling thread's engine, made at its first use. */
static int thread_engine(engine **out) {
  if (!tl_engine) {
    pthread_once(&tl_engine_once, make_engine_key);
    engine *e = calloc(1, sizeof *e);
    if (!e) return nwc__fail(-ENOMEM, "no memory for an io_uring");
    int rc = engine_init(e);
    if (rc < 0) {
      free(e);
      return rc;
    }
    pthread_setspecific(tl_engine_key, e);
    tl_engine = e;
  }
  *out = tl_engine;
  return 0;
}

/* ---- one load ----------------------------------------------------------------------------- */

static void report(load *L) {
  if (L->progress) L->progress(L->ctx, L->checked, L->span);
  if (tl_observer) tl_observer(tl_observer_ctx, L->checked, L->span);
}

static bool page_cached(const load *L, uint64_t off) {
  unsigned char v = 0;
  return mincore(L->map + off, PAGE, &v) == 0 && (v & 1);
}

static uint8_t choose_via(const load *L, uint64_t off, uint64_t len) {
  if (L->fd_direct < 0 || L->direct_refused) return VIA_CACHE;
  if (!L->map) return VIA_DIRECT;
  uint64_t last = off + len - PAGE, mid = off + (len / 2 / PAGE) * PAGE;
  return page_cached(L, off) && page_cached(L, mid) && page_cached(L, last) ? VIA_CACHE
                                                                             : VIA_DIRECT;
}

static void prep(load *L, rd *r) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(&L->eng->uring); /* never NULL: depth <= ENTRIES */
  int fd = r->via == VIA_DIRECT ? L->fd_direct : L->fd_cache;
  uint8_t *p = r->dst + r->done;
  unsigned n = r->len - r->done;
  if (L->piece && r->via == VIA_CACHE && n > L->piece) n = (unsigned)L->piece; /* hot */
  uint64_t fo = L->ti->offset + r->off + r->done;
  if (r->slot >= 0 && L->ring->fixed) io_uring_prep_read_fixed(sqe, fd, p, n, fo, r->slot);
  else io_uring_prep_read(sqe, fd, p, n, fo);
  if (r->via == VIA_CACHE && L->async) sqe->flags |= IOSQE_ASYNC;
  io_uring_sqe_set_data64(sqe, (uint64_t)(r - L->rds));
  L->inflight++;
}

static void fail(load *L, int err) {
  if (!L->err) L->err = err;
}

/* Returns a read (and a ring slot it still holds) to the free lists. */
static void drop(load *L, rd *r) {
  if (r->slot >= 0) L->ring->free_slots[L->ring->nfree++] = (unsigned)r->slot;
  r->busy = false;
  L->free_rd[L->nfree++] = (unsigned)(r - L->rds);
}

static void start_reads(load *L) {
  while (!L->err && L->next < L->end && L->nfree && (!L->ring || L->ring->nfree)) {
    uint64_t left = L->end - L->next;
    uint32_t len = (uint32_t)(left < L->read_size ? left : L->read_size);
    uint8_t via = choose_via(L, L->next, len);
    if (L->hot && via == VIA_CACHE && L->inflight) break; /* one at a time, checked while hot */
    if (L->split) {
      uint64_t mine = nwcd_split_claim(L->split, L->next, len);
      if (mine < len) L->end = L->next + mine; /* helpers have the rest */
      if (!mine) break;
      len = (uint32_t)mine;
    }
    int slot = -1;
    uint8_t *dst = L->dst + L->next;
    if (L->ring) {
      slot = (int)L->ring->free_slots[--L->ring->nfree];
      dst = L->ring->mem + (uint64_t)slot * L->ring->slot_size;
    }
    rd *r = &L->rds[L->free_rd[--L->nfree]];
    *r = (rd){.off = L->next, .len = len, .dst = dst, .slot = slot, .via = via, .busy = true};
    atomic_store(&r->bad, UINT64_MAX);
    prep(L, r);
    L->next += r->len;
  }
}

/* r's chunks were checked: names a bad one, or hands a ring slot to the sink, and reports. */
static void finish(load *L, rd *r) {
  uint64_t bad = atomic_load(&r->bad);
  if (bad != UINT64_MAX) { /* checked again here, for the detail naming it */
    int rc = nwc_store_chunk_check(L->ti, bad, r->dst + (bad * L->cs - r->off));
    fail(L, rc < 0 ? rc : nwc__fail(-EIO, "chunk %llu checked differently twice",
                                    (unsigned long long)bad));
    drop(L, r);
    return;
  }
  if (L->err) {
    drop(L, r);
    return;
  }
  if (L->ring) {
    nwcd_slot s = {(unsigned)r->slot, r->dst, r->off, r->len};
    int rc = L->sink->consume(L->sink->ctx, L->ring, &s);
    if (rc < 0) {
      fail(L, rc);
      drop(L, r);
      return;
    }
    r->slot = -1; /* the sink's now */
  }
  L->checked += r->len;
  drop(L, r);
  report(L);
}

/* A hot read's whole chunks that arrived since the last piece, checked at once, while the
 * thread that copied them still has them in its cache. */
static void check_piece(load *L, rd *r) {
  uint64_t t = nwcd_now_ns();
  uint32_t upto = (uint32_t)(r->done / L->cs * L->cs);
  for (; r->checked < upto; r->checked += (uint32_t)L->cs)
    check_chunk(L, r, (r->off + r->checked) / L->cs);
  L->check_ns += nwcd_now_ns() - t;
}

static void complete(load *L, rd *r, int res) {
  L->inflight--;
  const nwc_tensor_info *ti = L->ti;
  uint64_t fo = ti->offset + r->off + r->done;
  if (L->err) {
    drop(L, r);
  } else if (res == -EINTR) {
    prep(L, r);
  } else if (res == -EINVAL && r->via == VIA_DIRECT) {
    L->direct_refused = true; /* the file system takes the flag but not the reads */
    r->via = VIA_CACHE;
    prep(L, r);
  } else if (res < 0) {
    fail(L, nwc__fail(res, "%s: model '%s' tensor '%s': read at file offset %llu: %s", ti->path,
                      ti->model, ti->name, (unsigned long long)fo, strerror(-res)));
    drop(L, r);
  } else if (res == 0) {
    fail(L, nwc__fail(-EIO, "%s: model '%s' tensor '%s': the file ends at offset %llu, inside "
                      "the blob (offset %llu, %llu bytes)", ti->path, ti->model, ti->name,
                      (unsigned long long)fo, (unsigned long long)ti->offset,
                      (unsigned long long)ti->length));
    drop(L, r);
  } else {
    if (r->via == VIA_DIRECT) L->direct_bytes += (uint64_t)res;
    r->done += (uint32_t)res;
    if (r->done < r->len) { /* a piece of a hot read, or a short read: ask for the rest */
      if (L->piece && r->via == VIA_CACHE) check_piece(L, r);
      if (r->done % PAGE) r->via = VIA_CACHE;
      prep(L, r);
    } else {
      L->ready[L->nready++] = r; /* checked with the others of this batch */
    }
  }
}

/* The sink's reclaim; on its failure every slot not under a read is the ring's again. */
static void reclaim(load *L, bool wait) {
  uint64_t t = nwcd_now_ns();
  int rc = L->sink->reclaim(L->sink->ctx, L->ring, wait);
  *(wait ? &L->drain_ns : &L->sink_ns) += nwcd_now_ns() - t;
  if (rc >= 0) return;
  fail(L, rc);
  nwcd_ring *g = L->ring;
  bool held[RING_SLOTS_MAX] = {false};
  for (unsigned i = 0; i < ENTRIES; i++)
    if (L->rds[i].busy && L->rds[i].slot >= 0) held[L->rds[i].slot] = true;
  g->nfree = 0;
  for (unsigned s = 0; s < g->nslots; s++)
    if (!held[s]) g->free_slots[g->nfree++] = s;
}

/* io_uring_enter failed for good: reaps what was submitted, drops what was not. */
static void abandon(load *L, int rc) {
  fail(L, nwc__fail(rc, "io_uring_enter: %s", strerror(-rc)));
  L->eng->broken = true;
  unsigned unsent = io_uring_sq_ready(&L->eng->uring);
  while (L->inflight > unsent) {
    struct io_uring_cqe *cqe;
    int w = io_uring_wait_cqe(&L->eng->uring, &cqe);
    if (w == -EINTR) continue;
    if (w < 0) break;
    complete(L, &L->rds[cqe->user_data], cqe->res);
    io_uring_cqe_seen(&L->eng->uring, cqe);
  }
  for (unsigned i = 0; i < ENTRIES; i++)
    if (L->rds[i].busy) drop(L, &L->rds[i]);
  L->inflight = 0;
}

static void run(load *L) {
  struct io_uring *u = &L->eng->uring;
  for (;;) {
    if (L->ring) reclaim(L, false);
    start_reads(L);
    if (!L->inflight) {
      if (L->err || L->next >= L->end || !L->ring) break;
      unsigned before = L->ring->nfree; /* every slot is with the sink */
      reclaim(L, true);
      if (!L->err && L->ring->nfree == before)
        fail(L, nwc__fail(-EIO, "the ring's sink gave no slot back"));
      continue;
    }
    uint64_t t = nwcd_now_ns();
    int rc = io_uring_submit_and_wait(u, 1);
    L->wait_ns += nwcd_now_ns() - t;
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      abandon(L, rc);
      break;
    }
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(u, head, cqe) {
      seen++;
      complete(L, &L->rds[cqe->user_data], cqe->res);
    }
    io_uring_cq_advance(u, seen);
    t = nwcd_now_ns();
    check_ready(L);
    uint64_t t1 = nwcd_now_ns();
    for (unsigned k = 0; k < L->nready; k++) finish(L, L->ready[k]);
    L->nready = 0;
    L->check_ns += t1 - t, L->sink_ns += nwcd_now_ns() - t1;
  }
  if (!L->ring || (L->queued && !L->err)) return;
  while (L->ring->nfree < L->ring->nslots) { /* the sink's work on its slots finishes */
    unsigned before = L->ring->nfree;
    reclaim(L, true);
    if (L->ring->nfree == before) {
      fail(L, nwc__fail(-EIO, "the ring's sink gave no slot back"));
      reclaim(L, false);
      break;
    }
  }
}

static int load_open(load *L, const nwc_tensor_info *ti, const nwcd_load_opts *o, engine *e) {
  static const nwcd_load_opts defaults = {0};
  if (!o) o = &defaults;
  memset(L, 0, sizeof *L);
  L->ti = ti, L->eng = e, L->mode = o->mode, L->progress = o->progress, L->ctx = o->ctx;
  L->split = o->split, L->start = L->next = o->from, L->end = o->to ? o->to : ti->length;
  L->span = L->end - L->start;
  L->fd_direct = L->fd_cache = -1;
  L->cs = ti->chunk_size; /* the catalog's: never 0, a multiple of 4096 */
  L->depth = o->depth ? o->depth : DEPTH_DEFAULT;
  static atomic_uint auto_checkers;
  if (!atomic_load(&auto_checkers)) { /* one more checker per 8 cores: a core hashes 20-60 GB/s */
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned c = 1 + (unsigned)(n > 0 ? n / 8 : 0);
    atomic_store(&auto_checkers, c < CHECKERS_MAX ? c : CHECKERS_MAX);
  }
  L->checkers = o->checkers ? o->checkers : atomic_load(&auto_checkers);
  NWC_RETURN_IF(!ti->length || ti->length % NWC_STORE_PACK_ALIGN ||
                    ti->offset % NWC_STORE_PACK_ALIGN || !L->cs || L->cs % PAGE ||
                    ti->nchunks != (ti->length + L->cs - 1) / L->cs,
                -EINVAL, "%s/%s: blob at %llu, %llu bytes: not 64-aligned or not in 4096-aligned "
                "chunks", ti->model, ti->name, (unsigned long long)ti->offset,
                (unsigned long long)ti->length);
  NWC_RETURN_IF(L->depth > ENTRIES || o->mode > NWCD_LOAD_BUFFERED || L->checkers > CHECKERS_MAX ||
                    (o->read_size && (o->read_size % L->cs || o->read_size > UINT32_MAX)) ||
                    o->piece % L->cs || o->piece > UINT32_MAX || (o->piece && !o->hot) ||
                    L->next % L->cs || L->next >= L->end || L->end > ti->length ||
                    (L->end < ti->length && L->end % L->cs),
                -EINVAL, "load options: depth %u (1..%u), mode %u, read size %llu and piece %llu "
                "(chunks; a piece for hot loads only), checkers %u (1..%u), bytes %llu to %llu "
                "(chunks of the blob)", L->depth, ENTRIES, o->mode,
                (unsigned long long)o->read_size, (unsigned long long)o->piece, L->checkers,
                CHECKERS_MAX, (unsigned long long)L->next, (unsigned long long)L->end);
  bool packed = (ti->offset | ti->length) % PAGE != 0; /* read buffered, whatever the mode */
  bool small = packed || (o->mode != NWCD_LOAD_DIRECT && ti->length <= SMALL_BLOB);
  if (o->read_size) {
    L->read_size = o->read_size;
  } else { /* at least 8 reads over the blob, 1 chunk to 4 MiB each */
    uint64_t r = (ti->length / 8 + L->cs - 1) / L->cs * L->cs;
    L->read_size = r < L->cs ? L->cs : r > READ_MAX ? (READ_MAX / L->cs) * L->cs : r;
    if (!L->read_size) L->read_size = L->cs;
  }
  L->hot = o->hot, L->piece = o->piece, L->queued = o->queued;
  L->async = !small && !L->hot && ti->length > L->read_size;
  for (unsigned i = 0; i < L->depth; i++) L->free_rd[L->nfree++] = L->depth - 1 - i;
  if (!packed && (o->mode == NWCD_LOAD_DIRECT || (o->mode == NWCD_LOAD_AUTO && !small))) {
    L->fd_direct = open(ti->path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    NWC_RETURN_IF(L->fd_direct < 0 && errno != EINVAL, -errno, "%s: model '%s' tensor '%s': %s",
                  ti->path, ti->model, ti->name, strerror(errno));
  }
  L->fd_cache = open(ti->path, O_RDONLY | O_CLOEXEC);
  NWC_RETURN_IF(L->fd_cache < 0, -errno, "%s: model '%s' tensor '%s': %s", ti->path, ti->model,
                ti->name, strerror(errno));
  if (o->mode == NWCD_LOAD_AUTO && L->fd_direct >= 0) {
    void *m = mmap(NULL, ti->length, PROT_READ, MAP_SHARED, L->fd_cache, (off_t)ti->offset);
    L->map = m == MAP_FAILED ? NULL : m; /* without it every read goes O_DIRECT */
  }
  return 0;
}

static void load_close(load *L, nwcd_load_info *li, uint64_t t0) {
  if (L->map) munmap(L->map, L->ti->length);
  if (L->fd_direct >= 0) close(L->fd_direct);
  if (L->fd_cache >= 0) close(L->fd_cache);
  if (li) {
    li->bytes = L->end - L->start;
    li->direct_bytes = L->direct_bytes;
    li->direct = L->direct_bytes > 0;
    li->micros = (nwcd_now_ns() - t0) / 1000u;
    li->wait_ns = L->wait_ns, li->check_ns = L->check_ns;
    li->sink_ns = L->sink_ns, li->drain_ns = L->drain_ns;
  }
}

int nwcd_load(const nwc_tensor_info *ti, void *buf, const nwcd_load_opts *o, nwcd_load_info *li) {
  uint64_t t0 = nwcd_now_ns();
  if (li) memset(li, 0, sizeof *li);
  NWC_RETURN_IF(!ti || !buf || (uintptr_t)buf % PAGE, -EINVAL, "nwcd_load: no blob or buffer not "
                "4096-aligned");
  engine *e = NULL;
  NWC_TRY(thread_engine(&e));
  load L;
  int rc = load_open(&L, ti, o, e);
  if (rc == 0) {
    L.dst = buf;
    run(&L);
    rc = L.err;
  }
  load_close(&L, li, t0);
  if (e->broken) { /* the next load on this thread starts a fresh one */
    pthread_setspecific(tl_engine_key, NULL);
    engine_free(e);
    tl_engine = NULL;
  }
  return rc;
}

int nwcd_load_blob(const nwc_tensor_info *ti, void *buf, nwcd_load_info *li,
                   nwcd_progress_fn progress, void *ctx) {
  nwcd_load_opts o = {.progress = progress, .ctx = ctx};
  return nwcd_load(ti, buf, &o, li);
}

/* ---- the ring ----------------------------------------------------------------------------- */

static void ring_register(nwcd_ring *r) {
  struct iovec iov[RING_SLOTS_MAX];
  for (unsigned s = 0; s < r->nslots; s++)
    iov[s] = (struct iovec){r->mem + (uint64_t)s * r->slot_size, r->slot_size};
  /* Fails where RLIMIT_MEMLOCK is too small to pin the ring: plain reads then. */
  r->fixed = io_uring_register_buffers(&r->eng.uring, iov, r->nslots) == 0;
}

int nwcd_ring_create(uint64_t bytes, uint64_t slot_size, nwcd_ring **out) {
  *out = NULL;
  if (!bytes) bytes = RING_DEFAULT;
  if (!slot_size) slot_size = READ_MAX;
  NWC_RETURN_IF(slot_size % NWC_STORE_CHUNK || slot_size > UINT32_MAX || bytes < slot_size ||
                    bytes / slot_size > RING_SLOTS_MAX,
                -EINVAL, "ring of %llu bytes in slots of %llu: slots must be whole MiB, at most "
                "%u of them", (unsigned long long)bytes, (unsigned long long)slot_size,
                RING_SLOTS_MAX);
  nwcd_ring *r = calloc(1, sizeof *r);
  if (!r) return nwc__fail(-ENOMEM, "no memory for a ring");
  r->slot_size = slot_size, r->nslots = (unsigned)(bytes / slot_size);
  uint64_t len = r->slot_size * r->nslots;
  r->free_slots = calloc(r->nslots, sizeof *r->free_slots);
  void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
  int rc = !r->free_slots ? nwc__fail(-ENOMEM, "no memory for a ring")
           : m == MAP_FAILED ? nwc__fail(-errno, "ring of %llu bytes: %s", (unsigned long long)len,
                                         strerror(errno))
                             : engine_init(&r->eng);
  if (m != MAP_FAILED) r->mem = m;
  if (rc < 0) {
    if (r->mem) munmap(r->mem, len);
    free(r->free_slots);
    free(r);
    return rc;
  }
  (void)mlock(r->mem, len); /* best effort: registration pins the pages anyway */
  ring_register(r);
  for (unsigned s = 0; s < r->nslots; s++) r->free_slots[r->nfree++] = r->nslots - 1 - s;
  pthread_mutex_init(&r->lock, NULL);
  *out = r;
  return 0;
}

void nwcd_ring_free(nwcd_ring *r) {
  if (!r) return;
  engine_close(&r->eng);
  munmap(r->mem, r->slot_size * r->nslots);
  pthread_mutex_destroy(&r->lock);
  free(r->free_slots);
  free(r);
}

void *nwcd_ring_memory(const nwcd_ring *r, uint64_t *bytes, unsigned *slots) {
  *bytes = r->slot_size * r->nslots;
  *slots = r->nslots;
  return r->mem;
}

void nwcd_ring_release(nwcd_ring *r, unsigned slot) {
  if (slot < r->nslots && r->nfree < r->nslots) r->free_slots[r->nfree++] = slot;
}

int nwcd_ring_load(nwcd_ring *r, const nwc_tensor_info *ti, const nwcd_load_opts *o,
                   const nwcd_sink *sink, nwcd_load_info *li) {
  uint64_t t0 = nwcd_now_ns();
  if (li) memset(li, 0, sizeof *li);
  NWC_RETURN_IF(!r || !ti || !sink || !sink->consume || !sink->reclaim, -EINVAL,
                "nwcd_ring_load: missing argument");
  nwcd_load_opts ro = o ? *o : (nwcd_load_opts){0};
  NWC_RETURN_IF(ro.read_size > r->slot_size, -EINVAL, "read size %llu > the ring's slots (%llu)",
                (unsigned long long)ro.read_size, (unsigned long long)r->slot_size);
  if (!ro.read_size) ro.read_size = r->slot_size;
  pthread_mutex_lock(&r->lock);
  if (r->eng.broken) { /* the last load's io_uring failed: a fresh one */
    engine_ring_exit(&r->eng);
    int rc = engine_init(&r->eng);
    if (rc < 0) {
      r->eng.broken = true;
      pthread_mutex_unlock(&r->lock);
      return rc;
    }
    ring_register(r);
  }
  load L;
  int rc = load_open(&L, ti, &ro, &r->eng);
  if (rc == 0) {
    L.ring = r, L.sink = sink;
    run(&L);
    rc = L.err;
  }
  load_close(&L, li, t0);
  pthread_mutex_unlock(&r->lock);
  return rc;
}

/* ---- loads into a file ------------------------------------------------------------------- */

typedef struct fd_sink {
  const nwc_tensor_info *ti;
  nwcd_host_dst dst;
} fd_sink;

int nwcd_slot_to_host(const nwcd_host_dst *dst, const nwc_tensor_info *ti, const nwcd_slot *s) {
  if (dst->w) {
    memcpy((uint8_t *)dst->w + s->offset, s->data, s->len);
    return 0;
  }
  for (uint64_t o = 0; o < s->len;) {
    ssize_t k = pwrite(dst->fd, (const uint8_t *)s->data + o, s->len - o, (off_t)(s->offset + o));
    if (k < 0 && errno == EINTR) continue;
    NWC_RETURN_IF(k <= 0, k < 0 ? -errno : -EIO, "model '%s' tensor '%s': writing %llu bytes at "
                  "%llu into its memory: %s", ti->model, ti->name,
                  (unsigned long long)(s->len - o), (unsigned long long)(s->offset + o),
                  k < 0 ? strerror(errno) : "nothing written");
    o += (uint64_t)k;
  }
  return 0;
}

/* Writes a checked slot at its blob offset and gives the slot straight back. */
static int fd_consume(void *ctx, nwcd_ring *r, const nwcd_slot *s) {
  const fd_sink *f = ctx;
  NWC_TRY(nwcd_slot_to_host(&f->dst, f->ti, s));
  nwcd_ring_release(r, s->index);
  return 0;
}

static int fd_reclaim(void *ctx, nwcd_ring *r, bool wait) {
  (void)ctx, (void)r, (void)wait; /* fd_consume holds no slot */
  return 0;
}

static void ring_key_free(void *p) { nwcd_ring_free(p); }
static void make_ring_key(void) { pthread_key_create(&tl_ring_key, ring_key_free); }

int nwcd_load_fd(const nwc_tensor_info *ti, int fd, const nwcd_load_opts *o, nwcd_load_info *li) {
  if (li) memset(li, 0, sizeof *li);
  NWC_RETURN_IF(!ti || fd < 0, -EINVAL, "nwcd_load_fd: no blob or no file");
  if (!tl_ring) {
    pthread_once(&tl_ring_once, make_ring_key);
    NWC_TRY(nwcd_ring_create(FD_RING, FD_SLOT, &tl_ring));
    pthread_setspecific(tl_ring_key, tl_ring);
  }
  fd_sink f = {ti, {NULL, fd}};
  nwcd_sink sink = {fd_consume, fd_reclaim, &f};
  return nwcd_ring_load(tl_ring, ti, o, &sink, li);
}
