/* cuda_lane with CUDA: two one-block kernels per layer call (cuda_lane.h). The message lives
 * in page-locked host memory: the device's stores to it cross PCIe as posted writes, ordered
 * by __threadfence_system() before the seq word that publishes them; the join polls the done
 * word with volatile loads, which go to host memory each time. */
#include "cuda_check.h"
#include "cuda_lane.h"
#include "cuda_ops_util.cuh"

#include <errno.h>

#define LANE_THREADS 256

static __device__ __forceinline__ uint64_t lane_now_ns(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Warp 0 finds the misses, one lane per pair (ids of one token are distinct; a repeated id
 * counts once, at its first pair), in the order of ids; the block then points the CPU's at the
 * zero slot and copies x when there are any. */
static __global__ void __launch_bounds__(LANE_THREADS) k_lane_post(struct cuda_lane_call a)
{
    __shared__ int s_miss[CUDA_LANE_MAX_K], s_n;
    const int tid = threadIdx.x;
    ops_pdl_begin();
    if (tid < 32) {
        const int e = tid < a.k ? a.ids[tid] : -1;
        const bool valid = e >= 0 && e < a.n_expert;
        const bool in = valid && a.slot_of[e] < 0;
        const unsigned same = __match_any_sync(0xffffffffu, e);
        const bool ms = in && (__ffs(same) - 1) == tid; /* the first pair of its expert */
        const unsigned b = __ballot_sync(0xffffffffu, ms);
        const int n_miss = __popc(b), at = __popc(b & ((1u << tid) - 1));
        int n = (int)ceilf((float)n_miss * a.cpu_share);
        n = n_miss == 0 ? 0 : n < 1 ? 1 : n > n_miss ? n_miss : n;
        if (ms)
            s_miss[at] = e;
        __syncwarp();
        if (ms && at < n)
            a.list[1 + at] = e;
        if (tid < a.k) {
            bool cpu = false;
            for (int j = 0; j < n; j++)
                cpu |= s_miss[j] == e;
            if (n) {
                a.msg->ids[tid] = e;
                a.msg->w[tid] = a.w[tid];
                a.msg->cpu[tid] = (uint8_t)cpu;
            }
            if (a.admit)
                a.admit[tid] = tid < n_miss && tid < a.n_admit ? s_miss[tid] : -1;
        }
        if (tid == 0) {
            a.list[0] = n;
            s_n = n;
        }
    }
    __syncthreads();
    const int n = s_n;
    const uint64_t tag = (uint64_t)*a.seq << 8 | (uint64_t)n;
    if (n == 0) { /* nothing for the CPU: the tag alone */
        if (tid == 0)
            *(volatile uint64_t *)&a.msg->tag = tag;
        return;
    }
    for (int i = tid; i < 3 * n; i += LANE_THREADS) { /* zeros for the expert kernels */
        const int e = s_miss[i / 3], p = i % 3;
        a.tab[(size_t)p * a.n_expert + e] = (void *)a.zero;
    }
    for (int i = tid; i < a.n_embd; i += LANE_THREADS)
        a.xh[i] = a.x[i];
    __threadfence_system();
    __syncthreads();
    if (tid == 0)
        *(volatile uint64_t *)&a.msg->tag = tag;
}

static __global__ void __launch_bounds__(LANE_THREADS) k_lane_join(struct cuda_lane_call a)
{
    __shared__ int s_ok;
    const int tid = threadIdx.x;
    ops_pdl_begin();
    const int n = a.list[0];
    if (n == 0)
        return;
    if (tid == 0) {
        const uint32_t seq = *a.seq;
        const uint64_t t0 = lane_now_ns();
        int ok = 1;
        while (*(volatile const uint32_t *)&a.msg->done != seq) {
            if (lane_now_ns() - t0 > CUDA_LANE_WAIT_NS) {
                *a.err = 1;
                ok = 0;
                break;
            }
            __nanosleep(64);
        }
        __threadfence_system();
        s_ok = ok;
    }
    __syncthreads();
    /* the host's row by volatile loads (host memory the host wrote while this kernel ran),
     * eight in flight per thread before any is used */
    const volatile float *yh = a.yh;
    for (int base = 0; s_ok && base < a.n_embd; base += 8 * LANE_THREADS) {
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = base + j * LANE_THREADS + tid;
            v[j] = i < a.n_embd ? yh[i] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = base + j * LANE_THREADS + tid;
            if (i < a.n_embd)
                a.out[i] += v[j];
        }
    }
    for (int i = tid; i < 3 * n; i += LANE_THREADS) { /* back at their host bytes */
        const int e = a.list[1 + i / 3], p = i % 3;
        a.tab[(size_t)p * a.n_expert + e] = (void *)(a.mapped[p] + (uint64_t)e * a.stride[p]);
    }
}

static int lane_check(const struct cuda_lane_call *a)
{
    return !a || a->k < 1 || a->k > CUDA_LANE_MAX_K || a->n_expert < 1 || a->n_embd < 1 ||
                   !a->msg || !a->list || !a->seq || !a->tab || !a->zero
               ? -EINVAL
               : 0;
}

extern "C" int cuda_lane_post(const struct cuda_lane_call *a, void *stream)
{
    int rc = lane_check(a);
    if (rc)
        return rc;
    cudaError_t e =
        ops_launch(k_lane_post, dim3(1), dim3(LANE_THREADS), 0, (cudaStream_t)stream, *a);
    return CUDA_CHECK(e) == cudaSuccess ? 0 : -EIO;
}

extern "C" int cuda_lane_join(const struct cuda_lane_call *a, void *stream)
{
    int rc = lane_check(a);
    if (rc)
        return rc;
    cudaError_t e =
        ops_launch(k_lane_join, dim3(1), dim3(LANE_THREADS), 0, (cudaStream_t)stream, *a);
    return CUDA_CHECK(e) == cudaSuccess ? 0 : -EIO;
}
