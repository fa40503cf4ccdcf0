/*
 * record.c - validation of encoded tensors, and the tensor record: a self-contained, checksummed
 * serialization of one encoded tensor (docs/format.md, "Tensor record") used by the golden files
 * and tools.
 *
 * Record layout (little-endian):
 *   0 "NWCT"  4 u16 version  6 u8 elem  7 u8 flags (bit 0: per-row scale present)
 *   8 u64 rows  16 u64 cols  24 u8 psym[16]  40 u64 nblocks  48 u64 data_bytes  56 u64 raw_bytes
 *   64 u64 XXH3-64 (seeded with XXH3-64 of bytes [0, 64)) of bytes [72, end)
 *   72 bases[nblocks + 1] (u64), hdr[nblocks * 32], data, raw, scale[rows] (f32) if flagged
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "nwc assumes a little-endian host"
#endif

#define RECORD_HEADER 72
#define RECORD_FLAG_SCALE 1u

static int validate_psym(const nwc_tensor *t, unsigned type) {
  unsigned seen = 0;
  uint64_t seen128[2] = {0, 0};
  if (type == NWC_ELEM_BF16) {
    for (unsigned r = 0; r < NWC_BF16_CODED_RANKS; r++) {
      unsigned v = t->psym[r];
      NWC_RETURN_IF(v > 127 || (seen128[v >> 6] >> (v & 63) & 1), -EBADMSG,
                    "psym[%u] = %u: not a distinct 7-bit exponent", r, v);
      seen128[v >> 6] |= UINT64_C(1) << (v & 63);
    }
    NWC_RETURN_IF(t->psym[15] != 0, -EBADMSG, "psym[15] = %u, must be 0", t->psym[15]);
    return 0;
  }
  for (unsigned r = 0; r < NWC_RANKS; r++) {
    unsigned v = t->psym[r], s = 0;
    if (r >= NWC_FP8_SYMBOLS) {
      NWC_RETURN_IF(v != 0, -EBADMSG, "fp8 psym[%u] = %u, must be 0", r, v);
      continue;
    }
    while (s < NWC_FP8_SYMBOLS && nwc__fp8_sym_byte[s] != v) s++;
    NWC_RETURN_IF(s == NWC_FP8_SYMBOLS || (seen >> s & 1), -EBADMSG,
                  "fp8 psym[%u] = %u: not a distinct fp8 symbol byte", r, v);
    seen |= 1u << s;
  }
  return 0;
}

static int validate_scale(const nwc_tensor *t, uint64_t M) {
  for (uint64_t r = 0; t->scale && r < M; r++)
    NWC_RETURN_IF(!isfinite(t->scale[r]) || t->scale[r] <= 0, -EBADMSG,
                  "scale[%llu] = %g is not a positive finite number", (unsigned long long)r,
                  (double)t->scale[r]);
  return 0;
}

int nwc_tensor_validate(const nwc_tensor *t) {
  nwc__geom g = {0};
  NWC_RETURN_IF(!t || !t->bases || !t->hdr || !t->data || !t->raw, -EINVAL,
                "validate: tensor has missing arrays");
  int rc = nwc__geom_init(&g, t->rows, t->cols, t->elem);
  NWC_RETURN_IF(rc == -ENOTSUP, rc, "%s", nwc_error_detail());
  NWC_RETURN_IF(rc < 0, -EBADMSG, "%s", nwc_error_detail());
  if (NWC_ELEM_LAYOUT(t->elem) != 0) { /* layouts 1 and 2: store/layout_common.c */
    if (NWC_ELEM_LAYOUT(t->elem) == 1) NWC_TRY(validate_psym(t, g.type));
    NWC_TRY(nwc__lx_validate(t));
    return validate_scale(t, g.M);
  }
  NWC_RETURN_IF(t->nblocks != g.nblocks, -EBADMSG, "%llu blocks, shape needs %llu",
                (unsigned long long)t->nblocks, (unsigned long long)g.nblocks);
  NWC_RETURN_IF(t->raw_bytes != g.M * g.raw_stride, -EBADMSG, "raw plane %llu bytes, needs %llu",
                (unsigned long long)t->raw_bytes, (unsigned long long)(g.M * g.raw_stride));
  NWC_TRY(validate_psym(t, g.type));
  NWC_RETURN_IF(t->bases[0] != 0, -EBADMSG, "bases[0] = %llu, must be 0",
                (unsigned long long)t->bases[0]);
  for (uint64_t b = 0; b < g.nblocks; b++) {
    uint64_t units = 0, rows = nwc__block_rows(&g, b / g.col_blocks);
    unsigned active = nwc__active_lanes(&g, b % g.col_blocks);
    for (unsigned l = 0; l < NWC_LANES; l++) {
      /* each of a lane's rows * 16 codes takes 2..24 bits: 2 * rows .. 24 * rows units */
      uint64_t n = t->hdr[b * NWC_LANES + l], lo = l < active ? 2 * rows : 0, hi = 12 * lo;
      NWC_RETURN_IF(n < lo || n > hi, -EBADMSG, "block %llu lane %u: %llu units, must be %llu..%llu",
                    (unsigned long long)b, l, (unsigned long long)n, (unsigned long long)lo,
                    (unsigned long long)hi);
      units += n;
    }
    uint64_t want = t->bases[b] + nwc__block_span(units);
    NWC_RETURN_IF(t->bases[b + 1] != want, -EBADMSG, "bases[%llu] = %llu, streams end at %llu",
                  (unsigned long long)(b + 1), (unsigned long long)t->bases[b + 1],
                  (unsigned long long)want);
  }
  NWC_RETURN_IF(t->data_bytes != t->bases[g.nblocks] + NWC_DATA_SLACK, -EBADMSG,
                "data is %llu bytes, blocks end at %llu (+%d slack)",
                (unsigned long long)t->data_bytes, (unsigned long long)t->bases[g.nblocks],
                NWC_DATA_SLACK);
  return validate_scale(t, g.M);
}

static void put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint64_t get_u64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

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
  put_u16(p + 4, NWC_FORMAT_VERSION);
  p[6] = (uint8_t)t->elem;
  p[7] = t->scale ? RECORD_FLAG_SCALE : 0;
  put_u64(p + 8, t->rows);
  put_u64(p + 16, t->cols);
  memcpy(p + 24, t->psym, 16);
  put_u64(p + 40, nb);
  put_u64(p + 48, t->data_bytes);
  put_u64(p + 56, t->raw_bytes);
  uint8_t *q = p + RECORD_HEADER;
  memcpy(q, t->bases, (nb + 1) * 8), q += (nb + 1) * 8;
  memcpy(q, t->hdr, nb * NWC_LANES), q += nb * NWC_LANES;
  memcpy(q, t->data, t->data_bytes), q += t->data_bytes;
  memcpy(q, t->raw, t->raw_bytes), q += t->raw_bytes;
  if (scale_bytes) memcpy(q, t->scale, scale_bytes);
  put_u64(p + 64, record_hash(p, total));
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
  uint64_t rows = get_u64(buf + 8), cols = get_u64(buf + 16), nb = get_u64(buf + 40);
  uint64_t data_bytes = get_u64(buf + 48), raw_bytes = get_u64(buf + 56);
  NWC_RETURN_IF(nb > len || data_bytes > len || raw_bytes > len || rows > len, -EBADMSG,
                "record: counts larger than the record");
  uint64_t scale_bytes = (buf[7] & RECORD_FLAG_SCALE) ? rows * 4 : 0;
  uint64_t want = RECORD_HEADER + (nb + 1) * 8 + nb * NWC_LANES + data_bytes + raw_bytes +
                  scale_bytes;
  NWC_RETURN_IF(want != len, -EBADMSG, "record: %zu bytes, header describes %llu", len,
                (unsigned long long)want);
  NWC_RETURN_IF(get_u64(buf + 64) != record_hash(buf, len), -EBADMSG, "record: checksum mismatch");
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
