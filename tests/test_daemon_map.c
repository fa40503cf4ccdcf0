/*
 * test_daemon_map.c - resident tensors shared read-only with client processes (map,
 * nwc_client_map) on a real nwcd:
 *   - two forked client processes map the same tensor and get the daemon's own pages: the same
 *     memfd inode in both (fstat) and in the daemon's /proc/PID/smaps, and after reading every
 *     page neither holds a private or anonymous page of the mapping (smaps);
 *   - local dequant and gather (BF16 and fp32) are bit for bit the original bytes of the sample
 *     model, local matvec (1, 3 and 11 columns, scale) within 1e-5 of an fp64 reference, for
 *     layouts 0 and 2, with a bias exactly y + bias, and BF16 output the rounding of fp32; on
 *     fp8 with per-row scales, local dequant and matvec equal the daemon's own;
 *   - the memfd carries F_SEAL_WRITE and refuses every write: write(), pwrite(), a writable
 *     shared mmap, mprotect to PROT_WRITE of the mapping, truncation, growth, hole punching, new
 *     seals;
 *   - evict and remove of a mapped tensor are refused naming the mapping pids, a model-wide
 *     evict skips it, ps (library and `nwcctl ps --json`) shows the references; after one client
 *     unmaps and the other is killed with SIGKILL the evict succeeds;
 *   - a mapping outlives the client connection and even the daemon (SIGTERM): its data stays
 *     right; a tensor that cannot fit the budget is ENOSPC;
 *   - nwc_client_dequant into a buffer larger than the connection's shared region decodes from
 *     a host map of its own, bit for bit, and unmaps it; NWC_CLIENT_SHM_BYTES below 1 MiB is
 *     refused naming it.
 * Malformed map requests are in test_daemon_badinput.
 */
#include "test_daemon_util.h"

#include "nwc_client.h"

#include <jansson.h>
#include <sys/mman.h>

/* What a client process reports to the parent after mapping and checking. */
typedef struct report {
  int failures;
  uint64_t ino, size;
  uint64_t rss_kb, private_kb, anon_kb; /* smaps of the mapping after reading every page */
} report;

/* The smaps entry of the VMA starting at start (or, start == 0, the first whose inode is ino
 * and whose path names a memfd): 1 and *v, or 0. */
typedef struct vma {
  uint64_t start, end, ino, rss_kb, private_kb, anon_kb;
} vma;

static int smaps_find(pid_t pid, uint64_t start, uint64_t ino, vma *v) {
  char path[64], line[512];
  snprintf(path, sizeof path, "/proc/%d/smaps", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int in = 0, found = 0;
  while (fgets(line, sizeof line, f)) {
    uint64_t a, b, off, inode;
    unsigned maj, mnr;
    char perms[8], name[256] = "";
    if (sscanf(line, "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64 " %x:%x %" SCNu64 " %255[^\n]", &a, &b,
               perms, &off, &maj, &mnr, &inode, name) >= 7) {
      if (in) break; /* the entry we wanted is complete */
      in = start ? a == start : inode == ino && strstr(name, "memfd:");
      if (in) *v = (vma){a, b, inode, 0, 0, 0}, found = 1;
      continue;
    }
    uint64_t kb;
    if (!in) continue;
    if (sscanf(line, "Rss: %" SCNu64, &kb) == 1) v->rss_kb = kb;
    if (sscanf(line, "Private_Clean: %" SCNu64, &kb) == 1) v->private_kb += kb;
    if (sscanf(line, "Private_Dirty: %" SCNu64, &kb) == 1) v->private_kb += kb;
    if (sscanf(line, "Anonymous: %" SCNu64, &kb) == 1) v->anon_kb = kb;
  }
  fclose(f);
  return found;
}

/* Every local call on m against the original weights of t. */
static void check_local(const nwc_client_mapping *m, const td_tensor *t, const char *what) {
  const nwc_client_map_info *in = nwc_client_mapping_info(m);
  CHECK(in->rows == t->rows && in->cols == t->cols, "%s: shape %llu x %llu", what,
        (unsigned long long)in->rows, (unsigned long long)in->cols);
  uint64_t M = t->rows, K = t->cols, n = M * K;
  uint16_t *b = malloc(n * 2);
  float *f = malloc(n * 4);
  CHECK_RC(nwc_client_map_dequant(m, NWC_CLIENT_BF16, b, n * 2));
  CHECK(!memcmp(b, t->w, n * 2), "%s: local BF16 dequant differs from the original bytes", what);
  CHECK_RC(nwc_client_map_dequant(m, 0, f, n * 4));
  size_t bad = 0;
  for (uint64_t i = 0; i < n; i++) bad += f[i] != nwc_bf16_to_f32(td_w(t, i));
  CHECK(bad == 0, "%s: %zu fp32 dequant values differ", what, bad);
  CHECK(nwc_client_map_dequant(m, 0, f, n * 4 - 1) == -ENOSPC, "%s: small buffer accepted", what);
  uint64_t rows[7];
  for (int i = 0; i < 7; i++) rows[i] = i == 6 ? M - 1 : test_below(M);
  CHECK_RC(nwc_client_map_gather(m, rows, 7, NWC_CLIENT_BF16, b, n * 2));
  for (int i = 0; i < 7; i++)
    CHECK(!memcmp(b + i * K, (const uint8_t *)t->w + rows[i] * K * 2, K * 2), "%s: gather row %llu",
          what, (unsigned long long)rows[i]);
  CHECK_RC(nwc_client_map_gather(m, rows, 7, 0, f, n * 4));
  for (int i = 0; i < 7; i++)
    for (uint64_t k = 0; k < K; k++)
      if (f[i * K + k] != nwc_bf16_to_f32(td_w(t, rows[i] * K + k))) {
        CHECK(0, "%s: fp32 gather row %llu col %llu", what, (unsigned long long)rows[i],
              (unsigned long long)k);
        break;
      }
  rows[0] = M;
  CHECK(nwc_client_map_gather(m, rows, 1, 0, f, n * 4) == -EINVAL &&
            strstr(nwc_client_last_error(), "out of range"),
        "%s: row out of range: %s", what, nwc_client_last_error());
  static const unsigned cols[] = {1, 3, 11};
  for (int ci = 0; ci < 3; ci++) {
    unsigned nc = cols[ci];
    float *x = malloc(nc * K * 4), *y = malloc(nc * M * 4), *yb = malloc(nc * M * 4);
    float *bias = malloc(M * 4);
    uint16_t *y16 = malloc(nc * M * 2);
    for (uint64_t i = 0; i < nc * K; i++) x[i] = (float)(2 * test_uniform() - 1);
    for (uint64_t i = 0; i < M; i++) bias[i] = (float)(test_uniform() - 0.5);
    float scale = (float)(0.25 + test_uniform());
    CHECK_RC(nwc_client_map_matvec(m, NULL, scale, x, nc, 0, y, nc * M * 4));
    for (unsigned col = 0; col < nc; col++) {
      double err = td_matvec_err(t, x + col * K, scale, NULL, y + col * M);
      CHECK(err <= 1e-5, "%s: local matvec, column %u of %u: relative error %.3g", what, col, nc, err);
    }
    /* The bias is added after the scale: exactly y + bias in float. */
    CHECK_RC(nwc_client_map_matvec(m, bias, scale, x, nc, 0, yb, nc * M * 4));
    bad = 0;
    for (uint64_t i = 0; i < nc * M; i++) bad += yb[i] != y[i] + bias[i % M];
    CHECK(bad == 0, "%s: %zu matvec outputs with bias are not y + bias", what, bad);
    CHECK_RC(nwc_client_map_matvec(m, bias, scale, x, nc, NWC_CLIENT_BF16, y16, nc * M * 2));
    bad = 0;
    for (uint64_t i = 0; i < nc * M; i++) bad += y16[i] != nwc_f32_to_bf16(yb[i]);
    CHECK(bad == 0, "%s: %zu BF16 matvec outputs are not the rounded fp32 ones", what, bad);
    free(x), free(y), free(yb), free(bias), free(y16);
  }
  free(b), free(f);
}

/* A client process: maps model/t, checks it, reads every page, reports, then waits for the
 * parent: 'u' unmaps (and acknowledges), 'q' exits; it may also be killed. */
static int client_process(const td_tensor *t, int in, int out) {
  report rep = {0};
  nwc_client *c = NULL;
  nwc_client_mapping *m = NULL;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  int rc = c ? nwc_client_map(c, "use", t->name, &m) : -1;
  CHECK(rc == 0, "child map: %d %s", rc, nwc_client_last_error());
  nwc_client_free(c); /* the mapping does not need the connection */
  if (m) {
    check_local(m, t, "child");
    const nwc_client_map_info *mi = nwc_client_mapping_info(m);
    volatile const uint8_t *p = mi->base;
    unsigned sum = 0;
    for (uint64_t o = 0; o < mi->size; o += 4096) sum += p[o];
    (void)sum;
    struct stat st;
    CHECK(fstat(mi->fd, &st) == 0, "fstat of the memfd");
    vma v = {0};
    CHECK(smaps_find(getpid(), (uint64_t)(uintptr_t)mi->base, 0, &v), "own smaps entry");
    rep.ino = st.st_ino, rep.size = mi->size;
    rep.rss_kb = v.rss_kb, rep.private_kb = v.private_kb, rep.anon_kb = v.anon_kb;
    CHECK(v.ino == st.st_ino, "smaps inode %llu, fstat %llu", (unsigned long long)v.ino,
          (unsigned long long)st.st_ino);
  }
  rep.failures = test_failures;
  if (write(out, &rep, sizeof rep) != sizeof rep) return 1;
  char cmd;
  while (read(in, &cmd, 1) == 1) {
    if (cmd == 'q') break;
    nwc_client_unmap(m), m = NULL;
    if (write(out, "u", 1) != 1) return 1;
  }
  return test_failures ? 1 : 0;
}

typedef struct child {
  pid_t pid;
  int in, out; /* parent's ends: read reports, write commands */
  report rep;
} child;

static void start_child(child *ch, const td_tensor *t) {
  int up[2], down[2];
  CHECK(pipe(up) == 0 && pipe(down) == 0, "pipes");
  fflush(NULL);
  ch->pid = fork();
  if (ch->pid == 0) {
    close(up[0]), close(down[1]);
    _exit(client_process(t, down[0], up[1]));
  }
  close(up[1]), close(down[0]);
  ch->out = up[0], ch->in = down[1];
  CHECK(read(ch->out, &ch->rep, sizeof ch->rep) == sizeof ch->rep, "child %d report", (int)ch->pid);
}

/* The maps of model/tensor in ps (-1 if it is not resident). */
static int ps_maps(nwc_client *c, const char *tensor) {
  nwc_client_resident *ps;
  size_t n;
  if (nwc_client_ps(c, &ps, &n) < 0) return -2;
  int maps = -1;
  for (size_t i = 0; i < n; i++)
    if (!strcmp(ps[i].model, "use") && !strcmp(ps[i].tensor, tensor)) maps = (int)ps[i].maps;
  free(ps);
  return maps;
}

/* The "maps" of tensor in `nwcctl ps --json`, -1 if absent. */
static int nwcctl_ps_maps(const char *tensor) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "%s --socket '%s' ps --json", NWCCTL_PATH, td_sock);
  FILE *p = popen(cmd, "r");
  if (!p) return -2;
  json_error_t err;
  json_t *j = json_loadf(p, 0, &err);
  pclose(p);
  int maps = -1;
  size_t i;
  json_t *e;
  json_array_foreach(j, i, e) {
    if (!strcmp(json_string_value(json_object_get(e, "tensor")), tensor))
      maps = (int)json_integer_value(json_object_get(e, "maps"));
  }
  json_decref(j);
  return maps;
}

static void check_seals(const nwc_client_mapping *m) {
  const nwc_client_map_info *in = nwc_client_mapping_info(m);
  int fd = in->fd;
  int seals = fcntl(fd, F_GET_SEALS);
  CHECK(seals >= 0 && (seals & F_SEAL_SHRINK) && (seals & F_SEAL_GROW) && (seals & F_SEAL_SEAL) &&
            (seals & F_SEAL_WRITE),
        "seals 0x%x (want F_SEAL_WRITE: nwcd never maps its copies writable)", seals);
  uint8_t byte = 1;
  errno = 0;
  CHECK(write(fd, &byte, 1) < 0 && errno == EPERM, "write() to the memfd: errno %d", errno);
  errno = 0;
  CHECK(pwrite(fd, &byte, 1, 4096) < 0 && errno == EPERM, "pwrite() to the memfd: errno %d", errno);
  void *w = mmap(NULL, in->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  CHECK(w == MAP_FAILED && errno == EPERM, "writable shared mmap: %p errno %d", w, errno);
  if (w != MAP_FAILED) munmap(w, in->size);
  CHECK(mprotect((void *)in->base, 4096, PROT_READ | PROT_WRITE) < 0,
        "mprotect of the mapping to PROT_WRITE succeeded");
  CHECK(ftruncate(fd, 4096) < 0 && errno == EPERM, "shrinking the memfd: errno %d", errno);
  CHECK(ftruncate(fd, (off_t)in->size * 2) < 0 && errno == EPERM, "growing the memfd: errno %d", errno);
  CHECK(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) < 0 && errno == EPERM,
        "punching a hole: errno %d", errno);
  CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) < 0 && errno == EPERM, "a new seal: errno %d", errno);
}

/* fp8 with per-row scales (the blob's scale section): local calls equal the daemon's. */
static void check_fp8(nwc_client *c, const td_tensor *t) {
  nwc_client_mapping *m = NULL;
  CHECK_RC(nwc_client_map(c, "use8", t->name, &m));
  if (!m) return;
  CHECK(NWC_ELEM_TYPE(nwc_client_mapping_info(m)->elem) == NWC_ELEM_FP8, "use8 is not fp8");
  uint64_t M = t->rows, K = t->cols;
  uint16_t *a = malloc(M * K * 2), *b = malloc(M * K * 2);
  CHECK_RC(nwc_client_map_dequant(m, NWC_CLIENT_BF16, a, M * K * 2));
  CHECK_RC(nwc_client_dequant(c, "use8", t->name, NWC_CLIENT_BF16, b, M * K * 2, NULL, NULL, NULL));
  CHECK(!memcmp(a, b, M * K * 2), "fp8: local dequant differs from the daemon's");
  float *x = malloc(K * 4), *y = malloc(M * 4), *yd = malloc(M * 4);
  for (uint64_t k = 0; k < K; k++) x[k] = (float)(2 * test_uniform() - 1);
  CHECK_RC(nwc_client_map_matvec(m, NULL, 1.0f, x, 1, 0, y, M * 4));
  CHECK_RC(nwc_client_matvec(c, "use8", t->name, NULL, 1.0f, x, K, 1, 0, yd, M * 4, NULL));
  double num = 0, den = 0;
  for (uint64_t i = 0; i < M; i++) num += (y[i] - yd[i]) * (y[i] - yd[i]), den += yd[i] * yd[i];
  CHECK(den > 0 && sqrt(num / den) <= 1e-5, "fp8: local matvec against the daemon's: %.3g",
        sqrt(num / (den > 0 ? den : 1)));
  free(a), free(b), free(x), free(y), free(yd);
  nwc_client_unmap(m);
}

/* A connection whose shared region is 4 MiB (NWC_CLIENT_SHM_BYTES; it does not grow): t's BF16
 * dequant fits in it, its fp32 dequant does not and is decoded from a host map by the library,
 * bit for bit, leaving no mapping behind (through the socket it would overrun the region). */
static void check_past_region(const td_tensor *t) {
  const uint64_t n = t->rows * t->cols;
  CHECK(n * 2 > (1u << 20) && n * 2 <= (4u << 20) && n * 4 > (4u << 20), "%s: %llu weights",
        t->name, (unsigned long long)n);
  setenv("NWC_CLIENT_SHM_BYTES", "4194304", 1);
  nwc_client *c = NULL;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  uint16_t *w = malloc(n * 2);
  float *f = malloc(n * 4);
  uint64_t rows = 0, cols = 0;
  CHECK_RC(nwc_client_dequant(c, "use", t->name, NWC_CLIENT_BF16, w, n * 2, NULL, NULL, NULL));
  CHECK(!memcmp(w, t->w, n * 2), "BF16 dequant through the region");
  CHECK_RC(nwc_client_dequant(c, "use", t->name, 0, f, n * 4, &rows, &cols, NULL));
  size_t bad = 0;
  for (uint64_t i = 0; i < n; i++) bad += f[i] != nwc_bf16_to_f32(td_w(t, i));
  CHECK(rows == t->rows && cols == t->cols && bad == 0, "fp32 dequant past the region: %llu x %llu, "
        "%zu values differ", (unsigned long long)rows, (unsigned long long)cols, bad);
  CHECK(ps_maps(c, t->name) == 0, "a mapping left behind: %d", ps_maps(c, t->name));
  nwc_client_free(c);
  /* A size below the 1 MiB that goes inline is refused when the region would be made. */
  setenv("NWC_CLIENT_SHM_BYTES", "4096", 1);
  CHECK_RC(nwc_client_connect(td_sock, &c));
  int rc = c ? nwc_client_dequant(c, "use", t->name, NWC_CLIENT_BF16, w, n * 2, NULL, NULL, NULL) : -1;
  CHECK(rc == -EINVAL && strstr(nwc_client_last_error(), "NWC_CLIENT_SHM_BYTES=4096"),
        "a 4096-byte region: %d %s", rc, nwc_client_last_error());
  nwc_client_free(c);
  unsetenv("NWC_CLIENT_SHM_BYTES");
  free(w), free(f);
}

int main(void) {
  int rc;
  pid_t d = td_begin("test_daemon_map", "nwc-map", NULL, &rc);
  if (!d) return rc;
  nwc_client *c = NULL;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  nwc_client_result res;
  CHECK_RC(nwc_client_import(c, "use", getenv("NWC_SAMPLE"), NULL, &res));
  nwc_client_import_opts l2 = {0, 2, NULL, NULL}, f8 = {1, 0, NULL, NULL};
  CHECK_RC(nwc_client_import(c, "use2", getenv("NWC_SAMPLE"), &l2, &res));
  CHECK_RC(nwc_client_import(c, "use8", getenv("NWC_SAMPLE"), &f8, &res));
  const td_tensor *T = &td_t[0];
  for (size_t i = 1; i < td_nt; i++)
    if (td_t[i].rows * td_t[i].cols > T->rows * T->cols) T = &td_t[i];
  printf("mapping %s (%llu x %llu)\n", T->name, (unsigned long long)T->rows,
         (unsigned long long)T->cols);

  /* Two client processes map it: one copy of the pages. */
  child a, b;
  start_child(&a, T);
  start_child(&b, T);
  CHECK(a.rep.failures == 0 && b.rep.failures == 0, "client processes reported failures");
  printf("clients: inode %llu and %llu, %llu bytes; rss %llu kB, private %llu kB, anonymous %llu kB\n",
         (unsigned long long)a.rep.ino, (unsigned long long)b.rep.ino,
         (unsigned long long)a.rep.size, (unsigned long long)a.rep.rss_kb,
         (unsigned long long)a.rep.private_kb, (unsigned long long)a.rep.anon_kb);
  CHECK(a.rep.ino && a.rep.ino == b.rep.ino, "the clients map different files");
  for (child *ch = &a; ch; ch = ch == &a ? &b : NULL)
    CHECK(ch->rep.rss_kb * 1024 == ch->rep.size && ch->rep.private_kb == 0 && ch->rep.anon_kb == 0,
          "client %d holds private pages: rss %llu kB of %llu, private %llu, anonymous %llu",
          (int)ch->pid, (unsigned long long)ch->rep.rss_kb, (unsigned long long)ch->rep.size / 1024,
          (unsigned long long)ch->rep.private_kb, (unsigned long long)ch->rep.anon_kb);
  vma dv = {0};
  CHECK(smaps_find(d, 0, a.rep.ino, &dv) && dv.end - dv.start == a.rep.size,
        "the daemon has no mapping of the clients' memfd (inode %llu)", (unsigned long long)a.rep.ino);

  /* The references: ps, evict and remove refused. */
  CHECK(ps_maps(c, T->name) == 2, "ps: %d mappings", ps_maps(c, T->name));
  CHECK(nwcctl_ps_maps(T->name) == 2, "nwcctl ps --json: %d mappings", nwcctl_ps_maps(T->name));
  rc = nwc_client_evict(c, "use", T->name, &res);
  char pid_a[32];
  snprintf(pid_a, sizeof pid_a, "%d", (int)a.pid);
  CHECK(rc == -EBUSY && strstr(nwc_client_last_error(), "mapped by 2") &&
            strstr(nwc_client_last_error(), pid_a),
        "evict of a mapped tensor: %d %s", rc, nwc_client_last_error());
  printf("evict while mapped: %s\n", nwc_client_last_error());
  CHECK_RC(nwc_client_evict(c, "use", NULL, &res));
  CHECK(res.skipped == 1 && ps_maps(c, T->name) == 2, "model evict: %llu skipped",
        (unsigned long long)res.skipped);
  rc = nwc_client_remove(c, "use");
  CHECK(rc == -EBUSY && strstr(nwc_client_last_error(), "mapped"), "remove of a mapped model: %d %s",
        rc, nwc_client_last_error());

  /* One unmaps, the other dies: then the tensor can go. */
  char ack = 0;
  CHECK(write(a.in, "u", 1) == 1 && read(a.out, &ack, 1) == 1 && ack == 'u', "child unmap");
  CHECK(ps_maps(c, T->name) == 1, "ps after one unmap: %d", ps_maps(c, T->name));
  rc = nwc_client_evict(c, "use", T->name, &res);
  CHECK(rc == -EBUSY && strstr(nwc_client_last_error(), "mapped by 1"), "evict with one mapping: %d %s",
        rc, nwc_client_last_error());
  kill(b.pid, SIGKILL);
  waitpid(b.pid, NULL, 0);
  rc = nwc_client_evict(c, "use", T->name, &res);
  CHECK(rc == 0 && res.tensors == 1, "evict after unmap and SIGKILL: %d %s", rc,
        nwc_client_last_error());
  CHECK(ps_maps(c, T->name) == -1, "still resident after evict");
  CHECK(write(a.in, "q", 1) == 1 && td_wait_exit(a.pid, 500) == 0, "child exit");
  close(a.in), close(a.out), close(b.in), close(b.out);

  /* In this process: layout 2, the seals, and a mapping that outlives the daemon. */
  nwc_client_mapping *m = NULL;
  CHECK_RC(nwc_client_map(c, "use2", T->name, &m));
  if (m) check_local(m, T, "layout 2"), nwc_client_unmap(m), m = NULL;
  check_fp8(c, T);
  check_past_region(T);
  CHECK_RC(nwc_client_map(c, "use", T->name, &m));
  if (m) check_seals(m);
  nwc_client_free(c);
  CHECK(td_stop_daemon(d) == 0, "SIGTERM with a mapping held: not exit 0");
  if (m) {
    uint64_t n = T->rows * T->cols;
    uint16_t *w = malloc(n * 2);
    CHECK_RC(nwc_client_map_dequant(m, NWC_CLIENT_BF16, w, n * 2));
    CHECK(!memcmp(w, T->w, n * 2), "the mapping changed after the daemon exited");
    free(w);
    nwc_client_unmap(m), m = NULL;
  }

  /* What cannot fit the budget cannot be mapped. */
  const char *small[] = {"--budget", "1M", NULL};
  d = td_start_daemon(small);
  CHECK(d > 0, "restart with a 1 MiB budget");
  CHECK_RC(nwc_client_connect(td_sock, &c));
  rc = c ? nwc_client_map(c, "use", T->name, &m) : -1;
  CHECK(rc == -ENOSPC && !m, "map beyond the budget: %d %s", rc, nwc_client_last_error());
  nwc_client_free(c);
  if (d > 0) CHECK(td_stop_daemon(d) == 0, "SIGTERM exit");
  if (test_failures) td_show_log();
  td_cleanup();
  return test_exit("test_daemon_map");
}
