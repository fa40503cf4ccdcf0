/*
 * bf16.cuh - the one float -> BF16 rounding of the kernels, device code: round to nearest even,
 * a NaN kept a NaN of its sign (quieted), exactly as the CPU side rounds (store/format.c), so that
 * a kernel's BF16 output matches the reference bit for bit, NaNs included.
 */
#ifndef NWC_BF16_CUH
#define NWC_BF16_CUH

#include <stdint.h>

namespace nwc_k {

__device__ __forceinline__ uint16_t bf16_rne(float v) {
  uint32_t u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

} /* namespace nwc_k */

#endif /* NWC_BF16_CUH */
