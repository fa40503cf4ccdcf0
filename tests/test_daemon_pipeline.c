/*
 * test_daemon_pipeline.c - pipelining in libnwc-client against a real nwcd (2 workers):
 *
 *   - 400 random matvecs (1 to 4 columns, any 2-D tensor, scale and bias sometimes) and gathers
 *     on one connection with up to 64 in flight, collected in random order (nwc_client_wait on a
 *     random outstanding ticket, or nwc_client_wait_any); every output is checked against an
 *     fp64 matvec of the original weights or against the original BF16 bits;
 *   - synchronous calls mixed in while tickets are outstanding;
 *   - daemon-side errors in the middle of a pipeline (unknown tensor, x of the wrong length, a
 *     row out of range): only that ticket fails, with the daemon's message; the rest are right;
 *   - replies complete out of order: a slow matvec submitted before a tiny one finishes after it;
 *   - the library's own limits (-EBUSY at 64 outstanding tickets, -ENOENT for unknown tickets,
 *     -E2BIG for an output larger than a frame);
 *   - back-pressure: the same pipeline against a daemon whose config allows 2 requests in
 *     flight per connection still completes (the workers wake the paused connection);
 *   - threads: tickets submitted on one thread are collected on another while the first makes
 *     synchronous calls on the same client;
 *   - SIGTERM with tickets in flight: every ticket either completes right or fails with a
 *     connection error, never hangs, and nwcd exits 0.
 */
#include "test_daemon_util.h"

#include "nwc_client.h"

#include <pthread.h>
#include <stdbool.h>

#define MAXQ 64

typedef struct job {
  uint64_t ticket;
  int kind;          /* 0 matvec, 1 gather, 2 matvec that must fail, 3 gather that must fail */
  const td_tensor *t;
  const td_tensor *bias;
  unsigned ncols;
  float scale;
  float *x;
  uint64_t rows[8];
  size_t nrows;
  void *out;
  int want; /* the errno a failing job must get */
} job;

static const td_tensor *mats[64];
static size_t nmats;

static const td_tensor *bias_for(const td_tensor *t) {
  for (size_t i = 0; i < td_nt; i++)
    if (td_t[i].rows == 1 && td_t[i].cols == t->rows && test_below(2)) return &td_t[i];
  return NULL;
}

static void make_job(job *j, int kind) {
  memset(j, 0, sizeof *j);
  j->kind = kind;
  j->t = mats[test_below(nmats)];
  if (kind == 0 || kind == 2) {
    j->ncols = 1 + (unsigned)test_below(4);
    j->scale = test_below(3) ? 1.0f : (float)(test_uniform() * 2);
    j->bias = kind == 0 ? bias_for(j->t) : NULL;
    j->x = malloc(j->ncols * j->t->cols * 4);
    for (size_t k = 0; k < j->ncols * j->t->cols; k++) j->x[k] = (float)(test_uniform() * 2 - 1);
    j->out = malloc(j->ncols * j->t->rows * 4);
  } else {
    j->nrows = 1 + test_below(8);
    for (size_t k = 0; k < j->nrows; k++) j->rows[k] = test_below(j->t->rows);
    if (kind == 3) j->rows[test_below(j->nrows)] = j->t->rows + test_below(5);
    j->out = malloc(j->nrows * j->t->cols * 4);
  }
}

static int submit(nwc_client *c, job *j) {
  if (j->kind == 0)
    return nwc_client_submit_matvec(c, "use", j->t->name, j->bias ? j->bias->name : NULL, j->scale,
                                    j->x, j->t->cols, j->ncols, 0, j->out,
                                    j->ncols * j->t->rows * 4, &j->ticket);
  if (j->kind == 2) { /* wrong: an unknown tensor, or x one float short */
    bool unknown = test_below(2);
    j->want = unknown ? -ENOENT : -EINVAL;
    return nwc_client_submit_matvec(c, "use", unknown ? "no/such/tensor" : j->t->name, NULL, 1.0f,
                                    j->x, j->t->cols - (unknown ? 0 : 1), j->ncols, 0, j->out,
                                    j->ncols * j->t->rows * 4, &j->ticket);
  }
  j->want = -EINVAL;
  return nwc_client_submit_gather(c, "use", j->t->name, j->rows, j->nrows, 0, j->out,
                                  j->nrows * j->t->cols * 4, &j->ticket);
}

/* Checks job j's outcome rc (its ticket collected). */
static void check(const job *j, int rc) {
  if (j->kind >= 2) {
    CHECK(rc == j->want, "bad request on %s: got %d, want %d (%s)", j->t->name, rc, j->want,
          nwc_client_last_error());
    CHECK(rc >= 0 || strlen(nwc_client_last_error()) > 0, "no message for a failed ticket");
    if (rc == -ENOENT)
      CHECK(strstr(nwc_client_last_error(), "no/such/tensor") != NULL, "message: %s",
            nwc_client_last_error());
    if (rc == -EINVAL)
      CHECK(strstr(nwc_client_last_error(), j->kind == 2 ? "x of" : "out of range") != NULL,
            "message: %s", nwc_client_last_error());
    return;
  }
  CHECK(rc == 0, "ticket on %s: %d %s", j->t->name, rc, nwc_client_last_error());
  if (rc) return;
  const float *f = j->out;
  if (j->kind == 0) {
    for (unsigned col = 0; col < j->ncols; col++) {
      double e = td_matvec_err(j->t, j->x + col * j->t->cols, j->scale, j->bias,
                               f + col * j->t->rows);
      CHECK(e <= 1e-5, "pipelined matvec %s col %u/%u: error %.3g", j->t->name, col, j->ncols, e);
    }
    return;
  }
  for (size_t k = 0; k < j->nrows; k++)
    for (uint64_t i = 0; i < j->t->cols; i++)
      if (f[k * j->t->cols + i] != nwc_bf16_to_f32(td_w(j->t, j->rows[k] * j->t->cols + i))) {
        CHECK(0, "pipelined gather %s row %llu col %llu", j->t->name,
              (unsigned long long)j->rows[k], (unsigned long long)i);
        return;
      }
}

static void free_job(job *j) {
  free(j->x), free(j->out);
  j->x = NULL, j->out = NULL;
}

/* Collects one outstanding job of q[0 .. *n) (random choice of wait or wait_any). */
static void collect_one(nwc_client *c, job *q, size_t *n) {
  size_t i;
  int rc;
  if (test_below(2)) {
    i = test_below(*n);
    rc = nwc_client_wait(c, q[i].ticket, NULL);
  } else {
    uint64_t t = 0;
    rc = nwc_client_wait_any(c, &t, NULL);
    for (i = 0; i < *n && q[i].ticket != t; i++) {
    }
    CHECK(i < *n, "wait_any returned ticket %llu, not outstanding", (unsigned long long)t);
    if (i == *n) return;
  }
  check(&q[i], rc);
  free_job(&q[i]);
  q[i] = q[--*n];
}

/* count requests through one connection, errors mixed in, up to MAXQ in flight. */
static void pipeline(nwc_client *c, int count, int with_errors) {
  job q[MAXQ];
  size_t n = 0;
  for (int k = 0; k < count; k++) {
    if (n == MAXQ || (n && test_below(4) == 0)) collect_one(c, q, &n);
    int kind = test_below(5) ? 0 : 1;
    if (with_errors && test_below(12) == 0) kind += 2;
    make_job(&q[n], kind);
    int rc = submit(c, &q[n]);
    CHECK(rc == 0, "submit: %d %s", rc, nwc_client_last_error());
    if (rc) {
      free_job(&q[n]);
      break;
    }
    n++;
    if (test_below(40) == 0) { /* a synchronous call while tickets are outstanding */
      nwc_client_counters s;
      CHECK(nwc_client_stats(c, &s) == 0 && s.requests > 0, "stats amid tickets: %s",
            nwc_client_last_error());
    }
  }
  while (n) collect_one(c, q, &n);
}

static void limits(nwc_client *c) {
  CHECK(nwc_client_wait(c, 12345678, NULL) == -ENOENT, "wait on an unknown ticket");
  uint64_t t = 0;
  CHECK(nwc_client_wait_any(c, &t, NULL) == -ENOENT, "wait_any with nothing outstanding");
  const td_tensor *m = mats[0];
  float *x = calloc(m->cols, 4), *y = malloc(m->rows * 4);
  uint64_t tk[MAXQ + 1];
  int n = 0;
  for (; n < MAXQ; n++)
    if (nwc_client_submit_matvec(c, "use", m->name, NULL, 1.0f, x, m->cols, 1, 0, y, m->rows * 4,
                                 &tk[n]) < 0)
      break;
  CHECK(n == MAXQ, "only %d tickets accepted", n);
  int rc = nwc_client_submit_matvec(c, "use", m->name, NULL, 1.0f, x, m->cols, 1, 0, y,
                                    m->rows * 4, &tk[MAXQ]);
  CHECK(rc == -EBUSY, "ticket %d past the limit: %d", MAXQ + 1, rc);
  for (int i = n - 1; i >= 0; i--) CHECK(nwc_client_wait(c, tk[i], NULL) == 0, "wait %d", i);
  CHECK(nwc_client_wait(c, tk[0], NULL) == -ENOENT, "a ticket collected twice");
  rc = nwc_client_submit_matvec(c, "use", m->name, NULL, 1.0f, x, m->cols, 1, 0, y,
                                (size_t)32 << 20, &t);
  CHECK(rc == -E2BIG, "an output larger than a frame: %d", rc);
  free(x), free(y);
}

/* A slow request (64 columns on the largest matrix) submitted first, a tiny one after it: with two
 * workers the tiny one completes first (tried a few times: the machine may be busy). */
static void out_of_order(nwc_client *c) {
  const td_tensor *big = mats[0], *small = mats[0];
  for (size_t i = 0; i < nmats; i++) {
    if (mats[i]->rows * mats[i]->cols > big->rows * big->cols) big = mats[i];
    if (mats[i]->rows * mats[i]->cols < small->rows * small->cols) small = mats[i];
  }
  unsigned nc = 64;
  float *xb = malloc(nc * big->cols * 4), *yb = malloc(nc * big->rows * 4);
  float *xs = malloc(small->cols * 4), *ys = malloc(small->rows * 4);
  for (size_t k = 0; k < nc * big->cols; k++) xb[k] = (float)(test_uniform() - 0.5);
  for (size_t k = 0; k < small->cols; k++) xs[k] = (float)(test_uniform() - 0.5);
  int first_small = 0;
  for (int rep = 0; rep < 5 && !first_small; rep++) {
    uint64_t tb, ts, t1 = 0, t2 = 0;
    CHECK_RC(nwc_client_submit_matvec(c, "use", big->name, NULL, 1.0f, xb, big->cols, nc, 0, yb,
                                      nc * big->rows * 4, &tb));
    CHECK_RC(nwc_client_submit_matvec(c, "use", small->name, NULL, 1.0f, xs, small->cols, 1, 0,
                                      ys, small->rows * 4, &ts));
    CHECK(nwc_client_wait_any(c, &t1, NULL) == 0 && nwc_client_wait_any(c, &t2, NULL) == 0,
          "out-of-order pair: %s", nwc_client_last_error());
    first_small = t1 == ts;
    CHECK(td_matvec_err(small, xs, 1.0, NULL, ys) <= 1e-5, "small matvec wrong");
    for (unsigned col = 0; col < nc; col += 21)
      CHECK(td_matvec_err(big, xb + col * big->cols, 1.0, NULL, yb + col * big->rows) <= 1e-5,
            "big matvec col %u wrong", col);
  }
  printf("out of order: %s (%s %llu x %llu x 64 columns, then %s %llu x %llu)\n",
         first_small ? "the tiny matvec completed first" : "never seen", big->name,
         (unsigned long long)big->rows, (unsigned long long)big->cols, small->name,
         (unsigned long long)small->rows, (unsigned long long)small->cols);
  CHECK(first_small, "replies never completed out of order in 5 tries");
  free(xb), free(yb), free(xs), free(ys);
}

typedef struct collector {
  nwc_client *c;
  job *q;
  size_t n;
  int rcs[32];
} collector;

static void *collect_all(void *arg) {
  collector *k = arg;
  for (size_t i = 0; i < k->n; i++) k->rcs[i] = nwc_client_wait(k->c, k->q[i].ticket, NULL);
  return NULL;
}

static void threads(nwc_client *c) {
  job q[32];
  size_t n = 0;
  for (; n < 32; n++) {
    make_job(&q[n], test_below(4) ? 0 : 1);
    if (submit(c, &q[n]) < 0) break;
  }
  CHECK(n == 32, "submit for the collector thread: %s", nwc_client_last_error());
  collector k = {c, q, n, {0}};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, collect_all, &k) == 0, "pthread_create");
  for (int i = 0; i < 20; i++) {
    nwc_client_model *m;
    size_t nm;
    int rc = nwc_client_models(c, &m, &nm);
    CHECK(rc == 0 && nm == 1, "models while another thread waits: %d", rc);
    if (rc == 0) free(m);
  }
  pthread_join(th, NULL);
  for (size_t i = 0; i < n; i++) check(&q[i], k.rcs[i]), free_job(&q[i]);
  printf("threads: %zu tickets collected on a second thread during 20 synchronous calls\n", n);
}

/* SIGTERM while tickets are in flight. */
static void stop_with_tickets(nwc_client *c, pid_t d) {
  job q[32];
  size_t n = 0;
  for (; n < 32; n++) {
    make_job(&q[n], 0);
    if (submit(c, &q[n]) < 0) break;
  }
  kill(d, SIGTERM);
  int ok = 0, lost = 0;
  for (size_t i = 0; i < n; i++) {
    int rc = nwc_client_wait(c, q[i].ticket, NULL);
    if (rc == 0) ok++, check(&q[i], rc);
    else if (rc == -ECONNRESET || rc == -ENOTCONN || rc == -EPIPE) lost++;
    else CHECK(0, "ticket during shutdown: %d %s", rc, nwc_client_last_error());
    free_job(&q[i]);
  }
  printf("SIGTERM with %zu tickets in flight: %d completed, %d lost with the connection\n", n, ok,
         lost);
  CHECK(td_wait_exit(d, 3000) == 0, "nwcd exit status after SIGTERM");
}

int main(void) {
  int rc0;
  pid_t d = td_begin("test_daemon_pipeline", "nwc-pipeline", NULL, &rc0);
  if (!d) return rc0;
  for (size_t i = 0; i < td_nt && nmats < 64; i++)
    if (td_t[i].rows >= 2 && td_t[i].cols >= 2) mats[nmats++] = &td_t[i];
  nwc_client *c;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  CHECK_RC(nwc_client_import(c, "use", getenv("NWC_SAMPLE"), NULL, NULL));
  pipeline(c, 400, 1);
  limits(c);
  out_of_order(c);
  threads(c);
  nwc_client_free(c);
  CHECK(td_stop_daemon(d) == 0, "SIGTERM exit");

  /* Back-pressure: 2 requests in flight per connection. */
  char conf[700];
  snprintf(conf, sizeof conf, "%s/nwcd.conf", td_dir);
  FILE *f = fopen(conf, "w");
  fprintf(f, "[limits]\nmax_inflight = 2\n");
  fclose(f);
  d = td_start_daemon((const char *[]){"--config", conf, NULL});
  CHECK(d > 0, "nwcd with max_inflight 2 did not start");
  if (d <= 0) return td_show_log(), 1;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  pipeline(c, 200, 0);
  printf("max_inflight 2: a pipeline of 200 completed\n");
  stop_with_tickets(c, d);
  nwc_client_free(c);
  if (test_failures) td_show_log();
  td_cleanup();
  return test_exit("test_daemon_pipeline");
}
