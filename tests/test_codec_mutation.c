/*
 * test_codec_mutation.c - thousands of random mutations of valid encoded tensors and records; the
 * codec must answer 0 or a negative errno and never touch memory outside the arrays (run it in
 * the sanitizer build: every array is copied into an exactly sized malloc'ed buffer, so ASan
 * reports any overread or overwrite).
 *
 * Tensor mutations: elem, rows, cols, psym, nblocks, data_bytes, raw_bytes (array sizes change
 * together with the buffers behind them), bases[] entries, hdr[] stream lengths, data and raw
 * bytes, scales.  Each mutated tensor goes through every decoder at every CPU level with exactly
 * sized outputs (mutate_util.h's mu_exercise, with its properties: every answer 0 or an errno;
 * where dequant succeeds, gather, matvec and matvec_batch succeed and gather returns the
 * dequantized rows).  Besides: validate rejects every change of a field it can check exactly
 * (elem, rows, nblocks, data_bytes, raw_bytes, bases, the K16 of cols).
 *
 * Record mutations: any changed byte, truncation or extension of a record is rejected (checksum,
 * length); with the checksum recomputed (store/record.c: XXH3-64 of bytes [72, end) seeded with
 * XXH3-64 of bytes [0, 64)) header fields and array bytes reach the parser's other checks,
 * and whatever nwc_record_read accepts is decoded as above.
 */
#include "codec_util.h"
#include "mutate_util.h"

static uint64_t mutated_tensors, mutated_records, accepted_records, decoded_ok;

enum {
  F_ELEM, F_ROWS, F_COLS, F_PSYM, F_NBLOCKS, F_DATA_BYTES, F_RAW_BYTES, F_BASES, F_HDR, F_DATA,
  F_RAW, F_SCALE, F_LANES, F_COUNT
};
static const char *const field_name[F_COUNT] = {"elem",     "rows",  "cols", "psym", "nblocks",
                                                "data_bytes", "raw_bytes", "bases", "hdr",
                                                "data",     "raw",   "scale", "lane lengths"};

/* Recomputes bases[] from hdr[] the way the format chains them (docs/format.md: bases[b + 1] =
 * bases[b] + roundup8(4 ceil(U(b) / 2))) and resizes data to bases[nblocks] + 16, so that only the
 * lane lengths themselves are wrong. */
static void rechain(mtensor *m) {
  nwc_tensor *t = &m->t;
  m->bases[0] = 0;
  for (uint64_t b = 0; b < t->nblocks; b++) {
    uint64_t u = 0;
    for (unsigned l = 0; l < NWC_LANES; l++) u += m->hdr[b * NWC_LANES + l];
    m->bases[b + 1] = m->bases[b] + (4 * ((u + 1) / 2) + 7) / 8 * 8;
  }
  uint64_t n = m->bases[t->nblocks] + 16;
  replace((void **)&m->data, t->data_bytes, n);
  t->data_bytes = n;
}

/* Applies one mutation of field f to m; returns 1 if validate must now reject the tensor. */
static int mutate(mtensor *m, int f) {
  nwc_tensor *t = &m->t;
  uint64_t nb = t->nblocks;
  switch (f) {
  case F_ELEM: {
    unsigned e = test_below(2) ? t->elem ^ (1u << test_below(8)) : (unsigned)test_below(256);
    int changed = e != t->elem;
    t->elem = e;
    return changed;
  }
  case F_ROWS: {
    uint64_t r = nearby(t->rows);
    int changed = r != t->rows;
    if (m->scale && r < (1u << 20)) {
      replace((void **)&m->scale, t->rows * 4, r * 4);
    } else if (m->scale) { /* no buffer that large: drop the scales */
      free(m->scale);
      m->scale = NULL;
    }
    t->rows = r;
    return changed;
  }
  case F_COLS: {
    uint64_t c = nearby(t->cols);
    int changed = cu_k16(c) != cu_k16(t->cols) || c == 0;
    t->cols = c;
    return changed;
  }
  case F_PSYM: t->psym[test_below(16)] = (uint8_t)test_rand(); return 0;
  case F_NBLOCKS:
  case F_DATA_BYTES:
  case F_RAW_BYTES:
  case F_BASES: return mt_mutate_sizes(m, MT_NBLOCKS + f - F_NBLOCKS);
  case F_HDR: {
    /* docs/format.md: an active lane (16 L + 512 cb < K16) of a block with `rows` rows holds
     * 2 rows .. 24 rows units, an inactive one 0. */
    if (nb == 0) return 0;
    uint64_t i = test_below(nb * NWC_LANES), b = i / NWC_LANES, l = i % NWC_LANES;
    unsigned v = test_below(2) ? (unsigned)test_rand() & 255u : (m->hdr[i] + 1 + (unsigned)test_below(3)) & 255u;
    uint64_t cbs = (t->cols + 511) / 512, rb = cbs ? b / cbs : 0, cb = cbs ? b % cbs : 0;
    if (!cbs || t->rows <= 8 * rb) { /* shape already mutated: no expectation */
      m->hdr[i] = (uint8_t)v;
      return 0;
    }
    uint64_t rows = t->rows - 8 * rb < 8 ? t->rows - 8 * rb : 8;
    int active = 16 * l + 512 * cb < cu_k16(t->cols);
    int must = active ? v < 2 * rows || v > 24 * rows : v != 0;
    m->hdr[i] = (uint8_t)v;
    return must;
  }
  case F_DATA:
  case F_RAW: {
    uint8_t *p = f == F_DATA ? m->data : m->raw;
    uint64_t n = f == F_DATA ? t->data_bytes : t->raw_bytes, k = 1 + test_below(8);
    for (uint64_t j = 0; j < k && n; j++) p[test_below(n)] ^= (uint8_t)(1u << test_below(8));
    return 0;
  }
  case F_LANES: { /* lanes of one block up to 255 units, the chain of offsets kept consistent */
    if (nb == 0) return 0;
    uint64_t b = test_below(2) ? nb - 1 : test_below(nb);
    unsigned lo = test_below(2) ? 193 : 0;
    for (unsigned l = 0; l < NWC_LANES; l++)
      if (lo || test_below(4) == 0) m->hdr[b * NWC_LANES + l] = (uint8_t)(lo + test_below(256 - lo));
    rechain(m);
    return lo != 0; /* 193 units and more never fit a lane */
  }
  default: {
    if (!m->scale || t->rows == 0) return 0;
    static const float bad[] = {NAN, -1.0f, 0.0f, INFINITY};
    m->scale[test_below(t->rows)] = bad[test_below(4)];
    return 1;
  }
  }
}

/* Parses rec (copied into an exactly sized buffer); decodes what the parser accepts. */
static int read_record(const uint8_t *rec, size_t len, const char *what) {
  uint8_t *copy = resized(rec, len, len);
  nwc_tensor t;
  int rc = nwc_record_read(copy, len, &t);
  free(copy);
  CHECK(rc == 0 || rc == -EBADMSG || rc == -ENOTSUP || rc == -ENOMEM, "%s: nwc_record_read returned %d",
        what, rc);
  if (rc == 0) {
    accepted_records++;
    mu_exercise(&t, what, &decoded_ok);
    nwc_tensor_release(&t);
  }
  mutated_records++;
  return rc;
}

static void record_mutations(const nwc_tensor *base, const char *name, int trials) {
  uint8_t *rec = NULL;
  size_t len = 0;
  CHECK_RC(nwc_record_write(base, &rec, &len));
  if (!rec) return;
  char what[200];
  for (int i = 0; i < trials; i++) {
    int fix = (int)test_below(2);
    size_t n = len;
    switch (test_below(4)) {
    case 0: n = test_below(len); break;                  /* truncated */
    case 1: n = len + 1 + test_below(64); break;         /* extended */
    default: break;
    }
    uint8_t *r = resized(rec, len, n);
    int changed = n != len;
    unsigned k = 1 + (unsigned)test_below(4);
    for (unsigned j = 0; j < k && n; j++) {
      size_t at;
      switch (test_below(3)) {
      case 0: at = test_below(n < RECORD_HEADER ? n : RECORD_HEADER); break; /* header */
      case 1: at = RECORD_HEADER + test_below(n > RECORD_HEADER + 64 ? 64 : 1); break; /* bases */
      default: at = test_below(n);
      }
      if (at >= n) continue;
      size_t f = at >= 40 ? 40 + 8 * ((at - 40) / 8) : 0;
      if (at >= 40 && at < 64 && f + 8 <= n && fix && test_below(2)) { /* a count: nearby value */
        uint64_t v;
        memcpy(&v, r + f, 8);
        v = nearby(v);
        memcpy(r + f, &v, 8);
      } else {
        uint8_t b = (uint8_t)(1u << test_below(8));
        r[at] ^= b;
        changed = 1;
      }
    }
    if (fix) fix_checksum(r, n);
    else changed = changed && (n != len || memcmp(r, rec, len));
    snprintf(what, sizeof what, "%s record, trial %d%s", name, i, fix ? " (checksum fixed)" : "");
    int rc = read_record(r, n, what);
    if (!fix && changed) CHECK(rc < 0, "%s: a changed record was accepted", what);
    free(r);
  }
  CHECK(read_record(rec, len, "unchanged record") == 0, "%s: the unchanged record fails", name);
  free(rec);
}

int main(void) {
  test_seed("test_codec_mutation");
  static const mt_case bases_[] = {
      {"bf16 heavy 11x600", NWC_ELEM_BF16, 11, 600, CU_HEAVY, 0},
      {"bf16 bits 3x17", NWC_ELEM_BF16, 3, 17, CU_BITS, 1},
      {"bf16 normal 16x520", NWC_ELEM_BF16, 16, 520, CU_NORMAL, 0},
      {"fp8 9x40 scaled", NWC_ELEM_FP8, 9, 40, 1, 1},
      {"fp8 bytes 8x530", NWC_ELEM_FP8, 8, 530, 0, 0},
  };
  for (size_t i = 0; i < sizeof bases_ / sizeof bases_[0]; i++) {
    float *scale;
    void *w = mt_case_weights(&bases_[i], &scale);
    nwc_tensor t;
    CHECK_RC(nwc_tensor_encode(w, bases_[i].M, bases_[i].K, NWC_ELEM(bases_[i].type, 0), scale,
                               &t));
    mutated_tensors += mt_tensor_trials(&t, bases_[i].name, 3000, F_COUNT, field_name, mutate, &decoded_ok);
    record_mutations(&t, bases_[i].name, 2000);
    nwc_tensor_release(&t);
    free(scale);
    free(w);
  }
  printf("%llu tensor and %llu record mutations (%llu records accepted after a checksum fix); "
         "%llu mutated tensors decoded without error\n",
         (unsigned long long)mutated_tensors, (unsigned long long)mutated_records,
         (unsigned long long)accepted_records, (unsigned long long)decoded_ok);
  return test_exit("test_codec_mutation");
}
