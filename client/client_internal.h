/*
 * client_internal.h - what client.c lends the other modules of libnwc-client (map.c); not
 * installed, not exported (the version script exports nwc_client_* only).
 */
#ifndef NWC_CLIENT_INTERNAL_H
#define NWC_CLIENT_INTERNAL_H

#include "nwc_client.h"
#include "nwc_proto.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* One request with nfds descriptors, under the client's lock: sends req (its id is assigned
 * here and left in req->id), waits for the reply and copies its payload into *payload (malloc'ed,
 * the caller frees it; *len bytes).  Returns 0 or the negative errno with the message set. */
int nwc__client_call(nwc_client *c, nwc_proto_req *req, const int *fds, unsigned nfds,
                     uint8_t **payload, size_t *len);
/* Sets this thread's nwc_client_last_error() to msg; returns err. */
int nwc__client_fail(int err, const char *msg);

/* wait.c: how a connection waits for the next frame (see its header for the policy). */
typedef struct nwc_waiter {
  uint32_t spin_us;   /* the longest poll, 0 = always sleep */
  uint32_t window_us; /* the poll of the next wait (adapts between 0 and spin_us) */
} nwc_waiter;
/* spin_us from NWC_CLIENT_SPIN_US, or the default; -EINVAL (message set) if it is malformed. */
int nwc__waiter_init(nwc_waiter *w);
/* nwc_client_set_spin's check and effect. */
int nwc__waiter_set(nwc_waiter *w, unsigned spin_us);
/* recv(fd, buf, len) that polls first, by the policy, if poll (the daemon's last reply said its
 * other clients are quiet); returns what recv returned (errno set on -1; never -1 with EINTR or
 * EAGAIN). */
ssize_t nwc__wait_recv(nwc_waiter *w, bool poll, int fd, void *buf, size_t len);

#endif
