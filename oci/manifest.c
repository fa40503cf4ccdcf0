/*
 * manifest.c - manifests: GET by tag or digest (the body's sha256 checked against the digest
 * asked for and against Docker-Content-Digest), PUT under a tag or a digest.
 *
 * Bodies are opaque bytes here: the digest is the hash of exactly the bytes sent or received
 * (never of a re-serialized JSON), and the media type travels in Content-Type.  A body is at most
 * NWC_OCI_MAX_MANIFEST bytes both ways.
 */
#include "oci_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ACCEPT                                                                                   \
  "Accept: " NWC_OCI_MT_MANIFEST ", " NWC_OCI_MT_INDEX ", " NWC_OCI_MT_DOCKER_MANIFEST            \
  ", application/vnd.docker.distribution.manifest.list.v2+json"

static int check_ref(const char *ref) {
  NWC_RETURN_IF(!ref || (!nwc_oci_digest_valid(ref) && !oci__tag_valid(ref)), -EINVAL,
                "manifest: '%.140s' is neither a tag nor a sha256 digest", ref ? ref : "(null)");
  return 0;
}

/* The media type of a GET: Content-Type without parameters, else the body's "mediaType". */
static char *media_type_of(const oci_req *q) {
  if (q->content_type && *q->content_type)
    return strndup(q->content_type, strcspn(q->content_type, "; \t"));
  json_error_t je;
  json_t *j = json_loadb(q->small.p, q->small.len, 0, &je);
  const char *mt = json_string_value(json_object_get(j, "mediaType"));
  char *r = strdup(mt ? mt : "");
  json_decref(j);
  return r;
}

/* Checks the body of q against the digest asked for (ref) and the registry's header. */
static int check_body(const oci_req *q, const char *ref, char d[73]) {
  NWC_RETURN_IF(!q->small.len, -EBADMSG, "manifest %.140s: empty body", ref);
  nwc_sha256_buf(q->small.p, q->small.len, d);
  NWC_RETURN_IF(nwc_oci_digest_valid(ref) && strcmp(d, ref), -EBADMSG,
                "manifest %s: the body hashes to %s", ref, d);
  NWC_RETURN_IF(q->docker_digest && nwc_oci_digest_valid(q->docker_digest) &&
                    strcmp(d, q->docker_digest),
                -EBADMSG, "manifest %.140s: the body hashes to %s, the registry says %s", ref, d,
                q->docker_digest);
  return 0;
}

int nwc_oci_manifest_get(nwc_oci *c, const char *ref, char **body, size_t *len, char **media_type,
                         char digest_out[73]) {
  *body = NULL;
  *len = 0;
  if (media_type) *media_type = NULL;
  NWC_TRY(check_ref(ref));
  oci_req q = {.method = "GET", .small_max = NWC_OCI_MAX_MANIFEST};
  char d[73];
  int rc = oci__url(c, &q, "/v2/%s/manifests/%s", c->repo, ref);
  if (rc == 0) rc = oci__header(&q, ACCEPT);
  if (rc == 0) rc = oci__http_do(c, &q);
  if (rc == 0 && q.status != 200) rc = oci__http_fail(&q, "manifest get");
  if (rc == 0) rc = check_body(&q, ref, d);
  if (rc == 0 && media_type && !(*media_type = media_type_of(&q))) rc = -ENOMEM;
  if (rc == 0) {
    *body = q.small.p; /* NUL-terminated by oci__buf_append */
    *len = q.small.len;
    q.small.p = NULL;
    if (digest_out) memcpy(digest_out, d, 73);
  }
  oci__req_clear(&q);
  return rc;
}

int nwc_oci_manifest_put(nwc_oci *c, const char *tag, const char *media_type, const void *body,
                         size_t len, char digest_out[73]) {
  NWC_TRY(check_ref(tag));
  NWC_RETURN_IF(!body || !len || len > NWC_OCI_MAX_MANIFEST, -EINVAL,
                "manifest put: a body of %zu bytes (1 to %u)", len, NWC_OCI_MAX_MANIFEST);
  size_t mn = media_type ? strlen(media_type) : 0;
  NWC_RETURN_IF(!mn || mn > 255 || strcspn(media_type, "\r\n;, \t") != mn, -EINVAL,
                "manifest put: bad media type '%.80s'", media_type ? media_type : "(null)");
  char d[73], ct[300];
  nwc_sha256_buf(body, len, d);
  NWC_RETURN_IF(nwc_oci_digest_valid(tag) && strcmp(tag, d), -EINVAL,
                "manifest put: the body hashes to %s, not %s", d, tag);
  snprintf(ct, sizeof ct, "Content-Type: %s", media_type);
  oci_req q = {.method = "PUT", .push = 1, .body = body, .up_len = len};
  int rc = oci__url(c, &q, "/v2/%s/manifests/%s", c->repo, tag);
  if (rc == 0) rc = oci__header(&q, ct);
  if (rc == 0) rc = oci__http_do(c, &q);
  if (rc == 0 && q.status != 201) rc = oci__http_fail(&q, "manifest put");
  if (rc == 0 && q.docker_digest && nwc_oci_digest_valid(q.docker_digest) &&
      strcmp(q.docker_digest, d))
    rc = nwc__fail(-EBADMSG, "manifest put: the registry stored %s for a body of digest %s",
                   q.docker_digest, d);
  if (rc == 0 && digest_out) memcpy(digest_out, d, 73);
  oci__req_clear(&q);
  return rc;
}
