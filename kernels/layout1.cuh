/*
 * layout1.cuh - layout 1 (docs/format-layouts.md §2, §3) as the tensor-core kernels see it: the
 * geometry, where a block's lane streams are read from, the slot decoder that turns a lane's 16
 * codes and 16 raw bytes into the same mma.m16n8k16 A fragments as layout 2's decode_bf16_slot,
 * and the slot source through which layout2.cu's stream and sinks (matvec, dequant, gather) run
 * layout 1.
 *
 * Layout 1 has layout 0's prefix code (the same table, the same Lane decoder, decode.cuh) with each
 * lane's codes in fragment order: code j of a lane's slot is weight j = 8h + 2a + e of the A
 * fragment, so the lane's pair word k (codes 2k, 2k + 1: their high bytes in bytes 1 and 2) and
 * its low bytes make A[k] with one byte permute (bf16_pair), and no weight moves between lanes.
 *
 * Streams.  A lane's codes of a block are one stream (hdr: its length in words); the streams of a
 * block's lanes are contiguous, [bases[b], bases[b + 1]).  A slot's codes can only be found by
 * decoding the slots before it, so the warps' ranges are whole blocks (work.cuh, granules of 16
 * slots) and a lane's decoder state (Lane) runs through the block batch by batch.  When a batch
 * that starts a block is issued, the warp copies the block's streams with cp.async into one of two
 * stream buffers (blocks alternate between them: the next block's copies are in flight while this
 * one's last batch is decoded), [bases[b] rounded down to 16, bases[b + 1] + 12 rounded up to 16),
 * which holds the three words a lane's decoder loads past its stream; a block whose streams do not
 * fit is read from global memory instead (generic loads: one code path for both).  The block's
 * head (bases[b], bases[b + 1] and the lane's hdr byte) is loaded a block ahead into registers
 * (the next block of a matvec or dequant range is b + 1; a gather's is loaded when needed).  Each
 * lane keeps the address of its first word in the ring set of the batch, where the batch's first
 * slot finds it.  The raw plane goes through the ring as layout 2's planes do: a lane's 16 bytes
 * (fp8: 8) of each slot of the next batch.  The 4096-word table is in shared memory, one per CTA.
 *
 * Bounds: the copies and every read stay inside data (a lane reads at most three words past its
 * stream, inside the block's padding, the next block or the 16 slack bytes) and the raw plane; a
 * lane decodes exactly 16 codes per slot of the block, and slots past a piece's end are not
 * decoded.  What the kernels trust (the codes decode within their lengths) is in docs/kernels.md.
 */
#ifndef NWC_LAYOUT1_CUH
#define NWC_LAYOUT1_CUH

#include "cp_async.cuh"
#include "decode.cuh"
#include "nwc_kernels.h"
#include "warp.cuh"
#include "work.cuh"

#include <stdint.h>

namespace nwc_k {

/* The tensor as layout 1's kernels see it (device pointers; 32-bit counts checked by the host). */
struct L1Geom {
  const uint64_t *bases;
  const uint8_t *hdr;
  const uint8_t *data;
  const uint8_t *raw; /* 16 bytes (fp8: 8) per (row group, slot, lane) */
  const uint32_t *tab;
  uint32_t M, K, K16, CB, S, RB, nblocks;
  bool fp8; /* the element type: fp8 (e4m3, per-row scale) or BF16 */
};

/* Slots a batch: the ring's sets are small, so that the stream buffers fit beside them. */
constexpr int kL1Batch = 2;

/* Where block streams [base, end) are read from: [s16, s16 + copy) of data, the words the lanes
 * load (a lane's decoder loads up to three words past its stream, the last of them never used),
 * copied to a stream buffer of cap bytes when it fits (staged), else data itself.  The tensor's
 * last block (last) is staged only when the copy stays inside data (its 16 slack bytes). */
struct L1Plan {
  uint64_t s16;
  uint32_t copy;
  bool staged;
};
NWC_HD L1Plan l1_plan(uint64_t base, uint64_t end, uint32_t cap, bool last) {
  L1Plan p;
  p.s16 = base & ~UINT64_C(15);
  const uint64_t copy = (end + 12 - p.s16 + 15) & ~UINT64_C(15);
  p.staged = copy <= cap && (!last || p.s16 + copy <= end + NWC_DATA_SLACK);
  p.copy = p.staged ? (uint32_t)copy : 0u;
  return p;
}

/* Lane L's first stream word of a block: the staged copy at buf (plan p) or data; unit: the words
 * of lanes 0 .. L - 1 (hdr's prefix sum). */
NWC_HD const uint32_t *l1_lane_words(const L1Plan &p, const uint8_t *buf, const uint8_t *data, uint64_t base,
                                     uint32_t unit) {
  const uint8_t *s = p.staged ? buf + (base - p.s16) : data + base;
  return reinterpret_cast<const uint32_t *>(s) + unit;
}

/* One slot of a lane: its next 16 codes (st) and its raw bytes (BF16: 16 low bytes; fp8: 8 bytes
 * of nibbles) as the 8 A registers, A[k] = weights 2k (low half) and 2k + 1. */
template <bool FP8>
NWC_HD void l1_decode_slot(Lane &st, const uint32_t *tab, const uint8_t *raw, uint32_t A[8]) {
  uint32_t m[4];
  Low<FP8 ? NWC_ELEM_FP8 : NWC_ELEM_BF16>::load(raw, true, m);
  NWC_HD_UNROLL
  for (int k = 0; k < 8; k++) A[k] = bf16_pair(k, st.pair(tab), m);
}

/* Bytes of a ring set of D slots: the raw bytes, then each lane's first stream word (8 bytes). */
template <int D, bool FP8>
__host__ __device__ constexpr unsigned l1_set_bytes() { return D * 32 * (FP8 ? 8 : 16) + 32 * 8; }

/* The stream buffer beside a ring of D slots and `sink` bytes of the sink's, so that a warp's
 * shared memory is `per_warp` bytes. */
template <int D, bool FP8>
__host__ __device__ constexpr unsigned l1_stream_buf(unsigned per_warp, unsigned sink) {
  return (per_warp - 2 * l1_set_bytes<D, FP8>() - sink) / 2 / 16 * 16;
}

/*
 * Layout 1 as l2_stream's slot source (layout2.cu): issue(cursor, set, bare) copies a batch's raw
 * bytes into a ring set and, for a batch that starts a block, the block's streams into a stream
 * buffer (bare or not: the first batch needs them too; the caller commits the group); head() and
 * prologue() have nothing to fetch (layout 2's fetch its first block's exception window; layout 1
 * has no exceptions); begin(cursor, set,
 * fresh) starts the lanes' decoders at a block's start; slot(cursor, k, A) decodes slot k of the
 * batch (l2_stream asks only for those before its end); end() has nothing to do.  Shared memory
 * per warp: kWarpSmem = two ring sets and two stream buffers of SB bytes.
 */
template <int D, bool FP8, unsigned SB>
struct L1Source {
  /* Slots past a batch's end are not decoded: the lanes' streams would run past the block. */
  __device__ static constexpr bool decode_all() { return false; }
  static constexpr unsigned kE = FP8 ? 8 : 16, kSlot = 32 * kE, kSet = l1_set_bytes<D, FP8>();
  static constexpr unsigned kWarpSmem = 2 * kSet + 2 * SB;
  const L1Geom &g;
  const uint32_t *tab; /* the table in shared memory */
  uint8_t *mem;        /* the warp's: two sets, then two stream buffers */
  uint32_t nblk;       /* blocks issued: the parity picks the stream buffer */
  uint64_t hb, h0, h1; /* the head of block hb: bases[hb], bases[hb + 1], the lane's hdr byte */
  uint32_t hlen;
  const uint8_t *cur; /* the set being decoded */
  Lane st;

  __device__ __forceinline__ L1Source(const L1Geom &geom, const uint32_t *table, uint8_t *m)
      : g(geom), tab(table), mem(m), nblk(0), hb(~UINT64_C(0)), h0(0), h1(0), hlen(0), cur(m), st() {}

  __device__ __forceinline__ void load_head(uint64_t b) {
    hb = b, h0 = __ldg(g.bases + b), h1 = __ldg(g.bases + b + 1);
    hlen = __ldg(g.hdr + b * 32 + (threadIdx.x & 31u));
  }

  template <class Cur>
  __device__ __forceinline__ void issue(const Cur &ld, uint32_t set, bool) {
    const uint32_t lane = threadIdx.x & 31u, half = lane >> 4, le = ld.end();
    const uint64_t gs = (uint64_t)ld.grp * g.S + ld.s;
    uint8_t *dst = mem + set * kSet;
    const uint32_t sdst = (uint32_t)__cvta_generic_to_shared(dst);
#pragma unroll
    for (int k = 0; k < D; k++) {
      if (!FP8 && ld.s + k < le) cp_async16(sdst + k * kSlot + 16 * lane, g.raw + (gs + k) * kSlot + 16 * lane);
      if (FP8 && k % 2 == 0 && ld.s + k + half < le) /* lanes 0..15 slot k, 16..31 slot k + 1 */
        cp_async16(sdst + (k + half) * kSlot + 16 * (lane & 15u), g.raw + (gs + k + half) * kSlot + 16 * (lane & 15u));
    }
    if (ld.block_start()) {
      const uint64_t b = (uint64_t)ld.grp * g.CB + ld.s / 16;
      if (b != hb) load_head(b);
      const uint32_t unit = warp_exclusive_sum(hlen);
      const L1Plan p = l1_plan(h0, h1, SB, b + 1 == g.nblocks);
      uint8_t *buf = mem + 2 * kSet + (nblk++ & 1u) * SB;
      const uint32_t sbuf = (uint32_t)__cvta_generic_to_shared(buf);
      for (uint32_t o = 16 * lane; o < p.copy; o += 16 * 32) cp_async16(sbuf + o, g.data + p.s16 + o);
      *reinterpret_cast<const uint32_t **>(dst + D * kSlot + 8 * lane) = l1_lane_words(p, buf, g.data, h0, unit);
      if (b + 1 < g.nblocks) { /* the next block's head, in flight until its batch is issued */
        hb = b + 1, h0 = h1, h1 = __ldg(g.bases + b + 2);
        hlen = __ldg(g.hdr + (b + 1) * 32 + lane);
      }
    }
  }

  template <class Cur>
  __device__ __forceinline__ void head(const Cur &) const {}
  template <class Cur>
  __device__ __forceinline__ uint32_t prologue(const Cur &) const {
    return 0;
  }

  template <class Cur>
  __device__ __forceinline__ void begin(const Cur &c, uint32_t set, bool) {
    cur = mem + set * kSet;
    if (c.block_start()) st.start(*reinterpret_cast<const uint32_t *const *>(cur + D * kSlot + 8 * (threadIdx.x & 31u)), 0);
  }

  template <class Cur>
  __device__ __forceinline__ void slot(const Cur &, int k, uint32_t A[8]) {
    l1_decode_slot<FP8>(st, tab, cur + k * kSlot + kE * (threadIdx.x & 31u), A);
  }

  template <class Cur, class Sink>
  __device__ __forceinline__ void end(const Cur &, uint32_t, Sink &) const {}
};

/* The host side of layout 1 (in layout2.cu, beside layout 2's), called by the nwc_k_* entries:
 * checks and geometry of a layout-1 tensor (-ENOTSUP for another layout or type), scratch size,
 * the matvec (1..8 columns of fp32 or BF16 x), dequant (rows == NULL) or gather, and dequant of
 * a range of rows. */
int l1_geom_of(const nwc_k_tensor *t, L1Geom *g);
int64_t l1_scratch_bytes(const L1Geom &g, unsigned ncols);
int l1_matvec(const nwc_k_tensor *t, const void *x, bool bf16_x, unsigned ncols, uint64_t ldx, const float *bias,
              float *y, uint16_t *y_bf16, uint64_t ldy, void *scratch, cudaStream_t stream);
int l1_rows(const nwc_k_tensor *t, const uint64_t *rows, uint64_t n, uint16_t *out, cudaStream_t stream);
/* Rows [row0, row0 + nrows) row-major at out (row stride K16); row0 a multiple of 16. */
int l1_dequant_rows(const nwc_k_tensor *t, uint64_t row0, uint64_t nrows, uint16_t *out, cudaStream_t stream);

} /* namespace nwc_k */

#endif /* NWC_LAYOUT1_CUH */
