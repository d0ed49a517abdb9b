/* membw: host memory read bandwidth, measured the way the CPU kernels read weights: each
 * thread streams a contiguous slice once, in order, with the widest loads the CPU has. The one
 * probe behind every "fraction of read bandwidth" and every CPU floor strata prints. */
#ifndef STRATA_MEMBW_H
#define STRATA_MEMBW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A buffer of `bytes` on 2 MiB boundaries with transparent huge pages requested (fewer TLB
 * misses while streaming), filled by n_threads threads (first touch places its pages where
 * they will be read); NULL on failure. Freed with free(). */
void *membw_alloc(size_t bytes, int n_threads);

/* One read pass over buf (64-byte aligned, bytes a multiple of 64) by n_threads threads
 * (0 = OpenMP's default); returns a checksum so the reads cannot be optimised away. */
uint64_t membw_sweep(const void *buf, size_t bytes, int n_threads);

/* Whether membw_sweep uses 64-byte (AVX-512) loads; else 16-byte (SSE2). */
bool membw_wide(void);

/* Median bandwidth in bytes/s of reps sweeps over buf (after one warm-up sweep). */
double membw_read(const void *buf, size_t bytes, int n_threads, int reps);

/* membw_alloc + membw_read + free; bytes are rounded down to 64. 0 if the allocation fails. */
double membw_measure(size_t bytes, int n_threads, int reps);

#endif
