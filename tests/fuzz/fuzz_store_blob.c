/*
 * fuzz_store_blob.c - libFuzzer target for the store's blob reader (nwc_store_blob_view and
 * nwc_store_chunk_check): a tensor blob as read from a container file, with the catalog row
 * taken from the blob's own header so that mutations reach the section and tensor checks.  Each
 * input runs as is and again with the blob header checksum recomputed; whatever is accepted is
 * decoded in full.  Replayed over corpus/store_blob under ctest.
 */
#include "nwc_store.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

static void run(uint8_t *blob, size_t size) {
  if (size < 128) return;
  uint64_t sum = 0;
  nwc_tensor_info ti;
  memset(&ti, 0, sizeof ti);
  ti.model = (char *)"fuzz";
  ti.name = (char *)"blob";
  ti.path = (char *)"fuzz.nwc";
  uint16_t ver;
  memcpy(&ver, blob + 4, 2);
  ti.format_version = ver;
  ti.elem = blob[6];
  ti.container = get64(blob + 8);
  ti.rows = get64(blob + 16);
  ti.cols = get64(blob + 24);
  memcpy(ti.psym, blob + 32, 16);
  ti.nblocks = get64(blob + 48);
  ti.data_bytes = get64(blob + 56);
  ti.raw_plane_bytes = get64(blob + 64);
  ti.off_bases = get64(blob + 72);
  ti.off_hdr = get64(blob + 80);
  ti.off_data = get64(blob + 88);
  ti.off_raw = get64(blob + 96);
  ti.off_scale = get64(blob + 104);
  if ((blob[7] & 1) != (ti.off_scale != 0)) return;
  ti.length = size;
  ti.chunk_size = NWC_STORE_CHUNK;
  ti.nchunks = (size + NWC_STORE_CHUNK - 1) / NWC_STORE_CHUNK;
  uint64_t sums[8];
  if (ti.nchunks > 8) return;
  for (uint64_t i = 0; i < ti.nchunks; i++) {
    uint64_t o = i * NWC_STORE_CHUNK, n = size - o < NWC_STORE_CHUNK ? size - o : NWC_STORE_CHUNK;
    sums[i] = XXH3_64bits(blob + o, n);
  }
  ti.checksums = sums;
  for (uint64_t i = 0; i < ti.nchunks; i++)
    if (nwc_store_chunk_check(&ti, i, blob + i * NWC_STORE_CHUNK) != 0) abort();
  nwc_tensor t;
  if (nwc_store_blob_view(&ti, blob, &t) != 0) return;
  uint64_t lay[4];
  if (nwc_layout(t.rows, t.cols, t.elem, lay) != 0) abort(); /* validated, so it has a layout */
  uint16_t *out = malloc(t.rows * lay[NWC_LAYOUT_K16] * 2);
  if (out && nwc_dequant(&t, out) == 0)
    for (uint64_t i = 0; i < t.rows * lay[NWC_LAYOUT_K16]; i++) sum += out[i];
  free(out);
  (void)sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* Exactly sized copies (malloc: 16-aligned), as is, then with the header checksum fixed. */
  uint8_t *blob = malloc(size ? size : 1);
  if (!blob) return 0;
  for (int pass = 0; pass < 2; pass++) {
    if (size) memcpy(blob, data, size);
    if (pass && size >= 128) {
      uint64_t h = XXH3_64bits(blob, 120);
      memcpy(blob + 120, &h, 8);
    }
    run(blob, size);
  }
  free(blob);
  return 0;
}
