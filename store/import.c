/*
 * import.c - safetensors (single file or sharded) into the store: plan, encode on a thread pool,
 * write one container, publish in one transaction.
 *
 * Phases, each finishing before the next starts:
 *   1. plan    parse every file (store/safetensors.c) and the index; check names, dtypes, shapes,
 *              duplicates across shards, that the index and the shards agree, and that the model
 *              name is free.  Any bad input fails here, before a byte is written.
 *   2. encode  worker threads take tensors largest first, convert (F16/F32 -> BF16 by round to
 *              nearest even, optional BF16 -> fp8 per row), encode (nwc_tensor_encode, one tensor
 *              per thread), lay out the blob, checksum its chunks and pwrite it at the next
 *              4096-aligned offset of DIR/containers/ID.tmp.  The calling thread waits and reports
 *              progress; the first error stops the others.
 *   3. publish fsync the file, rename it to ID.nwc, fsync the directory, then one SQLite
 *              transaction inserts the model.  Any failure unlinks the file.  A crash anywhere
 *              leaves a file that the next open sweeps (store.c).
 * Parallelism is across tensors: a model whose bytes sit in one huge tensor encodes on one core.
 */
#include "store_internal.h"

#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "safetensors.h"

typedef struct src_file {
  const char *label; /* path or name used in messages and recorded in the catalog */
  int fd;            /* tensor bytes are pread from it (never mapped: no SIGBUS if it shrinks) */
  nwc_st_file *f;    /* its header (nwc_st_read_fd) */
  uint64_t size;
  int64_t mtime_ns;
  uint64_t header_xxh3;
} src_file;

enum conv { CONV_NONE, CONV_F16, CONV_F32 };

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

typedef struct imp {
  nwc_store *s;
  const char *model;
  nwc_import_opts o;
  src_file *src;
  size_t nsrc;
  job *jobs;
  size_t njobs;
  size_t *order;
  uint64_t total;
  /* encode phase */
  int fd;
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

/* Element i of a float tensor (F32, F16 or BF16) at possibly unaligned p. */
static float load_float(const char *dtype, const uint8_t *p, uint64_t i) {
  if (!strcmp(dtype, "F32")) {
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, p + 2 * i, 2);
  return !strcmp(dtype, "F16") ? f16_to_f32(h) : nwc_bf16_to_f32(h);
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

/* A worker's buffer, reused from tensor to tensor (no page faults on every tensor). */
typedef struct wbuf {
  uint8_t *p;
  uint64_t cap;
} wbuf;

static int wbuf_reserve(wbuf *b, uint64_t n, uint64_t align) {
  if (n <= b->cap && b->p) return 0;
  void *p = NULL;
  free(b->p);
  b->p = NULL, b->cap = 0;
  if (posix_memalign(&p, align, n ? n : 1)) return -ENOMEM;
  b->p = p, b->cap = n;
  return 0;
}

/* Reads a tensor's bytes from its source file into dst. */
static int read_tensor(const src_file *sf, const nwc_st_tensor *st, void *dst) {
  int rc = nwc__pread_full(sf->fd, dst, st->end - st->begin, sf->f->data_offset + st->begin);
  if (rc < 0)
    return nwc__fail(rc == -EIO ? -EBADMSG : rc,
                     "%s: tensor '%s': cannot read its %llu bytes (did the file shrink?)",
                     sf->label, st->name, (unsigned long long)(st->end - st->begin));
  return 0;
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

typedef struct wbufs {
  wbuf blob, src, conv;
} wbufs;

/* Encodes job j into the worker's blob buffer. */
static int encode_job(imp *im, job *j, wbufs *wb) {
  const src_file *sf = &im->src[j->source];
  const nwc_st_tensor *st = j->st;
  uint64_t rows = j->pub.rows, cols = j->pub.cols, n = st->numel;
  uint8_t *q = NULL;
  float *scale = NULL;
  NWC_TRY(wbuf_reserve(&wb->src, st->end - st->begin, 64));
  NWC_TRY(read_tensor(sf, st, wb->src.p));
  const void *w = wb->src.p;
  int rc = 0;
  if (j->conv != CONV_NONE) {
    NWC_TRY(wbuf_reserve(&wb->conv, n * 2, 64));
    uint16_t *bf = (uint16_t *)wb->conv.p;
    for (uint64_t i = 0; i < n; i++) bf[i] = nwc_f32_to_bf16(load_float(st->dtype, wb->src.p, i));
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
  nwc_tensor t = {0};
  if (rc == 0) rc = nwc_tensor_encode(w, rows, cols, j->pub.elem, scale, &t);
  free(q);
  free(scale);
  if (rc < 0) return nwc__fail_prefix(rc, "%s: tensor '%s'", sf->label, st->name);
  nwc__pub_tensor *pt = &j->pub;
  nwc__blob_layout_of(&t, &pt->L);
  pt->checksums = malloc(nwc__chunks(pt->L.length, NWC_STORE_CHUNK) * 8);
  if (!pt->checksums || wbuf_reserve(&wb->blob, pt->L.length, NWC_STORE_ALIGN) < 0) {
    nwc_tensor_release(&t);
    return -ENOMEM;
  }
  nwc__blob_write(&t, im->cid, &pt->L, wb->blob.p);
  nwc__blob_checksums(wb->blob.p, pt->L.length, pt->checksums);
  memcpy(pt->psym, t.psym, 16);
  pt->nblocks = t.nblocks;
  pt->data_bytes = t.data_bytes;
  pt->raw_plane_bytes = t.raw_bytes;
  pt->length = pt->L.length;
  nwc_tensor_release(&t);
  return 0;
}

static void *worker(void *arg) {
  imp *im = arg;
  wbufs wb = {{NULL, 0}, {NULL, 0}, {NULL, 0}};
  pthread_mutex_lock(&im->mu);
  while (!im->err && !im->cancel && im->next < im->njobs) {
    job *j = &im->jobs[im->order[im->next++]];
    pthread_mutex_unlock(&im->mu);
    int rc = encode_job(im, j, &wb);
    pthread_mutex_lock(&im->mu);
    if (rc == 0) {
      j->pub.offset = im->file_end;
      im->file_end += j->pub.length;
      pthread_mutex_unlock(&im->mu);
      rc = pwrite_full(im->fd, wb.blob.p, j->pub.length, j->pub.offset);
      if (rc < 0) rc = nwc__fail(rc, "%s/containers: writing tensor '%s'", im->s->dir, j->st->name);
      /* Start writeback of big blobs now, so that the fsync before publishing has little left
       * to do (small ones are left to that fsync: a syscall each would cost more). */
      if (rc == 0 && j->pub.length >= NWC_STORE_CHUNK)
        (void)sync_file_range(im->fd, (off64_t)j->pub.offset, (off64_t)j->pub.length,
                              SYNC_FILE_RANGE_WRITE);
      pthread_mutex_lock(&im->mu);
    }
    if (rc < 0 && !im->err) {
      im->err = rc;
      snprintf(im->errmsg, sizeof im->errmsg, "%s", nwc_error_detail());
    }
    im->done += j->st->end - j->st->begin;
    pthread_cond_broadcast(&im->cv);
  }
  im->running--;
  pthread_cond_broadcast(&im->cv);
  pthread_mutex_unlock(&im->mu);
  free(wb.blob.p);
  free(wb.src.p);
  free(wb.conv.p);
  return NULL;
}

static int cmp_job_size(const void *a, const void *b, void *ctx) {
  const job *jobs = ctx, *x = &jobs[*(const size_t *)a], *y = &jobs[*(const size_t *)b];
  uint64_t nx = x->st->numel, ny = y->st->numel;
  return (nx < ny) - (nx > ny);
}

static int encode_all(imp *im) {
  im->order = malloc(im->njobs * sizeof *im->order);
  if (!im->order) return -ENOMEM;
  for (size_t i = 0; i < im->njobs; i++) im->order[i] = i;
  qsort_r(im->order, im->njobs, sizeof *im->order, cmp_job_size, im->jobs);
  unsigned nt = im->o.threads;
  if (nt == 0) {
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    nt = c > 0 ? (unsigned)c : 1;
  }
  if (nt > im->njobs) nt = (unsigned)im->njobs;
  if (nt > 256) nt = 256;
  pthread_t tid[256];
  pthread_mutex_init(&im->mu, NULL);
  pthread_cond_init(&im->cv, NULL);
  pthread_mutex_lock(&im->mu);
  unsigned started = 0;
  for (; started < nt; started++) {
    if (pthread_create(&tid[started], NULL, worker, im)) break;
    im->running++;
  }
  if (started == 0) im->err = nwc__fail(-EAGAIN, "import: cannot start a worker thread");
  uint64_t last = UINT64_MAX;
  for (;;) {
    if (im->o.progress && im->done != last && !im->cancel) {
      uint64_t d = last = im->done;
      pthread_mutex_unlock(&im->mu);
      int stop = im->o.progress(im->o.progress_ctx, d, im->total);
      pthread_mutex_lock(&im->mu);
      if (stop) im->cancel = 1;
      continue;
    }
    if (im->running == 0) break;
    pthread_cond_wait(&im->cv, &im->mu);
  }
  pthread_mutex_unlock(&im->mu);
  for (unsigned i = 0; i < started; i++) pthread_join(tid[i], NULL);
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

static int plan_tensor(imp *im, job *j, const name_ref *names, size_t nnames) {
  const src_file *sf = &im->src[j->source];
  const nwc_st_tensor *st = j->st;
  const char *f = sf->label, *nm = st->name;
  NWC_RETURN_IF(!nwc_tensor_name_valid(nm), -EBADMSG,
                "%s: tensor name '%s' is not UTF-8 without control characters", f, nm);
  NWC_RETURN_IF(!st->dtype_size, -EBADMSG, "%s: tensor '%s': unknown dtype '%s'", f, nm,
                st->dtype);
  int bf16 = !strcmp(st->dtype, "BF16"), f16 = !strcmp(st->dtype, "F16");
  int f32 = !strcmp(st->dtype, "F32"), f8 = !strcmp(st->dtype, "F8_E4M3");
  NWC_RETURN_IF(!bf16 && !f16 && !f32 && !f8, -ENOTSUP,
                "%s: tensor '%s': dtype %s cannot be stored (BF16, F16, F32, F8_E4M3 can)", f, nm,
                st->dtype);
  NWC_RETURN_IF(st->numel == 0, -ENOTSUP, "%s: tensor '%s': empty tensors cannot be stored", f,
                nm);
  nwc__pub_tensor *pt = &j->pub;
  pt->name = nm;
  pt->ndim = st->ndim;
  memcpy(pt->shape, st->shape, sizeof pt->shape);
  pt->dtype = st->dtype;
  pt->source = j->source;
  pt->rows = st->ndim >= 2 ? st->shape[0] : 1;
  pt->cols = st->numel / pt->rows;
  pt->source_bytes = st->end - st->begin;
  j->conv = f16 ? CONV_F16 : f32 ? CONV_F32 : CONV_NONE;
  j->quantize = !f8 && im->o.elem == NWC_ELEM_FP8 && st->ndim >= 2;
  unsigned type = f8 || j->quantize ? NWC_ELEM_FP8 : NWC_ELEM_BF16;
  pt->elem = NWC_ELEM(type, im->o.layout);
  pt->raw_bytes = st->numel * (type == NWC_ELEM_FP8 ? 1 : 2);
  uint64_t lay[4];
  int rc = nwc_layout(pt->rows, pt->cols, pt->elem, lay);
  if (rc < 0) return nwc__fail_prefix(rc, "%s: tensor '%s'", f, nm);
  const char *c = j->conv == CONV_F16 ? "f16->bf16 rne" : j->conv == CONV_F32 ? "f32->bf16 rne"
                                                                              : "none";
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
      if (!r) continue;
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
  if (rc == 0) {
    im->njobs = n;
    qsort(im->jobs, n, sizeof *im->jobs, cmp_job_pos);
  }
  for (size_t i = 0; rc == 0 && i < n; i++) {
    rc = plan_tensor(im, &im->jobs[i], names, n);
    im->total += im->jobs[i].st->end - im->jobs[i].st->begin;
  }
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
    uint64_t brows = b->ndim >= 2 ? b->shape[0] : 1;
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
  uint8_t hdr[NWC__CONTAINER_HEADER];
  nwc__container_header(im->cid, hdr);
  rc = pwrite_full(im->fd, hdr, sizeof hdr, 0);
  im->file_end = NWC__CONTAINER_HEADER;
  if (rc < 0) rc = nwc__fail(rc, "%s/containers/%s: write", im->s->dir, tmp);
  if (rc == 0) rc = encode_all(im);
  if (rc == 0 && fsync(im->fd) < 0) rc = nwc__fail(-errno, "%s/containers/%s: fsync", im->s->dir, tmp);
  close(im->fd);
  im->fd = -1;
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
  im.fd = -1;
  if (opts) im.o = *opts;
  int rc = plan(&im, x, index_label);
  if (rc == 0) rc = run(&im);
  for (size_t i = 0; i < im.njobs; i++) free(im.jobs[i].pub.checksums);
  free(im.jobs);
  free(im.order);
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
