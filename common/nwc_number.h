/*
 * nwc_number.h - a number written by a person (a command-line value, an environment variable):
 * decimal digits only, nothing before or after them, no sign, and no larger than a maximum.
 * strtoull alone takes leading blanks, a sign and an empty string's 0.
 */
#ifndef NWC_NUMBER_H
#define NWC_NUMBER_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* Whether s is a decimal number no larger than max (digits only), into *out. */
static inline bool nwc__u64_of(const char *s, uint64_t max, uint64_t *out) {
  if (!s || s[0] < '0' || s[0] > '9') return false;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end || errno || v > max) return false;
  *out = v;
  return true;
}

#endif /* NWC_NUMBER_H */
