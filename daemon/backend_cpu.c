/*
 * backend_cpu.c - the compute backend interface (nwcd.h, nwcd_backend) and its CPU
 * implementation: host memory in memfds, pinned with mlock where RLIMIT_MEMLOCK allows (a
 * warning once otherwise), and the store/ decoders for dequant, gather and matvec.
 *
 * Host memory: each resident copy is one memfd (MFD_ALLOW_SEALING), so that its pages can be
 * handed to clients (map, residency.c) with no copy.  host_load makes it, has the loader write
 * the blob into it (nwcd_load_fd: pwrite of each checked slot of a staging ring, which makes
 * the pages without zeroing them or faulting them in), then seals it (F_SEAL_WRITE |
 * F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) and only then maps it, read-only, populated and
 * locked.  No writable mapping of it ever exists, so the plain write seal applies: from then on
 * no process can write it (write(), a writable shared mmap, an mprotect to PROT_WRITE of a
 * read-only one all fail), shrink it, grow it or lift the seals.  host_share returns the memfd;
 * host_free unmaps and closes it; a client's mapping keeps the pages alive after that.  The
 * memfd of each allocation is found by its address in a table under a mutex.
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
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static atomic_int mlock_warned;

typedef struct host_buf {
  void *p;
  int fd;
} host_buf;

static pthread_mutex_t bufs_lock = PTHREAD_MUTEX_INITIALIZER;
static host_buf *bufs;
static size_t nbufs, cap_bufs;

static size_t host_len(size_t n) { return n ? (n + 4095) & ~(size_t)4095 : 4096; }

/* The memfd behind p (removing its entry when take is set), or -1. */
static int buf_fd(const void *p, bool take) {
  int fd = -1;
  pthread_mutex_lock(&bufs_lock);
  for (size_t i = 0; i < nbufs; i++) {
    if (bufs[i].p != p) continue;
    fd = bufs[i].fd;
    if (take) bufs[i] = bufs[--nbufs];
    break;
  }
  pthread_mutex_unlock(&bufs_lock);
  return fd;
}

static bool buf_add(void *p, int fd) {
  pthread_mutex_lock(&bufs_lock);
  if (nbufs == cap_bufs) {
    size_t cap = cap_bufs ? 2 * cap_bufs : 64;
    host_buf *b = realloc(bufs, cap * sizeof *b);
    if (b) bufs = b, cap_bufs = cap;
  }
  bool ok = nbufs < cap_bufs;
  if (ok) bufs[nbufs++] = (host_buf){p, fd};
  pthread_mutex_unlock(&bufs_lock);
  return ok;
}

/* host_load: the blob written into a fresh memfd, sealed, then mapped read-only and locked. */
static int cpu_host_load(const nwc_tensor_info *ti, void **out, bool *locked, nwcd_load_info *li) {
  size_t len = host_len(ti->length);
  *out = NULL, *locked = false;
  int fd = memfd_create("nwc-tensor", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return nwc__fail(-errno, "no memfd for %s/%s: %s", ti->model, ti->name, strerror(errno));
  int rc = ftruncate(fd, (off_t)len) == 0 ? nwcd_load_fd(ti, fd, NULL, li)
                                          : nwc__fail(-errno, "memfd of %zu bytes for %s/%s: %s",
                                                      len, ti->model, ti->name, strerror(errno));
  if (rc == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL))
    rc = nwc__fail(-errno, "sealing the memfd of %s/%s: %s", ti->model, ti->name, strerror(errno));
  void *p = MAP_FAILED;
  if (rc == 0) { /* locked where RLIMIT_MEMLOCK allows (EAGAIN: it does not) */
    p = mmap(NULL, len, PROT_READ, MAP_SHARED | MAP_POPULATE | MAP_LOCKED, fd, 0);
    *locked = p != MAP_FAILED;
    int why = errno;
    if (p == MAP_FAILED && why == EAGAIN)
      p = mmap(NULL, len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (!*locked && p != MAP_FAILED && !atomic_exchange(&mlock_warned, 1))
      nwcd_log(NWCD_LOG_WARN,
               "locking %zu bytes failed (%s): resident tensors are not pinned; raise "
               "RLIMIT_MEMLOCK (LimitMEMLOCK=infinity) to pin them",
               len, strerror(why));
    if (p == MAP_FAILED)
      rc = nwc__fail(-errno, "mapping %zu bytes of %s/%s: %s", len, ti->model, ti->name,
                     strerror(errno));
  }
  if (rc == 0 && !buf_add(p, fd)) rc = nwc__fail(-ENOMEM, "no memory to track a resident copy");
  if (rc < 0) {
    if (p != MAP_FAILED) munmap(p, len);
    close(fd);
    *locked = false;
    return rc;
  }
  *out = p;
  return 0;
}

static int cpu_host_share(void *p, size_t n) {
  (void)n;
  int fd = buf_fd(p, false);
  NWC_RETURN_IF(fd < 0, -EINVAL, "host_share of memory host_load did not return");
  return fd;
}

static void cpu_host_free(void *p, size_t n, bool locked) {
  (void)locked; /* munmap unlocks */
  if (!p) return;
  int fd = buf_fd(p, true);
  munmap(p, host_len(n));
  if (fd >= 0) close(fd);
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
                                         .host_free = cpu_host_free, .dequant = cpu_dequant,
                                         .gather = cpu_gather, .matvec = cpu_matvec,
                                         .host_share = cpu_host_share};

#ifdef NWC_WITH_CUDA
static nwcd_backend cuda_backend;
/* Staging rings per device: 8 of 32 MiB (256 MiB in all), so that eight loads stream at once
 * (ops.c's load lanes); made at a device's first load, kept until exit. */
#define RINGS 8
static nwcd_gpu_ring *rings[NWCD_MAX_DEVICES][RINGS];
static bool ring_busy[NWCD_MAX_DEVICES][RINGS];
static pthread_mutex_t rings_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ring_free = PTHREAD_COND_INITIALIZER;

/* A ring of dev for one load (waits while all are busy); -errno if it cannot be made. */
static int ring_take(int dev, unsigned *k) {
  pthread_mutex_lock(&rings_lock);
  for (;;) {
    for (*k = 0; *k < RINGS && ring_busy[dev][*k]; (*k)++) {
    }
    if (*k < RINGS) break;
    pthread_cond_wait(&ring_free, &rings_lock);
  }
  int rc = rings[dev][*k] ? 0 : nwcd_gpu_ring_create(dev, 32u << 20, 0, &rings[dev][*k]);
  ring_busy[dev][*k] = rc == 0;
  pthread_mutex_unlock(&rings_lock);
  return rc;
}

static void ring_give(int dev, unsigned k) {
  pthread_mutex_lock(&rings_lock);
  ring_busy[dev][k] = false;
  pthread_cond_signal(&ring_free);
  pthread_mutex_unlock(&rings_lock);
}

/* dev_load: a device copy whose blob the loader streams through one of dev's rings. */
static int cuda_dev_load(const nwc_tensor_info *ti, int dev, void **dcopy, float **scale,
                         nwcd_load_info *li) {
  *dcopy = NULL, *scale = NULL;
  unsigned k;
  int rc = ring_take(dev, &k);
  if (rc < 0) return rc;
  nwcd_blob_desc b = {.elem = ti->elem, .rows = ti->rows, .cols = ti->cols,
                      .nblocks = ti->nblocks, .length = ti->length, .off_bases = ti->off_bases,
                      .off_hdr = ti->off_hdr, .off_data = ti->off_data, .off_raw = ti->off_raw,
                      .off_scale = ti->off_scale};
  memcpy(b.psym, ti->psym, sizeof b.psym);
  void *blob = NULL;
  rc = nwcd_cuda_blob_alloc(&b, dev, dcopy, &blob);
  if (rc == 0 && ti->off_scale && !(*scale = malloc(ti->rows * sizeof **scale)))
    rc = nwc__fail(-ENOMEM, "no memory for the scales of %s", ti->name);
  if (rc == 0) rc = nwcd_load_to_device(rings[dev][k], ti, blob, NULL, li);
  ring_give(dev, k);
  if (rc == 0) rc = nwcd_cuda_blob_finish(*dcopy, &b, *scale);
  if (rc < 0) {
    nwcd_cuda_free(*dcopy), free(*scale);
    *dcopy = NULL, *scale = NULL;
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
  cuda_backend.dev_size = nwcd_cuda_copy_size;
  cuda_backend.dev_free = nwcd_cuda_free;
  cuda_backend.dev_dequant = nwcd_cuda_dequant;
  cuda_backend.dev_gather = nwcd_cuda_gather;
  cuda_backend.dev_matvec = nwcd_cuda_matvec;
  cuda_backend.dev_meminfo = nwcd_cuda_meminfo;
  cuda_backend.dev_trim = nwcd_cuda_trim;
  cuda_backend.dev_matvec_ipc = nwcd_cuda_matvec_ipc;
  cuda_backend.dev_dequant_ipc = nwcd_cuda_dequant_ipc;
  cuda_backend.ipc_forget = nwcd_cuda_ipc_forget;
  *out = &cuda_backend;
  return 0;
}
#endif

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
