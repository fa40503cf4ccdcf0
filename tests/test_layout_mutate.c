/*
 * test_layout_mutate.c - random mutations of valid layout-1 and layout-2 tensors (BF16 and fp8)
 * and of their records; the codec must answer 0 or a negative errno and never touch memory
 * outside the arrays.  Run it in the sanitizer build (-DNWC_SANITIZE=ON): every array is copied
 * into an exactly sized malloc'ed buffer, so ASan reports any overread or overwrite.
 *
 * Tensor mutations: elem, rows, cols, psym (the layout-2 lut), nblocks, data_bytes, raw_bytes (the
 * buffers change size with them), bases[] entries, hdr[] (layout 1: stream words; layout 2:
 * exception counts, with bases re-chained so that only the counts are wrong), exception entries
 * (index and value bytes), data and raw bytes, scales.  Every mutated tensor goes through every
 * decoder at every CPU level with exactly sized outputs (mutate_util.h's mu_exercise, with its
 * properties: for layout 2, whatever validate accepts dequantizes; where dequant succeeds,
 * gather, matvec and matvec_batch succeed and gather returns the dequantized rows).  Besides:
 * validate rejects every single change of a field it checks exactly (elem, rows, nblocks,
 * data_bytes, raw_bytes, bases, the lut's fixed bytes).
 *
 * Record mutations: header counts changed with the checksum recomputed (XXH3-64 of bytes
 * [72, end) seeded with XXH3-64 of bytes [0, 64), store/record.c) reach the parser's checks;
 * whatever nwc_record_read accepts is decoded as above.
 */
#include "layout_util.h"
#include "mutate_util.h"

static uint64_t n_tensors, n_records, n_accepted, n_decoded;

enum {
  F_ELEM, F_ROWS, F_COLS, F_PSYM, F_NBLOCKS, F_DATA_BYTES, F_RAW_BYTES, F_BASES, F_HDR, F_ENTRY,
  F_DATA, F_RAW, F_SCALE, F_BIG_LANES, F_COUNT
};
static const char *const field_name[F_COUNT] = {
    "elem",  "rows", "cols",          "psym", "nblocks", "data_bytes", "raw_bytes",
    "bases", "hdr",  "exception entry", "data", "raw",     "scale", "big lanes"};

/* Re-chains bases[] from hdr[] (layout 1: 4-byte words; layout 2: entries) and resizes data. */
static void rechain(mtensor *m) {
  nwc_tensor *t = &m->t;
  unsigned unit = NWC_ELEM_LAYOUT(t->elem) == 1 ? 4 : NWC_ELEM_TYPE(t->elem) == NWC_ELEM_BF16 ? 3 : 2;
  m->bases[0] = 0;
  for (uint64_t b = 0; b < t->nblocks; b++) {
    uint64_t u = 0;
    for (unsigned l = 0; l < NWC_LANES; l++) u += m->hdr[b * NWC_LANES + l];
    m->bases[b + 1] = m->bases[b] + (unit * u + 7) / 8 * 8;
  }
  uint64_t n = m->bases[t->nblocks] + 16;
  replace((void **)&m->data, t->data_bytes, n);
  t->data_bytes = n;
}

/* One mutation of field f; returns 1 if validate must reject the tensor now. */
static int mutate(mtensor *m, int f) {
  nwc_tensor *t = &m->t;
  uint64_t nb = t->nblocks;
  unsigned layout = NWC_ELEM_LAYOUT(t->elem);
  switch (f) {
  case F_ELEM: {
    unsigned e = test_below(2) ? t->elem ^ (1u << test_below(8)) : (unsigned)test_below(256);
    int changed = e != t->elem;
    t->elem = e;
    return changed;
  }
  case F_ROWS: {
    uint64_t r = nearby(t->rows);
    int changed = (r + 15) / 16 != (t->rows + 15) / 16 || r == 0; /* nblocks and raw size move */
    if (m->scale && r < (1u << 20)) {
      replace((void **)&m->scale, t->rows * 4, r * 4);
    } else if (m->scale) {
      free(m->scale);
      m->scale = NULL;
    }
    t->rows = r;
    return changed;
  }
  case F_COLS: t->cols = nearby(t->cols); return 0; /* may keep every size */
  case F_PSYM: {
    unsigned i = (unsigned)test_below(16);
    uint8_t v = (uint8_t)test_rand();
    int fixed = layout == 2 && (i == 7 || i == 15) && v != 0;
    t->psym[i] = v;
    return fixed;
  }
  case F_NBLOCKS:
  case F_DATA_BYTES:
  case F_RAW_BYTES:
  case F_BASES: return mt_mutate_sizes(m, MT_NBLOCKS + f - F_NBLOCKS);
  case F_HDR: {
    uint64_t i = test_below(nb * NWC_LANES);
    m->hdr[i] = (uint8_t)(test_below(2) ? test_rand() : m->hdr[i] + 1 + test_below(3));
    rechain(m);
    return 0;
  }
  case F_ENTRY: { /* layout 2: an index or value byte of an exception entry */
    if (layout != 2 || t->data_bytes <= 16) return 0;
    uint64_t i = test_below(t->data_bytes - 16);
    m->data[i] = test_below(2) ? (uint8_t)test_rand() : (uint8_t)(m->data[i] + 1);
    return 0;
  }
  case F_DATA:
  case F_RAW: {
    uint8_t *p = f == F_DATA ? m->data : m->raw;
    uint64_t n = f == F_DATA ? t->data_bytes : t->raw_bytes, k = 1 + test_below(8);
    for (uint64_t j = 0; j < k && n; j++) p[test_below(n)] ^= (uint8_t)(1u << test_below(8));
    return 0;
  }
  case F_BIG_LANES: { /* the last block (or any) with long lanes, offsets chained: the block
                       * copy near the end of the data must stay inside the decoder's buffer */
    if (nb == 0) return 0;
    uint64_t b = test_below(2) ? nb - 1 : test_below(nb);
    for (unsigned l = 0; l < NWC_LANES; l++)
      m->hdr[b * NWC_LANES + l] = (uint8_t)(193 + test_below(63));
    rechain(m);
    return layout == 1; /* more than 192 words never fit a layout-1 lane */
  }
  case F_SCALE: {
    if (!m->scale || t->rows == 0) return 0;
    static const float bad[] = {NAN, -1.0f, 0.0f, INFINITY};
    m->scale[test_below(t->rows)] = bad[test_below(4)];
    return 1;
  }
  default: return 0;
  }
}

static void record_mutations(const nwc_tensor *base, const char *name, int trials) {
  uint8_t *rec = NULL;
  size_t len = 0;
  CHECK_RC(nwc_record_write(base, &rec, &len));
  if (!rec) return;
  char what[200];
  for (int i = 0; i < trials; i++) {
    uint8_t *r = resized(rec, len, len);
    unsigned k = 1 + (unsigned)test_below(3);
    for (unsigned j = 0; j < k; j++) {
      size_t at = test_below(3) ? test_below(RECORD_HEADER - 8) : test_below(len); /* not the hash */
      if (at >= 64 && at < 72) continue;
      if (at >= 40 && at < 64 && test_below(2)) { /* a count: a nearby value */
        uint64_t v;
        size_t fa = 40 + 8 * ((at - 40) / 8);
        memcpy(&v, r + fa, 8);
        v = nearby(v);
        memcpy(r + fa, &v, 8);
      } else {
        r[at] ^= (uint8_t)(1u << test_below(8));
      }
    }
    fix_checksum(r, len);
    snprintf(what, sizeof what, "%s record, trial %d", name, i);
    nwc_tensor t;
    int rc = nwc_record_read(r, len, &t);
    CHECK(rc == 0 || rc == -EBADMSG || rc == -ENOTSUP || rc == -ENOMEM,
          "%s: nwc_record_read returned %d", what, rc);
    if (rc == 0) {
      n_accepted++;
      mu_exercise(&t, what, &n_decoded);
      nwc_tensor_release(&t);
    }
    n_records++;
    free(r);
  }
  free(rec);
}

int main(void) {
  test_seed("test_layout_mutate");
  int trials = getenv("NWC_MUTATE_TRIALS") ? atoi(getenv("NWC_MUTATE_TRIALS")) : 400;
  static const mt_case cases[] = {
      {"bf16 heavy 17x600", NWC_ELEM_BF16, 17, 600, CU_HEAVY, 0},
      {"bf16 heavy 3x40 scaled", NWC_ELEM_BF16, 3, 40, CU_HEAVY, 1},
      {"bf16 normal 16x1040", NWC_ELEM_BF16, 16, 1040, CU_NORMAL, 0},
      {"fp8 9x40 scaled", NWC_ELEM_FP8, 9, 40, 1, 1},
      {"fp8 bytes 20x530", NWC_ELEM_FP8, 20, 530, 0, 0},
  };
  for (unsigned layout = 1; layout <= 2; layout++)
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      float *scale;
      void *w = mt_case_weights(&cases[i], &scale);
      nwc_tensor t;
      char name[96];
      snprintf(name, sizeof name, "layout %u %s", layout, cases[i].name);
      int rc = nwc_tensor_encode(w, cases[i].M, cases[i].K, NWC_ELEM(cases[i].type, layout),
                                 scale, &t);
      CHECK(rc == 0, "%s: encode returned %d (%s)", name, rc, nwc_error_detail());
      if (rc == 0) {
        CHECK(mu_exercise(&t, name, &n_decoded) == 0, "%s: the unchanged tensor is invalid", name);
        n_tensors += mt_tensor_trials(&t, name, trials, F_COUNT, field_name, mutate, &n_decoded);
        record_mutations(&t, name, trials / 2);
        nwc_tensor_release(&t);
      }
      free(scale);
      free(w);
    }
  printf("%llu tensor and %llu record mutations (%llu records accepted); %llu decoded without "
         "error\n",
         (unsigned long long)n_tensors, (unsigned long long)n_records,
         (unsigned long long)n_accepted, (unsigned long long)n_decoded);
  return test_exit("test_layout_mutate");
}
