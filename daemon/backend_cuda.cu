/*
 * backend_cuda.cu - the CUDA compute backend of nwcd: device copies of resident
 * tensors and the kernels of kernels/ (nwc_kernels.h; layouts 0 and 2) for dequant, gather and matvec,
 * from host buffers (the socket path) or from a client's own device memory (CUDA IPC).
 *
 * Design:
 *   - A device copy is one allocation: the 16 KiB lookup table built here from the catalog's
 *     exp_of_rank, then the blob exactly as the container holds it, which the loader streams
 *     into device memory through its pinned ring (chunk checksums checked on the way); the
 *     kernel tensor's arrays point at the blob's sections (64-aligned in the blob, the blob
 *     256-aligned).  The blob's structure was validated at import and its bytes are the
 *     checksummed ones, so the kernels get what nwc_tensor_validate accepted then.  The table
 *     is built in the ring's pinned side buffer and goes up on its stream ahead of the blob, so
 *     a load waits once, at its end; a model load's lanes do not wait even then (a queued
 *     load): the copy records its arrival on the ring's stream, and whatever uses or frees the
 *     copy first makes its own stream wait for that (Lease::take of a copy).
 *     Copies come from the device's own memory pool (cudaMallocFromPoolAsync on that stream),
 *     not cudaMalloc: 16 load lanes calling cudaMalloc beside each other's copies lost 16 % of a
 *     warm load to it, the pool nothing measurable (docs/results.md).  The pool's release
 *     threshold is 0: what freed copies leave goes back to the device at the next
 *     synchronization, so the pool holds the live copies and the unused rest of partly used
 *     chunks, no more (as cudaMalloc holds the rest of the pages it sub-allocates small
 *     allocations from).  Running out is -ENOMEM (residency.c evicts and retries once).
 *   - GPU maps (docs/gpu-maps.md): where the device allows it the pool is made with POSIX file
 *     descriptor handles and exported once (nwcd_cuda_share_pool: the descriptor goes to every
 *     client that maps a copy of that device); each copy is named by its
 *     cudaMemPoolExportPointer data, taken once its blob has arrived (nwcd_cuda_export).  A pool
 *     that cannot be shared is made plain: copies load, maps are refused with the reason.
 *   - A request leases a context of its device from that device's pool (one short mutex hold):
 *     one non-blocking stream, one completion event and grow-only buffers (device: x, y,
 *     scratch, output, row indices, bias; pinned host, mapped: in, out).  It enqueues copy-in,
 *     kernels and copy-out on that stream, waits for them (spinning: cudaDeviceScheduleSpin),
 *     copies out of the pinned buffer and gives the context back.  So concurrent requests run on
 *     their own streams, and there are never more contexts than requests that ran at once.
 *   - A socket matvec is one submission: a kernel reads x from mapped pinned memory (no copy
 *     engine: for a few KiB it starts sooner), the matvec kernels write y straight into the
 *     mapped pinned out buffer (no copy back), and the three are captured into a CUDA graph per
 *     (tensor, columns, x and y), cached in the context (32, LRU) from the second request that
 *     needs it and launched from then on (the request then costs the kernel + 2-5 us on the H200,
 *     docs/results.md).  A graph names the context's buffers as they were, so the context drops
 *     its graphs before it reallocates one.
 *   - Shared regions: a matvec whose x and y are in the client's shared region (its memfd, which
 *     nwcd maps) skips the pinned buffers: the region's first bytes (a window) are registered with
 *     CUDA once per connection, at its first such matvec, so the graph's kernels read x from the
 *     region and write y into it; nothing is copied on the host.  The registration ends
 *     with the connection (nwcd_cuda_forget, when none of its requests runs); graphs naming it
 *     are keyed by its id, unique for the process's life, so none is launched after that.
 *     nwcd_cuda_trim frees a device's idle contexts (residency calls it when the device holds no
 *     tensor any more), so evicting everything gives all device memory back.
 *   - Several columns of one matvec (a batched pass of several clients) go up together, run
 *     as one launch of up to 8 columns (layout 2: one pass over the weights; layout 0: a
 *     launch per column) and write y in one go: one round trip and one wait for all of them.
 *   - IPC: the client's handles are opened on the copy's device and kept open for its connection
 *     (at most 16 per connection, LRU; closed when the connection ends); the allocation's real
 *     size comes from the driver (cuMemGetAddressRange, fetched at run time so that nwcd needs no
 *     libcuda at link time) and every request's offset and size is checked against it.
 *     An epilogue kernel (nwc_k_epilogue) applies the request's scale and bias and writes float
 *     or BF16.
 */
#include "backend.h" /* NWCD_MAX_DEVICES */
#include "backend_cuda.h"

#include "nwc_error.h"
#include "nwc_kernels.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <new>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

namespace {

/* A device copy: one allocation from the device's copy pool (k.owned) holding the lookup table
 * (kTabSpace bytes), then the blob as it is on disk; the kernel tensor's arrays point at the
 * blob's sections. */
constexpr uint64_t kTabSpace = NWC_TAB_ENTRIES * 4; /* 16 KiB: keeps the blob 256-aligned */
constexpr unsigned kMaxCols = 8; /* columns of x one kernel launch multiplies */
struct Copy {
  nwc_k_tensor k;
  int dev;
  uint64_t k16, scratch, bytes; /* scratch: bytes a matvec of kMaxCols columns needs */
  uint64_t id; /* unique for the process's life: keys the matvec graphs (addresses are reused) */
  cudaEvent_t arrival = nullptr; /* recorded after the blob's last copy (nwcd_cuda_blob_queued) */
  mutable int pending = 0; /* 1 until the arrival is seen complete (atomic) */
};
uint64_t copy_ids; /* atomically incremented */

/* A grow-only buffer, device or pinned host. */
struct Buf {
  void *p = nullptr;
  size_t n = 0;
};

/* Where a socket matvec's x comes from and its y goes: host memory the device reads and writes,
 * the context's mapped pinned hin and hout (src 0) or a client's registered shared region (src:
 * the Region's id).  x and y are the device's views; x: columns xld floats apart (K16: padded
 * already; K: dense), y: columns M apart. */
struct Io {
  uint64_t src;
  const float *x;
  uint64_t xld;
  float *y;
};

/* A socket matvec's work as one CUDA graph: x up, each column's kernels writing y straight into
 * host memory.  It names the buffers as they were when it was captured, so a context drops its
 * graphs before it reallocates any buffer (grow), and a graph on a shared region is keyed by the
 * region's id, never reused, so it is never launched once the region has gone. */
constexpr int kGraphs = 32; /* a few tensors times the connections that use them */
struct Graph {
  uint64_t id = 0; /* the Copy's; 0: empty */
  unsigned ncols = 0;
  Io io = {0, nullptr, 0, nullptr};
  uint64_t last = 0;
  cudaGraphExec_t exec = nullptr;
};

struct Ctx {
  bool ready = false;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  Buf dx, dy, ds, dout, drows, dbias, hin, hout;
  Graph graphs[kGraphs];
  uint64_t tick = 0;
};

/* 0 for cudaSuccess, else -ENOMEM (out of memory) or -EIO with a detail naming what failed. */
int fail_cuda(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 0;
  cudaGetLastError(); /* clear a non-sticky error so that the next request starts clean */
  if (e == cudaErrorMemoryAllocation)
    return nwc__fail(-ENOMEM, "CUDA: %s: out of device memory", what);
  return nwc__fail(-EIO, "CUDA: %s: %s", what, cudaGetErrorString(e));
}
#define CU_TRY(expr, what)                                                                       \
  do {                                                                                           \
    int cu__rc = fail_cuda((expr), what);                                                        \
    if (cu__rc < 0) return cu__rc;                                                               \
  } while (0)

/* A kernel entry point's status (nwc_kernels.h) as one with a detail. */
int kstatus(int rc, const char *what) {
  if (rc == -EIO) {
    int r = fail_cuda((cudaError_t)nwc_k_last_cuda_error(), what);
    return r ? r : nwc__fail(-EIO, "CUDA: %s failed", what);
  }
  if (rc < 0) return nwc__fail(rc, "CUDA kernel %s refused the tensor (%d)", what, rc);
  return 0;
}

void free_buf(Buf &b, bool host) {
  if (b.p) host ? (void)cudaFreeHost(b.p) : (void)cudaFree(b.p);
  b.p = nullptr, b.n = 0;
}

/* Idle contexts of one device; a request takes one and gives it back (so each worker computes on
 * its own stream, and no more contexts exist than requests ever ran at once). */
constexpr int kMaxIdle = 256;
struct Pool {
  pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  Ctx *idle[kMaxIdle];
  int n = 0;
};
Pool pools[NWCD_MAX_DEVICES];

/* Each device's memory pool for copies, made at its first copy, release threshold 0 (above).
 * Where the device supports it the pool is made shareable (POSIX file descriptors) and exported
 * once: pool_fds[dev] is that descriptor (-1: not shareable, pool_why says why), sent to clients
 * that map the device's copies (docs/gpu-maps.md); pool_ids[dev] names the pool for the
 * daemon's life, so that a client imports it once. */
pthread_mutex_t copy_pools_lock = PTHREAD_MUTEX_INITIALIZER;
cudaMemPool_t copy_pools[NWCD_MAX_DEVICES];
int pool_fds[NWCD_MAX_DEVICES];
uint64_t pool_ids[NWCD_MAX_DEVICES];
uint8_t pool_uuids[NWCD_MAX_DEVICES][16]; /* each device's UUID, read with its export */
char pool_why[NWCD_MAX_DEVICES][160];

/* The POSIX-fd handle type if dev's pools can have it (cudaDevAttrMemoryPoolSupportedHandleTypes),
 * else none, with the reason in pool_why[dev]. */
cudaMemAllocationHandleType pool_handle_type(int dev) {
  int types = 0;
  if (cudaDeviceGetAttribute(&types, cudaDevAttrMemoryPoolSupportedHandleTypes, dev) !=
      cudaSuccess) {
    cudaGetLastError();
    snprintf(pool_why[dev], sizeof pool_why[dev], "the driver cannot say which pool handles "
             "cuda:%d supports", dev);
    return cudaMemHandleTypeNone;
  }
  if (!(types & cudaMemHandleTypePosixFileDescriptor)) {
    snprintf(pool_why[dev], sizeof pool_why[dev], "cuda:%d's memory pools cannot be shared "
             "through file descriptors", dev);
    return cudaMemHandleTypeNone;
  }
  return cudaMemHandleTypePosixFileDescriptor;
}

/* Exports a new pool of dev as a descriptor into pool_fds[dev] (or says why not). */
void pool_export(int dev, cudaMemPool_t p, cudaMemAllocationHandleType type) {
  pool_fds[dev] = -1;
  if (type != cudaMemHandleTypePosixFileDescriptor) return;
  int fd = -1;
  cudaError_t e = cudaMemPoolExportToShareableHandle(&fd, p, type, 0);
  if (e != cudaSuccess || fd < 0) {
    cudaGetLastError();
    snprintf(pool_why[dev], sizeof pool_why[dev], "cudaMemPoolExportToShareableHandle: %s",
             cudaGetErrorString(e));
    return;
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    cudaGetLastError();
    snprintf(pool_why[dev], sizeof pool_why[dev], "the driver cannot say cuda:%d's UUID", dev);
    close(fd);
    return;
  }
  static_assert(sizeof prop.uuid == 16, "a 16-byte device UUID");
  memcpy(pool_uuids[dev], &prop.uuid, 16);
  uint64_t id = 0;
  if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) id = (uint64_t)time(NULL) ^ getpid();
  pool_fds[dev] = fd, pool_ids[dev] = id ? id : 1;
}

int copy_pool(int dev, cudaMemPool_t *out) {
  pthread_mutex_lock(&copy_pools_lock);
  int rc = 0;
  if (!copy_pools[dev]) {
    cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = pool_handle_type(dev);
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    cudaMemPool_t p = nullptr;
    uint64_t keep = 0;
    cudaError_t e = cudaMemPoolCreate(&p, &props);
    if (e != cudaSuccess && props.handleTypes != cudaMemHandleTypeNone) {
      /* copies must not fail to load because they cannot be shared: a plain pool then */
      cudaGetLastError();
      snprintf(pool_why[dev], sizeof pool_why[dev], "cudaMemPoolCreate of a shareable pool: %s",
               cudaGetErrorString(e));
      props.handleTypes = cudaMemHandleTypeNone;
      p = nullptr;
      e = cudaMemPoolCreate(&p, &props);
    }
    rc = fail_cuda(e, "cudaMemPoolCreate");
    if (rc == 0)
      rc = fail_cuda(cudaMemPoolSetAttribute(p, cudaMemPoolAttrReleaseThreshold, &keep),
                     "the release threshold of a memory pool");
    if (rc == 0) copy_pools[dev] = p, pool_export(dev, p, props.handleTypes);
    else if (p) cudaMemPoolDestroy(p);
  }
  *out = copy_pools[dev];
  pthread_mutex_unlock(&copy_pools_lock);
  return rc;
}

cudaMemPool_t copy_pool_if_any(int dev) {
  pthread_mutex_lock(&copy_pools_lock);
  cudaMemPool_t p = dev >= 0 && dev < NWCD_MAX_DEVICES ? copy_pools[dev] : nullptr;
  pthread_mutex_unlock(&copy_pools_lock);
  return p;
}

/* Destroys c's graphs (before a buffer they use goes). */
void drop_graphs(Ctx *c) {
  for (Graph &g : c->graphs) {
    if (g.exec) cudaGraphExecDestroy(g.exec);
    g = Graph{};
  }
}

void ctx_destroy(Ctx *c) {
  if (c->ready) {
    cudaStreamSynchronize(c->stream);
    drop_graphs(c);
    for (Buf *b : {&c->dx, &c->dy, &c->ds, &c->dout, &c->drows, &c->dbias}) free_buf(*b, false);
    free_buf(c->hin, true), free_buf(c->hout, true);
    cudaEventDestroy(c->done);
    cudaStreamDestroy(c->stream);
  }
  delete c;
}

/* A context of dev (made current) for the calling request; given back when it goes out of scope. */
struct Lease {
  Ctx *c = nullptr;
  int dev = 0;
  Lease() = default;
  Lease(const Lease &) = delete;
  ~Lease() {
    if (!c) return;
    Pool &p = pools[dev];
    pthread_mutex_lock(&p.lock);
    bool keep = p.n < kMaxIdle;
    if (keep) p.idle[p.n++] = c;
    pthread_mutex_unlock(&p.lock);
    if (!keep) ctx_destroy(c);
  }
  int take(int d) {
    if (d < 0 || d >= NWCD_MAX_DEVICES) return nwc__fail(-EINVAL, "CUDA device %d out of range", d);
    CU_TRY(cudaSetDevice(d), "cudaSetDevice");
    Pool &p = pools[d];
    pthread_mutex_lock(&p.lock);
    Ctx *got = p.n ? p.idle[--p.n] : nullptr;
    pthread_mutex_unlock(&p.lock);
    if (!got && !(got = new (std::nothrow) Ctx))
      return nwc__fail(-ENOMEM, "no memory for a CUDA context record");
    c = got, dev = d;
    if (!c->ready) {
      CU_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreate");
      cudaError_t e = cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming);
      if (e != cudaSuccess) {
        cudaStreamDestroy(c->stream);
        return fail_cuda(e, "cudaEventCreate");
      }
      c->ready = true;
    }
    return 0;
  }
  /* A context of cp's device whose stream waits for cp's blob to arrive (a queued load's copies
   * may still run: nwcd_cuda_blob_queued), so that what the caller enqueues reads it whole. */
  int take(const Copy *cp);
};

int Lease::take(const Copy *cp) {
  NWC_TRY(take(cp->dev));
  if (!__atomic_load_n(&cp->pending, __ATOMIC_ACQUIRE)) return 0;
  cudaError_t e = cudaEventQuery(cp->arrival);
  if (e == cudaSuccess) {
    __atomic_store_n(&cp->pending, 0, __ATOMIC_RELEASE);
    return 0;
  }
  if (e == cudaErrorNotReady) e = cudaStreamWaitEvent(c->stream, cp->arrival, 0);
  return fail_cuda(e, "the copies of a tensor's blob to the device");
}

/* c's buffer b holds at least n bytes (grown by doubling; contents not kept; c's graphs are
 * dropped first when it must be reallocated: a graph launched on a freed buffer, even one
 * allocated again at the same address, crashes the driver). */
int grow(Ctx *c, Buf &b, size_t n, bool host) {
  if (b.n >= n) return 0;
  drop_graphs(c);
  size_t want = b.n ? b.n : 4096;
  while (want < n) want *= 2;
  free_buf(b, host);
  /* pinned buffers are mapped: the matvec kernels write y straight into hout */
  cudaError_t e = host ? cudaHostAlloc(&b.p, want, cudaHostAllocMapped) : cudaMalloc(&b.p, want);
  /* device buffers start zeroed, on the context's stream before its kernels: the matvec's
   * scratch must (nwc_k_scratch_bytes) */
  if (e == cudaSuccess && !host && (e = cudaMemsetAsync(b.p, 0, want, c->stream)) != cudaSuccess) cudaFree(b.p);
  if (e != cudaSuccess) {
    b.p = nullptr;
    return fail_cuda(e, host ? "cudaHostAlloc of a staging buffer" : "cudaMalloc of a work buffer");
  }
  b.n = want;
  return 0;
}

/* Records the completion event on c's stream and waits for it. */
int finish(Ctx &c, const char *what) {
  CU_TRY(cudaEventRecord(c.done, c.stream), "cudaEventRecord");
  CU_TRY(cudaEventSynchronize(c.done), what);
  return 0;
}

/* ---- shared regions ------------------------------------------------------------------------ */

/* A connection's shared region (the client's memfd as nwcd maps it): its first len bytes
 * registered with CUDA (mapped, portable: every device) at the first matvec that uses it, until
 * nwcd_cuda_forget(owner).  A region that failed to register stays listed (dev nullptr), so
 * that its requests copy without trying again. */
struct Region {
  Region *next;
  const void *owner;
  uint8_t *base, *dev; /* dev: the device's view of base */
  uint64_t len, id;    /* id: unique for the process's life (keys the graphs that name it) */
};
pthread_mutex_t region_lock = PTHREAD_MUTEX_INITIALIZER;
Region *regions;
uint64_t region_ids;

/* owner's region (registered on the current device if it is new): 0 and *out, or -EAGAIN with a
 * detail when CUDA cannot register it (or it is not the one registered for owner). */
int region_of(const void *owner, uint8_t *base, uint64_t len, const Region **out) {
  pthread_mutex_lock(&region_lock);
  Region *r = regions;
  while (r && r->owner != owner) r = r->next;
  cudaError_t e = cudaSuccess;
  if (!r && (r = new (std::nothrow) Region{regions, owner, base, nullptr, len, ++region_ids})) {
    e = cudaHostRegister(base, len, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (e == cudaSuccess) {
      e = cudaHostGetDevicePointer((void **)&r->dev, base, 0);
      if (e != cudaSuccess) cudaHostUnregister(base), r->dev = nullptr;
    }
    if (e != cudaSuccess) cudaGetLastError();
    regions = r;
  }
  pthread_mutex_unlock(&region_lock);
  if (!r) return nwc__fail(-ENOMEM, "no memory for a shared region record");
  if (e != cudaSuccess)
    return nwc__fail(-EAGAIN, "cudaHostRegister of the shared region: %s", cudaGetErrorString(e));
  if (!r->dev || r->base != base || r->len != len)
    return nwc__fail(-EAGAIN, "the shared region is not registered with CUDA");
  *out = r;
  return 0;
}

/* Unregisters and forgets owner's region, if any (no request of owner runs). */
void region_forget(const void *owner) {
  pthread_mutex_lock(&region_lock);
  Region **pp = &regions;
  while (*pp && (*pp)->owner != owner) pp = &(*pp)->next;
  Region *r = *pp;
  if (r) *pp = r->next;
  pthread_mutex_unlock(&region_lock);
  if (r && r->dev && cudaHostUnregister(r->base) != cudaSuccess) cudaGetLastError();
  delete r;
}

/* ---- IPC ----------------------------------------------------------------------------------- */

typedef CUresult (*addr_range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr p);
addr_range_fn addr_range;
pthread_once_t addr_once = PTHREAD_ONCE_INIT;
void find_addr_range() {
  void *fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q) ==
          cudaSuccess &&
      q == cudaDriverEntryPointSuccess)
    addr_range = reinterpret_cast<addr_range_fn>(fn);
}

/* Client allocations opened by IPC, kept per connection ("owner") so that a client's repeated
 * requests on the same buffers do not open and close them each time (a few hundred
 * microseconds): closed when the connection ends (nwcd_cuda_ipc_forget), and beyond kIpcPerOwner
 * of one connection, or when every slot is taken, the least recently used one nothing uses. */
constexpr int kIpcSlots = 256, kIpcPerOwner = 16;
struct IpcSlot {
  bool used;
  const void *owner; /* nullptr: its connection ended while in use; closed on release */
  int dev;
  uint8_t h[64];
  void *base;
  uint64_t avail, last;
  unsigned users;
};
IpcSlot ipc[kIpcSlots];
pthread_mutex_t ipc_lock = PTHREAD_MUTEX_INITIALIZER;
uint64_t ipc_tick;

void ipc_close(IpcSlot &s) { /* ipc_lock held */
  if (cudaSetDevice(s.dev) != cudaSuccess || cudaIpcCloseMemHandle(s.base) != cudaSuccess)
    cudaGetLastError();
  s.used = false;
}

/* The least recently used unused slot (of owner, or of anyone with nullptr), or -1. */
int ipc_lru(const void *owner) {
  int v = -1;
  for (int i = 0; i < kIpcSlots; i++)
    if (ipc[i].used && !ipc[i].users && (!owner || ipc[i].owner == owner) &&
        (v < 0 || ipc[i].last < ipc[v].last))
      v = i;
  return v;
}

/* A client buffer for one request: its slot is released when this goes out of scope. */
struct Mapped {
  int slot = -1;
  uint8_t *p = nullptr;
  ~Mapped() {
    if (slot < 0) return;
    pthread_mutex_lock(&ipc_lock);
    IpcSlot &s = ipc[slot];
    if (!--s.users && !s.owner) ipc_close(s);
    pthread_mutex_unlock(&ipc_lock);
  }
};

/* Waits for a stream's work when it goes out of scope (declared after the Mapped buffers that
 * work uses, so it runs before they are released). */
struct Drain {
  Ctx *c;
  ~Drain() {
    if (c && cudaStreamSynchronize(c->stream) != cudaSuccess) cudaGetLastError();
  }
};

/* The slot of owner's handle h on the current device dev, opened if new (ipc_lock held). */
int ipc_slot(const void *owner, int dev, const uint8_t *h, const char *what, int *out) {
  int n = 0, freei = -1;
  for (int i = 0; i < kIpcSlots; i++) {
    if (!ipc[i].used) {
      if (freei < 0) freei = i;
      continue;
    }
    if (ipc[i].owner != owner) continue;
    if (ipc[i].dev == dev && !memcmp(ipc[i].h, h, 64)) return *out = i, 0;
    n++;
  }
  int v = n >= kIpcPerOwner ? ipc_lru(owner) : freei < 0 ? ipc_lru(nullptr) : -1;
  if (v >= 0) ipc_close(ipc[v]), freei = v;
  if (freei < 0)
    return nwc__fail(-EMFILE, "%d client allocations are open for IPC (all in use)", kIpcSlots);
  CU_TRY(cudaSetDevice(dev), "cudaSetDevice"); /* ipc_close may have left another current */
  cudaIpcMemHandle_t mh;
  memcpy(&mh, h, sizeof mh);
  void *base = nullptr;
  cudaError_t e = cudaIpcOpenMemHandle(&base, mh, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return nwc__fail(-EINVAL, "IPC %s handle does not open on this device: %s", what,
                     cudaGetErrorString(e));
  }
  pthread_once(&addr_once, find_addr_range);
  CUdeviceptr start = 0;
  size_t size = 0;
  if (!addr_range || addr_range(&start, &size, (CUdeviceptr)base) != CUDA_SUCCESS) {
    cudaIpcCloseMemHandle(base);
    return nwc__fail(-EIO, "IPC %s: the driver cannot say the opened allocation's size", what);
  }
  IpcSlot &s = ipc[freei];
  s = IpcSlot{true, owner, dev, {0}, base, size - ((CUdeviceptr)base - start), 0, 0};
  memcpy(s.h, h, 64);
  return *out = freei, 0;
}

/* Opens (or finds open) b's handle for owner on the current device dev and checks that need
 * bytes at b.off fit both the size the client gave and the allocation itself. */
int open_buf(const void *owner, int dev, const nwcd_ipc_buf &b, uint64_t need, const char *what,
             Mapped &m) {
  if (need > b.bytes)
    return nwc__fail(-EINVAL, "IPC %s buffer of %llu bytes; the request needs %llu", what,
                     (unsigned long long)b.bytes, (unsigned long long)need);
  pthread_mutex_lock(&ipc_lock);
  int slot = -1, rc = ipc_slot(owner, dev, b.handle, what, &slot);
  uint64_t avail = 0;
  uint8_t *base = nullptr;
  if (rc == 0) {
    IpcSlot &s = ipc[slot];
    s.users++, s.last = ++ipc_tick;
    avail = s.avail, base = static_cast<uint8_t *>(s.base);
    m.slot = slot;
  }
  pthread_mutex_unlock(&ipc_lock);
  if (rc < 0) return rc;
  if (b.off > avail || b.bytes > avail - b.off)
    return nwc__fail(-EINVAL,
                     "IPC %s buffer of %llu bytes at offset %llu overruns its allocation of %llu "
                     "bytes",
                     what, (unsigned long long)b.bytes, (unsigned long long)b.off,
                     (unsigned long long)avail);
  m.p = base + b.off;
  return 0;
}

/* Makes c's stream wait for the client's event (64 bytes of cudaIpcEventHandle_t), if any. */
int wait_client_event(Ctx &c, const uint8_t *ev) {
  if (!ev) return 0;
  cudaIpcEventHandle_t h;
  memcpy(&h, ev, sizeof h);
  cudaEvent_t e;
  cudaError_t err = cudaIpcOpenEventHandle(&e, h);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return nwc__fail(-EINVAL, "IPC event handle does not open: %s", cudaGetErrorString(err));
  }
  err = cudaStreamWaitEvent(c.stream, e, 0);
  cudaEventDestroy(e);
  CU_TRY(err, "cudaStreamWaitEvent on the client's event");
  return 0;
}

}  // namespace

/* ---- C entry points ------------------------------------------------------------------------ */

extern "C" int nwcd_cuda_devices(int *n) {
  int k = 0;
  cudaError_t e = cudaGetDeviceCount(&k);
  if (e != cudaSuccess || k < 1) {
    cudaGetLastError();
    return nwc__fail(-ENODEV, "no CUDA device (%s)",
                     e != cudaSuccess ? cudaGetErrorString(e) : "none found");
  }
  *n = k < NWCD_MAX_DEVICES ? k : NWCD_MAX_DEVICES;
  /* A request's worker spins on its completion event rather than sleeping: a sleeping waiter's
   * wake-up costs tens of microseconds per request (before any context exists, so it applies) */
  for (int d = 0; d < *n; d++)
    if (cudaSetDevice(d) != cudaSuccess || cudaSetDeviceFlags(cudaDeviceScheduleSpin) != cudaSuccess)
      cudaGetLastError();
  return 0;
}

extern "C" void nwcd_cuda_forget(const void *owner) {
  pthread_mutex_lock(&ipc_lock);
  for (int i = 0; i < kIpcSlots; i++) {
    if (!ipc[i].used || ipc[i].owner != owner) continue;
    if (ipc[i].users) ipc[i].owner = nullptr; /* the last release closes it */
    else ipc_close(ipc[i]);
  }
  pthread_mutex_unlock(&ipc_lock);
  region_forget(owner);
}

extern "C" void nwcd_cuda_trim(int dev) {
  if (dev < 0 || dev >= NWCD_MAX_DEVICES) return;
  Pool &p = pools[dev];
  pthread_mutex_lock(&p.lock);
  int n = p.n;
  Ctx *idle[kMaxIdle];
  memcpy(idle, p.idle, sizeof(Ctx *) * n);
  p.n = 0;
  pthread_mutex_unlock(&p.lock);
  if (cudaSetDevice(dev) != cudaSuccess) cudaGetLastError();
  for (int i = 0; i < n; i++) ctx_destroy(idle[i]);
  cudaMemPool_t cp = copy_pool_if_any(dev); /* what a last free has not given back yet */
  if (cp && cudaMemPoolTrimTo(cp, 0) != cudaSuccess) cudaGetLastError();
}

extern "C" int nwcd_cuda_meminfo(int dev, uint64_t *free_bytes, uint64_t *total_bytes) {
  CU_TRY(cudaSetDevice(dev), "cudaSetDevice");
  size_t f = 0, t = 0;
  CU_TRY(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
  *free_bytes = f, *total_bytes = t;
  return 0;
}

extern "C" int nwcd_cuda_pool_idle(int dev, uint64_t *bytes) {
  *bytes = 0;
  cudaMemPool_t cp = copy_pool_if_any(dev);
  if (!cp) return 0;
  cuuint64_t reserved = 0, used = 0;
  CU_TRY(cudaMemPoolGetAttribute(cp, cudaMemPoolAttrReservedMemCurrent, &reserved),
         "the reserved memory of a memory pool");
  CU_TRY(cudaMemPoolGetAttribute(cp, cudaMemPoolAttrUsedMemCurrent, &used),
         "the used memory of a memory pool");
  *bytes = reserved > used ? reserved - used : 0;
  return 0;
}

extern "C" int nwcd_cuda_blob_alloc(const nwc_tensor_info *ti, int dev, void *stream, void *stage,
                                    void **dcopy, void **blob) {
  CU_TRY(cudaSetDevice(dev), "cudaSetDevice");
  uint64_t lay[4];
  NWC_TRY(nwc_layout(ti->rows, ti->cols, ti->elem, lay));
  if (lay[NWC_LAYOUT_BLOCKS] != ti->nblocks)
    return nwc__fail(-EBADMSG, "catalog says %llu blocks, a %llux%llu tensor has %llu",
                     (unsigned long long)ti->nblocks, (unsigned long long)ti->rows,
                     (unsigned long long)ti->cols, (unsigned long long)lay[NWC_LAYOUT_BLOCKS]);
  cudaMemPool_t pool;
  NWC_TRY(copy_pool(dev, &pool));
  uint32_t *tab = static_cast<uint32_t *>(stage);
  NWC_TRY(nwc_build_tab(ti->psym, ti->elem, tab));
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  Copy *cp = new (std::nothrow) Copy;
  if (!cp) return nwc__fail(-ENOMEM, "no memory for a device copy record");
  memset(&cp->k, 0, sizeof cp->k);
  cp->bytes = kTabSpace + ti->length;
  uint8_t *mem = nullptr;
  cudaError_t e = cudaMallocFromPoolAsync((void **)&mem, cp->bytes, pool, st);
  int rc = e == cudaErrorMemoryAllocation
               ? nwc__fail(-ENOMEM, "no device memory for a copy of %llu bytes on cuda:%d",
                           (unsigned long long)cp->bytes, dev)
               : fail_cuda(e, "cudaMallocFromPoolAsync of a device copy");
  if (rc == 0)
    rc = fail_cuda(cudaMemcpyAsync(mem, tab, kTabSpace, cudaMemcpyHostToDevice, st),
                   "copy of the lookup table");
  if (rc < 0) {
    if (mem && cudaFreeAsync(mem, st) == cudaSuccess) cudaStreamSynchronize(st);
    cudaGetLastError();
    delete cp;
    return rc;
  }
  cp->dev = dev, cp->k16 = lay[NWC_LAYOUT_K16];
  cp->id = __atomic_add_fetch(&copy_ids, 1, __ATOMIC_RELAXED);
  cp->k.owned = mem;
  *dcopy = cp, *blob = mem + kTabSpace;
  return 0;
}

extern "C" void nwcd_cuda_blob_finish(void *dcopy, const nwc_tensor_info *ti) {
  Copy *cp = static_cast<Copy *>(dcopy);
  uint8_t *mem = static_cast<uint8_t *>(cp->k.owned), *blob = mem + kTabSpace;
  nwc_k_tensor &k = cp->k;
  k.elem = ti->elem, k.rows = ti->rows, k.cols = ti->cols, k.nblocks = ti->nblocks;
  k.tab = reinterpret_cast<const uint32_t *>(mem);
  k.bases = reinterpret_cast<const uint64_t *>(blob + ti->off_bases);
  k.hdr = blob + ti->off_hdr, k.data = blob + ti->off_data, k.raw = blob + ti->off_raw;
  k.scale = ti->off_scale ? reinterpret_cast<const float *>(blob + ti->off_scale) : nullptr;
  memcpy(k.psym, ti->psym, sizeof k.psym);
  /* one scratch serves every matvec of the copy: up to kMaxCols columns a launch */
  const int64_t scratch = nwc_k_scratch_bytes(&k, kMaxCols);
  cp->scratch = scratch > 0 ? (uint64_t)scratch : 0;
}

extern "C" int nwcd_cuda_scales(const void *dcopy, float *out) {
  const Copy *cp = static_cast<const Copy *>(dcopy);
  if (!cp->k.scale) return nwc__fail(-EINVAL, "a device copy without per-row scales");
  CU_TRY(cudaSetDevice(cp->dev), "cudaSetDevice");
  if (cp->arrival) CU_TRY(cudaEventSynchronize(cp->arrival), "the copies of a blob");
  CU_TRY(cudaMemcpy(out, cp->k.scale, cp->k.rows * 4, cudaMemcpyDeviceToHost),
         "copy of the scales");
  return 0;
}

extern "C" int nwcd_cuda_blob_queued(void *dcopy, void *stream) {
  Copy *cp = static_cast<Copy *>(dcopy);
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaSetDevice(cp->dev);
  if (e == cudaSuccess && !cp->arrival)
    e = cudaEventCreateWithFlags(&cp->arrival, cudaEventDisableTiming | cudaEventBlockingSync);
  if (e == cudaSuccess) e = cudaEventRecord(cp->arrival, st);
  if (e == cudaSuccess) {
    __atomic_store_n(&cp->pending, 1, __ATOMIC_RELEASE);
    return 0;
  }
  int rc = fail_cuda(e, "an event after the copies of a blob");
  cudaStreamSynchronize(st); /* the copy is freed next: nothing may still write it */
  return rc;
}

extern "C" uint64_t nwcd_cuda_copy_size(const void *dcopy) {
  return static_cast<const Copy *>(dcopy)->bytes;
}

extern "C" int nwcd_cuda_share_pool(int dev, int *fd, uint64_t *pool_id, uint8_t uuid[16]) {
  if (dev < 0 || dev >= NWCD_MAX_DEVICES) return nwc__fail(-ENODEV, "no device cuda:%d", dev);
  CU_TRY(cudaSetDevice(dev), "cudaSetDevice");
  cudaMemPool_t p;
  NWC_TRY(copy_pool(dev, &p));
  pthread_mutex_lock(&copy_pools_lock);
  *fd = pool_fds[dev], *pool_id = pool_ids[dev];
  memcpy(uuid, pool_uuids[dev], 16);
  pthread_mutex_unlock(&copy_pools_lock);
  NWC_RETURN_IF(*fd < 0, -ENOTSUP, "cuda:%d's copies cannot be mapped: %s", dev, pool_why[dev]);
  return 0;
}

extern "C" int nwcd_cuda_export(const void *dcopy, uint8_t data[64], uint64_t *bytes,
                                uint64_t *blob_off) {
  const Copy *cp = static_cast<const Copy *>(dcopy);
  CU_TRY(cudaSetDevice(cp->dev), "cudaSetDevice");
  /* a client must not touch the copy before its copies are done (cudaMemPoolImportPointer) */
  if (cp->arrival) CU_TRY(cudaEventSynchronize(cp->arrival), "the copies of a blob");
  static_assert(sizeof(cudaMemPoolPtrExportData) == 64, "export data of 64 bytes");
  cudaMemPoolPtrExportData ed;
  CU_TRY(cudaMemPoolExportPointer(&ed, cp->k.owned), "cudaMemPoolExportPointer");
  memcpy(data, &ed, 64);
  *bytes = cp->bytes, *blob_off = kTabSpace;
  return 0;
}

extern "C" void nwcd_cuda_free(void *dcopy) {
  Copy *cp = static_cast<Copy *>(dcopy);
  if (!cp) return;
  /* Back into the pool on a stream of the device (no request uses the copy any more), and from
   * there to the device at the synchronization; cudaFree, which waits for the whole device, only
   * if no context can be had. */
  Lease lease;
  if (lease.take(cp) < 0 || cudaFreeAsync(cp->k.owned, lease.c->stream) != cudaSuccess ||
      cudaStreamSynchronize(lease.c->stream) != cudaSuccess) {
    cudaGetLastError();
    if (cp->arrival) cudaEventSynchronize(cp->arrival);
    cudaFree(cp->k.owned);
  }
  if (cp->arrival) cudaEventDestroy(cp->arrival);
  delete cp;
}

/* Device output of bytes copied back through the pinned buffer into out, after the wait. */
static int copy_back(Ctx *c, const void *dsrc, size_t bytes, void *out, const char *what) {
  int rc = grow(c, c->hout, bytes, true);
  if (rc == 0)
    rc = fail_cuda(cudaMemcpyAsync(c->hout.p, dsrc, bytes, cudaMemcpyDeviceToHost, c->stream), what);
  if (rc == 0) rc = finish(*c, what);
  if (rc == 0) memcpy(out, c->hout.p, bytes);
  return rc;
}

extern "C" int nwcd_cuda_dequant(const void *dcopy, uint16_t *out) {
  const Copy *cp = static_cast<const Copy *>(dcopy);
  Lease lease;
  int rc = lease.take(cp);
  Ctx *c = lease.c;
  size_t bytes = cp->k.rows * cp->k16 * 2;
  if (rc == 0) rc = grow(c, c->dout, bytes, false);
  if (rc == 0) rc = kstatus(nwc_k_dequant(&cp->k, (uint16_t *)c->dout.p, c->stream), "dequant");
  if (rc == 0) rc = copy_back(c, c->dout.p, bytes, out, "dequant");
  return rc;
}

extern "C" int nwcd_cuda_gather(const void *dcopy, const uint64_t *rows, uint64_t n, uint16_t *out) {
  const Copy *cp = static_cast<const Copy *>(dcopy);
  Lease lease;
  int rc = lease.take(cp);
  Ctx *c = lease.c;
  size_t bytes = n * cp->k16 * 2;
  if (rc == 0) rc = grow(c, c->drows, n * 8, false);
  if (rc == 0) rc = grow(c, c->hin, n * 8, true);
  if (rc == 0) rc = grow(c, c->dout, bytes, false);
  if (rc == 0) {
    memcpy(c->hin.p, rows, n * 8);
    rc = fail_cuda(cudaMemcpyAsync(c->drows.p, c->hin.p, n * 8, cudaMemcpyHostToDevice, c->stream),
                   "copy of gather rows");
  }
  if (rc == 0)
    rc = kstatus(nwc_k_gather(&cp->k, (const uint64_t *)c->drows.p, n, (uint16_t *)c->dout.p,
                              c->stream),
                 "gather");
  if (rc == 0) rc = copy_back(c, c->dout.p, bytes, out, "gather");
  return rc;
}

/* The matvec of the ncols columns already in c->dx (stride K16) into y (stride M; device memory
 * or the device view of mapped pinned memory), enqueued on c's stream: kMaxCols columns a launch
 * (layout 2 multiplies them in one pass over the weights; layout 0 runs a column at a time). */
static int enqueue_matvecs(Ctx *c, const Copy *cp, unsigned ncols, float *y) {
  const uint64_t M = cp->k.rows, K16 = cp->k16;
  int rc = 0;
  for (unsigned col = 0; rc == 0 && col < ncols; col += kMaxCols) {
    unsigned n = ncols - col < kMaxCols ? ncols - col : kMaxCols;
    rc = kstatus(nwc_k_matvec_cols(&cp->k, (const float *)c->dx.p + col * K16, n, K16, NULL,
                                   y + col * M, NULL, M, c->ds.p, c->stream),
                 "matvec");
  }
  return rc;
}

/* x up into c->dx (zero padded to K16) by nwc_k_load_x, then the kernels writing y, enqueued
 * on c's stream. */
static int enqueue_io(Ctx *c, const Copy *cp, unsigned ncols, const Io &io) {
  NWC_TRY(kstatus(nwc_k_load_x(io.x, cp->k.cols, io.xld, ncols, (float *)c->dx.p, c->stream),
              "launch of the x copy"));
  return enqueue_matvecs(c, cp, ncols, io.y);
}

static bool same_io(const Io &a, const Io &b) {
  return a.src == b.src && a.x == b.x && a.xld == b.xld && a.y == b.y;
}

/* enqueue_io as it is, or, from the second time the same (tensor, columns, x and y) come by, as
 * one launch of the CUDA graph captured from that sequence then (cached per context, LRU): one
 * submission instead of 1 + 2 per column. */
static int launch_matvec(Ctx *c, const Copy *cp, unsigned ncols, const Io &io) {
  Graph *slot = &c->graphs[0];
  bool match = false;
  for (Graph &g : c->graphs) {
    if (g.id == cp->id && g.ncols == ncols && same_io(g.io, io)) {
      slot = &g, match = true;
      break;
    }
    if (g.last < slot->last) slot = &g;
  }
  slot->last = ++c->tick;
  if (match && slot->exec)
    return fail_cuda(cudaGraphLaunch(slot->exec, c->stream), "cudaGraphLaunch of a matvec");
  bool again = match; /* seen once before: capture it this time */
  if (!again) {
    if (slot->exec) cudaGraphExecDestroy(slot->exec);
    *slot = Graph{cp->id, ncols, io, c->tick, nullptr};
  }
  /* Relaxed: the kernels' entry points set function attributes while this thread captures; the
   * stream is this context's alone, so nothing else joins the capture. */
  if (again)
    CU_TRY(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed), "stream capture");
  int rc = enqueue_io(c, cp, ncols, io);
  if (!again) return rc;
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(c->stream, &graph); /* ends it whatever happened inside */
  if (rc == 0) rc = fail_cuda(e, "stream capture of a matvec");
  if (rc == 0) rc = fail_cuda(cudaGraphInstantiate(&slot->exec, graph, 0), "cudaGraphInstantiate");
  if (graph) cudaGraphDestroy(graph);
  if (rc < 0) {
    slot->exec = nullptr, slot->id = 0, slot->last = 0;
    return rc;
  }
  return fail_cuda(cudaGraphLaunch(slot->exec, c->stream), "cudaGraphLaunch of a matvec");
}

/* launch_matvec, then the wait (spinning: cudaDeviceScheduleSpin); it waits also after a failed
 * launch, so that nothing still runs on the context's buffers when it goes back to the pool. */
static int run_matvec(Ctx *c, const Copy *cp, unsigned ncols, const Io &io) {
  int rc = launch_matvec(c, cp, ncols, io);
  cudaError_t e = cudaStreamSynchronize(c->stream);
  return rc ? rc : fail_cuda(e, "matvec");
}

extern "C" int nwcd_cuda_matvec(const void *dcopy, const float *X, unsigned ncols, size_t ldx,
                                float *Y, size_t ldy) {
  const Copy *cp = static_cast<const Copy *>(dcopy);
  const uint64_t M = cp->k.rows, K16 = cp->k16;
  Lease lease;
  NWC_TRY(lease.take(cp));
  Ctx *c = lease.c;
  size_t xb = (size_t)ncols * K16 * 4, yb = (size_t)ncols * M * 4;
  NWC_TRY(grow(c, c->dx, xb, false));
  NWC_TRY(grow(c, c->hin, xb, true));
  NWC_TRY(grow(c, c->ds, cp->scratch, false));
  NWC_TRY(grow(c, c->hout, yb, true));
  for (unsigned col = 0; col < ncols; col++)
    memcpy((float *)c->hin.p + col * K16, X + col * ldx, K16 * 4);
  Io io = {0, nullptr, K16, nullptr};
  CU_TRY(cudaHostGetDevicePointer((void **)&io.x, c->hin.p, 0), "cudaHostGetDevicePointer");
  CU_TRY(cudaHostGetDevicePointer((void **)&io.y, c->hout.p, 0), "cudaHostGetDevicePointer");
  NWC_TRY(run_matvec(c, cp, ncols, io));
  for (unsigned col = 0; col < ncols; col++)
    memcpy(Y + col * ldy, (const float *)c->hout.p + col * M, M * 4);
  return 0;
}

extern "C" int nwcd_cuda_matvec_shared(const void *owner, void *region, uint64_t window,
                                       const void *dcopy, uint64_t x_off, unsigned ncols,
                                       uint64_t y_off) {
  const Copy *cp = static_cast<const Copy *>(dcopy);
  Lease lease;
  NWC_TRY(lease.take(cp));
  const Region *g = nullptr;
  NWC_TRY(region_of(owner, static_cast<uint8_t *>(region), window, &g));
  Ctx *c = lease.c;
  NWC_TRY(grow(c, c->dx, (size_t)ncols * cp->k16 * 4, false));
  NWC_TRY(grow(c, c->ds, cp->scratch, false));
  Io io = {g->id, reinterpret_cast<const float *>(g->dev + x_off), cp->k.cols,
           reinterpret_cast<float *>(g->dev + y_off)};
  return run_matvec(c, cp, ncols, io);
}

extern "C" int nwcd_cuda_matvec_ipc(const void *owner, const void *dcopy, const nwcd_ipc_buf *x,
                                    const nwcd_ipc_buf *y, unsigned ncols, float scale,
                                    const float *bias, int bf16, const uint8_t *ev) {
  const Copy *cp = static_cast<const Copy *>(dcopy);
  const uint64_t M = cp->k.rows, K = cp->k.cols, K16 = cp->k16;
  Lease lease;
  int rc = lease.take(cp);
  Ctx *c = lease.c;
  if (rc < 0) return rc;
  Mapped mx, my;
  Drain drain{c}; /* before the buffers are released, even on an error return */
  NWC_TRY(open_buf(owner, cp->dev, *x, (uint64_t)ncols * K * 4, "x", mx));
  NWC_TRY(open_buf(owner, cp->dev, *y, (uint64_t)ncols * M * (bf16 ? 2 : 4), "y", my));
  NWC_TRY(wait_client_event(*c, ev));
  NWC_TRY(grow(c, c->dx, (size_t)ncols * K16 * 4, false));
  if (K16 != K) CU_TRY(cudaMemsetAsync(c->dx.p, 0, (size_t)ncols * K16 * 4, c->stream), "memset");
  CU_TRY(cudaMemcpy2DAsync(c->dx.p, K16 * 4, mx.p, K * 4, K * 4, ncols, cudaMemcpyDeviceToDevice,
                           c->stream),
         "copy of the client's x");
  if (bias) {
    NWC_TRY(grow(c, c->dbias, M * 4, false));
    NWC_TRY(grow(c, c->hin, M * 4, true));
    memcpy(c->hin.p, bias, M * 4);
    CU_TRY(cudaMemcpyAsync(c->dbias.p, c->hin.p, M * 4, cudaMemcpyHostToDevice, c->stream),
           "copy of the bias");
  }
  NWC_TRY(grow(c, c->dy, (size_t)ncols * M * 4, false));
  NWC_TRY(grow(c, c->ds, cp->scratch, false));
  NWC_TRY(enqueue_matvecs(c, cp, ncols, (float *)c->dy.p));
  NWC_TRY(kstatus(nwc_k_epilogue((const float *)c->dy.p, M, ncols, scale,
                              bias ? (const float *)c->dbias.p : nullptr, my.p, bf16, c->stream),
              "epilogue launch"));
  return finish(*c, "matvec into the client's buffer");
}

extern "C" int nwcd_cuda_dequant_ipc(const void *owner, const void *dcopy, const nwcd_ipc_buf *out,
                                     int bf16, const uint8_t *ev) {
  const Copy *cp = static_cast<const Copy *>(dcopy);
  const uint64_t M = cp->k.rows, K = cp->k.cols, K16 = cp->k16;
  Lease lease;
  int rc = lease.take(cp);
  Ctx *c = lease.c;
  if (rc < 0) return rc;
  Mapped mo;
  Drain drain{c};
  NWC_TRY(open_buf(owner, cp->dev, *out, M * K * (bf16 ? 2 : 4), "output", mo));
  NWC_TRY(wait_client_event(*c, ev));
  if (bf16 && K16 == K) { /* straight into the client's buffer */
    NWC_TRY(kstatus(nwc_k_dequant(&cp->k, (uint16_t *)mo.p, c->stream), "dequant"));
  } else {
    NWC_TRY(grow(c, c->dout, M * K16 * 2, false));
    NWC_TRY(kstatus(nwc_k_dequant(&cp->k, (uint16_t *)c->dout.p, c->stream), "dequant"));
    NWC_TRY(kstatus(nwc_k_compact((const uint16_t *)c->dout.p, M, K, mo.p, bf16, c->stream),
                "compact launch"));
  }
  return finish(*c, "dequant into the client's buffer");
}
