/* convert_keys: the audit of config.json, one table per architecture (qwen3moe, gpt-oss,
 * qwen3next, qwen35moe: its outer config and its text_config).
 *
 * Every key is in the table with what strata does with it:
 *   IMPLEMENTED  its value reaches the GGUF (read_hparams in convert.c, convert_vocab.c);
 *   NO_EFFECT    transformers' forward does not read it for inference logits;
 *   CHECKED      only the value strata computes is accepted; any other value is refused with
 *                an error that names the key, the value and why.
 * A key the table lacks is refused ("strata does not know whether it changes the computation")
 * unless cfg->allow_unknown_keys, which turns each one into a warning. Object values
 * (rope_scaling, rope_parameters) are checked member by member against their own table.
 * JSON null reads as absent, as everywhere in the converter. docs/convert-keys.md is this
 * table in prose, with the reasons at length.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <json-c/json.h>

#include "convert_priv.h"
#include "errors.h"
#include "hf_ckpt.h"

enum key_kind {
    KEY_IMPLEMENTED,
    KEY_NO_EFFECT,
    KEY_CHECKED,
};

struct key_table;

struct key_rule {
    const char *key;
    enum key_kind kind;
    bool (*ok)(json_object *v);  /* CHECKED: accepts a present, non-null value */
    const char *absent;          /* CHECKED: transformers' default when absent or null, if
                                    strata does not compute it; NULL when absence is fine */
    bool (*applies)(json_object *obj); /* CHECKED with absent: whether absence matters in this
                                          enclosing object (NULL: always) */
    const struct key_table *sub; /* an object value's members are checked against this */
    const char *why; /* IMPLEMENTED: where it goes; NO_EFFECT: why; CHECKED: why others fail */
};

struct key_table {
    const struct key_rule *rules;
    size_t n;
};

/* ---- predicates of CHECKED keys ----------------------------------------------------------- */

static bool is_number(json_object *v)
{
    return json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double);
}

static bool ok_true(json_object *v)
{
    return json_object_is_type(v, json_type_boolean) && json_object_get_boolean(v);
}

static bool ok_false(json_object *v)
{
    return json_object_is_type(v, json_type_boolean) && !json_object_get_boolean(v);
}

static bool ok_one(json_object *v)
{
    return is_number(v) && json_object_get_double(v) == 1.0;
}

static bool ok_zero(json_object *v)
{
    return is_number(v) && json_object_get_double(v) == 0.0;
}

static bool ok_empty_array(json_object *v)
{
    return json_object_is_type(v, json_type_array) && json_object_array_length(v) == 0;
}

static bool ok_object(json_object *v)
{
    return json_object_is_type(v, json_type_object);
}

static bool ok_never(json_object *v)
{
    (void)v;
    return false;
}

/* silu; transformers' ACT2FN maps "swish" to the same function */
static bool ok_silu(json_object *v)
{
    const char *s = json_object_is_type(v, json_type_string) ? json_object_get_string(v) : "";
    return !strcmp(s, "silu") || !strcmp(s, "swish");
}

static bool ok_rope_default(json_object *v)
{
    return json_object_is_type(v, json_type_string) &&
           !strcmp(json_object_get_string(v), "default");
}

static bool ok_yarn(json_object *v)
{
    const char *s = json_object_is_type(v, json_type_string) ? json_object_get_string(v) : "";
    return !strcmp(s, "yarn") || !strcmp(s, "default");
}

/* A rope_parameters / rope_scaling object whose type is YaRN. */
static bool rope_is_yarn(json_object *obj)
{
    json_object *v;
    if (!json_object_object_get_ex(obj, "rope_type", &v) || !v)
        json_object_object_get_ex(obj, "type", &v);
    return v && json_object_is_type(v, json_type_string) &&
           !strcmp(json_object_get_string(v), "yarn");
}

static bool ok_32(json_object *v)
{
    return is_number(v) && json_object_get_double(v) == 32.0;
}

static bool ok_7(json_object *v)
{
    return is_number(v) && json_object_get_double(v) == 7.0;
}

static bool ok_mxfp4(json_object *v)
{
    return json_object_is_type(v, json_type_string) && !strcmp(json_object_get_string(v), "mxfp4");
}

/* gpt-oss's layers alternate sliding and full attention, sliding first (the GGUF's default
 * sliding_window_pattern 2) */
static bool ok_alternating(json_object *v)
{
    if (!json_object_is_type(v, json_type_array))
        return false;
    for (size_t i = 0; i < json_object_array_length(v); i++) {
        json_object *e = json_object_array_get_idx(v, i);
        const char *want = i % 2 ? "full_attention" : "sliding_attention";
        if (!json_object_is_type(e, json_type_string) || strcmp(json_object_get_string(e), want))
            return false;
    }
    return true;
}

static bool ok_all_full_attention(json_object *v)
{
    if (!json_object_is_type(v, json_type_array))
        return false;
    for (size_t i = 0; i < json_object_array_length(v); i++) {
        json_object *e = json_object_array_get_idx(v, i);
        if (!json_object_is_type(e, json_type_string) ||
            strcmp(json_object_get_string(e), "full_attention"))
            return false;
    }
    return true;
}

/* Qwen3-Next / Qwen3.5 layer types: "linear_attention" or "full_attention" (transformers also
 * reads the legacy "mamba" and "attention"); the pattern itself is checked in
 * convert_hybrid.c against full_attention_interval. */
static bool ok_hybrid_layer_types(json_object *v)
{
    if (!json_object_is_type(v, json_type_array))
        return false;
    for (size_t i = 0; i < json_object_array_length(v); i++) {
        json_object *e = json_object_array_get_idx(v, i);
        const char *s = json_object_is_type(e, json_type_string) ? json_object_get_string(e) : "";
        if (strcmp(s, "linear_attention") && strcmp(s, "full_attention") && strcmp(s, "mamba") &&
            strcmp(s, "attention"))
            return false;
    }
    return true;
}

/* mrope_section: three non-negative integers (the sum is checked in convert_hybrid.c) */
static bool ok_mrope_section(json_object *v)
{
    if (!json_object_is_type(v, json_type_array) || json_object_array_length(v) != 3)
        return false;
    for (size_t i = 0; i < 3; i++) {
        json_object *e = json_object_array_get_idx(v, i);
        if (!json_object_is_type(e, json_type_int) || json_object_get_int64(e) < 0)
            return false;
    }
    return true;
}

static bool ok_number(json_object *v)
{
    return is_number(v);
}

/* ---- the tables --------------------------------------------------------------------------- */

/* clang-format off */
#define IMPL(k, w) {.key = k, .kind = KEY_IMPLEMENTED, .why = w}
#define NONE(k, w) {.key = k, .kind = KEY_NO_EFFECT, .why = w}
#define CHECK(k, f, w) {.key = k, .kind = KEY_CHECKED, .ok = f, .why = w}
/* clang-format on */
#define ROPE_TYPE_ONLY_DEFAULT                                                                     \
    "strata's qwen3moe forward implements plain RoPE (rope type default); the scaling types "      \
    "(linear, dynamic, yarn, longrope, llama3) change the rotation frequencies or scale the "      \
    "attention"
#define ROPE_SCALING_ONLY                                                                          \
    "read only by the rope scaling types, which are refused; default RoPE does not read it"

/* Keys of every architecture's config that transformers' forward does not read. */
#define COMMON_NO_EFFECT                                                                           \
    NONE("attention_dropout", "dropout acts in training only"),                                    \
    NONE("router_aux_loss_coef", "a training loss term"),                                          \
    NONE("output_router_logits", "adds router logits to the outputs; logits unchanged"),           \
    NONE("initializer_range", "initialisation of weights the checkpoint does not hold"),           \
    NONE("use_cache", "the KV cache gives the same logits"),                                       \
    NONE("torch_dtype", "the dtype transformers loads into; strata reads the file's dtypes"),      \
    NONE("dtype", "the dtype transformers loads into; strata reads the file's dtypes"),            \
    NONE("transformers_version", "the version that wrote the file"),                               \
    NONE("_name_or_path", "where the model was loaded from"),                                      \
    NONE("output_attentions", "selects extra outputs"),                                            \
    NONE("output_hidden_states", "selects extra outputs"),                                         \
    NONE("return_dict", "selects the output container"),                                           \
    NONE("id2label", "labels of classification heads"),                                            \
    NONE("label2id", "labels of classification heads"),                                            \
    NONE("tokenizer_class", "strata reads tokenizer.json itself")

/* Members of rope_scaling (transformers 4.x) and rope_parameters (5.x). */
static const struct key_rule rope_rules[] = {
    CHECK("rope_type", ok_rope_default, ROPE_TYPE_ONLY_DEFAULT),
    CHECK("type", ok_rope_default, ROPE_TYPE_ONLY_DEFAULT), /* the transformers 4.x spelling */
    IMPL("rope_theta", "rope.freq_base"),
    CHECK("partial_rotary_factor", ok_one,
          "strata rotates the whole head (partial_rotary_factor 1); transformers versions "
          "differ on whether Qwen3MoE reads it"),
    NONE("factor", ROPE_SCALING_ONLY),
    NONE("original_max_position_embeddings", ROPE_SCALING_ONLY),
    NONE("attention_factor", ROPE_SCALING_ONLY),
    NONE("beta_fast", ROPE_SCALING_ONLY),
    NONE("beta_slow", ROPE_SCALING_ONLY),
    NONE("mscale", ROPE_SCALING_ONLY),
    NONE("mscale_all_dim", ROPE_SCALING_ONLY),
    NONE("low_freq_factor", ROPE_SCALING_ONLY),
    NONE("high_freq_factor", ROPE_SCALING_ONLY),
    NONE("short_factor", ROPE_SCALING_ONLY),
    NONE("long_factor", ROPE_SCALING_ONLY),
    NONE("truncate", ROPE_SCALING_ONLY),
};
static const struct key_table rope_table = {rope_rules, sizeof(rope_rules) / sizeof(rope_rules[0])};

/* config.json of Qwen3MoeForCausalLM (model_type qwen3_moe), transformers 4.x and 5.x. */
static const struct key_rule qwen3moe_rules[] = {
    IMPL("architectures", "selects the architecture: general.architecture qwen3moe"),
    IMPL("model_type", "selects the architecture: general.architecture qwen3moe"),
    IMPL("hidden_size", "embedding_length"),
    IMPL("num_hidden_layers", "block_count"),
    IMPL("num_attention_heads", "attention.head_count"),
    IMPL("num_key_value_heads", "attention.head_count_kv (required)"),
    IMPL("head_dim", "attention.key_length, attention.value_length"),
    IMPL("intermediate_size", "feed_forward_length (the dense MLP; every layer is MoE)"),
    IMPL("moe_intermediate_size", "expert_feed_forward_length"),
    IMPL("num_experts", "expert_count"),
    IMPL("num_local_experts", "expert_count (transformers 5.x spelling of num_experts)"),
    IMPL("num_experts_per_tok", "expert_used_count"),
    IMPL("vocab_size", "rows of token_embd and output; the vocabulary is padded to it"),
    IMPL("max_position_embeddings", "context_length"),
    IMPL("rms_norm_eps", "attention.layer_norm_rms_epsilon"),
    IMPL("rope_theta", "rope.freq_base"),
    IMPL("tie_word_embeddings", "true: no output.weight, the output head is token_embd"),
    IMPL("bos_token_id", "tokenizer.ggml.bos_token_id unless tokenizer_config.json names it"),
    IMPL("eos_token_id", "tokenizer.ggml.eos_token_id unless tokenizer_config.json names it"),
    IMPL("pad_token_id", "tokenizer.ggml.padding_token_id unless tokenizer_config.json names it "
                         "(the embedding's padding_idx only shapes initialisation)"),
    {.key = "rope_scaling",
     .kind = KEY_CHECKED,
     .ok = ok_object,
     .sub = &rope_table,
     .why = "it must be an object of rope parameters (or null)"},
    {.key = "rope_parameters",
     .kind = KEY_CHECKED,
     .ok = ok_object,
     .sub = &rope_table,
     .why = "it must be an object of rope parameters (or null)"},
    {.key = "norm_topk_prob",
     .kind = KEY_CHECKED,
     .ok = ok_true,
     .absent = "false",
     .why = "with norm_topk_prob false transformers weights the top-k experts by their softmax "
            "probabilities as they are; strata always renormalizes them to sum 1 (norm_topk_prob "
            "true), so its logits would differ"},
    CHECK("hidden_act", ok_silu, "strata's experts compute SwiGLU with silu"),
    CHECK("attention_bias", ok_false, "strata's attention projections have no bias"),
    CHECK("use_sliding_window", ok_false, "strata attends to the whole context"),
    CHECK("decoder_sparse_step", ok_one, "strata's qwen3moe layers are all MoE (no dense MLP)"),
    CHECK("mlp_only_layers", ok_empty_array, "strata's qwen3moe layers are all MoE (no dense MLP)"),
    CHECK("layer_types", ok_all_full_attention, "strata's qwen3moe layers all use full attention"),
    CHECK("partial_rotary_factor", ok_one, "strata rotates the whole head"),
    CHECK("shared_expert_intermediate_size", ok_zero, "qwen3moe has no shared expert"),
    CHECK("use_qk_norm", ok_true, "strata's qwen3moe attention always has q_norm and k_norm"),
    CHECK("qk_norm", ok_true, "strata's qwen3moe attention always has q_norm and k_norm"),
    CHECK("quantization_config", ok_never,
          "the weights are quantized; strata convert reads F32, BF16 and F16 weights"),
    NONE("sliding_window", "transformers sets it to None unless use_sliding_window (refused)"),
    NONE("max_window_layers", "not read by transformers' Qwen3MoE"),
    COMMON_NO_EFFECT,
};
static const struct key_table qwen3moe_table = {qwen3moe_rules,
                                                sizeof(qwen3moe_rules) / sizeof(qwen3moe_rules[0])};

/* ---- qwen3next, qwen35moe ---- */

#define HYBRID_ROPE_DEFAULT                                                                        \
    "strata's qwen3next / qwen35moe attention implements plain partial RoPE (rope type "           \
    "default); the scaling types (linear, dynamic, yarn, longrope, llama3) change the rotation "   \
    "frequencies or scale the attention"
#define HYBRID_RPF "rope.dimension_count = head_dim x partial_rotary_factor (default 0.25)"

/* Members of Qwen3-Next's rope_scaling (4.x) / rope_parameters (5.x). */
static const struct key_rule qwen3next_rope_rules[] = {
    CHECK("rope_type", ok_rope_default, HYBRID_ROPE_DEFAULT),
    CHECK("type", ok_rope_default, HYBRID_ROPE_DEFAULT),
    IMPL("rope_theta", "rope.freq_base"),
    {.key = "partial_rotary_factor",
     .kind = KEY_CHECKED,
     .ok = ok_number,
     .why = HYBRID_RPF "; it must be a number"},
    NONE("factor", ROPE_SCALING_ONLY),
    NONE("original_max_position_embeddings", ROPE_SCALING_ONLY),
    NONE("attention_factor", ROPE_SCALING_ONLY),
    NONE("beta_fast", ROPE_SCALING_ONLY),
    NONE("beta_slow", ROPE_SCALING_ONLY),
    NONE("mscale", ROPE_SCALING_ONLY),
    NONE("mscale_all_dim", ROPE_SCALING_ONLY),
    NONE("low_freq_factor", ROPE_SCALING_ONLY),
    NONE("high_freq_factor", ROPE_SCALING_ONLY),
    NONE("short_factor", ROPE_SCALING_ONLY),
    NONE("long_factor", ROPE_SCALING_ONLY),
    NONE("truncate", ROPE_SCALING_ONLY),
};
static const struct key_table qwen3next_rope_table = {
    qwen3next_rope_rules, sizeof(qwen3next_rope_rules) / sizeof(qwen3next_rope_rules[0])};

/* Qwen3.5's: the same, plus the M-RoPE sections of its vision positions. */
static const struct key_rule qwen35_rope_rules[] = {
    CHECK("rope_type", ok_rope_default, HYBRID_ROPE_DEFAULT),
    CHECK("type", ok_rope_default, HYBRID_ROPE_DEFAULT),
    IMPL("rope_theta", "rope.freq_base"),
    {.key = "partial_rotary_factor",
     .kind = KEY_CHECKED,
     .ok = ok_number,
     .why = HYBRID_RPF "; it must be a number"},
    CHECK("mrope_section", ok_mrope_section,
          "rope.dimension_sections [t, h, w, 0]: three non-negative integers whose sum is half "
          "of rope.dimension_count"),
    NONE("mrope_interleaved", "text tokens have the same t, h and w positions, so how the "
                              "sections interleave does not change their rotation"),
    NONE("factor", ROPE_SCALING_ONLY),
    NONE("original_max_position_embeddings", ROPE_SCALING_ONLY),
    NONE("attention_factor", ROPE_SCALING_ONLY),
    NONE("beta_fast", ROPE_SCALING_ONLY),
    NONE("beta_slow", ROPE_SCALING_ONLY),
    NONE("mscale", ROPE_SCALING_ONLY),
    NONE("mscale_all_dim", ROPE_SCALING_ONLY),
    NONE("low_freq_factor", ROPE_SCALING_ONLY),
    NONE("high_freq_factor", ROPE_SCALING_ONLY),
    NONE("short_factor", ROPE_SCALING_ONLY),
    NONE("long_factor", ROPE_SCALING_ONLY),
    NONE("truncate", ROPE_SCALING_ONLY),
};
static const struct key_table qwen35_rope_table = {
    qwen35_rope_rules, sizeof(qwen35_rope_rules) / sizeof(qwen35_rope_rules[0])};

/* The keys Qwen3-Next's config and Qwen3.5-MoE's text_config share; `rope` is the table of
 * their rope objects. */
/* clang-format off */
#define HYBRID_RULES(rope)                                                                         \
    IMPL("hidden_size", "embedding_length"),                                                       \
    IMPL("num_hidden_layers", "block_count"),                                                      \
    IMPL("num_attention_heads", "attention.head_count"),                                           \
    IMPL("num_key_value_heads", "attention.head_count_kv (required)"),                            \
    IMPL("head_dim", "attention.key_length, attention.value_length (default 256)"),              \
    IMPL("moe_intermediate_size", "expert_feed_forward_length"),                                   \
    IMPL("shared_expert_intermediate_size", "expert_shared_feed_forward_length"),                  \
    IMPL("num_experts", "expert_count"),                                                           \
    IMPL("num_experts_per_tok", "expert_used_count"),                                              \
    IMPL("vocab_size", "rows of token_embd and output; the vocabulary is padded to it"),          \
    IMPL("max_position_embeddings", "context_length"),                                             \
    IMPL("rms_norm_eps", "attention.layer_norm_rms_epsilon"),                                      \
    IMPL("rope_theta", "rope.freq_base"),                                                          \
    IMPL("partial_rotary_factor", HYBRID_RPF),                                                     \
    IMPL("linear_conv_kernel_dim", "ssm.conv_kernel (default 4)"),                                \
    IMPL("linear_key_head_dim", "ssm.state_size (default 128)"),                                  \
    IMPL("linear_value_head_dim", "must equal linear_key_head_dim (strata's GDN state is "        \
                                  "square); checked in convert_hybrid.c"),                         \
    IMPL("linear_num_key_heads", "ssm.group_count (default 16)"),                                 \
    IMPL("linear_num_value_heads", "ssm.time_step_rank, ssm.inner_size (default 32); a "          \
                                   "multiple of linear_num_key_heads"),                            \
    IMPL("full_attention_interval", "full_attention_interval (default 4)"),                       \
    IMPL("tie_word_embeddings", "true: no output.weight, the output head is token_embd"),          \
    IMPL("bos_token_id", "tokenizer.ggml.bos_token_id unless tokenizer_config.json names it"),    \
    IMPL("eos_token_id", "tokenizer.ggml.eos_token_id unless tokenizer_config.json names it"),    \
    IMPL("pad_token_id", "tokenizer.ggml.padding_token_id unless tokenizer_config.json names it"), \
    {.key = "rope_scaling",                                                                        \
     .kind = KEY_CHECKED,                                                                          \
     .ok = ok_object,                                                                              \
     .sub = &(rope),                                                                               \
     .why = "it must be an object of rope parameters (or null)"},                                 \
    {.key = "rope_parameters",                                                                     \
     .kind = KEY_CHECKED,                                                                          \
     .ok = ok_object,                                                                              \
     .sub = &(rope),                                                                               \
     .why = "it must be an object of rope parameters (or null)"},                                 \
    CHECK("layer_types", ok_hybrid_layer_types,                                                    \
          "strata's layers are linear_attention (Gated DeltaNet) or full_attention, full "        \
          "attention exactly at the layers l with (l + 1) % full_attention_interval == 0 "        \
          "(checked in convert_hybrid.c)"),                                                       \
    CHECK("norm_topk_prob", ok_true,                                                               \
          "strata always renormalizes the top-k expert weights to sum 1 (transformers' default " \
          "true); with false transformers would weight them by their softmax probabilities as "   \
          "they are"),                                                                             \
    CHECK("hidden_act", ok_silu,                                                                   \
          "strata computes SwiGLU experts and the Gated DeltaNet convolution's activation with "  \
          "silu"),                                                                                 \
    CHECK("attention_bias", ok_false, "strata's attention projections have no bias"),             \
    CHECK("attn_output_gate", ok_true,                                                             \
          "strata's full attention always multiplies by sigmoid(gate) from q_proj's second half " \
          "per head; transformers does too and does not read the key, but a checkpoint that "     \
          "says false was made for an ungated attention"),                                        \
    CHECK("decoder_sparse_step", ok_one,                                                           \
          "strata's layers are all MoE: another step makes layer 0 (and others) a dense MLP"),    \
    CHECK("mlp_only_layers", ok_empty_array,                                                       \
          "strata's layers are all MoE: the listed layers would be dense MLPs"),                  \
    CHECK("use_sliding_window", ok_false, "strata's full attention layers see the whole context"), \
    CHECK("quantization_config", ok_never,                                                         \
          "the weights are quantized; strata convert reads F32, BF16 and F16 weights"),            \
    NONE("intermediate_size", "the dense MLP's width; no layer is dense (decoder_sparse_step, "   \
                              "mlp_only_layers), so it is not read"),                              \
    NONE("sliding_window", "no layer uses a sliding window (use_sliding_window is refused)"),     \
    NONE("max_window_layers", "not read by transformers' Qwen3-Next or Qwen3.5"),                 \
    IMPL("mtp_num_hidden_layers", "the multi-token-prediction head: 1 writes block "              \
                                  "num_hidden_layers (nextn), block_count + 1 and "               \
                                  "nextn_predict_layers 1 (unless --no-mtp); more is refused in " \
                                  "convert_hybrid.c"),                                             \
    IMPL("mtp_use_dedicated_embeddings", "must be false or absent when the MTP head is kept "     \
                                         "(it reads token_embd and output); checked in "          \
                                         "convert_hybrid.c"),                                      \
    NONE("mamba_ssm_dtype", "the dtype other engines keep the recurrent state in; transformers " \
                            "does not read it, strata keeps it in F32"),                           \
    COMMON_NO_EFFECT
/* clang-format on */

/* config.json of Qwen3NextForCausalLM (model_type qwen3_next), transformers 4.57+ and 5.x. */
static const struct key_rule qwen3next_rules[] = {
    IMPL("architectures", "selects the architecture: general.architecture qwen3next"),
    IMPL("model_type", "selects the architecture: general.architecture qwen3next"),
    HYBRID_RULES(qwen3next_rope_table),
};
static const struct key_table qwen3next_table = {qwen3next_rules, sizeof(qwen3next_rules) /
                                                                      sizeof(qwen3next_rules[0])};

/* text_config of Qwen3_5MoeForConditionalGeneration (model_type qwen3_5_moe_text), or the whole
 * config.json of a text-only Qwen3_5MoeForCausalLM. */
static const struct key_rule qwen35moe_text_rules[] = {
    IMPL("architectures", "selects the architecture: general.architecture qwen35moe"),
    IMPL("model_type", "selects the architecture: general.architecture qwen35moe"),
    IMPL("mrope_section", "rope.dimension_sections [t, h, w, 0] (default [11, 11, 10])"),
    HYBRID_RULES(qwen35_rope_table),
};
static const struct key_table qwen35moe_text_table = {
    qwen35moe_text_rules, sizeof(qwen35moe_text_rules) / sizeof(qwen35moe_text_rules[0])};

#define VISION_ONLY                                                                                \
    "read by the vision tower and the image/video input path only; strata converts the text "      \
    "model (model.visual.* is dropped)"

/* config.json of Qwen3_5MoeForConditionalGeneration (model_type qwen3_5_moe). */
static const struct key_rule qwen35moe_rules[] = {
    IMPL("architectures", "selects the architecture: general.architecture qwen35moe"),
    IMPL("model_type", "selects the architecture: general.architecture qwen35moe"),
    {.key = "text_config",
     .kind = KEY_CHECKED,
     .ok = ok_object,
     .sub = &qwen35moe_text_table,
     .why = "it must be an object: the text model's config"},
    IMPL("tie_word_embeddings", "true: no output.weight (must agree with text_config's)"),
    IMPL("bos_token_id", "tokenizer.ggml.bos_token_id unless text_config or "
                         "tokenizer_config.json names it"),
    IMPL("eos_token_id", "tokenizer.ggml.eos_token_id unless text_config or "
                         "tokenizer_config.json names it"),
    IMPL("pad_token_id", "tokenizer.ggml.padding_token_id unless text_config or "
                         "tokenizer_config.json names it"),
    NONE("vision_config", VISION_ONLY),
    NONE("image_token_id", VISION_ONLY),
    NONE("video_token_id", VISION_ONLY),
    NONE("vision_start_token_id", VISION_ONLY),
    NONE("vision_end_token_id", VISION_ONLY),
    COMMON_NO_EFFECT,
};
static const struct key_table qwen35moe_table = {qwen35moe_rules, sizeof(qwen35moe_rules) /
                                                                      sizeof(qwen35moe_rules[0])};
#undef VISION_ONLY
#undef HYBRID_RULES
#undef HYBRID_ROPE_DEFAULT
#undef HYBRID_RPF

#define YARN_ONLY "strata's gpt-oss forward implements YaRN (rope type yarn) or plain RoPE"

/* Members of gpt-oss's rope_scaling / rope_parameters: YaRN as transformers computes it. */
static const struct key_rule gptoss_rope_rules[] = {
    CHECK("rope_type", ok_yarn, YARN_ONLY),
    CHECK("type", ok_yarn, YARN_ONLY),
    IMPL("rope_theta", "rope.freq_base"),
    IMPL("factor", "rope.scaling.factor"),
    IMPL("original_max_position_embeddings", "rope.scaling.original_context_length"),
    CHECK("beta_fast", ok_32, "strata's YaRN uses beta_fast 32 (the GGUF has no key for it)"),
    CHECK("beta_slow", ok_one, "strata's YaRN uses beta_slow 1 (the GGUF has no key for it)"),
    {.key = "truncate",
     .kind = KEY_CHECKED,
     .ok = ok_false,
     .absent = "true",
     .applies = rope_is_yarn,
     .why = "strata's gpt-oss YaRN does not round the correction range (truncate false, as "
            "gpt-oss's config sets it)"},
    CHECK("attention_factor", ok_never,
          "strata scales by 0.1 ln(factor) + 1, the value transformers computes when it is absent"),
    CHECK("mscale", ok_never, "read by DeepSeek's YaRN variant only; strata does not compute it"),
    CHECK("mscale_all_dim", ok_never,
          "read by DeepSeek's YaRN variant only; strata does not compute it"),
    CHECK("partial_rotary_factor", ok_one, "strata rotates the whole head"),
};
static const struct key_table gptoss_rope_table = {
    gptoss_rope_rules, sizeof(gptoss_rope_rules) / sizeof(gptoss_rope_rules[0])};

/* quantization_config of the published gpt-oss checkpoints: MXFP4 experts, read as they are. */
static const struct key_rule gptoss_quant_rules[] = {
    CHECK("quant_method", ok_mxfp4, "strata convert reads MXFP4 expert blocks, no other method"),
    NONE("modules_to_not_convert", "names the modules left unquantized; strata reads each "
                                   "tensor's dtype"),
};
static const struct key_table gptoss_quant_table = {
    gptoss_quant_rules, sizeof(gptoss_quant_rules) / sizeof(gptoss_quant_rules[0])};

/* config.json of GptOssForCausalLM (model_type gpt_oss), transformers 4.55+ and 5.x. */
static const struct key_rule gptoss_rules[] = {
    IMPL("architectures", "selects the architecture: general.architecture gpt-oss"),
    IMPL("model_type", "selects the architecture: general.architecture gpt-oss"),
    IMPL("hidden_size", "embedding_length"),
    IMPL("num_hidden_layers", "block_count"),
    IMPL("num_attention_heads", "attention.head_count"),
    IMPL("num_key_value_heads", "attention.head_count_kv (required)"),
    IMPL("head_dim", "attention.key_length, attention.value_length"),
    IMPL("intermediate_size", "expert_feed_forward_length (and feed_forward_length)"),
    IMPL("num_local_experts", "expert_count"),
    IMPL("num_experts_per_tok", "expert_used_count"),
    IMPL("vocab_size", "rows of token_embd and output; the vocabulary is padded to it"),
    IMPL("max_position_embeddings", "context_length"),
    IMPL("rms_norm_eps", "attention.layer_norm_rms_epsilon"),
    IMPL("rope_theta", "rope.freq_base"),
    IMPL("sliding_window", "attention.sliding_window"),
    IMPL("tie_word_embeddings", "true: no output.weight, the output head is token_embd"),
    IMPL("bos_token_id", "tokenizer.ggml.bos_token_id unless tokenizer_config.json names it"),
    IMPL("eos_token_id", "tokenizer.ggml.eos_token_id unless tokenizer_config.json names it"),
    IMPL("pad_token_id", "tokenizer.ggml.padding_token_id unless tokenizer_config.json names it"),
    {.key = "rope_scaling",
     .kind = KEY_CHECKED,
     .ok = ok_object,
     .sub = &gptoss_rope_table,
     .why = "it must be an object of rope parameters (or null)"},
    {.key = "rope_parameters",
     .kind = KEY_CHECKED,
     .ok = ok_object,
     .sub = &gptoss_rope_table,
     .why = "it must be an object of rope parameters (or null)"},
    {.key = "quantization_config",
     .kind = KEY_CHECKED,
     .ok = ok_object,
     .sub = &gptoss_quant_table,
     .why = "it must be an object"},
    CHECK("layer_types", ok_alternating,
          "strata's gpt-oss layers alternate sliding and full attention, sliding first"),
    CHECK("attention_bias", ok_true, "strata's gpt-oss attention projections have biases"),
    CHECK("swiglu_limit", ok_7, "strata's experts clamp at 7 (cpu_kernels/expert_ffn.h)"),
    CHECK("partial_rotary_factor", ok_one, "strata rotates the whole head"),
    NONE("hidden_act", "gpt-oss's experts compute their clamped SwiGLU whatever it says"),
    NONE("experts_per_token", "the original config's name; transformers reads num_experts_per_tok"),
    NONE("initial_context_length", "the original config's name; transformers reads "
                                   "rope_scaling.original_max_position_embeddings"),
    COMMON_NO_EFFECT,
};
static const struct key_table gptoss_table = {gptoss_rules,
                                              sizeof(gptoss_rules) / sizeof(gptoss_rules[0])};
#undef YARN_ONLY

#undef COMMON_NO_EFFECT
#undef IMPL
#undef NONE
#undef CHECK
#undef ROPE_TYPE_ONLY_DEFAULT
#undef ROPE_SCALING_ONLY

/* ---- the audit ---------------------------------------------------------------------------- */

static const struct key_rule *rule_find(const struct key_table *t, const char *key)
{
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(t->rules[i].key, key))
            return &t->rules[i];
    return NULL;
}

/* The JSON text of v, cut to fit buf. */
static const char *value_str(json_object *v, char *buf, size_t size)
{
    const char *s = json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN);
    if (strlen(s) < size)
        return memcpy(buf, s, strlen(s) + 1);
    snprintf(buf, size, "%.*s...", (int)size - 4, s);
    return buf;
}

/* Checks the members of obj against t; prefix names the enclosing key ("" at the top). */
static int audit_object(const struct convert_config *cfg, const struct hf_ckpt *c,
                        const struct key_table *t, const char *prefix, json_object *obj)
{
    char val[96], path[160];

    json_object_object_foreach(obj, key, v)
    {
        const struct key_rule *r = rule_find(t, key);
        snprintf(path, sizeof(path), "%s%s%s", prefix, *prefix ? "." : "", key);
        if (!r) {
            value_str(v, val, sizeof(val));
            if (!cfg->allow_unknown_keys)
                return err_set(-ENOTSUP,
                               "%s/config.json: unknown config key %s (= %s): strata does not "
                               "know whether it changes the computation (--allow-unknown-keys "
                               "converts anyway, with a warning)",
                               c->dir, path, val);
            convert_warning(cfg,
                            "unknown config key %s (= %s) ignored: strata does not know whether "
                            "it changes the computation",
                            path, val);
            continue;
        }
        if (r->kind != KEY_CHECKED || !v)
            continue;
        if (!r->ok(v))
            return err_set(-ENOTSUP, "%s/config.json: %s = %s is not supported: %s", c->dir, path,
                           value_str(v, val, sizeof(val)), r->why);
        if (r->sub) {
            int rc = audit_object(cfg, c, r->sub, path, v);
            if (rc)
                return rc;
        }
    }
    for (size_t i = 0; i < t->n; i++) {
        const struct key_rule *r = &t->rules[i];
        json_object *v;
        if (r->absent && (!r->applies || r->applies(obj)) &&
            (!json_object_object_get_ex(obj, r->key, &v) || !v)) {
            snprintf(path, sizeof(path), "%s%s%s", prefix, *prefix ? "." : "", r->key);
            return err_set(-ENOTSUP,
                           "%s/config.json: %s is absent, which transformers reads as %s; that is "
                           "not supported: %s",
                           c->dir, path, r->absent, r->why);
        }
    }
    return 0;
}

/* Member key of obj, or NULL when obj is not an object or the member is absent or null. */
static json_object *member(json_object *obj, const char *key)
{
    json_object *v;
    if (!obj || !json_object_is_type(obj, json_type_object) ||
        !json_object_object_get_ex(obj, key, &v))
        return NULL;
    return v;
}

/* Keys that must agree where transformers versions read different ones: the rope base
 * (4.x reads the top-level rope_theta, 5.x the one inside rope_scaling or rope_parameters) and
 * the expert count (5.x reads num_experts as num_local_experts). */
static int audit_agreement(const struct hf_ckpt *c)
{
    static const char *const at[] = {NULL, "rope_scaling", "rope_parameters"};
    static const char *const name[] = {"rope_theta", "rope_scaling.rope_theta",
                                       "rope_parameters.rope_theta"};
    json_object *ne = hf_ckpt_config_get(c, "num_experts");
    json_object *nle = hf_ckpt_config_get(c, "num_local_experts");
    json_object *first = NULL;
    size_t first_i = 0;
    char a[96], b[96];

    for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
        json_object *v = at[i] ? member(hf_ckpt_config_get(c, at[i]), "rope_theta")
                               : hf_ckpt_config_get(c, "rope_theta");
        if (!v)
            continue;
        if (!is_number(v))
            return err_set(-EINVAL, "%s/config.json: %s is %s, expected a number", c->dir, name[i],
                           value_str(v, a, sizeof(a)));
        if (!first) {
            first = v;
            first_i = i;
        } else if (json_object_get_double(first) != json_object_get_double(v)) {
            return err_set(-ENOTSUP,
                           "%s/config.json: %s = %s and %s = %s differ; transformers versions "
                           "read different ones, so the rope base is ambiguous",
                           c->dir, name[first_i], value_str(first, a, sizeof(a)), name[i],
                           value_str(v, b, sizeof(b)));
        }
    }
    if (ne && nle && !json_object_equal(ne, nle))
        return err_set(-ENOTSUP,
                       "%s/config.json: num_experts = %s and num_local_experts = %s differ "
                       "(transformers 5.x reads num_experts as num_local_experts)",
                       c->dir, value_str(ne, a, sizeof(a)), value_str(nle, b, sizeof(b)));
    return 0;
}

int convert_keys_check(const struct convert_config *cfg, const struct hf_ckpt *c,
                       enum convert_arch arch)
{
    const struct key_table *t = &qwen3moe_table;

    switch (arch) {
    case CONVERT_ARCH_QWEN3MOE:
        break;
    case CONVERT_ARCH_GPTOSS:
        t = &gptoss_table;
        break;
    case CONVERT_ARCH_QWEN3NEXT:
        t = &qwen3next_table;
        break;
    case CONVERT_ARCH_QWEN35MOE: /* the outer config when the text model's is text_config */
        t = c->config != c->config_root ? &qwen35moe_table : &qwen35moe_text_table;
        break;
    }
    int rc = audit_object(cfg, c, t, "", c->config_root);
    return rc ? rc : audit_agreement(c);
}
