/*
 * test_daemon_basic.c - one real nwcd on a temporary store, driven through libnwc-client:
 * import of the sample model by descriptors, ls/info/ps/stats, every tensor dequantized (BF16
 * bit for bit against the original file, fp32 exactly its widening), gather of random rows,
 * matvec (1 and 3 columns, scale, bias tensor) against an fp64 reference (relative error <=
 * 1e-5; and an fp8 matrix with an fp8 bias, both with row scales: test_daemon_q8.h), a matvec
 * of more columns than one request takes (the library splits it; a y one column short is
 * -ENOSPC naming the whole output's bytes; a submit of as many is -EINVAL), an x of the wrong K
 * refused naming the tensor's K, bulk data through the shared region (a large dequant),
 * load/evict/pin/unpin, remove.
 * devices: the host's place alone, its budget nwcd's --budget and its use ps's sums (all
 * tensors used, none after evicting them, one of two pinned); refused by an older daemon.
 * Then the daemon's edges: a second daemon on the same store is refused, --backend cuda is a
 * clear error where there is no GPU (/dev/nvidia0), a client speaking protocol 2 gets "protocol 2 not supported", the per-uid
 * connection cap, socket mode 0660, a stale socket after SIGKILL is replaced (the client of the
 * killed daemon told that it closed the connection and to read its log), a live one is not,
 * a non-socket file at the path is left alone, SIGTERM exits 0, the startup line on tensor
 * memory's page size agrees with the kernel's setting, and a bad flag is one line and exit 2.
 */
#include "test_daemon_q8.h"
#include "test_daemon_util.h"

#include "nwc_client.h"

#include <stdbool.h>

/* CPU milliseconds pid has run, all threads (utime + stime of /proc/PID/stat, in clock ticks:
 * 10 ms resolution, enough for the bound it checks). */
static double proc_cpu_ms(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f) fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
  unsigned long long ut = 0, st = 0;
  CHECK(p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2,
        "cannot read %s", path);
  return (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

/* --poll-us: after a request the loop polls for a while, then sleeps again (an idle daemon costs
 * nothing), and a SIGTERM while it polls still stops it cleanly. */
static void check_poll(void) {
  const char *poll[] = {"--poll-us", "20000", NULL};
  pid_t d = td_start_daemon(poll);
  CHECK(d > 0, "nwcd --poll-us 20000 did not start");
  nwc_client *c = NULL;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  nwc_client_counters s;
  if (c) CHECK_RC(nwc_client_stats(c, &s));
  double c0 = proc_cpu_ms(d);
  usleep(1000000);
  double used = proc_cpu_ms(d) - c0; /* polling the whole second, even sharing the CPU: > 250 */
  CHECK(used < 100, "nwcd ran %.0f ms of CPU in the second after one request (poll 20 ms)", used);
  printf("poll 20 ms: %.0f ms of nwcd CPU in the second after a request\n", used);
  if (c) CHECK_RC(nwc_client_stats(c, &s));
  CHECK(td_stop_daemon(d) == 0, "SIGTERM while polling did not exit 0");
  nwc_client_free(c);
  const char *bad[] = {"--poll-us", "-5", NULL};
  CHECK(td_daemon_refuses(td_sock, bad) == 2, "--poll-us -5 not refused");
}

/* A bad command line: exit 2 and one line on stderr holding expect (not getopt's line and the
 * whole usage). */
static void check_bad_flag(const char *expect, const char *const *args) {
  int efd[2];
  if (pipe(efd) < 0) return;
  pid_t pid = fork();
  if (pid == 0) {
    const char *argv[16] = {NWCD_PATH};
    for (int i = 0; args[i] && i < 14; i++) argv[i + 1] = args[i];
    dup2(efd[1], 2);
    close(efd[0]);
    execv(NWCD_PATH, (char *const *)argv);
    _exit(127);
  }
  close(efd[1]);
  char err[4096];
  size_t len = 0;
  ssize_t k;
  while (len < sizeof err - 1 && (k = read(efd[0], err + len, sizeof err - 1 - len)) > 0)
    len += (size_t)k;
  err[len] = 0;
  close(efd[0]);
  int rc = td_wait_exit(pid, 2000);
  char *nl = strchr(err, '\n');
  CHECK(rc == 2 && strstr(err, expect) && nl && !nl[1],
        "nwcd %s: exit %d, stderr '%s' (want 2 and one line with '%s')", args[0] ? args[0] : "",
        rc, err, expect);
}

/* nwcd's startup line on its tensor memory's pages names the kernel's shmem huge page setting,
 * read here from sysfs, and the page size it implies; no line where the kernel has no such file. */
static void check_pages_note(void) {
  char sys[256] = "", mode[64] = "", want[200], log[700], line[1300];
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
  if (f) {
    if (!fgets(sys, sizeof sys, f)) sys[0] = 0;
    fclose(f);
  }
  const char *open_bracket = strchr(sys, '[');
  if (open_bracket) sscanf(open_bracket + 1, "%63[^]]", mode);
  bool huge = !strcmp(mode, "always") || !strcmp(mode, "within_size") || !strcmp(mode, "force");
  snprintf(want, sizeof want, "tensor memory: %s pages", huge ? "2 MiB" : "4 KiB");
  snprintf(log, sizeof log, "%s/nwcd.log", td_dir);
  bool said = false, right = false;
  if ((f = fopen(log, "r"))) {
    while (fgets(line, sizeof line, f)) {
      if (!strstr(line, "tensor memory:")) continue;
      said = true;
      char quoted[80];
      snprintf(quoted, sizeof quoted, "is '%s'", mode);
      right = strstr(line, want) && strstr(line, quoted);
    }
    fclose(f);
  }
  if (mode[0]) CHECK(said && right, "no startup line \"%s ... is '%s'\" in %s", want, mode, log);
  else CHECK(!said, "a pages line though the kernel has no shmem_enabled file");
}

static void send_stats(int fd, uint64_t id) {
  nwc_proto_req r;
  memset(&r, 0, sizeof r);
  r.op = NWC_OP_STATS, r.id = id;
  CHECK(td_send_req(fd, &r) == 0, "stats %llu not sent", (unsigned long long)id);
}

/* The flags of the reply to a stats request sent on fd. */
static unsigned stats_reply_flags(int fd, uint64_t id) {
  nwc_proto_hdr h = {0};
  uint8_t *p = NULL;
  CHECK(td_recv_frame(fd, &h, &p, 5000) == 0 && h.status == 0 && h.id == id, "stats %llu",
        (unsigned long long)id);
  free(p);
  return h.flags;
}

/* The flags of the reply to one stats request on fd. */
static unsigned stats_flags(int fd, uint64_t id) {
  send_stats(fd, id);
  return stats_reply_flags(fd, id);
}

/* NWC_PF_ALONE: set on a final reply to a client that asked for it, when no other connection
 * sent a request in the last 2 ms; never for a client that did not ask. */
static void check_alone(void) {
  int a = td_raw_hello_caps(td_sock, NWC_CAP_ALONE), b = td_raw_hello_caps(td_sock, 0);
  CHECK(a >= 0 && b >= 0, "raw hellos: %d %d", a, b);
  usleep(10000);
  CHECK(stats_flags(a, 2) & NWC_PF_ALONE, "a's first request, nobody else busy: not alone");
  CHECK(stats_flags(a, 3) & NWC_PF_ALONE, "a's second request: not alone");
  CHECK(!(stats_flags(b, 2) & NWC_PF_ALONE), "b did not ask for the flag and got it");
  /* sent right after b's, before either reply is read (within 2 ms of it unless this process
   * stalls between two writes: up to 5 tries) */
  bool seen = false;
  for (uint64_t id = 4; id < 9 && !seen; id++) {
    send_stats(b, id), send_stats(a, id);
    seen = !(stats_reply_flags(a, id) & NWC_PF_ALONE);
    stats_reply_flags(b, id);
  }
  CHECK(seen, "a right after b's request: alone in 5 tries");
  usleep(10000);
  CHECK(stats_flags(a, 10) & NWC_PF_ALONE, "a, 10 ms after b: not alone");
  close(a), close(b);
}

/* devices on the cpu backend (want: the tensors resident now): the hello offers it, and it has
 * one place, host memory, whose budget is nwcd's --budget, whose resident bytes, tensors and
 * pinned bytes are ps's sums, and whose memory is the machine's (MemTotal is sysinfo's total,
 * which sysconf reports). */
static void check_devices(nwc_client *c, uint64_t budget, size_t want, const char *when) {
  nwc_client_place *pl = NULL;
  nwc_client_resident *ps = NULL;
  size_t n = 0, nps = 0;
  CHECK(td_daemon_caps(td_sock) & NWC_CAP_DEVICES, "hello does not offer devices (512)");
  CHECK_RC(nwc_client_devices(c, &pl, &n));
  CHECK_RC(nwc_client_ps(c, &ps, &nps));
  uint64_t bytes = 0, pinned = 0;
  for (size_t i = 0; i < nps; i++) bytes += ps[i].bytes, pinned += ps[i].pinned ? ps[i].bytes : 0;
  CHECK(n == 1 && !strcmp(pl[0].name, "cpu"), "%s: devices: %zu places, the first '%s' (want "
        "cpu alone)", when, n, n ? pl[0].name : "");
  uint64_t phys = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
  if (n >= 1) {
    const nwc_client_place *h = &pl[0];
    printf("devices %s: cpu budget %llu, %llu bytes in %llu tensors, %llu pinned, %llu of %llu "
           "free\n", when, (unsigned long long)h->budget, (unsigned long long)h->resident_bytes,
           (unsigned long long)h->resident_tensors, (unsigned long long)h->pinned_bytes,
           (unsigned long long)h->mem_free, (unsigned long long)h->mem_total);
    CHECK(h->budget == budget, "%s: host budget %llu, nwcd --budget %llu", when,
          (unsigned long long)h->budget, (unsigned long long)budget);
    CHECK(nps == want && h->resident_tensors == nps && h->resident_bytes == bytes &&
              h->pinned_bytes == pinned,
          "%s: devices says %llu tensors, %llu bytes, %llu pinned; ps %zu (want %zu), %llu, %llu",
          when, (unsigned long long)h->resident_tensors, (unsigned long long)h->resident_bytes,
          (unsigned long long)h->pinned_bytes, nps, want, (unsigned long long)bytes,
          (unsigned long long)pinned);
    CHECK(h->mem_total == phys && h->mem_free > 0 && h->mem_free <= h->mem_total &&
              h->pool_idle == 0,
          "%s: host memory %llu free of %llu (physical %llu), pool %llu", when,
          (unsigned long long)h->mem_free, (unsigned long long)h->mem_total,
          (unsigned long long)phys, (unsigned long long)h->pool_idle);
  }
  free(pl), free(ps);
}

/* A daemon older than devices (its hello offers every capability below 512): the client refuses
 * nwc_client_devices with EOPNOTSUPP, saying why, and sends it nothing after the hello. */
static void check_devices_refused(void) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%.80s/old.sock", td_dir);
  int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(bind(ls, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(ls, 1) == 0, "listen on %s",
        sa.sun_path);
  pid_t old = fork();
  if (old == 0) {
    int fd = accept(ls, NULL, NULL);
    nwc_proto_hdr h;
    uint8_t *p = NULL;
    if (fd < 0 || td_recv_frame(fd, &h, &p, 5000) < 0 || h.op != NWC_OP_HELLO) _exit(2);
    free(p);
    nwc_proto_hello hello = {1, NWC_CAP_DEVICES - 1, NWC_PROTO_MAX_PAYLOAD, "nwcd 0.0.9", "cpu"};
    nwc_pw w;
    nwc_pw_init(&w);
    nwc_proto_put_hello(&w, &hello);
    int64_t n = nwc_pw_finish(&w, NWC_OP_HELLO, 0, 0, h.id);
    if (n < 0 || td_send(fd, w.buf, (size_t)n) < 0) _exit(2);
    _exit(td_recv_frame(fd, &h, &p, 5000) == -ECONNRESET ? 0 : 1); /* nothing until it closes */
  }
  close(ls);
  nwc_client *c = NULL;
  CHECK_RC(nwc_client_connect(sa.sun_path, &c));
  nwc_client_place *pl = NULL;
  size_t n = 0;
  int rc = c ? nwc_client_devices(c, &pl, &n) : 0;
  CHECK(rc == -EOPNOTSUPP && strstr(nwc_client_last_error(), "nwcd 0.0.9 has no devices"),
        "devices from a daemon without it: %d %s", rc, nwc_client_last_error());
  printf("devices from an older daemon: %s\n", nwc_client_last_error());
  nwc_client_free(c);
  int st = 0;
  waitpid(old, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the older daemon got a request after the hello "
        "(or none at all): status 0x%x", st);
}

static void check_all_tensors(nwc_client *c) {
  for (size_t i = 0; i < td_nt; i++) {
    const td_tensor *t = &td_t[i];
    size_t n = t->rows * t->cols;
    uint16_t *b = malloc((n > 5 * t->cols ? n : 5 * t->cols) * 2);
    float *f = malloc(n * 4);
    uint64_t rows = 0, cols = 0;
    int rc = nwc_client_dequant(c, "use", t->name, NWC_CLIENT_BF16, b, n * 2, &rows, &cols, NULL);
    CHECK(rc == 0, "dequant bf16 %s: %d %s", t->name, rc, nwc_client_last_error());
    CHECK(rows == t->rows && cols == t->cols, "dequant shape of %s", t->name);
    CHECK(rc || !memcmp(b, t->w, n * 2), "dequant of %s differs from the original bytes", t->name);
    rc = nwc_client_dequant(c, "use", t->name, 0, f, n * 4, NULL, NULL, NULL);
    CHECK(rc == 0, "dequant f32 %s: %d %s", t->name, rc, nwc_client_last_error());
    size_t bad = 0;
    for (size_t k = 0; rc == 0 && k < n; k++) bad += f[k] != nwc_bf16_to_f32(td_w(t, k));
    CHECK(bad == 0, "fp32 dequant of %s: %zu values differ", t->name, bad);
    /* gather */
    uint64_t idx[5];
    for (int k = 0; k < 5; k++) idx[k] = test_below(t->rows);
    rc = nwc_client_gather(c, "use", t->name, idx, 5, NWC_CLIENT_BF16, b, 5 * t->cols * 2, &cols, NULL);
    CHECK(rc == 0, "gather %s: %s", t->name, nwc_client_last_error());
    for (int k = 0; rc == 0 && k < 5; k++)
      CHECK(!memcmp(b + k * t->cols, (const uint8_t *)t->w + idx[k] * t->cols * 2, t->cols * 2),
            "gather row %llu of %s", (unsigned long long)idx[k], t->name);
    free(b), free(f);
  }
}

/* Matvecs of model/t (1-3 columns; with bias, M values, or NULL, and then a scale of 0.5)
 * against fp64. */
static void check_matvec_of(nwc_client *c, const char *model, const td_tensor *t,
                            const td_tensor *bias) {
  unsigned ncols = 1 + (unsigned)test_below(3);
  float *x = malloc(ncols * t->cols * 4), *y = malloc(ncols * t->rows * 4);
  for (size_t k = 0; k < ncols * t->cols; k++) x[k] = (float)(test_uniform() * 2 - 1);
  float scale = bias ? 0.5f : 1.0f;
  unsigned rf = 0, flags = test_below(2) ? NWC_CLIENT_INLINE : 0; /* the same on a cpu daemon */
  int rc = nwc_client_matvec(c, model, t->name, bias ? bias->name : NULL, scale, x, t->cols, ncols,
                             flags, y, ncols * t->rows * 4, &rf);
  CHECK(rc == 0, "matvec %s: %s", t->name, nwc_client_last_error());
  CHECK(!(rf & NWC_CLIENT_SHARED), "matvec %s on a cpu daemon: rflags 0x%x", t->name, rf);
  for (unsigned col = 0; rc == 0 && col < ncols; col++) {
    double e = td_matvec_err(t, x + col * t->cols, scale, bias, y + col * t->rows);
    CHECK(e <= 1e-5, "matvec %s column %u: relative error %.3g", t->name, col, e);
  }
  free(x), free(y);
}

/* Every matrix of the sample, with the 1-D tensor of its rows as the bias where there is one. */
static void check_matvec(nwc_client *c) {
  for (size_t i = 0; i < td_nt; i++) {
    const td_tensor *t = &td_t[i];
    if (t->rows < 2) continue;
    const td_tensor *bias = NULL;
    for (size_t j = 0; j < td_nt; j++)
      if (td_t[j].rows == 1 && td_t[j].cols == t->rows) bias = &td_t[j];
    check_matvec_of(c, "use", t, bias);
  }
  /* an x of the wrong K: said with the tensor's K */
  const td_tensor *t = &td_t[0];
  for (size_t i = 1; i < td_nt; i++)
    if (td_t[i].cols > t->cols) t = &td_t[i];
  float *x = calloc(t->cols, 4), y[1];
  char want[600];
  snprintf(want, sizeof want, "matvec use/%s takes K = %llu floats per column: x of %llu bytes is "
           "not 1 column of them (%llu bytes)", t->name, (unsigned long long)t->cols,
           (unsigned long long)(t->cols - 1) * 4, (unsigned long long)t->cols * 4);
  int rc = nwc_client_matvec(c, "use", t->name, NULL, 1.0f, x, t->cols - 1, 1, 0, y, sizeof y, NULL);
  CHECK(rc == -EINVAL && strstr(nwc_client_last_error(), want), "matvec with K - 1: %d '%s', not "
        "'%s'", rc, nwc_client_last_error(), want);
  free(x);
}

/* A random matrix times 65..164 columns, with its bias and a scale, against fp64. */
static void check_wide_matvec(nwc_client *c) {
  const td_tensor *t, *bias = NULL;
  do t = &td_t[test_below(td_nt)];
  while (t->rows < 2);
  for (size_t j = 0; j < td_nt; j++)
    if (td_t[j].rows == 1 && td_t[j].cols == t->rows) bias = &td_t[j];
  unsigned ncols = NWC_CLIENT_MAX_COLS + 1 + (unsigned)test_below(100), rf = 0;
  unsigned flags = test_below(2) ? NWC_CLIENT_INLINE : 0;
  size_t cap = (size_t)ncols * t->rows * 4;
  float *x = malloc((size_t)ncols * t->cols * 4), *y = malloc(cap);
  for (size_t k = 0; k < (size_t)ncols * t->cols; k++) x[k] = (float)(test_uniform() * 2 - 1);
  int rc = nwc_client_matvec(c, "use", t->name, bias ? bias->name : NULL, 0.5f, x, t->cols, ncols,
                             flags, y, cap, &rf);
  CHECK(rc == 0, "matvec %s of %u columns: %d %s", t->name, ncols, rc, nwc_client_last_error());
  for (unsigned col = 0; rc == 0 && col < ncols; col++) {
    double e = td_matvec_err(t, x + (size_t)col * t->cols, 0.5, bias, y + (size_t)col * t->rows);
    CHECK(e <= 1e-5, "matvec %s column %u of %u: relative error %.3g", t->name, col, ncols, e);
  }
  char want[128];
  snprintf(want, sizeof want, "the output takes %zu bytes (%u columns), the buffer holds %zu", cap,
           ncols, cap - t->rows * 4);
  rc = nwc_client_matvec(c, "use", t->name, NULL, 1.0f, x, t->cols, ncols, flags, y,
                         cap - t->rows * 4, NULL);
  CHECK(rc == -ENOSPC && !strcmp(nwc_client_last_error(), want),
        "matvec of %u columns into a y a column short: %d '%s'", ncols, rc,
        nwc_client_last_error());
  uint64_t ticket;
  rc = nwc_client_submit_matvec(c, "use", t->name, NULL, 1.0f, x, t->cols, ncols, 0, y, cap,
                                &ticket);
  CHECK(rc == -EINVAL && strstr(nwc_client_last_error(), "NWC_CLIENT_MAX_COLS"),
        "submit of %u columns: %d '%s'", ncols, rc, nwc_client_last_error());
  free(x), free(y);
}

/* q8 (test_daemon_q8.h): an fp8 matrix times x plus its fp8 bias, both scaled by their rows'
 * scales, loaded whole into host memory. */
static void check_fp8_bias(nwc_client *c) {
  td_q8 q;
  td_import_q8(c, &q);
  CHECK_RC(nwc_client_load(c, "q8", NULL, NULL, NULL, NULL));
  check_matvec_of(c, "q8", &q.w, &q.b);
  td_remove_q8(c, &q);
}

/* A load_places request of places (a mask) sent as it is, past the client library's checks:
 * the reply's status, its message into msg. */
static int raw_load_places(uint64_t places, char msg[256]) {
  int fd = td_raw_hello(td_sock);
  nwc_proto_req r;
  memset(&r, 0, sizeof r);
  r.op = NWC_OP_LOAD_PLACES, r.id = 2, r.places = places;
  snprintf(r.model, sizeof r.model, "use");
  nwc_proto_hdr h = {0};
  uint8_t *p = NULL;
  int ok = fd >= 0 && td_send_req(fd, &r) == 0 && td_recv_frame(fd, &h, &p, 5000) == 0;
  snprintf(msg, 256, "%s", ok && p && h.status < 0 ? td_error_text(p, h.length) : "");
  free(p);
  if (fd >= 0) close(fd);
  return ok ? h.status : -EIO;
}

/* load_places on the cpu backend: host memory alone is load_on(-1), each blob read once (the
 * result's raw_bytes); a GPU named, or no place, is refused, naming it, and the daemon serves on. */
static void check_load_places(nwc_client *c) {
  nwc_client_result res, on;
  size_t i = (size_t)rand() % td_nt;
  const char *tn = td_t[i].name;
  int cpu[] = {NWC_CLIENT_CPU, NWC_CLIENT_CPU};
  printf("load_places: tensor %zu (%s)\n", i, tn);
  CHECK_RC(nwc_client_evict(c, "use", NULL, &res));
  CHECK_RC(nwc_client_load_on(c, "use", tn, NWC_CLIENT_CPU, NULL, NULL, &on));
  CHECK_RC(nwc_client_evict(c, "use", tn, &res));
  CHECK_RC(nwc_client_load_places(c, "use", tn, cpu, 2, 0, NULL, NULL, &res));
  CHECK(res.tensors == on.tensors && res.tensors == 1 && res.bytes == on.bytes &&
            res.raw_bytes == res.bytes,
        "load_places cpu of %s: %llu tensors, %llu bytes, %llu read (load_on: %llu, %llu)", tn,
        (unsigned long long)res.tensors, (unsigned long long)res.bytes,
        (unsigned long long)res.raw_bytes, (unsigned long long)on.tensors,
        (unsigned long long)on.bytes);
  nwc_client_resident *ps;
  size_t n = 0;
  CHECK_RC(nwc_client_ps(c, &ps, &n));
  CHECK(n == 1 && !strcmp(ps[0].tensor, tn) && ps[0].device == NWC_CLIENT_CPU && !ps[0].pinned,
        "ps after load_places cpu: %zu rows", n);
  free(ps);
  /* the model: the rest read once, the resident one not again */
  CHECK_RC(nwc_client_load_places(c, "use", NULL, cpu, 1, NWC_CLIENT_LOAD_PIN, NULL, NULL, &res));
  uint64_t rest = res.bytes - on.bytes; /* bytes: every tensor's blob, resident before or not */
  CHECK(res.tensors == td_nt && res.raw_bytes == rest,
        "pin_places of the model: %llu tensors, %llu bytes read (want %zu, %llu)",
        (unsigned long long)res.tensors, (unsigned long long)res.raw_bytes, td_nt,
        (unsigned long long)rest);
  CHECK_RC(nwc_client_ps(c, &ps, &n));
  for (size_t k = 0; k < n; k++) CHECK(ps[k].pinned, "ps: %s not pinned by pin_places", ps[k].tensor);
  free(ps);
  CHECK_RC(nwc_client_unpin(c, "use", NULL, &res));
  CHECK_RC(nwc_client_load_places(c, "use", NULL, cpu, 1, 0, NULL, NULL, &res));
  CHECK(res.tensors == td_nt && res.raw_bytes == 0, "load_places of a resident model read %llu",
        (unsigned long long)res.raw_bytes);
  /* refused: a GPU (the library's list or a raw mask), no place; the daemon serves on */
  int gpu[] = {NWC_CLIENT_CPU, 3};
  int rc = nwc_client_load_places(c, "use", tn, gpu, 2, 0, NULL, NULL, &res);
  CHECK(rc == -ENODEV && strstr(nwc_client_last_error(), "no device cuda:3"),
        "load_places cpu,cuda:3: %d %s", rc, nwc_client_last_error());
  rc = nwc_client_load_places(c, "use", tn, gpu, 0, 0, NULL, NULL, &res);
  CHECK(rc == -EINVAL, "load_places of no place in the library: %d", rc);
  char msg[256];
  rc = raw_load_places(0, msg);
  CHECK(rc == -EINVAL && strstr(msg, "names no place"), "load_places 0: %d %s", rc, msg);
  rc = raw_load_places(UINT64_C(1) << 63, msg);
  CHECK(rc == -ENODEV && strstr(msg, "no device cuda:62"), "load_places cuda:62: %d %s", rc, msg);
  CHECK_RC(nwc_client_stats(c, &(nwc_client_counters){0}));
}

int main(void) {
  int rc0;
  /* a host budget of its own, not a round one (devices must report it), that the model fits */
  const uint64_t budget = (100u << 20) + 7 * 4096;
  const char *extra[] = {"--budget", "104886272", NULL};
  pid_t d = td_begin("test_daemon_basic", "nwc-basic", extra, &rc0);
  if (!d) return rc0;
  struct stat st;
  CHECK(stat(td_sock, &st) == 0 && (st.st_mode & 0777) == 0660, "socket mode %o, not 0660",
        st.st_mode & 0777);
  nwc_client *c = NULL;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  if (!c) return 1;
  CHECK(!strcmp(nwc_client_backend(c), "cpu"), "backend %s", nwc_client_backend(c));
  CHECK(!strncmp(nwc_client_daemon_version(c), "nwcd ", 5), "daemon version '%s'",
        nwc_client_daemon_version(c));
  check_pages_note();
  check_bad_flag("nwcd: bad option '--bogus' (nwcd --help lists the options)",
                 (const char *[]){"--store", td_store, "--bogus", NULL});
  check_bad_flag("nwcd: bad option '-x'", (const char *[]){"-x", NULL});
  check_bad_flag("nwcd: --budget needs a value",
                 (const char *[]){"--store", td_store, "--budget", NULL});
  check_bad_flag("nwcd: --budget must be more than 0",
                 (const char *[]){"--store", td_store, "--budget", "0", NULL});
  check_bad_flag("nwcd: --gpu-budget: bad size '12Q'",
                 (const char *[]){"--store", td_store, "--gpu-budget", "12Q", NULL});
  check_bad_flag("nwcd: unexpected argument 'extra'",
                 (const char *[]){"--store", td_store, "extra", NULL});
  check_bad_flag("nwcd: --store DIR (or store = in the config) is required",
                 (const char *[]){NULL});
  nwc_client_result res;
  int rc = nwc_client_import(c, "use", getenv("NWC_SAMPLE"), NULL, &res);
  CHECK(rc == 0 && res.tensors == td_nt, "import: %d %s (%llu tensors)", rc, nwc_client_last_error(),
        (unsigned long long)res.tensors);
  rc = nwc_client_import(c, "use", getenv("NWC_SAMPLE"), NULL, &res);
  CHECK(rc == -EEXIST, "second import of the same name: %d %s", rc, nwc_client_last_error());
  rc = nwc_client_import(c, "bad/name", getenv("NWC_SAMPLE"), NULL, &res);
  CHECK(rc == -EINVAL, "import with a bad name: %d", rc);
  nwc_client_model *m;
  size_t n;
  CHECK_RC(nwc_client_models(c, &m, &n));
  CHECK(n == 1 && !strcmp(m[0].name, "use") && m[0].tensors == td_nt, "ls");
  free(m);
  nwc_client_tensor *ts;
  CHECK_RC(nwc_client_tensors(c, "use", &ts, &n));
  CHECK(n == td_nt, "ls use: %zu tensors", n);
  free(ts);
  CHECK(nwc_client_tensors(c, "nope", &ts, &n) == -ENOENT, "ls of a missing model");
  nwc_client_tensor_info info;
  CHECK_RC(nwc_client_info(c, "use", td_t[0].name, &info));
  CHECK(info.t.rows == td_t[0].rows && info.length % 4096 == 0, "info");
  CHECK(nwc_client_info(c, "use", "no such tensor", &info) == -ENOENT, "info of a missing tensor");

  check_all_tensors(c); /* loads on demand */
  check_matvec(c);
  check_wide_matvec(c);

  nwc_client_counters s;
  CHECK_RC(nwc_client_stats(c, &s));
  CHECK(s.resident_tensors == td_nt && s.loads == td_nt, "stats: %llu resident, %llu loads",
        (unsigned long long)s.resident_tensors, (unsigned long long)s.loads);
  check_devices(c, budget, td_nt, "after using every tensor");
  printf("loads: %llu O_DIRECT, %llu buffered; mlock ok %llu failed %llu\n",
         (unsigned long long)s.direct_loads, (unsigned long long)s.buffered_loads,
         (unsigned long long)s.mlock_ok, (unsigned long long)s.mlock_failed);
  CHECK_RC(nwc_client_evict(c, "use", NULL, &res));
  CHECK(res.tensors == td_nt, "evict all: %llu", (unsigned long long)res.tensors);
  check_devices(c, budget, 0, "after evicting everything");
  CHECK_RC(nwc_client_pin(c, "use", td_t[0].name, &res));
  CHECK_RC(nwc_client_load(c, "use", td_t[1].name, NULL, NULL, &res));
  check_devices(c, budget, 2, "with one of two tensors pinned");
  rc = nwc_client_evict(c, "use", td_t[0].name, &res);
  CHECK(rc == -EBUSY && strstr(nwc_client_last_error(), "pinned"), "evict of a pinned tensor: %d %s",
        rc, nwc_client_last_error());
  CHECK_RC(nwc_client_unpin(c, "use", td_t[0].name, &res));
  CHECK_RC(nwc_client_evict(c, "use", td_t[0].name, &res));
  CHECK_RC(nwc_client_evict(c, "use", td_t[1].name, &res));
  /* Places: host memory by name; no GPU on the cpu backend */
  rc = nwc_client_load_on(c, "use", td_t[0].name, 0, NULL, NULL, &res);
  CHECK(rc == -ENODEV, "load onto cuda:0 with the cpu backend: %d %s", rc, nwc_client_last_error());
  rc = nwc_client_load_on(c, "use", NULL, INT32_MAX, NULL, NULL, &res);
  CHECK(rc == -ENODEV, "load of the model onto cuda:%d: %d %s", INT32_MAX, rc,
        nwc_client_last_error());
  CHECK_RC(nwc_client_load_on(c, "use", td_t[0].name, NWC_CLIENT_CPU, NULL, NULL, &res));
  CHECK(res.tensors == 1, "load_on cpu: %llu tensors", (unsigned long long)res.tensors);
  check_load_places(c);
  CHECK_RC(nwc_client_load(c, "use", NULL, NULL, NULL, &res));
  nwc_client_resident *ps;
  CHECK_RC(nwc_client_ps(c, &ps, &n));
  CHECK(n == td_nt, "ps after load: %zu", n);
  for (size_t i = 0; i < n; i++) CHECK(ps[i].device == NWC_CLIENT_CPU, "ps: device %d", ps[i].device);
  free(ps);
  CHECK_RC(nwc_client_verify(c, NULL, NULL, NULL, &res));
  CHECK(res.problems == 0 && res.tensors == td_nt, "verify");
  check_devices_refused();
  check_fp8_bias(c);

  /* Edges of the daemon. */
  CHECK(td_daemon_refuses("/tmp/never-used-nwcd.sock", NULL) == 1,
        "a second daemon on the same store was not refused");
  {
    char store2[300];
    memcpy(store2, td_store, sizeof store2);
    snprintf(td_store, sizeof td_store, "%.200s/store2", td_dir);
    char sock2[400];
    snprintf(sock2, sizeof sock2, "%.200s/cuda.sock", td_dir);
    const char *cuda[] = {"--backend", "cuda", NULL};
    if (access("/dev/nvidia0", F_OK) != 0)
      CHECK(td_daemon_refuses(sock2, cuda) == 1, "--backend cuda not refused without a GPU");
    CHECK(td_daemon_refuses(td_sock, NULL) == 1, "a daemon took over a live socket");
    char reg[400];
    snprintf(reg, sizeof reg, "%.200s/regular", td_dir);
    FILE *f = fopen(reg, "w");
    if (f) fclose(f);
    CHECK(td_daemon_refuses(reg, NULL) == 1 && stat(reg, &st) == 0 && S_ISREG(st.st_mode),
          "a regular file at the socket path was replaced");
    memcpy(td_store, store2, sizeof td_store);
  }
  /* Old protocol. */
  int fd = td_raw_connect(td_sock);
  nwc_proto_req r;
  memset(&r, 0, sizeof r);
  r.op = NWC_OP_HELLO, r.id = 1, r.ver_min = r.ver_max = 2;
  nwc_proto_hdr h;
  uint8_t *p = NULL;
  CHECK(td_send_req(fd, &r) == 0 && td_recv_frame(fd, &h, &p, 5000) == 0, "hello v2");
  CHECK(p && h.status == -EPROTONOSUPPORT && strstr(td_error_text(p, h.length), "protocol 2 not supported"),
        "hello v2 reply: %d %s", h.status, p ? td_error_text(p, h.length) : "");
  free(p);
  close(fd);
  CHECK_RC(nwc_client_stats(c, &s)); /* still serving */
  nwc_client_free(c);
  check_alone();
  CHECK(td_stop_daemon(d) == 0, "SIGTERM did not exit 0");

  /* Per-uid cap, and a stale socket: SIGKILL leaves the socket file behind. */
  const char *cap[] = {"--max-conn-per-uid", "3", NULL};
  d = td_start_daemon(cap);
  CHECK(d > 0, "restart");
  nwc_client *cs[4] = {0};
  for (int i = 0; i < 3; i++) CHECK_RC(nwc_client_connect(td_sock, &cs[i]));
  rc = nwc_client_connect(td_sock, &cs[3]);
  CHECK(rc == -EUSERS && strstr(nwc_client_last_error(), "too many connections"),
        "4th connection with a cap of 3: %d %s", rc, nwc_client_last_error());
  for (int i = 1; i < 4; i++) nwc_client_free(cs[i]);
  kill(d, SIGKILL);
  waitpid(d, NULL, 0);
  CHECK(stat(td_sock, &st) == 0, "socket file gone after SIGKILL?");
  /* a client whose daemon is gone is told so, and where to look */
  rc = cs[0] ? nwc_client_stats(cs[0], &s) : 0;
  CHECK(rc == -ECONNRESET && strstr(nwc_client_last_error(), "the connection (it stopped, or "
        "ended this connection: its log says why)"), "a request to a killed daemon: %d %s", rc,
        nwc_client_last_error());
  nwc_client_free(cs[0]);
  d = td_start_daemon(NULL);
  CHECK(d > 0, "the stale socket was not replaced");
  CHECK_RC(nwc_client_connect(td_sock, &c));
  if (c) {
    uint16_t *b = malloc(td_t[0].rows * td_t[0].cols * 2);
    CHECK_RC(nwc_client_dequant(c, "use", td_t[0].name, NWC_CLIENT_BF16, b, td_t[0].rows * td_t[0].cols * 2,
                                NULL, NULL, NULL));
    CHECK(!memcmp(b, td_t[0].w, td_t[0].rows * td_t[0].cols * 2), "after restart");
    free(b);
    CHECK_RC(nwc_client_remove(c, "use"));
    CHECK(nwc_client_remove(c, "use") == -ENOENT, "second remove");
    nwc_client_free(c);
  }
  if (d > 0) CHECK(td_stop_daemon(d) == 0, "SIGTERM exit");
  check_poll();
  if (test_failures) td_show_log();
  td_cleanup();
  return test_exit("test_daemon_basic");
}
