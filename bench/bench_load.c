/*
 * bench_load.c - `nwc-bench load STORE_DIR|FILE.safetensors [--copies N] [--repeat R]
 * [--depth D] [--read-size BYTES] [--mode auto|direct|buffered] [--device N] [--nwcd PATH]`:
 * nwcd's loader (daemon/loader.c, in-process, with those options) and a whole load through a
 * real nwcd (end to end) against plain reads of the same container files, in one run, cold and
 * warm.
 *
 * A safetensors file is imported --copies times (default 24) into a temporary store, so that the
 * containers hold a few hundred MB; a store directory is used as it is (the nwcd items open it
 * as nwcd does: for writing, so nothing else may hold it).  Then, R
 * rounds (default 5) of, for each page-cache state:
 *   warm  (every container read once before):   cat, read, pread_dst, pread_fresh, loader, nwcd,
 *                                                  nwcd_fresh
 *   none  (no file read):                          populate_memfd, populate_anon, write_memfd
 *   cold  (POSIX_FADV_DONTNEED before each item): cat, read, pread_dst, pread_fresh, odirect,
 *                                                  loader, nwcd, nwcd_fresh
 * where
 *   cat       `cat FILE... > /dev/null`, literally (one process for all the files)
 *   read      read(2) of each whole file into one 128 KiB buffer (what cat does)
 *   pread_dst pread(2) of each blob into its resident buffer (the loader's bytes and memory)
 *   pread_fresh  pread(2) of each blob into fresh anonymous memory of its size, mapped just
 *             before (the plain read of a process that has to hold the bytes: it faults in
 *             every page, as any load into new memory does)
 *   odirect   the raw O_DIRECT read: pread(2) of 4 MiB with O_DIRECT, one at a time (dd)
 *   loader    nwcd_load of every tensor into its resident buffer (checksums checked)
 *   nwcd      end to end: a real nwcd (--nwcd PATH, default the one built with the bench) on the
 *             same store, each model loaded into host memory by one nwc_client_load_on request
 *             (every model evicted before, untimed, which returns their memory): the loads
 *             make every page of their memfds (pwrite), then map and lock them; the read, the
 *             checks (spares, the pages of copies that LRU evictions push out, are reused only
 *             by the loads that evict them, under a budget: not measured here)
 *   nwcd_fresh  the same first thing after nwcd started (restarted before, untimed): the loads
 *             make every page as in nwcd
 *   populate_memfd  fresh resident memory the way loads made it before: memfd_create,
 *             ftruncate, mmap shared, mlock (page faults, zeroing), with no read
 *   populate_anon   the same with anonymous memory (mmap + mlock)
 *   write_memfd  fresh resident memory the way nwcd's loads make it now, with no read and no
 *             check: memfd_create, ftruncate, pwrite of the blob's bytes 8 MiB at a time, then a
 *             read-only mapping, populated and locked; what bounds nwcd's load from above (its
 *             pages are 4 KiB or 2 MiB as the kernel's shmem_enabled says: nwcd logs which)
 *   gpu       (--device N, CUDA builds) nwcd_load_to_device of every tensor into device memory
 *             through a 256 MiB ring of registered, pinned slots (cold and warm)
 * One JSON line per item with the median seconds and GB/s (of the bytes each reads: whole files
 * for cat and read, blobs for the others) and the median CPU seconds (every thread of the bench,
 * io_uring's workers included, and cat's), then a summary line with the ratios the issue asks
 * for: loader / cat (target >= 0.9), loader / read, loader / pread_dst, cold loader / odirect,
 * and one for the end-to-end load: nwcd / cat, nwcd / pread_fresh, nwcd / loader, nwcd_fresh /
 * cat, cold and warm, with the population rates.
 * Resident buffers are mapped with MAP_POPULATE and mlock'ed, as nwcd's host copies are.
 */
#include "bench.h"
#include "nwc_client.h"
#include "nwc_store.h"
#include "loader_cuda.h"

#ifdef NWCD_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <spawn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define ROUNDS_MAX 64

typedef struct bench bench;
typedef struct item {
  const char *name;
  bool cold;       /* the containers' pages are dropped before each run */
  bool file_bytes; /* reads whole files (else: the blobs) */
  int (*run)(bench *b);
  int (*prep)(bench *b); /* untimed, before the page cache is dropped, or NULL */
  bool nofile;     /* reads no file (the cache state does not apply) */
} item;

struct bench {
  nwc_tensor_info *ti; /* every tensor of every model */
  size_t nti;
  char **files;        /* the container files */
  size_t nfiles;
  uint64_t file_bytes, blob_bytes;
  uint8_t *dst;        /* resident buffers, one after the other */
  uint64_t *dst_off;
  nwcd_load_opts opts;
  uint64_t direct_bytes, direct_nwcd; /* nwcd: tensors it read with O_DIRECT */
  void **fresh; /* per tensor: the fresh memory of pread_fresh / populate_*, or NULL */
  int *fresh_fd;  /* its memfd (populate_memfd), or -1 */
  char **models;  /* every model's name */
  size_t nmodels;
  nwc_client *c;  /* connected to the nwcd the bench started */
  const char *nwcd_bin, *nwcd_store, *nwcd_sock;
  pid_t nwcd_pid;
#ifdef NWCD_WITH_CUDA
  nwcd_gpu_ring *gpu;
  uint8_t *dev; /* device buffers, at dst_off */
#endif
};

static int fail(const char *what, int rc) {
  fprintf(stderr, "nwc-bench load: %s: %s: %s\n", what, nwc_strerror(rc), nwc_error_detail());
  return rc;
}

/* Every tensor of every model, the container files, and the resident buffers. */
static int collect(nwc_store *s, bench *b) {
  nwc_model_info *m = NULL;
  size_t nm = 0;
  int rc = nwc_store_models(s, &m, &nm);
  if (rc < 0) return fail("models", rc);
  for (size_t i = 0; i < nm && rc == 0; i++) {
    nwc_tensor_info *t = NULL;
    size_t n = 0;
    rc = nwc_store_tensors(s, m[i].name, &t, &n);
    if (rc < 0) break;
    nwc_tensor_info *all = realloc(b->ti, (b->nti + n) * sizeof *all);
    if (!all) {
      rc = -ENOMEM;
      nwc_tensor_info_free(t, n);
      break;
    }
    b->ti = all;
    char **names = realloc(b->models, (b->nmodels + 1) * sizeof *names);
    if (names) b->models = names;
    if (!names || !(b->models[b->nmodels] = strdup(m[i].name))) {
      rc = -ENOMEM;
      nwc_tensor_info_free(t, n);
      break;
    }
    b->nmodels++;
    memcpy(b->ti + b->nti, t, n * sizeof *t); /* the strings move with the structs */
    b->nti += n;
    free(t);
  }
  nwc_model_info_free(m, nm);
  if (rc < 0) return fail("tensors", rc);
  b->files = calloc(b->nti + 1, sizeof *b->files);
  b->dst_off = calloc(b->nti + 1, sizeof *b->dst_off);
  b->fresh = calloc(b->nti + 1, sizeof *b->fresh);
  b->fresh_fd = malloc((b->nti + 1) * sizeof *b->fresh_fd);
  if (!b->files || !b->dst_off || !b->fresh || !b->fresh_fd) return -ENOMEM;
  for (size_t i = 0; i < b->nti; i++) b->fresh_fd[i] = -1;
  for (size_t i = 0; i < b->nti; i++) { /* each buffer on whole pages, as nwcd's copies */
    b->dst_off[i] = b->blob_bytes;
    b->blob_bytes += (b->ti[i].length + 4095) / 4096 * 4096;
    size_t k = 0;
    while (k < b->nfiles && strcmp(b->files[k], b->ti[i].path)) k++;
    if (k == b->nfiles) {
      struct stat st;
      if (stat(b->ti[i].path, &st) < 0) return fail(b->ti[i].path, -errno);
      b->files[b->nfiles++] = b->ti[i].path;
      b->file_bytes += (uint64_t)st.st_size;
    }
  }
  void *p = mmap(NULL, b->blob_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) return fail("mmap of the resident buffers", -errno);
  b->dst = p;
  if (mlock(p, b->blob_bytes) < 0)
    fprintf(stderr, "nwc-bench load: mlock: %s (buffers are populated, not locked)\n",
            strerror(errno));
  return 0;
}

static void drop_caches(const bench *b) {
  for (size_t i = 0; i < b->nfiles; i++) {
    int fd = open(b->files[i], O_RDONLY);
    if (fd < 0) continue;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

/* posix_spawn (vfork-like): a fork would mark every resident page copy-on-write, and the next
 * write into them would fault page by page. */
static int run_cat(bench *b) {
  const char **argv = calloc(b->nfiles + 2, sizeof *argv);
  if (!argv) return -ENOMEM;
  argv[0] = "cat";
  for (size_t i = 0; i < b->nfiles; i++) argv[i + 1] = b->files[i];
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  int rc = posix_spawnp(&pid, "cat", &fa, NULL, (char *const *)argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  free(argv);
  int st;
  if (rc || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st))
    return fail("cat", -EIO);
  return 0;
}

static int run_read(bench *b) {
  static uint8_t buf[128 << 10];
  for (size_t i = 0; i < b->nfiles; i++) {
    int fd = open(b->files[i], O_RDONLY);
    if (fd < 0) return fail(b->files[i], -errno);
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) {}
    close(fd);
    if (n < 0) return fail(b->files[i], -errno);
  }
  return 0;
}

/* The fresh memory of the last pread_fresh / populate_* item, unmapped (untimed). */
static void release_fresh(bench *b) {
  for (size_t i = 0; i < b->nti; i++) {
    if (b->fresh[i]) munmap(b->fresh[i], b->ti[i].length);
    if (b->fresh_fd[i] >= 0) close(b->fresh_fd[i]);
    b->fresh[i] = NULL, b->fresh_fd[i] = -1;
  }
}

/* Fresh memory of n bytes into *p: anonymous, or a shared memfd (*fd) as nwcd's host_alloc maps
 * it; mlock'ed (populated) when lock is set, else left to fault in on first write. */
static int fresh_alloc(size_t n, bool memfd, bool lock, void **p, int *fd) {
  void *m = MAP_FAILED;
  if (!memfd) {
    m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  } else if ((*fd = memfd_create("nwc-bench", MFD_CLOEXEC | MFD_ALLOW_SEALING)) >= 0 &&
             ftruncate(*fd, (off_t)n) == 0) {
    m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  }
  if (m == MAP_FAILED) return fail("fresh memory", -errno);
  *p = m;
  if (lock && mlock(m, n) < 0) return fail("mlock of fresh memory", -errno);
  return 0;
}

/* pread of every blob into its resident buffer, or (fresh) into fresh memory of its size;
 * O_DIRECT in reads of 4 MiB (dd iflag=direct bs=4M), packed blobs (not on whole pages) buffered
 * as the loader reads them. */
static int run_pread(bench *b, bool direct, bool fresh) {
  for (size_t i = 0; i < b->nti; i++) {
    const nwc_tensor_info *t = &b->ti[i];
    uint8_t *dst = b->dst + b->dst_off[i];
    if (fresh) {
      int rc = fresh_alloc(t->length, false, false, &b->fresh[i], &b->fresh_fd[i]);
      if (rc < 0) return rc;
      dst = b->fresh[i];
    }
    bool dio = direct && (t->offset | t->length) % 4096 == 0;
    int fd = open(t->path, O_RDONLY | (dio ? O_DIRECT : 0));
    if (fd < 0) return fail(t->path, -errno);
    uint64_t step = dio ? 4u << 20 : t->length;
    for (uint64_t o = 0; o < t->length;) {
      uint64_t n = t->length - o < step ? t->length - o : step;
      ssize_t k = pread(fd, dst + o, n, (off_t)(t->offset + o));
      if (k <= 0) {
        close(fd);
        return fail(t->path, k < 0 ? -errno : -EIO);
      }
      o += (uint64_t)k;
    }
    close(fd);
  }
  return 0;
}

static int run_loader(bench *b) {
  for (size_t i = 0; i < b->nti; i++) {
    nwcd_load_info li;
    int rc = nwcd_load(&b->ti[i], b->dst + b->dst_off[i], &b->opts, &li);
    if (rc < 0) return fail(b->ti[i].name, rc);
    b->direct_bytes += li.direct_bytes;
  }
  return 0;
}

static int run_pread_dst(bench *b) { return run_pread(b, false, false); }
static int run_pread_fresh(bench *b) { return run_pread(b, false, true); }
static int run_odirect(bench *b) { return run_pread(b, true, false); }

static int run_populate(bench *b, bool memfd) {
  for (size_t i = 0; i < b->nti; i++) {
    int rc = fresh_alloc(b->ti[i].length, memfd, true, &b->fresh[i], &b->fresh_fd[i]);
    if (rc < 0) return rc;
  }
  return 0;
}

static int run_populate_memfd(bench *b) { return run_populate(b, true); }
static int run_populate_anon(bench *b) { return run_populate(b, false); }

static int run_write_memfd(bench *b) {
  for (size_t i = 0; i < b->nti; i++) {
    size_t n = b->ti[i].length;
    const uint8_t *src = b->dst + b->dst_off[i];
    int fd = memfd_create("nwc-bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)n) < 0) return fail("write_memfd: memfd", -errno);
    b->fresh_fd[i] = fd;
    for (size_t o = 0; o < n;) {
      size_t k = n - o < (8u << 20) ? n - o : 8u << 20;
      ssize_t w = pwrite(fd, src + o, k, (off_t)o);
      if (w <= 0) return fail("write_memfd: pwrite", w < 0 ? -errno : -EIO);
      o += (size_t)w;
    }
    void *m = mmap(NULL, n, PROT_READ, MAP_SHARED | MAP_POPULATE | MAP_LOCKED, fd, 0);
    if (m == MAP_FAILED) m = mmap(NULL, n, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (m == MAP_FAILED) return fail("write_memfd: mmap", -errno);
    b->fresh[i] = m;
  }
  return 0;
}

/* Every model evicted from the bench's nwcd (untimed, before an nwcd item). */
static int nwcd_evict_all(bench *b) {
  for (size_t i = 0; i < b->nmodels; i++)
    if (nwc_client_evict(b->c, b->models[i], NULL, NULL) < 0)
      return fprintf(stderr, "nwc-bench load: evict %s: %s\n", b->models[i],
                     nwc_client_last_error()), -EIO;
  return 0;
}

/* A fresh nwcd (untimed, before nwcd_fresh): the old one stopped, a new one started. */
static int nwcd_restart(bench *b) {
  nwc_client_free(b->c);
  b->c = NULL;
  nwc_bench_nwcd_stop(b->nwcd_pid);
  b->nwcd_pid = nwc_bench_nwcd_start(b->nwcd_bin, b->nwcd_store, b->nwcd_sock, NULL, NULL);
  if (nwc_client_connect(b->nwcd_sock, &b->c) < 0)
    return fprintf(stderr, "nwc-bench load: %s did not start again: %s\n", b->nwcd_bin,
                   nwc_client_last_error()), -EIO;
  return 0;
}

static int run_nwcd(bench *b) {
  for (size_t i = 0; i < b->nmodels; i++) {
    nwc_client_result r;
    if (nwc_client_load_on(b->c, b->models[i], NULL, NWC_CLIENT_CPU, NULL, NULL, &r) < 0)
      return fprintf(stderr, "nwc-bench load: nwcd load %s: %s\n", b->models[i],
                     nwc_client_last_error()), -EIO;
    b->direct_nwcd += r.direct;
  }
  return 0;
}

#ifdef NWCD_WITH_CUDA
static int run_gpu(bench *b) {
  for (size_t i = 0; i < b->nti; i++) {
    int rc = nwcd_load_to_device(b->gpu, &b->ti[i], b->dev + b->dst_off[i], &b->opts, NULL);
    if (rc < 0) return fail(b->ti[i].name, rc);
  }
  return 0;
}

/* The GPU ring and device buffers on device (--device): 0, or an error. */
static int gpu_setup(bench *b, int device) {
  int rc = nwcd_gpu_ring_create(device, 0, 0, &b->gpu);
  if (rc < 0) return fail("GPU ring", rc);
  if (cudaMalloc((void **)&b->dev, b->blob_bytes) != cudaSuccess)
    return fail("cudaMalloc of the device buffers", -ENOMEM);
  return 0;
}

static void gpu_teardown(bench *b) {
  if (b->dev) cudaFree(b->dev);
  nwcd_gpu_ring_free(b->gpu);
}
#endif

enum { CAT, READ, PREAD_DST, PREAD_FRESH, LOADER, NWCD, NWCD_FRESH, POP_MEMFD,
       POP_ANON, WRITE_MEMFD, CAT_COLD, READ_COLD, PREAD_DST_COLD, PREAD_FRESH_COLD, ODIRECT_COLD, LOADER_COLD,
       NWCD_COLD, NWCD_FRESH_COLD, GPU, GPU_COLD, ITEMS };
static const item items[ITEMS] = {
    {"cat", false, true, run_cat, NULL, false},
    {"read", false, true, run_read, NULL, false},
    {"pread_dst", false, false, run_pread_dst, NULL, false},
    {"pread_fresh", false, false, run_pread_fresh, NULL, false},
    {"loader", false, false, run_loader, NULL, false},
    {"nwcd", false, false, run_nwcd, nwcd_evict_all, false},
    {"nwcd_fresh", false, false, run_nwcd, nwcd_restart, false},
    {"populate_memfd", false, false, run_populate_memfd, NULL, true},
    {"populate_anon", false, false, run_populate_anon, NULL, true},
    {"write_memfd", false, false, run_write_memfd, NULL, true},
    {"cat", true, true, run_cat, NULL, false},
    {"read", true, true, run_read, NULL, false},
    {"pread_dst", true, false, run_pread_dst, NULL, false},
    {"pread_fresh", true, false, run_pread_fresh, NULL, false},
    {"odirect", true, false, run_odirect, NULL, false},
    {"loader", true, false, run_loader, NULL, false},
    {"nwcd", true, false, run_nwcd, nwcd_evict_all, false},
    {"nwcd_fresh", true, false, run_nwcd, nwcd_restart, false},
#ifdef NWCD_WITH_CUDA
    {"gpu", false, false, run_gpu, NULL, false},
    {"gpu", true, false, run_gpu, NULL, false},
#endif
};

/* CPU seconds of this process (all its threads, io_uring's workers included) and of the waited-for
 * children (cat): what the machine's other load does not inflate the way it inflates wall time. */
static double cpu_seconds(void) {
  struct rusage a, c;
  getrusage(RUSAGE_SELF, &a);
  getrusage(RUSAGE_CHILDREN, &c);
  return (double)(a.ru_utime.tv_sec + a.ru_stime.tv_sec + c.ru_utime.tv_sec + c.ru_stime.tv_sec) +
         1e-6 * (double)(a.ru_utime.tv_usec + a.ru_stime.tv_usec + c.ru_utime.tv_usec +
                         c.ru_stime.tv_usec);
}

static void usage(void) {
  fputs("usage: nwc-bench load STORE_DIR|FILE.safetensors [--copies N] [--repeat R]\n"
        "                      [--depth D] [--read-size BYTES] [--mode auto|direct|buffered]\n"
        "                      [--device N] [--nwcd PATH]\n",
        stderr);
}

int nwc_bench_load(int argc, char **argv) {
  const char *src = NULL;
  unsigned copies = 24, rounds = 5;
  int device = -1;
  const char *nwcd_bin = NWCD_PATH;
  bench b = {0};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--copies") && i + 1 < argc) copies = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) rounds = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--depth") && i + 1 < argc) b.opts.depth = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--read-size") && i + 1 < argc)
      b.opts.read_size = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--nwcd") && i + 1 < argc) nwcd_bin = argv[++i];
    else if (!strcmp(argv[i], "--mode") && i + 1 < argc) {
      const char *m = argv[++i];
      if (!strcmp(m, "direct")) b.opts.mode = NWCD_LOAD_DIRECT;
      else if (!strcmp(m, "buffered")) b.opts.mode = NWCD_LOAD_BUFFERED;
      else if (strcmp(m, "auto")) return usage(), 2;
    }
    else if (!strcmp(argv[i], "--help")) return usage(), 0;
    else if (argv[i][0] != '-' && !src) src = argv[i];
    else return usage(), 2;
  }
  if (!src || !copies || !rounds || rounds > ROUNDS_MAX) return usage(), 2;
  struct stat st;
  if (stat(src, &st) < 0) return perror(src), 1;
  char tmp[512] = "";
  nwc_store *s = NULL;
  int rc;
  if (S_ISDIR(st.st_mode)) {
    rc = nwc_store_open(src, NWC_STORE_RDONLY, &s);
  } else {
    const char *base = getenv("TMPDIR");
    snprintf(tmp, sizeof tmp, "%s/nwc-bench-load-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmp)) return perror("mkdtemp"), 1;
    rc = nwc_store_open(tmp, NWC_STORE_CREATE, &s);
    for (unsigned k = 0; rc == 0 && k < copies; k++) {
      char name[32];
      snprintf(name, sizeof name, "m%u", k);
      fprintf(stderr, "\rnwc-bench load: importing copy %u of %u", k + 1, copies);
      rc = nwc_store_import(s, name, src, NULL);
    }
    fputc('\n', stderr);
  }
  if (rc == 0) rc = collect(s, &b);
  else fail(src, rc);
  nwc_store_close(s); /* nwcd opens the store for writing (an exclusive lock) */
  s = NULL;
  /* A real nwcd on the same store, for the nwcd items. */
  char sockdir[512] = "", sock[600];
  if (rc == 0) {
    const char *base = getenv("TMPDIR");
    snprintf(sockdir, sizeof sockdir, "%s/nwc-bench-nwcd-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(sockdir)) {
      rc = fail("mkdtemp", -errno);
      sockdir[0] = '\0';
    } else {
      snprintf(sock, sizeof sock, "%s/nwcd.sock", sockdir);
      b.nwcd_bin = nwcd_bin, b.nwcd_store = S_ISDIR(st.st_mode) ? src : tmp, b.nwcd_sock = sock;
      b.nwcd_pid = nwc_bench_nwcd_start(nwcd_bin, b.nwcd_store, sock, NULL, NULL);
    }
    if (rc == 0 && nwc_client_connect(sock, &b.c) < 0) {
      fprintf(stderr, "nwc-bench load: %s did not start: %s\n", nwcd_bin, nwc_client_last_error());
      rc = -EIO;
    }
  }
  int nitems = NWCD_FRESH_COLD + 1;
  if (rc == 0 && device >= 0) {
#ifdef NWCD_WITH_CUDA
    rc = gpu_setup(&b, device);
    nitems = ITEMS;
#else
    rc = fail("--device", -ENOTSUP);
#endif
  }
  double secs[ITEMS][ROUNDS_MAX], cpu[ITEMS][ROUNDS_MAX];
  for (unsigned r = 0; rc == 0 && r < rounds; r++)
    for (int it = 0; rc == 0 && it < nitems; it++) {
      if (it == CAT) rc = run_read(&b); /* the last round's cold items left the cache cold */
      release_fresh(&b);
      if (rc == 0 && items[it].prep) rc = items[it].prep(&b);
      if (items[it].cold) drop_caches(&b);
      double t0 = nwc_bench_now(), c0 = cpu_seconds();
      if (rc == 0) rc = items[it].run(&b);
      secs[it][r] = nwc_bench_now() - t0;
      cpu[it][r] = cpu_seconds() - c0;
    }
  double gbps[ITEMS] = {0};
  for (int it = 0; rc == 0 && it < nitems; it++) {
    qsort(secs[it], rounds, sizeof secs[it][0], nwc_bench_cmp_double);
    qsort(cpu[it], rounds, sizeof cpu[it][0], nwc_bench_cmp_double);
    double med = secs[it][rounds / 2];
    uint64_t bytes = items[it].file_bytes ? b.file_bytes : b.blob_bytes;
    gbps[it] = (double)bytes / med * 1e-9;
    printf("{\"bench\":\"load\",\"item\":\"%s\",\"cache\":\"%s\",\"files\":%zu,\"tensors\":%zu,"
           "\"bytes\":%llu,\"rounds\":%u,\"seconds\":%.6f,\"best_seconds\":%.6f,\"gbps\":%.3f,"
           "\"cpu_seconds\":%.6f,\"gb_per_cpu_second\":%.3f}\n",
           items[it].name, items[it].nofile ? "none" : items[it].cold ? "cold" : "warm",
           b.nfiles, b.nti,
           (unsigned long long)bytes, rounds, med, secs[it][0], gbps[it], cpu[it][rounds / 2],
           cpu[it][rounds / 2] > 0 ? (double)bytes / cpu[it][rounds / 2] * 1e-9 : 0.0);
  }
  if (rc == 0) {
    printf("{\"bench\":\"load\",\"summary\":true,\"bytes\":%llu,\"file_bytes\":%llu,"
           "\"mode\":%u,\"depth\":%u,\"read_size\":%llu,\"warm_loader_vs_cat\":%.3f,"
           "\"warm_loader_vs_read\":%.3f,\"warm_loader_vs_pread_dst\":%.3f,"
           "\"cold_loader_vs_cat\":%.3f,\"cold_loader_vs_read\":%.3f,"
           "\"cold_loader_vs_odirect\":%.3f,\"loader_direct_share\":%.3f,\"target\":0.9}\n",
           (unsigned long long)b.blob_bytes, (unsigned long long)b.file_bytes, b.opts.mode,
           b.opts.depth,
           (unsigned long long)b.opts.read_size, gbps[LOADER] / gbps[CAT],
           gbps[LOADER] / gbps[READ], gbps[LOADER] / gbps[PREAD_DST],
           gbps[LOADER_COLD] / gbps[CAT_COLD], gbps[LOADER_COLD] / gbps[READ_COLD],
           gbps[LOADER_COLD] / gbps[ODIRECT_COLD],
           (double)b.direct_bytes / (double)(2 * rounds * b.blob_bytes));
    printf("{\"bench\":\"load\",\"summary\":\"nwcd\",\"warm_nwcd_gbps\":%.3f,"
           "\"cold_nwcd_gbps\":%.3f,\"warm_nwcd_vs_cat\":%.3f,\"cold_nwcd_vs_cat\":%.3f,"
           "\"warm_nwcd_vs_pread_fresh\":%.3f,\"cold_nwcd_vs_pread_fresh\":%.3f,"
           "\"warm_nwcd_vs_loader\":%.3f,\"cold_nwcd_vs_loader\":%.3f,"
           "\"warm_nwcd_fresh_gbps\":%.3f,\"cold_nwcd_fresh_gbps\":%.3f,"
           "\"warm_nwcd_fresh_vs_cat\":%.3f,\"cold_nwcd_fresh_vs_cat\":%.3f,"
           "\"populate_memfd_gbps\":%.3f,\"populate_anon_gbps\":%.3f,"
           "\"write_memfd_gbps\":%.3f,\"warm_nwcd_vs_write_memfd\":%.3f,"
           "\"write_memfd_vs_cat\":%.3f,\"nwcd_direct_share\":%.3f,\"target\":0.9}\n",
           gbps[NWCD], gbps[NWCD_COLD], gbps[NWCD] / gbps[CAT], gbps[NWCD_COLD] / gbps[CAT_COLD],
           gbps[NWCD] / gbps[PREAD_FRESH], gbps[NWCD_COLD] / gbps[PREAD_FRESH_COLD],
           gbps[NWCD] / gbps[LOADER], gbps[NWCD_COLD] / gbps[LOADER_COLD],
           gbps[NWCD_FRESH],
           gbps[NWCD_FRESH_COLD], gbps[NWCD_FRESH] / gbps[CAT],
           gbps[NWCD_FRESH_COLD] / gbps[CAT_COLD], gbps[POP_MEMFD], gbps[POP_ANON],
           gbps[WRITE_MEMFD], gbps[NWCD] / gbps[WRITE_MEMFD], gbps[WRITE_MEMFD] / gbps[CAT],
           (double)b.direct_nwcd / (double)(4 * rounds * b.nti)); /* nwcd, nwcd_fresh; warm, cold */
  if (rc == 0 && nitems == ITEMS)
    printf("{\"bench\":\"load\",\"summary\":\"gpu\",\"device\":%d,\"warm_gpu_gbps\":%.3f,"
           "\"cold_gpu_gbps\":%.3f,\"cold_gpu_vs_odirect\":%.3f,\"warm_gpu_vs_cat\":%.3f}\n",
           device, gbps[GPU], gbps[GPU_COLD], gbps[GPU_COLD] / gbps[ODIRECT_COLD],
           gbps[GPU] / gbps[CAT]);
  }
#ifdef NWCD_WITH_CUDA
  gpu_teardown(&b);
#endif
  if (b.fresh) release_fresh(&b);
  nwc_client_free(b.c);
  nwc_bench_nwcd_stop(b.nwcd_pid);
  if (sockdir[0]) unlink(sock), rmdir(sockdir);
  if (b.dst) munmap(b.dst, b.blob_bytes);
  nwc_tensor_info_free(b.ti, b.nti);
  for (size_t i = 0; i < b.nmodels; i++) free(b.models[i]);
  free(b.files), free(b.dst_off), free(b.fresh), free(b.fresh_fd), free(b.models);
  if (tmp[0]) nwc_bench_remove_dir(tmp); /* the temporary store */
  return rc < 0 ? 1 : 0;
}
