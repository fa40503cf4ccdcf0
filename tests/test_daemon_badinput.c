/*
 * test_daemon_badinput.c - bad client input against a real nwcd: every case gets a clear error
 * reply (or, where the frame stream cannot be resynchronized, an error reply and a disconnect),
 * and a well-behaved client on another connection keeps getting right answers throughout.
 *
 * Cases: request before hello; bad magic; oversized frame; unknown opcode; unknown flags;
 * payload one byte too long; a truncated frame then a vanished client; a NUL inside a name;
 * impossible shapes (matvec x of the wrong length, zero columns, gather row out of range);
 * the shared region (not sealed, descriptor missing, offsets past its end); map (no descriptor,
 * a pipe, a datagram or unconnected socket, no descriptor flag, inexact payload, a missing
 * tensor: nothing is sent over the socket, and a good raw map brings the memfd); map_gpu on the
 * cpu backend (no descriptor, a pipe, inexact payload, device -1, a missing model: refused, and
 * a well-formed one -ENOTSUP with nothing on the socket; the hello offers no capability 1024 and
 * nwc_client_map_gpu refuses before sending, -EOPNOTSUPP); an import frame
 * whose descriptors never came; a client that vanishes with requests in flight; a client that
 * stops reading its replies; pipelined requests answered by id; a second uid that the socket's
 * group does not admit (root only; skipped otherwise).
 */
#include "test_daemon_util.h"

#include "nwc_client.h"

#include <grp.h>
#include <stdbool.h>
#include <sys/mman.h>

static nwc_client *good;
static const td_tensor *W; /* a 2-D tensor for the good client's matvecs */

/* The good client still gets right answers. */
static void still_serving(const char *after) {
  float *x = malloc(W->cols * 4), *y = malloc(W->rows * 4);
  for (uint64_t k = 0; k < W->cols; k++) x[k] = (float)(test_uniform() - 0.5);
  int rc = nwc_client_matvec(good, "use", W->name, NULL, 1.0f, x, W->cols, 1, 0, y, W->rows * 4, NULL);
  CHECK(rc == 0 && td_matvec_err(W, x, 1.0, NULL, y) <= 1e-5, "after %s: good client: %d %s", after,
        rc, nwc_client_last_error());
  free(x), free(y);
}

/* Sends raw bytes with nfds descriptors on a connection (after hello if hello) and expects an
 * error reply with status err; disconnect: expects the daemon to close the connection
 * afterwards. */
static void expect_error_fds(const char *what, bool hello, const void *buf, size_t len,
                             const int *fds, unsigned nfds, int err, bool disconnect) {
  int fd = hello ? td_raw_hello(td_sock) : td_raw_connect(td_sock);
  CHECK(fd >= 0, "%s: connect", what);
  if (fd < 0) return;
  CHECK(td_send_fds(fd, buf, len, fds, nfds) == 0, "%s: send", what);
  nwc_proto_hdr h;
  uint8_t *p = NULL;
  int rc = td_recv_frame(fd, &h, &p, 5000);
  CHECK(rc == 0 && h.status == err, "%s: reply %d status %d (want %d)", what, rc, rc ? 0 : h.status, err);
  if (rc == 0) printf("%-34s -> %d: %s\n", what, h.status, td_error_text(p, h.length));
  free(p);
  if (disconnect) {
    rc = td_recv_frame(fd, &h, &p, 5000);
    CHECK(rc == -ECONNRESET, "%s: connection not closed (%d)", what, rc);
    if (rc == 0) free(p);
  } else { /* the connection still works */
    nwc_proto_req r = {.op = NWC_OP_STATS, .id = 77};
    CHECK(td_send_req(fd, &r) == 0 && td_recv_frame(fd, &h, &p, 5000) == 0 && h.status == 0 &&
              h.id == 77, "%s: the connection is not usable afterwards", what);
    free(p);
  }
  close(fd);
  still_serving(what);
}

static void expect_error(const char *what, bool hello, const void *buf, size_t len, int err,
                         bool disconnect) {
  expect_error_fds(what, hello, buf, len, NULL, 0, err, disconnect);
}

static size_t encode(nwc_proto_req *r, uint8_t *out, size_t cap) {
  nwc_pw w;
  nwc_pw_init(&w);
  int64_t n = nwc_proto_req_encode(r, &w);
  size_t k = n > 0 && (size_t)n <= cap ? (size_t)n : 0;
  if (k) memcpy(out, w.buf, k);
  nwc_pw_free(&w);
  return k;
}

static void set_hdr(uint8_t *buf, uint32_t magic, uint32_t len, uint16_t op, uint16_t flags, uint64_t id) {
  nwc_proto_hdr h = {magic, len, op, flags, 0, id};
  nwc_proto_hdr_encode(&h, buf);
}

static void shm_cases(void) {
  uint8_t buf[4096];
  nwc_proto_hdr h;
  uint8_t *p = NULL;
  /* not sealed */
  int mfd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  CHECK(ftruncate(mfd, 1 << 20) == 0, "ftruncate");
  int fd = td_raw_hello(td_sock);
  nwc_proto_req r = {.op = NWC_OP_SHM, .id = 5, .shm_size = 1 << 20};
  size_t n = encode(&r, buf, sizeof buf);
  CHECK(td_send_fds(fd, buf, n, &mfd, 1) == 0 && td_recv_frame(fd, &h, &p, 5000) == 0 && h.status == -EPERM,
        "unsealed memfd accepted");
  if (p) printf("%-34s -> %d: %s\n", "shm: not sealed", h.status, td_error_text(p, h.length)), free(p), p = NULL;
  /* no descriptor */
  CHECK(td_send(fd, buf, n) == 0 && td_recv_frame(fd, &h, &p, 5000) == 0 && h.status == -EBADMSG,
        "shm without a descriptor accepted");
  if (p) printf("%-34s -> %d: %s\n", "shm: no descriptor", h.status, td_error_text(p, h.length)), free(p), p = NULL;
  /* larger than the memfd */
  CHECK(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK) == 0, "seal");
  r.shm_size = 2 << 20;
  n = encode(&r, buf, sizeof buf);
  CHECK(td_send_fds(fd, buf, n, &mfd, 1) == 0 && td_recv_frame(fd, &h, &p, 5000) == 0 && h.status == -EINVAL,
        "shm larger than the memfd accepted");
  if (p) printf("%-34s -> %d: %s\n", "shm: larger than the memfd", h.status, td_error_text(p, h.length)), free(p), p = NULL;
  r.shm_size = 1 << 20;
  n = encode(&r, buf, sizeof buf);
  CHECK(td_send_fds(fd, buf, n, &mfd, 1) == 0 && td_recv_frame(fd, &h, &p, 5000) == 0 && h.status == 0,
        "good shm refused");
  free(p), p = NULL;
  /* offsets past the end */
  nwc_proto_req d = {.op = NWC_OP_DEQUANT, .id = 6, .out = NWC_OUT_BF16, .where = NWC_WHERE_SHM,
                     .out_off = (1 << 20) - 8, .out_cap = 1 << 20};
  strcpy(d.model, "use"), strcpy(d.tensor, W->name);
  n = encode(&d, buf, sizeof buf);
  CHECK(td_send(fd, buf, n) == 0 && td_recv_frame(fd, &h, &p, 5000) == 0 && h.status == -EINVAL,
        "dequant past the shared region accepted");
  if (p) printf("%-34s -> %d: %s\n", "shm: output past the end", h.status, td_error_text(p, h.length)), free(p), p = NULL;
  d.out_off = UINT64_MAX - 4;
  n = encode(&d, buf, sizeof buf);
  CHECK(td_send(fd, buf, n) == 0 && td_recv_frame(fd, &h, &p, 5000) == 0 && h.status == -EINVAL,
        "dequant at a wrapping offset accepted");
  free(p), p = NULL;
  nwc_proto_req m = {.op = NWC_OP_MATVEC, .id = 7, .scale = 1, .ncols = 1, .where = NWC_WHERE_SHM,
                     .in_off = (1 << 20) - 4, .x_bytes = W->cols * 4, .out_off = 0, .out_cap = 1 << 20};
  strcpy(m.model, "use"), strcpy(m.tensor, W->name);
  n = encode(&m, buf, sizeof buf);
  CHECK(td_send(fd, buf, n) == 0 && td_recv_frame(fd, &h, &p, 5000) == 0 && h.status == -EINVAL,
        "matvec x past the shared region accepted");
  if (p) printf("%-34s -> %d: %s\n", "shm: x past the end", h.status, td_error_text(p, h.length)), free(p), p = NULL;
  /* a good one through the region */
  d.out_off = 0;
  n = encode(&d, buf, sizeof buf);
  CHECK(td_send(fd, buf, n) == 0 && td_recv_frame(fd, &h, &p, 5000) == 0 && h.status == 0,
        "dequant into the region");
  uint8_t *map = mmap(NULL, 1 << 20, PROT_READ, MAP_SHARED, mfd, 0);
  CHECK(map != MAP_FAILED && !memcmp(map, W->w, W->rows * W->cols * 2), "dequant into the region: bytes");
  munmap(map, 1 << 20);
  free(p);
  close(fd), close(mfd);
  still_serving("shm cases");
}

/* map_gpu on the cpu backend: malformed requests refused as map's are, a good one -ENOTSUP
 * (no device copies) with nothing sent over its socket; the library does not even ask. */
static void map_gpu_cases(void) {
  uint8_t buf[4096];
  nwc_proto_req r = {.op = NWC_OP_MAP_GPU, .id = 31, .device = 0};
  strcpy(r.model, "use"), strcpy(r.tensor, W->name);
  size_t n = encode(&r, buf, sizeof buf);
  expect_error("map_gpu without its descriptor", true, buf, n, -EBADMSG, false);
  int sv[2], pp[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0 && pipe(pp) == 0,
        "socketpair, pipe");
  expect_error_fds("map_gpu with a pipe", true, buf, n, &pp[1], 1, -EINVAL, false);
  expect_error_fds("map_gpu on the cpu backend", true, buf, n, &sv[1], 1, -ENOTSUP, false);
  set_hdr(buf, NWC_PROTO_MAGIC, (uint32_t)(n - 1 - NWC_PROTO_HEADER), NWC_OP_MAP_GPU,
          NWC_PF_FDS, 31);
  expect_error_fds("map_gpu payload one byte short", true, buf, n - 1, &sv[1], 1, -EBADMSG,
                   false);
  r.device = -1;
  n = encode(&r, buf, sizeof buf);
  expect_error_fds("map_gpu on device -1", true, buf, n, &sv[1], 1, -EBADMSG, false);
  r.device = 0, r.tensor[0] = 0, strcpy(r.model, "no-such-model");
  n = encode(&r, buf, sizeof buf);
  expect_error_fds("map_gpu of a missing model", true, buf, n, &sv[1], 1, -ENOENT, false);
  char c;
  CHECK(recv(sv[0], &c, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN, "bytes on a refused map_gpu's "
        "socket");
  CHECK(!(td_daemon_caps(td_sock) & NWC_CAP_MAP_GPU), "the cpu backend offers map_gpu");
  nwc_client_gpu_map *g = (nwc_client_gpu_map *)&c;
  CHECK(nwc_client_map_gpu(good, "use", W->name, 0, &g) == -EOPNOTSUPP && g == NULL,
        "nwc_client_map_gpu without the capability: %s", nwc_client_last_error());
  printf("%-34s -> %s\n", "nwc_client_map_gpu on cpu", nwc_client_last_error());
  nwc_client_gpu_map_free(NULL);
  close(sv[0]), close(sv[1]), close(pp[0]), close(pp[1]);
  still_serving("map_gpu cases");
}

/* map: the descriptor must be a connected Unix stream socket, the payload exact. */
static void map_cases(void) {
  uint8_t buf[4096];
  nwc_proto_req r = {.op = NWC_OP_MAP, .id = 30};
  strcpy(r.model, "use"), strcpy(r.tensor, W->name);
  size_t n = encode(&r, buf, sizeof buf);
  expect_error("map without its descriptor", true, buf, n, -EBADMSG, false);
  int sv[2], pp[2], dg[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0 && pipe(pp) == 0 &&
            socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, dg) == 0, "socketpair, pipe");
  expect_error_fds("map with a pipe", true, buf, n, &pp[1], 1, -EINVAL, false);
  expect_error_fds("map with a datagram socket", true, buf, n, &dg[1], 1, -EINVAL, false);
  int lone = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  expect_error_fds("map with an unconnected socket", true, buf, n, &lone, 1, -ENOTCONN, false);
  set_hdr(buf, NWC_PROTO_MAGIC, (uint32_t)(n - NWC_PROTO_HEADER), NWC_OP_MAP, 0, 30);
  expect_error_fds("map without the descriptor flag", true, buf, n, &sv[1], 1, -EBADMSG, false);
  set_hdr(buf, NWC_PROTO_MAGIC, (uint32_t)(n - 1 - NWC_PROTO_HEADER), NWC_OP_MAP, NWC_PF_FDS, 30);
  expect_error_fds("map payload one byte short", true, buf, n - 1, &sv[1], 1, -EBADMSG, false);
  buf[n] = 0;
  set_hdr(buf, NWC_PROTO_MAGIC, (uint32_t)(n + 1 - NWC_PROTO_HEADER), NWC_OP_MAP, NWC_PF_FDS, 30);
  expect_error_fds("map payload one byte too long", true, buf, n + 1, &sv[1], 1, -EBADMSG, false);
  strcpy(r.tensor, "no/such/tensor");
  n = encode(&r, buf, sizeof buf);
  expect_error_fds("map of a missing tensor", true, buf, n, &sv[1], 1, -ENOENT, false);
  /* Nothing came over the socket for the refused requests; a good one brings the memfd. */
  char c;
  CHECK(recv(sv[0], &c, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN, "bytes on a refused map's socket");
  strcpy(r.tensor, W->name);
  n = encode(&r, buf, sizeof buf);
  int fd = td_raw_hello(td_sock);
  nwc_proto_hdr h;
  uint8_t *p = NULL;
  CHECK(td_send_fds(fd, buf, n, &sv[1], 1) == 0 && td_recv_frame(fd, &h, &p, 5000) == 0 && h.status == 0,
        "a good raw map refused");
  uint8_t tok[8];
  union {
    char b[CMSG_SPACE(sizeof(int))];
    struct cmsghdr a;
  } cm;
  struct iovec iov = {tok, sizeof tok};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
                       .msg_controllen = sizeof cm.b};
  CHECK(recvmsg(sv[0], &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) == 8 && tok[0] == 30 &&
            CMSG_FIRSTHDR(&msg) && CMSG_FIRSTHDR(&msg)->cmsg_type == SCM_RIGHTS,
        "the memfd and token of a raw map");
  if (CMSG_FIRSTHDR(&msg)) {
    int mfd;
    memcpy(&mfd, CMSG_DATA(CMSG_FIRSTHDR(&msg)), sizeof mfd);
    close(mfd);
  }
  free(p);
  close(fd), close(lone);
  close(sv[0]), close(sv[1]), close(pp[0]), close(pp[1]), close(dg[0]), close(dg[1]);
  /* The map's reference goes with its connection, once nwcd has read the close: until then an
   * evict on another connection may still find it in use (EBUSY), never anything else. */
  nwc_client_result res;
  int rc = -EBUSY;
  for (int tries = 0; rc == -EBUSY && tries < 500; tries++) {
    if (tries) usleep(10000);
    rc = nwc_client_evict(good, "use", W->name, &res);
  }
  CHECK(rc == 0, "evict within 5 s of closing the raw map's socket: %s", nwc_client_last_error());
  still_serving("map cases");
}

int main(void) {
  int rc0;
  pid_t d = td_begin("test_daemon_badinput", "nwc-bad", NULL, &rc0);
  if (!d) return rc0;
  CHECK_RC(nwc_client_connect(td_sock, &good));
  CHECK_RC(nwc_client_import(good, "use", getenv("NWC_SAMPLE"), NULL, NULL));
  for (size_t i = 0; i < td_nt && !W; i++)
    if (td_t[i].rows >= 256 && td_t[i].rows * td_t[i].cols * 2 <= (1 << 20)) W = &td_t[i];
  CHECK(W != NULL, "no suitable tensor");
  if (!W) return 1;

  uint8_t buf[8192];
  nwc_proto_req r = {.op = NWC_OP_MODELS, .id = 9};
  size_t n = encode(&r, buf, sizeof buf);
  expect_error("request before hello", false, buf, n, -EPROTO, true);
  set_hdr(buf, 0xdeadbeef, 0, NWC_OP_MODELS, 0, 1);
  expect_error("bad magic", true, buf, NWC_PROTO_HEADER, -EBADMSG, true);
  set_hdr(buf, NWC_PROTO_MAGIC, NWC_PROTO_MAX_PAYLOAD + 1, NWC_OP_MODELS, 0, 1);
  expect_error("oversized frame", true, buf, NWC_PROTO_HEADER, -EMSGSIZE, true);
  set_hdr(buf, NWC_PROTO_MAGIC, 0, 0x7777, 0, 1);
  expect_error("unknown opcode", true, buf, NWC_PROTO_HEADER, -EOPNOTSUPP, false);
  set_hdr(buf, NWC_PROTO_MAGIC, 0, NWC_OP_MODELS, 0x40, 1);
  expect_error("unknown flags", true, buf, NWC_PROTO_HEADER, -EBADMSG, true);
  r = (nwc_proto_req){.op = NWC_OP_TENSORS, .id = 10};
  strcpy(r.model, "use");
  n = encode(&r, buf, sizeof buf);
  buf[n] = 0;
  set_hdr(buf, NWC_PROTO_MAGIC, (uint32_t)(n + 1 - NWC_PROTO_HEADER), NWC_OP_TENSORS, 0, 10);
  expect_error("payload one byte too long", true, buf, n + 1, -EBADMSG, false);
  set_hdr(buf, NWC_PROTO_MAGIC, (uint32_t)(n - 1 - NWC_PROTO_HEADER), NWC_OP_TENSORS, 0, 10);
  expect_error("payload one byte short", true, buf, n - 1, -EBADMSG, false);
  n = encode(&r, buf, sizeof buf);
  buf[NWC_PROTO_HEADER + 3] = 0; /* "u\0e" */
  expect_error("NUL inside a name", true, buf, n, -EBADMSG, false);
  r = (nwc_proto_req){.op = NWC_OP_TENSORS, .id = 11};
  memset(r.model, 'a', 1023);
  n = encode(&r, buf, sizeof buf);
  expect_error("unknown model", true, buf, n, -ENOENT, false);

  /* Impossible shapes. */
  float x[2048] = {0};
  nwc_proto_req m = {.op = NWC_OP_MATVEC, .id = 12, .scale = 1, .ncols = 1, .x = (uint8_t *)x,
                     .x_bytes = (W->cols + 1) * 4};
  strcpy(m.model, "use"), strcpy(m.tensor, W->name);
  n = encode(&m, buf, sizeof buf);
  expect_error("matvec x of the wrong length", true, buf, n, -EINVAL, false);
  m.ncols = 0, m.x_bytes = 0;
  n = encode(&m, buf, sizeof buf);
  expect_error("matvec of zero columns", true, buf, n, -EBADMSG, false);
  strcpy(m.tensor, "no/such/tensor"), m.ncols = 1, m.x_bytes = 16;
  n = encode(&m, buf, sizeof buf);
  expect_error("matvec on a missing tensor", true, buf, n, -ENOENT, false);
  uint8_t rows[16] = {0};
  uint64_t bad = W->rows;
  memcpy(rows + 8, &bad, 8);
  nwc_proto_req g = {.op = NWC_OP_GATHER, .id = 13, .nrows = 2, .rows = rows};
  strcpy(g.model, "use"), strcpy(g.tensor, W->name);
  n = encode(&g, buf, sizeof buf);
  expect_error("gather row out of range", true, buf, n, -EINVAL, false);
  g.where = NWC_WHERE_SHM, bad = 1;
  memcpy(rows + 8, &bad, 8);
  n = encode(&g, buf, sizeof buf);
  expect_error("shared region never passed", true, buf, n, -EINVAL, false);
  nwc_proto_req im = {.op = NWC_OP_IMPORT, .id = 14, .nfiles = 1};
  char *files[1] = {"x.safetensors"};
  im.files = files;
  strcpy(im.model, "m2");
  n = encode(&im, buf, sizeof buf);
  expect_error("import without its descriptor", true, buf, n, -EBADMSG, false);

  shm_cases();
  map_cases();
  map_gpu_cases();

  /* A truncated frame, then the client vanishes. */
  int fd = td_raw_hello(td_sock);
  set_hdr(buf, NWC_PROTO_MAGIC, 100, NWC_OP_TENSORS, 0, 1);
  CHECK(td_send(fd, buf, NWC_PROTO_HEADER + 10) == 0, "truncated send");
  close(fd);
  still_serving("a truncated frame");

  /* Vanishing with requests in flight. */
  const td_tensor *big = &td_t[0];
  for (size_t i = 0; i < td_nt; i++)
    if (td_t[i].rows * td_t[i].cols > big->rows * big->cols) big = &td_t[i];
  for (int k = 0; k < 5; k++) {
    fd = td_raw_hello(td_sock);
    nwc_proto_req dq = {.op = NWC_OP_DEQUANT, .out = NWC_OUT_F32};
    strcpy(dq.model, "use"), strcpy(dq.tensor, big->name);
    for (int i = 0; i < 8; i++) {
      dq.id = 100 + (uint64_t)i;
      n = encode(&dq, buf, sizeof buf);
      td_send(fd, buf, n);
    }
    close(fd);
  }
  still_serving("clients vanishing mid-request");

  /* A client that stops reading its replies (each ~8 MB): the daemon pauses reading it. */
  fd = td_raw_hello(td_sock);
  {
    nwc_proto_req dq = {.op = NWC_OP_DEQUANT, .out = NWC_OUT_F32};
    strcpy(dq.model, "use"), strcpy(dq.tensor, big->name);
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int sent = 0;
    for (int i = 0; i < 400; i++) {
      dq.id = 1000 + (uint64_t)i;
      n = encode(&dq, buf, sizeof buf);
      if (send(fd, buf, n, MSG_NOSIGNAL) != (ssize_t)n) break;
      sent++;
    }
    printf("slow reader: %d requests sent before the socket filled\n", sent);
    for (int i = 0; i < 5; i++) still_serving("a client that stops reading");
    nwc_client_counters s;
    CHECK_RC(nwc_client_stats(good, &s));
  }
  close(fd);
  still_serving("the slow reader left");

  /* Pipelining: 16 requests in one write, replies matched by id. */
  fd = td_raw_hello(td_sock);
  {
    size_t off = 0;
    for (int i = 0; i < 16; i++) {
      nwc_proto_req q = {.op = (uint16_t)(i % 2 ? NWC_OP_STATS : NWC_OP_INFO), .id = 500 + (uint64_t)i};
      strcpy(q.model, "use"), strcpy(q.tensor, W->name);
      off += encode(&q, buf + off, sizeof buf - off);
    }
    CHECK(td_send(fd, buf, off) == 0, "pipelined send");
    unsigned seen = 0;
    for (int i = 0; i < 16; i++) {
      nwc_proto_hdr h;
      uint8_t *p = NULL;
      if (td_recv_frame(fd, &h, &p, 30000) < 0) break; /* a hang, not a slow sanitized run */
      if (h.status == 0 && h.id >= 500 && h.id < 516) seen |= 1u << (h.id - 500);
      free(p);
    }
    CHECK(seen == 0xffff, "pipelined replies: mask 0x%x", seen);
  }
  close(fd);

  /* A second uid: the socket is 0660 root:root, so uid/gid 65534 cannot connect; once its
   * group owns the socket, it can. */
  if (geteuid() == 0) {
    CHECK(chmod(td_dir, 0755) == 0, "chmod");
    for (int pass = 0; pass < 2; pass++) {
      if (pass == 1) CHECK(chown(td_sock, 0, 65534) == 0, "chgrp socket");
      pid_t k = fork();
      if (k == 0) {
        if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0) _exit(77);
        int cfd = td_raw_connect(td_sock);
        _exit(cfd < 0 ? (errno == EACCES ? 10 : 11) : 0);
      }
      int st;
      waitpid(k, &st, 0);
      int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      if (code == 77) {
        printf("second uid: cannot switch to uid 65534 here; skipped\n");
        break;
      }
      CHECK(code == (pass == 0 ? 10 : 0), "uid 65534 %s: exit %d", pass ? "with the group" : "without", code);
    }
  } else {
    printf("second uid: not root; skipped\n");
  }
  still_serving("everything");
  nwc_client_free(good);
  CHECK(td_stop_daemon(d) == 0, "SIGTERM exit");
  if (test_failures) td_show_log();
  td_cleanup();
  return test_exit("test_daemon_badinput");
}
