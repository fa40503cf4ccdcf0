/*
 * client_compute.c - libnwc-client's dequant, gather and matvec over the socket: output inline
 * up to INLINE_MAX, above it through the shared region (a dequant larger than the region, which
 * does not grow once made, is decoded here from a host map instead); a matvec of any number of
 * columns goes as requests of at most 64 columns each.
 */
#include "client_internal.h"
#include "nwc_client.h"

#include "nwc_proto.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static int place_out(nwc_client *c, nwc_proto_req *req, size_t cap, uint64_t off) {
  req->where = NWC_WHERE_INLINE;
  if (cap <= INLINE_MAX) return 0;
  int rc = nwc__client_shm(c, off + cap);
  if (rc < 0 && rc != -E2BIG) return rc;
  uint64_t avail = c->shm && c->shm_size > off ? c->shm_size - off : 0;
  req->where = NWC_WHERE_SHM, req->out_off = off, req->out_cap = cap < avail ? cap : avail;
  return 0;
}

/* A dequant or gather request (output inline); a gather's row indices go into *idx (malloc'ed,
 * the caller frees it after sending). */
int nwc__client_dq_req(nwc_proto_req *req, int op, const char *model, const char *tensor,
                       const uint64_t *rows, size_t n, unsigned flags, uint8_t **idx) {
  *req = (nwc_proto_req){0};
  *idx = NULL;
  nwc__client_names(req, op, model, tensor);
  req->out = flags & NWC_CLIENT_BF16 ? NWC_OUT_BF16 : NWC_OUT_F32;
  if (op != NWC_OP_GATHER) return 0;
  if (!rows || n == 0 || n > (NWC_PROTO_MAX_PAYLOAD - 4096) / 8)
    return nwc__client_fail(-EINVAL, "gather of %zu rows (1..%u)", n,
                            (NWC_PROTO_MAX_PAYLOAD - 4096) / 8);
  if (!(*idx = malloc(n * 8))) return nwc__client_fail(-ENOMEM, "out of memory");
  for (size_t i = 0; i < n; i++)
    for (int b = 0; b < 8; b++) (*idx)[8 * i + b] = (uint8_t)(rows[i] >> (8 * b));
  req->nrows = (uint32_t)n, req->rows = *idx;
  return 0;
}

static int do_dequant_gather(nwc_client *c, int op, const char *model, const char *tensor,
                             const uint64_t *rows, size_t n, unsigned flags, void *out, size_t cap,
                             uint64_t *orows, uint64_t *ocols, unsigned *rflags) {
  nwc_proto_req req;
  uint8_t *idx;
  int rc = nwc__client_dq_req(&req, op, model, tensor, rows, n, flags, &idx);
  if (rc == 0) rc = place_out(c, &req, cap, 0);
  size_t len;
  if (rc == 0) rc = nwc__client_request(c, &req, NULL, 0, NULL, NULL, &len);
  free(idx);
  if (rc < 0) return rc;
  nwc_proto_compute pc;
  if ((rc = nwc__client_compute_reply(c, len, out, cap, 0, &pc)) < 0) return rc;
  if (orows) *orows = pc.rows;
  if (ocols) *ocols = pc.cols;
  if (rflags) *rflags = pc.rflags;
  return 0;
}

/* The connection's shared region's size (0: none yet; it does not grow once made). */
static int region_size(nwc_client *c, uint64_t *size) {
  *size = c->shm ? c->shm_size : 0;
  return 0;
}

/* The whole tensor decoded here from a host map (nwc_client_map: the daemon's resident copy). */
static int dequant_mapped(nwc_client *c, const char *model, const char *tensor, unsigned flags,
                          void *out, size_t cap, uint64_t *rows, uint64_t *cols, unsigned *rflags) {
  nwc_client_mapping *m;
  int rc = nwc_client_map(c, model, tensor, &m);
  if (rc < 0) return rc;
  const nwc_client_map_info *i = nwc_client_mapping_info(m);
  if (rows) *rows = i->rows;
  if (cols) *cols = i->cols;
  if (rflags) *rflags = 0;
  rc = nwc_client_map_dequant(m, flags, out, cap);
  nwc_client_unmap(m);
  return rc;
}

int nwc_client_dequant(nwc_client *c, const char *model, const char *tensor, unsigned flags,
                       void *out, size_t cap, uint64_t *rows, uint64_t *cols, unsigned *rflags) {
  if (nwc__client_check_names(model, tensor) < 0 || !tensor)
    return nwc__client_fail(-EINVAL, "bad arguments");
  /* A buffer larger than the region (made smaller by an earlier call) may be for an output that
   * outgrows it: then the tensor is decoded here, from a host map. */
  uint64_t region;
  LOCKED(c, region_size(c, &region));
  if (region && cap > region) {
    nwc_client_tensor_info ti;
    int rc = nwc_client_info(c, model, tensor, &ti);
    if (rc < 0) return rc;
    if (ti.t.rows * ti.t.cols * (flags & NWC_CLIENT_BF16 ? 2 : 4) > region)
      return dequant_mapped(c, model, tensor, flags, out, cap, rows, cols, rflags);
  }
  return LOCKED(c, do_dequant_gather(c, NWC_OP_DEQUANT, model, tensor, NULL, 0, flags, out, cap,
                                     rows, cols, rflags));
}

int nwc_client_gather(nwc_client *c, const char *model, const char *tensor, const uint64_t *rows,
                      size_t n, unsigned flags, void *out, size_t cap, uint64_t *cols,
                      unsigned *rflags) {
  if (nwc__client_check_names(model, tensor) < 0 || !tensor)
    return nwc__client_fail(-EINVAL, "bad arguments");
  return LOCKED(c, do_dequant_gather(c, NWC_OP_GATHER, model, tensor, rows, n, flags, out, cap,
                                     NULL, cols, rflags));
}

/* A matvec request, x inline (matvec_ipc: x NULL, then the op changed). */
void nwc__client_matvec_req(nwc_proto_req *req, const char *model, const char *tensor,
                            const char *bias, float scale, const float *x, uint64_t K,
                            unsigned ncols, unsigned flags) {
  *req = (nwc_proto_req){0};
  nwc__client_names(req, NWC_OP_MATVEC, model, tensor);
  snprintf(req->bias, sizeof req->bias, "%s", bias ? bias : "");
  req->scale = scale, req->ncols = ncols;
  req->out = flags & NWC_CLIENT_BF16 ? NWC_OUT_BF16 : NWC_OUT_F32;
  req->x_bytes = (uint64_t)ncols * K * 4;
  req->x = (const uint8_t *)x; /* little-endian floats: the host's order on our targets */
}

/* x and y travel through the shared region when x is over a frame's worth, and always (unless
 * NWC_CLIENT_INLINE) with a daemon that moves them straight between the region and its GPU
 * (NWC_CAP_SHM_DEVICE): the frames then carry a few dozen bytes, and nothing is copied on its
 * side.  x goes at offset 0, y after it (64-aligned). */
static int do_matvec(nwc_client *c, const char *model, const char *tensor, const char *bias,
                     float scale, const float *x, uint64_t K, unsigned ncols, unsigned flags,
                     void *y, size_t cap, unsigned *rflags, uint64_t *bytes) {
  nwc_proto_req req;
  nwc__client_matvec_req(&req, model, tensor, bias, scale, x, K, ncols, flags);
  int rc = 0;
  uint64_t yoff = 0;
  bool device = !(flags & NWC_CLIENT_INLINE) && (c->hello.caps & NWC_CAP_SHM_DEVICE);
  if (req.x_bytes > INLINE_MAX || (device && cap <= INLINE_MAX)) {
    yoff = (req.x_bytes + 63) & ~63ull;
    if ((rc = nwc__client_shm(c, yoff + cap)) < 0) return rc;
    memcpy(c->shm, x, req.x_bytes);
    req.where = NWC_WHERE_SHM, req.in_off = 0;
    req.out_off = yoff, req.out_cap = cap;
    req.x = NULL;
  } else {
    if ((rc = place_out(c, &req, cap, 0)) < 0) return rc;
    if (req.where == NWC_WHERE_SHM) {
      /* x inline but y in the region: the daemon takes one placement for both. */
      memcpy(c->shm, x, req.x_bytes);
      yoff = (req.x_bytes + 63) & ~63ull;
      req.in_off = 0, req.out_off = yoff;
      req.out_cap = cap < c->shm_size - yoff ? cap : c->shm_size - yoff;
      req.x = NULL;
    }
  }
  size_t len;
  if ((rc = nwc__client_request(c, &req, NULL, 0, NULL, NULL, &len)) < 0) return rc;
  nwc_proto_compute pc = {0};
  rc = nwc__client_compute_reply(c, len, y, cap, yoff, &pc);
  *bytes = pc.bytes; /* also for -ENOSPC: what the output takes */
  if (rc < 0) return rc;
  *rflags = pc.rflags;
  return 0;
}

_Static_assert(NWC_CLIENT_MAX_COLS == NWC_PROTO_MAX_COLS, "the header's limit is the protocol's");

/* A matvec of any number of columns: requests of at most NWC_CLIENT_MAX_COLS each, their outputs
 * back to back in y (column c at c x M); *rflags gets every request's flags. */
static int do_matvec_cols(nwc_client *c, const char *model, const char *tensor, const char *bias,
                          float scale, const float *x, uint64_t K, unsigned ncols, unsigned flags,
                          void *y, size_t cap, unsigned *rflags) {
  unsigned all = 0;
  size_t done = 0;
  for (unsigned c0 = 0, n; c0 < ncols; c0 += n) {
    n = ncols - c0 < NWC_CLIENT_MAX_COLS ? ncols - c0 : NWC_CLIENT_MAX_COLS;
    unsigned rf = 0;
    uint64_t bytes = 0;
    int rc = do_matvec(c, model, tensor, bias, scale, x + (size_t)c0 * K, K, n, flags,
                       (uint8_t *)y + done, cap - done, &rf, &bytes);
    uint64_t need = bytes / n * ncols; /* every request's output has n columns of M */
    if (n < ncols && bytes && (rc == -ENOSPC || (c0 == 0 && need > cap)))
      return nwc__client_fail(-ENOSPC,
                              "the output takes %llu bytes (%u columns), the buffer holds %zu",
                              (unsigned long long)need, ncols, cap);
    if (rc < 0) return rc;
    all |= rf, done += bytes;
  }
  if (rflags) *rflags = all;
  return 0;
}

int nwc__client_check_matvec(const char *model, const char *tensor, const float *x, uint64_t K,
                             unsigned ncols, const void *y, unsigned max_cols) {
  if (nwc__client_check_names(model, tensor) < 0 || !tensor || !x || !y || !K)
    return nwc__client_fail(-EINVAL, "bad arguments (model, tensor, x, K > 0 and y are required)");
  if (!ncols || ncols > max_cols)
    return nwc__client_fail(-EINVAL, "%u columns: a request takes 1..%u (NWC_CLIENT_MAX_COLS)%s",
                            ncols, max_cols, ncols ? "; nwc_client_matvec takes any number" : "");
  return 0;
}

int nwc_client_matvec(nwc_client *c, const char *model, const char *tensor, const char *bias,
                      float scale, const float *x, uint64_t K, unsigned ncols, unsigned flags,
                      void *y, size_t cap, unsigned *rflags) {
  if (nwc__client_check_matvec(model, tensor, x, K, ncols, y, UINT_MAX) < 0) return -EINVAL;
  return LOCKED(c, do_matvec_cols(c, model, tensor, bias, scale, x, K, ncols, flags, y, cap,
                                  rflags));
}
