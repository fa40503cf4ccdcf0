/*
 * internal.h - what every translation unit of the codec shares (not installed): the error
 * macros (common/nwc_error.h), the geometry of layout 0 (and, through layouts.h, of layouts 1
 * and 2), the fp8 symbol split, little-endian fields.  The encoder's files add encode_internal.h,
 * the decoders' decode_internal.h; neither includes the other, so a decoder cannot call into the
 * encoder.
 */
#ifndef NWC_INTERNAL_H
#define NWC_INTERNAL_H

#include "nwc.h"

#include "nwc_error.h"

#include <string.h>

/* Largest supported dimension product; keeps every byte count below 2^62. */
#define NWC__MAX_WEIGHTS (UINT64_C(1) << 40)

static inline uint64_t nwc__ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
static inline uint64_t nwc__round_up(uint64_t a, uint64_t b) { return nwc__ceil_div(a, b) * b; }

/* Little-endian fields of records and blobs at any alignment (the host is little-endian: record.c
 * checks). */
static inline void nwc__put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void nwc__put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void nwc__put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint32_t nwc__get32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static inline uint64_t nwc__get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* Shape of a layout-0 tensor, derived from M, K and the element type. */
typedef struct nwc__geom {
  uint64_t M, K, K16;
  uint64_t row_blocks, col_blocks, nblocks;
  uint64_t raw_stride; /* bytes per row of the raw plane */
  unsigned type;       /* NWC_ELEM_BF16 or NWC_ELEM_FP8 */
} nwc__geom;

/* Rows of row block rb that lie inside the tensor (8 except in the last row block). */
static inline unsigned nwc__block_rows(const nwc__geom *g, uint64_t rb) {
  uint64_t left = g->M - rb * NWC_BLOCK_ROWS;
  return left < NWC_BLOCK_ROWS ? (unsigned)left : NWC_BLOCK_ROWS;
}

/* Lanes of column block cb whose 16 columns start below K16; the others have empty streams. */
static inline unsigned nwc__active_lanes(const nwc__geom *g, uint64_t cb) {
  uint64_t left = g->K16 - cb * NWC_BLOCK_COLS;
  return left < NWC_BLOCK_COLS ? (unsigned)(left / NWC_LANE_COLS) : NWC_LANES;
}

/* Bytes from one block's base to the next: its units rounded up to words, then to 8 bytes. */
static inline uint64_t nwc__block_span(uint64_t units) {
  return nwc__round_up(4 * nwc__ceil_div(units, 2), NWC_DATA_ALIGN);
}

/* Fills g for an M x K tensor; -EINVAL for a bad shape, -ENOTSUP for an unknown layout/type. */
int nwc__geom_init(nwc__geom *g, uint64_t M, uint64_t K, unsigned elem);

/* fp8 symbol split (docs/format.md, "fp8 symbols"): symbol 0..9 and the 4-bit raw nibble of an
 * fp8 byte, sign excluded.  Returns -1 for the NaN patterns 0x7f and 0xff. */
int nwc__fp8_split(uint8_t b, unsigned *sym, unsigned *nibble);
/* The byte an fp8 symbol decodes to (its fp32 exponent field shifted right by one). */
extern const uint8_t nwc__fp8_sym_byte[NWC_FP8_SYMBOLS];

/* Position of an fp8 weight's nibble inside a lane's 8 bytes for 16 consecutive weights j:
 * byte (j & 3) + 4 * (j >> 3), high nibble when bit 2 of j is set. */
static inline unsigned nwc__fp8_nib_byte(unsigned j) { return (j & 3u) + 4u * (j >> 3); }
static inline unsigned nwc__fp8_nib_shift(unsigned j) { return (j & 4u) ? 4u : 0u; }

/* The geometry of layouts 1 and 2 (store/layouts.h). */
#include "layouts.h"

#endif /* NWC_INTERNAL_H */
