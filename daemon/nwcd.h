/*
 * nwcd.h - what the daemon's modules share (not installed).
 *
 *   main.c       flags -> nwcd_config, signals, startup and shutdown order
 *   server.c     libuv loop: listening socket, connections, framing, back-pressure, replies
 *   ops.c        request handlers (run on worker threads), reply encoding, matvec batching
 *   pool.c       worker threads and their job queue (coalescing hook for batched matvec)
 *   residency.c  resident tensors: states, budget, LRU, reference counts, client mappings (map)
 *                (design comment there)
 *   loader.c     io_uring reads of blobs, chunk checksums checked as they land: into host
 *                memory, or through a ring of registered buffers to a sink (the GPU path)
 *   backend_cpu.c  the compute backend interface's CPU implementation (and the CUDA wiring)
 *   backend_cuda.cu  the CUDA backend: device copies, streams per worker, the kernels, IPC
 *   config.c, notify.c, policy.c  the config file, systemd glue, access policy (service.h)
 *
 * Threads: the loop thread owns connections and sockets; worker threads run jobs; the store
 * handle is used under nwcd.store_lock (one caller at a time) except by import, which the store
 * serializes itself so that other requests go on while it encodes; residency under its own mutex.
 * Lock order: store_lock before the residency mutex, never the other way round.
 */
#ifndef NWCD_H
#define NWCD_H

#include "backend_cuda.h" /* nwcd_ipc_buf (declarations only) */
#include "nwc.h"
#include "nwc_proto.h"
#include "nwc_store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define NWCD_VERSION "nwcd 0.1.0"

/* ---- configuration (flags fill it; #6 adds a config file on top) ------------------------- */

typedef struct nwcd_config {
  const char *store_dir;
  const char *socket_path; /* NULL: nwcd_default_socket() */
  const char *backend;     /* "auto", "cpu", "cuda" */
  uint64_t budget;         /* bytes of resident tensors; 0: half of physical memory */
  uint64_t gpu_budget;     /* bytes of device copies per CUDA device; 0: 90% of its free memory */
  unsigned threads;        /* worker threads; 0: online cores */
  unsigned max_conn_per_uid;
  unsigned max_inflight;   /* requests in flight per connection before reading pauses */
  uint64_t max_outq;       /* queued reply bytes per connection before reading pauses */
  unsigned poll_us;        /* the loop polls this long after a request before it sleeps; 0 never */
  unsigned socket_mode;    /* 0660 */
  int verbose;
} nwcd_config;

/* Default socket path: $NWC_SOCKET, else $XDG_RUNTIME_DIR/nwc/nwcd.sock, else /run/nwc/nwcd.sock
 * as root (or /tmp/nwc-UID/nwcd.sock).  Writes into buf[n]; returns buf. */
const char *nwcd_default_socket(char *buf, size_t n);
/* Parses "512M", "2G", "1.5GiB", "1048576": 0 and *out, or -EINVAL. */
int nwcd_parse_size(const char *s, uint64_t *out);

void nwcd_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
enum { NWCD_LOG_ERR = 0, NWCD_LOG_WARN = 1, NWCD_LOG_INFO = 2, NWCD_LOG_DEBUG = 3 };
extern int nwcd_log_level;

/* ---- compute backend ------------------------------------------------------------------- */

struct nwcd_load_info;

/* What a compute backend provides; #8 adds a CUDA one next to cpu.  Every function returns 0 or
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
  /* Drops what the backend keeps for owner, a connection that has ended with none of its
   * requests running (IPC handles, the registered shared region); NULL where it keeps none. */
  void (*forget)(const void *owner);
} nwcd_backend;

/* Where a tensor lives: NWCD_LOC_CPU (host memory) or device n >= 0 (cuda:n); requests may say
 * NWCD_LOC_DEFAULT (the wire's -2): device 0 with a backend that has devices, else host. */
#define NWCD_LOC_DEFAULT (-2)
#define NWCD_LOC_CPU (-1)
#define NWCD_MAX_DEVICES 16

/* The backend called name ("auto", "cpu", "cuda"): 0 and *out, -ENOTSUP with a detail for one
 * this build lacks, -EINVAL for an unknown name. */
int nwcd_backend_get(const char *name, const nwcd_backend **out);
/* Logs once, at startup, what pages the host copies' memfds get: 2 MiB where the kernel's
 * transparent_hugepage/shmem_enabled gives shmem huge pages (always, within_size, force), else
 * 4 KiB, with the setting that changes it (a load into new memory makes each page; nwcd(8),
 * PERFORMANCE).  Silent when the kernel has no such file. */
void nwcd_host_pages_note(void);

/* ---- loader (loader.c: the one module that owns io_uring; design comment there) ---------- */

/* CLOCK_MONOTONIC in nanoseconds (loader.c: the loader library's, for the daemon as well). */
uint64_t nwcd_now_ns(void);

/* A model's tensors load in this many lanes at once (ops.c): into host memory 8, into GPU
 * memory 16, and the cuda backend keeps as many staging rings per device (backend_cpu.c).  A
 * warm load into GPU memory is bound by the CPU: each lane copies the page cache into its ring
 * and checks the chunks (a hot load), at a few GB/s per core on the H200 host, so its lanes are
 * as many as that host's 16 cores (docs/results.md, issue 8). */
#define NWCD_LOAD_LANES 8
#define NWCD_GPU_LOAD_LANES 16
/* The most bytes a lane that has run out of tensors takes of another's at once (crew.c), onto a
 * device or into host memory: a GPU ring's slot, 4 MiB. */
#define NWCD_CREW_PART (4u << 20)

typedef struct nwcd_load_info {
  bool direct;           /* some of it was read with O_DIRECT (from the disk, past the cache) */
  uint64_t bytes;        /* bytes loaded: the blob's length, a part's (nwcd_load_opts.from, .to)
                            or, once a crew offer is withdrawn, the owner's and its helpers' */
  uint64_t direct_bytes; /* of bytes, read with O_DIRECT; the rest came through the page cache */
  uint64_t micros;
  /* where the loading thread's time went (ns): in io_uring waiting for reads (hot loads: also
   * copying them), checking chunks (its share; helper threads check beside it), in the sink
   * (ring loads: consume and reclaim without waiting), waiting for the sink to give slots
   * back, and making the destination before (a device copy: allocating it, its lookup table) */
  uint64_t wait_ns, check_ns, sink_ns, drain_ns, alloc_ns;
} nwcd_load_info;
/* Adds li's time split (the *_ns fields) to sum's: several loads' time, taken apart. */
void nwcd_load_info_add(nwcd_load_info *sum, const nwcd_load_info *li);

/* Bytes of a blob read and checked so far (monotonic, chunk by chunk), of total. */
typedef void (*nwcd_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* crew.c: the lanes of one model load help each other finish.  A crew is made per load, each
 * lane joins it (a thread-local) for its loads; a lane's load of a large blob offers it, reads it
 * from the front and withdraws the offer when done; a lane with no tensor left helps, taking
 * parts from the back of the offers through the offer's part function. */
typedef struct nwcd_crew nwcd_crew;
typedef struct nwcd_split nwcd_split;
/* Loads bytes [off, off + len) of an offered blob for a helper: 0 or -errno with a detail. */
typedef int (*nwcd_part_fn)(void *ctx, uint64_t off, uint64_t len, nwcd_load_info *li);
/* A crew whose helpers take parts of at most part bytes; NULL without memory. */
nwcd_crew *nwcd_crew_new(uint64_t part);
void nwcd_crew_free(nwcd_crew *c);
/* The calling thread's loads offer their blobs to c from now on (NULL: to none). */
void nwcd_crew_join(nwcd_crew *c);
nwcd_crew *nwcd_crew_joined(void);
/* Offers a blob of length bytes (parts at multiples of align, the chunk size) to c; NULL when
 * it is too small to share (under three parts) or c is NULL: the owner then loads it all. */
nwcd_split *nwcd_crew_offer(nwcd_crew *c, uint64_t length, uint64_t align, nwcd_part_fn fn,
                            void *ctx);
/* The owner's next read, [from, from + len): the bytes of it still the owner's (0: helpers took
 * the rest of the blob). */
uint64_t nwcd_split_claim(nwcd_split *s, uint64_t from, uint64_t len);
/* Ends the offer after the owner's load (rc its result, li its nwcd_load_info or NULL): waits
 * for the parts helpers are loading, then loads itself (the offer's function, on this thread)
 * each part a helper failed to load; returns rc, else that load's error, else 0 (every byte of
 * the blob loaded; the helpers' bytes, O_DIRECT bytes and the wait added to li). */
int nwcd_crew_withdraw(nwcd_split *s, int rc, nwcd_load_info *li);
/* Takes and loads spare parts of c's offers until none has one; their time split adds to sum
 * (nwcd_load_info_add; sum may be NULL). */
void nwcd_crew_help(nwcd_crew *c, nwcd_load_info *sum);
/* Parts and bytes that helpers took so far. */
void nwcd_crew_taken(const nwcd_crew *c, uint64_t *parts, uint64_t *bytes);

enum {
  NWCD_LOAD_AUTO = 0, /* page cache where the blob is cached (buffered reads, IOSQE_ASYNC),
                         O_DIRECT where it is not; blobs up to 4 MiB, and files that refuse
                         O_DIRECT, buffered */
  NWCD_LOAD_DIRECT,   /* O_DIRECT for everything the file system allows */
  NWCD_LOAD_BUFFERED, /* buffered reads only */
};

typedef struct nwcd_load_opts {
  unsigned mode;      /* NWCD_LOAD_* */
  unsigned depth;     /* reads in flight, 1..64; 0: 32 */
  uint64_t read_size; /* bytes per read, a multiple of the chunk size (1 MiB); 0: 1-4 MiB by
                         blob size (ring loads: the slot size) */
  unsigned checkers;  /* threads checking chunks, the loading one included, 1..4; 0: one more
                         per 8 online cores */
  bool hot;           /* page-cache reads one at a time, without IOSQE_ASYNC: the loading thread
                         copies each inside io_uring_enter and checks it while the bytes are in
                         its own cache (for loads that run in as many lanes as there are cores;
                         O_DIRECT reads still go many at a time) */
  uint64_t piece;     /* hot loads: page-cache bytes copied, then checked, this many at a time (a
                         multiple of the chunk size; 0: a whole read at once), so that a read
                         larger than a core's L2 is still checked while its bytes are there */
  nwcd_progress_fn progress; /* may be NULL */
  void *ctx;
  nwcd_split *split; /* an offer to a crew (crew.c): each read is claimed from it first, so the
                        load covers the blob's front and leaves the back to the crew's helpers
                        (its progress then ends short of the blob's length) */
  uint64_t from, to; /* only bytes [from, to) of the blob, at the same offsets of the destination
                        (from a multiple of the chunk size, to one or the blob's end; to 0: the
                        end): a crew helper's part, its chunks named as the blob's */
  bool queued;       /* ring loads: return once every slot is checked and with the sink, leaving
                        the slots whose sink work is still running with it (the ring's next load
                        reclaims them) instead of waiting for that work (a failed load still
                        waits) */
} nwcd_load_opts;

/* Reads ti's blob into buf (ti->length bytes, 4096-aligned) on the calling thread's io_uring
 * (created at its first load, kept for the next), checking every chunk's checksum as it lands.
 * Returns 0, or a negative errno with a detail (-EBADMSG naming the chunk, -EIO for a file that
 * ends early); it returns only with no read in flight, so buf is never written after it.  o may
 * be NULL (defaults); li may be NULL. */
int nwcd_load(const nwc_tensor_info *ti, void *buf, const nwcd_load_opts *o, nwcd_load_info *li);
/* The same with the default options. */
int nwcd_load_blob(const nwc_tensor_info *ti, void *buf, nwcd_load_info *li,
                   nwcd_progress_fn progress, void *ctx);
/* Reads ti's blob into the file fd (a memfd: host residency) at [0, ti->length) with pwrite,
 * through the calling thread's staging ring (8 MiB in slots of 1 MiB, the largest read_size;
 * made at its first call, kept until the thread exits), every chunk checked before it is
 * written.  Returns as nwcd_load (-EBADMSG,
 * -EIO, or the write's error, e.g. -ENOSPC); bytes may have been written when it fails. */
int nwcd_load_fd(const nwc_tensor_info *ti, int fd, const nwcd_load_opts *o, nwcd_load_info *li);
/* Loads on the calling thread also report to fn (ctx) until it is set back to NULL: how a
 * request handler sees the progress of loads that residency runs for it. */
void nwcd_load_observe(nwcd_progress_fn fn, void *ctx);

/* A bounded ring of pinned, io_uring-registered buffers (slots) that loads stream through to a
 * sink, e.g. the GPU path: the sink copies each checked slot to the device and gives the slot
 * back when the copy has completed. */
typedef struct nwcd_ring nwcd_ring;

typedef struct nwcd_slot {
  unsigned index;  /* for nwcd_ring_release */
  void *data;      /* the bytes [offset, offset + len) of the blob, checked */
  uint64_t offset, len;
} nwcd_slot;

typedef struct nwcd_sink {
  /* Takes a checked slot (on the loading thread; any order of offsets): 0, or a negative errno
   * that stops the load.  The slot is the sink's until it calls nwcd_ring_release. */
  int (*consume)(void *ctx, nwcd_ring *r, const nwcd_slot *s);
  /* Releases the slots whose use has finished; with wait, blocks until it has released at
   * least one (the loader has no free slot and no read in flight).  0, or a negative errno:
   * then the sink gives up all its slots (nothing of them is read any more). */
  int (*reclaim)(void *ctx, nwcd_ring *r, bool wait);
  void *ctx;
} nwcd_sink;

/* A ring of bytes (0: 256 MiB) in slots of slot_size (0: 4 MiB; a multiple of 1 MiB) of
 * memory mapped and locked here, registered with the ring's own io_uring (reads into a
 * registered buffer skip the page pinning of each read).  Free with nwcd_ring_free. */
int nwcd_ring_create(uint64_t bytes, uint64_t slot_size, nwcd_ring **out);
void nwcd_ring_free(nwcd_ring *r);
/* The ring's memory (e.g. for cudaHostRegister): its bytes and how many slots it holds. */
void *nwcd_ring_memory(const nwcd_ring *r, uint64_t *bytes, unsigned *slots);
/* Gives a consumed slot back (on the loading thread: from the sink's consume or reclaim). */
void nwcd_ring_release(nwcd_ring *r, unsigned slot);
/* Streams ti's blob through r to sink (one load at a time per ring: others wait), chunks checked
 * before a slot is consumed.  Returns when every read has completed and every slot is back
 * (the sink's work on them has finished), 0 or the first error; a queued load (o->queued) that
 * succeeds returns with the slots still in the sink's work held by it, and a later load on r
 * reclaims them through its own sink, which must therefore release the same slots in the same
 * way (the GPU ring's sink: in the order their copies were queued on its one stream). */
int nwcd_ring_load(nwcd_ring *r, const nwc_tensor_info *ti, const nwcd_load_opts *o,
                   const nwcd_sink *sink, nwcd_load_info *li);

/* loader_cuda.c (CUDA builds: the nwcd_loader_cuda library, NWCD_WITH_CUDA defined): a ring
 * whose sink copies each slot to device memory with cudaMemcpyAsync, releasing slots as their
 * copies' events complete. */
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

/* ---- residency --------------------------------------------------------------------------- */

typedef struct nwcd_res nwcd_res;
typedef struct nwcd_entry nwcd_entry;

/* A reference to a tensor usable for compute: view valid until nwcd_res_release. */
typedef struct nwcd_ref {
  nwcd_entry *e;          /* resident entry (refs held), or NULL when mapped */
  nwc_store_map *map;     /* mapped container (non-resident compute), or NULL */
  nwc_tensor view;        /* shapes always; the arrays and scales only for host copies */
  const nwc_tensor_info *ti;
  const void *dcopy;      /* the device copy (backend's) when it lives on a device, else NULL */
  int loc;                /* NWCD_LOC_CPU or the device (also for a load or pin: no ref) */
  bool loaded;            /* this acquire loaded it */
} nwcd_ref;

enum {
  NWCD_ACQ_MAP_OK = 1, /* may fall back to mapping the container when it cannot fit */
  NWCD_ACQ_PIN = 2,    /* pin it (and keep no reference) */
  NWCD_ACQ_NOREF = 4,  /* load only (and keep no reference) */
};
/* Acquire flag naming where a load goes (loc: NWCD_LOC_CPU or a device; NWCD_LOC_DEFAULT is no
 * flag: the default place).  A tensor resident elsewhere than a named place is -EEXIST. */
#define NWCD_ACQ_AT(loc) ((unsigned)((loc) + 2) << 8)

struct nwcd;
int nwcd_res_create(struct nwcd *d, uint64_t budget, nwcd_res **out);
/* The budget of every device (at start and on reload): per_device bytes, or with 0, 90% of the
 * device memory free at the first call; evicts LRU copies down to it. */
void nwcd_res_set_gpu_budget(nwcd_res *r, uint64_t per_device);
/* The budget of loc (NWCD_LOC_DEFAULT, NWCD_LOC_CPU or a device): its bytes, or 0 for a device
 * the backend lacks (*where gets its name: "cpu", "cuda:0"). */
uint64_t nwcd_res_budget(nwcd_res *r, int loc, char where[16]);
void nwcd_res_free(nwcd_res *r);
/* Finds (loading if needed) model/tensor.  Returns 0 and *ref, -ENOENT, -ENOSPC when it cannot
 * fit (and mapping is not allowed), or a load error. */
int nwcd_res_acquire(nwcd_res *r, const char *model, const char *tensor, unsigned flags,
                     nwcd_ref *ref, nwcd_load_info *li);
void nwcd_res_release(nwcd_res *r, nwcd_ref *ref);
/* -ENODEV for place cuda:at that backend b lacks, its message saying which places b has. */
int nwcd_no_device(const nwcd_backend *b, int at);
/* Evicts one tensor: 0, -EBUSY (in use or pinned: detail says which), -ENOENT when absent.
 * *bytes gets what was freed. */
int nwcd_res_evict(nwcd_res *r, const char *model, const char *tensor, uint64_t *bytes);
/* New budget (reload): evicts LRU entries down to it; *used gets the bytes still resident. */
void nwcd_res_set_budget(nwcd_res *r, uint64_t budget, uint64_t *used);
int nwcd_res_unpin(nwcd_res *r, const char *model, const char *tensor);
/* Drops every entry of model (before removing it): -EBUSY if one is in use or loading. */
int nwcd_res_forget_model(nwcd_res *r, const char *model);
/* Residency of one tensor for listings. */
void nwcd_res_describe(nwcd_res *r, const char *model, const char *tensor, nwc_proto_tensor *out);
/* The blob bytes of model/tensor when it is resident now (acquiring it would not load), else 0;
 * *loc (when loc is not NULL and it is resident): NWCD_LOC_CPU or its device. */
uint64_t nwcd_res_resident_bytes(nwcd_res *r, const char *model, const char *tensor, int *loc);
uint64_t nwcd_res_model_bytes(nwcd_res *r, const char *model);
/* Resident tensors for ps: *out malloc'ed array of *n (free()). */
int nwcd_res_list(nwcd_res *r, nwc_proto_ps **out, size_t *n);
void nwcd_res_stats(nwcd_res *r, nwc_proto_stats *s);
/* The places for devices, in one snapshot: out[0] host memory, out[1 + n] device n, each with
 * its name, budget, resident bytes and tensors and pinned bytes as ps counts them (the memory
 * fields are left 0).  out has room for 1 + NWCD_MAX_DEVICES; returns how many it filled. */
int nwcd_res_places(nwcd_res *r, nwc_proto_place *out);
/* Shares model/tensor with a client (map): makes it resident if needed (-ENOSPC when it cannot
 * fit), sends its sealed memfd with the token (NWC_PROTO_MAP_TOKEN bytes) over sock, a
 * connected Unix stream socket the client passed, and keeps a mapping reference, which stops
 * eviction, until the client's end of sock is closed (unmap, exit).  sock stays the caller's
 * (a duplicate is kept).  Fills *out with the decoder parameters for the reply. */
int nwcd_res_map(nwcd_res *r, const char *model, const char *tensor, int sock, uint64_t token,
                 nwc_proto_map *out);

/* ---- the daemon -------------------------------------------------------------------------- */

typedef struct nwcd_stats {
  atomic_uint_fast64_t requests, errors, conn_total, batched_passes, batched_columns;
  atomic_uint_fast64_t connections;
} nwcd_stats;

typedef struct nwcd {
  nwcd_config cfg;
  const nwcd_backend *backend;
  nwc_store *store;
  pthread_mutex_t store_lock;
  nwcd_res *res;
  struct nwcd_pool *pool;
  struct nwcd_server *server;
  nwcd_stats stats;
  uint64_t start_ns;
} nwcd;

/* ---- jobs and the worker pool ------------------------------------------------------------ */

struct nwcd_conn;
typedef struct nwcd_job {
  struct nwcd_job *next;
  struct nwcd_job *batch;    /* further matvec jobs sharing this one's pass */
  nwcd *d;
  struct nwcd_conn *conn;    /* referenced for the job's life */
  uint8_t *shm;              /* the connection's shared region (or NULL), size shm_size */
  uint64_t shm_size;
  nwc_proto_req req;         /* rows, x point into payload */
  uint8_t *payload;          /* owned */
  int fds[NWC_PROTO_MAX_FILES + 1];
  unsigned nfds;             /* owned descriptors (closed by nwcd_job_free) */
  uint64_t started_ns;
  bool alone;                /* its final reply carries NWC_PF_ALONE (server.c: quiet) */
} nwcd_job;

typedef struct nwcd_pool nwcd_pool;
int nwcd_pool_create(unsigned threads, void (*run)(nwcd_job *), nwcd_pool **out);
/* Queues a job (any thread). */
void nwcd_pool_submit(nwcd_pool *p, nwcd_job *j);
/* Runs fn(ctx, i) for i in [0, n) on the calling thread and idle workers; returns when all are
 * done.  Call from a worker (or any thread); fn must not fail (record errors in ctx). */
void nwcd_pool_parallel(nwcd_pool *p, uint64_t n, void (*fn)(void *ctx, uint64_t i), void *ctx);
/* Stops the workers after the queue is empty, joins them, frees the pool. */
void nwcd_pool_free(nwcd_pool *p);

/* ops.c: runs one job (or a batch) on a worker; replies go through nwcd_server_send. */
void nwcd_ops_run(nwcd_job *j);
/* True when b can share a + its batch's matvec pass. */
bool nwcd_ops_can_batch(const nwcd_job *a, unsigned cols, const nwcd_job *b);
void nwcd_job_free(nwcd_job *j);

/* server.c, called on the worker: writes a finished frame (buf malloc'ed, ownership passes; NULL:
 * none) to job j's connection, or queues it behind unsent ones; final marks the job's last frame,
 * after which j is freed (do not touch it again). */
void nwcd_server_send(nwcd_job *j, uint8_t *buf, size_t len, bool final);
int nwcd_server_run(nwcd *d);
void nwcd_server_get_stats(nwcd *d, nwc_proto_stats *s);

#endif
