/* cuda_matmul without CUDA: no GPU backend was built, so nothing is supported and every call
 * fails with -ENODEV. */
#include "cuda_matmul.h"

#include <errno.h>

bool cuda_matmul_supported(uint32_t wtype)
{
    (void)wtype;
    return false;
}

size_t cuda_matmul_scratch_bytes(uint32_t wtype, int64_t n_in, int64_t n_out, int m)
{
    (void)wtype, (void)n_in, (void)n_out, (void)m;
    return 0;
}

int cuda_matmul_init(void)
{
    return -ENODEV;
}

int cuda_matmul_check(const struct cuda_matmul_args *a)
{
    (void)a;
    return -ENODEV;
}

int cuda_matmul(const struct cuda_matmul_args *a)
{
    (void)a;
    return -ENODEV;
}

size_t cuda_matmul_q8_layout(int64_t n_in, int m)
{
    (void)n_in, (void)m;
    return 0;
}
