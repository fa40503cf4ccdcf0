/*
 * client.c - libnwc-client (nwc_client.h): a blocking connection to nwcd.
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
 */
#include "client_internal.h"
#include "nwc_client.h"

#include "nwc_proto.h"
#include "safetensors.h"

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

static _Thread_local char last_error[NWC_PROTO_MAX_MSG + 64];
static _Thread_local char default_socket[256];

__attribute__((format(printf, 2, 3))) static int fail(int err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return err;
}

const char *nwc_client_last_error(void) { return last_error; }

const char *nwc_client_default_socket(void) {
  const char *env = getenv("NWC_SOCKET"), *xdg = getenv("XDG_RUNTIME_DIR");
  if (env && *env) snprintf(default_socket, sizeof default_socket, "%s", env);
  else if (geteuid() == 0) snprintf(default_socket, sizeof default_socket, "/run/nwc/nwcd.sock");
  else if (xdg && *xdg) snprintf(default_socket, sizeof default_socket, "%s/nwc/nwcd.sock", xdg);
  else snprintf(default_socket, sizeof default_socket, "/tmp/nwc-%u/nwcd.sock", (unsigned)geteuid());
  return default_socket;
}

const char *nwc_client_backend(const nwc_client *c) { return c->hello.backend; }
const char *nwc_client_daemon_version(const nwc_client *c) { return c->hello.daemon; }

static int send_all(nwc_client *c, const uint8_t *buf, size_t len, const int *fds, unsigned nfds) {
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
      return fail(-errno, "sending to nwcd: %s", strerror(errno));
    }
    off += (size_t)n;
  }
  return 0;
}

static int conn_lost(nwc_client *c, ssize_t n) {
  c->broken = c->unreadable = true;
  static const char why[] = "(it stopped, or ended this connection: its log says why)";
  return n == 0              ? fail(-ECONNRESET, "nwcd closed the connection %s", why)
         : errno == ECONNRESET ? fail(-ECONNRESET, "nwcd reset the connection %s", why)
                               : fail(-errno, "reading from nwcd: %s", strerror(errno));
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
  if (!c->ibuf && !(c->ibuf = malloc(IBUF_SIZE))) return fail(-ENOMEM, "out of memory");
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
    return fail(-EBADMSG, "bad frame from nwcd");
  }
  c->ioff += NWC_PROTO_HEADER;
  if (!(h->flags & NWC_PF_EVENT)) c->alone = h->flags & NWC_PF_ALONE; /* may the next wait poll */
  if (h->length + (size_t)1 > c->rcap) {
    uint8_t *b = realloc(c->rbuf, h->length + (size_t)1);
    if (!b) {
      c->broken = c->unreadable = true;
      return fail(-ENOMEM, "out of memory for a reply of %u bytes", h->length);
    }
    c->rbuf = b, c->rcap = h->length + (size_t)1;
  }
  size_t have = c->ilen - c->ioff < h->length ? c->ilen - c->ioff : h->length;
  memcpy(c->rbuf, c->ibuf + c->ioff, have);
  c->ioff += have;
  if (c->ioff == c->ilen) c->ioff = c->ilen = 0;
  return have < h->length ? recv_all(c, c->rbuf + have, h->length - have) : 0; /* the rest */
}

static pending *find_ticket(nwc_client *c, uint64_t id) {
  for (unsigned i = 0; i < c->ntickets; i++)
    if (c->tickets[i].id == id) return &c->tickets[i];
  return NULL;
}

static int compute_reply(nwc_client *c, size_t len, void *out, size_t cap, uint64_t off,
                         nwc_proto_compute *pc);

/* Completes ticket t with the frame just read (h, payload in c->rbuf). */
static void finish_ticket(nwc_client *c, pending *t, const nwc_proto_hdr *h) {
  nwc_proto_compute pc = {0};
  int rc = h->status < 0 ? h->status : compute_reply(c, h->length, t->out, t->cap, 0, &pc);
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
static int read_one(nwc_client *c, nwc_proto_hdr *h) {
  int rc = c->unreadable ? fail(-ENOTCONN, "the connection to nwcd was lost") : read_frame(c, h);
  if (rc == 0 && h->id == 0 && h->status < 0) { /* about the connection: it is closing */
    nwc_pr r;
    nwc_pr_init(&r, c->rbuf, h->length);
    char msg[NWC_PROTO_MAX_MSG];
    if (nwc_pr_str(&r, msg, sizeof msg) < 0) snprintf(msg, sizeof msg, "%s", strerror(-h->status));
    c->broken = true;
    rc = fail(h->status, "%s", msg);
  }
  if (rc < 0) {
    fail_tickets(c, rc);
    return rc;
  }
  pending *t = h->flags & NWC_PF_EVENT ? NULL : find_ticket(c, h->id);
  if (t && !t->done) {
    finish_ticket(c, t, h);
    h->id = 0;
  }
  return 0;
}

/* Sends req (id assigned here) with fds, waits for its reply, or until progress returns non-zero
 * (-ECANCELED).  On success the payload is in c->rbuf[0 .. *len).  Caller holds c->lock. */
static int call(nwc_client *c, nwc_proto_req *req, const int *fds, unsigned nfds,
                nwc_client_progress_fn progress, void *ctx, size_t *len) {
  if (c->broken) return fail(-ENOTCONN, "the connection to nwcd was lost");
  req->id = ++c->next_id;
  nwc_pw w;
  nwc_pw_init(&w);
  int64_t n = nwc_proto_req_encode(req, &w);
  if (n < 0) {
    nwc_pw_free(&w);
    return fail((int)n, "request too large for one frame (%s)", strerror((int)-n));
  }
  int rc = send_all(c, w.buf, (size_t)n, fds, nfds);
  nwc_pw_free(&w);
  /* A daemon that refuses us (e.g. too many connections) sends an error frame and closes: our
   * send may then fail with EPIPE, but the frame explaining why is still there to read. */
  if (rc < 0 && rc != -EPIPE && rc != -ECONNRESET) return rc;
  for (;;) {
    nwc_proto_hdr h;
    if ((rc = read_one(c, &h)) < 0) return rc;
    if (h.id != req->id) continue; /* a ticket's (completed by read_one) or no one's: drop */
    if (h.status < 0) {
      nwc_pr r;
      nwc_pr_init(&r, c->rbuf, h.length);
      char msg[NWC_PROTO_MAX_MSG];
      if (nwc_pr_str(&r, msg, sizeof msg) < 0) snprintf(msg, sizeof msg, "%s", strerror(-h.status));
      return fail(h.status, "%s", msg);
    }
    if (h.flags & NWC_PF_EVENT) {
      nwc_pr r;
      nwc_pr_init(&r, c->rbuf, h.length);
      uint64_t done, total;
      /* Stop waiting: the request's later events and reply carry an id no one waits for,
       * and whichever call reads them drops them. */
      if (progress && nwc_proto_get_progress(&r, &done, &total) == 0 &&
          progress(ctx, done, total) != 0)
        return fail(-ECANCELED, "cancelled by the progress callback at %llu of %llu bytes; the "
                    "request goes on in nwcd", (unsigned long long)done,
                    (unsigned long long)total);
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
  if (strlen(path) >= sizeof sa.sun_path) return fail(-ENAMETOOLONG, "socket path %s is too long", path);
  strcpy(sa.sun_path, path);
  nwc_client *c = calloc(1, sizeof *c);
  if (!c) return fail(-ENOMEM, "out of memory");
  int wrc = nwc__waiter_init(&c->waiter);
  if (wrc < 0) {
    free(c);
    return wrc;
  }
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    int e = errno;
    if (c->fd >= 0) close(c->fd);
    free(c);
    /* connect() to a file or a directory is refused as if no daemon listened: say what it is. */
    struct stat st;
    if (e == ECONNREFUSED && stat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
      const char *what = S_ISDIR(st.st_mode) ? "a directory" : S_ISREG(st.st_mode) ? "a regular file"
                                                                                 : "a special file";
      return fail(-e, "cannot connect to nwcd at %s: it is %s, not a socket (--socket or "
                  "NWC_SOCKET names nwcd's socket)", path, what);
    }
    return fail(-e, "cannot connect to nwcd at %s: %s%s", path, strerror(e),
                e == ENOENT || e == ECONNREFUSED ? " (is nwcd running? NWC_SOCKET sets the path)" : "");
  }
  pthread_mutex_init(&c->lock, NULL);
  nwc_proto_req req = {.op = NWC_OP_HELLO, .ver_min = NWC_CLIENT_PROTOCOL,
                       .ver_max = NWC_CLIENT_PROTOCOL,
                       .caps = NWC_CAP_SHM | NWC_CAP_FDIMPORT | NWC_CAP_BATCH | NWC_CAP_MAPPED |
                               NWC_CAP_ALONE};
  snprintf(req.client, sizeof req.client, "libnwc-client");
  size_t len;
  int rc = call(c, &req, NULL, 0, NULL, NULL, &len);
  if (rc == 0) {
    nwc_pr r;
    nwc_pr_init(&r, c->rbuf, len);
    if (nwc_proto_get_hello(&r, &c->hello) < 0) rc = fail(-EBADMSG, "bad hello reply from nwcd");
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
static int ensure_shm(nwc_client *c, uint64_t need) {
  if (c->shm) {
    if (need <= c->shm_size) return 0;
    return fail(-E2BIG, "transfer of %llu bytes is larger than the shared region (%llu)",
                (unsigned long long)need, (unsigned long long)c->shm_size);
  }
  uint64_t size = need > SHM_DEFAULT ? (need + 0xfffff) & ~0xfffffull : SHM_DEFAULT;
  int fd = memfd_create("nwc-client", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return fail(-errno, "memfd_create: %s", strerror(errno));
  if (ftruncate(fd, (off_t)size) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) < 0) {
    int e = errno;
    close(fd);
    return fail(-e, "shared region: %s", strerror(e));
  }
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    return fail(-e, "mmap of the shared region: %s", strerror(e));
  }
  nwc_proto_req req = {.op = NWC_OP_SHM, .shm_size = size};
  size_t len;
  int rc = call(c, &req, &fd, 1, NULL, NULL, &len);
  close(fd);
  if (rc < 0) {
    munmap(p, size);
    return rc;
  }
  c->shm = p, c->shm_size = size;
  return 0;
}

static void set_names(nwc_proto_req *r, int op, const char *model, const char *tensor) {
  r->op = (uint16_t)op;
  snprintf(r->model, sizeof r->model, "%s", model ? model : "");
  snprintf(r->tensor, sizeof r->tensor, "%s", tensor ? tensor : "");
}

/* call() for a request that carries only its op and names. */
static int call_named(nwc_client *c, int op, const char *model, const char *tensor,
                      nwc_client_progress_fn progress, void *ctx, size_t *len) {
  nwc_proto_req req = {0};
  set_names(&req, op, model, tensor);
  return call(c, &req, NULL, 0, progress, ctx, len);
}

static int check_names(const char *model, const char *tensor) {
  if (!model || strlen(model) >= NWC_PROTO_NAME_MAX) return fail(-EINVAL, "bad model name");
  if (tensor && strlen(tensor) >= NWC_PROTO_NAME_MAX) return fail(-ENAMETOOLONG, "tensor name too long");
  return 0;
}

static void to_tensor(const nwc_proto_tensor *p, nwc_client_tensor *t) {
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", p->name);
  t->ndim = p->ndim;
  memcpy(t->shape, p->shape, sizeof t->shape);
  memcpy(t->dtype, p->dtype, sizeof t->dtype);
  t->elem = p->elem, t->rows = p->rows, t->cols = p->cols;
  t->raw_bytes = p->raw_bytes, t->nwc_bytes = p->nwc_bytes;
  t->state = p->state, t->pinned = p->pinned, t->refs = p->refs, t->last_used_ms = p->last_used_ms;
}

#define LOCKED(c, expr)                                                                          \
  ({                                                                                             \
    pthread_mutex_lock(&(c)->lock);                                                              \
    int rc_ = (expr);                                                                            \
    pthread_mutex_unlock(&(c)->lock);                                                            \
    rc_;                                                                                         \
  })

static int bad_reply(void) { return fail(-EBADMSG, "malformed reply from nwcd"); }

static int do_list(nwc_client *c, int op, const char *model, void **out, size_t *n) {
  size_t len;
  int rc = call_named(c, op, model, NULL, NULL, NULL, &len);
  if (rc < 0) return rc;
  nwc_pr r;
  nwc_pr_init(&r, c->rbuf, len);
  uint32_t k = nwc_pr_u32(&r);
  if (r.err || k > len) return bad_reply();
  size_t esz = op == NWC_OP_MODELS ? sizeof(nwc_client_model)
               : op == NWC_OP_TENSORS ? sizeof(nwc_client_tensor)
               : op == NWC_OP_PS ? sizeof(nwc_client_resident) : sizeof(nwc_client_place);
  uint8_t *a = calloc(k ? k : 1, esz);
  if (!a) return fail(-ENOMEM, "out of memory");
  for (uint32_t i = 0; i < k; i++) {
    if (op == NWC_OP_MODELS) {
      nwc_proto_model m;
      if (nwc_proto_get_model(&r, &m) < 0) break;
      nwc_client_model *o = (nwc_client_model *)a + i;
      memcpy(o->name, m.name, sizeof o->name);
      o->tensors = m.tensors, o->raw_bytes = m.raw_bytes, o->nwc_bytes = m.nwc_bytes;
      o->resident_bytes = m.resident_bytes, o->created = m.created, o->verified = m.verified;
    } else if (op == NWC_OP_TENSORS) {
      nwc_proto_tensor t;
      if (nwc_proto_get_tensor(&r, &t) < 0) break;
      to_tensor(&t, (nwc_client_tensor *)a + i);
    } else if (op == NWC_OP_DEVICES) {
      nwc_proto_place p;
      if (nwc_proto_get_place(&r, &p) < 0) break;
      _Static_assert(sizeof(nwc_client_place) == sizeof p, "place layouts");
      memcpy((nwc_client_place *)a + i, &p, sizeof p);
    } else {
      nwc_proto_ps p;
      if (nwc_proto_get_ps(&r, &p) < 0) break;
      nwc_client_resident *o = (nwc_client_resident *)a + i;
      memcpy(o->model, p.model, sizeof o->model), memcpy(o->tensor, p.tensor, sizeof o->tensor);
      o->bytes = p.bytes, o->pinned = p.pinned, o->locked = p.locked, o->direct = p.direct;
      o->refs = p.refs, o->last_used_ms = p.last_used_ms, o->maps = p.maps;
      o->device = p.device;
    }
  }
  if (nwc_pr_end(&r, "list") < 0) {
    free(a);
    return bad_reply();
  }
  *out = a, *n = k;
  return 0;
}

int nwc_client_models(nwc_client *c, nwc_client_model **out, size_t *n) {
  return LOCKED(c, do_list(c, NWC_OP_MODELS, NULL, (void **)out, n));
}
int nwc_client_tensors(nwc_client *c, const char *model, nwc_client_tensor **out, size_t *n) {
  if (check_names(model, NULL) < 0) return -EINVAL;
  return LOCKED(c, do_list(c, NWC_OP_TENSORS, model, (void **)out, n));
}
int nwc_client_ps(nwc_client *c, nwc_client_resident **out, size_t *n) {
  return LOCKED(c, do_list(c, NWC_OP_PS, NULL, (void **)out, n));
}

int nwc_client_devices(nwc_client *c, nwc_client_place **out, size_t *n) {
  if (!(c->hello.caps & NWC_CAP_DEVICES))
    return fail(-EOPNOTSUPP, "%s has no devices operation (protocol capability 512): it reports "
                "memory only as the totals of stats", c->hello.daemon);
  return LOCKED(c, do_list(c, NWC_OP_DEVICES, NULL, (void **)out, n));
}

static int do_info(nwc_client *c, const char *model, const char *tensor, nwc_client_tensor_info *out) {
  size_t len;
  int rc = call_named(c, NWC_OP_INFO, model, tensor, NULL, NULL, &len);
  if (rc < 0) return rc;
  nwc_pr r;
  nwc_pr_init(&r, c->rbuf, len);
  nwc_proto_tensor t;
  nwc_proto_info i;
  if (nwc_proto_get_tensor(&r, &t) < 0 || nwc_proto_get_info(&r, &i) < 0 ||
      nwc_pr_end(&r, "info") < 0)
    return bad_reply();
  memset(out, 0, sizeof *out);
  to_tensor(&t, &out->t);
  memcpy(out->conversion, i.conversion, sizeof out->conversion);
  memcpy(out->path, i.path, sizeof out->path);
  out->offset = i.offset, out->length = i.length, out->nchunks = i.nchunks;
  out->nblocks = i.nblocks, out->data_bytes = i.data_bytes, out->format_version = i.format_version;
  return 0;
}

int nwc_client_info(nwc_client *c, const char *model, const char *tensor, nwc_client_tensor_info *out) {
  if (check_names(model, tensor ? tensor : "") < 0) return -EINVAL;
  return LOCKED(c, do_info(c, model, tensor, out));
}

static int do_stats(nwc_client *c, nwc_client_counters *out) {
  nwc_proto_req req = {.op = NWC_OP_STATS};
  size_t len;
  int rc = call(c, &req, NULL, 0, NULL, NULL, &len);
  if (rc < 0) return rc;
  nwc_pr r;
  nwc_pr_init(&r, c->rbuf, len);
  nwc_proto_stats s;
  if (nwc_proto_get_stats(&r, &s) < 0 || nwc_pr_end(&r, "stats") < 0) return bad_reply();
  _Static_assert(sizeof(nwc_client_counters) == sizeof(nwc_proto_stats), "stats layouts");
  memcpy(out, &s, sizeof s);
  return 0;
}

int nwc_client_stats(nwc_client *c, nwc_client_counters *out) { return LOCKED(c, do_stats(c, out)); }

static int get_result(nwc_client *c, size_t len, nwc_client_result *res, nwc_pr *rest) {
  nwc_pr_init(rest, c->rbuf, len);
  nwc_proto_result pr;
  if (nwc_proto_get_result(rest, &pr) < 0) return bad_reply();
  _Static_assert(sizeof(nwc_client_result) == sizeof(nwc_proto_result), "result layouts");
  if (res) memcpy(res, &pr, sizeof pr);
  return 0;
}

static int do_simple(nwc_client *c, int op, const char *model, const char *tensor,
                     nwc_client_progress_fn progress, void *ctx, nwc_client_result *res) {
  size_t len;
  int rc = call_named(c, op, model, tensor, progress, ctx, &len);
  if (rc < 0) return rc;
  nwc_pr r;
  if ((rc = get_result(c, len, res, &r)) < 0) return rc;
  return nwc_pr_end(&r, "result") < 0 ? bad_reply() : 0;
}

int nwc_client_remove(nwc_client *c, const char *model) {
  if (check_names(model, NULL) < 0) return -EINVAL;
  return LOCKED(c, do_simple(c, NWC_OP_REMOVE, model, NULL, NULL, NULL, NULL));
}
int nwc_client_load(nwc_client *c, const char *model, const char *tensor,
                    nwc_client_progress_fn progress, void *ctx, nwc_client_result *res) {
  if (check_names(model, tensor) < 0) return -EINVAL;
  return LOCKED(c, do_simple(c, NWC_OP_LOAD, model, tensor, progress, ctx, res));
}
static int do_load_on(nwc_client *c, const char *model, const char *tensor, int device,
                      nwc_client_progress_fn progress, void *ctx, nwc_client_result *res) {
  nwc_proto_req req = {0};
  set_names(&req, NWC_OP_LOAD_ON, model, tensor);
  req.device = device;
  size_t len;
  int rc = call(c, &req, NULL, 0, progress, ctx, &len);
  if (rc < 0) return rc;
  nwc_pr r;
  if ((rc = get_result(c, len, res, &r)) < 0) return rc;
  return nwc_pr_end(&r, "result") < 0 ? bad_reply() : 0;
}
int nwc_client_load_on(nwc_client *c, const char *model, const char *tensor, int device,
                       nwc_client_progress_fn progress, void *ctx, nwc_client_result *res) {
  if (check_names(model, tensor) < 0) return -EINVAL;
  if (device < NWC_CLIENT_CPU) return fail(-EINVAL, "device %d (-1 host, 0.. CUDA)", device);
  return LOCKED(c, do_load_on(c, model, tensor, device, progress, ctx, res));
}
int nwc_client_evict(nwc_client *c, const char *model, const char *tensor, nwc_client_result *res) {
  if (check_names(model, tensor) < 0) return -EINVAL;
  return LOCKED(c, do_simple(c, NWC_OP_EVICT, model, tensor, NULL, NULL, res));
}
int nwc_client_pin(nwc_client *c, const char *model, const char *tensor, nwc_client_result *res) {
  if (check_names(model, tensor) < 0) return -EINVAL;
  return LOCKED(c, do_simple(c, NWC_OP_PIN, model, tensor, NULL, NULL, res));
}
int nwc_client_unpin(nwc_client *c, const char *model, const char *tensor, nwc_client_result *res) {
  if (check_names(model, tensor) < 0) return -EINVAL;
  return LOCKED(c, do_simple(c, NWC_OP_UNPIN, model, tensor, NULL, NULL, res));
}

static int do_verify(nwc_client *c, const char *model, void (*cb)(void *, const char *), void *ctx,
                     nwc_client_result *res) {
  size_t len;
  int rc = call_named(c, NWC_OP_VERIFY, model, NULL, NULL, NULL, &len);
  if (rc < 0) return rc;
  nwc_pr r;
  if ((rc = get_result(c, len, res, &r)) < 0) return rc;
  uint32_t n = nwc_pr_u32(&r);
  char line[NWC_PROTO_MAX_MSG];
  for (uint32_t i = 0; i < n && !r.err; i++)
    if (nwc_pr_str(&r, line, sizeof line) == 0 && cb) cb(ctx, line);
  return nwc_pr_end(&r, "verify") < 0 ? bad_reply() : 0;
}

int nwc_client_verify(nwc_client *c, const char *model, void (*cb)(void *, const char *),
                      void *ctx, nwc_client_result *res) {
  if (model && check_names(model, NULL) < 0) return -EINVAL;
  return LOCKED(c, do_verify(c, model, cb, ctx, res));
}

/* ---- import ------------------------------------------------------------------------------- */

/* The list of an import2 reply after its result, into *out (malloc'ed; NULL when empty). */
static int get_skipped(nwc_pr *r, nwc_client_skipped **out, size_t *n) {
  uint32_t k = nwc_pr_u32(r);
  if (r->err || k > NWC_PROTO_MAX_SKIPPED) return bad_reply();
  nwc_client_skipped *v = k && out ? calloc(k, sizeof *v) : NULL;
  if (k && out && !v) return fail(-ENOMEM, "out of memory");
  int rc = 0;
  for (uint32_t i = 0; i < k && rc == 0; i++) {
    nwc_proto_skipped s;
    if ((rc = nwc_proto_get_skipped(r, &s)) < 0 || !v) continue;
    _Static_assert(sizeof v->name == sizeof s.name && sizeof v->dtype == sizeof s.dtype, "names");
    memcpy(v[i].name, s.name, sizeof s.name);
    memcpy(v[i].dtype, s.dtype, sizeof s.dtype);
    v[i].ndim = s.ndim;
    memcpy(v[i].shape, s.shape, sizeof s.shape);
  }
  if (rc < 0 || nwc_pr_end(r, "import2") < 0) {
    free(v);
    return bad_reply();
  }
  if (out) *out = v, *n = k;
  return 0;
}

/* import2 where the daemon has it (capability 256), else import, which is all or nothing. */
static int do_import(nwc_client *c, const char *model, const char *path,
                     const nwc_client_import_opts *o, unsigned flags, nwc_client_result *res,
                     nwc_client_skipped **skipped, size_t *nskipped) {
  nwc_proto_req req = {0};
  bool v2 = c->hello.caps & NWC_CAP_IMPORT2;
  set_names(&req, v2 ? NWC_OP_IMPORT2 : NWC_OP_IMPORT, model, NULL);
  req.elem = (uint8_t)(o ? o->elem : 0), req.layout = (uint8_t)(o ? o->layout : 0);
  req.import_flags = flags & NWC_CLIENT_IMPORT_STRICT ? NWC_IMPORT_STRICT : 0;
  size_t plen = strlen(path);
  bool index = plen > 5 && !strcmp(path + plen - 5, ".json");
  int fds[NWC_PROTO_MAX_FILES + 1];
  unsigned nfds = 0;
  char *names[NWC_PROTO_MAX_FILES];
  int rc = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(-errno, "cannot open %s: %s", path, strerror(errno));
  fds[nfds++] = fd;
  if (!index) {
    const char *base = strrchr(path, '/');
    names[0] = strdup(base ? base + 1 : path);
    req.nfiles = 1;
  } else {
    req.has_index = 1;
    struct stat st;
    uint8_t *buf = NULL;
    nwc_st_index *x = NULL;
    if (fstat(fd, &st) < 0 || st.st_size > (64 << 20) || !(buf = malloc((size_t)st.st_size + 1)) ||
        pread(fd, buf, (size_t)st.st_size, 0) != st.st_size) {
      rc = fail(-EIO, "cannot read the index %s", path);
    } else if (nwc_st_index_parse(buf, (size_t)st.st_size, &x) < 0) {
      rc = fail(-EBADMSG, "%s: %s", path, nwc_error_detail());
    } else if (x->nshards > NWC_PROTO_MAX_FILES) {
      rc = fail(-E2BIG, "%s names %zu shards (at most %u)", path, x->nshards, NWC_PROTO_MAX_FILES);
    }
    free(buf);
    const char *slash = strrchr(path, '/');
    int dlen = slash ? (int)(slash - path) : 1;
    for (size_t i = 0; rc == 0 && i < x->nshards; i++) {
      char p[PATH_MAX];
      snprintf(p, sizeof p, "%.*s/%s", dlen, slash ? path : ".", x->shards[i]);
      int sfd = open(p, O_RDONLY | O_CLOEXEC);
      if (sfd < 0) {
        rc = fail(-errno, "cannot open shard %s: %s", p, strerror(errno));
        break;
      }
      fds[nfds++] = sfd;
      names[req.nfiles++] = strdup(x->shards[i]);
    }
    nwc_st_index_free(x);
  }
  if (rc == 0) {
    req.files = names;
    size_t len;
    rc = call(c, &req, fds, nfds, o ? o->progress : NULL, o ? o->ctx : NULL, &len);
    nwc_pr r;
    if (rc == 0) rc = get_result(c, len, res, &r);
    if (rc == 0) rc = v2 ? get_skipped(&r, skipped, nskipped)
                         : nwc_pr_end(&r, "import") < 0 ? bad_reply() : 0;
    req.files = NULL;
  }
  for (unsigned i = 0; i < req.nfiles; i++) free(names[i]);
  for (unsigned i = 0; i < nfds; i++) close(fds[i]);
  return rc;
}

int nwc_client_import2(nwc_client *c, const char *model, const char *path,
                       const nwc_client_import_opts *opts, unsigned flags, nwc_client_result *res,
                       nwc_client_skipped **skipped, size_t *nskipped) {
  if (check_names(model, NULL) < 0 || !path || (skipped && !nskipped) ||
      (flags & ~NWC_CLIENT_IMPORT_STRICT))
    return fail(-EINVAL, "bad arguments");
  if (skipped) *skipped = NULL, *nskipped = 0;
  return LOCKED(c, do_import(c, model, path, opts, flags, res, skipped, nskipped));
}

int nwc_client_import(nwc_client *c, const char *model, const char *path,
                      const nwc_client_import_opts *opts, nwc_client_result *res) {
  return nwc_client_import2(c, model, path, opts, 0, res, NULL, NULL);
}

/* ---- compute ------------------------------------------------------------------------------ */

/* Reads a compute reply: the output (bytes, inline or at off in the shared region) is copied to
 * out (cap). */
static int compute_reply(nwc_client *c, size_t len, void *out, size_t cap, uint64_t off,
                         nwc_proto_compute *pc) {
  nwc_pr r;
  nwc_pr_init(&r, c->rbuf, len);
  if (nwc_proto_get_compute(&r, pc) < 0) return bad_reply();
  if (pc->bytes > cap)
    return fail(-ENOSPC, "the output takes %llu bytes, the buffer holds %zu",
                (unsigned long long)pc->bytes, cap);
  if (pc->where == NWC_WHERE_INLINE) {
    const void *p = nwc_pr_bytes(&r, pc->bytes);
    if (!p || nwc_pr_end(&r, "compute") < 0) return bad_reply();
    memcpy(out, p, pc->bytes);
  } else {
    if (nwc_pr_end(&r, "compute") < 0 || !c->shm || off > c->shm_size ||
        pc->bytes > c->shm_size - off)
      return bad_reply();
    memcpy(out, c->shm + off, pc->bytes);
  }
  return 0;
}

static int place_out(nwc_client *c, nwc_proto_req *req, size_t cap, uint64_t off) {
  req->where = NWC_WHERE_INLINE;
  if (cap <= INLINE_MAX) return 0;
  int rc = ensure_shm(c, off + cap);
  if (rc < 0 && rc != -E2BIG) return rc;
  uint64_t avail = c->shm && c->shm_size > off ? c->shm_size - off : 0;
  req->where = NWC_WHERE_SHM, req->out_off = off, req->out_cap = cap < avail ? cap : avail;
  return 0;
}

/* A dequant or gather request (output inline); a gather's row indices go into *idx (malloc'ed,
 * the caller frees it after sending). */
static int dequant_gather_req(nwc_proto_req *req, int op, const char *model, const char *tensor,
                              const uint64_t *rows, size_t n, unsigned flags, uint8_t **idx) {
  *req = (nwc_proto_req){0};
  *idx = NULL;
  set_names(req, op, model, tensor);
  req->out = flags & NWC_CLIENT_BF16 ? NWC_OUT_BF16 : NWC_OUT_F32;
  if (op != NWC_OP_GATHER) return 0;
  if (!rows || n == 0 || n > (NWC_PROTO_MAX_PAYLOAD - 4096) / 8)
    return fail(-EINVAL, "gather of %zu rows (1..%u)", n, (NWC_PROTO_MAX_PAYLOAD - 4096) / 8);
  if (!(*idx = malloc(n * 8))) return fail(-ENOMEM, "out of memory");
  for (size_t i = 0; i < n; i++)
    for (int b = 0; b < 8; b++) (*idx)[8 * i + b] = (uint8_t)(rows[i] >> (8 * b));
  req->nrows = (uint32_t)n, req->rows = *idx;
  return 0;
}

static int do_dequant_gather(nwc_client *c, int op, const char *model, const char *tensor,
                             const uint64_t *rows, size_t n, unsigned flags, void *out, size_t cap,
                             uint64_t *orows, uint64_t *ocols, unsigned *rflags) {
  nwc_proto_req req;
  uint8_t *idx;
  int rc = dequant_gather_req(&req, op, model, tensor, rows, n, flags, &idx);
  if (rc == 0) rc = place_out(c, &req, cap, 0);
  size_t len;
  if (rc == 0) rc = call(c, &req, NULL, 0, NULL, NULL, &len);
  free(idx);
  if (rc < 0) return rc;
  nwc_proto_compute pc;
  if ((rc = compute_reply(c, len, out, cap, 0, &pc)) < 0) return rc;
  if (orows) *orows = pc.rows;
  if (ocols) *ocols = pc.cols;
  if (rflags) *rflags = pc.rflags;
  return 0;
}

int nwc_client_dequant(nwc_client *c, const char *model, const char *tensor, unsigned flags,
                       void *out, size_t cap, uint64_t *rows, uint64_t *cols, unsigned *rflags) {
  if (check_names(model, tensor) < 0 || !tensor) return fail(-EINVAL, "bad arguments");
  return LOCKED(c, do_dequant_gather(c, NWC_OP_DEQUANT, model, tensor, NULL, 0, flags, out, cap,
                                     rows, cols, rflags));
}

int nwc_client_gather(nwc_client *c, const char *model, const char *tensor, const uint64_t *rows,
                      size_t n, unsigned flags, void *out, size_t cap, uint64_t *cols,
                      unsigned *rflags) {
  if (check_names(model, tensor) < 0 || !tensor) return fail(-EINVAL, "bad arguments");
  return LOCKED(c, do_dequant_gather(c, NWC_OP_GATHER, model, tensor, rows, n, flags, out, cap,
                                     NULL, cols, rflags));
}

/* A matvec request, x inline (matvec_ipc: x NULL, then the op changed). */
static void matvec_req(nwc_proto_req *req, const char *model, const char *tensor, const char *bias,
                       float scale, const float *x, uint64_t K, unsigned ncols, unsigned flags) {
  *req = (nwc_proto_req){0};
  set_names(req, NWC_OP_MATVEC, model, tensor);
  snprintf(req->bias, sizeof req->bias, "%s", bias ? bias : "");
  req->scale = scale, req->ncols = ncols;
  req->out = flags & NWC_CLIENT_BF16 ? NWC_OUT_BF16 : NWC_OUT_F32;
  req->x_bytes = (uint64_t)ncols * K * 4;
  req->x = (const uint8_t *)x; /* little-endian floats: the host's order on our targets */
}

/* x and y travel through the shared region when x is over a frame's worth, and always (unless
 * NWC_CLIENT_INLINE) with a daemon that moves them straight between the region and its GPU
 * (NWC_CAP_SHM_DEVICE): the frames then carry a few dozen bytes, and nothing is copied on its
 * side.  x goes at offset 0, y after it (64-aligned). */
static int do_matvec(nwc_client *c, const char *model, const char *tensor, const char *bias,
                     float scale, const float *x, uint64_t K, unsigned ncols, unsigned flags,
                     void *y, size_t cap, unsigned *rflags, uint64_t *bytes) {
  nwc_proto_req req;
  matvec_req(&req, model, tensor, bias, scale, x, K, ncols, flags);
  int rc = 0;
  uint64_t yoff = 0;
  bool device = !(flags & NWC_CLIENT_INLINE) && (c->hello.caps & NWC_CAP_SHM_DEVICE);
  if (req.x_bytes > INLINE_MAX || (device && cap <= INLINE_MAX)) {
    yoff = (req.x_bytes + 63) & ~63ull;
    if ((rc = ensure_shm(c, yoff + cap)) < 0) return rc;
    memcpy(c->shm, x, req.x_bytes);
    req.where = NWC_WHERE_SHM, req.in_off = 0;
    req.out_off = yoff, req.out_cap = cap;
    req.x = NULL;
  } else {
    if ((rc = place_out(c, &req, cap, 0)) < 0) return rc;
    if (req.where == NWC_WHERE_SHM) {
      /* x inline but y in the region: the daemon takes one placement for both. */
      memcpy(c->shm, x, req.x_bytes);
      yoff = (req.x_bytes + 63) & ~63ull;
      req.in_off = 0, req.out_off = yoff;
      req.out_cap = cap < c->shm_size - yoff ? cap : c->shm_size - yoff;
      req.x = NULL;
    }
  }
  size_t len;
  if ((rc = call(c, &req, NULL, 0, NULL, NULL, &len)) < 0) return rc;
  nwc_proto_compute pc = {0};
  rc = compute_reply(c, len, y, cap, yoff, &pc);
  *bytes = pc.bytes; /* also for -ENOSPC: what the output takes */
  if (rc < 0) return rc;
  *rflags = pc.rflags;
  return 0;
}

_Static_assert(NWC_CLIENT_MAX_COLS == NWC_PROTO_MAX_COLS, "the header's limit is the protocol's");

/* A matvec of any number of columns: requests of at most NWC_CLIENT_MAX_COLS each, their outputs
 * back to back in y (column c at c x M); *rflags gets every request's flags. */
static int do_matvec_cols(nwc_client *c, const char *model, const char *tensor, const char *bias,
                          float scale, const float *x, uint64_t K, unsigned ncols, unsigned flags,
                          void *y, size_t cap, unsigned *rflags) {
  unsigned all = 0;
  size_t done = 0;
  for (unsigned c0 = 0, n; c0 < ncols; c0 += n) {
    n = ncols - c0 < NWC_CLIENT_MAX_COLS ? ncols - c0 : NWC_CLIENT_MAX_COLS;
    unsigned rf = 0;
    uint64_t bytes = 0;
    int rc = do_matvec(c, model, tensor, bias, scale, x + (size_t)c0 * K, K, n, flags,
                       (uint8_t *)y + done, cap - done, &rf, &bytes);
    uint64_t need = bytes / n * ncols; /* every request's output has n columns of M */
    if (n < ncols && bytes && (rc == -ENOSPC || (c0 == 0 && need > cap)))
      return fail(-ENOSPC, "the output takes %llu bytes (%u columns), the buffer holds %zu",
                  (unsigned long long)need, ncols, cap);
    if (rc < 0) return rc;
    all |= rf, done += bytes;
  }
  if (rflags) *rflags = all;
  return 0;
}

static int check_matvec(const char *model, const char *tensor, const float *x, uint64_t K,
                        unsigned ncols, const void *y, unsigned max_cols) {
  if (check_names(model, tensor) < 0 || !tensor || !x || !y || !K)
    return fail(-EINVAL, "bad arguments (model, tensor, x, K > 0 and y are required)");
  if (!ncols || ncols > max_cols)
    return fail(-EINVAL, "%u columns: a request takes 1..%u (NWC_CLIENT_MAX_COLS)%s", ncols,
                max_cols, ncols ? "; nwc_client_matvec takes any number" : "");
  return 0;
}

int nwc_client_matvec(nwc_client *c, const char *model, const char *tensor, const char *bias,
                      float scale, const float *x, uint64_t K, unsigned ncols, unsigned flags,
                      void *y, size_t cap, unsigned *rflags) {
  if (check_matvec(model, tensor, x, K, ncols, y, UINT_MAX) < 0) return -EINVAL;
  return LOCKED(c, do_matvec_cols(c, model, tensor, bias, scale, x, K, ncols, flags, y, cap,
                                  rflags));
}

/* ---- for map.c (client_internal.h) -------------------------------------------------------- */

int nwc__client_fail(int err, const char *msg) { return fail(err, "%s", msg); }

int nwc__client_call(nwc_client *c, nwc_proto_req *req, const int *fds, unsigned nfds,
                     uint8_t **payload, size_t *len) {
  pthread_mutex_lock(&c->lock);
  size_t n = 0;
  int rc = call(c, req, fds, nfds, NULL, NULL, &n);
  if (rc == 0 && !(*payload = malloc(n ? n : 1))) rc = fail(-ENOMEM, "out of memory");
  if (rc == 0) memcpy(*payload, c->rbuf, n), *len = n;
  pthread_mutex_unlock(&c->lock);
  return rc;
}

/* ---- pipelining ---------------------------------------------------------------------------- */

/* Sends req (inline both ways, cap bytes of output into out) as a ticket.  Caller holds c->lock. */
static int submit(nwc_client *c, nwc_proto_req *req, void *out, size_t cap, uint64_t *id) {
  if (c->broken) return fail(-ENOTCONN, "the connection to nwcd was lost");
  if (cap > NWC_PROTO_MAX_PAYLOAD - 64 || cap > MAX_TICKET_BYTES)
    return fail(-E2BIG, "a pipelined output of %zu bytes is larger than a frame (%u); use the "
                "synchronous call", cap, NWC_PROTO_MAX_PAYLOAD - 64);
  if (c->ntickets == MAX_TICKETS)
    return fail(-EBUSY, "%u tickets outstanding: collect some with nwc_client_wait",
                MAX_TICKETS);
  while (c->ticket_bytes + cap > MAX_TICKET_BYTES) { /* let replies in flight drain first */
    nwc_proto_hdr h;
    int rc = read_one(c, &h);
    if (rc < 0) return rc;
  }
  req->id = ++c->next_id;
  nwc_pw w;
  nwc_pw_init(&w);
  int64_t n = nwc_proto_req_encode(req, &w);
  int rc = n < 0 ? fail((int)n, "request too large for one frame (%s)", strerror((int)-n))
                 : send_all(c, w.buf, (size_t)n, NULL, 0);
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
  if (check_matvec(model, tensor, x, K, ncols, y, NWC_CLIENT_MAX_COLS) < 0) return -EINVAL;
  if (!ticket) return fail(-EINVAL, "bad arguments (no ticket)");
  nwc_proto_req req;
  matvec_req(&req, model, tensor, bias, scale, x, K, ncols, flags);
  if (req.x_bytes > NWC_PROTO_MAX_PAYLOAD - 4096)
    return fail(-E2BIG, "a pipelined x of %llu bytes is larger than a frame; use nwc_client_matvec",
                (unsigned long long)req.x_bytes);
  return LOCKED(c, submit(c, &req, y, cap, ticket));
}

int nwc_client_submit_gather(nwc_client *c, const char *model, const char *tensor,
                             const uint64_t *rows, size_t n, unsigned flags, void *out, size_t cap,
                             uint64_t *ticket) {
  if (check_names(model, tensor) < 0 || !tensor || !out || !ticket)
    return fail(-EINVAL, "bad arguments");
  nwc_proto_req req;
  uint8_t *idx;
  int rc = dequant_gather_req(&req, NWC_OP_GATHER, model, tensor, rows, n, flags, &idx);
  if (rc == 0) rc = LOCKED(c, submit(c, &req, out, cap, ticket));
  free(idx);
  return rc;
}

/* Hands back ticket t's outcome and frees its slot. */
static int collect(nwc_client *c, pending *t, uint64_t *id, unsigned *rflags) {
  int rc = t->status;
  if (rc < 0) fail(rc, "%s", t->msg ? t->msg : strerror(-rc));
  if (id) *id = t->id;
  if (rflags) *rflags = rc < 0 ? 0 : t->rflags;
  free(t->msg);
  *t = c->tickets[--c->ntickets];
  return rc;
}

static int do_wait(nwc_client *c, uint64_t id, unsigned *rflags) {
  if (!find_ticket(c, id))
    return fail(-ENOENT, "no ticket %llu (never submitted, or collected already)",
                (unsigned long long)id);
  pending *t;
  while (!(t = find_ticket(c, id))->done) {
    nwc_proto_hdr h;
    read_one(c, &h); /* a lost connection completes every ticket with its error */
  }
  return collect(c, t, NULL, rflags);
}

static int do_wait_any(nwc_client *c, uint64_t *id, unsigned *rflags) {
  if (!c->ntickets) return fail(-ENOENT, "no tickets outstanding");
  for (;;) {
    pending *oldest = NULL;
    for (unsigned i = 0; i < c->ntickets; i++)
      if (c->tickets[i].done && (!oldest || c->tickets[i].id < oldest->id)) oldest = &c->tickets[i];
    if (oldest) return collect(c, oldest, id, rflags);
    nwc_proto_hdr h;
    read_one(c, &h);
  }
}

int nwc_client_wait(nwc_client *c, uint64_t ticket, unsigned *rflags) {
  return LOCKED(c, do_wait(c, ticket, rflags));
}

int nwc_client_wait_any(nwc_client *c, uint64_t *ticket, unsigned *rflags) {
  return LOCKED(c, do_wait_any(c, ticket, rflags));
}

/* ---- CUDA IPC ----------------------------------------------------------------------------- */

static int do_cuda(nwc_client *c, nwc_proto_req *req, const nwc_client_cuda_buf *x,
                   const nwc_client_cuda_buf *y, const void *event, nwc_proto_compute *pc) {
  if (x) {
    memcpy(req->ipc_x, x->handle, NWC_PROTO_IPC_HANDLE);
    req->in_off = x->offset;
    if (x->bytes < req->x_bytes)
      return fail(-EINVAL, "x buffer of %llu bytes; %u columns of K floats need %llu",
                  (unsigned long long)x->bytes, req->ncols, (unsigned long long)req->x_bytes);
  }
  memcpy(req->ipc_y, y->handle, NWC_PROTO_IPC_HANDLE);
  req->out_off = y->offset, req->out_cap = y->bytes;
  if (event) memcpy(req->ipc_event, event, NWC_PROTO_IPC_HANDLE), req->has_event = 1;
  size_t len;
  int rc = call(c, req, NULL, 0, NULL, NULL, &len);
  if (rc < 0) return rc;
  nwc_pr r;
  nwc_pr_init(&r, c->rbuf, len);
  if (nwc_proto_get_compute(&r, pc) < 0 || nwc_pr_end(&r, "compute") < 0 ||
      pc->where != NWC_WHERE_DEVICE)
    return bad_reply();
  return 0;
}

static int do_matvec_cuda(nwc_client *c, const char *model, const char *tensor, const char *bias,
                          float scale, const nwc_client_cuda_buf *x, uint64_t K, unsigned ncols,
                          const nwc_client_cuda_buf *y, unsigned flags, const void *event) {
  nwc_proto_req req;
  matvec_req(&req, model, tensor, bias, scale, NULL, K, ncols, flags);
  req.op = NWC_OP_MATVEC_IPC;
  nwc_proto_compute pc;
  return do_cuda(c, &req, x, y, event, &pc);
}

int nwc_client_matvec_cuda(nwc_client *c, const char *model, const char *tensor, const char *bias,
                           float scale, const nwc_client_cuda_buf *x, uint64_t K, unsigned ncols,
                           const nwc_client_cuda_buf *y, unsigned flags, const void *event) {
  if (check_names(model, tensor) < 0 || !tensor || !x || !y || !ncols || !K ||
      ncols > NWC_PROTO_MAX_COLS)
    return fail(-EINVAL, "bad arguments (1..%u columns of K > 0 floats, buffers required)",
                NWC_PROTO_MAX_COLS);
  return LOCKED(c, do_matvec_cuda(c, model, tensor, bias, scale, x, K, ncols, y, flags, event));
}

static int do_dequant_cuda(nwc_client *c, const char *model, const char *tensor, unsigned flags,
                           const nwc_client_cuda_buf *out, const void *event, uint64_t *rows,
                           uint64_t *cols) {
  nwc_proto_req req = {0};
  set_names(&req, NWC_OP_DEQUANT_IPC, model, tensor);
  req.out = flags & NWC_CLIENT_BF16 ? NWC_OUT_BF16 : NWC_OUT_F32;
  nwc_proto_compute pc;
  int rc = do_cuda(c, &req, NULL, out, event, &pc);
  if (rc == 0 && rows) *rows = pc.rows;
  if (rc == 0 && cols) *cols = pc.cols;
  return rc;
}

int nwc_client_dequant_cuda(nwc_client *c, const char *model, const char *tensor, unsigned flags,
                            const nwc_client_cuda_buf *out, const void *event, uint64_t *rows,
                            uint64_t *cols) {
  if (check_names(model, tensor) < 0 || !tensor || !out) return fail(-EINVAL, "bad arguments");
  return LOCKED(c, do_dequant_cuda(c, model, tensor, flags, out, event, rows, cols));
}
