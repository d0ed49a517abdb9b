/* cuda_ssm without CUDA: every launcher reports that no GPU backend was built. */
#include "cuda_ssm.h"

#include <errno.h>

int cuda_ssm_conv(const struct cuda_ssm_conv_args *a)
{
    (void)a;
    return -ENODEV;
}

int cuda_gdn(const struct cuda_gdn_args *a)
{
    (void)a;
    return -ENODEV;
}

int cuda_rope_partial(const struct cuda_rope_partial_args *a)
{
    (void)a;
    return -ENODEV;
}

int cuda_split_halves(float *q, float *gate, const float *qg, int rows, int hd, void *stream)
{
    (void)q, (void)gate, (void)qg, (void)rows, (void)hd, (void)stream;
    return -ENODEV;
}

int cuda_mul_sigmoid(float *x, const float *gate, size_t n, void *stream)
{
    (void)x, (void)gate, (void)n, (void)stream;
    return -ENODEV;
}

int cuda_swiglu_inplace(float *u, const float *g, size_t n, void *stream)
{
    (void)u, (void)g, (void)n, (void)stream;
    return -ENODEV;
}

int cuda_add_sigmoid_gated(float *out, const float *y, const float *x, const float *w, int rows,
                           int dim, void *stream)
{
    (void)out, (void)y, (void)x, (void)w, (void)rows, (void)dim, (void)stream;
    return -ENODEV;
}
