/*
 * fuzz_record.c - libFuzzer target for nwc_record_read (tensor records are bytes from outside).
 *
 * Each input is parsed twice: as it is (almost always stopped by the length or checksum check),
 * and with the checksum recomputed (docs/format.md, "Tensor record": XXH3-64 of bytes [72, end)
 * seeded with XXH3-64 of bytes [0, 64)), so that mutated headers and arrays reach validation and
 * the decoders.  Whatever the parser accepts is decoded: dequant, gather and matvec, with outputs
 * sized from the tensor's shape.  A crash or sanitizer report is a bug; error returns are fine.
 * Built as a real fuzzer with clang (tests/fuzz/README.md) and replayed over the corpus by
 * fuzz_replay under ctest.
 */
#include "nwc.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define RECORD_HEADER 72
#define MAX_OUT (UINT64_C(1) << 22) /* decoded elements the target allocates at most */

static void decode(const nwc_tensor *t) {
  uint64_t M = t->rows, K16 = (t->cols + 15) / 16 * 16;
  if (M == 0 || K16 == 0 || M > MAX_OUT || K16 > MAX_OUT || M * K16 > MAX_OUT) return;
  uint16_t *out = malloc(M * K16 * 2), *yb = malloc(M * 2);
  float *x = calloc(K16, sizeof *x), *y = malloc(M * sizeof *y);
  if (out && yb && x && y) {
    for (uint64_t c = 0; c < t->cols; c++) x[c] = 1.0f / (float)(c + 1);
    (void)nwc_dequant(t, out);
    uint64_t rows[3] = {M - 1, 0, M / 2};
    (void)nwc_gather(t, rows, 3 <= M ? 3 : M, out);
    (void)nwc_matvec(t, x, NULL, y, yb);
  }
  free(out);
  free(yb);
  free(x);
  free(y);
}

static void read_and_decode(const uint8_t *buf, size_t len) {
  nwc_tensor t;
  if (nwc_record_read(buf, len, &t) == 0) {
    decode(&t);
    nwc_tensor_release(&t);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  read_and_decode(data, size);
  if (size < RECORD_HEADER) return 0;
  uint8_t *copy = malloc(size);
  if (!copy) return 0;
  memcpy(copy, data, size);
  uint64_t h = XXH3_64bits_withSeed(copy + RECORD_HEADER, size - RECORD_HEADER, XXH3_64bits(copy, 64));
  memcpy(copy + 64, &h, 8);
  read_and_decode(copy, size);
  free(copy);
  return 0;
}
