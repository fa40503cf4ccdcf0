/*
 * gpu_die.h - the GPU benchmarks' way out: DIE prints "PROGRAM: message" and exits 1, CU checks a
 * CUDA runtime call, CB a cuBLAS call (where cublas_v2.h is included first).  A benchmark defines
 * BENCH_NAME and NW (its own nwc status check, which says what detail it has) itself.
 */
#ifndef NWC_GPU_DIE_H
#define NWC_GPU_DIE_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define DIE(...)                                                                                 \
  do {                                                                                           \
    fprintf(stderr, BENCH_NAME ": " __VA_ARGS__);                                                \
    fputc('\n', stderr);                                                                         \
    exit(1);                                                                                     \
  } while (0)
#define CU(expr)                                                                                 \
  do {                                                                                           \
    cudaError_t e_ = (expr);                                                                     \
    if (e_ != cudaSuccess) DIE("%s: %s (line %d)", #expr, cudaGetErrorString(e_), __LINE__);     \
  } while (0)
#ifdef CUBLAS_V2_H_
#define CB(expr)                                                                                 \
  do {                                                                                           \
    cublasStatus_t s_ = (expr);                                                                  \
    if (s_ != CUBLAS_STATUS_SUCCESS) DIE("%s: cublas status %d (line %d)", #expr, (int)s_, __LINE__); \
  } while (0)
#endif

#endif /* NWC_GPU_DIE_H */
