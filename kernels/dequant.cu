/*
 * dequant.cu - row-major BF16 output from a layout-0 tensor, whole (nwc_k_dequant) or a range of
 * rows (nwc_k_dequant_rows), and rows by index (nwc_k_gather, the embedding lookup), all on the
 * shared decoder (decode.cuh).  The entries dispatch layouts 1 and 2 to layout2.cu (l1_rows,
 * l1_dequant_rows, l2_rows, l2_dequant_rows).
 *
 * Dequant is persistent like the matvec (one block of 1024 threads per SM, the table in shared
 * memory, warps grid-striding over the 8 x 512 blocks of its rows: a row range is the blocks of
 * its 8-row groups, [b0, b1), so a range costs what its rows cost); a lane writes its 16 weights of a row as
 * two 16-byte stores, one prmt per pair building the two BF16 values, so a warp's row is 1 KB of
 * contiguous output.  Gather gives one warp to each (requested row, column block): the warp
 * decodes the rows of the block up to the requested one and keeps only that one.  (The format
 * text says one warp per requested row; splitting the row's column blocks over warps cuts the
 * latency of a single lookup by the number of column blocks, at the cost of nothing.)
 *
 * Variants: dequant_kernel<BF16|FP8>, gather_kernel<BF16|FP8>.
 */
#include "host.cuh"
#include "layout1.cuh"
#include "layout2.cuh"

namespace nwc_k {
namespace {

/* Writes kept rows: all rows to out + (row - row0) * K16 (keep < 0), or row `keep` of the block
 * to out. */
struct Store {
  uint16_t *out;
  uint32_t K16;
  int keep;
  uint64_t row0;
  uint32_t c0;

  __device__ __forceinline__ void begin(uint32_t c, bool) { c0 = c; }

  __device__ __forceinline__ void row(uint32_t i, uint64_t row, bool ok, const uint32_t e[8], const uint32_t m[4]) {
    if (!ok || (keep >= 0 && (int)i != keep)) return;
    uint32_t p[8];
#pragma unroll
    for (int k = 0; k < 8; k++) p[k] = bf16_pair(k, e[k], m);
    uint4 *dst = reinterpret_cast<uint4 *>(out + (keep < 0 ? (row - row0) * K16 : 0) + c0);
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

/* Blocks [b0, b1), whole row groups; out holds the rows from the first group's on. */
template <int TYPE>
__global__ void __launch_bounds__(kMaxThreads, 1)
dequant_kernel(Geom g, const uint32_t *tab, uint32_t b0, uint32_t b1, uint16_t *out) {
  extern __shared__ uint4 smem[];
  const uint32_t nwarps = (gridDim.x * blockDim.x) >> 5,
                 first = b0 + ((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  Head h = load_head(g, first < b1 ? first : g.nblocks); /* in flight while the table loads */
  load_table(smem_tab(smem), tab);
  const uint64_t out_row0 = (uint64_t)(b0 / g.CB) * NWC_BLOCK_ROWS;
  for (uint32_t b = first; b < b1; b += nwarps) {
    uint32_t row0 = b / g.CB * NWC_BLOCK_ROWS;
    uint32_t nrows = g.M - row0 < NWC_BLOCK_ROWS ? g.M - row0 : NWC_BLOCK_ROWS;
    Store s{out, g.K16, -1, out_row0, 0};
    const uint32_t next = b1 - b > nwarps ? b + nwarps : g.nblocks;
    decode_block<TYPE>(g, smem_tab(smem), smem_warp(smem), b, nrows, next, h, s);
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
  Store s{out + (uint64_t)k * g.K16, g.K16, (int)i, 0, 0};
  decode_block<TYPE>(g, smem_tab(smem), smem_warp(smem), b, i + 1, g.nblocks, h, s);
}

/* Rows [row0, row0 + nrows) of a layout-0 tensor (row0 a multiple of 8; nrows a multiple of 8
 * or reaching the last row, checked by the callers) into out from its first row on. */
int dequant_range(const nwc_k_tensor *t, uint64_t row0, uint64_t nrows, uint16_t *out,
                  cudaStream_t stream) {
  Geom g;
  unsigned type;
  int rc = geom_of(t, &g, &type);
  if (rc < 0) return rc;
  if (!out) return -EINVAL;
  if (nrows == 0) return 0;
  const uint32_t b0 = (uint32_t)(row0 / NWC_BLOCK_ROWS) * g.CB;
  const uint32_t b1 = (uint32_t)((row0 + nrows + NWC_BLOCK_ROWS - 1) / NWC_BLOCK_ROWS) * g.CB;
  Grid gr;
  if ((rc = persistent_grid(b1 - b0, &gr)) < 0) return rc;
  auto kernel = type == NWC_ELEM_BF16 ? dequant_kernel<NWC_ELEM_BF16> : dequant_kernel<NWC_ELEM_FP8>;
  if ((rc = cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem))) < 0)
    return rc;
  kernel<<<gr.ctas, gr.threads, gr.smem, stream>>>(g, t->tab, b0, b1, out);
  return launch_status();
}

} /* namespace */
} /* namespace nwc_k */

extern "C" int nwc_k_dequant(const nwc_k_tensor *t, uint16_t *out, cudaStream_t stream) {
  if (t && NWC_ELEM_LAYOUT(t->elem) == 1) return nwc_k::l1_rows(t, NULL, 0, out, stream);
  if (t && NWC_ELEM_LAYOUT(t->elem) == 2) return nwc_k::l2_rows(t, NULL, 0, out, stream);
  return nwc_k::dequant_range(t, 0, t ? t->rows : 0, out, stream);
}

extern "C" int nwc_k_dequant_rows(const nwc_k_tensor *t, uint64_t row0, uint64_t nrows, uint16_t *out,
                                  cudaStream_t stream) {
  if (!t || !out || (uintptr_t)out % 16) return -EINVAL;
  if (row0 > t->rows || nrows > t->rows - row0 || row0 % NWC_K_ROW_ALIGN ||
      (nrows % NWC_K_ROW_ALIGN && row0 + nrows != t->rows))
    return -EINVAL;
  if (NWC_ELEM_LAYOUT(t->elem) == 1) return nwc_k::l1_dequant_rows(t, row0, nrows, out, stream);
  if (NWC_ELEM_LAYOUT(t->elem) == 2) return nwc_k::l2_dequant_rows(t, row0, nrows, out, stream);
  return nwc_k::dequant_range(t, row0, nrows, out, stream);
}

extern "C" int nwc_k_gather(const nwc_k_tensor *t, const uint64_t *rows, uint64_t n, uint16_t *out,
                            cudaStream_t stream) {
  if (t && (NWC_ELEM_LAYOUT(t->elem) == 1 || NWC_ELEM_LAYOUT(t->elem) == 2)) {
    if (n && !rows) return -EINVAL;
    return NWC_ELEM_LAYOUT(t->elem) == 1 ? nwc_k::l1_rows(t, rows, n, out, stream)
                                         : nwc_k::l2_rows(t, rows, n, out, stream);
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
