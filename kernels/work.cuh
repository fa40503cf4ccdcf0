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
 * each writes its 16 x ncols sums to scratch at part slot 2 w (the warp's first piece) or 2 w + 1
 * (its last), and at the warp's end, after one fence, counts itself in the row group's
 * counter (atomicInc, which wraps to 0 at the number of contributors, so the counters are zero
 * before and after every call: scratch starts zeroed and every call leaves it so).  The last
 * contributor adds the row group's parts in warp order, so the result does not depend on
 * scheduling, and writes the rows.  One fence per warp, at its end when no copies are in flight:
 * a fence per part waited for the copies of the warp's next batch (docs/results.md).
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
};

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

/*
 * The end of warp w's sums: pend0, pend1 are the sequence entries of its first and last piece
 * where those were parts (kNoPart otherwise), already written to their part slots of `part`
 * (Split::part_slot; each `per` floats: 16 rows x ncols).  Counts them; where the warp is the row
 * group's last contributor, adds the group's parts in warp order and calls put(k, e, sum) for
 * e = lane, lane + 32, ... < per.  All lanes call it.
 */
template <class Put>
__device__ __forceinline__ void finish_parts(const Split &sp, uint32_t w, uint32_t pend0, uint32_t pend1, uint32_t *ctr,
                                             const float *part, uint32_t per, Put put) {
  if (pend0 == kNoPart && pend1 == kNoPart) return;
  /* this warp's parts are visible before its counts (a release: the acquire half, which also
   * invalidates L1, only the last contributor needs, below) */
  asm volatile("fence.release.gpu;" ::: "memory");
  const uint32_t lane = threadIdx.x & 31u;
  /* both counts in one round trip: lane 0 counts the first piece, lane 1 the last */
  uint32_t last = 0;
  if (lane < 2 && (lane == 0 ? pend0 : pend1) != kNoPart) {
    const uint32_t k = lane == 0 ? pend0 : pend1;
    uint32_t wf, wl;
    sp.contributors(k, &wf, &wl);
    last = atomicInc(ctr + k, wl - wf) == wl - wf;
  }
  last = __ballot_sync(0xffffffffu, last);
  if (!last) return;
  asm volatile("fence.acq_rel.gpu;" ::: "memory"); /* the others' parts, counted before, are visible */
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const uint32_t k = i == 0 ? pend0 : pend1;
    if (!(last >> i & 1u)) continue;
    uint32_t wf, wl;
    sp.contributors(k, &wf, &wl);
    const uint32_t slot0 = sp.part_slot(wf, k); /* the others' are 2 v: k holds their first piece */
    /* A lane adds value e of the parts of a run of contributors, 16 loads in flight (these loads are
     * the tail of a small matvec).  With per <= 16 (one column) lanes e and e + 16 take the first
     * and the second half of the contributors and their sums are added after, in that order. */
    const uint32_t span = per <= 16 ? 16 : 32, h = lane / span, mid = wf + (wl - wf + 2) / 2;
    const uint32_t v0 = span == 32 ? wf : h ? mid : wf, v1 = span == 32 || h ? wl + 1 : mid;
    for (uint32_t e0 = 0; e0 < per; e0 += span) {
      const uint32_t e = e0 + lane % span;
      float sum = 0.f;
      for (uint32_t v = v0; e < per && v < v1; v += 16) {
        float t[16];
#pragma unroll
        for (uint32_t i = 0; i < 16; i++)
          t[i] = v + i < v1 ? __ldcg(part + (uint64_t)(v + i == wf ? slot0 : 2 * (v + i)) * per + e) : 0.f;
#pragma unroll
        for (uint32_t i = 0; i < 16; i++) sum += t[i];
      }
      if (span == 16) sum += __shfl_down_sync(0xffffffffu, sum, 16);
      if (e < per && h == 0) put(k, e, sum);
    }
  }
}

} /* namespace nwc_k */

#endif /* NWC_WORK_CUH */
