/*
 * layouts.h - the geometry of layouts 1 and 2 (16 x 512 blocks in mma.m16n8k16 fragment order;
 * docs/format-layouts.md): block and super-chunk constants, the shape of a tensor, the position
 * of each lane's weights in a tile.  Included at the end of internal.h; encoders, decoders and
 * validation all use it.  Their own interfaces are encode_internal.h and decode_internal.h.
 */
#ifndef NWC_LAYOUTS_H
#define NWC_LAYOUTS_H

#include "internal.h"

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

#endif /* NWC_LAYOUTS_H */
