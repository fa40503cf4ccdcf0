/*
 * test_daemon_split.c - load_places with the split flag on the cpu backend (docs/protocol.md,
 * Split): each tensor of a model at one place, in natural name order, within the free budget,
 * nothing evicted; a plan that cannot fit is refused before anything loads.
 *
 * The test writes two models of random BF16 matrices (fresh seed): m, whose tensors are named
 * model.layers.N.w with random distinct N of one and two digits (so that natural order and byte
 * order differ), and f, one matrix larger than all of m.  A first nwcd imports them and reports
 * their blob sizes; a second runs with a host budget that fits m alone, or f and the first k
 * tensors of m in natural order but not the next (k and the slack below a page boundary random).
 * Checked: the split of m over host memory puts every tensor there, reads each blob once, and
 * with one tensor resident before reads only the others and pins all with the pin flag; with f
 * resident (evictable, unpinned) the split is -ENOSPC naming the k-th tensor in natural order,
 * its size and host memory's free bytes, no tensor of m is resident, f stays, and the daemon
 * serves on; a GPU named is -ENODEV; nwcctl load --split refuses a missing --device and a single
 * tensor (exit 2) and prints the tensors and bytes per place (--json).
 */
#include "test_daemon_util.h"
#include "test_store_util.h" /* st_write */

#include "nwc_client.h"
#include "size_text.h"

#include <jansson.h>
#include <stdbool.h>

#define MAXT 12

static char names[MAXT][48];
static size_t nt;
static uint64_t len[MAXT]; /* blob bytes (nwc_bytes), by index into names */
static size_t order[MAXT]; /* indices in natural name order */

static uint64_t pages(uint64_t n) { return (n + 4095) & ~(uint64_t)4095; }

static uint16_t rand_bf16(void) {
  unsigned e = 118 + (unsigned)test_below(6);
  return (uint16_t)((test_below(2) << 15) | (e << 7) | test_below(128));
}

/* Writes and imports model (n matrices named nm[i], rows[i] x 512 each). */
static void import_model(nwc_client *c, const char *model, char (*nm)[48], const uint64_t *rows,
                         size_t n) {
  st_spec sp[MAXT];
  uint16_t *w[MAXT];
  for (size_t i = 0; i < n; i++) {
    w[i] = malloc(rows[i] * 512 * 2);
    for (uint64_t k = 0; k < rows[i] * 512; k++) w[i][k] = rand_bf16();
    sp[i] = (st_spec){nm[i], "BF16", 2, {rows[i], 512}, w[i], rows[i] * 512 * 2};
  }
  char path[600];
  snprintf(path, sizeof path, "%s/%s.safetensors", td_dir, model);
  CHECK_RC(st_write(path, sp, n));
  CHECK_RC(nwc_client_import(c, model, path, NULL, NULL));
  for (size_t i = 0; i < n; i++) free(w[i]);
}

/* The blob sizes of m's tensors into len[], and f's whole size. */
static uint64_t sizes(nwc_client *c, uint64_t *f_bytes) {
  nwc_client_tensor *t;
  size_t n = 0;
  CHECK_RC(nwc_client_tensors(c, "m", &t, &n));
  for (size_t i = 0; i < n; i++)
    for (size_t k = 0; k < nt; k++)
      if (!strcmp(t[i].name, names[k])) len[k] = t[i].nwc_bytes;
  free(t);
  CHECK_RC(nwc_client_tensors(c, "f", &t, &n));
  *f_bytes = n == 1 ? t[0].nwc_bytes : 0;
  free(t);
  uint64_t total = 0;
  for (size_t k = 0; k < nt; k++) total += pages(len[k]);
  return total;
}

/* ps rows of model, at host memory, pinned ones into *pinned. */
static size_t ps_rows(nwc_client *c, const char *model, size_t *pinned) {
  nwc_client_resident *p = NULL;
  size_t n = 0, k = 0;
  *pinned = 0;
  CHECK_RC(nwc_client_ps(c, &p, &n));
  for (size_t i = 0; i < n; i++) {
    if (strcmp(p[i].model, model)) continue;
    CHECK(p[i].device == NWC_CLIENT_CPU, "%s/%s at device %d", model, p[i].tensor, p[i].device);
    k++, *pinned += p[i].pinned;
  }
  free(p);
  return k;
}

static int by_name(const void *a, const void *b) {
  return strverscmp(names[*(const size_t *)a], names[*(const size_t *)b]);
}

static void check_nwcctl(void) {
  char *out = NULL, *err = NULL;
  const char *nodev[] = {"--socket", td_sock, "load", "m", "--split", NULL};
  CHECK(td_nwcctl(NULL, &err, nodev) == 2 && strstr(err, "--split"), "load --split without "
        "--device: %s", err);
  free(err);
  char one[100];
  snprintf(one, sizeof one, "m/%s", names[0]);
  const char *single[] = {"--socket", td_sock, "load", one, "--device", "cpu", "--split", NULL};
  CHECK(td_nwcctl(NULL, &err, single) == 2 && strstr(err, "not one tensor"),
        "load --split of one tensor: %s", err);
  free(err);
  const char *split[] = {"--socket", td_sock, "--json", "load", "m", "--device", "cpu", "--split",
                         NULL};
  int rc = td_nwcctl(&out, &err, split);
  json_error_t je;
  json_t *o = rc == 0 ? json_loads(out, 0, &je) : NULL;
  json_t *pl = o ? json_object_get(o, "places") : NULL, *p0 = pl ? json_array_get(pl, 0) : NULL;
  uint64_t bytes = 0;
  for (size_t k = 0; k < nt; k++) bytes += pages(len[k]);
  CHECK(p0 && json_array_size(pl) == 1 &&
            !strcmp(json_string_value(json_object_get(p0, "device")), "cpu") &&
            json_integer_value(json_object_get(p0, "tensors")) == (json_int_t)nt &&
            json_integer_value(json_object_get(p0, "bytes")) == (json_int_t)bytes &&
            json_integer_value(json_object_get(o, "tensors")) == (json_int_t)nt,
        "nwcctl --json load m --device cpu --split: %d %s %s", rc, out, err);
  json_decref(o);
  free(out), free(err);
  const char *text[] = {"--socket", td_sock, "pin", "m", "--device", "cpu", "--split", NULL};
  rc = td_nwcctl(&out, &err, text);
  char want[64];
  snprintf(want, sizeof want, "  cpu     %zu tensors, ", nt);
  CHECK(rc == 0 && strstr(out, "pinned m split: ") && strstr(out, want),
        "nwcctl pin m --device cpu --split: %d %s %s", rc, out, err);
  free(out), free(err);
}

int main(void) {
  test_seed("test_daemon_split");
  if (td_mkdir("nwc-split") < 0) return 1;
  pid_t d = td_start_daemon(NULL);
  CHECK(d > 0, "nwcd did not start");
  nwc_client *c = NULL;
  if (d > 0) CHECK_RC(nwc_client_connect(td_sock, &c));
  if (!c) return td_show_log(), td_cleanup(), test_exit("test_daemon_split");
  /* m: 5 to MAXT tensors model.layers.N.w, N distinct in 0..29 */
  nt = 5 + test_below(MAXT - 4);
  bool used[30] = {false};
  uint64_t rows[MAXT], f_rows = 16;
  for (size_t i = 0; i < nt; i++) {
    unsigned v;
    do v = (unsigned)test_below(30);
    while (used[v]);
    used[v] = true;
    snprintf(names[i], sizeof names[i], "model.layers.%u.w", v);
    rows[i] = 8 + test_below(120);
    f_rows += 2 * rows[i];
  }
  import_model(c, "m", names, rows, nt);
  char fname[1][48] = {"filler.w"};
  import_model(c, "f", fname, &f_rows, 1);
  uint64_t f_bytes, m_total = sizes(c, &f_bytes);
  for (size_t i = 0; i < nt; i++) order[i] = i;
  qsort(order, nt, sizeof *order, by_name);
  printf("natural order:");
  for (size_t i = 0; i < nt; i++) printf(" %s (%llu)", names[order[i]], (unsigned long long)len[order[i]]);
  printf("\n");
  nwc_client_free(c);
  c = NULL;
  CHECK(td_stop_daemon(d) == 0, "first nwcd did not stop");
  CHECK(pages(f_bytes) >= m_total, "f (%llu bytes) is smaller than m (%llu)",
        (unsigned long long)f_bytes, (unsigned long long)m_total);

  /* The budget: f and the first k of m in natural order, j pages of the k-th more */
  size_t k = 1 + test_below(nt - 1);
  uint64_t prefix = 0;
  for (size_t i = 0; i < k; i++) prefix += pages(len[order[i]]);
  uint64_t j = test_below(pages(len[order[k]]) / 4096), free_bytes = prefix + 4096 * j;
  uint64_t budget = pages(f_bytes) + free_bytes;
  char bs[32];
  snprintf(bs, sizeof bs, "%llu", (unsigned long long)budget);
  printf("budget %s: f and %zu tensors of m, %llu bytes free for m with f resident; %s the first "
         "that does not fit\n", bs, k, (unsigned long long)free_bytes, names[order[k]]);
  const char *extra[] = {"--budget", bs, NULL};
  d = td_start_daemon(extra);
  CHECK(d > 0, "nwcd --budget %s did not start", bs);
  if (d > 0) CHECK_RC(nwc_client_connect(td_sock, &c));
  if (!c) return td_show_log(), td_cleanup(), test_exit("test_daemon_split");

  /* the whole of m over host memory: every tensor there, each blob read once */
  int cpu[] = {NWC_CLIENT_CPU};
  nwc_client_result res;
  uint64_t blobs = 0;
  for (size_t i = 0; i < nt; i++) blobs += len[i];
  CHECK_RC(nwc_client_load_places(c, "m", NULL, cpu, 1, NWC_CLIENT_LOAD_SPLIT, NULL, NULL, &res));
  size_t pinned;
  CHECK(res.tensors == nt && res.bytes == blobs && res.raw_bytes == blobs,
        "split of m over cpu: %llu tensors, %llu bytes, %llu read (want %zu, %llu)",
        (unsigned long long)res.tensors, (unsigned long long)res.bytes,
        (unsigned long long)res.raw_bytes, nt, (unsigned long long)blobs);
  CHECK(ps_rows(c, "m", &pinned) == nt && pinned == 0, "ps after the split: not every tensor");
  /* one evicted: only it is read again; the pin flag pins each at its place */
  size_t e = test_below(nt);
  CHECK_RC(nwc_client_evict(c, "m", names[e], &res));
  CHECK_RC(nwc_client_load_places(c, "m", NULL, cpu, 1, NWC_CLIENT_LOAD_SPLIT | NWC_CLIENT_LOAD_PIN,
                                  NULL, NULL, &res));
  CHECK(res.tensors == nt && res.raw_bytes == len[e], "pinned split with %s evicted read %llu "
        "(want %llu)", names[e], (unsigned long long)res.raw_bytes, (unsigned long long)len[e]);
  CHECK(ps_rows(c, "m", &pinned) == nt && pinned == nt, "ps after the pinned split: %zu pinned",
        pinned);
  CHECK_RC(nwc_client_unpin(c, "m", NULL, &res));
  CHECK_RC(nwc_client_evict(c, "m", NULL, &res));

  /* f resident: m does not fit, refused before anything loads, f not evicted */
  CHECK_RC(nwc_client_load(c, "f", NULL, NULL, NULL, &res));
  int rc = nwc_client_load_places(c, "m", NULL, cpu, 1, NWC_CLIENT_LOAD_SPLIT, NULL, NULL, &res);
  char want_t[128], want_free[128];
  snprintf(want_t, sizeof want_t, "m/%s needs ", names[order[k]]);
  /* host memory's free bytes as the plan saw them at that tensor: after the k before it */
  snprintf(want_free, sizeof want_free, "cpu %s (%llu bytes) free", nwc_size_text(4096 * j, bs),
           (unsigned long long)(4096 * j));
  const char *msg = nwc_client_last_error();
  CHECK(rc == -ENOSPC && strstr(msg, want_t) && strstr(msg, want_free) &&
            strstr(msg, "nothing loaded"),
        "split of m with f resident: %d '%s' (want %s and %s)", rc, msg, want_t, want_free);
  size_t fp;
  CHECK(ps_rows(c, "m", &pinned) == 0 && ps_rows(c, "f", &fp) == 1,
        "after a refused split: m or f changed in ps");
  /* a GPU named on the cpu backend */
  int gpu[] = {0, NWC_CLIENT_CPU};
  rc = nwc_client_load_places(c, "m", NULL, gpu, 2, NWC_CLIENT_LOAD_SPLIT, NULL, NULL, &res);
  CHECK(rc == -ENODEV && strstr(nwc_client_last_error(), "no device cuda:0"),
        "split over cuda:0,cpu on the cpu backend: %d %s", rc, nwc_client_last_error());
  rc = nwc_client_load_places(c, "m", NULL, cpu, 1, 4, NULL, NULL, &res);
  CHECK(rc == -EINVAL, "load_places flags 4 in the library: %d", rc);
  CHECK_RC(nwc_client_stats(c, &(nwc_client_counters){0})); /* serving */

  CHECK_RC(nwc_client_evict(c, "f", NULL, &res));
  check_nwcctl();
  CHECK(ps_rows(c, "m", &pinned) == nt && pinned == nt, "ps after nwcctl pin --split");
  nwc_client_free(c);
  CHECK(td_stop_daemon(d) == 0, "SIGTERM did not exit 0");
  if (test_failures) td_show_log();
  td_cleanup();
  return test_exit("test_daemon_split");
}
