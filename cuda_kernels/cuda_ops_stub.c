/* cuda_ops without CUDA: every launcher reports that no GPU backend was built. */
#include "cuda_ops.h"

#include <errno.h>

int cuda_type_supported(uint32_t type)
{
    (void)type;
    return 0;
}

int cuda_embed(const struct cuda_embed_args *a)
{
    (void)a;
    return -ENODEV;
}

int cuda_rmsnorm(const struct cuda_rmsnorm_args *a)
{
    (void)a;
    return -ENODEV;
}

int cuda_rope_neox(const struct cuda_rope_args *a)
{
    (void)a;
    return -ENODEV;
}

int cuda_kv_store(const struct cuda_kv_store_args *a)
{
    (void)a;
    return -ENODEV;
}

int cuda_qk_rope_store(const struct cuda_qk_rope_store_args *a)
{
    (void)a;
    return -ENODEV;
}

int cuda_add(float *x, const float *y, size_t n, void *stream)
{
    (void)x, (void)y, (void)n, (void)stream;
    return -ENODEV;
}

int cuda_add_bias(float *x, const float *bias, int rows, int dim, void *stream)
{
    (void)x, (void)bias, (void)rows, (void)dim, (void)stream;
    return -ENODEV;
}

int cuda_argmax(const float *x, int rows, int n, int32_t *out, void *stream)
{
    (void)x, (void)rows, (void)n, (void)out, (void)stream;
    return -ENODEV;
}

int cuda_argmax_wide(const float *x, int n, int32_t *out, void *scratch, void *stream)
{
    (void)x, (void)n, (void)out, (void)scratch, (void)stream;
    return -ENODEV;
}

int cuda_softmax_topk(const struct cuda_topk_args *a)
{
    (void)a;
    return -ENODEV;
}
