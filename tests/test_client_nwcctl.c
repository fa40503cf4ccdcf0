/*
 * test_client_nwcctl.c - nwcctl as a user runs it, as real processes against a real nwcd:
 * import of the sample model through a sharded index (.json naming it as its one shard; the
 * descriptors are passed by SCM_RIGHTS), ls / ls MODEL / info / ps / stats with --json parsed by
 * jansson (the field names of the issue), load, pin, unpin, evict, verify, dequant / gather /
 * matvec writing .npy files checked against the original weights, NWC_SOCKET as the default
 * socket, and failures: unknown model (non-zero exit, one line with the daemon's message), bad
 * usage (exit 2), no daemon.
 */
#include "test_daemon_util.h"

#include <jansson.h>

/* Runs nwcctl with args (NULL-terminated); stdout into out (malloc'ed), returns exit status. */
static int run(char **out, const char *const *args) {
  int pfd[2];
  if (pipe(pfd) < 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    const char *argv[40] = {NWCCTL_PATH};
    int n = 1;
    for (int i = 0; args[i] && n < 39; i++) argv[n++] = args[i];
    argv[n] = NULL;
    dup2(pfd[1], 1);
    close(pfd[0]);
    execv(NWCCTL_PATH, (char *const *)argv);
    _exit(127);
  }
  close(pfd[1]);
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  ssize_t k;
  while ((k = read(pfd[0], buf + len, cap - len - 1)) > 0) {
    len += (size_t)k;
    if (cap - len < 2) buf = realloc(buf, cap *= 2);
  }
  buf[len] = 0;
  close(pfd[0]);
  int st;
  waitpid(pid, &st, 0);
  if (out) *out = buf;
  else free(buf);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
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

int main(void) {
  test_seed("test_client_nwcctl");
  int skip = td_open_sample();
  if (skip) return skip;
  if (td_mkdir("nwc-ctl") < 0) return 1;
  setenv("NWC_SOCKET", td_sock, 1);
  char *out = NULL;
  CHECK(run(NULL, (const char *[]){"ls", NULL}) != 0, "ls without a daemon should fail");
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
  CHECK(run(NULL, (const char *[]){"import", "use", idx, NULL}) == 1, "second import should fail");

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
  json_decref(j);
  CHECK(run(NULL, (const char *[]){"pin", name, NULL}) == 0, "pin");
  CHECK(run(NULL, (const char *[]){"evict", name, NULL}) == 1, "evict of a pinned tensor should fail");
  CHECK(run(NULL, (const char *[]){"unpin", name, NULL}) == 0, "unpin");
  CHECK(run(NULL, (const char *[]){"evict", "use", NULL}) == 0, "evict");
  j = run_json((const char *[]){"stats", "--json", NULL});
  CHECK(j && json_integer_value(json_object_get(j, "resident_tensors")) == 0 &&
            !strcmp(json_string_value(json_object_get(j, "backend")), "cpu"), "stats --json");
  json_decref(j);
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
  {
    FILE *f = fopen(xnpy, "wb");
    char h[128];
    int hl = snprintf(h, sizeof h, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, %llu), }",
                      (unsigned long long)t->cols);
    int pad = (64 - (10 + hl + 1) % 64) % 64;
    unsigned total = (unsigned)(hl + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc((int)(total & 255), f), fputc((int)(total >> 8), f);
    fwrite(h, 1, (size_t)hl, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    fwrite(x, 4, 2 * t->cols, f);
    fclose(f);
  }
  CHECK(run(NULL, (const char *[]){"matvec", name, xnpy, "-o", npy, NULL}) == 0, "matvec");
  data = read_npy(npy, &n, hdr, sizeof hdr);
  CHECK(data && n == 2 * t->rows * 4, "matvec size %zu", n);
  for (int c = 0; data && c < 2; c++) {
    double e = td_matvec_err(t, x + c * t->cols, 1.0, NULL, (const float *)(data + c * t->rows * 4));
    CHECK(e <= 1e-5, "matvec column %d: error %.3g", c, e);
  }
  free(data), free(x);

  /* Failures. */
  CHECK(run(NULL, (const char *[]){"ls", "nope", NULL}) != 0, "ls of an unknown model should fail");
  CHECK(run(NULL, (const char *[]){"load", NULL}) == 2, "usage error should exit 2");
  CHECK(run(NULL, (const char *[]){"frobnicate", NULL}) == 2, "unknown command should exit 2");
  CHECK(run(&out, (const char *[]){"--help", NULL}) == 0 && strstr(out, "usage"), "--help");
  free(out);
  const char *cmds[] = {"ls", "ps", "info", "load", "evict", "pin", "unpin", "import", "rm",
                        "verify", "stats", "matvec", "gather", "dequant"};
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
