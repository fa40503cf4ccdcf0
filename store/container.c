/*
 * container.c - container files and tensor blobs: their bytes (docs/store.md, "Container files"),
 * the chunk checksums, and the read paths (read into memory, mmap, check chunks a loader read
 * itself, view a blob in memory).  Every read path checks every chunk checksum before a decoder
 * sees a byte, and cross-checks the blob header against the catalog row.
 *
 * Container file:  [0, 4096) header, then blobs back to back, tiling the file.  A blob of
 * NWC_STORE_PACK_MAX bytes or more (its end rounded to 64) starts and ends on a multiple of 4096
 * (O_DIRECT loads); a smaller one is packed: it starts and ends on a multiple of 64 inside a run
 * of packed blobs that itself starts and ends on a multiple of 4096 (the last blob of the run
 * takes the zeros up to its end).  Version 1 containers hold no packed blobs (they are read as
 * they are).  Header: 0 "NWCSTORE", 8 u32 container version, 12 u32 header bytes (4096), 16 u64
 * container id, 24 u32 chunk size, 28 u32 alignment (4096), 32 u32 pack alignment (64; 0 in
 * version 1), zeros, 4088 u64 XXH3-64 of [0, 4088).
 *
 * Blob: 0 "NWCB", 4 u16 codec format version, 6 u8 elem, 7 u8 flags (bit 0: per-row scale),
 * 8 u64 container id, 16 u64 rows, 24 u64 cols, 32 psym[16], 48 u64 nblocks, 56 u64 data_bytes,
 * 64 u64 raw_bytes, 72..104 u64 offsets of bases, hdr, data, raw, scale (0: none), 112 u64 zero,
 * 120 u64 XXH3-64 of [0, 120); the sections from 128 on, each 64-aligned; zeros to the blob's end.
 */
#include "store_internal.h"
#include "internal.h" /* nwc__round_up, nwc__put64, nwc__get64 */

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xxh_x86dispatch.h> /* XXH3 on the widest vectors the CPU has (AVX-512: 8x SSE2) */
#endif

static const char container_magic[8] = {'N', 'W', 'C', 'S', 'T', 'O', 'R', 'E'};

void nwc__container_header(uint64_t cid, uint8_t hdr[NWC__CONTAINER_HEADER]) {
  memset(hdr, 0, NWC__CONTAINER_HEADER);
  memcpy(hdr, container_magic, 8);
  nwc__put32(hdr + 8, NWC_CONTAINER_VERSION);
  nwc__put32(hdr + 12, NWC__CONTAINER_HEADER);
  nwc__put64(hdr + 16, cid);
  nwc__put32(hdr + 24, NWC_STORE_CHUNK);
  nwc__put32(hdr + 28, NWC_STORE_ALIGN);
  nwc__put32(hdr + 32, NWC_STORE_PACK_ALIGN);
  nwc__put64(hdr + NWC__CONTAINER_HEADER - 8, XXH3_64bits(hdr, NWC__CONTAINER_HEADER - 8));
}

int nwc__container_header_check(const uint8_t *hdr, uint64_t cid, const char *path) {
  NWC_RETURN_IF(memcmp(hdr, container_magic, 8), -EBADMSG, "%s: not an nwc container", path);
  NWC_RETURN_IF(nwc__get64(hdr + NWC__CONTAINER_HEADER - 8) !=
                    XXH3_64bits(hdr, NWC__CONTAINER_HEADER - 8),
                -EBADMSG, "%s: container header checksum mismatch (offset 0, 4096 bytes)", path);
  uint32_t v = nwc__get32(hdr + 8);
  NWC_RETURN_IF(v < 1 || v > NWC_CONTAINER_VERSION, -EBADMSG,
                "%s: container version %u, this build reads 1 to %u", path, v,
                NWC_CONTAINER_VERSION);
  NWC_RETURN_IF(nwc__get32(hdr + 12) != NWC__CONTAINER_HEADER ||
                    nwc__get32(hdr + 24) != NWC_STORE_CHUNK || nwc__get32(hdr + 28) != NWC_STORE_ALIGN ||
                    nwc__get32(hdr + 32) != (v == 1 ? 0 : NWC_STORE_PACK_ALIGN),
                -EBADMSG, "%s: unexpected header, chunk or alignment size", path);
  NWC_RETURN_IF(nwc__get64(hdr + 16) != cid, -EBADMSG,
                "%s: header says container %llu, expected %llu", path,
                (unsigned long long)nwc__get64(hdr + 16), (unsigned long long)cid);
  return 0;
}

/* ---- blobs ---------------------------------------------------------------------------------- */

void nwc__blob_layout_of(const nwc_tensor *t, nwc__blob_layout *L) {
  uint64_t o = NWC__BLOB_HEADER;
  L->off_bases = o;
  o = nwc__round_up(o + (t->nblocks + 1) * 8, NWC__SECTION_ALIGN);
  L->off_hdr = o;
  o = nwc__round_up(o + t->nblocks * NWC_LANES, NWC__SECTION_ALIGN);
  L->off_data = o;
  o = nwc__round_up(o + t->data_bytes, NWC__SECTION_ALIGN);
  L->off_raw = o;
  o += t->raw_bytes;
  L->off_scale = 0;
  if (t->scale) {
    o = nwc__round_up(o, NWC__SECTION_ALIGN);
    L->off_scale = o;
    o += t->rows * 4;
  }
  L->end = o;
  uint64_t small = nwc__round_up(o, NWC_STORE_PACK_ALIGN);
  L->packed = small < NWC_STORE_PACK_MAX;
  L->length = L->packed ? small : nwc__round_up(o, NWC_STORE_ALIGN);
}

static void blob_header(const nwc_tensor *t, uint64_t cid, const nwc__blob_layout *L,
                        uint8_t h[NWC__BLOB_HEADER]) {
  memset(h, 0, NWC__BLOB_HEADER);
  memcpy(h, "NWCB", 4);
  uint16_t v = NWC_FORMAT_VERSION;
  memcpy(h + 4, &v, 2);
  h[6] = (uint8_t)t->elem;
  h[7] = t->scale ? 1 : 0;
  nwc__put64(h + 8, cid);
  nwc__put64(h + 16, t->rows);
  nwc__put64(h + 24, t->cols);
  memcpy(h + 32, t->psym, 16);
  nwc__put64(h + 48, t->nblocks);
  nwc__put64(h + 56, t->data_bytes);
  nwc__put64(h + 64, t->raw_bytes);
  nwc__put64(h + 72, L->off_bases);
  nwc__put64(h + 80, L->off_hdr);
  nwc__put64(h + 88, L->off_data);
  nwc__put64(h + 96, L->off_raw);
  nwc__put64(h + 104, L->off_scale);
  nwc__put64(h + 120, XXH3_64bits(h, 120));
}

/* Zeros blob bytes [a, b) where they fall inside [from, upto) (dst[0] is byte from). */
static void zero_clip(uint8_t *dst, uint64_t from, uint64_t upto, uint64_t a, uint64_t b) {
  if (a < from) a = from;
  if (b > upto) b = upto;
  if (a < b) memset(dst + (a - from), 0, b - a);
}

void nwc__blob_write(const nwc_tensor *t, uint64_t cid, const nwc__blob_layout *L, uint64_t from,
                     uint64_t upto, uint8_t *dst) {
  /* Sections, and zeros in every gap between them and up to the 4096 end (dst may be reused). */
  const void *src[5] = {t->bases, t->hdr, t->data, t->raw, t->scale};
  uint64_t off[5] = {L->off_bases, L->off_hdr, L->off_data, L->off_raw, L->off_scale};
  uint64_t len[5] = {(t->nblocks + 1) * 8, t->nblocks * NWC_LANES, t->data_bytes, t->raw_bytes,
                     t->scale ? t->rows * 4 : 0};
  if (from < NWC__BLOB_HEADER) {
    uint8_t h[NWC__BLOB_HEADER];
    blob_header(t, cid, L, h);
    memcpy(dst, h + from, (upto < NWC__BLOB_HEADER ? upto : NWC__BLOB_HEADER) - from);
  }
  uint64_t at = NWC__BLOB_HEADER;
  for (int i = 0; i < 5; i++) {
    if (!len[i] && i == 4) break;
    zero_clip(dst, from, upto, at, off[i]);
    uint64_t a = off[i] > from ? off[i] : from, b = off[i] + len[i] < upto ? off[i] + len[i] : upto;
    const uint8_t *sp = src[i] ? (const uint8_t *)src[i] + (a - off[i]) : NULL;
    if (a < b && sp && sp != dst + (a - from)) memcpy(dst + (a - from), sp, b - a);
    at = off[i] + len[i];
  }
  zero_clip(dst, from, upto, at, L->length);
}

int nwc__pread_full(int fd, void *buf, uint64_t len, uint64_t off) {
  uint8_t *p = buf;
  while (len) {
    ssize_t n = pread(fd, p, len > (1u << 30) ? (1u << 30) : len, (off_t)off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) return -EIO;
    p += n, off += (uint64_t)n, len -= (uint64_t)n;
  }
  return 0;
}

int nwc_store_chunk_check(const nwc_tensor_info *ti, uint64_t i, const void *chunk) {
  NWC_RETURN_IF(!ti || !chunk || i >= ti->nchunks, -EINVAL, "nwc_store_chunk_check: bad chunk %llu",
                (unsigned long long)i);
  uint64_t o = i * ti->chunk_size, n = ti->length - o < ti->chunk_size ? ti->length - o
                                                                        : ti->chunk_size;
  NWC_RETURN_IF(XXH3_64bits(chunk, n) != ti->checksums[i], -EBADMSG,
                "%s: model '%s' tensor '%s': checksum mismatch in chunk %llu, file offset %llu "
                "(+%llu bytes)",
                ti->path, ti->model, ti->name, (unsigned long long)i,
                (unsigned long long)(ti->offset + o), (unsigned long long)n);
  return 0;
}

static int check_all_chunks(const nwc_tensor_info *ti, const uint8_t *blob) {
  for (uint64_t i = 0; i < ti->nchunks; i++)
    NWC_TRY(nwc_store_chunk_check(ti, i, blob + i * ti->chunk_size));
  return 0;
}

int nwc_store_read_info(const nwc_tensor_info *ti, nwc_tensor *t) {
  NWC_RETURN_IF(!ti || !t || !ti->length || ti->length % NWC_STORE_PACK_ALIGN, -EINVAL,
                "nwc_store_read: bad tensor info");
  memset(t, 0, sizeof *t);
  int fd = open(ti->path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return nwc__fail(-errno, "%s: model '%s' tensor '%s': cannot open the container", ti->path,
                     ti->model, ti->name);
  void *buf = NULL;
  int rc = posix_memalign(&buf, NWC_STORE_ALIGN, ti->length) ? -ENOMEM : 0;
  if (rc == 0) {
    rc = nwc__pread_full(fd, buf, ti->length, ti->offset);
    if (rc < 0)
      rc = nwc__fail(rc, "%s: model '%s' tensor '%s': cannot read %llu bytes at offset %llu",
                     ti->path, ti->model, ti->name, (unsigned long long)ti->length,
                     (unsigned long long)ti->offset);
  }
  close(fd);
  if (rc == 0) rc = check_all_chunks(ti, buf);
  if (rc == 0) rc = nwc_store_blob_view(ti, buf, t);
  if (rc < 0) {
    free(buf);
    return rc;
  }
  t->owned = buf;
  return 0;
}

struct nwc_store_map {
  void *base;
  size_t len;
};

int nwc_store_map_info(const nwc_tensor_info *ti, nwc_store_map **out, nwc_tensor *view) {
  NWC_RETURN_IF(!ti || !out || !view || !ti->length, -EINVAL, "nwc_store_map: bad argument");
  *out = NULL;
  int fd = open(ti->path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return nwc__fail(-errno, "%s: model '%s' tensor '%s': cannot open the container", ti->path,
                     ti->model, ti->name);
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), skew = ti->offset % page;
  void *p = mmap(NULL, ti->length + skew, PROT_READ, MAP_SHARED, fd, (off_t)(ti->offset - skew));
  int rc = p == MAP_FAILED ? -errno : 0;
  close(fd);
  if (rc < 0) return nwc__fail(rc, "%s: model '%s' tensor '%s': mmap failed", ti->path, ti->model,
                               ti->name);
  nwc_store_map *m = malloc(sizeof *m);
  const uint8_t *blob = (const uint8_t *)p + skew;
  rc = m ? check_all_chunks(ti, blob) : -ENOMEM;
  if (rc == 0) rc = nwc_store_blob_view(ti, blob, view);
  if (rc < 0) {
    munmap(p, ti->length + skew);
    free(m);
    return rc;
  }
  m->base = p;
  m->len = ti->length + skew;
  *out = m;
  return 0;
}

void nwc_store_unmap(nwc_store_map *m) {
  if (!m) return;
  munmap(m->base, m->len);
  free(m);
}
