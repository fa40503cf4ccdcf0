/*
 * ops_load.c - load, load_on, evict, pin and unpin, of one tensor or of a whole model.  A model
 * loads in lanes (NWCD_LOAD_LANES, NWCD_GPU_LOAD_LANES) on the pool's workers, largest tensors
 * first, the lanes helping each other through a crew (crew.h) at the end; progress events
 * count the bytes checked so far.  load_places names several places in a mask: the lanes take
 * each tensor once and load its replicas there from one read (nwcd_res_acquire_places); with one
 * place named it is load_on there.  load_places with NWC_LOAD_SPLIT puts each tensor at ONE of
 * the places: nwcd_res_split_plan decides where and reserves the bytes, under the residency lock,
 * before anything loads (a tensor that fits nowhere fails the request, nothing done), and the
 * lanes then load each tensor at its place.  The policy, "fill in order within the budgets":
 * the places in order cuda:0, cuda:1, ... and host memory last (the overflow); the tensors in
 * natural name order (strverscmp: layers.2 before layers.10, so layers stay together and in
 * order); each tensor at the first place whose free budget (budget minus what is resident or
 * loading there, minus what the plan put there before it) takes it, a tensor already resident
 * at one of the places staying there; no evictions.  Each tensor's home becomes its place.
 */
#include "ops_internal.h"

#include "clock.h"
#include "crew.h"
#include "log.h"
#include "nwcd.h"

#include "nwc_error.h"
#include "size_text.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A load's progress inside one tensor (chunks checked, from the loader) as bytes of the whole
 * request: base is what the tensors before it took. */
typedef struct load_progress {
  nwcd_progress *pc;
  uint64_t base, total;
} load_progress;

static void on_load_progress(void *ctx, uint64_t done, uint64_t len) {
  load_progress *lp = ctx;
  (void)len;
  nwcd_send_progress(lp->pc, lp->base + done, lp->total, false);
}

/* Loads of a model run in NWCD_LOAD_LANES parallel lanes (NWCD_GPU_LOAD_LANES onto a device,
 * where the backend has as many staging rings: crew.h), each lane taking the next tensor, the
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
  uint64_t places; /* load_places of several places: their mask (flags unused), else 0 */
  nwcd_split_slot *slots; /* a split: each tensor's place (ti[i]'s at i), else NULL */
  bool pin;
  pthread_t owner;
  nwcd_crew *crew; /* NULL without memory for one: no help */
  nwcd_progress *pc;
  pthread_mutex_t lock;
  size_t next;
  uint64_t done, total, read; /* read: bytes the lanes' loads read from container files */
  nwc_proto_result res;
  nwcd_load_info sum; /* the lanes' loads added up: their time in acquire (micros), its split */
  uint64_t t0, last_start, first_end, last_end; /* when the lanes started and ended (ns) */
  uint64_t devices; /* bit n: a tensor of the model is on cuda:n (its copies to settle) */
  int rc;
  char msg[NWC_PROTO_MAX_MSG];
} lanes_ctx;

/* Loads model/tensor for a request: at its split slot's place (slot not NULL), else at the
 * places of the mask places (nonzero) from one read, else as flags say (one place); *li the
 * load's, *devices gets the devices it is now on (bit n: cuda:n), whose queued copies the
 * request settles. */
static int acquire_for_load(nwcd *d, const char *model, const char *tensor, unsigned flags,
                            uint64_t places, nwcd_split_slot *slot, bool pin, nwcd_load_info *li,
                            uint64_t *devices) {
  if (slot) {
    int rc = nwcd_res_split_load(d->res, model, tensor, slot, pin, li);
    if (rc == 0 && slot->loc >= 0) *devices |= UINT64_C(1) << slot->loc;
    return rc;
  }
  if (places) {
    uint64_t loaded = 0;
    int rc = nwcd_res_acquire_places(d->res, model, tensor, places, pin, li, &loaded);
    *devices |= loaded >> 1;
    return rc;
  }
  nwcd_ref ref;
  int rc = nwcd_res_acquire(d->res, model, tensor, flags, &ref, li);
  if (rc == 0 && ref.loc >= 0) *devices |= UINT64_C(1) << ref.loc;
  return rc;
}

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
    nwcd_load_info li;
    uint64_t t0 = nwcd_now_ns(), devices = 0;
    int rc = acquire_for_load(c->d, c->r->model, c->ti[i].name, c->flags, c->places,
                              c->slots ? &c->slots[i] : NULL, c->pin, &li, &devices);
    uint64_t ns = nwcd_now_ns() - t0;
    pthread_mutex_lock(&c->lock);
    c->sum.micros += ns / 1000;
    nwcd_load_info_add(&c->sum, &li);
    c->read += li.bytes, c->devices |= devices;
    if (rc < 0 && c->rc == 0) {
      c->rc = rc;
      snprintf(c->msg, sizeof c->msg, "%s", nwc_error_detail());
    } else if (rc == 0) {
      c->res.tensors++, c->res.bytes += c->ti[i].length;
      if (li.direct) c->res.direct++;
      else c->res.buffered++;
    }
    c->done += c->ti[i].length;
    if (pthread_equal(pthread_self(), c->owner))
      nwcd_send_progress(c->pc, c->done, c->total, false);
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

/* The places of a load_places request (r->places) checked against the backend: -EINVAL for none,
 * -ENODEV naming the first it lacks; else 0 with *loc the one place named, or *places the mask
 * when it names several or splits. */
static int request_places(const nwcd_backend *b, const nwc_proto_req *r, int *loc,
                          uint64_t *places) {
  NWC_RETURN_IF(!r->places, -EINVAL, "load_places names no place (bit 0 host memory, bit 1 + n "
                "cuda:n)");
  for (int dv = 0; dv < 63; dv++)
    if ((r->places >> (dv + 1) & 1) && dv >= b->ndevices) return nwcd_no_device(b, dv);
  if ((r->places & (r->places - 1)) || (r->load_flags & NWC_LOAD_SPLIT)) *places = r->places;
  else *loc = __builtin_ctzll(r->places) - 1;
  return 0;
}

/* The budget check of a load of total bytes at loc, or at each place of the mask places. */
static int fits_budgets(nwcd *d, const nwc_proto_req *r, int loc, uint64_t places,
                        uint64_t total) {
  for (int p = places ? NWCD_LOC_CPU : loc; p < (places ? 63 : loc + 1); p++) {
    if (places && !(places >> (p + 1) & 1)) continue;
    char where[16];
    uint64_t budget = nwcd_res_budget(d->res, p, where);
    char need[16], have[16];
    if (total > budget)
      return nwc__fail(-ENOSPC, "%s%s%s needs %s (%llu bytes), more than the memory budget of %s "
                       "(%s); raise --budget / --gpu-budget or load single tensors", r->model,
                       r->tensor[0] ? "/" : "", r->tensor, nwc_size_text(total, need),
                       (unsigned long long)total, where, nwc_size_text(budget, have));
  }
  return 0;
}

/* load, evict, pin, unpin: one tensor, or every tensor of the model when tensor is "";
 * load_on is load or pin onto the place it names, evict_on evict of that place's replicas,
 * load_places load or pin onto the places it names. */
int nwcd_op_residency(nwcd_job *j) {
  nwcd *d = j->d;
  nwc_proto_req *r = &j->req;
  bool placed = r->op == NWC_OP_LOAD_ON || r->op == NWC_OP_LOAD_PLACES;
  int op = placed ? (r->load_flags & NWC_LOAD_PIN ? NWC_OP_PIN : NWC_OP_LOAD)
                  : r->op == NWC_OP_EVICT_ON ? NWC_OP_EVICT : r->op;
  bool split = r->op == NWC_OP_LOAD_PLACES && (r->load_flags & NWC_LOAD_SPLIT);
  int loc = r->op == NWC_OP_LOAD_ON || r->op == NWC_OP_EVICT_ON ? r->device : NWCD_LOC_DEFAULT; /* the wire checks >= -1 */
  uint64_t places = 0;
  if (r->op == NWC_OP_LOAD_PLACES) NWC_TRY(request_places(d->backend, r, &loc, &places));
  if (loc >= d->backend->ndevices) return nwcd_no_device(d->backend, loc);
  nwc_tensor_info *ti = NULL;
  size_t n = 0;
  if (r->tensor[0]) {
    int rc = nwc_store_tensor(d->store, r->model, r->tensor, &ti);
    NWC_RETURN_IF(rc == -ENOENT, -ENOENT, "no tensor %s/%s in the store", r->model, r->tensor);
    if (rc < 0) return rc;
    n = 1;
  } else {
    NWC_TRY(nwcd_model_tensors(d, r->model, &ti, &n));
  }
  uint64_t total = 0, done = 0, read = 0;
  for (size_t i = 0; i < n; i++) total += ti[i].length;
  if (op == NWC_OP_LOAD || op == NWC_OP_PIN) qsort(ti, n, sizeof *ti, larger_first);
  /* a split is checked by its plan, which also reserves its bytes: nothing loads without room */
  nwcd_split_slot *slots = split ? calloc(n ? n : 1, sizeof *slots) : NULL; /* ti[i]'s at i */
  int rc = split && !slots ? -ENOMEM : 0;
  if (rc == 0 && split) {
    rc = nwcd_res_split_plan(d->res, r->model, ti, n, places, slots);
  } else if (rc == 0 && (op == NWC_OP_LOAD || op == NWC_OP_PIN)) {
    rc = fits_budgets(d, r, loc, places, total);
  }
  if (rc < 0) {
    free(slots);
    nwc_tensor_info_free(ti, n);
    return rc;
  }
  nwc_proto_result res = {0};
  uint64_t t0 = nwcd_now_ns();
  nwcd_progress pc = {j, 0};
  unsigned fl = (op == NWC_OP_PIN ? NWCD_ACQ_PIN : NWCD_ACQ_NOREF) | NWCD_ACQ_AT(loc);
  bool laned = (op == NWC_OP_LOAD || op == NWC_OP_PIN) && (n > 1 || (split && n));
  uint64_t parts = 0, helped = 0; /* taken by lanes that ran out of tensors (crew.c) */
  if (laned) {
    lanes_ctx lc = {.d = d, .r = r, .ti = ti, .n = n, .flags = fl, .places = places,
                    .slots = slots, .pin = op == NWC_OP_PIN, .owner = pthread_self(), .pc = &pc,
                    .total = total, .t0 = nwcd_now_ns()};
    pthread_mutex_init(&lc.lock, NULL);
    bool gpu = loc >= 0 || places > 1 || (loc == NWCD_LOC_DEFAULT && d->backend->ndevices > 0);
    size_t lanes = gpu ? NWCD_GPU_LOAD_LANES : NWCD_LOAD_LANES;
    if (n < lanes) lanes = n;
    lc.crew = nwcd_crew_new(NWCD_CREW_PART);
    nwcd_pool_parallel(d->pool, lanes, load_lane, &lc);
    if (slots) nwcd_res_split_cancel(d->res, slots, n); /* what a failure left unloaded */
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
    res = lc.res, rc = lc.rc, read = lc.read;
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
    else nwcd_send_progress(&pc, total, total, true);
  }
  for (size_t i = 0; !laned && i < n && rc == 0; i++) {
    const char *tn = ti[i].name;
    if (op == NWC_OP_LOAD || op == NWC_OP_PIN) {
      nwcd_load_info li;
      uint64_t devices = 0; /* no crew: its loads have waited for their copies */
      load_progress lp = {&pc, done, total};
      nwcd_load_observe(on_load_progress, &lp);
      rc = acquire_for_load(d, r->model, tn, fl, places, NULL, op == NWC_OP_PIN, &li, &devices);
      nwcd_load_observe(NULL, NULL);
      read += li.bytes;
      if (rc == 0) {
        res.tensors++, res.bytes += ti[i].length;
        if (li.direct) res.direct++;
        else res.buffered++;
      }
    } else if (op == NWC_OP_EVICT) {
      uint64_t b = 0;
      rc = nwcd_res_evict(d->res, r->model, tn, loc, &b);
      if (rc == -EBUSY && n > 1) rc = 0, res.skipped++;
      else if (rc == 0 && b) res.tensors++, res.bytes += b;
    } else {
      if (nwcd_res_unpin(d->res, r->model, tn)) res.tensors++, res.bytes += ti[i].length;
    }
    done += ti[i].length;
    if (op == NWC_OP_LOAD || op == NWC_OP_PIN) nwcd_send_progress(&pc, done, total, i + 1 == n);
  }
  nwc_tensor_info_free(ti, n);
  free(slots);
  if (rc < 0) return rc;
  res.micros = (nwcd_now_ns() - t0) / 1000;
  if (r->op == NWC_OP_LOAD_PLACES) res.raw_bytes = read; /* protocol.md: read once per blob */
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
  nwcd_reply(j, &w);
  return 0;
}
