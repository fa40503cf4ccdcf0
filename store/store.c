/*
 * store.c - the store directory: open (create, lock, migrate, sweep crash leftovers), close,
 * remove a model, the name rules, and nwc_store_read (a tensor by name: its catalog row, then its
 * blob read through container.c).
 *
 * Locking: DIR/lock is flock()ed exclusively by a writer and shared by readers (RDONLY), so a
 * sweep never races an import of another process.  The sweep (writer open only) deletes, in
 * DIR/containers, every "<16 hex>.tmp" (an import that never finished) and every "<16 hex>.nwc"
 * no containers row names (an import that died between rename and commit, or a removal that died
 * between commit and unlink).  Other names are left alone: the store never deletes what it did
 * not write.  A container file whose id is at or past the catalog's next container id was not
 * written by an import of this catalog (the catalog was deleted, emptied or replaced by an older
 * copy): the store is damaged, and a writer open refuses it (-EUCLEAN) before changing anything,
 * unless NWC_STORE_DISCARD asks to delete such files.  Each removed file is recorded with its
 * reason (nwc_store_swept_file) for the caller to log.
 */
#include "store_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

int nwc_model_name_valid(const char *name) {
  if (!name) return 0;
  size_t n = strlen(name);
  if (n == 0 || n > NWC_MODEL_NAME_MAX) return 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)name[i];
    int alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-'))) return 0;
  }
  return 1;
}

int nwc_tensor_name_valid(const char *name) {
  if (!name || !*name || strnlen(name, NWC_TENSOR_NAME_MAX + 1) > NWC_TENSOR_NAME_MAX) return 0;
  const unsigned char *p = (const unsigned char *)name;
  while (*p) {
    unsigned c = *p, n, cp;
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f) return 0;
      p++;
      continue;
    }
    if (c >= 0xc2 && c <= 0xdf) n = 1, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) n = 2, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) n = 3, cp = c & 0x07;
    else return 0;
    for (unsigned i = 1; i <= n; i++) {
      if ((p[i] & 0xc0) != 0x80) return 0;
      cp = (cp << 6) | (p[i] & 0x3fu);
    }
    if ((n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff)))
      return 0;
    if (cp >= 0x80 && cp <= 0x9f) return 0; /* C1 controls */
    p += n + 1;
  }
  return 1;
}

static int is_hex16(const char *s) {
  for (int i = 0; i < 16; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  return 1;
}

int nwc__store_sync_dir(nwc_store *s) {
  return fsync(s->cdirfd) < 0 ? nwc__fail(-errno, "%s/containers: fsync: %s", s->dir,
                                          strerror(errno))
                              : 0;
}

int nwc__container_finish(nwc_store *s, uint64_t cid, int fd, int rc, int (*publish)(void *ctx), void *ctx) {
  char tmp[32], fin[32];
  nwc__container_name(cid, 1, tmp);
  nwc__container_name(cid, 0, fin);
  if (rc == 0 && fsync(fd) < 0) rc = nwc__fail(-errno, "%s/containers/%s: fsync: %s", s->dir, tmp, strerror(errno));
  close(fd);
  int renamed = 0;
  if (rc == 0) {
    if (renameat(s->cdirfd, tmp, s->cdirfd, fin) < 0)
      rc = nwc__fail(-errno, "%s/containers/%s: rename: %s", s->dir, tmp, strerror(errno));
    else renamed = 1;
  }
  if (rc == 0) rc = nwc__store_sync_dir(s);
  if (rc == 0) rc = publish(ctx);
  if (rc < 0) {
    unlinkat(s->cdirfd, renamed ? fin : tmp, 0);
    fsync(s->cdirfd);
  }
  return rc;
}

/* The container id of a name the store writes ("<16 hex>.nwc" or ".tmp"), with *tmp set; 0 for
 * any other name (ids start at 1). */
static uint64_t container_id(const char *n, int *tmp) {
  if (strlen(n) != 20 || n[16] != '.' || !is_hex16(n)) return 0;
  *tmp = !strcmp(n + 17, "tmp");
  if (!*tmp && strcmp(n + 17, "nwc")) return 0;
  uint64_t id = strtoull(n, NULL, 16);
  return id ? id : UINT64_MAX; /* id 0 was never written: unexplained */
}

/* Removes containers/n, recording why. */
static int sweep_one(nwc_store *s, const char *n, const char *why) {
  if (unlinkat(s->cdirfd, n, 0) < 0 && errno != ENOENT)
    return nwc__fail(-errno, "%s/containers/%s: cannot remove (%s): %s", s->dir, n, why,
                     strerror(errno));
  char **v = realloc(s->swept_files, (s->swept + 1) * sizeof *v), *line = NULL;
  if (v) s->swept_files = v;
  if (v && asprintf(&line, "containers/%s (%s)", n, why) < 0) line = NULL;
  if (v) s->swept_files[s->swept] = line;
  s->swept++;
  return 0;
}

/* Walks containers/: with apply 0, counts in *unexplained the container files whose id is at or
 * past next (no import of this catalog wrote them), naming the first in first[32]; with apply
 * 1, deletes crash leftovers (see the top of the file) and, with NWC_STORE_DISCARD, the
 * unexplained files too, each recorded with its reason. */
static int sweep_walk(nwc_store *s, uint64_t next, int apply, size_t *unexplained, char *first) {
  int fd = dup(s->cdirfd);
  if (fd < 0) return -errno;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return -errno;
  }
  rewinddir(d);
  int rc = 0, tmp = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir(d))) {
    const char *n = e->d_name;
    uint64_t id = container_id(n, &tmp);
    if (!id) continue;
    if (id >= next) {
      if (!apply && !(*unexplained)++) snprintf(first, 32, "%s", n);
      if (apply && (s->flags & NWC_STORE_DISCARD))
        rc = sweep_one(s, n, "not explained by the catalog: deleted as asked");
      continue;
    }
    if (!apply) continue;
    if (tmp) {
      rc = sweep_one(s, n, "an import that did not finish");
      continue;
    }
    int live = nwc__catalog_has_container(s->db, id);
    if (live)
      rc = live < 0 ? live : 0;
    else
      rc = sweep_one(s, n, "no catalog row names it: an import that died before its commit, or "
                           "a removal after its commit");
  }
  closedir(d);
  return rc;
}

/* Refuses (-EUCLEAN) a store whose containers/ holds files the catalog does not explain (ids at
 * or past next), unless NWC_STORE_DISCARD. */
static int check_explained(nwc_store *s, uint64_t next, const char *catalog_state) {
  size_t n = 0;
  char first[32] = "";
  NWC_TRY(sweep_walk(s, next, 0, &n, first));
  if (!n || (s->flags & NWC_STORE_DISCARD)) return 0;
  return nwc__fail(-EUCLEAN, "%s: the catalog %s, but containers/ holds %zu container file%s it "
                   "does not explain (%s%s): the store is damaged, not empty; nothing was "
                   "changed. Restore catalog.sqlite (with catalog.sqlite-wal) from a backup, or "
                   "move containers/ aside; deleting those files needs an explicit request",
                   s->dir, catalog_state, n, n == 1 ? "" : "s", first, n > 1 ? ", ..." : "");
}

/* Deletes crash leftovers (see the top of the file), after refusing unexplained files. */
static int sweep(nwc_store *s) {
  uint64_t next = 0;
  NWC_TRY(nwc__catalog_peek_next(s->db, &next));
  NWC_TRY(check_explained(s, next, next <= 1 ? "is empty" : "names fewer containers"));
  size_t unused = 0;
  int rc = sweep_walk(s, next, 1, &unused, NULL);
  if (rc == 0 && s->swept) rc = nwc__store_sync_dir(s);
  return rc;
}

const char *nwc_store_swept_file(const nwc_store *s, uint64_t i) {
  return s && i < s->swept && s->swept_files ? s->swept_files[i] : NULL;
}

void nwc_store_close(nwc_store *s) {
  if (!s) return;
  if (s->rdb) sqlite3_close(s->rdb);
  if (s->db) sqlite3_close(s->db);
  if (s->cdirfd >= 0) close(s->cdirfd);
  if (s->lockfd >= 0) close(s->lockfd);
  for (uint64_t i = 0; s->swept_files && i < s->swept; i++) free(s->swept_files[i]);
  free(s->swept_files);
  pthread_mutex_destroy(&s->mu);
  pthread_mutex_destroy(&s->rmu);
  free(s->dir);
  free(s);
}

/* A file or directory of the store that open() or mkdir() refused (errno): what failed, why,
 * and the likely cause where the errno tells it. */
static int open_failed(const char *path, const char *what) {
  int e = errno;
  char hint[80] = "";
  if (e == EACCES || e == EPERM)
    snprintf(hint, sizeof hint, " (another user's store? this process runs as uid %u)",
             (unsigned)geteuid());
  else if (e == ENOENT)
    snprintf(hint, sizeof hint, " (not a store?)");
  return nwc__fail(-e, "%s: cannot %s: %s%s", path, what, strerror(e), hint);
}

int nwc_store_open(const char *dir, unsigned flags, nwc_store **out) {
  NWC_RETURN_IF(!dir || !*dir || !out || (flags & ~7u), -EINVAL, "nwc_store_open: bad argument");
  *out = NULL;
  int rdonly = (flags & NWC_STORE_RDONLY) != 0, create = !rdonly && (flags & NWC_STORE_CREATE);
  if (create && mkdir(dir, 0750) < 0 && errno != EEXIST)
    return nwc__fail(-errno, "%s: cannot create the store directory: %s%s", dir, strerror(errno),
                     errno == ENOENT ? " (the directory is made, not its parents)" : "");
  nwc_store *s = calloc(1, sizeof *s);
  if (!s) return -ENOMEM;
  s->lockfd = s->cdirfd = -1;
  s->flags = flags;
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&s->mu, &ma);
  pthread_mutexattr_destroy(&ma);
  pthread_mutex_init(&s->rmu, NULL);
  s->dir = realpath(dir, NULL);
  int rc = s->dir ? 0 : nwc__fail(-errno, "%s: no such store directory", dir);
  char path[PATH_MAX + 32];
  struct stat st;
  if (rc == 0 && !create) { /* never litter a directory that is not a store */
    snprintf(path, sizeof path, "%s/catalog.sqlite", s->dir);
    if (stat(path, &st) < 0) rc = nwc__fail(-errno, "%s: not a store (no catalog.sqlite)", s->dir);
  }
  if (rc == 0) {
    snprintf(path, sizeof path, "%s/lock", s->dir);
    s->lockfd = open(path, (rdonly ? O_RDONLY : O_RDWR | O_CREAT) | O_CLOEXEC, 0640);
    if (s->lockfd < 0) rc = open_failed(path, "open");
  }
  if (rc == 0 && flock(s->lockfd, (rdonly ? LOCK_SH : LOCK_EX) | LOCK_NB) < 0)
    rc = nwc__fail(errno == EWOULDBLOCK ? -EBUSY : -errno, "%s: the store is in use by another "
                   "process", s->dir);
  if (rc == 0) {
    snprintf(path, sizeof path, "%s/containers", s->dir);
    if (create && mkdir(path, 0750) < 0 && errno != EEXIST)
      rc = open_failed(path, "create");
    s->cdirfd = rc ? -1 : open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rc == 0 && s->cdirfd < 0) rc = open_failed(path, "open");
  }
  if (rc == 0) {
    snprintf(path, sizeof path, "%s/catalog.sqlite", s->dir);
    if (!rdonly && stat(path, &st) < 0 && errno == ENOENT) /* create none beside containers */
      rc = check_explained(s, 1, "catalog.sqlite is missing");
  }
  if (rc == 0) {
    rc = nwc__catalog_open(path, create, rdonly, &s->db);
    if (rc == 0) rc = nwc__catalog_open(path, 0, 1, &s->rdb); /* after db made it current */
    if (rc < 0 && rc != -ENOENT) rc = nwc__fail_prefix(rc, "%s", s->dir);
  }
  if (rc == 0 && create) { /* make the new directory entries durable */
    int dfd = open(s->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) fsync(dfd), close(dfd);
  }
  if (rc == 0 && !rdonly) rc = sweep(s);
  if (rc < 0) {
    nwc_store_close(s);
    return rc;
  }
  *out = s;
  return 0;
}

uint64_t nwc_store_swept(const nwc_store *s) { return s ? s->swept : 0; }

int nwc_store_schema_version(nwc_store *s) {
  NWC_RETURN_IF(!s, -EINVAL, "nwc_store_schema_version: no store");
  nwc__lock(s);
  int v = nwc__catalog_version(s->db);
  nwc__unlock(s);
  return v;
}

int nwc_store_remove(nwc_store *s, const char *model) {
  NWC_RETURN_IF(!s || !model, -EINVAL, "nwc_store_remove: missing argument");
  NWC_RETURN_IF(s->flags & NWC_STORE_RDONLY, -EROFS, "%s: store opened read-only", s->dir);
  int64_t mid;
  uint64_t *ids = NULL, *sizes = NULL;
  size_t n = 0;
  nwc__lock(s);
  int rc = nwc__catalog_model_id(s->db, model, &mid);
  if (rc == 0) rc = nwc__catalog_containers(s->db, mid, &ids, &sizes, &n);
  if (rc == 0) rc = nwc__catalog_delete_model(s->db, mid);
  for (size_t i = 0; rc == 0 && i < n; i++) {
    char name[32];
    nwc__container_name(ids[i], 0, name);
    /* A failure here leaves an unreferenced file that the next open sweeps away. */
    if (unlinkat(s->cdirfd, name, 0) < 0 && errno != ENOENT)
      rc = nwc__fail(-errno, "%s/containers/%s: cannot remove", s->dir, name);
  }
  if (rc == 0 && n) rc = nwc__store_sync_dir(s);
  nwc__unlock(s);
  free(ids);
  free(sizes);
  return rc;
}

int nwc_store_read(nwc_store *s, const char *model, const char *tensor, nwc_tensor *t) {
  nwc_tensor_info *ti = NULL;
  NWC_TRY(nwc_store_tensor(s, model, tensor, &ti));
  int rc = nwc_store_read_info(ti, t);
  nwc_tensor_info_free(ti, 1);
  return rc;
}
