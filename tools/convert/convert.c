/* convert: the qwen3moe tensor plan (names, shapes, expert layouts), the hyperparameter keys
 * (config.json is audited first by convert_keys.c), and the parallel row conversion into the
 * GGUF writer. Formats: docs/formats.md §4, §6; config.json keys: docs/convert-keys.md. */
#include "convert.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <json-c/json.h>

#include "convert_priv.h"
#include "errors.h"
#include "fp16.h"
#include "gguf.h"
#include "hf_ckpt.h"
#include "quant.h"
#include "quant_ref.h"
#include "safetensors.h"

#define ARCH "qwen3moe"
#define CONVERT_CHUNK_BYTES (4u << 20) /* output bytes one worker converts at a time */

struct convert_hparams {
    uint32_t n_layer, n_embd, n_ff, n_ff_exp;
    uint32_t n_head, n_head_kv, head_dim;
    uint32_t n_expert, n_expert_used, n_vocab, n_ctx; /* n_ff, n_ctx: 0 when absent */
    double rms_eps, rope_base;
    bool tied;
};

/* n_rows consecutive rows of ne0 elements of src, starting at element elem0. */
struct convert_segment {
    const struct safetensors_tensor *src;
    uint64_t elem0;
    uint64_t n_rows;
};

struct convert_tensor {
    char name[GGUF_NAME_MAX + 1];
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    bool fell_back;
    uint64_t n_rows, row_bytes; /* ne1*ne2*ne3, bytes of one output row */
    uint32_t n_seg;
    struct convert_segment *seg; /* (n_seg) owned */
    int idx;                     /* writer index */
};

struct convert_plan {
    uint32_t n, cap;
    struct convert_tensor *t; /* (n) owned */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void convert_event_text(const struct convert_config *cfg, enum convert_event_kind kind,
                               const char *fmt, va_list ap)
{
    char text[1024];

    if (!cfg->progress)
        return;
    vsnprintf(text, sizeof(text), fmt, ap);
    struct convert_event ev = {.kind = kind, .text = text};
    cfg->progress(cfg->progress_arg, &ev);
}

void convert_notice(const struct convert_config *cfg, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    convert_event_text(cfg, CONVERT_EVENT_NOTICE, fmt, ap);
    va_end(ap);
}

void convert_warning(const struct convert_config *cfg, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    convert_event_text(cfg, CONVERT_EVENT_WARNING, fmt, ap);
    va_end(ap);
}

/* ---- hyperparameters ---------------------------------------------------------------------- */

static int cfg_u32(const struct hf_ckpt *c, const char *key, uint32_t *out)
{
    int rc = hf_ckpt_config_u32(c, key, out);
    if (rc == -ENOENT)
        return err_set(rc, "%s/config.json: %s is missing", c->dir, key);
    return rc;
}

/* Optional u32: *out keeps its value when the key is absent. */
static int cfg_u32_opt(const struct hf_ckpt *c, const char *key, uint32_t *out)
{
    int rc = hf_ckpt_config_u32(c, key, out);
    return rc == -ENOENT ? 0 : rc;
}

static int check_arch(const struct hf_ckpt *c)
{
    const char *mt = hf_ckpt_config_str(c, "model_type");
    json_object *archs = hf_ckpt_config_get(c, "architectures");
    const char *a0 = NULL;

    if (archs && json_object_is_type(archs, json_type_array) && json_object_array_length(archs) > 0)
        a0 = json_object_get_string(json_object_array_get_idx(archs, 0));
    if ((mt && !strcmp(mt, "qwen3_moe")) || (!mt && a0 && !strcmp(a0, "Qwen3MoeForCausalLM")))
        return 0;
    return err_set(-ENOTSUP,
                   "%s/config.json: unsupported architecture '%s' (model_type '%s'); "
                   "strata convert supports Qwen3MoeForCausalLM (model_type qwen3_moe)",
                   c->dir, a0 ? a0 : "(none)", mt ? mt : "(none)");
}

/* rope_theta: top-level (transformers 4.x) or inside rope_scaling / rope_parameters (5.x);
 * convert_keys_check has made them agree and the rope type default. */
static void read_rope(const struct convert_config *cfg, const struct hf_ckpt *c,
                      struct convert_hparams *hp)
{
    static const char *const nested[] = {"rope_scaling", "rope_parameters"};
    json_object *v = hf_ckpt_config_get(c, "rope_theta");

    for (size_t i = 0; !v && i < sizeof(nested) / sizeof(nested[0]); i++) {
        json_object *o = hf_ckpt_config_get(c, nested[i]);
        if (!o || !json_object_object_get_ex(o, "rope_theta", &v))
            v = NULL;
    }
    if (v) {
        hp->rope_base = json_object_get_double(v);
    } else {
        hp->rope_base = 10000.0;
        convert_notice(cfg, "config.json has no rope_theta; using %g", hp->rope_base);
    }
}

/* The implemented keys of the table in convert_keys.c, once convert_keys_check has passed. */
static int read_hparams(const struct convert_config *cfg, const struct hf_ckpt *c,
                        struct convert_hparams *hp)
{
    int rc = check_arch(c);

    rc = rc ? rc : convert_keys_check(cfg, c);
    memset(hp, 0, sizeof(*hp));
    rc = rc ? rc : cfg_u32(c, "num_hidden_layers", &hp->n_layer);
    rc = rc ? rc : cfg_u32(c, "hidden_size", &hp->n_embd);
    rc = rc ? rc : cfg_u32(c, "num_attention_heads", &hp->n_head);
    if (!rc && !hf_ckpt_config_get(c, "num_key_value_heads"))
        rc = err_set(-ENOENT,
                     "%s/config.json: num_key_value_heads is missing (transformers' Qwen3MoeConfig "
                     "would take 4, not the head count)",
                     c->dir);
    rc = rc ? rc : cfg_u32(c, "num_key_value_heads", &hp->n_head_kv);
    rc = rc ? rc : cfg_u32(c, "moe_intermediate_size", &hp->n_ff_exp);
    rc = rc ? rc : cfg_u32(c, "num_experts_per_tok", &hp->n_expert_used);
    rc = rc ? rc : cfg_u32(c, "vocab_size", &hp->n_vocab);
    if (rc)
        return rc;
    hp->head_dim = hp->n_head ? hp->n_embd / hp->n_head : 0;
    rc = rc ? rc : cfg_u32_opt(c, "head_dim", &hp->head_dim);
    rc = rc ? rc : cfg_u32_opt(c, "intermediate_size", &hp->n_ff);
    rc = rc ? rc : cfg_u32_opt(c, "max_position_embeddings", &hp->n_ctx);
    if (rc)
        return rc;
    /* transformers 5.x maps num_experts to num_local_experts */
    if (hf_ckpt_config_u32(c, "num_experts", &hp->n_expert) == -ENOENT &&
        (rc = cfg_u32(c, "num_local_experts", &hp->n_expert)))
        return err_wrap(rc, "num_experts: ");
    hp->rms_eps = 1e-6;
    if ((rc = hf_ckpt_config_f64(c, "rms_norm_eps", &hp->rms_eps)) && rc != -ENOENT)
        return rc;
    hp->tied = hf_ckpt_config_bool(c, "tie_word_embeddings", false);
    read_rope(cfg, c, hp);
    err_clear();

    if (!hp->n_layer || !hp->n_embd || !hp->n_head || !hp->n_head_kv || !hp->head_dim ||
        !hp->n_expert || !hp->n_expert_used || !hp->n_ff_exp || !hp->n_vocab)
        return err_set(-EINVAL,
                       "%s/config.json: a size is zero (layers %u, hidden %u, heads "
                       "%u/%u, head_dim %u, experts %u top %u, moe ffn %u, vocab %u)",
                       c->dir, hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->head_dim,
                       hp->n_expert, hp->n_expert_used, hp->n_ff_exp, hp->n_vocab);
    if (hp->n_head % hp->n_head_kv || hp->n_expert_used > hp->n_expert || hp->head_dim % 2)
        return err_set(-EINVAL,
                       "%s/config.json: heads %u / kv heads %u, top-k %u of %u "
                       "experts, head_dim %u are inconsistent",
                       c->dir, hp->n_head, hp->n_head_kv, hp->n_expert_used, hp->n_expert,
                       hp->head_dim);
    if (!(hp->rms_eps > 0.0))
        return err_set(-EINVAL, "%s/config.json: rms_norm_eps %g must be positive", c->dir,
                       hp->rms_eps);
    if (!(hp->rope_base > 0.0) || !isfinite(hp->rope_base))
        return err_set(-EINVAL, "%s/config.json: rope_theta %g must be positive", c->dir,
                       hp->rope_base);
    return 0;
}

static int add_hparams(struct gguf_writer *w, const struct convert_config *cfg,
                       const struct hf_ckpt *c, const struct convert_hparams *hp)
{
    const char *base = strrchr(c->dir, '/');
    const char *name = cfg->name ? cfg->name : base && base[1] ? base + 1 : c->dir;
    int rc = 0;

#define U32(key, val) (rc = rc ? rc : gguf_writer_add_u32(w, key, val))
#define F32(key, val) (rc = rc ? rc : gguf_writer_add_f32(w, key, (float)(val)))
#define STR(key, val) (rc = rc ? rc : gguf_writer_add_str(w, key, val))
    STR("general.architecture", ARCH);
    STR("general.name", name);
    U32("general.file_type", quant_mix_file_type(cfg->mix));
    U32("general.quantization_version", 2);
    if (hp->n_ctx)
        U32(ARCH ".context_length", hp->n_ctx);
    U32(ARCH ".embedding_length", hp->n_embd);
    if (hp->n_ff)
        U32(ARCH ".feed_forward_length", hp->n_ff);
    U32(ARCH ".block_count", hp->n_layer);
    U32(ARCH ".attention.head_count", hp->n_head);
    U32(ARCH ".attention.head_count_kv", hp->n_head_kv);
    U32(ARCH ".attention.key_length", hp->head_dim);
    U32(ARCH ".attention.value_length", hp->head_dim);
    F32(ARCH ".rope.freq_base", hp->rope_base);
    F32(ARCH ".attention.layer_norm_rms_epsilon", hp->rms_eps);
    U32(ARCH ".expert_count", hp->n_expert);
    U32(ARCH ".expert_used_count", hp->n_expert_used);
    U32(ARCH ".expert_feed_forward_length", hp->n_ff_exp);
#undef U32
#undef F32
#undef STR
    return rc;
}

/* ---- the tensor plan ---------------------------------------------------------------------- */

static void plan_free(struct convert_plan *p)
{
    for (uint32_t i = 0; i < p->n; i++)
        free(p->t[i].seg);
    free(p->t);
    memset(p, 0, sizeof(*p));
}

/* Appends an output tensor with n_seg empty segments. */
static struct convert_tensor *plan_add(struct convert_plan *p, const char *name, uint32_t n_dims,
                                       const uint64_t *ne, uint32_t n_seg)
{
    if (p->n == p->cap) {
        uint32_t cap = p->cap ? 2 * p->cap : 64;
        struct convert_tensor *t = realloc(p->t, cap * sizeof(*t));
        if (!t) {
            err_set(-ENOMEM, "out of memory");
            return NULL;
        }
        p->t = t;
        p->cap = cap;
    }
    struct convert_tensor *t = &p->t[p->n];
    memset(t, 0, sizeof(*t));
    t->seg = calloc(n_seg, sizeof(*t->seg));
    if (!t->seg) {
        err_set(-ENOMEM, "out of memory");
        return NULL;
    }
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->n_dims = n_dims;
    t->n_rows = 1;
    for (uint32_t i = 0; i < 4; i++) {
        t->ne[i] = i < n_dims ? ne[i] : 1;
        if (i > 0)
            t->n_rows *= t->ne[i];
    }
    t->n_seg = n_seg;
    p->n++;
    return t;
}

static const char *shape_str(uint32_t n, const uint64_t *shape, char *buf, unsigned size)
{
    struct safetensors_tensor t = {.n_dims = n};
    memcpy(t.shape, shape, n * sizeof(*shape));
    return safetensors_shape_str(&t, buf, size);
}

/* Looks up HF tensor NAME and checks its dtype and PyTorch-order shape. */
static int hf_get(struct hf_ckpt *c, const char *name, uint32_t n_dims, const uint64_t *shape,
                  const struct safetensors_tensor **out)
{
    const struct safetensors_tensor *t = hf_ckpt_find(c, name);
    char got[128], want[128], src[256];

    if (!t)
        return err_set(-ENOENT, "tensor '%s' is missing from %s", name,
                       hf_ckpt_source(c, src, sizeof(src)));
    if (t->dtype != SAFETENSORS_F32 && t->dtype != SAFETENSORS_BF16 && t->dtype != SAFETENSORS_F16)
        return err_set(-ENOTSUP,
                       "tensor '%s' has dtype %s; strata convert reads F32, BF16 and "
                       "F16",
                       name, t->dtype_name);
    bool same = t->n_dims == n_dims;
    for (uint32_t i = 0; same && i < n_dims; i++)
        same = t->shape[i] == shape[i];
    if (!same)
        return err_set(-EINVAL, "tensor '%s' has shape %s, expected %s (from config.json)", name,
                       safetensors_shape_str(t, got, sizeof(got)),
                       shape_str(n_dims, shape, want, sizeof(want)));
    *out = t;
    return 0;
}

/* A GGUF tensor that is one whole HF tensor of PyTorch shape `shape` (ne = reversed shape). */
static int plan_direct(struct convert_plan *p, struct hf_ckpt *c, const char *gguf_name,
                       const char *hf_name, uint32_t n_dims, const uint64_t *shape)
{
    const struct safetensors_tensor *src;
    uint64_t ne[4];
    int rc = hf_get(c, hf_name, n_dims, shape, &src);

    if (rc)
        return rc;
    for (uint32_t i = 0; i < n_dims; i++)
        ne[i] = shape[n_dims - 1 - i];
    struct convert_tensor *t = plan_add(p, gguf_name, n_dims, ne, 1);
    if (!t)
        return -ENOMEM;
    t->seg[0] = (struct convert_segment){src, 0, t->n_rows};
    return 0;
}

enum expert_proj { PROJ_GATE, PROJ_UP, PROJ_DOWN };

/* blk.L.ffn_{gate,up,down}_exps from per-expert or fused HF tensors. */
static int plan_experts(struct convert_plan *p, struct hf_ckpt *c, const struct convert_hparams *hp,
                        uint32_t l, enum expert_proj proj)
{
    static const char *const gguf[] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    static const char *const hf[] = {"gate_proj", "up_proj", "down_proj"};
    const uint64_t E = hp->n_expert, F = hp->n_ff_exp, H = hp->n_embd;
    char name[GGUF_NAME_MAX + 1], hf_name[256];
    const struct safetensors_tensor *src;
    bool down = proj == PROJ_DOWN;
    uint64_t ne[3] = {down ? F : H, down ? H : F, E};
    int rc;

    snprintf(name, sizeof(name), "blk.%u.%s.weight", l, gguf[proj]);
    snprintf(hf_name, sizeof(hf_name), "model.layers.%u.mlp.experts.%s", l,
             down ? "down_proj" : "gate_up_proj");
    if (hf_ckpt_find(c, hf_name)) { /* fused */
        if (down) {
            uint64_t shape[3] = {E, H, F};
            return plan_direct(p, c, name, hf_name, 3, shape);
        }
        uint64_t shape[3] = {E, 2 * F, H};
        if ((rc = hf_get(c, hf_name, 3, shape, &src)))
            return rc;
        struct convert_tensor *t = plan_add(p, name, 3, ne, (uint32_t)E);
        if (!t)
            return -ENOMEM;
        for (uint64_t e = 0; e < E; e++) /* gate rows 0..F-1, up rows F..2F-1 of each expert */
            t->seg[e] = (struct convert_segment){src, (e * 2 * F + (proj == PROJ_UP) * F) * H, F};
        return 0;
    }
    struct convert_tensor *t = plan_add(p, name, 3, ne, (uint32_t)E);
    if (!t)
        return -ENOMEM;
    uint64_t shape[2] = {ne[1], ne[0]};
    for (uint64_t e = 0; e < E; e++) {
        snprintf(hf_name, sizeof(hf_name), "model.layers.%u.mlp.experts.%llu.%s.weight", l,
                 (unsigned long long)e, hf[proj]);
        if ((rc = hf_get(c, hf_name, 2, shape, &src))) {
            if (rc == -ENOENT && e == 0)
                err_wrap(rc,
                         "layer %u has neither fused experts "
                         "(model.layers.%u.mlp.experts.gate_up_proj) nor per-expert ones: ",
                         l, l);
            return rc;
        }
        t->seg[e] = (struct convert_segment){src, 0, ne[1]};
    }
    return 0;
}

static int plan_layer(struct convert_plan *p, struct hf_ckpt *c, const struct convert_hparams *hp,
                      uint32_t l)
{
    const uint64_t H = hp->n_embd, D = hp->head_dim, E = hp->n_expert;
    const uint64_t QW = (uint64_t)hp->n_head * D, KVW = (uint64_t)hp->n_head_kv * D;
    static const struct {
        const char *gguf, *hf;
        int kind; /* 0: (H), 1: (QW, H), 2: (KVW, H), 3: (H, QW), 4: (D), 5: (E, H) */
    } map[] = {
        {"attn_norm", "input_layernorm", 0},    {"attn_q", "self_attn.q_proj", 1},
        {"attn_k", "self_attn.k_proj", 2},      {"attn_v", "self_attn.v_proj", 2},
        {"attn_output", "self_attn.o_proj", 3}, {"attn_q_norm", "self_attn.q_norm", 4},
        {"attn_k_norm", "self_attn.k_norm", 4}, {"ffn_norm", "post_attention_layernorm", 0},
        {"ffn_gate_inp", "mlp.gate", 5},
    };
    const uint64_t shapes[6][2] = {{H, 0}, {QW, H}, {KVW, H}, {H, QW}, {D, 0}, {E, H}};
    char g[GGUF_NAME_MAX + 1], h[256];
    int rc = 0;

    for (size_t i = 0; !rc && i < sizeof(map) / sizeof(map[0]); i++) {
        int k = map[i].kind;
        snprintf(g, sizeof(g), "blk.%u.%s.weight", l, map[i].gguf);
        snprintf(h, sizeof(h), "model.layers.%u.%s.weight", l, map[i].hf);
        rc = plan_direct(p, c, g, h, shapes[k][1] ? 2 : 1, shapes[k]);
    }
    rc = rc ? rc : plan_experts(p, c, hp, l, PROJ_GATE);
    rc = rc ? rc : plan_experts(p, c, hp, l, PROJ_UP);
    rc = rc ? rc : plan_experts(p, c, hp, l, PROJ_DOWN);
    return rc;
}

static int plan_build(struct convert_plan *p, struct hf_ckpt *c, const struct convert_hparams *hp)
{
    uint64_t emb[2] = {hp->n_vocab, hp->n_embd}, norm[1] = {hp->n_embd};
    int rc = plan_direct(p, c, "token_embd.weight", "model.embed_tokens.weight", 2, emb);

    for (uint32_t l = 0; !rc && l < hp->n_layer; l++)
        rc = plan_layer(p, c, hp, l);
    rc = rc ? rc : plan_direct(p, c, "output_norm.weight", "model.norm.weight", 1, norm);
    if (!rc && !hp->tied)
        rc = plan_direct(p, c, "output.weight", "lm_head.weight", 2, emb);
    if (!rc && hp->tied)
        hf_ckpt_find(c, "lm_head.weight"); /* a tied copy is not an unused tensor */
    return rc;
}

/* Reports checkpoint tensors the plan did not use (MTP heads, rotary buffers, ...). */
static uint32_t report_unused(const struct convert_config *cfg, const struct hf_ckpt *c)
{
    uint32_t n = 0;
    char list[512] = "";
    size_t len = 0;

    for (uint32_t i = 0; i < c->n_tensors; i++) {
        if (c->used[i])
            continue;
        if (n < 4 && len < sizeof(list))
            len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%s", n ? ", " : "",
                                    c->tensors[i]->name);
        n++;
    }
    if (n)
        convert_notice(cfg, "%u checkpoint tensor%s not converted: %s%s", n, n > 1 ? "s" : "", list,
                       n > 4 ? ", ..." : "");
    return n;
}

/* ---- row conversion ----------------------------------------------------------------------- */

/* n elements of src from element elem0 as floats. */
static void src_to_f32(const struct safetensors_tensor *src, uint64_t elem0, uint64_t n, float *dst)
{
    const uint8_t *p = (const uint8_t *)src->data + elem0 * safetensors_dtype_size(src->dtype);
    uint16_t h;

    switch (src->dtype) {
    case SAFETENSORS_F32:
        memcpy(dst, p, n * sizeof(float));
        break;
    case SAFETENSORS_BF16:
        for (uint64_t i = 0; i < n; i++) {
            memcpy(&h, p + 2 * i, 2);
            dst[i] = bf16_to_f32(h);
        }
        break;
    default: /* F16: hf_get admits nothing else */
        for (uint64_t i = 0; i < n; i++) {
            memcpy(&h, p + 2 * i, 2);
            dst[i] = fp16_to_f32(h);
        }
        break;
    }
}

/* Converts output rows [row0, row0 + n) of t into dst; scratch holds ne0 floats. */
static int rows_convert(const struct convert_tensor *t, uint64_t row0, uint64_t n, uint8_t *dst,
                        float *scratch)
{
    const uint64_t ne0 = t->ne[0];
    uint32_t s = 0;
    uint64_t seg_row0 = 0;

    while (s < t->n_seg && row0 >= seg_row0 + t->seg[s].n_rows)
        seg_row0 += t->seg[s++].n_rows;
    for (uint64_t r = row0; r < row0 + n; r++, dst += t->row_bytes) {
        while (r >= seg_row0 + t->seg[s].n_rows)
            seg_row0 += t->seg[s++].n_rows;
        const struct convert_segment *sg = &t->seg[s];
        uint64_t elem = sg->elem0 + (r - seg_row0) * ne0;
        enum safetensors_dtype dt = sg->src->dtype;

        if ((t->type == QUANT_F32 && dt == SAFETENSORS_F32) ||
            (t->type == QUANT_BF16 && dt == SAFETENSORS_BF16) ||
            (t->type == QUANT_F16 && dt == SAFETENSORS_F16)) {
            memcpy(dst, (const uint8_t *)sg->src->data + elem * safetensors_dtype_size(dt),
                   t->row_bytes);
            continue;
        }
        src_to_f32(sg->src, elem, ne0, scratch);
        if (t->type == QUANT_F32) {
            memcpy(dst, scratch, ne0 * sizeof(float));
            continue;
        }
        for (uint64_t i = 0; t->type != QUANT_BF16 && t->type != QUANT_F16 && i < ne0; i++)
            if (!isfinite(scratch[i]))
                return err_set(-EINVAL,
                               "tensor '%s' (from '%s'): element %llu of row %llu is "
                               "not finite",
                               t->name, sg->src->name, (unsigned long long)i,
                               (unsigned long long)r);
        int rc = quant_ref_quantize(t->type, scratch, dst, (int64_t)ne0);
        if (rc)
            return err_set(rc, "tensor '%s': cannot quantize to %s", t->name,
                           quant_type_name(t->type));
    }
    return 0;
}

/* Converts and writes one tensor with the OpenMP team, chunk by chunk. */
static int tensor_write(struct gguf_writer *w, const struct convert_tensor *t, uint32_t n_threads,
                        volatile sig_atomic_t *cancel)
{
    uint64_t chunk = CONVERT_CHUNK_BYTES / t->row_bytes;
    chunk = chunk ? chunk : 1;
    const int64_t n_chunks = (int64_t)((t->n_rows + chunk - 1) / chunk);
    int rc = 0;
    char msg[512] = "";

#pragma omp parallel num_threads(n_threads ? (int)n_threads : omp_get_max_threads())
    {
        uint8_t *buf = malloc(chunk * t->row_bytes);
        float *scratch = malloc(t->ne[0] * sizeof(float));
        int my_rc = buf && scratch ? 0 : err_set(-ENOMEM, "out of memory");

#pragma omp for schedule(dynamic, 1)
        for (int64_t ci = 0; ci < n_chunks; ci++) {
            int seen;
#pragma omp atomic read
            seen = rc;
            if (my_rc || seen || (cancel && *cancel))
                continue;
            uint64_t r0 = (uint64_t)ci * chunk;
            uint64_t n = t->n_rows - r0 < chunk ? t->n_rows - r0 : chunk;
            my_rc = rows_convert(t, r0, n, buf, scratch);
            if (!my_rc)
                my_rc = gguf_writer_pwrite(w, t->idx, r0 * t->row_bytes, buf, n * t->row_bytes);
        }
        if (my_rc) {
#pragma omp critical(convert_err)
            if (!rc) {
                rc = my_rc;
                snprintf(msg, sizeof(msg), "%s", err_msg());
            }
        }
        free(buf);
        free(scratch);
    }
    if (rc)
        return err_set(rc, "%s", msg);
    if (cancel && *cancel)
        return err_set(-EINTR, "interrupted");
    return 0;
}

/* ---- the run ------------------------------------------------------------------------------ */

static int plan_types(const struct convert_config *cfg, struct convert_plan *p,
                      struct gguf_writer *w, struct convert_stats *st)
{
    for (uint32_t i = 0; i < p->n; i++) {
        struct convert_tensor *t = &p->t[i];
        int rc;
        t->type = quant_mix_tensor_type(cfg->mix, t->name, t->n_dims, t->ne[0], &t->fell_back);
        if ((rc = quant_row_bytes(t->type, t->ne[0], &t->row_bytes)))
            return err_wrap(rc, "tensor '%s': ", t->name);
        if (t->type != QUANT_F32 && !quant_ref_can_quantize(t->type))
            return err_set(-ENOTSUP, "tensor '%s': strata cannot write %s", t->name,
                           quant_type_name(t->type));
        t->idx = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne);
        if (t->idx < 0)
            return t->idx;
        st->n_fallback += t->fell_back;
        st->n_params += t->ne[0] * t->n_rows;
        st->data_bytes += t->row_bytes * t->n_rows;
    }
    st->n_tensors = p->n;
    return 0;
}

static int run_write(const struct convert_config *cfg, struct convert_plan *p,
                     struct gguf_writer *w, struct convert_stats *st, double t0)
{
    uint64_t done = 0;
    int rc = gguf_writer_begin_data(w);

    for (uint32_t i = 0; !rc && i < p->n; i++) {
        const struct convert_tensor *t = &p->t[i];
        rc = tensor_write(w, t, cfg->n_threads, cfg->cancel);
        done += t->row_bytes * t->n_rows;
        if (!rc && cfg->progress) {
            struct convert_event ev = {
                .kind = CONVERT_EVENT_TENSOR,
                .name = t->name,
                .type = t->type,
                .n_dims = t->n_dims,
                .ne = t->ne,
                .fell_back = t->fell_back,
                .index = i + 1,
                .count = p->n,
                .done_bytes = done,
                .total_bytes = st->data_bytes,
                .seconds = now_s() - t0,
            };
            cfg->progress(cfg->progress_arg, &ev);
        }
    }
    return rc;
}

int convert_run(const struct convert_config *cfg, struct convert_stats *stats)
{
    struct convert_stats st = {0};
    struct convert_hparams hp;
    struct convert_plan plan = {0};
    struct hf_ckpt *c = NULL;
    struct gguf_writer *w = NULL;
    double t0 = now_s();
    int rc;

    if (cfg->mix >= QUANT_MIX_COUNT)
        return err_set(-EINVAL, "bad quant mix %d", (int)cfg->mix);
    rc = hf_ckpt_open(cfg->hf_dir, &c);
    rc = rc ? rc : read_hparams(cfg, c, &hp);
    rc = rc ? rc : plan_build(&plan, c, &hp);
    if (rc)
        goto out;
    st.n_unused = report_unused(cfg, c);
    rc = gguf_writer_open(cfg->out_path, GGUF_DEFAULT_ALIGNMENT, &w);
    if (rc)
        goto out;
    rc = add_hparams(w, cfg, c, &hp);
    rc = rc ? rc : convert_vocab_add(cfg, c, w, hp.n_vocab, &st.n_vocab);
    rc = rc ? rc : plan_types(cfg, &plan, w, &st);
    rc = rc ? rc : run_write(cfg, &plan, w, &st, t0);
    if (rc) {
        gguf_writer_abort(w);
        goto out;
    }
    rc = gguf_writer_finish(w);
out:
    plan_free(&plan);
    hf_ckpt_close(c);
    st.seconds = now_s() - t0;
    if (stats)
        *stats = st;
    return rc;
}
