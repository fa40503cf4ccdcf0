/*
 * format.c - format parameters and shape arithmetic (nwc_info, nwc_layout, nwc_encode_bound), the
 * fp8 symbol split, and the BF16/fp8 scalar conversions the codec and its tools share.
 */
#include "internal.h"

#include <string.h>

int64_t nwc_info(int key) {
  switch (key) {
  case NWC_INFO_VERSION: return NWC_FORMAT_VERSION;
  case NWC_INFO_STATES_PER_LANE: return 1;
  case NWC_INFO_TABLE_WORDS: return NWC_TAB_ENTRIES;
  case NWC_INFO_HEADER_BYTES: return NWC_LANES;
  case NWC_INFO_BLOCK_WEIGHTS: return NWC_BLOCK_ROWS * NWC_BLOCK_COLS;
  default: return nwc__fail(-EINVAL, "nwc_info: unknown key %d", key);
  }
}

int nwc__geom_init(nwc__geom *g, uint64_t M, uint64_t K, unsigned elem) {
  NWC_RETURN_IF(M == 0 || K == 0, -EINVAL, "shape %llux%llu: zero dimension",
                (unsigned long long)M, (unsigned long long)K);
  NWC_RETURN_IF(M > NWC__MAX_WEIGHTS || K > NWC__MAX_WEIGHTS || M > NWC__MAX_WEIGHTS / K, -EINVAL,
                "shape %llux%llu: more than 2^40 weights", (unsigned long long)M,
                (unsigned long long)K);
  unsigned type = NWC_ELEM_TYPE(elem), layout = NWC_ELEM_LAYOUT(elem);
  NWC_RETURN_IF(elem > 255 || (type != NWC_ELEM_BF16 && type != NWC_ELEM_FP8), -EINVAL,
                "elem 0x%x: unknown element type", elem);
  NWC_RETURN_IF(layout > 2, -ENOTSUP, "elem 0x%x: layout %u is not implemented", elem, layout);
  memset(g, 0, sizeof *g);
  g->M = M;
  g->K = K;
  g->K16 = nwc__round_up(K, NWC_LANE_COLS);
  /* layouts 1 and 2 (store/layout_common.c): row groups of 16, a raw plane that is not row-major */
  g->row_blocks = nwc__ceil_div(M, layout ? NWC__LX_BLOCK_ROWS : NWC_BLOCK_ROWS);
  g->col_blocks = nwc__ceil_div(K, NWC_BLOCK_COLS);
  g->nblocks = g->row_blocks * g->col_blocks;
  g->raw_stride = layout ? 0 : type == NWC_ELEM_BF16 ? g->K16 : g->K16 / 2;
  g->type = type;
  return 0;
}

int nwc_layout(uint64_t M, uint64_t K, unsigned elem, uint64_t out[4]) {
  nwc__geom g = {0};
  NWC_TRY(nwc__geom_init(&g, M, K, elem));
  if (NWC_ELEM_LAYOUT(elem) != 0) return nwc__lx_layout(M, K, elem, out);
  out[NWC_LAYOUT_BLOCKS] = g.nblocks;
  out[NWC_LAYOUT_RAW_BYTES] = g.M * g.raw_stride;
  out[NWC_LAYOUT_SCRATCH] = g.row_blocks * NWC_BLOCK_ROWS * g.col_blocks;
  out[NWC_LAYOUT_K16] = g.K16;
  return 0;
}

int64_t nwc_encode_bound(uint64_t M, uint64_t K, unsigned elem) {
  nwc__geom g = {0};
  NWC_TRY(nwc__geom_init(&g, M, K, elem));
  if (NWC_ELEM_LAYOUT(elem) != 0) return nwc__lx_encode_bound(M, K, elem);
  /* 32 lanes of 192 units is 12288 bytes, already a multiple of the 8-byte alignment. */
  return (int64_t)(g.nblocks * NWC_LANES * NWC_LANE_MAX_UNITS * 2 + NWC_DATA_SLACK);
}

/* ---- fp8 e4m3 symbols ----------------------------------------------------------------------- */

/* Symbol s < 8 is a normal exponent pair e >> 1 (byte 60 + s); 8 the subnormals 1..3 (byte 59,
 * fp32 exponents 118/119); 9 zero (byte 0). */
const uint8_t nwc__fp8_sym_byte[NWC_FP8_SYMBOLS] = {60, 61, 62, 63, 64, 65, 66, 67, 59, 0};

int nwc__fp8_split(uint8_t b, unsigned *sym, unsigned *nibble) {
  unsigned e = (b >> 3) & 15u, m = b & 7u;
  if (e == 15 && m == 7) return -1; /* NaN */
  if (e > 0) {
    *sym = e >> 1;
    *nibble = ((e & 1u) << 3) | m;
  } else if (m >= 4) {
    *sym = 0;
    *nibble = (m - 4) << 1;
  } else if (m > 0) {
    static const uint8_t small[4] = {0, 0, 8, 12};
    *sym = 8;
    *nibble = small[m];
  } else {
    *sym = 9;
    *nibble = 0;
  }
  return 0;
}

/* ---- scalar conversions --------------------------------------------------------------------- */

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t nwc_f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float nwc_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t nwc_fp8_to_bf16(uint8_t b) {
  unsigned sym, nib;
  uint16_t sign = (uint16_t)((b & 0x80u) << 8);
  if (nwc__fp8_split(b, &sym, &nib) < 0) return (uint16_t)(sign | 0x7fc0u);
  return (uint16_t)(sign | (nwc__fp8_sym_byte[sym] << 8) | (nib << 4));
}

float nwc_fp8_to_f32(uint8_t b) { return nwc_bf16_to_f32(nwc_fp8_to_bf16(b)); }
