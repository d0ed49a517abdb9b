/* quant: the tensor type table (block size, bytes per block, name) and checked size
 * arithmetic. Block layouts are in cpu_kernels/quant_blocks.h; kernels in cpu_kernels/.
 */
#ifndef STRATA_QUANT_H
#define STRATA_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "quant_blocks.h"

#ifdef __cplusplus
extern "C" {
#endif

struct quant_type_info {
    const char *name;    /* "Q4_K", as llama.cpp prints it */
    uint32_t block;      /* elements per block */
    uint32_t bytes;      /* bytes per block */
    bool can_dequantize; /* strata has a dequantizer for it */
    bool can_quantize;   /* strata can write it (generator, converter) */
};

/* Returns the table entry for a ggml type id, or NULL for an id strata does not know. */
const struct quant_type_info *quant_type_find(uint32_t type);

/* Name of a type id, or "unknown" for ids not in the table. */
const char *quant_type_name(uint32_t type);

/* Parses a name such as "q4_k" or "Q4_K" (case-insensitive); returns -EINVAL if unknown. */
int quant_type_parse(const char *name, enum quant_type *out);

/* Bytes of a row of n elements. Returns -EINVAL (err_msg says why) if the type is unknown or
 * n is not a multiple of its block size, -EOVERFLOW if the size does not fit in uint64_t. */
int quant_row_bytes(uint32_t type, uint64_t n, uint64_t *out);

/* Bytes of a tensor with dims ne[0..n_dims) (ne[0] contiguous), checked like quant_row_bytes. */
int quant_tensor_bytes(uint32_t type, uint32_t n_dims, const uint64_t *ne, uint64_t *out);

#ifdef __cplusplus
}
#endif

#endif
