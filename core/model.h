/* model: an opened checkpoint: the GGUF file, the architecture's hyperparameters, the weight
 * views into the mapping, and (when the file has one) the tokenizer.
 *
 * model_open validates what the architecture requires (keys, tensor names, types and shapes)
 * and names what is missing or wrong; the per-architecture part is a loader of
 * model_arch.h (the forwards are the engine's, runtime/arch/).
 */
#ifndef STRATA_MODEL_H
#define STRATA_MODEL_H

#include <stdbool.h>
#include <stdint.h>

struct gguf_file;
struct gguf_tensor;
struct tokenizer;
struct model_arch;

/* A weight: a tensor of the model file, viewed in place. */
struct weight {
    const char *name;     /* the tensor's name, owned by the gguf file */
    uint32_t type;        /* ggml type id */
    uint32_t n_dims;
    uint64_t ne[4];       /* ne[0] contiguous (the input dimension of a matrix) */
    uint64_t row_bytes;   /* bytes of one ne[0] row */
    uint64_t bytes;       /* whole tensor */
    const void *data;     /* host, the mmapped file */
    void *dev;            /* device copy when a GPU backend placed it there, else NULL */
};

struct model_hparams {
    uint32_t n_layer;
    uint32_t n_embd;
    uint32_t n_head, n_head_kv, head_dim;
    uint32_t n_expert, n_expert_used, n_ff_exp;
    uint32_t n_ctx_train;
    uint32_t n_vocab;
    float rms_eps;
    float rope_base;
    /* gpt-oss (0 elsewhere): sliding-window attention and YaRN rope scaling */
    uint32_t n_swa;           /* attention.sliding_window: a query sees itself and the n_swa - 1
                                 keys before it on a sliding layer; 0: no sliding layers */
    uint32_t swa_period;      /* layer l slides iff l % swa_period < swa_period - 1 (2: the even
                                 layers); meaningful when n_swa > 0 */
    float rope_yarn_factor;   /* rope.scaling.factor; 0: no YaRN */
    uint32_t rope_yarn_n_ctx_orig; /* rope.scaling.original_context_length */
    bool swiglu_oai;          /* experts: gpt-oss's clamped SwiGLU (cpu_kernels/expert_ffn.h)
                                 with biases, instead of silu(gate) * up */
    /* qwen3next / qwen35moe (0 elsewhere): Gated DeltaNet layers between gated attention
     * layers, a shared expert beside the routed ones */
    uint32_t full_attn_interval; /* layer l attends iff (l + 1) % interval == 0, the others are
                                    Gated DeltaNet; 0: every layer attends */
    uint32_t n_rot;              /* rope.dimension_count: rotated dims of a head (NEOX pairs
                                    (i, i + n_rot/2)); the rest pass through; 0: head_dim */
    bool attn_gated;      /* attn_q carries per head [q | gate]; out = attn * sigmoid(gate) */
    uint32_t n_ff_shexp;  /* expert_shared_feed_forward_length; 0: no shared expert */
    uint32_t ssm_d_conv;  /* ssm.conv_kernel: taps of the causal depthwise conv */
    uint32_t ssm_d_state; /* ssm.state_size: head dim of q, k and v */
    uint32_t ssm_n_k;     /* ssm.group_count: q/k heads */
    uint32_t ssm_n_v;     /* ssm.time_step_rank: v heads (a multiple of ssm_n_k) */
    bool ssm_v_tiled;     /* v head p reads q/k head p % n_k (qwen35moe), else p / (n_v/n_k) */
    uint32_t n_nextn;     /* nextn_predict_layers: MTP blocks after the n_layer main ones
                             (the first is loaded into struct model.mtp) */
};

/* Whether layer l is a Gated DeltaNet (recurrent) layer. */
static inline bool model_layer_is_ssm(const struct model_hparams *hp, uint32_t l)
{
    return hp->full_attn_interval && (l + 1) % hp->full_attn_interval != 0;
}

/* Layers with a KV cache (the attending ones), and layer l's index among them. */
static inline uint32_t model_n_kv_layers(const struct model_hparams *hp)
{
    return hp->full_attn_interval ? hp->n_layer / hp->full_attn_interval : hp->n_layer;
}
static inline uint32_t model_kv_layer(const struct model_hparams *hp, uint32_t l)
{
    return hp->full_attn_interval ? l / hp->full_attn_interval : l;
}

/* Gated DeltaNet layers (with a recurrent state), and layer l's index among them. */
static inline uint32_t model_n_ssm_layers(const struct model_hparams *hp)
{
    return hp->n_layer - model_n_kv_layers(hp);
}
static inline uint32_t model_ssm_layer(const struct model_hparams *hp, uint32_t l)
{
    return l - model_kv_layer(hp, l);
}

/* Floats of one Gated DeltaNet layer's conv state ((d_conv - 1) x conv channels) and delta
 * rule state (n_v x d_state x d_state), per stream. */
static inline uint64_t model_conv_state_floats(const struct model_hparams *hp)
{
    return (uint64_t)(hp->ssm_d_conv ? hp->ssm_d_conv - 1 : 0) * (2 * hp->ssm_n_k + hp->ssm_n_v) *
           hp->ssm_d_state;
}
static inline uint64_t model_ssm_state_floats(const struct model_hparams *hp)
{
    return (uint64_t)hp->ssm_n_v * hp->ssm_d_state * hp->ssm_d_state;
}

/* Whether layer l uses sliding-window attention (hp->n_swa keys). */
static inline bool model_layer_is_swa(const struct model_hparams *hp, uint32_t l)
{
    return hp->n_swa && hp->swa_period && l % hp->swa_period < hp->swa_period - 1;
}

/* Weights of one qwen3moe-style layer. Stacked experts: gate/up (n_embd, n_ff_exp, n_expert),
 * down (n_ff_exp, n_embd, n_expert); expert e is slice ne[2] = e. A weight an architecture does
 * not have is left zeroed (data NULL): qwen3moe has no biases or sinks, gpt-oss no QK-norms. */
struct layer_weights {
    struct weight attn_norm;          /* (n_embd) F32 */
    struct weight wq, wk, wv, wo;     /* (n_embd, n_head*head_dim) ... wo (n_head*head_dim, n_embd) */
    struct weight q_norm, k_norm;     /* (head_dim) F32 */
    struct weight ffn_norm;           /* (n_embd) F32; gpt-oss: post_attention_norm */
    struct weight router;             /* (n_embd, n_expert) F32 */
    struct weight gate_exps, up_exps; /* (n_embd, n_ff_exp, n_expert) */
    struct weight down_exps;          /* (n_ff_exp, n_embd, n_expert) */
    /* gpt-oss only, all F32 */
    struct weight bq, bk, bv;         /* (n_head*head_dim), (n_head_kv*head_dim) x2 */
    struct weight bo;                 /* (n_embd) */
    struct weight sinks;              /* (n_head) attention sink logits */
    struct weight router_b;           /* (n_expert) */
    struct weight gate_exps_b, up_exps_b; /* (n_ff_exp, n_expert) */
    struct weight down_exps_b;        /* (n_embd, n_expert) */
    /* qwen3next / qwen35moe: the shared expert (every layer) */
    struct weight shexp_gate_inp;       /* (n_embd) F32: one sigmoid logit */
    struct weight gate_shexp, up_shexp; /* (n_embd, n_ff_shexp) */
    struct weight down_shexp;           /* (n_ff_shexp, n_embd) */
    /* Gated DeltaNet layers (K = n_k*d_state, V = n_v*d_state, C = 2K + V) */
    struct weight ssm_qkv;             /* attn_qkv (n_embd, C): q (K) | k (K) | v (V) */
    struct weight ssm_z;               /* attn_gate (n_embd, V) */
    struct weight ssm_ba;              /* qwen3next (n_embd, 2 n_v): per q/k head g, the b of
                                          its r = n_v/n_k v heads then their a */
    struct weight ssm_beta, ssm_alpha; /* qwen35moe (n_embd, n_v) each */
    struct weight ssm_conv;            /* (d_conv, C) F32: tap d_conv-1 meets the newest input */
    struct weight ssm_dt_b;            /* (n_v) F32 */
    struct weight ssm_a;               /* (n_v) F32: -exp(A_log), negative */
    struct weight ssm_norm;            /* (d_state) F32 */
    struct weight ssm_out;             /* (V, n_embd) */
};

/* A multi-token-prediction block (qwen3next / qwen35moe "nextn"): a gated-attention layer with
 * the model's MoE and shared expert, fed eh_proj . [enorm(embedding of token i+1) |
 * hnorm(the main model's normed hidden state at i)]; its output through head_norm and the
 * model's output matrix drafts token i+2. */
struct mtp_weights {
    struct weight eh_proj;          /* (2 n_embd, n_embd): the embedding half first */
    struct weight enorm, hnorm;     /* (n_embd) F32 */
    struct weight head_norm;        /* (n_embd) F32: shared_head_norm, else output_norm's view */
    struct layer_weights lw;        /* the decoder layer, an attention layer's tensors */
};

/* Options of model_open_opts. */
struct model_open_opts {
    bool skip_mtp; /* leave MTP blocks unloaded (they are still counted) */
};

struct model {
    struct gguf_file *file;        /* owned */
    const struct model_arch *arch; /* static table entry: name and loader */
    struct model_hparams hp;
    struct weight tok_embd;        /* (n_embd, n_vocab) */
    struct weight output_norm;     /* (n_embd) F32 */
    struct weight output;          /* (n_embd, n_vocab); tok_embd's view when tied */
    struct layer_weights *layers;  /* (n_layer) owned */
    struct mtp_weights *mtp;       /* owned; NULL: the file has no MTP block, or it was skipped */
    struct model_open_opts opts;   /* as opened */
    struct tokenizer *tok;         /* owned; NULL when the file has no vocabulary */
    void *copy;                    /* model_load_copy's buffer (weights point into it), or NULL */
    uint64_t copy_bytes;
};

/* Opens PATH, validates it for its architecture and loads the tokenizer. 0 or -errno; the
 * message names the file and the key/tensor at fault. */
int model_open(const char *path, struct model **out);
/* model_open with options (NULL: the defaults). */
int model_open_opts(const char *path, const struct model_open_opts *opts, struct model **out);
void model_close(struct model *m);

/* Fills *w from tensor NAME checking its type is one the kernels support and its dims equal
 * ne[0..n_dims). -ENOENT / -EINVAL with a message naming the tensor otherwise. */
int model_weight_get(const struct model *m, const char *name, uint32_t n_dims,
                     const uint64_t *ne, struct weight *w);

/* Like model_weight_get but returns -ENOENT without a message when the tensor is absent. */
int model_weight_find(const struct model *m, const char *name, uint32_t n_dims,
                      const uint64_t *ne, struct weight *w);

/* Copies the file's data section into anonymous memory on 2 MiB pages (transparent huge
 * pages requested; fewer TLB misses than the page cache's 4 KiB pages when many threads read
 * scattered experts), filled by n_threads threads, and points every weight into the copy.
 * Costs the model's size in RAM. 0 or -ENOMEM. */
int model_load_copy(struct model *m, int n_threads);

/* Calls fn on every weight of the model once (a tied output is visited once); weights the
 * architecture does not have (data NULL) are skipped. */
void model_weights_each(struct model *m, void (*fn)(struct weight *w, void *arg), void *arg);

/* Bytes of one expert (gate + up + down slices) of layer l. */
uint64_t model_expert_bytes(const struct model *m, uint32_t layer);

/* ---- what the loaders share (model.c) ------------------------------------------------------ */

/* The key "{architecture}.KEY" of m's file (m->arch->name is the prefix) as gguf_get_u32 /
 * gguf_get_f32 read it: 0, -ENOENT (absent, named) or -EINVAL. model_arch_u32_or: an absent key
 * takes def (no message); present but of a wrong type is refused. */
int model_arch_u32(const struct model *m, const char *key, uint32_t *out);
int model_arch_f32(const struct model *m, const char *key, float *out);
int model_arch_u32_or(const struct model *m, const char *key, uint32_t def, uint32_t *out);

/* Refuses (-EINVAL, naming the tensor and count_key) a tensor blk.N.* with N >= n_layer: a
 * block count that disagrees with the tensors present. Missing layers are found by the loader
 * when it asks for their weights. */
int model_check_blocks(const struct model *m, const char *count_key, uint32_t n_layer);

/* Refuses (-EINVAL, naming the tensor and the element) an F32 weight holding a NaN or an
 * infinity; other types pass unread. Reads the whole tensor: meant for the small ones (norms,
 * routers). */
int model_check_finite(const struct weight *w);

#endif
