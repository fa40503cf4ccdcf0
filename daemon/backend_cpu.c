/*
 * backend_cpu.c - the compute backend interface (nwcd.h, nwcd_backend) and its CPU
 * implementation: host memory in memfds, pinned with mlock where RLIMIT_MEMLOCK allows (a
 * warning once otherwise), and the store/ decoders for dequant, gather and matvec.
 *
 * Host memory: each resident copy is one memfd (MFD_ALLOW_SEALING) mapped shared, so that its
 * pages can be handed to clients (map, residency.c) with no copy.  host_alloc maps it writable
 * for the loader; host_share, once the load is done, makes the daemon's view read-only and seals
 * the memfd (F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL): from then on no
 * process can write it (write(), a writable shared mmap, or an mprotect to PROT_WRITE of a
 * read-only one all fail), shrink it or lift the seals, and the only writable mapping that ever
 * existed is ours, already PROT_READ.  F_SEAL_WRITE would need that mapping gone (a remap and a
 * second mlock populate per load); the future-write seal gives clients the same guarantee at no
 * cost.  host_free unmaps and closes it; a client's mapping keeps the pages alive after that.
 * The memfd of each allocation is found by its address in a table under a mutex.
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

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1 */
#endif

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

static void *cpu_host_alloc(size_t n, bool *locked) {
  size_t len = host_len(n);
  *locked = false;
  int fd = memfd_create("nwc-tensor", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  void *p = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, (off_t)len) == 0)
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED || !buf_add(p, fd)) {
    nwcd_log(NWCD_LOG_WARN, "no memfd of %zu bytes for a resident tensor: %s", len,
             strerror(errno));
    if (p != MAP_FAILED) munmap(p, len);
    if (fd >= 0) close(fd);
    return NULL;
  }
  *locked = mlock(p, len) == 0;
  if (!*locked && !atomic_exchange(&mlock_warned, 1))
    nwcd_log(NWCD_LOG_WARN,
             "mlock of %zu bytes failed (%s): resident tensors are not pinned; raise "
             "RLIMIT_MEMLOCK (LimitMEMLOCK=infinity) to pin them",
             len, strerror(errno));
  return p;
}

static int cpu_host_share(void *p, size_t n) {
  int fd = buf_fd(p, false);
  NWC_RETURN_IF(fd < 0, -EINVAL, "host_share of memory host_alloc did not return");
  NWC_RETURN_IF(mprotect(p, host_len(n), PROT_READ) < 0, -errno,
                "mprotect of a resident copy: %s", strerror(errno));
  NWC_RETURN_IF(fcntl(fd, F_ADD_SEALS,
                      F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0,
                -errno, "sealing a resident copy's memfd: %s", strerror(errno));
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

static const nwcd_backend cpu_backend = {.name = "cpu", .host_alloc = cpu_host_alloc,
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
