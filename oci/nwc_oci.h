/*
 * nwc_oci.h - a small OCI distribution client (issue 25: `nwcctl push/pull` ship a stored model as
 * an OCI v1.1 artifact through any registry).  It speaks the distribution spec's HTTP API: blobs
 * (HEAD, chunked or single-PUT upload, ranged download), manifests (GET/PUT by tag or digest),
 * auth (Basic, Bearer tokens), and reads credentials as docker and podman keep them.  What the
 * config and layers contain is the store's business, not this library's.
 *
 * Libraries: libcurl (HTTP), jansson (JSON), libgcrypt (sha256), and OpenSSL's libcrypto for
 * base64 only (EVP_DecodeUpdate: libgcrypt has no public base64, libcurl none, and libcurl4-openssl
 * already loads libcrypto into the process; no hand-written decoder).
 *
 * Conventions: every fallible call returns 0 (or a count) or a negative errno, and
 * nwc_oci_last_error() says what failed (HTTP status, the registry's errors[0].code and message,
 * or curl's text).  Errors: -EINVAL bad argument or reference; -EACCES 401/403 after auth;
 * -ENOENT 404, MANIFEST_UNKNOWN, BLOB_UNKNOWN; -EIO 5xx and other unexpected statuses (the
 * status in the message); -EBADMSG a digest mismatch or malformed reply; -EMSGSIZE a reply above
 * its bound; -ECONNREFUSED, -ETIMEDOUT (connect timeout, or a transfer stalled below 1 KiB/s
 * for 30 s), -ECONNRESET (the connection dropped mid-transfer), -EHOSTUNREACH (name not
 * resolved), -EPROTO (TLS failure); -ECANCELED a progress callback asked to stop; a callback's
 * own negative errno is returned as it is.  A call that fails after a callback ran may have
 * called it (a pull's write callback has then taken some bytes: resume from there).
 *
 * Everything from the network is untrusted: headers are bounded (64 KiB a response), manifests
 * at 4 MiB (the spec's suggestion), error and token bodies at 64 KiB; digests and tags are
 * checked before they go into a URL; redirects are followed only for blob downloads (http/https
 * only, at most 5, Authorization dropped on a cross-host hop, libcurl's default).
 *
 * Threads: a handle (nwc_oci) is one registry + repository and one curl easy handle: use it from
 * one thread at a time and open several for parallel blobs.  Everything else is thread-safe.
 *
 * skopeo 1.9 (tests/test_oci.c checks it; docs/oci.md has the details): `skopeo inspect --raw`
 * and `skopeo copy docker://A docker://B` handle an OCI v1.1 artifact whose config has its own
 * media type (e.g. application/vnd.nwc.config.v1+json) and an artifactType: the manifest bytes
 * (and digest) and every blob arrive unchanged, no --preserve-digests needed.  Only `skopeo
 * inspect` without --raw (and --config) refuse it ("unsupported image-specific operation on
 * artifact with type ..."); they accept application/vnd.oci.image.config.v1+json, parsing the
 * config as an image config.
 */
#ifndef NWC_OCI_H
#define NWC_OCI_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef NWC_EXTERN
#if defined(__GNUC__)
#define NWC_EXTERN __attribute__((visibility("default")))
#else
#define NWC_EXTERN
#endif
#endif

/* Media types the client knows (the caller may PUT any). */
#define NWC_OCI_MT_MANIFEST "application/vnd.oci.image.manifest.v1+json"
#define NWC_OCI_MT_INDEX "application/vnd.oci.image.index.v1+json"
#define NWC_OCI_MT_DOCKER_MANIFEST "application/vnd.docker.distribution.manifest.v2+json"
#define NWC_OCI_MT_IMAGE_CONFIG "application/vnd.oci.image.config.v1+json"
#define NWC_OCI_MAX_MANIFEST (4u << 20)
#define NWC_OCI_DEFAULT_CHUNK (64u << 20)

/* ---- references ----------------------------------------------------------------------------- */

/* A parsed reference; every string malloc'ed, freed by nwc_oci_ref_free. */
typedef struct nwc_oci_ref {
  char *registry;   /* host[:port] (an IPv6 host in brackets) */
  char *repository; /* path components, lowercase, per the distribution spec */
  char *tag;        /* NULL if none */
  char *digest;     /* "sha256:<64 hex>" or NULL */
} nwc_oci_ref;

/* Parses "host[:port]/repo/path[:tag][@sha256:hex]".  No tag and no digest gives tag "latest".
 * The first component must contain '.' or ':' or be "localhost" (docker's rule for a registry
 * host); repository components match [a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*, a tag
 * [A-Za-z0-9_][A-Za-z0-9._-]{0,127}, the whole name at most 255 bytes.  Returns 0, -EINVAL (with
 * a message) or -ENOMEM; on failure *out is zeroed. */
NWC_EXTERN int nwc_oci_ref_parse(const char *text, nwc_oci_ref *out);
/* Frees the strings and zeroes *r; NULL is a no-op. */
NWC_EXTERN void nwc_oci_ref_free(nwc_oci_ref *r);

/* Thread-local text of this thread's last failure (never NULL; valid until the next call). */
NWC_EXTERN const char *nwc_oci_last_error(void);

/* 1 if digest is "sha256:" and 64 lowercase hex digits, else 0. */
NWC_EXTERN int nwc_oci_digest_valid(const char *digest);

/* ---- credentials ---------------------------------------------------------------------------- */

/*
 * Credentials for registry (host[:port]) as podman and docker keep them, first found wins:
 * $REGISTRY_AUTH_FILE, $XDG_RUNTIME_DIR/containers/auth.json, ~/.config/containers/auth.json,
 * then $DOCKER_CONFIG/config.json (or ~/.docker/config.json).  In a file: credHelpers[registry]
 * (runs `docker-credential-NAME get` with the registry on stdin and reads {Username, Secret}),
 * then auths[registry] ("auth": base64 of user:password; "identitytoken" when set replaces the
 * password), then credsStore (a helper for every registry).  Keys in auths may carry a scheme
 * and a path ("https://host/v1/"); docker.io also matches https://index.docker.io/v1/.
 * Returns 0 with *user and *secret malloc'ed (the caller frees both), -ENOENT when none is
 * found, or a negative errno for a malformed file or a failed helper (the message names it).
 */
NWC_EXTERN int nwc_oci_credentials(const char *registry, char **user, char **secret);

/* ---- the client ----------------------------------------------------------------------------- */

typedef struct nwc_oci nwc_oci;

#define NWC_OCI_PLAIN_HTTP 1u /* http:// instead of https:// (tests, --insecure) */

/* Opens a client for ref's registry and repository (tag and digest are not used).  user and
 * secret (both or neither; copied) are sent as Basic credentials to the registry when it asks
 * for Basic, or to its token service when it asks for Bearer.  Connects lazily: the first
 * request does.  https verifies the peer unless NWC_OCI_PLAIN_HTTP.  Returns 0 and *out (free
 * with nwc_oci_close), -EINVAL or -ENOMEM. */
NWC_EXTERN int nwc_oci_open(const nwc_oci_ref *ref, const char *user, const char *secret,
                            unsigned flags, nwc_oci **out);
/* Closes the connection and frees the handle; NULL is a no-op. */
NWC_EXTERN void nwc_oci_close(nwc_oci *c);

/* Bytes per PATCH of a chunked upload (default NWC_OCI_DEFAULT_CHUNK; at least 4096); blobs of
 * at most this size go up in one PUT.  Returns 0 or -EINVAL. */
NWC_EXTERN int nwc_oci_set_chunk(nwc_oci *c, uint64_t bytes);
/* A transfer below 1 KiB/s for this many seconds fails with -ETIMEDOUT (default 30, 1..3600).
 * Returns 0 or -EINVAL. */
NWC_EXTERN int nwc_oci_set_stall_timeout(nwc_oci *c, unsigned seconds);

/*
 * Auth (the distribution spec): a request goes out with the handle's cached Authorization; on a
 * 401 the WWW-Authenticate challenge decides: Basic sends the handle's credentials; Bearer
 * realm=,service= gets a token from realm?service=&scope=repository:REPO:pull (pull,push once
 * the handle has pushed; with the credentials as Basic when it has them), reads "token" or
 * "access_token", and retries with it.  The token is cached on the handle; a later 401 fetches a
 * fresh one once.  A 401 or 403 after that is -EACCES.
 */

/* 1 if the blob exists (HEAD 200; *size, if not NULL, gets its Content-Length), 0 if not (404),
 * or a negative errno. */
NWC_EXTERN int nwc_oci_blob_exists(nwc_oci *c, const char *digest, uint64_t *size);

/* Fills buf with up to len bytes of the blob from offset; returns the count, 0 at the end, or a
 * negative errno (which aborts the upload and is returned). */
typedef ssize_t (*nwc_oci_read_fn)(void *ctx, uint64_t offset, void *buf, size_t len);
/* Takes the next len bytes; a negative errno aborts the download and is returned. */
typedef int (*nwc_oci_write_fn)(void *ctx, const void *buf, size_t len);
/* Reports progress; nonzero aborts with -ECANCELED. */
typedef int (*nwc_oci_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/*
 * Uploads size bytes that hash to digest (the caller hashed them; the registry checks).  Returns
 * 0 at once, without calling rd or pg, when the blob exists already.  Otherwise POST
 * /v2/REPO/blobs/uploads/, then one PUT ?digest= with the bytes when size <= the chunk size, or
 * PATCHes of a chunk each (Content-Range, each to the Location the previous reply gave) and a
 * closing PUT ?digest=.  rd may be called for the same offset again (a retry after a 401).  pg
 * (may be NULL) sees the bytes sent.  A failed upload leaves nothing in the repository (the
 * registry drops the session later).  Returns 0 or a negative errno (-EBADMSG: the registry
 * found another digest).
 */
NWC_EXTERN int nwc_oci_blob_push(nwc_oci *c, const char *digest, uint64_t size, nwc_oci_read_fn rd,
                                 void *rctx, nwc_oci_progress_fn pg, void *pctx);

/* Asks the registry to mount digest from repository from_repo of the same registry (no bytes
 * move).  Returns 1 when mounted, 0 when the registry declined (push the bytes then), or a
 * negative errno. */
NWC_EXTERN int nwc_oci_blob_mount(nwc_oci *c, const char *digest, const char *from_repo);

/*
 * Downloads the blob from byte offset into wr: "Range: bytes=OFFSET-" (a 206 must start at
 * offset; a 200 to a ranged request means the server ignored the range, and the first offset
 * bytes are skipped), following redirects (a 307 to storage).  With verify set and offset 0 it
 * hashes the bytes as they pass and returns -EBADMSG when they do not match digest (wr has taken
 * them all by then); otherwise it does not check the digest (the store does, with its own
 * resumable state).  pg (may be NULL) sees done = bytes from the blob's start.  An offset at or
 * beyond the end is -ERANGE (exactly at the end, a server that ignores ranges gives 0).  Returns
 * 0 or a negative errno.
 */
NWC_EXTERN int nwc_oci_blob_pull(nwc_oci *c, const char *digest, uint64_t offset, int verify,
                                 nwc_oci_write_fn wr, void *wctx, nwc_oci_progress_fn pg,
                                 void *pctx);

/*
 * GETs a manifest (Accept: OCI manifest, OCI index, docker v2 manifest) by tag or digest, at most
 * NWC_OCI_MAX_MANIFEST bytes.  *body (malloc'ed, NUL-terminated after len bytes), *media_type
 * (malloc'ed, Content-Type without parameters; NULL-able argument) and digest_out (the body's
 * sha256; NULL-able) are set on success, and the caller frees body and media_type.  By digest,
 * a body of another hash is -EBADMSG; by tag, so is a Docker-Content-Digest header that
 * disagrees with the body.  Returns 0 or a negative errno.
 */
NWC_EXTERN int nwc_oci_manifest_get(nwc_oci *c, const char *tag_or_digest, char **body, size_t *len,
                                    char **media_type, char digest_out[73]);
/* PUTs a manifest of media_type under tag (a tag, or the body's digest); digest_out (NULL-able)
 * gets the body's sha256.  Returns 0 or a negative errno (-EINVAL: the registry rejected it as
 * invalid, e.g. a blob it names is missing; the message has the registry's words). */
NWC_EXTERN int nwc_oci_manifest_put(nwc_oci *c, const char *tag, const char *media_type,
                                    const void *body, size_t len, char digest_out[73]);

/* ---- sha256 (libgcrypt) ---------------------------------------------------------------------- */

typedef struct nwc_sha256 nwc_sha256;
/* A fresh hash state (free with nwc_sha256_free).  Returns 0 or -ENOMEM. */
NWC_EXTERN int nwc_sha256_new(nwc_sha256 **out);
NWC_EXTERN void nwc_sha256_update(nwc_sha256 *h, const void *p, size_t n);
/* Writes "sha256:<64 hex>" and NUL; the state is reset for reuse. */
NWC_EXTERN void nwc_sha256_final(nwc_sha256 *h, char digest_out[73]);
NWC_EXTERN void nwc_sha256_free(nwc_sha256 *h);
/* The digest of a buffer in one call. */
NWC_EXTERN void nwc_sha256_buf(const void *p, size_t n, char digest_out[73]);

#ifdef __cplusplus
}
#endif

#endif /* NWC_OCI_H */
