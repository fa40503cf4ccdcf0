/*
 * client_catalog.c - libnwc-client's calls about the store and what is resident: models,
 * tensors, ps, devices, info, stats, remove, load (onto a place), evict, pin, unpin, verify.
 * Each takes the connection's lock for its request and reply (client.c).
 */
#include "client_internal.h"
#include "nwc_client.h"

#include "nwc_oci.h"
#include "nwc_proto.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* nwc__client_request() for a request that carries only its op and names. */
static int call_named(nwc_client *c, int op, const char *model, const char *tensor,
                      nwc_client_progress_fn progress, void *ctx, size_t *len) {
  nwc_proto_req req = {0};
  nwc__client_names(&req, op, model, tensor);
  return nwc__client_request(c, &req, NULL, 0, progress, ctx, len);
}

static void to_tensor(const nwc_proto_tensor *p, nwc_client_tensor *t) {
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", p->name);
  t->ndim = p->ndim;
  memcpy(t->shape, p->shape, sizeof t->shape);
  memcpy(t->dtype, p->dtype, sizeof t->dtype);
  t->elem = p->elem, t->rows = p->rows, t->cols = p->cols;
  t->raw_bytes = p->raw_bytes, t->nwc_bytes = p->nwc_bytes;
  t->state = p->state, t->pinned = p->pinned, t->refs = p->refs, t->last_used_ms = p->last_used_ms;
}

static int do_list(nwc_client *c, int op, const char *model, void **out, size_t *n) {
  size_t len;
  int rc = call_named(c, op, model, NULL, NULL, NULL, &len);
  if (rc < 0) return rc;
  nwc_pr r;
  nwc_pr_init(&r, c->rbuf, len);
  uint32_t k = nwc_pr_u32(&r);
  if (r.err || k > len) return nwc__client_bad_reply();
  size_t esz = op == NWC_OP_MODELS ? sizeof(nwc_client_model)
               : op == NWC_OP_TENSORS ? sizeof(nwc_client_tensor)
               : op == NWC_OP_PS ? sizeof(nwc_client_resident) : sizeof(nwc_client_place);
  uint8_t *a = calloc(k ? k : 1, esz);
  if (!a) return nwc__client_fail(-ENOMEM, "out of memory");
  for (uint32_t i = 0; i < k; i++) {
    if (op == NWC_OP_MODELS) {
      nwc_proto_model m;
      if (nwc_proto_get_model(&r, &m) < 0) break;
      nwc_client_model *o = (nwc_client_model *)a + i;
      memcpy(o->name, m.name, sizeof o->name);
      o->tensors = m.tensors, o->raw_bytes = m.raw_bytes, o->nwc_bytes = m.nwc_bytes;
      o->resident_bytes = m.resident_bytes, o->created = m.created, o->verified = m.verified;
    } else if (op == NWC_OP_TENSORS) {
      nwc_proto_tensor t;
      if (nwc_proto_get_tensor(&r, &t) < 0) break;
      to_tensor(&t, (nwc_client_tensor *)a + i);
    } else if (op == NWC_OP_DEVICES) {
      nwc_proto_place p;
      if (nwc_proto_get_place(&r, &p) < 0) break;
      _Static_assert(sizeof(nwc_client_place) == sizeof p, "place layouts");
      memcpy((nwc_client_place *)a + i, &p, sizeof p);
    } else {
      nwc_proto_ps p;
      if (nwc_proto_get_ps(&r, &p) < 0) break;
      nwc_client_resident *o = (nwc_client_resident *)a + i;
      memcpy(o->model, p.model, sizeof o->model), memcpy(o->tensor, p.tensor, sizeof o->tensor);
      o->bytes = p.bytes, o->pinned = p.pinned, o->locked = p.locked, o->direct = p.direct;
      o->refs = p.refs, o->last_used_ms = p.last_used_ms, o->maps = p.maps;
      o->device = p.device;
    }
  }
  if (nwc_pr_end(&r, "list") < 0) {
    free(a);
    return nwc__client_bad_reply();
  }
  *out = a, *n = k;
  return 0;
}

int nwc_client_models(nwc_client *c, nwc_client_model **out, size_t *n) {
  return LOCKED(c, do_list(c, NWC_OP_MODELS, NULL, (void **)out, n));
}
int nwc_client_tensors(nwc_client *c, const char *model, nwc_client_tensor **out, size_t *n) {
  if (nwc__client_check_names(model, NULL) < 0) return -EINVAL;
  return LOCKED(c, do_list(c, NWC_OP_TENSORS, model, (void **)out, n));
}
int nwc_client_ps(nwc_client *c, nwc_client_resident **out, size_t *n) {
  return LOCKED(c, do_list(c, NWC_OP_PS, NULL, (void **)out, n));
}

int nwc_client_devices(nwc_client *c, nwc_client_place **out, size_t *n) {
  if (!(c->hello.caps & NWC_CAP_DEVICES))
    return nwc__client_fail(-EOPNOTSUPP,
                            "%s has no devices operation (protocol capability 512): it reports "
                            "memory only as the totals of stats",
                            c->hello.daemon);
  return LOCKED(c, do_list(c, NWC_OP_DEVICES, NULL, (void **)out, n));
}

static int do_info(nwc_client *c, const char *model, const char *tensor,
                   nwc_client_tensor_info *out) {
  size_t len;
  int rc = call_named(c, NWC_OP_INFO, model, tensor, NULL, NULL, &len);
  if (rc < 0) return rc;
  nwc_pr r;
  nwc_pr_init(&r, c->rbuf, len);
  nwc_proto_tensor t;
  nwc_proto_info i;
  if (nwc_proto_get_tensor(&r, &t) < 0 || nwc_proto_get_info(&r, &i) < 0 ||
      nwc_pr_end(&r, "info") < 0)
    return nwc__client_bad_reply();
  memset(out, 0, sizeof *out);
  to_tensor(&t, &out->t);
  memcpy(out->conversion, i.conversion, sizeof out->conversion);
  memcpy(out->path, i.path, sizeof out->path);
  out->offset = i.offset, out->length = i.length, out->nchunks = i.nchunks;
  out->nblocks = i.nblocks, out->data_bytes = i.data_bytes, out->format_version = i.format_version;
  return 0;
}

int nwc_client_info(nwc_client *c, const char *model, const char *tensor,
                    nwc_client_tensor_info *out) {
  if (nwc__client_check_names(model, tensor ? tensor : "") < 0) return -EINVAL;
  return LOCKED(c, do_info(c, model, tensor, out));
}

static int do_stats(nwc_client *c, nwc_client_counters *out) {
  nwc_proto_req req = {.op = NWC_OP_STATS};
  size_t len;
  int rc = nwc__client_request(c, &req, NULL, 0, NULL, NULL, &len);
  if (rc < 0) return rc;
  nwc_pr r;
  nwc_pr_init(&r, c->rbuf, len);
  nwc_proto_stats s;
  if (nwc_proto_get_stats(&r, &s) < 0 || nwc_pr_end(&r, "stats") < 0)
    return nwc__client_bad_reply();
  _Static_assert(sizeof(nwc_client_counters) == sizeof(nwc_proto_stats), "stats layouts");
  memcpy(out, &s, sizeof s);
  return 0;
}

int nwc_client_stats(nwc_client *c, nwc_client_counters *out) {
  return LOCKED(c, do_stats(c, out));
}

int nwc__client_result(nwc_client *c, size_t len, nwc_client_result *res, nwc_pr *rest) {
  nwc_pr_init(rest, c->rbuf, len);
  nwc_proto_result pr;
  if (nwc_proto_get_result(rest, &pr) < 0) return nwc__client_bad_reply();
  _Static_assert(sizeof(nwc_client_result) == sizeof(nwc_proto_result), "result layouts");
  if (res) memcpy(res, &pr, sizeof pr);
  return 0;
}

static int do_simple(nwc_client *c, int op, const char *model, const char *tensor,
                     nwc_client_progress_fn progress, void *ctx, nwc_client_result *res) {
  size_t len;
  int rc = call_named(c, op, model, tensor, progress, ctx, &len);
  if (rc < 0) return rc;
  nwc_pr r;
  if ((rc = nwc__client_result(c, len, res, &r)) < 0) return rc;
  return nwc_pr_end(&r, "result") < 0 ? nwc__client_bad_reply() : 0;
}

int nwc_client_remove(nwc_client *c, const char *model) {
  if (nwc__client_check_names(model, NULL) < 0) return -EINVAL;
  return LOCKED(c, do_simple(c, NWC_OP_REMOVE, model, NULL, NULL, NULL, NULL));
}
int nwc_client_load(nwc_client *c, const char *model, const char *tensor,
                    nwc_client_progress_fn progress, void *ctx, nwc_client_result *res) {
  if (nwc__client_check_names(model, tensor) < 0) return -EINVAL;
  return LOCKED(c, do_simple(c, NWC_OP_LOAD, model, tensor, progress, ctx, res));
}
static int do_on_place(nwc_client *c, unsigned op, const char *model, const char *tensor, int device,
                       uint64_t places, unsigned flags, nwc_client_progress_fn progress, void *ctx,
                       nwc_client_result *res) {
  nwc_proto_req req = {0};
  nwc__client_names(&req, op, model, tensor);
  req.device = device, req.places = places, req.load_flags = (uint8_t)flags;
  size_t len;
  int rc = nwc__client_request(c, &req, NULL, 0, progress, ctx, &len);
  if (rc < 0) return rc;
  nwc_pr r;
  if ((rc = nwc__client_result(c, len, res, &r)) < 0) return rc;
  return nwc_pr_end(&r, "result") < 0 ? nwc__client_bad_reply() : 0;
}
/* A request naming a place (load_on: load or pin onto device; evict_on: its replica there). */
static int place_request(nwc_client *c, unsigned op, const char *model, const char *tensor, int device,
                         bool pin, nwc_client_progress_fn progress, void *ctx, nwc_client_result *res) {
  if (nwc__client_check_names(model, tensor) < 0) return -EINVAL;
  if (device < NWC_CLIENT_CPU)
    return nwc__client_fail(-EINVAL, "device %d (-1 host, 0.. CUDA)", device);
  return LOCKED(c, do_on_place(c, op, model, tensor, device, 0, pin ? NWC_LOAD_PIN : 0, progress,
                               ctx, res));
}
int nwc_client_load_on(nwc_client *c, const char *model, const char *tensor, int device,
                       nwc_client_progress_fn progress, void *ctx, nwc_client_result *res) {
  return place_request(c, NWC_OP_LOAD_ON, model, tensor, device, false, progress, ctx, res);
}
int nwc_client_pin_on(nwc_client *c, const char *model, const char *tensor, int device,
                      nwc_client_progress_fn progress, void *ctx, nwc_client_result *res) {
  return place_request(c, NWC_OP_LOAD_ON, model, tensor, device, true, progress, ctx, res);
}
int nwc_client_evict_on(nwc_client *c, const char *model, const char *tensor, int device,
                        nwc_client_result *res) {
  return place_request(c, NWC_OP_EVICT_ON, model, tensor, device, false, NULL, NULL, res);
}
static int do_load_places(nwc_client *c, const char *model, const char *tensor, uint64_t places,
                          unsigned flags, nwc_client_progress_fn progress, void *ctx,
                          nwc_client_result *res) {
  if (!(c->hello.caps & NWC_CAP_LOAD_PLACES))
    return nwc__client_fail(-EOPNOTSUPP, "this nwcd has no load_places (one load per place)");
  return do_on_place(c, NWC_OP_LOAD_PLACES, model, tensor, 0, places, flags, progress, ctx, res);
}
int nwc_client_load_places(nwc_client *c, const char *model, const char *tensor,
                           const int *devices, size_t n, unsigned flags,
                           nwc_client_progress_fn progress, void *ctx, nwc_client_result *res) {
  _Static_assert(NWC_CLIENT_LOAD_PIN == NWC_LOAD_PIN && NWC_CLIENT_LOAD_SPLIT == NWC_LOAD_SPLIT,
                 "load flags are the wire's");
  if (nwc__client_check_names(model, tensor) < 0) return -EINVAL;
  if (flags & ~(NWC_CLIENT_LOAD_PIN | NWC_CLIENT_LOAD_SPLIT))
    return nwc__client_fail(-EINVAL, "load_places flags 0x%x (NWC_CLIENT_LOAD_PIN, _SPLIT)", flags);
  uint64_t places = 0;
  for (size_t i = 0; i < n; i++) {
    if (devices[i] < NWC_CLIENT_CPU || devices[i] > 62)
      return nwc__client_fail(-EINVAL, "device %d (-1 host, 0..62 CUDA)", devices[i]);
    places |= NWC_PLACE_BIT(devices[i]);
  }
  if (!places) return nwc__client_fail(-EINVAL, "load_places names no place");
  return LOCKED(c, do_load_places(c, model, tensor, places, flags, progress, ctx, res));
}
int nwc_client_evict(nwc_client *c, const char *model, const char *tensor, nwc_client_result *res) {
  if (nwc__client_check_names(model, tensor) < 0) return -EINVAL;
  return LOCKED(c, do_simple(c, NWC_OP_EVICT, model, tensor, NULL, NULL, res));
}
int nwc_client_pin(nwc_client *c, const char *model, const char *tensor, nwc_client_result *res) {
  if (nwc__client_check_names(model, tensor) < 0) return -EINVAL;
  return LOCKED(c, do_simple(c, NWC_OP_PIN, model, tensor, NULL, NULL, res));
}
int nwc_client_unpin(nwc_client *c, const char *model, const char *tensor, nwc_client_result *res) {
  if (nwc__client_check_names(model, tensor) < 0) return -EINVAL;
  return LOCKED(c, do_simple(c, NWC_OP_UNPIN, model, tensor, NULL, NULL, res));
}

static int do_verify(nwc_client *c, const char *model, void (*cb)(void *, const char *), void *ctx,
                     nwc_client_result *res) {
  size_t len;
  int rc = call_named(c, NWC_OP_VERIFY, model, NULL, NULL, NULL, &len);
  if (rc < 0) return rc;
  nwc_pr r;
  if ((rc = nwc__client_result(c, len, res, &r)) < 0) return rc;
  uint32_t n = nwc_pr_u32(&r);
  char line[NWC_PROTO_MAX_MSG];
  for (uint32_t i = 0; i < n && !r.err; i++)
    if (nwc_pr_str(&r, line, sizeof line) == 0 && cb) cb(ctx, line);
  return nwc_pr_end(&r, "verify") < 0 ? nwc__client_bad_reply() : 0;
}

int nwc_client_verify(nwc_client *c, const char *model, void (*cb)(void *, const char *),
                      void *ctx, nwc_client_result *res) {
  if (model && nwc__client_check_names(model, NULL) < 0) return -EINVAL;
  return LOCKED(c, do_verify(c, model, cb, ctx, res));
}

static int do_registry(nwc_client *c, nwc_proto_req *req, nwc_client_progress_fn progress, void *ctx,
                       nwc_client_result *res, char digest[73]) {
  if (!(c->hello.caps & NWC_CAP_REGISTRY))
    return nwc__client_fail(-EOPNOTSUPP, "this nwcd (%s) does not pull or push models", c->hello.daemon);
  size_t len;
  int rc = nwc__client_request(c, req, NULL, 0, progress, ctx, &len);
  if (rc < 0) return rc;
  nwc_pr r;
  if ((rc = nwc__client_result(c, len, res, &r)) < 0) return rc;
  char d[73];
  if (nwc_pr_str(&r, d, sizeof d) < 0 || nwc_pr_end(&r, "registry result") < 0) return nwc__client_bad_reply();
  if (digest) memcpy(digest, d, sizeof d);
  return 0;
}

static int registry_req(nwc_proto_req *req, int op, const char *ref, const char *model, const char *user,
                        const char *secret, unsigned flags) {
  memset(req, 0, sizeof *req);
  req->op = (uint16_t)op;
  if (!ref || !*ref || strlen(ref) >= sizeof req->ref)
    return nwc__client_fail(-EINVAL, "a registry reference of 1 to %zu bytes", sizeof req->ref - 1);
  if ((model && strlen(model) >= sizeof req->model) || (user && strlen(user) >= sizeof req->user) ||
      (secret && strlen(secret) >= sizeof req->secret))
    return nwc__client_fail(-ENAMETOOLONG, "model name, user or secret too long");
  if (flags & ~NWC_CLIENT_PLAIN_HTTP) return nwc__client_fail(-EINVAL, "unknown flags 0x%x", flags);
  snprintf(req->ref, sizeof req->ref, "%s", ref);
  snprintf(req->model, sizeof req->model, "%s", model ? model : "");
  snprintf(req->user, sizeof req->user, "%s", user ? user : "");
  snprintf(req->secret, sizeof req->secret, "%s", secret ? secret : "");
  req->registry_flags = (uint8_t)flags;
  return 0;
}

/* pull or push: without user and secret, the caller's credentials for ref's registry as docker
 * and podman keep them (none is fine: a public registry). */
static int registry_call(nwc_client *c, int op, const char *ref, const char *model, const char *user,
                         const char *secret, unsigned flags, nwc_client_progress_fn progress, void *ctx,
                         nwc_client_result *res, char digest[73]) {
  char *found_user = NULL, *found_secret = NULL;
  nwc_oci_ref r;
  int rc = nwc_oci_ref_parse(ref ? ref : "", &r);
  if (rc < 0) return nwc__client_fail(rc, "%s", nwc_oci_last_error());
  if (!user && !secret) {
    rc = nwc_oci_credentials(r.registry, &found_user, &found_secret);
    if (rc == -ENOENT) rc = 0;
    else if (rc < 0) rc = nwc__client_fail(rc, "credentials: %s", nwc_oci_last_error());
    user = found_user, secret = found_secret;
  }
  nwc_oci_ref_free(&r);
  nwc_proto_req *req = rc == 0 ? malloc(sizeof *req) : NULL;
  if (rc == 0 && !req) rc = nwc__client_fail(-ENOMEM, "out of memory");
  if (rc == 0) rc = registry_req(req, op, ref, model, user, secret, flags);
  if (rc == 0) rc = LOCKED(c, do_registry(c, req, progress, ctx, res, digest));
  if (req) explicit_bzero(req->secret, sizeof req->secret);
  if (found_secret) explicit_bzero(found_secret, strlen(found_secret));
  free(req), free(found_user), free(found_secret);
  return rc;
}

int nwc_client_pull(nwc_client *c, const char *ref, const char *model, const char *user,
                    const char *secret, unsigned flags, nwc_client_progress_fn progress, void *ctx,
                    nwc_client_result *res, char digest[73]) {
  if (model && *model && nwc__client_check_names(model, NULL) < 0) return -EINVAL;
  return registry_call(c, NWC_OP_PULL, ref, model, user, secret, flags, progress, ctx, res, digest);
}

int nwc_client_push(nwc_client *c, const char *model, const char *ref, const char *user,
                    const char *secret, unsigned flags, nwc_client_progress_fn progress, void *ctx,
                    nwc_client_result *res, char digest[73]) {
  if (nwc__client_check_names(model, NULL) < 0) return -EINVAL;
  return registry_call(c, NWC_OP_PUSH, ref, model, user, secret, flags, progress, ctx, res, digest);
}
