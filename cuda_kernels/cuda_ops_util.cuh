/* cuda_ops_util: small helpers shared by cuda_ops.cu, cuda_attention.cu and cuda_moe.cu:
 * integer min/max/ceil-division (host and device), a pointer alignment test (host) and the
 * warp reductions (device). Internal to cuda_kernels/: included only by .cu files. */
#ifndef STRATA_CUDA_OPS_UTIL_CUH
#define STRATA_CUDA_OPS_UTIL_CUH

#include <stdint.h>

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

#endif
