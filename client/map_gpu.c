/*
 * map_gpu.c - the protocol side of GPU maps (nwc_client.h, "GPU maps"; docs/gpu-maps.md): asks
 * nwcd to share device copies of a tensor or a whole model, and hands back what a CUDA process
 * needs to import them: the descriptor of the daemon's copy pool on that device, the 64 bytes
 * of each copy's export data and where the kernel tensor's arrays lie in its allocation.  No
 * CUDA here (libnwc-client needs none): libnwc-cuda (nwc_cuda.h) does the import and runs the
 * kernels.
 *
 * Design: as nwc_client_map, a socketpair whose one end travels with the request and whose
 * other end is kept as the mapping's reference: nwcd sends the pool's descriptor over it before
 * it replies, keeps its end until this one is closed (nwc_client_gpu_map_free, or the process's
 * exit), and until then will not evict or remove any tensor of the map.  The records are
 * checked on arrival (every offset inside its allocation, names and counts as asked for).
 */
#include "client_internal.h"

#include "nwc.h"
#include "nwc_error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

_Static_assert(sizeof(((nwc_client_gpu_tensor *)0)->export_data) == NWC_PROTO_GMAP_EXPORT,
               "export data as on the wire");

/* The records of a map_gpu reply into m (its tensors malloc'ed). */
static int gmap_parse(const uint8_t *payload, size_t len, const char *tensor, int device,
                      nwc_client_gpu_map *m) {
  nwc_pr r;
  nwc_pr_init(&r, payload, len);
  nwc_proto_gmap_head h;
  if (nwc_proto_get_gmap_head(&r, &h) < 0) return nwc__client_bad_reply();
  if (h.device != device || h.n == 0 || (*tensor && h.n != 1))
    return nwc__client_fail(-EBADMSG, "map_gpu reply of %u tensors on cuda:%d; asked for %s on "
                            "cuda:%d", h.n, (int)h.device, *tensor ? "one" : "a model", device);
  m->t = calloc(h.n, sizeof *m->t);
  if (!m->t) return nwc__client_fail(-ENOMEM, "out of memory");
  m->n = h.n, m->pool_id = h.pool_id, m->device = h.device;
  memcpy(m->uuid, h.uuid, 16);
  nwc_proto_gmap g;
  for (uint32_t i = 0; i < h.n; i++) {
    if (nwc_proto_get_gmap(&r, &g) < 0)
      return nwc__client_fail(-EBADMSG, "malformed map_gpu reply: %s", nwc_error_detail());
    if (*tensor && strcmp(g.name, tensor))
      return nwc__client_fail(-EBADMSG, "map_gpu reply names %s, not %s", g.name, tensor);
    nwc_client_gpu_tensor *t = &m->t[i];
    snprintf(t->name, sizeof t->name, "%s", g.name);
    t->elem = g.elem, t->rows = g.rows, t->cols = g.cols, t->nblocks = g.nblocks;
    memcpy(t->psym, g.psym, 16);
    memcpy(t->export_data, g.export_data, sizeof t->export_data);
    t->bytes = g.bytes, t->off_tab = g.off_tab, t->off_bases = g.off_bases;
    t->off_hdr = g.off_hdr, t->off_data = g.off_data, t->off_raw = g.off_raw;
    t->off_scale = g.off_scale, t->maps = g.maps;
  }
  if (nwc_pr_end(&r, "map_gpu") < 0)
    return nwc__client_fail(-EBADMSG, "malformed map_gpu reply: %s", nwc_error_detail());
  return 0;
}

int nwc_client_map_gpu(nwc_client *c, const char *model, const char *tensor, int device,
                       nwc_client_gpu_map **out) {
  if (out) *out = NULL;
  if (!c || !out || device < 0) return nwc__client_fail(-EINVAL, "bad arguments");
  if (!tensor) tensor = "";
  NWC_TRY(nwc__client_check_names(model, tensor));
  if (!(c->hello.caps & NWC_CAP_MAP_GPU))
    return nwc__client_fail(-EOPNOTSUPP,
                            "%s does not share device copies (protocol capability 1024: map_gpu, "
                            "a daemon with --backend cuda)", c->hello.daemon);
  nwc_proto_req req = {.device = device};
  nwc__client_names(&req, NWC_OP_MAP_GPU, model, tensor);
  uint8_t *payload = NULL;
  size_t len = 0;
  int sock = -1, rc = 0;
  NWC_TRY(nwc__client_map_call(c, &req, &sock, &payload, &len));
  nwc_client_gpu_map *m = calloc(1, sizeof *m);
  if (!m) rc = nwc__client_fail(-ENOMEM, "out of memory");
  if (m) m->pool_fd = -1, m->ref = sock;
  if (rc == 0) rc = gmap_parse(payload, len, tensor, device, m);
  free(payload);
  if (rc == 0 && (rc = nwc_proto_map_recv(sock, req.id, &m->pool_fd)) < 0)
    rc = nwc__client_fail(rc, "%s", nwc_error_detail());
  if (rc < 0) {
    if (m) nwc_client_gpu_map_free(m);
    else close(sock);
    return rc;
  }
  *out = m;
  return 0;
}

void nwc_client_gpu_map_free(nwc_client_gpu_map *m) {
  if (!m) return;
  if (m->pool_fd >= 0) close(m->pool_fd);
  if (m->ref >= 0) close(m->ref);
  free(m->t);
  free(m);
}
