/*
 * l1_decode_host.cu - layout 1's GPU decode run on the CPU, for test_l1_decode.c: the functions a
 * lane of kernels/layout1.cuh runs (l1_plan and l1_lane_words for where its block's streams are
 * read, Lane::start, l1_decode_slot per slot) are __host__ __device__, and this file runs them for
 * every lane of every block exactly as L1Source does, with the stream buffer of the given size,
 * and writes each slot's A registers where the format puts them (docs/format-layouts.md §2).
 */
#include "layout1.cuh"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

extern "C" int nwc_test_l1_decode(const nwc_tensor *t, uint32_t cap, uint16_t *out);

/* Decodes t (layout 1) into out (rows x K16, row-major) as the kernels' lanes do, block by block
 * with stream buffers of cap bytes (cap 0: every block read from data); -EFAULT when a lane would
 * read past the stream buffer or data, -ENOMEM, -EINVAL for another layout. */
extern "C" int nwc_test_l1_decode(const nwc_tensor *t, uint32_t cap, uint16_t *out) {
  using namespace nwc_k;
  if (NWC_ELEM_LAYOUT(t->elem) != 1) return -EINVAL;
  const bool fp8 = NWC_ELEM_TYPE(t->elem) == NWC_ELEM_FP8;
  uint32_t tab[NWC_TAB_ENTRIES];
  int rc = nwc_build_tab(t->psym, t->elem, tab);
  if (rc < 0) return rc;
  const uint64_t M = t->rows, K16 = (t->cols + 15) / 16 * 16, CB = (t->cols + 511) / 512;
  const uint64_t nl = (K16 - 512 * (CB - 1)) / 16, S = 16 * (CB - 1) + (nl + 1) / 2, E = fp8 ? 8 : 16;
  uint8_t *buf = static_cast<uint8_t *>(aligned_alloc(16, cap ? cap : 16));
  if (!buf) return -ENOMEM;
  for (uint64_t b = 0; b < t->nblocks && rc == 0; b++) {
    const uint64_t g = b / CB, cb = b % CB, nsc = cb + 1 < CB ? 16 : (nl + 1) / 2;
    const uint64_t base = t->bases[b], end = t->bases[b + 1];
    const L1Plan p = l1_plan(base, end, cap, b + 1 == t->nblocks);
    if (p.staged) memcpy(buf, t->data + p.s16, p.copy); /* the warp's cp.async copies */
    const uint8_t *limit = p.staged ? buf + p.copy : t->data + t->data_bytes;
    uint32_t unit = 0;
    for (unsigned L = 0; L < NWC_LANES; unit += t->hdr[b * NWC_LANES + L], L++) {
      Lane st;
      st.start(l1_lane_words(p, buf, t->data, base, unit), 0);
      const unsigned r = L >> 2, q = L & 3;
      for (uint64_t sc = 0; sc < nsc; sc++) {
        const uint64_t s = 16 * cb + sc;
        uint32_t A[8];
        if (fp8) l1_decode_slot<true>(st, tab, t->raw + ((g * S + s) * NWC_LANES + L) * E, A);
        else l1_decode_slot<false>(st, tab, t->raw + ((g * S + s) * NWC_LANES + L) * E, A);
        for (unsigned j = 0; j < 16; j++) { /* A[j / 2], half j % 2: weight j of the fragment */
          const uint64_t row = 16 * g + r + 8 * ((j >> 1) & 1);
          const uint64_t col = 32 * s + 8 * q + 4 * (j >> 3) + 2 * ((j >> 2) & 1) + (j & 1);
          if (row < M && col < K16) out[row * K16 + col] = (uint16_t)(A[j >> 1] >> (16 * (j & 1)));
        }
      }
      /* st.p is the word after the last one the lane loaded */
      if (reinterpret_cast<const uint8_t *>(st.p) > limit) rc = -EFAULT;
    }
  }
  free(buf);
  return rc;
}
