/*
 * layout2_simd.c - the x86-64 SIMD kernels of the CPU decoders, compiled per function for their
 * instruction set (the rest of the library stays baseline x86-64) and chosen at run time by
 * nwc__cpu_level():
 *
 *   layout-2 tile decoders (SSSE3: one lane per step, AVX2: two): the 16 nibbles of a lane are
 *   split into low/high halves and reordered with one pshufb so that weights for tile row r come
 *   first and those of row r + 8 second; pshufb of the rank (nibble & 7) into psym[0..7] gives the
 *   high bytes, the nibble's bit 3 shifted to bit 7 the sign; the low bytes are the raw plane's
 *   16 bytes put in the same order (fp8: the 3-bit mantissa fields, spread to bytes with pdep,
 *   shifted left by 4, plus psym[8 + rank]); unpacking low/high bytes yields the BF16 patterns of
 *   8 columns of row r and 8 of row r + 8.
 *
 *   the AVX2+FMA multiply-accumulate kernel of the (batched) matvec.
 *
 * The portable C versions (layout2_decode.c, matvec_batch.c) define the results; these must
 * match them bit for bit for the tiles (tests run both).
 */
#include "decode_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* Nibble j of a lane sits in byte j >> 1 (low half for even j).  After splitting the 8 bytes into
 * [low nibbles | high nibbles], K_IDX picks them in the order k = 0..15 of PERM, where PERM lists
 * j for tile row r (columns +0,+1,+2,+3 of h = 0, then of h = 1) and then for row r + 8. */
#define PERM_BYTES 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15
#define K_IDX_BYTES 0, 8, 2, 10, 4, 12, 6, 14, 1, 9, 3, 11, 5, 13, 7, 15

#define FIELDS_MASK UINT64_C(0x0707070707070707)

__attribute__((target("ssse3"))) static inline __m128i sse_nibbles(const uint8_t *nb) {
  const __m128i m0f = _mm_set1_epi8(0x0f), kidx = _mm_setr_epi8(K_IDX_BYTES);
  __m128i v = _mm_loadl_epi64((const __m128i *)nb);
  __m128i lo = _mm_and_si128(v, m0f), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m0f);
  return _mm_shuffle_epi8(_mm_unpacklo_epi64(lo, hi), kidx);
}

__attribute__((target("ssse3"))) static void tile_ssse3(const nwc__lgeom *lg, const uint8_t *raw,
                                                         const uint8_t lut[16], uint64_t gr,
                                                         uint64_t s, unsigned nlanes, uint16_t *dst,
                                                         size_t stride) {
  const int bf16 = lg->g.type == NWC_ELEM_BF16;
  const __m128i lutv = _mm_loadu_si128((const __m128i *)lut), lut_b7 = _mm_srli_si128(lutv, 8);
  const __m128i perm = _mm_setr_epi8(PERM_BYTES), m07 = _mm_set1_epi8(7),
                m80 = _mm_set1_epi8((char)0x80);
  uint64_t ls0 = (gr * lg->slots + s) * NWC_LANES;
  const uint8_t *nb = raw + ls0 * 8, *low = raw + lg->nib_bytes + ls0 * 16;
  const uint8_t *pair = raw + lg->nib_bytes +
                        (gr * nwc__ceil_div(lg->slots, 2) + (s >> 1)) * 3 * NWC_LANES * 4;
  for (unsigned L = 0; L < nlanes; L++) {
    __m128i nk = sse_nibbles(nb + 8 * L), r = _mm_and_si128(nk, m07);
    __m128i hi = _mm_or_si128(_mm_shuffle_epi8(lutv, r), _mm_and_si128(_mm_slli_epi16(nk, 4), m80));
    __m128i lo;
    if (bf16) {
      lo = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(low + 16 * L)), perm);
    } else {
      uint64_t f = nwc__l2_fp8_fields48(pair, L, (unsigned)(s & 1));
      uint8_t m[16];
      for (unsigned j = 0; j < 16; j++) m[j] = (uint8_t)((f >> 3 * j) & 7u);
      lo = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)m), perm);
      lo = _mm_or_si128(_mm_slli_epi16(lo, 4), _mm_shuffle_epi8(lut_b7, r));
    }
    uint16_t *o = dst + (L >> 2) * stride + 8 * (L & 3);
    _mm_storeu_si128((__m128i *)o, _mm_unpacklo_epi8(lo, hi));
    _mm_storeu_si128((__m128i *)(o + 8 * stride), _mm_unpackhi_epi8(lo, hi));
  }
}

__attribute__((target("avx2,bmi2"))) static void tile_avx2(const nwc__lgeom *lg, const uint8_t *raw,
                                                            const uint8_t lut[16], uint64_t gr,
                                                            uint64_t s, unsigned nlanes,
                                                            uint16_t *dst, size_t stride) {
  const int bf16 = lg->g.type == NWC_ELEM_BF16;
  const __m128i lut128 = _mm_loadu_si128((const __m128i *)lut);
  const __m256i lutv = _mm256_broadcastsi128_si256(lut128),
                lut_b7 = _mm256_broadcastsi128_si256(_mm_srli_si128(lut128, 8));
  const __m256i perm = _mm256_setr_epi8(PERM_BYTES, PERM_BYTES),
                kidx = _mm256_setr_epi8(K_IDX_BYTES, K_IDX_BYTES), m0f = _mm256_set1_epi8(0x0f),
                m07 = _mm256_set1_epi8(7), m80 = _mm256_set1_epi8((char)0x80);
  uint64_t ls0 = (gr * lg->slots + s) * NWC_LANES;
  const uint8_t *nb = raw + ls0 * 8, *low = raw + lg->nib_bytes + ls0 * 16;
  const uint8_t *pair = raw + lg->nib_bytes +
                        (gr * nwc__ceil_div(lg->slots, 2) + (s >> 1)) * 3 * NWC_LANES * 4;
  for (unsigned L = 0; L < nlanes; L += 2) { /* lanes L, L + 1: adjacent columns, same rows */
    __m256i v = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(nb + 8 * L)));
    v = _mm256_permute4x64_epi64(v, 0x50); /* lane L's 8 bytes low, lane L + 1's high */
    __m256i nlo = _mm256_and_si256(v, m0f), nhi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f);
    __m256i nk = _mm256_shuffle_epi8(_mm256_unpacklo_epi64(nlo, nhi), kidx);
    __m256i r = _mm256_and_si256(nk, m07);
    __m256i hi = _mm256_or_si256(_mm256_shuffle_epi8(lutv, r),
                                 _mm256_and_si256(_mm256_slli_epi16(nk, 4), m80));
    __m256i lo;
    if (bf16) {
      lo = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(low + 16 * L)), perm);
    } else {
      uint64_t f0 = nwc__l2_fp8_fields48(pair, L, (unsigned)(s & 1));
      uint64_t f1 = nwc__l2_fp8_fields48(pair, L + 1, (unsigned)(s & 1));
      __m256i m = _mm256_setr_epi64x((long long)_pdep_u64(f0, FIELDS_MASK),
                                     (long long)_pdep_u64(f0 >> 24, FIELDS_MASK),
                                     (long long)_pdep_u64(f1, FIELDS_MASK),
                                     (long long)_pdep_u64(f1 >> 24, FIELDS_MASK));
      lo = _mm256_or_si256(_mm256_slli_epi16(_mm256_shuffle_epi8(m, perm), 4),
                           _mm256_shuffle_epi8(lut_b7, r));
    }
    uint16_t *o = dst + (L >> 2) * stride + 8 * (L & 3);
    _mm256_storeu_si256((__m256i *)o, _mm256_unpacklo_epi8(lo, hi));
    _mm256_storeu_si256((__m256i *)(o + 8 * stride), _mm256_unpackhi_epi8(lo, hi));
  }
}

nwc__l2_tile_fn nwc__l2_tile_simd(unsigned type, int level) {
  (void)type;
  if (level >= NWC__CPU_AVX2) return tile_avx2;
  if (level >= NWC__CPU_SSSE3) return tile_ssse3;
  return NULL;
}

/* ---- matvec kernel ----------------------------------------------------------------------- */

/* One row of w against NC columns: NC * A accumulators stay in registers over the whole row (A
 * interleaved sets for small NC, so that the FMA latency is covered); n is a multiple of 8 A. */
__attribute__((target("avx2,fma"), always_inline)) static inline void
fma_row(const uint16_t *w, unsigned n, const float *x, size_t ldx, const unsigned NC,
        const unsigned A, float *part) {
  __m256 acc[8];
  for (unsigned a = 0; a < NC * A; a++) acc[a] = _mm256_setzero_ps();
  for (unsigned k = 0; k < n; k += 8 * A)
    for (unsigned a = 0; a < A; a++) {
      __m128i h = _mm_loadu_si128((const __m128i *)(w + k + 8 * a));
      __m256 wv = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      for (unsigned c = 0; c < NC; c++)
        acc[a * NC + c] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + c * ldx + k + 8 * a), acc[a * NC + c]);
    }
  for (unsigned c = 0; c < NC; c++) {
    __m256 sum = acc[c];
    for (unsigned a = 1; a < A; a++) sum = _mm256_add_ps(sum, acc[a * NC + c]);
    float *p = part + c * 8;
    _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), sum));
  }
}

/* Two rows of w against NC <= 4 columns: each x load serves both rows (2 NC A accumulators). */
__attribute__((target("avx2,fma"), always_inline)) static inline void
fma_row2(const uint16_t *w, size_t wstride, unsigned n, const float *x, size_t ldx,
         const unsigned NC, const unsigned A, float *part) {
  __m256 acc0[8], acc1[8];
  for (unsigned a = 0; a < NC * A; a++) acc0[a] = acc1[a] = _mm256_setzero_ps();
  for (unsigned k = 0; k < n; k += 8 * A)
    for (unsigned a = 0; a < A; a++) {
      __m128i h0 = _mm_loadu_si128((const __m128i *)(w + k + 8 * a));
      __m128i h1 = _mm_loadu_si128((const __m128i *)(w + wstride + k + 8 * a));
      __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h0), 16));
      __m256 w1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h1), 16));
      for (unsigned c = 0; c < NC; c++) {
        __m256 xv = _mm256_loadu_ps(x + c * ldx + k + 8 * a);
        acc0[a * NC + c] = _mm256_fmadd_ps(w0, xv, acc0[a * NC + c]);
        acc1[a * NC + c] = _mm256_fmadd_ps(w1, xv, acc1[a * NC + c]);
      }
    }
  for (unsigned c = 0; c < NC; c++) {
    __m256 s0 = acc0[c], s1 = acc1[c];
    for (unsigned a = 1; a < A; a++) {
      s0 = _mm256_add_ps(s0, acc0[a * NC + c]);
      s1 = _mm256_add_ps(s1, acc1[a * NC + c]);
    }
    float *p0 = part + c * 8, *p1 = part + 64 + c * 8;
    _mm256_storeu_ps(p0, _mm256_add_ps(_mm256_loadu_ps(p0), s0));
    _mm256_storeu_ps(p1, _mm256_add_ps(_mm256_loadu_ps(p1), s1));
  }
}

/* Rows in pairs (the last one alone), columns in passes of at most 4; A sets as n allows. */
#define FMA_PASS(NC, A2, A1, c0)                                                                \
  do {                                                                                          \
    unsigned i = 0;                                                                             \
    for (; i + 1 < nrows; i += 2)                                                               \
      fma_row2(w + i * wstride, wstride, n, x + (c0) * ldx, ldx, NC, A2, part + i * 64 + (c0) * 8); \
    if (i < nrows) fma_row(w + i * wstride, n, x + (c0) * ldx, ldx, NC, A1, part + i * 64 + (c0) * 8); \
  } while (0)

__attribute__((target("avx2,fma"))) static void fma_avx2(const uint16_t *w, size_t wstride,
                                                          unsigned nrows, unsigned n,
                                                          const float *x, size_t ldx,
                                                          unsigned ncols, float *part) {
  if (n % 32) { /* a layout-0 row of an odd number of lanes: n / 8 is even */
    switch (ncols) {
    case 1: FMA_PASS(1, 2, 2, 0); break;
    case 2: FMA_PASS(2, 2, 2, 0); break;
    case 3: FMA_PASS(3, 1, 2, 0); break;
    case 4: FMA_PASS(4, 1, 2, 0); break;
    default:
      FMA_PASS(4, 1, 2, 0);
      switch (ncols) {
      case 5: FMA_PASS(1, 2, 2, 4); break;
      case 6: FMA_PASS(2, 2, 2, 4); break;
      case 7: FMA_PASS(3, 1, 2, 4); break;
      default: FMA_PASS(4, 1, 2, 4);
      }
    }
    return;
  }
  switch (ncols) {
  case 1: FMA_PASS(1, 4, 4, 0); break;
  case 2: FMA_PASS(2, 2, 4, 0); break;
  case 3: FMA_PASS(3, 1, 2, 0); break;
  case 4: FMA_PASS(4, 1, 2, 0); break;
  default:
    FMA_PASS(4, 1, 2, 0);
    switch (ncols) {
    case 5: FMA_PASS(1, 4, 4, 4); break;
    case 6: FMA_PASS(2, 2, 4, 4); break;
    case 7: FMA_PASS(3, 1, 2, 4); break;
    default: FMA_PASS(4, 1, 2, 4);
    }
  }
}

/* AVX-512: R (1 or 2) rows of w against NC <= 8 columns, 16 weights per FMA; R NC A <= 16
 * accumulators in the 32 zmm registers, n a multiple of 16 A. */
__attribute__((target("avx512f"), always_inline)) static inline void
fma512_rows(const uint16_t *w, size_t wstride, unsigned n, const float *x, size_t ldx,
            const unsigned R, const unsigned NC, const unsigned A, float *part) {
  __m512 acc[2][16];
  for (unsigned r = 0; r < R; r++)
    for (unsigned a = 0; a < NC * A; a++) acc[r][a] = _mm512_setzero_ps();
  for (unsigned k = 0; k < n; k += 16 * A)
    for (unsigned a = 0; a < A; a++) {
      __m512 wv[2];
      for (unsigned r = 0; r < R; r++) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(w + r * wstride + k + 16 * a));
        wv[r] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      }
      for (unsigned c = 0; c < NC; c++) {
        __m512 xv = _mm512_loadu_ps(x + c * ldx + k + 16 * a);
        for (unsigned r = 0; r < R; r++)
          acc[r][a * NC + c] = _mm512_fmadd_ps(wv[r], xv, acc[r][a * NC + c]);
      }
    }
  for (unsigned r = 0; r < R; r++)
    for (unsigned c = 0; c < NC; c++) {
      __m512 sum = acc[r][c];
      for (unsigned a = 1; a < A; a++) sum = _mm512_add_ps(sum, acc[r][a * NC + c]);
      /* fold 16 lanes to the 8 partial sums of the interface: lane e + lane e + 8 */
      __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(sum), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sum), 1)));
      float *p = part + r * 64 + c * 8;
      _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), s8));
    }
}

#define FMA512(NC, A)                                                                           \
  do {                                                                                          \
    unsigned i = 0;                                                                             \
    for (; i + 1 < nrows; i += 2) fma512_rows(w + i * wstride, wstride, n, x, ldx, 2, NC, A, part + i * 64); \
    if (i < nrows) fma512_rows(w + i * wstride, wstride, n, x, ldx, 1, NC, A, part + i * 64);   \
  } while (0)

__attribute__((target("avx512f"))) static void fma_avx512(const uint16_t *w,
                                                                    size_t wstride, unsigned nrows,
                                                                    unsigned n, const float *x,
                                                                    size_t ldx, unsigned ncols,
                                                                    float *part) {
  int wide = n % 64 == 0; /* room for interleaved sets (tiles); layout-0 rows: n % 16 only */
  switch (ncols) {
  case 1:
    if (wide) FMA512(1, 4);
    else FMA512(1, 1);
    break;
  case 2:
    if (wide) FMA512(2, 4);
    else FMA512(2, 1);
    break;
  case 3: FMA512(3, 1); break;
  case 4: FMA512(4, 1); break;
  case 5: FMA512(5, 1); break;
  case 6: FMA512(6, 1); break;
  case 7: FMA512(7, 1); break;
  default: FMA512(8, 1);
  }
}

nwc__fma_fn nwc__fma_simd(int level) {
  return level >= NWC__CPU_AVX512 ? fma_avx512 : level >= NWC__CPU_AVX2 ? fma_avx2 : NULL;
}

#else /* no x86-64 SIMD */

nwc__l2_tile_fn nwc__l2_tile_simd(unsigned type, int level) {
  (void)type, (void)level;
  return NULL;
}
nwc__fma_fn nwc__fma_simd(int level) {
  (void)level;
  return NULL;
}

#endif
