/*
 * timeline.cuh - an optional per-warp timeline of the tensor-core matvecs (layouts 1 and 2), for
 * seeing where a launch's time goes inside a CUDA graph, which a profiler's serialized single
 * launch cannot show: how early the CTAs start beside the kernel before (PDL), when
 * griddepcontrol.wait lets them on, how far apart warps with the same work end, what the sums at
 * the end cost.  Built only with -DNWC_KERNEL_TIMELINE=ON (compile definition NWC_K_TIMELINE);
 * otherwise every mark is empty and nwc_k_timeline_dump says -ENOTSUP.
 *
 * Lane 0 of each warp notes clock64 at five marks (kernel entry, after griddepcontrol.wait, its
 * first batch landed, its range's end, its sums' end) and %globaltimer at entry and exit in the
 * CTA's shared memory; at exit thread 0 writes the CTA's records to slot launch % kTlLaunches of
 * a device buffer, the launch being the CTAs started before it (one atomic a CTA, its result
 * used only at exit) over the grid's size.  So the buffer holds the last kTlLaunches launches of
 * a graph of one kernel, each whole.  The probe costs a launch about 0.8 us on the H200 (the
 * atomic and the barrier at exit): compare timelines with timelines, times with a build without.
 *
 * Invariants: at most kTlWarps warps a launch are recorded (the rest are dropped); records are
 * read and cleared only by nwc_k_timeline_dump, between launches (it synchronizes the device).
 */
#ifndef NWC_TIMELINE_CUH
#define NWC_TIMELINE_CUH

#include <stdint.h>

namespace nwc_k {

#ifdef NWC_K_TIMELINE
constexpr unsigned kTlLaunches = 4, kTlWarps = 8192, kTlMarks = 5, kTlCtaWarps = 8; /* the tensor-core kernels' CTAs */

/* One warp's record: globaltimer at entry (never 0: 0 is an empty record) and exit (ns), clock64
 * at the marks, its SM, its CTA, its warp in the CTA and the launch it belongs to. */
struct TlRecord {
  unsigned long long g_entry, g_exit;
  long long clk[kTlMarks];
  uint32_t sm, cta, warp, launch;
};

__device__ unsigned tl_ctas_started;
__device__ TlRecord tl_records[kTlLaunches][kTlWarps];
__shared__ TlRecord tl_warps[kTlCtaWarps]; /* the CTA's warps' records */

__device__ __forceinline__ long long tl_clock() {
  long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ unsigned long long tl_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}
/* Mark i of the calling warp. */
__device__ __forceinline__ void tl_mark(unsigned i) {
  if ((threadIdx.x & 31u) == 0) tl_warps[threadIdx.x >> 5].clk[i] = tl_clock();
}
/* At the kernel's entry: the launch's number (thread 0's, for tl_exit), the warp's first marks. */
__device__ __forceinline__ unsigned tl_entry() {
  const unsigned seq = threadIdx.x == 0 ? atomicAdd(&tl_ctas_started, 1u) : 0u;
  if ((threadIdx.x & 31u) == 0) tl_warps[threadIdx.x >> 5].g_entry = tl_globaltimer();
  tl_mark(0);
  return seq;
}
/* At the kernel's exit (every thread): the CTA's records out. */
__device__ __forceinline__ void tl_exit(unsigned seq) {
  const unsigned w = threadIdx.x >> 5;
  if ((threadIdx.x & 31u) == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    tl_warps[w].g_exit = tl_globaltimer(), tl_warps[w].sm = sm;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const unsigned launch = seq / gridDim.x;
  for (unsigned u = 0; u < kTlCtaWarps; u++) {
    const unsigned at = blockIdx.x * kTlCtaWarps + u;
    if (at >= kTlWarps) break;
    TlRecord r = tl_warps[u];
    r.cta = blockIdx.x, r.warp = u, r.launch = launch;
    tl_records[launch % kTlLaunches][at] = r;
  }
}
#else
__device__ __forceinline__ void tl_mark(unsigned) {}
__device__ __forceinline__ unsigned tl_entry() { return 0; }
__device__ __forceinline__ void tl_exit(unsigned) {}
#endif

} /* namespace nwc_k */

#endif /* NWC_TIMELINE_CUH */
