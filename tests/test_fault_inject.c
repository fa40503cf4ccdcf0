/*
 * test_fault_inject.c - failures of the disk at every step, through a real nwcd run under the
 * interposer libnwc_fault.so (fault_inject.c: from the Nth write, fsync, read or unlink on the
 * store's files on, every one fails with ENOSPC or EIO).  For N = 1, 2, ... until the step runs
 * out of calls:
 *   - import of the sample (write: ENOSPC; fsync: EIO),
 *   - remove of a model (write: EIO, the catalog's; unlink: EIO, the container's),
 *   - compute over the budget (read: EIO on the container files, the transient copy's pread),
 *     with a listing after,
 *   - the start on a disk that fails every write (ENOSPC): served, or refused naming the errno;
 *   - the startup sweep of a crash leftover (unlink: EIO);
 * nwcd never crashes and answers while the fault lasts; then, started again without faults,
 * its store verifies (catalog and every chunk), the model that was there before decodes bit for
 * bit, an import that failed left no model and no file, one that succeeded is whole, a removal
 * is all or nothing, and no container file is left that the catalog does not name.
 */
#include "test_daemon_util.h"

#include "nwc_client.h"




static char arm_file[400];

/* Arms (1) or disarms (0) the fault of a running start_faulty nwcd. */
static void arm(int on) {
  if (!on) {
    unlink(arm_file);
    return;
  }
  int fd = open(arm_file, O_WRONLY | O_CREAT, 0600);
  close(fd);
}

/* nwcd with the fault (spec "OP:N:ERR") on the store's files (under: "" or "/containers"),
 * counted while armed (armed: from its start, else from arm(1)); extra flags as
 * td_start_daemon. */
static pid_t start_faulty(const char *spec, const char *const *extra, int armed,
                          const char *under) {
  char log[400];
  snprintf(log, sizeof log, "%s/nwcd.log", td_dir);
  unlink(log);
  snprintf(arm_file, sizeof arm_file, "%s/armed", td_dir);
  arm(armed);
  setenv("LD_PRELOAD", FAULT_LIB, 1);
  setenv("NWC_FAULT", spec, 1);
  char path[500];
  snprintf(path, sizeof path, "%s%s", td_store, under);
  setenv("NWC_FAULT_PATH", path, 1);
  setenv("NWC_FAULT_ARM", arm_file, 1);
  int st = 0;
  pid_t d = td_start_daemon_at(td_sock, extra, &st);
  unsetenv("LD_PRELOAD"), unsetenv("NWC_FAULT"), unsetenv("NWC_FAULT_PATH");
  unsetenv("NWC_FAULT_ARM");
  return d;
}

static int has_model(nwc_client *c, const char *name) {
  nwc_client_model *m = NULL;
  size_t n = 0;
  int found = 0;
  if (nwc_client_models(c, &m, &n) == 0)
    for (size_t i = 0; i < n; i++) found |= !strcmp(m[i].name, name);
  free(m);
  return found;
}

/* After a faulty run: nwcd without faults finds the store whole.  m_state: 1 the model "m" must
 * be there, 0 it must not, -1 either (then whole). */
static void check_after(const char *what, int m_state) {
  pid_t d = td_start_daemon(NULL);
  CHECK(d > 0, "%s: nwcd does not start again", what);
  if (d <= 0) return td_show_log();
  nwc_client *c;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  nwc_client_result r = {0};
  int rc = nwc_client_verify(c, NULL, NULL, NULL, &r);
  CHECK(rc == 0 && r.problems == 0, "%s: verify: %d, %llu problems (%s)", what, rc,
        (unsigned long long)r.problems, nwc_client_last_error());
  const td_tensor *t = &td_t[test_below(td_nt)];
  size_t bytes = t->rows * t->cols * 2;
  uint16_t *b = malloc(bytes);
  rc = nwc_client_dequant(c, "base", t->name, NWC_CLIENT_BF16, b, bytes, NULL, NULL, NULL);
  CHECK(rc == 0 && !memcmp(b, t->w, bytes), "%s: base/%s after the fault: %d", what, t->name, rc);
  free(b);
  int m = has_model(c, "m");
  CHECK(m_state < 0 || m == m_state, "%s: model m is %s", what, m ? "there" : "missing");
  CHECK(td_count_containers(NULL) == 1u + (unsigned)m, "%s: %zu container files for %d models", what,
        td_count_containers(NULL), 1 + m);
  nwc_client_free(c);
  CHECK(td_stop_daemon(d) == 0, "%s: nwcd did not stop cleanly", what);
}

static int import_m(nwc_client *c) {
  return nwc_client_import(c, "m", getenv("NWC_SAMPLE"), NULL, NULL);
}

/* One faulty run of step on a store holding base (and m when with_m); returns whether the
 * fault was reached. */
static int faulty_run(const char *step, const char *spec, int with_m) {
  pid_t d = td_start_daemon(NULL);
  nwc_client *c = NULL;
  if (d > 0 && nwc_client_connect(td_sock, &c) == 0) {
    if (with_m && !has_model(c, "m")) CHECK_RC(import_m(c));
    if (!with_m && has_model(c, "m")) CHECK_RC(nwc_client_remove(c, "m"));
  }
  nwc_client_free(c);
  if (d > 0) td_stop_daemon(d);
  const char *tiny[] = {"--budget", "65536", NULL};
  int compute = !strcmp(step, "compute");
  d = start_faulty(spec, compute ? tiny : NULL, 0, compute ? "/containers" : "");
  CHECK(d > 0, "%s %s: nwcd did not start", step, spec);
  if (d <= 0) return td_show_log(), 0;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  arm(1);
  int rc = 0, m_state = with_m;
  if (!strcmp(step, "import")) {
    rc = import_m(c);
    m_state = rc == 0 ? 1 : -1; /* a failure after the commit may keep it: then it is whole */
    if (rc < 0)
      CHECK(strstr(nwc_client_last_error(), td_store) || strstr(nwc_client_last_error(), "catalog"),
            "import %s: the error names no file: %s", spec, nwc_client_last_error());
  } else if (!strcmp(step, "remove")) {
    rc = nwc_client_remove(c, "m");
    m_state = rc == 0 ? 0 : -1;
  } else {
    for (int i = 0; i < 8; i++) {
      const td_tensor *t = &td_t[test_below(td_nt)];
      size_t bytes = t->rows * t->cols * 2;
      uint16_t *b = malloc(bytes);
      rc = nwc_client_dequant(c, "base", t->name, NWC_CLIENT_BF16, b, bytes, NULL, NULL, NULL);
      CHECK(rc < 0 || !memcmp(b, t->w, bytes), "compute %s: %s wrong", spec, t->name);
      free(b);
    }
  }
  CHECK(has_model(c, "base"), "%s %s: nwcd does not list base while the fault lasts", step, spec);
  nwc_client_free(c);
  arm(0); /* nwcd's own stop (a checkpoint) is not the step under test */
  int st = td_stop_daemon(d);
  CHECK(st >= 0, "%s %s: nwcd crashed or hung (%d)", step, spec, st);
  int reached = td_log_has("nwc_fault:");
  char what[128];
  snprintf(what, sizeof what, "%s %s", step, spec);
  check_after(what, m_state);
  return reached;
}

/* nwcd started on a disk that fails every write: it serves, or refuses naming the errno. */
static void startup_run(void) {
  pid_t d = start_faulty("write:1:ENOSPC", NULL, 1, "");
  if (d > 0) {
    nwc_client *c = NULL;
    CHECK(nwc_client_connect(td_sock, &c) == 0 && has_model(c, "base"),
          "nwcd started on a full disk but does not list base");
    nwc_client_free(c);
    arm(0);
    CHECK(td_stop_daemon(d) >= 0, "nwcd on a full disk crashed or hung");
  } else {
    CHECK(td_log_has("No space left on device"), "nwcd refused a full disk without naming it");
    td_show_log();
  }
  arm(0);
  printf("startup on a full disk: %s\n", d > 0 ? "served" : "refused, naming it");
  check_after("startup write:1:ENOSPC", -1);
}

static void sweep_run(void) {
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s/containers/00000000000000ff.tmp", td_store);
  /* an id below next_container: a leftover of an import */
  pid_t d = td_start_daemon(NULL);
  nwc_client *c = NULL;
  if (d > 0 && nwc_client_connect(td_sock, &c) == 0 && !has_model(c, "m")) CHECK_RC(import_m(c));
  nwc_client_free(c);
  if (d > 0) td_stop_daemon(d);
  snprintf(tmp, sizeof tmp, "%s/containers/0000000000000001.tmp", td_store);
  int fd = open(tmp, O_WRONLY | O_CREAT, 0640);
  close(fd);
  d = start_faulty("unlink:1:EIO", NULL, 1, "");
  if (d > 0) {
    td_stop_daemon(d);
    CHECK(0, "nwcd started although the sweep could not remove its leftover");
  }
  CHECK(td_log_has("0000000000000001.tmp") && td_log_has("cannot remove"),
        "a sweep that cannot remove a leftover does not say which");
  check_after("sweep unlink:1:EIO", 1);
  CHECK(access(tmp, F_OK) != 0, "the leftover is still there after a clean start");
  arm(0);
}

int main(void) {
  test_seed("test_fault_inject");
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  printf("a sanitizer runtime must come first among preloaded libraries: skipped here\n");
  return TEST_SKIP;
#endif
  int rc = td_open_sample();
  if (rc) return rc;
  if (td_mkdir("nwc-fault") < 0) return 1;
  pid_t d = td_start_daemon(NULL);
  CHECK(d > 0, "nwcd did not start");
  if (d <= 0) return td_show_log(), 1;
  nwc_client *c;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  CHECK_RC(nwc_client_import(c, "base", getenv("NWC_SAMPLE"), NULL, NULL));
  nwc_client_free(c);
  td_stop_daemon(d);
  static const struct {
    const char *step, *op, *err;
    int with_m;
  } cases[] = {{"import", "write", "ENOSPC", 0}, {"import", "fsync", "EIO", 0},
               {"remove", "write", "EIO", 1},    {"remove", "unlink", "EIO", 1},
               {"remove", "fsync", "EIO", 1},    {"compute", "read", "EIO", 0}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    int runs = 0;
    for (long n = 1 + (long)test_below(2); runs < 40; n += n < 8 ? 1 : n / 3, runs++) {
      char spec[64];
      snprintf(spec, sizeof spec, "%s:%ld:%s", cases[k].op, n, cases[k].err);
      if (!faulty_run(cases[k].step, spec, cases[k].with_m)) break;
      if (test_failures) break;
    }
    printf("%s, %s failing with %s: %d runs, the store whole after each\n", cases[k].step,
           cases[k].op, cases[k].err, runs + 1);
    if (test_failures) break;
  }
  if (!test_failures) startup_run();
  if (!test_failures) sweep_run();
  if (test_failures) td_show_log();
  else td_cleanup();
  return test_exit("test_fault_inject");
}
