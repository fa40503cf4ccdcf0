/*
 * nwc_store.h - the store: a directory of container files and a SQLite catalog (docs/store.md).
 *
 *   DIR/catalog.sqlite            the catalog (WAL mode; commits that publish or remove a model
 *                                 are synchronous=FULL)
 *   DIR/lock                      flock()ed: one writer (or several readers) per store
 *   DIR/containers/ID.nwc         container files, ID = 16 lowercase hex digits of the container id
 *   DIR/containers/ID.tmp         a container being written (removed at the next open if left)
 *
 * File names come from ids only, never from model or tensor names.  A container file is a
 * 4096-byte header followed by tensor blobs that tile it.  A blob of NWC_STORE_PACK_MAX bytes or
 * more starts on a 4096-byte boundary and is padded to one, so that a loader can read it with
 * O_DIRECT into an aligned buffer; smaller blobs are packed, several to a page, each at a
 * multiple of NWC_STORE_PACK_ALIGN (docs/store.md, "Packed blobs"), and read through the page
 * cache.  Every blob is covered by XXH3-64 checksums of its 1 MiB chunks (the last one the tail,
 * padding included), kept in the catalog; every read path here checks them.
 *
 * Import is atomic: blobs are written to ID.tmp, fsynced, renamed to ID.nwc, the directory
 * fsynced, and then one SQLite transaction publishes the model.  Removal is the reverse (the
 * transaction first, then the files).  nwc_store_open() in writer mode removes whatever a crash
 * left behind: *.tmp files and containers no catalog row references.
 *
 * Conventions as in nwc.h: 0 or a negative errno, nwc_error_detail() names the file, the tensor
 * and what was wrong.  A store handle may be used from several threads: catalog access is
 * serialized by a lock that is not held while an import encodes or while tensors are read or
 * verified, so listing, reading and verifying go on while an import runs (nwcd's case).
 */
#ifndef NWC_STORE_H
#define NWC_STORE_H

#include "nwc.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* ssize_t */

#ifdef __cplusplus
extern "C" {
#endif

#define NWC_STORE_ALIGN 4096u          /* offset and length alignment of a large blob (O_DIRECT) */
#define NWC_STORE_PACK_ALIGN 64u       /* offset and length alignment of every blob */
#define NWC_STORE_PACK_MAX (64u << 10) /* blobs shorter than this (rounded to 64) are packed */
#define NWC_STORE_CHUNK (1u << 20)     /* checksum chunk size */
#define NWC_STORE_SCHEMA_VERSION 4     /* catalog schema this build writes */
#define NWC_CONTAINER_VERSION 2        /* container file format this build writes (reads 1, 2) */
#define NWC_MODEL_NAME_MAX 128
#define NWC_TENSOR_NAME_MAX 1023 /* bytes: the most the protocol carries (NWC_PROTO_NAME_MAX - 1) */

typedef struct nwc_store nwc_store;

enum nwc_store_flags {
  NWC_STORE_CREATE = 1, /* create DIR and an empty catalog if missing */
  NWC_STORE_RDONLY = 2, /* shared lock, no cleanup, no writes (import/remove return -EROFS) */
  NWC_STORE_DISCARD = 4, /* writer: delete container files the catalog does not explain */
};

/* Opens (or with NWC_STORE_CREATE creates) the store in dir, migrates its catalog forward, and
 * (writer mode) removes crash leftovers.  -EBUSY if another process holds the store's lock in a
 * conflicting mode, -ENOENT if missing and not CREATE, -EBADMSG for a catalog newer than this
 * build or not an nwc catalog, -EUCLEAN (writer mode) when containers/ holds container files
 * that the catalog does not explain (ids at or past its next container id: a catalog that was
 * lost, emptied or replaced by an older one), unless NWC_STORE_DISCARD, which deletes them.
 * Free with nwc_store_close. */
NWC_EXTERN int nwc_store_open(const char *dir, unsigned flags, nwc_store **out);
/* Closes the catalog and releases the lock; NULL is a no-op. */
NWC_EXTERN void nwc_store_close(nwc_store *s);
/* Files the last open's cleanup removed (temporary and unreferenced containers). */
NWC_EXTERN uint64_t nwc_store_swept(const nwc_store *s);
/* The i-th of them, i < nwc_store_swept(s): "containers/NAME (why it was removed)", owned by
 * the store; NULL past the end. */
NWC_EXTERN const char *nwc_store_swept_file(const nwc_store *s, uint64_t i);
/* The catalog's schema version (after migration: NWC_STORE_SCHEMA_VERSION). */
NWC_EXTERN int nwc_store_schema_version(nwc_store *s);

/* 1 if name is a valid model name ([A-Za-z0-9][A-Za-z0-9._-]{0,127}), else 0. */
NWC_EXTERN int nwc_model_name_valid(const char *name);
/* 1 if name is a valid tensor name (non-empty valid UTF-8 without control characters, at most
 * NWC_TENSOR_NAME_MAX bytes), else 0. */
NWC_EXTERN int nwc_tensor_name_valid(const char *name);

/* ---- import ------------------------------------------------------------------------------- */

/* Progress: bytes of source tensor data encoded so far, of total.  Called on the thread that
 * called import (never from a worker), at least once at the start and once at the end; return
 * non-zero to cancel (import then returns -ECANCELED and writes nothing). */
typedef int (*nwc_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* A tensor that an import left out: well-formed, but of a dtype nwc does not store (the integer
 * and boolean dtypes: BOOL, U8, I8, U16, I16, U32, I32, U64, I64) or empty (a 0 in its shape).
 * The pointers are valid during the callback only. */
typedef struct nwc_import_skip {
  const char *file;      /* the source file, as the import labels it */
  const char *name;      /* as in the file */
  const char *dtype;     /* "I64", ... */
  unsigned ndim;
  const uint64_t *shape; /* ndim dimensions */
} nwc_import_skip;

/* Called once per skipped tensor, in source order, on the thread that called import, after the
 * model is published (never for an import that fails). */
typedef void (*nwc_skip_fn)(void *ctx, const nwc_import_skip *t);

/* The layout a tensor of that element type and shape gets under the import option `layout`: the
 * option itself, or for NWC_LAYOUT_AUTO layout 2 for a BF16 matrix (2 or more dimensions) of at
 * least 16 rows and layout 0 for the rest (fp8, vectors and matrices of a few rows, for which a
 * 16-row group of layout 2 would be mostly fillers). */
unsigned nwc_import_layout(unsigned layout, unsigned type, unsigned ndim, uint64_t rows);

typedef struct nwc_import_opts {
  unsigned elem;    /* NWC_ELEM_BF16: keep source precision (F8_E4M3 stays fp8);
                       NWC_ELEM_FP8: quantize the float tensors of 2 or more dims to fp8 per
                       output row (nwc_quantize_fp8); 1-D tensors stay BF16 */
  unsigned layout;  /* codec layout 0..14, passed through (the codec says -ENOTSUP if missing),
                       or NWC_LAYOUT_AUTO: per tensor (nwc_import_layout) */
  unsigned threads; /* encoder threads; 0 = all online cores */
  nwc_progress_fn progress;
  void *progress_ctx;
  unsigned strict;  /* 0: tensors nwc does not store are skipped (nwc_import_skip) and reported
                       through skipped; 1: all or nothing, the first of them fails the import */
  nwc_skip_fn skipped; /* may be NULL */
  void *skipped_ctx;
} nwc_import_opts;

/* Imports path as model: a .safetensors file, or a sharded model's index (a name ending in
 * ".json", e.g. model.safetensors.index.json, whose shards are read from its directory).
 * Every floating-point tensor is stored (BF16, F8_E4M3 as they are; F16, F32, F64 rounded to
 * BF16, F8_E5M2 widened to BF16 exactly); the others are skipped (nwc_import_skip) unless
 * opts->strict.  opts may be NULL (bf16, layout 0, all cores, no progress, skipping).  On any
 * error nothing is published and no file is left behind.  -EEXIST if the model exists, -EINVAL
 * for a bad name or option, -EBADMSG for a malformed file (a bad size or an unknown dtype, of a
 * tensor that would be skipped too), -ENOTSUP when no tensor can be stored or, strict, when one
 * cannot. */
NWC_EXTERN int nwc_store_import(nwc_store *s, const char *model, const char *path,
                                const nwc_import_opts *opts);

/* One source file given as an open descriptor (how nwcd receives them over SCM_RIGHTS). */
typedef struct nwc_import_file {
  const char *name; /* file name as the index names it (or any label for a single file) */
  int fd;           /* open for reading; not closed */
} nwc_import_file;

/* The same from descriptors: index_fd < 0 imports files[0] (nfiles must be 1); otherwise
 * index_fd is the index and files must hold every shard it names (extra files are an error). */
NWC_EXTERN int nwc_store_import_fds(nwc_store *s, const char *model, int index_fd,
                                    const nwc_import_file *files, size_t nfiles,
                                    const nwc_import_opts *opts);

/* Removes a model: one transaction, then its container files.  -ENOENT if it does not exist. */
NWC_EXTERN int nwc_store_remove(nwc_store *s, const char *model);

/* ---- the catalog -------------------------------------------------------------------------- */

typedef struct nwc_model_info {
  int64_t id;
  char *name;
  int64_t created;        /* unix seconds */
  int64_t verified;       /* unix seconds of the last clean nwc_store_verify, 0 if never */
  uint64_t tensors;
  uint64_t source_bytes;  /* tensor data bytes in the source files */
  uint64_t raw_bytes;     /* bytes the tensors take as stored elements (BF16 2, fp8 1 per weight) */
  uint64_t nwc_bytes;     /* bytes of their blobs in the containers */
  unsigned nsources;      /* source files */
  unsigned elem_option;   /* the import's options (nwc_import_opts): elem, layout */
  unsigned layout_option;
} nwc_model_info;

/* All models by name.  *out is an array of *n (free with nwc_model_info_free(*out, *n)). */
NWC_EXTERN int nwc_store_models(nwc_store *s, nwc_model_info **out, size_t *n);
/* One model; -ENOENT if absent.  Free with nwc_model_info_free(out, 1). */
NWC_EXTERN int nwc_store_model(nwc_store *s, const char *model, nwc_model_info **out);
NWC_EXTERN void nwc_model_info_free(nwc_model_info *m, size_t n);
/* The model's first source: the file it was imported from as the import named it, or where it
 * was received from (nwc_store_receive_commit's source).  *label malloc'ed; -ENOENT if absent. */
NWC_EXTERN int nwc_store_model_source(nwc_store *s, const char *model, char **label);

/* Everything the catalog holds about one stored tensor: enough to find, check and decode it. */
typedef struct nwc_tensor_info {
  int64_t id;
  char *model, *name;            /* name as in the source file */
  unsigned ndim;
  uint64_t shape[8];             /* source shape */
  char dtype[12];                /* source dtype: BF16, F16, F32, F64, F8_E4M3, F8_E5M2 */
  char *conversion;              /* what was done, e.g. "none", "f32->bf16 rne", "bf16->fp8 row" */
  char *scale_tensor;            /* F8_E4M3 source: companion scale tensor's name, or NULL */
  char *bias_tensor;             /* "P.bias" for a tensor "P.weight" (any P, "weight" at the end)
                                    when that is 1 x rows; NULL otherwise */
  unsigned source;               /* index of the source file (shard) in the model */
  unsigned elem;                 /* NWC_ELEM(type, layout) */
  uint64_t rows, cols; /* as encoded: 1-D is 1 x N, more dims (d0, rest) after leading 1s */
  uint64_t source_bytes;         /* bytes in the source file */
  uint64_t raw_bytes;            /* rows * cols * element size as stored */
  char *path;                    /* absolute path of the container file */
  uint64_t container;            /* container id */
  uint64_t offset, length;       /* blob in the container: both multiples of
                                    NWC_STORE_PACK_ALIGN; of NWC_STORE_ALIGN too unless the blob
                                    is packed (shorter than NWC_STORE_PACK_MAX + 4096) */
  uint64_t chunk_size;           /* NWC_STORE_CHUNK */
  uint64_t nchunks;              /* ceil(length / chunk_size) */
  uint64_t *checksums;           /* XXH3-64 of each chunk */
  /* decoder parameters (docs/format.md); offsets are from the blob start */
  unsigned format_version;
  uint8_t psym[16];              /* exp_of_rank */
  unsigned tab_bits;             /* lookup table index bits (12) */
  uint64_t nblocks, data_bytes, raw_plane_bytes;
  uint64_t off_bases, off_hdr, off_data, off_raw, off_scale; /* off_scale 0: no per-row scale */
} nwc_tensor_info;

/* The tensors of a model in source order (*out an array of *n; free with
 * nwc_tensor_info_free(*out, *n)).  -ENOENT if the model does not exist. */
NWC_EXTERN int nwc_store_tensors(nwc_store *s, const char *model, nwc_tensor_info **out,
                                 size_t *n);
/* One tensor; -ENOENT if absent.  Free with nwc_tensor_info_free(*out, 1). */
NWC_EXTERN int nwc_store_tensor(nwc_store *s, const char *model, const char *tensor,
                                nwc_tensor_info **out);
NWC_EXTERN void nwc_tensor_info_free(nwc_tensor_info *t, size_t n);

/* ---- reading tensors back ----------------------------------------------------------------- */

/* Reads a tensor's blob (exactly its bytes) into memory (4096-aligned), checks every chunk
 * checksum and the blob header against the catalog, validates it, and fills *t (release with
 * nwc_tensor_release). */
NWC_EXTERN int nwc_store_read(nwc_store *s, const char *model, const char *tensor, nwc_tensor *t);
NWC_EXTERN int nwc_store_read_info(const nwc_tensor_info *ti, nwc_tensor *t);

/* A tensor mapped read-only from its container (checksums verified when mapped). */
typedef struct nwc_store_map nwc_store_map;
/* Maps ti's blob, verifies it, and points *view into the mapping (valid until
 * nwc_store_unmap(*out); do not nwc_tensor_release the view).  The mapping covers the whole pages
 * that hold the blob: for a packed blob, bytes of its neighbours in the container too (this
 * process could open the container anyway).  A container file truncated while
 * mapped raises SIGBUS at the next touch of a page past its new end: only for programs that
 * own the store's files (nwcd does not map them; it reads with nwc_store_read_info). */
NWC_EXTERN int nwc_store_map_info(const nwc_tensor_info *ti, nwc_store_map **out,
                                  nwc_tensor *view);
NWC_EXTERN void nwc_store_unmap(nwc_store_map *m);

/* For loaders that do their own I/O (nwcd's io_uring path): checks chunk i of ti's blob, given
 * as the bytes [i * chunk_size, min(length, (i + 1) * chunk_size)) of the blob.  -EBADMSG names
 * the model, tensor, file and offset on a mismatch. */
NWC_EXTERN int nwc_store_chunk_check(const nwc_tensor_info *ti, uint64_t i, const void *chunk);
/* Builds a borrowed view of a blob read whole into memory (blob holds ti->length bytes, 8-byte
 * aligned at least): checks the blob header against the catalog and validates the tensor, but
 * not the chunk checksums (check those as the chunks arrive). */
NWC_EXTERN int nwc_store_blob_view(const nwc_tensor_info *ti, const void *blob, nwc_tensor *view);

/* ---- transfer: a model's portable form (store/transfer.c; docs/oci.md) -------------------- */

/* A model's config (its catalog rows as JSON) and its container with every container id 0: the
 * same bytes in every store.  Open reads the rows and each blob's header; close frees. */
typedef struct nwc_store_export nwc_store_export;
NWC_EXTERN int nwc_store_export_open(nwc_store *s, const char *model, nwc_store_export **out);
/* The config JSON (owned by e; NULL until a scan has completed: it holds each blob's first chunk's
 * new checksum, which the scan takes) and the portable container's size. */
NWC_EXTERN const char *nwc_store_export_config(const nwc_store_export *e, size_t *len);
NWC_EXTERN uint64_t nwc_store_export_size(const nwc_store_export *e);
/* The portable container in order, a checked chunk at a time, to fn (which returns 0 or a
 * negative errno that stops the scan): every chunk checked against the catalog first. */
NWC_EXTERN int nwc_store_export_scan(nwc_store_export *e,
                                     int (*fn)(void *ctx, const void *p, size_t n), void *ctx);
/* Up to len portable bytes at off into buf: the count, 0 at the end, or a negative errno. */
NWC_EXTERN ssize_t nwc_store_export_read(nwc_store_export *e, uint64_t off, void *buf, size_t len);
NWC_EXTERN void nwc_store_export_close(nwc_store_export *e);

/* Receiving a model as model from its config (untrusted: checked whole at open; -EEXIST if the
 * name is taken) and its portable container, appended in order in pieces of any size: each
 * container chunk is checked against the config as it completes and written to a temporary
 * file (-EBADMSG names the tensor and chunk).  have is the count of bytes taken (where a
 * download cut short resumes).  Commit (all bytes received, their sha256 checked by the caller)
 * gives the container its id, reads every blob back and validates it, and publishes the model
 * with one source, `source` (e.g. the registry reference it came from); close without commit
 * removes the temporary file. */
typedef struct nwc_store_receive nwc_store_receive;
NWC_EXTERN int nwc_store_receive_open(nwc_store *s, const char *model, const void *config,
                                      size_t len, nwc_store_receive **out);
NWC_EXTERN uint64_t nwc_store_receive_size(const nwc_store_receive *r);
NWC_EXTERN uint64_t nwc_store_receive_have(const nwc_store_receive *r);
NWC_EXTERN int nwc_store_receive_write(nwc_store_receive *r, const void *buf, size_t len);
NWC_EXTERN int nwc_store_receive_commit(nwc_store_receive *r, const char *source);
NWC_EXTERN void nwc_store_receive_close(nwc_store_receive *r);

/* ---- verify ------------------------------------------------------------------------------- */

typedef struct nwc_verify_problem {
  const char *model;  /* NULL for a problem of the catalog itself (integrity_check) */
  const char *tensor; /* NULL for a problem of the container file itself (header, size) */
  const char *path;   /* container file (catalog.sqlite for the catalog's own problems) */
  uint64_t offset;    /* file offset of the bad range */
  uint64_t length;    /* its length (a chunk, the header, ...) */
  int err;            /* negative errno */
  const char *what;   /* one line */
} nwc_verify_problem;

typedef void (*nwc_verify_fn)(void *ctx, const nwc_verify_problem *p);

typedef struct nwc_verify_stats {
  uint64_t models, tensors, chunks, bytes, problems;
} nwc_verify_stats;

/* Re-reads every container of model (NULL: all models): the container header and size, every
 * chunk of every blob against its checksum, the blob headers, then decodes every tensor.  Calls
 * cb (may be NULL) for each problem; st (may be NULL) receives counts.  Returns 0 if all is well
 * (and records the time in the model's "verified"), -EBADMSG if any problem was found (the
 * detail line is the first one), -ENOENT for an unknown model, or an I/O error. */
NWC_EXTERN int nwc_store_verify(nwc_store *s, const char *model, nwc_verify_fn cb, void *ctx,
                                nwc_verify_stats *st);

#ifdef __cplusplus
}
#endif
#endif /* NWC_STORE_H */
