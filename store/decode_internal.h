/*
 * decode_internal.h - what the decoders' translation units share (not installed): the
 * prefix-code lane decoder of layouts 0 and 1, the tile decoders and block walker of layouts 1
 * and 2, the run-time CPU feature dispatch, and the batched matvec's multiply kernels.  The
 * encoder's files never include it, and it includes nothing of theirs.
 *
 * The decoders of layouts 1 and 2 all work on tiles: a tile is the 16 rows x 32 columns of one
 * super-chunk slot of one row group, as BF16 bit patterns, row-major with a caller-chosen row
 * stride.  Layout 1 produces tiles in stream order (super-chunk 0..nsc-1 of a block, its lanes
 * advance together), layout 2 in any order.  Dequant, gather and the (batched) matvec consume them.
 */
#ifndef NWC_DECODE_INTERNAL_H
#define NWC_DECODE_INTERNAL_H

#include "internal.h"

#include <string.h>

/* ---- layout 0 (store/decode.c) -------------------------------------------------------------- */

/* nwc_dequant_range, nwc_gather and nwc_matvec for layout 0 (decode_api.c chooses by layout). */
int nwc__l0_dequant_range(const nwc_tensor *t, uint64_t rb_begin, uint64_t rb_end, uint16_t *out);
int nwc__l0_gather(const nwc_tensor *t, const uint64_t *rows, uint64_t n, uint16_t *out);
int nwc__l0_matvec(const nwc_tensor *t, const float *x, const float *bias, float *y,
                   uint16_t *y_bf16);

/* The prefix-code lane decoder of store/decode.c (opaque), for layout 1 and the batched matvec. */
typedef struct nwc__pcdec nwc__pcdec;
/* A decoder for t (layout 0 or 1): its lookup table from t->psym.  NULL and *rc < 0 on error. */
nwc__pcdec *nwc__pcdec_new(const nwc_tensor *t, int *rc);
void nwc__pcdec_free(nwc__pcdec *pc);
/* Layout 0: checks block b and points the lanes at it (*active = its active lanes); then lane
 * l's 16 weights of block row r (the rows in order), c0 its first column, as BF16. */
int nwc__pcdec_l0_begin(nwc__pcdec *pc, uint64_t b, unsigned *active);
int nwc__pcdec_l0_row(nwc__pcdec *pc, unsigned l, uint64_t r, uint64_t c0, uint16_t w[16]);
/* Layout 1: checks block b (lanes of hdr words each, word-aligned) and points the lanes at it. */
int nwc__pcdec_l1_begin(nwc__pcdec *pc, uint64_t b);
/* For every lane l in the mask, its next 16 codes as bytes h[l][j] = sign << 7 | psym[rank]
 * (or the escaped byte); -EBADMSG if they need bits beyond the lane's stream. */
int nwc__pcdec_lanes16(nwc__pcdec *pc, uint32_t lanes, uint8_t h[][16]);

/* ---- CPU features (store/cpu_features.c) --------------------------------------------------- */

enum { NWC__CPU_PORTABLE = 0, NWC__CPU_SSSE3 = 1, NWC__CPU_AVX2 = 2, NWC__CPU_AVX512 = 3 };
/* The implementation level to use now: the best the CPU supports (AVX2 needs AVX2, FMA, BMI2;
 * AVX512 that and AVX-512 F, used for the matvec multiply only), lowered by the environment
 * variable NWC_CPU=portable|ssse3|avx2|avx512 (read on every call). */
int nwc__cpu_level(void);

/* ---- tile decoders (store/layout2_decode.c, store/layout2_simd.c) ---------------------------- */

/* Layout-2 tile decoders: slot s of row group gr, into dst (row stride `stride` elements), lanes
 * 0 .. nlanes - 1 (a multiple of 4: the lanes of tile rows < nlanes / 4 and their rows + 8),
 * exceptions not applied (they read as +-0).  lut = psym. */
typedef void (*nwc__l2_tile_fn)(const nwc__lgeom *lg, const uint8_t *raw, const uint8_t lut[16],
                                uint64_t gr, uint64_t s, unsigned nlanes, uint16_t *dst,
                                size_t stride);
void nwc__l2_tile_portable(const nwc__lgeom *lg, const uint8_t *raw, const uint8_t lut[16],
                           uint64_t gr, uint64_t s, unsigned nlanes, uint16_t *dst, size_t stride);
/* The fastest tile decoder for the element type at the given CPU level. */
nwc__l2_tile_fn nwc__l2_tile_simd(unsigned type, int level);

/* Layout-2 fp8: the 16 three-bit mantissa fields of lane L in slot s (pair words at w3). */
static inline uint64_t nwc__l2_fp8_fields48(const uint8_t *pair, unsigned L, unsigned half) {
  uint32_t w[3];
  for (unsigned k = 0; k < 3; k++) memcpy(&w[k], pair + (k * NWC_LANES + L) * 4, 4);
  uint64_t v = half ? (w[1] >> 16) | (uint64_t)w[2] << 16 : w[0] | (uint64_t)w[1] << 32;
  return v & ((UINT64_C(1) << 48) - 1);
}

/* Multiply-accumulate kernel of the matvec: for rows i < nrows of w (BF16 patterns, row stride
 * wstride, n columns, n a multiple of 8) and columns c < ncols of x (stride ldx):
 * part[(i * 8 + c) * 8 + e] += sum over k = e mod 8 of w[i][k] * x[c][k].  The dot product of
 * row i with column c is the sum of the 8 partial lanes e. */
typedef void (*nwc__fma_fn)(const uint16_t *w, size_t wstride, unsigned nrows, unsigned n,
                            const float *x, size_t ldx, unsigned ncols, float *part);
/* The AVX-512 or AVX2+FMA kernel, or NULL below AVX2 (layout2_simd.c; the portable one is
 * matvec_batch.c's). */
nwc__fma_fn nwc__fma_simd(int level);

/* ---- decoders of layouts 1 and 2 (store/layout1_decode.c, store/lx_decode.c) ------------ */

/* Layout 1: decodes slot `slot` (counted over the whole raw plane) of the lanes in the mask into
 * dst (after nwc__pcdec_l1_begin). */
int nwc__l1_tile(nwc__pcdec *pc, const nwc__lgeom *lg, const uint8_t *raw, uint64_t slot,
                 uint32_t lanes, uint16_t *dst, size_t stride);

/* The block walker of layouts 1 and 2: init (checks the tensor's shape and sizes), then per
 * block begin, tile(sc) for sc = 0 .. nsc - 1 in order, end. */
typedef struct nwc__lxdec {
  nwc__lgeom lg;
  const nwc_tensor *t;
  nwc__pcdec *pc;        /* layout 1 */
  nwc__l2_tile_fn tile2; /* layout 2 */
  uint64_t b, gr, cb;    /* current block, its row group and column block */
  unsigned nsc;          /* its super-chunks */
  uint32_t lanes;        /* lanes decoded (layout 1; layout 2 decodes the first nlanes) */
  unsigned nlanes;       /* lanes holding a row below M: 32, or 4 * rows in a short group */
  uint32_t *exc;         /* layout 2: the block's exceptions by super-chunk, pos << 16 | value */
  unsigned sc_start[NWC__SC_PER_BLOCK + 1]; /* ... those of super-chunk sc start here */
  uint16_t fp8_bf16[256];
} nwc__lxdec;
int nwc__lxdec_init(nwc__lxdec *d, const nwc_tensor *t);
void nwc__lxdec_fini(nwc__lxdec *d);
int nwc__lxdec_begin(nwc__lxdec *d, uint64_t b, uint32_t lanes);
/* Super-chunk sc of the current block into dst (16 rows of 32, row stride `stride`). */
int nwc__lxdec_tile(nwc__lxdec *d, unsigned sc, uint16_t *dst, size_t stride);
int nwc__lxdec_end(nwc__lxdec *d);

int nwc__lx_dequant_range(const nwc_tensor *t, uint64_t rb_begin, uint64_t rb_end, uint16_t *out);
int nwc__lx_gather(const nwc_tensor *t, const uint64_t *rows, uint64_t n, uint16_t *out);
/* nwc_matvec for layouts 1 and 2: nwc_matvec_batch with one column (store/matvec_batch.c). */
int nwc__lx_matvec(const nwc_tensor *t, const float *x, const float *bias, float *y,
                   uint16_t *y_bf16);

#endif /* NWC_DECODE_INTERNAL_H */
