/*
 * ref.c - references ("host[:port]/repo/path[:tag][@sha256:hex]"), digest and tag syntax (in the
 * library nwc_oci_ref with creds.c: what a client needs without HTTP).
 *
 * The reference grammar is the distribution spec's (and docker's reference package): the first
 * component is a registry host only if it holds '.' or ':' or is "localhost" (we demand one: a
 * reference without a registry is rejected, there is no default registry); repository
 * components are [a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*; the tag follows the last ':' after the last
 * '/'; the digest follows '@'.  Everything is checked here, so a parsed reference can go into a
 * URL as it is.
 */
#include "oci_internal.h"

#include "nwc.h" /* nwc_error_detail: the detail line nwc__fail records */

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NAME 255

const char *nwc_oci_last_error(void) { return nwc_error_detail(); }

int nwc_oci_digest_valid(const char *d) {
  if (!d || strncmp(d, "sha256:", 7) || strlen(d) != 71) return 0;
  for (const char *p = d + 7; *p; p++)
    if (!isdigit((unsigned char)*p) && !(*p >= 'a' && *p <= 'f')) return 0;
  return 1;
}

int oci__tag_valid(const char *t) {
  size_t n = t ? strlen(t) : 0;
  if (n == 0 || n > 128 || t[0] == '.' || t[0] == '-') return 0;
  for (size_t i = 0; i < n; i++)
    if (!isalnum((unsigned char)t[i]) && !strchr("._-", t[i])) return 0;
  return 1;
}

static int lower_alnum(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9'); }

/* One path component [a-z0-9]+((\.|_|__|-+)[a-z0-9]+)* of [p, p+n). */
static int component_valid(const char *p, size_t n) {
  if (n == 0 || !lower_alnum(p[0]) || !lower_alnum(p[n - 1])) return 0;
  for (size_t i = 1; i < n; i++) {
    if (lower_alnum(p[i])) continue;
    size_t j = i;
    while (j < n && !lower_alnum(p[j])) j++;
    int dashes = 1;
    for (size_t k = i; k < j; k++) dashes &= p[k] == '-';
    int ok = dashes || (j - i == 1 && (p[i] == '.' || p[i] == '_')) ||
             (j - i == 2 && !memcmp(p + i, "__", 2));
    if (!ok) return 0;
    i = j - 1;
  }
  return 1;
}

/* host, host:port, [v6]:port; letters, digits, '.', '-' (and ':' inside brackets). */
static int host_valid(const char *h, size_t n) {
  size_t i = 0;
  if (n && h[0] == '[') {
    while (i < n && h[i] != ']') {
      if (i && !isxdigit((unsigned char)h[i]) && h[i] != ':') return 0;
      i++;
    }
    if (i == n || i < 2) return 0;
    i++;
  } else {
    while (i < n && (isalnum((unsigned char)h[i]) || h[i] == '.' || h[i] == '-')) i++;
    if (i == 0 || h[0] == '.' || h[0] == '-' || h[i - 1] == '.' || h[i - 1] == '-') return 0;
  }
  if (i == n) return 1;
  if (h[i] != ':' || i + 1 == n || n - i - 1 > 5) return 0;
  for (i++; i < n; i++)
    if (!isdigit((unsigned char)h[i])) return 0;
  return 1;
}

/* Checks the repository path [p, p+n): components separated by single '/'. */
static int repo_check(const char *text, const char *p, size_t n) {
  for (const char *end = p + n; p <= end;) {
    const char *q = memchr(p, '/', (size_t)(end - p));
    if (!q) q = end;
    NWC_RETURN_IF(!component_valid(p, (size_t)(q - p)), -EINVAL,
                  "reference '%s': bad repository component '%.*s' (lowercase letters and digits, "
                  "separated by '.', '_', '__' or dashes)", text, (int)(q - p), p);
    p = q + 1;
  }
  return 0;
}

int oci__repo_valid(const char *repo) {
  return repo && strlen(repo) <= MAX_NAME && repo_check(repo, repo, strlen(repo)) == 0;
}

void nwc_oci_ref_free(nwc_oci_ref *r) {
  if (!r) return;
  free(r->registry);
  free(r->repository);
  free(r->tag);
  free(r->digest);
  memset(r, 0, sizeof *r);
}

/* Checks name = "host/repo/path" and splits it into out's registry and repository. */
static int parse_name(const char *text, const char *name, size_t n, nwc_oci_ref *out) {
  const char *slash = memchr(name, '/', n);
  NWC_RETURN_IF(!slash, -EINVAL, "reference '%s': no registry host (want host[:port]/repo)", text);
  size_t hn = (size_t)(slash - name);
  int is_host = memchr(name, '.', hn) || memchr(name, ':', hn) ||
                (hn == 9 && !memcmp(name, "localhost", 9));
  NWC_RETURN_IF(!is_host, -EINVAL,
                "reference '%s': '%.*s' is not a registry host (it needs a '.' or a ':' or to be "
                "localhost)", text, (int)hn, name);
  NWC_RETURN_IF(!host_valid(name, hn), -EINVAL, "reference '%s': bad registry host '%.*s'", text,
                (int)hn, name);
  NWC_RETURN_IF(n > MAX_NAME, -EINVAL, "reference '%s': name longer than %d bytes", text, MAX_NAME);
  NWC_TRY(repo_check(text, slash + 1, n - hn - 1));
  out->registry = strndup(name, hn);
  out->repository = strndup(slash + 1, n - hn - 1);
  return out->registry && out->repository ? 0 : -ENOMEM;
}

static int parse(const char *text, nwc_oci_ref *out) {
  NWC_RETURN_IF(!text || !*text, -EINVAL, "reference: empty");
  size_t n = strlen(text);
  const char *at = strchr(text, '@');
  if (at) {
    NWC_RETURN_IF(!nwc_oci_digest_valid(at + 1), -EINVAL,
                  "reference '%s': bad digest (want @sha256:<64 lowercase hex>)", text);
    if (!(out->digest = strdup(at + 1))) return -ENOMEM;
    n = (size_t)(at - text);
  }
  const char *last_slash = memrchr(text, '/', n);
  const char *colon = last_slash ? memchr(last_slash, ':', n - (size_t)(last_slash - text)) : NULL;
  if (colon) {
    size_t tn = n - (size_t)(colon + 1 - text);
    NWC_RETURN_IF(!(out->tag = strndup(colon + 1, tn)), -ENOMEM, "out of memory");
    NWC_RETURN_IF(!oci__tag_valid(out->tag), -EINVAL,
                  "reference '%s': bad tag '%s' (want [A-Za-z0-9_][A-Za-z0-9._-]{0,127})", text,
                  out->tag);
    n = (size_t)(colon - text);
  } else if (!at) {
    if (!(out->tag = strdup("latest"))) return -ENOMEM;
  }
  return parse_name(text, text, n, out);
}

int nwc_oci_ref_parse(const char *text, nwc_oci_ref *out) {
  memset(out, 0, sizeof *out);
  int rc = parse(text, out);
  if (rc < 0) nwc_oci_ref_free(out);
  return rc;
}

/* A growing buffer (oci_internal.h): http.c's replies, creds.c's helper output. */
int oci__buf_append(oci_buf *b, const void *p, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n + 1) cap *= 2;
    char *np = realloc(b->p, cap);
    if (!np) return -ENOMEM;
    b->p = np;
    b->cap = cap;
  }
  memcpy(b->p + b->len, p, n);
  b->len += n;
  b->p[b->len] = 0;
  return 0;
}
