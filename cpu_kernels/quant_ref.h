/* quant_ref: scalar reference (de)quantizers for every weight type strata reads or writes.
 * These are the numerical definition of each format (docs/formats.md); SIMD kernels and CUDA
 * kernels are tested against them. No threads, no allocation.
 */
#ifndef STRATA_QUANT_REF_H
#define STRATA_QUANT_REF_H

#include <stdbool.h>
#include <stdint.h>

#include "quant_blocks.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Decodes n elements (a multiple of the type's block size) of `type` at src into dst.
 * Returns 0, or -EINVAL if the type has no dequantizer or n is not a block multiple. */
int quant_ref_dequantize(uint32_t type, const void *src, float *dst, int64_t n);

/* Encodes n floats (a multiple of the block size) into `type` blocks at dst with the reference
 * quantizer (K-quants: per-sub-block scale/min search). Returns 0 or -EINVAL. */
int quant_ref_quantize(uint32_t type, const float *src, void *dst, int64_t n);

/* Whether quant_ref_dequantize / quant_ref_quantize support the type. */
bool quant_ref_can_dequantize(uint32_t type);
bool quant_ref_can_quantize(uint32_t type);

/* Reference quantizer domain: inputs must be finite. Every block scale except MXFP4's E8M0 is
 * an f16 (max 65504, subnormal below 6.1e-5, zero below 3e-8), so a block whose largest
 * magnitude is above about 5e5 (Q4_0: max|x|/8; the other types allow more) gets an infinite
 * scale, and small blocks lose precision and finally dequantize to zero: below max|x| ~ 4e-6
 * for Q8_0, ~ 1e-4 for Q6_K (its scale is max|x|/4096). F16 itself overflows to inf above
 * 65504. Q2_K and Q3_K are dequantize-only. Measured round-trip errors of each type:
 * docs/quant-tolerances.md. */

#ifdef __cplusplus
}
#endif

#endif
