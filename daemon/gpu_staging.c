/*
 * gpu_staging.c - the cuda backend's loads (its dev_load and dev_settle, wired in by backend.c):
 * a tensor's blob streamed from its container through a staging ring of pinned buffers
 * (loader_cuda.h: chunks checked in the ring, cudaMemcpyAsync out of each slot) into a device
 * copy that backend_cuda.cu allocates and describes.  The rings are per device, one per load
 * lane, made at a device's first load and kept until exit; a model load's lanes help each other
 * through its crew (crew.h), each helper through a ring of its own.
 *
 * A load to several places (places_load, load_places) takes a ring of each device named, in
 * ascending order of devices (each lane holds at most one ring per device and the rings per
 * device are as many as the lanes, so lanes taking several never wait on each other for good),
 * allocates a copy on each through its ring, and reads the blob once through the first ring,
 * its slots copied to every device (nwcd_load_to_places) and written into the host copy when
 * one is wanted (nwcd_host_load_with makes it).  It is not offered to the crew and not queued:
 * it returns with the bytes on every device.
 */
#include "gpu_staging.h"

#include "backend.h"
#include "backend_cuda.h"
#include "clock.h"
#include "crew.h"
#include "loader_cuda.h"

#include "nwc_error.h"

#include <pthread.h>
#include <stdbool.h>

/* Staging rings per device: one per load lane, two slots of 4 MiB each (128 MiB in all), so
 * that every lane streams at once; made at a device's first load, kept until exit.  Loads are
 * hot (nwcd_load_opts.hot): each lane copies the page cache 1 MiB at a time (RING_PIECE: in a
 * core's 2 MiB L2) and checks it at once on its own core, alone (the lanes are as many as the
 * cores: helper threads would only add wake-ups), and a slot goes to the device when its 4 MiB
 * are in.  Of the geometries measured in-process on the H200 host (docs/results.md: GPU loads
 * in 4 MiB slots) this one loaded fastest: fewer bytes staged at once leave each slot in the
 * caches until its copy reads it. */
#define RINGS NWCD_GPU_LOAD_LANES
#define RING_BYTES ((128u << 20) / RINGS)
#define RING_SLOT (4u << 20)
#define RING_PIECE (1u << 20)
static nwcd_gpu_ring *rings[NWCD_MAX_DEVICES][RINGS];
static bool ring_busy[NWCD_MAX_DEVICES][RINGS];
static pthread_mutex_t rings_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ring_free = PTHREAD_COND_INITIALIZER;

/* The ring of each device that the calling thread took last, plus one (0: none yet). */
static _Thread_local unsigned ring_mine[NWCD_MAX_DEVICES];

/* A ring of dev for one load (waits while all are busy); -errno if it cannot be made.  A thread
 * takes the ring it had last when that one is free: its slots are still in the thread's core's
 * caches, where a copy into another thread's ring would first fetch every line from that core
 * (each load lane takes a ring per tensor). */
static int ring_take(int dev, unsigned *k) {
  pthread_mutex_lock(&rings_lock);
  for (;;) {
    *k = ring_mine[dev] ? ring_mine[dev] - 1 : 0;
    if (!ring_busy[dev][*k]) break;
    for (*k = 0; *k < RINGS && ring_busy[dev][*k]; (*k)++) {
    }
    if (*k < RINGS) break;
    pthread_cond_wait(&ring_free, &rings_lock);
  }
  int rc = rings[dev][*k] ? 0 : nwcd_gpu_ring_create(dev, RING_BYTES, RING_SLOT, &rings[dev][*k]);
  ring_busy[dev][*k] = rc == 0;
  if (rc == 0) ring_mine[dev] = *k + 1;
  pthread_mutex_unlock(&rings_lock);
  return rc;
}

static void ring_give(int dev, unsigned k) {
  pthread_mutex_lock(&rings_lock);
  ring_busy[dev][k] = false;
  pthread_cond_broadcast(&ring_free); /* the waiters may want other devices' rings */
  pthread_mutex_unlock(&rings_lock);
}

/* A blob being loaded onto dev at blob (device memory), as a crew's helper sees it: the memory
 * is there for other streams once ready (a mark on the owner's ring) has passed. */
typedef struct dev_blob {
  const nwc_tensor_info *ti;
  int dev;
  uint8_t *blob;
  void *ready;
} dev_blob;

static const nwcd_load_opts dev_load_opts = {.checkers = 1, .hot = true, .piece = RING_PIECE};

/* A crew helper's part of a blob (nwcd_part_fn): bytes [off, off + len) through a ring of its
 * own, checked against the blob's chunks from off on. */
static int cuda_load_part(void *ctx, uint64_t off, uint64_t len, nwcd_load_info *li) {
  const dev_blob *b = ctx;
  nwcd_load_opts o = dev_load_opts;
  o.from = off, o.to = off + len;
  NWC_TRY(nwcd_gpu_mark_wait(b->ready));
  unsigned k;
  NWC_TRY(ring_take(b->dev, &k));
  int rc = nwcd_load_to_device(rings[b->dev][k], b->ti, b->blob, &o, li);
  ring_give(b->dev, k);
  return rc;
}

/* A device copy whose blob the loader streams through one of dev's rings; with a crew
 * joined (a model load's lanes), the blob is offered to it, so that lanes with no tensor left
 * load parts of it from the back, each through a ring of its own, and the load is queued: it
 * returns once the owner's last copies are queued, not done, so that its lane reads its next
 * tensor while they run (the copy's users wait for its arrival on the device, and the model
 * load settles its device's rings before it answers: dev_settle).  Waiting for them instead
 * kept every lane from reading at each tensor's end, and the lanes, which take equal tensors
 * together, left the copy engine idle together. */
int nwcd_gpu_dev_load(const nwc_tensor_info *ti, int dev, void **dcopy, nwcd_load_info *li) {
  *dcopy = NULL;
  unsigned k;
  int rc = ring_take(dev, &k);
  if (rc < 0) return rc;
  void *blob = NULL;
  uint64_t t0 = nwcd_now_ns();
  nwcd_gpu_ring *g = rings[dev][k];
  void *side = NULL;
  if (rc == 0) rc = nwcd_gpu_ring_side(g, &side);
  if (rc == 0) /* queues the allocation and the table on the ring's stream */
    rc = nwcd_cuda_blob_alloc(ti, dev, nwcd_gpu_ring_stream(g), side, dcopy, &blob);
  dev_blob share = {ti, dev, blob, NULL};
  nwcd_load_opts o = dev_load_opts;
  nwcd_crew *crew = nwcd_crew_joined();
  o.queued = crew != NULL; /* the mark below also frees the side buffer for the next load */
  if (rc == 0 && crew && (rc = nwcd_gpu_ring_mark(g, &share.ready)) == 0)
    o.split = nwcd_crew_offer(crew, ti->length, ti->chunk_size, cuda_load_part, &share);
  uint64_t alloc_ns = nwcd_now_ns() - t0;
  if (rc == 0) rc = nwcd_load_to_device(g, ti, blob, &o, li);
  if (rc == 0 && o.queued) rc = nwcd_cuda_blob_queued(*dcopy, nwcd_gpu_ring_stream(g));
  if (rc < 0 && *dcopy) /* the copy is freed below: what was queued into it (its table, and */
    nwcd_gpu_ring_settle(g); /* the load's copies where the load did not wait) must be done */
  ring_give(dev, k);
  if (o.split) rc = nwcd_crew_withdraw(o.split, rc, li);
  if (li) li->alloc_ns = alloc_ns;
  if (rc == 0) nwcd_cuda_blob_finish(*dcopy, ti);
  if (rc < 0) {
    nwcd_cuda_free(*dcopy);
    *dcopy = NULL;
  }
  return rc;
}

/* Waits for the copies that queued loads left running on dev's rings (0, or the
 * first ring's CUDA error). */
int nwcd_gpu_dev_settle(int dev) {
  int rc = 0;
  for (unsigned k = 0; k < RINGS; k++) {
    pthread_mutex_lock(&rings_lock); /* rings are made by the loads that first need them */
    nwcd_gpu_ring *g = rings[dev][k];
    pthread_mutex_unlock(&rings_lock);
    int r = g ? nwcd_gpu_ring_settle(g) : 0;
    if (rc == 0) rc = r;
  }
  return rc;
}

/* A load to several places: the device copies, and the rings (one per device) they load through. */
typedef struct places_job {
  const int *devs;
  int n;
  nwcd_gpu_ring *g[NWCD_MAX_DEVICES];
  void *blob[NWCD_MAX_DEVICES];
} places_job;

/* The one read (a nwcd_host_fill_fn when a host copy is wanted: dst, else NULL). */
static int places_fill(void *ctx, const nwc_tensor_info *ti, const nwcd_host_dst *dst,
                       nwcd_load_info *li) {
  places_job *j = ctx;
  return nwcd_load_to_places(j->g, j->blob, (unsigned)j->n, dst, ti, &dev_load_opts, li);
}

int nwcd_gpu_places_load(const nwc_tensor_info *ti, bool host, void **p, bool *locked,
                         const int *devs, int n, void **dcopy, nwcd_load_info *li) {
  NWC_RETURN_IF(n < 1 || n > NWCD_MAX_DEVICES, -EINVAL, "places_load of %d devices", n);
  places_job j = {devs, n, {NULL}, {NULL}};
  unsigned k[NWCD_MAX_DEVICES];
  int taken = 0, rc = 0;
  uint64_t t0 = nwcd_now_ns();
  for (; taken < n && rc == 0; taken++) { /* ascending devices (see the top) */
    if ((rc = ring_take(devs[taken], &k[taken])) < 0) break;
    j.g[taken] = rings[devs[taken]][k[taken]];
  }
  for (int i = 0; i < n; i++) dcopy[i] = NULL;
  for (int i = 0; i < n && rc == 0; i++) {
    void *side = NULL;
    rc = nwcd_gpu_ring_side(j.g[i], &side);
    if (rc == 0) /* queues the allocation and the table on the ring's stream */
      rc = nwcd_cuda_blob_alloc(ti, devs[i], nwcd_gpu_ring_stream(j.g[i]), side, &dcopy[i],
                                &j.blob[i]);
  }
  uint64_t alloc_ns = nwcd_now_ns() - t0;
  if (rc == 0 && host) rc = nwcd_host_load_with(ti, places_fill, &j, p, locked, li);
  else if (rc == 0) rc = places_fill(&j, ti, NULL, li);
  for (int i = 0; i < n; i++) {
    if (rc < 0 && dcopy[i]) nwcd_gpu_ring_settle(j.g[i]); /* the table's copy, before the free */
    if (dcopy[i] && rc == 0) nwcd_cuda_blob_finish(dcopy[i], ti);
    else if (dcopy[i]) nwcd_cuda_free(dcopy[i]), dcopy[i] = NULL;
  }
  for (int i = 0; i < taken; i++) ring_give(devs[i], k[i]);
  if (li) li->alloc_ns = alloc_ns;
  return rc;
}
