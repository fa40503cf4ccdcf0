/*
 * test_store_skip.c - a checkpoint as real ones are: float weights next to tensors nwc does not
 * store.  A file written here holds BF16, F32, F16, F64 and F8_E5M2 tensors of random values
 * (F64 with the cases that a double rounding through F32 gets wrong, overflow, underflow, NaN)
 * and I64 position ids, a BOOL mask, an I32 buffer, a U8 table and an empty F32 tensor, with an
 * I64 "w.bias" next to "w.weight".  The import succeeds; every float tensor decodes bit for bit
 * to a reference computed here from the file's bytes (F64: the nearest BF16 found by search,
 * ties to even; F8_E5M2 and F16 exactly by ldexp); the skip callback names the others with
 * their dtypes and shapes in file order; no bias link points at a skipped tensor.  Strict: the
 * import fails naming the first one, and nothing is left.  A file of only I64 fails clearly.
 * Malformed input stays an error even where the tensor would be skipped: a wrong size on an
 * I64 tensor, an unknown dtype, an overlap, a bad name.
 */
#include "test_store_util.h"

#include <math.h>

static char dir[512], src[512];
static nwc_store *s;

/* ---- references, computed without the store's conversions ---------------------------------- */

/* The BF16 nearest to d, ties to even, by binary search over the positive BF16 values (bits in
 * order of value); beyond the largest finite value plus half an ulp, infinity. */
static uint16_t ref_f64_bf16(double d) {
  if (isnan(d)) return 0x7fc0;
  uint16_t sign = signbit(d) ? 0x8000 : 0;
  double a = fabs(d);
  const double max = (2.0 - ldexp(1, -7)) * ldexp(1, 127), half_ulp = ldexp(1, 127 - 8);
  if (a >= max + half_ulp) return sign | 0x7f80;
  unsigned lo = 0, hi = 0x7f7f; /* the largest bits whose value is <= a */
  while (lo < hi) {
    unsigned mid = (lo + hi + 1) / 2;
    if ((double)nwc_bf16_to_f32((uint16_t)mid) <= a) lo = mid;
    else hi = mid - 1;
  }
  if (lo == 0x7f7f) return sign | 0x7f7f; /* below max + half an ulp */
  double below = nwc_bf16_to_f32((uint16_t)lo), above = nwc_bf16_to_f32((uint16_t)(lo + 1));
  double dl = a - below, du = above - a; /* exact: the operands are within a factor of 2 */
  unsigned r = dl < du ? lo : du < dl ? lo + 1 : (lo & 1 ? lo + 1 : lo);
  return (uint16_t)(sign | r);
}

/* An F16 (or F8_E5M2 << 8) value by its fields. */
static double ref_f16(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
  return h & 0x8000 ? -v : v;
}

/* ---- the checkpoint -------------------------------------------------------------------------- */

enum { R = 24, C = 40, N = 64 };
static uint16_t w_bf16[R * C];
static float w_f32[R * C];
static uint16_t w_f16[N];
static double w_f64[N];
static uint8_t w_e5m2[256];
static int64_t pos[N], bias_i64[R];
static uint8_t mask[N], table[17];
static int32_t counts[N];

static void make_data(void) {
  for (int i = 0; i < R * C; i++) {
    w_bf16[i] = nwc_f32_to_bf16((float)((test_uniform() - 0.5) * 0.1));
    w_f32[i] = (float)((test_uniform() - 0.5) * 0.1);
  }
  for (int i = 0; i < N; i++) {
    w_f16[i] = (uint16_t)test_rand();
    w_f64[i] = (test_uniform() - 0.5) * ldexp(1, (int)test_below(40) - 20);
    pos[i] = i, mask[i] = (uint8_t)(i & 1), counts[i] = (int32_t)test_rand();
  }
  /* The cases: a double rounding through F32 would give 1, not 1 + 2^-7; exact ties; overflow;
   * values past the F32 range that still round to the largest BF16; underflow; NaN; a BF16
   * subnormal; infinity. */
  const double special[] = {1 + ldexp(1, -8) + ldexp(1, -40), -(1 + ldexp(1, -8) + ldexp(1, -40)),
                            1 + ldexp(1, -8), 1 + 3 * ldexp(1, -8), 1e300, -1e300,
                            (2.0 - ldexp(1, -7)) * ldexp(1, 127), ldexp(1, -135) * 1.5, 1e-300,
                            -1e-300, NAN, ldexp(3, -133), INFINITY, 0.1, -0.0};
  for (size_t i = 0; i < sizeof special / sizeof *special; i++) w_f64[i] = special[i];
  for (int i = 0; i < 256; i++) w_e5m2[i] = (uint8_t)i;
  for (int i = 0; i < R; i++) bias_i64[i] = i;
  for (int i = 0; i < 17; i++) table[i] = (uint8_t)i;
}

/* The file: floats and the others interleaved, as a checkpoint orders them. */
static const st_spec mixed[] = {
    {"embed", "BF16", 2, {R, C}, w_bf16, sizeof w_bf16},
    {"position_ids", "I64", 2, {1, N}, pos, sizeof pos},
    {"w.weight", "F32", 2, {R, C}, w_f32, sizeof w_f32},
    {"w.bias", "I64", 1, {R}, bias_i64, sizeof bias_i64},
    {"attn.mask", "BOOL", 1, {N}, mask, sizeof mask},
    {"norm", "F16", 1, {N}, w_f16, sizeof w_f16},
    {"counts", "I32", 2, {8, 8}, counts, sizeof counts},
    {"inv_freq", "F64", 1, {N}, w_f64, sizeof w_f64},
    {"table", "U8", 1, {17}, table, sizeof table},
    {"e5m2", "F8_E5M2", 2, {16, 16}, w_e5m2, sizeof w_e5m2},
    {"empty", "F32", 2, {0, 4}, NULL, 0},
};
enum { NMIXED = sizeof mixed / sizeof *mixed };
static const char *const skipped_names[] = {"position_ids", "w.bias", "attn.mask", "counts", "table",
                                            "empty"};
enum { NSKIPPED = sizeof skipped_names / sizeof *skipped_names };

/* What tensor k must decode to (BF16 bits, numel of them; malloc'ed). */
static uint16_t *expected(const st_spec *t, size_t numel) {
  uint16_t *e = malloc(numel * 2 + 1);
  const uint8_t *p = t->data;
  for (size_t i = 0; i < numel; i++) {
    if (!strcmp(t->dtype, "BF16")) memcpy(&e[i], p + 2 * i, 2);
    if (!strcmp(t->dtype, "F32")) {
      float f;
      memcpy(&f, p + 4 * i, 4);
      e[i] = ref_f64_bf16(f);
    }
    if (!strcmp(t->dtype, "F64")) {
      double d;
      memcpy(&d, p + 8 * i, 8);
      e[i] = ref_f64_bf16(d);
    }
    if (!strcmp(t->dtype, "F16")) {
      uint16_t h;
      memcpy(&h, p + 2 * i, 2);
      e[i] = ref_f64_bf16(ref_f16(h));
    }
    if (!strcmp(t->dtype, "F8_E5M2")) e[i] = ref_f64_bf16(ref_f16((uint16_t)(p[i] << 8)));
  }
  return e;
}

static int bf16_same(uint16_t a, uint16_t b) {
  int nan_a = (a & 0x7fff) > 0x7f80, nan_b = (b & 0x7fff) > 0x7f80;
  return nan_a || nan_b ? nan_a && nan_b : a == b;
}

static void check_decodes(const char *model, const st_spec *t) {
  nwc_tensor_info *ti = NULL;
  int rc = nwc_store_tensor(s, model, t->name, &ti);
  CHECK(rc == 0, "%s: not stored: %s", t->name, nwc_error_detail());
  if (rc) return;
  nwc_tensor w;
  CHECK_RC(nwc_store_read_info(ti, &w));
  uint64_t lay[4];
  nwc_layout(w.rows, w.cols, w.elem, lay);
  uint16_t *out = malloc(w.rows * lay[NWC_LAYOUT_K16] * 2);
  CHECK_RC(nwc_dequant(&w, out));
  uint16_t *want = expected(t, w.rows * w.cols);
  uint64_t bad = 0, first = 0;
  for (uint64_t r = 0; r < w.rows; r++)
    for (uint64_t c = 0; c < w.cols; c++)
      if (!bf16_same(out[r * lay[NWC_LAYOUT_K16] + c], want[r * w.cols + c]) && !bad++)
        first = r * w.cols + c;
  CHECK(bad == 0, "%s (%s): %llu values differ, the first [%llu] 0x%04x, want 0x%04x", t->name,
        t->dtype, (unsigned long long)bad, (unsigned long long)first,
        out[first / w.cols * lay[NWC_LAYOUT_K16] + first % w.cols], want[first]);
  if (!strcmp(t->dtype, "F64")) CHECK(!strcmp(ti->conversion, "f64->bf16 rne"), "%s", ti->conversion);
  if (!strcmp(t->dtype, "F8_E5M2"))
    CHECK(!strcmp(ti->conversion, "f8_e5m2->bf16 exact"), "%s", ti->conversion);
  CHECK(!strcmp(ti->dtype, t->dtype), "%s: dtype %s", t->name, ti->dtype);
  free(out), free(want);
  nwc_tensor_release(&w);
  nwc_tensor_info_free(ti, 1);
}

/* ---- skip reports ---------------------------------------------------------------------------- */

typedef struct seen {
  int n, bad;
  char names[16][32];
} seen;

static void on_skip(void *ctx, const nwc_import_skip *t) {
  seen *v = ctx;
  const st_spec *spec = NULL;
  for (int k = 0; k < NMIXED; k++)
    if (!strcmp(mixed[k].name, t->name)) spec = &mixed[k];
  CHECK(spec && !strcmp(t->dtype, spec->dtype) && t->ndim == spec->ndim &&
            !memcmp(t->shape, spec->shape, t->ndim * 8) && strstr(t->file, "mixed.safetensors"),
        "skip report of '%s' (%s, %u dims, file %s) does not match the file", t->name, t->dtype,
        t->ndim, t->file);
  if (v->n < 16) snprintf(v->names[v->n], sizeof v->names[0], "%s", t->name);
  v->n++;
}

/* The import of path fails with want, its detail holding n1 and n2, and leaves nothing. */
static void fails(const char *what, const char *path, const nwc_import_opts *o, int want,
                  const char *n1, const char *n2) {
  int rc = nwc_store_import(s, "bad", path, o);
  const char *d = nwc_error_detail();
  CHECK(rc == want && strstr(d, n1) && (!n2 || strstr(d, n2)),
        "%s: %d '%s', want %d with '%s' and '%s'", what, rc, d, want, n1, n2 ? n2 : "");
  printf("%-30s %4d  %s\n", what, rc, d);
  nwc_model_info *m = NULL;
  CHECK(nwc_store_model(s, "bad", &m) == -ENOENT, "%s: a model was published", what);
  nwc_model_info_free(m, 1);
}

static void raw_file(const char *name, const char *header, size_t n, char *path, size_t cap) {
  snprintf(path, cap, "%s/%s", src, name);
  size_t hl = strlen(header);
  uint8_t *buf = calloc(8 + hl + n + 1, 1);
  uint64_t h64 = hl;
  memcpy(buf, &h64, 8);
  memcpy(buf + 8, header, hl);
  CHECK(write_file(path, buf, 8 + hl + n) == 0, "write %s", path);
  free(buf);
}

int main(void) {
  test_seed("test_store_skip");
  make_tmpdir(dir, sizeof dir, "skip");
  make_tmpdir(src, sizeof src, "skipsrc");
  CHECK_RC(nwc_store_open(dir, NWC_STORE_CREATE, &s));
  if (!s) return 1;
  make_data();
  char path[700];
  snprintf(path, sizeof path, "%s/mixed.safetensors", src);
  CHECK_RC(st_write(path, mixed, NMIXED));

  /* Strict first: all or nothing, naming the first tensor it cannot store. */
  nwc_import_opts strict = {.threads = 2, .strict = 1};
  fails("strict", path, &strict, -ENOTSUP, "'position_ids'", "I64");
  CHECK(count_containers(dir) == 0, "strict: a file was left in containers/");

  /* By default: everything that can be stored is, the rest is reported. */
  seen v = {0};
  nwc_import_opts o = {.threads = 2, .skipped = on_skip, .skipped_ctx = &v};
  CHECK_RC(nwc_store_import(s, "m", path, &o));
  CHECK(v.n == NSKIPPED, "%d skip reports, want %d", v.n, NSKIPPED);
  for (int i = 0; i < NSKIPPED && i < v.n; i++)
    CHECK(!strcmp(v.names[i], skipped_names[i]), "skip report %d is '%s', want '%s' (file order)",
          i, v.names[i], skipped_names[i]);
  nwc_model_info *mi = NULL;
  CHECK_RC(nwc_store_model(s, "m", &mi));
  CHECK(mi && mi->tensors == NMIXED - NSKIPPED, "model holds %llu tensors, want %d",
        mi ? (unsigned long long)mi->tensors : 0, NMIXED - NSKIPPED);
  nwc_model_info_free(mi, 1);
  for (int k = 0; k < NMIXED; k++) {
    int skipped = 0;
    for (int i = 0; i < NSKIPPED; i++) skipped |= !strcmp(mixed[k].name, skipped_names[i]);
    if (!skipped) check_decodes("m", &mixed[k]);
    nwc_tensor_info *ti = NULL;
    if (skipped) CHECK(nwc_store_tensor(s, "m", mixed[k].name, &ti) == -ENOENT, "%s stored", mixed[k].name);
    nwc_tensor_info_free(ti, 1);
  }
  nwc_tensor_info *w = NULL;
  CHECK_RC(nwc_store_tensor(s, "m", "w.weight", &w));
  CHECK(w && !w->bias_tensor, "w.weight links the skipped bias '%s'", w && w->bias_tensor ? w->bias_tensor : "");
  nwc_tensor_info_free(w, 1);
  check_store_consistent(s, dir);

  /* Nothing that can be stored: an error that says so. */
  static int64_t ids[8];
  st_spec only[] = {{"position_ids", "I64", 2, {1, 8}, ids, sizeof ids},
                    {"token_type_ids", "I64", 1, {8}, ids, sizeof ids}};
  snprintf(path, sizeof path, "%s/ints.safetensors", src);
  CHECK_RC(st_write(path, only, 2));
  fails("only I64", path, NULL, -ENOTSUP, "no tensor can be stored", "'position_ids' is I64");

  /* Malformed stays malformed, skipped or not, strict or not. */
  static const struct {
    const char *file, *header;
    size_t data;
    const char *what, *n1, *n2;
  } bad[] = {
      {"badsize.safetensors",
       "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"ids\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[8,24]}}",
       24, "I64 of the wrong size", "'ids'", "I64"},
      {"badsize-bool.safetensors",
       "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"m\":{\"dtype\":\"BOOL\",\"shape\":[4],\"data_offsets\":[8,16]}}",
       16, "BOOL of the wrong size", "'m'", "BOOL"},
      {"unknown.safetensors",
       "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"q\":{\"dtype\":\"Q4_K\",\"shape\":[4],\"data_offsets\":[8,16]}}",
       16, "unknown dtype", "'q'", "unknown dtype"},
      {"overlap.safetensors",
       "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
       "\"ids\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[8,24]}}",
       24, "I64 overlapping a float", "'ids'", "overlap"},
      {"badname.safetensors",
       "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"i\\u0001d\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[8,16]}}",
       16, "I64 with a control character", "control", NULL},
  };
  for (int st = 0; st < 2; st++) {
    nwc_import_opts mo = {.strict = (unsigned)st};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
      raw_file(bad[i].file, bad[i].header, bad[i].data, path, sizeof path);
      fails(bad[i].what, path, &mo, -EBADMSG, bad[i].n1, bad[i].n2);
    }
  }
  CHECK(count_containers(dir) == 1, "containers/ holds %d files, want the one model's",
        count_containers(dir));
  nwc_store_close(s);
  rm_rf(dir);
  rm_rf(src);
  return test_exit("test_store_skip");
}
