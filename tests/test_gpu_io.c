/*
 * test_gpu_io.c - the kernels around the decoders (kernels/io.cu) against plain C on the host,
 * bit for bit, at random shapes (fresh seed): nwc_k_load_x (columns of K floats, any stride,
 * into columns of K16 zero padded), nwc_k_epilogue (scale and bias, float and BF16 output, the
 * BF16 rounding the CPU's nwc_f32_to_bf16 with NaNs, infinities, ties and subnormals among the
 * values) and nwc_k_compact (K16-strided BF16 rows into dense BF16 and float rows).  Bad
 * arguments are refused before any CUDA call, so that part runs without a GPU; the rest exits
 * 77 where there is none.
 */
#include "nwc.h"
#include "nwc_kernels.h"
#include "test_util.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

static cudaStream_t stream;

static void *dev_alloc(size_t n) {
  void *p = NULL;
  CHECK(cudaMalloc(&p, n ? n : 1) == cudaSuccess, "cudaMalloc of %zu bytes", n);
  return p;
}

static void up(void *d, const void *h, size_t n) {
  CHECK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) == cudaSuccess, "copy up");
}

static void down(void *h, const void *d, size_t n) {
  CHECK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) == cudaSuccess, "copy down");
}

/* A float that exercises the rounding: mostly ordinary values, some NaNs of either sign,
 * infinities, exact ties, subnormals and values that round to infinity. */
static float tricky(void) {
  uint32_t u;
  switch (test_below(16)) {
    case 0: u = 0x7fc00000u | (uint32_t)test_below(1u << 22) | (uint32_t)test_below(2) << 31; break;
    case 1: u = 0x7f800000u | (uint32_t)test_below(2) << 31; break;
    case 2: u = (uint32_t)test_rand() & 0xffff0000u, u |= 0x8000u; break; /* a tie */
    case 3: u = (uint32_t)test_below(1u << 23) | (uint32_t)test_below(2) << 31; break;
    case 4: u = 0x7f7f8000u + (uint32_t)test_below(0x8000); break;
    default: {
      float f = (float)((test_uniform() - 0.5) * 8.0);
      memcpy(&u, &f, 4);
    }
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void check_args(void) {
  float f = 0;
  uint16_t h = 0;
  CHECK(nwc_k_load_x(NULL, 4, 4, 1, &f, stream) == -EINVAL, "load_x without src");
  CHECK(nwc_k_load_x(&f, 4, 4, 1, NULL, stream) == -EINVAL, "load_x without dx");
  CHECK(nwc_k_load_x(&f, 8, 4, 1, &f, stream) == -EINVAL, "load_x with xld < K");
  CHECK(nwc_k_load_x(&f, 16, 16, UINT64_MAX, &f, stream) == -EOVERFLOW, "load_x too large");
  CHECK(nwc_k_epilogue(NULL, 4, 1, 1.f, NULL, &f, 0, stream) == -EINVAL, "epilogue without t");
  CHECK(nwc_k_epilogue(&f, 4, 1, 1.f, NULL, NULL, 0, stream) == -EINVAL, "epilogue without y");
  CHECK(nwc_k_epilogue(&f, 0, 1, 1.f, NULL, &f, 0, stream) == -EINVAL, "epilogue with M = 0");
  CHECK(nwc_k_epilogue(&f, 2, UINT64_MAX, 1.f, NULL, &f, 0, stream) == -EOVERFLOW,
        "epilogue too large");
  CHECK(nwc_k_compact(NULL, 1, 4, &f, 0, stream) == -EINVAL, "compact without src");
  CHECK(nwc_k_compact(&h, 1, 4, NULL, 0, stream) == -EINVAL, "compact without dst");
  CHECK(nwc_k_compact(&h, 1, 0, &f, 0, stream) == -EINVAL, "compact with K = 0");
  CHECK(nwc_k_compact(&h, UINT64_MAX, 16, &f, 0, stream) == -EOVERFLOW, "compact too large");
}

static void check_load_x(uint64_t K, uint64_t ncols) {
  const uint64_t K16 = (K + 15) & ~UINT64_C(15), xld = K + test_below(40);
  size_t n = (size_t)(ncols * xld);
  float *src = malloc(n * 4), *out = malloc(ncols * K16 * 4);
  for (size_t i = 0; i < n; i++) src[i] = tricky();
  float *dsrc = dev_alloc(n * 4), *dx = dev_alloc(ncols * K16 * 4);
  up(dsrc, src, n * 4);
  CHECK(cudaMemset(dx, 0xff, ncols * K16 * 4) == cudaSuccess, "memset");
  CHECK(nwc_k_load_x(dsrc, K, xld, ncols, dx, stream) == 0, "load_x K %llu", (unsigned long long)K);
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "load_x ran");
  down(out, dx, ncols * K16 * 4);
  uint64_t bad = 0;
  for (uint64_t c = 0; c < ncols; c++)
    for (uint64_t k = 0; k < K16; k++) {
      float want = k < K ? src[c * xld + k] : 0.0f;
      bad += memcmp(&out[c * K16 + k], &want, 4) != 0;
    }
  CHECK(!bad, "load_x K %llu xld %llu, %llu columns: %llu floats differ", (unsigned long long)K,
        (unsigned long long)xld, (unsigned long long)ncols, (unsigned long long)bad);
  cudaFree(dsrc), cudaFree(dx), free(src), free(out);
}

static void check_epilogue(uint64_t M, uint64_t ncols, bool with_bias, int bf16) {
  size_t n = (size_t)(M * ncols);
  float *t = malloc(n * 4), *bias = malloc(M * 4), scale = (float)(test_uniform() * 4 - 2);
  for (size_t i = 0; i < n; i++) t[i] = tricky();
  for (uint64_t i = 0; i < M; i++) bias[i] = (float)(test_uniform() - 0.5);
  float *dt = dev_alloc(n * 4), *db = dev_alloc(M * 4);
  void *dy = dev_alloc(n * 4), *y = malloc(n * 4);
  up(dt, t, n * 4), up(db, bias, M * 4);
  CHECK(nwc_k_epilogue(dt, M, ncols, scale, with_bias ? db : NULL, dy, bf16, stream) == 0,
        "epilogue M %llu", (unsigned long long)M);
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "epilogue ran");
  down(y, dy, n * (bf16 ? 2 : 4));
  uint64_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    /* scale * t + bias, fused (as nvcc contracts it) or not (the host's C17 does not) */
    float b = with_bias ? bias[i % M] : 0.0f, v[2] = {fmaf(scale, t[i], b), scale * t[i] + b};
    bool ok = false;
    for (int k = 0; k < 2; k++) {
      /* IEEE 754 leaves a NaN result's sign and payload open (the GPU's FMA gives its canonical
       * NaN for a NaN operand, the host keeps the operand's): any NaN is the right answer. */
      uint16_t h = ((uint16_t *)y)[i];
      if (bf16) ok |= h == nwc_f32_to_bf16(v[k]) || (isnan(v[k]) && (h & 0x7fffu) > 0x7f80u);
      else ok |= !memcmp((float *)y + i, &v[k], 4) || (isnan(v[k]) && isnan(((float *)y)[i]));
    }
    bad += !ok;
  }
  CHECK(!bad, "epilogue M %llu, %llu columns, bias %d, bf16 %d: %llu values differ",
        (unsigned long long)M, (unsigned long long)ncols, with_bias, bf16,
        (unsigned long long)bad);
  cudaFree(dt), cudaFree(db), cudaFree(dy), free(t), free(bias), free(y);
}

static void check_compact(uint64_t M, uint64_t K, int bf16) {
  const uint64_t K16 = (K + 15) & ~UINT64_C(15);
  uint16_t *src = malloc(M * K16 * 2);
  for (uint64_t i = 0; i < M * K16; i++) src[i] = (uint16_t)test_rand();
  uint16_t *dsrc = dev_alloc(M * K16 * 2);
  void *ddst = dev_alloc(M * K * 4), *dst = malloc(M * K * 4);
  up(dsrc, src, M * K16 * 2);
  CHECK(nwc_k_compact(dsrc, M, K, ddst, bf16, stream) == 0, "compact %llux%llu",
        (unsigned long long)M, (unsigned long long)K);
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "compact ran");
  down(dst, ddst, M * K * (bf16 ? 2 : 4));
  uint64_t bad = 0;
  for (uint64_t r = 0; r < M; r++)
    for (uint64_t k = 0; k < K; k++) {
      uint16_t h = src[r * K16 + k];
      if (bf16) {
        bad += ((uint16_t *)dst)[r * K + k] != h;
      } else {
        uint32_t want = (uint32_t)h << 16, got;
        memcpy(&got, (float *)dst + r * K + k, 4);
        bad += got != want;
      }
    }
  CHECK(!bad, "compact %llux%llu bf16 %d: %llu values differ", (unsigned long long)M,
        (unsigned long long)K, bf16, (unsigned long long)bad);
  cudaFree(dsrc), cudaFree(ddst), free(src), free(dst);
}

int main(void) {
  test_seed("test_gpu_io");
  check_args(); /* no CUDA call: runs everywhere */
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    printf("argument checks passed; no CUDA device: the kernels are skipped\n");
    return test_failures ? test_exit("test_gpu_io") : TEST_SKIP;
  }
  CHECK(cudaStreamCreate(&stream) == cudaSuccess, "stream");
  for (int round = 0; round < 40 && !test_failures; round++) {
    uint64_t K = 1 + test_below(round < 20 ? 64 : 5000), M = 1 + test_below(3000);
    uint64_t ncols = 1 + test_below(9);
    check_load_x(K, ncols);
    check_epilogue(M, ncols, test_below(2), (int)test_below(2));
    check_compact(1 + test_below(300), K, (int)test_below(2));
  }
  cudaStreamDestroy(stream);
  return test_exit("test_gpu_io");
}
