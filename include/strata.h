/* strata.h: the public C API. Open a model on a device with one config struct, create streams,
 * evaluate tokens, sample, generate, read statistics, close.
 *
 *     struct strata_config cfg;
 *     strata_config_init(&cfg);                 // defaults: CPU, every expert resident
 *     cfg.model_path = "model.gguf";
 *     struct strata *s;
 *     if (strata_open(&cfg, &s)) { fprintf(stderr, "%s\n", strata_error()); ... }
 *     struct strata_stream *st;
 *     strata_stream_open(s, 4096, &st);
 *     ... strata_tokenize, strata_generate (or strata_eval + strata_sampler_sample) ...
 *     strata_stream_close(st);
 *     strata_close(s);
 *
 * Conventions: functions that act return 0 or -errno and leave a message for strata_error();
 * nothing prints unless cfg.log is set (set-up reports) or a print function is called. One
 * struct strata and its streams are used from one thread at a time.
 */
#ifndef STRATA_H
#define STRATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

enum strata_device {
    STRATA_DEVICE_AUTO = 0, /* CUDA device 0 when the build has CUDA and one is present, else
                             * the CPU; a model that does not fit in the GPU's free memory is
                             * retried with a VRAM budget of 90% of it (said on cfg.log) */
    STRATA_DEVICE_CPU = 1,
    STRATA_DEVICE_CUDA = 2,
};

/* Where experts live and run under a VRAM budget (CUDA only). */
enum strata_placement {
    STRATA_PLACEMENT_STREAM = 0, /* the expert cache: hits from VRAM slots, misses streamed
                                  * (or read in place, STRATA_FILL_ZEROCOPY) from host memory */
    STRATA_PLACEMENT_HYBRID = 1, /* the expert cache, its misses split between streaming and
                                  * the CPU by a cost model measured at open */
    STRATA_PLACEMENT_STATIC = 2, /* the experts of layers [0, cpu_moe_layers) run on the CPU,
                                  * the rest are resident (llama.cpp's --n-cpu-moe) */
    STRATA_PLACEMENT_AUTO = 3,   /* (default) the expert cache, its misses served by copies,
                                  * zero-copy reads (decode steps in a CUDA graph) or copies and
                                  * the CPU lane, whichever decodes fastest: each is timed on a
                                  * few decode steps, again when the miss rate moves; `fill` is
                                  * the one timed first. Without the cache (all resident, or no
                                  * GPU): nothing to place. With STRATA_FLAG_PREFETCH: STREAM */
};

/* How the expert cache serves a miss in decode-sized calls (prefill always copies). */
enum strata_fill {
    STRATA_FILL_COPY = 0,     /* copied into a slot before the layer runs */
    STRATA_FILL_ZEROCOPY = 1, /* read in place by the expert kernel, admitted between tokens */
    STRATA_FILL_GPU = 2,      /* looked up and copied into a slot by the GPU itself, every call
                               * size, no host sync (decode steps can be one CUDA graph); each
                               * layer recycles its own least recently used slots. Not with
                               * hybrid, prefetch or a host tier; with AUTO placement: STREAM */
};

enum strata_flags {
    STRATA_FLAG_GRAPH = 1 << 0,    /* replay one-token decode steps from a CUDA graph (all
                                    * resident, or zerocopy without prefetch or a CPU lane);
                                    * with AUTO placement and every expert resident the
                                    * default (STRATA_FLAG_NO_GRAPH: not) */
    STRATA_FLAG_PREFETCH = 1 << 1, /* copy path: predict the next layer's experts and stream
                                    * them while the current layer computes */
    STRATA_FLAG_GATHER = 1 << 2,   /* stream misses with one gather kernel per batch */
    STRATA_FLAG_NO_MMAP = 1 << 3,  /* copy the weights to anonymous memory instead of mapping */
    STRATA_FLAG_BIND = 1 << 4,     /* one OpenMP thread per physical core, bound (near the GPU's
                                    * NUMA node on CUDA) */
    STRATA_FLAG_NO_HYBRID_ADMIT = 1 << 5,  /* hybrid: a CPU-lane miss is never also copied into
                                            * a slot while PCIe is idle (for comparisons) */
    STRATA_FLAG_PROFILE_FREEZE = 1 << 6,   /* the profile's experts are never evicted (else
                                            * they only seed the cache) */
    STRATA_FLAG_PROFILE_OPTIONAL = 1 << 7, /* a profile that cannot be used (another model,
                                            * unreadable, no expert cache) is reported and the
                                            * run goes on with a cold cache */
    STRATA_FLAG_NO_URING = 1 << 8,         /* host tier: read with pread, never io_uring */
    STRATA_FLAG_NO_DIRECT = 1 << 9,        /* host tier: buffered reads, never O_DIRECT */
    STRATA_FLAG_READ_AHEAD = 1 << 10,      /* host tier: read the next layer's predicted experts
                                            * while a layer computes (io_uring), as many as the
                                            * disk lands before that layer */
    STRATA_FLAG_NO_MTP = 1 << 11,          /* leave the model's multi-token-prediction block
                                            * unloaded (qwen3next, qwen35moe) */
    STRATA_FLAG_NO_HOST_TIER = 1 << 12,    /* host_budget 0 means the mapping even when the
                                            * experts do not fit in memory (below) */
    STRATA_FLAG_NO_GRAPH = 1 << 13,        /* every decode step launched kernel by kernel, also
                                            * where a graph is the default (STRATA_FLAG_GRAPH) */
};

/* What the router chose at one layer for a batch of tokens (statistics tools). */
struct strata_route_event {
    int layer, n_tok, k;
    int pos0;             /* stream position of token 0 */
    const int32_t *ids;   /* (n_tok, k) selected experts */
    const float *weights; /* (n_tok, k) their renormalised router weights */
    const float *in;      /* (n_tok, n_embd) the layer's MoE input (ffn-normed hidden) */
};
typedef void (*strata_route_fn)(void *ctx, const struct strata_route_event *ev);

#define STRATA_HOST_BUDGET_AUTO UINT64_MAX /* strata_config.host_budget: what fits */

struct strata_config {
    const char *model_path;  /* GGUF file (required) */
    enum strata_device device; /* default STRATA_DEVICE_CPU */
    int cuda_device;         /* CUDA device index; default 0 */
    uint64_t vram_budget;    /* bytes of VRAM strata may hold; 0 = every weight resident */
    uint64_t host_budget;    /* device CPU, or CUDA with STRATA_PLACEMENT_STATIC (its CPU
                              * layers) or under vram_budget (the expert cache's misses, copy
                              * fill and the hybrid lane): bytes of a host tier the routed
                              * experts are read into from the file (io_uring or pread,
                              * O_DIRECT where the file system allows), at least one layer's
                              * experts; 0 = every expert read from the mapping, unless
                              * they do not fit in the memory available at start (the
                              * system's or its cgroup's, less a margin) and the placement can
                              * take a tier: then STRATA_HOST_BUDGET_AUTO, said in the log
                              * (STRATA_FLAG_NO_HOST_TIER keeps the mapping);
                              * STRATA_HOST_BUDGET_AUTO = that memory, less the margin. CUDA
                              * with STRATA_FILL_ZEROCOPY / _GPU or every expert resident:
                              * -ENOTSUP */
    enum strata_placement placement;
    int cpu_moe_layers;      /* STRATA_PLACEMENT_STATIC: layers whose experts run on the CPU;
                              * -1 (default) = the fewest that let the rest fit vram_budget */
    enum strata_fill fill;
    unsigned flags;          /* enum strata_flags */
    int n_threads;           /* CPU threads; 0 = all cores */
                             /* (also the CUDA backend's CPU lane; more than the online
                              * processors are capped to their count) */
    int n_ctx;               /* context of the streams to come, counted against vram_budget;
                              * default 4096 */
    int n_batch;             /* tokens per forward call (prefill chunk); default 512 */
    int n_streams;           /* streams open at once (lockstep batches): n_streams streams of
                              * n_ctx positions and a batch of n_streams +
                              * STRATA_BATCH_JOIN_ROWS rows are counted against vram_budget;
                              * default 1 */
    int expert_slots;        /* > 0: exactly this many expert slots instead of the budget's
                              * (tests) */
    int prefetch_depth;      /* STRATA_FLAG_PREFETCH: predict the experts of the next 1..4
                              * layers (0 = 1) */
    int prefetch_top;        /* STRATA_FLAG_PREFETCH: copy each token's first 1..32 predicted
                              * experts only, largest router weight first (0 = the first half
                              * of k; the lesser ones are used least: bench/profiles.md) */
    const char *profile;     /* residency profile (strata profile warmup) restored into the
                              * expert cache at start: its frozen experts are copied into slots
                              * before the first token; NULL = a cold cache */
    strata_route_fn route_observer; /* called after each layer's routing (on CUDA the ids are
                                     * read back first, a sync per layer; `in` is NULL there) */
    void *route_ctx;
    FILE *log;               /* set-up reports (placement, slots, pinning), NULL = quiet */
};

/* The defaults above. */
void strata_config_init(struct strata_config *cfg);

struct strata;        /* an opened model on a device */
struct strata_stream; /* one sequence: its KV cache and position */

/* Opens cfg->model_path on the device. 0, or -errno with strata_error() saying what failed:
 * -ENOENT/-EINVAL (file, format: the key, tensor or offset named), -ENODEV (no CUDA device, or
 * a build without CUDA), -ENOMEM (the weights do not fit: the message has the arithmetic),
 * -ENOTSUP (architecture, quant type or option not supported). */
int strata_open(const struct strata_config *cfg, struct strata **out);
void strata_close(struct strata *s);

/* The message of the last failed call on this thread ("" when none). */
const char *strata_error(void);

struct strata_model_info {
    const char *arch;   /* general.architecture */
    uint32_t n_layer, n_embd, n_head, n_head_kv, head_dim;
    uint32_t n_expert, n_expert_used, n_ff_exp, n_vocab, n_ctx_train;
    const char *device; /* "cpu" or "cuda" */
    int n_threads;
    bool has_tokenizer;
};
void strata_model_info(const struct strata *s, struct strata_model_info *out);

/* ---- residency profiles ------------------------------------------------------------------- */

struct strata_profile_status {
    bool restored;    /* the profile's experts were placed into slots at start */
    bool frozen;      /* some of them are never evicted (STRATA_FLAG_PROFILE_FREEZE) */
    bool replanned;   /* the profile was made for another slot count: planned again */
    int planned;      /* experts to place: the frozen set, then the most chosen others, up to
                       * the pool's slots */
    int placed;       /* of those, placed (the pool may hold fewer) */
    int n_frozen;     /* of those, pinned for good */
    int slots;        /* slots of this run's cache */
    double coverage;  /* share of the warmup's expert choices that the placed set covers */
    double seconds;   /* wall time of the restore */
};
/* What strata_start did with cfg.profile (all zero without one). */
void strata_profile_status(const struct strata *s, struct strata_profile_status *out);

struct strata_probe_report {
    bool compared;   /* the probe was run and compared */
    bool match;      /* its greedy tokens equal those recorded at warmup */
    bool exact;      /* the two runs compute every expert with the same kernels (a mismatch is
                      * then an error; under hybrid or static placement the CPU lane agrees
                      * within a tolerance, not bit for bit) */
    int n, diff_at;  /* tokens compared; the first that differs (-1: none) */
    char why[160];   /* when not compared: why (no probe recorded, another backend) */
};
/* The post-restore check: runs the profile's probe prompt greedily on a fresh stream and
 * compares the tokens with those recorded under the warmup's plain cache; then zeroes the
 * cache's statistics, so that they count the caller's work only. 0 (see the report) or -errno
 * (no profile restored: -ENOENT). */
int strata_profile_probe(struct strata *s, struct strata_probe_report *r);
/* The backend class a probe records and compares under: "cpu", "cuda" (GPU kernels only:
 * resident or any expert cache), "cuda-hybrid" or "cuda-static". */
const char *strata_probe_mode(const struct strata *s);

/* ---- tokens ------------------------------------------------------------------------------- */

enum strata_tokenize_flags {
    STRATA_TOKENIZE_SPECIAL = 1 << 0, /* "<|im_start|>" and the like become their ids */
    STRATA_TOKENIZE_ADD_BOS = 1 << 1, /* BOS/EOS as the vocabulary says */
};
/* Tokenizes len bytes of text into ids (capacity cap). The number of ids (it may exceed cap:
 * call again with a larger buffer), or -errno. -ENOTSUP when the model has no tokenizer. */
int strata_tokenize(const struct strata *s, const char *text, size_t len, unsigned flags,
                    int32_t *ids, int cap);
/* The bytes of token id (not NUL-terminated), or NULL for an id outside the vocabulary. */
const char *strata_token_text(const struct strata *s, int32_t id, size_t *len);
/* Whether id ends generation (EOS, <|im_end|>, ...). */
bool strata_token_is_eog(const struct strata *s, int32_t id);

/* ---- streams ------------------------------------------------------------------------------ */

/* A stream of n_ctx positions (0 = cfg.n_ctx). 0 or -errno. */
/* On the CPU device its KV cache and activations are checked against the host memory available
 * before anything is allocated: -ENOMEM, the sizes in strata_error(), above 90% of it. */
int strata_stream_open(struct strata *s, int n_ctx, struct strata_stream **out);
/* Whether n_streams streams of n_ctx positions (0 = cfg.n_ctx) fit together, before any is
 * opened: on the CPU device against 90% of the host memory available now, on CUDA without a
 * budget against 90% of the GPU's free memory (-ENOMEM with the arithmetic and how many fit);
 * under vram_budget, strata_start planned cfg.n_streams streams of cfg.n_ctx positions (and
 * refused, with how many fit, when they did not): more or longer ones give -ENOSPC. 0 or
 * -errno. */
int strata_streams_check(const struct strata *s, int n_streams, int n_ctx);
void strata_stream_close(struct strata_stream *st);
int strata_stream_pos(const struct strata_stream *st);   /* tokens in its KV cache */
int strata_stream_n_ctx(const struct strata_stream *st); /* positions it holds at most */
/* Forgets positions pos.. (pos <= the current position). Models with a recurrent state
 * (qwen3next, qwen35moe) cannot take it back: their stream re-evaluates its first pos tokens
 * (a prefill). 0 or -errno (that re-evaluation failed; the stream is then empty). */
int strata_stream_truncate(struct strata_stream *st, int pos);

/* Called after each chunk (n_batch tokens) of an evaluation longer than one chunk, such as a
 * long prompt's prefill, with the tokens done and the total; nonzero stops the evaluation,
 * which then returns -EINTR (the tokens done stay in the stream: strata_stream_pos). */
typedef int (*strata_progress_fn)(void *ctx, int done, int total);
/* Sets the stream's progress callback (NULL: none). */
void strata_stream_set_progress(struct strata_stream *st, strata_progress_fn fn, void *ctx);

/* Evaluates n ids after what the stream holds; logits (n_vocab floats, may be NULL) receives
 * the last position's. -ENOSPC when the context would overflow. */
int strata_eval(struct strata_stream *st, const int32_t *ids, int n, float *logits);
/* strata_eval, then *next = the argmax of the last position (ties to the lowest id), taken on
 * the device where the logits are. */
int strata_eval_argmax(struct strata_stream *st, const int32_t *ids, int n, int32_t *next);

/* ---- lockstep batches ------------------------------------------------------------------- */

/* Several streams of one struct strata decoding together: each step evaluates one token of
 * every stream given, each at its own position in its own KV cache, in one forward pass over
 * all of them, so each layer routes all their rows at once and fetches an expert once for
 * every stream that chose it. Prefill stays per stream (strata_eval). */
struct strata_batch;
/* A batch of at most max_streams streams per step (its activations in the device's memory).
 * 0 or -errno. */
int strata_batch_open(struct strata *s, int max_streams, struct strata_batch **out);
void strata_batch_close(struct strata_batch *b);
/* One step: stream sts[i] (i < n <= max_streams, all distinct, of the batch's strata)
 * evaluates ids[i] at its position; logits (n, n_vocab) receives each stream's next-token
 * logits (host memory). 0 or -errno (-ENOSPC when a stream's cache is full: nothing is
 * evaluated). */
int strata_batch_eval(struct strata_batch *b, struct strata_stream *const *sts, int n,
                      const int32_t *ids, float *logits);
/* Rows a lockstep batch is planned to have beyond one per stream (cfg.n_streams > 1): room for
 * a joining prompt's chunk in each step. */
#define STRATA_BATCH_JOIN_ROWS 16

/* A batch whose steps may also carry prompt chunks: at most max_streams streams and max_rows
 * tokens (>= max_streams) per step. */
int strata_batch_open_rows(struct strata *s, int max_streams, int max_rows,
                           struct strata_batch **out);
/* One step where stream sts[i] evaluates n_tok[i] >= 1 tokens (a prompt's next chunk joining
 * the others' decode tokens), their ids consecutive in ids, stream 0's first; logits (n,
 * n_vocab) receives each stream's logits after its last token. The chunk's tokens attend to
 * each other as in strata_eval. 0 or -errno as strata_batch_eval. */
int strata_batch_eval_chunks(struct strata_batch *b, struct strata_stream *const *sts,
                             const int *n_tok, int n, const int32_t *ids, float *logits);

/* strata_batch_eval_chunks, but logits (sum of n_tok, n_vocab) receives every row's logits in
 * row order, not only each stream's last: a stream's drafted tokens verified in a step. */
int strata_batch_eval_rows(struct strata_batch *b, struct strata_stream *const *sts,
                           const int *n_tok, int n, const int32_t *ids, float *logits);

/* ---- sampling and generation -------------------------------------------------------------- */

struct strata_sampling {
    float temperature;    /* 0 = greedy; default 0.8 */
    int top_k;            /* 0 = off; default 40 */
    float top_p;          /* 1 = off; default 0.95 */
    float min_p;          /* 0 = off; default 0.05 */
    float repeat_penalty; /* 1 = off; default 1.0 */
    int repeat_last_n;    /* default 64 */
    uint64_t seed;
};
void strata_sampling_init(struct strata_sampling *p); /* the defaults above */

/* The fields strata_sampling_from_model can set. */
enum strata_sampling_field {
    STRATA_SAMPLING_TEMP = 1u << 0,
    STRATA_SAMPLING_TOP_K = 1u << 1,
    STRATA_SAMPLING_TOP_P = 1u << 2,
    STRATA_SAMPLING_MIN_P = 1u << 3,
    STRATA_SAMPLING_REPEAT_PENALTY = 1u << 4,
    STRATA_SAMPLING_REPEAT_LAST_N = 1u << 5,
};
/* The model file's own sampling defaults, the keys llama.cpp's GGUF writer names
 * (general.sampling.temp, top_k, top_p, min_p, penalty_repeat, penalty_last_n), written over
 * *p where present and in range; returns the fields set (enum strata_sampling_field). The seed
 * is never taken from the file. */
unsigned strata_sampling_from_model(const struct strata *s, struct strata_sampling *p);

struct strata_sampler;
int strata_sampler_open(const struct strata *s, const struct strata_sampling *p,
                        struct strata_sampler **out);
void strata_sampler_close(struct strata_sampler *sm);
/* Chooses a token from logits (n_vocab floats; modified in place by the penalty). It is not
 * recorded: pass it to strata_sampler_accept, as for the prompt's tokens, for the repetition
 * penalty to see it (strata_generate does both). */
int32_t strata_sampler_sample(struct strata_sampler *sm, float *logits);
/* Speculative decoding's choice for a drafted token: the draft (*accepted) with the probability
 * sampling gives it, else a token drawn from that distribution without the draft (greedy: the
 * argmax, accepted when it is the draft); the result is distributed as strata_sampler_sample's.
 * Not recorded, as strata_sampler_sample. */
int32_t strata_sampler_sample_draft(struct strata_sampler *sm, float *logits, int32_t draft,
                                    bool *accepted);
/* The drafts a verify pass tries given the running share of drafts kept (an exponential
 * average, starting at 0.5): 1 + twice the expected run of kept drafts, at most draft_max. */
int strata_draft_len(double accept_ema, int draft_max);
/* The pace of a stream's drafting: strata_draft_len's adaptive length, and a pause after 4
 * verify passes in a row that kept no draft (4 steps without drafts, doubling up to 64 with each
 * probe pass that keeps none; a kept draft ends it), so that drafts that are never kept stop
 * costing a verify pass at every step. */
struct strata_draft_pace {
    double accept_ema; /* the running share of drafts kept (exponential average) */
    int miss_run;      /* verify passes in a row that kept no draft */
    int pause;         /* steps left without drafts */
    int pause_len;     /* the last pause's length */
    int n_paused;      /* steps taken without drafts because of a pause, so far */
};
void strata_draft_pace_init(struct strata_draft_pace *p);
/* The drafts to try this step, at most draft_max; 0 while paused. */
int strata_draft_pace_len(struct strata_draft_pace *p, int draft_max);
/* After a verify pass of k > 0 drafts of which accepted were kept. */
void strata_draft_pace_update(struct strata_draft_pace *p, int k, int accepted);
/* Prompt-lookup drafts: the up to k tokens that followed the latest earlier occurrence of
 * hist's last ngram .. 2 tokens, into out; their number. */
int strata_ngram_draft(const int32_t *hist, int n_hist, int ngram, int k, int32_t *out);
/* The index in hist of strata_ngram_draft's first draft (its drafts are hist[src ..]), or -1
 * when it finds none. */
int strata_ngram_source(const int32_t *hist, int n_hist, int ngram);
/* Records a token (of the prompt, or one just sampled) for the repetition penalty. */
void strata_sampler_accept(struct strata_sampler *sm, int32_t id);

#define STRATA_MAX_STOP 8
struct strata_generate_params {
    int n_predict;                 /* tokens to generate at most; default 128 */
    struct strata_sampling sampling;
    const char *stop[STRATA_MAX_STOP]; /* stop strings (not emitted) */
    int n_stop;
    bool ignore_eos;
    /* Speculative decoding with prompt-lookup drafts (0 = off): after each token, up to
     * draft_max tokens that followed the latest earlier occurrence of the text's last
     * draft_ngram .. 2 tokens (prompt and output) are verified with it in one forward pass
     * (strata_batch's rows) and kept while they match what sampling picks (greedy: the argmax;
     * sampled: the acceptance rule that leaves the distribution unchanged); the number tried
     * adapts to the running acceptance. Greedy output equals plain decoding's. */
    int draft_max;
    int draft_ngram; /* default 3 */
    /* Another draft source instead of prompt lookup (NULL: prompt lookup; draft_max still
     * bounds the drafts): up to k tokens to follow hist (n_hist ids: the prompt and the output
     * so far) into out, their number (0: none this time). strata_drafter_draft is one. */
    int (*draft_fn)(void *ctx, const int32_t *hist, int n_hist, int k, int32_t *out);
    void *draft_ctx;
    /* Lookahead (docs/speculative.md): where the text's last tokens appeared before, the
     * model has seen the routing of what follows; before a forward the experts every layer
     * chose at those earlier positions are copied into VRAM slots (the copy and hybrid
     * placements). STRATA_LOOKAHEAD_DRAFTS (the default): before the verify passes of
     * prompt-lookup drafts; ALWAYS: before every decode step too; OFF: never. It never changes
     * the output. */
    int lookahead;
};
enum { STRATA_LOOKAHEAD_DRAFTS = 0, STRATA_LOOKAHEAD_ALWAYS = 1, STRATA_LOOKAHEAD_OFF = 2 };
void strata_generate_params_init(struct strata_generate_params *p);

/* A draft model for speculative decoding: another opened model with the same vocabulary as
 * the one it drafts for, and a stream of n_ctx positions on it that follows the histories it
 * is asked about (only the part that differs from what it holds is evaluated). */
struct strata_drafter;
/* 0 or -errno: -EINVAL when draft's vocabulary differs from target's (count or any token's
 * text), naming the first difference. */
int strata_drafter_open(struct strata *draft, const struct strata *target, int n_ctx,
                        struct strata_drafter **out);
void strata_drafter_close(struct strata_drafter *d);
/* A draft_fn (ctx: the drafter): the draft model's greedy continuation of hist, up to k
 * tokens; 0 when hist and the drafts do not fit its context or its forward fails. */
int strata_drafter_draft(void *drafter, const int32_t *hist, int n_hist, int k, int32_t *out);
/* Ids that come before every history the drafter is asked about (what the target's stream
 * held before the strata_generate call whose drafts it makes: a prompt evaluated earlier, a
 * conversation's earlier turns); n = 0 clears them. 0 or -ENOMEM. */
int strata_drafter_set_prefix(struct strata_drafter *d, const int32_t *ids, int n);
/* Drafts as a greedy sampler with this repetition penalty picks (strata_sampling's
 * repeat_penalty and repeat_last_n: the target's, so that its drafts are what the target
 * would choose): the argmax after penalising the distinct tokens among the last
 * repeat_last_n of the history and the drafts so far (the history of the call, as the
 * target's sampler sees it: not the prefix). 1 or 0 tokens: the plain argmax (the
 * default). 0, -EINVAL (penalty <= 0, repeat_last_n < 0) or -ENOMEM. */
int strata_drafter_set_penalty(struct strata_drafter *d, float repeat_penalty, int repeat_last_n);
/* Tokens the draft model has evaluated and the wall seconds it took. */
void strata_drafter_stats(const struct strata_drafter *d, long long *n_eval, double *seconds);

/* The model's own multi-token-prediction block as the draft source of stream st (qwen3next,
 * qwen35moe files that have one; docs/speculative.md): from now on every evaluation of st also
 * runs the block on the positions it completes (one attention layer with the MoE, a KV cache
 * of st's context; what st already holds is evaluated again for it), and strata_mtp_draft
 * drafts greedily from the model's last hidden state. 0, or -ENOTSUP ("this model has no MTP
 * block", "the MTP block was not loaded (--no-mtp)"), -ENOMEM. Close it before st. */
struct strata_mtp;
int strata_mtp_open(struct strata_stream *st, struct strata_mtp **out);
void strata_mtp_close(struct strata_mtp *d);
/* A draft_fn (ctx: the strata_mtp) for strata_generate on its stream: up to k tokens to follow
 * hist's last id (the token about to be evaluated at the stream's position); 0 when there is
 * nothing to draft from (an empty stream) or the block's forward fails. */
int strata_mtp_draft(void *mtp, const int32_t *hist, int n_hist, int k, int32_t *out);
/* Rows the block has run (following the stream and drafting) and the wall seconds spent
 * drafting. */
void strata_mtp_stats(const struct strata_mtp *d, long long *n_rows, double *seconds);

struct strata_generate_stats {
    int n_prompt, n_gen;
    double t_prompt_s, t_gen_s;    /* wall seconds of prefill and of the decode loop */
    bool stopped_eog, stopped_string, stopped_ctx;
    int n_verify;              /* speculative: verify passes */
    int n_drafted, n_accepted; /* drafted tokens; of those, accepted */
    bool spec_unavailable;     /* drafts were asked for, but there was no memory for the verify
                                * pass's rows: decoded without them */
    int drafted_at[16], accepted_at[16]; /* drafts by position in their pass (the 16th and
                                          * later ones in the last entry); of those, accepted */
    int n_paused; /* steps decoded without drafts while drafting was paused (none kept lately:
                   * struct strata_draft_pace) */
    int n_lookahead;             /* verify passes preceded by a lookahead */
    long long lookahead_experts; /* experts the lookaheads copied into slots */
};

/* Receives generated text as it completes (whole UTF-8 characters); nonzero stops. */
typedef int (*strata_emit_fn)(void *ctx, const char *text, size_t len);

/* Evaluates prompt (n_prompt ids) after what st holds and generates. out_ids (may be NULL)
 * receives up to n_predict generated ids. 0 or -errno. */
int strata_generate(struct strata_stream *st, const int32_t *prompt, int n_prompt,
                    const struct strata_generate_params *p, strata_emit_fn emit, void *ctx,
                    int32_t *out_ids, struct strata_generate_stats *stats);

/* ---- statistics --------------------------------------------------------------------------- */

struct strata_stats {
    uint64_t vram_bytes;       /* device memory held (weights, KV, scratch, slots) */
    bool graph;                /* decode steps replayed from a CUDA graph */
    const char *placement;     /* how the experts are placed now: "resident", "static",
                                * "copy", "zero-copy", "zero-copy graph" or "hybrid"; "cpu"
                                * without a GPU */
    bool placement_timing;     /* STRATA_PLACEMENT_AUTO is still timing its modes */
    int threads;               /* OpenMP threads the CPU kernels (or the CPU lane) run with now,
                                * on the calling thread (with n_threads 0 on the CPU backend:
                                * the count its timing picked) */
    int cpu_moe_layers;        /* static placement's CPU layers */
    double cpu_lane_seconds;   /* wall seconds the CPU lane spent on experts */
    double lane_pcie_bps;      /* hybrid: the PCIe lane's bytes/s, measured at open */
    double lane_cpu_bps_open;  /* hybrid: the CPU lane's, measured at open (the host's read
                                * bandwidth with its threads) */
    double lane_cpu_bps;       /* hybrid: the CPU lane's as its calls ran (bytes over seconds,
                                * decayed; 0: none yet); the split takes it with
                                * STRATA_LANE_LEARN=1 */
    bool has_cache;            /* the rest is the expert cache's, over all layers so far */
    int slots;
    uint64_t hits, misses, evictions;
    uint64_t bytes_streamed, bytes_zero_copy;
    uint64_t cpu_computed, cpu_admitted; /* hybrid: misses the CPU lane computed; of those,
                                          * also copied into a slot behind their call */
    uint64_t prefetched;       /* experts copied ahead of their layer by prediction */
    uint64_t prefetch_used;    /* of those, used by their layer */
    uint64_t prefetch_late;    /* of those used, still copying when the layer's routing was
                                * known */
    uint64_t prefetch_wasted;  /* bytes prefetched and evicted unused */
    uint64_t prefetch_jobs;    /* layer calls whose predictions the prefetch worker's thread
                                * admitted and copied (the copy and hybrid placements) */
    bool has_host_tier;        /* the host tier's (host_budget), over the run so far: */
    int tier_slots;
    uint64_t tier_hits, tier_misses, tier_bytes_read;
    uint64_t tier_ahead, tier_ahead_used; /* experts read ahead of their layer; of those, used */
    double tier_read_seconds;  /* wall time waiting for reads */
    bool tier_uring, tier_direct;
    uint64_t tier_ahead_paced; /* predicted experts not read ahead: the disk, as learned, would
                                * not have landed them before their layer */
    double tier_disk_bps;      /* learned from the tier's reads: bandwidth (0: none yet), */
    double tier_disk_lat_s;    /* seconds per batch of reads beyond its bytes, */
    double tier_window_s;      /* and seconds from a read-ahead to the next layer's reads */
    int tier_numa_node;        /* the tier's NUMA node, -1 where not bound */
};
void strata_get_stats(const struct strata *s, struct strata_stats *out);
/* The expert cache's per-layer table and the host tier's counts (text; nothing without
 * either), or the cache's table as JSON to path (nothing without a cache). */
int strata_print_cache_stats(const struct strata *s, FILE *f);
int strata_write_cache_stats_json(const struct strata *s, const char *path);

#ifdef __cplusplus
}
#endif

#endif
