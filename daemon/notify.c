/*
 * notify.c - nwcd under systemd: socket activation, readiness and health (libsystemd), SIGHUP,
 * and the service thread that makes the preload models resident.
 *
 * Notifications (sd_notify; each a no-op without NOTIFY_SOCKET, so the daemon runs the same by
 * hand):
 *
 *   start ── socket listening ── service thread: STATUS=loading M: P % ... ── READY=1, STATUS=
 *   SIGHUP (loop thread): RELOADING=1 + MONOTONIC_USEC, re-read the config (config.c), then the
 *           service thread applies the preload list and sends READY=1 (at once if the file
 *           did not parse: nothing changed)
 *   WatchdogSec set: a loop timer sends WATCHDOG=1 every half period (a wedged loop stops it)
 *   SIGTERM/SIGINT: STOPPING=1; the service thread stops at the next tensor
 *
 * The service thread: one thread, started after the socket listens, that sleeps on a condition
 * variable between passes.  A pass unpins the models that left the preload list and loads and
 * pins every tensor of the listed ones (nwcd_res_acquire with NWCD_ACQ_PIN, as `nwcctl pin`),
 * with a STATUS line per percent.  A failing model (absent, over budget, corrupt) is logged and
 * skipped: the daemon still becomes ready and serves the rest.  Passes never overlap: a reload
 * during a pass queues one more.  State under svc.lock; the thread is joined before the loop
 * ends (nwcd_service_close), so it never outlives residency or the store.
 */
#include "notify.h"

#include "clock.h"
#include "config.h"
#include "log.h"
#include "nwcd.h"
#include "residency.h"

#include "nwc_error.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <time.h>

static struct {
  nwcd *d;
  uv_signal_t sighup;
  uv_timer_t watchdog;
  bool started, watchdog_on;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool stop, pass_pending;
  char **pinned; /* models the last pass preloaded (service thread only) */
  size_t npinned;
} svc = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

/* sd_notify wrapper: a no-op without NOTIFY_SOCKET; any thread. */
__attribute__((format(printf, 1, 2))) static void notify(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  int rc = sd_notify(0, buf);
  static atomic_bool warned; /* once: a vanished NOTIFY_SOCKET would repeat it forever */
  if (rc < 0 && !atomic_exchange(&warned, true))
    nwcd_log(NWCD_LOG_WARN, "sd_notify to %s: %s", getenv("NOTIFY_SOCKET"), strerror(-rc));
}

int nwcd_service_listen_fd(char *path, size_t n) {
  int k = sd_listen_fds(1);
  if (k == 0) return -ENOENT;
  NWC_RETURN_IF(k < 0, k, "sd_listen_fds: %s", strerror(-k));
  NWC_RETURN_IF(k != 1, -EINVAL, "socket activation passed %d sockets; nwcd takes one", k);
  int fd = SD_LISTEN_FDS_START;
  NWC_RETURN_IF(sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0, -EINVAL,
                "the socket passed by systemd (fd %d) is not a listening AF_UNIX stream socket",
                fd);
  int fl = fcntl(fd, F_GETFL);
  NWC_RETURN_IF(fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
                    fcntl(fd, F_SETFD, FD_CLOEXEC) < 0,
                -errno, "fcntl on the passed socket: %s", strerror(errno));
  struct sockaddr_un sa;
  socklen_t sl = sizeof sa;
  memset(&sa, 0, sizeof sa);
  if (getsockname(fd, (struct sockaddr *)&sa, &sl) == 0 && sa.sun_path[0])
    snprintf(path, n, "%s (socket-activated)", sa.sun_path);
  else
    snprintf(path, n, "fd %d (socket-activated)", fd);
  return fd;
}

/* ---- the service thread ------------------------------------------------------------------- */

static bool should_stop(void) {
  pthread_mutex_lock(&svc.lock);
  bool s = svc.stop;
  pthread_mutex_unlock(&svc.lock);
  return s;
}

static bool listed(char **names, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(names[i], name)) return true;
  return false;
}

static int tensors_of(nwcd *d, const char *model, nwc_tensor_info **ti, size_t *n) {
  int rc = nwc_store_tensors(d->store, model, ti, n);
  NWC_RETURN_IF(rc == -ENOENT, -ENOENT, "no model '%s' in the store", model);
  return rc;
}

static void unpin_model(nwcd *d, const char *model) {
  nwc_tensor_info *ti = NULL;
  size_t n = 0;
  if (tensors_of(d, model, &ti, &n) < 0) return;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += nwcd_res_unpin(d->res, model, ti[i].name) > 0;
  nwc_tensor_info_free(ti, n);
  nwcd_log(NWCD_LOG_INFO, "preload: %s left the list: %zu tensors unpinned (now evictable)", model,
           k);
}

/* Loads and pins every tensor of model; 0 or the first error (logged). */
static int preload_model(nwcd *d, const char *model) {
  nwc_tensor_info *ti = NULL;
  size_t n = 0;
  uint64_t t0 = nwcd_now_ns();
  int rc = tensors_of(d, model, &ti, &n);
  uint64_t total = 0, done = 0, loaded = 0;
  for (size_t i = 0; rc == 0 && i < n; i++) total += ti[i].length;
  int last_pct = -1;
  for (size_t i = 0; rc == 0 && i < n; i++) {
    if (should_stop()) {
      rc = nwc__fail(-ECANCELED, "stopping");
      break;
    }
    int pct = total ? (int)(done * 100 / total) : 100;
    if (pct != last_pct) notify("STATUS=loading %s: %d %%", model, pct), last_pct = pct;
    nwcd_ref ref;
    nwcd_load_info li;
    rc = nwcd_res_acquire(d->res, model, ti[i].name, NWCD_ACQ_PIN, &ref, &li);
    if (rc == 0 && ref.loaded) loaded += ti[i].length;
    done += ti[i].length;
  }
  nwc_tensor_info_free(ti, n);
  double secs = (nwcd_now_ns() - t0) / 1e9;
  if (rc < 0)
    nwcd_log(NWCD_LOG_ERR, "preload %s failed after %.2f s: %s", model, secs, nwc_error_detail());
  else
    nwcd_log(NWCD_LOG_INFO, "preload %s: %zu tensors, %llu bytes resident and pinned (%llu read) "
             "in %.2f s", model, n, (unsigned long long)total, (unsigned long long)loaded, secs);
  return rc;
}

/* One pass over the active preload list. */
static void preload_pass(nwcd *d) {
  char **want = NULL;
  size_t n = 0;
  if (nwcd_config_preload(&want, &n) < 0) return;
  for (size_t i = 0; i < svc.npinned; i++)
    if (!listed(want, n, svc.pinned[i])) unpin_model(d, svc.pinned[i]);
  for (size_t i = 0; i < svc.npinned; i++) free(svc.pinned[i]);
  free(svc.pinned);
  svc.pinned = want, svc.npinned = n;
  unsigned ok = 0;
  for (size_t i = 0; i < n && !should_stop(); i++) ok += preload_model(d, want[i]) == 0;
  if (n) notify("STATUS=serving; %u of %zu preload models resident", ok, n);
  else notify("STATUS=serving");
}

static void *service_main(void *arg) {
  nwcd *d = arg;
  preload_pass(d);
  if (!should_stop()) notify("READY=1");
  pthread_mutex_lock(&svc.lock);
  while (!svc.stop) {
    if (!svc.pass_pending) {
      pthread_cond_wait(&svc.cond, &svc.lock);
      continue;
    }
    svc.pass_pending = false;
    pthread_mutex_unlock(&svc.lock);
    preload_pass(d);
    if (!should_stop()) notify("READY=1");
    pthread_mutex_lock(&svc.lock);
  }
  pthread_mutex_unlock(&svc.lock);
  return NULL;
}

/* Queues a preload pass for the active settings' list (after a reload); the service thread
 * unpins models no longer listed, loads and pins the listed ones, then sends READY=1. */
static void preload_queue(void) {
  pthread_mutex_lock(&svc.lock);
  svc.pass_pending = true;
  pthread_cond_signal(&svc.cond);
  pthread_mutex_unlock(&svc.lock);
}

/* ---- loop handles ------------------------------------------------------------------------- */

static void on_sighup(uv_signal_t *h, int signum) {
  (void)h, (void)signum;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  notify("RELOADING=1\nMONOTONIC_USEC=%llu\nSTATUS=reloading the configuration",
              (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000);
  nwcd_log(NWCD_LOG_INFO, "SIGHUP: reloading the configuration");
  if (nwcd_config_reload(svc.d) < 0)
    notify("READY=1\nSTATUS=serving; the last reload failed: %s", nwc_error_detail());
  else preload_queue(); /* the service thread sends READY=1 after the pass */
}

static void on_watchdog(uv_timer_t *t) {
  (void)t;
  notify("WATCHDOG=1");
}

int nwcd_service_start(nwcd *d, uv_loop_t *loop) {
  svc.d = d;
  uv_signal_init(loop, &svc.sighup);
  uv_signal_start(&svc.sighup, on_sighup, SIGHUP);
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0 && usec >= 2000) {
    uv_timer_init(loop, &svc.watchdog);
    uv_timer_start(&svc.watchdog, on_watchdog, 0, usec / 2000);
    svc.watchdog_on = true;
    nwcd_log(NWCD_LOG_INFO, "watchdog: WATCHDOG=1 every %llu ms",
             (unsigned long long)(usec / 2000));
  }
  /* Started while SIGHUP is still blocked, the service thread inherits the block: the loop
   * thread is the only one that takes it (under ThreadSanitizer a signal that lands on a thread
   * waiting outside its interceptors runs only when that thread wakes). */
  int rc = pthread_create(&svc.thread, NULL, service_main, d);
  svc.started = rc == 0;
  sigset_t hup; /* main() blocked it until now: one sent early is delivered here, not fatal */
  sigemptyset(&hup);
  sigaddset(&hup, SIGHUP);
  pthread_sigmask(SIG_UNBLOCK, &hup, NULL);
  NWC_RETURN_IF(rc, -rc, "cannot start the service thread: %s", strerror(rc));
  return 0;
}

void nwcd_service_stopping(void) {
  notify("STOPPING=1\nSTATUS=stopping: finishing requests in flight");
  pthread_mutex_lock(&svc.lock);
  svc.stop = true;
  pthread_cond_signal(&svc.cond);
  pthread_mutex_unlock(&svc.lock);
}

static void on_closed(uv_handle_t *h) { (void)h; }

void nwcd_service_close(void) {
  if (!svc.d) return;
  uv_close((uv_handle_t *)&svc.sighup, on_closed);
  if (svc.watchdog_on) uv_close((uv_handle_t *)&svc.watchdog, on_closed);
  svc.watchdog_on = false;
  pthread_mutex_lock(&svc.lock);
  svc.stop = true;
  pthread_cond_signal(&svc.cond);
  pthread_mutex_unlock(&svc.lock);
  if (svc.started) pthread_join(svc.thread, NULL);
  svc.started = false;
  for (size_t i = 0; i < svc.npinned; i++) free(svc.pinned[i]);
  free(svc.pinned);
  svc.pinned = NULL, svc.npinned = 0;
  svc.d = NULL;
}
