/*
 * nwc_gpu_map_bench.c - GPU maps (docs/gpu-maps.md) measured: a client process computing on
 * nwcd's device copies through libnwc-cuda, against the socket and against its own copy.  JSON
 * lines on stdout, progress on stderr.
 *
 *   nwc_gpu_map_bench [--rows M] [--cols K] [--iters N] [--layers L] [--layout 0|2] [--no-step]
 *                     [--procs P] [--nwcd PATH] [--keep]
 *
 * Writes a synthetic BF16 model (normal weights, sigma 0.02) into a temporary directory: "mv" of
 * M x K (default 4096 x 4096) and, unless --no-step, a Qwen3-4B-shaped stack of L layers (default
 * 36: fused q/k/v 6144 x 2560, o 2560 x 4096, fused gate/up 19456 x 2560, down 2560 x 9728, each
 * layer's matrices the same weights, their bytes distinct copies) and lm_head 151936 x 2560;
 * starts nwcd --backend cuda on it, imports it with the layout, loads it onto cuda:0 and maps it
 * whole (nwc_cuda_map_model), then prints:
 *
 *   gpu_map_call        one-column fp32 matvec of "mv": the mapped launch (nwc_cuda_matvec), the
 *                       bare kernel on this process's own upload of the same encoded tensor
 *                       (nwc_k_matvec_cols), each timed three ways: between two events around
 *                       one call (event_us), on the host around one call and its stream
 *                       synchronization (wall_us), and per call of 100 captured in one graph
 *                       (graph_us; medians); and nwc_client_matvec through the socket (wall,
 *                       median): the targets are mapped - bare <= 2 us single, equal in
 *                       a graph.  Every call reads the same tensor (a 4096 x 4096 one fits the
 *                       H200's L2): this compares launch paths, not the kernel's bandwidth
 *                       (nwc_gpu_bench measures that, rotating over copies).
 *   gpu_map_token_step  every linear of the stack (BF16 out, one column) in one graph: on the
 *                       mapped copies, on this process's own uploads (nwc_k_tensor_upload of the
 *                       same encoded matrices, one per layer), and cuBLAS BF16 GEMV
 *                       (cublasGemmEx, fp32 compute) on per-layer BF16 copies; median of the
 *                       replays (target: mapped within 3 % of own).
 *   gpu_map_procs       P client processes (default 8; 0: none) started as this program with
 *                       --child, each with its CUDA context made, then mapping the whole model:
 *                       the device's free memory (cudaMemGetInfo) before and after the P maps
 *                       (maps_bytes: what mapping took beyond the contexts), against the model's
 *                       bytes on the device and its BF16 bytes (target: nwcd's copy plus every
 *                       map at most 8.1 GB for an 8 GB model).
 * Exit 77 without a GPU.  docs/results.md keeps the figures.
 */
#include "bench.h"

#include "nwc_client.h"
#include "nwc_cuda.h"
#include "nwc_kernels.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BENCH_NAME "nwc_gpu_map_bench"
#include "gpu_die.h"

#define NW(expr)                                                                                 \
  do {                                                                                           \
    int r_ = (expr);                                                                             \
    if (r_ < 0) DIE("%s: %d (%s; %s)", #expr, r_, nwc_strerror(r_), nwc_cuda_last_error());     \
  } while (0)

enum { MATS = 5 };
static const uint64_t shapes[MATS][2] = {
    {6144, 2560}, {2560, 4096}, {19456, 2560}, {2560, 9728}, {151936, 2560}};
static const char *const mat_names[MATS] = {"qkv", "o", "gateup", "down", "lm_head"};

static uint64_t M = 4096, K = 4096;
static unsigned iters = 2000, layers = 36, layout = 0;
static bool step = true;
static cudaStream_t stream;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
static double now_us(void) { return now_s() * 1e6; }

/* n normal BF16 weights (nwc_bench_normal_bf16), malloc'ed. */
static uint16_t *synth(uint64_t n, uint64_t seed) {
  uint16_t *w = malloc(n * 2);
  if (!w) DIE("no memory for %llu weights", (unsigned long long)n);
  nwc_bench_normal_bf16(w, n, seed);
  return w;
}

static void step_name(char *out, size_t n, unsigned l, int i) {
  if (i == MATS - 1) snprintf(out, n, "lm_head");
  else snprintf(out, n, "l.%u.%s", l, mat_names[i]);
}

/* The safetensors file: "mv", then the stack (in the order of its linears). */
static void write_model(const char *file, uint16_t *mv, uint16_t *const w[MATS]) {
  json_t *h = json_object();
  uint64_t off = 0;
  char name[64];
  json_object_set_new(h, "mv", json_pack("{s:s,s:[I,I],s:[I,I]}", "dtype", "BF16", "shape",
                                         (json_int_t)M, (json_int_t)K, "data_offsets",
                                         (json_int_t)0, (json_int_t)(M * K * 2)));
  off = M * K * 2;
  for (unsigned l = 0; step && l <= layers; l++)
    for (int i = 0; i < MATS; i++) {
      if ((l == layers) != (i == MATS - 1)) continue;
      step_name(name, sizeof name, l, i);
      uint64_t b = shapes[i][0] * shapes[i][1] * 2;
      json_object_set_new(h, name, json_pack("{s:s,s:[I,I],s:[I,I]}", "dtype", "BF16", "shape",
                                             (json_int_t)shapes[i][0], (json_int_t)shapes[i][1],
                                             "data_offsets", (json_int_t)off,
                                             (json_int_t)(off + b)));
      off += b;
    }
  char *hs = json_dumps(h, JSON_COMPACT);
  json_decref(h);
  uint64_t hl = (strlen(hs) + 7) & ~7ull;
  FILE *f = fopen(file, "wb");
  bool ok = f && fwrite(&hl, 8, 1, f) == 1 && fprintf(f, "%-*s", (int)hl, hs) == (int)hl &&
            fwrite(mv, 2, M * K, f) == M * K;
  for (unsigned l = 0; ok && step && l <= layers; l++)
    for (int i = 0; ok && i < MATS; i++) {
      if ((l == layers) != (i == MATS - 1)) continue;
      uint64_t n = shapes[i][0] * shapes[i][1];
      ok = fwrite(w[i], 2, n, f) == n;
    }
  if (!f || fclose(f) != 0) ok = false;
  free(hs);
  if (!ok) DIE("cannot write %s", file);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
static double median(double *t, size_t n) {
  qsort(t, n, sizeof *t, cmp_double);
  return t[n / 2];
}

/* ---- per call ------------------------------------------------------------------------------ */

typedef struct side {
  const nwc_cuda_map *m; /* mapped, or NULL: the bare kernel on k */
  const nwc_cuda_tensor *t;
  const nwc_k_tensor *k;
  void *scratch;
  const float *x;
  float *y;
} side;

static void call(const side *s) {
  if (s->m) NW(nwc_cuda_matvec(s->m, s->t, s->x, 1, s->t->k16, NULL, s->y, NULL, s->t->rows, stream));
  else NW(nwc_k_matvec_cols(s->k, s->x, 1, s->t->k16, NULL, s->y, NULL, s->t->rows, s->scratch,
                            stream));
}

/* Per call of fn: the median microseconds of 20 replays of one graph of calls calls, over
 * calls. */
static double time_graph(void (*fn)(void *), void *ctx, int calls) {
  fn(ctx); /* warm-up, eagerly */
  CU(cudaStreamSynchronize(stream));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CU(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < calls; i++) fn(ctx);
  CU(cudaStreamEndCapture(stream, &g));
  CU(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CU(cudaEventCreate(&a));
  CU(cudaEventCreate(&b));
  CU(cudaGraphLaunch(ge, stream));
  double t[20];
  for (int r = 0; r < 20; r++) {
    CU(cudaEventRecord(a, stream));
    CU(cudaGraphLaunch(ge, stream));
    CU(cudaEventRecord(b, stream));
    CU(cudaEventSynchronize(b));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, a, b));
    t[r] = ms * 1e3 / calls;
  }
  cudaGraphExecDestroy(ge), cudaGraphDestroy(g);
  cudaEventDestroy(a), cudaEventDestroy(b);
  return median(t, 20);
}

static void call_v(void *s) { call(s); }

/* event_us, wall_us, graph_us of s (medians). */
static void time_side(const side *s, double out[3]) {
  double *ev = malloc(iters * sizeof *ev), *wl = malloc(iters * sizeof *wl);
  cudaEvent_t a, b;
  CU(cudaEventCreate(&a));
  CU(cudaEventCreate(&b));
  for (unsigned i = 0; i < 50; i++) call(s); /* warm-up */
  CU(cudaStreamSynchronize(stream));
  for (unsigned i = 0; i < iters; i++) {
    CU(cudaEventRecord(a, stream));
    call(s);
    CU(cudaEventRecord(b, stream));
    CU(cudaEventSynchronize(b));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, a, b));
    ev[i] = ms * 1e3;
  }
  for (unsigned i = 0; i < iters; i++) {
    double t0 = now_us();
    call(s);
    CU(cudaStreamSynchronize(stream));
    wl[i] = now_us() - t0;
  }
  out[0] = median(ev, iters), out[1] = median(wl, iters);
  out[2] = time_graph(call_v, (void *)s, 100);
  cudaEventDestroy(a), cudaEventDestroy(b);
  free(ev), free(wl);
}

static void bench_call(nwc_client *c, const nwc_cuda_map *m, const uint16_t *mv) {
  const nwc_cuda_tensor *t = nwc_cuda_find(m, "mv");
  if (!t) DIE("mv is not in the map");
  nwc_tensor enc;
  NW(nwc_tensor_encode(mv, M, K, NWC_ELEM(NWC_ELEM_BF16, layout), NULL, &enc));
  nwc_k_tensor k;
  NW(nwc_k_tensor_upload(&enc, &k, stream));
  nwc_tensor_release(&enc);
  int64_t sb = nwc_k_scratch_bytes(&k, 1);
  void *scratch = NULL;
  float *x = NULL, *y = NULL, *hx = calloc(t->k16, 4), *hy = malloc(M * 4);
  CU(cudaMalloc(&scratch, sb > 0 ? (size_t)sb : 4));
  CU(cudaMemsetAsync(scratch, 0, sb > 0 ? (size_t)sb : 4, stream)); /* zeroed once (nwc_k_scratch_bytes) */
  CU(cudaMalloc((void **)&x, t->k16 * 4));
  CU(cudaMalloc((void **)&y, M * 4));
  for (uint64_t i = 0; i < K; i++) hx[i] = (float)sin((double)i);
  CU(cudaMemcpy(x, hx, t->k16 * 4, cudaMemcpyHostToDevice));
  side mapped = {m, t, NULL, NULL, x, y}, bare = {NULL, t, &k, scratch, x, y};
  double tm[3], tb[3];
  time_side(&mapped, tm);
  time_side(&bare, tb);
  double *sk = malloc(iters * sizeof *sk);
  for (unsigned i = 0; i < iters; i++) {
    double t0 = now_us();
    NW(nwc_client_matvec(c, "m", "mv", NULL, 1.0f, hx, K, 1, 0, hy, M * 4, NULL));
    sk[i] = now_us() - t0;
  }
  printf("{\"bench\":\"gpu_map_call\",\"rows\":%llu,\"cols\":%llu,\"layout\":%u,\"iters\":%u,"
         "\"mapped_event_us\":%.2f,\"bare_event_us\":%.2f,\"mapped_wall_us\":%.2f,"
         "\"bare_wall_us\":%.2f,\"mapped_graph_us\":%.2f,\"bare_graph_us\":%.2f,"
         "\"socket_wall_us\":%.2f,\"mapped_minus_bare_wall_us\":%.2f}\n",
         (unsigned long long)M, (unsigned long long)K, layout, iters, tm[0], tb[0], tm[1], tb[1],
         tm[2], tb[2], median(sk, iters), tm[1] - tb[1]);
  fflush(stdout);
  nwc_k_tensor_free(&k);
  cudaFree(scratch), cudaFree(x), cudaFree(y);
  free(hx), free(hy), free(sk);
}

/* ---- the token step ------------------------------------------------------------------------ */

typedef struct linear {
  const nwc_cuda_tensor *t; /* mapped */
  nwc_k_tensor own;
  uint16_t *wb;              /* cuBLAS: this layer's BF16 copy */
  int shape;
} linear;

typedef struct stepbufs {
  float *x[MATS];       /* K16 floats */
  uint16_t *xb[MATS];   /* BF16 x for cuBLAS */
  uint16_t *y[MATS];    /* rows BF16 */
  void *scratch;
} stepbufs;

typedef struct step_ctx {
  const nwc_cuda_map *m;
  linear *L;
  size_t n;
  stepbufs *b;
  cublasHandle_t blas;
} step_ctx;

static void run_mapped(void *p) {
  step_ctx *s = p;
  for (size_t i = 0; i < s->n; i++)
    NW(nwc_cuda_linear(s->m, s->L[i].t, s->b->x[s->L[i].shape], NULL, s->b->y[s->L[i].shape],
                       stream));
}
static void run_own(void *p) {
  step_ctx *s = p;
  for (size_t i = 0; i < s->n; i++)
    NW(nwc_k_linear_bf16(&s->L[i].own, s->b->x[s->L[i].shape], NULL, s->b->y[s->L[i].shape],
                         s->b->scratch, stream));
}
static void run_blas(void *p) {
  step_ctx *s = p;
  const float one = 1.f, zero = 0.f;
  for (size_t i = 0; i < s->n; i++) {
    const int sh = s->L[i].shape, m = (int)shapes[sh][0], k = (int)shapes[sh][1];
    cublasStatus_t st = cublasGemmEx(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, 1, k, &one, s->L[i].wb,
                                     CUDA_R_16BF, k, s->b->xb[sh], CUDA_R_16BF, k, &zero,
                                     s->b->y[sh], CUDA_R_16BF, m, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) DIE("cublasGemmEx: status %d", (int)st);
  }
}

static void bench_step(const nwc_cuda_map *m, uint16_t *const w[MATS]) {
  size_t n = (size_t)layers * (MATS - 1) + 1;
  linear *L = calloc(n, sizeof *L);
  stepbufs b = {0};
  nwc_tensor enc[MATS];
  int64_t sb = 0;
  double weights = 0, mapped_bytes = 0;
  for (int i = 0; i < MATS; i++) {
    const uint64_t R = shapes[i][0], C = shapes[i][1];
    NW(nwc_tensor_encode(w[i], R, C, NWC_ELEM(NWC_ELEM_BF16, layout), NULL, &enc[i]));
    uint64_t lay[4];
    NW(nwc_layout(R, C, NWC_ELEM(NWC_ELEM_BF16, layout), lay));
    float *hx = calloc(lay[NWC_LAYOUT_K16], 4);
    uint16_t *hb = calloc(C, 2);
    for (uint64_t k = 0; k < C; k++) hx[k] = (float)sin((double)k * 0.7), hb[k] = nwc_f32_to_bf16(hx[k]);
    CU(cudaMalloc((void **)&b.x[i], lay[NWC_LAYOUT_K16] * 4));
    CU(cudaMalloc((void **)&b.xb[i], C * 2));
    CU(cudaMalloc((void **)&b.y[i], R * 2));
    CU(cudaMemcpy(b.x[i], hx, lay[NWC_LAYOUT_K16] * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(b.xb[i], hb, C * 2, cudaMemcpyHostToDevice));
    free(hx), free(hb);
  }
  char name[64];
  for (size_t j = 0; j < n; j++) {
    unsigned l = (unsigned)(j / (MATS - 1));
    int i = j == n - 1 ? MATS - 1 : (int)(j % (MATS - 1));
    step_name(name, sizeof name, l, i);
    L[j].shape = i;
    if (!(L[j].t = nwc_cuda_find(m, name))) DIE("%s is not in the map", name);
    NW(nwc_k_tensor_upload(&enc[i], &L[j].own, stream));
    int64_t s = nwc_k_scratch_bytes(&L[j].own, 1);
    if (s > sb) sb = s;
    const uint64_t R = shapes[i][0], C = shapes[i][1];
    CU(cudaMalloc((void **)&L[j].wb, R * C * 2));
    CU(cudaMemcpy(L[j].wb, w[i], R * C * 2, cudaMemcpyHostToDevice));
    weights += (double)R * C, mapped_bytes += (double)L[j].t->bytes;
  }
  for (int i = 0; i < MATS; i++) nwc_tensor_release(&enc[i]);
  CU(cudaMalloc(&b.scratch, sb > 0 ? (size_t)sb : 4));
  CU(cudaMemsetAsync(b.scratch, 0, sb > 0 ? (size_t)sb : 4, stream)); /* zeroed once (nwc_k_scratch_bytes) */
  step_ctx s = {m, L, n, &b, NULL};
  if (cublasCreate(&s.blas) != CUBLAS_STATUS_SUCCESS) DIE("cublasCreate");
  cublasSetStream(s.blas, stream);
  double tm = time_graph(run_mapped, &s, 1), to = time_graph(run_own, &s, 1);
  double tb = time_graph(run_blas, &s, 1);
  printf("{\"bench\":\"gpu_map_token_step\",\"model\":\"qwen3-4b-shaped\",\"layers\":%u,"
         "\"layout\":%u,\"linears\":%zu,\"weights\":%.0f,\"mapped_bytes\":%.0f,"
         "\"mapped_graph_us\":%.1f,\"own_graph_us\":%.1f,\"cublas_graph_us\":%.1f,"
         "\"mapped_over_own\":%.4f,\"cublas_over_mapped\":%.3f}\n",
         layers, layout, n, weights, mapped_bytes, tm, to, tb, tm / to, tb / tm);
  fflush(stdout);
  cublasDestroy(s.blas);
  for (size_t j = 0; j < n; j++) nwc_k_tensor_free(&L[j].own), cudaFree(L[j].wb);
  for (int i = 0; i < MATS; i++) cudaFree(b.x[i]), cudaFree(b.xb[i]), cudaFree(b.y[i]);
  cudaFree(b.scratch);
  free(L);
}

/* A mapping client (--child SOCK): makes its CUDA context, says "ready", maps the model when its
 * parent says so, says "mapped", and unmaps and exits when its stdin closes. */
static int child(const char *sock) {
  char line[16];
  if (cudaSetDevice(0) != cudaSuccess || cudaFree(0) != cudaSuccess) return 1;
  printf("ready\n");
  fflush(stdout);
  if (!fgets(line, sizeof line, stdin)) return 1;
  nwc_client *c = NULL;
  nwc_cuda_map *m = NULL;
  if (nwc_client_connect(sock, &c) < 0 || nwc_cuda_map_model(c, "m", 0, &m) < 0) {
    fprintf(stderr, "nwc_gpu_map_bench child: %s %s\n", nwc_client_last_error(), nwc_cuda_last_error());
    return 1;
  }
  printf("mapped %zu\n", nwc_cuda_count(m));
  fflush(stdout);
  while (fgets(line, sizeof line, stdin)) {
  }
  nwc_cuda_unmap(m);
  nwc_client_free(c);
  return 0;
}

/* Each of n lines from the children's pipes, or false. */
static bool read_lines(FILE *const *from, unsigned n, const char *want) {
  char line[64];
  for (unsigned i = 0; i < n; i++)
    if (!fgets(line, sizeof line, from[i]) || strncmp(line, want, strlen(want))) return false;
  return true;
}

static void bench_procs(const char *self, const char *sock, unsigned procs, uint64_t model_bytes,
                        uint64_t bf16_bytes) {
  pid_t pid[64];
  FILE *to[64], *from[64];
  for (unsigned i = 0; i < procs; i++) {
    int in[2], out[2];
    if (pipe(in) || pipe(out)) DIE("pipe");
    if ((pid[i] = fork()) < 0) DIE("fork");
    if (pid[i] == 0) {
      dup2(in[0], 0), dup2(out[1], 1);
      close(in[0]), close(in[1]), close(out[0]), close(out[1]);
      execl(self, self, "--child", sock, (char *)NULL);
      _exit(127);
    }
    close(in[0]), close(out[1]);
    to[i] = fdopen(in[1], "w"), from[i] = fdopen(out[0], "r");
  }
  size_t free0 = 0, free1 = 0, total = 0;
  if (!read_lines(from, procs, "ready")) DIE("a child did not start");
  CU(cudaMemGetInfo(&free0, &total));
  for (unsigned i = 0; i < procs; i++) fputs("go\n", to[i]), fflush(to[i]);
  if (!read_lines(from, procs, "mapped")) DIE("a child did not map the model");
  CU(cudaMemGetInfo(&free1, &total));
  for (unsigned i = 0; i < procs; i++) fclose(to[i]);
  int bad = 0;
  for (unsigned i = 0; i < procs; i++) {
    int st = 0;
    waitpid(pid[i], &st, 0);
    bad += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    fclose(from[i]);
  }
  const double maps = (double)free0 - (double)free1;
  printf("{\"bench\":\"gpu_map_procs\",\"procs\":%u,\"model_device_bytes\":%llu,\"model_bf16_bytes\":%llu,"
         "\"maps_bytes\":%.0f,\"weights_total_bytes\":%.0f,\"children_failed\":%d}\n",
         procs, (unsigned long long)model_bytes, (unsigned long long)bf16_bytes, maps,
         (double)model_bytes + maps, bad);
  fflush(stdout);
}

int main(int argc, char **argv) {
  const char *nwcd = NWCD_PATH;
  bool keep = false;
  unsigned procs = 8;
  if (argc == 3 && !strcmp(argv[1], "--child")) return child(argv[2]);
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--rows") && i + 1 < argc) M = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--cols") && i + 1 < argc) K = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--layout") && i + 1 < argc) layout = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--no-step")) step = false;
    else if (!strcmp(argv[i], "--nwcd") && i + 1 < argc) nwcd = argv[++i];
    else if (!strcmp(argv[i], "--keep")) keep = true;
    else if (!strcmp(argv[i], "--procs") && i + 1 < argc) procs = (unsigned)atoi(argv[++i]);
    else
      return fprintf(stderr, "usage: nwc_gpu_map_bench [--rows M] [--cols K] [--iters N] "
                             "[--layers L] [--layout 0|2] [--no-step] [--procs P] [--nwcd PATH] [--keep]\n"),
             2;
  }
  if (M < 8 || K < 16 || iters < 10 || layers < 1 || (layout != 0 && layout != 2) || procs > 64)
    return fprintf(stderr, "nwc_gpu_map_bench: bad sizes or layout\n"), 2;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1)
    return fprintf(stderr, "nwc_gpu_map_bench: no GPU\n"), 77;
  char dir[] = "/tmp/nwc-gpu-map-XXXXXX", sock[64], store[64], file[80];
  if (!mkdtemp(dir)) DIE("mkdtemp");
  snprintf(sock, sizeof sock, "%s/nwcd.sock", dir);
  snprintf(store, sizeof store, "%s/store", dir);
  snprintf(file, sizeof file, "%s/model.safetensors", dir);
  uint16_t *mv = synth(M * K, 99), *w[MATS] = {0};
  for (int i = 0; step && i < MATS; i++) w[i] = synth(shapes[i][0] * shapes[i][1], (uint64_t)i + 1);
  double t0 = now_s();
  write_model(file, mv, w);
  fprintf(stderr, "model written: %.1f s\n", now_s() - t0);
  pid_t pid = nwc_bench_nwcd_start(nwcd, store, sock, "cuda", NULL);
  if (pid <= 0) DIE("nwcd did not start (%s)", nwcd);
  nwc_client *c = NULL;
  nwc_client_import_opts opts = {.layout = layout};
  t0 = now_s();
  if (nwc_client_connect(sock, &c) < 0 || nwc_client_import(c, "m", file, &opts, NULL) < 0 ||
      nwc_client_load_on(c, "m", NULL, 0, NULL, NULL, NULL) < 0) {
    fprintf(stderr, "nwc_gpu_map_bench: %s\n", nwc_client_last_error());
    nwc_bench_nwcd_stop(pid);
    return 1;
  }
  fprintf(stderr, "imported and loaded onto cuda:0: %.1f s\n", now_s() - t0);
  unlink(file); /* the store holds it now */
  CU(cudaSetDevice(0));
  CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  nwc_cuda_map *m = NULL;
  t0 = now_s();
  NW(nwc_cuda_map_model(c, "m", 0, &m));
  fprintf(stderr, "mapped %zu tensors: %.3f s, access %s\n", nwc_cuda_count(m),
          now_s() - t0, nwc_cuda_read_only(m) ? "read-only" : "read-write");
  bench_call(c, m, mv);
  if (step) bench_step(m, w);
  if (procs) {
    uint64_t dev = 0, bf16 = M * K * 2;
    for (size_t i = 0; i < nwc_cuda_count(m); i++) dev += nwc_cuda_at(m, i)->bytes;
    for (int i = 0; step && i < MATS; i++) bf16 += (uint64_t)(i < MATS - 1 ? layers : 1) * shapes[i][0] * shapes[i][1] * 2;
    bench_procs("/proc/self/exe", sock, procs, dev, bf16);
  }
  nwc_cuda_unmap(m);
  nwc_client_free(c);
  nwc_bench_nwcd_stop(pid);
  for (int i = 0; i < MATS; i++) free(w[i]);
  free(mv);
  if (keep) printf("%s\n", dir);
  else nwc_bench_remove_dir(dir);
  return 0;
}
