/*
 * validate.c - nwc_tensor_validate: the checks every decoder relies on, done once on a tensor
 * from outside (a record, a blob) before any of its streams is read.  Everything the format fixes
 * is checked: the shape against the layout, psym, each lane's stream length against what its
 * codes can take, the block offsets, the data and raw sizes, layout 2's exception lists, and the
 * per-row scales.  What only decoding can tell (a stream whose codes overrun it) the decoders
 * check themselves.
 */
#include "internal.h"

#include <math.h>

static int validate_psym(const nwc_tensor *t, unsigned type) {
  unsigned seen = 0;
  uint64_t seen128[2] = {0, 0};
  if (type == NWC_ELEM_BF16) {
    for (unsigned r = 0; r < NWC_BF16_CODED_RANKS; r++) {
      unsigned v = t->psym[r];
      NWC_RETURN_IF(v > 127 || (seen128[v >> 6] >> (v & 63) & 1), -EBADMSG,
                    "psym[%u] = %u: not a distinct 7-bit exponent", r, v);
      seen128[v >> 6] |= UINT64_C(1) << (v & 63);
    }
    NWC_RETURN_IF(t->psym[15] != 0, -EBADMSG, "psym[15] = %u, must be 0", t->psym[15]);
    return 0;
  }
  for (unsigned r = 0; r < NWC_RANKS; r++) {
    unsigned v = t->psym[r], s = 0;
    if (r >= NWC_FP8_SYMBOLS) {
      NWC_RETURN_IF(v != 0, -EBADMSG, "fp8 psym[%u] = %u, must be 0", r, v);
      continue;
    }
    while (s < NWC_FP8_SYMBOLS && nwc__fp8_sym_byte[s] != v) s++;
    NWC_RETURN_IF(s == NWC_FP8_SYMBOLS || (seen >> s & 1), -EBADMSG,
                  "fp8 psym[%u] = %u: not a distinct fp8 symbol byte", r, v);
    seen |= 1u << s;
  }
  return 0;
}

static int validate_scale(const nwc_tensor *t, uint64_t M) {
  for (uint64_t r = 0; t->scale && r < M; r++)
    NWC_RETURN_IF(!isfinite(t->scale[r]) || t->scale[r] <= 0, -EBADMSG,
                  "scale[%llu] = %g is not a positive finite number", (unsigned long long)r,
                  (double)t->scale[r]);
  return 0;
}

/* Layout 2: psym[0..6] high bytes of ranks 0..6, psym[8..14] their bit 7 of the low byte,
 * psym[7] = psym[15] = 0 (rank 7, the exception, decodes to +-0). */
static int validate_lut(const nwc_tensor *t, unsigned type) {
  const uint8_t *u = t->psym;
  uint64_t seen[4] = {0};
  NWC_RETURN_IF(u[7] || u[15], -EBADMSG, "layout 2: psym[7] = %u, psym[15] = %u, must be 0", u[7],
                u[15]);
  for (unsigned r = 0; r < 7; r++) {
    NWC_RETURN_IF(u[r] > 127 || (u[8 + r] & 0x7f) || (type == NWC_ELEM_BF16 && u[8 + r]), -EBADMSG,
                  "layout 2: rank %u: high byte %u, low bit 0x%x invalid", r, u[r], u[8 + r]);
    unsigned e = (unsigned)u[r] << 1 | u[8 + r] >> 7; /* BF16: 2 * exponent byte */
    NWC_RETURN_IF(type == NWC_ELEM_FP8 && e != 0 && (e < 118 || e > 135), -EBADMSG,
                  "layout 2: rank %u: exponent %u is no fp8 value's", r, e);
    NWC_RETURN_IF(seen[e >> 6] >> (e & 63) & 1, -EBADMSG, "layout 2: rank %u repeats a symbol", r);
    seen[e >> 6] |= UINT64_C(1) << (e & 63);
  }
  return 0;
}

/* Layout 2: every exception entry of block b names a coded weight of rank 7, lane by lane in
 * ascending order; fp8 values are not NaN.  The block's bytes lie inside data (checked before). */
static int validate_exceptions(const nwc_tensor *t, const nwc__lgeom *lg, uint64_t b) {
  uint64_t gr = b / lg->g.col_blocks, cb = b % lg->g.col_blocks;
  unsigned nsc = nwc__lx_nsc(lg, cb);
  const uint8_t *e = t->data + t->bases[b];
  for (unsigned L = 0; L < NWC_LANES; L++) {
    int prev = -1;
    for (unsigned k = 0; k < t->hdr[b * NWC_LANES + L]; k++, e += lg->exc_bytes) {
      unsigned idx = e[0], sc = idx >> 4, j = idx & 15;
      uint64_t row = gr * NWC__LX_BLOCK_ROWS + nwc__frag_row(L, j);
      uint64_t col = (cb * NWC__SC_PER_BLOCK + sc) * NWC__SC_COLS + nwc__frag_col(L, j);
      NWC_RETURN_IF((int)idx <= prev || sc >= nsc || row >= lg->g.M || col >= lg->g.K, -EBADMSG,
                    "block %llu lane %u: exception %u at index %u out of order or outside",
                    (unsigned long long)b, L, k, idx);
      prev = (int)idx;
      uint64_t slot = gr * lg->slots + cb * NWC__SC_PER_BLOCK + sc;
      unsigned nib = t->raw[(slot * NWC_LANES + L) * 8 + (j >> 1)] >> (4 * (j & 1)) & 15u;
      NWC_RETURN_IF((nib & 7) != 7, -EBADMSG,
                    "block %llu lane %u: exception at index %u has rank %u, not 7",
                    (unsigned long long)b, L, idx, nib & 7);
      NWC_RETURN_IF(lg->g.type == NWC_ELEM_FP8 && (e[1] & 0x7f) == 0x7f, -EBADMSG,
                    "block %llu lane %u: exception at index %u is an fp8 NaN",
                    (unsigned long long)b, L, idx);
    }
  }
  return 0;
}

/* Layouts 1 and 2: everything but psym (layout 1) and the scale. */
static int lx_validate(const nwc_tensor *t) {
  nwc__lgeom lg;
  int rc = nwc__lgeom_init(&lg, t->rows, t->cols, t->elem);
  NWC_RETURN_IF(rc < 0, rc == -ENOTSUP ? rc : -EBADMSG, "%s", nwc_error_detail());
  NWC_RETURN_IF(t->nblocks != lg.g.nblocks, -EBADMSG, "%llu blocks, shape needs %llu",
                (unsigned long long)t->nblocks, (unsigned long long)lg.g.nblocks);
  NWC_RETURN_IF(t->raw_bytes != lg.raw_bytes, -EBADMSG, "raw area %llu bytes, needs %llu",
                (unsigned long long)t->raw_bytes, (unsigned long long)lg.raw_bytes);
  if (lg.layout == 2) NWC_TRY(validate_lut(t, lg.g.type));
  NWC_RETURN_IF(t->bases[0] != 0, -EBADMSG, "bases[0] = %llu, must be 0",
                (unsigned long long)t->bases[0]);
  for (uint64_t b = 0; b < lg.g.nblocks; b++) {
    uint64_t sum = 0, nsc = nwc__lx_nsc(&lg, b % lg.g.col_blocks);
    for (unsigned l = 0; l < NWC_LANES; l++) {
      uint64_t n = t->hdr[b * NWC_LANES + l];
      NWC_RETURN_IF(lg.layout == 1 && (n < nsc || n > NWC__L1_WORDS_PER_SC * nsc), -EBADMSG,
                    "block %llu lane %u: %llu words, must be %llu..%llu", (unsigned long long)b, l,
                    (unsigned long long)n, (unsigned long long)nsc,
                    (unsigned long long)(NWC__L1_WORDS_PER_SC * nsc));
      sum += n;
    }
    uint64_t want = nwc__round_up(t->bases[b] + sum * (lg.layout == 1 ? 4 : lg.exc_bytes),
                                  NWC_DATA_ALIGN);
    NWC_RETURN_IF(t->bases[b + 1] != want, -EBADMSG, "bases[%llu] = %llu, block ends at %llu",
                  (unsigned long long)(b + 1), (unsigned long long)t->bases[b + 1],
                  (unsigned long long)want);
  }
  NWC_RETURN_IF(t->data_bytes != t->bases[lg.g.nblocks] + NWC_DATA_SLACK, -EBADMSG,
                "data is %llu bytes, blocks end at %llu (+%d slack)",
                (unsigned long long)t->data_bytes, (unsigned long long)t->bases[lg.g.nblocks],
                NWC_DATA_SLACK);
  for (uint64_t b = 0; lg.layout == 2 && b < lg.g.nblocks; b++)
    NWC_TRY(validate_exceptions(t, &lg, b));
  return 0;
}

int nwc_tensor_validate(const nwc_tensor *t) {
  nwc__geom g = {0};
  NWC_RETURN_IF(!t || !t->bases || !t->hdr || !t->data || !t->raw, -EINVAL,
                "validate: tensor has missing arrays");
  int rc = nwc__geom_init(&g, t->rows, t->cols, t->elem);
  NWC_RETURN_IF(rc == -ENOTSUP, rc, "%s", nwc_error_detail());
  NWC_RETURN_IF(rc < 0, -EBADMSG, "%s", nwc_error_detail());
  if (NWC_ELEM_LAYOUT(t->elem) != 0) {
    if (NWC_ELEM_LAYOUT(t->elem) == 1) NWC_TRY(validate_psym(t, g.type));
    NWC_TRY(lx_validate(t));
    return validate_scale(t, g.M);
  }
  NWC_RETURN_IF(t->nblocks != g.nblocks, -EBADMSG, "%llu blocks, shape needs %llu",
                (unsigned long long)t->nblocks, (unsigned long long)g.nblocks);
  NWC_RETURN_IF(t->raw_bytes != g.M * g.raw_stride, -EBADMSG, "raw plane %llu bytes, needs %llu",
                (unsigned long long)t->raw_bytes, (unsigned long long)(g.M * g.raw_stride));
  NWC_TRY(validate_psym(t, g.type));
  NWC_RETURN_IF(t->bases[0] != 0, -EBADMSG, "bases[0] = %llu, must be 0",
                (unsigned long long)t->bases[0]);
  for (uint64_t b = 0; b < g.nblocks; b++) {
    uint64_t units = 0, rows = nwc__block_rows(&g, b / g.col_blocks);
    unsigned active = nwc__active_lanes(&g, b % g.col_blocks);
    for (unsigned l = 0; l < NWC_LANES; l++) {
      /* each of a lane's rows * 16 codes takes 2..24 bits: 2 * rows .. 24 * rows units */
      uint64_t n = t->hdr[b * NWC_LANES + l], lo = l < active ? 2 * rows : 0, hi = 12 * lo;
      NWC_RETURN_IF(n < lo || n > hi, -EBADMSG,
                    "block %llu lane %u: %llu units, must be %llu..%llu", (unsigned long long)b, l,
                    (unsigned long long)n, (unsigned long long)lo, (unsigned long long)hi);
      units += n;
    }
    uint64_t want = t->bases[b] + nwc__block_span(units);
    NWC_RETURN_IF(t->bases[b + 1] != want, -EBADMSG, "bases[%llu] = %llu, streams end at %llu",
                  (unsigned long long)(b + 1), (unsigned long long)t->bases[b + 1],
                  (unsigned long long)want);
  }
  NWC_RETURN_IF(t->data_bytes != t->bases[g.nblocks] + NWC_DATA_SLACK, -EBADMSG,
                "data is %llu bytes, blocks end at %llu (+%d slack)",
                (unsigned long long)t->data_bytes, (unsigned long long)t->bases[g.nblocks],
                NWC_DATA_SLACK);
  return validate_scale(t, g.M);
}
