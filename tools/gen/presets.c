/* gen presets and quant mixes: which shapes a model size has and which type each tensor gets. */
#include <string.h>
#include <strings.h>

#include "errors.h"
#include "gen.h"
#include "quant.h"

/* tiny: small enough for CI (< 10 MB even in F32) yet with n_embd = 256 so that the K-quant
 * tensors whose rows are n_embd long (token_embd, output, gate/up experts) keep their K type.
 * The expert rows of ffn_down_exps are n_ff_exp = 128 long and fall back from Q6_K to Q8_0.
 * The Qwen3 sizes follow their released config.json (docs/formats.md §4). */
static const struct gen_preset presets[] = {
    {
        .arch = "qwen3moe",
        .name = "tiny",
        .model_name = "Qwen3-MoE-tiny",
        .n_layer = 2,
        .n_ctx = 4096,
        .n_embd = 256,
        .n_ff = 512,
        .n_ff_exp = 128,
        .n_expert = 8,
        .n_expert_used = 2,
        .n_head = 4,
        .n_head_kv = 2,
        .head_dim = 32,
        .n_vocab = 1024,
        .special_base = 0,
        .rms_eps = 1e-6f,
        .rope_base = 1000000.0f,
    },
    {
        .arch = "qwen3moe",
        .name = "30b-a3b",
        .model_name = "Qwen3-30B-A3B",
        .n_layer = 48,
        .n_ctx = 40960,
        .n_embd = 2048,
        .n_ff = 6144,
        .n_ff_exp = 768,
        .n_expert = 128,
        .n_expert_used = 8,
        .n_head = 32,
        .n_head_kv = 4,
        .head_dim = 128,
        .n_vocab = 151936,
        .special_base = 151643,
        .rms_eps = 1e-6f,
        .rope_base = 1000000.0f,
    },
    {
        .arch = "qwen3moe",
        .name = "235b-a22b",
        .model_name = "Qwen3-235B-A22B",
        .n_layer = 94,
        .n_ctx = 40960,
        .n_embd = 4096,
        .n_ff = 12288,
        .n_ff_exp = 1536,
        .n_expert = 128,
        .n_expert_used = 8,
        .n_head = 64,
        .n_head_kv = 4,
        .head_dim = 128,
        .n_vocab = 151936,
        .special_base = 151643,
        .rms_eps = 1e-6f,
        .rope_base = 1000000.0f,
    },
    /* gpt-oss tiny: the layout of the real ones (q width n_head*head_dim != n_embd, biases,
     * sinks, MXFP4 experts whose rows of 64 are two blocks) at CI size; 4 layers so that the
     * sliding (even) and full (odd) layers alternate twice. The 20b and 120b sizes follow
     * docs/formats.md (gpt-oss); 20b's expert count 32 is the published figure. */
    {
        .arch = "gpt-oss",
        .name = "tiny",
        .model_name = "gpt-oss-tiny",
        .n_layer = 4,
        .n_ctx = 4096,
        .n_embd = 64,
        .n_ff = 64,
        .n_ff_exp = 64,
        .n_expert = 8,
        .n_expert_used = 4,
        .n_head = 8,
        .n_head_kv = 2,
        .head_dim = 16,
        .n_vocab = 1024,
        .special_base = 0,
        .rms_eps = 1e-5f,
        .rope_base = 150000.0f,
        .n_swa = 16,
        .yarn_factor = 32.0f,
        .yarn_n_ctx_orig = 128,
    },
    {
        .arch = "gpt-oss",
        .name = "20b",
        .model_name = "gpt-oss-20b",
        .n_layer = 24,
        .n_ctx = 131072,
        .n_embd = 2880,
        .n_ff = 2880,
        .n_ff_exp = 2880,
        .n_expert = 32,
        .n_expert_used = 4,
        .n_head = 64,
        .n_head_kv = 8,
        .head_dim = 64,
        .n_vocab = 201088,
        .special_base = 0,
        .rms_eps = 1e-5f,
        .rope_base = 150000.0f,
        .n_swa = 128,
        .yarn_factor = 32.0f,
        .yarn_n_ctx_orig = 4096,
    },
    {
        .arch = "gpt-oss",
        .name = "120b",
        .model_name = "gpt-oss-120b",
        .n_layer = 36,
        .n_ctx = 131072,
        .n_embd = 2880,
        .n_ff = 2880,
        .n_ff_exp = 2880,
        .n_expert = 128,
        .n_expert_used = 4,
        .n_head = 64,
        .n_head_kv = 8,
        .head_dim = 64,
        .n_vocab = 201088,
        .special_base = 0,
        .rms_eps = 1e-5f,
        .rope_base = 150000.0f,
        .n_swa = 128,
        .yarn_factor = 32.0f,
        .yarn_n_ctx_orig = 4096,
    },
    /* qwen3next and qwen35moe tiny: both layer kinds (interval 2: layers 1 and 3 are full
     * attention), GDN v heads twice the q/k heads (r = 2) so that the head mapping matters,
     * n_rot < head_dim, and every matrix row (256, 128, 256 experts) a multiple of the mix's
     * block: q4_k_m falls back nowhere. The big sizes follow docs/formats.md §4(c) and §4(f);
     * their ids 151643 and 248044 are <|endoftext|> of the Qwen3 and Qwen3.5 vocabularies. */
    {
        .arch = "qwen3next",
        .name = "tiny",
        .model_name = "Qwen3-Next-tiny",
        .n_layer = 4,
        .n_ctx = 4096,
        .n_embd = 256,
        .n_ff_exp = 256,
        .n_expert = 16,
        .n_expert_used = 4,
        .n_head = 4,
        .n_head_kv = 2,
        .head_dim = 64,
        .n_vocab = 1024,
        .special_base = 0,
        .rms_eps = 1e-6f,
        .rope_base = 10000000.0f,
        .n_ff_shexp = 256,
        .n_rot = 16,
        .ssm_d_conv = 4,
        .ssm_d_state = 32,
        .ssm_n_group = 2,
        .ssm_dt_rank = 4,
        .full_attn_interval = 2,
    },
    {
        .arch = "qwen3next",
        .name = "80b-a3b",
        .model_name = "Qwen3-Next-80B-A3B",
        .n_layer = 48,
        .n_ctx = 262144,
        .n_embd = 2048,
        .n_ff_exp = 512,
        .n_expert = 512,
        .n_expert_used = 10,
        .n_head = 16,
        .n_head_kv = 2,
        .head_dim = 256,
        .n_vocab = 151936,
        .special_base = 151643,
        .rms_eps = 1e-6f,
        .rope_base = 10000000.0f,
        .n_ff_shexp = 512,
        .n_rot = 64,
        .ssm_d_conv = 4,
        .ssm_d_state = 128,
        .ssm_n_group = 16,
        .ssm_dt_rank = 32,
        .full_attn_interval = 4,
    },
    {
        .arch = "qwen35moe",
        .name = "tiny",
        .model_name = "Qwen3.5-MoE-tiny",
        .n_layer = 4,
        .n_ctx = 4096,
        .n_embd = 256,
        .n_ff_exp = 256,
        .n_expert = 16,
        .n_expert_used = 4,
        .n_head = 4,
        .n_head_kv = 2,
        .head_dim = 64,
        .n_vocab = 1024,
        .special_base = 0,
        .rms_eps = 1e-6f,
        .rope_base = 10000000.0f,
        .n_ff_shexp = 256,
        .n_rot = 16,
        .ssm_d_conv = 4,
        .ssm_d_state = 32,
        .ssm_n_group = 2,
        .ssm_dt_rank = 4,
        .full_attn_interval = 2,
    },
    {
        .arch = "qwen35moe",
        .name = "35b-a3b",
        .model_name = "Qwen3.5-35B-A3B",
        .n_layer = 40,
        .n_ctx = 262144,
        .n_embd = 2048,
        .n_ff_exp = 512,
        .n_expert = 256,
        .n_expert_used = 8,
        .n_head = 16,
        .n_head_kv = 2,
        .head_dim = 256,
        .n_vocab = 248320,
        .special_base = 248044,
        .rms_eps = 1e-6f,
        .rope_base = 10000000.0f,
        .n_ff_shexp = 512,
        .n_rot = 64,
        .ssm_d_conv = 4,
        .ssm_d_state = 128,
        .ssm_n_group = 16,
        .ssm_dt_rank = 32,
        .full_attn_interval = 4,
    },
};

#define N_PRESETS (sizeof(presets) / sizeof(presets[0]))

const struct gen_preset *gen_presets(uint32_t *n)
{
    *n = N_PRESETS;
    return presets;
}

const struct gen_preset *gen_preset_find_arch(const char *arch, const char *name)
{
    for (size_t i = 0; i < N_PRESETS; i++) {
        if (!strcmp(presets[i].arch, arch) && !strcmp(presets[i].name, name))
            return &presets[i];
    }
    return NULL;
}

const struct gen_preset *gen_preset_find(const char *name)
{
    return gen_preset_find_arch("qwen3moe", name);
}

