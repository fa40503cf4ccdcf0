/*
 * import_plan.c - the import's plan phase: parse every source file and the index, check names,
 * dtypes, shapes, duplicates across shards, that the index and the shards agree; turn each
 * tensor nwc stores into a job (conversion, quantization, companion scale, its blob's layout and
 * place in the container) and set aside the ones it does not store.  Any bad input fails here,
 * before a byte is written.
 */
#include "import_internal.h"
#include "nwc_escape.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct name_ref {
  const char *name;
  size_t src, idx;
} name_ref;

unsigned nwc_import_layout(unsigned layout, unsigned type, unsigned ndim, uint64_t rows) {
  if (layout != NWC_LAYOUT_AUTO) return layout;
  return type == NWC_ELEM_BF16 && ndim >= 2 && rows >= 16 ? 2 : 0;
}

static int cmp_name_ref(const void *a, const void *b) {
  return strcmp(((const name_ref *)a)->name, ((const name_ref *)b)->name);
}

static const name_ref *find_name(const name_ref *v, size_t n, const char *name) {
  name_ref key = {name, 0, 0};
  return bsearch(&key, v, n, sizeof *v, cmp_name_ref);
}

static int cmp_job_pos(const void *a, const void *b) {
  const job *x = a, *y = b;
  if (x->source != y->source) return (x->source > y->source) - (x->source < y->source);
  return (x->st->begin > y->st->begin) - (x->st->begin < y->st->begin);
}

/* The dtypes nwc stores: every floating-point one safetensors has.  The others (integers, BOOL)
 * are skipped, as are empty tensors: nothing in them is a weight to compress. */
#define STORED_DTYPES "BF16, F16, F32, F64, F8_E4M3, F8_E5M2"

static int stored_dtype(const char *d) {
  static const char *const k[] = {"BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2"};
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
    if (!strcmp(d, k[i])) return 1;
  return 0;
}

/* 1 if the import stores st, 0 if it skips it. */
static int storable(const nwc_st_tensor *st) { return st->numel > 0 && stored_dtype(st->dtype); }

/* What makes st unstorable, for messages: "I64" or "an empty F32 tensor" (static buffer). */
static const char *unstorable_why(const nwc_st_tensor *st) {
  static _Thread_local char why[48];
  if (stored_dtype(st->dtype)) snprintf(why, sizeof why, "an empty %s tensor", st->dtype);
  else snprintf(why, sizeof why, "%s", st->dtype);
  return why;
}

/* The checks every tensor passes, stored or skipped: a valid name, a dtype safetensors defines
 * (its size against the shape was checked by the parser). */
static int check_tensor(const imp *im, const job *j) {
  const char *f = im->src[j->source].label, *nm = j->st->name;
  char safe[200]; /* the name as a terminal may show it: escaped, and cut */
  nwc__escape(nm, safe, sizeof safe);
  size_t len = strlen(nm);
  NWC_RETURN_IF(len > NWC_TENSOR_NAME_MAX, -ENAMETOOLONG, "%s: tensor name '%s...' is %zu bytes "
                "long; nwc stores names of at most %d bytes (what its protocol carries)", f, safe,
                len, NWC_TENSOR_NAME_MAX);
  NWC_RETURN_IF(!nwc_tensor_name_valid(nm), -EBADMSG,
                "%s: tensor name '%s' is not UTF-8 without control characters", f, safe);
  NWC_RETURN_IF(!j->st->dtype_size, -EBADMSG, "%s: tensor '%s': unknown dtype '%s'", f, nm,
                j->st->dtype);
  return 0;
}

static int plan_tensor(imp *im, job *j, const name_ref *names, size_t nnames) {
  const src_file *sf = &im->src[j->source];
  const nwc_st_tensor *st = j->st;
  const char *f = sf->label, *nm = st->name;
  int f16 = !strcmp(st->dtype, "F16"), f32 = !strcmp(st->dtype, "F32");
  int f64 = !strcmp(st->dtype, "F64"), e5m2 = !strcmp(st->dtype, "F8_E5M2");
  int f8 = !strcmp(st->dtype, "F8_E4M3");
  nwc__pub_tensor *pt = &j->pub;
  pt->name = nm;
  pt->ndim = st->ndim;
  memcpy(pt->shape, st->shape, sizeof pt->shape);
  pt->dtype = st->dtype;
  pt->source = j->source;
  nwc_st_matrix_shape(st, &pt->rows, &pt->cols);
  pt->source_bytes = st->end - st->begin;
  j->conv = f16 ? CONV_F16 : f32 ? CONV_F32 : f64 ? CONV_F64 : e5m2 ? CONV_E5M2 : CONV_NONE;
  j->quantize = !f8 && im->o.elem == NWC_ELEM_FP8 && st->ndim >= 2;
  unsigned type = f8 || j->quantize ? NWC_ELEM_FP8 : NWC_ELEM_BF16;
  pt->elem = NWC_ELEM(type, nwc_import_layout(im->o.layout, type, st->ndim, pt->rows));
  pt->raw_bytes = st->numel * (type == NWC_ELEM_FP8 ? 1 : 2);
  uint64_t lay[4];
  int rc = nwc_layout(pt->rows, pt->cols, pt->elem, lay);
  if (rc < 0) return nwc__fail_prefix(rc, "%s: tensor '%s'", f, nm);
  static const char *const conv_name[] = {
      [CONV_NONE] = "none", [CONV_F16] = "f16->bf16 rne", [CONV_F32] = "f32->bf16 rne",
      [CONV_F64] = "f64->bf16 rne", [CONV_E5M2] = "f8_e5m2->bf16 exact"};
  const char *c = conv_name[j->conv];
  if (j->quantize)
    snprintf(j->conversion, sizeof j->conversion, "%s%sbf16->fp8 row absmax/448",
             j->conv ? c : "", j->conv ? ", " : "");
  else snprintf(j->conversion, sizeof j->conversion, "%s", c);
  if (f8) {
    /* Companion scale: NAME_scale_inv, NAME_scale or NAME.scale (multiplied into the weights). */
    static const char *const suffix[] = {"_scale_inv", "_scale", ".scale"};
    for (int k = 0; k < 3 && !j->scale; k++) {
      char buf[4096];
      if (snprintf(buf, sizeof buf, "%s%s", nm, suffix[k]) >= (int)sizeof buf) continue;
      const name_ref *r = find_name(names, nnames, buf);
      if (!r || !storable(&im->src[r->src].f->tensors[r->idx])) continue;
      j->scale = &im->src[r->src].f->tensors[r->idx];
      j->scale_source = (unsigned)r->src;
    }
    snprintf(j->conversion, sizeof j->conversion, "fp8 e4m3 as stored");
    if (j->scale) {
      pt->scale_tensor = j->scale->name;
      const char *d = j->scale->dtype;
      int fl = !strcmp(d, "F32") || !strcmp(d, "F16") || !strcmp(d, "BF16");
      j->fold = fl && j->scale->numel == pt->rows;
      float *v = NULL;
      if (j->fold) {
        rc = nwc__imp_read_scale(im, j, &v);
        if (rc < 0) return rc;
      }
      for (uint64_t r = 0; j->fold && r < pt->rows; r++)
        if (!isfinite(v[r]) || v[r] <= 0) j->fold = 0;
      free(v);
      snprintf(j->conversion, sizeof j->conversion, "fp8 e4m3, %s",
               j->fold ? "per-row scale folded from the companion" : "companion scale kept apart");
    }
  }
  pt->conversion = j->conversion;
  return 0;
}

int nwc__imp_plan(imp *im, const nwc_st_index *x, const char *index_label) {
  size_t total = 0;
  for (size_t i = 0; i < im->nsrc; i++) total += im->src[i].f->count;
  NWC_RETURN_IF(total == 0, -EBADMSG, "%s: no tensors", x ? index_label : im->src[0].label);
  name_ref *names = malloc(total * sizeof *names);
  im->jobs = calloc(total, sizeof *im->jobs);
  if (!names || !im->jobs) {
    free(names);
    return -ENOMEM;
  }
  size_t n = 0;
  for (size_t i = 0; i < im->nsrc; i++)
    for (size_t k = 0; k < im->src[i].f->count; k++)
      names[n++] = (name_ref){im->src[i].f->tensors[k].name, i, k};
  qsort(names, n, sizeof *names, cmp_name_ref);
  int rc = 0;
  for (size_t i = 1; rc == 0 && i < n; i++)
    if (!strcmp(names[i].name, names[i - 1].name))
      rc = nwc__fail(-EBADMSG, "%s%stensor '%s' is in both %s and %s", x ? index_label : "",
                     x ? ": " : "", names[i].name,
                     im->src[names[i - 1].src].label, im->src[names[i].src].label);
  if (rc == 0 && x) {
    for (size_t i = 0; rc == 0 && i < x->count; i++) {
      const name_ref *r = find_name(names, n, x->names[i]);
      if (!r)
        rc = nwc__fail(-EBADMSG, "%s: tensor '%s' is not in its shard %s", index_label,
                       x->names[i], x->shards[x->shard_of[i]]);
      else if (r->src != x->shard_of[i])
        rc = nwc__fail(-EBADMSG, "%s: tensor '%s' is listed in %s but found in %s", index_label,
                       x->names[i], x->shards[x->shard_of[i]], im->src[r->src].label);
    }
    if (rc == 0 && x->count != n) /* every index entry matched one tensor, so some are unlisted */
      for (size_t i = 0; rc == 0 && i < n; i++) {
        size_t k = 0;
        while (k < x->count && strcmp(x->names[k], names[i].name)) k++;
        if (k == x->count)
          rc = nwc__fail(-EBADMSG, "%s: tensor '%s' of %s is not in the index", index_label,
                         names[i].name, im->src[names[i].src].label);
      }
  }
  for (size_t i = 0; rc == 0 && i < n; i++) {
    job *j = &im->jobs[i];
    j->st = &im->src[names[i].src].f->tensors[names[i].idx];
    j->source = (unsigned)names[i].src;
  }
  if (rc == 0) qsort(im->jobs, n, sizeof *im->jobs, cmp_job_pos);
  /* In source order: the tensors to store move down to jobs[0, njobs), the others are skipped. */
  im->skips = rc ? NULL : malloc(n * sizeof *im->skips);
  if (rc == 0 && !im->skips) rc = -ENOMEM;
  for (size_t i = 0; rc == 0 && i < n; i++) {
    job j = im->jobs[i];
    rc = check_tensor(im, &j);
    if (rc == 0 && !storable(j.st)) {
      if (im->o.strict)
        rc = nwc__fail(-ENOTSUP,
                       "%s: tensor '%s' is %s, which nwc does not store (a strict import stores "
                       "every tensor or none; nwc stores " STORED_DTYPES ")",
                       im->src[j.source].label, j.st->name, unstorable_why(j.st));
      else im->skips[im->nskips++] = (skip_ref){j.st, j.source};
      continue;
    }
    if (rc == 0) {
      job *k = &im->jobs[im->njobs++];
      *k = j;
      rc = plan_tensor(im, k, names, n);
      im->total += k->st->end - k->st->begin;
    }
  }
  if (rc == 0 && im->njobs == 0)
    rc = nwc__fail(-ENOTSUP,
                   "%s: no tensor can be stored ('%s' is %s%s); nwc stores the floating-point "
                   "dtypes " STORED_DTYPES ", and no empty tensor",
                   x ? index_label : im->src[0].label, im->skips[0].st->name,
                   unstorable_why(im->skips[0].st), n > 1 ? ", and so are all the others" : "");
  /* Bias links: PREFIXweight -> PREFIXbias when that is 1 x rows (the rule of migration 2->3). */
  for (size_t i = 0; rc == 0 && i < n; i++) {
    job *j = &im->jobs[i];
    size_t len = strlen(j->st->name);
    if (len < 6 || strcmp(j->st->name + len - 6, "weight")) continue;
    char *bn = malloc(len + 1);
    if (!bn) {
      rc = -ENOMEM;
      break;
    }
    memcpy(bn, j->st->name, len - 6);
    strcpy(bn + len - 6, "bias");
    const name_ref *r = find_name(names, n, bn);
    free(bn);
    if (!r) continue;
    const nwc_st_tensor *b = &im->src[r->src].f->tensors[r->idx];
    if (!storable(b)) continue;
    uint64_t brows, bcols;
    nwc_st_matrix_shape(b, &brows, &bcols);
    if (brows == 1 && b->numel == j->pub.rows) j->pub.bias_tensor = b->name;
  }
  free(names);
  return rc;
}
