/*
 * test_store_import.c - import round trips: BF16 (exact), F16/F32 (converted RNE), F8_E4M3 with a
 * folded per-row scale and with a block scale kept apart, 1-D and 3-D shapes, odd names, the fp8
 * quantize option, a sharded model, the sample model; progress reports; read and mmap paths;
 * name rules; taken names; the store lock; reopen; remove.  Large tensors (one encoded by all
 * threads, raw planes written in many chunks, fp8 with a folded scale, a converted F32) give the
 * same blobs on 1 and on 3 threads, and the BF16 one the blob of nwc_tensor_encode.
 */
#include "test_store_util.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>

static uint16_t rand_bf16(void) {
  double g = (test_uniform() + test_uniform() + test_uniform() - 1.5) * 0.05;
  return nwc_f32_to_bf16((float)g);
}

static uint8_t rand_fp8(void) {
  uint8_t b;
  do b = (uint8_t)test_rand();
  while ((b & 0x7f) == 0x7f);
  return b;
}

typedef struct prog {
  uint64_t last, total;
  int calls, bad;
} prog;

static int cancel_progress(void *ctx, uint64_t done, uint64_t total) {
  (void)ctx, (void)done, (void)total;
  return 1;
}

static int on_progress(void *ctx, uint64_t done, uint64_t total) {
  prog *p = ctx;
  if (done < p->last || done > total || (p->calls && total != p->total)) p->bad++;
  p->last = done, p->total = total, p->calls++;
  return 0;
}

/* Dequantizes model/tensor and compares with want (rows x cols BF16 bits, K16 stride in out). */
static void check_tensor(nwc_store *s, const char *model, const char *name, const uint16_t *want,
                         const float *want_scale, unsigned want_type, const char *conv) {
  nwc_tensor_info *ti = NULL;
  int rc = nwc_store_tensor(s, model, name, &ti);
  CHECK(rc == 0, "info %s/%s: %s", model, name, nwc_error_detail());
  if (rc) return;
  CHECK(NWC_ELEM_TYPE(ti->elem) == want_type, "%s: elem %u", name, ti->elem);
  CHECK(!conv || strstr(ti->conversion, conv), "%s: conversion '%s', want '%s'", name,
        ti->conversion, conv);
  /* A large blob on whole pages (O_DIRECT), a small one packed on 64-byte boundaries. */
  CHECK(ti->offset % NWC_STORE_PACK_ALIGN == 0 && ti->length % NWC_STORE_PACK_ALIGN == 0 &&
            (ti->length < NWC_STORE_PACK_MAX + NWC_STORE_ALIGN ||
             (ti->offset % NWC_STORE_ALIGN == 0 && ti->length % NWC_STORE_ALIGN == 0)),
        "%s: blob at %llu, %llu bytes: neither packed nor on whole pages", name,
        (unsigned long long)ti->offset, (unsigned long long)ti->length);
  for (int pass = 0; pass < 2; pass++) {
    nwc_tensor t;
    nwc_store_map *map = NULL;
    rc = pass ? nwc_store_map_info(ti, &map, &t) : nwc_store_read_info(ti, &t);
    CHECK(rc == 0, "%s %s: %s", pass ? "map" : "read", name, nwc_error_detail());
    if (rc) continue;
    uint64_t lay[4];
    nwc_layout(t.rows, t.cols, t.elem, lay);
    uint64_t K16 = lay[NWC_LAYOUT_K16];
    uint16_t *out = malloc(t.rows * K16 * 2);
    CHECK_RC(nwc_dequant(&t, out));
    uint64_t bad = 0;
    for (uint64_t r = 0; r < t.rows; r++)
      for (uint64_t c = 0; c < t.cols; c++) bad += out[r * K16 + c] != want[r * t.cols + c];
    CHECK(bad == 0, "%s: %llu weights differ", name, (unsigned long long)bad);
    if (want_scale) {
      CHECK(t.scale != NULL, "%s: no scale", name);
      for (uint64_t r = 0; t.scale && r < t.rows; r++)
        CHECK(t.scale[r] == want_scale[r], "%s: scale[%llu] %g != %g", name,
              (unsigned long long)r, (double)t.scale[r], (double)want_scale[r]);
    } else {
      CHECK(t.scale == NULL, "%s: unexpected scale", name);
    }
    free(out);
    if (pass) nwc_store_unmap(map);
    else nwc_tensor_release(&t);
  }
  nwc_tensor_info_free(ti, 1);
}

/* A second thread using the same handle while an import runs on the first. */
typedef struct reader_arg {
  nwc_store *s;
  atomic_int stop;
  int rounds, errors;
} reader_arg;

static void *reader(void *p) {
  reader_arg *a = p;
  while (!atomic_load(&a->stop)) {
    nwc_model_info *m = NULL;
    size_t n = 0;
    if (nwc_store_models(a->s, &m, &n) < 0) a->errors++;
    nwc_model_info_free(m, n);
    nwc_tensor t;
    if (nwc_store_read(a->s, "all", "t3", &t) < 0) a->errors++;
    else nwc_tensor_release(&t);
    a->rounds++;
  }
  return NULL;
}

static void test_sample(nwc_store *s, const char *dir) {
  const char *path = getenv("NWC_SAMPLE");
  if (!path || access(path, R_OK)) {
    printf("sample model not found; skipping that part\n");
    return;
  }
  prog p = {0};
  nwc_import_opts o = {.threads = 2, .progress = on_progress, .progress_ctx = &p};
  reader_arg ra = {s, 0, 0, 0};
  pthread_t tid;
  pthread_create(&tid, NULL, reader, &ra);
  CHECK_RC(nwc_store_import(s, "use-lite", path, &o));
  atomic_store(&ra.stop, 1);
  pthread_join(tid, NULL);
  CHECK(ra.errors == 0 && ra.rounds > 0, "concurrent reader: %d errors in %d rounds", ra.errors,
        ra.rounds);
  printf("concurrent reader: %d rounds during the import\n", ra.rounds);
  CHECK(p.calls >= 2 && !p.bad && p.last == p.total && p.total > 0, "progress %d calls %d bad",
        p.calls, p.bad);
  nwc_st_file *f;
  CHECK_RC(nwc_st_open(path, &f));
  nwc_model_info *mi = NULL;
  CHECK_RC(nwc_store_model(s, "use-lite", &mi));
  CHECK(mi && mi->tensors == f->count, "tensors");
  if (mi) printf("sample: %llu tensors, %llu source bytes -> %llu stored (%.4f)\n",
                 (unsigned long long)mi->tensors, (unsigned long long)mi->source_bytes,
                 (unsigned long long)mi->nwc_bytes, (double)mi->nwc_bytes / (double)mi->source_bytes);
  nwc_model_info_free(mi, 1);
  for (size_t i = 0; i < f->count; i++) {
    const nwc_st_tensor *t = &f->tensors[i];
    uint16_t *w = malloc(t->numel * 2);
    memcpy(w, nwc_st_data(f, t), t->numel * 2);
    check_tensor(s, "use-lite", t->name, w, NULL, NWC_ELEM_BF16, "none");
    free(w);
  }
  nwc_st_close(f);
  check_store_consistent(s, dir);
}

/* Every array of t and u is the same. */
static int same_tensor(const nwc_tensor *t, const nwc_tensor *u) {
  return t->elem == u->elem && t->rows == u->rows && t->cols == u->cols &&
         !memcmp(t->psym, u->psym, 16) && t->nblocks == u->nblocks &&
         t->data_bytes == u->data_bytes && t->raw_bytes == u->raw_bytes &&
         !memcmp(t->bases, u->bases, (t->nblocks + 1) * 8) &&
         !memcmp(t->hdr, u->hdr, t->nblocks * NWC_LANES) &&
         !memcmp(t->data, u->data, t->data_bytes) && !memcmp(t->raw, u->raw, t->raw_bytes) &&
         !t->scale == !u->scale && (!t->scale || !memcmp(t->scale, u->scale, t->rows * 4));
}

static void test_large(nwc_store *s, const char *dir, const char *src) {
  enum { BM = 2100, BK = 4100, FM = 2600, FK = 4100, CM = 300, CK = 1000 }; /* 17, 10.7, 1.2 MB */
  uint16_t *big = malloc((size_t)BM * BK * 2);
  uint8_t *f8 = malloc((size_t)FM * FK);
  float *fs = malloc(FM * sizeof *fs), *cf = malloc(CM * CK * sizeof *cf);
  for (size_t i = 0; i < (size_t)BM * BK; i++) big[i] = rand_bf16();
  for (size_t i = 0; i < (size_t)FM * FK; i++) f8[i] = rand_fp8();
  for (int i = 0; i < FM; i++) fs[i] = (float)(0.01 + test_uniform());
  for (int i = 0; i < CM * CK; i++) cf[i] = (float)(test_uniform() - 0.5);
  st_spec spec[] = {
      {"big", "BF16", 2, {BM, BK}, big, (size_t)BM * BK * 2},
      {"f8.weight", "F8_E4M3", 2, {FM, FK}, f8, (size_t)FM * FK},
      {"f8.weight_scale_inv", "F32", 1, {FM}, fs, FM * sizeof *fs},
      {"conv", "F32", 2, {CM, CK}, cf, CM * CK * sizeof *cf},
  };
  char path[700];
  snprintf(path, sizeof path, "%s/large.safetensors", src);
  CHECK_RC(st_write(path, spec, 4));
  nwc_import_opts one = {.threads = 1}, three = {.threads = 3};
  CHECK_RC(nwc_store_import(s, "large1", path, &one));
  CHECK_RC(nwc_store_import(s, "large3", path, &three));
  nwc_tensor want;
  CHECK_RC(nwc_tensor_encode(big, BM, BK, NWC_ELEM_BF16, NULL, &want));
  const char *names[] = {"big", "f8.weight", "conv"};
  for (int i = 0; i < 3; i++) {
    nwc_tensor a, b;
    int ra = nwc_store_read(s, "large1", names[i], &a), rb = nwc_store_read(s, "large3", names[i], &b);
    CHECK(ra == 0 && rb == 0, "%s: read %d %d (%s)", names[i], ra, rb, nwc_error_detail());
    if (ra || rb) continue;
    CHECK(same_tensor(&a, &b), "%s: 1 and 3 threads stored different tensors", names[i]);
    CHECK(i || same_tensor(&a, &want), "big: not what nwc_tensor_encode writes");
    nwc_tensor_release(&a);
    nwc_tensor_release(&b);
  }
  nwc_tensor_release(&want);
  check_tensor(s, "large3", "big", big, NULL, NWC_ELEM_BF16, "none");
  uint16_t *f8_want = malloc((size_t)FM * FK * 2);
  for (size_t i = 0; i < (size_t)FM * FK; i++) f8_want[i] = nwc_fp8_to_bf16(f8[i]);
  check_tensor(s, "large3", "f8.weight", f8_want, fs, NWC_ELEM_FP8, "folded");
  free(f8_want);
  check_store_consistent(s, dir);
  CHECK_RC(nwc_store_remove(s, "large1"));
  CHECK_RC(nwc_store_remove(s, "large3"));
  free(big);
  free(f8);
  free(fs);
  free(cf);
}

int main(void) {
  test_seed("test_store_import");
  char dir[512], src[600], path[700];
  make_tmpdir(dir, sizeof dir, "store");
  make_tmpdir(src, sizeof src, "src");

  /* A file with every dtype and shape kind. */
  enum { M = 40, K = 700, H_M = 33, H_K = 17, F8_M = 24, F8_K = 64 };
  uint16_t *wb = malloc(M * K * 2), bias[K], h16[H_M * H_K], h_want[H_M * H_K];
  float t3[4 * 5 * 30];
  uint16_t t3_want[4 * 5 * 30], bias_want[K];
  uint8_t f8[F8_M * F8_K], f8b[16 * 32];
  uint16_t f8_want[F8_M * F8_K], f8b_want[16 * 32];
  float f8s[F8_M], blk[1] = {0.5f};
  for (int i = 0; i < M * K; i++) wb[i] = rand_bf16();
  for (int i = 0; i < K; i++) bias_want[i] = bias[i] = rand_bf16();
  for (int i = 0; i < 600; i++) {
    t3[i] = (float)ldexp(test_uniform() - 0.5, (int)test_below(120) - 60); /* exercises RNE */
    t3_want[i] = nwc_f32_to_bf16(t3[i]);
  }
  for (int i = 0; i < H_M * H_K; i++) {
    float f = (float)(test_uniform() * 2 - 1) * 100.0f;
    _Float16 h = (_Float16)f;
    memcpy(&h16[i], &h, 2);
    h_want[i] = nwc_f32_to_bf16((float)h);
  }
  for (int i = 0; i < F8_M * F8_K; i++) f8_want[i] = nwc_fp8_to_bf16(f8[i] = rand_fp8());
  for (int i = 0; i < 16 * 32; i++) f8b_want[i] = nwc_fp8_to_bf16(f8b[i] = rand_fp8());
  for (int i = 0; i < F8_M; i++) f8s[i] = (float)(0.01 + test_uniform());
  const char *odd = "model.layers.0/self_attn.q_proj.w\xc3\xbc"; /* dots, slash, u-umlaut */
  st_spec spec[] = {
      {odd, "BF16", 2, {M, K}, wb, M * K * 2},
      {"bias", "BF16", 1, {K}, bias, K * 2},
      {"t3", "F32", 3, {4, 5, 30}, t3, sizeof t3},
      {"h", "F16", 2, {H_M, H_K}, h16, sizeof h16},
      {"f8.weight", "F8_E4M3", 2, {F8_M, F8_K}, f8, sizeof f8},
      {"f8.weight_scale_inv", "F32", 1, {F8_M}, f8s, sizeof f8s},
      {"f8b.weight", "F8_E4M3", 2, {16, 32}, f8b, sizeof f8b},
      {"f8b.weight_scale_inv", "F32", 2, {1, 1}, blk, sizeof blk},
  };
  snprintf(path, sizeof path, "%s/all.safetensors", src);
  CHECK_RC(st_write(path, spec, 8));

  nwc_store *s = NULL;
  CHECK_RC(nwc_store_open(dir, NWC_STORE_CREATE, &s));
  if (!s) return 1;
  CHECK(nwc_store_schema_version(s) == NWC_STORE_SCHEMA_VERSION, "schema version");
  nwc_store *s2 = NULL;
  CHECK(nwc_store_open(src, 0, &s2) == -ENOENT && access(src, F_OK) == 0, "not a store");
  {
    char lk[700];
    snprintf(lk, sizeof lk, "%s/lock", src);
    CHECK(access(lk, F_OK) != 0, "opening a non-store created files in it");
  }
  CHECK(nwc_store_open(dir, 0, &s2) == -EBUSY, "second writer must get -EBUSY");
  test_large(s, dir, src);

  prog p = {0};
  nwc_import_opts o = {.threads = 2, .progress = on_progress, .progress_ctx = &p};
  CHECK_RC(nwc_store_import(s, "all", path, &o));
  CHECK(p.calls >= 2 && !p.bad && p.last == p.total, "progress: %d calls, %d bad, %llu/%llu",
        p.calls, p.bad, (unsigned long long)p.last, (unsigned long long)p.total);
  check_tensor(s, "all", odd, wb, NULL, NWC_ELEM_BF16, "none");
  check_tensor(s, "all", "bias", bias_want, NULL, NWC_ELEM_BF16, "none");
  check_tensor(s, "all", "t3", t3_want, NULL, NWC_ELEM_BF16, "f32->bf16 rne");
  check_tensor(s, "all", "h", h_want, NULL, NWC_ELEM_BF16, "f16->bf16 rne");
  check_tensor(s, "all", "f8.weight", f8_want, f8s, NWC_ELEM_FP8, "folded");
  check_tensor(s, "all", "f8b.weight", f8b_want, NULL, NWC_ELEM_FP8, "kept apart");
  nwc_tensor_info *ti = NULL;
  size_t nt = 0;
  CHECK_RC(nwc_store_tensors(s, "all", &ti, &nt));
  CHECK(nt == 8, "%zu tensors", nt);
  for (size_t i = 0; i < nt; i++) {
    if (!strcmp(ti[i].name, "t3"))
      CHECK(ti[i].rows == 4 && ti[i].cols == 150 && ti[i].ndim == 3 && ti[i].shape[2] == 30 &&
                !strcmp(ti[i].dtype, "F32"),
            "t3 shape");
    if (!strcmp(ti[i].name, "bias")) CHECK(ti[i].rows == 1 && ti[i].cols == K, "bias 1xN");
    if (!strcmp(ti[i].name, "f8.weight"))
      CHECK(ti[i].scale_tensor && !strcmp(ti[i].scale_tensor, "f8.weight_scale_inv"), "scale name");
  }
  CHECK(!strcmp(ti[0].name, odd) && !strcmp(ti[7].name, "f8b.weight_scale_inv"), "source order");
  nwc_tensor_info_free(ti, nt);

  /* Names. */
  const char *bad_models[] = {"", "-x", ".x", "a/b", "a b", "../x", "x\n"};
  for (size_t i = 0; i < sizeof bad_models / sizeof *bad_models; i++)
    CHECK(nwc_store_import(s, bad_models[i], path, NULL) == -EINVAL, "model name '%s'",
          bad_models[i]);
  char longname[200];
  memset(longname, 'a', 129), longname[129] = 0;
  CHECK(!nwc_model_name_valid(longname), "129 chars");
  longname[128] = 0;
  CHECK(nwc_model_name_valid(longname) && nwc_model_name_valid("Qwen2.5-7B_it"), "valid names");
  CHECK(nwc_tensor_name_valid("a.b/c") && !nwc_tensor_name_valid("") &&
            !nwc_tensor_name_valid("a\tb") && !nwc_tensor_name_valid("\xc3") &&
            !nwc_tensor_name_valid("\xc2\x85") && !nwc_tensor_name_valid("\xed\xa0\x80"),
        "tensor names");
  int before = count_containers(dir);
  CHECK(nwc_store_import(s, "all", path, NULL) == -EEXIST, "taken name");
  CHECK(count_containers(dir) == before, "a refused import wrote a file");
  nwc_import_opts co = {.progress = cancel_progress};
  CHECK(nwc_store_import(s, "cancelled", path, &co) == -ECANCELED, "cancel: %s",
        nwc_error_detail());
  CHECK(count_containers(dir) == before, "a cancelled import left a file");
  nwc_model_info *cm = NULL;
  CHECK(nwc_store_model(s, "cancelled", &cm) == -ENOENT, "a cancelled import was published");
  nwc_import_opts bad = {.elem = 7};
  CHECK(nwc_store_import(s, "bad-opt", path, &bad) == -EINVAL, "bad elem option");

  /* fp8 quantization option. */
  nwc_import_opts q = {.elem = NWC_ELEM_FP8};
  CHECK_RC(nwc_store_import(s, "all-fp8", path, &q));
  {
    uint8_t *qq = malloc(M * K);
    float qs[M];
    uint16_t *qw = malloc(M * K * 2);
    CHECK_RC(nwc_quantize_fp8(wb, M, K, qq, qs));
    for (int i = 0; i < M * K; i++) qw[i] = nwc_fp8_to_bf16(qq[i]);
    check_tensor(s, "all-fp8", odd, qw, qs, NWC_ELEM_FP8, "bf16->fp8");
    check_tensor(s, "all-fp8", "bias", bias_want, NULL, NWC_ELEM_BF16, "none");
    free(qq);
    free(qw);
  }
  /* Layouts 1/2: passed through; either stored or refused by the codec with -ENOTSUP. */
  int rc = 0;
  for (unsigned l = 1; l <= 2; l++) {
    nwc_import_opts lo = {.layout = l, .elem = l == 2 ? NWC_ELEM_FP8 : NWC_ELEM_BF16};
    char mname[32];
    snprintf(mname, sizeof mname, "all-l%u", l);
    rc = nwc_store_import(s, mname, path, &lo);
    CHECK(rc == 0 || rc == -ENOTSUP, "layout %u: %d %s", l, rc, nwc_error_detail());
    printf("layout %u import: %s\n", l, rc == 0 ? "stored" : "not supported by the codec yet");
    if (rc) continue;
    if (l == 1) check_tensor(s, mname, "h", h_want, NULL, NWC_ELEM_BF16, "f16->bf16");
    else check_tensor(s, mname, "bias", bias_want, NULL, NWC_ELEM_BF16, "none");
    check_tensor(s, mname, "f8.weight", f8_want, f8s, NWC_ELEM_FP8, "folded");
    if (l == 1) check_tensor(s, mname, odd, wb, NULL, NWC_ELEM_BF16, "none");
  }

  /* Sharded: two shards and an index. */
  {
    char p1[800], p2[800], pi[800];
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", src);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", src);
    snprintf(pi, sizeof pi, "%s/model.safetensors.index.json", src);
    CHECK_RC(st_write(p1, spec, 3));
    CHECK_RC(st_write(p2, spec + 3, 5));
    json_t *root = json_object(), *map = json_object();
    for (int i = 0; i < 8; i++)
      json_object_set_new(map, spec[i].name,
                          json_string(i < 3 ? "model-00001-of-00002.safetensors"
                                            : "model-00002-of-00002.safetensors"));
    json_object_set_new(root, "metadata", json_pack("{s:i}", "total_size", 1));
    json_object_set_new(root, "weight_map", map);
    CHECK(json_dump_file(root, pi, 0) == 0, "write index");
    json_decref(root);
    CHECK_RC(nwc_store_import(s, "sharded", pi, NULL));
    nwc_model_info *mi = NULL;
    CHECK_RC(nwc_store_model(s, "sharded", &mi));
    CHECK(mi && mi->nsources == 2 && mi->tensors == 8, "sharded: sources/tensors");
    nwc_model_info_free(mi, 1);
    check_tensor(s, "sharded", "h", h_want, NULL, NWC_ELEM_BF16, "f16->bf16");
    check_tensor(s, "sharded", "f8.weight", f8_want, f8s, NWC_ELEM_FP8, "folded");
    check_tensor(s, "sharded", odd, wb, NULL, NWC_ELEM_BF16, "none");
    /* The same through descriptors, as nwcd receives them. */
    int fi = open(pi, O_RDONLY), f1 = open(p1, O_RDONLY), f2 = open(p2, O_RDONLY);
    nwc_import_file files[2] = {{"model-00002-of-00002.safetensors", f2},
                                {"model-00001-of-00002.safetensors", f1}};
    CHECK_RC(nwc_store_import_fds(s, "sharded-fd", fi, files, 2, NULL));
    check_tensor(s, "sharded-fd", "t3", t3_want, NULL, NWC_ELEM_BF16, "f32->bf16");
    CHECK(nwc_store_import_fds(s, "sharded-fd2", fi, files, 1, NULL) == -ENOENT,
          "missing shard fd");
    close(fi), close(f1), close(f2);
  }
  test_sample(s, dir);
  check_store_consistent(s, dir);

  /* Reopen: everything persists. */
  nwc_model_info *mi = NULL;
  size_t nm = 0, nm2 = 0;
  CHECK_RC(nwc_store_models(s, &mi, &nm));
  nwc_model_info_free(mi, nm);
  nwc_store_close(s);
  CHECK_RC(nwc_store_open(dir, 0, &s));
  CHECK(nwc_store_swept(s) == 0, "clean store swept %llu", (unsigned long long)nwc_store_swept(s));
  CHECK_RC(nwc_store_models(s, &mi, &nm2));
  CHECK(nm == nm2 && nm >= 4, "%zu models before, %zu after", nm, nm2);
  for (size_t i = 0; i < nm2; i++) CHECK_RC(nwc_store_remove(s, mi[i].name));
  nwc_model_info_free(mi, nm2);
  CHECK(nwc_store_remove(s, "all") == -ENOENT, "remove twice");
  CHECK(count_containers(dir) == 0, "containers left after removing everything");
  CHECK_RC(nwc_store_import(s, "keep", path, NULL));
  nwc_store_close(s);
  /* Read-only opens share the lock. */
  nwc_store *r1 = NULL, *r2 = NULL;
  CHECK_RC(nwc_store_open(dir, NWC_STORE_RDONLY, &r1));
  CHECK_RC(nwc_store_open(dir, NWC_STORE_RDONLY, &r2));
  CHECK(r1 && nwc_store_import(r1, "x", path, NULL) == -EROFS, "read-only import");
  nwc_store *w = NULL;
  CHECK(nwc_store_open(dir, 0, &w) == -EBUSY, "writer while readers hold the store");
  nwc_verify_stats vs;
  CHECK_RC(nwc_store_verify(r1, NULL, NULL, NULL, &vs));
  CHECK(vs.models == 1 && vs.tensors == 8, "read-only verify");
  nwc_tensor t;
  CHECK_RC(nwc_store_read(r2, "keep", "t3", &t));
  nwc_tensor_release(&t);
  nwc_store_close(r1);
  nwc_store_close(r2);
  nwc_store_close(NULL);
  free(wb);
  rm_rf(dir);
  rm_rf(src);
  return test_exit("test_store_import");
}
