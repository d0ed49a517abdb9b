/* backend: an executor of the op table. Each architecture's forward (runtime/arch/) is written
 * once as a sequence of these calls. The CPU backend executes each op at once; the CUDA backend
 * enqueues kernels on a stream, so a whole decode step can be captured in a graph.
 *
 * Activation pointers (float *) live in the backend's memory (host for cpu, device for cuda)
 * and come from backend->ops->alloc; pointer arithmetic on them is allowed (row offsets).
 * Shapes are written (rows, cols) with cols contiguous.
 */
#ifndef STRATA_BACKEND_H
#define STRATA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "model.h"
#include "moe_layer.h"

struct backend;
struct stream;

struct attn_args {
    float *out;           /* (n_tok, n_head*head_dim) */
    const float *q;       /* (n_tok, n_head*head_dim), already normed and rotated */
    const float *k_cache; /* (n_ctx, n_head_kv*head_dim) of this layer, rows < pos0+n_tok valid */
    const float *v_cache; /* (n_ctx, n_head_kv*head_dim) */
    int pos0;             /* position of the first query token */
    int n_tok;
    int n_head, n_head_kv, head_dim;
    float scale;          /* 1/sqrt(head_dim) */
    const struct weight *sinks; /* (n_head) F32, or NULL: per-head sink logits added to the
                                 * softmax's denominator (gpt-oss) */
    int window;           /* > 0: a query sees only the last `window` positions (itself
                           * included); 0: every earlier one */
};

/* The attention prologue of a layer with per-head q/k norms (struct backend_ops.qk_rope_store):
 * q and k normed per head and rotated (NEOX RoPE) in place, k and v stored to the cache rows
 * pos0 .. pos0 + n_tok - 1. */
struct qk_rope_args {
    float *q, *k;   /* (n_tok, n_head*head_dim), (n_tok, n_head_kv*head_dim) */
    const float *v; /* (n_tok, n_head_kv*head_dim) */
    const struct weight *q_norm, *k_norm; /* (head_dim) F32, or NULL: no norm of those heads */
    float eps, rope_base;
    int pos0, n_tok, n_head, n_head_kv, head_dim;
    float *k_cache, *v_cache; /* (n_ctx, n_head_kv*head_dim) of this layer */
    const struct rope_yarn *yarn; /* NULL: plain rope at rope_base; else YaRN (rope_yarn) */
};

/* YaRN-scaled NEOX RoPE (struct backend_ops.rope_yarn): ops_rope_yarn_freq's parameters. */
struct rope_yarn {
    float base, factor;        /* rope.freq_base, rope.scaling.factor */
    uint32_t n_ctx_orig;       /* rope.scaling.original_context_length */
    float beta_fast, beta_slow;
    bool truncate;             /* the correction range rounded outward */
};

/* Attention of lockstep rows (struct backend_ops.attention_rows): row i is the next token of
 * the i-th stream given to rows_begin, at that stream's position. */
struct attn_rows_args {
    float *out;     /* (n, n_head*head_dim) */
    float *q, *k;   /* (n, n_head*head_dim), (n, n_head_kv*head_dim): normed, rotated here */
    const float *v; /* (n, n_head_kv*head_dim) */
    int layer, n;
    int n_head, n_head_kv, head_dim;
    float scale;     /* 1/sqrt(head_dim) */
    float rope_base; /* rope.freq_base */
    const struct weight *q_norm, *k_norm; /* NULL, or (head_dim) F32: q's and k's heads are
                                           * RMS-normed with them (rms_eps) before rotating */
    float rms_eps;
};

/* The core of a Gated DeltaNet layer (struct backend_ops.gdn) on n_tok consecutive tokens of
 * one stream: conv + SiLU of the qkv projections (in place), then the gated delta rule and the
 * gated norm (cpu_kernels/ops_ssm.h) into out. */
struct gdn_args {
    float *out;         /* (n_tok, V) */
    float *qkv;         /* (n_tok, C): projections in, conv'd out */
    const float *z;     /* (n_tok, V) */
    const float *b, *a; /* beta / alpha logits, rows ba_stride apart */
    int ba_stride;
    bool ba_grouped; /* qwen3next's grouped ssm_ba (ops_ssm.h) */
    const struct layer_weights *lw;
    float *conv_state; /* (d_conv - 1, C) of this layer and stream */
    float *ssm_state;  /* (n_v, d_state, d_state) */
    int n_tok;
    /* the rows are one stream's evaluation (stream_eval: a prompt, or the replay after a
     * rewind), where the backend may sum in another order than token after token (a chunked
     * form); else they are rows of a lockstep step (a speculative verify pass), and n_tok rows
     * must give what n_tok calls of one row give, bit for bit */
    bool chunk_ok;
};

struct backend_ops {
    const char *name;
    /* Activation memory: n floats, 64-byte aligned, NULL on failure (err_msg says why). */
    float *(*alloc)(struct backend *b, size_t n);
    void (*free)(struct backend *b, float *p);
    /* out (n, n_embd) = rows ids[0..n) of the embedding table (any supported type). */
    int (*embed)(struct backend *b, float *out, const struct weight *w, const int32_t *ids, int n);
    /* out (rows, dim) = in / rms(in) * w ; w (dim) F32. out may equal in. */
    int (*rmsnorm)(struct backend *b, float *out, const float *in, const struct weight *w,
                   int rows, int dim, float eps);
    /* out (m, w->ne[1]) = in (m, w->ne[0]) x W^T. */
    int (*matmul)(struct backend *b, float *out, const struct weight *w, const float *in, int m);
    /* Optional (NULL: one matmul each): out[i] = in x W_i^T for n (2 or 3) weights with the same
     * ne[0], with matmul's results (q, k and v of a layer). */
    int (*matmul_n)(struct backend *b, int n, float *const *out, const struct weight *const *w,
                    const float *in, int m);
    /* Optional (NULL: matmul or matmul_n, then add_bias): out[i] = in x W_i^T + bias[i] for n
     * (1 to 3) weights with the same ne[0], each bias (F32, W_i's ne[1]) added as add_bias
     * adds it, so with the same results. */
    int (*matmul_bias_n)(struct backend *b, int n, float *const *out, const struct weight *const *w,
                         const struct weight *const *bias, const float *in, int m);
    /* NEOX RoPE in place on x (n_tok, n_heads*head_dim); token t is at position pos0 + t. */
    int (*rope)(struct backend *b, float *x, int n_tok, int n_heads, int head_dim, int pos0,
                float base);
    /* dst rows [pos0, pos0+n_tok) of a (n_ctx, width) cache = src (n_tok, width). */
    int (*kv_store)(struct backend *b, float *cache, const float *src, int pos0, int n_tok,
                    int width);
    /* Optional (NULL: the forward runs the ops one by one): rmsnorm of q's and k's heads,
     * rope of both, kv_store of k and v, with their results. */
    int (*qk_rope_store)(struct backend *b, const struct qk_rope_args *a);
    /* Optional (NULL: the backend has no YaRN): rope with YaRN's frequencies and attention
     * factor. */
    int (*rope_yarn)(struct backend *b, float *x, int n_tok, int n_heads, int head_dim,
                     int pos0, const struct rope_yarn *y);
    /* Optional (NULL: no biases): x (rows, bias->ne[0]) += bias (F32) on every row. */
    int (*add_bias)(struct backend *b, float *x, const struct weight *bias, int rows);
    /* Optional, all or none (NULL: no hybrid Gated DeltaNet models): NEOX rope of the first
     * n_rot dims of each head; q, gate (rows, hd) = the halves of each row of qg (rows, 2 hd);
     * x (n) *= sigmoid(gate (n)); out (n, n_embd) += the shared expert of in (n, n_embd):
     * sigmoid(shexp_gate_inp . in) * down(silu(gate in) * up in); the Gated DeltaNet core. */
    int (*rope_partial)(struct backend *b, float *x, int n_tok, int n_heads, int head_dim,
                        int n_rot, int pos0, float base);
    int (*split_halves)(struct backend *b, float *q, float *gate, const float *qg, int rows,
                        int hd);
    int (*mul_sigmoid)(struct backend *b, float *x, const float *gate, size_t n);
    int (*shared_expert)(struct backend *b, float *out, const float *in,
                         const struct layer_weights *lw, int n);
    int (*gdn)(struct backend *b, const struct gdn_args *a);
    /* Whether attention honours attn_args' sinks and window (else it refuses them). */
    bool attn_sinks_window;
    /* Causal GQA attention over the cache. */
    int (*attention)(struct backend *b, const struct attn_args *a);
    /* Optional, both or neither (NULL: the forward runs rope, kv_store and attention row by
     * row). rows_begin: the n rows of the lockstep step about to run (row i = a token of
     * stream ss[i] at position pos[i], inside its cache; a stream's rows at consecutive
     * positions in row order); attention_rows: for one layer of that step, what the q/k norms
     * (when given), rope (q and k), kv_store (k and v) and attention do for each row in its own stream, in row order,
     * with the same result. rows_begin may also run the whole step itself (a graph recorded
     * for `batch`, the lockstep batch's activations (alloc'd, so freeing them drops the graph),
     * and this many rows;
     * ids are the rows' tokens): 1 then, and the caller skips the forward; 0: the caller runs
     * it (which the backend may be recording; step_end finishes it), or -errno. */
    int (*rows_begin)(struct backend *b, const void *batch, struct stream *const *ss,
                      const int *pos, const int32_t *ids, int n);
    int (*attention_rows)(struct backend *b, const struct attn_rows_args *a);
    /* Optional (NULL: models with a recurrent state cannot run): p (n) = 0. */
    int (*zero)(struct backend *b, float *p, size_t n);
    /* Optional (NULL: a rewind of a recurrent state starts over): dst (n) = src (n), both
     * backend memory, not overlapping. */
    int (*copy)(struct backend *b, float *dst, const float *src, size_t n);
    /* x (n) += y (n). */
    int (*add)(struct backend *b, float *x, const float *y, size_t n);
    /* Optional (NULL: the caller runs add, then rmsnorm): x (rows, dim) += y, then out = x /
     * rms(x) * w, with the same result as those two ops; out must not overlap x or y. */
    int (*add_rmsnorm)(struct backend *b, float *x, const float *y, float *out,
                       const struct weight *w, int rows, int dim, float eps);
    /* The MoE FFN of one layer: every backend hands it to its moe_layer (moe/moe_layer.h). */
    int (*moe_ffn)(struct backend *b, const struct moe_args *a);
    /* Copies n floats of backend memory to the host. */
    int (*read)(struct backend *b, float *host, const float *src, size_t n);
    /* Optional (NULL: every forward runs op by op). Around the forward of n tokens at position
     * pos of stream s: step_begin returns 1 when the backend ran a recorded step itself (the
     * caller skips the forward), 0 when the caller runs the forward (which the backend may be
     * recording), or -errno; step_end(rc) follows a forward the caller ran, with its result,
     * and finishes (and runs) a recording. */
    int (*step_begin)(struct backend *b, const struct stream *s, const int32_t *ids, int n,
                      int pos);
    int (*step_end)(struct backend *b, int rc);
    /* Optional: *out = the index of the largest of n floats of backend memory (ties to the
     * lowest), computed where they are: only the index comes back. NULL: the caller reads the
     * floats and takes it itself. */
    int (*read_argmax)(struct backend *b, const float *x, int n, int32_t *out);
    /* Optional: a stream is about to evaluate n tokens (stream_eval). A backend that picks a
     * setting by timing decode steps (runtime/tune.h) keeps its clock here: between two
     * one-token calls lies one decode step, sampling included. */
    void (*eval_begin)(struct backend *b, int n);
    /* Optional: experts each layer is expected to use in the next step (moe_layer_lookahead:
     * n_layer blocks of n ids, -1 for none). The number admitted, or -errno. NULL (the CPU
     * backend, every expert in host memory): generation keeps no routing log for it. */
    int (*lookahead)(struct backend *b, const int32_t *ids, int n);
    void (*close)(struct backend *b);
};

struct backend {
    const struct backend_ops *ops;
    const struct model *model;
    void *impl; /* the backend's own state */
    /* the routing log of the forward under way, set around it by the stream (stream.h): one
     * entry per row of the forward (NULL: that row is not logged), handed to the MoE layer
     * (moe_layer_set_log) by calls of all n_route_rows rows */
    int32_t *const *route_rows;
    int n_route_rows;
};

struct backend_cpu_config {
    int n_threads; /* 0 = OpenMP's default; with 6 or more processors and OMP_NUM_THREADS
                    * unset, the fastest of all, 3/4 and 1/2 of them, timed on the first
                    * decode steps (runtime/tune.h) */
    /* > 0: the routed experts are read from the file into a host tier of this many bytes
     * (residency/disk_tier.h) instead of from the mapping; tier_pread: never io_uring;
     * tier_buffered: never O_DIRECT */
    uint64_t host_budget;
    bool tier_pread, tier_buffered, tier_ahead;
    FILE *log;
    /* Called after each layer's routing, on the calling thread; NULL for none. */
    moe_route_observer_fn route_observer;
    void *route_ctx;
};

/* Creates the CPU backend for model m. 0 or -errno. */
int backend_cpu_open(const struct model *m, const struct backend_cpu_config *cfg,
                     struct backend **out);
struct disk_tier_stats;
/* The host tier's counters: false when the backend has none. */
bool backend_cpu_tier_stats(const struct backend *b, struct disk_tier_stats *out);

/* How misses of the expert cache are served (residency/expert_cache.h). */
enum backend_residency {
    BACKEND_RESIDENCY_COPY = 0,     /* (a) copied into slots before the layer runs */
    BACKEND_RESIDENCY_ZEROCOPY = 1, /* (b) read in place; admitted between tokens */
    BACKEND_RESIDENCY_GPU = 2,      /* (c) looked up and copied by the GPU, every call size */
};

struct backend_cuda_config {
    int device;           /* CUDA device index */
    uint64_t vram_budget; /* bytes of device memory strata may allocate; 0 = no cap, every
                           * weight resident (unless expert_slots is set) */
    int n_ctx, max_tok;   /* the stream the caller opens next (its KV cache and activations
                           * count against the budget); 0 = 4096 and 512 */
    int n_streams;        /* that many such streams, and a lockstep batch of as many rows;
                           * 0 = 1 */
    int expert_slots;     /* > 0: exactly this many expert slots (tests), experts in host
                           * memory; overrides the budget's count */
    enum backend_residency residency; /* for decode-sized calls; prefill always copies */
    bool graph;           /* record one-token decode steps in a CUDA graph and replay them:
                           * all resident, or under the cache with residency zerocopy (b) or
                           * gpu (c);
                           * ignored with the copy path, prefetch or a CPU lane (they sync) */
    bool graph_resident;  /* the same where no expert cache was made (every weight resident) */
    bool gather_copies;   /* stream misses with one gather kernel per batch (reading mapped
                           * host memory) instead of a cudaMemcpyAsync per piece */
    bool prefetch;        /* copy path: predict layer l+1's experts with its router applied to
                           * layer l's input and stream them while layer l computes */
    int prefetch_depth;   /* with prefetch: also layers l+2 .. l+depth (1..4; 0 = 1) */
    int prefetch_top;     /* with prefetch: each token's first M predicted experts only (largest
                           * router weight first); 0 = the first half of k */
    bool hybrid;          /* with vram_budget: each layer's cache misses split between
                           * streaming and the CPU lane by moe/lane.h's cost model (bandwidths
                           * measured at open) */
    bool hybrid_no_admit; /* hybrid: never also copy a CPU-lane miss into a slot when the
                           * PCIe lane is idle (for comparison; admission is the default) */
    double lane_pcie_bps, lane_cpu_bps; /* hybrid: both > 0 set its lanes' bandwidths instead
                                         * of measuring them (tests: a fixed split) */
    bool auto_place;      /* with the expert cache (not hybrid, not prefetch): its misses
                           * served by copies, zero-copy reads (in a graph) or copies and the
                           * CPU lane, whichever decodes fastest, timed on the first decode
                           * steps; residency is the mode timed first */
    bool auto_try_all;    /* auto_place: every mode timed, none ruled out by the first trial's
                           * miss rate (tests) */
    int cpu_moe_layers;   /* static placement (llama.cpp's --n-cpu-moe N): the experts of
                           * layers [0, N) stay in host memory and run on the CPU, the others
                           * are resident; no expert cache. -1: the smallest N whose resident
                           * experts fit vram_budget. 0: off */
    uint64_t pin_chunk;   /* host experts are registered in pieces of this many bytes; 0 =
                           * 1 GiB (tests use small pieces so experts straddle them) */
    /* static placement only: > 0 reads the CPU layers' experts from the file into a host tier
     * of this many bytes (residency/disk_tier.h), as backend_cpu_config's host_budget */
    uint64_t host_budget;
    bool tier_pread, tier_buffered, tier_ahead;
    FILE *log;            /* set-up reports (host path, slots, shrinking), NULL = quiet */
    /* Called after each layer's routing with the ids read back to the host (a sync per layer;
     * no graph); NULL for none. */
    moe_route_observer_fn route_observer;
    void *route_ctx;
};

/* Creates the CUDA backend: uploads every weight of m to the device (recording the device
 * copies in the weights' dev fields until close). 0, -ENODEV (no device, or a build without
 * CUDA), -ENOMEM (the weights do not fit: the message says how far it got), -ENOTSUP. */
int backend_cuda_open(struct model *m, const struct backend_cuda_config *cfg,
                      struct backend **out);

/* Device memory the CUDA backend holds: weights, scratch and everything alloc handed out. */
size_t backend_cuda_vram_bytes(const struct backend *b);

/* The expert cache's per-layer table (text, --stats) or JSON (--stats-json); 0 when the
 * backend runs without one (all resident: nothing printed), -errno on a write error. */
int backend_cuda_print_stats(const struct backend *b, FILE *f);
int backend_cuda_write_stats_json(const struct backend *b, const char *path);

/* The expert cache's totals over all layers so far; -ENOENT when there is no cache. */
int backend_cuda_cache_totals(const struct backend *b, struct moe_cache_totals *t);

/* Whether one-token decode steps are replayed from a CUDA graph (--graph, all resident). */
bool backend_cuda_graph(const struct backend *b);

/* The automatic placement held (hold: in copy mode, nothing timed, until released: the
 * profile probe's greedy steps run on GPU kernels only) or released (back to the mode it
 * held, timing on). 0 or -errno; nothing without the automatic placement. */
int backend_cuda_auto_hold(struct backend *b, bool hold);

/* How the experts are placed now: "resident", "static", "copy", "zero-copy" (with a graph:
 * "zero-copy graph") or "hybrid". */
const char *backend_cuda_placement(const struct backend *b);
/* Whether the automatic placement is still timing its modes. */
bool backend_cuda_auto_timing(const struct backend *b);

/* The host tier's counters (static placement with host_budget): false when there is none. */
bool backend_cuda_tier_stats(const struct backend *b, struct disk_tier_stats *out);

/* Wall seconds the CPU lane has spent computing experts (static placement and hybrid), since
 * the backend opened: its busy time. */
double backend_cuda_cpu_lane_seconds(const struct backend *b);
/* moe_layer_lane_rates of the backend's MoE layer. */
void backend_cuda_lane_rates(const struct backend *b, double *pcie_bps, double *cpu_bps_open,
                             double *cpu_bps);

/* Layers whose experts run on the CPU (static placement), 0 when none. */
int backend_cuda_cpu_moe_layers(const struct backend *b);

/* A residency profile's experts placed into the expert cache's slots (moe_layer_preload): how
 * many were placed, or -errno (-ENOTSUP without a cache). */
int backend_cuda_restore(struct backend *b, const int32_t *layer, const int32_t *expert, int n,
                         bool pin, void (*progress)(void *ctx, int done, int total), void *ctx);
/* Zeroes the expert cache's statistics. */
void backend_cuda_reset_stats(struct backend *b);

static inline void backend_close(struct backend *b)
{
    if (b)
        b->ops->close(b);
}

#endif
