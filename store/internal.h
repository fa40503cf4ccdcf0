/*
 * internal.h - helpers shared by the codec's translation units (not installed).
 *
 * NWC_RETURN_IF is how the codec rejects outside bytes: it records a one-line detail that
 * nwc_error_detail() returns, and returns the negative errno from the enclosing function.
 */
#ifndef NWC_INTERNAL_H
#define NWC_INTERNAL_H

#include "nwc.h"

#include <errno.h>

#if defined(__GNUC__)
#define NWC__PRINTF(a, b) __attribute__((format(printf, a, b)))
#define NWC__LIKELY(x) __builtin_expect(!!(x), 1)
#define NWC__UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define NWC__PRINTF(a, b)
#define NWC__LIKELY(x) (x)
#define NWC__UNLIKELY(x) (x)
#endif

/* Records the detail text for err and returns err. */
int nwc__fail(int err, const char *fmt, ...) NWC__PRINTF(2, 3);

#define NWC_RETURN_IF(cond, err, ...)                                                            \
  do {                                                                                           \
    if (NWC__UNLIKELY(cond)) return nwc__fail((err), __VA_ARGS__);                               \
  } while (0)

/* Propagates a negative status. */
#define NWC_TRY(expr)                                                                            \
  do {                                                                                           \
    int64_t nwc__rc = (expr);                                                                    \
    if (nwc__rc < 0) return (int)nwc__rc;                                                        \
  } while (0)

/* Largest supported dimension product; keeps every byte count below 2^62. */
#define NWC__MAX_WEIGHTS (UINT64_C(1) << 40)

static inline uint64_t nwc__ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
static inline uint64_t nwc__round_up(uint64_t a, uint64_t b) { return nwc__ceil_div(a, b) * b; }

/* Shape of a layout-0 tensor, derived from M, K and the element type. */
typedef struct nwc__geom {
  uint64_t M, K, K16;
  uint64_t row_blocks, col_blocks, nblocks;
  uint64_t raw_stride; /* bytes per row of the raw plane */
  unsigned type;       /* NWC_ELEM_BF16 or NWC_ELEM_FP8 */
} nwc__geom;

/* Rows of row block rb that lie inside the tensor (8 except in the last row block). */
static inline unsigned nwc__block_rows(const nwc__geom *g, uint64_t rb) {
  uint64_t left = g->M - rb * NWC_BLOCK_ROWS;
  return left < NWC_BLOCK_ROWS ? (unsigned)left : NWC_BLOCK_ROWS;
}

/* Lanes of column block cb whose 16 columns start below K16; the others have empty streams. */
static inline unsigned nwc__active_lanes(const nwc__geom *g, uint64_t cb) {
  uint64_t left = g->K16 - cb * NWC_BLOCK_COLS;
  return left < NWC_BLOCK_COLS ? (unsigned)(left / NWC_LANE_COLS) : NWC_LANES;
}

/* Bytes from one block's base to the next: its units rounded up to words, then to 8 bytes. */
static inline uint64_t nwc__block_span(uint64_t units) {
  return nwc__round_up(4 * nwc__ceil_div(units, 2), NWC_DATA_ALIGN);
}

/* Fills g for an M x K tensor; -EINVAL for a bad shape, -ENOTSUP for an unknown layout/type. */
int nwc__geom_init(nwc__geom *g, uint64_t M, uint64_t K, unsigned elem);

/* Checks nwc_encode's input: w present, n > 0 weights in whole rows of K > 0. */
int nwc__encode_args(const void *w, uint64_t n, uint64_t K);
/* Adds the n fp8 weights' symbols (sym_of[byte]) to freq; -EINVAL naming the first NaN, the
 * weights whose symbol is nan_sym. */
int nwc__fp8_count(const uint8_t *w, uint64_t n, uint64_t K, const unsigned sym_of[256],
                   unsigned nan_sym, uint64_t *freq);

/* fp8 symbol split (docs/format.md, "fp8 symbols"): symbol 0..9 and the 4-bit raw nibble of an
 * fp8 byte, sign excluded.  Returns -1 for the NaN patterns 0x7f and 0xff. */
int nwc__fp8_split(uint8_t b, unsigned *sym, unsigned *nibble);
/* The byte an fp8 symbol decodes to (its fp32 exponent field shifted right by one). */
extern const uint8_t nwc__fp8_sym_byte[NWC_FP8_SYMBOLS];

/* Position of an fp8 weight's nibble inside a lane's 8 bytes for 16 consecutive weights j:
 * byte (j & 3) + 4 * (j >> 3), high nibble when bit 2 of j is set. */
static inline unsigned nwc__fp8_nib_byte(unsigned j) { return (j & 3u) + 4u * (j >> 3); }
static inline unsigned nwc__fp8_nib_shift(unsigned j) { return (j & 4u) ? 4u : 0u; }

/* ---- layout-0 encoding on several threads (store/encode.c) ---- */

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

/* Layouts 1 and 2, CPU feature dispatch, batched matvec: the interface the files above dispatch
 * to (store/layouts.h). */
#include "layouts.h"

#endif /* NWC_INTERNAL_H */
