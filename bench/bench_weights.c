/*
 * bench_weights.c - synthetic weights for the GPU benchmarks (bench.h: nwc_bench_normal_bf16):
 * nwc-bench gpu-daemon and nwc_gpu_map_bench link it.
 */
#include "bench.h"

#include <math.h>

void nwc_bench_normal_bf16(uint16_t *w, uint64_t n, uint64_t seed) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (uint64_t i = 0; i < n; i += 2) {
    double u[2];
    for (int k = 0; k < 2; k++) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      u[k] = ((double)(s >> 11) + 0.5) * 0x1p-53;
    }
    double r = 0.02 * sqrt(-2 * log(u[0]));
    w[i] = nwc_f32_to_bf16((float)(r * cos(6.283185307179586 * u[1])));
    if (i + 1 < n) w[i + 1] = nwc_f32_to_bf16((float)(r * sin(6.283185307179586 * u[1])));
  }
}

