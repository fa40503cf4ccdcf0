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
 * reference; the struct (with its shared-region mapping) is freed by whoever drops the last
 * reference (the loop, or the worker finishing the connection's last job), so a worker still
 * running a request of a vanished client never touches freed memory, and its reply is dropped.
 *
 * Replies (the latency path): a worker writes its reply frames to the socket itself, with no
 * hand-off to the loop thread.  Each connection's output (the queue of unsent frames and the
 * descriptor's write side) is guarded by its olock: a frame is sent at once when nothing is
 * queued before it, otherwise (or for what a full socket buffer did not take) queued whole, in
 * order, and the loop thread writes the queue as the socket becomes writable; frames never
 * interleave.  odead, set under olock before the descriptor is closed, stops every later write.
 * A worker wakes the loop (uv_async) only when the loop must act: it queued the first frame of
 * an empty queue (the loop must poll for writability), a write failed, the connection's reading
 * is paused for back-pressure, or the daemon is stopping.  Everything else about a connection
 * (reading, framing, the descriptor queue, the connection list) is the loop thread's alone.
 * A small matvec or gather from the only active connection, while the pool is idle, runs on the
 * loop thread itself (run_inline): no hand-off at all, and no one waits behind it.
 *
 * Back-pressure: a connection stops being read while it has max_inflight requests in flight or
 * max_outq reply bytes queued (a client that stops reading its replies), and resumes as they
 * drain; everyone else is served meanwhile.  Reading less is not enough: requests already read
 * (up to max_inflight, all in one pipelined write) would each queue a reply.  So a job does not
 * start while its connection is over max_outq, or has output queued while its uid's connections
 * together are over max_outq_uid (uid_out; conn_over): the worker that takes it holds it on the
 * connection (nwcd_server_admit, in order: once one is held, later ones are held behind it) and
 * the loop submits the held jobs again when the queue drains (release_held) or the connection
 * closes.  The uid's bound holds jobs only, never reading, so that a client blocked sending
 * (docs/protocol.md: it keeps its unread replies under max_outq) always gets to read.
 * A connection's memory is thus at most max_outq plus one reply per worker thread that took a
 * job of it before the queue filled, and a worker never waits for a slow reader.  The uid's
 * bound holds back only its connections that have output queued themselves (conn_over), so a
 * uid's connection that reads its replies is not slowed by its slow siblings: a uid's queued
 * bytes stay under max_outq_uid plus one reply frame (at most NWC_PROTO_MAX_PAYLOAD) per
 * connection and per worker.  The loop sets paused before it holds frames back
 * or stops polling for back-pressure and re-checks afterwards; a worker finishing a job drops
 * inflight before it reads paused, so one of the two always sees the other (no lost wake-up).
 * Framing errors (bad magic, oversized, unknown flags) get an error reply and a disconnect,
 * since the stream cannot be resynchronized; a malformed payload inside a good frame gets an
 * error reply and the connection stays.
 */
#include "server.h"

#include "clock.h"
#include "log.h"
#include "notify.h"
#include "nwcd.h"
#include "policy.h"

#include "nwc_error.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
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
#define INLINE_MAX_BYTES (4u << 20)
#define INLINE_MAX_DEVICE_BYTES (64u << 20)
#define INLINE_QUIET_NS 2000000
#define YIELD_RAN_NS 20000
#define HELLO_TIMEOUT_NS 5000000000ull /* a connection must say hello within this */
#define IDLE_EVICT_NS 2000000000ull    /* idle this long, a connection may give way (on_listen) */

typedef struct outbuf {
  struct outbuf *next;
  uint8_t *buf;
  size_t len, off;
} outbuf;

typedef struct nwcd_server nwcd_server;

/* The unsent reply bytes of all connections of one uid, shared by them (refs: connections). */
typedef struct uid_out {
  atomic_size_t bytes;
  atomic_uint refs;
} uid_out;

typedef struct nwcd_conn {
  uv_poll_t poll; /* freed only with the struct, after its close callback */
  nwcd_server *srv;
  int fd;
  uid_t uid;
  gid_t gid;
  pid_t pid;
  atomic_uint refs;
  atomic_uint inflight;
  atomic_bool paused; /* reading stopped for back-pressure: a finishing job wakes the loop */
  bool closing, hello, close_after_flush; /* loop thread only, like everything down to next */
  bool alone_cap; /* the client asked for NWC_PF_ALONE (NWC_CAP_ALONE in its hello) */
  uint64_t born_ns, last_ns; /* accepted; its last request read (nwcd_now_ns) */
  int events;
  uint8_t *rbuf;
  size_t roff, rlen, rcap; /* unparsed bytes are rbuf[roff .. rlen) */
  int fdq[MAX_QUEUED_FDS];
  unsigned nfdq;
  struct nwcd_conn *next, *prev;
  pthread_mutex_t olock; /* the output: queue, odead, oerr, writes to fd */
  outbuf *oh, *ot;
  atomic_size_t obytes; /* queued, unsent reply bytes (written under olock) */
  uid_out *uo;          /* the uid's total of obytes (set at accept, freed with the last ref) */
  nwcd_job *held, *held_tail; /* jobs held back while the output is over a bound (olock) */
  bool odead;           /* the descriptor is closing: nothing more is written */
  bool oerr;            /* a write failed: the loop closes the connection */
  uint8_t *shm;
  uint64_t shm_size;
} nwcd_conn;

struct nwcd_server {
  nwcd *d;
  uv_loop_t loop;
  uv_poll_t listen;
  int lfd;
  uv_async_t async;
  uv_signal_t sigint, sigterm;
  uv_timer_t deadline;
  uv_timer_t hello_timer; /* each second: closes connections that never said hello */
  uv_idle_t poll;       /* active while the loop polls for the next request (loop_poll) */
  uint64_t poll_until;  /* when it stops: poll_us after the last request */
  pthread_mutex_t lock; /* async_closed, so that no worker wakes a closed handle */
  bool async_closed;
  nwcd_conn *conns;
  atomic_bool stopping;
  bool closed_all;
  atomic_uint_fast64_t jobs; /* in flight, all connections */
  nwcd_conn *last_conn;      /* whose request came last, and when (run_inline); only compared */
  uint64_t last_ns;
  ino_t sock_ino;
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

static void conn_close(nwcd_conn *c);
static void wake_loop(nwcd_server *s);
static void release_held(nwcd_conn *c);
static void conn_update(nwcd_conn *c);
static void conn_input(nwcd_conn *c);
static void check_shutdown(nwcd_server *s);

/* Closes a job's descriptors and frees it (the server made it). */
static void job_free(nwcd_job *j) {
  if (!j) return;
  for (unsigned i = 0; i < j->nfds; i++) close(j->fds[i]);
  nwc_proto_req_clear(&j->req);
  free(j->payload);
  free(j);
}

/* Drops a reference (any thread); the last one frees the struct. */
static void conn_unref(nwcd_conn *c) {
  if (atomic_fetch_sub(&c->refs, 1) != 1) return;
  if (c->srv->d->backend->forget) c->srv->d->backend->forget(c); /* IPC handles, registrations */
  for (unsigned i = 0; i < c->nfdq; i++) close(c->fdq[i]);
  for (outbuf *o = c->oh, *n; o; o = n) {
    n = o->next;
    atomic_fetch_sub(&c->uo->bytes, o->len - o->off);
    free(o->buf), free(o);
  }
  if (atomic_fetch_sub(&c->uo->refs, 1) == 1) free(c->uo);
  else wake_loop(c->srv); /* the uid's other connections may be under the bound now */
  if (c->shm) munmap(c->shm, c->shm_size);
  free(c->rbuf);
  pthread_mutex_destroy(&c->olock);
  atomic_fetch_sub(&c->srv->d->stats.connections, 1);
  free(c);
}

/* Wakes the loop thread (any thread) unless the daemon has closed its wake-up handle. */
static void wake_loop(nwcd_server *s) {
  pthread_mutex_lock(&s->lock);
  if (!s->async_closed) uv_async_send(&s->async);
  pthread_mutex_unlock(&s->lock);
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
  pthread_mutex_lock(&c->olock);
  c->odead = true;
  pthread_mutex_unlock(&c->olock);
  release_held(c); /* they run, and their replies are dropped */
  uv_poll_stop(&c->poll);
  uv_close((uv_handle_t *)&c->poll, on_conn_closed);
}

/* Sends buf[*off .. len) until done or the socket is full; false when the write failed. */
static bool send_some(int fd, const uint8_t *buf, size_t len, size_t *off) {
  while (*off < len) {
    ssize_t n = send(fd, buf + *off, len - *off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
    *off += (size_t)n;
  }
  return true;
}

/* Writes what the queue holds (caller holds olock); a failed write sets oerr. */
static void flush_locked(nwcd_conn *c) {
  while (c->oh && !c->odead && !c->oerr) {
    outbuf *o = c->oh;
    size_t off0 = o->off;
    c->oerr = !send_some(c->fd, o->buf, o->len, &o->off);
    atomic_fetch_sub(&c->obytes, o->off - off0);
    atomic_fetch_sub(&c->uo->bytes, o->off - off0);
    if (o->off < o->len) break;
    c->oh = o->next;
    if (!c->oh) c->ot = NULL;
    free(o->buf), free(o);
  }
}

/* Writes a whole frame (takes buf), from any thread: at once when nothing is queued before it,
 * else (or its unsent rest) at the end of the queue.  Returns true when the loop must look at c:
 * the queue was empty before (it must poll for writability) or the connection failed. */
static bool conn_put(nwcd_conn *c, uint8_t *buf, size_t len) {
  bool wake = false;
  size_t off = 0;
  pthread_mutex_lock(&c->olock);
  if (c->odead || c->oerr) goto drop;
  if (!c->oh) {
    if (!send_some(c->fd, buf, len, &off)) goto fail;
    if (off == len) goto drop; /* all sent */
    wake = true;
  }
  outbuf *o = malloc(sizeof *o);
  if (!o) goto fail; /* part of the frame may have gone out: the stream cannot continue */
  *o = (outbuf){NULL, buf, len, off};
  if (c->ot) c->ot->next = o;
  else c->oh = o;
  c->ot = o;
  atomic_fetch_add(&c->obytes, len - off);
  atomic_fetch_add(&c->uo->bytes, len - off);
  pthread_mutex_unlock(&c->olock);
  return wake;
fail:
  c->oerr = true;
  wake = true;
drop:
  pthread_mutex_unlock(&c->olock);
  free(buf);
  return wake;
}

/* conn_put from the loop thread, which then polls as needed. */
static void conn_send(nwcd_conn *c, uint8_t *buf, size_t len) {
  conn_put(c, buf, len);
  conn_update(c);
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
  if (nwcd_log_level() >= NWCD_LOG_DEBUG)
    nwcd_log(NWCD_LOG_DEBUG, "uid %u pid %d: %s: %s", (unsigned)c->uid, (int)c->pid,
             h && nwc_proto_op_name(h->op) ? nwc_proto_op_name(h->op) : "frame", buf);
  if (n < 0) {
    nwc_pw_free(&w);
    conn_close(c);
    return;
  }
  conn_send(c, w.buf, (size_t)n);
}

/* Whether c's queued output has reached its bound, or c has output queued while its uid's
 * total has reached the uid's bound (any thread).  A connection whose client reads its replies
 * as they come (nothing queued) is never held back by its uid's slow readers. */
static bool conn_over(const nwcd_conn *c) {
  const nwcd_config *cfg = &c->srv->d->cfg;
  size_t q = atomic_load(&c->obytes);
  return q >= __atomic_load_n(&cfg->max_outq, __ATOMIC_RELAXED) ||
         (q && atomic_load(&c->uo->bytes) >= __atomic_load_n(&cfg->max_outq_uid, __ATOMIC_RELAXED));
}

/* Reading stops on the connection's own bounds only: a client blocked sending while its uid is
 * over the uid's bound would never read the replies that let the uid go on (protocol.md). */
static bool conn_can_read(const nwcd_conn *c) {
  const nwcd_config *cfg = &c->srv->d->cfg;
  return !c->closing && !c->close_after_flush && !atomic_load(&c->srv->stopping) &&
         atomic_load(&c->inflight) < cfg->max_inflight && atomic_load(&c->obytes) < cfg->max_outq;
}

nwcd_job_admit nwcd_server_admit(nwcd_job *j) {
  nwcd_conn *c = j->conn;
  if (!c || j->batch) return NWCD_JOB_RUN; /* a batch carries other connections' jobs */
  pthread_mutex_lock(&c->olock);
  nwcd_job_admit a = c->odead || c->oerr ? NWCD_JOB_GONE
                     : c->held || conn_over(c) ? NWCD_JOB_HELD
                                              : NWCD_JOB_RUN;
  if (a == NWCD_JOB_HELD) {
    j->next = NULL;
    if (c->held_tail) c->held_tail->next = j;
    else c->held = j;
    c->held_tail = j;
  }
  pthread_mutex_unlock(&c->olock);
  return a;
}

/* Submits c's held jobs again, in order, once its output is under the bounds or it is closing
 * (loop thread). */
static void release_held(nwcd_conn *c) {
  pthread_mutex_lock(&c->olock);
  nwcd_job *j = NULL;
  if (c->held && (c->odead || !conn_over(c))) j = c->held, c->held = c->held_tail = NULL;
  pthread_mutex_unlock(&c->olock);
  for (nwcd_job *n; j; j = n) {
    n = j->next;
    nwcd_pool_submit(c->srv->d->pool, j);
  }
}

static void on_conn_poll(uv_poll_t *h, int status, int events);

/* Re-evaluates what c waits for (loop thread): closes it after a failed write, or once the
 * reply that ends it is written; else polls for reading unless back-pressure holds it (then
 * paused is set), and for writing while output is queued. */
static void conn_update(nwcd_conn *c) {
  if (c->closing) return;
  pthread_mutex_lock(&c->olock);
  bool queued = c->oh != NULL, err = c->oerr;
  pthread_mutex_unlock(&c->olock);
  if (err || (!queued && c->close_after_flush)) {
    conn_close(c);
    return;
  }
  bool rd = conn_can_read(c);
  if (!rd) {
    atomic_store(&c->paused, true);
    if ((rd = conn_can_read(c))) uv_async_send(&c->srv->async); /* a job finished meanwhile */
  }
  int ev = (rd ? UV_READABLE : 0) | (queued ? UV_WRITABLE : 0);
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
  c->alone_cap = r->caps & NWC_CAP_ALONE;
  nwc_proto_hello hello = {NWC_PROTO_VERSION,
                           NWC_CAP_SHM | NWC_CAP_FDIMPORT | NWC_CAP_BATCH | NWC_CAP_MAPPED |
                               NWC_CAP_ALONE | NWC_CAP_IMPORT2 | NWC_CAP_DEVICES | NWC_CAP_REGISTRY |
                               NWC_CAP_LOAD_PLACES |
                               (c->srv->d->backend->host_share ? NWC_CAP_SHARE : 0) |
                               (c->srv->d->backend->ndevices ? NWC_CAP_CUDA_IPC : 0) |
                               (c->srv->d->backend->dev_matvec_shared ? NWC_CAP_SHM_DEVICE : 0) |
                               (c->srv->d->backend->dev_share_pool ? NWC_CAP_MAP_GPU : 0),
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

/* Whether job j (just read from c) runs on the loop thread itself, saving the hand-off to a
 * worker: only when that delays no one.  It must be a matvec or gather on resident tensors (no
 * load can block the loop), small (INLINE_MAX_BYTES of blob in host memory, a few milliseconds
 * at most; INLINE_MAX_DEVICE_BYTES on a GPU, where the loop thread only submits the kernels and
 * waits for them: ~25 us per column for the 23 MB of a 4096 x 4096 BF16 tensor on an H200), from
 * the one connection with work: nothing in flight anywhere (the pool is idle), nothing more
 * buffered on c, and no other connection's request in the last INLINE_QUIET_NS.  An IPC matvec
 * qualifies on a GPU tensor when it names no event (the stream would wait for the client's
 * work).  Pipelined requests and concurrent clients go to the workers, where concurrent matvecs
 * share a pass. */
static bool run_inline(nwcd_conn *c, const nwcd_job *j, bool quiet, bool more) {
  nwcd_server *s = c->srv;
  const nwc_proto_req *r = &j->req;
  bool ipc = r->op == NWC_OP_MATVEC_IPC && r->ncols <= 8 && !r->has_event;
  bool mv = (r->op == NWC_OP_MATVEC && r->ncols <= 8) || ipc;
  if (!mv && (r->op != NWC_OP_GATHER || r->nrows > 1024)) return false;
  if (!quiet || more || atomic_load(&s->jobs) || atomic_load(&c->inflight)) return false;
  nwcd_res *res = s->d->res;
  int loc = NWCD_LOC_CPU;
  uint64_t bytes = nwcd_res_resident_bytes(res, r->model, r->tensor, &loc);
  return bytes && bytes <= (loc == NWCD_LOC_CPU ? INLINE_MAX_BYTES : INLINE_MAX_DEVICE_BYTES) &&
         (!ipc || loc != NWCD_LOC_CPU) &&
         (!mv || !r->bias[0] || nwcd_res_resident_bytes(res, r->model, r->bias, NULL));
}

/* Polling: after a request the loop does not sleep in epoll_wait for poll_us but polls (an
 * active idle handle makes uv_run poll with a zero timeout), yielding the CPU each turn, so that
 * a client calling back to back finds it awake: waking a halted vCPU costs 20 - 40 us on a VM,
 * more than nwcd's own work on a small request.  A yield that took long means another thread
 * wanted this CPU (a worker, a client): the loop goes back to sleeping at once.  It polls only
 * after a request from a quiet connection (the only one with work, as for run_inline): with
 * concurrent clients requests come often anyway, and a yield sees only its own CPU's queue, so
 * a loop polling on one vCPU while the other's queue holds clients and workers took half of a
 * 2-vCPU machine (16 clients: 16 - 19k matvecs/s polling against 24 - 36k sleeping). */
static void on_poll(uv_idle_t *h) {
  nwcd_server *s = h->data;
  uint64_t t = nwcd_now_ns();
  if (t < s->poll_until) {
    sched_yield();
    if (nwcd_now_ns() - t < YIELD_RAN_NS) return;
  }
  uv_idle_stop(h);
}

static void loop_poll(nwcd_server *s, bool quiet, uint64_t now) {
  unsigned us = __atomic_load_n(&s->d->cfg.poll_us, __ATOMIC_RELAXED); /* SIGHUP may change it */
  if (s->closed_all) return; /* the handle is closed */
  if (!quiet) uv_idle_stop(&s->poll);
  if (!us || !quiet) return;
  s->poll_until = now + us * 1000ull;
  if (!uv_is_active((uv_handle_t *)&s->poll)) uv_idle_start(&s->poll, on_poll);
}

/* Handles one complete frame whose payload is rbuf[off .. off + h->length). */
static void conn_frame(nwcd_conn *c, const nwc_proto_hdr *h, const uint8_t *payload) {
  nwcd *d = c->srv->d;
  atomic_fetch_add(&d->stats.requests, 1);
  c->last_ns = nwcd_now_ns();
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
    nfds = h->op == NWC_OP_SHM || h->op == NWC_OP_MAP || h->op == NWC_OP_MAP_GPU
               ? 1
               : j->req.has_index + j->req.nfiles;
  if (rc == 0 && nfds) {
    rc = take_fds(c, nfds, j->fds);
    if (rc == 0) j->nfds = nfds;
  }
  if (rc == 0 && h->op == NWC_OP_HELLO) {
    do_hello(c, h, &j->req);
    job_free(j);
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
      job_free(j);
      return;
    }
  }
  if (rc < 0) {
    /* Descriptors that came for a frame we refuse are not kept for the next one. */
    if (h->flags & NWC_PF_FDS) close_fds(c->fdq, c->nfdq), c->nfdq = 0;
    if (rc == -EPROTO) c->close_after_flush = true;
    conn_error(c, h, rc, nwc_error_detail());
    job_free(j);
    return;
  }
  j->conn = c, j->shm = c->shm, j->shm_size = c->shm_size;
  j->started_ns = nwcd_now_ns();
  bool more = payload + h->length < c->rbuf + c->rlen; /* another request is buffered */
  /* Quiet: no other connection's request in the last INLINE_QUIET_NS.  It lets this one run on
   * the loop thread, and tells the client that polling for its reply takes no one's CPU. */
  nwcd_server *s = c->srv;
  bool quiet = s->last_conn == c || j->started_ns - s->last_ns > INLINE_QUIET_NS;
  s->last_conn = c, s->last_ns = j->started_ns;
  j->alone = quiet && c->alone_cap;
  bool inline_ok = run_inline(c, j, quiet, more);
  atomic_fetch_add(&c->refs, 1);
  atomic_fetch_add(&c->inflight, 1);
  atomic_fetch_add(&c->srv->jobs, 1);
  if (inline_ok) nwcd_pool_run_here(d->pool, j); /* its reply retires it, as on a worker */
  else nwcd_pool_submit(d->pool, j);
  loop_poll(c->srv, quiet, nwcd_now_ns());
}

/* Parses the complete frames buffered on c while it may take more. */
static void conn_input(nwcd_conn *c) {
  while (!c->closing && c->rlen - c->roff >= NWC_PROTO_HEADER) {
    if (!conn_can_read(c)) { /* held back: a finishing job wakes the loop, or one just did */
      atomic_store(&c->paused, true);
      if (!conn_can_read(c)) break;
      atomic_store(&c->paused, false);
    }
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
    bool drained = (size_t)n < iov.iov_len; /* a short read: nothing more is waiting now */
    conn_input(c);
    if (drained) break;
  }
}

/* Parses what back-pressure held back once it lets go; otherwise just re-polls. */
static void conn_resume(nwcd_conn *c) {
  if (c->closing) return;
  release_held(c);
  if (atomic_exchange(&c->paused, false)) conn_input(c); /* ends with conn_update */
  else conn_update(c);
}

static void on_conn_poll(uv_poll_t *h, int status, int events) {
  nwcd_conn *c = h->data;
  if (status < 0) {
    conn_close(c);
    return;
  }
  if (events & UV_WRITABLE) {
    pthread_mutex_lock(&c->olock);
    flush_locked(c);
    pthread_mutex_unlock(&c->olock);
  }
  if (events & UV_READABLE) conn_read(c);
  conn_resume(c);
  if (events & UV_WRITABLE) /* the uid's total went down: its other connections may go on */
    for (nwcd_conn *o = c->srv->conns; o; o = o->next)
      if (o != c && o->uo == c->uo) conn_resume(o);
  check_shutdown(c->srv);
}

static unsigned conns_of_uid(nwcd_server *s, uid_t uid) {
  unsigned n = 0;
  for (nwcd_conn *c = s->conns; c; c = c->next) n += !c->closing && c->uid == uid;
  return n;
}

/* When c's last request came, or it was accepted when it has sent none. */
static uint64_t idle_since(const nwcd_conn *c) {
  return c->last_ns > c->born_ns ? c->last_ns : c->born_ns;
}

/* The connection of uid that has been idle longest (nothing in flight, queued or held) if it
 * has been idle IDLE_EVICT_NS at least, else NULL (loop thread). */
static nwcd_conn *idlest_of_uid(nwcd_server *s, uid_t uid, uint64_t now) {
  nwcd_conn *best = NULL;
  for (nwcd_conn *c = s->conns; c; c = c->next) {
    if (c->closing || c->uid != uid || atomic_load(&c->inflight) || atomic_load(&c->obytes))
      continue;
    if (now - idle_since(c) >= IDLE_EVICT_NS && (!best || idle_since(c) < idle_since(best)))
      best = c;
  }
  return best;
}

/* Closes connections that have not said hello HELLO_TIMEOUT_NS after they were accepted. */
static void on_hello_timer(uv_timer_t *t) {
  nwcd_server *s = t->data;
  uint64_t now = nwcd_now_ns();
  for (nwcd_conn *c = s->conns; c; c = c->next)
    if (!c->closing && !c->hello && now - c->born_ns >= HELLO_TIMEOUT_NS) {
      nwcd_log(NWCD_LOG_WARN, "uid %u pid %d: no hello within %llu s; disconnecting",
               (unsigned)c->uid, (int)c->pid, HELLO_TIMEOUT_NS / 1000000000ull);
      conn_close(c);
    }
}

static void on_listen(uv_poll_t *h, int status, int events) {
  nwcd_server *s = h->data;
  (void)events;
  if (status < 0 || atomic_load(&s->stopping)) return;
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
    uint64_t now = nwcd_now_ns();
    nwcd_conn *idle = conns_of_uid(s, cred.uid) >= s->d->cfg.max_conn_per_uid
                          ? idlest_of_uid(s, cred.uid, now)
                          : NULL;
    if (idle) { /* the uid's limit is for its work, not for connections left open and idle */
      nwcd_log(NWCD_LOG_INFO, "uid %u at its %u connections: closing the one of pid %d, idle "
               "%.1f s, for pid %d", (unsigned)cred.uid, s->d->cfg.max_conn_per_uid,
               (int)idle->pid, (double)(now - idle_since(idle)) / 1e9, (int)cred.pid);
      conn_close(idle);
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
    c->srv = s, c->fd = fd, c->uid = cred.uid, c->gid = cred.gid, c->pid = cred.pid;
    c->born_ns = now;
    for (nwcd_conn *o = s->conns; o && !c->uo; o = o->next)
      if (o->uid == cred.uid) c->uo = o->uo;
    if (c->uo) atomic_fetch_add(&c->uo->refs, 1); /* o holds one while it is listed */
    else if ((c->uo = calloc(1, sizeof *c->uo))) atomic_init(&c->uo->refs, 1);
    if (!c->uo) {
      free(c);
      close(fd);
      continue;
    }
    atomic_init(&c->refs, 1);
    pthread_mutex_init(&c->olock, NULL);
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

/* Called on the worker: writes the frame itself (conn_put) and, after the final one, retires the
 * job; wakes the loop only when it has something to do. */
void nwcd_server_send(nwcd_job *j, uint8_t *buf, size_t len, bool final) {
  nwcd_server *s = j->d->server;
  nwcd_conn *c = j->conn;
  bool wake = buf && conn_put(c, buf, len);
  if (final) {
    job_free(j);
    atomic_fetch_sub(&c->inflight, 1);
    wake |= atomic_load(&c->paused);
    atomic_fetch_sub(&s->jobs, 1);
    wake |= atomic_load(&s->stopping);
  }
  if (wake) wake_loop(s);
  if (final) conn_unref(c);
}

/* A worker's wake-up: connections that queued output, failed, or may read again. */
static void on_async(uv_async_t *a) {
  nwcd_server *s = a->data;
  for (nwcd_conn *c = s->conns; c; c = c->next) conn_resume(c);
  check_shutdown(s);
}

static void on_closed_quiet(uv_handle_t *h) { (void)h; }

static void close_everything(nwcd_server *s) {
  if (s->closed_all) return;
  s->closed_all = true;
  nwcd_service_close(); /* SIGHUP and watchdog handles, the service thread (notify.c) */
  for (nwcd_conn *c = s->conns; c; c = c->next) conn_close(c);
  pthread_mutex_lock(&s->lock);
  s->async_closed = true;
  uv_close((uv_handle_t *)&s->async, on_closed_quiet);
  pthread_mutex_unlock(&s->lock);
  uv_close((uv_handle_t *)&s->sigint, on_closed_quiet);
  uv_close((uv_handle_t *)&s->sigterm, on_closed_quiet);
  uv_close((uv_handle_t *)&s->deadline, on_closed_quiet);
  uv_close((uv_handle_t *)&s->hello_timer, on_closed_quiet);
  uv_close((uv_handle_t *)&s->poll, on_closed_quiet);
}

/* While stopping: once no request is in flight and every reply is written, close all. */
static void check_shutdown(nwcd_server *s) {
  if (!atomic_load(&s->stopping) || s->closed_all || atomic_load(&s->jobs)) return;
  for (nwcd_conn *c = s->conns; c; c = c->next)
    if (atomic_load(&c->inflight) || (atomic_load(&c->obytes) && !c->closing)) return;
  close_everything(s);
}

static void on_deadline(uv_timer_t *t) {
  nwcd_server *s = t->data;
  nwcd_log(NWCD_LOG_WARN, "shutdown: requests still running after 20 s; closing connections");
  for (nwcd_conn *c = s->conns; c; c = c->next) conn_close(c);
}

static void on_signal(uv_signal_t *h, int signum) {
  nwcd_server *s = h->data;
  if (atomic_load(&s->stopping)) return;
  nwcd_log(NWCD_LOG_INFO, "%s: stopping (finishing requests in flight)", strsignal(signum));
  atomic_store(&s->stopping, true);
  nwcd_service_stopping(); /* STOPPING=1 (notify.c) */
  uv_close((uv_handle_t *)&s->listen, on_closed_quiet);
  close(s->lfd);
  struct stat st;
  if (stat(s->path, &st) == 0 && st.st_ino == s->sock_ino) unlink(s->path);
  for (nwcd_conn *c = s->conns; c; c = c->next) conn_update(c);
  uv_timer_start(&s->deadline, on_deadline, 20000, 0);
  check_shutdown(s);
}

int nwcd_server_probe(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  NWC_RETURN_IF(strlen(path) >= sizeof sa.sun_path, -ENAMETOOLONG, "socket path %s is too long",
                path);
  strcpy(sa.sun_path, path);
  struct stat st;
  if (lstat(path, &st) < 0) return 0;
  NWC_RETURN_IF(!S_ISSOCK(st.st_mode), -EEXIST, "%s exists and is not a socket; not removing it",
                path);
  int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  NWC_RETURN_IF(probe < 0, -errno, "socket: %s", strerror(errno));
  int rc = connect(probe, (struct sockaddr *)&sa, sizeof sa);
  int err = errno;
  close(probe);
  NWC_RETURN_IF(rc == 0, -EADDRINUSE, "another daemon is serving %s", path);
  NWC_RETURN_IF(err != ECONNREFUSED, -err, "probing %s: %s", path, strerror(err));
  return 1;
}

/* Binds the listening socket at path (probing an existing one first). */
static int listen_at(nwcd_server *s, const char *path, unsigned mode) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int rc = nwcd_server_probe(path);
  if (rc < 0) return rc;
  strcpy(sa.sun_path, path); /* the probe checked its length */
  snprintf(s->path, sizeof s->path, "%s", path);
  struct stat st;
  if (rc == 1) {
    nwcd_log(NWCD_LOG_INFO, "removing stale socket %s", path);
    NWC_RETURN_IF(unlink(path) < 0 && errno != ENOENT, -errno, "unlink %s: %s", path,
                  strerror(errno));
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  NWC_RETURN_IF(fd < 0, -errno, "socket: %s", strerror(errno));
  mode_t old = umask(0177);
  rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
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
  const char *path =
      d->cfg.socket_path ? d->cfg.socket_path : nwc_proto_default_socket(def, sizeof def);
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
  uv_timer_init(&s->loop, &s->hello_timer);
  s->hello_timer.data = s;
  uv_timer_start(&s->hello_timer, on_hello_timer, 1000, 1000);
  uv_idle_init(&s->loop, &s->poll);
  s->poll.data = s;
  rc = nwcd_service_start(d, &s->loop); /* SIGHUP, watchdog; READY=1 after the preload */
  if (rc < 0) nwcd_log(NWCD_LOG_ERR, "%s", nwc_error_detail());
  nwcd_log(NWCD_LOG_INFO, "serving %s on %s (backend %s, %u threads, budget %llu MiB)",
           d->cfg.store_dir, path, d->backend->name, d->cfg.threads,
           (unsigned long long)(d->cfg.budget >> 20));
  nwcd_host_pages_note(); /* once serving: a startup that fails says only why */
  printf("nwcd: ready on %s\n", path);
  fflush(stdout);
  uv_run(&s->loop, UV_RUN_DEFAULT);
  /* Workers may still run jobs of connections closed by the deadline: their replies are
   * dropped (odead) and the last job of each frees its connection. */
  nwcd_pool_free(d->pool);
  d->pool = NULL;
  uv_loop_close(&s->loop);
  pthread_mutex_destroy(&s->lock);
  free(s);
  d->server = NULL;
  return 0;
}
