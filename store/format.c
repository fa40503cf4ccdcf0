/*
 * format.c - format parameters (nwc_info), the fp8 symbol split, and the BF16/fp8 scalar
 * conversions the codec and its tools share.  The shape arithmetic is in geometry.c.
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
