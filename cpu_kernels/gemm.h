/* gemm: a block of weight rows against a batch of activation rows, for batches (prefill, the
 * CPU lane's expert groups), where vec_dot's one-row-at-a-time dots are compute-bound.
 *
 * Sixteen weight rows sit in the 16 lanes of a vector: their codes are unpacked and transposed
 * once per chunk (a K-quant block of 256 elements, 512 elements of Q8_0) into unsigned bytes,
 * 4 consecutive elements of a row per 32-bit lane, and every activation row then costs one
 * vpdpbusd per 4 elements for all 16 rows, its 4 codes broadcast. Activations are vec_dot's
 * (Q8_0 or Q8_K rows, quantized once per matmul); each block's sums stay integers, per lane:
 *
 *   Q8_0   codes w + 128; -128 * (sum of the activation block, kept with the activation
 *          row: vec_dot_q8_0_extra) starts each block's sum (MXFP4 and Q4_0 alike: w the
 *          doubled E2M1 values with half the block's scale, or the nibbles - 8)
 *   Q4_K   nibbles as they are (Q5_K: with the 5th bit); the sum of each 32 elements times
 *          its scale; the mins times the Q8_K bsums (vpdpwssd) kept apart
 *   Q6_K   6-bit codes (value + 32); the sum of each 16 elements times its scale; 32 * the
 *          scales times the bsums (vpdpwssd) taken off
 *
 * and go into float accumulators exactly as vec_dot adds them (vec_dot.h, with the same FMAs
 * and the same final combination). So every output equals, bit for bit, the vec_dot of its
 * weight row and activation row at the same ISA level: a row's result does not depend on the
 * batch it comes in or on its place there (speculative decoding's verify pass relies on it,
 * docs/speculative.md), nor on the tile or thread it lands in.
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
 * j * act_stride, vec_dot's format for wtype), for r in [0, n_rows), j in [0, m): the bits of
 * vec_dot_get(wtype, isa) on that pair, for the isa the kernel came from. n is a multiple of
 * the type's block, w_stride at most GEMM_MAX_STRIDE. */
typedef void (*gemm_fn)(int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *act,
                        size_t act_stride, int m, float *y, int64_t y_stride);

/* Weight rows further apart than this are left to vec_dot (lane offsets are 32-bit). */
#define GEMM_MAX_STRIDE ((size_t)1 << 26)

/* The kernel for weights of this ggml type at the given ISA level (clamped to cpu_isa_best(),
 * which honors the STRATA_CPU_ISA cap), or NULL: AVX-512 VNNI covers Q8_0, MXFP4, Q4_0, Q4_K,
 * Q5_K and Q6_K (by AMX tiles where the process can run them, STRATA_CPU_AMX=0 aside); AVX2
 * (gemm_avx2.c, 8 rows per vector, no VNNI needed) the three K-quants. */
gemm_fn gemm_get(uint32_t wtype, enum cpu_isa isa);

/* For gemm.c only: the per-ISA tables (call only when the host has that level). */
gemm_fn gemm_avx512_get(uint32_t wtype);
gemm_fn gemm_avx2_get(uint32_t wtype);

/* The AMX kernels (int8 tiles; gemm_avx512.c) for the types gemm_avx512_get covers, or NULL
 * where this process cannot run them. Their outputs are the AVX-512 VNNI kernels' bits, so
 * gemm_get hands them out at that level. */
gemm_fn gemm_amx_get(uint32_t wtype);

/* NULL where the AMX kernels run, else why not ("no AMX int8 (CPU or OS)", "off
 * (STRATA_CPU_AMX=0)", ...). Asks Linux for the tile state on its first call. */
const char *gemm_amx_status(void);

#ifdef __cplusplus
}
#endif

#endif
