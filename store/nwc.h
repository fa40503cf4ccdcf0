/*
 * nwc.h - the NWC codec: public interface of the encoder, the lookup table and the CPU decoders.
 *
 * The format is specified byte for byte in docs/format.md; this header is its C face.  A tensor of
 * M rows x K columns (row-major BF16 or fp8 e4m3 weights) is stored as
 *
 *   psym[16]           exp_of_rank: the byte each prefix-code rank decodes to
 *   bases[nblocks + 1] byte offset of each 8 x 512 block in data (8-aligned); bases[nblocks] = end
 *   hdr[nblocks * 32]  stream length of each lane in 16-bit units (0 for a lane whose columns
 *                      start at or beyond K16; rows beyond M are not coded)
 *   data[data_bytes]   per block, the lane streams concatenated in bit order (MSB first within
 *                      little-endian 32-bit words, each lane padded to 16 bits, the block to a
 *                      word and to 8 bytes), then NWC_DATA_SLACK zero bytes
 *   raw[raw_bytes]     the raw plane: the low byte of each BF16 weight (row stride K16), or the
 *                      4-bit nibble of each fp8 weight (row stride K16 / 2)
 *
 * That is layout 0 (elem bits 4..7 = 0).  Layouts 1 and 2 (16 x 512 blocks in mma.m16n8k16
 * fragment order; layout 2 with fixed-width nibbles and per-block exception lists in data) use the
 * same fields with the meanings of docs/format-layouts.md.
 *
 * Conventions: every fallible function returns 0 (or a count) on success and a negative errno on
 * failure; nwc_strerror() turns it into text and nwc_error_detail() says what exactly was wrong.
 * Decoders check every size, count and offset they read from a tensor, so a corrupt tensor yields
 * -EBADMSG, never an out-of-bounds access.
 */
#ifndef NWC_H
#define NWC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define NWC_EXTERN __attribute__((visibility("default")))
#else
#define NWC_EXTERN
#endif

/* Format constants (docs/format.md, "Constants"). */
#define NWC_FORMAT_VERSION 11
#define NWC_BLOCK_ROWS 8
#define NWC_BLOCK_COLS 512
#define NWC_LANES 32
#define NWC_LANE_COLS 16       /* columns per lane and row */
#define NWC_UNIT_BITS 16        /* lane streams are whole 16-bit units */
#define NWC_LANE_MAX_UNITS 192  /* 128 weights x 24 bits / 16 */
#define NWC_TAB_BITS 12
#define NWC_TAB_ENTRIES 4096
#define NWC_TAB_SLOW 0x40000000u /* bit 30 of a table entry: the pair is not complete */
#define NWC_RANKS 16           /* psym entries */
#define NWC_BF16_CODED_RANKS 15 /* ranks 0..14 have codes; other symbols are escaped */
#define NWC_FP8_SYMBOLS 10     /* fp8: ranks 0..9, no escape */
#define NWC_DATA_ALIGN 8
#define NWC_DATA_SLACK 16      /* zero bytes after the last block */

/* Element types (bits 0..3 of elem) and layouts (bits 4..7). */
enum nwc_elem_type { NWC_ELEM_BF16 = 0, NWC_ELEM_FP8 = 1 };
#define NWC_ELEM(type, layout) ((unsigned)(type) | ((unsigned)(layout) << 4))
#define NWC_ELEM_TYPE(elem) ((unsigned)(elem) & 15u)
#define NWC_ELEM_LAYOUT(elem) (((unsigned)(elem) >> 4) & 15u)
/* Not a layout but an import option (nwc_import_opts.layout, the protocol's import): the layout
 * chosen per tensor, 2 for BF16 matrices of at least 16 rows, 0 for the rest (docs/kernels.md,
 * "Choosing a layout"). */
#define NWC_LAYOUT_AUTO 15u
/* Rows of a block (and of nwc_dequant_range's row blocks): 8 for layout 0, 16 for layouts 1, 2
 * (docs/format-layouts.md). */
#define NWC_LAYOUT_BLOCK_ROWS(elem) (NWC_ELEM_LAYOUT(elem) ? 16u : 8u)

/* ---- errors ------------------------------------------------------------------------------- */

/* Text for a negative errno returned by any nwc function (static storage, never freed). */
NWC_EXTERN const char *nwc_strerror(int err);
/* What the last failing nwc call on this thread found wrong, e.g. "block 17: lane 3 overruns its
 * stream" (thread-local storage, valid until the next failing call on the thread; "" if none). */
NWC_EXTERN const char *nwc_error_detail(void);

/* ---- format parameters -------------------------------------------------------------------- */

enum nwc_info_key {
  NWC_INFO_VERSION = 0,        /* format version (NWC_FORMAT_VERSION) */
  NWC_INFO_STATES_PER_LANE = 1, /* bit windows per lane: 1 */
  NWC_INFO_TABLE_WORDS = 2,    /* 32-bit words in the lookup table: 4096 */
  NWC_INFO_HEADER_BYTES = 3,   /* header bytes per block: 32 */
  NWC_INFO_BLOCK_WEIGHTS = 4,  /* weights per block: 4096 */
};
/* A format parameter, or -EINVAL for an unknown key. */
NWC_EXTERN int64_t nwc_info(int key);

enum nwc_layout_field {
  NWC_LAYOUT_BLOCKS = 0,   /* number of 8 x 512 blocks */
  NWC_LAYOUT_RAW_BYTES = 1, /* bytes of the raw plane */
  NWC_LAYOUT_SCRATCH = 2,  /* floats of matvec scratch: rows rounded up to 8, times column blocks */
  NWC_LAYOUT_K16 = 3,      /* K rounded up to 16: row stride of the raw plane and dequant output */
};
/* Fills out[4] (indexed by nwc_layout_field) for an M x K tensor of element type/layout elem.
 * Returns 0, -EINVAL for a zero or too large shape, -ENOTSUP for a layout this build lacks. */
NWC_EXTERN int nwc_layout(uint64_t M, uint64_t K, unsigned elem, uint64_t out[4]);

/* Upper bound of data_bytes for any M x K tensor (all lanes at their maximum length). */
NWC_EXTERN int64_t nwc_encode_bound(uint64_t M, uint64_t K, unsigned elem);

/* ---- encoding ----------------------------------------------------------------------------- */

/*
 * Encodes n weights (n / K rows of K), BF16 as uint16_t or fp8 e4m3 as uint8_t, into
 * caller-provided arrays sized by nwc_layout(): bases[blocks + 1], hdr[blocks * 32], raw[raw_bytes],
 * data[cap].  psym[16] receives exp_of_rank (layout 2: the lut); freq (128 counters for BF16, 10
 * for fp8, 19 for fp8 in layout 2; may be NULL) receives the symbol histogram.  With
 * data == NULL only the size is computed.
 * Returns data_bytes (streams plus NWC_DATA_SLACK), -EINVAL for a bad shape or an fp8 NaN,
 * -ENOSPC if cap is too small (nothing useful is written then), -ERANGE (layout 2) when a lane of
 * a block would need more than 255 exceptions.
 */
NWC_EXTERN int64_t nwc_encode(const void *w, uint64_t n, uint64_t K, unsigned elem, uint64_t *freq,
                              uint8_t psym[16], uint64_t *bases, uint8_t *hdr, uint8_t *data,
                              uint64_t cap, uint8_t *raw);

/* Builds the 4096-entry lookup table from psym (docs/format.md, "Lookup table"). Returns 0 or
 * -EINVAL for an unknown element type. */
NWC_EXTERN int nwc_build_tab(const uint8_t psym[16], unsigned elem, uint32_t tab[4096]);

/*
 * fp8 quantization: for each of M rows of K BF16 weights, scale[r] = absmax / 448 (1 for an
 * all-zero row) and q = round-to-nearest-even(w / scale[r]) as fp8 e4m3 (saturated at +-448).
 * Returns 0, or -EINVAL (detail says where) for a NaN or infinite weight.
 */
NWC_EXTERN int nwc_quantize_fp8(const uint16_t *w, uint64_t M, uint64_t K, uint8_t *q, float *scale);

/* ---- encoded tensors ---------------------------------------------------------------------- */

/* A view of an encoded tensor.  Pointers are borrowed unless the tensor came from
 * nwc_tensor_encode() or nwc_record_read(), in which case nwc_tensor_release() frees them. */
typedef struct nwc_tensor {
  unsigned elem;            /* NWC_ELEM(type, layout) */
  uint64_t rows, cols;      /* M, K */
  uint8_t psym[16];         /* exp_of_rank (layouts 0, 1); layout 2: the lut */
  uint64_t nblocks;
  const uint64_t *bases;    /* nblocks + 1 */
  const uint8_t *hdr;       /* nblocks * 32 */
  const uint8_t *data;
  uint64_t data_bytes;
  const uint8_t *raw;
  uint64_t raw_bytes;
  const float *scale;       /* per-row scale (fp8 quantization), or NULL for 1 */
  void *owned;              /* allocation behind the pointers, or NULL for a borrowed view */
} nwc_tensor;

/* Encodes rows x cols weights into *t, allocating its arrays (one allocation; free with
 * nwc_tensor_release).  scale (rows floats, may be NULL) is copied.  Returns 0 or a negative errno. */
NWC_EXTERN int nwc_tensor_encode(const void *w, uint64_t rows, uint64_t cols, unsigned elem,
                                 const float *scale, nwc_tensor *t);
/* Frees what nwc_tensor_encode/nwc_record_read allocated and zeroes *t; NULL or a view is a no-op
 * for the memory (the struct is still zeroed). */
NWC_EXTERN void nwc_tensor_release(nwc_tensor *t);

/* Checks every field of t against the format: shape, psym, bases, stream lengths, sizes.  Cost is
 * O(nblocks).  Returns 0 or -EBADMSG (detail says what). Decoders do not need it to be memory safe. */
NWC_EXTERN int nwc_tensor_validate(const nwc_tensor *t);

/* ---- CPU decoders ------------------------------------------------------------------------- */

/* Row-major BF16 output, row stride K16 (columns K..K16-1 hold the decoded filler value).  fp8
 * tensors yield the unscaled fp8 values as BF16, exactly.  out holds rows x K16 uint16_t. */
NWC_EXTERN int nwc_dequant(const nwc_tensor *t, uint16_t *out);
/* The same for the row blocks [rb_begin, rb_end) (8 rows each); out points at row 8 * rb_begin.
 * Layouts 1 and 2: row blocks of NWC_LAYOUT_BLOCK_ROWS(elem) = 16 rows. */
NWC_EXTERN int nwc_dequant_range(const nwc_tensor *t, uint64_t rb_begin, uint64_t rb_end,
                                 uint16_t *out);

/* y = scale * (W x) + bias for x of K16 floats (x[K..K16-1] must be 0); bias (rows floats) may
 * be NULL; y (fp32) and y_bf16 (round to nearest even) may each be NULL. */
NWC_EXTERN int nwc_matvec(const nwc_tensor *t, const float *x, const float *bias, float *y,
                          uint16_t *y_bf16);

/*
 * Y = scale * (W X) + bias for ncols (1..8) columns of X in one pass over the compressed weights,
 * any layout.  Column c of X is X + c * ldx (K valid floats; padding columns are not read), of
 * Y and Y_bf16 Y + c * ldy and Y_bf16 + c * ldy (rows each).  bias (rows floats), Y and Y_bf16
 * may be NULL.  Returns 0, -EINVAL for bad arguments, -EBADMSG for a corrupt tensor.
 */
NWC_EXTERN int nwc_matvec_batch(const nwc_tensor *t, const float *X, unsigned ncols, size_t ldx,
                                const float *bias, float *Y, size_t ldy, uint16_t *Y_bf16);

/* Rows by index: out[i * K16 ...] = row rows[i] of the dequantized tensor.  -EINVAL for an index
 * out of range (nothing is guaranteed about out then). */
NWC_EXTERN int nwc_gather(const nwc_tensor *t, const uint64_t *rows, uint64_t n, uint16_t *out);

/* ---- tensor records (docs/format.md, "Tensor record") ------------------------------------- */

/* Serializes t into a newly malloc'ed buffer (*buf, *len; the caller frees *buf). */
NWC_EXTERN int nwc_record_write(const nwc_tensor *t, uint8_t **buf, size_t *len);
/* Parses a record (copying it, so buf may be freed after), validates it, fills *t (release with
 * nwc_tensor_release).  Returns 0, -EBADMSG for anything malformed, -ENOTSUP for a layout this
 * build does not implement. */
NWC_EXTERN int nwc_record_read(const uint8_t *buf, size_t len, nwc_tensor *t);

/* ---- small helpers used by tools and tests ------------------------------------------------ */

/* BF16 <-> fp32 bit conversions (round to nearest even; NaN stays NaN, quiet). */
NWC_EXTERN uint16_t nwc_f32_to_bf16(float f);
NWC_EXTERN float nwc_bf16_to_f32(uint16_t h);
/* fp8 e4m3 (the "fn" variant: no infinities, 0x7f/0xff NaN) to fp32, and the BF16 equal to it. */
NWC_EXTERN float nwc_fp8_to_f32(uint8_t b);
NWC_EXTERN uint16_t nwc_fp8_to_bf16(uint8_t b);

#ifdef __cplusplus
}
#endif
#endif /* NWC_H */
