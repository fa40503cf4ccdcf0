/*
 * make_golden.c - writes the golden files that freeze the layout-0 format (tests/golden/README.md).
 *
 * For each case of the table below it writes, into the directory given as argv[1]:
 *   NAME.in    the input: BF16 (uint16 little-endian) or fp8 bytes, row-major, rows x cols
 *   NAME.nwct  the tensor record nwc_record_write() gives for it (fp8q: after nwc_quantize_fp8,
 *              with the per-row scales)
 *   NAME.out   what nwc_dequant must return: rows x K16 BF16 little-endian, derived from the input
 *              and not from the decoder (BF16: the input, padding columns psym[0] << 8; fp8: the
 *              exact fp8 values computed with ldexp)
 * and golden.txt, one line "NAME TYPE ROWS COLS" per case (TYPE bf16, fp8 or fp8q), followed by
 * the block layout when it is not 0 (layouts 1 and 2, docs/format-layouts.md; their padding
 * columns hold psym[0] << 8 | psym[8] for layout 2).
 *
 * Inputs come from a fixed seed and integer arithmetic only (no libm), so they are the same on
 * every machine.  Run it only to change the format on purpose; test_codec_golden checks the files.
 */
#include "codec_util.h"

#include <errno.h>

typedef struct golden_case {
  const char *name, *type;
  uint64_t rows, cols;
  int gen; /* how the input is made, see make_input() */
  unsigned layout;
} golden_case;

enum { G_TYPICAL, G_ESCAPES, G_EQUAL, G_FP8_ALL, G_FP8_TYPICAL };

static const golden_case cases[] = {
    {"bf16_1x1", "bf16", 1, 1, G_TYPICAL, 0},
    {"bf16_9x513", "bf16", 9, 513, G_TYPICAL, 0},
    {"bf16_16x1040", "bf16", 16, 1040, G_TYPICAL, 0},
    {"bf16_escapes_24x100", "bf16", 24, 100, G_ESCAPES, 0},
    {"bf16_equal_5x37", "bf16", 5, 37, G_EQUAL, 0},
    {"bf16_k5_11x5", "bf16", 11, 5, G_TYPICAL, 0},
    {"fp8_all_3x300", "fp8", 3, 300, G_FP8_ALL, 0},
    {"fp8_9x513", "fp8", 9, 513, G_FP8_TYPICAL, 0},
    {"fp8_k13_7x13", "fp8", 7, 13, G_FP8_TYPICAL, 0},
    {"fp8q_10x40", "fp8q", 10, 40, G_TYPICAL, 0},
    /* layouts 1 and 2 (issue 3): appended, so the inputs above stay as they are */
    {"l1_bf16_1x1", "bf16", 1, 1, G_TYPICAL, 1},
    {"l1_bf16_17x1040", "bf16", 17, 1040, G_TYPICAL, 1},
    {"l1_bf16_escapes_24x100", "bf16", 24, 100, G_ESCAPES, 1},
    {"l1_fp8_all_3x300", "fp8", 3, 300, G_FP8_ALL, 1},
    {"l1_fp8_9x513", "fp8", 9, 513, G_FP8_TYPICAL, 1},
    {"l1_fp8q_10x40", "fp8q", 10, 40, G_TYPICAL, 1},
    {"l2_bf16_1x1", "bf16", 1, 1, G_TYPICAL, 2},
    {"l2_bf16_17x1040", "bf16", 17, 1040, G_TYPICAL, 2},
    {"l2_bf16_escapes_24x100", "bf16", 24, 100, G_ESCAPES, 2},
    {"l2_bf16_equal_5x37", "bf16", 5, 37, G_EQUAL, 2},
    {"l2_fp8_all_3x300", "fp8", 3, 300, G_FP8_ALL, 2},
    {"l2_fp8_9x513", "fp8", 9, 513, G_FP8_TYPICAL, 2},
    {"l2_fp8q_10x40", "fp8q", 10, 40, G_TYPICAL, 2},
};

/* Leading zeros of a random 32-bit number: 0 with probability 1/2, 1 with 1/4, ... */
static unsigned geometric(void) {
  uint32_t v = (uint32_t)test_rand();
  unsigned z = 0;
  while (z < 31 && !(v & (UINT32_C(1) << (31 - z)))) z++;
  return z;
}

/* A weight-like BF16: random sign and mantissa, exponent 122 minus a geometric count. */
static uint16_t typical_bf16(void) {
  unsigned e = 122 - geometric();
  return (uint16_t)((test_below(2) << 15) | (e << 7) | test_below(128));
}

static void make_input(const golden_case *c, void *in) {
  uint64_t n = c->rows * c->cols;
  uint16_t *w = in;
  uint8_t *q = in;
  unsigned g;
  for (uint64_t i = 0; i < n; i++) {
    switch (c->gen) {
    case G_TYPICAL: w[i] = typical_bf16(); break;
    case G_ESCAPES: /* 60 exponents (45 escaped), with zeros, subnormals, infinities and NaNs */
      w[i] = (uint16_t)((test_below(2) << 15) | ((60 + test_below(60)) << 7) | test_below(128));
      if (i % 17 == 3) w[i] = (uint16_t)(test_rand() & 0x807f);
      if (i % 29 == 5) w[i] = (uint16_t)(0x7f80 | (test_below(2) << 15) | (i % 3 ? test_below(128) : 0));
      break;
    case G_EQUAL: w[i] = 0xbe40; break;
    case G_FP8_ALL: /* every non-NaN byte once, then random ones */
      q[i] = (uint8_t)(i < 254 ? i + (i >= 127) : test_rand());
      if ((q[i] & 0x7f) == 0x7f) q[i] ^= 1;
      break;
    default: /* sign, 4-bit exponent 7 - geometric (clamped at 0), 3-bit mantissa */
      g = geometric();
      q[i] = (uint8_t)((test_below(2) << 7) | ((g < 7 ? 7 - g : 0) << 3) | test_below(8));
      if ((q[i] & 0x7f) == 0x7f) q[i] ^= 1;
    }
  }
}

static int write_file(const char *dir, const char *name, const char *ext, const void *p, size_t n) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s%s", dir, name, ext);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n || fclose(f)) {
    fprintf(stderr, "make_golden: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  return 0;
}

static int make_case(const char *dir, const golden_case *c, FILE *manifest) {
  uint64_t M = c->rows, K = c->cols, n = M * K, K16 = cu_k16(K);
  int fp8_in = !strcmp(c->type, "fp8"), quant = !strcmp(c->type, "fp8q");
  void *in = cu_malloc(n * 2);
  make_input(c, in);
  uint8_t *q = fp8_in ? in : cu_malloc(n);
  float *scale = quant ? cu_malloc(M * sizeof *scale) : NULL;
  int rc = quant ? nwc_quantize_fp8(in, M, K, q, scale) : 0;
  unsigned type = fp8_in || quant ? NWC_ELEM_FP8 : NWC_ELEM_BF16;
  nwc_tensor t;
  if (rc == 0) rc = nwc_tensor_encode(type == NWC_ELEM_FP8 ? (void *)q : in, M, K,
                                      NWC_ELEM(type, c->layout), scale, &t);
  uint8_t *rec = NULL;
  size_t len = 0;
  if (rc == 0) rc = nwc_record_write(&t, &rec, &len);
  if (rc < 0) {
    fprintf(stderr, "make_golden: %s: %s (%s)\n", c->name, nwc_strerror(rc), nwc_error_detail());
    return -1;
  }
  uint16_t *out = cu_expected(type == NWC_ELEM_FP8 ? (void *)q : in, M, K, type, t.psym[0]);
  for (uint64_t i = 0; c->layout == 2 && i < M * K16; i++) /* layout 2's filler: psym[8] too */
    if (i % K16 >= K) out[i] |= t.psym[8];
  rc = write_file(dir, c->name, ".in", in, fp8_in ? n : n * 2);
  if (rc == 0) rc = write_file(dir, c->name, ".nwct", rec, len);
  if (rc == 0) rc = write_file(dir, c->name, ".out", out, M * K16 * 2);
  if (c->layout)
    fprintf(manifest, "%s %s %llu %llu %u\n", c->name, c->type, (unsigned long long)M,
            (unsigned long long)K, c->layout);
  else
    fprintf(manifest, "%s %s %llu %llu\n", c->name, c->type, (unsigned long long)M,
            (unsigned long long)K);
  printf("%-22s %-4s %3llu x %-5llu record %zu bytes\n", c->name, c->type, (unsigned long long)M,
         (unsigned long long)K, len);
  free(out);
  free(rec);
  nwc_tensor_release(&t);
  if (!fp8_in) free(q);
  free(scale);
  free(in);
  return rc;
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : ".";
  setenv("NWC_SEED", "20261201", 1); /* fixed on purpose: golden data must not change */
  test_seed("make_golden");
  char path[4096];
  snprintf(path, sizeof path, "%s/golden.txt", dir);
  FILE *manifest = fopen(path, "w");
  if (!manifest) {
    fprintf(stderr, "make_golden: cannot write %s: %s\n", path, strerror(errno));
    return 1;
  }
  fprintf(manifest, "# name type rows cols (written by make_golden; see README.md)\n");
  int rc = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0] && rc == 0; i++)
    rc = make_case(dir, &cases[i], manifest);
  if (fclose(manifest)) rc = -1;
  return rc ? 1 : test_exit("make_golden");
}
