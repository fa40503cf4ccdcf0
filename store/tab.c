/*
 * tab.c - the 4096-entry lookup table the decoders index with the next 12 bits of a lane stream.
 *
 * Entry for a 12-bit pattern p (first stream bit = bit 11 of p), docs/format.md "Lookup table":
 *   fast (both codes complete):  byte 0 = bits used by both, byte 1 = byte of weight 0,
 *                                byte 2 = byte of weight 1, byte 3 = 0
 *   slow (bit 30 set):           byte 0 = length of the first code if it is complete, else 0;
 *                                byte 1 = its byte (or 0)
 *   p = 0 and p = 1 (no complete code possible): bit 30, byte 0 = 0, bytes 1..2 = psym[11], psym[12]
 *                                (p = 0) and psym[13], psym[14] (p = 1).
 * A "byte" is sign << 7 | psym[rank].  psym[r] for r <= 10 is byte 1 of entry 1 << (11 - r).
 */
#include "internal.h"

/* Length and byte of the code at the top of the n-bit pattern p, or 0 if it is not complete. */
static unsigned first_code(unsigned p, unsigned n, const uint8_t psym[16], unsigned *byte) {
  unsigned z = 0;
  while (z < n && !(p & (1u << (n - 1 - z)))) z++;
  if (z + 2 > n) return 0; /* the one or the sign bit is beyond the pattern */
  unsigned sign = (p >> (n - 2 - z)) & 1u;
  *byte = (sign << 7) | psym[z];
  return z + 2;
}

int nwc_build_tab(const uint8_t psym[16], unsigned elem, uint32_t tab[4096]) {
  unsigned type = NWC_ELEM_TYPE(elem);
  NWC_RETURN_IF(type != NWC_ELEM_BF16 && type != NWC_ELEM_FP8, -EINVAL,
                "nwc_build_tab: unknown element type in elem 0x%x", elem);
  for (unsigned p = 2; p < NWC_TAB_ENTRIES; p++) {
    unsigned b0 = 0, b1 = 0;
    unsigned l0 = first_code(p, NWC_TAB_BITS, psym, &b0); /* p >= 2: always complete (<= 12 bits) */
    unsigned rest = NWC_TAB_BITS - l0;
    unsigned l1 = first_code(p & ((1u << rest) - 1u), rest, psym, &b1);
    if (l1)
      tab[p] = (l0 + l1) | (b0 << 8) | (b1 << 16);
    else
      tab[p] = NWC_TAB_SLOW | l0 | (b0 << 8);
  }
  tab[0] = NWC_TAB_SLOW | ((uint32_t)psym[11] << 8) | ((uint32_t)psym[12] << 16);
  tab[1] = NWC_TAB_SLOW | ((uint32_t)psym[13] << 8) | ((uint32_t)psym[14] << 16);
  return 0;
}
