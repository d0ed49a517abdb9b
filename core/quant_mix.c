#include "quant_mix.h"

#include <string.h>
#include <strings.h>

#include "errors.h"
#include "quant.h"

static const struct {
    const char *name;
    uint32_t file_type; /* llama_ftype */
} mix_table[QUANT_MIX_COUNT] = {
    [QUANT_MIX_F32] = {"f32", 0},
    [QUANT_MIX_BF16] = {"bf16", 32},
    [QUANT_MIX_Q8_0] = {"q8_0", 7},
    [QUANT_MIX_Q4_K_M] = {"q4_k_m", 15},
};

int quant_mix_parse(const char *name, enum quant_mix *out)
{
    for (int i = 0; i < QUANT_MIX_COUNT; i++) {
        if (!strcasecmp(name, mix_table[i].name)) {
            *out = (enum quant_mix)i;
            return 0;
        }
    }
    return err_set(-EINVAL, "unknown quant mix '%s' (known: f32, bf16, q8_0, q4_k_m)", name);
}

const char *quant_mix_name(enum quant_mix mix)
{
    return (unsigned)mix < QUANT_MIX_COUNT ? mix_table[mix].name : "unknown";
}

uint32_t quant_mix_file_type(enum quant_mix mix)
{
    return (unsigned)mix < QUANT_MIX_COUNT ? mix_table[mix].file_type : 0;
}

static bool name_has(const char *name, const char *part)
{
    return strstr(name, part) != NULL;
}

/* The mix's choice before the row-length check. */
static uint32_t mix_choice(enum quant_mix mix, const char *name, uint32_t n_dims)
{
    /* norms and the router stay F32 in every mix (docs/formats.md §3, quant mixes) */
    if (mix == QUANT_MIX_F32 || n_dims < 2 || name_has(name, "_norm") ||
        name_has(name, "ffn_gate_inp"))
        return QUANT_F32;
    if (mix == QUANT_MIX_BF16)
        return QUANT_BF16;
    if (mix == QUANT_MIX_Q8_0)
        return QUANT_Q8_0;
    /* q4_k_m */
    if (name_has(name, "ffn_gate_exps") || name_has(name, "ffn_up_exps") ||
        !strcmp(name, "token_embd.weight"))
        return QUANT_Q4_K;
    if (name_has(name, "ffn_down_exps") || !strcmp(name, "output.weight"))
        return QUANT_Q6_K;
    return QUANT_Q8_0; /* attention q/k/v/output and anything else 2-D */
}

uint32_t quant_mix_tensor_type(enum quant_mix mix, const char *name, uint32_t n_dims,
                               uint64_t ne0, bool *fell_back)
{
    uint32_t type = mix_choice(mix, name, n_dims);
    const struct quant_type_info *ti = quant_type_find(type);
    bool fb = ti && ne0 % ti->block;

    if (fb)
        type = ne0 % QK_32 == 0 && type != QUANT_Q8_0 ? QUANT_Q8_0 : QUANT_F32;
    if (fell_back)
        *fell_back = fb;
    return type;
}
