/*
 * test_store_transfer.c - a model out of one store and into another in its portable form
 * (store/transfer.c): export, then receive in pieces of random sizes; every tensor of the copy
 * reads back and decodes to the original's weights, verify is clean, and the copy exports to the
 * same config and bytes (what makes a second push upload nothing).  Also: a flipped byte anywhere
 * is refused at its chunk and leaves nothing behind; a receive closed early leaves nothing; a
 * failed write (the file size limit) is retried by the next write; bad
 * configs are refused before a file is made; a config that agrees with tampered bytes (checksums
 * recomputed) is caught at commit, where every blob is validated as an import's is.
 */
#include "test_store_util.h"

#include <jansson.h>
#include <signal.h>
#include <sys/resource.h>
#include <xxhash.h>

typedef struct membuf {
  uint8_t *p;
  size_t n, cap;
} membuf;

static int collect(void *ctx, const void *p, size_t n) {
  membuf *b = ctx;
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2;
    b->p = realloc(b->p, b->cap);
  }
  memcpy(b->p + b->n, p, n);
  b->n += n;
  return 0;
}

/* Receives bytes into store s as model in random pieces; returns the first error (0: committed). */
static int receive(nwc_store *s, const char *model, const char *config, size_t clen,
                   const uint8_t *bytes, size_t n) {
  nwc_store_receive *r;
  int rc = nwc_store_receive_open(s, model, config, clen, &r);
  if (rc < 0) return rc;
  CHECK(nwc_store_receive_size(r) == n, "receive size %llu, export %zu",
        (unsigned long long)nwc_store_receive_size(r), n);
  size_t at = 0;
  while (rc == 0 && at < n) {
    size_t k = 1 + test_below(test_below(4) ? 300000 : 5000);
    if (k > n - at) k = n - at;
    rc = nwc_store_receive_write(r, bytes + at, k);
    at += k;
    if (rc == 0) CHECK(nwc_store_receive_have(r) == at, "have %llu after %zu bytes",
                       (unsigned long long)nwc_store_receive_have(r), at);
  }
  if (rc == 0) rc = nwc_store_receive_commit(r, "test:transfer");
  nwc_store_receive_close(r);
  return rc;
}

static void export_all(nwc_store *s, const char *model, char **config, size_t *clen, membuf *b) {
  nwc_store_export *e;
  CHECK_RC(nwc_store_export_open(s, model, &e));
  if (!e) exit(1);
  CHECK(!nwc_store_export_config(e, clen) && *clen == 0, "a config before the scan");
  b->n = 0;
  CHECK_RC(nwc_store_export_scan(e, collect, b));
  const char *c = nwc_store_export_config(e, clen);
  if (!c) exit(1);
  *config = malloc(*clen + 1);
  memcpy(*config, c, *clen);
  (*config)[*clen] = 0;
  CHECK(b->n == nwc_store_export_size(e), "scan gave %zu bytes of %llu", b->n,
        (unsigned long long)nwc_store_export_size(e));
  for (int i = 0; i < 50; i++) { /* random reads are the scan's bytes */
    uint64_t off = test_below(b->n + 10), len = 1 + test_below(test_below(2) ? 200 : 3000000);
    uint8_t *got = malloc(len);
    ssize_t k = nwc_store_export_read(e, off, got, len);
    uint64_t want = off >= b->n ? 0 : (b->n - off < len ? b->n - off : len);
    CHECK(k == (ssize_t)want && (want == 0 || !memcmp(got, b->p + off, want)),
          "read %llu at %llu: %zd bytes", (unsigned long long)len, (unsigned long long)off, k);
    free(got);
  }
  nwc_store_export_close(e);
}

/* Model ma of store a and mb of b: their tensors decode to the same weights, name by name. */
static void same_weights(nwc_store *a, const char *ma, nwc_store *b, const char *mb) {
  nwc_tensor_info *ta = NULL, *tb = NULL;
  size_t na = 0, nb = 0;
  CHECK_RC(nwc_store_tensors(a, ma, &ta, &na));
  CHECK_RC(nwc_store_tensors(b, mb, &tb, &nb));
  CHECK(na == nb && na > 0, "%zu tensors, copy has %zu", na, nb);
  for (size_t i = 0; i < na && i < nb; i++) {
    CHECK(!strcmp(ta[i].name, tb[i].name) && !strcmp(ta[i].conversion, tb[i].conversion) &&
              ta[i].ndim == tb[i].ndim && !memcmp(ta[i].shape, tb[i].shape, sizeof ta[i].shape),
          "tensor %zu: %s / %s", i, ta[i].name, tb[i].name);
    nwc_tensor x, y;
    CHECK_RC(nwc_store_read_info(&ta[i], &x));
    CHECK_RC(nwc_store_read_info(&tb[i], &y));
    uint64_t lay[4];
    nwc_layout(x.rows, x.cols, x.elem, lay);
    size_t bytes = x.rows * lay[NWC_LAYOUT_K16] * 2;
    uint16_t *ox = calloc(1, bytes), *oy = calloc(1, bytes);
    CHECK_RC(nwc_dequant(&x, ox));
    CHECK_RC(nwc_dequant(&y, oy));
    CHECK(y.elem == x.elem && y.rows == x.rows && !memcmp(ox, oy, bytes), "tensor %s differs", ta[i].name);
    free(ox), free(oy);
    nwc_tensor_release(&x);
    nwc_tensor_release(&y);
  }
  nwc_tensor_info_free(ta, na);
  nwc_tensor_info_free(tb, nb);
}

/* The config with tensor `name`'s field `key` set to v (or, key NULL, its first checksum to v). */
static char *config_edit(const char *config, const char *name, const char *key, json_int_t v) {
  json_t *root = json_loads(config, 0, NULL), *ts = json_object_get(root, "tensors");
  for (size_t i = 0; i < json_array_size(ts); i++) {
    json_t *t = json_array_get(ts, i);
    if (strcmp(json_string_value(json_object_get(t, "name")), name)) continue;
    if (key) json_object_set_new(t, key, json_integer(v));
    else {
      char h[17];
      snprintf(h, sizeof h, "%016llx", (unsigned long long)v);
      json_array_set_new(json_object_get(t, "checksums"), 0, json_string(h));
    }
  }
  char *out = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(root);
  return out;
}

/* A write that fails (here: the file size limit) leaves its piece pending: writing on from `have`
 * retries it, and the model completes. */
static void failed_write_resumes(nwc_store *a, nwc_store *b, const char *config, size_t clen,
                                 const uint8_t *bytes, size_t n) {
  signal(SIGXFSZ, SIG_IGN); /* pwrite past the limit: EFBIG (or a short write), not the signal */
  struct rlimit old, lim;
  CHECK_RC(getrlimit(RLIMIT_FSIZE, &old));
  nwc_store_receive *r = NULL;
  CHECK_RC(nwc_store_receive_open(b, "m3", config, clen, &r));
  if (!r) return;
  lim = old;
  lim.rlim_cur = (rlim_t)(4096 + test_below(n - 8192));
  CHECK_RC(setrlimit(RLIMIT_FSIZE, &lim));
  int rc = nwc_store_receive_write(r, bytes, n);
  const uint64_t have = nwc_store_receive_have(r);
  CHECK_RC(setrlimit(RLIMIT_FSIZE, &old));
  printf("write with a %llu-byte file limit: %d, %llu bytes taken (%s)\n", (unsigned long long)lim.rlim_cur,
         rc, (unsigned long long)have, nwc_error_detail());
  CHECK(rc < 0 && have < n, "a write past the file size limit: %d, %llu of %zu bytes", rc,
        (unsigned long long)have, n);
  CHECK_RC(nwc_store_receive_write(r, bytes + have, n - have));
  CHECK_RC(nwc_store_receive_commit(r, "test:resumed"));
  nwc_store_receive_close(r);
  same_weights(a, "m", b, "m3");
}

static void bad_configs(nwc_store *b, const char *dir, const char *config, size_t clen,
                        const uint8_t *bytes, size_t n) {
  const char *cases[] = {"", "{", "[]", "{\"nwc_config\": 2}", "{\"nwc_config\": 1}"};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    nwc_store_receive *r = NULL;
    int rc = nwc_store_receive_open(b, "bad", cases[i], strlen(cases[i]), &r);
    CHECK(rc == -EBADMSG || rc == -ENOTSUP, "config '%s': %d", cases[i], rc);
  }
  nwc_store_receive *r = NULL;
  CHECK(nwc_store_receive_open(b, "bad", config, clen / 2, &r) == -EBADMSG, "half a config");
  char *c = config_edit(config, "blk.1.w", "offset", 4096 * 3);
  CHECK(nwc_store_receive_open(b, "bad", c, strlen(c), &r) == -EBADMSG, "a blob moved: %s", nwc_error_detail());
  printf("moved blob: %s\n", nwc_error_detail());
  free(c);
  c = config_edit(config, "blk.0.w", "nblocks", (json_int_t)1 << 60);
  CHECK(nwc_store_receive_open(b, "bad", c, strlen(c), &r) == -EBADMSG, "nblocks 2^60");
  free(c);
  c = config_edit(config, "blk.0.w", "format_version", 99);
  CHECK(nwc_store_receive_open(b, "bad", c, strlen(c), &r) == -ENOTSUP, "codec format 99");
  free(c);
  CHECK(nwc_store_receive_open(b, "../x", config, clen, &r) == -EINVAL, "bad model name");
  CHECK(count_containers(dir) == 1, "a refused config made a file");
  (void)bytes, (void)n;
}

int main(void) {
  test_seed("test_store_transfer");
  char da[512], db[512], src[512], path[700];
  make_tmpdir(da, sizeof da, "store-a");
  make_tmpdir(db, sizeof db, "store-b");
  make_tmpdir(src, sizeof src, "src");
  /* Tensors of several chunks and of one, packed ones, a bias: in layouts 2 and 0 (auto). */
  enum { NT = 6 };
  uint64_t shp[NT][2] = {{1024, 1100}, {96, 512}, {1, 300}, {700, 900}, {7, 9}, {1, 96}};
  const char *nm[NT] = {"blk.0.w", "blk.1.w", "blk.2.w", "blk.3.w", "blk.4.w", "blk.1.bias"};
  st_spec spec[NT];
  uint16_t *bufs[NT];
  for (int i = 0; i < NT; i++) {
    uint64_t n = shp[i][0] * shp[i][1];
    bufs[i] = malloc(n * 2);
    for (uint64_t k = 0; k < n; k++) bufs[i][k] = nwc_f32_to_bf16((float)((test_uniform() - 0.5) * 0.2));
    spec[i] = (st_spec){nm[i], "BF16", shp[i][0] == 1 ? 1 : 2,
                        {shp[i][0] == 1 ? shp[i][1] : shp[i][0], shp[i][1]}, bufs[i], n * 2};
  }
  snprintf(path, sizeof path, "%s/t.safetensors", src);
  CHECK_RC(st_write(path, spec, NT));
  nwc_store *a, *b;
  CHECK_RC(nwc_store_open(da, NWC_STORE_CREATE, &a));
  CHECK_RC(nwc_store_open(db, NWC_STORE_CREATE, &b));
  nwc_import_opts q = {.elem = NWC_ELEM_FP8};
  CHECK_RC(nwc_store_import(a, "q", path, &q)); /* container 1: model m gets another id in a */
  CHECK_RC(nwc_store_import(a, "m", path, NULL));

  char *config = NULL;
  size_t clen = 0;
  membuf bytes = {0};
  export_all(a, "m", &config, &clen, &bytes);
  printf("config %zu bytes, container %zu bytes\n", clen, bytes.n);
  CHECK(bytes.n > 4096 && !memcmp(bytes.p, "NWCSTORE", 8), "the portable container starts with its header");
  uint64_t zero = 0;
  CHECK(!memcmp(bytes.p + 16, &zero, 8), "the portable container's id is 0");

  /* Flipped bytes: refused at their chunk, nothing left behind. */
  for (int i = 0; i < 8; i++) {
    uint64_t pos = test_below(4) == 0 ? test_below(4096 + 256) : test_below(bytes.n);
    uint8_t mask = (uint8_t)(1u << test_below(8));
    bytes.p[pos] ^= mask;
    int rc = receive(b, "m", config, clen, bytes.p, bytes.n);
    bytes.p[pos] ^= mask;
    CHECK(rc == -EBADMSG, "flip at %llu: receive gave %d", (unsigned long long)pos, rc);
    if (i < 2) printf("flip at %llu: %s\n", (unsigned long long)pos, nwc_error_detail());
    CHECK(count_containers(db) == 0, "flip at %llu left a file", (unsigned long long)pos);
  }
  /* A receive closed early leaves nothing. */
  nwc_store_receive *r;
  CHECK_RC(nwc_store_receive_open(b, "m", config, clen, &r));
  CHECK_RC(nwc_store_receive_write(r, bytes.p, bytes.n / 2));
  CHECK(nwc_store_receive_commit(r, "x") == -EINVAL, "commit of half a container");
  nwc_store_receive_close(r);
  CHECK(count_containers(db) == 0, "an abandoned receive left a file");

  CHECK_RC(receive(b, "m", config, clen, bytes.p, bytes.n));
  same_weights(a, "m", b, "m");
  CHECK(check_store_consistent(b, db) == 1, "store b holds one model");
  CHECK(receive(b, "m", config, clen, bytes.p, bytes.n) == -EEXIST, "a second receive of m");

  /* The copy exports to the same config and bytes. */
  char *config2 = NULL;
  size_t clen2 = 0;
  membuf bytes2 = {0};
  export_all(b, "m", &config2, &clen2, &bytes2);
  CHECK(clen2 == clen && !strcmp(config, config2), "the copy's config differs");
  CHECK(bytes2.n == bytes.n && !memcmp(bytes.p, bytes2.p, bytes.n), "the copy's bytes differ");

  failed_write_resumes(a, b, config, clen, bytes.p, bytes.n);
  CHECK_RC(nwc_store_remove(b, "m3"));
  bad_configs(b, db, config, clen, bytes.p, bytes.n);

  /* A blob header changed (rows) with every checksum made to agree: caught at commit. */
  nwc_tensor_info *ti = NULL;
  CHECK_RC(nwc_store_tensor(a, "m", "blk.1.w", &ti));
  if (ti) {
    uint8_t *h = bytes.p + ti->offset;
    uint64_t rows = 0, len = ti->length < NWC_STORE_CHUNK ? ti->length : NWC_STORE_CHUNK;
    memcpy(&rows, h + 16, 8);
    rows += 16;
    memcpy(h + 16, &rows, 8);
    uint64_t hs = XXH3_64bits(h, 120);
    memcpy(h + 120, &hs, 8);
    char *c = config_edit(config, "blk.1.w", NULL, (json_int_t)XXH3_64bits(h, len));
    int rc = receive(b, "m2", c, strlen(c), bytes.p, bytes.n);
    CHECK(rc == -EBADMSG, "a consistent lie passed: %d", rc);
    printf("consistent lie: %s\n", nwc_error_detail());
    CHECK(count_containers(db) == 1, "the refused commit left a file");
    free(c);
  }
  nwc_tensor_info_free(ti, 1);

  nwc_store_close(a);
  nwc_store_close(b);
  rm_rf(da), rm_rf(db), rm_rf(src);
  for (int i = 0; i < NT; i++) free(bufs[i]);
  free(config), free(config2), free(bytes.p), free(bytes2.p);
  return test_exit("test_store_transfer");
}
