/*
 * test_daemon_import.c - an import does not stop the daemon serving other requests: while one
 * connection imports the sample model a second time under a new name, another connection lists
 * the models (the new one is not there yet, so the listing did not wait for the import),
 * dequantizes a tensor of the first model (bit for bit against the original file) and runs a
 * matvec on it (against fp64), and starts
 * a competing import of the same new name: exactly one of the two imports succeeds, the other
 * gets -EEXIST, and afterwards the catalog lists both models, whole, with nothing left over in
 * the containers directory.  A progress callback that returns non-zero while the daemon is
 * stopped (SIGSTOP) makes the import return -ECANCELED at once, not when the import ends; the
 * import still completes once nwcd runs again, and the client stays usable (the cancelled
 * request's late events and reply are dropped: a ticket and a dequant on it come out right).
 */
#include "test_daemon_util.h"

#include "nwc_client.h"


typedef struct during {
  nwc_client *other;
  int calls, checked, second_rc;
} during;

static int on_progress(void *ctx, uint64_t done, uint64_t total) {
  during *d = ctx;
  d->calls++;
  if (d->checked || done >= total) return 0;
  d->checked = 1;
  nwc_client_model *m;
  size_t n;
  CHECK_RC(nwc_client_models(d->other, &m, &n));
  CHECK(n == 1 && !strcmp(m[0].name, "use"),
        "a listing during the import shows %zu models: it waited for the import", n);
  if (n) free(m);
  const td_tensor *t = &td_t[test_below(td_nt)];
  size_t bytes = t->rows * t->cols * 2;
  uint16_t *b = malloc(bytes);
  int rc = nwc_client_dequant(d->other, "use", t->name, NWC_CLIENT_BF16, b, bytes, NULL, NULL, NULL);
  CHECK(rc == 0 && !memcmp(b, t->w, bytes), "dequant of %s during the import: %d %s", t->name, rc,
        nwc_client_last_error());
  free(b);
  float *x = malloc(t->cols * 4), *y = malloc(t->rows * 4);
  for (size_t k = 0; k < t->cols; k++) x[k] = (float)(test_uniform() * 2 - 1);
  rc = nwc_client_matvec(d->other, "use", t->name, NULL, 1.0f, x, t->cols, 1, 0, y, t->rows * 4,
                         NULL);
  double err = rc ? 1 : td_matvec_err(t, x, 1.0, NULL, y);
  CHECK(err <= 1e-5, "matvec of %s during the import: %d, relative error %g", t->name, rc, err);
  free(x), free(y);
  d->second_rc = nwc_client_import(d->other, "use2", getenv("NWC_SAMPLE"), NULL, NULL);
  return 0;
}


static pid_t stopped_pid;
static volatile sig_atomic_t resumed;

static void on_alarm(int sig) {
  (void)sig;
  resumed = 1;
  kill(stopped_pid, SIGCONT);
}

static int stop_and_cancel(void *ctx, uint64_t done, uint64_t total) {
  int *calls = ctx;
  if (done >= total || (*calls)++) return 0;
  kill(stopped_pid, SIGSTOP); /* the import cannot end before the call returns */
  alarm(3);                   /* unless the call waits for it: then nwcd goes on after 3 s */
  return 1;
}

static void test_cancel(nwc_client *c, pid_t pid) {
  stopped_pid = pid;
  struct sigaction sa = {.sa_handler = on_alarm, .sa_flags = SA_RESTART};
  sigaction(SIGALRM, &sa, NULL);
  int calls = 0;
  nwc_client_import_opts o = {.progress = stop_and_cancel, .ctx = &calls};
  int rc = nwc_client_import(c, "use3", getenv("NWC_SAMPLE"), &o, NULL);
  int waited = resumed;
  alarm(0);
  kill(pid, SIGCONT);
  CHECK(calls == 1 && rc == -ECANCELED && !waited,
        "cancelled import: %d (%s) after %d progress calls; %s", rc, nwc_client_last_error(),
        calls, waited ? "it waited until nwcd ran again" : "it returned at once");
  const td_tensor *t = &td_t[test_below(td_nt)];
  size_t bytes = t->rows * t->cols * 2;
  uint16_t *b = malloc(bytes), *g = malloc(t->cols * 2);
  uint64_t row = test_below(t->rows), ticket = 0;
  CHECK_RC(nwc_client_submit_gather(c, "use", t->name, &row, 1, NWC_CLIENT_BF16, g, t->cols * 2,
                                    &ticket));
  CHECK_RC(nwc_client_wait(c, ticket, NULL));
  CHECK(!memcmp(g, t->w + row * t->cols, t->cols * 2), "gather of %s row %llu after the cancel",
        t->name, (unsigned long long)row);
  rc = nwc_client_dequant(c, "use", t->name, NWC_CLIENT_BF16, b, bytes, NULL, NULL, NULL);
  CHECK(rc == 0 && !memcmp(b, t->w, bytes), "dequant of %s after the cancel: %d %s", t->name, rc,
        nwc_client_last_error());
  free(b), free(g);
  uint64_t have = 0;
  for (int i = 0; i < 1000 && have != td_nt; i++) { /* the import goes on: wait for its end */
    nwc_client_tensor *ts;
    size_t n = 0;
    if (nwc_client_tensors(c, "use3", &ts, &n) == 0) free(ts);
    if ((have = n) != td_nt) usleep(10000);
  }
  CHECK(have == td_nt, "the cancelled import stored %llu of %zu tensors", (unsigned long long)have,
        td_nt);
}

int main(void) {
  int rc0;
  pid_t pid = td_begin("test_daemon_import", "nwc-import", NULL, &rc0);
  if (!pid) return rc0;
  nwc_client *a = NULL, *b = NULL;
  CHECK_RC(nwc_client_connect(td_sock, &a));
  CHECK_RC(nwc_client_connect(td_sock, &b));
  if (!a || !b) return 1;
  CHECK_RC(nwc_client_import(a, "use", getenv("NWC_SAMPLE"), NULL, NULL));
  during d = {.other = b, .second_rc = 1};
  nwc_client_import_opts o = {.progress = on_progress, .ctx = &d};
  int first_rc = nwc_client_import(a, "use2", getenv("NWC_SAMPLE"), &o, NULL);
  CHECK(d.checked, "no progress event came before the import finished (%d calls)", d.calls);
  CHECK((first_rc == 0) != (d.second_rc == 0) && (first_rc == -EEXIST || d.second_rc == -EEXIST),
        "two imports of one name: %d and %d, expected one success and one -EEXIST", first_rc,
        d.second_rc);
  nwc_client_model *m;
  size_t n;
  CHECK_RC(nwc_client_models(a, &m, &n));
  CHECK(n == 2 && m[0].tensors == td_nt && m[1].tensors == td_nt && !strcmp(m[1].name, "use2"),
        "after the imports: %zu models", n);
  if (n) free(m);
  CHECK(td_count_containers(NULL) == 2, "%zu files in containers/, expected one per model",
        td_count_containers(NULL));
  nwc_client_result res;
  CHECK_RC(nwc_client_verify(a, "use2", NULL, NULL, &res));
  CHECK(res.problems == 0, "verify use2: %llu problems", (unsigned long long)res.problems);
  test_cancel(a, pid);
  nwc_client_free(a);
  nwc_client_free(b);
  CHECK(td_stop_daemon(pid) == 0, "nwcd did not exit 0 after SIGTERM");
  if (test_failures) td_show_log();
  td_cleanup();
  return test_exit("test_daemon_import");
}
