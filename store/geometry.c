/*
 * geometry.c - the shape of an encoded tensor, for every layout: block counts, plane sizes and
 * strides (nwc__geom_init; nwc__lgeom_init for layouts 1 and 2), the positions of a layout-1/2
 * lane's weights in the input (nwc__lx_lane_inputs, the order the encoders write them in), and
 * the public shape queries nwc_layout and nwc_encode_bound.  Everything here is arithmetic on
 * M, K and elem; encoders, decoders and validation all size their work from it.
 *
 * Layouts 1 and 2 (docs/format-layouts.md): row groups of 16 rows (the blocks' row blocks),
 * column blocks of 512 columns, 16 super-chunks of 32 columns per full column block, ceil(nl / 2)
 * in the last one (nl = its 16-column chunks below K16).  Slot s = 16 cb + sc of a row group
 * holds super-chunk sc of column block cb, columns 32 s .. 32 s + 31.
 */
#include "internal.h"

#include <string.h>

int nwc__geom_init(nwc__geom *g, uint64_t M, uint64_t K, unsigned elem) {
  NWC_RETURN_IF(M == 0 || K == 0, -EINVAL, "shape %llux%llu: zero dimension",
                (unsigned long long)M, (unsigned long long)K);
  NWC_RETURN_IF(M > NWC__MAX_WEIGHTS || K > NWC__MAX_WEIGHTS || M > NWC__MAX_WEIGHTS / K, -EINVAL,
                "shape %llux%llu: more than 2^40 weights", (unsigned long long)M,
                (unsigned long long)K);
  unsigned type = NWC_ELEM_TYPE(elem), layout = NWC_ELEM_LAYOUT(elem);
  NWC_RETURN_IF(elem > 255 || (type != NWC_ELEM_BF16 && type != NWC_ELEM_FP8), -EINVAL,
                "elem 0x%x: unknown element type", elem);
  NWC_RETURN_IF(layout > 2, -ENOTSUP, "elem 0x%x: layout %u is not implemented", elem, layout);
  memset(g, 0, sizeof *g);
  g->M = M;
  g->K = K;
  g->K16 = nwc__round_up(K, NWC_LANE_COLS);
  /* layouts 1 and 2 (nwc__lgeom_init): row groups of 16, a raw plane that is not row-major */
  g->row_blocks = nwc__ceil_div(M, layout ? NWC__LX_BLOCK_ROWS : NWC_BLOCK_ROWS);
  g->col_blocks = nwc__ceil_div(K, NWC_BLOCK_COLS);
  g->nblocks = g->row_blocks * g->col_blocks;
  g->raw_stride = layout ? 0 : type == NWC_ELEM_BF16 ? g->K16 : g->K16 / 2;
  g->type = type;
  return 0;
}

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

static int lx_layout(uint64_t M, uint64_t K, unsigned elem, uint64_t out[4]) {
  nwc__lgeom lg;
  NWC_TRY(nwc__lgeom_init(&lg, M, K, elem));
  out[NWC_LAYOUT_BLOCKS] = lg.g.nblocks;
  out[NWC_LAYOUT_RAW_BYTES] = lg.raw_bytes;
  out[NWC_LAYOUT_SCRATCH] = lg.g.row_blocks * NWC__LX_BLOCK_ROWS * lg.g.col_blocks;
  out[NWC_LAYOUT_K16] = lg.g.K16;
  return 0;
}

static int64_t lx_encode_bound(uint64_t M, uint64_t K, unsigned elem) {
  nwc__lgeom lg;
  NWC_TRY(nwc__lgeom_init(&lg, M, K, elem));
  /* layout 1: 32 lanes of 16 x 12 words; layout 2: 32 lanes of 255 entries (both 8-aligned) */
  uint64_t per_block = lg.layout == 1
                           ? NWC_LANES * NWC__SC_PER_BLOCK * NWC__L1_WORDS_PER_SC * 4
                           : nwc__round_up(NWC_LANES * NWC__L2_MAX_EXC * lg.exc_bytes, 8);
  return (int64_t)(lg.g.nblocks * per_block + NWC_DATA_SLACK);
}

int nwc_layout(uint64_t M, uint64_t K, unsigned elem, uint64_t out[4]) {
  nwc__geom g = {0};
  NWC_TRY(nwc__geom_init(&g, M, K, elem));
  if (NWC_ELEM_LAYOUT(elem) != 0) return lx_layout(M, K, elem, out);
  out[NWC_LAYOUT_BLOCKS] = g.nblocks;
  out[NWC_LAYOUT_RAW_BYTES] = g.M * g.raw_stride;
  out[NWC_LAYOUT_SCRATCH] = g.row_blocks * NWC_BLOCK_ROWS * g.col_blocks;
  out[NWC_LAYOUT_K16] = g.K16;
  return 0;
}

int64_t nwc_encode_bound(uint64_t M, uint64_t K, unsigned elem) {
  nwc__geom g = {0};
  NWC_TRY(nwc__geom_init(&g, M, K, elem));
  if (NWC_ELEM_LAYOUT(elem) != 0) return lx_encode_bound(M, K, elem);
  /* 32 lanes of 192 units is 12288 bytes, already a multiple of the 8-byte alignment. */
  return (int64_t)(g.nblocks * NWC_LANES * NWC_LANE_MAX_UNITS * 2 + NWC_DATA_SLACK);
}
