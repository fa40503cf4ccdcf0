/*
 * creds.c - registry credentials as podman and docker keep them (nwc_oci.h lists the files and
 * the order).  A file that is absent is skipped; one that exists but is not a JSON object, or
 * holds an "auth" that is not base64 of user:password, is an error naming the file (podman and
 * docker fail there too, rather than silently pushing anonymously).
 *
 * Base64: OpenSSL's EVP_DecodeUpdate (libcrypto, which libcurl4-openssl already brings into the
 * process; libgcrypt and libcurl export no base64 decoder).
 *
 * Credential helpers run as `docker-credential-NAME get` (found on $PATH; NAME of [A-Za-z0-9._-]
 * only) with the registry on stdin, which is written into the pipe before the helper starts (so
 * a helper that dies early cannot raise SIGPIPE here); its stdout (at most 64 KiB) is JSON
 * {"Username", "Secret"}, or "credentials not found" and a nonzero exit (-ENOENT).
 */
#include "oci_internal.h"

#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_FILE (1u << 20)
#define MAX_HELPER_OUT (64u << 10)

extern char **environ;

/* 0 with *out, -ENOENT if the file is absent, another negative errno (message names it). */
static int load_json(const char *path, json_t **out) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    if (errno == ENOENT || errno == ENOTDIR) return -ENOENT;
    return nwc__fail(-errno, "credentials: %s: %s", path, strerror(errno));
  }
  struct stat st;
  int big = fstat(fileno(f), &st) == 0 && st.st_size > (off_t)MAX_FILE;
  json_error_t je;
  json_t *j = big ? NULL : json_loadf(f, 0, &je);
  fclose(f);
  NWC_RETURN_IF(big, -EFBIG, "credentials: %s: larger than %u bytes", path, MAX_FILE);
  NWC_RETURN_IF(!j, -EBADMSG, "credentials: %s: line %d: %s", path, je.line, je.text);
  if (!json_is_object(j)) {
    json_decref(j);
    return nwc__fail(-EBADMSG, "credentials: %s: not a JSON object", path);
  }
  *out = j;
  return 0;
}

/* A key of "auths" names registry: exactly, or after dropping a scheme and a path; docker.io's
 * own spelling is https://index.docker.io/v1/. */
static int key_matches(const char *key, const char *registry) {
  if (!strcmp(key, registry)) return 1;
  if (!strncmp(key, "https://", 8)) key += 8;
  else if (!strncmp(key, "http://", 7)) key += 7;
  size_t n = strcspn(key, "/");
  if (strlen(registry) == n && !strncmp(key, registry, n)) return 1;
  int hub = !strcmp(registry, "docker.io") || !strcmp(registry, "registry-1.docker.io");
  return hub && n == 15 && !strncmp(key, "index.docker.io", 15);
}

static json_t *find_entry(json_t *obj, const char *registry) {
  const char *key;
  json_t *v;
  json_object_foreach(obj, key, v) if (key_matches(key, registry)) return v;
  return NULL;
}

/* Decodes base64 "user:password" into two malloc'ed strings. */
static int decode_auth(const char *path, const char *b64, char **user, char **secret) {
  size_t n = strlen(b64);
  NWC_RETURN_IF(n > 16384, -EBADMSG, "credentials: %s: \"auth\" too long", path);
  unsigned char *buf = malloc(n + 80);
  EVP_ENCODE_CTX *ctx = EVP_ENCODE_CTX_new();
  int l1 = 0, l2 = 0, ok = buf && ctx;
  if (ok) {
    EVP_DecodeInit(ctx);
    ok = EVP_DecodeUpdate(ctx, buf, &l1, (const unsigned char *)b64, (int)n) >= 0 &&
         EVP_DecodeFinal(ctx, buf + l1, &l2) == 1;
  }
  EVP_ENCODE_CTX_free(ctx);
  size_t len = ok ? (size_t)(l1 + l2) : 0;
  char *colon = ok ? memchr(buf, ':', len) : NULL;
  int clean = colon && !memchr(buf, 0, len);
  if (clean) {
    *user = strndup((char *)buf, (size_t)(colon - (char *)buf));
    *secret = strndup(colon + 1, len - (size_t)(colon + 1 - (char *)buf));
  }
  if (buf) memset(buf, 0, n + 80);
  free(buf);
  NWC_RETURN_IF(!clean, -EBADMSG, "credentials: %s: \"auth\" is not base64 of user:password", path);
  return *user && *secret ? 0 : -ENOMEM;
}

/* Credentials from an auths entry: "auth", with "identitytoken" as the secret when set. */
static int from_entry(const char *path, json_t *e, char **user, char **secret) {
  const char *auth = json_string_value(json_object_get(e, "auth"));
  const char *tok = json_string_value(json_object_get(e, "identitytoken"));
  if (tok && !*tok) tok = NULL;
  if (auth && *auth) NWC_TRY(decode_auth(path, auth, user, secret));
  else if (!tok) return -ENOENT; /* an empty entry (docker writes them beside credsStore) */
  if (tok) {
    free(*secret);
    if (!*user) *user = strdup("<token>");
    *secret = strdup(tok);
  }
  return *user && *secret ? 0 : -ENOMEM;
}

/* Runs docker-credential-NAME get; returns its stdout (malloc'ed) and exit status. */
static int run_helper(const char *name, const char *registry, char **outp, int *status) {
  char prog[160];
  NWC_RETURN_IF(!*name || strlen(name) > 100 || strspn(name, "abcdefghijklmnopqrstuvwxyz"
                "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != strlen(name), -EINVAL,
                "credentials: bad credential helper name '%.100s'", name);
  snprintf(prog, sizeof prog, "docker-credential-%s", name);
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC)) return nwc__fail(-errno, "credentials: pipe: %s", strerror(errno));
  if (pipe2(out, O_CLOEXEC)) {
    int e = errno;
    close(in[0]), close(in[1]);
    return nwc__fail(-e, "credentials: pipe: %s", strerror(e));
  }
  ssize_t w = write(in[1], registry, strlen(registry)); /* fits the empty pipe: no reader needed */
  close(in[1]);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  char *argv[] = {prog, "get", NULL};
  pid_t pid;
  int se = w == (ssize_t)strlen(registry) ? posix_spawnp(&pid, prog, &fa, NULL, argv, environ) : EIO;
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  oci_buf b = {0};
  char chunk[4096];
  ssize_t r;
  while (!se && (r = read(out[0], chunk, sizeof chunk)) != 0) {
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    size_t keep = b.len < MAX_HELPER_OUT ? MAX_HELPER_OUT - b.len : 0;
    if (keep && oci__buf_append(&b, chunk, (size_t)r < keep ? (size_t)r : keep) < 0) break;
  }
  close(out[0]);
  if (se) return nwc__fail(-EIO, "credentials: cannot run %s: %s", prog, strerror(se));
  while (waitpid(pid, status, 0) < 0 && errno == EINTR) {
  }
  *outp = b.p ? b.p : strdup("");
  return *outp ? 0 : -ENOMEM;
}

static int from_helper(const char *name, const char *registry, char **user, char **secret) {
  char *out = NULL;
  int status = 0;
  NWC_TRY(run_helper(name, registry, &out, &status));
  int rc = 0;
  if (!WIFEXITED(status) || WEXITSTATUS(status)) {
    rc = strstr(out, "credentials not found")
             ? -ENOENT
             : nwc__fail(-EIO, "credentials: docker-credential-%s get failed (status %d): %.200s",
                         name, status, out);
  } else {
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    const char *u = json_string_value(json_object_get(j, "Username"));
    const char *s = json_string_value(json_object_get(j, "Secret"));
    if (!s) rc = nwc__fail(-EBADMSG, "credentials: docker-credential-%s: no Secret in its reply",
                           name);
    else if (!(*user = strdup(u ? u : "")) || !(*secret = strdup(s))) rc = -ENOMEM;
    json_decref(j);
  }
  memset(out, 0, strlen(out));
  free(out);
  return rc;
}

/* Looks registry up in one file: credHelpers, auths, credsStore. */
static int from_file(const char *path, const char *registry, char **user, char **secret) {
  json_t *j;
  NWC_TRY(load_json(path, &j));
  const char *helper = json_string_value(find_entry(json_object_get(j, "credHelpers"), registry));
  json_t *e = find_entry(json_object_get(j, "auths"), registry);
  const char *store = json_string_value(json_object_get(j, "credsStore"));
  int rc = -ENOENT;
  if (helper) {
    rc = from_helper(helper, registry, user, secret);
  } else {
    if (e) rc = from_entry(path, e, user, secret);
    if (rc == -ENOENT && store && *store) rc = from_helper(store, registry, user, secret);
  }
  json_decref(j);
  return rc;
}

int nwc_oci_credentials(const char *registry, char **user, char **secret) {
  *user = *secret = NULL;
  NWC_RETURN_IF(!registry || !*registry, -EINVAL, "credentials: no registry");
  const char *env_file = getenv("REGISTRY_AUTH_FILE"), *xdg = getenv("XDG_RUNTIME_DIR");
  const char *home = getenv("HOME"), *dc = getenv("DOCKER_CONFIG");
  char paths[4][4200];
  int n = 0;
  if (env_file && *env_file) snprintf(paths[n++], sizeof paths[0], "%s", env_file);
  if (xdg && *xdg) snprintf(paths[n++], sizeof paths[0], "%s/containers/auth.json", xdg);
  if (home && *home) snprintf(paths[n++], sizeof paths[0], "%s/.config/containers/auth.json", home);
  if (dc && *dc) snprintf(paths[n++], sizeof paths[0], "%s/config.json", dc);
  else if (home && *home) snprintf(paths[n++], sizeof paths[0], "%s/.docker/config.json", home);
  for (int i = 0; i < n; i++) {
    int rc = from_file(paths[i], registry, user, secret);
    if (rc != -ENOENT) {
      if (rc < 0) {
        free(*user), free(*secret);
        *user = *secret = NULL;
      }
      return rc;
    }
    free(*user), free(*secret);
    *user = *secret = NULL;
  }
  return nwc__fail(-ENOENT, "credentials: none for %s", registry);
}
