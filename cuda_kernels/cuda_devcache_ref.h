/* The scalar reference of cuda_devcache's policy (cuda_devcache.h): what the kernels must do,
 * run on host memory. Used by the GPU test that checks the kernels and by the CPU simulations
 * of the device in tests/. Header-only; not reentrant (a static scratch array). */
#ifndef STRATA_CUDA_DEVCACHE_REF_H
#define STRATA_CUDA_DEVCACHE_REF_H

#include <stdint.h>
#include <string.h>

#include "cuda_devcache.h"

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
        for (int i = 0; i < a->n_list; i++) {
            uint32_t t = a->stamp[a->list[i]];
            if (t < c && (best < 0 || t < a->stamp[a->list[best]]))
                best = i;
        }
        if (best < 0) {
            if (!a->prefetch)
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
        for (int p = 0; p < 3; p++) {
            a->tab[(size_t)p * a->n_expert + e] = a->slot_ptr[s] + a->off[p];
            struct cuda_devcache_job *j = &a->jobs[nj++];
            j->src = a->mapped[p] + (uint64_t)e * a->stride[p];
            j->dst = a->slot_ptr[s] + a->off[p];
            j->bytes = a->stride[p];
            j->first = chunks;
            chunks += (uint32_t)((a->stride[p] + CUDA_DEVCACHE_CHUNK - 1) / CUDA_DEVCACHE_CHUNK);
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
        memcpy(jobs[i].dst, jobs[i].src, jobs[i].bytes);
}

/* The kernel's whole launch: the lookup, then the copies it listed. */
static inline void devcache_ref_run(const struct cuda_devcache_call *a)
{
    devcache_ref_lookup(a);
    devcache_ref_copy(a->jobs, a->n_jobs);
}

#endif
