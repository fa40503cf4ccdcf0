/*
 * blob_view.c - nwc_store_blob_view (nwc_store.h): a borrowed view of a tensor blob in memory,
 * checked against the catalog's decoder parameters (the blob header layout is in container.c's
 * comment).  A library of its own (nwc_blob_view), not part of the store's, so that libnwc-client
 * can check the blobs nwcd shares with it (client/map.c) without linking SQLite.
 */
#include "store_internal.h"
#include "internal.h" /* nwc__get64 */

#include <string.h>
#include <xxhash.h>

int nwc_store_blob_view(const nwc_tensor_info *ti, const void *blob, nwc_tensor *t) {
  NWC_RETURN_IF(!ti || !blob || !t, -EINVAL, "nwc_store_blob_view: missing argument");
  memset(t, 0, sizeof *t);
  const uint8_t *h = blob;
  uint16_t ver;
  memcpy(&ver, h + 4, 2);
  NWC_RETURN_IF(memcmp(h, "NWCB", 4) || nwc__get64(h + 120) != XXH3_64bits(h, 120), -EBADMSG,
                "%s: model '%s' tensor '%s': bad blob header at file offset %llu", ti->path,
                ti->model, ti->name, (unsigned long long)ti->offset);
  uint64_t cat[] = {ti->container, ti->rows, ti->cols, ti->nblocks, ti->data_bytes,
                    ti->raw_plane_bytes, ti->off_bases, ti->off_hdr, ti->off_data, ti->off_raw,
                    ti->off_scale};
  uint64_t blb[] = {nwc__get64(h + 8),  nwc__get64(h + 16), nwc__get64(h + 24),
                    nwc__get64(h + 48), nwc__get64(h + 56), nwc__get64(h + 64),
                    nwc__get64(h + 72), nwc__get64(h + 80), nwc__get64(h + 88),
                    nwc__get64(h + 96), nwc__get64(h + 104)};
  int same = ver == ti->format_version && h[6] == ti->elem && h[7] == (ti->off_scale ? 1 : 0) &&
             !memcmp(h + 32, ti->psym, 16) && !memcmp(cat, blb, sizeof cat);
  NWC_RETURN_IF(!same, -EBADMSG,
                "%s: model '%s' tensor '%s': blob header at file offset %llu disagrees with the "
                "catalog",
                ti->path, ti->model, ti->name, (unsigned long long)ti->offset);
  /* Sections must lie inside the blob, in order, 8-aligned (sizes first, so nothing wraps). */
  uint64_t nb = ti->nblocks, L = ti->length;
  NWC_RETURN_IF(nb > L || ti->data_bytes > L || ti->rows > L || ti->raw_plane_bytes > L, -EBADMSG,
                "%s: model '%s' tensor '%s': sizes larger than the %llu-byte blob", ti->path,
                ti->model, ti->name, (unsigned long long)L);
  uint64_t starts[5] = {ti->off_bases, ti->off_hdr, ti->off_data, ti->off_raw, ti->off_scale};
  uint64_t sizes[5] = {(nb + 1) * 8, nb * NWC_LANES, ti->data_bytes, ti->raw_plane_bytes,
                       ti->rows * 4};
  uint64_t prev_end = NWC__BLOB_HEADER;
  for (int i = 0; i < (ti->off_scale ? 5 : 4); i++) {
    NWC_RETURN_IF(starts[i] % 8 || starts[i] < prev_end || starts[i] > L ||
                      sizes[i] > L - starts[i],
                  -EBADMSG, "%s: model '%s' tensor '%s': blob section %d outside the blob",
                  ti->path, ti->model, ti->name, i);
    prev_end = starts[i] + sizes[i];
  }
  t->elem = ti->elem;
  t->rows = ti->rows;
  t->cols = ti->cols;
  memcpy(t->psym, ti->psym, 16);
  t->nblocks = nb;
  t->bases = (const uint64_t *)(h + ti->off_bases);
  t->hdr = h + ti->off_hdr;
  t->data = h + ti->off_data;
  t->data_bytes = ti->data_bytes;
  t->raw = h + ti->off_raw;
  t->raw_bytes = ti->raw_plane_bytes;
  t->scale = ti->off_scale ? (const float *)(h + ti->off_scale) : NULL;
  int rc = nwc_tensor_validate(t);
  if (rc < 0) {
    memset(t, 0, sizeof *t);
    return nwc__fail_prefix(rc, "%s: model '%s' tensor '%s'", ti->path, ti->model, ti->name);
  }
  return 0;
}
