/*
 * ops_status.c - verify (every chunk of a model against its checksum), stats, ps, devices (the
 * memory of each place) and map (a tensor's pages shared with the client).
 */
#include "ops_internal.h"

#include "clock.h"
#include "nwcd.h"
#include "server.h"

#include "nwc_error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct verify_ctx {
  char *lines[32];
  unsigned n;
} verify_ctx;

static void verify_cb(void *ctx, const nwc_verify_problem *p) {
  verify_ctx *v = ctx;
  if (v->n >= 32) return;
  char buf[NWC_PROTO_MAX_MSG];
  snprintf(buf, sizeof buf, "%s/%s: %s (%s at %llu, %llu bytes)", p->model ? p->model : "catalog",
           p->tensor ? p->tensor : "-", p->what, p->path, (unsigned long long)p->offset,
           (unsigned long long)p->length);
  v->lines[v->n] = strdup(buf);
  if (v->lines[v->n]) v->n++;
}

int nwcd_op_verify(nwcd_job *j) {
  nwcd *d = j->d;
  verify_ctx v = {{0}, 0};
  nwc_verify_stats st = {0};
  uint64_t t0 = nwcd_now_ns();
  pthread_mutex_lock(&d->store_lock);
  int rc = nwc_store_verify(d->store, j->req.model[0] ? j->req.model : NULL, verify_cb, &v, &st);
  pthread_mutex_unlock(&d->store_lock);
  if (rc < 0 && rc != -EBADMSG) {
    for (unsigned i = 0; i < v.n; i++) free(v.lines[i]);
    NWC_RETURN_IF(rc == -ENOENT, -ENOENT, "no model '%s' in the store", j->req.model);
    return rc;
  }
  nwc_proto_result res = {.tensors = st.tensors, .bytes = st.bytes, .skipped = st.models,
                          .chunks = st.chunks, .problems = st.problems,
                          .micros = (nwcd_now_ns() - t0) / 1000};
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_put_result(&w, &res);
  nwc_pw_u32(&w, v.n);
  for (unsigned i = 0; i < v.n; i++) nwc_pw_str(&w, v.lines[i]), free(v.lines[i]);
  nwcd_reply(j, &w);
  return 0;
}

int nwcd_op_stats(nwcd_job *j) {
  nwc_proto_stats s = {0};
  nwcd_server_get_stats(j->d, &s);
  nwcd_res_stats(j->d->res, &s);
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_put_stats(&w, &s);
  nwcd_reply(j, &w);
  return 0;
}

int nwcd_op_ps(nwcd_job *j) {
  nwc_proto_ps *p = NULL;
  size_t n = 0;
  NWC_TRY(nwcd_res_list(j->d->res, &p, &n));
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_pw_u32(&w, (uint32_t)n);
  for (size_t i = 0; i < n; i++) nwc_proto_put_ps(&w, &p[i]);
  free(p);
  nwcd_reply(j, &w);
  return 0;
}

/* Host memory for devices: MemAvailable and MemTotal of /proc/meminfo (what the kernel says
 * could be had without swapping, page cache included; sysinfo's freeram leaves the cache out),
 * in bytes; both 0 when the file cannot be read. */
static void host_meminfo(uint64_t *free_bytes, uint64_t *total_bytes) {
  *free_bytes = *total_bytes = 0;
  FILE *f = fopen("/proc/meminfo", "re");
  if (!f) return;
  char line[128];
  unsigned long long kib;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "MemTotal: %llu kB", &kib) == 1) *total_bytes = (uint64_t)kib << 10;
    else if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) *free_bytes = (uint64_t)kib << 10;
  }
  fclose(f);
}

/* devices: residency's snapshot of each place, then the memory around it (outside its lock): the
 * host's, and each device's from CUDA with what its copy pool keeps (0 where a call fails). */
int nwcd_op_devices(nwcd_job *j) {
  const nwcd_backend *b = j->d->backend;
  nwc_proto_place p[1 + NWCD_MAX_DEVICES];
  int n = nwcd_res_places(j->d->res, p);
  host_meminfo(&p[0].mem_free, &p[0].mem_total);
  for (int dev = 0; dev + 1 < n; dev++) {
    nwc_proto_place *d = &p[dev + 1];
    if (b->dev_meminfo(dev, &d->mem_free, &d->mem_total) < 0) d->mem_free = d->mem_total = 0;
    if (b->dev_pool_idle(dev, &d->pool_idle) < 0) d->pool_idle = 0;
  }
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_pw_u32(&w, (uint32_t)n);
  for (int i = 0; i < n; i++) nwc_proto_put_place(&w, &p[i]);
  nwcd_reply(j, &w);
  return 0;
}

/* map: the memfd goes over the socket the request passed (residency.c), the decoder parameters
 * in the reply. */
int nwcd_op_map(nwcd_job *j) {
  nwc_proto_map m;
  NWC_TRY(nwcd_res_map(j->d->res, j->req.model, j->req.tensor, j->fds[0], j->req.id, &m));
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_put_map(&w, &m);
  nwcd_reply(j, &w);
  return 0;
}

/* map_gpu: the device's pool descriptor goes over the socket the request passed (residency.c),
 * the tensors' records in the reply; tensor "" maps every tensor of the model. */
int nwcd_op_map_gpu(nwcd_job *j) {
  nwc_tensor_info *ti = NULL;
  size_t n = 1;
  const char *one = j->req.tensor;
  if (!*one) {
    NWC_TRY(nwcd_model_tensors(j->d, j->req.model, &ti, &n));
    if (n > NWC_PROTO_GMAP_MAX) {
      nwc_tensor_info_free(ti, n);
      return nwc__fail(-E2BIG, "model '%s' has %zu tensors; map_gpu maps at most %u at once",
                       j->req.model, n, NWC_PROTO_GMAP_MAX);
    }
  }
  const char **names = calloc(n ? n : 1, sizeof *names);
  nwc_proto_gmap *g = calloc(n ? n : 1, sizeof *g);
  int rc = names && g ? 0 : nwc__fail(-ENOMEM, "no memory for a map of %zu tensors", n);
  for (size_t i = 0; rc == 0 && i < n; i++) names[i] = ti ? ti[i].name : one;
  nwc_proto_gmap_head head;
  if (rc == 0)
    rc = nwcd_res_map_gpu(j->d->res, j->req.model, names, n, j->req.device, j->fds[0], j->req.id,
                          &head, g);
  if (rc == 0) {
    nwc_pw w;
    nwc_pw_init(&w);
    nwc_proto_put_gmap_head(&w, &head);
    for (size_t i = 0; i < n; i++) nwc_proto_put_gmap(&w, &g[i]);
    if (w.len - NWC_PROTO_HEADER <= NWC_PROTO_MAX_PAYLOAD) {
      nwcd_reply(j, &w);
    } else { /* the reference stays until the client closes its end, which it will: no reply */
      nwc_pw_free(&w);
      rc = nwc__fail(-E2BIG, "the records of %zu tensors do not fit one reply; map fewer", n);
    }
  }
  free(names), free(g);
  if (ti) nwc_tensor_info_free(ti, n);
  return rc;
}
