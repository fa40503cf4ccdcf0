/*
 * http.c - the handle and one HTTP exchange with the registry through libcurl: options, bounded
 * headers and bodies, the auth dance of the distribution spec, and the mapping of curl codes and
 * HTTP statuses to negative errno values.
 *
 * One exchange (oci__http_do) is at most two attempts: (1) with the handle's cached auth; (2)
 * after a 401, with what its WWW-Authenticate asked for (Basic: the handle's credentials through
 * curl; Bearer: a fresh token from the realm, replacing a cached one that was refused: the one
 * refresh).  A push drops a cached pull-only token first, so that its 401 asks for pull,push.  A
 * reply's status is the caller's to judge (oci__http_fail); only transport and callback failures
 * are errors here.  Every attempt starts from curl_easy_reset (options never leak from one
 * request into the next; the connection stays open) and sends Authorization only to the
 * registry's own origin: an upload Location or a redirect elsewhere gets none.
 */
#include "oci_internal.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_TOKEN (16u << 10)

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

int nwc_oci_open(const nwc_oci_ref *ref, const char *user, const char *secret, unsigned flags,
                 nwc_oci **out) {
  *out = NULL;
  NWC_RETURN_IF(!ref || !ref->registry || !ref->repository, -EINVAL, "nwc_oci_open: no reference");
  NWC_RETURN_IF(!user != !secret, -EINVAL, "nwc_oci_open: a user without a secret or the reverse");
  NWC_RETURN_IF(flags & ~NWC_OCI_PLAIN_HTTP, -EINVAL, "nwc_oci_open: unknown flags %#x", flags);
  pthread_once(&curl_once, curl_init);
  nwc_oci *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  c->chunk = NWC_OCI_DEFAULT_CHUNK;
  c->stall_s = 30;
  c->flags = flags;
  c->curl = curl_easy_init();
  c->host = strdup(ref->registry);
  c->repo = strdup(ref->repository);
  if (user) {
    c->user = strdup(user);
    c->secret = strdup(secret);
  }
  size_t blen = strlen(ref->registry) + 9;
  if ((c->base = malloc(blen)))
    snprintf(c->base, blen, "%s://%s", flags & NWC_OCI_PLAIN_HTTP ? "http" : "https", ref->registry);
  if (!c->curl || !c->host || !c->repo || !c->base || (user && (!c->user || !c->secret))) {
    nwc_oci_close(c);
    return nwc__fail(-ENOMEM, "nwc_oci_open: out of memory");
  }
  *out = c;
  return 0;
}

void nwc_oci_close(nwc_oci *c) {
  if (!c) return;
  if (c->curl) curl_easy_cleanup(c->curl);
  if (c->secret) memset(c->secret, 0, strlen(c->secret));
  if (c->auth) memset(c->auth, 0, strlen(c->auth));
  free(c->base);
  free(c->host);
  free(c->repo);
  free(c->user);
  free(c->secret);
  free(c->auth);
  free(c);
}

int nwc_oci_set_chunk(nwc_oci *c, uint64_t bytes) {
  NWC_RETURN_IF(bytes < 4096 || bytes > (UINT64_C(1) << 40), -EINVAL, "chunk of %llu bytes",
                (unsigned long long)bytes);
  c->chunk = bytes;
  return 0;
}

int nwc_oci_set_stall_timeout(nwc_oci *c, unsigned seconds) {
  NWC_RETURN_IF(seconds < 1 || seconds > 3600, -EINVAL, "stall timeout of %u s", seconds);
  c->stall_s = seconds;
  return 0;
}

int oci__url(nwc_oci *c, oci_req *q, const char *fmt, ...) {
  char path[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(path, sizeof path, fmt, ap);
  va_end(ap);
  NWC_RETURN_IF(n < 0 || (size_t)n >= sizeof path, -EINVAL, "URL path too long");
  free(q->url);
  size_t len = strlen(c->base) + (size_t)n + 1;
  if (!(q->url = malloc(len))) return -ENOMEM;
  snprintf(q->url, len, "%s%s", c->base, path);
  return 0;
}

int oci__header(oci_req *q, const char *line) {
  struct curl_slist *l = curl_slist_append(q->headers, line);
  if (!l) return -ENOMEM;
  q->headers = l;
  return 0;
}

char *oci__resolve(nwc_oci *c, const char *loc) {
  if (!loc || !*loc) return nwc__fail(-EBADMSG, "registry reply without a Location"), NULL;
  for (const char *p = loc; *p; p++)
    if ((unsigned char)*p <= ' ' || *p == 0x7f)
      return nwc__fail(-EBADMSG, "registry Location with a control character or space"), NULL;
  if (!strncmp(loc, "http://", 7) || !strncmp(loc, "https://", 8)) return strdup(loc);
  if (loc[0] != '/' || loc[1] == '/')
    return nwc__fail(-EBADMSG, "registry Location '%.200s' is neither absolute nor a path", loc),
           NULL;
  size_t n = strlen(c->base) + strlen(loc) + 1;
  char *u = malloc(n);
  if (u) snprintf(u, n, "%s%s", c->base, loc);
  return u;
}

static void reply_reset(oci_req *q) {
  free(q->location);
  free(q->www_auth);
  free(q->content_type);
  free(q->docker_digest);
  free(q->content_range);
  q->location = q->www_auth = q->content_type = q->docker_digest = q->content_range = NULL;
  q->content_length = UINT64_MAX;
  q->status = 0;
  q->small.len = 0;
}

void oci__req_clear(oci_req *q) {
  reply_reset(q);
  free(q->url);
  curl_slist_free_all(q->headers);
  free(q->small.p);
  memset(q, 0, sizeof *q);
}

/* ---- curl callbacks -------------------------------------------------------------------------- */

static size_t on_header(char *p, size_t size, size_t nmemb, void *ud) {
  oci_req *q = ud;
  size_t n = size * nmemb;
  q->header_bytes += n;
  if (q->header_bytes > OCI_MAX_HEADERS) {
    q->cb_err = nwc__fail(-EMSGSIZE, "%s %s: reply headers over %u bytes", q->method, q->url,
                          OCI_MAX_HEADERS);
    return 0;
  }
  if (n > 5 && !memcmp(p, "HTTP/", 5)) { /* a new response (after a redirect or a 100) */
    reply_reset(q);
    const char *sp = memchr(p, ' ', n);
    q->status = sp ? strtol(sp + 1, NULL, 10) : 0;
    return n;
  }
  const char *colon = memchr(p, ':', n);
  if (!colon) return n;
  size_t kn = (size_t)(colon - p);
  const char *v = colon + 1, *end = p + n;
  while (v < end && (*v == ' ' || *v == '\t')) v++;
  while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ')) end--;
  static const char *const names[] = {"location", "www-authenticate", "content-type",
                                      "docker-content-digest", "content-range", "content-length"};
  char **slots[] = {&q->location, &q->www_auth, &q->content_type, &q->docker_digest,
                    &q->content_range, NULL};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (strlen(names[i]) != kn || strncasecmp(p, names[i], kn)) continue;
    char *val = strndup(v, (size_t)(end - v));
    if (!val) return q->cb_err = -ENOMEM, 0;
    if (slots[i]) {
      free(*slots[i]);
      *slots[i] = val;
    } else {
      char *e;
      unsigned long long cl = strtoull(val, &e, 10);
      q->content_length = (*val >= '0' && *val <= '9' && !*e) ? cl : UINT64_MAX;
      free(val);
    }
  }
  return n;
}

static size_t on_write(char *p, size_t size, size_t nmemb, void *ud) {
  oci_req *q = ud;
  size_t n = size * nmemb;
  int ok = q->status >= 200 && q->status < 300;
  if (ok && q->sink) {
    int rc = q->sink(q, p, n);
    return rc < 0 ? (q->cb_err = rc, 0) : n;
  }
  if (ok && q->small.len + n > q->small_max) {
    q->cb_err = nwc__fail(-EMSGSIZE, "%s %s: reply body over %zu bytes", q->method, q->url,
                          q->small_max);
    return 0;
  }
  if (!ok && q->small.len + n > OCI_MAX_SMALL) /* keep the head of a long error body */
    n = q->small.len < OCI_MAX_SMALL ? OCI_MAX_SMALL - q->small.len : 0;
  if (n && oci__buf_append(&q->small, p, n) < 0) return q->cb_err = -ENOMEM, 0;
  return size * nmemb;
}

static size_t on_read(char *buf, size_t size, size_t nmemb, void *ud) {
  oci_req *q = ud;
  size_t n = size * nmemb;
  if (n > q->up_len - q->up_done) n = (size_t)(q->up_len - q->up_done);
  if (!n) return 0;
  if (q->body) {
    memcpy(buf, (const char *)q->body + q->up_done, n);
  } else {
    ssize_t got = q->rd(q->rctx, q->up_off + q->up_done, buf, n);
    if (got < 0) return q->cb_err = (int)got, CURL_READFUNC_ABORT;
    if (got == 0 || (size_t)got > n) {
      q->cb_err = nwc__fail(-EIO, "upload: the read callback returned %zd at offset %llu, "
                            "before the blob's end", got,
                            (unsigned long long)(q->up_off + q->up_done));
      return CURL_READFUNC_ABORT;
    }
    n = (size_t)got;
  }
  q->up_done += n;
  if (q->pg && q->pg(q->pctx, q->pg_base + q->up_done, q->pg_total)) {
    q->cb_err = nwc__fail(-ECANCELED, "upload canceled by the progress callback");
    return CURL_READFUNC_ABORT;
  }
  return n;
}

static int on_seek(void *ud, curl_off_t off, int origin) {
  oci_req *q = ud;
  if (origin != SEEK_SET || off < 0 || (uint64_t)off > q->up_len) return CURL_SEEKFUNC_CANTSEEK;
  q->up_done = (uint64_t)off;
  return CURL_SEEKFUNC_OK;
}

/* ---- one attempt ------------------------------------------------------------------------------ */

static int same_origin(const nwc_oci *c, const char *url) {
  size_t n = strlen(c->base);
  return !strncmp(url, c->base, n) && (url[n] == '/' || url[n] == 0);
}

static void set_method(CURL *h, const oci_req *q) {
  const char *m = q->method;
  if (!strcmp(m, "HEAD")) {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (!strcmp(m, "POST")) {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->up_len);
  } else if (!strcmp(m, "PUT") || !strcmp(m, "PATCH")) {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)q->up_len);
    if (m[1] == 'A') curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "PATCH");
  } else if (!strcmp(m, "DELETE")) {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "DELETE");
  } else {
    curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
  }
}

/* Options for q on the freshly reset handle; *hl gets the header list to free after. */
static int setup(nwc_oci *c, oci_req *q, int token_req, char *errbuf, struct curl_slist **hl) {
  CURL *h = c->curl;
  curl_easy_reset(h);
  curl_easy_setopt(h, CURLOPT_URL, q->url);
  curl_easy_setopt(h, CURLOPT_USERAGENT, "nwc/0.1");
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 30L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, c->stall_s);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, q->follow ? 1L : 0L);
  curl_easy_setopt(h, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, q);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, q);
  curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
  curl_easy_setopt(h, CURLOPT_READDATA, q);
  curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, on_seek);
  curl_easy_setopt(h, CURLOPT_SEEKDATA, q);
  set_method(h, q);
  struct curl_slist *l = NULL;
  for (struct curl_slist *s = q->headers; s; s = s->next)
    if (!(l = curl_slist_append(*hl = l, s->data))) return -ENOMEM;
  if (!(l = curl_slist_append(*hl = l, "Expect:"))) return -ENOMEM; /* no 100-continue wait */
  *hl = l;
  int basic = token_req ? c->user != NULL : same_origin(c, q->url) && c->auth && !c->bearer;
  if (basic) {
    curl_easy_setopt(h, CURLOPT_HTTPAUTH, (long)CURLAUTH_BASIC);
    curl_easy_setopt(h, CURLOPT_USERNAME, c->user);
    curl_easy_setopt(h, CURLOPT_PASSWORD, c->secret);
  } else if (!token_req && c->bearer && same_origin(c, q->url)) {
    if (!(l = curl_slist_append(*hl = l, c->auth))) return -ENOMEM;
    *hl = l;
  }
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, l);
  return 0;
}

static int curl_errno(CURLcode cc) {
  switch (cc) {
  case CURLE_COULDNT_CONNECT: return -ECONNREFUSED;
  case CURLE_OPERATION_TIMEDOUT: return -ETIMEDOUT;
  case CURLE_COULDNT_RESOLVE_HOST:
  case CURLE_COULDNT_RESOLVE_PROXY: return -EHOSTUNREACH;
  case CURLE_PARTIAL_FILE:
  case CURLE_RECV_ERROR:
  case CURLE_SEND_ERROR:
  case CURLE_GOT_NOTHING: return -ECONNRESET;
  case CURLE_SSL_CONNECT_ERROR:
  case CURLE_PEER_FAILED_VERIFICATION:
  case CURLE_SSL_CACERT_BADFILE:
  case CURLE_SSL_CERTPROBLEM:
  case CURLE_TOO_MANY_REDIRECTS:
  case CURLE_UNSUPPORTED_PROTOCOL: return -EPROTO;
  case CURLE_OUT_OF_MEMORY: return -ENOMEM;
  default: return -EIO;
  }
}

/* One request, no auth logic: 0 with q->status, or a negative errno. */
static int perform(nwc_oci *c, oci_req *q, int token_req) {
  char errbuf[CURL_ERROR_SIZE] = "";
  struct curl_slist *hl = NULL;
  reply_reset(q);
  q->header_bytes = 0;
  q->up_done = 0;
  q->cb_err = 0;
  int rc = setup(c, q, token_req, errbuf, &hl);
  CURLcode cc = rc < 0 ? CURLE_OK : curl_easy_perform(c->curl);
  curl_slist_free_all(hl);
  if (rc < 0) return nwc__fail(rc, "out of memory");
  if (q->cb_err) return q->cb_err;
  if (cc == CURLE_PARTIAL_FILE && q->status >= 400)
    return 0; /* an error reply cut short (registry 2.8's 416 announces the blob's length) */
  if (cc != CURLE_OK)
    return nwc__fail(curl_errno(cc), "%s %s: %s", q->method, q->url,
                     errbuf[0] ? errbuf : curl_easy_strerror(cc));
  return 0;
}

/* ---- auth ------------------------------------------------------------------------------------- */

char *oci__challenge_param(const char *s, const char *key) {
  size_t kn = strlen(key);
  while (*s) {
    while (*s == ' ' || *s == ',') s++;
    const char *k = s;
    while (*s && *s != '=' && *s != ',' && *s != ' ') s++;
    int match = (size_t)(s - k) == kn && !strncasecmp(k, key, kn);
    if (*s != '=') continue;
    s++;
    char val[2048];
    size_t n = 0;
    if (*s == '"') {
      for (s++; *s && *s != '"'; s++) {
        if (*s == '\\' && s[1]) s++;
        if (n < sizeof val - 1) val[n++] = *s;
      }
      if (*s) s++;
    } else {
      for (; *s && *s != ',' && *s != ' '; s++)
        if (n < sizeof val - 1) val[n++] = *s;
    }
    if (match) return strndup(val, n);
  }
  return NULL;
}

/* The token from a token service's JSON reply, checked to be header-safe, malloc'ed. */
static int token_from_json(const char *realm, const oci_buf *b, char **out) {
  json_error_t je;
  json_t *j = json_loadb(b->p ? b->p : "", b->len, 0, &je);
  json_t *t = json_object_get(j, "token");
  if (!json_is_string(t) || !json_string_length(t)) t = json_object_get(j, "access_token");
  const char *s = json_string_value(t);
  int bad = !s || !*s || strlen(s) > MAX_TOKEN;
  for (const char *p = s; !bad && *p; p++) bad = (unsigned char)*p <= ' ' || *p == 0x7f;
  if (!bad) *out = strdup(s);
  json_decref(j);
  NWC_RETURN_IF(bad, -EBADMSG, "token service %.200s: no usable \"token\" in its reply", realm);
  return *out ? 0 : -ENOMEM;
}

/* GETs a Bearer token from realm for this repository and caches it on the handle. */
static int fetch_token(nwc_oci *c, const char *realm, const char *service) {
  NWC_RETURN_IF(strncmp(realm, "https://", 8) && strncmp(realm, "http://", 7), -EBADMSG,
                "registry %s: token realm '%.200s' is not an http(s) URL", c->host, realm);
  char scope[600], from[600] = "";
  snprintf(scope, sizeof scope, "repository:%s:%s", c->repo, c->push_scope ? "pull,push" : "pull");
  if (c->mount_from) /* a second scope for a mount's source */
    snprintf(from, sizeof from, "repository:%s:pull", c->mount_from);
  char *e[3] = {curl_easy_escape(c->curl, scope, 0), curl_easy_escape(c->curl, from, 0),
                curl_easy_escape(c->curl, service ? service : "", 0)};
  oci_req q = {.method = "GET", .small_max = OCI_MAX_SMALL};
  int rc = e[0] && e[1] && e[2] ? 0 : -ENOMEM;
  size_t n = strlen(realm) + 64 + (rc ? 0 : strlen(e[0]) + strlen(e[1]) + strlen(e[2]));
  if (rc == 0 && !(q.url = malloc(n))) rc = -ENOMEM;
  if (rc == 0) {
    snprintf(q.url, n, "%s%cscope=%s%s%s%s%s", realm, strchr(realm, '?') ? '&' : '?', e[0],
             *from ? "&scope=" : "", e[1], service ? "&service=" : "", e[2]);
    rc = perform(c, &q, 1);
  }
  for (int i = 0; i < 3; i++) curl_free(e[i]);
  char *tok = NULL;
  if (rc == 0 && q.status != 200) rc = oci__http_fail(&q, "token service");
  if (rc == 0) rc = token_from_json(realm, &q.small, &tok);
  oci__req_clear(&q);
  if (rc < 0) return rc;
  size_t ln = strlen(tok) + 24;
  char *line = malloc(ln);
  if (line) snprintf(line, ln, "Authorization: Bearer %s", tok);
  free(tok);
  if (!line) return -ENOMEM;
  free(c->auth);
  c->auth = line;
  c->bearer = 1;
  return 0;
}

/* Answers q's 401 challenge: sets the handle's auth for the next attempt. */
static int authenticate(nwc_oci *c, const oci_req *q) {
  const char *ch = q->www_auth;
  NWC_RETURN_IF(!ch, -EACCES, "%s %s: HTTP 401 without a WWW-Authenticate challenge", q->method,
                q->url);
  if (!strncasecmp(ch, "Basic", 5)) {
    NWC_RETURN_IF(!c->user, -EACCES, "registry %s wants credentials (Basic) and none were given",
                  c->host);
    NWC_RETURN_IF(c->auth && !c->bearer, -EACCES, "registry %s rejected the credentials of '%s'",
                  c->host, c->user);
    free(c->auth);
    c->bearer = 0;
    return (c->auth = strdup("basic")) ? 0 : -ENOMEM;
  }
  NWC_RETURN_IF(strncasecmp(ch, "Bearer", 6), -EACCES, "registry %s: unsupported auth '%.40s'",
                c->host, ch);
  char *realm = oci__challenge_param(ch + 6, "realm"), *service = oci__challenge_param(ch + 6, "service");
  int rc = realm ? fetch_token(c, realm, service)
                 : nwc__fail(-EBADMSG, "registry %s: Bearer challenge without a realm", c->host);
  free(realm);
  free(service);
  return rc;
}

int oci__http_do(nwc_oci *c, oci_req *q) {
  if (q->push && !c->push_scope) {
    c->push_scope = 1;
    if (c->bearer) { /* the cached token is pull-only: ask for push at the first 401 */
      free(c->auth);
      c->auth = NULL;
      c->bearer = 0;
    }
  }
  for (int attempt = 0;; attempt++) {
    NWC_TRY(perform(c, q, 0));
    if (q->status != 401 || attempt == 1) return 0;
    if (c->bearer) { /* a rejected token is worthless: fetch another (the one refresh) */
      free(c->auth);
      c->auth = NULL;
      c->bearer = 0;
    }
    NWC_TRY(authenticate(c, q));
  }
}

int oci__http_fail(const oci_req *q, const char *what) {
  json_error_t je;
  json_t *j = q->small.len ? json_loadb(q->small.p, q->small.len, 0, &je) : NULL;
  json_t *e0 = json_array_get(json_object_get(j, "errors"), 0);
  const char *code = json_string_value(json_object_get(e0, "code"));
  const char *msg = json_string_value(json_object_get(e0, "message"));
  long s = q->status;
  int err = -EIO;
  if (s == 401 || s == 403) err = -EACCES;
  else if (s == 404) err = -ENOENT;
  else if (s == 416) err = -ERANGE;
  else if (s == 429) err = -EAGAIN;
  else if (s == 400 || s == 405 || s == 413) err = -EINVAL;
  if (code && (!strcmp(code, "MANIFEST_UNKNOWN") || !strcmp(code, "BLOB_UNKNOWN") ||
               !strcmp(code, "NAME_UNKNOWN")))
    err = -ENOENT;
  if (code && (!strcmp(code, "DIGEST_INVALID") || !strcmp(code, "SIZE_INVALID"))) err = -EBADMSG;
  err = nwc__fail(err, "%s: %s %s: HTTP %ld%s%.64s%s%.300s", what, q->method, q->url, s,
                  code ? " " : "", code ? code : "", msg ? ": " : "", msg ? msg : "");
  json_decref(j);
  return err;
}
