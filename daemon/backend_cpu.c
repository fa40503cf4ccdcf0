/*
 * backend_cpu.c - the CPU implementation of the compute backend interface (backend.h,
 * nwcd_backend): host memory in memfds, pinned with mlock where RLIMIT_MEMLOCK allows (a
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
 * nwcd_host_load_with is host_load with the blob's bytes written by its caller's function: how a
 * load to several places (the cuda backend's places_load) writes the host copy from the read it
 * shares with the devices, into the very memory host_load would make.
 *
 * Spares: a copy freed (evicted by LRU) that was never shared has had no reader but this process, so
 * host_free keeps it, mapped, populated and locked, and the next host_load of at most its size
 * takes the smallest such spare, cuts it to its length (ftruncate frees the rest), zeros what the
 * blob leaves of its last page (a packed blob's length is a multiple of 64, not of 4096: the old
 * copy's bytes there must not reach a client that maps the new one) and loads the
 * new blob straight into its existing pages (nwcd_load, zero copy) through a second, writable
 * mapping made at its first reuse: a reload makes no page and copies each byte once.  That
 * mapping is unmapped before the seal, so the write seal still finds no writable mapping.  A
 * shared (sealed) copy is unmapped and closed when freed; clients' mappings keep its pages.
 * Residency bounds the spares with host_trim so that resident and spare bytes together stay
 * within the budget, and frees them all on an explicit evict.  The copies and spares are found
 * in one table under a mutex.
 *
 * The "cuda" backend (backend.c) is this table with the device functions added: mapped
 * (non-resident) and host-resident tensors still run these decoders there.
 */
#include "backend.h"

#include "crew.h"
#include "loader.h"
#include "log.h"

#include "nwc_error.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
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

/* A spare cut to len bytes (its tail unmapped, then truncated away: those pages freed) for a
 * blob of used bytes (the zeros after it in its last page written here), with a writable mapping
 * of its populated pages for the loader (made at its first reuse, kept while it is not shared);
 * without one (mmap failed) the loader writes it with pwrite. */
static int spare_cut(host_buf *b, size_t len, size_t used) {
  static const uint8_t zeros[4096];
  if (b->len != len) {
    munmap((uint8_t *)b->p + len, b->len - len);
    if (b->w) munmap((uint8_t *)b->w + len, b->len - len);
    b->len = len;
    NWC_RETURN_IF(ftruncate(b->fd, (off_t)len) < 0, -errno, "truncating a spare memfd: %s",
                  strerror(errno));
  }
  assert(len - used < sizeof zeros); /* len is used rounded up to a page (host_len) */
  NWC_RETURN_IF(pwrite(b->fd, zeros, len - used, (off_t)used) < 0, -errno,
                "zeroing the end of a spare memfd: %s", strerror(errno));
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

/* A host copy being written, as a crew's helper sees it. */
typedef struct host_blob {
  const nwc_tensor_info *ti;
  nwcd_host_dst dst;
} host_blob;

/* A crew helper's part of a host copy (nwcd_part_fn): bytes [off, off + len) of the blob into the
 * same memory, through the helper's own staging ring when written into the memfd. */
static int cpu_load_part(void *ctx, uint64_t off, uint64_t len, nwcd_load_info *li) {
  const host_blob *h = ctx;
  nwcd_load_opts o = {.from = off, .to = off + len};
  return h->dst.w ? nwcd_load(h->ti, h->dst.w, &o, li) : nwcd_load_fd(h->ti, h->dst.fd, &o, li);
}

/* host_load's fill: the blob read into dst; with a crew joined (a model load's lanes), the blob is
 * offered to it, so that lanes with no tensor left write parts of it from the back. */
static int cpu_fill(void *ctx, const nwc_tensor_info *ti, const nwcd_host_dst *dst,
                    nwcd_load_info *li) {
  (void)ctx;
  host_blob share = {ti, *dst};
  nwcd_load_opts o = {0};
  o.split = nwcd_crew_offer(nwcd_crew_joined(), ti->length, ti->chunk_size, cpu_load_part, &share);
  int rc = dst->w ? nwcd_load(ti, dst->w, &o, li) : nwcd_load_fd(ti, dst->fd, &o, li);
  if (o.split) rc = nwcd_crew_withdraw(o.split, rc, li);
  return rc;
}

int nwcd_host_load_with(const nwc_tensor_info *ti, nwcd_host_fill_fn fill, void *ctx, void **out,
                        bool *locked, nwcd_load_info *li) {
  size_t len = host_len(ti->length);
  *out = NULL, *locked = false;
  host_buf b = {.fd = -1};
  bool reused = spare_take(len, &b);
  int rc = 0;
  if (reused) {
    rc = spare_cut(&b, len, ti->length);
  } else if ((b.fd = memfd_create("nwc-tensor", MFD_CLOEXEC | MFD_ALLOW_SEALING)) < 0) {
    rc = nwc__fail(-errno, "no memfd for %s/%s: %s", ti->model, ti->name, strerror(errno));
  } else if (b.len = len, ftruncate(b.fd, (off_t)len) < 0) {
    rc = nwc__fail(-errno, "memfd of %zu bytes for %s/%s: %s", len, ti->model, ti->name,
                   strerror(errno));
  }
  nwcd_host_dst dst = {b.w, b.fd};
  if (rc == 0) rc = fill(ctx, ti, &dst, li);
  if (rc == 0 && !reused) rc = map_ro(ti, &b);
  if (rc == 0 && !buf_add(&b)) rc = nwc__fail(-ENOMEM, "no memory to track a resident copy");
  if (rc < 0) {
    buf_release(&b);
    return rc;
  }
  *out = b.p, *locked = b.locked;
  return 0;
}

/* host_load: the blob written into a spare of its size or more (cut to it), or into a fresh
 * memfd then mapped; not sealed until it is shared (host_share). */
static int cpu_host_load(const nwc_tensor_info *ti, void **out, bool *locked, nwcd_load_info *li) {
  return nwcd_host_load_with(ti, cpu_fill, NULL, out, locked, li);
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

const nwcd_backend nwcd_cpu_backend = {.name = "cpu", .host_load = cpu_host_load,
                                       .host_trim = cpu_host_trim,
                                       .host_free = cpu_host_free, .dequant = cpu_dequant,
                                       .gather = cpu_gather, .matvec = cpu_matvec,
                                       .host_share = cpu_host_share};


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
