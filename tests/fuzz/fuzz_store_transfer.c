/*
 * fuzz_store_transfer.c - libFuzzer target for the store's parser of a transfer config (the
 * catalog rows of a pulled model: bytes from a registry), nwc_store_receive_open, on a store in a
 * temporary directory.  Whatever it accepts must describe a container of at least its header; the
 * receive is then fed zeros up to the first chunk (refused there: no config's checksum is of
 * zeros but the fuzzer's own) and closed, which must leave no file.  Replayed over
 * corpus/store_transfer under ctest.
 */
#include "nwc_store.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static nwc_store *store;
static char dir[64];

static void close_store(void) {
  nwc_store_close(store);
  char p[128];
  snprintf(p, sizeof p, "rm -rf '%s'", dir);
  if (system(p) != 0) perror("rm");
}

static int container_files(void) {
  char p[128];
  snprintf(p, sizeof p, "%s/containers", dir);
  DIR *d = opendir(p);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
  if (d) closedir(d);
  return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!store) {
    snprintf(dir, sizeof dir, "/tmp/nwc-fuzz-transfer-XXXXXX");
    if (!mkdtemp(dir) || nwc_store_open(dir, NWC_STORE_CREATE, &store) < 0) abort();
    atexit(close_store);
  }
  char *copy = malloc(size ? size : 1); /* exactly sized, so overreads are caught */
  if (!copy) return 0;
  if (size) memcpy(copy, data, size);
  nwc_store_receive *r = NULL;
  if (nwc_store_receive_open(store, "fuzz", copy, size, &r) == 0) {
    if (nwc_store_receive_size(r) < 4096) abort();
    static uint8_t zeros[4096];
    (void)nwc_store_receive_write(r, zeros, sizeof zeros);
    nwc_store_receive_close(r);
  }
  if (container_files() != 0) abort();
  free(copy);
  return 0;
}
