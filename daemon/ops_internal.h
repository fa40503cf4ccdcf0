/*
 * ops_internal.h - what the request handlers (ops_*.c) share: the reply and progress helpers
 * (ops_reply.c), the handlers that ops.c dispatches to, and a few checks two of them use.
 * Not for other modules (ops.h is theirs).
 *
 * Every handler returns 0 after sending its reply, or a negative errno, in which case
 * nwcd_ops_run() sends the error reply with nwc_error_detail() as the message.
 */
#ifndef NWCD_OPS_INTERNAL_H
#define NWCD_OPS_INTERNAL_H

#include "job.h"
#include "nwc_proto.h"
#include "nwc_store.h"
#include "residency.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct nwcd;

/* ---- ops_reply.c --------------------------------------------------------------------------- */

/* j's final reply with w's payload (status 0). */
void nwcd_reply(nwcd_job *j, nwc_pw *w);
/* j's final reply with error rc, nwc_error_detail() (or nwc_strerror(rc)) as the message. */
void nwcd_reply_error(nwcd_job *j, int rc);

/* Progress events of one request, at most one per 50 ms unless forced. */
typedef struct nwcd_progress {
  nwcd_job *j;
  uint64_t last_ns;
} nwcd_progress;
void nwcd_send_progress(nwcd_progress *p, uint64_t done, uint64_t total, bool force);

/* ---- handlers ------------------------------------------------------------------------------ */

/* ops_catalog.c */
int nwcd_op_models(nwcd_job *j);
int nwcd_op_tensors(nwcd_job *j);
int nwcd_op_info(nwcd_job *j);
int nwcd_op_import(nwcd_job *j);
int nwcd_op_remove(nwcd_job *j);
/* The tensors of model under the store lock: as nwc_store_tensors, -ENOENT naming the model. */
int nwcd_model_tensors(struct nwcd *d, const char *model, nwc_tensor_info **ti, size_t *n);
/* ops_load.c: load, load_on, evict, pin, unpin of a tensor or a whole model. */
int nwcd_op_residency(nwcd_job *j);
/* ops_compute.c */
int nwcd_op_dequant_gather(nwcd_job *j);
void nwcd_op_matvec(nwcd_job *j); /* replies itself: to each job of the batch */
/* -EINVAL unless r's x is ncols columns of the tensor's K floats. */
int nwcd_check_x(const nwc_proto_req *r, uint64_t K);
/* The request's bias as M floats (*out malloc'ed, NULL without one): 0 or a negative errno. */
int nwcd_bias_vector(struct nwcd *d, const nwc_proto_req *r, uint64_t M, float **out);
/* ops_ipc.c: matvec_ipc and dequant_ipc. */
int nwcd_op_ipc(nwcd_job *j);
/* ops_status.c */
int nwcd_op_verify(nwcd_job *j);
int nwcd_op_stats(nwcd_job *j);
int nwcd_op_ps(nwcd_job *j);
int nwcd_op_devices(nwcd_job *j);
int nwcd_op_map(nwcd_job *j);
int nwcd_op_map_gpu(nwcd_job *j);
/* ops_registry.c: pull and push through an OCI registry. */
typedef struct nwcd_parked nwcd_parked;
int nwcd_op_pull(nwcd_job *j);
int nwcd_op_push(nwcd_job *j);

#endif
