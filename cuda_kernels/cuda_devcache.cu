/* cuda_devcache with CUDA: one launch per layer call. Every block makes the whole call's
 * decisions itself, from the state as the call found it (warp 0, in the reference's order,
 * in shared memory), then copies its share of the chunks of the misses' parts. Block 0 alone
 * writes the new state, once every other block has finished reading the old one (a counter
 * the others raise; they never wait for anything, so every block finishes). One launch instead
 * of a lookup kernel and a copy kernel saves a kernel boundary per layer. A call whose experts
 * all hit takes a shortcut: every block sees it from the ids and the slot map alone, block 0
 * stamps the hits and the others leave at once, with no barrier. */
#include "cuda_check.h"
#include "cuda_devcache.h"
#include "cuda_ops_util.cuh"

#include <errno.h>
#include <stdlib.h>

#define DC_THREADS 256
#define DC_BLOCKS 264 /* two per SM of an H100/H200: enough reads in flight over PCIe */

/* The default grid: DC_BLOCKS, or STRATA_DEVCACHE_BLOCKS from the environment (1..1024; for
 * measuring). */
static int dc_blocks(void)
{
    static int n = 0; /* decided once; a race writes the same value */
    if (!n) {
        const char *v = getenv("STRATA_DEVCACHE_BLOCKS");
        int x = v ? atoi(v) : 0;
        n = x >= 1 && x <= 1024 ? x : DC_BLOCKS;
    }
    return n;
}

static int dc_rc(cudaError_t e)
{
    return e == cudaSuccess ? 0 : -EIO;
}

/* n <= CUDA_DEVCACHE_CHUNK bytes from src to dst by the block's threads. */
static __device__ void dc_copy_bytes(const uint8_t *src, uint8_t *dst, uint64_t n)
{
    if ((((uintptr_t)src | (uintptr_t)dst) & 15) == 0 && n == CUDA_DEVCACHE_CHUNK) {
        const uint4 *s4 = (const uint4 *)src; /* eight 16-byte loads in flight per thread */
        uint4 *d4 = (uint4 *)dst;
        uint4 v[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = s4[threadIdx.x + k * DC_THREADS];
#pragma unroll
        for (int k = 0; k < 8; k++)
            d4[threadIdx.x + k * DC_THREADS] = v[k];
    } else if ((((uintptr_t)src | (uintptr_t)dst | n) & 15) == 0) {
        for (uint64_t w = threadIdx.x; w < n / 16; w += DC_THREADS)
            ((uint4 *)dst)[w] = ((const uint4 *)src)[w];
    } else {
        for (uint64_t b = threadIdx.x; b < n; b += DC_THREADS)
            dst[b] = src[b];
    }
}

/* A chunk of the parts of the copied misses: q counts chunks of expert 0's gate, up, down,
 * then expert 1's, ...; each part's chunks of CUDA_DEVCACHE_CHUNK bytes, its last one short. */
static __device__ void dc_copy_chunk(const struct cuda_devcache_call &a, const int *miss,
                                     const int *vic_slot, const uint32_t *part_chunks, uint32_t q)
{
    const uint32_t per = part_chunks[0] + part_chunks[1] + part_chunks[2];
    const int m = (int)(q / per);
    uint32_t r = q % per;
    int p = 0;
    while (r >= part_chunks[p])
        r -= part_chunks[p++];
    const uint64_t at = (uint64_t)r * CUDA_DEVCACHE_CHUNK;
    const uint64_t n =
        a.stride[p] - at < CUDA_DEVCACHE_CHUNK ? a.stride[p] - at : CUDA_DEVCACHE_CHUNK;
    dc_copy_bytes(a.mapped[p] + (uint64_t)miss[m] * a.stride[p] + at,
                  a.slot_ptr[vic_slot[m]] + a.off[p] + at, n);
}

static __device__ __forceinline__ uint32_t dc_chunks(uint64_t bytes)
{
    return (uint32_t)((bytes + CUDA_DEVCACHE_CHUNK - 1) / CUDA_DEVCACHE_CHUNK);
}

/* Claims chunks of a batch's job one at a time (whoever claims a chunk copies it, so no block
 * ever waits for a launch that may not run) and copies them, until none is left. */
static __device__ void dc_claim_job(const struct cuda_devcache_job *jb, uint32_t *claim,
                                    uint32_t *done)
{
    __shared__ uint32_t s_q;
    const uint32_t n = dc_chunks(jb->bytes);
    for (;;) {
        if (threadIdx.x == 0)
            s_q = atomicAdd(claim, 1u);
        __syncthreads();
        const uint32_t q = s_q;
        __syncthreads();
        if (q >= n)
            return;
        const uint64_t at = (uint64_t)q * CUDA_DEVCACHE_CHUNK;
        dc_copy_bytes(jb->src + at, jb->dst + at,
                      jb->bytes - at < CUDA_DEVCACHE_CHUNK ? jb->bytes - at : CUDA_DEVCACHE_CHUNK);
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence(); /* the chunk's bytes before its count */
            atomicAdd(done, 1u);
        }
    }
}

/* Waits until every chunk of the job is copied (by blocks that are running: they claimed). */
static __device__ void dc_wait_job(const struct cuda_devcache_job *jb, const uint32_t *done)
{
    if (threadIdx.x == 0) {
        const uint32_t n = dc_chunks(jb->bytes);
        while (*(const volatile uint32_t *)done < n)
            __nanosleep(128);
        __threadfence();
    }
    __syncthreads();
}

/* The batch's jobs of the np pending slots listed in pj (each slot's first job): their
 * remaining chunks copied by this block with any others, then waited for. */
static __device__ void dc_help(const struct cuda_devcache_call &a, const int *pj, int np)
{
    for (int i = 0; i < np; i++)
        for (int p = 0; p < 3; p++)
            dc_claim_job(&a.pf_jobs[pj[i] + p], &a.pf_claim[pj[i] + p], &a.pf_done[pj[i] + p]);
    for (int i = 0; i < np; i++)
        for (int p = 0; p < 3; p++)
            dc_wait_job(&a.pf_jobs[pj[i] + p], &a.pf_done[pj[i] + p]);
}

/* A list_only call's first write: the layer's previous batch is complete, its slots pending
 * no more. Thread 0. */
static __device__ void dc_retire_batch(const struct cuda_devcache_call &a)
{
    const uint32_t n = a.n_jobs[0];
    for (uint32_t j = 0; j < n; j++)
        a.pend[a.jobs[j].slot] = 0;
}

/* Step 1's halving and step 2's counts of a real call by the block's threads (block 0, once
 * no block reads the counts any more). */
static __device__ void dc_count(const struct cuda_devcache_call &a, const uint8_t *used, uint32_t c)
{
    if (a.prefetch)
        return;
    const bool age = c % CUDA_DEVCACHE_AGE == 0;
    for (int e = threadIdx.x; e < a.n_expert; e += DC_THREADS)
        a.freq[e] = (age ? a.freq[e] >> 1 : a.freq[e]) + used[e];
}

/* A call whose experts all hit (the common case, and the one every decode step pays for):
 * block 0 alone stamps their slots and counts, reading only the hits' slots; slot_of, the
 * owners and the table stay as they are, so the other blocks, which read nothing else, need
 * not be waited for. The same state as the general path below. */
static __device__ void dc_all_hit(const struct cuda_devcache_call &a, const uint8_t *used,
                                  uint32_t c)
{
    __shared__ unsigned long long s_hits, s_pf_used;
    const int tid = threadIdx.x;
    if (tid == 0)
        s_hits = s_pf_used = 0;
    __syncthreads();
    unsigned long long hits = 0, pf_used = 0;
    for (int e = tid; e < a.n_expert; e += DC_THREADS) {
        if (!used[e])
            continue;
        int s = a.slot_of[e];
        uint32_t t = a.stamp[s];
        hits++;
        pf_used += a.pf[s];
        if (t != CUDA_DEVCACHE_PINNED)
            a.stamp[s] = c;
        if (!a.prefetch)
            a.pf[s] = 0;
    }
    if (hits)
        atomicAdd(&s_hits, hits);
    if (pf_used)
        atomicAdd(&s_pf_used, pf_used);
    dc_count(a, used, c);
    __syncthreads();
    if (tid == 0) {
        if (!a.prefetch) {
            *a.clock = c;
            a.stats[DEVCACHE_HITS] += s_hits;
            a.stats[DEVCACHE_PF_USED] += s_pf_used;
        }
        if (a.list_only)
            dc_retire_batch(a);
        a.n_jobs[0] = a.n_jobs[1] = 0;
    }
}

/* The victim key of step 3 (f, stamp, i) in 64 bits: f (saturated at 2^22 - 1; use counts
 * stay under 2 CUDA_DEVCACHE_AGE + 1) above the stamp above the list index (< 1024). */
static __device__ __forceinline__ unsigned long long dc_key(uint32_t f, uint32_t stamp, int i)
{
    const unsigned long long fs = f < 0x3FFFFFu ? f : 0x3FFFFFu;
    return fs << 42 | (unsigned long long)stamp << 10 | (unsigned)i;
}

/* dynamic shared memory: the list's stamps (n_list), their owners' f of step 3 (n_list), the
 * misses (n_expert), the pending hits' first jobs (n_expert), used flags (n_expert bytes) */
static __global__ void __launch_bounds__(DC_THREADS) k_devcache(struct cuda_devcache_call a)
{
    extern __shared__ uint32_t sm[];
    uint32_t *st = sm, *fk = sm + a.n_list;
    int *miss = (int *)(fk + a.n_list);
    int *pj = miss + a.n_expert;
    uint8_t *used = (uint8_t *)(pj + a.n_expert);
    __shared__ int vic_slot[CUDA_DEVCACHE_MAX_EXPERT];
    __shared__ int s_n_miss, s_n_copy, s_np;
    __shared__ unsigned long long s_hits, s_pf_used;
    __shared__ uint32_t part_chunks[3];
    __shared__ int sids[32];
    __shared__ __align__(16) float slv[CUDA_DEVCACHE_SELECT_MAX];
    const int tid = threadIdx.x, lane = tid & 31;
    ops_pdl_begin();
    if (a.logits) /* block 0 writes the selection for the kernels after the lookup */
        ops_topk_select(a.logits, a.n_expert, a.n_pairs, slv, sids,
                        blockIdx.x == 0 ? a.ids_w : nullptr, blockIdx.x == 0 ? a.w_w : nullptr);
    const int32_t *ids = a.logits ? sids : a.ids;
    const uint32_t c = *a.clock + 1;
    for (int e = tid; e < a.n_expert; e += DC_THREADS)
        used[e] = 0;
    if (tid < 3)
        part_chunks[tid] =
            (uint32_t)((a.stride[tid] + CUDA_DEVCACHE_CHUNK - 1) / CUDA_DEVCACHE_CHUNK);
    if (tid == 0)
        s_hits = s_pf_used = 0;
    __syncthreads();
    int missed = 0;
    for (int i = tid; i < a.n_pairs; i += DC_THREADS) {
        int e = ids[i];
        if (e >= 0 && e < a.n_expert) {
            used[e] = 1; /* racing writers all store 1 */
            missed |= a.slot_of[e] < 0;
        }
    }
    missed = __syncthreads_or(missed);
    if (tid < 32) { /* hits whose prefetch may still be copying (slots as the call found them) */
        int np = 0;
        for (int base = 0; a.pend && !a.prefetch && base < a.n_expert; base += 32) {
            int e = base + lane, s = e < a.n_expert && used[e] ? a.slot_of[e] : -1;
            int p = s >= 0 ? a.pend[s] : 0;
            unsigned b = __ballot_sync(0xffffffffu, p != 0);
            if (p)
                pj[np + __popc(b & ((1u << lane) - 1))] = p - 1;
            np += __popc(b);
        }
        if (lane == 0)
            s_np = np;
    }
    __syncthreads();
    if (!missed) { /* every expert hit: nothing to copy or evict */
        if (blockIdx.x == 0)
            dc_all_hit(a, used, c);
        dc_help(a, pj, s_np);
        return;
    }
    /* the list's stamps, hits stamped as in use (pinned ones stay pinned) */
    unsigned long long hits = 0, pf_used = 0;
    const bool age = !a.prefetch && c % CUDA_DEVCACHE_AGE == 0;
    for (int i = tid; i < a.n_list; i += DC_THREADS) {
        int s = a.list[i], o = a.owner[s];
        uint32_t t = a.stamp[s];
        if (o >= 0 && used[o]) {
            hits++;
            pf_used += a.pf[s];
            t = t == CUDA_DEVCACHE_PINNED ? t : c;
        }
        st[i] = t;
        fk[i] = o >= 0 && !a.by_recency ? (age ? a.freq[o] >> 1 : a.freq[o]) + 1
                                        : 0; /* o is not in use */
    }
    if (hits)
        atomicAdd(&s_hits, hits);
    if (pf_used)
        atomicAdd(&s_pf_used, pf_used);
    if (tid < 32) { /* misses in ascending order */
        int n_miss = 0;
        for (int base = 0; base < a.n_expert; base += 32) {
            int e = base + lane;
            bool ms = e < a.n_expert && used[e] && a.slot_of[e] < 0;
            unsigned b = __ballot_sync(0xffffffffu, ms);
            if (ms)
                miss[n_miss + __popc(b & ((1u << lane) - 1))] = e;
            n_miss += __popc(b);
        }
        if (lane == 0)
            s_n_miss = n_miss;
    }
    __syncthreads();
    if (tid < 32) { /* each miss's victim: least (f, stamp, index) with stamp below c, or none */
        int n_copy = 0;
        for (int m = 0; m < s_n_miss && !a.no_admit; m++) {
            unsigned long long best = ~0ull;
            for (int i = lane; i < a.n_list; i += 32)
                if (st[i] < c) {
                    const unsigned long long k = dc_key(fk[i], st[i], i);
                    best = k < best ? k : best;
                }
            for (int o = 16; o > 0; o >>= 1) {
                unsigned long long x = __shfl_xor_sync(0xffffffffu, best, o);
                best = x < best ? x : best;
            }
            int i = best == ~0ull ? -1 : (int)(best & 0x3FFu);
            if (i >= 0 && a.gate && a.prefetch) { /* used less than the victim's owner */
                const uint32_t fb = (uint32_t)(best >> 42);
                i = fb > 0 && a.freq[miss[m]] + 1 < fb ? -1 : i;
            }
            if (lane == 0 && i >= 0) {
                st[i] = c;
                miss[n_copy] = miss[m]; /* the copied ones first, in order */
                vic_slot[n_copy] = a.list[i];
                n_copy++;
            }
            n_copy = __shfl_sync(0xffffffffu, n_copy, 0);
            __syncwarp();
        }
        if (lane == 0)
            s_n_copy = n_copy;
    }
    __syncthreads();
    const int n_copy = s_n_copy, n_miss = s_n_miss;
    if (blockIdx.x != 0) { /* done reading the state: tell block 0 */
        if (tid == 0) {
            __threadfence();
            atomicAdd(a.sync, 1u);
        }
    } else {
        if (tid == 0) {
            while (atomicAdd(a.sync, 0u) < gridDim.x - 1)
                ;
            *a.sync = 0; /* for the next launch: every other block has counted */
            __threadfence();
        }
        __syncthreads();
        for (int i = tid; i < a.n_list; i += DC_THREADS) /* stamps, then the misses' slots */
            a.stamp[a.list[i]] = st[i];
        dc_count(a, used, c);
        for (int i = tid; i < a.n_list && !a.prefetch; i += DC_THREADS) {
            int s = a.list[i], o = a.owner[s];
            if (o >= 0 && used[o])
                a.pf[s] = 0;
        }
        __syncthreads();
        if (tid == 0) {
            const uint64_t bytes = a.stride[0] + a.stride[1] + a.stride[2];
            unsigned long long n_ev = 0, wasted = 0;
            uint32_t chunks = 0, nj = 0;
            if (a.list_only)
                dc_retire_batch(a);
            for (int m = 0; m < n_copy; m++) {
                int e = miss[m], s = vic_slot[m], o = a.owner[s];
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
                if (a.list_only)
                    a.pend[s] = (int32_t)nj + 1;
                for (int p = 0; p < 3; p++) {
                    a.tab[(size_t)p * a.n_expert + e] = a.slot_ptr[s] + a.off[p];
                    if (a.list_only)
                        a.pf_claim[nj] = a.pf_done[nj] = 0;
                    struct cuda_devcache_job *j = &a.jobs[nj++];
                    j->src = a.mapped[p] + (uint64_t)e * a.stride[p];
                    j->dst = a.slot_ptr[s] + a.off[p];
                    j->bytes = a.stride[p];
                    j->first = chunks;
                    j->slot = s;
                    chunks += part_chunks[p];
                }
            }
            unsigned long long *stt = a.stats;
            if (!a.prefetch) {
                *a.clock = c;
                stt[DEVCACHE_HITS] += s_hits;
                stt[DEVCACHE_PF_USED] += s_pf_used;
                stt[DEVCACHE_MISSES] += (unsigned long long)n_miss;
                stt[DEVCACHE_BYTES_INPLACE] +=
                    a.no_admit ? 0 : (unsigned long long)(n_miss - n_copy) * bytes;
            }
            stt[DEVCACHE_EVICTIONS] += n_ev;
            stt[a.prefetch ? DEVCACHE_PF_ADMITTED : DEVCACHE_ADMISSIONS] +=
                (unsigned long long)n_copy;
            stt[DEVCACHE_BYTES_COPIED] += (unsigned long long)n_copy * bytes;
            stt[DEVCACHE_PF_WASTED_BYTES] += wasted;
            a.n_jobs[0] = nj;
            a.n_jobs[1] = chunks;
        }
    }
    const uint32_t total =
        a.list_only ? 0 : (uint32_t)n_copy * (part_chunks[0] + part_chunks[1] + part_chunks[2]);
    for (uint32_t q = blockIdx.x; q < total; q += gridDim.x)
        dc_copy_chunk(a, miss, vic_slot, part_chunks, q);
    dc_help(a, pj, s_np);
}

/* The batch's chunks nobody claimed yet, claimed and copied job by job. */
static __global__ void __launch_bounds__(DC_THREADS)
    k_devcache_copy(const struct cuda_devcache_job *jobs, const uint32_t *n_jobs, uint32_t *claim,
                    uint32_t *done)
{
    ops_pdl_begin();
    const uint32_t n = n_jobs[0];
    for (uint32_t j = 0; j < n; j++)
        dc_claim_job(&jobs[j], &claim[j], &done[j]);
}

extern "C" int cuda_devcache_run(const struct cuda_devcache_call *a, int blocks, void *stream)
{
    if (!a || a->n_expert < 1 || a->n_expert > CUDA_DEVCACHE_MAX_EXPERT || a->n_pairs < 0 ||
        a->n_list < 0 || a->n_list > a->n_expert || blocks < 0)
        return -EINVAL;
    if (a->list_only && (!a->prefetch || !a->pend))
        return -EINVAL;
    if (a->logits && (a->n_expert > CUDA_DEVCACHE_SELECT_MAX || a->n_pairs < 1 || a->n_pairs > 32 ||
                      a->n_pairs > a->n_expert || !a->ids_w || !a->w_w))
        return -EINVAL;
    if (!a->freq)
        return -EINVAL;
    size_t smem = 2 * sizeof(uint32_t) * (size_t)a->n_list + 2 * sizeof(int) * (size_t)a->n_expert +
                  (size_t)a->n_expert;
    cudaError_t e = ops_launch(k_devcache, dim3(blocks ? blocks : dc_blocks()), dim3(DC_THREADS),
                               smem, (cudaStream_t)stream, *a);
    return dc_rc(CUDA_CHECK(e));
}

extern "C" int cuda_devcache_copy(const struct cuda_devcache_job *jobs, const uint32_t *n_jobs,
                                  uint32_t *claim, uint32_t *done, int blocks, void *stream)
{
    if (!jobs || !n_jobs || !claim || !done || blocks < 1)
        return -EINVAL;
    cudaError_t e = ops_launch(k_devcache_copy, dim3(blocks), dim3(DC_THREADS), 0,
                               (cudaStream_t)stream, jobs, n_jobs, claim, done);
    return dc_rc(CUDA_CHECK(e));
}
