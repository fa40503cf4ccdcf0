/*
 * safetensors.h - a checked reader for safetensors files (8-byte little-endian header length,
 * JSON header {name: {dtype, shape, data_offsets}}, then the data), mapped read-only.
 */
#ifndef NWC_SAFETENSORS_H
#define NWC_SAFETENSORS_H

#include "nwc.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NWC_ST_MAX_DIMS 8

typedef struct nwc_st_tensor {
  char *name;          /* as in the file (UTF-8) */
  char dtype[12];      /* "BF16", "F32", ... */
  unsigned dtype_size; /* bytes per element, 0 for a dtype this reader does not know */
  unsigned ndim;
  uint64_t shape[NWC_ST_MAX_DIMS];
  uint64_t numel;
  uint64_t begin, end; /* byte range inside the data section */
} nwc_st_tensor;

typedef struct nwc_st_file {
  const uint8_t *map; /* whole file */
  size_t size;
  uint64_t data_offset; /* 8 + header length */
  size_t count;
  nwc_st_tensor *tensors; /* in header order */
} nwc_st_file;

/* Maps and parses path.  Returns 0, -errno for an I/O error, -EBADMSG for a malformed file
 * (nwc_error_detail says what).  Free with nwc_st_close. */
NWC_EXTERN int nwc_st_open(const char *path, nwc_st_file **out);
/* The same for an open file descriptor (not closed; the mapping outlives it). */
NWC_EXTERN int nwc_st_open_fd(int fd, nwc_st_file **out);
/* Reads only the header of fd with pread (nothing is mapped, so a file truncated later cannot
 * raise SIGBUS): map then holds the first data_offset bytes, size is the file's size, and
 * nwc_st_data must not be used; read tensor bytes from fd at data_offset + begin.  Same checks
 * and errors as nwc_st_open.  Free with nwc_st_close. */
NWC_EXTERN int nwc_st_read_fd(int fd, nwc_st_file **out);
/* Parses an in-memory file (not copied: buf must outlive the result). */
NWC_EXTERN int nwc_st_parse(const uint8_t *buf, size_t size, nwc_st_file **out);
NWC_EXTERN void nwc_st_close(nwc_st_file *f);
/* The tensor called name, or NULL. */
NWC_EXTERN const nwc_st_tensor *nwc_st_find(const nwc_st_file *f, const char *name);
/* The matrix a tensor is stored as: 1-D is 1 x N; n-D drops leading dimensions of size 1 (a
 * [1, 1, 512, 1536] convolution kernel is a 512 x 1536 matrix) and flattens the rest to
 * (d0, product of the others). */
NWC_EXTERN void nwc_st_matrix_shape(const nwc_st_tensor *t, uint64_t *rows, uint64_t *cols);
static inline const void *nwc_st_data(const nwc_st_file *f, const nwc_st_tensor *t) {
  return f->map + f->data_offset + t->begin;
}

/* A sharded model's index (model.safetensors.index.json): which shard holds each tensor. */
typedef struct nwc_st_index {
  size_t nshards;
  char **shards;    /* distinct shard file names, in first-seen order (plain names, no '/') */
  size_t count;
  char **names;     /* tensor names, in weight_map order */
  size_t *shard_of; /* names[i] lives in shards[shard_of[i]] */
} nwc_st_index;

/* Parses an index held in memory (copied).  Returns 0, -EBADMSG (detail says what) or -ENOMEM.
 * Free *out with nwc_st_index_free (NULL is a no-op). */
NWC_EXTERN int nwc_st_index_parse(const uint8_t *buf, size_t size, nwc_st_index **out);
NWC_EXTERN void nwc_st_index_free(nwc_st_index *x);

#ifdef __cplusplus
}
#endif
#endif
