/*
 * residency.c - which tensors are resident in host memory, under a byte budget, with LRU
 * eviction and reference counts.
 *
 * Each tensor the daemon has been asked about has an entry (model, tensor, its catalog info)
 * in one of three states:
 *
 *            acquire (fits, or LRU evictions make it fit)
 *   ABSENT ─────────────────────────────────────────────► LOADING ──(io_uring read, chunks
 *     ▲  ▲                                                   │       checked, view built)
 *     │  └──────────────(load failed: buffer freed)──────────┤
 *     │                                                      ▼
 *     └───────(evict / LRU: refs == 0 and not pinned)──── RESIDENT ◄──► pinned (pin / unpin)
 *
 * Invariants (all under r->lock):
 *   - used = sum of the lengths of RESIDENT and LOADING entries <= budget, always: room is made
 *     (by evicting least-recently-used RESIDENT entries with refs == 0 that are not pinned)
 *     before an entry enters LOADING, and the reservation is returned if the load fails;
 *   - an entry with refs > 0 is RESIDENT and is never freed: every compute request holds a
 *     reference from acquire to release, so eviction (LRU or explicit) never pulls a tensor
 *     from under a request; an explicit evict of such a tensor is refused with -EBUSY;
 *   - only the thread that moved an entry to LOADING touches its buffer until it moves it on;
 *     others wait on r->cond;
 *   - entries are freed only by nwcd_res_forget_model (a model being removed) with no entry of
 *     the model in use or loading; it and the catalog lookup of a new entry both run under the
 *     daemon's store lock, so an entry never outlives the catalog row it describes.
 * What cannot fit (larger than the budget, or the budget held by pinned and in-use tensors) is
 * -ENOSPC for a load or pin; a compute request may instead map the container read-only
 * (nwc_store_map_info) and run on the page cache: the reply says so (NWC_RF_MAPPED) and stats
 * count it.
 */
#include "nwcd.h"

#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

struct nwcd_entry {
  char *model, *tensor;
  uint64_t hash;
  nwc_tensor_info *info; /* owned (nwc_tensor_info_free) */
  int state;
  void *buf;
  size_t len;
  bool locked, direct, pinned;
  nwc_tensor view;
  unsigned refs;
  uint64_t last_used; /* nwcd_now_ns(), 0 never */
};

struct nwcd_res {
  nwcd *d;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  nwcd_entry **e;
  size_t n, cap;
  uint64_t budget, used, pinned_bytes;
  uint64_t loads, load_bytes, load_us, direct_loads, buffered_loads, evictions;
  uint64_t mlock_ok, mlock_failed, mapped;
};

static uint64_t key_hash(const char *model, const char *tensor) {
  return XXH3_64bits_withSeed(tensor, strlen(tensor), XXH3_64bits(model, strlen(model)));
}

static nwcd_entry *find(nwcd_res *r, const char *model, const char *tensor) {
  uint64_t h = key_hash(model, tensor);
  for (size_t i = 0; i < r->n; i++) {
    nwcd_entry *e = r->e[i];
    if (e->hash == h && !strcmp(e->model, model) && !strcmp(e->tensor, tensor)) return e;
  }
  return NULL;
}

int nwcd_res_create(nwcd *d, uint64_t budget, nwcd_res **out) {
  nwcd_res *r = calloc(1, sizeof *r);
  if (!r) return -ENOMEM;
  r->d = d, r->budget = budget;
  pthread_mutex_init(&r->lock, NULL);
  pthread_cond_init(&r->cond, NULL);
  *out = r;
  return 0;
}

static void entry_unload(nwcd_res *r, nwcd_entry *e) {
  if (e->state != NWC_RES_RESIDENT) return;
  r->d->backend->host_free(e->buf, e->len, e->locked);
  e->buf = NULL;
  r->used -= e->len;
  if (e->pinned) r->pinned_bytes -= e->len, e->pinned = false;
  memset(&e->view, 0, sizeof e->view);
  e->state = NWC_RES_ABSENT;
}

static void entry_free(nwcd_res *r, nwcd_entry *e) {
  entry_unload(r, e);
  nwc_tensor_info_free(e->info, 1);
  free(e->model), free(e->tensor), free(e);
}

void nwcd_res_free(nwcd_res *r) {
  if (!r) return;
  for (size_t i = 0; i < r->n; i++) entry_free(r, r->e[i]);
  free(r->e);
  pthread_cond_destroy(&r->cond);
  pthread_mutex_destroy(&r->lock);
  free(r);
}

/* Evicts LRU entries until need more bytes fit; false if they cannot. */
static bool make_room(nwcd_res *r, uint64_t need) {
  if (need > r->budget) return false;
  while (r->used + need > r->budget) {
    nwcd_entry *victim = NULL;
    for (size_t i = 0; i < r->n; i++) {
      nwcd_entry *e = r->e[i];
      if (e->state == NWC_RES_RESIDENT && !e->refs && !e->pinned &&
          (!victim || e->last_used < victim->last_used))
        victim = e;
    }
    if (!victim) return false;
    uint64_t t0 = nwcd_now_ns();
    entry_unload(r, victim);
    nwcd_log(NWCD_LOG_INFO, "evicted %s/%s (%zu bytes, LRU) in %.3f ms", victim->model,
             victim->tensor, victim->len, (nwcd_now_ns() - t0) / 1e6);
    r->evictions++;
  }
  return true;
}

/* Finds or creates the entry of model/tensor; called with r->lock held, may drop and retake it
 * (the store lock is taken first, per the lock order). */
static int lookup(nwcd_res *r, const char *model, const char *tensor, nwcd_entry **out) {
  nwcd_entry *e = find(r, model, tensor);
  if (e) {
    *out = e;
    return 0;
  }
  pthread_mutex_unlock(&r->lock);
  pthread_mutex_lock(&r->d->store_lock);
  pthread_mutex_lock(&r->lock);
  int rc = 0;
  if (!(e = find(r, model, tensor))) {
    nwc_tensor_info *ti = NULL;
    rc = nwc_store_tensor(r->d->store, model, tensor, &ti);
    if (rc == -ENOENT) rc = nwc__fail(-ENOENT, "no tensor %s/%s in the store", model, tensor);
    if (rc == 0 && r->n == r->cap) {
      size_t cap = r->cap ? 2 * r->cap : 64;
      nwcd_entry **a = realloc(r->e, cap * sizeof *a);
      if (a) r->e = a, r->cap = cap;
      else rc = -ENOMEM;
    }
    if (rc == 0 && !(e = calloc(1, sizeof *e))) rc = -ENOMEM;
    if (rc == 0) {
      e->model = strdup(model), e->tensor = strdup(tensor);
      if (!e->model || !e->tensor) {
        free(e->model), free(e->tensor), free(e);
        e = NULL;
        rc = -ENOMEM;
      }
    }
    if (rc == 0) {
      e->hash = key_hash(model, tensor), e->info = ti, e->len = ti->length;
      r->e[r->n++] = e;
    } else {
      nwc_tensor_info_free(ti, ti ? 1 : 0);
    }
  }
  pthread_mutex_unlock(&r->d->store_lock);
  *out = e;
  return rc;
}

int nwcd_res_acquire(nwcd_res *r, const char *model, const char *tensor, unsigned flags,
                     nwcd_ref *ref, nwcd_load_info *li) {
  memset(ref, 0, sizeof *ref);
  if (li) memset(li, 0, sizeof *li);
  pthread_mutex_lock(&r->lock);
  nwcd_entry *e;
  int rc = lookup(r, model, tensor, &e);
  while (rc == 0 && e->state != NWC_RES_RESIDENT) {
    if (e->state == NWC_RES_LOADING) {
      pthread_cond_wait(&r->cond, &r->lock);
      continue;
    }
    if (!make_room(r, e->len)) {
      if (flags & NWCD_ACQ_MAP_OK) {
        const nwc_tensor_info *ti = e->info; /* stays valid: see the store-lock invariant */
        r->mapped++;
        pthread_mutex_unlock(&r->lock);
        rc = nwc_store_map_info(ti, &ref->map, &ref->view);
        ref->ti = ti;
        return rc;
      }
      rc = nwc__fail(-ENOSPC,
                     "%s/%s needs %zu bytes: budget %llu, %llu in use or pinned (%llu pinned)",
                     model, tensor, e->len, (unsigned long long)r->budget,
                     (unsigned long long)r->used, (unsigned long long)r->pinned_bytes);
      break;
    }
    e->state = NWC_RES_LOADING;
    r->used += e->len;
    pthread_mutex_unlock(&r->lock);
    bool locked = false;
    nwcd_load_info l = {0};
    void *buf = r->d->backend->host_alloc(e->len, &locked);
    rc = buf ? nwcd_load_blob(e->info, buf, &l, NULL, NULL)
             : nwc__fail(-ENOMEM, "no memory for %zu bytes of %s/%s", e->len, model, tensor);
    nwc_tensor view;
    if (rc == 0) rc = nwc_store_blob_view(e->info, buf, &view);
    pthread_mutex_lock(&r->lock);
    if (rc < 0) {
      if (buf) r->d->backend->host_free(buf, e->len, locked);
      r->used -= e->len;
      e->state = NWC_RES_ABSENT;
      pthread_cond_broadcast(&r->cond);
      break;
    }
    e->buf = buf, e->locked = locked, e->direct = l.direct, e->view = view;
    e->state = NWC_RES_RESIDENT;
    r->loads++, r->load_bytes += l.bytes, r->load_us += l.micros;
    if (l.direct) r->direct_loads++;
    else r->buffered_loads++;
    if (locked) r->mlock_ok++;
    else r->mlock_failed++;
    ref->loaded = true;
    if (li) *li = l;
    if (!(flags & (NWCD_ACQ_PIN | NWCD_ACQ_NOREF))) /* explicit loads are logged by ops.c */
      nwcd_log(NWCD_LOG_INFO, "loaded %s/%s for a request: %llu bytes (%s) in %.3f ms", model,
               tensor, (unsigned long long)l.bytes, l.direct ? "O_DIRECT" : "buffered",
               l.micros / 1e3);
    pthread_cond_broadcast(&r->cond);
  }
  if (rc == 0) {
    e->last_used = nwcd_now_ns();
    if ((flags & NWCD_ACQ_PIN) && !e->pinned) e->pinned = true, r->pinned_bytes += e->len;
    if (li && !ref->loaded) li->direct = e->direct;
    ref->ti = e->info;
    if (!(flags & (NWCD_ACQ_PIN | NWCD_ACQ_NOREF))) {
      e->refs++;
      ref->e = e;
      ref->view = e->view;
    }
  }
  pthread_mutex_unlock(&r->lock);
  return rc;
}

void nwcd_res_release(nwcd_res *r, nwcd_ref *ref) {
  if (ref->map) nwc_store_unmap(ref->map);
  if (ref->e) {
    pthread_mutex_lock(&r->lock);
    ref->e->refs--;
    ref->e->last_used = nwcd_now_ns();
    pthread_mutex_unlock(&r->lock);
  }
  memset(ref, 0, sizeof *ref);
}

int nwcd_res_evict(nwcd_res *r, const char *model, const char *tensor, uint64_t *bytes) {
  *bytes = 0;
  pthread_mutex_lock(&r->lock);
  nwcd_entry *e = find(r, model, tensor);
  int rc = 0;
  if (e && e->state == NWC_RES_LOADING) {
    rc = nwc__fail(-EBUSY, "%s/%s is being loaded", model, tensor);
  } else if (e && e->refs) {
    rc = nwc__fail(-EBUSY, "%s/%s is in use by %u request(s); not evicted", model, tensor, e->refs);
  } else if (e && e->pinned) {
    rc = nwc__fail(-EBUSY, "%s/%s is pinned; unpin it first", model, tensor);
  } else if (e && e->state == NWC_RES_RESIDENT) {
    *bytes = e->len;
    entry_unload(r, e);
    r->evictions++;
  }
  pthread_mutex_unlock(&r->lock);
  return rc;
}

/* A new budget (SIGHUP, config.c): evicts LRU entries down to it; *used gets what stays
 * resident (more than budget when pinned or in-use tensors hold it). */
void nwcd_res_set_budget(nwcd_res *r, uint64_t budget, uint64_t *used) {
  pthread_mutex_lock(&r->lock);
  r->budget = budget;
  make_room(r, 0);
  *used = r->used;
  pthread_mutex_unlock(&r->lock);
}

int nwcd_res_unpin(nwcd_res *r, const char *model, const char *tensor) {
  pthread_mutex_lock(&r->lock);
  nwcd_entry *e = find(r, model, tensor);
  int was = e && e->pinned;
  if (was) e->pinned = false, r->pinned_bytes -= e->len;
  pthread_mutex_unlock(&r->lock);
  return was;
}

int nwcd_res_forget_model(nwcd_res *r, const char *model) {
  pthread_mutex_lock(&r->lock);
  for (size_t i = 0; i < r->n; i++) {
    nwcd_entry *e = r->e[i];
    if (strcmp(e->model, model)) continue;
    if (e->refs || e->state == NWC_RES_LOADING) {
      int rc = nwc__fail(-EBUSY, "%s/%s is in use; model not removed", model, e->tensor);
      pthread_mutex_unlock(&r->lock);
      return rc;
    }
  }
  size_t k = 0;
  for (size_t i = 0; i < r->n; i++) {
    if (!strcmp(r->e[i]->model, model)) entry_free(r, r->e[i]);
    else r->e[k++] = r->e[i];
  }
  r->n = k;
  pthread_mutex_unlock(&r->lock);
  return 0;
}

static int64_t ago_ms(uint64_t t) {
  return t ? (int64_t)((nwcd_now_ns() - t) / 1000000) : -1;
}

void nwcd_res_describe(nwcd_res *r, const char *model, const char *tensor, nwc_proto_tensor *out) {
  pthread_mutex_lock(&r->lock);
  nwcd_entry *e = find(r, model, tensor);
  out->state = e ? (uint8_t)e->state : NWC_RES_ABSENT;
  out->pinned = e && e->pinned;
  out->refs = e ? e->refs : 0;
  out->last_used_ms = e ? ago_ms(e->last_used) : -1;
  pthread_mutex_unlock(&r->lock);
}

uint64_t nwcd_res_model_bytes(nwcd_res *r, const char *model) {
  uint64_t b = 0;
  pthread_mutex_lock(&r->lock);
  for (size_t i = 0; i < r->n; i++)
    if (r->e[i]->state == NWC_RES_RESIDENT && !strcmp(r->e[i]->model, model)) b += r->e[i]->len;
  pthread_mutex_unlock(&r->lock);
  return b;
}

int nwcd_res_list(nwcd_res *r, nwc_proto_ps **out, size_t *n) {
  pthread_mutex_lock(&r->lock);
  nwc_proto_ps *a = calloc(r->n ? r->n : 1, sizeof *a);
  size_t k = 0;
  for (size_t i = 0; a && i < r->n; i++) {
    nwcd_entry *e = r->e[i];
    if (e->state != NWC_RES_RESIDENT) continue;
    nwc_proto_ps *p = &a[k++];
    snprintf(p->model, sizeof p->model, "%s", e->model);
    snprintf(p->tensor, sizeof p->tensor, "%s", e->tensor);
    p->bytes = e->len, p->pinned = e->pinned, p->locked = e->locked, p->direct = e->direct;
    p->refs = e->refs, p->last_used_ms = ago_ms(e->last_used);
  }
  pthread_mutex_unlock(&r->lock);
  if (!a) return -ENOMEM;
  *out = a, *n = k;
  return 0;
}

void nwcd_res_stats(nwcd_res *r, nwc_proto_stats *s) {
  pthread_mutex_lock(&r->lock);
  s->budget = r->budget, s->resident_bytes = 0, s->resident_tensors = 0;
  for (size_t i = 0; i < r->n; i++)
    if (r->e[i]->state == NWC_RES_RESIDENT) s->resident_bytes += r->e[i]->len, s->resident_tensors++;
  s->pinned_bytes = r->pinned_bytes;
  s->loads = r->loads, s->load_bytes = r->load_bytes, s->load_us = r->load_us;
  s->direct_loads = r->direct_loads, s->buffered_loads = r->buffered_loads;
  s->evictions = r->evictions, s->mlock_ok = r->mlock_ok, s->mlock_failed = r->mlock_failed;
  s->mapped_computes = r->mapped;
  pthread_mutex_unlock(&r->lock);
}

void nwcd_res_count_mapped(nwcd_res *r) { (void)r; }
