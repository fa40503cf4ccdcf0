/*
 * encode_internal.h - what the encoder's translation units share (not installed): the entry points
 * of each layout's encoder, the layout-0 helpers layouts 1 and 2 reuse (ranking, prefix codes),
 * the walk of a layout-1/2 block in fragment order, and the layout-0 encoder in steps on several
 * threads that the store's import drives.  No decoder includes it.
 */
#ifndef NWC_ENCODE_INTERNAL_H
#define NWC_ENCODE_INTERNAL_H

#include "internal.h"

/* ---- layout 0 (store/encode.c) -------------------------------------------------------------- */

/* nwc_encode and nwc_tensor_encode for layout 0 (encode_api.c chooses by layout). */
int64_t nwc__l0_encode(const void *w, uint64_t n, uint64_t K, unsigned elem, uint64_t *freq,
                       uint8_t psym[16], uint64_t *bases, uint8_t *hdr, uint8_t *data, uint64_t cap,
                       uint8_t *raw);
int nwc__l0_tensor_encode(const void *w, uint64_t rows, uint64_t cols, unsigned elem,
                          const float *scale, nwc_tensor *t);

/* Checks nwc_encode's input: w present, n > 0 weights in whole rows of K > 0. */
int nwc__encode_args(const void *w, uint64_t n, uint64_t K);
/* Adds the n fp8 weights' symbols (sym_of[byte]) to freq; -EINVAL naming the first NaN, the
 * weights whose symbol is nan_sym. */
int nwc__fp8_count(const uint8_t *w, uint64_t n, uint64_t K, const unsigned sym_of[256],
                   unsigned nan_sym, uint64_t *freq);

/* Ranks nsym symbols by descending count, ties by ascending symbol (the layout-0 ranking). */
void nwc__rank_symbols(const uint64_t *freq, unsigned nsym, unsigned *order);
/* The layout-0 prefix code of every input byte (BF16: high byte; fp8: the byte) for the weights
 * w (n of them, type NWC_ELEM_BF16/FP8), with psym and freq as nwc_encode gives them.
 * -EINVAL for an fp8 NaN. */
int nwc__prefix_codes(const void *w, uint64_t M, uint64_t K, unsigned elem, uint64_t *freq,
                      uint8_t psym[16], uint32_t bits[256], uint8_t len[256]);

/* ---- layout-0 encoding on several threads (store/encode.c) --------------------------------- */

/* Most threads a parallel call starts. */
#define NWC__MAX_THREADS 256

/* Runs fn(ctx, 0 .. ntasks-1) on up to `threads` threads (the caller's among them), each thread
 * taking the next task until none is left; returns when all are done.  thread (0 .. threads-1)
 * says which thread runs the task.  If a thread cannot be started, the others do its share. */
void nwc__parallel_for(unsigned threads, uint64_t ntasks,
                       void (*fn)(void *ctx, uint64_t task, unsigned thread), void *ctx);

/* Reads len bytes of the input, from byte off on, into dst (a buffer of the encoder's); 0 or a
 * negative errno.  Called from any of the encoder's threads, whole rows of about 1 MiB at a time,
 * three times per byte (histogram, streams, raw plane; the raw plane's rows once per range that
 * touches them). */
typedef int (*nwc__enc_read_fn)(void *ctx, uint64_t off, uint64_t len, void *dst);

/*
 * A layout-0 encoding in steps, on `threads` threads, for a caller that places the arrays itself
 * (import writes them straight into a blob).  The output is byte for byte nwc_tensor_encode's.
 *   nwc__enc_begin   counts the symbols of w, or (read not NULL; w unused) of the input read
 *                    piece by piece, fixes psym and the codes; freq (may be NULL) gets the
 *                    histogram as for nwc_encode.  *e is freed with nwc__enc_free.
 *   nwc__enc_bound   bytes data must hold for nwc__enc_streams (at most nwc_encode's bound plus
 *                    one per band).
 *   nwc__enc_streams bases[nblocks + 1], hdr[nblocks * 32], data; returns data_bytes.
 *   nwc__enc_raw_range  bytes [q0, q1) of the raw plane into dst, on the calling thread, which
 *                    is encoder thread `thread` (< nwc__enc_threads(e); one call at a time per
 *                    thread); returns 0.  Calls for disjoint ranges may run at once.
 * Errors: -EINVAL for a bad shape or an fp8 NaN (begin), -ENOTSUP for a layout other than 0,
 * -ENOMEM, or what read returned (any step).
 */
typedef struct nwc__enc nwc__enc;
int nwc__enc_begin(const void *w, uint64_t rows, uint64_t cols, unsigned elem, unsigned threads,
                   nwc__enc_read_fn read, void *read_ctx, uint64_t *freq, uint8_t psym[16],
                   nwc__enc **e);
uint64_t nwc__enc_bound(const nwc__enc *e);
int64_t nwc__enc_streams(nwc__enc *e, uint64_t *bases, uint8_t *hdr, uint8_t *data);
int nwc__enc_raw_range(nwc__enc *e, uint64_t q0, uint64_t q1, uint8_t *dst, unsigned thread);
unsigned nwc__enc_threads(const nwc__enc *e);
void nwc__enc_free(nwc__enc *e);

/* ---- layouts 1 and 2 (store/lx_encode.c, layout1_encode.c, layout2_encode.c) --------------- */

/* A planned encoding: what nwc_encode and nwc_tensor_encode need to size and then write. */
typedef struct nwc__lx_plan {
  nwc__lgeom lg;
  const uint16_t *w16;  /* BF16 input, or */
  const uint8_t *w8;    /* fp8 input */
  const uint64_t *bases;
  const uint8_t *hdr;
  /* layout 1: the prefix code by input byte (BF16 high byte, fp8 byte); fp8 raw nibble */
  uint32_t bits[256];
  uint8_t len[256];
  uint8_t fp8_nib[256];
  /* layout 2: nibble [sign | rank] by input key (BF16 high byte, fp8 byte; rank 7: exception),
   * fp8 3-bit mantissa field by byte */
  uint8_t nib[256];
  uint8_t mant[256];
} nwc__lx_plan;
/* nwc_encode and nwc_tensor_encode for layouts 1 and 2 (store/lx_encode.c). */
int64_t nwc__lx_encode(const void *w, uint64_t n, uint64_t K, unsigned elem, uint64_t *freq,
                       uint8_t psym[16], uint64_t *bases, uint8_t *hdr, uint8_t *data, uint64_t cap,
                       uint8_t *raw);
int nwc__lx_tensor_encode(const void *w, uint64_t rows, uint64_t cols, unsigned elem,
                          const float *scale, nwc_tensor *t);

/* Per layout: plan p (lg and the input set): symbols, psym, freq (may be NULL), hdr[] and
 * bases[] (caller arrays sized by nwc_layout), *data_bytes.  -EINVAL for an fp8 NaN, -ERANGE
 * (layout 2) for more than 255 exceptions in one lane of one block.  Then write data and raw. */
int nwc__l1_plan(nwc__lx_plan *p, uint64_t *freq, uint8_t psym[16], uint64_t *bases,
                 uint8_t *hdr, uint64_t *data_bytes);
void nwc__l1_write(const nwc__lx_plan *p, uint8_t *data, uint8_t *raw);
int nwc__l2_plan(nwc__lx_plan *p, uint64_t *freq, uint8_t psym[16], uint64_t *bases,
                 uint8_t *hdr, uint64_t *data_bytes);
void nwc__l2_write(const nwc__lx_plan *p, uint8_t *data, uint8_t *raw);

/* The input key (BF16 high byte, fp8 byte) of input index i; -1 for a filler. */
static inline int nwc__lx_key(const nwc__lx_plan *p, uint64_t i) {
  if (i == NWC__LX_FILLER) return -1;
  return p->w16 ? p->w16[i] >> 8 : p->w8[i];
}

#endif /* NWC_ENCODE_INTERNAL_H */
