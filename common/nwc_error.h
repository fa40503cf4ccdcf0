/*
 * nwc_error.h - how nwc code fails, for every folder (codec, store, protocol, daemon, client) and
 * for C and C++ (not installed).
 *
 * Every fallible function returns 0 (or a count) on success and a negative errno on failure.
 * Where the failure needs words, nwc__fail records a one-line detail in a thread-local buffer and
 * returns the errno; nwc_error_detail() (store/nwc.h) reads it back and nwc_strerror() names the
 * errno.  NWC_RETURN_IF is how bytes from outside (files, sockets) are rejected: an early return
 * with that detail.  NWC_TRY propagates a negative status unchanged.  assert() is for the code's
 * own invariants only.  The definitions are in store/error.c (library nwc_codec_common).
 */
#ifndef NWC_ERROR_H
#define NWC_ERROR_H

#include <errno.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define NWC__PRINTF(a, b) __attribute__((format(printf, a, b)))
#define NWC__LIKELY(x) __builtin_expect(!!(x), 1)
#define NWC__UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define NWC__PRINTF(a, b)
#define NWC__LIKELY(x) (x)
#define NWC__UNLIKELY(x) (x)
#endif

/* Records the detail text for err and returns err. */
int nwc__fail(int err, const char *fmt, ...) NWC__PRINTF(2, 3);
/* Records "prefix: <current detail>" as the detail and returns err (prefix may be long). */
int nwc__fail_prefix(int err, const char *fmt, ...) NWC__PRINTF(2, 3);

#ifdef __cplusplus
}
#endif

/* Returns nwc__fail(err, ...) from the enclosing function when cond holds. */
#define NWC_RETURN_IF(cond, err, ...)                                                            \
  do {                                                                                           \
    if (NWC__UNLIKELY(cond)) return nwc__fail((err), __VA_ARGS__);                               \
  } while (0)

/* Propagates a negative status. */
#define NWC_TRY(expr)                                                                            \
  do {                                                                                           \
    int64_t nwc__rc = (expr);                                                                    \
    if (nwc__rc < 0) return (int)nwc__rc;                                                        \
  } while (0)

#endif /* NWC_ERROR_H */
