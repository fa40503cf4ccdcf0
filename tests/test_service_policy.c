/*
 * test_service_policy.c - nwcd's access policy (docs/security.md) with a second uid.
 *
 * nwcd runs as root here; clients are forked children that drop to uid/gid 65534 (nobody),
 * reaching the socket through its group (chgrp 65534, mode 0660):
 *   - without the admin group: models, ps, stats, matvec work (matvec checked against the fp64
 *     reference); load, evict, pin, unpin, import and remove get -EPERM with a message, and the
 *     daemon logs each refusal with the uid;
 *   - with the admin group (admin_group in the config) as a supplementary group only
 *     (setgroups; the daemon reads it with SO_PEERGROUPS): load, pin, unpin, evict work;
 *   - root may do all of it (the test's own client).
 * Skips (77) where the test is not root or cannot switch uid.  The tensor and the x vector of
 * the matvec are drawn per run (seeded).
 */
#include "test_service_util.h"

#include <grp.h>
#include <stdbool.h>

enum { F_LIST = 1, F_MATVEC = 2, F_REFUSED = 4, F_ADMIN = 8, F_CONNECT = 16, F_SETUID = 77 };

static const td_tensor *pick;

/* The child's checks; returns a bitmask of what failed (0: all good). */
static int child_checks(const char *sample, bool admin) {
  nwc_client *c = NULL;
  if (nwc_client_connect(td_sock, &c) < 0) {
    fprintf(stderr, "uid %u: connect: %s\n", (unsigned)getuid(), nwc_client_last_error());
    return F_CONNECT;
  }
  int fail = 0;
  nwc_client_model *m = NULL;
  size_t n = 0;
  nwc_client_counters s;
  nwc_client_resident *ps = NULL;
  if (nwc_client_models(c, &m, &n) < 0 || n != 1 || nwc_client_stats(c, &s) < 0 ||
      nwc_client_ps(c, &ps, &n) < 0)
    fail |= F_LIST, fprintf(stderr, "list as uid %u: %s\n", (unsigned)getuid(), nwc_client_last_error());
  free(m), free(ps);
  float *x = malloc(pick->cols * 4), *y = malloc(pick->rows * 4);
  for (uint64_t k = 0; k < pick->cols; k++) x[k] = (float)(test_uniform() * 2 - 1);
  int rc = nwc_client_matvec(c, "use", pick->name, NULL, 0.5f, x, pick->cols, 1, 0, y,
                             pick->rows * 4, NULL);
  if (rc < 0 || td_matvec_err(pick, x, 0.5, NULL, y) > 1e-3)
    fail |= F_MATVEC, fprintf(stderr, "matvec as uid %u: %d %s\n", (unsigned)getuid(), rc,
                              nwc_client_last_error());
  free(x), free(y);
  nwc_client_result res;
  int r[6];
  r[0] = nwc_client_load(c, "use", pick->name, NULL, NULL, &res);
  r[1] = nwc_client_pin(c, "use", pick->name, &res);
  r[2] = nwc_client_unpin(c, "use", pick->name, &res);
  r[3] = nwc_client_evict(c, "use", pick->name, &res);
  if (!admin) {
    r[4] = nwc_client_import(c, "copy", sample, NULL, &res);
    r[5] = nwc_client_remove(c, "use");
    for (int i = 0; i < 6; i++)
      if (r[i] != -EPERM || !strstr(nwc_client_last_error(), "needs root"))
        fail |= F_REFUSED, fprintf(stderr, "admin op %d as uid %u: %d, expected -EPERM\n", i,
                                   (unsigned)getuid(), r[i]);
  } else {
    for (int i = 0; i < 4; i++)
      if (r[i] != 0)
        fail |= F_ADMIN, fprintf(stderr, "admin op %d as uid %u in the admin group: %d %s\n", i,
                                 (unsigned)getuid(), r[i], nwc_client_last_error());
  }
  nwc_client_free(c);
  return fail;
}

/* Runs child_checks as uid/gid 65534 with the given supplementary groups. */
static int as_nobody(const char *sample, const gid_t *groups, size_t ngroups, bool admin) {
  fflush(NULL);
  pid_t k = fork();
  if (k == 0) {
    if (setgroups(ngroups, groups) < 0 || setgid(65534) < 0 || setuid(65534) < 0) _exit(F_SETUID);
    _exit(child_checks(sample, admin));
  }
  int st;
  waitpid(k, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 255;
}

int main(void) {
  test_seed("test_service_policy");
  if (geteuid() != 0) {
    printf("not root: cannot run a client as a second uid; skipped\n");
    return TEST_SKIP;
  }
  if (td_mkdir("nwc-svc-policy") < 0) return 1;
  int rc = ts_import_sample();
  if (rc) {
    td_cleanup();
    return rc;
  }
  /* The admin group: an existing group other than root's and nobody's (users, staff, ...). */
  const struct group *g = NULL;
  static const char *names[] = {"users", "staff", "adm", "daemon", "bin", "sys"};
  for (size_t i = 0; i < sizeof names / sizeof *names && !g; i++) {
    g = getgrnam(names[i]);
    if (g && (g->gr_gid == 0 || g->gr_gid == 65534)) g = NULL;
  }
  if (!g) {
    printf("no group to use as the admin group; skipped\n");
    td_cleanup();
    return TEST_SKIP;
  }
  gid_t admin_gid = g->gr_gid;
  char admin_name[64];
  snprintf(admin_name, sizeof admin_name, "%s", g->gr_name);
  for (size_t i = 0; i < td_nt; i++)
    if (td_t[i].rows > 1 && td_t[i].rows * td_t[i].cols < (1u << 20) && (!pick || test_below(2)))
      pick = &td_t[i];
  CHECK(pick != NULL, "a tensor for matvec");
  /* A copy of the sample the second uid can open (the cache may sit under /root). */
  char sample[700], cmd[1600];
  snprintf(sample, sizeof sample, "%s/sample.safetensors", td_dir);
  snprintf(cmd, sizeof cmd, "cp '%s' '%s' && chmod 0644 '%s'", getenv("NWC_SAMPLE"), sample, sample);
  CHECK(system(cmd) == 0, "copy the sample");
  char conf[700];
  ts_write(conf, "nwcd.conf", "[daemon]\nadmin_group = %s\n", admin_name);
  pid_t d = td_start_daemon((const char *[]){"--config", conf, NULL});
  CHECK(d > 0, "start");
  if (d < 0 || !pick) {
    td_show_log();
    td_cleanup();
    return 1;
  }
  CHECK(chmod(td_dir, 0755) == 0 && chown(td_sock, 0, 65534) == 0, "socket group 65534");
  printf("admin group %s (gid %u), matvec on %s\n", admin_name, (unsigned)admin_gid, pick->name);

  int f = as_nobody(sample, NULL, 0, false);
  if (f == F_SETUID) {
    printf("cannot switch to uid 65534 here; skipped\n");
    td_stop_daemon(d);
    td_cleanup();
    return TEST_SKIP;
  }
  CHECK(f == 0, "uid 65534 without the admin group: failures 0x%x", f);
  CHECK(ts_log_wait("refused load use/", 10000) && ts_log_wait("for uid 65534", 100),
        "refusals not logged with the uid");
  /* libnwc-client imports with import2 where the daemon has it. */
  CHECK(ts_log_wait("refused import2 copy", 100), "refused import not logged");
  f = as_nobody(sample, &admin_gid, 1, true);
  CHECK(f == 0, "uid 65534 with supplementary group %u: failures 0x%x", (unsigned)admin_gid, f);

  nwc_client *c = NULL;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  nwc_client_result res;
  CHECK_RC(nwc_client_load(c, "use", NULL, NULL, NULL, &res));
  CHECK_RC(nwc_client_evict(c, "use", NULL, &res));
  nwc_client_free(c);
  CHECK(td_stop_daemon(d) == 0, "SIGTERM exit");
  if (test_failures) td_show_log();
  td_cleanup();
  return test_exit("test_service_policy");
}
