/*
 * test_l1_decode.c - layout 1's GPU decode, run on the CPU (l1_decode_host.cu runs the kernels'
 * __host__ __device__ lane decoder, slot by slot into A registers), against nwc_dequant, on fresh
 * random tensors each run (seed printed; NWC_SEED replays).  Needs no GPU: it is what says, before
 * a GPU run, that the kernels' decode of layout 1 is right.
 *
 * Per tensor, BF16 and its fp8 quantization: every weight of the decode equals nwc_dequant's, with
 * the stream buffers of the kernels' size (blocks staged) and of none (blocks read from data),
 * and no lane reads past its buffer or the data.  Weight kinds: normal with log-normal row scales
 * and heavy tails, all-equal, and (BF16) an escaped weight on every lane of every block.  Shapes:
 * fixed ones with partial row groups and last column blocks of 1 .. 16 slots, and random ones.
 */
#include "kernel_weights.h"
#include "nwc.h"
#include "test_util.h"

#include <math.h>

#define NAME "test_l1_decode"

int nwc_test_l1_decode(const nwc_tensor *t, uint32_t cap, uint16_t *out);

/* The stream buffer of the matvec of one column (BF16), about what the kernels have. */
#define KERNEL_CAP 4352

static void check(const char *label, const void *w, uint64_t M, uint64_t K, unsigned type, const float *scale,
                  int escapes) {
  nwc_tensor t;
  int rc = nwc_tensor_encode(w, M, K, NWC_ELEM(type, 1), scale, &t);
  CHECK_RC(rc);
  if (rc < 0) return;
  if (escapes && M * K >= 64) { /* the rare bytes are escaped: none of them has a rank */
    int ranked = 0;
    for (unsigned r = 0; r < 15; r++) ranked += t.psym[r] >= 0x10 && t.psym[r] < 0x24;
    CHECK(ranked == 0, "%s: %d rare bytes have ranks", label, ranked);
  }
  const uint64_t K16 = (K + 15) / 16 * 16;
  uint16_t *want = malloc(M * K16 * 2), *got = malloc(M * K16 * 2);
  CHECK_RC(nwc_dequant(&t, want));
  static const uint32_t caps[] = {KERNEL_CAP, 0};
  for (unsigned c = 0; c < 2; c++) {
    memset(got, 0xff, M * K16 * 2);
    rc = nwc_test_l1_decode(&t, caps[c], got);
    CHECK(rc == 0, "%s: decode with a %u-byte stream buffer: %d", label, caps[c], rc);
    uint64_t diff = 0, first = 0;
    for (uint64_t i = 0; i < M * K16; i++)
      if (got[i] != want[i] && !diff++) first = i;
    CHECK(diff == 0, "%s (buffer %u): %llu of %llu weights differ, first (%llu, %llu): 0x%04x, want 0x%04x", label,
          caps[c], (unsigned long long)diff, (unsigned long long)(M * K16), (unsigned long long)(first / K16),
          (unsigned long long)(first % K16), got[first], want[first]);
  }
  free(want), free(got);
  nwc_tensor_release(&t);
}

static void check_shape(uint64_t M, uint64_t K) {
  float *scale = malloc(M * sizeof *scale);
  uint8_t *q = malloc(M * K);
  for (int k = REAL; k <= ESCAPES; k++) {
    char label[96];
    uint16_t *w = make_bf16(M, K, (enum kind)k);
    snprintf(label, sizeof label, "%s %llux%llu bf16", kind_name[k], (unsigned long long)M, (unsigned long long)K);
    check(label, w, M, K, NWC_ELEM_BF16, NULL, k == ESCAPES);
    if (k != ESCAPES) {
      CHECK_RC(nwc_quantize_fp8(w, M, K, q, scale));
      snprintf(label, sizeof label, "%s %llux%llu fp8", kind_name[k], (unsigned long long)M, (unsigned long long)K);
      check(label, q, M, K, NWC_ELEM_FP8, scale, 0);
    }
    free(w);
  }
  free(scale), free(q);
}

int main(void) {
  test_seed(NAME);
  /* last column blocks of 16, 1, 8, 9, 16 slots; partial row groups; K not a multiple of 32 */
  static const uint64_t shapes[][2] = {{1, 1}, {7, 13}, {16, 512}, {17, 1040}, {33, 1000}, {9, 1537},
                                       {40, 4096}, {300, 2560}, {151, 64}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) check_shape(shapes[s][0], shapes[s][1]);
  for (int i = 0; i < 6; i++) check_shape(1 + test_below(80), 1 + test_below(2100));
  return test_exit(NAME);
}
