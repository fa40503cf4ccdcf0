/*
 * import_source.c - the source tensors of an import: their bytes, pread from the safetensors
 * files (never mapped: a file that shrinks gives an error, not SIGBUS), and their values
 * converted: F16, F32, F8_E5M2 and BF16 as floats, F64 to BF16 with a single rounding.
 */
#include "import_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float f16_to_f32(uint16_t h) {
  uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  if (e == 0) {
    float f = (float)m * 0x1p-24f; /* zero or subnormal, exact */
    memcpy(&u, &f, 4);
    u |= s;
  } else if (e == 31) {
    u = s | 0x7f800000u | (m << 13);
  } else {
    u = s | ((e + 112) << 23) | (m << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Element i of a float tensor (F32, F16, BF16 or F8_E5M2) at possibly unaligned p.  F8_E5M2 is
 * the high byte of an F16, so every one of its values is exact in F32 and in BF16. */
float nwc__imp_load_float(const char *dtype, const uint8_t *p, uint64_t i) {
  if (!strcmp(dtype, "F32")) {
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
  }
  if (!strcmp(dtype, "F8_E5M2")) return f16_to_f32((uint16_t)(p[i] << 8));
  uint16_t h;
  memcpy(&h, p + 2 * i, 2);
  return !strcmp(dtype, "F16") ? f16_to_f32(h) : nwc_bf16_to_f32(h);
}

/* F64 to BF16 with one rounding to nearest even.  Rounding to F32 and then to BF16 would round
 * twice (1 + 2^-8 + 2^-40 would become 1, not 1 + 2^-7), so the step to F32 rounds to odd
 * instead (toward zero, the last bit set when inexact): F32 keeps 16 bits more than BF16, in the
 * subnormal range too, and round to odd followed by a rounding to 2 or more bits fewer is the
 * one correct rounding.  Beyond the F32 range the truncation is the largest F32, odd, which
 * rounds to infinity as it must; NaN stays NaN. */
uint16_t nwc__imp_f64_to_bf16(const uint8_t *p, uint64_t i) {
  double d;
  memcpy(&d, p + 8 * i, 8);
  float f = (float)d;
  uint32_t u;
  memcpy(&u, &f, 4);
  if (!isnan(d) && (double)f != d) {
    if (fabs((double)f) > fabs(d)) u--; /* rounded away from zero: the truncation is below */
    u |= 1;
  }
  memcpy(&f, &u, 4);
  return nwc_f32_to_bf16(f);
}

int nwc__imp_read_error(const src_file *sf, const nwc_st_tensor *st, int rc) {
  return nwc__fail(rc == -EIO ? -EBADMSG : rc,
                   "%s: tensor '%s': cannot read its %llu bytes (did the file shrink?)", sf->label,
                   st->name, (unsigned long long)(st->end - st->begin));
}

/* Reads a tensor's bytes from its source file into dst. */
int nwc__imp_read_tensor(const src_file *sf, const nwc_st_tensor *st, void *dst) {
  int rc = nwc__pread_full(sf->fd, dst, st->end - st->begin, sf->f->data_offset + st->begin);
  return rc < 0 ? nwc__imp_read_error(sf, st, rc) : 0;
}

int nwc__imp_read_part(void *ctx, uint64_t off, uint64_t len, void *dst) {
  const part_src *ps = ctx;
  return nwc__pread_full(ps->sf->fd, dst, len, ps->sf->f->data_offset + ps->st->begin + off);
}

/* The per-row companion scale of an F8_E4M3 tensor as floats (malloc'ed into *out). */
int nwc__imp_read_scale(const imp *im, const job *j, float **out) {
  const nwc_st_tensor *c = j->scale;
  uint8_t *raw = malloc(c->end - c->begin + 1);
  float *v = malloc(c->numel * sizeof *v + 1);
  int rc = raw && v ? nwc__imp_read_tensor(&im->src[j->scale_source], c, raw) : -ENOMEM;
  for (uint64_t r = 0; rc == 0 && r < c->numel; r++) v[r] = nwc__imp_load_float(c->dtype, raw, r);
  free(raw);
  if (rc < 0) free(v), v = NULL;
  *out = v;
  return rc;
}
