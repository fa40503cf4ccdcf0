/*
 * test_oci.c - nwc_oci (oci/) against real registries: Debian's docker-registry started here on
 * free loopback ports, each with its own storage and config in a temporary folder, killed at the
 * end (and by PR_SET_PDEATHSIG if this program dies first).  No mocks.
 *
 * Checks: reference parsing (table); sha256 vectors; blobs pushed (empty, small, 70 MiB through
 * 8 MiB PATCH chunks) then exists/pull bit-exact; a second push reads nothing; a pull resumed
 * from an offset; a wrong digest refused; an OCI v1.1 artifact manifest put by tag and got by
 * tag and digest; a blob tampered with in the registry's storage gives -EBADMSG with verify; the
 * registry killed mid-pull gives a clean error at once and a resumed pull completes; a stopped
 * registry gives -ETIMEDOUT after the stall timeout; skopeo inspect/copy interoperate; Basic auth
 * (htpasswd) with credentials from a DOCKER_CONFIG, a credential helper, REGISTRY_AUTH_FILE;
 * Bearer token auth (tests/test_oci_token.py, RS256).  Fresh random bytes each run (seed
 * printed).  Exit 77 only when /usr/bin/docker-registry is missing.
 */
#include "nwc_oci.h"

#include "nwc.h"
#include "test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define REGISTRY_BIN "/usr/bin/docker-registry"
#define BIG (70u << 20)
#define CHUNK (8u << 20)

static char tmp[256];

/* ---- processes ----------------------------------------------------------------------------- */

typedef struct reg {
  pid_t pid;
  int port;
  char dir[400];
} reg;

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
           getsockname(fd, (struct sockaddr *)&a, &len) == 0;
  close(fd);
  return ok ? ntohs(a.sin_port) : -1;
}

static int port_open(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
  close(fd);
  return ok;
}

/* Forks argv with stdout to out_fd (or the log file) and stderr to log; dies with us. */
static pid_t spawn(char *const argv[], const char *log, int out_fd) {
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    dup2(out_fd >= 0 ? out_fd : fd, 1);
    dup2(fd, 2);
    execv(argv[0], argv);
    _exit(127);
  }
  return pid;
}

static int write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return -errno;
  fputs(text, f);
  return fclose(f) ? -EIO : 0;
}

/* Starts (or restarts, same port and storage) a registry; auth: extra YAML under "auth:". */
static int reg_start(reg *r, const char *name, const char *auth) {
  if (!r->port) {
    r->port = free_port();
    snprintf(r->dir, sizeof r->dir, "%s/%s", tmp, name);
    mkdir(r->dir, 0700);
  }
  char cfg[600], yaml[2048], log[600];
  snprintf(cfg, sizeof cfg, "%s/config.yml", r->dir);
  snprintf(log, sizeof log, "%s/log", r->dir);
  snprintf(yaml, sizeof yaml,
           "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n"
           "storage:\n  filesystem:\n    rootdirectory: %s/data\n  delete:\n    enabled: true\n"
           "http:\n  addr: 127.0.0.1:%d\n  secret: nwc-test-secret\n%s%s",
           r->dir, r->port, auth ? "auth:\n" : "", auth ? auth : "");
  if (write_file(cfg, yaml)) return -1;
  char *argv[] = {REGISTRY_BIN, "serve", cfg, NULL};
  r->pid = spawn(argv, log, -1);
  for (int i = 0; i < 200; i++) {
    if (port_open(r->port)) return 0;
    usleep(50000);
  }
  fprintf(stderr, "registry %s did not come up (log: %s)\n", name, log);
  return -1;
}

static void reap(pid_t *pid) {
  if (*pid <= 0) return;
  kill(*pid, SIGKILL);
  waitpid(*pid, NULL, 0);
  *pid = 0;
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
  char cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  int rc = system(cmd);
  if (rc) fprintf(stderr, "command failed (%d): %s\n", rc, cmd);
  return rc;
}

/* ---- blobs in memory --------------------------------------------------------------------------- */

typedef struct blob {
  uint8_t *p;
  uint64_t n;
  char digest[73];
  uint64_t read_bytes; /* what the read callback handed out */
} blob;

static void blob_make(blob *b, uint64_t n) {
  b->p = malloc(n ? n : 1);
  b->n = n;
  for (uint64_t i = 0; i < n; i += 8) {
    uint64_t v = test_rand();
    memcpy(b->p + i, &v, n - i < 8 ? n - i : 8);
  }
  nwc_sha256_buf(b->p, n, b->digest);
  b->read_bytes = 0;
}

static ssize_t blob_read(void *ctx, uint64_t off, void *buf, size_t len) {
  blob *b = ctx;
  if (off >= b->n) return 0;
  if (len > b->n - off) len = (size_t)(b->n - off);
  memcpy(buf, b->p + off, len);
  b->read_bytes += len;
  return (ssize_t)len;
}

typedef struct sink {
  uint8_t *p;
  uint64_t n, cap;
  uint64_t kill_after; /* nonzero: signal `victim` once this many bytes arrived */
  pid_t victim;
  int sig;
} sink;

static int sink_write(void *ctx, const void *p, size_t len) {
  sink *s = ctx;
  if (s->n + len > s->cap) {
    uint64_t cap = s->cap ? s->cap : 4096;
    while (cap < s->n + len) cap *= 2;
    uint8_t *np = realloc(s->p, cap);
    if (!np) return -ENOMEM;
    s->p = np, s->cap = cap;
  }
  memcpy(s->p + s->n, p, len);
  s->n += len;
  if (s->kill_after && s->n >= s->kill_after) {
    kill(s->victim, s->sig);
    s->kill_after = 0;
  }
  return 0;
}

static uint64_t progress_last;
static int progress(void *ctx, uint64_t done, uint64_t total) {
  (void)ctx, (void)total;
  progress_last = done;
  return 0;
}

/* Pulls b from offset and checks it bit for bit. */
static void check_pull(nwc_oci *c, const blob *b, uint64_t off, int verify, const char *what) {
  sink s = {0};
  int rc = nwc_oci_blob_pull(c, b->digest, off, verify, sink_write, &s, NULL, NULL);
  CHECK(rc == 0, "%s: pull: %d %s", what, rc, nwc_oci_last_error());
  CHECK(s.n == b->n - off && (s.n == 0 || !memcmp(s.p, b->p + off, s.n)),
        "%s: %llu bytes from %llu differ", what, (unsigned long long)s.n, (unsigned long long)off);
  free(s.p);
}

static nwc_oci *open_reg(const reg *r, const char *repo, const char *user, const char *pass) {
  char text[300];
  snprintf(text, sizeof text, "127.0.0.1:%d/%s", r->port, repo);
  nwc_oci_ref ref;
  nwc_oci *c = NULL;
  int rc = nwc_oci_ref_parse(text, &ref);
  if (rc == 0) rc = nwc_oci_open(&ref, user, pass, NWC_OCI_PLAIN_HTTP, &c);
  CHECK(rc == 0, "open %s: %d %s", text, rc, nwc_oci_last_error());
  nwc_oci_ref_free(&ref);
  return c;
}

/* ---- cases ------------------------------------------------------------------------------------- */

static void test_refs(void) {
  static const struct {
    const char *text, *registry, *repo, *tag, *digest;
  } good[] = {
      {"localhost/a", "localhost", "a", "latest", NULL},
      {"127.0.0.1:5000/models/llama:v1", "127.0.0.1:5000", "models/llama", "v1", NULL},
      {"registry.example.com/a/b/c", "registry.example.com", "a/b/c", "latest", NULL},
      {"host.io/x_y__z.w-v--u:T_1.0-rc",  "host.io", "x_y__z.w-v--u", "T_1.0-rc", NULL},
      {"[::1]:5000/r@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
       "[::1]:5000", "r", NULL,
       "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
      {"h.io/r:t@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "h.io",
       "r", "t", "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
  };
  static const char *const bad[] = {
      "", "library/ubuntu", "ubuntu", "host.io", "host.io/", "host.io/Upper", "host.io/a//b",
      "host.io/a/", "host.io/-a", "host.io/a-", "host.io/a...b", "host.io/a___b", "host.io/a:",
      "host.io/a:-t", "host.io/a:t!", "host.io/a@sha256:abc", "host.io/a@md5:0123",
      "host.io/a@sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
      "host:port/a", "host.io:99999999/a", "-host.io/a", "host.io/a b", "host.io/a\n",
      ":5000/a", "localhostx/a",
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    nwc_oci_ref r;
    int rc = nwc_oci_ref_parse(good[i].text, &r);
    CHECK(rc == 0, "ref '%s': %d %s", good[i].text, rc, nwc_oci_last_error());
    if (rc) continue;
    CHECK(!strcmp(r.registry, good[i].registry) && !strcmp(r.repository, good[i].repo),
          "ref '%s': registry '%s' repository '%s'", good[i].text, r.registry, r.repository);
    CHECK(good[i].tag ? r.tag && !strcmp(r.tag, good[i].tag) : !r.tag, "ref '%s': tag '%s'",
          good[i].text, r.tag ? r.tag : "(null)");
    CHECK(good[i].digest ? r.digest && !strcmp(r.digest, good[i].digest) : !r.digest,
          "ref '%s': digest", good[i].text);
    nwc_oci_ref_free(&r);
  }
  char longname[400] = "host.io/";
  memset(longname + 8, 'a', 300);
  for (size_t i = 0; i <= sizeof bad / sizeof bad[0]; i++) {
    const char *t = i < sizeof bad / sizeof bad[0] ? bad[i] : longname;
    nwc_oci_ref r;
    int rc = nwc_oci_ref_parse(t, &r);
    CHECK(rc == -EINVAL && !r.registry && *nwc_oci_last_error(), "bad ref '%s' gave %d", t, rc);
  }
  printf("refs: %zu good, %zu bad; e.g. '%s'\n", sizeof good / sizeof good[0],
         sizeof bad / sizeof bad[0] + 1, nwc_oci_last_error());
}

static void test_sha256(void) {
  char d[73];
  nwc_sha256_buf("", 0, d);
  CHECK(!strcmp(d, "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
        "sha256 of nothing: %s", d);
  nwc_sha256 *h;
  CHECK_RC(nwc_sha256_new(&h));
  nwc_sha256_update(h, "a", 1);
  nwc_sha256_update(h, "bc", 2);
  nwc_sha256_final(h, d);
  nwc_sha256_free(h);
  CHECK(!strcmp(d, "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
        "sha256 of abc: %s", d);
  CHECK(nwc_oci_digest_valid(d) && !nwc_oci_digest_valid("sha256:ba78") &&
            !nwc_oci_digest_valid(NULL), "digest_valid");
}

static void push_ok(nwc_oci *c, blob *b, const char *what) {
  b->read_bytes = 0;
  int rc = nwc_oci_blob_push(c, b->digest, b->n, blob_read, b, progress, NULL);
  CHECK(rc == 0, "push %s: %d %s", what, rc, nwc_oci_last_error());
}

/* blobs[0..2]: empty, small, big (through CHUNK-sized PATCHes). */
static void test_blobs(nwc_oci *c, blob *blobs) {
  CHECK_RC(nwc_oci_set_chunk(c, CHUNK));
  const char *names[] = {"empty", "small", "big"};
  for (int i = 0; i < 3; i++) {
    uint64_t size = 1;
    CHECK(nwc_oci_blob_exists(c, blobs[i].digest, &size) == 0, "%s exists before", names[i]);
    progress_last = 0;
    push_ok(c, &blobs[i], names[i]);
    CHECK(blobs[i].read_bytes == blobs[i].n && progress_last == blobs[i].n,
          "%s: read %llu, progress %llu", names[i], (unsigned long long)blobs[i].read_bytes,
          (unsigned long long)progress_last);
    CHECK(nwc_oci_blob_exists(c, blobs[i].digest, &size) == 1 && size == blobs[i].n,
          "%s exists after (size %llu)", names[i], (unsigned long long)size);
    check_pull(c, &blobs[i], 0, 1, names[i]);
    push_ok(c, &blobs[i], names[i]); /* again: HEAD says it is there, nothing is read */
    CHECK(blobs[i].read_bytes == 0, "%s: second push read %llu bytes", names[i],
          (unsigned long long)blobs[i].read_bytes);
  }
  uint64_t off = BIG - 1 - test_below(BIG / 2);
  check_pull(c, &blobs[2], off, 0, "big tail");
  check_pull(c, &blobs[1], 1, 0, "small tail");
  sink s = {0};
  int rc = nwc_oci_blob_pull(c, blobs[1].digest, blobs[1].n + 10, 0, sink_write, &s, NULL, NULL);
  CHECK(rc == -ERANGE, "pull beyond the end: %d %s", rc, nwc_oci_last_error());
  blob other;
  blob_make(&other, 5000);
  char wrong[73];
  memcpy(wrong, blobs[1].digest, 73);
  wrong[10] = wrong[10] == '0' ? '1' : '0';
  rc = nwc_oci_blob_push(c, wrong, other.n, blob_read, &other, NULL, NULL);
  CHECK(rc == -EBADMSG, "push under a wrong digest: %d %s", rc, nwc_oci_last_error());
  rc = nwc_oci_blob_pull(c, other.digest, 0, 1, sink_write, &s, NULL, NULL);
  CHECK(rc == -ENOENT && s.n == 0, "pull of an unknown blob: %d %s", rc, nwc_oci_last_error());
  free(other.p);
  free(s.p);
}

/* An OCI v1.1 artifact manifest for config + layers, malloc'ed. */
static char *artifact_manifest(const char *config_mt, const blob *config, const blob *l1,
                               const blob *l2) {
  char *m = malloc(4096);
  snprintf(m, 4096,
           "{\"schemaVersion\":2,\"mediaType\":\"" NWC_OCI_MT_MANIFEST "\","
           "\"artifactType\":\"application/vnd.nwc.model.v1\","
           "\"config\":{\"mediaType\":\"%s\",\"digest\":\"%s\",\"size\":%llu},"
           "\"layers\":[{\"mediaType\":\"application/vnd.nwc.container.v1\",\"digest\":\"%s\","
           "\"size\":%llu},{\"mediaType\":\"application/vnd.nwc.container.v1\",\"digest\":\"%s\","
           "\"size\":%llu}],\"annotations\":{\"org.opencontainers.image.title\":\"test\"}}",
           config_mt, config->digest, (unsigned long long)config->n, l1->digest,
           (unsigned long long)l1->n, l2->digest, (unsigned long long)l2->n);
  return m;
}

static void check_manifest_get(nwc_oci *c, const char *ref, const char *want, const char *want_d) {
  char *body, *mt, d[73];
  size_t len;
  int rc = nwc_oci_manifest_get(c, ref, &body, &len, &mt, d);
  CHECK(rc == 0, "manifest get %s: %d %s", ref, rc, nwc_oci_last_error());
  if (rc) return;
  CHECK(len == strlen(want) && !memcmp(body, want, len), "manifest %s: other bytes", ref);
  CHECK(!strcmp(mt, NWC_OCI_MT_MANIFEST), "manifest %s: media type %s", ref, mt);
  CHECK(!strcmp(d, want_d), "manifest %s: digest %s", ref, d);
  free(body);
  free(mt);
}

/* Config + 2 layers + manifest under tag; returns the manifest (malloc'ed), *d its digest. */
static char *push_artifact(nwc_oci *c, blob *config, blob *l1, blob *l2, const char *config_mt,
                           const char *tag, char d[73]) {
  push_ok(c, config, "config");
  push_ok(c, l1, "layer 1");
  push_ok(c, l2, "layer 2");
  char *m = artifact_manifest(config_mt, config, l1, l2);
  int rc = nwc_oci_manifest_put(c, tag, NWC_OCI_MT_MANIFEST, m, strlen(m), d);
  CHECK(rc == 0, "manifest put %s: %d %s", tag, rc, nwc_oci_last_error());
  return m;
}

static void test_manifests(nwc_oci *c, const reg *r, blob *blobs) {
  blob config = {.p = (uint8_t *)strdup("{\"format\":\"nwc\",\"tensors\":2}")};
  config.n = strlen((char *)config.p);
  nwc_sha256_buf(config.p, config.n, config.digest);
  char d[73], *body = NULL;
  char *m = push_artifact(c, &config, &blobs[1], &blobs[2], "application/vnd.nwc.config.v1+json",
                          "v1", d);
  check_manifest_get(c, "v1", m, d);
  check_manifest_get(c, d, m, d);
  size_t len;
  int rc = nwc_oci_manifest_get(c, "nosuchtag", &body, &len, NULL, NULL);
  CHECK(rc == -ENOENT && !body, "unknown tag: %d %s", rc, nwc_oci_last_error());
  rc = nwc_oci_manifest_get(c, "bad/tag", &body, &len, NULL, NULL);
  CHECK(rc == -EINVAL, "bad tag: %d", rc);
  blob ghost; /* never pushed */
  blob_make(&ghost, 3000);
  char *bad = artifact_manifest("application/vnd.nwc.config.v1+json", &config, &blobs[1], &ghost);
  free(ghost.p);
  rc = nwc_oci_manifest_put(c, "broken", NWC_OCI_MT_MANIFEST, bad, strlen(bad), NULL);
  CHECK(rc == -EINVAL, "manifest naming a missing blob: %d %s", rc,
        nwc_oci_last_error());
  printf("manifests: artifact %s; a broken one: %s\n", d, nwc_oci_last_error());
  nwc_oci *other = open_reg(r, "models/other", NULL, NULL);
  uint64_t size = 0;
  rc = other ? nwc_oci_blob_mount(other, blobs[1].digest, "models/t") : -EINVAL;
  CHECK(rc == 1 && nwc_oci_blob_exists(other, blobs[1].digest, &size) == 1 && size == blobs[1].n,
        "cross-repository mount: %d %s", rc, nwc_oci_last_error());
  blob ghost2;
  blob_make(&ghost2, 10);
  rc = other ? nwc_oci_blob_mount(other, ghost2.digest, "models/t") : -EINVAL;
  CHECK(rc == 0, "mount of a blob the source lacks: %d %s", rc, nwc_oci_last_error());
  free(ghost2.p);
  nwc_oci_close(other);
  free(bad);
  free(m);
  free(config.p);
}

/* Overwrites the stored bytes of b in registry r: verify must catch it. */
static void test_tamper(nwc_oci *c, const reg *r) {
  blob b;
  blob_make(&b, 100000);
  push_ok(c, &b, "tamper");
  char path[700];
  snprintf(path, sizeof path, "%s/data/docker/registry/v2/blobs/sha256/%.2s/%s/data", r->dir,
           b.digest + 7, b.digest + 7);
  FILE *f = fopen(path, "r+b");
  CHECK(f, "open %s", path);
  if (!f) return;
  fseek(f, 5000, SEEK_SET);
  fputc(b.p[5000] ^ 0x40, f);
  fclose(f);
  sink s = {0};
  int rc = nwc_oci_blob_pull(c, b.digest, 0, 1, sink_write, &s, NULL, NULL);
  CHECK(rc == -EBADMSG, "tampered blob with verify: %d %s", rc, nwc_oci_last_error());
  printf("tamper: %s\n", nwc_oci_last_error());
  s.n = 0;
  rc = nwc_oci_blob_pull(c, b.digest, 0, 0, sink_write, &s, NULL, NULL);
  CHECK(rc == 0 && s.n == b.n, "tampered blob without verify: %d", rc);
  free(s.p);
  free(b.p);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The registry killed (then stopped) mid-pull: a clean error, then a resumed pull completes. */
static void test_interrupted(nwc_oci *c, reg *r, const blob *big) {
  sink s = {.kill_after = 4u << 20, .victim = r->pid, .sig = SIGKILL};
  double t0 = now_s();
  int rc = nwc_oci_blob_pull(c, big->digest, 0, 0, sink_write, &s, NULL, NULL);
  double dt = now_s() - t0;
  printf("killed mid-pull: %d (%s) after %.2f s, %llu bytes\n", rc, nwc_oci_last_error(), dt,
         (unsigned long long)s.n);
  CHECK((rc == -ECONNRESET || rc == -EIO) && dt < 20 && s.n < big->n,
        "killed registry: %d %s", rc, nwc_oci_last_error());
  waitpid(r->pid, NULL, 0);
  r->pid = 0;
  CHECK(reg_start(r, "a", NULL) == 0, "registry restart");
  CHECK(!memcmp(s.p, big->p, s.n), "bytes before the kill differ");
  uint64_t got = s.n;
  rc = nwc_oci_blob_pull(c, big->digest, got, 0, sink_write, &s, NULL, NULL);
  CHECK(rc == 0 && s.n == big->n && !memcmp(s.p, big->p, s.n), "resumed pull from %llu: %d %s",
        (unsigned long long)got, rc, nwc_oci_last_error());
  /* stopped, not dead: the stall timeout ends it */
  CHECK_RC(nwc_oci_set_stall_timeout(c, 2));
  s.n = 0, s.kill_after = 1u << 20, s.victim = r->pid, s.sig = SIGSTOP;
  t0 = now_s();
  rc = nwc_oci_blob_pull(c, big->digest, 0, 0, sink_write, &s, NULL, NULL);
  dt = now_s() - t0;
  kill(r->pid, SIGCONT);
  printf("stopped mid-pull: %d (%s) after %.2f s\n", rc, nwc_oci_last_error(), dt);
  CHECK(rc == -ETIMEDOUT && dt < 30, "stopped registry: %d %s", rc, nwc_oci_last_error());
  CHECK_RC(nwc_oci_set_stall_timeout(c, 30));
  free(s.p);
}

/* skopeo reads what we pushed to a, copies it to b, and we read it back from b bit for bit. */
static void test_skopeo(nwc_oci *ca, const reg *a, const reg *b, blob *blobs) {
  if (access("/usr/bin/skopeo", X_OK)) {
    CHECK(0, "skopeo is not installed (scripts/lib/common.sh installs it)");
    return;
  }
  blob config = {.p = (uint8_t *)strdup("{\"architecture\":\"amd64\",\"os\":\"linux\","
                                        "\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[]}}")};
  config.n = strlen((char *)config.p);
  nwc_sha256_buf(config.p, config.n, config.digest);
  const char *mts[] = {"application/vnd.nwc.config.v1+json", NWC_OCI_MT_IMAGE_CONFIG};
  const char *tags[] = {"custom", "imagecfg"};
  char policy[400], out[400], name[64], d[73];
  snprintf(policy, sizeof policy, "%s/policy.json", tmp);
  write_file(policy, "{\"default\":[{\"type\":\"insecureAcceptAnything\"}]}");
  for (int i = 0; i < 2; i++) {
    char *m = push_artifact(ca, &config, &blobs[1], &blobs[2], mts[i], tags[i], d);
    snprintf(name, sizeof name, "skopeo-%s.json", tags[i]);
    snprintf(out, sizeof out, "%s/%s", tmp, name);
    int rc = sh("skopeo inspect --tls-verify=false --raw docker://127.0.0.1:%d/models/t:%s > %s "
                "2>%s.err", a->port, tags[i], out, out);
    size_t len = 0;
    uint8_t *got = rc ? NULL : test_slurp(tmp, name, "", &len);
    CHECK(got && len == strlen(m) && !memcmp(got, m, len), "skopeo inspect --raw %s", tags[i]);
    free(got);
    rc = sh("skopeo --policy %s copy --src-tls-verify=false --dest-tls-verify=false "
            "docker://127.0.0.1:%d/models/t:%s docker://127.0.0.1:%d/copied/t:%s >%s.copy 2>&1",
            policy, a->port, tags[i], b->port, tags[i], out);
    printf("skopeo copy with config %s: %s\n", mts[i], rc ? "refused" : "ok");
    if (rc) sh("cat %s.copy", out);
    CHECK(rc == 0, "skopeo copy of the artifact with config %s", mts[i]);
    nwc_oci *cb = open_reg(b, "copied/t", NULL, NULL);
    if (rc == 0 && cb) {
      check_manifest_get(cb, tags[i], m, d);
      check_pull(cb, &config, 0, 1, "copied config");
      check_pull(cb, &blobs[1], 0, 1, "copied layer 1");
      check_pull(cb, &blobs[2], 0, 1, "copied layer 2");
    }
    nwc_oci_close(cb);
    free(m);
  }
  free(config.p);
}

static void write_b64_auth(const char *path, const char *key, const char *user, const char *pass) {
  char up[256], b64[400], json[1024];
  int n = snprintf(up, sizeof up, "%s:%s", user, pass);
  EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)up, n);
  snprintf(json, sizeof json, "{\"auths\":{\"%s\":{\"auth\":\"%s\"}}}", key, b64);
  write_file(path, json);
}

/* Pushes and pulls a small blob with user/pass; returns the push's status. */
static int roundtrip(const reg *r, const char *user, const char *pass) {
  nwc_oci *c = open_reg(r, "secure/m", user, pass);
  if (!c) return -EINVAL;
  blob b;
  blob_make(&b, 1u << 20);
  int rc = nwc_oci_blob_push(c, b.digest, b.n, blob_read, &b, NULL, NULL);
  if (rc == 0) check_pull(c, &b, 0, 1, "authenticated pull");
  if (rc == 0) { /* a manifest behind auth too: the blob as config, no layers */
    char m[400], d[73];
    snprintf(m, sizeof m, "{\"schemaVersion\":2,\"mediaType\":\"" NWC_OCI_MT_MANIFEST "\","
             "\"config\":{\"mediaType\":\"application/vnd.nwc.config.v1+json\",\"digest\":"
             "\"%s\",\"size\":%llu},\"layers\":[]}", b.digest, (unsigned long long)b.n);
    rc = nwc_oci_manifest_put(c, "t", NWC_OCI_MT_MANIFEST, m, strlen(m), d);
    if (rc == 0) check_manifest_get(c, "t", m, d);
  }
  nwc_oci_close(c);
  free(b.p);
  return rc;
}

/* Credential helpers (credHelpers, credsStore), identitytoken, REGISTRY_AUTH_FILE, bad files;
 * dir is DOCKER_CONFIG, key the registry. */
static void test_helpers(const char *dir, const char *key) {
  char path[600], *user, *pass;
  int rc;
  /* a credential helper named by credHelpers */
  snprintf(path, sizeof path, "%s/docker-credential-nwctest", dir);
  char script[600], env_path[4096];
  snprintf(script, sizeof script, "#!/bin/sh\nread r\n[ \"$r\" = \"%s\" ] || { echo "
           "'credentials not found in native keychain'; exit 1; }\n"
           "echo '{\"ServerURL\":\"'$r'\",\"Username\":\"helperuser\",\"Secret\":\"helperpw\"}'\n",
           key);
  write_file(path, script);
  chmod(path, 0755);
  snprintf(env_path, sizeof env_path, "%s:%s", dir, getenv("PATH") ? getenv("PATH") : "/usr/bin");
  setenv("PATH", env_path, 1);
  snprintf(path, sizeof path, "%s/config.json", dir);
  snprintf(script, sizeof script, "{\"auths\":{},\"credHelpers\":{\"%s\":\"nwctest\"}}", key);
  write_file(path, script);
  rc = nwc_oci_credentials(key, &user, &pass);
  CHECK(rc == 0 && !strcmp(user, "helperuser") && !strcmp(pass, "helperpw"), "helper: %d %s", rc,
        nwc_oci_last_error());
  if (rc == 0) free(user), free(pass);
  rc = nwc_oci_credentials("127.0.0.2:1", &user, &pass); /* the helper knows only `key` */
  CHECK(rc == -ENOENT, "helper without credentials: %d %s", rc, nwc_oci_last_error());
  snprintf(script, sizeof script, "{\"auths\":{\"https://%s/v1/\":{}},\"credsStore\":"
           "\"nwctest\"}", key);
  write_file(path, script);
  rc = nwc_oci_credentials(key, &user, &pass);
  CHECK(rc == 0 && !strcmp(user, "helperuser"), "credsStore: %d %s", rc, nwc_oci_last_error());
  if (rc == 0) free(user), free(pass);
  snprintf(script, sizeof script, "{\"auths\":{\"http://%s\":{\"identitytoken\":\"tok\"}}}",
           key);
  write_file(path, script);
  rc = nwc_oci_credentials(key, &user, &pass);
  CHECK(rc == 0 && !strcmp(user, "<token>") && !strcmp(pass, "tok"), "identitytoken: %d %s", rc,
        nwc_oci_last_error());
  if (rc == 0) free(user), free(pass);
  /* REGISTRY_AUTH_FILE comes first; a malformed one is an error naming it */
  snprintf(path, sizeof path, "%s/auth.json", dir);
  write_b64_auth(path, key, "fileuser", "filepw");
  setenv("REGISTRY_AUTH_FILE", path, 1);
  rc = nwc_oci_credentials(key, &user, &pass);
  CHECK(rc == 0 && !strcmp(user, "fileuser"), "REGISTRY_AUTH_FILE: %d %s", rc, nwc_oci_last_error());
  if (rc == 0) free(user), free(pass);
  write_file(path, "{\"auths\": {\"x\": [1, 2");
  rc = nwc_oci_credentials(key, &user, &pass);
  CHECK(rc == -EBADMSG && strstr(nwc_oci_last_error(), path), "malformed file: %d %s", rc,
        nwc_oci_last_error());
  snprintf(script, sizeof script, "{\"auths\":{\"%s\":{\"auth\":\"!!notbase64\"}}}", key);
  write_file(path, script);
  rc = nwc_oci_credentials(key, &user, &pass);
  CHECK(rc == -EBADMSG, "bad base64: %d %s", rc, nwc_oci_last_error());
}

/* Basic auth: htpasswd, credentials from DOCKER_CONFIG, a helper, REGISTRY_AUTH_FILE. */
static void test_basic(void) {
  reg r = {0};
  char dir[400], auth[1200], key[64], *user, *pass;
  snprintf(dir, sizeof dir, "%s/basic-auth", tmp);
  mkdir(dir, 0700);
  if (sh("htpasswd -Bbn nwcuser 's3cret:pw' > %s/htpasswd", dir)) return;
  snprintf(auth, sizeof auth, "  htpasswd:\n    realm: nwc-test\n    path: %s/htpasswd\n", dir);
  if (reg_start(&r, "basic", auth)) return;
  snprintf(key, sizeof key, "127.0.0.1:%d", r.port);
  char path[600];
  snprintf(path, sizeof path, "%s/config.json", dir);
  write_b64_auth(path, key, "nwcuser", "s3cret:pw");
  setenv("DOCKER_CONFIG", dir, 1);
  int rc = nwc_oci_credentials(key, &user, &pass);
  CHECK(rc == 0 && !strcmp(user, "nwcuser") && !strcmp(pass, "s3cret:pw"), "DOCKER_CONFIG: %d %s",
        rc, nwc_oci_last_error());
  if (rc == 0) {
    CHECK(roundtrip(&r, user, pass) == 0, "Basic auth roundtrip: %s", nwc_oci_last_error());
    free(user), free(pass);
  }
  rc = roundtrip(&r, "nwcuser", "wrong");
  CHECK(rc == -EACCES, "wrong password: %d %s", rc, nwc_oci_last_error());
  printf("basic, wrong password: %s\n", nwc_oci_last_error());
  rc = roundtrip(&r, NULL, NULL);
  CHECK(rc == -EACCES, "no credentials: %d %s", rc, nwc_oci_last_error());
  rc = nwc_oci_credentials("other.example.com", &user, &pass);
  CHECK(rc == -ENOENT, "credentials of an unknown registry: %d", rc);
  test_helpers(dir, key);
  unsetenv("REGISTRY_AUTH_FILE");
  unsetenv("DOCKER_CONFIG");
  reap(&r.pid);
}

/* Bearer tokens from tests/test_oci_token.py (RS256, the registry trusting its certificate). */
static void test_bearer(void) {
  char dir[400], script[600], auth[1200];
  snprintf(dir, sizeof dir, "%s/token", tmp);
  mkdir(dir, 0700);
  snprintf(script, sizeof script, "%s/tests/test_oci_token.py",
           getenv("NWC_SOURCE_DIR") ? getenv("NWC_SOURCE_DIR") : "..");
  if (sh("openssl req -x509 -newkey rsa:2048 -nodes -keyout %s/key.pem -out %s/cert.pem -days 2 "
         "-subj /CN=nwc-test-token 2>/dev/null", dir, dir))
    return;
  char key[500], cert[500], log[500];
  snprintf(key, sizeof key, "%s/key.pem", dir);
  snprintf(cert, sizeof cert, "%s/cert.pem", dir);
  snprintf(log, sizeof log, "%s/log", dir);
  int fds[2];
  if (pipe(fds)) return;
  char *argv[] = {"/usr/bin/python3", script, key, cert, "tokenuser", "tokenpw", NULL};
  pid_t tpid = spawn(argv, log, fds[1]);
  close(fds[1]);
  char line[32] = "";
  ssize_t n = read(fds[0], line, sizeof line - 1);
  close(fds[0]);
  int tport = n > 0 ? atoi(line) : 0;
  CHECK(tport > 0, "token server did not start (log: %s)", log);
  reg r = {0};
  snprintf(auth, sizeof auth,
           "  token:\n    realm: http://127.0.0.1:%d/token\n    service: nwc-registry\n"
           "    issuer: nwc-test-issuer\n    rootcertbundle: %s\n", tport, cert);
  if (tport > 0 && reg_start(&r, "bearer", auth) == 0) {
    int rc = roundtrip(&r, "tokenuser", "tokenpw");
    CHECK(rc == 0, "Bearer roundtrip: %d %s", rc, nwc_oci_last_error());
    rc = roundtrip(&r, "tokenuser", "nope");
    CHECK(rc == -EACCES, "Bearer, wrong password: %d %s", rc, nwc_oci_last_error());
    printf("bearer, wrong password: %s\n", nwc_oci_last_error());
    rc = roundtrip(&r, NULL, NULL);
    CHECK(rc == -EACCES, "Bearer, no credentials: %d %s", rc, nwc_oci_last_error());
  }
  reap(&r.pid);
  reap(&tpid);
}

int main(void) {
  if (access(REGISTRY_BIN, X_OK)) {
    printf("test_oci: %s missing: skipped\n", REGISTRY_BIN);
    return TEST_SKIP;
  }
  test_seed("test_oci");
  snprintf(tmp, sizeof tmp, "/tmp/nwc-test-oci-XXXXXX");
  if (!mkdtemp(tmp)) return 1;
  test_refs();
  test_sha256();
  reg a = {0}, b = {0};
  blob blobs[3];
  blob_make(&blobs[0], 0);
  blob_make(&blobs[1], 1 + test_below(100000));
  blob_make(&blobs[2], BIG);
  if (reg_start(&a, "a", NULL) == 0 && reg_start(&b, "b", NULL) == 0) {
    nwc_oci *c = open_reg(&a, "models/t", NULL, NULL);
    if (c) {
      test_blobs(c, blobs);
      test_manifests(c, &a, blobs);
      test_tamper(c, &a);
      test_skopeo(c, &a, &b, blobs);
      test_interrupted(c, &a, &blobs[2]);
    }
    nwc_oci_close(c);
  }
  reap(&a.pid);
  reap(&b.pid);
  test_basic();
  test_bearer();
  for (int i = 0; i < 3; i++) free(blobs[i].p);
  if (!test_failures) sh("rm -rf %s", tmp);
  else printf("test_oci: registries' folders and logs kept in %s\n", tmp);
  return test_exit("test_oci");
}
