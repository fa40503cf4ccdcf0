/*
 * record.c - the tensor record: a self-contained, checksummed serialization of one encoded
 * tensor (docs/format.md, "Tensor record") used by the golden files and tools; and
 * nwc_tensor_release, which frees what a record read (or an encoder) allocated for a tensor.
 *
 * Record layout (little-endian):
 *   0 "NWCT"  4 u16 version  6 u8 elem  7 u8 flags (bit 0: per-row scale present)
 *   8 u64 rows  16 u64 cols  24 u8 psym[16]  40 u64 nblocks  48 u64 data_bytes  56 u64 raw_bytes
 *   64 u64 XXH3-64 (seeded with XXH3-64 of bytes [0, 64)) of bytes [72, end)
 *   72 bases[nblocks + 1] (u64), hdr[nblocks * 32], data, raw, scale[rows] (f32) if flagged
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "nwc assumes a little-endian host"
#endif

#define RECORD_HEADER 72
#define RECORD_FLAG_SCALE 1u

/* XXH3-64 of the header before the checksum field and everything after it (seed 0). */
static uint64_t record_hash(const uint8_t *buf, size_t len) {
  return XXH3_64bits_withSeed(buf + RECORD_HEADER, len - RECORD_HEADER, XXH3_64bits(buf, 64));
}

int nwc_record_write(const nwc_tensor *t, uint8_t **buf, size_t *len) {
  NWC_RETURN_IF(!buf || !len, -EINVAL, "nwc_record_write: no output");
  NWC_TRY(nwc_tensor_validate(t));
  uint64_t nb = t->nblocks, scale_bytes = t->scale ? t->rows * 4 : 0;
  uint64_t total = RECORD_HEADER + (nb + 1) * 8 + nb * NWC_LANES + t->data_bytes + t->raw_bytes +
                   scale_bytes;
  uint8_t *p = malloc(total);
  if (!p) return -ENOMEM;
  memcpy(p, "NWCT", 4);
  nwc__put16(p + 4, NWC_FORMAT_VERSION);
  p[6] = (uint8_t)t->elem;
  p[7] = t->scale ? RECORD_FLAG_SCALE : 0;
  nwc__put64(p + 8, t->rows);
  nwc__put64(p + 16, t->cols);
  memcpy(p + 24, t->psym, 16);
  nwc__put64(p + 40, nb);
  nwc__put64(p + 48, t->data_bytes);
  nwc__put64(p + 56, t->raw_bytes);
  uint8_t *q = p + RECORD_HEADER;
  memcpy(q, t->bases, (nb + 1) * 8), q += (nb + 1) * 8;
  memcpy(q, t->hdr, nb * NWC_LANES), q += nb * NWC_LANES;
  memcpy(q, t->data, t->data_bytes), q += t->data_bytes;
  memcpy(q, t->raw, t->raw_bytes), q += t->raw_bytes;
  if (scale_bytes) memcpy(q, t->scale, scale_bytes);
  nwc__put64(p + 64, record_hash(p, total));
  *buf = p;
  *len = total;
  return 0;
}

int nwc_record_read(const uint8_t *buf, size_t len, nwc_tensor *t) {
  NWC_RETURN_IF(!t, -EINVAL, "nwc_record_read: no output");
  memset(t, 0, sizeof *t);
  NWC_RETURN_IF(!buf || len < RECORD_HEADER || memcmp(buf, "NWCT", 4), -EBADMSG,
                "record: no NWCT header");
  uint16_t version;
  memcpy(&version, buf + 4, 2);
  NWC_RETURN_IF(version != NWC_FORMAT_VERSION, -EBADMSG, "record: format version %u, expected %d",
                version, NWC_FORMAT_VERSION);
  NWC_RETURN_IF(buf[7] & ~RECORD_FLAG_SCALE, -EBADMSG, "record: unknown flags 0x%x", buf[7]);
  uint64_t rows = nwc__get64(buf + 8), cols = nwc__get64(buf + 16), nb = nwc__get64(buf + 40);
  uint64_t data_bytes = nwc__get64(buf + 48), raw_bytes = nwc__get64(buf + 56);
  NWC_RETURN_IF(nb > len || data_bytes > len || raw_bytes > len || rows > len, -EBADMSG,
                "record: counts larger than the record");
  uint64_t scale_bytes = (buf[7] & RECORD_FLAG_SCALE) ? rows * 4 : 0;
  uint64_t want = RECORD_HEADER + (nb + 1) * 8 + nb * NWC_LANES + data_bytes + raw_bytes +
                  scale_bytes;
  NWC_RETURN_IF(want != len, -EBADMSG, "record: %zu bytes, header describes %llu", len,
                (unsigned long long)want);
  NWC_RETURN_IF(nwc__get64(buf + 64) != record_hash(buf, len), -EBADMSG,
                "record: checksum mismatch");
  uint8_t *copy = malloc(len - RECORD_HEADER + 8);
  if (!copy) return -ENOMEM;
  memcpy(copy, buf + RECORD_HEADER, len - RECORD_HEADER);
  const uint8_t *q = copy;
  t->elem = buf[6];
  t->rows = rows;
  t->cols = cols;
  memcpy(t->psym, buf + 24, 16);
  t->nblocks = nb;
  t->bases = (const uint64_t *)q, q += (nb + 1) * 8;
  t->hdr = q, q += nb * NWC_LANES;
  t->data = q, q += data_bytes;
  t->data_bytes = data_bytes;
  t->raw = q, q += raw_bytes;
  t->raw_bytes = raw_bytes;
  t->scale = scale_bytes ? (const float *)q : NULL;
  t->owned = copy;
  int rc = nwc_tensor_validate(t);
  if (rc < 0) nwc_tensor_release(t);
  return rc;
}

void nwc_tensor_release(nwc_tensor *t) {
  if (!t) return;
  free(t->owned);
  memset(t, 0, sizeof *t);
}
