/*
 * dequant.cu - row-major BF16 output from a layout-0 tensor (nwc_k_dequant) and rows by index
 * (nwc_k_gather, the embedding lookup), both on the shared decoder (decode.cuh).
 *
 * Dequant is persistent like the matvec (one block of 1024 threads per SM, the table in shared
 * memory, warps grid-striding over the 8 x 512 blocks); a lane writes its 16 weights of a row as
 * two 16-byte stores, one prmt per pair building the two BF16 values, so a warp's row is 1 KB of
 * contiguous output.  Gather gives one warp to each (requested row, column block): the warp
 * decodes the rows of the block up to the requested one and keeps only that one.  (The format
 * text says one warp per requested row; splitting the row's column blocks over warps cuts the
 * latency of a single lookup by the number of column blocks, at the cost of nothing.)
 *
 * Variants: dequant_kernel<BF16|FP8>, gather_kernel<BF16|FP8>.
 */
#include "host.cuh"
#include "layout2.cuh"

namespace nwc_k {
namespace {

/* Writes kept rows: all rows to out + row * K16 (keep < 0), or row `keep` of the block to out. */
struct Store {
  uint16_t *out;
  uint32_t K16;
  int keep;
  uint32_t c0;

  __device__ __forceinline__ void begin(uint32_t c, bool) { c0 = c; }

  __device__ __forceinline__ void row(uint32_t i, uint64_t row, bool ok, const uint32_t e[8], const uint32_t m[4]) {
    if (!ok || (keep >= 0 && (int)i != keep)) return;
    uint32_t p[8];
#pragma unroll
    for (int k = 0; k < 8; k++) p[k] = bf16_pair(k, e[k], m);
    uint4 *dst = reinterpret_cast<uint4 *>(out + (keep < 0 ? row * K16 : 0) + c0);
    dst[0] = make_uint4(p[0], p[1], p[2], p[3]);
    dst[1] = make_uint4(p[4], p[5], p[6], p[7]);
  }
};

constexpr unsigned kGatherThreads = 256, kGatherSmem = kTabBytes + kGatherThreads / 32 * kWarpBuf;

/* The table, then each warp's staging buffer. */
__device__ __forceinline__ uint32_t *smem_tab(uint4 *smem) { return reinterpret_cast<uint32_t *>(smem); }
__device__ __forceinline__ uint8_t *smem_warp(uint4 *smem) {
  return reinterpret_cast<uint8_t *>(smem) + kTabBytes + (threadIdx.x >> 5) * kWarpBuf;
}

template <int TYPE>
__global__ void __launch_bounds__(kMaxThreads, 1) dequant_kernel(Geom g, const uint32_t *tab, uint16_t *out) {
  extern __shared__ uint4 smem[];
  const uint32_t nwarps = (gridDim.x * blockDim.x) >> 5, first = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  Head h = load_head(g, first); /* in flight while the table loads */
  load_table(smem_tab(smem), tab);
  for (uint32_t b = first; b < g.nblocks; b += nwarps) {
    uint32_t row0 = b / g.CB * NWC_BLOCK_ROWS;
    uint32_t nrows = g.M - row0 < NWC_BLOCK_ROWS ? g.M - row0 : NWC_BLOCK_ROWS;
    Store s{out, g.K16, -1, 0};
    decode_block<TYPE>(g, smem_tab(smem), smem_warp(smem), b, nrows, b + nwarps, h, s);
  }
}

template <int TYPE>
__global__ void __launch_bounds__(kGatherThreads)
gather_kernel(Geom g, const uint32_t *tab, const uint64_t *rows, uint32_t n, uint16_t *out) {
  extern __shared__ uint4 smem[];
  const uint32_t w = blockIdx.x * (kGatherThreads / 32) + (threadIdx.x >> 5);
  const uint32_t k = w / g.CB, cb = w - k * g.CB;
  /* The row index and the block's head are loaded while the table loads; every thread reaches
   * load_table's barrier before any returns. */
  const uint64_t r = k < n ? rows[k] : UINT64_MAX;
  const bool ok = r < g.M;
  const uint32_t i = ok ? (uint32_t)(r % NWC_BLOCK_ROWS) : 0;
  const uint32_t b = ok ? (uint32_t)(r / NWC_BLOCK_ROWS) * g.CB + cb : g.nblocks;
  Head h = load_head(g, b);
  load_table(smem_tab(smem), tab);
  if (!ok) return;
  Store s{out + (uint64_t)k * g.K16, g.K16, (int)i, 0};
  decode_block<TYPE>(g, smem_tab(smem), smem_warp(smem), b, i + 1, g.nblocks, h, s);
}

} /* namespace */
} /* namespace nwc_k */

extern "C" int nwc_k_dequant(const nwc_k_tensor *t, uint16_t *out, cudaStream_t stream) {
  if (t && NWC_ELEM_LAYOUT(t->elem) == 2) return nwc_k::l2_rows(t, NULL, 0, out, stream);
  nwc_k::Geom g;
  unsigned type;
  int rc = nwc_k::geom_of(t, &g, &type);
  if (rc < 0) return rc;
  if (!out) return -EINVAL;
  nwc_k::Grid gr;
  if ((rc = nwc_k::persistent_grid(g.nblocks, &gr)) < 0) return rc;
  auto kernel = type == NWC_ELEM_BF16 ? nwc_k::dequant_kernel<NWC_ELEM_BF16> : nwc_k::dequant_kernel<NWC_ELEM_FP8>;
  if ((rc = nwc_k::cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    nwc_k::kMaxSmem))) < 0)
    return rc;
  kernel<<<gr.ctas, gr.threads, gr.smem, stream>>>(g, t->tab, out);
  return nwc_k::launch_status();
}

extern "C" int nwc_k_gather(const nwc_k_tensor *t, const uint64_t *rows, uint64_t n, uint16_t *out,
                            cudaStream_t stream) {
  if (t && NWC_ELEM_LAYOUT(t->elem) == 2) {
    if (n && !rows) return -EINVAL;
    return nwc_k::l2_rows(t, rows, n, out, stream);
  }
  nwc_k::Geom g;
  unsigned type;
  int rc = nwc_k::geom_of(t, &g, &type);
  if (rc < 0) return rc;
  if (n == 0) return 0;
  if (!rows || !out) return -EINVAL;
  if (n * g.CB >= (UINT64_C(1) << 31)) return -EOVERFLOW;
  const unsigned per_block = nwc_k::kGatherThreads / 32;
  unsigned blocks = (unsigned)((n * g.CB + per_block - 1) / per_block);
  auto kernel = type == NWC_ELEM_BF16 ? nwc_k::gather_kernel<NWC_ELEM_BF16> : nwc_k::gather_kernel<NWC_ELEM_FP8>;
  if ((rc = nwc_k::cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    nwc_k::kGatherSmem))) < 0)
    return rc;
  kernel<<<blocks, nwc_k::kGatherThreads, nwc_k::kGatherSmem, stream>>>(g, t->tab, rows, (uint32_t)n, out);
  return nwc_k::launch_status();
}
