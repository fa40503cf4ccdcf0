/*
 * residency.h - resident tensors (residency.c; its design comment says the states, budgets,
 * LRU order, reference counts, pins and client mappings): acquire and release for compute,
 * load, pin, evict, budgets per place, and the listings.  A tensor has a replica per place it
 * is resident at (host memory, each device).
 */
#ifndef NWCD_RESIDENCY_H
#define NWCD_RESIDENCY_H

#include "backend.h"
#include "loader.h"
#include "nwc_proto.h"
#include "nwc_store.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct nwcd_res nwcd_res;
typedef struct nwcd_entry nwcd_entry;

/* A reference to a tensor usable for compute: view valid until nwcd_res_release. */
typedef struct nwcd_ref {
  nwcd_entry *e;          /* resident entry (refs held), or NULL for a transient copy */
  bool transient;         /* view owns a transient copy read from the container (non-resident
                             compute: nwcd_res_release frees it), not a resident entry */
  nwcd_entry *te;         /* the entry of that copy (its readers count holds it) */
  nwc_tensor view;        /* shapes always; the arrays and scales only for host copies */
  const nwc_tensor_info *ti;
  const void *dcopy;      /* the device copy (backend's) when it lives on a device, else NULL */
  int loc;                /* NWCD_LOC_CPU or the device (also for a load or pin: no ref) */
  bool loaded;            /* this acquire loaded it */
} nwcd_ref;

enum {
  NWCD_ACQ_MAP_OK = 1, /* may fall back to a transient copy of the blob when it cannot fit */
  NWCD_ACQ_PIN = 2,    /* pin it (and keep no reference) */
  NWCD_ACQ_NOREF = 4,  /* load only (and keep no reference) */
};
/* Acquire flag naming the place whose replica to use, loaded there if absent (loc: NWCD_LOC_CPU
 * or a device).  NWCD_LOC_DEFAULT is no flag: a resident replica (the home's first), else a
 * load at the tensor's home or the default place (residency.c). */
#define NWCD_ACQ_AT(loc) ((unsigned)((loc) + 2) << 8)

struct nwcd;
int nwcd_res_create(struct nwcd *d, uint64_t budget, nwcd_res **out);
/* The budget of every device (at start and on reload): per_device bytes, or with 0, 90% of the
 * device memory free at the first call; evicts LRU copies down to it. */
void nwcd_res_set_gpu_budget(nwcd_res *r, uint64_t per_device);
/* The budget of loc (NWCD_LOC_DEFAULT, NWCD_LOC_CPU or a device): its bytes, or 0 for a device
 * the backend lacks (*where gets its name: "cpu", "cuda:0"). */
uint64_t nwcd_res_budget(nwcd_res *r, int loc, char where[16]);
void nwcd_res_free(nwcd_res *r);
/* Finds (loading if needed) the replica of model/tensor that flags name (NWCD_ACQ_AT).  Returns
 * 0 and *ref, -ENOENT, -ENODEV for a place the backend lacks, -ENOSPC when it cannot fit (and
 * mapping is not allowed), or a load error. */
int nwcd_res_acquire(nwcd_res *r, const char *model, const char *tensor, unsigned flags,
                     nwcd_ref *ref, nwcd_load_info *li);
void nwcd_res_release(nwcd_res *r, nwcd_ref *ref);
/* Loads (pin: and pins) model/tensor's replica at every place of the mask places (bit 0 host
 * memory, bit 1 + n device n) where it is not resident, from one read of its blob (the
 * backend's places_load; a single such place loads as acquire does): room is made and each
 * replica set LOADING under the lock, a place that cannot fit fails as an acquire there would
 * while the others load.  The home becomes the lowest device named, else host memory.  Returns
 * 0, or the first error (-ENODEV for a place the backend lacks, -EINVAL for none, -ENOSPC, a
 * load error); *loaded gets the places loaded now (a mask), *li (may be NULL) the read's. */
int nwcd_res_acquire_places(nwcd_res *r, const char *model, const char *tensor, uint64_t places,
                            bool pin, nwcd_load_info *li, uint64_t *loaded);
/* A split (load_places with NWC_LOAD_SPLIT) puts each tensor of a request at one place, as
 * nwcd_res_split_plan decides (residency.c's head comment says the policy); a slot per tensor. */
typedef struct nwcd_split_slot {
  int loc;        /* the tensor's place */
  bool load;      /* the plan reserved its replica there (e, LOADING) for this request to load;
                     false: it is resident or loading there already */
  nwcd_entry *e;  /* with load: that replica */
  uint64_t need;  /* with load: the bytes reserved */
} nwcd_split_slot;
/* Plans a split of ti[0..n) of model over the places of the mask places, out[i] for ti[i], and
 * reserves (LOADING) the replicas to load, all under the lock: 0, or -ENOSPC naming a tensor
 * that fits at none of the places (then nothing is reserved), -ENOENT, -ENOMEM. */
int nwcd_res_split_plan(nwcd_res *r, const char *model, const nwc_tensor_info *ti, size_t n,
                        uint64_t places, nwcd_split_slot *out);
/* Loads (pin: and pins) model/tensor at its slot's place (s->load: the reserved replica, which
 * the slot gives up; else as an acquire there); its home becomes that place.  0 or an error. */
int nwcd_res_split_load(nwcd_res *r, const char *model, const char *tensor, nwcd_split_slot *s,
                        bool pin, nwcd_load_info *li);
/* Returns the reservations of slots s[0..n) that no nwcd_res_split_load took (after a failure). */
void nwcd_res_split_cancel(nwcd_res *r, nwcd_split_slot *s, size_t n);
/* -ENODEV for place cuda:at that backend b lacks, its message saying which places b has. */
int nwcd_no_device(const nwcd_backend *b, int at);
/* Evicts every replica of one tensor (loc NWCD_LOC_DEFAULT) or its replica at loc, or none: 0, or
 * -EBUSY when one is loading, in use, mapped or pinned (detail says which and where; then none is
 * evicted).  *bytes gets what was freed, all places together. */
int nwcd_res_evict(nwcd_res *r, const char *model, const char *tensor, int loc, uint64_t *bytes);
/* New budget (reload): evicts LRU entries down to it; *used gets the bytes still resident. */
void nwcd_res_set_budget(nwcd_res *r, uint64_t budget, uint64_t *used);
/* Unpins every replica of model/tensor: 1 if one was pinned, else 0. */
int nwcd_res_unpin(nwcd_res *r, const char *model, const char *tensor);
/* Drops every entry of model (before removing it): -EBUSY if one is in use or loading. */
int nwcd_res_forget_model(nwcd_res *r, const char *model);
/* Residency of one tensor for listings, its replicas together: the most advanced state
 * (RESIDENT, LOADING, ABSENT), pinned if one is, their references summed, the latest use. */
void nwcd_res_describe(nwcd_res *r, const char *model, const char *tensor, nwc_proto_tensor *out);
/* The blob bytes of model/tensor when a replica is resident now (an acquire naming no place
 * would not load), else 0; *loc (when loc is not NULL and one is resident): the place of the
 * replica that acquire would use, NWCD_LOC_CPU or a device. */
uint64_t nwcd_res_resident_bytes(nwcd_res *r, const char *model, const char *tensor, int *loc);
/* The bytes model's resident replicas hold, all places together (a tensor on two places counts
 * twice). */
uint64_t nwcd_res_model_bytes(nwcd_res *r, const char *model);
/* Resident replicas for ps, one row per tensor and place: *out malloc'ed array of *n (free()). */
int nwcd_res_list(nwcd_res *r, nwc_proto_ps **out, size_t *n);
/* Counters and totals for stats: resident_tensors counts replicas (a tensor on two places
 * twice), resident_bytes the host memory's, gpu_resident_bytes the devices' together. */
void nwcd_res_stats(nwcd_res *r, nwc_proto_stats *s);
/* The places for devices, in one snapshot: out[0] host memory, out[1 + n] device n, each with
 * its name, budget, resident bytes and tensors (the replicas there) and pinned bytes as ps counts
 * them (the memory fields are left 0).  out has room for 1 + NWCD_MAX_DEVICES; returns how
 * many it filled. */
int nwcd_res_places(nwcd_res *r, nwc_proto_place *out);
/* Shares model/tensor's replica in host memory with a client (map): makes it resident there if
 * needed, whatever devices hold (-ENOSPC when it cannot fit), sends its sealed memfd with the
 * token (NWC_PROTO_MAP_TOKEN bytes) over sock, a connected Unix stream socket the client
 * passed, and keeps a mapping reference, which stops eviction, until the client's end of sock
 * is closed (unmap, exit).  sock stays the caller's (a duplicate is kept).  Fills *out with
 * the decoder parameters for the reply. */
int nwcd_res_map(nwcd_res *r, const char *model, const char *tensor, int sock, uint64_t token,
                 nwc_proto_map *out);
/* Shares device copies with a client (map_gpu, docs/gpu-maps.md): names[0..n) of model made
 * resident on device dev if needed, whatever other places hold (-ENOSPC when they cannot
 * all fit), the device's copy pool descriptor sent with the token over sock (as map), and one
 * mapping reference holding all n until the client's end of sock is closed.  *head and out[n]
 * get the reply.  -ENOTSUP from a backend without devices or a device whose pool cannot be
 * shared, -ENODEV for a device it lacks.  sock stays the caller's (the daemon keeps a dup). */
int nwcd_res_map_gpu(nwcd_res *r, const char *model, const char *const *names, size_t n, int dev,
                     int sock, uint64_t token, nwc_proto_gmap_head *head, nwc_proto_gmap *out);

#endif
