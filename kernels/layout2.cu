/*
 * layout2.cu - the kernels of layout 2 (BF16): Y = scale * (W X) + bias for 1..8 columns of X on
 * the tensor cores, dequant and gather.  Reached through the nwc_k_* entries of nwc_kernels.h,
 * which dispatch on the tensor's layout (l2_* below).
 *
 * Matvec design.  The unit of work is one format block (row group g, column block cb: 16 rows x
 * up to 16 slots of 32 columns); warps grid-stride over the blocks.  Per slot a lane loads its 8
 * nibble bytes and 16 low bytes (streaming loads that skip L1, so that L1 keeps x) and, for the
 * lanes r < ncols, its 8 activations x[r][32 s + 8q ..] (two float4, L1-cached); the slot decodes
 * into two A fragments (layout2.cuh) and the activations are split into two BF16 parts,
 * x = hi + lo (x to 16 significant bits: the products are exact in the fp32 accumulators, which
 * keeps the result within fp32 rounding of the fp64 reference); four mma.m16n8k16 per slot
 * accumulate 16 rows x 8 columns.  Loads run kDepth slots ahead in a rotating register buffer.
 * After the block's slots, each lane adds its exception entries (the weights the planes decode
 * to +0) times fp32 x on the CUDA cores, in entry order, and a shuffle sums them over the four
 * lanes of a row into the fragment.
 *
 * Column blocks of one row group are summed without atomics on values: each block writes its
 * 16 x ncols partial sums to scratch, then counts itself in its row group's counter; the block
 * that completes the count adds the row group's partial sums in column-block order (so the result
 * does not depend on scheduling), applies scale and bias, writes fp32 and/or BF16, and resets
 * the counter to zero.  Scratch: RB counters (zero before the first call; every call leaves them
 * zero), then NB x 16 x NC floats.
 *
 * Variants: l2_matvec_kernel<NC> for NC = 1, 2, 4, 8 columns (ncols rounded up); dequant and
 * gather kernels (BF16).
 */
#include "host.cuh"
#include "layout2.cuh"

#include <cuda_bf16.h>

namespace nwc_k {
namespace {

constexpr unsigned kL2Threads = 256; /* 8 warps; 2 CTAs per SM at <= 128 registers */
constexpr int kDepth = 4;            /* slots in flight per warp */

struct L2Matvec {
  const float *x;
  uint64_t ldx, ldy;
  uint32_t ncols;
  const float *scale, *bias;
  float *y;
  uint16_t *y_bf16;
  uint32_t *count; /* RB counters */
  float *part;     /* NB x 16 x NC partial sums */
};

__device__ __forceinline__ uint2 ld_stream2(const uint2 *p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 ld_stream4(const uint4 *p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t *a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two fp32 values as BF16 pairs hi (round to nearest) and lo = BF16 of what hi misses. */
__device__ __forceinline__ void split2(float v0, float v1, uint32_t &hi, uint32_t &lo) {
  __nv_bfloat162 h = __floats2bfloat162_rn(v0, v1);
  hi = *reinterpret_cast<uint32_t *>(&h);
  __nv_bfloat162 l = __floats2bfloat162_rn(v0 - __uint_as_float(hi << 16), v1 - __uint_as_float(hi & 0xffff0000u));
  lo = *reinterpret_cast<uint32_t *>(&l);
}

/* One slot's loads: nibbles, low bytes, and this lane's 8 activations (zero past K or n >= ncols). */
struct SlotBuf {
  uint2 nib;
  uint4 low;
  float4 x0, x1;
  __device__ __forceinline__ void load(const uint2 *np, const uint4 *lp, const float *xp, bool xl,
                                       uint32_t col, uint32_t K) {
    nib = ld_stream2(np);
    low = ld_stream4(lp);
    x0 = x1 = make_float4(0.f, 0.f, 0.f, 0.f);
    if (!xl) return;
    if (col + 8 <= K) {
      x0 = __ldg(reinterpret_cast<const float4 *>(xp));
      x1 = __ldg(reinterpret_cast<const float4 *>(xp) + 1);
    } else {
      float v[8];
#pragma unroll
      for (int k = 0; k < 8; k++) v[k] = col + k < K ? __ldg(xp + k) : 0.f;
      x0 = make_float4(v[0], v[1], v[2], v[3]);
      x1 = make_float4(v[4], v[5], v[6], v[7]);
    }
  }
  __device__ __forceinline__ void multiply(const L2Geom &g, float c[4]) const {
    uint32_t A[8], bh[4], bl[4];
    decode_bf16_slot(nib, low, g.lut[0], g.lut[1], A);
    split2(x0.x, x0.y, bh[0], bl[0]);
    split2(x0.z, x0.w, bh[1], bl[1]);
    split2(x1.x, x1.y, bh[2], bl[2]);
    split2(x1.z, x1.w, bh[3], bl[3]);
    mma_bf16(c, A, bh[0], bh[1]);
    mma_bf16(c, A, bl[0], bl[1]);
    mma_bf16(c, A + 4, bh[2], bh[3]);
    mma_bf16(c, A + 4, bl[2], bl[3]);
  }
};

/* The lane's exception entries of block b times x, summed per row (r, r + 8) and column, then
 * over the row's four lanes into the fragment c. */
template <int NC>
__device__ __forceinline__ void add_exceptions(const L2Geom &g, const L2Matvec &a, uint32_t b,
                                               uint32_t cb, float c[4]) {
  const uint32_t lane = threadIdx.x & 31u, q = lane & 3u;
  Exceptions ex;
  ex.open(g, b, 3);
  float s0[NC], s8[NC];
#pragma unroll
  for (int n = 0; n < NC; n++) s0[n] = s8[n] = 0.f;
  for (uint32_t k = 0; k < ex.n; k++) {
    const uint8_t *e = ex.p + 3 * k;
    const uint32_t idx = __ldg(e), w = __ldg(e + 1) | (uint32_t)__ldg(e + 2) << 8, j = idx & 15u;
    const uint32_t col = NWC_BLOCK_COLS * cb + 32 * (idx >> 4) + frag_col(q, j);
    const float wv = bf16_to_f32(w);
    const bool upper = (j >> 1) & 1u;
#pragma unroll
    for (int n = 0; n < NC; n++) {
      if ((uint32_t)n < a.ncols) {
        const float p = wv * __ldg(a.x + n * a.ldx + col);
        s0[n] += upper ? 0.f : p;
        s8[n] += upper ? p : 0.f;
      }
    }
  }
#pragma unroll
  for (int n = 0; n < NC; n++) {
    float t0 = s0[n] + __shfl_xor_sync(0xffffffffu, s0[n], 1);
    float t8 = s8[n] + __shfl_xor_sync(0xffffffffu, s8[n], 1);
    t0 += __shfl_xor_sync(0xffffffffu, t0, 2);
    t8 += __shfl_xor_sync(0xffffffffu, t8, 2);
    if ((uint32_t)n == 2 * q) c[0] += t0, c[2] += t8;
    if ((uint32_t)n == 2 * q + 1) c[1] += t0, c[3] += t8;
  }
}

/* Writes block b's partial sums; the block that completes its row group's count finishes the
 * row group (see the file comment). */
template <int NC>
__device__ __forceinline__ void finish_block(const L2Geom &g, const L2Matvec &a, uint32_t b,
                                             uint32_t grp, const float c[4]) {
  const uint32_t lane = threadIdx.x & 31u, r = lane >> 2, q = lane & 3u;
  float *p = a.part + (uint64_t)b * 16 * NC;
  if (2 * q < a.ncols) p[r * NC + 2 * q] = c[0], p[(r + 8) * NC + 2 * q] = c[2];
  if (2 * q + 1 < a.ncols) p[r * NC + 2 * q + 1] = c[1], p[(r + 8) * NC + 2 * q + 1] = c[3];
  __threadfence();
  __syncwarp();
  uint32_t done = 0;
  if (lane == 0) done = atomicAdd(a.count + grp, 1u) + 1;
  done = __shfl_sync(0xffffffffu, done, 0);
  if (done != g.CB) return;
  __threadfence();
  const float *base = a.part + (uint64_t)grp * g.CB * 16 * NC;
  for (uint32_t e = lane; e < 16 * a.ncols; e += 32) {
    const uint32_t row = e / a.ncols, n = e - row * a.ncols, R = 16 * grp + row;
    float s = 0.f;
    for (uint32_t k = 0; k < g.CB; k++) s += __ldcg(base + ((uint64_t)k * 16 + row) * NC + n);
    if (R >= g.M) continue;
    const float v = s * (a.scale ? a.scale[R] : 1.f) + (a.bias ? a.bias[R] : 0.f);
    if (a.y) a.y[n * a.ldy + R] = v;
    if (a.y_bf16) a.y_bf16[n * a.ldy + R] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
  if (lane == 0) a.count[grp] = 0;
}

template <int NC>
__global__ void __launch_bounds__(kL2Threads, 2) l2_matvec_kernel(L2Geom g, L2Matvec a) {
  const uint32_t lane = threadIdx.x & 31u, r = lane >> 2, q = lane & 3u;
  const uint32_t nwarps = gridDim.x * (blockDim.x >> 5);
  const bool xl = r < a.ncols;
  for (uint32_t b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); b < g.nblocks; b += nwarps) {
    const uint32_t grp = b / g.CB, cb = b - grp * g.CB;
    const uint32_t nsc = cb + 1 < g.CB ? 16u : g.nsc_last;
    const uint64_t slot0 = (uint64_t)grp * g.S + 16 * cb;
    const uint2 *np = reinterpret_cast<const uint2 *>(g.nib) + slot0 * 32 + lane;
    const uint4 *lp = reinterpret_cast<const uint4 *>(g.low) + slot0 * 32 + lane;
    const uint32_t col0 = NWC_BLOCK_COLS * cb + 8 * q;
    const float *xp = a.x + (xl ? r * a.ldx : 0) + col0;
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    SlotBuf buf[kDepth];
#pragma unroll
    for (int i = 0; i < kDepth; i++)
      if ((uint32_t)i < nsc) buf[i].load(np + 32 * i, lp + 32 * i, xp + 32 * i, xl, col0 + 32 * i, g.K);
    for (uint32_t sc = 0; sc < nsc; sc += kDepth) {
#pragma unroll
      for (int i = 0; i < kDepth; i++) {
        const uint32_t s = sc + i;
        if (s < nsc) buf[i].multiply(g, c);
        const uint32_t t = s + kDepth;
        if (t < nsc) buf[i].load(np + 32 * t, lp + 32 * t, xp + 32 * t, xl, col0 + 32 * t, g.K);
      }
    }
    add_exceptions<NC>(g, a, b, cb, c);
    finish_block<NC>(g, a, b, grp, c);
  }
}

/* Dequant (rows = NULL: every row to out + row * K16) or gather (row rows[k] to out + k * K16,
 * one warp per requested row and column block). */
__global__ void __launch_bounds__(kL2Threads) l2_rows_kernel(L2Geom g, const uint64_t *rows, uint32_t n,
                                                             uint16_t *out) {
  const uint32_t lane = threadIdx.x & 31u, r = lane >> 2, q = lane & 3u;
  const uint32_t nwarps = gridDim.x * (blockDim.x >> 5);
  const uint32_t units = rows ? n * g.CB : g.nblocks;
  for (uint32_t u = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); u < units; u += nwarps) {
    uint32_t grp, cb;
    uint16_t *d0, *d8; /* where rows r and r + 8 of the group go */
    bool w0, w8;
    if (rows) {
      const uint32_t k = u / g.CB;
      cb = u - k * g.CB;
      const uint64_t R = rows[k];
      if (R >= g.M) continue; /* skipped: its output is left as it was */
      grp = (uint32_t)(R / 16);
      const uint32_t keep = (uint32_t)(R % 16);
      d0 = d8 = out + (uint64_t)k * g.K16;
      w0 = keep == r, w8 = keep == r + 8;
    } else {
      grp = u / g.CB, cb = u - grp * g.CB;
      d0 = out + (uint64_t)(16 * grp + r) * g.K16;
      d8 = d0 + (uint64_t)8 * g.K16;
      w0 = 16 * grp + r < g.M, w8 = 16 * grp + r + 8 < g.M;
    }
    const uint32_t b = grp * g.CB + cb, nsc = cb + 1 < g.CB ? 16u : g.nsc_last;
    const uint64_t slot0 = (uint64_t)grp * g.S + 16 * cb;
    const uint2 *np = reinterpret_cast<const uint2 *>(g.nib) + slot0 * 32 + lane;
    const uint4 *lp = reinterpret_cast<const uint4 *>(g.low) + slot0 * 32 + lane;
#pragma unroll 4
    for (uint32_t sc = 0; sc < nsc; sc++) {
      const uint32_t col = NWC_BLOCK_COLS * cb + 32 * sc + 8 * q;
      uint32_t A[8];
      decode_bf16_slot(ld_stream2(np + 32 * sc), ld_stream4(lp + 32 * sc), g.lut[0], g.lut[1], A);
      if (col >= g.K16) continue;
      if (w0) *reinterpret_cast<uint4 *>(d0 + col) = make_uint4(A[0], A[2], A[4], A[6]);
      if (w8) *reinterpret_cast<uint4 *>(d8 + col) = make_uint4(A[1], A[3], A[5], A[7]);
    }
    Exceptions ex;
    ex.open(g, b, 3);
    for (uint32_t k = 0; k < ex.n; k++) {
      const uint8_t *e = ex.p + 3 * k;
      const uint32_t idx = __ldg(e), j = idx & 15u;
      const uint32_t col = NWC_BLOCK_COLS * cb + 32 * (idx >> 4) + frag_col(q, j);
      const bool upper = (j >> 1) & 1u;
      if (upper ? w8 : w0) (upper ? d8 : d0)[col] = (uint16_t)(__ldg(e + 1) | __ldg(e + 2) << 8);
    }
  }
}

/* Blocks for a grid-striding kernel of kL2Threads: enough warps for the units, at most `per_sm`
 * CTAs per SM. */
int l2_ctas(uint64_t units, unsigned per_sm, unsigned *ctas) {
  int sms = sm_count();
  if (sms < 0) return sms;
  const uint64_t warps = kL2Threads / 32, need = (units + warps - 1) / warps;
  const uint64_t most = (uint64_t)sms * per_sm;
  *ctas = (unsigned)(need < most ? need : most);
  return 0;
}

} /* namespace */

int l2_geom_of(const nwc_k_tensor *t, L2Geom *g) {
  if (!t || !t->bases || !t->hdr || !t->data || !t->raw) return -EINVAL;
  if ((uintptr_t)t->raw % 16) return -EINVAL;
  if (NWC_ELEM_LAYOUT(t->elem) != 2 || NWC_ELEM_TYPE(t->elem) != NWC_ELEM_BF16) return -ENOTSUP;
  uint64_t lay[4];
  int rc = nwc_layout(t->rows, t->cols, t->elem, lay);
  if (rc < 0) return rc;
  if (lay[NWC_LAYOUT_BLOCKS] != t->nblocks) return -EINVAL;
  const uint64_t RB = (t->rows + 15) / 16, CB = (t->cols + NWC_BLOCK_COLS - 1) / NWC_BLOCK_COLS;
  const uint64_t K16 = lay[NWC_LAYOUT_K16], nl = (K16 - NWC_BLOCK_COLS * (CB - 1)) / 16;
  const uint64_t S = 16 * (CB - 1) + (nl + 1) / 2;
  if (t->nblocks >= (UINT64_C(1) << 31) || RB * S * 32 >= (UINT64_C(1) << 40) ||
      K16 >= (UINT64_C(1) << 31) || t->rows >= (UINT64_C(1) << 31))
    return -EOVERFLOW;
  g->bases = t->bases;
  g->hdr = t->hdr;
  g->data = t->data;
  g->nib = t->raw;
  g->low = t->raw + RB * S * 256;
  for (int i = 0; i < 4; i++)
    g->lut[i] = (uint32_t)t->psym[4 * i] | (uint32_t)t->psym[4 * i + 1] << 8 |
                (uint32_t)t->psym[4 * i + 2] << 16 | (uint32_t)t->psym[4 * i + 3] << 24;
  g->M = (uint32_t)t->rows;
  g->K = (uint32_t)t->cols;
  g->K16 = (uint32_t)K16;
  g->CB = (uint32_t)CB;
  g->S = (uint32_t)S;
  g->RB = (uint32_t)RB;
  g->nsc_last = (uint32_t)((nl + 1) / 2);
  g->nblocks = (uint32_t)t->nblocks;
  return 0;
}

int64_t l2_scratch_bytes(const L2Geom &g, unsigned ncols) {
  const unsigned nc = ncols <= 1 ? 1 : ncols <= 2 ? 2 : ncols <= 4 ? 4 : 8;
  return (int64_t)(((uint64_t)g.RB * 4 + 15) / 16 * 16 + (uint64_t)g.nblocks * 16 * nc * 4);
}

int l2_matvec(const nwc_k_tensor *t, const float *x, unsigned ncols, uint64_t ldx, const float *bias,
              float *y, uint16_t *y_bf16, uint64_t ldy, void *scratch, cudaStream_t stream) {
  L2Geom g;
  int rc = l2_geom_of(t, &g);
  if (rc < 0) return rc;
  if (!x || !scratch || (!y && !y_bf16) || ncols < 1 || ncols > 8) return -EINVAL;
  if ((uintptr_t)x % 16 || (ncols > 1 && (ldx < g.K || ldx % 4)) || (ncols > 1 && ldy < g.M) ||
      (uintptr_t)scratch % 16)
    return -EINVAL;
  L2Matvec a;
  a.x = x, a.ldx = ldx, a.ldy = ldy, a.ncols = ncols, a.scale = t->scale, a.bias = bias;
  a.y = y, a.y_bf16 = y_bf16;
  a.count = static_cast<uint32_t *>(scratch);
  a.part = reinterpret_cast<float *>(static_cast<uint8_t *>(scratch) + ((uint64_t)g.RB * 4 + 15) / 16 * 16);
  unsigned ctas;
  if ((rc = l2_ctas(g.nblocks, 2, &ctas)) < 0) return rc;
  if (ncols == 1) l2_matvec_kernel<1><<<ctas, kL2Threads, 0, stream>>>(g, a);
  else if (ncols == 2) l2_matvec_kernel<2><<<ctas, kL2Threads, 0, stream>>>(g, a);
  else if (ncols <= 4) l2_matvec_kernel<4><<<ctas, kL2Threads, 0, stream>>>(g, a);
  else l2_matvec_kernel<8><<<ctas, kL2Threads, 0, stream>>>(g, a);
  return launch_status();
}

int l2_rows(const nwc_k_tensor *t, const uint64_t *rows, uint64_t n, uint16_t *out, cudaStream_t stream) {
  L2Geom g;
  int rc = l2_geom_of(t, &g);
  if (rc < 0) return rc;
  if (!out || (uintptr_t)out % 16) return -EINVAL;
  if (rows && n == 0) return 0;
  if (rows && n * g.CB >= (UINT64_C(1) << 31)) return -EOVERFLOW;
  unsigned ctas;
  if ((rc = l2_ctas(rows ? n * g.CB : g.nblocks, 8, &ctas)) < 0) return rc;
  l2_rows_kernel<<<ctas, kL2Threads, 0, stream>>>(g, rows, (uint32_t)n, out);
  return launch_status();
}

} /* namespace nwc_k */
