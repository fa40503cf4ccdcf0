/*
 * test_layout_codec.c - layouts 1 and 2, BF16 and fp8, at every CPU implementation level this
 * machine has (portable, SSSE3, AVX2): the shapes of issue 2 (1x1, 7x13, 8x512, 9x513, 16x11008,
 * 151936x64), several weight distributions, all-equal tensors, every BF16 bit pattern (zeros of
 * both signs, subnormals, infinities, all NaNs) among normal weights, every fp8 byte, and the
 * layout-2 exception limit (255 per lane and block fit, 256 are -ERANGE).  Each tensor is checked
 * against its input (layout_util.h: dequant bit for bit, ranges, gather, matvec and batches
 * against fp64, records).
 */
#include "layout_util.h"

static void shapes(int level, unsigned layout, unsigned type) {
  static const uint64_t shape[][2] = {{1, 1},   {7, 13},     {8, 512},    {9, 513},
                                      {16, 11008}, {33, 1040}, {151936, 64}};
  for (size_t s = 0; s < sizeof shape / sizeof shape[0]; s++) {
    uint64_t M = shape[s][0], K = shape[s][1];
    if (M * K > 2000000 && level != 0 && level + 1 != lu_levels()) continue; /* big: 2 levels */
    int ndist = M * K > 2000000 ? 1 : (type == NWC_ELEM_BF16 ? 3 : 2);
    for (int dist = 0; dist < ndist; dist++) {
      char what[160];
      snprintf(what, sizeof what, "%s layout %u %s %llux%llu dist %d", lu_level_env[level], layout,
               type == NWC_ELEM_BF16 ? "bf16" : "fp8", (unsigned long long)M,
               (unsigned long long)K, dist);
      void *w = cu_malloc(M * K * 2);
      float *scale = NULL;
      if (type == NWC_ELEM_BF16) {
        cu_gen_bf16(w, M, K, dist == 0 ? CU_NORMAL : dist == 1 ? CU_HEAVY : CU_SPARSE);
      } else {
        cu_gen_fp8(w, M, K, dist == 0);
        scale = cu_malloc(M * sizeof *scale);
        for (uint64_t r = 0; r < M; r++) scale[r] = (float)(0.01 + test_uniform());
      }
      lu_check_tensor(w, M, K, type, layout, scale, M * K > 2000000 ? 1 : 3, what);
      free(w);
      free(scale);
    }
  }
}

/* Every one of the 65536 BF16 patterns once, at random places among normal weights (so that
 * layout 2's exceptions stay below 255 per lane). */
static void all_bf16_patterns(int level, unsigned layout) {
  uint64_t M = 256, K = 2048, n = M * K;
  uint16_t *w = cu_malloc(n * 2);
  cu_gen_bf16(w, M, K, CU_NORMAL);
  uint64_t *pos = cu_malloc(n * sizeof *pos);
  for (uint64_t i = 0; i < n; i++) pos[i] = i;
  for (uint64_t i = 0; i < 65536; i++) { /* partial Fisher-Yates: 65536 distinct positions */
    uint64_t j = i + test_below(n - i), tmp = pos[i];
    pos[i] = pos[j], pos[j] = tmp;
    w[pos[i]] = (uint16_t)i;
  }
  char what[96];
  snprintf(what, sizeof what, "%s layout %u bf16 all patterns", lu_level_env[level], layout);
  lu_check_tensor(w, M, K, NWC_ELEM_BF16, layout, NULL, 1, what);
  free(pos);
  free(w);
}

static void all_equal(int level, unsigned layout) {
  uint64_t M = 37, K = 700;
  uint16_t *w = cu_malloc(M * K * 2);
  uint16_t v = (uint16_t)test_rand();
  uint8_t q;
  do q = (uint8_t)test_rand();
  while ((q & 0x7f) == 0x7f);
  for (uint64_t i = 0; i < M * K; i++) w[i] = v;
  char what[96];
  snprintf(what, sizeof what, "%s layout %u bf16 all 0x%04x", lu_level_env[level], layout, v);
  lu_check_tensor(w, M, K, NWC_ELEM_BF16, layout, NULL, 1, what);
  memset(w, q, M * K);
  snprintf(what, sizeof what, "%s layout %u fp8 all 0x%02x", lu_level_env[level], layout, q);
  lu_check_tensor(w, M, K, NWC_ELEM_FP8, layout, NULL, 1, what);
  free(w);
}

/*
 * Layout 2's limit: block 0 (16 x 512) holds one symbol that is rarer than the seven of the other
 * eight blocks, so all of it is exceptions: 256 per lane is -ERANGE; with one common weight per
 * lane (its first: super-chunk 0, j = 0) 255 fit and decode exactly.
 */
static void exception_limit(int level, unsigned type) {
  uint64_t M = 16, K = 512 * 9;
  uint16_t *w16 = cu_malloc(M * K * 2);
  uint8_t *w8 = (uint8_t *)w16;
  /* BF16: rare exponent byte 0x10, common 0x38..0x3e; fp8: rare 0x01 (2^-9), common e = 4..10 */
  for (uint64_t r = 0; r < M; r++)
    for (uint64_t c = 0; c < K; c++) {
      unsigned sign = (unsigned)test_below(2), common = (unsigned)((r * K + c) % 7);
      if (type == NWC_ELEM_BF16)
        w16[r * K + c] = (uint16_t)(sign << 15 | (c < 512 ? 0x10u : 0x38u + common) << 8 |
                                    test_below(256));
      else
        w8[r * K + c] = (uint8_t)(sign << 7 | (c < 512 ? 0x01u : (4 + common) << 3 | test_below(8)));
    }
  nwc_tensor t;
  int rc = nwc_tensor_encode(type == NWC_ELEM_BF16 ? (void *)w16 : (void *)w8, M, K,
                             NWC_ELEM(type, 2), NULL, &t);
  CHECK(rc == -ERANGE, "%s %s: 256 exceptions in a lane gave %d, not -ERANGE", lu_level_env[level],
        type == NWC_ELEM_BF16 ? "bf16" : "fp8", rc);
  if (rc == 0) nwc_tensor_release(&t);
  uint64_t *bases = cu_malloc(10 * 8);
  uint8_t psym[16], hdr[9 * 32];
  CHECK(nwc_encode(type == NWC_ELEM_BF16 ? (void *)w16 : (void *)w8, M * K, K, NWC_ELEM(type, 2),
                   NULL, psym, bases, hdr, NULL, 0, NULL) == -ERANGE,
        "nwc_encode: 256 exceptions in a lane are not -ERANGE");
  for (unsigned L = 0; L < 32; L++) { /* lane L, super-chunk 0, j = 0: row L >> 2, column 8 (L & 3) */
    uint64_t i = (L >> 2) * K + 8 * (L & 3);
    if (type == NWC_ELEM_BF16)
      w16[i] = (uint16_t)(0x3900u | (w16[i] & 0xffu));
    else
      w8[i] = (uint8_t)(5u << 3 | (w8[i] & 7u));
  }
  char what[96];
  snprintf(what, sizeof what, "%s layout 2 %s 255 exceptions per lane", lu_level_env[level],
           type == NWC_ELEM_BF16 ? "bf16" : "fp8");
  lu_check_tensor(type == NWC_ELEM_BF16 ? (void *)w16 : (void *)w8, M, K, type, 2, NULL, 2, what);
  rc = nwc_tensor_encode(type == NWC_ELEM_BF16 ? (void *)w16 : (void *)w8, M, K, NWC_ELEM(type, 2),
                         NULL, &t);
  if (rc == 0) {
    unsigned most = 0;
    for (unsigned L = 0; L < 32; L++) most = t.hdr[L] > most ? t.hdr[L] : most;
    CHECK(most == 255, "%s: block 0 has at most %u exceptions per lane, expected 255", what, most);
    nwc_tensor_release(&t);
  }
  free(bases);
  free(w16);
}

static void fp8_nan(unsigned layout) {
  uint8_t w[40];
  for (int i = 0; i < 40; i++) w[i] = (uint8_t)(test_below(0x7f));
  w[test_below(40)] = test_below(2) ? 0x7f : 0xff;
  nwc_tensor t;
  CHECK(nwc_tensor_encode(w, 4, 10, NWC_ELEM(NWC_ELEM_FP8, layout), NULL, &t) == -EINVAL,
        "layout %u: an fp8 NaN is not -EINVAL", layout);
}

int main(void) {
  test_seed("test_layout_codec");
  int levels = lu_levels();
  printf("CPU levels: %d (best %s)\n", levels, lu_level_env[levels - 1]);
  for (int level = 0; level < levels; level++) {
    lu_set_level(level);
    for (unsigned layout = 1; layout <= 2; layout++) {
      shapes(level, layout, NWC_ELEM_BF16);
      shapes(level, layout, NWC_ELEM_FP8);
      all_bf16_patterns(level, layout);
      all_equal(level, layout);
    }
    exception_limit(level, NWC_ELEM_BF16);
    exception_limit(level, NWC_ELEM_FP8);
    printf("level %s done, %d failures so far\n", lu_level_env[level], test_failures);
  }
  fp8_nan(1);
  fp8_nan(2);
  return test_exit("test_layout_codec");
}
