/*
 * ops_compute.c - dequant, gather and matvec on the host's decoders or a device copy.  Compute
 * holds residency references (nwcd_res_acquire / nwcd_res_release) for exactly the time it
 * reads the weights.  Bulk output goes inline up to the frame maximum or into the connection's
 * shared region at the offset the request names, checked against its size.  Matvec jobs that
 * the pool chained on job->batch (nwcd_ops_can_batch, the pool's batching rule) share one
 * nwc_matvec_batch pass.
 */
#include "ops.h"
#include "ops_internal.h"

#include "nwcd.h"

#include "nwc_error.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where the output of bytes goes: inline (reserved in w after the compute header) or the shared
 * region; checks the request's offsets against the region's size. */
static int out_place(nwcd_job *j, uint64_t bytes, nwc_pw *w, nwc_proto_compute *c, void **dst) {
  const nwc_proto_req *r = &j->req;
  c->bytes = bytes, c->where = r->where, c->out = r->out;
  if (r->where == NWC_WHERE_SHM) {
    NWC_RETURN_IF(!j->shm, -EINVAL, "no shared region: pass one (shm) before using it");
    NWC_RETURN_IF(r->out_off > j->shm_size || bytes > j->shm_size - r->out_off, -EINVAL,
                  "output of %llu bytes at offset %llu overruns the shared region of %llu bytes",
                  (unsigned long long)bytes, (unsigned long long)r->out_off,
                  (unsigned long long)j->shm_size);
    NWC_RETURN_IF(bytes > r->out_cap, -EINVAL,
                  "output of %llu bytes does not fit the %llu bytes the request offers",
                  (unsigned long long)bytes, (unsigned long long)r->out_cap);
    nwc_proto_put_compute(w, c);
    *dst = j->shm + r->out_off;
    return 0;
  }
  NWC_RETURN_IF(bytes > NWC_PROTO_MAX_PAYLOAD - 64, -EMSGSIZE,
                "output of %llu bytes is larger than a frame (%u); use a shared region",
                (unsigned long long)bytes, NWC_PROTO_MAX_PAYLOAD);
  nwc_proto_put_compute(w, c);
  *dst = nwc_pw_reserve(w, bytes);
  NWC_RETURN_IF(!*dst, -ENOMEM, "no memory for %llu bytes of output", (unsigned long long)bytes);
  return 0;
}

/* Copies n rows of K16-strided BF16 into dst as dense rows of K, BF16 or fp32. */
static void emit_rows(const uint16_t *src, uint64_t n, uint64_t K, uint64_t K16, int out, void *dst) {
  for (uint64_t i = 0; i < n; i++) {
    const uint16_t *s = src + i * K16;
    if (out == NWC_OUT_BF16) {
      memcpy((uint8_t *)dst + i * K * 2, s, K * 2);
    } else {
      float *f = (float *)((uint8_t *)dst + i * K * 4);
      for (uint64_t k = 0; k < K; k++) {
        float v = nwc_bf16_to_f32(s[k]);
        memcpy(&f[k], &v, 4);
      }
    }
  }
}

static uint64_t k16_of(uint64_t K) { return (K + 15) & ~UINT64_C(15); }

typedef struct dq_ctx {
  nwcd *d;
  const nwc_tensor *t;
  uint64_t br, nrb, parts, K, K16;
  int out;
  uint16_t *dec; /* decode target, row stride K16 */
  void *dst;     /* final output, dense */
  bool direct;   /* dec is dst */
  atomic_int rc;
} dq_ctx;

/* Part i of a dequant: its row blocks decoded, then (unless direct) compacted into dst. */
static void dq_part(void *ctx, uint64_t i) {
  dq_ctx *c = ctx;
  uint64_t rb0 = c->nrb * i / c->parts, rb1 = c->nrb * (i + 1) / c->parts;
  if (rb0 == rb1) return;
  uint64_t M = c->t->rows, r0 = rb0 * c->br, r1 = rb1 * c->br < M ? rb1 * c->br : M;
  int rc = c->d->backend->dequant(c->t, rb0, rb1, c->dec + r0 * c->K16);
  if (rc < 0) {
    int zero = 0;
    atomic_compare_exchange_strong(&c->rc, &zero, rc);
    return;
  }
  if (!c->direct)
    emit_rows(c->dec + r0 * c->K16, r1 - r0, c->K, c->K16, c->out,
              (uint8_t *)c->dst + r0 * c->K * (c->out == NWC_OUT_BF16 ? 2 : 4));
}

int nwcd_op_dequant_gather(nwcd_job *j) {
  nwcd *d = j->d;
  nwc_proto_req *r = &j->req;
  nwcd_ref ref;
  NWC_TRY(nwcd_res_acquire(d->res, r->model, r->tensor, NWCD_ACQ_MAP_OK, &ref, NULL));
  const nwc_tensor *t = &ref.view;
  uint64_t M = t->rows, K = t->cols, K16 = k16_of(K);
  uint64_t n = r->op == NWC_OP_GATHER ? r->nrows : M;
  uint64_t *rows = NULL;
  uint16_t *tmp = NULL;
  int rc = 0;
  if (r->op == NWC_OP_GATHER) {
    rows = malloc(n * sizeof *rows);
    if (!rows) rc = -ENOMEM;
    for (uint64_t i = 0; rc == 0 && i < n; i++) {
      memcpy(&rows[i], r->rows + 8 * i, 8);
      if (rows[i] >= M)
        rc = nwc__fail(-EINVAL, "row %llu of %s/%s is out of range (%llu rows)",
                       (unsigned long long)rows[i], r->model, r->tensor, (unsigned long long)M);
    }
  }
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_compute c = {.rows = n, .cols = K, .rflags = ref.transient ? NWC_RF_MAPPED : 0};
  void *dst = NULL;
  if (rc == 0) rc = out_place(j, n * K * (r->out == NWC_OUT_BF16 ? 2 : 4), &w, &c, &dst);
  bool direct = rc == 0 && r->op == NWC_OP_DEQUANT && r->out == NWC_OUT_BF16 && K16 == K &&
                ((uintptr_t)dst & 1) == 0;
  if (rc == 0 && !direct && !(tmp = malloc(n * K16 * 2 + 64))) rc = -ENOMEM;
  if (rc == 0 && r->op == NWC_OP_GATHER) {
    rc = ref.dcopy ? d->backend->dev_gather(ref.dcopy, rows, n, tmp)
                   : d->backend->gather(t, rows, n, tmp);
    if (rc == 0) emit_rows(tmp, n, K, K16, r->out, dst);
  } else if (rc == 0 && ref.dcopy) { /* one kernel for the whole tensor */
    rc = d->backend->dev_dequant(ref.dcopy, direct ? (uint16_t *)dst : tmp);
    if (rc == 0 && !direct) emit_rows(tmp, n, K, K16, r->out, dst);
  } else if (rc == 0) {
    /* Dequant: row-block ranges spread over the workers (parallel region). */
    uint64_t br = NWC_LAYOUT_BLOCK_ROWS(t->elem), nrb = (M + br - 1) / br;
    uint64_t parts = M * K16 >= (UINT64_C(1) << 20) ? 4 * (uint64_t)d->cfg.threads : 1;
    if (parts > nrb) parts = nrb;
    dq_ctx dc = {d, t, br, nrb, parts, K, K16, r->out, direct ? (uint16_t *)dst : tmp, dst, direct, 0};
    nwcd_pool_parallel(d->pool, parts, dq_part, &dc);
    rc = atomic_load(&dc.rc);
  }
  free(tmp), free(rows);
  nwcd_res_release(d->res, &ref);
  if (rc < 0) {
    nwc_pw_free(&w);
    return rc;
  }
  nwcd_reply(j, &w);
  return 0;
}

bool nwcd_ops_can_batch(const nwcd_job *a, unsigned cols, const nwcd_job *b) {
  if (!b) return a->req.op == NWC_OP_MATVEC && cols < 8;
  const nwc_proto_req *x = &a->req, *y = &b->req;
  return y->op == NWC_OP_MATVEC && cols + y->ncols <= 8 && x->out == y->out &&
         x->scale == y->scale && !strcmp(x->model, y->model) && !strcmp(x->tensor, y->tensor) &&
         !strcmp(x->bias, y->bias);
}

/* -EINVAL unless r's x is ncols columns of the tensor's K floats. */
int nwcd_check_x(const nwc_proto_req *r, uint64_t K) {
  NWC_RETURN_IF(r->x_bytes != (uint64_t)r->ncols * K * 4, -EINVAL,
                "matvec %s/%s takes K = %llu floats per column: x of %llu bytes is not %u "
                "column%s of them (%llu bytes)", r->model, r->tensor, (unsigned long long)K,
                (unsigned long long)r->x_bytes, r->ncols, r->ncols == 1 ? "" : "s",
                (unsigned long long)r->ncols * K * 4);
  return 0;
}

/* Where the x of job j (ncols dense columns of K floats) is: inline or in the shared region;
 * checks its size and the region's bounds. */
static int matvec_src(const nwcd_job *j, uint64_t K, const uint8_t **out) {
  const nwc_proto_req *r = &j->req;
  NWC_TRY(nwcd_check_x(r, K));
  const uint8_t *src = r->x;
  if (r->where == NWC_WHERE_SHM) {
    NWC_RETURN_IF(!j->shm, -EINVAL, "no shared region: pass one (shm) before using it");
    NWC_RETURN_IF(r->in_off > j->shm_size || r->x_bytes > j->shm_size - r->in_off, -EINVAL,
                  "x of %llu bytes at offset %llu overruns the shared region of %llu bytes",
                  (unsigned long long)r->x_bytes, (unsigned long long)r->in_off,
                  (unsigned long long)j->shm_size);
    src = j->shm + r->in_off;
  }
  *out = src;
  return 0;
}

/* The x of job j copied to X (column stride K16, padding left 0). */
static int matvec_input(nwcd_job *j, uint64_t K, uint64_t K16, float *X) {
  const uint8_t *src = NULL; /* set by matvec_src where it succeeds */
  NWC_TRY(matvec_src(j, K, &src));
  for (uint32_t c = 0; c < j->req.ncols; c++) memcpy(X + c * K16, src + c * K * 4, K * 4);
  return 0;
}

/* n values of y = scale * src + bias (bias: M values, or NULL) into dst as float or BF16 (esz 4
 * or 2); dst may be src (float, in place). */
static void emit_y(const float *src, size_t n, uint64_t M, float scale, const float *bias,
                   uint64_t esz, void *dst) {
  if (esz == 4 && scale == 1.0f && !bias) {
    if (dst != src) memcpy(dst, src, n * 4);
  } else if (esz == 4) {
    for (size_t k = 0; k < n; k++) {
      float v = scale * src[k] + (bias ? bias[k % M] : 0.0f);
      memcpy((uint8_t *)dst + 4 * k, &v, 4);
    }
  } else {
    for (size_t k = 0; k < n; k++) {
      uint16_t h = nwc_f32_to_bf16(scale * src[k] + (bias ? bias[k % M] : 0.0f));
      memcpy((uint8_t *)dst + 2 * k, &h, 2);
    }
  }
}

/* The part of a connection's shared region that the backend registers with the GPU (once per
 * connection): matvecs whose x and y lie inside it go straight between it and the device. */
#define SHARED_WINDOW (4u << 20)

/* A lone matvec on a GPU tensor whose x and y (float) are in j's shared region, inside its
 * window: the backend copies x from the region to the device and the kernels write y into it,
 * with no host copy; scale and bias are applied to y in place.  Returns 0 after the reply, a
 * negative errno (the caller replies), or 1 when the request does not qualify or the backend
 * cannot register the region (the copying path runs it). */
static int matvec_shared(nwcd_job *j, const nwcd_ref *ref, const float *bias) {
  nwcd *d = j->d;
  const nwc_proto_req *r = &j->req;
  const uint64_t M = ref->view.rows, K = ref->view.cols, win =
      j->shm_size < SHARED_WINDOW ? j->shm_size : SHARED_WINDOW;
  if (!ref->dcopy || !d->backend->dev_matvec_shared || r->where != NWC_WHERE_SHM ||
      r->out != NWC_OUT_F32 || r->out_off % 4)
    return 1;
  const uint8_t *src;
  NWC_TRY(matvec_src(j, K, &src));
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_compute c = {.rows = r->ncols, .cols = M, .rflags = NWC_RF_SHARED};
  size_t n = (size_t)r->ncols * M;
  void *dst = NULL;
  int rc = out_place(j, n * 4, &w, &c, &dst); /* checks the region's bounds and out_cap */
  if (rc == 0 && (r->in_off + r->x_bytes > win || r->out_off + n * 4 > win)) rc = 1;
  if (rc == 0)
    rc = d->backend->dev_matvec_shared(j->conn, j->shm, win, ref->dcopy, r->in_off, r->ncols,
                                       r->out_off);
  if (rc == -EAGAIN) rc = 1;
  if (rc != 0) {
    nwc_pw_free(&w);
    return rc;
  }
  emit_y(dst, n, M, r->scale, bias, 4, dst);
  nwcd_reply(j, &w);
  return 0;
}

int nwcd_bias_vector(nwcd *d, const nwc_proto_req *r, uint64_t M, float **out) {
  *out = NULL;
  if (!r->bias[0]) return 0;
  nwcd_ref ref;
  NWC_TRY(nwcd_res_acquire(d->res, r->model, r->bias, NWCD_ACQ_MAP_OK, &ref, NULL));
  const nwc_tensor *t = &ref.view;
  int rc = 0;
  uint16_t *tmp = NULL;
  float *b = NULL;
  if (t->rows * t->cols != M)
    rc = nwc__fail(-EINVAL, "bias %s/%s has %llu values, the matvec has %llu rows", r->model,
                   r->bias, (unsigned long long)(t->rows * t->cols), (unsigned long long)M);
  uint64_t K16 = k16_of(t->cols);
  const float *scale = t->scale; /* a device copy's stay on the device: fetched here */
  float *dscale = NULL;
  if (rc == 0 && (!(tmp = malloc(t->rows * K16 * 2 + 64)) || !(b = malloc(M * sizeof *b))))
    rc = -ENOMEM;
  if (rc == 0 && ref.dcopy) {
    rc = d->backend->dev_dequant(ref.dcopy, tmp);
    if (rc == 0 && ref.ti->off_scale)
      rc = (dscale = malloc(t->rows * sizeof *dscale)) ? d->backend->dev_scales(ref.dcopy, dscale)
                                                       : -ENOMEM;
    scale = dscale;
  } else if (rc == 0) {
    uint64_t br = NWC_LAYOUT_BLOCK_ROWS(t->elem);
    rc = d->backend->dequant(t, 0, (t->rows + br - 1) / br, tmp);
  }
  if (rc == 0) {
    float s = 1;
    for (uint64_t i = 0; i < t->rows; i++)
      for (uint64_t k = 0; k < t->cols; k++) {
        if (scale) s = scale[i];
        b[i * t->cols + k] = s * nwc_bf16_to_f32(tmp[i * K16 + k]);
      }
  }
  free(tmp), free(dscale);
  nwcd_res_release(d->res, &ref);
  if (rc < 0) free(b);
  else *out = b;
  return rc;
}

/* The copying pass: the jobs' x copied into one block, one backend matvec per 8 columns, each
 * job's y written into its reply (inline or its shared region) with scale and bias. */
static void matvec_pass(nwcd *d, nwcd_job *const *jobs, unsigned nj, const nwcd_ref *ref,
                        const float *bias) {
  const nwc_tensor *t = &ref->view;
  const uint64_t M = t->rows, K = t->cols, K16 = k16_of(K);
  const float scale = jobs[0]->req.scale;
  unsigned total = 0;
  for (unsigned i = 0; i < nj; i++) total += jobs[i]->req.ncols;
  float *X = calloc((size_t)total * K16 + 16, 4);
  float *Y = malloc((size_t)total * M * 4 + 64);
  if (!X || !Y) {
    for (unsigned i = 0; i < nj; i++) nwcd_reply_error(jobs[i], -ENOMEM);
    free(X), free(Y);
    return;
  }
  /* Validate each job's input; the failures get their error and leave the pass. */
  int jrc[8], rc = 0;
  unsigned col0[8], cols = 0;
  for (unsigned i = 0; i < nj; i++) {
    col0[i] = cols;
    jrc[i] = matvec_input(jobs[i], K, K16, X + (size_t)cols * K16);
    if (jrc[i] < 0) nwcd_reply_error(jobs[i], jrc[i]);
    else cols += jobs[i]->req.ncols;
  }
  for (unsigned c = 0; rc == 0 && c < cols; c += 8) {
    unsigned nc = cols - c < 8 ? cols - c : 8;
    rc = ref->dcopy ? d->backend->dev_matvec(ref->dcopy, X + (size_t)c * K16, nc, K16,
                                             Y + (size_t)c * M, M)
                    : d->backend->matvec(t, X + (size_t)c * K16, nc, K16, NULL, Y + (size_t)c * M, M);
  }
  if (nj > 1 && cols) {
    atomic_fetch_add(&d->stats.batched_passes, 1);
    atomic_fetch_add(&d->stats.batched_columns, cols);
  }
  for (unsigned i = 0; i < nj; i++) {
    if (jrc[i] < 0) continue;
    nwcd_job *b = jobs[i];
    if (rc < 0) {
      nwcd_reply_error(b, rc);
      continue;
    }
    nwc_pw w;
    nwc_pw_init(&w);
    nwc_proto_compute c = {.rows = b->req.ncols, .cols = M,
                           .rflags = (ref->transient ? NWC_RF_MAPPED : 0) |
                                     (nj > 1 ? NWC_RF_BATCHED : 0)};
    void *dst = NULL;
    uint64_t esz = b->req.out == NWC_OUT_BF16 ? 2 : 4;
    int prc = out_place(b, (uint64_t)b->req.ncols * M * esz, &w, &c, &dst);
    if (prc < 0) {
      nwc_pw_free(&w);
      nwcd_reply_error(b, prc);
      continue;
    }
    /* scale and bias applied as the reply is written (one pass over the columns) */
    emit_y(Y + (size_t)col0[i] * M, (size_t)b->req.ncols * M, M, scale, bias, esz, dst);
    nwcd_reply(b, &w);
  }
  free(X), free(Y);
}

/* Runs j and the jobs chained on j->batch in one pass (a lone one through its shared region
 * where it can); each gets its own reply (which frees that job: nothing of j is read after its
 * reply). */
void nwcd_op_matvec(nwcd_job *j) {
  nwcd *d = j->d;
  nwc_proto_req *r = &j->req;
  nwcd_job *jobs[8];
  unsigned nj = 0;
  for (nwcd_job *b = j; b && nj < 8; b = b->batch) jobs[nj++] = b;
  nwcd_ref ref;
  int rc = nwcd_res_acquire(d->res, r->model, r->tensor, NWCD_ACQ_MAP_OK, &ref, NULL);
  if (rc < 0) {
    for (unsigned i = 0; i < nj; i++) nwcd_reply_error(jobs[i], rc);
    return;
  }
  float *bias = NULL;
  rc = nwcd_bias_vector(d, r, ref.view.rows, &bias);
  if (rc == 0 && nj == 1) rc = matvec_shared(j, &ref, bias);
  if (rc < 0) {
    for (unsigned i = 0; i < nj; i++) nwcd_reply_error(jobs[i], rc);
  } else if (nj > 1 || rc == 1) {
    matvec_pass(d, jobs, nj, &ref, bias);
  }
  free(bias);
  nwcd_res_release(d->res, &ref);
}
