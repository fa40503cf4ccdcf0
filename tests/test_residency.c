/*
 * test_residency.c - nwcd's residency (daemon/residency.c) in-process, on the cpu backend and a
 * real store of random BF16 tensors of random sizes (fresh seed): budgets, LRU order, pins and
 * references that block eviction.
 *
 * First fixed cases: a tensor larger than the budget is -ENOSPC, or a mapped reference with
 * NWCD_ACQ_MAP_OK; loads that do not fit evict the least recently used tensors, where an acquire
 * or a release counts as a use; a pinned tensor and one a request holds are never evicted (an
 * explicit evict is -EBUSY) until unpinned or released; a smaller budget evicts down to it and
 * reports what pinned and referenced tensors keep over it.
 *
 * Then a random walk of acquires (with a reference, load only, pin, map fallback), releases,
 * evicts, unpins and budget changes against a model of the rules (residency.c's invariants):
 * after each step the resident set, the bytes resident and pinned and the count of evictions
 * must be the model's, and right after a load the bytes resident are within the budget.
 */
#include "log.h"
#include "nwcd.h"
#include "residency.h"
#include "test_store_util.h"

#include <pthread.h>

#define NT 7        /* tensors in the store */
#define MAXREFS 16  /* references the walk holds at once */

static char dir[512];
static nwc_tensor_info *ti;
static size_t nti;

/* The model of one tensor's residency. */
typedef struct mt {
  bool resident, pinned;
  unsigned refs;
  uint64_t used; /* the step of its last use (acquire or release) */
} mt;

static mt m[NT];
static uint64_t m_budget, m_evictions, step;

static uint16_t rand_bf16(void) {
  unsigned e = 118 + (unsigned)test_below(6);
  return (uint16_t)((test_below(2) << 15) | (e << 7) | test_below(128));
}

static void make_store(nwc_store **store) {
  make_tmpdir(dir, sizeof dir, "residency");
  st_spec sp[NT];
  char names[NT][16];
  uint16_t *w[NT];
  for (int i = 0; i < NT; i++) {
    uint64_t rows = 8 + test_below(600), cols = 512 * (1 + test_below(3)), n = rows * cols;
    w[i] = malloc(n * 2);
    for (uint64_t k = 0; k < n; k++) w[i][k] = rand_bf16();
    snprintf(names[i], sizeof names[i], "t%d.weight", i);
    sp[i] = (st_spec){names[i], "BF16", 2, {rows, cols}, w[i], n * 2};
  }
  char st[600], sd[600];
  snprintf(st, sizeof st, "%s/m.safetensors", dir);
  snprintf(sd, sizeof sd, "%s/store", dir);
  CHECK_RC(st_write(st, sp, NT));
  for (int i = 0; i < NT; i++) free(w[i]);
  CHECK_RC(nwc_store_open(sd, NWC_STORE_CREATE, store));
  CHECK_RC(nwc_store_import(*store, "m", st, NULL));
  CHECK_RC(nwc_store_tensors(*store, "m", &ti, &nti));
  CHECK(nti == NT, "%zu tensors", nti);
}

/* The bytes a host copy of tensor i is charged: its blob's length in whole pages (residency.c;
 * a packed blob's length is a multiple of 64 only). */
static uint64_t len_of(int i) { return (ti[i].length + 4095) & ~(uint64_t)4095; }

/* ---- the model ------------------------------------------------------------------------------ */

static uint64_t m_used(void) {
  uint64_t u = 0;
  for (int i = 0; i < NT; i++) u += m[i].resident ? len_of(i) : 0;
  return u;
}

static uint64_t m_pinned(void) {
  uint64_t u = 0;
  for (int i = 0; i < NT; i++) u += m[i].pinned ? len_of(i) : 0;
  return u;
}

/* Evicts the least recently used tensor nothing holds or pins: false if none. */
static bool m_evict_lru(void) {
  int v = -1;
  for (int i = 0; i < NT; i++)
    if (m[i].resident && !m[i].refs && !m[i].pinned && (v < 0 || m[i].used < m[v].used)) v = i;
  if (v < 0) return false;
  m[v].resident = false;
  m_evictions++;
  return true;
}

/* make_room: evicts LRU tensors until need more bytes fit; false if they cannot. */
static bool m_make_room(uint64_t need) {
  if (need > m_budget) return false;
  bool fits = true;
  while (fits && m_used() + need > m_budget) fits = m_evict_lru();
  return fits;
}

/* What nwcd_res_acquire must return for tensor i with flags, the model updated. */
static int m_acquire(int i, unsigned flags, bool *mapped) {
  *mapped = false;
  if (!m[i].resident) {
    if (!m_make_room(len_of(i))) {
      if (!(flags & NWCD_ACQ_MAP_OK) || (flags & (NWCD_ACQ_PIN | NWCD_ACQ_NOREF))) return -ENOSPC;
      *mapped = true;
      return 0;
    }
    m[i].resident = true;
  }
  m[i].used = ++step;
  if (flags & NWCD_ACQ_PIN) m[i].pinned = true;
  if (!(flags & (NWCD_ACQ_PIN | NWCD_ACQ_NOREF))) m[i].refs++;
  return 0;
}

/* ---- checks --------------------------------------------------------------------------------- */

/* The daemon's residency is the model's. */
static void check_state(nwcd_res *r, const char *when) {
  for (int i = 0; i < NT; i++) {
    int loc = 7;
    uint64_t b = nwcd_res_resident_bytes(r, "m", ti[i].name, &loc);
    CHECK(b == (m[i].resident ? len_of(i) : 0), "%s: %s resident bytes %llu, model %s", when,
          ti[i].name, (unsigned long long)b, m[i].resident ? "resident" : "absent");
    CHECK(!m[i].resident || loc == NWCD_LOC_CPU, "%s: %s at %d", when, ti[i].name, loc);
  }
  nwc_proto_stats s;
  memset(&s, 0, sizeof s);
  nwcd_res_stats(r, &s);
  CHECK(s.resident_bytes == m_used(), "%s: %llu bytes resident, model %llu", when,
        (unsigned long long)s.resident_bytes, (unsigned long long)m_used());
  CHECK(s.pinned_bytes == m_pinned(), "%s: %llu bytes pinned, model %llu", when,
        (unsigned long long)s.pinned_bytes, (unsigned long long)m_pinned());
  CHECK(s.evictions == m_evictions, "%s: %llu evictions, model %llu", when,
        (unsigned long long)s.evictions, (unsigned long long)m_evictions);
  CHECK(s.budget == m_budget, "%s: budget %llu", when, (unsigned long long)s.budget);
}

static int acquire(nwcd_res *r, int i, unsigned flags, nwcd_ref *ref) {
  bool mapped;
  int want = m_acquire(i, flags, &mapped);
  int rc = nwcd_res_acquire(r, "m", ti[i].name, flags, ref, NULL);
  CHECK(rc == want, "step %llu: acquire %s (flags %u): %d (%s), model %d",
        (unsigned long long)step, ti[i].name, flags, rc, nwc_error_detail(), want);
  if (rc == 0 && ref->loaded) { /* a load makes room first: within the budget after it */
    nwc_proto_stats s;
    memset(&s, 0, sizeof s);
    nwcd_res_stats(r, &s);
    CHECK(s.resident_bytes <= m_budget, "after loading %s: %llu bytes resident, budget %llu",
          ti[i].name, (unsigned long long)s.resident_bytes, (unsigned long long)m_budget);
  }
  if (rc == 0 && !(flags & (NWCD_ACQ_PIN | NWCD_ACQ_NOREF))) {
    CHECK(mapped ? ref->transient && !ref->e : ref->e && !ref->transient,
          "%s: mapped %d, ref e %p transient %d", ti[i].name, mapped, (void *)ref->e,
          ref->transient);
    CHECK(ref->view.rows == ti[i].rows && ref->view.cols == ti[i].cols, "%s: view %llux%llu",
          ti[i].name, (unsigned long long)ref->view.rows, (unsigned long long)ref->view.cols);
  }
  return rc;
}

static void release(nwcd_res *r, int i, nwcd_ref *ref) {
  if (ref->e) m[i].refs--, m[i].used = ++step;
  nwcd_res_release(r, ref);
}

static void evict(nwcd_res *r, int i) {
  int want = 0;
  uint64_t bytes = 0, want_bytes = 0;
  if (m[i].resident && (m[i].refs || m[i].pinned)) want = -EBUSY;
  else if (m[i].resident) want_bytes = len_of(i), m[i].resident = false, m_evictions++;
  /* every replica, or host memory's: the same here (the cpu backend has one place) */
  int rc = nwcd_res_evict(r, "m", ti[i].name, test_below(2) ? NWCD_LOC_DEFAULT : NWCD_LOC_CPU, &bytes);
  CHECK(rc == want && bytes == want_bytes, "evict %s: %d (%s), %llu bytes; model %d, %llu",
        ti[i].name, rc, nwc_error_detail(), (unsigned long long)bytes, want,
        (unsigned long long)want_bytes);
}

static void set_budget(nwcd_res *r, uint64_t budget) {
  m_budget = budget;
  m_make_room(0);
  uint64_t used = 0;
  nwcd_res_set_budget(r, budget, &used);
  CHECK(used == m_used(), "budget %llu: %llu bytes stay, model %llu", (unsigned long long)budget,
        (unsigned long long)used, (unsigned long long)m_used());
}

/* ---- fixed cases ---------------------------------------------------------------------------- */

static void fixed_cases(nwcd_res *r) {
  /* a, b, c, d the four smallest: the budget holds a, c and d exactly, so a, b and c fit (b is no
   * larger than d) and d fits beside a and c once b is gone. */
  int ord[NT];
  for (int i = 0; i < NT; i++) ord[i] = i;
  for (int i = 0; i < NT; i++)
    for (int k = i + 1; k < NT; k++)
      if (len_of(ord[k]) < len_of(ord[i])) {
        int t = ord[i];
        ord[i] = ord[k], ord[k] = t;
      }
  int a = ord[0], b = ord[1], c = ord[2], d = ord[3], big = ord[NT - 1];
  nwcd_ref ref, held;
  /* Larger than the budget: refused, or mapped when the caller allows it. */
  set_budget(r, len_of(big) - 1);
  CHECK(acquire(r, big, 0, &ref) == -ENOSPC, "a tensor over the budget");
  CHECK(acquire(r, big, NWCD_ACQ_PIN, &ref) == -ENOSPC, "a pin over the budget");
  CHECK(acquire(r, big, NWCD_ACQ_MAP_OK, &ref) == 0 && ref.transient, "transient fallback");
  release(r, big, &ref);
  check_state(r, "over the budget");
  set_budget(r, len_of(a) + len_of(c) + len_of(d));
  /* LRU: a, b, c loaded in that order, then a used: d evicts b (the least recently used). */
  acquire(r, a, NWCD_ACQ_NOREF, &ref);
  acquire(r, b, NWCD_ACQ_NOREF, &ref);
  acquire(r, c, NWCD_ACQ_NOREF, &ref);
  check_state(r, "a, b, c loaded");
  acquire(r, a, 0, &ref);
  release(r, a, &ref);
  acquire(r, d, NWCD_ACQ_NOREF, &ref);
  CHECK(!m[b].resident && m[a].resident && m[c].resident, "model: b evicted, not a or c");
  check_state(r, "LRU: b evicted");
  /* A reference blocks eviction: a held, everything else evicted to load others. */
  acquire(r, a, 0, &held);
  for (int k = 3; k < NT; k++) acquire(r, ord[k], NWCD_ACQ_NOREF, &ref);
  CHECK(m[a].resident, "model: a held");
  check_state(r, "a held while others load");
  evict(r, a); /* -EBUSY */
  check_state(r, "evict of a held tensor");
  /* A pin blocks eviction too, and survives the release of the reference. */
  acquire(r, a, NWCD_ACQ_PIN, &ref);
  release(r, a, &held);
  for (int k = 1; k < NT; k++) acquire(r, ord[k], NWCD_ACQ_NOREF, &ref);
  evict(r, a); /* -EBUSY */
  check_state(r, "a pinned");
  /* A budget below what the pin holds: everything else goes, a stays over the budget. */
  set_budget(r, len_of(a) / 2);
  check_state(r, "budget under the pin");
  CHECK(nwcd_res_unpin(r, "m", ti[a].name) == 1, "unpin");
  m[a].pinned = false;
  set_budget(r, len_of(a) / 2);
  check_state(r, "unpinned under the budget");
  evict(r, a);
  check_state(r, "all evicted");
}

/* ---- the random walk ------------------------------------------------------------------------ */

typedef struct held_ref {
  int i;
  nwcd_ref ref;
} held_ref;

static void walk(nwcd_res *r, unsigned steps) {
  uint64_t total = 0, maxlen = 0;
  for (int i = 0; i < NT; i++) total += len_of(i), maxlen = len_of(i) > maxlen ? len_of(i) : maxlen;
  held_ref refs[MAXREFS];
  unsigned nrefs = 0;
  set_budget(r, maxlen + test_below(total - maxlen + 1));
  for (unsigned s = 0; s < steps; s++) {
    int i = (int)test_below(NT);
    unsigned op = (unsigned)test_below(100);
    char when[64];
    snprintf(when, sizeof when, "walk step %u (op %u on t%d)", s, op, i);
    if (op < 30 && nrefs < MAXREFS) {
      unsigned flags = test_below(3) == 0 ? NWCD_ACQ_MAP_OK : 0;
      if (acquire(r, i, flags, &refs[nrefs].ref) == 0) refs[nrefs++].i = i;
    } else if (op < 50 && nrefs) {
      unsigned k = (unsigned)test_below(nrefs);
      release(r, refs[k].i, &refs[k].ref);
      refs[k] = refs[--nrefs];
    } else if (op < 65) {
      nwcd_ref ref;
      acquire(r, i, NWCD_ACQ_NOREF, &ref);
    } else if (op < 72) {
      nwcd_ref ref;
      acquire(r, i, NWCD_ACQ_PIN, &ref);
    } else if (op < 82) {
      int was = nwcd_res_unpin(r, "m", ti[i].name);
      CHECK(was == m[i].pinned, "%s: unpin %d, model %d", when, was, m[i].pinned);
      m[i].pinned = false;
    } else if (op < 95) {
      evict(r, i);
    } else {
      set_budget(r, test_below(4) == 0 ? test_below(maxlen) : maxlen + test_below(total));
    }
    check_state(r, when);
    if (test_failures) break;
  }
  while (nrefs) --nrefs, release(r, refs[nrefs].i, &refs[nrefs].ref);
  for (int i = 0; i < NT; i++) {
    nwcd_res_unpin(r, "m", ti[i].name);
    m[i].pinned = false;
    evict(r, i);
  }
  check_state(r, "walk: all released, unpinned and evicted");
}

int main(void) {
  test_seed("test_residency");
  nwcd_log_set_level(NWCD_LOG_WARN); /* no line per load and eviction */
  nwcd d;
  memset(&d, 0, sizeof d);
  CHECK_RC(nwcd_backend_get("cpu", &d.backend));
  make_store(&d.store);
  if (test_failures) return test_exit("test_residency");
  pthread_mutex_init(&d.store_lock, NULL);
  nwcd_res *r = NULL;
  CHECK_RC(nwcd_res_create(&d, 1, &r));
  m_budget = 1;
  if (r) {
    fixed_cases(r);
    if (!test_failures) walk(r, 400);
    nwcd_res_free(r);
  }
  nwc_tensor_info_free(ti, nti);
  nwc_store_close(d.store);
  pthread_mutex_destroy(&d.store_lock);
  rm_rf(dir);
  return test_exit("test_residency");
}
