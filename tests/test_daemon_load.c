/*
 * test_daemon_load.c - loads through a real nwcd: progress events of a model load are monotonic
 * and end at the model's total bytes, and every tensor of it (loaded in parallel lanes) decodes
 * bit for bit to the original weights; a byte flipped in a container fails the load of its
 * tensor with the chunk named, and leaves nothing resident; a truncated container fails naming
 * where the file ends; after the container is repaired the tensor loads, dequantizes bit for
 * bit against the original weights and multiplies against an fp64 reference (the failed loads
 * left nothing behind).  An explicit evict gives the memory back (nwcd's mapped shared memory,
 * Pss_Shmem, drops).  Under a budget of half the model, a load of all of it is refused with
 * both sizes said in MiB and bytes, tensors pinned until one does not fit are refused with what
 * holds the budget and what to do (in KiB/MiB), random loads (whose LRU evictions leave
 * spares that later loads write into) never leave more shared memory in nwcd than the budget,
 * every tensor still decodes right, a model of smaller blobs (fp8) loaded into the spares cut to
 * size has resident bytes (mapped) equal to its containers' and memfds sealed with F_SEAL_WRITE,
 * and evicting everything returns the memory.  A model with one matrix far larger than the
 * others loads with the lanes that ran out of tensors writing parts of it, bit for bit, also
 * while another process loads, evicts and dequantizes the same model.
 */
#include "nwc_client.h"
#include "size_text.h"
#include "test_daemon_race.h"
#include "test_daemon_util.h"

#include <stdbool.h>

typedef struct events {
  uint64_t last, total, n;
  bool bad;
} events;

static int on_progress(void *ctx, uint64_t done, uint64_t total) {
  events *e = ctx;
  if (done < e->last || done > total || (e->n && total != e->total)) e->bad = true;
  e->last = done, e->total = total, e->n++;
  return 0;
}

static uint64_t resident_bytes(nwc_client *c) {
  nwc_client_counters s;
  CHECK_RC(nwc_client_stats(c, &s));
  return s.resident_bytes;
}

static bool is_resident(nwc_client *c, const char *tensor) {
  nwc_client_resident *r = NULL;
  size_t n = 0;
  CHECK_RC(nwc_client_ps(c, &r, &n));
  bool found = false;
  for (size_t i = 0; i < n; i++) found |= !strcmp(r[i].tensor, tensor);
  free(r);
  return found;
}

static uint8_t *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc(*len);
  if (fread(b, 1, *len, f) != *len) *len = 0;
  fclose(f);
  return b;
}

static void put_back(const char *path, const uint8_t *b, size_t len) {
  FILE *f = fopen(path, "wb");
  CHECK(f && fwrite(b, 1, len, f) == len, "rewrite %s", path);
  if (f) fclose(f);
}

/* The shared memory of nwcd's tensor memfds (the Pss of its "memfd:nwc-tensor" mappings,
 * bytes: each page once, however many of its mappings map it): its resident host copies and
 * their spares, not the clients' shared regions. */
static uint64_t pss_shmem(pid_t pid) {
  char path[64], line[512];
  snprintf(path, sizeof path, "/proc/%d/smaps", (int)pid);
  FILE *f = fopen(path, "r");
  unsigned long long kb, sum = 0;
  bool tensor = false, found = false;
  while (f && fgets(line, sizeof line, f)) {
    unsigned long long lo, hi;
    if (sscanf(line, "%llx-%llx ", &lo, &hi) == 2) tensor = strstr(line, "memfd:nwc-tensor");
    else if (sscanf(line, "Pss: %llu kB", &kb) == 1) found = true, sum += tensor ? kb : 0;
  }
  if (f) fclose(f);
  CHECK(found, "no Pss in %s", path);
  return sum << 10;
}

/* Every tensor of model, mapped: its bytes are the container's blob (read with pread). */
static void check_mapped_bytes(nwc_client *c, const char *model) {
  for (size_t i = 0; i < td_nt; i++) {
    nwc_client_tensor_info in;
    CHECK_RC(nwc_client_info(c, model, td_t[i].name, &in));
    nwc_client_mapping *m = NULL;
    CHECK_RC(nwc_client_map(c, model, td_t[i].name, &m));
    if (!m) continue;
    uint8_t *want = malloc(in.length);
    int fd = open(in.path, O_RDONLY);
    CHECK(fd >= 0 && pread(fd, want, in.length, (off_t)in.offset) == (ssize_t)in.length,
          "pread %s", in.path);
    if (fd >= 0) close(fd);
    const nwc_client_map_info *mi = nwc_client_mapping_info(m);
    CHECK(!memcmp(mi->base, want, in.length), "%s/%s: resident bytes differ from the container",
          model, td_t[i].name);
    int seals = fcntl(mi->fd, F_GET_SEALS); /* the loader's writable mapping is gone */
    CHECK(seals >= 0 && (seals & F_SEAL_WRITE), "%s/%s: seals 0x%x", model, td_t[i].name, seals);
    uint8_t one = 1;
    CHECK(pwrite(mi->fd, &one, 1, 0) < 0 && errno == EPERM, "%s/%s: pwrite: errno %d", model,
          td_t[i].name, errno);
    free(want);
    nwc_client_unmap(m);
  }
}

static void check_weights(nwc_client *c, const char *what) {
  for (size_t i = 0; i < td_nt; i++) {
    size_t nbytes = td_t[i].rows * td_t[i].cols * 2;
    uint16_t *got = malloc(nbytes);
    CHECK_RC(nwc_client_dequant(c, "use", td_t[i].name, NWC_CLIENT_BF16, got, nbytes, NULL, NULL,
                                NULL));
    CHECK(!memcmp(got, td_t[i].w, nbytes), "%s %s: not the original weights", what, td_t[i].name);
    free(got);
  }
}

/* An explicit evict returns the memory: what nwcd still maps afterwards is far below the model. */
static void check_returned(pid_t d, uint64_t total, const char *what) {
  uint64_t left = pss_shmem(d);
  CHECK(left < total / 8, "%s: nwcd still maps %llu bytes of shared memory (model %llu)", what,
        (unsigned long long)left, (unsigned long long)total);
}

static void test_evict_returns(nwc_client *c, pid_t d, uint64_t total) {
  nwc_client_import_opts fp8 = {.elem = 1};
  CHECK_RC(nwc_client_import(c, "use8", getenv("NWC_SAMPLE"), &fp8, NULL));
  CHECK_RC(nwc_client_load(c, "use", NULL, NULL, NULL, NULL));
  uint64_t loaded = pss_shmem(d);
  CHECK(loaded >= total, "loaded: %llu bytes of shared memory for %llu resident",
        (unsigned long long)loaded, (unsigned long long)total);
  CHECK_RC(nwc_client_evict(c, "use", NULL, NULL));
  check_returned(d, total, "after evict");
}

/* Under a budget of half the model, loads in random order evict LRU copies; resident copies
 * and spares together never hold more shared memory than the budget; the fp8 model's smaller
 * blobs go into spares cut to size; evicting everything gives it all back. */
static void test_budget(uint64_t total) {
  char budget[32];
  uint64_t b = total / 2;
  snprintf(budget, sizeof budget, "%llu", (unsigned long long)b);
  const char *extra[] = {"--budget", budget, NULL};
  pid_t d = td_start_daemon(extra);
  CHECK(d > 0, "nwcd --budget %s did not start", budget);
  nwc_client *c = NULL;
  if (d > 0) CHECK_RC(nwc_client_connect(td_sock, &c));
  if (!c) return;
  /* the whole model does not fit: refused before anything is loaded, its size and the budget
   * said as people read them, with the exact bytes */
  char want[96], size[16];
  snprintf(want, sizeof want, "use needs %s (%llu bytes), more than the memory budget of ",
           nwc_size_text(total, size), (unsigned long long)total);
  CHECK(strstr(size, "iB"), "the sample's %llu bytes said as '%s'", (unsigned long long)total,
        size);
  int rc = nwc_client_load(c, "use", NULL, NULL, NULL, NULL);
  CHECK(rc == -ENOSPC && strstr(nwc_client_last_error(), want), "load of a model over the budget: "
        "%d '%s', not '%s...'", rc, nwc_client_last_error(), want);
  /* Tensors pinned in random order until one does not fit: refused with its size, what holds
   * the budget, and what to do, in sizes as people read them. */
  size_t start = test_below(td_nt), pinned = 0;
  rc = 0;
  for (size_t k = 0; k < td_nt && rc != -ENOSPC; k++) {
    const td_tensor *t = &td_t[(start + k) % td_nt];
    rc = nwc_client_pin(c, "use", t->name, NULL);
    CHECK(rc == 0 || rc == -ENOSPC, "pin %s: %d %s", t->name, rc, nwc_client_last_error());
    pinned += rc == 0;
    const char *e = nwc_client_last_error(); /* the budget held by others, or too small */
    if (rc == -ENOSPC)
      CHECK(!strstr(e, "bytes") &&
                ((strstr(e, "iB on cpu, but ") && strstr(e, " pinned in all); unpin or evict "
                                                            "tensors (nwcctl ps lists them), or "
                                                            "raise --budget")) ||
                 (strstr(e, "iB, more than the memory budget of cpu (") &&
                  strstr(e, "); raise --budget"))),
            "pin %s with %zu pinned over the budget: '%s'", t->name, pinned, e);
  }
  CHECK(rc == -ENOSPC, "pinned %zu tensors, from %zu, under half the model's size", pinned, start);
  CHECK_RC(nwc_client_unpin(c, "use", NULL, NULL));
  for (size_t k = 0; k < 4 * td_nt; k++) {
    size_t i = test_below(td_nt);
    CHECK_RC(nwc_client_load(c, "use", td_t[i].name, NULL, NULL, NULL));
    uint64_t shm = pss_shmem(d);
    CHECK(shm <= b, "load %zu (%s): %llu bytes of shared memory, budget %llu", k, td_t[i].name,
          (unsigned long long)shm, (unsigned long long)b);
  }
  check_weights(c, "under the budget:");
  check_mapped_bytes(c, "use8");
  uint64_t shm = pss_shmem(d);
  CHECK(shm <= b, "fp8 after bf16: %llu bytes of shared memory, budget %llu",
        (unsigned long long)shm, (unsigned long long)b);
  CHECK_RC(nwc_client_evict(c, "use", NULL, NULL));
  CHECK_RC(nwc_client_evict(c, "use8", NULL, NULL));
  check_returned(d, total, "under the budget, after evicting both models");
  nwc_client_free(c);
  CHECK(td_stop_daemon(d) == 0, "SIGTERM exit");
}

/* A model whose first matrix (8192 x 4096, about 45 MB of container) dwarfs the other two, loaded
 * whole: the lane of the small ones runs out of tensors and writes parts of the large one into
 * its memfd (the log says how many: at least one); every matrix decodes bit for bit, the large
 * one multiplies against fp64, the load and stats count every byte of the model once, and the
 * resident bytes are the containers'. */
static void test_crew(nwc_client *c) {
  const uint64_t K = 4096, rows[3] = {8192, 256, 128};
  const char *const *names = td_big_names;
  uint16_t *w[3];
  td_import_big(c, rows, K, w);
  uint64_t total = 0;
  for (int m = 0; m < 3; m++) {
    nwc_client_tensor_info ti;
    CHECK_RC(nwc_client_info(c, "big", names[m], &ti));
    total += ti.length;
  }
  nwc_client_result res;
  nwc_client_counters s0, s1;
  long parts = 0;
  /* the small ones' lane helps unless a busy machine kept its thread off a core for the whole
   * load of the large one: up to three loads for one with parts taken */
  for (int tries = 0; tries < 3 && parts < 1; tries++) {
    if (tries) CHECK_RC(nwc_client_evict(c, "big", NULL, NULL));
    CHECK_RC(nwc_client_stats(c, &s0));
    CHECK_RC(nwc_client_load(c, "big", NULL, NULL, NULL, &res));
    CHECK_RC(nwc_client_stats(c, &s1));
    CHECK(s1.loads - s0.loads == 3 && s1.load_bytes - s0.load_bytes == total, "stats: %llu "
          "loads, %llu bytes loaded of %llu", (unsigned long long)(s1.loads - s0.loads),
          (unsigned long long)(s1.load_bytes - s0.load_bytes), (unsigned long long)total);
    parts = td_helped_parts("big");
  }
  CHECK(parts >= 1, "no lane helped write the large matrix in three loads (%ld parts)", parts);
  CHECK(res.tensors == 3 && res.bytes == total, "load: %llu tensors, %llu bytes of %llu",
        (unsigned long long)res.tensors, (unsigned long long)res.bytes,
        (unsigned long long)total);
  CHECK(resident_bytes(c) == total, "resident %llu of %llu", (unsigned long long)resident_bytes(c),
        (unsigned long long)total);
  for (int m = 0; m < 3; m++) {
    uint16_t *got = malloc(rows[m] * K * 2);
    CHECK_RC(nwc_client_dequant(c, "big", names[m], NWC_CLIENT_BF16, got, rows[m] * K * 2, NULL,
                                NULL, NULL));
    CHECK(!memcmp(got, w[m], rows[m] * K * 2), "%s written by %ld helped parts: not the original "
          "weights", names[m], parts);
    free(got);
  }
  td_tensor tw = {names[0], rows[0], K, w[0], NULL};
  float *x = malloc(K * 4), *y = malloc(rows[0] * 4);
  for (uint64_t k = 0; k < K; k++) x[k] = (float)(test_uniform() * 2 - 1);
  CHECK_RC(nwc_client_matvec(c, "big", names[0], NULL, 1.0f, x, K, 1, 0, y, rows[0] * 4, NULL));
  double e = td_matvec_err(&tw, x, 1.0, NULL, y);
  CHECK(e <= 1e-5, "matvec %s: relative error %.3g", names[0], e);
  printf("big: loaded whole, %ld parts written by lanes that had run out of tensors\n", parts);
  CHECK_RC(nwc_client_evict(c, "big", NULL, NULL));
  free(x), free(y);
  td_crew_races(c, "test_daemon_load", names, rows, K, w);
  CHECK_RC(nwc_client_evict(c, "big", NULL, NULL));
  for (int m = 0; m < 3; m++) free(w[m]);
}

/* Loads use/tensor expecting want, with text in the error message; nothing may be resident. */
static void load_fails(nwc_client *c, const char *tensor, int want, const char *text) {
  int rc = nwc_client_load(c, "use", tensor, NULL, NULL, NULL);
  const char *msg = nwc_client_last_error();
  CHECK(rc == want && strstr(msg, text), "load %s: %d (%s), want %d naming '%s'", tensor, rc,
        msg, want, text);
  CHECK(!is_resident(c, tensor), "%s resident after a failed load", tensor);
  CHECK(resident_bytes(c) == 0, "%llu bytes resident after a failed load",
        (unsigned long long)resident_bytes(c));
}

int main(void) {
  int rc0;
  pid_t d = td_begin("test_daemon_load", "nwc-load", NULL, &rc0);
  if (!d) return rc0;
  nwc_client *c = NULL;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  if (!c) {
    td_show_log();
    return 1;
  }
  CHECK_RC(nwc_client_import(c, "use", getenv("NWC_SAMPLE"), NULL, NULL));
  /* the model's bytes, the host memory its copies hold (each blob on whole pages: a packed one
   * is a multiple of 64 bytes), and its largest tensor */
  uint64_t total = 0, held = 0, largest = 0;
  size_t big = 0;
  nwc_client_tensor_info info[64];
  for (size_t i = 0; i < td_nt; i++) {
    CHECK_RC(nwc_client_info(c, "use", td_t[i].name, &info[i]));
    total += info[i].length;
    held += (info[i].length + 4095) / 4096 * 4096;
    if (info[i].length > largest) largest = info[i].length, big = i;
  }
  events ev = {0};
  nwc_client_result res;
  CHECK_RC(nwc_client_load(c, "use", NULL, on_progress, &ev, &res));
  CHECK(!ev.bad && ev.n >= 1 && ev.last == total && ev.total == total,
        "load progress: %s, %llu events, last %llu of %llu (want %llu)",
        ev.bad ? "not monotonic" : "monotonic", (unsigned long long)ev.n,
        (unsigned long long)ev.last, (unsigned long long)ev.total, (unsigned long long)total);
  CHECK(res.tensors == td_nt && res.direct + res.buffered == td_nt, "load: %llu tensors",
        (unsigned long long)res.tensors);
  CHECK(resident_bytes(c) == held, "resident %llu of %llu", (unsigned long long)resident_bytes(c),
        (unsigned long long)held);
  /* the tensors were loaded in parallel lanes: each decodes to its original weights */
  for (size_t i = 0; i < td_nt; i++) {
    size_t nbytes = td_t[i].rows * td_t[i].cols * 2;
    uint16_t *got = malloc(nbytes);
    CHECK_RC(nwc_client_dequant(c, "use", td_t[i].name, NWC_CLIENT_BF16, got, nbytes, NULL, NULL,
                                NULL));
    CHECK(!memcmp(got, td_t[i].w, nbytes), "%s after a model load: not the original weights",
          td_t[i].name);
    free(got);
  }
  CHECK(resident_bytes(c) == held, "the dequants loaded again: resident %llu of %llu",
        (unsigned long long)resident_bytes(c), (unsigned long long)held);
  CHECK_RC(nwc_client_evict(c, "use", NULL, NULL));

  const nwc_client_tensor_info *t = &info[big];
  size_t len = 0;
  uint8_t *orig = slurp(t->path, &len);
  CHECK(orig && len >= t->offset + t->length, "read %s", t->path);
  if (!orig || !len) return test_exit("test_daemon_load");
  /* a flipped byte */
  uint8_t *bad = malloc(len);
  memcpy(bad, orig, len);
  uint64_t at = test_below(t->length);
  bad[t->offset + at] ^= (uint8_t)(1u << test_below(8));
  put_back(t->path, bad, len);
  char want[64];
  snprintf(want, sizeof want, "chunk %llu,", (unsigned long long)(at >> 20));
  load_fails(c, td_t[big].name, -EBADMSG, want);
  /* the daemon still loads the others */
  size_t other = (big + 1) % td_nt;
  CHECK_RC(nwc_client_load(c, "use", td_t[other].name, NULL, NULL, NULL));
  CHECK_RC(nwc_client_evict(c, "use", td_t[other].name, NULL));
  /* truncated inside the blob */
  put_back(t->path, orig, t->offset + test_below(t->length));
  load_fails(c, td_t[big].name, -EIO, "the file ends at");
  /* repaired: it loads, and decodes to the original weights */
  put_back(t->path, orig, len);
  CHECK_RC(nwc_client_load(c, "use", td_t[big].name, NULL, NULL, NULL));
  size_t nb = td_t[big].rows * td_t[big].cols * 2;
  uint16_t *w = malloc(nb);
  CHECK_RC(nwc_client_dequant(c, "use", td_t[big].name, NWC_CLIENT_BF16, w, nb, NULL, NULL, NULL));
  CHECK(!memcmp(w, td_t[big].w, nb), "%s after repair: not the original weights", td_t[big].name);
  const td_tensor *bt = &td_t[big];
  float *x = calloc(bt->cols, 4), *y = calloc(bt->rows, 4);
  for (uint64_t k = 0; k < bt->cols; k++) x[k] = (float)(test_uniform() * 2 - 1);
  CHECK_RC(nwc_client_matvec(c, "use", bt->name, NULL, 1.0f, x, bt->cols, 1, 0, y, bt->rows * 4,
                             NULL));
  double e = td_matvec_err(bt, x, 1.0, NULL, y);
  CHECK(e <= 1e-5, "matvec %s after repair: relative error %.3g", bt->name, e);
  free(x), free(y);
  free(w), free(bad), free(orig);
  test_evict_returns(c, d, total);
  test_crew(c);
  nwc_client_free(c);
  CHECK(td_stop_daemon(d) == 0, "SIGTERM exit");
  test_budget(total);
  if (test_failures) td_show_log();
  td_cleanup();
  return test_exit("test_daemon_load");
}
