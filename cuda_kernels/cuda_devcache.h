/* cuda_devcache: the expert cache run by the GPU itself (--residency gpu). Each layer owns a
 * fixed list of VRAM slots; one kernel launch per layer call looks the call's experts up in
 * the layer's slot map, picks the least recently used slots of the layer for the misses,
 * points the layer's device pointer table at the new slots (and the evicted experts back at
 * their mapped host bytes) and streams the misses from mapped pinned host memory into the
 * slots with the SMs. Nothing waits on the host, so a decode step with misses is one recorded
 * graph like an all-resident one.
 *
 * The policy, exactly (cuda_devcache_ref.h is the scalar reference both must match):
 *   1. the layer's clock c = ++*clock; when c is a multiple of CUDA_DEVCACHE_AGE, every
 *      freq[e] of the layer is halved (rounded down);
 *   2. the distinct valid ids of the call (0 <= id < n_expert), ascending; an id whose
 *      slot_of is >= 0 is a hit: stamp[slot] = c (unless the slot is pinned); every one of
 *      them adds 1 to its freq;
 *   3. each miss e in ascending order takes the slot list[i] of least (f, stamp, i) with
 *      stamp < c, f = freq[owner] + 1 (0 for a free slot: owner -1) as step 1 left it (a
 *      pinned slot has stamp CUDA_DEVCACHE_PINNED, a free one stamp 0): the least used of the
 *      layer's experts not in use, the least recent among equals; the slot's owner o, if any,
 *      is evicted (slot_of[o] = -1, its entries back at host memory); owner = e, slot_of[e] =
 *      slot, stamp = c, e's entries at the slot, and a copy of each part queued. With no such
 *      slot left, e is read in place from host memory;
 *      With no_admit, no miss takes a slot and none counts as read in place (the CPU lane
 *      computes them, cuda_lane.h). A prefetch call with gate set admits e only where
 *      freq[e] + 1 >= its victim's f, else leaves that victim to the next miss;
 *   4. stats: hits, misses, evictions, admissions, bytes copied, bytes read in place.
 * The victim by use counts that halve every CUDA_DEVCACHE_AGE calls instead of by recency
 * alone: a newly admitted expert used once goes first, not an expert of the layer's steady
 * set that the last few calls happened to skip. Replayed routing (tools/lockstep_sim traces,
 * the prompt's most used experts in the slots, then one call per token): the shipped model
 * at 30% of its experts 73.9% hits by recency, 80.6% by this rule; the 30b-a3b preset's
 * random routing at 37% 44.2% and 53.6%.
 * A prefetch call (prefetch = 1: the experts predicted for the layer's next call) runs the same
 * steps with c = *clock + 1, the clock and freq left as they are (no halving, no counts): its
 * experts are stamped as in use by the coming call, whose own misses then cannot evict them
 * while their copies may still run. A
 * slot it fills is flagged (pf); nothing is read in place, nothing counts as a hit or miss.
 * A real call's hit on a flagged slot counts as a used prefetch and clears the flag; evicting a
 * flagged slot counts its bytes as wasted.
 * A prefetch call may only list its copies (list_only): they form the layer's prefetch batch
 * (jobs, with per-job chunk counters pf_claim / pf_done, and pend[slot] = 1 + the slot's first
 * job), which cuda_devcache_copy makes beside later work. A listing call first clears pend for
 * the layer's previous batch, which must be complete by then (the caller orders the listing
 * after the previous batch's copy launch). A real call whose hits include slots of the batch
 * still copying claims their remaining chunks itself, copies them and waits for the chunks
 * other launches claimed, so the layer waits only for the prefetched experts it uses: never
 * for a wasted one. The caller keeps a batch's slots out of reach of evictions until its
 * copies are done (the next call of the layer follows the next listing, or waits for the copy
 * launch).
 * Ownership: the caller's stream orders everything; the state arrays are device memory the
 * caller owns (host memory in the CPU simulations of tests/). */
#ifndef STRATA_CUDA_DEVCACHE_H
#define STRATA_CUDA_DEVCACHE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_DEVCACHE_PINNED 0xFFFFFFFFu
#define CUDA_DEVCACHE_CHUNK 32768 /* bytes of a copy one block moves at a time */
#define CUDA_DEVCACHE_MAX_EXPERT 1024
#define CUDA_DEVCACHE_AGE 64 /* calls of a layer between halvings of its use counts */
#define CUDA_DEVCACHE_SELECT_MAX 256 /* experts a call given logits selects from */

enum {
    DEVCACHE_HITS = 0,
    DEVCACHE_MISSES,
    DEVCACHE_EVICTIONS,
    DEVCACHE_ADMISSIONS,
    DEVCACHE_BYTES_COPIED,
    DEVCACHE_BYTES_INPLACE,
    DEVCACHE_PF_ADMITTED,
    DEVCACHE_PF_USED,
    DEVCACHE_PF_WASTED_BYTES,
    DEVCACHE_NSTAT
};

struct cuda_devcache_job {
    const uint8_t *src; /* mapped host memory */
    uint8_t *dst;       /* a slot */
    uint64_t bytes;
    uint32_t first; /* the job's first chunk among all of the call's */
    int32_t slot;   /* the slot it fills */
};

/* One layer call. Every pointer is device memory. */
struct cuda_devcache_call {
    const int32_t *ids; /* (n_pairs) the call's routing */
    int n_pairs, n_expert;
    /* NULL, or one token's router logits (n_expert <= CUDA_DEVCACHE_SELECT_MAX floats, finite):
     * the call first selects its n_pairs (<= 32) experts from them as cuda_softmax_topk does
     * (the same ids and weights, bit for bit), writes them to ids_w and w_w, and looks those
     * up (ids is not read): no top-k launch between the router and the lookup */
    const float *logits;
    int32_t *ids_w;
    float *w_w;
    int32_t *slot_of;    /* (n_expert) the layer's: slot of each expert, or -1 */
    const int32_t *list; /* (n_list) the layer's slots */
    int n_list;
    int prefetch;              /* 1: a prediction for the layer's next call (above) */
    uint8_t *pf;               /* (all slots) filled by a prefetch and not used since */
    int32_t *owner;            /* (all slots) expert in the slot (of the layer owning it), or -1 */
    uint32_t *stamp;           /* (all slots) */
    uint32_t *clock;           /* the layer's */
    uint32_t *freq;            /* (n_expert) the layer's use counts (step 1) */
    int by_recency;            /* 1: step 3 takes every f as 0 (least recent first), for
                                * comparisons (STRATA_DEVCACHE_LRU=1) */
    int no_admit;              /* 1: step 3 gives no miss a slot and reads none in place (the
                                * CPU lane computes them: cuda_lane.h) */
    int gate;                  /* a prefetch call: 1 admits a miss e into its victim only
                                * when freq[e] + 1 >= the victim's f (used at least as often
                                * as the slot's owner, or a free slot) */
    void **tab;                /* the layer's pointer table: [part * n_expert + expert] */
    uint8_t *const *slot_ptr;  /* (all slots) */
    const uint8_t *mapped[3];  /* expert 0 of each part in mapped host memory */
    uint64_t stride[3];        /* bytes of each part per expert */
    uint64_t off[3];           /* offset of each part in a slot */
    unsigned long long *stats; /* (DEVCACHE_NSTAT) the layer's, added to */
    struct cuda_devcache_job *jobs; /* (3 n_expert) */
    uint32_t *n_jobs;               /* [0] jobs, [1] chunks of all of them */
    uint32_t *sync; /* 0 between launches; launches that may overlap need one each */
    /* the layer's prefetch batch (above); pend NULL: none */
    int list_only;                           /* a prefetch call that lists its copies only: its
                                              * jobs / n_jobs are the batch */
    int32_t *pend;                           /* (all slots) */
    const struct cuda_devcache_job *pf_jobs; /* (3 n_expert) the batch's copies */
    uint32_t *pf_claim, *pf_done;            /* (3 n_expert) each job's chunks claimed, copied */
};

/* Steps 1-4 above and the copies, on `stream`, by `blocks` blocks (0: enough to keep PCIe
 * busy; fewer leave the SMs to kernels running beside it). jobs / n_jobs get the copies
 * made. 0 or -errno. */
int cuda_devcache_run(const struct cuda_devcache_call *a, int blocks, void *stream);

/* The copies of a layer's prefetch batch (jobs, n_jobs[0] of them, listed by a list_only
 * call) not yet claimed by anyone, on `stream`, by `blocks` blocks. 0 or -errno. */
int cuda_devcache_copy(const struct cuda_devcache_job *jobs, const uint32_t *n_jobs,
                       uint32_t *claim, uint32_t *done, int blocks, void *stream);

#ifdef __cplusplus
}
#endif
#endif
