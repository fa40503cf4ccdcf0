/*
 * import.c - safetensors (single file or sharded) into the store: plan, encode on all threads,
 * write one container, publish in one transaction.  This file runs the phases and publishes
 * (nwc_store_import, nwc_store_import_fds); the plan is import_plan.c, the encoding
 * import_encode.c, the writer thread import_write.c, reading the sources import_source.c.
 *
 * Phases, each finishing before the next starts:
 *   1. plan    parse every file (store/safetensors.c) and the index; check names, dtypes, shapes,
 *              duplicates across shards, that the index and the shards agree, and that the model
 *              name is free.  Any bad input fails here, before a byte is written.  Well-formed
 *              tensors that nwc does not store (integer and boolean dtypes, empty tensors) are set
 *              aside as skipped (a strict import fails on the first); they are reported after
 *              the publish.
 *   2. encode  tensors largest first: those of TEAM_BYTES or more one at a time on all threads
 *              (nwc__enc_*), the rest one per worker thread.  Convert (F16/F32/F64 -> BF16 by
 *              round to nearest even, F8_E5M2 -> BF16 exactly, optional BF16 -> fp8 per row) or
 *              let the encoder pread the source piece by piece; encode the blob's head in place
 *              (encode_in_place) and its raw plane in 1 MiB chunks (stream_chunk), each
 *              checksummed and queued as soon as it is made; a blob under NWC_STORE_PACK_MAX
 *              is packed with others into a run of whole pages instead (pack_add).  A writer
 *              thread writes the queue to DIR/containers/ID.tmp (large pieces O_DIRECT) while
 *              encoding goes on.  The calling thread reports progress; the first error stops
 *              the others.
 *   3. publish fsync the file, rename it to ID.nwc, fsync the directory, then one SQLite
 *              transaction inserts the model.  Any failure unlinks the file.  A crash anywhere
 *              leaves a file that the next open sweeps (store.c).
 * Buffers: per encoder, two blob heads (header to the first chunk boundary in the raw plane: one
 * is filled while the other is written), a source buffer only for small or converted tensors;
 * per import, SLOTS_PER_THREAD chunk buffers per thread and two 1 MiB runs of packed blobs.
 */
#include "import_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

static int pwrite_full(int fd, const uint8_t *p, uint64_t len, uint64_t off) {
  while (len) {
    ssize_t n = pwrite(fd, p, len > (1u << 30) ? (1u << 30) : len, (off_t)off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    p += n, off += (uint64_t)n, len -= (uint64_t)n;
  }
  return 0;
}

static int publish(void *ctx) {
  imp *im = ctx;
  nwc__pub_source *ps = calloc(im->nsrc, sizeof *ps);
  nwc__pub_tensor *pt = calloc(im->njobs, sizeof *pt);
  int rc = ps && pt ? 0 : -ENOMEM;
  for (size_t i = 0; rc == 0 && i < im->nsrc; i++)
    ps[i] = (nwc__pub_source){im->src[i].label, im->src[i].size, im->src[i].mtime_ns,
                              im->src[i].header_xxh3};
  for (size_t i = 0; rc == 0 && i < im->njobs; i++) pt[i] = im->jobs[i].pub;
  uint8_t hdr[NWC__CONTAINER_HEADER];
  nwc__container_header(im->cid, hdr);
  nwc__pub_model m = {im->model, im->o.elem, im->o.layout, ps, im->nsrc, pt, im->njobs,
                      im->cid, im->file_end, XXH3_64bits(hdr, sizeof hdr), NWC_CONTAINER_VERSION};
  if (rc == 0) {
    nwc__lock(im->s);
    rc = nwc__catalog_publish(im->s->db, &m);
    nwc__unlock(im->s);
  }
  free(ps);
  free(pt);
  return rc;
}

static int run(imp *im) {
  nwc__lock(im->s);
  int rc = nwc__catalog_next_container(im->s->db, &im->cid);
  nwc__unlock(im->s);
  NWC_TRY(rc);
  char tmp[32];
  nwc__container_name(im->cid, 1, tmp);
  im->fd = openat(im->s->cdirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
  if (im->fd < 0)
    return nwc__fail(-errno, "%s/containers/%s: cannot create: %s", im->s->dir, tmp,
                     strerror(errno));
  /* O_DIRECT for the large writes: large blobs and runs of packed ones are 4096-aligned in the
   * file and in memory (and their pages disjoint, so buffered and direct writes never share one);
   * a file system that refuses
   * it here (tmpfs) or at the first write gets buffered writes only. */
  im->dfd = openat(im->s->cdirfd, tmp, O_WRONLY | O_CLOEXEC | O_DIRECT);
  uint8_t hdr[NWC__CONTAINER_HEADER];
  nwc__container_header(im->cid, hdr);
  rc = pwrite_full(im->fd, hdr, sizeof hdr, 0);
  im->file_end = NWC__CONTAINER_HEADER;
  if (rc < 0) rc = nwc__fail(rc, "%s/containers/%s: write: %s", im->s->dir, tmp, strerror(-rc));
  if (rc == 0) rc = nwc__imp_encode_all(im);
  if (im->dfd >= 0) close(im->dfd);
  rc = nwc__container_finish(im->s, im->cid, im->fd, rc, publish, im);
  im->fd = im->dfd = -1;
  return rc;
}

static int import_core(nwc_store *s, const char *model, const nwc_st_index *x,
                       const char *index_label, src_file *src, size_t nsrc,
                       const nwc_import_opts *opts) {
  imp im = {0};
  im.s = s;
  im.model = model;
  im.src = src;
  im.nsrc = nsrc;
  im.fd = im.dfd = -1;
  if (opts) im.o = *opts;
  int rc = nwc__imp_plan(&im, x, index_label);
  if (rc == 0) rc = run(&im);
  for (size_t i = 0; rc == 0 && im.o.skipped && i < im.nskips; i++) {
    const nwc_st_tensor *st = im.skips[i].st;
    nwc_import_skip t = {src[im.skips[i].source].label, st->name, st->dtype, st->ndim, st->shape};
    im.o.skipped(im.o.skipped_ctx, &t);
  }
  for (size_t i = 0; i < im.njobs; i++) free(im.jobs[i].pub.checksums);
  free(im.jobs);
  free(im.skips);
  free(im.order);
  free(im.wq);
  for (unsigned k = 0; im.slots && k < im.nslots; k++) free(im.slots[k].p);
  free(im.slots);
  for (int k = 0; k < 2; k++) free(im.pack[k].p);
  free(im.pack_jobs);
  return rc;
}

static int check_common(nwc_store *s, const char *model, const nwc_import_opts *o) {
  NWC_RETURN_IF(!s || !model, -EINVAL, "import: missing argument");
  NWC_RETURN_IF(s->flags & NWC_STORE_RDONLY, -EROFS, "%s: store opened read-only", s->dir);
  NWC_RETURN_IF(!nwc_model_name_valid(model), -EINVAL,
                "model name '%s' does not match [A-Za-z0-9][A-Za-z0-9._-]{0,127}", model);
  NWC_RETURN_IF(o && o->elem != NWC_ELEM_BF16 && o->elem != NWC_ELEM_FP8, -EINVAL,
                "import: elem %u is neither bf16 nor fp8", o->elem);
  NWC_RETURN_IF(o && o->layout > 15, -EINVAL, "import: layout %u out of range", o->layout);
  int64_t id;
  nwc__lock(s);
  int rc = nwc__catalog_model_id(s->db, model, &id);
  nwc__unlock(s);
  NWC_RETURN_IF(rc == 0, -EEXIST, "model '%s' already exists", model);
  return rc == -ENOENT ? 0 : rc;
}

static int open_src(int fd, const char *label, src_file *sf) {
  struct stat st;
  if (fstat(fd, &st) < 0) return nwc__fail(-errno, "%s: fstat", label);
  NWC_RETURN_IF(!S_ISREG(st.st_mode), -EINVAL, "%s: not a regular file", label);
  int rc = nwc_st_read_fd(fd, &sf->f);
  if (rc < 0) return nwc__fail_prefix(rc, "%s", label);
  sf->label = label;
  sf->fd = fd;
  sf->size = (uint64_t)st.st_size;
  sf->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
  sf->header_xxh3 = XXH3_64bits(sf->f->map + 8, sf->f->data_offset - 8);
  return 0;
}

static int read_index(int fd, const char *label, nwc_st_index **x) {
  struct stat st;
  if (fstat(fd, &st) < 0) return nwc__fail(-errno, "%s: fstat", label);
  NWC_RETURN_IF(!S_ISREG(st.st_mode) || st.st_size > (100 << 20), -EBADMSG,
                "%s: not a regular file of at most 100 MB", label);
  uint8_t *buf = malloc((size_t)st.st_size + 1);
  if (!buf) return -ENOMEM;
  int rc = nwc__pread_full(fd, buf, (uint64_t)st.st_size, 0);
  if (rc < 0) rc = nwc__fail(rc, "%s: read", label);
  if (rc == 0) rc = nwc_st_index_parse(buf, (size_t)st.st_size, x);
  if (rc < 0 && rc != -ENOMEM && rc != -EIO) rc = nwc__fail_prefix(rc, "%s", label);
  free(buf);
  return rc;
}

/* Shared by both entry points: files[i] are already open. */
static int import_open(nwc_store *s, const char *model, int index_fd, const char *index_label,
                       const nwc_st_index *x, const nwc_import_file *files, size_t nfiles,
                       const nwc_import_opts *opts) {
  size_t nsrc = x ? x->nshards : 1;
  src_file *src = calloc(nsrc, sizeof *src);
  if (!src) return -ENOMEM;
  int rc = 0;
  (void)index_fd;
  for (size_t i = 0; rc == 0 && i < nsrc; i++) {
    size_t k = 0;
    if (x)
      while (k < nfiles && strcmp(files[k].name ? files[k].name : "", x->shards[i])) k++;
    if (k == nfiles)
      rc = nwc__fail(-ENOENT, "%s: names shard '%s', which is missing", index_label,
                     x->shards[i]);
    else rc = open_src(files[k].fd, files[k].name ? files[k].name : "(file)", &src[i]);
  }
  if (rc == 0 && x && nfiles > nsrc)
    rc = nwc__fail(-EINVAL, "%s: %zu files given for %zu shards", index_label, nfiles, nsrc);
  if (rc == 0) rc = import_core(s, model, x, index_label, src, nsrc, opts);
  for (size_t i = 0; i < nsrc; i++) nwc_st_close(src[i].f);
  free(src);
  return rc;
}

int nwc_store_import_fds(nwc_store *s, const char *model, int index_fd,
                         const nwc_import_file *files, size_t nfiles, const nwc_import_opts *opts) {
  NWC_TRY(check_common(s, model, opts));
  NWC_RETURN_IF(!files || nfiles == 0 || (index_fd < 0 && nfiles != 1), -EINVAL,
                "import: %zu files without an index", nfiles);
  if (index_fd < 0) return import_open(s, model, -1, NULL, NULL, files, 1, opts);
  nwc_st_index *x = NULL;
  int rc = read_index(index_fd, "index", &x);
  if (rc == 0) rc = import_open(s, model, index_fd, "index", x, files, nfiles, opts);
  nwc_st_index_free(x);
  return rc;
}

int nwc_store_import(nwc_store *s, const char *model, const char *path,
                     const nwc_import_opts *opts) {
  NWC_TRY(check_common(s, model, opts));
  NWC_RETURN_IF(!path, -EINVAL, "import: no path");
  size_t len = strlen(path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nwc__fail(-errno, "%s: cannot open: %s", path, strerror(errno));
  if (len < 5 || strcmp(path + len - 5, ".json")) {
    nwc_import_file f = {path, fd};
    int rc = import_open(s, model, -1, NULL, NULL, &f, 1, opts);
    close(fd);
    return rc;
  }
  nwc_st_index *x = NULL;
  int rc = read_index(fd, path, &x);
  close(fd);
  nwc_import_file *files = rc ? NULL : calloc(x->nshards, sizeof *files);
  char **paths = rc ? NULL : calloc(x->nshards, sizeof *paths);
  if (rc == 0 && (!files || !paths)) rc = -ENOMEM;
  const char *slash = strrchr(path, '/');
  int dlen = slash ? (int)(slash - path) : 1;
  const char *dir = slash ? path : ".";
  size_t opened = 0;
  for (size_t i = 0; rc == 0 && i < x->nshards; i++) {
    size_t n = (size_t)dlen + strlen(x->shards[i]) + 2;
    if (!(paths[i] = malloc(n))) {
      rc = -ENOMEM;
      break;
    }
    snprintf(paths[i], n, "%.*s/%s", dlen, dir, x->shards[i]);
    files[i].name = x->shards[i];
    files[i].fd = open(paths[i], O_RDONLY | O_CLOEXEC);
    if (files[i].fd < 0)
      rc = nwc__fail(-errno, "%s: names shard '%s', which is missing (%s)", path, x->shards[i],
                     strerror(errno));
    else opened++;
  }
  if (rc == 0) {
    /* Label each source with its path for messages and the catalog. */
    for (size_t i = 0; i < x->nshards; i++) files[i].name = paths[i];
    for (size_t i = 0; i < x->nshards; i++) {
      free(x->shards[i]);
      x->shards[i] = strdup(paths[i]);
      if (!x->shards[i]) rc = -ENOMEM;
    }
  }
  if (rc == 0) rc = import_open(s, model, -1, path, x, files, x->nshards, opts);
  for (size_t i = 0; i < opened; i++) close(files[i].fd);
  for (size_t i = 0; paths && i < x->nshards; i++) free(paths[i]);
  free(paths);
  free(files);
  nwc_st_index_free(x);
  return rc;
}
