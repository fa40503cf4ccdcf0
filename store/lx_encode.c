/*
 * lx_encode.c - nwc_encode and nwc_tensor_encode for layouts 1 and 2 (docs/format-layouts.md):
 * check the input, plan (layout1_encode.c or layout2_encode.c: symbols, psym, stream lengths,
 * block offsets), size and allocate, then write the data and raw planes.
 */
#include "encode_internal.h"

#include <stdlib.h>
#include <string.h>

static int plan_run(nwc__lx_plan *p, const void *w, uint64_t n, uint64_t K, unsigned elem,
                    uint64_t *freq, uint8_t psym[16], uint64_t *bases, uint8_t *hdr,
                    uint64_t *data_bytes) {
  NWC_TRY(nwc__encode_args(w, n, K));
  memset(p, 0, sizeof *p);
  NWC_TRY(nwc__lgeom_init(&p->lg, n / K, K, elem));
  if (p->lg.g.type == NWC_ELEM_BF16)
    p->w16 = w;
  else
    p->w8 = w;
  p->bases = bases;
  p->hdr = hdr;
  return p->lg.layout == 1 ? nwc__l1_plan(p, freq, psym, bases, hdr, data_bytes)
                           : nwc__l2_plan(p, freq, psym, bases, hdr, data_bytes);
}

static void plan_write(const nwc__lx_plan *p, uint8_t *data, uint8_t *raw) {
  if (p->lg.layout == 1)
    nwc__l1_write(p, data, raw);
  else
    nwc__l2_write(p, data, raw);
  memset(raw + p->lg.nib_bytes + p->lg.low_bytes, 0, NWC__RAW_SLACK);
}

int64_t nwc__lx_encode(const void *w, uint64_t n, uint64_t K, unsigned elem, uint64_t *freq,
                       uint8_t psym[16], uint64_t *bases, uint8_t *hdr, uint8_t *data, uint64_t cap,
                       uint8_t *raw) {
  NWC_RETURN_IF(!psym || !bases || !hdr, -EINVAL, "nwc_encode: missing output array");
  nwc__lx_plan *p = malloc(sizeof *p);
  if (!p) return -ENOMEM;
  uint64_t data_bytes = 0;
  int64_t rc = plan_run(p, w, n, K, elem, freq, psym, bases, hdr, &data_bytes);
  if (rc == 0) rc = (int64_t)data_bytes;
  if (rc > 0 && data) {
    if (cap < data_bytes || !raw)
      rc = nwc__fail(-ENOSPC, "nwc_encode: needs %llu data bytes, got %llu",
                     (unsigned long long)data_bytes, (unsigned long long)cap);
    else
      plan_write(p, data, raw);
  }
  free(p);
  return rc;
}

int nwc__lx_tensor_encode(const void *w, uint64_t rows, uint64_t cols, unsigned elem,
                          const float *scale, nwc_tensor *t) {
  NWC_RETURN_IF(!t, -EINVAL, "nwc_tensor_encode: no output");
  memset(t, 0, sizeof *t);
  nwc__lgeom lg;
  NWC_TRY(nwc__lgeom_init(&lg, rows, cols, elem));
  uint64_t nb = lg.g.nblocks;
  size_t meta = (size_t)((nb + 1) * 8 + nb * NWC_LANES), meta8 = nwc__round_up(meta, 8);
  uint8_t *head = malloc(meta8);
  nwc__lx_plan *p = malloc(sizeof *p);
  int rc = head && p ? 0 : -ENOMEM;
  uint64_t data_bytes = 0;
  if (rc == 0)
    rc = plan_run(p, w, rows * cols, cols, elem, NULL, t->psym, (uint64_t *)head,
                  head + (nb + 1) * 8, &data_bytes);
  if (rc == 0) {
    size_t scale_bytes = scale ? (size_t)rows * sizeof(float) : 0;
    size_t data8 = nwc__round_up(data_bytes, 8), raw8 = nwc__round_up(lg.raw_bytes, 8);
    uint8_t *all = malloc(meta8 + data8 + raw8 + scale_bytes);
    if (!all) {
      rc = -ENOMEM;
    } else {
      memcpy(all, head, meta);
      uint8_t *data = all + meta8, *raw = data + data8;
      t->bases = (const uint64_t *)all;
      t->hdr = all + (nb + 1) * 8;
      p->bases = t->bases;
      p->hdr = t->hdr;
      plan_write(p, data, raw);
      if (scale) {
        memcpy(raw + raw8, scale, scale_bytes);
        t->scale = (const float *)(raw + raw8);
      }
      t->elem = elem;
      t->rows = rows;
      t->cols = cols;
      t->nblocks = nb;
      t->data = data;
      t->data_bytes = data_bytes;
      t->raw = raw;
      t->raw_bytes = lg.raw_bytes;
      t->owned = all;
    }
  }
  free(head);
  free(p);
  return rc;
}
