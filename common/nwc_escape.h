/*
 * nwc_escape.h - text from outside made safe to print: a name from a file or from the daemon
 * may hold control bytes (an escape sequence rewrites the user's terminal).  nwc__escape copies
 * it with every C0 control, DEL and C1 control (U+0080..U+009F, as UTF-8) written as \xNN
 * (C1: \u00NN); everything else, valid UTF-8 or not, is copied as it is.
 */
#ifndef NWC_ESCAPE_H
#define NWC_ESCAPE_H

#include <stddef.h>
#include <stdio.h>

/* Copies s into out (cap > 0 bytes, always NUL-terminated, cut at a whole character or escape
 * when it does not fit) with control characters escaped; returns out. */
static inline const char *nwc__escape(const char *s, char *out, size_t cap) {
  size_t o = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    char e[8];
    size_t n = 1;
    if (*p < 0x20 || *p == 0x7f) n = (size_t)snprintf(e, sizeof e, "\\x%02x", *p);
    else if (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f)
      n = (size_t)snprintf(e, sizeof e, "\\u00%02x", p[1]), p++;
    else e[0] = (char)*p;
    if (o + n >= cap) break;
    for (size_t i = 0; i < n; i++) out[o++] = e[i];
  }
  out[o] = 0;
  return out;
}

#endif
