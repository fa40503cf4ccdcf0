/*
 * proto.c - encoders and decoders of the nwcd wire protocol (nwc_proto.h, docs/protocol.md).
 *
 * Design: writers never fail mid-way (an allocation failure latches w->err and the frame is
 * dropped at nwc_pw_finish); readers latch -EBADMSG on the first overrun so a decoder reads all
 * fields unconditionally and checks once at the end with nwc_pr_end (exact length).  Every check
 * of outside bytes goes through NWC_RETURN_IF so nwc_error_detail() says what was wrong; the
 * daemon sends that text back in its error reply.
 */
#include "nwc_proto.h"

#include "nwc_error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *const op_names[NWC_OP_COUNT] = {
    [NWC_OP_HELLO] = "hello",   [NWC_OP_SHM] = "shm",       [NWC_OP_MODELS] = "models",
    [NWC_OP_TENSORS] = "tensors", [NWC_OP_INFO] = "info",   [NWC_OP_IMPORT] = "import",
    [NWC_OP_REMOVE] = "remove", [NWC_OP_LOAD] = "load",     [NWC_OP_EVICT] = "evict",
    [NWC_OP_PIN] = "pin",       [NWC_OP_UNPIN] = "unpin",   [NWC_OP_DEQUANT] = "dequant",
    [NWC_OP_GATHER] = "gather", [NWC_OP_MATVEC] = "matvec", [NWC_OP_VERIFY] = "verify",
    [NWC_OP_STATS] = "stats",   [NWC_OP_PS] = "ps",         [NWC_OP_MAP] = "map",
    [NWC_OP_MATVEC_IPC] = "matvec_ipc", [NWC_OP_DEQUANT_IPC] = "dequant_ipc",
    [NWC_OP_LOAD_ON] = "load_on", [NWC_OP_IMPORT2] = "import2", [NWC_OP_DEVICES] = "devices",
    [NWC_OP_MAP_GPU] = "map_gpu", [NWC_OP_PULL] = "pull", [NWC_OP_PUSH] = "push",
    [NWC_OP_EVICT_ON] = "evict_on", [NWC_OP_LOAD_PLACES] = "load_places",
};

const char *nwc_proto_op_name(unsigned op) { return op < NWC_OP_COUNT ? op_names[op] : NULL; }

/* 1 for the requests that pass file descriptors with their frame (NWC_PF_FDS): shm (the region's
 * memfd), import and import2 (the files), map and map_gpu (the mapping's socket); 0 for every
 * other. */
static int op_carries_fds(unsigned op) {
  return op == NWC_OP_SHM || op == NWC_OP_IMPORT || op == NWC_OP_IMPORT2 || op == NWC_OP_MAP ||
         op == NWC_OP_MAP_GPU;
}

static void put_le(uint8_t *p, uint64_t v, unsigned n) {
  for (unsigned i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_le(const uint8_t *p, unsigned n) {
  uint64_t v = 0;
  for (unsigned i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

void nwc_proto_hdr_encode(const nwc_proto_hdr *h, uint8_t out[NWC_PROTO_HEADER]) {
  put_le(out, h->magic, 4);
  put_le(out + 4, h->length, 4);
  put_le(out + 8, h->op, 2);
  put_le(out + 10, h->flags, 2);
  put_le(out + 12, (uint32_t)h->status, 4);
  put_le(out + 16, h->id, 8);
}

int nwc_proto_hdr_decode(const uint8_t in[NWC_PROTO_HEADER], nwc_proto_hdr *h) {
  h->magic = (uint32_t)get_le(in, 4);
  h->length = (uint32_t)get_le(in + 4, 4);
  h->op = (uint16_t)get_le(in + 8, 2);
  h->flags = (uint16_t)get_le(in + 10, 2);
  h->status = (int32_t)(uint32_t)get_le(in + 12, 4);
  h->id = get_le(in + 16, 8);
  NWC_RETURN_IF(h->magic != NWC_PROTO_MAGIC, -EBADMSG, "bad frame magic 0x%08x (not an nwc client?)",
                h->magic);
  NWC_RETURN_IF(h->flags & ~NWC_PF_KNOWN, -EBADMSG, "unknown frame flags 0x%x", h->flags);
  NWC_RETURN_IF(h->length > NWC_PROTO_MAX_PAYLOAD, -EMSGSIZE,
                "frame payload of %u bytes exceeds the maximum %u", h->length,
                NWC_PROTO_MAX_PAYLOAD);
  return 0;
}

/* ---- writer ------------------------------------------------------------------------------- */

void nwc_pw_init(nwc_pw *w) {
  w->buf = NULL, w->len = NWC_PROTO_HEADER, w->cap = 0, w->err = 0;
}

void nwc_pw_free(nwc_pw *w) {
  free(w->buf);
  w->buf = NULL, w->len = w->cap = 0;
}

void *nwc_pw_reserve(nwc_pw *w, size_t n) {
  if (w->err) return NULL;
  if (w->len + n > w->cap) {
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->len + n) cap *= 2;
    uint8_t *b = realloc(w->buf, cap);
    if (!b) {
      w->err = -ENOMEM;
      return NULL;
    }
    w->buf = b, w->cap = cap;
  }
  void *p = w->buf + w->len;
  w->len += n;
  return p;
}

static void pw_le(nwc_pw *w, uint64_t v, unsigned n) {
  uint8_t *p = nwc_pw_reserve(w, n);
  if (p) put_le(p, v, n);
}
static void nwc_pw_u8(nwc_pw *w, uint8_t v) { pw_le(w, v, 1); }
static void nwc_pw_u16(nwc_pw *w, uint16_t v) { pw_le(w, v, 2); }
void nwc_pw_u32(nwc_pw *w, uint32_t v) { pw_le(w, v, 4); }
static void nwc_pw_u64(nwc_pw *w, uint64_t v) { pw_le(w, v, 8); }
static void nwc_pw_i64(nwc_pw *w, int64_t v) { pw_le(w, (uint64_t)v, 8); }
static void nwc_pw_f32(nwc_pw *w, float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  pw_le(w, u, 4);
}
void nwc_pw_bytes(nwc_pw *w, const void *p, size_t n) {
  uint8_t *d = nwc_pw_reserve(w, n);
  if (d && n) memcpy(d, p, n);
}
void nwc_pw_str(nwc_pw *w, const char *s) {
  size_t n = s ? strlen(s) : 0;
  if (n > 65535) n = 65535;
  nwc_pw_u16(w, (uint16_t)n);
  nwc_pw_bytes(w, s, n);
}

int64_t nwc_pw_finish(nwc_pw *w, uint16_t op, uint16_t flags, int32_t status, uint64_t id) {
  if (!w->buf) nwc_pw_reserve(w, 0); /* a frame without payload: room for the header */
  if (w->err) return w->err;
  size_t payload = w->len - NWC_PROTO_HEADER;
  if (payload > NWC_PROTO_MAX_PAYLOAD)
    return nwc__fail(-EMSGSIZE, "payload of %zu bytes exceeds the frame maximum %u", payload,
                     NWC_PROTO_MAX_PAYLOAD);
  nwc_proto_hdr h = {NWC_PROTO_MAGIC, (uint32_t)payload, op, flags, status, id};
  nwc_proto_hdr_encode(&h, w->buf);
  return (int64_t)w->len;
}

/* ---- reader ------------------------------------------------------------------------------- */

static const uint8_t *pr_take(nwc_pr *r, size_t n) {
  if (r->err || n > r->left) {
    r->err = -EBADMSG;
    r->left = 0;
    return NULL;
  }
  const uint8_t *p = r->p;
  r->p += n, r->left -= n;
  return p;
}
static uint64_t pr_le(nwc_pr *r, unsigned n) {
  const uint8_t *p = pr_take(r, n);
  return p ? get_le(p, n) : 0;
}
static uint8_t nwc_pr_u8(nwc_pr *r) { return (uint8_t)pr_le(r, 1); }
static uint16_t nwc_pr_u16(nwc_pr *r) { return (uint16_t)pr_le(r, 2); }
uint32_t nwc_pr_u32(nwc_pr *r) { return (uint32_t)pr_le(r, 4); }
static uint64_t nwc_pr_u64(nwc_pr *r) { return pr_le(r, 8); }
static int64_t nwc_pr_i64(nwc_pr *r) { return (int64_t)pr_le(r, 8); }
static float nwc_pr_f32(nwc_pr *r) {
  uint32_t u = (uint32_t)pr_le(r, 4);
  float f;
  memcpy(&f, &u, 4);
  return f;
}
const void *nwc_pr_bytes(nwc_pr *r, size_t n) { return pr_take(r, n); }

int nwc_pr_str(nwc_pr *r, char *out, size_t cap) {
  out[0] = 0;
  size_t n = nwc_pr_u16(r);
  const uint8_t *p = pr_take(r, n);
  NWC_RETURN_IF(!p, -EBADMSG, "string of %zu bytes overruns the payload", n);
  if (n >= cap) {
    r->err = -EBADMSG;
    return nwc__fail(-EBADMSG, "string of %zu bytes is longer than the limit %zu", n, cap - 1);
  }
  if (n && memchr(p, 0, n)) {
    r->err = -EBADMSG;
    return nwc__fail(-EBADMSG, "string holds a NUL byte");
  }
  memcpy(out, p, n);
  out[n] = 0;
  return 0;
}

int nwc_pr_end(nwc_pr *r, const char *what) {
  NWC_RETURN_IF(r->err, -EBADMSG, "%s payload is truncated", what);
  NWC_RETURN_IF(r->left, -EBADMSG, "%s payload has %zu trailing bytes", what, r->left);
  return 0;
}

/* ---- requests ----------------------------------------------------------------------------- */

void nwc_proto_req_clear(nwc_proto_req *r) {
  if (r->files) {
    for (uint32_t i = 0; i < r->nfiles; i++) free(r->files[i]);
    free(r->files);
  }
  r->files = NULL, r->nfiles = 0;
}

int64_t nwc_proto_req_encode(const nwc_proto_req *r, nwc_pw *w) {
  uint16_t flags = (uint16_t)(r->flags | (op_carries_fds(r->op) ? NWC_PF_FDS : 0));
  switch (r->op) {
    case NWC_OP_HELLO:
      nwc_pw_u32(w, r->ver_min), nwc_pw_u32(w, r->ver_max), nwc_pw_u64(w, r->caps);
      nwc_pw_str(w, r->client);
      break;
    case NWC_OP_SHM:
      nwc_pw_u64(w, r->shm_size);
      break;
    case NWC_OP_MODELS:
    case NWC_OP_STATS:
    case NWC_OP_PS:
    case NWC_OP_DEVICES:
      break;
    case NWC_OP_TENSORS:
    case NWC_OP_REMOVE:
    case NWC_OP_VERIFY:
      nwc_pw_str(w, r->model);
      break;
    case NWC_OP_INFO:
    case NWC_OP_LOAD:
    case NWC_OP_EVICT:
    case NWC_OP_PIN:
    case NWC_OP_UNPIN:
      nwc_pw_str(w, r->model), nwc_pw_str(w, r->tensor);
      break;
    case NWC_OP_LOAD_ON:
      nwc_pw_str(w, r->model), nwc_pw_str(w, r->tensor);
      nwc_pw_u8(w, r->load_flags), nwc_pw_u32(w, (uint32_t)r->device);
      break;
    case NWC_OP_LOAD_PLACES:
      nwc_pw_str(w, r->model), nwc_pw_str(w, r->tensor);
      nwc_pw_u8(w, r->load_flags), nwc_pw_u64(w, r->places);
      break;
    case NWC_OP_MAP:
      nwc_pw_str(w, r->model), nwc_pw_str(w, r->tensor);
      break;
    case NWC_OP_MAP_GPU:
    case NWC_OP_EVICT_ON:
      nwc_pw_str(w, r->model), nwc_pw_str(w, r->tensor), nwc_pw_u32(w, (uint32_t)r->device);
      break;
    case NWC_OP_PULL:
    case NWC_OP_PUSH:
      nwc_pw_str(w, r->ref), nwc_pw_str(w, r->model), nwc_pw_str(w, r->user);
      nwc_pw_str(w, r->secret), nwc_pw_u8(w, r->registry_flags);
      break;
    case NWC_OP_IMPORT:
    case NWC_OP_IMPORT2:
      nwc_pw_str(w, r->model);
      nwc_pw_u8(w, r->elem), nwc_pw_u8(w, r->layout), nwc_pw_u8(w, r->has_index);
      if (r->op == NWC_OP_IMPORT2) nwc_pw_u8(w, r->import_flags);
      nwc_pw_u32(w, r->nfiles);
      for (uint32_t i = 0; i < r->nfiles; i++) nwc_pw_str(w, r->files[i]);
      break;
    case NWC_OP_DEQUANT:
    case NWC_OP_GATHER:
      nwc_pw_str(w, r->model), nwc_pw_str(w, r->tensor);
      nwc_pw_u8(w, r->out), nwc_pw_u8(w, r->where);
      nwc_pw_u64(w, r->out_off), nwc_pw_u64(w, r->out_cap);
      if (r->op == NWC_OP_GATHER) {
        nwc_pw_u32(w, r->nrows);
        nwc_pw_bytes(w, r->rows, (size_t)r->nrows * 8);
      }
      break;
    case NWC_OP_MATVEC:
      nwc_pw_str(w, r->model), nwc_pw_str(w, r->tensor), nwc_pw_str(w, r->bias);
      nwc_pw_f32(w, r->scale), nwc_pw_u32(w, r->ncols);
      nwc_pw_u8(w, r->out), nwc_pw_u8(w, r->where);
      nwc_pw_u64(w, r->in_off), nwc_pw_u64(w, r->x_bytes);
      nwc_pw_u64(w, r->out_off), nwc_pw_u64(w, r->out_cap);
      if (r->where == NWC_WHERE_INLINE) nwc_pw_bytes(w, r->x, r->x_bytes);
      break;
    case NWC_OP_MATVEC_IPC:
    case NWC_OP_DEQUANT_IPC:
      nwc_pw_str(w, r->model), nwc_pw_str(w, r->tensor);
      if (r->op == NWC_OP_MATVEC_IPC) {
        nwc_pw_str(w, r->bias), nwc_pw_f32(w, r->scale), nwc_pw_u32(w, r->ncols);
      }
      nwc_pw_u8(w, r->out), nwc_pw_u8(w, r->has_event);
      if (r->op == NWC_OP_MATVEC_IPC) {
        nwc_pw_bytes(w, r->ipc_x, NWC_PROTO_IPC_HANDLE);
        nwc_pw_u64(w, r->in_off), nwc_pw_u64(w, r->x_bytes);
      }
      nwc_pw_bytes(w, r->ipc_y, NWC_PROTO_IPC_HANDLE);
      nwc_pw_u64(w, r->out_off), nwc_pw_u64(w, r->out_cap);
      if (r->has_event) nwc_pw_bytes(w, r->ipc_event, NWC_PROTO_IPC_HANDLE);
      break;
    default:
      return nwc__fail(-EINVAL, "unknown opcode %u", r->op);
  }
  return nwc_pw_finish(w, r->op, flags, 0, r->id);
}

static int get_out_where(nwc_pr *p, nwc_proto_req *r) {
  r->out = nwc_pr_u8(p), r->where = nwc_pr_u8(p);
  NWC_RETURN_IF(r->out > NWC_OUT_BF16, -EBADMSG, "unknown output type %u", r->out);
  NWC_RETURN_IF(r->where > NWC_WHERE_SHM, -EBADMSG, "unknown data placement %u", r->where);
  return 0;
}

int nwc_proto_req_decode(const nwc_proto_hdr *h, const uint8_t *payload, nwc_proto_req *r) {
  memset(r, 0, sizeof *r);
  r->op = h->op, r->flags = h->flags, r->id = h->id;
  const char *name = nwc_proto_op_name(h->op);
  NWC_RETURN_IF(!name, -EOPNOTSUPP, "unknown opcode %u", h->op);
  NWC_RETURN_IF(h->status != 0, -EBADMSG, "request with a non-zero status");
  NWC_RETURN_IF(h->flags & NWC_PF_EVENT, -EBADMSG, "request with the event flag");
  NWC_RETURN_IF(h->flags & NWC_PF_ALONE, -EBADMSG, "request with the alone flag");
  int wants_fds = op_carries_fds(h->op);
  NWC_RETURN_IF(!!(h->flags & NWC_PF_FDS) != wants_fds, -EBADMSG,
                "%s request %s the descriptor flag", name, wants_fds ? "lacks" : "carries");
  nwc_pr p;
  nwc_pr_init(&p, payload, h->length);
  switch (h->op) {
    case NWC_OP_HELLO:
      r->ver_min = nwc_pr_u32(&p), r->ver_max = nwc_pr_u32(&p), r->caps = nwc_pr_u64(&p);
      NWC_TRY(nwc_pr_str(&p, r->client, sizeof r->client));
      break;
    case NWC_OP_SHM:
      r->shm_size = nwc_pr_u64(&p);
      break;
    case NWC_OP_MODELS:
    case NWC_OP_STATS:
    case NWC_OP_PS:
    case NWC_OP_DEVICES:
      break;
    case NWC_OP_TENSORS:
    case NWC_OP_REMOVE:
    case NWC_OP_VERIFY:
      NWC_TRY(nwc_pr_str(&p, r->model, sizeof r->model));
      break;
    case NWC_OP_INFO:
    case NWC_OP_LOAD:
    case NWC_OP_EVICT:
    case NWC_OP_PIN:
    case NWC_OP_UNPIN:
    case NWC_OP_MAP:
      NWC_TRY(nwc_pr_str(&p, r->model, sizeof r->model));
      NWC_TRY(nwc_pr_str(&p, r->tensor, sizeof r->tensor));
      break;
    case NWC_OP_LOAD_ON:
      NWC_TRY(nwc_pr_str(&p, r->model, sizeof r->model));
      NWC_TRY(nwc_pr_str(&p, r->tensor, sizeof r->tensor));
      r->load_flags = nwc_pr_u8(&p), r->device = (int32_t)nwc_pr_u32(&p);
      NWC_RETURN_IF(p.err, -EBADMSG, "load_on payload is truncated");
      NWC_RETURN_IF(r->load_flags > NWC_LOAD_PIN, -EBADMSG,
                    "load_on pin flag %u is not 0 or 1", r->load_flags);
      NWC_RETURN_IF(r->device < NWC_DEVICE_CPU, -EBADMSG, "load_on device %d (-1 host, 0.. CUDA)",
                    (int)r->device);
      break;
    case NWC_OP_LOAD_PLACES: /* places 0 and places the daemon lacks: the op's own errors */
      NWC_TRY(nwc_pr_str(&p, r->model, sizeof r->model));
      NWC_TRY(nwc_pr_str(&p, r->tensor, sizeof r->tensor));
      r->load_flags = nwc_pr_u8(&p), r->places = nwc_pr_u64(&p);
      NWC_RETURN_IF(p.err, -EBADMSG, "load_places payload is truncated");
      NWC_RETURN_IF(r->load_flags & ~(NWC_LOAD_PIN | NWC_LOAD_SPLIT), -EBADMSG,
                    "load_places flags 0x%x: only bit 0 (pin) and bit 1 (split) are defined",
                    r->load_flags);
      break;
    case NWC_OP_MAP_GPU:
      NWC_TRY(nwc_pr_str(&p, r->model, sizeof r->model));
      NWC_TRY(nwc_pr_str(&p, r->tensor, sizeof r->tensor));
      r->device = (int32_t)nwc_pr_u32(&p);
      NWC_RETURN_IF(p.err, -EBADMSG, "map_gpu payload is truncated");
      NWC_RETURN_IF(r->device < 0, -EBADMSG, "map_gpu device %d (0.. a CUDA device)",
                    (int)r->device);
      break;
    case NWC_OP_EVICT_ON:
      NWC_TRY(nwc_pr_str(&p, r->model, sizeof r->model));
      NWC_TRY(nwc_pr_str(&p, r->tensor, sizeof r->tensor));
      r->device = (int32_t)nwc_pr_u32(&p);
      NWC_RETURN_IF(p.err, -EBADMSG, "evict_on payload is truncated");
      NWC_RETURN_IF(r->device < NWC_DEVICE_CPU, -EBADMSG, "evict_on device %d (-1 host, 0.. CUDA)",
                    (int)r->device);
      break;
    case NWC_OP_PULL:
    case NWC_OP_PUSH:
      NWC_TRY(nwc_pr_str(&p, r->ref, sizeof r->ref));
      NWC_TRY(nwc_pr_str(&p, r->model, sizeof r->model));
      NWC_TRY(nwc_pr_str(&p, r->user, sizeof r->user));
      NWC_TRY(nwc_pr_str(&p, r->secret, sizeof r->secret));
      r->registry_flags = nwc_pr_u8(&p);
      NWC_RETURN_IF(p.err, -EBADMSG, "%s payload is truncated", name);
      NWC_RETURN_IF(r->registry_flags & ~NWC_REGISTRY_KNOWN, -EBADMSG, "%s flags 0x%x unknown", name,
                    r->registry_flags);
      NWC_RETURN_IF(!r->ref[0] || (h->op == NWC_OP_PUSH && !r->model[0]), -EBADMSG,
                    "%s without a reference or model", name);
      break;
    case NWC_OP_IMPORT:
    case NWC_OP_IMPORT2: {
      NWC_TRY(nwc_pr_str(&p, r->model, sizeof r->model));
      r->elem = nwc_pr_u8(&p), r->layout = nwc_pr_u8(&p), r->has_index = nwc_pr_u8(&p);
      if (h->op == NWC_OP_IMPORT2) r->import_flags = nwc_pr_u8(&p);
      uint32_t n = nwc_pr_u32(&p);
      NWC_RETURN_IF(p.err, -EBADMSG, "%s payload is truncated", name);
      NWC_RETURN_IF(r->has_index > 1, -EBADMSG, "import index flag %u is not 0 or 1", r->has_index);
      NWC_RETURN_IF(r->import_flags & ~NWC_IMPORT_KNOWN, -EBADMSG, "import2 flags 0x%x unknown",
                    r->import_flags);
      NWC_RETURN_IF(n == 0 || n > NWC_PROTO_MAX_FILES, -EBADMSG,
                    "import of %u files (1..%u allowed)", n, NWC_PROTO_MAX_FILES);
      NWC_RETURN_IF(!r->has_index && n != 1, -EBADMSG, "import without an index takes one file, not %u",
                    n);
      /* Each name takes at least its 2-byte length: bound the allocation by the payload. */
      NWC_RETURN_IF((uint64_t)n * 2 > p.left, -EBADMSG, "import names overrun the payload");
      r->files = calloc(n, sizeof *r->files);
      if (!r->files) return -ENOMEM;
      r->nfiles = n;
      char tmp[1024];
      for (uint32_t i = 0; i < n; i++) {
        int rc = nwc_pr_str(&p, tmp, sizeof tmp);
        if (rc < 0) return rc;
        if (!(r->files[i] = strdup(tmp))) return -ENOMEM;
      }
      break;
    }
    case NWC_OP_DEQUANT:
    case NWC_OP_GATHER:
      NWC_TRY(nwc_pr_str(&p, r->model, sizeof r->model));
      NWC_TRY(nwc_pr_str(&p, r->tensor, sizeof r->tensor));
      NWC_TRY(get_out_where(&p, r));
      r->out_off = nwc_pr_u64(&p), r->out_cap = nwc_pr_u64(&p);
      if (h->op == NWC_OP_GATHER) {
        r->nrows = nwc_pr_u32(&p);
        NWC_RETURN_IF(p.err, -EBADMSG, "gather payload is truncated");
        NWC_RETURN_IF(r->nrows == 0, -EBADMSG, "gather of no rows");
        NWC_RETURN_IF((uint64_t)r->nrows * 8 != p.left, -EBADMSG,
                      "gather of %u rows needs %llu index bytes, the payload has %zu", r->nrows,
                      (unsigned long long)r->nrows * 8, p.left);
        r->rows = nwc_pr_bytes(&p, (size_t)r->nrows * 8);
      }
      break;
    case NWC_OP_MATVEC:
      NWC_TRY(nwc_pr_str(&p, r->model, sizeof r->model));
      NWC_TRY(nwc_pr_str(&p, r->tensor, sizeof r->tensor));
      NWC_TRY(nwc_pr_str(&p, r->bias, sizeof r->bias));
      r->scale = nwc_pr_f32(&p), r->ncols = nwc_pr_u32(&p);
      NWC_TRY(get_out_where(&p, r));
      r->in_off = nwc_pr_u64(&p), r->x_bytes = nwc_pr_u64(&p);
      r->out_off = nwc_pr_u64(&p), r->out_cap = nwc_pr_u64(&p);
      NWC_RETURN_IF(p.err, -EBADMSG, "matvec payload is truncated");
      NWC_RETURN_IF(r->ncols == 0 || r->ncols > NWC_PROTO_MAX_COLS, -EBADMSG,
                    "matvec of %u columns (1..%u allowed)", r->ncols, NWC_PROTO_MAX_COLS);
      NWC_RETURN_IF(r->x_bytes == 0 || r->x_bytes % (4ull * r->ncols), -EBADMSG,
                    "matvec x of %llu bytes is not %u columns of floats",
                    (unsigned long long)r->x_bytes, r->ncols);
      if (r->where == NWC_WHERE_INLINE) {
        NWC_RETURN_IF(r->x_bytes != p.left, -EBADMSG,
                      "matvec x of %llu bytes, the payload has %zu after the fields",
                      (unsigned long long)r->x_bytes, p.left);
        r->x = nwc_pr_bytes(&p, r->x_bytes);
      }
      break;
    case NWC_OP_MATVEC_IPC:
    case NWC_OP_DEQUANT_IPC: {
      NWC_TRY(nwc_pr_str(&p, r->model, sizeof r->model));
      NWC_TRY(nwc_pr_str(&p, r->tensor, sizeof r->tensor));
      if (h->op == NWC_OP_MATVEC_IPC) {
        NWC_TRY(nwc_pr_str(&p, r->bias, sizeof r->bias));
        r->scale = nwc_pr_f32(&p), r->ncols = nwc_pr_u32(&p);
      }
      r->out = nwc_pr_u8(&p), r->has_event = nwc_pr_u8(&p);
      const void *hx = h->op == NWC_OP_MATVEC_IPC ? nwc_pr_bytes(&p, NWC_PROTO_IPC_HANDLE) : NULL;
      if (hx) memcpy(r->ipc_x, hx, NWC_PROTO_IPC_HANDLE);
      if (h->op == NWC_OP_MATVEC_IPC) r->in_off = nwc_pr_u64(&p), r->x_bytes = nwc_pr_u64(&p);
      const void *hy = nwc_pr_bytes(&p, NWC_PROTO_IPC_HANDLE);
      if (hy) memcpy(r->ipc_y, hy, NWC_PROTO_IPC_HANDLE);
      r->out_off = nwc_pr_u64(&p), r->out_cap = nwc_pr_u64(&p);
      NWC_RETURN_IF(p.err, -EBADMSG, "%s payload is truncated", name);
      NWC_RETURN_IF(r->out > NWC_OUT_BF16, -EBADMSG, "unknown output type %u", r->out);
      NWC_RETURN_IF(r->has_event > 1, -EBADMSG, "%s event flag %u is not 0 or 1", name,
                    r->has_event);
      if (r->has_event) {
        const void *he = nwc_pr_bytes(&p, NWC_PROTO_IPC_HANDLE);
        if (he) memcpy(r->ipc_event, he, NWC_PROTO_IPC_HANDLE);
      }
      if (h->op == NWC_OP_MATVEC_IPC) {
        NWC_RETURN_IF(r->ncols == 0 || r->ncols > NWC_PROTO_MAX_COLS, -EBADMSG,
                      "matvec of %u columns (1..%u allowed)", r->ncols, NWC_PROTO_MAX_COLS);
        NWC_RETURN_IF(r->x_bytes == 0 || r->x_bytes % (4ull * r->ncols), -EBADMSG,
                      "matvec x of %llu bytes is not %u columns of floats",
                      (unsigned long long)r->x_bytes, r->ncols);
      }
      break;
    }
  }
  return nwc_pr_end(&p, name);
}

/* ---- replies ------------------------------------------------------------------------------ */

void nwc_proto_put_hello(nwc_pw *w, const nwc_proto_hello *h) {
  nwc_pw_u32(w, h->version), nwc_pw_u64(w, h->caps), nwc_pw_u32(w, h->max_payload);
  nwc_pw_str(w, h->daemon), nwc_pw_str(w, h->backend);
}
int nwc_proto_get_hello(nwc_pr *r, nwc_proto_hello *h) {
  h->version = nwc_pr_u32(r), h->caps = nwc_pr_u64(r), h->max_payload = nwc_pr_u32(r);
  NWC_TRY(nwc_pr_str(r, h->daemon, sizeof h->daemon));
  NWC_TRY(nwc_pr_str(r, h->backend, sizeof h->backend));
  return r->err;
}

void nwc_proto_put_model(nwc_pw *w, const nwc_proto_model *m) {
  nwc_pw_str(w, m->name);
  nwc_pw_u64(w, m->tensors), nwc_pw_u64(w, m->raw_bytes), nwc_pw_u64(w, m->nwc_bytes);
  nwc_pw_u64(w, m->resident_bytes), nwc_pw_i64(w, m->created), nwc_pw_i64(w, m->verified);
}
int nwc_proto_get_model(nwc_pr *r, nwc_proto_model *m) {
  NWC_TRY(nwc_pr_str(r, m->name, sizeof m->name));
  m->tensors = nwc_pr_u64(r), m->raw_bytes = nwc_pr_u64(r), m->nwc_bytes = nwc_pr_u64(r);
  m->resident_bytes = nwc_pr_u64(r), m->created = nwc_pr_i64(r), m->verified = nwc_pr_i64(r);
  return r->err;
}

/* The head of a tensor record and of a skipped tensor: name, ndim (at most 8), shape, dtype. */
static void put_named_shape(nwc_pw *w, const char *name, uint8_t ndim, const uint64_t *shape,
                            const char *dtype) {
  unsigned nd = ndim > 8 ? 8 : ndim;
  nwc_pw_str(w, name), nwc_pw_u8(w, (uint8_t)nd);
  for (unsigned i = 0; i < nd; i++) nwc_pw_u64(w, shape[i]);
  nwc_pw_str(w, dtype);
}
static int get_named_shape(nwc_pr *r, char name[NWC_PROTO_NAME_MAX], uint8_t *ndim,
                           uint64_t shape[8], char dtype[12], const char *what) {
  NWC_TRY(nwc_pr_str(r, name, NWC_PROTO_NAME_MAX));
  *ndim = nwc_pr_u8(r);
  NWC_RETURN_IF(*ndim > 8, -EBADMSG, "%s of %u dimensions", what, *ndim);
  for (unsigned i = 0; i < *ndim; i++) shape[i] = nwc_pr_u64(r);
  return nwc_pr_str(r, dtype, 12);
}

void nwc_proto_put_tensor(nwc_pw *w, const nwc_proto_tensor *t) {
  put_named_shape(w, t->name, t->ndim, t->shape, t->dtype);
  nwc_pw_u32(w, t->elem);
  nwc_pw_u64(w, t->rows), nwc_pw_u64(w, t->cols), nwc_pw_u64(w, t->raw_bytes);
  nwc_pw_u64(w, t->nwc_bytes);
  nwc_pw_u8(w, t->state), nwc_pw_u8(w, t->pinned), nwc_pw_u32(w, t->refs);
  nwc_pw_i64(w, t->last_used_ms);
}
int nwc_proto_get_tensor(nwc_pr *r, nwc_proto_tensor *t) {
  NWC_TRY(get_named_shape(r, t->name, &t->ndim, t->shape, t->dtype, "tensor"));
  t->elem = nwc_pr_u32(r);
  t->rows = nwc_pr_u64(r), t->cols = nwc_pr_u64(r), t->raw_bytes = nwc_pr_u64(r);
  t->nwc_bytes = nwc_pr_u64(r);
  t->state = nwc_pr_u8(r), t->pinned = nwc_pr_u8(r), t->refs = nwc_pr_u32(r);
  t->last_used_ms = nwc_pr_i64(r);
  return r->err;
}

void nwc_proto_put_info(nwc_pw *w, const nwc_proto_info *i) {
  nwc_pw_str(w, i->conversion), nwc_pw_str(w, i->path);
  nwc_pw_u64(w, i->offset), nwc_pw_u64(w, i->length), nwc_pw_u64(w, i->nchunks);
  nwc_pw_u64(w, i->nblocks), nwc_pw_u64(w, i->data_bytes), nwc_pw_u32(w, i->format_version);
}
int nwc_proto_get_info(nwc_pr *r, nwc_proto_info *i) {
  NWC_TRY(nwc_pr_str(r, i->conversion, sizeof i->conversion));
  NWC_TRY(nwc_pr_str(r, i->path, sizeof i->path));
  i->offset = nwc_pr_u64(r), i->length = nwc_pr_u64(r), i->nchunks = nwc_pr_u64(r);
  i->nblocks = nwc_pr_u64(r), i->data_bytes = nwc_pr_u64(r), i->format_version = nwc_pr_u32(r);
  return r->err;
}

void nwc_proto_put_ps(nwc_pw *w, const nwc_proto_ps *p) {
  nwc_pw_str(w, p->model), nwc_pw_str(w, p->tensor), nwc_pw_u64(w, p->bytes);
  nwc_pw_u8(w, p->pinned), nwc_pw_u8(w, p->locked), nwc_pw_u8(w, p->direct);
  nwc_pw_u32(w, p->refs), nwc_pw_i64(w, p->last_used_ms), nwc_pw_u32(w, p->maps);
  nwc_pw_u32(w, (uint32_t)p->device);
}
int nwc_proto_get_ps(nwc_pr *r, nwc_proto_ps *p) {
  NWC_TRY(nwc_pr_str(r, p->model, sizeof p->model));
  NWC_TRY(nwc_pr_str(r, p->tensor, sizeof p->tensor));
  p->bytes = nwc_pr_u64(r);
  p->pinned = nwc_pr_u8(r), p->locked = nwc_pr_u8(r), p->direct = nwc_pr_u8(r);
  p->refs = nwc_pr_u32(r), p->last_used_ms = nwc_pr_i64(r), p->maps = nwc_pr_u32(r);
  p->device = (int32_t)nwc_pr_u32(r);
  return r->err;
}

void nwc_proto_put_result(nwc_pw *w, const nwc_proto_result *r) {
  nwc_pw_u64(w, r->tensors), nwc_pw_u64(w, r->bytes), nwc_pw_u64(w, r->skipped);
  nwc_pw_u64(w, r->micros), nwc_pw_u64(w, r->direct), nwc_pw_u64(w, r->buffered);
  nwc_pw_u64(w, r->raw_bytes), nwc_pw_u64(w, r->chunks), nwc_pw_u64(w, r->problems);
}
int nwc_proto_get_result(nwc_pr *r, nwc_proto_result *o) {
  o->tensors = nwc_pr_u64(r), o->bytes = nwc_pr_u64(r), o->skipped = nwc_pr_u64(r);
  o->micros = nwc_pr_u64(r), o->direct = nwc_pr_u64(r), o->buffered = nwc_pr_u64(r);
  o->raw_bytes = nwc_pr_u64(r), o->chunks = nwc_pr_u64(r), o->problems = nwc_pr_u64(r);
  return r->err;
}

/* The fields of the tensor record's head. */
void nwc_proto_put_skipped(nwc_pw *w, const nwc_proto_skipped *s) {
  put_named_shape(w, s->name, s->ndim, s->shape, s->dtype);
}
int nwc_proto_get_skipped(nwc_pr *r, nwc_proto_skipped *s) {
  NWC_TRY(get_named_shape(r, s->name, &s->ndim, s->shape, s->dtype, "skipped tensor"));
  return r->err;
}

void nwc_proto_put_progress(nwc_pw *w, uint64_t done, uint64_t total) {
  nwc_pw_u64(w, done), nwc_pw_u64(w, total);
}
int nwc_proto_get_progress(nwc_pr *r, uint64_t *done, uint64_t *total) {
  *done = nwc_pr_u64(r), *total = nwc_pr_u64(r);
  return r->err;
}

void nwc_proto_put_compute(nwc_pw *w, const nwc_proto_compute *c) {
  nwc_pw_u64(w, c->rows), nwc_pw_u64(w, c->cols), nwc_pw_u8(w, c->out), nwc_pw_u8(w, c->where);
  nwc_pw_u16(w, c->rflags), nwc_pw_u64(w, c->bytes);
}
int nwc_proto_get_compute(nwc_pr *r, nwc_proto_compute *c) {
  c->rows = nwc_pr_u64(r), c->cols = nwc_pr_u64(r), c->out = nwc_pr_u8(r), c->where = nwc_pr_u8(r);
  c->rflags = nwc_pr_u16(r), c->bytes = nwc_pr_u64(r);
  return r->err;
}

void nwc_proto_put_map(nwc_pw *w, const nwc_proto_map *m) {
  nwc_pw_u64(w, m->size), nwc_pw_u64(w, m->length);
  nwc_pw_u32(w, m->format_version), nwc_pw_u32(w, m->elem);
  nwc_pw_u64(w, m->container), nwc_pw_u64(w, m->rows), nwc_pw_u64(w, m->cols);
  nwc_pw_u64(w, m->nblocks), nwc_pw_u64(w, m->data_bytes), nwc_pw_u64(w, m->raw_plane_bytes);
  nwc_pw_bytes(w, m->psym, 16);
  nwc_pw_u64(w, m->off_bases), nwc_pw_u64(w, m->off_hdr), nwc_pw_u64(w, m->off_data);
  nwc_pw_u64(w, m->off_raw), nwc_pw_u64(w, m->off_scale);
  nwc_pw_u32(w, m->maps), nwc_pw_u8(w, m->locked);
}
int nwc_proto_get_map(nwc_pr *r, nwc_proto_map *m) {
  m->size = nwc_pr_u64(r), m->length = nwc_pr_u64(r);
  m->format_version = nwc_pr_u32(r), m->elem = nwc_pr_u32(r);
  m->container = nwc_pr_u64(r), m->rows = nwc_pr_u64(r), m->cols = nwc_pr_u64(r);
  m->nblocks = nwc_pr_u64(r), m->data_bytes = nwc_pr_u64(r), m->raw_plane_bytes = nwc_pr_u64(r);
  const void *psym = nwc_pr_bytes(r, 16);
  if (psym) memcpy(m->psym, psym, 16);
  m->off_bases = nwc_pr_u64(r), m->off_hdr = nwc_pr_u64(r), m->off_data = nwc_pr_u64(r);
  m->off_raw = nwc_pr_u64(r), m->off_scale = nwc_pr_u64(r);
  m->maps = nwc_pr_u32(r), m->locked = nwc_pr_u8(r);
  NWC_RETURN_IF(!r->err && m->length > m->size, -EBADMSG, "map: blob of %llu bytes in a memfd of %llu",
                (unsigned long long)m->length, (unsigned long long)m->size);
  return r->err;
}

void nwc_proto_put_gmap_head(nwc_pw *w, const nwc_proto_gmap_head *h) {
  nwc_pw_u64(w, h->pool_id), nwc_pw_u32(w, (uint32_t)h->device);
  nwc_pw_bytes(w, h->uuid, 16), nwc_pw_u32(w, h->n);
}
int nwc_proto_get_gmap_head(nwc_pr *r, nwc_proto_gmap_head *h) {
  h->pool_id = nwc_pr_u64(r), h->device = (int32_t)nwc_pr_u32(r);
  const void *uuid = nwc_pr_bytes(r, 16);
  if (uuid) memcpy(h->uuid, uuid, 16);
  h->n = nwc_pr_u32(r);
  NWC_RETURN_IF(r->err, -EBADMSG, "map_gpu reply is truncated");
  NWC_RETURN_IF(h->device < 0, -EBADMSG, "map_gpu reply names device %d", (int)h->device);
  NWC_RETURN_IF(h->n > NWC_PROTO_GMAP_MAX, -EBADMSG, "map_gpu reply of %u tensors (at most %u)",
                h->n, NWC_PROTO_GMAP_MAX);
  return 0;
}

void nwc_proto_put_gmap(nwc_pw *w, const nwc_proto_gmap *g) {
  nwc_pw_str(w, g->name), nwc_pw_u32(w, g->elem);
  nwc_pw_u64(w, g->rows), nwc_pw_u64(w, g->cols), nwc_pw_u64(w, g->nblocks);
  nwc_pw_bytes(w, g->psym, 16), nwc_pw_bytes(w, g->export_data, NWC_PROTO_GMAP_EXPORT);
  nwc_pw_u64(w, g->bytes), nwc_pw_u64(w, g->off_tab), nwc_pw_u64(w, g->off_bases);
  nwc_pw_u64(w, g->off_hdr), nwc_pw_u64(w, g->off_data), nwc_pw_u64(w, g->off_raw);
  nwc_pw_u64(w, g->off_scale), nwc_pw_u32(w, g->maps);
}
int nwc_proto_get_gmap(nwc_pr *r, nwc_proto_gmap *g) {
  NWC_TRY(nwc_pr_str(r, g->name, sizeof g->name));
  g->elem = nwc_pr_u32(r);
  g->rows = nwc_pr_u64(r), g->cols = nwc_pr_u64(r), g->nblocks = nwc_pr_u64(r);
  const void *psym = nwc_pr_bytes(r, 16);
  if (psym) memcpy(g->psym, psym, 16);
  const void *ex = nwc_pr_bytes(r, NWC_PROTO_GMAP_EXPORT);
  if (ex) memcpy(g->export_data, ex, NWC_PROTO_GMAP_EXPORT);
  g->bytes = nwc_pr_u64(r), g->off_tab = nwc_pr_u64(r), g->off_bases = nwc_pr_u64(r);
  g->off_hdr = nwc_pr_u64(r), g->off_data = nwc_pr_u64(r), g->off_raw = nwc_pr_u64(r);
  g->off_scale = nwc_pr_u64(r), g->maps = nwc_pr_u32(r);
  NWC_RETURN_IF(r->err, -EBADMSG, "map_gpu tensor record is truncated");
  const uint64_t offs[] = {g->off_tab, g->off_bases, g->off_hdr, g->off_data, g->off_raw,
                           g->off_scale};
  for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++)
    NWC_RETURN_IF(offs[i] >= g->bytes, -EBADMSG,
                  "map_gpu: %s has an offset of %llu in an allocation of %llu bytes", g->name,
                  (unsigned long long)offs[i], (unsigned long long)g->bytes);
  return 0;
}

/* The message of the map socket: tok (the token, little-endian) with room for one descriptor. */
typedef union map_cmsg {
  char b[CMSG_SPACE(sizeof(int))];
  struct cmsghdr align;
} map_cmsg;

static void map_msg(struct msghdr *msg, struct iovec *iov, uint8_t tok[NWC_PROTO_MAP_TOKEN],
                    map_cmsg *cm) {
  *iov = (struct iovec){tok, NWC_PROTO_MAP_TOKEN};
  *msg = (struct msghdr){.msg_iov = iov, .msg_iovlen = 1, .msg_control = cm->b,
                         .msg_controllen = sizeof cm->b};
}

int nwc_proto_map_send(int sock, int memfd, uint64_t token) {
  uint8_t tok[NWC_PROTO_MAP_TOKEN];
  put_le(tok, token, NWC_PROTO_MAP_TOKEN);
  struct msghdr msg;
  struct iovec iov;
  map_cmsg cm;
  map_msg(&msg, &iov, tok, &cm);
  struct cmsghdr *h = CMSG_FIRSTHDR(&msg);
  h->cmsg_level = SOL_SOCKET, h->cmsg_type = SCM_RIGHTS, h->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(h), &memfd, sizeof memfd);
  ssize_t n = sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  NWC_RETURN_IF(n != NWC_PROTO_MAP_TOKEN, n < 0 ? -errno : -EIO,
                "sending the memfd over the map socket: %s", n < 0 ? strerror(errno) : "short");
  return 0;
}

int nwc_proto_map_recv(int sock, uint64_t token, int *memfd) {
  uint8_t tok[NWC_PROTO_MAP_TOKEN];
  struct msghdr msg;
  struct iovec iov;
  map_cmsg cm;
  map_msg(&msg, &iov, tok, &cm);
  ssize_t n = recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  struct cmsghdr *h = n > 0 ? CMSG_FIRSTHDR(&msg) : NULL;
  NWC_RETURN_IF(!h || h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS ||
                    h->cmsg_len != CMSG_LEN(sizeof(int)),
                -EBADMSG, "no memfd came over the map socket (%s)",
                n < 0 ? strerror(errno) : "no descriptor");
  memcpy(memfd, CMSG_DATA(h), sizeof *memfd);
  if (n != NWC_PROTO_MAP_TOKEN || (msg.msg_flags & MSG_CTRUNC) ||
      get_le(tok, NWC_PROTO_MAP_TOKEN) != token) {
    close(*memfd);
    return nwc__fail(-EBADMSG, "the memfd on the map socket belongs to another request");
  }
  return 0;
}

#define STATS_FIELDS(X)                                                                          \
  X(uptime_ms) X(connections) X(conn_total) X(requests) X(errors) X(budget) X(resident_bytes)    \
  X(pinned_bytes) X(resident_tensors) X(loads) X(load_bytes) X(load_us) X(direct_loads)          \
  X(buffered_loads) X(evictions) X(mlock_ok) X(mlock_failed) X(mapped_computes)                  \
  X(batched_passes) X(batched_columns) X(threads) X(gpu_budget) X(gpu_resident_bytes)

void nwc_proto_put_stats(nwc_pw *w, const nwc_proto_stats *s) {
#define PUT(f) nwc_pw_u64(w, s->f);
  STATS_FIELDS(PUT)
#undef PUT
  nwc_pw_str(w, s->backend);
}
int nwc_proto_get_stats(nwc_pr *r, nwc_proto_stats *s) {
#define GET(f) s->f = nwc_pr_u64(r);
  STATS_FIELDS(GET)
#undef GET
  NWC_TRY(nwc_pr_str(r, s->backend, sizeof s->backend));
  return r->err;
}

void nwc_proto_put_place(nwc_pw *w, const nwc_proto_place *p) {
  nwc_pw_str(w, p->name);
  nwc_pw_u64(w, p->budget), nwc_pw_u64(w, p->resident_bytes), nwc_pw_u64(w, p->resident_tensors);
  nwc_pw_u64(w, p->pinned_bytes), nwc_pw_u64(w, p->mem_free), nwc_pw_u64(w, p->mem_total);
  nwc_pw_u64(w, p->pool_idle);
}
int nwc_proto_get_place(nwc_pr *r, nwc_proto_place *p) {
  NWC_TRY(nwc_pr_str(r, p->name, sizeof p->name));
  p->budget = nwc_pr_u64(r), p->resident_bytes = nwc_pr_u64(r), p->resident_tensors = nwc_pr_u64(r);
  p->pinned_bytes = nwc_pr_u64(r), p->mem_free = nwc_pr_u64(r), p->mem_total = nwc_pr_u64(r);
  p->pool_idle = nwc_pr_u64(r);
  return r->err;
}
