/*
 * test_client_nwcctl.c - nwcctl as a user runs it, as real processes against a real nwcd:
 * import of the sample model through a sharded index (.json naming it as its one shard; the
 * descriptors are passed by SCM_RIGHTS), ls / ls MODEL / info / ps / stats with --json parsed by
 * jansson (the field names of the issue), devices and devices --json equal to
 * nwc_client_devices (with a tensor pinned), load, pin, unpin, evict, verify, dequant / gather /
 * matvec writing .npy files checked against the original weights (dequant in the tensor's own
 * shape, a 1-D one too), import of a checkpoint with I64/BOOL/I32 tensors (its line names what
 * was skipped, a long list cut short; --json lists them; --strict fails and stores nothing; a
 * file of only I64 fails), NWC_SOCKET as the default socket, and failures, each one line on stderr: unknown model (exit 3, the daemon's message),
 * bad usage (exit 2: unknown options, extra arguments, a required argument left out (named),
 * values that are not numbers, --layout out of range), bad .npy inputs and an unwritable output (exit 1), no daemon (exit 1), a socket
 * path that is a file or a directory (exit 1, said so), an X.npy that does not exist (exit 3),
 * MODEL/ left out of a tensor's name (exit 3, "no model"), --device cuda:0 on the cpu backend,
 * pin --device cpu (evict then refused, naming the place; cuda:0 on the cpu backend refused),
 * --device lists (cpu,cpu: a result each; cuda:0,cuda:1 and all on the cpu backend: refused
 * naming the places, nothing loaded),
 * and imports of a file that is not safetensors and of the sample cut short.
 */
#include "test_daemon_util.h"
#include "test_store_util.h"

#include "nwc_client.h"

#include <jansson.h>
#include <stdbool.h>

static int run2(char **out, char **err, const char *const *args) {
  return td_nwcctl(out, err, args);
}

static int run(char **out, const char *const *args) { return run2(out, NULL, args); }

/* Runs a failing nwcctl: its exit status must be want, and its stderr one line holding expect. */
static void run_fails(int want, const char *expect, const char *const *args) {
  char *err;
  int rc = run2(NULL, &err, args);
  char *nl = strchr(err, '\n');
  CHECK(rc == want && strstr(err, expect) && nl && !nl[1], "nwcctl %s %s: exit %d (want %d), stderr '%s' (want one line with '%s')",
        args[0], args[1] ? args[1] : "", rc, want, err, expect);
  free(err);
}

/* Writes a float32 .npy with the header's shape text and count values (may not match). */
static void write_npy(const char *path, const char *shape, const float *x, size_t count) {
  FILE *f = fopen(path, "wb");
  char h[128];
  int hl = snprintf(h, sizeof h, "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }", shape);
  int pad = (64 - (10 + hl + 1) % 64) % 64;
  unsigned total = (unsigned)(hl + pad + 1);
  fwrite("\x93NUMPY\x01\x00", 1, 8, f);
  fputc((int)(total & 255), f), fputc((int)(total >> 8), f);
  fwrite(h, 1, (size_t)hl, f);
  for (int i = 0; i < pad; i++) fputc(' ', f);
  fputc('\n', f);
  fwrite(x, 4, count, f);
  fclose(f);
}

static json_t *run_json(const char *const *args);

/* The import's layouts: "use" was imported with the default, auto: layout 2 for each matrix of
 * 16 or more rows (as stored: the first dimension after leading 1s, of 2 or more left; the
 * sample's matrices are 2-D or 4-D), 0 for the rest; --layout auto says the same; --layout 0
 * stores every tensor in layout 0. */
static void check_layouts(const char *idx) {
  CHECK(run(NULL, (const char *[]){"import", "use-auto", idx, "--layout", "auto", NULL}) == 0 &&
            run(NULL, (const char *[]){"import", "use-0", idx, "--layout", "0", NULL}) == 0,
        "import --layout auto, 0");
  const char *models[] = {"use", "use-auto", "use-0"};
  for (int k = 0; k < 3; k++) {
    json_t *j = run_json((const char *[]){"ls", models[k], "--json", NULL}), *t;
    size_t i, twos = 0;
    json_array_foreach(j, i, t) {
      json_t *shape = json_object_get(t, "shape");
      size_t d = 0, nd = json_array_size(shape);
      while (d + 2 < nd && json_integer_value(json_array_get(shape, d)) == 1) d++;
      int matrix = nd - d >= 2 && json_integer_value(json_array_get(shape, d)) >= 16;
      int want = k < 2 && matrix ? 2 : 0, got = (int)json_integer_value(json_object_get(t, "layout"));
      CHECK(got == want, "%s: %s in layout %d, not %d", models[k],
            json_string_value(json_object_get(t, "name")), got, want);
      twos += got == 2;
    }
    CHECK(json_array_size(j) == 35 && (k < 2 ? twos > 0 : twos == 0), "%s: %zu tensors, %zu in layout 2",
          models[k], json_array_size(j), twos);
    json_decref(j);
  }
  CHECK(run(NULL, (const char *[]){"rm", "use-auto", NULL}) == 0 &&
            run(NULL, (const char *[]){"rm", "use-0", NULL}) == 0, "rm");
}

static json_t *run_json(const char *const *args) {
  char *out;
  int rc = run(&out, args);
  json_error_t e;
  json_t *j = rc == 0 ? json_loads(out, 0, &e) : NULL;
  CHECK(j, "%s --json: exit %d, output not JSON: %.200s", args[0], rc, out);
  free(out);
  return j;
}

/* Reads a .npy written by nwcctl: returns the data (after the header), *n its bytes. */
static uint8_t *read_npy(const char *path, size_t *n, char *hdr, size_t hcap) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  uint8_t m[10];
  if (fread(m, 1, 10, f) != 10) return fclose(f), NULL;
  unsigned hl = m[8] | (unsigned)m[9] << 8;
  if (hl >= hcap || fread(hdr, 1, hl, f) != hl) return fclose(f), NULL;
  hdr[hl] = 0;
  CHECK((10 + hl) % 64 == 0, "npy header not 64-aligned");
  uint8_t *d = malloc(64 << 20);
  *n = fread(d, 1, 64 << 20, f);
  fclose(f);
  return d;
}

/* A size as nwcctl prints it ("9.2 MiB", "0 B": v and unit) is bytes: exactly in B, else
 * rounded to a tenth of the unit. */
static bool human_is(double v, const char *unit, uint64_t bytes) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  for (int i = 0; i < 5; i++) {
    double scale = ldexp(1.0, 10 * i);
    if (!strcmp(unit, units[i]))
      return i == 0 ? v == (double)bytes : fabs(v * scale - (double)bytes) <= 0.05 * scale + 1;
  }
  return false;
}

static uint64_t json_u64(const json_t *o, const char *key) {
  return (uint64_t)json_integer_value(json_object_get(o, key));
}

/* A table whose last column, under header, holds the names of arr's objects (key): every row
 * ends with a whole name that starts under the header's, each name once (ls MODEL, ps). */
static void check_name_column(const char *what, const char *out, const char *header, json_t *arr,
                              const char *key) {
  const char *h = strstr(out, header);
  size_t col = h ? (size_t)(h - out) : 0, rows = 0, n = json_array_size(arr);
  bool *seen = calloc(n + 1, 1);
  CHECK(h && h < out + strcspn(out, "\n"), "%s: no %s in the header:\n%s", what, header, out);
  for (const char *l = out + strcspn(out, "\n") + 1; h && *l; l += strcspn(l, "\n") + 1, rows++) {
    size_t len = strcspn(l, "\n"), k = 0;
    CHECK(len > col && l[col - 1] == ' ' && l[col] != ' ', "%s: row %zu does not start its name "
          "under %s:\n%.*s", what, rows, header, (int)len, l);
    for (; len > col && k < n; k++) {
      const char *name = json_string_value(json_object_get(json_array_get(arr, k), key));
      if (strlen(name) == len - col && !memcmp(name, l + col, len - col)) break;
    }
    CHECK(len > col && k < n && !seen[k], "%s: row %zu ends with '%.*s', not a name of --json's "
          "once", what, rows, (int)(len > col ? len - col : 0), l + col);
    if (k < n) seen[k] = true;
  }
  CHECK(rows == n, "%s: %zu rows, --json has %zu", what, rows, n);
  free(seen);
}

/* devices --json and the devices table say what nwc_client_devices says: the same places in
 * order, every figure equal (free memory, which moves between the calls, at most the total). */
static void check_devices(void) {
  nwc_client *c = NULL;
  nwc_client_place *pl = NULL;
  size_t n = 0;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  if (c) CHECK_RC(nwc_client_devices(c, &pl, &n));
  nwc_client_free(c);
  CHECK(n >= 1 && pl[0].pinned_bytes > 0, "nwc_client_devices: %zu places, nothing pinned", n);
  json_t *j = run_json((const char *[]){"devices", "--json", NULL});
  CHECK(json_array_size(j) == n, "devices --json: %zu places, the library %zu", json_array_size(j), n);
  for (size_t i = 0; i < n && i < json_array_size(j); i++) {
    const json_t *o = json_array_get(j, i);
    const char *name = json_string_value(json_object_get(o, "place"));
    CHECK(name && !strcmp(name, pl[i].name) && json_u64(o, "budget") == pl[i].budget &&
              json_u64(o, "resident_bytes") == pl[i].resident_bytes &&
              json_u64(o, "resident_tensors") == pl[i].resident_tensors &&
              json_u64(o, "pinned_bytes") == pl[i].pinned_bytes &&
              json_u64(o, "mem_free") <= json_u64(o, "mem_total") &&
              json_u64(o, "mem_total") == pl[i].mem_total &&
              json_u64(o, "pool_idle") == pl[i].pool_idle,
          "devices --json, place %zu (%s) differs from nwc_client_devices' %s", i,
          name ? name : "no name", pl[i].name);
  }
  json_decref(j);
  char *out = NULL, col[8][16];
  CHECK(run(&out, (const char *[]){"devices", NULL}) == 0, "devices");
  const char *want[8] = {"PLACE", "BUDGET", "USED", "TENSORS", "PINNED", "FREE", "TOTAL", "POOL"};
  int k = sscanf(out, "%15s %15s %15s %15s %15s %15s %15s %15s", col[0], col[1], col[2], col[3],
                 col[4], col[5], col[6], col[7]);
  for (int i = 0; i < 8; i++)
    CHECK(k == 8 && !strcmp(col[i], want[i]), "devices: column %d is not %s:\n%s", i, want[i], out);
  const char *line = out;
  for (size_t i = 0; i < n && (line = strchr(line, '\n')) && *++line; i++) {
    char name[16], u[6][8];
    double v[6];
    unsigned long long tensors;
    k = sscanf(line, "%15s %lf %7s %lf %7s %llu %lf %7s %lf %7s %lf %7s %lf %7s", name, &v[0], u[0],
               &v[1], u[1], &tensors, &v[2], u[2], &v[3], u[3], &v[4], u[4], &v[5], u[5]);
    CHECK(k == 14 && !strcmp(name, pl[i].name) && human_is(v[0], u[0], pl[i].budget) &&
              human_is(v[1], u[1], pl[i].resident_bytes) && tensors == pl[i].resident_tensors &&
              human_is(v[2], u[2], pl[i].pinned_bytes) && human_is(v[4], u[4], pl[i].mem_total) &&
              human_is(v[5], u[5], pl[i].pool_idle),
          "devices: line %zu is not %s's figures:\n%s", i + 1, pl[i].name, out);
  }
  CHECK(line && !strchr(line, '\n')[1], "devices: not one line per place:\n%s", out);
  printf("%s", out);
  free(out), free(pl);
}

/* Checkpoints with tensors nwc does not store (and an fp8 one, whose dtype is the longest that
 * ls MODEL shows). */
/* ps's mappings per place: t mapped twice and another tensor once by this process (host maps:
 * the cpu backend), then none once they are unmapped. */
static void check_ps_maps(const td_tensor *t) {
  const td_tensor *o = &td_t[0] == t ? &td_t[1] : &td_t[0];
  nwc_client *c = NULL;
  nwc_client_mapping *m[3] = {NULL, NULL, NULL};
  CHECK_RC(nwc_client_connect(td_sock, &c));
  if (!c) return;
  CHECK_RC(nwc_client_map(c, "use", t->name, &m[0]));
  CHECK_RC(nwc_client_map(c, "use", t->name, &m[1]));
  CHECK_RC(nwc_client_map(c, "use", o->name, &m[2]));
  char *out = NULL;
  CHECK(run(&out, (const char *[]){"ps", NULL}) == 0 && out && strstr(out, "\nmaps on cpu: 3 of 2 tensors\n"),
        "ps with 3 mappings of 2 tensors: %s", out ? out : "");
  free(out);
  for (int i = 0; i < 3; i++) nwc_client_unmap(m[i]);
  out = NULL;
  CHECK(run(&out, (const char *[]){"ps", NULL}) == 0 && out && !strstr(out, "maps on "),
        "ps after unmapping: %s", out ? out : "");
  free(out);
  nwc_client_free(c);
}

static void check_import_skips(void) {
  static float w[4 * 8];
  static int64_t ids[8];
  static uint8_t mask[8], f8[4 * 8];
  static int32_t buf[4];
  for (int i = 0; i < 32; i++) w[i] = (float)(test_uniform() - 0.5);
  for (int i = 0; i < 32; i++) f8[i] = (uint8_t)test_below(0x7f); /* E4M3, no NaN */
  st_spec ck[] = {{"w", "F32", 2, {4, 8}, w, sizeof w},
                  {"position_ids", "I64", 2, {1, 8}, ids, sizeof ids},
                  {"mask", "BOOL", 1, {8}, mask, sizeof mask},
                  {"buf", "I32", 2, {2, 2}, buf, sizeof buf},
                  {"e", "F32", 2, {0, 4}, NULL, 0},
                  {"f8", "F8_E4M3", 2, {4, 8}, f8, sizeof f8}};
  char path[400], many[400], ints[400];
  snprintf(path, sizeof path, "%s/ckpt.safetensors", td_dir);
  CHECK_RC(st_write(path, ck, 6));
  char *out = NULL;
  CHECK(run(&out, (const char *[]){"import", "ck", path, NULL}) == 0 &&
            strstr(out, "imported ck: 2 tensors, ") &&
            strstr(out, "; skipped 4 tensors that nwc does not store: position_ids (I64), mask "
                        "(BOOL), buf (I32), e (F32, empty)\n"),
        "import of a checkpoint with I64/BOOL/I32: %s", out);
  printf("%s", out);
  free(out);
  json_t *j = run_json((const char *[]){"ls", "ck", "--json", NULL});
  CHECK(run(&out, (const char *[]){"ls", "ck", NULL}) == 0 && strstr(out, " F8_E4M3 "), "ls ck");
  check_name_column("ls ck", out, "TENSOR", j, "name");
  free(out);
  json_decref(j);
  j = run_json((const char *[]){"import", "ck2", path, "--json", NULL});
  json_t *sk = json_object_get(j, "skipped_tensors"), *s0 = json_array_get(sk, 0);
  CHECK(json_integer_value(json_object_get(j, "tensors")) == 2 &&
            json_integer_value(json_object_get(j, "skipped")) == 4 && json_array_size(sk) == 4 &&
            !strcmp(json_string_value(json_object_get(s0, "name")), "position_ids") &&
            !strcmp(json_string_value(json_object_get(s0, "dtype")), "I64") &&
            json_integer_value(json_array_get(json_object_get(s0, "shape"), 1)) == 8,
        "import --json does not list the skipped tensors");
  json_decref(j);
  run_fails(1, "tensor 'position_ids' is I64, which nwc does not store",
            (const char *[]){"import", "ck3", path, "--strict", NULL});
  j = run_json((const char *[]){"ls", "--json", NULL});
  for (size_t i = 0; i < json_array_size(j); i++)
    CHECK(strcmp(json_string_value(json_object_get(json_array_get(j, i), "name")), "ck3"),
          "import --strict failed but published ck3");
  json_decref(j);
  /* A long list: the first 8, then how many more. */
  st_spec lots[13];
  char names[12][16];
  lots[0] = ck[0];
  for (int i = 0; i < 12; i++) {
    snprintf(names[i], sizeof names[i], "ids%d", i);
    lots[i + 1] = (st_spec){names[i], "I64", 1, {8}, ids, sizeof ids};
  }
  snprintf(many, sizeof many, "%s/many.safetensors", td_dir);
  CHECK_RC(st_write(many, lots, 13));
  CHECK(run(&out, (const char *[]){"import", "ck4", many, NULL}) == 0 &&
            strstr(out, "skipped 12 tensors that nwc does not store: ids0 (I64), ") &&
            strstr(out, "ids7 (I64), and 4 more (--json lists them)\n") && !strstr(out, "ids8"),
        "import with 12 skipped: %s", out);
  free(out);
  snprintf(ints, sizeof ints, "%s/ints.safetensors", td_dir);
  CHECK_RC(st_write(ints, &ck[1], 1));
  run_fails(1, "no tensor can be stored ('position_ids' is I64)",
            (const char *[]){"import", "ck5", ints, NULL});
  const char *const made[] = {"ck", "ck2", "ck4"};
  for (int i = 0; i < 3; i++) CHECK(run(NULL, (const char *[]){"rm", made[i], NULL}) == 0, "rm %s", made[i]);
}

int main(void) {
  test_seed("test_client_nwcctl");
  int skip = td_open_sample();
  if (skip) return skip;
  if (td_mkdir("nwc-ctl") < 0) return 1;
  setenv("NWC_SOCKET", td_sock, 1);
  char *out = NULL;
  run_fails(1, "cannot connect to nwcd", (const char *[]){"ls", NULL});
  /* Bad usage is exit 2 and says so whether or not a daemon runs (no daemon yet). */
  run_fails(2, "gather: missing -o OUT.npy", (const char *[]){"gather", "m/t", "0", NULL});
  run_fails(2, "matvec: missing X.npy", (const char *[]){"matvec", "m/t", "-o", "y.npy", NULL});
  run_fails(2, "import: --elem: expected bf16 or fp8, got 'f16'",
            (const char *[]){"import", "m", "f.safetensors", "--elem", "f16", NULL});
  run_fails(2, "info: expected MODEL/TENSOR, got 'm'", (const char *[]){"info", "m", NULL});
  run_fails(2, "load: --device: expected cpu, cuda:N, a comma-separated list of them or all, got 'gpu'",
            (const char *[]){"load", "m", "--device", "gpu", NULL});
  run_fails(3, "matvec: cannot open no-such-x.npy: No such file", /* 3 with a daemon or without */
            (const char *[]){"matvec", "m/t", "no-such-x.npy", "-o", "y.npy", NULL});
  /* A socket path that is a regular file or a directory: said so, not "is nwcd running?". */
  char notsock[400];
  snprintf(notsock, sizeof notsock, "%.200s/not-a-socket", td_dir);
  FILE *nf = fopen(notsock, "w");
  if (nf) fclose(nf);
  run_fails(1, "not-a-socket: it is a regular file, not a socket",
            (const char *[]){"--socket", notsock, "ls", NULL});
  run_fails(1, ": it is a directory, not a socket", (const char *[]){"--socket", td_dir, "ls", NULL});
  pid_t d = td_start_daemon(NULL);
  CHECK(d > 0, "nwcd did not start");
  if (d <= 0) return td_show_log(), 1;

  /* A sharded index naming the sample file as its only shard. */
  char dir[400], idx[500], shard[600];
  snprintf(dir, sizeof dir, "%.200s/model", td_dir);
  mkdir(dir, 0755);
  snprintf(shard, sizeof shard, "%s/model-00001-of-00001.safetensors", dir);
  CHECK(symlink(getenv("NWC_SAMPLE"), shard) == 0, "symlink");
  json_t *wm = json_object();
  for (size_t i = 0; i < td_sample->count; i++)
    json_object_set_new(wm, td_sample->tensors[i].name, json_string("model-00001-of-00001.safetensors"));
  json_t *index = json_pack("{s:{},s:o}", "metadata", "weight_map", wm);
  snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
  CHECK(json_dump_file(index, idx, 0) == 0, "write index");
  json_decref(index);
  CHECK(run(&out, (const char *[]){"import", "use", idx, NULL}) == 0 && strstr(out, "imported use: 35 tensors"),
        "import: %s", out);
  printf("%s", out);
  free(out);
  run_fails(1, "import: model 'use' already exists (nwcctl rm use removes it; or import under "
            "another name)", (const char *[]){"import", "use", idx, NULL});
  check_layouts(idx);
  /* ls lines up: with a model name longer than the column's 32, every line is as long. */
  const char *longname = "a-model-name-longer-than-thirty-two-chars";
  CHECK(run(NULL, (const char *[]){"import", longname, idx, NULL}) == 0, "import %s", longname);
  CHECK(run(&out, (const char *[]){"ls", NULL}) == 0, "ls");
  size_t width = strcspn(out, "\n");
  for (char *l = out; *l; l += strcspn(l, "\n") + 1)
    CHECK(strcspn(l, "\n") == width, "ls: a line of %zu characters, the header's %zu:\n%s", strcspn(l, "\n"), width, out);
  free(out);
  CHECK(run(NULL, (const char *[]){"rm", longname, NULL}) == 0, "rm %s", longname);
  check_import_skips();
  /* A file that is not safetensors, and the sample cut short: each said to be what it may be. */
  char cut[400];
  snprintf(cut, sizeof cut, "%.200s/cut.safetensors", td_dir);
  FILE *cf = fopen(cut, "w");
  if (cf) fputs("not safetensors at all\n", cf), fclose(cf);
  run_fails(1, "(not a safetensors file, or a truncated one)", (const char *[]){"import", "cut", cut, NULL});
  uint64_t keep = 100000 + test_below(400000);
  printf("import of the sample cut to %llu bytes\n", (unsigned long long)keep);
  CHECK(write_file(cut, td_sample->map, keep) == 0, "write %s", cut);
  run_fails(1, "a truncated file?)", (const char *[]){"import", "cut", cut, NULL});

  json_t *j = run_json((const char *[]){"ls", "--json", NULL});
  CHECK(json_is_array(j) && json_array_size(j) == 1, "ls --json");
  json_t *m = json_array_get(j, 0);
  CHECK(m && !strcmp(json_string_value(json_object_get(m, "name")), "use") &&
            json_integer_value(json_object_get(m, "tensors")) == (json_int_t)td_nt &&
            json_is_integer(json_object_get(m, "raw_bytes")) && json_is_integer(json_object_get(m, "nwc_bytes")) &&
            json_is_real(json_object_get(m, "ratio")) && json_is_integer(json_object_get(m, "resident_bytes")),
        "model object fields");
  json_decref(j);
  j = run_json((const char *[]){"ls", "use", "--json", NULL});
  CHECK(json_is_array(j) && json_array_size(j) == td_nt, "ls use --json");
  const char *keys[] = {"name", "shape", "dtype", "elem", "layout", "raw_bytes", "nwc_bytes", "resident"};
  for (size_t i = 0; i < json_array_size(j); i++)
    for (size_t k = 0; k < 8; k++)
      CHECK(json_object_get(json_array_get(j, i), keys[k]), "tensor object lacks %s", keys[k]);
  CHECK(run(&out, (const char *[]){"ls", "use", NULL}) == 0, "ls use");
  check_name_column("ls use", out, "TENSOR", j, "name");
  free(out);
  json_decref(j);

  /* The largest matrix, for the data commands. */
  const td_tensor *t = &td_t[0];
  for (size_t i = 0; i < td_nt; i++)
    if (td_t[i].rows * td_t[i].cols > t->rows * t->cols) t = &td_t[i];
  char name[1200];
  snprintf(name, sizeof name, "use/%s", t->name);
  j = run_json((const char *[]){"info", name, "--json", NULL});
  CHECK(j && json_integer_value(json_object_get(j, "rows")) == (json_int_t)t->rows, "info --json");
  json_decref(j);
  CHECK(run(&out, (const char *[]){"load", "use", NULL}) == 0 && strstr(out, "loaded use: 35 tensors"), "load: %s", out);
  free(out);
  j = run_json((const char *[]){"ps", "--json", NULL});
  CHECK(json_array_size(j) == td_nt, "ps after load: %zu", json_array_size(j));
  CHECK(run(&out, (const char *[]){"ps", NULL}) == 0, "ps");
  check_name_column("ps", out, "TENSOR", j, "tensor");
  CHECK(!strstr(out, "maps on "), "ps without mappings lists maps per place: %s", out);
  free(out);
  json_decref(j);
  check_ps_maps(t);
  CHECK(run(&out, (const char *[]){"pin", name, NULL}) == 0 && strstr(out, ": 1 tensor, "), "pin of one tensor: %s", out);
  free(out);
  check_devices();
  CHECK(run(NULL, (const char *[]){"evict", name, NULL}) == 1, "evict of a pinned tensor should fail");
  CHECK(run(NULL, (const char *[]){"unpin", name, NULL}) == 0, "unpin");
  CHECK(run(NULL, (const char *[]){"evict", "use", NULL}) == 0, "evict");
  j = run_json((const char *[]){"stats", "--json", NULL});
  CHECK(j && json_integer_value(json_object_get(j, "resident_tensors")) == 0 &&
            !strcmp(json_string_value(json_object_get(j, "backend")), "cpu"), "stats --json");
  CHECK(j && json_string_value(json_object_get(j, "daemon")) &&
            !strncmp(json_string_value(json_object_get(j, "daemon")), "nwcd ", 5),
        "stats --json: the daemon's version");
  json_decref(j);
  CHECK(run(&out, (const char *[]){"stats", NULL}) == 0 && strstr(out, "\ndaemon             nwcd ") &&
            strstr(out, "\nbudget ") &&
            strstr(strstr(out, "\nbudget "), "iB)\n"), "stats: the budget without a human size: %s", out);
  free(out);
  CHECK(run(&out, (const char *[]){"verify", NULL}) == 0 && strstr(out, "0 problems"), "verify: %s", out);
  free(out);

  /* Data commands: .npy against the original weights. */
  char npy[500], xnpy[500], hdr[512];
  size_t n;
  snprintf(npy, sizeof npy, "%.200s/out.npy", td_dir);
  CHECK(run(NULL, (const char *[]){"dequant", name, "-o", npy, "--bf16", NULL}) == 0, "dequant");
  uint8_t *data = read_npy(npy, &n, hdr, sizeof hdr);
  CHECK(data && n == t->rows * t->cols * 2 && !memcmp(data, t->w, n) && strstr(hdr, "'<u2'"),
        "dequant .npy differs (%zu bytes)", n);
  free(data);
  /* dequant writes the tensor's own shape from the file: a 1-D [N] one (stored 1 x N) as (N,). */
  for (size_t i = 0; i < td_sample->count; i++) {
    const nwc_st_tensor *v = &td_sample->tensors[i];
    if (v->ndim != 1 || v->shape[0] < 2 || strcmp(v->dtype, "BF16")) continue;
    char vname[1200], want[64];
    snprintf(vname, sizeof vname, "use/%s", v->name);
    snprintf(want, sizeof want, "'shape': (%llu,)", (unsigned long long)v->shape[0]);
    CHECK(run(NULL, (const char *[]){"dequant", vname, "-o", npy, "--bf16", NULL}) == 0, "dequant %s", vname);
    data = read_npy(npy, &n, hdr, sizeof hdr);
    CHECK(data && strstr(hdr, want) && n == v->end - v->begin &&
              !memcmp(data, nwc_st_data(td_sample, v), n), "dequant of 1-D %s: header %s, %zu bytes", v->name, hdr, n);
    free(data);
    break;
  }
  CHECK(run(NULL, (const char *[]){"gather", name, "3", "0", "7", "-o", npy, NULL}) == 0, "gather");
  data = read_npy(npy, &n, hdr, sizeof hdr);
  CHECK(data && n == 3 * t->cols * 4, "gather size");
  uint64_t rows[3] = {3, 0, 7};
  for (int r = 0; data && r < 3; r++)
    for (uint64_t k = 0; k < t->cols; k++) {
      float v;
      memcpy(&v, data + (r * t->cols + k) * 4, 4);
      if (v != nwc_bf16_to_f32(td_w(t, rows[r] * t->cols + k))) {
        CHECK(0, "gather row %d col %llu", r, (unsigned long long)k);
        break;
      }
    }
  free(data);
  /* matvec: write X as [2, K] float32 */
  snprintf(xnpy, sizeof xnpy, "%.200s/x.npy", td_dir);
  float *x = malloc(2 * t->cols * 4);
  for (uint64_t k = 0; k < 2 * t->cols; k++) x[k] = (float)(test_uniform() * 2 - 1);
  char shape[64];
  snprintf(shape, sizeof shape, "(2, %llu)", (unsigned long long)t->cols);
  write_npy(xnpy, shape, x, 2 * t->cols);
  j = run_json((const char *[]){"matvec", name, xnpy, "-o", npy, "--json", NULL});
  CHECK(j && json_integer_value(json_array_get(json_object_get(j, "shape"), 0)) == 2 &&
            json_integer_value(json_array_get(json_object_get(j, "shape"), 1)) == (json_int_t)t->rows &&
            !strcmp(json_string_value(json_object_get(j, "out")), npy), "matvec --json");
  json_decref(j);
  data = read_npy(npy, &n, hdr, sizeof hdr);
  CHECK(data && n == 2 * t->rows * 4, "matvec size %zu", n);
  for (int c = 0; data && c < 2; c++) {
    double e = td_matvec_err(t, x + c * t->cols, 1.0, NULL, (const float *)(data + c * t->rows * 4));
    CHECK(e <= 1e-5, "matvec column %d: error %.3g", c, e);
  }
  /* X of shape [K]: Y of shape [M], as numpy's W @ x. */
  snprintf(shape, sizeof shape, "(%llu,)", (unsigned long long)t->cols);
  write_npy(xnpy, shape, x, t->cols);
  CHECK(run(NULL, (const char *[]){"matvec", name, xnpy, "-o", npy, NULL}) == 0, "matvec of a 1-D x");
  free(data);
  data = read_npy(npy, &n, hdr, sizeof hdr);
  snprintf(shape, sizeof shape, "'shape': (%llu,)", (unsigned long long)t->rows);
  CHECK(data && strstr(hdr, shape) && n == t->rows * 4, "matvec of a 1-D x: header %s, %zu bytes",
        data ? hdr : "", n);
  if (data && n == t->rows * 4) {
    double e = td_matvec_err(t, x, 1.0, NULL, (const float *)data);
    CHECK(e <= 1e-5, "matvec of a 1-D x: error %.3g", e);
  }
  /* Bad x files: a third dimension, fewer values than the shape, more than 64 vectors, none. */
  snprintf(shape, sizeof shape, "(2, %llu, 1)", (unsigned long long)t->cols);
  write_npy(xnpy, shape, x, 2 * t->cols);
  run_fails(1, "has no shape of [K] or [n, K]", (const char *[]){"matvec", name, xnpy, "-o", npy, NULL});
  snprintf(shape, sizeof shape, "(2, %llu)", (unsigned long long)t->cols);
  write_npy(xnpy, shape, x, 2 * t->cols - 1);
  run_fails(1, "holds fewer values than its shape says", (const char *[]){"matvec", name, xnpy, "-o", npy, NULL});
  snprintf(shape, sizeof shape, "(65, %llu)", (unsigned long long)t->cols);
  write_npy(xnpy, shape, x, 2 * t->cols);
  run_fails(1, "has 65 vectors of", (const char *[]){"matvec", name, xnpy, "-o", npy, NULL});
  snprintf(shape, sizeof shape, "(0, %llu)", (unsigned long long)t->cols);
  write_npy(xnpy, shape, x, 0);
  run_fails(1, "is empty (shape 0 x", (const char *[]){"matvec", name, xnpy, "-o", npy, NULL});
  /* An x that is not a .npy at all, and one that does not exist (3, as nwcctl(1) says). */
  FILE *xf = fopen(xnpy, "w");
  if (xf) fputs("hello\n", xf), fclose(xf);
  run_fails(1, "x.npy is not a .npy file", (const char *[]){"matvec", name, xnpy, "-o", npy, NULL});
  unlink(xnpy);
  run_fails(3, "cannot open", (const char *[]){"matvec", name, xnpy, "-o", npy, NULL});
  snprintf(shape, sizeof shape, "(%llu,)", (unsigned long long)t->cols);
  write_npy(xnpy, shape, x, t->cols);
  run_fails(1, "cannot write /nonexistent-nwc/y.npy", (const char *[]){"matvec", name, xnpy, "-o", "/nonexistent-nwc/y.npy", NULL});
  run_fails(2, "--scale: expected a number, got 'abc'", (const char *[]){"matvec", name, xnpy, "-o", npy, "--scale", "abc", NULL});
  run_fails(2, "--bf16 gather's", (const char *[]){"matvec", name, xnpy, "-o", npy, "--bf16", NULL});
  run_fails(2, "--scale are matvec's", (const char *[]){"gather", name, "0", "-o", npy, "--scale", "1", NULL});
  free(data), free(x);
  /* Rows: as many as given (past the old 510-argument cap), each a whole number. */
  const char *many[700] = {"gather", name, "-o", npy};
  char nums[600][8];
  for (int r = 0; r < 600; r++) snprintf(nums[r], sizeof nums[r], "%d", (int)(test_below(t->rows))), many[4 + r] = nums[r];
  CHECK(run(NULL, many) == 0, "gather of 600 rows");
  data = read_npy(npy, &n, hdr, sizeof hdr);
  CHECK(data && n == 600 * t->cols * 4, "gather of 600 rows wrote %zu bytes", n);
  free(data);
  run_fails(2, "ROW: expected a whole number, got 'abc'", (const char *[]){"gather", name, "abc", "-o", npy, NULL});
  run_fails(2, "ROW: expected a whole number, got '-1'", (const char *[]){"gather", name, "-1", "-o", npy, NULL});

  /* Failures. */
  run_fails(3, "no model 'nope'", (const char *[]){"ls", "nope", NULL});
  run_fails(2, "expected MODEL/TENSOR, got 'use'", (const char *[]){"info", "use", NULL});
  /* MODEL/ left out: the tensor's first part is taken for a model, and nwcctl says there is none. */
  const char *noprefix = "' in the store (a tensor is named MODEL/TENSOR; nwcctl ls lists the models)";
  run_fails(3, noprefix, (const char *[]){"info", t->name, NULL});
  run_fails(3, noprefix, (const char *[]){"load", t->name, NULL});
  run_fails(3, noprefix, (const char *[]){"gather", t->name, "0", "-o", npy, NULL});
  run_fails(3, "no tensor use/nope in the store", (const char *[]){"info", "use/nope", NULL});
  run_fails(2, "'/x' is not MODEL or MODEL/TENSOR", (const char *[]){"info", "/x", NULL});
  run_fails(2, "--layout: expected auto, 0, 1 or 2, got 'x'", (const char *[]){"import", "m2", idx, "--layout", "x", NULL});
  run_fails(2, "--layout: expected auto, 0, 1 or 2, got '7'", (const char *[]){"import", "m2", idx, "--layout", "7", NULL});
  run_fails(2, "unknown option '--frob'", (const char *[]){"import", "m2", idx, "--frob", NULL});
  run_fails(2, "unknown option '--bogus'", (const char *[]){"ls", "--bogus", NULL});
  run_fails(2, "unknown option '--device'", (const char *[]){"load", "use", "--device", NULL});
  run_fails(2, "load: --device: expected cpu, cuda:N, a comma-separated list of them or all, got 'gpu'",
            (const char *[]){"load", "use", "--device", "gpu", NULL});
  run_fails(1, "no device cuda:0: backend cpu has no GPU (--device cpu, or nwcd --backend cuda",
            (const char *[]){"load", "use", "--device", "cuda:0", NULL});
  /* Several places: checked whole against the daemon's before anything loads; all is every GPU. */
  run_fails(2, "load: --device: expected cpu, cuda:N, a comma-separated list of them or all, got 'gpu'",
            (const char *[]){"load", "use", "--device", "cuda:0,gpu", NULL});
  run_fails(2, "got ''", (const char *[]){"load", "use", "--device", "cpu,", NULL});
  run_fails(1, "load: --device cuda:0,cuda:1: nwcd has no cuda:0 nor cuda:1 (its places: cpu); nothing "
               "done", (const char *[]){"load", "use", "--device", "cuda:0,cuda:1", NULL});
  run_fails(1, "load: --device all: nwcd has no GPU (its places: cpu; --device cpu loads into host memory)",
            (const char *[]){"load", "use", "--device", "all", NULL});
  /* Several places go in one load_places, a place named twice once: one result, for cpu. */
  CHECK(run(NULL, (const char *[]){"evict", name, NULL}) == 0, "evict before load --device cpu,cpu");
  json_t *jl = run_json((const char *[]){"load", name, "--device", "cpu,cpu", "--json", NULL});
  const char *dev = json_string_value(json_object_get(jl, "device"));
  CHECK(json_is_object(jl) && dev && !strcmp(dev, "cpu") && json_u64(jl, "tensors") == 1 &&
            json_u64(jl, "read_bytes") == json_u64(jl, "bytes"),
        "load --device cpu,cpu --json: one result on cpu, its bytes read once (%s)", dev ? dev : "(none)");
  json_decref(jl);
  CHECK(run(&out, (const char *[]){"load", name, "--device", "cpu,cpu", NULL}) == 0 &&
            strstr(out, " on cpu: 1 tensor, ") && !strstr(strstr(out, " on cpu: ") + 1, " on cpu: "),
        "load --device cpu,cpu: %s", out);
  free(out);
  /* pin --device: the replica on that place pinned (evict refused, naming it), unpin releases it. */
  CHECK(run(&out, (const char *[]){"pin", name, "--device", "cpu", NULL}) == 0 && strstr(out, "pinned ") &&
            strstr(out, ": 1 tensor, "),
        "pin --device cpu: %s", out);
  free(out);
  run_fails(1, "on cpu is pinned; unpin it first", (const char *[]){"evict", name, NULL});
  run_fails(1, "no device cuda:0: backend cpu has no GPU", (const char *[]){"pin", "use", "--device", "cuda:0", NULL});
  CHECK(run(NULL, (const char *[]){"unpin", name, NULL}) == 0, "unpin after pin --device cpu");
  /* evict --device: that place's replica (here the only one); a place the daemon lacks refused */
  run_fails(1, "evict: --device all: nwcd has no GPU (its places: cpu)", (const char *[]){"evict", name, "--device", "all", NULL});
  run_fails(1, "no device cuda:0: backend cpu has no GPU", (const char *[]){"evict", name, "--device", "cuda:0", NULL});
  CHECK(run(&out, (const char *[]){"evict", name, "--device", "cpu", NULL}) == 0 && strstr(out, "evicted ") &&
            strstr(out, ": 1 tensor, "),
        "evict --device cpu: %s", out);
  free(out);
  CHECK(run(&out, (const char *[]){"evict", name, "--device", "cpu", NULL}) == 0 && strstr(out, ": 0 tensors, "),
        "evict --device cpu of what is gone: %s", out);
  free(out);
  CHECK(run(NULL, (const char *[]){"ls", "use", "extra", NULL}) == 2, "ls with two arguments should exit 2");
  CHECK(run(NULL, (const char *[]){"ps", "extra", NULL}) == 2, "ps with an argument should exit 2");
  run_fails(2, "load: unexpected 'extra' (nwcctl load --help says what it takes)",
            (const char *[]){"load", "use", "extra", NULL});
  run_fails(2, "ps: unexpected 'extra'", (const char *[]){"ps", "extra", NULL});
  CHECK(run(NULL, (const char *[]){"devices", "extra", NULL}) == 2, "devices with an argument should exit 2");
  /* A required argument left out: one line naming it, not the command's whole usage. */
  run_fails(2, "load: missing MODEL[/TENSOR] (nwcctl load --help says what it takes)",
            (const char *[]){"load", NULL});
  run_fails(2, "info: missing MODEL/TENSOR", (const char *[]){"info", NULL});
  run_fails(2, "rm: missing MODEL (", (const char *[]){"rm", NULL});
  run_fails(2, "import: missing MODEL (", (const char *[]){"import", NULL});
  run_fails(2, "import: missing FILE.safetensors or INDEX.json", (const char *[]){"import", "m2", NULL});
  run_fails(2, "dequant: missing MODEL/TENSOR", (const char *[]){"dequant", NULL});
  run_fails(2, "dequant: missing -o OUT.npy", (const char *[]){"dequant", name, NULL});
  run_fails(2, "gather: expected MODEL/TENSOR, got 'use'", (const char *[]){"gather", "use", NULL});
  run_fails(2, "gather: missing ROW", (const char *[]){"gather", name, "-o", npy, NULL});
  run_fails(2, "gather: missing -o OUT.npy", (const char *[]){"gather", name, "0", NULL});
  run_fails(2, "matvec: missing X.npy", (const char *[]){"matvec", name, "-o", npy, NULL});
  run_fails(2, "matvec: missing -o Y.npy", (const char *[]){"matvec", name, xnpy, NULL});
  run_fails(2, "unknown command 'frobnicate' (nwcctl --help lists the commands)",
            (const char *[]){"frobnicate", NULL});
  run_fails(2, "unknown command 'lss' (did you mean 'ls'?", (const char *[]){"lss", NULL});
  run_fails(2, "did you mean 'devices'?", (const char *[]){"devcies", NULL});
  CHECK(run(&out, (const char *[]){"--help", NULL}) == 0 && strstr(out, "usage"), "--help");
  free(out);
  const char *cmds[] = {"ls", "ps", "devices", "info", "load", "evict", "pin", "unpin", "import",
                        "rm", "verify", "stats", "matvec", "gather", "dequant"};
  for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
    CHECK(run(&out, (const char *[]){cmds[i], "--help", NULL}) == 0 && strstr(out, cmds[i]) &&
              strstr(out, "usage"), "%s --help", cmds[i]);
    free(out);
  }
  CHECK(run(NULL, (const char *[]){"rm", "use", NULL}) == 0, "rm");
  CHECK(run(NULL, (const char *[]){"rm", "use", NULL}) != 0, "rm twice");
  CHECK(td_stop_daemon(d) == 0, "SIGTERM exit");
  if (test_failures) td_show_log();
  td_cleanup();
  return test_exit("test_client_nwcctl");
}
