/*
 * server.h - nwcd's libuv loop (server.c; design comment there): the listening socket,
 * connections, framing, back-pressure and replies.
 */
#ifndef NWCD_SERVER_H
#define NWCD_SERVER_H

#include "job.h"
#include "nwc_proto.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct nwcd;

/* Binds (or takes systemd's) socket and runs the loop until SIGINT/SIGTERM; the requests in
 * flight finish first.  0, or a negative errno with a detail. */
int nwcd_server_run(struct nwcd *d);
/* Called on the worker: writes a finished frame (buf malloc'ed, ownership passes; NULL: none) to
 * job j's connection, or queues it behind unsent ones; final marks the job's last frame, after
 * which j is freed (do not touch it again). */
void nwcd_server_send(nwcd_job *j, uint8_t *buf, size_t len, bool final);
/* What the worker about to run j may do, decided under one hold of j's connection's output
 * lock: NWCD_JOB_HELD when j's connection (or its uid) has more reply bytes queued than its
 * bound, and j was held on the connection instead, to be submitted again when the queue drains
 * (server.c, Back-pressure; the caller must then leave j alone); NWCD_JOB_GONE when j's client
 * is gone (its connection closed or a write to it failed: no reply of j reaches anyone);
 * NWCD_JOB_RUN otherwise. */
typedef enum { NWCD_JOB_RUN, NWCD_JOB_HELD, NWCD_JOB_GONE } nwcd_job_admit;
nwcd_job_admit nwcd_server_admit(nwcd_job *j);
/* Whether nwcd could listen at path, changing nothing: 0 (nothing there), 1 (a stale socket
 * that listening would replace), or -EEXIST (not a socket), -EADDRINUSE (a daemon answers),
 * -ENAMETOOLONG, another negative errno, with the detail saying which. */
int nwcd_server_probe(const char *path);
/* The server's counters (connections, requests) into s (any thread). */
void nwcd_server_get_stats(struct nwcd *d, nwc_proto_stats *s);

#endif
