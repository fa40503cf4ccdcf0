/*
 * test_service_notify.c - nwcd's systemd protocol without systemd: the test plays the service
 * manager.  It creates the listening socket and a NOTIFY_SOCKET datagram socket itself, starts
 * nwcd with LISTEN_FDS=1/LISTEN_PID (set in the child, so the pid matches after exec) and
 * WATCHDOG_USEC, with a config file that preloads the sample model, and checks:
 *   - STATUS=loading use: P % lines, then READY=1, and at READY=1 every tensor of the model is
 *     already resident and pinned (asked on the passed socket; the --socket path stays unbound);
 *   - WATCHDOG=1 arrives at half the watchdog period;
 *   - SIGHUP: RELOADING=1 with MONOTONIC_USEC, then READY=1;
 *   - SIGTERM: STOPPING=1 and exit 0;
 *   - a passed descriptor that is not a listening stream socket is refused at start;
 *   - under systemd-socket-activate (where installed) a client is served on its socket.
 */
#include "test_service_util.h"

#include <sys/stat.h>

static int wait_ready_checked(int nfd, nwc_client **out, const char *sock) {
  int i = ts_notify_wait(nfd, "READY=1", 30000);
  CHECK(i >= 0, "no READY=1 within 30 s");
  if (i < 0) return -1;
  int rc = nwc_client_connect(sock, out);
  CHECK(rc == 0, "connect to the passed socket: %d %s", rc, nwc_client_last_error());
  return rc;
}

int main(void) {
  test_seed("test_service_notify");
  if (td_mkdir("nwc-svc-notify") < 0) return 1;
  int rc = ts_import_sample();
  if (rc) {
    td_cleanup();
    return rc;
  }
  char conf[700], nsock[700], asock[700], unused[700];
  ts_write(conf, "nwcd.conf", "# preload test\n[daemon]\nstore = %s\nlog_level = info\n\n"
           "[memory]\nhost_budget = 256M\n[preload]\nmodels = use\n", td_store);
  snprintf(nsock, sizeof nsock, "%s/notify.sock", td_dir);
  snprintf(asock, sizeof asock, "%s/activated.sock", td_dir);
  snprintf(unused, sizeof unused, "%s/unused.sock", td_dir);
  int nfd = ts_notify_socket(nsock), lfd = ts_listen(asock);
  if (nfd < 0 || lfd < 0) return 1;
  /* The watchdog period varies per run (seeded): 200..600 ms. */
  unsigned wd_us = 200000 + (unsigned)test_below(400000);
  const char *argv[] = {NWCD_PATH, "--config", conf, "--socket", unused, "--threads", "2", NULL};
  pid_t d = ts_spawn(argv, lfd, nsock, wd_us);
  close(lfd);

  nwc_client *c = NULL;
  if (wait_ready_checked(nfd, &c, asock) == 0) {
    int loading = 0, first_ready = -1;
    for (int i = 0; i < ts_nmsgs; i++) {
      if (strstr(ts_msgs[i], "STATUS=loading use: ")) loading++;
      if (first_ready < 0 && strstr(ts_msgs[i], "READY=1")) first_ready = i;
    }
    CHECK(loading >= 2, "STATUS=loading lines before READY=1: %d", loading);
    CHECK(first_ready == ts_nmsgs - 1, "READY=1 is the last message so far");
    size_t pinned = 0, n = ts_resident(c, "use", &pinned);
    CHECK(n == td_nt && pinned == td_nt, "at READY=1: %zu of %zu tensors resident, %zu pinned", n,
          td_nt, pinned);
    struct stat st;
    CHECK(lstat(unused, &st) < 0, "nwcd bound --socket %s although it was socket-activated",
          unused);
    nwc_client_model *m = NULL;
    size_t nm = 0;
    CHECK_RC(nwc_client_models(c, &m, &nm));
    CHECK(nm == 1 && m && !strcmp(m[0].name, "use"), "models: %zu", nm);
    free(m);
    /* A matvec on the passed socket, checked against the fp64 reference. */
    const td_tensor *t = NULL;
    for (size_t i = 0; i < td_nt; i++)
      if (td_t[i].rows > 1 && (!t || td_t[i].rows * td_t[i].cols < t->rows * t->cols)) t = &td_t[i];
    if (t) {
      float *x = malloc(t->cols * 4), *y = malloc(t->rows * 4);
      for (uint64_t k = 0; k < t->cols; k++) x[k] = (float)(test_uniform() * 2 - 1);
      rc = nwc_client_matvec(c, "use", t->name, NULL, 1.0f, x, t->cols, 1, 0, y, t->rows * 4, NULL);
      CHECK(rc == 0, "matvec %s: %d %s", t->name, rc, nwc_client_last_error());
      if (rc == 0) {
        double err = td_matvec_err(t, x, 1.0, NULL, y);
        CHECK(err < 1e-3, "matvec %s: relative error %g", t->name, err);
      }
      free(x), free(y);
    }
  }
  int wd = ts_notify_wait(nfd, "WATCHDOG=1", (int)(wd_us / 1000) * 2 + 2000);
  CHECK(wd >= 0, "no WATCHDOG=1 (WATCHDOG_USEC=%u)", wd_us);
  if (wd >= 0) CHECK(ts_notify_wait(nfd, "WATCHDOG=1", (int)(wd_us / 1000) + 1000) >= 0,
                     "only one WATCHDOG=1 (period %u us)", wd_us);

  kill(d, SIGHUP);
  int rl = ts_notify_wait(nfd, "RELOADING=1", 10000);
  CHECK(rl >= 0 && strstr(ts_msgs[rl], "MONOTONIC_USEC="), "RELOADING=1 with MONOTONIC_USEC: %s",
        rl >= 0 ? ts_msgs[rl] : "(none)");
  CHECK(ts_notify_wait(nfd, "READY=1", 20000) >= 0, "no READY=1 after the reload");
  if (c) {
    size_t pinned = 0, n = ts_resident(c, "use", &pinned);
    CHECK(n == td_nt && pinned == td_nt, "after the reload: %zu resident, %zu pinned", n, pinned);
  }
  nwc_client_free(c);

  kill(d, SIGTERM);
  CHECK(ts_notify_wait(nfd, "STOPPING=1", 10000) >= 0, "no STOPPING=1 after SIGTERM");
  CHECK(ts_wait_exit(d, 20000) == 0, "nwcd did not exit 0 after SIGTERM");

  /* A passed descriptor that is not a listening stream socket: nwcd refuses to start. */
  int dg = socket(AF_UNIX, SOCK_DGRAM, 0);
  ts_log_clear();
  pid_t bad = ts_spawn(argv, dg, NULL, 0);
  close(dg);
  CHECK(ts_wait_exit(bad, 10000) == 1, "nwcd started on a datagram socket");
  char *log = ts_log();
  CHECK(log && strstr(log, "not a listening AF_UNIX stream socket"), "log: %s", log ? log : "");
  free(log);

  /* systemd's own tool for the same, where it is installed. */
  const char *sa = "/usr/bin/systemd-socket-activate";
  if (access(sa, X_OK) == 0) {
    char ssock[700], lflag[720];
    snprintf(ssock, sizeof ssock, "%s/sa.sock", td_dir);
    snprintf(lflag, sizeof lflag, "--listen=%s", ssock);
    const char *sargv[] = {sa, lflag, NWCD_PATH, "--store", td_store, "--socket", unused,
                           "--threads", "2", NULL};
    pid_t s = ts_spawn(sargv, -1, NULL, 0);
    int ok = 0;
    for (int i = 0; i < 500 && !ok; i++) ok = td_connectable(ssock), usleep(ok ? 0 : 10000);
    CHECK(ok, "systemd-socket-activate did not bind %s", ssock);
    nwc_client *sc = NULL;
    rc = ok ? nwc_client_connect(ssock, &sc) : -1;
    CHECK(rc == 0, "connect under systemd-socket-activate: %d %s", rc, nwc_client_last_error());
    nwc_client_model *m = NULL;
    size_t nm = 0;
    if (sc) CHECK(nwc_client_models(sc, &m, &nm) == 0 && nm == 1, "models under systemd-socket-activate");
    free(m);
    nwc_client_free(sc);
    kill(s, SIGTERM);
    CHECK(ts_wait_exit(s, 20000) == 0, "nwcd under systemd-socket-activate: exit after SIGTERM");
  } else {
    printf("systemd-socket-activate not installed; that part skipped\n");
  }
  close(nfd);
  printf("%d notifications (watchdog %u us); first '%s', last '%s'\n", ts_nmsgs, wd_us,
         ts_nmsgs ? ts_msgs[0] : "", ts_nmsgs ? ts_msgs[ts_nmsgs - 1] : "");
  if (test_failures) ts_show_msgs(), td_show_log();
  td_cleanup();
  return test_exit("test_service_notify");
}
