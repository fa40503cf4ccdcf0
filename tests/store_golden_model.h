/*
 * store_golden_model.h - the fixed model of the store's golden containers (tests/golden/
 * store_container_v*.nwc), shared by test_store_golden (which makes and reads them) and
 * test_store_migrate (which opens a store built around the version-1 one): its weights from a
 * fixed seed, the expected value of each, and the blob header of a golden file read into a
 * catalog row's decoder fields.  GOLDEN_DIR is tests/golden (the build defines it).
 */
#ifndef NWC_STORE_GOLDEN_MODEL_H
#define NWC_STORE_GOLDEN_MODEL_H

#include "test_store_util.h"

#ifndef GOLDEN_DIR
#define GOLDEN_DIR "tests/golden"
#endif

/* w: BF16 BM x BK; f8.weight: F8_E4M3 FM x FK with its per-row F32 scale (folded; the scale is
 * stored as a tensor too); big (version 2 on): BF16 LM x LK, large enough not to be packed. */
enum { GM_BM = 16, GM_BK = 600, GM_FM = 8, GM_FK = 40, GM_LM = 64, GM_LK = 1024 };
static uint16_t gm_w[GM_BM * GM_BK], gm_big[GM_LM * GM_LK];
static uint8_t gm_f8[GM_FM * GM_FK];
static float gm_sc[GM_FM];

/* Fills the weights (from a fixed seed, not the test's random one). */
static inline void gm_make(void) {
  uint64_t x = 20261201;
  for (int i = 0; i < GM_BM * GM_BK; i++) {
    double g = (double)(test_splitmix(&x) >> 11) * 0x1p-53 - 0.5;
    gm_w[i] = nwc_f32_to_bf16((float)(g * 0.1));
  }
  for (int i = 0; i < GM_FM * GM_FK; i++) {
    uint8_t b = (uint8_t)test_splitmix(&x);
    gm_f8[i] = (b & 0x7f) == 0x7f ? 0 : b;
  }
  for (int i = 0; i < GM_FM; i++) gm_sc[i] = 0.25f * (float)(i + 1);
  for (int i = 0; i < GM_LM * GM_LK; i++) {
    double g = (double)(test_splitmix(&x) >> 11) * 0x1p-53 - 0.5;
    gm_big[i] = nwc_f32_to_bf16((float)(g * 0.02));
  }
}

/* The dequantized weight (r, c) of the model's tensor of that shape, as BF16 bits. */
static inline uint16_t gm_want(uint64_t rows, uint64_t cols, uint64_t r, uint64_t c) {
  if (rows == GM_BM && cols == GM_BK) return gm_w[r * GM_BK + c];
  if (rows == GM_FM && cols == GM_FK) return nwc_fp8_to_bf16(gm_f8[r * GM_FK + c]);
  if (rows == GM_LM && cols == GM_LK) return gm_big[r * GM_LK + c];
  return nwc_f32_to_bf16(gm_sc[c]);
}

/* A whole file into memory (malloc'ed, *len its bytes), or NULL. */
/* Weights of t (decoded with nwc_dequant) that differ from gm_want; UINT64_MAX if it fails. */
static inline uint64_t gm_count_wrong(const nwc_tensor *t) {
  uint64_t lay[4];
  nwc_layout(t->rows, t->cols, t->elem, lay);
  uint16_t *out = malloc(t->rows * lay[NWC_LAYOUT_K16] * 2);
  uint64_t bad = UINT64_MAX;
  if (out && nwc_dequant(t, out) == 0) {
    bad = 0;
    for (uint64_t r = 0; r < t->rows; r++)
      for (uint64_t c = 0; c < t->cols; c++) bad += out[r * lay[NWC_LAYOUT_K16] + c] != gm_want(t->rows, t->cols, r, c);
  }
  free(out);
  return bad;
}

static inline uint8_t *gm_slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc((size_t)n + 1);
  *len = b ? fread(b, 1, (size_t)n, f) : 0;
  fclose(f);
  return b;
}

static inline uint64_t gm_get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* The decoder fields of the blob whose header is at h, in a container of that version, into
 * *ti (the rest zeroed); returns the blob's length by the version's rule (1: on whole pages;
 * 2: under NWC_STORE_PACK_MAX rounded to 64, else to whole pages: the last blob of a run of
 * packed ones has the zeros to the run's end on top), and sets *packed. */
static inline uint64_t gm_blob_info(const uint8_t *h, unsigned version, nwc_tensor_info *ti,
                                    int *packed) {
  memset(ti, 0, sizeof *ti);
  uint16_t ver;
  memcpy(&ver, h + 4, 2);
  ti->format_version = ver, ti->elem = h[6], ti->container = gm_get64(h + 8);
  ti->rows = gm_get64(h + 16), ti->cols = gm_get64(h + 24);
  memcpy(ti->psym, h + 32, 16);
  ti->nblocks = gm_get64(h + 48), ti->data_bytes = gm_get64(h + 56);
  ti->raw_plane_bytes = gm_get64(h + 64);
  ti->off_bases = gm_get64(h + 72), ti->off_hdr = gm_get64(h + 80);
  ti->off_data = gm_get64(h + 88), ti->off_raw = gm_get64(h + 96);
  ti->off_scale = gm_get64(h + 104);
  uint64_t end = ti->off_scale ? ti->off_scale + ti->rows * 4 : ti->off_raw + ti->raw_plane_bytes;
  uint64_t small = (end + 63) / 64 * 64;
  *packed = version >= 2 && small < NWC_STORE_PACK_MAX;
  ti->length = *packed ? small : (end + 4095) / 4096 * 4096;
  return ti->length;
}

#endif
