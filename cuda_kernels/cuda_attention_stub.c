/* cuda_attention without CUDA: reports that no GPU backend was built. */
#include "cuda_attention.h"

#include <errno.h>

size_t cuda_attention_scratch_bytes(int n_head, int head_dim)
{
    (void)n_head, (void)head_dim;
    return 0;
}

int cuda_attention(const struct cuda_attn_args *a)
{
    (void)a;
    return -ENODEV;
}

int cuda_attention_rows_ok(int n_head, int n_head_kv, int head_dim)
{
    (void)n_head, (void)n_head_kv, (void)head_dim;
    return 0;
}

size_t cuda_attention_rows_scratch_bytes(int n_tok, int n_head, int head_dim)
{
    (void)n_tok, (void)n_head, (void)head_dim;
    return 0;
}
