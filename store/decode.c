/*
 * decode.c - the CPU reference decoder for layout 0: dequant, matvec and gather.
 *
 * It decodes the lane streams the way the GPU kernel does: the next 12 bits of a lane's 64-bit
 * window index the lookup table, a fast entry yields two weights and the bits they used, a slow
 * entry (bit 30) is finished code by code with a count of leading zeros, reading exp_of_rank back
 * out of the table itself (docs/format.md, "Decoding").  The table is the only symbol state.
 *
 * Safety: every block's offsets and stream lengths are checked before its words are read, a lane
 * never loads a word past its own stream, and a lane whose codes would need more bits than its
 * stream holds fails with -EBADMSG.  Rows are decoded in order 0..7, so decoding stops after the
 * last row a request needs (the last row block of a tensor, gather).
 *
 * Loops run row by row over all lanes of a block, so the 32 independent lane states give the CPU
 * independent dependency chains to overlap.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct lane {
  uint64_t win;     /* valid bits left-aligned, zeros below */
  int nbits;        /* valid bits in win */
  unsigned left;    /* words not yet loaded (the last may hold the next lane's first unit) */
  int avail;        /* bits of this lane's own stream not yet consumed; < 0 after an overrun */
  const uint8_t *p; /* next word */
} lane;

typedef struct decoder {
  nwc__geom g;
  const nwc_tensor *t;
  uint32_t tab[NWC_TAB_ENTRIES];
  lane lanes[NWC_LANES];
  unsigned active; /* lanes whose columns start below K16 */
} decoder;

static inline uint32_t load_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void refill(lane *s) {
  if (s->nbits <= 32) {
    uint32_t w = 0;
    if (NWC__LIKELY(s->left)) {
      w = load_le32(s->p);
      s->p += 4;
      s->left--;
    }
    s->win |= (uint64_t)w << (32 - s->nbits);
    s->nbits += 32;
  }
}

static inline void consume(lane *s, unsigned c) {
  s->win <<= c;
  s->nbits -= (int)c;
  s->avail -= (int)c;
}

/* exp_of_rank[r] as the table stores it. */
static inline unsigned rank_byte(const uint32_t *tab, unsigned r) {
  if (r <= 10) return (tab[0x800u >> r] >> 8) & 0x7fu;
  return (tab[(r - 11) >> 1] >> (8 + 8 * ((r - 11) & 1))) & 0xffu;
}

/* One code, by counting leading zeros.  Needs >= 24 valid bits in the window. */
static int slow_code(decoder *d, lane *s, unsigned *byte) {
  unsigned z = s->win ? (unsigned)__builtin_clzll(s->win) : 64;
  if (z < NWC_BF16_CODED_RANKS && (d->g.type == NWC_ELEM_BF16 || z < NWC_FP8_SYMBOLS)) {
    *byte = (unsigned)((s->win >> (62 - z)) & 1u) << 7 | rank_byte(d->tab, z);
    consume(s, z + 2);
    return 0;
  }
  NWC_RETURN_IF(z != NWC_BF16_CODED_RANKS || d->g.type != NWC_ELEM_BF16, -EBADMSG,
                "invalid code: %u leading zeros in a %s stream", z,
                d->g.type == NWC_ELEM_BF16 ? "bf16" : "fp8");
  *byte = (unsigned)(s->win >> 40) & 0xffu;
  consume(s, 24);
  return 0;
}

static int slow_pair(decoder *d, lane *s, uint32_t e, uint8_t *h) {
  unsigned b0, b1;
  if (e & 0xffu) { /* the entry holds a complete first code */
    b0 = (e >> 8) & 0xffu;
    consume(s, e & 0xffu);
  } else {
    NWC_TRY(slow_code(d, s, &b0));
  }
  refill(s);
  NWC_TRY(slow_code(d, s, &b1));
  h[0] = (uint8_t)b0;
  h[1] = (uint8_t)b1;
  return 0;
}

/* The 16 bytes (sign << 7 | exponent) of one lane's weights in the current row. */
static inline int decode_lane_row(decoder *d, lane *s, uint8_t h[16]) {
  for (unsigned k = 0; k < NWC_LANE_COLS; k += 2) {
    refill(s);
    uint32_t e = d->tab[s->win >> 52];
    if (NWC__LIKELY(!(e & NWC_TAB_SLOW))) {
      h[k] = (uint8_t)(e >> 8);
      h[k + 1] = (uint8_t)(e >> 16);
      consume(s, e & 0xffu);
    } else {
      NWC_TRY(slow_pair(d, s, e, h + k));
    }
  }
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
  uint64_t units = 0;
  for (unsigned l = 0; l < NWC_LANES; l++) units += hdr[l];
  NWC_RETURN_IF(4 * nwc__ceil_div(units, 2) > end - base, -EBADMSG,
                "block %llu: lane streams (%llu units) overrun the block's %llu bytes",
                (unsigned long long)b, (unsigned long long)units,
                (unsigned long long)(end - base));
  /* Lane l starts at unit u = sum of the lengths before it: in word u / 2, after 16 bits if u
   * is odd; its words are u / 2 .. (u + n - 1) / 2. */
  uint64_t u = 0;
  for (unsigned l = 0; l < NWC_LANES; l++) {
    unsigned n = hdr[l];
    lane *s = &d->lanes[l];
    *s = (lane){0, 0, 0, NWC_UNIT_BITS * (int)n, t->data + base + 4 * (u / 2)};
    if (n) {
      s->left = (unsigned)((u + n - 1) / 2 - u / 2 + 1);
      refill(s);
      if (u & 1) {
        s->win <<= NWC_UNIT_BITS;
        s->nbits -= NWC_UNIT_BITS;
      }
    }
    u += n;
  }
  d->active = nwc__active_lanes(&d->g, b % d->g.col_blocks);
  return 0;
}

/* After decoding: no lane may have used bits beyond its stream. */
static int block_end(const decoder *d, uint64_t b) {
  for (unsigned l = 0; l < d->active; l++) {
    const lane *s = &d->lanes[l];
    NWC_RETURN_IF(s->avail < 0, -EBADMSG,
                  "block %llu: lane %u reads past the end of its stream", (unsigned long long)b, l);
  }
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
  return block_end(d, b);
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
      if (rc == 0) rc = block_end(d, b);
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
