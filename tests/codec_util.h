/*
 * codec_util.h - what the codec tests (test_codec_*.c, tests/golden/make_golden.c) share: input
 * generators (BF16 weights with realistic distributions, random bit patterns, fp8 bytes),
 * independent references (fp8 values computed with ldexp, BF16 rounding, an fp64 matvec), and
 * cu_check_tensor(), the full round-trip check of one encoded tensor against its input.
 *
 * Nothing here calls the codec's own conversion helpers (nwc_fp8_to_*, nwc_bf16_to_f32,
 * nwc_f32_to_bf16): the references must not share code with what they check.
 */
#ifndef NWC_CODEC_UTIL_H
#define NWC_CODEC_UTIL_H

#include "nwc.h"
#include "test_util.h"

#include <errno.h>
#include <math.h>

static inline uint64_t cu_k16(uint64_t K) { return (K + 15) / 16 * 16; }

static inline void *cu_malloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "out of memory (%zu bytes)\n", n);
    exit(1);
  }
  return p;
}

/* The errno values the golden invalid cases name (tests/golden/invalid.txt); 0 if unknown. */
static inline int cu_errno_value(const char *name) {
  static const struct {
    const char *name;
    int value;
  } names[] = {{"EBADMSG", EBADMSG}, {"EINVAL", EINVAL}, {"ERANGE", ERANGE}, {"ENOTSUP", ENOTSUP}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(name, names[i].name)) return names[i].value;
  return 0;
}

/* ---- scalar references ---------------------------------------------------------------------- */

static inline float cu_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint32_t cu_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* The value of a BF16 bit pattern. */
static inline float cu_bf16_value(uint16_t h) { return cu_bits_f32((uint32_t)h << 16); }

static inline int cu_bf16_finite(uint16_t h) { return (h & 0x7f80u) != 0x7f80u; }

/* fp32 -> BF16, round to nearest even (finite inputs; NaN becomes a quiet NaN). */
static inline uint16_t cu_bf16_round(float f) {
  uint32_t u = cu_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  uint32_t lo = u & 0xffffu, hi = u >> 16;
  if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u))) hi++;
  return (uint16_t)hi;
}

/* Exact value of an fp8 e4m3fn byte from its fields (NaN for 0x7f and 0xff). */
static inline double cu_fp8_value(uint8_t b) {
  int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
  return (b & 0x80) ? -v : v;
}

/* The BF16 pattern of an fp8 value (every fp8 value is exact in BF16; checked). */
static inline uint16_t cu_fp8_bf16(uint8_t b) {
  uint32_t u = cu_f32_bits((float)cu_fp8_value(b));
  if (u & 0xffffu) {
    fprintf(stderr, "cu_fp8_bf16: fp8 0x%02x is not exact in BF16\n", b);
    exit(1);
  }
  return (uint16_t)(u >> 16);
}

/* Order-preserving integer of a finite BF16 pattern (so that one ulp is a difference of 1). */
static inline int cu_bf16_key(uint16_t h) { return (h & 0x8000u) ? -(int)(h & 0x7fffu) : (int)h; }

/* Standard normal (Box-Muller). */
static inline double cu_normal(void) {
  double u = test_uniform(), v = test_uniform();
  return sqrt(-2.0 * log(1.0 - u)) * cos(6.283185307179586 * v);
}

/* ---- input generators ----------------------------------------------------------------------- */

enum cu_dist {
  CU_NORMAL = 0, /* normal weights with a per-row scale 2^[-12, 2) */
  CU_HEAVY = 1,  /* normal times a log-normal factor: heavy tails, many exponents */
  CU_BITS = 2,   /* uniform 16-bit patterns (NaN, Inf, subnormals included) */
  CU_SPARSE = 3, /* mostly zeros (both signs) and a few normal weights */
  CU_NDIST = 4
};

static const char *const cu_dist_name[CU_NDIST] = {"normal", "heavy", "bits", "sparse"};

static inline void cu_gen_bf16(uint16_t *w, uint64_t M, uint64_t K, int dist) {
  for (uint64_t r = 0; r < M; r++) {
    double s = ldexp(1.0, (int)test_below(14) - 12) * (1.0 + test_uniform());
    for (uint64_t c = 0; c < K; c++) {
      uint16_t *o = &w[r * K + c];
      switch (dist) {
      case CU_NORMAL: *o = cu_bf16_round((float)(s * cu_normal())); break;
      case CU_HEAVY: *o = cu_bf16_round((float)(s * cu_normal() * exp(2.5 * cu_normal()))); break;
      case CU_BITS: *o = (uint16_t)test_rand(); break;
      default:
        *o = test_below(8) ? (uint16_t)(test_below(2) << 15) : cu_bf16_round((float)(s * cu_normal()));
      }
    }
  }
}

/* fp8 bytes: uniform over the 254 non-NaN patterns, or BF16 normals quantized (realistic). */
static inline void cu_gen_fp8(uint8_t *q, uint64_t M, uint64_t K, int realistic) {
  uint64_t n = M * K;
  if (!realistic) {
    for (uint64_t i = 0; i < n; i++) {
      uint8_t b;
      do b = (uint8_t)test_rand();
      while ((b & 0x7f) == 0x7f);
      q[i] = b;
    }
    return;
  }
  uint16_t *w = cu_malloc(n * 2);
  float *scale = cu_malloc(M * sizeof *scale);
  cu_gen_bf16(w, M, K, CU_NORMAL);
  int rc = nwc_quantize_fp8(w, M, K, q, scale);
  if (rc < 0) {
    fprintf(stderr, "cu_gen_fp8: nwc_quantize_fp8 failed: %s\n", nwc_error_detail());
    exit(1);
  }
  free(w);
  free(scale);
}

/* ---- expected decoder output ---------------------------------------------------------------- */

/* What nwc_dequant must return for an M x K input w: M x K16 BF16, the input itself (BF16) or the
 * exact fp8 values, and in the padding columns the filler (rank 0, sign 0, low byte 0). */
static inline uint16_t *cu_expected(const void *w, uint64_t M, uint64_t K, unsigned type,
                                    uint8_t psym0) {
  uint64_t K16 = cu_k16(K);
  uint16_t *e = cu_malloc(M * K16 * 2);
  for (uint64_t r = 0; r < M; r++)
    for (uint64_t c = 0; c < K16; c++) {
      uint16_t v = (uint16_t)(psym0 << 8);
      if (c < K)
        v = type == NWC_ELEM_BF16 ? ((const uint16_t *)w)[r * K + c]
                                  : cu_fp8_bf16(((const uint8_t *)w)[r * K + c]);
      e[r * K16 + c] = v;
    }
  return e;
}

/* Compares n BF16 patterns; reports the first difference.  Returns 1 if equal. */
static inline int cu_same16(const uint16_t *got, const uint16_t *want, uint64_t n, uint64_t K16,
                            const char *what) {
  for (uint64_t i = 0; i < n; i++)
    if (got[i] != want[i]) {
      CHECK(0, "%s: element (%" PRIu64 ", %" PRIu64 ") is 0x%04x, expected 0x%04x", what,
            i / K16, i % K16, got[i], want[i]);
      return 0;
    }
  return 1;
}

/* ---- decoder checks against the expected output --------------------------------------------- */

static inline void cu_check_dequant(const nwc_tensor *t, const uint16_t *expect, const char *what) {
  uint64_t K16 = cu_k16(t->cols);
  uint16_t *out = cu_malloc(t->rows * K16 * 2);
  memset(out, 0xa5, t->rows * K16 * 2);
  CHECK_RC(nwc_dequant(t, out));
  cu_same16(out, expect, t->rows * K16, K16, what);
  free(out);
}

/* Random rows with repeats (always the first and the last), and n = 0. */
static inline void cu_check_gather(const nwc_tensor *t, const uint16_t *expect, const char *what) {
  uint64_t K16 = cu_k16(t->cols), M = t->rows;
  uint64_t n = 2 + test_below(M < 32 ? 2 * M : 64);
  uint64_t *idx = cu_malloc(n * sizeof *idx);
  idx[0] = M - 1;
  idx[1] = 0;
  for (uint64_t i = 2; i < n; i++) idx[i] = test_below(M);
  if (n > 3) idx[n - 1] = idx[2]; /* a repeat */
  uint16_t *out = cu_malloc(n * K16 * 2);
  CHECK_RC(nwc_gather(t, idx, n, out));
  for (uint64_t i = 0; i < n; i++)
    if (!cu_same16(out + i * K16, expect + idx[i] * K16, K16, K16, what)) {
      fprintf(stderr, "  (gather entry %" PRIu64 ": row %" PRIu64 ")\n", i, idx[i]);
      break;
    }
  CHECK(nwc_gather(t, idx, 0, out) == 0, "%s: gather of 0 rows fails", what);
  free(idx);
  free(out);
}

/*
 * nwc_matvec against an fp64 matvec of the expected weights: ||y - ref|| <= 1e-5 ||ref|| plus what
 * fp32 accumulation may lose on rows with cancellation (2e-6 ||mag||, mag_r = sum |scale w x| +
 * |bias|: the codec's 16-term pairwise lane sums and 32-lane block sums stay below 36 eps = 2.1e-6
 * of mag) plus the absolute error of products in the fp32 subnormal range; y_bf16 == RNE(y), and
 * y_bf16 within one BF16 ulp of RNE(ref) on every row whose condition number is small enough for
 * fp32 accumulation to decide that.  Skipped when weights are not finite or could overflow fp32.
 */
static inline void cu_check_matvec(const nwc_tensor *t, const uint16_t *expect, const char *what) {
  uint64_t M = t->rows, K = t->cols, K16 = cu_k16(K);
  for (uint64_t r = 0; r < M; r++)
    for (uint64_t c = 0; c < K; c++)
      if (!cu_bf16_finite(expect[r * K16 + c]) || fabsf(cu_bf16_value(expect[r * K16 + c])) > 1e12f)
        return;
  float *x = cu_malloc(K16 * sizeof *x), *bias = NULL, *y = cu_malloc(M * sizeof *y);
  uint16_t *yb = cu_malloc(M * 2);
  for (uint64_t c = 0; c < K16; c++) x[c] = c < K ? (float)cu_normal() : 0.0f;
  if (test_below(2)) {
    bias = cu_malloc(M * sizeof *bias);
    memset(bias, 0, M * sizeof *bias); /* gcc -O3 warns: malloc(1) for M = 0 is unset */
    for (uint64_t r = 0; r < M; r++) bias[r] = (float)cu_normal();
  }
  CHECK_RC(nwc_matvec(t, x, bias, y, yb));
  double err2 = 0, ref2 = 0, mag2 = 0, smax = 0;
  uint64_t bad_ulp = 0, first_bad = 0;
  for (uint64_t r = 0; r < M; r++) {
    double s = t->scale ? t->scale[r] : 1.0, dot = 0, mag = 0;
    for (uint64_t c = 0; c < K; c++) {
      double p = (double)cu_bf16_value(expect[r * K16 + c]) * x[c];
      dot += p;
      mag += fabs(p);
    }
    double b = bias ? bias[r] : 0.0, ref = s * dot + b;
    smax = fmax(smax, s);
    err2 += (y[r] - ref) * (y[r] - ref);
    ref2 += ref * ref;
    mag2 += (s * mag + fabs(b)) * (s * mag + fabs(b));
    CHECK(yb[r] == cu_bf16_round(y[r]), "%s: row %" PRIu64 ": y_bf16 0x%04x is not RNE(y = %a)",
          what, r, yb[r], (double)y[r]);
    if (fabs(ref) > 0x1p-100 && s * mag + fabs(b) <= 64 * fabs(ref) &&
        abs(cu_bf16_key(yb[r]) - cu_bf16_key(cu_bf16_round((float)ref))) > 1 && !bad_ulp++)
      first_bad = r;
  }
  CHECK(bad_ulp == 0, "%s: %" PRIu64 " rows of y_bf16 more than one ulp off (first: row %" PRIu64 ")",
        what, bad_ulp, first_bad);
  double tiny = 4.0 * (double)K * 0x1p-149 * smax * sqrt((double)M);
  CHECK(sqrt(err2) <= 1e-5 * sqrt(ref2) + 2e-6 * sqrt(mag2) + tiny,
        "%s: matvec relative error %g (%g of the magnitude)", what,
        sqrt(err2 / (ref2 > 0 ? ref2 : 1)), sqrt(err2 / (mag2 > 0 ? mag2 : 1)));
  free(x);
  free(bias);
  free(y);
  free(yb);
}

/* Two tensors hold the same encoding (fields and array contents). */
static inline int cu_same_tensor(const nwc_tensor *a, const nwc_tensor *b) {
  if (a->elem != b->elem || a->rows != b->rows || a->cols != b->cols || a->nblocks != b->nblocks ||
      a->data_bytes != b->data_bytes || a->raw_bytes != b->raw_bytes ||
      memcmp(a->psym, b->psym, 16) || !a->scale != !b->scale)
    return 0;
  return !memcmp(a->bases, b->bases, (a->nblocks + 1) * 8) &&
         !memcmp(a->hdr, b->hdr, a->nblocks * NWC_LANES) &&
         !memcmp(a->data, b->data, a->data_bytes) && !memcmp(a->raw, b->raw, a->raw_bytes) &&
         (!a->scale || !memcmp(a->scale, b->scale, a->rows * sizeof(float)));
}

/* nwc_record_write -> nwc_record_read gives the same tensor, and writing it again the same bytes. */
static inline void cu_check_record(const nwc_tensor *t, const uint16_t *expect, const char *what) {
  uint8_t *buf = NULL, *buf2 = NULL;
  size_t len = 0, len2 = 0;
  nwc_tensor back;
  CHECK_RC(nwc_record_write(t, &buf, &len));
  if (!buf) return;
  int rc = nwc_record_read(buf, len, &back);
  CHECK_RC(rc);
  if (rc == 0) {
    CHECK(cu_same_tensor(t, &back), "%s: record read back differs", what);
    CHECK_RC(nwc_record_write(&back, &buf2, &len2));
    CHECK(buf2 && len2 == len && !memcmp(buf, buf2, len), "%s: record rewritten differs", what);
    if (expect) cu_check_dequant(&back, expect, what);
    free(buf2);
    nwc_tensor_release(&back);
  }
  free(buf);
}

/* nwc_encode with caller arrays (size query, exact cap, cap - 1) agrees with nwc_tensor_encode
 * (any layout); freq and psym receive what nwc_encode reported. */
static inline void cu_check_encode_calls(const void *w, const nwc_tensor *t, const char *what,
                                         uint64_t freq[128], uint8_t psym[16]) {
  uint64_t lay[4], n = t->rows * t->cols;
  CHECK_RC(nwc_layout(t->rows, t->cols, t->elem, lay));
  CHECK(lay[NWC_LAYOUT_BLOCKS] == t->nblocks && lay[NWC_LAYOUT_RAW_BYTES] == t->raw_bytes &&
            lay[NWC_LAYOUT_K16] == cu_k16(t->cols),
        "%s: nwc_layout disagrees with the tensor", what);
  uint64_t nb = t->nblocks;
  uint64_t *bases = cu_malloc((nb + 1) * 8);
  uint8_t *hdr = cu_malloc(nb * NWC_LANES), *raw = cu_malloc(t->raw_bytes);
  int64_t size = nwc_encode(w, n, t->cols, t->elem, freq, psym, bases, hdr, NULL, 0, NULL);
  CHECK(size == (int64_t)t->data_bytes, "%s: size query %lld, tensor has %llu", what,
        (long long)size, (unsigned long long)t->data_bytes);
  CHECK(size <= nwc_encode_bound(t->rows, t->cols, t->elem), "%s: data_bytes above the bound", what);
  if (size > 0) {
    uint8_t *data = cu_malloc((size_t)size);
    CHECK(nwc_encode(w, n, t->cols, t->elem, NULL, psym, bases, hdr, data, (uint64_t)size - 1,
                     raw) == -ENOSPC,
          "%s: cap one byte short is not -ENOSPC", what);
    CHECK(nwc_encode(w, n, t->cols, t->elem, freq, psym, bases, hdr, data, (uint64_t)size, raw) ==
              size,
          "%s: nwc_encode with the exact cap fails", what);
    nwc_tensor v = *t;
    memcpy(v.psym, psym, 16);
    v.bases = bases, v.hdr = hdr, v.data = data, v.raw = raw;
    CHECK(cu_same_tensor(&v, t), "%s: nwc_encode and nwc_tensor_encode differ", what);
    free(data);
  }
  free(bases);
  free(hdr);
  free(raw);
}

/* Layout 0: the encode calls agree (cu_check_encode_calls), the histogram counts the input and
 * psym lists the most frequent symbols first. */
static inline void cu_check_encode_api(const void *w, const nwc_tensor *t, const char *what) {
  uint64_t n = t->rows * t->cols, freq[128];
  unsigned type = NWC_ELEM_TYPE(t->elem);
  uint8_t psym[16];
  cu_check_encode_calls(w, t, what, freq, psym);
  /* Independent histogram, by coded byte (BF16: high byte without sign; fp8: the LUT byte). */
  unsigned nsym = type == NWC_ELEM_BF16 ? 128 : NWC_FP8_SYMBOLS;
  unsigned coded = type == NWC_ELEM_BF16 ? NWC_BF16_CODED_RANKS : NWC_FP8_SYMBOLS;
  uint64_t mine[128] = {0}, total = 0;
  for (uint64_t i = 0; i < n; i++) {
    if (type == NWC_ELEM_BF16) {
      mine[(((const uint16_t *)w)[i] >> 8) & 0x7f]++;
    } else {
      unsigned b = ((const uint8_t *)w)[i], e = (b >> 3) & 15, m = b & 7;
      mine[e ? 60 + (e >> 1) : m >= 4 ? 60 : m ? 59 : 0]++;
    }
  }
  for (unsigned s = 0; s < nsym; s++) total += freq[s];
  CHECK(total == n, "%s: histogram sums to %llu of %llu", what, (unsigned long long)total,
        (unsigned long long)n);
  if (type == NWC_ELEM_BF16)
    CHECK(!memcmp(mine, freq, sizeof mine), "%s: histogram differs from the input's", what);
  for (unsigned r = 0; r + 1 < coded; r++)
    CHECK(mine[psym[r]] >= mine[psym[r + 1]], "%s: psym[%u] = %u rarer than psym[%u] = %u", what,
          r, psym[r], r + 1, psym[r + 1]);
}

/*
 * Encodes w (M x K of element type `type`, layout 0; scale may be NULL) and checks everything
 * against the input: validate, the encode API, dequant bit for bit, gather, matvec, records.
 */
static inline void cu_check_tensor(const void *w, uint64_t M, uint64_t K, unsigned type,
                                   const float *scale, const char *what) {
  nwc_tensor t;
  int rc = nwc_tensor_encode(w, M, K, NWC_ELEM(type, 0), scale, &t);
  CHECK(rc == 0, "%s: nwc_tensor_encode returned %d (%s)", what, rc, nwc_error_detail());
  if (rc) return;
  CHECK(nwc_tensor_validate(&t) == 0, "%s: validate: %s", what, nwc_error_detail());
  uint16_t *expect = cu_expected(w, M, K, type, t.psym[0]);
  cu_check_encode_api(w, &t, what);
  cu_check_dequant(&t, expect, what);
  cu_check_gather(&t, expect, what);
  cu_check_matvec(&t, expect, what);
  cu_check_record(&t, expect, what);
  free(expect);
  nwc_tensor_release(&t);
}

#endif
