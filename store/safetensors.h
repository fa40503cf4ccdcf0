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
/* Parses an in-memory file (not copied: buf must outlive the result). */
NWC_EXTERN int nwc_st_parse(const uint8_t *buf, size_t size, nwc_st_file **out);
NWC_EXTERN void nwc_st_close(nwc_st_file *f);
/* The tensor called name, or NULL. */
NWC_EXTERN const nwc_st_tensor *nwc_st_find(const nwc_st_file *f, const char *name);
static inline const void *nwc_st_data(const nwc_st_file *f, const nwc_st_tensor *t) {
  return f->map + f->data_offset + t->begin;
}

#ifdef __cplusplus
}
#endif
#endif
