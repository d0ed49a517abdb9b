/* cuda_mem with CUDA: thin checked wrappers over the runtime API. */
#include "cuda_check.h"
#include "cuda_mem.h"
#include "cuda_ops_util.cuh"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int cuda_rc(cudaError_t e)
{
    return e == cudaSuccess ? 0 : (e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO);
}

extern "C" int cuda_set_device(int dev)
{
    return cuda_rc(CUDA_CHECK(cudaSetDevice(dev)));
}

extern "C" int cuda_malloc(void **p, size_t bytes)
{
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* an allocation failure is not sticky: clear it */
        *p = NULL;
    }
    return cuda_rc(e);
}

extern "C" void cuda_free(void *p)
{
    if (p)
        CUDA_CHECK(cudaFree(p));
}

extern "C" int cuda_memset(void *p, int value, size_t bytes, void *stream)
{
    return cuda_rc(CUDA_CHECK(cudaMemsetAsync(p, value, bytes, (cudaStream_t)stream)));
}

extern "C" int cuda_h2d(void *dst, const void *src, size_t bytes, void *stream)
{
    return cuda_rc(CUDA_CHECK(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream)));
}

extern "C" int cuda_d2h(void *dst, const void *src, size_t bytes, void *stream)
{
    return cuda_rc(CUDA_CHECK(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream)));
}

extern "C" int cuda_d2d(void *dst, const void *src, size_t bytes, void *stream)
{
    return cuda_rc(CUDA_CHECK(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream)));
}

extern "C" int cuda_stream_create(void **stream)
{
    cudaStream_t s;
    int rc = cuda_rc(CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)));
    *stream = rc ? NULL : (void *)s;
    return rc;
}

extern "C" void cuda_stream_destroy(void *stream)
{
    if (stream)
        CUDA_CHECK(cudaStreamDestroy((cudaStream_t)stream));
}

extern "C" int cuda_stream_sync(void *stream)
{
    return cuda_rc(CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream)));
}

extern "C" int cuda_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    return cuda_rc(CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes)));
}

extern "C" int cuda_last_error(const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        fprintf(stderr, "%s: %s (%s)\n", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return cuda_rc(e);
}

extern "C" int cuda_host_register(void *p, size_t bytes, int read_only, void **dev_ptr)
{
    unsigned flags = cudaHostRegisterMapped | cudaHostRegisterPortable;
    if (read_only)
        flags |= cudaHostRegisterReadOnly;
    cudaError_t e = cudaHostRegister(p, bytes, flags);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky: the caller falls back to a copy */
        fprintf(stderr, "strata: cudaHostRegister of %.2f GiB refused: %s\n",
                bytes / 1073741824.0, cudaGetErrorString(e));
        return -ENOTSUP;
    }
    if (CUDA_CHECK(cudaHostGetDevicePointer(dev_ptr, p, 0)) != cudaSuccess) {
        cudaHostUnregister(p);
        return -EIO;
    }
    return 0;
}

extern "C" void cuda_host_unregister(void *p)
{
    if (p)
        CUDA_CHECK(cudaHostUnregister(p));
}

extern "C" int cuda_host_alloc(void **p, size_t bytes, void **dev_ptr)
{
    cudaError_t e = cudaHostAlloc(p, bytes ? bytes : 1, cudaHostAllocMapped | cudaHostAllocPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *p = NULL;
        return cuda_rc(e);
    }
    if (CUDA_CHECK(cudaHostGetDevicePointer(dev_ptr, *p, 0)) != cudaSuccess) {
        cudaFreeHost(*p);
        *p = NULL;
        return -EIO;
    }
    return 0;
}

extern "C" void cuda_host_free(void *p)
{
    if (p)
        CUDA_CHECK(cudaFreeHost(p));
}

extern "C" int cuda_event_create(void **ev)
{
    cudaEvent_t e;
    int rc = cuda_rc(CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)));
    *ev = rc ? NULL : (void *)e;
    return rc;
}

extern "C" void cuda_event_destroy(void *ev)
{
    if (ev)
        CUDA_CHECK(cudaEventDestroy((cudaEvent_t)ev));
}

extern "C" int cuda_event_record(void *ev, void *stream)
{
    return cuda_rc(CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream)));
}

extern "C" int cuda_event_done(void *ev)
{
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError(); /* not an error: clear it */
        return 0;
    }
    return e == cudaSuccess ? 1 : cuda_rc(CUDA_CHECK(e));
}

extern "C" int cuda_stream_wait(void *stream, void *ev)
{
    return cuda_rc(CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)ev, 0)));
}

static int cuda_cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Median milliseconds of reps copies of bytes from src to dst (after one warm-up), or 0. */
static float cuda_time_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            int reps)
{
    cudaEvent_t e0 = NULL, e1 = NULL;
    float *ms = (float *)calloc((size_t)(reps > 0 ? reps : 1), sizeof(float)), med = 0;

    if (!ms || reps < 1 || cudaEventCreate(&e0) != cudaSuccess ||
        cudaEventCreate(&e1) != cudaSuccess)
        goto out;
    cudaMemcpy(dst, src, bytes, kind); /* warm-up */
    for (int r = 0; r < reps; r++) {
        cudaEventRecord(e0, 0);
        cudaMemcpyAsync(dst, src, bytes, kind, 0);
        cudaEventRecord(e1, 0);
        if (CUDA_CHECK(cudaEventSynchronize(e1)) != cudaSuccess)
            goto out;
        cudaEventElapsedTime(&ms[r], e0, e1);
    }
    qsort(ms, (size_t)reps, sizeof(float), cuda_cmp_float);
    med = ms[reps / 2];
out:
    (void)cudaGetLastError();
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    free(ms);
    return med;
}

extern "C" double cuda_copy_bandwidth(size_t bytes, int reps)
{
    void *src = NULL, *dst = NULL;
    double bw = 0;
    if (cudaMalloc(&src, bytes) == cudaSuccess && cudaMalloc(&dst, bytes) == cudaSuccess) {
        cudaMemset(src, 1, bytes);
        float ms = cuda_time_copy(dst, src, bytes, cudaMemcpyDeviceToDevice, reps);
        if (ms > 0)
            bw = 2.0 * (double)bytes / (ms * 1e-3); /* read + written */
    }
    (void)cudaGetLastError();
    cudaFree(src);
    cudaFree(dst);
    return bw;
}

extern "C" double cuda_h2d_bandwidth(const void *src, size_t bytes, int reps)
{
    void *own = NULL, *dst = NULL;
    double bw = 0;
    if (!src && cudaHostAlloc(&own, bytes, cudaHostAllocDefault) == cudaSuccess) {
        memset(own, 1, bytes);
        src = own;
    }
    if (src && cudaMalloc(&dst, bytes) == cudaSuccess) {
        float ms = cuda_time_copy(dst, src, bytes, cudaMemcpyHostToDevice, reps);
        if (ms > 0)
            bw = (double)bytes / (ms * 1e-3);
    }
    (void)cudaGetLastError();
    cudaFree(dst);
    if (own)
        cudaFreeHost(own);
    return bw;
}

/* One block row per item (blockIdx.y), blocks striding over its bytes. */
static __global__ void k_gather(struct cuda_gather g)
{
    ops_pdl_begin();
    int i = blockIdx.y;
    const uint8_t *src = (const uint8_t *)g.item[i].src;
    uint8_t *dst = (uint8_t *)g.item[i].dst;
    uint64_t n = g.item[i].bytes;
    uint64_t start = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    uint64_t step = (uint64_t)gridDim.x * blockDim.x;
    if (((uintptr_t)src | (uintptr_t)dst | n) % 16 == 0) {
        const uint4 *s4 = (const uint4 *)src;
        uint4 *d4 = (uint4 *)dst;
        for (uint64_t w = start; w < n / 16; w += step)
            d4[w] = s4[w];
    } else {
        for (uint64_t b = start; b < n; b += step)
            dst[b] = src[b];
    }
}

extern "C" int cuda_gather_copy(const struct cuda_gather *g, void *stream)
{
    if (!g || g->n < 0 || g->n > CUDA_GATHER_MAX)
        return -EINVAL;
    if (g->n == 0)
        return 0;
    /* enough blocks in flight per item to cover PCIe latency when src is host memory */
    dim3 grid(32, (unsigned)g->n);
    ops_launch(k_gather, grid, 256, 0, (cudaStream_t)stream, *g);
    return cuda_rc(CUDA_CHECK(cudaGetLastError()));
}

extern "C" int cuda_graph_begin(void *stream)
{
    return cuda_rc(CUDA_CHECK(
        cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal)));
}

/* Whether launches and graph edges are programmatic (cuda_ops_util.cuh, cuda_mem.h). */
extern "C" int cuda_pdl_enabled(void)
{
    static int on = -1; /* decided once; a race writes the same value */
    if (on < 0) {
        const char *env = getenv("STRATA_CUDA_PDL");
        int dev = 0, major = 0;
        on =
            (!env || strcmp(env, "0") != 0) && cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
            major >= 9;
    }
    return on == 1;
}

static bool graph_is_kernel(cudaGraphNode_t n)
{
    enum cudaGraphNodeType t;
    return cudaGraphNodeGetType(n, &t) == cudaSuccess && t == cudaGraphNodeTypeKernel;
}

/* Each plain edge from a kernel node to a kernel node that depends on nothing else becomes a
 * programmatic one (the kernels call ops_pdl_begin before touching shared memory). An edge
 * that cannot be replaced is put back as it was; an error only when even that fails. */
static cudaError_t graph_programmatic(cudaGraph_t g)
{
    size_t n = 0;
    cudaError_t err = CUDA_CHECK(cudaGraphGetEdges(g, NULL, NULL, NULL, &n));
    if (err != cudaSuccess || n == 0)
        return err;
    cudaGraphNode_t *from = (cudaGraphNode_t *)malloc(n * sizeof(*from));
    cudaGraphNode_t *to = (cudaGraphNode_t *)malloc(n * sizeof(*to));
    cudaGraphEdgeData *ed = (cudaGraphEdgeData *)calloc(n, sizeof(*ed));
    if (!from || !to || !ed) {
        free(from);
        free(to);
        free(ed);
        return cudaErrorMemoryAllocation;
    }
    err = CUDA_CHECK(cudaGraphGetEdges(g, from, to, ed, &n));
    cudaGraphEdgeData pe;
    memset(&pe, 0, sizeof(pe));
    pe.from_port = cudaGraphKernelNodePortProgrammatic;
    pe.type = cudaGraphDependencyTypeProgrammatic;
    for (size_t i = 0; err == cudaSuccess && i < n; i++) {
        if (ed[i].type != cudaGraphDependencyTypeDefault || ed[i].from_port != 0)
            continue;
        size_t into = 0;
        for (size_t j = 0; j < n; j++)
            into += to[j] == to[i];
        if (into != 1 || !graph_is_kernel(from[i]) || !graph_is_kernel(to[i]))
            continue;
        err = CUDA_CHECK(cudaGraphRemoveDependencies(g, &from[i], &to[i], &ed[i], 1));
        if (err != cudaSuccess)
            break;
        if (cudaGraphAddDependencies(g, &from[i], &to[i], &pe, 1) != cudaSuccess) {
            (void)cudaGetLastError();
            err = CUDA_CHECK(cudaGraphAddDependencies(g, &from[i], &to[i], &ed[i], 1));
        }
    }
    free(from);
    free(to);
    free(ed);
    return err;
}

extern "C" int cuda_graph_end(void *stream, void **exec)
{
    cudaGraph_t g = NULL;
    cudaGraphExec_t e = NULL;
    *exec = NULL;
    cudaError_t err = CUDA_CHECK(cudaStreamEndCapture((cudaStream_t)stream, &g));
    if (err == cudaSuccess && cuda_pdl_enabled())
        err = graph_programmatic(g);
    if (err == cudaSuccess)
        err = CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
    if (g)
        cudaGraphDestroy(g);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return -EIO;
    }
    *exec = (void *)e;
    return 0;
}

extern "C" int cuda_graph_launch(void *exec, void *stream)
{
    return cuda_rc(CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream)));
}

extern "C" void cuda_graph_destroy(void *exec)
{
    if (exec)
        CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)exec));
}
