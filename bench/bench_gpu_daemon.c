/*
 * bench_gpu_daemon.c - `nwc-bench gpu-daemon [--tensors T] [--rows M] [--cols K] [--embed E]
 * [--rounds R] [--iters N] [--nwcd PATH] [--nwcd-verbose] [--keep] [--loader SPEC]...` (CUDA builds): nwcd's
 * cuda backend (PATH, default the one built with the bench; --nwcd-verbose: its debug log on
 * stderr, which splits each model load's time) against its baselines, in one run (issue 8).  --keep leaves the temporary
 * directory (model.safetensors, store/) for other benchmarks (nwc-bench load DIR/store) and
 * prints its path last.
 *
 * Writes a synthetic BF16 safetensors file (T tensors of M x K, default 32 of 4096 x 4096 = 1 GiB,
 * normal weights of sigma 0.02: four distinct matrices repeated; with --embed, one more of E x K,
 * a model whose embedding is far larger than its other tensors), starts a real nwcd --backend
 * cuda on a temporary store, imports it through libnwc-client, then prints JSON lines and a table
 * (stderr):
 *   load   odirect      the container files read with O_DIRECT, 4 MiB at a time (dd iflag=direct)
 *          nwcd_cold    `load_on cuda:0` of the whole model after dropping the page cache
 *          nwcd_warm    the same with the containers in the page cache
 *          bf16_cold    the BF16 safetensors file read() in 64 MiB pieces, each cudaMemcpy'd to
 *          bf16_warm    device memory (the uncompressed alternative), cold and warm
 *          raw_warm     the container files, warm, copied to device memory in 16 threads as
 *                       nwcd's lanes copy them but with nothing else (no checks, no allocation):
 *                       the floor of a verified warm load on this host, in the same run
 *          (median of R rounds; GB/s of the bytes each moves: container blobs or the BF16 file)
 *   load   places_one   with --places P,Q[,..] (cpu, N or cuda:N): a warm `load_on` of the whole
 *                       model onto the first place named, and
 *          places_all   a warm `load_places` of it onto every place named (one read of each
 *                       blob; the reply's bytes read are checked to be the model's once), R
 *                       rounds alternating, then a line with all / one (the target: two places
 *                       in at most 1.15 times one place's time)
 *   stage, loader  after nwcd has stopped, on its store: the warm load taken apart in this
 *          process (bench_gpu_load.c): each stage alone (read, check, copy to the device, zero
 *          copy) and nwcd's loader itself in lanes of GPU rings as nwcd runs it, in the
 *          configurations --loader SPEC names (repeated;
 *          "L:B:S:C[:none][:alloc][:fresh][:touch][:pool][:reuse][:hot][:pN]": see there)
 *   matvec socket       nwc_client_matvec of one column on a resident M x K tensor: p50/p99 µs,
 *                       x and y through the connection's shared region (the default with a
 *                       cuda daemon: straight between the region and the GPU)
 *          inline       the same with x and y in the frames (NWC_CLIENT_INLINE), alternating
 *                       call by call with the shared-region ones
 *          kernel       the bare nwc_k_matvec of the same tensor in this process (CUDA events)
 *          pipeline     in this process, nwcd's device matvec around the kernel as it was
 *                       before x came up by a kernel: x into pinned memory, one graph launch (x
 *                       up by the copy engine, the kernels, y written into mapped pinned
 *                       memory), a spinning wait, y copied out (host clock)
 *   clients serial      one client, 8 matvecs one after the other (µs per 8, p50)
 *           concurrent  8 clients (threads, one connection each), one matvec each at once
 * and a summary line with the ratios: cold nwcd / odirect (>= 0.9), BF16 cold time /
 * nwcd cold time (>= 1.3), warm GB/s (>= 40; and nwcd's warm rate over raw_warm's, since the
 * shared host's memory moves that floor by half from one machine to the next), socket p50 -
 * kernel p50 (<= 15 µs), concurrent / serial (< 1).  The page cache is dropped with /proc/sys/vm/drop_caches (root), else with
 * POSIX_FADV_DONTNEED on each file (the summary says which).
 */
#include "bench.h"

#include "nwc_client.h"
#include "nwc_kernels.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <stdatomic.h>
#include <unistd.h>

#define NCLIENTS 8

static char dir[64] = "/tmp/nwc-bench-gpu-XXXXXX", sock[128], store[128], file[128];
static uint64_t M = 4096, K = 4096;
static const char *drop_how = "drop_caches";
static const char *nwcd_path = NWCD_PATH;

static double pctl(double *t, size_t n, double p) {
  qsort(t, n, sizeof *t, nwc_bench_cmp_double);
  return t[(size_t)((double)(n - 1) * p)];
}

/* The safetensors file: T tensors "w.i" of M x K, matrices[i % 4]. */
/* T matrices of M x K, then with E > 0 an "embed" of E x K (rows of the four matrices again). */
static int write_model(unsigned T, uint64_t E, uint16_t *const mats[4]) {
  json_t *h = json_object();
  uint64_t bytes = M * K * 2;
  char name[32];
  for (unsigned i = 0; i < T; i++) {
    snprintf(name, sizeof name, "w.%u", i);
    json_object_set_new(h, name, json_pack("{s:s,s:[I,I],s:[I,I]}", "dtype", "BF16", "shape",
                                           (json_int_t)M, (json_int_t)K, "data_offsets",
                                           (json_int_t)(i * bytes), (json_int_t)((i + 1) * bytes)));
  }
  if (E)
    json_object_set_new(h, "embed", json_pack("{s:s,s:[I,I],s:[I,I]}", "dtype", "BF16", "shape",
                                              (json_int_t)E, (json_int_t)K, "data_offsets",
                                              (json_int_t)(T * bytes),
                                              (json_int_t)(T * bytes + E * K * 2)));
  char *hs = json_dumps(h, JSON_COMPACT);
  json_decref(h);
  uint64_t hl = (strlen(hs) + 7) & ~7ull;
  FILE *f = fopen(file, "wb");
  int ok = f && fwrite(&hl, 8, 1, f) == 1 && fprintf(f, "%-*s", (int)hl, hs) == (int)hl;
  for (unsigned i = 0; ok && i < T; i++) ok = fwrite(mats[i % 4], 2, M * K, f) == M * K;
  for (uint64_t r = 0, n; ok && r < E; r += n) {
    n = E - r < M ? E - r : M;
    ok = fwrite(mats[(r / M) % 4], 2, n * K, f) == n * K;
  }
  if (f && fclose(f) != 0) ok = 0;
  free(hs);
  return ok ? 0 : -EIO;
}

/* Drops the page cache (all of it as root, else the pages of files[]). */
static void drop_cache(char **files, size_t n) {
  sync();
  FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
  if (f && fputs("3\n", f) >= 0 && fclose(f) == 0) return;
  if (f) fclose(f);
  drop_how = "fadvise";
  for (size_t i = 0; i < n; i++) {
    int fd = open(files[i], O_RDONLY);
    if (fd >= 0) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), close(fd);
  }
}

/* Reads path whole: O_DIRECT 4 MiB at a time, or buffered (for warming); returns bytes. */
static uint64_t read_file(const char *path, bool direct, void *buf) {
  int fd = open(path, O_RDONLY | (direct ? O_DIRECT : 0));
  uint64_t total = 0;
  ssize_t got;
  while (fd >= 0 && (got = pread(fd, buf, 4u << 20, (off_t)total)) > 0) total += (uint64_t)got;
  if (fd >= 0) close(fd);
  return total;
}

/* The BF16 file into device memory: read() 64 MiB at a time, cudaMemcpy each piece. */
static double bf16_to_gpu(void *host, uint8_t *dev) {
  double t0 = nwc_bench_now();
  int fd = open(file, O_RDONLY);
  uint64_t off = 0;
  ssize_t got;
  while (fd >= 0 && (got = read(fd, host, 64u << 20)) > 0) {
    cudaMemcpy(dev + off, host, (size_t)got, cudaMemcpyHostToDevice);
    off += (uint64_t)got;
  }
  if (fd >= 0) close(fd);
  return nwc_bench_now() - t0;
}

/* The raw warm floor: the container files, in the page cache, copied to the device by as many
 * threads as nwcd has load lanes, the way its lanes copy but with nothing else (no checks, no
 * allocation, no tensors): each thread claims the next 4 MiB of the files, pread()s it 1 MiB at a
 * time into one of its two pinned slots and queues a cudaMemcpyAsync of the slot on its stream,
 * waiting for a slot's last copy before refilling it. */
#define RAW_LANES 16
#define RAW_PIECE (4ull << 20)
typedef struct raw_ctx {
  char **files;
  size_t nfiles;
  const uint64_t *sizes;
  uint8_t *dev;
  atomic_uint_fast64_t next; /* the next piece to claim, counting each file's in turn */
  uint64_t total;
  uint8_t *slots[RAW_LANES]; /* 2 x RAW_PIECE pinned each */
  cudaStream_t streams[RAW_LANES];
  atomic_uint lane;
} raw_ctx;

static void *raw_lane(void *arg) {
  raw_ctx *c = arg;
  unsigned l = atomic_fetch_add(&c->lane, 1);
  int fds[64];
  for (size_t k = 0; k < c->nfiles; k++) fds[k] = open(c->files[k], O_RDONLY);
  cudaEvent_t ev[2];
  bool used[2] = {false, false};
  for (int k = 0; k < 2; k++)
    cudaEventCreateWithFlags(&ev[k], cudaEventDisableTiming | cudaEventBlockingSync);
  for (unsigned slot = 0;; slot ^= 1) {
    /* piece p of the files: pieces never straddle two files, the last of each is short */
    uint64_t p = atomic_fetch_add(&c->next, 1), k = 0, base = 0;
    while (k < c->nfiles && p >= (c->sizes[k] + RAW_PIECE - 1) / RAW_PIECE)
      p -= (c->sizes[k] + RAW_PIECE - 1) / RAW_PIECE, base += c->sizes[k++];
    if (k == c->nfiles) break;
    uint64_t at = base + p * RAW_PIECE; /* in the files laid end to end, as on the device */
    uint64_t n = c->sizes[k] - p * RAW_PIECE < RAW_PIECE ? c->sizes[k] - p * RAW_PIECE : RAW_PIECE;
    if (used[slot]) cudaEventSynchronize(ev[slot]);
    uint8_t *buf = c->slots[l] + slot * RAW_PIECE;
    for (uint64_t o = 0; o < n; o += 1u << 20) {
      size_t len = n - o < (1u << 20) ? n - o : (1u << 20);
      if (pread(fds[k], buf + o, len, (off_t)(p * RAW_PIECE + o)) < 0) break;
    }
    cudaMemcpyAsync(c->dev + at, buf, n, cudaMemcpyHostToDevice, c->streams[l]);
    cudaEventRecord(ev[slot], c->streams[l]);
    used[slot] = true;
  }
  cudaStreamSynchronize(c->streams[l]);
  for (int k = 0; k < 2; k++) cudaEventDestroy(ev[k]);
  for (size_t k = 0; k < c->nfiles; k++) close(fds[k]);
  return NULL;
}

static double raw_warm(raw_ctx *c) {
  atomic_store(&c->next, 0), atomic_store(&c->lane, 0);
  pthread_t th[RAW_LANES];
  double t0 = nwc_bench_now();
  for (int i = 0; i < RAW_LANES; i++) pthread_create(&th[i], NULL, raw_lane, c);
  for (int i = 0; i < RAW_LANES; i++) pthread_join(th[i], NULL);
  return nwc_bench_now() - t0;
}

typedef struct client_ctx {
  pthread_barrier_t *go, *done;
  const char *tensor;
  const float *x;
  unsigned rounds;
  int rc;
} client_ctx;

static void *client_thread(void *p) {
  client_ctx *c = p;
  nwc_client *cl = NULL;
  c->rc = nwc_client_connect(sock, &cl);
  float *y = malloc(M * 4);
  for (unsigned r = 0; r < c->rounds; r++) {
    pthread_barrier_wait(c->go);
    if (c->rc == 0) c->rc = nwc_client_matvec(cl, "m", c->tensor, NULL, 1.0f, c->x, K, 1, 0, y, M * 4, NULL);
    pthread_barrier_wait(c->done);
  }
  free(y);
  nwc_client_free(cl);
  return NULL;
}

static void line(const char *bench, const char *item, double seconds, double bytes) {
  printf("{\"bench\":\"%s\",\"item\":\"%s\",\"seconds\":%.6f,\"bytes\":%.0f,\"gbps\":%.3f}\n", bench,
         item, seconds, bytes, bytes / seconds / 1e9);
  fprintf(stderr, "%-8s %-11s %10.3f ms %8.2f GB/s\n", bench, item, seconds * 1e3, bytes / seconds / 1e9);
}

/* "cpu,0,cuda:1" into at (NWC_CLIENT_CPU or devices): how many, or -1. */
static int parse_places(const char *s, int at[16]) {
  int n = 0;
  for (const char *p = s; *p && n < 16;) {
    size_t len = strcspn(p, ",");
    if (len == 3 && !strncmp(p, "cpu", 3)) at[n++] = NWC_CLIENT_CPU;
    else if (len > 5 && !strncmp(p, "cuda:", 5)) at[n++] = atoi(p + 5);
    else if (len && p[0] >= '0' && p[0] <= '9') at[n++] = atoi(p);
    else return -1;
    p += len + (p[len] == ',');
  }
  return n;
}

/* The places item (--places): a warm load onto at[0] alone against load_places onto at[0..n),
 * R rounds alternating, medians; 0, or 1 after a failed load.  The containers are read into the
 * page cache first (buffered, through buf): nwcd's cold loads read with O_DIRECT and leave none. */
static int places_item(nwc_client *c, const int *at, int n, unsigned R, uint64_t blob_bytes,
                       const char *spec, char **files, size_t nfiles, void *buf) {
  double one[64], all[64];
  uint64_t read = 0;
  for (size_t k = 0; k < nfiles; k++) read_file(files[k], false, buf);
  for (unsigned r = 0; r < R; r++) {
    nwc_client_result res;
    nwc_client_evict(c, "m", NULL, NULL);
    double t0 = nwc_bench_now();
    int rc = nwc_client_load_on(c, "m", NULL, at[0], NULL, NULL, NULL);
    one[r] = nwc_bench_now() - t0;
    nwc_client_evict(c, "m", NULL, NULL);
    t0 = nwc_bench_now();
    if (rc == 0) rc = nwc_client_load_places(c, "m", NULL, at, (size_t)n, 0, NULL, NULL, &res);
    all[r] = nwc_bench_now() - t0;
    if (rc < 0) return fprintf(stderr, "load --places %s: %s\n", spec, nwc_client_last_error()), 1;
    read = res.raw_bytes;
  }
  nwc_client_evict(c, "m", NULL, NULL);
  double m1 = nwc_bench_median(one, R), ma = nwc_bench_median(all, R);
  line("load", "places_one", m1, (double)blob_bytes);
  line("load", "places_all", ma, (double)blob_bytes * n);
  printf("{\"bench\":\"load\",\"item\":\"places\",\"places\":\"%s\",\"one_s\":%.6f,\"all_s\":%.6f,"
         "\"all_over_one\":%.3f,\"target_all_over_one\":1.15,\"read_bytes\":%llu,"
         "\"blob_bytes\":%llu,\"read_once\":%s}\n", spec, m1, ma, ma / m1,
         (unsigned long long)read, (unsigned long long)blob_bytes, read == blob_bytes ? "true" : "false");
  fprintf(stderr, "places %s: %.3f x the time of one place (<= 1.15); %s\n", spec, ma / m1,
          read == blob_bytes ? "each blob read once" : "BLOBS READ MORE THAN ONCE");
  return read == blob_bytes ? 0 : 1;
}

int nwc_bench_gpu_daemon(int argc, char **argv) {
  unsigned T = 32, R = 3, iters = 2000;
  uint64_t E = 0;
  bool keep = false;
  const char *log_level = "--quiet"; /* its stderr kept: errors, and the log asked for */
  const char *specs[32], *places_spec = NULL;
  size_t nspecs = 0;
  int places[16], nplaces = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--tensors") && i + 1 < argc) T = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--embed") && i + 1 < argc) E = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--rows") && i + 1 < argc) M = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--cols") && i + 1 < argc) K = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) R = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--nwcd") && i + 1 < argc) nwcd_path = argv[++i];
    else if (!strcmp(argv[i], "--keep")) keep = true;
    else if (!strcmp(argv[i], "--nwcd-verbose")) log_level = "--verbose";
    else if (!strcmp(argv[i], "--places") && i + 1 < argc &&
             (nplaces = parse_places(argv[i + 1], places)) >= 2)
      places_spec = argv[++i];
    else if (!strcmp(argv[i], "--loader") && i + 1 < argc && nspecs < 32 &&
             nwc_bench_gpu_load_spec(argv[i + 1]) == 0)
      specs[nspecs++] = argv[++i];
    else return fprintf(stderr, "usage: nwc-bench gpu-daemon [--tensors T] [--rows M] [--cols K] "
                                "[--embed E] [--rounds R] [--iters N] [--nwcd PATH] [--nwcd-verbose] [--keep] "
                                "[--places P,Q[,..]] "
                                "[--loader L:B:S:C[:none][:alloc][:fresh][:touch][:pool][:reuse][:hot][:pN]]...\n"), 2;
  }
  if (T < 1 || R < 1 || R > 64 || iters < 10 || M < 8 || K < 16) return fprintf(stderr, "bad sizes\n"), 2;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) return fprintf(stderr, "no GPU\n"), 77;
  if (!mkdtemp(dir)) return 1;
  snprintf(sock, sizeof sock, "%s/nwcd.sock", dir);
  snprintf(store, sizeof store, "%s/store", dir);
  snprintf(file, sizeof file, "%s/model.safetensors", dir);
  uint16_t *mats[4];
  for (int i = 0; i < 4; i++) mats[i] = malloc(M * K * 2), nwc_bench_normal_bf16(mats[i], M * K, (uint64_t)i + 1);
  int rc = write_model(T, E, mats);
  pid_t pid = nwc_bench_nwcd_start(nwcd_path, store, sock, "cuda", log_level);
  nwc_client *c = NULL;
  if (rc == 0) rc = nwc_client_connect(sock, &c);
  double t0 = nwc_bench_now();
  if (rc == 0) rc = nwc_client_import(c, "m", file, NULL, NULL);
  if (rc < 0) {
    fprintf(stderr, "nwc-bench gpu-daemon: %s\n", nwc_client_last_error());
    nwc_bench_nwcd_stop(pid);
    return 1;
  }
  fprintf(stderr, "import of %u x %llux%llu: %.2f s\n", T, (unsigned long long)M,
          (unsigned long long)K, nwc_bench_now() - t0);
  /* The container files and blob bytes. */
  nwc_client_tensor *ts;
  size_t nt;
  char **files = calloc(T + 1, sizeof *files);
  size_t nfiles = 0;
  uint64_t blob_bytes = 0, file_bytes = 0;
  if (nwc_client_tensors(c, "m", &ts, &nt) < 0) return 1;
  for (size_t i = 0; i < nt; i++) {
    nwc_client_tensor_info in;
    if (nwc_client_info(c, "m", ts[i].name, &in) < 0) return 1;
    blob_bytes += in.length;
    bool seen = false;
    for (size_t k = 0; k < nfiles; k++) seen |= !strcmp(files[k], in.path);
    if (!seen) files[nfiles++] = strdup(in.path);
  }
  void *dbuf = NULL, *host = NULL;
  struct stat st;
  stat(file, &st);
  uint64_t bf16_bytes = (uint64_t)st.st_size;
  uint8_t *dev = NULL;
  if (posix_memalign(&dbuf, 4096, 4u << 20) != 0 || !(host = malloc(64u << 20)) ||
      cudaMalloc((void **)&dev, bf16_bytes) != cudaSuccess)
    return fprintf(stderr, "nwc-bench gpu-daemon: no memory for the buffers\n"), 1;
  char *all_files[2] = {file, NULL};
  raw_ctx raw = {.files = files, .nfiles = nfiles, .dev = dev};
  uint64_t *sizes = calloc(nfiles, sizeof *sizes);
  for (size_t k = 0; sizes && k < nfiles; k++) {
    struct stat fs;
    sizes[k] = stat(files[k], &fs) == 0 ? (uint64_t)fs.st_size : 0;
    raw.total += sizes[k];
  }
  raw.sizes = sizes;
  for (int i = 0; i < RAW_LANES; i++)
    if (nfiles > 64 || raw.total > bf16_bytes || !sizes ||
        cudaHostAlloc((void **)&raw.slots[i], 2 * RAW_PIECE, cudaHostAllocDefault) != cudaSuccess ||
        cudaStreamCreateWithFlags(&raw.streams[i], cudaStreamNonBlocking) != cudaSuccess)
      return fprintf(stderr, "nwc-bench gpu-daemon: no pinned memory or streams for the raw "
                             "copy\n"), 1;
  double tv[6][64];
  for (unsigned r = 0; r < R; r++) {
    drop_cache(files, nfiles), drop_cache(all_files, 1);
    t0 = nwc_bench_now();
    file_bytes = 0;
    for (size_t k = 0; k < nfiles; k++) file_bytes += read_file(files[k], true, dbuf);
    tv[0][r] = nwc_bench_now() - t0;
    nwc_client_evict(c, "m", NULL, NULL);
    drop_cache(files, nfiles);
    t0 = nwc_bench_now();
    rc = nwc_client_load_on(c, "m", NULL, 0, NULL, NULL, NULL);
    tv[1][r] = nwc_bench_now() - t0;
    if (rc < 0) return fprintf(stderr, "load: %s\n", nwc_client_last_error()), 1;
    for (size_t k = 0; k < nfiles; k++) read_file(files[k], false, dbuf);
    nwc_client_evict(c, "m", NULL, NULL);
    t0 = nwc_bench_now();
    rc = nwc_client_load_on(c, "m", NULL, 0, NULL, NULL, NULL);
    tv[2][r] = nwc_bench_now() - t0;
    tv[5][r] = raw_warm(&raw); /* the containers are still in the page cache */
    drop_cache(all_files, 1);
    tv[3][r] = bf16_to_gpu(host, dev);
    tv[4][r] = bf16_to_gpu(host, dev);
  }
  for (int i = 0; i < RAW_LANES; i++) cudaFreeHost(raw.slots[i]), cudaStreamDestroy(raw.streams[i]);
  free(sizes);
  static const char *items[6] = {"odirect", "nwcd_cold", "nwcd_warm", "bf16_cold", "bf16_warm",
                                 "raw_warm"};
  double med[6];
  fprintf(stderr, "%u tensors and an embedding of %llu rows, containers %.1f MB (%zu files), BF16 "
          "%.1f MB, %u rounds (median)\n", T, (unsigned long long)E, file_bytes / 1e6, nfiles, bf16_bytes / 1e6, R);
  for (int i = 0; i < 6; i++) {
    med[i] = nwc_bench_median(tv[i], R);
    line("load", items[i], med[i], i == 0 || i == 5 ? (double)(i ? raw.total : file_bytes)
                                   : i < 3 ? (double)blob_bytes : (double)bf16_bytes);
  }
  double warm_gbps = blob_bytes / med[2] / 1e9, raw_gbps = raw.total / med[5] / 1e9;
  cudaFree(dev);
  if (places_spec && places_item(c, places, nplaces, R, blob_bytes, places_spec, files, nfiles, dbuf) != 0) return 1;
  /* matvec through the socket and the bare kernel */
  const char *tn = "w.0";
  nwc_client_load_on(c, "m", tn, 0, NULL, NULL, NULL);
  uint64_t K16 = (K + 15) & ~15ull;
  float *x = calloc(K16, 4), *y = malloc(M * 4);
  for (uint64_t k = 0; k < K; k++) x[k] = (float)sin((double)k);
  double *sv = malloc(iters * sizeof *sv), *kv = malloc(iters * sizeof *kv);
  double *nv = malloc(iters * sizeof *nv);
  unsigned rf_shared = 0;
  for (unsigned i = 0; i < iters + 20; i++) {
    unsigned rf = 0;
    t0 = nwc_bench_now();
    rc = nwc_client_matvec(c, "m", tn, NULL, 1.0f, x, K, 1, 0, y, M * 4, &rf);
    if (i >= 20) sv[i - 20] = nwc_bench_now() - t0;
    rf_shared |= rf;
    t0 = nwc_bench_now();
    if (rc == 0) rc = nwc_client_matvec(c, "m", tn, NULL, 1.0f, x, K, 1, NWC_CLIENT_INLINE, y, M * 4, NULL);
    if (i >= 20) nv[i - 20] = nwc_bench_now() - t0;
    if (rc < 0) return fprintf(stderr, "matvec: %s\n", nwc_client_last_error()), 1;
  }
  nwc_tensor t;
  nwc_k_tensor kt;
  float *dx, *dy, *ds;
  uint64_t lay[4];
  nwc_layout(M, K, NWC_ELEM_BF16, lay);
  cudaStream_t s;
  cudaEvent_t e0, e1;
  cudaStreamCreate(&s), cudaEventCreate(&e0), cudaEventCreate(&e1);
  if (nwc_tensor_encode(mats[0], M, K, NWC_ELEM_BF16, NULL, &t) < 0 || nwc_k_tensor_upload(&t, &kt, s) < 0)
    return fprintf(stderr, "kernel tensor: %s\n", nwc_error_detail()), 1;
  cudaMalloc((void **)&dx, K16 * 4), cudaMalloc((void **)&dy, M * 4);
  cudaMalloc((void **)&ds, lay[NWC_LAYOUT_SCRATCH] * 4);
  cudaMemcpy(dx, x, K16 * 4, cudaMemcpyHostToDevice);
  double wall8[64];
  if (nwc_k_matvec(&kt, dx, NULL, dy, ds, s) < 0 || cudaStreamSynchronize(s) != cudaSuccess)
    return fprintf(stderr, "bare kernel: CUDA error %d\n", nwc_k_last_cuda_error()), 1;
  for (unsigned i = 0; i < iters + 20; i++) {
    cudaEventRecord(e0, s);
    nwc_k_matvec(&kt, dx, NULL, dy, ds, s);
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= 20) kv[i - 20] = ms / 1e3;
  }
  for (unsigned r = 0; r < 64; r++) { /* 8 separate launches, each waited for */
    t0 = nwc_bench_now();
    for (int k = 0; k < NCLIENTS; k++) nwc_k_matvec(&kt, dx, NULL, dy, ds, s), cudaStreamSynchronize(s);
    wall8[r] = nwc_bench_now() - t0;
  }
  /* nwcd's device matvec with the copy engine, in this process: x into pinned memory, one graph
   * launch (x up, the kernels writing y into mapped pinned memory), a spinning wait, y copied out */
  double *pv = malloc(iters * sizeof *pv);
  float *px = NULL, *py = NULL, *pyd = NULL, *yout = malloc(M * 4);
  cudaGraph_t g = NULL;
  cudaGraphExec_t ge = NULL;
  int pok = cudaHostAlloc((void **)&px, K16 * 4, cudaHostAllocMapped) == cudaSuccess &&
            cudaHostAlloc((void **)&py, M * 4, cudaHostAllocMapped) == cudaSuccess &&
            cudaHostGetDevicePointer((void **)&pyd, py, 0) == cudaSuccess &&
            cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess;
  if (pok) {
    cudaMemcpyAsync(dx, px, K16 * 4, cudaMemcpyHostToDevice, s);
    nwc_k_matvec(&kt, dx, NULL, pyd, ds, s);
    pok = cudaStreamEndCapture(s, &g) == cudaSuccess &&
          cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
  }
  for (unsigned i = 0; pok && i < iters + 20; i++) {
    t0 = nwc_bench_now();
    memcpy(px, x, K16 * 4);
    pok = cudaGraphLaunch(ge, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess;
    memcpy(yout, py, M * 4);
    if (i >= 20) pv[i - 20] = nwc_bench_now() - t0;
  }
  double p50 = pok ? pctl(pv, iters, 0.5) * 1e6 : -1;
  if (ge) cudaGraphExecDestroy(ge);
  if (g) cudaGraphDestroy(g);
  cudaFreeHost(px), cudaFreeHost(py), free(yout), free(pv);
  /* the same through CUDA IPC: x and y stay in this process's device memory */
  double *iv = malloc(iters * sizeof *iv);
  cudaIpcMemHandle_t hx, hy;
  nwc_client_cuda_buf bx = {.offset = 0, .bytes = K * 4}, by = {.offset = 0, .bytes = M * 4};
  int ipc = cudaIpcGetMemHandle(&hx, dx) == cudaSuccess && cudaIpcGetMemHandle(&hy, dy) == cudaSuccess;
  memcpy(bx.handle, &hx, 64), memcpy(by.handle, &hy, 64);
  for (unsigned i = 0; ipc && i < iters + 20; i++) {
    t0 = nwc_bench_now();
    rc = nwc_client_matvec_cuda(c, "m", tn, NULL, 1.0f, &bx, K, 1, &by, 0, NULL);
    if (i >= 20) iv[i - 20] = nwc_bench_now() - t0;
    if (rc < 0) return fprintf(stderr, "matvec_cuda: %s\n", nwc_client_last_error()), 1;
  }
  double i50 = ipc ? pctl(iv, iters, 0.5) * 1e6 : -1;
  double s50 = pctl(sv, iters, 0.5) * 1e6, s99 = pctl(sv, iters, 0.99) * 1e6;
  double n50 = pctl(nv, iters, 0.5) * 1e6, n99 = pctl(nv, iters, 0.99) * 1e6;
  double k50 = pctl(kv, iters, 0.5) * 1e6, k99 = pctl(kv, iters, 0.99) * 1e6;
  double l8 = nwc_bench_median(wall8, 64) * 1e6;
  bool shared = rf_shared & NWC_CLIENT_SHARED;
  printf("{\"bench\":\"matvec\",\"rows\":%llu,\"cols\":%llu,\"socket_p50_us\":%.2f,\"socket_p99_us\":%.2f,"
         "\"shared\":%s,\"socket_inline_p50_us\":%.2f,\"socket_inline_p99_us\":%.2f,"
         "\"kernel_p50_us\":%.2f,\"kernel_p99_us\":%.2f,\"launches8_wall_us\":%.2f,"
         "\"pipeline_p50_us\":%.2f,\"ipc_p50_us\":%.2f}\n",
         (unsigned long long)M, (unsigned long long)K, s50, s99, shared ? "true" : "false", n50, n99,
         k50, k99, l8, p50, i50);
  fprintf(stderr, "matvec %llux%llu: socket p50 %.1f us (p99 %.1f; %s), inline p50 %.1f us (p99 "
          "%.1f), bare kernel p50 %.1f us (p99 %.1f), in-process pipeline (x up, graph, wait, y "
          "out) p50 %.1f us, IPC (device x, y) p50 %.1f us\n",
          (unsigned long long)M, (unsigned long long)K, s50, s99,
          shared ? "x, y straight between the region and the GPU" : "copied", n50, n99, k50, k99,
          p50, i50);
  /* 8 clients at once vs one client's 8 in a row */
  unsigned rounds = 200;
  double *ser = malloc(rounds * sizeof *ser), *con = malloc(rounds * sizeof *con);
  for (unsigned r = 0; r < rounds; r++) {
    t0 = nwc_bench_now();
    for (int k = 0; k < NCLIENTS; k++) nwc_client_matvec(c, "m", tn, NULL, 1.0f, x, K, 1, 0, y, M * 4, NULL);
    ser[r] = nwc_bench_now() - t0;
  }
  nwc_client_counters before, after;
  nwc_client_stats(c, &before);
  pthread_barrier_t go, done;
  pthread_barrier_init(&go, NULL, NCLIENTS + 1), pthread_barrier_init(&done, NULL, NCLIENTS + 1);
  pthread_t th[NCLIENTS];
  client_ctx cc[NCLIENTS];
  for (int k = 0; k < NCLIENTS; k++) {
    cc[k] = (client_ctx){&go, &done, tn, x, rounds, 0};
    pthread_create(&th[k], NULL, client_thread, &cc[k]);
  }
  for (unsigned r = 0; r < rounds; r++) {
    pthread_barrier_wait(&go);
    t0 = nwc_bench_now();
    pthread_barrier_wait(&done);
    con[r] = nwc_bench_now() - t0;
  }
  for (int k = 0; k < NCLIENTS; k++) pthread_join(th[k], NULL), rc |= cc[k].rc;
  nwc_client_stats(c, &after);
  double ser50 = nwc_bench_median(ser, rounds) * 1e6, con50 = nwc_bench_median(con, rounds) * 1e6;
  printf("{\"bench\":\"clients\",\"clients\":%d,\"serial_p50_us\":%.2f,\"concurrent_p50_us\":%.2f,"
         "\"batched_passes\":%llu,\"batched_columns\":%llu,\"launches8_wall_us\":%.2f,\"errors\":%d}\n",
         NCLIENTS, ser50, con50, (unsigned long long)(after.batched_passes - before.batched_passes),
         (unsigned long long)(after.batched_columns - before.batched_columns), l8, rc);
  fprintf(stderr, "8 matvecs: one client in a row %.1f us, 8 clients at once %.1f us (%llu batched "
          "passes, %llu columns), 8 bare launches %.1f us\n", ser50, con50,
          (unsigned long long)(after.batched_passes - before.batched_passes),
          (unsigned long long)(after.batched_columns - before.batched_columns), l8);
  printf("{\"bench\":\"summary\",\"cold_vs_odirect\":%.3f,\"target_cold\":0.9,"
         "\"bf16_time_over_nwcd_time\":%.3f,\"target_sooner\":1.3,\"warm_gbps\":%.2f,"
         "\"target_warm_gbps\":40,\"raw_warm_gbps\":%.2f,\"warm_vs_raw\":%.3f,"
         "\"socket_minus_kernel_p50_us\":%.2f,\"target_us\":15,"
         "\"inline_minus_kernel_p50_us\":%.2f,\"concurrent_over_serial\":%.3f,\"drop\":\"%s\"}\n",
         (blob_bytes / med[1]) / (file_bytes / med[0]), med[3] / med[1], warm_gbps, raw_gbps,
         warm_gbps / raw_gbps, s50 - k50, n50 - k50, con50 / ser50, drop_how);
  fprintf(stderr, "summary: cold nwcd / O_DIRECT %.2f (>= 0.9); BF16 file time / nwcd time %.2f "
          "(>= 1.3); warm %.1f GB/s (>= 40; the raw copy %.1f, nwcd %.2f of it); socket - kernel "
          "p50 %.1f us (<= 15; inline %.1f); 8 clients at once / in a row %.2f (< 1); cache "
          "dropped by %s\n",
          (blob_bytes / med[1]) / (file_bytes / med[0]), med[3] / med[1], warm_gbps, raw_gbps,
          warm_gbps / raw_gbps, s50 - k50, n50 - k50, con50 / ser50, drop_how);
  nwc_client_free(c);
  nwc_bench_nwcd_stop(pid);
  if (nwc_bench_gpu_load(store, "m", R, specs, nspecs) < 0) rc = 1;
  nwc_k_tensor_free(&kt), nwc_tensor_release(&t);
  cudaFree(dx), cudaFree(dy), cudaFree(ds), cudaStreamDestroy(s);
  for (int i = 0; i < 4; i++) free(mats[i]);
  for (size_t k = 0; k < nfiles; k++) free(files[k]);
  free(files), free(ts), free(dbuf), free(host), free(x), free(y), free(sv), free(nv), free(kv), free(iv), free(ser), free(con);
  if (keep) fprintf(stderr, "kept %s\n", dir);
  else nwc_bench_remove_dir(dir);
  return rc ? 1 : 0;
}
