/*
 * test_daemon_idle.c - connections left open cannot lock a uid out.  A real nwcd with
 * --max-conn-per-uid 8: eight connections that never say hello are refused company at once
 * (EUSERS, as before) but closed after the handshake timeout (5 s), and then a client gets in;
 * eight that said hello and stay idle for 2 s give way, the longest idle first, to a new
 * connection of their uid, which is served.  (nwcd used to keep them all forever: 64 idle
 * connections of a uid locked it out.)
 */
#include "test_daemon_util.h"

#include "nwc_client.h"

#define CAP 8

/* 1 when the daemon closed fd (EOF), 0 when it is still open after timeout_ms. */
static int closed_by_daemon(int fd, int timeout_ms) {
  struct pollfd p = {fd, POLLIN, 0};
  char b;
  return poll(&p, 1, timeout_ms) == 1 && recv(fd, &b, 1, MSG_DONTWAIT) == 0;
}

static int client_served(void) {
  nwc_client *c = NULL;
  int rc = nwc_client_connect(td_sock, &c);
  nwc_client_model *m = NULL;
  size_t n = 0;
  if (rc == 0) rc = nwc_client_models(c, &m, &n);
  free(m);
  nwc_client_free(c);
  return rc;
}

int main(void) {
  test_seed("test_daemon_idle");
  if (td_mkdir("nwc-idle") < 0) return 1;
  char cap[8];
  snprintf(cap, sizeof cap, "%d", CAP);
  pid_t d = td_start_daemon((const char *[]){"--max-conn-per-uid", cap, NULL});
  CHECK(d > 0, "nwcd did not start");
  if (d <= 0) return td_show_log(), 1;
  usleep(300000); /* the start's probe connection is gone */
  int fds[CAP];
  for (int i = 0; i < CAP; i++) fds[i] = td_raw_connect(td_sock);
  usleep(100000);
  int rc = client_served();
  CHECK(rc == -EUSERS, "a connection over the limit: %d (want -EUSERS)", rc);
  int closed = 0;
  for (int i = 0; i < CAP; i++) /* the first waits for the timeout, the rest are closed by then */
    closed += closed_by_daemon(fds[i], i ? 500 : 8000), close(fds[i]);
  CHECK(closed == CAP, "%d of %d connections without hello closed by the handshake timeout",
        closed, CAP);
  rc = client_served();
  CHECK(rc == 0, "after the handshake timeout: %d %s", rc, nwc_client_last_error());

  for (int i = 0; i < CAP; i++) fds[i] = td_raw_hello(td_sock);
  usleep(2500000);
  rc = client_served();
  CHECK(rc == 0, "a connection beside %d idle ones: %d %s", CAP, rc, nwc_client_last_error());
  closed = 0;
  for (int i = 0; i < CAP; i++) closed += closed_by_daemon(fds[i], 100);
  CHECK(closed == 1, "%d idle connections closed for the newcomer (want 1)", closed);
  CHECK(closed_by_daemon(fds[0], 100) || closed == 0, "the idlest one (the first) was not closed");
  for (int i = 0; i < CAP; i++) close(fds[i]);
  CHECK(td_stop_daemon(d) == 0, "nwcd did not stop cleanly");
  if (test_failures) td_show_log();
  td_cleanup();
  return test_exit("test_daemon_idle");
}
