/*
 * test_gpu_kernels.c - the CUDA kernels of kernels/ against the CPU reference decoder and an fp64
 * matvec, on fresh random tensors each run (seed printed; NWC_SEED replays) and on the sample
 * model (NWC_SAMPLE).  Skips (77) where no GPU is present.
 *
 * Per tensor (BF16 and fp8): dequant and gather bit-exact against nwc_dequant / nwc_gather, and
 * row ranges of dequant (nwc_k_dequant_rows: the first group, a random range, one to the end)
 * against the same rows of nwc_dequant with nothing written past them;
 * matvec (fp32 y) with ||y - ref|| / ||ref|| <= 1e-5 against fp64 on the original weights (or,
 * where y cancels to below fp32 summation noise, ||y - ref|| <= 2^-20 ||sum |w x|||); linear
 * (BF16 y) within one BF16 ulp of the fp64 reference rounded, except where the reference lies
 * inside fp32 summation noise (|y - ref| <= 2^-20 * sum |scale w x|: cancellation leaves fewer
 * significant bits than BF16 has); nwc_k_ref_fp8 likewise.  Every output is poisoned before the
 * run, so a missing write shows as a mismatch; all tensors share one scratch, zeroed once, as in a
 * daemon or a GPU map, so a call that leaves it unfit for the next (a part word left written)
 * shows as a wrong sum there, and at the end the whole scratch must be zero again.  Shapes: 1x1,
 * 7x13, 8x512, 9x513, 17x1040, 16x11008, 151936x64, 65536x320 and a few others; weight kinds: normal with log-normal row scales and heavy tails,
 * all-equal, and (BF16) an escaped weight on every lane of layouts 0 and 1 (in layout 2 most
 * weights are exceptions then), and a layout-2 tensor with lanes of 255 exceptions.  BF16 and fp8
 * run in layouts 0, 1 and 2; matvec multiplies 1..3 columns at once in layout 0 and 1..8 in
 * layouts 1 and 2.  NWC_TEST_QUICK=1 keeps only the
 * shapes below a million weights and leaves out the sample (for runs under compute-sanitizer).
 * (tests/test_l1_decode.c runs layout 1's GPU decode on the CPU, where no GPU is.)
 */
#include "kernel_weights.h"
#include "nwc.h"
#include "nwc_kernels.h"
#include "safetensors.h"
#include "test_util.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <math.h>

#define NAME "test_gpu_kernels"

#define CU(expr)                                                                                 \
  do {                                                                                           \
    cudaError_t e_ = (expr);                                                                     \
    CHECK(e_ == cudaSuccess, "%s: %s", #expr, cudaGetErrorString(e_));                           \
  } while (0)

static cudaStream_t stream;

/* The weights as doubles: BF16 values, or fp8 values times their row scale. */
static double *weights_f64(const void *w, uint64_t M, uint64_t K, unsigned type, const float *scale) {
  double *d = malloc(M * K * sizeof *d);
  for (uint64_t r = 0; r < M; r++)
    for (uint64_t c = 0; c < K; c++) {
      uint64_t i = r * K + c;
      double v = type == NWC_ELEM_BF16 ? nwc_bf16_to_f32(((const uint16_t *)w)[i])
                                       : nwc_fp8_to_f32(((const uint8_t *)w)[i]);
      d[i] = v * (scale ? scale[r] : 1.0f);
    }
  return d;
}

static int bf16_key(uint16_t u) { return u & 0x8000 ? -(int)(u & 0x7fff) : (int)u; }

/* Checks a BF16 output against the fp64 reference; returns the number of bad rows. */
static uint64_t check_bf16(const uint16_t *y, const double *ref, const double *mag, uint64_t M) {
  uint64_t bad = 0;
  for (uint64_t r = 0; r < M; r++) {
    uint16_t want = nwc_f32_to_bf16((float)ref[r]);
    double got = nwc_bf16_to_f32(y[r]);
    int ulps = abs(bf16_key(y[r]) - bf16_key(want));
    if (ulps > 1 && !(fabs(got - ref[r]) <= 0x1p-20 * mag[r] + fabs(ref[r] - nwc_bf16_to_f32(want)))) {
      if (bad++ < 5)
        fprintf(stderr, "  row %llu: got 0x%04x (%g), want 0x%04x (%.9g), %d ulps\n",
                (unsigned long long)r, y[r], got, want, ref[r], ulps);
    }
  }
  return bad;
}

static void *dalloc(size_t bytes) {
  void *p = NULL;
  CU(cudaMalloc(&p, bytes ? bytes : 1));
  return p;
}

/* One scratch for every tensor of the run, as a daemon or a GPU map shares one among its tensors:
 * 64 MiB (more than any tensor here needs) zeroed once, then only the calls touch it, so that a
 * call that leaves it unfit for another tensor's (a part word left written) shows as a wrong sum
 * there; check_scratch_zero checks what every call must leave: all of it zero. */
static void *scratch_p;
static const size_t scratch_have = (size_t)64 << 20;
static void *shared_scratch(size_t bytes) {
  CHECK(bytes <= scratch_have, "a tensor needs %zu bytes of scratch, more than the test's %zu", bytes, scratch_have);
  if (!scratch_p) {
    scratch_p = dalloc(scratch_have);
    CU(cudaMemsetAsync(scratch_p, 0, scratch_have, stream));
  }
  return scratch_p;
}
static void check_scratch_zero(void) {
  if (!scratch_p) return;
  uint32_t *h = malloc(scratch_have);
  CHECK(h != NULL, "out of memory");
  if (!h) return;
  CU(cudaMemcpyAsync(h, scratch_p, scratch_have, cudaMemcpyDeviceToHost, stream));
  CU(cudaStreamSynchronize(stream));
  size_t dirty = 0, first = 0;
  for (size_t i = 0; i < scratch_have / 4; i++)
    if (h[i] && !dirty++) first = i;
  CHECK(dirty == 0, "scratch after every call: %zu words not zero (the first at word %zu: %08x)", dirty, first,
        dirty ? h[first] : 0);
  free(h);
}

/* Runs every kernel on one tensor; w: original weights (BF16 or fp8 bytes), scale may be NULL. */
/*
 * nwc_k_dequant_rows against want (the CPU's whole dequant, rows of K16) for the first row group,
 * a random aligned range inside and a range reaching the last row, each into poisoned d_out
 * (room for M rows).
 */
static void check_dequant_rows(const char *label, const nwc_k_tensor *d, const uint16_t *want,
                               uint64_t M, uint64_t K16, uint16_t *d_out) {
  const uint64_t A = NWC_K_ROW_ALIGN, groups = (M + A - 1) / A;
  const uint64_t g0 = test_below(groups), g1 = g0 + 1 + test_below(groups - g0);
  const uint64_t last = test_below(groups) * A;
  const uint64_t range[3][2] = {{0, M < A ? M : A},
                                {g0 * A, (g1 * A < M ? g1 * A : M) - g0 * A},
                                {last, M - last}};
  uint16_t *got = malloc(M * K16 * 2);
  for (int k = 0; k < 3; k++) {
    const uint64_t r0 = range[k][0], nr = range[k][1];
    CU(cudaMemsetAsync(d_out, 0xff, M * K16 * 2, stream));
    int rc = nwc_k_dequant_rows(d, r0, nr, d_out, stream);
    CHECK(rc == 0, "%s: dequant_rows(%llu, %llu): %d", label, (unsigned long long)r0,
          (unsigned long long)nr, rc);
    CU(cudaMemcpyAsync(got, d_out, M * K16 * 2, cudaMemcpyDeviceToHost, stream));
    CU(cudaStreamSynchronize(stream));
    uint64_t diff = 0, first = 0;
    for (uint64_t i = 0; i < nr * K16; i++)
      if (got[i] != want[r0 * K16 + i] && !diff++) first = i;
    for (uint64_t i = nr * K16; i < M * K16; i++) /* nothing past the range */
      if (got[i] != 0xffff && !diff++) first = i;
    CHECK(diff == 0, "%s: dequant_rows(%llu, %llu): %llu values differ, first at %llu", label,
          (unsigned long long)r0, (unsigned long long)nr, (unsigned long long)diff,
          (unsigned long long)first);
  }
  free(got);
}

/* ref, mag [maxcols][M]: bias + W x in fp64 and the sum of the terms' magnitudes, for maxcols columns
 * of x, K16 apart. */
static void reference(const double *wd, uint64_t M, uint64_t K, uint64_t K16, const float *x, const float *bias,
                      unsigned maxcols, double *ref, double *mag) {
  for (uint64_t i = 0; i < maxcols; i++)
    for (uint64_t r = 0; r < M; r++) {
      double s = bias[r], a = fabs(bias[r]);
      for (uint64_t c = 0; c < K; c++)
        s += wd[r * K + c] * x[i * K16 + c], a += fabs(wd[r * K + c] * x[i * K16 + c]);
      ref[i * M + r] = s;
      mag[i * M + r] = a;
    }
}

/* The matvec of 1..maxcols columns of d_x (fp32, or bf16x: BF16, K16 apart) against ref (mag: the
 * terms' magnitudes); the largest relative error into *rel. */
static void check_matvec_cols(const char *label, const nwc_k_tensor *d, int bf16x, const void *d_x,
                              const float *d_bias, float *d_y, void *d_scratch, uint64_t M, uint64_t K16,
                              unsigned maxcols, const double *ref, const double *mag, double *rel) {
  float *y = malloc(M * maxcols * sizeof *y);
  for (unsigned ncols = 1; ncols <= maxcols; ncols++) {
    CU(cudaMemsetAsync(d_y, 0xff, M * maxcols * 4, stream));
    CHECK_RC(bf16x ? nwc_k_matvec_cols_bf16x(d, d_x, ncols, K16, d_bias, d_y, NULL, M, d_scratch, stream)
                   : nwc_k_matvec_cols(d, d_x, ncols, K16, d_bias, d_y, NULL, M, d_scratch, stream));
    CU(cudaMemcpyAsync(y, d_y, M * maxcols * 4, cudaMemcpyDeviceToHost, stream));
    CU(cudaStreamSynchronize(stream));
    for (unsigned i = 0; i < ncols; i++) {
      double num = 0, den = 0, noise = 0;
      for (uint64_t r = 0; r < M; r++) {
        double e = (double)y[i * M + r] - ref[i * M + r];
        num += isfinite(y[i * M + r]) ? e * e : INFINITY;
        den += ref[i * M + r] * ref[i * M + r];
        noise += mag[i * M + r] * mag[i * M + r];
      }
      double ri = den > 0 ? sqrt(num / den) : sqrt(num);
      *rel = ri > *rel ? ri : *rel;
      /* A vector of a few rows can cancel to far below its terms (the sample's 1 x N tensors):
       * then the fp32 sum's own rounding, not the decoder, sets the error, and 2^-20 of the
       * terms' norm is the bound it is held to instead. */
      CHECK(ri <= 1e-5 || sqrt(num) <= 0x1p-20 * sqrt(noise), "%s: matvec of %u columns (%s x): column %u: relative error %.3g",
            label, ncols, bf16x ? "BF16" : "fp32", i, ri);
    }
    uint64_t untouched = 0;
    for (uint64_t i = (uint64_t)ncols * M; i < (uint64_t)maxcols * M; i++) untouched += !isnan(y[i]);
    CHECK(untouched == 0, "%s: matvec of %u columns (%s x) wrote %llu values past them", label, ncols,
          bf16x ? "BF16" : "fp32", (unsigned long long)untouched);
  }
  free(y);
}

static void check_tensor(const char *label, const void *w, uint64_t M, uint64_t K, unsigned type,
                         unsigned layout, const float *scale) {
  nwc_tensor t;
  nwc_k_tensor d;
  int rc = nwc_tensor_encode(w, M, K, NWC_ELEM(type, layout), scale, &t);
  CHECK_RC(rc);
  if (rc < 0) return;
  rc = nwc_k_tensor_upload(&t, &d, stream);
  CHECK(rc == 0, "%s: upload: %d (cuda %d)", label, rc, nwc_k_last_cuda_error());
  if (rc < 0) {
    nwc_tensor_release(&t);
    return;
  }
  uint64_t lay[4];
  CHECK_RC(nwc_layout(M, K, t.elem, lay));
  const uint64_t K16 = lay[NWC_LAYOUT_K16], nout = M * K16;
  int fails_before = test_failures;

  /* dequant */
  uint64_t n = M < 40 ? M + 1 : 41; /* gather rows, below */
  size_t outbuf = (n > M ? n : M) * K16 * 2;
  uint16_t *want = malloc(outbuf), *got = malloc(outbuf);
  CHECK_RC(nwc_dequant(&t, want));
  uint16_t *d_out = dalloc(nout * 2);
  CU(cudaMemsetAsync(d_out, 0xff, nout * 2, stream));
  CHECK_RC(nwc_k_dequant(&d, d_out, stream));
  CU(cudaMemcpyAsync(got, d_out, nout * 2, cudaMemcpyDeviceToHost, stream));
  CU(cudaStreamSynchronize(stream));
  uint64_t diff = 0, first = 0;
  for (uint64_t i = 0; i < nout; i++)
    if (got[i] != want[i] && !diff++) first = i;
  CHECK(diff == 0, "%s: dequant: %llu of %llu differ, first at %llu: 0x%04x vs 0x%04x", label,
        (unsigned long long)diff, (unsigned long long)nout, (unsigned long long)first, got[first],
        want[first]);
  check_dequant_rows(label, &d, want, M, K16, d_out);
  CU(cudaFree(d_out));

  /* gather: the first, the last and random rows, with a repeat */
  uint64_t *rows = malloc(n * sizeof *rows);
  for (uint64_t i = 0; i < n; i++) rows[i] = test_below(M);
  rows[0] = 0;
  if (n > 1) rows[1] = M - 1;
  if (n > 2) rows[2] = rows[n - 1];
  CHECK_RC(nwc_gather(&t, rows, n, want));
  uint64_t *d_rows = dalloc(n * sizeof *rows);
  d_out = dalloc(n * K16 * 2);
  CU(cudaMemcpyAsync(d_rows, rows, n * sizeof *rows, cudaMemcpyHostToDevice, stream));
  CU(cudaMemsetAsync(d_out, 0xff, n * K16 * 2, stream));
  CHECK_RC(nwc_k_gather(&d, d_rows, n, d_out, stream));
  CU(cudaMemcpyAsync(got, d_out, n * K16 * 2, cudaMemcpyDeviceToHost, stream));
  CU(cudaStreamSynchronize(stream));
  diff = 0;
  for (uint64_t i = 0; i < n * K16; i++)
    if (got[i] != want[i] && !diff++) first = i;
  CHECK(diff == 0, "%s: gather: %llu of %llu differ, first at %llu", label, (unsigned long long)diff,
        (unsigned long long)(n * K16), (unsigned long long)first);
  CU(cudaFree(d_out));
  CU(cudaFree(d_rows));
  free(rows);

  /* matvec of 1..8 columns at once against fp64, x in fp32 and (layouts 1 and 2) in BF16; linear
   * (BF16 y) of one column below */
  const unsigned maxcols = layout ? 8 : 3;
  float *x = calloc(K16 * maxcols, sizeof *x), *bias = malloc(M * sizeof *bias);
  for (uint64_t i = 0; i < maxcols; i++)
    for (uint64_t c = 0; c < K; c++) x[i * K16 + c] = (float)normal();
  for (uint64_t r = 0; r < M; r++) bias[r] = (float)(0.1 * normal());
  double *wd = weights_f64(w, M, K, type, scale), *ref = malloc(M * maxcols * sizeof *ref),
         *mag = malloc(M * maxcols * sizeof *mag);
  int64_t scratch_bytes = nwc_k_scratch_bytes(&d, maxcols);
  CHECK(scratch_bytes > 0, "%s: scratch_bytes: %lld", label, (long long)scratch_bytes);
  float *d_x = dalloc(K16 * maxcols * 4), *d_bias = dalloc(M * 4), *d_y = dalloc(M * maxcols * 4),
        *d_scratch = shared_scratch((size_t)scratch_bytes);
  CU(cudaMemcpyAsync(d_bias, bias, M * 4, cudaMemcpyHostToDevice, stream));
  double rel = 0;
  if (layout) { /* BF16 x first: x rounded to BF16, the reference of those values */
    uint16_t *xb = calloc(K16 * maxcols, sizeof *xb);
    float *xr = calloc(K16 * maxcols, sizeof *xr);
    for (uint64_t i = 0; i < K16 * maxcols; i++) xb[i] = nwc_f32_to_bf16(x[i]), xr[i] = nwc_bf16_to_f32(xb[i]);
    reference(wd, M, K, K16, xr, bias, maxcols, ref, mag);
    CU(cudaMemcpyAsync(d_x, xb, K16 * maxcols * 2, cudaMemcpyHostToDevice, stream));
    CU(cudaStreamSynchronize(stream));
    check_matvec_cols(label, &d, 1, d_x, d_bias, d_y, d_scratch, M, K16, maxcols, ref, mag, &rel);
    free(xr);
    free(xb);
  }
  reference(wd, M, K, K16, x, bias, maxcols, ref, mag);
  CU(cudaMemcpyAsync(d_x, x, K16 * maxcols * 4, cudaMemcpyHostToDevice, stream));
  check_matvec_cols(label, &d, 0, d_x, d_bias, d_y, d_scratch, M, K16, maxcols, ref, mag, &rel);

  uint16_t *yb = malloc(M * 2);
  CU(cudaMemsetAsync(d_y, 0xff, M * 4, stream));
  CHECK_RC(nwc_k_linear_bf16(&d, d_x, d_bias, (uint16_t *)d_y, d_scratch, stream));
  CU(cudaMemcpyAsync(yb, d_y, M * 2, cudaMemcpyDeviceToHost, stream));
  CU(cudaStreamSynchronize(stream));
  uint64_t bad = check_bf16(yb, ref, mag, M);
  CHECK(bad == 0, "%s: linear_bf16: %llu of %llu rows beyond one ulp", label,
        (unsigned long long)bad, (unsigned long long)M);

  /* the fp8 baseline, on the same weights and x (no bias) */
  if (type == NWC_ELEM_FP8 && K % 16 == 0) {
    uint8_t *d_q = dalloc(M * K);
    float *d_scale = dalloc(M * 4);
    CU(cudaMemcpyAsync(d_q, w, M * K, cudaMemcpyHostToDevice, stream));
    CU(cudaMemcpyAsync(d_scale, scale, M * 4, cudaMemcpyHostToDevice, stream));
    CU(cudaMemsetAsync(d_y, 0xff, M * 2, stream));
    CHECK_RC(nwc_k_ref_fp8(d_q, M, K, d_x, d_scale, d_bias, (uint16_t *)d_y, stream));
    CU(cudaMemcpyAsync(yb, d_y, M * 2, cudaMemcpyDeviceToHost, stream));
    CU(cudaStreamSynchronize(stream));
    bad = check_bf16(yb, ref, mag, M);
    CHECK(bad == 0, "%s: ref_fp8: %llu of %llu rows beyond one ulp", label,
          (unsigned long long)bad, (unsigned long long)M);
    CU(cudaFree(d_q));
    CU(cudaFree(d_scale));
  }
  printf("  %-40s %s matvec rel %.2e\n", label, test_failures == fails_before ? "ok  " : "FAIL", rel);
  CU(cudaFree(d_x));
  CU(cudaFree(d_bias));
  CU(cudaFree(d_y));
  free(want), free(got), free(x), free(bias), free(yb), free(wd), free(ref), free(mag);
  nwc_k_tensor_free(&d);
  nwc_tensor_release(&t);
}

/* BF16 weights checked as BF16 (with a row scale when with_scale) and quantized to fp8, each in
 * layouts 0, 1 and 2. */
static void check_both(const char *what, const uint16_t *w, uint64_t M, uint64_t K, int with_scale) {
  char label[128];
  float *scale = malloc(M * sizeof *scale);
  for (uint64_t r = 0; r < M; r++) scale[r] = (float)exp(0.3 * normal());
  static const unsigned layouts[] = {0, 1, 2};
  for (unsigned l = 0; l < sizeof layouts / sizeof layouts[0]; l++) {
    snprintf(label, sizeof label, "%s %llux%llu bf16%s L%u", what, (unsigned long long)M,
             (unsigned long long)K, with_scale ? "+scale" : "", layouts[l]);
    check_tensor(label, w, M, K, NWC_ELEM_BF16, layouts[l], with_scale ? scale : NULL);
  }
  uint8_t *q = malloc(M * K);
  int rc = nwc_quantize_fp8(w, M, K, q, scale);
  CHECK_RC(rc);
  for (unsigned l = 0; rc == 0 && l < sizeof layouts / sizeof layouts[0]; l++) {
    snprintf(label, sizeof label, "%s %llux%llu fp8 L%u", what, (unsigned long long)M,
             (unsigned long long)K, layouts[l]);
    check_tensor(label, q, M, K, NWC_ELEM_FP8, layouts[l], scale);
  }
  free(q);
  free(scale);
}

/* Layout 2 at its limit: 16 x 1024 BF16 weights of 7 common exponent bytes where one lane of each
 * block (lane 0 of block 0, lane 31 of block 1) has 255 weights of 8 rare exponent bytes, each an
 * exception: 255 entries, the most a lane may have. */
static void check_exceptions_255(void) {
  const uint64_t M = 16, K = 1024;
  uint16_t *w = malloc(M * K * sizeof *w);
  for (uint64_t i = 0; i < M * K; i++)
    w[i] = (uint16_t)((unsigned)test_below(2) << 15 | (0x3cu - (unsigned)test_below(7)) << 8 |
                      (unsigned)test_below(256));
  for (unsigned cb = 0; cb < 2; cb++) {
    const unsigned lane = cb ? 31 : 0, r = lane >> 2, q = lane & 3;
    for (unsigned k = 0; k < 255; k++) {
      const unsigned sc = k >> 4, j = k & 15;
      const uint64_t row = r + 8 * ((j >> 1) & 1);
      const uint64_t col = 512 * cb + 32 * sc + 8 * q + 4 * (j >> 3) + 2 * ((j >> 2) & 1) + (j & 1);
      w[row * K + col] = (uint16_t)((unsigned)test_below(2) << 15 | (0x10u + k % 8) << 8 |
                                    (unsigned)test_below(256));
    }
  }
  nwc_tensor t;
  CHECK_RC(nwc_tensor_encode(w, M, K, NWC_ELEM(NWC_ELEM_BF16, 2), NULL, &t));
  CHECK(t.hdr && t.hdr[0] == 255 && t.hdr[32 + 31] == 255, "exceptions_255: the lanes have %u and %u entries",
        t.hdr ? t.hdr[0] : 0, t.hdr ? t.hdr[32 + 31] : 0);
  nwc_tensor_release(&t);
  check_tensor("exceptions_255 16x1024 bf16 L2", w, M, K, NWC_ELEM_BF16, 2, NULL);
  free(w);
}

static void check_api(void) {
  nwc_k_tensor d = {0};
  float *p = (float *)&d; /* any non-NULL pointer: nothing is launched */
  CHECK(nwc_k_matvec(NULL, p, NULL, p, p, stream) == -EINVAL, "matvec(NULL tensor)");
  CHECK(nwc_k_dequant(&d, (uint16_t *)p, stream) == -EINVAL, "dequant(empty tensor)");
  d.elem = NWC_ELEM(NWC_ELEM_BF16, 3);
  d.tab = (const uint32_t *)p, d.bases = (const uint64_t *)p;
  d.hdr = d.data = d.raw = (const uint8_t *)p, d.rows = d.cols = 8, d.nblocks = 1;
  CHECK(nwc_k_dequant(&d, (uint16_t *)p, stream) == -ENOTSUP, "dequant(layout 3)");
  d.elem = NWC_ELEM(NWC_ELEM_BF16, 0), d.nblocks = 2;
  CHECK(nwc_k_dequant(&d, (uint16_t *)p, stream) == -EINVAL, "dequant(wrong block count)");
  d.rows = 40, d.nblocks = 5;
  static uint4 out16[2];
  uint16_t *a = (uint16_t *)out16;
  CHECK(nwc_k_dequant_rows(&d, 0, 16, a + 1, stream) == -EINVAL, "dequant_rows(unaligned out)");
  CHECK(nwc_k_dequant_rows(&d, 8, 16, a, stream) == -EINVAL, "dequant_rows(row0 8)");
  CHECK(nwc_k_dequant_rows(&d, 0, 24, a, stream) == -EINVAL, "dequant_rows(24 rows, not to the end)");
  CHECK(nwc_k_dequant_rows(&d, 32, 16, a, stream) == -EINVAL, "dequant_rows(past the end)");
  CHECK(nwc_k_dequant_rows(&d, 48, 0, a, stream) == -EINVAL, "dequant_rows(row0 past the end)");
  CHECK(nwc_k_dequant_rows(NULL, 0, 16, a, stream) == -EINVAL, "dequant_rows(NULL tensor)");
  d.rows = d.cols = 8, d.nblocks = 2;
  CHECK(nwc_k_ref_fp8((uint8_t *)p, 4, 13, p, NULL, NULL, (uint16_t *)p, stream) == -EINVAL,
        "ref_fp8(K not a multiple of 16)");
  CHECK(nwc_k_scratch_bytes(NULL, 1) == -EINVAL, "scratch_bytes(NULL tensor)");
  CHECK(nwc_k_scratch_bytes(&d, 0) == -EINVAL && nwc_k_scratch_bytes(&d, 9) == -EINVAL,
        "scratch_bytes(0 or 9 columns)");
  CHECK(nwc_k_matvec_cols(&d, p, 9, 16, NULL, p, NULL, 16, p, stream) == -EINVAL,
        "matvec_cols(9 columns)");
  /* layout 2: a 16-byte aligned stand-in so that only the column count is wrong */
  static uint4 aligned[4];
  d.tab = (const uint32_t *)aligned, d.bases = (const uint64_t *)aligned;
  d.hdr = d.data = d.raw = (const uint8_t *)aligned, d.rows = d.cols = 16, d.nblocks = 1;
  for (unsigned layout = 1; layout <= 2; layout++) {
    d.elem = NWC_ELEM(NWC_ELEM_BF16, layout);
    CHECK(nwc_k_matvec_cols(&d, (const float *)aligned, 0, 16, NULL, (float *)aligned, NULL, 16, aligned,
                            stream) == -EINVAL,
          "matvec_cols(layout %u, 0 columns)", layout);
    const uint16_t *xb = (const uint16_t *)aligned;
    CHECK(nwc_k_matvec_cols_bf16x(&d, xb, 9, 16, NULL, (float *)aligned, NULL, 16, aligned, stream) == -EINVAL,
          "matvec_cols_bf16x(layout %u, 9 columns)", layout);
    CHECK(nwc_k_matvec_cols_bf16x(&d, xb + 1, 1, 16, NULL, (float *)aligned, NULL, 16, aligned, stream) == -EINVAL,
          "matvec_cols_bf16x(layout %u, x not 16-byte aligned)", layout);
    CHECK(nwc_k_matvec_cols_bf16x(&d, xb, 2, 20, NULL, (float *)aligned, NULL, 16, aligned, stream) == -EINVAL,
          "matvec_cols_bf16x(layout %u, ldx not a multiple of 8)", layout);
  }
  d.elem = NWC_ELEM(NWC_ELEM_BF16, 0);
  CHECK(nwc_k_matvec_cols_bf16x(&d, (const uint16_t *)aligned, 1, 16, NULL, (float *)aligned, NULL, 16, aligned,
                                stream) == -ENOTSUP,
        "matvec_cols_bf16x(layout 0)");
  CHECK(nwc_k_matvec_cols_bf16x(NULL, (const uint16_t *)aligned, 1, 16, NULL, (float *)aligned, NULL, 16, aligned,
                                stream) == -EINVAL,
        "matvec_cols_bf16x(NULL tensor)");
}

static void check_sample(void) {
  const char *path = getenv("NWC_SAMPLE");
  nwc_st_file *f = NULL;
  if (!path || !*path || nwc_st_open(path, &f) < 0) {
    printf("  sample model not found (NWC_SAMPLE=%s): skipped that part\n", path ? path : "");
    return;
  }
  for (size_t i = 0; i < f->count; i++) {
    const nwc_st_tensor *st = &f->tensors[i];
    if (strcmp(st->dtype, "BF16") || st->numel < 2) continue;
    uint64_t M, K;
    nwc_st_matrix_shape(st, &M, &K);
    uint16_t *w = malloc(st->numel * 2);
    memcpy(w, nwc_st_data(f, st), st->numel * 2);
    char what[96];
    snprintf(what, sizeof what, "sample %.60s", st->name);
    check_both(what, w, M, K, 0);
    free(w);
  }
  nwc_st_close(f);
}

int main(void) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("%s: no GPU, skipped\n", NAME);
    return TEST_SKIP;
  }
  test_seed(NAME);
  CU(cudaStreamCreate(&stream));
  check_api();
  /* 65536 x 320: layout 2's warps each take parts of two row groups and whole ones between */
  static const uint64_t shapes[][2] = {{1, 1},        {7, 13},    {8, 512},    {9, 513},   {17, 1040},
                                       {16, 11008},   {151936, 64}, {33, 1000}, {300, 2560}, {40, 4096},
                                       {65536, 320}};
  const char *q = getenv("NWC_TEST_QUICK");
  int quick = q && *q && strcmp(q, "0");
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int k = REAL; k <= ESCAPES; k++) {
      uint64_t M = shapes[s][0], K = shapes[s][1];
      if (quick && M * K > 1000000) continue;
      uint16_t *w = make_bf16(M, K, (enum kind)k);
      check_both(kind_name[k], w, M, K, (int)(s & 1));
      free(w);
    }
  check_exceptions_255();
  if (!quick) check_sample();
  check_scratch_zero();
  CU(cudaStreamDestroy(stream));
  return test_exit(NAME);
}
