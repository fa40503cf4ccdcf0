/*
 * server.c - nwcd's event loop: the listening Unix socket, connections, framing, back-pressure
 * and the outbox through which worker threads hand replies back.
 *
 * Design (after OpenSMTPD control.c): the socket is bound under a tight umask (mode 0660), a
 * path that already exists is probed with connect() first (a live daemon: refuse; a refused
 * connection: stale, unlink), SO_PEERCRED is read on accept and connections are capped per uid.
 * Each connection is a uv_poll_t on the raw descriptor: reads use recvmsg() so that descriptors
 * passed with SCM_RIGHTS (shared region, import files) are collected in arrival order and given
 * to the frames flagged NWC_PF_FDS; writes go through a per-connection queue of whole frames.
 *
 * Connection life: refs counts the open socket (1) plus each job in flight.  Closing stops the
 * poll handle and uv_close()s it; the close callback closes the descriptor and drops the socket's
 * reference; the struct (with its shared-region mapping) is freed when refs reaches 0, so a
 * worker still running a request of a vanished client never touches freed memory, and its reply
 * is dropped.  Only the loop thread touches a connection, except a job's read of the shared
 * region, which stays mapped until the struct is freed.
 *
 * Back-pressure: a connection stops being read while it has max_inflight requests in flight or
 * max_outq reply bytes queued (a client that stops reading its replies), and resumes as they
 * drain; everyone else is served meanwhile.  Framing errors (bad magic, oversized, unknown
 * flags) get an error reply and a disconnect, since the stream cannot be resynchronized; a
 * malformed payload inside a good frame gets an error reply and the connection stays.
 */
#include "nwcd.h"
#include "service.h"

#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#define MAX_QUEUED_FDS 64
#define READ_CHUNK (64u << 10)

typedef struct outbuf {
  struct outbuf *next;
  uint8_t *buf;
  size_t len, off;
} outbuf;

typedef struct outmsg {
  struct outmsg *next;
  nwcd_job *job;
  uint8_t *buf;
  size_t len;
  bool final;
} outmsg;

typedef struct nwcd_server nwcd_server;

typedef struct nwcd_conn {
  uv_poll_t poll; /* freed only with the struct, after its close callback */
  nwcd_server *srv;
  int fd;
  uid_t uid;
  gid_t gid;
  pid_t pid;
  unsigned refs;
  bool closing, hello, close_after_flush;
  int events;
  uint8_t *rbuf;
  size_t roff, rlen, rcap; /* unparsed bytes are rbuf[roff .. rlen) */
  int fdq[MAX_QUEUED_FDS];
  unsigned nfdq;
  outbuf *oh, *ot;
  size_t obytes;
  unsigned inflight;
  uint8_t *shm;
  uint64_t shm_size;
  struct nwcd_conn *next, *prev;
} nwcd_conn;

struct nwcd_server {
  nwcd *d;
  uv_loop_t loop;
  uv_poll_t listen;
  int lfd;
  uv_async_t async;
  uv_signal_t sigint, sigterm;
  uv_timer_t deadline;
  pthread_mutex_t lock;
  outmsg *mh, *mt;
  nwcd_conn *conns;
  bool stopping, closed_all;
  uint64_t jobs; /* in flight on the pool, all connections */
  ino_t sock_ino;
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

static void conn_close(nwcd_conn *c);
static void conn_update(nwcd_conn *c);
static void conn_input(nwcd_conn *c);
static void check_shutdown(nwcd_server *s);

static void conn_unref(nwcd_conn *c) {
  if (--c->refs) return;
  for (unsigned i = 0; i < c->nfdq; i++) close(c->fdq[i]);
  for (outbuf *o = c->oh, *n; o; o = n) n = o->next, free(o->buf), free(o);
  if (c->shm) munmap(c->shm, c->shm_size);
  free(c->rbuf);
  atomic_fetch_sub(&c->srv->d->stats.connections, 1);
  free(c);
}

static void on_conn_closed(uv_handle_t *h) {
  nwcd_conn *c = h->data;
  close(c->fd);
  if (c->prev) c->prev->next = c->next;
  else c->srv->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  nwcd_server *s = c->srv;
  conn_unref(c);
  check_shutdown(s);
}

static void conn_close(nwcd_conn *c) {
  if (c->closing) return;
  c->closing = true;
  uv_poll_stop(&c->poll);
  uv_close((uv_handle_t *)&c->poll, on_conn_closed);
}

/* Writes what the queue holds; 0, or -1 when the connection was closed. */
static int conn_flush(nwcd_conn *c) {
  while (c->oh && !c->closing) {
    outbuf *o = c->oh;
    ssize_t n = send(c->fd, o->buf + o->off, o->len - o->off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) break;
      conn_close(c);
      return -1;
    }
    o->off += (size_t)n;
    c->obytes -= (size_t)n;
    if (o->off == o->len) {
      c->oh = o->next;
      if (!c->oh) c->ot = NULL;
      free(o->buf), free(o);
    }
  }
  if (!c->oh && c->close_after_flush) {
    conn_close(c);
    return -1;
  }
  return 0;
}

/* Queues a frame (takes buf) and tries to write it at once. */
static void conn_send(nwcd_conn *c, uint8_t *buf, size_t len) {
  if (c->closing) {
    free(buf);
    return;
  }
  outbuf *o = malloc(sizeof *o);
  if (!o) {
    free(buf);
    conn_close(c);
    return;
  }
  *o = (outbuf){NULL, buf, len, 0};
  if (c->ot) c->ot->next = o;
  else c->oh = o;
  c->ot = o;
  c->obytes += len;
  if (conn_flush(c) == 0) conn_update(c);
}

/* An error reply: status err, payload the message (detail or errno text). */
static void conn_error(nwcd_conn *c, const nwc_proto_hdr *h, int err, const char *msg) {
  nwc_pw w;
  nwc_pw_init(&w);
  char buf[NWC_PROTO_MAX_MSG];
  snprintf(buf, sizeof buf, "%s", msg && *msg ? msg : nwc_strerror(err));
  nwc_pw_str(&w, buf);
  int64_t n = nwc_pw_finish(&w, h ? h->op : 0, 0, err, h ? h->id : 0);
  atomic_fetch_add(&c->srv->d->stats.errors, 1);
  if (nwcd_log_level >= NWCD_LOG_DEBUG)
    nwcd_log(NWCD_LOG_DEBUG, "uid %u pid %d: %s: %s", (unsigned)c->uid, (int)c->pid,
             h && nwc_proto_op_name(h->op) ? nwc_proto_op_name(h->op) : "frame", buf);
  if (n < 0) {
    nwc_pw_free(&w);
    conn_close(c);
    return;
  }
  conn_send(c, w.buf, (size_t)n);
}

static bool conn_can_read(const nwcd_conn *c) {
  const nwcd_config *cfg = &c->srv->d->cfg;
  return !c->closing && !c->close_after_flush && !c->srv->stopping &&
         c->inflight < cfg->max_inflight && c->obytes < cfg->max_outq;
}

static void on_conn_poll(uv_poll_t *h, int status, int events);

static void conn_update(nwcd_conn *c) {
  if (c->closing) return;
  int ev = (conn_can_read(c) ? UV_READABLE : 0) | (c->oh ? UV_WRITABLE : 0);
  if (ev == c->events) return;
  c->events = ev;
  if (ev) uv_poll_start(&c->poll, ev, on_conn_poll);
  else uv_poll_stop(&c->poll);
}

static void close_fds(int *fds, unsigned n) {
  for (unsigned i = 0; i < n; i++) close(fds[i]);
}

/* Takes n descriptors from the front of the queue into out. */
static int take_fds(nwcd_conn *c, unsigned n, int *out) {
  NWC_RETURN_IF(c->nfdq < n, -EBADMSG, "the frame needs %u descriptors, %u arrived", n, c->nfdq);
  memcpy(out, c->fdq, n * sizeof(int));
  memmove(c->fdq, c->fdq + n, (c->nfdq - n) * sizeof(int));
  c->nfdq -= n;
  return 0;
}

static void do_hello(nwcd_conn *c, const nwc_proto_hdr *h, const nwc_proto_req *r) {
  if (r->ver_min > NWC_PROTO_VERSION || r->ver_max < NWC_PROTO_VERSION) {
    char msg[160];
    if (r->ver_min == r->ver_max)
      snprintf(msg, sizeof msg, "protocol %u not supported (this daemon speaks %u)", r->ver_min,
               NWC_PROTO_VERSION);
    else
      snprintf(msg, sizeof msg, "protocols %u..%u not supported (this daemon speaks %u)",
               r->ver_min, r->ver_max, NWC_PROTO_VERSION);
    c->close_after_flush = true;
    conn_error(c, h, -EPROTONOSUPPORT, msg);
    return;
  }
  c->hello = true;
  nwc_proto_hello hello = {NWC_PROTO_VERSION,
                           NWC_CAP_SHM | NWC_CAP_FDIMPORT | NWC_CAP_BATCH | NWC_CAP_MAPPED |
                               (c->srv->d->backend->host_share ? NWC_CAP_SHARE : 0),
                           NWC_PROTO_MAX_PAYLOAD, NWCD_VERSION, ""};
  snprintf(hello.backend, sizeof hello.backend, "%s", c->srv->d->backend->name);
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_put_hello(&w, &hello);
  int64_t n = nwc_pw_finish(&w, h->op, 0, 0, h->id);
  if (n < 0) {
    nwc_pw_free(&w);
    conn_close(c);
    return;
  }
  conn_send(c, w.buf, (size_t)n);
}

static int do_shm(nwcd_conn *c, const nwc_proto_req *r, int fd) {
  NWC_RETURN_IF(c->shm, -EEXIST, "this connection already has a shared region");
  struct stat st;
  NWC_RETURN_IF(fstat(fd, &st) < 0, -errno, "fstat of the shared region: %s", strerror(errno));
  NWC_RETURN_IF(!S_ISREG(st.st_mode), -EINVAL, "the shared region is not a memfd or file");
  int seals = fcntl(fd, F_GET_SEALS);
  NWC_RETURN_IF(seals < 0 || !(seals & F_SEAL_SHRINK), -EPERM,
                "the shared region must be a memfd sealed against shrinking (F_SEAL_SHRINK)");
  NWC_RETURN_IF(r->shm_size == 0 || r->shm_size > (uint64_t)st.st_size, -EINVAL,
                "shared region of %llu bytes, the memfd holds %lld",
                (unsigned long long)r->shm_size, (long long)st.st_size);
  NWC_RETURN_IF(r->shm_size > (UINT64_C(1) << 40), -EINVAL, "shared region too large");
  void *p = mmap(NULL, r->shm_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  NWC_RETURN_IF(p == MAP_FAILED, -errno, "mmap of the shared region: %s", strerror(errno));
  c->shm = p, c->shm_size = r->shm_size;
  return 0;
}

/* Handles one complete frame whose payload is rbuf[off .. off + h->length). */
static void conn_frame(nwcd_conn *c, const nwc_proto_hdr *h, const uint8_t *payload) {
  nwcd *d = c->srv->d;
  atomic_fetch_add(&d->stats.requests, 1);
  nwcd_job *j = calloc(1, sizeof *j);
  uint8_t *copy = malloc(h->length ? h->length : 1);
  if (!j || !copy) {
    free(j), free(copy);
    conn_error(c, h, -ENOMEM, "out of memory");
    return;
  }
  memcpy(copy, payload, h->length);
  j->payload = copy, j->d = d;
  int rc = nwc_proto_req_decode(h, copy, &j->req);
  if (rc == 0 && !c->hello && h->op != NWC_OP_HELLO)
    rc = nwc__fail(-EPROTO, "the first request must be hello");
  if (rc == 0) rc = nwcd_policy_check(c->fd, c->uid, c->gid, c->pid, &j->req); /* policy.c */
  unsigned nfds = 0;
  if (rc == 0 && (h->flags & NWC_PF_FDS))
    nfds = h->op == NWC_OP_SHM || h->op == NWC_OP_MAP ? 1 : j->req.has_index + j->req.nfiles;
  if (rc == 0 && nfds) {
    rc = take_fds(c, nfds, j->fds);
    if (rc == 0) j->nfds = nfds;
  }
  if (rc == 0 && h->op == NWC_OP_HELLO) {
    do_hello(c, h, &j->req);
    nwcd_job_free(j);
    return;
  }
  if (rc == 0 && h->op == NWC_OP_SHM) {
    rc = do_shm(c, &j->req, j->fds[0]);
    if (rc == 0) {
      nwc_pw w;
      nwc_pw_init(&w);
      int64_t n = nwc_pw_finish(&w, h->op, 0, 0, h->id);
      if (n > 0) conn_send(c, w.buf, (size_t)n);
      else nwc_pw_free(&w);
      nwcd_job_free(j);
      return;
    }
  }
  if (rc < 0) {
    /* Descriptors that came for a frame we refuse are not kept for the next one. */
    if (h->flags & NWC_PF_FDS) close_fds(c->fdq, c->nfdq), c->nfdq = 0;
    if (rc == -EPROTO) c->close_after_flush = true;
    conn_error(c, h, rc, nwc_error_detail());
    nwcd_job_free(j);
    return;
  }
  j->conn = c, j->shm = c->shm, j->shm_size = c->shm_size;
  j->started_ns = nwcd_now_ns();
  c->refs++, c->inflight++, c->srv->jobs++;
  nwcd_pool_submit(d->pool, j);
}

/* Parses the complete frames buffered on c while it may take more. */
static void conn_input(nwcd_conn *c) {
  while (!c->closing && conn_can_read(c) && c->rlen - c->roff >= NWC_PROTO_HEADER) {
    nwc_proto_hdr h;
    int rc = nwc_proto_hdr_decode(c->rbuf + c->roff, &h);
    if (rc < 0) {
      c->close_after_flush = true;
      conn_error(c, &h, rc, nwc_error_detail());
      break;
    }
    size_t need = NWC_PROTO_HEADER + (size_t)h.length;
    if (c->rlen - c->roff < need) break;
    conn_frame(c, &h, c->rbuf + c->roff + NWC_PROTO_HEADER);
    c->roff += need;
  }
  if (c->roff == c->rlen) c->roff = c->rlen = 0;
  conn_update(c);
}

static void conn_read(nwcd_conn *c) {
  for (int iter = 0; iter < 8 && conn_can_read(c); iter++) {
    if (c->roff && c->rlen - c->roff < NWC_PROTO_HEADER + 4096) {
      memmove(c->rbuf, c->rbuf + c->roff, c->rlen - c->roff);
      c->rlen -= c->roff, c->roff = 0;
    }
    if (c->rcap - c->rlen < READ_CHUNK) {
      size_t cap = c->rcap ? c->rcap * 2 : 2 * READ_CHUNK;
      if (cap > NWC_PROTO_HEADER + NWC_PROTO_MAX_PAYLOAD + READ_CHUNK && cap - c->rlen < READ_CHUNK)
        cap = c->rlen + READ_CHUNK;
      uint8_t *b = realloc(c->rbuf, cap);
      if (!b) {
        conn_close(c);
        return;
      }
      c->rbuf = b, c->rcap = cap;
    }
    union {
      char buf[CMSG_SPACE(sizeof(int) * MAX_QUEUED_FDS)];
      struct cmsghdr align;
    } cm;
    struct iovec iov = {c->rbuf + c->rlen, c->rcap - c->rlen};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
                         .msg_controllen = sizeof cm.buf};
    ssize_t n = recvmsg(c->fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
    for (struct cmsghdr *h = CMSG_FIRSTHDR(&msg); n >= 0 && h; h = CMSG_NXTHDR(&msg, h)) {
      if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
      unsigned k = (unsigned)((h->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      int fds[MAX_QUEUED_FDS];
      memcpy(fds, CMSG_DATA(h), k * sizeof(int));
      for (unsigned i = 0; i < k; i++) {
        if (c->nfdq < MAX_QUEUED_FDS) c->fdq[c->nfdq++] = fds[i];
        else close(fds[i]), msg.msg_flags |= MSG_CTRUNC;
      }
    }
    if (n <= 0 || (msg.msg_flags & MSG_CTRUNC)) {
      if (n > 0)
        nwcd_log(NWCD_LOG_WARN, "uid %u pid %d: too many descriptors passed; disconnecting",
                 (unsigned)c->uid, (int)c->pid);
      conn_close(c);
      return;
    }
    c->rlen += (size_t)n;
    conn_input(c);
  }
}

static void on_conn_poll(uv_poll_t *h, int status, int events) {
  nwcd_conn *c = h->data;
  if (status < 0) {
    conn_close(c);
    return;
  }
  if ((events & UV_WRITABLE) && conn_flush(c) < 0) return;
  if (events & UV_READABLE) conn_read(c);
  if (!c->closing) conn_update(c);
  check_shutdown(c->srv);
}

static unsigned conns_of_uid(nwcd_server *s, uid_t uid) {
  unsigned n = 0;
  for (nwcd_conn *c = s->conns; c; c = c->next) n += !c->closing && c->uid == uid;
  return n;
}

static void on_listen(uv_poll_t *h, int status, int events) {
  nwcd_server *s = h->data;
  (void)events;
  if (status < 0 || s->stopping) return;
  for (int k = 0; k < 64; k++) {
    int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EINTR)
        nwcd_log(NWCD_LOG_WARN, "accept: %s", strerror(errno));
      return;
    }
    struct ucred cred = {0, (uid_t)-1, (gid_t)-1};
    socklen_t cl = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0) {
      close(fd);
      continue;
    }
    if (conns_of_uid(s, cred.uid) >= s->d->cfg.max_conn_per_uid) {
      nwc_pw w;
      nwc_pw_init(&w);
      char msg[128];
      snprintf(msg, sizeof msg, "too many connections for uid %u (limit %u)", (unsigned)cred.uid,
               s->d->cfg.max_conn_per_uid);
      nwc_pw_str(&w, msg);
      int64_t n = nwc_pw_finish(&w, 0, 0, -EUSERS, 0);
      if (n > 0 && send(fd, w.buf, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
        /* best effort */
      }
      nwc_pw_free(&w);
      nwcd_log(NWCD_LOG_WARN, "%s; refused pid %d", msg, (int)cred.pid);
      close(fd);
      continue;
    }
    nwcd_conn *c = calloc(1, sizeof *c);
    if (!c) {
      close(fd);
      continue;
    }
    c->srv = s, c->fd = fd, c->uid = cred.uid, c->gid = cred.gid, c->pid = cred.pid, c->refs = 1;
    uv_poll_init(&s->loop, &c->poll, fd);
    c->poll.data = c;
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    atomic_fetch_add(&s->d->stats.connections, 1);
    atomic_fetch_add(&s->d->stats.conn_total, 1);
    conn_update(c);
  }
}

void nwcd_server_send(nwcd_job *j, uint8_t *buf, size_t len, bool final) {
  nwcd_server *s = j->d->server;
  outmsg *m = malloc(sizeof *m);
  while (!m) { /* the job's completion must reach the loop: retry rather than leak it */
    usleep(1000);
    m = malloc(sizeof *m);
  }
  *m = (outmsg){NULL, j, buf, len, final};
  pthread_mutex_lock(&s->lock);
  if (s->mt) s->mt->next = m;
  else s->mh = m;
  s->mt = m;
  pthread_mutex_unlock(&s->lock);
  uv_async_send(&s->async);
}

static void on_async(uv_async_t *a) {
  nwcd_server *s = a->data;
  pthread_mutex_lock(&s->lock);
  outmsg *m = s->mh;
  s->mh = s->mt = NULL;
  pthread_mutex_unlock(&s->lock);
  while (m) {
    outmsg *next = m->next;
    nwcd_conn *c = m->job->conn;
    if (m->buf) conn_send(c, m->buf, m->len);
    if (m->final) {
      c->inflight--, s->jobs--;
      nwcd_job_free(m->job);
      if (!c->closing) conn_input(c); /* frames held back by back-pressure */
      conn_unref(c);
    }
    free(m);
    m = next;
  }
  check_shutdown(s);
}

static void on_closed_quiet(uv_handle_t *h) { (void)h; }

static void close_everything(nwcd_server *s) {
  if (s->closed_all) return;
  s->closed_all = true;
  nwcd_service_close(); /* SIGHUP and watchdog handles, the service thread (notify.c) */
  for (nwcd_conn *c = s->conns; c; c = c->next) conn_close(c);
  uv_close((uv_handle_t *)&s->async, on_closed_quiet);
  uv_close((uv_handle_t *)&s->sigint, on_closed_quiet);
  uv_close((uv_handle_t *)&s->sigterm, on_closed_quiet);
  uv_close((uv_handle_t *)&s->deadline, on_closed_quiet);
}

/* While stopping: once no request is in flight and every reply is written, close all. */
static void check_shutdown(nwcd_server *s) {
  if (!s->stopping || s->closed_all || s->jobs) return;
  for (nwcd_conn *c = s->conns; c; c = c->next)
    if (c->inflight || (c->oh && !c->closing)) return;
  close_everything(s);
}

static void on_deadline(uv_timer_t *t) {
  nwcd_server *s = t->data;
  nwcd_log(NWCD_LOG_WARN, "shutdown: requests still running after 20 s; closing connections");
  for (nwcd_conn *c = s->conns; c; c = c->next) conn_close(c);
}

static void on_signal(uv_signal_t *h, int signum) {
  nwcd_server *s = h->data;
  if (s->stopping) return;
  nwcd_log(NWCD_LOG_INFO, "%s: stopping (finishing requests in flight)", strsignal(signum));
  s->stopping = true;
  nwcd_service_stopping(); /* STOPPING=1 (notify.c) */
  uv_close((uv_handle_t *)&s->listen, on_closed_quiet);
  close(s->lfd);
  struct stat st;
  if (stat(s->path, &st) == 0 && st.st_ino == s->sock_ino) unlink(s->path);
  for (nwcd_conn *c = s->conns; c; c = c->next) conn_update(c);
  uv_timer_start(&s->deadline, on_deadline, 20000, 0);
  check_shutdown(s);
}

/* Binds the listening socket at path (probing an existing one first). */
static int listen_at(nwcd_server *s, const char *path, unsigned mode) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  NWC_RETURN_IF(strlen(path) >= sizeof sa.sun_path, -ENAMETOOLONG, "socket path %s is too long",
                path);
  strcpy(sa.sun_path, path);
  snprintf(s->path, sizeof s->path, "%s", path);
  struct stat st;
  if (lstat(path, &st) == 0) {
    NWC_RETURN_IF(!S_ISSOCK(st.st_mode), -EEXIST, "%s exists and is not a socket; not removing it",
                  path);
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    NWC_RETURN_IF(probe < 0, -errno, "socket: %s", strerror(errno));
    int rc = connect(probe, (struct sockaddr *)&sa, sizeof sa);
    int err = errno;
    close(probe);
    NWC_RETURN_IF(rc == 0, -EADDRINUSE, "another daemon is serving %s", path);
    NWC_RETURN_IF(err != ECONNREFUSED, -err, "probing %s: %s", path, strerror(err));
    nwcd_log(NWCD_LOG_INFO, "removing stale socket %s", path);
    NWC_RETURN_IF(unlink(path) < 0 && errno != ENOENT, -errno, "unlink %s: %s", path,
                  strerror(errno));
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  NWC_RETURN_IF(fd < 0, -errno, "socket: %s", strerror(errno));
  mode_t old = umask(0177);
  int rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
  int err = errno;
  umask(old);
  if (rc < 0) {
    close(fd);
    return nwc__fail(-err, "bind %s: %s", path, strerror(err));
  }
  if (chmod(path, mode) < 0 || listen(fd, 128) < 0 || stat(path, &st) < 0) {
    err = errno;
    close(fd);
    unlink(path);
    return nwc__fail(-err, "listen on %s: %s", path, strerror(err));
  }
  s->sock_ino = st.st_ino;
  s->lfd = fd;
  return 0;
}

void nwcd_server_get_stats(nwcd *d, nwc_proto_stats *st) {
  st->uptime_ms = (nwcd_now_ns() - d->start_ns) / 1000000;
  st->connections = atomic_load(&d->stats.connections);
  st->conn_total = atomic_load(&d->stats.conn_total);
  st->requests = atomic_load(&d->stats.requests);
  st->errors = atomic_load(&d->stats.errors);
  st->batched_passes = atomic_load(&d->stats.batched_passes);
  st->batched_columns = atomic_load(&d->stats.batched_columns);
  st->threads = d->cfg.threads;
  snprintf(st->backend, sizeof st->backend, "%s", d->backend->name);
}

int nwcd_server_run(nwcd *d) {
  nwcd_server *s = calloc(1, sizeof *s);
  if (!s) return -ENOMEM;
  s->d = d;
  d->server = s;
  s->lfd = -1;
  char def[256];
  const char *path = d->cfg.socket_path ? d->cfg.socket_path : nwcd_default_socket(def, sizeof def);
  if (!d->cfg.socket_path) {
    /* The default lives in a directory of its own: create it (mode 0750) if missing. */
    char dir[256];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
      *slash = 0;
      if (mkdir(dir, 0750) < 0 && errno != EEXIST)
        nwcd_log(NWCD_LOG_WARN, "mkdir %s: %s", dir, strerror(errno));
    }
  }
  char activated[sizeof s->path + 32];
  int rc = nwcd_service_listen_fd(activated, sizeof activated); /* systemd's socket, if any */
  if (rc >= 0) s->lfd = rc, rc = 0, path = activated;
  else if (rc == -ENOENT) rc = listen_at(s, path, d->cfg.socket_mode);
  if (rc < 0) {
    free(s);
    d->server = NULL;
    return rc;
  }
  pthread_mutex_init(&s->lock, NULL);
  uv_loop_init(&s->loop);
  uv_poll_init(&s->loop, &s->listen, s->lfd);
  s->listen.data = s;
  uv_poll_start(&s->listen, UV_READABLE, on_listen);
  uv_async_init(&s->loop, &s->async, on_async);
  s->async.data = s;
  uv_signal_init(&s->loop, &s->sigint);
  uv_signal_init(&s->loop, &s->sigterm);
  s->sigint.data = s->sigterm.data = s;
  uv_signal_start(&s->sigint, on_signal, SIGINT);
  uv_signal_start(&s->sigterm, on_signal, SIGTERM);
  uv_timer_init(&s->loop, &s->deadline);
  s->deadline.data = s;
  rc = nwcd_service_start(d, &s->loop); /* SIGHUP, watchdog; READY=1 after the preload */
  if (rc < 0) nwcd_log(NWCD_LOG_ERR, "%s", nwc_error_detail());
  nwcd_log(NWCD_LOG_INFO, "serving %s on %s (backend %s, %u threads, budget %llu MiB)",
           d->cfg.store_dir, path, d->backend->name, d->cfg.threads,
           (unsigned long long)(d->cfg.budget >> 20));
  printf("nwcd: ready on %s\n", path);
  fflush(stdout);
  uv_run(&s->loop, UV_RUN_DEFAULT);
  /* Workers may still run jobs of connections closed by the deadline: drain their outbox. */
  nwcd_pool_free(d->pool);
  d->pool = NULL;
  for (outmsg *m = s->mh, *n; m; m = n) {
    n = m->next;
    free(m->buf);
    if (m->final) {
      nwcd_conn *c = m->job->conn;
      nwcd_job_free(m->job);
      conn_unref(c);
    }
    free(m);
  }
  uv_loop_close(&s->loop);
  pthread_mutex_destroy(&s->lock);
  free(s);
  d->server = NULL;
  return 0;
}
