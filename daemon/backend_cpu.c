/*
 * backend_cpu.c - the compute backend interface (nwcd.h, nwcd_backend) and its CPU
 * implementation: host memory in memfds, pinned with mlock where RLIMIT_MEMLOCK allows (a
 * warning once otherwise), and the store/ decoders for dequant, gather and matvec.
 *
 * Host memory: each resident copy is one memfd (MFD_ALLOW_SEALING), so that its pages can be
 * handed to clients (map, residency.c) with no copy.  host_load has the loader write the blob
 * into a fresh one (nwcd_load_fd: pwrite of each checked slot of a staging ring, which makes
 * whole pages without zeroing them and without a page fault or the mmap lock), then maps it
 * read-only, populated and locked, through a read-only descriptor (/proc/self/fd): a mapping
 * that cannot be mprotect'ed writable.  At its first share (host_share) it is sealed with
 * F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL: from then on no process, this one
 * included, can write it (write(), a writable shared mmap, an mprotect to PROT_WRITE of a
 * read-only mapping all fail), shrink it, grow it or lift the seals.
 *
 * Spares: a copy freed (evicted by LRU) that was never shared has had no reader but this process, so
 * host_free keeps it, mapped, populated and locked, and the next host_load of at most its size
 * takes the smallest such spare, cuts it to its length (ftruncate frees the rest) and loads the
 * new blob straight into its existing pages (nwcd_load, zero copy) through a second, writable
 * mapping made at its first reuse: a reload makes no page and copies each byte once.  That
 * mapping is unmapped before the seal, so the write seal still finds no writable mapping.  A
 * shared (sealed) copy is unmapped and closed when freed; clients' mappings keep its pages.
 * Residency bounds the spares with host_trim so that resident and spare bytes together stay
 * within the budget, and frees them all on an explicit evict.  The copies and spares are found in one table under a mutex.
 *
 * The "cuda" backend (built with NWC_WITH_CUDA) is this struct with the device functions of
 * backend_cuda.cu added: tensors that live on a device run the kernels, mapped (non-resident)
 * and host-resident ones these decoders.  auto is cuda when the build has it and a device
 * exists, else cpu.
 */
#include "nwcd.h"

#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static atomic_int mlock_warned;

typedef struct host_buf {
  void *p;     /* the daemon's mapping: read-only, len bytes */
  void *w;     /* a writable mapping the loader reads into (a spare reused), or NULL */
  int fd;      /* the memfd, open for writing (the loader writes through it) */
  size_t len;
  bool locked; /* the mapping is mlock'ed */
  bool sealed; /* sealed (shared, or at load without /proc/self/fd): never reused */
  bool spare;  /* freed: kept for a later load */
} host_buf;

static pthread_mutex_t bufs_lock = PTHREAD_MUTEX_INITIALIZER;
static host_buf *bufs; /* every copy in use and every spare */
static size_t nbufs, cap_bufs;
static uint64_t spare_bytes;

static size_t host_len(size_t n) { return n ? (n + 4095) & ~(size_t)4095 : 4096; }

/* The index of the copy in use at p, or nbufs (bufs_lock held). */
static size_t buf_find(const void *p) {
  size_t i = 0;
  while (i < nbufs && (bufs[i].p != p || bufs[i].spare)) i++;
  return i;
}

static bool buf_add(const host_buf *b) {
  pthread_mutex_lock(&bufs_lock);
  if (nbufs == cap_bufs) {
    size_t cap = cap_bufs ? 2 * cap_bufs : 64;
    host_buf *a = realloc(bufs, cap * sizeof *a);
    if (a) bufs = a, cap_bufs = cap;
  }
  bool ok = nbufs < cap_bufs;
  if (ok) bufs[nbufs++] = *b;
  pthread_mutex_unlock(&bufs_lock);
  return ok;
}

static void buf_release(const host_buf *b) {
  if (b->p) munmap(b->p, b->len);
  if (b->w) munmap(b->w, b->len);
  if (b->fd >= 0) close(b->fd);
}

/* The index of the smallest spare of at least len bytes, or nbufs (bufs_lock held). */
static size_t spare_fit(uint64_t len) {
  size_t best = nbufs;
  for (size_t i = 0; i < nbufs; i++)
    if (bufs[i].spare && bufs[i].len >= len && (best == nbufs || bufs[i].len < bufs[best].len))
      best = i;
  return best;
}

/* The smallest spare of at least len bytes, out of the table into *out: false if none. */
static bool spare_take(size_t len, host_buf *out) {
  pthread_mutex_lock(&bufs_lock);
  size_t best = spare_fit(len);
  bool got = best < nbufs;
  if (got) {
    *out = bufs[best];
    out->spare = false;
    spare_bytes -= out->len;
    bufs[best] = bufs[--nbufs];
  }
  pthread_mutex_unlock(&bufs_lock);
  return got;
}

/* A spare cut to len bytes (its tail unmapped, then truncated away: those pages freed), with
 * a writable mapping of its populated pages for the loader (made at its first reuse, kept while
 * it is not shared); without one (mmap failed) the loader writes it with pwrite. */
static int spare_cut(host_buf *b, size_t len) {
  if (b->len != len) {
    munmap((uint8_t *)b->p + len, b->len - len);
    if (b->w) munmap((uint8_t *)b->w + len, b->len - len);
    b->len = len;
    NWC_RETURN_IF(ftruncate(b->fd, (off_t)len) < 0, -errno, "truncating a spare memfd: %s",
                  strerror(errno));
  }
  if (!b->w) {
    void *w = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, b->fd, 0);
    b->w = w == MAP_FAILED ? NULL : w;
  }
  return 0;
}

/* b's memfd (written) mapped read-only, populated and locked (where RLIMIT_MEMLOCK allows),
 * through a read-only descriptor of it: such a mapping is no writable one (it cannot be
 * mprotect'ed writable), so the write seal can be added later, while it stays.  Without
 * /proc/self/fd the memfd itself is sealed first and mapped (b->sealed: never reused). */
static int map_ro(const nwc_tensor_info *ti, host_buf *b) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", b->fd);
  int ro = open(path, O_RDONLY | O_CLOEXEC);
  if (ro < 0) {
    NWC_RETURN_IF(fcntl(b->fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW |
                                                F_SEAL_SEAL) < 0,
                  -errno, "sealing the memfd of %s/%s: %s", ti->model, ti->name, strerror(errno));
    b->sealed = true;
  }
  int fd = ro >= 0 ? ro : b->fd;
  void *p = mmap(NULL, b->len, PROT_READ, MAP_SHARED | MAP_POPULATE | MAP_LOCKED, fd, 0);
  int why = errno;
  b->locked = p != MAP_FAILED;
  if (p == MAP_FAILED && why == EAGAIN)
    p = mmap(NULL, b->len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  int err = errno;
  if (ro >= 0) close(ro);
  NWC_RETURN_IF(p == MAP_FAILED, -err, "mapping %zu bytes of %s/%s: %s", b->len, ti->model,
                ti->name, strerror(err));
  b->p = p;
  if (!b->locked && !atomic_exchange(&mlock_warned, 1))
    nwcd_log(NWCD_LOG_WARN,
             "locking %zu bytes failed (%s): resident tensors are not pinned; raise "
             "RLIMIT_MEMLOCK (LimitMEMLOCK=infinity) to pin them",
             b->len, strerror(why));
  return 0;
}

/* A host copy being written, as a crew's helper sees it: a reused spare's writable mapping, or
 * else the memfd. */
typedef struct host_blob {
  const nwc_tensor_info *ti;
  void *w;
  int fd;
} host_blob;

/* A crew helper's part of a host copy (nwcd_part_fn): bytes [off, off + len) of the blob into the
 * same memory, through the helper's own staging ring when written into the memfd. */
static int cpu_load_part(void *ctx, uint64_t off, uint64_t len, nwcd_load_info *li) {
  const host_blob *h = ctx;
  nwcd_load_opts o = {.from = off, .to = off + len};
  return h->w ? nwcd_load(h->ti, h->w, &o, li) : nwcd_load_fd(h->ti, h->fd, &o, li);
}

/* host_load: the blob written into a spare of its size or more (cut to it), or into a fresh
 * memfd then mapped; not sealed until it is shared (host_share).  With a crew joined (a model
 * load's lanes), the blob is offered to it, so that lanes with no tensor left write parts of it
 * from the back. */
static int cpu_host_load(const nwc_tensor_info *ti, void **out, bool *locked, nwcd_load_info *li) {
  size_t len = host_len(ti->length);
  *out = NULL, *locked = false;
  host_buf b = {.fd = -1};
  bool reused = spare_take(len, &b);
  int rc = 0;
  if (reused) {
    rc = spare_cut(&b, len);
  } else if ((b.fd = memfd_create("nwc-tensor", MFD_CLOEXEC | MFD_ALLOW_SEALING)) < 0) {
    rc = nwc__fail(-errno, "no memfd for %s/%s: %s", ti->model, ti->name, strerror(errno));
  } else if (b.len = len, ftruncate(b.fd, (off_t)len) < 0) {
    rc = nwc__fail(-errno, "memfd of %zu bytes for %s/%s: %s", len, ti->model, ti->name,
                   strerror(errno));
  }
  host_blob share = {ti, b.w, b.fd};
  nwcd_load_opts o = {0};
  if (rc == 0) o.split = nwcd_crew_offer(nwcd_crew_joined(), ti->length, ti->chunk_size,
                                         cpu_load_part, &share);
  if (rc == 0) rc = b.w ? nwcd_load(ti, b.w, &o, li) : nwcd_load_fd(ti, b.fd, &o, li);
  if (o.split) rc = nwcd_crew_withdraw(o.split, rc, li);
  if (rc == 0 && !reused) rc = map_ro(ti, &b);
  if (rc == 0 && !buf_add(&b)) rc = nwc__fail(-ENOMEM, "no memory to track a resident copy");
  if (rc < 0) {
    buf_release(&b);
    return rc;
  }
  *out = b.p, *locked = b.locked;
  return 0;
}

/* The copy's memfd, sealed against writes at its first share (F_SEAL_WRITE, once the loader's
 * writable mapping, if any, is gone: then none exists). */
static int cpu_host_share(void *p, size_t n) {
  (void)n;
  pthread_mutex_lock(&bufs_lock);
  size_t i = buf_find(p);
  int rc = i == nbufs ? nwc__fail(-EINVAL, "host_share of memory host_load did not return")
                      : bufs[i].fd;
  if (rc >= 0 && !bufs[i].sealed) {
    if (bufs[i].w) munmap(bufs[i].w, bufs[i].len);
    bufs[i].w = NULL;
    if (fcntl(rc, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
      rc = nwc__fail(-errno, "sealing a resident copy's memfd: %s", strerror(errno));
    else bufs[i].sealed = true;
  }
  pthread_mutex_unlock(&bufs_lock);
  return rc;
}

/* A copy never shared becomes a spare (host_trim bounds them); a shared one is unmapped and
 * closed (clients' mappings keep its pages). */
static void cpu_host_free(void *p, size_t n, bool locked) {
  (void)n, (void)locked;
  if (!p) return;
  host_buf gone = {.fd = -1};
  pthread_mutex_lock(&bufs_lock);
  size_t i = buf_find(p);
  if (i < nbufs && !bufs[i].sealed) {
    bufs[i].spare = true;
    spare_bytes += bufs[i].len;
  } else if (i < nbufs) {
    gone = bufs[i];
    bufs[i] = bufs[--nbufs];
  }
  pthread_mutex_unlock(&bufs_lock);
  buf_release(&gone);
}

static void cpu_host_trim(uint64_t keep, uint64_t want) {
  pthread_mutex_lock(&bufs_lock);
  if (spare_bytes <= keep) { /* the usual case: room for them all */
    pthread_mutex_unlock(&bufs_lock);
    return;
  }
  size_t spared = want ? spare_fit(want) : nbufs; /* the next load's stays */
  uint64_t limit = keep + (spared < nbufs ? bufs[spared].len : 0);
  size_t n = 0, k = 0;
  host_buf *gone = spare_bytes > limit ? malloc(nbufs * sizeof *gone) : NULL;
  for (size_t i = 0; i < nbufs; i++) {
    if (gone && spare_bytes > limit && bufs[i].spare && i != spared) {
      spare_bytes -= bufs[i].len;
      gone[n++] = bufs[i];
    } else {
      bufs[k++] = bufs[i];
    }
  }
  nbufs = k;
  pthread_mutex_unlock(&bufs_lock);
  for (size_t i = 0; i < n; i++) buf_release(&gone[i]);
  free(gone);
}

static int cpu_dequant(const nwc_tensor *t, uint64_t rb0, uint64_t rb1, uint16_t *out) {
  return nwc_dequant_range(t, rb0, rb1, out);
}

static int cpu_gather(const nwc_tensor *t, const uint64_t *rows, uint64_t n, uint16_t *out) {
  return nwc_gather(t, rows, n, out);
}

static int cpu_matvec(const nwc_tensor *t, const float *X, unsigned ncols, size_t ldx,
                      const float *bias, float *Y, size_t ldy) {
  /* One column: the single-vector kernel (X is K16 long, zero padded: ldx >= K16). */
  if (ncols == 1) return nwc_matvec(t, X, bias, Y, NULL);
  return nwc_matvec_batch(t, X, ncols, ldx, bias, Y, ldy, NULL);
}

static const nwcd_backend cpu_backend = {.name = "cpu", .host_load = cpu_host_load,
                                         .host_trim = cpu_host_trim,
                                         .host_free = cpu_host_free, .dequant = cpu_dequant,
                                         .gather = cpu_gather, .matvec = cpu_matvec,
                                         .host_share = cpu_host_share};

#ifdef NWC_WITH_CUDA
static nwcd_backend cuda_backend;
/* Staging rings per device: one per load lane, two slots of 4 MiB each (128 MiB in all), so
 * that every lane streams at once; made at a device's first load, kept until exit.  Loads are
 * hot (nwcd_load_opts.hot): each lane copies the page cache 1 MiB at a time (RING_PIECE: in a
 * core's 2 MiB L2) and checks it at once on its own core, alone (the lanes are as many as the
 * cores: helper threads would only add wake-ups), and a slot goes to the device when its 4 MiB
 * are in.  The in-process loader on the H200 host (docs/results.md, 2026-12-02 session 13): 16
 * lanes of two 4 MiB slots in 1 MiB pieces 44.4 GB/s; 16 MiB rings of 2 MiB slots, read whole
 * (the last geometry) 36.3-37.9; 16 MiB of 4 MiB in pieces 38.6; 8 MiB slots 31.9-33.7.  Fewer
 * bytes staged at once leave each slot in the caches until its copy reads it. */
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

/* dev_load: a device copy whose blob the loader streams through one of dev's rings; with a crew
 * joined (a model load's lanes), the blob is offered to it, so that lanes with no tensor left
 * load parts of it from the back, each through a ring of its own, and the load is queued: it
 * returns once the owner's last copies are queued, not done, so that its lane reads its next
 * tensor while they run (the copy's users wait for its arrival on the device, and the model
 * load settles its device's rings before it answers: dev_settle).  Waiting for them instead
 * kept every lane from reading at each tensor's end, and the lanes, which take equal tensors
 * together, left the copy engine idle together. */
static int cuda_dev_load(const nwc_tensor_info *ti, int dev, void **dcopy, nwcd_load_info *li) {
  *dcopy = NULL;
  unsigned k;
  int rc = ring_take(dev, &k);
  if (rc < 0) return rc;
  nwcd_blob_desc b = {.elem = ti->elem, .rows = ti->rows, .cols = ti->cols,
                      .nblocks = ti->nblocks, .length = ti->length, .off_bases = ti->off_bases,
                      .off_hdr = ti->off_hdr, .off_data = ti->off_data, .off_raw = ti->off_raw,
                      .off_scale = ti->off_scale};
  memcpy(b.psym, ti->psym, sizeof b.psym);
  void *blob = NULL;
  uint64_t t0 = nwcd_now_ns();
  nwcd_gpu_ring *g = rings[dev][k];
  void *side = NULL;
  if (rc == 0) rc = nwcd_gpu_ring_side(g, &side);
  if (rc == 0) /* queues the allocation and the table on the ring's stream */
    rc = nwcd_cuda_blob_alloc(&b, dev, nwcd_gpu_ring_stream(g), side, dcopy, &blob);
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
  if (rc == 0) nwcd_cuda_blob_finish(*dcopy, &b);
  if (rc < 0) {
    nwcd_cuda_free(*dcopy);
    *dcopy = NULL;
  }
  return rc;
}

/* dev_settle: waits for the copies that queued loads left running on dev's rings (0, or the
 * first ring's CUDA error). */
static int cuda_dev_settle(int dev) {
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

/* 0 and the cuda backend, or -ENODEV (detail: why) without a device. */
static int cuda_get(const nwcd_backend **out) {
  int n = 0;
  NWC_TRY(nwcd_cuda_devices(&n));
  if (n > NWCD_MAX_DEVICES) n = NWCD_MAX_DEVICES;
  cuda_backend = cpu_backend;
  cuda_backend.name = "cuda";
  cuda_backend.ndevices = n;
  cuda_backend.dev_load = cuda_dev_load;
  cuda_backend.dev_settle = cuda_dev_settle;
  cuda_backend.dev_size = nwcd_cuda_copy_size;
  cuda_backend.dev_scales = nwcd_cuda_scales;
  cuda_backend.dev_free = nwcd_cuda_free;
  cuda_backend.dev_dequant = nwcd_cuda_dequant;
  cuda_backend.dev_gather = nwcd_cuda_gather;
  cuda_backend.dev_matvec = nwcd_cuda_matvec;
  cuda_backend.dev_matvec_shared = nwcd_cuda_matvec_shared;
  cuda_backend.dev_meminfo = nwcd_cuda_meminfo;
  cuda_backend.dev_pool_idle = nwcd_cuda_pool_idle;
  cuda_backend.dev_trim = nwcd_cuda_trim;
  cuda_backend.dev_matvec_ipc = nwcd_cuda_matvec_ipc;
  cuda_backend.dev_dequant_ipc = nwcd_cuda_dequant_ipc;
  cuda_backend.forget = nwcd_cuda_forget;
  *out = &cuda_backend;
  return 0;
}
#endif

void nwcd_host_pages_note(void) {
  static const char path[] = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";
  char line[256] = "";
  FILE *f = fopen(path, "r");
  if (!f) return;
  bool got = fgets(line, sizeof line, f) != NULL;
  fclose(f);
  char *mode = got ? strchr(line, '[') : NULL, *end = mode ? strchr(mode, ']') : NULL;
  if (!end) return;
  mode++, *end = 0;
  if (!strcmp(mode, "always") || !strcmp(mode, "within_size") || !strcmp(mode, "force"))
    nwcd_log(NWCD_LOG_INFO, "tensor memory: 2 MiB pages where a tensor allows (shmem_enabled is '%s')",
             mode);
  else
    nwcd_log(NWCD_LOG_INFO,
             "tensor memory: 4 KiB pages (shmem_enabled is '%s'; 'within_size' loads faster: "
             "nwcd(8), PERFORMANCE)",
             mode);
}

int nwcd_backend_get(const char *name, const nwcd_backend **out) {
  bool is_auto = !name || !strcmp(name, "auto");
  if (is_auto || !strcmp(name, "cuda")) {
#ifdef NWC_WITH_CUDA
    int rc = cuda_get(out);
    if (rc == 0 || !is_auto) return rc;
#else
    NWC_RETURN_IF(!is_auto, -ENOTSUP,
                  "this build has no CUDA backend (configure with -DNWC_WITH_CUDA=ON); use "
                  "--backend cpu or auto");
#endif
  }
  if (is_auto || !strcmp(name, "cpu")) {
    *out = &cpu_backend;
    return 0;
  }
  return nwc__fail(-EINVAL, "unknown backend '%s' (auto, cpu or cuda)", name);
}
