/*
 * blob.c - blobs: HEAD (exists), upload (POST, then one PUT or PATCH chunks and a closing PUT),
 * cross-repository mount, and ranged, resumable download.
 *
 * Upload sessions follow the spec's state machine: POST /v2/REPO/blobs/uploads/ answers 202 with
 * a Location; each PATCH (Content-Range: START-END, inclusive) answers 202 with the Location of
 * the next step (it may change: registry 2.8 puts its state in the query); the closing PUT
 * ?digest= answers 201.  Chunks are read from the caller's offset-addressed read function, so a
 * retried request reads the same bytes again.
 *
 * A download's sink decides from the first 2xx body bytes: a 206 must say it starts at the
 * offset asked for (Content-Range: bytes START-END/TOTAL); a 200 to a ranged request carries the
 * whole blob and the first offset bytes are skipped.
 */
#include "oci_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_digest(const char *digest) {
  NWC_RETURN_IF(!nwc_oci_digest_valid(digest), -EINVAL,
                "digest '%.80s' is not sha256:<64 lowercase hex>", digest ? digest : "(null)");
  return 0;
}

int nwc_oci_blob_exists(nwc_oci *c, const char *digest, uint64_t *size) {
  NWC_TRY(check_digest(digest));
  oci_req q = {.method = "HEAD"};
  int rc = oci__url(c, &q, "/v2/%s/blobs/%s", c->repo, digest);
  if (rc == 0) rc = oci__http_do(c, &q);
  if (rc == 0 && q.status == 200) {
    if (size) *size = q.content_length;
    rc = 1;
  } else if (rc == 0) {
    rc = q.status == 404 ? 0 : oci__http_fail(&q, "blob exists");
  }
  oci__req_clear(&q);
  return rc;
}

/* Starts an upload session (mount_from: asks for a mount first).  Returns 202 with *loc
 * (malloc'ed, resolved), 201 (mounted), or a negative errno. */
static int upload_start(nwc_oci *c, const char *digest, const char *mount_from, char **loc) {
  oci_req q = {.method = "POST", .push = 1};
  int rc = mount_from ? oci__url(c, &q, "/v2/%s/blobs/uploads/?mount=%s&from=%s", c->repo, digest,
                                 mount_from)
                      : oci__url(c, &q, "/v2/%s/blobs/uploads/", c->repo);
  if (rc == 0) rc = oci__http_do(c, &q);
  if (rc == 0 && q.status == 202) {
    rc = (*loc = oci__resolve(c, q.location)) ? 202 : -EBADMSG;
  } else if (rc == 0) {
    rc = q.status == 201 && mount_from ? 201 : oci__http_fail(&q, "blob upload start");
  }
  oci__req_clear(&q);
  return rc;
}

/* Sends bytes [off, off + len) to *loc: a PATCH (digest NULL, expects 202 and moves *loc on) or
 * the closing PUT ?digest= (expects 201). */
static int upload_step(nwc_oci *c, char **loc, const char *digest, uint64_t off, uint64_t len,
                       uint64_t size, nwc_oci_read_fn rd, void *rctx, nwc_oci_progress_fn pg,
                       void *pctx) {
  oci_req q = {.method = digest ? "PUT" : "PATCH", .push = 1, .rd = rd, .rctx = rctx,
               .up_off = off, .up_len = len, .pg = pg, .pctx = pctx, .pg_base = off,
               .pg_total = size};
  size_t n = strlen(*loc) + 96;
  char range[64];
  int rc = (q.url = malloc(n)) ? 0 : -ENOMEM;
  if (rc == 0) {
    if (digest)
      snprintf(q.url, n, "%s%cdigest=%s", *loc, strchr(*loc, '?') ? '&' : '?', digest);
    else
      snprintf(q.url, n, "%s", *loc);
    rc = oci__header(&q, "Content-Type: application/octet-stream");
  }
  if (rc == 0 && len) {
    snprintf(range, sizeof range, "Content-Range: %llu-%llu", (unsigned long long)off,
             (unsigned long long)(off + len - 1));
    rc = oci__header(&q, range);
  }
  if (rc == 0) rc = oci__http_do(c, &q);
  if (rc == 0 && q.status != (digest ? 201 : 202))
    rc = oci__http_fail(&q, digest ? "blob upload" : "blob upload chunk");
  if (rc == 0 && !digest) {
    char *next = oci__resolve(c, q.location);
    rc = next ? 0 : -EBADMSG;
    if (next) free(*loc), *loc = next;
  }
  oci__req_clear(&q);
  return rc;
}

int nwc_oci_blob_push(nwc_oci *c, const char *digest, uint64_t size, nwc_oci_read_fn rd,
                      void *rctx, nwc_oci_progress_fn pg, void *pctx) {
  NWC_TRY(check_digest(digest));
  NWC_RETURN_IF(size && !rd, -EINVAL, "blob push: no read function");
  int rc = nwc_oci_blob_exists(c, digest, NULL);
  if (rc != 0) return rc < 0 ? rc : 0;
  char *loc = NULL;
  NWC_TRY(upload_start(c, digest, NULL, &loc));
  if (size <= c->chunk) {
    rc = upload_step(c, &loc, digest, 0, size, size, rd, rctx, pg, pctx);
  } else {
    for (uint64_t off = 0; off < size && rc == 0; off += c->chunk) {
      uint64_t len = size - off < c->chunk ? size - off : c->chunk;
      rc = upload_step(c, &loc, NULL, off, len, size, rd, rctx, pg, pctx);
    }
    if (rc == 0) rc = upload_step(c, &loc, digest, size, 0, size, rd, rctx, pg, pctx);
  }
  free(loc);
  return rc;
}

int nwc_oci_blob_mount(nwc_oci *c, const char *digest, const char *from_repo) {
  NWC_TRY(check_digest(digest));
  NWC_RETURN_IF(!oci__repo_valid(from_repo), -EINVAL, "blob mount: bad source repository '%.256s'",
                from_repo ? from_repo : "(null)");
  char *loc = NULL;
  c->mount_from = from_repo;
  int rc = upload_start(c, digest, from_repo, &loc);
  c->mount_from = NULL;
  free(loc); /* a 202 opened a session we do not use; the registry expires it */
  return rc < 0 ? rc : rc == 201;
}

/* ---- download ------------------------------------------------------------------------------- */

typedef struct pull_state {
  nwc_oci_write_fn wr;
  void *wctx;
  uint64_t offset, skip, done, total;
  int started;
  nwc_sha256 *h;
} pull_state;

/* Decides at the first body bytes how the reply relates to the range asked for. */
static int pull_start(oci_req *q, pull_state *s) {
  s->started = 1;
  s->total = UINT64_MAX;
  if (q->status == 206) {
    unsigned long long a, b, t;
    int ok = q->content_range && sscanf(q->content_range, "bytes %llu-%llu/%llu", &a, &b, &t) == 3;
    NWC_RETURN_IF(!ok || a != s->offset || b < a || b >= t, -EBADMSG,
                  "blob pull: the registry answered bytes=%llu- with Content-Range '%.80s'",
                  (unsigned long long)s->offset, q->content_range ? q->content_range : "");
    s->total = t;
  } else if (q->status == 200) {
    s->skip = s->offset;
    s->total = q->content_length;
  } else {
    return nwc__fail(-EBADMSG, "blob pull: unexpected HTTP %ld", q->status);
  }
  return 0;
}

static int pull_sink(oci_req *q, const void *p, size_t n) {
  pull_state *s = q->sink_ctx;
  if (!s->started) NWC_TRY(pull_start(q, s));
  size_t k = s->skip < n ? (size_t)s->skip : n;
  s->skip -= k;
  p = (const char *)p + k;
  n -= k;
  if (!n) return 0;
  if (s->h) nwc_sha256_update(s->h, p, n);
  NWC_TRY(s->wr(s->wctx, p, n));
  s->done += n;
  if (q->pg && q->pg(q->pctx, s->offset + s->done, s->total))
    return nwc__fail(-ECANCELED, "blob pull canceled by the progress callback");
  return 0;
}

int nwc_oci_blob_pull(nwc_oci *c, const char *digest, uint64_t offset, int verify,
                      nwc_oci_write_fn wr, void *wctx, nwc_oci_progress_fn pg, void *pctx) {
  NWC_TRY(check_digest(digest));
  NWC_RETURN_IF(!wr, -EINVAL, "blob pull: no write function");
  pull_state s = {.wr = wr, .wctx = wctx, .offset = offset};
  oci_req q = {.method = "GET", .follow = 1, .sink = pull_sink, .sink_ctx = &s, .pg = pg,
               .pctx = pctx};
  int rc = verify && offset == 0 ? nwc_sha256_new(&s.h) : 0;
  if (rc == 0) rc = oci__url(c, &q, "/v2/%s/blobs/%s", c->repo, digest);
  if (rc == 0 && offset) {
    char range[48];
    snprintf(range, sizeof range, "Range: bytes=%llu-", (unsigned long long)offset);
    rc = oci__header(&q, range);
  }
  if (rc == 0) rc = oci__http_do(c, &q);
  if (rc == 0 && q.status != 200 && q.status != 206) rc = oci__http_fail(&q, "blob pull");
  if (rc == 0 && offset && (!s.started || s.skip)) /* a 200 shorter than the offset */
    rc = nwc__fail(-ERANGE, "blob pull: offset %llu is beyond the blob's end",
                   (unsigned long long)offset);
  if (rc == 0 && s.h) {
    char got[73];
    nwc_sha256_final(s.h, got);
    if (strcmp(got, digest))
      rc = nwc__fail(-EBADMSG, "blob pull: the bytes of %s hash to %s", digest, got);
  }
  nwc_sha256_free(s.h);
  oci__req_clear(&q);
  return rc;
}
