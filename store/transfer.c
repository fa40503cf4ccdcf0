/*
 * transfer.c - a stored model in its portable form, out of one store and into another: what
 * `nwcctl push` uploads and `nwcctl pull` lands (docs/oci.md, "The artifact").
 *
 * The portable form of a model is its catalog rows as JSON (the config: every tensor's row with
 * its chunk checksums) and its container file with every container id field set to 0 (the
 * container header's at 16 and each blob header's at 8, their XXH3s recomputed).  A container's
 * id is its file name in one store; zeroed, the same model has the same bytes, the same sha256
 * and the same config in every store it passes through, so pushing it twice, or pushing it back
 * from a store that pulled it, uploads nothing twice.  Only the first chunk of each blob (which
 * holds its header) has a checksum other than the catalog's.
 *
 * Export (nwc_store_export_*): open reads the catalog rows and each blob's header; scan streams
 * the container in order, checking every chunk against the catalog before handing on its portable
 * bytes (for the sha256 a push needs before it can ask the registry whether it has the blob), and
 * the first scan builds the config from the rows and the first chunks' new checksums; read gives
 * any range of the portable bytes (the upload).
 *
 * Receive (nwc_store_receive_*): the config, untrusted, is checked field by field (names, element
 * types, layouts, that the blobs tile the container, chunk counts) before anything is created;
 * the container's bytes are then appended in order, any cut, and written to DIR/containers/ID.tmp
 * one checked piece at a time: the container header by its own checksum, every blob chunk by the
 * config's, and a piece holding a header then given the new container's id (its checksum, and
 * the blob's first chunk's, recomputed).  So the .tmp holds only checked bytes; the receive keeps
 * the piece being gathered (a piece whose write failed stays pending, retried by the next write),
 * and the bytes it has taken (`have`) are where a download cut short resumes.  Commit reads every
 * blob back through nwc_store_read_info (chunks, header, nwc_tensor_validate: what an import's
 * blobs get), then publishes as an import does: fsync, rename, fsync of the directory, one catalog
 * transaction.  Until then nothing is visible; a receive closed without commit deletes its .tmp,
 * and the startup sweep deletes one left by a crash.  The layer's sha256 is the caller's to check
 * (it sees the bytes first); commit is called only when it matched.
 */
#include "store_internal.h"
#include "internal.h" /* nwc__put64, nwc__get64 */

#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define CONFIG_VERSION 1

/* Sets the container id field at id_at of a header of `bytes` bytes and its XXH3-64 (the last 8). */
static void set_id(uint8_t *hdr, size_t bytes, size_t id_at, uint64_t cid) {
  nwc__put64(hdr + id_at, cid);
  nwc__put64(hdr + bytes - 8, XXH3_64bits(hdr, bytes - 8));
}
static void set_container_id(uint8_t hdr[NWC__CONTAINER_HEADER], uint64_t cid) {
  set_id(hdr, NWC__CONTAINER_HEADER, 16, cid);
}
static void set_blob_id(uint8_t hdr[NWC__BLOB_HEADER], uint64_t cid) { set_id(hdr, NWC__BLOB_HEADER, 8, cid); }

static int cmp_offset(const void *a, const void *b) {
  const nwc_tensor_info *x = *(nwc_tensor_info *const *)a, *y = *(nwc_tensor_info *const *)b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static char *hex64(uint64_t v, char buf[17]) {
  snprintf(buf, 17, "%016llx", (unsigned long long)v);
  return buf;
}

/* ---- export --------------------------------------------------------------------------------- */

struct nwc_store_export {
  int fd;
  char *path;
  uint64_t size, version;
  nwc_tensor_info *ts;
  size_t n;
  nwc_tensor_info **by_off;     /* ts by offset */
  uint8_t (*hdrs)[NWC__BLOB_HEADER]; /* each blob's portable header, in by_off order */
  uint8_t chdr[NWC__CONTAINER_HEADER];
  nwc_model_info *model;
  uint64_t *first_sums;         /* each blob's portable first chunk's checksum, in ts order */
  char *config;                 /* built by the first scan */
  size_t config_len;
};

/* Lays the portable headers over buf, which holds the container's bytes [off, off + len). */
static void overlay(const nwc_store_export *e, uint64_t off, uint8_t *buf, size_t len) {
  if (off < NWC__CONTAINER_HEADER) {
    size_t k = NWC__CONTAINER_HEADER - off < len ? NWC__CONTAINER_HEADER - off : len;
    memcpy(buf, e->chdr + off, k);
  }
  size_t lo = 0, hi = e->n; /* the first blob whose header ends after off */
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (e->by_off[mid]->offset + NWC__BLOB_HEADER <= off) lo = mid + 1;
    else hi = mid;
  }
  for (size_t i = lo; i < e->n && e->by_off[i]->offset < off + len; i++) {
    uint64_t b = e->by_off[i]->offset, from = b > off ? b : off;
    uint64_t to = b + NWC__BLOB_HEADER < off + len ? b + NWC__BLOB_HEADER : off + len;
    memcpy(buf + (from - off), e->hdrs[i] + (from - b), to - from);
  }
}

static json_t *u64(uint64_t v) { return json_integer((json_int_t)v); }

static json_t *tensor_json(const nwc_tensor_info *t, uint64_t first_sum) {
  json_t *o = json_object(), *shape = json_array(), *sums = json_array();
  char h[17], psym[33];
  for (unsigned d = 0; d < t->ndim; d++) json_array_append_new(shape, u64(t->shape[d]));
  for (uint64_t c = 0; c < t->nchunks; c++)
    json_array_append_new(sums, json_string(hex64(c ? t->checksums[c] : first_sum, h)));
  for (int i = 0; i < 16; i++) snprintf(psym + 2 * i, 3, "%02x", t->psym[i]);
  json_object_set_new(o, "name", json_string(t->name));
  json_object_set_new(o, "shape", shape);
  json_object_set_new(o, "dtype", json_string(t->dtype));
  json_object_set_new(o, "conversion", json_string(t->conversion));
  json_object_set_new(o, "scale_tensor", t->scale_tensor ? json_string(t->scale_tensor) : json_null());
  json_object_set_new(o, "bias_tensor", t->bias_tensor ? json_string(t->bias_tensor) : json_null());
  json_object_set_new(o, "psym", json_string(psym));
  json_object_set_new(o, "checksums", sums);
  const struct { const char *k; uint64_t v; } f[] = {
      {"elem", t->elem}, {"rows", t->rows}, {"cols", t->cols}, {"source_bytes", t->source_bytes},
      {"raw_bytes", t->raw_bytes}, {"offset", t->offset}, {"length", t->length},
      {"format_version", t->format_version}, {"tab_bits", t->tab_bits}, {"nblocks", t->nblocks},
      {"data_bytes", t->data_bytes}, {"raw_plane_bytes", t->raw_plane_bytes},
      {"off_bases", t->off_bases}, {"off_hdr", t->off_hdr}, {"off_data", t->off_data},
      {"off_raw", t->off_raw}, {"off_scale", t->off_scale}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) json_object_set_new(o, f[i].k, u64(f[i].v));
  return o;
}

/* The config: {"nwc_config": 1, "model": {...}, "container": {...}, "tensors": [...]}. */
static int build_config(nwc_store_export *e) {
  const nwc_model_info *m = e->model;
  json_t *root = json_object(), *model = json_object(), *cont = json_object(), *ts = json_array();
  json_object_set_new(root, "nwc_config", json_integer(CONFIG_VERSION));
  json_object_set_new(model, "name", json_string(m->name));
  json_object_set_new(model, "elem_option", u64(m->elem_option));
  json_object_set_new(model, "layout_option", u64(m->layout_option));
  json_object_set_new(root, "model", model);
  json_object_set_new(cont, "size", u64(e->size));
  json_object_set_new(cont, "version", u64(e->version));
  json_object_set_new(cont, "chunk_size", u64(NWC_STORE_CHUNK));
  json_object_set_new(root, "container", cont);
  for (size_t i = 0; i < e->n; i++) json_array_append_new(ts, tensor_json(&e->ts[i], e->first_sums[i]));
  json_object_set_new(root, "tensors", ts);
  e->config = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(root);
  if (!e->config) return -ENOMEM;
  e->config_len = strlen(e->config);
  return 0;
}

/* Each blob's header, made portable (checked with the rest of its first chunk by the scan). */
static int read_headers(nwc_store_export *e) {
  for (size_t i = 0; i < e->n; i++) {
    NWC_TRY(nwc__pread_full(e->fd, e->hdrs[i], NWC__BLOB_HEADER, e->by_off[i]->offset));
    set_blob_id(e->hdrs[i], 0);
  }
  return 0;
}

static int export_open_files(nwc_store *s, const char *model, nwc_store_export *e) {
  int64_t id;
  uint64_t *ids = NULL, *sizes = NULL;
  size_t nc = 0;
  nwc__lock(s);
  int rc = nwc__catalog_model_id(s->db, model, &id);
  if (rc == 0) rc = nwc__catalog_containers(s->db, id, &ids, &sizes, &nc);
  nwc__unlock(s);
  if (rc == 0 && nc != 1)
    rc = nwc__fail(-ENOTSUP, "model %s has %zu containers; a transfer carries one", model, nc);
  if (rc == 0) rc = nwc_store_tensors(s, model, &e->ts, &e->n);
  if (rc == 0 && e->n == 0) rc = nwc__fail(-ENOTSUP, "model %s has no tensors", model);
  if (rc == 0) {
    e->size = sizes[0];
    e->path = strdup(e->ts[0].path);
    e->fd = e->path ? open(e->path, O_RDONLY | O_CLOEXEC) : -1;
    if (!e->path) rc = -ENOMEM;
    else if (e->fd < 0) rc = nwc__fail(-errno, "%s: %s", e->path, strerror(errno));
  }
  free(ids);
  free(sizes);
  NWC_TRY(rc);
  NWC_TRY(nwc__pread_full(e->fd, e->chdr, NWC__CONTAINER_HEADER, 0));
  NWC_TRY(nwc__container_header_check(e->chdr, e->ts[0].container, e->path));
  e->version = nwc__get32(e->chdr + 8);
  set_container_id(e->chdr, 0);
  return 0;
}

int nwc_store_export_open(nwc_store *s, const char *model, nwc_store_export **out) {
  *out = NULL;
  nwc_store_export *e = calloc(1, sizeof *e);
  if (!e) return -ENOMEM;
  e->fd = -1;
  int rc = export_open_files(s, model, e);
  if (rc == 0) {
    e->by_off = malloc(e->n * sizeof *e->by_off);
    e->hdrs = malloc(e->n * sizeof *e->hdrs);
    e->first_sums = malloc(e->n * sizeof *e->first_sums);
    if (!e->by_off || !e->hdrs || !e->first_sums) rc = -ENOMEM;
  }
  if (rc == 0) {
    for (size_t i = 0; i < e->n; i++) e->by_off[i] = &e->ts[i];
    qsort(e->by_off, e->n, sizeof *e->by_off, cmp_offset);
    rc = read_headers(e);
  }
  if (rc == 0) rc = nwc_store_model(s, model, &e->model);
  if (rc < 0) nwc_store_export_close(e);
  else *out = e;
  return rc;
}

const char *nwc_store_export_config(const nwc_store_export *e, size_t *len) {
  *len = e->config_len;
  return e->config;
}

uint64_t nwc_store_export_size(const nwc_store_export *e) { return e->size; }

ssize_t nwc_store_export_read(nwc_store_export *e, uint64_t off, void *buf, size_t len) {
  if (off >= e->size) return 0;
  if (len > e->size - off) len = (size_t)(e->size - off);
  NWC_TRY(nwc__pread_full(e->fd, buf, len, off));
  overlay(e, off, buf, len);
  return (ssize_t)len;
}

int nwc_store_export_scan(nwc_store_export *e, int (*fn)(void *ctx, const void *p, size_t n),
                          void *ctx) {
  uint8_t *buf = malloc(NWC_STORE_CHUNK);
  if (!buf) return -ENOMEM;
  int rc = fn(ctx, e->chdr, NWC__CONTAINER_HEADER); /* read and checked at open */
  /* The blobs tile the file (the catalog says so and verify checks it): chunk by chunk, in order. */
  for (size_t i = 0; rc == 0 && i < e->n; i++) {
    const nwc_tensor_info *t = e->by_off[i];
    for (uint64_t c = 0; rc == 0 && c < t->nchunks; c++) {
      uint64_t at = c * NWC_STORE_CHUNK, len = t->length - at < NWC_STORE_CHUNK ? t->length - at : NWC_STORE_CHUNK;
      rc = nwc__pread_full(e->fd, buf, len, t->offset + at);
      if (rc == 0) rc = nwc_store_chunk_check(t, c, buf);
      if (rc == 0 && c == 0) {
        memcpy(buf, e->hdrs[i], NWC__BLOB_HEADER);
        e->first_sums[t - e->ts] = XXH3_64bits(buf, len);
      }
      if (rc == 0) rc = fn(ctx, buf, len);
    }
  }
  free(buf);
  if (rc == 0 && !e->config) rc = build_config(e);
  return rc;
}

void nwc_store_export_close(nwc_store_export *e) {
  if (!e) return;
  if (e->fd >= 0) close(e->fd);
  nwc_tensor_info_free(e->ts, e->n);
  nwc_model_info_free(e->model, 1);
  free(e->first_sums);
  free(e->by_off);
  free(e->hdrs);
  free(e->path);
  free(e->config);
  free(e);
}

/* ---- receive -------------------------------------------------------------------------------- */

typedef struct rx_tensor {
  char *name, *dtype, *conversion, *scale_tensor, *bias_tensor;
  nwc__pub_tensor pub;
} rx_tensor;

struct nwc_store_receive {
  nwc_store *s;
  char *model;
  unsigned elem_opt, layout_opt, version;
  uint64_t size;
  rx_tensor *ts;
  size_t n;
  size_t *by_off;   /* tensor indices by offset */
  uint64_t cid;
  int fd;           /* DIR/containers/ID.tmp, or -1 */
  uint64_t have;    /* checked bytes written */
  size_t next;      /* by_off index of the blob at `have` (n: past the last) */
  uint8_t *buf;     /* the piece being gathered: [have, have + fill) */
  size_t fill;
  bool ready;       /* buf holds the whole piece, checked and given the container's id, and
                       piece_sum its checksum: only its write is left (a failed one is retried) */
  uint64_t piece_sum;
  uint64_t hdr_xxh3; /* of the container header as written */
  const char *source; /* commit's, for its publish */
};

/* The length of the piece that starts at `have`: the container header, or the next chunk of the
 * blob at `have`. */
static uint64_t piece_len(const nwc_store_receive *r) {
  if (r->have < NWC__CONTAINER_HEADER) return NWC__CONTAINER_HEADER;
  const nwc__pub_tensor *t = &r->ts[r->by_off[r->next]].pub;
  uint64_t in = r->have - t->offset, left = t->length - in;
  return left < NWC_STORE_CHUNK ? left : NWC_STORE_CHUNK;
}

static const char *jstr(json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }

/* An unsigned field of o, checked to be an integer in [0, max]. */
static int juint(json_t *o, const char *k, uint64_t max, uint64_t *v) {
  json_t *x = json_object_get(o, k);
  NWC_RETURN_IF(!json_is_integer(x) || json_integer_value(x) < 0 || (uint64_t)json_integer_value(x) > max,
                -EBADMSG, "transfer config: \"%s\" missing or out of range", k);
  *v = (uint64_t)json_integer_value(x);
  return 0;
}

static int hex_u64(const char *s, uint64_t *v) {
  if (!s || strlen(s) != 16 || strspn(s, "0123456789abcdef") != 16) return -EBADMSG;
  *v = strtoull(s, NULL, 16);
  return 0;
}

static int rx_tensor_fields(json_t *o, rx_tensor *t) {
  nwc__pub_tensor *p = &t->pub;
  uint64_t v[17];
  static const char *const keys[] = {"elem", "rows", "cols", "source_bytes", "raw_bytes", "offset",
      "length", "format_version", "tab_bits", "nblocks", "data_bytes", "raw_plane_bytes",
      "off_bases", "off_hdr", "off_data", "off_raw", "off_scale"};
  /* Every size at most 2^48 (256 TiB): no product or sum of them below overflows. */
  for (size_t i = 0; i < 17; i++) NWC_TRY(juint(o, keys[i], UINT64_C(1) << 48, &v[i]));
  NWC_RETURN_IF(v[7] != NWC_FORMAT_VERSION || v[8] != NWC__TAB_BITS, -ENOTSUP,
                "transfer config: tensor %s has codec format %llu, table bits %llu; this build "
                "stores %u and %u", t->name, (unsigned long long)v[7], (unsigned long long)v[8],
                NWC_FORMAT_VERSION, NWC__TAB_BITS);
  NWC_RETURN_IF(v[0] > 255, -EBADMSG, "transfer config: tensor %s: bad elem", t->name);
  p->elem = (unsigned)v[0], p->rows = v[1], p->cols = v[2], p->source_bytes = v[3];
  p->raw_bytes = v[4], p->offset = v[5], p->length = v[6], p->nblocks = v[9];
  p->data_bytes = v[10], p->raw_plane_bytes = v[11];
  p->L = (nwc__blob_layout){.off_bases = v[12], .off_hdr = v[13], .off_data = v[14],
                            .off_raw = v[15], .off_scale = v[16]};
  /* nwc_bytes is the blob's own length (before a packed run's zeros): the end of its last
   * section rounded as import rounds it; the blob view checks the sections at commit. */
  static const float any_scale = 1; /* the layout asks only whether there is one */
  nwc__blob_layout L;
  nwc_tensor shape = {.elem = p->elem, .rows = p->rows, .cols = p->cols, .nblocks = p->nblocks,
                      .data_bytes = p->data_bytes, .raw_bytes = p->raw_plane_bytes,
                      .scale = p->L.off_scale ? &any_scale : NULL};
  nwc__blob_layout_of(&shape, &L);
  NWC_RETURN_IF(L.off_bases != p->L.off_bases || L.off_hdr != p->L.off_hdr || L.off_data != p->L.off_data ||
                    L.off_raw != p->L.off_raw || L.off_scale != p->L.off_scale || L.length > p->length,
                -EBADMSG, "transfer config: tensor %s: section offsets do not match its shape", t->name);
  p->L.end = L.end, p->L.length = L.length, p->L.packed = L.packed;
  return 0;
}

static int rx_tensor_strings(json_t *o, rx_tensor *t) {
  const char *name = jstr(o, "name"), *dtype = jstr(o, "dtype"), *conv = jstr(o, "conversion");
  NWC_RETURN_IF(!name || !nwc_tensor_name_valid(name), -EBADMSG, "transfer config: a tensor name is missing or invalid");
  t->name = strdup(name);
  NWC_RETURN_IF(!dtype || strlen(dtype) >= 12 || !conv || strlen(conv) > 256, -EBADMSG,
                "transfer config: tensor %s: dtype or conversion missing", name);
  t->dtype = strdup(dtype), t->conversion = strdup(conv);
  const char *sc = jstr(o, "scale_tensor"), *bi = jstr(o, "bias_tensor");
  NWC_RETURN_IF((sc && !nwc_tensor_name_valid(sc)) || (bi && !nwc_tensor_name_valid(bi)), -EBADMSG,
                "transfer config: tensor %s: bad scale or bias tensor name", name);
  t->scale_tensor = sc ? strdup(sc) : NULL, t->bias_tensor = bi ? strdup(bi) : NULL;
  if (!t->name || !t->dtype || !t->conversion || (sc && !t->scale_tensor) || (bi && !t->bias_tensor))
    return -ENOMEM;
  nwc__pub_tensor *p = &t->pub;
  p->name = t->name, p->dtype = t->dtype, p->conversion = t->conversion;
  p->scale_tensor = t->scale_tensor, p->bias_tensor = t->bias_tensor;
  return 0;
}

static int rx_tensor_arrays(json_t *o, rx_tensor *t) {
  nwc__pub_tensor *p = &t->pub;
  json_t *shape = json_object_get(o, "shape"), *sums = json_object_get(o, "checksums");
  NWC_RETURN_IF(!json_is_array(shape) || json_array_size(shape) > 8, -EBADMSG,
                "transfer config: tensor %s: bad shape", t->name);
  p->ndim = (unsigned)json_array_size(shape);
  for (unsigned d = 0; d < p->ndim; d++) {
    json_t *x = json_array_get(shape, d);
    NWC_RETURN_IF(!json_is_integer(x) || json_integer_value(x) < 0, -EBADMSG,
                  "transfer config: tensor %s: bad shape", t->name);
    p->shape[d] = (uint64_t)json_integer_value(x);
  }
  uint64_t nc = nwc__chunks(p->length, NWC_STORE_CHUNK);
  NWC_RETURN_IF(!json_is_array(sums) || json_array_size(sums) != nc, -EBADMSG,
                "transfer config: tensor %s: %llu chunk checksums expected", t->name, (unsigned long long)nc);
  p->checksums = malloc(nc * sizeof *p->checksums);
  if (!p->checksums) return -ENOMEM;
  for (uint64_t c = 0; c < nc; c++)
    NWC_RETURN_IF(hex_u64(json_string_value(json_array_get(sums, c)), &p->checksums[c]) < 0, -EBADMSG,
                  "transfer config: tensor %s: bad checksum %llu", t->name, (unsigned long long)c);
  const char *psym = jstr(o, "psym");
  NWC_RETURN_IF(!psym || strlen(psym) != 32 || strspn(psym, "0123456789abcdef") != 32, -EBADMSG,
                "transfer config: tensor %s: bad psym", t->name);
  for (int i = 0; i < 16; i++) {
    char b[3] = {psym[2 * i], psym[2 * i + 1], 0};
    p->psym[i] = (uint8_t)strtoul(b, NULL, 16);
  }
  p->source = 0; /* a received model has one source: where it came from */
  return 0;
}

static int cmp_rx_offset(const void *a, const void *b, void *ctx) {
  const rx_tensor *ts = ctx;
  uint64_t x = ts[*(const size_t *)a].pub.offset, y = ts[*(const size_t *)b].pub.offset;
  return x < y ? -1 : x > y;
}

/* The blobs must tile [4096, size), each aligned as the store aligns it, names unique. */
static int rx_check_tiling(nwc_store_receive *r) {
  for (size_t i = 0; i < r->n; i++) r->by_off[i] = i;
  qsort_r(r->by_off, r->n, sizeof *r->by_off, cmp_rx_offset, r->ts);
  uint64_t at = NWC__CONTAINER_HEADER;
  for (size_t i = 0; i < r->n; i++) {
    const nwc__pub_tensor *t = &r->ts[r->by_off[i]].pub;
    NWC_RETURN_IF(t->offset != at || t->length == 0 || t->length % NWC_STORE_PACK_ALIGN ||
                      t->length > r->size - at,
                  -EBADMSG, "transfer config: tensor %s does not continue the container at %llu",
                  t->name, (unsigned long long)at);
    at += t->length;
  }
  NWC_RETURN_IF(at != r->size, -EBADMSG, "transfer config: the blobs end at %llu, the container at %llu",
                (unsigned long long)at, (unsigned long long)r->size);
  return 0;
}

static int rx_parse(nwc_store_receive *r, const void *config, size_t len) {
  json_error_t err;
  json_t *root = json_loadb(config, len, JSON_REJECT_DUPLICATES, &err);
  NWC_RETURN_IF(!root, -EBADMSG, "transfer config: not JSON: %s (line %d)", err.text, err.line);
  json_t *model = json_object_get(root, "model"), *cont = json_object_get(root, "container"),
         *ts = json_object_get(root, "tensors");
  uint64_t ver = 0, v[3] = {0};
  int rc = juint(root, "nwc_config", UINT32_MAX, &ver);
  if (rc == 0 && ver != CONFIG_VERSION)
    rc = nwc__fail(-ENOTSUP, "transfer config version %llu, this build reads %d", (unsigned long long)ver, CONFIG_VERSION);
  if (rc == 0 && (!json_is_object(model) || !json_is_object(cont) || !json_is_array(ts) || !json_array_size(ts)))
    rc = nwc__fail(-EBADMSG, "transfer config: model, container or tensors missing");
  if (rc == 0) rc = juint(model, "elem_option", 255, &v[0]);
  if (rc == 0) rc = juint(model, "layout_option", 255, &v[1]);
  if (rc == 0) rc = juint(cont, "version", NWC_CONTAINER_VERSION, &v[2]);
  if (rc == 0) rc = juint(cont, "size", INT64_MAX, &r->size);
  uint64_t chunk = 0;
  if (rc == 0) rc = juint(cont, "chunk_size", UINT32_MAX, &chunk);
  if (rc == 0 && (chunk != NWC_STORE_CHUNK || v[2] < 1))
    rc = nwc__fail(-ENOTSUP, "transfer config: container version %llu with %llu-byte chunks",
                   (unsigned long long)v[2], (unsigned long long)chunk);
  if (rc == 0) {
    r->elem_opt = (unsigned)v[0], r->layout_opt = (unsigned)v[1], r->version = (unsigned)v[2];
    r->n = json_array_size(ts);
    r->ts = calloc(r->n, sizeof *r->ts);
    r->by_off = malloc(r->n * sizeof *r->by_off);
    if (!r->ts || !r->by_off) rc = -ENOMEM;
  }
  for (size_t i = 0; rc == 0 && i < r->n; i++) {
    json_t *o = json_array_get(ts, i);
    rc = json_is_object(o) ? rx_tensor_strings(o, &r->ts[i]) : nwc__fail(-EBADMSG, "transfer config: a tensor is not an object");
    if (rc == 0) rc = rx_tensor_fields(o, &r->ts[i]);
    if (rc == 0) rc = rx_tensor_arrays(o, &r->ts[i]);
  }
  json_decref(root);
  if (rc == 0) rc = rx_check_tiling(r);
  return rc;
}

static void rx_free(nwc_store_receive *r) {
  for (size_t i = 0; r->ts && i < r->n; i++) {
    rx_tensor *t = &r->ts[i];
    free(t->name), free(t->dtype), free(t->conversion), free(t->scale_tensor), free(t->bias_tensor);
    free(t->pub.checksums);
  }
  free(r->ts);
  free(r->by_off);
  free(r->buf);
  free(r->model);
  free(r);
}

int nwc_store_receive_open(nwc_store *s, const char *model, const void *config, size_t len,
                           nwc_store_receive **out) {
  *out = NULL;
  NWC_RETURN_IF(!nwc_model_name_valid(model), -EINVAL, "invalid model name");
  NWC_RETURN_IF(s->flags & NWC_STORE_RDONLY, -EROFS, "%s: the store is open read-only", s->dir);
  nwc_store_receive *r = calloc(1, sizeof *r);
  if (!r) return -ENOMEM;
  r->s = s, r->fd = -1;
  r->model = strdup(model);
  r->buf = malloc(NWC_STORE_CHUNK);
  int rc = r->model && r->buf ? rx_parse(r, config, len) : -ENOMEM;
  int64_t id;
  nwc__lock(s);
  if (rc == 0) {
    rc = nwc__catalog_model_id(s->db, model, &id);
    rc = rc == 0 ? nwc__fail(-EEXIST, "model %s exists", model) : rc == -ENOENT ? 0 : rc;
  }
  if (rc == 0) rc = nwc__catalog_next_container(s->db, &r->cid);
  nwc__unlock(s);
  char tmp[32];
  nwc__container_name(r->cid, 1, tmp);
  if (rc == 0) {
    r->fd = openat(s->cdirfd, tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
    if (r->fd < 0) rc = nwc__fail(-errno, "%s/containers/%s: cannot create: %s", s->dir, tmp, strerror(errno));
  }
  if (rc < 0) {
    rx_free(r);
    return rc;
  }
  *out = r;
  return 0;
}

uint64_t nwc_store_receive_size(const nwc_store_receive *r) { return r->size; }
uint64_t nwc_store_receive_have(const nwc_store_receive *r) { return r->have + r->fill; }

/* The gathered piece [have, have + fill), whole: checked (the container header by its own
 * checksum, a blob's chunk by the config's), given the new container's id where it holds a
 * header (whose checksum, and a blob's first chunk's, are then the store's own), then written.
 * A failed write leaves the piece ready and pending: the next write or the commit retries it. */
static int rx_flush(nwc_store_receive *r) {
  nwc__pub_tensor *t = r->have < NWC__CONTAINER_HEADER ? NULL : &r->ts[r->by_off[r->next]].pub;
  const uint64_t c = t ? (r->have - t->offset) / NWC_STORE_CHUNK : 0;
  if (!r->ready && !t) {
    NWC_TRY(nwc__container_header_check(r->buf, 0, "transfer: the container header"));
    NWC_RETURN_IF(nwc__get64(r->buf + 16) != 0 || nwc__get32(r->buf + 8) != r->version, -EBADMSG,
                  "transfer: the container header is not the config's (version, id 0)");
    set_container_id(r->buf, r->cid);
    r->hdr_xxh3 = XXH3_64bits(r->buf, NWC__CONTAINER_HEADER);
  } else if (!r->ready) {
    NWC_RETURN_IF(XXH3_64bits(r->buf, r->fill) != t->checksums[c], -EBADMSG,
                  "transfer: model %s tensor %s: chunk %llu (container offset %llu, %zu bytes) "
                  "does not match its checksum", r->model, t->name, (unsigned long long)c,
                  (unsigned long long)r->have, r->fill);
    if (c == 0) set_blob_id(r->buf, r->cid), r->piece_sum = XXH3_64bits(r->buf, r->fill);
  }
  r->ready = true;
  ssize_t w = pwrite(r->fd, r->buf, r->fill, (off_t)r->have);
  if (w != (ssize_t)r->fill)
    return nwc__fail(w < 0 ? -errno : -EIO, "%s/containers: write: %s", r->s->dir, w < 0 ? strerror(errno) : "short");
  if (t && c == 0) t->checksums[0] = r->piece_sum;
  r->have += r->fill;
  r->fill = 0, r->ready = false;
  if (t && r->have == t->offset + t->length) r->next++;
  return 0;
}

int nwc_store_receive_write(nwc_store_receive *r, const void *buf, size_t len) {
  const uint8_t *p = buf;
  NWC_RETURN_IF(len > r->size - r->have - r->fill, -EFBIG,
                "transfer: more bytes than the container's %llu", (unsigned long long)r->size);
  while (len) { /* a piece whose write failed is whole: its first pass takes nothing and retries it */
    const size_t piece = (size_t)piece_len(r), want = piece - r->fill, k = len < want ? len : want;
    memcpy(r->buf + r->fill, p, k);
    r->fill += k, p += k, len -= k;
    if (r->fill == piece) NWC_TRY(rx_flush(r));
  }
  return 0;
}

/* Every blob read back as a reader would read it: chunks, header against the row, validation. */
static int rx_check_blobs(nwc_store_receive *r, const char *path) {
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < r->n; i++) {
    const nwc__pub_tensor *p = &r->ts[i].pub;
    nwc_tensor_info ti = {.model = r->model, .name = (char *)p->name, .elem = p->elem, .rows = p->rows,
        .cols = p->cols, .path = (char *)path, .container = r->cid, .offset = p->offset,
        .length = p->length, .chunk_size = NWC_STORE_CHUNK, .nchunks = nwc__chunks(p->length, NWC_STORE_CHUNK),
        .checksums = p->checksums, .format_version = NWC_FORMAT_VERSION, .tab_bits = NWC__TAB_BITS,
        .nblocks = p->nblocks, .data_bytes = p->data_bytes, .raw_plane_bytes = p->raw_plane_bytes,
        .off_bases = p->L.off_bases, .off_hdr = p->L.off_hdr, .off_data = p->L.off_data,
        .off_raw = p->L.off_raw, .off_scale = p->L.off_scale};
    memcpy(ti.psym, p->psym, 16);
    nwc_tensor t;
    rc = nwc_store_read_info(&ti, &t);
    if (rc == 0) nwc_tensor_release(&t);
  }
  return rc;
}

/* The catalog's transaction for the received model (nwc__container_finish's publish). */
static int rx_publish(void *ctx) {
  nwc_store_receive *r = ctx;
  nwc__pub_tensor *pt = malloc(r->n * sizeof *pt);
  if (!pt) return -ENOMEM;
  for (size_t i = 0; i < r->n; i++) pt[i] = r->ts[i].pub;
  nwc__pub_source src = {r->source, r->size, 0, 0};
  nwc__pub_model m = {r->model, r->elem_opt, r->layout_opt, &src, 1, pt, r->n, r->cid, r->size,
                      r->hdr_xxh3, r->version};
  nwc__lock(r->s);
  int rc = nwc__catalog_publish(r->s->db, &m);
  nwc__unlock(r->s);
  free(pt);
  return rc;
}

int nwc_store_receive_commit(nwc_store_receive *r, const char *source) {
  if (r->ready) NWC_TRY(rx_flush(r)); /* the last piece, whose write failed */
  NWC_RETURN_IF(r->have != r->size || r->fd < 0, -EINVAL, "transfer: %llu of %llu bytes received",
                (unsigned long long)r->have, (unsigned long long)r->size);
  char tmp[32], path[4096];
  nwc__container_name(r->cid, 1, tmp);
  snprintf(path, sizeof path, "%s/containers/%s", r->s->dir, tmp);
  r->source = source;
  const int fd = r->fd;
  r->fd = -1; /* closed by nwc__container_finish, whatever happens */
  return nwc__container_finish(r->s, r->cid, fd, rx_check_blobs(r, path), rx_publish, r);
}

void nwc_store_receive_close(nwc_store_receive *r) {
  if (!r) return;
  if (r->fd >= 0) {
    char tmp[32];
    nwc__container_name(r->cid, 1, tmp);
    close(r->fd);
    unlinkat(r->s->cdirfd, tmp, 0);
  }
  rx_free(r);
}
