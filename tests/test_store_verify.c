/*
 * test_store_verify.c - nwc_store_verify finds and names corruption: flip a random bit anywhere
 * in a container file, and verify must fail with a problem whose model, tensor (none for the
 * container header) and file range hold the flipped byte; every read path refuses the tensor;
 * restoring the byte makes verify clean again.  Also: a truncated, an extended and a missing
 * container file.
 */
#include "test_store_util.h"

#include <time.h>

typedef struct seen {
  int n, hit;
  uint64_t pos;
  char tensor[256], model[64];
} seen;

static void on_problem(void *ctx, const nwc_verify_problem *p) {
  seen *s = ctx;
  s->n++;
  if (p->offset <= s->pos && s->pos < p->offset + p->length && !s->hit) {
    s->hit = 1;
    snprintf(s->tensor, sizeof s->tensor, "%s", p->tensor ? p->tensor : "");
    snprintf(s->model, sizeof s->model, "%s", p->model);
  }
}

static void flip(const char *path, uint64_t pos, uint8_t mask) {
  int fd = open(path, O_RDWR);
  uint8_t b = 0;
  CHECK(fd >= 0 && pread(fd, &b, 1, (off_t)pos) == 1, "read %s", path);
  b ^= mask;
  CHECK(pwrite(fd, &b, 1, (off_t)pos) == 1, "write %s", path);
  close(fd);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(void) {
  test_seed("test_store_verify");
  char dir[512], src[512], path[700];
  make_tmpdir(dir, sizeof dir, "store");
  make_tmpdir(src, sizeof src, "src");
  /* Tensors of several chunks and of one, and an fp8 one with a scale. */
  enum { NT = 5 };
  uint64_t shp[NT][2] = {{1024, 1100}, {96, 512}, {1, 300}, {700, 900}, {7, 9}};
  st_spec spec[NT];
  uint16_t *bufs[NT];
  char names[NT][32];
  for (int i = 0; i < NT; i++) {
    uint64_t n = shp[i][0] * shp[i][1];
    bufs[i] = malloc(n * 2);
    for (uint64_t k = 0; k < n; k++)
      bufs[i][k] = nwc_f32_to_bf16((float)((test_uniform() - 0.5) * 0.2));
    snprintf(names[i], sizeof names[i], "blk.%d.w", i);
    spec[i] = (st_spec){names[i], "BF16", shp[i][0] == 1 ? 1 : 2,
                        {shp[i][0] == 1 ? shp[i][1] : shp[i][0], shp[i][1]}, bufs[i], n * 2};
  }
  snprintf(path, sizeof path, "%s/v.safetensors", src);
  CHECK_RC(st_write(path, spec, NT));
  nwc_store *s;
  CHECK_RC(nwc_store_open(dir, NWC_STORE_CREATE, &s));
  CHECK_RC(nwc_store_import(s, "vm", path, NULL));
  nwc_import_opts q = {.elem = NWC_ELEM_FP8};
  CHECK_RC(nwc_store_import(s, "vq", path, &q));
  nwc_verify_stats st;
  CHECK_RC(nwc_store_verify(s, NULL, NULL, NULL, &st));
  CHECK(st.models == 2 && st.tensors == 2 * NT && st.problems == 0, "clean verify counts");
  printf("clean: %llu models, %llu tensors, %llu chunks, %llu bytes\n",
         (unsigned long long)st.models, (unsigned long long)st.tensors,
         (unsigned long long)st.chunks, (unsigned long long)st.bytes);
  nwc_model_info *mi = NULL;
  CHECK_RC(nwc_store_model(s, "vm", &mi));
  CHECK(mi && mi->verified > 0, "verified time recorded");
  nwc_model_info_free(mi, 1);

  const char *models[2] = {"vm", "vq"};
  double deadline = now() + 12;
  int iters = 0, header_hits = 0;
  while ((iters < 60 || now() < deadline) && iters < 400 && !test_failures) {
    const char *model = models[test_below(2)];
    nwc_tensor_info *ti = NULL;
    size_t nt = 0;
    CHECK_RC(nwc_store_tensors(s, model, &ti, &nt));
    if (!nt) break;
    struct stat sb;
    stat(ti[0].path, &sb);
    uint64_t size = (uint64_t)sb.st_size;
    /* Bias toward the header and blob headers now and then; otherwise uniform. */
    uint64_t pos = test_below(4) == 0 ? test_below(4096 + 256) : test_below(size);
    if (pos >= size) pos = size - 1;
    const char *want = NULL;
    for (size_t i = 0; i < nt; i++)
      if (pos >= ti[i].offset && pos < ti[i].offset + ti[i].length) want = ti[i].name;
    CHECK(want || pos < 4096, "byte %llu is in no blob", (unsigned long long)pos);
    uint8_t mask = (uint8_t)(1u << test_below(8));
    flip(ti[0].path, pos, mask);
    seen sn = {0};
    sn.pos = pos;
    int rc = nwc_store_verify(s, model, on_problem, &sn, &st);
    CHECK(rc == -EBADMSG && sn.n >= 1 && sn.hit, "flip at %llu (%s/%s): rc %d, %d problems, hit %d",
          (unsigned long long)pos, model, want ? want : "(header)", rc, sn.n, sn.hit);
    CHECK(!strcmp(sn.model, model), "problem names model %s, want %s", sn.model, model);
    CHECK(!strcmp(sn.tensor, want ? want : ""), "flip at %llu: problem names tensor '%s', want '%s'",
          (unsigned long long)pos, sn.tensor, want ? want : "");
    if (iters < 3) printf("flip at %llu: %s\n", (unsigned long long)pos, nwc_error_detail());
    header_hits += !want;
    if (want) {
      nwc_tensor t;
      CHECK(nwc_store_read(s, model, want, &t) == -EBADMSG, "read of a corrupt tensor succeeded");
      nwc_store_map *m = NULL;
      for (size_t i = 0; i < nt; i++)
        if (!strcmp(ti[i].name, want))
          CHECK(nwc_store_map_info(&ti[i], &m, &t) == -EBADMSG, "map of a corrupt tensor");
    }
    flip(ti[0].path, pos, mask);
    if (iters % 16 == 0) CHECK_RC(nwc_store_verify(s, model, NULL, NULL, NULL));
    nwc_tensor_info_free(ti, nt);
    iters++;
  }
  printf("%d bit flips found and named (%d in the container header)\n", iters, header_hits);
  CHECK_RC(nwc_store_verify(s, NULL, NULL, NULL, NULL));

  /* Truncated, extended, missing. */
  nwc_tensor_info *ti = NULL;
  CHECK_RC(nwc_store_tensor(s, "vm", "blk.0.w", &ti));
  struct stat sb;
  stat(ti->path, &sb);
  uint8_t tail[4096];
  int fd = open(ti->path, O_RDWR);
  CHECK(pread(fd, tail, 4096, sb.st_size - 4096) == 4096, "read tail");
  CHECK(truncate(ti->path, sb.st_size - 4096) == 0, "truncate");
  CHECK(nwc_store_verify(s, "vm", NULL, NULL, NULL) == -EBADMSG, "truncated container");
  printf("truncated: %s\n", nwc_error_detail());
  CHECK(truncate(ti->path, sb.st_size + 1) == 0, "extend");
  CHECK(nwc_store_verify(s, "vm", NULL, NULL, NULL) == -EBADMSG, "extended container");
  CHECK(truncate(ti->path, sb.st_size) == 0, "restore");
  CHECK(pwrite(fd, tail, 4096, sb.st_size - 4096) == 4096, "restore tail");
  close(fd);
  CHECK_RC(nwc_store_verify(s, "vm", NULL, NULL, NULL));
  char moved[800];
  snprintf(moved, sizeof moved, "%s.moved", ti->path);
  CHECK(rename(ti->path, moved) == 0, "move away");
  CHECK(nwc_store_verify(s, "vm", NULL, NULL, NULL) == -EBADMSG, "missing container");
  printf("missing: %s\n", nwc_error_detail());
  CHECK(rename(moved, ti->path) == 0, "move back");
  nwc_tensor_info_free(ti, 1);
  CHECK(nwc_store_verify(s, "nope", NULL, NULL, NULL) == -ENOENT, "unknown model");
  check_store_consistent(s, dir);
  nwc_store_close(s);
  for (int i = 0; i < NT; i++) free(bufs[i]);
  rm_rf(dir);
  rm_rf(src);
  return test_exit("test_store_verify");
}
