/*
 * io.cu - the kernels around the decoders, for callers whose vectors are not laid out as the
 * decoders take them (nwcd's socket and CUDA IPC paths): x into columns of K16 floats
 * (nwc_k_load_x), matvec results scaled, biased and written as float or BF16 (nwc_k_epilogue),
 * and dequant's K16-strided BF16 rows compacted into dense BF16 or float rows (nwc_k_compact).
 *
 * Each is a grid-stride loop over its n elements, 256 threads a block and at most 4096 blocks:
 * they move a few bytes per element, so they are bound by memory (or, for x in mapped host
 * memory, by the bus), and one launch covers any size.  BF16 output rounds as every kernel does
 * (bf16.cuh).
 *
 * Variants: one kernel each (the BF16 / float choice is a branch on a uniform argument).
 */
#include "bf16.cuh"
#include "host.cuh"

namespace nwc_k {
namespace {

constexpr unsigned kIoThreads = 256, kIoMaxBlocks = 4096;

unsigned io_blocks(uint64_t n) {
  uint64_t g = (n + kIoThreads - 1) / kIoThreads;
  return (unsigned)(g < kIoMaxBlocks ? (g ? g : 1) : kIoMaxBlocks);
}

/* dx[c * K16 + k] = src[c * xld + k] for k < K, 0 up to K16 (n = ncols * K16). */
__global__ void load_x_kernel(const float *src, uint64_t K, uint64_t xld, uint64_t K16, uint64_t n,
                              float *dx) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x) {
    uint64_t col = i / K16, k = i - col * K16;
    dx[i] = k < K ? src[col * xld + k] : 0.0f;
  }
}

/* y[c * M + i] = scale * t[c * M + i] + bias[i], as float or BF16 (n = ncols * M). */
__global__ void epilogue_kernel(const float *t, uint64_t M, uint64_t n, float scale,
                                const float *bias, void *y, int bf16) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x) {
    float v = scale * t[i] + (bias ? bias[i % M] : 0.0f);
    if (bf16) static_cast<uint16_t *>(y)[i] = bf16_rne(v);
    else static_cast<float *>(y)[i] = v;
  }
}

/* Dense rows x K (BF16 or float) from BF16 rows of stride K16. */
__global__ void compact_kernel(const uint16_t *src, uint64_t M, uint64_t K, uint64_t K16, void *dst,
                               int bf16) {
  uint64_t n = M * K;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x) {
    uint16_t h = src[(i / K) * K16 + i % K];
    if (bf16) static_cast<uint16_t *>(dst)[i] = h;
    else static_cast<float *>(dst)[i] = __uint_as_float((uint32_t)h << 16);
  }
}

int launch_load_x(const float *src, uint64_t K, uint64_t xld, uint64_t K16, uint64_t n, float *dx,
                  cudaStream_t stream) {
  load_x_kernel<<<io_blocks(n), kIoThreads, 0, stream>>>(src, K, xld, K16, n, dx);
  return launch_status();
}

int launch_epilogue(const float *t, uint64_t M, uint64_t n, float scale, const float *bias,
                    void *y, int bf16, cudaStream_t stream) {
  epilogue_kernel<<<io_blocks(n), kIoThreads, 0, stream>>>(t, M, n, scale, bias, y, bf16);
  return launch_status();
}

int launch_compact(const uint16_t *src, uint64_t M, uint64_t K, uint64_t K16, void *dst, int bf16,
                   cudaStream_t stream) {
  compact_kernel<<<io_blocks(M * K), kIoThreads, 0, stream>>>(src, M, K, K16, dst, bf16);
  return launch_status();
}

} /* namespace */
} /* namespace nwc_k */

extern "C" int nwc_k_load_x(const float *src, uint64_t K, uint64_t xld, uint64_t ncols, float *dx,
                            cudaStream_t stream) {
  const uint64_t K16 = (K + 15) & ~UINT64_C(15);
  if (!src || !dx || xld < K || K16 < K) return -EINVAL;
  if (ncols && K16 > UINT64_MAX / ncols) return -EOVERFLOW;
  return nwc_k::launch_load_x(src, K, xld, K16, ncols * K16, dx, stream);
}

extern "C" int nwc_k_epilogue(const float *t, uint64_t M, uint64_t ncols, float scale,
                              const float *bias, void *y, int bf16, cudaStream_t stream) {
  if (!t || !y || M == 0) return -EINVAL;
  if (ncols > UINT64_MAX / M) return -EOVERFLOW;
  return nwc_k::launch_epilogue(t, M, ncols * M, scale, bias, y, bf16, stream);
}

extern "C" int nwc_k_compact(const uint16_t *src, uint64_t M, uint64_t K, void *dst, int bf16,
                             cudaStream_t stream) {
  const uint64_t K16 = (K + 15) & ~UINT64_C(15);
  if (!src || !dst || K == 0 || K16 < K) return -EINVAL;
  if (M > UINT64_MAX / K16) return -EOVERFLOW;
  return nwc_k::launch_compact(src, M, K, K16, dst, bf16, stream);
}
