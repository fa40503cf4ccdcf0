/*
 * cpu_features.c - which CPU implementation the decoders use: the best the processor supports
 * (x86-64: SSSE3 for pshufb, AVX2 with FMA and BMI2 for the 256-bit paths, AVX-512 F for
 * the matvec multiply), lowered by the environment variable NWC_CPU = portable | ssse3 | avx2 |
 * avx512.  The variable is read on every call so
 * that tests can run every path in one process; the hardware probe is cached.
 */
#include "decode_internal.h"

#include <stdlib.h>
#include <string.h>

static int hw_level(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  static int cached = -1;
  int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
  if (v < 0) {
    __builtin_cpu_init();
    v = NWC__CPU_PORTABLE;
    if (__builtin_cpu_supports("ssse3")) v = NWC__CPU_SSSE3;
    if (v == NWC__CPU_SSSE3 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("bmi2"))
      v = NWC__CPU_AVX2;
    if (v == NWC__CPU_AVX2 && __builtin_cpu_supports("avx512f"))
      v = NWC__CPU_AVX512;
    __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
  }
  return v;
#else
  return NWC__CPU_PORTABLE;
#endif
}

int nwc__cpu_level(void) {
  int hw = hw_level(), want = hw;
  const char *env = getenv("NWC_CPU");
  if (env && *env) {
    if (!strcmp(env, "portable")) want = NWC__CPU_PORTABLE;
    else if (!strcmp(env, "ssse3")) want = NWC__CPU_SSSE3;
    else if (!strcmp(env, "avx2")) want = NWC__CPU_AVX2;
    else if (!strcmp(env, "avx512")) want = NWC__CPU_AVX512;
  }
  return want < hw ? want : hw;
}
