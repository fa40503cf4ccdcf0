/*
 * nwc_kernels.h - the CUDA kernels: linear/matvec, dequant and gather for layout 0 and layouts 1
 * and 2 (BF16 and fp8; docs/format-layouts.md), dispatched on the tensor's layout, and the plain fp8
 * matvec they are measured against.  C ABI, usable from C17.
 *
 * A tensor lives on the device as an nwc_k_tensor: the arrays of an nwc_tensor (docs/format.md)
 * copied to device memory plus its 4096-word lookup table (layout 0) and psym.  nwc_k_tensor_upload() makes one from
 * a validated host tensor; a daemon that loads the arrays itself fills the struct directly (all
 * pointers device pointers, the table from nwc_build_tab).
 *
 * Every function takes a cudaStream_t and only enqueues work on it (no allocation, no
 * synchronization, so calls can be captured in a CUDA graph), checks shapes and pointers first,
 * checks cudaGetLastError() after each launch, and returns 0 or a negative errno:
 *   -EINVAL     a NULL pointer, a shape the tensor does not have, a bad row index
 *   -ENOTSUP    an element type or layout the kernels lack
 *   -EOVERFLOW  a tensor too large for the kernels' 32-bit block and row counters
 *   -EIO        the CUDA runtime reported an error (nwc_k_last_cuda_error() returns its code)
 * Nothing here exits or prints.
 *
 * The kernels trust the tensor's bytes: upload validates them (nwc_tensor_validate); a daemon
 * filling nwc_k_tensor itself must have validated them too.
 */
#ifndef NWC_KERNELS_H
#define NWC_KERNELS_H

#include "nwc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA runtime's own definition (driver_types.h), repeated so that this header needs no CUDA
 * include; a repeated identical typedef is valid C11 and C++. */
typedef struct CUstream_st *cudaStream_t;

typedef struct nwc_k_tensor {
  unsigned elem;          /* NWC_ELEM(type, 0) */
  uint64_t rows, cols;    /* M, K */
  uint64_t nblocks;
  const uint32_t *tab;    /* 4096 words: nwc_build_tab(psym, elem) (layouts 0 and 1) */
  const uint64_t *bases;  /* nblocks + 1 */
  const uint8_t *hdr;     /* nblocks * 32 */
  const uint8_t *data;    /* data_bytes, NWC_DATA_SLACK zero bytes at the end */
  const uint8_t *raw;     /* rows * raw stride */
  const float *scale;     /* rows floats, or NULL for 1 */
  uint8_t psym[16];       /* the tensor's psym (layout 2 reads its lut from here) */
  void *owned;            /* the one device allocation behind the pointers (upload), or NULL */
} nwc_k_tensor;

/* Validates t, copies it to one new device allocation and fills *d (synchronously: the host
 * arrays may be freed after return).  Free with nwc_k_tensor_free.  Returns 0, -EBADMSG for an
 * invalid tensor, -ENOMEM, -EIO. */
NWC_EXTERN int nwc_k_tensor_upload(const nwc_tensor *t, nwc_k_tensor *d, cudaStream_t stream);
/* Frees what upload allocated and zeroes *d; NULL or a borrowed view frees nothing. */
NWC_EXTERN void nwc_k_tensor_free(nwc_k_tensor *d);

/* Columns of x one matvec call takes: layouts 1 and 2 multiply 1..8 in one pass on the tensor cores. */
#define NWC_K_MAX_COLS 8

/* Bytes of scratch the matvec entries need for ncols (1..8) columns of x (enough for fewer too),
 * or a negative errno.  Scratch must be zeroed once before its first call (cudaMemset): layouts 1
 * and 2 pass sums between CTAs there as words that are non-zero once written, and every call of any
 * layout leaves them zero again.  One scratch serves one call at a time, of any tensor (of any
 * layout) whose nwc_k_scratch_bytes it holds. */
NWC_EXTERN int64_t nwc_k_scratch_bytes(const nwc_k_tensor *t, unsigned ncols);

/* The cudaError_t of the last -EIO on this thread (0 if none). */
NWC_EXTERN int nwc_k_last_cuda_error(void);

/* The per-warp timeline of the last launches of the tensor-core matvecs (kernels/timeline.cuh),
 * appended to the file at path as text lines that begin with tag, then cleared (path NULL: cleared
 * only).  0, -errno, -EIO, or -ENOTSUP when the kernels were built without
 * -DNWC_KERNEL_TIMELINE=ON (scripts/timeline-summary reads the file). */
NWC_EXTERN int nwc_k_timeline_dump(const char *path, const char *tag);

/*
 * Y = scale * (W X) + bias for ncols (1..8) columns in one pass over the weights.  Column c of X
 * is x + c * ldx (16-byte aligned, ldx a multiple of 4 and >= K); layout 0 reads K16 floats of it
 * (x[K..K16) must be 0), layouts 1 and 2 read the first K.  bias: rows floats or NULL.  Column c of the
 * result goes to y + c * ldy (fp32) and/or y_bf16 + c * ldy (BF16, nearest even); either may be
 * NULL, not both.  scratch: nwc_k_scratch_bytes(t, ncols) bytes (see there).  Layout 0 runs its
 * one-column kernels once per column; layouts 1 and 2 multiply all columns on the tensor cores.
 */
NWC_EXTERN int nwc_k_matvec_cols(const nwc_k_tensor *t, const float *x, unsigned ncols, uint64_t ldx,
                                 const float *bias, float *y, uint16_t *y_bf16, uint64_t ldy,
                                 void *scratch, cudaStream_t stream);

/*
 * nwc_k_matvec_cols with X in BF16, as inference engines hold activations: column c at x + c * ldx
 * (16-byte aligned, ldx a multiple of 8 and >= K where ncols > 1), the first K elements read.  A
 * BF16 element is its own exact part of the mma's B operand (fp32 x takes three), so up to 8
 * columns fill one tile: eight cost about what one does.  Layouts 1 and 2; -ENOTSUP for layout 0,
 * whose kernels read fp32 x (nwc_k_load_x stages it).
 */
NWC_EXTERN int nwc_k_matvec_cols_bf16x(const nwc_k_tensor *t, const uint16_t *x, unsigned ncols, uint64_t ldx,
                                       const float *bias, float *y, uint16_t *y_bf16, uint64_t ldy,
                                       void *scratch, cudaStream_t stream);

/*
 * y = scale * (W x) + bias, rounded to BF16 (nearest even): nwc_k_matvec_cols with one column.
 * x: K16 floats (K16 = K rounded up to 16), x[K..K16) must be 0.  bias: rows floats or NULL.
 * scratch: nwc_k_scratch_bytes(t, 1) bytes (layout 0: the NWC_LAYOUT_SCRATCH floats of
 * nwc_layout(), partial sums per row and column block).
 */
NWC_EXTERN int nwc_k_linear_bf16(const nwc_k_tensor *t, const float *x, const float *bias,
                                 uint16_t *y, float *scratch, cudaStream_t stream);
/* The same with fp32 y (the test path; same kernels, finalize writes floats). */
NWC_EXTERN int nwc_k_matvec(const nwc_k_tensor *t, const float *x, const float *bias, float *y,
                            float *scratch, cudaStream_t stream);
/* Row-major BF16 output, row stride K16 (as nwc_dequant; fp8 yields unscaled values). */
NWC_EXTERN int nwc_k_dequant(const nwc_k_tensor *t, uint16_t *out, cudaStream_t stream);
/*
 * Rows [row0, row0 + nrows) as nwc_k_dequant writes them: row r to out + (r - row0) * K16, so that
 * a dense weight can be made in bounded pieces.  row0 must be a multiple of NWC_K_ROW_ALIGN (the
 * row groups of every layout: 8 rows in layout 0, 16 in layouts 1 and 2), nrows a multiple of it or
 * reaching the last row (row0 + nrows == rows); out 16-byte aligned; else -EINVAL.  nrows 0 does
 * nothing.  -ENOTSUP where nwc_k_dequant is (a layout or type the kernels lack).
 */
#define NWC_K_ROW_ALIGN 16
NWC_EXTERN int nwc_k_dequant_rows(const nwc_k_tensor *t, uint64_t row0, uint64_t nrows, uint16_t *out,
                                  cudaStream_t stream);
/* out[i * K16 ...] = row rows[i] (device array of n indices); -EINVAL is not detected for an
 * index >= rows on the device: such a row is skipped and its output left as it was. */
NWC_EXTERN int nwc_k_gather(const nwc_k_tensor *t, const uint64_t *rows, uint64_t n,
                            uint16_t *out, cudaStream_t stream);

/*
 * The plain fp8 weight-only matvec: the bandwidth baseline for fp8.  q: M x K fp8 e4m3 bytes,
 * row-major, K a multiple of 16; y = scale[r] * (q_r . x) + bias[r], rounded to BF16; scale and
 * bias may be NULL.  Persistent warps, two rows at a time, 16-byte loads.
 */
NWC_EXTERN int nwc_k_ref_fp8(const uint8_t *q, uint64_t M, uint64_t K, const float *x,
                             const float *scale, const float *bias, uint16_t *y,
                             cudaStream_t stream);

/* ---- around the decoders: x in, results out (io.cu) ------------------------------------------
 * For callers whose vectors are laid out otherwise than the kernels above take them.  Each
 * enqueues one kernel on stream; pointers are device pointers (or device views of mapped host
 * memory); K16 is K rounded up to 16.  0, -EINVAL for a NULL pointer or an empty shape where
 * one is needed, -EOVERFLOW, -EIO. */

/* dx[c * K16 ..] = ncols columns of K floats xld apart at src, each zero padded to K16 (the x
 * that nwc_k_matvec takes).  xld >= K. */
NWC_EXTERN int nwc_k_load_x(const float *src, uint64_t K, uint64_t xld, uint64_t ncols, float *dx,
                            cudaStream_t stream);
/* y[c * M + i] = scale * t[c * M + i] + bias[i] for ncols columns of M floats (bias: M floats or
 * NULL), as floats or (bf16) BF16 rounded to nearest even. */
NWC_EXTERN int nwc_k_epilogue(const float *t, uint64_t M, uint64_t ncols, float scale,
                              const float *bias, void *y, int bf16, cudaStream_t stream);
/* dst = M dense rows of K (BF16, or float with bf16 0) from src, BF16 rows of stride K16 (the
 * output of nwc_k_dequant). */
NWC_EXTERN int nwc_k_compact(const uint16_t *src, uint64_t M, uint64_t K, void *dst, int bf16,
                             cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* NWC_KERNELS_H */
