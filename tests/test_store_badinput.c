/*
 * test_store_badinput.c - every kind of bad input of issue 4 item 5, each in its own case: the
 * import fails with the expected errno, the detail line names the file and (where there is one)
 * the tensor, and the store is unchanged: no model, no file in containers/.  A store under a
 * missing parent directory is refused with ENOENT and says that parents are not made; one that
 * cannot be opened (a lock that is a directory, a catalog that is not a database, root's store
 * opened by uid 65534) says why, once.
 */
#include "test_store_util.h"

#include <grp.h>
#include <sys/wait.h>

static char dir[512], src[512];
static nwc_store *s;

/* A file made of an explicit header text and n data bytes (all 0x11). */
static void raw_file(const char *path, const char *header, uint64_t hlen_override, size_t n) {
  size_t hl = strlen(header);
  uint64_t h64 = hlen_override ? hlen_override : hl;
  uint8_t *buf = malloc(8 + hl + n + 1);
  memcpy(buf, &h64, 8);
  memcpy(buf + 8, header, hl);
  memset(buf + 8 + hl, 0x11, n);
  CHECK(write_file(path, buf, 8 + hl + n) == 0, "write %s", path);
  free(buf);
}

static void expect(const char *what, const char *path, int want, const char *needle1,
                   const char *needle2) {
  int rc = nwc_store_import(s, "m", path, NULL);
  const char *d = nwc_error_detail();
  CHECK(rc == want, "%s: import returned %d (%s), want %d", what, rc, d, want);
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  CHECK(strstr(d, base), "%s: detail does not name the file: %s", what, d);
  CHECK(!needle1 || strstr(d, needle1), "%s: detail lacks '%s': %s", what, needle1, d);
  CHECK(!needle2 || strstr(d, needle2), "%s: detail lacks '%s': %s", what, needle2, d);
  printf("%-34s %4d  %s\n", what, rc, d);
  nwc_model_info *m = NULL;
  size_t n = 9;
  CHECK_RC(nwc_store_models(s, &m, &n));
  CHECK(n == 0, "%s: a model appeared", what);
  nwc_model_info_free(m, n);
  CHECK(count_containers(dir) == 0, "%s: a file was left in containers/", what);
}

static void expect_header(const char *what, const char *header, size_t n, int want,
                          const char *n1, const char *n2) {
  char path[700];
  snprintf(path, sizeof path, "%s/%s.safetensors", src, what);
  raw_file(path, header, 0, n);
  expect(what, path, want, n1, n2);
}

static void write_index(const char *path, const char *text) {
  CHECK(write_file(path, text, strlen(text)) == 0, "write index");
}

/* Truncates the file named by ctx on the first progress report (the workers are running). */
static int truncate_on_progress(void *ctx, uint64_t done, uint64_t total) {
  static int once;
  (void)done, (void)total;
  if (!once++) CHECK(truncate((const char *)ctx, 200) == 0, "truncate during import");
  return 0;
}

/* A store that cannot be opened says what failed and why: its lock file a directory (as any
 * uid), and root's store opened by uid 65534, where the test can switch (skipped, said so,
 * where it cannot): "Permission denied" and whose uid, not "not a store?". */
static void check_unopenable(void) {
  char st[600], lock[700];
  snprintf(st, sizeof st, "%s/unopenable", src);
  snprintf(lock, sizeof lock, "%s/lock", st);
  CHECK(mkdir(st, 0755) == 0 && mkdir(lock, 0755) == 0, "mkdir %s", lock);
  nwc_store *t = NULL;
  int rc = nwc_store_open(st, NWC_STORE_CREATE, &t);
  CHECK(rc == -EISDIR && !t && strstr(nwc_error_detail(), "/lock: cannot open: Is a directory"),
        "a store whose lock is a directory: %d %s", rc, nwc_error_detail());
  rmdir(lock);
  CHECK_RC(nwc_store_open(st, NWC_STORE_CREATE, &t));
  nwc_store_close(t);
  /* a catalog that is not a database: SQLite's words once, after the file's name */
  char cat[700], junk[4096];
  snprintf(cat, sizeof cat, "%s/catalog.sqlite", st);
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (char)test_below(256);
  CHECK(write_file(cat, junk, sizeof junk) == 0, "write %s", cat);
  rc = nwc_store_open(st, NWC_STORE_CREATE, &t);
  const char *said = "catalog: file is not a database", *why = strstr(nwc_error_detail(), said);
  CHECK(rc == -EBADMSG && !t && why && !strstr(why + strlen(said), "not a database"),
        "a catalog that is not a database: %d %s", rc, nwc_error_detail());
  unlink(cat);
  if (geteuid() != 0 || chmod(src, 0711) < 0) {
    printf("another uid's store: not root here; skipped\n");
    return;
  }
  fflush(stdout); /* the child's lines only once */
  pid_t pid = fork();
  if (pid == 0) {
    if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0) _exit(77);
    rc = nwc_store_open(st, NWC_STORE_CREATE, &t);
    printf("root's store opened by uid 65534: %d %s\n", rc, nwc_error_detail());
    fflush(stdout);
    _exit(rc == -EACCES && strstr(nwc_error_detail(), "/lock: cannot open: Permission denied "
                                  "(another user's store? this process runs as uid 65534)") ? 0 : 1);
  }
  int status = -1;
  waitpid(pid, &status, 0);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 77) printf("another uid's store: cannot switch to uid 65534 here; skipped\n");
  else CHECK(code == 0, "root's store opened by uid 65534: exit %d (its line is above)", code);
  chmod(src, 0700);
}

int main(void) {
  test_seed("test_store_badinput");
  make_tmpdir(dir, sizeof dir, "store");
  make_tmpdir(src, sizeof src, "src");
  char path[700];
  /* A store whose parent is missing: the directory is made, not its parents, and it says so. */
  snprintf(path, sizeof path, "%s/no-such-parent/store", src);
  CHECK(nwc_store_open(path, NWC_STORE_CREATE, &s) == -ENOENT && !s &&
            strstr(nwc_error_detail(), "not its parents"), "store under a missing parent: %s",
        nwc_error_detail());
  check_unopenable();
  CHECK_RC(nwc_store_open(dir, NWC_STORE_CREATE, &s));
  if (!s) return 1;

  /* A valid two-tensor file, then cut short. */
  const char *good = "{\"a.weight\":{\"dtype\":\"BF16\",\"shape\":[4,8],\"data_offsets\":[0,64]},"
                     "\"b\":{\"dtype\":\"BF16\",\"shape\":[8],\"data_offsets\":[64,80]}}";
  snprintf(path, sizeof path, "%s/truncated.safetensors", src);
  raw_file(path, good, 0, 40);
  expect("truncated", path, -EBADMSG, "a.weight", "data_offsets");
  snprintf(path, sizeof path, "%s/tiny.safetensors", src);
  write_file(path, "\x10\0\0", 3);
  expect("shorter than 8 bytes", path, -EBADMSG, "no header", NULL);
  snprintf(path, sizeof path, "%s/hlen-past-end.safetensors", src);
  raw_file(path, good, 100000, 80);
  expect("header length past the end", path, -EBADMSG, "header length", NULL);
  expect_header("not-json", "{\"a\": [1, 2,", 0, -EBADMSG, "JSON", NULL);
  expect_header("not-object", "[1, 2, 3]", 0, -EBADMSG, "not an object", NULL);
  expect_header("empty-header", "", 16, -EBADMSG, "JSON", NULL);
  expect_header("offsets-out-of-range",
                "{\"w\":{\"dtype\":\"BF16\",\"shape\":[4,8],\"data_offsets\":[0,64]}}", 32, -EBADMSG,
                "'w'", "data_offsets");
  expect_header("offsets-reversed",
                "{\"w\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[8,0]}}", 32, -EBADMSG,
                "'w'", NULL);
  expect_header("overlap",
                "{\"p\":{\"dtype\":\"BF16\",\"shape\":[16],\"data_offsets\":[0,32]},"
                "\"q\":{\"dtype\":\"BF16\",\"shape\":[16],\"data_offsets\":[16,48]}}",
                48, -EBADMSG, "'p'", "'q'");
  expect_header("size-mismatch",
                "{\"w\":{\"dtype\":\"F32\",\"shape\":[4,8],\"data_offsets\":[0,64]}}", 64, -EBADMSG,
                "'w'", "F32");
  expect_header("unknown-dtype",
                "{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[4,8],\"data_offsets\":[0,64]}}", 64, -EBADMSG,
                "'w'", "unknown dtype");
  expect_header("unsupported-dtype",
                "{\"pos_ids\":{\"dtype\":\"I64\",\"shape\":[8],\"data_offsets\":[0,64]}}", 64,
                -ENOTSUP, "pos_ids", "I64");
  expect_header("duplicate-name",
                "{\"w\":{\"dtype\":\"BF16\",\"shape\":[8],\"data_offsets\":[0,16]},"
                "\"w\":{\"dtype\":\"BF16\",\"shape\":[8],\"data_offsets\":[16,32]}}",
                32, -EBADMSG, "duplicate", "w");
  expect_header("no-tensors", "{\"__metadata__\":{\"format\":\"pt\"}}", 0, -EBADMSG, "no tensors",
                NULL);
  expect_header("missing-dtype", "{\"w\":{\"shape\":[8],\"data_offsets\":[0,16]}}", 16, -EBADMSG,
                "'w'", "dtype");
  expect_header("negative-shape",
                "{\"w\":{\"dtype\":\"BF16\",\"shape\":[-8],\"data_offsets\":[0,16]}}", 16, -EBADMSG,
                "'w'", "shape");
  expect_header("empty-tensor",
                "{\"w\":{\"dtype\":\"BF16\",\"shape\":[0,4],\"data_offsets\":[0,0]}}", 0, -ENOTSUP,
                "'w'", "empty");
  expect_header("control-char-name",
                "{\"a\\u0001b\":{\"dtype\":\"BF16\",\"shape\":[8],\"data_offsets\":[0,16]}}", 16,
                -EBADMSG, "control", NULL);
  /* fp8 NaN: found by the encoder after the plan; the temporary container must be gone. */
  {
    char hdr[] = "{\"f8\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,8],\"data_offsets\":[0,16]}}";
    snprintf(path, sizeof path, "%s/fp8-nan.safetensors", src);
    size_t hl = strlen(hdr);
    uint8_t buf[256];
    uint64_t h64 = hl;
    memcpy(buf, &h64, 8);
    memcpy(buf + 8, hdr, hl);
    memset(buf + 8 + hl, 0x38, 16);
    buf[8 + hl + 5] = 0x7f;
    write_file(path, buf, 8 + hl + 16);
    expect("fp8-nan", path, -EINVAL, "'f8'", "NaN");
  }
  /* Oversized header: a sparse file of 101 MiB whose header length says 100 MiB + 1. */
  {
    snprintf(path, sizeof path, "%s/oversized.safetensors", src);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    uint64_t h64 = (100u << 20) + 1;
    CHECK(fd >= 0 && write(fd, &h64, 8) == 8 && ftruncate(fd, 101u << 20) == 0, "sparse file");
    close(fd);
    expect("oversized header", path, -EBADMSG, "header length", NULL);
  }
  /* Sharded indexes. */
  {
    char s1[700], ix[700];
    snprintf(s1, sizeof s1, "%s/shard1.safetensors", src);
    raw_file(s1, "{\"x\":{\"dtype\":\"BF16\",\"shape\":[8],\"data_offsets\":[0,16]},"
                 "\"y\":{\"dtype\":\"BF16\",\"shape\":[8],\"data_offsets\":[16,32]}}",
             0, 32);
    char s2[700];
    snprintf(s2, sizeof s2, "%s/shard2.safetensors", src);
    raw_file(s2, "{\"y\":{\"dtype\":\"BF16\",\"shape\":[8],\"data_offsets\":[0,16]}}", 0, 16);
    snprintf(ix, sizeof ix, "%s/missing.index.json", src);
    write_index(ix, "{\"weight_map\":{\"x\":\"shard1.safetensors\",\"z\":\"shard9.safetensors\"}}");
    expect("index: missing shard", ix, -ENOENT, "shard9.safetensors", NULL);
    snprintf(ix, sizeof ix, "%s/escape.index.json", src);
    write_index(ix, "{\"weight_map\":{\"x\":\"../shard1.safetensors\"}}");
    expect("index: shard outside its dir", ix, -EBADMSG, "'x'", "plain file name");
    snprintf(ix, sizeof ix, "%s/notjson.index.json", src);
    write_index(ix, "{\"weight_map\":");
    expect("index: not JSON", ix, -EBADMSG, "JSON", NULL);
    snprintf(ix, sizeof ix, "%s/nomap.index.json", src);
    write_index(ix, "{\"metadata\":{}}");
    expect("index: no weight_map", ix, -EBADMSG, "weight_map", NULL);
    snprintf(ix, sizeof ix, "%s/wrongshard.index.json", src);
    write_index(ix, "{\"weight_map\":{\"x\":\"shard1.safetensors\",\"y\":\"shard1.safetensors\","
                    "\"w\":\"shard1.safetensors\"}}");
    expect("index: tensor not in its shard", ix, -EBADMSG, "'w'", "shard1.safetensors");
    snprintf(ix, sizeof ix, "%s/unlisted.index.json", src);
    write_index(ix, "{\"weight_map\":{\"x\":\"shard1.safetensors\"}}");
    expect("index: shard tensor unlisted", ix, -EBADMSG, "'y'", "not in the index");
    snprintf(ix, sizeof ix, "%s/dup.index.json", src);
    write_index(ix, "{\"weight_map\":{\"x\":\"shard1.safetensors\",\"y\":\"shard2.safetensors\"}}");
    expect("index: tensor in two shards", ix, -EBADMSG, "'y'", "shard2.safetensors");
  }
  /* A model name that is taken: the second import fails and changes nothing. */
  {
    snprintf(path, sizeof path, "%s/good.safetensors", src);
    raw_file(path, good, 0, 80);
    CHECK_RC(nwc_store_import(s, "taken", path, NULL));
    int n = count_containers(dir);
    int rc = nwc_store_import(s, "taken", path, NULL);
    CHECK(rc == -EEXIST && strstr(nwc_error_detail(), "taken"), "taken: %d %s", rc,
          nwc_error_detail());
    printf("%-34s %4d  %s\n", "model name taken", rc, nwc_error_detail());
    CHECK(count_containers(dir) == n, "taken: wrote a file");
    CHECK_RC(nwc_store_remove(s, "taken"));
  }
  /* A file that shrinks while it is imported: an error naming it, never SIGBUS. */
  {
    enum { NT = 16, R = 64, C = 2048 };
    st_spec sp[NT];
    char nm[NT][16];
    uint16_t *big = calloc(R * C, 2);
    for (int i = 0; i < R * C; i++) big[i] = (uint16_t)(0x3c00 + test_below(0x800));
    for (int i = 0; i < NT; i++) {
      snprintf(nm[i], sizeof nm[i], "t%d", i);
      sp[i] = (st_spec){nm[i], "BF16", 2, {R, C}, big, R * C * 2};
    }
    snprintf(path, sizeof path, "%s/shrinks.safetensors", src);
    CHECK_RC(st_write(path, sp, NT));
    nwc_import_opts o = {.threads = 2, .progress = truncate_on_progress, .progress_ctx = path};
    int rc = nwc_store_import(s, "m", path, &o);
    CHECK(rc == 0 || (rc == -EBADMSG && strstr(nwc_error_detail(), "shrink")), "shrink: %d %s", rc,
          nwc_error_detail());
    printf("%-34s %4d  %s\n", "file shrinks during the import", rc, rc ? nwc_error_detail() : "(all read first)");
    if (rc == 0) CHECK_RC(nwc_store_remove(s, "m"));
    CHECK(count_containers(dir) == 0, "shrink: a file was left in containers/");
    free(big);
  }
  /* Not a file at all. */
  snprintf(path, sizeof path, "%s/does-not-exist.safetensors", src);
  expect("no such file", path, -ENOENT, NULL, NULL);
  nwc_store_close(s);
  rm_rf(dir);
  rm_rf(src);
  return test_exit("test_store_badinput");
}
