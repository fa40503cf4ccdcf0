/*
 * client_internal.h - what the files of libnwc-client share: the connection (struct nwc_client,
 * client.c's), requests and replies through it, the error line, the request builders of
 * client_compute.c and the waiting policy of wait.c.  Not installed, not exported (the version
 * script exports nwc_client_* only).
 *
 * Every call of the library holds c->lock for its request and reply (LOCKED), so the
 * functions below that take an nwc_client are called with it held, except nwc__client_call,
 * which takes it.
 */
#ifndef NWC_CLIENT_INTERNAL_H
#define NWC_CLIENT_INTERNAL_H

#include "nwc_client.h"
#include "nwc_proto.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* wait.c: how a connection waits for the next frame (see its header for the policy). */
typedef struct nwc_waiter {
  uint32_t spin_us;   /* the longest poll, 0 = always sleep */
  uint32_t window_us; /* the poll of the next wait (adapts between 0 and spin_us) */
} nwc_waiter;
/* spin_us from NWC_CLIENT_SPIN_US, or the default; -EINVAL if it is malformed (the caller says
 * so: wait.c sets no message, so that it needs nothing of client.c). */
int nwc__waiter_init(nwc_waiter *w);
/* nwc_client_set_spin's check (-EINVAL over 1 s, no message set) and effect. */
int nwc__waiter_set(nwc_waiter *w, unsigned spin_us);
/* recv(fd, buf, len) that polls first, by the policy, if poll (the daemon's last reply said its
 * other clients are quiet); returns what recv returned (errno set on -1; never -1 with EINTR or
 * EAGAIN). */
ssize_t nwc__wait_recv(nwc_waiter *w, bool poll, int fd, void *buf, size_t len);

#define INLINE_MAX (1u << 20)
#define SHM_DEFAULT (256ull << 20)

#define IBUF_SIZE (64u << 10)
/* Pipelined requests in flight per connection, and the reply bytes they may bring: below the
 * daemon's per-connection limits (docs/protocol.md), so that it never stops reading us while we
 * are blocked sending to it. */
#define MAX_TICKETS 64
#define MAX_TICKET_BYTES (32ull << 20)

typedef struct pending {
  uint64_t id;
  void *out; /* the caller's output buffer, cap bytes */
  size_t cap;
  bool done;
  int status;     /* 0 or a negative errno */
  unsigned rflags;
  char *msg;      /* the error message (malloc'ed) when status < 0 */
} pending;

struct nwc_client {
  int fd;
  pthread_mutex_t lock;
  uint64_t next_id;
  nwc_proto_hello hello;
  uint8_t *shm;
  uint64_t shm_size;
  uint8_t *rbuf; /* last reply payload */
  size_t rcap;
  uint8_t *ibuf; /* bytes read ahead: ibuf[ioff .. ilen) */
  size_t ioff, ilen;
  pending tickets[MAX_TICKETS];
  unsigned ntickets;
  uint64_t ticket_bytes; /* sum of the caps of tickets not yet done */
  nwc_waiter waiter; /* how reads wait for the next frame (wait.c) */
  bool alone;        /* the last reply said no other client is busy (NWC_PF_ALONE): poll */
  bool broken;     /* a send failed or the daemon ended the connection: later calls fail */
  bool unreadable; /* reading failed or framing was lost: nothing more can be read */
};

/* expr under c's lock (a statement expression: its int value). */
#define LOCKED(c, expr)                                                                          \
  ({                                                                                             \
    pthread_mutex_lock(&(c)->lock);                                                              \
    int rc_ = (expr);                                                                            \
    pthread_mutex_unlock(&(c)->lock);                                                            \
    rc_;                                                                                         \
  })

/* ---- client.c: the connection ------------------------------------------------------------- */

/* Sets this thread's nwc_client_last_error() (printf-style); returns err. */
int nwc__client_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "malformed reply from nwcd": -EBADMSG. */
int nwc__client_bad_reply(void);
/* Sends len bytes with nfds descriptors riding on the first byte: 0 or a negative errno (the
 * connection is then broken). */
int nwc__client_send(nwc_client *c, const uint8_t *buf, size_t len, const int *fds, unsigned nfds);
/* Reads the next frame into c->rbuf (h: its header), completing the ticket it belongs to. */
int nwc__client_read(nwc_client *c, nwc_proto_hdr *h);
/* The ticket with request id, or NULL. */
pending *nwc__client_ticket(nwc_client *c, uint64_t id);
/* Sends req (its id assigned here) and reads frames until its reply, whose payload is left in
 * c->rbuf (*len bytes); progress events go to progress (NULL: none), which may cancel.  0, or
 * the negative errno with the daemon's message (or ours). */
int nwc__client_request(nwc_client *c, nwc_proto_req *req, const int *fds, unsigned nfds,
                        nwc_client_progress_fn progress, void *ctx, size_t *len);
/* Makes sure the shared region holds need bytes (creating and passing it on first use). */
int nwc__client_shm(nwc_client *c, uint64_t need);
/* r's op and names (NULL: ""). */
void nwc__client_names(nwc_proto_req *r, int op, const char *model, const char *tensor);
/* -EINVAL for a missing or too long model name, -ENAMETOOLONG for a too long tensor name. */
int nwc__client_check_names(const char *model, const char *tensor);
/* Reads a compute reply of len bytes in c->rbuf: its output (inline, or at off in the shared
 * region) copied to out (cap bytes), its header into *pc. */
int nwc__client_compute_reply(nwc_client *c, size_t len, void *out, size_t cap, uint64_t off,
                              nwc_proto_compute *pc);

/* ---- client_catalog.c ---------------------------------------------------------------------- */

/* The result record at the head of a reply of len bytes (into *res, which may be NULL); *rest
 * reads what follows it. */
int nwc__client_result(nwc_client *c, size_t len, nwc_client_result *res, nwc_pr *rest);

/* ---- client_compute.c: requests the pipeline and CUDA IPC build the same way --------------- */

/* A dequant or gather request (output inline); a gather's row indices go into *idx (malloc'ed,
 * the caller frees it after sending). */
int nwc__client_dq_req(nwc_proto_req *req, int op, const char *model, const char *tensor,
                       const uint64_t *rows, size_t n, unsigned flags, uint8_t **idx);
/* A matvec request, x inline (matvec_ipc: x NULL, then the op changed). */
void nwc__client_matvec_req(nwc_proto_req *req, const char *model, const char *tensor,
                            const char *bias, float scale, const float *x, uint64_t K,
                            unsigned ncols, unsigned flags);
/* A matvec's arguments: -EINVAL with the message set unless names, x, K > 0 and y are given
 * and 1 <= ncols <= max_cols. */
int nwc__client_check_matvec(const char *model, const char *tensor, const float *x, uint64_t K,
                             unsigned ncols, const void *y, unsigned max_cols);

/* ---- for map.c ----------------------------------------------------------------------------- */

/* One request with nfds descriptors, under the client's lock: sends req (its id is assigned
 * here and left in req->id), waits for the reply and copies its payload into *payload (malloc'ed,
 * the caller frees it; *len bytes).  Returns 0 or the negative errno with the message set. */
int nwc__client_call(nwc_client *c, nwc_proto_req *req, const int *fds, unsigned nfds,
                     uint8_t **payload, size_t *len);
/* A map or map_gpu request: makes a socketpair, sends req with one end (nwc__client_call) and
 * gives the other, the mapping's reference, in *keep (the caller closes it); on failure nothing
 * is kept (*keep -1) and the negative errno is returned with the message set. */
int nwc__client_map_call(nwc_client *c, nwc_proto_req *req, int *keep, uint8_t **payload,
                         size_t *len);


#endif
