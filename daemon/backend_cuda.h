/*
 * backend_cuda.h - the CUDA backend's entry points (backend_cuda.cu), in plain C types so that
 * backend.c and gpu_staging.c wire them into the nwcd_backend struct without CUDA headers
 * (backend.h includes this one for nwcd_ipc_buf).  The definitions
 * are built only with NWC_WITH_CUDA.
 *
 * A device copy ("dcopy") is an opaque handle made by nwcd_cuda_blob_alloc and freed by
 * nwcd_cuda_free.  Every compute call runs on a stream of its own (a context leased from the
 * device's pool), waits for its own completion event and returns 0 or a
 * negative errno with a detail (nwc_error_detail): -ENOMEM when device memory runs out, -EIO
 * for any other CUDA error (the detail names it), -EINVAL for a bad IPC handle or size.
 */
#ifndef NWCD_BACKEND_CUDA_H
#define NWCD_BACKEND_CUDA_H

#include "nwc.h"
#include "nwc_store.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The number of CUDA devices: 0 and *n >= 1, or -ENODEV (detail: why) when there are none.
 * Sets every device to spin while waiting (cudaDeviceScheduleSpin): call before any other. */
int nwcd_cuda_devices(int *n);
/* Device memory of dev: free and total bytes (cudaMemGetInfo). */
int nwcd_cuda_meminfo(int dev, uint64_t *free_bytes, uint64_t *total_bytes);
/* Bytes dev's copy pool holds reserved beyond its allocations, the live copies
 * (cudaMemPoolAttrReservedMemCurrent - cudaMemPoolAttrUsedMemCurrent): the unused rest of partly
 * used chunks, and what freed copies left that was not given back yet; 0 before dev's first
 * copy. */
int nwcd_cuda_pool_idle(int dev, uint64_t *bytes);
/* Frees dev's idle work contexts (streams, events, work and staging buffers) and gives what its
 * copy pool still keeps back to the device (residency calls it when dev holds no tensor). */
void nwcd_cuda_trim(int dev);
/* A device copy on dev of ti's blob (the catalog's decoder parameters), which the caller fills:
 * *blob gets where its ti->length bytes go (device memory).  The copy is allocated from dev's
 * copy pool and its lookup table, built here in stage (pinned host memory of NWC_TAB_ENTRIES * 4
 * bytes at least, e.g. the ring's side buffer), copied into it, both in the order of stream (a
 * cudaStream_t of dev, e.g. the loader's ring's), which the caller synchronizes before anything
 * else uses the copy or stage.  -ENOMEM when device memory runs out, -EBADMSG for a shape the
 * catalog's block count does not match.  Free with nwcd_cuda_free. */
int nwcd_cuda_blob_alloc(const nwc_tensor_info *ti, int dev, void *stream, void *stage,
                         void **dcopy, void **blob);
/* After the blob's copies were queued on stream without waiting for them (a queued load,
 * nwcd_load_to_device): records the blob's arrival there, and every later use of the copy (a
 * request's stream, the free) waits for it on the device.  On failure it waits for stream. */
int nwcd_cuda_blob_queued(void *dcopy, void *stream);
/* After the blob is in place (or queued: nwcd_cuda_blob_queued): points the copy's arrays at its
 * sections (nothing waits: a queued load's lane goes on to its next tensor). */
void nwcd_cuda_blob_finish(void *dcopy, const nwc_tensor_info *ti);
/* The copy's per-row scales (rows floats; it has them) into host out, after its arrival. */
int nwcd_cuda_scales(const void *dcopy, float *out);
/* Device bytes a copy holds. */
uint64_t nwcd_cuda_copy_size(const void *dcopy);
void nwcd_cuda_free(void *dcopy);
/* GPU maps (docs/gpu-maps.md): the descriptor of dev's copy pool, exported once (shareable
 * through POSIX file descriptors; the backend keeps it: send it, do not close it) and the
 * pool's id, and the device's UUID (cudaDeviceProp.uuid); -ENOTSUP with the reason where the device's pools cannot be shared. */
int nwcd_cuda_share_pool(int dev, int *fd, uint64_t *pool_id, uint8_t uuid[16]);
/* Waits for the copy's blob to arrive, then its cudaMemPoolPtrExportData (64 bytes) into data,
 * its allocation's size and the blob's offset in it (the lookup table is at 0). */
int nwcd_cuda_export(const void *dcopy, uint8_t data[64], uint64_t *bytes, uint64_t *blob_off);
/* BF16 rows of the whole tensor into host out, row stride K16. */
int nwcd_cuda_dequant(const void *dcopy, uint16_t *out);
/* Rows rows[0..n) (each < M: the caller checked) into host out, row stride K16. */
int nwcd_cuda_gather(const void *dcopy, const uint64_t *rows, uint64_t n, uint16_t *out);
/* Y[c * ldy ..] = W X[c * ldx ..] for ncols columns (host arrays; ldx >= K16, X zero padded):
 * the columns are copied into mapped pinned memory, read from there by one kernel and run as
 * back-to-back launches on one stream (the kernels take one right-hand side each), which write
 * Y into mapped pinned memory; from the second call on the same tensor, columns and context this
 * is one CUDA graph launch. */
int nwcd_cuda_matvec(const void *dcopy, const float *X, unsigned ncols, size_t ldx, float *Y,
                     size_t ldy);
/* The same with x and y in a client's shared region (host memory nwcd maps): its first window
 * bytes at region are registered with CUDA (mapped) for owner at its first call and stay so
 * until nwcd_cuda_forget(owner), so that the kernels read x from the region and write y
 * into it, no host copy.  x: ncols dense columns of K floats at region + x_off; y: ncols columns
 * of M floats at region + y_off (4-aligned); both inside the window (the caller checked).
 * -EAGAIN (detail: why) when CUDA cannot register the region: the caller copies instead. */
int nwcd_cuda_matvec_shared(const void *owner, void *region, uint64_t window, const void *dcopy,
                            uint64_t x_off, unsigned ncols, uint64_t y_off);

/* CUDA IPC (zero copy): a client's device buffer as cudaIpcMemHandle_t bytes, the offset of the
 * buffer inside that allocation and its size in bytes.  The daemon opens the handle on the
 * copy's device, keeps it open for the owner (the client's connection: at most 16 allocations
 * each, least recently used closed first) until nwcd_cuda_forget(owner), and checks every
 * request's offset + bytes against the allocation's real size. */
typedef struct nwcd_ipc_buf {
  uint8_t handle[64];
  uint64_t off, bytes;
} nwcd_ipc_buf;
/* y = scale * (W x) + bias (bias: M host floats or NULL) for ncols columns of K floats in the
 * client's x, into its y (float, or BF16 when bf16); ev (64 bytes of cudaIpcEventHandle_t, or
 * NULL): the daemon's stream waits for it before reading x.  Returns when y is written. */
int nwcd_cuda_matvec_ipc(const void *owner, const void *dcopy, const nwcd_ipc_buf *x,
                         const nwcd_ipc_buf *y, unsigned ncols, float scale, const float *bias,
                         int bf16, const uint8_t *ev);
/* The whole tensor, dense rows x cols (no K16 padding), BF16 or float, into the client's buffer. */
int nwcd_cuda_dequant_ipc(const void *owner, const void *dcopy, const nwcd_ipc_buf *out, int bf16,
                          const uint8_t *ev);
/* Drops what the backend keeps for owner (its connection has ended, no request of it runs): closes
 * the allocations opened for it, unregisters its shared region. */
void nwcd_cuda_forget(const void *owner);

#ifdef __cplusplus
}
#endif
#endif
