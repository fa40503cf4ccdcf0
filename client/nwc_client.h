/*
 * nwc_client.h - libnwc-client: talk to nwcd, the nwc store daemon, over its Unix socket.
 *
 *   nwc_client *c;
 *   if (nwc_client_connect(NULL, &c) < 0) fprintf(stderr, "%s\n", nwc_client_last_error());
 *   nwc_client_matvec(c, "use-lite", "W", NULL, 1.0f, x, K, 1, 0, y, M * sizeof(float), NULL);
 *   nwc_client_free(c);
 *
 * Conventions: every fallible call returns 0 (or a count) or a negative errno; the daemon's
 * one-line message (or the library's own) is then in nwc_client_last_error(), which is
 * thread-local.  Calls on one nwc_client are serialized by a mutex, so a client may be shared by
 * threads (they take turns); for parallel requests open one client per thread, or pipeline them
 * on one connection (nwc_client_submit_*, below).
 * Arrays returned through **out are malloc'ed and freed by the caller with free().  Bulk data
 * above 1 MiB travels through a shared memory region (a sealed memfd passed to the daemon once,
 * on first need); smaller data goes inline.  Tensors are named by model and tensor name.
 */
#ifndef NWC_CLIENT_H
#define NWC_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define NWC_CLIENT_API __attribute__((visibility("default")))
#else
#define NWC_CLIENT_API
#endif

#define NWC_CLIENT_PROTOCOL 1 /* protocol version this library speaks */

typedef struct nwc_client nwc_client;

/* Connects to path (NULL: nwc_client_default_socket()) and says hello.  Free with
 * nwc_client_free.  -ENOENT/-ECONNREFUSED when no daemon listens, -EPROTONOSUPPORT when the
 * daemon speaks another protocol version. */
NWC_CLIENT_API int nwc_client_connect(const char *path, nwc_client **out);
/* Closes the connection (NULL is a no-op). */
NWC_CLIENT_API void nwc_client_free(nwc_client *c);
/* How calls on c wait for nwcd's replies.  While nwcd says that no other client is busy (its
 * last reply carried the protocol's ALONE flag), a call polls the socket, yielding the CPU to any
 * other thread that wants it, for up to spin_us before it sleeps in recv(): waking a sleeping
 * thread costs tens to hundreds of microseconds on a virtual machine, more than a small matvec's
 * whole overhead.  The poll stops as soon as a yield shows that another thread ran on this CPU,
 * and it shrinks for a connection whose replies take longer than spin_us; concurrent clients
 * always sleep, so that the daemon's threads keep the CPUs.  spin_us 0: always sleep.  Default 2000, or $NWC_CLIENT_SPIN_US when
 * the client connects; -EINVAL above 1000000. */
NWC_CLIENT_API int nwc_client_set_spin(nwc_client *c, unsigned spin_us);
/* Outputs over 1 MiB (and, with a GPU daemon, matvecs' x and y) travel through a shared region,
 * a memfd made on the connection's first such transfer: 256 MiB, or $NWC_CLIENT_SHM_BYTES (1 MiB
 * to 2^40), or that transfer's size when larger, rounded up to 1 MiB.  It does not grow: a
 * dequant larger than it is decoded in this process from a host map (nwc_client_map) instead. */

/* What went wrong in this thread's last failing call ("" if none; thread-local storage). */
NWC_CLIENT_API const char *nwc_client_last_error(void);
/* $NWC_SOCKET, else $XDG_RUNTIME_DIR/nwc/nwcd.sock, else /run/nwc/nwcd.sock as root (else
 * /tmp/nwc-UID/nwcd.sock).  Thread-local storage, valid until the next call on the thread. */
NWC_CLIENT_API const char *nwc_client_default_socket(void);
/* The daemon's compute backend ("cpu") and version string, from the handshake. */
NWC_CLIENT_API const char *nwc_client_backend(const nwc_client *c);
NWC_CLIENT_API const char *nwc_client_daemon_version(const nwc_client *c);

/* Progress of import and load: done of total bytes.  Return non-zero to stop waiting: the call
 * returns -ECANCELED at once, while the request still runs to its end in the daemon (an import
 * still stores the model, a load still makes the tensors resident; its reply, when it comes, is
 * dropped), and the client stays usable. */
typedef int (*nwc_client_progress_fn)(void *ctx, uint64_t done, uint64_t total);

typedef struct nwc_client_model {
  char name[1024];
  uint64_t tensors, raw_bytes, nwc_bytes, resident_bytes;
  int64_t created, verified; /* unix seconds; verified 0 if never */
} nwc_client_model;

enum { NWC_CLIENT_ABSENT = 0, NWC_CLIENT_LOADING = 1, NWC_CLIENT_RESIDENT = 2 };

typedef struct nwc_client_tensor {
  char name[1024];
  unsigned ndim;
  uint64_t shape[8];
  char dtype[12];      /* source dtype */
  unsigned elem;       /* NWC_ELEM(type, layout): type bits 0..3 (0 bf16, 1 fp8), layout 4..7 */
  uint64_t rows, cols; /* as stored (1-D: 1 x N) */
  uint64_t raw_bytes, nwc_bytes;
  int state;           /* NWC_CLIENT_ABSENT, _LOADING, _RESIDENT */
  int pinned;
  unsigned refs;
  int64_t last_used_ms; /* ms since last use, -1 never */
} nwc_client_tensor;

typedef struct nwc_client_tensor_info {
  nwc_client_tensor t;
  char conversion[64];
  char path[1024]; /* container file */
  uint64_t offset, length, nchunks, nblocks, data_bytes;
  unsigned format_version;
} nwc_client_tensor_info;

/* A resident replica (nwc_client_ps): a tensor resident on several places has one per place. */
typedef struct nwc_client_resident {
  char model[1024], tensor[1024];
  uint64_t bytes;
  int pinned, locked, direct; /* locked: mlock'ed; direct: read with O_DIRECT */
  unsigned refs;
  int64_t last_used_ms;
  unsigned maps; /* client mappings (nwc_client_map) holding it */
  int device; /* NWC_CLIENT_CPU (host memory) or the CUDA device it lives on */
} nwc_client_resident;

#define NWC_CLIENT_CPU (-1) /* device of a tensor resident in host memory */

typedef struct nwc_client_result {
  uint64_t tensors, bytes, skipped, micros;
  uint64_t direct, buffered; /* load: tensors read with O_DIRECT / buffered */
  uint64_t raw_bytes;        /* import: stored element bytes (nwc bytes are in bytes);
                                load_places: bytes read from container files */
  uint64_t chunks, problems; /* verify (skipped holds the models checked) */
} nwc_client_result;

typedef struct nwc_client_counters {
  uint64_t uptime_ms, connections, conn_total, requests, errors;
  uint64_t budget, resident_bytes, pinned_bytes, resident_tensors;
  uint64_t loads, load_bytes, load_us, direct_loads, buffered_loads, evictions;
  uint64_t mlock_ok, mlock_failed, mapped_computes, batched_passes, batched_columns;
  uint64_t threads;
  uint64_t gpu_budget, gpu_resident_bytes; /* summed over the daemon's CUDA devices */
  char backend[16];
} nwc_client_counters;

/* A place where the daemon keeps tensors: host memory, or one CUDA device. */
typedef struct nwc_client_place {
  char name[16];             /* "cpu" (host memory), "cuda:0", "cuda:1", ... */
  uint64_t budget;           /* bytes of tensors the daemon keeps there at most */
  uint64_t resident_bytes;   /* bytes of the tensors resident there (the sum of ps's bytes) */
  uint64_t resident_tensors; /* how many */
  uint64_t pinned_bytes;     /* of resident_bytes, the pinned tensors' */
  uint64_t mem_free;         /* host: MemAvailable of /proc/meminfo; GPU: free (cudaMemGetInfo);
                              * 0 when the daemon could not tell */
  uint64_t mem_total;        /* host: MemTotal; GPU: its memory; 0 when the daemon could not tell */
  uint64_t pool_idle;        /* GPU: bytes the daemon's pool of device copies holds reserved
                              * beyond the copies (given back as it goes); host: 0 */
} nwc_client_place;

NWC_CLIENT_API int nwc_client_models(nwc_client *c, nwc_client_model **out, size_t *n);
NWC_CLIENT_API int nwc_client_tensors(nwc_client *c, const char *model, nwc_client_tensor **out,
                                      size_t *n);
NWC_CLIENT_API int nwc_client_info(nwc_client *c, const char *model, const char *tensor,
                                   nwc_client_tensor_info *out);
NWC_CLIENT_API int nwc_client_ps(nwc_client *c, nwc_client_resident **out, size_t *n);
NWC_CLIENT_API int nwc_client_stats(nwc_client *c, nwc_client_counters *out);
/* Memory per place, in one snapshot of the daemon's budgets: *out (malloc'ed, free it) gets *n
 * places, host memory first, then each CUDA device in order.  -EOPNOTSUPP from a daemon without
 * the devices operation (protocol capability 512), which sums its GPUs in nwc_client_stats. */
NWC_CLIENT_API int nwc_client_devices(nwc_client *c, nwc_client_place **out, size_t *n);

/* nwc_client_import_opts.layout: the layout chosen per tensor (NWC_LAYOUT_AUTO of nwc.h). */
#define NWC_CLIENT_LAYOUT_AUTO 15u

typedef struct nwc_client_import_opts {
  unsigned elem;   /* 0 bf16 (keep), 1 fp8 */
  unsigned layout; /* 0, 1, 2, or NWC_CLIENT_LAYOUT_AUTO: per tensor, 2 for BF16 matrices of at
                      least 16 rows, 0 for the rest (nwcctl's and Python's default) */
  nwc_client_progress_fn progress;
  void *ctx;
} nwc_client_import_opts;

/* Imports path (a .safetensors file or a sharded model's *.json index, whose shards are opened
 * from its directory) as model: the files are opened here and their descriptors passed to the
 * daemon, which reads only those.  opts may be NULL.  res (may be NULL) gets the counts.  The
 * same as nwc_client_import2 with flags 0 and no list: tensors nwc does not store are skipped,
 * and res->skipped counts them. */
NWC_CLIENT_API int nwc_client_import(nwc_client *c, const char *model, const char *path,
                                     const nwc_client_import_opts *opts, nwc_client_result *res);

/* A tensor an import left out: well-formed, but of a dtype nwc does not store (BOOL and the
 * integer dtypes) or empty (a 0 in its shape). */
typedef struct nwc_client_skipped {
  char name[1024];
  unsigned ndim;
  uint64_t shape[8];
  char dtype[12];
} nwc_client_skipped;

#define NWC_CLIENT_IMPORT_STRICT 1u /* all or nothing: a tensor that would be skipped fails the
                                     * import with -ENOTSUP, naming it and its dtype */

/* nwc_client_import with flags (NWC_CLIENT_IMPORT_*) and the list of the tensors skipped: at
 * most 1024 of them (res->skipped counts all) in *skipped, a malloc'ed array of *nskipped (free
 * it; NULL and 0 when none); skipped and nskipped may be NULL.  Every floating-point tensor is
 * stored; a file without one is -ENOTSUP.  A daemon older than the import2 operation
 * (protocol capability 256) imports all or nothing whatever the flags say. */
NWC_CLIENT_API int nwc_client_import2(nwc_client *c, const char *model, const char *path,
                                      const nwc_client_import_opts *opts, unsigned flags,
                                      nwc_client_result *res, nwc_client_skipped **skipped,
                                      size_t *nskipped);
NWC_CLIENT_API int nwc_client_remove(nwc_client *c, const char *model);
/* tensor NULL or "": every tensor of the model.  progress may be NULL; res may be NULL. */
NWC_CLIENT_API int nwc_client_load(nwc_client *c, const char *model, const char *tensor,
                                   nwc_client_progress_fn progress, void *ctx,
                                   nwc_client_result *res);
/* load onto a given place: device NWC_CLIENT_CPU (host memory) or a CUDA device 0..; a tensor
 * resident elsewhere gets a replica there too (one per place; evict drops them all), and that
 * place becomes where requests naming none load it again; a device the daemon lacks -ENODEV. */
NWC_CLIENT_API int nwc_client_load_on(nwc_client *c, const char *model, const char *tensor,
                                      int device, nwc_client_progress_fn progress, void *ctx,
                                      nwc_client_result *res);
NWC_CLIENT_API int nwc_client_evict(nwc_client *c, const char *model, const char *tensor,
                                    nwc_client_result *res);
/* evict the replica on one place only (the others stay); -EOPNOTSUPP from a daemon older than
 * the op. */
NWC_CLIENT_API int nwc_client_evict_on(nwc_client *c, const char *model, const char *tensor,
                                       int device, nwc_client_result *res);
NWC_CLIENT_API int nwc_client_pin(nwc_client *c, const char *model, const char *tensor,
                                  nwc_client_result *res);
/* pin onto a given place (as load_on, then pinned there: that replica is never evicted by LRU;
 * unpin releases every replica). */
NWC_CLIENT_API int nwc_client_pin_on(nwc_client *c, const char *model, const char *tensor,
                                     int device, nwc_client_progress_fn progress, void *ctx,
                                     nwc_client_result *res);
NWC_CLIENT_API int nwc_client_unpin(nwc_client *c, const char *model, const char *tensor,
                                    nwc_client_result *res);
/* load onto several places in one request: devices[0..n) (NWC_CLIENT_CPU or CUDA devices 0..62,
 * any order; one named twice counts once).  flags: NWC_CLIENT_LOAD_PIN pins what it loads;
 * without NWC_CLIENT_LOAD_SPLIT each blob is read once and put into every place's replica, the
 * home becoming the lowest CUDA device named, else host memory; with it each tensor goes to ONE
 * of the places, the first in the order cuda:0, cuda:1, ..., host memory whose free budget takes
 * it, the tensors taken in natural name order (layers.2 before layers.10), one already resident
 * at a place named staying there, nothing evicted, and its home becomes that place
 * (docs/protocol.md, Split); a tensor that fits at none is -ENOSPC naming it and each place's
 * free bytes, nothing loaded.  res->raw_bytes gets the bytes the daemon read from its container
 * files.  -EINVAL for n 0, a device out of range or another flag, -ENODEV naming a place the
 * daemon lacks, -EOPNOTSUPP (before sending anything) from a daemon without the op. */
#define NWC_CLIENT_LOAD_PIN 1u
#define NWC_CLIENT_LOAD_SPLIT 2u
NWC_CLIENT_API int nwc_client_load_places(nwc_client *c, const char *model, const char *tensor,
                                          const int *devices, size_t n, unsigned flags,
                                          nwc_client_progress_fn progress, void *ctx,
                                          nwc_client_result *res);
/* pull and push through an OCI registry (docs/oci.md), run by nwcd (it owns the store).  ref:
 * "host[:port]/repository[:tag|@sha256:...]"; user and secret: the credentials for its registry,
 * or both NULL for the caller's as docker and podman keep them ($REGISTRY_AUTH_FILE, podman's
 * auth.json, $DOCKER_CONFIG or ~/.docker/config.json, credential helpers; none found: none sent);
 * flags NWC_CLIENT_PLAIN_HTTP.
 * Pull stores the artifact as model (NULL: its own name); a model of that name already pulled from
 * the same manifest is left as it is (res->skipped 1).  digest (may be NULL) receives the
 * manifest's digest, "sha256:..." (73 bytes with the NUL).  Progress: bytes of the layer. */
#define NWC_CLIENT_PLAIN_HTTP 1u
NWC_CLIENT_API int nwc_client_pull(nwc_client *c, const char *ref, const char *model, const char *user,
                                   const char *secret, unsigned flags, nwc_client_progress_fn progress,
                                   void *ctx, nwc_client_result *res, char digest[73]);
NWC_CLIENT_API int nwc_client_push(nwc_client *c, const char *model, const char *ref, const char *user,
                                   const char *secret, unsigned flags, nwc_client_progress_fn progress,
                                   void *ctx, nwc_client_result *res, char digest[73]);
/* verify: each problem line goes to cb (may be NULL); res->problems counts them. */
NWC_CLIENT_API int nwc_client_verify(nwc_client *c, const char *model,
                                     void (*cb)(void *ctx, const char *line), void *ctx,
                                     nwc_client_result *res);

#define NWC_CLIENT_BF16 1u   /* output BF16 bits (uint16_t) instead of float */
#define NWC_CLIENT_INLINE 2u /* matvec: x and y in the frames, not the shared region (which a
                              * daemon with a GPU is otherwise sent them through); over 1 MiB
                              * they use the region anyway */
#define NWC_CLIENT_MAPPED 1u /* *rflags: computed on a transient copy of the container's blob,
                                not resident (over the budget) */
#define NWC_CLIENT_BATCHED 2u /* *rflags: shared a decoder pass with other requests */
#define NWC_CLIENT_SHARED 4u  /* *rflags: x and y went straight between this connection's shared
                               * region and the GPU (no copy in the daemon) */

/* Dequantizes the whole tensor into out (cap bytes): rows x cols dense, float or (flags
 * NWC_CLIENT_BF16) BF16.  fp8 tensors give their unscaled fp8 values.  *rows, *cols, *rflags may
 * be NULL.  -ENOSPC if cap is too small (the message says what is needed). */
NWC_CLIENT_API int nwc_client_dequant(nwc_client *c, const char *model, const char *tensor,
                                      unsigned flags, void *out, size_t cap, uint64_t *rows,
                                      uint64_t *cols, unsigned *rflags);
/* Rows by index (an embedding lookup): n (1..2096640) rows x cols into out (cap bytes), float or
 * (NWC_CLIENT_BF16) BF16; *cols and *rflags may be NULL.  -EINVAL naming a row out of range,
 * -ENOSPC as for dequant. */
NWC_CLIENT_API int nwc_client_gather(nwc_client *c, const char *model, const char *tensor,
                                     const uint64_t *rows, size_t n, unsigned flags, void *out,
                                     size_t cap, uint64_t *cols, unsigned *rflags);
#define NWC_CLIENT_MAX_COLS 64 /* columns of one request (submit, CUDA): more are -EINVAL */

/* y = scale * (W x) + bias, W the tensor as stored (M = its rows, K = its cols: nwc_client_info),
 * for ncols columns of K floats at x (column c at x + c * K); y gets ncols columns of M (float,
 * or BF16 with NWC_CLIENT_BF16), cap bytes available.  Any ncols >= 1: over NWC_CLIENT_MAX_COLS
 * the call sends one request per NWC_CLIENT_MAX_COLS columns (and *rflags gets all their flags).
 * bias (NULL or "": none) names a tensor of M values in the same model.  flags: NWC_CLIENT_BF16,
 * NWC_CLIENT_INLINE.  -EINVAL for a K or bias that does not fit the tensor, -ENOSPC if cap is too
 * small (the message says what is needed). */
NWC_CLIENT_API int nwc_client_matvec(nwc_client *c, const char *model, const char *tensor,
                                     const char *bias, float scale, const float *x, uint64_t K,
                                     unsigned ncols, unsigned flags, void *y, size_t cap,
                                     unsigned *rflags);

/* ---- mappings: resident tensors shared read-only, computed on in this process ---------------
 *
 * nwc_client_map asks nwcd for a read-only mapping of a resident tensor (loading it first if
 * needed): the daemon's own copy, a sealed memfd, is mapped into this process, so every process
 * that maps a tensor shares one copy of it in RAM, and the calls below decode it here with no
 * round trip.  While the mapping exists the daemon will not evict the tensor (evict says who
 * maps it) nor remove its model; nwc_client_unmap, or the end of this process, releases it.
 * A mapping does not depend on the nwc_client it came from (which may be freed first), and its
 * compute calls may run from any number of threads at once.  A child forked while a mapping
 * exists inherits both its pages and its reference (the daemon sees it until both let go).
 * Outputs are as for the daemon's calls above: dense rows of cols, float or (NWC_CLIENT_BF16)
 * BF16 bits; -ENOSPC if cap is too small.  Tensors of fp8 dequantize to their unscaled fp8
 * values; matvec applies their scales. */
typedef struct nwc_client_mapping nwc_client_mapping;

typedef struct nwc_client_map_info {
  uint64_t rows, cols; /* as stored (1-D: 1 x N) */
  unsigned elem;       /* NWC_ELEM(type, layout) */
  const void *base;    /* the mapped blob (PROT_READ) */
  uint64_t size;       /* bytes mapped */
  int fd;              /* the sealed memfd (read-only for everyone; closed by nwc_client_unmap) */
  unsigned maps;       /* mappings of the tensor in the daemon when this one was made */
  int locked;          /* the daemon's copy is mlock'ed */
} nwc_client_map_info;

/* Maps model/tensor's replica in host memory (loaded there if needed, beside any on GPUs): free
 * with nwc_client_unmap.  -ENOSPC when it cannot be made resident
 * within the daemon's budget, -ENOTSUP from a backend whose copies cannot be shared,
 * -EOPNOTSUPP from a daemon without map (hello capability 16). */
NWC_CLIENT_API int nwc_client_map(nwc_client *c, const char *model, const char *tensor,
                                  nwc_client_mapping **out);
/* Unmaps and drops the daemon's reference (NULL is a no-op). */
NWC_CLIENT_API void nwc_client_unmap(nwc_client_mapping *m);
/* Shape and placement of a mapping (valid as long as m). */
NWC_CLIENT_API const nwc_client_map_info *nwc_client_mapping_info(const nwc_client_mapping *m);
/* The whole tensor: rows x cols into out. */
NWC_CLIENT_API int nwc_client_map_dequant(const nwc_client_mapping *m, unsigned flags, void *out,
                                          size_t cap);
/* Rows [row0, row0 + nrows): nrows x cols into out (any range inside the tensor, else -EINVAL),
 * so that a dense weight can be made in bounded pieces. */
NWC_CLIENT_API int nwc_client_map_dequant_rows(const nwc_client_mapping *m, uint64_t row0,
                                               uint64_t nrows, unsigned flags, void *out,
                                               size_t cap);
/* Rows by index: n x cols into out; -EINVAL for a row out of range. */
NWC_CLIENT_API int nwc_client_map_gather(const nwc_client_mapping *m, const uint64_t *rows,
                                         size_t n, unsigned flags, void *out, size_t cap);
/* y = scale * (W x) + bias for ncols columns of cols floats at x (column c at x + c * cols);
 * bias (rows floats) may be NULL; y gets ncols columns of rows. */
NWC_CLIENT_API int nwc_client_map_matvec(const nwc_client_mapping *m, const float *bias, float scale,
                                         const float *x, unsigned ncols, unsigned flags, void *y,
                                         size_t cap);

/* ---- GPU maps: device copies shared with this process (the protocol side) ------------------
 *
 * nwcd with the cuda backend keeps one copy of each resident tensor per GPU.  nwc_client_map_gpu
 * asks it to share the copies of a tensor (or, tensor NULL or "", of every tensor of a model) on
 * cuda:device (loading them there first if needed): the reply is what a CUDA process needs to
 * import them into its own context (docs/gpu-maps.md): the descriptor of the daemon's memory
 * pool of that device (pool_fd, for cudaMemPoolImportFromShareableHandle with POSIX file
 * descriptors) and, per tensor, the export data of its allocation (cudaMemPoolImportPointer) and
 * where the kernel tensor's arrays lie in it.  This library does no CUDA: libnwc-cuda
 * (nwc_cuda.h) does the import and runs the kernels; use that unless you write your own.
 * While the map exists the daemon will not evict its tensors (evict names the pids) nor remove
 * their model; nwc_client_gpu_map_free, or the end of this process, releases them.  Free the
 * imported pointers in every process first (a tensor evicted after the release may be reused).
 * -EOPNOTSUPP from a daemon without map_gpu (hello capability 1024), -ENOTSUP from a device whose
 * pools cannot be shared, -ENODEV for a device the daemon lacks, -ENOSPC when the tensors do not
 * fit the device's budget together.  A tensor resident elsewhere (in host memory, on another
 * GPU) gets a replica on cuda:device, which is the one shared. */
typedef struct nwc_client_gpu_tensor {
  char name[1024];
  unsigned elem;                /* NWC_ELEM(type, layout) */
  uint64_t rows, cols, nblocks; /* as stored (1-D: 1 x N) */
  uint8_t psym[16];
  uint8_t export_data[64];      /* cudaMemPoolPtrExportData of the allocation */
  uint64_t bytes;               /* of the allocation */
  /* offsets in the allocation: the lookup table, then the blob's arrays (off_scale 0: none) */
  uint64_t off_tab, off_bases, off_hdr, off_data, off_raw, off_scale;
  unsigned maps;                /* mappings of the tensor in the daemon, this one included */
} nwc_client_gpu_tensor;

typedef struct nwc_client_gpu_map {
  int device;             /* the CUDA device (ordinal as nwcd numbers them) */
  uint64_t pool_id;       /* names the daemon's pool for its life: import it once per process */
  uint8_t uuid[16];       /* the device's UUID (cudaDeviceProp.uuid), whatever its ordinal here */
  int pool_fd;            /* the pool's shareable handle (closed by nwc_client_gpu_map_free;
                           * set it to -1 to keep it) */
  int ref;                /* the reference: closing it releases the map (gpu_map_free does) */
  size_t n;
  nwc_client_gpu_tensor *t; /* n records, in the model's order (owned by the map) */
} nwc_client_gpu_map;

/* Free with nwc_client_gpu_map_free. */
NWC_CLIENT_API int nwc_client_map_gpu(nwc_client *c, const char *model, const char *tensor,
                                      int device, nwc_client_gpu_map **out);
/* Closes pool_fd (unless -1) and ref, which releases the daemon's references; NULL: no-op. */
NWC_CLIENT_API void nwc_client_gpu_map_free(nwc_client_gpu_map *m);

/* ---- pipelining ------------------------------------------------------------------------------
 * Many requests in flight on one connection: a submit sends the request and returns at once with
 * a ticket; nwc_client_wait() collects one ticket's outcome, nwc_client_wait_any() the oldest of
 * those already completed (reading replies as they arrive, in whatever order the daemon finishes
 * them).  Until its ticket is collected, the output buffer belongs to the library: the reply is
 * copied into it by whichever call on this client reads it (a wait, a submit, or a synchronous
 * call, which may be mixed freely with tickets).  x and rows are sent before submit returns.
 * Pipelined requests carry their data inline: x and the output must each fit one frame (16 MiB;
 * -E2BIG otherwise: use the synchronous call, which goes through the shared region).  At most 64
 * tickets may be outstanding (-EBUSY); while 32 MiB of output capacity is in flight a submit
 * first reads replies.  Threads: every call locks the client, and a wait holds the lock while it
 * blocks, so a connection is driven by one thread at a time; a ticket may be collected by any
 * thread, once.  A daemon-side error fails only its own ticket (the others go on); a lost
 * connection fails every outstanding ticket. */

/* y = scale * (W x) + bias as nwc_client_matvec, without waiting: *ticket (> 0) names it.
 * ncols at most NWC_CLIENT_MAX_COLS (one request per ticket). */
NWC_CLIENT_API int nwc_client_submit_matvec(nwc_client *c, const char *model, const char *tensor,
                                            const char *bias, float scale, const float *x,
                                            uint64_t K, unsigned ncols, unsigned flags, void *y,
                                            size_t cap, uint64_t *ticket);
/* Rows by index as nwc_client_gather, without waiting. */
NWC_CLIENT_API int nwc_client_submit_gather(nwc_client *c, const char *model, const char *tensor,
                                            const uint64_t *rows, size_t n, unsigned flags,
                                            void *out, size_t cap, uint64_t *ticket);
/* Waits for ticket: 0 (the output is in its buffer; *rflags, may be NULL, as for the synchronous
 * call) or the request's negative errno with the daemon's message in nwc_client_last_error().
 * -ENOENT for a ticket that is not outstanding. */
NWC_CLIENT_API int nwc_client_wait(nwc_client *c, uint64_t ticket, unsigned *rflags);
/* Waits until some ticket completes and collects it: *ticket gets which, the return value is its
 * outcome as for nwc_client_wait.  -ENOENT (and *ticket untouched) when none is outstanding. */
NWC_CLIENT_API int nwc_client_wait_any(nwc_client *c, uint64_t *ticket, unsigned *rflags);

/*
 * CUDA IPC (daemons with the cuda backend; the library itself needs no CUDA): the client's own
 * device memory, named by the 64 bytes of a cudaIpcMemHandle_t from cudaIpcGetMemHandle(base)
 * and the offset of the buffer inside that allocation (cuMemGetAddressRange gives the base of a
 * pointer), with the bytes the buffer holds.  The daemon opens the handle for the request,
 * checks offset and size against the allocation and the request, and replies when the output is
 * written.  event (NULL or 64 bytes of a cudaIpcEventHandle_t of an event made with
 * cudaEventInterprocess | cudaEventDisableTiming): the daemon waits for it before reading, so
 * the client may record it after the kernels that write x instead of synchronizing.  The tensor
 * must live on a device (it is loaded onto the default one if absent); -ENOTSUP if it is in
 * host memory, -EOPNOTSUPP from a daemon without devices.
 */
typedef struct nwc_client_cuda_buf {
  uint8_t handle[64]; /* cudaIpcMemHandle_t */
  uint64_t offset;    /* of the buffer in the allocation */
  uint64_t bytes;     /* the buffer's size */
} nwc_client_cuda_buf;

/* y = scale * (W x) + bias in the client's device memory: x ncols (1..NWC_CLIENT_MAX_COLS)
 * columns of K floats, y ncols columns of M floats (or BF16 with NWC_CLIENT_BF16). */
NWC_CLIENT_API int nwc_client_matvec_cuda(nwc_client *c, const char *model, const char *tensor,
                                          const char *bias, float scale,
                                          const nwc_client_cuda_buf *x, uint64_t K, unsigned ncols,
                                          const nwc_client_cuda_buf *y, unsigned flags,
                                          const void *event);
/* The whole tensor, dense rows x cols, BF16 (NWC_CLIENT_BF16) or float, into the client's buffer. */
NWC_CLIENT_API int nwc_client_dequant_cuda(nwc_client *c, const char *model, const char *tensor,
                                           unsigned flags, const nwc_client_cuda_buf *out,
                                           const void *event, uint64_t *rows, uint64_t *cols);

#ifdef __cplusplus
}
#endif
#endif
