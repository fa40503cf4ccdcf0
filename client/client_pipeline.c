/*
 * client_pipeline.c - libnwc-client's pipelining: nwc_client_submit_* sends a request and
 * records a ticket, nwc_client_wait / _wait_any read frames until a ticket is done (client.c's
 * reads complete whichever ticket a frame belongs to).
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

/* Sends req (inline both ways, cap bytes of output into out) as a ticket.  Caller holds c->lock. */
static int submit(nwc_client *c, nwc_proto_req *req, void *out, size_t cap, uint64_t *id) {
  if (c->broken) return nwc__client_fail(-ENOTCONN, "the connection to nwcd was lost");
  if (cap > NWC_PROTO_MAX_PAYLOAD - 64 || cap > MAX_TICKET_BYTES)
    return nwc__client_fail(-E2BIG,
                            "a pipelined output of %zu bytes is larger than a frame (%u); use the "
                            "synchronous call",
                            cap, NWC_PROTO_MAX_PAYLOAD - 64);
  if (c->ntickets == MAX_TICKETS)
    return nwc__client_fail(-EBUSY, "%u tickets outstanding: collect some with nwc_client_wait",
                            MAX_TICKETS);
  while (c->ticket_bytes + cap > MAX_TICKET_BYTES) { /* let replies in flight drain first */
    nwc_proto_hdr h;
    int rc = nwc__client_read(c, &h);
    if (rc < 0) return rc;
  }
  req->id = ++c->next_id;
  nwc_pw w;
  nwc_pw_init(&w);
  int64_t n = nwc_proto_req_encode(req, &w);
  int rc = n < 0
               ? nwc__client_fail((int)n, "request too large for one frame (%s)", strerror((int)-n))
               : nwc__client_send(c, w.buf, (size_t)n, NULL, 0);
  nwc_pw_free(&w);
  if (rc < 0) return rc;
  c->tickets[c->ntickets++] = (pending){req->id, out, cap, false, 0, 0, NULL};
  c->ticket_bytes += cap;
  *id = req->id;
  return 0;
}

int nwc_client_submit_matvec(nwc_client *c, const char *model, const char *tensor,
                             const char *bias, float scale, const float *x, uint64_t K,
                             unsigned ncols, unsigned flags, void *y, size_t cap,
                             uint64_t *ticket) {
  if (nwc__client_check_matvec(model, tensor, x, K, ncols, y, NWC_CLIENT_MAX_COLS) < 0)
    return -EINVAL;
  if (!ticket) return nwc__client_fail(-EINVAL, "bad arguments (no ticket)");
  nwc_proto_req req;
  nwc__client_matvec_req(&req, model, tensor, bias, scale, x, K, ncols, flags);
  if (req.x_bytes > NWC_PROTO_MAX_PAYLOAD - 4096)
    return nwc__client_fail(
        -E2BIG, "a pipelined x of %llu bytes is larger than a frame; use nwc_client_matvec",
        (unsigned long long)req.x_bytes);
  return LOCKED(c, submit(c, &req, y, cap, ticket));
}

int nwc_client_submit_gather(nwc_client *c, const char *model, const char *tensor,
                             const uint64_t *rows, size_t n, unsigned flags, void *out, size_t cap,
                             uint64_t *ticket) {
  if (nwc__client_check_names(model, tensor) < 0 || !tensor || !out || !ticket)
    return nwc__client_fail(-EINVAL, "bad arguments");
  nwc_proto_req req;
  uint8_t *idx;
  int rc = nwc__client_dq_req(&req, NWC_OP_GATHER, model, tensor, rows, n, flags, &idx);
  if (rc == 0) rc = LOCKED(c, submit(c, &req, out, cap, ticket));
  free(idx);
  return rc;
}

/* Hands back ticket t's outcome and frees its slot. */
static int collect(nwc_client *c, pending *t, uint64_t *id, unsigned *rflags) {
  int rc = t->status;
  if (rc < 0) nwc__client_fail(rc, "%s", t->msg ? t->msg : strerror(-rc));
  if (id) *id = t->id;
  if (rflags) *rflags = rc < 0 ? 0 : t->rflags;
  free(t->msg);
  *t = c->tickets[--c->ntickets];
  return rc;
}

static int do_wait(nwc_client *c, uint64_t id, unsigned *rflags) {
  if (!nwc__client_ticket(c, id))
    return nwc__client_fail(-ENOENT, "no ticket %llu (never submitted, or collected already)",
                            (unsigned long long)id);
  pending *t;
  while (!(t = nwc__client_ticket(c, id))->done) {
    nwc_proto_hdr h;
    nwc__client_read(c, &h); /* a lost connection completes every ticket with its error */
  }
  return collect(c, t, NULL, rflags);
}

static int do_wait_any(nwc_client *c, uint64_t *id, unsigned *rflags) {
  if (!c->ntickets) return nwc__client_fail(-ENOENT, "no tickets outstanding");
  for (;;) {
    pending *oldest = NULL;
    for (unsigned i = 0; i < c->ntickets; i++)
      if (c->tickets[i].done && (!oldest || c->tickets[i].id < oldest->id)) oldest = &c->tickets[i];
    if (oldest) return collect(c, oldest, id, rflags);
    nwc_proto_hdr h;
    nwc__client_read(c, &h);
  }
}

int nwc_client_wait(nwc_client *c, uint64_t ticket, unsigned *rflags) {
  return LOCKED(c, do_wait(c, ticket, rflags));
}

int nwc_client_wait_any(nwc_client *c, uint64_t *ticket, unsigned *rflags) {
  return LOCKED(c, do_wait_any(c, ticket, rflags));
}
