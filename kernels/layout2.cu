/*
 * layout2.cu - the kernels of layout 2 (BF16 and fp8): Y = scale * (W X) + bias for 1..8 columns of
 * X on the tensor cores, dequant (whole or a range of rows) and gather, each one launch.  Reached
 * through the nwc_k_* entries of nwc_kernels.h, which dispatch on the tensor's layout (l2_* below).
 * Layout 1's kernels are the same stream and sinks on another slot source (L1Source, layout1.cuh:
 * lane streams decoded with layout 0's table instead of the planes; l1_* below): l2_stream takes
 * the source as a template parameter, so the streaming, the mma, the sums and the stores exist once.
 *
 * Matvec design.  The row groups' slots are shared among all resident warps to within one batch
 * (work.cuh: stream-K ranges of slots).  A warp streams its range's slots (32
 * columns each) in batches of D through the sets of a shared-memory ring (cp.async), the next
 * batches' copies in flight while this one is decoded (l2_stream), with its bookkeeping per batch,
 * not per slot: the planes' streaming alone reaches 94 % of the read floor, and the one-slot ring
 * with per-slot bookkeeping that this replaced held the kernel to 55 % (docs/results.md).  Per
 * slot a lane decodes its A fragments (layout2.cuh) and multiplies them by B fragments that hold
 * x in three BF16 parts, x = hi + mid + lo exactly (hi: x's 8 leading significant bits, mid the
 * next 8 of what remains, lo the rest, which fits BF16: the products are exact, the accumulation
 * fp32); BF16 x (nwc_k_matvec_cols_bf16x) is its own one part.  The parts are B's columns:
 * column P c + p of the n = 8 T columns of T tiles is part p of x's column c, so one fp32 column
 * takes one tile and 8 take three, while 8 BF16 columns fill one, and a slot costs 2 T
 * mma.m16n8k16 in two accumulator chains per tile (the variants: variant_of).  The warp makes the
 * fragments itself, a batch at a time: for fp32 x each lane loads D elements of each column a
 * batch ahead (one coalesced load), cuts them into parts at the batch's start and stores them in
 * the warp's staging area, from which each lane takes its B registers of the batch's slots
 * (MatvecSink::stage); one column of BF16 x is copied into that staging with the planes
 * (copy_x), and more columns of BF16 x are loaded straight into B registers (load_b).  After a
 * block's last slot in the piece the warp applies the block's exception entries of the piece's
 * slots (the weights the planes decode to +0), a lane an entry: weight times x on the CUDA cores
 * into the exception sums of the entry's owner lane, in a table per warp in shared memory, each
 * sum's terms in entry order; at the piece's end the warp sums each column's parts and
 * its exceptions through that table, and writes the rows (a whole row group) or its part of them
 * into the warp's part table (work.cuh sums a CTA's parts after its warps' ends, then the CTAs'
 * in scratch, which every call leaves zero).
 *
 * Every kernel here is launched as a programmatic dependent of the stream's kernel before it
 * (PDL) and lets the next one launch at once: its CTAs start their first copies of the weights
 * (which no kernel writes) while the kernel before finishes, and wait for it
 * (griddepcontrol.wait) before they read x or write anything.  The CTAs of the kernel after take
 * the SMs as this one's leave, so a sequence of matvecs loses little to launches and tails.
 *
 * Dequant streams the same way and stores each slot's rows with 16-byte stores, then the
 * exceptions' weights; gather likewise, a row group per requested row, storing that row only.
 *
 * Variants: l2_matvec_kernel<V, FP8> for the five variants V of x's type and columns (variant_of)
 * and the element type, l2_rows_kernel<FP8> (dequant, row ranges and gather); layout 1's
 * l1_matvec_kernel<V, FP8> and l1_rows_kernel<FP8>.  fp8 differs only in the low plane (three
 * words per lane and pair of slots, whose mantissa fields fp8_low turns into low bytes), its
 * 2-byte exception entries and the per-row scale applied with the bias; its weights
 * are exact in BF16, so the mma path is the same.
 */
#include "bf16.cuh"
#include "cp_async.cuh"
#include "host.cuh"
#include "layout1.cuh"
#include "layout2.cuh"
#include "timeline.cuh"
#include "work.cuh"

#include <cuda_bf16.h>
#include <math.h>

#include <type_traits>

namespace nwc_k {
namespace {

constexpr unsigned kL2Warps = 8, kL2Threads = 32 * kL2Warps;
#ifdef NWC_K_TIMELINE
static_assert(kL2Warps == kTlCtaWarps, "the timeline records every warp of a CTA");
#endif
/* Dequant and gather: two CTAs a SM, each warp with four sets of its ring (three batches in flight
 * while one is stored): 4 % to 5 % more than four CTAs with two sets (docs/results.md). */
constexpr unsigned kRowsCtasPerSm = 2, kRowsRingSets = 4;

/*
 * The matvec's variants, by x's type and how many columns it takes: fp32 x is cut into three BF16
 * parts (x = hi + mid + lo exactly), BF16 x is its own one part; B's columns are the parts of x's
 * columns, so a variant of C columns of P parts has T = ceil(C P / 8) tiles of 8.
 *   0: fp32, 1 column (1 tile)   1: fp32, up to 5 (2 tiles)   2: fp32, up to 8 (3 tiles)
 *   3: BF16, 1 column (1 tile)   4: BF16, up to 8 (1 tile)
 * (One tile could hold two fp32 columns' parts, but the second column's x registers spilled at 3
 * CTAs per SM.)
 */
constexpr int kVariants = 5;
__host__ __device__ constexpr bool bf16_x_of(int V) { return V >= 3; }
__host__ __device__ constexpr unsigned cols_of(int V) { return V == 0 || V == 3 ? 1 : V == 1 ? 5 : 8; }
__host__ __device__ constexpr unsigned parts_of(int V) { return bf16_x_of(V) ? 1 : 3; }
__host__ __device__ constexpr unsigned tiles_of(int V) { return (cols_of(V) * parts_of(V) + 7) / 8; }
/* Whether the variant's warps take B straight from x (BF16 x, more than one column: each lane's B
 * registers are 16 bytes of one column), without a staging of x in shared memory. */
__host__ __device__ constexpr bool direct_b_of(int V) { return bf16_x_of(V) && cols_of(V) > 1; }
/* Two CTAs a SM for every variant.  One column's warps keep three sets of their ring (two batches
 * in flight while one is decoded: 16 warps x 8 slots a SM, against 24 x 4 with three CTAs of two
 * sets, 1.5 % faster in geometric mean, 5 % on the token step); the others keep two: a third does
 * not fit beside fp32 x's staging, and where it fits (direct B) it leaves L1 28 KB instead of 92
 * and was 8 % slower (docs/results.md). */
constexpr unsigned kMatvecCtasPerSm = 2;
__host__ __device__ constexpr int ring_sets_of(int V) { return cols_of(V) == 1 ? 3 : 2; }
/* Slots a warp decodes together (its batch of D slots is loaded while the batch before is decoded):
 * the B fragments of the batch's slots are in registers, 4 slots' of one tile, 2 of more. */
__host__ __device__ constexpr int batch_of(int V) { return tiles_of(V) == 1 ? 4 : 2; }
/* The variant for ncols columns of fp32 or BF16 x. */
static inline int variant_of(unsigned ncols, bool bf16_x) {
  if (bf16_x) return ncols == 1 ? 3 : 4;
  return ncols == 1 ? 0 : ncols <= cols_of(1) ? 1 : 2;
}

struct L2Matvec {
  const void *x; /* fp32 or BF16 (the variant's) */
  uint64_t ldx, ldy;
  uint32_t ncols, K;
  const float *scale, *bias;
  float *y;
  uint16_t *y_bf16;
  uint32_t *words; /* the CTAs' parts of row groups (work.cuh's finish_parts): 2 a CTA, 16 x ncols each */
};

/* v = hi + mid + lo exactly, each part an fp32 whose upper 16 bits are its BF16 (the lower are
 * zero, or for lo, which has at most 8 significant bits, exactly what BF16 keeps): hi is v cut to
 * 8 significant bits, mid the same of what remains, lo the rest. */
__device__ __forceinline__ void cut3(float v, uint32_t p[3]) {
  p[0] = __float_as_uint(v) & 0xffff0000u;
  const float r = v - __uint_as_float(p[0]);
  p[1] = __float_as_uint(r) & 0xffff0000u;
  p[2] = __float_as_uint(r - __uint_as_float(p[1]));
}

/* An exception entry: index, then the weight, 2 bytes (BF16) or 1 (fp8) (docs/format-layouts.md §4.4). */
template <bool FP8>
__host__ __device__ constexpr uint32_t entry_bytes() { return FP8 ? 2 : 3; }
constexpr uint32_t kWindow = 128;   /* bytes of a block's entry list a warp holds in registers */

/* One exception entry of a block, as a lane applies it: a lane takes one entry of the block's list
 * at a time (entry e = 32 i + lane, whichever lane's stream it belongs to), so that a block's
 * entries (about 16 in real BF16 weights) take one pass of the warp.  row in the group, column,
 * weight; q and rank: the entry's owner (the lane whose weight it is: lane 4 r + q of its row r
 * or r + 8) and its place among the owner's entries, which the matvec's sums follow (an
 * owner's entries may share a sum, and are added in their order). */
struct ExEntry {
  uint32_t row, col, w, q, rank;
  bool ok; /* an entry, in the piece's part of the block */
};

/* A block's exception entries as the warp holds them: the lane's count and the count of the
 * lanes before it, the list, and its first kWindow bytes (word `lane` of them per lane). */
struct ExList {
  uint32_t n, pre, win;
  const uint8_t *p;
};

/* A ring entry: one slot's nibbles and low bytes, and for a batch's first slot the block's hdr
 * and bases[b], bases[b + 1] when the batch starts a block (or a unit inside one). */
constexpr unsigned kEntry = 816, kLowOff = 256, kHdrOff = 768, kBaseOff = 800;
/* A warp's ring: NS sets of D entries (the batch being decoded, the NS - 1 being loaded). */
template <int D, int NS>
__host__ __device__ constexpr unsigned ring_bytes() { return NS * D * kEntry; }

/*
 * The planes of layout 2 as l2_stream's slot source (layout 1's is L1Source, layout1.cuh): the
 * copies of a batch into a ring set (issue), what a batch needs before its slots (begin), a
 * slot's A fragments (slot), and the work after the batch (end: the block's exceptions).
 *
 * The planes go through a ring of NS sets of D entries in shared memory: at the top of each
 * batch the warp starts cp.async copies of a batch ahead into a free set (a lane copies its
 * 16 low bytes of each slot and 16 nibble bytes of every second slot), then waits for this
 * batch's copies and decodes them, so that NS - 1 batches are always in flight while one is
 * decoded, in no registers, and no stall of the decoder delays a load.  A batch never crosses a block
 * (Cursor::end), so the per-block work is per batch: a batch that starts a
 * block brings the block's hdr bytes (the lanes' entry counts) and bases[b], bases[b + 1] in its
 * first entry; the warp sums the counts and loads the first kWindow bytes of the block's entry
 * list, a word per lane (bases are 8-aligned; the window stops at bases[b + 1]), so that at the
 * block's end a lane takes its entries out of it by two shuffles each, long after the loads
 * returned; entries past the window (rare: real weights have about 16 a block, 48 bytes) are
 * read from global memory.  Slots past a row group's last in its last batch are not copied, and
 * their decode is dropped.
 */
template <int D, bool FP8>
struct L2Source {
  /* A short batch's slots past its end may be decoded (their set entries hold the last slot's
   * bytes again): the decode then has no branch a slot, and its result is not multiplied. */
  __device__ static constexpr bool decode_all() { return true; }
  const L2Geom &g;
  uint8_t *ring_mem;
  uint32_t ring;
  const uint8_t *e; /* the set being decoded */
  ExList ex;
  uint64_t hb0, hb1; /* the first block's bases (head) */

  __device__ __forceinline__ L2Source(const L2Geom &geom, uint8_t *mem)
      : g(geom), ring_mem(mem), ring((uint32_t)__cvta_generic_to_shared(mem)), e(mem), ex{0, 0, 0, nullptr} {}

  /* The loader's batch into set `set` of the ring (with its block's hdr and bases unless `bare`);
   * the caller commits the group. */
  template <class Cur>
  __device__ __forceinline__ void issue(const Cur &ld, uint32_t set, bool bare) const {
    const uint32_t lane = threadIdx.x & 31u, half = lane >> 4, last = ld.end() - ld.s - 1; /* slots 0 .. last */
    const uint64_t gs = (uint64_t)ld.grp * g.S + ld.s;
    /* the lane's bytes of the batch's first slot (pair, for fp8; nibbles: of slot `half`), and where they go */
    const uint8_t *low = FP8 ? g.low + ((uint64_t)ld.grp * g.P + ld.s / 2) * 384 + 16 * lane : g.low + gs * 512 + 16 * lane;
    const uint8_t *nib = g.nib + gs * 256 + 16 * (lane & 15u);
    const uint32_t dst = ring + set * D * kEntry, dlow = dst + kLowOff + 16 * lane, dnib = dst + half * kEntry + 16 * (lane & 15u);
    /* Every copy of the batch from slot `at(k)`: a short batch's slots past its last copy the last
     * one's bytes again (never decoded), so that no copy depends on a branch; a whole batch (all
     * but a piece's or a short block's last) takes the same copies at fixed offsets. */
    const auto copies = [&](auto at) {
#pragma unroll
      for (uint32_t k = 0; k < (uint32_t)D; k++) {
        if (!FP8) cp_async16(dlow + k * kEntry, low + at(k) * 512);
        if (FP8 && k % 2 == 0 && lane < 24) cp_async16(dlow + k * kEntry, low + at(k) / 2 * 384); /* the pair's 384 bytes */
        if (k % 2 == 0) cp_async16(dnib + k * kEntry, nib + at(k + half) * 256);
      }
    };
    if (last == D - 1) copies([](uint32_t k) { return k; });
    else copies([last](uint32_t k) { return umin32(k, last); });
    if (!bare && ld.block_start() && lane >= 28) { /* lanes 28, 29: hdr; 30, 31: bases[b], bases[b + 1] */
      const uint64_t b = (uint64_t)ld.grp * g.CB + ld.s / 16;
      if (lane < 30) cp_async16(dst + kHdrOff + 16 * (lane - 28), g.hdr + b * 32 + 16 * (lane - 28));
      else cp_async8(dst + kBaseOff + 8 * (lane - 30), g.bases + b + (lane - 30));
    }
  }

  /* Before griddepcontrol.wait, for the first batch c (issued bare), the first block's entries by
   * plain loads (a chain of two latencies that would otherwise follow the planes'), while the
   * kernel before may still run: head() loads bases[b], bases[b + 1] and the lanes' counts before
   * the first batch's copies are issued (behind the copies of every warp, a small matvec's first
   * batches, they came back microseconds late), prologue() the window they locate, after the
   * first batch's copies.  prologue() returns a value made of the loads' results, for
   * grid_wait_after. */
  template <class Cur>
  __device__ __forceinline__ void head(const Cur &c) {
    const uint64_t b = (uint64_t)c.grp * g.CB + c.s / 16;
    hb0 = __ldg(g.bases + b), hb1 = __ldg(g.bases + b + 1);
    ex.n = __ldg(g.hdr + b * 32 + (threadIdx.x & 31u));
  }
  template <class Cur>
  __device__ __forceinline__ uint32_t prologue(const Cur &) {
    const uint32_t lane = threadIdx.x & 31u;
    ex.p = g.data + hb0;
    ex.win = 4 * lane < hb1 - hb0 ? __ldg(reinterpret_cast<const uint32_t *>(ex.p) + lane) : 0;
    ex.pre = warp_exclusive_sum(ex.n);
    return ex.win ^ ex.pre;
  }

  /* This batch's set; when it starts a block (other than the prologue's: fresh), the block's
   * entries: counts summed, the window loaded. */
  template <class Cur>
  __device__ __forceinline__ void begin(const Cur &c, uint32_t set, bool fresh) {
    const uint32_t lane = threadIdx.x & 31u;
    e = ring_mem + set * D * kEntry;
    if (c.block_start() && !fresh) {
      const uint64_t b0 = *reinterpret_cast<const uint64_t *>(e + kBaseOff);
      const uint64_t b1 = *reinterpret_cast<const uint64_t *>(e + kBaseOff + 8);
      ex.n = e[kHdrOff + lane], ex.pre = warp_exclusive_sum(ex.n), ex.p = g.data + b0;
      ex.win = 4 * lane < b1 - b0 ? __ldg(reinterpret_cast<const uint32_t *>(ex.p) + lane) : 0;
    }
  }

  /* Slot k of the batch (before its end) as A fragments. */
  template <class Cur>
  __device__ __forceinline__ void slot(const Cur &, int k, uint32_t A[8]) const {
    const uint32_t lane = threadIdx.x & 31u;
    const uint2 nib = *reinterpret_cast<const uint2 *>(e + k * kEntry + 8 * lane);
    uint4 low;
    if (FP8) { /* slot k's 48 bits of its pair's three words (fp8 batches start on even slots) */
      const uint32_t *pw = reinterpret_cast<const uint32_t *>(e + (k & ~1) * kEntry + kLowOff) + lane;
      const uint64_t f = k % 2 == 0 ? pw[0] | (uint64_t)(pw[32] & 0xffffu) << 32 : pw[32] >> 16 | (uint64_t)pw[64] << 16;
      low = fp8_low(nib, f, g.lut[2], g.lut[3]);
    } else {
      low = *reinterpret_cast<const uint4 *>(e + k * kEntry + kLowOff + 16 * lane);
    }
    decode_bf16_slot(nib, low, g.lut[0], g.lut[1], A);
  }

  /* After the batch (next: its end, Cursor::end): where the block (or the piece) ends, its
   * exception entries, 32 at a time (a lane each), to sink.exception.  Entry e's owner is the lane
   * whose entries reach past e first (a binary search over the lanes' inclusive counts, by
   * shuffles); its bytes come from the window, or for an entry past it (rare) from the list. */
  template <class Cur, class Sink>
  __device__ __forceinline__ void end(const Cur &c, uint32_t next, Sink &sink) const {
    const uint32_t lane = threadIdx.x & 31u;
    if (next % 16 == 0 || next == c.s_end) { /* the block (or the piece) ends: apply its entries */
      constexpr uint32_t E = entry_bytes<FP8>();
      const uint32_t cb = c.s / 16, lo = max(c.s0, 16 * cb) - 16 * cb, hi = next - 16 * cb;
      const uint32_t upto = ex.pre + ex.n, total = __shfl_sync(0xffffffffu, upto, 31); /* entries of lanes 0 .. lane, all */
      for (uint32_t e = lane; e - lane < total; e += 32) {
        uint32_t owner = 0; /* lanes whose entries end at or before e */
#pragma unroll
        for (uint32_t step = 16; step; step >>= 1)
          if (__shfl_sync(0xffffffffu, upto, owner + step - 1) <= e) owner += step;
        const uint32_t at = E * e, pre = __shfl_sync(0xffffffffu, ex.pre, owner); /* the entry's byte in the list */
        const uint32_t w0 = __shfl_sync(0xffffffffu, ex.win, (at >> 2) & 31u);
        const uint32_t w1 = __shfl_sync(0xffffffffu, ex.win, ((at >> 2) + 1) & 31u);
        uint32_t ent = __funnelshift_r(w0, w1, 8 * (at & 3u)); /* idx, weight low, weight high */
        if (e < total && at + E > kWindow) {
          const uint8_t *p = ex.p + at;
          ent = __ldg(p) | (uint32_t)__ldg(p + 1) << 8 | (FP8 ? 0u : (uint32_t)__ldg(p + 2) << 16);
        }
        const uint32_t idx = ent & 0xffu, j = idx & 15u, sc = idx >> 4;
        ExEntry x;
        x.ok = e < total && sc >= lo && sc < hi;
        x.q = owner & 3u, x.rank = e - pre;
        x.row = frag_row(owner >> 2, j), x.col = NWC_BLOCK_COLS * cb + 32 * sc + frag_col(x.q, j);
        x.w = FP8 ? fp8_to_bf16_bits((ent >> 8) & 0xffu) : (ent >> 8) & 0xffffu;
        sink.exception(c, x);
      }
    }
  }
};

/*
 * Streams a warp's range (work.cuh: granules of the split's G slots, 1 or 2 for layout 2, whole
 * blocks for layout 1) batch by batch (Cursor::end: up to D slots, never across a block) from a
 * slot source (L2Source above, L1Source of layout1.cuh) and calls the sink: copy_x(cursor, set)
 * beside the source's copies of a batch into a set (a kCopyX sink copies its x there),
 * load_x(cursor) for the next batch's inputs (the other sinks), stage(cursor, set) at this batch's
 * start, slot(k, cursor, A) for slot k of the
 * batch decoded to A fragments, exception(cursor, entry) for the entries of a block after its
 * last slot of the piece (layout 2), unit_end(M, split, cursor) after a piece and done(M, split,
 * warp) after the range (l2_stream: every warp of the CTA, with work or not).  The ring has NS
 * sets: before the loop the source starts the first NS - 1 batches, one a set; at the top of each
 * batch it starts the copies of the batch NS - 1 ahead into the set the batch before freed, then
 * the warp waits for this batch's copies and decodes them: NS - 1 batches are in flight while one
 * is decoded (an empty commit group stands for a batch past the range's end, so that the wait
 * counts the same).  A sink with kDecodeFirst has the batch's slots decoded before it stages x
 * and multiplies them after (the first batch's x then has the decode's time to arrive; the others
 * stage first and decode slot by slot, holding one slot's A fragments).  The first batch is issued
 * bare and the source fetches what else it needs of the first block by plain loads (head before
 * the batch's copies, prologue after them), all before griddepcontrol.wait; its begin() is then
 * told the batch is fresh.  x may be read only
 * after the wait: a kCopyX sink's x of the batches issued before it goes in a group of its own
 * after theirs, which the first batch waits for before it stages (the later batches' x is in their
 * planes' group).
 */
template <int D, int NS, class Src, class Sink>
__device__ __forceinline__ void l2_stream_range(Src &src, const Split &sp, const uint64_t *rows, uint32_t M, Sink &sink,
                                                uint32_t wid) {
  static_assert(16 % D == 0 && D >= 2, "a batch divides a block");
  static_assert(NS >= 2, "one set decoded, the others in flight");
  const uint32_t j0 = sp.start(wid), j_end = sp.start(wid + 1);
  Cursor<D> ld{}, c{};
  ld.j = j0;
  ld.open(sp, j0, j_end, rows, M);
  if (!ld.valid) return;
  src.head(ld);
  src.issue(ld, 0, true);
  cp_commit();
  c = ld;
  ld.next(sp, j0, j_end, rows, M);
  const uint32_t token = src.prologue(c);
#pragma unroll
  for (uint32_t s = 1; s + 1 < (uint32_t)NS; s++) { /* the batches after the first into sets 1 .. NS - 2 */
    if (ld.valid) src.issue(ld, s, false), ld.next(sp, j0, j_end, rows, M);
    cp_commit();
  }
  /* Launched as a programmatic dependent: everything below may read what the kernel before wrote,
   * and may write what it read.  Everything above reads only the weights. */
  grid_wait_after(token);
  tl_mark(1);
  if constexpr (Sink::kCopyX) { /* the x of the batches issued above, into their sets: a group of its own */
    Cursor<D> xc = c;
#pragma unroll
    for (uint32_t s = 0; s + 1 < (uint32_t)NS; s++)
      if (xc.valid) sink.copy_x(xc, s), xc.next(sp, j0, j_end, rows, M);
    cp_commit();
  } else {
    sink.load_x(c);
  }
  for (uint32_t set = 0, fresh = 1; c.valid; set = set + 1 == (uint32_t)NS ? 0 : set + 1, fresh = 0) {
    Cursor<D> nx = ld; /* the batch after this one (with two sets, the one started now): its x */
    if (NS > 2 && !Sink::kCopyX) nx = c, nx.next(sp, j0, j_end, rows, M);
    if (ld.valid) {
      const uint32_t to = set == 0 ? NS - 1 : set - 1;
      src.issue(ld, to, false);
      sink.copy_x(ld, to); /* in the planes' group */
    }
    cp_commit();
    const uint32_t ce = c.end();
    const auto set_ready = [&] { /* this batch's copies landed, the source's block entries begun */
      cp_wait<NS - 1>();
      __syncwarp();
      if (fresh) tl_mark(2);
      src.begin(c, set, fresh);
    };
    const auto stage_x = [&] { /* this batch's x into B, the next batch's loaded */
      if (Sink::kCopyX && fresh) { /* the first batch's x: the group after the planes issued before the wait */
        cp_wait<1>();
        __syncwarp();
      }
      sink.stage(c, set);
      if (nx.valid) sink.load_x(nx);
    };
    if constexpr (Sink::kDecodeFirst) { /* the batch's A fragments, then x (in flight meanwhile) */
      set_ready();
      uint32_t A[D][8];
#pragma unroll
      for (int k = 0; k < D; k++) /* a short batch's rest too where the source allows (no branch a slot) */
        if (Src::decode_all() || k == 0 || c.s + k < ce) src.slot(c, k, A[k]);
      stage_x();
#pragma unroll
      for (int k = 0; k < D; k++)
        if (k == 0 || c.s + k < ce) sink.slot(k, c, A[k]);
    } else { /* x staged, then slot by slot */
      stage_x();
      set_ready();
#pragma unroll
      for (int k = 0; k < D; k++) {
        if (k > 0 && c.s + k >= ce) break;
        uint32_t A[8];
        src.slot(c, k, A);
        sink.slot(k, c, A);
      }
    }
    __syncwarp(); /* every lane is done with this set before the next batch's copies reuse it */
    if (ld.valid) ld.next(sp, j0, j_end, rows, M);
    const uint32_t next = ce;
    src.end(c, next, sink);
    if (next == c.s_end) {
      sink.unit_end(M, sp, c);
      c.open(sp, j0, j_end, rows, M);
    } else {
      c.s = next;
    }
  }
  cp_wait<0>();
}

/* Every warp of the CTA (the sink's done() may wait for them all): its range, then done(). */
template <int D, int NS, class Src, class Sink>
__device__ __forceinline__ void l2_stream(Src &src, const Split &sp, const uint64_t *rows, uint32_t M, Sink &sink) {
  const uint32_t wid = blockIdx.x * kL2Warps + (threadIdx.x >> 5);
  if (wid < sp.W) l2_stream_range<D, NS>(src, sp, rows, M, sink, wid);
  tl_mark(3);
  sink.done(M, sp, wid);
  tl_mark(4);
}

/* The calling warp's part table of Bytes: the CTA's dynamic shared memory ends with its warps'
 * tables, warp 0's first (the kernels size it so). */
template <unsigned Bytes>
__device__ __forceinline__ float *part_table() {
  extern __shared__ uint4 smem[];
  uint32_t size;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(size));
  return reinterpret_cast<float *>(reinterpret_cast<uint8_t *>(smem) + size - (kL2Warps - (threadIdx.x >> 5)) * Bytes);
}

/* The matvec's sink for variant V (up to C columns of P parts in T tiles of B), streamed through
 * a ring of NS sets of batches of D: x's fragments a batch at a time, mma per slot, exceptions
 * times x on the CUDA cores, the piece's sums out.  red: the warp's piece-end table in shared
 * memory, stg its staging of x's parts. */
template <int V, int D_ = batch_of(V), int NS_ = ring_sets_of(V)>
struct MatvecSink {
  static constexpr int D = D_, C = cols_of(V), P = parts_of(V), T = tiles_of(V);
  static constexpr bool kBf16X = bf16_x_of(V);
  /* One column of BF16 x is its own part, so its staging is a copy: copy_x puts a batch's x into
   * the staging of the batch's ring set by cp.async in the planes' group, NS - 1 batches ahead like
   * them, and the batch finds it there when its planes have landed (loaded into registers one batch
   * ahead instead, the store at the batch's start waited for the load: 16 % of a launch's stall
   * samples on 28672 x 4096).  fp32 x is loaded into registers a batch ahead (load_x), cut into its
   * parts and stored at the batch's start (stage), one staging for all sets. */
  static constexpr bool kCopyX = kBf16X && C == 1;
  /* More columns of BF16 x: each lane loads its B registers of the next batch's slots straight
   * from x (load_x: 16 bytes of one column a slot, a batch ahead), which stage moves into B: no
   * staging and no stores, and a smaller CTA leaves L1 more room for x (8 columns copied into a
   * staging by cp.async, 8 or 16 bytes a copy, were slower: docs/results.md). */
  static constexpr bool kDirectB = direct_b_of(V);
  /* One column: the stream decodes a batch's A fragments before it stages x, so that the first
   * batch's x (loaded only after griddepcontrol.wait) arrives during the decode (D x 8 more
   * registers: more columns have no room). */
  static constexpr bool kDecodeFirst = C == 1;
  static_assert(!kCopyX || kDecodeFirst, "copied x is staged after its set has landed: the decode-first order");
  using X = typename std::conditional<kBf16X, uint16_t, float>::type;
  /* The piece-end table, a row per row of the group: B's 8 T columns (parts P n .. P n + P - 1 of
   * x's column n), then from kRedEx on each column's exception sums, one per lane of the row (q =
   * 0..3: a lane adds its own entries' products there, no other lane touches them). */
  static constexpr unsigned kRedEx = 8 * T, kRedCols = kRedEx + 4 * C;
  /* The staging of x's parts: for slot k of the batch and B column N, 64 bytes (32 BF16, the
   * slot's columns in order) at (k P C + N) 64. */
  static constexpr unsigned kStage = D * P * C * 64;
  static constexpr unsigned kStages = kCopyX ? NS_ : kDirectB ? 0 : 1; /* stagings: one a ring set, none, or one */
  /* Shared memory per warp beside the source's ring: its table and its stagings. */
  static constexpr unsigned kSinkSmem = 16 * kRedCols * 4 + kStages * kStage;
  /* and at the end of the CTA's shared memory, the warps' part tables (part_table). */
  static constexpr unsigned kPartTab = 2 * 16 * C * 4;
  const L2Matvec &a;
  float *red;
  uint8_t *stg;
  uint32_t wid;
  uint32_t pend0, pend1; /* the warp's first and last piece where they are parts (work.cuh) */
  float acc[T][2][4]; /* per tile, two accumulator chains: mma steps h = 0 and h = 1 */
  uint4 bn[D][T];     /* B fragments of the batch's slots */
  /* the next batch's x: kDirectB its B registers (slot by slot), otherwise without kCopyX elements
   * 32 s + D lane .. + D - 1 of each column, as floats or (BF16 x) as D / 2 pairs */
  typename std::conditional<kDirectB, uint4[D],
                            typename std::conditional<kBf16X, uint32_t[C][D / 2], float[C][D]>::type>::type xv;

  __device__ __forceinline__ MatvecSink(const L2Matvec &args, uint8_t *mem) : a(args) {
    const uint32_t lane = threadIdx.x & 31u;
    red = reinterpret_cast<float *>(mem), stg = mem + 16 * kRedCols * 4;
    wid = blockIdx.x * kL2Warps + (threadIdx.x >> 5), pend0 = pend1 = kNoPart;
    for (uint32_t e = lane; e < 16 * (kRedCols - kRedEx); e += 32)
      red[(e / (kRedCols - kRedEx)) * kRedCols + kRedEx + e % (kRedCols - kRedEx)] = 0.f;
    if constexpr (C > 1 && !kDirectB) /* the staging of columns past ncols stays zero (stage) */
      for (uint32_t e = lane; e < kStages * kStage / 16; e += 32) reinterpret_cast<uint4 *>(stg)[e] = make_uint4(0, 0, 0, 0);
    __syncwarp();
    clear();
  }
  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc[t][0][i] = acc[t][1][i] = 0.f;
  }
  /* Whether x has all C columns (always for C = 1, and the case to be fast for more): the loops
   * over columns then test none (All), otherwise each tests n < ncols. */
  __device__ __forceinline__ bool all_cols() const { return C == 1 || a.ncols == C; }
  /* kCopyX: the batch's x into set `set`'s staging by cp.async (the caller commits): each lane
   * copies its D elements (one coalesced copy, zeros from K on) to where stage's B loads take
   * them. */
  template <class Cur>
  __device__ __forceinline__ void copy_x(const Cur &c, uint32_t set) const {
    if constexpr (kCopyX) {
      static_assert(C == 1 && P == 1, "one column, its own part");
      const uint32_t lane = threadIdx.x & 31u, col = 32 * c.s + D * lane;
      const uint32_t bytes = 2 * umin32(D, a.K - umin32(col, a.K));
      const X *p = static_cast<const X *>(a.x) + (bytes ? col : 0); /* nothing read past K */
      cp_async_zfill<2 * D>((uint32_t)__cvta_generic_to_shared(stg + set * kStage + 2 * D * lane), p, bytes);
    }
  }
  /* Without kCopyX: the batch's x into xv, one coalesced load of D elements per lane and column (zeros
   * from K on), the columns a compile-time loop on a pointer stepped by ldx: every column whole
   * (col + D <= K), or at K's end. */
  template <class Cur>
  __device__ __forceinline__ void load_x(const Cur &c) {
    if constexpr (kDirectB) {
      load_b(c);
    } else if constexpr (!kCopyX) {
      const uint32_t col = 32 * c.s + D * (threadIdx.x & 31u);
      const X *p = static_cast<const X *>(a.x) + col;
      if (col + D <= a.K) {
        if (all_cols()) load_cols<true, true>(p, col);
        else load_cols<true, false>(p, col);
      } else {
        load_cols<false, C == 1>(p, col);
      }
    }
  }
  /* kDirectB: lane (n, q)'s B registers of the batch's slots, x's column n at 32 s + 8 q .. + 7
   * (stage's order), zeros past K and for columns past ncols. */
  template <class Cur>
  __device__ __forceinline__ void load_b(const Cur &c) {
    const uint32_t lane = threadIdx.x & 31u, n = lane >> 2, q = lane & 3u;
    const X *p = static_cast<const X *>(a.x) + (uint64_t)n * a.ldx;
    const bool has = all_cols() || n < a.ncols;
#pragma unroll
    for (int k = 0; k < D; k++) {
      const uint32_t col = 32 * (c.s + k) + 8 * q;
      if (has && col + 8 <= a.K) {
        xv[k] = __ldg(reinterpret_cast<const uint4 *>(p + col));
      } else {
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
          w[i] = (has && col + 2 * i < a.K ? (uint32_t)__ldg(p + col + 2 * i) : 0u) |
                 (has && col + 2 * i + 1 < a.K ? (uint32_t)__ldg(p + col + 2 * i + 1) << 16 : 0u);
        xv[k] = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
  }
  template <bool Whole, bool All>
  __device__ __forceinline__ void load_cols(const X *p, uint32_t col) {
#pragma unroll
    for (int n = 0; n < C; n++, p += a.ldx)
      if (All || n < (int)a.ncols) load_col<Whole>(n, p, col);
  }
  /* Column n's D elements from p (x's element col): whole (col + D <= K), or each tested. */
  template <bool Whole>
  __device__ __forceinline__ void load_col(int n, const X *p, uint32_t col) {
    if constexpr (kBf16X) {
      if constexpr (Whole && D == 4) {
        const uint2 v = __ldg(reinterpret_cast<const uint2 *>(p));
        xv[n][0] = v.x, xv[n][1] = v.y;
      } else if constexpr (Whole) {
        xv[n][0] = __ldg(reinterpret_cast<const uint32_t *>(p));
      } else {
#pragma unroll
        for (int i = 0; i < D / 2; i++)
          xv[n][i] = (col + 2 * i < a.K ? (uint32_t)__ldg(p + 2 * i) : 0u) |
                     (col + 2 * i + 1 < a.K ? (uint32_t)__ldg(p + 2 * i + 1) << 16 : 0u);
      }
    } else if constexpr (Whole && D == 4) {
      const float4 v = __ldg(reinterpret_cast<const float4 *>(p));
      xv[n][0] = v.x, xv[n][1] = v.y, xv[n][2] = v.z, xv[n][3] = v.w;
    } else if constexpr (Whole) {
      const float2 v = __ldg(reinterpret_cast<const float2 *>(p));
      xv[n][0] = v.x, xv[n][1] = v.y;
    } else {
#pragma unroll
      for (int i = 0; i < D; i++) xv[n][i] = col + i < a.K ? __ldg(p + i) : 0.f;
    }
  }
  /* This batch's B fragments: kDirectB's as load_b loaded them; otherwise from the staging (set
   * `set`'s with kCopyX, where copy_x put them; otherwise each lane first stores its xv's parts as
   * BF16 pairs, D / 2 words a part: fp32 x cut into three, BF16 x as loaded): lane (n, q) loads B
   * column 8 t + n of each slot, the 8 columns 8 q .. 8 q + 7 in order, as one uint4.  B's columns
   * past P ncols are zero: their staging is never written (the constructor zeroed it); those past
   * P C have none and load the last staged column again (their products are never read: the
   * piece's end adds columns P n + p of x's columns n < ncols only), so that no load is
   * predicated. */
  template <class Cur>
  __device__ __forceinline__ void stage(const Cur &, uint32_t set) {
    if constexpr (kDirectB) {
#pragma unroll
      for (int k2 = 0; k2 < D; k2++) bn[k2][0] = xv[k2];
    } else {
      const uint8_t *from = stg;
      if constexpr (kCopyX) {
        from += set * kStage;
      } else {
        if (all_cols()) stage_cols<true>();
        else stage_cols<false>();
        __syncwarp();
      }
      const uint32_t lane = threadIdx.x & 31u, N0 = lane >> 2, q = lane & 3u;
#pragma unroll
      for (int k2 = 0; k2 < D; k2++)
#pragma unroll
        for (int t = 0; t < T; t++) {
          const uint32_t N = umin32(8 * t + N0, P * C - 1); /* B's columns past P C: any staged column */
          bn[k2][t] = *reinterpret_cast<const uint4 *>(from + (k2 * P * C + N) * 64 + 16 * q);
        }
    }
  }
  template <bool All>
  __device__ __forceinline__ void stage_cols() {
    const uint32_t lane = threadIdx.x & 31u, k = D * lane / 32, off = 2 * (D * lane % 32);
#pragma unroll
    for (int n = 0; n < C; n++) {
      if (!All && n >= (int)a.ncols) break;
      uint32_t w[P][D / 2]; /* part pt's pairs */
      if constexpr (kBf16X) {
#pragma unroll
        for (int i = 0; i < D / 2; i++) w[0][i] = xv[n][i];
      } else {
        uint32_t p[D][P];
#pragma unroll
        for (int i = 0; i < D; i++) cut3(xv[n][i], p[i]);
#pragma unroll
        for (int pt = 0; pt < P; pt++)
#pragma unroll
          for (int i = 0; i < D / 2; i++) w[pt][i] = prmt(p[2 * i][pt], p[2 * i + 1][pt], 0x7632u);
      }
#pragma unroll
      for (int pt = 0; pt < P; pt++) {
        uint8_t *dst = stg + (k * P * C + P * n + pt) * 64 + off;
        if constexpr (D == 4) *reinterpret_cast<uint2 *>(dst) = make_uint2(w[pt][0], w[pt][1]);
        else *reinterpret_cast<uint32_t *>(dst) = w[pt][0];
      }
    }
  }
  template <class Cur>
  __device__ __forceinline__ void slot(int k, const Cur &, const uint32_t A[8]) {
#pragma unroll
    for (int t = 0; t < T; t++) {
      mma_bf16(acc[t][0], A, bn[k][t].x, bn[k][t].y);
      mma_bf16(acc[t][1], A + 4, bn[k][t].z, bn[k][t].w);
    }
  }

  /* The entry's weight times x, into its owner's exception sums of its row (one per lane of a row:
   * q), the owner's entries one after another in their order (an owner's entries may share a sum):
   * the x of the entry's columns loaded together first. */
  template <class Cur>
  __device__ __forceinline__ void exception(const Cur &, const ExEntry &x) const {
    float xe[C];
    const X *xn = static_cast<const X *>(a.x) + x.col; /* x's column n at the entry's column */
#pragma unroll
    for (uint32_t n = 0; n < (uint32_t)C; n++, xn += a.ldx) {
      const bool take = x.ok && (all_cols() || n < a.ncols);
      if constexpr (kBf16X) xe[n] = take ? bf16_to_f32(__ldg(xn)) : 0.f;
      else xe[n] = take ? __ldg(xn) : 0.f;
    }
    const float w = bf16_to_f32(x.w);
    float *sum = red + x.row * kRedCols + kRedEx + x.q; /* column n's at sum[4 n] */
    const uint32_t rounds = __reduce_max_sync(0xffffffffu, x.ok ? x.rank + 1 : 0u);
#pragma unroll 1
    for (uint32_t r = 0; r < rounds; r++) {
      if (x.ok && x.rank == r)
#pragma unroll
        for (uint32_t n = 0; n < (uint32_t)C; n++)
          if (all_cols() || n < a.ncols) sum[4 * n] = __fmaf_rn(w, xe[n], sum[4 * n]);
      __syncwarp();
    }
  }

  template <class Cur>
  __device__ __forceinline__ void unit_end(uint32_t M, const Split &sp, const Cur &cur);
  __device__ __forceinline__ void done(uint32_t M, const Split &sp, uint32_t) const;
};

/* Row R of column n from its sum: scaled, biased, fp32 and/or BF16 (the kernels' one rounding). */
__device__ __forceinline__ void put_row(const L2Matvec &a, uint32_t R, uint32_t n, float sum) {
  const float v = sum * (a.scale ? a.scale[R] : 1.f) + (a.bias ? a.bias[R] : 0.f);
  if (a.y) a.y[n * a.ldy + R] = v;
  if (a.y_bf16) a.y_bf16[n * a.ldy + R] = bf16_rne(v);
}

/* The piece's 16 x ncols sums: the table gets B's columns (row, 8 t + 2 q + e) beside the
 * exception sums the blocks left at (row, kRedEx + 4 n + q); then lanes add a column's P parts
 * and its four exception sums, in that order (clearing those for the next piece), and write
 * the rows (a whole row group) or the piece's slot of the warp's part table, e = row ncols + n of
 * it. */
template <int V, int D_, int NS_>
template <class Cur>
__device__ __forceinline__ void MatvecSink<V, D_, NS_>::unit_end(uint32_t M, const Split &sp, const Cur &cur) {
  const uint32_t lane = threadIdx.x & 31u, r = lane >> 2, q = lane & 3u;
#pragma unroll
  for (int t = 0; t < T; t++)
#pragma unroll
    for (int i = 0; i < 4; i++) red[(r + 8 * (i >> 1)) * kRedCols + 8 * t + 2 * q + (i & 1)] = acc[t][0][i] + acc[t][1][i];
  clear();
  __syncwarp();
  const bool whole = cur.whole(sp);
  const uint32_t per = 16 * a.ncols;
  float *p = part_table<kPartTab>() + (sp.part_slot(wid, cur.k) & 1u) * per;
  for (uint32_t e = lane; e < per; e += 32) {
    const uint32_t row = e / a.ncols, n = e - row * a.ncols, R = 16 * cur.grp + row;
    float *v = red + row * kRedCols;
    float *ex = v + kRedEx + 4 * n;
    float sum = v[P * n];
#pragma unroll
    for (int pt = 1; pt < P; pt++) sum += v[P * n + pt];
    sum += (ex[0] + ex[1]) + (ex[2] + ex[3]);
    ex[0] = ex[1] = ex[2] = ex[3] = 0.f;
    if (!whole) p[e] = sum;
    else if (R < M) put_row(a, R, n, sum);
  }
  if (!whole && cur.first) pend0 = cur.k;
  else if (!whole) pend1 = cur.k;
  __syncwarp();
}

/* After every warp's range (all the CTA's warps call it): the CTA's parts summed, passed between
 * CTAs as words where a row group spans several, and the row groups they complete written
 * (work.cuh's finish_parts). */
template <int V, int D_, int NS_>
__device__ __forceinline__ void MatvecSink<V, D_, NS_>::done(uint32_t M, const Split &sp, uint32_t) const {
  __syncthreads(); /* every warp's part table written */
  if (wid >= sp.W) return;
  const uint32_t ncols = a.ncols;
  finish_parts<16 * C>(sp, kL2Warps, wid, pend0, pend1, part_table<kPartTab>(), kPartTab / 4, a.words, 16 * ncols,
               [&](uint32_t k, uint32_t e, float sum) {
                 const uint32_t row = e / ncols, R = 16 * k + row;
                 if (R < M) put_row(a, R, e - row * ncols, sum);
               });
}

template <int V, bool FP8>
__global__ void __launch_bounds__(kL2Threads, kMatvecCtasPerSm) l2_matvec_kernel(L2Geom g, Split sp, L2Matvec a) {
  using Sink = MatvecSink<V>;
  constexpr int NS = ring_sets_of(V);
  extern __shared__ uint4 smem[];
  const unsigned tl = tl_entry(); /* the optional timeline (timeline.cuh) */
  uint8_t *mine = reinterpret_cast<uint8_t *>(smem) + (threadIdx.x >> 5) * (ring_bytes<Sink::D, NS>() + Sink::kSinkSmem);
  /* The stream's next kernel may launch now: its CTAs wait for this grid (griddepcontrol.wait). */
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  Sink sink(a, mine + ring_bytes<Sink::D, NS>());
  L2Source<Sink::D, FP8> src(g, mine);
  l2_stream<Sink::D, NS>(src, sp, nullptr, g.M, sink);
  tl_exit(tl);
}

/* Dequant's and gather's sink: each slot's two rows of 8 weights per lane as two 16-byte stores
 * (gather: only the requested row, to out + k * K16), then the exceptions' weights over the +0
 * the planes gave them (by another lane, after the batches' __syncwarp, which orders them). */
struct RowsSink {
  static constexpr int D = 4; /* layout 2's batch (layout 1's is kL1Batch) */
  static constexpr bool kDecodeFirst = false, kCopyX = false; /* no x: each slot stored as decoded */
  uint16_t *out;        /* dequant: row row0 of the range; gather: the first requested row */
  const uint64_t *rows; /* NULL: dequant of rows [row0, end) */
  uint32_t row0, end, K16;

  /* Where row `row` of the cursor's group goes, or NULL. */
  template <class Cur>
  __device__ __forceinline__ uint16_t *dst(const Cur &c, uint32_t row) const {
    if (!rows) return 16 * c.grp + row < end ? out + (uint64_t)(16 * c.grp + row - row0) * K16 : nullptr;
    return rows[c.k] % 16 == row ? out + (uint64_t)c.k * K16 : nullptr;
  }
  template <class Cur>
  __device__ __forceinline__ void copy_x(const Cur &, uint32_t) const {}
  template <class Cur>
  __device__ __forceinline__ void load_x(const Cur &) const {}
  template <class Cur>
  __device__ __forceinline__ void stage(const Cur &, uint32_t) const {}
  template <class Cur>
  __device__ __forceinline__ void slot(int k, const Cur &c, const uint32_t A[8]) const {
    const uint32_t lane = threadIdx.x & 31u, r = lane >> 2, q = lane & 3u, col = 32 * (c.s + k) + 8 * q;
    if (col >= K16) return;
    uint16_t *d0 = dst(c, r), *d8 = dst(c, r + 8);
    if (d0) *reinterpret_cast<uint4 *>(d0 + col) = make_uint4(A[0], A[2], A[4], A[6]);
    if (d8) *reinterpret_cast<uint4 *>(d8 + col) = make_uint4(A[1], A[3], A[5], A[7]);
  }
  template <class Cur>
  __device__ __forceinline__ void exception(const Cur &c, const ExEntry &x) const {
    uint16_t *d = x.ok ? dst(c, x.row) : nullptr; /* entries are at distinct weights (validated) */
    if (d) d[x.col] = (uint16_t)x.w;
  }
  template <class Cur>
  __device__ __forceinline__ void unit_end(uint32_t, const Split &, const Cur &) const {}
  __device__ __forceinline__ void done(uint32_t, const Split &, uint32_t) const {}
};

template <bool FP8>
__global__ void __launch_bounds__(kL2Threads, kRowsCtasPerSm) l2_rows_kernel(L2Geom g, Split sp, RowsSink sink) {
  constexpr int NS = kRowsRingSets;
  extern __shared__ uint4 smem[];
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  L2Source<RowsSink::D, FP8> src(g, reinterpret_cast<uint8_t *>(smem) + (threadIdx.x >> 5) * ring_bytes<RowsSink::D, NS>());
  l2_stream<RowsSink::D, NS>(src, sp, sink.rows, g.M, sink);
}

/* Layout 1 (layout1.cuh): two CTAs of 8 warps per SM, each with the 16 KB table; a warp's shared
 * memory is its ring and stream buffers (L1Source) and its sink's. */
constexpr unsigned kL1CtasPerSm = 2;
constexpr unsigned kL1WarpSmem = ((228u << 10) / kL1CtasPerSm - 1024u - kTabBytes) / kL2Warps;

template <int V, bool FP8>
struct L1Matvec {
  using Sink = MatvecSink<V, kL1Batch, 2>;
  using Src = L1Source<kL1Batch, FP8, l1_stream_buf<kL1Batch, FP8>(kL1WarpSmem, Sink::kSinkSmem + Sink::kPartTab)>;
  static constexpr unsigned kWarp = Src::kWarpSmem + Sink::kSinkSmem;
  static constexpr unsigned kSmem = kTabBytes + kL2Warps * (kWarp + Sink::kPartTab); /* the part tables last */
};

template <int V, bool FP8>
__global__ void __launch_bounds__(kL2Threads, kL1CtasPerSm) l1_matvec_kernel(L1Geom g, Split sp, L2Matvec a) {
  using K = L1Matvec<V, FP8>;
  extern __shared__ uint4 smem[];
  const unsigned tl = tl_entry();
  uint32_t *tab = reinterpret_cast<uint32_t *>(smem);
  uint8_t *mine = reinterpret_cast<uint8_t *>(smem) + kTabBytes + (threadIdx.x >> 5) * K::kWarp;
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  load_table(tab, g.tab); /* the weights' table: no kernel writes it */
  typename K::Sink sink(a, mine + K::Src::kWarpSmem);
  typename K::Src src(g, tab, mine);
  l2_stream<kL1Batch, 2>(src, sp, nullptr, g.M, sink);
  tl_exit(tl);
}

template <bool FP8>
using L1RowsSource = L1Source<kL1Batch, FP8, l1_stream_buf<kL1Batch, FP8>(kL1WarpSmem, 0)>;

template <bool FP8>
__global__ void __launch_bounds__(kL2Threads, kL1CtasPerSm) l1_rows_kernel(L1Geom g, Split sp, RowsSink sink) {
  extern __shared__ uint4 smem[];
  uint32_t *tab = reinterpret_cast<uint32_t *>(smem);
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  load_table(tab, g.tab);
  L1RowsSource<FP8> src(g, tab, reinterpret_cast<uint8_t *>(smem) + kTabBytes + (threadIdx.x >> 5) * L1RowsSource<FP8>::kWarpSmem);
  l2_stream<kL1Batch, 2>(src, sp, sink.rows, g.M, sink);
}

/* The cut of `groups` row groups of S slots from `first` among the warps of per_sm CTAs on every
 * SM, in granules of G slots (l2_granule; layout 1: 16, whole blocks). */
int l2_split(uint32_t S, uint64_t groups, uint32_t first, uint32_t G, unsigned per_sm, Split *sp) {
  const int sms = sm_count();
  if (sms < 0) return sms;
  return make_split(groups, S, G, (uint64_t)sms * per_sm * kL2Warps, first, sp);
}

/* Layout 2's granule for dequant and gather: one slot (fp8: a pair, whose low plane is one piece). */
uint32_t l2_granule(const L2Geom &g) { return g.fp8 ? 2 : 1; }

/* Layout 2's cut for the matvec: granules of half a 512-column block (8 slots), so that a warp's
 * range is whole batches (4 or 2 slots) and crosses no more block ends than it must; of a quarter
 * (4) where half blocks would leave fewer warps than one CTA a SM.  Granules of one slot cost up
 * to 10 % on the small shapes, whole blocks as much again (docs/results.md). */
constexpr uint32_t kL2MatvecGranule = 8;
static int l2_matvec_split(const L2Geom &g, unsigned per_sm, Split *sp) {
  static_assert(kL2MatvecGranule / 2 % batch_of(0) == 0 && kL2MatvecGranule / 2 % batch_of(2) == 0, "whole batches");
  const int sms = sm_count();
  if (sms < 0) return sms;
  const bool half = g.RB * ((g.S + kL2MatvecGranule - 1) / kL2MatvecGranule) >= (uint64_t)sms * kL2Warps;
  return l2_split(g.S, g.RB, 0, half ? kL2MatvecGranule : kL2MatvecGranule / 2, per_sm, sp);
}

/* CTAs for sp's warps. */
unsigned l2_ctas(const Split &sp) { return (sp.W + kL2Warps - 1) / kL2Warps; }

/* Launches kernel with dynamic shared memory smem as a programmatic dependent of the stream's
 * kernel before it (PDL). */
template <class... P, class... A>
int launch_pdl(void (*kernel)(P...), unsigned ctas, unsigned smem, cudaStream_t stream, A... args) {
  cudaLaunchAttribute pdl[1];
  pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(ctas), cfg.blockDim = dim3(kL2Threads), cfg.dynamicSmemBytes = smem, cfg.stream = stream;
  cfg.attrs = pdl, cfg.numAttrs = 1;
  int rc = cuda_status(cudaLaunchKernelEx(&cfg, kernel, args...));
  return rc < 0 ? rc : launch_status();
}

} /* namespace */

/* The shape of a tensor of layout 1 or 2 (docs/format-layouts.md §2): row groups, column blocks,
 * K16 and slots a row group; -ENOTSUP for another layout or type, -EOVERFLOW past the kernels'
 * 32-bit counts. */
static int tc_shape(const nwc_k_tensor *t, unsigned layout, uint64_t *RB, uint64_t *CB, uint64_t *K16, uint64_t *S) {
  const unsigned type = NWC_ELEM_TYPE(t->elem);
  if (NWC_ELEM_LAYOUT(t->elem) != layout || (type != NWC_ELEM_BF16 && type != NWC_ELEM_FP8)) return -ENOTSUP;
  uint64_t lay[4];
  int rc = nwc_layout(t->rows, t->cols, t->elem, lay);
  if (rc < 0) return rc;
  if (lay[NWC_LAYOUT_BLOCKS] != t->nblocks) return -EINVAL;
  *RB = (t->rows + 15) / 16, *CB = (t->cols + NWC_BLOCK_COLS - 1) / NWC_BLOCK_COLS;
  *K16 = lay[NWC_LAYOUT_K16];
  const uint64_t nl = (*K16 - NWC_BLOCK_COLS * (*CB - 1)) / 16;
  *S = 16 * (*CB - 1) + (nl + 1) / 2;
  if (t->nblocks >= (UINT64_C(1) << 31) || *RB * *S * 32 >= (UINT64_C(1) << 40) ||
      *K16 >= (UINT64_C(1) << 31) || t->rows >= (UINT64_C(1) << 31))
    return -EOVERFLOW;
  return 0;
}

int l2_geom_of(const nwc_k_tensor *t, L2Geom *g) {
  if (!t || !t->bases || !t->hdr || !t->data || !t->raw) return -EINVAL;
  /* the ring copies raw and hdr in 16-byte pieces, bases[b] in 8 */
  if ((uintptr_t)t->raw % 16 || (uintptr_t)t->hdr % 16 || (uintptr_t)t->bases % 8) return -EINVAL;
  const unsigned type = NWC_ELEM_TYPE(t->elem);
  uint64_t RB, CB, K16, S;
  int rc = tc_shape(t, 2, &RB, &CB, &K16, &S);
  if (rc < 0) return rc;
  g->bases = t->bases;
  g->hdr = t->hdr;
  g->data = t->data;
  g->nib = t->raw;
  g->low = t->raw + RB * S * 256;
  for (int i = 0; i < 4; i++)
    g->lut[i] = (uint32_t)t->psym[4 * i] | (uint32_t)t->psym[4 * i + 1] << 8 |
                (uint32_t)t->psym[4 * i + 2] << 16 | (uint32_t)t->psym[4 * i + 3] << 24;
  g->M = (uint32_t)t->rows;
  g->K = (uint32_t)t->cols;
  g->K16 = (uint32_t)K16;
  g->CB = (uint32_t)CB;
  g->S = (uint32_t)S;
  g->RB = (uint32_t)RB;
  g->P = (uint32_t)((S + 1) / 2);
  g->fp8 = type == NWC_ELEM_FP8;
  return 0;
}

/* Scratch of a matvec: two part slots of 16 x NWC_K_MAX_COLS words per CTA (as many CTAs as any
 * column count may have: the larger of layout 2's and layout 1's CTAs a SM), the same for every
 * tensor and column count, so that one zeroed scratch serves many tensors (every call leaves it
 * zero: work.cuh's finish_parts). */
static int64_t matvec_scratch_bytes() {
  const int sms = sm_count();
  return sms < 0 ? sms : (int64_t)2 * sms * max(kMatvecCtasPerSm, kL1CtasPerSm) * 16 * NWC_K_MAX_COLS * 4;
}

int64_t l2_scratch_bytes(const L2Geom &, unsigned) { return matvec_scratch_bytes(); }

/* Lets kernel use smem bytes of dynamic shared memory per CTA and asks for the smallest shared
 * memory carveout that holds ctas_per_sm such CTAs, so that the rest of the SM's 256 KB stays L1
 * (x is read from L1 by every warp; the driver's default carveout, all shared memory, left it to
 * L2's latency). */
template <class K>
static int set_smem(K *kernel, unsigned smem, unsigned ctas_per_sm) {
  int dev = 0, most = 0, rc;
  if ((rc = cuda_status(cudaGetDevice(&dev))) < 0 ||
      (rc = cuda_status(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev))) < 0 ||
      (rc = cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem))) < 0)
    return rc;
  const unsigned need = ctas_per_sm * (smem + 1024); /* the driver reserves 1 KB per CTA */
  const int percent = most > 0 ? (int)min(100u, (100u * need + (unsigned)most - 1) / (unsigned)most) : 100;
  return cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent));
}

/* The matvec of variant V and element type FP8 for a tensor of layout 2 (L2Geom) or 1 (L1Geom). */
template <int V, bool FP8>
static int launch_tc_matvec(const L2Geom &g, const L2Matvec &a, cudaStream_t stream) {
  using Sink = MatvecSink<V>;
  constexpr unsigned smem =
      kL2Warps * (ring_bytes<Sink::D, ring_sets_of(V)>() + Sink::kSinkSmem + Sink::kPartTab); /* the part tables last */
  static_assert(kMatvecCtasPerSm * (smem + 1024) <= (228u << 10), "the CTAs fit an SM");
  Split sp;
  int rc = l2_matvec_split(g, kMatvecCtasPerSm, &sp);
  if (rc < 0 || (rc = set_smem(l2_matvec_kernel<V, FP8>, smem, kMatvecCtasPerSm)) < 0) return rc;
  return launch_pdl(l2_matvec_kernel<V, FP8>, l2_ctas(sp), smem, stream, g, sp, a);
}
template <int V, bool FP8>
static int launch_tc_matvec(const L1Geom &g, const L2Matvec &a, cudaStream_t stream) {
  constexpr unsigned smem = L1Matvec<V, FP8>::kSmem;
  static_assert(kL1CtasPerSm * (smem + 1024) <= (228u << 10), "two CTAs a SM");
  Split sp;
  int rc = l2_split(g.S, g.RB, 0, 16, kL1CtasPerSm, &sp); /* granules of whole blocks */
  if (rc < 0 || (rc = set_smem(l1_matvec_kernel<V, FP8>, smem, kL1CtasPerSm)) < 0) return rc;
  return launch_pdl(l1_matvec_kernel<V, FP8>, l2_ctas(sp), smem, stream, g, sp, a);
}

/* Checks a matvec's arguments (layouts 1 and 2) and fills a: x's columns 16-byte aligned, fp32 or
 * (bf16_x) BF16. */
static int matvec_args(const nwc_k_tensor *t, uint32_t M, uint32_t K, const void *x, bool bf16_x,
                       unsigned ncols, uint64_t ldx, const float *bias, float *y, uint16_t *y_bf16, uint64_t ldy,
                       void *scratch, L2Matvec *a) {
  if (!x || !scratch || (!y && !y_bf16) || ncols < 1 || ncols > NWC_K_MAX_COLS) return -EINVAL;
  if ((uintptr_t)x % 16 || (ncols > 1 && (ldx < K || ldx % (bf16_x ? 8 : 4))) || (ncols > 1 && ldy < M) ||
      (uintptr_t)scratch % 16)
    return -EINVAL;
  a->x = x, a->ldx = ldx, a->ldy = ldy, a->ncols = ncols, a->K = K, a->scale = t->scale, a->bias = bias;
  a->y = y, a->y_bf16 = y_bf16;
  a->words = static_cast<uint32_t *>(scratch);
  return 0;
}

/* launch(V, FP8) with V the variant for ncols columns of fp32 or BF16 x and FP8 the element type,
 * as compile-time constants (std::integral_constant), for the matvecs of layouts 1 and 2. */
template <int V = 0, class Launch>
static int by_variant(int variant, bool fp8, Launch launch) {
  if constexpr (V + 1 < kVariants)
    if (variant != V) return by_variant<V + 1>(variant, fp8, launch);
  return fp8 ? launch(std::integral_constant<int, V>{}, std::true_type{})
             : launch(std::integral_constant<int, V>{}, std::false_type{});
}

/* The matvec of layouts 1 and 2: G the layout's geometry, geom_of its checks. */
template <class G>
static int tc_matvec(int (*geom_of)(const nwc_k_tensor *, G *), const nwc_k_tensor *t, const void *x, bool bf16_x,
                     unsigned ncols, uint64_t ldx, const float *bias, float *y, uint16_t *y_bf16, uint64_t ldy,
                     void *scratch, cudaStream_t stream) {
  G g;
  L2Matvec a;
  int rc = geom_of(t, &g);
  if (rc < 0 || (rc = matvec_args(t, g.M, g.K, x, bf16_x, ncols, ldx, bias, y, y_bf16, ldy, scratch, &a)) < 0)
    return rc;
  return by_variant(variant_of(ncols, bf16_x), g.fp8,
                    [&](auto V, auto fp8) { return launch_tc_matvec<V.value, fp8.value>(g, a, stream); });
}

int l2_matvec(const nwc_k_tensor *t, const void *x, bool bf16_x, unsigned ncols, uint64_t ldx, const float *bias,
              float *y, uint16_t *y_bf16, uint64_t ldy, void *scratch, cudaStream_t stream) {
  return tc_matvec(l2_geom_of, t, x, bf16_x, ncols, ldx, bias, y, y_bf16, ldy, scratch, stream);
}

/* Dequant or gather: `groups` row groups from `first` (dequant) or the row group of each of n
 * requested rows (gather), for a tensor of layout 2 (L2Geom) or 1 (L1Geom). */
static int launch_tc_rows(const L2Geom &g, uint64_t groups, uint32_t first, const RowsSink &sink, uint64_t n,
                          cudaStream_t stream) {
  constexpr unsigned smem = kL2Warps * ring_bytes<RowsSink::D, kRowsRingSets>();
  static_assert(kRowsCtasPerSm * (smem + 1024) <= (228u << 10), "the CTAs fit an SM");
  Split sp;
  int rc = l2_split(g.S, sink.rows ? n : groups, first, l2_granule(g), kRowsCtasPerSm, &sp);
  auto kernel = g.fp8 ? l2_rows_kernel<true> : l2_rows_kernel<false>;
  if (rc < 0 || (rc = set_smem(kernel, smem, kRowsCtasPerSm)) < 0) return rc;
  return launch_pdl(kernel, l2_ctas(sp), smem, stream, g, sp, sink);
}
static int launch_tc_rows(const L1Geom &g, uint64_t groups, uint32_t first, const RowsSink &sink, uint64_t n,
                          cudaStream_t stream) {
  constexpr unsigned smem = kTabBytes + kL2Warps * L1RowsSource<true>::kWarpSmem;
  static_assert(L1RowsSource<true>::kWarpSmem == L1RowsSource<false>::kWarpSmem, "one size for both types");
  static_assert(kL1CtasPerSm * (smem + 1024) <= (228u << 10), "two CTAs a SM");
  Split sp;
  int rc = l2_split(g.S, sink.rows ? n : groups, first, 16, kL1CtasPerSm, &sp);
  auto kernel = g.fp8 ? l1_rows_kernel<true> : l1_rows_kernel<false>;
  if (rc < 0 || (rc = set_smem(kernel, smem, kL1CtasPerSm)) < 0) return rc;
  return launch_pdl(kernel, l2_ctas(sp), smem, stream, g, sp, sink);
}

/* The checks and sinks of dequant or gather (rows != NULL: n requested rows) and of a range of
 * rows, for layouts 1 and 2 alike: G the layout's geometry (M, K16, RB), geom_of its checks. */
template <class G>
static int rows_call(int (*geom_of)(const nwc_k_tensor *, G *), const nwc_k_tensor *t, const uint64_t *rows,
                     uint64_t n, uint16_t *out, cudaStream_t stream) {
  G g;
  int rc = geom_of(t, &g);
  if (rc < 0) return rc;
  if (!out || (uintptr_t)out % 16) return -EINVAL;
  if (rows && n == 0) return 0;
  return launch_tc_rows(g, g.RB, 0, RowsSink{out, rows, 0, g.M, g.K16}, n, stream);
}
template <class G>
static int range_call(int (*geom_of)(const nwc_k_tensor *, G *), const nwc_k_tensor *t, uint64_t row0,
                      uint64_t nrows, uint16_t *out, cudaStream_t stream) {
  G g;
  int rc = geom_of(t, &g);
  if (rc < 0) return rc;
  if (!out || (uintptr_t)out % 16 || row0 % 16 || row0 > g.M || nrows > g.M - row0) return -EINVAL;
  if (nrows == 0) return 0;
  const uint64_t first = row0 / 16, groups = (row0 + nrows + 15) / 16 - first;
  return launch_tc_rows(g, groups, (uint32_t)first,
                        RowsSink{out, nullptr, (uint32_t)row0, (uint32_t)(row0 + nrows), g.K16}, 0, stream);
}

int l2_rows(const nwc_k_tensor *t, const uint64_t *rows, uint64_t n, uint16_t *out, cudaStream_t stream) {
  return rows_call(l2_geom_of, t, rows, n, out, stream);
}

int l2_dequant_rows(const nwc_k_tensor *t, uint64_t row0, uint64_t nrows, uint16_t *out, cudaStream_t stream) {
  return range_call(l2_geom_of, t, row0, nrows, out, stream);
}

/* ---- layout 1: the same stream and sinks on L1Source (layout1.cuh) ------------------------- */

int l1_geom_of(const nwc_k_tensor *t, L1Geom *g) {
  if (!t || !t->tab || !t->bases || !t->hdr || !t->data || !t->raw) return -EINVAL;
  /* the copies take raw, data (from a 16-byte boundary) and the table in 16-byte pieces */
  if ((uintptr_t)t->raw % 16 || (uintptr_t)t->data % 16 || (uintptr_t)t->tab % 16 || (uintptr_t)t->bases % 8)
    return -EINVAL;
  uint64_t RB, CB, K16, S;
  int rc = tc_shape(t, 1, &RB, &CB, &K16, &S);
  if (rc < 0) return rc;
  g->bases = t->bases;
  g->hdr = t->hdr;
  g->data = t->data;
  g->raw = t->raw;
  g->tab = t->tab;
  g->M = (uint32_t)t->rows;
  g->K = (uint32_t)t->cols;
  g->K16 = (uint32_t)K16;
  g->CB = (uint32_t)CB;
  g->S = (uint32_t)S;
  g->RB = (uint32_t)RB;
  g->nblocks = (uint32_t)t->nblocks;
  g->fp8 = NWC_ELEM_TYPE(t->elem) == NWC_ELEM_FP8;
  return 0;
}

int64_t l1_scratch_bytes(const L1Geom &, unsigned) { return matvec_scratch_bytes(); }

int l1_matvec(const nwc_k_tensor *t, const void *x, bool bf16_x, unsigned ncols, uint64_t ldx, const float *bias,
              float *y, uint16_t *y_bf16, uint64_t ldy, void *scratch, cudaStream_t stream) {
  return tc_matvec(l1_geom_of, t, x, bf16_x, ncols, ldx, bias, y, y_bf16, ldy, scratch, stream);
}

int l1_rows(const nwc_k_tensor *t, const uint64_t *rows, uint64_t n, uint16_t *out, cudaStream_t stream) {
  return rows_call(l1_geom_of, t, rows, n, out, stream);
}

int l1_dequant_rows(const nwc_k_tensor *t, uint64_t row0, uint64_t nrows, uint16_t *out, cudaStream_t stream) {
  return range_call(l1_geom_of, t, row0, nrows, out, stream);
}

} /* namespace nwc_k */

/* The timeline's records (timeline.cuh), appended to path as lines "tag launch cta warp sm
 * g_entry g_exit clk0 .. clk4", then cleared; path NULL: cleared only. */
#ifdef NWC_K_TIMELINE
#include <stdio.h>
#include <string.h>
#endif
extern "C" int nwc_k_timeline_dump(const char *path, const char *tag) {
#ifdef NWC_K_TIMELINE
  using namespace nwc_k;
  static TlRecord h[kTlLaunches][kTlWarps];
  int rc = cuda_status(cudaDeviceSynchronize());
  if (rc == 0) rc = cuda_status(cudaMemcpyFromSymbol(h, tl_records, sizeof h));
  if (rc < 0) return rc;
  if (path) {
    FILE *f = fopen(path, "a");
    if (!f) return -errno;
    for (unsigned l = 0; l < kTlLaunches; l++)
      for (unsigned i = 0; i < kTlWarps; i++) {
        const TlRecord &r = h[l][i];
        if (!r.g_entry) continue;
        fprintf(f, "%s %u %u %u %u %llu %llu %lld %lld %lld %lld %lld\n", tag ? tag : "-", r.launch, r.cta, r.warp,
                r.sm, r.g_entry, r.g_exit, r.clk[0], r.clk[1], r.clk[2], r.clk[3], r.clk[4]);
      }
    if (fclose(f) != 0) return -EIO;
  }
  memset(h, 0, sizeof h);
  const unsigned zero = 0;
  rc = cuda_status(cudaMemcpyToSymbol(tl_records, h, sizeof h));
  return rc < 0 ? rc : cuda_status(cudaMemcpyToSymbol(tl_ctas_started, &zero, sizeof zero));
#else
  (void)path, (void)tag;
  return -ENOTSUP;
#endif
}
