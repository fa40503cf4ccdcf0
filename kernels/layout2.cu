/*
 * layout2.cu - the kernels of layout 2 (BF16 and fp8): Y = scale * (W X) + bias for 1..8 columns of
 * X on the tensor cores, dequant (whole or a range of rows) and gather.  Reached through the
 * nwc_k_* entries of nwc_kernels.h, which dispatch on the tensor's layout (l2_* below).
 *
 * Matvec design.  The work is cut into units: a row group (16 rows) whole, or F parts of it, each
 * a run of `per` slots (whole column blocks, or half a block where row groups are few), F chosen
 * so that the units keep the resident warps evenly busy (l2_work).  A warp streams its units'
 * slots (32 columns each) in batches of D through two sets of a shared-memory ring (cp.async),
 * the next batch's copies in flight while this one is decoded (l2_stream), with its bookkeeping
 * per batch, not per slot: the planes' streaming alone reaches 94 % of the read floor, and the
 * one-slot ring with per-slot bookkeeping that this replaced held the kernel to 55 %
 * (docs/results.md).  Per slot a lane decodes its A fragments (layout2.cuh) and multiplies them
 * by B fragments that hold x in three BF16 parts, x = hi + mid + lo to 24 significant bits (the
 * products exact, fp32 accumulation: the result is within fp32 rounding of the fp64 reference).
 * The parts are B's columns: column 3c + p of the n = 8 T columns of T tiles is part p of x's
 * column c, so one column takes one tile and 8 take three, and a slot costs 2 T mma.m16n8k16 in
 * two accumulator chains per tile.  l2_xfrag_kernel makes the
 * fragments once per call, one coalesced 16-byte load per lane, tile and slot.  After a block's
 * last slot in the unit each lane adds its exception entries of the unit's slots (the weights the
 * planes decode to +0) times fp32 x on the CUDA cores, in entry order, into its own sums in a
 * table per warp in shared memory (1 KB for one tile, 3.5 KB for three); at the unit's end the
 * warp sums each column's three parts and its exceptions through that table.
 *
 * A unit that is a whole row group writes its rows.  Parts of a row group write their 16 x ncols
 * partial sums to scratch, and l2_finish_kernel, the matvec's programmatic dependent, adds each
 * row's parts in part order (so the result does not depend on scheduling), applies scale and
 * bias and writes fp32 and/or BF16.  (The parts counted themselves in a counter per row group
 * and the last added them, behind a __threadfence per unit: the fence waited for the warp's
 * copies in flight: 18 % of the stall samples on 28672 x 4096, docs/results.md.)  Scratch
 * (L2Scratch): units x 16 x NWC_K_MAX_COLS floats of partial sums, x's fragments.
 *
 * Dequant streams the same way, a unit per block (of the range's row groups), and stores each
 * slot's rows with 16-byte stores, then the exceptions' weights; gather likewise, a unit per
 * requested row and block, storing that row only.
 *
 * Variants: l2_matvec_kernel<T, FP8> for T = 1, 2, 3 tiles of B (up to 2, 5, 8 columns) and the
 * element type, l2_xfrag_kernel, l2_finish_kernel, l2_rows_kernel<FP8> (dequant, row ranges and
 * gather).  fp8 differs only in the low plane (three words per lane and pair of slots, whose
 * mantissa fields fp8_low turns into low bytes), its 2-byte exception entries and the per-row
 * scale applied with the bias; its weights are exact in BF16, so the mma path is the same.
 */
#include "bf16.cuh"
#include "cp_async.cuh"
#include "host.cuh"
#include "layout2.cuh"

#include <cuda_bf16.h>
#include <math.h>

namespace nwc_k {
namespace {

constexpr unsigned kL2Warps = 8, kL2Threads = 32 * kL2Warps;
constexpr unsigned kL2CtasPerSm = 3;   /* <= 85 registers */
constexpr unsigned kRowsCtasPerSm = 4; /* dequant and gather: <= 64 registers */
/* CTAs per SM of the matvec with T tiles: three tiles need more than 85 registers. */
__host__ __device__ constexpr unsigned matvec_ctas_per_sm(unsigned T) { return T == 3 ? 2 : kL2CtasPerSm; }
/* Slots a warp has in flight: its batch of D slots is loaded while the batch before is decoded. */
__host__ __device__ constexpr int batch_of(unsigned T) { return T == 1 ? 4 : 2; }
constexpr unsigned kParts = 3; /* x = hi + mid + lo */

/* How the row groups are cut into units of work: F parts of `per` slots each (a multiple of 8). */
struct L2Work {
  uint32_t units, F, per;
  uint32_t first; /* the row group of unit 0 (a range of rows: dequant of a row range) */
};

struct L2Matvec {
  const float *x;
  uint64_t ldx, ldy;
  uint32_t ncols, K;
  const float *scale, *bias;
  float *y;
  uint16_t *y_bf16;
  float *part;      /* units x 16 x NWC_K_MAX_COLS partial sums (F > 1) */
  const uint4 *xs;  /* x's B fragments (l2_xfrag_kernel) */
};

/* Two fp32 values as three BF16 pairs, x = hi + mid + lo to 24 significant bits: each part is
 * the BF16 (nearest) of what the parts before it miss, so the sum is x to within 2^-25 |x|. */
__device__ __forceinline__ void split3(float v0, float v1, uint32_t p[3]) {
#pragma unroll
  for (int i = 0; i < 3; i++) {
    __nv_bfloat162 h = __floats2bfloat162_rn(v0, v1);
    p[i] = *reinterpret_cast<uint32_t *>(&h);
    v0 -= __uint_as_float(p[i] << 16);
    v1 -= __uint_as_float(p[i] & 0xffff0000u);
  }
}

/* x's B fragments, once per call: for slot s, tile t, lane (n, q) of the mma, column 8 t + n of B
 * is part p = (8 t + n) % 3 of x's column c = (8 t + n) / 3 (zero for c >= ncols), and the lane
 * holds that part of x[c][32 s + 8 q .. 32 s + 8 q + 7] (zero from K on) as one uint4: b0, b1 of
 * mma step 0, then of step 1, at xs[(s T + t) 32 + lane].  The matvec is launched as its
 * programmatic dependent: it loads its first planes while this runs and waits for this grid
 * (griddepcontrol) before it reads xs. */
__global__ void l2_xfrag_kernel(const float *x, uint64_t ldx, uint32_t K, uint32_t S, uint32_t ncols, uint32_t T,
                                uint4 *xs) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < S * T * 32) {
    const uint32_t lane = i & 31u, q = lane & 3u, st = i >> 5, s = st / T, t = st - s * T;
    const uint32_t N = 8 * t + (lane >> 2), c = N / kParts, part = N - c * kParts, col = 32 * s + 8 * q;
    float v[8] = {};
    if (c < ncols) {
      const float *xp = x + c * ldx + col;
      if (col + 8 <= K) {
        const float4 a = __ldg(reinterpret_cast<const float4 *>(xp)), b = __ldg(reinterpret_cast<const float4 *>(xp) + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
      } else {
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = col + k < K ? __ldg(xp + k) : 0.f;
      }
    }
    uint32_t p[4][kParts];
#pragma unroll
    for (int k = 0; k < 4; k++) split3(v[2 * k], v[2 * k + 1], p[k]);
    uint32_t o[4];
#pragma unroll
    for (int k = 0; k < 4; k++) o[k] = part == 0 ? p[k][0] : part == 1 ? p[k][1] : p[k][2];
    xs[i] = make_uint4(o[0], o[1], o[2], o[3]);
  }
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/* An exception entry: index, then the weight, 2 bytes (BF16) or 1 (fp8) (docs/format-layouts.md §4.4). */
template <bool FP8>
__host__ __device__ constexpr uint32_t entry_bytes() { return FP8 ? 2 : 3; }
constexpr uint32_t kWindow = 128;   /* bytes of a block's entry list a warp holds in registers */

/* A position in a warp's sequence of units: unit u (row group grp, part; for gather, requested
 * row k = u / F), the batch of slots [s, min(s + D, s_end)) of the row group (D = the stream's
 * batch; s0, s_end the unit's slots; slot s is in column block s / 16), or none (valid false). */
struct Cursor {
  uint32_t u, grp, s, s0, s_end;
  bool valid;
  __device__ __forceinline__ void open(const L2Geom &g, const L2Work &w, const uint64_t *rows, uint32_t unit) {
    for (;; unit += gridDim.x * kL2Warps) {
      if (unit >= w.units) {
        valid = false;
        return;
      }
      const uint32_t k = unit / w.F;
      if (!rows) {
        grp = w.first + k;
        break;
      }
      const uint64_t R = rows[k];
      if (R < g.M) { /* a row out of range is skipped: its output is left as it was */
        grp = (uint32_t)(R / 16);
        break;
      }
    }
    u = unit;
    s = s0 = (unit % w.F) * w.per, s_end = min(s + w.per, g.S);
    valid = true;
  }
  template <int D>
  __device__ __forceinline__ void next(const L2Geom &g, const L2Work &w, const uint64_t *rows) {
    s += D;
    if (s >= s_end) open(g, w, rows, u + gridDim.x * kL2Warps);
  }
  /* The batch starts a block, or the unit inside one: the block's exception entries are needed. */
  __device__ __forceinline__ bool block_start() const { return s % 16 == 0 || s == s0; }
  __device__ __forceinline__ uint64_t block(const L2Geom &g) const { return (uint64_t)grp * g.CB + s / 16; }
};

/* Up to kExGroup of a lane's exception entries, applied together (the matvec's loads of x for them
 * in flight at once): row in the group, column, weight, and whether the entry is one. */
constexpr uint32_t kExGroup = 4;
struct ExGroup {
  uint32_t row[kExGroup], col[kExGroup], w[kExGroup];
  bool ok[kExGroup];
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
/* A warp's ring: two sets of D entries (the batch being decoded, the batch being loaded). */
template <int D>
__host__ __device__ constexpr unsigned ring_bytes() { return 2 * D * kEntry; }

/*
 * Streams a warp's units batch by batch and calls the sink: slot(k, cursor, A) for slot k of the
 * consumer's batch decoded to A fragments, fetch(k, s) for slot k of the next batch, the row
 * group's slot s, right after (the sink loads its per-slot data, x's fragments, a batch ahead),
 * exceptions(cursor, group) for the entries of a block after its last slot of the unit, a group
 * of each lane's at a time in entry order, and unit_end(cursor) after a unit.
 *
 * The planes go through a ring of two sets of D entries in shared memory: at the top of each
 * batch the warp starts cp.async copies of the next batch into the other set (a lane copies its
 * 16 low bytes of each slot and 16 nibble bytes of every second slot), then waits for this
 * batch's copies and decodes them, so that one batch is always in flight while one is decoded,
 * in no registers, and no stall of the decoder delays a load.  A batch never crosses a block
 * (units are multiples of 8 slots or whole row groups; D divides 8), so the per-block work is per
 * batch: a batch that starts a block brings the block's hdr bytes (the lanes' entry counts) and
 * bases[b], bases[b + 1] in its first entry; the warp sums the counts and loads the first kWindow
 * bytes of the block's entry list, a word per lane (bases are 8-aligned; the window stops at
 * bases[b + 1]), so that at the block's end a lane takes its entries out of it by two shuffles
 * each, long after the loads returned; entries past the window (rare: real weights have about 16
 * a block, 48 bytes) are read from global memory.  Slots past a unit's end in its last batch
 * (only where a row's last block has fewer than D slots left) are not copied, and their decode
 * is dropped.
 */
template <int D, bool FP8, class Sink>
__device__ __forceinline__ void l2_stream(const L2Geom &g, const L2Work &w, const uint64_t *rows, uint8_t *ring_mem,
                                          Sink &sink) {
  static_assert(8 % D == 0 && D >= 2, "a batch divides 8 slots");
  const uint32_t lane = threadIdx.x & 31u, r = lane >> 2, q = lane & 3u;
  const uint32_t ring = (uint32_t)__cvta_generic_to_shared(ring_mem);
  Cursor ld{}, c{};
  /* The loader's batch into set `set` of the ring. */
  auto issue = [&](uint32_t set) {
    const uint64_t gs = (uint64_t)ld.grp * g.S + ld.s;
    const uint32_t dst = ring + set * D * kEntry, half = lane >> 4;
#pragma unroll
    for (int k = 0; k < D; k++) {
      if (!FP8 && ld.s + k < ld.s_end)
        cp_async16(dst + k * kEntry + kLowOff + 16 * lane, g.low + (gs + k) * 512 + 16 * lane);
      if (FP8 && k % 2 == 0 && ld.s + k < ld.s_end && lane < 24) /* the pair's 384 bytes, in slot k's entry */
        cp_async16(dst + k * kEntry + kLowOff + 16 * lane, g.low + ((uint64_t)ld.grp * g.P + (ld.s + k) / 2) * 384 + 16 * lane);
      if (k % 2 == 0 && ld.s + k + half < ld.s_end)
        cp_async16(dst + (k + half) * kEntry + 16 * (lane & 15u), g.nib + (gs + k + half) * 256 + 16 * (lane & 15u));
    }
    if (ld.block_start() && lane >= 28) { /* lanes 28, 29: hdr; 30, 31: bases[b], bases[b + 1] */
      const uint64_t b = ld.block(g);
      if (lane < 30) cp_async16(dst + kHdrOff + 16 * (lane - 28), g.hdr + b * 32 + 16 * (lane - 28));
      else cp_async8(dst + kBaseOff + 8 * (lane - 30), g.bases + b + (lane - 30));
    }
    cp_commit();
  };
  ld.open(g, w, rows, blockIdx.x * kL2Warps + (threadIdx.x >> 5));
  if (!ld.valid) return;
  issue(0);
  c = ld;
  ld.next<D>(g, w, rows);
  /* Launched as a dependent (the matvec, after l2_xfrag_kernel): everything below may read what
   * the grid before wrote.  A no-op otherwise. */
  asm volatile("griddepcontrol.wait;" ::: "memory");
#pragma unroll
  for (int k = 0; k < D; k++)
    if (c.s + k < c.s_end) sink.fetch(k, c.s + k);
  ExList ex{0, 0, 0, nullptr};
  for (uint32_t set = 0; c.valid; set ^= 1u) {
    const Cursor nx = ld; /* the next batch, started now */
    if (nx.valid) issue(set ^ 1u);
    else cp_commit();
    cp_wait<1>();
    __syncwarp();
    const uint8_t *e = ring_mem + set * D * kEntry;
    if (c.block_start()) { /* the block's entries: counts summed, the window loaded */
      const uint64_t b0 = *reinterpret_cast<const uint64_t *>(e + kBaseOff);
      const uint64_t b1 = *reinterpret_cast<const uint64_t *>(e + kBaseOff + 8);
      ex.n = e[kHdrOff + lane], ex.pre = warp_exclusive_sum(ex.n), ex.p = g.data + b0;
      ex.win = 4 * lane < b1 - b0 ? __ldg(reinterpret_cast<const uint32_t *>(ex.p) + lane) : 0;
    }
#pragma unroll
    for (int k = 0; k < D; k++) {
      uint32_t A[8];
      const uint2 nib = *reinterpret_cast<const uint2 *>(e + k * kEntry + 8 * lane);
      uint4 low;
      if (FP8) { /* slot k's 48 bits of its pair's three words (batches start on even slots) */
        const uint32_t *pw = reinterpret_cast<const uint32_t *>(e + (k & ~1) * kEntry + kLowOff) + lane;
        const uint64_t f = k % 2 == 0 ? pw[0] | (uint64_t)(pw[32] & 0xffffu) << 32 : pw[32] >> 16 | (uint64_t)pw[64] << 16;
        low = fp8_low(nib, f, g.lut[2], g.lut[3]);
      } else {
        low = *reinterpret_cast<const uint4 *>(e + k * kEntry + kLowOff + 16 * lane);
      }
      decode_bf16_slot(nib, low, g.lut[0], g.lut[1], A);
      if (c.s + k < c.s_end) sink.slot(k, c, A);
      if (nx.valid && nx.s + k < nx.s_end) sink.fetch(k, nx.s + k);
    }
    __syncwarp(); /* every lane is done with this set before the next batch's copies reuse it */
    if (nx.valid) ld.next<D>(g, w, rows);
    const uint32_t next = min(c.s + D, c.s_end);
    if (next % 16 == 0 || next == c.s_end) { /* the block (or the unit) ends: apply its entries */
      const uint32_t cb = c.s / 16, lo = max(c.s0, 16 * cb) - 16 * cb, hi = next - 16 * cb;
      const uint32_t most = __reduce_max_sync(0xffffffffu, ex.n);
      for (uint32_t k0 = 0; k0 < most; k0 += kExGroup) { /* kExGroup entries a lane at a time */
        ExGroup eg;
#pragma unroll
        for (uint32_t i = 0; i < kExGroup; i++) {
          const uint32_t k = k0 + i, at = entry_bytes<FP8>() * (ex.pre + k); /* the entry's byte in the list */
          const uint32_t w0 = __shfl_sync(0xffffffffu, ex.win, (at >> 2) & 31u);
          const uint32_t w1 = __shfl_sync(0xffffffffu, ex.win, ((at >> 2) + 1) & 31u);
          uint32_t ent = __funnelshift_r(w0, w1, 8 * (at & 3u)); /* idx, weight low, weight high */
          if (k < ex.n && at + entry_bytes<FP8>() > kWindow) /* past the window */
            ent = __ldg(ex.p + at) | (uint32_t)__ldg(ex.p + at + 1) << 8 | (FP8 ? 0u : (uint32_t)__ldg(ex.p + at + 2) << 16);
          const uint32_t idx = ent & 0xffu, j = idx & 15u, sc = idx >> 4;
          eg.ok[i] = k < ex.n && sc >= lo && sc < hi; /* the lane's, in the unit's part of the block */
          eg.row[i] = frag_row(r, j), eg.col[i] = NWC_BLOCK_COLS * cb + 32 * sc + frag_col(q, j);
          eg.w[i] = FP8 ? fp8_to_bf16_bits((ent >> 8) & 0xffu) : (ent >> 8) & 0xffffu;
        }
        sink.exceptions(c, eg);
      }
    }
    if (next == c.s_end) {
      sink.unit_end(g, w, c);
      c.open(g, w, rows, c.u + gridDim.x * kL2Warps);
    } else {
      c.s = next;
    }
  }
  cp_wait<0>();
}

/* The matvec's sink for T tiles of B (up to 8 T / 3 columns): mma per slot, exceptions times
 * x on the CUDA cores, the unit's sums out.  red: the warp's unit-end table in shared memory. */
template <int T>
struct MatvecSink {
  static constexpr int D = batch_of(T);
  /* The unit-end table, a row per row of the group: B's 8 T columns (parts 3 n .. 3 n + 2 of x's
   * column n), then from kRedEx on each column's exception sums, one per lane of the row (q =
   * 0..3: a lane adds its own entries' products there, no other lane touches them). */
  static constexpr unsigned kRedEx = 8 * T, kRedCols = kRedEx + 4 * (8 * T / kParts);
  /* Shared memory per warp: its ring, then its table. */
  static constexpr unsigned kWarpSmem = ring_bytes<D>() + 16 * kRedCols * 4;
  const L2Matvec &a;
  float *red;
  float acc[T][2][4]; /* per tile, two accumulator chains: mma steps h = 0 and h = 1 */
  uint4 bn[D][T];     /* B fragments of the batch's slots, loaded a batch ahead */

  __device__ __forceinline__ MatvecSink(const L2Matvec &args, float *table) : a(args), red(table) {
    const uint32_t lane = threadIdx.x & 31u;
    for (uint32_t e = lane; e < 16 * (kRedCols - kRedEx); e += 32)
      red[(e / (kRedCols - kRedEx)) * kRedCols + kRedEx + e % (kRedCols - kRedEx)] = 0.f;
    __syncwarp();
    clear();
  }
  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
      for (int i = 0; i < 4; i++) acc[t][0][i] = acc[t][1][i] = 0.f;
  }
  /* The fragments of slot s into bn[k]; a lane whose B columns hold no part of x (column
   * 8 t + n >= 3 ncols) keeps zeros and loads nothing, so that L1 holds only x's real parts. */
  __device__ __forceinline__ void fetch(int k, uint32_t s) {
    const uint32_t lane = threadIdx.x & 31u;
    const uint4 *xs = a.xs + (uint64_t)s * T * 32 + lane;
#pragma unroll
    for (int t = 0; t < T; t++)
      bn[k][t] = 8 * t + (lane >> 2) < kParts * a.ncols ? __ldg(xs + 32 * t) : make_uint4(0, 0, 0, 0);
  }
  __device__ __forceinline__ void slot(int k, const Cursor &, const uint32_t A[8]) {
#pragma unroll
    for (int t = 0; t < T; t++) {
      mma_bf16(acc[t][0], A, bn[k][t].x, bn[k][t].y);
      mma_bf16(acc[t][1], A + 4, bn[k][t].z, bn[k][t].w);
    }
  }

  /* The entries' weights times fp32 x, into the lane's own exception sums of their rows, in
   * entry order; a column's x values for the group are loaded before any is used. */
  __device__ __forceinline__ void exceptions(const Cursor &, const ExGroup &eg) const {
    for (uint32_t n = 0; n < a.ncols; n++) {
      float xv[kExGroup];
#pragma unroll
      for (uint32_t i = 0; i < kExGroup; i++) xv[i] = eg.ok[i] ? __ldg(a.x + n * a.ldx + eg.col[i]) : 0.f;
#pragma unroll
      for (uint32_t i = 0; i < kExGroup; i++)
        if (eg.ok[i]) red[eg.row[i] * kRedCols + kRedEx + 4 * n + (threadIdx.x & 3u)] += bf16_to_f32(eg.w[i]) * xv[i];
    }
  }

  __device__ __forceinline__ void unit_end(const L2Geom &g, const L2Work &w, const Cursor &cur);

};

/* Row R of column n from its sum: scaled, biased, fp32 and/or BF16 (the kernels' one rounding). */
__device__ __forceinline__ void put_row(const L2Matvec &a, uint32_t R, uint32_t n, float sum) {
  const float v = sum * (a.scale ? a.scale[R] : 1.f) + (a.bias ? a.bias[R] : 0.f);
  if (a.y) a.y[n * a.ldy + R] = v;
  if (a.y_bf16) a.y_bf16[n * a.ldy + R] = bf16_rne(v);
}

/* The unit's 16 x ncols sums: the table gets B's columns (row, 8 t + 2 q + e) beside the
 * exception sums the blocks left at (row, kRedEx + 4 n + q); then lanes add a column's three
 * parts and its four exception sums, in that order (clearing those for the next unit), and write
 * the rows (a whole row group) or the unit's partial sums. */
template <int T>
__device__ __forceinline__ void MatvecSink<T>::unit_end(const L2Geom &g, const L2Work &w, const Cursor &cur) {
  const uint32_t lane = threadIdx.x & 31u, r = lane >> 2, q = lane & 3u;
#pragma unroll
  for (int t = 0; t < T; t++)
#pragma unroll
    for (int i = 0; i < 4; i++) red[(r + 8 * (i >> 1)) * kRedCols + 8 * t + 2 * q + (i & 1)] = acc[t][0][i] + acc[t][1][i];
  clear();
  __syncwarp();
  float *p = a.part + (uint64_t)cur.u * 16 * NWC_K_MAX_COLS;
  for (uint32_t e = lane; e < 16 * a.ncols; e += 32) {
    const uint32_t row = e / a.ncols, n = e - row * a.ncols, R = 16 * cur.grp + row;
    float *v = red + row * kRedCols;
    float *ex = v + kRedEx + 4 * n;
    const float sum = v[kParts * n] + v[kParts * n + 1] + v[kParts * n + 2] + ((ex[0] + ex[1]) + (ex[2] + ex[3]));
    ex[0] = ex[1] = ex[2] = ex[3] = 0.f;
    if (w.F == 1) { /* the unit is the whole row group: out directly */
      if (R < g.M) put_row(a, R, n, sum);
    } else {
      p[row * NWC_K_MAX_COLS + n] = sum;
    }
  }
  __syncwarp();
}

template <int T, bool FP8>
__global__ void __launch_bounds__(kL2Threads, matvec_ctas_per_sm(T)) l2_matvec_kernel(L2Geom g, L2Work w, L2Matvec a) {
  using Sink = MatvecSink<T>;
  extern __shared__ uint4 smem[];
  uint8_t *mine = reinterpret_cast<uint8_t *>(smem) + (threadIdx.x >> 5) * Sink::kWarpSmem;
  /* l2_finish_kernel (parts of row groups) may be launched now: its CTAs wait for this grid. */
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  Sink sink(a, reinterpret_cast<float *>(mine + ring_bytes<Sink::D>()));
  l2_stream<Sink::D, FP8>(g, w, nullptr, mine, sink);
}

/* The rows of row groups cut into F parts: thread i makes row R = i % M of column n = i / M from
 * its F partial sums, added in part order.  Launched as the matvec's programmatic dependent: it
 * waits for that grid's end (and its writes) before it reads them. */
__global__ void l2_finish_kernel(L2Matvec a, uint32_t M, uint32_t F) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (uint64_t)M * a.ncols) return;
  const uint32_t n = (uint32_t)(i / M), R = (uint32_t)(i - (uint64_t)n * M);
  const float *p = a.part + ((uint64_t)(R / 16) * F * 16 + R % 16) * NWC_K_MAX_COLS + n;
  float sum = 0.f;
  for (uint32_t k = 0; k < F; k++) sum += p[(uint64_t)k * 16 * NWC_K_MAX_COLS];
  put_row(a, R, n, sum);
}

/* Dequant's and gather's sink: each slot's two rows of 8 weights per lane as two 16-byte stores
 * (gather: only the requested row, to out + k * K16), then the exceptions' weights over the +0
 * the planes gave them (the same lane, so in program order). */
struct RowsSink {
  static constexpr int D = 4;
  uint16_t *out;        /* dequant: row row0 of the range; gather: the first requested row */
  const uint64_t *rows; /* NULL: dequant of rows [row0, end) */
  uint32_t row0, end, K16, F;

  /* Where row `row` of the cursor's group goes, or NULL. */
  __device__ __forceinline__ uint16_t *dst(const Cursor &c, uint32_t row) const {
    if (!rows) return 16 * c.grp + row < end ? out + (uint64_t)(16 * c.grp + row - row0) * K16 : nullptr;
    const uint32_t k = c.u / F;
    return rows[k] % 16 == row ? out + (uint64_t)k * K16 : nullptr;
  }
  __device__ __forceinline__ void fetch(int, uint32_t) const {}
  __device__ __forceinline__ void slot(int k, const Cursor &c, const uint32_t A[8]) const {
    const uint32_t lane = threadIdx.x & 31u, r = lane >> 2, q = lane & 3u, col = 32 * (c.s + k) + 8 * q;
    if (col >= K16) return;
    uint16_t *d0 = dst(c, r), *d8 = dst(c, r + 8);
    if (d0) *reinterpret_cast<uint4 *>(d0 + col) = make_uint4(A[0], A[2], A[4], A[6]);
    if (d8) *reinterpret_cast<uint4 *>(d8 + col) = make_uint4(A[1], A[3], A[5], A[7]);
  }
  __device__ __forceinline__ void exceptions(const Cursor &c, const ExGroup &eg) const {
#pragma unroll
    for (uint32_t i = 0; i < kExGroup; i++) {
      uint16_t *d = eg.ok[i] ? dst(c, eg.row[i]) : nullptr;
      if (d) d[eg.col[i]] = (uint16_t)eg.w[i];
    }
  }
  __device__ __forceinline__ void unit_end(const L2Geom &, const L2Work &, const Cursor &) const {}
};

template <bool FP8>
__global__ void __launch_bounds__(kL2Threads, kRowsCtasPerSm) l2_rows_kernel(L2Geom g, L2Work w, RowsSink sink) {
  extern __shared__ uint4 smem[];
  l2_stream<RowsSink::D, FP8>(g, w, sink.rows, reinterpret_cast<uint8_t *>(smem) + (threadIdx.x >> 5) * ring_bytes<RowsSink::D>(),
                         sink);
}

/* CTAs for a grid-striding kernel of kL2Threads on sms SMs: enough warps for the units, at most
 * per_sm CTAs per SM (all resident at once: units are handed out by striding). */
unsigned l2_ctas(uint64_t units, int sms, unsigned per_sm) {
  const uint64_t need = (units + kL2Warps - 1) / kL2Warps, most = (uint64_t)sms * per_sm;
  return (unsigned)(need < most ? need : most);
}

/* The matvec's units: row groups cut into F parts of `per` slots (F = 1: whole, no partial
 * sums; a part is whole blocks, or half a block: 8 slots).  Warps take units in turn, so the time
 * is about ceil(units / warps) units: with at least as many row groups as resident warps F is 1,
 * else the largest parts whose units keep the warps busiest (within 3 % of the best; 19456 x
 * 2560 in three parts gave 1.15 units a warp, so two rounds). */
int l2_work(const L2Geom &g, int sms, unsigned per_sm, L2Work *w) {
  const double warps = (double)sms * per_sm * kL2Warps;
  if (g.RB >= warps) {
    w->per = g.S, w->F = 1, w->units = g.RB, w->first = 0;
    return 0;
  }
  double best = 0;
  for (uint32_t pass = 0; pass < 2; pass++)
    for (uint32_t f = 1; f <= 2 * g.CB; f++) {
      const uint32_t per = f == 2 * g.CB ? 8 : 16 * ((g.CB + f - 1) / f), F = (g.S + per - 1) / per;
      const double units = (double)g.RB * F, busy = units / (ceil(units / warps) * warps);
      if (pass == 0 && busy > best) best = busy;
      if (pass == 1 && busy >= 0.97 * best) {
        w->per = per, w->F = F, w->units = g.RB * F, w->first = 0;
        return 0;
      }
    }
  return -EINVAL; /* not reached: pass 1 meets pass 0's best */
}

} /* namespace */

int l2_geom_of(const nwc_k_tensor *t, L2Geom *g) {
  if (!t || !t->bases || !t->hdr || !t->data || !t->raw) return -EINVAL;
  /* the ring copies raw and hdr in 16-byte pieces, bases[b] in 8 */
  if ((uintptr_t)t->raw % 16 || (uintptr_t)t->hdr % 16 || (uintptr_t)t->bases % 8) return -EINVAL;
  const unsigned type = NWC_ELEM_TYPE(t->elem);
  if (NWC_ELEM_LAYOUT(t->elem) != 2 || (type != NWC_ELEM_BF16 && type != NWC_ELEM_FP8)) return -ENOTSUP;
  uint64_t lay[4];
  int rc = nwc_layout(t->rows, t->cols, t->elem, lay);
  if (rc < 0) return rc;
  if (lay[NWC_LAYOUT_BLOCKS] != t->nblocks) return -EINVAL;
  const uint64_t RB = (t->rows + 15) / 16, CB = (t->cols + NWC_BLOCK_COLS - 1) / NWC_BLOCK_COLS;
  const uint64_t K16 = lay[NWC_LAYOUT_K16], nl = (K16 - NWC_BLOCK_COLS * (CB - 1)) / 16;
  const uint64_t S = 16 * (CB - 1) + (nl + 1) / 2;
  if (t->nblocks >= (UINT64_C(1) << 31) || RB * S * 32 >= (UINT64_C(1) << 40) ||
      K16 >= (UINT64_C(1) << 31) || t->rows >= (UINT64_C(1) << 31))
    return -EOVERFLOW;
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

/* B's tiles for ncols columns of x: 3 ncols columns of B, 8 a tile. */
static unsigned tiles_of(unsigned ncols) { return (kParts * ncols + 7) / 8; }

/* Scratch: the partial sums (units x 16 x NWC_K_MAX_COLS floats, F > 1), x's B fragments (S x T
 * tiles x 32 lanes x 16 bytes). */
struct L2Scratch {
  uint64_t part, xs, total;
  L2Scratch(const L2Geom &g, const L2Work &w, unsigned T) {
    part = 0;
    xs = w.F > 1 ? (uint64_t)w.units * 16 * NWC_K_MAX_COLS * 4 : 0;
    total = xs + (uint64_t)g.S * T * 32 * 16;
  }
};

int64_t l2_scratch_bytes(const L2Geom &g, unsigned ncols) {
  L2Work w;
  const unsigned T = tiles_of(ncols);
  int rc = sm_count();
  if (rc >= 0) rc = l2_work(g, rc, matvec_ctas_per_sm(T), &w);
  if (rc < 0) return rc;
  return (int64_t)L2Scratch(g, w, T).total;
}

/* Lets kernel use smem bytes of dynamic shared memory per CTA and asks for the smallest shared
 * memory carveout that holds ctas_per_sm such CTAs, so that the rest of the SM's 256 KB stays L1
 * (x's fragments are read from L1 by every warp; the driver's default carveout, all shared
 * memory, left them to L2's latency). */
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

template <int T, bool FP8>
static int launch_l2_matvec(const L2Geom &g, const L2Work &w, unsigned ctas, const L2Matvec &a,
                            cudaStream_t stream) {
  int rc;
  if ((rc = set_smem(l2_matvec_kernel<T, FP8>, kL2Warps * MatvecSink<T>::kWarpSmem, matvec_ctas_per_sm(T))) < 0)
    return rc;
  const uint32_t threads = g.S * T * 32;
  l2_xfrag_kernel<<<(threads + 255) / 256, 256, 0, stream>>>(a.x, a.ldx, g.K, g.S, a.ncols, T, const_cast<uint4 *>(a.xs));
  if ((rc = launch_status()) < 0) return rc;
  cudaLaunchAttribute pdl[1];
  pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(ctas), cfg.blockDim = dim3(kL2Threads), cfg.dynamicSmemBytes = kL2Warps * MatvecSink<T>::kWarpSmem, cfg.stream = stream;
  cfg.attrs = pdl, cfg.numAttrs = 1;
  if ((rc = cuda_status(cudaLaunchKernelEx(&cfg, l2_matvec_kernel<T, FP8>, g, w, a))) < 0) return rc;
  if ((rc = launch_status()) < 0 || w.F == 1) return rc;
  const uint64_t outs = (uint64_t)g.M * a.ncols;
  cfg.gridDim = dim3((unsigned)((outs + 255) / 256)), cfg.blockDim = dim3(256), cfg.dynamicSmemBytes = 0;
  if ((rc = cuda_status(cudaLaunchKernelEx(&cfg, l2_finish_kernel, a, g.M, w.F))) < 0) return rc;
  return launch_status();
}

int l2_matvec(const nwc_k_tensor *t, const float *x, unsigned ncols, uint64_t ldx, const float *bias,
              float *y, uint16_t *y_bf16, uint64_t ldy, void *scratch, cudaStream_t stream) {
  L2Geom g;
  int rc = l2_geom_of(t, &g);
  if (rc < 0) return rc;
  if (!x || !scratch || (!y && !y_bf16) || ncols < 1 || ncols > NWC_K_MAX_COLS) return -EINVAL;
  if ((uintptr_t)x % 16 || (ncols > 1 && (ldx < g.K || ldx % 4)) || (ncols > 1 && ldy < g.M) ||
      (uintptr_t)scratch % 16)
    return -EINVAL;
  L2Work w;
  const unsigned T = tiles_of(ncols);
  const int sms = sm_count();
  if (sms < 0) return sms;
  if ((rc = l2_work(g, sms, matvec_ctas_per_sm(T), &w)) < 0) return rc;
  const unsigned ctas = l2_ctas(w.units, sms, matvec_ctas_per_sm(T));
  L2Matvec a;
  a.x = x, a.ldx = ldx, a.ldy = ldy, a.ncols = ncols, a.K = g.K, a.scale = t->scale, a.bias = bias;
  a.y = y, a.y_bf16 = y_bf16;
  const L2Scratch sc(g, w, T);
  a.part = reinterpret_cast<float *>(static_cast<uint8_t *>(scratch) + sc.part);
  a.xs = reinterpret_cast<const uint4 *>(static_cast<uint8_t *>(scratch) + sc.xs);
  if (g.fp8) {
    if (T == 1) return launch_l2_matvec<1, true>(g, w, ctas, a, stream);
    if (T == 2) return launch_l2_matvec<2, true>(g, w, ctas, a, stream);
    return launch_l2_matvec<3, true>(g, w, ctas, a, stream);
  }
  if (T == 1) return launch_l2_matvec<1, false>(g, w, ctas, a, stream);
  if (T == 2) return launch_l2_matvec<2, false>(g, w, ctas, a, stream);
  return launch_l2_matvec<3, false>(g, w, ctas, a, stream);
}

/* Dequant or gather: a unit per block of `groups` row groups from `first` (dequant) or per block
 * of each of n requested rows (gather). */
static int launch_rows(const L2Geom &g, uint64_t groups, uint32_t first, const RowsSink &sink, uint64_t n,
                       cudaStream_t stream) {
  const uint64_t units = (sink.rows ? n : groups) * g.CB;
  if (units >= (UINT64_C(1) << 31)) return -EOVERFLOW;
  const L2Work w{(uint32_t)units, g.CB, 16, first};
  const int sms = sm_count();
  if (sms < 0) return sms;
  const unsigned ctas = l2_ctas(w.units, sms, kRowsCtasPerSm);
  constexpr unsigned smem = kL2Warps * ring_bytes<RowsSink::D>();
  int rc;
  auto kernel = g.fp8 ? l2_rows_kernel<true> : l2_rows_kernel<false>;
  if ((rc = set_smem(kernel, smem, kRowsCtasPerSm)) < 0) return rc;
  kernel<<<ctas, kL2Threads, smem, stream>>>(g, w, sink);
  return launch_status();
}

int l2_rows(const nwc_k_tensor *t, const uint64_t *rows, uint64_t n, uint16_t *out, cudaStream_t stream) {
  L2Geom g;
  int rc = l2_geom_of(t, &g);
  if (rc < 0) return rc;
  if (!out || (uintptr_t)out % 16) return -EINVAL;
  if (rows && n == 0) return 0;
  return launch_rows(g, g.RB, 0, RowsSink{out, rows, 0, g.M, g.K16, g.CB}, n, stream);
}

int l2_dequant_rows(const nwc_k_tensor *t, uint64_t row0, uint64_t nrows, uint16_t *out, cudaStream_t stream) {
  L2Geom g;
  int rc = l2_geom_of(t, &g);
  if (rc < 0) return rc;
  if (!out || (uintptr_t)out % 16 || row0 % 16 || row0 > g.M || nrows > g.M - row0) return -EINVAL;
  if (nrows == 0) return 0;
  const uint64_t first = row0 / 16, groups = (row0 + nrows + 15) / 16 - first;
  return launch_rows(g, groups, (uint32_t)first, RowsSink{out, nullptr, (uint32_t)row0, (uint32_t)(row0 + nrows), g.K16, g.CB},
                     0, stream);
}

} /* namespace nwc_k */
