/*
 * test_store_golden.c - freezes the container file format (docs/store.md): a fixed model (fixed
 * weights, one thread, a fresh store, so container id 1) must produce a container byte-identical
 * to tests/golden/store_container_v2.nwc (three small tensors packed into one run of blobs, one
 * large one on whole pages), and the golden files of every container version this build reads
 * (store_container_v1.nwc: what the version-1 writer made of the three small tensors, each on
 * pages of its own) must read back through the blob reader to the same weights.  Regenerate the current
 * one (only with a deliberate format change, bumping NWC_CONTAINER_VERSION, keeping the old file
 * and adding its version to the read-back list, or the codec's NWC_FORMAT_VERSION) with
 * NWC_GOLDEN_WRITE=1.
 */
#include "store_internal.h"
#include "store_golden_model.h"

/* Reads a golden container of the given version: its header, then each blob through the blob
 * reader, walking the file by the version's rule (1: every blob on whole pages; 2: a blob under
 * NWC_STORE_PACK_MAX packed at 64, the zeros up to its run's page end after the run's last).
 * Returns the blobs found (all of them decoded to the fixed weights). */
static int read_golden(const char *gpath, unsigned version) {
  size_t glen = 0;
  uint8_t *gold = gm_slurp(gpath, &glen);
  CHECK(gold != NULL, "missing %s", gpath);
  if (!gold) return 0;
  CHECK_RC(nwc__container_header_check(gold, 1, gpath));
  uint32_t v;
  memcpy(&v, gold + 8, 4);
  CHECK(v == version, "%s: container version %u, expected %u", gpath, v, version);
  uint64_t off = 4096;
  int found = 0, packed = 0;
  while (off + 128 <= glen) {
    const uint8_t *h = gold + off;
    nwc_tensor_info ti;
    int pk;
    gm_blob_info(h, version, &ti, &pk);
    ti.model = (char *)"golden", ti.name = (char *)"?", ti.path = (char *)gpath;
    nwc_tensor t;
    int rc = nwc_store_blob_view(&ti, h, &t);
    CHECK(rc == 0, "%s: blob at %llu: %s", gpath, (unsigned long long)off, nwc_error_detail());
    if (rc) break;
    const uint64_t bad = gm_count_wrong(&t);
    CHECK(bad == 0, "%s: blob %llux%llu: %llu weights differ", gpath, (unsigned long long)t.rows,
          (unsigned long long)t.cols, (unsigned long long)bad);
    if (t.rows == GM_FM && t.cols == GM_FK)
      for (int r = 0; r < GM_FM; r++) CHECK(t.scale && t.scale[r] == gm_sc[r], "golden fp8 scale");
    found++, packed += pk;
    off += ti.length;
    if (pk && off % 4096 && (off + 4 > glen || memcmp(gold + off, "NWCB", 4))) {
      uint64_t to = (off + 4095) / 4096 * 4096; /* the run's end: zeros */
      for (; off < to && off < glen; off++)
        CHECK(gold[off] == 0, "%s: byte %llu after a run", gpath, (unsigned long long)off);
    }
  }
  CHECK(off == glen, "%s: %d blobs, ends at %llu of %zu", gpath, found, (unsigned long long)off,
        glen);
  printf("%s: %d blobs (%d packed), %zu bytes\n", gpath, found, packed, glen);
  free(gold);
  return found;
}

int main(void) {
  test_seed("test_store_golden");
  gm_make();
  st_spec spec[] = {{"w", "BF16", 2, {GM_BM, GM_BK}, gm_w, sizeof gm_w},
                    {"f8.weight", "F8_E4M3", 2, {GM_FM, GM_FK}, gm_f8, sizeof gm_f8},
                    {"f8.weight_scale", "F32", 1, {GM_FM}, gm_sc, sizeof gm_sc},
                    {"big", "BF16", 2, {GM_LM, GM_LK}, gm_big, sizeof gm_big}};
  char dir[512], src[512], path[700], cont[800];
  make_tmpdir(dir, sizeof dir, "store");
  make_tmpdir(src, sizeof src, "src");
  snprintf(path, sizeof path, "%s/g.safetensors", src);
  CHECK_RC(st_write(path, spec, 4));
  nwc_store *s;
  CHECK_RC(nwc_store_open(dir, NWC_STORE_CREATE, &s));
  nwc_import_opts o = {.threads = 1};
  CHECK_RC(nwc_store_import(s, "golden", path, &o));
  nwc_store_close(s);
  snprintf(cont, sizeof cont, "%s/containers/0000000000000001.nwc", dir);
  size_t len = 0, glen = 0;
  uint8_t *made = gm_slurp(cont, &len);
  const char *gpath = GOLDEN_DIR "/store_container_v2.nwc";
  if (getenv("NWC_GOLDEN_WRITE")) {
    CHECK(made && write_file(gpath, made, len) == 0, "write %s", gpath);
    printf("wrote %s (%zu bytes)\n", gpath, len);
  }
  uint8_t *gold = gm_slurp(gpath, &glen);
  CHECK(gold != NULL, "missing %s", gpath);
  CHECK(made && gold && len == glen && !memcmp(made, gold, len),
        "the container differs from %s (%zu vs %zu bytes): the format moved", gpath, len, glen);
  CHECK(read_golden(gpath, 2) == 4, "version 2: the four tensors");
  CHECK(read_golden(GOLDEN_DIR "/store_container_v1.nwc", 1) == 3, "version 1: the three tensors");
  free(made);
  free(gold);
  rm_rf(dir);
  rm_rf(src);
  return test_exit("test_store_golden");
}
