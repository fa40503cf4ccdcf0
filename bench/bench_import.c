/*
 * bench_import.c - `nwc-bench import FILE.safetensors|INDEX.json [--elem bf16|fp8] [--layout N]
 * [--threads N[,N...]] [--store DIR]`: imports the file into a fresh store (a temporary directory
 * unless --store is given) once per thread count and prints one JSON line each: source bytes,
 * seconds (wall, open to publish), GB/s of source bytes, threads, and the split into encoding
 * (until the last progress report) and publishing (fsync, rename, the SQLite commit), and the CPU
 * time all threads took (GB per CPU second: the speed per core, which a busy machine's other
 * processes do not dilute the way they dilute wall time), and the size of the container file
 * (container_bytes) and what it takes on disk (container_disk_bytes: its allocated blocks).  The
 * default thread counts are 1, 2 and all online cores, to show the scaling.  The page cache is warm
 * after the first run (a first pass imports once untimed).
 *
 * `nwc-bench import --write-synth OUT.safetensors` writes the synthetic test file instead: 1.0 GiB
 * of BF16 weights shaped like one transformer layer plus a large embedding (six tensors, the
 * largest 512 MiB), each row normal with a log-normal scale, so that one tensor dominates.
 * `--write-tiny OUT.safetensors` writes 100,000 BF16 tensors of 1 to 16 values each (the case
 * for packed blobs, docs/store.md).
 */
#include "nwc_store.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int nwc_bench_import(int argc, char **argv);

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct prog {
  double last_change;
  uint64_t total;
} prog;

/* CPU seconds (user + system) of every thread of the process so far. */
static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static int on_progress(void *ctx, uint64_t done, uint64_t total) {
  prog *p = ctx;
  p->last_change = now_s();
  p->total = total;
  (void)done;
  return 0;
}

static void rm_tree(const char *path) {
  DIR *d = opendir(path);
  if (!d) {
    unlink(path);
    return;
  }
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char p[4096];
    if (snprintf(p, sizeof p, "%s/%s", path, e->d_name) < (int)sizeof p) rm_tree(p);
  }
  closedir(d);
  rmdir(path);
}

/* ---- the synthetic file -------------------------------------------------------------------- */

static uint64_t synth_rng = 0x243f6a8885a308d3ull;
static inline uint64_t synth_next(void) { /* xorshift64 */
  synth_rng ^= synth_rng << 13, synth_rng ^= synth_rng >> 7, synth_rng ^= synth_rng << 17;
  return synth_rng;
}
/* About standard normal: the sum of four 16-bit uniforms (Irwin-Hall), centred and scaled. */
static inline float synth_normal(void) {
  uint64_t r = synth_next();
  unsigned s = (unsigned)(r & 0xffff) + (unsigned)((r >> 16) & 0xffff) +
               (unsigned)((r >> 32) & 0xffff) + (unsigned)(r >> 48);
  return ((float)s - 131070.0f) * (1.0f / 37837.0f); /* sd of the sum: 65536 * sqrt(4 / 12) */
}

/* Opens path and writes the safetensors header of root (its tensors' data to follow). */
static FILE *open_with_header(const char *path, json_t *root) {
  char *h = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
  FILE *f = h ? fopen(path, "wb") : NULL;
  if (!f) {
    perror(path);
    free(h);
    return NULL;
  }
  size_t hl = strlen(h), hp = (hl + 7) / 8 * 8;
  uint64_t hp64 = hp;
  int ok = fwrite(&hp64, 8, 1, f) == 1 && fwrite(h, 1, hl, f) == hl;
  for (size_t k = hl; ok && k < hp; k++) ok = fputc(' ', f) != EOF;
  free(h);
  if (!ok) fclose(f), f = NULL, fprintf(stderr, "nwc-bench import: %s: write failed\n", path);
  return f;
}

static int close_written(FILE *f, int ok, const char *path) {
  if (fclose(f) != 0 || !ok) {
    fprintf(stderr, "nwc-bench import: %s: write failed\n", path);
    return 1;
  }
  return 0;
}

static int write_synth(const char *path) {
  static const struct { const char *name; uint64_t rows, cols; } t[] = {
      {"embed_tokens.weight", 32768, 8192}, {"mlp.up_proj.weight", 28672, 4096},
      {"mlp.down_proj.weight", 4096, 28672}, {"attn.qkv_proj.weight", 6144, 4096},
      {"attn.o_proj.weight", 4096, 4096}, {"norm.weight", 1, 4096}};
  const size_t n = sizeof t / sizeof t[0];
  json_t *root = json_object();
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t bytes = t[i].rows * t[i].cols * 2;
    json_t *e = json_pack("{s:s, s:[I, I], s:[I, I]}", "dtype", "BF16", "shape",
                          (json_int_t)t[i].rows, (json_int_t)t[i].cols, "data_offsets",
                          (json_int_t)off, (json_int_t)(off + bytes));
    if (t[i].rows == 1) json_object_set_new(e, "shape", json_pack("[I]", (json_int_t)t[i].cols));
    json_object_set_new(root, t[i].name, e);
    off += bytes;
  }
  FILE *f = open_with_header(path, root);
  json_decref(root);
  if (!f) return 1;
  uint16_t *row = malloc(32768 * sizeof *row); /* the widest row */
  int ok = row != NULL;
  for (size_t i = 0; ok && i < n; i++)
    for (uint64_t r = 0; ok && r < t[i].rows; r++) {
      float s = 0.02f * expf(0.5f * synth_normal());
      for (uint64_t c = 0; c < t[i].cols; c++) row[c] = nwc_f32_to_bf16(s * synth_normal());
      ok = fwrite(row, 2, t[i].cols, f) == t[i].cols;
    }
  free(row);
  return close_written(f, ok, path);
}

/* The many-tiny-tensors file: TINY_COUNT 1-D BF16 tensors "tiny.NNNNNN" of 1 to 16 values each
 * (about 17 bytes of data on average), what a store that pads every tensor to 4 KiB wastes most
 * on. */
#define TINY_COUNT 100000u

static int write_tiny(const char *path) {
  json_t *root = json_object();
  uint64_t off = 0;
  unsigned *len = malloc(TINY_COUNT * sizeof *len);
  if (!len) return 1;
  for (unsigned i = 0; i < TINY_COUNT; i++) {
    char name[32];
    len[i] = 1 + (unsigned)(synth_next() % 16);
    snprintf(name, sizeof name, "tiny.%06u", i);
    json_object_set_new(root, name, json_pack("{s:s, s:[I], s:[I, I]}", "dtype", "BF16", "shape",
                                              (json_int_t)len[i], "data_offsets", (json_int_t)off,
                                              (json_int_t)(off + 2 * len[i])));
    off += 2 * len[i];
  }
  FILE *f = open_with_header(path, root);
  json_decref(root);
  int ok = f != NULL;
  for (unsigned i = 0; ok && i < TINY_COUNT; i++)
    for (unsigned k = 0; ok && k < len[i]; k++) {
      uint16_t v = nwc_f32_to_bf16(0.02f * synth_normal());
      ok = fwrite(&v, 2, 1, f) == 1;
    }
  free(len);
  return f ? close_written(f, ok, path) : 1;
}

static void usage(void) {
  fputs("usage: nwc-bench import FILE.safetensors|INDEX.json [--elem bf16|fp8] [--layout N]\n"
        "                        [--threads N[,N...]] [--store DIR]\n"
        "       nwc-bench import --write-synth OUT.safetensors\n"
        "       nwc-bench import --write-tiny OUT.safetensors\n",
        stderr);
}

int nwc_bench_import(int argc, char **argv) {
  const char *file = NULL, *store_dir = NULL, *threads_arg = NULL;
  nwc_import_opts o = {0};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--elem") && i + 1 < argc) {
      const char *e = argv[++i];
      if (!strcmp(e, "fp8")) o.elem = NWC_ELEM_FP8;
      else if (strcmp(e, "bf16")) return usage(), 2;
    } else if (!strcmp(argv[i], "--layout") && i + 1 < argc) {
      o.layout = (unsigned)atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads_arg = argv[++i];
    } else if (!strcmp(argv[i], "--write-synth") && i + 1 < argc) {
      return write_synth(argv[i + 1]);
    } else if (!strcmp(argv[i], "--write-tiny") && i + 1 < argc) {
      return write_tiny(argv[i + 1]);
    } else if (!strcmp(argv[i], "--store") && i + 1 < argc) {
      store_dir = argv[++i];
    } else if (argv[i][0] != '-' && !file) {
      file = argv[i];
    } else {
      return usage(), 2;
    }
  }
  if (!file) return usage(), 2;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  unsigned counts[16], ncounts = 0;
  if (threads_arg) {
    for (const char *p = threads_arg; *p && ncounts < 16;) {
      counts[ncounts++] = (unsigned)strtoul(p, (char **)&p, 10);
      if (*p == ',') p++;
      else break;
    }
  } else { /* 1, 2 and all cores */
    counts[ncounts++] = 1;
    if (ncpu > 1) counts[ncounts++] = 2;
    if (ncpu > 2) counts[ncounts++] = (unsigned)ncpu;
  }
  char tmp[512];
  if (!store_dir) {
    const char *base = getenv("TMPDIR");
    snprintf(tmp, sizeof tmp, "%s/nwc-bench-import-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmp)) {
      perror("mkdtemp");
      return 1;
    }
    store_dir = tmp;
  }
  nwc_store *s = NULL;
  int rc = nwc_store_open(store_dir, NWC_STORE_CREATE, &s);
  if (rc < 0) {
    fprintf(stderr, "nwc-bench import: %s: %s\n", nwc_strerror(rc), nwc_error_detail());
    return 1;
  }
  /* Warm the page cache so that every timed run reads the source from memory. */
  rc = nwc_store_import(s, "warmup", file, &o);
  if (rc == 0) rc = nwc_store_remove(s, "warmup");
  for (unsigned k = 0; rc == 0 && k < ncounts; k++) {
    prog p = {0, 0};
    nwc_import_opts ok = o;
    ok.threads = counts[k];
    ok.progress = on_progress;
    ok.progress_ctx = &p;
    char name[32];
    snprintf(name, sizeof name, "bench-%u", k);
    double t0 = now_s(), c0 = cpu_s();
    rc = nwc_store_import(s, name, file, &ok);
    double t1 = now_s(), cpu = cpu_s() - c0;
    if (rc < 0) break;
    nwc_model_info *m = NULL;
    rc = nwc_store_model(s, name, &m);
    if (rc < 0) break;
    nwc_tensor_info *ts = NULL;
    size_t nt = 0;
    uint64_t largest = 0;
    struct stat cs = {0}; /* the container file (one per import): its size and its blocks */
    if (nwc_store_tensors(s, name, &ts, &nt) == 0)
      for (size_t i = 0; i < nt; i++)
        if (ts[i].source_bytes > largest) largest = ts[i].source_bytes;
    if (nt) (void)stat(ts[0].path, &cs);
    nwc_tensor_info_free(ts, nt);
    double secs = t1 - t0;
    unsigned thr = counts[k] ? counts[k] : (unsigned)ncpu;
    printf("{\"bench\":\"import\",\"file\":\"%s\",\"elem\":\"%s\",\"layout\":%u,\"threads\":%u,"
           "\"cores\":%ld,\"tensors\":%llu,\"bytes\":%llu,\"nwc_bytes\":%llu,\"ratio\":%.4f,"
           "\"seconds\":%.4f,\"gbps\":%.4f,\"gbps_per_thread\":%.4f,\"encode_seconds\":%.4f,"
           "\"publish_seconds\":%.4f,\"cpu_seconds\":%.4f,\"gb_per_cpu_second\":%.4f,"
           "\"largest_tensor_share\":%.3f,\"container_bytes\":%llu,\"container_disk_bytes\":%llu}\n",
           file, o.elem == NWC_ELEM_FP8 ? "fp8" : "bf16", o.layout, thr, ncpu,
           (unsigned long long)m->tensors, (unsigned long long)m->source_bytes,
           (unsigned long long)m->nwc_bytes, (double)m->nwc_bytes / (double)m->source_bytes, secs,
           (double)m->source_bytes / secs * 1e-9, (double)m->source_bytes / secs * 1e-9 / thr,
           p.last_change - t0, t1 - p.last_change, cpu, (double)m->source_bytes / cpu * 1e-9,
           (double)largest / (double)m->source_bytes, (unsigned long long)cs.st_size,
           (unsigned long long)cs.st_blocks * 512);
    fflush(stdout);
    nwc_model_info_free(m, 1);
    rc = nwc_store_remove(s, name);
  }
  if (rc < 0) fprintf(stderr, "nwc-bench import: %s: %s\n", nwc_strerror(rc), nwc_error_detail());
  nwc_store_close(s);
  if (store_dir == tmp) rm_tree(tmp);
  return rc < 0 ? 1 : 0;
}
