/*
 * test_store_mutate.c - thousands of random mutations of a valid safetensors file (byte flips and
 * JSON-significant bytes in the header, the length field, truncation, flips in the data), each
 * parsed directly and imported into a real store.  Whatever happens must be clean: the parser
 * either refuses or returns ranges inside the file; the import either publishes a model that
 * verifies (then it is removed) or fails with a negative errno and a detail line, leaving no model
 * and no file.  Meant to run under the sanitizer build (-DNWC_SANITIZE=ON) as well.
 */
#include "test_store_util.h"

#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void mutate(uint8_t *buf, size_t *len, size_t hend) {
  static const char sig[] = "{}[]\",:0123456789-eE.\\ ";
  int ops = 1 + (int)test_below(4);
  for (int k = 0; k < ops && *len > 0; k++) {
    uint64_t r = test_below(100);
    if (r < 45) { /* a byte of the header */
      buf[8 + test_below(hend - 8)] = (uint8_t)test_rand();
    } else if (r < 75) { /* a JSON-significant byte in the header */
      buf[8 + test_below(hend - 8)] = (uint8_t)sig[test_below(sizeof sig - 1)];
    } else if (r < 82) { /* the length field */
      uint64_t h;
      memcpy(&h, buf, 8);
      h = test_below(2) ? h + test_below(64) - 32 : test_rand() >> test_below(64);
      memcpy(buf, &h, 8);
    } else if (r < 88) { /* truncate */
      *len = test_below(*len);
    } else { /* anywhere */
      buf[test_below(*len)] ^= (uint8_t)(1u << test_below(8));
    }
  }
}

int main(void) {
  test_seed("test_store_mutate");
  char dir[512], src[512], path[700];
  make_tmpdir(dir, sizeof dir, "store");
  make_tmpdir(src, sizeof src, "src");
  uint16_t w[24 * 40], b[40];
  float f32[3 * 4 * 5], sc[8];
  uint8_t f8[8 * 16];
  for (size_t i = 0; i < 24 * 40; i++) w[i] = nwc_f32_to_bf16((float)(test_uniform() - 0.5));
  for (size_t i = 0; i < 40; i++) b[i] = nwc_f32_to_bf16((float)test_uniform());
  for (size_t i = 0; i < 60; i++) f32[i] = (float)(test_uniform() * 4 - 2);
  for (size_t i = 0; i < 8; i++) sc[i] = (float)(0.1 + test_uniform());
  for (size_t i = 0; i < sizeof f8; i++) f8[i] = (uint8_t)(test_below(0x7e));
  st_spec spec[] = {{"model.embed.weight", "BF16", 2, {24, 40}, w, sizeof w},
                    {"model.norm/bias", "BF16", 1, {40}, b, sizeof b},
                    {"t.f32", "F32", 3, {3, 4, 5}, f32, sizeof f32},
                    {"q.weight", "F8_E4M3", 2, {8, 16}, f8, sizeof f8},
                    {"q.weight_scale", "F32", 1, {8}, sc, sizeof sc}};
  size_t glen;
  uint8_t *good = st_build(spec, 5, &glen);
  uint64_t hl;
  memcpy(&hl, good, 8);
  size_t hend = 8 + (size_t)hl;
  nwc_store *s;
  CHECK_RC(nwc_store_open(dir, NWC_STORE_CREATE, &s));
  if (!s) return 1;
  snprintf(path, sizeof path, "%s/mut.safetensors", src);
  uint8_t *buf = malloc(glen);
  double deadline = now() + 25;
  int iters = 0, parsed = 0, imported = 0, refused = 0;
  while ((iters < 2000 || now() < deadline - 20) && !(iters >= 2000 && now() > deadline) &&
         iters < 20000 && !test_failures) {
    memcpy(buf, good, glen);
    size_t len = glen;
    mutate(buf, &len, hend);
    nwc_st_file *f = NULL;
    int rc = nwc_st_parse(buf, len, &f);
    if (rc == 0) {
      parsed++;
      for (size_t i = 0; i < f->count; i++) {
        const nwc_st_tensor *t = &f->tensors[i];
        CHECK(t->begin <= t->end && f->data_offset + t->end <= len, "range outside the file");
        CHECK(!t->dtype_size || t->end - t->begin == t->numel * t->dtype_size, "size");
      }
      nwc_st_close(f);
    } else {
      CHECK(rc < 0 && *nwc_error_detail(), "parse: %d without a detail", rc);
    }
    write_file(path, buf, len);
    rc = nwc_store_import(s, "m", path, NULL);
    if (rc == 0) {
      imported++;
      int v = nwc_store_verify(s, "m", NULL, NULL, NULL);
      CHECK(v == 0, "iteration %d: an imported mutant does not verify: %s", iters,
            nwc_error_detail());
      CHECK_RC(nwc_store_remove(s, "m"));
    } else {
      refused++;
      CHECK(rc == -EBADMSG || rc == -ENOTSUP || rc == -EINVAL || rc == -ENOENT,
            "iteration %d: unexpected error %d: %s", iters, rc, nwc_error_detail());
      CHECK(strstr(nwc_error_detail(), path) || rc == -EINVAL,
            "iteration %d: detail does not name the file: %s", iters, nwc_error_detail());
      nwc_model_info *m = NULL;
      size_t n = 1;
      CHECK_RC(nwc_store_models(s, &m, &n));
      CHECK(n == 0, "iteration %d: a refused import left a model", iters);
      nwc_model_info_free(m, n);
      CHECK(count_containers(dir) == 0, "iteration %d: a refused import left a file", iters);
    }
    iters++;
  }
  printf("%d mutants: %d parsed, %d imported (and verified), %d refused\n", iters, parsed,
         imported, refused);
  CHECK(iters >= 2000, "only %d iterations", iters);
  check_store_consistent(s, dir);
  nwc_store_close(s);
  free(buf);
  free(good);
  rm_rf(dir);
  rm_rf(src);
  return test_exit("test_store_mutate");
}
