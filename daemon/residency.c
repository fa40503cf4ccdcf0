/*
 * residency.c - which tensors are resident in host memory and on each device, under a byte
 * budget per place, with LRU eviction, reference counts and client mappings.
 *
 * Each tensor the daemon has been asked about has an entry per place it was wanted at (model,
 * tensor, place, its own copy of the catalog info), a replica, each in one of three states:
 *
 *            acquire (fits, or LRU evictions make it fit)
 *   ABSENT ─────────────────────────────────────────────► LOADING ──(io_uring read, chunks
 *     ▲  ▲                                                   │       checked, view built,
 *     │  └──────────────(load failed: buffer freed)──────────┤       copy sealed read-only)
 *     │                                                      ▼
 *     └───────(evict / LRU: refs == 0, maps == 0 and ─── RESIDENT ◄──► pinned (pin / unpin)
 *              not pinned)                                   ▲ │
 *                                   (client closed its end:  │ │ map: +1 mapping reference,
 *                                    unmap, exit; reaped)    └─┘ the memfd sent to the client
 *
 * A RESIDENT copy lives in a memfd that the backend writes and maps read-only (host_load) and
 * seals against writes, shrinking and growing at its first share (host_share, which gives the
 * memfd), so that a client can map the very same pages read-only and decode in its own process
 * (nwcd_res_map, op map): one copy in RAM however many processes use it.  Each mapping holds a
 * reference, kept as the daemon's end of a Unix socket the client passed with the request; the
 * reference ends when the client's end is closed (nwc_client_unmap, or the process exits, kill
 * -9 included), which the daemon sees as POLLHUP.
 * Nothing waits for that: reap_maps() polls every mapping socket without blocking, under the
 * lock, before each decision that depends on mappings (making room, evict, remove, budget, ps),
 * so a client that has unmapped is never counted, and no thread or event-loop handle is needed.
 * Each resident tensor and each mapping holds a descriptor, so the soft limit on open files is
 * raised to the hard one at start, and mappings are capped (MAX_MAPS).
 *
 * Invariants (all under r->lock):
 *   - every entry is in r->e (ps lists that order) and in the index once: the replica set of its
 *     model/tensor (a tsearch tree keyed by their hash and names), at its place, so that finding
 *     a tensor's replicas costs a tree lookup, not a scan of every entry of every place (a host
 *     with 8 GPUs and a 700-tensor model replicated on each holds 5600); a set goes with its
 *     last entry, and entries are freed only with their model (or the daemon);
 *   - used = sum of the lengths of RESIDENT and LOADING entries <= budget, always (a host copy's
 *     length is its blob's rounded up to whole pages, the memory it holds): room is made
 *     (by evicting least-recently-used RESIDENT entries with refs == 0 and maps == 0 that are
 *     not pinned) before an entry enters LOADING, and the reservation is returned if the load
 *     fails.  The backend's spare host copies (evicted by LRU, never shared: kept for the
 *     loads that evicted them) are trimmed there too, so that used + spares <= budget (give or
 *     take one tensor per lane while lanes race for the same spare); an explicit evict frees
 *     them all, since it is how an operator gives memory back;
 *   - an entry with refs > 0 is RESIDENT and is never freed: every compute request holds a
 *     reference from acquire to release, so eviction (LRU or explicit) never pulls a tensor
 *     from under a request; an explicit evict of such a tensor is refused with -EBUSY;
 *   - an entry with maps > 0 (= the mapping sockets in r->maps naming it) is RESIDENT, shared
 *     (fd >= 0) and is never freed either: an explicit evict, or removing its model, is refused
 *     with -EBUSY naming the mapping processes, and LRU passes it over.  (A client that keeps
 *     its mmap after closing the socket keeps the pages alive outside the budget: the reference
 *     is what the protocol sees, not the client's page tables);
 *   - a RESIDENT copy is never written again: the daemon maps it read-only, the loader's writes
 *     end before it is RESIDENT, and its memfd is sealed before a client sees it (fd >= 0);
 *   - only the thread that moved an entry to LOADING touches its buffer until it moves it on
 *     (and the crew helpers it waits for before it does: crew.c, parts of the blob it offered
 *     them); others wait on r->cond;
 *   - entries are freed only by nwcd_res_forget_model (a model being removed) with no entry of
 *     the model in use, mapped, loading or read into a transient copy (readers); it and the
 *     catalog lookup of a new entry both run under the daemon's store lock, so an entry never
 *     outlives the catalog row it describes.
 * Places: an entry lives in host memory (loc NWCD_LOC_CPU: the blob buffer, under the host
 * budget) or on a device (loc = n: the backend's device copy of the blob, under device n's own
 * budget, streamed there by the loader through a bounded pinned ring, so no host copy of the
 * whole tensor is ever made: the host keeps only the view's shapes (its per-row scales, where
 * it has them, stay on the device: dev_scales), and such an entry cannot be mapped by
 * clients).  Budgets, LRU eviction and the invariants above hold per place: make_room evicts
 * only entries of the place that needs the bytes.  A device load reserves the blob length plus
 * DEV_SLACK (the 16 KiB lookup table) and then holds the copy's exact size.  A device
 * allocation that fails although the budget allowed it (device memory used by others) evicts
 * LRU entries of that device for the size and retries once; a second failure fails the request
 * with -ENOMEM.  When a device holds no tensor any more, the backend frees its idle work buffers
 * (dev_trim), so evicting everything returns all device memory but the loader's ring (pinned
 * host memory, kept).
 * A tensor may be resident at several places at once, one entry (replica) per place, each
 * fixed to its place when created: a load, pin or map naming a place (NWCD_ACQ_AT: load_on,
 * map in host memory, map_gpu on its device) uses that place's replica, loading it there if
 * absent, whatever other places hold.  Every replica is an entry as above, with its own state,
 * budget charge, LRU time, references, pin and mappings; LRU evicts replicas one by one.  An
 * explicit evict of a tensor takes all its replicas (evict) or the one at a place (evict_on), or
 * none: if one is loading, in use, mapped or pinned it is -EBUSY naming that place and every
 * replica stays (a model evict skips such a tensor); unpin unpins them all.
 * A load onto several places at once (nwcd_res_acquire_places, load_places) takes the tensor's
 * replica at each place under the lock in one pass: it waits while any of them is LOADING, skips
 * the RESIDENT ones, makes room at each other place and sets it LOADING (a place that cannot fit
 * is that place's -ENOSPC; the others go on), then loads them all from one read of the blob
 * (the backend's places_load; one place alone loads as acquire does) and moves each on as an
 * acquire would, the read's bytes and time counted once.  Its home is the lowest device named,
 * else host memory.
 * A split (nwcd_res_split_plan, load_places with NWC_LOAD_SPLIT) puts each tensor of a request
 * at ONE place: under the store's lock and r->lock it takes the places in the order cuda:0,
 * cuda:1, ..., host memory and the tensors in natural name order (strverscmp), puts each at the
 * first place where budget - used - what the plan put there before takes need_at() (a tensor
 * RESIDENT or LOADING at a place named stays there), makes no room (no LRU evictions), and only
 * when every tensor has a place moves the chosen replicas to LOADING with their bytes reserved
 * (load_begin), so that the used <= budget invariant holds while the lanes load them
 * (nwcd_res_split_load; nwcd_res_split_cancel returns what a failed request left).  A tensor
 * that fits nowhere is -ENOSPC with nothing reserved.  Each one's home becomes its place.
 * A tensor's home is the place its last explicit load or pin named (load_on; load_places:
 * above), kept in every replica alike (set_home).  A request that names no place (compute, a plain load or pin) uses
 * a RESIDENT replica when there is one: the home's, else the default place's (device 0, or host
 * memory without devices), else the lowest place's (resident_replica); when none is resident,
 * such as after an LRU eviction, it loads the tensor at its home again, not at the default
 * place, so that a tensor an operator put in host memory or on cuda:1 does not come back on
 * cuda:0, evicting that device's own tensors.  Without a home it loads at the default place.
 * An explicit evict of every replica, or of the one at the home, forgets the home.
 * What cannot fit (larger than the budget, or the budget held by pinned, mapped and in-use
 * tensors) is -ENOSPC for a load, pin or map; a compute request may instead run on a transient
 * copy of the blob, read with pread and checked (nwc_store_read_info) and freed when the request
 * releases it: the reply says so (NWC_RF_MAPPED) and stats count it.  Not a memory map of the
 * container: a container file truncated under a mapping would kill nwcd with SIGBUS, while a
 * short read is an error naming the file.  Transient copies are outside the budget but bounded
 * by it: one that would take the bytes held by transient copies past the budget waits for
 * others to be released (r->transient), unless none is held or it is at most TRANSIENT_SMALL
 * (a bias, acquired while its weight's copy is held, so a request never waits for itself); so
 * they add at most the budget, or one tensor, plus small ones.
 */
#include "residency.h"

#include "clock.h"
#include "log.h"
#include "nwcd.h"

#include "nwc_error.h"
#include "size_text.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define MAX_MAPS 1024 /* mapping sockets the daemon holds, all clients together */
/* Places an entry can be at: host memory and each device. */
#define MAX_PLACES (1 + NWCD_MAX_DEVICES)
#define TRANSIENT_SMALL (16u << 20) /* a transient copy this small never waits (head comment) */

struct nwcd_entry {
  char *model, *tensor;
  uint64_t hash;
  nwc_tensor_info *info; /* owned (nwc_tensor_info_free) */
  int state;
  int loc;               /* its place, fixed at creation: NWCD_LOC_CPU or a device */
  int home;              /* the tensor's home (above), the same in all its entries:
                            NWCD_LOC_DEFAULT, or the place its last explicit load named */
  void *buf;             /* host copy (loc CPU) */
  void *dcopy;           /* device copy (loc >= 0) */
  uint64_t dbytes;       /* device bytes held (reserved while LOADING) */
  size_t len;            /* bytes charged (host): the blob's length rounded up to whole pages, as
                            its memfd holds it (a packed blob's length is a multiple of 64 only) */
  bool locked, direct, pinned;
  bool exit_mapped;   /* a device copy still mapped by a client as the daemon exits: not freed */
  nwc_tensor view;
  unsigned refs;
  unsigned maps;      /* client mappings (entries of r->maps) */
  unsigned readers;   /* requests holding, reading or waiting for a transient copy of it */
  int fd;             /* RESIDENT: the sealed memfd (the backend's) once shared, or -1 */
  uint64_t last_used; /* nwcd_now_ns(), 0 never */
};

/* One client mapping: the daemon's end of the socket the client passed with map or map_gpu,
 * and the entries it holds: one (map, or map_gpu of a tensor: in one), or a model's (map_gpu
 * of a model: the malloc'ed list e).  Each entry it holds counts it once in its maps. */
typedef struct nwcd_mapref {
  nwcd_entry *one;
  nwcd_entry **e; /* n > 1: n entries (owned) */
  unsigned n;
  int sock;
  pid_t pid; /* the client that made the socket (SO_PEERCRED), for messages and ps */
} nwcd_mapref;

static nwcd_entry *const *ref_entries(const nwcd_mapref *m) { return m->n > 1 ? m->e : &m->one; }

/* Drops m's references and closes its socket (r->lock held). */
static void mapref_drop(nwcd_mapref *m) {
  nwcd_entry *const *es = ref_entries(m);
  for (unsigned i = 0; i < m->n; i++) es[i]->maps--;
  close(m->sock);
  if (m->n > 1) free(m->e);
  m->e = NULL, m->n = 0;
}

static bool mapref_holds(const nwcd_mapref *m, const nwcd_entry *e) {
  nwcd_entry *const *es = ref_entries(m);
  for (unsigned i = 0; i < m->n; i++)
    if (es[i] == e) return true;
  return false;
}

/* The index's node: a tensor's replicas by place (at[loc + 1]), found by the tensor's key (its
 * hash, model and tensor: the strings of one of its entries) in a tree (tsearch), so that a
 * request finds its tensor's entries without scanning every entry of every place. */
typedef struct replica_set {
  uint64_t hash;
  const char *model, *tensor;
  nwcd_entry *at[MAX_PLACES];
  int n;
} replica_set;

struct nwcd_res {
  nwcd *d;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  nwcd_entry **e; /* every entry, in the order they were made (ps lists them so) */
  size_t n, cap;
  void *index;    /* tsearch root of replica_set nodes: every entry of e[] in exactly one */
  uint64_t budget, used, pinned_bytes;             /* host memory */
  uint64_t gbudget[NWCD_MAX_DEVICES], gused[NWCD_MAX_DEVICES]; /* device copies */
  uint64_t gfree[NWCD_MAX_DEVICES]; /* device memory free when the default budget was set */
  int default_loc;
  uint64_t loads, load_bytes, load_us, direct_loads, buffered_loads, evictions;
  uint64_t mlock_ok, mlock_failed, mapped;
  uint64_t transient; /* bytes of transient copies held by requests (see the head comment) */
  nwcd_mapref maps[MAX_MAPS];
  struct pollfd pfd[MAX_MAPS];
  size_t nmaps;
};

static uint64_t key_hash(const char *model, const char *tensor) {
  return XXH3_64bits_withSeed(tensor, strlen(tensor), XXH3_64bits(model, strlen(model)));
}

static int set_cmp(const void *a, const void *b) {
  const replica_set *x = a, *y = b;
  if (x->hash != y->hash) return x->hash < y->hash ? -1 : 1;
  int c = strcmp(x->model, y->model);
  return c ? c : strcmp(x->tensor, y->tensor);
}

/* The replicas of model/tensor, or NULL when it has no entry (r->lock held). */
static replica_set *set_of(nwcd_res *r, const char *model, const char *tensor) {
  replica_set key = {.hash = key_hash(model, tensor), .model = model, .tensor = tensor};
  void *node = tfind(&key, &r->index, set_cmp);
  return node ? *(replica_set **)node : NULL;
}

/* e (new, its hash set) into the index: 0, or -ENOMEM with nothing changed (r->lock held). */
static int index_add(nwcd_res *r, nwcd_entry *e) {
  replica_set *s = set_of(r, e->model, e->tensor);
  if (!s) {
    if (!(s = calloc(1, sizeof *s))) return -ENOMEM;
    s->hash = e->hash, s->model = e->model, s->tensor = e->tensor;
    if (!tsearch(s, &r->index, set_cmp)) return free(s), -ENOMEM;
  }
  s->at[e->loc + 1] = e, s->n++;
  return 0;
}

/* e out of the index, before it is freed: its set goes with its last entry, else takes another
 * entry's strings (r->lock held). */
static void index_remove(nwcd_res *r, const nwcd_entry *e) {
  replica_set *s = set_of(r, e->model, e->tensor);
  s->at[e->loc + 1] = NULL;
  if (--s->n == 0) {
    tdelete(s, &r->index, set_cmp);
    free(s);
    return;
  }
  for (int p = 0; s->model == e->model && p < MAX_PLACES; p++)
    if (s->at[p]) s->model = s->at[p]->model, s->tensor = s->at[p]->tensor;
}

/* The entries of model/tensor (its replicas, one per place, in any state) into out, host
 * memory's first, then by device; returns how many (r->lock held). */
static int replicas(nwcd_res *r, const char *model, const char *tensor,
                    nwcd_entry *out[MAX_PLACES]) {
  const replica_set *s = set_of(r, model, tensor);
  int k = 0;
  for (int p = 0; s && p < MAX_PLACES; p++)
    if (s->at[p]) out[k++] = s->at[p];
  return k;
}

/* The entry of model/tensor at loc, or NULL. */
static nwcd_entry *find(nwcd_res *r, const char *model, const char *tensor, int loc) {
  const replica_set *s = set_of(r, model, tensor);
  return s ? s->at[loc + 1] : NULL;
}

/* The RESIDENT replica among es[0..n) that a request naming no place uses: the one at the
 * tensor's home, else at the default place, else at the lowest place; NULL when none is. */
static nwcd_entry *resident_replica(const nwcd_res *r, nwcd_entry *const *es, int n) {
  nwcd_entry *best = NULL;
  int best_rank = 0;
  for (int i = 0; i < n; i++) {
    if (es[i]->state != NWC_RES_RESIDENT) continue;
    int loc = es[i]->loc, rank = loc == es[i]->home ? -3 : loc == r->default_loc ? -2 : loc;
    if (!best || rank < best_rank) best = es[i], best_rank = rank;
  }
  return best;
}

/* The place a request naming none uses for model/tensor: its resident replica's, else its
 * home, else the default place (r->lock held). */
static int unnamed_place(nwcd_res *r, const char *model, const char *tensor) {
  nwcd_entry *es[MAX_PLACES];
  int n = replicas(r, model, tensor, es);
  const nwcd_entry *e = resident_replica(r, es, n);
  if (e) return e->loc;
  return n && es[0]->home != NWCD_LOC_DEFAULT ? es[0]->home : r->default_loc;
}

/* Sets the home of model/tensor in all its entries. */
static void set_home(nwcd_res *r, const char *model, const char *tensor, int home) {
  nwcd_entry *es[MAX_PLACES];
  int n = replicas(r, model, tensor, es);
  for (int i = 0; i < n; i++) es[i]->home = home;
}

int nwcd_res_create(nwcd *d, uint64_t budget, nwcd_res **out) {
  nwcd_res *r = calloc(1, sizeof *r);
  if (!r) return -ENOMEM;
  /* A descriptor per resident tensor (its memfd) and per mapping: the soft limit on open files
   * goes up to the hard one (systemd's default soft limit is 1024). */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
      nwcd_log(NWCD_LOG_DEBUG, "open files limit %llu -> %llu", (unsigned long long)was,
               (unsigned long long)rl.rlim_max);
  }
  r->d = d, r->budget = budget;
  r->default_loc = d->backend->ndevices > 0 ? 0 : NWCD_LOC_CPU;
  pthread_mutex_init(&r->lock, NULL);
  pthread_cond_init(&r->cond, NULL);
  *out = r;
  return 0;
}

/* Drops the mappings whose client closed its end of the socket (see the top): one poll() of
 * all mapping sockets, never waiting.  Called with r->lock held. */
static void reap_maps(nwcd_res *r) {
  if (!r->nmaps) return;
  for (size_t i = 0; i < r->nmaps; i++) r->pfd[i] = (struct pollfd){r->maps[i].sock, 0, 0};
  if (poll(r->pfd, r->nmaps, 0) <= 0) return; /* events 0: only POLLHUP / POLLERR come back */
  size_t k = 0;
  for (size_t i = 0; i < r->nmaps; i++) {
    nwcd_mapref *m = &r->maps[i];
    if (!r->pfd[i].revents) {
      r->maps[k++] = *m;
      continue;
    }
    nwcd_log(NWCD_LOG_DEBUG, "pid %d unmapped %s/%s%s", (int)m->pid, ref_entries(m)[0]->model,
             ref_entries(m)[0]->tensor, m->n > 1 ? " and the rest of its model" : "");
    mapref_drop(m);
  }
  r->nmaps = k;
}

/* "pid 12, 34" of e's mappings into buf (r->lock held). */
static const char *map_pids(nwcd_res *r, const nwcd_entry *e, char *buf, size_t n) {
  size_t off = snprintf(buf, n, "pid");
  for (size_t i = 0; i < r->nmaps && off < n; i++)
    if (mapref_holds(&r->maps[i], e))
      off += snprintf(buf + off, n - off, "%s %d", off > 3 ? "," : "", (int)r->maps[i].pid);
  return buf;
}

/* A device copy holds the lookup table, then the blob. */
#define DEV_SLACK (NWC_TAB_ENTRIES * 4)

static uint64_t *used_at(nwcd_res *r, int loc) { return loc < 0 ? &r->used : &r->gused[loc]; }
static uint64_t budget_at(nwcd_res *r, int loc) { return loc < 0 ? r->budget : r->gbudget[loc]; }
/* Bytes e holds (or reserves) in its place. */
static uint64_t held(const nwcd_entry *e) { return e->loc < 0 ? e->len : e->dbytes; }
/* Bytes a load of a blob of length bytes reserves at loc: its memfd's whole pages in host
 * memory, the lookup table more on a device (DEV_SLACK). */
static uint64_t need_at(uint64_t length, int loc) {
  uint64_t pages = (length + 4095) & ~(uint64_t)4095;
  return loc < 0 ? pages : pages + DEV_SLACK;
}
static void loc_name(int loc, char out[16]) {
  if (loc < 0) snprintf(out, 16, "cpu");
  else snprintf(out, 16, "cuda:%d", loc);
}

/* Pins e, RESIDENT, at its place (r->lock held). */
static void entry_pin(nwcd_res *r, nwcd_entry *e) {
  if (!e->pinned) e->pinned = true, r->pinned_bytes += e->len;
}

static void entry_unload(nwcd_res *r, nwcd_entry *e) {
  if (e->state != NWC_RES_RESIDENT) return;
  if (e->exit_mapped) { /* left to the process's end: an importer must free first */
  } else if (e->dcopy) r->d->backend->dev_free(e->dcopy);
  else r->d->backend->host_free(e->buf, e->len, e->locked);
  e->buf = e->dcopy = NULL, e->fd = -1;
  *used_at(r, e->loc) -= held(e);
  if (e->loc >= 0 && !r->gused[e->loc]) r->d->backend->dev_trim(e->loc); /* nothing left there */
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
  reap_maps(r);
  for (size_t i = 0; i < r->nmaps; i++) {
    nwcd_entry *const *es = ref_entries(&r->maps[i]);
    for (unsigned k = 0; k < r->maps[i].n; k++) es[k]->exit_mapped = es[k]->loc >= 0;
    mapref_drop(&r->maps[i]);
  }
  r->nmaps = 0; /* host maps stay valid: the pages live while they map them; device copies
                 * still mapped are not freed here (cudaMemPoolImportPointer: the exporter frees
                 * last), the driver reclaims them with this process */
  for (size_t i = 0; i < r->n; i++) index_remove(r, r->e[i]), entry_free(r, r->e[i]);
  if (r->d->backend->host_trim) r->d->backend->host_trim(0, 0);
  free(r->e);
  pthread_cond_destroy(&r->cond);
  pthread_mutex_destroy(&r->lock);
  free(r);
}

/* Evicts the least recently used entry of loc that nothing uses, maps or pins: its bytes, 0 if
 * none (r->lock held, mappings reaped). */
static uint64_t evict_lru(nwcd_res *r, int loc) {
  nwcd_entry *victim = NULL;
  for (size_t i = 0; i < r->n; i++) {
    nwcd_entry *e = r->e[i];
    if (e->state == NWC_RES_RESIDENT && e->loc == loc && !e->refs && !e->maps && !e->pinned &&
        (!victim || e->last_used < victim->last_used))
      victim = e;
  }
  if (!victim) return 0;
  uint64_t t0 = nwcd_now_ns(), bytes = held(victim);
  char where[16];
  loc_name(loc, where);
  entry_unload(r, victim);
  nwcd_log(NWCD_LOG_INFO, "evicted %s/%s (%llu bytes on %s, LRU) in %.3f ms", victim->model,
           victim->tensor, (unsigned long long)bytes, where, (nwcd_now_ns() - t0) / 1e6);
  r->evictions++;
  return bytes;
}

/* Evicts LRU entries of loc until need more bytes fit its budget; false if they cannot. */
static bool make_room(nwcd_res *r, int loc, uint64_t need) {
  if (need > budget_at(r, loc)) return false;
  if (*used_at(r, loc) + need > budget_at(r, loc)) reap_maps(r);
  bool fits = true;
  while (fits && *used_at(r, loc) + need > budget_at(r, loc)) fits = evict_lru(r, loc) > 0;
  if (loc < 0 && r->d->backend->host_trim) /* spares in what is left, this load's kept */
    r->d->backend->host_trim(fits ? r->budget - r->used - need : 0, fits ? need : 0);
  return fits;
}

/* -ENOSPC for model/tensor, which needs need bytes at loc that make_room could not find, said
 * as people read sizes with what the operator can do about it (r->lock held). */
static int no_room(nwcd_res *r, const char *model, const char *tensor, int loc, uint64_t need) {
  char where[16], b[4][16];
  loc_name(loc, where);
  const char *flag = loc < 0 ? "--budget" : "--gpu-budget";
  uint64_t budget = budget_at(r, loc);
  if (need > budget)
    return nwc__fail(-ENOSPC, "%s/%s needs %s, more than the memory budget of %s (%s); raise "
                     "%s", model, tensor, nwc_size_text(need, b[0]), where,
                     nwc_size_text(budget, b[1]), flag);
  return nwc__fail(-ENOSPC, "%s/%s needs %s on %s, but %s of its budget of %s is pinned or in "
                   "use (%s pinned in all); unpin or evict tensors (nwcctl ps lists them), or "
                   "raise %s", model, tensor, nwc_size_text(need, b[0]), where,
                   nwc_size_text(*used_at(r, loc), b[1]), nwc_size_text(budget, b[2]),
                   nwc_size_text(r->pinned_bytes, b[3]), flag);
}

/* After a device allocation failed although the budget allowed it (memory used by others):
 * LRU evictions at device loc until need bytes are freed or nothing is left to evict; returns
 * the bytes freed (called without r->lock). */
static uint64_t evict_for_memory(nwcd_res *r, int loc, uint64_t need) {
  uint64_t freed = 0, got;
  pthread_mutex_lock(&r->lock);
  while (freed < need && (got = evict_lru(r, loc))) freed += got;
  pthread_mutex_unlock(&r->lock);
  return freed;
}

/* Loads e onto its device (the backend streams the blob there), evicting LRU copies of that
 * device for need bytes and retrying once when the allocation fails (called without r->lock). */
static int load_device(nwcd_res *r, nwcd_entry *e, uint64_t need, void **dcopy,
                       nwcd_load_info *l) {
  const nwcd_backend *b = r->d->backend;
  int rc = b->dev_load(e->info, e->loc, dcopy, l);
  if (rc != -ENOMEM) return rc;
  uint64_t freed = evict_for_memory(r, e->loc, need);
  rc = b->dev_load(e->info, e->loc, dcopy, l);
  char where[16];
  loc_name(e->loc, where);
  if (rc == -ENOMEM)
    rc = nwc__fail(-ENOMEM, "no device memory for %llu bytes of %s/%s on %s (after evicting %llu "
                   "bytes and retrying)", (unsigned long long)need, e->model, e->tensor, where,
                   (unsigned long long)freed);
  return rc;
}

/* The host-side view of a device copy: shapes, no arrays (nor scales). */
static nwc_tensor shape_view(const nwc_tensor_info *ti) {
  nwc_tensor v = {.elem = ti->elem, .rows = ti->rows, .cols = ti->cols, .nblocks = ti->nblocks,
                  .data_bytes = ti->data_bytes, .raw_bytes = ti->raw_plane_bytes};
  memcpy(v.psym, ti->psym, sizeof v.psym);
  return v;
}

/* Creates the entry of model/tensor at loc (with its own catalog info) unless there is one:
 * called with the daemon's store lock and r->lock both held. */
static int lookup_locked(nwcd_res *r, const char *model, const char *tensor, int loc,
                         nwcd_entry **out) {
  nwcd_entry *e = find(r, model, tensor, loc);
  int rc = 0;
  if (!e) {
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
      nwcd_entry *sib[MAX_PLACES]; /* a new replica takes the tensor's home */
      e->home = replicas(r, model, tensor, sib) ? sib[0]->home : NWCD_LOC_DEFAULT;
      e->hash = key_hash(model, tensor), e->info = ti, e->fd = -1, e->loc = loc;
      e->len = need_at(ti->length, NWCD_LOC_CPU);
      if ((rc = index_add(r, e)) < 0) free(e->model), free(e->tensor), free(e), e = NULL;
      else r->e[r->n++] = e;
    }
    if (rc < 0) nwc_tensor_info_free(ti, ti ? 1 : 0);
  }
  *out = e;
  return rc;
}

/* Finds or creates the entry of model/tensor at loc; called with r->lock held, may drop and
 * retake it (the store lock is taken first, per the lock order). */
static int lookup(nwcd_res *r, const char *model, const char *tensor, int loc,
                  nwcd_entry **out) {
  if ((*out = find(r, model, tensor, loc))) return 0;
  pthread_mutex_unlock(&r->lock);
  pthread_mutex_lock(&r->d->store_lock);
  pthread_mutex_lock(&r->lock);
  int rc = lookup_locked(r, model, tensor, loc, out);
  pthread_mutex_unlock(&r->d->store_lock);
  return rc;
}

int nwcd_no_device(const nwcd_backend *b, int at) {
  if (!b->ndevices)
    return nwc__fail(-ENODEV, "no device cuda:%d: backend %s has no GPU (--device cpu, or nwcd "
                     "--backend cuda on a host with one)", at, b->name);
  return nwc__fail(-ENODEV, "no device cuda:%d: backend %s has %d GPU%s, cuda:0 to cuda:%d", at,
                   b->name, b->ndevices, b->ndevices == 1 ? "" : "s", b->ndevices - 1);
}

/* Frees a transient copy (ref->view owns it) and returns its bytes to the transient count. */
static void transient_done(nwcd_res *r, nwcd_ref *ref) {
  nwc_tensor_release(&ref->view);
  pthread_mutex_lock(&r->lock);
  r->transient -= ref->te->len;
  ref->te->readers--;
  pthread_cond_broadcast(&r->cond);
  pthread_mutex_unlock(&r->lock);
  ref->transient = false;
}

/* Reserves need bytes at e's place, room made, for its load: LOADING (r->lock held). */
static void load_begin(nwcd_res *r, nwcd_entry *e, uint64_t need) {
  e->state = NWC_RES_LOADING;
  e->dbytes = need;
  *used_at(r, e->loc) += need;
}

/* Ends e's load (load_begin's need; r->lock held): with rc 0, RESIDENT with its copy (buf in host
 * memory, or dcopy on its device: the host keeps the shapes), the load counted (l) and waiters
 * woken; else, or when the host copy's view fails, ABSENT again with the reservation returned
 * and the host copy freed.  Returns rc or the view's error. */
static int load_end(nwcd_res *r, nwcd_entry *e, int rc, uint64_t need, void *buf, bool locked,
                    void *dcopy, const nwcd_load_info *l) {
  nwc_tensor view;
  if (rc == 0 && e->loc >= 0) view = shape_view(e->info);
  else if (rc == 0) rc = nwc_store_blob_view(e->info, buf, &view);
  pthread_cond_broadcast(&r->cond);
  if (rc < 0) {
    if (buf) r->d->backend->host_free(buf, e->len, locked);
    *used_at(r, e->loc) -= need;
    e->state = NWC_RES_ABSENT;
    return rc;
  }
  if (e->loc >= 0) {
    e->dbytes = r->d->backend->dev_size(dcopy);
    *used_at(r, e->loc) -= need - e->dbytes;
  }
  e->buf = buf, e->dcopy = dcopy;
  e->locked = locked, e->direct = l->direct, e->view = view;
  e->state = NWC_RES_RESIDENT;
  r->loads++, r->load_bytes += l->bytes, r->load_us += l->micros;
  if (l->direct) r->direct_loads++;
  else r->buffered_loads++;
  if (locked) r->mlock_ok++;
  else r->mlock_failed++;
  return 0;
}

/* The read of e's blob into its place (called without r->lock): onto its device (*dcopy), or
 * into a host copy (*buf, *locked). */
static int load_one(nwcd_res *r, nwcd_entry *e, uint64_t need, void **buf, bool *locked,
                    void **dcopy, nwcd_load_info *l) {
  if (e->loc >= 0) return load_device(r, e, need, dcopy, l);
  return r->d->backend->host_load(e->info, buf, locked, l);
}

/* Loads e, LOADING with need bytes reserved (load_begin), at its place: the blob streams onto
 * its device, or into a host copy; then load_end.  Called with r->lock held, which it drops
 * while reading; *l gets the load's. */
static int load_reserved(nwcd_res *r, nwcd_entry *e, uint64_t need, nwcd_load_info *l) {
  pthread_mutex_unlock(&r->lock);
  bool locked = false;
  void *buf = NULL, *dcopy = NULL;
  int rc = load_one(r, e, need, &buf, &locked, &dcopy, l);
  pthread_mutex_lock(&r->lock);
  return load_end(r, e, rc, need, buf, locked, dcopy, l);
}

int nwcd_res_acquire(nwcd_res *r, const char *model, const char *tensor, unsigned flags,
                     nwcd_ref *ref, nwcd_load_info *li) {
  memset(ref, 0, sizeof *ref);
  if (li) memset(li, 0, sizeof *li);
  pthread_mutex_lock(&r->lock);
  nwcd_entry *e;
  int named = (int)(flags >> 8) - 2; /* NWCD_ACQ_AT */
  int at = named == NWCD_LOC_DEFAULT ? unnamed_place(r, model, tensor) : named;
  if (at >= r->d->backend->ndevices || at < NWCD_LOC_CPU) {
    pthread_mutex_unlock(&r->lock);
    return nwcd_no_device(r->d->backend, at);
  }
  int rc = lookup(r, model, tensor, at, &e);
  while (rc == 0 && e->state != NWC_RES_RESIDENT) {
    if (e->state == NWC_RES_LOADING) {
      pthread_cond_wait(&r->cond, &r->lock);
      continue;
    }
    uint64_t need = need_at(e->info->length, at);
    if (!make_room(r, at, need)) {
      if (flags & NWCD_ACQ_MAP_OK) {
        const nwc_tensor_info *ti = e->info; /* e->readers keeps it (nwcd_res_forget_model) */
        e->readers++;
        while (r->transient && e->len > TRANSIENT_SMALL && r->transient + e->len > r->budget)
          pthread_cond_wait(&r->cond, &r->lock);
        r->mapped++;
        r->transient += e->len;
        pthread_mutex_unlock(&r->lock);
        rc = nwc_store_read_info(ti, &ref->view);
        ref->ti = ti, ref->te = e;
        ref->transient = true;
        if (rc < 0) transient_done(r, ref);
        return rc;
      }
      rc = no_room(r, model, tensor, at, need);
      break;
    }
    load_begin(r, e, need);
    nwcd_load_info l = {0};
    if ((rc = load_reserved(r, e, need, &l)) < 0) break;
    ref->loaded = true;
    if (li) *li = l;
    if (!(flags & (NWCD_ACQ_PIN | NWCD_ACQ_NOREF))) /* explicit loads are logged by ops_load.c */
      nwcd_log(NWCD_LOG_INFO, "loaded %s/%s for a request: %llu bytes (%s) in %.3f ms", model,
               tensor, (unsigned long long)l.bytes, l.direct ? "O_DIRECT" : "buffered",
               l.micros / 1e3);
  }
  if (rc == 0) {
    e->last_used = nwcd_now_ns();
    if (named != NWCD_LOC_DEFAULT && (flags & (NWCD_ACQ_PIN | NWCD_ACQ_NOREF))) /* load, pin */
      set_home(r, model, tensor, named);
    if (flags & NWCD_ACQ_PIN) entry_pin(r, e);
    if (li && !ref->loaded) li->direct = e->direct;
    ref->ti = e->info, ref->loc = e->loc;
    if (!(flags & (NWCD_ACQ_PIN | NWCD_ACQ_NOREF))) {
      e->refs++;
      ref->e = e;
      ref->view = e->view;
      ref->dcopy = e->dcopy;
    }
  }
  pthread_mutex_unlock(&r->lock);
  return rc;
}

/* The entries of model/tensor at locs[0..n) into es, made where absent, all valid together: a
 * lookup may drop r->lock, and an entry could go meanwhile (r->lock held). */
static int lookup_all(nwcd_res *r, const char *model, const char *tensor, const int *locs, int n,
                      nwcd_entry **es) {
  for (bool dropped = true; dropped;) {
    for (int i = 0; i < n; i++) NWC_TRY(lookup(r, model, tensor, locs[i], &es[i]));
    dropped = false;
    for (int i = 0; i < n; i++) dropped |= !(es[i] = find(r, model, tensor, locs[i]));
  }
  return 0;
}

/* Loads es[0..n) (LOADING, need[k] reserved, ascending places) from one read: the single-place
 * loads for one, else the backend's places_load, retried once after LRU evictions on the devices
 * when device memory ran out (as load_device); *l gets the read's (called without r->lock). */
static int load_places(nwcd_res *r, nwcd_entry **es, const uint64_t *need, int n, void **buf,
                       bool *locked, void **dcopy, nwcd_load_info *l) {
  const nwcd_backend *b = r->d->backend;
  if (n == 1) return load_one(r, es[0], need[0], buf, locked, &dcopy[0], l);
  bool host = es[0]->loc < 0;
  int devs[MAX_PLACES], nd = 0;
  for (int k = host; k < n; k++) devs[nd++] = es[k]->loc;
  NWC_RETURN_IF(!b->places_load, -ENOTSUP, "the %s backend loads one place at a time", b->name);
  int rc = b->places_load(es[0]->info, host, buf, locked, devs, nd, dcopy + host, l);
  if (rc != -ENOMEM) return rc;
  for (int k = host; k < n; k++) evict_for_memory(r, es[k]->loc, need[k]);
  rc = b->places_load(es[0]->info, host, buf, locked, devs, nd, dcopy + host, l);
  if (rc == -ENOMEM)
    rc = nwc__fail(-ENOMEM, "no device memory for %s/%s on one of its places (after evicting and "
                   "retrying)", es[0]->model, es[0]->tensor);
  return rc;
}

int nwcd_res_acquire_places(nwcd_res *r, const char *model, const char *tensor, uint64_t places,
                            bool pin, nwcd_load_info *li, uint64_t *loaded) {
  const nwcd_backend *b = r->d->backend;
  if (li) memset(li, 0, sizeof *li);
  *loaded = 0;
  int locs[MAX_PLACES], n = 0;
  for (int loc = NWCD_LOC_CPU; loc < 63; loc++) {
    if (!(places >> (loc + 1) & 1)) continue;
    if (loc >= b->ndevices) return nwcd_no_device(b, loc);
    locs[n++] = loc;
  }
  NWC_RETURN_IF(!n, -EINVAL, "load_places names no place");
  int home = n > 1 && locs[0] == NWCD_LOC_CPU ? locs[1] : locs[0]; /* the lowest GPU, else host */
  nwcd_entry *es[MAX_PLACES], *todo[MAX_PLACES];
  uint64_t need[MAX_PLACES];
  int rc = 0, nl = 0;
  char first[NWC_PROTO_MAX_MSG] = ""; /* rc's detail: later failures set their own */
  pthread_mutex_lock(&r->lock);
  for (bool loading = true; loading;) {
    if ((rc = lookup_all(r, model, tensor, locs, n, es)) < 0) {
      pthread_mutex_unlock(&r->lock);
      return rc;
    }
    loading = false;
    for (int i = 0; i < n; i++) loading |= es[i]->state == NWC_RES_LOADING;
    if (loading) pthread_cond_wait(&r->cond, &r->lock);
  }
  for (int i = 0; i < n; i++) {
    if (es[i]->state == NWC_RES_RESIDENT) continue;
    uint64_t want = need_at(es[i]->info->length, locs[i]);
    if (!make_room(r, locs[i], want)) { /* that place fails as load_on would; the others load */
      int e = no_room(r, model, tensor, locs[i], want);
      if (rc == 0) rc = e, snprintf(first, sizeof first, "%s", nwc_error_detail());
      continue;
    }
    load_begin(r, es[i], want);
    need[nl] = want, todo[nl++] = es[i];
  }
  if (nl) {
    pthread_mutex_unlock(&r->lock);
    void *buf = NULL, *dcopy[MAX_PLACES] = {NULL};
    bool locked = false;
    nwcd_load_info l = {0};
    int lrc = load_places(r, todo, need, nl, &buf, &locked, dcopy, &l);
    if (lrc < 0 && rc == 0) rc = lrc, snprintf(first, sizeof first, "%s", nwc_error_detail());
    pthread_mutex_lock(&r->lock);
    for (int k = 0; k < nl; k++) { /* one read: the bytes and the time counted once */
      nwcd_load_info once = {.direct = l.direct};
      int e = load_end(r, todo[k], lrc, need[k], todo[k]->loc < 0 ? buf : NULL,
                       todo[k]->loc < 0 && locked, dcopy[k], k ? &once : &l);
      if (e == 0) *loaded |= UINT64_C(1) << (todo[k]->loc + 1);
      if (e < 0 && rc == 0) rc = e, snprintf(first, sizeof first, "%s", nwc_error_detail());
    }
    if (li) *li = l;
  }
  for (int i = 0; i < n; i++) {
    if (es[i]->state != NWC_RES_RESIDENT) continue;
    es[i]->last_used = nwcd_now_ns();
    if (pin) entry_pin(r, es[i]);
    if (locs[i] == home) set_home(r, model, tensor, home);
  }
  pthread_mutex_unlock(&r->lock);
  return rc < 0 ? nwc__fail(rc, "%s", first) : 0;
}

/* Natural name order (qsort over tensor infos): digit runs compare as numbers, so that
 * layers.2 comes before layers.10 (strverscmp(3)). */
static int natural_order(const void *a, const void *b) {
  return strverscmp((*(const nwc_tensor_info *const *)a)->name,
                    (*(const nwc_tensor_info *const *)b)->name);
}

/* Returns the reservations of slots s[0..n) that the plan made and no lane took, and clears
 * their load (r->lock held; a slot planned but not reserved yet has no e). */
static void split_unreserve(nwcd_res *r, nwcd_split_slot *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i].load && s[i].e) load_end(r, s[i].e, -ECANCELED, s[i].need, NULL, false, NULL, NULL);
  for (size_t i = 0; i < n; i++) s[i].load = false;
}

/* -ENOSPC for a split whose tensor t fits none of the np places order[] (planned: the bytes
 * the plan put at each before it, by loc + 1), naming each place's free bytes (r->lock held). */
static int no_split_room(nwcd_res *r, const char *model, const nwc_tensor_info *t,
                         const int *order, int np, const uint64_t *planned) {
  char list[512], size[16], where[16], b[16];
  size_t off = 0;
  for (int p = 0; p < np && off < sizeof list; p++) {
    int loc = order[p];
    uint64_t taken = *used_at(r, loc) + planned[loc + 1], budget = budget_at(r, loc);
    uint64_t free_bytes = taken < budget ? budget - taken : 0;
    loc_name(loc, where);
    off += snprintf(list + off, sizeof list - off, "%s%s %s (%llu bytes) free of %s", p ? ", " : "",
                    where, nwc_size_text(free_bytes, size), (unsigned long long)free_bytes,
                    nwc_size_text(budget, b));
  }
  return nwc__fail(-ENOSPC, "split of %s: %s/%s needs %s (%llu bytes at a place) and fits at none "
                   "of its places (%s, after the tensors before it in name order); nothing "
                   "loaded; raise --gpu-budget or --budget, name more places, or evict tensors "
                   "(nwcctl ps lists them)", model, model, t->name, nwc_size_text(t->length, size),
                   (unsigned long long)t->length, list);
}

/* Logs the plan: tensors and bytes at each place. */
static void log_split(const char *model, const nwc_tensor_info *ti, const nwcd_split_slot *s,
                      size_t n, const int *order, int np) {
  char line[512], where[16], size[16];
  size_t off = 0;
  for (int p = 0; p < np && off < sizeof line; p++) {
    uint64_t k = 0, bytes = 0;
    for (size_t i = 0; i < n; i++)
      if (s[i].loc == order[p]) k++, bytes += ti[i].length;
    loc_name(order[p], where);
    off += snprintf(line + off, sizeof line - off, "%s%s %llu tensors, %s", p ? "; " : "", where,
                    (unsigned long long)k, nwc_size_text(bytes, size));
  }
  nwcd_log(NWCD_LOG_INFO, "split %s: %s", model, line);
}

int nwcd_res_split_plan(nwcd_res *r, const char *model, const nwc_tensor_info *ti, size_t n,
                        uint64_t places, nwcd_split_slot *out) {
  const nwcd_backend *b = r->d->backend;
  int order[MAX_PLACES], np = 0; /* the devices in order, host memory last (the overflow) */
  for (int dv = 0; dv < b->ndevices; dv++)
    if (places >> (dv + 1) & 1) order[np++] = dv;
  if (places & 1) order[np++] = NWCD_LOC_CPU;
  NWC_RETURN_IF(!np, -EINVAL, "split of %s names no place", model);
  const nwc_tensor_info **by = malloc((n ? n : 1) * sizeof *by);
  if (!by) return -ENOMEM;
  for (size_t i = 0; i < n; i++) by[i] = &ti[i];
  qsort(by, n, sizeof *by, natural_order);
  uint64_t planned[MAX_PLACES] = {0}; /* bytes this plan put at loc, at loc + 1 */
  int rc = 0;
  pthread_mutex_lock(&r->d->store_lock); /* lookup_locked's order: the store's lock first */
  pthread_mutex_lock(&r->lock);
  for (size_t k = 0; k < n && rc == 0; k++) {
    const nwc_tensor_info *t = by[k];
    nwcd_split_slot *s = &out[t - ti];
    *s = (nwcd_split_slot){.loc = NWCD_LOC_DEFAULT};
    for (int p = 0; p < np && s->loc == NWCD_LOC_DEFAULT; p++) { /* there already: it stays */
      const nwcd_entry *e = find(r, model, t->name, order[p]);
      if (e && e->state != NWC_RES_ABSENT) s->loc = order[p];
    }
    for (int p = 0; p < np && s->loc == NWCD_LOC_DEFAULT; p++) { /* the first with room */
      int loc = order[p];
      uint64_t need = need_at(t->length, loc), taken = *used_at(r, loc) + planned[loc + 1];
      if (taken + need > budget_at(r, loc)) continue;
      s->loc = loc, s->load = true, s->need = need;
      planned[loc + 1] += need;
    }
    if (s->loc == NWCD_LOC_DEFAULT) rc = no_split_room(r, model, t, order, np, planned);
  }
  for (size_t i = 0; i < n && rc == 0; i++) { /* reserved as acquire does: LOADING */
    if (!out[i].load) continue;
    out[i].load = false;
    if ((rc = lookup_locked(r, model, ti[i].name, out[i].loc, &out[i].e)) == 0) {
      load_begin(r, out[i].e, out[i].need);
      out[i].load = true;
    }
  }
  if (rc < 0) split_unreserve(r, out, n);
  pthread_mutex_unlock(&r->lock);
  pthread_mutex_unlock(&r->d->store_lock);
  if (rc == 0) log_split(model, ti, out, n, order, np);
  free(by);
  return rc;
}

int nwcd_res_split_load(nwcd_res *r, const char *model, const char *tensor, nwcd_split_slot *s,
                        bool pin, nwcd_load_info *li) {
  if (!s->load) { /* resident or loading there already: as load_on or pin_on there */
    nwcd_ref ref;
    return nwcd_res_acquire(r, model, tensor,
                            (pin ? NWCD_ACQ_PIN : NWCD_ACQ_NOREF) | NWCD_ACQ_AT(s->loc), &ref, li);
  }
  nwcd_load_info l = {0};
  pthread_mutex_lock(&r->lock);
  nwcd_entry *e = s->e;
  s->load = false; /* taken: split_cancel leaves it */
  int rc = load_reserved(r, e, s->need, &l);
  if (rc == 0) {
    e->last_used = nwcd_now_ns();
    set_home(r, model, tensor, e->loc);
    if (pin) entry_pin(r, e);
  }
  pthread_mutex_unlock(&r->lock);
  if (li) *li = l;
  return rc;
}

void nwcd_res_split_cancel(nwcd_res *r, nwcd_split_slot *s, size_t n) {
  pthread_mutex_lock(&r->lock);
  split_unreserve(r, s, n);
  pthread_mutex_unlock(&r->lock);
}

void nwcd_res_release(nwcd_res *r, nwcd_ref *ref) {
  if (ref->transient) transient_done(r, ref);
  if (ref->e) {
    pthread_mutex_lock(&r->lock);
    ref->e->refs--;
    ref->e->last_used = nwcd_now_ns();
    pthread_mutex_unlock(&r->lock);
  }
  memset(ref, 0, sizeof *ref);
}

/* -EBUSY naming what stops an explicit evict of e (loading, in use, mapped, pinned), else 0
 * (r->lock held, mappings reaped). */
static int evict_busy(nwcd_res *r, const nwcd_entry *e) {
  char where[16], pids[128];
  loc_name(e->loc, where);
  if (e->state == NWC_RES_LOADING)
    return nwc__fail(-EBUSY, "%s/%s on %s is being loaded; not evicted", e->model, e->tensor,
                     where);
  if (e->refs)
    return nwc__fail(-EBUSY, "%s/%s on %s is in use by %u request(s); not evicted", e->model,
                     e->tensor, where, e->refs);
  if (e->maps)
    return nwc__fail(-EBUSY, "%s/%s on %s is mapped by %u client(s) (%s); not evicted: it can "
                     "be once they unmap it or exit", e->model, e->tensor, where, e->maps,
                     map_pids(r, e, pids, sizeof pids));
  if (e->pinned)
    return nwc__fail(-EBUSY, "%s/%s on %s is pinned; unpin it first", e->model, e->tensor, where);
  return 0;
}

int nwcd_res_evict(nwcd_res *r, const char *model, const char *tensor, int loc, uint64_t *bytes) {
  *bytes = 0;
  pthread_mutex_lock(&r->lock);
  reap_maps(r);
  nwcd_entry *es[MAX_PLACES];
  int n = replicas(r, model, tensor, es), rc = 0, home = n ? es[0]->home : NWCD_LOC_DEFAULT;
  if (loc != NWCD_LOC_DEFAULT) { /* one place's replica: the others stay */
    int k = 0;
    for (int i = 0; i < n; i++)
      if (es[i]->loc == loc) es[k++] = es[i];
    n = k;
  }
  for (int i = 0; i < n && rc == 0; i++) rc = evict_busy(r, es[i]); /* all or nothing */
  for (int i = 0; i < n && rc == 0; i++) {
    if (es[i]->state == NWC_RES_RESIDENT) {
      *bytes += held(es[i]);
      entry_unload(r, es[i]);
      r->evictions++;
    }
  }
  /* the home is forgotten when its replica goes (every replica's, or the one at the home) */
  if (rc == 0 && n && (loc == NWCD_LOC_DEFAULT || loc == home)) set_home(r, model, tensor, NWCD_LOC_DEFAULT);
  /* An explicit evict gives the memory back to the system: no spares stay behind (only LRU
   * evictions, which make room for a load, keep theirs). */
  if (n && r->d->backend->host_trim) r->d->backend->host_trim(0, 0);
  pthread_mutex_unlock(&r->lock);
  return rc;
}

/* A new budget (SIGHUP, config.c): evicts LRU entries down to it; *used gets what stays
 * resident (more than budget when pinned or in-use tensors hold it). */
void nwcd_res_set_budget(nwcd_res *r, uint64_t budget, uint64_t *used) {
  pthread_mutex_lock(&r->lock);
  r->budget = budget;
  reap_maps(r);
  make_room(r, NWCD_LOC_CPU, 0);
  *used = r->used;
  pthread_mutex_unlock(&r->lock);
}

void nwcd_res_set_gpu_budget(nwcd_res *r, uint64_t per_device) {
  const nwcd_backend *b = r->d->backend;
  for (int dev = 0; dev < b->ndevices; dev++) {
    uint64_t budget = per_device, free_bytes = 0, total = 0;
    if (!budget) {
      if (!r->gfree[dev] && b->dev_meminfo(dev, &free_bytes, &total) == 0)
        r->gfree[dev] = free_bytes;
      budget = r->gfree[dev] / 10 * 9;
    }
    pthread_mutex_lock(&r->lock);
    r->gbudget[dev] = budget;
    reap_maps(r);
    make_room(r, dev, 0);
    pthread_mutex_unlock(&r->lock);
    nwcd_log(NWCD_LOG_INFO, "cuda:%d: budget %llu MiB", dev, (unsigned long long)(budget >> 20));
  }
}

uint64_t nwcd_res_budget(nwcd_res *r, int loc, char where[16]) {
  if (loc == NWCD_LOC_DEFAULT) loc = r->default_loc;
  if (loc >= r->d->backend->ndevices) loc = NWCD_LOC_CPU - 1;
  loc_name(loc, where);
  if (loc < NWCD_LOC_CPU) return 0;
  pthread_mutex_lock(&r->lock);
  uint64_t b = budget_at(r, loc);
  pthread_mutex_unlock(&r->lock);
  return b;
}

int nwcd_res_unpin(nwcd_res *r, const char *model, const char *tensor) {
  pthread_mutex_lock(&r->lock);
  nwcd_entry *es[MAX_PLACES];
  int n = replicas(r, model, tensor, es), was = 0;
  for (int i = 0; i < n; i++)
    if (es[i]->pinned) es[i]->pinned = false, r->pinned_bytes -= es[i]->len, was = 1;
  pthread_mutex_unlock(&r->lock);
  return was;
}

int nwcd_res_forget_model(nwcd_res *r, const char *model) {
  pthread_mutex_lock(&r->lock);
  reap_maps(r);
  for (size_t i = 0; i < r->n; i++) {
    nwcd_entry *e = r->e[i];
    if (strcmp(e->model, model)) continue;
    if (e->refs || e->maps || e->readers || e->state == NWC_RES_LOADING) {
      char pids[128];
      int rc = e->maps ? nwc__fail(-EBUSY, "%s/%s is mapped by %u client(s) (%s); model not removed",
                                   model, e->tensor, e->maps, map_pids(r, e, pids, sizeof pids))
                       : nwc__fail(-EBUSY, "%s/%s is in use; model not removed", model, e->tensor);
      pthread_mutex_unlock(&r->lock);
      return rc;
    }
  }
  size_t k = 0;
  for (size_t i = 0; i < r->n; i++) {
    if (!strcmp(r->e[i]->model, model)) index_remove(r, r->e[i]), entry_free(r, r->e[i]);
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
  nwcd_entry *es[MAX_PLACES];
  int n = replicas(r, model, tensor, es);
  uint64_t last = 0;
  out->state = NWC_RES_ABSENT, out->pinned = 0, out->refs = 0;
  for (int i = 0; i < n; i++) {
    const nwcd_entry *e = es[i];
    if (e->state > out->state) out->state = (uint8_t)e->state; /* RESIDENT > LOADING > ABSENT */
    out->pinned |= e->pinned, out->refs += e->refs;
    if (e->last_used > last) last = e->last_used;
  }
  out->last_used_ms = ago_ms(last);
  pthread_mutex_unlock(&r->lock);
}

uint64_t nwcd_res_resident_bytes(nwcd_res *r, const char *model, const char *tensor, int *loc) {
  pthread_mutex_lock(&r->lock);
  nwcd_entry *es[MAX_PLACES];
  const nwcd_entry *e = resident_replica(r, es, replicas(r, model, tensor, es));
  uint64_t n = e ? e->len : 0;
  if (n && loc) *loc = e->loc;
  pthread_mutex_unlock(&r->lock);
  return n;
}

uint64_t nwcd_res_model_bytes(nwcd_res *r, const char *model) {
  uint64_t b = 0;
  pthread_mutex_lock(&r->lock);
  for (size_t i = 0; i < r->n; i++)
    if (r->e[i]->state == NWC_RES_RESIDENT && !strcmp(r->e[i]->model, model)) b += held(r->e[i]);
  pthread_mutex_unlock(&r->lock);
  return b;
}

int nwcd_res_list(nwcd_res *r, nwc_proto_ps **out, size_t *n) {
  pthread_mutex_lock(&r->lock);
  reap_maps(r);
  nwc_proto_ps *a = calloc(r->n ? r->n : 1, sizeof *a);
  size_t k = 0;
  for (size_t i = 0; a && i < r->n; i++) {
    nwcd_entry *e = r->e[i];
    if (e->state != NWC_RES_RESIDENT) continue;
    nwc_proto_ps *p = &a[k++];
    snprintf(p->model, sizeof p->model, "%s", e->model);
    snprintf(p->tensor, sizeof p->tensor, "%s", e->tensor);
    p->bytes = held(e), p->pinned = e->pinned, p->locked = e->locked, p->direct = e->direct;
    p->device = e->loc;
    p->refs = e->refs, p->maps = e->maps, p->last_used_ms = ago_ms(e->last_used);
  }
  pthread_mutex_unlock(&r->lock);
  if (!a) return -ENOMEM;
  *out = a, *n = k;
  return 0;
}

void nwcd_res_stats(nwcd_res *r, nwc_proto_stats *s) {
  pthread_mutex_lock(&r->lock);
  s->budget = r->budget, s->resident_bytes = 0, s->resident_tensors = 0;
  s->gpu_budget = s->gpu_resident_bytes = 0;
  for (int dev = 0; dev < r->d->backend->ndevices; dev++)
    s->gpu_budget += r->gbudget[dev], s->gpu_resident_bytes += r->gused[dev];
  for (size_t i = 0; i < r->n; i++)
    if (r->e[i]->state == NWC_RES_RESIDENT) {
      s->resident_tensors++;
      if (r->e[i]->loc < 0) s->resident_bytes += r->e[i]->len;
    }
  s->pinned_bytes = r->pinned_bytes;
  s->loads = r->loads, s->load_bytes = r->load_bytes, s->load_us = r->load_us;
  s->direct_loads = r->direct_loads, s->buffered_loads = r->buffered_loads;
  s->evictions = r->evictions, s->mlock_ok = r->mlock_ok, s->mlock_failed = r->mlock_failed;
  s->mapped_computes = r->mapped;
  pthread_mutex_unlock(&r->lock);
}

int nwcd_res_places(nwcd_res *r, nwc_proto_place *out) {
  int n = 1 + r->d->backend->ndevices;
  memset(out, 0, (size_t)n * sizeof *out);
  for (int k = 0; k < n; k++) loc_name(k - 1, out[k].name);
  pthread_mutex_lock(&r->lock);
  for (int k = 0; k < n; k++) out[k].budget = budget_at(r, k - 1);
  for (size_t i = 0; i < r->n; i++) {
    const nwcd_entry *e = r->e[i];
    if (e->state != NWC_RES_RESIDENT) continue;
    nwc_proto_place *p = &out[e->loc + 1];
    p->resident_bytes += held(e), p->resident_tensors++;
    if (e->pinned) p->pinned_bytes += held(e);
  }
  pthread_mutex_unlock(&r->lock);
  return n;
}

/* Checks that sock is a connected Unix stream socket; *pid gets its peer's pid. */
static int check_map_socket(int sock, pid_t *pid) {
  struct stat st;
  int type = 0, domain = 0;
  socklen_t l1 = sizeof type, l2 = sizeof domain;
  struct ucred cred = {0, 0, 0};
  socklen_t l3 = sizeof cred;
  bool ok = fstat(sock, &st) == 0 && S_ISSOCK(st.st_mode) &&
            getsockopt(sock, SOL_SOCKET, SO_DOMAIN, &domain, &l2) == 0 && domain == AF_UNIX &&
            getsockopt(sock, SOL_SOCKET, SO_TYPE, &type, &l1) == 0 &&
            (type == SOCK_STREAM || type == SOCK_SEQPACKET) &&
            getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &l3) == 0;
  NWC_RETURN_IF(!ok, -EINVAL,
                "map needs a connected Unix stream socket (one end of a socketpair) as its "
                "descriptor");
  *pid = cred.pid;
  return 0;
}

int nwcd_res_map(nwcd_res *r, const char *model, const char *tensor, int sock, uint64_t token,
                 nwc_proto_map *out) {
  pid_t pid = 0;
  NWC_TRY(check_map_socket(sock, &pid));
  nwcd_ref ref;
  /* the replica in host memory, loaded there if absent (a device replica cannot be shared as
   * a memfd), or -ENOSPC */
  NWC_TRY(nwcd_res_acquire(r, model, tensor, NWCD_ACQ_AT(NWCD_LOC_CPU), &ref, NULL));
  nwcd_entry *e = ref.e; /* its fd stays while refs > 0 */
  int keep = -1, rc = 0;
  pthread_mutex_lock(&r->lock);
  reap_maps(r);
  if (!r->d->backend->host_share)
    rc = nwc__fail(-ENOTSUP, "the %s backend's resident copies cannot be shared; use the "
                   "compute requests", r->d->backend->name);
  else if (e->fd < 0 && (e->fd = r->d->backend->host_share(e->buf, e->len)) < 0)
    rc = e->fd, e->fd = -1; /* sealed at its first share */
  else if (r->nmaps == MAX_MAPS)
    rc = nwc__fail(-EMFILE, "%d mappings are open (the daemon's limit); unmap some first",
                   MAX_MAPS);
  else if ((keep = fcntl(sock, F_DUPFD_CLOEXEC, 3)) < 0)
    rc = nwc__fail(-errno, "dup of the map socket: %s", strerror(errno));
  pthread_mutex_unlock(&r->lock);
  if (rc == 0) rc = nwc_proto_map_send(sock, e->fd, token);
  if (rc == 0) {
    pthread_mutex_lock(&r->lock);
    if (r->nmaps == MAX_MAPS) {
      rc = nwc__fail(-EMFILE, "%d mappings are open (the daemon's limit)", MAX_MAPS);
    } else {
      r->maps[r->nmaps++] = (nwcd_mapref){e, NULL, 1, keep, pid};
      e->maps++;
      const nwc_tensor_info *ti = e->info;
      *out = (nwc_proto_map){
          .size = (ti->length + 4095) & ~UINT64_C(4095), .length = ti->length,
          .format_version = ti->format_version, .elem = ti->elem, .container = ti->container,
          .rows = ti->rows, .cols = ti->cols, .nblocks = ti->nblocks,
          .data_bytes = ti->data_bytes, .raw_plane_bytes = ti->raw_plane_bytes,
          .off_bases = ti->off_bases, .off_hdr = ti->off_hdr, .off_data = ti->off_data,
          .off_raw = ti->off_raw, .off_scale = ti->off_scale, .maps = e->maps,
          .locked = e->locked};
      memcpy(out->psym, ti->psym, 16);
      keep = -1;
    }
    pthread_mutex_unlock(&r->lock);
  }
  if (keep >= 0) close(keep);
  nwcd_res_release(r, &ref);
  if (rc == 0)
    nwcd_log(NWCD_LOG_INFO, "pid %d mapped %s/%s (%u mapping(s))", (int)pid, model, tensor,
             out->maps);
  return rc;
}

/* The record of ref's device copy for map_gpu, its arrays as offsets into the allocation. */
static int gmap_record(const nwcd_backend *b, const nwcd_ref *ref, const char *name,
                       nwc_proto_gmap *g) {
  uint64_t blob = 0;
  memset(g, 0, sizeof *g);
  NWC_TRY(b->dev_export(ref->dcopy, g->export_data, &g->bytes, &blob));
  const nwc_tensor_info *ti = ref->ti;
  snprintf(g->name, sizeof g->name, "%s", name);
  g->elem = ti->elem, g->rows = ti->rows, g->cols = ti->cols, g->nblocks = ti->nblocks;
  memcpy(g->psym, ti->psym, 16);
  g->off_tab = 0, g->off_bases = blob + ti->off_bases, g->off_hdr = blob + ti->off_hdr;
  g->off_data = blob + ti->off_data, g->off_raw = blob + ti->off_raw;
  g->off_scale = ti->off_scale ? blob + ti->off_scale : 0;
  return 0;
}

/* Acquires names[0..n) of model on dev into refs (all or none: on failure the ones acquired are
 * released) and fills their records. */
static int gmap_acquire(nwcd_res *r, const char *model, const char *const *names, size_t n,
                        int dev, nwcd_ref *refs, nwc_proto_gmap *out) {
  size_t got = 0;
  int rc = 0;
  while (rc == 0 && got < n) {
    rc = nwcd_res_acquire(r, model, names[got], NWCD_ACQ_AT(dev), &refs[got], NULL);
    if (rc < 0) break;
    got++;
    rc = gmap_record(r->d->backend, &refs[got - 1], names[got - 1], &out[got - 1]);
  }
  if (rc < 0)
    for (size_t i = 0; i < got; i++) nwcd_res_release(r, &refs[i]);
  return rc;
}

int nwcd_res_map_gpu(nwcd_res *r, const char *model, const char *const *names, size_t n, int dev,
                     int sock, uint64_t token, nwc_proto_gmap_head *head, nwc_proto_gmap *out) {
  const nwcd_backend *b = r->d->backend;
  pid_t pid = 0;
  NWC_TRY(check_map_socket(sock, &pid));
  NWC_RETURN_IF(!b->dev_share_pool || !b->ndevices, -ENOTSUP,
                "the %s backend has no device copies to map (map_gpu needs --backend cuda)",
                b->name);
  if (dev >= b->ndevices) return nwcd_no_device(b, dev);
  NWC_RETURN_IF(n == 0, -ENOENT, "model '%s' has no tensors to map", model);
  int pool_fd = -1;
  uint64_t pool_id = 0;
  uint8_t uuid[16];
  NWC_TRY(b->dev_share_pool(dev, &pool_fd, &pool_id, uuid));
  nwcd_ref *refs = calloc(n, sizeof *refs);
  nwcd_entry **es = n > 1 ? calloc(n, sizeof *es) : NULL;
  if (!refs || (n > 1 && !es)) {
    free(refs), free(es);
    return nwc__fail(-ENOMEM, "no memory for a map of %zu tensors", n);
  }
  int rc = gmap_acquire(r, model, names, n, dev, refs, out);
  if (rc < 0) {
    free(refs), free(es);
    return rc;
  }
  int keep = -1;
  pthread_mutex_lock(&r->lock);
  reap_maps(r);
  if (r->nmaps == MAX_MAPS)
    rc = nwc__fail(-EMFILE, "%d mappings are open (the daemon's limit); unmap some first",
                   MAX_MAPS);
  else if ((keep = fcntl(sock, F_DUPFD_CLOEXEC, 3)) < 0)
    rc = nwc__fail(-errno, "dup of the map socket: %s", strerror(errno));
  pthread_mutex_unlock(&r->lock);
  if (rc == 0) rc = nwc_proto_map_send(sock, pool_fd, token);
  if (rc == 0) {
    pthread_mutex_lock(&r->lock);
    if (r->nmaps == MAX_MAPS) {
      rc = nwc__fail(-EMFILE, "%d mappings are open (the daemon's limit)", MAX_MAPS);
    } else {
      nwcd_mapref *m = &r->maps[r->nmaps++];
      *m = (nwcd_mapref){refs[0].e, es, (unsigned)n, keep, pid};
      for (size_t i = 0; i < n; i++) {
        if (es) es[i] = refs[i].e;
        refs[i].e->maps++;
      }
      for (size_t i = 0; i < n; i++) out[i].maps = refs[i].e->maps;
      keep = -1, es = NULL;
    }
    pthread_mutex_unlock(&r->lock);
  }
  if (keep >= 0) close(keep);
  free(es);
  for (size_t i = 0; i < n; i++) nwcd_res_release(r, &refs[i]);
  free(refs);
  *head = (nwc_proto_gmap_head){pool_id, dev, {0}, (uint32_t)n};
  memcpy(head->uuid, uuid, 16);
  if (rc == 0)
    nwcd_log(NWCD_LOG_INFO, "pid %d mapped %s%s%s on cuda:%d (%zu tensor(s))", (int)pid, model,
             n == 1 ? "/" : "", n == 1 ? names[0] : "", dev, n);
  return rc;
}
