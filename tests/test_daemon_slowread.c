/*
 * test_daemon_slowread.c - clients that never read their replies cannot grow nwcd's memory or
 * slow anyone else.  Real processes on a real socket: with max_outq 8 MiB per connection and
 * max_outq_uid 24 MiB, four client processes each pipeline 32 float32 dequants of the sample's
 * largest tensor (8 MB a reply: 1 GB of replies) and then read nothing.  While they stall,
 * nwcd's resident memory (VmRSS, sampled) grows by less than 160 MB (it used to queue every
 * reply), and a listing from another connection of the same uid answers within a second (it
 * used to wait behind the stalled dequants).  Then the stalled clients read: each gets its 32
 * replies, complete, each once, and nwcd stops cleanly.
 */
#include "test_daemon_util.h"

#include "nwc_client.h"
#include "nwc_proc.h"

#define CLIENTS 4
#define PIPELINED 32
/* Sanitizer runtimes keep shadow memory beside what nwcd allocates, and run several times
 * slower: the bounds and the waits are scaled for them (the plain build is the one that
 * measures; under ThreadSanitizer, beside other tests on two cores, 1 GB of float32 replies took
 * more than 30 s to reach a client). */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define SLACK 4
#else
#define SLACK 1
#endif

/* A stalled client: pipelines the dequants, waits for a byte on go, then reads every reply and
 * exits 0 when each came back whole, once. */
static int stalled_client(const td_tensor *big, int go) {
  int fd = td_raw_hello(td_sock);
  if (fd < 0) return 2;
  uint8_t buf[4096];
  for (int i = 0; i < PIPELINED; i++) {
    nwc_proto_req dq = {.op = NWC_OP_DEQUANT, .out = NWC_OUT_F32, .id = 100 + (uint64_t)i};
    strcpy(dq.model, "use"), strcpy(dq.tensor, big->name);
    nwc_pw w;
    nwc_pw_init(&w);
    int64_t n = nwc_proto_req_encode(&dq, &w);
    if (n <= 0 || (size_t)n > sizeof buf) return 3;
    memcpy(buf, w.buf, (size_t)n);
    nwc_pw_free(&w);
    if (td_send(fd, buf, (size_t)n) < 0) return 4;
  }
  char b;
  if (read(go, &b, 1) != 1) return 5;
  uint8_t seen[PIPELINED] = {0};
  for (int i = 0; i < PIPELINED; i++) {
    nwc_proto_hdr h;
    uint8_t *p = NULL;
    if (td_recv_frame(fd, &h, &p, 30000 * SLACK) < 0) return 6;
    free(p);
    if (h.status != 0) return 7;
    if (h.id < 100 || h.id >= 100 + PIPELINED || seen[h.id - 100]++) return 8;
    if (h.length < big->rows * big->cols * 4) return 9;
  }
  close(fd);
  return 0;
}

int main(void) {
  test_seed("test_daemon_slowread");
  int rc = td_open_sample();
  if (rc) return rc;
  if (td_mkdir("nwc-slowread") < 0) return 1;
  char conf[400];
  snprintf(conf, sizeof conf, "%s/nwcd.conf", td_dir);
  FILE *f = fopen(conf, "w");
  fprintf(f, "[limits]\nmax_outq = 8M\nmax_outq_uid = 24M\n");
  fclose(f);
  pid_t d = td_start_daemon((const char *[]){"--config", conf, NULL});
  CHECK(d > 0, "nwcd did not start");
  if (d <= 0) return td_show_log(), 1;
  const td_tensor *big = &td_t[0];
  for (size_t i = 0; i < td_nt; i++)
    if (td_t[i].rows * td_t[i].cols > big->rows * big->cols) big = &td_t[i];
  nwc_client *c;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  CHECK_RC(nwc_client_import(c, "use", getenv("NWC_SAMPLE"), NULL, NULL));
  size_t bytes = big->rows * big->cols * 4;
  float *y = malloc(bytes);
  CHECK_RC(nwc_client_dequant(c, "use", big->name, 0, y, bytes, NULL, NULL, NULL));
  long base = nwc__proc_status_kb(d, "VmRSS");
  printf("%s: %llu x %llu, %zu bytes a reply; nwcd VmRSS %ld kB before\n", big->name,
         (unsigned long long)big->rows, (unsigned long long)big->cols, bytes, base);

  int go[2];
  CHECK(pipe(go) == 0, "pipe");
  pid_t kids[CLIENTS];
  for (int k = 0; k < CLIENTS; k++) {
    kids[k] = fork();
    if (kids[k] == 0) _exit(stalled_client(big, go[0]));
  }
  long peak = base;
  double worst_ls = 0;
  for (int i = 0; i < 30; i++) { /* 3 s of stalled clients */
    usleep(100000);
    long r = nwc__proc_status_kb(d, "VmRSS");
    if (r > peak) peak = r;
    if (i % 5 == 4) {
      struct timespec t0, t1;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      nwc_client_model *m = NULL;
      size_t n = 0;
      CHECK_RC(nwc_client_models(c, &m, &n));
      free(m);
      clock_gettime(CLOCK_MONOTONIC, &t1);
      double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
      if (s > worst_ls) worst_ls = s;
    }
  }
  printf("while %d clients stall with %d dequants each: VmRSS peak %ld kB (+%ld MB), slowest "
         "listing %.3f s\n", CLIENTS, PIPELINED, peak, (peak - base) / 1024, worst_ls);
  CHECK(peak - base < SLACK * 160 * 1024, "nwcd grew by %ld MB for clients that do not read",
        (peak - base) / 1024);
  CHECK(worst_ls < SLACK * 1.0, "a listing took %.3f s while others stalled", worst_ls);
  CHECK(write(go[1], "gggg", CLIENTS) == CLIENTS, "cannot release the clients");
  for (int k = 0; k < CLIENTS; k++) {
    int st = td_wait_exit(kids[k], 6000 * SLACK);
    CHECK(st == 0, "stalled client %d: exit %d (0: every reply came whole, once)", k, st);
  }
  CHECK_RC(nwc_client_dequant(c, "use", big->name, 0, y, bytes, NULL, NULL, NULL));
  free(y);
  nwc_client_free(c);
  CHECK(td_stop_daemon(d) == 0, "nwcd did not stop cleanly");
  if (test_failures) td_show_log();
  else td_cleanup();
  return test_exit("test_daemon_slowread");
}
