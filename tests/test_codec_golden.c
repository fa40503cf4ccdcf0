/*
 * test_codec_golden.c - the golden files (tests/golden/, README.md there) freeze the format.
 *
 * For each case in golden.txt: encoding NAME.in (fp8q: after nwc_quantize_fp8) must give
 * NAME.nwct byte for byte (freezes the encoder and the record); NAME.out must follow from
 * NAME.in (checks the golden data itself); reading NAME.nwct and decoding it must give NAME.out
 * (freezes the decoder), and gather and matvec on it must agree with NAME.out.  A change that
 * moves one bit of the format fails here.
 *
 * Then each case in invalid.txt must fail with exactly the error listed there, at its stage:
 * encode (NAME.in does not encode; fp8q: does not quantize), read (nwc_record_read of NAME.nwct)
 * or decode (NAME.nwct reads, nwc_dequant and nwc_matvec fail), which freezes the error paths.
 */
#include "codec_util.h"

#include <errno.h>

#ifndef GOLDEN_DIR
#define GOLDEN_DIR "tests/golden"
#endif

/* Where two records first differ, named by the record layout (docs/format.md, "Tensor record"). */
static void report_diff(const char *name, const uint8_t *got, size_t glen, const uint8_t *want,
                        size_t wlen) {
  size_t i = 0;
  while (i < glen && i < wlen && got[i] == want[i]) i++;
  static const struct {
    size_t end;
    const char *field;
  } fields[] = {{4, "magic"},     {6, "version"},  {7, "elem"},      {8, "flags"},
                {16, "rows"},     {24, "cols"},    {40, "psym"},     {48, "nblocks"},
                {56, "data_bytes"}, {64, "raw_bytes"}, {72, "checksum"}};
  const char *field = "arrays (bases, hdr, data, raw, scale)";
  for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++)
    if (i < fields[f].end) {
      field = fields[f].field;
      break;
    }
  CHECK(0, "%s: record differs from %s.nwct at byte %zu (%s); %zu vs %zu bytes", name, name, i,
        field, glen, wlen);
}

static void golden_case(const char *dir, const char *name, const char *type, uint64_t M, uint64_t K,
                        unsigned layout) {
  int fp8_in = !strcmp(type, "fp8"), quant = !strcmp(type, "fp8q");
  CHECK(fp8_in || quant || !strcmp(type, "bf16"), "%s: unknown type %s", name, type);
  uint64_t K16 = cu_k16(K), n = M * K;
  size_t in_len = 0, rec_len = 0, out_len = 0;
  uint8_t *in = test_slurp(dir, name, ".in", &in_len);
  uint8_t *rec = test_slurp(dir, name, ".nwct", &rec_len);
  uint16_t *out = (uint16_t *)test_slurp(dir, name, ".out", &out_len);
  if (!in || !rec || !out) goto done;
  int sizes_ok = in_len == (fp8_in ? n : 2 * n) && out_len == M * K16 * 2;
  CHECK(sizes_ok, "%s: file sizes do not fit %llux%llu", name, (unsigned long long)M,
        (unsigned long long)K);
  if (!sizes_ok) goto done;

  /* Encoder: the input encodes to the golden record, byte for byte. */
  unsigned type_id = fp8_in || quant ? NWC_ELEM_FP8 : NWC_ELEM_BF16;
  uint8_t *q = fp8_in ? in : cu_malloc(n);
  float *scale = quant ? cu_malloc(M * sizeof *scale) : NULL;
  if (quant) CHECK_RC(nwc_quantize_fp8((const uint16_t *)in, M, K, q, scale));
  const void *w = type_id == NWC_ELEM_FP8 ? (const void *)q : (const void *)in;
  nwc_tensor t;
  uint8_t *mine = NULL;
  size_t mine_len = 0;
  int rc = nwc_tensor_encode(w, M, K, NWC_ELEM(type_id, layout), scale, &t);
  CHECK_RC(rc);
  if (rc == 0) {
    CHECK_RC(nwc_record_write(&t, &mine, &mine_len));
    if (mine && (mine_len != rec_len || memcmp(mine, rec, rec_len)))
      report_diff(name, mine, mine_len, rec, rec_len);
    nwc_tensor_release(&t);
  }
  free(mine);

  /* The golden output follows from the input: padding columns hold the filler of psym[0]. */
  uint8_t psym0 = rec_len >= 72 ? rec[24] : 0;
  uint16_t *expect = cu_expected(w, M, K, type_id, psym0);
  for (uint64_t i = 0; layout == 2 && rec_len >= 72 && i < M * K16; i++) /* psym[8] (layout 2) */
    if (i % K16 >= K) expect[i] |= rec[24 + 8];
  cu_same16(out, expect, M * K16, K16, "golden .out vs .in");
  free(expect);

  /* Decoder: the golden record decodes to the golden output. */
  rc = nwc_record_read(rec, rec_len, &t);
  CHECK(rc == 0, "%s: nwc_record_read: %s", name, nwc_error_detail());
  if (rc == 0) {
    CHECK(t.rows == M && t.cols == K && NWC_ELEM_TYPE(t.elem) == type_id &&
              NWC_ELEM_LAYOUT(t.elem) == layout && !t.scale == !quant,
          "%s: record header does not match golden.txt", name);
    CHECK(!quant || !memcmp(t.scale, scale, M * sizeof *scale), "%s: scales differ", name);
    char what[300];
    snprintf(what, sizeof what, "golden %s", name);
    cu_check_dequant(&t, out, what);
    cu_check_gather(&t, out, what);
    cu_check_matvec(&t, out, what);
    nwc_tensor_release(&t);
  }
  if (!fp8_in) free(q);
  free(scale);
done:
  free(in);
  free(rec);
  free(out);
}

/* One line of invalid.txt: NAME STAGE ERROR TYPE ROWS COLS LAYOUT WHY... */
static void invalid_case(const char *dir, const char *line) {
  char name[256], stage[16], err[16], type[16];
  unsigned long long M, K;
  unsigned layout;
  if (sscanf(line, "%255s %15s %15s %15s %llu %llu %u", name, stage, err, type, &M, &K,
             &layout) != 7 || !cu_errno_value(err) || layout > 15) {
    CHECK(0, "invalid.txt: bad line: %s", line);
    return;
  }
  int want = -cu_errno_value(err), got = 0, fp8_in = !strcmp(type, "fp8");
  int quant = !strcmp(type, "fp8q");
  size_t len = 0;
  if (!strcmp(stage, "encode")) {
    uint8_t *in = test_slurp(dir, name, ".in", &len);
    uint64_t n = M * K;
    if (!in) return;
    CHECK(len == (fp8_in ? n : 2 * n), "%s: %zu bytes of input for %llux%llu", name, len, M, K);
    uint8_t *q = fp8_in ? in : cu_malloc(n);
    float *scale = quant ? cu_malloc(M * sizeof *scale) : NULL;
    if (quant) got = nwc_quantize_fp8((const uint16_t *)in, M, K, q, scale);
    nwc_tensor t;
    unsigned type_id = fp8_in || quant ? NWC_ELEM_FP8 : NWC_ELEM_BF16;
    if (got == 0 && len == (fp8_in ? n : 2 * n)) {
      got = nwc_tensor_encode(type_id == NWC_ELEM_FP8 ? (void *)q : in, M, K,
                              NWC_ELEM(type_id, layout), scale, &t);
      if (got == 0) nwc_tensor_release(&t);
    }
    if (!fp8_in) free(q);
    free(scale);
    free(in);
  } else {
    int decode = !strcmp(stage, "decode");
    CHECK(decode || !strcmp(stage, "read"), "%s: unknown stage %s", name, stage);
    uint8_t *rec = test_slurp(dir, name, ".nwct", &len);
    if (!rec) return;
    nwc_tensor t;
    got = nwc_record_read(rec, len, &t);
    if (decode && got == 0) {
      uint64_t K16 = cu_k16(t.cols);
      uint16_t *out = cu_malloc(t.rows * K16 * 2);
      float *x = calloc(K16, sizeof *x), *y = cu_malloc(t.rows * sizeof *y);
      got = nwc_dequant(&t, out);
      int mv = nwc_matvec(&t, x, NULL, y, NULL);
      CHECK(mv == want, "%s: nwc_matvec returned %d (%s), expected %s", name, mv, nwc_strerror(mv),
            err);
      free(out);
      free(x);
      free(y);
      nwc_tensor_release(&t);
    } else if (got == 0) {
      nwc_tensor_release(&t);
    }
    free(rec);
  }
  CHECK(got == want, "%s: %s returned %d (%s: %s), expected %s", name, stage, got,
        nwc_strerror(got), got ? nwc_error_detail() : "", err);
}

int main(void) {
  test_seed("test_codec_golden");
  const char *src = getenv("NWC_SOURCE_DIR");
  char dir[4096];
  if (src && *src)
    snprintf(dir, sizeof dir, "%s/tests/golden", src);
  else
    snprintf(dir, sizeof dir, "%s", GOLDEN_DIR);
  char path[4200];
  snprintf(path, sizeof path, "%s/golden.txt", dir);
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "test_codec_golden: cannot open %s: %s\n", path, strerror(errno));
    return 1;
  }
  char line[512];
  int cases = 0;
  while (fgets(line, sizeof line, f)) {
    char name[256], type[16];
    unsigned long long M, K;
    unsigned layout = 0; /* optional fifth field */
    if (line[0] == '#' || line[0] == '\n') continue;
    if (sscanf(line, "%255s %15s %llu %llu %u", name, type, &M, &K, &layout) < 4 || layout > 2) {
      CHECK(0, "golden.txt: bad line: %s", line);
      continue;
    }
    int before = test_failures;
    golden_case(dir, name, type, M, K, layout);
    printf("%-22s %s\n", name, test_failures == before ? "ok" : "FAILED");
    cases++;
  }
  fclose(f);
  CHECK(cases >= 8, "golden.txt lists only %d cases", cases);

  snprintf(path, sizeof path, "%s/invalid.txt", dir);
  f = fopen(path, "r");
  CHECK(f, "cannot open %s: %s", path, strerror(errno));
  int bad = 0;
  while (f && fgets(line, sizeof line, f)) {
    if (line[0] == '#' || line[0] == '\n') continue;
    int before = test_failures;
    invalid_case(dir, line);
    printf("%-22s %s\n", strtok(line, " "), test_failures == before ? "fails as listed" : "FAILED");
    bad++;
  }
  if (f) fclose(f);
  CHECK(bad >= 20, "invalid.txt lists only %d cases", bad);
  return test_exit("test_codec_golden");
}
