/*
 * client_internal.h - what client.c lends the other modules of libnwc-client (map.c); not
 * installed, not exported (the version script exports nwc_client_* only).
 */
#ifndef NWC_CLIENT_INTERNAL_H
#define NWC_CLIENT_INTERNAL_H

#include "nwc_client.h"
#include "nwc_proto.h"

#include <stddef.h>
#include <stdint.h>

/* One request with nfds descriptors, under the client's lock: sends req (its id is assigned
 * here and left in req->id), waits for the reply and copies its payload into *payload (malloc'ed,
 * the caller frees it; *len bytes).  Returns 0 or the negative errno with the message set. */
int nwc__client_call(nwc_client *c, nwc_proto_req *req, const int *fds, unsigned nfds,
                     uint8_t **payload, size_t *len);
/* Sets this thread's nwc_client_last_error() to msg; returns err. */
int nwc__client_fail(int err, const char *msg);

#endif
