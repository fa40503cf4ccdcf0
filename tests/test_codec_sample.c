/*
 * test_codec_sample.c - every tensor of the real sample model round-tripped through the codec.
 *
 * The model (Universal Sentence Encoder Lite as BF16 safetensors, made by scripts/fetch-sample)
 * is found through NWC_SAMPLE (ctest sets it) or ~/.cache/nwc/use-lite-bf16.safetensors.  Each
 * tensor (1-D as 1 x N, N-D as prod(leading dims) x last dim) goes through cu_check_tensor twice:
 * as BF16 (dequant returns the weights bit for bit) and as fp8 after nwc_quantize_fp8 with its
 * per-row scales (dequant returns the fp8 values exactly); gather, matvec and records are checked
 * on both.  Prints the compression ratio over the whole model for both element types.
 */
#include "codec_util.h"
#include "safetensors.h"

/* Encoded bytes of an M x K tensor: data, bases, stream lengths, raw plane (and scales). */
static uint64_t encoded_bytes(const void *w, uint64_t M, uint64_t K, unsigned type, int scaled) {
  uint64_t lay[4];
  if (nwc_layout(M, K, NWC_ELEM(type, 0), lay) < 0) return 0;
  uint64_t nb = lay[NWC_LAYOUT_BLOCKS];
  uint64_t *bases = cu_malloc((nb + 1) * 8);
  uint8_t *hdr = cu_malloc(nb * NWC_LANES), psym[16];
  int64_t data = nwc_encode(w, M * K, K, NWC_ELEM(type, 0), NULL, psym, bases, hdr, NULL, 0, NULL);
  CHECK(data > 0, "size query failed: %s", nwc_error_detail());
  free(bases);
  free(hdr);
  return (uint64_t)(data > 0 ? data : 0) + (nb + 1) * 8 + nb * NWC_LANES + lay[NWC_LAYOUT_RAW_BYTES] +
         (scaled ? 4 * M : 0);
}

int main(void) {
  test_seed("test_codec_sample");
  const char *path = getenv("NWC_SAMPLE");
  char fallback[4096];
  if (!path || !*path) {
    snprintf(fallback, sizeof fallback, "%s/.cache/nwc/use-lite-bf16.safetensors",
             getenv("HOME") ? getenv("HOME") : "");
    path = fallback;
  }
  nwc_st_file *f = NULL;
  int rc = nwc_st_open(path, &f);
  if (rc < 0) {
    fprintf(stderr,
            "test_codec_sample: cannot read the sample model %s (%s: %s).\n"
            "Run scripts/fetch-sample to make it (or set NWC_SAMPLE to its path).\n",
            path, nwc_strerror(rc), nwc_error_detail());
    return 1;
  }
  uint64_t raw16 = 0, enc16 = 0, raw8 = 0, enc8 = 0, tensors = 0;
  char what[600];
  for (size_t i = 0; i < f->count; i++) {
    const nwc_st_tensor *st = &f->tensors[i];
    CHECK(!strcmp(st->dtype, "BF16"), "%s: dtype %s, the sample is all BF16", st->name, st->dtype);
    if (strcmp(st->dtype, "BF16") || st->numel == 0) continue;
    uint64_t K = st->ndim ? st->shape[st->ndim - 1] : 1, M = st->numel / K;
    uint16_t *w = cu_malloc(st->numel * 2); /* a copy: the mapped data need not be aligned */
    memcpy(w, nwc_st_data(f, st), st->numel * 2);
    snprintf(what, sizeof what, "%s (%llux%llu bf16)", st->name, (unsigned long long)M,
             (unsigned long long)K);
    cu_check_tensor(w, M, K, NWC_ELEM_BF16, NULL, what);
    raw16 += st->numel * 2;
    enc16 += encoded_bytes(w, M, K, NWC_ELEM_BF16, 0);

    uint8_t *q = cu_malloc(st->numel);
    float *scale = cu_malloc(M * sizeof *scale);
    rc = nwc_quantize_fp8(w, M, K, q, scale);
    CHECK(rc == 0, "%s: nwc_quantize_fp8: %s", st->name, nwc_error_detail());
    if (rc == 0) {
      snprintf(what, sizeof what, "%s (%llux%llu fp8)", st->name, (unsigned long long)M,
               (unsigned long long)K);
      cu_check_tensor(q, M, K, NWC_ELEM_FP8, scale, what);
      raw8 += st->numel;
      enc8 += encoded_bytes(q, M, K, NWC_ELEM_FP8, 1);
    }
    free(q);
    free(scale);
    free(w);
    tensors++;
  }
  CHECK(tensors > 0, "%s holds no tensors", path);
  printf("%llu tensors of %s\n", (unsigned long long)tensors, path);
  printf("bf16: %llu -> %llu bytes, ratio %.4f\n", (unsigned long long)raw16,
         (unsigned long long)enc16, raw16 ? (double)enc16 / (double)raw16 : 0.0);
  printf("fp8:  %llu -> %llu bytes, ratio %.4f of fp8 (scales included)\n", (unsigned long long)raw8,
         (unsigned long long)enc8, raw8 ? (double)enc8 / (double)raw8 : 0.0);
  nwc_st_close(f);
  return test_exit("test_codec_sample");
}
