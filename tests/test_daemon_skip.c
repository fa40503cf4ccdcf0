/*
 * test_daemon_skip.c - importing a checkpoint that holds tensors nwc does not store, through a
 * real nwcd over its socket.  The file (written here, random values) has BF16 and F32 weights
 * next to I64 position ids, a BOOL mask and an I32 buffer.  nwc_client_import2 succeeds, the
 * reply names the skipped tensors with dtype and shape in file order, the weights dequantize bit
 * for bit to the file's values (F32 rounded to nearest even) and the model lists only them.
 * Strict fails naming the first skipped tensor and publishes nothing; so does the old import
 * opcode (its clients cannot hear what was skipped); import2 with unknown flags is -EBADMSG; a
 * file of only I64 fails clearly; an I64 tensor of the wrong size is still -EBADMSG.  The hello
 * reply offers capability 256.
 */
#include "test_daemon_util.h"
#include "test_store_util.h"

#include "nwc_client.h"

enum { R = 16, C = 24, N = 32 };
static uint16_t w_bf16[R * C];
static float w_f32[R * C];
static int64_t pos[N];
static uint8_t mask[N];
static int32_t buf32[4 * 4];

static const st_spec ckpt[] = {
    {"embed", "BF16", 2, {R, C}, w_bf16, sizeof w_bf16},
    {"position_ids", "I64", 2, {1, N}, pos, sizeof pos},
    {"proj.weight", "F32", 2, {R, C}, w_f32, sizeof w_f32},
    {"attention.masked_bias", "BOOL", 1, {N}, mask, sizeof mask},
    {"buf", "I32", 2, {4, 4}, buf32, sizeof buf32},
};

static int has_model(nwc_client *c, const char *name) {
  nwc_client_model *m = NULL;
  size_t n = 0;
  CHECK_RC(nwc_client_models(c, &m, &n));
  int found = 0;
  for (size_t i = 0; i < n; i++) found |= !strcmp(m[i].name, name);
  free(m);
  return found;
}

/* Sends an import (op 6) or import2 request for path over a raw connection: the final reply's
 * status, its message in msg. */
static int raw_import(uint16_t op, uint8_t flags, const char *path, char *msg, size_t cap) {
  int fd = td_raw_hello(td_sock), ffd = open(path, O_RDONLY | O_CLOEXEC);
  char *files[1] = {"raw.safetensors"};
  nwc_proto_req r = {.op = op, .id = 2, .nfiles = 1, .files = files, .import_flags = flags};
  strcpy(r.model, "raw");
  nwc_pw w;
  nwc_pw_init(&w);
  int64_t n = nwc_proto_req_encode(&r, &w);
  int rc = fd >= 0 && ffd >= 0 && n > 0 ? td_send_fds(fd, w.buf, (size_t)n, &ffd, 1) : -1;
  nwc_pw_free(&w);
  nwc_proto_hdr h = {0};
  uint8_t *p = NULL;
  while (rc == 0 && (rc = td_recv_frame(fd, &h, &p, 10000)) == 0 && (h.flags & NWC_PF_EVENT))
    free(p), p = NULL;
  snprintf(msg, cap, "%s", rc == 0 && h.status < 0 ? td_error_text(p, h.length) : "");
  free(p);
  if (ffd >= 0) close(ffd);
  if (fd >= 0) close(fd);
  return rc < 0 ? rc : h.status;
}

int main(void) {
  test_seed("test_daemon_skip");
  if (td_mkdir("nwc-skip") < 0) return 1;
  for (int i = 0; i < R * C; i++) {
    w_bf16[i] = nwc_f32_to_bf16((float)((test_uniform() - 0.5) * 0.1));
    w_f32[i] = (float)((test_uniform() - 0.5) * 0.1);
  }
  for (int i = 0; i < N; i++) pos[i] = i, mask[i] = (uint8_t)(i % 3 == 0);
  for (int i = 0; i < 16; i++) buf32[i] = (int32_t)test_rand();
  char path[400], ints[400], badsize[400];
  snprintf(path, sizeof path, "%s/ckpt.safetensors", td_dir);
  CHECK_RC(st_write(path, ckpt, sizeof ckpt / sizeof *ckpt));
  st_spec only[] = {{"position_ids", "I64", 2, {1, N}, pos, sizeof pos}};
  snprintf(ints, sizeof ints, "%s/ints.safetensors", td_dir);
  CHECK_RC(st_write(ints, only, 1));
  st_spec bad[] = {{"w", "F32", 1, {4}, w_f32, 16}, {"ids", "I64", 1, {3}, pos, 16}};
  snprintf(badsize, sizeof badsize, "%s/badsize.safetensors", td_dir);
  CHECK_RC(st_write(badsize, bad, 2));

  pid_t pid = td_start_daemon(NULL);
  CHECK(pid > 0, "nwcd did not start");
  if (pid <= 0) return td_show_log(), 1;
  nwc_client *c = NULL;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  if (!c) return 1;

  /* The daemon offers import2. */
  uint64_t caps = td_daemon_caps(td_sock);
  CHECK(caps & NWC_CAP_IMPORT2, "hello caps 0x%llx lack import2 (256)", (unsigned long long)caps);

  /* Strict: all or nothing, naming the first tensor and its dtype. */
  nwc_client_result res;
  int rc = nwc_client_import2(c, "s", path, NULL, NWC_CLIENT_IMPORT_STRICT, &res, NULL, NULL);
  CHECK(rc == -ENOTSUP && strstr(nwc_client_last_error(), "'position_ids' is I64"),
        "strict import: %d %s", rc, nwc_client_last_error());
  CHECK(!has_model(c, "s"), "a strict import that failed published its model");

  /* The old opcode is all or nothing too; import2 refuses flags it does not know. */
  char msg[NWC_PROTO_MAX_MSG];
  rc = raw_import(NWC_OP_IMPORT, 0, path, msg, sizeof msg);
  CHECK(rc == -ENOTSUP && strstr(msg, "position_ids") && strstr(msg, "I64"),
        "import (op 6) of the checkpoint: %d '%s', want -ENOTSUP naming position_ids", rc, msg);
  rc = raw_import(NWC_OP_IMPORT2, 0x80, path, msg, sizeof msg);
  CHECK(rc == -EBADMSG && strstr(msg, "flags"), "import2 with flags 0x80: %d '%s'", rc, msg);
  CHECK(!has_model(c, "raw"), "a refused raw import published its model");

  /* By default: the weights are stored, the rest named. */
  nwc_client_skipped *sk = NULL;
  size_t nsk = 0;
  CHECK_RC(nwc_client_import2(c, "m", path, NULL, 0, &res, &sk, &nsk));
  static const char *const want[][2] = {
      {"position_ids", "I64"}, {"attention.masked_bias", "BOOL"}, {"buf", "I32"}};
  CHECK(res.tensors == 2 && res.skipped == 3 && nsk == 3,
        "import: %llu tensors and %llu skipped (%zu listed), want 2 and 3",
        (unsigned long long)res.tensors, (unsigned long long)res.skipped, nsk);
  for (size_t i = 0; i < nsk && i < 3; i++) {
    const st_spec *t = &ckpt[i == 0 ? 1 : i + 2];
    CHECK(!strcmp(sk[i].name, want[i][0]) && !strcmp(sk[i].dtype, want[i][1]) &&
              sk[i].ndim == t->ndim && !memcmp(sk[i].shape, t->shape, t->ndim * 8),
          "skipped[%zu] is %s (%s, %u dims), want %s (%s)", i, sk[i].name, sk[i].dtype,
          sk[i].ndim, want[i][0], want[i][1]);
  }
  free(sk);
  nwc_client_tensor *ts = NULL;
  size_t nt = 0;
  CHECK_RC(nwc_client_tensors(c, "m", &ts, &nt));
  CHECK(nt == 2 && !strcmp(ts[0].name, "embed") && !strcmp(ts[1].name, "proj.weight"),
        "ls m: %zu tensors", nt);
  free(ts);
  uint16_t out[R * C], ref[R * C];
  for (int i = 0; i < R * C; i++) ref[i] = nwc_f32_to_bf16(w_f32[i]);
  CHECK_RC(nwc_client_dequant(c, "m", "embed", NWC_CLIENT_BF16, out, sizeof out, NULL, NULL, NULL));
  CHECK(!memcmp(out, w_bf16, sizeof out), "embed does not decode to the file's BF16 values");
  CHECK_RC(nwc_client_dequant(c, "m", "proj.weight", NWC_CLIENT_BF16, out, sizeof out, NULL, NULL,
                              NULL));
  CHECK(!memcmp(out, ref, sizeof out), "proj.weight does not decode to the file's F32 values, RNE");
  /* nwc_client_import (no list) skips too and counts. */
  CHECK_RC(nwc_client_import(c, "m2", path, NULL, &res));
  CHECK(res.tensors == 2 && res.skipped == 3, "nwc_client_import: %llu tensors, %llu skipped",
        (unsigned long long)res.tensors, (unsigned long long)res.skipped);

  /* Nothing to store; malformed. */
  rc = nwc_client_import2(c, "i", ints, NULL, 0, &res, NULL, NULL);
  CHECK(rc == -ENOTSUP && strstr(nwc_client_last_error(), "no tensor can be stored") &&
            strstr(nwc_client_last_error(), "'position_ids' is I64"),
        "only I64: %d %s", rc, nwc_client_last_error());
  rc = nwc_client_import2(c, "b", badsize, NULL, 0, &res, NULL, NULL);
  CHECK(rc == -EBADMSG && strstr(nwc_client_last_error(), "'ids'"), "I64 of the wrong size: %d %s",
        rc, nwc_client_last_error());
  CHECK(!has_model(c, "i") && !has_model(c, "b"), "a failed import published its model");

  nwc_client_free(c);
  CHECK(td_stop_daemon(pid) == 0, "nwcd did not exit 0 after SIGTERM");
  if (test_failures) td_show_log();
  td_cleanup();
  return test_exit("test_daemon_skip");
}
