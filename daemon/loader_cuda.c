/*
 * loader_cuda.c - the GPU end of the loader (built with CUDA only): a ring of pinned,
 * io_uring-registered buffers (nwcd_ring, loader.c) whose sink copies each checked slot into
 * device memory with cudaMemcpyAsync on the ring's stream and records an event after it; a
 * slot goes back to the ring once its event has completed, so reads of the next slots overlap
 * the copies of the last ones, and at most the ring's bytes (256 MiB by default) are staged
 * whatever the tensor's size.
 *
 * Slots are released in the order their copies were queued (one stream: copies complete in
 * order), polled with cudaEventQuery while there are free slots and waited for with
 * cudaEventSynchronize when the loader has none.  The events block (cudaEventBlockingSync): a
 * waiting lane sleeps instead of spinning on a core that the copies out of the page cache need
 * (faster in 16 lanes on the H200 host: docs/results.md).  A queued load
 * (nwcd_load_opts.queued) returns with its last copies still running: their slots stay in the
 * ring's list, oldest first, for the ring's next load to release in the same order, and
 * nwcd_gpu_ring_settle waits for them.  The ring memory is mapped by loader.c and pinned for DMA
 * here with cudaHostRegister, portable: every device can copy out of any ring's slots.
 *
 * One read into several places (nwcd_load_to_places, load_places): the blob streams through the
 * first device's ring, and its sink queues a copy of each checked slot on every destination
 * device's ring's stream (each ring's event of that slot index recorded after it: the rings of
 * one geometry have as many), then writes the slot into the host copy, if one is wanted, while
 * the copies run; a slot goes back to the ring once every device's event of it has completed
 * (in queued order: each stream completes in order).  The destination rings are drained first
 * (their queued loads' slots back with them) and held for the load, whose end waits for every
 * stream.  A CUDA error fails the load (-EIO, the CUDA text in the detail);
 * a failed load synchronizes the stream before its slots go back, and a slot is refilled only
 * once its copy's event has completed, so no copy reads a slot that a later load refills.
 */
#include "loader_cuda.h"

#include "nwc_error.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

struct nwcd_gpu_ring {
  nwcd_ring *ring;
  int device;
  cudaStream_t stream;
  cudaEvent_t *ev; /* per slot: after the copy out of it */
  cudaEvent_t mark; /* nwcd_gpu_ring_mark's */
  unsigned *fifo;  /* slots with a copy queued, oldest first */
  unsigned nslots, head, count;
  void *mem;
  void *side; /* NWCD_GPU_RING_SIDE bytes of pinned memory (nwcd_gpu_ring_side) */
  pthread_mutex_t lock; /* one load at a time */
};

typedef struct copy_to {
  nwcd_gpu_ring *g;
  uint8_t *dev;
} copy_to;

static int cuda_fail(cudaError_t e, const char *what) {
  return nwc__fail(-EIO, "CUDA: %s: %s", what, cudaGetErrorString(e));
}

static int gpu_consume(void *ctx, nwcd_ring *r, const nwcd_slot *s) {
  (void)r;
  copy_to *c = ctx;
  nwcd_gpu_ring *g = c->g;
  cudaError_t e = cudaMemcpyAsync(c->dev + s->offset, s->data, s->len, cudaMemcpyHostToDevice,
                                  g->stream);
  if (e == cudaSuccess) e = cudaEventRecord(g->ev[s->index], g->stream);
  if (e != cudaSuccess) return cuda_fail(e, "cudaMemcpyAsync of a slot to the device");
  g->fifo[(g->head + g->count++) % g->nslots] = s->index;
  return 0;
}

static int gpu_reclaim(void *ctx, nwcd_ring *r, bool wait) {
  nwcd_gpu_ring *g = ((copy_to *)ctx)->g;
  unsigned released = 0;
  while (g->count) {
    unsigned s = g->fifo[g->head];
    cudaError_t e = wait && !released ? cudaEventSynchronize(g->ev[s]) : cudaEventQuery(g->ev[s]);
    if (e == cudaErrorNotReady) break;
    if (e != cudaSuccess) {
      cudaStreamSynchronize(g->stream); /* nothing may still read the slots */
      g->count = 0;
      return cuda_fail(e, "copy of a slot to the device");
    }
    nwcd_ring_release(r, s);
    g->head = (g->head + 1) % g->nslots;
    g->count--, released++;
  }
  return 0;
}

void nwcd_gpu_ring_free(nwcd_gpu_ring *g) {
  if (!g) return;
  cudaSetDevice(g->device);
  if (g->stream) cudaStreamSynchronize(g->stream);
  for (unsigned s = 0; g->ev && s < g->nslots; s++)
    if (g->ev[s]) cudaEventDestroy(g->ev[s]);
  if (g->mark) cudaEventDestroy(g->mark);
  if (g->stream) cudaStreamDestroy(g->stream);
  if (g->mem) cudaHostUnregister(g->mem);
  if (g->side) cudaFreeHost(g->side);
  nwcd_ring_free(g->ring);
  pthread_mutex_destroy(&g->lock);
  free(g->ev), free(g->fifo), free(g);
}

int nwcd_gpu_ring_create(int device, uint64_t bytes, uint64_t slot_size, nwcd_gpu_ring **out) {
  *out = NULL;
  nwcd_gpu_ring *g = calloc(1, sizeof *g);
  if (!g) return nwc__fail(-ENOMEM, "no memory for a GPU ring");
  g->device = device;
  int rc = nwcd_ring_create(bytes, slot_size, &g->ring);
  if (rc < 0) {
    free(g);
    return rc;
  }
  uint64_t len;
  void *mem = nwcd_ring_memory(g->ring, &len, &g->nslots);
  pthread_mutex_init(&g->lock, NULL);
  g->ev = calloc(g->nslots, sizeof *g->ev);
  g->fifo = calloc(g->nslots, sizeof *g->fifo);
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaHostRegister(mem, len, cudaHostRegisterPortable);
  if (e == cudaSuccess) g->mem = mem;
  if (e == cudaSuccess) e = cudaHostAlloc(&g->side, NWCD_GPU_RING_SIDE, cudaHostAllocDefault);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess)
    e = cudaEventCreateWithFlags(&g->mark, cudaEventDisableTiming | cudaEventBlockingSync);
  for (unsigned s = 0; e == cudaSuccess && g->ev && s < g->nslots; s++)
    e = cudaEventCreateWithFlags(&g->ev[s], cudaEventDisableTiming | cudaEventBlockingSync);
  rc = !g->ev || !g->fifo ? nwc__fail(-ENOMEM, "no memory for a GPU ring")
       : e != cudaSuccess ? cuda_fail(e, "GPU ring (cudaHostRegister, side buffer, stream, events)")
                          : 0;
  if (rc < 0) {
    nwcd_gpu_ring_free(g);
    return rc;
  }
  *out = g;
  return 0;
}

void *nwcd_gpu_ring_stream(const nwcd_gpu_ring *g) { return g->stream; }

int nwcd_gpu_ring_side(nwcd_gpu_ring *g, void **side) {
  *side = NULL;
  cudaError_t e = cudaSetDevice(g->device);
  if (e == cudaSuccess) e = cudaEventSynchronize(g->mark); /* a queued load's table copy */
  if (e != cudaSuccess) return cuda_fail(e, "the last copy out of a GPU ring's side buffer");
  *side = g->side;
  return 0;
}

int nwcd_gpu_ring_settle(nwcd_gpu_ring *g) {
  cudaError_t e = cudaSetDevice(g->device);
  if (e == cudaSuccess) e = cudaStreamSynchronize(g->stream);
  return e == cudaSuccess ? 0 : cuda_fail(e, "the copies queued on a GPU ring");
}

int nwcd_gpu_ring_mark(nwcd_gpu_ring *g, void **mark) {
  cudaError_t e = cudaSetDevice(g->device);
  if (e == cudaSuccess) e = cudaEventRecord(g->mark, g->stream);
  *mark = g->mark;
  return e == cudaSuccess ? 0 : cuda_fail(e, "an event on a GPU ring's stream");
}

int nwcd_gpu_mark_wait(void *mark) {
  cudaError_t e = cudaEventSynchronize((cudaEvent_t)mark);
  return e == cudaSuccess ? 0 : cuda_fail(e, "work queued on a GPU ring's stream");
}

int nwcd_load_to_device(nwcd_gpu_ring *g, const nwc_tensor_info *ti, void *dev,
                        const nwcd_load_opts *o, nwcd_load_info *li) {
  NWC_RETURN_IF(!g || !ti || !dev, -EINVAL, "nwcd_load_to_device: missing argument");
  cudaError_t e = cudaSetDevice(g->device);
  if (e != cudaSuccess) return cuda_fail(e, "cudaSetDevice");
  copy_to c = {g, dev};
  nwcd_sink sink = {gpu_consume, gpu_reclaim, &c};
  pthread_mutex_lock(&g->lock); /* g->fifo: the slots a queued load left, oldest first */
  int rc = nwcd_ring_load(g->ring, ti, o, &sink, li);
  if (rc < 0 || !o || !o->queued) { /* also what was queued before, when the load failed */
    e = cudaStreamSynchronize(g->stream);
    if (rc == 0 && e != cudaSuccess) rc = cuda_fail(e, "the copies to the device");
  }
  pthread_mutex_unlock(&g->lock);
  return rc;
}

/* The destinations of one read (nwcd_load_to_places): g[k]'s stream copies into dev[k]; the
 * slots are g[0]'s, in flight oldest first in g[0]'s fifo. */
typedef struct fan_out {
  nwcd_gpu_ring *const *g;
  uint8_t *const *dev;
  unsigned n;
  const nwcd_host_dst *host;
  const nwc_tensor_info *ti;
} fan_out;

/* Waits for every destination's stream (0, or the first CUDA error). */
static int fan_sync(const fan_out *f) {
  int rc = 0;
  for (unsigned k = 0; k < f->n; k++) {
    int s = nwcd_gpu_ring_settle(f->g[k]);
    if (rc == 0) rc = s;
  }
  return rc;
}

static int fan_consume(void *ctx, nwcd_ring *r, const nwcd_slot *s) {
  (void)r;
  fan_out *f = ctx;
  for (unsigned k = 0; k < f->n; k++) {
    nwcd_gpu_ring *g = f->g[k];
    cudaError_t e = cudaSetDevice(g->device);
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(f->dev[k] + s->offset, s->data, s->len, cudaMemcpyHostToDevice,
                          g->stream);
    if (e == cudaSuccess) e = cudaEventRecord(g->ev[s->index], g->stream);
    if (e != cudaSuccess) { /* the loader takes the slot back: nothing may read it any more */
      int rc = cuda_fail(e, "cudaMemcpyAsync of a slot to a device");
      fan_sync(f);
      return rc;
    }
  }
  nwcd_gpu_ring *g0 = f->g[0];
  g0->fifo[(g0->head + g0->count++) % g0->nslots] = s->index;
  return f->host ? nwcd_slot_to_host(f->host, f->ti, s) : 0; /* beside the copies */
}

static int fan_reclaim(void *ctx, nwcd_ring *r, bool wait) {
  fan_out *f = ctx;
  nwcd_gpu_ring *g0 = f->g[0];
  unsigned released = 0;
  while (g0->count) {
    unsigned s = g0->fifo[g0->head];
    cudaError_t e = cudaSuccess;
    for (unsigned k = 0; k < f->n && e == cudaSuccess; k++)
      e = wait && !released ? cudaEventSynchronize(f->g[k]->ev[s]) : cudaEventQuery(f->g[k]->ev[s]);
    if (e == cudaErrorNotReady) break;
    if (e != cudaSuccess) {
      int rc = cuda_fail(e, "copy of a slot to a device");
      fan_sync(f); /* nothing may still read the slots */
      g0->count = 0;
      return rc;
    }
    nwcd_ring_release(r, s);
    g0->head = (g0->head + 1) % g0->nslots;
    g0->count--, released++;
  }
  return 0;
}

/* Waits for what queued loads left on g's stream and gives their slots back to its ring (its
 * lock held, no load on it). */
static int ring_drain(nwcd_gpu_ring *g) {
  int rc = nwcd_gpu_ring_settle(g);
  for (; g->count; g->count--, g->head = (g->head + 1) % g->nslots)
    nwcd_ring_release(g->ring, g->fifo[g->head]);
  return rc;
}

int nwcd_load_to_places(nwcd_gpu_ring *const *g, void *const *dev, unsigned n,
                        const nwcd_host_dst *host, const nwc_tensor_info *ti,
                        const nwcd_load_opts *o, nwcd_load_info *li) {
  NWC_RETURN_IF(!g || !dev || !n || !ti, -EINVAL, "nwcd_load_to_places: missing argument");
  for (unsigned k = 1; k < n; k++)
    NWC_RETURN_IF(g[k]->nslots < g[0]->nslots || g[k] == g[0], -EINVAL,
                  "nwcd_load_to_places: rings of other geometries, or one ring twice");
  nwcd_load_opts ro = o ? *o : (nwcd_load_opts){0};
  ro.queued = false, ro.split = NULL; /* its end waits for every device */
  fan_out f = {g, (uint8_t *const *)dev, n, host, ti};
  nwcd_sink sink = {fan_consume, fan_reclaim, &f};
  for (unsigned k = 0; k < n; k++) pthread_mutex_lock(&g[k]->lock);
  int rc = 0;
  for (unsigned k = 0; k < n; k++) {
    int d = ring_drain(g[k]);
    if (rc == 0) rc = d;
  }
  if (rc == 0) rc = nwcd_ring_load(g[0]->ring, ti, &ro, &sink, li);
  int s = fan_sync(&f);
  if (rc == 0) rc = s;
  for (unsigned k = n; k-- > 0;) pthread_mutex_unlock(&g[k]->lock);
  return rc;
}
