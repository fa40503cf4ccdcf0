/*
 * test_codec_shapes.c - the layout-0 codec on the shapes and values issue 2 names, and its errors.
 *
 * Round trips (cu_check_tensor: dequant bit for bit, gather, matvec vs fp64, records): 1x1, 7x13,
 * 8x512, 9x513, 16x11008, 151936x64; all-equal tensors; more than 15 distinct exponents so that
 * every lane escapes; +-0, subnormals, +-Inf; all 65536 BF16 patterns (NaNs included) in three
 * shapes; every non-NaN fp8 byte.  Errors: fp8 NaN input, NaN/Inf into nwc_quantize_fp8, zero or
 * too large shapes, n not a multiple of K, a too small cap, unknown element types, bad indices.
 * nwc_quantize_fp8 is checked against a brute-force search for the nearest fp8 value.
 */
#include "codec_util.h"

#define EXPECT_ERR(expr, err)                                                                    \
  do {                                                                                           \
    long long rc_ = (long long)(expr);                                                           \
    CHECK(rc_ == (err), "%s returned %lld, expected %s", #expr, rc_, #err);                      \
    CHECK(rc_ >= 0 || (*nwc_error_detail() && *nwc_strerror((int)rc_)),                          \
          "%s: no detail or error text", #expr);                                                 \
  } while (0)

static void shuffle16(uint16_t *v, uint64_t n) {
  for (uint64_t i = n; i > 1; i--) {
    uint64_t j = test_below(i);
    uint16_t t = v[i - 1];
    v[i - 1] = v[j];
    v[j] = t;
  }
}

static void check_bf16(const uint16_t *w, uint64_t M, uint64_t K, const char *what) {
  char name[160];
  snprintf(name, sizeof name, "bf16 %s %llux%llu", what, (unsigned long long)M, (unsigned long long)K);
  cu_check_tensor(w, M, K, NWC_ELEM_BF16, NULL, name);
}

static void check_fp8(const uint8_t *q, uint64_t M, uint64_t K, const char *what) {
  char name[160];
  snprintf(name, sizeof name, "fp8 %s %llux%llu", what, (unsigned long long)M, (unsigned long long)K);
  cu_check_tensor(q, M, K, NWC_ELEM_FP8, NULL, name);
}

static void named_shapes(void) {
  static const uint64_t shapes[][2] = {{1, 1}, {7, 13}, {8, 512}, {9, 513}, {16, 11008}, {151936, 64}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    uint64_t M = shapes[i][0], K = shapes[i][1];
    uint16_t *w = cu_malloc(M * K * 2);
    cu_gen_bf16(w, M, K, CU_NORMAL);
    check_bf16(w, M, K, "normal");
    free(w);
    if (M * K > 1000000) continue; /* keeps the sanitizer build fast */
    uint8_t *q = cu_malloc(M * K);
    cu_gen_fp8(q, M, K, 1);
    check_fp8(q, M, K, "quantized");
    free(q);
  }
}

/* nwc_dequant_range of the last row blocks equals the matching rows of a full dequant. */
static void dequant_range(void) {
  uint64_t M = 21, K = 600, K16 = cu_k16(K);
  uint16_t *w = cu_malloc(M * K * 2);
  cu_gen_bf16(w, M, K, CU_HEAVY);
  nwc_tensor t;
  CHECK_RC(nwc_tensor_encode(w, M, K, NWC_ELEM(NWC_ELEM_BF16, 0), NULL, &t));
  uint16_t *e = cu_expected(w, M, K, NWC_ELEM_BF16, t.psym[0]);
  uint16_t *out = cu_malloc((M - 8) * K16 * 2);
  CHECK_RC(nwc_dequant_range(&t, 1, 3, out));
  cu_same16(out, e + 8 * K16, (M - 8) * K16, K16, "dequant_range 1..3");
  EXPECT_ERR(nwc_dequant_range(&t, 2, 4, out), -EINVAL);
  EXPECT_ERR(nwc_dequant_range(&t, 2, 1, out), -EINVAL);
  free(out);
  free(e);
  free(w);
  nwc_tensor_release(&t);
}

static void all_equal(void) {
  static const uint16_t vals[] = {0x0000, 0x8000, 0x3f80, 0xbf80, 0x0001, 0x7f80, 0xff80, 0x7fc1, 0xffff};
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
    uint64_t M = i % 2 ? 8 : 13, K = i % 2 ? 512 : 37;
    uint16_t *w = cu_malloc(M * K * 2);
    for (uint64_t j = 0; j < M * K; j++) w[j] = vals[i];
    char what[40];
    snprintf(what, sizeof what, "all 0x%04x", vals[i]);
    check_bf16(w, M, K, what);
    free(w);
  }
  static const uint8_t qv[] = {0x00, 0x80, 0x7e, 0xfe, 0x01, 0x38};
  for (size_t i = 0; i < sizeof qv / sizeof qv[0]; i++) {
    uint8_t q[9 * 29];
    memset(q, qv[i], sizeof q);
    char what[40];
    snprintf(what, sizeof what, "all 0x%02x", qv[i]);
    check_fp8(q, 9, 29, what);
  }
}

/* 40 exponents used equally often and spread so that every lane of every row sees all of them:
 * ranks 15..39 are escapes in every lane stream. */
static void escapes(void) {
  static const uint64_t shapes[][2] = {{8, 512}, {17, 1030}};
  for (size_t i = 0; i < 2; i++) {
    uint64_t M = shapes[i][0], K = shapes[i][1];
    uint16_t *w = cu_malloc(M * K * 2);
    for (uint64_t r = 0; r < M; r++)
      for (uint64_t c = 0; c < K; c++) {
        unsigned e = 100 + (unsigned)((c + 3 * r) % 40);
        w[r * K + c] = (uint16_t)((test_below(2) << 15) | (e << 7) | test_below(128));
      }
    nwc_tensor t;
    CHECK_RC(nwc_tensor_encode(w, M, K, NWC_ELEM(NWC_ELEM_BF16, 0), NULL, &t));
    /* 25 of the 40 exponents escape (24 bits), so every full lane stream holds > 50 words. */
    unsigned short_lanes = 0;
    uint64_t col_blocks = (K + 511) / 512;
    for (uint64_t rb = 0; rb < M / 8; rb++) /* full row blocks, first (full) column block */
      for (unsigned l = 0; l < NWC_LANES; l++)
        if (t.hdr[rb * col_blocks * NWC_LANES + l] < 50) short_lanes++;
    CHECK(short_lanes == 0, "escapes: %u full lanes without escapes", short_lanes);
    nwc_tensor_release(&t);
    check_bf16(w, M, K, "40 exponents");
    free(w);
  }
}

/* +-0, subnormals, +-Inf between normal weights. */
static void special_values(void) {
  uint64_t M = 19, K = 700;
  uint16_t *w = cu_malloc(M * K * 2);
  cu_gen_bf16(w, M, K, CU_NORMAL);
  for (uint64_t i = 0; i < M * K; i++) {
    switch (test_below(6)) {
    case 0: w[i] = (uint16_t)(test_below(2) << 15); break;
    case 1: w[i] = (uint16_t)((test_below(2) << 15) | (1 + test_below(127))); break;
    case 2: w[i] = test_below(2) ? 0x7f80 : 0xff80; break;
    default: break;
    }
  }
  check_bf16(w, M, K, "zeros/subnormals/inf");
  free(w);
}

static void every_pattern(void) {
  uint16_t *w = cu_malloc(65536 * 2);
  for (uint32_t i = 0; i < 65536; i++) w[i] = (uint16_t)i;
  check_bf16(w, 256, 256, "all patterns in order");
  shuffle16(w, 65536);
  check_bf16(w, 1, 65536, "all patterns shuffled");
  shuffle16(w, 65536);
  check_bf16(w, 65536, 1, "all patterns shuffled");
  free(w);

  uint8_t q[254];
  unsigned n = 0;
  for (unsigned b = 0; b < 256; b++)
    if ((b & 0x7f) != 0x7f) q[n++] = (uint8_t)b;
  check_fp8(q, 1, n, "every non-NaN byte");
  for (unsigned i = n; i > 1; i--) {
    unsigned j = (unsigned)test_below(i);
    uint8_t t = q[i - 1];
    q[i - 1] = q[j];
    q[j] = t;
  }
  check_fp8(q, 2, n / 2, "every non-NaN byte shuffled");
  check_fp8(q, n, 1, "every non-NaN byte shuffled");
}

static void fp8_nan(void) {
  static const uint8_t nans[] = {0x7f, 0xff};
  uint64_t M = 5, K = 40, lay[4];
  uint8_t q[5 * 40];
  CHECK_RC(nwc_layout(M, K, NWC_ELEM(NWC_ELEM_FP8, 0), lay));
  uint64_t *bases = cu_malloc((lay[0] + 1) * 8);
  uint8_t hdr[64 * NWC_LANES], psym[16], data[1 << 15], raw[5 * 24];
  for (int i = 0; i < 2; i++) {
    cu_gen_fp8(q, M, K, 1);
    q[test_below(M * K)] = nans[i];
    nwc_tensor t;
    EXPECT_ERR(nwc_tensor_encode(q, M, K, NWC_ELEM(NWC_ELEM_FP8, 0), NULL, &t), -EINVAL);
    EXPECT_ERR(nwc_encode(q, M * K, K, NWC_ELEM(NWC_ELEM_FP8, 0), NULL, psym, bases, hdr, NULL, 0, NULL),
               -EINVAL);
    EXPECT_ERR(nwc_encode(q, M * K, K, NWC_ELEM(NWC_ELEM_FP8, 0), NULL, psym, bases, hdr, data,
                          sizeof data, raw),
               -EINVAL);
  }
  free(bases);
}

/* ---- nwc_quantize_fp8 against brute force ---------------------------------------------------- */

/* The fp8 byte nearest to v (finite, fp32): searched over all finite bytes of v's sign, ties to
 * the even mantissa; magnitudes above 448 saturate to 448 (nearest finite). */
static uint8_t nearest_fp8(float v) {
  uint8_t sign = signbit(v) ? 0x80 : 0, best = sign;
  double a = fabs((double)v), bd = INFINITY;
  for (unsigned m = 0; m < 128; m++) {
    if (m == 0x7f) continue;
    double d = fabs(cu_fp8_value((uint8_t)m) - a);
    if (d < bd || (d == bd && !(m & 1))) {
      bd = d;
      best = (uint8_t)(sign | m);
    }
  }
  return best;
}

/* One random row of a quantization test: normals, normals with tiny scales (fp8 subnormals after
 * scaling), exact midpoints between fp8 values next to 448 (scale 1), or zeros of both signs. */
static void quant_row(uint16_t *row, uint64_t K, int kind) {
  double s = ldexp(1.0, (int)test_below(40) - 30);
  for (uint64_t c = 0; c < K; c++) {
    switch (kind) {
    case 0: row[c] = cu_bf16_round((float)(s * cu_normal())); break;
    case 1: row[c] = cu_bf16_round((float)(s * cu_normal() * exp(3 * cu_normal()))); break;
    case 2: {
      unsigned m = (unsigned)test_below(0x7d); /* midpoint of fp8 magnitudes m and m + 1 */
      double mid = (cu_fp8_value((uint8_t)m) + cu_fp8_value((uint8_t)(m + 1))) / 2;
      row[c] = cu_bf16_round((float)(test_below(2) ? -mid : mid));
      break;
    }
    default: row[c] = (uint16_t)(test_below(2) << 15);
    }
  }
  if (kind == 2) row[test_below(K)] = test_below(2) ? 0x43e0 : 0xc3e0; /* +-448: scale 1 */
}

static void quantize(void) {
  uint64_t M = 64, K = 300;
  uint16_t *w = cu_malloc(M * K * 2);
  uint8_t *q = cu_malloc(M * K);
  float *scale = cu_malloc(M * sizeof *scale);
  for (uint64_t r = 0; r < M; r++) quant_row(w + r * K, K, (int)(r % 4));
  CHECK_RC(nwc_quantize_fp8(w, M, K, q, scale));
  uint64_t bad = 0;
  for (uint64_t r = 0; r < M; r++) {
    float amax = 0;
    for (uint64_t c = 0; c < K; c++) amax = fmaxf(amax, fabsf(cu_bf16_value(w[r * K + c])));
    float s = amax > 0 ? amax / 448.0f : 1.0f;
    CHECK(scale[r] == s, "quantize row %llu: scale %a, expected %a", (unsigned long long)r,
          (double)scale[r], (double)s);
    for (uint64_t c = 0; c < K; c++) {
      uint8_t want = nearest_fp8(cu_bf16_value(w[r * K + c]) / s);
      if (q[r * K + c] != want && bad++ < 5)
        CHECK(0, "quantize (%llu, %llu): 0x%04x / %a -> 0x%02x, nearest is 0x%02x",
              (unsigned long long)r, (unsigned long long)c, w[r * K + c], (double)s, q[r * K + c],
              want);
    }
  }
  /* Quantized output round-trips through the fp8 codec with its scales. */
  cu_check_tensor(q, M, K, NWC_ELEM_FP8, scale, "fp8 quantize_fp8 output");
  /* NaN and Inf anywhere are rejected. */
  static const uint16_t bad_vals[] = {0x7fc0, 0xffc1, 0x7f81, 0x7f80, 0xff80};
  for (size_t i = 0; i < sizeof bad_vals / sizeof bad_vals[0]; i++) {
    uint64_t at = test_below(M * K);
    uint16_t keep = w[at];
    w[at] = bad_vals[i];
    EXPECT_ERR(nwc_quantize_fp8(w, M, K, q, scale), -EINVAL);
    w[at] = keep;
  }
  EXPECT_ERR(nwc_quantize_fp8(w, 0, K, q, scale), -EINVAL);
  EXPECT_ERR(nwc_quantize_fp8(w, M, 0, q, scale), -EINVAL);
  EXPECT_ERR(nwc_quantize_fp8(NULL, M, K, q, scale), -EINVAL);
  free(w);
  free(q);
  free(scale);
}

/* ---- bad arguments ---------------------------------------------------------------------------- */

static void bad_arguments(void) {
  const unsigned bf16 = NWC_ELEM(NWC_ELEM_BF16, 0), fp8 = NWC_ELEM(NWC_ELEM_FP8, 0);
  uint64_t lay[4];
  EXPECT_ERR(nwc_layout(0, 5, bf16, lay), -EINVAL);
  EXPECT_ERR(nwc_layout(5, 0, fp8, lay), -EINVAL);
  EXPECT_ERR(nwc_layout(UINT64_C(1) << 21, UINT64_C(1) << 20, bf16, lay), -EINVAL);
  EXPECT_ERR(nwc_layout(5, 5, NWC_ELEM(7, 0), lay), -EINVAL);
  CHECK(nwc_layout(5, 5, NWC_ELEM(NWC_ELEM_BF16, 15), lay) < 0, "layout 15 accepted");
  EXPECT_ERR(nwc_encode_bound(0, 1, bf16), -EINVAL);
  EXPECT_ERR(nwc_info(99), -EINVAL);
  CHECK(nwc_info(NWC_INFO_VERSION) == NWC_FORMAT_VERSION && nwc_info(NWC_INFO_TABLE_WORDS) == 4096 &&
            nwc_info(NWC_INFO_HEADER_BYTES) == 32 && nwc_info(NWC_INFO_BLOCK_WEIGHTS) == 4096,
        "nwc_info disagrees with nwc.h");

  uint16_t w[9 * 20];
  cu_gen_bf16(w, 9, 20, CU_NORMAL);
  uint64_t bases[3];
  uint8_t hdr[2 * NWC_LANES], psym[16], data[1 << 14], raw[9 * 32];
  EXPECT_ERR(nwc_encode(w, 0, 20, bf16, NULL, psym, bases, hdr, NULL, 0, NULL), -EINVAL);
  EXPECT_ERR(nwc_encode(w, 180, 0, bf16, NULL, psym, bases, hdr, NULL, 0, NULL), -EINVAL);
  EXPECT_ERR(nwc_encode(w, 179, 20, bf16, NULL, psym, bases, hdr, NULL, 0, NULL), -EINVAL);
  EXPECT_ERR(nwc_encode(NULL, 180, 20, bf16, NULL, psym, bases, hdr, NULL, 0, NULL), -EINVAL);
  EXPECT_ERR(nwc_encode(w, 180, 20, NWC_ELEM(3, 0), NULL, psym, bases, hdr, NULL, 0, NULL), -EINVAL);
  EXPECT_ERR(nwc_encode(w, 180, 20, bf16, NULL, NULL, bases, hdr, NULL, 0, NULL), -EINVAL);
  int64_t need = nwc_encode(w, 180, 20, bf16, NULL, psym, bases, hdr, NULL, 0, NULL);
  CHECK(need > 0 && need <= (int64_t)sizeof data, "size query %lld", (long long)need);
  EXPECT_ERR(nwc_encode(w, 180, 20, bf16, NULL, psym, bases, hdr, data, 0, raw), -ENOSPC);
  EXPECT_ERR(nwc_encode(w, 180, 20, bf16, NULL, psym, bases, hdr, data, (uint64_t)need / 2, raw),
             -ENOSPC);

  nwc_tensor t;
  EXPECT_ERR(nwc_tensor_encode(w, 0, 20, bf16, NULL, &t), -EINVAL);
  EXPECT_ERR(nwc_tensor_encode(w, 9, 0, bf16, NULL, &t), -EINVAL);
  EXPECT_ERR(nwc_tensor_encode(w, 9, 20, NWC_ELEM(9, 0), NULL, &t), -EINVAL);
  EXPECT_ERR(nwc_tensor_encode(NULL, 9, 20, bf16, NULL, &t), -EINVAL);
  uint32_t tab[4096];
  EXPECT_ERR(nwc_build_tab(psym, NWC_ELEM(2, 0), tab), -EINVAL);

  CHECK_RC(nwc_tensor_encode(w, 9, 20, bf16, NULL, &t));
  uint16_t out[9 * 32];
  uint64_t idx[2] = {3, 9};
  float x[32] = {0};
  EXPECT_ERR(nwc_gather(&t, idx, 2, out), -EINVAL);
  idx[1] = UINT64_MAX;
  EXPECT_ERR(nwc_gather(&t, idx, 2, out), -EINVAL);
  EXPECT_ERR(nwc_gather(&t, NULL, 2, out), -EINVAL);
  EXPECT_ERR(nwc_matvec(&t, NULL, NULL, NULL, NULL), -EINVAL);
  EXPECT_ERR(nwc_dequant(&t, NULL), -EINVAL);
  CHECK(nwc_dequant(NULL, out) < 0, "nwc_dequant(NULL) accepted");
  CHECK(nwc_matvec(NULL, x, NULL, NULL, NULL) < 0, "nwc_matvec(NULL) accepted");
  CHECK(nwc_tensor_validate(NULL) < 0, "nwc_tensor_validate(NULL) accepted");
  nwc_tensor_release(&t);
  CHECK(nwc_record_read(NULL, 0, &t) < 0, "nwc_record_read(NULL) accepted");
  uint8_t *buf = NULL;
  size_t len;
  CHECK(nwc_record_write(&t, &buf, &len) < 0 && !buf, "nwc_record_write of an empty tensor accepted");
  nwc_tensor_release(&t);
  nwc_tensor_release(NULL);
}

int main(void) {
  test_seed("test_codec_shapes");
  named_shapes();
  dequant_range();
  all_equal();
  escapes();
  special_values();
  every_pattern();
  fp8_nan();
  quantize();
  bad_arguments();
  return test_exit("test_codec_shapes");
}
