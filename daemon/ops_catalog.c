/*
 * ops_catalog.c - the handlers that read or change the catalog: models, tensors, info, import,
 * remove.  Reads take no daemon lock: the store answers them on its read connection, from the
 * last commit, so a listing never waits for an import or a removal (docs/results.md, "Soak").
 * Import runs unlocked too (the store serializes its own writes, so other requests go on while it
 * encodes), on a thread of its own at a lower CPU priority (IMPORT_NICE).  Remove holds
 * d->store_lock (nwcd.h) while it first drops the model's resident tensors (-EBUSY while one is
 * in use) and then deletes the model, so that no residency lookup brings a tensor of it back in
 * between.
 */
#include "ops_internal.h"

#include "clock.h"
#include "log.h"
#include "nwcd.h"

#include "nwc_error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* Every tensor name the store accepts fits a name field of the protocol whole. */
_Static_assert(NWC_TENSOR_NAME_MAX == NWC_PROTO_NAME_MAX - 1, "store and protocol name limits");

static int import_progress(void *ctx, uint64_t done, uint64_t total) {
  nwcd_send_progress(ctx, done, total, done == total);
  return 0;
}

/* A name into a field of cap bytes, cut (a name stored before the store's limit) only between
 * UTF-8 characters, so that a listing stays valid UTF-8. */
static void copy_name(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n >= cap)
    for (n = cap - 1; n && ((unsigned char)src[n] & 0xc0) == 0x80;) n--;
  memcpy(dst, src, n);
  dst[n] = 0;
}

static void fill_tensor(nwcd *d, const nwc_tensor_info *ti, nwc_proto_tensor *t) {
  memset(t, 0, sizeof *t);
  copy_name(t->name, sizeof t->name, ti->name);
  t->ndim = (uint8_t)(ti->ndim > 8 ? 8 : ti->ndim);
  memcpy(t->shape, ti->shape, sizeof t->shape);
  snprintf(t->dtype, sizeof t->dtype, "%s", ti->dtype);
  t->elem = ti->elem, t->rows = ti->rows, t->cols = ti->cols;
  t->raw_bytes = ti->raw_bytes, t->nwc_bytes = ti->length;
  nwcd_res_describe(d->res, ti->model, ti->name, t);
}

int nwcd_op_models(nwcd_job *j) {
  nwcd *d = j->d;
  nwc_model_info *m = NULL;
  size_t n = 0;
  int rc = nwc_store_models(d->store, &m, &n);
  if (rc < 0) return rc;
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_pw_u32(&w, (uint32_t)n);
  for (size_t i = 0; i < n; i++) {
    nwc_proto_model pm = {.tensors = m[i].tensors, .raw_bytes = m[i].raw_bytes,
                          .nwc_bytes = m[i].nwc_bytes, .created = m[i].created,
                          .verified = m[i].verified};
    snprintf(pm.name, sizeof pm.name, "%s", m[i].name);
    pm.resident_bytes = nwcd_res_model_bytes(d->res, m[i].name);
    nwc_proto_put_model(&w, &pm);
  }
  nwc_model_info_free(m, n);
  nwcd_reply(j, &w);
  return 0;
}

int nwcd_model_tensors(nwcd *d, const char *model, nwc_tensor_info **ti, size_t *n) {
  int rc = nwc_store_tensors(d->store, model, ti, n);
  NWC_RETURN_IF(rc == -ENOENT, -ENOENT, "no model '%s' in the store", model);
  return rc;
}

int nwcd_op_tensors(nwcd_job *j) {
  nwc_tensor_info *ti = NULL;
  size_t n = 0;
  NWC_TRY(nwcd_model_tensors(j->d, j->req.model, &ti, &n));
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_pw_u32(&w, (uint32_t)n);
  nwc_proto_tensor t;
  for (size_t i = 0; i < n; i++) fill_tensor(j->d, &ti[i], &t), nwc_proto_put_tensor(&w, &t);
  nwc_tensor_info_free(ti, n);
  nwcd_reply(j, &w);
  return 0;
}

int nwcd_op_info(nwcd_job *j) {
  nwcd *d = j->d;
  nwc_tensor_info *ti = NULL;
  int rc = nwc_store_tensor(d->store, j->req.model, j->req.tensor, &ti);
  NWC_RETURN_IF(rc == -ENOENT, -ENOENT, "no tensor %s/%s in the store", j->req.model,
                j->req.tensor);
  if (rc < 0) return rc;
  nwc_proto_tensor t;
  fill_tensor(d, ti, &t);
  nwc_proto_info in = {.offset = ti->offset, .length = ti->length, .nchunks = ti->nchunks,
                       .nblocks = ti->nblocks, .data_bytes = ti->data_bytes,
                       .format_version = ti->format_version};
  snprintf(in.conversion, sizeof in.conversion, "%s", ti->conversion ? ti->conversion : "");
  snprintf(in.path, sizeof in.path, "%s", ti->path);
  nwc_tensor_info_free(ti, 1);
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_put_tensor(&w, &t);
  nwc_proto_put_info(&w, &in);
  nwcd_reply(j, &w);
  return 0;
}

/* The tensors an import skipped: all counted, the first NWC_PROTO_MAX_SKIPPED kept for the
 * import2 reply (fewer if memory runs out: the count stays right). */
typedef struct skipped_list {
  nwc_proto_skipped *v;
  size_t n, cap;
  uint64_t count;
} skipped_list;

static void on_skipped(void *ctx, const nwc_import_skip *t) {
  skipped_list *l = ctx;
  if (l->count++ >= NWC_PROTO_MAX_SKIPPED) return;
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 8;
    nwc_proto_skipped *v = realloc(l->v, cap * sizeof *v);
    if (!v) return;
    l->v = v, l->cap = cap;
  }
  nwc_proto_skipped *e = &l->v[l->n++];
  snprintf(e->name, sizeof e->name, "%s", t->name);
  snprintf(e->dtype, sizeof e->dtype, "%s", t->dtype);
  e->ndim = (uint8_t)(t->ndim > 8 ? 8 : t->ndim);
  memcpy(e->shape, t->shape, e->ndim * sizeof *e->shape);
}

/* An import's encoding runs this much nicer than the request workers (its encoder and writer
 * threads inherit it from the thread that starts them): it is batch work on every core, and at
 * the workers' priority it took the CPU from the listings and small requests of other clients. */
#define IMPORT_NICE 10

typedef struct import_call {
  nwcd *d;
  const nwc_proto_req *r;
  const nwc_import_file *files;
  int index_fd;
  const nwc_import_opts *o;
  int rc;
  char detail[NWC_PROTO_MAX_MSG]; /* the import thread's error detail (it is thread-local) */
} import_call;

static void *import_thread(void *arg) {
  import_call *c = arg;
  /* Linux: a thread's own nice value (the calling thread only, not the process). */
  (void)setpriority(PRIO_PROCESS, 0, getpriority(PRIO_PROCESS, 0) + IMPORT_NICE);
  c->rc = nwc_store_import_fds(c->d->store, c->r->model, c->index_fd, c->files, c->r->nfiles, c->o);
  if (c->rc < 0) snprintf(c->detail, sizeof c->detail, "%s", nwc_error_detail());
  return NULL;
}

/* nwc_store_import_fds on a thread of its own at IMPORT_NICE (here, if none can be started);
 * this worker waits for it, so the import still holds one worker as before. */
static int import_nicely(import_call *c) {
  pthread_t t;
  if (pthread_create(&t, NULL, import_thread, c) != 0)
    return nwc_store_import_fds(c->d->store, c->r->model, c->index_fd, c->files, c->r->nfiles,
                                c->o);
  pthread_join(t, NULL);
  return c->rc < 0 ? nwc__fail(c->rc, "%s", c->detail) : c->rc;
}

/* import and import2.  import (op 6) is all or nothing, as it always was: its clients cannot
 * hear which tensors were left out.  import2 skips them unless its flags say strict, and lists
 * them after the result. */
int nwcd_op_import(nwcd_job *j) {
  nwcd *d = j->d;
  nwc_proto_req *r = &j->req;
  NWC_RETURN_IF(!nwc_model_name_valid(r->model), -EINVAL,
                "'%s' is not a valid model name ([A-Za-z0-9][A-Za-z0-9._-]{0,127})", r->model);
  NWC_RETURN_IF(r->elem > NWC_ELEM_FP8, -EINVAL, "unknown element type %u", r->elem);
  nwc_import_file files[NWC_PROTO_MAX_FILES];
  for (uint32_t i = 0; i < r->nfiles; i++)
    files[i] = (nwc_import_file){r->files[i], j->fds[r->has_index + i]};
  nwcd_progress pc = {j, 0};
  skipped_list sk = {0};
  unsigned strict = r->op == NWC_OP_IMPORT || (r->import_flags & NWC_IMPORT_STRICT);
  nwc_import_opts o = {r->elem, r->layout, d->cfg.threads, import_progress, &pc,
                       strict, on_skipped, &sk};
  uint64_t t0 = nwcd_now_ns();
  /* Not under d->store_lock: the store serializes its own catalog access and holds none of it
   * while encoding, so requests on other models go on during an import; two imports of one
   * name both encode and the second to publish gets -EEXIST (and removes its container). */
  import_call call = {d, r, files, r->has_index ? j->fds[0] : -1, &o, 0, ""};
  int rc = import_nicely(&call);
  nwc_model_info *m = NULL;
  if (rc == 0) rc = nwc_store_model(d->store, r->model, &m);
  if (rc < 0) {
    free(sk.v);
    nwcd_log(NWCD_LOG_WARN, "import of %s failed: %s (%s)", r->model, nwc_error_detail(),
             strerror(-rc)); /* nwc_strerror's -ENOSPC is the codec's "output buffer too small" */
    return rc;
  }
  nwc_proto_result res = {.tensors = m->tensors, .bytes = m->nwc_bytes, .raw_bytes = m->raw_bytes,
                          .skipped = sk.count, .micros = (nwcd_now_ns() - t0) / 1000};
  char why[NWC_PROTO_NAME_MAX + 64] = "";
  if (sk.n)
    snprintf(why, sizeof why, "; skipped %llu that nwc does not store, the first '%s' (%s)",
             (unsigned long long)sk.count, sk.v[0].name, sk.v[0].dtype);
  nwcd_log(NWCD_LOG_INFO, "imported %s: %llu tensors, %llu -> %llu bytes in %.2f s%s", r->model,
           (unsigned long long)m->tensors, (unsigned long long)m->raw_bytes,
           (unsigned long long)m->nwc_bytes, res.micros / 1e6, why);
  nwc_model_info_free(m, 1);
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_put_result(&w, &res);
  if (r->op == NWC_OP_IMPORT2) {
    nwc_pw_u32(&w, (uint32_t)sk.n);
    for (size_t i = 0; i < sk.n; i++) nwc_proto_put_skipped(&w, &sk.v[i]);
  }
  free(sk.v);
  nwcd_reply(j, &w);
  return 0;
}

int nwcd_op_remove(nwcd_job *j) {
  nwcd *d = j->d;
  pthread_mutex_lock(&d->store_lock);
  int rc = nwcd_res_forget_model(d->res, j->req.model);
  if (rc == 0) rc = nwc_store_remove(d->store, j->req.model);
  pthread_mutex_unlock(&d->store_lock);
  NWC_RETURN_IF(rc == -ENOENT, -ENOENT, "no model '%s' in the store", j->req.model);
  if (rc < 0) return rc;
  nwcd_log(NWCD_LOG_INFO, "removed %s", j->req.model);
  nwc_proto_result res = {.tensors = 1};
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_put_result(&w, &res);
  nwcd_reply(j, &w);
  return 0;
}
