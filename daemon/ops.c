/*
 * ops.c - the request handlers: each runs on a worker thread with a decoded request (job->req)
 * and sends progress events and one final reply through nwcd_server_send(), which frees the job.
 *
 * Design: every handler returns 0 after sending its reply, or a negative errno, in which case
 * nwcd_ops_run() sends the error reply with nwc_error_detail() as the message; so a handler
 * checks outside input with NWC_RETURN_IF and never aborts.  Catalog access holds d->store_lock;
 * compute holds residency references (nwcd_res_acquire / nwcd_res_release) for exactly the
 * time it reads the weights.  Bulk output goes inline up to the frame maximum or into the
 * connection's shared region at the offset the request names, checked against its size.
 * Matvec jobs that the pool chained on job->batch share one nwc_matvec_batch pass.
 */
#include "nwcd.h"

#include "internal.h"
#include "size_text.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void send_frame(nwcd_job *j, nwc_pw *w, int32_t status, uint16_t flags, bool final) {
  if (final && j->alone) flags |= NWC_PF_ALONE;
  int64_t n = nwc_pw_finish(w, j->req.op, flags, status, j->req.id);
  if (n < 0) { /* could not build the reply: send the failure instead */
    nwc_pw_free(w);
    nwc_pw_init(w);
    nwc_pw_str(w, "the daemon could not build the reply (out of memory or too large)");
    n = nwc_pw_finish(w, j->req.op, 0, -ENOMEM, j->req.id);
    if (n < 0) {
      nwc_pw_free(w);
      nwcd_server_send(j, NULL, 0, final);
      return;
    }
  }
  nwcd_server_send(j, w->buf, (size_t)n, final);
  w->buf = NULL;
}

static void reply(nwcd_job *j, nwc_pw *w) { send_frame(j, w, 0, 0, true); }

static void reply_error(nwcd_job *j, int rc) {
  const char *detail = nwc_error_detail();
  char msg[NWC_PROTO_MAX_MSG];
  snprintf(msg, sizeof msg, "%s", detail && *detail ? detail : nwc_strerror(rc));
  atomic_fetch_add(&j->d->stats.errors, 1);
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_pw_str(&w, msg);
  send_frame(j, &w, rc, 0, true);
}

typedef struct progress_ctx {
  nwcd_job *j;
  uint64_t last_ns;
} progress_ctx;

static void send_progress(progress_ctx *p, uint64_t done, uint64_t total, bool force) {
  uint64_t now = nwcd_now_ns();
  if (!force && now - p->last_ns < 50000000) return;
  p->last_ns = now;
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_put_progress(&w, done, total);
  send_frame(p->j, &w, 0, NWC_PF_EVENT, false);
}

static int import_progress(void *ctx, uint64_t done, uint64_t total) {
  send_progress(ctx, done, total, done == total);
  return 0;
}

/* A load's progress inside one tensor (chunks checked, from the loader) as bytes of the whole
 * request: base is what the tensors before it took. */
typedef struct load_progress {
  progress_ctx *pc;
  uint64_t base, total;
} load_progress;

static void on_load_progress(void *ctx, uint64_t done, uint64_t len) {
  load_progress *lp = ctx;
  (void)len;
  send_progress(lp->pc, lp->base + done, lp->total, false);
}

/* ---- catalog ------------------------------------------------------------------------------ */

static void fill_tensor(nwcd *d, const nwc_tensor_info *ti, nwc_proto_tensor *t) {
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", ti->name);
  t->ndim = (uint8_t)(ti->ndim > 8 ? 8 : ti->ndim);
  memcpy(t->shape, ti->shape, sizeof t->shape);
  snprintf(t->dtype, sizeof t->dtype, "%s", ti->dtype);
  t->elem = ti->elem, t->rows = ti->rows, t->cols = ti->cols;
  t->raw_bytes = ti->raw_bytes, t->nwc_bytes = ti->length;
  nwcd_res_describe(d->res, ti->model, ti->name, t);
}

static int op_models(nwcd_job *j) {
  nwcd *d = j->d;
  nwc_model_info *m = NULL;
  size_t n = 0;
  pthread_mutex_lock(&d->store_lock);
  int rc = nwc_store_models(d->store, &m, &n);
  pthread_mutex_unlock(&d->store_lock);
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
  reply(j, &w);
  return 0;
}

static int model_tensors(nwcd *d, const char *model, nwc_tensor_info **ti, size_t *n) {
  pthread_mutex_lock(&d->store_lock);
  int rc = nwc_store_tensors(d->store, model, ti, n);
  pthread_mutex_unlock(&d->store_lock);
  NWC_RETURN_IF(rc == -ENOENT, -ENOENT, "no model '%s' in the store", model);
  return rc;
}

static int op_tensors(nwcd_job *j) {
  nwc_tensor_info *ti = NULL;
  size_t n = 0;
  NWC_TRY(model_tensors(j->d, j->req.model, &ti, &n));
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_pw_u32(&w, (uint32_t)n);
  nwc_proto_tensor t;
  for (size_t i = 0; i < n; i++) fill_tensor(j->d, &ti[i], &t), nwc_proto_put_tensor(&w, &t);
  nwc_tensor_info_free(ti, n);
  reply(j, &w);
  return 0;
}

static int op_info(nwcd_job *j) {
  nwcd *d = j->d;
  nwc_tensor_info *ti = NULL;
  pthread_mutex_lock(&d->store_lock);
  int rc = nwc_store_tensor(d->store, j->req.model, j->req.tensor, &ti);
  pthread_mutex_unlock(&d->store_lock);
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
  reply(j, &w);
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

/* import and import2.  import (op 6) is all or nothing, as it always was: its clients cannot
 * hear which tensors were left out.  import2 skips them unless its flags say strict, and lists
 * them after the result. */
static int op_import(nwcd_job *j) {
  nwcd *d = j->d;
  nwc_proto_req *r = &j->req;
  NWC_RETURN_IF(!nwc_model_name_valid(r->model), -EINVAL,
                "'%s' is not a valid model name ([A-Za-z0-9][A-Za-z0-9._-]{0,127})", r->model);
  NWC_RETURN_IF(r->elem > NWC_ELEM_FP8, -EINVAL, "unknown element type %u", r->elem);
  nwc_import_file files[NWC_PROTO_MAX_FILES];
  for (uint32_t i = 0; i < r->nfiles; i++)
    files[i] = (nwc_import_file){r->files[i], j->fds[r->has_index + i]};
  progress_ctx pc = {j, 0};
  skipped_list sk = {0};
  unsigned strict = r->op == NWC_OP_IMPORT || (r->import_flags & NWC_IMPORT_STRICT);
  nwc_import_opts o = {r->elem, r->layout, d->cfg.threads, import_progress, &pc,
                       strict, on_skipped, &sk};
  uint64_t t0 = nwcd_now_ns();
  /* Not under d->store_lock: the store serializes its own catalog access and holds none of it
   * while encoding, so requests on other models go on during an import; two imports of one
   * name both encode and the second to publish gets -EEXIST (and removes its container). */
  int rc = nwc_store_import_fds(d->store, r->model, r->has_index ? j->fds[0] : -1, files,
                                r->nfiles, &o);
  nwc_model_info *m = NULL;
  if (rc == 0) {
    pthread_mutex_lock(&d->store_lock);
    rc = nwc_store_model(d->store, r->model, &m);
    pthread_mutex_unlock(&d->store_lock);
  }
  if (rc < 0) {
    free(sk.v);
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
  reply(j, &w);
  return 0;
}

static int op_remove(nwcd_job *j) {
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
  reply(j, &w);
  return 0;
}

/* Loads of a model run in NWCD_LOAD_LANES parallel lanes (NWCD_GPU_LOAD_LANES onto a device,
 * where the backend has as many staging rings: nwcd.h), each lane taking the next tensor, the
 * largest first; the request's own worker is one of them and alone sends progress.  The lanes
 * form a crew (crew.c): a lane with no tensor left takes parts of the others' last ones, so that
 * the lanes end together.  Into host memory each lane writes its tensor's fresh memfd through
 * its worker's staging ring (making pages costs more than the read itself, and the lanes make
 * them in parallel, on as many cores as they run on), a helper its part into the same memfd. */

typedef struct lanes_ctx {
  nwcd *d;
  const nwc_proto_req *r;
  const nwc_tensor_info *ti;
  size_t n;
  unsigned flags;
  pthread_t owner;
  nwcd_crew *crew; /* NULL without memory for one: no help */
  progress_ctx *pc;
  pthread_mutex_t lock;
  size_t next;
  uint64_t done, total;
  nwc_proto_result res;
  nwcd_load_info sum; /* the lanes' loads added up: their time in acquire (micros), its split */
  uint64_t t0, last_start, first_end, last_end; /* when the lanes started and ended (ns) */
  uint64_t devices; /* bit n: a tensor of the model is on cuda:n (its copies to settle) */
  int rc;
  char msg[NWC_PROTO_MAX_MSG];
} lanes_ctx;

/* Largest first (qsort): the lanes end together when the last tensors taken are the small ones. */
static int larger_first(const void *a, const void *b) {
  uint64_t x = ((const nwc_tensor_info *)a)->length, y = ((const nwc_tensor_info *)b)->length;
  return x < y ? 1 : x > y ? -1 : 0;
}

static void load_lane(void *ctx, uint64_t lane) {
  (void)lane;
  lanes_ctx *c = ctx;
  uint64_t start = nwcd_now_ns() - c->t0;
  nwcd_crew_join(c->crew);
  for (;;) {
    pthread_mutex_lock(&c->lock);
    size_t i = c->rc == 0 && c->next < c->n ? c->next++ : c->n;
    pthread_mutex_unlock(&c->lock);
    if (i == c->n) break;
    nwcd_ref ref;
    nwcd_load_info li;
    uint64_t t0 = nwcd_now_ns();
    int rc = nwcd_res_acquire(c->d->res, c->r->model, c->ti[i].name, c->flags, &ref, &li);
    uint64_t ns = nwcd_now_ns() - t0;
    pthread_mutex_lock(&c->lock);
    c->sum.micros += ns / 1000;
    nwcd_load_info_add(&c->sum, &li);
    if (rc < 0 && c->rc == 0) {
      c->rc = rc;
      snprintf(c->msg, sizeof c->msg, "%s", nwc_error_detail());
    } else if (rc == 0) {
      if (ref.loc >= 0) c->devices |= UINT64_C(1) << ref.loc;
      c->res.tensors++, c->res.bytes += c->ti[i].length;
      if (li.direct) c->res.direct++;
      else c->res.buffered++;
    }
    c->done += c->ti[i].length;
    if (pthread_equal(pthread_self(), c->owner)) send_progress(c->pc, c->done, c->total, false);
    pthread_mutex_unlock(&c->lock);
  }
  nwcd_crew_join(NULL);
  nwcd_load_info help = {0};
  uint64_t t0 = nwcd_now_ns();
  if (c->crew) nwcd_crew_help(c->crew, &help);
  uint64_t end = nwcd_now_ns();
  pthread_mutex_lock(&c->lock);
  c->sum.micros += (end - t0) / 1000;
  nwcd_load_info_add(&c->sum, &help);
  end -= c->t0;
  if (start > c->last_start) c->last_start = start;
  if (!c->first_end || end < c->first_end) c->first_end = end;
  if (end > c->last_end) c->last_end = end;
  pthread_mutex_unlock(&c->lock);
}

/* load, evict, pin, unpin: one tensor, or every tensor of the model when tensor is "";
 * load_on is load or pin onto the place it names. */
static int op_residency(nwcd_job *j) {
  nwcd *d = j->d;
  nwc_proto_req *r = &j->req;
  int op = r->op == NWC_OP_LOAD_ON ? (r->pin ? NWC_OP_PIN : NWC_OP_LOAD) : r->op;
  int loc = r->op == NWC_OP_LOAD_ON ? r->device : NWCD_LOC_DEFAULT; /* the wire checks >= -1 */
  if (loc >= d->backend->ndevices) return nwcd_no_device(d->backend, loc);
  nwc_tensor_info *ti = NULL;
  size_t n = 0;
  if (r->tensor[0]) {
    pthread_mutex_lock(&d->store_lock);
    int rc = nwc_store_tensor(d->store, r->model, r->tensor, &ti);
    pthread_mutex_unlock(&d->store_lock);
    NWC_RETURN_IF(rc == -ENOENT, -ENOENT, "no tensor %s/%s in the store", r->model, r->tensor);
    if (rc < 0) return rc;
    n = 1;
  } else {
    NWC_TRY(model_tensors(d, r->model, &ti, &n));
  }
  uint64_t total = 0, done = 0;
  for (size_t i = 0; i < n; i++) total += ti[i].length;
  char where[16];
  uint64_t budget = nwcd_res_budget(d->res, loc, where);
  if ((op == NWC_OP_LOAD || op == NWC_OP_PIN) && total > budget) {
    nwc_tensor_info_free(ti, n);
    char need[16], have[16];
    return nwc__fail(-ENOSPC, "%s%s%s needs %s (%llu bytes), more than the memory budget of %s "
                     "(%s); raise --budget / --gpu-budget or load single tensors", r->model,
                     r->tensor[0] ? "/" : "", r->tensor, nwc_size_text(total, need),
                     (unsigned long long)total, where, nwc_size_text(budget, have));
  }
  nwc_proto_result res = {0};
  uint64_t t0 = nwcd_now_ns();
  progress_ctx pc = {j, 0};
  int rc = 0;
  unsigned fl = (op == NWC_OP_PIN ? NWCD_ACQ_PIN : NWCD_ACQ_NOREF) | NWCD_ACQ_AT(loc);
  bool laned = (op == NWC_OP_LOAD || op == NWC_OP_PIN) && n > 1;
  uint64_t parts = 0, helped = 0; /* taken by lanes that ran out of tensors (crew.c) */
  if (laned) {
    lanes_ctx lc = {.d = d, .r = r, .ti = ti, .n = n, .flags = fl, .owner = pthread_self(),
                    .pc = &pc, .total = total, .t0 = nwcd_now_ns()};
    pthread_mutex_init(&lc.lock, NULL);
    bool gpu = loc >= 0 || (loc == NWCD_LOC_DEFAULT && d->backend->ndevices > 0);
    size_t lanes = gpu ? NWCD_GPU_LOAD_LANES : NWCD_LOAD_LANES;
    if (n < lanes) lanes = n;
    qsort(ti, n, sizeof *ti, larger_first);
    lc.crew = nwcd_crew_new(NWCD_CREW_PART);
    nwcd_pool_parallel(d->pool, lanes, load_lane, &lc);
    uint64_t done_ns = nwcd_now_ns();
    /* The lanes' last copies: the model is there when told.  Only the devices its tensors are
     * on (a load naming no place puts each at its home, which may be any GPU), so that it does
     * not wait for other devices' loads. */
    for (int dv = 0; d->backend->dev_settle && dv < d->backend->ndevices; dv++) {
      if (!(lc.devices >> dv & 1)) continue;
      int src = d->backend->dev_settle(dv);
      if (src < 0 && lc.rc == 0) { /* a CUDA error, which sticks: later uses fail too */
        lc.rc = src;
        snprintf(lc.msg, sizeof lc.msg, "%s", nwc_error_detail());
        nwcd_log(NWCD_LOG_ERR, "load %s: %s", r->model, lc.msg);
      }
    }
    uint64_t settled_ns = nwcd_now_ns();
    if (lc.crew) nwcd_crew_taken(lc.crew, &parts, &helped);
    nwcd_crew_free(lc.crew);
    pthread_mutex_destroy(&lc.lock);
    res = lc.res, rc = lc.rc;
    const nwcd_load_info *s = &lc.sum;
    double per = 1e-6 / (double)lanes; /* ns summed over the lanes -> ms per lane */
    nwcd_log(NWCD_LOG_DEBUG, "load %s: per lane (%zu) %.2f ms = reads %.2f + checks %.2f + sink "
             "%.2f + drain %.2f + allocating %.2f + the rest (opening, residency) %.2f",
             r->model, lanes, s->micros * 1e3 * per, s->wait_ns * per, s->check_ns * per,
             s->sink_ns * per, s->drain_ns * per, s->alloc_ns * per,
             (s->micros * 1e3 - (double)(s->wait_ns + s->check_ns + s->sink_ns + s->drain_ns +
                                         s->alloc_ns)) * per);
    nwcd_log(NWCD_LOG_DEBUG, "load %s: the last lane started at %.2f ms, lanes ended at %.2f to "
             "%.2f ms, the lanes' region returned at %.2f ms, their copies done at %.2f ms",
             r->model, lc.last_start / 1e6, lc.first_end / 1e6, lc.last_end / 1e6,
             (done_ns - lc.t0) / 1e6, (settled_ns - lc.t0) / 1e6);
    if (rc < 0) nwc__fail(rc, "%s", lc.msg);
    else send_progress(&pc, total, total, true);
  }
  for (size_t i = 0; !laned && i < n && rc == 0; i++) {
    const char *tn = ti[i].name;
    if (op == NWC_OP_LOAD || op == NWC_OP_PIN) {
      nwcd_ref ref;
      nwcd_load_info li;
      load_progress lp = {&pc, done, total};
      nwcd_load_observe(on_load_progress, &lp);
      rc = nwcd_res_acquire(d->res, r->model, tn, fl, &ref, &li);
      nwcd_load_observe(NULL, NULL);
      if (rc == 0) {
        res.tensors++, res.bytes += ti[i].length;
        if (li.direct) res.direct++;
        else res.buffered++;
      }
    } else if (op == NWC_OP_EVICT) {
      uint64_t b = 0;
      rc = nwcd_res_evict(d->res, r->model, tn, &b);
      if (rc == -EBUSY && n > 1) rc = 0, res.skipped++;
      else if (rc == 0 && b) res.tensors++, res.bytes += b;
    } else {
      if (nwcd_res_unpin(d->res, r->model, tn)) res.tensors++, res.bytes += ti[i].length;
    }
    done += ti[i].length;
    if (op == NWC_OP_LOAD || op == NWC_OP_PIN) send_progress(&pc, done, total, i + 1 == n);
  }
  nwc_tensor_info_free(ti, n);
  if (rc < 0) return rc;
  res.micros = (nwcd_now_ns() - t0) / 1000;
  if (op == NWC_OP_LOAD) /* td_helped_parts (tests) reads "GB/s; N parts" */
    nwcd_log(NWCD_LOG_INFO, "load %s%s%s: %llu tensors, %llu bytes in %.3f s (%.2f GB/s; %llu parts, "
             "%.1f MB, by lanes that had run out of tensors)", r->model, r->tensor[0] ? "/" : "",
             r->tensor, (unsigned long long)res.tensors, (unsigned long long)res.bytes,
             res.micros / 1e6, res.micros ? res.bytes / (res.micros * 1e3) : 0.0,
             (unsigned long long)parts, helped / 1e6);
  else if (op == NWC_OP_EVICT)
    nwcd_log(NWCD_LOG_INFO, "evict %s%s%s: %llu tensors, %llu bytes in %.3f s", r->model,
             r->tensor[0] ? "/" : "", r->tensor, (unsigned long long)res.tensors,
             (unsigned long long)res.bytes, res.micros / 1e6);
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_put_result(&w, &res);
  reply(j, &w);
  return 0;
}

/* ---- compute ------------------------------------------------------------------------------ */

/* Where the output of bytes goes: inline (reserved in w after the compute header) or the shared
 * region; checks the request's offsets against the region's size. */
static int out_place(nwcd_job *j, uint64_t bytes, nwc_pw *w, nwc_proto_compute *c, void **dst) {
  const nwc_proto_req *r = &j->req;
  c->bytes = bytes, c->where = r->where, c->out = r->out;
  if (r->where == NWC_WHERE_SHM) {
    NWC_RETURN_IF(!j->shm, -EINVAL, "no shared region: pass one (shm) before using it");
    NWC_RETURN_IF(r->out_off > j->shm_size || bytes > j->shm_size - r->out_off, -EINVAL,
                  "output of %llu bytes at offset %llu overruns the shared region of %llu bytes",
                  (unsigned long long)bytes, (unsigned long long)r->out_off,
                  (unsigned long long)j->shm_size);
    NWC_RETURN_IF(bytes > r->out_cap, -EINVAL,
                  "output of %llu bytes does not fit the %llu bytes the request offers",
                  (unsigned long long)bytes, (unsigned long long)r->out_cap);
    nwc_proto_put_compute(w, c);
    *dst = j->shm + r->out_off;
    return 0;
  }
  NWC_RETURN_IF(bytes > NWC_PROTO_MAX_PAYLOAD - 64, -EMSGSIZE,
                "output of %llu bytes is larger than a frame (%u); use a shared region",
                (unsigned long long)bytes, NWC_PROTO_MAX_PAYLOAD);
  nwc_proto_put_compute(w, c);
  *dst = nwc_pw_reserve(w, bytes);
  NWC_RETURN_IF(!*dst, -ENOMEM, "no memory for %llu bytes of output", (unsigned long long)bytes);
  return 0;
}

/* Copies n rows of K16-strided BF16 into dst as dense rows of K, BF16 or fp32. */
static void emit_rows(const uint16_t *src, uint64_t n, uint64_t K, uint64_t K16, int out, void *dst) {
  for (uint64_t i = 0; i < n; i++) {
    const uint16_t *s = src + i * K16;
    if (out == NWC_OUT_BF16) {
      memcpy((uint8_t *)dst + i * K * 2, s, K * 2);
    } else {
      float *f = (float *)((uint8_t *)dst + i * K * 4);
      for (uint64_t k = 0; k < K; k++) {
        float v = nwc_bf16_to_f32(s[k]);
        memcpy(&f[k], &v, 4);
      }
    }
  }
}

static uint64_t k16_of(uint64_t K) { return (K + 15) & ~UINT64_C(15); }

typedef struct dq_ctx {
  nwcd *d;
  const nwc_tensor *t;
  uint64_t br, nrb, parts, K, K16;
  int out;
  uint16_t *dec; /* decode target, row stride K16 */
  void *dst;     /* final output, dense */
  bool direct;   /* dec is dst */
  atomic_int rc;
} dq_ctx;

/* Part i of a dequant: its row blocks decoded, then (unless direct) compacted into dst. */
static void dq_part(void *ctx, uint64_t i) {
  dq_ctx *c = ctx;
  uint64_t rb0 = c->nrb * i / c->parts, rb1 = c->nrb * (i + 1) / c->parts;
  if (rb0 == rb1) return;
  uint64_t M = c->t->rows, r0 = rb0 * c->br, r1 = rb1 * c->br < M ? rb1 * c->br : M;
  int rc = c->d->backend->dequant(c->t, rb0, rb1, c->dec + r0 * c->K16);
  if (rc < 0) {
    int zero = 0;
    atomic_compare_exchange_strong(&c->rc, &zero, rc);
    return;
  }
  if (!c->direct)
    emit_rows(c->dec + r0 * c->K16, r1 - r0, c->K, c->K16, c->out,
              (uint8_t *)c->dst + r0 * c->K * (c->out == NWC_OUT_BF16 ? 2 : 4));
}

static int op_dequant_gather(nwcd_job *j) {
  nwcd *d = j->d;
  nwc_proto_req *r = &j->req;
  nwcd_ref ref;
  NWC_TRY(nwcd_res_acquire(d->res, r->model, r->tensor, NWCD_ACQ_MAP_OK, &ref, NULL));
  const nwc_tensor *t = &ref.view;
  uint64_t M = t->rows, K = t->cols, K16 = k16_of(K);
  uint64_t n = r->op == NWC_OP_GATHER ? r->nrows : M;
  uint64_t *rows = NULL;
  uint16_t *tmp = NULL;
  int rc = 0;
  if (r->op == NWC_OP_GATHER) {
    rows = malloc(n * sizeof *rows);
    if (!rows) rc = -ENOMEM;
    for (uint64_t i = 0; rc == 0 && i < n; i++) {
      memcpy(&rows[i], r->rows + 8 * i, 8);
      if (rows[i] >= M)
        rc = nwc__fail(-EINVAL, "row %llu of %s/%s is out of range (%llu rows)",
                       (unsigned long long)rows[i], r->model, r->tensor, (unsigned long long)M);
    }
  }
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_compute c = {.rows = n, .cols = K, .rflags = ref.map ? NWC_RF_MAPPED : 0};
  void *dst = NULL;
  if (rc == 0) rc = out_place(j, n * K * (r->out == NWC_OUT_BF16 ? 2 : 4), &w, &c, &dst);
  bool direct = rc == 0 && r->op == NWC_OP_DEQUANT && r->out == NWC_OUT_BF16 && K16 == K &&
                ((uintptr_t)dst & 1) == 0;
  if (rc == 0 && !direct && !(tmp = malloc(n * K16 * 2 + 64))) rc = -ENOMEM;
  if (rc == 0 && r->op == NWC_OP_GATHER) {
    rc = ref.dcopy ? d->backend->dev_gather(ref.dcopy, rows, n, tmp)
                   : d->backend->gather(t, rows, n, tmp);
    if (rc == 0) emit_rows(tmp, n, K, K16, r->out, dst);
  } else if (rc == 0 && ref.dcopy) { /* one kernel for the whole tensor */
    rc = d->backend->dev_dequant(ref.dcopy, direct ? (uint16_t *)dst : tmp);
    if (rc == 0 && !direct) emit_rows(tmp, n, K, K16, r->out, dst);
  } else if (rc == 0) {
    /* Dequant: row-block ranges spread over the workers (parallel region). */
    uint64_t br = NWC_LAYOUT_BLOCK_ROWS(t->elem), nrb = (M + br - 1) / br;
    uint64_t parts = M * K16 >= (UINT64_C(1) << 20) ? 4 * (uint64_t)d->cfg.threads : 1;
    if (parts > nrb) parts = nrb;
    dq_ctx dc = {d, t, br, nrb, parts, K, K16, r->out, direct ? (uint16_t *)dst : tmp, dst, direct, 0};
    nwcd_pool_parallel(d->pool, parts, dq_part, &dc);
    rc = atomic_load(&dc.rc);
  }
  free(tmp), free(rows);
  nwcd_res_release(d->res, &ref);
  if (rc < 0) {
    nwc_pw_free(&w);
    return rc;
  }
  reply(j, &w);
  return 0;
}

bool nwcd_ops_can_batch(const nwcd_job *a, unsigned cols, const nwcd_job *b) {
  const nwc_proto_req *x = &a->req, *y = &b->req;
  return y->op == NWC_OP_MATVEC && cols + y->ncols <= 8 && x->out == y->out &&
         x->scale == y->scale && !strcmp(x->model, y->model) && !strcmp(x->tensor, y->tensor) &&
         !strcmp(x->bias, y->bias);
}

/* -EINVAL unless r's x is ncols columns of the tensor's K floats. */
static int check_x(const nwc_proto_req *r, uint64_t K) {
  NWC_RETURN_IF(r->x_bytes != (uint64_t)r->ncols * K * 4, -EINVAL,
                "matvec %s/%s takes K = %llu floats per column: x of %llu bytes is not %u "
                "column%s of them (%llu bytes)", r->model, r->tensor, (unsigned long long)K,
                (unsigned long long)r->x_bytes, r->ncols, r->ncols == 1 ? "" : "s",
                (unsigned long long)r->ncols * K * 4);
  return 0;
}

/* Where the x of job j (ncols dense columns of K floats) is: inline or in the shared region;
 * checks its size and the region's bounds. */
static int matvec_src(const nwcd_job *j, uint64_t K, const uint8_t **out) {
  const nwc_proto_req *r = &j->req;
  NWC_TRY(check_x(r, K));
  const uint8_t *src = r->x;
  if (r->where == NWC_WHERE_SHM) {
    NWC_RETURN_IF(!j->shm, -EINVAL, "no shared region: pass one (shm) before using it");
    NWC_RETURN_IF(r->in_off > j->shm_size || r->x_bytes > j->shm_size - r->in_off, -EINVAL,
                  "x of %llu bytes at offset %llu overruns the shared region of %llu bytes",
                  (unsigned long long)r->x_bytes, (unsigned long long)r->in_off,
                  (unsigned long long)j->shm_size);
    src = j->shm + r->in_off;
  }
  *out = src;
  return 0;
}

/* The x of job j copied to X (column stride K16, padding left 0). */
static int matvec_input(nwcd_job *j, uint64_t K, uint64_t K16, float *X) {
  const uint8_t *src;
  NWC_TRY(matvec_src(j, K, &src));
  for (uint32_t c = 0; c < j->req.ncols; c++) memcpy(X + c * K16, src + c * K * 4, K * 4);
  return 0;
}

/* n values of y = scale * src + bias (bias: M values, or NULL) into dst as float or BF16 (esz 4
 * or 2); dst may be src (float, in place). */
static void emit_y(const float *src, size_t n, uint64_t M, float scale, const float *bias,
                   uint64_t esz, void *dst) {
  if (esz == 4 && scale == 1.0f && !bias) {
    if (dst != src) memcpy(dst, src, n * 4);
  } else if (esz == 4) {
    for (size_t k = 0; k < n; k++) {
      float v = scale * src[k] + (bias ? bias[k % M] : 0.0f);
      memcpy((uint8_t *)dst + 4 * k, &v, 4);
    }
  } else {
    for (size_t k = 0; k < n; k++) {
      uint16_t h = nwc_f32_to_bf16(scale * src[k] + (bias ? bias[k % M] : 0.0f));
      memcpy((uint8_t *)dst + 2 * k, &h, 2);
    }
  }
}

/* The part of a connection's shared region that the backend registers with the GPU (once per
 * connection): matvecs whose x and y lie inside it go straight between it and the device. */
#define SHARED_WINDOW (4u << 20)

/* A lone matvec on a GPU tensor whose x and y (float) are in j's shared region, inside its
 * window: the backend copies x from the region to the device and the kernels write y into it,
 * with no host copy; scale and bias are applied to y in place.  Returns 0 after the reply, a
 * negative errno (the caller replies), or 1 when the request does not qualify or the backend
 * cannot register the region (the copying path runs it). */
static int matvec_shared(nwcd_job *j, const nwcd_ref *ref, const float *bias) {
  nwcd *d = j->d;
  const nwc_proto_req *r = &j->req;
  const uint64_t M = ref->view.rows, K = ref->view.cols, win =
      j->shm_size < SHARED_WINDOW ? j->shm_size : SHARED_WINDOW;
  if (!ref->dcopy || !d->backend->dev_matvec_shared || r->where != NWC_WHERE_SHM ||
      r->out != NWC_OUT_F32 || r->out_off % 4)
    return 1;
  const uint8_t *src;
  NWC_TRY(matvec_src(j, K, &src));
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_compute c = {.rows = r->ncols, .cols = M, .rflags = NWC_RF_SHARED};
  size_t n = (size_t)r->ncols * M;
  void *dst = NULL;
  int rc = out_place(j, n * 4, &w, &c, &dst); /* checks the region's bounds and out_cap */
  if (rc == 0 && (r->in_off + r->x_bytes > win || r->out_off + n * 4 > win)) rc = 1;
  if (rc == 0)
    rc = d->backend->dev_matvec_shared(j->conn, j->shm, win, ref->dcopy, r->in_off, r->ncols,
                                       r->out_off);
  if (rc == -EAGAIN) rc = 1;
  if (rc != 0) {
    nwc_pw_free(&w);
    return rc;
  }
  emit_y(dst, n, M, r->scale, bias, 4, dst);
  reply(j, &w);
  return 0;
}

static int bias_vector(nwcd *d, const nwc_proto_req *r, uint64_t M, float **out) {
  *out = NULL;
  if (!r->bias[0]) return 0;
  nwcd_ref ref;
  NWC_TRY(nwcd_res_acquire(d->res, r->model, r->bias, NWCD_ACQ_MAP_OK, &ref, NULL));
  const nwc_tensor *t = &ref.view;
  int rc = 0;
  uint16_t *tmp = NULL;
  float *b = NULL;
  if (t->rows * t->cols != M)
    rc = nwc__fail(-EINVAL, "bias %s/%s has %llu values, the matvec has %llu rows", r->model,
                   r->bias, (unsigned long long)(t->rows * t->cols), (unsigned long long)M);
  uint64_t K16 = k16_of(t->cols);
  const float *scale = t->scale; /* a device copy's stay on the device: fetched here */
  float *dscale = NULL;
  if (rc == 0 && (!(tmp = malloc(t->rows * K16 * 2 + 64)) || !(b = malloc(M * sizeof *b))))
    rc = -ENOMEM;
  if (rc == 0 && ref.dcopy) {
    rc = d->backend->dev_dequant(ref.dcopy, tmp);
    if (rc == 0 && ref.ti->off_scale)
      rc = (dscale = malloc(t->rows * sizeof *dscale)) ? d->backend->dev_scales(ref.dcopy, dscale)
                                                       : -ENOMEM;
    scale = dscale;
  } else if (rc == 0) {
    uint64_t br = NWC_LAYOUT_BLOCK_ROWS(t->elem);
    rc = d->backend->dequant(t, 0, (t->rows + br - 1) / br, tmp);
  }
  if (rc == 0) {
    float s = 1;
    for (uint64_t i = 0; i < t->rows; i++)
      for (uint64_t k = 0; k < t->cols; k++) {
        if (scale) s = scale[i];
        b[i * t->cols + k] = s * nwc_bf16_to_f32(tmp[i * K16 + k]);
      }
  }
  free(tmp), free(dscale);
  nwcd_res_release(d->res, &ref);
  if (rc < 0) free(b);
  else *out = b;
  return rc;
}

/* The copying pass: the jobs' x copied into one block, one backend matvec per 8 columns, each
 * job's y written into its reply (inline or its shared region) with scale and bias. */
static void matvec_pass(nwcd *d, nwcd_job *const *jobs, unsigned nj, const nwcd_ref *ref,
                        const float *bias) {
  const nwc_tensor *t = &ref->view;
  const uint64_t M = t->rows, K = t->cols, K16 = k16_of(K);
  const float scale = jobs[0]->req.scale;
  unsigned total = 0;
  for (unsigned i = 0; i < nj; i++) total += jobs[i]->req.ncols;
  float *X = calloc((size_t)total * K16 + 16, 4);
  float *Y = malloc((size_t)total * M * 4 + 64);
  if (!X || !Y) {
    for (unsigned i = 0; i < nj; i++) reply_error(jobs[i], -ENOMEM);
    free(X), free(Y);
    return;
  }
  /* Validate each job's input; the failures get their error and leave the pass. */
  int jrc[8], rc = 0;
  unsigned col0[8], cols = 0;
  for (unsigned i = 0; i < nj; i++) {
    col0[i] = cols;
    jrc[i] = matvec_input(jobs[i], K, K16, X + (size_t)cols * K16);
    if (jrc[i] < 0) reply_error(jobs[i], jrc[i]);
    else cols += jobs[i]->req.ncols;
  }
  for (unsigned c = 0; rc == 0 && c < cols; c += 8) {
    unsigned nc = cols - c < 8 ? cols - c : 8;
    rc = ref->dcopy ? d->backend->dev_matvec(ref->dcopy, X + (size_t)c * K16, nc, K16,
                                             Y + (size_t)c * M, M)
                    : d->backend->matvec(t, X + (size_t)c * K16, nc, K16, NULL, Y + (size_t)c * M, M);
  }
  if (nj > 1 && cols) {
    atomic_fetch_add(&d->stats.batched_passes, 1);
    atomic_fetch_add(&d->stats.batched_columns, cols);
  }
  for (unsigned i = 0; i < nj; i++) {
    if (jrc[i] < 0) continue;
    nwcd_job *b = jobs[i];
    if (rc < 0) {
      reply_error(b, rc);
      continue;
    }
    nwc_pw w;
    nwc_pw_init(&w);
    nwc_proto_compute c = {.rows = b->req.ncols, .cols = M,
                           .rflags = (ref->map ? NWC_RF_MAPPED : 0) | (nj > 1 ? NWC_RF_BATCHED : 0)};
    void *dst = NULL;
    uint64_t esz = b->req.out == NWC_OUT_BF16 ? 2 : 4;
    int prc = out_place(b, (uint64_t)b->req.ncols * M * esz, &w, &c, &dst);
    if (prc < 0) {
      nwc_pw_free(&w);
      reply_error(b, prc);
      continue;
    }
    /* scale and bias applied as the reply is written (one pass over the columns) */
    emit_y(Y + (size_t)col0[i] * M, (size_t)b->req.ncols * M, M, scale, bias, esz, dst);
    reply(b, &w);
  }
  free(X), free(Y);
}

/* Runs j and the jobs chained on j->batch in one pass (a lone one through its shared region
 * where it can); each gets its own reply (which frees that job: nothing of j is read after its
 * reply). */
static void op_matvec(nwcd_job *j) {
  nwcd *d = j->d;
  nwc_proto_req *r = &j->req;
  nwcd_job *jobs[8];
  unsigned nj = 0;
  for (nwcd_job *b = j; b && nj < 8; b = b->batch) jobs[nj++] = b;
  nwcd_ref ref;
  int rc = nwcd_res_acquire(d->res, r->model, r->tensor, NWCD_ACQ_MAP_OK, &ref, NULL);
  if (rc < 0) {
    for (unsigned i = 0; i < nj; i++) reply_error(jobs[i], rc);
    return;
  }
  float *bias = NULL;
  rc = bias_vector(d, r, ref.view.rows, &bias);
  if (rc == 0 && nj == 1) rc = matvec_shared(j, &ref, bias);
  if (rc < 0) {
    for (unsigned i = 0; i < nj; i++) reply_error(jobs[i], rc);
  } else if (nj > 1 || rc == 1) {
    matvec_pass(d, jobs, nj, &ref, bias);
  }
  free(bias);
  nwcd_res_release(d->res, &ref);
}

/* ---- CUDA IPC: compute into the client's device memory ------------------------------------ */

/* matvec_ipc and dequant_ipc: the tensor must live on a device (loaded there if absent). */
static int op_ipc(nwcd_job *j) {
  nwcd *d = j->d;
  nwc_proto_req *r = &j->req;
  NWC_RETURN_IF(!d->backend->dev_matvec_ipc, -EOPNOTSUPP,
                "%s needs the cuda backend (this daemon runs %s)", nwc_proto_op_name(r->op),
                d->backend->name);
  nwcd_ref ref;
  NWC_TRY(nwcd_res_acquire(d->res, r->model, r->tensor, 0, &ref, NULL));
  const nwc_tensor *t = &ref.view;
  uint64_t M = t->rows, K = t->cols, esz = r->out == NWC_OUT_BF16 ? 2 : 4;
  int rc = ref.dcopy ? 0
                     : nwc__fail(-ENOTSUP, "%s/%s is resident in host memory, not on a device: "
                                 "evict it, then load it onto a GPU", r->model, r->tensor);
  float *bias = NULL;
  nwc_proto_compute c = {.out = r->out, .where = NWC_WHERE_DEVICE};
  const uint8_t *ev = r->has_event ? r->ipc_event : NULL;
  nwcd_ipc_buf y = {{0}, r->out_off, r->out_cap};
  memcpy(y.handle, r->ipc_y, sizeof y.handle);
  if (rc == 0 && r->op == NWC_OP_MATVEC_IPC) {
    rc = check_x(r, K);
    if (rc == 0) rc = bias_vector(d, r, M, &bias);
    nwcd_ipc_buf x = {{0}, r->in_off, r->x_bytes};
    memcpy(x.handle, r->ipc_x, sizeof x.handle);
    if (rc == 0)
      rc = d->backend->dev_matvec_ipc(j->conn, ref.dcopy, &x, &y, r->ncols, r->scale, bias,
                                      r->out == NWC_OUT_BF16, ev);
    c.rows = r->ncols, c.cols = M, c.bytes = (uint64_t)r->ncols * M * esz;
  } else if (rc == 0) {
    rc = d->backend->dev_dequant_ipc(j->conn, ref.dcopy, &y, r->out == NWC_OUT_BF16, ev);
    c.rows = M, c.cols = K, c.bytes = M * K * esz;
  }
  free(bias);
  nwcd_res_release(d->res, &ref);
  if (rc < 0) return rc;
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_put_compute(&w, &c);
  reply(j, &w);
  return 0;
}

/* ---- verify, stats, ps, devices -------------------------------------------------------------- */

typedef struct verify_ctx {
  char *lines[32];
  unsigned n;
} verify_ctx;

static void verify_cb(void *ctx, const nwc_verify_problem *p) {
  verify_ctx *v = ctx;
  if (v->n >= 32) return;
  char buf[NWC_PROTO_MAX_MSG];
  snprintf(buf, sizeof buf, "%s/%s: %s (%s at %llu, %llu bytes)", p->model,
           p->tensor ? p->tensor : "-", p->what, p->path, (unsigned long long)p->offset,
           (unsigned long long)p->length);
  v->lines[v->n] = strdup(buf);
  if (v->lines[v->n]) v->n++;
}

static int op_verify(nwcd_job *j) {
  nwcd *d = j->d;
  verify_ctx v = {{0}, 0};
  nwc_verify_stats st = {0};
  uint64_t t0 = nwcd_now_ns();
  pthread_mutex_lock(&d->store_lock);
  int rc = nwc_store_verify(d->store, j->req.model[0] ? j->req.model : NULL, verify_cb, &v, &st);
  pthread_mutex_unlock(&d->store_lock);
  if (rc < 0 && rc != -EBADMSG) {
    for (unsigned i = 0; i < v.n; i++) free(v.lines[i]);
    NWC_RETURN_IF(rc == -ENOENT, -ENOENT, "no model '%s' in the store", j->req.model);
    return rc;
  }
  nwc_proto_result res = {.tensors = st.tensors, .bytes = st.bytes, .skipped = st.models,
                          .chunks = st.chunks, .problems = st.problems,
                          .micros = (nwcd_now_ns() - t0) / 1000};
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_put_result(&w, &res);
  nwc_pw_u32(&w, v.n);
  for (unsigned i = 0; i < v.n; i++) nwc_pw_str(&w, v.lines[i]), free(v.lines[i]);
  reply(j, &w);
  return 0;
}

static int op_stats(nwcd_job *j) {
  nwc_proto_stats s = {0};
  nwcd_server_get_stats(j->d, &s);
  nwcd_res_stats(j->d->res, &s);
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_put_stats(&w, &s);
  reply(j, &w);
  return 0;
}

static int op_ps(nwcd_job *j) {
  nwc_proto_ps *p = NULL;
  size_t n = 0;
  NWC_TRY(nwcd_res_list(j->d->res, &p, &n));
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_pw_u32(&w, (uint32_t)n);
  for (size_t i = 0; i < n; i++) nwc_proto_put_ps(&w, &p[i]);
  free(p);
  reply(j, &w);
  return 0;
}

/* Host memory for devices: MemAvailable and MemTotal of /proc/meminfo (what the kernel says
 * could be had without swapping, page cache included; sysinfo's freeram leaves the cache out),
 * in bytes; both 0 when the file cannot be read. */
static void host_meminfo(uint64_t *free_bytes, uint64_t *total_bytes) {
  *free_bytes = *total_bytes = 0;
  FILE *f = fopen("/proc/meminfo", "re");
  if (!f) return;
  char line[128];
  unsigned long long kib;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "MemTotal: %llu kB", &kib) == 1) *total_bytes = (uint64_t)kib << 10;
    else if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) *free_bytes = (uint64_t)kib << 10;
  }
  fclose(f);
}

/* devices: residency's snapshot of each place, then the memory around it (outside its lock): the
 * host's, and each device's from CUDA with what its copy pool keeps (0 where a call fails). */
static int op_devices(nwcd_job *j) {
  const nwcd_backend *b = j->d->backend;
  nwc_proto_place p[1 + NWCD_MAX_DEVICES];
  int n = nwcd_res_places(j->d->res, p);
  host_meminfo(&p[0].mem_free, &p[0].mem_total);
  for (int dev = 0; dev + 1 < n; dev++) {
    nwc_proto_place *d = &p[dev + 1];
    if (b->dev_meminfo(dev, &d->mem_free, &d->mem_total) < 0) d->mem_free = d->mem_total = 0;
    if (b->dev_pool_idle(dev, &d->pool_idle) < 0) d->pool_idle = 0;
  }
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_pw_u32(&w, (uint32_t)n);
  for (int i = 0; i < n; i++) nwc_proto_put_place(&w, &p[i]);
  reply(j, &w);
  return 0;
}

/* map: the memfd goes over the socket the request passed (residency.c), the decoder parameters
 * in the reply. */
static int op_map(nwcd_job *j) {
  nwc_proto_map m;
  NWC_TRY(nwcd_res_map(j->d->res, j->req.model, j->req.tensor, j->fds[0], j->req.id, &m));
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_put_map(&w, &m);
  reply(j, &w);
  return 0;
}

void nwcd_ops_run(nwcd_job *j) {
  int rc;
  switch (j->req.op) {
    case NWC_OP_MODELS: rc = op_models(j); break;
    case NWC_OP_TENSORS: rc = op_tensors(j); break;
    case NWC_OP_INFO: rc = op_info(j); break;
    case NWC_OP_IMPORT:
    case NWC_OP_IMPORT2: rc = op_import(j); break;
    case NWC_OP_REMOVE: rc = op_remove(j); break;
    case NWC_OP_LOAD:
    case NWC_OP_EVICT:
    case NWC_OP_PIN:
    case NWC_OP_UNPIN:
    case NWC_OP_LOAD_ON: rc = op_residency(j); break;
    case NWC_OP_DEQUANT:
    case NWC_OP_GATHER: rc = op_dequant_gather(j); break;
    case NWC_OP_MATVEC: op_matvec(j); return;
    case NWC_OP_MATVEC_IPC:
    case NWC_OP_DEQUANT_IPC: rc = op_ipc(j); break;
    case NWC_OP_VERIFY: rc = op_verify(j); break;
    case NWC_OP_STATS: rc = op_stats(j); break;
    case NWC_OP_PS: rc = op_ps(j); break;
    case NWC_OP_DEVICES: rc = op_devices(j); break;
    case NWC_OP_MAP: rc = op_map(j); break;
    default: rc = nwc__fail(-EOPNOTSUPP, "opcode %u is not served here", j->req.op); break;
  }
  if (rc < 0) reply_error(j, rc);
}

void nwcd_job_free(nwcd_job *j) {
  if (!j) return;
  for (unsigned i = 0; i < j->nfds; i++) close(j->fds[i]);
  nwc_proto_req_clear(&j->req);
  free(j->payload);
  free(j);
}
