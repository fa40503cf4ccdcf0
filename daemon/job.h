/*
 * job.h - one request on its way through nwcd: the server (server.c) decodes a frame into a job,
 * a worker (pool.c) or the loop thread runs it (ops.h), and its final reply, sent through
 * nwcd_server_send, hands it back to the server, which frees it.
 */
#ifndef NWCD_JOB_H
#define NWCD_JOB_H

#include "nwc_proto.h"

#include <stdbool.h>
#include <stdint.h>

struct nwcd;
struct nwcd_conn;
typedef struct nwcd_job {
  struct nwcd_job *next;
  struct nwcd_job *batch;    /* further matvec jobs sharing this one's pass */
  struct nwcd *d;
  struct nwcd_conn *conn;    /* referenced for the job's life */
  uint8_t *shm;              /* the connection's shared region (or NULL), size shm_size */
  uint64_t shm_size;
  nwc_proto_req req;         /* rows, x point into payload */
  uint8_t *payload;          /* owned */
  int fds[NWC_PROTO_MAX_FILES + 1];
  unsigned nfds;             /* owned descriptors (closed when the job is freed) */
  uint64_t started_ns;
  bool alone;                /* its final reply carries NWC_PF_ALONE (server.c: quiet) */
} nwcd_job;

#endif
