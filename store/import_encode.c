/*
 * import_encode.c - the import's encode phase: tensors largest first, the large ones one at a
 * time on all threads (nwc__enc_*), the rest one per worker thread; each tensor's blob head is
 * encoded in place and its raw plane made and checksummed chunk by chunk, every piece queued for
 * the writer thread (import_write.c) as soon as it is made.  The calling thread reports progress.
 *
 * Small blobs (nwc__blob_layout.packed: under NWC_STORE_PACK_MAX) are packed: each is copied, as
 * it is finished, to the end of the current run (a PACK_BYTES buffer, at a multiple of 64); a
 * run that has no room for the next blob, and the last one, is closed: rounded up to 4096 with
 * zeros that its last blob takes, given its place in the file like a large blob, each blob's
 * checksum taken, and queued for writing.  So every run, like every large blob, starts and ends
 * on a multiple of 4096 and the blobs still tile the file.
 */
#include "import_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xxh_x86dispatch.h> /* the chunk checksums on the widest vectors the CPU has */
#endif

/* Chunks of a blob's raw plane written as they are made (no buffer for the whole plane): buffers
 * per encoder thread, and the most writes queued at once. */
#define SLOTS_PER_THREAD 3

/* Tensors from this size on are read by the encoder piece by piece, not into a buffer. */
#define READ_PIECES_BYTES (UINT64_C(8) << 20)

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
    if (rc < 0) /* only reads fail */
      rc = nwc__imp_read_error(&im->src[sm->j->source], sm->j->st, rc);
    pt->checksums[sm->k0 + i] = XXH3_64bits(slot->p, upto - from);
  }
  pthread_mutex_lock(&im->mu);
  nwc__imp_set_error(im, rc);
  slot->busy = 0;
  if (rc == 0) nwc__imp_enqueue(im, slot->p, upto - from, pt->offset + from, sm->j, &slot->busy);
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

/* A run of packed blobs is written from a buffer of this size (at least NWC_STORE_PACK_MAX). */
#define PACK_BYTES NWC_STORE_CHUNK

/* Closes the current run of packed blobs (im->mu held): zeros to the next multiple of 4096 (the
 * last blob's), its place at the end of the file, each blob's offset and checksum, its write
 * queued; then the other buffer becomes the current run, once its write is done. */
static void pack_close(imp *im) {
  if (!im->pack_n) return;
  wbuf *b = &im->pack[im->pack_cur];
  uint64_t size = nwc__round_up(im->pack_used, NWC_STORE_ALIGN);
  memset(b->p + im->pack_used, 0, size - im->pack_used);
  job *last = im->pack_jobs[im->pack_n - 1];
  last->pub.length += size - im->pack_used;
  last->pub.L.length = last->pub.length;
  for (size_t k = 0; k < im->pack_n; k++) {
    nwc__pub_tensor *pt = &im->pack_jobs[k]->pub; /* offset: in the run, until now */
    pt->checksums[0] = XXH3_64bits(b->p + pt->offset, pt->length);
    pt->offset += im->file_end;
  }
  nwc__imp_enqueue(im, b->p, size, im->file_end, last, &b->busy);
  im->file_end += size;
  im->pack_n = 0, im->pack_used = 0;
  im->pack_cur ^= 1;
  nwc__imp_wbuf_wait(im, &im->pack[im->pack_cur]);
}

/* Appends job j's packed blob, its len bytes at p, to the current run (im->mu held), closing the
 * run first if it has no room. */
static int pack_add(imp *im, job *j, const uint8_t *p, uint64_t len) {
  if (im->pack_used + len > PACK_BYTES) pack_close(im);
  wbuf *b = &im->pack[im->pack_cur];
  NWC_TRY(wbuf_reserve(b, PACK_BYTES));
  if (im->pack_n == im->pack_cap) {
    size_t cap = im->pack_cap ? 2 * im->pack_cap : 64;
    job **a = realloc(im->pack_jobs, cap * sizeof *a);
    if (!a) return -ENOMEM;
    im->pack_jobs = a, im->pack_cap = cap;
  }
  memcpy(b->p + im->pack_used, p, len);
  j->pub.offset = im->pack_used;
  im->pack_jobs[im->pack_n++] = j;
  im->pack_used += len;
  return 0;
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
                         rd ? nwc__imp_read_part : NULL, rd, NULL, psym, &e));
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
    if (!L->packed) place(im, j); /* a packed blob's is its run's (pack_add) */
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
  int direct = layout0 && j->conv == CONV_NONE && !j->quantize &&
               st->end - st->begin >= READ_PIECES_BYTES;
  part_src rd = {sf, st};
  uint8_t *q = NULL;
  float *scale = NULL;
  if (!direct) {
    NWC_TRY(wbuf_reserve(&wb->src, st->end - st->begin));
    NWC_TRY(nwc__imp_read_tensor(sf, st, wb->src.p));
  }
  const void *w = wb->src.p;
  int rc = 0;
  if (j->conv != CONV_NONE) {
    NWC_TRY(wbuf_reserve(&wb->conv, n * 2));
    uint16_t *bf = (uint16_t *)wb->conv.p;
    for (uint64_t i = 0; i < n; i++)
      bf[i] = j->conv == CONV_F64 ? nwc__imp_f64_to_bf16(wb->src.p, i)
                                  : nwc_f32_to_bf16(nwc__imp_load_float(st->dtype, wb->src.p, i));
    w = bf;
  }
  if (j->quantize) {
    q = malloc(n);
    scale = malloc(rows * sizeof *scale);
    rc = q && scale ? nwc_quantize_fp8(w, rows, cols, q, scale) : -ENOMEM;
    w = q;
  } else if (j->fold) {
    rc = nwc__imp_read_scale(im, j, &scale);
  }
  nwc__pub_tensor *pt = &j->pub;
  uint64_t head = 0;
  int named = 0; /* the detail names the file and the tensor already */
  if (rc == 0 && layout0) {
    rc = encode_in_place(im, j, w, direct ? &rd : NULL, scale, threads, blob, &head);
    if (rc < 0 && direct && rc != -EINVAL && rc != -ENOMEM)
      rc = nwc__imp_read_error(sf, st, rc), named = 1;
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
      if (!pt->L.packed) place(im, j);
    }
    nwc_tensor_release(&t);
  }
  free(q);
  free(scale);
  if (rc < 0)
    return rc == -ENOMEM || named ? rc
                                  : nwc__fail_prefix(rc, "%s: tensor '%s'", sf->label, st->name);
  if (pt->L.packed) { /* all of it is in blob: copied into the run, checksummed there */
    pthread_mutex_lock(&im->mu);
    rc = im->err ? 0 : pack_add(im, j, blob->p, head);
    pthread_mutex_unlock(&im->mu);
    return rc;
  }
  sum_task c = {blob->p, head, pt->checksums};
  nwc__parallel_for(threads, nwc__chunks(head, NWC_STORE_CHUNK), sum_chunk, &c);
  pthread_mutex_lock(&im->mu);
  nwc__imp_enqueue(im, blob->p, head, pt->offset, j, &blob->busy);
  pthread_mutex_unlock(&im->mu);
  return 0;
}

/* Records an encoded job (im->mu held): its error, its progress. */
static void job_done(imp *im, job *j, int rc) {
  nwc__imp_set_error(im, rc);
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
    nwc__imp_wbuf_wait(im, b);
    pthread_mutex_unlock(&im->mu);
    int rc = encode_job(im, j, &wb, b, 1);
    pthread_mutex_lock(&im->mu);
    job_done(im, j, rc);
  }
  for (int i = 0; i < 2; i++) nwc__imp_wbuf_wait(im, &wb.blob[i]);
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

int nwc__imp_encode_all(imp *im) {
  unsigned nt = im->o.threads;
  if (nt == 0) {
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    nt = c > 0 ? (unsigned)c : 1;
  }
  if (nt > NWC__MAX_THREADS) nt = NWC__MAX_THREADS;
  im->nslots = nt * SLOTS_PER_THREAD;
  im->wq_cap = im->nslots + 2 * (size_t)nt + 4; /* every buffer's write at once (the two
                                                   runs of packed blobs' too) */
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
  int writing = pthread_create(&wtid, NULL, nwc__imp_writer, im) == 0;
  if (!writing) im->err = nwc__fail(-EAGAIN, "import: cannot start the writer thread");
  uint64_t last = UINT64_MAX;
  wbufs team = {0};
  for (unsigned k = 0; nt > 1 && !im->err && !im->cancel && im->next < im->njobs; k++) {
    job *j = &im->jobs[im->order[im->next]];
    if (j->st->end - j->st->begin < TEAM_BYTES) break;
    im->next++;
    wbuf *b = &team.blob[k & 1];
    nwc__imp_wbuf_wait(im, b);
    pthread_mutex_unlock(&im->mu);
    int rc = encode_job(im, j, &team, b, nt);
    pthread_mutex_lock(&im->mu);
    job_done(im, j, rc);
    report(im, &last);
  }
  for (int i = 0; i < 2; i++) nwc__imp_wbuf_wait(im, &team.blob[i]);
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
  if (!im->err && !im->cancel) pack_close(im);
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
