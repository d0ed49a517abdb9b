/* cuda_devcache without CUDA: every call reports that no GPU backend was built. */
#include "cuda_devcache.h"

#include <errno.h>

int cuda_devcache_run(const struct cuda_devcache_call *a, int blocks, void *stream)
{
    (void)a, (void)blocks, (void)stream;
    return -ENODEV;
}
