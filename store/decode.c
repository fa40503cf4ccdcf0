/*
 * decode.c - the CPU reference decoder for layout 0: dequant, matvec and gather.
 *
 * It decodes the lane streams the way the GPU kernel does: the next 12 bits of a lane's 64-bit
 * window index the lookup table, a fast entry yields two weights and the bits they used, a slow
 * entry (bit 30) is finished code by code with a count of leading zeros, reading exp_of_rank back
 * out of the table itself (docs/format.md, "Decoding").  The table is the only symbol state.
 *
 * Safety: every block's offsets and stream lengths are checked before its words are read; a lane
 * whose codes need more bits than its stream holds fails with -EBADMSG at the end of that row,
 * and until then reads at most 400 bits past its end, which is inside the data (the next lanes or
 * blocks) or inside a zero-padded copy of the block (the last blocks of the data).  Rows are decoded in order 0..7, so decoding stops after the
 * last row a request needs (the last row block of a tensor, gather).
 *
 * Loops run row by row over all lanes of a block, so the 32 independent lane states give the CPU
 * independent dependency chains to overlap.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* A lane's position in its block's bit sequence (bit 0 = bit 31 of the block's first word). */
typedef struct lane {
  uint32_t pos; /* next bit to decode */
  uint32_t end; /* first bit after the lane's stream */
} lane;

/* A block near the end of the data is copied here, so that windows can be loaded without bounds
 * checks: a lane reads at most 384 bits (one row of 24-bit codes) past its end before the row
 * check catches it, plus the second word of a window. */
#define BLOCK_MAX_BYTES (NWC_LANES * NWC_LANE_MAX_UNITS * 2)
#define WINDOW_MARGIN 64

typedef struct decoder {
  nwc__geom g;
  const nwc_tensor *t;
  uint32_t tab[NWC_TAB_ENTRIES];
  lane lanes[NWC_LANES];
  unsigned active;    /* lanes whose columns start below K16 */
  const uint8_t *blk; /* the current block's words */
  uint8_t pad[BLOCK_MAX_BYTES + WINDOW_MARGIN];
} decoder;

static inline uint32_t load_le32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4); /* little-endian host (record.c checks) */
  return v;
}

/* 64 bits of the block's bit sequence from bit pos on, left-aligned; at least 33 are valid. */
static inline uint64_t window(const uint8_t *blk, uint32_t pos) {
  const uint8_t *p = blk + 4 * (pos >> 5);
  return ((uint64_t)load_le32(p) << 32 | load_le32(p + 4)) << (pos & 31);
}

/* exp_of_rank[r] as the table stores it. */
static inline unsigned rank_byte(const uint32_t *tab, unsigned r) {
  if (r <= 10) return (tab[0x800u >> r] >> 8) & 0x7fu;
  return (tab[(r - 11) >> 1] >> (8 + 8 * ((r - 11) & 1))) & 0xffu;
}

/* One code at *pos, by counting leading zeros. */
static int slow_code(const decoder *d, uint32_t *pos, unsigned *byte) {
  uint64_t w = window(d->blk, *pos);
  unsigned z = w ? (unsigned)__builtin_clzll(w) : 64;
  if (z < NWC_BF16_CODED_RANKS && (d->g.type == NWC_ELEM_BF16 || z < NWC_FP8_SYMBOLS)) {
    *byte = (unsigned)((w >> (62 - z)) & 1u) << 7 | rank_byte(d->tab, z);
    *pos += z + 2;
    return 0;
  }
  NWC_RETURN_IF(z != NWC_BF16_CODED_RANKS || d->g.type != NWC_ELEM_BF16, -EBADMSG,
                "invalid code: %u leading zeros in a %s stream", z,
                d->g.type == NWC_ELEM_BF16 ? "bf16" : "fp8");
  *byte = (unsigned)(w >> 40) & 0xffu;
  *pos += 24;
  return 0;
}

/* One pair at *pos through the table, finishing a slow entry code by code. */
static int slow_pair(const decoder *d, uint32_t *pos, uint8_t *h) {
  uint32_t e = d->tab[window(d->blk, *pos) >> 52];
  unsigned b0 = 0, b1 = 0;
  if (!(e & NWC_TAB_SLOW)) {
    h[0] = (uint8_t)(e >> 8);
    h[1] = (uint8_t)(e >> 16);
    *pos += e & 0xffu;
    return 0;
  }
  if (e & 0xffu) { /* the entry holds a complete first code */
    b0 = (e >> 8) & 0xffu;
    *pos += e & 0xffu;
  } else {
    NWC_TRY(slow_code(d, pos, &b0));
  }
  NWC_TRY(slow_code(d, pos, &b1));
  h[0] = (uint8_t)b0;
  h[1] = (uint8_t)b1;
  return 0;
}

/* The 16 bytes (sign << 7 | exponent) of one lane's weights in the current row.  One window
 * serves two table lookups (two fast pairs use at most 24 of its >= 33 bits). */
static inline int decode_lane_row(const decoder *d, lane *s, uint8_t h[16]) {
  uint32_t pos = s->pos;
  for (unsigned k = 0; k < NWC_LANE_COLS; k += 4) {
    uint64_t w = window(d->blk, pos);
    uint32_t e0 = d->tab[w >> 52];
    uint32_t e1 = d->tab[(w << (e0 & 0xffu)) >> 52];
    if (NWC__LIKELY(!((e0 | e1) & NWC_TAB_SLOW))) {
      h[k] = (uint8_t)(e0 >> 8);
      h[k + 1] = (uint8_t)(e0 >> 16);
      h[k + 2] = (uint8_t)(e1 >> 8);
      h[k + 3] = (uint8_t)(e1 >> 16);
      pos += (e0 & 0xffu) + (e1 & 0xffu);
    } else {
      NWC_TRY(slow_pair(d, &pos, h + k));
      NWC_TRY(slow_pair(d, &pos, h + k + 2));
    }
  }
  NWC_RETURN_IF(pos > s->end, -EBADMSG, "lane stream overrun: codes need bit %u of %u", pos,
                s->end);
  s->pos = pos;
  return 0;
}

/* Checks block b's offsets and lengths and points the lane states at its streams. */
static int block_begin(decoder *d, uint64_t b) {
  const nwc_tensor *t = d->t;
  uint64_t base = t->bases[b], end = t->bases[b + 1];
  NWC_RETURN_IF(base % NWC_DATA_ALIGN || base > end || end > t->data_bytes, -EBADMSG,
                "block %llu: offsets %llu..%llu outside %llu data bytes or misaligned",
                (unsigned long long)b, (unsigned long long)base, (unsigned long long)end,
                (unsigned long long)t->data_bytes);
  const uint8_t *hdr = t->hdr + b * NWC_LANES;
  uint32_t u = 0;
  for (unsigned l = 0; l < NWC_LANES; l++) {
    /* also bounds the block to BLOCK_MAX_BYTES, the size of the copy in d->pad */
    NWC_RETURN_IF(hdr[l] > NWC_LANE_MAX_UNITS, -EBADMSG, "block %llu: lane %u claims %u units",
                  (unsigned long long)b, l, hdr[l]);
    d->lanes[l] = (lane){NWC_UNIT_BITS * u, NWC_UNIT_BITS * (u + hdr[l])};
    u += hdr[l];
  }
  uint64_t bytes = 4 * nwc__ceil_div(u, 2);
  NWC_RETURN_IF(bytes > end - base, -EBADMSG,
                "block %llu: lane streams (%u units) overrun the block's %llu bytes",
                (unsigned long long)b, u, (unsigned long long)(end - base));
  d->blk = t->data + base;
  if (t->data_bytes - base - bytes < WINDOW_MARGIN) {
    memcpy(d->pad, d->blk, bytes);
    memset(d->pad + bytes, 0, sizeof d->pad - bytes);
    d->blk = d->pad;
  }
  d->active = nwc__active_lanes(&d->g, b % d->g.col_blocks);
  return 0;
}

static int decoder_init(decoder *d, const nwc_tensor *t) {
  NWC_RETURN_IF(!t || !t->bases || !t->hdr || !t->data || !t->raw, -EINVAL,
                "decoder: tensor has missing arrays");
  NWC_TRY(nwc__geom_init(&d->g, t->rows, t->cols, t->elem));
  NWC_RETURN_IF(t->nblocks != d->g.nblocks, -EBADMSG, "tensor: %llu blocks, shape needs %llu",
                (unsigned long long)t->nblocks, (unsigned long long)d->g.nblocks);
  NWC_RETURN_IF(t->raw_bytes < d->g.M * d->g.raw_stride, -EBADMSG,
                "tensor: raw plane of %llu bytes, shape needs %llu",
                (unsigned long long)t->raw_bytes, (unsigned long long)(d->g.M * d->g.raw_stride));
  d->t = t;
  return nwc_build_tab(t->psym, t->elem, d->tab);
}

static decoder *decoder_new(const nwc_tensor *t, int *rc) {
  decoder *d = malloc(sizeof *d);
  *rc = d ? decoder_init(d, t) : -ENOMEM;
  if (*rc < 0) {
    free(d);
    return NULL;
  }
  return d;
}

/* The low bytes of one lane's 16 weights in row r: BF16 mantissa bytes, fp8 nibble << 4. */
static inline void lane_low(const decoder *d, uint64_t r, uint64_t c0, uint8_t lo[16]) {
  const uint8_t *row = d->t->raw + r * d->g.raw_stride;
  if (d->g.type == NWC_ELEM_BF16) {
    memcpy(lo, row + c0, 16);
  } else {
    const uint8_t *q = row + c0 / 2;
    for (unsigned j = 0; j < 16; j++)
      lo[j] = (uint8_t)(((q[nwc__fp8_nib_byte(j)] >> nwc__fp8_nib_shift(j)) & 15u) << 4);
  }
}

/* Decodes rows [0, nrows) of block b; row `keep` (or every row if keep < 0) goes to
 * out + (row - first_out_row) * K16 for rows below M. */
static int dequant_block(decoder *d, uint64_t b, unsigned nrows, int keep, uint16_t *out,
                         uint64_t first_out_row) {
  NWC_TRY(block_begin(d, b));
  uint64_t rb = b / d->g.col_blocks, c_base = (b % d->g.col_blocks) * NWC_BLOCK_COLS;
  for (unsigned i = 0; i < nrows; i++) {
    uint64_t r = rb * NWC_BLOCK_ROWS + i;
    int want = keep < 0 || (unsigned)keep == i;
    for (unsigned l = 0; l < d->active; l++) {
      uint8_t h[16], lo[16];
      NWC_TRY(decode_lane_row(d, &d->lanes[l], h));
      if (!want) continue;
      uint64_t c0 = c_base + (uint64_t)l * NWC_LANE_COLS;
      lane_low(d, r, c0, lo);
      uint16_t *o = out + (r - first_out_row) * d->g.K16 + c0;
      for (unsigned j = 0; j < 16; j++) o[j] = (uint16_t)(h[j] << 8 | lo[j]);
    }
  }
  return 0;
}

int nwc_dequant_range(const nwc_tensor *t, uint64_t rb_begin, uint64_t rb_end, uint16_t *out) {
  int rc;
  decoder *d = decoder_new(t, &rc);
  if (!d) return rc;
  if (!out || rb_begin > rb_end || rb_end > d->g.row_blocks)
    rc = nwc__fail(-EINVAL, "nwc_dequant_range: row blocks %llu..%llu of %llu",
                   (unsigned long long)rb_begin, (unsigned long long)rb_end,
                   (unsigned long long)d->g.row_blocks);
  for (uint64_t rb = rb_begin; rc == 0 && rb < rb_end; rb++)
    for (uint64_t cb = 0; rc == 0 && cb < d->g.col_blocks; cb++)
      rc = dequant_block(d, rb * d->g.col_blocks + cb, nwc__block_rows(&d->g, rb), -1, out,
                         rb_begin * NWC_BLOCK_ROWS);
  free(d);
  return rc;
}

int nwc_dequant(const nwc_tensor *t, uint16_t *out) {
  return nwc_dequant_range(t, 0, t ? nwc__ceil_div(t->rows, NWC_BLOCK_ROWS) : 0, out);
}

int nwc_gather(const nwc_tensor *t, const uint64_t *rows, uint64_t n, uint16_t *out) {
  int rc;
  decoder *d = decoder_new(t, &rc);
  if (!d) return rc;
  if (n && (!rows || !out)) rc = nwc__fail(-EINVAL, "nwc_gather: missing rows or output");
  for (uint64_t k = 0; rc == 0 && k < n; k++) {
    uint64_t r = rows[k];
    if (r >= d->g.M) {
      rc = nwc__fail(-EINVAL, "nwc_gather: row %llu of a %llu-row tensor", (unsigned long long)r,
                     (unsigned long long)d->g.M);
      break;
    }
    uint64_t rb = r / NWC_BLOCK_ROWS;
    unsigned i = (unsigned)(r % NWC_BLOCK_ROWS);
    for (uint64_t cb = 0; rc == 0 && cb < d->g.col_blocks; cb++)
      rc = dequant_block(d, rb * d->g.col_blocks + cb, i + 1, (int)i, out + k * d->g.K16, r);
  }
  free(d);
  return rc;
}

static inline float bits_to_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Sum of one lane's 16 products, in a fixed pairwise order. */
static inline float lane_dot(const uint8_t h[16], const uint8_t lo[16], const float *x) {
  float p[16];
  for (unsigned j = 0; j < 16; j++) p[j] = bits_to_f32((uint32_t)h[j] << 24 | (uint32_t)lo[j] << 16) * x[j];
  for (unsigned w = 8; w; w >>= 1)
    for (unsigned j = 0; j < w; j++) p[j] += p[j + w];
  return p[0];
}

int nwc_matvec(const nwc_tensor *t, const float *x, const float *bias, float *y,
               uint16_t *y_bf16) {
  int rc;
  decoder *d = decoder_new(t, &rc);
  if (!d) return rc;
  if (!x) rc = nwc__fail(-EINVAL, "nwc_matvec: no x");
  for (uint64_t rb = 0; rc == 0 && rb < d->g.row_blocks; rb++) {
    double acc[NWC_BLOCK_ROWS] = {0};
    unsigned nrows = nwc__block_rows(&d->g, rb);
    for (uint64_t cb = 0; rc == 0 && cb < d->g.col_blocks; cb++) {
      uint64_t b = rb * d->g.col_blocks + cb;
      if ((rc = block_begin(d, b)) < 0) break;
      for (unsigned i = 0; rc == 0 && i < nrows; i++) {
        uint64_t r = rb * NWC_BLOCK_ROWS + i;
        float row = 0;
        for (unsigned l = 0; l < d->active; l++) {
          uint8_t h[16], lo[16];
          if ((rc = decode_lane_row(d, &d->lanes[l], h)) < 0) break;
          uint64_t c0 = cb * NWC_BLOCK_COLS + (uint64_t)l * NWC_LANE_COLS;
          lane_low(d, r, c0, lo);
          row += lane_dot(h, lo, x + c0);
        }
        acc[i] += row;
      }
    }
    for (unsigned i = 0; rc == 0 && i < nrows; i++) {
      uint64_t r = rb * NWC_BLOCK_ROWS + i;
      double v = acc[i] * (t->scale ? t->scale[r] : 1.0f) + (bias ? bias[r] : 0.0f);
      if (y) y[r] = (float)v;
      if (y_bf16) y_bf16[r] = nwc_f32_to_bf16((float)v);
    }
  }
  free(d);
  return rc;
}
