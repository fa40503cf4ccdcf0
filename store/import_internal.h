/*
 * import_internal.h - what the files of the import share (not installed): the import's state
 * (imp), its tensors (job) and source files, the writer thread's queue, and the calls between
 * the phases.  import.c describes the phases; import_plan.c plans, import_encode.c encodes into
 * blobs, import_write.c writes them to the container file, import_source.c reads and converts
 * the source tensors.
 */
#ifndef NWC_IMPORT_INTERNAL_H
#define NWC_IMPORT_INTERNAL_H

#include "encode_internal.h" /* the layout-0 encoder in steps (nwc__enc_*) */
#include "safetensors.h"
#include "store_internal.h"

#include <pthread.h>

typedef struct src_file {
  const char *label; /* path or name used in messages and recorded in the catalog */
  int fd;            /* tensor bytes are pread from it (never mapped: no SIGBUS if it shrinks) */
  nwc_st_file *f;    /* its header (nwc_st_read_fd) */
  uint64_t size;
  int64_t mtime_ns;
  uint64_t header_xxh3;
} src_file;

enum conv { CONV_NONE, CONV_F16, CONV_F32, CONV_F64, CONV_E5M2 };

/* A buffer reused from tensor to tensor; busy while the writer thread has a write from it
 * queued. */
typedef struct wbuf {
  uint8_t *p;
  uint64_t cap;
  int busy;
} wbuf;

/* An encoder's buffers: two for blobs (one is filled while the other is written), the source,
 * the BF16 conversion. */
typedef struct wbufs {
  wbuf blob[2], src, conv;
} wbufs;

/* A write for the writer thread: len bytes at p to file offset off, for tensor j; then
 * *busy = 0. */
typedef struct wreq {
  const uint8_t *p;
  uint64_t len, off;
  const struct job *j;
  int *busy;
} wreq;

typedef struct job {
  const nwc_st_tensor *st;
  unsigned source;
  enum conv conv;
  int quantize;                 /* BF16 -> fp8 per row */
  const nwc_st_tensor *scale;   /* F8_E4M3: companion scale tensor */
  unsigned scale_source;
  int fold;                     /* fold the companion into the per-row scale */
  char conversion[80];
  nwc__pub_tensor pub;
} job;

/* A tensor set aside by the plan (not stored), and its source file. */
typedef struct skip_ref {
  const nwc_st_tensor *st;
  unsigned source;
} skip_ref;

typedef struct imp {
  nwc_store *s;
  const char *model;
  nwc_import_opts o;
  src_file *src;
  size_t nsrc;
  job *jobs;
  size_t njobs;
  skip_ref *skips; /* in source order */
  size_t nskips;
  size_t *order;
  uint64_t total;
  /* encode phase */
  int fd, dfd;                  /* the file, buffered; and O_DIRECT (-1: not taken) */
  wreq *wq;                     /* a ring of wq_cap writes, wq_len of them from wq_head on */
  size_t wq_cap, wq_head, wq_len;
  int writer_stop;
  wbuf *slots;                  /* nslots chunk buffers of NWC_STORE_CHUNK bytes */
  unsigned nslots;
  uint64_t cid, file_end;
  /* The run of packed blobs being filled (import_encode.c, pack_add): in pack[pack_cur] (the
   * other buffer may be queued for writing), pack_used bytes of it, the blobs of pack_jobs. */
  wbuf pack[2];
  unsigned pack_cur;
  uint64_t pack_used;
  struct job **pack_jobs;
  size_t pack_n, pack_cap;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  size_t next;
  unsigned running;
  uint64_t done;
  int err, cancel;
  char errmsg[1024];
} imp;

/* The encoder's read callback: bytes [off, off + len) of one tensor (nwc__enc_read_fn). */
typedef struct part_src {
  const src_file *sf;
  const nwc_st_tensor *st;
} part_src;

/* ---- import_source.c: the source tensors' bytes and values ---------------------------------- */

/* Element i of a float tensor (F32, F16, BF16 or F8_E5M2) at possibly unaligned p. */
float nwc__imp_load_float(const char *dtype, const uint8_t *p, uint64_t i);
/* Element i of an F64 tensor as BF16, rounded once to nearest even. */
uint16_t nwc__imp_f64_to_bf16(const uint8_t *p, uint64_t i);
/* A failed read of tensor st's bytes as the import reports it (-EIO becomes -EBADMSG: did the
 * file shrink?). */
int nwc__imp_read_error(const src_file *sf, const nwc_st_tensor *st, int rc);
/* Reads a tensor's bytes from its source file into dst; -EBADMSG (detail) if they are not there. */
int nwc__imp_read_tensor(const src_file *sf, const nwc_st_tensor *st, void *dst);
/* The encoder's read callback (nwc__enc_read_fn) on a part_src. */
int nwc__imp_read_part(void *ctx, uint64_t off, uint64_t len, void *dst);
/* The per-row companion scale of an F8_E4M3 tensor as floats (malloc'ed into *out). */
int nwc__imp_read_scale(const imp *im, const job *j, float **out);

/* ---- import_write.c: the writer thread ------------------------------------------------------ */

/* The writer thread (pthread_create with im): writes the queue until writer_stop and empty. */
void *nwc__imp_writer(void *arg);
/* Queues a write (im->mu held); *busy stays set until it is done. */
void nwc__imp_enqueue(imp *im, const uint8_t *p, uint64_t len, uint64_t off, const job *j,
                      int *busy);
/* Waits (im->mu held) until no write is pending from b. */
void nwc__imp_wbuf_wait(imp *im, wbuf *b);
/* Records the import's first error and its detail (im->mu held); 0 and later errors change
 * nothing. */
void nwc__imp_set_error(imp *im, int rc);

/* ---- import_encode.c, import_plan.c: the phases ---------------------------------------------- */

/* The encode phase: every planned tensor into its blob in the open container file. */
int nwc__imp_encode_all(imp *im);
/* The plan phase: the sources (and index x, which may be NULL) checked and turned into jobs. */
int nwc__imp_plan(imp *im, const nwc_st_index *x, const char *index_label);

#endif /* NWC_IMPORT_INTERNAL_H */
