/* The scalar reference of cuda_devcache's policy (cuda_devcache.h): what the kernels must do,
 * run on host memory. Used by the GPU test that checks the kernels and by the CPU simulations
 * of the device in tests/. Header-only; not reentrant (a static scratch array). */
#ifndef STRATA_CUDA_DEVCACHE_REF_H
#define STRATA_CUDA_DEVCACHE_REF_H

#include <stdint.h>
#include <string.h>

#include "cuda_devcache.h"

/* How the reference moves an expert's bytes: memcpy, unless the includer's pointers are device
 * memory (the GPU test checks the slots' bytes itself) and it defines this as nothing. */
#ifndef DEVCACHE_REF_COPY_BYTES
#define DEVCACHE_REF_COPY_BYTES(dst, src, n) memcpy((dst), (src), (n))
#endif

static inline uint32_t devcache_ref_chunks(uint64_t bytes)
{
    return (uint32_t)((bytes + CUDA_DEVCACHE_CHUNK - 1) / CUDA_DEVCACHE_CHUNK);
}

/* Job j of a prefetch batch made now, if nobody has (its chunks are all or none here). */
static inline void devcache_ref_finish(const struct cuda_devcache_job *jobs, uint32_t *claim,
                                       uint32_t *done, uint32_t j)
{
    uint32_t n = devcache_ref_chunks(jobs[j].bytes);
    if (done[j] < n) {
        DEVCACHE_REF_COPY_BYTES(jobs[j].dst, jobs[j].src, jobs[j].bytes);
        claim[j] = done[j] = n;
    }
}

static inline void devcache_ref_lookup(const struct cuda_devcache_call *a)
{
    static uint8_t used[CUDA_DEVCACHE_MAX_EXPERT];
    const uint32_t c = a->prefetch ? *a->clock + 1 : ++*a->clock;
    const uint64_t bytes = a->stride[0] + a->stride[1] + a->stride[2];
    unsigned long long *st = a->stats;
    uint32_t nj = 0, chunks = 0;
    memset(used, 0, (size_t)a->n_expert);
    for (int i = 0; i < a->n_pairs; i++)
        if (a->ids[i] >= 0 && a->ids[i] < a->n_expert)
            used[a->ids[i]] = 1;
    if (!a->prefetch) {
        for (int e = 0; e < a->n_expert && c % CUDA_DEVCACHE_AGE == 0; e++)
            a->freq[e] >>= 1;
        for (int e = 0; e < a->n_expert; e++)
            a->freq[e] += used[e];
    }
    if (a->pend && !a->prefetch) /* the batch's copies this call's hits need */
        for (int e = 0; e < a->n_expert; e++) {
            int s = a->slot_of[e];
            if (used[e] && s >= 0 && a->pend[s])
                for (int p = 0; p < 3; p++)
                    devcache_ref_finish(a->pf_jobs, a->pf_claim, a->pf_done,
                                        (uint32_t)(a->pend[s] - 1 + p));
        }
    if (a->list_only) /* the previous batch is complete: its slots are pending no more */
        for (uint32_t j = 0; j < a->n_jobs[0]; j++)
            a->pend[a->jobs[j].slot] = 0;
    for (int e = 0; e < a->n_expert; e++) {
        int s = a->slot_of[e];
        if (!used[e] || s < 0)
            continue;
        if (a->stamp[s] != CUDA_DEVCACHE_PINNED)
            a->stamp[s] = c;
        if (a->prefetch)
            continue;
        st[DEVCACHE_HITS]++;
        if (a->pf[s]) {
            st[DEVCACHE_PF_USED]++;
            a->pf[s] = 0;
        }
    }
    for (int e = 0; e < a->n_expert; e++) {
        if (!used[e] || a->slot_of[e] >= 0)
            continue;
        if (!a->prefetch)
            st[DEVCACHE_MISSES]++;
        int best = -1;
        uint64_t bk = 0;
        for (int i = 0; i < a->n_list && !a->no_admit; i++) {
            const int s = a->list[i], o = a->owner[s];
            const uint64_t f = o >= 0 && !a->by_recency ? a->freq[o] + 1 : 0;
            const uint64_t k = f << 32 | a->stamp[s];
            if (a->stamp[s] < c && (best < 0 || k < bk))
                best = i, bk = k;
        }
        if (best >= 0 && a->gate && a->prefetch) { /* used less than the victim's owner */
            const int o = a->owner[a->list[best]];
            const uint64_t f = o >= 0 && !a->by_recency ? a->freq[o] + 1 : 0;
            best = f > 0 && (uint64_t)a->freq[e] + 1 < f ? -1 : best;
        }
        if (best < 0) {
            if (!a->prefetch && !a->no_admit)
                st[DEVCACHE_BYTES_INPLACE] += bytes;
            continue;
        }
        int s = a->list[best], o = a->owner[s];
        if (o >= 0) {
            a->slot_of[o] = -1;
            for (int p = 0; p < 3; p++)
                a->tab[(size_t)p * a->n_expert + o] =
                    (void *)(a->mapped[p] + (uint64_t)o * a->stride[p]);
            st[DEVCACHE_EVICTIONS]++;
            if (a->pf[s])
                st[DEVCACHE_PF_WASTED_BYTES] += bytes;
        }
        a->pf[s] = (uint8_t)a->prefetch;
        a->owner[s] = e;
        a->slot_of[e] = s;
        a->stamp[s] = c;
        if (a->list_only)
            a->pend[s] = (int32_t)nj + 1;
        for (int p = 0; p < 3; p++) {
            a->tab[(size_t)p * a->n_expert + e] = a->slot_ptr[s] + a->off[p];
            if (a->list_only)
                a->pf_claim[nj] = a->pf_done[nj] = 0;
            struct cuda_devcache_job *j = &a->jobs[nj++];
            j->src = a->mapped[p] + (uint64_t)e * a->stride[p];
            j->dst = a->slot_ptr[s] + a->off[p];
            j->bytes = a->stride[p];
            j->first = chunks;
            j->slot = s;
            chunks += devcache_ref_chunks(a->stride[p]);
        }
        st[a->prefetch ? DEVCACHE_PF_ADMITTED : DEVCACHE_ADMISSIONS]++;
        st[DEVCACHE_BYTES_COPIED] += bytes;
    }
    a->n_jobs[0] = nj;
    a->n_jobs[1] = chunks;
}

static inline void devcache_ref_copy(const struct cuda_devcache_job *jobs, const uint32_t *n_jobs)
{
    for (uint32_t i = 0; i < n_jobs[0]; i++)
        DEVCACHE_REF_COPY_BYTES(jobs[i].dst, jobs[i].src, jobs[i].bytes);
}

/* The kernel's whole launch: the lookup, then the copies it listed (a list_only call's are
 * the batch devcache_ref_copy_batch makes). */
static inline void devcache_ref_run(const struct cuda_devcache_call *a)
{
    devcache_ref_lookup(a);
    if (!a->list_only)
        devcache_ref_copy(a->jobs, a->n_jobs);
}

/* cuda_devcache_copy: the batch's jobs nobody made yet. */
static inline void devcache_ref_copy_batch(const struct cuda_devcache_job *jobs,
                                           const uint32_t *n_jobs, uint32_t *claim, uint32_t *done)
{
    for (uint32_t j = 0; j < n_jobs[0]; j++)
        devcache_ref_finish(jobs, claim, done, j);
}

#endif
