/*
 * nwc_cuda.c - libnwc-cuda (nwc_cuda.h): nwcd's device copies imported into this process's CUDA
 * context, and the kernels of kernels/ launched on them in the caller's stream.
 *
 * Design (docs/gpu-maps.md):
 *   - libnwc-client's nwc_client_map_gpu does the protocol: the daemon's copy pool of the device
 *     as a POSIX file descriptor, each copy's 64 bytes of export data and where the kernel
 *     tensor's arrays lie in it, and the reference socket that holds the tensors resident.
 *   - A pool is imported once per process (cudaMemPoolImportFromShareableHandle), found again by
 *     the id the daemon gives it; a copy is imported once per process too
 *     (cudaMemPoolImportPointer), counted by the maps that hold it, so that two maps of one
 *     tensor in one process share one import.  Both live in one process-wide table under a
 *     mutex, used only when maps are made and freed, never by the compute calls.
 *   - The copies must be freed here before the daemon frees them (cudaMemPoolImportPointer's
 *     rule): unmap waits for the device, frees the imports the map held last, and only then
 *     closes the reference socket, after which the daemon may evict.  A process that dies has
 *     its imports torn down by the driver; the daemon sees the socket close.
 *   - Each map owns one scratch (cudaMalloc at map time, the largest nwc_k_scratch_bytes(t, 8)
 *     of its tensors): the compute calls allocate nothing and only enqueue, so a graph can hold
 *     them.
 *   - Access: the pool's memory is accessible from its own device; a read-only access is asked
 *     for (cudaMemPoolSetAccess, cudaMemAccessFlagsProtRead) and what the driver grants is read
 *     back (nwc_cuda_read_only).  The kernels only read.
 * Invariants: a map's tensors point into imports that live at least as long as the map; the
 * table's counts equal the maps holding each import.
 */
#include "nwc_cuda.h"

#include "nwc.h"
#include "nwc_kernels.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(NWC_CUDA_ROW_ALIGN == NWC_K_ROW_ALIGN, "the public row alignment is the kernels'");

static _Thread_local char last_error[1200];

const char *nwc_cuda_last_error(void) { return last_error; }

static int fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return err;
}

static int fail_cuda(cudaError_t e, const char *what) {
  cudaGetLastError(); /* clear a non-sticky error */
  return fail(e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO, "CUDA: %s: %s", what,
              cudaGetErrorString(e));
}

/* ---- the process's imports ----------------------------------------------------------------- */

typedef struct import {
  uint8_t data[64]; /* the export data */
  void *p;
  unsigned refs;
} import;

typedef struct pool {
  struct pool *next;
  uint64_t id;
  cudaMemPool_t pool;
  unsigned refs; /* maps using it */
  import *imp;
  size_t nimp, cap;
} pool;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pool *pools;

/* The pool with id (imported from fd if new), one reference more (lock held). */
static int pool_get(uint64_t id, int fd, pool **out) {
  for (pool *p = pools; p; p = p->next)
    if (p->id == id) {
      p->refs++;
      *out = p;
      return 0;
    }
  pool *p = calloc(1, sizeof *p);
  if (!p) return fail(-ENOMEM, "out of memory");
  cudaError_t e = cudaMemPoolImportFromShareableHandle(&p->pool, (void *)(uintptr_t)fd,
                                                       cudaMemHandleTypePosixFileDescriptor, 0);
  if (e != cudaSuccess) {
    free(p);
    return fail_cuda(e, "cudaMemPoolImportFromShareableHandle of nwcd's pool");
  }
  p->id = id, p->refs = 1, p->next = pools;
  pools = p;
  *out = p;
  return 0;
}

static void pool_put(pool *p) { /* lock held */
  if (--p->refs) return;
  pool **pp = &pools;
  while (*pp != p) pp = &(*pp)->next;
  *pp = p->next;
  if (cudaMemPoolDestroy(p->pool) != cudaSuccess) cudaGetLastError();
  free(p->imp);
  free(p);
}

/* The copy named by data, imported if new, one reference more (lock held). */
static int import_get(pool *p, const uint8_t data[64], void **out) {
  for (size_t i = 0; i < p->nimp; i++)
    if (!memcmp(p->imp[i].data, data, 64)) {
      p->imp[i].refs++;
      *out = p->imp[i].p;
      return 0;
    }
  if (p->nimp == p->cap) {
    size_t cap = p->cap ? p->cap * 2 : 64;
    import *n = realloc(p->imp, cap * sizeof *n);
    if (!n) return fail(-ENOMEM, "out of memory");
    p->imp = n, p->cap = cap;
  }
  struct cudaMemPoolPtrExportData ed;
  memcpy(&ed, data, sizeof ed);
  void *ptr = NULL;
  cudaError_t e = cudaMemPoolImportPointer(&ptr, p->pool, &ed);
  if (e != cudaSuccess) return fail_cuda(e, "cudaMemPoolImportPointer of a copy");
  import *im = &p->imp[p->nimp++];
  memcpy(im->data, data, 64);
  im->p = ptr, im->refs = 1;
  *out = ptr;
  return 0;
}

static void import_put(pool *p, void *ptr) { /* lock held; the device is idle */
  for (size_t i = 0; i < p->nimp; i++) {
    if (p->imp[i].p != ptr) continue;
    if (--p->imp[i].refs) return;
    if (cudaFree(ptr) != cudaSuccess) cudaGetLastError();
    p->imp[i] = p->imp[--p->nimp];
    return;
  }
}

/* ---- maps ------------------------------------------------------------------------------------ */

typedef struct slot {
  nwc_cuda_tensor pub;
  nwc_k_tensor k;
  void *base; /* the import */
} slot;

struct nwc_cuda_map {
  nwc_client_gpu_map *g; /* the protocol's map: its reference socket holds the tensors */
  pool *pool;
  int device, cuda_device, read_only;
  slot *s;
  size_t n, nimported;
  void *scratch;
  uint64_t scratch_bytes;
};

size_t nwc_cuda_count(const nwc_cuda_map *m) { return m ? m->n : 0; }
const nwc_cuda_tensor *nwc_cuda_at(const nwc_cuda_map *m, size_t i) {
  return m && i < m->n ? &m->s[i].pub : NULL;
}
const nwc_cuda_tensor *nwc_cuda_find(const nwc_cuda_map *m, const char *name) {
  for (size_t i = 0; m && name && i < m->n; i++)
    if (!strcmp(m->s[i].pub.name, name)) return &m->s[i].pub;
  return NULL;
}
int nwc_cuda_read_only(const nwc_cuda_map *m) { return m ? m->read_only : 0; }
uint64_t nwc_cuda_scratch_bytes(const nwc_cuda_map *m) { return m ? m->scratch_bytes : 0; }

/* -ENODEV unless the current device is the daemon's cuda:N (by UUID: ordinals differ between
 * processes with different CUDA_VISIBLE_DEVICES). */
static int same_device(const nwc_cuda_map *m) {
  struct cudaDeviceProp prop;
  cudaError_t e = cudaGetDeviceProperties(&prop, m->cuda_device);
  if (e != cudaSuccess) return fail_cuda(e, "cudaGetDeviceProperties");
  if (memcmp(&prop.uuid, m->g->uuid, 16))
    return fail(-ENODEV, "nwcd's cuda:%d is not this context's device (CUDA device %d here): "
                "make that GPU current first", m->device, m->cuda_device);
  return 0;
}

/* The pool must reach the current device, its own: access is asked for there if it has none,
 * then read-only access (the kernels only read), and what holds is read back.  A driver that
 * cannot say (cudaMemPoolGetAccess fails) is taken to give its own device read-write access,
 * the documented default. */
static int pool_access(nwc_cuda_map *m) {
  struct cudaMemLocation loc = {.type = cudaMemLocationTypeDevice, .id = m->cuda_device};
  enum cudaMemAccessFlags fl = cudaMemAccessFlagsProtNone;
  cudaError_t e = cudaMemPoolGetAccess(&fl, m->pool->pool, &loc);
  if (e != cudaSuccess) {
    cudaGetLastError();
    m->read_only = 0;
    return 0;
  }
  if (fl == cudaMemAccessFlagsProtNone) {
    struct cudaMemAccessDesc d = {.location = loc, .flags = cudaMemAccessFlagsProtRead};
    if (cudaMemPoolSetAccess(m->pool->pool, &d, 1) != cudaSuccess) {
      cudaGetLastError();
      d.flags = cudaMemAccessFlagsProtReadWrite;
      if ((e = cudaMemPoolSetAccess(m->pool->pool, &d, 1)) != cudaSuccess)
        return fail_cuda(e, "cudaMemPoolSetAccess of nwcd's pool for this device");
    }
    if ((e = cudaMemPoolGetAccess(&fl, m->pool->pool, &loc)) != cudaSuccess)
      return fail_cuda(e, "cudaMemPoolGetAccess of nwcd's pool");
  }
  if (fl == cudaMemAccessFlagsProtReadWrite) {
    struct cudaMemAccessDesc d = {.location = loc, .flags = cudaMemAccessFlagsProtRead};
    if (cudaMemPoolSetAccess(m->pool->pool, &d, 1) != cudaSuccess) cudaGetLastError();
    if (cudaMemPoolGetAccess(&fl, m->pool->pool, &loc) != cudaSuccess) cudaGetLastError();
  }
  m->read_only = fl == cudaMemAccessFlagsProtRead;
  return 0;
}

/* The kernel view of record r over the import at base; checks its geometry. */
static int view(const nwc_client_gpu_tensor *r, uint8_t *base, slot *s) {
  uint64_t lay[4];
  if (nwc_layout(r->rows, r->cols, r->elem, lay) < 0 || lay[NWC_LAYOUT_BLOCKS] != r->nblocks)
    return fail(-EBADMSG, "nwcd's record of %s: %llu blocks for %llux%llu elem 0x%x", r->name,
                (unsigned long long)r->nblocks, (unsigned long long)r->rows,
                (unsigned long long)r->cols, r->elem);
  nwc_k_tensor *k = &s->k;
  memset(k, 0, sizeof *k);
  k->elem = r->elem, k->rows = r->rows, k->cols = r->cols, k->nblocks = r->nblocks;
  k->tab = (const uint32_t *)(base + r->off_tab);
  k->bases = (const uint64_t *)(base + r->off_bases);
  k->hdr = base + r->off_hdr, k->data = base + r->off_data, k->raw = base + r->off_raw;
  k->scale = r->off_scale ? (const float *)(base + r->off_scale) : NULL;
  memcpy(k->psym, r->psym, 16);
  s->base = base;
  s->pub = (nwc_cuda_tensor){r->name, r->elem, r->rows, r->cols, lay[NWC_LAYOUT_K16], k,
                             r->bytes};
  return 0;
}

/* Imports every copy of m->g and sizes the scratch (lock held). */
static int import_all(nwc_cuda_map *m) {
  for (size_t i = 0; i < m->n; i++) {
    void *base = NULL;
    int rc = import_get(m->pool, m->g->t[i].export_data, &base);
    if (rc < 0) return rc;
    m->s[i].base = base, m->nimported++;
    if ((rc = view(&m->g->t[i], base, &m->s[i])) < 0) return rc;
    int64_t need = nwc_k_scratch_bytes(&m->s[i].k, 8);
    if (need > 0 && (uint64_t)need > m->scratch_bytes) m->scratch_bytes = (uint64_t)need;
  }
  return 0;
}

static int map(nwc_client *c, const char *model, const char *tensor, int device,
               nwc_cuda_map **out) {
  if (!out) return fail(-EINVAL, "bad arguments");
  *out = NULL;
  nwc_cuda_map *m = calloc(1, sizeof *m);
  if (!m) return fail(-ENOMEM, "out of memory");
  m->device = device;
  cudaError_t e = cudaGetDevice(&m->cuda_device);
  int rc = e == cudaSuccess ? 0 : fail_cuda(e, "cudaGetDevice");
  if (rc == 0 && (rc = nwc_client_map_gpu(c, model, tensor, device, &m->g)) < 0)
    fail(rc, "%s", nwc_client_last_error());
  if (rc == 0 && !(m->s = calloc(m->g->n, sizeof *m->s))) rc = fail(-ENOMEM, "out of memory");
  if (rc == 0) {
    m->n = m->g->n;
    pthread_mutex_lock(&lock);
    rc = same_device(m);
    if (rc == 0) rc = pool_get(m->g->pool_id, m->g->pool_fd, &m->pool);
    if (rc == 0) rc = pool_access(m);
    if (rc == 0) rc = import_all(m);
    pthread_mutex_unlock(&lock);
  }
  if (rc == 0 && m->scratch_bytes && (e = cudaMalloc(&m->scratch, m->scratch_bytes)) != cudaSuccess)
    rc = fail_cuda(e, "cudaMalloc of a map's scratch");
  /* zeroed once, and done before the map is returned: the caller's stream may not wait for the
   * default stream, and the kernels' part words there must start at zero (nwc_k_scratch_bytes) */
  if (rc == 0 && m->scratch && ((e = cudaMemsetAsync(m->scratch, 0, m->scratch_bytes, 0)) != cudaSuccess ||
                                (e = cudaStreamSynchronize(0)) != cudaSuccess))
    rc = fail_cuda(e, "zeroing a map's scratch");
  if (rc < 0) {
    nwc_cuda_unmap(m);
    return rc;
  }
  *out = m;
  return 0;
}

int nwc_cuda_map_model(nwc_client *c, const char *model, int device, nwc_cuda_map **out) {
  return map(c, model, "", device, out);
}

int nwc_cuda_map_tensor(nwc_client *c, const char *model, const char *tensor, int device,
                        nwc_cuda_map **out) {
  if (!tensor || !*tensor) return fail(-EINVAL, "no tensor named (nwc_cuda_map_model maps all)");
  return map(c, model, tensor, device, out);
}

void nwc_cuda_unmap(nwc_cuda_map *m) {
  if (!m) return;
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) cudaGetLastError();
  if (cudaSetDevice(m->cuda_device) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
    cudaGetLastError();
  if (m->scratch && cudaFree(m->scratch) != cudaSuccess) cudaGetLastError();
  if (m->pool) {
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < m->nimported; i++) import_put(m->pool, m->s[i].base);
    pool_put(m->pool);
    pthread_mutex_unlock(&lock);
  }
  if (prev >= 0 && cudaSetDevice(prev) != cudaSuccess) cudaGetLastError();
  nwc_client_gpu_map_free(m->g); /* closes the reference: nwcd may evict from now on */
  free(m->s);
  free(m);
}

/* ---- compute ------------------------------------------------------------------------------- */

/* t's slot in m, or NULL (a tensor of another map, or no tensor). */
static const slot *slot_of(const nwc_cuda_map *m, const nwc_cuda_tensor *t) {
  if (!m || !t || !m->n) return NULL;
  uintptr_t a = (uintptr_t)t, lo = (uintptr_t)&m->s[0], hi = (uintptr_t)&m->s[m->n];
  if (a < lo || a >= hi || (a - lo) % sizeof(slot) != 0) return NULL;
  return (const slot *)t; /* pub is the slot's first member */
}

static int kernel_rc(int rc, const char *what, const nwc_cuda_tensor *t) {
  if (rc == 0) return 0;
  if (rc == -EIO)
    return fail(-EIO, "CUDA: %s of %s: %s", what, t->name,
                cudaGetErrorString((cudaError_t)nwc_k_last_cuda_error()));
  return fail(rc, "%s of %s refused (%d): %s", what, t->name, rc,
              rc == -ENOTSUP ? "a layout or element type the kernels lack" : "bad arguments");
}

#define SLOT_OR_FAIL(m, t, s)                                                                    \
  const slot *s = slot_of(m, t);                                                                 \
  if (!s) return fail(-EINVAL, "the tensor is not one of this map's")

/* Both matvecs: x fp32 or (bf16_x) BF16. */
static int matvec(const nwc_cuda_map *m, const nwc_cuda_tensor *t, const void *x, int bf16_x,
                  unsigned ncols, uint64_t ldx, const float *bias, float *y, uint16_t *y_bf16,
                  uint64_t ldy, cudaStream_t stream) {
  SLOT_OR_FAIL(m, t, s);
  if (ncols < 1 || ncols > NWC_K_MAX_COLS)
    return fail(-EINVAL, "%u columns (1..%d a call)", ncols, NWC_K_MAX_COLS);
  if (bf16_x && NWC_ELEM_LAYOUT(s->k.elem) == 0)
    return fail(-ENOTSUP, "matvec of %s with BF16 x: layout 0's kernels read fp32 x (nwc_cuda_matvec)", t->name);
  return kernel_rc(bf16_x ? nwc_k_matvec_cols_bf16x(&s->k, x, ncols, ldx, bias, y, y_bf16, ldy, m->scratch, stream)
                          : nwc_k_matvec_cols(&s->k, x, ncols, ldx, bias, y, y_bf16, ldy, m->scratch, stream),
                   "matvec", t);
}

int nwc_cuda_matvec(const nwc_cuda_map *m, const nwc_cuda_tensor *t, const float *x,
                    unsigned ncols, uint64_t ldx, const float *bias, float *y, uint16_t *y_bf16,
                    uint64_t ldy, cudaStream_t stream) {
  return matvec(m, t, x, 0, ncols, ldx, bias, y, y_bf16, ldy, stream);
}

int nwc_cuda_matvec_bf16x(const nwc_cuda_map *m, const nwc_cuda_tensor *t, const uint16_t *x,
                          unsigned ncols, uint64_t ldx, const float *bias, float *y, uint16_t *y_bf16,
                          uint64_t ldy, cudaStream_t stream) {
  return matvec(m, t, x, 1, ncols, ldx, bias, y, y_bf16, ldy, stream);
}

int nwc_cuda_linear(const nwc_cuda_map *m, const nwc_cuda_tensor *t, const float *x,
                    const float *bias, uint16_t *y, cudaStream_t stream) {
  SLOT_OR_FAIL(m, t, s);
  return kernel_rc(nwc_k_linear_bf16(&s->k, x, bias, y, m->scratch, stream), "linear", t);
}

int nwc_cuda_dequant(const nwc_cuda_map *m, const nwc_cuda_tensor *t, uint16_t *out,
                     cudaStream_t stream) {
  SLOT_OR_FAIL(m, t, s);
  return kernel_rc(nwc_k_dequant(&s->k, out, stream), "dequant", t);
}

int nwc_cuda_dequant_rows(const nwc_cuda_map *m, const nwc_cuda_tensor *t, uint64_t row0,
                          uint64_t nrows, uint16_t *out, cudaStream_t stream) {
  SLOT_OR_FAIL(m, t, s);
  int rc = nwc_k_dequant_rows(&s->k, row0, nrows, out, stream);
  if (rc == -EINVAL && out && (uintptr_t)out % 16 == 0)
    return fail(rc, "dequant_rows of %s: rows %llu + %llu of %llu: the start must be a multiple "
                "of %d, the count too unless it reaches the last row", t->name,
                (unsigned long long)row0, (unsigned long long)nrows, (unsigned long long)t->rows,
                NWC_CUDA_ROW_ALIGN);
  return kernel_rc(rc, "dequant_rows", t);
}

int nwc_cuda_gather(const nwc_cuda_map *m, const nwc_cuda_tensor *t, const uint64_t *rows,
                    uint64_t n, uint16_t *out, cudaStream_t stream) {
  SLOT_OR_FAIL(m, t, s);
  return kernel_rc(nwc_k_gather(&s->k, rows, n, out, stream), "gather", t);
}
