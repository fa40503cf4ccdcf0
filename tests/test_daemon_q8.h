/*
 * test_daemon_q8.h - a model "q8" written by the daemon tests and imported as fp8: a matrix and
 * its bias stored as a 1 x M matrix, so that both are quantized with per-row scales, and their
 * references (the quantizer's fp8 values as BF16 and its scales: nwc_quantize_fp8, which the
 * import uses).  A matvec with that bias must scale the bias too; the host and GPU tests
 * (test_daemon_basic, test_daemon_cuda) check it against fp64 with td_matvec_err.
 */
#ifndef NWC_TEST_DAEMON_Q8_H
#define NWC_TEST_DAEMON_Q8_H

#include "nwc_client.h"
#include "test_daemon_util.h"
#include "test_store_util.h" /* st_write */

typedef struct td_q8 {
  td_tensor w, b;                /* q.w (M x K) and q.b (1 x M): fp8 values and row scales */
  uint16_t *wq, *bq;
  float *ws, bs;
} td_q8;

/* Writes q8 (M x K, M and K random, K a multiple of 16) with random weights into td_dir,
 * imports it into c's daemon as fp8 and fills q with its references. */
static void td_import_q8(nwc_client *c, td_q8 *q) {
  const uint64_t M = 64 + test_below(64), K = 256 + 16 * test_below(16);
  uint16_t *w = malloc(M * K * 2), *b = malloc(M * 2);
  uint8_t *f8 = malloc(M * K);
  q->wq = malloc(M * K * 2), q->bq = malloc(M * 2), q->ws = malloc(M * sizeof *q->ws);
  for (uint64_t i = 0; i < M * K; i++) w[i] = nwc_f32_to_bf16((float)(test_uniform() - 0.5) * 0.1f);
  for (uint64_t i = 0; i < M; i++) b[i] = nwc_f32_to_bf16((float)(test_uniform() - 0.5));
  CHECK_RC(nwc_quantize_fp8(w, M, K, f8, q->ws));
  for (uint64_t i = 0; i < M * K; i++) q->wq[i] = nwc_fp8_to_bf16(f8[i]);
  CHECK_RC(nwc_quantize_fp8(b, 1, M, f8, &q->bs));
  for (uint64_t i = 0; i < M; i++) q->bq[i] = nwc_fp8_to_bf16(f8[i]);
  st_spec sp[2] = {{"q.w", "BF16", 2, {M, K}, w, M * K * 2}, {"q.b", "BF16", 2, {1, M}, b, M * 2}};
  char path[600];
  snprintf(path, sizeof path, "%s/q8.safetensors", td_dir);
  CHECK_RC(st_write(path, sp, 2));
  nwc_client_import_opts f8opts = {.elem = NWC_ELEM_FP8};
  CHECK_RC(nwc_client_import(c, "q8", path, &f8opts, NULL));
  unlink(path);
  nwc_client_tensor *ts = NULL;
  size_t nts = 0;
  CHECK_RC(nwc_client_tensors(c, "q8", &ts, &nts));
  for (size_t i = 0; i < nts; i++)
    CHECK(NWC_ELEM_TYPE(ts[i].elem) == NWC_ELEM_FP8, "q8/%s: elem %u", ts[i].name, ts[i].elem);
  free(ts);
  q->w = (td_tensor){"q.w", M, K, q->wq, q->ws};
  q->b = (td_tensor){"q.b", 1, M, q->bq, &q->bs};
  free(w), free(b), free(f8);
}

/* Removes q8 from the store and frees q's references. */
static void td_remove_q8(nwc_client *c, td_q8 *q) {
  CHECK_RC(nwc_client_remove(c, "q8"));
  free(q->wq), free(q->bq), free(q->ws);
}

#endif
