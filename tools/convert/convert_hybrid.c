/* convert_hybrid: qwen3next (Qwen3NextForCausalLM) and qwen35moe (Qwen3_5MoeForCausalLM /
 * Qwen3_5MoeForConditionalGeneration): Gated DeltaNet layers with a gated full-attention layer
 * every full_attention_interval layers, and MoE with a shared expert in every layer.
 *
 * The GGUF contract (docs/formats.md, FORMATS §4(c), §4(f), §6.1):
 *   - every HF RMSNorm computes x̂·(1 + w): the GGUF stores 1 + w for each *norm.weight except
 *     the GDN's gated norm (linear_attn.norm -> ssm_norm), which multiplies by w;
 *   - ssm_a = -exp(A_log); ssm_conv1d is conv1d.weight [C, 1, kc] squeezed to {kc, C};
 *   - qwen3next's fused in_proj_qkvz holds, per key head g, [q_g (d) | k_g (d) | v (r·d) |
 *     z (r·d)] (r = n_v / n_k); it is split into attn_qkv (all q ‖ all k ‖ all v, the conv's
 *     channel order) and attn_gate (z); in_proj_ba's per-key-head [b (r) | a (r)] groups are
 *     ssm_ba as they are;
 *   - qwen35moe's value heads are tiled: GGUF position p = s·n_k + g holds HF value head
 *     g·r + s, so that position p reads q/k head p % n_k. The V rows of in_proj_qkv and
 *     conv1d, in_proj_z, in_proj_b / in_proj_a, A_log, dt_bias and out_proj's input columns
 *     are all permuted so.
 * The multi-token-prediction head (mtp_num_hidden_layers 1) becomes block L = n_layer as
 * llama.cpp writes it: mtp.fc [H, 2H] -> nextn.eh_proj {2H, H} (inputs: the normed embedding,
 * then the normed hidden state), mtp.pre_fc_norm_embedding / pre_fc_norm_hidden / norm ->
 * nextn.enorm / hnorm / shared_head_norm (1 + w), and mtp.layers.0, a full-attention layer,
 * named and converted as a main one; block_count is n_layer + 1 and nextn_predict_layers 1.
 * --no-mtp (cfg->no_mtp) drops it, as does a config without mtp_num_hidden_layers or a
 * checkpoint without mtp.* tensors. Dropped mtp.* tensors and the vision tower (model.visual.*)
 * are reported in a notice.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "convert_priv.h"
#include "errors.h"
#include "gguf.h"
#include "hf_ckpt.h"
#include "quant.h"
#include "safetensors.h"

/* ---- hyperparameters ---------------------------------------------------------------------- */

/* An optional u32 that takes transformers' class default when absent. */
static int u32_def(const struct hf_ckpt *c, const char *key, uint32_t def, uint32_t *out)
{
    *out = def;
    int rc = hf_ckpt_config_u32(c, key, out);
    return rc == -ENOENT ? 0 : rc;
}

static bool same_value(json_object *a, json_object *b)
{
    bool na = json_object_is_type(a, json_type_int) || json_object_is_type(a, json_type_double);
    bool nb = json_object_is_type(b, json_type_int) || json_object_is_type(b, json_type_double);
    if (na && nb)
        return json_object_get_double(a) == json_object_get_double(b);
    return json_object_equal(a, b);
}

/* KEY at the top of the text config or inside rope_parameters / rope_scaling: transformers
 * versions read different ones, so the ones present must agree. *out: the value, or NULL;
 * *where: its name for messages. */
static int rope_member(const struct hf_ckpt *c, const char *key, json_object **out, char *where,
                       size_t size)
{
    static const char *const nested[] = {NULL, "rope_parameters", "rope_scaling"};
    json_object *first = NULL;
    char name[96];

    *out = NULL;
    snprintf(where, size, "%s%s", c->config_at, key);
    for (size_t i = 0; i < sizeof(nested) / sizeof(nested[0]); i++) {
        json_object *o = nested[i] ? hf_ckpt_config_get(c, nested[i]) : NULL, *v = NULL;
        if (nested[i] && (!o || !json_object_object_get_ex(o, key, &v)))
            continue;
        if (!nested[i])
            v = hf_ckpt_config_get(c, key);
        if (!v || json_object_is_type(v, json_type_null))
            continue;
        snprintf(name, sizeof(name), "%s%s%s%s", c->config_at, nested[i] ? nested[i] : "",
                 nested[i] ? "." : "", key);
        if (!first) {
            first = v;
            snprintf(where, size, "%s", name);
        } else if (!same_value(first, v)) {
            return err_set(-ENOTSUP,
                           "%s/config.json: %s = %s and %s = %s differ; transformers versions "
                           "read different ones",
                           c->dir, where, json_object_to_json_string(first), name,
                           json_object_to_json_string(v));
        }
    }
    *out = first;
    return 0;
}

/* rope.dimension_count = head_dim × partial_rotary_factor (default 0.25, the configs' own). */
static int read_rotary(const struct hf_ckpt *c, struct convert_hparams *hp)
{
    json_object *v;
    char where[128];
    double f = 0.25;
    int rc = rope_member(c, "partial_rotary_factor", &v, where, sizeof(where));

    if (rc)
        return rc;
    if (v) {
        if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double))
            return err_set(-EINVAL, "%s/config.json: %s is %s, expected a number", c->dir, where,
                           json_object_to_json_string(v));
        f = json_object_get_double(v);
    }
    double dims = hp->head_dim * f;
    if (!(dims >= 2.0) || dims > hp->head_dim || dims != floor(dims) || (uint32_t)dims % 2)
        return err_set(-ENOTSUP,
                       "%s/config.json: %s = %g gives %g rotated dims of head_dim %u; strata "
                       "rotates an even whole number of dims in [2, head_dim]",
                       c->dir, where, f, dims, hp->head_dim);
    hp->n_rot = (uint32_t)dims;
    return 0;
}

/* qwen35moe: rope.dimension_sections = mrope_section + [0] (default [11, 11, 10]); the sections
 * must cover the rotated pairs. Text positions are equal in all three, so the split itself does
 * not change text logits, but strata's loader checks the sum. */
static int read_mrope(const struct hf_ckpt *c, struct convert_hparams *hp)
{
    static const int32_t def[3] = {11, 11, 10};
    json_object *v;
    char where[128];
    int64_t sum = 0;
    int rc = rope_member(c, "mrope_section", &v, where, sizeof(where));

    if (rc)
        return rc;
    for (int i = 0; i < 3; i++) {
        json_object *e =
            v && json_object_is_type(v, json_type_array) && json_object_array_length(v) == 3
                ? json_object_array_get_idx(v, i)
                : NULL;
        if (v && (!e || !json_object_is_type(e, json_type_int) || json_object_get_int64(e) < 0 ||
                  json_object_get_int64(e) > INT32_MAX))
            return err_set(-ENOTSUP,
                           "%s/config.json: %s = %s is not supported: strata reads three "
                           "non-negative integers [t, h, w]",
                           c->dir, where, json_object_to_json_string(v));
        hp->rope_sections[i] = v ? (int32_t)json_object_get_int64(e) : def[i];
        sum += hp->rope_sections[i];
    }
    hp->rope_sections[3] = 0;
    if (2 * sum != hp->n_rot)
        return err_set(-ENOTSUP,
                       "%s/config.json: %s%s = [%d, %d, %d] covers %lld rotated pairs, but "
                       "head_dim x partial_rotary_factor rotates %u dims (%u pairs)",
                       c->dir, where, v ? "" : " (absent: transformers' default)",
                       hp->rope_sections[0], hp->rope_sections[1], hp->rope_sections[2],
                       (long long)sum, hp->n_rot, hp->n_rot / 2);
    return 0;
}

/* The Gated DeltaNet sizes. */
static int read_linear_attn(const struct hf_ckpt *c, struct convert_hparams *hp)
{
    uint32_t dv = 0;
    int rc = u32_def(c, "linear_conv_kernel_dim", 4, &hp->ssm_conv);

    rc = rc ? rc : u32_def(c, "linear_key_head_dim", 128, &hp->ssm_state);
    rc = rc ? rc : u32_def(c, "linear_value_head_dim", 128, &dv);
    rc = rc ? rc : u32_def(c, "linear_num_key_heads", 16, &hp->ssm_n_k);
    rc = rc ? rc : u32_def(c, "linear_num_value_heads", 32, &hp->ssm_n_v);
    if (rc)
        return rc;
    if (!hp->ssm_conv || !hp->ssm_state || !hp->ssm_n_k || !hp->ssm_n_v)
        return err_set(-EINVAL,
                       "%s/config.json: a linear attention size is zero (%slinear_conv_kernel_dim "
                       "%u, linear_key_head_dim %u, linear_num_key_heads %u, "
                       "linear_num_value_heads %u)",
                       c->dir, c->config_at, hp->ssm_conv, hp->ssm_state, hp->ssm_n_k, hp->ssm_n_v);
    if (dv != hp->ssm_state)
        return err_set(-ENOTSUP,
                       "%s/config.json: %slinear_value_head_dim = %u is not supported: strata's "
                       "Gated DeltaNet state is square (ssm.state_size); it must equal "
                       "linear_key_head_dim %u",
                       c->dir, c->config_at, dv, hp->ssm_state);
    if (hp->ssm_n_v % hp->ssm_n_k)
        return err_set(-ENOTSUP,
                       "%s/config.json: %slinear_num_value_heads = %u is not supported: it must "
                       "be a multiple of linear_num_key_heads %u (each key head serves "
                       "the same number of value heads)",
                       c->dir, c->config_at, hp->ssm_n_v, hp->ssm_n_k);
    return 0;
}

/* "linear_attention" / "mamba" -> false, "full_attention" / "attention" -> true (the audit has
 * admitted only these). */
static bool layer_type_full(json_object *e)
{
    const char *s = json_object_get_string(e);
    return s && (!strcmp(s, "full_attention") || !strcmp(s, "attention"));
}

/* full_attention_interval (default 4), and layer_types, which transformers reads instead when
 * present: accepted only as the interval's pattern. Without full_attention_interval the
 * interval is the first full attention layer + 1. */
static int read_layer_pattern(const struct hf_ckpt *c, struct convert_hparams *hp)
{
    json_object *lt = hf_ckpt_config_get(c, "layer_types");
    int rc = hf_ckpt_config_u32(c, "full_attention_interval", &hp->full_attn_interval);
    bool given = rc == 0;

    if (rc && rc != -ENOENT)
        return rc;
    if (!given)
        hp->full_attn_interval = 4;
    if (given && !hp->full_attn_interval)
        return err_set(-EINVAL, "%s/config.json: %sfull_attention_interval is 0", c->dir,
                       c->config_at);
    if (!lt)
        return 0;
    size_t n = json_object_array_length(lt);
    if (n != hp->n_layer)
        return err_set(-ENOTSUP,
                       "%s/config.json: %slayer_types has %zu entries for %u layers "
                       "(num_hidden_layers)",
                       c->dir, c->config_at, n, hp->n_layer);
    if (!given) {
        hp->full_attn_interval = hp->n_layer + 1;
        for (size_t i = 0; i < n; i++)
            if (layer_type_full(json_object_array_get_idx(lt, i))) {
                hp->full_attn_interval = (uint32_t)i + 1;
                break;
            }
    }
    for (size_t i = 0; i < n; i++) {
        bool full = layer_type_full(json_object_array_get_idx(lt, i));
        if (full != ((i + 1) % hp->full_attn_interval == 0))
            return err_set(-ENOTSUP,
                           "%s/config.json: %slayer_types is not supported: layer %zu is %s, "
                           "but strata places full attention exactly at the layers l with "
                           "(l + 1) %% %u == 0 (%s)",
                           c->dir, c->config_at, i, full ? "full_attention" : "linear_attention",
                           hp->full_attn_interval,
                           given ? "full_attention_interval"
                                 : "the interval that the first full_attention layer implies");
    }
    return 0;
}

/* qwen35moe's ConditionalGeneration reads tie_word_embeddings at the top level (default false);
 * a text_config that says otherwise is ambiguous. */
static int read_tied(const struct hf_ckpt *c, struct convert_hparams *hp)
{
    json_object *top, *text = hf_ckpt_config_get(c, "tie_word_embeddings");

    if (c->config == c->config_root)
        return 0; /* read_hparams has read it */
    if (!json_object_object_get_ex(c->config_root, "tie_word_embeddings", &top) ||
        json_object_is_type(top, json_type_null))
        top = NULL;
    hp->tied = top && json_object_get_boolean(top);
    if (text && json_object_get_boolean(text) != hp->tied)
        return err_set(-ENOTSUP,
                       "%s/config.json: tie_word_embeddings is %s%s but %stie_word_embeddings is "
                       "%s; transformers versions read different ones",
                       c->dir, hp->tied ? "true" : "false", top ? "" : " (absent)", c->config_at,
                       json_object_get_boolean(text) ? "true" : "false");
    return 0;
}

/* The checkpoint's tensors whose names start with PREFIX. */
static uint32_t count_prefix(const struct hf_ckpt *c, const char *prefix)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->n_tensors; i++)
        n += !strncmp(c->tensors[i]->name, prefix, strlen(prefix));
    return n;
}

/* hp->n_nextn: 1 when the MTP head is kept (mtp_num_hidden_layers 1, mtp.* tensors present,
 * no --no-mtp), else 0. More layers, or dedicated MTP embeddings, are refused by name unless
 * --no-mtp drops the head. */
static int read_mtp(const struct convert_config *cfg, const struct hf_ckpt *c,
                    struct convert_hparams *hp)
{
    json_object *ded = hf_ckpt_config_get(c, "mtp_use_dedicated_embeddings");
    uint32_t n_mtp = 0;
    int rc = u32_def(c, "mtp_num_hidden_layers", 0, &n_mtp);

    hp->n_nextn = 0;
    if (rc || !n_mtp || cfg->no_mtp)
        return rc;
    if (n_mtp > 1)
        return err_set(-ENOTSUP,
                       "%s/config.json: %smtp_num_hidden_layers = %u is not supported: strata "
                       "converts one multi-token-prediction layer (the GGUF's nextn block); "
                       "--no-mtp drops the head",
                       c->dir, c->config_at, n_mtp);
    if (ded && (!json_object_is_type(ded, json_type_boolean) || json_object_get_boolean(ded)))
        return err_set(-ENOTSUP,
                       "%s/config.json: %smtp_use_dedicated_embeddings = %s is not supported: "
                       "strata's MTP block reads the model's token_embd and output (false); "
                       "--no-mtp drops the head",
                       c->dir, c->config_at, json_object_to_json_string(ded));
    if (!count_prefix(c, "mtp.")) {
        convert_notice(cfg,
                       "config.json has %smtp_num_hidden_layers 1 but the checkpoint has no "
                       "mtp.* tensor (transformers' save_pretrained leaves them out): the GGUF "
                       "has no MTP block",
                       c->config_at);
        return 0;
    }
    hp->n_nextn = 1;
    return 0;
}

int convert_hybrid_hparams(const struct convert_config *cfg, struct hf_ckpt *c,
                           struct convert_hparams *hp)
{
    int rc = u32_def(c, "shared_expert_intermediate_size", 512, &hp->n_ff_shexp);

    rc = rc ? rc : read_linear_attn(c, hp);
    rc = rc ? rc : read_layer_pattern(c, hp);
    rc = rc ? rc : read_rotary(c, hp);
    if (!rc && hp->arch == CONVERT_ARCH_QWEN35MOE)
        rc = read_mrope(c, hp);
    rc = rc ? rc : read_tied(c, hp);
    rc = rc ? rc : read_mtp(cfg, c, hp);
    if (rc)
        return rc;
    if (!hp->n_ff_shexp)
        return err_set(-EINVAL, "%s/config.json: %sshared_expert_intermediate_size is 0", c->dir,
                       c->config_at);
    /* ConditionalGeneration checkpoints keep the text model under model.language_model. */
    snprintf(hp->prefix, sizeof(hp->prefix), "%s",
             hp->arch == CONVERT_ARCH_QWEN35MOE &&
                     hf_ckpt_find(c, "model.language_model.embed_tokens.weight")
                 ? "model.language_model."
                 : "model.");
    return 0;
}

int convert_hybrid_add_hparams(struct gguf_writer *w, const struct convert_hparams *hp,
                               const char *arch)
{
    char k[96];
    int rc = 0;

#define KEY(suffix) (snprintf(k, sizeof(k), "%s.%s", arch, suffix), k)
#define U32(key, val) (rc = rc ? rc : gguf_writer_add_u32(w, key, val))
    U32(KEY("expert_shared_feed_forward_length"), hp->n_ff_shexp);
    U32(KEY("ssm.conv_kernel"), hp->ssm_conv);
    U32(KEY("ssm.state_size"), hp->ssm_state);
    U32(KEY("ssm.group_count"), hp->ssm_n_k);
    U32(KEY("ssm.time_step_rank"), hp->ssm_n_v);
    U32(KEY("ssm.inner_size"), hp->ssm_n_v * hp->ssm_state);
    U32(KEY("rope.dimension_count"), hp->n_rot);
    U32(KEY("full_attention_interval"), hp->full_attn_interval);
    if (hp->n_nextn)
        U32(KEY("nextn_predict_layers"), hp->n_nextn);
    if (!rc && hp->arch == CONVERT_ARCH_QWEN35MOE)
        rc = gguf_writer_add_arr(w, KEY("rope.dimension_sections"), GGUF_TYPE_INT32,
                                 hp->rope_sections, 4);
#undef KEY
#undef U32
    return rc;
}

/* ---- the tensor plan ---------------------------------------------------------------------- */

enum hyb_flags {
    HYB_F32 = 1 << 0,     /* F32 whatever the mix */
    HYB_ADD_ONE = 1 << 1, /* an x̂·(1 + w) norm weight: store 1 + w */
};

/* One layer being planned. */
struct hyb_layer {
    struct convert_plan *p;
    struct hf_ckpt *c;
    const struct convert_hparams *hp;
    uint32_t l;
    char lp[64]; /* HF prefix of the layer: "model.layers.L." */
};

/* HF tensor lp + SUFFIX of PyTorch shape `shape`. */
static int hyb_src(const struct hyb_layer *y, const char *suffix, uint32_t n_dims,
                   const uint64_t *shape, const struct safetensors_tensor **src)
{
    char hf[256];
    snprintf(hf, sizeof(hf), "%s%s", y->lp, suffix);
    return convert_hf_get(y->c, hf, n_dims, shape, src);
}

/* Appends blk.L.NAME of ne {ne0} (ne1 == 0) or {ne0, ne1}, with n_seg segments. */
static struct convert_tensor *hyb_add(const struct hyb_layer *y, const char *name, uint64_t ne0,
                                      uint64_t ne1, uint32_t n_seg, unsigned flags)
{
    char g[GGUF_NAME_MAX + 1];
    uint64_t ne[2] = {ne0, ne1};
    struct convert_tensor *t;

    snprintf(g, sizeof(g), "blk.%u.%s", y->l, name);
    t = convert_plan_add(y->p, g, ne1 ? 2 : 1, ne, n_seg);
    if (t && (flags & HYB_F32))
        t->force_type = QUANT_F32;
    if (t && (flags & HYB_ADD_ONE))
        t->op = CONVERT_OP_ADD_ONE;
    return t;
}

/* blk.L.NAME as the whole HF tensor lp + SUFFIX: PyTorch [ne0] or [ne1, ne0]. */
static int hyb_direct(const struct hyb_layer *y, const char *name, const char *suffix, uint64_t ne0,
                      uint64_t ne1, unsigned flags)
{
    const struct safetensors_tensor *src;
    uint64_t shape[2] = {ne1 ? ne1 : ne0, ne0};
    int rc = hyb_src(y, suffix, ne1 ? 2 : 1, shape, &src);

    if (rc)
        return rc;
    struct convert_tensor *t = hyb_add(y, name, ne0, ne1, 1, flags);
    if (!t)
        return -ENOMEM;
    t->seg[0] = (struct convert_segment){.src = src, .n_rows = t->n_rows};
    return 0;
}

/* Rows [first, first + n) of src, whose rows hold ne0 elements. */
static struct convert_segment rows_of(const struct safetensors_tensor *src, uint64_t first,
                                      uint64_t n, uint64_t ne0)
{
    return (struct convert_segment){.src = src, .elem0 = first * ne0, .n_rows = n};
}

/* The HF value head at GGUF position p (see the top of the file). */
static uint64_t vhead(const struct convert_hparams *hp, uint64_t p)
{
    const uint64_t n_k = hp->ssm_n_k, r = hp->ssm_n_v / hp->ssm_n_k;
    return hp->arch == CONVERT_ARCH_QWEN35MOE ? (p % n_k) * r + p / n_k : p;
}

/* An element permutation of a row of n_v blocks of `block` elements: GGUF block p is HF block
 * vhead(p). NULL (and no permutation needed) for qwen3next; *rc = -ENOMEM when out of memory. */
static uint64_t *vhead_perm(const struct convert_hparams *hp, uint64_t block, int *rc)
{
    uint64_t *perm;

    *rc = 0;
    if (hp->arch != CONVERT_ARCH_QWEN35MOE)
        return NULL;
    if (!(perm = malloc(hp->ssm_n_v * block * sizeof(*perm)))) {
        *rc = err_set(-ENOMEM, "out of memory");
        return NULL;
    }
    for (uint64_t p = 0; p < hp->ssm_n_v; p++)
        for (uint64_t e = 0; e < block; e++)
            perm[p * block + e] = vhead(hp, p) * block + e;
    return perm;
}

/* Output tensor whose rows are: rows [0, head) of src, then value head vhead(p)'s `block` rows
 * (from row base + vhead(p)·block) for p = 0..n_v-1. ne0: the row length. */
static int plan_vrows(const struct hyb_layer *y, const char *name,
                      const struct safetensors_tensor *src, uint64_t ne0, uint64_t head,
                      uint64_t base, uint64_t block, unsigned flags)
{
    const uint64_t n_v = y->hp->ssm_n_v;
    struct convert_tensor *t =
        hyb_add(y, name, ne0, head + n_v * block, (uint32_t)(n_v + (head > 0)), flags);
    uint32_t s = 0;

    if (!t)
        return -ENOMEM;
    if (head)
        t->seg[s++] = rows_of(src, 0, head, ne0);
    for (uint64_t p = 0; p < n_v; p++)
        t->seg[s++] = rows_of(src, base + vhead(y->hp, p) * block, block, ne0);
    return 0;
}

/* qwen3next's in_proj_qkvz [2K + 2V, H], per key head g rows [q (d) | k (d) | v (r·d) |
 * z (r·d)], as attn_qkv {H, 2K + V} (q of every head, then k, then v) and attn_gate {H, V}. */
static int plan_qkvz(const struct hyb_layer *y)
{
    const struct convert_hparams *hp = y->hp;
    const uint64_t H = hp->n_embd, d = hp->ssm_state, n_k = hp->ssm_n_k;
    const uint64_t r = hp->ssm_n_v / n_k, K = n_k * d, V = hp->ssm_n_v * d;
    const uint64_t G = 2 * d + 2 * r * d; /* rows of one key head's group */
    const struct safetensors_tensor *src;
    uint64_t shape[2] = {2 * K + 2 * V, H};
    int rc = hyb_src(y, "linear_attn.in_proj_qkvz.weight", 2, shape, &src);

    if (rc)
        return rc;
    struct convert_tensor *qkv = hyb_add(y, "attn_qkv.weight", H, 2 * K + V, 3 * n_k, 0);
    if (!qkv)
        return -ENOMEM;
    for (uint64_t g = 0; g < n_k; g++) {
        qkv->seg[g] = rows_of(src, g * G, d, H);
        qkv->seg[n_k + g] = rows_of(src, g * G + d, d, H);
        qkv->seg[2 * n_k + g] = rows_of(src, g * G + 2 * d, r * d, H);
    }
    struct convert_tensor *z = hyb_add(y, "attn_gate.weight", H, V, n_k, 0);
    if (!z)
        return -ENOMEM;
    for (uint64_t g = 0; g < n_k; g++)
        z->seg[g] = rows_of(src, g * G + 2 * d + r * d, r * d, H);
    return 0;
}

/* qwen35moe's in_proj_qkv [2K + V, H], in_proj_z [V, H], in_proj_b / in_proj_a [n_v, H]: the
 * value heads tiled. */
static int plan_qkv_z_b_a(const struct hyb_layer *y)
{
    const struct convert_hparams *hp = y->hp;
    const uint64_t H = hp->n_embd, d = hp->ssm_state, n_v = hp->ssm_n_v;
    const uint64_t K = hp->ssm_n_k * d, V = n_v * d;
    const struct safetensors_tensor *src;
    uint64_t shape[2] = {2 * K + V, H};
    int rc = hyb_src(y, "linear_attn.in_proj_qkv.weight", 2, shape, &src);

    rc = rc ? rc : plan_vrows(y, "attn_qkv.weight", src, H, 2 * K, 2 * K, d, 0);
    shape[0] = V;
    rc = rc ? rc : hyb_src(y, "linear_attn.in_proj_z.weight", 2, shape, &src);
    rc = rc ? rc : plan_vrows(y, "attn_gate.weight", src, H, 0, 0, d, 0);
    shape[0] = n_v;
    rc = rc ? rc : hyb_src(y, "linear_attn.in_proj_b.weight", 2, shape, &src);
    rc = rc ? rc : plan_vrows(y, "ssm_beta.weight", src, H, 0, 0, 1, 0);
    rc = rc ? rc : hyb_src(y, "linear_attn.in_proj_a.weight", 2, shape, &src);
    return rc ? rc : plan_vrows(y, "ssm_alpha.weight", src, H, 0, 0, 1, 0);
}

/* A vector of n_v per-value-head values (dt_bias, A_log), value heads in GGUF order. */
static int plan_vhead_vec(const struct hyb_layer *y, const char *name, const char *suffix,
                          enum convert_op op)
{
    const struct safetensors_tensor *src;
    uint64_t shape[1] = {y->hp->ssm_n_v};
    int rc = hyb_src(y, suffix, 1, shape, &src);

    if (rc)
        return rc;
    struct convert_tensor *t = hyb_add(y, name, shape[0], 0, 1, HYB_F32);
    if (!t)
        return -ENOMEM;
    t->seg[0] = rows_of(src, 0, 1, shape[0]);
    t->op = op;
    t->col_perm = vhead_perm(y->hp, 1, &rc);
    return rc;
}

/* The Gated DeltaNet of layer l. */
static int plan_gdn(const struct hyb_layer *y)
{
    const struct convert_hparams *hp = y->hp;
    const uint64_t H = hp->n_embd, d = hp->ssm_state, kc = hp->ssm_conv;
    const uint64_t K = hp->ssm_n_k * d, V = hp->ssm_n_v * d;
    const struct safetensors_tensor *src;
    int rc;

    if (hp->arch == CONVERT_ARCH_QWEN3NEXT) {
        rc = plan_qkvz(y);
        rc = rc ? rc
                : hyb_direct(y, "ssm_ba.weight", "linear_attn.in_proj_ba.weight", H,
                             2 * (uint64_t)hp->ssm_n_v, 0);
    } else {
        rc = plan_qkv_z_b_a(y);
    }
    /* conv1d.weight [C, 1, kc] -> {kc, C}: channel c's taps, the V channels reordered */
    uint64_t cshape[3] = {2 * K + V, 1, kc};
    rc = rc ? rc : hyb_src(y, "linear_attn.conv1d.weight", 3, cshape, &src);
    rc = rc ? rc : plan_vrows(y, "ssm_conv1d.weight", src, kc, 2 * K, 2 * K, d, HYB_F32);
    rc = rc ? rc : plan_vhead_vec(y, "ssm_dt.bias", "linear_attn.dt_bias", CONVERT_OP_NONE);
    rc = rc ? rc : plan_vhead_vec(y, "ssm_a", "linear_attn.A_log", CONVERT_OP_NEG_EXP);
    rc = rc ? rc : hyb_direct(y, "ssm_norm.weight", "linear_attn.norm.weight", d, 0, HYB_F32);
    /* out_proj [H, V] -> {V, H}: its input columns follow the value heads */
    uint64_t oshape[2] = {H, V};
    rc = rc ? rc : hyb_src(y, "linear_attn.out_proj.weight", 2, oshape, &src);
    if (rc)
        return rc;
    struct convert_tensor *t = hyb_add(y, "ssm_out.weight", V, H, 1, 0);
    if (!t)
        return -ENOMEM;
    t->seg[0] = rows_of(src, 0, H, V);
    t->col_perm = vhead_perm(hp, d, &rc);
    return rc;
}

/* The gated full attention of layer l: q_proj holds [q (hd) | gate (hd)] per head. */
static int plan_attn(const struct hyb_layer *y)
{
    const struct convert_hparams *hp = y->hp;
    const uint64_t H = hp->n_embd, hd = hp->head_dim;
    const uint64_t QW = hp->n_head * hd, KVW = hp->n_head_kv * hd;
    int rc = hyb_direct(y, "attn_q.weight", "self_attn.q_proj.weight", H, 2 * QW, 0);

    rc = rc ? rc : hyb_direct(y, "attn_k.weight", "self_attn.k_proj.weight", H, KVW, 0);
    rc = rc ? rc : hyb_direct(y, "attn_v.weight", "self_attn.v_proj.weight", H, KVW, 0);
    rc = rc ? rc : hyb_direct(y, "attn_output.weight", "self_attn.o_proj.weight", QW, H, 0);
    rc = rc ? rc
            : hyb_direct(y, "attn_q_norm.weight", "self_attn.q_norm.weight", hd, 0,
                         HYB_F32 | HYB_ADD_ONE);
    return rc ? rc
              : hyb_direct(y, "attn_k_norm.weight", "self_attn.k_norm.weight", hd, 0,
                           HYB_F32 | HYB_ADD_ONE);
}

/* The MoE block: router, routed experts, the shared expert and its sigmoid gate. */
static int plan_moe(const struct hyb_layer *y)
{
    const struct convert_hparams *hp = y->hp;
    const uint64_t H = hp->n_embd, E = hp->n_expert, Fs = hp->n_ff_shexp;
    const struct safetensors_tensor *src;
    uint64_t gshape[2] = {1, H};
    int rc = hyb_direct(y, "ffn_gate_inp.weight", "mlp.gate.weight", H, E, HYB_F32);

    rc = rc ? rc : convert_plan_experts(y->p, y->c, hp, y->l, y->lp);
    rc = rc ? rc : hyb_src(y, "mlp.shared_expert_gate.weight", 2, gshape, &src);
    if (rc)
        return rc;
    struct convert_tensor *t = hyb_add(y, "ffn_gate_inp_shexp.weight", H, 0, 1, HYB_F32);
    if (!t)
        return -ENOMEM;
    t->seg[0] = rows_of(src, 0, 1, H);
    rc = hyb_direct(y, "ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight", H, Fs, 0);
    rc = rc ? rc
            : hyb_direct(y, "ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight", H, Fs, 0);
    return rc ? rc
              : hyb_direct(y, "ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight", Fs, H,
                           0);
}

/* Block l from the HF decoder layer under lp: gated full attention or a Gated DeltaNet, then
 * the MoE. */
static int plan_block(struct convert_plan *p, struct hf_ckpt *c, const struct convert_hparams *hp,
                      uint32_t l, const char *lp, bool full)
{
    struct hyb_layer y = {.p = p, .c = c, .hp = hp, .l = l};
    const uint64_t H = hp->n_embd;

    snprintf(y.lp, sizeof(y.lp), "%s", lp);
    int rc =
        hyb_direct(&y, "attn_norm.weight", "input_layernorm.weight", H, 0, HYB_F32 | HYB_ADD_ONE);
    rc = rc ? rc : full ? plan_attn(&y) : plan_gdn(&y);
    rc = rc ? rc
            : hyb_direct(&y, "post_attention_norm.weight", "post_attention_layernorm.weight", H, 0,
                         HYB_F32 | HYB_ADD_ONE);
    return rc ? rc : plan_moe(&y);
}

/* Main layer l: model.layers.l. (or model.language_model.layers.l.). */
static int plan_layer(struct convert_plan *p, struct hf_ckpt *c, const struct convert_hparams *hp,
                      uint32_t l)
{
    char lp[64];

    snprintf(lp, sizeof(lp), "%slayers.%u.", hp->prefix, l);
    return plan_block(p, c, hp, l, lp, (l + 1) % hp->full_attn_interval == 0);
}

/* The MTP head as block n_layer (see the top of the file). */
static int plan_mtp(struct convert_plan *p, struct hf_ckpt *c, const struct convert_hparams *hp)
{
    struct hyb_layer y = {.p = p, .c = c, .hp = hp, .l = hp->n_layer, .lp = "mtp."};
    const uint64_t H = hp->n_embd;
    const unsigned norm = HYB_F32 | HYB_ADD_ONE;

    /* fc [H, 2H] as it is: ne0 = 2H inputs, the embedding half first */
    int rc = hyb_direct(&y, "nextn.eh_proj.weight", "fc.weight", 2 * H, H, 0);
    rc = rc ? rc : hyb_direct(&y, "nextn.enorm.weight", "pre_fc_norm_embedding.weight", H, 0, norm);
    rc = rc ? rc : hyb_direct(&y, "nextn.hnorm.weight", "pre_fc_norm_hidden.weight", H, 0, norm);
    rc = rc ? rc : hyb_direct(&y, "nextn.shared_head_norm.weight", "norm.weight", H, 0, norm);
    return rc ? rc : plan_block(p, c, hp, hp->n_layer, "mtp.layers.0.", true);
}

/* Marks the tensors under PREFIX used and says that they are dropped and why. */
static void drop_prefix(const struct convert_config *cfg, struct hf_ckpt *c, const char *prefix,
                        const char *what, const char *why)
{
    uint32_t n = 0;

    for (uint32_t i = 0; i < c->n_tensors; i++)
        if (!strncmp(c->tensors[i]->name, prefix, strlen(prefix))) {
            c->used[i] = true;
            n++;
        }
    if (n)
        convert_notice(cfg, "%u tensor%s of the %s (%s*) dropped: %s", n, n > 1 ? "s" : "", what,
                       prefix, why);
}

int convert_hybrid_plan(const struct convert_config *cfg, struct convert_plan *p, struct hf_ckpt *c,
                        const struct convert_hparams *hp)
{
    uint64_t emb[2] = {hp->n_vocab, hp->n_embd};
    char hf[128];
    int rc;

    snprintf(hf, sizeof(hf), "%sembed_tokens.weight", hp->prefix);
    rc = convert_plan_direct(p, c, "token_embd.weight", hf, 2, emb);
    for (uint32_t l = 0; !rc && l < hp->n_layer; l++)
        rc = plan_layer(p, c, hp, l);
    if (!rc && hp->n_nextn)
        rc = plan_mtp(p, c, hp);
    snprintf(hf, sizeof(hf), "%snorm.weight", hp->prefix);
    rc = rc ? rc : convert_plan_direct(p, c, "output_norm.weight", hf, 1, &emb[1]);
    if (!rc) {
        p->t[p->n - 1].force_type = QUANT_F32;
        p->t[p->n - 1].op = CONVERT_OP_ADD_ONE;
    }
    if (!rc && !hp->tied)
        rc = convert_plan_direct(p, c, "output.weight", "lm_head.weight", 2, emb);
    if (!rc && hp->tied)
        hf_ckpt_find(c, "lm_head.weight"); /* a tied copy is not an unused tensor */
    if (!rc && !hp->n_nextn)
        drop_prefix(cfg, c, "mtp.", "multi-token-prediction head",
                    cfg->no_mtp ? "--no-mtp"
                                : "config.json's mtp_num_hidden_layers is 0 or absent");
    if (!rc)
        drop_prefix(cfg, c, "model.visual.", "vision tower", "strata converts the text model only");
    return rc;
}
