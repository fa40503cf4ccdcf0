/*
 * mutate_util.h - what the mutation tests of all layouts share (test_codec_mutation.c,
 * test_layout_mutate.c): an encoded tensor whose arrays are exactly sized private copies (so
 * ASan reports any overread or overwrite), resizing an array with its size field, nearby values
 * for sizes and counts, the errno values a decoder may answer, every decoder run on a mutated
 * tensor (mu_exercise), and re-sealing a mutated record.
 */
#ifndef NWC_MUTATE_UTIL_H
#define NWC_MUTATE_UTIL_H

#include "codec_util.h"
#include "layout_util.h"

#include <xxhash.h>

#define RECORD_HEADER 72 /* docs/format.md, "Tensor record" */

/* A tensor whose arrays the test owns, each exactly as large as its size field says. */
typedef struct mtensor {
  nwc_tensor t;
  uint64_t *bases;
  uint8_t *hdr, *data, *raw;
  float *scale;
} mtensor;

/* A new exactly sized copy of n bytes of src (of which `have` exist), the rest random. */
static inline void *resized(const void *src, size_t have, size_t n) {
  uint8_t *p = cu_malloc(n);
  size_t keep = have < n ? have : n;
  if (keep) memcpy(p, src, keep);
  for (size_t i = keep; i < n; i++) p[i] = (uint8_t)test_rand();
  return p;
}

static inline void replace(void **p, size_t have, size_t n) {
  void *q = resized(*p, have, n);
  free(*p);
  *p = q;
}

/* Points the tensor view at the test's arrays. */
static inline void mt_sync(mtensor *m) {
  m->t.bases = m->bases, m->t.hdr = m->hdr, m->t.data = m->data, m->t.raw = m->raw;
  m->t.scale = m->scale;
  m->t.owned = NULL;
}

static inline void mt_copy(mtensor *m, const nwc_tensor *src) {
  m->t = *src;
  m->bases = resized(src->bases, (src->nblocks + 1) * 8, (src->nblocks + 1) * 8);
  m->hdr = resized(src->hdr, src->nblocks * NWC_LANES, src->nblocks * NWC_LANES);
  m->data = resized(src->data, src->data_bytes, src->data_bytes);
  m->raw = resized(src->raw, src->raw_bytes, src->raw_bytes);
  m->scale = src->scale ? resized(src->scale, src->rows * 4, src->rows * 4) : NULL;
  mt_sync(m);
}

static inline void mt_free(mtensor *m) {
  free(m->bases);
  free(m->hdr);
  free(m->data);
  free(m->raw);
  free(m->scale);
}

/* What a decoder may answer for a mutated tensor. */
static inline int errno_ok(int rc) {
  return rc == 0 || rc == -EBADMSG || rc == -EINVAL || rc == -ENOTSUP || rc == -ENOMEM;
}

/*
 * The decoders on t at every CPU level this machine runs, with exactly sized outputs, their
 * answers checked (`what` names the mutation); returns validate's answer.  Properties besides
 * memory safety: validate answers 0, -EBADMSG or -ENOTSUP and every decoder 0 or an errno; a
 * layout-2 tensor that validate accepts dequantizes; where dequant succeeds, gather of rows in
 * range (rows past M are asked for now and then) succeeds and returns the dequantized rows, and
 * matvec (bias or none) and a 3-column matvec_batch succeed.  Shapes too large to allocate
 * outputs for are only validated (their block count cannot match the small arrays).  *decoded
 * counts the tensors that dequantized.
 */
static inline int mu_exercise(const nwc_tensor *t, const char *what, uint64_t *decoded) {
  int v = nwc_tensor_validate(t);
  CHECK(v == 0 || v == -EBADMSG || v == -ENOTSUP, "%s: validate returned %d", what, v);
  uint64_t M = t->rows, K = t->cols, K16 = cu_k16(K);
  if (M == 0 || K == 0 || M > (1u << 16) || K > (1u << 16) || M * K16 > (1u << 20)) return v;
  uint64_t br = NWC_LAYOUT_BLOCK_ROWS(t->elem), nrb = (M + br - 1) / br;
  uint16_t *out = cu_malloc(M * K16 * 2), *Yb = cu_malloc(3 * M * 2);
  float *X = cu_malloc(3 * K * 4), *Y = cu_malloc(3 * M * 4), *x = cu_malloc(K16 * 4), *bias = cu_malloc(M * 4);
  for (uint64_t i = 0; i < 3 * K; i++) X[i] = (float)cu_normal();
  for (uint64_t c = 0; c < K16; c++) x[c] = c < K ? X[c] : 0.0f;
  for (uint64_t r = 0; r < M; r++) bias[r] = 0.5f;
  int dq = 0;
  for (int level = 0; level < lu_levels(); level++) {
    lu_set_level(level);
    dq = nwc_dequant(t, out);
    CHECK(errno_ok(dq), "%s: dequant returned %d", what, dq);
    CHECK(v != 0 || NWC_ELEM_LAYOUT(t->elem) != 2 || dq == 0,
          "%s: a valid layout-2 tensor fails to dequant (%s)", what, nwc_error_detail());
    uint64_t b0 = test_below(nrb + 1), b1 = b0 + test_below(nrb + 1 - b0);
    uint64_t rows = b1 > b0 ? (br * b1 < M ? br * b1 : M) - br * b0 : 0;
    uint16_t *part = cu_malloc(rows * K16 * 2);
    int dr = b1 > b0 ? nwc_dequant_range(t, b0, b1, part) : 0;
    CHECK(errno_ok(dr), "%s: dequant_range returned %d", what, dr);
    free(part);
    uint64_t idx[4], n = 1 + test_below(4);
    int in_range = 1;
    for (uint64_t i = 0; i < n; i++) {
      idx[i] = test_below(8) ? test_below(M) : M + test_below(4);
      in_range &= idx[i] < M;
    }
    uint16_t *g = cu_malloc(n * K16 * 2);
    int gr = nwc_gather(t, idx, n, g);
    CHECK(errno_ok(gr), "%s: gather returned %d", what, gr);
    if (dq == 0 && in_range) {
      CHECK(gr == 0, "%s: dequant succeeds, gather fails (%s)", what, nwc_error_detail());
      for (uint64_t i = 0; gr == 0 && i < n; i++)
        CHECK(!memcmp(g + i * K16, out + idx[i] * K16, K16 * 2), "%s: gathered row %llu differs from dequant",
              what, (unsigned long long)idx[i]);
    }
    free(g);
    int mv = nwc_matvec(t, x, test_below(2) ? bias : NULL, Y, Yb);
    CHECK(errno_ok(mv), "%s: matvec returned %d", what, mv);
    int mb = nwc_matvec_batch(t, X, 3, K, NULL, Y, M, Yb);
    CHECK(errno_ok(mb), "%s: matvec_batch returned %d", what, mb);
    CHECK(dq != 0 || (mv == 0 && mb == 0), "%s: dequant succeeds, matvec fails (%s)", what, nwc_error_detail());
  }
  *decoded += dq == 0;
  free(out), free(Yb), free(X), free(Y), free(x), free(bias);
  return v;
}

/* A new value for a 64-bit size or count near v: small steps, block-sized steps, wild values. */
static inline uint64_t nearby(uint64_t v) {
  switch (test_below(6)) {
  case 0: return v + 1 + test_below(8);
  case 1: return v > 8 ? v - 1 - test_below(8) : v + 9;
  case 2: return v + 8 * (1 + test_below(4));
  case 3: return v / 2;
  case 4: return test_below(3) ? test_below(2 * v + 2) : 0;
  default: return test_rand() >> test_below(64);
  }
}

/* A tensor to mutate: its weights drawn from distribution dist (codec_util.h), with row scales
 * 0.25, 1.25, ... when scaled. */
typedef struct mt_case {
  const char *name;
  unsigned type; /* NWC_ELEM_BF16 or NWC_ELEM_FP8 */
  uint64_t M, K;
  int dist, scaled;
} mt_case;

/* c's weights (M x K, 2 bytes each) and *scale (M floats, or NULL); free both. */
static inline void *mt_case_weights(const mt_case *c, float **scale) {
  void *w = cu_malloc(c->M * c->K * 2);
  if (c->type == NWC_ELEM_BF16) cu_gen_bf16(w, c->M, c->K, c->dist);
  else cu_gen_fp8(w, c->M, c->K, c->dist);
  *scale = NULL;
  if (c->scaled) {
    *scale = cu_malloc(c->M * 4);
    for (uint64_t r = 0; r < c->M; r++) (*scale)[r] = 0.25f + (float)r;
  }
  return w;
}

/* The mutations every layout's test makes alike, each one a tensor validate must refuse: the
 * block count (bases and hdr resized with it), the data or raw byte count (its array resized),
 * one chained offset.  The tests' field enums list them in this order. */
enum { MT_NBLOCKS, MT_DATA_BYTES, MT_RAW_BYTES, MT_BASES, MT_SIZES };
static inline int mt_mutate_sizes(mtensor *m, int f) {
  nwc_tensor *t = &m->t;
  uint64_t nb = t->nblocks;
  switch (f) {
  case MT_NBLOCKS: {
    uint64_t n = nb + 1 + test_below(3);
    if (test_below(2) && nb > 0) n = nb - 1 - test_below(nb < 3 ? nb : 3);
    replace((void **)&m->bases, (nb + 1) * 8, (n + 1) * 8);
    replace((void **)&m->hdr, nb * NWC_LANES, n * NWC_LANES);
    t->nblocks = n;
    return 1;
  }
  case MT_DATA_BYTES:
  case MT_RAW_BYTES: {
    uint8_t **a = f == MT_DATA_BYTES ? &m->data : &m->raw;
    uint64_t *bytes = f == MT_DATA_BYTES ? &t->data_bytes : &t->raw_bytes;
    uint64_t n = nearby(*bytes) % (4 * *bytes + 64);
    if (n == *bytes) n++;
    replace((void **)a, *bytes, n);
    *bytes = n;
    return 1;
  }
  default: {
    uint64_t i = test_below(nb + 1), v = nearby(m->bases[i]);
    if (v == m->bases[i]) v ^= 8;
    m->bases[i] = v;
    return 1;
  }
  }
}

/* trials copies of base, each mutated once (three in four) or two to four times in fields drawn
 * from [0, nfields) (field_name: theirs) by mutate, which returns 1 when validate must now refuse
 * the tensor, and run through mu_exercise (*decoded: its count): a single mutation that must be
 * refused is checked.  Returns trials. */
static inline uint64_t mt_tensor_trials(const nwc_tensor *base, const char *name, int trials,
                                        int nfields, const char *const *field_name,
                                        int (*mutate)(mtensor *m, int f), uint64_t *decoded) {
  char what[200];
  for (int i = 0; i < trials; i++) {
    mtensor m;
    mt_copy(&m, base);
    int nmut = test_below(4) ? 1 : 2 + (int)test_below(3), must = 0, f = 0;
    for (int j = 0; j < nmut; j++) {
      f = (int)test_below((uint64_t)nfields);
      must |= mutate(&m, f);
    }
    mt_sync(&m);
    snprintf(what, sizeof what, "%s, trial %d, %d mutation(s), last %s", name, i, nmut,
             field_name[f]);
    int v = mu_exercise(&m.t, what, decoded);
    if (nmut == 1 && must) CHECK(v < 0, "%s: validate accepts it", what);
    mt_free(&m);
  }
  return trials > 0 ? (uint64_t)trials : 0;
}

/* Recomputes a record's checksum (store/record.c: XXH3-64 of bytes [72, end) seeded with XXH3-64
 * of bytes [0, 64)), so that mutated header fields reach the parser's other checks. */
static inline void fix_checksum(uint8_t *rec, size_t len) {
  if (len < RECORD_HEADER) return;
  uint64_t h = XXH3_64bits_withSeed(rec + RECORD_HEADER, len - RECORD_HEADER, XXH3_64bits(rec, 64));
  memcpy(rec + 64, &h, 8);
}

#endif
