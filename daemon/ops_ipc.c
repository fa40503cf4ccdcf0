/*
 * ops_ipc.c - CUDA IPC: matvec and dequant into the client's own device memory (the backend's
 * dev_matvec_ipc and dev_dequant_ipc), on a tensor that lives on a device.
 */
#include "ops_internal.h"

#include "nwcd.h"

#include "nwc_error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* matvec_ipc and dequant_ipc: the tensor must live on a device (loaded there if absent). */
int nwcd_op_ipc(nwcd_job *j) {
  nwcd *d = j->d;
  nwc_proto_req *r = &j->req;
  NWC_RETURN_IF(!d->backend->dev_matvec_ipc, -EOPNOTSUPP,
                "%s needs the cuda backend (this daemon runs %s)", nwc_proto_op_name(r->op),
                d->backend->name);
  nwcd_ref ref;
  NWC_TRY(nwcd_res_acquire(d->res, r->model, r->tensor, 0, &ref, NULL));
  const nwc_tensor *t = &ref.view;
  uint64_t M = t->rows, K = t->cols, esz = r->out == NWC_OUT_BF16 ? 2 : 4;
  int rc = ref.dcopy ? 0
                     : nwc__fail(-ENOTSUP, "%s/%s is used from host memory, its home: load it "
                                 "onto a GPU (nwcctl load --device cuda:0), which makes that its "
                                 "home", r->model, r->tensor);
  float *bias = NULL;
  nwc_proto_compute c = {.out = r->out, .where = NWC_WHERE_DEVICE};
  const uint8_t *ev = r->has_event ? r->ipc_event : NULL;
  nwcd_ipc_buf y = {{0}, r->out_off, r->out_cap};
  memcpy(y.handle, r->ipc_y, sizeof y.handle);
  if (rc == 0 && r->op == NWC_OP_MATVEC_IPC) {
    rc = nwcd_check_x(r, K);
    if (rc == 0) rc = nwcd_bias_vector(d, r, M, &bias);
    nwcd_ipc_buf x = {{0}, r->in_off, r->x_bytes};
    memcpy(x.handle, r->ipc_x, sizeof x.handle);
    if (rc == 0)
      rc = d->backend->dev_matvec_ipc(j->conn, ref.dcopy, &x, &y, r->ncols, r->scale, bias,
                                      r->out == NWC_OUT_BF16, ev);
    c.rows = r->ncols, c.cols = M, c.bytes = (uint64_t)r->ncols * M * esz;
  } else if (rc == 0) {
    rc = d->backend->dev_dequant_ipc(j->conn, ref.dcopy, &y, r->out == NWC_OUT_BF16, ev);
    c.rows = M, c.cols = K, c.bytes = M * K * esz;
  }
  free(bias);
  nwcd_res_release(d->res, &ref);
  if (rc < 0) return rc;
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_put_compute(&w, &c);
  nwcd_reply(j, &w);
  return 0;
}
