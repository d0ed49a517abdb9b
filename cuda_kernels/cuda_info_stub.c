/* cuda_info without CUDA: no devices. */
#include "cuda_info.h"

#include <errno.h>

bool cuda_backend_built(void)
{
    return false;
}

int cuda_device_count(const char **why)
{
    if (why)
        *why = "strata was built without the CUDA backend (STRATA_CUDA=OFF or no nvcc)";
    return 0;
}

int cuda_device_info_get(int dev, struct cuda_device_info *out)
{
    (void)dev;
    (void)out;
    return -ENODEV;
}
