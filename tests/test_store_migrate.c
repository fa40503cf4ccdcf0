/*
 * test_store_migrate.c - forward migrations of the catalog from every earlier schema version.
 * For each v < NWC_STORE_SCHEMA_VERSION: import a model into a store of the current version,
 * rebuild its catalog as a version-v catalog (nwc__catalog_init_at(v), then copy the columns
 * version v has), open the store, and check that it migrated to the current version with the
 * model whole (reads, decodes, verifies).  Also: a newer catalog and a non-nwc database are
 * refused, and a read-only open of an old catalog says it needs a migration.
 */
#include "store_internal.h"
#include "test_store_util.h"

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
