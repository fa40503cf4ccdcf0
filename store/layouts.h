/*
 * layouts.h - internal interface of layouts 1 and 2 (16 x 512 blocks in mma.m16n8k16 fragment
 * order; docs/format-layouts.md), of the run-time CPU feature dispatch, and of the batched
 * matvec.  Included at the end of internal.h, so the layout-0 files can dispatch on the layout.
 *
 * The decoders of layouts 1 and 2 all work on tiles: a tile is the 16 rows x 32 columns of one
 * super-chunk slot of one row group, as BF16 bit patterns, row-major with a caller-chosen row
 * stride.  Layout 1 produces tiles in stream order (super-chunk 0..nsc-1 of a block, its lanes
 * advance together), layout 2 in any order.  Dequant, gather and the (batched) matvec consume them.
 */
#ifndef NWC_LAYOUTS_H
#define NWC_LAYOUTS_H

#include "internal.h"

#include <string.h>

#define NWC__LX_BLOCK_ROWS 16   /* rows of a layout-1/2 block (a row group) */
#define NWC__SC_COLS 32         /* columns of a super-chunk */
#define NWC__SC_PER_BLOCK 16    /* super-chunks of a full 512-column block */
#define NWC__SC_WEIGHTS 16      /* weights of one lane in one super-chunk */
#define NWC__L1_WORDS_PER_SC 12 /* 16 codes x at most 24 bits = 12 words */
#define NWC__RAW_SLACK 512      /* zero bytes after the raw area of layouts 1 and 2 */
#define NWC__L2_MAX_EXC 255     /* exception entries per lane and block */

/* Shape of a layout-1/2 tensor. */
typedef struct nwc__lgeom {
  nwc__geom g;        /* M, K, K16, row_blocks (16 rows), col_blocks, nblocks, type */
  unsigned layout;    /* 1 or 2 */
  uint64_t K32;       /* K rounded up to 32: the columns the coded super-chunks cover */
  uint64_t slots;     /* super-chunk slots per row group: 16 (CB - 1) + ceil(nl / 2) */
  unsigned last_sc;   /* super-chunks coded in the last column block: ceil(nl / 2) */
  uint64_t nib_bytes; /* layout 2: the nibble plane at the start of raw (0 for layout 1) */
  uint64_t low_bytes; /* the plane of low bytes (BF16) / nibbles or mantissa fields (fp8) */
  uint64_t raw_bytes; /* nib_bytes + low_bytes + NWC__RAW_SLACK */
  unsigned exc_bytes; /* layout 2: bytes of an exception entry (3 BF16, 2 fp8) */
} nwc__lgeom;

/* Full shape of a layout-1/2 tensor; -EINVAL / -ENOTSUP as nwc__geom_init. */
int nwc__lgeom_init(nwc__lgeom *lg, uint64_t M, uint64_t K, unsigned elem);
static inline unsigned nwc__lx_nsc(const nwc__lgeom *lg, uint64_t cb) {
  return cb + 1 < lg->g.col_blocks ? NWC__SC_PER_BLOCK : lg->last_sc;
}

/* Position of weight j (0..15) of lane L in its super-chunk: tile row and column. */
static inline unsigned nwc__frag_row(unsigned L, unsigned j) { return (L >> 2) + 8u * ((j >> 1) & 1u); }
static inline unsigned nwc__frag_col(unsigned L, unsigned j) {
  return 8u * (L & 3u) + 4u * (j >> 3) + 2u * ((j >> 2) & 1u) + (j & 1u);
}

/* The input indices (row * K + col) of lane L's weights in block b, in stream order (index
 * 16 sc + j), NWC__LX_FILLER for a filler; returns their number, 16 nsc.  The encoders' walk. */
#define NWC__LX_FILLER UINT64_MAX
unsigned nwc__lx_lane_inputs(const nwc__lgeom *lg, uint64_t b, unsigned L, uint64_t in[256]);

/* nwc_layout / nwc_encode_bound / nwc_tensor_validate for layouts 1 and 2. */
int nwc__lx_layout(uint64_t M, uint64_t K, unsigned elem, uint64_t out[4]);
int64_t nwc__lx_encode_bound(uint64_t M, uint64_t K, unsigned elem);
int nwc__lx_validate(const nwc_tensor *t); /* everything but the scale */

/* ---- encoders (store/layout1.c, store/layout2.c) ------------------------------------------- */

/* A planned encoding: what nwc_encode and nwc_tensor_encode need to size and then write. */
typedef struct nwc__lx_plan {
  nwc__lgeom lg;
  const uint16_t *w16;  /* BF16 input, or */
  const uint8_t *w8;    /* fp8 input */
  const uint64_t *bases;
  const uint8_t *hdr;
  /* layout 1: the prefix code by input byte (BF16 high byte, fp8 byte); fp8 raw nibble */
  uint32_t bits[256];
  uint8_t len[256];
  uint8_t fp8_nib[256];
  /* layout 2: nibble [sign | rank] by input key (BF16 high byte, fp8 byte; rank 7: exception),
   * fp8 3-bit mantissa field by byte */
  uint8_t nib[256];
  uint8_t mant[256];
} nwc__lx_plan;
/* nwc_encode and nwc_tensor_encode for layouts 1 and 2 (store/layout_common.c). */
int64_t nwc__lx_encode(const void *w, uint64_t n, uint64_t K, unsigned elem, uint64_t *freq,
                       uint8_t psym[16], uint64_t *bases, uint8_t *hdr, uint8_t *data, uint64_t cap,
                       uint8_t *raw);
int nwc__lx_tensor_encode(const void *w, uint64_t rows, uint64_t cols, unsigned elem,
                          const float *scale, nwc_tensor *t);

/* Per layout: plan p (lg and the input set): symbols, psym, freq (may be NULL), hdr[] and
 * bases[] (caller arrays sized by nwc_layout), *data_bytes.  -EINVAL for an fp8 NaN, -ERANGE
 * (layout 2) for more than 255 exceptions in one lane of one block.  Then write data and raw. */
int nwc__l1_plan(nwc__lx_plan *p, uint64_t *freq, uint8_t psym[16], uint64_t *bases,
                 uint8_t *hdr, uint64_t *data_bytes);
void nwc__l1_write(const nwc__lx_plan *p, uint8_t *data, uint8_t *raw);
int nwc__l2_plan(nwc__lx_plan *p, uint64_t *freq, uint8_t psym[16], uint64_t *bases,
                 uint8_t *hdr, uint64_t *data_bytes);
void nwc__l2_write(const nwc__lx_plan *p, uint8_t *data, uint8_t *raw);

/* ---- hooks into the layout-0 encoder and decoder (store/encode.c, store/decode.c) ---------- */

/* Ranks nsym symbols by descending count, ties by ascending symbol (the layout-0 ranking). */
void nwc__rank_symbols(const uint64_t *freq, unsigned nsym, unsigned *order);
/* The layout-0 prefix code of every input byte (BF16: high byte; fp8: the byte) for the weights
 * w (n of them, type NWC_ELEM_BF16/FP8), with psym and freq as nwc_encode gives them.
 * -EINVAL for an fp8 NaN. */
int nwc__prefix_codes(const void *w, uint64_t M, uint64_t K, unsigned elem, uint64_t *freq,
                      uint8_t psym[16], uint32_t bits[256], uint8_t len[256]);

/* The prefix-code lane decoder of store/decode.c (opaque). */
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
const char *nwc__cpu_level_name(int level);

/* ---- tile decoders (store/lx_decode.c, store/layout2_simd.c) -------------------------------- */

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
void nwc__fma_portable(const uint16_t *w, size_t wstride, unsigned nrows, unsigned n,
                       const float *x, size_t ldx, unsigned ncols, float *part);
/* The AVX-512 or AVX2+FMA kernel, or NULL below AVX2 (layout2_simd.c). */
nwc__fma_fn nwc__fma_simd(int level);

/* ---- decoders of layouts 1 and 2 (store/layout1.c, store/lx_decode.c) ------------------- */

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

#endif /* NWC_LAYOUTS_H */
