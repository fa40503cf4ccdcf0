/*
 * nwc_gpu_bench.c - the CUDA kernels (layouts 0, 1 and 2) against cuBLAS BF16 GEMV and the plain fp8 matvec on
 * one GPU.  Prints one JSON object per measurement on stdout, then a table.
 *
 *   nwc_gpu_bench [--quick] [--layout 0|1|2] [--cols 1..8] [--x fp32|bf16] [--token-step] [--token-step-hf] [--no-shapes]
 *                 [--sample FILE.safetensors] [--floor-tbps T] [--shape MxK]... [--timeline FILE]
 *
 * --layout picks the tensors' layout (BF16 and fp8; fp8 with 1 column), --cols the columns of x
 * multiplied in one call, against cublasGemmEx with as many columns; --x the type of x that nwc
 * reads (fp32 by default: nwc_k_matvec_cols; bf16: nwc_k_matvec_cols_bf16x, layouts 1 and 2, the
 * same BF16 x that cuBLAS reads).  --token-step adds every
 * linear of a Qwen3-4B-shaped model in one graph (bench_token_step), its layers' matrices fused as
 * engines fuse them; --token-step-hf the same model with transformers' unfused linears (q, k, v,
 * o, gate, up, down: what nwc.torch's patched model runs, bench/nwc_torch_bench.py); --no-shapes
 * leaves out the nine shapes and the sample.
 *
 * --shape (repeatable) replaces the nine shapes and leaves out the sample model (for profiling).
 * --timeline FILE appends each shape's per-warp timeline of the last launches of nwc's graph
 * (nwc_k_timeline_dump: kernels built with -DNWC_KERNEL_TIMELINE=ON; scripts/timeline-summary).
 *
 * Method (../shared/DEVICE.md): each side's weights are copied several times so that the copies
 * together are at least four times the L2, and consecutive calls rotate over them; the per-call
 * time is that of many back-to-back calls captured in one CUDA graph (graph time / calls, median
 * of the replays), the single-launch time is one call between two events (median).  Both sides
 * are timed the same way.  Weights: normal, with log-normal per-row scales and a heavy tail (one
 * weight in a thousand times 30), rounded to BF16; fp8 by nwc_quantize_fp8 of the same weights.
 * Floors: compressed bytes (streams + raw plane + headers) over the read bandwidth given by
 * --floor-tbps (4.52 TB/s, a 16-byte-load read kernel on the H200).  "clk/64w" is SM clocks per
 * 64 weights per SM: time * SM clock * SMs / (weights / 64), at the device's reported clock.
 */
#include "nwc.h"
#include "nwc_kernels.h"
#include "safetensors.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BENCH_NAME "nwc_gpu_bench"
#include "gpu_die.h"

#define NW(expr)                                                                                 \
  do {                                                                                           \
    int r_ = (expr);                                                                             \
    if (r_ < 0) DIE("%s: %d (%s; cuda %d)", #expr, r_, nwc_strerror(r_), nwc_k_last_cuda_error()); \
  } while (0)

static cudaStream_t stream;
static cublasHandle_t blas;
static double l2_bytes, floor_bps = 4.52e12, sm_clock_hz;
static int sms, quick;
static unsigned layout, ncols = 1; /* --layout, --cols */
static int x_bf16;                  /* --x bf16 */
static int token_step, token_step_hf; /* --token-step, --token-step-hf */
static const char *timeline;           /* --timeline FILE */
static const char *timeline_tag;       /* the shape whose graph time_calls records next */

/* ---- random weights ----------------------------------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static inline uint64_t next64(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return rng;
}
/* Standard normal by inversion of a 4096-step table with linear interpolation. */
static float ntab[4097];
static void init_normal(void) {
  for (int i = 0; i <= 4096; i++) { /* Acklam-free: bisection on erfc, once */
    double p = (i + 0.5) / 4097.0, lo = -9, hi = 9;
    for (int k = 0; k < 60; k++) {
      double mid = 0.5 * (lo + hi);
      if (0.5 * erfc(-mid / sqrt(2.0)) < p) lo = mid; else hi = mid;
    }
    ntab[i] = (float)lo;
  }
}
static inline float normal(void) {
  uint64_t r = next64();
  unsigned i = (unsigned)(r >> 52);
  float f = (float)((r >> 20) & 0xffffffffu) * 0x1p-32f;
  return ntab[i] + f * (ntab[i + 1] - ntab[i]);
}

/* ncols columns of K16 floats: K normal values each, zeros after. */
static float *make_x(uint64_t K, uint64_t K16) {
  float *x = calloc(K16 * ncols, 4);
  if (!x) DIE("out of memory");
  for (unsigned i = 0; i < ncols; i++)
    for (uint64_t c = 0; c < K; c++) x[i * K16 + c] = normal();
  return x;
}

static uint16_t *make_weights(uint64_t M, uint64_t K) {
  uint16_t *w = malloc(M * K * 2);
  if (!w) DIE("out of memory");
  for (uint64_t r = 0; r < M; r++) {
    float s = 0.02f * expf(0.5f * normal());
    for (uint64_t c = 0; c < K; c++) {
      float v = normal() * s;
      if ((next64() & 1023) == 0) v *= 30.f;
      w[r * K + c] = nwc_f32_to_bf16(v);
    }
  }
  return w;
}

/* ---- timing -------------------------------------------------------------------------------- */

typedef void (*call_fn)(void *ctx, int copy);

static int cmp_f(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}
static float median(float *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_f);
  return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

/* Per-call microseconds in a graph of `calls` rotated calls (median of replays) and of a single
 * launch between events (median). */
static void time_calls(call_fn fn, void *ctx, int copies, double *graph_us, double *single_us) {
  int calls = copies * ((40 + copies - 1) / copies), reps = quick ? 5 : 15;
  for (int i = 0; i < copies; i++) fn(ctx, i); /* warm-up */
  CU(cudaStreamSynchronize(stream));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CU(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; i++) fn(ctx, i % copies);
  CU(cudaStreamEndCapture(stream, &g));
  CU(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CU(cudaEventCreate(&a));
  CU(cudaEventCreate(&b));
  float t[64];
  CU(cudaGraphLaunch(ge, stream));
  for (int r = 0; r < reps; r++) {
    CU(cudaEventRecord(a, stream));
    CU(cudaGraphLaunch(ge, stream));
    CU(cudaEventRecord(b, stream));
    CU(cudaEventSynchronize(b));
    CU(cudaEventElapsedTime(&t[r], a, b));
    t[r] *= 1000.f / (float)calls;
  }
  *graph_us = median(t, reps);
  if (timeline_tag) { /* the graph's last launches, before the single launches below */
    NW(nwc_k_timeline_dump(timeline, timeline_tag));
    timeline_tag = NULL;
  }
  int singles = quick ? 11 : 41;
  for (int r = 0; r < singles; r++) {
    CU(cudaEventRecord(a, stream));
    fn(ctx, r % copies);
    CU(cudaEventRecord(b, stream));
    CU(cudaEventSynchronize(b));
    CU(cudaEventElapsedTime(&t[r], a, b));
    t[r] *= 1000.f;
  }
  *single_us = median(t, singles);
  CU(cudaGraphExecDestroy(ge));
  CU(cudaGraphDestroy(g));
  CU(cudaEventDestroy(a));
  CU(cudaEventDestroy(b));
}

static int copies_for(double bytes) {
  int n = (int)ceil(4.0 * l2_bytes / bytes);
  return n < 2 ? 2 : n > 32 ? 32 : n;
}

/* ---- the sides ----------------------------------------------------------------------------- */

#define MAX_COPIES 40 /* rotation copies, or the token step's 36 layers */

typedef struct nwc_side {
  nwc_k_tensor t[MAX_COPIES];
  int copies;
  float *x, *bias, *scratch;
  uint16_t *xb; /* x in BF16 (--x bf16) */
  uint64_t ldx; /* K16: the columns of x */
  uint16_t *y;
  double bytes; /* compressed bytes a call reads */
} nwc_side;

static void nwc_linear_call(void *ctx, int c) {
  nwc_side *s = ctx;
  if (x_bf16)
    NW(nwc_k_matvec_cols_bf16x(&s->t[c], s->xb, ncols, s->ldx, s->bias, NULL, s->y, s->t[c].rows, s->scratch,
                               stream));
  else
    NW(nwc_k_matvec_cols(&s->t[c], s->x, ncols, s->ldx, s->bias, NULL, s->y, s->t[c].rows, s->scratch,
                         stream));
}

typedef struct { nwc_side *s; uint16_t *out; } dq_ctx;
static void nwc_dequant_call(void *ctx, int c) {
  dq_ctx *d = ctx;
  NW(nwc_k_dequant(&d->s->t[c], d->out, stream));
}

typedef struct { nwc_side *s; uint16_t *out; uint64_t *rows; uint64_t n; } gather_ctx;
static void nwc_gather_call(void *ctx, int c) {
  gather_ctx *g = ctx;
  NW(nwc_k_gather(&g->s->t[c], g->rows, g->n, g->out, stream));
}

/* Uploads t once and makes device copies for rotation. */
static void nwc_side_init(nwc_side *s, const nwc_tensor *t, int copies) {
  memset(s, 0, sizeof *s);
  NW(nwc_k_tensor_upload(t, &s->t[0], stream));
  uint64_t lay[4];
  NW(nwc_layout(t->rows, t->cols, t->elem, lay));
  /* upload's layout: one allocation from the table to the end of scale */
  size_t total = (size_t)((const uint8_t *)(s->t[0].scale ? (const void *)(s->t[0].scale + t->rows)
                                                         : (const void *)(s->t[0].raw + t->raw_bytes)) -
                          (const uint8_t *)s->t[0].owned);
  for (int i = 1; i < copies; i++) {
    uint8_t *mem;
    CU(cudaMalloc((void **)&mem, total));
    CU(cudaMemcpy(mem, s->t[0].owned, total, cudaMemcpyDeviceToDevice));
    nwc_k_tensor *d = &s->t[i];
    *d = s->t[0];
    ptrdiff_t off = mem - (uint8_t *)s->t[0].owned;
    d->tab = (const uint32_t *)((const uint8_t *)d->tab + off);
    d->bases = (const uint64_t *)((const uint8_t *)d->bases + off);
    d->hdr += off, d->data += off, d->raw += off;
    if (d->scale) d->scale = (const float *)((const uint8_t *)d->scale + off);
    d->owned = mem;
  }
  s->copies = copies;
  s->bytes = (double)t->data_bytes + (double)t->raw_bytes + (double)t->nblocks * (8 + NWC_LANES);
  s->ldx = lay[NWC_LAYOUT_K16];
  int64_t scratch = nwc_k_scratch_bytes(&s->t[0], ncols);
  NW(scratch);
  CU(cudaMalloc((void **)&s->x, s->ldx * ncols * 4));
  if (x_bf16) CU(cudaMalloc((void **)&s->xb, s->ldx * ncols * 2));
  CU(cudaMalloc((void **)&s->bias, t->rows * 4));
  CU(cudaMalloc((void **)&s->scratch, (size_t)scratch));
  CU(cudaMemset(s->scratch, 0, (size_t)scratch)); /* zeroed once (nwc_k_scratch_bytes), */
  CU(cudaDeviceSynchronize());                     /* before the stream's kernels */
  CU(cudaMalloc((void **)&s->y, t->rows * 2 * ncols));
  CU(cudaMemset(s->bias, 0, t->rows * 4));
}

/* x: ncols columns of K16 floats (and as BF16 with --x bf16) */
static void nwc_side_set_x(nwc_side *s, const float *x, uint64_t K16) {
  CU(cudaMemcpy(s->x, x, K16 * ncols * 4, cudaMemcpyHostToDevice));
  if (!x_bf16) return;
  uint16_t *xb = malloc(K16 * ncols * 2);
  if (!xb) DIE("out of memory");
  for (uint64_t i = 0; i < K16 * ncols; i++) xb[i] = nwc_f32_to_bf16(x[i]);
  CU(cudaMemcpy(s->xb, xb, K16 * ncols * 2, cudaMemcpyHostToDevice));
  free(xb);
}

static void nwc_side_free(nwc_side *s) {
  for (int i = 0; i < s->copies; i++) nwc_k_tensor_free(&s->t[i]);
  cudaFree(s->x), cudaFree(s->xb), cudaFree(s->bias), cudaFree(s->scratch), cudaFree(s->y);
}

typedef struct blas_side {
  uint16_t *w[MAX_COPIES];
  int copies;
  uint16_t *x, *y;
  int M, K;
} blas_side;

static void blas_call(void *ctx, int c) {
  blas_side *b = ctx;
  const float one = 1.f, zero = 0.f;
  /* W row-major M x K is column-major K x M: y = W^T(col) x. */
  CB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, b->M, (int)ncols, b->K, &one, b->w[c], CUDA_R_16BF, b->K,
                  b->x, CUDA_R_16BF, b->K, &zero, b->y, CUDA_R_16BF, b->M, CUBLAS_COMPUTE_32F,
                  CUBLAS_GEMM_DEFAULT));
}

/* x: ncols columns of K16 floats */
static void blas_side_init(blas_side *b, const uint16_t *w, uint64_t M, uint64_t K, const float *x,
                           uint64_t K16) {
  memset(b, 0, sizeof *b);
  b->M = (int)M, b->K = (int)K;
  b->copies = copies_for((double)M * K * 2);
  for (int i = 0; i < b->copies; i++) {
    CU(cudaMalloc((void **)&b->w[i], M * K * 2));
    if (i == 0)
      CU(cudaMemcpy(b->w[0], w, M * K * 2, cudaMemcpyHostToDevice));
    else
      CU(cudaMemcpy(b->w[i], b->w[0], M * K * 2, cudaMemcpyDeviceToDevice));
  }
  uint16_t *xb = malloc(K * 2 * ncols);
  for (unsigned i = 0; i < ncols; i++)
    for (uint64_t c = 0; c < K; c++) xb[i * K + c] = nwc_f32_to_bf16(x[i * K16 + c]);
  CU(cudaMalloc((void **)&b->x, K * 2 * ncols));
  CU(cudaMalloc((void **)&b->y, M * 2 * ncols));
  CU(cudaMemcpy(b->x, xb, K * 2 * ncols, cudaMemcpyHostToDevice));
  free(xb);
}

/* Exactly n copies of b's weights (more made from the first, extra ones freed). */
static void blas_side_copies(blas_side *b, int n) {
  const size_t bytes = (size_t)b->M * b->K * 2;
  for (int c = b->copies; c < n; c++) {
    CU(cudaMalloc((void **)&b->w[c], bytes));
    CU(cudaMemcpy(b->w[c], b->w[0], bytes, cudaMemcpyDeviceToDevice));
  }
  for (int c = n; c < b->copies; c++) CU(cudaFree(b->w[c]));
  b->copies = n;
}

static void blas_side_free(blas_side *b) {
  for (int i = 0; i < b->copies; i++) cudaFree(b->w[i]);
  cudaFree(b->x), cudaFree(b->y);
}

typedef struct fp8_side {
  uint8_t *q[32];
  int copies;
  float *scale;
  const float *x;
  uint16_t *y;
  uint64_t M, K;
} fp8_side;

static void fp8_call(void *ctx, int c) {
  fp8_side *f = ctx;
  NW(nwc_k_ref_fp8(f->q[c], f->M, f->K, f->x, f->scale, NULL, f->y, stream));
}

/* ---- output ------------------------------------------------------------------------------- */

#define MAX_ROWS 64
static struct row {
  char name[48];
  double nwc_us, blas_us, nwc_single, blas_single, floor_us, ratio_bytes, fp8_us, ref8_us, dq_tbps,
      clk64;
} rows[MAX_ROWS];
static int nrows;

static double clk64(double us, uint64_t M, uint64_t K) {
  return us * 1e-6 * sm_clock_hz * sms / ((double)M * K / 64.0);
}

/* Max |a - b| / max|b| over two BF16 vectors on the device (a sanity check of the timed calls). */
static double bf16_diff(const uint16_t *d_a, const uint16_t *d_b, uint64_t n) {
  uint16_t *a = malloc(n * 2), *b = malloc(n * 2);
  CU(cudaMemcpy(a, d_a, n * 2, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(b, d_b, n * 2, cudaMemcpyDeviceToHost));
  double md = 0, mb = 0;
  for (uint64_t i = 0; i < n; i++) {
    double x = nwc_bf16_to_f32(a[i]), y = nwc_bf16_to_f32(b[i]);
    md = fmax(md, fabs(x - y));
    mb = fmax(mb, fabs(y));
  }
  free(a), free(b);
  return mb > 0 ? md / mb : md;
}

static void bench_shape(uint64_t M, uint64_t K) {
  double t0 = (double)clock() / CLOCKS_PER_SEC;
  uint16_t *w = make_weights(M, K);
  uint64_t lay[4];
  NW(nwc_layout(M, K, NWC_ELEM(NWC_ELEM_BF16, layout), lay));
  uint64_t K16 = lay[NWC_LAYOUT_K16];
  float *x = make_x(K, K16);
  nwc_tensor t;
  NW(nwc_tensor_encode(w, M, K, NWC_ELEM(NWC_ELEM_BF16, layout), NULL, &t));
  fprintf(stderr, "%llux%llu: made and encoded in %.1f s\n", (unsigned long long)M,
          (unsigned long long)K, (double)clock() / CLOCKS_PER_SEC - t0);

  struct row *row = &rows[nrows++];
  snprintf(row->name, sizeof row->name, "%llux%llu", (unsigned long long)M, (unsigned long long)K);
  nwc_side ns;
  double nbytes = (double)t.data_bytes + (double)t.raw_bytes + (double)t.nblocks * (8 + NWC_LANES);
  nwc_side_init(&ns, &t, copies_for(nbytes));
  nwc_side_set_x(&ns, x, K16);
  blas_side bs;
  blas_side_init(&bs, w, M, K, x, K16);
  if (timeline) { /* only nwc's graph of this shape: what ran before is dropped */
    NW(nwc_k_timeline_dump(NULL, NULL));
    timeline_tag = row->name;
  }
  time_calls(nwc_linear_call, &ns, ns.copies, &row->nwc_us, &row->nwc_single);
  time_calls(blas_call, &bs, bs.copies, &row->blas_us, &row->blas_single);
  double agree = bf16_diff(ns.y, bs.y, M * ncols);
  row->floor_us = ns.bytes / floor_bps * 1e6;
  row->ratio_bytes = ns.bytes / ((double)M * K * 2);
  row->clk64 = clk64(row->nwc_us, M, K);
  printf("{\"bench\":\"linear_bf16\",\"layout\":%u,\"cols\":%u,\"x\":\"%s\",\"shape\":\"%s\",\"nwc_graph_us\":%.2f,\"nwc_single_us\":%.2f,"
         "\"cublas_graph_us\":%.2f,\"cublas_single_us\":%.2f,\"speedup_graph\":%.3f,"
         "\"nwc_bytes\":%.0f,\"bytes_ratio\":%.4f,\"floor_us\":%.2f,\"nwc_tbps\":%.3f,"
         "\"cublas_tbps\":%.3f,\"clk_per_64w\":%.2f,\"copies\":[%d,%d],\"max_rel_diff_vs_cublas\":%.2e}\n",
         layout, ncols, x_bf16 ? "bf16" : "fp32", row->name, row->nwc_us, row->nwc_single, row->blas_us, row->blas_single,
         row->blas_us / row->nwc_us, ns.bytes, row->ratio_bytes, row->floor_us,
         ns.bytes / row->nwc_us * 1e-6, (double)M * K * 2 / row->blas_us * 1e-6, row->clk64,
         ns.copies, bs.copies, agree);
  fflush(stdout);
  blas_side_free(&bs);

  /* dequant: BF16 output bytes per second */
  dq_ctx dq = {&ns, NULL};
  CU(cudaMalloc((void **)&dq.out, M * K16 * 2));
  double dq_us, dq_single;
  time_calls(nwc_dequant_call, &dq, ns.copies, &dq_us, &dq_single);
  row->dq_tbps = (double)M * K16 * 2 / dq_us * 1e-6;
  printf("{\"bench\":\"dequant_bf16\",\"shape\":\"%s\",\"graph_us\":%.2f,\"single_us\":%.2f,"
         "\"out_tbps\":%.3f,\"read_plus_write_tbps\":%.3f}\n",
         row->name, dq_us, dq_single, row->dq_tbps, ((double)M * K16 * 2 + ns.bytes) / dq_us * 1e-6);

  /* gather latency on the embedding-sized shape */
  if (M >= 100000) {
    for (uint64_t n = 1; n <= 64; n *= 8) {
      gather_ctx g = {&ns, dq.out, NULL, n};
      uint64_t *r = malloc(n * 8);
      for (uint64_t i = 0; i < n; i++) r[i] = next64() % M;
      CU(cudaMalloc((void **)&g.rows, n * 8));
      CU(cudaMemcpy(g.rows, r, n * 8, cudaMemcpyHostToDevice));
      double gu, gs;
      time_calls(nwc_gather_call, &g, ns.copies, &gu, &gs);
      printf("{\"bench\":\"gather\",\"shape\":\"%s\",\"rows\":%llu,\"graph_us\":%.2f,\"single_us\":%.2f}\n",
             row->name, (unsigned long long)n, gu, gs);
      cudaFree(g.rows);
      free(r);
    }
  }
  cudaFree(dq.out);
  nwc_side_free(&ns);
  nwc_tensor_release(&t);

  /* fp8: NWC linear on the quantized weights against the plain fp8 matvec (1 column) */
  if (ncols != 1) {
    free(x), free(w);
    return;
  }
  uint8_t *q = malloc(M * K);
  float *scale = malloc(M * 4);
  NW(nwc_quantize_fp8(w, M, K, q, scale));
  NW(nwc_tensor_encode(q, M, K, NWC_ELEM(NWC_ELEM_FP8, layout), scale, &t));
  nbytes = (double)t.data_bytes + (double)t.raw_bytes + (double)t.nblocks * (8 + NWC_LANES);
  nwc_side_init(&ns, &t, copies_for(nbytes));
  nwc_side_set_x(&ns, x, K16);
  fp8_side fs = {.M = M, .K = K, .x = ns.x, .copies = copies_for((double)M * K)};
  for (int i = 0; i < fs.copies; i++) {
    CU(cudaMalloc((void **)&fs.q[i], M * K));
    CU(cudaMemcpy(fs.q[i], q, M * K, cudaMemcpyHostToDevice));
  }
  CU(cudaMalloc((void **)&fs.scale, M * 4));
  CU(cudaMemcpy(fs.scale, scale, M * 4, cudaMemcpyHostToDevice));
  CU(cudaMalloc((void **)&fs.y, M * 2));
  double fs_single, ns_single;
  if (K % 16 == 0) {
    time_calls(nwc_linear_call, &ns, ns.copies, &row->fp8_us, &ns_single);
    time_calls(fp8_call, &fs, fs.copies, &row->ref8_us, &fs_single);
    printf("{\"bench\":\"linear_fp8\",\"shape\":\"%s\",\"nwc_graph_us\":%.2f,\"nwc_single_us\":%.2f,"
           "\"ref_fp8_graph_us\":%.2f,\"ref_fp8_single_us\":%.2f,\"speedup_graph\":%.3f,"
           "\"bytes_ratio_vs_fp8\":%.4f,\"ref_fp8_tbps\":%.3f,\"max_rel_diff_vs_ref\":%.2e}\n",
           row->name, row->fp8_us, ns_single, row->ref8_us, fs_single, row->ref8_us / row->fp8_us,
           nbytes / ((double)M * K), (double)M * K / row->ref8_us * 1e-6, bf16_diff(ns.y, fs.y, M));
  }
  fflush(stdout);
  for (int i = 0; i < fs.copies; i++) cudaFree(fs.q[i]);
  cudaFree(fs.scale), cudaFree(fs.y);
  nwc_side_free(&ns);
  nwc_tensor_release(&t);
  free(q), free(scale), free(x), free(w);
}

/* The sample model: every 2-D tensor as one linear, the whole model per graph step. */
typedef struct model_ctx {
  int n;
  nwc_side *ns;
  blas_side *bs;
} model_ctx;
static void model_nwc(void *ctx, int c) {
  model_ctx *m = ctx;
  for (int i = 0; i < m->n; i++) nwc_linear_call(&m->ns[i], c);
}
static void model_blas(void *ctx, int c) {
  model_ctx *m = ctx;
  for (int i = 0; i < m->n; i++) blas_call(&m->bs[i], c);
}

/* The token step: every linear of a Qwen3-4B-shaped model in one graph, nwc against cuBLAS: 36
 * layers, then lm_head 151936 x 2560.  Engines fuse a layer's q/k/v (6144 x 2560) and gate/up
 * (19456 x 2560); transformers runs them apart (q 4096, k and v 1024, gate and up 9728 rows), as
 * nwc.torch's patched model does.  Each layer's matrices are their own device copies of one encoded
 * layer (the weights repeat, the bytes read do not: 6 GB compressed, 8 GB BF16, far past L2). */
enum { STEP_LAYERS = 36, STEP_MAX_MATS = 8 };
typedef struct step_model {
  const char *name, *label; /* in the JSON line, in the table */
  int nmats;                /* the layer's matrices, then lm_head */
  uint64_t shapes[STEP_MAX_MATS][2];
} step_model;
static const step_model qwen3_fused = {
    "qwen3-4b-shaped", "token step", 5, {{6144, 2560}, {2560, 4096}, {19456, 2560}, {2560, 9728}, {151936, 2560}}};
static const step_model qwen3_hf = {"qwen3-4b-unfused",
                                    "token step, HF",
                                    8,
                                    {{4096, 2560},
                                     {1024, 2560},
                                     {1024, 2560},
                                     {2560, 4096},
                                     {9728, 2560},
                                     {9728, 2560},
                                     {2560, 9728},
                                     {151936, 2560}}};
typedef struct step_ctx {
  int nmats;
  nwc_side ns[STEP_MAX_MATS];
  blas_side bs[STEP_MAX_MATS];
} step_ctx;
static void step_nwc(void *ctx, int c) {
  step_ctx *m = ctx;
  (void)c;
  for (int l = 0; l < STEP_LAYERS; l++)
    for (int i = 0; i < m->nmats - 1; i++) nwc_linear_call(&m->ns[i], l);
  nwc_linear_call(&m->ns[m->nmats - 1], 0);
}
static void step_blas(void *ctx, int c) {
  step_ctx *m = ctx;
  (void)c;
  for (int l = 0; l < STEP_LAYERS; l++)
    for (int i = 0; i < m->nmats - 1; i++) blas_call(&m->bs[i], l);
  blas_call(&m->bs[m->nmats - 1], 0);
}

static void bench_token_step(const step_model *model) {
  step_ctx m;
  double nbytes = 0, weights = 0;
  const int linears = STEP_LAYERS * (model->nmats - 1) + 1;
  m.nmats = model->nmats;
  for (int i = 0; i < m.nmats; i++) {
    const uint64_t M = model->shapes[i][0], K = model->shapes[i][1];
    const int copies = i < m.nmats - 1 ? STEP_LAYERS : 1; /* each read once a step */
    uint16_t *w = make_weights(M, K);
    uint64_t lay[4];
    NW(nwc_layout(M, K, NWC_ELEM(NWC_ELEM_BF16, layout), lay));
    const uint64_t K16 = lay[NWC_LAYOUT_K16];
    float *x = make_x(K, K16);
    nwc_tensor t;
    NW(nwc_tensor_encode(w, M, K, NWC_ELEM(NWC_ELEM_BF16, layout), NULL, &t));
    nwc_side_init(&m.ns[i], &t, copies < 2 ? 2 : copies);
    nwc_side_set_x(&m.ns[i], x, K16);
    nbytes += m.ns[i].bytes * copies;
    weights += (double)M * K * copies;
    blas_side_init(&m.bs[i], w, M, K, x, K16);
    blas_side_copies(&m.bs[i], copies);
    nwc_tensor_release(&t);
    free(x), free(w);
  }
  double nu, nsg, bu, bsg;
  time_calls(step_nwc, &m, 1, &nu, &nsg);
  time_calls(step_blas, &m, 1, &bu, &bsg);
  printf("{\"bench\":\"token_step\",\"model\":\"%s\",\"layout\":%u,\"cols\":%u,\"x\":\"%s\","
         "\"linears\":%d,\"weights\":%.0f,\"nwc_bytes\":%.0f,\"bytes_ratio\":%.4f,\"nwc_graph_us\":%.1f,"
         "\"cublas_graph_us\":%.1f,\"speedup_graph\":%.3f,\"nwc_tbps\":%.3f,\"cublas_tbps\":%.3f}\n",
         model->name, layout, ncols, x_bf16 ? "bf16" : "fp32", linears, weights, nbytes, nbytes / (weights * 2), nu,
         bu, bu / nu, nbytes / nu * 1e-6, weights * 2 / bu * 1e-6);
  struct row *row = &rows[nrows++];
  snprintf(row->name, sizeof row->name, "%s (%d linears)", model->label, linears);
  row->nwc_us = nu, row->blas_us = bu, row->nwc_single = nsg, row->blas_single = bsg;
  row->ratio_bytes = nbytes / (weights * 2), row->floor_us = nbytes / floor_bps * 1e6;
  row->clk64 = clk64(nu, 1, (uint64_t)weights);
  for (int i = 0; i < m.nmats; i++) nwc_side_free(&m.ns[i]), blas_side_free(&m.bs[i]);
}

static void bench_sample(const char *path) {
  nwc_st_file *f;
  if (!path || nwc_st_open(path, &f) < 0) {
    fprintf(stderr, "sample model %s not readable: skipped\n", path ? path : "(none)");
    return;
  }
  model_ctx m = {0, calloc(f->count, sizeof(nwc_side)), calloc(f->count, sizeof(blas_side))};
  double total = 0, nbytes = 0, weights = 0;
  for (size_t i = 0; i < f->count; i++) {
    const nwc_st_tensor *st = &f->tensors[i];
    if (strcmp(st->dtype, "BF16") || st->ndim != 2) continue;
    total += (double)st->numel * 2;
  }
  int copies = copies_for(total);
  for (size_t i = 0; i < f->count; i++) {
    const nwc_st_tensor *st = &f->tensors[i];
    if (strcmp(st->dtype, "BF16") || st->ndim != 2) continue;
    uint64_t M = st->shape[0], K = st->shape[1], lay[4];
    const uint16_t *w = nwc_st_data(f, st);
    NW(nwc_layout(M, K, NWC_ELEM(NWC_ELEM_BF16, layout), lay));
    float *x = make_x(K, lay[NWC_LAYOUT_K16]);
    nwc_tensor t;
    NW(nwc_tensor_encode(w, M, K, NWC_ELEM(NWC_ELEM_BF16, layout), NULL, &t));
    nwc_side_init(&m.ns[m.n], &t, copies);
    nwc_side_set_x(&m.ns[m.n], x, lay[NWC_LAYOUT_K16]);
    nbytes += m.ns[m.n].bytes;
    weights += (double)M * K;
    blas_side_init(&m.bs[m.n], w, M, K, x, lay[NWC_LAYOUT_K16]);
    blas_side_copies(&m.bs[m.n], copies); /* the same number of copies on both sides */
    nwc_tensor_release(&t);
    free(x);
    m.n++;
  }
  double nu, nsg, bu, bsg;
  time_calls(model_nwc, &m, copies, &nu, &nsg);
  time_calls(model_blas, &m, copies, &bu, &bsg);
  printf("{\"bench\":\"sample_model\",\"file\":\"%s\",\"matrices\":%d,\"weights\":%.0f,"
         "\"bytes_ratio\":%.4f,\"nwc_graph_us\":%.2f,\"cublas_graph_us\":%.2f,\"speedup_graph\":%.3f,"
         "\"nwc_single_us\":%.2f,\"cublas_single_us\":%.2f}\n",
         path, m.n, weights, nbytes / (weights * 2), nu, bu, bu / nu, nsg, bsg);
  struct row *row = &rows[nrows++];
  snprintf(row->name, sizeof row->name, "sample (%d matrices)", m.n);
  row->nwc_us = nu, row->blas_us = bu, row->nwc_single = nsg, row->blas_single = bsg;
  row->ratio_bytes = nbytes / (weights * 2), row->floor_us = nbytes / floor_bps * 1e6;
  row->clk64 = clk64(nu, 1, (uint64_t)weights);
  for (int i = 0; i < m.n; i++) nwc_side_free(&m.ns[i]), blas_side_free(&m.bs[i]);
  free(m.ns), free(m.bs);
  nwc_st_close(f);
}

int main(int argc, char **argv) {
  const char *sample = getenv("NWC_SAMPLE");
  static uint64_t shapes[16][2] = {{6144, 2560},  {2560, 4096},   {19456, 2560},
                                   {2560, 9728},  {151936, 2560}, {4096, 4096},
                                   {11008, 4096}, {4096, 11008},  {28672, 4096}};
  int nshapes = 9, given = 0;
  for (int i = 1; i < argc; i++) {
    unsigned long long m, k;
    if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!strcmp(argv[i], "--shape") && i + 1 < argc && given < 16 &&
             sscanf(argv[++i], "%llux%llu", &m, &k) == 2 && m && k)
      shapes[given][0] = m, shapes[given][1] = k, nshapes = ++given, sample = NULL;
    else if (!strcmp(argv[i], "--sample") && i + 1 < argc) sample = argv[++i];
    else if (!strcmp(argv[i], "--floor-tbps") && i + 1 < argc) floor_bps = atof(argv[++i]) * 1e12;
    else if (!strcmp(argv[i], "--layout") && i + 1 < argc) layout = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--cols") && i + 1 < argc) ncols = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--x") && i + 1 < argc && (!strcmp(argv[i + 1], "fp32") || !strcmp(argv[i + 1], "bf16")))
      x_bf16 = !strcmp(argv[++i], "bf16");
    else if (!strcmp(argv[i], "--token-step")) token_step = 1;
    else if (!strcmp(argv[i], "--token-step-hf")) token_step_hf = 1;
    else if (!strcmp(argv[i], "--no-shapes")) nshapes = 0, sample = NULL;
    else if (!strcmp(argv[i], "--timeline") && i + 1 < argc) timeline = argv[++i];
    else DIE("usage: nwc_gpu_bench [--quick] [--layout 0|1|2] [--cols 1..8] [--x fp32|bf16] [--token-step] [--token-step-hf] [--no-shapes] "
             "[--sample FILE] [--floor-tbps T] [--shape MxK]... [--timeline FILE]");
  }
  if (layout > 2 || ncols < 1 || ncols > 8) {
    DIE("--layout takes 0, 1 or 2 and --cols 1..8 (layout %u, cols %u)", layout, ncols);
  }
  if (x_bf16 && layout == 0) DIE("--x bf16 takes layout 1 or 2: layout 0's kernels read fp32 x");
  if (timeline && layout == 0) DIE("--timeline takes layout 1 or 2: layout 0's kernels record none");
  if (timeline && nwc_k_timeline_dump(NULL, NULL) == -ENOTSUP)
    DIE("--timeline: the kernels were built without it (configure with -DNWC_KERNEL_TIMELINE=ON)");
  int dev = 0, l2 = 0, clk = 0, drv = 0;
  CU(cudaGetDevice(&dev));
  struct cudaDeviceProp prop;
  CU(cudaGetDeviceProperties(&prop, dev));
  CU(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CU(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev));
  CU(cudaDriverGetVersion(&drv));
  l2_bytes = l2, sm_clock_hz = clk * 1e3;
  printf("{\"bench\":\"device\",\"name\":\"%s\",\"sms\":%d,\"l2_bytes\":%d,\"sm_clock_mhz\":%d,"
         "\"cuda_driver\":%d,\"floor_tbps\":%.2f}\n",
         prop.name, sms, l2, clk / 1000, drv, floor_bps * 1e-12);
  CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CB(cublasCreate(&blas));
  CB(cublasSetStream(blas, stream));
  void *workspace; /* cuBLAS must not allocate while a graph is captured */
  CU(cudaMalloc(&workspace, 32u << 20));
  CB(cublasSetWorkspace(blas, workspace, 32u << 20));
  init_normal();

  for (int s = 0; s < nshapes; s++) bench_shape(shapes[s][0], shapes[s][1]);
  if (sample) bench_sample(sample);
  if (token_step) bench_token_step(&qwen3_fused);
  if (token_step_hf) bench_token_step(&qwen3_hf);

  double lg = 0, lg8 = 0;
  int n8 = 0;
  printf("\n%-22s %9s %9s %7s %9s %9s %9s %6s %8s %8s %6s %7s %6s\n", "shape", "nwc_us", "cublas_us",
         "x", "nwc_1", "cublas_1", "floor_us", "bytes", "fp8_us", "ref8_us", "x8", "dq_TB/s", "clk64");
  for (int i = 0; i < nrows; i++) {
    struct row *r = &rows[i];
    printf("%-22s %9.2f %9.2f %7.3f %9.2f %9.2f %9.2f %6.3f %8.2f %8.2f %6.3f %7.3f %6.2f\n", r->name,
           r->nwc_us, r->blas_us, r->blas_us / r->nwc_us, r->nwc_single, r->blas_single, r->floor_us,
           r->ratio_bytes, r->fp8_us, r->ref8_us, r->ref8_us > 0 ? r->ref8_us / r->fp8_us : 0,
           r->dq_tbps, r->clk64);
    if (i < nshapes) lg += log(r->blas_us / r->nwc_us);
    if (i < nshapes && r->ref8_us > 0) lg8 += log(r->ref8_us / r->fp8_us), n8++;
  }
  printf("geomean speedup vs cuBLAS (graph, %d shapes): %.3f   fp8 vs ref_fp8: %.3f\n", nshapes,
         nshapes ? exp(lg / nshapes) : 0.0, n8 ? exp(lg8 / n8) : 0.0);
  printf("{\"bench\":\"summary\",\"geomean_speedup_graph\":%.4f,\"geomean_fp8_vs_ref\":%.4f}\n",
         nshapes ? exp(lg / nshapes) : 0.0, n8 ? exp(lg8 / n8) : 0.0);
  cublasDestroy(blas);
  return 0;
}
