/*
 * host.cuh - host-side helpers the kernels' C entry points share: turning an nwc_k_tensor into the
 * kernels' Geom after checking it, the SM count for persistent grids, and the CUDA error record
 * behind -EIO (defined in tensor.cu).
 */
#ifndef NWC_HOST_CUH
#define NWC_HOST_CUH

#include "decode.cuh"
#include "nwc_kernels.h"

#include <cuda_runtime.h>
#include <errno.h>

namespace nwc_k {

/* Records err (if it is an error) for nwc_k_last_cuda_error(); returns 0 or -EIO. */
int cuda_status(cudaError_t err);
/* cudaGetLastError() after a launch, as a status. */
static inline int launch_status(void) { return cuda_status(cudaGetLastError()); }

/* Multiprocessors of the current device, or a negative status. */
int sm_count(void);

/* A persistent launch: at most one CTA per SM, each with as many warps (up to 32) as the blocks
 * need, so that small tensors spread over every SM instead of filling a few. */
struct Grid {
  unsigned ctas, threads, smem;
};
static inline int persistent_grid(uint32_t nblocks, Grid *gr) {
  int sms = sm_count();
  if (sms < 0) return sms;
  uint32_t warps = (nblocks + (uint32_t)sms - 1) / (uint32_t)sms;
  if (warps > 32) warps = 32;
  gr->ctas = (nblocks + warps - 1) / warps;
  if (gr->ctas > (unsigned)sms) gr->ctas = (unsigned)sms;
  gr->threads = 32 * warps;
  gr->smem = kTabBytes + warps * kWarpBuf;
  return 0;
}
constexpr unsigned kMaxThreads = 1024, kMaxSmem = kTabBytes + kMaxThreads / 32 * kWarpBuf;

/* Checks t and fills g; *type receives the element type. */
static inline int geom_of(const nwc_k_tensor *t, Geom *g, unsigned *type) {
  if (!t || !t->tab || !t->bases || !t->hdr || !t->data || !t->raw) return -EINVAL;
  /* staging copies 16 raw bytes (8 for fp8) and 8 stream bytes at a time; the table goes by uint4 */
  if ((uintptr_t)t->raw % 16 || (uintptr_t)t->data % 8 || (uintptr_t)t->tab % 16) return -EINVAL;
  unsigned ty = NWC_ELEM_TYPE(t->elem);
  if (NWC_ELEM_LAYOUT(t->elem) != 0 || t->elem > 255 || (ty != NWC_ELEM_BF16 && ty != NWC_ELEM_FP8))
    return -ENOTSUP;
  uint64_t lay[4];
  int rc = nwc_layout(t->rows, t->cols, t->elem, lay);
  if (rc < 0) return rc;
  if (lay[NWC_LAYOUT_BLOCKS] != t->nblocks) return -EINVAL;
  /* The kernels count blocks, rows and columns in 32 bits (and scratch indices below 2^32). */
  if (t->nblocks >= (UINT64_C(1) << 31) || t->rows >= (UINT64_C(1) << 31) ||
      lay[NWC_LAYOUT_K16] >= (UINT64_C(1) << 31) || lay[NWC_LAYOUT_SCRATCH] >= (UINT64_C(1) << 32))
    return -EOVERFLOW;
  g->bases = t->bases;
  g->hdr = t->hdr;
  g->data = t->data;
  g->raw = t->raw;
  g->M = (uint32_t)t->rows;
  g->K16 = (uint32_t)lay[NWC_LAYOUT_K16];
  g->CB = (uint32_t)((t->cols + NWC_BLOCK_COLS - 1) / NWC_BLOCK_COLS);
  g->nblocks = (uint32_t)t->nblocks;
  g->raw_stride = ty == NWC_ELEM_BF16 ? g->K16 : g->K16 / 2;
  *type = ty;
  return 0;
}

} /* namespace nwc_k */

#endif /* NWC_HOST_CUH */
