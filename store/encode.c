/*
 * encode.c - the host encoder (layout 0): symbol histogram, exp_of_rank, per-lane code lengths,
 * block offsets, then the lane bit streams and the raw plane.
 *
 * Two passes over the weights: the first counts symbols, which fixes exp_of_rank, the codes and
 * (from the counts) an upper bound of the data size; the second writes the lane streams block by
 * block, recording each lane's length and each block's offset as it goes.  Only a caller that asks
 * nwc_encode for the exact size first pays a third pass (plan_lengths).  The code of every input
 * byte is looked up in a 256-entry table (BF16: the high byte; fp8: the whole byte).
 *
 * Several threads (nwc__enc_*): the tensor is cut into bands of whole row blocks, which the
 * threads take one at a time.  Each band counts its own symbols (so, once the codes are fixed,
 * its own bound of the bytes it can take); band i writes its blocks at the sum of the bounds of
 * bands 0..i-1, and the bands are then moved down, in order, to where they end up back to back,
 * their bases shifted.  Block offsets are relative to the data start and blocks depend only on
 * their own weights, so the output is byte for byte that of one thread.
 */
#include "encode_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct code {
  uint32_t bits; /* right-aligned */
  uint32_t len;  /* 2..24 */
} code;

typedef struct plan {
  nwc__geom g;
  const void *w;       /* the input: uint16_t BF16 or uint8_t fp8 (NULL: read band by band) */
  int bf16;            /* g.type == NWC_ELEM_BF16 */
  code codes[256];     /* by input byte (BF16: high byte) */
  uint64_t *pair;      /* NULL, or by two input bytes (first << 8 | second): both codes, their
                        * length << 32; a length above 32 (an escape): code them one by one */
  uint8_t len[256];    /* codes[].len */
  uint8_t nib[256];    /* fp8: raw nibble by input byte */
  unsigned sym_of[256]; /* fp8: symbol by input byte (NWC_FP8_SYMBOLS: NaN) */
  uint8_t sym_len[128]; /* code length by symbol (fillers: 2) */
  uint64_t code_bits;  /* all codes of the tensor, fillers included */
  uint64_t data_bytes; /* set by plan_lengths */
} plan;

/* The error for an fp8 NaN at weight i of rows of K weights. */
static int fp8_nan(uint64_t i, uint64_t K) {
  return nwc__fail(-EINVAL, "fp8 weight %llu (row %llu, column %llu) is NaN", (unsigned long long)i,
                   (unsigned long long)(i / K), (unsigned long long)(i % K));
}

/* Ranks symbols by descending count, ties by ascending symbol; writes order[0..nsym). */
static void rank_symbols(const uint64_t *freq, unsigned nsym, unsigned *order) {
  for (unsigned i = 0; i < nsym; i++) order[i] = i;
  for (unsigned i = 1; i < nsym; i++) { /* insertion sort: stable, nsym <= 128 */
    unsigned s = order[i], j = i;
    while (j > 0 && freq[order[j - 1]] < freq[s]) {
      order[j] = order[j - 1];
      j--;
    }
    order[j] = s;
  }
}

/* Adds the symbols of `rows` rows at src to freq (128 counters for BF16, NWC_FP8_SYMBOLS for
 * fp8); -EINVAL for an fp8 NaN (the detail's weight index counts from src). */
static int count_rows(const plan *p, const void *src, uint64_t rows, uint64_t *freq) {
  uint64_t n = rows * p->g.K;
  if (!p->bf16) return nwc__fp8_count(src, n, p->g.K, p->sym_of, NWC_FP8_SYMBOLS, freq);
  const uint16_t *w = src;
  for (uint64_t at = 0; at < n;) { /* segments of at most 2^31 weights: the counters are 32-bit */
    uint64_t end = n - at < (UINT64_C(1) << 31) ? n : at + (UINT64_C(1) << 31), i = at;
    uint32_t f[8][128] = {{0}}; /* eight tables: runs of one exponent do not serialize */
    for (; i + 8 <= end; i += 8) { /* two 8-byte loads: four high bytes each */
      uint64_t a, b;
      memcpy(&a, w + i, 8);
      memcpy(&b, w + i + 4, 8);
      for (unsigned k = 0; k < 4; k++) {
        f[k][(a >> (16 * k + 8)) & 0x7f]++;
        f[k + 4][(b >> (16 * k + 8)) & 0x7f]++;
      }
    }
    for (; i < end; i++) f[0][(w[i] >> 8) & 0x7f]++;
    for (unsigned s = 0; s < 128; s++)
      for (unsigned k = 0; k < 8; k++) freq[s] += f[k][s];
    at = end;
  }
  return 0;
}

/* Bits of the codes of rows [r0, r1) whose symbols freq counted, fillers included. */
static uint64_t rows_code_bits(const plan *p, const uint64_t *freq, uint64_t r0, uint64_t r1) {
  uint64_t bits = 2 * (r1 - r0) * (p->g.K16 - p->g.K);
  for (unsigned s = 0; s < (p->bf16 ? 128u : NWC_FP8_SYMBOLS); s++) bits += freq[s] * p->sym_len[s];
  return bits;
}

/* The fp8 symbol and nibble of every byte (before counting). */
static void plan_fp8_split(plan *p) {
  for (unsigned b = 0; b < 256; b++) {
    unsigned s = 0, nib = 0;
    p->sym_of[b] = nwc__fp8_split((uint8_t)b, &s, &nib) < 0 ? NWC_FP8_SYMBOLS : s;
    p->nib[b] = (uint8_t)nib;
  }
}

/* Ranks the tensor's symbols (freq, all of its weights) into psym and the codes. */
static void plan_codes(plan *p, const uint64_t *freq, uint8_t psym[16]) {
  unsigned order[128], rank_of[128];
  memset(psym, 0, NWC_RANKS);
  if (p->bf16) {
    rank_symbols(freq, 128, order);
    for (unsigned r = 0; r < 128; r++) rank_of[order[r]] = r;
    for (unsigned r = 0; r < NWC_BF16_CODED_RANKS; r++) psym[r] = (uint8_t)order[r];
    for (unsigned b = 0; b < 256; b++) {
      unsigned r = rank_of[b & 0x7f];
      if (r < NWC_BF16_CODED_RANKS)
        p->codes[b] = (code){2u | (b >> 7), r + 2};
      else
        p->codes[b] = (code){0x100u | b, 24}; /* 15 zeros, a one, the byte */
    }
    for (unsigned sym = 0; sym < 128; sym++) p->sym_len[sym] = (uint8_t)p->codes[sym].len;
  } else {
    rank_symbols(freq, NWC_FP8_SYMBOLS, order);
    for (unsigned r = 0; r < NWC_FP8_SYMBOLS; r++) {
      rank_of[order[r]] = r;
      psym[r] = nwc__fp8_sym_byte[order[r]];
    }
    for (unsigned b = 0; b < 256; b++) {
      unsigned r = p->sym_of[b] < NWC_FP8_SYMBOLS ? rank_of[p->sym_of[b]] : 0; /* NaNs never reach here */
      p->codes[b] = (code){2u | (b >> 7), r + 2};
    }
    for (unsigned sym = 0; sym < NWC_FP8_SYMBOLS; sym++) p->sym_len[sym] = (uint8_t)(rank_of[sym] + 2);
  }
  p->code_bits = rows_code_bits(p, freq, 0, p->g.M);
}

static int plan_symbols(plan *p, uint64_t *freq_out, uint8_t psym[16]) {
  uint64_t freq[128] = {0};
  if (!p->bf16) plan_fp8_split(p);
  NWC_TRY(count_rows(p, p->w, p->g.M, freq));
  plan_codes(p, freq, psym);
  if (freq_out) memcpy(freq_out, freq, (p->bf16 ? 128 : NWC_FP8_SYMBOLS) * sizeof *freq);
  return 0;
}

/* Padding a block may add to its codes: at most 15 bits per lane, 16 to a whole word, 7 bytes of
 * alignment. */
#define BLOCK_PAD_BYTES (NWC_LANES * 2 + 2 + 7)

/* Upper bound of data_bytes: the codes, the padding of every block, the slack. */
static uint64_t plan_bound(const plan *p) {
  return nwc__ceil_div(p->code_bits, 8) + p->g.nblocks * BLOCK_PAD_BYTES + NWC_DATA_SLACK;
}

/* The exact sizes without writing: sums code lengths per lane, fills hdr[] and bases[], sets
 * p->data_bytes (for nwc_encode's size query). */
static int plan_lengths(plan *p, uint64_t *bases, uint8_t *hdr) {
  const nwc__geom *g = &p->g;
  for (unsigned b = 0; b < 256; b++) p->len[b] = (uint8_t)p->codes[b].len;
  uint64_t lanes_per_band = g->col_blocks * NWC_LANES;
  uint64_t *bits = calloc(lanes_per_band, sizeof *bits);
  if (!bits) return -ENOMEM;
  uint64_t off = 0;
  for (uint64_t rb = 0; rb < g->row_blocks; rb++) {
    memset(bits, 0, lanes_per_band * sizeof *bits);
    uint64_t r0 = rb * NWC_BLOCK_ROWS, r1 = r0 + NWC_BLOCK_ROWS < g->M ? r0 + NWC_BLOCK_ROWS : g->M;
    for (uint64_t r = r0; r < r1; r++) /* per lane: a sum in a register, one store */
      for (uint64_t c0 = 0; c0 < g->K; c0 += NWC_LANE_COLS) {
        unsigned n = g->K - c0 < NWC_LANE_COLS ? (unsigned)(g->K - c0) : NWC_LANE_COLS, sum = 0;
        if (p->bf16)
          for (unsigned j = 0; j < n; j++) sum += p->len[((const uint16_t *)p->w)[r * g->K + c0 + j] >> 8];
        else
          for (unsigned j = 0; j < n; j++) sum += p->len[((const uint8_t *)p->w)[r * g->K + c0 + j]];
        bits[c0 / NWC_LANE_COLS] += sum;
      }
    for (uint64_t l = 0; l < lanes_per_band; l++) {
      uint64_t c0 = l * NWC_LANE_COLS;
      if (c0 >= g->K16) continue; /* an inactive lane: empty stream */
      uint64_t cols = g->K - c0 < NWC_LANE_COLS ? g->K - c0 : NWC_LANE_COLS;
      bits[l] += 2 * (r1 - r0) * (NWC_LANE_COLS - cols); /* fillers K..K16-1: rank 0, sign 0 */
    }
    for (uint64_t cb = 0; cb < g->col_blocks; cb++) {
      uint64_t b = rb * g->col_blocks + cb, units = 0;
      bases[b] = off;
      for (unsigned l = 0; l < NWC_LANES; l++) {
        uint64_t ul = nwc__ceil_div(bits[cb * NWC_LANES + l], NWC_UNIT_BITS);
        hdr[b * NWC_LANES + l] = (uint8_t)ul;
        units += ul;
      }
      off += nwc__block_span(units);
    }
  }
  bases[g->nblocks] = off;
  p->data_bytes = off + NWC_DATA_SLACK;
  free(bits);
  return 0;
}

static inline void put_word(uint8_t *dst, uint32_t v) {
  dst[0] = (uint8_t)v;
  dst[1] = (uint8_t)(v >> 8);
  dst[2] = (uint8_t)(v >> 16);
  dst[3] = (uint8_t)(v >> 24);
}

/* MSB-first bit writer into little-endian 32-bit words. */
typedef struct bitw {
  uint8_t *dst;
  uint64_t acc; /* pending bits, right-aligned */
  unsigned n;   /* number of pending bits (< 32 between calls) */
} bitw;

/* Appends the len (<= 32) low bits of bits.  Branch-free: the word in progress is stored on every
 * call (a partial one is stored again until it is whole), and dst moves on when it is whole. */
static inline void bitw_put(bitw *w, uint32_t bits, unsigned len) {
  w->acc = (w->acc << len) | bits;
  w->n += len;
  unsigned whole = w->n >= 32;
  w->n -= 32 * whole;
  put_word(w->dst, (uint32_t)(w->acc >> w->n));
  w->dst += 4 * whole;
}

/* Pads with zero bits to a multiple of `align` bits (16: a lane's end; 32: the block's end). */
static inline void bitw_pad(bitw *w, unsigned align) {
  unsigned r = w->n % align;
  if (r) bitw_put(w, 0, align - r);
}

/* Codes of one lane's 16 weights of a row: n real ones from src (stride 1), then fillers.  With a
 * pair table, two weights at a time: one table load and one accumulator update per pair. */
static inline void put_lane_row(bitw *w, const code *codes, const uint64_t *pair,
                                const uint16_t *w16, const uint8_t *w8, unsigned n) {
  unsigned j = 0;
  for (; pair && j + 2 <= n; j += 2) {
    unsigned a = w16 ? (unsigned)(w16[j] >> 8) : w8[j], b = w16 ? (unsigned)(w16[j + 1] >> 8) : w8[j + 1];
    uint64_t e = pair[a << 8 | b];
    if (NWC__UNLIKELY((e >> 32) > 32)) { /* an escape: the first code alone, then the second */
      bitw_put(w, codes[a].bits, codes[a].len);
      e = (uint64_t)codes[b].len << 32 | codes[b].bits;
    }
    bitw_put(w, (uint32_t)e, (unsigned)(e >> 32));
  }
  for (; j < n; j++) {
    code c = codes[w16 ? (unsigned)(w16[j] >> 8) : w8[j]];
    bitw_put(w, c.bits, c.len);
  }
  for (j = n; j < NWC_LANE_COLS; j++) bitw_put(w, 2u, 2); /* filler columns below K16 */
}

/* Writes the lane streams of blocks [b0, b1) one after the other from data + off, filling their
 * hdr[] and bases[] (relative to data) from the weights at src (row row0 on); returns the offset
 * after them.  data must hold their bound. */
static uint64_t write_blocks(const plan *p, uint64_t b0, uint64_t b1, const void *src, uint64_t row0,
                             uint64_t off, uint64_t *bases, uint8_t *hdr, uint8_t *data) {
  const nwc__geom *g = &p->g;
  /* Locals, not p->...: the byte stores below may alias anything behind a pointer. */
  const uint64_t K = g->K, K16 = g->K16, M = g->M, cbs = g->col_blocks;
  const uint16_t *w16 = p->bf16 ? src : NULL;
  const uint8_t *w8 = p->bf16 ? NULL : src;
  const code *codes = p->codes;
  const uint64_t *pair = p->pair;
  for (uint64_t b = b0; b < b1; b++) {
    uint64_t rb = b / cbs, cb = b % cbs;
    uint64_t r0 = rb * NWC_BLOCK_ROWS, r1 = r0 + NWC_BLOCK_ROWS < M ? r0 + NWC_BLOCK_ROWS : M;
    uint8_t *blk = data + off;
    bitw w = {blk, 0, 0};
    bases[b] = off;
    for (unsigned l = 0; l < NWC_LANES; l++) {
      uint64_t start = (uint64_t)(w.dst - blk) * 8 + w.n;
      uint64_t c0 = cb * NWC_BLOCK_COLS + (uint64_t)l * NWC_LANE_COLS;
      unsigned n = c0 >= K ? 0 : K - c0 < NWC_LANE_COLS ? (unsigned)(K - c0) : NWC_LANE_COLS;
      for (uint64_t r = r0; r < r1 && c0 < K16; r++) {
        if (w16)
          put_lane_row(&w, codes, pair, w16 + (r - row0) * K + c0, NULL, n);
        else
          put_lane_row(&w, codes, pair, NULL, w8 + (r - row0) * K + c0, n);
      }
      bitw_pad(&w, NWC_UNIT_BITS);
      hdr[b * NWC_LANES + l] = (uint8_t)(((uint64_t)(w.dst - blk) * 8 + w.n - start) / NWC_UNIT_BITS);
    }
    bitw_pad(&w, 32);
    uint64_t end = off + nwc__round_up((uint64_t)(w.dst - blk), NWC_DATA_ALIGN);
    memset(w.dst, 0, (size_t)(data + end - w.dst)); /* alignment padding */
    off = end;
  }
  return off;
}

/* The fewest weights worth building the pair table for (65536 entries). */
#define PAIR_MIN_WEIGHTS (UINT64_C(1) << 18)

/* Builds p->pair for a tensor large enough; without memory, codes go one by one. */
static void plan_pairs(plan *p) {
  if (p->pair || p->g.M * p->g.K < PAIR_MIN_WEIGHTS || !(p->pair = malloc(65536 * sizeof *p->pair)))
    return;
  for (unsigned a = 0; a < 256; a++)
    for (unsigned b = 0; b < 256; b++) {
      code x = p->codes[a], y = p->codes[b];
      uint64_t len = x.len + y.len;
      p->pair[a << 8 | b] = len > 32 ? UINT64_C(64) << 32 : len << 32 | (uint64_t)x.bits << y.len | y.bits;
    }
}

static void plan_free(plan *p) {
  if (p) free(p->pair);
  free(p);
}

/* Every block's streams, bases[nblocks] and the slack; returns data_bytes.  data must hold
 * plan_bound(p) bytes. */
static uint64_t write_streams(plan *p, uint64_t *bases, uint8_t *hdr, uint8_t *data) {
  plan_pairs(p);
  uint64_t off = write_blocks(p, 0, p->g.nblocks, p->w, 0, 0, bases, hdr, data);
  bases[p->g.nblocks] = off;
  memset(data + off, 0, NWC_DATA_SLACK);
  return off + NWC_DATA_SLACK;
}

/* Bytes [b0, b1) of one row of the raw plane (src: the row's weights) into out. */
static void raw_row(const plan *p, const void *src, uint64_t b0, uint64_t b1, uint8_t *out) {
  const uint64_t K = p->g.K; /* a local: byte stores may alias *p */
  if (p->bf16) {
    const uint16_t *w = src;
    uint64_t c1 = b1 < K ? b1 : K, c = b0;
    for (; c < c1; c++) out[c - b0] = (uint8_t)w[c];
    if (c < b1) memset(out + (c - b0), 0, b1 - c);
    return;
  }
  const uint8_t *w = src, *nib = p->nib;
  for (uint64_t b = b0; b < b1; b++) { /* byte t of a lane's 8: weights j and j + 4 (format.md) */
    unsigned t = (unsigned)(b % 8), j = (t & 3u) + 8u * (t >> 2);
    uint64_t c = b / 8 * NWC_LANE_COLS + j;
    out[b - b0] = (uint8_t)((c < K ? nib[w[c]] : 0) | (c + 4 < K ? nib[w[c + 4]] << 4 : 0));
  }
}

/* The raw plane's rows [r0, r1) from the weights at w (row r0 on) into out (row r0 on). */
static void write_raw(const plan *p, const void *w, uint64_t r0, uint64_t r1, uint8_t *out) {
  uint64_t stride = p->g.raw_stride, row_bytes = p->g.K * (p->bf16 ? 2 : 1);
  for (uint64_t r = r0; r < r1; r++)
    raw_row(p, (const uint8_t *)w + (r - r0) * row_bytes, 0, stride, out + (r - r0) * stride);
}

static int plan_init(plan *p, const void *w, uint64_t n, uint64_t K, unsigned elem, uint64_t *freq,
                     uint8_t psym[16]) {
  memset(p, 0, sizeof *p);
  NWC_TRY(nwc__encode_args(w, n, K));
  NWC_TRY(nwc__geom_init(&p->g, n / K, K, elem));
  p->w = w;
  p->bf16 = p->g.type == NWC_ELEM_BF16;
  return plan_symbols(p, freq, psym);
}

int64_t nwc__l0_encode(const void *w, uint64_t n, uint64_t K, unsigned elem, uint64_t *freq,
                       uint8_t psym[16], uint64_t *bases, uint8_t *hdr, uint8_t *data, uint64_t cap,
                       uint8_t *raw) {
  NWC_RETURN_IF(!psym || !bases || !hdr, -EINVAL, "nwc_encode: missing output array");
  plan *p = malloc(sizeof *p);
  if (!p) return -ENOMEM;
  int64_t rc = plan_init(p, w, n, K, elem, freq, psym);
  /* The exact size costs a pass of its own: only for a size query or a tight buffer. */
  if (rc == 0 && (!data || cap < plan_bound(p))) {
    rc = plan_lengths(p, bases, hdr);
    if (rc == 0 && data && (cap < p->data_bytes || !raw))
      rc = nwc__fail(-ENOSPC, "nwc_encode: needs %llu data bytes, got %llu",
                     (unsigned long long)p->data_bytes, (unsigned long long)cap);
    if (rc == 0 && !data) rc = (int64_t)p->data_bytes;
  }
  if (rc == 0 && data && !raw) rc = nwc__fail(-EINVAL, "nwc_encode: no raw plane");
  if (rc == 0 && data) {
    rc = (int64_t)write_streams(p, bases, hdr, data);
    write_raw(p, p->w, 0, p->g.M, raw);
  }
  plan_free(p);
  return rc;
}

int nwc__l0_tensor_encode(const void *w, uint64_t rows, uint64_t cols, unsigned elem,
                          const float *scale, nwc_tensor *t) {
  NWC_RETURN_IF(!t, -EINVAL, "nwc_tensor_encode: no output");
  memset(t, 0, sizeof *t);
  uint64_t lay[4];
  NWC_TRY(nwc_layout(rows, cols, elem, lay));
  uint64_t nb = lay[NWC_LAYOUT_BLOCKS], raw_bytes = lay[NWC_LAYOUT_RAW_BYTES];
  size_t meta = (size_t)((nb + 1) * 8 + nb * NWC_LANES);
  plan *p = malloc(sizeof *p);
  int rc = p ? 0 : -ENOMEM;
  if (rc == 0) rc = plan_init(p, w, rows * cols, cols, elem, NULL, t->psym);
  uint8_t *all = NULL;
  if (rc == 0) {
    /* One allocation; the data area is the bound, about 1 % above what the streams take. */
    size_t scale_bytes = scale ? (size_t)rows * sizeof(float) : 0;
    size_t meta8 = nwc__round_up(meta, 8), data8 = nwc__round_up(plan_bound(p), 8);
    all = malloc(meta8 + data8 + nwc__round_up(raw_bytes, 8) + scale_bytes);
    if (!all) rc = -ENOMEM;
    if (all) {
      uint8_t *data = all + meta8, *raw = data + data8;
      uint64_t *bases = (uint64_t *)all;
      uint8_t *hdr = all + (nb + 1) * 8;
      t->bases = bases;
      t->hdr = hdr;
      p->data_bytes = write_streams(p, bases, hdr, data);
      write_raw(p, p->w, 0, rows, raw);
      if (scale) {
        memcpy(raw + nwc__round_up(raw_bytes, 8), scale, scale_bytes);
        t->scale = (const float *)(raw + nwc__round_up(raw_bytes, 8));
      }
      t->elem = elem;
      t->rows = rows;
      t->cols = cols;
      t->nblocks = nb;
      t->data = data;
      t->data_bytes = p->data_bytes;
      t->raw = raw;
      t->raw_bytes = raw_bytes;
      t->owned = all;
    }
  }
  plan_free(p);
  return rc;
}

/* ---- on several threads (store/encode_internal.h) ------------------------------------------ */

typedef struct band {
  uint64_t rb0, rb1;   /* row blocks */
  uint64_t freq[128];  /* symbols of its rows */
  uint64_t at, bytes;  /* where its streams are written first, their length */
  uint64_t nan_at;     /* err -EINVAL: the weight that is an fp8 NaN */
  int err;
} band;

struct nwc__enc {
  plan p;
  unsigned threads;
  uint64_t nbands;
  band *band;
  uint64_t bound;
  nwc__enc_read_fn read; /* the input comes from it, a piece at a time, or is p.w */
  void *read_ctx;
  uint64_t piece_rbs;    /* row blocks per piece read */
  uint8_t **buf;         /* a piece buffer per thread (read only) */
  uint64_t *bases;       /* the streams task's output arrays */
  uint8_t *hdr, *data, *raw;
};

typedef struct team {
  void (*fn)(void *ctx, uint64_t task, unsigned thread);
  void *ctx;
  uint64_t ntasks, next; /* next: taken atomically */
  unsigned nthreads;     /* handed out atomically */
} team;

static void *team_main(void *arg) {
  team *t = arg;
  unsigned me = __atomic_fetch_add(&t->nthreads, 1, __ATOMIC_RELAXED);
  for (uint64_t i; (i = __atomic_fetch_add(&t->next, 1, __ATOMIC_RELAXED)) < t->ntasks;)
    t->fn(t->ctx, i, me);
  return NULL;
}

void nwc__parallel_for(unsigned threads, uint64_t ntasks,
                       void (*fn)(void *ctx, uint64_t task, unsigned thread), void *ctx) {
  team t = {fn, ctx, ntasks, 0, 0};
  pthread_t tid[NWC__MAX_THREADS];
  unsigned n = 0;
  if (threads > ntasks) threads = ntasks > 0 ? (unsigned)ntasks : 1;
  if (threads > NWC__MAX_THREADS) threads = NWC__MAX_THREADS;
  while (n + 1 < threads && pthread_create(&tid[n], NULL, team_main, &t) == 0) n++;
  team_main(&t); /* a thread that could not start leaves its tasks to the others */
  for (unsigned i = 0; i < n; i++) pthread_join(tid[i], NULL);
}

/* The rows of row blocks [rb, rb + n) clipped to M: their first row, their count. */
static uint64_t piece_rows(const plan *p, uint64_t rb, uint64_t n, uint64_t *r0) {
  uint64_t r1 = (rb + n) * NWC_BLOCK_ROWS;
  *r0 = rb * NWC_BLOCK_ROWS;
  return (r1 < p->g.M ? r1 : p->g.M) - *r0;
}

/* The weights of rows [r0, r0 + rows) (at most a piece): p.w's, or read into the thread's buffer. */
static int piece_of_rows(nwc__enc *e, unsigned thread, uint64_t r0, uint64_t rows, const void **src) {
  uint64_t row_bytes = e->p.g.K * (e->p.bf16 ? 2 : 1);
  if (!e->read) {
    *src = (const uint8_t *)e->p.w + r0 * row_bytes;
    return 0;
  }
  *src = e->buf[thread];
  return e->read(e->read_ctx, r0 * row_bytes, rows * row_bytes, e->buf[thread]);
}

/* The weights of row blocks [rb, rb + n). */
static int piece(nwc__enc *e, unsigned thread, uint64_t rb, uint64_t n, const void **src) {
  uint64_t r0, rows = piece_rows(&e->p, rb, n, &r0);
  return piece_of_rows(e, thread, r0, rows, src);
}

/* Row blocks of the piece of band b that starts at row block rb. */
static uint64_t piece_len(const nwc__enc *e, const band *b, uint64_t rb) {
  return b->rb1 - rb < e->piece_rbs ? b->rb1 - rb : e->piece_rbs;
}

static void task_count(void *ctx, uint64_t i, unsigned thread) {
  nwc__enc *e = ctx;
  band *b = &e->band[i];
  for (uint64_t rb = b->rb0, n; rb < b->rb1 && !b->err; rb += n) {
    const void *src;
    uint64_t r0;
    n = piece_len(e, b, rb);
    b->err = piece(e, thread, rb, n, &src);
    uint64_t rows = piece_rows(&e->p, rb, n, &r0), j = 0;
    if (!b->err) b->err = count_rows(&e->p, src, rows, b->freq);
    if (b->err == -EINVAL) { /* fp8: find the NaN, for the caller's thread to name */
      while (e->p.sym_of[((const uint8_t *)src)[j]] != NWC_FP8_SYMBOLS) j++;
      b->nan_at = r0 * e->p.g.K + j;
    }
  }
}

static void task_streams(void *ctx, uint64_t i, unsigned thread) {
  nwc__enc *e = ctx;
  band *b = &e->band[i];
  uint64_t cbs = e->p.g.col_blocks, off = 0;
  for (uint64_t rb = b->rb0, n; rb < b->rb1 && !b->err; rb += n) {
    const void *src;
    n = piece_len(e, b, rb);
    b->err = piece(e, thread, rb, n, &src);
    if (!b->err)
      off = write_blocks(&e->p, rb * cbs, (rb + n) * cbs, src, rb * NWC_BLOCK_ROWS, off, e->bases,
                         e->hdr, e->data + b->at);
  }
  b->bytes = off;
}

/* The first error of any band (0: none), each band's cleared. */
static int bands_error(nwc__enc *e) {
  int rc = 0;
  for (uint64_t i = 0; i < e->nbands; i++) {
    if (!rc) rc = e->band[i].err;
    e->band[i].err = 0;
  }
  return rc;
}

/* Bands per thread (more than one, so that a thread that is descheduled delays little), the
 * fewest weights worth a band of their own, and the bytes of input read at a time (whole row
 * blocks, at least one). */
#define BANDS_PER_THREAD 4
#define BAND_MIN_WEIGHTS (UINT64_C(1) << 18)
#define PIECE_BYTES (UINT64_C(1) << 20)

int nwc__enc_begin(const void *w, uint64_t rows, uint64_t cols, unsigned elem, unsigned threads,
                   nwc__enc_read_fn read, void *read_ctx, uint64_t *freq, uint8_t psym[16],
                   nwc__enc **out) {
  NWC_RETURN_IF(!out || !psym, -EINVAL, "nwc__enc_begin: missing argument");
  *out = NULL;
  NWC_RETURN_IF(NWC_ELEM_LAYOUT(elem) != 0, -ENOTSUP, "nwc__enc_begin: layout 0 only");
  NWC_TRY(nwc__encode_args(read ? (const void *)out : w, rows * cols, cols));
  nwc__enc *e = calloc(1, sizeof *e);
  if (!e) return -ENOMEM;
  int rc = nwc__geom_init(&e->p.g, rows, cols, elem);
  const nwc__geom *g = &e->p.g;
  e->threads = threads ? threads : 1;
  if (e->threads > NWC__MAX_THREADS) e->threads = NWC__MAX_THREADS;
  uint64_t nb = e->threads > 1 ? (uint64_t)e->threads * BANDS_PER_THREAD : 1;
  e->p.bf16 = g->type == NWC_ELEM_BF16;
  uint64_t rb_bytes = NWC_BLOCK_ROWS * cols * (e->p.bf16 ? 2 : 1);
  e->piece_rbs = read ? (PIECE_BYTES > rb_bytes ? PIECE_BYTES / rb_bytes : 1) : UINT64_MAX;
  if (rc == 0) {
    if (nb > rows * cols / BAND_MIN_WEIGHTS) nb = rows * cols / BAND_MIN_WEIGHTS;
    if (nb > g->row_blocks) nb = g->row_blocks;
    if (nb == 0) nb = 1;
    if (e->threads > nb) e->threads = (unsigned)nb;
    e->band = calloc(nb, sizeof *e->band);
    if (!e->band) rc = -ENOMEM;
  }
  if (rc == 0 && read) {
    e->buf = calloc(e->threads, sizeof *e->buf);
    uint64_t piece_bytes = (e->piece_rbs < g->row_blocks ? e->piece_rbs : g->row_blocks) * rb_bytes;
    for (unsigned t = 0; e->buf && t < e->threads; t++)
      if (!(e->buf[t] = malloc(piece_bytes))) rc = -ENOMEM;
    if (!e->buf) rc = -ENOMEM;
  }
  if (rc < 0) {
    nwc__enc_free(e);
    return rc;
  }
  e->p.w = read ? NULL : w;
  if (!e->p.bf16) plan_fp8_split(&e->p);
  e->nbands = nb;
  e->read = read;
  e->read_ctx = read_ctx;
  for (uint64_t i = 0; i < nb; i++) {
    e->band[i].rb0 = g->row_blocks * i / nb;
    e->band[i].rb1 = g->row_blocks * (i + 1) / nb;
  }
  nwc__parallel_for(e->threads, nb, task_count, e);
  uint64_t total[128] = {0};
  for (uint64_t i = 0; i < nb; i++)
    for (unsigned s = 0; s < 128; s++) total[s] += e->band[i].freq[s];
  for (uint64_t i = 0; i < nb && !rc; i++) /* the first error; an fp8 NaN named on this thread */
    if (e->band[i].err)
      rc = e->band[i].err == -EINVAL ? fp8_nan(e->band[i].nan_at, cols) : e->band[i].err;
  if (rc < 0) {
    nwc__enc_free(e);
    return rc;
  }
  plan_codes(&e->p, total, psym);
  for (uint64_t i = 0; i < nb; i++) {
    band *b = &e->band[i];
    uint64_t r0, brows = piece_rows(&e->p, b->rb0, b->rb1 - b->rb0, &r0);
    b->at = e->bound;
    e->bound += nwc__ceil_div(rows_code_bits(&e->p, b->freq, r0, r0 + brows), 8) +
                (b->rb1 - b->rb0) * g->col_blocks * BLOCK_PAD_BYTES;
  }
  e->bound += NWC_DATA_SLACK;
  if (freq) memcpy(freq, total, (e->p.bf16 ? 128 : NWC_FP8_SYMBOLS) * sizeof *freq);
  *out = e;
  return 0;
}

uint64_t nwc__enc_bound(const nwc__enc *e) { return e->bound; }

int64_t nwc__enc_streams(nwc__enc *e, uint64_t *bases, uint8_t *hdr, uint8_t *data) {
  e->bases = bases, e->hdr = hdr, e->data = data;
  plan_pairs(&e->p);
  nwc__parallel_for(e->threads, e->nbands, task_streams, e);
  NWC_TRY(bands_error(e));
  uint64_t off = 0, cbs = e->p.g.col_blocks;
  for (uint64_t i = 0; i < e->nbands; i++) { /* down to their places, in order: never overlaps */
    band *b = &e->band[i];
    if (b->at != off) memmove(data + off, data + b->at, b->bytes);
    for (uint64_t k = b->rb0 * cbs; off && k < b->rb1 * cbs; k++) bases[k] += off;
    off += b->bytes;
  }
  bases[e->p.g.nblocks] = off;
  memset(data + off, 0, NWC_DATA_SLACK);
  return (int64_t)(off + NWC_DATA_SLACK);
}

int nwc__enc_raw_range(nwc__enc *e, uint64_t q0, uint64_t q1, uint8_t *dst, unsigned thread) {
  const uint64_t stride = e->p.g.raw_stride;
  const uint64_t most = e->read ? e->piece_rbs * NWC_BLOCK_ROWS : UINT64_MAX; /* rows a piece holds */
  for (uint64_t q = q0; q < q1;) {
    uint64_t r0 = q / stride, r1 = nwc__ceil_div(q1, stride);
    if (r1 - r0 > most) r1 = r0 + most;
    const void *src;
    NWC_TRY(piece_of_rows(e, thread, r0, r1 - r0, &src));
    for (uint64_t r = r0; r < r1 && q < q1; r++) { /* the first and last rows may be partial */
      uint64_t b0 = q - r * stride, b1 = q1 - r * stride < stride ? q1 - r * stride : stride;
      raw_row(&e->p, (const uint8_t *)src + (r - r0) * e->p.g.K * (e->p.bf16 ? 2 : 1), b0, b1,
              dst + (q - q0));
      q += b1 - b0;
    }
  }
  return 0;
}

unsigned nwc__enc_threads(const nwc__enc *e) { return e->threads; }

void nwc__enc_free(nwc__enc *e) {
  if (!e) return;
  for (unsigned t = 0; e->buf && t < e->threads; t++) free(e->buf[t]);
  free(e->buf);
  free(e->band);
  free(e->p.pair);
  free(e);
}

/* ---- shared with layouts 1 and 2 (store/encode_internal.h) ---------------------------------- */

int nwc__encode_args(const void *w, uint64_t n, uint64_t K) {
  NWC_RETURN_IF(!w, -EINVAL, "nwc_encode: no input");
  NWC_RETURN_IF(K == 0 || n == 0 || n % K != 0, -EINVAL,
                "nwc_encode: %llu weights are not whole rows of %llu", (unsigned long long)n,
                (unsigned long long)K);
  return 0;
}

int nwc__fp8_count(const uint8_t *w, uint64_t n, uint64_t K, const unsigned sym_of[256],
                   unsigned nan_sym, uint64_t *freq) {
  for (uint64_t i = 0; i < n; i++) {
    unsigned s = sym_of[w[i]];
    if (NWC__UNLIKELY(s == nan_sym)) return fp8_nan(i, K);
    freq[s]++;
  }
  return 0;
}

void nwc__rank_symbols(const uint64_t *freq, unsigned nsym, unsigned *order) {
  rank_symbols(freq, nsym, order);
}

int nwc__prefix_codes(const void *w, uint64_t M, uint64_t K, unsigned elem, uint64_t *freq,
                      uint8_t psym[16], uint32_t bits[256], uint8_t len[256]) {
  plan *p = malloc(sizeof *p);
  if (!p) return -ENOMEM;
  memset(p, 0, sizeof *p);
  int rc = nwc__geom_init(&p->g, M, K, elem);
  if (rc == 0) {
    p->w = w;
    p->bf16 = p->g.type == NWC_ELEM_BF16;
    rc = plan_symbols(p, freq, psym);
  }
  for (unsigned b = 0; rc == 0 && b < 256; b++) {
    bits[b] = p->codes[b].bits;
    len[b] = (uint8_t)p->codes[b].len;
  }
  free(p);
  return rc;
}
