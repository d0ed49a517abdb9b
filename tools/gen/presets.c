/* gen presets and quant mixes: which shapes a model size has and which type each tensor gets. */
#include <string.h>
#include <strings.h>

#include "errors.h"
#include "gen.h"
#include "quant.h"

/* tiny: small enough for CI (< 10 MB even in F32) yet with n_embd = 256 so that the K-quant
 * tensors whose rows are n_embd long (token_embd, output, gate/up experts) keep their K type.
 * The expert rows of ffn_down_exps are n_ff_exp = 128 long and fall back from Q6_K to Q8_0.
 * The Qwen3 sizes follow their released config.json (FORMATS.md §4(a)). */
static const struct gen_preset presets[] = {
    {
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
};

#define N_PRESETS (sizeof(presets) / sizeof(presets[0]))

const struct gen_preset *gen_presets(uint32_t *n)
{
    *n = N_PRESETS;
    return presets;
}

const struct gen_preset *gen_preset_find(const char *name)
{
    for (size_t i = 0; i < N_PRESETS; i++) {
        if (!strcmp(presets[i].name, name))
            return &presets[i];
    }
    return NULL;
}

static const struct {
    const char *name;
    uint32_t file_type; /* llama_ftype */
} mixes[GEN_MIX_COUNT] = {
    [GEN_MIX_F32] = {"f32", 0},
    [GEN_MIX_Q8_0] = {"q8_0", 7},
    [GEN_MIX_Q4_K_M] = {"q4_k_m", 15},
};

int gen_mix_parse(const char *name, enum gen_mix *out)
{
    for (int m = 0; m < GEN_MIX_COUNT; m++) {
        if (!strcasecmp(mixes[m].name, name)) {
            *out = (enum gen_mix)m;
            return 0;
        }
    }
    return err_set(-EINVAL, "unknown quant mix '%s' (known: f32, q8_0, q4_k_m)", name);
}

const char *gen_mix_name(enum gen_mix mix)
{
    return (unsigned)mix < GEN_MIX_COUNT ? mixes[mix].name : "unknown";
}

uint32_t gen_mix_file_type(enum gen_mix mix)
{
    return (unsigned)mix < GEN_MIX_COUNT ? mixes[mix].file_type : 0;
}

/* The mix's choice before the shape check. Norms (1-D) and the router stay F32 in every mix,
 * as llama.cpp's converter and quantizer keep them. */
static uint32_t mix_choice(enum gen_mix mix, const char *name, uint32_t n_dims)
{
    if (n_dims < 2 || strstr(name, "ffn_gate_inp"))
        return QUANT_F32;
    switch (mix) {
    case GEN_MIX_Q8_0:
        return QUANT_Q8_0;
    case GEN_MIX_Q4_K_M:
        if (strstr(name, "ffn_down_exps") || !strcmp(name, "output.weight"))
            return QUANT_Q6_K;
        if (strstr(name, "attn_"))
            return QUANT_Q8_0;
        return QUANT_Q4_K; /* gate/up experts, token_embd */
    default:
        return QUANT_F32;
    }
}

uint32_t gen_mix_tensor_type(enum gen_mix mix, const char *name, uint32_t n_dims, uint64_t ne0,
                             bool *fell_back)
{
    uint32_t type = mix_choice(mix, name, n_dims);
    const struct quant_type_info *t = quant_type_find(type);

    if (fell_back)
        *fell_back = false;
    if (ne0 % t->block == 0)
        return type;
    if (fell_back)
        *fell_back = true;
    return (type != QUANT_Q8_0 && ne0 % QK_32 == 0) ? QUANT_Q8_0 : QUANT_F32;
}
