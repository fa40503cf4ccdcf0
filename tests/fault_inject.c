/*
 * fault_inject.c - libnwc_fault.so, an LD_PRELOAD interposer that makes system calls on the
 * store's files fail, for test_fault_inject.  Driven by the environment:
 *
 *   NWC_FAULT=OP:N:ERR      OP write (write, pwrite, writev, pwritev), fsync (fsync,
 *                           fdatasync), read (read, pread, preadv) or unlink (unlink,
 *                           unlinkat); from the Nth such call on (counted from 1) every one
 *                           fails with ERR (ENOSPC, EIO or EROFS): a full or failing disk stays
 *                           so.  N = 0 fails none (the calls are only counted).  ERR SLOW
 *                           fails none either: each such call first sleeps NWC_FAULT_SLOW_MS
 *                           milliseconds (default 1000), then runs (a slow disk).
 *   NWC_FAULT_PATH=TEXT     only calls on descriptors (or paths) whose path contains TEXT count
 *                           (the store's directory), so logs and sockets are never touched.
 *   NWC_FAULT_ARM=FILE      calls count only while FILE exists, so that a test can start the
 *                           program cleanly and then fail one step of it.
 *
 * The first injected failure is announced on stderr ("nwc_fault: OP call N (PATH): ERR"), so a
 * test can tell whether its N was reached.  io_uring reads (nwcd's loader) do not go through
 * these calls and are not covered.  Thread-safe: one atomic counter per OP.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum { F_WRITE, F_FSYNC, F_READ, F_UNLINK, F_NONE };
static const char *const op_names[] = {"write", "fsync", "read", "unlink"};
static int f_op = F_NONE, f_err, f_slow_ms; /* f_slow_ms > 0: delay, do not fail */
static long f_n;
static char f_path[512], f_arm[512];
static atomic_long f_count[F_NONE];
static atomic_int f_told;

__attribute__((constructor)) static void fault_init(void) {
  const char *s = getenv("NWC_FAULT"), *p = getenv("NWC_FAULT_PATH");
  char op[16] = "", err[16] = "";
  if (!s || sscanf(s, "%15[a-z]:%ld:%15[A-Z]", op, &f_n, err) != 3) return;
  for (int i = 0; i < F_NONE; i++)
    if (!strcmp(op, op_names[i])) f_op = i;
  f_err = !strcmp(err, "ENOSPC") ? ENOSPC : !strcmp(err, "EROFS") ? EROFS : EIO;
  const char *ms = getenv("NWC_FAULT_SLOW_MS");
  if (!strcmp(err, "SLOW")) f_slow_ms = ms ? atoi(ms) : 1000;
  if (p) snprintf(f_path, sizeof f_path, "%s", p);
  const char *arm = getenv("NWC_FAULT_ARM");
  if (arm) snprintf(f_arm, sizeof f_arm, "%s", arm);
}

/* Whether this call (kind, on fd, or on path when fd < 0) fails; errno is set when it does. */
static int fault(int kind, int fd, const char *path) {
  if (kind != f_op) return 0;
  int e = errno;
  int armed = !f_arm[0] || access(f_arm, F_OK) == 0;
  errno = e;
  if (!armed) return 0;
  char buf[512] = "";
  if (fd >= 0) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, buf, sizeof buf - 1);
    errno = e;
    if (n <= 0) return 0;
    buf[n] = 0;
    path = buf;
  }
  if (!path || (f_path[0] && !strstr(path, f_path))) return 0;
  long c = atomic_fetch_add(&f_count[kind], 1) + 1;
  if (f_n <= 0 || c < f_n) return 0;
  if (!atomic_exchange(&f_told, 1)) {
    char line[700];
    int len = snprintf(line, sizeof line, "nwc_fault: %s call %ld (%s): %s\n", op_names[kind], c,
                       path, f_slow_ms > 0 ? "slowed" : strerror(f_err));
    ssize_t (*real)(int, const void *, size_t) = (ssize_t(*)(int, const void *, size_t))dlsym(
        RTLD_NEXT, "write");
    if (real && len > 0) real(2, line, (size_t)len);
  }
  if (f_slow_ms > 0) {
    usleep((useconds_t)f_slow_ms * 1000);
    errno = e;
    return 0;
  }
  errno = f_err;
  return 1;
}

#define REAL(name, type) ((type)dlsym(RTLD_NEXT, name))
#define PUBLIC __attribute__((visibility("default"))) /* the build hides symbols by default */

PUBLIC ssize_t write(int fd, const void *b, size_t n) {
  if (fault(F_WRITE, fd, NULL)) return -1;
  return REAL("write", ssize_t(*)(int, const void *, size_t))(fd, b, n);
}
PUBLIC ssize_t pwrite(int fd, const void *b, size_t n, off_t o) {
  if (fault(F_WRITE, fd, NULL)) return -1;
  return REAL("pwrite", ssize_t(*)(int, const void *, size_t, off_t))(fd, b, n, o);
}
PUBLIC ssize_t pwrite64(int fd, const void *b, size_t n, off_t o) { return pwrite(fd, b, n, o); }
PUBLIC ssize_t writev(int fd, const struct iovec *v, int n) {
  if (fault(F_WRITE, fd, NULL)) return -1;
  return REAL("writev", ssize_t(*)(int, const struct iovec *, int))(fd, v, n);
}
PUBLIC ssize_t pwritev(int fd, const struct iovec *v, int n, off_t o) {
  if (fault(F_WRITE, fd, NULL)) return -1;
  return REAL("pwritev", ssize_t(*)(int, const struct iovec *, int, off_t))(fd, v, n, o);
}
PUBLIC ssize_t pwritev64(int fd, const struct iovec *v, int n, off_t o) {
  return pwritev(fd, v, n, o);
}
PUBLIC int fsync(int fd) {
  if (fault(F_FSYNC, fd, NULL)) return -1;
  return REAL("fsync", int (*)(int))(fd);
}
PUBLIC int fdatasync(int fd) {
  if (fault(F_FSYNC, fd, NULL)) return -1;
  return REAL("fdatasync", int (*)(int))(fd);
}
PUBLIC ssize_t read(int fd, void *b, size_t n) {
  if (fault(F_READ, fd, NULL)) return -1;
  return REAL("read", ssize_t(*)(int, void *, size_t))(fd, b, n);
}
PUBLIC ssize_t pread(int fd, void *b, size_t n, off_t o) {
  if (fault(F_READ, fd, NULL)) return -1;
  return REAL("pread", ssize_t(*)(int, void *, size_t, off_t))(fd, b, n, o);
}
PUBLIC ssize_t pread64(int fd, void *b, size_t n, off_t o) { return pread(fd, b, n, o); }
PUBLIC ssize_t preadv(int fd, const struct iovec *v, int n, off_t o) {
  if (fault(F_READ, fd, NULL)) return -1;
  return REAL("preadv", ssize_t(*)(int, const struct iovec *, int, off_t))(fd, v, n, o);
}
PUBLIC int unlink(const char *p) {
  if (fault(F_UNLINK, -1, p)) return -1;
  return REAL("unlink", int (*)(const char *))(p);
}
PUBLIC int unlinkat(int dfd, const char *p, int flags) {
  char full[1024];
  char link[64], dir[512] = "";
  snprintf(link, sizeof link, "/proc/self/fd/%d", dfd);
  ssize_t n = dfd >= 0 ? readlink(link, dir, sizeof dir - 1) : -1;
  if (n > 0) dir[n] = 0;
  snprintf(full, sizeof full, "%s/%s", dir, p);
  if (fault(F_UNLINK, -1, full)) return -1;
  return REAL("unlinkat", int (*)(int, const char *, int))(dfd, p, flags);
}
