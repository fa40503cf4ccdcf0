/*
 * backend.c - picks nwcd's compute backend (--backend auto, cpu, cuda).  cpu is backend_cpu.c's
 * table; cuda is the same table with the device functions added: its loads (gpu_staging.c) and
 * its copies, kernels and IPC (backend_cuda.cu), so that tensors on a device run the kernels
 * while mapped (non-resident) and host-resident ones run the host decoders.  auto is cuda when
 * the build has it and a device exists, else cpu.
 */
#include "backend.h"

#include "nwc_error.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

#ifdef NWC_WITH_CUDA
#include "gpu_staging.h"

static nwcd_backend cuda_backend;

/* 0 and the cuda backend, or -ENODEV (detail: why) without a device. */
static int cuda_get(const nwcd_backend **out) {
  int n = 0;
  NWC_TRY(nwcd_cuda_devices(&n));
  if (n > NWCD_MAX_DEVICES) n = NWCD_MAX_DEVICES;
  cuda_backend = nwcd_cpu_backend;
  cuda_backend.name = "cuda";
  cuda_backend.ndevices = n;
  cuda_backend.dev_load = nwcd_gpu_dev_load;
  cuda_backend.dev_settle = nwcd_gpu_dev_settle;
  cuda_backend.places_load = nwcd_gpu_places_load;
  cuda_backend.dev_size = nwcd_cuda_copy_size;
  cuda_backend.dev_scales = nwcd_cuda_scales;
  cuda_backend.dev_free = nwcd_cuda_free;
  cuda_backend.dev_dequant = nwcd_cuda_dequant;
  cuda_backend.dev_gather = nwcd_cuda_gather;
  cuda_backend.dev_matvec = nwcd_cuda_matvec;
  cuda_backend.dev_matvec_shared = nwcd_cuda_matvec_shared;
  cuda_backend.dev_meminfo = nwcd_cuda_meminfo;
  cuda_backend.dev_pool_idle = nwcd_cuda_pool_idle;
  cuda_backend.dev_trim = nwcd_cuda_trim;
  cuda_backend.dev_matvec_ipc = nwcd_cuda_matvec_ipc;
  cuda_backend.dev_dequant_ipc = nwcd_cuda_dequant_ipc;
  cuda_backend.forget = nwcd_cuda_forget;
  cuda_backend.dev_share_pool = nwcd_cuda_share_pool;
  cuda_backend.dev_export = nwcd_cuda_export;
  *out = &cuda_backend;
  return 0;
}
#endif

int nwcd_backend_get(const char *name, const nwcd_backend **out) {
  bool is_auto = !name || !strcmp(name, "auto");
  if (is_auto || !strcmp(name, "cuda")) {
#ifdef NWC_WITH_CUDA
    int rc = cuda_get(out);
    if (rc == 0 || !is_auto) return rc;
#else
    NWC_RETURN_IF(!is_auto, -ENOTSUP,
                  "this build has no CUDA backend (configure with -DNWC_WITH_CUDA=ON); use "
                  "--backend cpu or auto");
#endif
  }
  if (is_auto || !strcmp(name, "cpu")) {
    *out = &nwcd_cpu_backend;
    return 0;
  }
  return nwc__fail(-EINVAL, "unknown backend '%s' (auto, cpu or cuda)", name);
}
