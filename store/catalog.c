/*
 * catalog.c - the SQLite catalog (docs/store.md, "Catalog"): schema and forward migrations,
 * publishing a model in one transaction, removing it, and reading rows back into
 * nwc_tensor_info / nwc_model_info.
 *
 * Reads (nwc_store_models, _model, _tensors, _tensor) go through a second, read-only connection
 * (store_internal.h: rdb): in WAL mode it reads the last committed state while the writing
 * connection commits, so a listing never waits for an import's or a removal's commit and its
 * fsync.
 *
 * Invariants: the catalog is the truth.  A container file is live exactly when a containers row
 * names its id; a model's rows appear and disappear in one transaction.  The database runs in WAL
 * mode with synchronous=FULL (every commit is durable before it returns: publishing and removing
 * models are the commits that matter) and foreign keys on (tensors, sources and containers go
 * with their model).  schema_version holds one row; migrations[v] takes version v to v + 1 and
 * runs inside one transaction with the version bump, so a crash mid-migration leaves the old
 * version whole.
 */
#include "store_internal.h"

#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const migrations[NWC_STORE_SCHEMA_VERSION] = {
    /* 0 -> 1: the first schema. */
    "CREATE TABLE schema_version(version INTEGER NOT NULL);"
    "INSERT INTO schema_version VALUES(0);"
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL);"
    "INSERT INTO meta VALUES('next_container', 1);"
    "CREATE TABLE models("
    " id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, created INTEGER NOT NULL,"
    " elem_option INTEGER NOT NULL, layout_option INTEGER NOT NULL, tensors INTEGER NOT NULL,"
    " source_bytes INTEGER NOT NULL, raw_bytes INTEGER NOT NULL, nwc_bytes INTEGER NOT NULL);"
    "CREATE TABLE sources("
    " model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE, idx INTEGER NOT NULL,"
    " path TEXT NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,"
    " header_xxh3 INTEGER NOT NULL, PRIMARY KEY(model_id, idx));"
    "CREATE TABLE containers("
    " id INTEGER PRIMARY KEY, model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,"
    " size INTEGER NOT NULL, header_xxh3 INTEGER NOT NULL, version INTEGER NOT NULL);"
    "CREATE TABLE tensors("
    " id INTEGER PRIMARY KEY, model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,"
    " idx INTEGER NOT NULL, name TEXT NOT NULL, shape TEXT NOT NULL, source_idx INTEGER NOT NULL,"
    " source_dtype TEXT NOT NULL, conversion TEXT NOT NULL, scale_tensor TEXT,"
    " elem INTEGER NOT NULL, layout INTEGER NOT NULL, rows INTEGER NOT NULL, cols INTEGER NOT NULL,"
    " source_bytes INTEGER NOT NULL, raw_bytes INTEGER NOT NULL, nwc_bytes INTEGER NOT NULL,"
    " container_id INTEGER NOT NULL REFERENCES containers(id) ON DELETE CASCADE,"
    " offset INTEGER NOT NULL, length INTEGER NOT NULL, chunk_size INTEGER NOT NULL,"
    " checksums BLOB NOT NULL, format_version INTEGER NOT NULL, psym BLOB NOT NULL,"
    " tab_bits INTEGER NOT NULL, nblocks INTEGER NOT NULL, data_bytes INTEGER NOT NULL,"
    " raw_plane_bytes INTEGER NOT NULL, off_bases INTEGER NOT NULL, off_hdr INTEGER NOT NULL,"
    " off_data INTEGER NOT NULL, off_raw INTEGER NOT NULL, off_scale INTEGER NOT NULL,"
    " UNIQUE(model_id, name));",
    /* 1 -> 2: when a model last verified clean; tensors by container (verify walks them). */
    "ALTER TABLE models ADD COLUMN verified INTEGER NOT NULL DEFAULT 0;"
    "CREATE INDEX tensors_by_container ON tensors(container_id, offset);",
    /* 2 -> 3: the bias of each NAMEweight tensor (NAMEbias, 1 x rows), filled in for old rows. */
    "ALTER TABLE tensors ADD COLUMN bias_tensor TEXT;"
    "UPDATE tensors SET bias_tensor = (SELECT b.name FROM tensors b"
    " WHERE b.model_id = tensors.model_id"
    " AND b.name = substr(tensors.name, 1, length(tensors.name) - 6) || 'bias'"
    " AND b.rows = 1 AND b.cols = tensors.rows)"
    " WHERE tensors.name GLOB '*weight';",
    /* 3 -> 4: no table changes.  Blobs may be packed (offset and length multiples of 64, not of
     * 4096: docs/store.md, "Packed blobs"); the version makes a build that cannot read them
     * refuse the catalog at open, rather than fail on each packed row as malformed. */
    "SELECT 1;",
};

/* db's last error as a negative errno (-EBUSY, -ENOSPC, -EBADMSG, -EROFS, -EEXIST; an I/O
 * error or a file SQLite could not open is the system call's errno, -ENOSPC for a full disk
 * where SQLite only says "disk I/O error"; else -EIO), the detail "catalog: WHAT: SQLite's
 * message" (what NULL: "catalog: SQLite's message"), with the errno's text after an I/O error. */
static int sql_fail(sqlite3 *db, const char *what) {
  int code = sqlite3_errcode(db), sys = sqlite3_system_errno(db);
  bool io = code == SQLITE_IOERR || code == SQLITE_CANTOPEN || code == SQLITE_FULL;
  int err = code == SQLITE_BUSY || code == SQLITE_LOCKED ? -EBUSY
            : code == SQLITE_FULL                         ? -ENOSPC
            : code == SQLITE_CORRUPT || code == SQLITE_NOTADB ? -EBADMSG
            : code == SQLITE_READONLY                         ? -EROFS
            : code == SQLITE_CONSTRAINT                       ? -EEXIST
                                                              : -EIO;
  if (io && sys > 0) err = -sys;
  const char *file = io ? sqlite3_db_filename(db, "main") : NULL;
  if (io) /* which file, and the system's words: "disk I/O error" alone does not say */
    return nwc__fail(err, "catalog %s: %s%s%s: %s", file ? file : "", what ? what : "",
                     what ? ": " : "", sqlite3_errmsg(db), strerror(-err));
  return what ? nwc__fail(err, "catalog: %s: %s", what, sqlite3_errmsg(db))
              : nwc__fail(err, "catalog: %s", sqlite3_errmsg(db));
}

/* Runs sql (no results); on failure sql_fail(db, NULL). */
static int sql_exec(sqlite3 *db, const char *sql) {
  return sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : sql_fail(db, NULL);
}

static int prepare(sqlite3 *db, const char *sql, sqlite3_stmt **st) {
  if (sqlite3_prepare_v2(db, sql, -1, st, NULL) != SQLITE_OK) return sql_fail(db, sql);
  return 0;
}

int nwc__catalog_version(sqlite3 *db) {
  sqlite3_stmt *st;
  int have = 0;
  NWC_TRY(prepare(db, "SELECT count(*) FROM sqlite_master WHERE name = 'schema_version'", &st));
  if (sqlite3_step(st) == SQLITE_ROW) have = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  if (!have) {
    NWC_TRY(prepare(db, "SELECT count(*) FROM sqlite_master", &st));
    int n = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
    sqlite3_finalize(st);
    NWC_RETURN_IF(n != 0, -EBADMSG, "catalog: not an nwc catalog (no schema_version table)");
    return 0;
  }
  NWC_TRY(prepare(db, "SELECT version FROM schema_version", &st));
  int v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
  sqlite3_finalize(st);
  NWC_RETURN_IF(v < 0, -EBADMSG, "catalog: schema_version is empty");
  return v;
}

int nwc__catalog_init_at(sqlite3 *db, int version) {
  int v = nwc__catalog_version(db);
  NWC_TRY(v);
  NWC_RETURN_IF(v > NWC_STORE_SCHEMA_VERSION, -EBADMSG,
                "catalog: schema version %d is newer than this build (%d)", v,
                NWC_STORE_SCHEMA_VERSION);
  NWC_RETURN_IF(version > NWC_STORE_SCHEMA_VERSION, -EINVAL, "catalog: no schema version %d",
                version);
  for (; v < version; v++) {
    NWC_TRY(sql_exec(db, "BEGIN IMMEDIATE"));
    char bump[64];
    snprintf(bump, sizeof bump, "UPDATE schema_version SET version = %d", v + 1);
    int rc = sql_exec(db, migrations[v]);
    if (rc == 0) rc = sql_exec(db, bump);
    if (rc == 0) rc = sql_exec(db, "COMMIT");
    if (rc < 0) {
      sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
      return nwc__fail_prefix(rc, "migration %d -> %d", v, v + 1);
    }
  }
  return 0;
}

int nwc__catalog_open(const char *path, int create, int rdonly, sqlite3 **out) {
  sqlite3 *db = NULL;
  if (create && !rdonly) { /* SQLite would make it 0644: the catalog is as private as the store */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0)
      return nwc__fail(-errno, "%s: cannot create: %s", path, strerror(errno));
    close(fd);
  }
  int fl = rdonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0);
  if (sqlite3_open_v2(path, &db, fl | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
    int rc = db ? sql_fail(db, path) : -ENOMEM;
    sqlite3_close(db);
    return rc;
  }
  sqlite3_busy_timeout(db, 5000);
  int rc = sql_exec(db, rdonly ? "PRAGMA foreign_keys = ON;"
                                    : "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;"
                                      "PRAGMA foreign_keys = ON;");
  int v = rc < 0 ? rc : nwc__catalog_version(db);
  if (v >= 0 && v > NWC_STORE_SCHEMA_VERSION)
    v = nwc__fail(-EBADMSG, "%s: schema version %d is newer than this build (%d)", path, v,
                  NWC_STORE_SCHEMA_VERSION);
  if (v >= 0 && rdonly && v < NWC_STORE_SCHEMA_VERSION)
    v = nwc__fail(-EROFS, "%s: schema version %d needs a migration (open it read-write once)",
                  path, v);
  if (v >= 0 && !rdonly) v = nwc__catalog_init_at(db, NWC_STORE_SCHEMA_VERSION);
  if (v < 0) {
    sqlite3_close(db);
    return v;
  }
  *out = db;
  return 0;
}

int nwc__catalog_next_container(sqlite3 *db, uint64_t *cid) {
  sqlite3_stmt *st;
  NWC_TRY(sql_exec(db, "BEGIN IMMEDIATE"));
  int rc = prepare(db, "UPDATE meta SET value = value + 1 WHERE key = 'next_container' "
                       "RETURNING value - 1", &st);
  if (rc == 0) {
    if (sqlite3_step(st) == SQLITE_ROW) *cid = (uint64_t)sqlite3_column_int64(st, 0);
    else rc = sql_fail(db, "next container id");
    sqlite3_finalize(st);
  }
  if (rc == 0) rc = sql_exec(db, "COMMIT");
  if (rc < 0) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  return rc;
}

/* Runs one checking pragma: every row that is not "ok" (every row for foreign_key_check) goes to
 * cb as text; a pragma that cannot run is itself a problem.  Returns the problems found. */
static unsigned check_pragma(sqlite3 *db, const char *sql, nwc__catalog_problem_fn cb, void *ctx) {
  sqlite3_stmt *st;
  char msg[512];
  unsigned n = 0;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
    snprintf(msg, sizeof msg, "%s: %s", sql, sqlite3_errmsg(db));
    cb(ctx, msg);
    return 1;
  }
  int r;
  while ((r = sqlite3_step(st)) == SQLITE_ROW) {
    const char *a = (const char *)sqlite3_column_text(st, 0);
    if (sqlite3_column_count(st) == 1) { /* integrity_check: "ok" or one problem a row */
      if (a && !strcmp(a, "ok")) continue;
      snprintf(msg, sizeof msg, "%s: %s", sql, a ? a : "(null)");
    } else { /* foreign_key_check: table, rowid, parent, fkid */
      snprintf(msg, sizeof msg, "%s: row %lld of %s names a missing row of %s", sql,
               (long long)sqlite3_column_int64(st, 1), a ? a : "?",
               (const char *)sqlite3_column_text(st, 2));
    }
    cb(ctx, msg), n++;
  }
  if (r != SQLITE_DONE) {
    snprintf(msg, sizeof msg, "%s: %s", sql, sqlite3_errmsg(db));
    cb(ctx, msg), n++;
  }
  sqlite3_finalize(st);
  return n;
}

unsigned nwc__catalog_check(sqlite3 *db, nwc__catalog_problem_fn cb, void *ctx) {
  unsigned n = check_pragma(db, "PRAGMA integrity_check", cb, ctx);
  return n + check_pragma(db, "PRAGMA foreign_key_check", cb, ctx);
}

int nwc__catalog_peek_next(sqlite3 *db, uint64_t *next) {
  sqlite3_stmt *st;
  NWC_TRY(prepare(db, "SELECT value FROM meta WHERE key = 'next_container'", &st));
  int r = sqlite3_step(st), rc = 0;
  if (r == SQLITE_ROW) *next = (uint64_t)sqlite3_column_int64(st, 0);
  else if (r == SQLITE_DONE) rc = nwc__fail(-EBADMSG, "catalog: no next_container in meta");
  else rc = sql_fail(db, "meta");
  sqlite3_finalize(st);
  return rc;
}

int nwc__catalog_has_container(sqlite3 *db, uint64_t cid) {
  sqlite3_stmt *st;
  NWC_TRY(prepare(db, "SELECT 1 FROM containers WHERE id = ?", &st));
  sqlite3_bind_int64(st, 1, (sqlite3_int64)cid);
  int r = sqlite3_step(st);
  int rc = r == SQLITE_ROW ? 1 : r == SQLITE_DONE ? 0 : sql_fail(db, "containers");
  sqlite3_finalize(st);
  return rc;
}

int nwc__catalog_model_id(sqlite3 *db, const char *model, int64_t *id) {
  sqlite3_stmt *st;
  NWC_TRY(prepare(db, "SELECT id FROM models WHERE name = ?", &st));
  sqlite3_bind_text(st, 1, model, -1, SQLITE_STATIC);
  int r = sqlite3_step(st), rc = 0;
  if (r == SQLITE_ROW) *id = sqlite3_column_int64(st, 0);
  else if (r == SQLITE_DONE) rc = nwc__fail(-ENOENT, "model '%s' does not exist", model);
  else rc = sql_fail(db, "models");
  sqlite3_finalize(st);
  return rc;
}

int nwc__catalog_set_verified(sqlite3 *db, int64_t model_id, int64_t when) {
  sqlite3_stmt *st;
  NWC_TRY(prepare(db, "UPDATE models SET verified = ? WHERE id = ?", &st));
  sqlite3_bind_int64(st, 1, when);
  sqlite3_bind_int64(st, 2, model_id);
  int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : sql_fail(db, "set verified");
  sqlite3_finalize(st);
  return rc;
}

int nwc__catalog_containers(sqlite3 *db, int64_t model_id, uint64_t **ids, uint64_t **sizes,
                            size_t *n) {
  sqlite3_stmt *st;
  *ids = NULL, *sizes = NULL, *n = 0;
  NWC_TRY(prepare(db, "SELECT id, size FROM containers WHERE model_id = ? ORDER BY id", &st));
  sqlite3_bind_int64(st, 1, model_id);
  int rc = 0, r;
  size_t cap = 0;
  while ((r = sqlite3_step(st)) == SQLITE_ROW) {
    if (*n == cap) {
      cap = cap ? 2 * cap : 4;
      uint64_t *a = realloc(*ids, cap * 8), *b = a ? realloc(*sizes, cap * 8) : NULL;
      if (a) *ids = a;
      if (b) *sizes = b;
      if (!a || !b) {
        rc = -ENOMEM;
        break;
      }
    }
    (*ids)[*n] = (uint64_t)sqlite3_column_int64(st, 0);
    (*sizes)[(*n)++] = (uint64_t)sqlite3_column_int64(st, 1);
  }
  if (rc == 0 && r != SQLITE_DONE) rc = sql_fail(db, "containers");
  sqlite3_finalize(st);
  if (rc < 0) free(*ids), free(*sizes), *ids = *sizes = NULL, *n = 0;
  return rc;
}

int nwc__catalog_delete_model(sqlite3 *db, int64_t model_id) {
  sqlite3_stmt *st;
  NWC_TRY(sql_exec(db, "BEGIN IMMEDIATE"));
  int rc = prepare(db, "DELETE FROM models WHERE id = ?", &st);
  if (rc == 0) {
    sqlite3_bind_int64(st, 1, model_id);
    if (sqlite3_step(st) != SQLITE_DONE) rc = sql_fail(db, "delete model");
    sqlite3_finalize(st);
  }
  if (rc == 0) rc = sql_exec(db, "COMMIT");
  if (rc < 0) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  return rc;
}

/* ---- publish -------------------------------------------------------------------------------- */

static char *shape_json(const uint64_t *shape, unsigned ndim) {
  json_t *a = json_array();
  for (unsigned i = 0; a && i < ndim; i++) json_array_append_new(a, json_integer((json_int_t)shape[i]));
  char *s = a ? json_dumps(a, JSON_COMPACT) : NULL;
  json_decref(a);
  return s;
}

static int publish_tensor(sqlite3 *db, sqlite3_stmt *st, int64_t model_id, size_t idx,
                          uint64_t cid, const nwc__pub_tensor *t) {
  char *shape = shape_json(t->shape, t->ndim);
  if (!shape) return -ENOMEM;
  int k = 1;
  sqlite3_reset(st);
  sqlite3_bind_int64(st, k++, model_id);
  sqlite3_bind_int64(st, k++, (sqlite3_int64)idx);
  sqlite3_bind_text(st, k++, t->name, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, k++, shape, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, k++, t->source);
  sqlite3_bind_text(st, k++, t->dtype, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, k++, t->conversion, -1, SQLITE_STATIC);
  if (t->scale_tensor) sqlite3_bind_text(st, k++, t->scale_tensor, -1, SQLITE_STATIC);
  else sqlite3_bind_null(st, k++);
  sqlite3_bind_int64(st, k++, t->elem);
  sqlite3_bind_int64(st, k++, NWC_ELEM_LAYOUT(t->elem));
  uint64_t v[] = {t->rows, t->cols, t->source_bytes, t->raw_bytes, t->L.length, cid,
                  t->offset, t->length, NWC_STORE_CHUNK};
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
    sqlite3_bind_int64(st, k++, (sqlite3_int64)v[i]);
  sqlite3_bind_blob(st, k++, t->checksums, (int)(nwc__chunks(t->length, NWC_STORE_CHUNK) * 8),
                    SQLITE_STATIC);
  sqlite3_bind_int64(st, k++, NWC_FORMAT_VERSION);
  sqlite3_bind_blob(st, k++, t->psym, 16, SQLITE_STATIC);
  uint64_t w[] = {NWC__TAB_BITS, t->nblocks, t->data_bytes, t->raw_plane_bytes, t->L.off_bases,
                  t->L.off_hdr, t->L.off_data, t->L.off_raw, t->L.off_scale};
  for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
    sqlite3_bind_int64(st, k++, (sqlite3_int64)w[i]);
  if (t->bias_tensor) sqlite3_bind_text(st, k++, t->bias_tensor, -1, SQLITE_STATIC);
  else sqlite3_bind_null(st, k++);
  int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : sql_fail(db, t->name);
  free(shape);
  return rc;
}

static int publish_body(sqlite3 *db, const nwc__pub_model *m) {
  sqlite3_stmt *st;
  uint64_t src = 0, raw = 0, enc = 0;
  for (size_t i = 0; i < m->ntensors; i++) {
    src += m->tensors[i].source_bytes;
    raw += m->tensors[i].raw_bytes;
    enc += m->tensors[i].L.length;
  }
  NWC_TRY(prepare(db, "SELECT 1 FROM models WHERE name = ?", &st));
  sqlite3_bind_text(st, 1, m->name, -1, SQLITE_STATIC);
  int taken = sqlite3_step(st) == SQLITE_ROW;
  sqlite3_finalize(st);
  NWC_RETURN_IF(taken, -EEXIST, "model '%s' already exists", m->name);
  NWC_TRY(prepare(db, "INSERT INTO models(name, created, elem_option, layout_option, tensors,"
                      " source_bytes, raw_bytes, nwc_bytes) VALUES(?,?,?,?,?,?,?,?)", &st));
  sqlite3_bind_text(st, 1, m->name, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, (sqlite3_int64)time(NULL));
  sqlite3_bind_int64(st, 3, m->elem_opt);
  sqlite3_bind_int64(st, 4, m->layout_opt);
  sqlite3_bind_int64(st, 5, (sqlite3_int64)m->ntensors);
  sqlite3_bind_int64(st, 6, (sqlite3_int64)src);
  sqlite3_bind_int64(st, 7, (sqlite3_int64)raw);
  sqlite3_bind_int64(st, 8, (sqlite3_int64)enc);
  int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : sql_fail(db, "insert model");
  sqlite3_finalize(st);
  NWC_TRY(rc);
  int64_t model_id = sqlite3_last_insert_rowid(db);
  NWC_TRY(prepare(db, "INSERT INTO sources VALUES(?,?,?,?,?,?)", &st));
  for (size_t i = 0; rc == 0 && i < m->nsources; i++) {
    const nwc__pub_source *s = &m->sources[i];
    sqlite3_reset(st);
    sqlite3_bind_int64(st, 1, model_id);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)i);
    sqlite3_bind_text(st, 3, s->path, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)s->size);
    sqlite3_bind_int64(st, 5, s->mtime_ns);
    sqlite3_bind_int64(st, 6, (sqlite3_int64)s->header_xxh3);
    if (sqlite3_step(st) != SQLITE_DONE) rc = sql_fail(db, "insert source");
  }
  sqlite3_finalize(st);
  NWC_TRY(rc);
  NWC_TRY(prepare(db, "INSERT INTO containers VALUES(?,?,?,?,?)", &st));
  sqlite3_bind_int64(st, 1, (sqlite3_int64)m->container);
  sqlite3_bind_int64(st, 2, model_id);
  sqlite3_bind_int64(st, 3, (sqlite3_int64)m->container_size);
  sqlite3_bind_int64(st, 4, (sqlite3_int64)m->container_header_xxh3);
  sqlite3_bind_int64(st, 5, m->container_version);
  rc = sqlite3_step(st) == SQLITE_DONE ? 0 : sql_fail(db, "insert container");
  sqlite3_finalize(st);
  NWC_TRY(rc);
  NWC_TRY(prepare(db, "INSERT INTO tensors(model_id, idx, name, shape, source_idx, source_dtype,"
                      " conversion, scale_tensor, elem, layout, rows, cols, source_bytes,"
                      " raw_bytes, nwc_bytes, container_id, offset, length, chunk_size,"
                      " checksums, format_version, psym, tab_bits, nblocks, data_bytes,"
                      " raw_plane_bytes, off_bases, off_hdr, off_data, off_raw, off_scale,"
                      " bias_tensor)"
                      " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                  &st));
  for (size_t i = 0; rc == 0 && i < m->ntensors; i++)
    rc = publish_tensor(db, st, model_id, i, m->container, &m->tensors[i]);
  sqlite3_finalize(st);
  return rc;
}

int nwc__catalog_publish(sqlite3 *db, const nwc__pub_model *m) {
  NWC_TRY(sql_exec(db, "BEGIN IMMEDIATE"));
  int rc = publish_body(db, m);
  if (rc == 0) rc = sql_exec(db, "COMMIT");
  if (rc < 0) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  return rc;
}

/* ---- reading rows back ---------------------------------------------------------------------- */

static char *col_strdup(sqlite3_stmt *st, int i) {
  const unsigned char *s = sqlite3_column_text(st, i);
  return s ? strdup((const char *)s) : NULL;
}

void nwc_model_info_free(nwc_model_info *m, size_t n) {
  if (!m) return;
  for (size_t i = 0; i < n; i++) free(m[i].name);
  free(m);
}

static int models_query(sqlite3 *db, const char *model, nwc_model_info **out, size_t *n) {
  sqlite3_stmt *st;
  *out = NULL, *n = 0;
  NWC_TRY(prepare(db, model ? "SELECT id, name, created, verified, tensors, source_bytes,"
                                 " raw_bytes, nwc_bytes, (SELECT count(*) FROM sources WHERE"
                                 " model_id = models.id), elem_option, layout_option FROM models WHERE name = ?"
                               : "SELECT id, name, created, verified, tensors, source_bytes,"
                                 " raw_bytes, nwc_bytes, (SELECT count(*) FROM sources WHERE"
                                 " model_id = models.id), elem_option, layout_option FROM models ORDER BY name",
                  &st));
  if (model) sqlite3_bind_text(st, 1, model, -1, SQLITE_STATIC);
  size_t cap = 0;
  int rc = 0, r;
  while ((r = sqlite3_step(st)) == SQLITE_ROW) {
    if (*n == cap) {
      cap = cap ? 2 * cap : 8;
      nwc_model_info *a = realloc(*out, cap * sizeof *a);
      if (!a) {
        rc = -ENOMEM;
        break;
      }
      *out = a;
    }
    nwc_model_info *m = &(*out)[(*n)++];
    memset(m, 0, sizeof *m);
    m->id = sqlite3_column_int64(st, 0);
    m->name = col_strdup(st, 1);
    m->created = sqlite3_column_int64(st, 2);
    m->verified = sqlite3_column_int64(st, 3);
    m->tensors = (uint64_t)sqlite3_column_int64(st, 4);
    m->source_bytes = (uint64_t)sqlite3_column_int64(st, 5);
    m->raw_bytes = (uint64_t)sqlite3_column_int64(st, 6);
    m->nwc_bytes = (uint64_t)sqlite3_column_int64(st, 7);
    m->nsources = (unsigned)sqlite3_column_int64(st, 8);
    m->elem_option = (unsigned)sqlite3_column_int64(st, 9);
    m->layout_option = (unsigned)sqlite3_column_int64(st, 10);
    if (!m->name) rc = -ENOMEM;
  }
  if (rc == 0 && r != SQLITE_DONE) rc = sql_fail(db, "models");
  sqlite3_finalize(st);
  if (rc < 0) nwc_model_info_free(*out, *n), *out = NULL, *n = 0;
  return rc;
}

int nwc_store_models(nwc_store *s, nwc_model_info **out, size_t *n) {
  NWC_RETURN_IF(!s || !out || !n, -EINVAL, "nwc_store_models: missing argument");
  pthread_mutex_lock(&s->rmu);
  int rc = models_query(s->rdb, NULL, out, n);
  pthread_mutex_unlock(&s->rmu);
  return rc;
}

int nwc_store_model(nwc_store *s, const char *model, nwc_model_info **out) {
  NWC_RETURN_IF(!s || !model || !out, -EINVAL, "nwc_store_model: missing argument");
  size_t n;
  pthread_mutex_lock(&s->rmu);
  int rc = models_query(s->rdb, model, out, &n);
  pthread_mutex_unlock(&s->rmu);
  NWC_TRY(rc);
  NWC_RETURN_IF(n == 0, -ENOENT, "model '%s' does not exist", model);
  return 0;
}

int nwc_store_model_source(nwc_store *s, const char *model, char **label) {
  NWC_RETURN_IF(!s || !model || !label, -EINVAL, "nwc_store_model_source: missing argument");
  *label = NULL;
  sqlite3_stmt *st;
  pthread_mutex_lock(&s->rmu);
  int rc = prepare(s->rdb, "SELECT s.path FROM sources s JOIN models m ON s.model_id = m.id"
                           " WHERE m.name = ? ORDER BY s.idx LIMIT 1", &st);
  if (rc == 0) {
    sqlite3_bind_text(st, 1, model, -1, SQLITE_STATIC);
    int r = sqlite3_step(st);
    if (r == SQLITE_ROW) rc = (*label = col_strdup(st, 0)) ? 0 : -ENOMEM;
    else rc = r == SQLITE_DONE ? nwc__fail(-ENOENT, "model '%s' does not exist", model) : sql_fail(s->rdb, "sources");
    sqlite3_finalize(st);
  }
  pthread_mutex_unlock(&s->rmu);
  return rc;
}

void nwc_tensor_info_free(nwc_tensor_info *t, size_t n) {
  if (!t) return;
  for (size_t i = 0; i < n; i++) {
    free(t[i].model);
    free(t[i].name);
    free(t[i].conversion);
    free(t[i].scale_tensor);
    free(t[i].bias_tensor);
    free(t[i].path);
    free(t[i].checksums);
  }
  free(t);
}

/* Fills *t from a row; the columns are those of TENSOR_COLS. */
#define TENSOR_COLS                                                                              \
  "t.id, m.name, t.name, t.shape, t.source_dtype, t.conversion, t.scale_tensor, t.source_idx, "  \
  "t.elem, t.rows, t.cols, t.source_bytes, t.raw_bytes, t.container_id, t.offset, t.length, "    \
  "t.chunk_size, t.checksums, t.format_version, t.psym, t.tab_bits, t.nblocks, t.data_bytes, "   \
  "t.raw_plane_bytes, t.off_bases, t.off_hdr, t.off_data, t.off_raw, t.off_scale, t.bias_tensor"

static int fill_tensor(nwc_store *s, sqlite3_stmt *st, nwc_tensor_info *t) {
  memset(t, 0, sizeof *t);
  t->id = sqlite3_column_int64(st, 0);
  t->model = col_strdup(st, 1);
  t->name = col_strdup(st, 2);
  const char *shape = (const char *)sqlite3_column_text(st, 3);
  json_t *a = shape ? json_loads(shape, 0, NULL) : NULL;
  int bad = !json_is_array(a) || json_array_size(a) > 8;
  for (size_t i = 0; !bad && i < json_array_size(a); i++)
    t->shape[i] = (uint64_t)json_integer_value(json_array_get(a, i));
  t->ndim = bad ? 0 : (unsigned)json_array_size(a);
  json_decref(a);
  const char *dt = (const char *)sqlite3_column_text(st, 4);
  snprintf(t->dtype, sizeof t->dtype, "%s", dt ? dt : "");
  t->conversion = col_strdup(st, 5);
  t->scale_tensor = col_strdup(st, 6);
  t->source = (unsigned)sqlite3_column_int64(st, 7);
  t->elem = (unsigned)sqlite3_column_int64(st, 8);
  uint64_t *v[] = {&t->rows, &t->cols, &t->source_bytes, &t->raw_bytes, &t->container,
                   &t->offset, &t->length, &t->chunk_size};
  for (int i = 0; i < 8; i++) *v[i] = (uint64_t)sqlite3_column_int64(st, 9 + i);
  int nsum = sqlite3_column_bytes(st, 17);
  const void *sums = sqlite3_column_blob(st, 17);
  t->format_version = (unsigned)sqlite3_column_int64(st, 18);
  const void *psym = sqlite3_column_blob(st, 19);
  int npsym = sqlite3_column_bytes(st, 19);
  t->tab_bits = (unsigned)sqlite3_column_int64(st, 20);
  uint64_t *w[] = {&t->nblocks, &t->data_bytes, &t->raw_plane_bytes, &t->off_bases, &t->off_hdr,
                   &t->off_data, &t->off_raw, &t->off_scale};
  for (int i = 0; i < 8; i++) *w[i] = (uint64_t)sqlite3_column_int64(st, 21 + i);
  t->bias_tensor = col_strdup(st, 29);
  char name[32];
  nwc__container_name(t->container, 0, name);
  size_t plen = strlen(s->dir) + strlen(name) + 16;
  t->path = malloc(plen);
  if (t->path) snprintf(t->path, plen, "%s/containers/%s", s->dir, name);
  if (!t->model || !t->name || !t->conversion || !t->path) return -ENOMEM;
  NWC_RETURN_IF(bad || npsym != 16 || !t->chunk_size || t->chunk_size % NWC_STORE_ALIGN ||
                    !t->length || t->length % NWC_STORE_PACK_ALIGN ||
                    t->offset % NWC_STORE_PACK_ALIGN,
                -EBADMSG, "catalog: model '%s' tensor '%s': malformed row", t->model, t->name);
  memcpy(t->psym, psym, 16);
  t->nchunks = nwc__chunks(t->length, t->chunk_size);
  NWC_RETURN_IF((uint64_t)nsum != t->nchunks * 8, -EBADMSG,
                "catalog: model '%s' tensor '%s': %d checksum bytes for %llu chunks", t->model,
                t->name, nsum, (unsigned long long)t->nchunks);
  t->checksums = malloc(t->nchunks * 8);
  if (!t->checksums) return -ENOMEM;
  memcpy(t->checksums, sums, t->nchunks * 8);
  return 0;
}

static int catalog_tensors(nwc_store *s, sqlite3 *db, const char *model, const char *tensor,
                           nwc_tensor_info **out, size_t *n) {
  int64_t mid;
  *out = NULL, *n = 0;
  NWC_TRY(nwc__catalog_model_id(db, model, &mid));
  sqlite3_stmt *st;
  NWC_TRY(prepare(db, tensor ? "SELECT " TENSOR_COLS " FROM tensors t JOIN models m ON"
                                  " m.id = t.model_id WHERE t.model_id = ? AND t.name = ?"
                                : "SELECT " TENSOR_COLS " FROM tensors t JOIN models m ON"
                                  " m.id = t.model_id WHERE t.model_id = ? ORDER BY t.idx",
                  &st));
  sqlite3_bind_int64(st, 1, mid);
  if (tensor) sqlite3_bind_text(st, 2, tensor, -1, SQLITE_STATIC);
  size_t cap = 0;
  int rc = 0, r;
  while ((r = sqlite3_step(st)) == SQLITE_ROW) {
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      nwc_tensor_info *a = realloc(*out, cap * sizeof *a);
      if (!a) {
        rc = -ENOMEM;
        break;
      }
      *out = a;
    }
    rc = fill_tensor(s, st, &(*out)[(*n)++]);
    if (rc < 0) break;
  }
  if (rc == 0 && r != SQLITE_DONE) rc = sql_fail(db, "tensors");
  sqlite3_finalize(st);
  if (rc == 0 && tensor && *n == 0)
    rc = nwc__fail(-ENOENT, "model '%s' has no tensor '%s'", model, tensor);
  if (rc < 0) nwc_tensor_info_free(*out, *n), *out = NULL, *n = 0;
  return rc;
}

/* catalog_tensors on the read connection, its two queries in one read transaction (one
 * snapshot: a model removed between them is not listed as a model without tensors). */
static int read_tensors(nwc_store *s, const char *model, const char *tensor,
                        nwc_tensor_info **out, size_t *n) {
  pthread_mutex_lock(&s->rmu);
  int rc = sql_exec(s->rdb, "BEGIN");
  if (rc == 0) {
    rc = catalog_tensors(s, s->rdb, model, tensor, out, n);
    sqlite3_exec(s->rdb, "COMMIT", NULL, NULL, NULL); /* ends a read: nothing to fail */
  }
  pthread_mutex_unlock(&s->rmu);
  return rc;
}

int nwc_store_tensors(nwc_store *s, const char *model, nwc_tensor_info **out, size_t *n) {
  NWC_RETURN_IF(!s || !model || !out || !n, -EINVAL, "nwc_store_tensors: missing argument");
  return read_tensors(s, model, NULL, out, n);
}

int nwc_store_tensor(nwc_store *s, const char *model, const char *tensor, nwc_tensor_info **out) {
  NWC_RETURN_IF(!s || !model || !tensor || !out, -EINVAL, "nwc_store_tensor: missing argument");
  size_t n;
  return read_tensors(s, model, tensor, out, &n);
}
