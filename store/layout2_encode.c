/*
 * layout2_encode.c - the encoder of layout 2 (docs/format-layouts.md, "Layout 2"): fixed-width
 * nibbles [sign | rank] for the seven most frequent symbols, the raw plane behind them, and
 * per-block exception lists.  Its decoders are layout2_decode.c (portable) and layout2_simd.c.
 *
 * Symbols: BF16 the 7-bit exponent byte (high byte without the sign, 128 symbols); fp8 the BF16
 * exponent field E of the value (19 symbols k: k = 0 for E = 0, the zeros; k = E - 117 for
 * E = 118..135: the subnormal groups 118, 119, 120 and the normal exponents), so that every fp8
 * value is [sign | E | 3-bit mantissa field | 0000] as BF16.  Ranks by descending count, ties by
 * ascending symbol; ranks 0..6 get nibbles, the rest are exceptions (nibble 7, sign 0, raw
 * fields 0; the entry holds the weight).
 */
#include "encode_internal.h"

#include <stdlib.h>
#include <string.h>

#define FP8_L2_SYMBOLS 19

static inline unsigned fp8_exp(uint8_t b) { return (nwc_fp8_to_bf16(b) >> 7) & 0xffu; }

/* Ranks the symbols, fills psym (the lut), p->nib and p->mant. */
static int plan_symbols(nwc__lx_plan *p, uint64_t *freq_out, uint8_t psym[16]) {
  const nwc__geom *g = &p->lg.g;
  uint64_t n = g->M * g->K, freq[128] = {0};
  unsigned order[128], rank_of[128];
  memset(psym, 0, NWC_RANKS);
  if (p->w16) {
    for (uint64_t i = 0; i < n; i++) freq[(p->w16[i] >> 8) & 0x7f]++;
    nwc__rank_symbols(freq, 128, order);
    for (unsigned r = 0; r < 128; r++) rank_of[order[r]] = r;
    for (unsigned r = 0; r < 7; r++) psym[r] = (uint8_t)order[r];
    for (unsigned hb = 0; hb < 256; hb++) {
      unsigned r = rank_of[hb & 0x7f];
      p->nib[hb] = (uint8_t)(r < 7 ? (hb >> 7) << 3 | r : 7);
    }
    if (freq_out) memcpy(freq_out, freq, 128 * sizeof *freq);
    return 0;
  }
  unsigned sym_of[256];
  for (unsigned b = 0; b < 256; b++) {
    unsigned e = fp8_exp((uint8_t)b);
    sym_of[b] = (b & 0x7f) == 0x7f ? FP8_L2_SYMBOLS : e ? e - 117 : 0;
    p->mant[b] = (uint8_t)((nwc_fp8_to_bf16((uint8_t)b) >> 4) & 7u);
  }
  NWC_TRY(nwc__fp8_count(p->w8, n, g->K, sym_of, FP8_L2_SYMBOLS, freq));
  nwc__rank_symbols(freq, FP8_L2_SYMBOLS, order);
  for (unsigned r = 0; r < FP8_L2_SYMBOLS; r++) rank_of[order[r]] = r;
  for (unsigned r = 0; r < 7; r++) {
    unsigned e = order[r] ? order[r] + 117 : 0;
    psym[r] = (uint8_t)(e >> 1);
    psym[8 + r] = (uint8_t)((e & 1u) << 7);
  }
  for (unsigned b = 0; b < 256; b++) {
    unsigned r = sym_of[b] < FP8_L2_SYMBOLS ? rank_of[sym_of[b]] : 7;
    p->nib[b] = (uint8_t)(r < 7 ? (b >> 7) << 3 | r : 7);
  }
  if (freq_out) memcpy(freq_out, freq, FP8_L2_SYMBOLS * sizeof *freq);
  return 0;
}

int nwc__l2_plan(nwc__lx_plan *p, uint64_t *freq, uint8_t psym[16], uint64_t *bases,
                 uint8_t *hdr, uint64_t *data_bytes) {
  const nwc__lgeom *lg = &p->lg;
  NWC_TRY(plan_symbols(p, freq, psym));
  uint64_t off = 0;
  for (uint64_t b = 0; b < lg->g.nblocks; b++) {
    uint64_t entries = 0;
    bases[b] = off;
    for (unsigned L = 0; L < NWC_LANES; L++) {
      uint64_t in[256];
      unsigned n = 0, nw = nwc__lx_lane_inputs(lg, b, L, in);
      for (unsigned idx = 0; idx < nw; idx++) {
        int k = nwc__lx_key(p, in[idx]);
        n += k >= 0 && (p->nib[k] & 7) == 7;
      }
      NWC_RETURN_IF(n > NWC__L2_MAX_EXC, -ERANGE,
                    "layout 2: block %llu lane %u has %u exceptions, at most %d fit",
                    (unsigned long long)b, L, n, NWC__L2_MAX_EXC);
      hdr[b * NWC_LANES + L] = (uint8_t)n;
      entries += n;
    }
    off = nwc__round_up(off + entries * lg->exc_bytes, NWC_DATA_ALIGN);
  }
  bases[lg->g.nblocks] = off;
  *data_bytes = off + NWC_DATA_SLACK;
  return 0;
}

/* Sets the 3-bit field t of lane L in the three words of a slot pair. */
static void put_field(uint8_t *pair, unsigned L, unsigned t, unsigned v) {
  for (unsigned k = 0; k < 3; k++) {
    if (!(v >> k & 1)) continue;
    unsigned bit = 3 * t + k;
    pair[((bit >> 5) * NWC_LANES + L) * 4 + ((bit & 31) >> 3)] |= (uint8_t)(1u << (bit & 7));
  }
}

void nwc__l2_write(const nwc__lx_plan *p, uint8_t *data, uint8_t *raw) {
  const nwc__lgeom *lg = &p->lg;
  int bf16 = lg->g.type == NWC_ELEM_BF16;
  uint8_t *nibs = raw, *low = raw + lg->nib_bytes;
  memset(raw, 0, lg->nib_bytes + lg->low_bytes);
  uint64_t pairs = nwc__ceil_div(lg->slots, 2);
  for (uint64_t b = 0; b < lg->g.nblocks; b++) {
    uint8_t *e = data + p->bases[b];
    uint64_t gr = b / lg->g.col_blocks, cb = b % lg->g.col_blocks;
    for (unsigned L = 0; L < NWC_LANES; L++) {
      uint64_t in[256];
      unsigned nw = nwc__lx_lane_inputs(lg, b, L, in);
      for (unsigned idx = 0; idx < nw; idx++) {
        uint64_t i = in[idx], slot = cb * NWC__SC_PER_BLOCK + (idx >> 4); /* within the group */
        int k = nwc__lx_key(p, i);
        if (k < 0) continue; /* filler: nibble 0, raw 0 */
        unsigned j = idx & 15, nib = p->nib[k];
        uint64_t ls = (gr * lg->slots + slot) * NWC_LANES + L;
        nibs[ls * 8 + (j >> 1)] |= (uint8_t)(nib << 4 * (j & 1));
        if ((nib & 7) == 7) {
          e[0] = (uint8_t)idx;
          if (bf16) {
            e[1] = (uint8_t)p->w16[i];
            e[2] = (uint8_t)(p->w16[i] >> 8);
          } else {
            e[1] = p->w8[i];
          }
          e += lg->exc_bytes;
        } else if (bf16) {
          low[ls * 16 + j] = (uint8_t)p->w16[i];
        } else {
          uint8_t *pair = low + (gr * pairs + (slot >> 1)) * 3 * NWC_LANES * 4;
          put_field(pair, L, 16 * (unsigned)(slot & 1) + j, p->mant[k]);
        }
      }
    }
    memset(e, 0, (size_t)(data + p->bases[b + 1] - e)); /* alignment padding */
  }
  memset(data + p->bases[lg->g.nblocks], 0, NWC_DATA_SLACK);
}
