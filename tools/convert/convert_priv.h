/* convert_priv: what the pieces of the converter share (not part of its API). */
#ifndef STRATA_CONVERT_PRIV_H
#define STRATA_CONVERT_PRIV_H

#include <stdint.h>

#include "convert.h"
#include "gguf.h"

struct gguf_writer;
struct hf_ckpt;
struct safetensors_tensor;

/* The architectures strata converts: config.json's model_type / architectures[0]. */
enum convert_arch {
    CONVERT_ARCH_QWEN3MOE,  /* qwen3_moe, Qwen3MoeForCausalLM */
    CONVERT_ARCH_GPTOSS,    /* gpt_oss, GptOssForCausalLM */
    CONVERT_ARCH_QWEN3NEXT, /* qwen3_next, Qwen3NextForCausalLM */
    CONVERT_ARCH_QWEN35MOE, /* qwen3_5_moe (text_config qwen3_5_moe_text), Qwen3_5Moe* */
};

/* The hyperparameters a conversion writes (config.json read by convert.c and, for the hybrid
 * architectures, convert_hybrid.c). */
struct convert_hparams {
    enum convert_arch arch;
    uint32_t n_layer, n_embd, n_ff, n_ff_exp; /* n_layer: the main layers (num_hidden_layers) */
    uint32_t n_nextn; /* MTP blocks written after the main layers (0 or 1): block_count is
                         n_layer + n_nextn */
    uint32_t n_head, n_head_kv, head_dim;
    uint32_t n_expert, n_expert_used, n_vocab, n_ctx; /* n_ff, n_ctx: 0 when absent */
    double rms_eps, rope_base;
    bool tied;
    /* gpt-oss */
    uint32_t n_swa;     /* sliding_window */
    double yarn_factor; /* 0: no rope scaling */
    uint32_t yarn_n_ctx_orig;
    /* qwen3next, qwen35moe */
    uint32_t n_ff_shexp;         /* shared_expert_intermediate_size */
    uint32_t ssm_conv;           /* linear_conv_kernel_dim */
    uint32_t ssm_state;          /* linear_key_head_dim (= linear_value_head_dim) */
    uint32_t ssm_n_k, ssm_n_v;   /* linear_num_key_heads, linear_num_value_heads */
    uint32_t full_attn_interval; /* layer l is full attention iff (l + 1) % it == 0 */
    uint32_t n_rot;              /* rotated dims of a head: head_dim * partial_rotary_factor */
    int32_t rope_sections[4];    /* qwen35moe: mrope_section and a trailing 0 */
    char prefix[32];             /* the text model's tensors: "model." or
                                    "model.language_model." */
};

/* n_rows rows of ne0 elements of src, the first starting at element elem0, each row_step
 * elements after the one before (0: ne0, consecutive rows), its elements elem_step apart (0:
 * 1, contiguous). With scales set, src holds MXFP4 blocks as transformers stores them (U8
 * [rows, ne0 / 32, 16], scales U8 [rows, ne0 / 32]); elem0 and row_step then count those
 * rows. */
struct convert_segment {
    const struct safetensors_tensor *src;
    uint64_t elem0;
    uint64_t n_rows;
    uint64_t row_step, elem_step;
    const struct safetensors_tensor *scales;
};

/* What a tensor's values go through after they are read as floats. */
enum convert_op {
    CONVERT_OP_NONE,
    CONVERT_OP_ADD_ONE, /* x + 1: HF's x̂·(1 + w) RMSNorm weight as a plain multiplier */
    CONVERT_OP_NEG_EXP, /* -exp(x): ssm_a from A_log; must come out finite and negative */
};

struct convert_tensor {
    char name[GGUF_NAME_MAX + 1];
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    int32_t force_type; /* >= 0: this type whatever the mix (gpt-oss biases, experts) */
    bool fell_back;
    uint64_t n_rows, row_bytes; /* ne1*ne2*ne3, bytes of one output row */
    uint32_t n_seg;
    struct convert_segment *seg; /* (n_seg) owned */
    enum convert_op op;
    uint64_t *col_perm; /* (ne[0]) owned, or NULL: element i of an output row is element
                           col_perm[i] of the source row (not with MXFP4 segments) */
    int idx;            /* writer index */
};

struct convert_plan {
    uint32_t n, cap;
    struct convert_tensor *t; /* (n) owned */
};

/* Appends an output tensor with n_seg zeroed segments; NULL (-ENOMEM set) when out of memory. */
struct convert_tensor *convert_plan_add(struct convert_plan *p, const char *name, uint32_t n_dims,
                                        const uint64_t *ne, uint32_t n_seg);

/* Looks up HF tensor NAME (marking it used) and checks that its dtype is F32, BF16 or F16
 * and its PyTorch-order shape is shape. 0, -ENOENT, -ENOTSUP (dtype) or -EINVAL (shape),
 * naming the tensor. */
int convert_hf_get(struct hf_ckpt *c, const char *name, uint32_t n_dims, const uint64_t *shape,
                   const struct safetensors_tensor **out);

/* A GGUF tensor that is one whole HF tensor of PyTorch shape `shape` (ne = reversed shape). */
int convert_plan_direct(struct convert_plan *p, struct hf_ckpt *c, const char *gguf_name,
                        const char *hf_name, uint32_t n_dims, const uint64_t *shape);

/* blk.L.ffn_{gate,up,down}_exps from the per-expert or fused HF tensors under layer prefix lp
 * ("model.layers.L."): SwiGLU experts of hp->n_ff_exp, concatenated gate|up when fused. */
int convert_plan_experts(struct convert_plan *p, struct hf_ckpt *c,
                         const struct convert_hparams *hp, uint32_t l, const char *lp);

/* qwen3next / qwen35moe (convert_hybrid.c). Reads the architecture's sizes once the key
 * audit has passed (c reads the text config); 0 or -errno naming the key. */
int convert_hybrid_hparams(const struct convert_config *cfg, struct hf_ckpt *c,
                           struct convert_hparams *hp);
/* Adds the keys under "ARCH." that only the hybrid architectures have. */
int convert_hybrid_add_hparams(struct gguf_writer *w, const struct convert_hparams *hp,
                               const char *arch);
/* Plans every tensor of the text model (docs/convert-keys.md, FORMATS §4(c), §4(f)). */
int convert_hybrid_plan(const struct convert_config *cfg, struct convert_plan *p, struct hf_ckpt *c,
                        const struct convert_hparams *hp);

/* Sends a NOTICE event to cfg->progress (printf-style). */
void convert_notice(const struct convert_config *cfg, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Sends a WARNING event to cfg->progress (printf-style). */
void convert_warning(const struct convert_config *cfg, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Checks every member of c's config.json (and of its rope_scaling / rope_parameters objects)
 * against the architecture's key table of convert_keys.c (docs/convert-keys.md). 0, or
 * -ENOTSUP naming the key, its value and why for a value strata does not compute, for keys
 * that transformers versions read differently and disagree, and for a key the table lacks (a
 * WARNING event instead when cfg->allow_unknown_keys); -EINVAL for a malformed rope_theta. */
int convert_keys_check(const struct convert_config *cfg, const struct hf_ckpt *c,
                       enum convert_arch arch);

/* Adds the tokenizer.* keys from c's tokenizer.json (+ tokenizer_config.json, chat_template.jinja),
 * padded to n_vocab tokens; *n_written receives the token count. 0 or -errno. */
int convert_vocab_add(const struct convert_config *cfg, struct hf_ckpt *c, struct gguf_writer *w,
                      uint32_t n_vocab, uint32_t *n_written);

#endif
