/*
 * cp_async.cuh - cp.async, the copies from global into shared memory: the layout-0 decoder's
 * staging (decode.cuh), layout 2's rings (layout2.cu) and bench/nwc_stream_bench.cu, which
 * measures those rings.  Device code.
 */
#ifndef NWC_CP_ASYNC_CUH
#define NWC_CP_ASYNC_CUH

#include <stdint.h>

namespace nwc_k {

/* 8 bytes through L1, 16 bytes bypassing it; saddr a shared-memory address (the 32-bit shared
 * window offset), both aligned. */
__device__ __forceinline__ void cp_async8(uint32_t saddr, const void *gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(saddr), "l"(gmem));
}
__device__ __forceinline__ void cp_async16(uint32_t saddr, const void *gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(saddr), "l"(gmem));
}
/* Bytes (4 or 8) through L1 of which only the first src_bytes are read, the rest zero-filled
 * (src_bytes 0: nothing read, gmem still a valid address). */
template <int Bytes>
__device__ __forceinline__ void cp_async_zfill(uint32_t saddr, const void *gmem, uint32_t src_bytes) {
  static_assert(Bytes == 4 || Bytes == 8, "4 or 8 bytes (16: cp_async16)");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(saddr), "l"(gmem), "n"(Bytes), "r"(src_bytes));
}
/* Closes the group of the copies issued since the last commit. */
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* Waits until at most N of this thread's groups are still in flight. */
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
/* Waits until all of this thread's copies are in. */
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

} /* namespace nwc_k */

#endif /* NWC_CP_ASYNC_CUH */
