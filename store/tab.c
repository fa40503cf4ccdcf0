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

/* Fills tab[i] = v for i in [lo, lo + n). */
static void fill(uint32_t *tab, unsigned lo, unsigned n, uint32_t v) {
  for (unsigned i = lo; i < lo + n; i++) tab[i] = v;
}

/* Built code by code rather than pattern by pattern: the code of rank z with sign s is z zeros,
 * a one and s (z + 2 bits), so the patterns that start with it are one contiguous range of the
 * table, and within it those whose next bits start with a second whole code are again one range
 * per (rank, sign).  Every entry is written once or twice; no pattern is scanned bit by bit. */
int nwc_build_tab(const uint8_t psym[16], unsigned elem, uint32_t tab[4096]) {
  unsigned type = NWC_ELEM_TYPE(elem);
  NWC_RETURN_IF(type != NWC_ELEM_BF16 && type != NWC_ELEM_FP8, -EINVAL,
                "nwc_build_tab: unknown element type in elem 0x%x", elem);
  for (unsigned z0 = 0; z0 + 2 <= NWC_TAB_BITS; z0++) {
    unsigned l0 = z0 + 2, rest = NWC_TAB_BITS - l0;
    for (unsigned s0 = 0; s0 < 2; s0++) {
      uint32_t b0 = (s0 << 7) | psym[z0];
      unsigned base0 = (2u | s0) << rest;
      fill(tab, base0, 1u << rest, NWC_TAB_SLOW | l0 | (b0 << 8)); /* second code incomplete */
      for (unsigned z1 = 0; z1 + 2 <= rest; z1++) {
        unsigned l1 = z1 + 2;
        for (unsigned s1 = 0; s1 < 2; s1++) {
          uint32_t b1 = (s1 << 7) | psym[z1];
          fill(tab, base0 + ((2u | s1) << (rest - l1)), 1u << (rest - l1),
               (l0 + l1) | (b0 << 8) | (b1 << 16));
        }
      }
    }
  }
  tab[0] = NWC_TAB_SLOW | ((uint32_t)psym[11] << 8) | ((uint32_t)psym[12] << 16);
  tab[1] = NWC_TAB_SLOW | ((uint32_t)psym[13] << 8) | ((uint32_t)psym[14] << 16);
  return 0;
}
