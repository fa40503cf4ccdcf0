/*
 * work.cuh - how the tensor-core kernels share a matrix among their warps, and how the warps' sums
 * of parts of a row group become its rows.  Device code and the host's split; used by layout2.cu.
 *
 * The work is a sequence of row groups of 16 rows, each S slots of 32 columns: a range of the
 * tensor's row groups (matvec, dequant), or the row group of each requested row (gather).  It is
 * cut into granules of G slots (layout 2: 1, or 2 where slots come in pairs, fp8's low plane;
 * layout 1, whose lane streams can only be decoded from a block's start: 16, whole blocks; G is
 * the split's, at run time), Gr = ceil(S / G) a row group, Ng in all, and warp w of W takes the
 * next ceil(Ng / W) or floor(Ng / W) of them (stream-K): every warp gets the same work to within
 * one granule, whatever the shape, with no tail of whole units.  A warp walks its range piece by
 * piece, a piece being the part of one row group that its range covers (only its first and its
 * last piece can be less than a whole row group), and a piece batch by batch: up to D slots,
 * never across a 512-column block (16 slots).
 *
 * Sums (the matvec): a piece that is a whole row group writes its rows.  The others are parts:
 * each leaves its 16 x ncols sums in its warp's part table in shared memory, slot 0 (the warp's
 * first piece) or 1 (its last).  At the end of the CTA's warps (one barrier) the CTA's first
 * contributor of each such row group adds the CTA's parts of it in warp order: where the CTA
 * holds all the row group's contributors it writes the rows; otherwise the row group's CTAs meet
 * in scratch, where each but the last writes its part at slot 2 c (the CTA's first piece) or
 * 2 c + 1 (its last) as words that are non-zero once written, and the last CTA waits for them,
 * adds them in CTA order, its own last, so that the result does not depend on scheduling, sets
 * them back to zero and writes the rows (finish_parts).  The tail of a small matvec is this
 * protocol's latency: one trip of the last part to L2 and back (docs/results.md).
 *
 * Invariants: Ng < 2^32 (the host refuses larger with -EOVERFLOW); W <= Ng, so every warp with
 * work has at least one granule; the row group of a gathered row that is out of range is skipped
 * (its output is left as it was).
 */
#ifndef NWC_WORK_CUH
#define NWC_WORK_CUH

#include "hd.cuh"

#include <errno.h>
#include <stdint.h>

namespace nwc_k {

/* n / d for a divisor fixed on the host, by a multiply and a shift (the round-up method: with
 * s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1, n / d = (umulhi(n, m) + n) >> s for
 * every 32-bit n): the kernels' per-warp arithmetic has no division loop. */
struct Div32 {
  uint32_t m, s;
  NWC_HD uint32_t div(uint32_t n) const { return (uint32_t)(((uint64_t)umulhi32(n, m) + n) >> s); }
};
static inline Div32 make_div32(uint32_t d) {
  uint32_t s = 0;
  while ((UINT64_C(1) << s) < d) s++;
  return Div32{(uint32_t)((UINT64_C(1) << 32) * ((UINT64_C(1) << s) - d) / d + 1), s};
}

/* The cut of a sequence of row groups among W warps: warp w takes q + 1 granules if w < r, else q
 * (Ng = W q + r). */
struct Split {
  uint32_t Ng;    /* granules in all */
  uint32_t W;     /* warps with work */
  uint32_t Gr;    /* granules a row group */
  uint32_t G;     /* slots a granule */
  uint32_t S;     /* slots a row group */
  uint32_t first; /* the tensor's row group of the sequence's first (dequant of a row range) */
  uint32_t q, r;
  Div32 by_Gr, by_q, by_q1; /* / Gr, / q, / (q + 1) */
  /* Warp w's first granule; start(W) = Ng. */
  NWC_HD uint32_t start(uint32_t w) const { return w * q + umin32(w, r); }
  /* The warp whose range holds granule j. */
  NWC_HD uint32_t warp_of(uint32_t j) const {
    const uint32_t big = r * (q + 1);
    return j < big ? by_q1.div(j) : r + by_q.div(j - big);
  }
  /* The sequence entry (row group) of granule j. */
  NWC_HD uint32_t group_of(uint32_t j) const { return by_Gr.div(j); }
  /* The warps whose ranges hold part of entry k: wf .. wl. */
  NWC_HD void contributors(uint32_t k, uint32_t *wf, uint32_t *wl) const {
    *wf = warp_of(k * Gr), *wl = warp_of(k * Gr + Gr - 1);
  }
  /* Warp w's part slot for its piece of entry k: 2 w for the warp's first piece (its range starts
   * in k), 2 w + 1 for its last. */
  NWC_HD uint32_t part_slot(uint32_t w, uint32_t k) const { return 2 * w + (start(w) < k * Gr ? 1u : 0u); }
  /* In CTAs of wpc warps (CTA c: warps wpc c ..), CTA c's part slot for entry k (2 c: the CTA's
   * first piece, 2 c + 1: its last); the CTAs with parts of k are contributors' / wpc. */
  NWC_HD uint32_t cta_part_slot(uint32_t wpc, uint32_t c, uint32_t k) const {
    return 2 * c + (start(wpc * c) < k * Gr ? 1u : 0u);
  }
};

/* The warp of warp w's CTA (of wpc warps) that adds the CTA's parts of an entry whose first
 * contributor is wf: the CTA's first contributor of it. */
NWC_HD uint32_t cta_adder(uint32_t wpc, uint32_t w, uint32_t wf) { return wf > w / wpc * wpc ? wf : w / wpc * wpc; }

/* groups row groups of S slots in granules of G, for at most `warps` warps; -EOVERFLOW past 2^32
 * granules, -EINVAL for nothing to do. */
static inline int make_split(uint64_t groups, uint32_t S, uint32_t G, uint64_t warps, uint32_t first, Split *sp) {
  const uint64_t Gr = (S + G - 1) / G, Ng = groups * Gr;
  if (!groups || !S || !G || !warps) return -EINVAL;
  if (Ng >= (UINT64_C(1) << 32)) return -EOVERFLOW;
  sp->Ng = (uint32_t)Ng, sp->W = (uint32_t)(warps < Ng ? warps : Ng), sp->Gr = (uint32_t)Gr, sp->G = G, sp->S = S;
  sp->first = first;
  sp->q = sp->Ng / sp->W, sp->r = sp->Ng % sp->W;
  sp->by_Gr = make_div32(sp->Gr), sp->by_q = make_div32(sp->q), sp->by_q1 = make_div32(sp->q + 1);
  return 0;
}

/* A warp's position: the piece it streams (entry k of the sequence, the tensor's row group grp,
 * slots [s0, s_end), `first` when it is the warp's first piece) and the batch [s, end()) in it;
 * valid false when the warp's range is done.  j: the granule after the piece. */
template <int D>
struct Cursor {
  uint32_t j, k, grp, s, s0, s_end;
  bool first, valid;
  /* The piece that starts at granule j of the warp's range [j0, j_end); gather (rows != NULL)
   * skips entries whose row is >= M. */
  NWC_HD void open(const Split &sp, uint32_t j0, uint32_t j_end, const uint64_t *rows, uint32_t M) {
    for (;;) {
      if (j >= j_end) {
        valid = false;
        return;
      }
      k = sp.group_of(j);
      const uint32_t in = j - k * sp.Gr, end = umin32(j_end - k * sp.Gr, sp.Gr);
      s0 = in * sp.G, s_end = umin32(sp.S, end * sp.G), first = j == j0;
      j = k * sp.Gr + end;
      if (!rows) {
        grp = sp.first + k;
        break;
      }
      const uint64_t R = rows[k];
      if (R < M) {
        grp = (uint32_t)(R / 16);
        break;
      }
    }
    s = s0;
    valid = true;
  }
  /* The batch's end: D slots on, the piece's end or the block's, whichever comes first. */
  NWC_HD uint32_t end() const { return umin32(umin32(s + D, s_end), (s | 15u) + 1); }
  /* The next batch (of the piece, or the next piece). */
  NWC_HD void next(const Split &sp, uint32_t j0, uint32_t j_end, const uint64_t *rows, uint32_t M) {
    s = end();
    if (s >= s_end) open(sp, j0, j_end, rows, M);
  }
  NWC_HD bool whole(const Split &sp) const { return s0 == 0 && s_end == sp.S; }
  /* The batch starts a block, or the piece inside one: the block's exception entries are needed. */
  NWC_HD bool block_start() const { return s % 16 == 0 || s == s0; }
};

/* No pending part. */
constexpr uint32_t kNoPart = 0xffffffffu;

/* A part's float as the word that carries it in scratch: its bits xor kPartKey, so that a zero word
 * is one not written yet (a NaN part is first made the canonical NaN, whose word is not zero). */
constexpr uint32_t kPartKey = 0x7fffffffu;
__device__ __forceinline__ uint32_t part_word(float v) { return (v != v ? 0x7fc00000u : __float_as_uint(v)) ^ kPartKey; }
__device__ __forceinline__ float part_value(uint32_t w) { return __uint_as_float(w ^ kPartKey); }
__device__ __forceinline__ uint32_t load_word(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_word(uint32_t *p, uint32_t v) {
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/*
 * The end of the sums of warp w, in a CTA of wpc warps, after the CTA's barrier: pend0, pend1 are
 * the sequence entries of its first and last piece where those were parts (kNoPart otherwise),
 * whose `per` floats (16 rows x ncols) the CTA's warps left in their part tables in shared memory
 * (warp u's slot s at tab + (u - w) tab_stride + s per; s as part_slot).  For each entry whose
 * parts it adds (cta_adder), the warp adds the CTA's in warp order.  Where the CTA holds all of
 * the entry's contributors it calls put(k, e, sum) for e = lane, lane + 32, ... < per.  Otherwise
 * the entry's CTAs cf .. cl meet in scratch: each CTA before cl writes its part to its slot
 * (cta_part_slot) as words (part_word), and CTA cl, having written its own parts for the CTAs
 * after it first (so that no CTA waits on one that waits), waits for each word to be non-zero,
 * adds the CTAs' parts in CTA order, its own last, sets the words back to zero (scratch is zero
 * before and after every call) and calls put.  No fence or counter: a word is its own flag (a
 * 32-bit store is seen whole or not at all), so the sum waits for one trip of the last part to L2
 * and back.  Every CTA of the grid is resident before any waits (a launch's CTAs all start before
 * the next launch's, which is a PDL dependent, and the grid fits the GPU).  All lanes call it;
 * per <= kPer (16 x the sink's most columns, at most 128).
 */
template <uint32_t kPer, class Put>
__device__ __forceinline__ void finish_parts(const Split &sp, uint32_t wpc, uint32_t w, uint32_t pend0, uint32_t pend1,
                                             const float *tab, uint32_t tab_stride, uint32_t *words, uint32_t per,
                                             Put put) {
  const uint32_t lane = threadIdx.x & 31u, c = w / wpc, w_last = umin32(wpc * c + wpc, sp.W) - 1;
  const uint32_t ks[2] = {pend0, pend1}; /* indexed by constants only (a lane's index: local memory) */
  static_assert(kPer <= 128, "four values a lane at most");
  constexpr uint32_t kM = (kPer + 31) / 32; /* values a lane */
  uint32_t last = 0;     /* bit i: the CTA is ks[i]'s last, which adds the other CTAs' parts */
  uint32_t cf[2], cl[2]; /* the CTAs of ks[i] */
  float own[2][kM];      /* where the CTA is the last: its sum */
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const uint32_t k = ks[i];
    if (k == kNoPart) continue;
    uint32_t wf, wl;
    sp.contributors(k, &wf, &wl);
    if (w != cta_adder(wpc, w, wf)) continue;
    cf[i] = wf / wpc, cl[i] = wl / wpc;
    if (cf[i] != cl[i] && c == cl[i]) last |= 1u << i;
    const uint32_t u_end = umin32(wl, w_last);
#pragma unroll
    for (uint32_t m = 0; m < kM; m++) {
      const uint32_t e = lane + 32 * m;
      float sum = 0.f;
      for (uint32_t u = w; e < per && u <= u_end; u++) sum += tab[(u - w) * tab_stride + (sp.part_slot(u, k) & 1u) * per + e];
      own[i][m] = sum;
      if (e >= per || last >> i & 1u) continue;
      if (cf[i] == cl[i]) put(k, e, sum);
      else store_word(words + (uint64_t)sp.cta_part_slot(wpc, c, k) * per + e, part_word(sum));
    }
  }
#pragma unroll
  for (int i = 0; i < 2; i++) {
    if (!(last >> i & 1u)) continue;
    const uint32_t k = ks[i];
    const uint32_t slot0 = sp.cta_part_slot(wpc, cf[i], k); /* the others' are 2 x: k holds their first piece */
#pragma unroll
    for (uint32_t m = 0; m < kM; m++) {
      const uint32_t e = lane + 32 * m;
      if (e >= per) break;
      float sum = 0.f;
      for (uint32_t x0 = cf[i]; x0 < cl[i]; x0 += 8) { /* 8 loads in flight */
        uint32_t *p[8], v[8];
#pragma unroll
        for (uint32_t j = 0; j < 8; j++) {
          p[j] = words + (uint64_t)(x0 + j == cf[i] ? slot0 : 2 * (x0 + j)) * per + e;
          v[j] = x0 + j < cl[i] ? load_word(p[j]) : 1u;
        }
#pragma unroll
        for (uint32_t j = 0; j < 8; j++) {
          for (uint32_t polls = 0; v[j] == 0; polls++) {
            if (polls == (1u << 26)) __trap(); /* a part that never comes (~a minute): an error, not a hang */
            v[j] = load_word(p[j]);
          }
          if (x0 + j < cl[i]) store_word(p[j], 0), sum += part_value(v[j]);
        }
      }
      put(k, e, sum + own[i][m]);
    }
  }
}

} /* namespace nwc_k */

#endif /* NWC_WORK_CUH */
