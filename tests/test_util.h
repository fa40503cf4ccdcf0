/*
 * test_util.h - what every test program shares: a fresh random seed per run (printed, and taken
 * from NWC_SEED to replay a failure), a small PRNG, checks that count failures, and the exit
 * codes ctest understands (0 pass, 1 fail, 77 skip).
 */
#ifndef NWC_TEST_UTIL_H
#define NWC_TEST_UTIL_H

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TEST_SKIP 77

static int test_failures;

#define CHECK(cond, ...)                                                                         \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      test_failures++;                                                                           \
      fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);                   \
      fprintf(stderr, __VA_ARGS__);                                                              \
      fputc('\n', stderr);                                                                       \
    }                                                                                            \
  } while (0)

/* A failed CHECK_RC prints the errno text and the codec's detail line. */
#define CHECK_RC(expr)                                                                           \
  do {                                                                                           \
    long long rc_ = (long long)(expr);                                                           \
    CHECK(rc_ >= 0, "%s returned %lld (%s: %s)", #expr, rc_, nwc_strerror((int)rc_),            \
          nwc_error_detail());                                                                   \
  } while (0)

/* xoshiro256** seeded by splitmix64. */
static uint64_t test_rng_s[4];

static uint64_t test_splitmix(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline uint64_t test_rand(void) {
  uint64_t *s = test_rng_s, r = s[1] * 5;
  r = ((r << 7) | (r >> 57)) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3], s[2] ^= t;
  s[3] = (s[3] << 45) | (s[3] >> 19);
  return r;
}

/* Uniform in [0, n). */
static inline uint64_t test_below(uint64_t n) { return n ? test_rand() % n : 0; }
/* Uniform in [0, 1). */
static inline double test_uniform(void) { return (double)(test_rand() >> 11) * 0x1p-53; }

/* Seeds the PRNG from NWC_SEED or from the clock and pid, and prints the seed.  stdout becomes
 * line-buffered, so that a test's log keeps its order with stderr and a forked child never
 * writes out the parent's unflushed lines again. */
static uint64_t test_seed(const char *name) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *env = getenv("NWC_SEED");
  uint64_t seed;
  if (env && *env) {
    seed = strtoull(env, NULL, 0);
  } else {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    seed = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
  }
  uint64_t x = seed;
  for (int i = 0; i < 4; i++) test_rng_s[i] = test_splitmix(&x);
  printf("%s: seed %" PRIu64 " (replay with NWC_SEED=%" PRIu64 ")\n", name, seed, seed);
  return seed;
}

/* Reads the file DIR/NAME EXT whole (malloc'ed, *len bytes; the golden files), or returns NULL
 * after a failed CHECK. */
static inline uint8_t *test_slurp(const char *dir, const char *name, const char *ext,
                                  size_t *len) {
  char path[4608]; /* a 4096-byte folder, a 256-byte name and an extension */
  snprintf(path, sizeof path, "%s/%s%s", dir, name, ext);
  FILE *f = fopen(path, "rb");
  CHECK(f, "cannot open %s: %s", path, strerror(errno));
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *p = n >= 0 ? malloc((size_t)(n > 0 ? n : 1)) : NULL;
  size_t got = p ? fread(p, 1, (size_t)n, f) : 0;
  fclose(f);
  CHECK(p && got == (size_t)n, "cannot read %s", path);
  if (!p || got != (size_t)n) {
    free(p);
    return NULL;
  }
  *len = got;
  return p;
}

static int test_exit(const char *name) {
  if (test_failures) {
    fprintf(stderr, "%s: %d check(s) failed\n", name, test_failures);
    return 1;
  }
  printf("%s: ok\n", name);
  return 0;
}

#endif
