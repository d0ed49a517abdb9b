/* quant_mix: which tensor type each tensor of a checkpoint gets under a named mix, the one
 * policy behind strata gen and strata convert. Mixes: docs/formats.md §3. */
#ifndef STRATA_QUANT_MIX_H
#define STRATA_QUANT_MIX_H

#include <stdbool.h>
#include <stdint.h>

enum quant_mix {
    QUANT_MIX_F32,    /* every tensor F32 */
    QUANT_MIX_BF16,   /* >= 2-D weights BF16; norms and router F32 */
    QUANT_MIX_Q8_0,   /* >= 2-D weights Q8_0; norms and router F32 */
    QUANT_MIX_Q4_K_M, /* experts gate/up Q4_K, down Q6_K; attention q/k/v/output Q8_0;
                         token_embd Q4_K; output Q6_K; norms and router F32 */
    QUANT_MIX_COUNT
};

/* Parses "f32", "bf16", "q8_0", "q4_k_m" (case-insensitive); -EINVAL (message lists them). */
int quant_mix_parse(const char *name, enum quant_mix *out);
const char *quant_mix_name(enum quant_mix mix);
/* general.file_type (llama_ftype) of the mix: 0, 32, 7 or 15. */
uint32_t quant_mix_file_type(enum quant_mix mix);

/* The ggml type the mix gives GGUF tensor NAME ("blk.3.ffn_up_exps.weight", ...) with n_dims
 * dims and row length ne0. When ne0 is not a multiple of the chosen type's block, falls back
 * to Q8_0 (if ne0 % 32 == 0) or F32 and sets *fell_back (may be NULL). */
uint32_t quant_mix_tensor_type(enum quant_mix mix, const char *name, uint32_t n_dims,
                               uint64_t ne0, bool *fell_back);

#endif
