/*
 * map.c - libnwc-client's mappings (nwc_client.h, "mappings"): a resident tensor that nwcd
 * shares as a sealed memfd, mapped read-only here, and the store/ decoders run on it in this
 * process (dequant, gather, matvec) with no round trip per call.
 *
 * Design: nwc_client_map makes a socketpair, passes one end with the map request and keeps the
 * other.  nwcd sends the memfd over the passed end before it replies with the decoder
 * parameters, so the memfd is waiting when the reply arrives.  The kept end is the mapping's
 * reference in the daemon: nwc_client_unmap closes it (as does this process's exit), and only
 * then may nwcd evict the tensor.  The memfd (kept open for the caller: nwc_client_map_info)
 * must be sealed against shrinking and writes (so that nobody can truncate it under us or
 * change the weights); it is mapped PROT_READ MAP_SHARED, and its blob header is checked
 * against the parameters and the tensor validated (nwc_store_blob_view), so the decoders never
 * read outside the mapping whatever the daemon sent.  A mapping is immutable once made: its compute calls share nothing and may run from
 * any number of threads at once, and it does not depend on the nwc_client it came from.
 */
#include "client_internal.h"

#include "nwc.h"
#include "nwc_error.h"
#include "nwc_store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

struct nwc_client_mapping {
  nwc_tensor t; /* a view into base */
  void *base;
  int sock;     /* our end of the socketpair: the daemon's reference */
  nwc_client_map_info info;
};

/* Maps the memfd read-only after checking its seals and size. */
static int map_memfd(int fd, uint64_t size, void **base) {
  struct stat st;
  int seals = fcntl(fd, F_GET_SEALS);
  int need = F_SEAL_SHRINK | F_SEAL_GROW;
  if (fstat(fd, &st) < 0 || seals < 0 || (seals & need) != need ||
      !(seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)))
    return nwc__client_fail(-EPERM, "the tensor's memfd is not sealed against writes and resizing");
  if (size < 4096 || size % 4096 || (uint64_t)st.st_size < size) /* copies are whole pages */
    return nwc__client_fail(-EBADMSG,
                            "the reply's size %llu is not whole pages within the tensor's memfd "
                            "of %lld bytes",
                            (unsigned long long)size, (long long)st.st_size);
  *base = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
  if (*base == MAP_FAILED)
    return nwc__client_fail(-errno, "mmap of the tensor: %s", strerror(errno));
  return 0;
}

/* The view of the mapped blob: the blob header must agree with the reply's parameters. */
static int map_view(nwc_client_mapping *m, const char *model, const char *tensor,
                    const nwc_proto_map *p) {
  char path[] = "(memfd from nwcd)";
  nwc_tensor_info ti = {
      .model = (char *)model, .name = (char *)tensor, .path = path,
      .elem = p->elem, .rows = p->rows, .cols = p->cols, .container = p->container,
      .length = p->length, .format_version = p->format_version, .nblocks = p->nblocks,
      .data_bytes = p->data_bytes, .raw_plane_bytes = p->raw_plane_bytes,
      .off_bases = p->off_bases, .off_hdr = p->off_hdr, .off_data = p->off_data,
      .off_raw = p->off_raw, .off_scale = p->off_scale};
  memcpy(ti.psym, p->psym, 16);
  int rc = nwc_store_blob_view(&ti, m->base, &m->t);
  return rc < 0 ? nwc__client_fail(rc, "%s", nwc_error_detail()) : 0;
}

int nwc__client_map_call(nwc_client *c, nwc_proto_req *req, int *keep, uint8_t **payload,
                         size_t *len) {
  int sv[2];
  *keep = -1, *payload = NULL, *len = 0;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
    return nwc__client_fail(-errno, "socketpair: %s", strerror(errno));
  int rc = nwc__client_call(c, req, &sv[1], 1, payload, len);
  close(sv[1]); /* the daemon holds its own copy now */
  if (rc < 0) {
    close(sv[0]);
    free(*payload), *payload = NULL;
    return rc;
  }
  *keep = sv[0];
  return 0;
}

int nwc_client_map(nwc_client *c, const char *model, const char *tensor,
                   nwc_client_mapping **out) {
  *out = NULL;
  if (!c || !model || !tensor || strlen(model) >= NWC_PROTO_NAME_MAX ||
      strlen(tensor) >= NWC_PROTO_NAME_MAX)
    return nwc__client_fail(-EINVAL, "bad arguments");
  nwc_proto_req req = {0};
  nwc__client_names(&req, NWC_OP_MAP, model, tensor);
  uint8_t *payload = NULL;
  size_t len = 0;
  int sock = -1, rc = 0;
  NWC_TRY(nwc__client_map_call(c, &req, &sock, &payload, &len));
  nwc_proto_map p = {0};
  nwc_pr r;
  nwc_pr_init(&r, payload, len);
  if (nwc_proto_get_map(&r, &p) < 0 || nwc_pr_end(&r, "map") < 0)
    rc = nwc__client_fail(-EBADMSG, "malformed map reply from nwcd: %s", nwc_error_detail());
  free(payload);
  nwc_client_mapping *m = NULL;
  int fd = -1;
  if (rc == 0 && (rc = nwc_proto_map_recv(sock, req.id, &fd)) < 0)
    rc = nwc__client_fail(rc, "%s", nwc_error_detail());
  if (rc == 0 && !(m = calloc(1, sizeof *m))) rc = nwc__client_fail(-ENOMEM, "out of memory");
  if (rc == 0) {
    m->base = MAP_FAILED;
    rc = map_memfd(fd, p.size, &m->base);
  }
  if (rc == 0) rc = map_view(m, model, tensor, &p);
  if (rc < 0) {
    if (m && m->base != MAP_FAILED) munmap(m->base, p.size);
    free(m);
    if (fd >= 0) close(fd);
    close(sock);
    return rc;
  }
  m->sock = sock;
  m->info = (nwc_client_map_info){p.rows, p.cols, p.elem, m->base, p.size, fd, p.maps, p.locked};
  *out = m;
  return 0;
}

void nwc_client_unmap(nwc_client_mapping *m) {
  if (!m) return;
  munmap(m->base, m->info.size);
  close(m->info.fd);
  close(m->sock);
  free(m);
}

const nwc_client_map_info *nwc_client_mapping_info(const nwc_client_mapping *m) {
  return &m->info;
}

static size_t esize(unsigned flags) { return flags & NWC_CLIENT_BF16 ? 2 : 4; }

static int check_cap(uint64_t n, uint64_t cols, unsigned flags, size_t cap) {
  if (n * cols * esize(flags) > cap)
    return nwc__client_fail(-ENOSPC, "the output takes %llu bytes, the buffer holds %zu",
                            (unsigned long long)(n * cols * esize(flags)), cap);
  return 0;
}

/* Row i of n decoded rows (stride K16) to out as dense rows of K, BF16 or float. */
static void put_rows(const uint16_t *dec, uint64_t n, uint64_t K, uint64_t K16, unsigned flags,
                     void *out) {
  uint8_t *o = out;
  for (uint64_t i = 0; i < n; i++, o += K * esize(flags)) {
    const uint16_t *s = dec + i * K16;
    if (flags & NWC_CLIENT_BF16) {
      memcpy(o, s, K * 2);
      continue;
    }
    for (uint64_t k = 0; k < K; k++) {
      float v = nwc_bf16_to_f32(s[k]);
      memcpy(o + 4 * k, &v, 4);
    }
  }
}

static uint64_t k16(uint64_t K) { return (K + 15) & ~UINT64_C(15); }

int nwc_client_map_dequant_rows(const nwc_client_mapping *m, uint64_t row0, uint64_t nrows,
                                unsigned flags, void *out, size_t cap) {
  if (!m || !out) return nwc__client_fail(-EINVAL, "bad arguments");
  const nwc_tensor *t = &m->t;
  uint64_t M = t->rows, K = t->cols, br = NWC_LAYOUT_BLOCK_ROWS(t->elem);
  if (row0 > M || nrows > M - row0)
    return nwc__client_fail(-EINVAL, "rows %llu..%llu of %llu", (unsigned long long)row0,
                            (unsigned long long)(row0 + nrows), (unsigned long long)M);
  int rc = check_cap(nrows, K, flags, cap);
  if (rc < 0 || nrows == 0) return rc;
  /* Bands of row blocks (about 4 MiB of decoded rows) through a scratch buffer; of each band the
   * rows inside [row0, end). */
  const uint64_t end = row0 + nrows, rb_end = (end + br - 1) / br;
  const uint64_t band = (UINT64_C(4) << 20) / (2 * k16(K) * br) + 1;
  uint16_t *dec = malloc(band * br * k16(K) * 2);
  if (!dec) return nwc__client_fail(-ENOMEM, "out of memory");
  for (uint64_t rb = row0 / br; rb < rb_end; rb += band) {
    const uint64_t rb1 = rb + band < rb_end ? rb + band : rb_end;
    const uint64_t r0 = rb * br > row0 ? rb * br : row0, r1 = rb1 * br < end ? rb1 * br : end;
    if ((rc = nwc_dequant_range(t, rb, rb1, dec)) < 0) break;
    put_rows(dec + (r0 - rb * br) * k16(K), r1 - r0, K, k16(K), flags,
             (uint8_t *)out + (r0 - row0) * K * esize(flags));
  }
  free(dec);
  return rc < 0 ? nwc__client_fail(rc, "dequant: %s", nwc_error_detail()) : 0;
}

int nwc_client_map_dequant(const nwc_client_mapping *m, unsigned flags, void *out, size_t cap) {
  return nwc_client_map_dequant_rows(m, 0, m ? m->t.rows : 0, flags, out, cap);
}

int nwc_client_map_gather(const nwc_client_mapping *m, const uint64_t *rows, size_t n,
                          unsigned flags, void *out, size_t cap) {
  if (!m || !rows || !n || !out) return nwc__client_fail(-EINVAL, "bad arguments");
  const nwc_tensor *t = &m->t;
  for (size_t i = 0; i < n; i++)
    if (rows[i] >= t->rows)
      return nwc__client_fail(-EINVAL, "row %llu is out of range (%llu rows)",
                              (unsigned long long)rows[i], (unsigned long long)t->rows);
  int rc = check_cap(n, t->cols, flags, cap);
  if (rc < 0) return rc;
  uint16_t *dec = malloc(n * k16(t->cols) * 2);
  if (!dec) return nwc__client_fail(-ENOMEM, "out of memory");
  rc = nwc_gather(t, rows, n, dec);
  if (rc == 0) put_rows(dec, n, t->cols, k16(t->cols), flags, out);
  free(dec);
  return rc < 0 ? nwc__client_fail(rc, "gather: %s", nwc_error_detail()) : 0;
}

int nwc_client_map_matvec(const nwc_client_mapping *m, const float *bias, float scale,
                          const float *x, unsigned ncols, unsigned flags, void *y, size_t cap) {
  if (!m || !x || !ncols || !y) return nwc__client_fail(-EINVAL, "bad arguments");
  const nwc_tensor *t = &m->t;
  uint64_t M = t->rows, K = t->cols;
  int rc = check_cap(ncols, M, flags, cap);
  if (rc < 0) return rc;
  float *Y = malloc((size_t)ncols * M * 4);
  if (!Y) return nwc__client_fail(-ENOMEM, "out of memory");
  for (unsigned c = 0; rc == 0 && c < ncols; c += 8) /* one decoder pass per 8 columns */
    rc = nwc_matvec_batch(t, x + (size_t)c * K, ncols - c < 8 ? ncols - c : 8, K, NULL,
                          Y + (size_t)c * M, M, NULL);
  for (size_t i = 0; rc == 0 && i < (size_t)ncols * M; i++) {
    float v = scale * Y[i] + (bias ? bias[i % M] : 0.0f);
    if (flags & NWC_CLIENT_BF16) {
      uint16_t h = nwc_f32_to_bf16(v);
      memcpy((uint8_t *)y + 2 * i, &h, 2);
    } else {
      memcpy((uint8_t *)y + 4 * i, &v, 4);
    }
  }
  free(Y);
  return rc < 0 ? nwc__client_fail(rc, "matvec: %s", nwc_error_detail()) : 0;
}
