/*
 * fuzz_tensor.c - libFuzzer target for the decoders on tensors that were never validated
 * (nwc.h: "Decoders do not need [nwc_tensor_validate] to be memory safe").
 *
 * The input describes an nwc_tensor directly; every array gets an exactly sized buffer:
 *   byte 0      elem (bit 7 set: used as is; else bit 0 picks BF16 or fp8, layout 0)
 *   byte 1      rows - 1            bytes 2..3  (cols - 1) & 2047, little-endian
 *   bytes 4..19 psym                byte 20     flags
 *   then hdr[nblocks * 32] (missing bytes are 0), then the data bytes.
 * nblocks is the shape's block count (flag bit 1: one more); bases[] chain the lane lengths as
 * the format does (flag bit 2: bases[1] from the next 8 input bytes instead); flag bit 0 pads the
 * data with zeros to the end of the chain plus the 16-byte slack; flag bit 3 makes the raw plane
 * one byte short.  Then validate, dequant, gather and matvec run; any result is fine, a crash or
 * a sanitizer report is a bug.  Replayed over corpus/tensor by fuzz_replay under ctest.
 */
#include "nwc.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *in, size_t size) {
  if (size < 21) return 0;
  nwc_tensor t;
  memset(&t, 0, sizeof t);
  unsigned flags = in[20];
  t.elem = (in[0] & 0x80) ? in[0] : NWC_ELEM(in[0] & 1u, 0);
  t.rows = 1u + in[1];
  t.cols = 1u + ((in[2] | (unsigned)in[3] << 8) & 2047u);
  memcpy(t.psym, in + 4, 16);
  uint64_t lay[4];
  if (nwc_layout(t.rows, t.cols, NWC_ELEM(t.elem & 1u, 0), lay) < 0) return 0;
  uint64_t nb = lay[NWC_LAYOUT_BLOCKS] + ((flags >> 1) & 1u), K16 = lay[NWC_LAYOUT_K16];
  const uint8_t *p = in + 21, *end = in + size;

  uint8_t *hdr = calloc(nb * NWC_LANES, 1);
  uint64_t *bases = malloc((nb + 1) * 8);
  size_t nh = (size_t)(end - p) < nb * NWC_LANES ? (size_t)(end - p) : nb * NWC_LANES;
  memcpy(hdr, p, nh);
  p += nh;
  bases[0] = 0;
  for (uint64_t b = 0; b < nb; b++) {
    uint64_t u = 0;
    for (unsigned l = 0; l < NWC_LANES; l++) u += hdr[b * NWC_LANES + l];
    bases[b + 1] = bases[b] + (4 * ((u + 1) / 2) + 7) / 8 * 8;
  }
  if ((flags & 4u) && end - p >= 8) {
    memcpy(&bases[1], p, 8);
    p += 8;
  }
  size_t have = (size_t)(end - p), want = have;
  if ((flags & 1u) && bases[nb] + 16 > have && bases[nb] < (UINT64_C(1) << 24))
    want = (size_t)bases[nb] + 16;
  uint8_t *dat = calloc(want ? want : 1, 1);
  memcpy(dat, p, have < want ? have : want);
  uint64_t raw_bytes = lay[NWC_LAYOUT_RAW_BYTES] - ((flags >> 3) & 1u);
  uint8_t *raw = malloc(raw_bytes ? raw_bytes : 1);
  for (uint64_t i = 0; i < raw_bytes; i++) raw[i] = (uint8_t)(i * 37 + 11);

  t.nblocks = nb;
  t.bases = bases;
  t.hdr = hdr;
  t.data = dat;
  t.data_bytes = want;
  t.raw = raw;
  t.raw_bytes = raw_bytes;
  (void)nwc_tensor_validate(&t);
  uint16_t *out = malloc(t.rows * K16 * 2), *yb = malloc(t.rows * 2);
  float *x = calloc(K16, sizeof *x), *y = malloc(t.rows * sizeof *y);
  for (uint64_t c = 0; c < t.cols; c++) x[c] = 1.0f;
  (void)nwc_dequant(&t, out);
  uint64_t rows[2] = {t.rows - 1, t.rows / 3};
  (void)nwc_gather(&t, rows, t.rows >= 2 ? 2 : 1, out); /* out holds t.rows rows */
  (void)nwc_matvec(&t, x, NULL, y, yb);
  free(out);
  free(yb);
  free(x);
  free(y);
  free(hdr);
  free(bases);
  free(dat);
  free(raw);
  return 0;
}
