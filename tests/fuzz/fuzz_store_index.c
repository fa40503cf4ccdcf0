/*
 * fuzz_store_index.c - libFuzzer target for nwc_st_index_parse, the parser of a sharded model's
 * model.safetensors.index.json (bytes from outside).  Whatever parses is walked: every tensor
 * maps to a shard inside the shard list, every shard name is a plain file name (no '/', not "."
 * or ".."), and the names are real strings.  Replayed over corpus/store_index under ctest.
 */
#include "safetensors.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile size_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *copy = malloc(size ? size : 1); /* exactly sized, so overreads are caught */
  if (!copy) return 0;
  if (size) memcpy(copy, data, size);
  nwc_st_index *x = NULL;
  if (nwc_st_index_parse(copy, size, &x) == 0) {
    size_t sum = 0;
    for (size_t i = 0; i < x->nshards; i++) {
      const char *s = x->shards[i];
      if (!*s || strchr(s, '/') || !strcmp(s, ".") || !strcmp(s, "..")) abort();
      sum += strlen(s);
    }
    for (size_t i = 0; i < x->count; i++) {
      if (x->shard_of[i] >= x->nshards) abort();
      sum += strlen(x->names[i]);
    }
    sink = sum;
  }
  nwc_st_index_free(x);
  free(copy);
  return 0;
}
