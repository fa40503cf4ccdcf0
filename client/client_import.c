/*
 * client_import.c - libnwc-client's import: a safetensors file (or a sharded model's index and
 * shards) passed to nwcd as open descriptors, progress events on the way, the tensors it
 * skipped in the reply.
 */
#include "client_internal.h"
#include "nwc_client.h"
#include "nwc.h" /* NWC_LAYOUT_AUTO, which the client's constant passes on */

#include "nwc_proto.h"
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The list of an import2 reply after its result, into *out (malloc'ed; NULL when empty). */
static int get_skipped(nwc_pr *r, nwc_client_skipped **out, size_t *n) {
  uint32_t k = nwc_pr_u32(r);
  if (r->err || k > NWC_PROTO_MAX_SKIPPED) return nwc__client_bad_reply();
  nwc_client_skipped *v = k && out ? calloc(k, sizeof *v) : NULL;
  if (k && out && !v) return nwc__client_fail(-ENOMEM, "out of memory");
  int rc = 0;
  for (uint32_t i = 0; i < k && rc == 0; i++) {
    nwc_proto_skipped s;
    if ((rc = nwc_proto_get_skipped(r, &s)) < 0 || !v) continue;
    _Static_assert(sizeof v->name == sizeof s.name && sizeof v->dtype == sizeof s.dtype, "names");
    memcpy(v[i].name, s.name, sizeof s.name);
    memcpy(v[i].dtype, s.dtype, sizeof s.dtype);
    v[i].ndim = s.ndim;
    memcpy(v[i].shape, s.shape, sizeof s.shape);
  }
  if (rc < 0 || nwc_pr_end(r, "import2") < 0) {
    free(v);
    return nwc__client_bad_reply();
  }
  if (out) *out = v, *n = k;
  return 0;
}

static const char *file_kind(mode_t m) {
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  return S_ISSOCK(m) ? "a socket" : "a special file";
}

/* Opens a source file for reading (what: "" or "shard "): a regular file only, checked before
 * the open (a FIFO would block it forever) and again on the descriptor (the path may have been
 * replaced between the two; O_NONBLOCK keeps that open from blocking).  The descriptor, or a
 * negative errno with the client's detail set. */
static int open_source(const char *path, const char *what) {
  struct stat st;
  if (stat(path, &st) < 0)
    return nwc__client_fail(-errno, "cannot open %s%s: %s", what, path, strerror(errno));
  int fd = S_ISREG(st.st_mode) ? open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK) : -2;
  if (fd == -1)
    return nwc__client_fail(-errno, "cannot open %s%s: %s", what, path, strerror(errno));
  if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))) close(fd), fd = -2;
  if (fd == -2)
    return nwc__client_fail(-EINVAL, "%s%s is not a regular file (%s); import reads files",
                            what, path, file_kind(st.st_mode));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

_Static_assert(NWC_CLIENT_LAYOUT_AUTO == NWC_LAYOUT_AUTO, "the import's auto layout, on both sides");

/* import2 where the daemon has it (capability 256), else import, which is all or nothing. */
static int do_import(nwc_client *c, const char *model, const char *path,
                     const nwc_client_import_opts *o, unsigned flags, nwc_client_result *res,
                     nwc_client_skipped **skipped, size_t *nskipped) {
  nwc_proto_req req = {0};
  bool v2 = c->hello.caps & NWC_CAP_IMPORT2;
  nwc__client_names(&req, v2 ? NWC_OP_IMPORT2 : NWC_OP_IMPORT, model, NULL);
  req.elem = (uint8_t)(o ? o->elem : 0), req.layout = (uint8_t)(o ? o->layout : 0);
  req.import_flags = flags & NWC_CLIENT_IMPORT_STRICT ? NWC_IMPORT_STRICT : 0;
  size_t plen = strlen(path);
  bool index = plen > 5 && !strcmp(path + plen - 5, ".json");
  int fds[NWC_PROTO_MAX_FILES + 1];
  unsigned nfds = 0;
  char *names[NWC_PROTO_MAX_FILES];
  int rc = 0;
  int fd = open_source(path, "");
  if (fd < 0) return fd;
  fds[nfds++] = fd;
  if (!index) {
    const char *base = strrchr(path, '/');
    names[0] = strdup(base ? base + 1 : path);
    req.nfiles = 1;
  } else {
    req.has_index = 1;
    struct stat st;
    uint8_t *buf = NULL;
    nwc_st_index *x = NULL;
    if (fstat(fd, &st) < 0 || st.st_size > (64 << 20) || !(buf = malloc((size_t)st.st_size + 1)) ||
        pread(fd, buf, (size_t)st.st_size, 0) != st.st_size) {
      rc = nwc__client_fail(-EIO, "cannot read the index %s", path);
    } else if (nwc_st_index_parse(buf, (size_t)st.st_size, &x) < 0) {
      rc = nwc__client_fail(-EBADMSG, "%s: %s", path, nwc_error_detail());
    } else if (x->nshards > NWC_PROTO_MAX_FILES) {
      rc = nwc__client_fail(-E2BIG, "%s names %zu shards (at most %u)", path, x->nshards,
                            NWC_PROTO_MAX_FILES);
    }
    free(buf);
    const char *slash = strrchr(path, '/');
    int dlen = slash ? (int)(slash - path) : 1;
    for (size_t i = 0; rc == 0 && i < x->nshards; i++) {
      char p[PATH_MAX];
      snprintf(p, sizeof p, "%.*s/%s", dlen, slash ? path : ".", x->shards[i]);
      int sfd = open_source(p, "shard ");
      if (sfd < 0) {
        rc = sfd;
        break;
      }
      fds[nfds++] = sfd;
      names[req.nfiles++] = strdup(x->shards[i]);
    }
    nwc_st_index_free(x);
  }
  if (rc == 0) {
    req.files = names;
    size_t len;
    rc = nwc__client_request(c, &req, fds, nfds, o ? o->progress : NULL, o ? o->ctx : NULL, &len);
    nwc_pr r;
    if (rc == 0) rc = nwc__client_result(c, len, res, &r);
    if (rc == 0)
      rc = v2                             ? get_skipped(&r, skipped, nskipped)
           : nwc_pr_end(&r, "import") < 0 ? nwc__client_bad_reply()
                                          : 0;
    req.files = NULL;
  }
  for (unsigned i = 0; i < req.nfiles; i++) free(names[i]);
  for (unsigned i = 0; i < nfds; i++) close(fds[i]);
  return rc;
}

int nwc_client_import2(nwc_client *c, const char *model, const char *path,
                       const nwc_client_import_opts *opts, unsigned flags, nwc_client_result *res,
                       nwc_client_skipped **skipped, size_t *nskipped) {
  if (nwc__client_check_names(model, NULL) < 0 || !path || (skipped && !nskipped) ||
      (flags & ~NWC_CLIENT_IMPORT_STRICT))
    return nwc__client_fail(-EINVAL, "bad arguments");
  if (skipped) *skipped = NULL, *nskipped = 0;
  return LOCKED(c, do_import(c, model, path, opts, flags, res, skipped, nskipped));
}

int nwc_client_import(nwc_client *c, const char *model, const char *path,
                      const nwc_client_import_opts *opts, nwc_client_result *res) {
  return nwc_client_import2(c, model, path, opts, 0, res, NULL, NULL);
}
