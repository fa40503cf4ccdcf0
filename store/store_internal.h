/*
 * store_internal.h - what the store's translation units share (not installed): the store handle,
 * the container and blob layouts (docs/store.md, "Container files"), and the catalog calls.
 */
#ifndef NWC_STORE_INTERNAL_H
#define NWC_STORE_INTERNAL_H

#include "nwc.h"
#include "nwc_error.h"
#include "nwc_store.h"

#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>

#define NWC__CONTAINER_HEADER 4096u /* bytes before the first blob */
#define NWC__BLOB_HEADER 128u       /* bytes before a blob's first section */
#define NWC__SECTION_ALIGN 64u      /* alignment of each section inside a blob */
#define NWC__TAB_BITS 12u

struct nwc_store {
  char *dir;        /* as given, made absolute */
  int lockfd;       /* DIR/lock, flock()ed */
  int cdirfd;       /* DIR/containers */
  sqlite3 *db;
  sqlite3 *rdb;     /* a read-only connection for the read calls (models, tensors): WAL lets it
                       read the last commit while db writes, so no reader waits for a writer's
                       commit (its fsync) or for db's mutex */
  unsigned flags;
  uint64_t swept;
  char **swept_files; /* "NAME (why)" for each file the last sweep removed (swept of them) */
  pthread_mutex_t mu; /* recursive; held around every use of db, never while encoding or reading
                         container files, so catalog calls run while an import encodes */
  pthread_mutex_t rmu; /* held around every use of rdb; never taken before mu */
};

static inline void nwc__lock(nwc_store *s) { pthread_mutex_lock(&s->mu); }
static inline void nwc__unlock(nwc_store *s) { pthread_mutex_unlock(&s->mu); }

/* Where each array of a tensor lies inside its blob (offsets from the blob start). */
typedef struct nwc__blob_layout {
  uint64_t off_bases, off_hdr, off_data, off_raw, off_scale; /* off_scale 0: none */
  uint64_t end;    /* end of the last section */
  uint64_t length; /* packed: end rounded up to NWC_STORE_PACK_ALIGN (import adds the zeros to
                      its run's end to the run's last blob); else to NWC_STORE_ALIGN */
  int packed;      /* end rounded up to NWC_STORE_PACK_ALIGN is below NWC_STORE_PACK_MAX */
} nwc__blob_layout;

_Static_assert(NWC_STORE_PACK_MAX + NWC_STORE_ALIGN <= NWC_STORE_CHUNK,
               "a packed blob, the zeros after its run included, is one checksum chunk");

/* ---- container.c ---- */

/* "%016llx.nwc" (tmp: ".tmp") into buf[32]: the name of container cid's file in DIR/containers
 * (the catalog names it, import writes it, store.c sweeps and removes it). */
static inline void nwc__container_name(uint64_t cid, int tmp, char buf[32]) {
  snprintf(buf, 32, "%016llx.%s", (unsigned long long)cid, tmp ? "tmp" : "nwc");
}
/* The 4096-byte container header for container cid. */
void nwc__container_header(uint64_t cid, uint8_t hdr[NWC__CONTAINER_HEADER]);
/* Checks a container header read from path; -EBADMSG (detail names path) if it is not cid's. */
int nwc__container_header_check(const uint8_t *hdr, uint64_t cid, const char *path);
void nwc__blob_layout_of(const nwc_tensor *t, nwc__blob_layout *L);
/* Writes bytes [from, upto) of t's blob (header, sections, zero padding) to dst, whose byte 0 is
 * blob byte `from`.  A section of t that is NULL, or already at its place in dst, is left to the
 * caller. */
void nwc__blob_write(const nwc_tensor *t, uint64_t cid, const nwc__blob_layout *L, uint64_t from,
                     uint64_t upto, uint8_t *dst);
static inline uint64_t nwc__chunks(uint64_t length, uint64_t chunk) {
  return (length + chunk - 1) / chunk;
}
/* Reads len bytes at off from fd (-EIO on a short read). */
int nwc__pread_full(int fd, void *buf, uint64_t len, uint64_t off);

/* ---- catalog.c ---- */

/* Opens (creating if asked) DIR/catalog.sqlite, sets WAL / synchronous=FULL / foreign keys, and
 * migrates it to NWC_STORE_SCHEMA_VERSION (writer mode). */
int nwc__catalog_open(const char *path, int create, int rdonly, sqlite3 **out);
/* Applies the migrations that take an empty database to schema version v (tests use this to
 * build catalogs of every earlier version). */
int nwc__catalog_init_at(sqlite3 *db, int version);
int nwc__catalog_version(sqlite3 *db);
/* A fresh container id (a counter bumped in its own transaction, never reused). */
int nwc__catalog_next_container(sqlite3 *db, uint64_t *cid);
/* 1 if container cid is referenced by the catalog, 0 if not, negative on error. */
int nwc__catalog_has_container(sqlite3 *db, uint64_t cid);
/* SQLite's integrity_check and foreign_key_check of the catalog: each problem to cb as a line;
 * returns how many. */
typedef void (*nwc__catalog_problem_fn)(void *ctx, const char *what);
unsigned nwc__catalog_check(sqlite3 *db, nwc__catalog_problem_fn cb, void *ctx);
/* The id the next import's container will get (meta 'next_container'), without taking it. */
int nwc__catalog_peek_next(sqlite3 *db, uint64_t *next);
int nwc__catalog_model_id(sqlite3 *db, const char *model, int64_t *id);
int nwc__catalog_set_verified(sqlite3 *db, int64_t model_id, int64_t when);
/* Container ids of a model (malloc'ed array, caller frees). */
int nwc__catalog_containers(sqlite3 *db, int64_t model_id, uint64_t **ids, uint64_t **sizes,
                            size_t *n);
/* Removes the model's rows in one synchronous transaction. */
int nwc__catalog_delete_model(sqlite3 *db, int64_t model_id);

/* What import publishes. */
typedef struct nwc__pub_source {
  const char *path;
  uint64_t size;
  int64_t mtime_ns;
  uint64_t header_xxh3;
} nwc__pub_source;

typedef struct nwc__pub_tensor {
  const char *name;
  unsigned ndim;
  uint64_t shape[8];
  const char *dtype, *conversion, *scale_tensor, *bias_tensor;
  unsigned source;
  unsigned elem;
  uint64_t rows, cols, source_bytes, raw_bytes;
  uint64_t offset, length;
  uint64_t *checksums;
  uint8_t psym[16];
  uint64_t nblocks, data_bytes, raw_plane_bytes;
  nwc__blob_layout L;
} nwc__pub_tensor;

typedef struct nwc__pub_model {
  const char *name;
  unsigned elem_opt, layout_opt;
  const nwc__pub_source *sources;
  size_t nsources;
  const nwc__pub_tensor *tensors;
  size_t ntensors;
  uint64_t container, container_size, container_header_xxh3;
  unsigned container_version;
} nwc__pub_model;

/* One transaction: the model, its sources, its container, its tensors.  -EEXIST if the name is
 * taken (checked inside the transaction). */
int nwc__catalog_publish(sqlite3 *db, const nwc__pub_model *m);

/* ---- store.c ---- */

/* fsync of the containers directory. */
int nwc__store_sync_dir(nwc_store *s);
/* The end of a new container written as DIR/containers/ID.tmp (fd, open on it, closed here), for
 * import and receive: with rc 0 (the writer's status), fsync of the file, rename to ID.nwc, fsync
 * of the directory, then publish(ctx), the catalog's transaction; on any failure, rc's included,
 * the file is removed, so that only a published container stays.  Returns the first failure. */
int nwc__container_finish(nwc_store *s, uint64_t cid, int fd, int rc, int (*publish)(void *ctx), void *ctx);

#endif
