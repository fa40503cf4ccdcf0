/*
 * ops.h - the request handlers (ops.c dispatches to ops_catalog.c, ops_load.c, ops_compute.c,
 * ops_ipc.c, ops_status.c, ops_registry.c): each runs on a worker thread, or the loop thread for a quick
 * request, and sends its progress events and one final reply through nwcd_server_send.
 */
#ifndef NWCD_OPS_H
#define NWCD_OPS_H

#include "job.h"

#include <stdbool.h>

/* Runs one job (or a batch) on a worker (nwcd_run_fn). */
void nwcd_ops_run(nwcd_job *j);
/* The pool's batching rule (nwcd_batch_fn): matvecs on the same tensor with the same bias,
 * scale and output kind, up to 8 columns in all, share one decoder pass. */
bool nwcd_ops_can_batch(const nwcd_job *a, unsigned cols, const nwcd_job *b);
/* Drops the pulls that stopped part way (their temporary files): before the store closes. */
struct nwcd;
void nwcd_registry_free(struct nwcd *d);

#endif
