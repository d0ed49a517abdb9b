/* cuda_devcache with CUDA: the lookup kernel (one block; warp 0 makes every decision in the
 * reference's order) and the copy kernel (blocks take 32 KiB chunks of the queued copies). */
#include "cuda_check.h"
#include "cuda_devcache.h"
#include "cuda_ops_util.cuh"

#include <errno.h>

#define DC_THREADS 256
#define DC_COPY_BLOCKS 264 /* two per SM of an H100/H200: enough reads in flight over PCIe */

static int dc_rc(cudaError_t e)
{
    return e == cudaSuccess ? 0 : -EIO;
}

/* dynamic shared memory: used flags (n_expert bytes, padded to 4), then the list's stamps */
static __global__ void __launch_bounds__(DC_THREADS) k_devcache_lookup(struct cuda_devcache_call a)
{
    extern __shared__ uint32_t sm[];
    uint8_t *used = (uint8_t *)sm;
    uint32_t *st = sm + (a.n_expert + 3) / 4;
    __shared__ uint32_t s_clock;
    __shared__ int s_miss[CUDA_DEVCACHE_MAX_EXPERT];
    __shared__ int s_n_miss;
    const int tid = threadIdx.x, lane = tid & 31;
    ops_pdl_begin();
    for (int e = tid; e < a.n_expert; e += DC_THREADS)
        used[e] = 0;
    if (tid == 0) {
        s_clock = *a.clock + 1;
        if (!a.prefetch)
            *a.clock = s_clock;
    }
    __syncthreads();
    for (int i = tid; i < a.n_pairs; i += DC_THREADS) {
        int e = a.ids[i];
        if (e >= 0 && e < a.n_expert)
            used[e] = 1; /* racing writers all store 1 */
    }
    __syncthreads();
    const uint32_t c = s_clock;
    if (tid < 32) { /* hits stamped, misses listed in ascending order */
        int n_miss = 0;
        unsigned long long hits = 0, pf_used = 0;
        for (int base = 0; base < a.n_expert; base += 32) {
            int e = base + lane;
            bool u = e < a.n_expert && used[e];
            int s = u ? a.slot_of[e] : -1;
            if (u && s >= 0 && a.stamp[s] != CUDA_DEVCACHE_PINNED)
                a.stamp[s] = c;
            bool pf_hit = u && s >= 0 && !a.prefetch && a.pf[s];
            if (pf_hit)
                a.pf[s] = 0;
            pf_used += __popc(__ballot_sync(0xffffffffu, pf_hit));
            unsigned hit = __ballot_sync(0xffffffffu, u && s >= 0);
            unsigned miss = __ballot_sync(0xffffffffu, u && s < 0);
            if (u && s < 0)
                s_miss[n_miss + __popc(miss & ((1u << lane) - 1))] = e;
            n_miss += __popc(miss);
            hits += __popc(hit);
        }
        if (lane == 0) {
            s_n_miss = n_miss;
            if (!a.prefetch) {
                a.stats[DEVCACHE_HITS] += hits;
                a.stats[DEVCACHE_PF_USED] += pf_used;
            }
        }
    }
    __syncthreads(); /* the hits' stamps are visible to the block */
    for (int i = tid; i < a.n_list; i += DC_THREADS)
        st[i] = a.stamp[a.list[i]];
    __syncthreads();
    if (tid >= 32)
        return;
    const uint64_t bytes = a.stride[0] + a.stride[1] + a.stride[2];
    uint32_t nj = 0, chunks = 0;
    unsigned long long n_ev = 0, n_ad = 0, inplace = 0, wasted = 0;
    for (int m = 0; m < s_n_miss; m++) {
        int e = s_miss[m];
        unsigned long long best = ~0ull; /* (stamp << 32 | index), least wins */
        for (int i = lane; i < a.n_list; i += 32)
            if (st[i] < c) {
                unsigned long long k = (unsigned long long)st[i] << 32 | (unsigned)i;
                best = k < best ? k : best;
            }
        for (int o = 16; o > 0; o >>= 1) {
            unsigned long long x = __shfl_xor_sync(0xffffffffu, best, o);
            best = x < best ? x : best;
        }
        if (best == ~0ull) {
            inplace += bytes;
            continue;
        }
        int i = (int)(best & 0xffffffffu), s = a.list[i];
        if (lane == 0) {
            int o = a.owner[s];
            if (o >= 0) {
                a.slot_of[o] = -1;
                for (int p = 0; p < 3; p++)
                    a.tab[(size_t)p * a.n_expert + o] =
                        (void *)(a.mapped[p] + (uint64_t)o * a.stride[p]);
                n_ev++;
                wasted += a.pf[s] ? bytes : 0;
            }
            a.pf[s] = (uint8_t)a.prefetch;
            a.owner[s] = e;
            a.slot_of[e] = s;
            a.stamp[s] = c;
            st[i] = c;
            for (int p = 0; p < 3; p++) {
                a.tab[(size_t)p * a.n_expert + e] = a.slot_ptr[s] + a.off[p];
                struct cuda_devcache_job *j = &a.jobs[nj + p];
                j->src = a.mapped[p] + (uint64_t)e * a.stride[p];
                j->dst = a.slot_ptr[s] + a.off[p];
                j->bytes = a.stride[p];
                j->first = chunks;
                chunks += (uint32_t)((a.stride[p] + CUDA_DEVCACHE_CHUNK - 1) / CUDA_DEVCACHE_CHUNK);
            }
        }
        nj += 3;
        n_ad++;
        __syncwarp();
    }
    if (lane == 0) {
        if (!a.prefetch) {
            a.stats[DEVCACHE_MISSES] += (unsigned long long)s_n_miss;
            a.stats[DEVCACHE_BYTES_INPLACE] += inplace;
        }
        a.stats[DEVCACHE_EVICTIONS] += n_ev;
        a.stats[a.prefetch ? DEVCACHE_PF_ADMITTED : DEVCACHE_ADMISSIONS] += n_ad;
        a.stats[DEVCACHE_BYTES_COPIED] += n_ad * bytes;
        a.stats[DEVCACHE_PF_WASTED_BYTES] += wasted;
        a.n_jobs[0] = nj;
        a.n_jobs[1] = chunks;
    }
}

/* 16-byte words when source, destination and the chunk allow, else bytes; eight loads in
 * flight per thread before their stores */
static __global__ void __launch_bounds__(DC_THREADS)
    k_devcache_copy(const struct cuda_devcache_job *jobs, const uint32_t *n_jobs)
{
    ops_pdl_begin();
    const uint32_t nj = n_jobs[0], total = n_jobs[1];
    for (uint32_t q = blockIdx.x; q < total; q += gridDim.x) {
        uint32_t lo = 0, hi = nj; /* the job holding chunk q: the last with first <= q */
        while (hi - lo > 1) {
            uint32_t mid = (lo + hi) / 2;
            if (jobs[mid].first <= q)
                lo = mid;
            else
                hi = mid;
        }
        const struct cuda_devcache_job j = jobs[lo];
        uint64_t at = (uint64_t)(q - j.first) * CUDA_DEVCACHE_CHUNK;
        uint64_t n = j.bytes - at < CUDA_DEVCACHE_CHUNK ? j.bytes - at : CUDA_DEVCACHE_CHUNK;
        const uint8_t *src = j.src + at;
        uint8_t *dst = j.dst + at;
        if ((((uintptr_t)src | (uintptr_t)dst) & 15) == 0 && n == CUDA_DEVCACHE_CHUNK) {
            const uint4 *s4 = (const uint4 *)src;
            uint4 *d4 = (uint4 *)dst;
            uint4 v[8];
#pragma unroll
            for (int k = 0; k < 8; k++)
                v[k] = s4[threadIdx.x + k * DC_THREADS];
#pragma unroll
            for (int k = 0; k < 8; k++)
                d4[threadIdx.x + k * DC_THREADS] = v[k];
        } else if ((((uintptr_t)src | (uintptr_t)dst | n) & 15) == 0) {
            const uint4 *s4 = (const uint4 *)src;
            uint4 *d4 = (uint4 *)dst;
            for (uint64_t w = threadIdx.x; w < n / 16; w += DC_THREADS)
                d4[w] = s4[w];
        } else {
            for (uint64_t b = threadIdx.x; b < n; b += DC_THREADS)
                dst[b] = src[b];
        }
    }
}

extern "C" int cuda_devcache_lookup(const struct cuda_devcache_call *a, void *stream)
{
    if (!a || a->n_expert < 1 || a->n_expert > CUDA_DEVCACHE_MAX_EXPERT || a->n_pairs < 0 ||
        a->n_list < 0)
        return -EINVAL;
    size_t smem = (size_t)(a->n_expert + 3) / 4 * 4 + sizeof(uint32_t) * (size_t)a->n_list;
    if (smem > 48 * 1024)
        return -EINVAL;
    cudaError_t e =
        ops_launch(k_devcache_lookup, dim3(1), dim3(DC_THREADS), smem, (cudaStream_t)stream, *a);
    return dc_rc(CUDA_CHECK(e));
}

extern "C" int cuda_devcache_copy(const struct cuda_devcache_job *jobs, const uint32_t *n_jobs,
                                  int blocks, void *stream)
{
    if (blocks < 0)
        return -EINVAL;
    cudaError_t e = ops_launch(k_devcache_copy, dim3(blocks ? blocks : DC_COPY_BLOCKS),
                               dim3(DC_THREADS), 0, (cudaStream_t)stream, jobs, n_jobs);
    return dc_rc(CUDA_CHECK(e));
}
