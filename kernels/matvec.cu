/*
 * matvec.cu - y = scale * (W x) + bias on a layout-0 tensor (nwc_k_linear_bf16, nwc_k_matvec), and
 * the plain fp8 matvec baseline (nwc_k_ref_fp8).
 *
 * Design (format v9): at most one persistent CTA per SM, with as many warps as the blocks need (up
 * to 32), copies the table to shared memory once, then each warp grid-strides over the 8 x 512
 * blocks, staging each in its slice of shared memory (decode.cuh).  Per block a lane loads its 16
 * activations into registers once, decodes its 8 rows of 16 weights (decode.cuh), multiplies them
 * into one row sum per row (two FMA chains), and rotates the row sums through eight accumulators so
 * that every register index is a constant.  At block end a transposed shuffle reduction (xor 16,
 * 8, 4 split the rows between lane halves, xor 2, 1 finish) leaves row r's sum in lane 4r, which
 * stores it to scratch[row * CB + column block].  A finalize kernel (one thread per row) adds a
 * row's CB partial sums in order, applies scale and bias, and writes fp32 and/or BF16.  No atomics:
 * the result does not depend on scheduling.
 *
 * Variants: matvec_kernel<BF16>, matvec_kernel<FP8>; finalize_kernel; ref_fp8_kernel.
 */
#include "bf16.cuh"
#include "host.cuh"
#include "layout1.cuh"
#include "layout2.cuh"

#include <cuda_fp8.h>

namespace nwc_k {
namespace {

struct Dot {
  const float *x;
  float xv[16];
  float acc[8];

  __device__ __forceinline__ void begin(uint32_t c0, bool active) {
    const float4 *xp = reinterpret_cast<const float4 *>(x + c0);
#pragma unroll
    for (int j = 0; j < 4; j++) {
      float4 v = active ? __ldg(xp + j) : make_float4(0.f, 0.f, 0.f, 0.f);
      xv[4 * j] = v.x, xv[4 * j + 1] = v.y, xv[4 * j + 2] = v.z, xv[4 * j + 3] = v.w;
    }
  }

  __device__ __forceinline__ void push(float v) {
#pragma unroll
    for (int r = 0; r < 7; r++) acc[r] = acc[r + 1];
    acc[7] = v;
  }

  __device__ __forceinline__ void row(uint32_t, uint64_t, bool active, const uint32_t e[8], const uint32_t m[4]) {
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int k = 0; k < 8; k++) {
      s0 = fmaf(__uint_as_float(weight_bits(2 * k, e[k], m)), xv[2 * k], s0);
      s1 = fmaf(__uint_as_float(weight_bits(2 * k + 1, e[k], m)), xv[2 * k + 1], s1);
    }
    push(active ? s0 + s1 : 0.f); /* an empty lane's weights are lane 0's: not ours to add */
  }

  /* Sum over the 32 lanes of each row's sums (rows from nrows on, not coded, count 0); row r
   * ends in lane 4r, which stores it. */
  __device__ __forceinline__ void end(float *scratch, uint32_t b, uint32_t CB, uint32_t nrows) {
#pragma unroll
    for (uint32_t r = 1; r < NWC_BLOCK_ROWS; r++)
      if (r >= nrows) push(0.f);
    const unsigned lane = threadIdx.x & 31u;
    const bool b4 = lane & 16u, b3 = lane & 8u, b2 = lane & 4u;
    float v[4], u[2];
#pragma unroll
    for (int k = 0; k < 4; k++) {
      float send = b4 ? acc[k] : acc[k + 4], keep = b4 ? acc[k + 4] : acc[k];
      v[k] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
    }
#pragma unroll
    for (int k = 0; k < 2; k++) {
      float send = b3 ? v[k] : v[k + 2], keep = b3 ? v[k + 2] : v[k];
      u[k] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
    }
    float send = b2 ? u[0] : u[1], keep = b2 ? u[1] : u[0];
    float s = keep + __shfl_xor_sync(0xffffffffu, send, 4);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    if ((lane & 3u) == 0) {
      uint32_t rb = b / CB, cb = b - rb * CB;
      scratch[(uint64_t)(rb * NWC_BLOCK_ROWS + (lane >> 2)) * CB + cb] = s;
    }
  }
};

template <int TYPE>
__global__ void __launch_bounds__(kMaxThreads, 1)
matvec_kernel(Geom g, const uint32_t *tab, const float *x, float *scratch) {
  extern __shared__ uint4 smem[];
  uint32_t *s_tab = reinterpret_cast<uint32_t *>(smem);
  uint8_t *wbuf = reinterpret_cast<uint8_t *>(smem) + kTabBytes + (threadIdx.x >> 5) * kWarpBuf;
  const uint32_t nwarps = (gridDim.x * blockDim.x) >> 5, first = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  Head h = load_head(g, first); /* in flight while the table loads */
  load_table(s_tab, tab);
  for (uint32_t b = first; b < g.nblocks; b += nwarps) {
    uint32_t row0 = b / g.CB * NWC_BLOCK_ROWS;
    uint32_t nrows = g.M - row0 < NWC_BLOCK_ROWS ? g.M - row0 : NWC_BLOCK_ROWS;
    Dot d;
    d.x = x;
    decode_block<TYPE>(g, s_tab, wbuf, b, nrows, b + nwarps, h, d);
    d.end(scratch, b, g.CB, nrows);
  }
}

/* Row r's sum of its column blocks' partial sums, which it sets back to zero: one scratch serves
 * layouts 1 and 2 too, whose part words must be zero at every call's start (nwc_k_scratch_bytes),
 * and a layout-0 tensor's partial sums lie where they do. */
__global__ void finalize_kernel(float *scratch, uint32_t M, uint32_t CB, const float *scale,
                                const float *bias, float *y, uint16_t *y_bf16) {
  uint32_t r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= M) return;
  float *p = scratch + (uint64_t)r * CB;
  float s = 0.f;
  for (uint32_t cb = 0; cb < CB; cb++) s += p[cb], p[cb] = 0.f;
  float v = s * (scale ? scale[r] : 1.f) + (bias ? bias[r] : 0.f);
  if (y) y[r] = v;
  if (y_bf16) y_bf16[r] = bf16_rne(v);
}

/* 16 fp8 weights times x[16 c .. 16 c + 15], converted through half2. */
__device__ __forceinline__ float dot16_fp8(uint4 v, const float4 *xp, uint32_t c, float s) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; j++) {
    float4 xv = __ldg(xp + 4 * c + j);
    __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(words[j] & 0xffffu), __NV_E4M3);
    __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(words[j] >> 16), __NV_E4M3);
    float2 a = __half22float2(*reinterpret_cast<__half2 *>(&lo));
    float2 b = __half22float2(*reinterpret_cast<__half2 *>(&hi));
    s = fmaf(a.x, xv.x, s);
    s = fmaf(a.y, xv.y, s);
    s = fmaf(b.x, xv.z, s);
    s = fmaf(b.y, xv.w, s);
  }
  return s;
}

__device__ __forceinline__ void ref_fp8_store(float s, uint32_t r, const float *scale, const float *bias,
                                              uint16_t *y) {
  float v = s * (scale ? scale[r] : 1.f) + (bias ? bias[r] : 0.f);
  y[r] = bf16_rne(v);
}

/* Persistent warps, two rows at a time (sharing the x loads), four 16-byte loads per row and lane
 * in flight. */
constexpr unsigned kRefThreads = 256;
__global__ void __launch_bounds__(kRefThreads)
ref_fp8_kernel(const uint8_t *q, uint32_t M, uint32_t K, const float *x, const float *scale,
               const float *bias, uint16_t *y) {
  const uint32_t lane = threadIdx.x & 31u, nw = gridDim.x * (kRefThreads / 32);
  const uint32_t n = K / 16;
  const float4 *xp = reinterpret_cast<const float4 *>(x);
  for (uint32_t r0 = blockIdx.x * (kRefThreads / 32) + (threadIdx.x >> 5); r0 < M; r0 += 2 * nw) {
    const uint32_t r1 = r0 + nw;
    const bool two = r1 < M;
    const uint4 *row0 = reinterpret_cast<const uint4 *>(q + (uint64_t)r0 * K);
    const uint4 *row1 = reinterpret_cast<const uint4 *>(q + (uint64_t)(two ? r1 : r0) * K);
    float s0 = 0.f, s1 = 0.f;
    for (uint32_t c = lane; c < n; c += 4 * 32) {
      uint4 a[4], b[4];
#pragma unroll
      for (int u = 0; u < 4; u++) {
        const bool in = c + 32 * u < n;
        a[u] = in ? __ldcs(row0 + c + 32 * u) : make_uint4(0, 0, 0, 0);
        b[u] = in && two ? __ldcs(row1 + c + 32 * u) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < 4; u++)
        if (c + 32 * u < n) {
          s0 = dot16_fp8(a[u], xp, c + 32 * u, s0);
          s1 = dot16_fp8(b[u], xp, c + 32 * u, s1);
        }
    }
#pragma unroll
    for (int d = 16; d; d >>= 1) {
      s0 += __shfl_xor_sync(0xffffffffu, s0, d);
      s1 += __shfl_xor_sync(0xffffffffu, s1, d);
    }
    if (lane == 0) {
      ref_fp8_store(s0, r0, scale, bias, y);
      if (two) ref_fp8_store(s1, r1, scale, bias, y);
    }
  }
}

int launch_matvec(const nwc_k_tensor *t, const float *x, const float *bias, float *y,
                  uint16_t *y_bf16, float *scratch, cudaStream_t stream) {
  Geom g;
  unsigned type;
  int rc = geom_of(t, &g, &type);
  if (rc < 0) return rc;
  if (!x || !scratch || (!y && !y_bf16)) return -EINVAL;
  Grid gr;
  if ((rc = persistent_grid(g.nblocks, &gr)) < 0) return rc;
  auto kernel = type == NWC_ELEM_BF16 ? matvec_kernel<NWC_ELEM_BF16> : matvec_kernel<NWC_ELEM_FP8>;
  if ((rc = cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem))) < 0)
    return rc;
  kernel<<<gr.ctas, gr.threads, gr.smem, stream>>>(g, t->tab, x, scratch);
  if ((rc = launch_status()) < 0) return rc;
  finalize_kernel<<<(g.M + 255) / 256, 256, 0, stream>>>(scratch, g.M, g.CB, t->scale, bias, y, y_bf16);
  return launch_status();
}

} /* namespace */
} /* namespace nwc_k */

extern "C" int64_t nwc_k_scratch_bytes(const nwc_k_tensor *t, unsigned ncols) {
  if (!t || ncols < 1 || ncols > NWC_K_MAX_COLS) return -EINVAL;
  if (NWC_ELEM_LAYOUT(t->elem) == 1) {
    nwc_k::L1Geom g;
    int rc = nwc_k::l1_geom_of(t, &g);
    return rc < 0 ? rc : nwc_k::l1_scratch_bytes(g, ncols);
  }
  if (NWC_ELEM_LAYOUT(t->elem) == 2) {
    nwc_k::L2Geom g;
    int rc = nwc_k::l2_geom_of(t, &g);
    return rc < 0 ? rc : nwc_k::l2_scratch_bytes(g, ncols);
  }
  uint64_t lay[4];
  int rc = nwc_layout(t->rows, t->cols, t->elem, lay);
  return rc < 0 ? rc : (int64_t)(lay[NWC_LAYOUT_SCRATCH] * sizeof(float));
}

/* Both matvec entries: x fp32 or (bf16_x) BF16, dispatched on the layout; layout 0 runs its
 * one-column kernels per column and reads fp32 x only. */
static int matvec_cols(const nwc_k_tensor *t, const void *x, bool bf16_x, unsigned ncols, uint64_t ldx,
                       const float *bias, float *y, uint16_t *y_bf16, uint64_t ldy, void *scratch,
                       cudaStream_t stream) {
  if (!t) return -EINVAL;
  if (NWC_ELEM_LAYOUT(t->elem) == 1)
    return nwc_k::l1_matvec(t, x, bf16_x, ncols, ldx, bias, y, y_bf16, ldy, scratch, stream);
  if (NWC_ELEM_LAYOUT(t->elem) == 2)
    return nwc_k::l2_matvec(t, x, bf16_x, ncols, ldx, bias, y, y_bf16, ldy, scratch, stream);
  if (bf16_x) return -ENOTSUP;
  if (!x || ncols < 1 || ncols > NWC_K_MAX_COLS || (ncols > 1 && (ldx < t->cols || ldy < t->rows))) return -EINVAL;
  for (unsigned c = 0; c < ncols; c++) {
    int rc = nwc_k::launch_matvec(t, static_cast<const float *>(x) + c * ldx, bias, y ? y + c * ldy : NULL,
                                  y_bf16 ? y_bf16 + c * ldy : NULL, static_cast<float *>(scratch), stream);
    if (rc < 0) return rc;
  }
  return 0;
}

extern "C" int nwc_k_matvec_cols(const nwc_k_tensor *t, const float *x, unsigned ncols, uint64_t ldx,
                                 const float *bias, float *y, uint16_t *y_bf16, uint64_t ldy,
                                 void *scratch, cudaStream_t stream) {
  return matvec_cols(t, x, false, ncols, ldx, bias, y, y_bf16, ldy, scratch, stream);
}

extern "C" int nwc_k_matvec_cols_bf16x(const nwc_k_tensor *t, const uint16_t *x, unsigned ncols, uint64_t ldx,
                                       const float *bias, float *y, uint16_t *y_bf16, uint64_t ldy,
                                       void *scratch, cudaStream_t stream) {
  return matvec_cols(t, x, true, ncols, ldx, bias, y, y_bf16, ldy, scratch, stream);
}

extern "C" int nwc_k_linear_bf16(const nwc_k_tensor *t, const float *x, const float *bias,
                                 uint16_t *y, float *scratch, cudaStream_t stream) {
  if (!y) return -EINVAL;
  return nwc_k_matvec_cols(t, x, 1, 0, bias, NULL, y, 0, scratch, stream);
}

extern "C" int nwc_k_matvec(const nwc_k_tensor *t, const float *x, const float *bias, float *y,
                            float *scratch, cudaStream_t stream) {
  if (!y) return -EINVAL;
  return nwc_k_matvec_cols(t, x, 1, 0, bias, y, NULL, 0, scratch, stream);
}

extern "C" int nwc_k_ref_fp8(const uint8_t *q, uint64_t M, uint64_t K, const float *x,
                             const float *scale, const float *bias, uint16_t *y,
                             cudaStream_t stream) {
  if (!q || !x || !y || M == 0 || K == 0 || K % 16) return -EINVAL;
  if (M >= (UINT64_C(1) << 31) || K >= (UINT64_C(1) << 31)) return -EOVERFLOW;
  int sms = nwc_k::sm_count();
  if (sms < 0) return sms;
  const uint64_t per_block = nwc_k::kRefThreads / 32;
  uint64_t blocks = (M + per_block - 1) / per_block;
  if (blocks > (uint64_t)sms * 4) blocks = (uint64_t)sms * 4; /* 32 warps per SM (58 registers), persistent */
  nwc_k::ref_fp8_kernel<<<(unsigned)blocks, nwc_k::kRefThreads, 0, stream>>>(q, (uint32_t)M, (uint32_t)K, x,
                                                                            scale, bias, y);
  return nwc_k::launch_status();
}
