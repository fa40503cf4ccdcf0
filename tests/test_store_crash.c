/*
 * test_store_crash.c - atomicity under SIGKILL.  Many times, for a bounded time: fork a real child
 * that opens the store and imports a model (or removes one), kill it with SIGKILL at a random
 * moment, then reopen the store and check: every listed model is whole (all its tensors, each
 * reading back with its checksums and decoding to the source weights), verify passes, and
 * containers/ holds exactly the referenced files (the open swept any leftovers).
 */
#include "test_store_util.h"

#include <signal.h>
#include <sys/wait.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char dir[512], src[512], path[700];
static size_t ntensors;

static void child(int action, const char *name) {
  nwc_store *s;
  int rc = nwc_store_open(dir, 0, &s);
  if (rc < 0) _exit(3);
  nwc_import_opts o = {.threads = 2};
  rc = action ? nwc_store_remove(s, name) : nwc_store_import(s, name, path, &o);
  nwc_store_close(s);
  _exit(rc < 0 ? 4 : 0);
}

/* Checks that model name decodes to the source weights. */
static void check_model(nwc_store *s, const char *name, nwc_st_file *f) {
  nwc_model_info *mi = NULL;
  if (nwc_store_model(s, name, &mi) < 0) return;
  CHECK(mi->tensors == ntensors, "model %s has %llu tensors of %zu", name,
        (unsigned long long)mi->tensors, ntensors);
  nwc_model_info_free(mi, 1);
  for (size_t i = 0; i < f->count; i++) {
    const nwc_st_tensor *st = &f->tensors[i];
    nwc_tensor t;
    int rc = nwc_store_read(s, name, st->name, &t);
    CHECK(rc == 0, "%s/%s: %s", name, st->name, nwc_error_detail());
    if (rc) continue;
    uint64_t lay[4];
    nwc_layout(t.rows, t.cols, t.elem, lay);
    uint16_t *out = malloc(t.rows * lay[NWC_LAYOUT_K16] * 2);
    CHECK_RC(nwc_dequant(&t, out));
    const uint16_t *w = nwc_st_data(f, st);
    uint64_t bad = 0;
    for (uint64_t r = 0; r < t.rows; r++)
      for (uint64_t c = 0; c < t.cols; c++) bad += out[r * lay[NWC_LAYOUT_K16] + c] != w[r * t.cols + c];
    CHECK(bad == 0, "%s/%s: %llu weights differ", name, st->name, (unsigned long long)bad);
    free(out);
    nwc_tensor_release(&t);
  }
}

int main(void) {
  test_seed("test_store_crash");
  make_tmpdir(dir, sizeof dir, "store");
  make_tmpdir(src, sizeof src, "src");
  /* Twelve tensors, about 6 MB of BF16. */
  enum { NT = 12 };
  st_spec spec[NT];
  char names[NT][32];
  uint16_t *bufs[NT];
  for (int i = 0; i < NT; i++) {
    uint64_t rows = 64 + test_below(200), cols = 512 + test_below(1500);
    bufs[i] = malloc(rows * cols * 2);
    for (uint64_t k = 0; k < rows * cols; k++)
      bufs[i][k] = nwc_f32_to_bf16((float)((test_uniform() - 0.5) * 0.1));
    snprintf(names[i], sizeof names[i], "layers.%d.weight", i);
    spec[i] = (st_spec){names[i], "BF16", 2, {rows, cols}, bufs[i], rows * cols * 2};
  }
  snprintf(path, sizeof path, "%s/m.safetensors", src);
  CHECK_RC(st_write(path, spec, NT));
  ntensors = NT;
  nwc_st_file *f;
  CHECK_RC(nwc_st_open(path, &f));
  nwc_store *s;
  CHECK_RC(nwc_store_open(dir, NWC_STORE_CREATE, &s));
  nwc_store_close(s);

  /* How long one import takes here (sanitizers make it slower): kill within 1.3x of that. */
  double t0 = now();
  pid_t pid = fork();
  if (pid == 0) child(0, "timing");
  int status;
  waitpid(pid, &status, 0);
  double span = now() - t0;
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "timing import failed: %d", status);
  printf("one import in a child: %.1f ms\n", span * 1e3);

  double deadline = now() + 20;
  int iter = 0, published = 0, killed = 0, removes = 0;
  uint64_t swept = 0;
  char live[64][32];
  int nlive = 0;
  snprintf(live[nlive++], 32, "timing");
  while (iter < 400 && (now() < deadline || iter < 30) && !test_failures) {
    int action = nlive >= 3 ? 1 : 0;
    char name[32];
    if (action) snprintf(name, sizeof name, "%s", live[test_below((uint64_t)nlive)]);
    else snprintf(name, sizeof name, "m%d", iter);
    useconds_t delay = (useconds_t)(test_uniform() * span * 1.3 * 1e6);
    pid = fork();
    if (pid == 0) child(action, name);
    usleep(delay);
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    int was_killed = WIFSIGNALED(status);
    killed += was_killed;
    CHECK(was_killed || (WIFEXITED(status) && WEXITSTATUS(status) == 0),
          "iteration %d: child exited with %d", iter, status);
    int rc = nwc_store_open(dir, 0, &s);
    CHECK(rc == 0, "iteration %d: reopen: %s", iter, nwc_error_detail());
    if (rc) break;
    swept += nwc_store_swept(s);
    nwc_model_info *mi = NULL;
    int present = nwc_store_model(s, name, &mi) == 0;
    nwc_model_info_free(mi, 1);
    if (!action && present) {
      published++;
      snprintf(live[nlive++], 32, "%s", name);
    }
    if (action && !present) {
      removes++;
      for (int k = 0; k < nlive; k++)
        if (!strcmp(live[k], name)) memmove(live[k], live[k + 1], (size_t)(nlive - k - 1) * 32), nlive--;
    }
    int nm = check_store_consistent(s, dir);
    CHECK(nm == nlive, "iteration %d: %d models, expected %d", iter, nm, nlive);
    if (!action && present) check_model(s, name, f);
    nwc_store_close(s);
    iter++;
  }
  printf("%d iterations, %d killed, %d imports published, %d removals done, %llu leftovers "
         "swept\n",
         iter, killed, published, removes, (unsigned long long)swept);
  CHECK(iter >= 30, "only %d iterations", iter);
  CHECK(swept > 0 || killed == 0, "killed %d times and never left anything to sweep?", killed);
  nwc_st_close(f);
  for (int i = 0; i < NT; i++) free(bufs[i]);
  rm_rf(dir);
  rm_rf(src);
  return test_exit("test_store_crash");
}
