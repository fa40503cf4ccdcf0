/*
 * kernel_weights.h - the BF16 weights the GPU kernels' tests run on (test_gpu_kernels.c, and
 * test_l1_decode.c, which runs layout 1's device decode on the CPU): normal with log-normal row
 * scales and a heavy tail, all equal, and escapes on every lane of layouts 0 and 1.  Fresh random
 * values from test_util.h's generator (its seed printed by the test).
 */
#ifndef NWC_KERNEL_WEIGHTS_H
#define NWC_KERNEL_WEIGHTS_H

#include "nwc.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static double normal(void) {
  double u = test_uniform(), v = test_uniform();
  return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

enum kind { REAL, EQUAL, ESCAPES };
static const char *kind_name[] = {"real", "equal", "escapes"};

/* BF16 weights of the given kind. */
static uint16_t *make_bf16(uint64_t M, uint64_t K, enum kind kind) {
  uint16_t *w = malloc(M * K * sizeof *w);
  if (kind == EQUAL) {
    uint16_t v = nwc_f32_to_bf16((float)(normal() * 0.05));
    for (uint64_t i = 0; i < M * K; i++) w[i] = v;
  } else if (kind == REAL) {
    for (uint64_t r = 0; r < M; r++) {
      double s = 0.02 * exp(0.5 * normal());
      for (uint64_t c = 0; c < K; c++) {
        double v = normal() * s;
        if (test_below(1000) == 0) v *= 30; /* heavy tail */
        w[r * K + c] = nwc_f32_to_bf16((float)v);
      }
    }
  } else {
    /* 15 common high bytes in exact rotation, and on every layout-0 lane with at least 31 real
     * weights and at the first weight of every layout-1 lane (row 16 g + r, column 512 cb + 8 q)
     * one of 20 rare bytes: each common byte outnumbers every rare one, so the rare ones have
     * ranks >= 15 and are escaped. */
    uint64_t n = 0;
    for (uint64_t r = 0; r < M; r++)
      for (uint64_t c = 0; c < K; c++) {
        unsigned lo = (unsigned)test_below(256), sign = (unsigned)test_below(2) << 15;
        w[r * K + c] = (uint16_t)(sign | (0x3cu - n++ % 15) << 8 | lo);
      }
    unsigned j = 0;
    for (uint64_t r = 0; r < M; r += NWC_BLOCK_ROWS)
      for (uint64_t c = 0; c < K; c += NWC_LANE_COLS) {
        uint64_t rows = M - r < 8 ? M - r : 8, cols = K - c < 16 ? K - c : 16;
        if (rows * cols >= 31) w[r * K + c] = (uint16_t)((0x10u + j++ % 20) << 8 | test_below(256));
      }
    for (uint64_t r = 0; r < M; r++)
      for (uint64_t c = 0; c < K; c += 8)
        if (r % 16 < 8 && c % 512 < 32) w[r * K + c] = (uint16_t)((0x10u + j++ % 20) << 8 | test_below(256));
  }
  return w;
}

#endif /* NWC_KERNEL_WEIGHTS_H */
