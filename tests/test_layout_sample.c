/*
 * test_layout_sample.c - layouts 1 and 2 on the real sample model (NWC_SAMPLE, a BF16 safetensors
 * file; skipped with 77 when it is missing): every BF16 tensor, as BF16 and quantized to fp8, is
 * encoded in layouts 0, 1 and 2 and checked against its input (layout_util.h: dequant bit for
 * bit, range, gather, matvec and a batch against fp64, records).  Then the sizes of the 11
 * largest matrices (tensors whose first dimension, the rows, is above 1) (everything a decoder needs: data, raw, bases, hdr, psym, scales) against
 * the targets of issue 3: layout 1 within 0.5 % of layout 0, layout 2 at most 0.76 of BF16.
 * fp8 layout 2 is printed beside its target (0.88 of fp8); the format's own estimate is
 * 0.875 plus 2 bytes per exception.
 */
#include "layout_util.h"
#include "safetensors.h"

#define TOP 11

static uint64_t tensor_bytes(const nwc_tensor *t) {
  return t->data_bytes + t->raw_bytes + (t->nblocks + 1) * 8 + t->nblocks * NWC_LANES + 16 +
         (t->scale ? t->rows * 4 : 0);
}

int main(void) {
  test_seed("test_layout_sample");
  const char *path = getenv("NWC_SAMPLE");
  nwc_st_file *f = NULL;
  if (!path || !*path || nwc_st_open(path, &f) < 0) {
    printf("test_layout_sample: no sample model (NWC_SAMPLE=%s): skipped\n", path ? path : "");
    return TEST_SKIP;
  }
  /* the 11 largest BF16 tensors by element count */
  size_t top[TOP], ntop = 0;
  for (size_t i = 0; i < f->count; i++) {
    /* matrices: more than one row, rows = the first dimension (as nwc-bench codec counts) */
    if (strcmp(f->tensors[i].dtype, "BF16") || f->tensors[i].ndim < 2 || f->tensors[i].shape[0] < 2)
      continue;
    size_t k = ntop < TOP ? ntop++ : TOP;
    if (k == TOP && f->tensors[i].numel <= f->tensors[top[TOP - 1]].numel) continue;
    if (k == TOP) k = TOP - 1;
    while (k > 0 && f->tensors[top[k - 1]].numel < f->tensors[i].numel) top[k] = top[k - 1], k--;
    top[k] = i;
  }
  double size[2][3] = {{0}}, plain[2] = {0};
  int levels = lu_levels();
  for (size_t i = 0; i < f->count; i++) {
    const nwc_st_tensor *st = &f->tensors[i];
    if (strcmp(st->dtype, "BF16") || st->numel == 0) continue;
    uint64_t M, K;
    nwc_st_matrix_shape(st, &M, &K);
    const uint16_t *w = nwc_st_data(f, st);
    int is_top = 0;
    for (size_t k = 0; k < ntop; k++) is_top |= top[k] == i;
    uint8_t *q = cu_malloc(M * K);
    float *scale = cu_malloc(M * sizeof *scale);
    int qrc = nwc_quantize_fp8(w, M, K, q, scale);
    for (unsigned type = 0; type < 2; type++) {
      if (type == NWC_ELEM_FP8 && qrc < 0) continue;
      const void *in = type == NWC_ELEM_BF16 ? (const void *)w : (const void *)q;
      const float *sc = type == NWC_ELEM_FP8 ? scale : NULL;
      for (unsigned layout = 0; layout <= 2; layout++) {
        nwc_tensor t;
        int rc = nwc_tensor_encode(in, M, K, NWC_ELEM(type, layout), sc, &t);
        CHECK(rc == 0, "%s layout %u type %u: encode returned %d (%s)", st->name, layout, type, rc,
              nwc_error_detail());
        if (rc) continue;
        if (is_top) size[type][layout] += (double)tensor_bytes(&t);
        nwc_tensor_release(&t);
        if (layout == 0) continue; /* layout 0 is test_codec_sample's */
        char what[300];
        snprintf(what, sizeof what, "%s %s layout %u (%s)", st->name, type ? "fp8" : "bf16",
                 layout, lu_level_env[(i + layout) % levels]);
        lu_set_level((int)((i + layout) % levels)); /* spread the levels over the tensors */
        lu_check_tensor(in, M, K, type, layout, sc, 1, what);
      }
      if (is_top) plain[type] += (double)M * K * (type == NWC_ELEM_BF16 ? 2 : 1);
    }
    free(q);
    free(scale);
  }
  for (unsigned type = 0; type < 2; type++)
    printf("top %zu matrices, %s: layout 0 %.4f, layout 1 %.4f (%+.3f %% vs 0), layout 2 %.4f of %s\n",
           ntop, type ? "fp8" : "bf16", size[type][0] / plain[type], size[type][1] / plain[type],
           100 * (size[type][1] / size[type][0] - 1), size[type][2] / plain[type],
           type ? "fp8" : "BF16");
  CHECK(size[0][1] <= 1.005 * size[0][0], "bf16 layout 1 is %.3f %% larger than layout 0",
        100 * (size[0][1] / size[0][0] - 1));
  CHECK(size[1][1] <= 1.005 * size[1][0], "fp8 layout 1 is %.3f %% larger than layout 0",
        100 * (size[1][1] / size[1][0] - 1));
  CHECK(size[0][2] <= 0.76 * plain[0], "bf16 layout 2 is %.4f of BF16 (target 0.76)",
        size[0][2] / plain[0]);
  if (size[1][2] > 0.88 * plain[1])
    printf("note: fp8 layout 2 is %.4f of fp8, above the 0.88 target\n", size[1][2] / plain[1]);
  nwc_st_close(f);
  return test_exit("test_layout_sample");
}
