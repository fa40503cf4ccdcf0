/*
 * decode_api.c - the decoders' public entry points (nwc.h): nwc_dequant, nwc_dequant_range,
 * nwc_gather and nwc_matvec hand a layout-0 tensor to the layout-0 decoder (decode.c) and a
 * layout-1/2 tensor to the tile decoders (lx_decode.c; the matvec to matvec_batch.c).  The
 * callees check the tensor and the arguments; a NULL tensor goes to the layout-0 decoder, which
 * rejects it.
 */
#include "decode_internal.h"

int nwc_dequant_range(const nwc_tensor *t, uint64_t rb_begin, uint64_t rb_end, uint16_t *out) {
  if (t && NWC_ELEM_LAYOUT(t->elem)) return nwc__lx_dequant_range(t, rb_begin, rb_end, out);
  return nwc__l0_dequant_range(t, rb_begin, rb_end, out);
}

int nwc_dequant(const nwc_tensor *t, uint16_t *out) {
  if (t && NWC_ELEM_LAYOUT(t->elem))
    return nwc__lx_dequant_range(t, 0, nwc__ceil_div(t->rows, NWC__LX_BLOCK_ROWS), out);
  return nwc__l0_dequant_range(t, 0, t ? nwc__ceil_div(t->rows, NWC_BLOCK_ROWS) : 0, out);
}

int nwc_gather(const nwc_tensor *t, const uint64_t *rows, uint64_t n, uint16_t *out) {
  if (t && NWC_ELEM_LAYOUT(t->elem)) return nwc__lx_gather(t, rows, n, out);
  return nwc__l0_gather(t, rows, n, out);
}

int nwc_matvec(const nwc_tensor *t, const float *x, const float *bias, float *y,
               uint16_t *y_bf16) {
  if (t && NWC_ELEM_LAYOUT(t->elem)) return nwc__lx_matvec(t, x, bias, y, y_bf16);
  return nwc__l0_matvec(t, x, bias, y, y_bf16);
}
