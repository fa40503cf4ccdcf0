/*
 * test_store_util.h - what the store tests share: a safetensors writer (header emitted with
 * jansson's json_dumps), temporary store directories, and a whole-store consistency check (every
 * listed tensor reads back with its checksums, validates and decodes; no file in containers/ is
 * unreferenced; no temporary file is left).
 */
#ifndef NWC_TEST_STORE_UTIL_H
#define NWC_TEST_STORE_UTIL_H

#include "nwc_store.h"
#include "safetensors.h"
#include "test_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <sys/stat.h>

typedef struct st_spec {
  const char *name;
  const char *dtype;
  unsigned ndim;
  uint64_t shape[8];
  const void *data;
  size_t bytes;
} st_spec;

/* A safetensors file in memory (malloc'ed; caller frees).  pad aligns the data section to 8. */
static inline uint8_t *st_build(const st_spec *t, size_t n, size_t *len) {
  json_t *root = json_object();
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_object(), *shape = json_array(), *offs = json_array();
    for (unsigned d = 0; d < t[i].ndim; d++) json_array_append_new(shape, json_integer((json_int_t)t[i].shape[d]));
    json_array_append_new(offs, json_integer((json_int_t)off));
    json_array_append_new(offs, json_integer((json_int_t)(off + t[i].bytes)));
    json_object_set_new(e, "dtype", json_string(t[i].dtype));
    json_object_set_new(e, "shape", shape);
    json_object_set_new(e, "data_offsets", offs);
    json_object_set_new(root, t[i].name, e);
    off += t[i].bytes;
  }
  json_t *meta = json_object();
  json_object_set_new(meta, "format", json_string("pt"));
  json_object_set_new(root, "__metadata__", meta);
  char *h = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(root);
  size_t hl = strlen(h), hp = (hl + 7) / 8 * 8;
  uint8_t *buf = malloc(8 + hp + off);
  uint64_t hp64 = hp;
  memcpy(buf, &hp64, 8);
  memcpy(buf + 8, h, hl);
  memset(buf + 8 + hl, ' ', hp - hl);
  free(h);
  size_t o = 8 + hp;
  for (size_t i = 0; i < n; i++) {
    if (t[i].bytes) memcpy(buf + o, t[i].data, t[i].bytes);
    o += t[i].bytes;
  }
  *len = o;
  return buf;
}

static inline int write_file(const char *path, const void *buf, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) return -errno;
  size_t w = len ? fwrite(buf, 1, len, f) : 0;
  int rc = fclose(f);
  return w == len && rc == 0 ? 0 : -EIO;
}

static inline int st_write(const char *path, const st_spec *t, size_t n) {
  size_t len;
  uint8_t *buf = st_build(t, n, &len);
  int rc = write_file(path, buf, len);
  free(buf);
  return rc;
}

/* Writes path: a safetensors file of n BF16 matrices names[m] of rows[m] x K, uniform in
 * [-0.05, 0.05); w[m] gets each one's weights (malloc'ed; the caller frees them). */
static inline int st_write_matrices(const char *path, const char *const *names,
                                    const uint64_t *rows, uint64_t K, size_t n, uint16_t **w) {
  st_spec sp[8];
  if (n > 8) return -EINVAL;
  for (size_t m = 0; m < n; m++) {
    w[m] = malloc(rows[m] * K * 2);
    for (uint64_t i = 0; i < rows[m] * K; i++)
      w[m][i] = nwc_f32_to_bf16((float)(test_uniform() - 0.5) * 0.1f);
    sp[m] = (st_spec){names[m], "BF16", 2, {rows[m], K}, w[m], rows[m] * K * 2};
  }
  return st_write(path, sp, n);
}

/* A fresh temporary directory (static buffer per call site: pass your own). */
static inline void make_tmpdir(char *buf, size_t n, const char *tag) {
  const char *base = getenv("TMPDIR");
  snprintf(buf, n, "%s/nwc-%s-XXXXXX", base && *base ? base : "/tmp", tag);
  if (!mkdtemp(buf)) {
    perror("mkdtemp");
    exit(1);
  }
}

static inline void rm_rf(const char *path) {
  DIR *d = opendir(path);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      char p[4096];
      if (snprintf(p, sizeof p, "%s/%s", path, e->d_name) >= (int)sizeof p) continue;
      rm_rf(p);
    }
    closedir(d);
    rmdir(path);
  } else {
    unlink(path);
  }
}

/* Number of entries in DIR/containers (excluding . and ..). */
static inline int count_containers(const char *store) {
  char p[4096];
  snprintf(p, sizeof p, "%s/containers", store);
  DIR *d = opendir(p);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

/* Every model: every tensor reads back (checksums), validates, decodes; verify passes; the
 * containers directory holds exactly the referenced files.  Returns the number of models. */
static inline int check_store_consistent(nwc_store *s, const char *dir) {
  nwc_model_info *m = NULL;
  size_t nm = 0;
  int rc = nwc_store_models(s, &m, &nm);
  CHECK(rc == 0, "models: %d %s", rc, nwc_error_detail());
  size_t files = 0;
  for (size_t i = 0; i < nm; i++) {
    nwc_tensor_info *ts = NULL;
    size_t nt = 0;
    rc = nwc_store_tensors(s, m[i].name, &ts, &nt);
    CHECK(rc == 0 && nt == m[i].tensors, "model %s: %zu tensors, catalog says %llu (%s)",
          m[i].name, nt, (unsigned long long)m[i].tensors, nwc_error_detail());
    uint64_t last_c = UINT64_MAX;
    for (size_t k = 0; k < nt; k++) {
      if (ts[k].container != last_c) files++, last_c = ts[k].container; /* one container/model */
      nwc_tensor t;
      rc = nwc_store_read_info(&ts[k], &t);
      CHECK(rc == 0, "read %s/%s: %s", m[i].name, ts[k].name, nwc_error_detail());
      if (rc == 0) {
        uint64_t lay[4];
        nwc_layout(t.rows, t.cols, t.elem, lay);
        uint16_t *out = malloc(t.rows * lay[NWC_LAYOUT_K16] * 2);
        CHECK_RC(nwc_dequant(&t, out));
        free(out);
        nwc_tensor_release(&t);
      }
    }
    nwc_tensor_info_free(ts, nt);
  }
  nwc_verify_stats vs;
  rc = nwc_store_verify(s, NULL, NULL, NULL, &vs);
  CHECK(rc == 0 && vs.problems == 0, "verify: %d %s", rc, nwc_error_detail());
  int nfiles = count_containers(dir);
  CHECK(nfiles == (int)files, "containers/ holds %d files, the catalog references %zu", nfiles,
        files);
  nwc_model_info_free(m, nm);
  return (int)nm;
}

#endif
