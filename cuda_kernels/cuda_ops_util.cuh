/* cuda_ops_util: small helpers shared by the kernels of cuda_kernels/: integer
 * min/max/ceil-division (host and device), a pointer alignment test (host), the warp reductions
 * and the 8-bit activation copy (device), and the programmatic-launch and L2 prefetch
 * primitives (device). Internal to cuda_kernels/: included only by .cu files. */
#ifndef STRATA_CUDA_OPS_UTIL_CUH
#define STRATA_CUDA_OPS_UTIL_CUH

#include <float.h>
#include <stdint.h>
#include <stdlib.h>

#include <utility>

static __host__ __device__ __forceinline__ int ops_imin(int a, int b)
{
    return a < b ? a : b;
}

static __host__ __device__ __forceinline__ int ops_imax(int a, int b)
{
    return a > b ? a : b;
}

static __host__ __device__ __forceinline__ int ops_cdiv(int a, int b)
{
    return (a + b - 1) / b;
}

/* Which kernels do their wait-independent loads before griddepcontrol.wait (docs/cuda-ops.md,
 * "Programmatic launches"): a mask of OPS_EARLY_*, OPS_EARLY_DEFAULT unless STRATA_EARLY in the
 * environment gives another (for comparisons). Read once per translation unit. */
#define OPS_EARLY_MMV 1  /* the MMV kernel's first weight tile */
#define OPS_EARLY_ATTN 2 /* the decode attention's first keys below every row's position */
#define OPS_EARLY_ROPE 4 /* the q/k prologue's norm weights and rotation angles: measured slower
                          * (its double pow and sincos then run beside the q/k/v matmul) */
#define OPS_EARLY_DEFAULT (OPS_EARLY_MMV | OPS_EARLY_ATTN)
static inline int ops_early(void)
{
    static int mask = -1; /* decided once; a race writes the same value */
    if (mask < 0) {
        const char *env = getenv("STRATA_EARLY");
        mask = env && *env ? atoi(env) & 7 : OPS_EARLY_DEFAULT;
    }
    return mask;
}

/* Whether p is a multiple of a (a power of two). */
static inline bool ops_aligned(const void *p, uint64_t a)
{
    return ((uintptr_t)p & (a - 1)) == 0;
}

/* Sum over the 32 lanes by a fixed butterfly; every lane gets the same value. */
static __device__ __forceinline__ float ops_warp_sum(float s)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

/* Max over the 32 lanes; every lane gets the same value. */
static __device__ __forceinline__ float ops_warp_max(float s)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        s = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, o));
    return s;
}

/* The k (<= 32) experts of one token's router logits (n finite floats, device), largest first,
 * ties to the lower id (cuda_softmax_topk's order), into sids[0 .. k) by the whole block: the
 * thread of expert e counts the logits ranked before e's. lv: n floats of shared memory,
 * 16-byte aligned. With ids_w and w_w (non-NULL), warp 0 also writes the ids and their weights
 * as k_softmax_topk computes them (the same operations in the same order: the same bits). Every
 * thread must call it; it returns after a barrier that follows sids' stores (lv is read by warp
 * 0 until it returns). */
static __device__ __forceinline__ void ops_topk_select(const float *logits, int n, int k, float *lv,
                                                       int *sids, int32_t *ids_w, float *w_w)
{
    for (int e = threadIdx.x; e < n; e += blockDim.x)
        lv[e] = logits[e];
    __syncthreads();
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        const float v = lv[e];
        int rank = 0, j = 0;
        for (; j + 4 <= n; j += 4) {
            const float4 u = *(const float4 *)(lv + j);
            rank += (u.x > v || (u.x == v && j < e)) + (u.y > v || (u.y == v && j + 1 < e)) +
                    (u.z > v || (u.z == v && j + 2 < e)) + (u.w > v || (u.w == v && j + 3 < e));
        }
        for (; j < n; j++)
            rank += lv[j] > v || (lv[j] == v && j < e);
        if (rank < k)
            sids[rank] = e;
    }
    __syncthreads();
    if (ids_w && w_w && threadIdx.x < 32) {
        const int lane = threadIdx.x;
        float mx = -INFINITY, sum = 0.0f;
        for (int e = lane; e < n; e += 32)
            mx = fmaxf(mx, lv[e]);
        mx = ops_warp_max(mx);
        for (int e = lane; e < n; e += 32)
            sum += expf(lv[e] - mx);
        sum = ops_warp_sum(sum);
        float sel = 0.0f;
        for (int r = 0; r < k; r++)
            sel += expf(lv[sids[r]] - mx) / sum;
        for (int r = lane; r < k; r += 32) {
            ids_w[r] = sids[r];
            w_w[r] = expf(lv[sids[r]] - mx) / sum / sel;
        }
    }
}

/* Element i of a row-major activation matrix (n_in a multiple of 32; the calling warp holds
 * elements i - i % 32 .. + 31, one per lane, in lane order) into the 8-bit copy cuda_matmul's
 * MMV path reads: code qs[i] and, per 32 elements, qd[i / 32] = (d, d * sum of the codes), with
 * its quantize_q8_kernel's operations: d = max|x| / 127 (NaN when the 32 hold a NaN or an
 * infinity), q = rint(x * 127 / max|x|) clamped to +-127. */
static __device__ __forceinline__ void ops_q8_store(float v, int64_t i, int8_t *qs, float2 *qd)
{
    const bool finite = __all_sync(0xffffffffu, fabsf(v) <= FLT_MAX);
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = finite ? amax / 127.0f : __uint_as_float(0x7fc00000u);
    const float id = amax > 0.0f && finite ? 127.0f / amax : 0.0f;
    const int q = max(-127, min(127, __float2int_rn(v * id)));
    int sum = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    qs[i] = (int8_t)q;
    if ((i & 31) == 0)
        qd[i / 32] = make_float2(d, d * (float)sum);
}

/* ops_q8_store for 8 consecutive elements per lane, a 32-element unit being 4 lanes (lanes
 * 4g .. 4g + 3, elements i0 .. i0 + 7 with i0 a multiple of 8 and lane 4g holding the unit's
 * first): the same codes and (d, d * sum) bit for bit (max, the finite test and the integer
 * sum do not depend on their order), with 4 shuffles where ops_q8_store takes 10 per element.
 * Every lane of the warp calls it; a lane with !store writes nothing (whole units). */
static __device__ __forceinline__ void ops_q8_store8(const float *v, bool store, int64_t i0,
                                                     int8_t *qs, float2 *qd)
{
    bool finite = true;
    float amax = 0.0f;
#pragma unroll
    for (int t = 0; t < 8; t++) {
        finite = finite && fabsf(v[t]) <= FLT_MAX;
        amax = fmaxf(amax, fabsf(v[t]));
    }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    int fin = finite;
    fin &= __shfl_xor_sync(0xffffffffu, fin, 1);
    fin &= __shfl_xor_sync(0xffffffffu, fin, 2);
    const float d = fin ? amax / 127.0f : __uint_as_float(0x7fc00000u);
    const float id = amax > 0.0f && fin ? 127.0f / amax : 0.0f;
    int sum = 0;
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int t = 0; t < 8; t++) {
        const int q = max(-127, min(127, __float2int_rn(v[t] * id)));
        sum += q;
        w[t / 4] |= (uint32_t)(q & 0xFF) << 8 * (t % 4);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (store) {
        *(uint2 *)(qs + i0) = make_uint2(w[0], w[1]);
        if ((i0 & 31) == 0)
            qd[i0 / 32] = make_float2(d, d * (float)sum);
    }
}

/* Programmatic dependent launch (sm_90 and later; nothing on older devices). Every kernel of
 * cuda_kernels/ calls ops_pdl_begin() before it touches memory another kernel writes or reads:
 * the wait holds the block until the kernels this one depends on have finished and their
 * writes are visible, and the trigger after it lets the kernel after this one start its blocks
 * early. Without a programmatic launch (ops_launch, cuda_graph_end) both are no-ops. With one
 * a kernel's blocks may start while the kernel before it still runs; what a kernel does before
 * the call may only read weights, nothing a kernel of the step writes (ops_l2_prefetch). */
static __device__ __forceinline__ void ops_pdl_begin(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* ops_pdl_begin without the early launch of the kernel after: for kernels of several waves
 * (the prefill GEMMs and attention), whose later waves the next kernel's waiting blocks would
 * otherwise take SM room from. */
static __device__ __forceinline__ void ops_pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Whether kernel launches may be programmatic (cuda_mem.cu): compute capability 9.0 or later
 * and STRATA_CUDA_PDL not "0" in the environment (for comparison). */
extern "C" int cuda_pdl_enabled(void);

/* Launches kernel k like k<<<grid, block, smem, s>>>(args...), as a programmatic launch where
 * cuda_pdl_enabled(): its blocks may start while the kernel before it on s still runs, and
 * wait for it in ops_pdl_begin. A recorded graph keeps the edge programmatic. */
/* ops_launch with the blocks in clusters of cluster (x, y, z) blocks (compute capability 9.0;
 * the grid a multiple of it; (1, 1, 1): no clusters). */
template <typename... P, typename... A>
static inline cudaError_t ops_launch_cluster(void (*k)(P...), dim3 grid, dim3 block, size_t smem,
                                             cudaStream_t s, dim3 cluster, A &&...args)
{
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = cuda_pdl_enabled();
    at[1].id = cudaLaunchAttributeClusterDimension;
    at[1].val.clusterDim.x = cluster.x;
    at[1].val.clusterDim.y = cluster.y;
    at[1].val.clusterDim.z = cluster.z;
    cudaLaunchConfig_t c = {};
    c.gridDim = grid;
    c.blockDim = block;
    c.dynamicSmemBytes = smem;
    c.stream = s;
    c.attrs = at;
    c.numAttrs = cluster.x * cluster.y * cluster.z > 1 ? 2 : 1;
    return cudaLaunchKernelEx(&c, k, std::forward<A>(args)...);
}

template <typename... P, typename... A>
static inline cudaError_t ops_launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem,
                                     cudaStream_t s, A &&...args)
{
    return ops_launch_cluster(k, grid, block, smem, s, dim3(1, 1, 1), std::forward<A>(args)...);
}

/* Asks the memory system to bring bytes [lo, hi) of global memory into L2 (sm_90 and later;
 * a hint, nothing on older devices): bulk prefetches of at most 1 GiB each, the bounds rounded
 * inward to 16 bytes, so nothing outside [lo, hi) is touched. */
static __device__ __forceinline__ void ops_l2_prefetch(const void *lo, const void *hi)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uintptr_t a = ((uintptr_t)lo + 15) & ~(uintptr_t)15;
    const uintptr_t b = (uintptr_t)hi & ~(uintptr_t)15;
    while (a < b) {
        const uint32_t n = (uint32_t)(b - a < ((uintptr_t)1 << 30) ? b - a : (uintptr_t)1 << 30);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(n) : "memory");
        a += n;
    }
#else
    (void)lo;
    (void)hi;
#endif
}

#endif
