/*
 * bench_gpu_load.c - a warm load into GPU memory taken apart, in the bench process, on the blobs
 * of a store (`nwc-bench gpu-daemon` runs it on its nwcd's store once that nwcd has stopped;
 * issue 8).  The containers are read once before (page cache warm); each item prints one JSON
 * line with the median seconds of R passes over every blob, and a table line on stderr:
 *   stage   one stage of a load alone, N threads each taking the next blob, 8 pinned slots of
 *           4 MiB per thread (made before the timing):
 *             h2d             the slots copied to device memory (cudaMemcpyAsync), no read
 *             read            pread of 1 MiB pieces into the slots
 *             read_check      + each piece checked as it lands with nwc_store_chunk_check (the
 *                             loader's own call: its XXH3 and its comparison)
 *             read_check_h2d  + each slot copied to the device on the thread's stream
 *             map_check       zero copy: each blob's page-cache pages mapped (MAP_POPULATE) and
 *                             checked in place
 *             register_h2d    zero copy: that mapping pinned with cudaHostRegister and copied
 *                             to the device from the page cache itself
 *           and cudamalloc: one device allocation of each blob's size, as a load makes;
 *   loader  nwcd's loader itself, as nwcd's load lanes run it: L threads (lanes), each with its
 *           own GPU ring of B MiB in slots of S MiB (nwcd_gpu_ring_create, made before the
 *           timing), each taking the next blob and streaming it with nwcd_load_to_device (C
 *           checking threads per load; 0: the loader's default).  "none": a plain ring whose
 *           sink gives each slot straight back (no copy to the device); "alloc": each blob's
 *           device memory made with cudaMalloc in its lane first, as nwcd does; "fresh": each
 *           blob's device memory made before the pass (untimed: new memory, but no lane
 *           allocates beside the others, as when a model load makes its copies first); "touch":
 *           fresh, and each allocation written once by cudaMemset before the pass; "pool": each
 *           blob's memory taken in its lane from the device's memory pool (cudaMallocFromPoolAsync
 *           on a stream of the lane's, waited for), the pool trimmed to nothing after each pass
 *           (new memory each time, as after evicting everything); "reuse": the same, not trimmed
 *           (the memory of the last pass taken again).  "pN": hot loads copy and check N MiB
 *           at a time (nwcd_load_opts.piece), whatever the slot size.  The lanes' time
 *           is split as nwcd_load_info reports it: waiting for reads, checking, in the sink,
 *           draining the copies, and the rest (submitting, opening, mapping), per lane.  "hot":
 *           hot loads (nwcd_load_opts.hot: cached reads one at a time, copied by the lane and
 *           checked at once); without it io_uring's workers copy, many reads at a time.
 * A loader configuration is written
 * "L:B:S:C[:none][:alloc][:fresh][:touch][:pool][:reuse][:hot][:pN]"
 * (`--loader SPEC`, repeated); the default set starts with nwcd's own (16 lanes, rings of 16 MiB
 * in 2 MiB slots, C 1, hot).
 */
#include "bench.h"

#include "nwc_store.h"
#include "loader_cuda.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#define ROUNDS_MAX 64
#define BLOBS_MAX 4096


/* ---- stages --------------------------------------------------------------------------------- */

enum { ST_H2D, ST_READ, ST_CHECK, ST_ALL, ST_MAP_CHECK, ST_REGISTER_H2D };
static const char *stage_names[] = {"h2d", "read", "read_check", "read_check_h2d", "map_check",
                                    "register_h2d"};
#define ST_SLOTS 8
#define ST_SLOT (4u << 20)
#define ST_PIECE NWC_STORE_CHUNK
#define ST_THREADS 12

/* A stage thread's pinned slots, stream and per-slot events, made before any timing. */
typedef struct stage_res {
  uint8_t *buf;
  cudaStream_t st;
  cudaEvent_t ev[ST_SLOTS];
} stage_res;

typedef struct blobs {
  const nwc_tensor_info *ti;
  const uint64_t *off; /* each blob's place in dev */
  size_t n;
  uint64_t bytes;
  uint8_t *dev;
} blobs;

typedef struct stage_ctx {
  const blobs *b;
  int what;
  stage_res res[ST_THREADS];
  atomic_size_t next;
  atomic_uint started;
  atomic_int rc;
} stage_ctx;

/* Blob i of a zero-copy stage (map_check, register_h2d), straight from its page-cache pages. */
static int stage_mapped(stage_ctx *s, size_t i, cudaStream_t st) {
  const nwc_tensor_info *t = &s->b->ti[i];
  int fd = open(t->path, O_RDONLY);
  if (fd < 0) return -errno;
  uint8_t *p = mmap(NULL, t->length, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, (off_t)t->offset);
  close(fd);
  if (p == MAP_FAILED) return -errno;
  int rc = 0;
  if (s->what == ST_MAP_CHECK) {
    for (uint64_t c = 0; rc == 0 && c < t->nchunks; c++)
      rc = nwc_store_chunk_check(t, c, p + c * t->chunk_size);
  } else if (cudaHostRegister(p, t->length, cudaHostRegisterReadOnly) != cudaSuccess) {
    cudaGetLastError();
    rc = -EIO;
  } else {
    if (cudaMemcpyAsync(s->b->dev + s->b->off[i], p, t->length, cudaMemcpyHostToDevice, st) ||
        cudaStreamSynchronize(st))
      rc = -EIO;
    cudaHostUnregister(p);
  }
  munmap(p, t->length);
  return rc;
}

/* One thread of a stage: takes the next blob until none is left (see the file's comment). */
static void *stage_thread(void *p) {
  stage_ctx *s = p;
  stage_res *m = &s->res[atomic_fetch_add(&s->started, 1)];
  bool pending[ST_SLOTS] = {false};
  unsigned k = 0;
  int rc = 0;
  for (size_t i; rc == 0 && (i = atomic_fetch_add(&s->next, 1)) < s->b->n;) {
    const nwc_tensor_info *t = &s->b->ti[i];
    if (s->what >= ST_MAP_CHECK) {
      rc = stage_mapped(s, i, m->st);
      continue;
    }
    int fd = s->what == ST_H2D ? -1 : open(t->path, O_RDONLY);
    if (s->what != ST_H2D && fd < 0) rc = -errno;
    for (uint64_t off = 0; rc == 0 && off < t->length; off += ST_SLOT, k = (k + 1) % ST_SLOTS) {
      uint8_t *b = m->buf + (size_t)k * ST_SLOT;
      uint64_t n = t->length - off < ST_SLOT ? t->length - off : ST_SLOT;
      if (pending[k] && cudaEventSynchronize(m->ev[k]) != cudaSuccess) rc = -EIO;
      pending[k] = false;
      for (uint64_t q = 0; rc == 0 && s->what != ST_H2D && q < n; q += ST_PIECE) {
        size_t want = n - q < ST_PIECE ? n - q : ST_PIECE;
        if (pread(fd, b + q, want, (off_t)(t->offset + off + q)) != (ssize_t)want) rc = -EIO;
        if (rc == 0 && s->what >= ST_CHECK)
          rc = nwc_store_chunk_check(t, (off + q) / t->chunk_size, b + q);
      }
      if (rc == 0 && (s->what == ST_H2D || s->what == ST_ALL)) {
        if (cudaMemcpyAsync(s->b->dev + s->b->off[i] + off, b, n, cudaMemcpyHostToDevice,
                            m->st) ||
            cudaEventRecord(m->ev[k], m->st))
          rc = -EIO;
        pending[k] = rc == 0;
      }
    }
    if (fd >= 0) close(fd);
  }
  if (cudaStreamSynchronize(m->st) != cudaSuccess) rc = -EIO;
  if (rc) atomic_store(&s->rc, rc);
  return NULL;
}

/* Seconds for one pass of stage what over the blobs with nthreads threads (< 0: failed). */
static double stage_pass(stage_ctx *s, int what, unsigned nthreads) {
  pthread_t th[ST_THREADS];
  s->what = what;
  atomic_store(&s->next, 0);
  atomic_store(&s->started, 0);
  atomic_store(&s->rc, 0);
  double t0 = nwc_bench_now();
  unsigned started = 0;
  for (; started < nthreads && started < ST_THREADS; started++)
    if (pthread_create(&th[started], NULL, stage_thread, s)) break;
  for (unsigned i = 0; i < started; i++) pthread_join(th[i], NULL);
  double t = nwc_bench_now() - t0;
  return atomic_load(&s->rc) || started < nthreads ? -1 : t;
}

static int stages(const blobs *b, unsigned R) {
  static stage_ctx s;
  s = (stage_ctx){.b = b};
  int rc = 0;
  for (int t = 0; rc == 0 && t < ST_THREADS; t++) {
    stage_res *m = &s.res[t];
    if (cudaHostAlloc((void **)&m->buf, (size_t)ST_SLOTS * ST_SLOT, cudaHostAllocDefault) ||
        cudaStreamCreateWithFlags(&m->st, cudaStreamNonBlocking))
      rc = -ENOMEM;
    for (int k = 0; rc == 0 && k < ST_SLOTS; k++)
      if (cudaEventCreateWithFlags(&m->ev[k], cudaEventDisableTiming)) rc = -ENOMEM;
  }
  if (rc == 0 && stage_pass(&s, ST_READ, 8) < 0) rc = -EIO; /* the page cache warm */
  static const unsigned threads[] = {1, 4, 8, 12};
  for (int what = ST_H2D; rc == 0 && what <= ST_REGISTER_H2D; what++)
    for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
      double tv[ROUNDS_MAX];
      for (unsigned r = 0; r < R; r++) tv[r] = stage_pass(&s, what, threads[ti]);
      double med = nwc_bench_median(tv, R);
      printf("{\"bench\":\"stage\",\"item\":\"%s\",\"threads\":%u,\"seconds\":%.6f,\"bytes\":%llu,"
             "\"gbps\":%.3f}\n", stage_names[what], threads[ti], med,
             (unsigned long long)b->bytes, med > 0 ? b->bytes / med / 1e9 : -1);
      fprintf(stderr, "stage    %-14s %2u threads %8.2f GB/s\n", stage_names[what], threads[ti],
              med > 0 ? b->bytes / med / 1e9 : -1);
    }
  double t0 = nwc_bench_now();
  void *p[BLOBS_MAX];
  size_t k = 0;
  for (; rc == 0 && k < b->n && cudaMalloc(&p[k], b->ti[k].length) == cudaSuccess; k++) {
  }
  double ta = nwc_bench_now() - t0;
  for (size_t i = 0; i < k; i++) cudaFree(p[i]);
  if (rc == 0) {
    printf("{\"bench\":\"stage\",\"item\":\"cudamalloc\",\"allocations\":%zu,\"seconds\":%.6f}\n",
           k, ta);
    fprintf(stderr, "stage    cudamalloc     %zu blobs %.3f ms\n", k, ta * 1e3);
  }
  for (int t = 0; t < ST_THREADS; t++) {
    for (int j = 0; j < ST_SLOTS; j++)
      if (s.res[t].ev[j]) cudaEventDestroy(s.res[t].ev[j]);
    if (s.res[t].st) cudaStreamDestroy(s.res[t].st);
    if (s.res[t].buf) cudaFreeHost(s.res[t].buf);
  }
  return rc;
}

/* ---- the loader ----------------------------------------------------------------------------- */

#define LANES_MAX 32

typedef struct lcfg {
  unsigned lanes, ring_mib, slot_mib, checkers, piece_mib;
  bool none, alloc, fresh, touch, hot, pool, reuse;
} lcfg;

/* Parses "L:B:S:C[:none][:alloc][:fresh][:touch][:pool][:reuse][:hot][:pN]": 0, or -EINVAL. */
static int lcfg_parse(const char *spec, lcfg *c) {
  *c = (lcfg){0};
  int used = 0;
  if (sscanf(spec, "%u:%u:%u:%u%n", &c->lanes, &c->ring_mib, &c->slot_mib, &c->checkers,
             &used) != 4)
    return -EINVAL;
  for (const char *p = spec + used; *p;) {
    if (!strncmp(p, ":none", 5)) c->none = true, p += 5;
    else if (!strncmp(p, ":alloc", 6)) c->alloc = true, p += 6;
    else if (!strncmp(p, ":fresh", 6)) c->fresh = true, p += 6;
    else if (!strncmp(p, ":touch", 6)) c->fresh = c->touch = true, p += 6;
    else if (!strncmp(p, ":hot", 4)) c->hot = true, p += 4;
    else if (!strncmp(p, ":pool", 5)) c->pool = true, p += 5;
    else if (!strncmp(p, ":reuse", 6)) c->pool = c->reuse = true, p += 6;
    else if (!strncmp(p, ":p", 2) && p[2] >= '1' && p[2] <= '9')
      c->piece_mib = (unsigned)strtoul(p + 2, (char **)&p, 10);
    else return -EINVAL;
  }
  unsigned mem = c->alloc + c->fresh + c->pool;
  bool ok = c->lanes >= 1 && c->lanes <= LANES_MAX && c->slot_mib >= 1 &&
            c->ring_mib >= c->slot_mib && c->ring_mib <= 1024 && c->checkers <= 4 &&
            !(c->none && mem) && mem <= 1 && (!c->piece_mib || c->hot);
  return ok ? 0 : -EINVAL;
}

int nwc_bench_gpu_load_spec(const char *spec) {
  lcfg c;
  return lcfg_parse(spec, &c);
}

typedef struct lane_ctx {
  const blobs *b;
  const lcfg *c;
  unsigned passes;
  pthread_barrier_t go, done; /* each pass starts and ends on them (the lanes and the timer) */
  void *ring[LANES_MAX];      /* nwcd_gpu_ring, or nwcd_ring with none */
  void *mem[BLOBS_MAX];       /* alloc, fresh, pool: each blob's own device memory */
  cudaMemPool_t pool;         /* pool: the device's default pool, memory kept until trimmed */
  atomic_size_t next;
  atomic_uint started;
  atomic_int rc;
  char err[256];
  _Atomic uint64_t load_us, wait_ns, check_ns, sink_ns, drain_ns;
} lane_ctx;

static int release_at_once(void *ctx, nwcd_ring *r, const nwcd_slot *s) {
  (void)ctx;
  nwcd_ring_release(r, s->index);
  return 0;
}

static int nothing_held(void *ctx, nwcd_ring *r, bool wait) {
  (void)ctx, (void)r, (void)wait;
  return 0;
}

/* One lane's share of a pass: the next blob until none is left or a lane failed. */
static void lane_run(lane_ctx *L, void *ring) {
  nwcd_load_opts o = {.checkers = L->c->checkers, .hot = L->c->hot,
                      .piece = (uint64_t)L->c->piece_mib << 20};
  nwcd_sink none = {release_at_once, nothing_held, NULL};
  cudaStream_t st = NULL;
  if (L->c->pool && cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) st = NULL;
  for (size_t i; !atomic_load(&L->rc) && (i = atomic_fetch_add(&L->next, 1)) < L->b->n;) {
    const nwc_tensor_info *t = &L->b->ti[i];
    nwcd_load_info li;
    void *dst = L->b->dev + L->b->off[i];
    bool nomem = L->c->alloc && cudaMalloc(&L->mem[i], t->length) != cudaSuccess;
    if (L->c->pool) /* stream-ordered from the pool, waited for: usable on any stream */
      nomem = !st || cudaMallocFromPoolAsync(&L->mem[i], t->length, L->pool, st) != cudaSuccess ||
              cudaStreamSynchronize(st) != cudaSuccess;
    if (L->c->alloc || L->c->fresh || L->c->pool) dst = L->mem[i];
    int rc = nomem                ? -ENOMEM
             : L->c->none ? nwcd_ring_load(ring, t, &o, &none, &li)
                          : nwcd_load_to_device(ring, t, dst, &o, &li);
    if (rc < 0) {
      int was = 0;
      if (atomic_compare_exchange_strong(&L->rc, &was, rc))
        snprintf(L->err, sizeof L->err, "%s", nomem ? "cudaMalloc failed" : nwc_error_detail());
      break;
    }
    atomic_fetch_add(&L->load_us, li.micros);
    atomic_fetch_add(&L->wait_ns, li.wait_ns), atomic_fetch_add(&L->check_ns, li.check_ns);
    atomic_fetch_add(&L->sink_ns, li.sink_ns), atomic_fetch_add(&L->drain_ns, li.drain_ns);
  }
  if (st) cudaStreamDestroy(st);
}

/* A lane: one thread for every pass (its io_uring workers stay, as a pool worker's do). */
static void *lane_thread(void *p) {
  lane_ctx *L = p;
  void *ring = L->ring[atomic_fetch_add(&L->started, 1)];
  for (unsigned r = 0; r < L->passes; r++) {
    pthread_barrier_wait(&L->go);
    lane_run(L, ring);
    pthread_barrier_wait(&L->done);
  }
  return NULL;
}

/* The lanes' split of their time in one pass (ms per lane) and the process's CPU seconds. */
typedef struct split {
  double load, wait, check, sink, drain, cpu;
} split;

static double process_cpu(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u); /* io_uring's workers are threads of the process */
  return (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec +
         (double)u.ru_stime.tv_sec + 1e-6 * (double)u.ru_stime.tv_usec;
}

static int loader(const blobs *b, const lcfg *c, const char *spec, unsigned R) {
  static lane_ctx L;
  L = (lane_ctx){.b = b, .c = c};
  uint64_t ring = (uint64_t)c->ring_mib << 20, slot = (uint64_t)c->slot_mib << 20;
  int rc = 0;
  if (c->pool) {
    uint64_t keep = UINT64_MAX; /* freed memory stays in the pool until trimmed */
    if (cudaDeviceGetDefaultMemPool(&L.pool, 0) != cudaSuccess ||
        cudaMemPoolSetAttribute(L.pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess)
      rc = -EIO, snprintf(L.err, sizeof L.err, "no memory pool");
  }
  for (unsigned k = 0; rc == 0 && k < c->lanes; k++)
    rc = c->none ? nwcd_ring_create(ring, slot, (nwcd_ring **)&L.ring[k])
                 : nwcd_gpu_ring_create(0, ring, slot, (nwcd_gpu_ring **)&L.ring[k]);
  if (rc < 0) snprintf(L.err, sizeof L.err, "%s", nwc_error_detail());
  double tv[ROUNDS_MAX], sorted[ROUNDS_MAX];
  split sp[ROUNDS_MAX];
  pthread_t th[LANES_MAX];
  L.passes = rc == 0 ? R : 0;
  pthread_barrier_init(&L.go, NULL, c->lanes + 1), pthread_barrier_init(&L.done, NULL, c->lanes + 1);
  for (unsigned k = 0; L.passes && k < c->lanes; k++)
    if (pthread_create(&th[k], NULL, lane_thread, &L)) {
      fprintf(stderr, "loader %s: no thread for lane %u\n", spec, k);
      exit(1);
    }
  for (unsigned r = 0; r < L.passes; r++) {
    for (size_t i = 0; c->fresh && i < b->n && atomic_load(&L.rc) == 0; i++)
      if (cudaMalloc(&L.mem[i], b->ti[i].length) != cudaSuccess ||
          (c->touch && cudaMemset(L.mem[i], 0, b->ti[i].length) != cudaSuccess))
        atomic_store(&L.rc, -ENOMEM), snprintf(L.err, sizeof L.err, "fresh memory: %s",
                                               cudaGetErrorString(cudaGetLastError()));
    if (c->touch) cudaDeviceSynchronize();
    atomic_store(&L.next, 0);
    atomic_store(&L.load_us, 0), atomic_store(&L.wait_ns, 0), atomic_store(&L.check_ns, 0);
    atomic_store(&L.sink_ns, 0), atomic_store(&L.drain_ns, 0);
    double cpu = process_cpu(), t0 = nwc_bench_now(); /* the lanes wait at go already */
    pthread_barrier_wait(&L.go);
    pthread_barrier_wait(&L.done);
    tv[r] = nwc_bench_now() - t0;
    double per = 1e-6 / c->lanes; /* ns summed over the lanes -> ms per lane */
    sp[r] = (split){.load = (double)L.load_us * 1e-3 / c->lanes, .wait = L.wait_ns * per,
                    .check = L.check_ns * per, .sink = L.sink_ns * per,
                    .drain = L.drain_ns * per, .cpu = process_cpu() - cpu};
    for (size_t i = 0; i < b->n; i++) {
      if (L.mem[i]) cudaFree(L.mem[i]);
      L.mem[i] = NULL;
    }
    if (c->pool && !c->reuse) cudaDeviceSynchronize(), cudaMemPoolTrimTo(L.pool, 0);
  }
  if (c->pool) cudaDeviceSynchronize(), cudaMemPoolTrimTo(L.pool, 0);
  for (unsigned k = 0; L.passes && k < c->lanes; k++) pthread_join(th[k], NULL);
  pthread_barrier_destroy(&L.go), pthread_barrier_destroy(&L.done);
  if (rc == 0) rc = atomic_load(&L.rc);
  for (unsigned k = 0; k < c->lanes; k++)
    if (c->none) nwcd_ring_free(L.ring[k]);
    else nwcd_gpu_ring_free(L.ring[k]);
  if (rc < 0) {
    fprintf(stderr, "loader %s: %s\n", spec, L.err);
    return rc;
  }
  memcpy(sorted, tv, R * sizeof *tv);
  double med = nwc_bench_median(sorted, R);
  unsigned m = 0;
  while (tv[m] != med) m++;
  const split *s = &sp[m];
  double other = s->load - s->wait - s->check - s->sink - s->drain;
  printf("{\"bench\":\"loader\",\"spec\":\"%s\",\"lanes\":%u,\"ring_mib\":%u,\"slot_mib\":%u,"
         "\"checkers\":%u,\"hot\":%s,\"piece_mib\":%u,\"sink\":\"%s\",\"alloc\":%s,"
         "\"fresh\":%s,\"touch\":%s,\"pool\":\"%s\","
         "\"seconds\":%.6f,\"bytes\":%llu,\"gbps\":%.3f,\"cpu_cores\":%.2f,"
         "\"lane_ms\":{\"load\":%.3f,\"wait\":%.3f,\"check\":%.3f,\"sink\":%.3f,\"drain\":%.3f,\"other\":%.3f}}\n", spec, c->lanes,
         c->ring_mib, c->slot_mib, c->checkers, c->hot ? "true" : "false", c->piece_mib,
         c->none ? "none" : "gpu", c->alloc ? "true" : "false", c->fresh ? "true" : "false",
         c->touch ? "true" : "false", c->reuse ? "reuse" : c->pool ? "trimmed" : "no",
         med, (unsigned long long)b->bytes, b->bytes / med / 1e9,
         s->cpu / med, s->load, s->wait, s->check, s->sink, s->drain, other);
  fprintf(stderr, "loader   %-20s %6.2f GB/s %5.1f cores; per lane ms: pass %.2f, in loads %.2f "
          "= wait %.2f + check %.2f + sink %.2f + drain %.2f + other %.2f\n", spec,
          b->bytes / med / 1e9, s->cpu / med, med * 1e3, s->load, s->wait, s->check, s->sink,
          s->drain, other);
  return 0;
}

/* ---- the whole item ------------------------------------------------------------------------ */

static const char *default_specs[] = {
    "16:16:2:1:hot", "16:16:2:1:hot:none", "16:16:2:1:hot:alloc", "16:16:1:1:hot", "16:16:4:1:hot",
    "12:16:2:1:hot", "16:16:4:1", "16:16:4:1:none", "8:32:4:0", "1:256:4:0"};

int nwc_bench_gpu_load(const char *store_dir, const char *model, unsigned R,
                       const char *const *specs, size_t nspecs) {
  if (!nspecs) specs = default_specs, nspecs = sizeof default_specs / sizeof *default_specs;
  if (R > ROUNDS_MAX) R = ROUNDS_MAX;
  nwc_store *s = NULL;
  nwc_tensor_info *ti = NULL;
  size_t n = 0;
  int rc = nwc_store_open(store_dir, NWC_STORE_RDONLY, &s);
  if (rc == 0) rc = nwc_store_tensors(s, model, &ti, &n);
  if (rc < 0) {
    fprintf(stderr, "gpu load: %s: %s\n", store_dir, nwc_error_detail());
    nwc_store_close(s);
    return rc;
  }
  uint64_t *off = calloc(n + 1, sizeof *off), bytes = 0;
  for (size_t i = 0; off && i < n; i++) off[i] = bytes, bytes += ti[i].length;
  blobs b = {.ti = ti, .off = off, .n = n, .bytes = bytes};
  if (!off || n > BLOBS_MAX || cudaMalloc((void **)&b.dev, bytes) != cudaSuccess) rc = -ENOMEM;
  if (rc == 0) rc = stages(&b, R);
  for (size_t k = 0; rc == 0 && k < nspecs; k++) {
    lcfg c;
    rc = lcfg_parse(specs[k], &c);
    if (rc == 0) rc = loader(&b, &c, specs[k], R);
  }
  if (rc < 0) fprintf(stderr, "gpu load: failed (%s)\n", strerror(-rc));
  cudaFree(b.dev);
  free(off);
  nwc_tensor_info_free(ti, n);
  nwc_store_close(s);
  return rc;
}
