/*
 * abi_dump.c - prints, as one JSON object, the size of every public struct of nwc_client.h and
 * the offset and size of each of its fields: tests/python/test_abi.py checks the ctypes mirrors
 * of python/nwc/_lib.py (and nwc_cuda.h's nwc_cuda_tensor against python/nwc/_cuda.py's) against
 * what the C compiler lays out.
 */
#include "nwc_client.h"
#include "nwc_cuda.h"

#include <stddef.h>
#include <stdio.h>

static int first;
#define S(T) printf("%s\"%s\": {\"sizeof\": %zu", first++ ? "}, " : "{", #T, sizeof(T))
#define F(T, f) printf(", \"%s\": [%zu, %zu]", #f, offsetof(T, f), sizeof(((T *)0)->f))

int main(void) {
  S(nwc_client_model);
  F(nwc_client_model, name), F(nwc_client_model, tensors), F(nwc_client_model, raw_bytes);
  F(nwc_client_model, nwc_bytes), F(nwc_client_model, resident_bytes);
  F(nwc_client_model, created), F(nwc_client_model, verified);
  S(nwc_client_tensor);
  F(nwc_client_tensor, name), F(nwc_client_tensor, ndim), F(nwc_client_tensor, shape);
  F(nwc_client_tensor, dtype), F(nwc_client_tensor, elem), F(nwc_client_tensor, rows);
  F(nwc_client_tensor, cols), F(nwc_client_tensor, raw_bytes), F(nwc_client_tensor, nwc_bytes);
  F(nwc_client_tensor, state), F(nwc_client_tensor, pinned), F(nwc_client_tensor, refs);
  F(nwc_client_tensor, last_used_ms);
  S(nwc_client_tensor_info);
  F(nwc_client_tensor_info, t), F(nwc_client_tensor_info, conversion);
  F(nwc_client_tensor_info, path), F(nwc_client_tensor_info, offset);
  F(nwc_client_tensor_info, length), F(nwc_client_tensor_info, nchunks);
  F(nwc_client_tensor_info, nblocks), F(nwc_client_tensor_info, data_bytes);
  F(nwc_client_tensor_info, format_version);
  S(nwc_client_resident);
  F(nwc_client_resident, model), F(nwc_client_resident, tensor), F(nwc_client_resident, bytes);
  F(nwc_client_resident, pinned), F(nwc_client_resident, locked), F(nwc_client_resident, direct);
  F(nwc_client_resident, refs), F(nwc_client_resident, last_used_ms);
  F(nwc_client_resident, maps), F(nwc_client_resident, device);
  S(nwc_client_result);
  F(nwc_client_result, tensors), F(nwc_client_result, bytes), F(nwc_client_result, skipped);
  F(nwc_client_result, micros), F(nwc_client_result, direct), F(nwc_client_result, buffered);
  F(nwc_client_result, raw_bytes), F(nwc_client_result, chunks), F(nwc_client_result, problems);
  S(nwc_client_counters);
  F(nwc_client_counters, uptime_ms), F(nwc_client_counters, threads);
  F(nwc_client_counters, gpu_budget), F(nwc_client_counters, gpu_resident_bytes);
  F(nwc_client_counters, backend);
  S(nwc_client_place);
  F(nwc_client_place, name), F(nwc_client_place, budget), F(nwc_client_place, resident_bytes);
  F(nwc_client_place, resident_tensors), F(nwc_client_place, pinned_bytes);
  F(nwc_client_place, mem_free), F(nwc_client_place, mem_total), F(nwc_client_place, pool_idle);
  S(nwc_client_import_opts);
  F(nwc_client_import_opts, elem), F(nwc_client_import_opts, layout);
  F(nwc_client_import_opts, progress), F(nwc_client_import_opts, ctx);
  S(nwc_client_skipped);
  F(nwc_client_skipped, name), F(nwc_client_skipped, ndim), F(nwc_client_skipped, shape);
  F(nwc_client_skipped, dtype);
  S(nwc_client_map_info);
  F(nwc_client_map_info, rows), F(nwc_client_map_info, cols), F(nwc_client_map_info, elem);
  F(nwc_client_map_info, base), F(nwc_client_map_info, size), F(nwc_client_map_info, fd);
  F(nwc_client_map_info, maps), F(nwc_client_map_info, locked);
  S(nwc_cuda_tensor);
  F(nwc_cuda_tensor, name), F(nwc_cuda_tensor, elem), F(nwc_cuda_tensor, rows);
  F(nwc_cuda_tensor, cols), F(nwc_cuda_tensor, k16), F(nwc_cuda_tensor, k);
  F(nwc_cuda_tensor, bytes);
  printf("}}\n");
  printf("{\"BF16\": %u, \"INLINE\": %u, \"IMPORT_STRICT\": %u, \"CPU\": %d, \"MAX_COLS\": %d}\n",
         NWC_CLIENT_BF16, NWC_CLIENT_INLINE, NWC_CLIENT_IMPORT_STRICT, NWC_CLIENT_CPU,
         NWC_CLIENT_MAX_COLS);
  return 0;
}
