/*
 * hd.cuh - what code that runs both on the GPU and, in the tests, on the CPU needs: NWC_HD for
 * such functions, and host versions of the intrinsics they use (funnel shift, count of leading
 * zeros, byte permute, the high half of a product).  The kernels get the intrinsics themselves;
 * tests/test_l1_decode and tests/test_work_split run the same functions on the CPU.
 */
#ifndef NWC_HD_CUH
#define NWC_HD_CUH

#include <stdint.h>

namespace nwc_k {

#define NWC_HD __host__ __device__ __forceinline__
/* #pragma unroll in an NWC_HD function (the host compiler does not know it). */
#ifdef __CUDA_ARCH__
#define NWC_HD_UNROLL _Pragma("unroll")
#else
#define NWC_HD_UNROLL
#endif

/* __funnelshift_l: the upper word of (hi:lo) << (s mod 32). */
NWC_HD uint32_t fshl(uint32_t lo, uint32_t hi, uint32_t s) {
#ifdef __CUDA_ARCH__
  return __funnelshift_l(lo, hi, s);
#else
  s &= 31u;
  return s ? hi << s | lo >> (32u - s) : hi;
#endif
}
/* __clz: leading zeros, 32 for 0. */
NWC_HD uint32_t clz32(uint32_t x) {
#ifdef __CUDA_ARCH__
  return (uint32_t)__clz(x);
#else
  return x ? (uint32_t)__builtin_clz(x) : 32u;
#endif
}
/* __byte_perm: byte i of the result is byte (s >> 4 i) & 7 of y:x (x bytes 0..3, y 4..7). */
NWC_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, s);
#else
  const uint64_t v = (uint64_t)y << 32 | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; i++) r |= (uint32_t)(v >> (8 * ((s >> (4 * i)) & 7u)) & 0xffu) << (8 * i);
  return r;
#endif
}

/* __umulhi: the upper word of the 64-bit product. */
NWC_HD uint32_t umulhi32(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
  return __umulhi(a, b);
#else
  return (uint32_t)(((uint64_t)a * b) >> 32);
#endif
}
NWC_HD uint32_t umin32(uint32_t a, uint32_t b) { return a < b ? a : b; }

} /* namespace nwc_k */

#endif /* NWC_HD_CUH */
