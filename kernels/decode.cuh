/*
 * decode.cuh - the layout-0 lane decoder every kernel shares (format v9's decoder), device code.
 *
 * One warp decodes one 8 x 512 block; lane L owns columns 16L..16L+15 of each row.  Per lane:
 *
 *   window    hi:lo, 64 bits, MSB first (the next stream bit is bit 31 of hi); below the valid
 *             bits it holds the next words or zeros.
 *   fill      fm = 2^((64 - nb) mod 32) for nb valid bits, a rotated power of two: consuming c
 *             bits rotates it left by c; it wraps (gets smaller) exactly when nb drops to <= 32,
 *             and then fm = 2^(32 - nb) is the multiplier that puts the next word w just below
 *             the valid bits: hi:lo += w * fm (one wide multiply-add; the multiplier is 0 when it
 *             did not wrap).  Invariant between steps: nb > 32, so a slow code (<= 24 bits) and a
 *             table lookup (12 bits) always find their bits.
 *   w         the next word, loaded ahead; only that load is predicated.
 *
 * A step looks up the top 12 bits in the 4096-entry table in shared memory (store/tab.c): a fast
 * entry gives two exponent bytes in bytes 1 and 2 and the bits used in byte 0, which the funnel
 * shifts use directly as their shift amount (they take it mod 32); a slow entry (bit 30) is
 * finished code by code with a count of leading zeros, exp_of_rank read back from the table
 * (entries 1 << (11 - r) for rank r <= 10, entries 0/1 for ranks 11..14; escape: 15 zeros, a one,
 * the byte).  Step results are "pair words" shaped like a fast entry: byte 1 = weight 2k's high
 * byte, byte 2 = weight 2k+1's, byte 3 = 0.  A weight's fp32 pattern is then one prmt of the pair
 * word with the low bytes: [high][low][0][0], bytes 1..0 taken from the pair word's zero byte 3.
 *
 * Streams (docs/format.md): a block's lane streams are concatenated at the bit level in whole
 * 16-bit units (hdr[] counts them), so a lane starts at bit 16 * (prefix sum of units), which is
 * at a word boundary or halfway into a word; in the second case the window starts with 48 valid
 * bits (fm = 2^16) and every later word insert is word-aligned again.  Rows at or beyond M are not
 * coded; lanes whose columns start at or beyond K16 have empty streams: they decode lane 0's
 * stream instead (so they stay in bounds) and their results are discarded.
 *
 * Staging: before decoding, the warp copies its block's stream bytes and the raw bytes of its
 * rows into its own slice of shared memory with cp.async (8 and 16 bytes per lane and
 * instruction, coalesced), so that the decode loop's refill loads and raw loads are shared-memory
 * loads (about 30 cycles) instead of global loads whose latency the next step would wait for.  A
 * block whose stream is larger than the slice (only with very flat symbol statistics) is decoded
 * from global memory instead.  While a block is decoded the next block's lines are prefetched into
 * L2.  Reading bounds: a lane reads at most three words past its own stream (start() loads three
 * words, and a stream that ends on a word boundary ends with a refill, whose word is never used),
 * inside later lanes' streams, the block's padding, the next block or the 16 slack bytes: at most
 * 12 bytes past the block's end; staging copies [base, end + 12) in 16-byte pieces (see decode_block for
 * why the last block is not staged).
 *
 * decode_block() walks the rows of one block and hands each row's 8 pair words and 4 low-byte
 * words to a sink (the dot product, or the store of dequant and gather).
 *
 * Layout 1 has the same codes in other streams: its kernels (layout1.cuh) use the Lane, Low and
 * bf16_pair below.  Those are NWC_HD (hd.cuh: the intrinsics have host versions) so that
 * tests/test_l1_decode runs a lane's decode on the CPU as the GPU runs it.
 */
#ifndef NWC_DECODE_CUH
#define NWC_DECODE_CUH

#include "cp_async.cuh"
#include "hd.cuh"
#include "nwc.h"
#include "warp.cuh"

#include <stdint.h>

namespace nwc_k {

/* The tensor as the kernels see it (device pointers, 32-bit counters checked by the callers). */
struct Geom {
  const uint64_t *bases;
  const uint8_t *hdr;
  const uint8_t *data;
  const uint8_t *raw;
  uint64_t raw_stride; /* bytes per raw row: K16 (BF16) or K16 / 2 (fp8) */
  uint32_t M, K16, CB, nblocks;
};

/* Copies the 4096-word table to shared memory; all threads of the block must call it. */
__device__ __forceinline__ void load_table(uint32_t *s_tab, const uint32_t *tab) {
  const uint4 *src = reinterpret_cast<const uint4 *>(tab);
  uint4 *dst = reinterpret_cast<uint4 *>(s_tab);
  for (unsigned i = threadIdx.x; i < NWC_TAB_ENTRIES / 4; i += blockDim.x) dst[i] = __ldg(src + i);
  __syncthreads();
}

/* Shared memory per warp for staging (the table's 16 KB come first): 32 warps fit in 227 KB. */
constexpr unsigned kWarpBuf = 6656;
constexpr unsigned kTabBytes = NWC_TAB_ENTRIES * 4;

struct Lane {
  uint32_t hi, lo, fm, w;
  const uint32_t *p; /* word after w */

  /* s: the word holding the lane's first bit; unit: its start in 16-bit units (odd: mid-word). */
  NWC_HD void start(const uint32_t *s, uint32_t unit) {
    uint32_t w0 = s[0], w1 = s[1], sh = (unit & 1u) * 16u;
    hi = fshl(w1, w0, sh);
    lo = w1 << sh;
    fm = 1u << sh; /* nb = 64 - sh valid bits */
    w = s[2];
    p = s + 3;
  }

  /* Consumes (c mod 32) bits, c <= 24; refills from w when the fill level wraps. */
  NWC_HD void advance(uint32_t c) {
    uint32_t nfm = fshl(fm, fm, c);
    uint32_t nhi = fshl(lo, hi, c);
    uint32_t nlo = fshl(0u, lo, c);
    bool wrap = nfm < fm;
    uint64_t v = ((uint64_t)nhi << 32 | nlo) + (uint64_t)w * (wrap ? nfm : 0u);
    hi = (uint32_t)(v >> 32);
    lo = (uint32_t)v;
    fm = nfm;
    if (wrap) w = *p;
    p += wrap; /* unpredicated: fewer instructions than p++ under the branch */
  }

  /* One code by counting leading zeros; returns its byte (sign << 7 | exp_of_rank).  Ranks up to
   * 10 read exp_of_rank from entry 1 << (11 - r); ranks 11..14 and escapes are rarer still. */
  NWC_HD uint32_t code(const uint32_t *tab) {
    uint32_t z = clz32(hi), byte;
    if (__builtin_expect(z <= 10, 1)) {
      byte = ((hi >> (30 - z)) & 1u) << 7 | ((tab[0x800u >> z] >> 8) & 0x7fu);
      advance(z + 2);
    } else if (z < NWC_BF16_CODED_RANKS) {
      uint32_t sign = (hi >> (30 - z)) & 1u;
      byte = sign << 7 | ((tab[(z - 11) >> 1] >> (8 + 8 * ((z - 11) & 1))) & 0xffu);
      advance(z + 2);
    } else { /* escape (15 zeros, a one, the byte); longer zero runs never occur in valid data */
      byte = (hi >> 8) & 0xffu;
      advance(24);
    }
    return byte;
  }

  /* The next two weights as a pair word. */
  NWC_HD uint32_t pair(const uint32_t *tab) {
    uint32_t e = tab[hi >> (32 - NWC_TAB_BITS)];
    if (__builtin_expect(!(e & NWC_TAB_SLOW), 1)) {
      advance(e);
      return e;
    }
    uint32_t b0;
    if (e & 0xffu) { /* the first code is complete in the entry */
      b0 = (e >> 8) & 0xffu;
      advance(e & 0xffu);
    } else {
      b0 = code(tab);
    }
    uint32_t b1 = code(tab);
    return b0 << 8 | b1 << 16;
  }
};

/* Low bytes of one lane's 16 weights in one row, as 4 words (weights 4j..4j+3 in word j, weight
 * order within a word = byte order).  BF16: the raw bytes; fp8: nibble << 4 (docs/format.md: word
 * 0's low nibbles are weights 0..3, its high nibbles 4..7, word 1 likewise 8..15).  p: the lane's
 * bytes of the row in the staging buffer. */
template <int TYPE> struct Low;

template <> struct Low<NWC_ELEM_BF16> {
  static constexpr unsigned lane_bytes = 16;
  static __device__ __forceinline__ void stage(uint32_t s, const void *g) { cp_async16(s, g); }
  static NWC_HD void load(const uint8_t *p, bool ok, uint32_t m[4]) {
    uint4 v = ok ? *reinterpret_cast<const uint4 *>(p) : make_uint4(0, 0, 0, 0);
    m[0] = v.x, m[1] = v.y, m[2] = v.z, m[3] = v.w;
  }
};

template <> struct Low<NWC_ELEM_FP8> {
  static constexpr unsigned lane_bytes = 8;
  static __device__ __forceinline__ void stage(uint32_t s, const void *g) { cp_async8(s, g); }
  static NWC_HD void load(const uint8_t *p, bool ok, uint32_t m[4]) {
    uint2 v = ok ? *reinterpret_cast<const uint2 *>(p) : make_uint2(0, 0);
    m[0] = (v.x << 4) & 0xf0f0f0f0u, m[1] = v.x & 0xf0f0f0f0u;
    m[2] = (v.y << 4) & 0xf0f0f0f0u, m[3] = v.y & 0xf0f0f0f0u;
  }
};

/* fp32 bit pattern of weight j of a row (e: the pair word of weights j & ~1, j | 1):
 * [high][low][0][0].  j is a constant after unrolling, so the selector is an immediate. */
NWC_HD uint32_t weight_bits(int j, uint32_t e, const uint32_t m[4]) {
  uint32_t sel = (uint32_t)(1 + (j & 1)) << 12 | (uint32_t)(4 + (j & 3)) << 8 | 0x33u;
  return byte_perm(e, m[j >> 2], sel);
}

/* BF16 bits of weights 2k and 2k+1 as one word (2k in the low half). */
NWC_HD uint32_t bf16_pair(int k, uint32_t e, const uint32_t m[4]) {
  uint32_t b = 4 + ((2 * k) & 3);
  uint32_t sel = 2u << 12 | (b + 1) << 8 | 1u << 4 | b;
  return byte_perm(e, m[(2 * k) >> 2], sel);
}

template <int TYPE, class Sink>
__device__ __forceinline__ void decode_rows(const uint32_t *s, uint32_t unit, const uint8_t *raw,
                                            const uint32_t *tab, uint64_t row0, uint32_t nrows,
                                            bool active, Sink &sink) {
  Lane st;
  st.start(s, unit);
#pragma unroll 1
  for (uint32_t i = 0; i < nrows; i++) {
    uint32_t m[4];
    Low<TYPE>::load(raw + i * (Low<TYPE>::lane_bytes * NWC_LANES), active, m);
    uint32_t e[8];
#pragma unroll
    for (int k = 0; k < 8; k++) e[k] = st.pair(tab);
    sink.row(i, row0 + i, active, e, m);
  }
}

/* Where a block's streams are and the lane's stream length, loaded one block ahead so that a
 * block's staging starts without waiting for them. */
struct Head {
  uint64_t base;
  uint32_t span; /* bases[b + 1] - bases[b] */
  uint32_t len;  /* this lane's hdr entry */
};

__device__ __forceinline__ Head load_head(const Geom &g, uint32_t b) {
  Head h{0, 0, 0};
  if (b < g.nblocks) {
    h.base = g.bases[b];
    h.span = (uint32_t)(g.bases[b + 1] - h.base);
    h.len = g.hdr[(uint64_t)b * NWC_LANES + (threadIdx.x & 31u)];
  }
  return h;
}

/*
 * Decodes the coded rows [0, nrows) of block b (the whole warp calls it; nrows <= the rows below
 * M) and calls sink.row(i, row, active, e[8], m[4]) for each; sink.begin(c0, active) comes first,
 * with c0 the lane's first column and active = c0 < K16.  wbuf: the warp's kWarpBuf bytes of
 * shared memory.  h: block b's head on entry, block next's on return (next >= nblocks: none); the
 * next block's lines are prefetched into L2 while b is decoded.
 */
template <int TYPE, class Sink>
__device__ __forceinline__ void decode_block(const Geom &g, const uint32_t *tab, uint8_t *wbuf,
                                             uint32_t b, uint32_t nrows, uint32_t next, Head &h,
                                             Sink &sink) {
  constexpr unsigned lane_bytes = Low<TYPE>::lane_bytes, row_bytes = lane_bytes * NWC_LANES;
  constexpr unsigned stream_cap = kWarpBuf - NWC_BLOCK_ROWS * row_bytes;
  const unsigned lane = threadIdx.x & 31u;
  const uint32_t rb = b / g.CB, cb = b - rb * g.CB;
  const uint32_t c0 = cb * NWC_BLOCK_COLS + lane * NWC_LANE_COLS;
  const bool active = c0 < g.K16;
  const uint64_t base = h.base, end = h.base + h.span, row0 = (uint64_t)rb * NWC_BLOCK_ROWS;
  const uint32_t unit = warp_exclusive_sum(h.len);

  __syncwarp(); /* the previous block's readers are done with wbuf */
  uint8_t *sraw = wbuf + lane * lane_bytes, *sstream = wbuf + NWC_BLOCK_ROWS * row_bytes;
  /* Staging addresses advance by additions only (ptxas would otherwise redo the 64-bit products
   * and the shared window base for every row). */
  const uint8_t *graw = g.raw + row0 * g.raw_stride + (uint64_t)c0 * lane_bytes / NWC_LANE_COLS;
  uint32_t sdst = (uint32_t)__cvta_generic_to_shared(sraw);
#pragma unroll
  for (uint32_t i = 0; i < NWC_BLOCK_ROWS; i++) {
    if (active && i < nrows) Low<TYPE>::stage(sdst, graw);
    sdst += row_bytes;
    graw += g.raw_stride;
  }
  /* The stream in 16-byte pieces from base rounded down to 16 through end + 12 (the lanes' reads)
   * rounded up: end is 8-aligned, so at most end + 24, inside the next block (at least 8 bytes) and
   * the slack, except for the tensor's last block, which is decoded from global memory.  The
   * slice check (stream_cap) thus covers every read. */
  const uint64_t s16 = base & ~UINT64_C(15);
  const uint32_t copy = ((uint32_t)(end + 12 - s16) + 15u) & ~15u, head = (uint32_t)(base - s16);
  const bool staged = copy <= stream_cap && b + 1 < g.nblocks;
  if (staged) {
    const uint8_t *gs = g.data + s16 + 16 * lane;
    uint32_t sd = (uint32_t)__cvta_generic_to_shared(sstream) + 16 * lane;
    for (uint32_t o = 16 * lane; o < copy; o += 16 * NWC_LANES, gs += 16 * NWC_LANES, sd += 16 * NWC_LANES)
      cp_async16(sd, gs);
  }
  sink.begin(c0, active);
  h = load_head(g, next);
  cp_async_wait_all();
  __syncwarp();

  if (next < g.nblocks) { /* the next block's stream and raw rows, into L2 */
    uint32_t nrb = next / g.CB, ncb = next - nrb * g.CB;
    if (128u * lane < h.span) asm volatile("prefetch.global.L2 [%0];" ::"l"(g.data + h.base + 128u * lane));
    constexpr unsigned lines = row_bytes / 128;
    uint64_t row = (uint64_t)nrb * NWC_BLOCK_ROWS + lane / lines;
    uint64_t off = (uint64_t)ncb * row_bytes + 128u * (lane % lines);
    if (lane / lines < NWC_BLOCK_ROWS && row < g.M && off < g.raw_stride)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(g.raw + row * g.raw_stride + off));
  }

  const uint32_t u = active ? unit : 0; /* empty lanes re-decode lane 0's stream */
  if (staged)
    decode_rows<TYPE>(reinterpret_cast<const uint32_t *>(sstream + head) + (u >> 1), u, sraw, tab, row0,
                      nrows, active, sink);
  else
    decode_rows<TYPE>(reinterpret_cast<const uint32_t *>(g.data + base) + (u >> 1), u, sraw, tab,
                      row0, nrows, active, sink);
}

} /* namespace nwc_k */

#endif /* NWC_DECODE_CUH */
