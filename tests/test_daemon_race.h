/*
 * test_daemon_race.h - a model "big" of three matrices, one far larger than the others, and two
 * processes racing on it through a real nwcd (the daemon tests of host and GPU loads share it):
 * whole-model loads, evicts and dequants, checked bit for bit against the original weights, in
 * random order in this process and a forked one at once.  Loads of a whole model run in lanes
 * that help with each other's tensors, so tensors become resident, are used and are evicted
 * while other lanes still write them (the GPU's queued loads: their last copies still on the
 * way).
 */
#ifndef NWC_TEST_DAEMON_RACE_H
#define NWC_TEST_DAEMON_RACE_H

#include "nwc_client.h"
#include "test_daemon_util.h"
#include "test_store_util.h" /* st_write_matrices */

#include <time.h>

static const char *const td_big_names[3] = {"big.w", "big.v", "big.u"};

/* Imports model "big" into c's daemon: td_big_names[m] of rows[m] x K BF16 weights (w[m],
 * malloc'ed: the caller frees them), through a safetensors file in td_dir removed afterwards. */
static void td_import_big(nwc_client *c, const uint64_t *rows, uint64_t K, uint16_t **w) {
  char path[600];
  snprintf(path, sizeof path, "%s/big.safetensors", td_dir);
  CHECK_RC(st_write_matrices(path, td_big_names, rows, K, 3, w));
  CHECK_RC(nwc_client_import(c, "big", path, NULL, NULL));
  unlink(path);
}

/* One client's share for about seconds: whole-model loads and evicts of "big", single-tensor
 * evicts and dequants, in random order; every dequant bit for bit, every load and model evict
 * succeeds (what is being loaded or used is skipped), a single evict succeeds or is refused as
 * busy.  Returns the failures. */
static int td_race_ops(nwc_client *c, const char *const *names, const uint64_t *rows,
                       uint64_t K, uint16_t *const *w, int seconds) {
  time_t t_end = time(NULL) + seconds;
  uint16_t *got = malloc(rows[0] * K * 2);
  unsigned long ops[4] = {0};
  while (time(NULL) < t_end && test_failures < 5) {
    int op = (int)test_below(4), m = (int)test_below(3);
    ops[op]++;
    if (op == 0) {
      CHECK_RC(nwc_client_load(c, "big", NULL, NULL, NULL, NULL));
    } else if (op == 1) {
      CHECK_RC(nwc_client_evict(c, "big", NULL, NULL));
    } else if (op == 2) {
      int rc = nwc_client_evict(c, "big", names[m], NULL);
      CHECK(rc == 0 || rc == -EBUSY, "evict %s during the others' loads: %d %s", names[m], rc,
            nwc_client_last_error());
    } else {
      int rc = nwc_client_dequant(c, "big", names[m], NWC_CLIENT_BF16, got, rows[m] * K * 2,
                                  NULL, NULL, NULL);
      CHECK(rc == 0 && !memcmp(got, w[m], rows[m] * K * 2), "dequant %s during the others' "
            "loads: %d %s", names[m], rc, rc ? nwc_client_last_error() : "not the weights");
    }
  }
  free(got);
  printf("races, pid %d: %lu model loads, %lu model evicts, %lu tensor evicts, %lu dequants\n",
         (int)getpid(), ops[0], ops[1], ops[2], ops[3]);
  return test_failures;
}

/* Two seconds of td_race_ops in this process and a forked one (its seed printed under
 * test's name) on c's daemon; checks the other process's result. */
static void td_crew_races(nwc_client *c, const char *test, const char *const *names,
                          const uint64_t *rows, uint64_t K, uint16_t *const *w) {
  pid_t kid = fork();
  if (kid == 0) {
    nwc_client *k = NULL;
    char name[128];
    snprintf(name, sizeof name, "%s: the racing child", test);
    test_seed(name);
    int bad = nwc_client_connect(td_sock, &k) < 0 || td_race_ops(k, names, rows, K, w, 2) != 0;
    fflush(NULL);
    _exit(bad);
  }
  td_race_ops(c, names, rows, K, w, 2);
  int st = 0;
  CHECK(kid > 0 && waitpid(kid, &st, 0) == kid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
        "the racing client failed (status 0x%x)", st);
}

#endif
