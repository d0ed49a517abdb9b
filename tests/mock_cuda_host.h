/* The cuda_mem functions that a CPU-only simulation of the device implements the same way
 * everywhere: device memory is host memory (garbage-filled like a fresh cudaMalloc), pinned
 * memory is plain memory, nothing can fail. Included by exactly one file of a test program
 * that replaces cuda_mem (test_expert_cache.c, test_backend_sim.c); each defines the stream,
 * copy, event and registration functions with its own semantics. */
#ifndef STRATA_MOCK_CUDA_HOST_H
#define STRATA_MOCK_CUDA_HOST_H

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_mem.h"

int cuda_set_device(int dev)
{
    return dev == 0 ? 0 : -ENODEV;
}

int cuda_malloc(void **p, size_t bytes)
{
    *p = malloc(bytes ? bytes : 1);
    if (*p)
        memset(*p, 0xA5, bytes); /* device memory starts as garbage */
    return *p ? 0 : -ENOMEM;
}

void cuda_free(void *p)
{
    free(p);
}

int cuda_memset(void *p, int value, size_t bytes, void *stream)
{
    (void)stream;
    memset(p, value, bytes);
    return 0;
}

int cuda_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = *total_bytes = (size_t)1 << 30;
    return 0;
}

double cuda_copy_bandwidth(size_t bytes, int reps)
{
    (void)bytes, (void)reps;
    return 1e12;
}

void cuda_host_unregister(void *p)
{
    (void)p;
}

int cuda_host_alloc(void **p, size_t bytes, void **dev_ptr)
{
    *p = *dev_ptr = malloc(bytes ? bytes : 1);
    return *p ? 0 : -ENOMEM;
}

void cuda_host_free(void *p)
{
    free(p);
}

void cuda_event_destroy(void *ev)
{
    free(ev);
}

int cuda_last_error(const char *what)
{
    (void)what;
    return 0;
}

#endif
