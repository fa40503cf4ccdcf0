/*
 * layout_common.c - what layouts 1 and 2 share (docs/format-layouts.md): the shape arithmetic
 * (super-chunk slots, plane sizes), nwc_layout / nwc_encode_bound for them, the encode entry
 * points that size, allocate and write, and nwc_tensor_validate's layout-1/2 part.
 *
 * Geometry: row groups of 16 rows (the blocks' row blocks), column blocks of 512 columns, 16
 * super-chunks of 32 columns per full column block, ceil(nl / 2) in the last one (nl = its
 * 16-column chunks below K16).  Slot s = 16 cb + sc of a row group holds super-chunk sc of column
 * block cb, columns 32 s .. 32 s + 31.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

int nwc__lgeom_init(nwc__lgeom *lg, uint64_t M, uint64_t K, unsigned elem) {
  memset(lg, 0, sizeof *lg);
  NWC_TRY(nwc__geom_init(&lg->g, M, K, elem));
  unsigned layout = NWC_ELEM_LAYOUT(elem);
  NWC_RETURN_IF(layout != 1 && layout != 2, -EINVAL, "elem 0x%x: not layout 1 or 2", elem);
  const nwc__geom *g = &lg->g;
  lg->layout = layout;
  lg->K32 = nwc__round_up(K, NWC__SC_COLS);
  uint64_t nl = (g->K16 - (g->col_blocks - 1) * NWC_BLOCK_COLS) / NWC_LANE_COLS;
  lg->last_sc = (unsigned)nwc__ceil_div(nl, 2);
  lg->slots = NWC__SC_PER_BLOCK * (g->col_blocks - 1) + lg->last_sc;
  uint64_t lane_slots = g->row_blocks * lg->slots * NWC_LANES; /* (group, slot, lane) triples */
  int bf16 = g->type == NWC_ELEM_BF16;
  if (layout == 1) {
    lg->low_bytes = lane_slots * (bf16 ? 16 : 8);
  } else {
    lg->nib_bytes = lane_slots * 8;
    /* fp8: per slot pair three words of 32 lanes */
    lg->low_bytes = bf16 ? lane_slots * 16
                         : g->row_blocks * nwc__ceil_div(lg->slots, 2) * 3 * NWC_LANES * 4;
    lg->exc_bytes = bf16 ? 3 : 2;
  }
  lg->raw_bytes = lg->nib_bytes + lg->low_bytes + NWC__RAW_SLACK;
  return 0;
}

int nwc__lx_layout(uint64_t M, uint64_t K, unsigned elem, uint64_t out[4]) {
  nwc__lgeom lg;
  NWC_TRY(nwc__lgeom_init(&lg, M, K, elem));
  out[NWC_LAYOUT_BLOCKS] = lg.g.nblocks;
  out[NWC_LAYOUT_RAW_BYTES] = lg.raw_bytes;
  out[NWC_LAYOUT_SCRATCH] = lg.g.row_blocks * NWC__LX_BLOCK_ROWS * lg.g.col_blocks;
  out[NWC_LAYOUT_K16] = lg.g.K16;
  return 0;
}

int64_t nwc__lx_encode_bound(uint64_t M, uint64_t K, unsigned elem) {
  nwc__lgeom lg;
  NWC_TRY(nwc__lgeom_init(&lg, M, K, elem));
  /* layout 1: 32 lanes of 16 x 12 words; layout 2: 32 lanes of 255 entries (both 8-aligned) */
  uint64_t per_block = lg.layout == 1
                           ? NWC_LANES * NWC__SC_PER_BLOCK * NWC__L1_WORDS_PER_SC * 4
                           : nwc__round_up(NWC_LANES * NWC__L2_MAX_EXC * lg.exc_bytes, 8);
  return (int64_t)(lg.g.nblocks * per_block + NWC_DATA_SLACK);
}

/* ---- encoding ---------------------------------------------------------------------------- */

unsigned nwc__lx_lane_inputs(const nwc__lgeom *lg, uint64_t b, unsigned L, uint64_t in[256]) {
  const nwc__geom *g = &lg->g;
  uint64_t gr = b / g->col_blocks, cb = b % g->col_blocks;
  uint64_t r0 = gr * NWC__LX_BLOCK_ROWS, c0 = cb * NWC_BLOCK_COLS;
  unsigned nsc = nwc__lx_nsc(lg, cb), n = NWC__SC_WEIGHTS * nsc;
  uint64_t off[NWC__SC_WEIGHTS];
  for (unsigned j = 0; j < NWC__SC_WEIGHTS; j++)
    off[j] = (r0 + nwc__frag_row(L, j)) * g->K + c0 + nwc__frag_col(L, j);
  if (r0 + NWC__LX_BLOCK_ROWS <= g->M && c0 + NWC__SC_COLS * nsc <= g->K) { /* interior */
    for (unsigned sc = 0; sc < nsc; sc++)
      for (unsigned j = 0; j < NWC__SC_WEIGHTS; j++) in[16 * sc + j] = off[j] + NWC__SC_COLS * sc;
    return n;
  }
  for (unsigned sc = 0; sc < nsc; sc++)
    for (unsigned j = 0; j < NWC__SC_WEIGHTS; j++) {
      uint64_t row = r0 + nwc__frag_row(L, j), col = c0 + NWC__SC_COLS * sc + nwc__frag_col(L, j);
      in[16 * sc + j] = row < g->M && col < g->K ? off[j] + NWC__SC_COLS * sc : NWC__LX_FILLER;
    }
  return n;
}

static int plan_run(nwc__lx_plan *p, const void *w, uint64_t n, uint64_t K, unsigned elem,
                    uint64_t *freq, uint8_t psym[16], uint64_t *bases, uint8_t *hdr,
                    uint64_t *data_bytes) {
  NWC_TRY(nwc__encode_args(w, n, K));
  memset(p, 0, sizeof *p);
  NWC_TRY(nwc__lgeom_init(&p->lg, n / K, K, elem));
  if (p->lg.g.type == NWC_ELEM_BF16)
    p->w16 = w;
  else
    p->w8 = w;
  p->bases = bases;
  p->hdr = hdr;
  return p->lg.layout == 1 ? nwc__l1_plan(p, freq, psym, bases, hdr, data_bytes)
                           : nwc__l2_plan(p, freq, psym, bases, hdr, data_bytes);
}

static void plan_write(const nwc__lx_plan *p, uint8_t *data, uint8_t *raw) {
  if (p->lg.layout == 1)
    nwc__l1_write(p, data, raw);
  else
    nwc__l2_write(p, data, raw);
  memset(raw + p->lg.nib_bytes + p->lg.low_bytes, 0, NWC__RAW_SLACK);
}

int64_t nwc__lx_encode(const void *w, uint64_t n, uint64_t K, unsigned elem, uint64_t *freq,
                       uint8_t psym[16], uint64_t *bases, uint8_t *hdr, uint8_t *data, uint64_t cap,
                       uint8_t *raw) {
  NWC_RETURN_IF(!psym || !bases || !hdr, -EINVAL, "nwc_encode: missing output array");
  nwc__lx_plan *p = malloc(sizeof *p);
  if (!p) return -ENOMEM;
  uint64_t data_bytes = 0;
  int64_t rc = plan_run(p, w, n, K, elem, freq, psym, bases, hdr, &data_bytes);
  if (rc == 0) rc = (int64_t)data_bytes;
  if (rc > 0 && data) {
    if (cap < data_bytes || !raw)
      rc = nwc__fail(-ENOSPC, "nwc_encode: needs %llu data bytes, got %llu",
                     (unsigned long long)data_bytes, (unsigned long long)cap);
    else
      plan_write(p, data, raw);
  }
  free(p);
  return rc;
}

int nwc__lx_tensor_encode(const void *w, uint64_t rows, uint64_t cols, unsigned elem,
                          const float *scale, nwc_tensor *t) {
  NWC_RETURN_IF(!t, -EINVAL, "nwc_tensor_encode: no output");
  memset(t, 0, sizeof *t);
  nwc__lgeom lg;
  NWC_TRY(nwc__lgeom_init(&lg, rows, cols, elem));
  uint64_t nb = lg.g.nblocks;
  size_t meta = (size_t)((nb + 1) * 8 + nb * NWC_LANES), meta8 = nwc__round_up(meta, 8);
  uint8_t *head = malloc(meta8);
  nwc__lx_plan *p = malloc(sizeof *p);
  int rc = head && p ? 0 : -ENOMEM;
  uint64_t data_bytes = 0;
  if (rc == 0)
    rc = plan_run(p, w, rows * cols, cols, elem, NULL, t->psym, (uint64_t *)head,
                  head + (nb + 1) * 8, &data_bytes);
  if (rc == 0) {
    size_t scale_bytes = scale ? (size_t)rows * sizeof(float) : 0;
    size_t data8 = nwc__round_up(data_bytes, 8), raw8 = nwc__round_up(lg.raw_bytes, 8);
    uint8_t *all = malloc(meta8 + data8 + raw8 + scale_bytes);
    if (!all) {
      rc = -ENOMEM;
    } else {
      memcpy(all, head, meta);
      uint8_t *data = all + meta8, *raw = data + data8;
      t->bases = (const uint64_t *)all;
      t->hdr = all + (nb + 1) * 8;
      p->bases = t->bases;
      p->hdr = t->hdr;
      plan_write(p, data, raw);
      if (scale) {
        memcpy(raw + raw8, scale, scale_bytes);
        t->scale = (const float *)(raw + raw8);
      }
      t->elem = elem;
      t->rows = rows;
      t->cols = cols;
      t->nblocks = nb;
      t->data = data;
      t->data_bytes = data_bytes;
      t->raw = raw;
      t->raw_bytes = lg.raw_bytes;
      t->owned = all;
    }
  }
  free(head);
  free(p);
  return rc;
}

/* ---- validation -------------------------------------------------------------------------- */

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

int nwc__lx_validate(const nwc_tensor *t) {
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
