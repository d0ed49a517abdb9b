/* gemm: a block of weight rows against a batch of activation rows, for batches (prefill, the
 * CPU lane's expert groups), where vec_dot's one-row-at-a-time dots are compute-bound.
 *
 * Sixteen weight rows sit in the 16 lanes of a vector: their codes are unpacked and transposed
 * once per chunk of 256 elements into unsigned bytes, 4 consecutive elements of a row per
 * 32-bit lane, and every activation row then costs one vpdpbusd per 4 elements for all 16
 * rows, its 4 codes broadcast. Activations are vec_dot's (Q8_0 or Q8_K rows, quantized
 * once per matmul); per-sub-block scales and offsets are applied in float per lane:
 *
 *   Q8_0   codes w + 128; -128 * (sum of the activation block, kept with the activation
 *          row: vec_dot_q8_0_extra) starts each block's sum
 *   Q4_K   nibbles as they are (Q5_K: with the 5th bit); d * scale per 32 elements; the mins
 *          times the Q8_K bsums (vpdpwssd), times dmin, taken off
 *   Q6_K   6-bit codes (value + 32); d * scale per 16 elements; 32 * the scales times the
 *          bsums (vpdpwssd), times d, taken off
 *
 * The integer sums are exact, so a result differs from the vec_dot of the same row only by
 * the order of float accumulation. Each output is computed by one call in an order fixed by
 * its shapes, whatever the tile or thread it lands in.
 */
#ifndef STRATA_GEMM_H
#define STRATA_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "cpu_features.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Batches of at least this many activation rows go through gemm where a kernel exists (fewer
 * leave too many of the packed codes' uses to amortize the packing). */
#define GEMM_MIN_M 4

/* y[j * y_stride + r] = row r of W (w + r * w_stride, n elements) . activation row j (act +
 * j * act_stride, vec_dot's format for wtype), for r in [0, n_rows), j in [0, m). n is a
 * multiple of the type's block, w_stride at most GEMM_MAX_STRIDE. */
typedef void (*gemm_fn)(int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *act,
                        size_t act_stride, int m, float *y, int64_t y_stride);

/* Weight rows further apart than this are left to vec_dot (lane offsets are 32-bit). */
#define GEMM_MAX_STRIDE ((size_t)1 << 26)

/* The kernel for weights of this ggml type at the given ISA level (clamped to cpu_isa_best(),
 * which honors the STRATA_CPU_ISA cap), or NULL: AVX-512 VNNI covers Q8_0, Q4_K, Q5_K and
 * Q6_K; AVX2 (gemm_avx2.c, 8 rows per vector, no VNNI needed) the three K-quants. */
gemm_fn gemm_get(uint32_t wtype, enum cpu_isa isa);

/* For gemm.c only: the per-ISA tables (call only when the host has that level). */
gemm_fn gemm_avx512_get(uint32_t wtype);
gemm_fn gemm_avx2_get(uint32_t wtype);

#ifdef __cplusplus
}
#endif

#endif
