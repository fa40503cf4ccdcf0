/*
 * test_daemon_truncate.c - nothing a container file does under nwcd kills it.  With a budget far
 * below every tensor, compute requests run on transient copies of the blob (no resident copy
 * can be made); once the container file is truncated, while a second thread keeps cutting it
 * shorter during dequants, every request is either right (bit for bit: the part it needs was
 * still there) or an error naming the container, never a signal: nwcd used to compute on a
 * memory map of the file and died of SIGBUS.  The same under the normal budget (loads through
 * the loader), with the file gone, and with the model removed while dequants over the budget
 * read its blobs.  After each, nwcd answers a listing and stops cleanly.
 */
#include "test_daemon_util.h"

#include "nwc_client.h"

#include <pthread.h>
#include <stdatomic.h>

/* The path of the one container file of the store (static buffer), or NULL. */
static const char *container_path(void) {
  static char path[700];
  char name[256];
  if (td_count_containers(name) != 1) return NULL;
  snprintf(path, sizeof path, "%s/containers/%s", td_store, name);
  return path;
}

typedef struct cutter {
  const char *path;
  off_t size;
  atomic_int stop;
} cutter;

static void *cut(void *arg) {
  cutter *c = arg;
  while (!c->stop && c->size > 4096) {
    c->size = c->size * 7 / 8 / 4096 * 4096;
    if (truncate(c->path, c->size) < 0) break;
    usleep(5000);
  }
  return NULL;
}

/* Dequantizes every BF16 tensor of the sample n times over (random order) while a thread cuts
 * the container shorter; each reply is exact or an error naming the container. */
static void dequant_while_cut(nwc_client *c, int rounds, int transient) {
  const char *path = container_path();
  CHECK(path != NULL, "no container file in %s", td_store);
  if (!path) return;
  struct stat st;
  stat(path, &st);
  cutter k = {path, st.st_size, 0};
  pthread_t th;
  pthread_create(&th, NULL, cut, &k);
  int ok = 0, failed = 0;
  for (int i = 0; i < rounds; i++) {
    const td_tensor *t = &td_t[test_below(td_nt)];
    size_t bytes = t->rows * t->cols * 2;
    uint16_t *b = malloc(bytes);
    int rc = nwc_client_dequant(c, "use", t->name, NWC_CLIENT_BF16, b, bytes, NULL, NULL, NULL);
    if (rc == 0) {
      CHECK(!memcmp(b, t->w, bytes), "dequant of %s returned wrong values", t->name);
      ok++;
    } else {
      CHECK(strstr(nwc_client_last_error(), "containers/") != NULL,
            "error for %s names no container: %d %s", t->name, rc, nwc_client_last_error());
      failed++;
    }
    free(b);
  }
  k.stop = 1;
  pthread_join(th, NULL);
  if (truncate(path, 4096) == 0) { /* then every blob is past the end */
    const td_tensor *t = &td_t[test_below(td_nt)];
    size_t bytes = t->rows * t->cols * 2;
    uint16_t *b = malloc(bytes);
    int rc = nwc_client_dequant(c, "use", t->name, NWC_CLIENT_BF16, b, bytes, NULL, NULL, NULL);
    /* a resident copy (normal budget) may serve it; a transient one must read the file */
    CHECK(rc < 0 || !transient, "dequant of %s from a container cut to its header succeeded",
          t->name);
    free(b);
  }
  printf("  %d exact, %d errors while the container shrank\n", ok, failed);
}

typedef struct remover {
  atomic_int done, removed;
} remover;

/* Removes model "use" (a second connection) as soon as nwcd lets it, while dequants run. */
static void *remove_soon(void *arg) {
  remover *m = arg;
  nwc_client *c;
  if (nwc_client_connect(td_sock, &c) < 0) return NULL;
  while (!atomic_load(&m->done) && !atomic_load(&m->removed)) {
    int rc = nwc_client_remove(c, "use");
    if (rc == 0) atomic_store(&m->removed, 1);
    else usleep(1000);
  }
  nwc_client_free(c);
  return NULL;
}

/* The model removed while dequants over the budget run on transient copies of its blobs: each
 * is exact or an error; the removal waits for none of them to end badly. */
static void dequant_while_removed(nwc_client *c) {
  remover m = {0, 0};
  pthread_t th;
  pthread_create(&th, NULL, remove_soon, &m);
  int ok = 0, failed = 0;
  for (int i = 0; i < 40 && !atomic_load(&m.removed); i++) {
    const td_tensor *t = &td_t[test_below(td_nt)];
    size_t bytes = t->rows * t->cols * 2;
    uint16_t *b = malloc(bytes);
    int rc = nwc_client_dequant(c, "use", t->name, NWC_CLIENT_BF16, b, bytes, NULL, NULL, NULL);
    if (rc == 0) CHECK(!memcmp(b, t->w, bytes), "dequant of %s returned wrong values", t->name);
    ok += rc == 0, failed += rc != 0;
    free(b);
  }
  atomic_store(&m.done, 1);
  pthread_join(th, NULL);
  printf("  %d exact, %d errors while the model was removed (%s)\n", ok, failed,
         atomic_load(&m.removed) ? "removed" : "not removed");
}

static void one_run(const char *const *extra, int vanish) {
  pid_t d = td_start_daemon(extra);
  CHECK(d > 0, "nwcd did not start");
  if (d <= 0) return td_show_log();
  nwc_client *c;
  CHECK_RC(nwc_client_connect(td_sock, &c));
  CHECK_RC(nwc_client_import(c, "use", getenv("NWC_SAMPLE"), NULL, NULL));
  if (vanish == 2) {
    dequant_while_removed(c);
  } else if (vanish) {
    const char *path = container_path();
    CHECK(path && unlink(path) == 0, "cannot unlink the container");
    const td_tensor *t = &td_t[0];
    size_t bytes = t->rows * t->cols * 2;
    uint16_t *b = malloc(bytes);
    int rc = nwc_client_dequant(c, "use", t->name, NWC_CLIENT_BF16, b, bytes, NULL, NULL, NULL);
    CHECK(rc < 0 && strstr(nwc_client_last_error(), "containers/"),
          "dequant from a deleted container: %d %s", rc, nwc_client_last_error());
    free(b);
  } else {
    dequant_while_cut(c, 60, extra != NULL);
  }
  nwc_client_model *m = NULL;
  size_t n = 0;
  CHECK_RC(nwc_client_models(c, &m, &n));
  free(m);
  nwc_client_free(c);
  int st = td_stop_daemon(d);
  CHECK(st == 0, "nwcd did not stop cleanly (%d): it crashed on a truncated container", st);
  if (st) td_show_log();
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", td_store);
  CHECK(system(cmd) == 0, "cannot clean the store");
}

int main(void) {
  test_seed("test_daemon_truncate");
  int rc = td_open_sample();
  if (rc) return rc;
  if (td_mkdir("nwc-trunc") < 0) return 1;
  const char *tiny[] = {"--budget", "65536", NULL};
  printf("budget below every tensor (transient copies)\n");
  one_run(tiny, 0);
  printf("normal budget (loads)\n");
  one_run(NULL, 0);
  printf("the container deleted\n");
  one_run(tiny, 1);
  printf("the model removed during dequants over the budget\n");
  one_run(tiny, 2);
  td_cleanup();
  return test_exit("test_daemon_truncate");
}
