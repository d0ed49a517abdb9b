/* cuda_devcache without CUDA: every call reports that no GPU backend was built. */
#include "cuda_devcache.h"

#include <errno.h>

int cuda_devcache_run(const struct cuda_devcache_call *a, int blocks, void *stream)
{
    (void)a, (void)blocks, (void)stream;
    return -ENODEV;
}

int cuda_devcache_copy(const struct cuda_devcache_job *jobs, const uint32_t *n_jobs,
                       uint32_t *claim, uint32_t *done, int blocks, void *stream)
{
    (void)jobs, (void)n_jobs, (void)claim, (void)done, (void)blocks, (void)stream;
    return -ENODEV;
}
