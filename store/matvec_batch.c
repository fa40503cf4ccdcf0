/*
 * matvec_batch.c - Y = scale * (W X) + bias for 1..8 columns of X in one pass over the compressed
 * weights, for every layout (nwc_matvec_batch), and nwc_matvec for layouts 1 and 2 (one column).
 *
 * The weights are decoded once: layout 0 lane row by lane row through the layout-0 decoder's
 * hooks (decode.c), layouts 1 and 2 tile by tile (lx_decode.c).  Each decoded piece is multiplied
 * with all columns while it is in registers or L1 (nwc__fma_fn: 8 partial sums per row and
 * column in fp32).  Every 4 column blocks (and at the end of a row) the partial sums are added
 * in a fixed order into fp64 row accumulators; scale, bias and the BF16 rounding are applied at the end of the row block.
 *
 * X is copied once into a zero-padded buffer of K rounded up to 512 per column, so the kernels
 * read whole super-chunks and lane rows without bounds checks and X needs only K valid floats per
 * column.  Weights in columns K and beyond (fillers) are cleared before the multiply, so that a
 * filler decoding to an infinity cannot turn a row into NaN.
 */
#include "decode_internal.h"

#include <stdlib.h>
#include <string.h>

#define MAX_COLS 8

static inline float bf16_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* The portable multiply-accumulate kernel (nwc__fma_fn); the SIMD ones must match it. */
static void fma_portable(const uint16_t *w, size_t wstride, unsigned nrows, unsigned n,
                         const float *x, size_t ldx, unsigned ncols, float *part) {
  for (unsigned i = 0; i < nrows; i++)
    for (unsigned k0 = 0; k0 < n; k0 += NWC__SC_COLS) {
      float wf[NWC__SC_COLS];
      unsigned m = n - k0 < NWC__SC_COLS ? n - k0 : NWC__SC_COLS;
      for (unsigned k = 0; k < m; k++) wf[k] = bf16_f32(w[i * wstride + k0 + k]);
      for (unsigned c = 0; c < ncols; c++) {
        float *p = part + (i * 8 + c) * 8;
        const float *xc = x + c * ldx + k0;
        for (unsigned k = 0; k < m; k += 8)
          for (unsigned e = 0; e < 8; e++) p[e] += wf[k + e] * xc[k + e];
      }
    }
}

/* What one call needs: the padded X, the kernel, the row accumulators. */
typedef struct batch {
  const nwc_tensor *t;
  unsigned ncols;
  uint64_t K, Kp; /* K and the padded column count of xp */
  float *xp;      /* ncols x Kp */
  nwc__fma_fn fma;
  double acc[NWC__LX_BLOCK_ROWS][MAX_COLS];
  float part[NWC__LX_BLOCK_ROWS * MAX_COLS * 8];
} batch;

/* Adds the partial sums of rows [0, nrows) into acc (8 lanes pairwise) and clears them. */
static void flush_part(batch *B, unsigned nrows) {
  for (unsigned i = 0; i < nrows; i++)
    for (unsigned c = 0; c < B->ncols; c++) {
      float *p = B->part + (i * 8 + c) * 8;
      float s = ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
      B->acc[i][c] += s;
      memset(p, 0, 8 * sizeof *p);
    }
}

/* The fp32 partial sums cover at most FLUSH_BLOCKS column blocks (2048 columns: 256 products per
 * partial lane) before they go into the fp64 row accumulators. */
#define FLUSH_BLOCKS 4
static inline int flush_now(uint64_t cb, uint64_t col_blocks) {
  return cb % FLUSH_BLOCKS == FLUSH_BLOCKS - 1 || cb + 1 == col_blocks;
}

static void store_rows(const batch *B, uint64_t r0, unsigned nrows, const float *bias, float *Y,
                       size_t ldy, uint16_t *Y_bf16) {
  const nwc_tensor *t = B->t;
  for (unsigned i = 0; i < nrows; i++) {
    uint64_t r = r0 + i;
    for (unsigned c = 0; c < B->ncols; c++) {
      double v = B->acc[i][c] * (t->scale ? t->scale[r] : 1.0f) + (bias ? bias[r] : 0.0f);
      if (Y) Y[c * ldy + r] = (float)v;
      if (Y_bf16) Y_bf16[c * ldy + r] = nwc_f32_to_bf16((float)v);
    }
  }
}

/* Layout 0: a block row (the active lanes' 16 weights each) is decoded into row[], then
 * multiplied with all columns at once. */
static int batch_l0(batch *B, const float *bias, float *Y, size_t ldy, uint16_t *Y_bf16) {
  int rc;
  nwc__pcdec *pc = nwc__pcdec_new(B->t, &rc);
  if (!pc) return rc;
  nwc__geom g;
  uint16_t row[NWC_BLOCK_COLS];
  rc = nwc__geom_init(&g, B->t->rows, B->t->cols, B->t->elem);
  for (uint64_t rb = 0; rc == 0 && rb < g.row_blocks; rb++) {
    unsigned nrows = nwc__block_rows(&g, rb), active = 0;
    memset(B->acc, 0, sizeof B->acc);
    for (uint64_t cb = 0; rc == 0 && cb < g.col_blocks; cb++) {
      uint64_t b = rb * g.col_blocks + cb, c_base = cb * NWC_BLOCK_COLS;
      if ((rc = nwc__pcdec_l0_begin(pc, b, &active)) < 0) break;
      for (unsigned i = 0; rc == 0 && i < nrows; i++) {
        for (unsigned l = 0; rc == 0 && l < active; l++)
          rc = nwc__pcdec_l0_row(pc, l, rb * NWC_BLOCK_ROWS + i, c_base + 16 * l, row + 16 * l);
        if (c_base + 16 * active > g.K) /* fillers */
          memset(row + (g.K - c_base), 0, (c_base + 16 * active - g.K) * 2);
        if (rc == 0)
          B->fma(row, 0, 1, 16 * active, B->xp + c_base, B->Kp, B->ncols, B->part + i * 64);
      }
      if (flush_now(cb, g.col_blocks)) flush_part(B, nrows);
    }
    if (rc == 0) store_rows(B, rb * NWC_BLOCK_ROWS, nrows, bias, Y, ldy, Y_bf16);
  }
  nwc__pcdec_free(pc);
  return rc;
}

/* Layouts 1 and 2: a block (its nsc super-chunks) is decoded into blk[16][512], then multiplied
 * with all columns row by row. */
static int batch_lx(batch *B, const float *bias, float *Y, size_t ldy, uint16_t *Y_bf16) {
  nwc__lxdec d;
  int rc = nwc__lxdec_init(&d, B->t);
  const nwc__geom *g = &d.lg.g;
  uint16_t *blk = malloc(NWC__LX_BLOCK_ROWS * NWC_BLOCK_COLS * 2);
  if (rc == 0 && !blk) rc = -ENOMEM;
  for (uint64_t gr = 0; rc == 0 && gr < g->row_blocks; gr++) {
    uint64_t left = g->M - gr * NWC__LX_BLOCK_ROWS;
    unsigned nrows = left < NWC__LX_BLOCK_ROWS ? (unsigned)left : NWC__LX_BLOCK_ROWS;
    memset(B->acc, 0, sizeof B->acc);
    for (uint64_t cb = 0; rc == 0 && cb < g->col_blocks; cb++) {
      uint64_t c_base = cb * NWC_BLOCK_COLS;
      if ((rc = nwc__lxdec_begin(&d, gr * g->col_blocks + cb, UINT32_MAX)) < 0) break;
      for (unsigned sc = 0; rc == 0 && sc < d.nsc; sc++)
        rc = nwc__lxdec_tile(&d, sc, blk + sc * NWC__SC_COLS, NWC_BLOCK_COLS);
      if (rc == 0) rc = nwc__lxdec_end(&d);
      if (rc < 0) break;
      unsigned n = d.nsc * NWC__SC_COLS;
      if (c_base + n > g->K) /* the right edge: clear the fillers */
        for (unsigned i = 0; i < nrows; i++)
          memset(blk + i * NWC_BLOCK_COLS + (g->K - c_base), 0, (c_base + n - g->K) * 2);
      B->fma(blk, NWC_BLOCK_COLS, nrows, n, B->xp + c_base, B->Kp, B->ncols, B->part);
      if (flush_now(cb, g->col_blocks)) flush_part(B, nrows);
    }
    if (rc == 0) store_rows(B, gr * NWC__LX_BLOCK_ROWS, nrows, bias, Y, ldy, Y_bf16);
  }
  free(blk);
  nwc__lxdec_fini(&d);
  return rc;
}

int nwc_matvec_batch(const nwc_tensor *t, const float *X, unsigned ncols, size_t ldx,
                     const float *bias, float *Y, size_t ldy, uint16_t *Y_bf16) {
  NWC_RETURN_IF(!t, -EINVAL, "nwc_matvec_batch: no tensor");
  NWC_RETURN_IF(ncols < 1 || ncols > MAX_COLS, -EINVAL, "nwc_matvec_batch: %u columns, 1..%d",
                ncols, MAX_COLS);
  NWC_RETURN_IF(!X || (ncols > 1 && ldx < t->cols) || ((Y || Y_bf16) && ncols > 1 && ldy < t->rows),
                -EINVAL, "nwc_matvec_batch: no X, or ldx %zu < K %llu, or ldy %zu < M %llu", ldx,
                (unsigned long long)t->cols, ldy, (unsigned long long)t->rows);
  nwc__geom g;
  NWC_TRY(nwc__geom_init(&g, t->rows, t->cols, t->elem));
  batch *B = calloc(1, sizeof *B);
  if (!B) return -ENOMEM;
  B->t = t;
  B->ncols = ncols;
  B->K = t->cols;
  B->Kp = nwc__round_up(t->cols, NWC_BLOCK_COLS);
  B->xp = calloc((size_t)(B->Kp * ncols), sizeof(float));
  int level = nwc__cpu_level();
  B->fma = nwc__fma_simd(level);
  if (!B->fma) B->fma = fma_portable;
  int rc = B->xp ? 0 : -ENOMEM;
  for (unsigned c = 0; rc == 0 && c < ncols; c++) memcpy(B->xp + c * B->Kp, X + c * ldx, t->cols * 4);
  if (rc == 0)
    rc = NWC_ELEM_LAYOUT(t->elem) == 0 ? batch_l0(B, bias, Y, ldy, Y_bf16)
                                       : batch_lx(B, bias, Y, ldy, Y_bf16);
  free(B->xp);
  free(B);
  return rc;
}

int nwc__lx_matvec(const nwc_tensor *t, const float *x, const float *bias, float *y,
                   uint16_t *y_bf16) {
  return nwc_matvec_batch(t, x, 1, t ? (size_t)t->cols : 0, bias, y, t ? (size_t)t->rows : 0,
                          y_bf16);
}
