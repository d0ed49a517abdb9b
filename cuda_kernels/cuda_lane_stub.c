/* cuda_lane without CUDA: every call reports that no GPU backend was built. */
#include "cuda_lane.h"

#include <errno.h>

int cuda_lane_post(const struct cuda_lane_call *a, void *stream)
{
    (void)a, (void)stream;
    return -ENODEV;
}

int cuda_lane_join(const struct cuda_lane_call *a, void *stream)
{
    (void)a, (void)stream;
    return -ENODEV;
}
