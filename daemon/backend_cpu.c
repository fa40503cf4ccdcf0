/*
 * backend_cpu.c - the compute backend interface (nwcd.h, nwcd_backend) and its CPU
 * implementation: host memory from posix_memalign, pinned with mlock where RLIMIT_MEMLOCK allows
 * (a warning once otherwise), and the store/ decoders for dequant, gather and matvec.
 *
 * The seam for #8: a "cuda" backend fills the same struct (cudaHostAlloc for host_alloc, kernels
 * for compute); until then --backend cuda is refused with a clear message and auto means cpu.
 */
#include "nwcd.h"

#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static atomic_int mlock_warned;

static void *cpu_host_alloc(size_t n, bool *locked) {
  void *p = NULL;
  size_t len = (n + 4095) & ~(size_t)4095;
  if (posix_memalign(&p, 4096, len ? len : 4096) != 0) return NULL;
  *locked = mlock(p, len) == 0;
  if (!*locked && !atomic_exchange(&mlock_warned, 1))
    nwcd_log(NWCD_LOG_WARN,
             "mlock of %zu bytes failed (%s): resident tensors are not pinned; raise "
             "RLIMIT_MEMLOCK (LimitMEMLOCK=infinity) to pin them",
             len, strerror(errno));
  return p;
}

static void cpu_host_free(void *p, size_t n, bool locked) {
  if (!p) return;
  if (locked) munlock(p, (n + 4095) & ~(size_t)4095);
  free(p);
}

static int cpu_dequant(const nwc_tensor *t, uint64_t rb0, uint64_t rb1, uint16_t *out) {
  return nwc_dequant_range(t, rb0, rb1, out);
}

static int cpu_gather(const nwc_tensor *t, const uint64_t *rows, uint64_t n, uint16_t *out) {
  return nwc_gather(t, rows, n, out);
}

static int cpu_matvec(const nwc_tensor *t, const float *X, unsigned ncols, size_t ldx,
                      const float *bias, float *Y, size_t ldy) {
  /* One column: the single-vector kernel (X is K16 long, zero padded: ldx >= K16). */
  if (ncols == 1) return nwc_matvec(t, X, bias, Y, NULL);
  return nwc_matvec_batch(t, X, ncols, ldx, bias, Y, ldy, NULL);
}

static const nwcd_backend cpu_backend = {"cpu", cpu_host_alloc, cpu_host_free, cpu_dequant,
                                         cpu_gather, cpu_matvec};

int nwcd_backend_get(const char *name, const nwcd_backend **out) {
  if (!name || !strcmp(name, "auto") || !strcmp(name, "cpu")) {
    *out = &cpu_backend;
    return 0;
  }
  NWC_RETURN_IF(!strcmp(name, "cuda"), -ENOTSUP,
                "this build has no CUDA backend yet (issue 8); use --backend cpu or auto");
  return nwc__fail(-EINVAL, "unknown backend '%s' (auto, cpu or cuda)", name);
}
