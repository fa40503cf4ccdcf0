/*
 * layout2.cuh - layout 2 (docs/format-layouts.md §2, §4) as the kernels see it: the geometry, the
 * slot decoder that turns a lane's nibbles and low bytes into mma.m16n8k16 A fragments, and the
 * walk over a lane's exception entries, and the PDL wait the kernels use.  Device code shared by
 * layout2.cu's kernels (and bench/nwc_stream_bench.cu).
 *
 * A slot is 16 rows x 32 columns of one row group; lane L (r = L >> 2, q = L & 3) owns its weights
 * j = 8h + 2a + e at row r + 8 (a & 1), column 8q + 4h + 2 (a >> 1) + e, which is exactly the
 * A operand of two mma.m16n8k16 (h = 0, 1), register a, half e, once the tensor's columns are
 * renamed so that logical k = 2q + 8 (a >> 1) + e of step h is column 8q + 4h + 2 (a >> 1) + e.
 * The B operand follows the same renaming: lane (n = r, q) holds x[n][8q + 4h .. 8q + 4h + 3] in
 * its two B registers of step h, one contiguous float4 per step.
 *
 * Decoding a BF16 slot (8 nibble bytes, 16 low bytes per lane) is all byte permutes: the high
 * byte of 4 weights is one prmt of the nibbles (rank in bits 0..2) into the lut psym[0..7], their
 * signs one prmt that lines the nibbles' bit 3 up with the bytes' bit 7, one lop3 merges them,
 * and two prmts interleave high and low bytes into BF16 pairs (an fp8 slot's low bytes are made
 * first from its mantissa fields, fp8_low).  An exception's nibble (0x7)
 * decodes to +0; its entry adds the true weight (the matvec on the CUDA cores, dequant by a
 * store), so the planes never need patching.
 *
 * Bounds: a slot's reads are inside the raw area (validated size); exception entries are read
 * from [bases[b], bases[b] + E * N(b)), inside data; what the kernels trust is in docs/kernels.md.
 */
#ifndef NWC_LAYOUT2_CUH
#define NWC_LAYOUT2_CUH

#include "nwc_kernels.h"
#include "warp.cuh"

#include <stdint.h>

namespace nwc_k {

/* The tensor as layout 2's kernels see it (device pointers; 32-bit counts checked by the host). */
struct L2Geom {
  const uint64_t *bases;
  const uint8_t *hdr;
  const uint8_t *data;
  const uint8_t *nib; /* the nibble plane: 256 bytes per (row group, slot) */
  const uint8_t *low; /* the low plane right behind it: BF16 512 bytes per slot, fp8 384 per pair */
  uint32_t lut[4];    /* psym as words: lut[0..1] high bytes of ranks 0..7, lut[2..3] fp8 bit 7 */
  uint32_t M, K, K16, CB, S, RB;
  uint32_t P; /* pairs of slots per row group (fp8's low plane), ceil(S / 2) */
  bool fp8;   /* the element type: fp8 (e4m3, per-row scale) or BF16 */
};

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

/* The 8 A registers of one BF16 slot: A[4h + a] = weights 8h + 2a (low half), 8h + 2a + 1.
 * Per 4 weights (nibbles k = 0..3, 16 bits): the magnitude bytes psym[rank] are one prmt of the
 * rank bits; the sign of nibble k (bit 4k + 3) reaches bit 8k + 7 through one prmt that takes
 * byte 0, 1 of (n << 4) and of n alternately (selector 0x5140; 0x7362 for nibbles 4..7). */
__device__ __forceinline__ void decode_bf16_slot(uint2 nib, uint4 low, uint32_t lut0, uint32_t lut1,
                                                 uint32_t A[8]) {
  const uint32_t n[2] = {nib.x, nib.y}, lo[4] = {low.x, low.y, low.z, low.w};
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const uint32_t m = n[h] & 0x77777777u, n4 = n[h] << 4;
    const uint32_t h0 = prmt(lut0, lut1, m) | (prmt(n4, n[h], 0x5140u) & 0x80808080u);
    const uint32_t h1 = prmt(lut0, lut1, m >> 16) | (prmt(n4, n[h], 0x7362u) & 0x80808080u);
    A[4 * h + 0] = prmt(lo[2 * h], h0, 0x5140u);
    A[4 * h + 1] = prmt(lo[2 * h], h0, 0x7362u);
    A[4 * h + 2] = prmt(lo[2 * h + 1], h1, 0x5140u);
    A[4 * h + 3] = prmt(lo[2 * h + 1], h1, 0x7362u);
  }
}

/* c += A B for one mma.m16n8k16 step: A the lane's 4 registers of a slot half, b0 b1 its B. */
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t *a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The low bytes of an fp8 slot's 16 weights as decode_bf16_slot takes them (word i: weights 4 i ..
 * 4 i + 3): the mantissa field m of weight j (bits 3 j .. 3 j + 2 of f, the slot's 48 bits of its
 * pair's fields) at bits 4..6 and bit 7 of the symbol E (psym[8 + rank], lut2 lut3) at bit 7. */
__device__ __forceinline__ uint4 fp8_low(uint2 nib, uint64_t f, uint32_t lut2, uint32_t lut3) {
  const uint32_t n[2] = {nib.x, nib.y};
  uint32_t lo[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const uint32_t t = (uint32_t)(f >> (12 * i)) & 0xfffu; /* fields of weights 4 i .. 4 i + 3 */
    const uint32_t m = ((t & 7u) | (t & 0x38u) << 5 | (t & 0x1c0u) << 10 | (t & 0xe00u) << 15) << 4;
    const uint32_t ranks = (n[i >> 1] >> (16 * (i & 1))) & 0x7777u;
    lo[i] = m | prmt(lut2, lut3, ranks);
  }
  return make_uint4(lo[0], lo[1], lo[2], lo[3]);
}

/* An fp8 byte (e4m3, not NaN) as the BF16 bits of the same value. */
__device__ __forceinline__ uint32_t fp8_to_bf16_bits(uint32_t v) {
  const uint32_t s = (v & 0x80u) << 8, e = (v >> 3) & 15u, m = v & 7u;
  if (e) return s | (e + 120u) << 7 | m << 4;
  if (!m) return s;
  const uint32_t p = 31 - __clz(m); /* a subnormal m 2^-9: the leading one of m is bit p */
  return s | (118u + p) << 7 | ((m << (7 - p)) & 0x7fu);
}

/* Where weight j of lane (r, q) lies inside its slot: row 0..15, column 0..31. */
__device__ __forceinline__ uint32_t frag_row(uint32_t r, uint32_t j) { return r + 8 * ((j >> 1) & 1); }
__device__ __forceinline__ uint32_t frag_col(uint32_t q, uint32_t j) {
  return 8 * q + 4 * (j >> 3) + 2 * ((j >> 2) & 1) + (j & 1);
}

/* griddepcontrol.wait (the kernels are PDL dependents) once `token` is known.  ptxas moves loads issued before the wait
 * (ld.global.nc, which it may reorder with the wait) to after it, where their latency follows the
 * kernel before instead of overlapping it (seen in the SASS: the prologue's loads after ACQBULK);
 * the wait predicated on a value made of their results, both ways so that it always runs, stays
 * behind them. */
__device__ __forceinline__ void grid_wait_after(uint32_t token) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %0, 0;\n\t@p griddepcontrol.wait;\n\t@!p griddepcontrol.wait;\n\t}"
      ::"r"(token)
      : "memory");
}

/* bf16 bits (low half of a word) to fp32. */
__device__ __forceinline__ float bf16_to_f32(uint32_t h) { return __uint_as_float(h << 16); }

/* The host side of layout2.cu, called by the nwc_k_* entries: checks and geometry of a layout-2
 * tensor (-ENOTSUP for another layout or type), scratch size, the matvec (1..8 columns of fp32 or
 * BF16 x), dequant (rows == NULL) or gather, and dequant of a range of rows. */
int l2_geom_of(const nwc_k_tensor *t, L2Geom *g);
int64_t l2_scratch_bytes(const L2Geom &g, unsigned ncols);
int l2_matvec(const nwc_k_tensor *t, const void *x, bool bf16_x, unsigned ncols, uint64_t ldx, const float *bias,
              float *y, uint16_t *y_bf16, uint64_t ldy, void *scratch, cudaStream_t stream);
int l2_rows(const nwc_k_tensor *t, const uint64_t *rows, uint64_t n, uint16_t *out, cudaStream_t stream);
/* Rows [row0, row0 + nrows) row-major at out (row stride K16); row0 a multiple of 16. */
int l2_dequant_rows(const nwc_k_tensor *t, uint64_t row0, uint64_t nrows, uint16_t *out, cudaStream_t stream);

} /* namespace nwc_k */

#endif /* NWC_LAYOUT2_CUH */
