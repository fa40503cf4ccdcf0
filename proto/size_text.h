/*
 * size_text.h - a byte count as people read it ("1.4 GiB", "512 B"), for nwcctl's tables and
 * nwcd's messages, which say sizes the same way.
 */
#ifndef NWC_SIZE_TEXT_H
#define NWC_SIZE_TEXT_H

#include <stdint.h>
#include <stdio.h>

/* Writes b into buf (at least 16 bytes) in B, KiB, MiB, GiB or TiB, one decimal above B;
 * returns buf. */
static inline const char *nwc_size_text(uint64_t b, char buf[static 16]) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int i = 0;
  while (v >= 1024 && i < 4) v /= 1024, i++;
  if (i == 0) snprintf(buf, 16, "%u B", (unsigned)b); /* b < 1024 */
  else snprintf(buf, 16, "%.1f %s", v, unit[i]);
  return buf;
}

#endif
