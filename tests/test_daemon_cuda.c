/*
 * test_daemon_cuda.c - nwcd with --backend cuda (exit 77 without a GPU): CUDA IPC and device
 * budgets, against the original weights of the sample model.
 *
 *   0. Socket matvecs: x and y through the connection's shared region, registered with CUDA by
 *      the daemon (rflags NWC_CLIENT_SHARED), equal to the same in the frames and within 1e-5
 *      of fp64, with a bias and a scale, 1 - 3 columns; on the sample's largest matrix and on a
 *      model written here whose K is not a multiple of 16 (the sample has none), loaded onto
 *      cuda:0 one tensor first, then whole.
 *   1. A client process (this program re-executed as "ipc") that owns CUDA memory: matvec from
 *      its device x into its device y (offsets inside one allocation, an IPC event to wait for,
 *      y poisoned first), checked against fp64, then ten more with fresh x on the same buffers
 *      (which the daemon keeps open for the connection); BF16 output with a scale bit-equal to rounding
 *      the fp32 result; dequant into its own buffer, BF16 bit for bit and fp32 exactly; and the
 *      refusals: a garbage handle, a buffer too small, an offset past the allocation, a tensor
 *      used from host memory; then that tensor loaded onto cuda:0 too (two replicas in ps).
 *   2. A device budget (4 MiB) smaller than the model (9.4 MiB): loads onto cuda:0 and into host
 *      memory, evictions and requests interleaved at random, every reply checked, ps showing
 *      where each tensor lives, the device never over its budget; then after evicting everything
 *      the GPU's free memory (cudaMemGetInfo) is back exactly where it was before.
 *   3. (Run last, on a second daemon of the same store with a 1 GiB budget.)  This process takes
 *      all the GPU memory it can while a small tensor is resident: a load of a large matrix
 *      written here, which the budget allows, fails to allocate, the daemon evicts the small one
 *      and retries, then fails the request with ENOMEM ("... after evicting ... and
 *      retrying"); once the memory is given back it loads that matrix's model (three of
 *      8192 columns: 8192, 2048 and 512 rows) whole, the lanes of the small ones taking parts
 *      of the large one (the log says how many: at least one), and every matrix matvecs within
 *      1e-5 of fp64 and gathers rows (the last, the first, two random) bit for bit; then this
 *      process and a forked one race whole-model loads, evicts and dequants of that model for
 *      two seconds (test_daemon_race.h), every dequant bit for bit: tensors are used and
 *      evicted while the copies of queued loads are still on their way.
 *   4. fp8: the sample imported with elem fp8 (matrices quantized, 1-D tensors kept BF16), each
 *      matrix loaded onto cuda:0 alone (ps says so): dequant equal bit for bit to the
 *      quantizer's fp8 values for the original weights (nwc_quantize_fp8, as BF16), a gather of
 *      random rows the same, and the matvecs of 0 (through the region, inline, BF16) within 1e-5
 *      of fp64 on those values times the quantizer's row scales; then a model written here of a
 *      matrix and its bias as a 1 x M matrix (both quantized, with row scales) loaded onto
 *      cuda:0 whole, its queued copies unwaited for, matvecs with that bias the same way.
 *   5. (After 3, on its daemon, whose host budget is 6 MiB.)  A tensor loaded into host memory
 *      and pushed out by LRU loads comes back there for a matvec (its home), not onto cuda:0; after
 *      an explicit evict a matvec loads it onto cuda:0.
 *   6. (Then, where the machine has a second GPU.)  A tensor and then the whole sample on cuda:1:
 *      matvec and dequant right there, a load onto cuda:0 a second replica, cuda:1's memory back
 *      after evicting everything.
 *   9. (After 5, on its daemon.)  Replicas: a tensor in host memory and on cuda:0 at once, both in
 *      ps and devices, matvecs from each, the host one mapped (its mapping refusing an evict
 *      of the tensor, naming cpu), one evict dropping both; with a second GPU, the same on
 *      cuda:0 and cuda:1 with a pin on cuda:1, and both devices' memory back after the evict.
 *   8. (After 4.)  Layouts 2 and 1: the sample imported in each, each matrix on cuda:0 alone,
 *      dequant and gather bit for bit, matvecs of 1 - 3 columns within 1e-5 of fp64.
 *  11. (After 8, on the first daemon: 4 MiB per device.)  Split: the sample over cuda:0 and host
 *      memory, each tensor at the one place the test computes (natural name order, sizes, the
 *      budget, what devices reports resident), a matvec from a matrix on each place within 1e-5
 *      of fp64 making no new replica; over cuda:0 alone ENOSPC, nothing loaded; with a second
 *      GPU over cuda:0, cuda:1 and host memory.
 *   7. (After 2, on its daemon: 4 MiB per device.)  devices: the host, then one place per GPU
 *      in order, each GPU's budget the 4 MiB given and all of them together what stats sums,
 *      its total memory CUDA's and its free memory at most that; every place's resident bytes,
 *      tensors and pinned bytes ps's sums there: with nothing resident, then with random
 *      tensors loaded onto cuda:0 and one into host memory (one of each pinned), and after
 *      evicting everything, when they are 0 and so are the GPUs' pools (a device that holds no
 *      tensor gives its pool back).
 */
#include "test_daemon_q8.h"
#include "test_daemon_race.h"
#include "test_daemon_util.h"
#include "test_store_util.h" /* st_write */

#include "nwc_client.h"

#include <cuda_runtime.h>
#include <stdbool.h>

#define CU(expr)                                                                                 \
  do {                                                                                           \
    cudaError_t cu__e = (expr);                                                                  \
    CHECK(cu__e == cudaSuccess, "%s: %s", #expr, cudaGetErrorString(cu__e));                     \
  } while (0)

static const td_tensor *find_tensor(bool k_aligned) {
  const td_tensor *best = NULL;
  for (size_t i = 0; i < td_nt; i++) {
    const td_tensor *t = &td_t[i];
    if (t->rows < 2 || (t->cols % 16 == 0) != k_aligned) continue;
    if (!best || t->rows * t->cols > best->rows * best->cols) best = t;
  }
  return best;
}

/* Socket matvecs of model/t (resident on cuda:0) three times each way, fresh x and y poisoned
 * every time: float through the shared region (NWC_CLIENT_SHARED: straight between the region
 * and the GPU), float in the frames (NWC_CLIENT_INLINE) and BF16 (copied); with bias (M values,
 * or NULL) and then a scale, checked against fp64, and the three outputs equal to the inline
 * float (the same kernel; BF16: its rounding). */
static void shared_tensor(nwc_client *c, const char *model, const td_tensor *t,
                          const td_tensor *bias) {
  const uint64_t M = t->rows, K = t->cols;
  const unsigned ncols = 1 + (unsigned)test_below(3);
  const float scale = bias ? 0.5f : 1.0f;
  size_t n = (size_t)ncols * M;
  float *x = malloc(ncols * K * 4), *ys = malloc(n * 4), *yi = malloc(n * 4);
  uint16_t *yh = malloc(n * 2);
  for (int rep = 0; rep < 3 && !test_failures; rep++) { /* the second captures a graph */
    for (size_t k = 0; k < ncols * K; k++) x[k] = (float)(test_uniform() * 2 - 1);
    memset(ys, 0xff, n * 4), memset(yi, 0xff, n * 4), memset(yh, 0xff, n * 2);
    unsigned rs = 0, ri = 0, rh = 0;
    const char *bn = bias ? bias->name : NULL;
    int rc = nwc_client_matvec(c, model, t->name, bn, scale, x, K, ncols, 0, ys, n * 4, &rs);
    CHECK(rc == 0 && (rs & NWC_CLIENT_SHARED), "matvec %s through the shared region: %d %s, "
          "rflags 0x%x", t->name, rc, rc ? nwc_client_last_error() : "", rs);
    rc |= nwc_client_matvec(c, model, t->name, bn, scale, x, K, ncols, NWC_CLIENT_INLINE, yi,
                            n * 4, &ri);
    rc |= nwc_client_matvec(c, model, t->name, bn, scale, x, K, ncols, NWC_CLIENT_BF16, yh, n * 2,
                            &rh);
    CHECK(rc == 0 && !(ri & NWC_CLIENT_SHARED) && !(rh & NWC_CLIENT_SHARED),
          "matvec %s inline / bf16: %d %s, rflags 0x%x 0x%x", t->name, rc,
          rc ? nwc_client_last_error() : "", ri, rh);
    if (rc) break;
    for (unsigned col = 0; col < ncols; col++) {
      double e = td_matvec_err(t, x + col * K, scale, bias, ys + col * M);
      CHECK(e <= 1e-5, "matvec %s [%llux%llu] col %u/%u through the region: error %.3g", t->name,
            (unsigned long long)M, (unsigned long long)K, col, ncols, e);
    }
    size_t diff = 0, hdiff = 0;
    for (size_t i = 0; i < n; i++) {
      diff += memcmp(&ys[i], &yi[i], 4) != 0;
      hdiff += yh[i] != nwc_f32_to_bf16(yi[i]);
    }
    CHECK(diff == 0 && hdiff == 0, "matvec %s: %zu values through the region and %zu BF16 differ "
          "from the inline ones", t->name, diff, hdiff);
  }
  printf("shared-region matvec %s [%llux%llu], %u columns%s: ok\n", t->name,
         (unsigned long long)M, (unsigned long long)K, ncols, bias ? ", bias, scale 0.5" : "");
  free(x), free(ys), free(yi), free(yh);
}

/* Device of model/tensor in ps: NWC_CLIENT_CPU, the device, or -2 when it is not resident. */
static int ps_device(nwc_client *c, const char *model, const char *tensor) {
  nwc_client_resident *p = NULL;
  size_t n = 0;
  int dev = -2;
  CHECK_RC(nwc_client_ps(c, &p, &n));
  for (size_t k = 0; k < n; k++)
    if (!strcmp(p[k].model, model) && !strcmp(p[k].tensor, tensor)) dev = p[k].device;
  free(p);
  return dev;
}

/* The places of model/tensor's replicas in ps: bit 0 host memory, bit 1 + n cuda:n. */
static unsigned ps_places(nwc_client *c, const char *model, const char *tensor) {
  nwc_client_resident *p = NULL;
  size_t n = 0;
  unsigned places = 0;
  CHECK_RC(nwc_client_ps(c, &p, &n));
  for (size_t k = 0; k < n; k++)
    if (!strcmp(p[k].model, model) && !strcmp(p[k].tensor, tensor) && p[k].device >= -1 &&
        p[k].device < 31)
      places |= 1u << (p[k].device + 1);
  free(p);
  return places;
}

/* The shared-region matvecs on the sample's largest matrix and, since the sample has no matrix
 * whose K is not a multiple of 16, on a model written here: M x K (K not a multiple of 16, so
 * the daemon pads x on the device) with a bias of M values. */
static void shared_matvecs(nwc_client *c) {
  const td_tensor *t = find_tensor(true), *bias = NULL;
  for (size_t j = 0; t && j < td_nt; j++)
    if (td_t[j].rows == 1 && td_t[j].cols == t->rows) bias = &td_t[j];
  if (t) shared_tensor(c, "use", t, bias);
  const uint64_t M = 8 + test_below(100), K = 17 + 16 * test_below(20) + test_below(15);
  uint16_t *w = malloc(M * K * 2), *b = malloc(M * 2);
  for (uint64_t i = 0; i < M * K; i++) w[i] = nwc_f32_to_bf16((float)(test_uniform() - 0.5) * 0.1f);
  for (uint64_t i = 0; i < M; i++) b[i] = nwc_f32_to_bf16((float)(test_uniform() - 0.5));
  st_spec sp[2] = {{"odd.w", "BF16", 2, {M, K}, w, M * K * 2}, {"odd.b", "BF16", 1, {M}, b, M * 2}};
  char path[600];
  snprintf(path, sizeof path, "%s/odd.safetensors", td_dir);
  CHECK_RC(st_write(path, sp, 2));
  CHECK_RC(nwc_client_import(c, "odd", path, NULL, NULL));
  /* one tensor alone, then the model (one of its two loads finds its tensor resident) */
  CHECK_RC(nwc_client_load_on(c, "odd", "odd.w", 0, NULL, NULL, NULL));
  CHECK_RC(nwc_client_load_on(c, "odd", NULL, 0, NULL, NULL, NULL));
  CHECK(ps_device(c, "odd", "odd.w") == 0 && ps_device(c, "odd", "odd.b") == 0,
        "the odd model is not on cuda:0");
  td_tensor tw = {"odd.w", M, K, w, NULL}, tb = {"odd.b", 1, M, b, NULL};
  shared_tensor(c, "odd", &tw, &tb);
  CHECK_RC(nwc_client_remove(c, "odd"));
  free(w), free(b);
}

/* Matvec and dequant of t through IPC into this process's device memory. */
static void ipc_tensor(nwc_client *c, const td_tensor *t) {
  const uint64_t M = t->rows, K = t->cols;
  const unsigned ncols = 1 + (unsigned)test_below(4);
  size_t xoff = 256, xb = (size_t)ncols * K * 4, yoff = (xoff + xb + 511) & ~(size_t)255;
  size_t yb = (size_t)ncols * M * 4, total = yoff + yb + 4096;
  uint8_t *mem = NULL;
  CU(cudaMalloc((void **)&mem, total));
  float *x = malloc(xb), *y = malloc(yb);
  uint16_t *yh = malloc(yb / 2);
  for (size_t k = 0; k < (size_t)ncols * K; k++) x[k] = (float)(test_uniform() * 2 - 1);
  cudaIpcMemHandle_t mh;
  CU(cudaIpcGetMemHandle(&mh, mem));
  cudaEvent_t ev;
  CU(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming));
  cudaIpcEventHandle_t eh;
  CU(cudaIpcGetEventHandle(&eh, ev));
  CU(cudaMemcpy(mem + xoff, x, xb, cudaMemcpyHostToDevice));
  CU(cudaMemset(mem + yoff, 0xff, yb)); /* NaN: every element must be written */
  CU(cudaEventRecord(ev, 0));
  nwc_client_cuda_buf bx = {.offset = xoff, .bytes = xb}, by = {.offset = yoff, .bytes = yb};
  memcpy(bx.handle, &mh, 64), memcpy(by.handle, &mh, 64);
  int rc = nwc_client_matvec_cuda(c, "use", t->name, NULL, 1.0f, &bx, K, ncols, &by, 0, &eh);
  CHECK(rc == 0, "matvec_cuda %s: %d %s", t->name, rc, nwc_client_last_error());
  CU(cudaMemcpy(y, mem + yoff, yb, cudaMemcpyDeviceToHost));
  for (unsigned col = 0; rc == 0 && col < ncols; col++) {
    double e = td_matvec_err(t, x + col * K, 1.0, NULL, y + col * M);
    CHECK(e <= 1e-5, "matvec_cuda %s [%llux%llu] col %u/%u: error %.3g", t->name,
          (unsigned long long)M, (unsigned long long)K, col, ncols, e);
  }
  /* BF16 with a scale: the same fp32 sums, scaled and rounded by the daemon's epilogue */
  CU(cudaMemset(mem + yoff, 0xff, yb));
  by.bytes = yb / 2;
  rc = nwc_client_matvec_cuda(c, "use", t->name, NULL, 0.5f, &bx, K, ncols, &by, NWC_CLIENT_BF16,
                              NULL);
  CHECK(rc == 0, "matvec_cuda bf16 %s: %d %s", t->name, rc, nwc_client_last_error());
  CU(cudaMemcpy(yh, mem + yoff, yb / 2, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (size_t i = 0; rc == 0 && i < (size_t)ncols * M; i++) bad += yh[i] != nwc_f32_to_bf16(0.5f * y[i]);
  CHECK(bad == 0, "matvec_cuda bf16 %s: %zu of %llu values differ from rounding 0.5 y", t->name,
        bad, (unsigned long long)(ncols * M));
  /* again on the same buffers (the daemon keeps them open for this connection), fresh x each */
  by.bytes = yb;
  for (int rep = 0; rc == 0 && rep < 10; rep++) {
    for (size_t k = 0; k < (size_t)ncols * K; k++) x[k] = (float)(test_uniform() * 2 - 1);
    CU(cudaMemcpy(mem + xoff, x, xb, cudaMemcpyHostToDevice));
    CU(cudaMemset(mem + yoff, 0xff, yb));
    rc = nwc_client_matvec_cuda(c, "use", t->name, NULL, 1.0f, &bx, K, ncols, &by, 0, NULL);
    CHECK(rc == 0, "matvec_cuda %s again: %d %s", t->name, rc, nwc_client_last_error());
    CU(cudaMemcpy(y, mem + yoff, yb, cudaMemcpyDeviceToHost));
    for (unsigned col = 0; rc == 0 && col < ncols; col++) {
      double e = td_matvec_err(t, x + col * K, 1.0, NULL, y + col * M);
      CHECK(e <= 1e-5, "matvec_cuda %s again, col %u: error %.3g", t->name, col, e);
    }
  }
  printf("ipc matvec %s [%llux%llu], %u columns, 12 calls: ok\n", t->name, (unsigned long long)M,
         (unsigned long long)K, ncols);
  /* dequant into a buffer of its own at an offset */
  size_t db = M * K * 4, doff = 512;
  uint8_t *dmem = NULL;
  CU(cudaMalloc((void **)&dmem, doff + db));
  cudaIpcMemHandle_t dh;
  CU(cudaIpcGetMemHandle(&dh, dmem));
  nwc_client_cuda_buf bd = {.offset = doff, .bytes = M * K * 2};
  memcpy(bd.handle, &dh, 64);
  uint8_t *host = malloc(db);
  for (int f32 = 0; f32 < 2; f32++) {
    CU(cudaMemset(dmem, 0xff, doff + db));
    bd.bytes = M * K * (f32 ? 4 : 2);
    uint64_t rows = 0, cols = 0;
    rc = nwc_client_dequant_cuda(c, "use", t->name, f32 ? 0 : NWC_CLIENT_BF16, &bd, NULL, &rows, &cols);
    CHECK(rc == 0 && rows == M && cols == K, "dequant_cuda %s (%s): %d %s", t->name,
          f32 ? "f32" : "bf16", rc, nwc_client_last_error());
    CU(cudaMemcpy(host, dmem + doff, bd.bytes, cudaMemcpyDeviceToHost));
    if (!f32) {
      CHECK(rc == 0 && !memcmp(host, t->w, M * K * 2), "dequant_cuda %s: BF16 bits differ", t->name);
    } else {
      size_t diff = 0;
      for (size_t i = 0; rc == 0 && i < M * K; i++) {
        float v;
        memcpy(&v, host + 4 * i, 4);
        diff += v != nwc_bf16_to_f32(td_w(t, i));
      }
      CHECK(diff == 0, "dequant_cuda %s f32: %zu values differ", t->name, diff);
    }
  }
  printf("ipc dequant %s: bf16 and f32 ok\n", t->name);
  /* refusals */
  nwc_client_cuda_buf junk = by;
  junk.bytes = yb;
  for (int i = 0; i < 64; i++) junk.handle[i] = (uint8_t)test_rand();
  rc = nwc_client_matvec_cuda(c, "use", t->name, NULL, 1.0f, &bx, K, ncols, &junk, 0, NULL);
  CHECK(rc == -EINVAL, "garbage y handle: %d %s", rc, nwc_client_last_error());
  printf("garbage handle: %s\n", nwc_client_last_error());
  nwc_client_cuda_buf small = bd;
  small.bytes = M * K * 2 - 2;
  rc = nwc_client_dequant_cuda(c, "use", t->name, NWC_CLIENT_BF16, &small, NULL, NULL, NULL);
  CHECK(rc == -EINVAL, "dequant into a buffer 2 bytes short: %d %s", rc, nwc_client_last_error());
  printf("short buffer: %s\n", nwc_client_last_error());
  nwc_client_cuda_buf past = bd;
  past.offset = doff + db + (4u << 20); /* beyond any rounding of the allocation */
  rc = nwc_client_dequant_cuda(c, "use", t->name, NWC_CLIENT_BF16, &past, NULL, NULL, NULL);
  CHECK(rc == -EINVAL && strstr(nwc_client_last_error(), "overruns"),
        "buffer past its allocation: %d %s", rc, nwc_client_last_error());
  printf("past the allocation: %s\n", nwc_client_last_error());
  free(host), free(x), free(y), free(yh);
  cudaEventDestroy(ev);
  cudaFree(dmem), cudaFree(mem);
}

static int ipc_child(const char *sock) {
  nwc_client *c;
  if (nwc_client_connect(sock, &c) < 0) {
    fprintf(stderr, "ipc: connect: %s\n", nwc_client_last_error());
    return 1;
  }
  const td_tensor *a = find_tensor(true), *b = find_tensor(false);
  if (a) ipc_tensor(c, a);
  if (b) ipc_tensor(c, b);
  CHECK(a != NULL, "no tensor with K a multiple of 16 in the sample");
  /* a tensor in host memory cannot serve IPC */
  const td_tensor *h = a;
  CHECK_RC(nwc_client_evict(c, "use", h->name, NULL));
  CHECK_RC(nwc_client_load_on(c, "use", h->name, NWC_CLIENT_CPU, NULL, NULL, NULL));
  nwc_client_cuda_buf z = {.bytes = 1 << 20};
  int rc = nwc_client_dequant_cuda(c, "use", h->name, NWC_CLIENT_BF16, &z, NULL, NULL, NULL);
  CHECK(rc == -ENOTSUP, "dequant_cuda of a host-resident tensor: %d %s", rc, nwc_client_last_error());
  printf("host-resident: %s\n", nwc_client_last_error());
  CHECK_RC(nwc_client_load_on(c, "use", h->name, 0, NULL, NULL, NULL)); /* a second replica */
  CHECK(ps_places(c, "use", h->name) == 3, "%s after loads into host memory and onto cuda:0: "
        "places 0x%x in ps", h->name, ps_places(c, "use", h->name));
  int ndev = 0;
  cudaGetDeviceCount(&ndev);
  if (ndev < 8) {
    rc = nwc_client_load_on(c, "use", h->name, 7, NULL, NULL, NULL);
    CHECK(rc == -ENODEV, "load onto cuda:7: %d %s", rc, nwc_client_last_error());
  }
  CHECK_RC(nwc_client_evict(c, "use", h->name, NULL));
  CHECK(ps_places(c, "use", h->name) == 0, "%s resident after evict: places 0x%x", h->name,
        ps_places(c, "use", h->name));
  nwc_client_free(c);
  return test_failures ? 1 : 0;
}

/* The free memory of device dev, and its total into *total (may be NULL); this process's current
 * device stays 0. */
static uint64_t gpu_free_on(int dev, uint64_t *total) {
  size_t f = 0, t = 0;
  CU(cudaSetDevice(dev));
  CU(cudaMemGetInfo(&f, &t));
  CU(cudaSetDevice(0));
  if (total) *total = t;
  return f;
}

/* A matvec on the named tensor, checked against fp64. */
static void budget_step_matvec(nwc_client *c, const char *name) {
  size_t ti = 0;
  while (ti < td_nt && strcmp(td_t[ti].name, name)) ti++;
  if (ti == td_nt) return;
  const td_tensor *t = &td_t[ti];
  float *x = malloc(t->cols * 4), *y = malloc(t->rows * 4);
  for (uint64_t k = 0; k < t->cols; k++) x[k] = (float)(test_uniform() * 2 - 1);
  int rc = nwc_client_matvec(c, "use", t->name, NULL, 1.0f, x, t->cols, 1, 0, y, t->rows * 4, NULL);
  CHECK(rc == 0 && td_matvec_err(t, x, 1.0, NULL, y) <= 1e-5, "matvec %s after running out: %d %s",
        t->name, rc, rc ? nwc_client_last_error() : "wrong values");
  free(x), free(y);
}

/* 5. Homes (run last, on the second daemon, whose host budget is 6 MiB, under the sample's 9.4):
 * the sample's largest matrix loaded into host memory and pushed out by the LRU loads of the
 * others comes back into host memory for a matvec, its home, not onto cuda:0, the default
 * place; once evicted explicitly (which forgets the home), a matvec loads it onto cuda:0. */
static void home_steps(nwc_client *c) {
  const td_tensor *t = find_tensor(true);
  CHECK_RC(nwc_client_evict(c, "use", NULL, NULL));
  CHECK_RC(nwc_client_load_on(c, "use", t->name, NWC_CLIENT_CPU, NULL, NULL, NULL));
  CHECK(ps_device(c, "use", t->name) == -1, "%s not in host memory (ps: %d)", t->name,
        ps_device(c, "use", t->name));
  for (size_t i = 0; i < td_nt && ps_device(c, "use", t->name) != -2; i++) {
    if (&td_t[i] == t) continue;
    int rc = nwc_client_load_on(c, "use", td_t[i].name, NWC_CLIENT_CPU, NULL, NULL, NULL);
    CHECK(rc == 0 || rc == -ENOSPC, "load cpu %s: %d %s", td_t[i].name, rc,
          nwc_client_last_error());
  }
  CHECK(ps_device(c, "use", t->name) == -2, "%s still resident after the host budget's worth of "
        "other tensors", t->name);
  budget_step_matvec(c, t->name);
  CHECK(ps_device(c, "use", t->name) == -1, "%s pushed out of host memory came back on device %d, "
        "not into host memory, its home", t->name, ps_device(c, "use", t->name));
  CHECK_RC(nwc_client_evict(c, "use", t->name, NULL));
  budget_step_matvec(c, t->name);
  CHECK(ps_device(c, "use", t->name) == 0, "%s evicted explicitly, then used: on device %d, not "
        "cuda:0", t->name, ps_device(c, "use", t->name));
  printf("home: %s came back into host memory after an LRU eviction, onto cuda:0 after an "
         "explicit one\n", t->name);
}

/* 6. A second device, where the machine has one (else a line says it was skipped): the sample's
 * largest matrix loaded onto cuda:1 (ps says so) matvecs within 1e-5 of fp64 and dequantizes bit
 * for bit there, a load of it onto cuda:0 makes a second replica (ps lists both), a whole
 * model loads onto cuda:1 in lanes and every tensor of it dequantizes right, and evicting
 * everything gives cuda:1's memory back. */
static void second_device_steps(nwc_client *c) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 2) {
    printf("second device: this machine has %d, the steps on cuda:1 were skipped\n", ndev);
    return;
  }
  const td_tensor *t = find_tensor(true);
  CHECK_RC(nwc_client_evict(c, "use", NULL, NULL));
  uint64_t f0 = gpu_free_on(1, NULL);
  CHECK_RC(nwc_client_load_on(c, "use", t->name, 1, NULL, NULL, NULL));
  CHECK(ps_device(c, "use", t->name) == 1, "%s on device %d, not cuda:1", t->name,
        ps_device(c, "use", t->name));
  budget_step_matvec(c, t->name);
  CHECK_RC(nwc_client_load_on(c, "use", t->name, 0, NULL, NULL, NULL));
  CHECK(ps_places(c, "use", t->name) == 6, "%s loaded onto cuda:1 and cuda:0: places 0x%x in ps",
        t->name, ps_places(c, "use", t->name));
  CHECK_RC(nwc_client_evict(c, "use", t->name, NULL));
  CHECK_RC(nwc_client_load_on(c, "use", NULL, 1, NULL, NULL, NULL));
  for (size_t i = 0; i < td_nt; i++) {
    size_t n = td_t[i].rows * td_t[i].cols;
    uint16_t *b = malloc(n * 2);
    int rc = nwc_client_dequant(c, "use", td_t[i].name, NWC_CLIENT_BF16, b, n * 2, NULL, NULL, NULL);
    CHECK(rc == 0 && !memcmp(b, td_t[i].w, n * 2) && ps_device(c, "use", td_t[i].name) == 1,
          "dequant %s on cuda:1: %d %s", td_t[i].name, rc,
          rc ? nwc_client_last_error() : "bytes differ or not on cuda:1");
    free(b);
  }
  CHECK_RC(nwc_client_evict(c, "use", NULL, NULL));
  uint64_t f1 = gpu_free_on(1, NULL);
  printf("second device: cuda:1 free memory %llu before, %llu after evicting everything\n",
         (unsigned long long)f0, (unsigned long long)f1);
  CHECK(f1 == f0, "cuda:1's memory did not come back: %llu -> %llu", (unsigned long long)f0,
        (unsigned long long)f1);
}

/* devices against ps and stats (see 7): every place in order, its resident bytes, tensors and
 * pinned bytes ps's sums there, each GPU's budget gpu_budget and its total memory CUDA's, the
 * GPUs' budgets and resident bytes together stats' sums; with empty, nothing resident anywhere
 * and no GPU pool holding memory. */
static void devices_match(nwc_client *c, int ndev, uint64_t gpu_budget, bool empty,
                          const char *when) {
  nwc_client_place *pl = NULL;
  nwc_client_resident *ps = NULL;
  size_t n = 0, nps = 0;
  nwc_client_counters s;
  CHECK_RC(nwc_client_stats(c, &s));
  CHECK_RC(nwc_client_devices(c, &pl, &n));
  CHECK_RC(nwc_client_ps(c, &ps, &nps));
  size_t want = 1 + (size_t)(ndev < 16 ? ndev : 16); /* nwcd serves 16 devices at most */
  CHECK(n == want, "%s: devices lists %zu places, not the host and %zu GPUs", when, n, want - 1);
  CHECK(!empty || nps == 0, "%s: ps lists %zu tensors", when, nps);
  uint64_t gbudget = 0, gresident = 0;
  for (size_t k = 0; k < n && k < want; k++) {
    const nwc_client_place *p = &pl[k];
    int dev = (int)k - 1;
    char name[16];
    if (dev < 0) snprintf(name, sizeof name, "cpu");
    else snprintf(name, sizeof name, "cuda:%d", dev);
    uint64_t bytes = 0, tensors = 0, pinned = 0;
    for (size_t i = 0; i < nps; i++) {
      if (ps[i].device != dev) continue;
      bytes += ps[i].bytes, tensors++;
      if (ps[i].pinned) pinned += ps[i].bytes;
    }
    printf("devices %s: %s budget %llu, %llu bytes in %llu tensors, %llu pinned, %llu of %llu "
           "free, pool %llu\n", when, p->name, (unsigned long long)p->budget,
           (unsigned long long)p->resident_bytes, (unsigned long long)p->resident_tensors,
           (unsigned long long)p->pinned_bytes, (unsigned long long)p->mem_free,
           (unsigned long long)p->mem_total, (unsigned long long)p->pool_idle);
    CHECK(!strcmp(p->name, name), "%s: place %zu is %s, not %s", when, k, p->name, name);
    CHECK(p->resident_bytes == bytes && p->resident_tensors == tensors && p->pinned_bytes == pinned,
          "%s: %s holds %llu bytes in %llu tensors (%llu pinned); ps: %llu in %llu (%llu)", when,
          name, (unsigned long long)p->resident_bytes, (unsigned long long)p->resident_tensors,
          (unsigned long long)p->pinned_bytes, (unsigned long long)bytes,
          (unsigned long long)tensors, (unsigned long long)pinned);
    CHECK(p->mem_total > 0 && p->mem_free <= p->mem_total, "%s: %s has %llu free of %llu", when,
          name, (unsigned long long)p->mem_free, (unsigned long long)p->mem_total);
    if (dev < 0) {
      CHECK(p->budget == s.budget && p->resident_bytes == s.resident_bytes && p->pool_idle == 0,
            "%s: host budget %llu with %llu resident, pool %llu; stats: %llu with %llu", when,
            (unsigned long long)p->budget, (unsigned long long)p->resident_bytes,
            (unsigned long long)p->pool_idle, (unsigned long long)s.budget,
            (unsigned long long)s.resident_bytes);
      continue;
    }
    uint64_t total = 0;
    gpu_free_on(dev, &total);
    CHECK(p->budget == gpu_budget && p->resident_bytes <= p->budget && p->mem_total == total,
          "%s: %s budget %llu (want %llu) with %llu resident, total %llu (CUDA: %llu)", when, name,
          (unsigned long long)p->budget, (unsigned long long)gpu_budget,
          (unsigned long long)p->resident_bytes, (unsigned long long)p->mem_total,
          (unsigned long long)total);
    CHECK(empty ? p->pool_idle == 0 : p->pool_idle < p->mem_total,
          "%s: %s's pool holds %llu bytes beyond its copies", when, name,
          (unsigned long long)p->pool_idle);
    gbudget += p->budget, gresident += p->resident_bytes;
  }
  CHECK(gbudget == s.gpu_budget && gresident == s.gpu_resident_bytes,
        "%s: the GPUs' budgets sum to %llu with %llu resident; stats: %llu with %llu", when,
        (unsigned long long)gbudget, (unsigned long long)gresident,
        (unsigned long long)s.gpu_budget, (unsigned long long)s.gpu_resident_bytes);
  free(pl), free(ps);
}

/* 7. devices (after 2: everything evicted, gpu_budget per device): nothing resident; random
 * tensors loaded onto cuda:0 (LRU within its budget) and one into host memory, one of each
 * pinned; everything evicted again. */
static void devices_steps(nwc_client *c, int ndev, uint64_t gpu_budget) {
  devices_match(c, ndev, gpu_budget, true, "with nothing resident");
  size_t h = test_below(td_nt);
  const td_tensor *host = &td_t[h], *dev = NULL;
  CHECK_RC(nwc_client_load_on(c, "use", host->name, NWC_CLIENT_CPU, NULL, NULL, NULL));
  for (unsigned k = 3 + (unsigned)test_below(6); k > 0; k--) { /* any but the host's */
    const td_tensor *t = &td_t[(h + 1 + test_below(td_nt - 1)) % td_nt];
    int rc = nwc_client_load_on(c, "use", t->name, 0, NULL, NULL, NULL);
    CHECK(rc == 0 || rc == -ENOSPC, "load cuda:0 %s: %d %s", t->name, rc,
          nwc_client_last_error());
    if (rc == 0) dev = t;
  }
  CHECK(dev && ps_device(c, "use", dev->name) == 0, "no tensor stayed on cuda:0");
  CHECK_RC(nwc_client_pin(c, "use", host->name, NULL));
  if (dev) CHECK_RC(nwc_client_pin(c, "use", dev->name, NULL));
  devices_match(c, ndev, gpu_budget, false, "with tensors on cuda:0 and in host memory");
  CHECK_RC(nwc_client_unpin(c, "use", host->name, NULL));
  if (dev) CHECK_RC(nwc_client_unpin(c, "use", dev->name, NULL));
  CHECK_RC(nwc_client_evict(c, "use", NULL, NULL));
  devices_match(c, ndev, gpu_budget, true, "after evicting everything");
}

/* A matvec on mapping m of t (nwc_client_map_matvec, decoded in this process), checked against
 * fp64. */
static void map_matvec(const nwc_client_mapping *m, const td_tensor *t) {
  float *x = malloc(t->cols * 4), *y = malloc(t->rows * 4);
  for (uint64_t k = 0; k < t->cols; k++) x[k] = (float)(test_uniform() * 2 - 1);
  int rc = nwc_client_map_matvec(m, NULL, 1.0f, x, 1, 0, y, t->rows * 4);
  CHECK(rc == 0 && td_matvec_err(t, x, 1.0, NULL, y) <= 1e-5, "matvec on the map of %s: %d %s",
        t->name, rc, rc ? nwc_client_last_error() : "wrong values");
  free(x), free(y);
}

/* 9. Replicas (on the second daemon: 1 GiB per device): the sample's largest matrix loaded into
 * host memory and onto cuda:0 at once (ps lists both, devices counts it at both places); a
 * matvec within 1e-5 of fp64 from each (the last explicit load names the one used); a map of
 * the host replica while the device one exists, its matvec right too, the mapping stopping an
 * evict of the tensor (-EBUSY naming cpu, both replicas kept); once unmapped, one evict drops
 * both.  With a second GPU the same on cuda:0 and cuda:1 (each device's resident bytes count
 * its own replica), a pin of the one in use (cuda:1, the home) refusing the evict naming
 * cuda:1, and after unpin and evict both devices' free memory back where it was. */
static void replica_steps(nwc_client *c, int ndev) {
  const td_tensor *t = find_tensor(true);
  CHECK_RC(nwc_client_evict(c, "use", NULL, NULL));
  CHECK_RC(nwc_client_load_on(c, "use", t->name, NWC_CLIENT_CPU, NULL, NULL, NULL));
  CHECK_RC(nwc_client_load_on(c, "use", t->name, 0, NULL, NULL, NULL));
  CHECK(ps_places(c, "use", t->name) == 3, "%s loaded into host memory and onto cuda:0: places "
        "0x%x in ps", t->name, ps_places(c, "use", t->name));
  devices_match(c, ndev, 1u << 30, false, "with replicas in host memory and on cuda:0");
  budget_step_matvec(c, t->name); /* on cuda:0 */
  CHECK_RC(nwc_client_load_on(c, "use", t->name, NWC_CLIENT_CPU, NULL, NULL, NULL));
  budget_step_matvec(c, t->name); /* in host memory */
  nwc_client_mapping *m = NULL;
  CHECK_RC(nwc_client_map(c, "use", t->name, &m));
  if (m) map_matvec(m, t);
  int rc = nwc_client_evict(c, "use", t->name, NULL);
  CHECK(rc == -EBUSY && strstr(nwc_client_last_error(), " on cpu is mapped by 1"),
        "evict of a tensor whose host replica is mapped: %d %s", rc, nwc_client_last_error());
  CHECK(ps_places(c, "use", t->name) == 3, "an evict refused left places 0x%x",
        ps_places(c, "use", t->name));
  nwc_client_unmap(m);
  /* evict_on: the replica on cuda:0 alone goes, the host's stays and still computes */
  nwc_client_result er;
  CHECK_RC(nwc_client_evict_on(c, "use", t->name, 0, &er));
  CHECK(er.tensors == 1 && ps_places(c, "use", t->name) == 1, "evict_on cuda:0: %llu tensors, "
        "places 0x%x", (unsigned long long)er.tensors, ps_places(c, "use", t->name));
  budget_step_matvec(c, t->name); /* host memory's replica (its home: the last load named it) */
  CHECK(ps_places(c, "use", t->name) == 1, "a matvec after evict_on cuda:0 made places 0x%x",
        ps_places(c, "use", t->name));
  CHECK_RC(nwc_client_evict(c, "use", t->name, NULL));
  CHECK(ps_places(c, "use", t->name) == 0, "%s resident after evict: places 0x%x", t->name,
        ps_places(c, "use", t->name));
  printf("replicas: %s in host memory and on cuda:0, mapped, one evicted alone, then both\n", t->name);
  if (ndev < 2) {
    printf("replicas: this machine has %d GPU, the steps on cuda:0 and cuda:1 were skipped\n",
           ndev);
    return;
  }
  uint64_t f0 = gpu_free_on(0, NULL), g0 = gpu_free_on(1, NULL);
  CHECK_RC(nwc_client_load_on(c, "use", t->name, 0, NULL, NULL, NULL));
  CHECK_RC(nwc_client_load_on(c, "use", t->name, 1, NULL, NULL, NULL));
  CHECK(ps_places(c, "use", t->name) == 6, "%s loaded onto cuda:0 and cuda:1: places 0x%x in ps",
        t->name, ps_places(c, "use", t->name));
  devices_match(c, ndev, 1u << 30, false, "with replicas on cuda:0 and cuda:1");
  budget_step_matvec(c, t->name); /* on cuda:1 */
  CHECK_RC(nwc_client_pin(c, "use", t->name, NULL));
  rc = nwc_client_evict(c, "use", t->name, NULL);
  CHECK(rc == -EBUSY && strstr(nwc_client_last_error(), " on cuda:1 is pinned"),
        "evict of a tensor pinned on cuda:1: %d %s", rc, nwc_client_last_error());
  CHECK(ps_places(c, "use", t->name) == 6, "an evict refused left places 0x%x",
        ps_places(c, "use", t->name));
  CHECK_RC(nwc_client_unpin(c, "use", t->name, NULL));
  CHECK_RC(nwc_client_evict(c, "use", t->name, NULL));
  uint64_t f1 = gpu_free_on(0, NULL), g1 = gpu_free_on(1, NULL);
  CHECK(ps_places(c, "use", t->name) == 0 && f1 == f0 && g1 == g0, "after evicting the replicas "
        "on cuda:0 and cuda:1: places 0x%x, free memory %llu -> %llu and %llu -> %llu",
        ps_places(c, "use", t->name), (unsigned long long)f0, (unsigned long long)f1,
        (unsigned long long)g0, (unsigned long long)g1);
  printf("replicas: %s on cuda:0 and cuda:1, pinned, evicted together\n", t->name);
}

/* Bytes the daemon has loaded so far (stats load_bytes: each read counted once). */
static uint64_t loaded_bytes(nwc_client *c) {
  nwc_client_counters s = {0};
  CHECK_RC(nwc_client_stats(c, &s));
  return s.load_bytes;
}

/* 10. load_places (on the second daemon: 1 GiB per device, 6 MiB of host memory): the sample's
 * largest matrix into host memory and onto cuda:0 in one request, both replicas RESIDENT in
 * ps, its blob read once (the result's raw_bytes and stats' load_bytes grow by its length, not
 * twice); a matvec within 1e-5 of fp64 from the cuda:0 replica (the home: the lowest GPU named)
 * and from the host one (mapped, then through the socket after a load_on cpu that reads
 * nothing); pinned through the flag on both places.  With a second GPU the whole model onto
 * cuda:0 and cuda:1 at once (its lanes), every tensor on both, the model's bytes read once,
 * and the matrix's matvec from each device. */
static void places_steps(nwc_client *c, int ndev) {
  const td_tensor *t = find_tensor(true);
  nwc_client_result res;
  CHECK_RC(nwc_client_evict(c, "use", NULL, NULL));
  uint64_t b0 = loaded_bytes(c);
  int host_gpu[] = {0, NWC_CLIENT_CPU};
  CHECK_RC(nwc_client_load_places(c, "use", t->name, host_gpu, 2, 0, NULL, NULL, &res));
  uint64_t b1 = loaded_bytes(c);
  CHECK(res.tensors == 1 && res.bytes > 0 && res.raw_bytes == res.bytes && b1 - b0 == res.bytes,
        "load_places cpu,cuda:0 of %s: %llu tensors, %llu bytes, %llu read (stats: %llu)",
        t->name, (unsigned long long)res.tensors, (unsigned long long)res.bytes,
        (unsigned long long)res.raw_bytes, (unsigned long long)(b1 - b0));
  CHECK(ps_places(c, "use", t->name) == 3, "load_places cpu,cuda:0: places 0x%x in ps",
        ps_places(c, "use", t->name));
  budget_step_matvec(c, t->name); /* cuda:0, the home */
  nwc_client_mapping *m = NULL;
  CHECK_RC(nwc_client_map(c, "use", t->name, &m));
  if (m) map_matvec(m, t); /* the host replica's bytes */
  nwc_client_unmap(m);
  nwc_client_result on;
  CHECK_RC(nwc_client_load_on(c, "use", t->name, NWC_CLIENT_CPU, NULL, NULL, &on));
  CHECK(loaded_bytes(c) == b1, "load_on cpu of a replica load_places made read %llu bytes",
        (unsigned long long)(loaded_bytes(c) - b1));
  budget_step_matvec(c, t->name); /* host memory's replica */
  CHECK_RC(nwc_client_evict(c, "use", t->name, NULL));
  CHECK_RC(nwc_client_load_places(c, "use", t->name, host_gpu, 2, NWC_CLIENT_LOAD_PIN, NULL, NULL, &res));
  int rc = nwc_client_evict_on(c, "use", t->name, NWC_CLIENT_CPU, NULL);
  int rc0 = nwc_client_evict_on(c, "use", t->name, 0, NULL);
  CHECK(rc == -EBUSY && rc0 == -EBUSY && ps_places(c, "use", t->name) == 3,
        "pin through load_places: evict_on cpu %d, cuda:0 %d, places 0x%x", rc, rc0,
        ps_places(c, "use", t->name));
  CHECK_RC(nwc_client_unpin(c, "use", t->name, NULL));
  CHECK_RC(nwc_client_evict(c, "use", t->name, NULL));
  printf("load_places: %s into host memory and onto cuda:0 from one read of %llu bytes\n",
         t->name, (unsigned long long)res.bytes);
  if (ndev < 2) {
    printf("load_places: this machine has %d GPU, the steps on cuda:0 and cuda:1 were skipped\n",
           ndev);
    return;
  }
  int gpus[] = {1, 0};
  b0 = loaded_bytes(c);
  CHECK_RC(nwc_client_load_places(c, "use", NULL, gpus, 2, 0, NULL, NULL, &res));
  b1 = loaded_bytes(c);
  CHECK(res.tensors == td_nt && res.raw_bytes == res.bytes && b1 - b0 == res.bytes,
        "load_places cuda:0,cuda:1 of the model: %llu tensors, %llu bytes, %llu read (stats: "
        "%llu)", (unsigned long long)res.tensors, (unsigned long long)res.bytes,
        (unsigned long long)res.raw_bytes, (unsigned long long)(b1 - b0));
  for (size_t i = 0; i < td_nt; i++)
    CHECK(ps_places(c, "use", td_t[i].name) == 6, "%s: places 0x%x after load_places cuda:0,"
          "cuda:1", td_t[i].name, ps_places(c, "use", td_t[i].name));
  budget_step_matvec(c, t->name); /* cuda:0, the home */
  CHECK_RC(nwc_client_load_on(c, "use", t->name, 1, NULL, NULL, NULL));
  CHECK(loaded_bytes(c) == b1, "load_on cuda:1 of a replica load_places made read again");
  budget_step_matvec(c, t->name); /* cuda:1 */
  CHECK_RC(nwc_client_evict(c, "use", NULL, NULL));
  printf("load_places: the model onto cuda:0 and cuda:1 from one read of %llu bytes\n",
         (unsigned long long)res.bytes);
}

/* The places a split of model "use" over at[0..n) (devices, NWC_CLIENT_CPU) should give its
 * tensors, computed here as protocol.md's Split says: the places in the order cuda:0, cuda:1,
 * ..., host memory; the tensors in natural name order (strverscmp); each at the first place
 * whose free bytes (budget minus resident, as devices reports them, minus what the split put
 * there before it) take its need (its blob's length rounded up to 4 KiB, and 16 KiB more for the
 * lookup table on a GPU).  want[i] for names[i]; false when one fits nowhere. */
static bool expected_split(nwc_client *c, const int *at, int n, const nwc_client_tensor *t,
                           size_t nt, int *want) {
  nwc_client_place *pl = NULL;
  size_t np = 0;
  CHECK_RC(nwc_client_devices(c, &pl, &np));
  int order[64], no = 0;
  uint64_t left[64];
  for (int dv = 0; dv < 63; dv++)
    for (int i = 0; i < n; i++)
      if (at[i] == dv) order[no++] = dv, i = n;
  for (int i = 0; i < n; i++)
    if (at[i] == NWC_CLIENT_CPU) order[no++] = NWC_CLIENT_CPU, i = n;
  for (int k = 0; k < no; k++) {
    const nwc_client_place *p = (size_t)(order[k] + 1) < np ? &pl[order[k] + 1] : NULL;
    left[k] = p && p->budget > p->resident_bytes ? p->budget - p->resident_bytes : 0;
  }
  free(pl);
  size_t by[256];
  for (size_t i = 0; i < nt; i++) by[i] = i;
  for (size_t i = 1; i < nt; i++) /* insertion sort in natural order */
    for (size_t j = i; j > 0 && strverscmp(t[by[j - 1]].name, t[by[j]].name) > 0; j--) {
      size_t x = by[j];
      by[j] = by[j - 1], by[j - 1] = x;
    }
  for (size_t k = 0; k < nt; k++) {
    size_t i = by[k];
    uint64_t pages = (t[i].nwc_bytes + 4095) & ~UINT64_C(4095);
    want[i] = -2;
    for (int p = 0; p < no && want[i] == -2; p++) {
      uint64_t need = pages + (order[p] >= 0 ? 16384 : 0);
      if (need <= left[p]) want[i] = order[p], left[p] -= need;
    }
    if (want[i] == -2) return false;
  }
  return true;
}

/* One split of "use" over at[0..n): every tensor at the place expected_split computes, alone
 * (one replica), a matvec from a matrix at each place within 1e-5 of fp64 that makes no new
 * replica (a request naming no place uses the split's place, the tensor's home). */
static void split_over(nwc_client *c, const int *at, int n, const char *what) {
  nwc_client_tensor *t = NULL;
  size_t nt = 0;
  CHECK_RC(nwc_client_evict(c, "use", NULL, NULL));
  CHECK_RC(nwc_client_tensors(c, "use", &t, &nt));
  int want[256];
  if (nt > 256 || !expected_split(c, at, n, t, nt, want)) {
    CHECK(false, "split over %s: the sample does not fit the places here", what);
    free(t);
    return;
  }
  nwc_client_result res;
  CHECK_RC(nwc_client_load_places(c, "use", NULL, at, (size_t)n, NWC_CLIENT_LOAD_SPLIT, NULL, NULL,
                                  &res));
  CHECK(res.tensors == nt && res.raw_bytes == res.bytes, "split over %s: %llu tensors, %llu "
        "bytes, %llu read", what, (unsigned long long)res.tensors, (unsigned long long)res.bytes,
        (unsigned long long)res.raw_bytes);
  unsigned seen = 0; /* places with a matrix matvec'd */
  size_t counts[65] = {0};
  for (size_t i = 0; i < nt; i++) {
    unsigned places = ps_places(c, "use", t[i].name);
    CHECK(places == 1u << (want[i] + 1), "split over %s: %s at places 0x%x, expected %d", what,
          t[i].name, places, want[i]);
    counts[want[i] + 1]++;
    if (t[i].rows < 2 || (seen >> (want[i] + 1) & 1)) continue;
    seen |= 1u << (want[i] + 1);
    budget_step_matvec(c, t[i].name);
    CHECK(ps_places(c, "use", t[i].name) == places, "a matvec of %s after the split made places "
          "0x%x (was 0x%x)", t[i].name, ps_places(c, "use", t[i].name), places);
  }
  printf("split over %s: cpu %zu, cuda:0 %zu, cuda:1 %zu tensors, as computed; matvecs from "
         "places 0x%x\n", what, counts[0], counts[1], counts[2], seen);
  free(t);
  CHECK_RC(nwc_client_evict(c, "use", NULL, NULL));
}

/* 11. Split (on the first daemon: 4 MiB per device, under the sample's 9.4; host memory's
 * budget the default): the sample split over cuda:0 and host memory, some tensors on each, as
 * expected_split computes; over cuda:0 alone -ENOSPC with nothing loaded; with a second GPU
 * over cuda:0, cuda:1 and host memory. */
static void split_steps(nwc_client *c, int ndev) {
  int gpu_host[] = {NWC_CLIENT_CPU, 0}, gpu[] = {0};
  split_over(c, gpu_host, 2, "cuda:0,cpu");
  nwc_client_result res;
  int rc = nwc_client_load_places(c, "use", NULL, gpu, 1, NWC_CLIENT_LOAD_SPLIT, NULL, NULL, &res);
  nwc_client_resident *p = NULL;
  size_t n = 0, use = 0;
  CHECK_RC(nwc_client_ps(c, &p, &n));
  for (size_t k = 0; k < n; k++) use += !strcmp(p[k].model, "use");
  free(p);
  CHECK(rc == -ENOSPC && strstr(nwc_client_last_error(), "nothing loaded") && use == 0,
        "split of the sample over cuda:0 alone (4 MiB): %d %s, %zu tensors resident", rc,
        nwc_client_last_error(), use);
  if (ndev < 2) {
    printf("split: this machine has %d GPU, the split over cuda:0 and cuda:1 was skipped\n", ndev);
    return;
  }
  int three[] = {1, NWC_CLIENT_CPU, 0};
  split_over(c, three, 3, "cuda:0,cuda:1,cpu");
}

/* One random step of the budget workload; checks the reply.  on_cpu[i]: tensor i has a replica
 * in host memory (loaded there explicitly; the host budget holds them all), beside which it may
 * have one on cuda:0. */
static void budget_step(nwc_client *c, bool *on_cpu) {
  size_t ti = test_below(td_nt);
  const td_tensor *t = &td_t[ti];
  int op = (int)test_below(8), rc;
  if (op == 0) {
    rc = nwc_client_load_on(c, "use", t->name, 0, NULL, NULL, NULL);
    CHECK(rc == 0 || rc == -ENOSPC, "load cuda:0 %s: %d %s", t->name, rc,
          nwc_client_last_error());
  } else if (op == 1) {
    rc = nwc_client_load_on(c, "use", t->name, NWC_CLIENT_CPU, NULL, NULL, NULL);
    CHECK(rc == 0, "load cpu %s: %d %s", t->name, rc, nwc_client_last_error());
    if (rc == 0) on_cpu[ti] = true;
  } else if (op == 2) {
    CHECK_RC(nwc_client_evict(c, "use", t->name, NULL));
    on_cpu[ti] = false;
  } else if (op <= 4 && t->rows >= 2) {
    float *x = malloc(t->cols * 4), *y = malloc(t->rows * 4);
    for (uint64_t k = 0; k < t->cols; k++) x[k] = (float)(test_uniform() * 2 - 1);
    rc = nwc_client_matvec(c, "use", t->name, NULL, 1.0f, x, t->cols, 1, 0, y, t->rows * 4, NULL);
    CHECK(rc == 0, "matvec %s: %s", t->name, nwc_client_last_error());
    double e = rc == 0 ? td_matvec_err(t, x, 1.0, NULL, y) : 1;
    CHECK(e <= 1e-5, "matvec %s: error %.3g", t->name, e);
    free(x), free(y);
  } else if (op <= 6) {
    size_t n = t->rows * t->cols;
    uint16_t *b = malloc(n * 2);
    rc = nwc_client_dequant(c, "use", t->name, NWC_CLIENT_BF16, b, n * 2, NULL, NULL, NULL);
    CHECK(rc == 0 && !memcmp(b, t->w, n * 2), "dequant %s: %d %s", t->name, rc,
          rc ? nwc_client_last_error() : "bytes differ");
    free(b);
  } else {
    uint64_t idx[4];
    for (int k = 0; k < 4; k++) idx[k] = test_below(t->rows);
    uint16_t *g = malloc(4 * t->cols * 2);
    rc = nwc_client_gather(c, "use", t->name, idx, 4, NWC_CLIENT_BF16, g, 4 * t->cols * 2, NULL, NULL);
    CHECK(rc == 0, "gather %s: %s", t->name, nwc_client_last_error());
    for (int k = 0; rc == 0 && k < 4; k++)
      CHECK(!memcmp(g + k * t->cols, (const uint8_t *)t->w + idx[k] * t->cols * 2, t->cols * 2),
            "gather %s row %llu", t->name, (unsigned long long)idx[k]);
    free(g);
  }
}

/* 3. Device memory that runs out although the budget allows a load (this process holds the
 * rest of the GPU): the daemon evicts the least recently used copy, retries once, and then fails
 * the request with ENOMEM; it goes on serving once memory is back.  The load that fails is of a
 * matrix written here, 8192 x 8192 (about 90 MiB of container), far larger than what evicting
 * the small tensor gives back (its copy, and with it any chunk of the daemon's memory pool that
 * held only that copy), so that the retry fails too whatever the pool's chunk size.  Then the
 * model of that matrix and two smaller ones is loaded whole: its lanes end unevenly, so the
 * lanes of the small ones take parts of the large one (the log says how many, at least one),
 * and every matrix must come out right, matvec against fp64 and gathered rows bit for bit. */
static void oom_steps(nwc_client *c) {
  nwc_client_tensor *ts;
  size_t n;
  CHECK_RC(nwc_client_tensors(c, "use", &ts, &n));
  size_t b = 0;
  for (size_t i = 1; i < n; i++) /* the sample's largest: a few MiB */
    if (ts[i].nwc_bytes > ts[b].nwc_bytes) b = i;
  const uint64_t K = 8192, rows[3] = {8192, 2048, 512};
  const char *const *names = td_big_names;
  uint16_t *w[3];
  td_import_big(c, rows, K, w);
  CHECK_RC(nwc_client_load_on(c, "use", ts[b].name, 0, NULL, NULL, NULL));
  budget_step_matvec(c, ts[b].name); /* the daemon's stream and work buffers exist before */
  static void *hold[400000];
  size_t nhold = 0, f = gpu_free_on(0, NULL);
  if (f > (256u << 20) && cudaMalloc(&hold[nhold], f - (128u << 20)) == cudaSuccess) nhold++;
  for (size_t chunk = 1u << 20; chunk >= 4096; chunk /= 4) /* everything this process can get */
    while (nhold < 400000 && cudaMalloc(&hold[nhold], chunk) == cudaSuccess) nhold++;
  cudaGetLastError();
  nwc_client_counters s0, s1;
  CHECK_RC(nwc_client_stats(c, &s0));
  int rc = nwc_client_load_on(c, "big", "big.w", 0, NULL, NULL, NULL);
  const char *msg = rc ? nwc_client_last_error() : "";
  printf("oom: %.1f MiB left; load of big.w: %d %s\n", gpu_free_on(0, NULL) / 1048576.0, rc, msg);
  CHECK(rc == -ENOMEM && strstr(msg, "retrying"), "load with the GPU full: %d %s", rc, msg);
  CHECK_RC(nwc_client_stats(c, &s1));
  CHECK(s1.evictions > s0.evictions, "the failed allocation evicted nothing (%llu -> %llu)",
        (unsigned long long)s0.evictions, (unsigned long long)s1.evictions);
  for (size_t i = 0; i < nhold; i++) cudaFree(hold[i]);
  CHECK_RC(nwc_client_load_on(c, "big", NULL, 0, NULL, NULL, NULL)); /* still serving */
  long parts = td_helped_parts("big");
  printf("big: loaded whole, %ld parts taken by lanes that had run out of tensors\n", parts);
  CHECK(parts >= 1, "no lane helped load the large matrix (%ld parts)", parts);
  float *x = malloc(K * 4), *y = malloc(rows[0] * 4);
  uint16_t *g = malloc(4 * K * 2);
  for (int m = 0; m < 3; m++) {
    CHECK(ps_device(c, "big", names[m]) == 0, "%s is not on cuda:0", names[m]);
    td_tensor tw = {names[m], rows[m], K, w[m], NULL};
    for (uint64_t k = 0; k < K; k++) x[k] = (float)(test_uniform() * 2 - 1);
    rc = nwc_client_matvec(c, "big", names[m], NULL, 1.0f, x, K, 1, 0, y, rows[m] * 4, NULL);
    CHECK(rc == 0 && td_matvec_err(&tw, x, 1.0, NULL, y) <= 1e-5, "matvec %s after running out: "
          "%d %s", names[m], rc, rc ? nwc_client_last_error() : "wrong values");
    uint64_t idx[4] = {rows[m] - 1, test_below(rows[m]), test_below(rows[m]), 0};
    rc = nwc_client_gather(c, "big", names[m], idx, 4, NWC_CLIENT_BF16, g, 4 * K * 2, NULL, NULL);
    CHECK(rc == 0, "gather %s: %s", names[m], rc ? nwc_client_last_error() : "");
    for (int k = 0; rc == 0 && k < 4; k++)
      CHECK(!memcmp(g + k * K, w[m] + idx[k] * K, K * 2), "gather %s row %llu", names[m],
            (unsigned long long)idx[k]);
  }
  td_crew_races(c, "test_daemon_cuda", names, rows, K, w);
  budget_step_matvec(c, ts[b].name);
  CHECK_RC(nwc_client_remove(c, "big"));
  CHECK_RC(nwc_client_evict(c, "use", NULL, NULL));
  free(x), free(y), free(g), free(ts);
  for (int m = 0; m < 3; m++) free(w[m]);
}

/* q8 (test_daemon_q8.h), a matrix and its bias both quantized with row scales, loaded onto
 * cuda:0 whole (its lanes queue their copies: nothing waits for an fp8 tensor's scales), then
 * socket matvecs with that bias (whose scales come from the device: dev_scales). */
static void fp8_model_with_bias(nwc_client *c) {
  td_q8 q;
  td_import_q8(c, &q);
  CHECK_RC(nwc_client_load_on(c, "q8", NULL, 0, NULL, NULL, NULL));
  CHECK(ps_device(c, "q8", "q.w") == 0 && ps_device(c, "q8", "q.b") == 0,
        "the q8 model is not on cuda:0");
  shared_tensor(c, "q8", &q.w, &q.b);
  td_remove_q8(c, &q);
}

/* Loads model/t onto cuda:0 alone (ps says so), then its dequant and a gather of 1 - 16 random
 * rows (may be more than M) must equal want (M x K BF16) bit for bit. */
static void gpu_rows_check(nwc_client *c, const char *model, const td_tensor *t, const uint16_t *want) {
  const uint64_t M = t->rows, K = t->cols, n = M * K;
  uint64_t idx[16], ng = 1 + test_below(16), rows = 0, cols = 0;
  uint16_t *got = malloc((n > ng * K ? n : ng * K) * 2); /* a dequant, or ng rows */
  CHECK_RC(nwc_client_load_on(c, model, t->name, 0, NULL, NULL, NULL));
  CHECK(ps_device(c, model, t->name) == 0, "%s/%s is not on cuda:0 (ps: %d)", model, t->name,
        ps_device(c, model, t->name));
  memset(got, 0xff, n * 2);
  int rc = nwc_client_dequant(c, model, t->name, NWC_CLIENT_BF16, got, n * 2, &rows, &cols, NULL);
  size_t bad = 0;
  for (uint64_t k = 0; rc == 0 && k < n; k++) bad += got[k] != want[k];
  CHECK(rc == 0 && rows == M && cols == K && bad == 0,
        "%s dequant %s [%llux%llu]: %d %s, %zu of %llu values differ", model, t->name,
        (unsigned long long)M, (unsigned long long)K, rc, rc ? nwc_client_last_error() : "", bad,
        (unsigned long long)n);
  for (size_t k = 0; k < ng; k++) idx[k] = test_below(M);
  memset(got, 0xff, ng * K * 2);
  rc = nwc_client_gather(c, model, t->name, idx, ng, NWC_CLIENT_BF16, got, ng * K * 2, &cols, NULL);
  CHECK(rc == 0 && cols == K, "%s gather %s: %d %s", model, t->name, rc, nwc_client_last_error());
  for (size_t k = 0; rc == 0 && k < ng; k++)
    CHECK(!memcmp(got + k * K, want + idx[k] * K, K * 2), "%s gather %s: row %llu differs", model,
          t->name, (unsigned long long)idx[k]);
  free(got);
}

/* 4. fp8 through the GPU path, matrix by matrix (the budget holds one at a time). */
static void fp8_steps(nwc_client *c) {
  nwc_client_import_opts f8 = {.elem = NWC_ELEM_FP8};
  CHECK_RC(nwc_client_import(c, "use8", getenv("NWC_SAMPLE"), &f8, NULL));
  nwc_client_tensor *ts = NULL;
  size_t nts = 0;
  CHECK_RC(nwc_client_tensors(c, "use8", &ts, &nts));
  unsigned mats = 0;
  uint64_t weights = 0;
  for (size_t i = 0; i < td_nt && test_failures == 0; i++) {
    const td_tensor *t = &td_t[i];
    const uint64_t M = t->rows, K = t->cols, n = M * K;
    size_t j = 0;
    while (j < nts && strcmp(ts[j].name, t->name)) j++;
    CHECK(j < nts, "use8 has no %s", t->name);
    if (j == nts) break;
    bool quantized = ts[j].ndim >= 2;
    CHECK(NWC_ELEM_TYPE(ts[j].elem) == (quantized ? NWC_ELEM_FP8 : NWC_ELEM_BF16),
          "use8/%s (%u dimensions): elem %u", t->name, ts[j].ndim, ts[j].elem);
    if (!quantized) continue;
    uint16_t *w = malloc(n * 2), *want = malloc(n * 2);
    uint8_t *q = malloc(n);
    float *scale = malloc(M * sizeof *scale);
    memcpy(w, t->w, n * 2); /* the sample's view is unaligned */
    CHECK_RC(nwc_quantize_fp8(w, M, K, q, scale));
    for (uint64_t k = 0; k < n; k++) want[k] = nwc_fp8_to_bf16(q[k]);
    gpu_rows_check(c, "use8", t, want);
    if (M >= 2) {
      td_tensor t8 = {t->name, M, K, want, scale};
      shared_tensor(c, "use8", &t8, NULL);
    }
    CHECK_RC(nwc_client_evict(c, "use8", t->name, NULL));
    mats++, weights += n;
    free(w), free(want), free(q), free(scale);
  }
  printf("fp8 on cuda:0: %u matrices, %llu weights: dequant and gather bit for bit, matvec ok\n",
         mats, (unsigned long long)weights);
  CHECK(mats > 0, "no fp8 matrix in use8");
  free(ts);
  CHECK_RC(nwc_client_remove(c, "use8"));
  fp8_model_with_bias(c);
}

/* 8. Layouts 1 and 2 (the tensor-core kernels): the sample imported in the layout, each matrix
 * loaded onto cuda:0 alone (one scratch of nwcd's serves them all in turn): dequant and a gather of
 * random rows bit for bit against the original weights, the matvecs of 0 (1 - 3 columns in one
 * launch) within 1e-5 of fp64. */
static void tensor_core_steps(nwc_client *c, unsigned layout) {
  nwc_client_import_opts o = {.layout = layout};
  char model[16];
  snprintf(model, sizeof model, "use%u", layout);
  CHECK_RC(nwc_client_import(c, model, getenv("NWC_SAMPLE"), &o, NULL));
  unsigned mats = 0;
  for (size_t i = 0; i < td_nt && test_failures == 0; i++) {
    const td_tensor *t = &td_t[i];
    const uint64_t M = t->rows, K = t->cols, n = M * K;
    if (M < 2) continue;
    uint16_t *want = malloc(n * 2);
    memcpy(want, t->w, n * 2); /* the sample's view is unaligned */
    gpu_rows_check(c, model, t, want);
    shared_tensor(c, model, t, NULL);
    CHECK_RC(nwc_client_evict(c, model, t->name, NULL));
    mats++;
    free(want);
  }
  printf("layout %u on cuda:0: %u matrices: dequant and gather bit for bit, matvec ok\n", layout, mats);
  CHECK(mats > 0, "no matrix in %s", model);
  CHECK_RC(nwc_client_remove(c, model));
}

int main(int argc, char **argv) {
  int skip = td_open_sample();
  if (argc >= 4 && !strcmp(argv[1], "ipc")) {
    setenv("NWC_SEED", argv[3], 1);
    test_seed("test_daemon_cuda ipc");
    return skip ? 1 : ipc_child(argv[2]);
  }
  uint64_t seed = test_seed("test_daemon_cuda");
  if (skip) return skip;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  td_backend = "cuda";
  if (td_mkdir("nwc-cuda") < 0) return 1;
  const char *extra[] = {"--gpu-budget", "4M", NULL};
  pid_t d = td_start_daemon(extra);
  CHECK(d > 0, "nwcd did not start");
  if (d <= 0) return td_show_log(), 1;
  nwc_client *c;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  CHECK(!strcmp(nwc_client_backend(c), "cuda"), "backend %s", nwc_client_backend(c));
  CHECK_RC(nwc_client_import(c, "use", getenv("NWC_SAMPLE"), NULL, NULL));
  /* 0. socket matvecs through the shared region (K a multiple of 16 and not) */
  shared_matvecs(c);
  CHECK_RC(nwc_client_evict(c, "use", NULL, NULL));
  /* 1. the IPC client process */
  pid_t kid = fork();
  if (kid == 0) {
    char s[32];
    snprintf(s, sizeof s, "%llu", (unsigned long long)(seed + 1));
    execl("/proc/self/exe", argv[0], "ipc", td_sock, s, (char *)NULL);
    _exit(127);
  }
  int st;
  waitpid(kid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the IPC client failed (status 0x%x)", st);
  /* 2. budget: warm up every kernel once, evict everything, then the baseline */
  bool on_cpu[64] = {0};
  for (size_t i = 0; i < td_nt; i++) budget_step(c, on_cpu);
  CHECK_RC(nwc_client_evict(c, "use", NULL, NULL));
  memset(on_cpu, 0, sizeof on_cpu);
  uint64_t free0 = gpu_free_on(0, NULL);
  nwc_client_counters s;
  unsigned steps = 0;
  for (; steps < 600 && test_failures < 5; steps++) {
    budget_step(c, on_cpu);
    if (steps % 50 == 0) {
      CHECK_RC(nwc_client_stats(c, &s));
      CHECK(s.gpu_resident_bytes <= s.gpu_budget, "GPU resident %llu over its budget %llu",
            (unsigned long long)s.gpu_resident_bytes, (unsigned long long)s.gpu_budget);
      nwc_client_resident *p;
      size_t n;
      CHECK_RC(nwc_client_ps(c, &p, &n));
      size_t host = 0, want_host = 0;
      for (size_t k = 0; k < n; k++) {
        size_t ti = 0;
        while (ti < td_nt && strcmp(td_t[ti].name, p[k].tensor)) ti++;
        CHECK(ti < td_nt && (p[k].device == 0 || (p[k].device == -1 && on_cpu[ti])),
              "ps: %s on device %d", p[k].tensor, p[k].device);
        host += p[k].device == -1;
      }
      for (size_t i = 0; i < td_nt; i++) want_host += on_cpu[i];
      CHECK(host == want_host, "ps: %zu tensors in host memory, loaded there %zu", host,
            want_host);
      free(p);
    }
  }
  CHECK_RC(nwc_client_stats(c, &s));
  printf("budget: %u steps, %llu loads, %llu evictions, %llu mapped computes, GPU budget %llu\n",
         steps, (unsigned long long)s.loads, (unsigned long long)s.evictions,
         (unsigned long long)s.mapped_computes, (unsigned long long)s.gpu_budget);
  CHECK(s.evictions > 0, "no evictions under a budget smaller than the model");
  CHECK_RC(nwc_client_evict(c, "use", NULL, NULL));
  CHECK_RC(nwc_client_stats(c, &s));
  uint64_t free1 = gpu_free_on(0, NULL);
  printf("GPU free memory: %llu before, %llu after evicting everything (%+lld)\n",
         (unsigned long long)free0, (unsigned long long)free1, (long long)(free1 - free0));
  CHECK(s.gpu_resident_bytes == 0 && s.resident_bytes == 0, "resident after evicting all: %llu %llu",
        (unsigned long long)s.gpu_resident_bytes, (unsigned long long)s.resident_bytes);
  CHECK(free1 == free0, "device memory did not come back: %llu -> %llu",
        (unsigned long long)free0, (unsigned long long)free1);
  devices_steps(c, ndev, 4u << 20);
  fp8_steps(c);
  tensor_core_steps(c, 2);
  tensor_core_steps(c, 1);
  split_steps(c, ndev);
  nwc_client_free(c);
  CHECK(td_stop_daemon(d) == 0, "SIGTERM exit");
  /* 3. again with a budget that allows the large load (the same store) */
  const char *more[] = {"--gpu-budget", "1G", "--budget", "6M", NULL};
  d = td_start_daemon(more);
  CHECK(d > 0, "nwcd did not start again");
  if (d <= 0) return td_show_log(), 1;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  oom_steps(c);
  home_steps(c);
  replica_steps(c, ndev);
  places_steps(c, ndev);
  second_device_steps(c);
  nwc_client_free(c);
  CHECK(td_stop_daemon(d) == 0, "SIGTERM exit");
  if (test_failures) td_show_log();
  td_cleanup();
  return test_exit("test_daemon_cuda");
}
