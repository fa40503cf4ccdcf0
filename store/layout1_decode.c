/*
 * layout1_decode.c - the tile decoder of layout 1 (docs/format-layouts.md, "Layout 1"; its
 * encoder is layout1_encode.c): the layout-0 lane decoder (nwc__pcdec_*, decode.c) decodes 16
 * codes per lane and super-chunk, and each lane's high bytes are joined with its 16 bytes of the
 * raw plane (fp8: 8 bytes of nibbles) into the tile in fragment order.  Tiles come out in stream
 * order; the block walker (lx_decode.c) calls this one super-chunk at a time.
 */
#include "decode_internal.h"

#include <string.h>

int nwc__l1_tile(nwc__pcdec *pc, const nwc__lgeom *lg, const uint8_t *raw, uint64_t slot,
                 uint32_t lanes, uint16_t *dst, size_t stride) {
  /* j of tile row r's columns +0..+7 and of row r + 8's (section 2 of docs/format-layouts.md) */
  static const uint8_t row_j[2][8] = {{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}};
  int bf16 = lg->g.type == NWC_ELEM_BF16;
  uint8_t h[NWC_LANES][16];
  NWC_TRY(nwc__pcdec_lanes16(pc, lanes, h));
  for (; lanes; lanes &= lanes - 1) {
    unsigned L = (unsigned)__builtin_ctz(lanes);
    uint8_t lo[16];
    const uint8_t *lr = raw + (slot * NWC_LANES + L) * (bf16 ? 16 : 8);
    if (bf16) {
      memcpy(lo, lr, 16);
    } else { /* word 0: weights 0..3 in the low nibbles, 4..7 in the high ones; word 1: 8..15 */
      uint32_t q[2], v[4];
      memcpy(q, lr, 8);
      v[0] = (q[0] & 0x0f0f0f0fu) << 4, v[1] = q[0] & 0xf0f0f0f0u;
      v[2] = (q[1] & 0x0f0f0f0fu) << 4, v[3] = q[1] & 0xf0f0f0f0u;
      memcpy(lo, v, 16);
    }
    uint16_t *o = dst + (L >> 2) * stride + 8 * (L & 3);
    for (unsigned half = 0; half < 2; half++, o += 8 * stride)
      for (unsigned k = 0; k < 8; k++) {
        unsigned j = row_j[half][k];
        o[k] = (uint16_t)(h[L][j] << 8 | lo[j]);
      }
  }
  return 0;
}
