/* expert_cache: the VRAM expert slot pool of the CUDA backend under --vram-budget.
 *
 * DESIGN. The stacked expert tensors stay in host memory (tier T1): the model's mapping
 * registered in place as pinned, device-mapped memory where the driver allows, else copied
 * into pinned mapped memory. A pool of fixed-size VRAM slots (one expert's gate + up + down
 * each) caches experts under the SLRU policy of slru.h. The MoE kernels read every expert
 * through per-layer pointer tables (cuda_moe's gate_ptrs/up_ptrs/down_ptrs): an entry points
 * at the expert's slot when it is resident, else at its bytes in mapped host memory. The
 * bytes are the same either way, so logits do not depend on the budget.
 *
 * Two ways to fill the slots (DESIGN §5), chosen per call:
 *   copy      (a) host-driven: after a layer's routing the host reads the chosen ids, looks
 *                 them up, copies misses into slots on a copy stream, makes the compute stream
 *                 wait for them and only then runs the layer's experts (one sync per layer).
 *   zerocopy  (b) device-driven: nothing waits; misses are read in place over PCIe by the
 *                 kernels. The chosen ids go back to the host asynchronously and, once per step
 *                 (expert_cache_step_end, when the host has synced anyway), the SLRU is updated
 *                 and misses are admitted: copied into their slots on the copy stream, their
 *                 table entries switched to the slot once the copy is known complete (at a
 *                 later step end). A victim's entry goes back to host memory before its slot is
 *                 overwritten, while nothing runs.
 *   device    (c) the GPU's own cache (cuda_devcache.h): each layer owns a list of slots; a
 *                 kernel after the layer's routing looks its experts up, takes the layer's
 *                 least recently used slots for the misses, rewrites the table entries and
 *                 lists the copies, which a second kernel makes from mapped host memory. No
 *                 host sync, so a decode step is one CUDA graph. The first call of the path
 *                 takes the SLRU's slots over (a profile's preloaded and pinned experts
 *                 included); from then on every call must take it, until
 *                 expert_cache_device_stop gives them back.
 * With a host tier (cfg.tier, --host-budget: disk_tier.h) only the tier's slots are pinned and
 * registered, not the file: a call's misses are made resident there first (one disk_tier_get
 * of the layer's misses), then copied into VRAM slots from the tier's buffers, or read in place
 * from them when every slot is guarded; those buffers stay valid for the call, since the next
 * call's read-back syncs the compute stream (after this call's kernels and the copies they
 * waited for) before it asks the tier again. Predictions (--prefetch) become read-aheads into
 * the tier instead of copies into VRAM.
 * Ownership: owned by the CUDA backend's thread; with deferred prediction
 * (expert_cache_defer_prefetch) the prefetch worker's thread holds it from a hand-over until
 * the owner's next entry point has settled it. All CUDA calls go through cuda_mem.
 */
#ifndef STRATA_EXPERT_CACHE_H
#define STRATA_EXPERT_CACHE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct model;

enum expert_cache_mode {
    EXPERT_CACHE_COPY = 0,     /* (a) */
    EXPERT_CACHE_ZEROCOPY = 1, /* (b) */
    EXPERT_CACHE_DEVICE = 2,   /* (c) */
};

struct expert_cache_config {
    uint64_t pool_bytes; /* VRAM for slots */
    int n_slots;         /* exact slot count instead (tests); 0 = pool_bytes / slot size */
    int protected_pct;   /* SLRU protected cap, 0 = default */
    int max_pairs;       /* most (token, expert) pairs one layer call routes (tokens * k) */
    bool gather;         /* stream misses with cuda_gather_copy (one kernel launch reading
                          * mapped host memory per batch of pieces) instead of a
                          * cudaMemcpyAsync per piece */
    uint64_t pin_chunk;  /* host memory is registered in pieces of this many bytes (rounded
                          * down to pages; one expert may straddle two); 0 = 1 GiB */
    FILE *log;           /* where the set-up reports go (host path, slots), NULL = quiet */
    struct disk_tier *tier; /* experts come from this host tier (read from the file on
                             * demand) instead of the whole mapping pinned: copy path and the
                             * hybrid lane (no zero-copy); the caller keeps it open */
    int prefetch_top;       /* copies of predictions: each token's first prefetch_top predicted
                             * experts only (the router's order, largest weight first); 0 = all */
};

struct expert_cache_layer_stats {
    uint64_t hits, misses, promotions, evictions, admissions;
    uint64_t cpu_computed;    /* misses given to the CPU lane (hybrid) */
    uint64_t cpu_admitted;    /* of those, copied into a slot behind the call (PCIe idle) */
    uint64_t prefetched;      /* admitted ahead of the layer's routing (prediction) */
    uint64_t prefetch_used;   /* of those, looked up by the layer before being evicted */
    uint64_t prefetch_late;   /* of those used, still copying when the layer's routing was
                               * known (its experts waited for the copy) */
    uint64_t prefetch_wasted; /* bytes prefetched and evicted before the layer used them */
    uint64_t prefetch_dropped; /* predictions not copied: the copy stream was still busy with
                                * the previous prefetches, so they would have come too late */
    uint64_t bytes_copied;    /* streamed into slots */
    uint64_t bytes_zerocopy;  /* read in place from host memory by the kernels */
};

struct expert_cache;

/* Opens the host tier and the slot pool for model m (whose weights' data are host memory).
 * compute_stream is the backend's stream. 0 or -errno (message set). If fewer slots could be
 * allocated than the budget holds, the pool shrinks and the log says so. */
int expert_cache_open(const struct model *m, const struct expert_cache_config *cfg, void *compute_stream,
                      struct expert_cache **out);
void expert_cache_close(struct expert_cache *c);

/* Slots in the pool (after any shrinking), and bytes of one slot. */
int expert_cache_slots(const struct expert_cache *c);
uint64_t expert_cache_slot_bytes(const struct expert_cache *c);
/* VRAM the cache holds (slots and tables). */
uint64_t expert_cache_vram_bytes(const struct expert_cache *c);

/* Gives back whole slot chunks (the most recently allocated first) until at least `bytes` of
 * VRAM are free or no slot is left: their experts go back to being read from host memory. For
 * an allocation that failed after the pool was made. Syncs both streams. The number of slots
 * given up (0 when none were left), or -errno. */
int expert_cache_shrink(struct expert_cache *c, uint64_t bytes);

/* The device pointer tables of a layer: (n_expert) each. */
struct expert_tables {
    const void *const *gate, *const *up, *const *down;
};

/* (a): ids_dev (n_pairs) are the layer's chosen experts on the device, just written on the
 * compute stream. Reads them back (syncing the compute stream), serves hits from slots, copies
 * misses into slots (or, when every slot is guarded, leaves them in host memory) and makes the
 * compute stream wait for the copies. *t is then valid for the layer's expert kernels. */
int expert_cache_prepare_copy(struct expert_cache *c, int layer, const int32_t *ids_dev,
                              int n_pairs, struct expert_tables *t);

/* Prefetch (copy path only): before expert_cache_prepare_copy of layer l, the caller may pass
 * the experts it predicts for layer l + 1 (pred_dev, n device ids, written on the compute
 * stream; e.g. layer l+1's router applied to layer l's input). prepare_copy reads them back with
 * its own ids, and once layer l's misses are enqueued it admits the predicted experts of l + 1
 * that are not resident (never evicting layer l's or l + 2's), copying them while layer l
 * computes. Layer l + 1's experts then wait only for the predicted experts they use that have
 * not landed (the prefetch stream's copies up to the latest of them). */
void expert_cache_predict_next(struct expert_cache *c, const int32_t *pred_dev, int n);

/* Depth-N prediction: pred_dev holds n_depth consecutive blocks of n ids, block j (0-based) the
 * predicted experts of layer l + 1 + j (n_depth <= EXPERT_CACHE_MAX_DEPTH; blocks past the last
 * layer are ignored). The next prepare_copy of layer l reads them back with its own ids and,
 * behind layer l's copies, admits layer l + 1's (as expert_cache_predict_next), then those of
 * l + 2, ... (never evicting layer l's or l + 1's experts). Deeper blocks are dropped while the
 * copies of the previous call's prefetches are still running (they would land too late). */
#define EXPERT_CACHE_MAX_DEPTH 4
void expert_cache_predict_ahead(struct expert_cache *c, const int32_t *pred_dev, int n,
                                int n_depth);

/* Lookahead (copy path): ids (n_layer blocks of n, -1 for none) are experts each layer is
 * expected to use in the next step, known before it starts (the routing a speculative draft's
 * source positions had). Admits those no slot holds, layer by layer, and copies them on the
 * prefetch stream at once, marked as predictions: the layer that uses one waits only for its
 * copy, the statistics count them as prefetches (used, late, wasted). A slot in use in the
 * current call is never taken; otherwise the SLRU's own rules choose victims. No-op with a
 * host tier or once the device runs the cache. The number admitted, or -errno. */
int expert_cache_lookahead(struct expert_cache *c, const int32_t *ids, int n);

/* Deferred prediction (the prefetch worker, prefetch/pf_worker.h). From this call on,
 * expert_cache_prepare_copy leaves the admissions and copies of the predictions it read back
 * pending instead of making them before it returns, for expert_cache_run_pending; every other
 * entry point (but the slot counts, host_ids, cpu_experts and tier_ptrs, which the CPU lane
 * calls) first calls settle(ctx), which returns once a pending job handed to another thread
 * has run (0 or its error), and then runs a job still pending itself. The decisions, copies and
 * statistics are those of the predictions made inside prepare_copy, in the same order; only
 * the host's time moves (after the layer's experts are launched, or to another thread).
 * settle NULL: back to making them inside prepare_copy. */
typedef int (*expert_cache_settle_fn)(void *ctx);
int expert_cache_defer_prefetch(struct expert_cache *c, expert_cache_settle_fn settle, void *ctx);

/* Makes the pending predictions' admissions and copies, if any. The calling thread holds the
 * cache until it returns (the owner's thread stays out: it settles first). 0 or -errno. */
int expert_cache_run_pending(struct expert_cache *c);

/* Whether a prepare_copy left predictions pending. */
bool expert_cache_has_pending(const struct expert_cache *c);

/* The ids of layer's last prepare_copy call (host memory), valid until its next call. */
const int32_t *expert_cache_host_ids(const struct expert_cache *c, int layer);

/* The caller's lane choice for the n_miss misses of one call at `layer` (miss_ids ascending;
 * pair_count[e]: the (token, expert) pairs routed to expert e in the call; each expert's gate +
 * up + down are expert_bytes): to_cpu[i] = 1 when miss i is computed on the CPU, else 0 (it is
 * streamed into a slot). */
typedef void (*expert_cache_split_fn)(void *ctx, int layer, const int32_t *miss_ids, int n_miss,
                                      const int32_t *pair_count, uint64_t expert_bytes,
                                      uint8_t *to_cpu);

/* Hybrid (copy path only): from now on prepare_copy asks split which misses of each call go to
 * the CPU. A miss given to the CPU has its table entries on an all-zero slot for the call, so
 * the GPU kernel's contribution for it is exactly 0, and expert_cache_cpu_experts lists it for
 * the caller to compute on the host and add. Calls with more than max_cpu_tok tokens stream
 * everything. */
int expert_cache_set_hybrid(struct expert_cache *c, expert_cache_split_fn split, void *ctx,
                            int max_cpu_tok);

/* Hybrid: when the PCIe lane got nothing in a call, its first CPU-lane miss is also copied into
 * a slot behind the call's copies, for the layer's next call (a CPU-lane expert is otherwise
 * never cached, and the cache stops learning). */
void expert_cache_set_hybrid_admit(struct expert_cache *c, bool on);

/* Hybrid set: paused (prepare_copy gives nothing to the CPU, as without set_hybrid) or on
 * again. Pausing points every CPU-lane expert's entries back at its slot or host memory, for
 * any fill to read: call it between steps, the compute stream synced. Nothing without
 * set_hybrid. */
void expert_cache_hybrid_pause(struct expert_cache *c, bool pause);

/* The experts the last prepare_copy gave to the CPU lane (ascending ids), and their count. */
int expert_cache_cpu_experts(const struct expert_cache *c, const int32_t **ids);

/* With a host tier: the host addresses of the last prepare_copy's misses in the tier, 3 per
 * expert id (gate, up, down; NULL for experts that were not missed), valid until the next
 * prepare_copy: where the CPU lane reads its experts. NULL without a tier. */
const uint8_t *const *expert_cache_tier_ptrs(const struct expert_cache *c);

/* (b): enqueues the read-back of the layer's ids (no wait) and returns the tables as they are;
 * the accounting happens at expert_cache_step_end. Ids in the layer's slice
 * (expert_cache_zc_ids) are read back with every other layer's by expert_cache_step_flush
 * instead. While recording, the first call of a step uploads every layer's table at once. */
int expert_cache_prepare_zerocopy(struct expert_cache *c, int layer, const int32_t *ids_dev,
                                  int n_pairs, struct expert_tables *t);

/* (c): enqueues the lookup and copy kernels of the layer's call on the compute stream; *t is
 * then valid for the layer's expert kernels. The first call hands the slots to the device
 * (syncs); later ones never sync. Not with a host tier. */
int expert_cache_prepare_device(struct expert_cache *c, int layer, const int32_t *ids_dev,
                                int n_pairs, struct expert_tables *t);

/* expert_cache_prepare_device for one token whose experts are not yet selected: the lookup
 * kernel first selects n_pairs (<= 32) of them from the router's logits (device; at most
 * CUDA_DEVCACHE_SELECT_MAX experts) as the router's top-k would, bit for bit, writing ids_dev
 * and w_dev (n_pairs each, device) for the expert kernels, then looks them up. */
int expert_cache_prepare_device_select(struct expert_cache *c, int layer, const float *logits,
                                       int32_t *ids_dev, float *w_dev, int n_pairs,
                                       struct expert_tables *t);
/* (c): hands the slots to the device now (syncs), e.g. before recording a graph whose first
 * call would otherwise do it. 0 or -errno. */
int expert_cache_device_start(struct expert_cache *c);
/* (c): the device gives the slots back (syncs every stream): the SLRU takes over what they
 * hold, least recently used first and pinned experts pinned, the statistics go on from the
 * device's counts, and the copy and zero-copy paths serve the next calls (a later
 * prepare_device hands the slots over again). Between steps, not while a graph of (c) may
 * still be replayed. 0 (also when the device does not hold them) or -errno. */
int expert_cache_device_stop(struct expert_cache *c);
/* (c), prediction: ids_dev (n_pairs, written on the compute stream) are the experts predicted
 * for `layer`'s next call. Enqueues their admission and then their copies on the prefetch
 * stream; that call waits for the admission, and its lookup for the copies of the predicted
 * experts it uses only (fill_device.c). After the device took over. */
int expert_cache_prefetch_device(struct expert_cache *c, int layer, const int32_t *ids_dev,
                                 int n_pairs);
/* (c) with the CPU lane inside the graph (cuda_lane.h): admit false makes the next lookups
 * give no miss a slot (cuda_devcache_call.no_admit); true (the default) admits again. */
void expert_cache_device_admit(struct expert_cache *c, bool admit);
/* (c): what a layer's lane call needs of the device state, valid while the device holds the
 * slots (after expert_cache_device_start, until a stop); the zero slot is made on the first
 * call. 0 or -errno. */
struct expert_cache_lane_view {
    const int32_t *slot_of;   /* (n_expert) device */
    void **tab;               /* (3 n_expert) device: the layer's table */
    const uint8_t *zero;      /* device: a slot of zeros */
    const uint8_t *mapped[3]; /* expert 0 of each part, mapped host memory */
    uint64_t stride[3];
};
int expert_cache_lane_view(struct expert_cache *c, int layer, struct expert_cache_lane_view *v);
/* (c): expert_cache_prefetch_device for the layer's own misses of the call just made (the CPU
 * lane's, cuda_lane.h), each admitted only where used at least as often as its victim's owner
 * (cuda_devcache_call.gate). 0 or -errno. */
int expert_cache_admit_device(struct expert_cache *c, int layer, const int32_t *ids_dev,
                              int n_pairs);
/* (c): the slots of the layer's list on the device (its pinned ones and its share of the
 * rest), -1 while the host holds the slots or for a bad layer. */
int expert_cache_device_slots(const struct expert_cache *c, int layer);
/* Whether (c) has taken the slots over. */
bool expert_cache_on_device(const struct expert_cache *c);
/* How many times (c) has taken the slots over: a recording of (c)'s calls holds the device
 * state of one hand-over (its arrays are allocated anew at each) and must be made again after
 * another. */
uint32_t expert_cache_device_epoch(const struct expert_cache *c);

#define EXPERT_CACHE_ZC_TOK 16 /* tokens of a call whose routing fits a slice */

/* (b): device memory for `layer`'s routing of n_pairs pairs in a decode step (a slice per
 * layer, so that one read-back serves them all), or NULL when n_pairs does not fit
 * (EXPERT_CACHE_ZC_TOK tokens). */
int32_t *expert_cache_zc_ids(struct expert_cache *c, int layer, int n_pairs);

/* (b): after the step's last layer, on the compute stream: one read-back of every slice (a
 * recorded step records it). expert_cache_step_end reads them synchronously itself when
 * nothing did. (c): the compute stream waits for the step's prefetch copies. 0 or -errno. */
int expert_cache_step_flush(struct expert_cache *c);

/* (b) inside a recorded CUDA graph: while `recording`, prepare_zerocopy uploads each layer's
 * table whether or not it changed (the recording must refresh the tables at every replay, from
 * the pinned host copy that step_end updates between replays). After each replay of such a
 * recording, expert_cache_replayed marks every layer's n_pairs ids as read back, as the
 * recorded step did, so that expert_cache_step_end accounts for them. */
void expert_cache_set_recording(struct expert_cache *c, bool recording);
void expert_cache_replayed(struct expert_cache *c, int n_pairs);

/* (b): call once the compute stream has been synced after a step that used
 * expert_cache_prepare_zerocopy: stats, SLRU updates and admissions for every such layer. */
int expert_cache_step_end(struct expert_cache *c);

/* Progress of a long operation: done of total items. */
typedef void (*expert_cache_progress_fn)(void *ctx, int done, int total);

/* Places experts (layer[i], expert[i]), i < n, into slots before any step runs (a residency
 * profile's set), in order, until the pool is full: copies on the copy stream, then every table
 * switched and uploaded, both streams synced. pin: the placed experts are never evicted
 * (slru_pin). An expert already resident counts as placed. Returns how many were placed
 * (>= 0), or -errno. */
int expert_cache_preload(struct expert_cache *c, const int32_t *layer, const int32_t *expert,
                         int n, bool pin, expert_cache_progress_fn progress, void *ctx);

/* The slot holding (layer, expert), or -1 (no effect on recency or statistics). */
int expert_cache_slot_of(const struct expert_cache *c, int layer, int expert);
/* Checks the slot policy's invariants (no slot lost or held twice, counts, caps; under (c)
 * the device's lists, maps and tables, downloaded): 0 or -EFAULT. For tests. */
int expert_cache_check(const struct expert_cache *c);

/* Zeroes every statistic (after a restore or a check that should not count). */
void expert_cache_reset_stats(struct expert_cache *c);

const struct expert_cache_layer_stats *expert_cache_stats(const struct expert_cache *c, int layer);

/* Prints the per-layer table and totals (text), or writes them as JSON. */
void expert_cache_print_stats(const struct expert_cache *c, FILE *f);
int expert_cache_write_stats_json(const struct expert_cache *c, const char *path);

#endif
