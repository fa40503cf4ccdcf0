/*
 * ops_registry.c - pull and push: stored models through an OCI registry (docs/oci.md).
 *
 * The artifact of a model is an OCI v1.1 image manifest with artifactType NWC_MT_MODEL, its
 * config blob the model's catalog rows (store/transfer.c: NWC_MT_CONFIG) and one layer, the
 * container in its portable form (NWC_MT_CONTAINER), every blob addressed by its sha256.
 *
 * Pull (the client sends the reference, the local name and its credentials): the manifest, then
 * the config (hashed against its digest), then the layer streamed straight into a receive of the
 * store, which checks every chunk against the config as it lands, while the layer's bytes are
 * hashed; a transfer cut short is resumed from the bytes taken (HTTP Range) up to PULL_TRIES times
 * within the request, 1 to 8 s apart; the model is published only when the layer's sha256 matched (then the
 * store validates every blob), else nothing is left.  The model's one source row names where it
 * came from ("oci://REGISTRY/REPOSITORY@MANIFEST-DIGEST"), so a pull of the same digest into the
 * same name finds it there and does nothing.
 *
 * Push: the model's portable container is read once, chunk-checked, for its sha256 (a registry
 * wants the digest before it takes a blob, and says whether it has it), then uploaded unless the
 * registry has it; the config likewise; then the manifest, by the reference's tag.  The same model
 * always makes the same bytes and manifest, so a second push uploads nothing.
 *
 * Both run on the request's worker thread, outside every daemon lock: the store serializes its
 * own writes, and a pull's receive is invisible until it commits.
 */
#include "ops.h"
#include "ops_internal.h"

#include "log.h"
#include "nwcd.h"

#include "clock.h"
#include "nwc_error.h"
#include "nwc_oci.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NWC_MT_MODEL "application/vnd.nwc.model.v1"
#define NWC_MT_CONFIG "application/vnd.nwc.config.v1+json"
#define NWC_MT_CONTAINER "application/vnd.nwc.container.v1"
#define CONFIG_MAX (256u << 20) /* a config of ~16 bytes a checksum chunk: 16 TiB of model */
#define PULL_TRIES 5

typedef struct blob_ref {
  char digest[73];
  uint64_t size;
} blob_ref;

static int open_registry(const nwc_proto_req *r, nwc_oci_ref *ref, nwc_oci **c) {
  NWC_TRY(nwc_oci_ref_parse(r->ref, ref));
  int rc = nwc_oci_open(ref, r->user[0] ? r->user : NULL, r->secret[0] ? r->secret : NULL,
                        r->registry_flags & NWC_REGISTRY_PLAIN_HTTP ? NWC_OCI_PLAIN_HTTP : 0, c);
  if (rc < 0) nwc_oci_ref_free(ref);
  return rc;
}

static int json_blob(json_t *o, const char *mt, blob_ref *b) {
  const char *d = json_string_value(json_object_get(o, "digest"));
  json_t *size = json_object_get(o, "size");
  const char *type = json_string_value(json_object_get(o, "mediaType"));
  NWC_RETURN_IF(!d || !nwc_oci_digest_valid(d) || !json_is_integer(size) || json_integer_value(size) < 0,
                -EBADMSG, "the manifest's %s descriptor is malformed", mt);
  NWC_RETURN_IF(!type || strcmp(type, mt), -EMEDIUMTYPE, "the artifact's blob is %s, not %s",
                type ? type : "untyped", mt);
  snprintf(b->digest, sizeof b->digest, "%s", d);
  b->size = (uint64_t)json_integer_value(size);
  return 0;
}

/* The config and layer of an nwc model's manifest. */
static int parse_manifest(const char *body, size_t len, blob_ref *config, blob_ref *layer) {
  json_error_t e;
  json_t *m = json_loadb(body, len, 0, &e);
  NWC_RETURN_IF(!m, -EBADMSG, "the manifest is not JSON: %s", e.text);
  const char *at = json_string_value(json_object_get(m, "artifactType"));
  json_t *layers = json_object_get(m, "layers");
  int rc = at && !strcmp(at, NWC_MT_MODEL) ? 0
           : nwc__fail(-EMEDIUMTYPE, "not an nwc model (artifactType %s)", at ? at : "none");
  if (rc == 0 && (!json_is_array(layers) || json_array_size(layers) != 1))
    rc = nwc__fail(-EBADMSG, "an nwc model has one layer, this manifest %zu", json_array_size(layers));
  if (rc == 0) rc = json_blob(json_object_get(m, "config"), NWC_MT_CONFIG, config);
  if (rc == 0) rc = json_blob(json_array_get(layers, 0), NWC_MT_CONTAINER, layer);
  json_decref(m);
  return rc;
}

typedef struct membuf {
  char *p;
  size_t n, cap;
} membuf;

static int to_mem(void *ctx, const void *p, size_t n) {
  membuf *b = ctx;
  NWC_RETURN_IF(n > b->cap - b->n, -EFBIG, "the config is larger than its descriptor says");
  memcpy(b->p + b->n, p, n);
  b->n += n;
  return 0;
}

/* A failure that the same request may succeed past later: the connection, not the bytes. */
static bool transient(int rc) {
  return rc == -ECONNRESET || rc == -ETIMEDOUT || rc == -ECONNREFUSED || rc == -EIO ||
         rc == -EHOSTUNREACH || rc == -EPROTO;
}

typedef struct layer_rx {
  nwc_store_receive *rx;
  nwc_sha256 *h;
  nwcd_progress *pc;
} layer_rx;

static int to_store(void *ctx, const void *p, size_t n) {
  layer_rx *l = ctx;
  nwc_sha256_update(l->h, p, n);
  return nwc_store_receive_write(l->rx, p, n);
}

static int pull_progress(void *ctx, uint64_t done, uint64_t total) {
  (void)done, (void)total;
  const layer_rx *l = ctx;
  nwcd_send_progress(l->pc, nwc_store_receive_have(l->rx), nwc_store_receive_size(l->rx), false);
  return 0;
}

/* The layer into l->rx from where it stands, resumed where a failed transfer stopped; its
 * sha256 (l->h: of every byte taken so far) checked at the end. */
static int pull_layer(nwc_oci *c, const blob_ref *layer, layer_rx *l) {
  int rc = -EIO;
  for (int t = 0; t < PULL_TRIES && rc < 0; t++) {
    if (t) sleep(1u << (t - 1)); /* 1, 2, 4, 8 s: a registry restarting */
    uint64_t at = nwc_store_receive_have(l->rx);
    rc = nwc_oci_blob_pull(c, layer->digest, at, 0, to_store, l, pull_progress, l);
    if (rc < 0 && !transient(rc)) break;
    if (rc < 0) nwcd_log(NWCD_LOG_WARN, "pull of %s cut at %llu bytes (%s): resuming", layer->digest,
                         (unsigned long long)nwc_store_receive_have(l->rx), nwc_error_detail());
  }
  NWC_TRY(rc);
  NWC_RETURN_IF(nwc_store_receive_have(l->rx) != layer->size, -EBADMSG,
                "the layer has %llu bytes, its descriptor says %llu",
                (unsigned long long)nwc_store_receive_have(l->rx), (unsigned long long)layer->size);
  char got[73];
  nwc_sha256_final(l->h, got);
  NWC_RETURN_IF(strcmp(got, layer->digest), -EBADMSG, "the layer's bytes hash to %s, not %s", got,
                layer->digest);
  nwcd_send_progress(l->pc, layer->size, layer->size, true); /* the last event is at the total */
  return 0;
}

/* ---- pulls that stopped part way ------------------------------------------------------------ */

/* A pull whose registry went away keeps what it took (the receive, whose temporary file holds
 * the checked bytes, and the sha256 of them) for the next pull of the same layer into the same
 * name, which resumes there: at most PARKED_MAX, the oldest dropped (its file removed); nwcd's
 * exit drops them all (a restart's sweep would remove the files anyway). */
#define PARKED_MAX 4

struct nwcd_parked {
  struct nwcd_parked *next;
  char digest[73], name[NWC_PROTO_NAME_MAX];
  nwc_store_receive *rx;
  nwc_sha256 *h;
};

static void parked_free(nwcd_parked *p) {
  nwc_store_receive_close(p->rx);
  nwc_sha256_free(p->h);
  free(p);
}

/* The parked pull of layer digest into name, taken off the list; NULL if none. */
static nwcd_parked *unpark(nwcd *d, const char *digest, const char *name) {
  pthread_mutex_lock(&d->parked_lock);
  nwcd_parked **pp = &d->parked, *p;
  while ((p = *pp) && (strcmp(p->digest, digest) || strcmp(p->name, name))) pp = &p->next;
  if (p) *pp = p->next;
  pthread_mutex_unlock(&d->parked_lock);
  return p;
}

static void park(nwcd *d, const char *digest, const char *name, const layer_rx *l) {
  nwcd_parked *p = calloc(1, sizeof *p);
  if (!p) {
    nwc_store_receive_close(l->rx), nwc_sha256_free(l->h);
    return;
  }
  snprintf(p->digest, sizeof p->digest, "%s", digest);
  snprintf(p->name, sizeof p->name, "%s", name);
  p->rx = l->rx, p->h = l->h;
  pthread_mutex_lock(&d->parked_lock);
  p->next = d->parked, d->parked = p;
  nwcd_parked *drop = NULL;
  unsigned n = 0;
  for (nwcd_parked *q = d->parked; q; q = q->next)
    if (++n == PARKED_MAX && q->next) drop = q->next, q->next = NULL;
  pthread_mutex_unlock(&d->parked_lock);
  while (drop) {
    nwcd_parked *next = drop->next;
    parked_free(drop);
    drop = next;
  }
}

void nwcd_registry_free(nwcd *d) {
  while (d->parked) {
    nwcd_parked *next = d->parked->next;
    parked_free(d->parked);
    d->parked = next;
  }
}

/* The local model's first source label: where a pull came from, or an import's file name. */
static int origin_of(nwcd *d, const char *model, char *out, size_t cap) {
  char *label = NULL;
  int rc = nwc_store_model_source(d->store, model, &label);
  if (rc == 0) snprintf(out, cap, "%s", label);
  free(label);
  return rc;
}

static void reply_result(nwcd_job *j, const char *model, uint64_t t0, bool already, const char *digest) {
  nwc_model_info *m = NULL;
  nwc_proto_result res = {.skipped = already, .micros = (nwcd_now_ns() - t0) / 1000};
  if (nwc_store_model(j->d->store, model, &m) == 0)
    res.tensors = m->tensors, res.bytes = m->nwc_bytes, res.raw_bytes = m->raw_bytes;
  nwc_model_info_free(m, 1);
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_put_result(&w, &res);
  nwc_pw_str(&w, digest);
  nwcd_reply(j, &w);
}

static int pull_into(nwcd_job *j, nwc_oci *c, const blob_ref *cb,
                     const blob_ref *lb, const char *source, char *name) {
  NWC_RETURN_IF(cb->size > CONFIG_MAX, -EFBIG, "a config of %llu bytes", (unsigned long long)cb->size);
  membuf cfg = {malloc(cb->size + 1), 0, cb->size};
  if (!cfg.p) return -ENOMEM;
  int rc = nwc_oci_blob_pull(c, cb->digest, 0, 1, to_mem, &cfg, NULL, NULL);
  if (rc == 0 && cfg.n != cb->size) rc = nwc__fail(-EBADMSG, "the config has %zu bytes, not %llu", cfg.n,
                                                   (unsigned long long)cb->size);
  if (rc == 0 && !name[0]) { /* the artifact's own name */
    json_t *o = json_loadb(cfg.p, cfg.n, 0, NULL);
    const char *n = json_string_value(json_object_get(json_object_get(o, "model"), "name"));
    snprintf(name, NWC_PROTO_NAME_MAX, "%s", n ? n : "");
    json_decref(o);
  }
  nwcd_progress pc = {j, 0};
  layer_rx l = {NULL, NULL, &pc};
  nwcd_parked *p = rc == 0 ? unpark(j->d, lb->digest, name) : NULL;
  if (p) {
    l.rx = p->rx, l.h = p->h;
    free(p);
    nwcd_log(NWCD_LOG_INFO, "pull of %s into %s: resuming an earlier pull at %llu bytes", lb->digest,
             name, (unsigned long long)nwc_store_receive_have(l.rx));
  } else {
    if (rc == 0) rc = nwc_store_receive_open(j->d->store, name, cfg.p, cfg.n, &l.rx);
    if (rc == 0) rc = nwc_sha256_new(&l.h);
  }
  free(cfg.p);
  if (rc == 0) rc = pull_layer(c, lb, &l);
  if (rc == 0) rc = nwc_store_receive_commit(l.rx, source);
  const uint64_t have = l.rx ? nwc_store_receive_have(l.rx) : 0;
  if (rc < 0 && transient(rc) && have > 0) {
    char why[NWC_PROTO_MAX_MSG];
    snprintf(why, sizeof why, "%s", nwc_error_detail());
    park(j->d, lb->digest, name, &l);
    return nwc__fail(rc, "%s (the %llu bytes taken are kept: pulling again resumes there)", why,
                     (unsigned long long)have);
  }
  nwc_store_receive_close(l.rx);
  nwc_sha256_free(l.h);
  return rc;
}

int nwcd_op_pull(nwcd_job *j) {
  nwcd *d = j->d;
  const nwc_proto_req *r = &j->req;
  uint64_t t0 = nwcd_now_ns();
  nwc_oci_ref ref;
  nwc_oci *c = NULL;
  NWC_TRY(open_registry(r, &ref, &c));
  char *body = NULL, digest[73] = "", source[NWC_PROTO_NAME_MAX + 96], name[NWC_PROTO_NAME_MAX];
  size_t len = 0;
  blob_ref cb, lb;
  snprintf(name, sizeof name, "%s", r->model);
  int rc = nwc_oci_manifest_get(c, ref.digest ? ref.digest : ref.tag, &body, &len, NULL, digest);
  if (rc == 0) rc = parse_manifest(body, len, &cb, &lb);
  snprintf(source, sizeof source, "oci://%s/%s@%s", ref.registry, ref.repository, digest);
  char have[sizeof source] = "";
  bool already = false;
  if (rc == 0 && name[0] && origin_of(d, name, have, sizeof have) == 0) {
    already = !strcmp(have, source);
    if (!already) rc = nwc__fail(-EEXIST, "model %s exists (from %s); remove it or pull under another name",
                                 name, have[0] ? have : "an import");
  }
  if (rc == 0 && !already) rc = pull_into(j, c, &cb, &lb, source, name);
  if (rc == -EEXIST && !already && origin_of(d, name, have, sizeof have) == 0 && !strcmp(have, source))
    already = true, rc = 0; /* the artifact's own name, present from this digest */
  free(body);
  nwc_oci_close(c);
  nwc_oci_ref_free(&ref);
  if (rc < 0) {
    nwcd_log(NWCD_LOG_WARN, "pull of %s failed: %s (%s)", r->ref, nwc_error_detail(), strerror(-rc));
    return rc;
  }
  nwcd_log(NWCD_LOG_INFO, "%s %s as %s (%s)", already ? "already have" : "pulled", r->ref, name, digest);
  reply_result(j, name, t0, already, digest);
  return 0;
}

/* ---- push ----------------------------------------------------------------------------------- */

static int hash_chunk(void *ctx, const void *p, size_t n) {
  nwc_sha256_update(ctx, p, n);
  return 0;
}

static ssize_t read_export(void *ctx, uint64_t off, void *buf, size_t len) {
  return nwc_store_export_read(ctx, off, buf, len);
}

static ssize_t read_config(void *ctx, uint64_t off, void *buf, size_t len) {
  const membuf *b = ctx;
  if (off >= b->n) return 0;
  if (len > b->n - off) len = (size_t)(b->n - off);
  memcpy(buf, b->p + off, len);
  return (ssize_t)len;
}

static int push_progress(void *ctx, uint64_t done, uint64_t total) {
  nwcd_send_progress(ctx, done, total, false);
  return 0;
}

static char *manifest_json(const char *model, const blob_ref *cb, const blob_ref *lb) {
  json_t *m = json_object(), *cfg = json_object(), *layers = json_array(), *l = json_object(),
         *ann = json_object();
  json_object_set_new(m, "schemaVersion", json_integer(2));
  json_object_set_new(m, "mediaType", json_string(NWC_OCI_MT_MANIFEST));
  json_object_set_new(m, "artifactType", json_string(NWC_MT_MODEL));
  json_object_set_new(cfg, "mediaType", json_string(NWC_MT_CONFIG));
  json_object_set_new(cfg, "digest", json_string(cb->digest));
  json_object_set_new(cfg, "size", json_integer((json_int_t)cb->size));
  json_object_set_new(m, "config", cfg);
  json_object_set_new(l, "mediaType", json_string(NWC_MT_CONTAINER));
  json_object_set_new(l, "digest", json_string(lb->digest));
  json_object_set_new(l, "size", json_integer((json_int_t)lb->size));
  json_array_append_new(layers, l);
  json_object_set_new(m, "layers", layers);
  json_object_set_new(ann, "org.opencontainers.image.title", json_string(model));
  json_object_set_new(m, "annotations", ann);
  char *s = json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(m);
  return s;
}

static int push_blobs(nwcd_job *j, nwc_oci *c, nwc_store_export *e, blob_ref *cb, blob_ref *lb) {
  nwc_sha256 *h;
  NWC_TRY(nwc_sha256_new(&h));
  int rc = nwc_store_export_scan(e, hash_chunk, h); /* also makes the config */
  nwc_sha256_final(h, lb->digest);
  nwc_sha256_free(h);
  lb->size = nwc_store_export_size(e);
  NWC_TRY(rc);
  membuf cfg = {0};
  cfg.p = (char *)nwc_store_export_config(e, &cfg.n);
  nwc_sha256_buf(cfg.p, cfg.n, cb->digest);
  cb->size = cfg.n;
  nwcd_progress pc = {j, 0};
  rc = nwc_oci_blob_push(c, cb->digest, cb->size, read_config, &cfg, NULL, NULL);
  if (rc == 0) rc = nwc_oci_blob_push(c, lb->digest, lb->size, read_export, e, push_progress, &pc);
  if (rc == 0) nwcd_send_progress(&pc, lb->size, lb->size, true); /* also when nothing was sent */
  return rc;
}

int nwcd_op_push(nwcd_job *j) {
  const nwc_proto_req *r = &j->req;
  uint64_t t0 = nwcd_now_ns();
  nwc_store_export *e = NULL;
  int rc = nwc_store_export_open(j->d->store, r->model, &e);
  NWC_RETURN_IF(rc == -ENOENT, -ENOENT, "no model '%s' in the store", r->model);
  NWC_TRY(rc);
  nwc_oci_ref ref;
  nwc_oci *c = NULL;
  rc = open_registry(r, &ref, &c);
  if (rc < 0) {
    nwc_store_export_close(e);
    return rc;
  }
  blob_ref cb, lb;
  char digest[73] = "";
  rc = ref.digest ? nwc__fail(-EINVAL, "push to a tag, not a digest (%s)", r->ref) : 0;
  if (rc == 0) rc = push_blobs(j, c, e, &cb, &lb);
  char *m = rc == 0 ? manifest_json(r->model, &cb, &lb) : NULL;
  if (rc == 0 && !m) rc = -ENOMEM;
  if (rc == 0) rc = nwc_oci_manifest_put(c, ref.tag, NWC_OCI_MT_MANIFEST, m, strlen(m), digest);
  free(m);
  nwc_oci_close(c);
  nwc_oci_ref_free(&ref);
  nwc_store_export_close(e);
  if (rc < 0) {
    nwcd_log(NWCD_LOG_WARN, "push of %s to %s failed: %s (%s)", r->model, r->ref, nwc_error_detail(),
             strerror(-rc));
    return rc;
  }
  nwcd_log(NWCD_LOG_INFO, "pushed %s to %s (%s)", r->model, r->ref, digest);
  reply_result(j, r->model, t0, false, digest);
  return 0;
}
