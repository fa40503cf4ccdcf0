/*
 * loader_cuda.h - the loader's GPU end (loader_cuda.c; CUDA builds: the nwcd_loader_cuda
 * library, NWCD_WITH_CUDA defined): ring slots to device memory with cudaMemcpyAsync.
 */
#ifndef NWCD_LOADER_CUDA_H
#define NWCD_LOADER_CUDA_H

#include "loader.h"

#include <stdint.h>

/* A ring whose sink copies each slot to device memory with cudaMemcpyAsync, releasing slots as
 * their copies' events complete. */
typedef struct nwcd_gpu_ring nwcd_gpu_ring;
/* A ring (bytes, slot_size as nwcd_ring_create) pinned with cudaHostRegister, a stream and an
 * event per slot on device.  Free with nwcd_gpu_ring_free. */
int nwcd_gpu_ring_create(int device, uint64_t bytes, uint64_t slot_size, nwcd_gpu_ring **out);
void nwcd_gpu_ring_free(nwcd_gpu_ring *g);
/* Streams ti's blob into dev (ti->length bytes of device memory on the ring's device), chunks
 * checked on the way; returns when the bytes are on the device, or the first error (-EBADMSG
 * naming the chunk, -EIO with the CUDA error), either way with the ring's stream idle.  With
 * o->queued it returns as soon as every chunk is checked and every copy queued on the ring's
 * stream (nwcd_gpu_ring_stream: an event recorded there after it marks the bytes' arrival, and
 * nwcd_gpu_ring_settle waits for them); a failed load still returns with the stream idle.  One
 * load at a time per ring (others wait). */
int nwcd_load_to_device(nwcd_gpu_ring *g, const nwc_tensor_info *ti, void *dev,
                        const nwcd_load_opts *o, nwcd_load_info *li);
/* One read of ti's blob into several places (load_places): streamed through g[0]'s ring, each
 * checked slot copied to dev[k] (ti->length bytes of device memory on g[k]'s device) on g[k]'s
 * stream for every k < n, and written into host when it is not NULL (nwcd_slot_to_host).  The
 * rings (of one geometry, the callers' for this load: one per device, each device once) are
 * drained of what queued loads left on them first; returns when every copy has arrived, or the
 * first error, either way with every stream idle (o->queued and o->split are not used). */
int nwcd_load_to_places(nwcd_gpu_ring *const *g, void *const *dev, unsigned n,
                        const nwcd_host_dst *host, const nwc_tensor_info *ti,
                        const nwcd_load_opts *o, nwcd_load_info *li);
/* The ring's stream (a cudaStream_t) on which its copies go: work queued on it before a load
 * (the copy's allocation) is ordered before the load's copies and done when the load returns
 * (a queued load: when the ring settles). */
void *nwcd_gpu_ring_stream(const nwcd_gpu_ring *g);
/* Waits for the copies queued on the ring's stream so far (0, or -EIO with the CUDA error): the
 * last ones of a queued load.  Any thread, while others load through the ring. */
int nwcd_gpu_ring_settle(nwcd_gpu_ring *g);
/* NWCD_GPU_RING_SIDE bytes of pinned host memory beside the ring (*side), for a small copy queued
 * on its stream before a load (a copy's lookup table: from pinned memory the copy is truly
 * asynchronous, where one from pageable memory is staged by the driver first).  A load that
 * returns with its copies still queued leaves the buffer in use until they run: this waits for
 * what was queued before the ring's last mark (nwcd_gpu_ring_mark), so a caller that queues a
 * copy from it and then loads with o->queued marks the ring in between.  0, or -EIO. */
#define NWCD_GPU_RING_SIDE (64u << 10)
int nwcd_gpu_ring_side(nwcd_gpu_ring *g, void **side);
/* Marks what is queued on the ring's stream so far (an event: *mark): nwcd_gpu_mark_wait waits
 * for it from any thread, until the ring's next mark (before another stream uses its results). */
int nwcd_gpu_ring_mark(nwcd_gpu_ring *g, void **mark);
int nwcd_gpu_mark_wait(void *mark);

#endif
