/* moe_layer: the owner of the MoE layer. One call per layer and step (moe_layer_run) routes the
 * tokens through the backend's router primitive and decides, per expert, where it runs:
 *   resident     its weights were uploaded at open (no budget; static placement's GPU layers)
 *   slot hit     it is in a VRAM slot of the expert cache (residency/expert_cache.h)
 *   copied miss  streamed into a slot before the layer's experts run (copy path)
 *   zero-copy    read in place from pinned host memory by the expert kernel (zerocopy path)
 *   GPU-copied   looked up and copied into a slot by kernels, no host in the loop (device path)
 *   CPU lane     computed on the host from host memory and added: the misses the lane model
 *                (lane.h) gives the CPU (hybrid), every expert of layers [0, N) (static
 *                placement), every expert on a host device (the CPU backend)
 * The next layer's experts are predicted ahead (prefetch/predict.h) when asked. Backends supply
 * primitives (struct moe_device_ops) and never branch on placement; the placement is chosen here
 * from struct moe_layer_config at open.
 *
 * Threads: one, the backend's caller. Device work is enqueued on the backend's stream by the
 * primitives; the expert cache has its own copy stream (see its header). The CPU lane runs its
 * OpenMP team inside moe_layer_run, while the GPU computes the layer's other experts.
 */
#ifndef STRATA_MOE_LAYER_H
#define STRATA_MOE_LAYER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct model;
struct model_hparams;
struct weight;
struct layer_weights;
struct cuda_lane_call;

/* One call of the grouped expert kernel: out (n_tok, n_embd) = sum over each token's k
 * experts of w * expert(in). Expert e's gate/up/down are read at gate[e]/up[e]/down[e] of the
 * device pointer tables when they are given, else in the layer's stacked weights (resident). */
struct moe_expert_call {
    float *out;                      /* (n_tok, n_embd) device, written */
    const float *in;                 /* (n_tok, n_embd) device */
    int n_tok, layer;
    const int32_t *ids;              /* (n_tok, k) device */
    const float *w;                  /* (n_tok, k) device */
    /* NULL, or the router logits route_logits left: the call selects the experts from them as
     * route would and writes them to select_ids / select_w ((n_tok, k) device), which ids and
     * w then point to */
    const float *logits;
    int32_t *select_ids;
    float *select_w;
    const struct layer_weights *lw;
    const void *const *gate, *const *up, *const *down; /* (n_expert) device tables, or NULL */
};

/* What a backend gives the MoE layer. dev is the backend. Enqueued work runs in order on the
 * backend's stream; sync waits for it. */
struct moe_device_ops {
    bool host; /* device memory is host memory: nothing is staged through host buffers */
    /* n bytes of device memory counted against the backend's budget; NULL on failure */
    void *(*alloc)(void *dev, size_t bytes);
    void (*free)(void *dev, void *p);
    /* ids, w (n_tok, k) = softmax top-k (renormalised) of the layer's router (plus its bias,
     * when it has one) applied to in (n_tok rows); the renormalised softmax of the top k equals
     * gpt-oss's softmax over the k selected logits */
    int (*route)(void *dev, const struct layer_weights *lw, const float *in, int n_tok,
                 int32_t *ids, float *w);
    /* Optional (NULL: route): route's router product alone, *logits its output on the device;
     * the experts call given them (moe_expert_call.logits) selects the experts and writes ids
     * and w, fewer launches where it selects inside its own kernels. */
    int (*route_logits)(void *dev, const struct layer_weights *lw, const float *in, int n_tok,
                        const float **logits);
    /* Optional (NULL: route twice): route for lw and lw2 on the same input, ids, w (2 n_tok,
     * k), lw's rows first; each as route would make it, bit for bit, in fewer launches (the
     * next layer's experts predicted with this layer's routing). */
    int (*route2)(void *dev, const struct layer_weights *lw, const struct layer_weights *lw2,
                  const float *in, int n_tok, int32_t *ids, float *w);
    int (*experts)(void *dev, const struct moe_expert_call *call);
    /* enqueued on the device's stream: done when the caller (or the expert cache) syncs it */
    int (*to_host)(void *dev, void *host, const void *src, size_t bytes);
    /* Page-locked host memory to_host lands in without waiting for the stream at the call
     * (pageable memory makes each such copy wait for it); NULL: malloc / free. */
    void *(*host_alloc)(void *dev, size_t bytes);
    void (*host_free)(void *dev, void *p);
    /* the source may be reused once the call returns */
    int (*to_device)(void *dev, void *dst, const void *host, size_t bytes);
    int (*add)(void *dev, float *x, const float *y, size_t n); /* x (n) += y (n) */
    int (*sync)(void *dev);
    /* Makes a stacked expert tensor resident (device copy in w->dev). Not called on host
     * devices. */
    int (*upload)(void *dev, const struct weight *w);
    /* Device bytes the backend holds now: uploaded weights, and everything else. */
    void (*held)(void *dev, uint64_t *weights, uint64_t *other);
    /* Measured host-to-device bytes/s (the PCIe lane of hybrid). */
    double (*h2d_bandwidth)(void *dev);
    /* Optional (NULL: no CPU lane inside a decode graph): page-locked host memory the device
     * reads and writes in place, *dev_ptr its device address; and the lane's post (join
     * false) or join on the device's stream, a->seq set to the step's number the backend
     * keeps (cuda_lane.h). */
    void *(*mapped_alloc)(void *dev, size_t bytes, void **dev_ptr);
    int (*lane)(void *dev, struct cuda_lane_call *a, bool join);
};

enum moe_fill {
    MOE_FILL_COPY = 0,     /* misses copied into slots before the layer runs (one sync/layer) */
    MOE_FILL_ZEROCOPY = 1, /* misses read in place; admitted between steps */
    MOE_FILL_DEVICE = 2,   /* the GPU looks up and copies misses itself (every call size) */
};

/* What the router chose for a batch of tokens at one layer (for statistics tools). */
struct moe_route_event {
    int layer, n_tok, k;
    int pos0;             /* stream position of token 0 */
    const int32_t *ids;   /* (n_tok, k) selected experts, host memory */
    const float *weights; /* (n_tok, k) their renormalised router weights */
    const float *in;      /* (n_tok, n_embd) the layer's MoE input (ffn-normed hidden);
                           * NULL on a device whose memory is not host memory */
};
typedef void (*moe_route_observer_fn)(void *ctx, const struct moe_route_event *ev);

struct disk_tier;

/* Decode calls of a layer without a miss or a used prefetch after which it is no longer
 * predicted (until it misses again). */
#define MOE_PREFETCH_QUIET 8

struct moe_layer_config {
    int max_tok;          /* tokens per call of the primitives; larger calls are split */
    int device;           /* the CUDA device of the primitives (the prefetch worker's thread) */
    /* A host device: NULL, or the host tier the CPU lane reads its experts from (owned by the
     * caller; the layer asks it for each call's experts). */
    struct disk_tier *tier;
    bool tier_ahead;      /* with tier: read layer l + 1's predicted experts (its router on layer
                           * l's input) while layer l computes */
    /* Static placement (llama.cpp's --n-cpu-moe N): the experts of layers [0, N) run on the
     * CPU lane, the others are resident. -1: the smallest N whose resident experts fit
     * vram_budget. On a host device every layer's experts run on the CPU lane. */
    int cpu_layers;
    bool cache;           /* experts stay in host memory, served by the expert cache */
    uint64_t vram_budget; /* bytes the backend may hold; 0 = no cap */
    int expert_slots;     /* > 0: exactly this many slots (tests), instead of the budget's */
    uint64_t stream_bytes; /* what the streams opened next will hold (KV caches, activations,
                            * the lockstep batch) */
    int n_streams, n_ctx;  /* how many streams of how many positions stream_bytes counts */
    uint64_t stream_one;   /* the bytes of one of them (its share of stream_bytes) */
    enum moe_fill fill;   /* for decode-sized calls; prefill copies */
    bool prefetch;        /* copy path: layer l + 1's experts predicted and streamed ahead
                           * (decode: only while layer l + 1 misses: MOE_PREFETCH_QUIET);
                           * the GPU's own cache: predicted, admitted and copied on the device
                           * at every call */
    int prefetch_depth;   /* with prefetch: layers l + 1 .. l + depth (1..4; 0 = 1) */
    int prefetch_top;     /* with prefetch: each token's first M predicted experts only (largest
                           * router weight first); 0 = the first half of k */
    bool hybrid;          /* each call's misses split between streaming and the CPU lane;
                           * with fill MOE_FILL_DEVICE: in recorded one-token steps no miss
                           * takes a slot and the CPU lane computes every miss inside the
                           * graph (cuda_lane.h) */
    bool modes;           /* with cache, without prefetch: the CPU lane opened as for hybrid,
                           * and moe_layer_set_mode switches between copy, zero-copy and hybrid
                           * (the automatic placement); the layer starts in `fill`, not
                           * hybrid */
    bool hybrid_no_admit; /* hybrid: a CPU-lane miss is never also copied into a slot */
    double lane_pcie_bps, lane_cpu_bps; /* hybrid: both > 0 set the lane model (no CPU cost
                                         * per pair) instead of measuring it at open, for a
                                         * split that does not depend on the machine */
    bool gather;          /* misses streamed by one gather kernel per batch */
    uint64_t pin_chunk;   /* host registration piece (expert_cache_config), 0 = default */
    void *stream;         /* the backend's stream (cudaStream_t) for the expert cache */
    moe_route_observer_fn observer; /* called after each routing (on a device: after a
                                     * read-back and sync) */
    void *observer_ctx;
    FILE *log;            /* set-up reports, NULL = quiet */
};

/* The MoE FFN of one layer for a batch of tokens of one stream. */
struct moe_args {
    float *out;                       /* (n_tok, n_embd): written (not accumulated) */
    const float *in;                  /* (n_tok, n_embd): the ffn-normed hidden states */
    int n_tok;
    int pos0;                         /* stream position of token 0 */
    int layer;
    const struct layer_weights *lw;   /* router and stacked experts of this layer */
    const struct model_hparams *hp;
};

struct moe_layer;

/* Opens the MoE layer of model m on a backend: allocates its routing buffers (counted by the
 * backend), uploads the experts that are resident under the placement, and opens the expert
 * cache and the CPU lane when the placement uses them. 0 or -errno (message set). */
int moe_layer_open(const struct model *m, const struct moe_layer_config *cfg,
                   const struct moe_device_ops *ops, void *dev, struct moe_layer **out);
void moe_layer_close(struct moe_layer *ml);

/* The MoE FFN of one layer for a->n_tok tokens: routing, plan, dispatch to tiers and lanes,
 * combine into a->out. 0 or -errno. */
int moe_layer_run(struct moe_layer *ml, const struct moe_args *a);

/* At the end of a step's work on the backend's stream (recorded with it): the zero-copy path's
 * one read-back of the step's routing. */
int moe_layer_step_flush(struct moe_layer *ml);
/* Between steps, once the backend's stream has been synced: the cache's accounting and
 * admissions of the zero-copy path. */
int moe_layer_step_end(struct moe_layer *ml);
/* Before a step is recorded into a CUDA graph: what must not happen during the recording (the
 * GPU's own cache takes the slots over, a sync). 0 or -errno. */
int moe_layer_graph_ready(struct moe_layer *ml);
/* Changes whenever a recording of the GPU's own cache's calls has gone stale (the device took
 * the slots over again: a prompt served by the host path in between); 0 without a cache. */
uint32_t moe_layer_graph_epoch(const struct moe_layer *ml);
/* A decode step is being recorded into a CUDA graph (on) or no longer (off). */
void moe_layer_set_recording(struct moe_layer *ml, bool on);
/* A recorded step was replayed: every layer's routing was read back as recorded. */
void moe_layer_replayed(struct moe_layer *ml);
/* The CPU lane inside a decode graph (--residency gpu --placement hybrid): whether it is on,
 * and, after each launch of a recorded one-token step numbered seq, the host's side of it:
 * every recorded layer's CPU experts computed as the device posts them (returns when the last
 * layer is served). 0 or -errno (the remaining layers are then released with nothing added). */
bool moe_layer_lane_on(const struct moe_layer *ml);
int moe_layer_lane_serve(struct moe_layer *ml, uint32_t seq);
/* Whether a step runs without host syncs (so it may be recorded into a graph): no CPU lane,
 * and no cache or a zero-copy cache without prediction. */
bool moe_layer_graph_safe(const struct moe_layer *ml);

/* How the expert cache serves decode's misses (struct moe_layer_config.modes). */
enum moe_mode {
    MOE_MODE_COPY = 0,     /* copied into slots */
    MOE_MODE_ZEROCOPY = 1, /* read in place, admitted between steps */
    MOE_MODE_HYBRID = 2,   /* split between copies and the CPU lane */
    MOE_MODE_DEVICE = 3,   /* the GPU's own cache: looked up and copied by the device */
    MOE_MODE_LANE = 4,     /* the GPU's own cache, its misses computed by the CPU lane inside
                            * the decode graph (cuda_lane.h) */
};
#define MOE_MODES 5
/* Between steps, the backend's stream synced: serve misses the new way from the next call on
 * (leaving MOE_MODE_DEVICE, the device gives the slots back first). 0, or -ENOTSUP (no cache,
 * opened without modes, or zero-copy or the GPU's cache with a host tier). */
int moe_layer_set_mode(struct moe_layer *ml, enum moe_mode mode);
enum moe_mode moe_layer_mode(const struct moe_layer *ml);
/* Whether the mode can be set (opened with modes; zero-copy and the GPU's cache need no host
 * tier). */
bool moe_layer_mode_ok(const struct moe_layer *ml, enum moe_mode mode);
/* Seconds one missed expert's copy takes at the H2D bandwidth measured at open (with modes or
 * hybrid; 0 otherwise). */
double moe_layer_miss_seconds(const struct moe_layer *ml);

/* Device memory the expert cache holds (slots, tables); 0 without one. */
uint64_t moe_layer_vram_bytes(const struct moe_layer *ml);
/* Gives back expert slots until `bytes` are free: the number given up (0: none left), or
 * -errno. */
int moe_layer_shrink(struct moe_layer *ml, uint64_t bytes);
int moe_layer_slots(const struct moe_layer *ml); /* expert slots, 0 without a cache */
/* Places a residency profile's experts into slots before the first step (expert_cache_preload):
 * how many were placed, or -errno (-ENOTSUP without a cache). */
int moe_layer_preload(struct moe_layer *ml, const int32_t *layer, const int32_t *expert, int n,
                      bool pin, void (*progress)(void *ctx, int done, int total), void *ctx);
/* Zeroes the cache's statistics (nothing without a cache). */
void moe_layer_reset_stats(struct moe_layer *ml);

/* Statistics: the cache's per-layer table (text) or JSON (0 and nothing without a cache). */
int moe_layer_print_stats(const struct moe_layer *ml, FILE *f);
int moe_layer_write_stats_json(const struct moe_layer *ml, const char *path);

struct moe_cache_totals {
    uint64_t hits, misses, evictions, bytes_copied, bytes_zerocopy;
    uint64_t cpu_computed; /* misses the hybrid CPU lane computed */
    uint64_t cpu_admitted; /* of those, also copied into a slot behind their call */
    uint64_t prefetched, prefetch_used, prefetch_late, prefetch_wasted; /* expert_cache.h's */
    uint64_t predictions; /* layer calls that predicted the next layer's experts */
    uint64_t worker_jobs; /* of their admissions and copies, those the worker's thread made */
    uint64_t lookaheads, lookahead_admitted; /* moe_layer_lookahead calls, experts admitted */
    int slots;
};
/* The cache's totals over all layers so far; -ENOENT without a cache. */
int moe_layer_cache_totals(const struct moe_layer *ml, struct moe_cache_totals *t);
/* Wall seconds the CPU lane has spent computing experts since open. */
double moe_layer_cpu_seconds(const struct moe_layer *ml);
/* The hybrid lanes' rates, bytes/s: PCIe and the CPU as measured at open, and the CPU's as
 * its calls ran (0 before any; 0 for all three without a hybrid lane). */
void moe_layer_lane_rates(const struct moe_layer *ml, double *pcie_bps, double *cpu_bps_open,
                          double *cpu_bps);
/* Layers whose experts run on the CPU lane (static placement), 0 when none. */
int moe_layer_cpu_layers(const struct moe_layer *ml);

/* The routing log of the next forward's calls (rows: one entry per row of the forward, in
 * order; n = 0 ends it): where the routing reaches host memory (the host backend, the copy and
 * hybrid paths), row r's k choices at layer l are written to rows[r][l k ..]; rows with a NULL
 * entry are skipped. Elsewhere (all resident, zero-copy, the GPU's own cache) nothing is
 * written: the caller fills its log with -1 first. */
void moe_layer_set_log(struct moe_layer *ml, int32_t *const *rows, int n);

/* Lookahead for the next step (expert_cache_lookahead): ids, n_layer blocks of n (-1: none),
 * the experts each layer is expected to use. The copy placement admits and copies the ones not
 * resident at once; others (hybrid included) ignore it. The number admitted, or -errno. */
int moe_layer_lookahead(struct moe_layer *ml, const int32_t *ids, int n);

#endif
