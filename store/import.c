/*
 * import.c - safetensors (single file or sharded) into the store: plan, encode on all threads,
 * write one container, publish in one transaction.
 *
 * Phases, each finishing before the next starts:
 *   1. plan    parse every file (store/safetensors.c) and the index; check names, dtypes, shapes,
 *              duplicates across shards, that the index and the shards agree, and that the model
 *              name is free.  Any bad input fails here, before a byte is written.  Well-formed
 *              tensors that nwc does not store (integer and boolean dtypes, empty tensors) are set
 *              aside as skipped (a strict import fails on the first); they are reported after
 *              the publish.
 *   2. encode  tensors largest first: those of TEAM_BYTES or more one at a time on all threads
 *              (nwc__enc_*), the rest one per worker thread.  Convert (F16/F32/F64 -> BF16 by
 *              round to nearest even, F8_E5M2 -> BF16 exactly, optional BF16 -> fp8 per row) or
 *              let the encoder pread the source piece by piece; encode the blob's head in place
 *              (encode_in_place) and its raw plane in 1 MiB chunks (stream_chunk), each
 *              checksummed and queued as soon as it is made.  A writer thread writes the queue
 *              to DIR/containers/ID.tmp (large pieces O_DIRECT) while encoding goes on.  The
 *              calling thread reports progress; the first error stops the others.
 *   3. publish fsync the file, rename it to ID.nwc, fsync the directory, then one SQLite
 *              transaction inserts the model.  Any failure unlinks the file.  A crash anywhere
 *              leaves a file that the next open sweeps (store.c).
 * Buffers: per encoder, two blob heads (header to the first chunk boundary in the raw plane: one
 * is filled while the other is written), a source buffer only for small or converted tensors;
 * per import, SLOTS_PER_THREAD chunk buffers per thread.
 */
#include "store_internal.h"
#include "encode_internal.h" /* the layout-0 encoder in steps (nwc__enc_*) */

#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xxh_x86dispatch.h> /* the chunk checksums on the widest vectors the CPU has */
#endif

#include "safetensors.h"

typedef struct src_file {
  const char *label; /* path or name used in messages and recorded in the catalog */
  int fd;            /* tensor bytes are pread from it (never mapped: no SIGBUS if it shrinks) */
  nwc_st_file *f;    /* its header (nwc_st_read_fd) */
  uint64_t size;
  int64_t mtime_ns;
  uint64_t header_xxh3;
} src_file;

enum conv { CONV_NONE, CONV_F16, CONV_F32, CONV_F64, CONV_E5M2 };

/* A buffer reused from tensor to tensor; busy while the writer thread has a write from it queued. */
typedef struct wbuf {
  uint8_t *p;
  uint64_t cap;
  int busy;
} wbuf;

/* An encoder's buffers: two for blobs (one is filled while the other is written), the source,
 * the BF16 conversion. */
typedef struct wbufs {
  wbuf blob[2], src, conv;
} wbufs;

/* A write for the writer thread: len bytes at p to file offset off, for tensor j; then *busy = 0. */
typedef struct wreq {
  const uint8_t *p;
  uint64_t len, off;
  const struct job *j;
  int *busy;
} wreq;

/* Chunks of a blob's raw plane written as they are made (no buffer for the whole plane): buffers
 * per encoder thread, and the most writes queued at once. */
#define SLOTS_PER_THREAD 3

/* The most queued writes one pwritev takes. */
#define IOV_MAX_WRITE 16

/* Tensors from this size on are read by the encoder piece by piece, not into a buffer. */
#define READ_PIECES_BYTES (UINT64_C(8) << 20)

typedef struct job {
  const nwc_st_tensor *st;
  unsigned source;
  enum conv conv;
  int quantize;                 /* BF16 -> fp8 per row */
  const nwc_st_tensor *scale;   /* F8_E4M3: companion scale tensor */
  unsigned scale_source;
  int fold;                     /* fold the companion into the per-row scale */
  char conversion[80];
  nwc__pub_tensor pub;
} job;

/* A tensor set aside by the plan (not stored), and its source file. */
typedef struct skip_ref {
  const nwc_st_tensor *st;
  unsigned source;
} skip_ref;

typedef struct imp {
  nwc_store *s;
  const char *model;
  nwc_import_opts o;
  src_file *src;
  size_t nsrc;
  job *jobs;
  size_t njobs;
  skip_ref *skips; /* in source order */
  size_t nskips;
  size_t *order;
  uint64_t total;
  /* encode phase */
  int fd, dfd;                  /* the file, buffered; and O_DIRECT (-1: not taken) */
  wreq *wq;                     /* a ring of wq_cap writes, wq_len of them from wq_head on */
  size_t wq_cap, wq_head, wq_len;
  int writer_stop;
  wbuf *slots;                  /* nslots chunk buffers of NWC_STORE_CHUNK bytes */
  unsigned nslots;
  uint64_t cid, file_end;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  size_t next;
  unsigned running;
  uint64_t done;
  int err, cancel;
  char errmsg[1024];
} imp;

/* ---- conversions ---------------------------------------------------------------------------- */

static float f16_to_f32(uint16_t h) {
  uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  if (e == 0) {
    float f = (float)m * 0x1p-24f; /* zero or subnormal, exact */
    memcpy(&u, &f, 4);
    u |= s;
  } else if (e == 31) {
    u = s | 0x7f800000u | (m << 13);
  } else {
    u = s | ((e + 112) << 23) | (m << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Element i of a float tensor (F32, F16, BF16 or F8_E5M2) at possibly unaligned p.  F8_E5M2 is
 * the high byte of an F16, so every one of its values is exact in F32 and in BF16. */
static float load_float(const char *dtype, const uint8_t *p, uint64_t i) {
  if (!strcmp(dtype, "F32")) {
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
  }
  if (!strcmp(dtype, "F8_E5M2")) return f16_to_f32((uint16_t)(p[i] << 8));
  uint16_t h;
  memcpy(&h, p + 2 * i, 2);
  return !strcmp(dtype, "F16") ? f16_to_f32(h) : nwc_bf16_to_f32(h);
}

/* F64 to BF16 with one rounding to nearest even.  Rounding to F32 and then to BF16 would round
 * twice (1 + 2^-8 + 2^-40 would become 1, not 1 + 2^-7), so the step to F32 rounds to odd
 * instead (toward zero, the last bit set when inexact): F32 keeps 16 bits more than BF16, in the
 * subnormal range too, and round to odd followed by a rounding to 2 or more bits fewer is the
 * one correct rounding.  Beyond the F32 range the truncation is the largest F32, odd, which
 * rounds to infinity as it must; NaN stays NaN. */
static uint16_t f64_to_bf16(const uint8_t *p, uint64_t i) {
  double d;
  memcpy(&d, p + 8 * i, 8);
  float f = (float)d;
  uint32_t u;
  memcpy(&u, &f, 4);
  if (!isnan(d) && (double)f != d) {
    if (fabs((double)f) > fabs(d)) u--; /* rounded away from zero: the truncation is below */
    u |= 1;
  }
  memcpy(&f, &u, 4);
  return nwc_f32_to_bf16(f);
}

/* ---- the encode phase ----------------------------------------------------------------------- */

static int pwrite_full(int fd, const uint8_t *p, uint64_t len, uint64_t off) {
  while (len) {
    ssize_t n = pwrite(fd, p, len > (1u << 30) ? (1u << 30) : len, (off_t)off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    p += n, off += (uint64_t)n, len -= (uint64_t)n;
  }
  return 0;
}

/* A buffer reused from tensor to tensor (no page faults on every tensor).  Large ones are 2 MiB
 * aligned and asked for huge pages: a fresh 500 MB buffer then faults 250 times, not 125000. */
#define HUGE_BYTES (UINT64_C(2) << 20)

static int wbuf_reserve(wbuf *b, uint64_t n) {
  if (n <= b->cap && b->p) return 0;
  void *p = NULL;
  free(b->p);
  b->p = NULL, b->cap = 0;
  uint64_t align = n >= 2 * HUGE_BYTES ? HUGE_BYTES : NWC_STORE_ALIGN;
  n = nwc__round_up(n ? n : 1, align);
  if (posix_memalign(&p, align, n)) return -ENOMEM;
  if (align == HUGE_BYTES) (void)madvise(p, n, MADV_HUGEPAGE);
  b->p = p, b->cap = n;
  return 0;
}

static int read_error(const src_file *sf, const nwc_st_tensor *st, int rc) {
  return nwc__fail(rc == -EIO ? -EBADMSG : rc,
                   "%s: tensor '%s': cannot read its %llu bytes (did the file shrink?)", sf->label,
                   st->name, (unsigned long long)(st->end - st->begin));
}

/* Reads a tensor's bytes from its source file into dst. */
static int read_tensor(const src_file *sf, const nwc_st_tensor *st, void *dst) {
  int rc = nwc__pread_full(sf->fd, dst, st->end - st->begin, sf->f->data_offset + st->begin);
  return rc < 0 ? read_error(sf, st, rc) : 0;
}

/* The encoder's read callback: bytes [off, off + len) of one tensor (nwc__enc_read_fn). */
typedef struct part_src {
  const src_file *sf;
  const nwc_st_tensor *st;
} part_src;

static int read_part(void *ctx, uint64_t off, uint64_t len, void *dst) {
  const part_src *ps = ctx;
  return nwc__pread_full(ps->sf->fd, dst, len, ps->sf->f->data_offset + ps->st->begin + off);
}

/* The per-row companion scale of an F8_E4M3 tensor as floats (malloc'ed into *out). */
static int read_scale(const imp *im, const job *j, float **out) {
  const nwc_st_tensor *c = j->scale;
  uint8_t *raw = malloc(c->end - c->begin + 1);
  float *v = malloc(c->numel * sizeof *v + 1);
  int rc = raw && v ? read_tensor(&im->src[j->scale_source], c, raw) : -ENOMEM;
  for (uint64_t r = 0; rc == 0 && r < c->numel; r++) v[r] = load_float(c->dtype, raw, r);
  free(raw);
  if (rc < 0) free(v), v = NULL;
  *out = v;
  return rc;
}

/* ---- the writer thread: blobs go to the file while the next tensors encode ------------------ */

/* Writes n buffers at off, one after the other (a short write goes on where it stopped). */
static int pwritev_full(int fd, struct iovec *iov, int n, uint64_t off) {
  while (n > 0) {
    ssize_t w = pwritev(fd, iov, n, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return -errno;
    off += (uint64_t)w;
    for (; n > 0 && (size_t)w >= iov->iov_len; iov++, n--) w -= (ssize_t)iov->iov_len;
    if (n > 0) iov->iov_base = (uint8_t *)iov->iov_base + w, iov->iov_len -= (size_t)w;
  }
  return 0;
}

/* Writes n buffers of len bytes in all to off.  Large writes go through O_DIRECT where the file
 * system takes it (no copy into the page cache; a refusal, EINVAL, turns it off); small ones, and
 * all without it, through the page cache. */
#define DIRECT_MIN_BYTES NWC_STORE_CHUNK

static int write_at(imp *im, struct iovec *iov, int n, uint64_t len, uint64_t off) {
  if (im->dfd >= 0 && len >= DIRECT_MIN_BYTES) {
    struct iovec keep[IOV_MAX_WRITE];
    memcpy(keep, iov, (size_t)n * sizeof *iov);
    int rc = pwritev_full(im->dfd, iov, n, off);
    if (rc != -EINVAL) return rc;
    close(im->dfd);
    im->dfd = -1;
    memcpy(iov, keep, (size_t)n * sizeof *iov);
  }
  int rc = pwritev_full(im->fd, iov, n, off);
  /* Buffered: start writeback of big writes now, so that the fsync before publishing has little
   * left to do (small ones are left to that fsync: a syscall each would cost more). */
  if (rc == 0 && len >= NWC_STORE_CHUNK)
    (void)sync_file_range(im->fd, (off64_t)off, (off64_t)len, SYNC_FILE_RANGE_WRITE);
  return rc;
}

static void set_error(imp *im, int rc) { /* with im->mu held */
  if (rc < 0 && !im->err) {
    im->err = rc;
    snprintf(im->errmsg, sizeof im->errmsg, "%s", nwc_error_detail());
  }
}

static void *writer(void *arg) {
  imp *im = arg;
  pthread_mutex_lock(&im->mu);
  for (;;) {
    while (!im->wq_len && !im->writer_stop) pthread_cond_wait(&im->cv, &im->mu);
    if (!im->wq_len) break;
    /* The queued writes that continue each other in the file go out in one call. */
    wreq q[IOV_MAX_WRITE];
    struct iovec iov[IOV_MAX_WRITE];
    int n = 0;
    uint64_t len = 0;
    while (n < IOV_MAX_WRITE && im->wq_len &&
           (n == 0 || im->wq[im->wq_head].off == q[n - 1].off + q[n - 1].len)) {
      q[n] = im->wq[im->wq_head];
      iov[n] = (struct iovec){(void *)q[n].p, q[n].len};
      len += q[n++].len;
      im->wq_head = (im->wq_head + 1) % im->wq_cap;
      im->wq_len--;
    }
    int skip = im->err != 0;
    pthread_mutex_unlock(&im->mu);
    int rc = skip ? 0 : write_at(im, iov, n, len, q[0].off);
    if (rc < 0) rc = nwc__fail(rc, "%s/containers: writing tensor '%s'", im->s->dir, q[0].j->st->name);
    pthread_mutex_lock(&im->mu);
    set_error(im, rc);
    for (int k = 0; k < n; k++) *q[k].busy = 0;
    pthread_cond_broadcast(&im->cv);
  }
  pthread_mutex_unlock(&im->mu);
  return NULL;
}

/* Queues a write (im->mu held); *busy stays set until it is done. */
static void enqueue(imp *im, const uint8_t *p, uint64_t len, uint64_t off, const job *j, int *busy) {
  while (im->wq_len == im->wq_cap) pthread_cond_wait(&im->cv, &im->mu);
  im->wq[(im->wq_head + im->wq_len++) % im->wq_cap] = (wreq){p, len, off, j, busy};
  *busy = 1;
  pthread_cond_broadcast(&im->cv);
}

/* Waits (im->mu held) until no write is pending from b. */
static void wbuf_wait(imp *im, wbuf *b) {
  while (b->busy) pthread_cond_wait(&im->cv, &im->mu);
}

/* ---- encoding into blobs -------------------------------------------------------------------- */

/* The streamed chunks of one blob: [k0, nchunks), each made by a task (stream_chunk). */
typedef struct streamer {
  imp *im;
  const job *j;
  nwc__enc *e;
  const nwc_tensor *t; /* raw NULL: the chunks make it */
  uint64_t k0;
} streamer;

/* Chunk k0 + i of the blob: the raw plane's bytes in it (and the tail: zeros, the scale) into a
 * free slot, its checksum, its write queued. */
static void stream_chunk(void *ctx, uint64_t i, unsigned thread) {
  const streamer *sm = ctx;
  imp *im = sm->im;
  const nwc__pub_tensor *pt = &sm->j->pub;
  uint64_t from = (sm->k0 + i) * NWC_STORE_CHUNK;
  uint64_t upto = pt->L.length - from < NWC_STORE_CHUNK ? pt->L.length : from + NWC_STORE_CHUNK;
  uint64_t raw0 = pt->L.off_raw, raw1 = raw0 + sm->t->raw_bytes;
  pthread_mutex_lock(&im->mu);
  wbuf *slot = NULL;
  while (!im->err && !slot) {
    for (unsigned k = 0; k < im->nslots && !slot; k++)
      if (!im->slots[k].busy) slot = &im->slots[k];
    if (!slot) pthread_cond_wait(&im->cv, &im->mu);
  }
  if (slot) slot->busy = 1; /* taken: ours until the writer is done with it */
  pthread_mutex_unlock(&im->mu);
  if (!slot) return;
  int rc = wbuf_reserve(slot, NWC_STORE_CHUNK); /* on first use: small models need none */
  if (rc == 0) {
    nwc__blob_write(sm->t, im->cid, &pt->L, from, upto, slot->p);
    uint64_t a = raw0 > from ? raw0 : from, b = raw1 < upto ? raw1 : upto;
    if (a < b) rc = nwc__enc_raw_range(sm->e, a - raw0, b - raw0, slot->p + (a - from), thread);
    if (rc < 0) rc = read_error(&im->src[sm->j->source], sm->j->st, rc); /* only reads fail */
    pt->checksums[sm->k0 + i] = XXH3_64bits(slot->p, upto - from);
  }
  pthread_mutex_lock(&im->mu);
  set_error(im, rc);
  slot->busy = 0;
  if (rc == 0) enqueue(im, slot->p, upto - from, pt->offset + from, sm->j, &slot->busy);
  pthread_cond_broadcast(&im->cv);
  pthread_mutex_unlock(&im->mu);
}

typedef struct sum_task {
  const uint8_t *blob;
  uint64_t length, *sums;
} sum_task;

static void sum_chunk(void *ctx, uint64_t i, unsigned thread) {
  const sum_task *c = ctx;
  uint64_t o = i * NWC_STORE_CHUNK, n = c->length - o < NWC_STORE_CHUNK ? c->length - o
                                                                      : NWC_STORE_CHUNK;
  (void)thread;
  c->sums[i] = XXH3_64bits(c->blob + o, n);
}

/* Gives job j its place in the file (im->mu taken here). */
static void place(imp *im, job *j) {
  pthread_mutex_lock(&im->mu);
  j->pub.offset = im->file_end;
  im->file_end += j->pub.length;
  pthread_mutex_unlock(&im->mu);
}

/*
 * Layout 0: encodes w (read through rd when not NULL) on `threads` threads.  The blob's head
 * (header, bases, hdr, the streams, up to the first chunk boundary inside the raw plane) is built
 * in blob, its streams in place; the chunks after it are made, checksummed and queued for the
 * writer one at a time (stream_chunk), so that no buffer holds the whole raw plane; a blob of at
 * most READ_PIECES_BYTES is all head.  Returns with the head still to be checksummed and written.
 */
static int encode_in_place(imp *im, job *j, const void *w, part_src *rd, const float *scale,
                           unsigned threads, wbuf *blob, uint64_t *head) {
  nwc__pub_tensor *pt = &j->pub;
  nwc__blob_layout *L = &pt->L;
  uint64_t lay[4];
  uint8_t psym[16];
  nwc__enc *e = NULL;
  NWC_TRY(nwc_layout(pt->rows, pt->cols, pt->elem, lay));
  NWC_TRY(nwc__enc_begin(rd ? NULL : w, pt->rows, pt->cols, pt->elem, threads,
                         rd ? read_part : NULL, rd, NULL, psym, &e));
  nwc_tensor t = {.elem = pt->elem, .rows = pt->rows, .cols = pt->cols,
                  .nblocks = lay[NWC_LAYOUT_BLOCKS], .data_bytes = nwc__enc_bound(e),
                  .raw_bytes = lay[NWC_LAYOUT_RAW_BYTES], .scale = scale};
  memcpy(t.psym, psym, 16);
  nwc__blob_layout_of(&t, L); /* with the bound: the head is at most this long */
  /* A blob of at most READ_PIECES_BYTES is built whole (no chunk buffers for small models). */
  int whole = L->length <= READ_PIECES_BYTES;
  uint64_t most = whole ? L->length : nwc__round_up(L->off_raw, NWC_STORE_CHUNK);
  int rc = wbuf_reserve(blob, L->length < most ? L->length : most);
  if (rc == 0) {
    uint8_t *b = blob->p;
    t.bases = (const uint64_t *)(b + L->off_bases);
    t.hdr = b + L->off_hdr;
    t.data = b + L->off_data;
    int64_t db = nwc__enc_streams(e, (uint64_t *)(b + L->off_bases), b + L->off_hdr,
                                  b + L->off_data);
    rc = db < 0 ? (int)db : 0;
    t.data_bytes = (uint64_t)db;
  }
  if (rc == 0) {
    nwc__blob_layout_of(&t, L);
    pt->length = L->length;
    pt->checksums = malloc(nwc__chunks(L->length, NWC_STORE_CHUNK) * 8);
    if (!pt->checksums) rc = -ENOMEM;
  }
  uint64_t k0 = 0, nchunks = nwc__chunks(L->length, NWC_STORE_CHUNK);
  if (rc == 0) {
    k0 = whole ? nchunks : nwc__ceil_div(L->off_raw, NWC_STORE_CHUNK);
    if (k0 > nchunks) k0 = nchunks;
    *head = k0 * NWC_STORE_CHUNK < L->length ? k0 * NWC_STORE_CHUNK : L->length;
    uint64_t raw_in_head = *head > L->off_raw ? *head - L->off_raw : 0;
    if (raw_in_head > t.raw_bytes) raw_in_head = t.raw_bytes;
    t.raw = blob->p + L->off_raw;
    rc = nwc__enc_raw_range(e, 0, raw_in_head, blob->p + L->off_raw, 0);
  }
  if (rc == 0) nwc__blob_write(&t, im->cid, L, 0, *head, blob->p);
  if (rc == 0) {
    memcpy(pt->psym, t.psym, 16);
    pt->nblocks = t.nblocks;
    pt->data_bytes = t.data_bytes;
    pt->raw_plane_bytes = t.raw_bytes;
    place(im, j);
    t.raw = NULL;
    streamer sm = {im, j, e, &t, k0};
    nwc__parallel_for(nwc__enc_threads(e), nchunks - k0, stream_chunk, &sm);
  }
  nwc__enc_free(e);
  return rc;
}

/* Encodes job j into blob on `threads` threads (layouts 1 and 2: on one, then copied) and queues
 * its writes; 0 or a negative errno (the detail names the file and the tensor). */
static int encode_job(imp *im, job *j, wbufs *wb, wbuf *blob, unsigned threads) {
  const src_file *sf = &im->src[j->source];
  const nwc_st_tensor *st = j->st;
  uint64_t rows = j->pub.rows, cols = j->pub.cols, n = st->numel;
  int layout0 = NWC_ELEM_LAYOUT(j->pub.elem) == 0;
  /* Plain BF16 or fp8 into layout 0, if large: the encoder reads the file itself, a piece at a
   * time (three times over: a small tensor is cheaper to read once into memory). */
  int direct = layout0 && j->conv == CONV_NONE && !j->quantize && st->end - st->begin >= READ_PIECES_BYTES;
  part_src rd = {sf, st};
  uint8_t *q = NULL;
  float *scale = NULL;
  if (!direct) {
    NWC_TRY(wbuf_reserve(&wb->src, st->end - st->begin));
    NWC_TRY(read_tensor(sf, st, wb->src.p));
  }
  const void *w = wb->src.p;
  int rc = 0;
  if (j->conv != CONV_NONE) {
    NWC_TRY(wbuf_reserve(&wb->conv, n * 2));
    uint16_t *bf = (uint16_t *)wb->conv.p;
    for (uint64_t i = 0; i < n; i++)
      bf[i] = j->conv == CONV_F64 ? f64_to_bf16(wb->src.p, i)
                                  : nwc_f32_to_bf16(load_float(st->dtype, wb->src.p, i));
    w = bf;
  }
  if (j->quantize) {
    q = malloc(n);
    scale = malloc(rows * sizeof *scale);
    rc = q && scale ? nwc_quantize_fp8(w, rows, cols, q, scale) : -ENOMEM;
    w = q;
  } else if (j->fold) {
    rc = read_scale(im, j, &scale);
  }
  nwc__pub_tensor *pt = &j->pub;
  uint64_t head = 0;
  int named = 0; /* the detail names the file and the tensor already */
  if (rc == 0 && layout0) {
    rc = encode_in_place(im, j, w, direct ? &rd : NULL, scale, threads, blob, &head);
    if (rc < 0 && direct && rc != -EINVAL && rc != -ENOMEM) rc = read_error(sf, st, rc), named = 1;
  } else if (rc == 0) {
    nwc_tensor t;
    rc = nwc_tensor_encode(w, rows, cols, j->pub.elem, scale, &t);
    if (rc == 0) {
      nwc__blob_layout_of(&t, &pt->L);
      pt->length = head = pt->L.length;
      pt->checksums = malloc(nwc__chunks(pt->L.length, NWC_STORE_CHUNK) * 8);
      rc = pt->checksums ? wbuf_reserve(blob, pt->L.length) : -ENOMEM;
    }
    if (rc == 0) {
      nwc__blob_write(&t, im->cid, &pt->L, 0, pt->L.length, blob->p);
      memcpy(pt->psym, t.psym, 16);
      pt->nblocks = t.nblocks;
      pt->data_bytes = t.data_bytes;
      pt->raw_plane_bytes = t.raw_bytes;
      place(im, j);
    }
    nwc_tensor_release(&t);
  }
  free(q);
  free(scale);
  if (rc < 0) return rc == -ENOMEM || named ? rc : nwc__fail_prefix(rc, "%s: tensor '%s'", sf->label, st->name);
  sum_task c = {blob->p, head, pt->checksums};
  nwc__parallel_for(threads, nwc__chunks(head, NWC_STORE_CHUNK), sum_chunk, &c);
  pthread_mutex_lock(&im->mu);
  enqueue(im, blob->p, head, pt->offset, j, &blob->busy);
  pthread_mutex_unlock(&im->mu);
  return 0;
}

/* Records an encoded job (im->mu held): its error, its progress. */
static void job_done(imp *im, job *j, int rc) {
  set_error(im, rc);
  im->done += j->st->end - j->st->begin;
  pthread_cond_broadcast(&im->cv);
}

static void wbufs_free(wbufs *wb) {
  for (int k = 0; k < 2; k++) free(wb->blob[k].p);
  free(wb->src.p);
  free(wb->conv.p);
  memset(wb, 0, sizeof *wb);
}

static void *worker(void *arg) {
  imp *im = arg;
  wbufs wb = {0};
  unsigned k = 0;
  pthread_mutex_lock(&im->mu);
  while (!im->err && !im->cancel && im->next < im->njobs) {
    job *j = &im->jobs[im->order[im->next++]];
    wbuf *b = &wb.blob[k++ & 1];
    wbuf_wait(im, b);
    pthread_mutex_unlock(&im->mu);
    int rc = encode_job(im, j, &wb, b, 1);
    pthread_mutex_lock(&im->mu);
    job_done(im, j, rc);
  }
  for (int i = 0; i < 2; i++) wbuf_wait(im, &wb.blob[i]);
  im->running--;
  pthread_cond_broadcast(&im->cv);
  pthread_mutex_unlock(&im->mu);
  wbufs_free(&wb);
  return NULL;
}

static int cmp_job_size(const void *a, const void *b, void *ctx) {
  const job *jobs = ctx, *x = &jobs[*(const size_t *)a], *y = &jobs[*(const size_t *)b];
  uint64_t nx = x->st->numel, ny = y->st->numel;
  return (nx < ny) - (nx > ny);
}

/* Reports progress from the calling thread (im->mu held) when it moved; 1 if it did. */
static int report(imp *im, uint64_t *last) {
  if (!im->o.progress || im->done == *last || im->cancel) return 0;
  uint64_t d = *last = im->done;
  pthread_mutex_unlock(&im->mu);
  int stop = im->o.progress(im->o.progress_ctx, d, im->total);
  pthread_mutex_lock(&im->mu);
  if (stop) im->cancel = 1;
  return 1;
}

/*
 * Tensors of at least TEAM_BYTES come first, one at a time, each encoded by all threads (a
 * model's largest tensors would otherwise hold one core each until the end); the rest go to one
 * worker thread each.  A writer thread writes while the next pieces encode: each encoder
 * alternates between two blob buffers, and the raw planes go out in chunks.
 */
#define TEAM_BYTES (UINT64_C(16) << 20)

static int encode_all(imp *im) {
  unsigned nt = im->o.threads;
  if (nt == 0) {
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    nt = c > 0 ? (unsigned)c : 1;
  }
  if (nt > NWC__MAX_THREADS) nt = NWC__MAX_THREADS;
  im->nslots = nt * SLOTS_PER_THREAD;
  im->wq_cap = im->nslots + 2 * (size_t)nt + 2; /* every buffer's write at once */
  im->order = malloc(im->njobs * sizeof *im->order);
  im->wq = malloc(im->wq_cap * sizeof *im->wq);
  im->slots = calloc(im->nslots, sizeof *im->slots);
  if (!im->order || !im->wq || !im->slots) return -ENOMEM;
  for (size_t i = 0; i < im->njobs; i++) im->order[i] = i;
  qsort_r(im->order, im->njobs, sizeof *im->order, cmp_job_size, im->jobs);
  pthread_t tid[NWC__MAX_THREADS], wtid;
  pthread_mutex_init(&im->mu, NULL);
  pthread_cond_init(&im->cv, NULL);
  pthread_mutex_lock(&im->mu);
  int writing = pthread_create(&wtid, NULL, writer, im) == 0;
  if (!writing) im->err = nwc__fail(-EAGAIN, "import: cannot start the writer thread");
  uint64_t last = UINT64_MAX;
  wbufs team = {0};
  for (unsigned k = 0; nt > 1 && !im->err && !im->cancel && im->next < im->njobs; k++) {
    job *j = &im->jobs[im->order[im->next]];
    if (j->st->end - j->st->begin < TEAM_BYTES) break;
    im->next++;
    wbuf *b = &team.blob[k & 1];
    wbuf_wait(im, b);
    pthread_mutex_unlock(&im->mu);
    int rc = encode_job(im, j, &team, b, nt);
    pthread_mutex_lock(&im->mu);
    job_done(im, j, rc);
    report(im, &last);
  }
  for (int i = 0; i < 2; i++) wbuf_wait(im, &team.blob[i]);
  pthread_mutex_unlock(&im->mu);
  wbufs_free(&team);
  pthread_mutex_lock(&im->mu);
  if (nt > im->njobs - im->next) nt = (unsigned)(im->njobs - im->next);
  unsigned started = 0;
  for (; !im->err && started < nt; started++) {
    if (pthread_create(&tid[started], NULL, worker, im)) break;
    im->running++;
  }
  if (started == 0 && im->next < im->njobs && !im->err)
    im->err = nwc__fail(-EAGAIN, "import: cannot start a worker thread");
  for (;;) {
    if (report(im, &last)) continue;
    if (im->running == 0) break;
    pthread_cond_wait(&im->cv, &im->mu);
  }
  im->writer_stop = 1;
  pthread_cond_broadcast(&im->cv);
  pthread_mutex_unlock(&im->mu);
  for (unsigned i = 0; i < started; i++) pthread_join(tid[i], NULL);
  if (writing) pthread_join(wtid, NULL);
  pthread_cond_destroy(&im->cv);
  pthread_mutex_destroy(&im->mu);
  if (im->err) return nwc__fail(im->err, "%s", im->errmsg);
  if (im->cancel) return nwc__fail(-ECANCELED, "import of '%s' cancelled", im->model);
  return 0;
}

/* ---- the plan phase ------------------------------------------------------------------------- */

typedef struct name_ref {
  const char *name;
  size_t src, idx;
} name_ref;

static int cmp_name_ref(const void *a, const void *b) {
  return strcmp(((const name_ref *)a)->name, ((const name_ref *)b)->name);
}

static const name_ref *find_name(const name_ref *v, size_t n, const char *name) {
  name_ref key = {name, 0, 0};
  return bsearch(&key, v, n, sizeof *v, cmp_name_ref);
}

static int cmp_job_pos(const void *a, const void *b) {
  const job *x = a, *y = b;
  if (x->source != y->source) return (x->source > y->source) - (x->source < y->source);
  return (x->st->begin > y->st->begin) - (x->st->begin < y->st->begin);
}

/* The dtypes nwc stores: every floating-point one safetensors has.  The others (integers, BOOL)
 * are skipped, as are empty tensors: nothing in them is a weight to compress. */
#define STORED_DTYPES "BF16, F16, F32, F64, F8_E4M3, F8_E5M2"

static int stored_dtype(const char *d) {
  static const char *const k[] = {"BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2"};
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
    if (!strcmp(d, k[i])) return 1;
  return 0;
}

/* 1 if the import stores st, 0 if it skips it. */
static int storable(const nwc_st_tensor *st) { return st->numel > 0 && stored_dtype(st->dtype); }

/* What makes st unstorable, for messages: "I64" or "an empty F32 tensor" (static buffer). */
static const char *unstorable_why(const nwc_st_tensor *st) {
  static _Thread_local char why[48];
  if (stored_dtype(st->dtype)) snprintf(why, sizeof why, "an empty %s tensor", st->dtype);
  else snprintf(why, sizeof why, "%s", st->dtype);
  return why;
}

/* The checks every tensor passes, stored or skipped: a valid name, a dtype safetensors defines
 * (its size against the shape was checked by the parser). */
static int check_tensor(const imp *im, const job *j) {
  const char *f = im->src[j->source].label, *nm = j->st->name;
  NWC_RETURN_IF(!nwc_tensor_name_valid(nm), -EBADMSG,
                "%s: tensor name '%s' is not UTF-8 without control characters", f, nm);
  NWC_RETURN_IF(!j->st->dtype_size, -EBADMSG, "%s: tensor '%s': unknown dtype '%s'", f, nm,
                j->st->dtype);
  return 0;
}

static int plan_tensor(imp *im, job *j, const name_ref *names, size_t nnames) {
  const src_file *sf = &im->src[j->source];
  const nwc_st_tensor *st = j->st;
  const char *f = sf->label, *nm = st->name;
  int f16 = !strcmp(st->dtype, "F16"), f32 = !strcmp(st->dtype, "F32");
  int f64 = !strcmp(st->dtype, "F64"), e5m2 = !strcmp(st->dtype, "F8_E5M2");
  int f8 = !strcmp(st->dtype, "F8_E4M3");
  nwc__pub_tensor *pt = &j->pub;
  pt->name = nm;
  pt->ndim = st->ndim;
  memcpy(pt->shape, st->shape, sizeof pt->shape);
  pt->dtype = st->dtype;
  pt->source = j->source;
  nwc_st_matrix_shape(st, &pt->rows, &pt->cols);
  pt->source_bytes = st->end - st->begin;
  j->conv = f16 ? CONV_F16 : f32 ? CONV_F32 : f64 ? CONV_F64 : e5m2 ? CONV_E5M2 : CONV_NONE;
  j->quantize = !f8 && im->o.elem == NWC_ELEM_FP8 && st->ndim >= 2;
  unsigned type = f8 || j->quantize ? NWC_ELEM_FP8 : NWC_ELEM_BF16;
  pt->elem = NWC_ELEM(type, im->o.layout);
  pt->raw_bytes = st->numel * (type == NWC_ELEM_FP8 ? 1 : 2);
  uint64_t lay[4];
  int rc = nwc_layout(pt->rows, pt->cols, pt->elem, lay);
  if (rc < 0) return nwc__fail_prefix(rc, "%s: tensor '%s'", f, nm);
  static const char *const conv_name[] = {
      [CONV_NONE] = "none", [CONV_F16] = "f16->bf16 rne", [CONV_F32] = "f32->bf16 rne",
      [CONV_F64] = "f64->bf16 rne", [CONV_E5M2] = "f8_e5m2->bf16 exact"};
  const char *c = conv_name[j->conv];
  if (j->quantize)
    snprintf(j->conversion, sizeof j->conversion, "%s%sbf16->fp8 row absmax/448",
             j->conv ? c : "", j->conv ? ", " : "");
  else snprintf(j->conversion, sizeof j->conversion, "%s", c);
  if (f8) {
    /* Companion scale: NAME_scale_inv, NAME_scale or NAME.scale (multiplied into the weights). */
    static const char *const suffix[] = {"_scale_inv", "_scale", ".scale"};
    for (int k = 0; k < 3 && !j->scale; k++) {
      char buf[4096];
      if (snprintf(buf, sizeof buf, "%s%s", nm, suffix[k]) >= (int)sizeof buf) continue;
      const name_ref *r = find_name(names, nnames, buf);
      if (!r || !storable(&im->src[r->src].f->tensors[r->idx])) continue;
      j->scale = &im->src[r->src].f->tensors[r->idx];
      j->scale_source = (unsigned)r->src;
    }
    snprintf(j->conversion, sizeof j->conversion, "fp8 e4m3 as stored");
    if (j->scale) {
      pt->scale_tensor = j->scale->name;
      const char *d = j->scale->dtype;
      int fl = !strcmp(d, "F32") || !strcmp(d, "F16") || !strcmp(d, "BF16");
      j->fold = fl && j->scale->numel == pt->rows;
      float *v = NULL;
      if (j->fold) {
        rc = read_scale(im, j, &v);
        if (rc < 0) return rc;
      }
      for (uint64_t r = 0; j->fold && r < pt->rows; r++)
        if (!isfinite(v[r]) || v[r] <= 0) j->fold = 0;
      free(v);
      snprintf(j->conversion, sizeof j->conversion, "fp8 e4m3, %s",
               j->fold ? "per-row scale folded from the companion" : "companion scale kept apart");
    }
  }
  pt->conversion = j->conversion;
  return 0;
}

static int plan(imp *im, const nwc_st_index *x, const char *index_label) {
  size_t total = 0;
  for (size_t i = 0; i < im->nsrc; i++) total += im->src[i].f->count;
  NWC_RETURN_IF(total == 0, -EBADMSG, "%s: no tensors", x ? index_label : im->src[0].label);
  name_ref *names = malloc(total * sizeof *names);
  im->jobs = calloc(total, sizeof *im->jobs);
  if (!names || !im->jobs) {
    free(names);
    return -ENOMEM;
  }
  size_t n = 0;
  for (size_t i = 0; i < im->nsrc; i++)
    for (size_t k = 0; k < im->src[i].f->count; k++)
      names[n++] = (name_ref){im->src[i].f->tensors[k].name, i, k};
  qsort(names, n, sizeof *names, cmp_name_ref);
  int rc = 0;
  for (size_t i = 1; rc == 0 && i < n; i++)
    if (!strcmp(names[i].name, names[i - 1].name))
      rc = nwc__fail(-EBADMSG, "%s%stensor '%s' is in both %s and %s", x ? index_label : "",
                     x ? ": " : "", names[i].name,
                     im->src[names[i - 1].src].label, im->src[names[i].src].label);
  if (rc == 0 && x) {
    for (size_t i = 0; rc == 0 && i < x->count; i++) {
      const name_ref *r = find_name(names, n, x->names[i]);
      if (!r)
        rc = nwc__fail(-EBADMSG, "%s: tensor '%s' is not in its shard %s", index_label,
                       x->names[i], x->shards[x->shard_of[i]]);
      else if (r->src != x->shard_of[i])
        rc = nwc__fail(-EBADMSG, "%s: tensor '%s' is listed in %s but found in %s", index_label,
                       x->names[i], x->shards[x->shard_of[i]], im->src[r->src].label);
    }
    if (rc == 0 && x->count != n) /* every index entry matched one tensor, so some are unlisted */
      for (size_t i = 0; rc == 0 && i < n; i++) {
        size_t k = 0;
        while (k < x->count && strcmp(x->names[k], names[i].name)) k++;
        if (k == x->count)
          rc = nwc__fail(-EBADMSG, "%s: tensor '%s' of %s is not in the index", index_label,
                         names[i].name, im->src[names[i].src].label);
      }
  }
  for (size_t i = 0; rc == 0 && i < n; i++) {
    job *j = &im->jobs[i];
    j->st = &im->src[names[i].src].f->tensors[names[i].idx];
    j->source = (unsigned)names[i].src;
  }
  if (rc == 0) qsort(im->jobs, n, sizeof *im->jobs, cmp_job_pos);
  /* In source order: the tensors to store move down to jobs[0, njobs), the others are skipped. */
  im->skips = rc ? NULL : malloc(n * sizeof *im->skips);
  if (rc == 0 && !im->skips) rc = -ENOMEM;
  for (size_t i = 0; rc == 0 && i < n; i++) {
    job j = im->jobs[i];
    rc = check_tensor(im, &j);
    if (rc == 0 && !storable(j.st)) {
      if (im->o.strict)
        rc = nwc__fail(-ENOTSUP,
                       "%s: tensor '%s' is %s, which nwc does not store (a strict import stores "
                       "every tensor or none; nwc stores " STORED_DTYPES ")",
                       im->src[j.source].label, j.st->name, unstorable_why(j.st));
      else im->skips[im->nskips++] = (skip_ref){j.st, j.source};
      continue;
    }
    if (rc == 0) {
      job *k = &im->jobs[im->njobs++];
      *k = j;
      rc = plan_tensor(im, k, names, n);
      im->total += k->st->end - k->st->begin;
    }
  }
  if (rc == 0 && im->njobs == 0)
    rc = nwc__fail(-ENOTSUP,
                   "%s: no tensor can be stored ('%s' is %s%s); nwc stores the floating-point "
                   "dtypes " STORED_DTYPES ", and no empty tensor",
                   x ? index_label : im->src[0].label, im->skips[0].st->name,
                   unstorable_why(im->skips[0].st), n > 1 ? ", and so are all the others" : "");
  /* Bias links: PREFIXweight -> PREFIXbias when that is 1 x rows (the rule of migration 2->3). */
  for (size_t i = 0; rc == 0 && i < n; i++) {
    job *j = &im->jobs[i];
    size_t len = strlen(j->st->name);
    if (len < 6 || strcmp(j->st->name + len - 6, "weight")) continue;
    char *bn = malloc(len + 1);
    if (!bn) {
      rc = -ENOMEM;
      break;
    }
    memcpy(bn, j->st->name, len - 6);
    strcpy(bn + len - 6, "bias");
    const name_ref *r = find_name(names, n, bn);
    free(bn);
    if (!r) continue;
    const nwc_st_tensor *b = &im->src[r->src].f->tensors[r->idx];
    if (!storable(b)) continue;
    uint64_t brows, bcols;
    nwc_st_matrix_shape(b, &brows, &bcols);
    if (brows == 1 && b->numel == j->pub.rows) j->pub.bias_tensor = b->name;
  }
  free(names);
  return rc;
}

/* ---- the whole import ----------------------------------------------------------------------- */

static int publish(imp *im) {
  nwc__pub_source *ps = calloc(im->nsrc, sizeof *ps);
  nwc__pub_tensor *pt = calloc(im->njobs, sizeof *pt);
  int rc = ps && pt ? 0 : -ENOMEM;
  for (size_t i = 0; rc == 0 && i < im->nsrc; i++)
    ps[i] = (nwc__pub_source){im->src[i].label, im->src[i].size, im->src[i].mtime_ns,
                              im->src[i].header_xxh3};
  for (size_t i = 0; rc == 0 && i < im->njobs; i++) pt[i] = im->jobs[i].pub;
  uint8_t hdr[NWC__CONTAINER_HEADER];
  nwc__container_header(im->cid, hdr);
  nwc__pub_model m = {im->model, im->o.elem, im->o.layout, ps, im->nsrc, pt, im->njobs,
                      im->cid, im->file_end, XXH3_64bits(hdr, sizeof hdr)};
  if (rc == 0) {
    nwc__lock(im->s);
    rc = nwc__catalog_publish(im->s->db, &m);
    nwc__unlock(im->s);
  }
  free(ps);
  free(pt);
  return rc;
}

static int run(imp *im) {
  nwc__lock(im->s);
  int rc = nwc__catalog_next_container(im->s->db, &im->cid);
  nwc__unlock(im->s);
  NWC_TRY(rc);
  char tmp[32], fin[32];
  nwc__container_name(im->cid, 1, tmp);
  nwc__container_name(im->cid, 0, fin);
  im->fd = openat(im->s->cdirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
  if (im->fd < 0) return nwc__fail(-errno, "%s/containers/%s: cannot create", im->s->dir, tmp);
  /* O_DIRECT for the large writes: blobs are 4096-aligned in the file and in memory (and their
   * pages disjoint, so buffered and direct writes never share one); a file system that refuses
   * it here (tmpfs) or at the first write gets buffered writes only. */
  im->dfd = openat(im->s->cdirfd, tmp, O_WRONLY | O_CLOEXEC | O_DIRECT);
  uint8_t hdr[NWC__CONTAINER_HEADER];
  nwc__container_header(im->cid, hdr);
  rc = pwrite_full(im->fd, hdr, sizeof hdr, 0);
  im->file_end = NWC__CONTAINER_HEADER;
  if (rc < 0) rc = nwc__fail(rc, "%s/containers/%s: write", im->s->dir, tmp);
  if (rc == 0) rc = encode_all(im);
  if (rc == 0 && fsync(im->fd) < 0) rc = nwc__fail(-errno, "%s/containers/%s: fsync", im->s->dir, tmp);
  close(im->fd);
  if (im->dfd >= 0) close(im->dfd);
  im->fd = im->dfd = -1;
  int renamed = 0;
  if (rc == 0) {
    if (renameat(im->s->cdirfd, tmp, im->s->cdirfd, fin) < 0)
      rc = nwc__fail(-errno, "%s/containers/%s: rename", im->s->dir, tmp);
    else renamed = 1;
  }
  if (rc == 0) rc = nwc__store_sync_dir(im->s);
  if (rc == 0) rc = publish(im);
  if (rc < 0) {
    unlinkat(im->s->cdirfd, renamed ? fin : tmp, 0);
    fsync(im->s->cdirfd);
  }
  return rc;
}

static int import_core(nwc_store *s, const char *model, const nwc_st_index *x,
                       const char *index_label, src_file *src, size_t nsrc,
                       const nwc_import_opts *opts) {
  imp im = {0};
  im.s = s;
  im.model = model;
  im.src = src;
  im.nsrc = nsrc;
  im.fd = im.dfd = -1;
  if (opts) im.o = *opts;
  int rc = plan(&im, x, index_label);
  if (rc == 0) rc = run(&im);
  for (size_t i = 0; rc == 0 && im.o.skipped && i < im.nskips; i++) {
    const nwc_st_tensor *st = im.skips[i].st;
    nwc_import_skip t = {src[im.skips[i].source].label, st->name, st->dtype, st->ndim, st->shape};
    im.o.skipped(im.o.skipped_ctx, &t);
  }
  for (size_t i = 0; i < im.njobs; i++) free(im.jobs[i].pub.checksums);
  free(im.jobs);
  free(im.skips);
  free(im.order);
  free(im.wq);
  for (unsigned k = 0; im.slots && k < im.nslots; k++) free(im.slots[k].p);
  free(im.slots);
  return rc;
}

static int check_common(nwc_store *s, const char *model, const nwc_import_opts *o) {
  NWC_RETURN_IF(!s || !model, -EINVAL, "import: missing argument");
  NWC_RETURN_IF(s->flags & NWC_STORE_RDONLY, -EROFS, "%s: store opened read-only", s->dir);
  NWC_RETURN_IF(!nwc_model_name_valid(model), -EINVAL,
                "model name '%s' does not match [A-Za-z0-9][A-Za-z0-9._-]{0,127}", model);
  NWC_RETURN_IF(o && o->elem != NWC_ELEM_BF16 && o->elem != NWC_ELEM_FP8, -EINVAL,
                "import: elem %u is neither bf16 nor fp8", o->elem);
  NWC_RETURN_IF(o && o->layout > 15, -EINVAL, "import: layout %u out of range", o->layout);
  int64_t id;
  nwc__lock(s);
  int rc = nwc__catalog_model_id(s->db, model, &id);
  nwc__unlock(s);
  NWC_RETURN_IF(rc == 0, -EEXIST, "model '%s' already exists", model);
  return rc == -ENOENT ? 0 : rc;
}

static int open_src(int fd, const char *label, src_file *sf) {
  struct stat st;
  if (fstat(fd, &st) < 0) return nwc__fail(-errno, "%s: fstat", label);
  NWC_RETURN_IF(!S_ISREG(st.st_mode), -EINVAL, "%s: not a regular file", label);
  int rc = nwc_st_read_fd(fd, &sf->f);
  if (rc < 0) return nwc__fail_prefix(rc, "%s", label);
  sf->label = label;
  sf->fd = fd;
  sf->size = (uint64_t)st.st_size;
  sf->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
  sf->header_xxh3 = XXH3_64bits(sf->f->map + 8, sf->f->data_offset - 8);
  return 0;
}

static int read_index(int fd, const char *label, nwc_st_index **x) {
  struct stat st;
  if (fstat(fd, &st) < 0) return nwc__fail(-errno, "%s: fstat", label);
  NWC_RETURN_IF(!S_ISREG(st.st_mode) || st.st_size > (100 << 20), -EBADMSG,
                "%s: not a regular file of at most 100 MB", label);
  uint8_t *buf = malloc((size_t)st.st_size + 1);
  if (!buf) return -ENOMEM;
  int rc = nwc__pread_full(fd, buf, (uint64_t)st.st_size, 0);
  if (rc < 0) rc = nwc__fail(rc, "%s: read", label);
  if (rc == 0) rc = nwc_st_index_parse(buf, (size_t)st.st_size, x);
  if (rc < 0 && rc != -ENOMEM && rc != -EIO) rc = nwc__fail_prefix(rc, "%s", label);
  free(buf);
  return rc;
}

/* Shared by both entry points: files[i] are already open. */
static int import_open(nwc_store *s, const char *model, int index_fd, const char *index_label,
                       const nwc_st_index *x, const nwc_import_file *files, size_t nfiles,
                       const nwc_import_opts *opts) {
  size_t nsrc = x ? x->nshards : 1;
  src_file *src = calloc(nsrc, sizeof *src);
  if (!src) return -ENOMEM;
  int rc = 0;
  (void)index_fd;
  for (size_t i = 0; rc == 0 && i < nsrc; i++) {
    size_t k = 0;
    if (x)
      while (k < nfiles && strcmp(files[k].name ? files[k].name : "", x->shards[i])) k++;
    if (k == nfiles)
      rc = nwc__fail(-ENOENT, "%s: names shard '%s', which is missing", index_label,
                     x->shards[i]);
    else rc = open_src(files[k].fd, files[k].name ? files[k].name : "(file)", &src[i]);
  }
  if (rc == 0 && x && nfiles > nsrc)
    rc = nwc__fail(-EINVAL, "%s: %zu files given for %zu shards", index_label, nfiles, nsrc);
  if (rc == 0) rc = import_core(s, model, x, index_label, src, nsrc, opts);
  for (size_t i = 0; i < nsrc; i++) nwc_st_close(src[i].f);
  free(src);
  return rc;
}

int nwc_store_import_fds(nwc_store *s, const char *model, int index_fd,
                         const nwc_import_file *files, size_t nfiles, const nwc_import_opts *opts) {
  NWC_TRY(check_common(s, model, opts));
  NWC_RETURN_IF(!files || nfiles == 0 || (index_fd < 0 && nfiles != 1), -EINVAL,
                "import: %zu files without an index", nfiles);
  if (index_fd < 0) return import_open(s, model, -1, NULL, NULL, files, 1, opts);
  nwc_st_index *x = NULL;
  int rc = read_index(index_fd, "index", &x);
  if (rc == 0) rc = import_open(s, model, index_fd, "index", x, files, nfiles, opts);
  nwc_st_index_free(x);
  return rc;
}

int nwc_store_import(nwc_store *s, const char *model, const char *path,
                     const nwc_import_opts *opts) {
  NWC_TRY(check_common(s, model, opts));
  NWC_RETURN_IF(!path, -EINVAL, "import: no path");
  size_t len = strlen(path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nwc__fail(-errno, "%s: cannot open: %s", path, strerror(errno));
  if (len < 5 || strcmp(path + len - 5, ".json")) {
    nwc_import_file f = {path, fd};
    int rc = import_open(s, model, -1, NULL, NULL, &f, 1, opts);
    close(fd);
    return rc;
  }
  nwc_st_index *x = NULL;
  int rc = read_index(fd, path, &x);
  close(fd);
  nwc_import_file *files = rc ? NULL : calloc(x->nshards, sizeof *files);
  char **paths = rc ? NULL : calloc(x->nshards, sizeof *paths);
  if (rc == 0 && (!files || !paths)) rc = -ENOMEM;
  const char *slash = strrchr(path, '/');
  int dlen = slash ? (int)(slash - path) : 1;
  const char *dir = slash ? path : ".";
  size_t opened = 0;
  for (size_t i = 0; rc == 0 && i < x->nshards; i++) {
    size_t n = (size_t)dlen + strlen(x->shards[i]) + 2;
    if (!(paths[i] = malloc(n))) {
      rc = -ENOMEM;
      break;
    }
    snprintf(paths[i], n, "%.*s/%s", dlen, dir, x->shards[i]);
    files[i].name = x->shards[i];
    files[i].fd = open(paths[i], O_RDONLY | O_CLOEXEC);
    if (files[i].fd < 0)
      rc = nwc__fail(-errno, "%s: names shard '%s', which is missing (%s)", path, x->shards[i],
                     strerror(errno));
    else opened++;
  }
  if (rc == 0) {
    /* Label each source with its path for messages and the catalog. */
    for (size_t i = 0; i < x->nshards; i++) files[i].name = paths[i];
    for (size_t i = 0; i < x->nshards; i++) {
      free(x->shards[i]);
      x->shards[i] = strdup(paths[i]);
      if (!x->shards[i]) rc = -ENOMEM;
    }
  }
  if (rc == 0) rc = import_open(s, model, -1, path, x, files, x->nshards, opts);
  for (size_t i = 0; i < opened; i++) close(files[i].fd);
  for (size_t i = 0; paths && i < x->nshards; i++) free(paths[i]);
  free(paths);
  free(files);
  nwc_st_index_free(x);
  return rc;
}
