/*
 * nwc_cuda.h - libnwc-cuda: compute in your own CUDA stream on nwcd's device copies.
 *
 *   nwc_client *c;                      (libnwc-client: nwc_client.h)
 *   nwc_client_connect(NULL, &c);
 *   cudaSetDevice(0);
 *   nwc_cuda_map *m;
 *   nwc_cuda_map_model(c, "qwen3-4b", 0, &m);          one copy on cuda:0 for every process
 *   const nwc_cuda_tensor *w = nwc_cuda_find(m, "model.layers.0.mlp.up_proj.weight");
 *   nwc_cuda_matvec(m, w, x, 1, w->k16, NULL, y, NULL, w->rows, stream);   (capturable)
 *   ...
 *   nwc_cuda_unmap(m);
 *
 * nwcd keeps one device copy of each resident tensor per GPU; a map imports those copies into
 * the calling process's current CUDA context (docs/gpu-maps.md: the daemon's memory pool,
 * passed as a file descriptor over its socket, and each copy's export data), so that the
 * kernels of kernels/ run on them in the caller's stream: no copy of the weights per process and
 * no round trip per call.  While a map exists nwcd keeps its tensors resident (evict and remove
 * are refused naming this pid); nwc_cuda_unmap, or the end of the process (kill -9 included),
 * releases them.
 *
 * Conventions (libnwc-client's): 0 or a negative errno; the message of a failure is in
 * nwc_cuda_last_error() (thread-local).  The compute calls only enqueue work on the stream they
 * are given (no allocation, no synchronization), so they can be captured in a CUDA graph; they
 * check their arguments first (-EINVAL for a tensor not of this map, a NULL pointer, a shape the
 * tensor does not have; -ENOTSUP for a layout the kernels lack; -EIO for a CUDA error).  Each map
 * owns one scratch buffer for the matvecs of all its tensors (sized at map time for 8 columns of
 * its largest tensor): the matvec and linear calls of one map must be ordered on the device (one
 * stream, or streams joined by events); dequant and gather use none and may run anywhere.
 * Every layout the kernels support works unchanged, the layouts added later included: the map
 * carries what the kernels dispatch on.
 */
#ifndef NWC_CUDA_H
#define NWC_CUDA_H

#include "nwc_client.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define NWC_CUDA_API __attribute__((visibility("default")))
#else
#define NWC_CUDA_API
#endif

/* The CUDA runtime's own definition (driver_types.h), repeated so that this header needs no CUDA
 * include; a repeated identical typedef is valid C11 and C++. */
typedef struct CUstream_st *cudaStream_t;

typedef struct nwc_cuda_map nwc_cuda_map;

/* What went wrong in this thread's last failing call of this library ("" if none). */
NWC_CUDA_API const char *nwc_cuda_last_error(void);

/* One tensor of a map (valid as long as the map). */
typedef struct nwc_cuda_tensor {
  const char *name;
  unsigned elem;        /* NWC_ELEM(type, layout): type bits 0..3 (0 bf16, 1 fp8), layout 4..7 */
  uint64_t rows, cols;  /* M, K as stored (1-D: 1 x N) */
  uint64_t k16;         /* K rounded up to 16: the row stride of dequant and gather output */
  const void *k;        /* the kernels' view, an nwc_k_tensor (kernels/nwc_kernels.h) of device
                         * pointers into the mapped copy */
  uint64_t bytes;       /* device bytes of the copy (shared with every process that maps it) */
} nwc_cuda_tensor;

/* Maps every tensor of model (nwc_cuda_map_model) or one (nwc_cuda_map_tensor) as nwcd holds it
 * on its device `device` (loaded there first if needed) into the current context, which must be
 * on that GPU (-ENODEV otherwise).  Free with nwc_cuda_unmap.  The map does not depend on c
 * afterwards (c may be freed first).  Errors: those of nwc_client_map_gpu (nwc_client.h), and
 * -EIO when CUDA refuses the import. */
NWC_CUDA_API int nwc_cuda_map_model(nwc_client *c, const char *model, int device,
                                    nwc_cuda_map **out);
NWC_CUDA_API int nwc_cuda_map_tensor(nwc_client *c, const char *model, const char *tensor,
                                     int device, nwc_cuda_map **out);
/* Waits for the map's device, frees what this process imported and releases the daemon's
 * references (NULL is a no-op).  Work enqueued on the map's tensors must be done or abandoned:
 * a CUDA graph that names them must not be launched afterwards. */
NWC_CUDA_API void nwc_cuda_unmap(nwc_cuda_map *m);

/* The map's tensors, in the model's order. */
NWC_CUDA_API size_t nwc_cuda_count(const nwc_cuda_map *m);
NWC_CUDA_API const nwc_cuda_tensor *nwc_cuda_at(const nwc_cuda_map *m, size_t i);
/* The tensor called name, or NULL. */
NWC_CUDA_API const nwc_cuda_tensor *nwc_cuda_find(const nwc_cuda_map *m, const char *name);
/* 1 when this process's access to the copies is read-only (the driver allowed it), 0 when it
 * is read-write (docs/gpu-maps.md says why that can happen and what it means). */
NWC_CUDA_API int nwc_cuda_read_only(const nwc_cuda_map *m);
/* Device bytes of the map's scratch (this process's own; the copies are nwcd's). */
NWC_CUDA_API uint64_t nwc_cuda_scratch_bytes(const nwc_cuda_map *m);

/* Y = W X + bias for ncols (1..8) columns in one pass over the weights (nwc_k_matvec_cols):
 * column c of X at x + c * ldx (device memory, 16-byte aligned, ldx a multiple of 4 and >= k16;
 * layout 0 reads k16 floats of it, of which x[K..k16) must be 0), bias rows floats or NULL; column
 * c of Y to y + c * ldy (fp32) and/or y_bf16 + c * ldy (BF16, nearest even), not both NULL.
 * fp8 tensors apply their row scales. */
NWC_CUDA_API int nwc_cuda_matvec(const nwc_cuda_map *m, const nwc_cuda_tensor *t, const float *x,
                                 unsigned ncols, uint64_t ldx, const float *bias, float *y,
                                 uint16_t *y_bf16, uint64_t ldy, cudaStream_t stream);
/* nwc_cuda_matvec with X in BF16, as engines hold activations (nwc_k_matvec_cols_bf16x): column
 * c at x + c * ldx (device memory, 16-byte aligned, ldx a multiple of 8 and >= K), its first K
 * elements read; 8 columns cost about what one does.  Layouts 1 and 2: -ENOTSUP for layout 0,
 * whose kernels read fp32 x (use nwc_cuda_matvec). */
NWC_CUDA_API int nwc_cuda_matvec_bf16x(const nwc_cuda_map *m, const nwc_cuda_tensor *t, const uint16_t *x,
                                       unsigned ncols, uint64_t ldx, const float *bias, float *y,
                                       uint16_t *y_bf16, uint64_t ldy, cudaStream_t stream);
/* One column, BF16 out: y (rows) = W x + bias; x k16 floats, zero from K on. */
NWC_CUDA_API int nwc_cuda_linear(const nwc_cuda_map *m, const nwc_cuda_tensor *t, const float *x,
                                 const float *bias, uint16_t *y, cudaStream_t stream);
/* The whole tensor as BF16 rows of stride k16 (fp8: unscaled values). */
NWC_CUDA_API int nwc_cuda_dequant(const nwc_cuda_map *m, const nwc_cuda_tensor *t, uint16_t *out,
                                  cudaStream_t stream);
/* Rows [row0, row0 + nrows) of the tensor as nwc_cuda_dequant writes them, row r to
 * out + (r - row0) * k16: a dense weight made piece by piece through a bounded buffer.  row0 a
 * multiple of NWC_CUDA_ROW_ALIGN, nrows a multiple of it or reaching the last row
 * (row0 + nrows == rows), out 16-byte aligned: else -EINVAL.  -ENOTSUP where the kernels have no
 * row range for the tensor's layout and type (as for nwc_cuda_dequant). */
#define NWC_CUDA_ROW_ALIGN 16
NWC_CUDA_API int nwc_cuda_dequant_rows(const nwc_cuda_map *m, const nwc_cuda_tensor *t,
                                       uint64_t row0, uint64_t nrows, uint16_t *out,
                                       cudaStream_t stream);
/* out[i * k16 ..] = row rows[i] for n row indices in device memory (an index >= rows is skipped
 * and its output left as it was). */
NWC_CUDA_API int nwc_cuda_gather(const nwc_cuda_map *m, const nwc_cuda_tensor *t,
                                 const uint64_t *rows, uint64_t n, uint16_t *out,
                                 cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
