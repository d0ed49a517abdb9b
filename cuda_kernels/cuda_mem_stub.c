/* cuda_mem without CUDA: every call reports that no GPU backend was built. */
#include "cuda_mem.h"

#include <errno.h>

int cuda_set_device(int dev)
{
    (void)dev;
    return -ENODEV;
}

int cuda_malloc(void **p, size_t bytes)
{
    (void)bytes;
    *p = NULL;
    return -ENODEV;
}

void cuda_free(void *p)
{
    (void)p;
}

int cuda_memset(void *p, int value, size_t bytes, void *stream)
{
    (void)p, (void)value, (void)bytes, (void)stream;
    return -ENODEV;
}

int cuda_h2d(void *dst, const void *src, size_t bytes, void *stream)
{
    (void)dst, (void)src, (void)bytes, (void)stream;
    return -ENODEV;
}

int cuda_d2h(void *dst, const void *src, size_t bytes, void *stream)
{
    (void)dst, (void)src, (void)bytes, (void)stream;
    return -ENODEV;
}

int cuda_d2d(void *dst, const void *src, size_t bytes, void *stream)
{
    (void)dst, (void)src, (void)bytes, (void)stream;
    return -ENODEV;
}

int cuda_stream_create(void **stream)
{
    *stream = NULL;
    return -ENODEV;
}

void cuda_stream_destroy(void *stream)
{
    (void)stream;
}

int cuda_stream_sync(void *stream)
{
    (void)stream;
    return -ENODEV;
}

int cuda_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = *total_bytes = 0;
    return -ENODEV;
}

int cuda_last_error(const char *what)
{
    (void)what;
    return -ENODEV;
}

double cuda_copy_bandwidth(size_t bytes, int reps)
{
    (void)bytes, (void)reps;
    return 0;
}
