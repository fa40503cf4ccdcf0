/*
 * lx_decode.c - the CPU decoders of layouts 1 and 2 built on tiles (16 rows x 32 columns of one
 * super-chunk slot): the block walker both layouts share (offset checks, layout-2 exception
 * lists), and dequant and gather.  The matvec is in matvec_batch.c.
 *
 * A block is walked as begin, tile(sc) for sc = 0 .. nsc-1 in order, end.  Layout 1 tiles come
 * from the prefix-code lane decoder (layout1_decode.c), layout 2 tiles from the portable or SIMD
 * tile decoder chosen by the CPU level (layout2_decode.c, layout2_simd.c); layout-2 exceptions
 * are then written over their weights, so a tile always holds the exact weights.
 *
 * Safety: the geometry and the raw size are checked once (nwc__lxdec_init), every block's
 * offsets and lengths before its bytes are read; a block's exception entries are checked and
 * sorted by super-chunk when the block begins (indices out of order within a lane or beyond the
 * block's super-chunks make the call -EBADMSG).
 * Tiles go straight into the output only when all 16 x 32 positions lie inside it, else through
 * a local buffer.
 */
#include "decode_internal.h"

#include <stdlib.h>
#include <string.h>

int nwc__lxdec_init(nwc__lxdec *d, const nwc_tensor *t) {
  memset(d, 0, sizeof *d);
  NWC_RETURN_IF(!t || !t->bases || !t->hdr || !t->data || !t->raw, -EINVAL,
                "decoder: tensor has missing arrays");
  NWC_TRY(nwc__lgeom_init(&d->lg, t->rows, t->cols, t->elem));
  NWC_RETURN_IF(t->nblocks != d->lg.g.nblocks, -EBADMSG, "tensor: %llu blocks, shape needs %llu",
                (unsigned long long)t->nblocks, (unsigned long long)d->lg.g.nblocks);
  NWC_RETURN_IF(t->raw_bytes < d->lg.raw_bytes - NWC__RAW_SLACK, -EBADMSG,
                "tensor: raw area of %llu bytes, shape needs %llu",
                (unsigned long long)t->raw_bytes,
                (unsigned long long)(d->lg.raw_bytes - NWC__RAW_SLACK));
  d->t = t;
  if (d->lg.layout == 1) {
    int rc;
    d->pc = nwc__pcdec_new(t, &rc);
    return d->pc ? 0 : rc;
  }
  d->exc = malloc(NWC_LANES * NWC__L2_MAX_EXC * sizeof *d->exc);
  if (!d->exc) return -ENOMEM;
  for (unsigned v = 0; v < 256; v++) d->fp8_bf16[v] = nwc_fp8_to_bf16((uint8_t)v);
  int level = nwc__cpu_level();
  d->tile2 = nwc__l2_tile_simd(d->lg.g.type, level);
  if (!d->tile2) d->tile2 = nwc__l2_tile_portable;
  return 0;
}

void nwc__lxdec_fini(nwc__lxdec *d) {
  nwc__pcdec_free(d->pc);
  free(d->exc);
  d->pc = NULL;
  d->exc = NULL;
}

/* Layout 2: checks block b's exception list and sorts its entries by super-chunk into d->exc
 * (tile position << 16 | BF16 value), d->sc_start[sc] .. d->sc_start[sc + 1]. */
static int l2_block_begin(nwc__lxdec *d, uint64_t b) {
  const nwc_tensor *t = d->t;
  uint64_t base = t->bases[b], end = t->bases[b + 1], n = 0;
  NWC_RETURN_IF(base % NWC_DATA_ALIGN || base > end || end > t->data_bytes, -EBADMSG,
                "block %llu: offsets %llu..%llu outside %llu data bytes or misaligned",
                (unsigned long long)b, (unsigned long long)base, (unsigned long long)end,
                (unsigned long long)t->data_bytes);
  const uint8_t *hdr = t->hdr + b * NWC_LANES;
  for (unsigned L = 0; L < NWC_LANES; L++) n += hdr[L];
  const unsigned eb = d->lg.exc_bytes;
  NWC_RETURN_IF(n * eb > end - base, -EBADMSG,
                "block %llu: %llu exception entries overrun the block's %llu bytes",
                (unsigned long long)b, (unsigned long long)n, (unsigned long long)(end - base));
  unsigned count[NWC__SC_PER_BLOCK + 1] = {0};
  const uint8_t *e = t->data + base;
  for (unsigned L = 0; L < NWC_LANES; L++) { /* counts, and the order of each lane's indices */
    int prev = -1;
    for (unsigned k = 0; k < hdr[L]; k++, e += eb) {
      NWC_RETURN_IF((int)e[0] <= prev || (unsigned)e[0] >> 4 >= d->nsc, -EBADMSG,
                    "block %llu lane %u: exception index %u out of order or beyond %u "
                    "super-chunks", (unsigned long long)b, L, e[0], d->nsc);
      prev = e[0];
      count[(e[0] >> 4) + 1]++;
    }
  }
  for (unsigned sc = 0; sc < NWC__SC_PER_BLOCK; sc++) count[sc + 1] += count[sc];
  memcpy(d->sc_start, count, sizeof d->sc_start);
  e = t->data + base;
  for (unsigned L = 0; L < NWC_LANES; L++)
    for (unsigned k = 0; k < hdr[L]; k++, e += eb) {
      unsigned j = e[0] & 15u;
      uint16_t v = eb == 3 ? (uint16_t)(e[1] | e[2] << 8) : d->fp8_bf16[e[1]];
      uint32_t pos = nwc__frag_row(L, j) * NWC__SC_COLS + nwc__frag_col(L, j);
      d->exc[count[e[0] >> 4]++] = pos << 16 | v;
    }
  return 0;
}

int nwc__lxdec_begin(nwc__lxdec *d, uint64_t b, uint32_t lanes) {
  d->b = b;
  d->gr = b / d->lg.g.col_blocks;
  d->cb = b % d->lg.g.col_blocks;
  d->nsc = nwc__lx_nsc(&d->lg, d->cb);
  uint64_t rows_left = d->lg.g.M - d->gr * NWC__LX_BLOCK_ROWS; /* lanes of rows >= M: none */
  d->nlanes = rows_left < 8 ? 4 * (unsigned)rows_left : NWC_LANES;
  d->lanes = d->lg.layout == 1 ? lanes : UINT32_MAX;
  if (d->nlanes < NWC_LANES) d->lanes &= (UINT32_C(1) << d->nlanes) - 1;
  return d->lg.layout == 1 ? nwc__pcdec_l1_begin(d->pc, b) : l2_block_begin(d, b);
}

int nwc__lxdec_tile(nwc__lxdec *d, unsigned sc, uint16_t *dst, size_t stride) {
  uint64_t slot = d->cb * NWC__SC_PER_BLOCK + sc;
  if (d->lg.layout == 1)
    return nwc__l1_tile(d->pc, &d->lg, d->t->raw, d->gr * d->lg.slots + slot, d->lanes, dst, stride);
  d->tile2(&d->lg, d->t->raw, d->t->psym, d->gr, slot, d->nlanes, dst, stride);
  for (unsigned k = d->sc_start[sc]; k < d->sc_start[sc + 1]; k++) { /* exceptions over +-0 */
    uint32_t x = d->exc[k], pos = x >> 16;
    dst[(pos / NWC__SC_COLS) * stride + pos % NWC__SC_COLS] = (uint16_t)x;
  }
  return 0;
}

int nwc__lxdec_end(nwc__lxdec *d) {
  (void)d; /* layout 1: the lane decoder checks each super-chunk; layout 2: checked at begin */
  return 0;
}

/* ---- dequant and gather ------------------------------------------------------------------ */

/* Decodes block b; tile rows [row_lo, row_hi) (relative to the row group) go to out, whose row 0
 * is tile row row_lo, row stride K16.  lanes: the layout-1 lanes to decode. */
static int dequant_block(nwc__lxdec *d, uint64_t b, unsigned row_lo, unsigned row_hi,
                         uint32_t lanes, uint16_t *out) {
  const nwc__geom *g = &d->lg.g;
  uint16_t buf[NWC__LX_BLOCK_ROWS * NWC__SC_COLS];
  NWC_TRY(nwc__lxdec_begin(d, b, lanes));
  for (unsigned sc = 0; sc < d->nsc; sc++) {
    uint64_t c0 = (d->cb * NWC__SC_PER_BLOCK + sc) * NWC__SC_COLS;
    int direct = row_lo == 0 && row_hi == NWC__LX_BLOCK_ROWS && c0 + NWC__SC_COLS <= g->K16;
    NWC_TRY(nwc__lxdec_tile(d, sc, direct ? out + c0 : buf, direct ? g->K16 : NWC__SC_COLS));
    if (direct) continue;
    size_t ncol = (size_t)(g->K16 - c0 < NWC__SC_COLS ? g->K16 - c0 : NWC__SC_COLS);
    for (unsigned i = row_lo; i < row_hi; i++)
      memcpy(out + (i - row_lo) * g->K16 + c0, buf + i * NWC__SC_COLS, ncol * 2);
  }
  return nwc__lxdec_end(d);
}

static unsigned group_rows(const nwc__geom *g, uint64_t gr) {
  uint64_t left = g->M - gr * NWC__LX_BLOCK_ROWS;
  return left < NWC__LX_BLOCK_ROWS ? (unsigned)left : NWC__LX_BLOCK_ROWS;
}

int nwc__lx_dequant_range(const nwc_tensor *t, uint64_t rb_begin, uint64_t rb_end, uint16_t *out) {
  nwc__lxdec d;
  int rc = nwc__lxdec_init(&d, t);
  if (rc == 0 && (!out || rb_begin > rb_end || rb_end > d.lg.g.row_blocks))
    rc = nwc__fail(-EINVAL, "nwc_dequant_range: row blocks %llu..%llu of %llu",
                   (unsigned long long)rb_begin, (unsigned long long)rb_end,
                   (unsigned long long)d.lg.g.row_blocks);
  for (uint64_t gr = rb_begin; rc == 0 && gr < rb_end; gr++) {
    uint16_t *o = out + (gr - rb_begin) * NWC__LX_BLOCK_ROWS * d.lg.g.K16;
    for (uint64_t cb = 0; rc == 0 && cb < d.lg.g.col_blocks; cb++)
      rc = dequant_block(&d, gr * d.lg.g.col_blocks + cb, 0, group_rows(&d.lg.g, gr), UINT32_MAX,
                         o);
  }
  nwc__lxdec_fini(&d);
  return rc;
}

int nwc__lx_gather(const nwc_tensor *t, const uint64_t *rows, uint64_t n, uint16_t *out) {
  nwc__lxdec d;
  int rc = nwc__lxdec_init(&d, t);
  if (rc == 0 && n && (!rows || !out)) rc = nwc__fail(-EINVAL, "nwc_gather: missing rows or output");
  for (uint64_t k = 0; rc == 0 && k < n; k++) {
    uint64_t r = rows[k];
    if (r >= d.lg.g.M) {
      rc = nwc__fail(-EINVAL, "nwc_gather: row %llu of a %llu-row tensor", (unsigned long long)r,
                     (unsigned long long)d.lg.g.M);
      break;
    }
    uint64_t gr = r / NWC__LX_BLOCK_ROWS;
    unsigned i = (unsigned)(r % NWC__LX_BLOCK_ROWS);
    uint32_t lanes = UINT32_C(0xf) << 4 * (i % 8); /* lanes (r = i % 8, q = 0..3) */
    for (uint64_t cb = 0; rc == 0 && cb < d.lg.g.col_blocks; cb++)
      rc = dequant_block(&d, gr * d.lg.g.col_blocks + cb, i, i + 1, lanes, out + k * d.lg.g.K16);
  }
  nwc__lxdec_fini(&d);
  return rc;
}
