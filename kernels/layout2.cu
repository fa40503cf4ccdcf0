/*
 * layout2.cu - the kernels of layout 2 (BF16): Y = scale * (W X) + bias for 1..8 columns of X on
 * the tensor cores, dequant and gather.  Reached through the nwc_k_* entries of nwc_kernels.h,
 * which dispatch on the tensor's layout (l2_* below).
 *
 * Matvec design.  The work is cut into units: a row group (16 rows) whole, or F parts of it, each
 * a run of column blocks, F chosen so that the units keep the resident warps evenly busy
 * (l2_work).  A warp streams its units' slots (32 columns each) through a ring of shared-memory
 * entries filled by cp.async kRing - 1 slots ahead (l2_stream), so that many bytes are in flight
 * without registers.  (The bulk copy engine, one lane filling two- or four-slot entries behind an
 * mbarrier, ran the largest shape at half this speed: docs/results.md.)  Per slot a lane decodes its A fragments from the entry (layout2.cuh), loads its 8
 * activations' fragments (lanes r < ncols), x in three BF16 parts, x = hi + mid + lo to 24
 * significant bits (the products exact, fp32 accumulation: the result is within fp32 rounding of
 * the fp64 reference), made once per call by l2_xfrag_kernel; six mma.m16n8k16 per slot, in two
 * accumulator chains, multiply 16 rows by 8 columns.  After a block's last slot each lane adds
 * its exception entries (the weights the planes decode to +0) times fp32 x on the CUDA cores, in
 * entry order; at the unit's end a shuffle sums them over the four lanes of a row into the
 * fragment.
 *
 * A unit that is a whole row group writes its rows.  Parts of a row group are summed without
 * atomics on values: each writes its 16 x ncols partial sums to scratch, then counts itself in
 * its row group's counter; the part that completes the count adds the row group's partial sums
 * in part order (so the result does not depend on scheduling), applies scale and bias and writes
 * fp32 and/or BF16.  Scratch (L2Scratch): RB counters (zeroed by l2_xfrag_kernel), units x 16 x NC
 * floats of partial sums, x's fragments.
 *
 * Dequant streams the same way, a unit per block, and stores each slot's rows with 16-byte
 * stores, then the exceptions' weights; gather likewise, a unit per requested row and block,
 * storing that row only.
 *
 * Variants: l2_matvec_kernel<NC> for NC = 1, 2, 4, 8 columns (ncols rounded up),
 * l2_rows_kernel (dequant and gather) (BF16).
 */
#include "bf16.cuh"
#include "host.cuh"
#include "layout2.cuh"

#include <cuda_bf16.h>
#include <math.h>

namespace nwc_k {
namespace {

constexpr unsigned kL2Warps = 8, kL2Threads = 32 * kL2Warps;
constexpr unsigned kL2CtasPerSm = 3; /* <= 80 registers */
constexpr unsigned kRing = 8;      /* slots staged per warp */
constexpr unsigned kEntry = 832;   /* a ring entry: nibbles 256, low 512, hdr 32, bases[b] 8, pad */
constexpr unsigned kLowOff = 256, kHdrOff = 768, kBaseOff = 800;
constexpr unsigned kL2Smem = kL2Warps * kRing * kEntry;

/* How the row groups are cut into units of work: F parts of `per` column blocks each. */
struct L2Work {
  uint32_t units, F, per;
};

struct L2Matvec {
  const float *x;
  uint64_t ldx, ldy;
  uint32_t ncols, K;
  const float *scale, *bias;
  float *y;
  uint16_t *y_bf16;
  uint32_t *count;  /* RB counters (F > 1) */
  float *part;      /* units x 16 x NC partial sums (F > 1) */
  const uint4 *xs;  /* x's B fragments, three parts (l2_xfrag_kernel) */
};

__device__ __forceinline__ void cp_async8(uint32_t saddr, const void *gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(saddr), "l"(gmem));
}
__device__ __forceinline__ void cp_async16(uint32_t saddr, const void *gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(saddr), "l"(gmem));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t *a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

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

/* x's B fragments, once per call: for slot s, column n, lane q the three parts of
 * x[n][32 s + 8q .. 32 s + 8q + 7] (zero from K on) as three uint4 (hi, mid, lo), each b0, b1 of
 * mma step 0 then of step 1, at xs + 3 ((s ncols + n) 4 + q); and the row groups' counters set to
 * zero.  The matvec is launched as its programmatic dependent: it fills its rings while this
 * runs and waits for this grid (griddepcontrol) before it reads xs or the counters. */
__global__ void l2_xfrag_kernel(const float *x, uint64_t ldx, uint32_t K, uint32_t S, uint32_t ncols, uint4 *xs,
                                uint32_t *count, uint32_t RB) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < RB) count[i] = 0;
  if (i < S * ncols * 4) {
    const uint32_t q = i & 3u, sn = i >> 2, s = sn / ncols, n = sn - s * ncols, col = 32 * s + 8 * q;
    const float *xp = x + n * ldx + col;
    float v[8];
    if (col + 8 <= K) {
      const float4 a = __ldg(reinterpret_cast<const float4 *>(xp)), b = __ldg(reinterpret_cast<const float4 *>(xp) + 1);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
#pragma unroll
      for (int k = 0; k < 8; k++) v[k] = col + k < K ? __ldg(xp + k) : 0.f;
    }
    uint32_t p[4][3];
#pragma unroll
    for (int k = 0; k < 4; k++) split3(v[2 * k], v[2 * k + 1], p[k]);
#pragma unroll
    for (int part = 0; part < 3; part++) xs[3 * i + part] = make_uint4(p[0][part], p[1][part], p[2][part], p[3][part]);
  }
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/* A position in a warp's sequence of slots: unit u (row group grp, part; for gather, requested
 * row k = u / F), slot s of the row group (its column block s / 16), the unit's end, and the
 * slot's nibbles and low bytes in global memory. */
struct Cursor {
  uint32_t u, grp, part, s, s_end;
  const uint8_t *nib, *low;
  __device__ __forceinline__ bool open(const L2Geom &g, const L2Work &w, const uint64_t *rows, uint32_t unit) {
    for (;; unit += gridDim.x * (blockDim.x >> 5)) {
      if (unit >= w.units) return false;
      const uint32_t k = unit / w.F;
      part = unit - k * w.F;
      if (!rows) {
        grp = k;
        break;
      }
      const uint64_t R = rows[k];
      if (R < g.M) { /* a row out of range is skipped: its output is left as it was */
        grp = (uint32_t)(R / 16);
        break;
      }
    }
    u = unit;
    const uint32_t cb0 = part * w.per, cb1 = min(cb0 + w.per, g.CB);
    s = 16 * cb0, s_end = cb1 == g.CB ? g.S : 16 * cb1;
    const uint64_t gs = (uint64_t)grp * g.S + s;
    nib = g.nib + gs * 256 + 16 * (threadIdx.x & 15u);
    low = g.low + gs * 512 + 16 * (threadIdx.x & 31u);
    return true;
  }
};

/*
 * Streams a warp's units slot by slot through its ring of kRing shared-memory entries (cp.async,
 * kRing - 1 slots ahead of the decoder; a block's first slot also brings the block's hdr and
 * bases[b]) and calls the sink: slot(cursor, A fragments) for every slot, exception(cursor, row
 * in group, column, weight) for every entry of a block after its last slot, unit_end(cursor)
 * after a unit.  A lane prefetches its first entry of a block when the block starts (most lanes
 * have none or one: real weights have about 0.2 % exceptions).
 */
template <class Sink>
__device__ __forceinline__ void l2_stream(const L2Geom &g, const L2Work &w, const uint64_t *rows,
                                          uint8_t *ring_mem, Sink &sink) {
  const uint32_t lane = threadIdx.x & 31u, r = lane >> 2, q = lane & 3u;
  const uint32_t nwarps = gridDim.x * kL2Warps, first = blockIdx.x * kL2Warps + (threadIdx.x >> 5);
  const uint32_t ring = (uint32_t)__cvta_generic_to_shared(ring_mem);
  Cursor ld, c;
  bool lv = ld.open(g, w, rows, first), cv = lv;
  c = ld;
  auto issue = [&](uint32_t k) {
    const uint32_t dst = ring + k * kEntry;
    cp_async16(dst + kLowOff + 16 * lane, ld.low);
    if (lane < 16) {
      cp_async16(dst + 16 * lane, ld.nib);
    } else if (ld.s % 16 == 0) {
      const uint64_t b = (uint64_t)ld.grp * g.CB + ld.s / 16;
      if (lane < 18) cp_async16(dst + kHdrOff + 16 * (lane - 16), g.hdr + b * 32 + 16 * (lane - 16));
      else if (lane == 18) cp_async8(dst + kBaseOff, g.bases + b);
    }
    ld.nib += 256, ld.low += 512;
    if (++ld.s == ld.s_end) lv = ld.open(g, w, rows, ld.u + nwarps);
  };
#pragma unroll
  for (uint32_t k = 0; k + 1 < kRing; k++) {
    if (lv) issue(k);
    cp_commit();
  }
  /* Launched as a dependent (the matvec, after l2_xfrag_kernel): everything below may read what
   * the grid before wrote.  A no-op otherwise. */
  asm volatile("griddepcontrol.wait;" ::: "memory");
  uint32_t kc = 0, kl = kRing - 1;
  uint32_t ex_n = 0, ex_idx = 0, ex_w = 0;
  const uint8_t *ex_p = nullptr;
  while (cv) {
    cp_wait<kRing - 2>();
    __syncwarp();
    const uint8_t *e = ring_mem + kc * kEntry;
    if (c.s % 16 == 0) { /* a block starts: its exception entries */
      ex_n = e[kHdrOff + lane];
      const uint64_t base = *reinterpret_cast<const uint64_t *>(e + kBaseOff);
      ex_p = g.data + base + 3 * warp_exclusive_sum(ex_n);
      if (ex_n) ex_idx = __ldg(ex_p), ex_w = __ldg(ex_p + 1) | (uint32_t)__ldg(ex_p + 2) << 8;
    }
    uint32_t A[8];
    decode_bf16_slot(*reinterpret_cast<const uint2 *>(e + 8 * lane),
                     *reinterpret_cast<const uint4 *>(e + kLowOff + 16 * lane), g.lut[0], g.lut[1], A);
    sink.slot(c, A);
    if (lv) issue(kl);
    cp_commit();
    kl = kl + 1 == kRing ? 0 : kl + 1;
    kc = kc + 1 == kRing ? 0 : kc + 1;
    const uint32_t next = c.s + 1;
    if (next % 16 == 0 || next == c.s_end) { /* the block ends: apply its entries */
      const uint32_t cb = c.s / 16;
      for (uint32_t k = 0; k < ex_n; k++) {
        if (k) ex_idx = __ldg(ex_p + 3 * k), ex_w = __ldg(ex_p + 3 * k + 1) | (uint32_t)__ldg(ex_p + 3 * k + 2) << 8;
        const uint32_t j = ex_idx & 15u;
        sink.exception(c, frag_row(r, j), NWC_BLOCK_COLS * cb + 32 * (ex_idx >> 4) + frag_col(q, j), ex_w);
      }
    }
    if (next == c.s_end) {
      sink.unit_end(g, w, c);
      cv = c.open(g, w, rows, c.u + nwarps);
    } else {
      c.s = next;
    }
  }
  cp_wait<0>();
}

/* The matvec's sink: mma per slot, exceptions times x on the CUDA cores, the unit's sums out. */
template <int NC>
struct MatvecSink {
  const L2Matvec &a;
  float c0[4], c1[4];   /* two accumulator chains: mma steps h = 0 and h = 1 */
  float s0[NC], s8[NC]; /* exception sums of rows r and r + 8, per column */

  __device__ __forceinline__ explicit MatvecSink(const L2Matvec &args) : a(args) { clear(); }
  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int i = 0; i < 4; i++) c0[i] = c1[i] = 0.f;
#pragma unroll
    for (int n = 0; n < NC; n++) s0[n] = s8[n] = 0.f;
  }

  __device__ __forceinline__ void slot(const Cursor &c, const uint32_t A[8]) {
    const uint32_t lane = threadIdx.x & 31u, r = lane >> 2, q = lane & 3u;
    uint4 p[3] = {}; /* B registers b0, b1 of step 0, b0, b1 of step 1: hi, mid, lo parts */
    if (r < a.ncols) {
      const uint4 *xs = a.xs + 3 * ((c.s * a.ncols + r) * 4 + q);
      p[0] = xs[0], p[1] = xs[1], p[2] = xs[2];
    }
#pragma unroll
    for (int i = 0; i < 3; i++) {
      mma_bf16(c0, A, p[i].x, p[i].y);
      mma_bf16(c1, A + 4, p[i].z, p[i].w);
    }
  }

  __device__ __forceinline__ void exception(const Cursor &, uint32_t row, uint32_t col, uint32_t w) {
    const float wv = bf16_to_f32(w);
    const bool upper = row >= 8;
#pragma unroll
    for (int n = 0; n < NC; n++) {
      if ((uint32_t)n < a.ncols) {
        const float p = wv * __ldg(a.x + n * a.ldx + col);
        s0[n] += upper ? 0.f : p;
        s8[n] += upper ? p : 0.f;
      }
    }
  }

  __device__ __forceinline__ void unit_end(const L2Geom &g, const L2Work &w, const Cursor &cur);

  /* Row R of column n from its sum: scaled, biased, fp32 and/or BF16 (the kernels' one rounding). */
  __device__ __forceinline__ void put(uint32_t R, uint32_t n, float sum) const {
    const float v = sum * (a.scale ? a.scale[R] : 1.f) + (a.bias ? a.bias[R] : 0.f);
    if (a.y) a.y[n * a.ldy + R] = v;
    if (a.y_bf16) a.y_bf16[n * a.ldy + R] = bf16_rne(v);
  }
};

template <int NC>
__device__ __forceinline__ void MatvecSink<NC>::unit_end(const L2Geom &g, const L2Work &w, const Cursor &cur) {
  const uint32_t lane = threadIdx.x & 31u, r = lane >> 2, q = lane & 3u;
  float c[4];
#pragma unroll
  for (int i = 0; i < 4; i++) c[i] = c0[i] + c1[i];
#pragma unroll
  for (int n = 0; n < NC; n++) {
    float t0 = s0[n] + __shfl_xor_sync(0xffffffffu, s0[n], 1);
    float t8 = s8[n] + __shfl_xor_sync(0xffffffffu, s8[n], 1);
    t0 += __shfl_xor_sync(0xffffffffu, t0, 2);
    t8 += __shfl_xor_sync(0xffffffffu, t8, 2);
    if ((uint32_t)n == 2 * q) c[0] += t0, c[2] += t8;
    if ((uint32_t)n == 2 * q + 1) c[1] += t0, c[3] += t8;
  }
  clear();
  const uint32_t R0 = 16 * cur.grp + r;
  if (w.F == 1) { /* the unit is the whole row group: out directly */
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const uint32_t n = 2 * q + (i & 1), R = R0 + 8 * (i >> 1);
      if (n < a.ncols && R < g.M) put(R, n, c[i]);
    }
    return;
  }
  float *p = a.part + (uint64_t)cur.u * 16 * NC;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const uint32_t n = 2 * q + (i & 1);
    if (n < a.ncols) p[(r + 8 * (i >> 1)) * NC + n] = c[i];
  }
  __threadfence();
  __syncwarp();
  uint32_t done = 0;
  if (lane == 0) done = atomicAdd(a.count + cur.grp, 1u) + 1;
  done = __shfl_sync(0xffffffffu, done, 0);
  if (done != w.F) return;
  __threadfence();
  const float *base = a.part + (uint64_t)cur.grp * w.F * 16 * NC;
  for (uint32_t e = lane; e < 16 * a.ncols; e += 32) {
    const uint32_t row = e / a.ncols, n = e - row * a.ncols, R = 16 * cur.grp + row;
    float s = 0.f;
    for (uint32_t k = 0; k < w.F; k++) s += __ldcg(base + ((uint64_t)k * 16 + row) * NC + n);
    if (R < g.M) put(R, n, s);
  }
}

template <int NC>
__global__ void __launch_bounds__(kL2Threads, kL2CtasPerSm) l2_matvec_kernel(L2Geom g, L2Work w, L2Matvec a) {
  extern __shared__ uint4 smem[];
  MatvecSink<NC> sink(a);
  l2_stream(g, w, nullptr, reinterpret_cast<uint8_t *>(smem) + (threadIdx.x >> 5) * kRing * kEntry, sink);
}

/* Dequant's and gather's sink: each slot's two rows of 8 weights per lane as two 16-byte stores
 * (gather: only the requested row, to out + k * K16), then the exceptions' weights over the +0
 * the planes gave them (the same lane, so in program order). */
struct RowsSink {
  uint16_t *out;
  const uint64_t *rows; /* NULL: dequant */
  uint32_t M, K16, F;

  /* Where row `row` of the cursor's group goes, or NULL. */
  __device__ __forceinline__ uint16_t *dst(const Cursor &c, uint32_t row) const {
    if (!rows) return 16 * c.grp + row < M ? out + (uint64_t)(16 * c.grp + row) * K16 : nullptr;
    const uint32_t k = c.u / F;
    return rows[k] % 16 == row ? out + (uint64_t)k * K16 : nullptr;
  }
  __device__ __forceinline__ void slot(const Cursor &c, const uint32_t A[8]) const {
    const uint32_t lane = threadIdx.x & 31u, r = lane >> 2, q = lane & 3u, col = 32 * c.s + 8 * q;
    if (col >= K16) return;
    uint16_t *d0 = dst(c, r), *d8 = dst(c, r + 8);
    if (d0) *reinterpret_cast<uint4 *>(d0 + col) = make_uint4(A[0], A[2], A[4], A[6]);
    if (d8) *reinterpret_cast<uint4 *>(d8 + col) = make_uint4(A[1], A[3], A[5], A[7]);
  }
  __device__ __forceinline__ void exception(const Cursor &c, uint32_t row, uint32_t col, uint32_t w) const {
    uint16_t *d = dst(c, row);
    if (d) d[col] = (uint16_t)w;
  }
  __device__ __forceinline__ void unit_end(const L2Geom &, const L2Work &, const Cursor &) const {}
};

__global__ void __launch_bounds__(kL2Threads, kL2CtasPerSm) l2_rows_kernel(L2Geom g, L2Work w, RowsSink sink) {
  extern __shared__ uint4 smem[];
  l2_stream(g, w, sink.rows, reinterpret_cast<uint8_t *>(smem) + (threadIdx.x >> 5) * kRing * kEntry, sink);
}

/* CTAs for a grid-striding kernel of kL2Threads on sms SMs: enough warps for the units, at most
 * kL2CtasPerSm CTAs per SM. */
unsigned l2_ctas(uint64_t units, int sms) {
  const uint64_t need = (units + kL2Warps - 1) / kL2Warps, most = (uint64_t)sms * kL2CtasPerSm;
  return (unsigned)(need < most ? need : most);
}

/* The matvec's units: row groups cut into F parts (F = 1: whole, no partial sums).  Warps take
 * units in turn, so the time is about ceil(units / warps) units: with at least as many row
 * groups as resident warps F is 1, else the smallest F whose units keep the warps busiest
 * (within 3 % of the best; 19456 x 2560 at F = 3 gave 1.15 units a warp, so two rounds). */
int l2_work(const L2Geom &g, int sms, L2Work *w) {
  const double warps = (double)sms * kL2CtasPerSm * kL2Warps;
  if (g.RB >= warps) {
    w->per = g.CB, w->F = 1, w->units = g.RB;
    return 0;
  }
  double best = 0;
  for (uint32_t pass = 0; pass < 2; pass++)
    for (uint32_t f = 1; f <= g.CB; f++) {
      const uint32_t per = (g.CB + f - 1) / f, F = (g.CB + per - 1) / per;
      if (F != f) continue;
      const double units = (double)g.RB * F, busy = units / (ceil(units / warps) * warps);
      if (pass == 0 && busy > best) best = busy;
      if (pass == 1 && busy >= 0.97 * best) {
        w->per = per, w->F = F, w->units = g.RB * F;
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
  if (NWC_ELEM_LAYOUT(t->elem) != 2 || NWC_ELEM_TYPE(t->elem) != NWC_ELEM_BF16) return -ENOTSUP;
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
  return 0;
}

/* Scratch: the counters (RB words, to 16 bytes), the partial sums (units x 16 x NC floats), x's
 * B fragments (S x NC x 4 lanes x 48 bytes). */
struct L2Scratch {
  uint64_t part, xs, total;
  L2Scratch(const L2Geom &g, const L2Work &w, unsigned nc) {
    part = ((uint64_t)g.RB * 4 + 15) / 16 * 16;
    xs = part + (uint64_t)w.units * 16 * nc * 4;
    total = xs + (uint64_t)g.S * nc * 4 * 48;
  }
};

static unsigned round_cols(unsigned ncols) { return ncols <= 1 ? 1 : ncols <= 2 ? 2 : ncols <= 4 ? 4 : 8; }

int64_t l2_scratch_bytes(const L2Geom &g, unsigned ncols) {
  L2Work w;
  int rc = sm_count();
  if (rc >= 0) rc = l2_work(g, rc, &w);
  if (rc < 0) return rc;
  return (int64_t)L2Scratch(g, w, round_cols(ncols)).total;
}

template <int NC>
static int launch_l2_matvec(const L2Geom &g, const L2Work &w, unsigned ctas, const L2Matvec &a,
                            cudaStream_t stream) {
  int rc;
  if ((rc = cuda_status(cudaFuncSetAttribute(l2_matvec_kernel<NC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             kL2Smem))) < 0)
    return rc;
  const uint32_t threads = max(g.S * a.ncols * 4, g.RB);
  l2_xfrag_kernel<<<(threads + 255) / 256, 256, 0, stream>>>(a.x, a.ldx, g.K, g.S, a.ncols,
                                                              const_cast<uint4 *>(a.xs), a.count, g.RB);
  if ((rc = launch_status()) < 0) return rc;
  cudaLaunchAttribute pdl[1];
  pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(ctas), cfg.blockDim = dim3(kL2Threads), cfg.dynamicSmemBytes = kL2Smem, cfg.stream = stream;
  cfg.attrs = pdl, cfg.numAttrs = 1;
  if ((rc = cuda_status(cudaLaunchKernelEx(&cfg, l2_matvec_kernel<NC>, g, w, a))) < 0) return rc;
  return launch_status();
}

int l2_matvec(const nwc_k_tensor *t, const float *x, unsigned ncols, uint64_t ldx, const float *bias,
              float *y, uint16_t *y_bf16, uint64_t ldy, void *scratch, cudaStream_t stream) {
  L2Geom g;
  int rc = l2_geom_of(t, &g);
  if (rc < 0) return rc;
  if (!x || !scratch || (!y && !y_bf16) || ncols < 1 || ncols > 8) return -EINVAL;
  if ((uintptr_t)x % 16 || (ncols > 1 && (ldx < g.K || ldx % 4)) || (ncols > 1 && ldy < g.M) ||
      (uintptr_t)scratch % 16)
    return -EINVAL;
  L2Work w;
  const int sms = sm_count();
  if (sms < 0) return sms;
  if ((rc = l2_work(g, sms, &w)) < 0) return rc;
  const unsigned ctas = l2_ctas(w.units, sms);
  L2Matvec a;
  a.x = x, a.ldx = ldx, a.ldy = ldy, a.ncols = ncols, a.K = g.K, a.scale = t->scale, a.bias = bias;
  a.y = y, a.y_bf16 = y_bf16;
  const L2Scratch sc(g, w, round_cols(ncols));
  a.count = static_cast<uint32_t *>(scratch);
  a.part = reinterpret_cast<float *>(static_cast<uint8_t *>(scratch) + sc.part);
  a.xs = reinterpret_cast<const uint4 *>(static_cast<uint8_t *>(scratch) + sc.xs);
  if (ncols == 1) return launch_l2_matvec<1>(g, w, ctas, a, stream);
  if (ncols == 2) return launch_l2_matvec<2>(g, w, ctas, a, stream);
  if (ncols <= 4) return launch_l2_matvec<4>(g, w, ctas, a, stream);
  return launch_l2_matvec<8>(g, w, ctas, a, stream);
}

int l2_rows(const nwc_k_tensor *t, const uint64_t *rows, uint64_t n, uint16_t *out, cudaStream_t stream) {
  L2Geom g;
  int rc = l2_geom_of(t, &g);
  if (rc < 0) return rc;
  if (!out || (uintptr_t)out % 16) return -EINVAL;
  if (rows && n == 0) return 0;
  const uint64_t units = (rows ? n : g.RB) * g.CB; /* a unit per block (and requested row) */
  if (units >= (UINT64_C(1) << 31)) return -EOVERFLOW;
  L2Work w{(uint32_t)units, g.CB, 1};
  RowsSink sink{out, rows, g.M, g.K16, g.CB};
  const int sms = sm_count();
  if (sms < 0) return sms;
  const unsigned ctas = l2_ctas(w.units, sms);
  if ((rc = cuda_status(cudaFuncSetAttribute(l2_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             kL2Smem))) < 0)
    return rc;
  l2_rows_kernel<<<ctas, kL2Threads, kL2Smem, stream>>>(g, w, sink);
  return launch_status();
}

} /* namespace nwc_k */
