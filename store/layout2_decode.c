/*
 * layout2_decode.c - the portable tile decoder of layout 2 (docs/format-layouts.md, "Layout 2";
 * its encoder is layout2_encode.c): per lane, 16 nibbles [sign | rank] from the nibble plane,
 * the high byte psym[rank] with the sign, the low byte from the raw plane (BF16) or the 3-bit
 * mantissa field shifted left by 4 plus psym[8 + rank] (fp8).  Exceptions (rank 7) come out as
 * +-0; the block walker (lx_decode.c) writes them over.  It defines the results: the SIMD
 * decoders of layout2_simd.c must match it bit for bit.
 */
#include "decode_internal.h"

void nwc__l2_tile_portable(const nwc__lgeom *lg, const uint8_t *raw, const uint8_t lut[16],
                           uint64_t gr, uint64_t s, unsigned nlanes, uint16_t *dst, size_t stride) {
  int bf16 = lg->g.type == NWC_ELEM_BF16;
  const uint8_t *low = raw + lg->nib_bytes;
  const uint8_t *pair = low + (gr * nwc__ceil_div(lg->slots, 2) + (s >> 1)) * 3 * NWC_LANES * 4;
  for (unsigned L = 0; L < nlanes; L++) {
    uint64_t ls = (gr * lg->slots + s) * NWC_LANES + L;
    const uint8_t *nb = raw + ls * 8;
    uint64_t f = bf16 ? 0 : nwc__l2_fp8_fields48(pair, L, (unsigned)(s & 1));
    uint16_t *o = dst + (L >> 2) * stride + 8 * (L & 3);
    for (unsigned j = 0; j < NWC__SC_WEIGHTS; j++) {
      unsigned nib = nb[j >> 1] >> 4 * (j & 1) & 15u, r = nib & 7u;
      unsigned hi = lut[r] | (nib & 8u) << 4;
      unsigned lo = bf16 ? low[ls * 16 + j] : (unsigned)((f >> 3 * j) & 7u) << 4 | lut[8 + r];
      o[8 * ((j >> 1) & 1u) * stride + nwc__frag_col(0, j)] = (uint16_t)(hi << 8 | lo);
    }
  }
}
