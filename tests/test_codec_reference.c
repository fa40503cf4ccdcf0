/*
 * test_codec_reference.c - the codec against an independent encoder and decoder written from
 * docs/format.md (layout 0) alone, one bit at a time, sharing no code with store/.
 *
 * 1. Encoder: for random tensors (both element types, shapes around the block edges) the
 *    reference's psym, bases, hdr, data (with the slack) and raw plane equal nwc_tensor_encode's
 *    byte for byte, and the reference decoder returns the input.
 * 2. Decoder, differentially: valid tensors whose stream bits are flipped, replaced by random
 *    bits, or re-cut into random lane lengths (0..192 units, offsets rechained as the format says)
 *    are decoded by both.  nwc_dequant and nwc_matvec must succeed exactly when the reference
 *    does (the format: every code valid -- fp8 ranks <= 9, at most 15 leading zeros -- and no lane
 *    using more than 16 hdr bits), with the same weights; nwc_gather of each row likewise, where
 *    only the rows up to the requested one count.
 * 3. Hand-built fp8 streams around the rank limit (rank 9 valid, rank 10 an error wherever it
 *    sits in the table window).
 */
#include "codec_util.h"

/* ---- the reference encoder ---------------------------------------------------------------- */

typedef struct ref_tensor {
  uint64_t M, K, K16, RB, CB, NB;
  unsigned type;
  uint8_t psym[16];
  uint64_t *bases;
  uint8_t *hdr, *data, *raw;
  uint64_t data_bytes, raw_bytes;
} ref_tensor;

/* fp8 split, from the table in docs/format.md section 3. */
static void ref_fp8(uint8_t b, unsigned *sym, unsigned *B, unsigned *nib) {
  unsigned e = (b >> 3) & 15, m = b & 7;
  static const unsigned small_nib[4] = {0, 0, 8, 12};
  if (e) *sym = e >> 1, *nib = (e & 1) << 3 | m;
  else if (m >= 4) *sym = 0, *nib = (m - 4) << 1;
  else if (m) *sym = 8, *nib = small_nib[m];
  else *sym = 9, *nib = 0;
  *B = *sym < 8 ? 60 + *sym : *sym == 8 ? 59 : 0;
}

static const uint64_t *sort_counts;
static int by_count(const void *a, const void *b) {
  unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
  if (sort_counts[x] != sort_counts[y]) return sort_counts[x] > sort_counts[y] ? -1 : 1;
  return x < y ? -1 : 1;
}

/* A growing array of bits, one per byte. */
typedef struct bitvec {
  uint8_t *b;
  size_t n, cap;
} bitvec;

static void put_bits(bitvec *v, uint32_t val, unsigned len) {
  for (unsigned i = len; i-- > 0;) {
    if (v->n == v->cap && !(v->b = realloc(v->b, v->cap = v->cap ? 2 * v->cap : 4096))) exit(1);
    v->b[v->n++] = (uint8_t)((val >> i) & 1u);
  }
}

static void ref_encode(const void *w, uint64_t M, uint64_t K, unsigned type, ref_tensor *t) {
  memset(t, 0, sizeof *t);
  t->M = M, t->K = K, t->type = type, t->K16 = (K + 15) / 16 * 16;
  t->RB = (M + 7) / 8, t->CB = (K + 511) / 512, t->NB = t->RB * t->CB;
  const uint16_t *w16 = w;
  const uint8_t *w8 = w;
  unsigned nsym = type == NWC_ELEM_BF16 ? 128 : 10, order[128], rank_of[128];
  uint64_t counts[128] = {0};
  for (uint64_t i = 0; i < M * K; i++) {
    unsigned s, B, nib;
    if (type == NWC_ELEM_BF16) s = (w16[i] >> 8) & 0x7f;
    else ref_fp8(w8[i], &s, &B, &nib);
    counts[s]++;
  }
  for (unsigned s = 0; s < nsym; s++) order[s] = s;
  sort_counts = counts;
  qsort(order, nsym, sizeof order[0], by_count);
  for (unsigned r = 0; r < nsym; r++) rank_of[order[r]] = r;
  for (unsigned r = 0; r < (type == NWC_ELEM_BF16 ? 15u : 10u); r++) {
    unsigned s = order[r]; /* fp8: B(symbol) from the table */
    t->psym[r] = (uint8_t)(type == NWC_ELEM_BF16 ? s : s < 8 ? 60 + s : s == 8 ? 59 : 0);
  }
  t->bases = cu_malloc((t->NB + 1) * 8);
  t->hdr = calloc(t->NB * 32, 1);
  bitvec data = {0};
  t->bases[0] = 0;
  for (uint64_t b = 0; b < t->NB; b++) {
    uint64_t rb = b / t->CB, cb = b % t->CB, rows = M - 8 * rb < 8 ? M - 8 * rb : 8;
    uint64_t active = (t->K16 - 512 * cb) / 16 < 32 ? (t->K16 - 512 * cb) / 16 : 32;
    size_t start = data.n;
    for (uint64_t L = 0; L < active; L++) {
      size_t lane_start = data.n;
      for (uint64_t i = 0; i < rows; i++)
        for (uint64_t j = 0; j < 16; j++) {
          uint64_t r = 8 * rb + i, c = 512 * cb + 16 * L + j;
          if (c >= K) {
            put_bits(&data, 2, 2); /* filler: rank 0, sign 0 */
            continue;
          }
          unsigned s, B, nib, sign, h;
          if (type == NWC_ELEM_BF16) h = w16[r * K + c] >> 8, s = h & 0x7f, sign = h >> 7;
          else ref_fp8(w8[r * K + c], &s, &B, &nib), sign = w8[r * K + c] >> 7, h = 0;
          unsigned rank = rank_of[s];
          if (type == NWC_ELEM_BF16 && rank >= 15) put_bits(&data, 1u << 8 | h, 24);
          else put_bits(&data, 2u | sign, rank + 2);
        }
      while ((data.n - lane_start) % 16) put_bits(&data, 0, 1);
      t->hdr[b * 32 + L] = (uint8_t)((data.n - lane_start) / 16);
    }
    while ((data.n - start) % 32) put_bits(&data, 0, 1);
    while ((data.n - start) % 64) put_bits(&data, 0, 1); /* 8-byte alignment */
    t->bases[b + 1] = t->bases[b] + (data.n - start) / 8;
  }
  t->data_bytes = t->bases[t->NB] + 16;
  t->data = calloc(t->data_bytes, 1);
  for (size_t k = 0; k < data.n; k++) /* bit k: bit 31 - k % 32 of little-endian word k / 32 */
    t->data[4 * (k / 32) + (31 - k % 32) / 8] |= (uint8_t)(data.b[k] << ((31 - k % 32) % 8));
  free(data.b);
  t->raw_bytes = type == NWC_ELEM_BF16 ? M * t->K16 : M * t->K16 / 2;
  t->raw = calloc(t->raw_bytes, 1);
  for (uint64_t r = 0; r < M; r++)
    for (uint64_t c = 0; c < K; c++) {
      if (type == NWC_ELEM_BF16) {
        t->raw[r * t->K16 + c] = (uint8_t)w16[r * K + c];
      } else {
        unsigned s, B, nib, j = (unsigned)(c % 16);
        ref_fp8(w8[r * K + c], &s, &B, &nib);
        t->raw[r * t->K16 / 2 + 8 * (c / 16) + (j & 3) + 4 * (j >> 3)] |= (uint8_t)(nib << (j & 4 ? 4 : 0));
      }
    }
}

static void ref_free(ref_tensor *t) {
  free(t->bases);
  free(t->hdr);
  free(t->data);
  free(t->raw);
}

/* ---- the reference decoder ---------------------------------------------------------------- */

/*
 * Decodes rows 0 .. last of every block of row block rb (last < rows(rb)) of t into out (row 0 of
 * the row block first, K16 per row).  Returns 0, or -EBADMSG for an invalid code or a lane that
 * needs bits beyond its 16 hdr bits.  Assumes offsets and lengths that fit the data (the tests
 * keep them so).
 */
static int ref_decode_rows(const nwc_tensor *t, uint64_t rb, uint64_t last, uint16_t *out) {
  uint64_t K16 = cu_k16(t->cols), CB = (t->cols + 511) / 512;
  unsigned type = NWC_ELEM_TYPE(t->elem);
  for (uint64_t cb = 0; cb < CB; cb++) {
    uint64_t b = rb * CB + cb, active = (K16 - 512 * cb) / 16 < 32 ? (K16 - 512 * cb) / 16 : 32;
    const uint8_t *blk = t->data + t->bases[b];
    uint64_t unit = 0;
    for (uint64_t L = 0; L < active; L++) {
      uint64_t pos = 16 * unit, end = 16 * (unit + t->hdr[b * 32 + L]);
      unit += t->hdr[b * 32 + L];
#define BIT() (pos < end ? (blk[4 * (pos / 32) + (31 - pos % 32) / 8] >> ((31 - pos % 32) % 8) & 1u) : 2u)
      for (uint64_t i = 0; i <= last; i++)
        for (uint64_t j = 0; j < 16; j++) {
          unsigned z = 0, bit, h;
          while ((bit = BIT()) == 0 && z < 16) z++, pos++;
          if (bit == 2 || z >= 16) return -EBADMSG; /* past the lane, or 16 zeros */
          pos++;
          if (type == NWC_ELEM_FP8 && z >= 10) return -EBADMSG;
          if (z == 15) { /* BF16 escape: the whole byte */
            h = 0;
            for (int k = 0; k < 8; k++, pos++) {
              if ((bit = BIT()) == 2) return -EBADMSG;
              h = h << 1 | bit;
            }
          } else {
            if ((bit = BIT()) == 2) return -EBADMSG;
            pos++;
            h = bit << 7 | t->psym[z];
          }
          uint64_t r = 8 * rb + i, c = 512 * cb + 16 * L + j;
          unsigned lo;
          if (type == NWC_ELEM_BF16) {
            lo = t->raw[r * K16 + c];
          } else {
            unsigned jj = (unsigned)j, byte = t->raw[r * K16 / 2 + 8 * (c / 16) + (jj & 3) + 4 * (jj >> 3)];
            lo = ((jj & 4 ? byte >> 4 : byte) & 15u) << 4;
          }
          out[i * K16 + c] = (uint16_t)(h << 8 | lo);
        }
#undef BIT
    }
  }
  return 0;
}

static int ref_dequant(const nwc_tensor *t, uint16_t *out) {
  uint64_t K16 = cu_k16(t->cols), RB = (t->rows + 7) / 8;
  for (uint64_t rb = 0; rb < RB; rb++) {
    uint64_t rows = t->rows - 8 * rb < 8 ? t->rows - 8 * rb : 8;
    int rc = ref_decode_rows(t, rb, rows - 1, out + 8 * rb * K16);
    if (rc) return rc;
  }
  return 0;
}

/* ---- checks ------------------------------------------------------------------------------- */

static void gen_input(void *w, uint64_t M, uint64_t K, unsigned type) {
  if (type == NWC_ELEM_BF16) cu_gen_bf16(w, M, K, (int)test_below(CU_NDIST));
  else cu_gen_fp8(w, M, K, (int)test_below(2));
}

static uint64_t rand_dim(uint64_t edge) {
  return test_below(2) ? 1 + test_below(3 * edge) : edge - 2 + test_below(5);
}

static void encoder_matches(int trials) {
  char what[96];
  for (int it = 0; it < trials; it++) {
    unsigned type = it % 2 ? NWC_ELEM_FP8 : NWC_ELEM_BF16;
    uint64_t M = rand_dim(8), K = rand_dim(512);
    void *w = cu_malloc(M * K * 2);
    gen_input(w, M, K, type);
    snprintf(what, sizeof what, "reference encoder, %s %llux%llu", type ? "fp8" : "bf16",
             (unsigned long long)M, (unsigned long long)K);
    ref_tensor r;
    ref_encode(w, M, K, type, &r);
    nwc_tensor t;
    int rc = nwc_tensor_encode(w, M, K, NWC_ELEM(type, 0), NULL, &t);
    CHECK(rc == 0, "%s: nwc_tensor_encode: %s", what, nwc_error_detail());
    if (rc == 0) {
      CHECK(t.nblocks == r.NB && !memcmp(t.psym, r.psym, 16), "%s: psym or block count differ", what);
      CHECK(t.nblocks == r.NB && !memcmp(t.bases, r.bases, (r.NB + 1) * 8), "%s: bases differ", what);
      CHECK(t.nblocks == r.NB && !memcmp(t.hdr, r.hdr, r.NB * 32), "%s: hdr differs", what);
      CHECK(t.data_bytes == r.data_bytes && !memcmp(t.data, r.data, r.data_bytes), "%s: data differs",
            what);
      CHECK(t.raw_bytes == r.raw_bytes && !memcmp(t.raw, r.raw, r.raw_bytes), "%s: raw plane differs",
            what);
      uint16_t *e = cu_expected(w, M, K, type, t.psym[0]), *o = cu_malloc(M * cu_k16(K) * 2);
      CHECK(ref_dequant(&t, o) == 0, "%s: reference decoder fails on a valid tensor", what);
      cu_same16(o, e, M * cu_k16(K), cu_k16(K), "reference decoder vs input");
      free(e);
      free(o);
      nwc_tensor_release(&t);
    }
    ref_free(&r);
    free(w);
  }
}

/* Both decoders on t: same success, same weights; gather row by row; matvec's status. */
static void compare_decoders(const nwc_tensor *t, const char *what) {
  uint64_t M = t->rows, K16 = cu_k16(t->cols);
  uint16_t *a = cu_malloc(M * K16 * 2), *b = cu_malloc(M * K16 * 2), *row = cu_malloc(K16 * 2);
  memset(a, 0, M * K16 * 2);
  memset(b, 0, M * K16 * 2);
  int rr = ref_dequant(t, a), rc = nwc_dequant(t, b);
  CHECK((rr == 0) == (rc == 0), "%s: reference %s, nwc_dequant %s (%s)", what, rr ? "fails" : "decodes",
        rc ? "fails" : "decodes", rc ? nwc_error_detail() : "");
  CHECK(rc == 0 || rc == -EBADMSG, "%s: nwc_dequant returned %d", what, rc);
  if (rr == 0 && rc == 0) cu_same16(b, a, M * K16, K16, what);
  float *x = cu_malloc(K16 * 4), *y = cu_malloc(M * 4);
  for (uint64_t c = 0; c < K16; c++) x[c] = c < t->cols ? 1.0f : 0.0f;
  int mv = nwc_matvec(t, x, NULL, y, NULL);
  CHECK((mv == 0) == (rr == 0), "%s: matvec %s where the reference %s", what, mv ? "fails" : "decodes",
        rr ? "fails" : "decodes");
  for (uint64_t r = 0; r < M; r++) {
    uint16_t *ref_rows = cu_malloc(8 * K16 * 2);
    int gr = ref_decode_rows(t, r / 8, r % 8, ref_rows), gc = nwc_gather(t, &r, 1, row);
    if ((gr == 0) != (gc == 0)) {
      CHECK(0, "%s: row %llu: reference %s, nwc_gather %s", what, (unsigned long long)r,
            gr ? "fails" : "decodes", gc ? "fails" : "decodes");
    } else if (gr == 0 && memcmp(row, ref_rows + (r % 8) * K16, K16 * 2)) {
      CHECK(0, "%s: gathered row %llu differs from the reference", what, (unsigned long long)r);
    }
    free(ref_rows);
  }
  free(a);
  free(b);
  free(row);
  free(x);
  free(y);
}

static uint64_t decoded_both, failed_both;

static void decoder_matches(int trials) {
  char what[128];
  for (int it = 0; it < trials; it++) {
    unsigned type = it % 2 ? NWC_ELEM_FP8 : NWC_ELEM_BF16;
    uint64_t M = 1 + test_below(20), K = 1 + test_below(700);
    void *w = cu_malloc(M * K * 2);
    gen_input(w, M, K, type);
    nwc_tensor t;
    CHECK_RC(nwc_tensor_encode(w, M, K, NWC_ELEM(type, 0), NULL, &t));
    free(w);
    /* exactly sized copies to mutate */
    uint64_t nb = t.nblocks, *bases = cu_malloc((nb + 1) * 8);
    uint8_t *hdr = cu_malloc(nb * 32);
    memcpy(bases, t.bases, (nb + 1) * 8);
    memcpy(hdr, t.hdr, nb * 32);
    uint64_t data_bytes = t.data_bytes;
    uint8_t *data = cu_malloc(data_bytes);
    memcpy(data, t.data, data_bytes);
    int mode = (int)test_below(3);
    if (mode == 2) { /* random lane lengths, offsets rechained, random bits */
      uint64_t K16 = cu_k16(K);
      for (uint64_t b = 0; b < nb; b++) {
        uint64_t cb = b % ((K + 511) / 512), active = (K16 - 512 * cb) / 16 < 32 ? (K16 - 512 * cb) / 16 : 32;
        uint64_t u = 0;
        for (uint64_t L = 0; L < 32; L++) {
          uint8_t v = L < active ? (uint8_t)(test_below(2) ? hdr[b * 32 + L] + test_below(5) - 2
                                                           : test_below(193))
                                 : 0;
          hdr[b * 32 + L] = v > 192 ? 192 : v;
          u += hdr[b * 32 + L];
        }
        bases[b + 1] = bases[b] + (4 * ((u + 1) / 2) + 7) / 8 * 8;
      }
      free(data);
      data_bytes = bases[nb] + 16;
      data = cu_malloc(data_bytes);
      for (uint64_t i = 0; i < data_bytes; i++) data[i] = (uint8_t)test_rand();
    } else if (mode == 1) { /* every stream bit random */
      for (uint64_t i = 0; i < bases[nb]; i++) data[i] = (uint8_t)test_rand();
    } else { /* a few flipped bits */
      for (int k = 1 + (int)test_below(6); k > 0; k--)
        data[test_below(bases[nb])] ^= (uint8_t)(1u << test_below(8));
    }
    nwc_tensor m = t;
    m.bases = bases, m.hdr = hdr, m.data = data, m.data_bytes = data_bytes, m.owned = NULL;
    snprintf(what, sizeof what, "%s %llux%llu, %s", type ? "fp8" : "bf16", (unsigned long long)M,
             (unsigned long long)K, mode == 2 ? "random lane lengths" : mode ? "random bits" : "bit flips");
    compare_decoders(&m, what);
    uint16_t *probe = cu_malloc(M * cu_k16(K) * 2);
    int ok = ref_dequant(&m, probe) == 0;
    free(probe);
    decoded_both += ok;
    failed_both += !ok;
    free(bases);
    free(hdr);
    free(data);
    nwc_tensor_release(&t);
  }
}

/*
 * A 1 x 16 fp8 tensor whose single lane stream is `code` followed by fillers up to 16 codes (the
 * caller says how many codes `code` holds).  Returns what nwc_dequant says; *first gets weight 0.
 */
static int hand_fp8(const char *code, unsigned ncodes, uint16_t *first) {
  static const uint8_t psym[16] = {60, 61, 62, 63, 64, 65, 66, 67, 0, 59};
  bitvec v = {0};
  for (const char *c = code; *c; c++) put_bits(&v, (uint32_t)(*c - '0'), 1);
  for (unsigned k = ncodes; k < 16; k++) put_bits(&v, 2, 2);
  while (v.n % 16) put_bits(&v, 0, 1);
  uint8_t hdr[32] = {0}, data[64] = {0}, raw[8] = {0};
  hdr[0] = (uint8_t)(v.n / 16);
  uint64_t bases[2] = {0, (4 * ((hdr[0] + 1u) / 2) + 7) / 8 * 8};
  for (size_t k = 0; k < v.n; k++)
    data[4 * (k / 32) + (31 - k % 32) / 8] |= (uint8_t)(v.b[k] << ((31 - k % 32) % 8));
  free(v.b);
  nwc_tensor t = {0};
  t.elem = NWC_ELEM(NWC_ELEM_FP8, 0), t.rows = 1, t.cols = 16, t.nblocks = 1;
  memcpy(t.psym, psym, 16);
  t.bases = bases, t.hdr = hdr, t.data = data, t.data_bytes = bases[1] + 16, t.raw = raw;
  t.raw_bytes = 8;
  CHECK(nwc_tensor_validate(&t) == 0, "hand-built fp8 stream %s: validate: %s", code, nwc_error_detail());
  uint16_t out[16] = {0};
  int rc = nwc_dequant(&t, out);
  uint64_t row = 0;
  uint16_t g[16];
  float x[16] = {1}, y;
  CHECK(nwc_gather(&t, &row, 1, g) == rc && nwc_matvec(&t, x, NULL, &y, NULL) == rc,
        "hand-built fp8 stream %s: gather or matvec disagree with dequant (%d)", code, rc);
  *first = out[0];
  return rc;
}

/* fp8 ranks 9 and 10 at the start of a table window and one code later (docs/format.md 4: a rank
 * >= 10 in an fp8 stream is -EBADMSG, wherever it sits). */
static void fp8_rank_limit(void) {
  uint16_t w = 0;
  CHECK(hand_fp8("00000000010", 1, &w) == 0 && w == 59u << 8, "fp8 rank 9 first: weight 0x%04x", w);
  CHECK(hand_fp8("1000000000010", 2, &w) == 0, "fp8 rank 9 second fails");
  CHECK(hand_fp8("000000000010", 1, &w) == -EBADMSG, "fp8 rank 10 at a window start accepted");
  CHECK(hand_fp8("10000000000010", 2, &w) == -EBADMSG, "fp8 rank 10 after a filler accepted");
  CHECK(hand_fp8("0000000000010", 1, &w) == -EBADMSG, "fp8 rank 11 accepted");
  CHECK(hand_fp8("00000000000000000", 1, &w) == -EBADMSG, "fp8 16 zeros accepted");
}

int main(void) {
  test_seed("test_codec_reference");
  fp8_rank_limit();
  encoder_matches(80);
  decoder_matches(600);
  printf("mutated streams: %llu decodable, %llu rejected (by the reference)\n",
         (unsigned long long)decoded_both, (unsigned long long)failed_both);
  return test_exit("test_codec_reference");
}
