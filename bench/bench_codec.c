/*
 * bench_codec.c - `nwc-bench codec FILE.safetensors`: for every tensor, encode, check that dequant
 * returns the input exactly, and time encode, dequant and matvec on one core beside a plain BF16
 * matvec written here.  Rates are GB/s of BF16 weight bytes (2 per weight, also for fp8).
 *
 * batch8_matvec_gbps counts the weight bytes once per column (8 columns in one call).
 * Sizes count everything a decoder needs: streams, raw plane, bases, stream headers, psym and
 * (fp8) the per-row scales.  entropy_bound is the memoryless entropy of the sign+exponent byte
 * plus the 8 raw bits, over 16 bits (fp8: the entropy of the whole byte over 8 bits): what any
 * per-tensor memoryless coder of that byte needs.
 */
#include "bench.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOP_MATRICES 11

typedef struct job {
  nwc_tensor t;
  const uint16_t *w; /* BF16 source, rows x cols */
  const uint8_t *q;  /* fp8 weights when elem is fp8 */
  uint64_t rows, cols, K16;
  unsigned elem;
  float *x, *y, *X, *Y; /* X: 8 columns of K16, Y: 8 columns of rows */
  uint16_t *out;
} job;

static int run_encode(void *a) {
  job *j = a;
  nwc_tensor t;
  int rc = nwc_tensor_encode(j->q ? (const void *)j->q : j->w, j->rows, j->cols, j->elem,
                             j->t.scale, &t);
  nwc_tensor_release(&t);
  return rc;
}

static int run_dequant(void *a) {
  job *j = a;
  return nwc_dequant(&j->t, j->out);
}

static int run_matvec(void *a) {
  job *j = a;
  return nwc_matvec(&j->t, j->x, NULL, j->y, NULL);
}

#define BATCH 8

static int run_batch8(void *a) {
  job *j = a;
  return nwc_matvec_batch(&j->t, j->X, BATCH, j->K16, NULL, j->Y, j->rows, NULL);
}

/* The baseline: y = W x over BF16 weights, four partial sums per row. */
static int run_plain(void *a) {
  job *j = a;
  for (uint64_t r = 0; r < j->rows; r++) {
    const uint16_t *row = j->w + r * j->cols;
    float s[4] = {0, 0, 0, 0};
    uint64_t c = 0;
    for (; c + 4 <= j->cols; c += 4)
      for (unsigned k = 0; k < 4; k++) s[k] += nwc_bf16_to_f32(row[c + k]) * j->x[c + k];
    for (; c < j->cols; c++) s[0] += nwc_bf16_to_f32(row[c]) * j->x[c];
    j->y[r] = (s[0] + s[1]) + (s[2] + s[3]);
  }
  return 0;
}

/* Memoryless entropy in bits of n bytes p[0], p[stride], ... */
static double byte_entropy(const uint8_t *p, uint64_t n, size_t stride) {
  uint64_t freq[256] = {0};
  for (uint64_t i = 0; i < n; i++) freq[p[i * stride]]++;
  double h = 0;
  for (int b = 0; b < 256; b++)
    if (freq[b]) h -= (double)freq[b] / (double)n * log2((double)freq[b] / (double)n);
  return h;
}

static uint64_t encoded_bytes(const nwc_tensor *t) {
  return t->data_bytes + t->raw_bytes + (t->nblocks + 1) * 8 + t->nblocks * NWC_LANES + NWC_RANKS +
         (t->scale ? t->rows * 4 : 0);
}

static int check_exact(const job *j) {
  for (uint64_t r = 0; r < j->rows; r++)
    for (uint64_t c = 0; c < j->cols; c++) {
      uint16_t want = j->q ? nwc_fp8_to_bf16(j->q[r * j->cols + c]) : j->w[r * j->cols + c];
      if (j->out[r * j->K16 + c] != want) return 0;
    }
  return 1;
}

typedef struct totals {
  double raw, nwc, bf16, enc_s, dec_s, mv_s, b8_s, plain_s;
  int all_exact, count, skipped;
} totals;

typedef struct entry {
  uint64_t numel;
  double raw, nwc, bound; /* bytes */
  int matrix;
} entry;

static int by_size_desc(const void *a, const void *b) {
  const entry *x = a, *y = b;
  return (x->numel < y->numel) - (x->numel > y->numel);
}

static int bench_tensor(const nwc_st_file *f, const nwc_st_tensor *st, unsigned elem,
                        double seconds, totals *tot, entry *e) {
  job j = {0};
  nwc_st_matrix_shape(st, &j.rows, &j.cols);
  j.w = nwc_st_data(f, st);
  j.elem = elem;
  uint64_t n = j.rows * j.cols;
  uint8_t *q = NULL;
  float *scale = NULL;
  int rc = 0;
  if (NWC_ELEM_TYPE(elem) == NWC_ELEM_FP8) {
    q = malloc(n);
    scale = malloc(j.rows * sizeof *scale);
    if (!q || !scale) rc = -ENOMEM;
    if (rc == 0) rc = nwc_quantize_fp8(j.w, j.rows, j.cols, q, scale);
    j.q = q;
  }
  if (rc == 0) rc = nwc_tensor_encode(q ? (const void *)q : j.w, j.rows, j.cols, elem, scale, &j.t);
  if (rc < 0) {
    fprintf(stderr, "nwc-bench: %s: %s (%s)\n", st->name, nwc_strerror(rc), nwc_error_detail());
    free(q);
    free(scale);
    return rc;
  }
  uint64_t lay[4];
  nwc_layout(j.rows, j.cols, elem, lay);
  j.K16 = lay[NWC_LAYOUT_K16];
  j.out = malloc(j.rows * j.K16 * 2);
  j.x = calloc(j.K16, sizeof *j.x);
  j.y = malloc(j.rows * sizeof *j.y);
  j.X = calloc(BATCH * j.K16, sizeof *j.X);
  j.Y = malloc(BATCH * j.rows * sizeof *j.Y);
  for (uint64_t c = 0; c < j.cols; c++) j.x[c] = (float)sin(0.1 * (double)c);
  for (uint64_t c = 0; c < BATCH * j.K16; c++)
    j.X[c] = c % j.K16 < j.cols ? (float)cos(0.07 * (double)c) : 0.0f;
  rc = nwc_dequant(&j.t, j.out);
  int exact = rc == 0 && check_exact(&j);
  double enc = nwc_bench_time(run_encode, &j, seconds);
  double dec = nwc_bench_time(run_dequant, &j, seconds);
  double mv = nwc_bench_time(run_matvec, &j, seconds);
  double b8 = nwc_bench_time(run_batch8, &j, seconds);
  double plain = nwc_bench_time(run_plain, &j, seconds);
  double bf16 = 2.0 * (double)n, raw = q ? (double)n : bf16, nwc = (double)encoded_bytes(&j.t);
  /* the bound in bytes: BF16, the high byte's entropy plus the 8 raw bits; fp8, the byte's */
  double bound = q ? byte_entropy(q, n, 1) * (double)n / 8
                   : (byte_entropy((const uint8_t *)j.w + 1, n, 2) + 8) * (double)n / 8;
  json_t *o = json_pack("{s:s, s:I, s:I, s:s, s:i, s:f, s:f, s:f, s:b, s:f, s:f, s:f, s:f, s:f, s:f}",
                        "name", st->name, "rows", (json_int_t)j.rows, "cols", (json_int_t)j.cols,
                        "elem", q ? "fp8" : "bf16", "layout", (int)NWC_ELEM_LAYOUT(elem),
                        "raw_bytes", raw, "nwc_bytes", nwc, "ratio", nwc / raw, "exact", exact,
                        "encode_gbps", bf16 / enc * 1e-9, "decode_gbps", bf16 / dec * 1e-9,
                        "matvec_gbps", bf16 / mv * 1e-9, "batch8_matvec_gbps",
                        BATCH * bf16 / b8 * 1e-9, "plain_bf16_matvec_gbps",
                        bf16 / plain * 1e-9, "entropy_bound", bound / raw);
  json_dumpf(o, stdout, JSON_COMPACT | JSON_REAL_PRECISION(6));
  putchar('\n');
  fflush(stdout);
  json_decref(o);
  tot->raw += raw, tot->nwc += nwc, tot->bf16 += bf16;
  tot->enc_s += enc, tot->dec_s += dec, tot->mv_s += mv, tot->b8_s += b8, tot->plain_s += plain;
  tot->all_exact &= exact;
  tot->count++;
  *e = (entry){n, raw, nwc, bound, j.rows > 1};
  nwc_tensor_release(&j.t);
  free(j.out), free(j.x), free(j.y), free(j.X), free(j.Y), free(q), free(scale);
  return 0;
}

int nwc_bench_codec(int argc, char **argv) {
  static const struct option opts[] = {{"layout", required_argument, 0, 'l'},
                                       {"elem", required_argument, 0, 'e'},
                                       {"seconds", required_argument, 0, 's'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  unsigned layout = 0, type = NWC_ELEM_BF16;
  double seconds = 0.2;
  int c;
  while ((c = getopt_long(argc, argv, "l:e:s:h", opts, NULL)) != -1) {
    switch (c) {
    case 'l': layout = (unsigned)atoi(optarg); break;
    case 'e':
      if (!strcmp(optarg, "bf16")) type = NWC_ELEM_BF16;
      else if (!strcmp(optarg, "fp8")) type = NWC_ELEM_FP8;
      else { fprintf(stderr, "nwc-bench codec: --elem takes bf16 or fp8\n"); return 2; }
      break;
    case 's': seconds = atof(optarg); break;
    case 'h':
      puts("usage: nwc-bench codec FILE.safetensors [--layout 0|1|2] [--elem bf16|fp8] "
           "[--seconds S]\n"
           "Encodes every BF16 tensor (fp8: after per-row quantization), checks dequant is exact,\n"
           "and times encode, dequant, matvec and a plain BF16 matvec (S seconds each, one core).");
      return 0;
    default: return 2;
    }
  }
  if (optind + 1 != argc) {
    fprintf(stderr, "usage: nwc-bench codec FILE.safetensors [--layout N] [--elem bf16|fp8]\n");
    return 2;
  }
  nwc_st_file *f;
  int rc = nwc_st_open(argv[optind], &f);
  if (rc < 0) {
    fprintf(stderr, "nwc-bench: %s: %s\n", nwc_strerror(rc), nwc_error_detail());
    return 1;
  }
  unsigned elem = NWC_ELEM(type, layout);
  totals tot = {.all_exact = 1};
  entry *ents = calloc(f->count + 1, sizeof *ents);
  size_t ne = 0;
  for (size_t i = 0; i < f->count && rc == 0; i++) {
    const nwc_st_tensor *st = &f->tensors[i];
    if (strcmp(st->dtype, "BF16") || st->numel == 0) {
      fprintf(stderr, "nwc-bench: skipping %s (%s)\n", st->name, st->dtype);
      tot.skipped++;
      continue;
    }
    rc = bench_tensor(f, st, elem, seconds, &tot, &ents[ne]);
    if (rc == 0) ne++;
  }
  qsort(ents, ne, sizeof *ents, by_size_desc);
  double top_raw = 0, top_nwc = 0, top_bound = 0;
  for (size_t i = 0, k = 0; i < ne && k < TOP_MATRICES; i++)
    if (ents[i].matrix) {
      top_raw += ents[i].raw, top_nwc += ents[i].nwc, top_bound += ents[i].bound, k++;
    }
  json_t *o = json_pack(
      "{s:s, s:i, s:i, s:s, s:i, s:f, s:f, s:f, s:f, s:f, s:b, s:f, s:f, s:f, s:f, s:f}", "summary",
      argv[optind], "tensors", tot.count, "skipped", tot.skipped,
      "elem", type == NWC_ELEM_FP8 ? "fp8" : "bf16", "layout", (int)layout, "raw_bytes", tot.raw,
      "nwc_bytes", tot.nwc, "ratio", tot.raw > 0 ? tot.nwc / tot.raw : 0,
      "top11_ratio", top_raw > 0 ? top_nwc / top_raw : 0, "top11_entropy_bound",
      top_raw > 0 ? top_bound / top_raw : 0, "exact", tot.all_exact,
      "encode_gbps", tot.bf16 / tot.enc_s * 1e-9, "decode_gbps", tot.bf16 / tot.dec_s * 1e-9,
      "matvec_gbps", tot.bf16 / tot.mv_s * 1e-9, "batch8_matvec_gbps",
      BATCH * tot.bf16 / tot.b8_s * 1e-9, "plain_bf16_matvec_gbps",
      tot.bf16 / tot.plain_s * 1e-9);
  json_dumpf(o, stdout, JSON_COMPACT | JSON_REAL_PRECISION(6));
  putchar('\n');
  json_decref(o);
  free(ents);
  nwc_st_close(f);
  return rc == 0 && tot.all_exact ? 0 : 1;
}
