/*
 * decode.c - the CPU reference decoder for layout 0 (dequant, matvec and gather; decode_api.c
 * hands it the layout-0 calls), and its prefix-code lane decoder, which layout 1 and the batched
 * matvec use too (nwc__pcdec_*).
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
#include "decode_internal.h"

#include <stdlib.h>
#include <string.h>

/* GCC/Clang vector types: plain C that compiles to SIMD where the target has it. */
typedef uint8_t v16u8 __attribute__((vector_size(16)));
typedef uint16_t v16u16 __attribute__((vector_size(32)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));
typedef uint32_t v16u32 __attribute__((vector_size(64)));
typedef float v16f __attribute__((vector_size(64)));

/* A lane's position in its block's bit sequence (bit 0 = bit 31 of the block's first word). */
typedef struct lane {
  uint32_t pos; /* next bit to decode */
  uint32_t end; /* first bit after the lane's stream */
} lane;

/* A block near the end of the data is copied here, so that windows can be loaded without bounds
 * checks: a lane reads at most 384 bits (one row of 24-bit codes) past its end before the row
 * check catches it, plus the second word of a window. */
#define BLOCK_MAX_BYTES (NWC_LANES * NWC__SC_PER_BLOCK * NWC__L1_WORDS_PER_SC * 4) /* layout 1's */
#define WINDOW_MARGIN 128

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

/* Two consecutive stream words as one 64-bit value, the first in the high half. */
static inline uint64_t load_pair(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v << 32 | v >> 32;
}

/* 64 bits of the block's bit sequence from bit pos on, left-aligned (read from three words). */
static inline uint64_t window(const uint8_t *blk, uint32_t pos) {
  const uint8_t *p = blk + 4 * (pos >> 5);
  unsigned sh = pos & 31;
  return load_pair(p) << sh | (uint64_t)load_le32(p + 8) >> (32 - sh);
}

/* exp_of_rank[r] as the table stores it. */
static inline unsigned rank_byte(const uint32_t *tab, unsigned r) {
  if (r <= 10) return (tab[0x800u >> r] >> 8) & 0x7fu;
  return (tab[(r - 11) >> 1] >> (8 + 8 * ((r - 11) & 1))) & 0xffu;
}

/* One code at pos, by counting leading zeros: the new position, or a negative errno. */
static int64_t slow_code(const decoder *d, uint32_t pos, uint8_t *byte) {
  uint64_t w = window(d->blk, pos);
  unsigned z = w ? (unsigned)__builtin_clzll(w) : 64;
  if (z < NWC_BF16_CODED_RANKS && (d->g.type == NWC_ELEM_BF16 || z < NWC_FP8_SYMBOLS)) {
    *byte = (uint8_t)((unsigned)((w >> (62 - z)) & 1u) << 7 | rank_byte(d->tab, z));
    return pos + z + 2;
  }
  NWC_RETURN_IF(z != NWC_BF16_CODED_RANKS || d->g.type != NWC_ELEM_BF16, -EBADMSG,
                "invalid code: %u leading zeros in a %s stream", z,
                d->g.type == NWC_ELEM_BF16 ? "bf16" : "fp8");
  *byte = (uint8_t)(w >> 40);
  return pos + 24;
}

/* n pairs at pos through the table, finishing slow entries code by code; e[k] receives the pair
 * as a fast entry would hold it (bytes 1 and 2).  Returns the new position or a negative errno. */
static int64_t slow_pairs(const decoder *d, int64_t pos, uint32_t *e, unsigned n) {
  for (unsigned k = 0; k < n && pos >= 0; k++) {
    uint32_t t = d->tab[window(d->blk, (uint32_t)pos) >> 52];
    uint8_t b0 = (uint8_t)(t >> 8), b1 = 0;
    if (!(t & NWC_TAB_SLOW)) {
      e[k] = t;
      pos += t & 0xffu;
      continue;
    }
    /* the entry holds a complete first code; fp8 ranks >= 10 (length 12) go to slow_code, which
     * rejects them like any other invalid code */
    if ((t & 0xffu) && (d->g.type == NWC_ELEM_BF16 || (t & 0xffu) <= NWC_FP8_SYMBOLS + 1))
      pos += t & 0xffu;
    else
      pos = slow_code(d, (uint32_t)pos, &b0);
    if (pos >= 0) pos = slow_code(d, (uint32_t)pos, &b1);
    e[k] = (uint32_t)b0 << 8 | (uint32_t)b1 << 16;
  }
  return pos;
}

/* The 8 pairs of one lane's weights in the current row, as table entries (byte 1: weight 2k,
 * byte 2: weight 2k + 1).  One 64-bit window serves four lookups (four fast pairs use at most
 * 48 bits). */
static inline int decode_lane_row(const decoder *d, lane *s, uint32_t e[8]) {
  uint32_t pos = s->pos;
  for (unsigned k = 0; k < 8; k += 4) {
    uint64_t w = window(d->blk, pos);
    /* a fast entry's bit count is at most 12, so & 63 is & 0xff (and free on x86) */
    uint32_t e0 = d->tab[w >> 52];
    uint64_t w1 = w << (e0 & 63u);
    uint32_t e1 = d->tab[w1 >> 52];
    uint64_t w2 = w1 << (e1 & 63u);
    uint32_t e2 = d->tab[w2 >> 52];
    uint32_t e3 = d->tab[(w2 << (e2 & 63u)) >> 52];
    if (NWC__LIKELY(!((e0 | e1 | e2 | e3) & NWC_TAB_SLOW))) {
      e[k] = e0, e[k + 1] = e1, e[k + 2] = e2, e[k + 3] = e3;
      pos += (e0 + e1 + e2 + e3) & 0xffu; /* the four bit counts sum to at most 48 */
    } else {
      int64_t p = slow_pairs(d, pos, e + k, 4);
      if (p < 0) return (int)p;
      pos = (uint32_t)p;
    }
  }
  NWC_RETURN_IF(pos > s->end, -EBADMSG, "lane stream overrun: codes need bit %u of %u", pos,
                s->end);
  s->pos = pos;
  return 0;
}

/* Checks block b's offsets and lengths and points the lane states at its streams: lane l takes
 * hdr[l] units of unit_bits bits (layout 0: 16-bit units; layout 1: words), at most max_units. */
static int lanes_begin(decoder *d, uint64_t b, unsigned unit_bits, unsigned max_units) {
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
    NWC_RETURN_IF(hdr[l] > max_units, -EBADMSG, "block %llu: lane %u claims %u units of %u bits",
                  (unsigned long long)b, l, hdr[l], unit_bits);
    d->lanes[l] = (lane){unit_bits * u, unit_bits * (u + hdr[l])};
    u += hdr[l];
  }
  uint64_t bytes = 4 * nwc__ceil_div((uint64_t)u * unit_bits, 32);
  NWC_RETURN_IF(bytes > end - base, -EBADMSG,
                "block %llu: lane streams (%u units) overrun the block's %llu bytes",
                (unsigned long long)b, u, (unsigned long long)(end - base));
  d->blk = t->data + base;
  if (t->data_bytes - base - bytes < WINDOW_MARGIN) {
    memcpy(d->pad, d->blk, bytes);
    memset(d->pad + bytes, 0, sizeof d->pad - bytes);
    d->blk = d->pad;
  }
  return 0;
}

static int block_begin(decoder *d, uint64_t b) {
  NWC_TRY(lanes_begin(d, b, NWC_UNIT_BITS, NWC_LANE_MAX_UNITS));
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

/* One lane's 16 weights at column c0 of a row as BF16: the decoded high bytes from the pair
 * entries, the low bytes from the row's raw plane (BF16: mantissa bytes; fp8: nibble << 4). */
static inline void lane_bf16(const uint32_t e[8], const uint8_t *row, uint64_t c0, unsigned type,
                             uint16_t out[16]) {
  uint8_t lo[16];
  if (type == NWC_ELEM_BF16) {
    memcpy(lo, row + c0, 16);
  } else { /* word 0: weights 0..3 in the low nibbles, 4..7 in the high ones; word 1: 8..15 */
    uint32_t q[2], v[4];
    memcpy(q, row + c0 / 2, 8);
    v[0] = (q[0] & 0x0f0f0f0fu) << 4, v[1] = q[0] & 0xf0f0f0f0u;
    v[2] = (q[1] & 0x0f0f0f0fu) << 4, v[3] = q[1] & 0xf0f0f0f0u;
    memcpy(lo, v, 16);
  }
  /* As 32-bit pairs: weight 2k = e[k] byte 1 : lo[2k], weight 2k + 1 = e[k] byte 2 : lo[2k + 1]. */
  v8u32 ev, l32, o;
  v16u8 lv;
  memcpy(&ev, e, sizeof ev);
  memcpy(&lv, lo, sizeof lv);
  v16u16 l16 = __builtin_convertvector(lv, v16u16);
  memcpy(&l32, &l16, sizeof l32);
  o = (ev & 0xff00u) | ((ev << 8) & 0xff000000u) | l32;
  memcpy(out, &o, sizeof o);
}

/* Decodes rows [0, nrows) of block b; row `keep` (or every row if keep < 0) goes to
 * out + (row - first_out_row) * K16 for rows below M. */
static int dequant_block(decoder *d, uint64_t b, unsigned nrows, int keep, uint16_t *out,
                         uint64_t first_out_row) {
  NWC_TRY(block_begin(d, b));
  /* Locals, not d->...: the output stores may alias anything behind a pointer. */
  const unsigned type = d->g.type, active = d->active;
  const uint64_t rb = b / d->g.col_blocks, c_base = (b % d->g.col_blocks) * NWC_BLOCK_COLS;
  for (unsigned i = 0; i < nrows; i++) {
    uint64_t r = rb * NWC_BLOCK_ROWS + i;
    int want = keep < 0 || (unsigned)keep == i;
    const uint8_t *raw_row = d->t->raw + r * d->g.raw_stride;
    /* only for kept rows: gather's first_out_row is the kept row, rows before it would point
     * before out (undefined behaviour even unused) */
    uint16_t *out_row = want ? out + (r - first_out_row) * d->g.K16 : NULL;
    for (unsigned l = 0; l < active; l++) {
      uint32_t e[8];
      NWC_TRY(decode_lane_row(d, &d->lanes[l], e));
      if (!want) continue;
      uint64_t c0 = c_base + (uint64_t)l * NWC_LANE_COLS;
      lane_bf16(e, raw_row, c0, type, out_row + c0);
    }
  }
  return 0;
}

int nwc__l0_dequant_range(const nwc_tensor *t, uint64_t rb_begin, uint64_t rb_end, uint16_t *out) {
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

int nwc__l0_gather(const nwc_tensor *t, const uint64_t *rows, uint64_t n, uint16_t *out) {
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

/* acc += w * x for one lane's 16 weights (BF16 bits) and activations. */
static inline void lane_fma(v16f *acc, const uint16_t w[16], const float *x) {
  v16u16 wv;
  v16f xv, wf;
  memcpy(&wv, w, sizeof wv);
  memcpy(&xv, x, sizeof xv);
  v16u32 bits = __builtin_convertvector(wv, v16u32) << 16;
  memcpy(&wf, &bits, sizeof wf);
  *acc += wf * xv;
}

/* The 16 partial sums of a row, added in a fixed pairwise order. */
static inline float hsum16(const v16f *acc) {
  float s[16];
  memcpy(s, acc, sizeof s);
  for (unsigned half = 8; half; half >>= 1)
    for (unsigned j = 0; j < half; j++) s[j] += s[j + half];
  return s[0];
}

int nwc__l0_matvec(const nwc_tensor *t, const float *x, const float *bias, float *y,
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
        const uint8_t *raw_row = t->raw + r * d->g.raw_stride;
        v16f row = {0};
        for (unsigned l = 0; l < d->active; l++) {
          uint32_t e[8];
          uint16_t wv[16];
          if ((rc = decode_lane_row(d, &d->lanes[l], e)) < 0) break;
          uint64_t c0 = cb * NWC_BLOCK_COLS + (uint64_t)l * NWC_LANE_COLS;
          lane_bf16(e, raw_row, c0, d->g.type, wv);
          lane_fma(&row, wv, x + c0);
        }
        acc[i] += hsum16(&row);
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

/* ---- hooks: this lane decoder for layout 1 and the batched matvec (store/layouts.h) -------- */

struct nwc__pcdec {
  decoder d;
};

nwc__pcdec *nwc__pcdec_new(const nwc_tensor *t, int *rc) {
  nwc__pcdec *pc = malloc(sizeof *pc);
  *rc = pc ? decoder_init(&pc->d, t) : -ENOMEM;
  if (*rc < 0) {
    free(pc);
    return NULL;
  }
  return pc;
}

void nwc__pcdec_free(nwc__pcdec *pc) { free(pc); }

int nwc__pcdec_l0_begin(nwc__pcdec *pc, uint64_t b, unsigned *active) {
  NWC_TRY(block_begin(&pc->d, b));
  *active = pc->d.active;
  return 0;
}

int nwc__pcdec_l0_row(nwc__pcdec *pc, unsigned l, uint64_t r, uint64_t c0, uint16_t w[16]) {
  uint32_t e[8];
  NWC_TRY(decode_lane_row(&pc->d, &pc->d.lanes[l], e));
  lane_bf16(e, pc->d.t->raw + r * pc->d.g.raw_stride, c0, pc->d.g.type, w);
  return 0;
}

/* Layout 1: the lanes' streams are whole words, one after the other (hdr = words); 256 codes
 * of at most 24 bits make at most 192 words. */
int nwc__pcdec_l1_begin(nwc__pcdec *pc, uint64_t b) {
  return lanes_begin(&pc->d, b, 32, NWC__SC_PER_BLOCK * NWC__L1_WORDS_PER_SC);
}

int nwc__pcdec_lanes16(nwc__pcdec *pc, uint32_t lanes, uint8_t h[][16]) {
  for (; lanes; lanes &= lanes - 1) {
    unsigned l = (unsigned)__builtin_ctz(lanes);
    uint32_t e[8];
    NWC_TRY(decode_lane_row(&pc->d, &pc->d.lanes[l], e));
    uint64_t v[2] = {0, 0}; /* two plain 8-byte stores: no wide reload of narrow stores */
    for (unsigned k = 0; k < 8; k++) v[k >> 2] |= (uint64_t)((e[k] >> 8) & 0xffffu) << 16 * (k & 3);
    memcpy(h[l], &v[0], 8);
    memcpy(h[l] + 8, &v[1], 8);
  }
  return 0;
}
