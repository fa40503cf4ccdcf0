/*
 * layout1_encode.c - the encoder of layout 1 (docs/format-layouts.md, "Layout 1"): the layout-0
 * prefix code and lane streams, with 16 x 512 blocks whose lane streams follow the mma.m16n8k16
 * fragment order, and a raw plane [row group][slot][lane][16 bytes] (fp8: 8 bytes of nibbles).
 * Its decoder is layout1_decode.c.
 *
 * The code of every input byte comes from the layout-0 encoder (nwc__prefix_codes), so
 * symbols, ranking and psym are those of layout 0; this file only orders the weights.  Lane L of
 * a block codes, for each coded super-chunk sc, its 16 weights j = 0..15 at tile row
 * nwc__frag_row(L, j) and column nwc__frag_col(L, j); a position outside the tensor (row >= M or
 * column >= K) is a filler (rank 0, sign 0: the 2-bit code "1 0").  Each lane's stream is padded
 * with zero bits to whole 32-bit words; hdr = words; the lanes follow each other word-aligned.
 */
#include "encode_internal.h"

#include <stdlib.h>
#include <string.h>

int nwc__l1_plan(nwc__lx_plan *p, uint64_t *freq, uint8_t psym[16], uint64_t *bases,
                 uint8_t *hdr, uint64_t *data_bytes) {
  const nwc__lgeom *lg = &p->lg;
  NWC_TRY(nwc__prefix_codes(p->w16 ? (const void *)p->w16 : (const void *)p->w8, lg->g.M, lg->g.K,
                            lg->g.type, freq, psym, p->bits, p->len));
  for (unsigned b = 0; b < 256 && lg->g.type == NWC_ELEM_FP8; b++) {
    unsigned s, nib = 0;
    if (nwc__fp8_split((uint8_t)b, &s, &nib) == 0) p->fp8_nib[b] = (uint8_t)nib;
  }
  uint64_t off = 0;
  for (uint64_t b = 0; b < lg->g.nblocks; b++) {
    uint64_t words = 0;
    bases[b] = off;
    for (unsigned L = 0; L < NWC_LANES; L++) {
      uint64_t bits = 0, in[256];
      unsigned n = nwc__lx_lane_inputs(lg, b, L, in);
      for (unsigned k = 0; k < n; k++) {
        int key = nwc__lx_key(p, in[k]);
        bits += key < 0 ? 2 : p->len[key];
      }
      hdr[b * NWC_LANES + L] = (uint8_t)nwc__ceil_div(bits, 32);
      words += nwc__ceil_div(bits, 32);
    }
    off = nwc__round_up(off + 4 * words, NWC_DATA_ALIGN);
  }
  bases[lg->g.nblocks] = off;
  *data_bytes = off + NWC_DATA_SLACK;
  return 0;
}

static inline void put_le32(uint8_t *dst, uint32_t v) {
  dst[0] = (uint8_t)v;
  dst[1] = (uint8_t)(v >> 8);
  dst[2] = (uint8_t)(v >> 16);
  dst[3] = (uint8_t)(v >> 24);
}

void nwc__l1_write(const nwc__lx_plan *p, uint8_t *data, uint8_t *raw) {
  const nwc__lgeom *lg = &p->lg;
  int bf16 = lg->g.type == NWC_ELEM_BF16;
  memset(raw, 0, lg->low_bytes);
  for (uint64_t b = 0; b < lg->g.nblocks; b++) {
    uint8_t *dst = data + p->bases[b];
    uint64_t gr = b / lg->g.col_blocks, cb = b % lg->g.col_blocks;
    for (unsigned L = 0; L < NWC_LANES; L++) {
      uint64_t acc = 0, in[256]; /* MSB-first writer: pending bits right-aligned */
      unsigned n = 0, nw = nwc__lx_lane_inputs(lg, b, L, in);
      for (unsigned k = 0; k < nw; k++) {
        int key = nwc__lx_key(p, in[k]);
        uint32_t bits = key < 0 ? 2u : p->bits[key], len = key < 0 ? 2u : p->len[key];
        acc = acc << len | bits;
        n += len;
        if (n >= 32) {
          n -= 32;
          put_le32(dst, (uint32_t)(acc >> n));
          dst += 4;
        }
        if (key < 0) continue;
        unsigned sc = k >> 4, j = k & 15;
        uint64_t slot = gr * lg->slots + cb * NWC__SC_PER_BLOCK + sc;
        uint8_t *lane_raw = raw + (slot * NWC_LANES + L) * (bf16 ? 16 : 8);
        if (bf16)
          lane_raw[j] = (uint8_t)p->w16[in[k]];
        else
          lane_raw[nwc__fp8_nib_byte(j)] |= (uint8_t)(p->fp8_nib[key] << nwc__fp8_nib_shift(j));
      }
      if (n) {
        put_le32(dst, (uint32_t)(acc << (32 - n)));
        dst += 4;
      }
    }
    memset(dst, 0, (size_t)(data + p->bases[b + 1] - dst)); /* alignment padding */
  }
  memset(data + p->bases[lg->g.nblocks], 0, NWC_DATA_SLACK);
}
