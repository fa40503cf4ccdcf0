/*
 * verify.c - nwc_store_verify: re-read every container of a model, check what each byte is
 * covered by, and decode every tensor.
 *
 * Every byte of a container file is covered by exactly one checksum: [0, 4096) by the header's
 * own XXH3, each blob by its chunk checksums (padding included), and the blobs tile the rest of
 * the file with no gap up to the size the catalog recorded.  So a flipped byte anywhere is found
 * and reported with the model, the tensor (none for the header) and the file range of the chunk
 * that holds it.  A chunk that fails is not decoded; one that passes is decoded in full with
 * nwc_dequant, which catches a catalog row that disagrees with its blob.  Before all of that the
 * catalog itself is checked (SQLite's integrity_check and foreign_key_check): a damaged page
 * may hide rows from the listing, so a clean run over the models it lists would prove nothing.
 */
#include "store_internal.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct vctx {
  nwc_verify_fn cb;
  void *ctx;
  nwc_verify_stats st;
  int first;
  char first_msg[1024];
} vctx;

static void problem(vctx *v, const char *model, const char *tensor, const char *path,
                    uint64_t off, uint64_t len, int err, const char *what) {
  v->st.problems++;
  if (!v->first) {
    v->first = err;
    size_t n = strnlen(what, sizeof v->first_msg - 1); /* the first message, cut to fit */
    memcpy(v->first_msg, what, n);
    v->first_msg[n] = 0;
  }
  if (v->cb) {
    nwc_verify_problem p = {model, tensor, path, off, len, err, what};
    v->cb(v->ctx, &p);
  }
}

static int cmp_offset(const void *a, const void *b) {
  const nwc_tensor_info *x = *(const nwc_tensor_info *const *)a;
  const nwc_tensor_info *y = *(const nwc_tensor_info *const *)b;
  return (x->offset > y->offset) - (x->offset < y->offset);
}

/* Checks one tensor's blob (already read into blob) chunk by chunk, then decodes it. */
static void verify_blob(vctx *v, const nwc_tensor_info *ti, const uint8_t *blob, uint16_t **scratch,
                        size_t *scratch_len) {
  int bad = 0;
  for (uint64_t i = 0; i < ti->nchunks; i++) {
    uint64_t o = i * ti->chunk_size;
    uint64_t n = ti->length - o < ti->chunk_size ? ti->length - o : ti->chunk_size;
    v->st.chunks++;
    if (nwc_store_chunk_check(ti, i, blob + o) < 0) {
      problem(v, ti->model, ti->name, ti->path, ti->offset + o, n, -EBADMSG, nwc_error_detail());
      bad = 1;
    }
  }
  if (bad) return;
  nwc_tensor t;
  int rc = nwc_store_blob_view(ti, blob, &t);
  if (rc == 0) {
    uint64_t lay[4];
    rc = nwc_layout(t.rows, t.cols, t.elem, lay);
    size_t need = rc ? 0 : (size_t)(t.rows * lay[NWC_LAYOUT_K16] * 2);
    if (rc == 0 && need > *scratch_len) {
      uint16_t *p = realloc(*scratch, need);
      if (!p) rc = -ENOMEM;
      else *scratch = p, *scratch_len = need;
    }
    if (rc == 0) rc = nwc_dequant(&t, *scratch);
    if (rc < 0) rc = nwc__fail_prefix(rc, "%s: model '%s' tensor '%s': decode", ti->path,
                                      ti->model, ti->name);
  }
  if (rc < 0)
    problem(v, ti->model, ti->name, ti->path, ti->offset, ti->length, rc, nwc_error_detail());
}

static int verify_container(vctx *v, const char *model, const char *path, uint64_t cid,
                            uint64_t size, nwc_tensor_info **ts, size_t nts) {
  char msg[1200];
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    snprintf(msg, sizeof msg, "%s: model '%s': container missing (%s)", path, model,
             strerror(errno));
    problem(v, model, NULL, path, 0, size, -errno, msg);
    return 0;
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && (uint64_t)st.st_size != size) {
    snprintf(msg, sizeof msg, "%s: model '%s': container is %llu bytes, the catalog says %llu",
             path, model, (unsigned long long)st.st_size, (unsigned long long)size);
    uint64_t lo = (uint64_t)st.st_size < size ? (uint64_t)st.st_size : size;
    uint64_t hi = (uint64_t)st.st_size < size ? size : (uint64_t)st.st_size;
    problem(v, model, NULL, path, lo, hi - lo, -EBADMSG, msg);
  }
  uint8_t *hdr = malloc(NWC__CONTAINER_HEADER);
  int rc = hdr ? nwc__pread_full(fd, hdr, NWC__CONTAINER_HEADER, 0) : -ENOMEM;
  if (rc == 0) rc = nwc__container_header_check(hdr, cid, path);
  else if (rc != -ENOMEM) rc = nwc__fail(rc, "%s: cannot read the container header", path);
  if (rc < 0) problem(v, model, NULL, path, 0, NWC__CONTAINER_HEADER, rc, nwc_error_detail());
  free(hdr);
  v->st.bytes += NWC__CONTAINER_HEADER;
  /* The blobs must tile [4096, size). */
  qsort(ts, nts, sizeof *ts, cmp_offset);
  uint64_t at = NWC__CONTAINER_HEADER;
  uint16_t *scratch = NULL;
  size_t scratch_len = 0;
  void *blob = NULL;
  size_t blob_len = 0;
  for (size_t i = 0; i < nts; i++) {
    const nwc_tensor_info *ti = ts[i];
    if (ti->offset != at) {
      snprintf(msg, sizeof msg, "%s: model '%s': tensor '%s' starts at %llu, expected %llu", path,
               model, ti->name, (unsigned long long)ti->offset, (unsigned long long)at);
      problem(v, model, ti->name, path, at < ti->offset ? at : ti->offset,
              at < ti->offset ? ti->offset - at : at - ti->offset, -EBADMSG, msg);
    }
    at = ti->offset + ti->length;
    if (ti->length > blob_len) {
      free(blob);
      blob = NULL;
      blob_len = 0;
      if (posix_memalign(&blob, NWC_STORE_ALIGN, ti->length)) {
        rc = -ENOMEM;
        break;
      }
      blob_len = ti->length;
    }
    rc = nwc__pread_full(fd, blob, ti->length, ti->offset);
    v->st.tensors++;
    v->st.bytes += ti->length;
    if (rc < 0) {
      snprintf(msg, sizeof msg, "%s: model '%s' tensor '%s': cannot read %llu bytes at %llu: %s",
               path, model, ti->name, (unsigned long long)ti->length,
               (unsigned long long)ti->offset, rc == -EIO ? "file too short" : strerror(-rc));
      problem(v, model, ti->name, path, ti->offset, ti->length, rc, msg);
      rc = 0;
      continue;
    }
    verify_blob(v, ti, blob, &scratch, &scratch_len);
  }
  if (rc == 0 && at != size) {
    snprintf(msg, sizeof msg, "%s: model '%s': blobs end at %llu, the container at %llu", path,
             model, (unsigned long long)at, (unsigned long long)size);
    problem(v, model, NULL, path, at < size ? at : size, at < size ? size - at : at - size,
            -EBADMSG, msg);
  }
  free(blob);
  free(scratch);
  close(fd);
  return rc;
}

static int verify_model(nwc_store *s, vctx *v, const char *model) {
  int64_t mid;
  nwc__lock(s);
  int rc0 = nwc__catalog_model_id(s->db, model, &mid);
  nwc__unlock(s);
  NWC_TRY(rc0);
  nwc_tensor_info *ts = NULL;
  size_t nts = 0, ncont = 0;
  uint64_t *ids = NULL, *sizes = NULL;
  uint64_t before = v->st.problems;
  int rc = nwc_store_tensors(s, model, &ts, &nts);
  if (rc == 0) {
    nwc__lock(s);
    rc = nwc__catalog_containers(s->db, mid, &ids, &sizes, &ncont);
    nwc__unlock(s);
  }
  nwc_tensor_info **sel = rc ? NULL : malloc((nts ? nts : 1) * sizeof *sel);
  if (rc == 0 && !sel) rc = -ENOMEM;
  for (size_t c = 0; rc == 0 && c < ncont; c++) {
    size_t n = 0;
    for (size_t i = 0; i < nts; i++)
      if (ts[i].container == ids[c]) sel[n++] = &ts[i];
    char name[32], *path = NULL;
    nwc__container_name(ids[c], 0, name);
    if (asprintf(&path, "%s/containers/%s", s->dir, name) < 0) {
      rc = -ENOMEM;
      break;
    }
    rc = verify_container(v, model, path, ids[c], sizes[c], sel, n);
    free(path);
  }
  for (size_t i = 0; rc == 0 && i < nts; i++) {
    size_t c = 0;
    while (c < ncont && ids[c] != ts[i].container) c++;
    if (c == ncont) {
      char msg[1024];
      snprintf(msg, sizeof msg, "model '%s' tensor '%s': container %llu is not in the catalog",
               model, ts[i].name, (unsigned long long)ts[i].container);
      problem(v, model, ts[i].name, ts[i].path, ts[i].offset, ts[i].length, -EBADMSG, msg);
    }
  }
  v->st.models++;
  if (rc == 0 && v->st.problems == before && !(s->flags & NWC_STORE_RDONLY))
  {
    nwc__lock(s);
    rc = nwc__catalog_set_verified(s->db, mid, (int64_t)time(NULL));
    nwc__unlock(s);
  }
  free(sel);
  free(ids);
  free(sizes);
  nwc_tensor_info_free(ts, nts);
  return rc;
}

typedef struct catalog_ctx {
  vctx *v;
  char path[PATH_MAX];
} catalog_ctx;

static void catalog_problem(void *ctx, const char *what) {
  catalog_ctx *c = ctx;
  char msg[PATH_MAX + 600];
  snprintf(msg, sizeof msg, "%s: %s", c->path, what);
  problem(c->v, NULL, NULL, c->path, 0, 0, -EBADMSG, msg);
}

int nwc_store_verify(nwc_store *s, const char *model, nwc_verify_fn cb, void *ctx,
                     nwc_verify_stats *st) {
  NWC_RETURN_IF(!s, -EINVAL, "nwc_store_verify: no store");
  vctx v = {cb, ctx, {0}, 0, ""};
  catalog_ctx cc = {&v, ""};
  snprintf(cc.path, sizeof cc.path, "%s/catalog.sqlite", s->dir);
  nwc__lock(s); /* the catalog itself first: its damage can hide rows from what follows */
  nwc__catalog_check(s->db, catalog_problem, &cc);
  nwc__unlock(s);
  int rc = 0;
  if (model) {
    rc = verify_model(s, &v, model);
  } else {
    nwc_model_info *m = NULL;
    size_t n = 0;
    rc = nwc_store_models(s, &m, &n);
    for (size_t i = 0; rc == 0 && i < n; i++) rc = verify_model(s, &v, m[i].name);
    nwc_model_info_free(m, n);
  }
  if (st) *st = v.st;
  if (rc < 0 && !v.st.problems) return rc; /* a catalog found damaged reports that instead */
  if (v.st.problems)
    return nwc__fail(-EBADMSG, "%llu problem(s); first: %s", (unsigned long long)v.st.problems,
                     v.first_msg);
  return 0;
}
