/*
 * client.c - libnwc-client (nwc_client.h): a blocking connection to nwcd, and what every call
 * of the library goes through (client_internal.h): framing, requests, tickets, the shared region.
 *
 * Design: one Unix stream socket per nwc_client, guarded by a mutex held for a whole call
 * (send the request, read frames until the reply with the request's id; progress events on the
 * way go to the caller's callback), so calls from several threads take turns.  Reads are
 * buffered (one recv() usually brings a whole reply; a large payload goes straight into the
 * reply buffer).  Pipelining: nwc_client_submit_*() sends a request and records a ticket (the
 * request id, where its output goes); every read of a frame, by whichever call is reading,
 * completes the ticket it belongs to, so synchronous calls and tickets mix on one connection.
 * Descriptors (import files, the shared region) travel with the first byte of their frame via
 * SCM_RIGHTS.
 * The shared region is a memfd created on the first transfer above INLINE_MAX (or the first
 * matvec, with a daemon whose GPU reads and writes the region: NWC_CAP_SHM_DEVICE), sealed against
 * shrinking (the daemon requires it, so a client cannot make it fault), mapped here and there;
 * since calls are serialized, each call uses it from offset 0.  Errors: a negative errno, with
 * the daemon's message (or ours) in a thread-local buffer.
 *
 * The calls themselves, one file per kind: client_catalog.c (models, tensors, info, stats,
 * residency, verify), client_import.c, client_compute.c (dequant, gather, matvec),
 * client_pipeline.c (submit and wait), client_cuda.c (CUDA IPC); map.c maps tensors.
 */
#include "client_internal.h"
#include "nwc_client.h"
#include "nwc_number.h"

#include "nwc_proto.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static _Thread_local char last_error[NWC_PROTO_MAX_MSG + 64];
static _Thread_local char default_socket[256];

int nwc__client_fail(int err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return err;
}

const char *nwc_client_last_error(void) { return last_error; }

const char *nwc_client_default_socket(void) {
  return nwc_proto_default_socket(default_socket, sizeof default_socket);
}

const char *nwc_client_backend(const nwc_client *c) { return c->hello.backend; }
const char *nwc_client_daemon_version(const nwc_client *c) { return c->hello.daemon; }

int nwc__client_send(nwc_client *c, const uint8_t *buf, size_t len, const int *fds, unsigned nfds) {
  size_t off = 0;
  while (off < len) {
    struct iovec iov = {(void *)(buf + off), len - off};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    union {
      char b[CMSG_SPACE(sizeof(int) * (NWC_PROTO_MAX_FILES + 1))];
      struct cmsghdr align;
    } cm;
    if (off == 0 && nfds) {
      msg.msg_control = cm.b;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
      struct cmsghdr *h = CMSG_FIRSTHDR(&msg);
      h->cmsg_level = SOL_SOCKET, h->cmsg_type = SCM_RIGHTS;
      h->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
      memcpy(CMSG_DATA(h), fds, sizeof(int) * nfds);
    }
    ssize_t n = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      c->broken = true;
      return nwc__client_fail(-errno, "sending to nwcd: %s", strerror(errno));
    }
    off += (size_t)n;
  }
  return 0;
}

static int conn_lost(nwc_client *c, ssize_t n) {
  c->broken = c->unreadable = true;
  static const char why[] = "(it stopped, or ended this connection: its log says why)";
  return n == 0                ? nwc__client_fail(-ECONNRESET, "nwcd closed the connection %s", why)
         : errno == ECONNRESET ? nwc__client_fail(-ECONNRESET, "nwcd reset the connection %s", why)
                               : nwc__client_fail(-errno, "reading from nwcd: %s", strerror(errno));
}

static int recv_all(nwc_client *c, void *buf, size_t len) {
  size_t off = 0;
  while (off < len) {
    ssize_t n = recv(c->fd, (uint8_t *)buf + off, len - off, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return conn_lost(c, n);
    off += (size_t)n;
  }
  return 0;
}

/* Reads the next frame: its header into *h, its payload into c->rbuf[0 .. h->length). */
static int read_frame(nwc_client *c, nwc_proto_hdr *h) {
  if (!c->ibuf && !(c->ibuf = malloc(IBUF_SIZE))) return nwc__client_fail(-ENOMEM, "out of memory");
  if (c->ilen - c->ioff < NWC_PROTO_HEADER) {
    memmove(c->ibuf, c->ibuf + c->ioff, c->ilen - c->ioff);
    c->ilen -= c->ioff, c->ioff = 0;
    while (c->ilen < NWC_PROTO_HEADER) { /* one recv usually brings the whole frame, or more */
      ssize_t n = nwc__wait_recv(&c->waiter, c->alone, c->fd, c->ibuf + c->ilen,
                                 IBUF_SIZE - c->ilen);
      if (n <= 0) return conn_lost(c, n);
      c->ilen += (size_t)n;
    }
  }
  if (nwc_proto_hdr_decode(c->ibuf + c->ioff, h) < 0) {
    c->broken = c->unreadable = true;
    return nwc__client_fail(-EBADMSG, "bad frame from nwcd");
  }
  c->ioff += NWC_PROTO_HEADER;
  if (!(h->flags & NWC_PF_EVENT)) c->alone = h->flags & NWC_PF_ALONE; /* may the next wait poll */
  if (h->length + (size_t)1 > c->rcap) {
    uint8_t *b = realloc(c->rbuf, h->length + (size_t)1);
    if (!b) {
      c->broken = c->unreadable = true;
      return nwc__client_fail(-ENOMEM, "out of memory for a reply of %u bytes", h->length);
    }
    c->rbuf = b, c->rcap = h->length + (size_t)1;
  }
  size_t have = c->ilen - c->ioff < h->length ? c->ilen - c->ioff : h->length;
  memcpy(c->rbuf, c->ibuf + c->ioff, have);
  c->ioff += have;
  if (c->ioff == c->ilen) c->ioff = c->ilen = 0;
  return have < h->length ? recv_all(c, c->rbuf + have, h->length - have) : 0; /* the rest */
}

pending *nwc__client_ticket(nwc_client *c, uint64_t id) {
  for (unsigned i = 0; i < c->ntickets; i++)
    if (c->tickets[i].id == id) return &c->tickets[i];
  return NULL;
}

/* Completes ticket t with the frame just read (h, payload in c->rbuf). */
static void finish_ticket(nwc_client *c, pending *t, const nwc_proto_hdr *h) {
  nwc_proto_compute pc = {0};
  int rc =
      h->status < 0 ? h->status : nwc__client_compute_reply(c, h->length, t->out, t->cap, 0, &pc);
  t->done = true, t->status = rc, t->rflags = pc.rflags;
  c->ticket_bytes -= t->cap;
  if (rc < 0 && h->status >= 0) {
    t->msg = strdup(last_error); /* compute_reply's */
  } else if (rc < 0) {
    char msg[NWC_PROTO_MAX_MSG];
    nwc_pr r;
    nwc_pr_init(&r, c->rbuf, h->length);
    if (nwc_pr_str(&r, msg, sizeof msg) < 0) snprintf(msg, sizeof msg, "%s", strerror(-rc));
    t->msg = strdup(msg);
  }
}

/* Marks every ticket not yet done as failed with rc (the connection is gone). */
static void fail_tickets(nwc_client *c, int rc) {
  for (unsigned i = 0; i < c->ntickets; i++) {
    pending *t = &c->tickets[i];
    if (t->done) continue;
    t->done = true, t->status = rc, t->msg = strdup(last_error);
    c->ticket_bytes -= t->cap;
  }
}

/* Reads one frame; a ticket's reply completes it (*h then has id 0 for the caller).  Returns 0,
 * or a negative errno once the connection is lost (every ticket then fails with it).  After a
 * failed send (broken) what the daemon sent before it closed can still be read. */
int nwc__client_read(nwc_client *c, nwc_proto_hdr *h) {
  int rc = c->unreadable ? nwc__client_fail(-ENOTCONN, "the connection to nwcd was lost")
                         : read_frame(c, h);
  if (rc == 0 && h->id == 0 && h->status < 0) { /* about the connection: it is closing */
    nwc_pr r;
    nwc_pr_init(&r, c->rbuf, h->length);
    char msg[NWC_PROTO_MAX_MSG];
    if (nwc_pr_str(&r, msg, sizeof msg) < 0) snprintf(msg, sizeof msg, "%s", strerror(-h->status));
    c->broken = true;
    rc = nwc__client_fail(h->status, "%s", msg);
  }
  if (rc < 0) {
    fail_tickets(c, rc);
    return rc;
  }
  pending *t = h->flags & NWC_PF_EVENT ? NULL : nwc__client_ticket(c, h->id);
  if (t && !t->done) {
    finish_ticket(c, t, h);
    h->id = 0;
  }
  return 0;
}

/* Sends req (id assigned here) with fds, waits for its reply, or until progress returns non-zero
 * (-ECANCELED).  On success the payload is in c->rbuf[0 .. *len).  Caller holds c->lock. */
int nwc__client_request(nwc_client *c, nwc_proto_req *req, const int *fds, unsigned nfds,
                        nwc_client_progress_fn progress, void *ctx, size_t *len) {
  if (c->broken) return nwc__client_fail(-ENOTCONN, "the connection to nwcd was lost");
  req->id = ++c->next_id;
  nwc_pw w;
  nwc_pw_init(&w);
  int64_t n = nwc_proto_req_encode(req, &w);
  if (n < 0) {
    nwc_pw_free(&w);
    return nwc__client_fail((int)n, "request too large for one frame (%s)", strerror((int)-n));
  }
  int rc = nwc__client_send(c, w.buf, (size_t)n, fds, nfds);
  nwc_pw_free(&w);
  /* A daemon that refuses us (e.g. too many connections) sends an error frame and closes: our
   * send may then fail with EPIPE, but the frame explaining why is still there to read. */
  if (rc < 0 && rc != -EPIPE && rc != -ECONNRESET) return rc;
  for (;;) {
    nwc_proto_hdr h;
    if ((rc = nwc__client_read(c, &h)) < 0) return rc;
    if (h.id != req->id) continue; /* a ticket's (completed by read_one) or no one's: drop */
    if (h.status < 0) {
      nwc_pr r;
      nwc_pr_init(&r, c->rbuf, h.length);
      char msg[NWC_PROTO_MAX_MSG];
      if (nwc_pr_str(&r, msg, sizeof msg) < 0) snprintf(msg, sizeof msg, "%s", strerror(-h.status));
      return nwc__client_fail(h.status, "%s", msg);
    }
    if (h.flags & NWC_PF_EVENT) {
      nwc_pr r;
      nwc_pr_init(&r, c->rbuf, h.length);
      uint64_t done, total;
      /* Stop waiting: the request's later events and reply carry an id no one waits for,
       * and whichever call reads them drops them. */
      if (progress && nwc_proto_get_progress(&r, &done, &total) == 0 &&
          progress(ctx, done, total) != 0)
        return nwc__client_fail(-ECANCELED,
                                "cancelled by the progress callback at %llu of %llu bytes; the "
                                "request goes on in nwcd",
                                (unsigned long long)done, (unsigned long long)total);
      continue;
    }
    *len = h.length;
    return 0;
  }
}

int nwc_client_connect(const char *path, nwc_client **out) {
  *out = NULL;
  if (!path) path = nwc_client_default_socket();
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path)
    return nwc__client_fail(-ENAMETOOLONG, "socket path %s is too long", path);
  strcpy(sa.sun_path, path);
  nwc_client *c = calloc(1, sizeof *c);
  if (!c) return nwc__client_fail(-ENOMEM, "out of memory");
  int wrc = nwc__waiter_init(&c->waiter);
  if (wrc < 0) {
    free(c);
    return nwc__client_fail(wrc, "NWC_CLIENT_SPIN_US must be a number of microseconds from 0 to "
                                 "1000000");
  }
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    int e = errno;
    if (c->fd >= 0) close(c->fd);
    free(c);
    /* connect() to a file or a directory is refused as if no daemon listened: say what it is. */
    struct stat st;
    if (e == ECONNREFUSED && stat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
      const char *what = S_ISDIR(st.st_mode)   ? "a directory"
                         : S_ISREG(st.st_mode) ? "a regular file"
                                               : "a special file";
      return nwc__client_fail(-e,
                              "cannot connect to nwcd at %s: it is %s, not a socket (--socket or "
                              "NWC_SOCKET names nwcd's socket)",
                              path, what);
    }
    return nwc__client_fail(
        -e, "cannot connect to nwcd at %s: %s%s", path, strerror(e),
        e == ENOENT || e == ECONNREFUSED ? " (is nwcd running? NWC_SOCKET sets the path)" : "");
  }
  pthread_mutex_init(&c->lock, NULL);
  nwc_proto_req req = {.op = NWC_OP_HELLO, .ver_min = NWC_CLIENT_PROTOCOL,
                       .ver_max = NWC_CLIENT_PROTOCOL,
                       .caps = NWC_CAP_SHM | NWC_CAP_FDIMPORT | NWC_CAP_BATCH | NWC_CAP_MAPPED |
                               NWC_CAP_ALONE};
  snprintf(req.client, sizeof req.client, "libnwc-client");
  size_t len;
  int rc = nwc__client_request(c, &req, NULL, 0, NULL, NULL, &len);
  if (rc == 0) {
    nwc_pr r;
    nwc_pr_init(&r, c->rbuf, len);
    if (nwc_proto_get_hello(&r, &c->hello) < 0)
      rc = nwc__client_fail(-EBADMSG, "bad hello reply from nwcd");
  }
  if (rc < 0) {
    nwc_client_free(c);
    return rc;
  }
  *out = c;
  return 0;
}

int nwc_client_set_spin(nwc_client *c, unsigned spin_us) {
  pthread_mutex_lock(&c->lock);
  int rc = nwc__waiter_set(&c->waiter, spin_us);
  pthread_mutex_unlock(&c->lock);
  if (rc < 0) return nwc__client_fail(rc, "a spin of more than 1 s (1000000 us) is not a wait");
  return rc;
}

void nwc_client_free(nwc_client *c) {
  if (!c) return;
  if (c->fd >= 0) close(c->fd);
  if (c->shm) munmap(c->shm, c->shm_size);
  free(c->rbuf);
  free(c->ibuf);
  for (unsigned i = 0; i < c->ntickets; i++) free(c->tickets[i].msg);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

/* Makes sure the shared region holds need bytes (creating and passing it on first use). */
int nwc__client_shm(nwc_client *c, uint64_t need) {
  if (c->shm) {
    if (need <= c->shm_size) return 0;
    return nwc__client_fail(-E2BIG,
                            "transfer of %llu bytes is larger than the shared region (%llu)",
                            (unsigned long long)need, (unsigned long long)c->shm_size);
  }
  uint64_t size = SHM_DEFAULT;
  const char *env = getenv("NWC_CLIENT_SHM_BYTES");
  if (env && *env && (!nwc__u64_of(env, UINT64_C(1) << 40, &size) || size < INLINE_MAX))
    return nwc__client_fail(-EINVAL, "NWC_CLIENT_SHM_BYTES=%s: a byte count from %u to 2^40", env, INLINE_MAX);
  if (need > size) size = need;
  size = (size + 0xfffff) & ~0xfffffull;
  int fd = memfd_create("nwc-client", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return nwc__client_fail(-errno, "memfd_create: %s", strerror(errno));
  if (ftruncate(fd, (off_t)size) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) < 0) {
    int e = errno;
    close(fd);
    return nwc__client_fail(-e, "shared region: %s", strerror(e));
  }
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    return nwc__client_fail(-e, "mmap of the shared region: %s", strerror(e));
  }
  nwc_proto_req req = {.op = NWC_OP_SHM, .shm_size = size};
  size_t len;
  int rc = nwc__client_request(c, &req, &fd, 1, NULL, NULL, &len);
  close(fd);
  if (rc < 0) {
    munmap(p, size);
    return rc;
  }
  c->shm = p, c->shm_size = size;
  return 0;
}

void nwc__client_names(nwc_proto_req *r, int op, const char *model, const char *tensor) {
  r->op = (uint16_t)op;
  snprintf(r->model, sizeof r->model, "%s", model ? model : "");
  snprintf(r->tensor, sizeof r->tensor, "%s", tensor ? tensor : "");
}

int nwc__client_check_names(const char *model, const char *tensor) {
  if (!model || strlen(model) >= NWC_PROTO_NAME_MAX)
    return nwc__client_fail(-EINVAL, "bad model name");
  if (tensor && strlen(tensor) >= NWC_PROTO_NAME_MAX)
    return nwc__client_fail(-ENAMETOOLONG, "tensor name too long");
  return 0;
}

int nwc__client_bad_reply(void) { return nwc__client_fail(-EBADMSG, "malformed reply from nwcd"); }

/* Reads a compute reply: the output (bytes, inline or at off in the shared region) is copied to
 * out (cap). */
int nwc__client_compute_reply(nwc_client *c, size_t len, void *out, size_t cap, uint64_t off,
                              nwc_proto_compute *pc) {
  nwc_pr r;
  nwc_pr_init(&r, c->rbuf, len);
  if (nwc_proto_get_compute(&r, pc) < 0) return nwc__client_bad_reply();
  if (pc->bytes > cap)
    return nwc__client_fail(-ENOSPC, "the output takes %llu bytes, the buffer holds %zu",
                            (unsigned long long)pc->bytes, cap);
  if (pc->where == NWC_WHERE_INLINE) {
    const void *p = nwc_pr_bytes(&r, pc->bytes);
    if (!p || nwc_pr_end(&r, "compute") < 0) return nwc__client_bad_reply();
    memcpy(out, p, pc->bytes);
  } else {
    if (nwc_pr_end(&r, "compute") < 0 || !c->shm || off > c->shm_size ||
        pc->bytes > c->shm_size - off)
      return nwc__client_bad_reply();
    memcpy(out, c->shm + off, pc->bytes);
  }
  return 0;
}

int nwc__client_call(nwc_client *c, nwc_proto_req *req, const int *fds, unsigned nfds,
                     uint8_t **payload, size_t *len) {
  pthread_mutex_lock(&c->lock);
  size_t n = 0;
  int rc = nwc__client_request(c, req, fds, nfds, NULL, NULL, &n);
  if (rc == 0 && !(*payload = malloc(n ? n : 1))) rc = nwc__client_fail(-ENOMEM, "out of memory");
  if (rc == 0) memcpy(*payload, c->rbuf, n), *len = n;
  pthread_mutex_unlock(&c->lock);
  return rc;
}
