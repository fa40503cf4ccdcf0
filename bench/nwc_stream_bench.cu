/*
 * nwc_stream_bench.cu - how fast can a warp stream layout 2's planes, apart from decoding them, and
 * what does a small streaming kernel cost in a sequence of launches?  The least a layout-2 matvec
 * can take on this machine, whatever its decode (measurements: docs/results.md).
 *
 *   nwc_stream_bench [--mb N] [--reps R]
 *   nwc_stream_bench --chain   (what a small kernel costs in a sequence: run_chain below)
 *
 * Lays out N MB (default 1024, well beyond the 60 MB L2) as layout 2 does: "row groups" of S = 128
 * slots, a slot being 256 nibble bytes and 512 low bytes of its row group's two contiguous plane
 * regions, and lets every resident warp stream whole row groups (grid-striding), each lane
 * folding what it read into a XOR that is written out at the end (so nothing is optimized away;
 * no decode, no mma).  One line of JSON per configuration, the table last:
 *
 *   ring D      cp.async into a per-warp ring of D one-slot entries in shared memory, D - 1 slots
 *               ahead, as layout2.cu's l2_stream does (D = 4, 8, 16)
 *   regs P      plain loads (ld.global.nc, 8 and 16 bytes a lane) into registers: P slots used
 *               while the next P are loaded, unrolled (P = 2, 4, 8)
 *   dec P       regs P, each slot also decoded to A fragments and put through two mma (P = 2, 4)
 *   ctas C      each at C CTAs of 8 warps per SM (1 .. 4)
 *
 * TB/s = bytes streamed / median time of R launches (default 9) between CUDA events.  The floor
 * of ../shared/DEVICE.md is about 4.5 TB/s.  Exit 77 without a GPU.  ptxas reports about 31
 * registers for every P, fewer than 2 P slots of loads would hold: read the SASS (gpu-daemon
 * --kernels dumps it) to see how many loads a warp really has in flight before trusting "regs".
 */
#include "cp_async.cuh"
#include "layout2.cuh"

#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace {

using nwc_k::cp_async16;
using nwc_k::cp_commit;
using nwc_k::cp_wait;

constexpr unsigned kWarps = 8, kThreads = 32 * kWarps, kSlots = 128; /* slots per row group */
constexpr unsigned kNib = 256, kLow = 512, kEntry = kNib + kLow;

struct Planes {
  const uint8_t *nib, *low;
  uint32_t groups;
};

/* A warp's walk over its row groups, slot by slot: (group, slot) -> the lane's two addresses. */
struct Walk {
  uint32_t g, s, step;
  __device__ __forceinline__ bool valid(const Planes &p) const { return g < p.groups; }
  __device__ __forceinline__ void next() {
    if (++s == kSlots) s = 0, g += step;
  }
  __device__ __forceinline__ const uint8_t *nib(const Planes &p, uint32_t lane) const {
    return p.nib + ((uint64_t)g * kSlots + s) * kNib + 16 * (lane & 15u);
  }
  __device__ __forceinline__ const uint8_t *low(const Planes &p, uint32_t lane) const {
    return p.low + ((uint64_t)g * kSlots + s) * kLow + 16 * lane;
  }
};

template <int D>
__global__ void __launch_bounds__(kThreads) ring_kernel(Planes p, uint32_t *out) {
  extern __shared__ uint4 smem[];
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  uint8_t *ring = reinterpret_cast<uint8_t *>(smem) + warp * D * kEntry;
  const uint32_t sring = (uint32_t)__cvta_generic_to_shared(ring);
  const uint32_t first = blockIdx.x * kWarps + warp, step = gridDim.x * kWarps;
  Walk ld{first, 0, step}, c = ld;
  auto issue = [&](uint32_t k) {
    cp_async16(sring + k * kEntry + kNib + 16 * lane, ld.low(p, lane));
    if (lane < 16) cp_async16(sring + k * kEntry + 16 * lane, ld.nib(p, lane));
    ld.next();
  };
  for (int k = 0; k + 1 < D; k++) {
    if (ld.valid(p)) issue(k);
    cp_commit();
  }
  uint32_t acc = 0, kc = 0, kl = D - 1;
  while (c.valid(p)) {
    cp_wait<D - 2>();
    __syncwarp();
    const uint8_t *e = ring + kc * kEntry;
    const uint2 n = *reinterpret_cast<const uint2 *>(e + 8 * lane);
    const uint4 l = *reinterpret_cast<const uint4 *>(e + kNib + 16 * lane);
    acc ^= n.x ^ n.y ^ l.x ^ l.y ^ l.z ^ l.w;
    __syncwarp();
    if (ld.valid(p)) issue(kl);
    cp_commit();
    kc = (kc + 1) % D, kl = (kl + 1) % D;
    c.next();
  }
  cp_wait<0>();
  out[blockIdx.x * kThreads + threadIdx.x] = acc;
}

/* P slots in registers while the next P are loaded (loads issued before the use of the ones
 * before them: the two batches are always in flight together).  Decode: each slot is also
 * decoded into A fragments (layout2.cuh) and multiplied by a B fragment on the tensor cores, as
 * the matvec's inner loop does, so that the difference from the plain variant is the cost of
 * that work at this occupancy. */
template <int P, bool Decode>
__global__ void __launch_bounds__(kThreads) regs_kernel(Planes p, uint32_t *out) {
  const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const uint32_t first = blockIdx.x * kWarps + warp, step = gridDim.x * kWarps;
  uint32_t acc = 0;
  float c0[4] = {}, c1[4] = {};
  const uint32_t b0 = 0x3f803f80u ^ lane, b1 = 0x3f803f80u ^ warp; /* B: ~1.0 */
  for (uint32_t g = first; g < p.groups; g += step) {
    const uint8_t *nb = p.nib + (uint64_t)g * kSlots * kNib + 8 * lane;
    const uint8_t *lb = p.low + (uint64_t)g * kSlots * kLow + 16 * lane;
    uint2 n[P];
    uint4 l[P];
#pragma unroll
    for (int k = 0; k < P; k++) {
      n[k] = __ldg(reinterpret_cast<const uint2 *>(nb + (uint64_t)k * kNib));
      l[k] = __ldg(reinterpret_cast<const uint4 *>(lb + (uint64_t)k * kLow));
    }
    for (uint32_t s = P; s <= kSlots; s += P) {
      uint2 nn[P];
      uint4 ln[P];
      if (s < kSlots) {
#pragma unroll
        for (int k = 0; k < P; k++) {
          nn[k] = __ldg(reinterpret_cast<const uint2 *>(nb + (uint64_t)(s + k) * kNib));
          ln[k] = __ldg(reinterpret_cast<const uint4 *>(lb + (uint64_t)(s + k) * kLow));
        }
      }
#pragma unroll
      for (int k = 0; k < P; k++) {
        if (Decode) {
          uint32_t A[8];
          nwc_k::decode_bf16_slot(n[k], l[k], 0x3c3b3a39u ^ lane, 0x3f3e3d00u, A);
          nwc_k::mma_bf16(c0, A, b0, b1);
          nwc_k::mma_bf16(c1, A + 4, b0, b1);
        } else {
          acc = acc * 3u + (n[k].x ^ n[k].y ^ l[k].x ^ l[k].y ^ l[k].z ^ l[k].w);
        }
      }
      if (s < kSlots) {
#pragma unroll
        for (int k = 0; k < P; k++) n[k] = nn[k], l[k] = ln[k];
      }
    }
  }
  out[blockIdx.x * kThreads + threadIdx.x] = acc ^ __float_as_uint(c0[0] + c0[1] + c0[2] + c0[3] + c1[0] + c1[1] + c1[2] + c1[3]);
}

/* --chain: the fixed cost of one small streaming kernel in a sequence (a token step's matvecs).
 * Every warp of ctas CTAs a SM reads its equal share of n16 16-byte words (8 a lane in flight,
 * ld.global.nc), folds them into a XOR and writes one word.  Pdl: launched as a programmatic
 * dependent, the first 8 words a lane issued before griddepcontrol.wait, the next launch let in at
 * once (as layout2.cu's kernels).  Tail: the warp's result goes through a part slot, one
 * fence.acq_rel.gpu and a counter shared by 4 warps, the last of which reads the 4 parts (the
 * matvec's sums of a row group split among warps, work.cuh). */
template <bool Pdl, bool Tail>
__global__ void __launch_bounds__(kThreads) chain_kernel(const uint4 *src, uint64_t n16, uint32_t *part,
                                                         uint32_t *ctr, uint32_t *out) {
  if (Pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const uint32_t lane = threadIdx.x & 31u, w = blockIdx.x * kWarps + (threadIdx.x >> 5), W = gridDim.x * kWarps;
  const uint64_t b = n16 * w / W, e = n16 * (w + 1) / W;
  uint32_t acc = 0;
  bool waited = !Pdl;
  for (uint64_t i0 = b; i0 < e; i0 += 8 * 32) {
    uint4 v[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const uint64_t i = i0 + 32 * j + lane;
      v[j] = i < e ? __ldg(src + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < 8; j++) acc = acc * 3u + (v[j].x ^ v[j].y ^ v[j].z ^ v[j].w);
    if (!waited) {
      nwc_k::grid_wait_after(acc); /* the first loads issued before the wait, as the matvec's */
      waited = true;
    }
  }
  if (!waited) asm volatile("griddepcontrol.wait;" ::: "memory");
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if (!Tail) {
    if (lane == 0) out[w] = acc;
    return;
  }
  if (lane == 0) {
    part[w] = acc;
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    if (atomicInc(ctr + w / 4, 3u) == 3u) { /* the counter wraps to 0: ready for the next launch */
      const volatile uint32_t *pv = part + (w & ~3u);
      out[w / 4] = pv[0] ^ pv[1] ^ pv[2] ^ pv[3];
    }
  }
}

bool check(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return true;
  fprintf(stderr, "nwc_stream_bench: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

int cmp_float(const void *a, const void *b) {
  const float x = *static_cast<const float *>(a), y = *static_cast<const float *>(b);
  return (x > y) - (x < y);
}

/* Median milliseconds of reps launches of kernel at ctas_per_sm, or -1. */
template <class K>
float time_kernel(K kernel, unsigned smem, unsigned ctas_per_sm, int sms, int reps, const Planes &p,
                  uint32_t *out) {
  if (smem && !check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem"))
    return -1;
  int fit = 0;
  if (!check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, kThreads, smem), "occupancy") ||
      fit < (int)ctas_per_sm)
    return -1; /* that many CTAs do not fit: not a configuration */
  const unsigned ctas = (unsigned)sms * ctas_per_sm;
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  float ms[64];
  kernel<<<ctas, kThreads, smem>>>(p, out); /* warm-up */
  for (int r = 0; r < reps; r++) {
    cudaEventRecord(a);
    kernel<<<ctas, kThreads, smem>>>(p, out);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms[r], a, b);
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  if (!check(cudaGetLastError(), "launch")) return -1;
  qsort(ms, reps, sizeof ms[0], cmp_float);
  return ms[reps / 2];
}

constexpr int kChainLaunches = 40;

/* Microseconds a launch of chain_kernel<Pdl, Tail> at ctas_per_sm costs in a graph of
 * kChainLaunches launches, each reading `bytes` from the next copy of them in buf (the copies
 * rotate over all of buf, far beyond L2); the median of 5 replays. */
template <bool Pdl, bool Tail>
float chain_us(const uint8_t *buf, uint64_t buf_bytes, uint64_t bytes, unsigned ctas_per_sm, int sms, uint32_t *part,
               uint32_t *ctr, uint32_t *out, cudaStream_t st) {
  const uint64_t stride = (bytes + 4095) & ~UINT64_C(4095), copies = buf_bytes / stride;
  if (copies < 2) return -1;
  cudaLaunchAttribute pdl[1];
  pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)sms * ctas_per_sm), cfg.blockDim = dim3(kThreads), cfg.stream = st;
  cfg.attrs = pdl, cfg.numAttrs = Pdl ? 1 : 0;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  if (!check(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture")) return -1;
  for (int i = 0; i < kChainLaunches; i++)
    cudaLaunchKernelEx(&cfg, chain_kernel<Pdl, Tail>, reinterpret_cast<const uint4 *>(buf + i % copies * stride),
                       (uint64_t)(bytes / 16), part, ctr, out);
  if (!check(cudaStreamEndCapture(st, &graph), "capture") || !check(cudaGraphInstantiate(&exec, graph, 0), "instantiate"))
    return -1;
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  float ms[5];
  cudaGraphLaunch(exec, st); /* warm-up */
  for (int r = 0; r < 5; r++) {
    cudaEventRecord(a, st);
    cudaGraphLaunch(exec, st);
    cudaEventRecord(b, st);
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms[r], a, b);
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
  if (!check(cudaGetLastError(), "chain")) return -1;
  qsort(ms, 5, sizeof ms[0], cmp_float);
  return ms[2] * 1e3f / kChainLaunches;
}

/* The --chain table: for the matvec bench's nine shapes (and Qwen3's 1024 x 2560 k and v), what
 * a streaming kernel of the shape's BF16 bytes and of layout 2's (0.755 of them) costs a launch
 * in a sequence, plain and as a PDL dependent, and with the split sums' tail: the least a matvec
 * of that shape can cost here, whatever its decode. */
int run_chain(int sms) {
  static const uint32_t shapes[][2] = {{6144, 2560}, {2560, 4096}, {19456, 2560}, {2560, 9728}, {151936, 2560},
                                       {4096, 4096}, {11008, 4096}, {4096, 11008}, {28672, 4096}, {1024, 2560}};
  const uint64_t buf_bytes = UINT64_C(2) << 30;
  uint8_t *buf = NULL;
  uint32_t *part = NULL, *ctr = NULL, *out = NULL;
  const size_t warps = (size_t)sms * 4 * kWarps;
  cudaStream_t st;
  if (!check(cudaMalloc(&buf, buf_bytes), "cudaMalloc") || !check(cudaMemset(buf, 0x5a, buf_bytes), "cudaMemset") ||
      !check(cudaMalloc(&part, warps * 4), "cudaMalloc") || !check(cudaMalloc(&ctr, warps * 4), "cudaMalloc") ||
      !check(cudaMemset(ctr, 0, warps * 4), "cudaMemset") || !check(cudaMalloc(&out, warps * 4), "cudaMalloc") ||
      !check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream"))
    return 1;
  fprintf(stderr, "\n%-14s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s  (us a launch; c = 0.755 of BF16's bytes; floor at 4.52 TB/s)\n",
         "M x K", "bf16 MB", "plain", "pdl", "c MB", "floor", "plain", "pdl", "pdl 1", "pdl 2", "pdl 4", "tail");
  for (const auto &sh : shapes) {
    const uint64_t bb = (uint64_t)sh[0] * sh[1] * 2, cb = (uint64_t)(bb * 0.755) & ~UINT64_C(15);
    const float r[] = {
        chain_us<false, false>(buf, buf_bytes, bb, 3, sms, part, ctr, out, st),
        chain_us<true, false>(buf, buf_bytes, bb, 3, sms, part, ctr, out, st),
        chain_us<false, false>(buf, buf_bytes, cb, 3, sms, part, ctr, out, st),
        chain_us<true, false>(buf, buf_bytes, cb, 3, sms, part, ctr, out, st),
        chain_us<true, false>(buf, buf_bytes, cb, 1, sms, part, ctr, out, st),
        chain_us<true, false>(buf, buf_bytes, cb, 2, sms, part, ctr, out, st),
        chain_us<true, false>(buf, buf_bytes, cb, 4, sms, part, ctr, out, st),
        chain_us<true, true>(buf, buf_bytes, cb, 3, sms, part, ctr, out, st),
    };
    printf("{\"bench\":\"stream_chain\",\"m\":%u,\"k\":%u,\"bf16_bytes\":%llu,\"c_bytes\":%llu,\"bf16_plain_us\":%.2f,"
           "\"bf16_pdl_us\":%.2f,\"c_plain_us\":%.2f,\"c_pdl_us\":%.2f,\"c_pdl1_us\":%.2f,\"c_pdl2_us\":%.2f,"
           "\"c_pdl4_us\":%.2f,\"c_tail_us\":%.2f}\n",
           sh[0], sh[1], (unsigned long long)bb, (unsigned long long)cb, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
    char name[32];
    snprintf(name, sizeof name, "%u x %u", sh[0], sh[1]);
    fprintf(stderr, "%-14s %8.1f %8.2f %8.2f %8.1f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f\n", name, bb / 1e6, r[0], r[1],
            cb / 1e6, cb / 4.52e6, r[2], r[3], r[4], r[5], r[6], r[7]);
  }
  cudaFree(buf), cudaFree(part), cudaFree(ctr), cudaFree(out), cudaStreamDestroy(st);
  return 0;
}

} /* namespace */

int main(int argc, char **argv) {
  unsigned mb = 1024;
  int reps = 9;
  bool chain = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--chain")) chain = true;
    else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = (unsigned)strtoul(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: nwc_stream_bench [--mb N] [--reps R] [--chain]  (R 1..63)\n");
      return 2;
    }
  }
  if (reps < 1 || reps > 63 || mb < 16) {
    fprintf(stderr, "nwc_stream_bench: --reps 1..63, --mb at least 16\n");
    return 2;
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("nwc_stream_bench: no GPU, skipped\n");
    return 77;
  }
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  if (chain) return run_chain(sms);
  const uint64_t group_bytes = (uint64_t)kSlots * kEntry;
  const uint32_t groups = (uint32_t)(((uint64_t)mb << 20) / group_bytes);
  uint8_t *buf = NULL;
  uint32_t *out = NULL;
  if (!check(cudaMalloc(&buf, groups * group_bytes), "cudaMalloc") ||
      !check(cudaMalloc(&out, (size_t)sms * 4 * kThreads * 4), "cudaMalloc") ||
      !check(cudaMemset(buf, 0x5a, groups * group_bytes), "cudaMemset"))
    return 1;
  const Planes p{buf, buf + (uint64_t)groups * kSlots * kNib, groups};
  const double bytes = (double)groups * group_bytes;
  char table[96][96];
  int rows = 0;
  auto report = [&](const char *kind, int depth, unsigned ctas, float ms) {
    if (ms < 0) return;
    const double tbps = bytes / (ms * 1e-3) / 1e12;
    printf("{\"bench\":\"stream\",\"kind\":\"%s\",\"depth\":%d,\"ctas_per_sm\":%u,\"bytes\":%.0f,"
           "\"ms\":%.4f,\"tbps\":%.3f}\n", kind, depth, ctas, bytes, ms, tbps);
    if (rows < 96) snprintf(table[rows++], sizeof table[0], "%-5s %5d %5u %9.3f %7.3f", kind, depth, ctas, ms, tbps);
  };
  for (unsigned c = 1; c <= 4; c++) {
    report("ring", 4, c, time_kernel(ring_kernel<4>, kWarps * 4 * kEntry, c, sms, reps, p, out));
    report("ring", 8, c, time_kernel(ring_kernel<8>, kWarps * 8 * kEntry, c, sms, reps, p, out));
    report("ring", 16, c, time_kernel(ring_kernel<16>, kWarps * 16 * kEntry, c, sms, reps, p, out));
    report("regs", 2, c, time_kernel(regs_kernel<2, false>, 0, c, sms, reps, p, out));
    report("regs", 4, c, time_kernel(regs_kernel<4, false>, 0, c, sms, reps, p, out));
    report("regs", 8, c, time_kernel(regs_kernel<8, false>, 0, c, sms, reps, p, out));
    report("dec", 2, c, time_kernel(regs_kernel<2, true>, 0, c, sms, reps, p, out));
    report("dec", 4, c, time_kernel(regs_kernel<4, true>, 0, c, sms, reps, p, out));
  }
  printf("\nkind  depth  ctas        ms    TB/s   (%.0f MB, %u row groups of %u slots, %d SMs)\n",
         bytes / 1e6, groups, kSlots, sms);
  for (int i = 0; i < rows; i++) printf("%s\n", table[i]);
  cudaFree(buf), cudaFree(out);
  return 0;
}
