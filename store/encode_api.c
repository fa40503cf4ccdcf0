/*
 * encode_api.c - the encoder's public entry points (nwc.h): nwc_encode and nwc_tensor_encode
 * hand layout 0 to the layout-0 encoder (encode.c) and layouts 1 and 2 to lx_encode.c.  The
 * callees check the input and the shape.
 */
#include "encode_internal.h"

int64_t nwc_encode(const void *w, uint64_t n, uint64_t K, unsigned elem, uint64_t *freq,
                   uint8_t psym[16], uint64_t *bases, uint8_t *hdr, uint8_t *data, uint64_t cap,
                   uint8_t *raw) {
  if (NWC_ELEM_LAYOUT(elem) != 0)
    return nwc__lx_encode(w, n, K, elem, freq, psym, bases, hdr, data, cap, raw);
  return nwc__l0_encode(w, n, K, elem, freq, psym, bases, hdr, data, cap, raw);
}

int nwc_tensor_encode(const void *w, uint64_t rows, uint64_t cols, unsigned elem,
                      const float *scale, nwc_tensor *t) {
  if (NWC_ELEM_LAYOUT(elem) != 0) return nwc__lx_tensor_encode(w, rows, cols, elem, scale, t);
  return nwc__l0_tensor_encode(w, rows, cols, elem, scale, t);
}
