/* cuda_matmul: y = x W^T on the GPU for a weight matrix W stored exactly as in the GGUF file
 * (n_out rows of quant blocks, ggml layout) and float32 activations x and outputs y.
 *
 * Two kernels, chosen by the number of activation rows m (docs/cuda-matmul.md):
 * - MMV (m < CUDA_MATMUL_GEMM_MIN_M): one warp per weight row streams the row through shared
 *   memory with 16-byte asynchronous copies and dots it with up to CUDA_MATMUL_MMV_MAX_M
 *   activation rows at once, so each weight byte is read once per pass of 16 rows. For the
 *   quantized types the activations are first converted to 8-bit integers with one float scale
 *   per 32 elements (kept in the caller's scratch) and the dot products use dp4a; F32, F16 and
 *   BF16 weights are multiplied with the float activations directly.
 * - GEMM (m >= CUDA_MATMUL_GEMM_MIN_M): a tiled tensor-core kernel that streams the raw weight
 *   bytes into shared memory with cp.async, dequantizes them to BF16 there, converts the
 *   activations to BF16, and accumulates in float32 (mma.sync). The output tile (128 x 128 down
 *   to 32 x 64) is chosen per call from the shape and the device's SM count. F32 weights never
 *   take it: they stay in float32, on MMV, or with CUDA_MATMUL_SGEMM_MIN_M rows and more on a
 *   tiled float32 kernel (32 x 32 outputs per block, one FMA chain per output in k order).
 *
 * Nothing here allocates, synchronizes or copies: a call only enqueues kernels on the given
 * stream, so it can be captured in a CUDA graph once cuda_matmul_init() has run.
 * Without a CUDA build (cuda_matmul_stub.c) every call fails with -ENODEV.
 */
#ifndef STRATA_CUDA_MATMUL_H
#define STRATA_CUDA_MATMUL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_MATMUL_MMV_MAX_M 16  /* activation rows one pass of the MMV kernel serves */
#define CUDA_MATMUL_GEMM_MIN_M 32 /* the automatic choice takes GEMM from this many rows */
#define CUDA_MATMUL_SGEMM_MIN_M 64 /* ... and, for F32 weights, float32 tiles from this many */

enum cuda_matmul_path {
    CUDA_MATMUL_PATH_AUTO = 0, /* MMV below CUDA_MATMUL_GEMM_MIN_M rows; F32: MMV, or float32
                                * tiles from CUDA_MATMUL_SGEMM_MIN_M rows (4-byte aligned W) */
    CUDA_MATMUL_PATH_MMV,      /* any m: ceil(m / 16) passes over W in one launch */
    CUDA_MATMUL_PATH_GEMM,     /* any m; not for F32 weights */
};

/* GEMM output tile, rows of x by rows of W. The same sums in the same order whichever runs. */
enum cuda_matmul_tile {
    CUDA_MATMUL_TILE_AUTO = 0, /* the fastest estimate for the shape and the device */
    CUDA_MATMUL_TILE_128X128,
    CUDA_MATMUL_TILE_64X128,
    CUDA_MATMUL_TILE_64X64,
    CUDA_MATMUL_TILE_32X64,
};

/* A further matrix of a call: y = x W^T too, W of the call's type and n_in; the fields as
 * those of struct cuda_matmul_args. */
struct cuda_matmul_more {
    const void *w;
    size_t w_stride;
    int64_t n_out;
    float *y;
    int64_t y_stride;
    const float *bias;
};
#define CUDA_MATMUL_MAX_MORE 2

struct cuda_matmul_args {
    uint32_t wtype;             /* ggml type id of W; cuda_matmul_supported(wtype) */
    const void *w;              /* (n_out rows of w_stride bytes) device or mapped host; any
                                 * alignment; nothing outside the n_out rows' n_in elements is
                                 * used (the padding between rows may be read, never the bytes
                                 * before row 0 or after the last element of row n_out - 1) */
    size_t w_stride;            /* bytes between weight rows, >= the bytes of n_in elements */
    int64_t n_in;               /* elements per weight row: a multiple of the type's block (32 or
                                 * 256; any n_in >= 1 for F32/F16/BF16), at most 2^28 */
    int64_t n_out;              /* weight rows = outputs per activation row, >= 1 */
    int m;                      /* activation rows, >= 1 */
    const float *x;             /* (rows of x_stride floats) device, 4-byte aligned */
    int64_t x_stride;           /* floats between activation rows, >= n_in */
    const int32_t *x_rows;      /* (m) device: output row j uses activation row x_rows[j] (a
                                 * gather, for MoE token lists; repeats allowed); NULL: row j */
    float *y;                   /* (m rows of y_stride floats) device; n_out written per row */
    int64_t y_stride;           /* floats between output rows, >= n_out */
    const float *bias;          /* NULL, or (n_out) device: y[j, o] = (x W^T)[j, o] + bias[o],
                                 * one float addition after the sum, as a separate add would
                                 * do it (the MMV path adds it where it writes y) */
    void *scratch;              /* device, 16-byte aligned, cuda_matmul_scratch_bytes() bytes,
                                 * caller-owned and stream-ordered (one in flight per buffer);
                                 * may be NULL when that is 0 or the GEMM path runs */
    size_t scratch_bytes;       /* size of scratch */
    enum cuda_matmul_path path; /* CUDA_MATMUL_PATH_AUTO unless testing or measuring */
    enum cuda_matmul_tile tile; /* GEMM path: CUDA_MATMUL_TILE_AUTO unless testing or measuring */
    int x_ready;                /* 1: scratch already holds x in 8 bits, written by the previous
                                 * call on this stream (a quantized type on the MMV path, the
                                 * same x, x_stride, x_rows, m and n_in) and nothing has written
                                 * x since: that quantization is skipped */
    void *stream;               /* cudaStream_t; NULL: the legacy default stream */
    int n_more;                 /* 0 .. CUDA_MATMUL_MAX_MORE further matrices (below) */
    struct cuda_matmul_more more[CUDA_MATMUL_MAX_MORE];
};

/* Whether cuda_matmul has kernels for the type: F32, F16, BF16, Q8_0, Q4_0, MXFP4, Q4_K, Q5_K,
 * Q6_K. */
bool cuda_matmul_supported(uint32_t wtype);

/* Scratch bytes a call with up to m activation rows needs: the 8-bit copy of the activations
 * that the MMV path makes for quantized types (m * n_in * 1.25 bytes, rounded up); 0 for F32,
 * F16 and BF16. Non-decreasing in m, so one buffer sized for the largest m serves every call.
 * n_out is part of the signature for kernels that may need it; it is not used now. 0 for an
 * unsupported type or a bad shape. */
size_t cuda_matmul_scratch_bytes(uint32_t wtype, int64_t n_in, int64_t n_out, int m);

/* Where a call of m rows of n_in elements on the MMV path keeps the 8-bit copy of x in its
 * scratch: codes at byte 0, the (d, d * sum) pairs from the returned offset. */
size_t cuda_matmul_q8_layout(int64_t n_in, int m);

/* Loads every kernel of this module on the current device and sets the shared memory limit of
 * the GEMM kernels that need more than 48 KiB (so that nothing is loaded or configured lazily
 * inside a graph capture), and checks the device can run them (compute capability >= 8.0).
 * GEMM tiles whose shared memory exceeds the device's limit are left out (AUTO never picks
 * them). Call once per device before the first GEMM call (its kernels cannot launch without
 * it) and before capturing. 0, -ENODEV (no usable device or too old) or -EIO. */
int cuda_matmul_init(void);

/* Validates the arguments without touching the device: 0, or -EINVAL for an unsupported
 * type, a shape that is not a block multiple, m < 1, a stride too small, a NULL or misaligned
 * pointer, too little scratch, GEMM asked for F32 weights, or an unknown tile. */
int cuda_matmul_check(const struct cuda_matmul_args *a);

/* Enqueues y = x W^T on a->stream, and y_i = x W_i^T for the n_more further matrices: their
 * results are those of one call per matrix (the later ones with x_ready), bit for bit, and
 * where the MMV path takes the same kernel for all of them (m < CUDA_MATMUL_GEMM_MIN_M, for F32
 * m < CUDA_MATMUL_SGEMM_MIN_M, and every n_out above 256, or all of them together at most 256)
 * they run in one launch (q, k and v of a decode step; the routers of two layers). Returns 0,
 * -EINVAL (see cuda_matmul_check; also a forced GEMM tile that needs more shared memory than the
 * device has), -EIO (a CUDA error, printed with its name) or -ENODEV (no CUDA build). */
int cuda_matmul(const struct cuda_matmul_args *a);

#ifdef __cplusplus
}
#endif
#endif
