/*
 * test_service_util.h - what the systemd/config/policy tests (issue 6) share, on top of
 * test_daemon_util.h: a store with the sample model imported (by a real nwcd), writing config
 * files, reading nwcd's log, starting nwcd with a custom environment and inherited listening
 * socket (socket activation without systemd: LISTEN_FDS/LISTEN_PID set in the child, so the pid
 * matches after exec), and a NOTIFY_SOCKET datagram socket whose messages are collected.
 */
#ifndef NWC_TEST_SERVICE_UTIL_H
#define NWC_TEST_SERVICE_UTIL_H

/* Helpers shared by several tests; not every test uses each of them (nor of test_daemon_util.h). */
#pragma GCC diagnostic ignored "-Wunused-function"

#include "test_daemon_util.h"

#include "nwc_client.h"

#include <stdarg.h>

/* Starts a daemon, imports the sample as "use", stops it: 0, 77 without the sample, 1. */
static int ts_import_sample(void) {
  int rc = td_open_sample();
  if (rc) return rc;
  pid_t d = td_start_daemon(NULL);
  if (d < 0) return 1;
  nwc_client *c = NULL;
  nwc_client_result res;
  rc = nwc_client_connect(td_sock, &c);
  if (rc == 0) rc = nwc_client_import(c, "use", getenv("NWC_SAMPLE"), NULL, &res);
  if (rc < 0) fprintf(stderr, "import: %d %s\n", rc, nwc_client_last_error());
  nwc_client_free(c);
  if (td_stop_daemon(d) != 0) rc = -1;
  return rc < 0 ? 1 : 0;
}

/* Writes td_dir/name with printf-style text; returns its path (static buffer per call site is
 * not needed: the caller passes out[700]). */
__attribute__((format(printf, 3, 4))) static void ts_write(char *out, const char *name,
                                                           const char *fmt, ...) {
  snprintf(out, 700, "%s/%s", td_dir, name);
  FILE *f = fopen(out, "w");
  if (!f) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fclose(f);
}

/* The whole daemon log (malloc'ed, NUL-terminated; free it). */
static char *ts_log(void) {
  char path[700];
  snprintf(path, sizeof path, "%s/nwcd.log", td_dir);
  FILE *f = fopen(path, "r");
  char *buf = calloc(1, 1 << 20);
  if (f && buf) buf[fread(buf, 1, (1 << 20) - 1, f)] = 0;
  if (f) fclose(f);
  return buf;
}

__attribute__((unused)) static void ts_log_clear(void) {
  char path[700];
  snprintf(path, sizeof path, "%s/nwcd.log", td_dir);
  if (truncate(path, 0) < 0 && errno != ENOENT) perror("truncate");
}

/* Waits up to ms for the log to contain needle. */
__attribute__((unused)) static int ts_log_wait(const char *needle, int ms) {
  for (int t = 0; t <= ms; t += 20) {
    char *l = ts_log();
    int found = l && strstr(l, needle);
    free(l);
    if (found) return 1;
    usleep(20000);
  }
  return 0;
}

/* A bound, listening Unix stream socket at path (the test's "systemd"). */
static int ts_listen(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path) return -1;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 16) < 0) {
    perror("listen socket");
    return -1;
  }
  return fd;
}

/* The NOTIFY_SOCKET end: a bound datagram socket at path. */
static int ts_notify_socket(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path) return -1;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    perror("notify socket");
    return -1;
  }
  return fd;
}

/* Every notification seen so far, in order (one datagram per entry). */
static char ts_msgs[4096][512];
static int ts_nmsgs;

/* Receives datagrams until one contains needle (returns its index) or ms pass (-1). */
static int ts_notify_wait(int fd, const char *needle, int ms) {
  uint64_t end = 0;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  end = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000 + (uint64_t)ms;
  for (;;) {
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    if (now >= end) return -1;
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, (int)(end - now)) <= 0) return -1;
    char buf[512];
    ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
    if (n < 0) continue;
    buf[n] = 0;
    int i = ts_nmsgs < 4096 ? ts_nmsgs++ : 4095;
    snprintf(ts_msgs[i], sizeof ts_msgs[i], "%s", buf);
    if (strstr(buf, needle)) return i;
  }
}

static void ts_show_msgs(void) {
  for (int i = 0; i < ts_nmsgs; i++) fprintf(stderr, "  notify[%d] %s\n", i, ts_msgs[i]);
}

/* Starts argv[0] (NULL-terminated argv) with stderr appended to td_dir/nwcd.log and, in the
 * child only: listen_fd (>= 0) as descriptor 3 with LISTEN_FDS=1 and LISTEN_PID=its pid,
 * NOTIFY_SOCKET=notify (or unset), WATCHDOG_USEC=watchdog_us with WATCHDOG_PID (if > 0). */
static pid_t ts_spawn(const char *const *argv, int listen_fd, const char *notify,
                      unsigned watchdog_us) {
  char log[700];
  snprintf(log, sizeof log, "%s/nwcd.log", td_dir);
  pid_t pid = fork();
  if (pid != 0) return pid;
  int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) dup2(fd, 2);
  int nul = open("/dev/null", O_WRONLY);
  if (nul >= 0) dup2(nul, 1);
  char num[32];
  snprintf(num, sizeof num, "%d", (int)getpid());
  if (listen_fd >= 0) {
    if (listen_fd != 3) dup2(listen_fd, 3), close(listen_fd);
    setenv("LISTEN_FDS", "1", 1);
    setenv("LISTEN_PID", num, 1);
  }
  if (notify) setenv("NOTIFY_SOCKET", notify, 1);
  else unsetenv("NOTIFY_SOCKET");
  if (watchdog_us) {
    char us[32];
    snprintf(us, sizeof us, "%u", watchdog_us);
    setenv("WATCHDOG_USEC", us, 1);
    setenv("WATCHDOG_PID", num, 1);
  }
  execv(argv[0], (char *const *)argv);
  _exit(127);
}

/* Waits up to ms for pid to exit: its exit status, or -1 (killed). */
static int ts_wait_exit(pid_t pid, int ms) { return td_wait_exit(pid, ms / 10 + 1); }

/* Tensors of model in ps, and how many of them are pinned. */
__attribute__((unused)) static size_t ts_resident(nwc_client *c, const char *model, size_t *pinned) {
  nwc_client_resident *ps = NULL;
  size_t n = 0, k = 0;
  *pinned = 0;
  if (nwc_client_ps(c, &ps, &n) < 0) return 0;
  for (size_t i = 0; i < n; i++)
    if (!strcmp(ps[i].model, model)) k++, *pinned += ps[i].pinned != 0;
  free(ps);
  return k;
}

#endif
