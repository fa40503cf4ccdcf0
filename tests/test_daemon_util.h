/*
 * test_daemon_util.h - what the daemon and client tests share: a temporary directory, starting
 * a real nwcd process on a temporary store and socket (and stopping it with SIGTERM), raw
 * protocol connections for the malformed-input tests, and the sample model's original weights
 * with references (BF16 bits for dequant/gather, fp64 matvec) to check replies against.
 */
#ifndef NWC_TEST_DAEMON_UTIL_H
#define NWC_TEST_DAEMON_UTIL_H

#include "test_util.h"

#include "nwc.h"
#include "nwc_proto.h"
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

static char td_dir[256], td_sock[300], td_store[300];
/* The backend the tests start nwcd with (before their own flags); the CUDA tests set "cuda". */
static const char *td_backend = "cpu";

/* Waits up to tries x 10 ms for pid to exit: its exit status, or -1 after a crash or a timeout
 * (then it is killed). */
static int td_wait_exit(pid_t pid, int tries) {
  for (int i = 0; i < tries; i++) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

static int td_mkdir(const char *name) {
  const char *base = getenv("TMPDIR");
  snprintf(td_dir, sizeof td_dir, "%s/%s-XXXXXX", base && *base ? base : "/tmp", name);
  if (!mkdtemp(td_dir)) return -1;
  snprintf(td_sock, sizeof td_sock, "%s/nwcd.sock", td_dir);
  snprintf(td_store, sizeof td_store, "%s/store", td_dir);
  return 0;
}

static void td_cleanup(void) {
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", td_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", td_dir);
}

static int td_connectable(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path) return 0;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
  close(fd);
  return ok;
}

/* Starts nwcd with --store td_store --socket sock and the extra args (NULL-terminated list);
 * waits until it accepts.  Returns its pid, or -1 (then *status has its exit status if it
 * exited).  Its stderr goes to td_dir/nwcd.log (appended). */
static pid_t td_start_daemon_at(const char *sock, const char *const *extra, int *status) {
  char log[700];
  snprintf(log, sizeof log, "%s/nwcd.log", td_dir);
  pid_t pid = fork();
  if (pid == 0) {
    const char *argv[32] = {NWCD_PATH, "--store", td_store, "--socket", sock, "--threads", "2",
                            "--backend", td_backend};
    int n = 9;
    for (int i = 0; extra && extra[i] && n < 30; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) dup2(fd, 2);
    int nul = open("/dev/null", O_WRONLY);
    if (nul >= 0) dup2(nul, 1);
    execv(NWCD_PATH, (char *const *)argv);
    _exit(127);
  }
  for (int i = 0; i < 1000; i++) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      if (status) *status = st;
      return -1;
    }
    if (td_connectable(sock)) return pid;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

/* Runs nwcd expecting it to refuse to start: its exit status (WEXITSTATUS), or -1 if it was
 * still running after 5 s (then it is killed). */
__attribute__((unused)) static int td_daemon_refuses(const char *sock, const char *const *extra) {
  char log[700];
  snprintf(log, sizeof log, "%s/nwcd.log", td_dir);
  pid_t pid = fork();
  if (pid == 0) {
    const char *argv[32] = {NWCD_PATH, "--store", td_store, "--socket", sock};
    int n = 5;
    for (int i = 0; extra && extra[i] && n < 30; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) dup2(fd, 2);
    execv(NWCD_PATH, (char *const *)argv);
    _exit(127);
  }
  return td_wait_exit(pid, 500);
}

static pid_t td_start_daemon(const char *const *extra) {
  return td_start_daemon_at(td_sock, extra, NULL);
}

/* SIGTERM and wait: returns the exit status (0 for a clean stop), or -1 on a crash/timeout. */
static int td_stop_daemon(pid_t pid) {
  kill(pid, SIGTERM);
  return td_wait_exit(pid, 3000);
}

static void td_show_log(void) {
  char path[700];
  snprintf(path, sizeof path, "%s/nwcd.log", td_dir);
  FILE *f = fopen(path, "r");
  if (!f) return;
  char line[1200];
  while (fgets(line, sizeof line, f)) fprintf(stderr, "  | %s", line);
  fclose(f);
}

/* Whether a line of td_dir/nwcd.log holds what (case-insensitive). */
__attribute__((unused)) static int td_log_has(const char *what) {
  char path[400], line[2048];
  snprintf(path, sizeof path, "%s/nwcd.log", td_dir);
  FILE *f = fopen(path, "r");
  int found = 0;
  while (f && !found && fgets(line, sizeof line, f)) found = strcasestr(line, what) != NULL;
  if (f) fclose(f);
  return found;
}

/* The files in td_store/containers; the name of the last one seen into last (may be NULL). */
__attribute__((unused)) static size_t td_count_containers(char last[256]) {
  char path[400];
  snprintf(path, sizeof path, "%s/containers", td_store);
  DIR *d = opendir(path);
  size_t n = 0;
  for (struct dirent *e; d && (e = readdir(d));)
    if (e->d_name[0] != '.') {
      n++;
      if (last) snprintf(last, 256, "%s", e->d_name);
    }
  if (d) closedir(d);
  return n;
}

/* ---- raw protocol ------------------------------------------------------------------------- */

static int td_raw_connect(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path) return -1;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int td_send(int fd, const void *buf, size_t len) {
  size_t off = 0;
  while (off < len) {
    ssize_t n = send(fd, (const uint8_t *)buf + off, len - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    off += (size_t)n;
  }
  return 0;
}

static int td_recv_all(int fd, void *buf, size_t len, int timeout_ms) {
  size_t off = 0;
  while (off < len) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return -ETIMEDOUT;
    ssize_t n = recv(fd, (uint8_t *)buf + off, len - off, 0);
    if (n == 0) return -ECONNRESET;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    off += (size_t)n;
  }
  return 0;
}

/* Sends a frame with n (at most 4) descriptors (SCM_RIGHTS). */
__attribute__((unused)) static int td_send_fds(int fd, const uint8_t *buf, size_t len,
                                               const int *fds, unsigned n) {
  struct iovec iov = {(void *)buf, len};
  union {
    char b[CMSG_SPACE(sizeof(int) * 4)];
    struct cmsghdr a;
  } cm;
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (n) {
    msg.msg_control = cm.b, msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
    struct cmsghdr *h = CMSG_FIRSTHDR(&msg);
    h->cmsg_level = SOL_SOCKET, h->cmsg_type = SCM_RIGHTS, h->cmsg_len = CMSG_LEN(sizeof(int) * n);
    memcpy(CMSG_DATA(h), fds, sizeof(int) * n);
  }
  return sendmsg(fd, &msg, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

/* Reads one frame: 0 and *h, payload malloc'ed in *payload (free it); <0 on EOF/timeout. */
static int td_recv_frame(int fd, nwc_proto_hdr *h, uint8_t **payload, int timeout_ms) {
  uint8_t hb[NWC_PROTO_HEADER];
  int rc = td_recv_all(fd, hb, sizeof hb, timeout_ms);
  if (rc < 0) return rc;
  if (nwc_proto_hdr_decode(hb, h) < 0) return -EBADMSG;
  *payload = malloc(h->length + 1);
  rc = td_recv_all(fd, *payload, h->length, timeout_ms);
  if (rc < 0) {
    free(*payload);
    *payload = NULL;
    return rc;
  }
  (*payload)[h->length] = 0;
  return 0;
}

/* The message of an error reply (a static buffer). */
__attribute__((unused)) static const char *td_error_text(const uint8_t *payload, uint32_t len) {
  static char msg[NWC_PROTO_MAX_MSG];
  nwc_pr r;
  nwc_pr_init(&r, payload, len);
  if (nwc_pr_str(&r, msg, sizeof msg) < 0) snprintf(msg, sizeof msg, "(no message)");
  return msg;
}

static int td_send_req(int fd, nwc_proto_req *r) {
  nwc_pw w;
  nwc_pw_init(&w);
  int64_t n = nwc_proto_req_encode(r, &w);
  int rc = n > 0 ? td_send(fd, w.buf, (size_t)n) : -1;
  nwc_pw_free(&w);
  return rc;
}

/* Connects and says hello announcing caps (NWC_CAP_*); returns the fd or -1.  *offered (may be
 * NULL) gets the capabilities the daemon's reply offers. */
__attribute__((unused)) static int td_raw_hello_offers(const char *path, uint64_t caps,
                                                       uint64_t *offered) {
  int fd = td_raw_connect(path);
  if (fd < 0) return -1;
  nwc_proto_req r;
  memset(&r, 0, sizeof r);
  r.op = NWC_OP_HELLO, r.id = 1, r.ver_min = r.ver_max = 1, r.caps = caps;
  nwc_proto_hdr h;
  uint8_t *p = NULL;
  nwc_proto_hello hr = {0};
  nwc_pr pr;
  if (td_send_req(fd, &r) < 0 || td_recv_frame(fd, &h, &p, 5000) < 0 || h.status != 0 ||
      (offered && (nwc_pr_init(&pr, p, h.length), nwc_proto_get_hello(&pr, &hr) < 0))) {
    free(p);
    close(fd);
    return -1;
  }
  free(p);
  if (offered) *offered = hr.caps;
  return fd;
}

/* Connects and says hello announcing caps (NWC_CAP_*); returns the fd or -1. */
__attribute__((unused)) static int td_raw_hello_caps(const char *path, uint64_t caps) {
  return td_raw_hello_offers(path, caps, NULL);
}

/* The capabilities (NWC_CAP_*) the daemon at path offers in its hello reply; 0 when it does not
 * answer. */
__attribute__((unused)) static uint64_t td_daemon_caps(const char *path) {
  uint64_t offered = 0;
  int fd = td_raw_hello_offers(path, 0, &offered);
  if (fd >= 0) close(fd);
  return offered;
}

/* Connects and says hello with no capabilities; returns the fd or -1. */
__attribute__((unused)) static int td_raw_hello(const char *path) {
  return td_raw_hello_caps(path, 0);
}

/* ---- nwcctl as a process ------------------------------------------------------------------ */

#ifdef NWCCTL_PATH
/* Runs nwcctl with args (NULL-terminated); stdout into out and stderr into err (malloc'ed, each
 * may be NULL), returns the exit status. */
__attribute__((unused)) static int td_nwcctl(char **out, char **err, const char *const *args) {
  int pfd[2], efd[2];
  if (pipe(pfd) < 0) return -1;
  if (pipe(efd) < 0) return close(pfd[0]), close(pfd[1]), -1;
  pid_t pid = fork();
  if (pid == 0) {
    const char *argv[5000] = {NWCCTL_PATH};
    int n = 1;
    for (int i = 0; args[i] && n < 4999; i++) argv[n++] = args[i];
    argv[n] = NULL;
    dup2(pfd[1], 1);
    dup2(efd[1], 2);
    close(pfd[0]), close(efd[0]);
    execv(NWCCTL_PATH, (char *const *)argv);
    _exit(127);
  }
  close(pfd[1]), close(efd[1]);
  char *bufs[2];
  int fds[2] = {pfd[0], efd[0]};
  for (int f = 0; f < 2; f++) { /* stderr is a few lines: it fits its pipe while stdout drains */
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t k;
    while ((k = read(fds[f], buf + len, cap - len - 1)) > 0) {
      len += (size_t)k;
      if (cap - len < 2) buf = realloc(buf, cap *= 2);
    }
    buf[len] = 0;
    close(fds[f]);
    bufs[f] = buf;
  }
  int st;
  waitpid(pid, &st, 0);
  if (out) *out = bufs[0];
  else free(bufs[0]);
  if (err) *err = bufs[1];
  else free(bufs[1]);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif

/* ---- the sample model and references ------------------------------------------------------ */

typedef struct td_tensor {
  const char *name;
  uint64_t rows, cols; /* as stored: 1-D 1 x N, else (d0, rest) */
  const uint16_t *w;   /* BF16 bits, rows x cols (unaligned view into the mapping: memcpy) */
  const float *row_scale; /* per-row scale of W (fp8: the quantizer's), or NULL for 1 */
} td_tensor;

static nwc_st_file *td_sample;
static td_tensor td_t[64];
static size_t td_nt;

/* Opens NWC_SAMPLE; 77 (skip) if it is missing. */
static int td_open_sample(void) {
  const char *path = getenv("NWC_SAMPLE");
  if (!path || access(path, R_OK) != 0) {
    printf("no sample model (NWC_SAMPLE=%s): run scripts/fetch-sample\n", path ? path : "");
    return TEST_SKIP;
  }
  if (nwc_st_open(path, &td_sample) < 0) return 1;
  for (size_t i = 0; i < td_sample->count && td_nt < 64; i++) {
    const nwc_st_tensor *t = &td_sample->tensors[i];
    if (strcmp(t->dtype, "BF16")) continue;
    td_tensor *o = &td_t[td_nt++];
    o->name = t->name;
    nwc_st_matrix_shape(t, &o->rows, &o->cols);
    o->w = (const uint16_t *)nwc_st_data(td_sample, t);
  }
  return 0;
}

/* The start of most daemon tests: seeds the generator (name), opens the sample, makes the
 * temporary directory dir and starts nwcd with extra flags (NULL: none).  Returns nwcd's pid, or
 * 0 with *rc the test's exit code: 77 without the sample, 1 when nwcd did not start (its log is
 * shown). */
static inline pid_t td_begin(const char *name, const char *dir, const char *const *extra, int *rc) {
  test_seed(name);
  *rc = td_open_sample();
  if (*rc) return 0;
  *rc = 1;
  if (td_mkdir(dir) < 0) return 0;
  pid_t pid = td_start_daemon(extra);
  CHECK(pid > 0, "nwcd did not start");
  if (pid <= 0) {
    td_show_log();
    return 0;
  }
  *rc = 0;
  return pid;
}

static uint16_t td_w(const td_tensor *t, uint64_t i) {
  uint16_t v;
  memcpy(&v, (const uint8_t *)t->w + 2 * i, 2);
  return v;
}

/* The parts of the last whole-model load that lanes with no tensor left took (the daemon's log:
 * "load MODEL: ... (... GB/s; N parts, ...)"), or -1 when no such line is there. */
__attribute__((unused)) static long td_helped_parts(const char *model) {
  char path[700], key[128], line[1200];
  snprintf(path, sizeof path, "%s/nwcd.log", td_dir);
  snprintf(key, sizeof key, "load %s: ", model);
  long parts = -1;
  FILE *f = fopen(path, "r");
  while (f && fgets(line, sizeof line, f)) {
    const char *at = strstr(line, key), *gbs = at ? strstr(at, "GB/s; ") : NULL;
    if (gbs) parts = strtol(gbs + 6, NULL, 10);
  }
  if (f) fclose(f);
  return parts;
}

/* ||y - ref|| / ||ref|| for y = scale * W x + bias (W's rows times t->row_scale when it has
 * one), reference in fp64; where the rows cancel to far below their terms (a tensor of one row:
 * the sample's 1 x N ones), the fp32 sum's own rounding sets the error, so the divisor is at
 * least 2^-20 / 1e-5 of the terms' norm: a figure <= 1e-5 is test_gpu_kernels' rule, relative
 * error 1e-5 or 2^-20 of the terms' norm. */
__attribute__((unused)) static double td_matvec_err(const td_tensor *t, const float *x,
                                                   double scale, const td_tensor *bias,
                                                   const float *y) {
  double num = 0, den = 0, terms = 0;
  for (uint64_t r = 0; r < t->rows; r++) {
    double acc = 0, mag = 0;
    for (uint64_t k = 0; k < t->cols; k++) {
      double p = (double)nwc_bf16_to_f32(td_w(t, r * t->cols + k)) * (double)x[k];
      acc += p, mag += fabs(p);
    }
    double rs = t->row_scale ? (double)t->row_scale[r] : 1.0;
    double b = bias ? (double)nwc_bf16_to_f32(td_w(bias, r)) : 0.0;
    if (bias && bias->row_scale) b *= (double)bias->row_scale[r / bias->cols]; /* fp8 */
    double ref = scale * acc * rs + b, m = fabs(scale * rs) * mag + fabs(b);
    num += ((double)y[r] - ref) * ((double)y[r] - ref);
    den += ref * ref, terms += m * m;
  }
  double floor = 0x1p-20 / 1e-5 * sqrt(terms), norm = sqrt(den) > floor ? sqrt(den) : floor;
  return norm > 0 ? sqrt(num) / norm : sqrt(num);
}

#endif
