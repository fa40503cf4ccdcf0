/*
 * fuzz_safetensors.c - libFuzzer target for nwc_st_parse (safetensors files are bytes from
 * outside).  Whatever parses is walked: every tensor's byte range is read through nwc_st_data (a
 * range outside the buffer is then an overread the sanitizer reports) and looked up by name.
 * Built as a real fuzzer with clang (tests/fuzz/README.md) and replayed over the corpus by
 * fuzz_replay under ctest.
 */
#include "safetensors.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile unsigned sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* An exactly sized copy, so that reads past the end are caught even when replayed. */
  uint8_t *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  if (size) memcpy(copy, data, size);
  nwc_st_file *f = NULL;
  if (nwc_st_parse(copy, size, &f) == 0) {
    unsigned sum = 0;
    for (size_t i = 0; i < f->count; i++) {
      const nwc_st_tensor *t = &f->tensors[i];
      const uint8_t *p = nwc_st_data(f, t);
      for (uint64_t j = 0; j < t->end - t->begin; j++) sum += p[j];
      if (nwc_st_find(f, t->name) == NULL) abort(); /* a parsed name must be found */
    }
    sink = sum;
    nwc_st_close(f);
  }
  free(copy);
  return 0;
}
