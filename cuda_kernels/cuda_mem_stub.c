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

int cuda_host_register(void *p, size_t bytes, int read_only, void **dev_ptr)
{
    (void)p, (void)bytes, (void)read_only;
    *dev_ptr = NULL;
    return -ENODEV;
}

void cuda_host_unregister(void *p)
{
    (void)p;
}

int cuda_host_alloc(void **p, size_t bytes, void **dev_ptr)
{
    (void)bytes;
    *p = *dev_ptr = NULL;
    return -ENODEV;
}

void cuda_host_free(void *p)
{
    (void)p;
}

int cuda_event_create(void **ev)
{
    *ev = NULL;
    return -ENODEV;
}

void cuda_event_destroy(void *ev)
{
    (void)ev;
}

int cuda_event_record(void *ev, void *stream)
{
    (void)ev, (void)stream;
    return -ENODEV;
}

int cuda_stream_wait(void *stream, void *ev)
{
    (void)stream, (void)ev;
    return -ENODEV;
}

int cuda_event_done(void *ev)
{
    (void)ev;
    return -ENODEV;
}

double cuda_h2d_bandwidth(const void *src, size_t bytes, int reps)
{
    (void)src, (void)bytes, (void)reps;
    return 0;
}

int cuda_gather_copy(const struct cuda_gather *g, void *stream)
{
    (void)g, (void)stream;
    return -ENODEV;
}

int cuda_graph_begin(void *stream)
{
    (void)stream;
    return -ENODEV;
}

int cuda_graph_end(void *stream, void **exec)
{
    (void)stream;
    *exec = NULL;
    return -ENODEV;
}

int cuda_graph_launch(void *exec, void *stream)
{
    (void)exec, (void)stream;
    return -ENODEV;
}

void cuda_graph_destroy(void *exec)
{
    (void)exec;
}
