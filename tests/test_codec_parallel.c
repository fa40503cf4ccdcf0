/*
 * test_codec_parallel.c - the layout-0 encoder on several threads (nwc__enc_*, store/encode.c)
 * writes byte for byte what the one-thread encoder (nwc_tensor_encode) writes: psym, bases, hdr,
 * data and raw plane, on random shapes (some cut into many bands), BF16 and fp8 inputs of every
 * generator, 1..8 threads; the histogram equals nwc_encode's; every tensor decodes to its input.
 * The raw plane is made in ranges at random cuts.  Read piece by piece through the callback, each
 * input byte is asked for three times (histogram, streams, raw plane; a row the raw ranges cut
 * once more per cut); an fp8 NaN in a late band is named by its row and column as by one thread;
 * a read error comes back as it is, from the first step or a later one.
 */
#include "codec_util.h"
#include "encode_internal.h"

typedef struct reader {
  const uint8_t *src;
  uint8_t *seen; /* times each byte was asked for */
  uint64_t len;
  int fail;      /* return this from the calls past len / 2 ... */
  unsigned fail_round; /* ... once they are asked for this time (1: the histogram) */
} reader;

static int read_cb(void *ctx, uint64_t off, uint64_t len, void *dst) {
  reader *r = ctx;
  if (off > r->len || len > r->len - off) return -ERANGE;
  if (r->fail && off + len > r->len / 2 && r->seen[off] + 1u >= r->fail_round) return r->fail;
  memcpy(dst, r->src + off, len);
  for (uint64_t i = off; i < off + len; i++) r->seen[i]++; /* pieces are disjoint: no race */
  return 0;
}

/* Encodes w (rows x cols, elem) on `threads` threads into fresh arrays and compares them with
 * want (nwc_tensor_encode's output); with_read: the input arrives through read_cb. */
static void check_one(const void *w, uint64_t rows, uint64_t cols, unsigned elem, unsigned threads,
                      int with_read, const nwc_tensor *want, const char *what) {
  unsigned type = NWC_ELEM_TYPE(elem);
  uint64_t ibytes = rows * cols * (type == NWC_ELEM_BF16 ? 2 : 1);
  reader r = {w, with_read ? calloc(ibytes, 1) : NULL, ibytes, 0, 0};
  uint8_t psym[16];
  uint64_t freq[128] = {0}, want_freq[128] = {0};
  nwc__enc *e = NULL;
  int rc = nwc__enc_begin(with_read ? NULL : w, rows, cols, elem, threads,
                          with_read ? read_cb : NULL, &r, freq, psym, &e);
  CHECK(rc == 0, "%s, %u threads: nwc__enc_begin: %d (%s)", what, threads, rc, nwc_error_detail());
  if (rc == 0) {
    uint64_t lay[4];
    CHECK_RC(nwc_layout(rows, cols, elem, lay));
    uint64_t nb = lay[NWC_LAYOUT_BLOCKS], bound = nwc__enc_bound(e);
    uint64_t *bases = cu_malloc((nb + 1) * 8);
    uint8_t *hdr = cu_malloc(nb * NWC_LANES), *data = cu_malloc(bound);
    uint8_t *raw = cu_malloc(lay[NWC_LAYOUT_RAW_BYTES]);
    memset(data, 0x5a, bound); /* garbage where the bands land first */
    memset(raw, 0x5a, lay[NWC_LAYOUT_RAW_BYTES]);
    int64_t db = nwc__enc_streams(e, bases, hdr, data);
    CHECK(db > 0, "%s, %u threads: streams failed", what, threads);
    /* The raw plane in up to four ranges at random cuts, on the encoder's threads in turn. */
    uint64_t rb = lay[NWC_LAYOUT_RAW_BYTES], cut[5] = {0, test_below(rb + 1), test_below(rb + 1),
                                                       test_below(rb + 1), rb};
    for (int a = 1; a < 4; a++)
      for (int b = a; b > 0 && cut[b] < cut[b - 1]; b--) {
        uint64_t x = cut[b];
        cut[b] = cut[b - 1], cut[b - 1] = x;
      }
    for (int k = 0; k < 4; k++)
      CHECK(nwc__enc_raw_range(e, cut[k], cut[k + 1], raw + cut[k], k % nwc__enc_threads(e)) == 0,
            "%s, %u threads: raw range failed", what, threads);
    uint64_t *qbases = cu_malloc((nb + 1) * 8);
    uint8_t *qhdr = cu_malloc(nb * NWC_LANES), qpsym[16];
    int64_t q = nwc_encode(w, rows * cols, cols, elem, want_freq, qpsym, qbases, qhdr, NULL, 0,
                           NULL); /* a size query: the histogram and the exact data_bytes */
    free(qbases);
    free(qhdr);
    CHECK(q == db, "%s, %u threads: data_bytes %llu, nwc_encode says %lld", what,
          threads, (unsigned long long)db, (long long)q);
    CHECK(!memcmp(freq, want_freq, sizeof freq), "%s, %u threads: histogram differs", what, threads);
    CHECK(!memcmp(psym, want->psym, 16), "%s, %u threads: psym differs", what, threads);
    CHECK(db == (int64_t)want->data_bytes && !memcmp(data, want->data, want->data_bytes), "%s, %u threads: data differs",
          what, threads);
    CHECK(!memcmp(bases, want->bases, (nb + 1) * 8), "%s, %u threads: bases differ", what, threads);
    CHECK(!memcmp(hdr, want->hdr, nb * NWC_LANES), "%s, %u threads: hdr differs", what, threads);
    CHECK(!memcmp(raw, want->raw, want->raw_bytes), "%s, %u threads: raw plane differs", what,
          threads);
    free(bases);
    free(hdr);
    free(data);
    free(raw);
  }
  nwc__enc_free(e);
  if (with_read) {
    uint64_t bad = 0;
    for (uint64_t i = 0; i < ibytes; i++) bad += r.seen[i] < 3 || r.seen[i] > 6;
    CHECK(bad == 0, "%s, %u threads: %llu input bytes not read 3 times (plus once per raw range "
          "that shares their row)", what, threads, (unsigned long long)bad);
    free(r.seen);
  }
}

static void check_shape(uint64_t rows, uint64_t cols, unsigned type, int dist, unsigned max_threads) {
  uint64_t n = rows * cols;
  void *w = cu_malloc(n * 2);
  char what[96];
  if (type == NWC_ELEM_BF16) {
    cu_gen_bf16(w, rows, cols, dist);
    snprintf(what, sizeof what, "bf16 %s %llux%llu", cu_dist_name[dist], (unsigned long long)rows,
             (unsigned long long)cols);
  } else {
    cu_gen_fp8(w, rows, cols, dist & 1);
    snprintf(what, sizeof what, "fp8 %s %llux%llu", dist & 1 ? "quantized" : "uniform",
             (unsigned long long)rows, (unsigned long long)cols);
  }
  nwc_tensor want;
  CHECK_RC(nwc_tensor_encode(w, rows, cols, NWC_ELEM(type, 0), NULL, &want));
  uint16_t *expect = cu_expected(w, rows, cols, type, want.psym[0]);
  cu_check_dequant(&want, expect, what);
  free(expect);
  for (unsigned t = 1; t <= max_threads; t++)
    check_one(w, rows, cols, NWC_ELEM(type, 0), t, t % 2 == 0, &want, what);
  nwc_tensor_release(&want);
  free(w);
}

/* An fp8 NaN in the last band: the same error and detail as nwc_tensor_encode gives. */
static void check_fp8_nan(void) {
  uint64_t rows = 1000, cols = 1100, n = rows * cols, at = n - 1 - test_below(cols * 8);
  uint8_t *w = cu_malloc(n);
  cu_gen_fp8(w, rows, cols, 0);
  w[at] = test_below(2) ? 0x7f : 0xff;
  nwc_tensor t;
  int want = nwc_tensor_encode(w, rows, cols, NWC_ELEM_FP8, NULL, &t);
  char want_detail[256];
  snprintf(want_detail, sizeof want_detail, "%s", nwc_error_detail());
  uint8_t psym[16];
  nwc__enc *e = NULL;
  int rc = nwc__enc_begin(w, rows, cols, NWC_ELEM_FP8, 4, NULL, NULL, NULL, psym, &e);
  CHECK(want == -EINVAL && rc == want && !e, "fp8 NaN: %d and %d", want, rc);
  CHECK(!strcmp(want_detail, nwc_error_detail()), "fp8 NaN: '%s', want '%s'", nwc_error_detail(),
        want_detail);
  free(w);
}

/* A failing read, in the histogram, the streams or the raw plane step: its status. */
static void check_read_error(void) {
  uint64_t rows = 800, cols = 1024, n = rows * cols;
  uint16_t *w = cu_malloc(n * 2);
  cu_gen_bf16(w, rows, cols, CU_NORMAL);
  uint64_t *bases = cu_malloc((n / 4096 + 2) * 8);
  uint8_t *hdr = cu_malloc(n / 4096 * NWC_LANES + NWC_LANES), *raw = cu_malloc(n);
  for (unsigned round = 1; round <= 3; round++) {
    reader r = {(const uint8_t *)w, calloc(n * 2, 1), n * 2, -EIO, round};
    uint8_t psym[16];
    nwc__enc *e = NULL;
    int rc = nwc__enc_begin(NULL, rows, cols, NWC_ELEM_BF16, 3, read_cb, &r, NULL, psym, &e);
    if (round > 1 && rc == 0) {
      uint8_t *data = cu_malloc(nwc__enc_bound(e));
      int64_t db = nwc__enc_streams(e, bases, hdr, data);
      rc = db < 0 ? (int)db : nwc__enc_raw_range(e, 0, n, raw, 0);
      free(data);
    }
    CHECK(rc == -EIO && (round > 1 || !e), "read error in step %u: %d", round, rc);
    nwc__enc_free(e);
    free(r.seen);
  }
  free(bases);
  free(hdr);
  free(raw);
  free(w);
}

int main(void) {
  test_seed("test_codec_parallel");
  /* Fixed shapes: one band, many bands, a ragged last row block and column block. */
  static const uint64_t fixed[][2] = {{1, 1}, {7, 13}, {8, 512}, {1000, 4100}, {2049, 1536}, {4097, 77}};
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
    for (unsigned type = 0; type < 2; type++)
      check_shape(fixed[i][0], fixed[i][1], type, (int)test_below(type ? 2 : CU_NDIST), 8);
  for (int k = 0; k < 12; k++) {
    uint64_t rows = 1 + test_below(2500), cols = 1 + test_below(k % 3 ? 1500 : 5000);
    unsigned type = (unsigned)test_below(2);
    check_shape(rows, cols, type, (int)test_below(type ? 2 : CU_NDIST), 1 + (unsigned)test_below(8));
  }
  check_fp8_nan();
  check_read_error();
  return test_exit("test_codec_parallel");
}
