/*
 * test_codec_safetensors.c - the safetensors reader (store/safetensors.h) on valid and malformed
 * files built in memory.
 *
 * A valid file parses (from memory, from a path and from a descriptor) with every field right.
 * Malformed ones each return -EBADMSG and a detail line: files shorter than the length field, a
 * header length past the end (or absurdly large), an empty header, text that is not JSON, JSON
 * that is not an object, an entry that is not an object or lacks a field, data_offsets out of
 * range, reversed, negative, not integers or not two, offsets that do not match shape x dtype
 * size, bad shapes, overlapping tensors, duplicate names, an overlong dtype.  A dtype the reader
 * does not know is accepted with dtype_size 0 (safetensors.h; import rejects it), but its offsets
 * must still lie inside the data.
 */
#include "codec_util.h"
#include "safetensors.h"

#include <fcntl.h>

/* An exactly sized file: 8-byte length (hlen, or strlen(json) if hlen < 0), json, data_len bytes. */
static uint8_t *make_file(const char *json, int64_t hlen, size_t data_len, size_t *size) {
  size_t jl = strlen(json);
  *size = 8 + jl + data_len;
  uint8_t *p = cu_malloc(*size);
  uint64_t h = hlen < 0 ? jl : (uint64_t)hlen;
  memcpy(p, &h, 8);
  memcpy(p + 8, json, jl);
  for (size_t i = 0; i < data_len; i++) p[8 + jl + i] = (uint8_t)(i * 7 + 1);
  return p;
}

/* Parses the first `size` bytes of buf (copied into an exactly sized buffer). */
static int parse_prefix(const uint8_t *buf, size_t size, const char *what, int want) {
  uint8_t *copy = cu_malloc(size);
  if (size) memcpy(copy, buf, size);
  nwc_st_file *f = NULL;
  int rc = nwc_st_parse(copy, size, &f);
  CHECK(rc == want, "%s: nwc_st_parse returned %d (%s), expected %d", what, rc, nwc_error_detail(), want);
  if (rc < 0) {
    const char *d = nwc_error_detail();
    CHECK(!strncmp(d, "safetensors", 11), "%s: detail line '%s'", what, d);
    printf("  %-40s -> %s\n", what, d);
  } else {
    nwc_st_close(f);
  }
  free(copy);
  return rc;
}

static int parse_json(const char *json, size_t data_len, const char *what, int want) {
  size_t size;
  uint8_t *p = make_file(json, -1, data_len, &size);
  int rc = parse_prefix(p, size, what, want);
  free(p);
  return rc;
}

#define ENTRY(name, dtype, shape, offs)                                                          \
  "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":" offs "}"

static const char *const valid_json =
    "{\"__metadata__\":{\"format\":\"pt\"}," ENTRY("w", "BF16", "[2,3]", "[0,12]") ","
    ENTRY("empty", "F32", "[0,4]", "[12,12]") "," ENTRY("s", "U8", "[]", "[12,13]") ","
    ENTRY("v", "F64", "[2]", "[13,29]") "}";

static void check_valid(const nwc_st_file *f, const uint8_t *file, const char *what) {
  CHECK(f->count == 4, "%s: %zu tensors, expected 4 (__metadata__ is not one)", what, f->count);
  CHECK(f->data_offset == 8 + strlen(valid_json), "%s: data offset %llu", what,
        (unsigned long long)f->data_offset);
  const nwc_st_tensor *w = nwc_st_find(f, "w"), *e = nwc_st_find(f, "empty");
  const nwc_st_tensor *s = nwc_st_find(f, "s"), *v = nwc_st_find(f, "v");
  CHECK(w && e && s && v && !nwc_st_find(f, "__metadata__") && !nwc_st_find(f, "x"),
        "%s: nwc_st_find", what);
  if (!w || !e || !s || !v) return;
  CHECK(!strcmp(w->dtype, "BF16") && w->dtype_size == 2 && w->ndim == 2 && w->shape[0] == 2 &&
            w->shape[1] == 3 && w->numel == 6 && w->begin == 0 && w->end == 12,
        "%s: tensor w parsed wrong", what);
  CHECK(e->numel == 0 && e->ndim == 2 && e->begin == 12 && e->end == 12, "%s: empty tensor", what);
  CHECK(s->ndim == 0 && s->numel == 1 && s->dtype_size == 1, "%s: scalar tensor", what);
  CHECK(v->dtype_size == 8 && v->begin == 13 && v->end == 29, "%s: tensor v", what);
  const uint8_t *data = file + 8 + strlen(valid_json);
  CHECK(nwc_st_data(f, w) == (const void *)f->map + (data - file) &&
            !memcmp(nwc_st_data(f, v), data + 13, 16),
        "%s: nwc_st_data points at the wrong bytes", what);
}

static void valid_file(void) {
  size_t size;
  uint8_t *p = make_file(valid_json, -1, 29, &size);
  nwc_st_file *f = NULL;
  CHECK_RC(nwc_st_parse(p, size, &f));
  if (f) check_valid(f, p, "parse");
  nwc_st_close(f);

  char path[] = "/tmp/nwc-test-st-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0 && write(fd, p, size) == (ssize_t)size, "cannot write %s", path);
  f = NULL;
  CHECK_RC(nwc_st_open(path, &f));
  if (f) check_valid(f, p, "open");
  nwc_st_close(f);
  f = NULL;
  CHECK_RC(nwc_st_open_fd(fd, &f));
  if (f) check_valid(f, p, "open_fd");
  nwc_st_close(f);
  close(fd);
  unlink(path);
  f = NULL;
  CHECK(nwc_st_open(path, &f) == -ENOENT, "opening a missing file is not -ENOENT");

  /* Every truncation of the valid file fails, none crashes. */
  for (size_t n = 0; n < size; n++) {
    char what[64];
    snprintf(what, sizeof what, "valid file truncated to %zu bytes", n);
    if (n % 16 && n > 8 && n != size - 1) { /* print few details: parse quietly */
      uint8_t *c = cu_malloc(n);
      memcpy(c, p, n);
      nwc_st_file *g = NULL;
      int rc = nwc_st_parse(c, n, &g);
      CHECK(rc == -EBADMSG, "%s: returned %d", what, rc);
      if (rc == 0) nwc_st_close(g);
      free(c);
    } else {
      parse_prefix(p, n, what, -EBADMSG);
    }
  }
  free(p);
  CHECK(parse_json("{}", 0, "empty object", 0) == 0, "an empty object is a valid header");
}

static void malformed(void) {
  const int bad = -EBADMSG;
  size_t size;
  uint8_t *p = make_file("{}", 1000, 0, &size);
  parse_prefix(p, size, "header length past the end", bad);
  free(p);
  p = make_file("{}", INT64_MAX, 0, &size);
  parse_prefix(p, size, "header length 2^63", bad);
  free(p);
  p = make_file("", 0, 16, &size);
  parse_prefix(p, size, "empty header", bad);
  free(p);
  parse_json("{\"w\":{\"dtype\":\"BF16\",", 0, "not JSON (cut)", bad);
  parse_json("not json at all", 0, "not JSON", bad);
  parse_json("[1,2,3]", 0, "an array, not an object", bad);
  parse_json("\"w\"", 0, "a string, not an object", bad);
  parse_json("{\"w\":5}", 0, "entry not an object", bad);
  parse_json("{\"w\":{\"shape\":[1],\"data_offsets\":[0,2]}}", 2, "no dtype", bad);
  parse_json("{\"w\":{\"dtype\":\"BF16\",\"data_offsets\":[0,2]}}", 2, "no shape", bad);
  parse_json("{\"w\":{\"dtype\":\"BF16\",\"shape\":[1]}}", 2, "no data_offsets", bad);
  parse_json("{" ENTRY("w", "BF16", "[4]", "[0,8]") "}", 7, "data_offsets past the data", bad);
  parse_json("{" ENTRY("w", "BF16", "[4]", "[8,0]") "}", 8, "data_offsets reversed", bad);
  parse_json("{" ENTRY("w", "BF16", "[4]", "[-8,0]") "}", 8, "data_offsets negative", bad);
  parse_json("{" ENTRY("w", "BF16", "[4]", "[\"0\",8]") "}", 8, "data_offsets not integers", bad);
  parse_json("{" ENTRY("w", "BF16", "[4]", "[0,8,8]") "}", 8, "three data_offsets", bad);
  parse_json("{" ENTRY("w", "BF16", "[4]", "[0.5,8]") "}", 8, "fractional data_offsets", bad);
  parse_json("{" ENTRY("w", "BF16", "[2,3]", "[0,10]") "}", 12, "offsets != shape x dtype size", bad);
  parse_json("{" ENTRY("w", "F32", "[2,3]", "[0,12]") "}", 24, "F32 with BF16 size", bad);
  parse_json("{" ENTRY("w", "BF16", "[-2,3]", "[0,12]") "}", 12, "negative shape", bad);
  parse_json("{" ENTRY("w", "BF16", "[2,\"3\"]", "[0,12]") "}", 12, "shape not integers", bad);
  parse_json("{" ENTRY("w", "U8", "[1,1,1,1,1,1,1,1,1]", "[0,1]") "}", 1, "nine dimensions", bad);
  parse_json("{" ENTRY("w", "U8", "[1099511627776,1099511627776]", "[0,1]") "}", 1,
             "shape overflows", bad);
  parse_json("{" ENTRY("a", "U8", "[4]", "[0,4]") "," ENTRY("b", "U8", "[4]", "[2,6]") "}", 6,
             "overlapping tensors", bad);
  parse_json("{" ENTRY("a", "U8", "[4]", "[0,4]") "," ENTRY("a", "U8", "[4]", "[4,8]") "}", 8,
             "duplicate names", bad);
  parse_json("{" ENTRY("w", "VERYLONGDTYPE", "[4]", "[0,4]") "}", 4, "overlong dtype", bad);
  parse_json("{" ENTRY("w", "Q4", "[4]", "[0,9]") "}", 8, "unknown dtype past the data", bad);

  /* An unknown dtype parses, marked by dtype_size 0. */
  p = make_file("{" ENTRY("w", "Q4", "[4]", "[0,2]") "}", -1, 2, &size);
  nwc_st_file *f = NULL;
  CHECK_RC(nwc_st_parse(p, size, &f));
  if (f) {
    CHECK(f->count == 1 && f->tensors[0].dtype_size == 0 && !strcmp(f->tensors[0].dtype, "Q4"),
          "unknown dtype not marked with dtype_size 0");
    nwc_st_close(f);
  }
  free(p);
}

/* nwc_st_matrix_shape: the matrix each shape is stored as, against the rule written out here. */
static void matrix_shapes(void) {
  static const struct {
    unsigned ndim;
    uint64_t shape[4], rows, cols;
  } cases[] = {{1, {512}, 1, 512},           {2, {1, 512}, 1, 512},       {2, {512, 1}, 512, 1},
               {3, {2, 3, 4}, 2, 12},        {3, {1, 1, 7}, 1, 7},        {4, {1, 1, 256, 512}, 256, 512},
               {4, {1, 4, 1, 5}, 4, 5},      {3, {1, 1, 1}, 1, 1},        {4, {3, 1, 1, 5}, 3, 5}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    nwc_st_tensor t = {.ndim = cases[i].ndim, .numel = 1};
    for (unsigned d = 0; d < t.ndim; d++) t.shape[d] = cases[i].shape[d], t.numel *= t.shape[d];
    uint64_t r, c;
    nwc_st_matrix_shape(&t, &r, &c);
    CHECK(r == cases[i].rows && c == cases[i].cols, "shape case %zu: %llu x %llu, want %llu x %llu",
          i, (unsigned long long)r, (unsigned long long)c, (unsigned long long)cases[i].rows,
          (unsigned long long)cases[i].cols);
  }
}

int main(void) {
  test_seed("test_codec_safetensors");
  valid_file();
  malformed();
  matrix_shapes();
  return test_exit("test_codec_safetensors");
}
