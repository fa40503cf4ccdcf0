/*
 * warp.cuh - warp-wide helpers the decoders of both layouts share, device code.
 */
#ifndef NWC_WARP_CUH
#define NWC_WARP_CUH

#include <stdint.h>

namespace nwc_k {

/* Exclusive prefix sum of v over the warp's 32 lanes (all must call it). */
__device__ __forceinline__ uint32_t warp_exclusive_sum(uint32_t v) {
  unsigned lane = threadIdx.x & 31u;
  uint32_t s = v;
#pragma unroll
  for (unsigned d = 1; d < 32; d <<= 1) {
    uint32_t o = __shfl_up_sync(0xffffffffu, s, d);
    if (lane >= d) s += o;
  }
  return s - v;
}

} /* namespace nwc_k */

#endif /* NWC_WARP_CUH */
