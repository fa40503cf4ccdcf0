/*
 * layout_util.h - what the layout-1/2 tests (test_layout_*.c) share on top of codec_util.h: the
 * expected dequant output of a layout-1/2 tensor, the encode-API check for layout 2, the batched
 * matvec check against an fp64 reference, and the loop over the CPU implementation levels
 * (NWC_CPU=portable|ssse3|avx2|avx512, as far as the machine has them).
 */
#ifndef NWC_LAYOUT_UTIL_H
#define NWC_LAYOUT_UTIL_H

#include "codec_util.h"
#include "decode_internal.h" /* nwc__cpu_level: which levels this machine can run */

static const char *const lu_level_env[4] = {"portable", "ssse3", "avx2", "avx512"};

/* The levels this machine supports (0 .. n - 1). */
static inline int lu_levels(void) {
  unsetenv("NWC_CPU");
  return nwc__cpu_level() + 1;
}

static inline void lu_set_level(int level) { setenv("NWC_CPU", lu_level_env[level], 1); }

/* The filler of a layout-1/2 tensor as dequant shows it (rank 0, sign 0, raw fields 0). */
static inline uint16_t lu_filler(const nwc_tensor *t) {
  unsigned layout = NWC_ELEM_LAYOUT(t->elem);
  return (uint16_t)(t->psym[0] << 8 | (layout == 2 ? t->psym[8] : 0));
}

static inline uint16_t *lu_expected(const void *w, const nwc_tensor *t) {
  unsigned type = NWC_ELEM_TYPE(t->elem);
  uint64_t M = t->rows, K = t->cols, K16 = cu_k16(K);
  uint16_t *e = cu_expected(w, M, K, type, 0);
  for (uint64_t r = 0; r < M; r++)
    for (uint64_t c = K; c < K16; c++) e[r * K16 + c] = lu_filler(t);
  return e;
}

/* Layout 2: nwc_encode agrees with nwc_tensor_encode, the histogram counts the input, and the lut
 * holds the seven most frequent symbols in order. */
static inline void lu_check_encode_api_l2(const void *w, const nwc_tensor *t, const char *what) {
  uint64_t n = t->rows * t->cols, freq[128];
  unsigned type = NWC_ELEM_TYPE(t->elem);
  uint8_t psym[16];
  cu_check_encode_calls(w, t, what, freq, psym);
  /* independent histogram by BF16 exponent field (fp8: of the exact value) */
  uint64_t mine[256] = {0};
  for (uint64_t i = 0; i < n; i++) {
    uint16_t h = type == NWC_ELEM_BF16 ? ((const uint16_t *)w)[i]
                                       : cu_fp8_bf16(((const uint8_t *)w)[i]);
    mine[type == NWC_ELEM_BF16 ? (h >> 8) & 0x7f : (h >> 7) & 0xff]++;
  }
  uint64_t total = 0;
  for (unsigned s = 0; s < (type == NWC_ELEM_BF16 ? 128u : 19u); s++) total += freq[s];
  CHECK(total == n, "%s: histogram sums to %llu of %llu", what, (unsigned long long)total,
        (unsigned long long)n);
  uint64_t prev = UINT64_MAX;
  for (unsigned r = 0; r < 7; r++) {
    unsigned s = type == NWC_ELEM_BF16 ? t->psym[r] : (unsigned)t->psym[r] << 1 | t->psym[8 + r] >> 7;
    CHECK(mine[s] <= prev, "%s: rank %u (symbol %u) more frequent than rank %u", what, r, s, r - 1);
    prev = mine[s];
  }
  uint64_t seventh = prev; /* nothing outside the lut is more frequent than rank 6 */
  for (unsigned s = 0; s < 256; s++) {
    int in = 0;
    for (unsigned r = 0; r < 7; r++)
      in |= s == (type == NWC_ELEM_BF16 ? t->psym[r]
                                        : ((unsigned)t->psym[r] << 1 | t->psym[8 + r] >> 7));
    CHECK(in || mine[s] <= seventh, "%s: symbol %u (%llu times) missing from the lut", what, s,
          (unsigned long long)mine[s]);
  }
}

/*
 * nwc_matvec_batch with ncols columns (ldx > K with NaN in the padding, which must not be read;
 * ldy > M), or nwc_matvec for ncols = 0 (x of K16, zero padded), against an fp64 reference on
 * the expected weights, column by column: the error norm <= 1e-5 of the norm of the rows'
 * magnitudes (scale * sum |w x| + |bias|, so that cancellation does not count), Y_bf16 == RNE(Y).
 * Finite weights only.
 */
static inline void lu_check_batch(const nwc_tensor *t, const uint16_t *expect, unsigned ncols,
                                  const char *what) {
  uint64_t M = t->rows, K = t->cols, K16 = cu_k16(K);
  for (uint64_t i = 0; i < M * K16; i++)
    if (!cu_bf16_finite(expect[i]) || fabsf(cu_bf16_value(expect[i])) > 1e12f) return;
  int single = ncols == 0;
  if (single) ncols = 1;
  size_t ldx = single ? K16 : (size_t)K + test_below(9), ldy = single ? M : (size_t)M + test_below(5);
  float *X = cu_malloc(ldx * ncols * sizeof *X), *Y = cu_malloc(ldy * ncols * sizeof *Y);
  float *bias = NULL;
  uint16_t *Yb = cu_malloc(ldy * ncols * 2);
  for (size_t i = 0; i < ldx * ncols; i++) X[i] = i % ldx < K ? (float)cu_normal() : single ? 0 : NAN;
  if (test_below(2)) {
    bias = cu_malloc(M * sizeof *bias);
    for (uint64_t r = 0; r < M; r++) bias[r] = (float)cu_normal();
  }
  if (single)
    CHECK_RC(nwc_matvec(t, X, bias, Y, Yb));
  else
    CHECK_RC(nwc_matvec_batch(t, X, ncols, ldx, bias, Y, ldy, Yb));
  for (unsigned c = 0; c < ncols; c++) {
    double err2 = 0, ref2 = 0, smax = 0;
    for (uint64_t r = 0; r < M; r++) {
      double s = t->scale ? t->scale[r] : 1.0, dot = 0, mag = 0;
      for (uint64_t k = 0; k < K; k++) {
        double p = (double)cu_bf16_value(expect[r * K16 + k]) * X[c * ldx + k];
        dot += p;
        mag += fabs(p);
      }
      double ref = s * dot + (bias ? bias[r] : 0.0), y = Y[c * ldy + r];
      smax = fmax(smax, s);
      err2 += (y - ref) * (y - ref);
      ref2 += (s * mag + (bias ? fabs(bias[r]) : 0.0)) * (s * mag + (bias ? fabs(bias[r]) : 0.0));
      if (Yb[c * ldy + r] != cu_bf16_round((float)y)) {
        CHECK(0, "%s: column %u row %llu: Y_bf16 is not RNE(Y)", what, c, (unsigned long long)r);
        break;
      }
    }
    double tiny = 4.0 * (double)K * 0x1p-149 * smax * sqrt((double)M);
    CHECK(sqrt(err2) <= 1e-5 * sqrt(ref2) + tiny, "%s: %s of %u, column %u: relative error %g",
          what, single ? "nwc_matvec" : "batch", ncols, c, sqrt(err2 / (ref2 > 0 ? ref2 : 1)));
  }
  free(X);
  free(Y);
  free(Yb);
  free(bias);
}

/* dequant_range over a random run of row blocks equals the expected rows. */
static inline void lu_check_range(const nwc_tensor *t, const uint16_t *expect, const char *what) {
  uint64_t br = NWC_LAYOUT_BLOCK_ROWS(t->elem), nrb = (t->rows + br - 1) / br, K16 = cu_k16(t->cols);
  uint64_t a = test_below(nrb), b = a + 1 + test_below(nrb - a);
  uint64_t r0 = a * br, r1 = b * br < t->rows ? b * br : t->rows;
  uint16_t *out = cu_malloc((r1 - r0) * K16 * 2);
  CHECK_RC(nwc_dequant_range(t, a, b, out));
  cu_same16(out, expect + r0 * K16, (r1 - r0) * K16, K16, what);
  CHECK(nwc_dequant_range(t, a, nrb + 1, out) == -EINVAL, "%s: range past the end accepted", what);
  free(out);
}

/* Everything about one layout-1/2 tensor: encode, validate, the encode API, dequant (all and a
 * range), gather, matvec, batches of 1..8, records. */
static inline void lu_check_tensor(const void *w, uint64_t M, uint64_t K, unsigned type,
                                   unsigned layout, const float *scale, int batches,
                                   const char *what) {
  nwc_tensor t;
  int rc = nwc_tensor_encode(w, M, K, NWC_ELEM(type, layout), scale, &t);
  CHECK(rc == 0, "%s: nwc_tensor_encode returned %d (%s)", what, rc, nwc_error_detail());
  if (rc) return;
  CHECK(nwc_tensor_validate(&t) == 0, "%s: validate: %s", what, nwc_error_detail());
  uint16_t *expect = lu_expected(w, &t);
  if (layout == 1)
    cu_check_encode_api(w, &t, what);
  else
    lu_check_encode_api_l2(w, &t, what);
  cu_check_dequant(&t, expect, what);
  lu_check_range(&t, expect, what);
  cu_check_gather(&t, expect, what);
  lu_check_batch(&t, expect, 0, what); /* nwc_matvec */
  for (int k = 0; k < batches; k++) lu_check_batch(&t, expect, 1 + (unsigned)test_below(8), what);
  cu_check_record(&t, expect, what);
  free(expect);
  nwc_tensor_release(&t);
}

#endif
