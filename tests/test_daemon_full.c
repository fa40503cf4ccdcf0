/*
 * test_daemon_full.c - a full disk is named, and loses nothing.  In a private mount namespace
 * (root only; skipped elsewhere), the store lives on a 20 MiB tmpfs.  nwcd imports the sample,
 * then the rest of the file system is filled: a second import fails, and both nwcctl's message
 * and nwcd's log say "no space left on device" and where (the catalog, or with 1 MiB free the
 * container being written); nothing of it is left.
 * nwcd stopped and started on the still-full file system either serves the first model or
 * refuses with "no space left on device" (it used to say only "disk I/O error").  Once space is
 * freed, the first model verifies and the second import succeeds.
 */
#include "test_daemon_util.h"

#include "nwc_client.h"

#include <sched.h>
#include <sys/mount.h>



/* Fills the file system holding path with one file (grown from its end) until ENOSPC. */
static void fill(const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0600);
  static char block[65536];
  while (fd >= 0 && write(fd, block, sizeof block) > 0) {
  }
  while (fd >= 0 && write(fd, block, 512) > 0) {
  }
  if (fd >= 0) close(fd);
}

int main(void) {
  test_seed("test_daemon_full");
  int rc = td_open_sample();
  if (rc) return rc;
  if (td_mkdir("nwc-full") < 0) return 1;
  char fs[280], filler[300];
  snprintf(fs, sizeof fs, "%.270s/fs", td_dir);
  mkdir(fs, 0700);
  if (geteuid() != 0 || unshare(CLONE_NEWNS) < 0 ||
      mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
      mount("tmpfs", fs, "tmpfs", 0, "size=20m,mode=0700") < 0) {
    printf("no private tmpfs here (needs root): skipped\n");
    td_cleanup();
    return TEST_SKIP;
  }
  snprintf(td_store, sizeof td_store, "%.280s/store", fs);
  snprintf(filler, sizeof filler, "%s/filler", fs);
  pid_t d = td_start_daemon(NULL);
  CHECK(d > 0, "nwcd did not start");
  if (d <= 0) return td_show_log(), 1;
  const char *sample = getenv("NWC_SAMPLE");
  char *out = NULL, *err = NULL;
  int st = td_nwcctl(&out, &err, (const char *[]){"--socket", td_sock, "import", "use", sample,
                                                  NULL});
  CHECK(st == 0, "first import: exit %d: %s", st, err);
  free(out), free(err);
  fill(filler);
  st = td_nwcctl(&out, &err, (const char *[]){"--socket", td_sock, "import", "use2", sample,
                                              NULL});
  printf("import on a full disk: exit %d: %s", st, err);
  CHECK(st != 0 && strcasestr(err, "no space left on device") && strstr(err, td_store),
        "nwcctl's message does not name the full disk and where: '%s'", err);
  free(out), free(err);
  CHECK(td_log_has("import of use2 failed") && td_log_has("no space left on device"),
        "nwcd logged nothing naming the full disk for the failed import");
  CHECK(td_count_containers(NULL) == 1, "the failed import left %zu container files",
        td_count_containers(NULL));
  /* 1 MiB free: the catalog takes its id, the container file fills the disk. */
  struct stat fst;
  CHECK(stat(filler, &fst) == 0 && truncate(filler, fst.st_size - (1 << 20)) == 0, "truncate");
  st = td_nwcctl(&out, &err, (const char *[]){"--socket", td_sock, "import", "use2", sample,
                                              NULL});
  printf("import with 1 MiB free: exit %d: %s", st, err);
  CHECK(st != 0 && strcasestr(err, "no space left on device") && strstr(err, "containers"),
        "nwcctl's message does not name the full disk and the containers: '%s'", err);
  free(out), free(err);
  CHECK(td_count_containers(NULL) == 1, "the failed import left %zu container files",
        td_count_containers(NULL));
  fill(filler);
  CHECK(td_stop_daemon(d) == 0, "nwcd did not stop cleanly");

  /* Restart on the full file system. */
  int status = 0;
  d = td_start_daemon_at(td_sock, NULL, &status);
  if (d > 0) {
    printf("restart on a full disk: nwcd serves\n");
    nwc_client *c;
    CHECK_RC(nwc_client_connect(td_sock, &c));
    nwc_client_model *m = NULL;
    size_t n = 0;
    CHECK_RC(nwc_client_models(c, &m, &n));
    CHECK(n == 1, "%zu models after the restart", n);
    free(m);
    nwc_client_free(c);
    CHECK(td_stop_daemon(d) == 0, "nwcd did not stop cleanly");
  } else {
    printf("restart on a full disk: nwcd refused (exit %d)\n", WEXITSTATUS(status));
    CHECK(td_log_has("no space left on device"), "nwcd refused a full disk without naming it");
  }

  unlink(filler);
  d = td_start_daemon(NULL);
  CHECK(d > 0, "nwcd did not start with space again");
  if (d <= 0) return td_show_log(), 1;
  nwc_client *c;
  nwc_client_result r = {0};
  CHECK_RC(nwc_client_connect(td_sock, &c));
  CHECK_RC(nwc_client_verify(c, NULL, NULL, NULL, &r));
  CHECK(r.problems == 0 && r.tensors > 0, "verify: %llu problems", (unsigned long long)r.problems);
  CHECK_RC(nwc_client_import(c, "use2", sample, NULL, NULL));
  nwc_client_free(c);
  CHECK(td_stop_daemon(d) == 0, "nwcd did not stop cleanly");
  if (test_failures) td_show_log();
  umount(fs);
  td_cleanup();
  return test_exit("test_daemon_full");
}
