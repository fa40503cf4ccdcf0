/*
 * test_loader.c - nwcd's loader (daemon/loader.c) on real files and a real io_uring: a store made
 * from random BF16 weights (fresh seed), every blob loaded in every mode (auto, O_DIRECT,
 * buffered), cold (pages dropped with POSIX_FADV_DONTNEED) and warm, with random depths and read
 * sizes, hot or not (page-cache reads copied inline one at a time), from several threads at once,
 * and through a ring of registered buffers to a sink that holds and gives back slots in random
 * order (queued loads leaving it slots that the next load takes back, never handing out a held one;
 * queued loads in a row through a sink that gives slots back only when waited for, each returning
 * with slots still held, then a failing load, queued or not, that must take every one back, the
 * ring whole after it), with one to four threads checking chunks, and into memfds through the
 * thread's staging ring (nwcd_load_fd, host residency's).  Each load must give exactly the
 * container's bytes (read independently with pread) and decode to the original weights; progress
 * must be monotonic, read by read, ending at the length; a thread keeps one io_uring across loads;
 * bad options are refused.  A byte flipped in a container fails the load naming the chunk; a
 * truncated container fails naming the end; a load into a file that refuses writes (read-only,
 * sealed) fails naming the tensor.  A blob offered to a crew (crew.c) loads exactly the same
 * whether other threads took parts of its back before the load or while it ran, parts shrink toward
 * the blob's end (a helper that goes first leaves the owner less than two chunks), a part a helper
 * fails to load (its ring refused) is loaded by the owner, and a flipped byte in a helper's part
 * fails the owner's load naming the chunk.
 *
 *   test_loader          the above, plus copies of a container on /dev/shm (tmpfs)
 *   test_loader --ramfs  O_DIRECT refused: a container copied onto ramfs (mounted in a private
 *                        mount namespace) loads buffered with identical bytes; 77 where no
 *                        mount namespace can be made
 *   test_loader --gpu    (CUDA builds) every blob streamed into device memory through a small
 *                        GPU ring (slots reused many times), copied back and compared, cold and
 *                        warm, every mode, and all of them queued one after another (each load
 *                        returning with its last copies running) then compared once the ring
 *                        settled; damaged containers fail as above; 77 without a GPU
 */
#include "crew.h"
#include "loader_cuda.h"
#include "test_store_util.h"

#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>

#ifdef NWCD_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#define MIB (1u << 20)

static char dir[512];
#ifdef NWCD_WITH_CUDA
static nwcd_gpu_ring *gpu; /* --gpu: the ring loads go through (NULL otherwise) */
#endif
static nwc_store *store;
static nwc_tensor_info *ti;
static size_t nti;
static uint16_t *weights[3]; /* the source BF16 of the tensors, in source order */

/* ---- the store and references -------------------------------------------------------------- */

static uint16_t rand_bf16(void) {
  /* roughly normal weights: exponent around 120, random sign and mantissa */
  unsigned e = 118 + (unsigned)test_below(6) - (test_below(8) == 0 ? (unsigned)test_below(20) : 0);
  return (uint16_t)((test_below(2) << 15) | (e << 7) | test_below(128));
}

static void make_store(void) {
  make_tmpdir(dir, sizeof dir, "loader");
  static const char *names[3] = {"big.weight", "mid.weight", "small"};
  uint64_t rows[3] = {1024 + 8 * test_below(512), 64 + test_below(300), 1};
  uint64_t cols[3] = {4096, 512 * (1 + test_below(4)), 512};
  st_spec sp[3];
  for (int i = 0; i < 3; i++) {
    uint64_t n = rows[i] * cols[i];
    weights[i] = malloc(n * 2);
    for (uint64_t k = 0; k < n; k++) weights[i][k] = rand_bf16();
    sp[i] = (st_spec){names[i], "BF16", 2, {rows[i], cols[i]}, weights[i], n * 2};
  }
  char st[600], sd[600];
  snprintf(st, sizeof st, "%s/m.safetensors", dir);
  snprintf(sd, sizeof sd, "%s/store", dir);
  CHECK_RC(st_write(st, sp, 3));
  CHECK_RC(nwc_store_open(sd, NWC_STORE_CREATE, &store));
  CHECK_RC(nwc_store_import(store, "m", st, NULL));
  CHECK_RC(nwc_store_tensors(store, "m", &ti, &nti));
  CHECK(nti == 3, "%zu tensors", nti);
  printf("blobs: %llu, %llu, %llu bytes (%llu chunks in the largest)\n",
         (unsigned long long)ti[0].length, (unsigned long long)ti[1].length,
         (unsigned long long)ti[2].length, (unsigned long long)ti[0].nchunks);
}

/* The blob's bytes as the file holds them (plain pread). */
static uint8_t *file_bytes(const nwc_tensor_info *t) {
  uint8_t *b = malloc(t->length);
  int fd = open(t->path, O_RDONLY);
  ssize_t n = fd >= 0 ? pread(fd, b, t->length, (off_t)t->offset) : -1;
  if (fd >= 0) close(fd);
  CHECK(n == (ssize_t)t->length, "pread %s", t->path);
  return b;
}

static void drop_cache(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd >= 0) {
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

/* Pages of t's range that are not in the page cache now (mincore on a mapping of the range). */
static uint64_t pages_not_cached(const nwc_tensor_info *t) {
  uint64_t start = t->offset & ~(uint64_t)4095, len = t->offset + t->length - start;
  uint64_t n = (len + 4095) / 4096, missing = n;
  int fd = open(t->path, O_RDONLY);
  void *map = fd >= 0 ? mmap(NULL, len, PROT_READ, MAP_SHARED, fd, (off_t)start) : MAP_FAILED;
  unsigned char *v = malloc(n);
  if (map != MAP_FAILED && v && mincore(map, len, v) == 0) {
    missing = 0;
    for (uint64_t i = 0; i < n; i++) missing += !(v[i] & 1);
  }
  if (map != MAP_FAILED) munmap(map, len);
  if (fd >= 0) close(fd);
  free(v);
  return missing;
}

static bool direct_allowed(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECT);
  if (fd >= 0) close(fd);
  return fd >= 0;
}

static uint8_t *aligned_garbage(uint64_t n) {
  uint8_t *p = NULL;
  if (posix_memalign((void **)&p, 4096, n)) abort();
  for (uint64_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 131 + 7);
  return p;
}

/* Progress as the loader reports it: strictly increasing (a step per read), ending at the length. */
typedef struct prog {
  uint64_t last, calls, total;
  bool bad;
} prog;

static void on_progress(void *ctx, uint64_t done, uint64_t total) {
  prog *p = ctx;
  if (done <= p->last || done > total ||
      (p->total && total != p->total))
    p->bad = true;
  p->last = done, p->total = total, p->calls++;
}

static void check_progress(const prog *p, const nwc_tensor_info *t, const char *what) {
  CHECK(!p->bad && p->last == t->length && p->total == t->length && p->calls >= 1,
        "%s: progress %s, last %llu of %llu, %llu calls", what, p->bad ? "not monotonic" : "ok",
        (unsigned long long)p->last, (unsigned long long)t->length, (unsigned long long)p->calls);
}

/* ---- loads into host memory ---------------------------------------------------------------- */

static const char *mode_name(unsigned m) {
  return m == NWCD_LOAD_AUTO ? "auto" : m == NWCD_LOAD_DIRECT ? "direct" : "buffered";
}

/* A fresh memfd (of the blob's size, or empty: the writes extend it) loaded by nwcd_load_fd,
 * its bytes read back into buf: 0, or the load's error. */
static int fd_load(const nwc_tensor_info *t, const nwcd_load_opts *o, uint8_t *buf,
                   nwcd_load_info *li) {
  int fd = memfd_create("test-loader", MFD_CLOEXEC);
  CHECK(fd >= 0, "memfd_create: %s", strerror(errno));
  if (fd < 0) return -errno;
  if (test_below(2)) CHECK(ftruncate(fd, (off_t)t->length) == 0, "ftruncate");
  int rc = nwcd_load_fd(t, fd, o, li);
  struct stat st;
  if (rc == 0) {
    CHECK(fstat(fd, &st) == 0 && (uint64_t)st.st_size == t->length, "memfd of %llu bytes",
          (unsigned long long)st.st_size);
    CHECK(pread(fd, buf, t->length, 0) == (ssize_t)t->length, "read back");
  }
  close(fd);
  return rc;
}

/* For hot loads, half the time: a piece of 1 or 2 MiB (a read copied and checked in pieces). */
static uint64_t random_piece(bool hot) {
  return hot && test_below(2) ? MIB * (1 + test_below(2)) : 0;
}

/* Loads t (random depth, read size and checkers) into host memory, or (to_fd) into a memfd,
 * and compares with ref. */
static void load_and_compare(const nwc_tensor_info *t, const uint8_t *ref, unsigned mode,
                             bool to_fd, nwcd_load_info *li, const char *what) {
  nwcd_load_opts o = {.mode = mode, .depth = 1 + (unsigned)test_below(64),
                      .read_size = test_below(3) ? 0 : MIB * (1 + test_below(to_fd ? 1 : 4)),
                      .checkers = (unsigned)test_below(5), /* memfd: slots of 1 MiB */
                      .hot = test_below(2)};
  o.piece = random_piece(o.hot);
  prog p = {0};
  o.progress = on_progress, o.ctx = &p;
  uint8_t *buf = aligned_garbage(t->length);
  int rc = to_fd ? fd_load(t, &o, buf, li) : nwcd_load(t, buf, &o, li);
  CHECK(rc == 0, "%s %s (%s%s, depth %u, read %llu, checkers %u, hot %d): %s: %s", what,
        t->name, mode_name(mode), to_fd ? ", into a memfd" : "", o.depth,
        (unsigned long long)o.read_size, o.checkers, o.hot, nwc_strerror(rc), nwc_error_detail());
  CHECK(rc || !memcmp(buf, ref, t->length), "%s %s (%s%s): bytes differ", what, t->name,
        mode_name(mode), to_fd ? ", into a memfd" : "");
  if (rc == 0) check_progress(&p, t, what);
  free(buf);
}

#ifdef NWCD_WITH_CUDA
/* Loads t into fresh device memory through the GPU ring: 0 and the bytes copied back, or the
 * error. */
static int gpu_load(const nwc_tensor_info *t, const nwcd_load_opts *o, uint8_t *back,
                    nwcd_load_info *li) {
  void *dev = NULL;
  if (cudaMalloc(&dev, t->length) != cudaSuccess) return -ENOMEM;
  if (cudaMemset(dev, 0xab, t->length) != cudaSuccess) {
    cudaFree(dev);
    return -EIO;
  }
  int rc = nwcd_load_to_device(gpu, t, dev, o, li);
  if (rc == 0 && cudaMemcpy(back, dev, t->length, cudaMemcpyDeviceToHost) != cudaSuccess) rc = -EIO;
  cudaFree(dev);
  return rc;
}

static void test_gpu(void) {
  for (size_t i = 0; i < nti; i++) {
    const nwc_tensor_info *t = &ti[i];
    uint8_t *ref = file_bytes(t), *back = malloc(t->length);
    for (unsigned mode = NWCD_LOAD_AUTO; mode <= NWCD_LOAD_BUFFERED; mode++)
      for (int cold = 0; cold < 2; cold++) {
        if (cold) drop_cache(t->path);
        prog p = {0};
        nwcd_load_opts o = {.mode = mode, .depth = 1 + (unsigned)test_below(64),
                            .hot = test_below(2), .progress = on_progress, .ctx = &p};
        o.piece = random_piece(o.hot);
        nwcd_load_info li;
        int rc = gpu_load(t, &o, back, &li);
        CHECK(rc == 0, "gpu load %s (%s, %s, hot %d): %s: %s", t->name, mode_name(mode),
              cold ? "cold" : "warm", o.hot, nwc_strerror(rc), nwc_error_detail());
        CHECK(rc || !memcmp(back, ref, t->length), "gpu load %s (%s): bytes differ", t->name,
              mode_name(mode));
        if (rc == 0) check_progress(&p, t, "gpu");
      }
    free(ref), free(back);
  }
  /* Queued loads (a model load's lanes): each returns with its last copies running, the next
   * one reclaims their slots; after the ring settles every blob is on the device whole. */
  void **dev = calloc(nti, sizeof *dev);
  for (size_t i = 0; dev && i < nti; i++) {
    nwcd_load_opts o = {.mode = (unsigned)test_below(3), .hot = test_below(2), .queued = true};
    o.piece = random_piece(o.hot);
    int rc = cudaMalloc(&dev[i], ti[i].length) == cudaSuccess ? 0 : -ENOMEM;
    if (rc == 0) rc = nwcd_load_to_device(gpu, &ti[i], dev[i], &o, NULL);
    CHECK(rc == 0, "queued gpu load %s: %s: %s", ti[i].name, nwc_strerror(rc), nwc_error_detail());
  }
  CHECK_RC(nwcd_gpu_ring_settle(gpu));
  for (size_t i = 0; dev && i < nti; i++) {
    uint8_t *ref = file_bytes(&ti[i]), *back = malloc(ti[i].length);
    CHECK(dev[i] && cudaMemcpy(back, dev[i], ti[i].length, cudaMemcpyDeviceToHost) == cudaSuccess &&
              !memcmp(back, ref, ti[i].length),
          "queued gpu load %s: bytes differ after the ring settled", ti[i].name);
    cudaFree(dev[i]);
    free(ref), free(back);
  }
  free(dev);
}
#endif

static void test_modes(void) {
  for (size_t i = 0; i < nti; i++) {
    const nwc_tensor_info *t = &ti[i];
    uint8_t *ref = file_bytes(t);
    bool direct = direct_allowed(t->path);
    for (unsigned k = 0; k < 2 * (NWCD_LOAD_BUFFERED + 1); k++) {
      unsigned mode = k / 2;
      bool to_fd = k % 2; /* nwcd_load, then nwcd_load_fd (host residency's) */
      nwcd_load_info li;
      drop_cache(t->path);
      load_and_compare(t, ref, mode, to_fd, &li, "cold");
      bool small = mode == NWCD_LOAD_AUTO && t->length <= 4 * MIB; /* read whole, buffered */
      bool packed = (t->offset | t->length) % 4096 != 0; /* shares its pages: buffered in every mode */
      if (mode == NWCD_LOAD_BUFFERED || !direct || small || packed)
        CHECK(li.direct_bytes == 0 && !li.direct, "cold %s: %llu bytes O_DIRECT", mode_name(mode),
              (unsigned long long)li.direct_bytes);
      else
        CHECK(li.direct_bytes == t->length && li.direct, "cold %s: %llu of %llu bytes O_DIRECT",
              mode_name(mode), (unsigned long long)li.direct_bytes,
              (unsigned long long)t->length);
      free(file_bytes(t)); /* warm the page cache */
      load_and_compare(t, ref, mode, to_fd, &li, "warm");
      /* A page the kernel evicted since (memory pressure from parallel tests) is read O_DIRECT,
       * which leaves it uncached: O_DIRECT bytes with every page cached are the failure. */
      if (mode != NWCD_LOAD_DIRECT && li.direct_bytes) {
        uint64_t missing = pages_not_cached(t);
        CHECK(missing > 0, "warm %s: %llu bytes O_DIRECT, yet the page cache holds every page",
              mode_name(mode), (unsigned long long)li.direct_bytes);
        if (missing)
          printf("warm %s %s: %llu bytes O_DIRECT, %llu pages evicted since the warming read\n",
                 mode_name(mode), t->name, (unsigned long long)li.direct_bytes,
                 (unsigned long long)missing);
      }
      CHECK(li.bytes == t->length, "li.bytes %llu", (unsigned long long)li.bytes);
    }
    free(ref);
  }
}

/* The loaded blob decodes to the original weights (through the store's blob view). */
static void test_decode(void) {
  for (size_t i = 0; i < nti; i++) {
    const nwc_tensor_info *t = &ti[i];
    uint8_t *buf = aligned_garbage(t->length);
    CHECK_RC(nwcd_load_blob(t, buf, NULL, NULL, NULL));
    nwc_tensor v;
    int rc = nwc_store_blob_view(t, buf, &v);
    CHECK_RC(rc);
    uint16_t *out = malloc(t->rows * t->cols * 2);
    if (rc == 0) CHECK_RC(nwc_dequant(&v, out));
    CHECK(rc || !memcmp(out, weights[i], t->rows * t->cols * 2), "%s decodes differently",
          t->name);
    free(out);
    free(buf);
  }
}

static int count_uring_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d))) {
    char p[300], target[256];
    snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
    ssize_t k = readlink(p, target, sizeof target - 1);
    if (k > 0) target[k] = 0, n += strstr(target, "io_uring") != NULL;
  }
  if (d) closedir(d);
  return n;
}

typedef struct worker {
  pthread_t th;
  int loads, failures, urings_seen;
} worker;

static void *worker_main(void *arg) {
  worker *w = arg;
  for (int k = 0; k < w->loads; k++) {
    const nwc_tensor_info *t = &ti[(size_t)rand() % nti];
    uint8_t *ref = file_bytes(t), *buf = aligned_garbage(t->length);
    nwcd_load_opts o = {.mode = (unsigned)(rand() % 3), .depth = 1 + (unsigned)(rand() % 64),
                        .checkers = (unsigned)(rand() % 5), .hot = rand() % 2};
    o.piece = o.hot && rand() % 2 ? MIB : 0;
    if (nwcd_load(t, buf, &o, NULL) < 0 || memcmp(buf, ref, t->length)) w->failures++;
    free(ref), free(buf);
  }
  return NULL;
}

/* Several threads load at once; each keeps one io_uring for all its loads. */
static void test_threads(void) {
  int before = count_uring_fds();
  uint8_t *buf = aligned_garbage(ti[0].length + 4096);
  CHECK(nwcd_load_blob(&ti[0], buf + 8, NULL, NULL, NULL) == -EINVAL, "unaligned buffer taken");
  /* ranges: from not a chunk's start, empty, reversed, past the blob, ending inside a chunk */
  nwcd_load_opts bad[10] = {{.depth = 65}, {.checkers = 5}, {.read_size = MIB + 4096},
                            {.hot = true, .piece = MIB + 4096}, {.piece = MIB},
                            {.from = 4096}, {.from = MIB, .to = MIB}, {.from = 2 * MIB, .to = MIB},
                            {.to = ti[0].length + MIB}, {.to = MIB + 4096}};
  for (int k = 0; k < 10; k++)
    CHECK(nwcd_load(&ti[0], buf, &bad[k], NULL) == -EINVAL, "bad options %d taken", k);
  for (int k = 0; k < 10; k++) CHECK_RC(nwcd_load_blob(&ti[k % nti], buf, NULL, NULL, NULL));
  free(buf);
  int after = count_uring_fds();
  CHECK(after - before <= 1, "10 loads on one thread opened %d io_urings", after - before);
  worker w[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (worker){.loads = 12};
    pthread_create(&w[i].th, NULL, worker_main, &w[i]);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(w[i].th, NULL);
    CHECK(w[i].failures == 0, "thread %d: %d of %d loads wrong", i, w[i].failures, w[i].loads);
  }
}

/* ---- the ring ------------------------------------------------------------------------------ */

/* A sink that copies slots into dst and keeps up to hold of them before giving them back in
 * random order. */
typedef struct hold_sink {
  uint8_t *dst;
  unsigned held[1024], nheld, hold, consumed;
  int fail_at; /* consume returns -ENOSPC at this call (0: never) */
  bool bad;
  bool stingy; /* reclaim gives nothing back unless the loader waits (a GPU sink whose copies
                  are still running) */
} hold_sink;

static int hs_consume(void *ctx, nwcd_ring *r, const nwcd_slot *s) {
  hold_sink *h = ctx;
  if ((int)++h->consumed == h->fail_at) return -ENOSPC;
  uint64_t bytes;
  unsigned nslots;
  uint8_t *mem = nwcd_ring_memory(r, &bytes, &nslots);
  if (s->index >= nslots) h->bad = true;
  if ((uint8_t *)s->data < mem || (uint8_t *)s->data + s->len > mem + bytes) h->bad = true;
  for (unsigned i = 0; i < h->nheld; i++) h->bad |= h->held[i] == s->index; /* handed out twice */
  memcpy(h->dst + s->offset, s->data, s->len);
  h->held[h->nheld++] = s->index;
  return 0;
}

static int hs_reclaim(void *ctx, nwcd_ring *r, bool wait) {
  hold_sink *h = ctx;
  unsigned keep = wait ? 0 : h->stingy ? h->nheld : (unsigned)test_below(h->hold + 1);
  while (h->nheld > keep) {
    unsigned i = (unsigned)test_below(h->nheld);
    nwcd_ring_release(r, h->held[i]);
    h->held[i] = h->held[--h->nheld];
    if (wait && test_below(2)) break; /* at least one: sometimes just one */
  }
  return 0;
}

static void test_ring(void) {
  nwcd_ring *r = NULL;
  unsigned slots = 2 + (unsigned)test_below(10);
  uint64_t slot = MIB * (1 + test_below(3));
  CHECK_RC(nwcd_ring_create(slots * slot, slot, &r));
  if (!r) return;
  for (int round = 0; round < 6; round++) {
    const nwc_tensor_info *t = &ti[round % nti];
    uint8_t *ref = file_bytes(t);
    if (round & 1) drop_cache(t->path);
    hold_sink h = {.dst = aligned_garbage(t->length), .hold = (unsigned)test_below(slots + 1)};
    nwcd_sink sk = {hs_consume, hs_reclaim, &h};
    prog p = {0};
    nwcd_load_opts o = {.mode = (unsigned)test_below(3), .depth = 1 + (unsigned)test_below(64),
                        .checkers = (unsigned)test_below(5), .hot = test_below(2),
                        .progress = on_progress, .ctx = &p};
    o.piece = random_piece(o.hot);
    o.queued = test_below(2); /* then the sink may keep slots, and the next load takes them */
    nwcd_load_info li;
    int rc = nwcd_ring_load(r, t, &o, &sk, &li);
    CHECK(rc == 0, "ring load %s (%u slots of %llu, hot %d, queued %d): %s: %s", t->name, slots,
          (unsigned long long)slot, o.hot, o.queued, nwc_strerror(rc), nwc_error_detail());
    CHECK(!memcmp(h.dst, ref, t->length) && !h.bad, "ring load %s: bytes differ", t->name);
    check_progress(&p, t, "ring");
    if (o.queued) { /* the next blob through the same sink, which still holds some slots */
      const nwc_tensor_info *t2 = &ti[(round + 1) % nti];
      uint8_t *ref2 = file_bytes(t2);
      free(h.dst);
      h.dst = aligned_garbage(t2->length);
      rc = nwcd_ring_load(r, t2, NULL, &sk, NULL);
      CHECK(rc == 0 && !memcmp(h.dst, ref2, t2->length) && !h.bad,
            "ring load %s after a queued one: %d (%s)", t2->name, rc, nwc_error_detail());
      free(ref2);
    }
    CHECK(h.nheld == 0, "ring load returned with %u slots still held", h.nheld);
    free(h.dst);
    /* A sink that fails: the load returns its error and the ring is whole again. */
    hold_sink f = {.dst = aligned_garbage(t->length), .hold = 1, .fail_at = 1 + (int)test_below(2)};
    nwcd_sink fk = {hs_consume, hs_reclaim, &f};
    rc = nwcd_ring_load(r, t, NULL, &fk, NULL);
    CHECK(rc == -ENOSPC || (rc == 0 && t->length <= slot && f.fail_at > 1),
          "failing sink: %d (%s)", rc, nwc_error_detail());
    free(f.dst);
    free(ref);
  }
  nwcd_ring_free(r);
}

/* Queued ring loads one after another through one sink that gives slots back only when the
 * loader waits (as the GPU ring's sink does while copies run): each queued load must return with
 * slots still with the sink (or it waited after all), the next one must take them back without
 * handing a held slot out twice, a load that fails (its sink, or a damaged chunk in the daemon)
 * must still take every slot back, including those an earlier queued load left, and the ring must
 * be whole afterwards (a load that drains it fails with -EIO if a slot was lost). */
static void test_ring_queued(void) {
  unsigned slots = 2 + (unsigned)test_below(3);
  uint64_t slot = MIB * (1 + test_below(2));
  nwcd_ring *r = NULL;
  CHECK_RC(nwcd_ring_create(slots * slot, slot, &r));
  if (!r) return;
  hold_sink h = {.stingy = true};
  nwcd_sink sk = {hs_consume, hs_reclaim, &h};
  for (int round = 0; round < 4; round++) {
    const nwc_tensor_info *t = &ti[round % 2]; /* the big blob (several slots) and the mid one */
    uint8_t *ref = file_bytes(t);
    h.dst = aligned_garbage(t->length);
    nwcd_load_opts o = {.mode = (unsigned)test_below(3), .depth = 1 + (unsigned)test_below(64),
                        .read_size = test_below(2) ? MIB : 0, .hot = test_below(2),
                        .queued = true};
    o.piece = random_piece(o.hot);
    int rc = nwcd_ring_load(r, t, &o, &sk, NULL);
    CHECK(rc == 0 && !memcmp(h.dst, ref, t->length) && !h.bad,
          "queued ring load %s (round %d, %u slots of %llu): %d (%s)", t->name, round, slots,
          (unsigned long long)slot, rc, nwc_error_detail());
    CHECK(h.nheld > 0, "queued ring load %s waited for its sink (round %d)", t->name, round);
    free(h.dst), free(ref);
  }
  /* A load that fails at its first slot (queued or not: a failed load waits all the same),
   * through the sink that still holds the last ones. */
  const nwc_tensor_info *t = &ti[0];
  h.dst = aligned_garbage(t->length);
  h.fail_at = (int)h.consumed + 1;
  nwcd_load_opts fo = {.queued = test_below(2)};
  int rc = nwcd_ring_load(r, t, &fo, &sk, NULL);
  CHECK(rc == -ENOSPC && h.nheld == 0 && !h.bad,
        "failing load (queued %d) after queued ones: %d (%s), %u slots still held", fo.queued,
        rc, nwc_error_detail(), h.nheld);
  free(h.dst);
  /* The ring is whole: a plain load through a fresh sink drains it to every slot. */
  uint8_t *ref = file_bytes(t);
  hold_sink g = {.dst = aligned_garbage(t->length), .hold = slots};
  nwcd_sink gk = {hs_consume, hs_reclaim, &g};
  rc = nwcd_ring_load(r, t, NULL, &gk, NULL);
  CHECK(rc == 0 && !memcmp(g.dst, ref, t->length) && !g.bad && g.nheld == 0,
        "load after a failed one: %d (%s)", rc, nwc_error_detail());
  free(g.dst), free(ref);
  nwcd_ring_free(r);
}

/* ---- damaged containers -------------------------------------------------------------------- */

static void expect_failure(const nwc_tensor_info *t, int want, const char *text, const char *what) {
  uint8_t *buf = aligned_garbage(t->length);
  for (unsigned mode = NWCD_LOAD_AUTO; mode <= NWCD_LOAD_BUFFERED; mode++) {
    drop_cache(t->path);
    /* buffered: hot, in pieces of a chunk (a bad chunk named from its piece's check) */
    bool buffered = mode == NWCD_LOAD_BUFFERED;
    nwcd_load_opts o = {.mode = mode, .depth = 1 + (unsigned)test_below(64),
                        .checkers = 1 + (unsigned)test_below(4),
                        .hot = buffered || test_below(2), .piece = buffered ? MIB : 0};
    int rc = nwcd_load(t, buf, &o, NULL);
    const char *d = nwc_error_detail();
    CHECK(rc == want && strstr(d, text), "%s (%s, hot %d): %d (%s), want %d naming '%s'", what,
          mode_name(mode), o.hot, rc, d, want, text);
    hold_sink h = {.dst = buf, .hold = 2};
    nwcd_sink sk = {hs_consume, hs_reclaim, &h};
    nwcd_ring *r = NULL;
    CHECK_RC(nwcd_ring_create(4 * MIB, MIB, &r));
    rc = r ? nwcd_ring_load(r, t, &o, &sk, NULL) : want;
    CHECK(rc == want && strstr(nwc_error_detail(), text), "%s through a ring: %d (%s)", what, rc,
          nwc_error_detail());
    nwcd_ring_free(r);
    rc = fd_load(t, &o, buf, NULL);
    CHECK(rc == want && strstr(nwc_error_detail(), text), "%s into a memfd: %d (%s)", what, rc,
          nwc_error_detail());
#ifdef NWCD_WITH_CUDA
    if (gpu) {
      rc = gpu_load(t, &o, buf, NULL);
      CHECK(rc == want && strstr(nwc_error_detail(), text), "%s into the GPU: %d (%s)", what, rc,
            nwc_error_detail());
    }
#endif
  }
  free(buf);
}

/* Flips a random bit of the byte at file offset at. */
static void flip_bit(const char *path, uint64_t at) {
  int fd = open(path, O_RDWR);
  uint8_t b;
  CHECK(pread(fd, &b, 1, (off_t)at) == 1, "pread %s", path);
  b ^= (uint8_t)(1u << test_below(8));
  CHECK(pwrite(fd, &b, 1, (off_t)at) == 1, "pwrite %s", path);
  close(fd);
}

static void copy_file(const char *from, const char *to) {
  size_t n = 0;
  FILE *f = fopen(from, "rb");
  CHECK(f != NULL, "open %s", from);
  if (!f) return;
  fseek(f, 0, SEEK_END);
  n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc(n);
  CHECK(fread(b, 1, n, f) == n, "read %s", from);
  fclose(f);
  CHECK_RC(write_file(to, b, n));
  free(b);
}

static void test_damage(void) {
  const nwc_tensor_info *t = &ti[0];
  char path[700];
  snprintf(path, sizeof path, "%s/damaged.nwc", dir);
  nwc_tensor_info c = *t;
  c.path = path;
  /* a flipped byte: the chunk that holds it is named */
  copy_file(t->path, path);
  uint64_t at = test_below(t->length), chunk = at / MIB;
  flip_bit(path, t->offset + at);
  char want[64];
  snprintf(want, sizeof want, "chunk %llu,", (unsigned long long)chunk);
  expect_failure(&c, -EBADMSG, want, "flipped byte");
  /* truncated: the file ends inside the blob, at a page boundary or not */
  copy_file(t->path, path);
  uint64_t cut = t->offset + test_below(t->length);
  if (test_below(2)) cut &= ~(uint64_t)4095;
  CHECK(truncate(path, (off_t)cut) == 0, "truncate");
  expect_failure(&c, -EIO, "the file ends at", "truncated");
  unlink(path);
}

/* ---- a crew: the back of a blob loaded by other threads (crew.c) ---------------------------- */

typedef struct part_ctx {
  const nwc_tensor_info *t;
  uint8_t *buf;
  unsigned mode;
  atomic_uint refuse; /* the first calls that fail at once, as a helper whose ring failed */
} part_ctx;

/* A helper's part: loaded on its own into the same buffer (nwcd_part_fn). */
static int host_part(void *ctx, uint64_t off, uint64_t len, nwcd_load_info *li) {
  part_ctx *p = ctx;
  for (unsigned n = atomic_load(&p->refuse); n;)
    if (atomic_compare_exchange_weak(&p->refuse, &n, n - 1))
      return -ENOMEM;
  nwcd_load_opts o = {.mode = p->mode, .from = off, .to = off + len};
  return nwcd_load(p->t, p->buf, &o, li);
}

typedef struct crew_helper {
  nwcd_crew *crew;
  atomic_bool stop;
  pthread_t th;
} crew_helper;

static void *helper_loop(void *arg) {
  crew_helper *h = arg;
  while (!atomic_load(&h->stop)) nwcd_crew_help(h->crew, NULL);
  return NULL;
}

/* One load of t offered to a crew (parts of part_mib chunks): with helpers == 0 this thread
 * helps first (so that the parts are certainly taken), else that many threads help while this
 * one loads; the first refuse parts fail in the helper (the owner loads them when it withdraws).
 * Returns the owner's withdraw result; *parts gets what helpers took.  Every byte is loaded
 * once: the owner's bytes and the helpers' add up to the blob's length. */
static int crew_load(const nwc_tensor_info *t, uint8_t *buf, unsigned helpers, uint64_t part_mib,
                     unsigned refuse, uint64_t *parts) {
  nwcd_crew *crew = nwcd_crew_new(part_mib * MIB);
  unsigned mode = (unsigned)test_below(3);
  part_ctx pc = {t, buf, mode, refuse};
  nwcd_split *s = nwcd_crew_offer(crew, t->length, MIB, host_part, &pc);
  CHECK(s != NULL, "a blob of %llu bytes not offered in parts of %llu MiB",
        (unsigned long long)t->length, (unsigned long long)part_mib);
  crew_helper h[3];
  for (unsigned i = 0; i < helpers; i++) {
    h[i].crew = crew;
    atomic_store(&h[i].stop, false);
    pthread_create(&h[i].th, NULL, helper_loop, &h[i]);
  }
  if (!helpers) nwcd_crew_help(crew, NULL);
  nwcd_load_opts o = {.mode = mode, .depth = 1 + (unsigned)test_below(32), .hot = test_below(2),
                      .split = s};
  nwcd_load_info li;
  int rc = nwcd_load(t, buf, &o, &li);
  uint64_t own = li.bytes;
  if (s) rc = nwcd_crew_withdraw(s, rc, &li);
  for (unsigned i = 0; i < helpers; i++) {
    atomic_store(&h[i].stop, true);
    pthread_join(h[i].th, NULL);
  }
  uint64_t bytes;
  nwcd_crew_taken(crew, parts, &bytes);
  nwcd_crew_free(crew);
  CHECK(rc < 0 || (own + bytes == t->length && li.bytes == t->length), "the owner loaded %llu "
        "bytes, helpers %llu, of %llu; the load counts %llu", (unsigned long long)own,
        (unsigned long long)bytes, (unsigned long long)t->length, (unsigned long long)li.bytes);
  /* parts shrink toward the end: a helper that went first left the owner less than 2 chunks */
  CHECK(rc < 0 || helpers || own < 2 * MIB, "a helper that went first left the owner %llu "
        "bytes of %llu (parts of %llu MiB)", (unsigned long long)own,
        (unsigned long long)t->length, (unsigned long long)part_mib);
  return rc;
}

static void test_crew(void) {
  const nwc_tensor_info *t = &ti[0];
  uint8_t *ref = file_bytes(t);
  uint64_t parts = 0;
  /* too small to share: the owner loads it all */
  nwcd_crew *crew = nwcd_crew_new(t->length / 2);
  CHECK(nwcd_crew_offer(crew, t->length, MIB, host_part, NULL) == NULL, "a blob of two parts "
        "offered");
  nwcd_crew_free(crew);
  for (int round = 0; round < 12; round++) {
    unsigned helpers = round < 4 ? 0 : 1 + (unsigned)test_below(3);
    uint64_t most = t->length / (3 * MIB); /* parts that leave three to a blob */
    uint64_t part = 1 + test_below(most < 3 ? most : 3);
    uint8_t *buf = aligned_garbage(t->length);
    drop_cache(t->path);
    /* this thread helping first takes many parts: the first one or two fail, the owner's don't */
    unsigned refuse = round % 2 && !helpers ? 1 + (unsigned)test_below(2) : 0;
    int rc = crew_load(t, buf, helpers, part, refuse, &parts);
    CHECK(rc == 0 && !memcmp(buf, ref, t->length), "crew load (%u helpers, parts of %llu MiB, "
          "%u refused): %d %s", helpers, (unsigned long long)part, refuse, rc,
          rc ? nwc_error_detail() : "wrong bytes");
    CHECK(helpers || parts > 0, "the helping thread took no part of %llu bytes",
          (unsigned long long)t->length);
    free(buf);
  }
  /* a flipped byte in the last chunk: the helper that loaded it fails, the owner's load names it */
  char path[700];
  snprintf(path, sizeof path, "%s/damaged-back.nwc", dir);
  copy_file(t->path, path);
  nwc_tensor_info c = *t;
  c.path = path;
  flip_bit(path, t->offset + t->length - 1 - test_below(t->length - (t->nchunks - 1) * MIB));
  char want[64];
  snprintf(want, sizeof want, "chunk %llu,", (unsigned long long)(t->nchunks - 1));
  uint8_t *buf = aligned_garbage(t->length);
  int rc = crew_load(&c, buf, 0, 1, 0, &parts);
  CHECK(rc == -EBADMSG && strstr(nwc_error_detail(), want), "a bad chunk in a helper's part: %d "
        "(%s), want EBADMSG naming '%s'", rc, nwc_error_detail(), want);
  unlink(path);
  free(buf), free(ref);
}

/* nwcd_load_fd into files that refuse the writes fails with the write's error, named. */
static void test_fd_refused(void) {
  const nwc_tensor_info *t = &ti[test_below(nti)];
  CHECK(nwcd_load_fd(t, -1, NULL, NULL) == -EINVAL, "a load into fd -1 taken");
  int ro = open(t->path, O_RDONLY);
  int rc = nwcd_load_fd(t, ro, NULL, NULL);
  CHECK(rc == -EBADF && strstr(nwc_error_detail(), "writing"), "into a read-only file: %d (%s)",
        rc, nwc_error_detail());
  close(ro);
  int fd = memfd_create("test-loader", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  CHECK(fd >= 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) == 0, "sealed memfd");
  rc = nwcd_load_fd(t, fd, NULL, NULL);
  CHECK(rc == -EPERM && strstr(nwc_error_detail(), t->name), "into a sealed memfd: %d (%s)", rc,
        nwc_error_detail());
  close(fd);
  /* the thread's ring is fine afterwards */
  uint8_t *ref = file_bytes(t);
  load_and_compare(t, ref, NWCD_LOAD_AUTO, true, NULL, "after refused writes");
  free(ref);
}

/* The same bytes from a copy of the container on another file system. */
static void load_copy_at(const char *where, bool expect_direct_refused) {
  const nwc_tensor_info *t = &ti[0];
  char path[700];
  snprintf(path, sizeof path, "%s/nwc-loader-%d.nwc", where, (int)getpid()); /* runs at once */
  copy_file(t->path, path);
  nwc_tensor_info c = *t;
  c.path = path;
  uint8_t *ref = file_bytes(t);
  bool refused = !direct_allowed(path);
  printf("%s: O_DIRECT %s\n", where, refused ? "refused" : "allowed");
  CHECK(!expect_direct_refused || refused, "%s should refuse O_DIRECT", where);
  for (unsigned mode = NWCD_LOAD_AUTO; mode <= NWCD_LOAD_BUFFERED; mode++) {
    nwcd_load_info li;
    drop_cache(path);
    load_and_compare(&c, ref, mode, mode == NWCD_LOAD_AUTO, &li, where);
    if (refused) CHECK(li.direct_bytes == 0, "%s: O_DIRECT bytes %llu", where,
                       (unsigned long long)li.direct_bytes);
  }
  free(ref);
  unlink(path);
}

/* A private mount namespace (and a user namespace when not root) holding a ramfs. */
static int mount_ramfs(const char *at) {
  if (geteuid() == 0) {
    if (unshare(CLONE_NEWNS) < 0) return -errno;
  } else {
    uid_t uid = geteuid();
    gid_t gid = getegid();
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) < 0) return -errno;
    char m[64];
    snprintf(m, sizeof m, "0 %u 1", (unsigned)uid);
    write_file("/proc/self/setgroups", "deny", 4);
    if (write_file("/proc/self/uid_map", m, strlen(m)) < 0) return -EPERM;
    snprintf(m, sizeof m, "0 %u 1", (unsigned)gid);
    if (write_file("/proc/self/gid_map", m, strlen(m)) < 0) return -EPERM;
  }
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return -errno;
  return mount("ramfs", at, "ramfs", 0, NULL) < 0 ? -errno : 0;
}

int main(int argc, char **argv) {
  bool ramfs = argc > 1 && !strcmp(argv[1], "--ramfs");
  bool on_gpu = argc > 1 && !strcmp(argv[1], "--gpu");
  const char *name = ramfs ? "test_loader --ramfs" : on_gpu ? "test_loader --gpu" : "test_loader";
  test_seed(name);
  char rf[600] = "";
  if (ramfs) { /* before any io_uring: a user namespace needs a single-threaded process */
    snprintf(rf, sizeof rf, "%s/nwc-ramfs-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(rf)) return 1;
    int rc = mount_ramfs(rf);
    if (rc < 0) {
      printf("no private ramfs mount here (%s): skipped\n", strerror(-rc));
      rmdir(rf);
      return TEST_SKIP;
    }
  }
  if (on_gpu) {
#ifdef NWCD_WITH_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
      printf("no CUDA device: skipped\n");
      return TEST_SKIP;
    }
    int rc = nwcd_gpu_ring_create(0, MIB * (2 + test_below(6)), MIB, &gpu);
    CHECK(rc == 0, "GPU ring: %s: %s", nwc_strerror(rc), nwc_error_detail());
    if (rc < 0) return 1;
#else
    printf("built without CUDA: skipped\n");
    return TEST_SKIP;
#endif
  }
  srand((unsigned)test_rand());
  make_store();
  if (test_failures) return test_exit(name);
  if (ramfs) {
    load_copy_at(rf, true);
    umount(rf);
    rmdir(rf);
  } else if (on_gpu) {
#ifdef NWCD_WITH_CUDA
    test_gpu();
    test_damage();
    nwcd_gpu_ring_free(gpu);
#endif
  } else {
    test_modes();
    test_decode();
    test_threads();
    test_ring();
    test_ring_queued();
    test_crew();
    test_damage();
    test_fd_refused();
    if (access("/dev/shm", W_OK) == 0) load_copy_at("/dev/shm", false);
  }
  nwc_tensor_info_free(ti, nti);
  nwc_store_close(store);
  for (int i = 0; i < 3; i++) free(weights[i]);
  rm_rf(dir);
  return test_exit(name);
}
