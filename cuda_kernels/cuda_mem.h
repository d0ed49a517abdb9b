/* cuda_mem: the device memory, streams and events the C side of strata uses, behind a plain
 * C API (no CUDA headers), so runtime/ compiles without the toolkit. Without a CUDA build
 * (cuda_mem_stub.c) every call fails with -ENODEV. All functions return 0 or -errno and
 * print the failing CUDA call with file and line. A "stream" is a cudaStream_t as void *. */
#ifndef STRATA_CUDA_MEM_H
#define STRATA_CUDA_MEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int cuda_set_device(int dev);
int cuda_malloc(void **p, size_t bytes);
void cuda_free(void *p);
int cuda_memset(void *p, int value, size_t bytes, void *stream);
int cuda_h2d(void *dst, const void *src, size_t bytes, void *stream);  /* async on stream */
int cuda_d2h(void *dst, const void *src, size_t bytes, void *stream);  /* async on stream */
int cuda_d2d(void *dst, const void *src, size_t bytes, void *stream);
int cuda_stream_create(void **stream);
void cuda_stream_destroy(void *stream);
int cuda_stream_sync(void *stream);
/* Bytes free and total on the current device. */
int cuda_mem_info(size_t *free_bytes, size_t *total_bytes);
/* Device memory bandwidth: median over reps of a device-to-device copy of `bytes`, counted
 * as bytes read plus bytes written per second (the HBM floor's denominator). 0 on failure. */
double cuda_copy_bandwidth(size_t bytes, int reps);

/* Pins [p, p + bytes) of ordinary host memory (page-aligned by the caller) for DMA and maps
 * it into the device's address space; read_only for a read-only mapping (a mmapped file).
 * *dev_ptr gets the address kernels read it at (zero-copy). -ENOTSUP where the OS or driver
 * refuses (the message names CUDA's reason). */
int cuda_host_register(void *p, size_t bytes, int read_only, void **dev_ptr);
void cuda_host_unregister(void *p);
/* Pinned, device-mapped host memory; *dev_ptr as above. */
int cuda_host_alloc(void **p, size_t bytes, void **dev_ptr);
void cuda_host_free(void *p);

/* Events (cudaEvent_t as void *, timing disabled) for ordering one stream after another. */
int cuda_event_create(void **ev);
void cuda_event_destroy(void *ev);
int cuda_event_record(void *ev, void *stream);
int cuda_stream_wait(void *stream, void *ev);
/* Whether the work recorded by ev has completed: 1, 0 (still pending), or -errno. */
int cuda_event_done(void *ev);

/* Up to CUDA_GATHER_MAX copies in one kernel launch: each item's bytes from src (device memory
 * or mapped pinned host memory, read by the kernel itself: zero-copy) to dst (device). One
 * launch instead of a cudaMemcpyAsync call per piece; items must not overlap. 16-byte aligned
 * items of a multiple of 16 bytes move in 16-byte words, others byte by byte. */
#define CUDA_GATHER_MAX 32
struct cuda_gather {
    int n;
    struct {
        const void *src;
        void *dst;
        uint64_t bytes;
    } item[CUDA_GATHER_MAX];
};
int cuda_gather_copy(const struct cuda_gather *g, void *stream);

/* CUDA graphs: everything enqueued on `stream` between cuda_graph_begin and cuda_graph_end is
 * recorded, not run; cuda_graph_end instantiates it into *exec (NULL and -errno when the
 * recording failed: the stream is usable again either way), cuda_graph_launch replays it on a
 * stream. Recorded copies must come from pinned host memory or device memory.
 * On compute capability 9.0 and later the kernels are launched programmatically (ops_launch in
 * cuda_ops_util.cuh), and cuda_graph_end also makes each remaining edge between two kernels,
 * where the second has no other dependency, programmatic: the second kernel's blocks may start
 * while the first still runs and wait in ops_pdl_begin for its results, which hides the launch
 * gap between them and lets them prefetch their weights meanwhile. The results are those of
 * plain launches bit for bit. STRATA_CUDA_PDL=0 in the environment keeps every launch and edge
 * plain (for comparison). */
int cuda_graph_begin(void *stream);
int cuda_graph_end(void *stream, void **exec);
int cuda_graph_launch(void *exec, void *stream);
void cuda_graph_destroy(void *exec);

/* Pinned host-to-device bandwidth in bytes/s: median over reps of one copy of `bytes` from
 * src (pinned host memory; NULL: a buffer of its own). 0 on failure. */
double cuda_h2d_bandwidth(const void *src, size_t bytes, int reps);

/* Checks for an error left by an earlier launch (cudaGetLastError); names WHAT in the report. */
int cuda_last_error(const char *what);

#ifdef __cplusplus
}
#endif
#endif
