/*
 * client_cuda.c - libnwc-client's CUDA IPC: matvec and dequant into the caller's own device
 * memory, passed as cudaIpcMemHandle_t bytes (nwc_client_cuda_buf), with an optional IPC event
 * nwcd waits for before it reads.
 */
#include "client_internal.h"
#include "nwc_client.h"

#include "nwc_proto.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static int do_cuda(nwc_client *c, nwc_proto_req *req, const nwc_client_cuda_buf *x,
                   const nwc_client_cuda_buf *y, const void *event, nwc_proto_compute *pc) {
  if (x) {
    memcpy(req->ipc_x, x->handle, NWC_PROTO_IPC_HANDLE);
    req->in_off = x->offset;
    if (x->bytes < req->x_bytes)
      return nwc__client_fail(-EINVAL, "x buffer of %llu bytes; %u columns of K floats need %llu",
                              (unsigned long long)x->bytes, req->ncols,
                              (unsigned long long)req->x_bytes);
  }
  memcpy(req->ipc_y, y->handle, NWC_PROTO_IPC_HANDLE);
  req->out_off = y->offset, req->out_cap = y->bytes;
  if (event) memcpy(req->ipc_event, event, NWC_PROTO_IPC_HANDLE), req->has_event = 1;
  size_t len;
  int rc = nwc__client_request(c, req, NULL, 0, NULL, NULL, &len);
  if (rc < 0) return rc;
  nwc_pr r;
  nwc_pr_init(&r, c->rbuf, len);
  if (nwc_proto_get_compute(&r, pc) < 0 || nwc_pr_end(&r, "compute") < 0 ||
      pc->where != NWC_WHERE_DEVICE)
    return nwc__client_bad_reply();
  return 0;
}

static int do_matvec_cuda(nwc_client *c, const char *model, const char *tensor, const char *bias,
                          float scale, const nwc_client_cuda_buf *x, uint64_t K, unsigned ncols,
                          const nwc_client_cuda_buf *y, unsigned flags, const void *event) {
  nwc_proto_req req;
  nwc__client_matvec_req(&req, model, tensor, bias, scale, NULL, K, ncols, flags);
  req.op = NWC_OP_MATVEC_IPC;
  nwc_proto_compute pc;
  return do_cuda(c, &req, x, y, event, &pc);
}

int nwc_client_matvec_cuda(nwc_client *c, const char *model, const char *tensor, const char *bias,
                           float scale, const nwc_client_cuda_buf *x, uint64_t K, unsigned ncols,
                           const nwc_client_cuda_buf *y, unsigned flags, const void *event) {
  if (nwc__client_check_names(model, tensor) < 0 || !tensor || !x || !y || !ncols || !K ||
      ncols > NWC_PROTO_MAX_COLS)
    return nwc__client_fail(-EINVAL,
                            "bad arguments (1..%u columns of K > 0 floats, buffers required)",
                            NWC_PROTO_MAX_COLS);
  return LOCKED(c, do_matvec_cuda(c, model, tensor, bias, scale, x, K, ncols, y, flags, event));
}

static int do_dequant_cuda(nwc_client *c, const char *model, const char *tensor, unsigned flags,
                           const nwc_client_cuda_buf *out, const void *event, uint64_t *rows,
                           uint64_t *cols) {
  nwc_proto_req req = {0};
  nwc__client_names(&req, NWC_OP_DEQUANT_IPC, model, tensor);
  req.out = flags & NWC_CLIENT_BF16 ? NWC_OUT_BF16 : NWC_OUT_F32;
  nwc_proto_compute pc;
  int rc = do_cuda(c, &req, NULL, out, event, &pc);
  if (rc == 0 && rows) *rows = pc.rows;
  if (rc == 0 && cols) *cols = pc.cols;
  return rc;
}

int nwc_client_dequant_cuda(nwc_client *c, const char *model, const char *tensor, unsigned flags,
                            const nwc_client_cuda_buf *out, const void *event, uint64_t *rows,
                            uint64_t *cols) {
  if (nwc__client_check_names(model, tensor) < 0 || !tensor || !out)
    return nwc__client_fail(-EINVAL, "bad arguments");
  return LOCKED(c, do_dequant_cuda(c, model, tensor, flags, out, event, rows, cols));
}
