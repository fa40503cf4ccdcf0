/*
 * test_daemon_pack.c - packed blobs (docs/store.md, "Packed blobs") end to end: a few thousand
 * tiny tensors of random shapes and dtypes (and two large ones among them) imported by a real
 * nwcd, then
 *   (a) the container's size: at most the header, each blob's own bytes (read from the blob
 *       headers in the file: the end of its last section, rounded up to 64 for a packed blob and
 *       to 4096 for a large one) and, per run of packed blobs, under 4096 bytes of zeros to the
 *       run's page end, runs being at most 1 + packed bytes / (1 MiB - 64 KiB).  So the store is
 *       within 1% + 8 KiB of its blobs, where one page per tensor was 10-20 times that here;
 *       placement: packed blobs on 64-byte boundaries, large ones on whole pages;
 *   (b) every tensor through nwcd (dequant, gather of random rows) and through a host map equals
 *       the original weights (BF16 bits; F32 rounded to nearest even), and a map's bytes past its
 *       blob are zeros (no neighbour's bytes reach a client);
 *   (c) verify passes; a byte flipped in a packed blob that shares its page is found by verify
 *       naming that tensor and no other; once evicted, that tensor fails to load naming itself
 *       while its neighbours in the page still read back exactly;
 *   (d) under a budget of 16 pages, where loads go into the pages of evicted copies (spares),
 *       maps still show zeros past their blobs, never the bytes of the tensor a page held before.
 * Shapes, dtypes and the flipped byte come from the printed seed.
 */
#include "test_daemon_util.h"
#include "test_store_util.h"

#include "nwc_client.h"

#define PACK_RUN (1u << 20) /* the import's run buffer (store/import_encode.c) */

typedef struct tt {
  char name[16];
  uint64_t rows, cols;
  int f32;
  uint16_t *want; /* rows x cols BF16 bits */
  void *src;      /* the file's bytes */
  size_t bytes;
  nwc_client_tensor_info info;
  uint64_t end; /* the end of the blob's last section, from its header in the container */
} tt;

static uint64_t rd64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

static void make(tt *t, unsigned i, uint64_t rows, uint64_t cols, int f32) {
  snprintf(t->name, sizeof t->name, "p%05u", i);
  t->rows = rows, t->cols = cols, t->f32 = f32;
  uint64_t n = rows * cols;
  t->want = malloc(n * 2);
  t->bytes = n * (f32 ? 4 : 2);
  t->src = malloc(t->bytes);
  double s = 0.001 + test_uniform() * 0.1;
  for (uint64_t k = 0; k < n; k++) {
    float v = (float)((test_uniform() - 0.5) * s);
    if (f32) {
      memcpy((float *)t->src + k, &v, 4);
      t->want[k] = nwc_f32_to_bf16(v);
    } else {
      t->want[k] = nwc_f32_to_bf16(v);
      memcpy((uint16_t *)t->src + k, &t->want[k], 2);
    }
  }
}

/* Checks t through nwcd (dequant, gather) and through a map. */
static void check_reads(nwc_client *c, const tt *t) {
  uint64_t n = t->rows * t->cols;
  uint16_t *got = malloc((n > 3 * t->cols ? n : 3 * t->cols) * 2); /* the tensor, or 3 rows */
  uint64_t rows = 0, cols = 0;
  int rc = nwc_client_dequant(c, "pack", t->name, NWC_CLIENT_BF16, got, n * 2, &rows, &cols, NULL);
  CHECK(rc == 0 && rows == t->rows && cols == t->cols && !memcmp(got, t->want, n * 2),
        "dequant %s (%llux%llu): %d %s", t->name, (unsigned long long)t->rows,
        (unsigned long long)t->cols, rc, rc ? nwc_client_last_error() : "not the weights");
  uint64_t pick[3] = {test_below(t->rows), test_below(t->rows), t->rows - 1};
  rc = nwc_client_gather(c, "pack", t->name, pick, 3, NWC_CLIENT_BF16, got, 3 * t->cols * 2, &cols,
                         NULL);
  for (int k = 0; rc == 0 && k < 3; k++)
    CHECK(!memcmp(got + k * t->cols, t->want + pick[k] * t->cols, t->cols * 2),
          "gather %s row %llu: not the weights", t->name, (unsigned long long)pick[k]);
  CHECK(rc == 0, "gather %s: %d %s", t->name, rc, nwc_client_last_error());
  nwc_client_mapping *m = NULL;
  rc = nwc_client_map(c, "pack", t->name, &m);
  CHECK(rc == 0, "map %s: %d %s", t->name, rc, nwc_client_last_error());
  if (m) {
    memset(got, 0, n * 2);
    CHECK(nwc_client_map_dequant(m, NWC_CLIENT_BF16, got, n * 2) == 0 &&
              !memcmp(got, t->want, n * 2),
          "map of %s: not the weights", t->name);
    const nwc_client_map_info *mi = nwc_client_mapping_info(m);
    const uint8_t *b = mi->base;
    uint64_t nonzero = 0;
    for (uint64_t k = t->info.length; k < mi->size; k++) nonzero += b[k] != 0;
    CHECK(nonzero == 0, "map of %s: %llu bytes past its %llu-byte blob are not zero", t->name,
          (unsigned long long)nonzero, (unsigned long long)t->info.length);
    nwc_client_unmap(m);
  }
  free(got);
}

typedef struct lines {
  unsigned n, naming;
  const char *name;
} lines;

static void on_line(void *ctx, const char *line) {
  lines *l = ctx;
  char key[32];
  snprintf(key, sizeof key, "'%s'", l->name);
  l->n++;
  l->naming += strstr(line, key) != NULL;
  printf("verify: %s\n", line);
}

static int cmp_off(const void *a, const void *b) {
  const tt *x = *(tt *const *)a, *y = *(tt *const *)b;
  return (x->info.offset > y->info.offset) - (x->info.offset < y->info.offset);
}

int main(void) {
  test_seed("test_daemon_pack");
  if (td_mkdir("nwc-pack") < 0) return 1;
  unsigned n = 2000 + (unsigned)test_below(2000);
  tt *t = calloc(n, sizeof *t);
  st_spec *spec = calloc(n, sizeof *spec);
  uint64_t source = 0;
  for (unsigned i = 0; i < n; i++) {
    unsigned kind = (unsigned)test_below(100);
    if (i == n / 3 || i == 2 * n / 3) make(&t[i], i, 128, 600, 0); /* large: its own pages */
    else if (kind < 80) make(&t[i], i, 1, 1 + test_below(256), 0);
    else if (kind < 92) make(&t[i], i, 1 + test_below(8), 1 + test_below(300), 0);
    else make(&t[i], i, 1, 1 + test_below(128), 1);
    spec[i] = (st_spec){t[i].name, t[i].f32 ? "F32" : "BF16", t[i].rows > 1 ? 2u : 1u,
                        {t[i].rows > 1 ? t[i].rows : t[i].cols, t[i].cols}, t[i].src, t[i].bytes};
    source += t[i].bytes;
  }
  char path[600];
  snprintf(path, sizeof path, "%s/pack.safetensors", td_dir);
  CHECK_RC(st_write(path, spec, n));
  pid_t d = td_start_daemon(NULL);
  CHECK(d > 0, "nwcd did not start");
  nwc_client *c = NULL;
  if (d > 0) CHECK_RC(nwc_client_connect(td_sock, &c));
  if (!c) {
    td_show_log();
    return test_exit("test_daemon_pack");
  }
  CHECK_RC(nwc_client_import(c, "pack", path, NULL, NULL));
  for (unsigned i = 0; i < n; i++) CHECK_RC(nwc_client_info(c, "pack", t[i].name, &t[i].info));

  /* (a) the container's bytes against its blobs' own */
  int fd = open(t[0].info.path, O_RDWR | O_CLOEXEC);
  struct stat st = {0};
  CHECK(fd >= 0 && fstat(fd, &st) == 0, "container %s", t[0].info.path);
  uint64_t blobs = 0, packed = 0, npacked = 0, pages = 4096;
  for (unsigned i = 0; fd >= 0 && i < n; i++) {
    uint8_t h[128];
    CHECK(pread(fd, h, 128, (off_t)t[i].info.offset) == 128 && !memcmp(h, "NWCB", 4),
          "%s: no blob header at %llu", t[i].name, (unsigned long long)t[i].info.offset);
    t[i].end = rd64(h + 104) ? rd64(h + 104) + rd64(h + 16) * 4 : rd64(h + 96) + rd64(h + 64);
    uint64_t small = (t[i].end + 63) / 64 * 64, page = (t[i].end + 4095) / 4096 * 4096;
    int pk = small < 65536;
    const nwc_client_tensor_info *in = &t[i].info;
    CHECK(pk ? in->offset % 64 == 0 && in->length >= small && in->length < small + 4096
             : in->offset % 4096 == 0 && in->length == page,
          "%s: blob at %llu, %llu bytes for %llu of content (%s)", t[i].name,
          (unsigned long long)in->offset, (unsigned long long)in->length,
          (unsigned long long)t[i].end, pk ? "packed" : "large");
    blobs += pk ? small : page, packed += pk ? small : 0, npacked += (uint64_t)pk;
    pages += page;
  }
  uint64_t runs = 1 + packed / (PACK_RUN - 65536), size = (uint64_t)st.st_size;
  CHECK(size >= 4096 + blobs && size - 4096 - blobs < 4096 * runs,
        "container of %llu bytes for %llu bytes of blobs (%llu runs at most)",
        (unsigned long long)size, (unsigned long long)blobs, (unsigned long long)runs);
  CHECK(size <= blobs + blobs / 100 + 8192 + 4096, "container %llu > blobs %llu + 1%% + 12 KiB",
        (unsigned long long)size, (unsigned long long)blobs);
  printf("%u tensors (%llu packed), %llu source bytes: container %llu bytes (%.2f x source; "
         "blobs %llu; one page per blob would be %llu, %.1f x this)\n",
         n, (unsigned long long)npacked, (unsigned long long)source, (unsigned long long)size,
         (double)size / (double)source, (unsigned long long)blobs, (unsigned long long)pages,
         (double)pages / (double)size);

  /* (b) every tensor, through nwcd and through a map */
  for (unsigned i = 0; i < n && test_failures < 10; i++) check_reads(c, &t[i]);

  /* (c) verify, then one flipped byte in a packed blob with neighbours in its page */
  lines l = {0, 0, ""};
  nwc_client_result res;
  CHECK(nwc_client_verify(c, "pack", on_line, &l, &res) == 0 && res.problems == 0 && l.n == 0,
        "verify of the fresh store: %s", nwc_client_last_error());
  tt **by = malloc(n * sizeof *by);
  for (unsigned i = 0; i < n; i++) by[i] = &t[i];
  qsort(by, n, sizeof *by, cmp_off);
  unsigned k = 0;
  for (unsigned tries = 0; tries < 10000 && !k; tries++) {
    unsigned j = 1 + (unsigned)test_below(n - 2);
    const nwc_client_tensor_info *a = &by[j - 1]->info, *b = &by[j]->info, *z = &by[j + 1]->info;
    if (b->length < 65536 && a->offset / 4096 == b->offset / 4096 &&
        (b->offset + b->length - 1) / 4096 == z->offset / 4096 && a->length < 65536 &&
        z->length < 65536)
      k = j;
  }
  CHECK(k > 0, "no packed blob between two neighbours in its pages");
  if (k > 0 && fd >= 0) {
    tt *v = by[k];
    uint64_t at = v->info.offset + test_below(v->info.length);
    uint8_t byte = 0, bit = (uint8_t)(1u << test_below(8));
    CHECK(pread(fd, &byte, 1, (off_t)at) == 1, "read byte %llu", (unsigned long long)at);
    byte ^= bit;
    CHECK(pwrite(fd, &byte, 1, (off_t)at) == 1, "flip byte %llu", (unsigned long long)at);
    printf("flipped bit 0x%02x of byte %llu: tensor %s (blob at %llu, %llu bytes)\n", bit,
           (unsigned long long)at, v->name, (unsigned long long)v->info.offset,
           (unsigned long long)v->info.length);
    l = (lines){0, 0, v->name};
    int rc = nwc_client_verify(c, "pack", on_line, &l, &res);
    CHECK(rc == 0 && res.problems == 1 && l.n == 1 && l.naming == 1, /* the run completed */
          "verify after the flip: %d, %llu problems, %u lines, %u naming %s", rc,
          (unsigned long long)res.problems, l.n, l.naming, v->name);
    CHECK_RC(nwc_client_evict(c, "pack", NULL, NULL));
    uint64_t nn = v->rows * v->cols;
    uint16_t *got = malloc(nn * 2);
    rc = nwc_client_dequant(c, "pack", v->name, NWC_CLIENT_BF16, got, nn * 2, NULL, NULL, NULL);
    CHECK(rc == -EBADMSG && strstr(nwc_client_last_error(), v->name),
          "dequant of the flipped %s: %d %s", v->name, rc, nwc_client_last_error());
    free(got);
    check_reads(c, by[k - 1]);
    check_reads(c, by[k + 1]);
  }
  if (fd >= 0) close(fd);
  nwc_client_free(c);
  CHECK(td_stop_daemon(d) == 0, "nwcd did not stop cleanly");

  /* (d) spares: dequants of a few tensors fill the budget and evict each other (never mapped,
   * so their pages are kept for later loads), then maps of others load into those pages. */
  const char *small[] = {"--budget", "65536", NULL};
  d = td_start_daemon(small);
  CHECK(d > 0, "nwcd --budget 65536 did not start");
  c = NULL;
  if (d > 0) CHECK_RC(nwc_client_connect(td_sock, &c));
  for (int round = 0; c && round < 20 && test_failures < 10; round++) {
    for (int i = 0; i < 24; i++) {
      const tt *a = by[test_below(n)];
      if (a->info.length >= 65536 || (k > 0 && a == by[k])) continue; /* by[k]: flipped */
      uint64_t nn = a->rows * a->cols;
      uint16_t *got = malloc(nn * 2);
      CHECK_RC(nwc_client_dequant(c, "pack", a->name, NWC_CLIENT_BF16, got, nn * 2, NULL, NULL,
                                  NULL));
      free(got);
    }
    const tt *m = by[test_below(n)];
    if (m->info.length < 65536 && (k == 0 || m != by[k])) check_reads(c, m);
  }
  nwc_client_free(c);
  if (d > 0) CHECK(td_stop_daemon(d) == 0, "nwcd --budget 65536 did not stop cleanly");
  if (test_failures) td_show_log();
  td_cleanup();
  for (unsigned i = 0; i < n; i++) free(t[i].want), free(t[i].src);
  free(t), free(spec), free(by);
  return test_exit("test_daemon_pack");
}
