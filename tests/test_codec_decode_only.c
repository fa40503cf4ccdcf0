/*
 * test_codec_decode_only.c - decode never depends on encode: this program is linked against
 * nwc_codec_common and nwc_codec_decode alone, every object of both archives taken in whole
 * (tests/CMakeLists.txt), so it fails to link if any of them calls into the encoder.
 *
 * For each case of tests/golden/golden.txt it reads NAME.nwct (nwc_record_read), validates the
 * tensor again (nwc_tensor_validate), dequantizes it (nwc_dequant) and must get NAME.out exactly;
 * gather of every row must agree with it too.  No encoder is called, so this says nothing about
 * encoding: test_codec_golden freezes that.
 */
#include "nwc.h"
#include "test_util.h"

#include <errno.h>

#ifndef GOLDEN_DIR
#define GOLDEN_DIR "tests/golden"
#endif

static void golden_case(const char *dir, const char *name, uint64_t M, uint64_t K) {
  size_t rec_len = 0, out_len = 0;
  uint8_t *rec = test_slurp(dir, name, ".nwct", &rec_len);
  uint16_t *out = (uint16_t *)test_slurp(dir, name, ".out", &out_len);
  nwc_tensor t;
  int rc = rec ? nwc_record_read(rec, rec_len, &t) : -ENOENT;
  CHECK(rc == 0, "%s: nwc_record_read: %s", name, nwc_error_detail());
  if (rc < 0 || !out) goto done;
  CHECK_RC(nwc_tensor_validate(&t));
  uint64_t lay[4];
  CHECK_RC(nwc_layout(t.rows, t.cols, t.elem, lay));
  uint64_t K16 = lay[NWC_LAYOUT_K16];
  CHECK(t.rows == M && t.cols == K && out_len == M * K16 * 2,
        "%s: record is %llux%llu, .out %zu bytes; golden.txt says %llux%llu", name,
        (unsigned long long)t.rows, (unsigned long long)t.cols, out_len, (unsigned long long)M,
        (unsigned long long)K);
  if (out_len != M * K16 * 2 || t.rows != M) goto release;
  uint16_t *got = calloc(M * K16, sizeof *got), *row = calloc(K16, sizeof *row);
  CHECK(got && row, "out of memory");
  if (got && row) {
    CHECK_RC(nwc_dequant(&t, got));
    uint64_t i = 0;
    while (i < M * K16 && got[i] == out[i]) i++;
    CHECK(i == M * K16, "%s: dequant differs from %s.out at row %llu col %llu: 0x%04x, want 0x%04x",
          name, name, (unsigned long long)(i / K16), (unsigned long long)(i % K16),
          i < M * K16 ? got[i] : 0, i < M * K16 ? out[i] : 0);
    for (uint64_t r = 0; r < M; r++) {
      CHECK_RC(nwc_gather(&t, &r, 1, row));
      CHECK(!memcmp(row, out + r * K16, K16 * 2), "%s: gather of row %llu differs from %s.out",
            name, (unsigned long long)r, name);
    }
  }
  free(got);
  free(row);
release:
  nwc_tensor_release(&t);
done:
  free(rec);
  free(out);
}

int main(void) {
  test_seed("test_codec_decode_only");
  const char *src = getenv("NWC_SOURCE_DIR");
  char dir[4096], path[4200], line[512];
  if (src && *src)
    snprintf(dir, sizeof dir, "%s/tests/golden", src);
  else
    snprintf(dir, sizeof dir, "%s", GOLDEN_DIR);
  snprintf(path, sizeof path, "%s/golden.txt", dir);
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "test_codec_decode_only: cannot open %s: %s\n", path, strerror(errno));
    return 1;
  }
  int cases = 0;
  while (fgets(line, sizeof line, f)) {
    char name[256], type[16];
    unsigned long long M, K;
    if (line[0] == '#' || line[0] == '\n') continue;
    if (sscanf(line, "%255s %15s %llu %llu", name, type, &M, &K) < 4 ||
        (strcmp(type, "bf16") && strcmp(type, "fp8") && strcmp(type, "fp8q"))) {
      printf("%-22s not a decodable case, left to test_codec_golden\n", name);
      continue;
    }
    int before = test_failures;
    golden_case(dir, name, M, K);
    printf("%-22s %s\n", name, test_failures == before ? "ok" : "FAILED");
    cases++;
  }
  fclose(f);
  CHECK(cases >= 8, "golden.txt lists only %d cases", cases);
  return test_exit("test_codec_decode_only");
}
