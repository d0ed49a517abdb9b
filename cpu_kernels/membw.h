/* membw: host memory read bandwidth, measured the way the CPU kernels read weights: each
 * thread streams a contiguous slice once, in order. Used to put every CPU figure next to the
 * floor the memory allows. */
#ifndef STRATA_MEMBW_H
#define STRATA_MEMBW_H

#include <stddef.h>

/* Reads `bytes` of buf (64-byte aligned, bytes a multiple of 64) with n_threads OpenMP
 * threads (0 = OpenMP's default), reps times; returns the median bandwidth in bytes/s. */
double membw_read(const void *buf, size_t bytes, int n_threads, int reps);

/* Allocates and fills a buffer of `bytes` (page-touched by the threads that will read it) and
 * measures it; bytes are rounded down to 64. Returns 0 when the allocation fails. */
double membw_measure(size_t bytes, int n_threads, int reps);

#endif
