/*
 * safetensors.c - parse and check a safetensors header with jansson; map the file read-only.
 *
 * Checks: header length within the file and below 100 MB; the header a JSON object whose members
 * (except "__metadata__") each have a dtype string, a shape of at most 8 non-negative integers and
 * data_offsets [begin, end] with begin <= end <= data size and, for known dtypes,
 * end - begin == numel * dtype size; no two non-empty tensors' byte ranges overlap (duplicate names
 * are rejected by jansson's JSON_REJECT_DUPLICATES).
 *
 * The sharded index (model.safetensors.index.json: {"metadata": {...}, "weight_map": {tensor:
 * shard}}) is parsed here too: every shard name is a plain file name (no '/', not "." or "..",
 * no control characters), so an index can only name files next to itself.
 */
#include "safetensors.h"

#include "nwc_error.h"

#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_HEADER (100u << 20)

typedef struct owned_map {
  nwc_st_file f;
  int mapped;
  uint8_t *head; /* nwc_st_read_fd: the header bytes, malloc'ed */
} owned_map;

static unsigned dtype_size(const char *d) {
  static const struct {
    const char *name;
    unsigned size;
  } k[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2},
           {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},
           {"I64", 8},  {"U64", 8}, {"F64", 8}};
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
    if (!strcmp(d, k[i].name)) return k[i].size;
  return 0;
}

static int parse_entry(const char *name, json_t *v, uint64_t data_size, nwc_st_tensor *t) {
  json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape");
  json_t *off = json_object_get(v, "data_offsets");
  NWC_RETURN_IF(!json_is_object(v) || !json_is_string(dt) || !json_is_array(sh) ||
                    !json_is_array(off) || json_array_size(off) != 2,
                -EBADMSG, "safetensors: tensor '%s' lacks dtype, shape or data_offsets", name);
  const char *d = json_string_value(dt);
  NWC_RETURN_IF(strlen(d) >= sizeof t->dtype, -EBADMSG, "safetensors: '%s': dtype too long", name);
  strcpy(t->dtype, d);
  t->dtype_size = dtype_size(d);
  t->ndim = (unsigned)json_array_size(sh);
  NWC_RETURN_IF(t->ndim > NWC_ST_MAX_DIMS, -EBADMSG, "safetensors: '%s': %u dimensions", name,
                t->ndim);
  t->numel = 1;
  for (unsigned i = 0; i < t->ndim; i++) {
    json_t *e = json_array_get(sh, i);
    NWC_RETURN_IF(!json_is_integer(e) || json_integer_value(e) < 0, -EBADMSG,
                  "safetensors: '%s': shape[%u] is not a non-negative integer", name, i);
    t->shape[i] = (uint64_t)json_integer_value(e);
    NWC_RETURN_IF(t->shape[i] && t->numel > (UINT64_C(1) << 48) / t->shape[i], -EBADMSG,
                  "safetensors: '%s': shape too large", name);
    t->numel *= t->shape[i];
  }
  json_t *b = json_array_get(off, 0), *e = json_array_get(off, 1);
  NWC_RETURN_IF(!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
                    json_integer_value(e) < json_integer_value(b),
                -EBADMSG, "safetensors: '%s': data_offsets outside the %llu data bytes", name,
                (unsigned long long)data_size);
  NWC_RETURN_IF((uint64_t)json_integer_value(e) > data_size, -EBADMSG,
                "safetensors: '%s': data_offsets outside the %llu data bytes (it ends at %llu: "
                "a truncated file?)", name, (unsigned long long)data_size,
                (unsigned long long)json_integer_value(e));
  t->begin = (uint64_t)json_integer_value(b);
  t->end = (uint64_t)json_integer_value(e);
  NWC_RETURN_IF(t->dtype_size && t->end - t->begin != t->numel * t->dtype_size, -EBADMSG,
                "safetensors: '%s': %llu bytes for %llu %s elements", name,
                (unsigned long long)(t->end - t->begin), (unsigned long long)t->numel, d);
  t->name = strdup(name);
  return t->name ? 0 : -ENOMEM;
}

static int cmp_begin(const void *a, const void *b) {
  const nwc_st_tensor *x = *(const nwc_st_tensor *const *)a, *y = *(const nwc_st_tensor *const *)b;
  return (x->begin > y->begin) - (x->begin < y->begin);
}

/* Rejects two non-empty tensors whose [begin, end) ranges overlap. */
static int check_overlap(const nwc_st_file *f) {
  if (f->count < 2) return 0;
  const nwc_st_tensor **v = malloc(f->count * sizeof *v);
  if (!v) return -ENOMEM;
  size_t n = 0;
  for (size_t i = 0; i < f->count; i++)
    if (f->tensors[i].end > f->tensors[i].begin) v[n++] = &f->tensors[i];
  qsort(v, n, sizeof *v, cmp_begin);
  int rc = 0;
  for (size_t i = 1; i < n && rc == 0; i++)
    if (v[i]->begin < v[i - 1]->end)
      rc = nwc__fail(-EBADMSG, "safetensors: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap",
                     v[i - 1]->name, (unsigned long long)v[i - 1]->begin,
                     (unsigned long long)v[i - 1]->end, v[i]->name,
                     (unsigned long long)v[i]->begin, (unsigned long long)v[i]->end);
  free(v);
  return rc;
}

static int parse(owned_map *m) {
  nwc_st_file *f = &m->f;
  NWC_RETURN_IF(f->size < 8, -EBADMSG, "safetensors: file of %zu bytes has no header", f->size);
  uint64_t hlen;
  memcpy(&hlen, f->map, 8);
  NWC_RETURN_IF(hlen > MAX_HEADER || hlen > f->size - 8, -EBADMSG,
                "safetensors: header length %llu does not fit the %zu-byte file (not a "
                "safetensors file, or a truncated one)",
                (unsigned long long)hlen, f->size);
  f->data_offset = 8 + hlen;
  json_error_t err;
  json_t *root = json_loadb((const char *)f->map + 8, hlen, JSON_REJECT_DUPLICATES, &err);
  NWC_RETURN_IF(!root, -EBADMSG, "safetensors: header JSON: %s (line %d)", err.text, err.line);
  int rc = 0;
  if (!json_is_object(root)) rc = nwc__fail(-EBADMSG, "safetensors: header is not an object");
  size_t n = rc ? 0 : json_object_size(root);
  f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
  if (!f->tensors) rc = -ENOMEM;
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) {
    if (rc) break;
    if (!strcmp(key, "__metadata__")) continue;
    rc = parse_entry(key, v, f->size - f->data_offset, &f->tensors[f->count]);
    if (rc == 0) f->count++;
  }
  json_decref(root);
  if (rc == 0) rc = check_overlap(f);
  return rc;
}

int nwc_st_parse(const uint8_t *buf, size_t size, nwc_st_file **out) {
  owned_map *m = calloc(1, sizeof *m);
  if (!m) return -ENOMEM;
  m->f.map = buf;
  m->f.size = size;
  int rc = parse(m);
  if (rc < 0) {
    nwc_st_close(&m->f);
    return rc;
  }
  *out = &m->f;
  return 0;
}

int nwc_st_open(const char *path, nwc_st_file **out) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nwc__fail(-errno, "safetensors: cannot open %s", path);
  int rc = nwc_st_open_fd(fd, out);
  close(fd);
  return rc;
}

int nwc_st_open_fd(int fd, nwc_st_file **out) {
  struct stat st;
  int rc = fstat(fd, &st) < 0 ? -errno : 0;
  void *map = MAP_FAILED;
  if (rc == 0 && st.st_size > 0) {
    map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) rc = -errno;
  }
  if (rc < 0) return nwc__fail(rc, "safetensors: cannot map the file");
  owned_map *m = calloc(1, sizeof *m);
  if (!m) {
    if (map != MAP_FAILED) munmap(map, (size_t)st.st_size);
    return -ENOMEM;
  }
  m->f.map = map == MAP_FAILED ? (const uint8_t *)"" : map;
  m->f.size = map == MAP_FAILED ? 0 : (size_t)st.st_size;
  m->mapped = map != MAP_FAILED;
  rc = parse(m);
  if (rc < 0) {
    nwc_st_close(&m->f);
    return rc;
  }
  *out = &m->f;
  return 0;
}

static int pread_all(int fd, uint8_t *p, size_t n, off_t off) {
  while (n) {
    ssize_t r = pread(fd, p, n, off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return r < 0 ? -errno : -EIO;
    p += r, n -= (size_t)r, off += r;
  }
  return 0;
}

int nwc_st_read_fd(int fd, nwc_st_file **out) {
  struct stat st;
  if (fstat(fd, &st) < 0) return nwc__fail(-errno, "safetensors: fstat failed");
  owned_map *m = calloc(1, sizeof *m);
  if (!m) return -ENOMEM;
  uint64_t size = (uint64_t)st.st_size, hlen = 0, want = size < 8 ? size : 8;
  int rc = 0;
  if (size >= 8) {
    uint8_t b8[8];
    rc = pread_all(fd, b8, 8, 0);
    memcpy(&hlen, b8, 8);
    /* Read the header only when it can fit; otherwise parse() reports the bad length. */
    if (rc == 0 && hlen <= MAX_HEADER && hlen <= size - 8) want = 8 + hlen;
  }
  m->head = rc ? NULL : malloc(want ? want : 1);
  if (rc == 0 && !m->head) rc = -ENOMEM;
  if (rc == 0 && want) rc = pread_all(fd, m->head, want, 0);
  if (rc < 0) {
    nwc_st_close(&m->f);
    return nwc__fail(rc, "safetensors: cannot read the header");
  }
  m->f.map = m->head;
  m->f.size = (size_t)size;
  rc = parse(m); /* reads map[0, 8) and, only when the length fits, map[8, 8 + hlen) */
  if (rc < 0) {
    nwc_st_close(&m->f);
    return rc;
  }
  *out = &m->f;
  return 0;
}

void nwc_st_close(nwc_st_file *f) {
  if (!f) return;
  owned_map *m = (owned_map *)f;
  for (size_t i = 0; i < f->count; i++) free(f->tensors[i].name);
  free(f->tensors);
  if (m->mapped) munmap((void *)f->map, f->size);
  free(m->head);
  free(m);
}

void nwc_st_matrix_shape(const nwc_st_tensor *t, uint64_t *rows, uint64_t *cols) {
  unsigned d = 0;
  while (d + 2 < t->ndim && t->shape[d] == 1) d++;
  *rows = t->ndim - d >= 2 ? t->shape[d] : 1;
  *cols = *rows ? t->numel / *rows : 0;
}

const nwc_st_tensor *nwc_st_find(const nwc_st_file *f, const char *name) {
  for (size_t i = 0; i < f->count; i++)
    if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
  return NULL;
}

/* ---- the sharded index ---------------------------------------------------------------------- */

static int shard_name_ok(const char *s) {
  if (!*s || !strcmp(s, ".") || !strcmp(s, "..")) return 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    if (*p == '/' || *p < 0x20 || *p == 0x7f) return 0;
  return 1;
}

void nwc_st_index_free(nwc_st_index *x) {
  if (!x) return;
  for (size_t i = 0; i < x->nshards; i++) free(x->shards[i]);
  for (size_t i = 0; i < x->count; i++) free(x->names[i]);
  free(x->shards);
  free(x->names);
  free(x->shard_of);
  free(x);
}

static int index_fill(nwc_st_index *x, json_t *map) {
  size_t n = json_object_size(map);
  x->names = calloc(n ? n : 1, sizeof *x->names);
  x->shard_of = calloc(n ? n : 1, sizeof *x->shard_of);
  x->shards = calloc(n ? n : 1, sizeof *x->shards);
  if (!x->names || !x->shard_of || !x->shards) return -ENOMEM;
  const char *key;
  json_t *v;
  json_object_foreach(map, key, v) {
    NWC_RETURN_IF(!json_is_string(v), -EBADMSG,
                  "safetensors index: weight_map['%s'] is not a string", key);
    const char *shard = json_string_value(v);
    NWC_RETURN_IF(!shard_name_ok(shard), -EBADMSG,
                  "safetensors index: tensor '%s' names shard '%s', not a plain file name", key,
                  shard);
    size_t s = 0;
    while (s < x->nshards && strcmp(x->shards[s], shard)) s++;
    if (s == x->nshards) {
      if (!(x->shards[s] = strdup(shard))) return -ENOMEM;
      x->nshards++;
    }
    if (!(x->names[x->count] = strdup(key))) return -ENOMEM;
    x->shard_of[x->count++] = s;
  }
  return 0;
}

int nwc_st_index_parse(const uint8_t *buf, size_t size, nwc_st_index **out) {
  NWC_RETURN_IF(size > MAX_HEADER, -EBADMSG, "safetensors index: %zu bytes is too large", size);
  json_error_t err;
  json_t *root = json_loadb((const char *)buf, size, JSON_REJECT_DUPLICATES, &err);
  NWC_RETURN_IF(!root, -EBADMSG, "safetensors index: JSON: %s (line %d)", err.text, err.line);
  json_t *map = json_object_get(root, "weight_map");
  int rc = 0;
  if (!json_is_object(root) || !json_is_object(map))
    rc = nwc__fail(-EBADMSG, "safetensors index: no weight_map object");
  else if (json_object_size(map) == 0)
    rc = nwc__fail(-EBADMSG, "safetensors index: weight_map is empty");
  nwc_st_index *x = rc ? NULL : calloc(1, sizeof *x);
  if (rc == 0 && !x) rc = -ENOMEM;
  if (rc == 0) rc = index_fill(x, map);
  json_decref(root);
  if (rc < 0) {
    nwc_st_index_free(x);
    return rc;
  }
  *out = x;
  return 0;
}
