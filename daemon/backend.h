/*
 * backend.h - nwcd's compute backends behind one interface (nwcd_backend): where resident copies
 * live and what computes on them.
 *
 *   backend.c        the selector (auto, cpu, cuda) and the cuda backend's table
 *   backend_cpu.c    host copies in memfds and the store/ decoders
 *   gpu_staging.c    the cuda backend's loads: staging rings per device, into device copies
 *   backend_cuda.cu  device copies, streams per request, the kernels, CUDA IPC (backend_cuda.h)
 *
 * Residency (residency.c) decides what is resident where; the backend only makes, frees and
 * computes on copies.
 */
#ifndef NWCD_BACKEND_H
#define NWCD_BACKEND_H

#include "backend_cuda.h" /* nwcd_ipc_buf (declarations only) */
#include "nwc.h"
#include "nwc_store.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct nwcd_load_info;
struct nwcd_host_dst; /* loader.h */

/* What a compute backend provides (cpu, and cuda on top of it).  Every function returns 0 or
 * a negative errno and may be called from any worker thread at once. */
typedef struct nwcd_backend {
  const char *name;
  /* A host copy of ti's blob, loaded (chunks checked, progress as nwcd_load) into fresh memory
   * that is read-only from then on: 0 and *p (4096-aligned), *locked when it is pinned (mlock),
   * *li; or a negative errno with a detail (no memory, a load error), nothing kept.  Free with
   * host_free(p, ti->length, locked). */
  int (*host_load)(const nwc_tensor_info *ti, void **p, bool *locked, struct nwcd_load_info *li);
  void (*host_free)(void *p, size_t n, bool locked);
  /* Copies freed without ever being shared are kept (mapped, populated) as spares that a later
   * host_load of at most their size writes into instead of making pages.  host_trim frees
   * spares until they hold at most keep bytes besides the smallest of at least want bytes (the
   * next load's; 0: none).  NULL where the backend keeps none. */
  void (*host_trim)(uint64_t keep, uint64_t want);
  /* BF16 rows of row blocks [rb0, rb1), row stride K16, out at row rb0 * block rows. */
  int (*dequant)(const nwc_tensor *t, uint64_t rb0, uint64_t rb1, uint16_t *out);
  int (*gather)(const nwc_tensor *t, const uint64_t *rows, uint64_t n, uint16_t *out);
  /* Y[c * ldy ..] = W X[c * ldx ..] + bias for ncols <= 8; ldx >= K16 and X zero padded (the
   * single-column kernel reads K16 floats). */
  int (*matvec)(const nwc_tensor *t, const float *X, unsigned ncols, size_t ldx, const float *bias,
                float *Y, size_t ldy);
  /* A descriptor of a host_load'ed copy's pages for clients to map (a memfd, sealed against
   * writes, shrinking and growing from this call on; owned by the backend: valid until
   * host_free), or a negative errno.  NULL where host copies cannot be shared (map is then
   * refused). */
  int (*host_share)(void *p, size_t n);
  /* Devices (cuda; 0 and NULLs for cpu): tensors resident on device n (0 <= n < ndevices) are
   * device copies ("dcopy") that the dev_ functions compute on, results into host memory
   * (dev_dequant: the whole tensor, row stride K16; dev_gather: rows all < M; dev_matvec: no
   * bias).  dev_load streams ti's blob onto dev through the loader's pinned ring (nwcd_gpu_ring,
   * chunk checksums checked): 0 and *dcopy and *li; -ENOMEM when device memory runs out.
   * dev_size: its bytes.  dev_scales: its per-row scales (rows floats; only for a tensor that
   * has them) into host out, once its copies have arrived. */
  int ndevices;
  int (*dev_load)(const nwc_tensor_info *ti, int dev, void **dcopy, struct nwcd_load_info *li);
  /* A dev_load inside a crew (a model load's lanes) may return with its last copies still
   * running (every use of the copy waits for them on the device); dev_settle waits for all such
   * copies on dev (0, or -EIO: one of them failed): a model load settles the devices its
   * tensors are on, not other devices' loads. */
  int (*dev_settle)(int dev);
  /* One read of ti's blob into several places (load_places; NULL for cpu, whose one place is
   * host memory): with host a host copy as host_load makes it (*p, *locked), and a device copy
   * on each of devs[0..n) (ascending, n >= 1, dcopy[k] as dev_load), every chunk checked once
   * and each checked piece put into every copy.  0 and all of them, or a negative errno
   * (-ENOMEM: a device ran out of memory) and none.  *li: the one read's. */
  int (*places_load)(const nwc_tensor_info *ti, bool host, void **p, bool *locked,
                     const int *devs, int n, void **dcopy, struct nwcd_load_info *li);
  uint64_t (*dev_size)(const void *dcopy);
  int (*dev_scales)(const void *dcopy, float *out);
  void (*dev_free)(void *dcopy);
  int (*dev_dequant)(const void *dcopy, uint16_t *out);
  int (*dev_gather)(const void *dcopy, const uint64_t *rows, uint64_t n, uint16_t *out);
  int (*dev_matvec)(const void *dcopy, const float *X, unsigned ncols, size_t ldx, float *Y,
                    size_t ldy);
  /* dev_matvec with x and y in owner's shared region (nwcd_cuda_matvec_shared says how): the
   * backend registers the region's first window bytes with the device at owner's first call and
   * keeps them registered until forget(owner); -EAGAIN when it cannot (copy instead). */
  int (*dev_matvec_shared)(const void *owner, void *region, uint64_t window, const void *dcopy,
                           uint64_t x_off, unsigned ncols, uint64_t y_off);
  int (*dev_meminfo)(int dev, uint64_t *free_bytes, uint64_t *total_bytes);
  /* Bytes dev's copy pool holds reserved beyond its live copies (devices op). */
  int (*dev_pool_idle)(int dev, uint64_t *bytes);
  void (*dev_trim)(int dev); /* frees idle work memory of dev (when it holds no tensor) */
  /* CUDA IPC: the client's own device buffers, kept open per owner (its connection) until
   * forget (backend_cuda.h says what is checked). */
  int (*dev_matvec_ipc)(const void *owner, const void *dcopy, const nwcd_ipc_buf *x,
                        const nwcd_ipc_buf *y, unsigned ncols, float scale, const float *bias,
                        int bf16, const uint8_t *ev);
  int (*dev_dequant_ipc)(const void *owner, const void *dcopy, const nwcd_ipc_buf *out, int bf16,
                         const uint8_t *ev);
  /* GPU maps (docs/gpu-maps.md; NULL where copies cannot be shared): dev_share_pool gives the
   * descriptor of dev's copy pool exported for other processes (owned by the backend: the caller
   * sends it and keeps no copy), an id naming that pool for the daemon's life and the device's
   * UUID; dev_export
   * waits for dcopy's blob to arrive and gives the 64 bytes that import it from that pool, its
   * allocation's size and the blob's offset in it (the lookup table is at 0). */
  int (*dev_share_pool)(int dev, int *fd, uint64_t *pool_id, uint8_t uuid[16]);
  int (*dev_export)(const void *dcopy, uint8_t data[64], uint64_t *bytes, uint64_t *blob_off);
  /* Drops what the backend keeps for owner, a connection that has ended with none of its
   * requests running (IPC handles, the registered shared region); NULL where it keeps none. */
  void (*forget)(const void *owner);
} nwcd_backend;

/* Where a tensor lives: NWCD_LOC_CPU (host memory) or device n >= 0 (cuda:n); requests may say
 * NWCD_LOC_DEFAULT (the wire's -2): device 0 with a backend that has devices, else host. */
#define NWCD_LOC_DEFAULT (-2)
#define NWCD_LOC_CPU (-1)
#define NWCD_MAX_DEVICES 16

/* The cpu backend's host_load with the bytes written by fill (backend_cpu.c): makes the copy's
 * memory as host_load does (a spare cut to size, or a fresh memfd), has fill write ti's whole
 * blob into dst (0, or a negative errno), then maps it and returns as host_load.  How a load
 * to several places (places_load) makes its host copy from the read it shares with devices. */
typedef int (*nwcd_host_fill_fn)(void *ctx, const nwc_tensor_info *ti,
                                 const struct nwcd_host_dst *dst, struct nwcd_load_info *li);
int nwcd_host_load_with(const nwc_tensor_info *ti, nwcd_host_fill_fn fill, void *ctx, void **p,
                        bool *locked, struct nwcd_load_info *li);

/* The backend called name ("auto", "cpu", "cuda"): 0 and *out, -ENOTSUP with a detail for one
 * this build lacks, -EINVAL for an unknown name. */
int nwcd_backend_get(const char *name, const nwcd_backend **out);
/* Logs once, at startup, what pages the host copies' memfds get: 2 MiB where the kernel's
 * transparent_hugepage/shmem_enabled gives shmem huge pages (always, within_size, force), else
 * 4 KiB, with the setting that changes it (a load into new memory makes each page; nwcd(8),
 * PERFORMANCE).  Silent when the kernel has no such file. */
void nwcd_host_pages_note(void);
/* The cpu backend's table (backend_cpu.c), which the cuda backend extends (backend.c). */
extern const nwcd_backend nwcd_cpu_backend;

#ifdef __cplusplus
}
#endif

#endif
