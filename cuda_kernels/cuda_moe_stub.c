/* cuda_moe without CUDA: reports that no GPU backend was built. */
#include "cuda_moe.h"

#include <errno.h>

size_t cuda_moe_scratch_bytes(const struct cuda_moe_args *a)
{
    (void)a;
    return 0;
}

int cuda_moe_ffn(const struct cuda_moe_args *a)
{
    (void)a;
    return -ENODEV;
}
