/*
 * test_codec_roundtrip.c - randomized round trips of the layout-0 codec (issue 2).
 *
 * Random shapes (most not multiples of 8, 16 or 512) with BF16 weights drawn from realistic
 * distributions (normal with per-row scales, heavy tails, sparse) and from uniform 16-bit patterns,
 * and fp8 tensors (uniform non-NaN bytes, quantized normals, with and without per-row scales).
 * Each is checked by cu_check_tensor(): dequant bit for bit against the input (fp8: against values
 * computed with ldexp), gather of random rows with repeats, matvec against an fp64 reference,
 * nwc_encode against nwc_tensor_encode, records written and read back, validate.
 */
#include "codec_util.h"

/* A dimension: small, around a block edge, or a few blocks. */
static uint64_t rand_dim(uint64_t big) {
  switch (test_below(4)) {
  case 0: return 1 + test_below(20);
  case 1: return big - 3 + test_below(7);
  case 2: return 1 + test_below(3 * big);
  default: return 1 + test_below(100);
  }
}

int main(void) {
  test_seed("test_codec_roundtrip");
  char what[160];
  for (int it = 0; it < 200; it++) {
    uint64_t M = rand_dim(NWC_BLOCK_ROWS * 2), K = rand_dim(NWC_BLOCK_COLS);
    int dist = (int)test_below(CU_NDIST);
    uint16_t *w = cu_malloc(M * K * 2);
    cu_gen_bf16(w, M, K, dist);
    float *scale = NULL;
    if (test_below(4) == 0) {
      scale = cu_malloc(M * sizeof *scale);
      for (uint64_t r = 0; r < M; r++) scale[r] = (float)ldexp(1.0 + test_uniform(), (int)test_below(9) - 4);
    }
    snprintf(what, sizeof what, "bf16 %s %llux%llu%s", cu_dist_name[dist], (unsigned long long)M,
             (unsigned long long)K, scale ? " scaled" : "");
    cu_check_tensor(w, M, K, NWC_ELEM_BF16, scale, what);
    free(w);
    free(scale);
  }
  for (int it = 0; it < 120; it++) {
    uint64_t M = rand_dim(NWC_BLOCK_ROWS * 2), K = rand_dim(NWC_BLOCK_COLS);
    int realistic = (int)test_below(2);
    uint8_t *q = cu_malloc(M * K);
    cu_gen_fp8(q, M, K, realistic);
    float *scale = NULL;
    if (test_below(2)) {
      scale = cu_malloc(M * sizeof *scale);
      for (uint64_t r = 0; r < M; r++) scale[r] = (float)(test_uniform() * 0.01 + 1e-4);
    }
    snprintf(what, sizeof what, "fp8 %s %llux%llu%s", realistic ? "quantized" : "bytes",
             (unsigned long long)M, (unsigned long long)K, scale ? " scaled" : "");
    cu_check_tensor(q, M, K, NWC_ELEM_FP8, scale, what);
    free(q);
    free(scale);
  }
  return test_exit("test_codec_roundtrip");
}
