/*
 * test_daemon_proto.c - golden frames of the nwcd protocol (docs/protocol.md): every request
 * opcode and the reply shapes are encoded from fixed values and compared byte for byte with
 * tests/golden/protocol/NAME.bin, then decoded back and re-encoded.  Also: every truncation and
 * one-byte extension of each golden request is refused by the decoder (exact lengths), and the
 * header checks (magic, flags, oversized).  NWC_GOLDEN_WRITE=1 rewrites the files (only when the
 * protocol version changes: the point is that no change moves a bit silently).
 */
#include "nwc_proto.h"
#include "test_util.h"

#include "nwc.h"

#include <errno.h>

static const char *golden_dir;
static int writing;

static uint8_t *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc(sz > 0 ? (size_t)sz : 1);
  *n = fread(b, 1, (size_t)sz, f);
  fclose(f);
  return b;
}

static void golden(const char *name, const uint8_t *buf, size_t len) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s.bin", golden_dir, name);
  if (writing) {
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(buf, 1, len, f) == len, "write %s", path);
    if (f) fclose(f);
    return;
  }
  size_t n = 0;
  uint8_t *g = read_file(path, &n);
  CHECK(g, "missing golden file %s", path);
  if (!g) return;
  CHECK(n == len && !memcmp(g, buf, len), "%s: encoding differs from the golden file (%zu vs %zu bytes)",
        name, len, n);
  free(g);
}

static void check_request(const char *name, nwc_proto_req *r) {
  nwc_pw w;
  nwc_pw_init(&w);
  int64_t n = nwc_proto_req_encode(r, &w);
  CHECK(n >= NWC_PROTO_HEADER, "%s: encode %lld", name, (long long)n);
  if (n < NWC_PROTO_HEADER) return;
  golden(name, w.buf, (size_t)n);
  nwc_proto_hdr h;
  CHECK_RC(nwc_proto_hdr_decode(w.buf, &h));
  CHECK(h.length == (size_t)n - NWC_PROTO_HEADER && h.op == r->op && h.id == r->id, "%s: header", name);
  nwc_proto_req d;
  int rc = nwc_proto_req_decode(&h, w.buf + NWC_PROTO_HEADER, &d);
  CHECK(rc == 0, "%s: decode %d (%s)", name, rc, nwc_error_detail());
  /* Re-encode the decoded request: the same bytes. */
  nwc_pw w2;
  nwc_pw_init(&w2);
  d.flags = 0;
  int64_t n2 = nwc_proto_req_encode(&d, &w2);
  CHECK(n2 == n && !memcmp(w.buf, w2.buf, (size_t)n), "%s: decode/encode round trip differs", name);
  nwc_pw_free(&w2);
  nwc_proto_req_clear(&d);
  /* Exact lengths: every shorter payload and one longer are refused. */
  uint8_t *p = malloc((size_t)n + 1);
  memcpy(p, w.buf, (size_t)n);
  p[n] = 0;
  for (uint32_t len = 0; len <= h.length + 1; len++) {
    if (len == h.length) continue;
    nwc_proto_hdr h2 = h;
    h2.length = len;
    rc = nwc_proto_req_decode(&h2, p + NWC_PROTO_HEADER, &d);
    CHECK(rc == -EBADMSG, "%s: payload of %u bytes (not %u) decoded with %d", name, len, h.length, rc);
    nwc_proto_req_clear(&d);
  }
  free(p);
  nwc_pw_free(&w);
}

/* A reply frame: encode, compare, hand the payload to the checker. */
static void check_reply(const char *name, nwc_pw *w, uint16_t op, uint16_t flags, int32_t status,
                        uint64_t id) {
  int64_t n = nwc_pw_finish(w, op, flags, status, id);
  CHECK(n >= NWC_PROTO_HEADER, "%s: finish", name);
  if (n < NWC_PROTO_HEADER) return;
  golden(name, w->buf, (size_t)n);
  nwc_proto_hdr h;
  CHECK_RC(nwc_proto_hdr_decode(w->buf, &h));
  CHECK(h.op == op && h.flags == flags && h.status == status && h.id == id, "%s: header fields", name);
}

/* map_gpu's reply: the head and two tensor records (a layout-0 matrix, a layout-2 one with row
 * scales), decoded back; a record whose offset lies past its allocation, a head naming a
 * negative device or too many tensors, and a truncated record are refused. */
static void check_gmap(void) {
  nwc_proto_gmap_head hd = {0x0123456789abcdefull, 1, {0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc,
                            0xfe, 1, 2, 3, 4, 5, 6, 7, 8}, 2}, hd2;
  nwc_proto_gmap g[2] = {
      {"enc/layer_0/W", 0, 512, 1536, 192, {0x7c, 0x7b, 0x7d, 0x7a, 0x7e, 0x79, 0x78, 0x7f, 0x77,
       0x76, 0x75, 0x80, 0x74, 0x73, 0x72, 0x71}, {0}, 1097728, 0, 16384 + 128, 16384 + 1728,
       16384 + 7872, 16384 + 1056448, 0, 2},
      {"enc/layer_1/W", 0x21, 1536, 512, 96, {0}, {0}, 1000000, 0, 16384, 16512, 20000, 900000,
       990000, 1}};
  for (int i = 0; i < 64; i++) g[0].export_data[i] = (uint8_t)(i * 7 + 1), g[1].export_data[i] = (uint8_t)(255 - i);
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_put_gmap_head(&w, &hd);
  for (int i = 0; i < 2; i++) nwc_proto_put_gmap(&w, &g[i]);
  check_reply("rep_map_gpu", &w, NWC_OP_MAP_GPU, 0, 0, 16);
  nwc_pr pr;
  nwc_pr_init(&pr, w.buf + NWC_PROTO_HEADER, w.len - NWC_PROTO_HEADER);
  nwc_proto_gmap g2;
  CHECK(nwc_proto_get_gmap_head(&pr, &hd2) == 0 && !memcmp(&hd, &hd2, sizeof hd), "gmap head");
  for (int i = 0; i < 2; i++) {
    memset(&g2, 0, sizeof g2);
    CHECK(nwc_proto_get_gmap(&pr, &g2) == 0 && !memcmp(&g[i], &g2, sizeof g2), "gmap %d", i);
  }
  CHECK(nwc_pr_end(&pr, "map_gpu") == 0, "map_gpu reply end");
  /* every offset beyond the allocation, one at a time */
  uint64_t *offs[] = {&g[1].off_tab, &g[1].off_bases, &g[1].off_hdr, &g[1].off_data,
                      &g[1].off_raw, &g[1].off_scale};
  for (int k = 0; k < 6; k++) {
    uint64_t keep = *offs[k];
    *offs[k] = g[1].bytes;
    nwc_pw_free(&w);
    nwc_pw_init(&w);
    nwc_proto_put_gmap(&w, &g[1]);
    nwc_pr_init(&pr, w.buf + NWC_PROTO_HEADER, w.len - NWC_PROTO_HEADER);
    CHECK(nwc_proto_get_gmap(&pr, &g2) == -EBADMSG, "gmap offset %d past its allocation", k);
    *offs[k] = keep;
  }
  /* every truncation of a record */
  nwc_pw_free(&w);
  nwc_pw_init(&w);
  nwc_proto_put_gmap(&w, &g[0]);
  for (size_t n = 0; n < w.len - NWC_PROTO_HEADER; n++) {
    nwc_pr_init(&pr, w.buf + NWC_PROTO_HEADER, n);
    CHECK(nwc_proto_get_gmap(&pr, &g2) < 0, "gmap record truncated to %zu bytes accepted", n);
  }
  nwc_proto_gmap_head bad[] = {{1, -1, {0}, 1}, {1, 0, {0}, NWC_PROTO_GMAP_MAX + 1}};
  for (int k = 0; k < 2; k++) {
    nwc_pw_free(&w);
    nwc_pw_init(&w);
    nwc_proto_put_gmap_head(&w, &bad[k]);
    nwc_pr_init(&pr, w.buf + NWC_PROTO_HEADER, w.len - NWC_PROTO_HEADER);
    CHECK(nwc_proto_get_gmap_head(&pr, &hd2) == -EBADMSG, "bad gmap head %d accepted", k);
  }
  nwc_pw_free(&w);
  /* a map_gpu request naming no device (-1, the host's number elsewhere) */
  nwc_proto_req r = {.op = NWC_OP_MAP_GPU, .id = 18, .device = -1}, r2;
  strcpy(r.model, "use-lite");
  nwc_pw_init(&w);
  int64_t n = nwc_proto_req_encode(&r, &w);
  nwc_proto_hdr h;
  CHECK(n > 0 && nwc_proto_hdr_decode(w.buf, &h) == 0 &&
            nwc_proto_req_decode(&h, w.buf + NWC_PROTO_HEADER, &r2) == -EBADMSG,
        "map_gpu on device -1 accepted");
  nwc_proto_req_clear(&r2);
  nwc_pw_free(&w);
}

int main(void) {
  test_seed("test_daemon_proto");
  const char *src = getenv("NWC_SOURCE_DIR");
  static char dir[1024];
  snprintf(dir, sizeof dir, "%s/tests/golden/protocol", src ? src : ".");
  golden_dir = dir;
  writing = getenv("NWC_GOLDEN_WRITE") && *getenv("NWC_GOLDEN_WRITE") == '1';

  nwc_proto_req r;
  memset(&r, 0, sizeof r);
  r.op = NWC_OP_HELLO, r.id = 1, r.ver_min = 1, r.ver_max = 1, r.caps = 15;
  strcpy(r.client, "libnwc-client");
  check_request("req_hello", &r);

  memset(&r, 0, sizeof r);
  r.op = NWC_OP_SHM, r.id = 2, r.shm_size = 256u << 20;
  check_request("req_shm", &r);

  memset(&r, 0, sizeof r);
  r.op = NWC_OP_MODELS, r.id = 3;
  check_request("req_models", &r);
  r.op = NWC_OP_STATS, r.id = 4;
  check_request("req_stats", &r);
  r.op = NWC_OP_PS, r.id = 5;
  check_request("req_ps", &r);
  r.op = NWC_OP_DEVICES, r.id = 30;
  check_request("req_devices", &r);

  memset(&r, 0, sizeof r);
  strcpy(r.model, "use-lite");
  r.op = NWC_OP_TENSORS, r.id = 6;
  check_request("req_tensors", &r);
  r.op = NWC_OP_REMOVE, r.id = 7;
  check_request("req_remove", &r);
  r.op = NWC_OP_VERIFY, r.id = 8;
  check_request("req_verify", &r);
  strcpy(r.tensor, "enc/layer_0/W");
  static const struct { int op; const char *name; } two[] = {
      {NWC_OP_INFO, "req_info"}, {NWC_OP_LOAD, "req_load"},   {NWC_OP_EVICT, "req_evict"},
      {NWC_OP_PIN, "req_pin"},   {NWC_OP_UNPIN, "req_unpin"}};
  for (int i = 0; i < 5; i++) {
    r.op = (uint16_t)two[i].op, r.id = 9 + (uint64_t)i;
    check_request(two[i].name, &r);
  }

  r.op = NWC_OP_MAP, r.id = 15; /* its descriptor is the mapping's socket */
  check_request("req_map", &r);
  r.op = NWC_OP_MAP_GPU, r.id = 16, r.device = 1; /* the same, on cuda:1 */
  check_request("req_map_gpu", &r);
  r.tensor[0] = 0, r.id = 17, r.device = 0; /* the whole model */
  check_request("req_map_gpu_model", &r);

  memset(&r, 0, sizeof r);
  char *files[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
  r.op = NWC_OP_IMPORT, r.id = 20, r.elem = 1, r.layout = 2, r.has_index = 1, r.nfiles = 2;
  r.files = files;
  strcpy(r.model, "qwen3-4b");
  check_request("req_import", &r);
  r.op = NWC_OP_IMPORT2, r.id = 29, r.import_flags = NWC_IMPORT_STRICT;
  check_request("req_import2", &r);

  memset(&r, 0, sizeof r);
  r.op = NWC_OP_PULL, r.id = 31, r.registry_flags = NWC_REGISTRY_PLAIN_HTTP;
  strcpy(r.ref, "registry.example:5000/models/qwen3-4b:v1");
  strcpy(r.user, "alice"), strcpy(r.secret, "s3cret");
  check_request("req_pull", &r);
  r.op = NWC_OP_PUSH, r.id = 32, r.registry_flags = 0;
  strcpy(r.model, "qwen3-4b"), r.user[0] = r.secret[0] = 0;
  check_request("req_push", &r);

  memset(&r, 0, sizeof r);
  strcpy(r.model, "use-lite"), strcpy(r.tensor, "emb");
  r.op = NWC_OP_DEQUANT, r.id = 21, r.out = NWC_OUT_BF16, r.where = NWC_WHERE_SHM;
  r.out_off = 4096, r.out_cap = 1u << 20;
  check_request("req_dequant", &r);
  uint8_t rows[24] = {5, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x41, 0x1f, 0, 0, 0, 0, 0, 0};
  r.op = NWC_OP_GATHER, r.id = 22, r.out = NWC_OUT_F32, r.where = NWC_WHERE_INLINE;
  r.out_off = r.out_cap = 0, r.nrows = 3, r.rows = rows;
  check_request("req_gather", &r);

  memset(&r, 0, sizeof r);
  strcpy(r.model, "use-lite"), strcpy(r.tensor, "W"), strcpy(r.bias, "b");
  float x[2 * 4] = {1, -2, 0.5f, 0, 3, 4, -0.25f, 8};
  r.op = NWC_OP_MATVEC, r.id = 23, r.scale = 0.5f, r.ncols = 2, r.out = NWC_OUT_F32;
  r.where = NWC_WHERE_INLINE, r.x = (const uint8_t *)x, r.x_bytes = sizeof x;
  check_request("req_matvec", &r);
  r.id = 24, r.where = NWC_WHERE_SHM, r.x = NULL, r.in_off = 0, r.out_off = 64, r.out_cap = 4096;
  check_request("req_matvec_shm", &r);

  /* Issue 8: placement and CUDA IPC. */
  memset(&r, 0, sizeof r);
  strcpy(r.model, "use-lite"), strcpy(r.tensor, "W");
  r.op = NWC_OP_LOAD_ON, r.id = 25, r.load_flags = NWC_LOAD_PIN, r.device = 0;
  check_request("req_load_on", &r);
  r.id = 26, r.load_flags = 0, r.device = NWC_DEVICE_CPU;
  check_request("req_load_on_cpu", &r);
  r.op = NWC_OP_EVICT_ON, r.id = 33, r.device = 1; /* the replica on cuda:1 */
  check_request("req_evict_on", &r);
  r.id = 34, r.device = NWC_DEVICE_CPU, r.tensor[0] = 0; /* the model's replicas in host memory */
  check_request("req_evict_on_cpu", &r);
  {
    nwc_proto_req bad = r, got;
    bad.device = -2; /* below the host's -1 */
    nwc_pw w;
    nwc_pw_init(&w);
    nwc_proto_hdr h;
    CHECK(nwc_proto_req_encode(&bad, &w) > 0 && nwc_proto_hdr_decode(w.buf, &h) == 0 &&
              nwc_proto_req_decode(&h, w.buf + NWC_PROTO_HEADER, &got) == -EBADMSG,
          "evict_on device -2 accepted");
    nwc_proto_req_clear(&got);
    nwc_pw_free(&w);
  }
  /* load_places: host memory, cuda:0 and cuda:1 pinned from one read; the model into host
   * memory; the model split over cuda:0 and host memory, pinned.  Flags other than bit 0 (pin)
   * and bit 1 (split) are refused (places 0 and places the daemon lacks are the op's errors,
   * test_daemon_basic). */
  strcpy(r.tensor, "W");
  r.op = NWC_OP_LOAD_PLACES, r.id = 35, r.load_flags = NWC_LOAD_PIN, r.device = 0;
  r.places = NWC_PLACE_BIT(NWC_DEVICE_CPU) | NWC_PLACE_BIT(0) | NWC_PLACE_BIT(1);
  CHECK(r.places == 7, "places mask of host, cuda:0, cuda:1: %llu", (unsigned long long)r.places);
  check_request("req_load_places", &r);
  r.id = 36, r.load_flags = 0, r.places = NWC_PLACE_BIT(NWC_DEVICE_CPU), r.tensor[0] = 0;
  check_request("req_load_places_cpu", &r);
  r.id = 37, r.load_flags = NWC_LOAD_PIN | NWC_LOAD_SPLIT;
  r.places = NWC_PLACE_BIT(NWC_DEVICE_CPU) | NWC_PLACE_BIT(0);
  check_request("req_load_places_split", &r);
  for (unsigned bit = 2; bit < 8; bit++) {
    nwc_proto_req bad = r, got;
    bad.load_flags = (uint8_t)(NWC_LOAD_SPLIT | 1u << bit);
    nwc_pw w;
    nwc_pw_init(&w);
    nwc_proto_hdr h;
    CHECK(nwc_proto_req_encode(&bad, &w) > 0 && nwc_proto_hdr_decode(w.buf, &h) == 0 &&
              nwc_proto_req_decode(&h, w.buf + NWC_PROTO_HEADER, &got) == -EBADMSG,
          "load_places flags 0x%x accepted", bad.load_flags);
    nwc_proto_req_clear(&got);
    nwc_pw_free(&w);
  }
  memset(&r, 0, sizeof r);
  strcpy(r.model, "use-lite"), strcpy(r.tensor, "W"), strcpy(r.bias, "b");
  r.op = NWC_OP_MATVEC_IPC, r.id = 27, r.scale = 0.5f, r.ncols = 2, r.out = NWC_OUT_BF16;
  for (int i = 0; i < NWC_PROTO_IPC_HANDLE; i++)
    r.ipc_x[i] = (uint8_t)i, r.ipc_y[i] = (uint8_t)(0x80 + i), r.ipc_event[i] = (uint8_t)(0xff - i);
  r.in_off = 256, r.x_bytes = 2 * 1536 * 4, r.out_off = 65536, r.out_cap = 2 * 512 * 2;
  r.has_event = 1;
  check_request("req_matvec_ipc", &r);
  r.op = NWC_OP_DEQUANT_IPC, r.id = 28, r.has_event = 0, r.out = NWC_OUT_F32;
  r.bias[0] = 0, r.scale = 0, r.ncols = 0, r.in_off = r.x_bytes = 0;
  memset(r.ipc_x, 0, sizeof r.ipc_x), memset(r.ipc_event, 0, sizeof r.ipc_event);
  r.out_cap = 512 * 1536 * 4;
  check_request("req_dequant_ipc", &r);

  /* Replies. */
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_hello hello = {1, 15, NWC_PROTO_MAX_PAYLOAD, "nwcd 0.1.0", "cpu"};
  nwc_proto_put_hello(&w, &hello);
  check_reply("rep_hello", &w, NWC_OP_HELLO, 0, 0, 1);
  nwc_pr pr;
  nwc_pr_init(&pr, w.buf + NWC_PROTO_HEADER, w.len - NWC_PROTO_HEADER);
  nwc_proto_hello h2;
  CHECK(nwc_proto_get_hello(&pr, &h2) == 0 && nwc_pr_end(&pr, "hello") == 0 && h2.caps == 15 &&
        !strcmp(h2.backend, "cpu"), "hello decode");
  nwc_pw_free(&w);

  nwc_pw_init(&w);
  nwc_pw_str(&w, "protocol 2 not supported (this daemon speaks 1)");
  check_reply("rep_error_version", &w, NWC_OP_HELLO, 0, -EPROTONOSUPPORT, 1);
  nwc_pw_free(&w);

  nwc_pw_init(&w);
  nwc_proto_model m = {"use-lite", 35, 13951754, 9822208, 4096, 1764547200, 0};
  nwc_pw_u32(&w, 1);
  nwc_proto_put_model(&w, &m);
  check_reply("rep_models", &w, NWC_OP_MODELS, 0, 0, 3);
  nwc_pr_init(&pr, w.buf + NWC_PROTO_HEADER, w.len - NWC_PROTO_HEADER);
  nwc_proto_model m2;
  CHECK(nwc_pr_u32(&pr) == 1 && nwc_proto_get_model(&pr, &m2) == 0 && nwc_pr_end(&pr, "m") == 0 &&
        !memcmp(&m, &m2, sizeof m - sizeof m.name + 0) , "models decode");
  nwc_pw_free(&w);

  nwc_pw_init(&w);
  nwc_proto_tensor t = {"W", 2, {512, 1536}, "BF16", 0, 512, 1536, 1572864, 1081344,
                        NWC_RES_RESIDENT, 1, 2, 17};
  nwc_pw_u32(&w, 1);
  nwc_proto_put_tensor(&w, &t);
  check_reply("rep_tensors", &w, NWC_OP_TENSORS, 0, 0, 6);
  nwc_pr_init(&pr, w.buf + NWC_PROTO_HEADER, w.len - NWC_PROTO_HEADER);
  nwc_proto_tensor t2;
  CHECK(nwc_pr_u32(&pr) == 1 && nwc_proto_get_tensor(&pr, &t2) == 0 && nwc_pr_end(&pr, "t") == 0 &&
        t2.shape[1] == 1536 && t2.nwc_bytes == 1081344 && t2.last_used_ms == 17, "tensors decode");
  nwc_pw_free(&w);

  nwc_pw_init(&w);
  nwc_proto_put_progress(&w, 1 << 20, 9822208);
  check_reply("rep_progress", &w, NWC_OP_LOAD, NWC_PF_EVENT, 0, 10);
  nwc_pw_free(&w);

  nwc_pw_init(&w);
  nwc_proto_result res = {35, 9822208, 0, 22000, 35, 0, 0, 0, 0};
  nwc_proto_put_result(&w, &res);
  check_reply("rep_load", &w, NWC_OP_LOAD, 0, 0, 10);
  nwc_pw_free(&w);

  /* pull: the result, then the manifest's digest. */
  nwc_pw_init(&w);
  nwc_proto_result pres = {35, 10584064, 0, 310000, 0, 0, 13951690, 0, 0};
  nwc_proto_put_result(&w, &pres);
  nwc_pw_str(&w, "sha256:b27257e1ad4764a889fa361a043fb0bba39334fd849cbdaf189443d58d810fce");
  check_reply("rep_pull", &w, NWC_OP_PULL, 0, 0, 31);
  nwc_pw_free(&w);

  /* import2: the result, then the skipped tensors. */
  nwc_pw_init(&w);
  nwc_proto_result ires = {34, 9822208, 2, 510000, 0, 0, 13951690, 0, 0};
  nwc_proto_put_result(&w, &ires);
  nwc_proto_skipped sk[2] = {{"position_ids", "I64", 2, {1, 512}}, {"attention.masked_bias", "BOOL", 0, {0}}};
  nwc_pw_u32(&w, 2);
  for (int i = 0; i < 2; i++) nwc_proto_put_skipped(&w, &sk[i]);
  check_reply("rep_import2", &w, NWC_OP_IMPORT2, 0, 0, 29);
  nwc_pr_init(&pr, w.buf + NWC_PROTO_HEADER, w.len - NWC_PROTO_HEADER);
  nwc_proto_result ires2;
  nwc_proto_skipped sk2[2];
  CHECK(nwc_proto_get_result(&pr, &ires2) == 0 && ires2.skipped == 2 && nwc_pr_u32(&pr) == 2 &&
            nwc_proto_get_skipped(&pr, &sk2[0]) == 0 && nwc_proto_get_skipped(&pr, &sk2[1]) == 0 &&
            nwc_pr_end(&pr, "import2") == 0 && !strcmp(sk2[0].name, "position_ids") &&
            sk2[0].ndim == 2 && sk2[0].shape[1] == 512 && !strcmp(sk2[0].dtype, "I64") &&
            !strcmp(sk2[1].dtype, "BOOL") && sk2[1].ndim == 0,
        "import2 reply decode");
  nwc_pw_free(&w);

  nwc_pw_init(&w);
  nwc_proto_compute c = {2, 3, NWC_OUT_F32, NWC_WHERE_INLINE, NWC_RF_BATCHED, 24};
  nwc_proto_put_compute(&w, &c);
  float y[6] = {1, 2, 3, -1, -2, -3};
  nwc_pw_bytes(&w, y, sizeof y);
  check_reply("rep_matvec", &w, NWC_OP_MATVEC, 0, 0, 23);
  nwc_pr_init(&pr, w.buf + NWC_PROTO_HEADER, w.len - NWC_PROTO_HEADER);
  nwc_proto_compute c2;
  CHECK(nwc_proto_get_compute(&pr, &c2) == 0 && c2.bytes == 24 && nwc_pr_bytes(&pr, 24) &&
        nwc_pr_end(&pr, "c") == 0, "compute decode");
  nwc_pw_free(&w);

  nwc_pw_init(&w);
  nwc_proto_map mp = {1085440, 1081344, 11, 0, 3, 512, 1536, 192, 1048576, 786432,
                      {0x7c, 0x7b, 0x7d, 0x7a, 0x7e, 0x79, 0x78, 0x7f, 0x77, 0x76, 0x75, 0x80,
                       0x74, 0x73, 0x72, 0x71},
                      128, 1728, 7872, 1056448, 0, 2, 1};
  nwc_proto_put_map(&w, &mp);
  check_reply("rep_map", &w, NWC_OP_MAP, 0, 0, 15);
  nwc_pr_init(&pr, w.buf + NWC_PROTO_HEADER, w.len - NWC_PROTO_HEADER);
  nwc_proto_map mp2;
  CHECK(nwc_proto_get_map(&pr, &mp2) == 0 && nwc_pr_end(&pr, "map") == 0 &&
        !memcmp(&mp, &mp2, sizeof mp), "map decode");
  mp.length = mp.size + 1; /* a blob larger than its memfd */
  nwc_pw_free(&w);
  nwc_pw_init(&w);
  nwc_proto_put_map(&w, &mp);
  nwc_pr_init(&pr, w.buf + NWC_PROTO_HEADER, w.len - NWC_PROTO_HEADER);
  CHECK(nwc_proto_get_map(&pr, &mp2) == -EBADMSG, "map reply with length > size accepted");
  nwc_pw_free(&w);

  check_gmap();

  nwc_pw_init(&w);
  nwc_proto_ps ps = {"use-lite", "W", 1081344, 1, 1, 1, 0, 250, 2, 0};
  nwc_pw_u32(&w, 1);
  nwc_proto_put_ps(&w, &ps);
  check_reply("rep_ps", &w, NWC_OP_PS, 0, 0, 5);
  nwc_pr_init(&pr, w.buf + NWC_PROTO_HEADER, w.len - NWC_PROTO_HEADER);
  nwc_proto_ps ps2;
  CHECK(nwc_pr_u32(&pr) == 1 && nwc_proto_get_ps(&pr, &ps2) == 0 && nwc_pr_end(&pr, "ps") == 0 &&
        ps2.maps == 2 && ps2.bytes == 1081344 && ps2.last_used_ms == 250 && ps2.device == 0,
        "ps decode");
  nwc_pw_free(&w);

  /* devices: the host, then each GPU */
  nwc_pw_init(&w);
  nwc_proto_place pl[2] = {
      {"cpu", 8ull << 30, 9666560, 35, 1081344, 250ull << 30, 1007ull << 30, 0},
      {"cuda:0", 129ull << 30, 9682944, 2, 0, 139ull << 30, 143771533312ull, 2097152}};
  nwc_pw_u32(&w, 2);
  for (int i = 0; i < 2; i++) nwc_proto_put_place(&w, &pl[i]);
  check_reply("rep_devices", &w, NWC_OP_DEVICES, 0, 0, 30);
  nwc_pr_init(&pr, w.buf + NWC_PROTO_HEADER, w.len - NWC_PROTO_HEADER);
  nwc_proto_place pl2[2];
  memset(pl2, 0, sizeof pl2); /* the names' bytes after their NUL */
  CHECK(nwc_pr_u32(&pr) == 2 && nwc_proto_get_place(&pr, &pl2[0]) == 0 &&
            nwc_proto_get_place(&pr, &pl2[1]) == 0 && nwc_pr_end(&pr, "devices") == 0 &&
            !memcmp(pl, pl2, sizeof pl),
        "devices decode");
  nwc_pw_free(&w);

  nwc_pw_init(&w);
  nwc_proto_compute cd = {2, 512, NWC_OUT_BF16, NWC_WHERE_DEVICE, 0, 2048};
  nwc_proto_put_compute(&w, &cd);
  check_reply("rep_matvec_ipc", &w, NWC_OP_MATVEC_IPC, 0, 0, 27);
  nwc_pw_free(&w);

  /* Header checks. */
  uint8_t hb[NWC_PROTO_HEADER];
  nwc_proto_hdr hh = {NWC_PROTO_MAGIC, NWC_PROTO_MAX_PAYLOAD + 1, NWC_OP_MODELS, 0, 0, 1}, out;
  nwc_proto_hdr_encode(&hh, hb);
  CHECK(nwc_proto_hdr_decode(hb, &out) == -EMSGSIZE, "oversized frame accepted");
  hh.length = 0, hh.magic = 0x12345678;
  nwc_proto_hdr_encode(&hh, hb);
  CHECK(nwc_proto_hdr_decode(hb, &out) == -EBADMSG, "bad magic accepted");
  hh.magic = NWC_PROTO_MAGIC, hh.flags = 0x80;
  nwc_proto_hdr_encode(&hh, hb);
  CHECK(nwc_proto_hdr_decode(hb, &out) == -EBADMSG, "unknown flags accepted");
  hh.flags = 0, hh.op = 999;
  nwc_proto_hdr_encode(&hh, hb);
  CHECK(nwc_proto_hdr_decode(hb, &out) == 0, "header with an unknown op must pass the header check");
  CHECK(nwc_proto_req_decode(&out, hb, &r) == -EOPNOTSUPP, "unknown op not refused");
  hh.op = NWC_OP_MODELS, hh.flags = NWC_PF_FDS;
  nwc_proto_hdr_encode(&hh, hb);
  nwc_proto_hdr_decode(hb, &out);
  CHECK(nwc_proto_req_decode(&out, hb, &r) == -EBADMSG, "descriptor flag on models accepted");
  hh.flags = NWC_PF_ALONE; /* the daemon's flag, in a request */
  nwc_proto_hdr_encode(&hh, hb);
  CHECK(nwc_proto_hdr_decode(hb, &out) == 0, "the alone flag must pass the header check");
  CHECK(nwc_proto_req_decode(&out, hb, &r) == -EBADMSG, "a request with the alone flag accepted");
  /* Random payloads never crash the decoders. */
  uint8_t rnd[256];
  for (int it = 0; it < 20000; it++) {
    size_t len = test_below(sizeof rnd + 1);
    for (size_t i = 0; i < len; i++) rnd[i] = (uint8_t)test_rand();
    nwc_proto_hdr rh = {NWC_PROTO_MAGIC, (uint32_t)len, (uint16_t)test_below(NWC_OP_COUNT + 2),
                        (uint16_t)test_below(8), 0, 7};
    nwc_proto_req_decode(&rh, rnd, &r);
    nwc_proto_req_clear(&r);
  }
  return test_exit("test_daemon_proto");
}
