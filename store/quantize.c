/*
 * quantize.c - BF16 -> fp8 e4m3 quantization with one symmetric absmax scale per output channel
 * (row): scale = absmax / 448, q = RNE(w / scale), saturated at the largest finite fp8 (448).
 */
#include "internal.h"

#include <math.h>
#include <string.h>

/* fp32 -> fp8 e4m3fn, round to nearest even, saturating; v must be finite. */
static uint8_t f32_to_fp8(float v) {
  uint8_t sign = signbit(v) ? 0x80 : 0;
  float a = fabsf(v);
  if (a >= 448.0f) return sign | 0x7e;
  if (a < 0x1p-6f) { /* subnormal range: multiples of 2^-9 */
    float m = nearbyintf(a * 512.0f); /* default rounding mode: to nearest even */
    return sign | (uint8_t)m;         /* m == 8 is the smallest normal, 0x08 */
  }
  int e;
  float f = frexpf(a, &e); /* a = f * 2^e, f in [0.5, 1) */
  float m = nearbyintf((f * 2.0f - 1.0f) * 8.0f); /* 3 mantissa bits */
  int be = e - 1 + 7;
  if (m == 8.0f) {
    m = 0;
    be++;
  }
  if (be > 15 || (be == 15 && m > 6)) return sign | 0x7e;
  return sign | (uint8_t)(be << 3) | (uint8_t)m;
}

int nwc_quantize_fp8(const uint16_t *w, uint64_t M, uint64_t K, uint8_t *q, float *scale) {
  NWC_RETURN_IF(!w || !q || !scale || M == 0 || K == 0, -EINVAL,
                "nwc_quantize_fp8: bad arguments");
  for (uint64_t r = 0; r < M; r++) {
    const uint16_t *row = w + r * K;
    float amax = 0;
    for (uint64_t c = 0; c < K; c++) {
      float v = nwc_bf16_to_f32(row[c]);
      NWC_RETURN_IF(!isfinite(v), -EINVAL, "nwc_quantize_fp8: weight (%llu, %llu) is %s",
                    (unsigned long long)r, (unsigned long long)c, isnan(v) ? "NaN" : "infinite");
      amax = fmaxf(amax, fabsf(v));
    }
    float s = amax > 0 ? amax / 448.0f : 1.0f;
    if (!(s > 0) || !isfinite(s)) s = 1.0f; /* amax below 448 * FLT_MIN underflows */
    scale[r] = s;
    for (uint64_t c = 0; c < K; c++) q[r * K + c] = f32_to_fp8(nwc_bf16_to_f32(row[c]) / s);
  }
  return 0;
}
