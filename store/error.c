/*
 * error.c - error text: nwc_strerror() for the negative errno values every nwc call returns, and
 * the thread-local detail line that NWC_RETURN_IF records (nwc__fail) or prefixes
 * (nwc__fail_prefix).
 */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char detail[1024]; /* room for a path, a tensor name and the reason */

/* Formats into a local buffer first: callers pass the current detail on ("%s",
 * nwc_error_detail()), and vsnprintf into its own argument is undefined (glibc gives ""). */
int nwc__fail(int err, const char *fmt, ...) {
  char buf[sizeof detail];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  memcpy(detail, buf, sizeof detail);
  return err;
}

const char *nwc_error_detail(void) { return detail; }

int nwc__fail_prefix(int err, const char *fmt, ...) {
  char prefix[512], old[1024];
  snprintf(old, sizeof old, "%s", nwc_error_detail());
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  return nwc__fail(err, "%s: %s", prefix, old);
}

const char *nwc_strerror(int err) {
  switch (err) {
  case 0: return "success";
  case -EINVAL: return "invalid argument";
  case -EBADMSG: return "malformed or corrupt data";
  case -ENOSPC: return "output buffer too small";
  case -ENOMEM: return "out of memory";
  case -ENOTSUP: return "not supported by this build";
  case -ERANGE: return "value out of range";
  case -EIO: return "input/output error";
  case -ENOENT: return "no such file or entry";
  default: return err < 0 ? strerror(-err) : "unknown status";
  }
}
