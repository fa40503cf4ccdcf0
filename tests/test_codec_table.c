/*
 * test_codec_table.c - nwc_build_tab against a brute-force decode of every 12-bit pattern.
 *
 * The reference lists every code word of the rank prefix code as a bit string (rank r < 15: r
 * zeros, a one, the sign; the escape: 15 zeros, a one, 8 raw bits) and finds, for each 12-bit
 * pattern, the code word that is a prefix of it, then the one that is a prefix of the rest.
 * Expected entries (docs/format.md, "Lookup table"): two complete codes -> bits used in byte 0,
 * the two bytes (sign << 7 | psym[rank]) in bytes 1 and 2, byte 3 zero; only the first complete
 * -> bit 30, its length in byte 0 and its byte in byte 1; patterns 0 and 1 -> bit 30 and
 * psym[11], psym[12] / psym[13], psym[14] in bytes 1 and 2.  psym[r] for r <= 10 is byte 1 of
 * entry 1 << (11 - r).  Checked for random exp_of_rank tables of both element types and for the
 * psym of real encodings.
 */
#include "codec_util.h"

typedef struct codeword {
  char bits[25];
  unsigned rank, sign;
} codeword;

static codeword words[2 * NWC_BF16_CODED_RANKS];

static void make_words(void) {
  for (unsigned r = 0; r < NWC_BF16_CODED_RANKS; r++)
    for (unsigned s = 0; s < 2; s++) {
      codeword *w = &words[2 * r + s];
      memset(w->bits, '0', r);
      w->bits[r] = '1';
      w->bits[r + 1] = (char)('0' + s);
      w->bits[r + 2] = 0;
      w->rank = r;
      w->sign = s;
    }
}

/* The code word that is a prefix of the bit string p, or NULL (no complete code word in p). */
static const codeword *prefix_word(const char *p) {
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
    if (!strncmp(words[i].bits, p, strlen(words[i].bits)) && strlen(words[i].bits) <= strlen(p))
      return &words[i];
  return NULL;
}

static void check_table(const uint8_t psym[16], unsigned elem, const char *what) {
  uint32_t tab[NWC_TAB_ENTRIES];
  memset(tab, 0xee, sizeof tab);
  CHECK_RC(nwc_build_tab(psym, elem, tab));
  unsigned bad = 0;
  for (unsigned p = 0; p < NWC_TAB_ENTRIES; p++) {
    char bits[13];
    for (unsigned i = 0; i < 12; i++) bits[i] = (char)('0' + ((p >> (11 - i)) & 1));
    bits[12] = 0;
    const codeword *a = prefix_word(bits), *b = a ? prefix_word(bits + strlen(a->bits)) : NULL;
    uint32_t want;
    if (p < 2)
      want = NWC_TAB_SLOW | (uint32_t)psym[11 + 2 * p] << 8 | (uint32_t)psym[12 + 2 * p] << 16;
    else if (!a)
      want = UINT32_MAX; /* impossible: every pattern >= 2 starts with a complete code */
    else if (b)
      want = (uint32_t)(strlen(a->bits) + strlen(b->bits)) |
             (uint32_t)(a->sign << 7 | psym[a->rank]) << 8 |
             (uint32_t)(b->sign << 7 | psym[b->rank]) << 16;
    else
      want = NWC_TAB_SLOW | (uint32_t)strlen(a->bits) | (uint32_t)(a->sign << 7 | psym[a->rank]) << 8;
    if (tab[p] != want && bad++ < 5)
      CHECK(0, "%s: entry 0x%03x (%s) is 0x%08x, expected 0x%08x", what, p, bits, tab[p], want);
  }
  for (unsigned r = 0; r <= 10; r++)
    CHECK(((tab[1u << (11 - r)] >> 8) & 0xffu) == psym[r], "%s: psym[%u] not in entry 0x%x", what,
          r, 1u << (11 - r));
  unsigned fast = 0;
  for (unsigned p = 0; p < NWC_TAB_ENTRIES; p++) fast += !(tab[p] & NWC_TAB_SLOW);
  /* Pairs of codes of at most 12 bits together: two signs each, 2^(12 - l0 - l1) patterns per
   * pair (4052, the format's 98.9 %). */
  unsigned want_fast = 0;
  for (unsigned l0 = 2; l0 <= 10; l0++)
    for (unsigned l1 = 2; l0 + l1 <= 12; l1++) want_fast += 4u << (12 - l0 - l1);
  CHECK(fast == want_fast, "%s: %u fast entries, expected %u", what, fast, want_fast);
}

static void random_psym(uint8_t psym[16], unsigned type) {
  uint8_t pool[128];
  unsigned n = type == NWC_ELEM_BF16 ? 128 : NWC_FP8_SYMBOLS;
  static const uint8_t fp8_bytes[NWC_FP8_SYMBOLS] = {60, 61, 62, 63, 64, 65, 66, 67, 59, 0};
  for (unsigned i = 0; i < n; i++) pool[i] = type == NWC_ELEM_BF16 ? (uint8_t)i : fp8_bytes[i];
  memset(psym, 0, 16);
  unsigned ranks = type == NWC_ELEM_BF16 ? NWC_BF16_CODED_RANKS : NWC_FP8_SYMBOLS;
  for (unsigned r = 0; r < ranks; r++) { /* partial Fisher-Yates: distinct symbols */
    unsigned j = r + (unsigned)test_below(n - r);
    uint8_t t = pool[r];
    pool[r] = pool[j];
    pool[j] = t;
    psym[r] = pool[r];
  }
}

int main(void) {
  test_seed("test_codec_table");
  make_words();
  char what[64];
  for (int it = 0; it < 40; it++) {
    unsigned type = it % 2 ? NWC_ELEM_FP8 : NWC_ELEM_BF16;
    uint8_t psym[16];
    random_psym(psym, type);
    snprintf(what, sizeof what, "random %s psym #%d", type ? "fp8" : "bf16", it);
    check_table(psym, NWC_ELEM(type, 0), what);
  }
  /* The psym of real encodings (BF16 with escapes, fp8). */
  uint64_t M = 9, K = 300;
  uint16_t *w = cu_malloc(M * K * 2);
  uint8_t *q = cu_malloc(M * K);
  cu_gen_bf16(w, M, K, CU_HEAVY);
  cu_gen_fp8(q, M, K, 1);
  nwc_tensor t;
  CHECK_RC(nwc_tensor_encode(w, M, K, NWC_ELEM(NWC_ELEM_BF16, 0), NULL, &t));
  check_table(t.psym, t.elem, "encoded bf16");
  nwc_tensor_release(&t);
  CHECK_RC(nwc_tensor_encode(q, M, K, NWC_ELEM(NWC_ELEM_FP8, 0), NULL, &t));
  check_table(t.psym, t.elem, "encoded fp8");
  nwc_tensor_release(&t);
  free(w);
  free(q);
  uint8_t psym[16] = {0};
  uint32_t tab[NWC_TAB_ENTRIES];
  CHECK(nwc_build_tab(psym, NWC_ELEM(5, 0), tab) == -EINVAL, "unknown element type accepted");
  return test_exit("test_codec_table");
}
