/*
 * ops.c - the request handlers' dispatch: each request runs on a worker thread (or the loop
 * thread, for a quick one) with its decoded request (job->req) and sends progress events and one
 * final reply through nwcd_server_send(), which frees the job.
 *
 * Design: every handler returns 0 after sending its reply, or a negative errno, in which case
 * nwcd_ops_run() sends the error reply with nwc_error_detail() as the message; so a handler
 * checks outside input with NWC_RETURN_IF and never aborts.  The handlers, one file per kind
 * (ops_internal.h): ops_catalog.c, ops_load.c, ops_compute.c, ops_ipc.c, ops_status.c,
 * ops_registry.c; their
 * replies: ops_reply.c.
 */
#include "ops.h"
#include "ops_internal.h"
#include "server.h"

#include "nwc_error.h"

#include <errno.h>

/* Requests whose only effect is their reply (or, for the shared-memory ones, the client's own
 * memory): a client that has gone would never see their work, so it is skipped.  A client that
 * vanishes with dozens of large requests read and held (server.c, Back-pressure) thus costs the
 * others nothing.  Requests that change the store or residency run regardless. */
static bool answer_only(uint16_t op) {
  switch (op) {
    case NWC_OP_MODELS: case NWC_OP_TENSORS: case NWC_OP_INFO: case NWC_OP_DEQUANT:
    case NWC_OP_GATHER: case NWC_OP_MATVEC: case NWC_OP_MATVEC_IPC: case NWC_OP_DEQUANT_IPC:
    case NWC_OP_STATS: case NWC_OP_PS: case NWC_OP_DEVICES: return true;
    default: return false;
  }
}

void nwcd_ops_run(nwcd_job *j) {
  const nwcd_job_admit a = nwcd_server_admit(j);
  if (a == NWCD_JOB_HELD) return; /* a client not reading its replies: not now */
  if (a == NWCD_JOB_GONE && answer_only(j->req.op)) {
    nwcd_server_send(j, NULL, 0, true); /* ends the job, answering no one */
    return;
  }
  int rc;
  switch (j->req.op) {
    case NWC_OP_MODELS: rc = nwcd_op_models(j); break;
    case NWC_OP_TENSORS: rc = nwcd_op_tensors(j); break;
    case NWC_OP_INFO: rc = nwcd_op_info(j); break;
    case NWC_OP_IMPORT:
    case NWC_OP_IMPORT2: rc = nwcd_op_import(j); break;
    case NWC_OP_REMOVE: rc = nwcd_op_remove(j); break;
    case NWC_OP_LOAD:
    case NWC_OP_EVICT:
    case NWC_OP_PIN:
    case NWC_OP_UNPIN:
    case NWC_OP_LOAD_ON:
    case NWC_OP_EVICT_ON:
    case NWC_OP_LOAD_PLACES: rc = nwcd_op_residency(j); break;
    case NWC_OP_DEQUANT:
    case NWC_OP_GATHER: rc = nwcd_op_dequant_gather(j); break;
    case NWC_OP_MATVEC: nwcd_op_matvec(j); return;
    case NWC_OP_MATVEC_IPC:
    case NWC_OP_DEQUANT_IPC: rc = nwcd_op_ipc(j); break;
    case NWC_OP_VERIFY: rc = nwcd_op_verify(j); break;
    case NWC_OP_STATS: rc = nwcd_op_stats(j); break;
    case NWC_OP_PS: rc = nwcd_op_ps(j); break;
    case NWC_OP_DEVICES: rc = nwcd_op_devices(j); break;
    case NWC_OP_MAP: rc = nwcd_op_map(j); break;
    case NWC_OP_MAP_GPU: rc = nwcd_op_map_gpu(j); break;
    case NWC_OP_PULL: rc = nwcd_op_pull(j); break;
    case NWC_OP_PUSH: rc = nwcd_op_push(j); break;
    default: rc = nwc__fail(-EOPNOTSUPP, "opcode %u is not served here", j->req.op); break;
  }
  if (rc < 0) nwcd_reply_error(j, rc);
}
