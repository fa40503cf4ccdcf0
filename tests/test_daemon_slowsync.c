/*
 * test_daemon_slowsync.c - catalog reads do not wait for a write's commit.  nwcd runs with
 * libnwc_fault.so (fault_inject.c) making every fsync in the store sleep SLOW_MS first (a slow
 * disk), armed only once the sample model is imported twice.  One connection then removes the
 * second model (a commit and a directory fsync: at least 2 x SLOW_MS); while it does, a second
 * connection lists the models, the tensors of the first and one tensor's info, each of which must
 * answer within SLOW_MS / 2 and show a consistent catalog (the removed model whole or gone).
 * Before the store had its read connection, listings held the daemon's store lock and the
 * store's mutex, which the removal holds across its fsyncs: each listing took as long as the
 * removal (on the soak's mix, the slowest 1 % of listings waited there: docs/results.md, "Soak").
 */
#include "test_daemon_util.h"

#include "nwc_client.h"

#include <pthread.h>

#define SLOW_MS 1000

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct removal {
  nwc_client *c;
  int rc;
  double took;
} removal;

static void *remove_thread(void *arg) {
  removal *r = arg;
  double t0 = now_s();
  r->rc = nwc_client_remove(r->c, "use2");
  r->took = now_s() - t0;
  return NULL;
}

int main(void) {
  char arm[400], slow[16];
  test_seed("test_daemon_slowsync");
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  printf("a sanitizer runtime must come first among preloaded libraries: skipped here\n");
  return TEST_SKIP; /* as test_fault_inject, which preloads the same library */
#endif
  int rc0 = td_open_sample();
  if (rc0) return rc0;
  if (td_mkdir("nwc-slowsync") < 0) return 1;
  snprintf(arm, sizeof arm, "%s/arm", td_dir);
  snprintf(slow, sizeof slow, "%d", SLOW_MS);
  setenv("LD_PRELOAD", FAULT_LIB, 1);
  setenv("NWC_FAULT", "fsync:1:SLOW", 1);
  setenv("NWC_FAULT_SLOW_MS", slow, 1);
  setenv("NWC_FAULT_PATH", td_store, 1);
  setenv("NWC_FAULT_ARM", arm, 1);
  pid_t pid = td_start_daemon(NULL);
  unsetenv("LD_PRELOAD");
  CHECK(pid > 0, "nwcd did not start");
  if (pid <= 0) return td_show_log(), 1;
  nwc_client *a = NULL, *b = NULL;
  CHECK_RC(nwc_client_connect(td_sock, &a));
  CHECK_RC(nwc_client_connect(td_sock, &b));
  if (!a || !b) return 1;
  CHECK_RC(nwc_client_import(a, "use", getenv("NWC_SAMPLE"), NULL, NULL));
  CHECK_RC(nwc_client_import(a, "use2", getenv("NWC_SAMPLE"), NULL, NULL));
  FILE *f = fopen(arm, "w");
  CHECK(f != NULL, "cannot create %s", arm);
  if (f) fclose(f);
  removal r = {a, 1, 0};
  pthread_t th;
  pthread_create(&th, NULL, remove_thread, &r);
  usleep(SLOW_MS * 1000 / 4); /* the removal is in its first fsync by now */
  const td_tensor *t = &td_t[test_below(td_nt)];
  double worst = 0;
  for (int i = 0; i < 3; i++) {
    double t0 = now_s();
    nwc_client_model *m = NULL;
    nwc_client_tensor *ts = NULL;
    nwc_client_tensor_info ti;
    size_t n = 0;
    int rc = i == 0   ? nwc_client_models(b, &m, &n)
             : i == 1 ? nwc_client_tensors(b, "use", &ts, &n)
                      : nwc_client_info(b, "use", t->name, &ti);
    double dt = now_s() - t0;
    worst = dt > worst ? dt : worst;
    CHECK(rc == 0, "request %d during the removal: %d %s", i, rc, nwc_client_last_error());
    if (i == 0)
      CHECK(rc || ((n == 1 || n == 2) && !strcmp(m[0].name, "use") && m[0].tensors == td_nt &&
                   (n == 1 || m[1].tensors == td_nt)),
            "the listing during the removal shows %zu models", n);
    if (i == 1) CHECK(rc || n == td_nt, "use lists %zu tensors during the removal", n);
    if (i == 2) CHECK(rc || (ti.t.rows == t->rows && ti.t.cols == t->cols), "info of %s", t->name);
    free(m), free(ts);
    CHECK(dt < SLOW_MS / 2 * 1e-3, "request %d took %.0f ms while a removal synced (fsync "
          "slowed to %d ms): it waited for the removal's commit", i, dt * 1e3, SLOW_MS);
  }
  pthread_join(th, NULL);
  printf("removal: %.0f ms; the slowest read during it: %.1f ms\n", r.took * 1e3, worst * 1e3);
  CHECK(r.rc == 0, "remove use2: %d", r.rc);
  CHECK(td_log_has("nwc_fault: fsync"), "no fsync was slowed: the test tested nothing");
  CHECK(r.took >= SLOW_MS * 1e-3, "the removal took %.0f ms, less than one slowed fsync",
        r.took * 1e3);
  nwc_client_free(a);
  nwc_client_free(b);
  CHECK(td_stop_daemon(pid) == 0, "nwcd did not exit 0 after SIGTERM");
  if (test_failures) td_show_log();
  td_cleanup();
  return test_exit("test_daemon_slowsync");
}
