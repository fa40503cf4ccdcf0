/*
 * test_daemon_memory.c - nwcd's memory stays flat under requests that allocate and free large
 * buffers on many threads: with 8 worker threads it imports the sample model under a second
 * name and removes it again (a new set of encoder threads with megabyte buffers each time),
 * loads and evicts the first model whole, and dequantizes a random tensor of it (checked bit
 * for bit against the file), round after round.  nwcd's anonymous memory (VmRSS less file
 * pages: /proc/PID/status RssAnon) after 64 rounds must be within 8 MiB of what it was after 4.
 * With glibc's sliding mmap threshold each freed buffer raised the threshold and later ones
 * came from the freeing thread's arena, where they stayed: +15 to +28 MB over such 60 rounds,
 * growing without end (docs/results.md, "Soak").  Not run in sanitizer builds, whose allocator
 * is not glibc's (tests/CMakeLists.txt).
 */
#include "test_daemon_util.h"

#include "nwc_client.h"
#include "nwc_proc.h"

#define ROUNDS 64
#define WARM 4
#define SLACK_KB (8 << 10)

int main(void) {
  int rc0;
  const char *extra[] = {"--threads", "8", NULL};
  pid_t pid = td_begin("test_daemon_memory", "nwc-memory", extra, &rc0);
  if (!pid) return rc0;
  const char *sample = getenv("NWC_SAMPLE");
  nwc_client *c = NULL;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  if (!c) return 1;
  CHECK_RC(nwc_client_import(c, "use", sample, NULL, NULL));
  long warm = -1, kb = -1;
  uint16_t *b = NULL;
  for (int round = 1; round <= ROUNDS && !test_failures; round++) {
    CHECK_RC(nwc_client_import(c, "use2", sample, NULL, NULL));
    CHECK_RC(nwc_client_remove(c, "use2"));
    CHECK_RC(nwc_client_load(c, "use", NULL, NULL, NULL, NULL));
    const td_tensor *t = &td_t[test_below(td_nt)];
    size_t bytes = t->rows * t->cols * 2;
    b = realloc(b, bytes);
    int rc = nwc_client_dequant(c, "use", t->name, NWC_CLIENT_BF16, b, bytes, NULL, NULL, NULL);
    CHECK(rc == 0 && !memcmp(b, t->w, bytes), "round %d: dequant of %s: %d %s", round, t->name,
          rc, nwc_client_last_error());
    CHECK_RC(nwc_client_evict(c, "use", NULL, NULL));
    kb = nwc__proc_status_kb(pid, "RssAnon");
    CHECK(kb > 0, "no RssAnon in /proc/%d/status", (int)pid);
    if (round == WARM) warm = kb;
  }
  free(b);
  printf("nwcd RssAnon: %ld kB after %d rounds, %ld kB after %d\n", warm, WARM, kb, ROUNDS);
  CHECK(test_failures || kb - warm <= SLACK_KB,
        "nwcd's anonymous memory grew by %ld kB over %d rounds (at most %d kB allowed)",
        kb - warm, ROUNDS - WARM, SLACK_KB);
  nwc_client_free(c);
  CHECK(td_stop_daemon(pid) == 0, "nwcd did not exit 0 after SIGTERM");
  if (test_failures) td_show_log();
  td_cleanup();
  return test_exit("test_daemon_memory");
}
