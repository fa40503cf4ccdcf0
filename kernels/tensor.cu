/*
 * tensor.cu - device tensors (nwc_k_tensor_upload / _free) and the host helpers of host.cuh: the
 * CUDA error record behind -EIO and the SM count.
 *
 * An uploaded tensor is one cudaMalloc holding, each at a 256-byte aligned offset: the lookup
 * table, bases, hdr, data, raw and scale.  Upload copies synchronously (pageable host memory), so
 * it is a setup call, not one for a graph.
 */
#include "host.cuh"

#include <string.h>

namespace nwc_k {

static thread_local int last_cuda_error;

int cuda_status(cudaError_t err) {
  if (err == cudaSuccess) return 0;
  last_cuda_error = (int)err;
  return -EIO;
}

int sm_count(void) {
  int dev = 0, n = 0;
  int rc = cuda_status(cudaGetDevice(&dev));
  if (rc == 0) rc = cuda_status(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return rc < 0 ? rc : n;
}

static uint64_t align256(uint64_t v) { return (v + 255) & ~UINT64_C(255); }

} /* namespace nwc_k */

extern "C" int nwc_k_last_cuda_error(void) { return nwc_k::last_cuda_error; }

extern "C" int nwc_k_tensor_upload(const nwc_tensor *t, nwc_k_tensor *d, cudaStream_t stream) {
  using nwc_k::align256;
  if (!t || !d) return -EINVAL;
  memset(d, 0, sizeof *d);
  int rc = nwc_tensor_validate(t);
  if (rc < 0) return rc;
  uint32_t tab[NWC_TAB_ENTRIES];
  if ((rc = nwc_build_tab(t->psym, t->elem, tab)) < 0) return rc;
  const uint64_t nb = t->nblocks;
  const uint64_t scale_bytes = t->scale ? t->rows * sizeof(float) : 0;
  const uint64_t o_bases = align256(sizeof tab), o_hdr = align256(o_bases + (nb + 1) * 8);
  const uint64_t o_data = align256(o_hdr + nb * NWC_LANES), o_raw = align256(o_data + t->data_bytes);
  const uint64_t o_scale = align256(o_raw + t->raw_bytes), total = o_scale + scale_bytes;
  uint8_t *mem = NULL;
  if ((rc = nwc_k::cuda_status(cudaMalloc((void **)&mem, total))) < 0) return rc == -EIO ? -ENOMEM : rc;
  struct {
    uint64_t off;
    const void *src;
    uint64_t bytes;
  } parts[] = {{0, tab, sizeof tab},
               {o_bases, t->bases, (nb + 1) * 8},
               {o_hdr, t->hdr, nb * NWC_LANES},
               {o_data, t->data, t->data_bytes},
               {o_raw, t->raw, t->raw_bytes},
               {o_scale, t->scale, scale_bytes}};
  for (unsigned i = 0; rc == 0 && i < sizeof parts / sizeof parts[0]; i++)
    if (parts[i].bytes)
      rc = nwc_k::cuda_status(cudaMemcpyAsync(mem + parts[i].off, parts[i].src, parts[i].bytes,
                                              cudaMemcpyHostToDevice, stream));
  if (rc == 0) rc = nwc_k::cuda_status(cudaStreamSynchronize(stream));
  if (rc < 0) {
    cudaFree(mem);
    return rc;
  }
  d->elem = t->elem;
  d->rows = t->rows;
  d->cols = t->cols;
  d->nblocks = nb;
  d->tab = reinterpret_cast<const uint32_t *>(mem);
  d->bases = reinterpret_cast<const uint64_t *>(mem + o_bases);
  d->hdr = mem + o_hdr;
  d->data = mem + o_data;
  d->raw = mem + o_raw;
  d->scale = t->scale ? reinterpret_cast<const float *>(mem + o_scale) : NULL;
  memcpy(d->psym, t->psym, sizeof d->psym);
  d->owned = mem;
  return 0;
}

extern "C" void nwc_k_tensor_free(nwc_k_tensor *d) {
  if (!d) return;
  if (d->owned) cudaFree(d->owned);
  memset(d, 0, sizeof *d);
}
