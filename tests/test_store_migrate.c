/*
 * test_store_migrate.c - forward migrations of the catalog from every earlier schema version.
 * For each v < NWC_STORE_SCHEMA_VERSION: import a model into a store of the current version,
 * rebuild its catalog as a version-v catalog (nwc__catalog_init_at(v), then copy the columns
 * version v has), open the store, and check that it migrated to the current version with the
 * model whole (reads, decodes, verifies).  And a store as the version-1 container writer left it
 * (schema 3, its container the golden file that writer made, every blob on pages of its own)
 * opens, migrates, verifies, reads back to the golden model's weights, takes a new import (packed
 * blobs) beside it and removes it.  Also: a newer catalog and a non-nwc database are refused,
 * and a read-only open of an old catalog says it needs a migration.
 */
#include "store_internal.h"
#include "store_golden_model.h"

#include <xxhash.h>

static const char *const tables[] = {"meta", "models", "sources", "containers", "tensors"};

static int exec(sqlite3 *db, const char *sql) {
  char *msg = NULL;
  int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
  CHECK(rc == SQLITE_OK, "%s: %s", sql, msg ? msg : "");
  sqlite3_free(msg);
  return rc;
}

/* Rewrites DIR/catalog.sqlite as a version-v catalog with the same rows. */
static void downgrade(const char *dir, int v) {
  char cat[700], old[700];
  snprintf(cat, sizeof cat, "%s/catalog.sqlite", dir);
  snprintf(old, sizeof old, "%s/old.sqlite", dir);
  CHECK(rename(cat, old) == 0, "rename catalog");
  sqlite3 *db;
  CHECK(sqlite3_open(cat, &db) == SQLITE_OK, "open new catalog");
  CHECK_RC(nwc__catalog_init_at(db, v));
  CHECK(nwc__catalog_version(db) == v, "version %d", v);
  char sql[4096]; /* room for the INSERT naming cols (< 1500) twice */
  snprintf(sql, sizeof sql, "ATTACH '%s' AS old", old);
  exec(db, sql);
  exec(db, "DELETE FROM meta");
  for (size_t t = 0; t < sizeof tables / sizeof *tables; t++) {
    char cols[1500] = "";
    sqlite3_stmt *st;
    snprintf(sql, sizeof sql, "PRAGMA main.table_info(%s)", tables[t]);
    sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    while (sqlite3_step(st) == SQLITE_ROW) {
      if (*cols) strcat(cols, ",");
      strcat(cols, (const char *)sqlite3_column_text(st, 1));
    }
    sqlite3_finalize(st);
    snprintf(sql, sizeof sql, "INSERT INTO main.%s(%s) SELECT %s FROM old.%s", tables[t], cols,
             cols, tables[t]);
    exec(db, sql);
  }
  exec(db, "DETACH old");
  sqlite3_close(db);
  unlink(old);
}

/* DIR as the version-1 writer left a store holding the golden model as "old": container 1 is
 * tests/golden/store_container_v1.nwc (that writer's bytes), the catalog is schema 3 with the
 * rows its import published (decoder fields from the blob headers, checksums of the bytes). */
static void old_store(const char *dir) {
  nwc_store *s = NULL;
  CHECK_RC(nwc_store_open(dir, NWC_STORE_CREATE, &s)); /* the directories and the lock */
  nwc_store_close(s);
  char cat[700], cont[700];
  const char *suffix[] = {"", "-wal", "-shm"};
  for (int i = 0; i < 3; i++) {
    snprintf(cat, sizeof cat, "%s/catalog.sqlite%s", dir, suffix[i]);
    unlink(cat);
  }
  snprintf(cat, sizeof cat, "%s/catalog.sqlite", dir);
  size_t glen = 0;
  uint8_t *gold = gm_slurp(GOLDEN_DIR "/store_container_v1.nwc", &glen);
  CHECK(gold && glen > 4096, "golden container v1");
  if (!gold) return;
  snprintf(cont, sizeof cont, "%s/containers/0000000000000001.nwc", dir);
  CHECK_RC(write_file(cont, gold, glen));
  sqlite3 *db;
  CHECK(sqlite3_open(cat, &db) == SQLITE_OK, "open %s", cat);
  CHECK_RC(nwc__catalog_init_at(db, 3));
  exec(db, "UPDATE meta SET value = 2 WHERE key = 'next_container';"
           "INSERT INTO models(id, name, created, elem_option, layout_option, tensors,"
           " source_bytes, raw_bytes, nwc_bytes) VALUES(1, 'old', 0, 0, 0, 3, 19552, 19536, 24576);"
           "INSERT INTO sources VALUES(1, 0, 'g.safetensors', 0, 0, 0);");
  sqlite3_stmt *st;
  sqlite3_prepare_v2(db, "INSERT INTO containers VALUES(1, 1, ?, ?, 1)", -1, &st, NULL);
  sqlite3_bind_int64(st, 1, (sqlite3_int64)glen);
  sqlite3_bind_int64(st, 2, (sqlite3_int64)XXH3_64bits(gold, 4096));
  CHECK(sqlite3_step(st) == SQLITE_DONE, "insert container: %s", sqlite3_errmsg(db));
  sqlite3_finalize(st);
  sqlite3_prepare_v2(db, "INSERT INTO tensors(model_id, idx, name, shape, source_idx,"
                         " source_dtype, conversion, elem, layout, rows, cols, source_bytes,"
                         " raw_bytes, nwc_bytes, container_id, offset, length, chunk_size,"
                         " checksums, format_version, psym, tab_bits, nblocks, data_bytes,"
                         " raw_plane_bytes, off_bases, off_hdr, off_data, off_raw, off_scale)"
                         " VALUES(1,?,?,?,0,?,?,?,0,?,?,?,?,?,1,?,?,1048576,?,?,?,12,?,?,?,?,?,?,?,?)",
                     -1, &st, NULL);
  for (uint64_t off = 4096; off + 128 <= glen;) {
    nwc_tensor_info ti;
    int pk;
    uint64_t len = gm_blob_info(gold + off, 1, &ti, &pk);
    int w = ti.rows == GM_BM, f8 = ti.rows == GM_FM;
    uint64_t sums = XXH3_64bits(gold + off, len); /* one chunk */
    int k = 1;
    sqlite3_reset(st);
    sqlite3_bind_int64(st, k++, w ? 0 : f8 ? 1 : 2);
    sqlite3_bind_text(st, k++, w ? "w" : f8 ? "f8.weight" : "f8.weight_scale", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, k++, w ? "[16,600]" : f8 ? "[8,40]" : "[8]", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, k++, w ? "BF16" : f8 ? "F8_E4M3" : "F32", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, k++, w    ? "none"
                               : f8 ? "fp8 e4m3, per-row scale folded from the companion"
                                    : "f32->bf16 rne",
                      -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, k++, ti.elem);
    uint64_t v[] = {ti.rows, ti.cols, w ? 19200u : f8 ? 320u : 32u, w ? 19200u : f8 ? 320u : 16u,
                    len, off, len};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) sqlite3_bind_int64(st, k++, (sqlite3_int64)v[i]);
    sqlite3_bind_blob(st, k++, &sums, 8, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, k++, ti.format_version);
    sqlite3_bind_blob(st, k++, ti.psym, 16, SQLITE_TRANSIENT);
    uint64_t d[] = {ti.nblocks, ti.data_bytes, ti.raw_plane_bytes, ti.off_bases, ti.off_hdr,
                    ti.off_data, ti.off_raw, ti.off_scale};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++) sqlite3_bind_int64(st, k++, (sqlite3_int64)d[i]);
    CHECK(sqlite3_step(st) == SQLITE_DONE, "insert tensor: %s", sqlite3_errmsg(db));
    off += len;
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  free(gold);
}

/* Every tensor of "old" reads back (pread, checksums, header) to the golden model's weights. */
static void check_old(nwc_store *s) {
  const char *names[] = {"w", "f8.weight", "f8.weight_scale"};
  for (int i = 0; i < 3; i++) {
    nwc_tensor t;
    int rc = nwc_store_read(s, "old", names[i], &t);
    CHECK(rc == 0, "read old/%s: %s", names[i], nwc_error_detail());
    if (rc) continue;
    const uint64_t bad = gm_count_wrong(&t);
    CHECK(bad == 0, "old/%s: %llu weights differ", names[i], (unsigned long long)bad);
    nwc_tensor_release(&t);
  }
}

static void check_bias(nwc_store *s, const char *model) {
  nwc_tensor_info *a = NULL, *c = NULL;
  CHECK_RC(nwc_store_tensor(s, model, "a.weight", &a));
  CHECK_RC(nwc_store_tensor(s, model, "c.weight", &c));
  CHECK(a && a->bias_tensor && !strcmp(a->bias_tensor, "a.bias"), "a.weight bias: %s",
        a && a->bias_tensor ? a->bias_tensor : "(none)");
  CHECK(c && !c->bias_tensor, "c.weight has a bias of the wrong length linked");
  nwc_tensor_info_free(a, 1);
  nwc_tensor_info_free(c, 1);
}

int main(void) {
  test_seed("test_store_migrate");
  gm_make();
  char src[512], path[700];
  make_tmpdir(src, sizeof src, "src");
  uint16_t w[64 * 600];
  for (size_t i = 0; i < sizeof w / 2; i++) w[i] = nwc_f32_to_bf16((float)(test_uniform() - 0.5));
  st_spec spec[] = {{"a.weight", "BF16", 2, {64, 600}, w, sizeof w},
                    {"a.bias", "BF16", 1, {64}, w, 128},
                    {"c.weight", "BF16", 2, {8, 600}, w, 8 * 1200},
                    {"c.bias", "BF16", 1, {9}, w, 18}}; /* wrong length: no link */
  snprintf(path, sizeof path, "%s/m.safetensors", src);
  CHECK_RC(st_write(path, spec, 4));

  for (int v = 1; v < NWC_STORE_SCHEMA_VERSION; v++) {
    char dir[512];
    make_tmpdir(dir, sizeof dir, "store");
    nwc_store *s;
    CHECK_RC(nwc_store_open(dir, NWC_STORE_CREATE, &s));
    CHECK_RC(nwc_store_import(s, "m", path, NULL));
    check_bias(s, "m");
    nwc_store_close(s);
    downgrade(dir, v);
    CHECK(nwc_store_open(dir, NWC_STORE_RDONLY, &s) == -EROFS, "read-only open of version %d", v);
    CHECK_RC(nwc_store_open(dir, 0, &s));
    if (!s) continue;
    CHECK(nwc_store_schema_version(s) == NWC_STORE_SCHEMA_VERSION, "migrated %d -> %d", v,
          nwc_store_schema_version(s));
    nwc_model_info *mi = NULL;
    CHECK_RC(nwc_store_model(s, "m", &mi));
    CHECK(mi && mi->tensors == 4 && mi->verified == 0, "model after migration");
    check_bias(s, "m"); /* migration 2 -> 3 fills in what import sets */
    nwc_model_info_free(mi, 1);
    CHECK(check_store_consistent(s, dir) == 1, "one model");
    /* A migrated store takes new imports. */
    CHECK_RC(nwc_store_import(s, "m2", path, NULL));
    CHECK(check_store_consistent(s, dir) == 2, "two models");
    check_bias(s, "m2");
    nwc_store_close(s);
    printf("schema %d -> %d: ok\n", v, NWC_STORE_SCHEMA_VERSION);
    rm_rf(dir);
  }

  /* A store the version-1 writer made (schema 3): opens, migrates, reads, takes a packed import
   * beside it, and gives its container back when removed. */
  {
    char dir[512], cont[700];
    make_tmpdir(dir, sizeof dir, "store");
    old_store(dir);
    snprintf(cont, sizeof cont, "%s/containers/0000000000000001.nwc", dir);
    nwc_store *s = NULL;
    CHECK(nwc_store_open(dir, NWC_STORE_RDONLY, &s) == -EROFS, "read-only open of the old store");
    CHECK_RC(nwc_store_open(dir, 0, &s));
    if (s) {
      CHECK(nwc_store_schema_version(s) == NWC_STORE_SCHEMA_VERSION && nwc_store_swept(s) == 0,
            "old store: schema %d, %llu files swept", nwc_store_schema_version(s),
            (unsigned long long)nwc_store_swept(s));
      CHECK(check_store_consistent(s, dir) == 1, "the old store: one model, verified");
      check_old(s);
      CHECK_RC(nwc_store_import(s, "m2", path, NULL));
      nwc_tensor_info *ts = NULL;
      size_t nt = 0, inside = 0; /* packed blobs after the first of their run */
      CHECK_RC(nwc_store_tensors(s, "m2", &ts, &nt));
      for (size_t i = 0; i < nt; i++) inside += ts[i].offset % 4096 != 0;
      CHECK(inside > 0, "the new import packed none of its %zu small tensors", nt);
      nwc_tensor_info_free(ts, nt);
      CHECK(check_store_consistent(s, dir) == 2, "old and new models side by side");
      check_old(s);
      CHECK_RC(nwc_store_remove(s, "old"));
      CHECK(access(cont, F_OK) != 0, "the old container is still there after remove");
      CHECK(check_store_consistent(s, dir) == 1, "after removing the old model");
      nwc_store_close(s);
    }
    printf("a store of container version 1, schema 3 -> %d: ok\n", NWC_STORE_SCHEMA_VERSION);
    rm_rf(dir);
  }

  /* A catalog from the future, and a database that is not a catalog. */
  {
    char dir[512], cat[700];
    make_tmpdir(dir, sizeof dir, "store");
    nwc_store *s;
    CHECK_RC(nwc_store_open(dir, NWC_STORE_CREATE, &s));
    nwc_store_close(s);
    snprintf(cat, sizeof cat, "%s/catalog.sqlite", dir);
    sqlite3 *db;
    sqlite3_open(cat, &db);
    exec(db, "UPDATE schema_version SET version = 999");
    sqlite3_close(db);
    CHECK(nwc_store_open(dir, 0, &s) == -EBADMSG && strstr(nwc_error_detail(), "newer"),
          "future catalog: %s", nwc_error_detail());
    unlink(cat);
    sqlite3_open(cat, &db);
    exec(db, "CREATE TABLE t(x)");
    sqlite3_close(db);
    CHECK(nwc_store_open(dir, 0, &s) == -EBADMSG, "foreign database: %s", nwc_error_detail());
    write_file(cat, "this is not sqlite at all, not even close............................", 70);
    CHECK(nwc_store_open(dir, 0, &s) < 0, "garbage catalog");
    printf("garbage catalog: %s\n", nwc_error_detail());
    rm_rf(dir);
  }
  rm_rf(src);
  return test_exit("test_store_migrate");
}
