/*
 * oci_internal.h - what the files of oci/ share (not installed): the handle, one HTTP exchange
 * (oci_req: what goes out, where the reply's body goes, what came back), the request runner
 * with auth (http.c) and the one-time library setup.
 *
 * Invariant: an oci_req's reply strings (location, www_auth, ...) and its small body buffer are
 * owned by the req and freed by oci_req_clear; oci_http_do resets them before each attempt, so
 * after it returns they describe the last response only.
 */
#ifndef NWC_OCI_INTERNAL_H
#define NWC_OCI_INTERNAL_H

#include "nwc_oci.h"

#include "nwc_error.h"

#include <curl/curl.h>

#define OCI_MAX_HEADERS (64u << 10) /* header bytes of one response */
#define OCI_MAX_SMALL (64u << 10)   /* error and token bodies */

struct nwc_oci {
  CURL *curl;
  char *base; /* "https://host[:port]" */
  char *host; /* host[:port] */
  char *repo;
  char *user, *secret; /* both or neither */
  char *auth;          /* cached "Authorization: ..." header line, or NULL */
  int bearer;          /* auth holds a token (refreshable) */
  int push_scope;      /* the token was (or will be) asked with pull,push */
  const char *mount_from; /* during a mount: the source repository, pulled too */
  uint64_t chunk;
  long stall_s;
  unsigned flags;
};

/* A growable byte buffer with a hard bound. */
typedef struct oci_buf {
  char *p;
  size_t len, cap, max;
} oci_buf;

typedef struct oci_req {
  /* the request */
  const char *method; /* GET HEAD PUT POST PATCH DELETE */
  char *url;          /* owned */
  struct curl_slist *headers;
  int follow;    /* follow redirects (blob GET only) */
  int push;      /* the request needs push rights */
  const void *body; /* in-memory body (body_len bytes), or rd below */
  size_t body_len;
  nwc_oci_read_fn rd;
  void *rctx;
  uint64_t up_off, up_len; /* rd: bytes [up_off, up_off + up_len) */
  uint64_t up_done;
  /* where a 2xx body goes: sink (with skip) or the buffer `small` (max bytes) */
  int (*sink)(struct oci_req *q, const void *p, size_t n);
  void *sink_ctx;
  size_t small_max;
  nwc_oci_progress_fn pg;
  void *pctx;
  uint64_t pg_base, pg_total;
  /* the reply */
  long status;
  char *location, *www_auth, *content_type, *docker_digest, *content_range;
  uint64_t content_length; /* UINT64_MAX if none */
  size_t header_bytes;
  oci_buf small; /* a 2xx body without sink, or any error body */
  int cb_err;    /* a callback's negative errno */
} oci_req;

/* Appends n bytes and keeps a NUL after them (the bound is the caller's). Returns 0 or -ENOMEM. */
int oci__buf_append(oci_buf *b, const void *p, size_t n);

/* The value of parameter key in a WWW-Authenticate challenge's "k=v, k=\"v\"" list (bytes from
 * the network; tests/fuzz/fuzz_oci_challenge.c), malloc'ed, or NULL. */
char *oci__challenge_param(const char *s, const char *key);
/* Sets q->url to base + the printf-formatted path. Returns 0 or -ENOMEM. */
int oci__url(nwc_oci *c, oci_req *q, const char *fmt, ...) NWC__PRINTF(3, 4);
/* Adds a header line. Returns 0 or -ENOMEM. */
int oci__header(oci_req *q, const char *line);
/* Runs q (with auth: retries after a 401 as nwc_oci.h describes).  Returns 0 with q->status set
 * whatever the status, or a negative errno for a transport or callback failure. */
int oci__http_do(nwc_oci *c, oci_req *q);
/* The errno for q's non-2xx status with the message "WHAT: HTTP N CODE: message". */
int oci__http_fail(const oci_req *q, const char *what);
void oci__req_clear(oci_req *q);

/* 1 if tag matches [A-Za-z0-9_][A-Za-z0-9._-]{0,127}. */
int oci__tag_valid(const char *tag);
/* 1 if repo is a valid repository path (a/b/c of the reference grammar). */
int oci__repo_valid(const char *repo);
/* Resolves a Location header against c->base; malloc'ed or NULL (-EBADMSG recorded). */
char *oci__resolve(nwc_oci *c, const char *location);

#endif
