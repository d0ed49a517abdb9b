/* cache_priv: the expert cache's state, shared by its files and by nothing else:
 *   expert_cache.c   open and close
 *   host_tier.c      T1: the stacked experts in pinned, device-mapped host memory
 *   slot_pool.c      T0: the VRAM slots, the per-layer device pointer tables, shrinking
 *   fill_copy.c      path (a): misses copied into slots before the layer; prediction; hybrid
 *   fill_zerocopy.c  path (b): misses read in place, admitted at step ends; graph replays
 *   cache_stats.c    per-layer statistics, text and JSON
 *   fill_device.c    path (c): the GPU's own cache (cuda_devcache.h), no host in the loop
 *   preload.c        a residency profile's experts placed (and pinned) before the first step
 * Threads: one (the MoE layer's caller). CUDA streams: the backend's compute stream (table
 * uploads, the kernels that read the tables, read-backs of routing ids), the cache's copy
 * stream (the copies a layer waits for: its misses, and admissions between steps) and its
 * prefetch stream (copies of predicted experts, so that a layer's own misses never queue
 * behind them). Events order the compute stream after both (after the prefetch stream only
 * up to the last prefetched expert the layer uses: the stream runs its copies in order); the
 * prefetch stream starts each batch after the copy stream's work so far, and a copy into a slot
 * whose last write was a prefetch still in flight waits for the prefetch stream first. */
#ifndef STRATA_CACHE_PRIV_H
#define STRATA_CACHE_PRIV_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda_devcache.h"
#include "cuda_mem.h"
#include "expert_cache.h"
#include "model.h"

/* Host registration granule (progress reports, and the UVA check), 1 GiB unless the config's
 * pin_chunk says otherwise (tests make experts straddle registrations with small pieces). */
#define REG_CHUNK_DEFAULT (1ull << 30)
#define SLOT_ALIGN 256
#define SLOTS_PER_ALLOC 32

enum { P_GATE = 0, P_UP, P_DOWN, P_N };

struct ec_layer {
    const uint8_t *host[P_N]; /* expert 0 of each stacked tensor in host memory */
    uint8_t *mapped[P_N];     /* the same bytes as kernels address them (zero-copy) */
    uint64_t stride[P_N];     /* bytes per expert */
};

struct ec_pending {
    int layer, expert, slot;
    uint32_t gen; /* the slot's admission count when this copy was enqueued */
};

struct expert_cache {
    const struct model *m;
    int n_layer, n_expert, n_slots, max_pairs;
    struct slru *slru;
    void *compute, *copy;
    void *copy_done; /* event */
    FILE *log;
    bool gather;
    struct cuda_gather batch; /* pieces not yet launched (gather mode) */

    /* host tier */
    uint8_t *reg_lo;  /* registered range (in place), or NULL */
    size_t reg_bytes;
    uint64_t reg_chunk; /* its pieces */
    void *pinned;     /* the copy in cudaHostAlloc memory (last resort), or NULL */
    void *arena;      /* the copy in an anonymous mapping on the GPU's node, registered */
    size_t arena_bytes;
    struct ec_layer *lay;
    /* the host tier instead (cfg.tier): lay[].host and .mapped are NULL */
    struct disk_tier *tier;
    const uint8_t **tier_ptr; /* (3 n_expert) this call's experts in the tier, by expert id */
    int tier_layer;           /* the layer tier_ptr is of, -1: none */
    const uint8_t **tier_got; /* (3 n_expert) scratch: disk_tier_get's answer */
    int32_t *tier_ids;        /* (n_expert) scratch: the experts asked of the tier */
    uint8_t *tier_park;       /* where an entry of an expert in no slot points between calls
                               * (inside the registered tier memory; no kernel reads it) */

    /* slots */
    void **chunks;
    int *chunk_first, *chunk_n; /* the slots of each chunk */
    int n_chunks;
    uint8_t **slot;
    uint32_t *slot_gen; /* (n_slots) admissions into each slot so far */
    uint64_t slot_bytes, off[P_N];

    /* tables: [(layer * 3 + part) * n_expert + expert] */
    void **tab_host; /* pinned mirror */
    void *tab_host_dev;
    void **tab_dev;
    uint8_t *dirty; /* (n_layer) the device copy is stale */

    /* prefetch */
    const int32_t *pred_dev; /* set by expert_cache_predict_ahead for the next prepare_copy */
    int n_pred, n_depth;     /* ids per depth block, blocks */
    int pf_top;              /* cfg.prefetch_top: each token's first predicted experts only */
    int32_t *pred_host;      /* pinned (EXPERT_CACHE_MAX_DEPTH * max_pairs) */
    void *pf_last;           /* event: every prefetch copy enqueued so far */
    bool pf_last_set;        /* pf_last was recorded */
    void *pf_stream;         /* where prefetch copies go */
    void *pf_list;           /* (c): where the GPU's prefetch listings go, apart from the
                              * copies, so a layer waiting for its listing never waits behind
                              * the copies of the layers before it; pf_stream when the
                              * environment's STRATA_PF_LIST is 0 (for comparisons) */
    void *xfer;              /* the stream copies are enqueued on now: copy or pf_stream */
    void *copy_mark;         /* event on the copy stream that a prefetch batch starts after */
    uint8_t *slot_pf;        /* (n_slots) last written by the prefetch stream (maybe still) */
    void **slot_ev;          /* (slot_cap) event recorded after the last prefetch copy into
                              * the slot (created on first use): a layer waits only for the
                              * prefetched experts it uses, the latest of them */
    uint64_t *slot_pf_seq;   /* (slot_cap) the order of that copy on the prefetch stream */
    uint64_t pf_seq;
    int slot_cap;
    void *pred_host_dev;
    bool copies_pending;     /* copies enqueued that no compute work has waited for yet */
    bool recording;          /* a graph is being recorded: upload every table */
    uint8_t *prefetched;     /* (n_layer * n_expert) admitted by prediction, not yet used */
    struct ec_defer *defer;  /* deferred prediction (expert_cache_defer_prefetch), or NULL */

    /* hybrid */
    bool hybrid;
    expert_cache_split_fn split; /* the caller's choice of lane for each miss */
    void *split_ctx;
    int max_cpu_tok;
    void *zero_slot;         /* slot_bytes of zeros: what a CPU-lane expert's entries point at */
    int32_t *cpu_ids;        /* (n_expert) the last call's CPU-lane experts */
    int n_cpu;
    int32_t *miss_ids;       /* (n_expert) scratch: this call's misses */
    int32_t *pair_count;     /* (n_expert) scratch: pairs routed to each expert this call */
    uint8_t *miss_cpu;       /* (n_expert) scratch: split's answer, 1 = the CPU lane */
    int32_t *zeroed;         /* (n_layer * n_expert) experts whose entries point at zero_slot,
                                per layer, reverted at that layer's next call */
    bool admit_idle;         /* admit a CPU-lane miss when PCIe got nothing */
    int32_t bg_id;           /* a CPU-lane expert to admit behind this call's copies, or -1 */
    int *n_zeroed;           /* (n_layer) */

    /* (b) */
    int32_t *ids_host; /* pinned (n_layer * max_pairs) */
    void *ids_host_dev;
    int *n_pending_ids; /* (n_layer), -1 = none */
    /* (b) in decode: the routing of every layer in a slice of its own (expert_cache_zc_ids),
     * read back once per step (expert_cache_step_flush) instead of once per layer */
    int zc_pairs;         /* pairs per slice */
    int32_t *zc_ids_dev;  /* (n_layer * zc_pairs) */
    int32_t *zc_ids_host; /* pinned mirror */
    void *zc_ids_host_dev;
    uint8_t *zc_slice;       /* (n_layer) the pending ids are in the layer's slice */
    uint8_t *zc_slice_rec;   /* (n_layer) so they were in the recorded step */
    bool zc_flushed;         /* the slices' read-back is enqueued for this step */
    bool zc_flush_rec;       /* and was recorded */
    bool tab_all;            /* recording: every layer's table uploaded in this step already */
    struct ec_pending *pend; /* admissions whose copies may still run */
    int n_pend, cap_pend;
    struct ec_pending *next; /* admissions of this step end */
    int n_next;

    /* (c): the device state (cuda_devcache.h), once the first call of the path took over */
    bool dev;
    int32_t *d_slot_of;               /* (n_layer * n_expert) device */
    int32_t *d_owner;                 /* (n_slots) */
    uint32_t *d_stamp;                /* (n_slots) */
    int32_t *d_list;                  /* (n_slots) the layers' slot lists, one after the other */
    uint32_t *d_clock;                /* (n_layer) */
    uint32_t *d_freq;                 /* (n_layer * n_expert) use counts, zero at take-over */
    uint8_t **d_slot_ptr;             /* (n_slots) */
    unsigned long long *d_stats;      /* (n_layer * DEVCACHE_NSTAT) */
    struct cuda_devcache_job *d_jobs; /* (3 n_expert) */
    uint32_t *d_n_jobs;               /* (2) */
    uint8_t *d_pf;                    /* (n_slots) filled by a prefetch, not used since */
    uint32_t *d_sync; /* (2) the launches' block counters: compute, prefetch listings */
    struct cuda_devcache_job *d_pf_jobs; /* (n_layer * 3 n_expert) each layer's prefetch copies */
    uint32_t *d_pf_n_jobs;               /* (n_layer * 2) */
    void **pf_done;      /* (n_layer) events: the layer's prefetch batch listed, on pf_list
                          * (its copies follow on pf_stream: cuda_devcache_copy, then
                          * pf_last) */
    uint8_t *pf_pending; /* (n_layer) the layer's next call waits for pf_done */
    uint8_t *pf_live;    /* (n_layer) a batch of the layer may still be copying */
    int32_t *d_pend;     /* (slots) 1 + a pending slot's first job in its layer's batch */
    uint32_t *d_pf_claim, *d_pf_done; /* (n_layer * 3 n_expert) chunks claimed, copied */
    int *dev_list_at, *dev_list_n;    /* (n_layer) where each layer's list starts, its length */
    struct expert_cache_layer_stats *dev_base; /* (n_layer) counted before the device took over */
    struct expert_cache_layer_stats *slru_off; /* (n_layer) or NULL: what the device counted,
                                                * added to the SLRU's counters once it gave the
                                                * slots back */
    unsigned long long *dev_stats_h;           /* (n_layer * DEVCACHE_NSTAT) host scratch */

    bool dev_no_admit;  /* expert_cache_device_admit(false) */
    uint32_t *use_cnt;  /* (n_layer * n_expert) pairs of the copy path's calls that chose the
                         * expert since the device last took the slots: the layers' shares of
                         * the next hand-over (ec_dev_shares) */
    uint32_t dev_epoch; /* hand-overs to the device so far (expert_cache_device_epoch) */
    uint32_t *seen; /* (n_expert) stamp of the last call that saw the expert */
    uint32_t stamp;
    struct expert_cache_layer_stats *stats;
};

static inline uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

static inline const struct weight *ec_weight(const struct model *m, int l, int p)
{
    const struct layer_weights *lw = &m->layers[l];
    return p == P_GATE ? &lw->gate_exps : p == P_UP ? &lw->up_exps : &lw->down_exps;
}

static inline uint64_t ec_expert_bytes(const struct expert_cache *c, int l)
{
    return c->lay[l].stride[P_GATE] + c->lay[l].stride[P_UP] + c->lay[l].stride[P_DOWN];
}

/* host_tier.c: fills c->lay (host and mapped addresses, strides) from the model, pinning its
 * memory in place or copying it into pinned memory (with a tier: the strides, and the tier's
 * memory registered); ec_host_tier_close undoes it. */
int ec_host_tier(struct expert_cache *c);
void ec_host_tier_close(struct expert_cache *c);

/* slot_pool.c */
int ec_slots(struct expert_cache *c, const struct expert_cache_config *cfg);
/* The table entry of part p of expert e of layer l (pinned host mirror). */
void **ec_entry(struct expert_cache *c, int l, int p, int e);
/* Points (l, e)'s entries at its host bytes / at slot s; marks the layer's table dirty. */
void ec_point_host(struct expert_cache *c, int l, int e);
void ec_point_slot(struct expert_cache *c, int l, int e, int s);
/* Whether (l, e)'s entries point at a slot (not at host memory). */
bool ec_in_slot(struct expert_cache *c, int l, int e);
/* The device tables of layer l. */
void ec_tables(struct expert_cache *c, int l, struct expert_tables *t);
/* Uploads layer l's table when dirty (or always while recording). */
int ec_upload(struct expert_cache *c, int l);
/* Where part p of expert e of layer l is read from when it is in no slot: its mapped host
 * address, or with a tier its bytes there during the call that fetched it (tier_ptr) and the
 * park address otherwise. */
const uint8_t *ec_host_addr(const struct expert_cache *c, int l, int p, int e);
/* With a tier: whether (l, e) was fetched by the last ec_tier_fetch. */
static inline bool ec_tier_has(const struct expert_cache *c, int l, int e)
{
    return l == c->tier_layer && c->tier_ptr[3 * (size_t)e] != NULL;
}
/* With a tier: makes experts ids[0..n) of layer resident in it (tier_ptr). 0 or -errno. */
int ec_tier_fetch(struct expert_cache *c, int layer, const int32_t *ids, int n);

/* fill_copy.c: the copy machinery both paths use */
/* Launches the gather pieces collected so far on the copy stream. */
int ec_flush(struct expert_cache *c);
/* Admits (l, e) into a slot and enqueues its copy; the evicted expert goes back to host. The
 * slot, or -1 when every slot is guarded (*rc set on a real failure). */
int ec_admit(struct expert_cache *c, int l, int e, int *rc);
/* The same, never evicting an expert of layer guard + 1 (ec_admit: guard = l). */
int ec_admit_guard(struct expert_cache *c, int l, int e, int guard, int *rc);

/* fill_device.c: (c)'s statistics of a layer (the base plus the device's counters; syncs the
 * compute stream), their reset, the state's check, and its memory freed. */
int ec_dev_stats(const struct expert_cache *c, int layer, struct expert_cache_layer_stats *s);
int ec_dev_reset_stats(struct expert_cache *c);
int ec_dev_check(const struct expert_cache *c);
int ec_dev_slot_of(const struct expert_cache *c, int layer, int expert); /* syncs; -1: none */
void ec_dev_close(struct expert_cache *c);
/* (c): the compute stream waits for every prefetch copy enqueued so far. 0 or -errno. */
int ec_dev_join(struct expert_cache *c);

/* Deferred prediction: the owner's settle callback and the job prepare_copy left pending. A
 * struct of its own so that the const entry points can settle through it. */
struct ec_defer {
    expert_cache_settle_fn settle;
    void *ctx;
    struct expert_cache *owner;
    bool pending;
    int layer, n_pred, n_depth;
};

/* Every entry point but the slot counts and the CPU lane's getters, first: the owner's settle,
 * then a job still pending run here. 0 or -errno (a failed job's error). */
int ec_settle(const struct expert_cache *c);
int ec_run_pending(struct expert_cache *c);

#endif
