/*
 * test_daemon_catalog.c - a damaged catalog is reported, never taken for an empty store, and
 * nothing the catalog does not explain is deleted unless asked.  With real nwcd and nwcctl
 * processes on a store holding the sample model:
 *   - a flipped byte in an index page of catalog.sqlite (integrity_check fails, the tables still
 *     read): `nwcctl verify` names the catalog and exits 1 (it printed "0 problems", exit 0);
 *   - catalog.sqlite deleted, then emptied (0 bytes): nwcd refuses to start, saying the store is
 *     damaged and how to recover; the container file is still there and no catalog is created
 *     (nwcd used to start empty and delete every container, logging nothing);
 *   - the same with --discard-unexplained: nwcd starts and logs each file it removed and why;
 *   - a crash leftover (.tmp) is removed at start, and logged with its reason;
 *   - catalog.sqlite is created 0640, like the rest of the store (SQLite made it 0644);
 *   - a daemon refused for its socket creates no store directory (it used to).
 */
#include "test_daemon_util.h"

#include "nwc_client.h"

#include <sqlite3.h>

static char container[256]; /* the sample's container file name, after import_sample() */



static void clear_log(void) {
  char path[400];
  snprintf(path, sizeof path, "%s/nwcd.log", td_dir);
  unlink(path);
}

/* A fresh store holding the sample as "use"; nwcd stopped afterwards. */
static void import_sample(void) {
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", td_store);
  CHECK(system(cmd) == 0, "cannot clean the store");
  pid_t d = td_start_daemon(NULL);
  CHECK(d > 0, "nwcd did not start");
  if (d <= 0) return td_show_log();
  nwc_client *c;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  CHECK_RC(nwc_client_import(c, "use", getenv("NWC_SAMPLE"), NULL, NULL));
  nwc_client_free(c);
  CHECK(td_stop_daemon(d) == 0, "nwcd did not stop cleanly");
  CHECK(td_count_containers(container) == 1, "the import left no single container");
  char db[400];
  struct stat st;
  snprintf(db, sizeof db, "%s/catalog.sqlite", td_store);
  CHECK(stat(db, &st) == 0 && (st.st_mode & 0777) == 0640, "catalog.sqlite is mode %o, not 640",
        (unsigned)(st.st_mode & 0777));
}

/* Flips one byte of a key in the first cell of an index page: the rows still read, SQLite's
 * integrity_check finds the index wrong. */
static void corrupt_index(const char *db_path) {
  sqlite3 *db;
  sqlite3_stmt *st;
  int page = 0, root = 0;
  CHECK(sqlite3_open(db_path, &db) == SQLITE_OK, "open %s", db_path);
  if (sqlite3_prepare_v2(db, "PRAGMA page_size", -1, &st, NULL) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW)
    page = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  if (sqlite3_prepare_v2(db, "SELECT rootpage FROM sqlite_master WHERE name = "
                             "'tensors_by_container'", -1, &st, NULL) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW)
    root = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  CHECK(page > 0 && root > 0, "no index page (page size %d, root %d)", page, root);
  int fd = open(db_path, O_RDWR);
  uint8_t *p = malloc((size_t)page);
  off_t at = (off_t)(root - 1) * page;
  CHECK(fd >= 0 && pread(fd, p, (size_t)page, at) == page, "read page %d", root);
  unsigned hdr = p[0] == 0x0a ? 8 : 12, cell = (unsigned)p[hdr] << 8 | p[hdr + 1];
  unsigned len = p[cell]; /* payload size: one varint byte (a short key) */
  CHECK(len < 128 && cell + len < (unsigned)page, "index cell at %u of size %u", cell, len);
  p[cell + len] ^= 0x01; /* the last byte of the key: the row id it points to */
  CHECK(pwrite(fd, p, (size_t)page, at) == page, "write page %d", root);
  close(fd);
  free(p);
}

static void test_verify_catalog(void) {
  printf("a flipped byte in the catalog's index: verify reports it\n");
  import_sample();
  char db[400];
  snprintf(db, sizeof db, "%s/catalog.sqlite", td_store);
  corrupt_index(db);
  pid_t d = td_start_daemon(NULL);
  CHECK(d > 0, "nwcd did not start on a store with a damaged index");
  if (d <= 0) return td_show_log();
  char *out = NULL, *err = NULL;
  int rc = td_nwcctl(&out, &err, (const char *[]){"--socket", td_sock, "verify", NULL});
  CHECK(rc == 1 && strstr(out, "integrity_check") && strstr(out, "catalog.sqlite") &&
            !strstr(out, " 0 problems"),
        "nwcctl verify of a damaged catalog: exit %d, stdout '%s', stderr '%s'", rc, out, err);
  free(out), free(err);
  CHECK(td_stop_daemon(d) == 0, "nwcd did not stop cleanly");
}

/* nwcd must refuse the store, saying why and how to recover, keeping the container and making
 * no catalog when there was none. */
static void check_refused(const char *what, int had_catalog) {
  clear_log();
  int st = td_daemon_refuses(td_sock, NULL);
  CHECK(st == 1, "%s: nwcd exit %d, want 1 (refused)", what, st);
  CHECK(td_log_has("damaged, not empty") && td_log_has("--discard-unexplained") &&
            td_log_has("Restore catalog.sqlite"),
        "%s: nwcd's message does not say what is wrong and how to recover", what);
  CHECK(td_count_containers(container) == 1, "%s: the container file was deleted", what);
  char db[400];
  snprintf(db, sizeof db, "%s/catalog.sqlite", td_store);
  CHECK(had_catalog || access(db, F_OK) != 0, "%s: nwcd created a catalog", what);
  if (test_failures) td_show_log();
}

static void test_lost_catalog(void) {
  printf("catalog.sqlite deleted, then emptied: nwcd refuses the store\n");
  import_sample();
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "rm -f '%s/catalog.sqlite' '%s/catalog.sqlite-wal' "
           "'%s/catalog.sqlite-shm'", td_store, td_store, td_store);
  CHECK(system(cmd) == 0, "cannot delete the catalog");
  check_refused("catalog deleted", 0);
  snprintf(cmd, sizeof cmd, "%s/catalog.sqlite", td_store);
  int fd = open(cmd, O_WRONLY | O_CREAT | O_TRUNC, 0640);
  close(fd);
  check_refused("catalog emptied", 1);

  printf("--discard-unexplained deletes them, logging each\n");
  clear_log();
  pid_t d = td_start_daemon((const char *[]){"--discard-unexplained", NULL});
  CHECK(d > 0, "nwcd --discard-unexplained did not start");
  char line[400];
  snprintf(line, sizeof line, "removed containers/%s (not explained by the catalog", container);
  CHECK(td_log_has(line), "the log does not name the discarded file: want '%s'", line);
  CHECK(td_count_containers(container) == 0, "a discarded container is still there");
  if (d > 0) CHECK(td_stop_daemon(d) == 0, "nwcd did not stop cleanly");
}

static void test_leftover_logged(void) {
  printf("a crash leftover is removed at start, and logged\n");
  import_sample();
  char path[600], line[400];
  snprintf(path, sizeof path, "%s/containers/%.16s.tmp", td_store, container);
  int fd = open(path, O_WRONLY | O_CREAT, 0640);
  CHECK(fd >= 0 && write(fd, "x", 1) == 1, "cannot make %s", path);
  close(fd);
  clear_log();
  pid_t d = td_start_daemon(NULL);
  CHECK(d > 0, "nwcd did not start");
  if (d <= 0) return td_show_log();
  snprintf(line, sizeof line, "removed containers/%.16s.tmp (an import that did not finish)",
           container);
  CHECK(td_log_has(line), "the sweep's removal is not logged: want '%s'", line);
  CHECK(access(path, F_OK) != 0, "the leftover is still there");
  nwc_client *c;
  nwc_client_result r = {0};
  CHECK_RC(nwc_client_connect(td_sock, &c));
  CHECK_RC(nwc_client_verify(c, NULL, NULL, NULL, &r));
  CHECK(r.problems == 0 && r.tensors > 0, "verify after the sweep: %llu problems",
        (unsigned long long)r.problems);
  nwc_client_free(c);
  CHECK(td_stop_daemon(d) == 0, "nwcd did not stop cleanly");
}

/* A daemon refused for its socket (a file in its place) exits 1 and creates no store. */
static void test_socket_refused(void) {
  printf("a daemon refused for its socket creates nothing\n");
  char cmd[700], notsock[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", td_store);
  CHECK(system(cmd) == 0, "cannot clean the store");
  snprintf(notsock, sizeof notsock, "%s/plain-file", td_dir);
  int fd = open(notsock, O_WRONLY | O_CREAT, 0600);
  close(fd);
  clear_log();
  int st = td_daemon_refuses(notsock, NULL);
  CHECK(st == 1 && td_log_has("is not a socket"), "nwcd on a file as its socket: exit %d", st);
  CHECK(access(td_store, F_OK) != 0, "nwcd refused for its socket created %s", td_store);
}

int main(void) {
  test_seed("test_daemon_catalog");
  int rc = td_open_sample();
  if (rc) return rc;
  if (td_mkdir("nwc-catalog") < 0) return 1;
  test_verify_catalog();
  test_lost_catalog();
  test_leftover_logged();
  test_socket_refused();
  if (!test_failures) td_cleanup();
  return test_exit("test_daemon_catalog");
}
