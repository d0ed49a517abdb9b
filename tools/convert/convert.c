/* convert: the qwen3moe and gpt-oss tensor plans (names, shapes, expert layouts), the
 * hyperparameter keys (config.json is audited first by convert_keys.c), and the parallel row
 * conversion into the GGUF writer; the qwen3next / qwen35moe plans are in convert_hybrid.c.
 * Formats: docs/formats.md §4, §4b, §6; config.json keys: docs/convert-keys.md. */
#include "convert.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "convert_priv.h"
#include "errors.h"
#include "fp16.h"
#include "gguf.h"
#include "hf_ckpt.h"
#include "quant.h"
#include "quant_ref.h"
#include "safetensors.h"

#define CONVERT_CHUNK_BYTES (4u << 20) /* output bytes one worker converts at a time */

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
        return err_set(rc, "%s/config.json: %s%s is missing", c->dir, c->config_at, key);
    return rc;
}

/* Optional u32: *out keeps its value when the key is absent. */
static int cfg_u32_opt(const struct hf_ckpt *c, const char *key, uint32_t *out)
{
    int rc = hf_ckpt_config_u32(c, key, out);
    return rc == -ENOENT ? 0 : rc;
}

static bool arch_hybrid(enum convert_arch arch)
{
    return arch == CONVERT_ARCH_QWEN3NEXT || arch == CONVERT_ARCH_QWEN35MOE;
}

static int check_arch(const struct hf_ckpt *c, enum convert_arch *arch)
{
    const char *mt = hf_ckpt_config_str(c, "model_type");
    json_object *archs = hf_ckpt_config_get(c, "architectures");
    const char *a0 = NULL;

    if (archs && json_object_is_type(archs, json_type_array) && json_object_array_length(archs) > 0)
        a0 = json_object_get_string(json_object_array_get_idx(archs, 0));
    *arch = CONVERT_ARCH_QWEN3MOE;
    if ((mt && !strcmp(mt, "qwen3_moe")) || (!mt && a0 && !strcmp(a0, "Qwen3MoeForCausalLM")))
        return 0;
    *arch = CONVERT_ARCH_GPTOSS;
    if ((mt && !strcmp(mt, "gpt_oss")) || (!mt && a0 && !strcmp(a0, "GptOssForCausalLM")))
        return 0;
    *arch = CONVERT_ARCH_QWEN3NEXT;
    if ((mt && !strcmp(mt, "qwen3_next")) || (!mt && a0 && !strcmp(a0, "Qwen3NextForCausalLM")))
        return 0;
    *arch = CONVERT_ARCH_QWEN35MOE;
    if ((mt && (!strcmp(mt, "qwen3_5_moe") || !strcmp(mt, "qwen3_5_moe_text"))) ||
        (!mt && a0 &&
         (!strcmp(a0, "Qwen3_5MoeForCausalLM") ||
          !strcmp(a0, "Qwen3_5MoeForConditionalGeneration"))))
        return 0;
    return err_set(-ENOTSUP,
                   "%s/config.json: unsupported architecture '%s' (model_type '%s'); "
                   "strata convert supports Qwen3MoeForCausalLM (model_type qwen3_moe), "
                   "GptOssForCausalLM (gpt_oss), Qwen3NextForCausalLM (qwen3_next) and "
                   "Qwen3_5MoeForConditionalGeneration / Qwen3_5MoeForCausalLM (qwen3_5_moe, "
                   "qwen3_5_moe_text)",
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

/* gpt-oss's YaRN: rope_scaling (4.x) or rope_parameters (5.x) of type yarn; the key audit has
 * checked its other members. Absent or another type leaves rope scaling off (the audit refuses
 * the types strata does not compute). */
static int read_yarn(const struct hf_ckpt *c, struct convert_hparams *hp)
{
    static const char *const at[] = {"rope_scaling", "rope_parameters"};
    for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
        json_object *o = hf_ckpt_config_get(c, at[i]), *v;
        const char *type = NULL;
        if (!o || !json_object_is_type(o, json_type_object))
            continue;
        if (json_object_object_get_ex(o, "rope_type", &v) ||
            json_object_object_get_ex(o, "type", &v))
            type = json_object_get_string(v);
        if (!type || strcmp(type, "yarn"))
            continue;
        if (!json_object_object_get_ex(o, "factor", &v) || !v)
            return err_set(-EINVAL, "%s/config.json: %s.factor is missing (yarn)", c->dir, at[i]);
        hp->yarn_factor = json_object_get_double(v);
        if (!json_object_object_get_ex(o, "original_max_position_embeddings", &v) || !v)
            return err_set(-EINVAL,
                           "%s/config.json: %s.original_max_position_embeddings is missing "
                           "(yarn)",
                           c->dir, at[i]);
        hp->yarn_n_ctx_orig = (uint32_t)json_object_get_int64(v);
        if (!(hp->yarn_factor >= 1.0) || !isfinite(hp->yarn_factor) || !hp->yarn_n_ctx_orig)
            return err_set(-EINVAL,
                           "%s/config.json: yarn factor %g over %u positions (factor >= 1, "
                           "positions > 0)",
                           c->dir, hp->yarn_factor, hp->yarn_n_ctx_orig);
        /* transformers versions take the factor from this key or from max_position_embeddings
         * / original_max_position_embeddings: they must agree */
        if (hp->n_ctx && (double)hp->n_ctx / hp->yarn_n_ctx_orig != hp->yarn_factor)
            return err_set(-ENOTSUP,
                           "%s/config.json: %s.factor %g differs from max_position_embeddings "
                           "%u / original_max_position_embeddings %u; transformers versions "
                           "read one or the other",
                           c->dir, at[i], hp->yarn_factor, hp->n_ctx, hp->yarn_n_ctx_orig);
        return 0;
    }
    return 0;
}

/* The architecture's own sizes: qwen3moe's expert keys, gpt-oss's experts, window and YaRN. */
static int read_hparams_arch(const struct hf_ckpt *c, struct convert_hparams *hp)
{
    int rc = 0;
    if (hp->arch == CONVERT_ARCH_GPTOSS) {
        rc = rc ? rc : cfg_u32(c, "intermediate_size", &hp->n_ff_exp);
        rc = rc ? rc : cfg_u32(c, "num_local_experts", &hp->n_expert);
        rc = rc ? rc : cfg_u32(c, "sliding_window", &hp->n_swa);
        hp->n_ff = hp->n_ff_exp;
        if (!rc && !hp->n_swa)
            rc = err_set(-EINVAL, "%s/config.json: sliding_window is 0", c->dir);
        return rc ? rc : read_yarn(c, hp);
    }
    rc = rc ? rc : cfg_u32(c, "moe_intermediate_size", &hp->n_ff_exp);
    if (hp->arch == CONVERT_ARCH_QWEN3MOE) /* the hybrids' dense MLP width is not written */
        rc = rc ? rc : cfg_u32_opt(c, "intermediate_size", &hp->n_ff);
    if (rc)
        return rc;
    /* transformers 5.x maps num_experts to num_local_experts */
    if (hf_ckpt_config_u32(c, "num_experts", &hp->n_expert) == -ENOENT &&
        (rc = cfg_u32(c, "num_local_experts", &hp->n_expert)))
        return err_wrap(rc, "num_experts: ");
    return 0;
}

/* The implemented keys of the table in convert_keys.c, once convert_keys_check has passed. */
static int read_hparams(const struct convert_config *cfg, struct hf_ckpt *c,
                        struct convert_hparams *hp)
{
    enum convert_arch arch = CONVERT_ARCH_QWEN3MOE;
    int rc = check_arch(c, &arch);

    /* Qwen3.5's text model is configured by text_config (a qwen3_5_moe_text config alone has
     * none); the audit still reads the whole file. Without text_config transformers would
     * build its default text model, whatever the checkpoint holds. */
    const char *mt = hf_ckpt_config_str(c, "model_type");
    if (!rc && arch == CONVERT_ARCH_QWEN35MOE &&
        (hf_ckpt_config_get(c, "text_config") || (mt && !strcmp(mt, "qwen3_5_moe"))))
        rc = hf_ckpt_config_enter(c, "text_config");
    rc = rc ? rc : convert_keys_check(cfg, c, arch);
    memset(hp, 0, sizeof(*hp));
    hp->arch = arch;
    rc = rc ? rc : cfg_u32(c, "num_hidden_layers", &hp->n_layer);
    rc = rc ? rc : cfg_u32(c, "hidden_size", &hp->n_embd);
    rc = rc ? rc : cfg_u32(c, "num_attention_heads", &hp->n_head);
    if (!rc && !hf_ckpt_config_get(c, "num_key_value_heads"))
        rc = err_set(-ENOENT,
                     "%s/config.json: %snum_key_value_heads is missing (transformers would take "
                     "its config class's default, not the head count)",
                     c->dir, c->config_at);
    rc = rc ? rc : cfg_u32(c, "num_key_value_heads", &hp->n_head_kv);
    rc = rc ? rc : cfg_u32(c, "num_experts_per_tok", &hp->n_expert_used);
    rc = rc ? rc : cfg_u32(c, "vocab_size", &hp->n_vocab);
    if (rc)
        return rc;
    /* transformers' default: Qwen3-Next's and Qwen3.5's config classes say 256 */
    hp->head_dim = arch_hybrid(arch) ? 256 : hp->n_head ? hp->n_embd / hp->n_head : 0;
    rc = rc ? rc : cfg_u32_opt(c, "head_dim", &hp->head_dim);
    rc = rc ? rc : cfg_u32_opt(c, "max_position_embeddings", &hp->n_ctx);
    rc = rc ? rc : read_hparams_arch(c, hp);
    if (rc)
        return rc;
    hp->rms_eps = arch == CONVERT_ARCH_GPTOSS ? 1e-5 : 1e-6;
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
    return arch_hybrid(arch) ? convert_hybrid_hparams(cfg, c, hp) : 0;
}

static int add_hparams(struct gguf_writer *w, const struct convert_config *cfg,
                       const struct hf_ckpt *c, const struct convert_hparams *hp)
{
    const char *base = strrchr(c->dir, '/');
    const char *name = cfg->name ? cfg->name : base && base[1] ? base + 1 : c->dir;
    static const char *const arch_names[] = {
        [CONVERT_ARCH_QWEN3MOE] = "qwen3moe",
        [CONVERT_ARCH_GPTOSS] = "gpt-oss",
        [CONVERT_ARCH_QWEN3NEXT] = "qwen3next",
        [CONVERT_ARCH_QWEN35MOE] = "qwen35moe",
    };
    const bool oss = hp->arch == CONVERT_ARCH_GPTOSS;
    const char *arch = arch_names[hp->arch];
    char k[96];
    int rc = 0;

#define KEY(suffix) (snprintf(k, sizeof(k), "%s.%s", arch, suffix), k)
#define U32(key, val) (rc = rc ? rc : gguf_writer_add_u32(w, key, val))
#define F32(key, val) (rc = rc ? rc : gguf_writer_add_f32(w, key, (float)(val)))
#define STR(key, val) (rc = rc ? rc : gguf_writer_add_str(w, key, val))
    STR("general.architecture", arch);
    STR("general.name", name);
    U32("general.file_type", quant_mix_file_type(cfg->mix));
    U32("general.quantization_version", 2);
    if (hp->n_ctx)
        U32(KEY("context_length"), hp->n_ctx);
    U32(KEY("embedding_length"), hp->n_embd);
    if (hp->n_ff)
        U32(KEY("feed_forward_length"), hp->n_ff);
    U32(KEY("block_count"), hp->n_layer + hp->n_nextn);
    U32(KEY("attention.head_count"), hp->n_head);
    U32(KEY("attention.head_count_kv"), hp->n_head_kv);
    U32(KEY("attention.key_length"), hp->head_dim);
    U32(KEY("attention.value_length"), hp->head_dim);
    F32(KEY("rope.freq_base"), hp->rope_base);
    F32(KEY("attention.layer_norm_rms_epsilon"), hp->rms_eps);
    U32(KEY("expert_count"), hp->n_expert);
    U32(KEY("expert_used_count"), hp->n_expert_used);
    U32(KEY("expert_feed_forward_length"), hp->n_ff_exp);
    if (oss) {
        U32(KEY("attention.sliding_window"), hp->n_swa);
        if (hp->yarn_factor) {
            STR(KEY("rope.scaling.type"), "yarn");
            F32(KEY("rope.scaling.factor"), hp->yarn_factor);
            U32(KEY("rope.scaling.original_context_length"), hp->yarn_n_ctx_orig);
        }
    }
    if (!rc && arch_hybrid(hp->arch))
        rc = convert_hybrid_add_hparams(w, hp, arch);
#undef KEY
#undef U32
#undef F32
#undef STR
    return rc;
}

/* The checkpoint author's sampling defaults: generation_config.json's do_sample, temperature,
 * top_k, top_p, min_p and repetition_penalty as general.sampling.* (what strata run reads for
 * the flags a user does not give). do_sample false is greedy (temp 0). A value that is not a
 * number in the range the flag takes is left out with a notice; the other keys of that file
 * (token ids, lengths) do not change the computation. No file: nothing. */
static int add_sampling(struct gguf_writer *w, const struct convert_config *cfg,
                        const struct hf_ckpt *c)
{
    static const struct {
        const char *hf, *gguf;
        double lo, hi;
        bool integer;
    } keys[] = {
        {"temperature", "general.sampling.temp", 0, 100, false},
        {"top_k", "general.sampling.top_k", 0, 1 << 24, true},
        {"top_p", "general.sampling.top_p", 0, 1, false},
        {"min_p", "general.sampling.min_p", 0, 1, false},
        {"repetition_penalty", "general.sampling.penalty_repeat", 0.01, 100, false},
    };
    char path[4096];
    json_object *g, *v;
    int rc = 0;

    if (!hf_ckpt_path(c, "generation_config.json", path, sizeof(path)) || access(path, R_OK))
        return 0;
    if (!(g = json_object_from_file(path)) || !json_object_is_type(g, json_type_object)) {
        convert_notice(cfg, "%s: not a JSON object; no sampling defaults written", path);
        json_object_put(g);
        return 0;
    }
    const bool greedy = json_object_object_get_ex(g, "do_sample", &v) &&
                        json_object_is_type(v, json_type_boolean) && !json_object_get_boolean(v);
    if (greedy)
        rc = gguf_writer_add_f32(w, "general.sampling.temp", 0.0f);
    for (size_t i = 0; !rc && i < sizeof(keys) / sizeof(keys[0]); i++) {
        if (!json_object_object_get_ex(g, keys[i].hf, &v) || !v || (greedy && i == 0))
            continue;
        const bool num = json_object_is_type(v, json_type_double) ||
                         json_object_is_type(v, json_type_int);
        const double x = num ? json_object_get_double(v) : 0;
        if (!num || !(x >= keys[i].lo && x <= keys[i].hi) || (keys[i].integer && x != (int)x)) {
            convert_notice(cfg, "%s: %s = %s is not a sampling default strata takes; left out",
                           path, keys[i].hf, json_object_to_json_string(v));
            continue;
        }
        rc = keys[i].integer ? gguf_writer_add_u32(w, keys[i].gguf, (uint32_t)x)
                             : gguf_writer_add_f32(w, keys[i].gguf, (float)x);
    }
    json_object_put(g);
    return rc;
}

/* ---- the tensor plan ---------------------------------------------------------------------- */

static void plan_free(struct convert_plan *p)
{
    for (uint32_t i = 0; i < p->n; i++) {
        free(p->t[i].seg);
        free(p->t[i].col_perm);
    }
    free(p->t);
    memset(p, 0, sizeof(*p));
}

struct convert_tensor *convert_plan_add(struct convert_plan *p, const char *name, uint32_t n_dims,
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
    t->force_type = -1;
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

/* Looks up HF tensor NAME and checks its dtype (F32, BF16 or F16; U8 when u8) and
 * PyTorch-order shape. */
static int hf_get_as(struct hf_ckpt *c, const char *name, uint32_t n_dims, const uint64_t *shape,
                     bool u8, const struct safetensors_tensor **out)
{
    const struct safetensors_tensor *t = hf_ckpt_find(c, name);
    char got[128], want[128], src[256];

    if (!t)
        return err_set(-ENOENT, "tensor '%s' is missing from %s", name,
                       hf_ckpt_source(c, src, sizeof(src)));
    if (u8 && t->dtype != SAFETENSORS_U8)
        return err_set(-EINVAL, "tensor '%s' has dtype %s; MXFP4 blocks and scales are U8",
                       name, t->dtype_name);
    if (!u8 && t->dtype != SAFETENSORS_F32 && t->dtype != SAFETENSORS_BF16 &&
        t->dtype != SAFETENSORS_F16)
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

int convert_hf_get(struct hf_ckpt *c, const char *name, uint32_t n_dims, const uint64_t *shape,
                   const struct safetensors_tensor **out)
{
    return hf_get_as(c, name, n_dims, shape, false, out);
}

int convert_plan_direct(struct convert_plan *p, struct hf_ckpt *c, const char *gguf_name,
                        const char *hf_name, uint32_t n_dims, const uint64_t *shape)
{
    const struct safetensors_tensor *src;
    uint64_t ne[4];
    int rc = convert_hf_get(c, hf_name, n_dims, shape, &src);

    if (rc)
        return rc;
    for (uint32_t i = 0; i < n_dims; i++)
        ne[i] = shape[n_dims - 1 - i];
    struct convert_tensor *t = convert_plan_add(p, gguf_name, n_dims, ne, 1);
    if (!t)
        return -ENOMEM;
    t->seg[0] = (struct convert_segment){.src = src, .n_rows = t->n_rows};
    return 0;
}

enum expert_proj { PROJ_GATE, PROJ_UP, PROJ_DOWN };

/* blk.L.ffn_{gate,up,down}_exps from per-expert or fused HF tensors under layer prefix lp. */
static int plan_experts(struct convert_plan *p, struct hf_ckpt *c, const struct convert_hparams *hp,
                        uint32_t l, const char *lp, enum expert_proj proj)
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
    snprintf(hf_name, sizeof(hf_name), "%smlp.experts.%s", lp, down ? "down_proj" : "gate_up_proj");
    if (hf_ckpt_find(c, hf_name)) { /* fused */
        if (down) {
            uint64_t shape[3] = {E, H, F};
            return convert_plan_direct(p, c, name, hf_name, 3, shape);
        }
        uint64_t shape[3] = {E, 2 * F, H};
        if ((rc = convert_hf_get(c, hf_name, 3, shape, &src)))
            return rc;
        struct convert_tensor *t = convert_plan_add(p, name, 3, ne, (uint32_t)E);
        if (!t)
            return -ENOMEM;
        for (uint64_t e = 0; e < E; e++) /* gate rows 0..F-1, up rows F..2F-1 of each expert */
            t->seg[e] = (struct convert_segment){
                .src = src, .elem0 = (e * 2 * F + (proj == PROJ_UP) * F) * H, .n_rows = F};
        return 0;
    }
    struct convert_tensor *t = convert_plan_add(p, name, 3, ne, (uint32_t)E);
    if (!t)
        return -ENOMEM;
    uint64_t shape[2] = {ne[1], ne[0]};
    for (uint64_t e = 0; e < E; e++) {
        snprintf(hf_name, sizeof(hf_name), "%smlp.experts.%llu.%s.weight", lp,
                 (unsigned long long)e, hf[proj]);
        if ((rc = convert_hf_get(c, hf_name, 2, shape, &src))) {
            if (rc == -ENOENT && e == 0)
                err_wrap(rc,
                         "layer %u has neither fused experts "
                         "(%smlp.experts.gate_up_proj) nor per-expert ones: ",
                         l, lp);
            return rc;
        }
        t->seg[e] = (struct convert_segment){.src = src, .n_rows = ne[1]};
    }
    return 0;
}

int convert_plan_experts(struct convert_plan *p, struct hf_ckpt *c,
                         const struct convert_hparams *hp, uint32_t l, const char *lp)
{
    int rc = plan_experts(p, c, hp, l, lp, PROJ_GATE);
    rc = rc ? rc : plan_experts(p, c, hp, l, lp, PROJ_UP);
    return rc ? rc : plan_experts(p, c, hp, l, lp, PROJ_DOWN);
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
        rc = convert_plan_direct(p, c, g, h, shapes[k][1] ? 2 : 1, shapes[k]);
    }
    if (rc)
        return rc;
    snprintf(h, sizeof(h), "model.layers.%u.", l);
    return convert_plan_experts(p, c, hp, l, h);
}

/* ---- gpt-oss ---- */

/* The type of a gpt-oss expert matrix under the mix: as converted checkpoints carry them
 * (MXFP4) except under the float mixes. */
static int32_t gptoss_expert_type(enum quant_mix mix)
{
    return mix == QUANT_MIX_F32 ? QUANT_F32 : mix == QUANT_MIX_BF16 ? QUANT_BF16 : QUANT_MXFP4;
}

/* blk.L.ffn_{gate,up,down}_exps of gpt-oss. transformers keeps gate and up fused and
 * interleaved (gate = even outputs, up = odd), as float parameters in x·W order
 * (gate_up_proj [E, H, 2F], down_proj [E, F, H]) or as MXFP4 blocks in W·x order
 * (gate_up_proj_blocks [E, 2F, H/32, 16] + _scales [E, 2F, H/32], down_proj_blocks
 * [E, H, F/32, 16] + _scales); GGUF wants each output row contiguous. */
static int plan_gptoss_experts(struct convert_plan *p, struct hf_ckpt *c,
                               const struct convert_hparams *hp, enum quant_mix mix, uint32_t l,
                               enum expert_proj proj)
{
    static const char *const gguf[] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    const uint64_t E = hp->n_expert, F = hp->n_ff_exp, H = hp->n_embd;
    const bool down = proj == PROJ_DOWN;
    const uint64_t rows = down ? H : F, cols = down ? F : H; /* per expert, GGUF order */
    const uint64_t odd = proj == PROJ_UP;
    char name[GGUF_NAME_MAX + 1], hf[256], hs[256];
    const struct safetensors_tensor *src, *sc;
    uint64_t ne[3] = {cols, rows, E};
    int rc;

    snprintf(name, sizeof(name), "blk.%u.%s.weight", l, gguf[proj]);
    snprintf(hf, sizeof(hf), "model.layers.%u.mlp.experts.%s_blocks", l,
             down ? "down_proj" : "gate_up_proj");
    if (hf_ckpt_find(c, hf)) {
        snprintf(hs, sizeof(hs), "model.layers.%u.mlp.experts.%s_scales", l,
                 down ? "down_proj" : "gate_up_proj");
        if (cols % 32)
            return err_set(-EINVAL, "tensor '%s': rows of %llu are not MXFP4 blocks of 32", hf,
                           (unsigned long long)cols);
        const uint64_t r_all = down ? H : 2 * F;
        uint64_t bshape[4] = {E, r_all, cols / 32, 16}, sshape[3] = {E, r_all, cols / 32};
        if ((rc = hf_get_as(c, hf, 4, bshape, true, &src)) ||
            (rc = hf_get_as(c, hs, 3, sshape, true, &sc)))
            return rc;
        struct convert_tensor *t = convert_plan_add(p, name, 3, ne, (uint32_t)E);
        if (!t)
            return -ENOMEM;
        for (uint64_t e = 0; e < E; e++)
            t->seg[e] = down ? (struct convert_segment){src, e * H, H, 1, 0, sc}
                             : (struct convert_segment){src, e * 2 * F + odd, F, 2, 0, sc};
        t->force_type = gptoss_expert_type(mix);
        return 0;
    }
    snprintf(hf, sizeof(hf), "model.layers.%u.mlp.experts.%s", l,
             down ? "down_proj" : "gate_up_proj");
    uint64_t shape[3] = {E, down ? F : H, down ? H : 2 * F};
    if ((rc = convert_hf_get(c, hf, 3, shape, &src)))
        return rc;
    struct convert_tensor *t = convert_plan_add(p, name, 3, ne, (uint32_t)E);
    if (!t)
        return -ENOMEM;
    for (uint64_t e = 0; e < E; e++)
        t->seg[e] = down ? (struct convert_segment){src, e * F * H, H, 1, H, NULL}
                         : (struct convert_segment){src, e * H * 2 * F + odd, F, 2, 2 * F, NULL};
    t->force_type = gptoss_expert_type(mix);
    return 0;
}

/* The expert biases: gate_up_proj_bias [E, 2F] interleaved like the weights, down_proj_bias
 * [E, H]; F32 always. */
static int plan_gptoss_expert_bias(struct convert_plan *p, struct hf_ckpt *c,
                                   const struct convert_hparams *hp, uint32_t l)
{
    const uint64_t E = hp->n_expert, F = hp->n_ff_exp, H = hp->n_embd;
    char name[GGUF_NAME_MAX + 1], hf[256];
    const struct safetensors_tensor *src;
    uint64_t shape[2] = {E, 2 * F}, ne[2] = {F, E};
    int rc;

    snprintf(hf, sizeof(hf), "model.layers.%u.mlp.experts.gate_up_proj_bias", l);
    if ((rc = convert_hf_get(c, hf, 2, shape, &src)))
        return rc;
    for (uint64_t odd = 0; odd < 2; odd++) {
        snprintf(name, sizeof(name), "blk.%u.%s.bias", l, odd ? "ffn_up_exps" : "ffn_gate_exps");
        struct convert_tensor *t = convert_plan_add(p, name, 2, ne, 1);
        if (!t)
            return -ENOMEM;
        t->seg[0] = (struct convert_segment){src, odd, E, 2 * F, 2, NULL};
        t->force_type = QUANT_F32;
    }
    uint64_t dshape[2] = {E, H};
    snprintf(name, sizeof(name), "blk.%u.ffn_down_exps.bias", l);
    snprintf(hf, sizeof(hf), "model.layers.%u.mlp.experts.down_proj_bias", l);
    if ((rc = convert_plan_direct(p, c, name, hf, 2, dshape)))
        return rc;
    p->t[p->n - 1].force_type = QUANT_F32;
    return 0;
}

static int plan_gptoss_layer(struct convert_plan *p, struct hf_ckpt *c,
                             const struct convert_hparams *hp, enum quant_mix mix, uint32_t l)
{
    const uint64_t H = hp->n_embd, D = hp->head_dim, E = hp->n_expert, NH = hp->n_head;
    const uint64_t QW = NH * D, KVW = (uint64_t)hp->n_head_kv * D;
    static const struct {
        const char *gguf, *hf;
        int kind; /* shape: 0 (H), 1 (QW, H), 2 (KVW, H), 3 (H, QW), 4 (E, H), 5 (QW), 6 (KVW),
                   * 7 (E), 8 (n_head) */
        bool f32; /* F32 whatever the mix */
    } map[] = {
        {"attn_norm.weight", "input_layernorm.weight", 0, false},
        {"attn_q.weight", "self_attn.q_proj.weight", 1, false},
        {"attn_q.bias", "self_attn.q_proj.bias", 5, true},
        {"attn_k.weight", "self_attn.k_proj.weight", 2, false},
        {"attn_k.bias", "self_attn.k_proj.bias", 6, true},
        {"attn_v.weight", "self_attn.v_proj.weight", 2, false},
        {"attn_v.bias", "self_attn.v_proj.bias", 6, true},
        {"attn_output.weight", "self_attn.o_proj.weight", 3, false},
        {"attn_output.bias", "self_attn.o_proj.bias", 0, true},
        {"attn_sinks.weight", "self_attn.sinks", 8, true},
        {"post_attention_norm.weight", "post_attention_layernorm.weight", 0, false},
        {"ffn_gate_inp.weight", "mlp.router.weight", 4, false},
        {"ffn_gate_inp.bias", "mlp.router.bias", 7, true},
    };
    const uint64_t shapes[9][2] = {{H, 0},  {QW, H}, {KVW, H}, {H, QW}, {E, H},
                                   {QW, 0}, {KVW, 0}, {E, 0},  {NH, 0}};
    char g[GGUF_NAME_MAX + 1], h[256];
    int rc = 0;

    for (size_t i = 0; !rc && i < sizeof(map) / sizeof(map[0]); i++) {
        int k = map[i].kind;
        snprintf(g, sizeof(g), "blk.%u.%s", l, map[i].gguf);
        snprintf(h, sizeof(h), "model.layers.%u.%s", l, map[i].hf);
        rc = convert_plan_direct(p, c, g, h, shapes[k][1] ? 2 : 1, shapes[k]);
        if (!rc && map[i].f32)
            p->t[p->n - 1].force_type = QUANT_F32;
    }
    rc = rc ? rc : plan_gptoss_experts(p, c, hp, mix, l, PROJ_GATE);
    rc = rc ? rc : plan_gptoss_experts(p, c, hp, mix, l, PROJ_UP);
    rc = rc ? rc : plan_gptoss_experts(p, c, hp, mix, l, PROJ_DOWN);
    return rc ? rc : plan_gptoss_expert_bias(p, c, hp, l);
}

static int plan_build(const struct convert_config *cfg, struct convert_plan *p, struct hf_ckpt *c,
                      const struct convert_hparams *hp)
{
    uint64_t emb[2] = {hp->n_vocab, hp->n_embd}, norm[1] = {hp->n_embd};
    const enum quant_mix mix = cfg->mix;

    if (arch_hybrid(hp->arch))
        return convert_hybrid_plan(cfg, p, c, hp);
    int rc = convert_plan_direct(p, c, "token_embd.weight", "model.embed_tokens.weight", 2, emb);

    for (uint32_t l = 0; !rc && l < hp->n_layer; l++)
        rc = hp->arch == CONVERT_ARCH_GPTOSS ? plan_gptoss_layer(p, c, hp, mix, l)
                                             : plan_layer(p, c, hp, l);
    rc = rc ? rc : convert_plan_direct(p, c, "output_norm.weight", "model.norm.weight", 1, norm);
    if (!rc && !hp->tied)
        rc = convert_plan_direct(p, c, "output.weight", "lm_head.weight", 2, emb);
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

/* n elements of src from element elem0, step elements apart, as floats. */
static void src_to_f32(const struct safetensors_tensor *src, uint64_t elem0, uint64_t n,
                       uint64_t step, float *dst)
{
    const uint32_t size = safetensors_dtype_size(src->dtype);
    const uint8_t *p = (const uint8_t *)src->data + elem0 * size;
    uint16_t h;

    for (uint64_t i = 0; i < n; i++, p += step * size) {
        switch (src->dtype) {
        case SAFETENSORS_F32:
            memcpy(&dst[i], p, sizeof(float));
            break;
        case SAFETENSORS_BF16:
            memcpy(&h, p, 2);
            dst[i] = bf16_to_f32(h);
            break;
        default: /* F16: hf_get admits nothing else */
            memcpy(&h, p, 2);
            dst[i] = fp16_to_f32(h);
            break;
        }
    }
}

/* The 32 E2M1 codes of one MXFP4 block as transformers packs them: element 2i in the low
 * nibble of byte i, element 2i + 1 in the high one. */
static void hf_mxfp4_codes(const uint8_t *blk, uint8_t *codes)
{
    for (int i = 0; i < 16; i++) {
        codes[2 * i] = blk[i] & 0x0F;
        codes[2 * i + 1] = blk[i] >> 4;
    }
}

/* Source row `row` of an MXFP4 segment (n elements): as GGUF MXFP4 blocks into dst (the same
 * codes and exponents, repacked: element j in the low nibble of byte j, j + 16 in the high),
 * or as floats (value(code) * 2^(scale - 127)) when dst is NULL. */
static void mxfp4_row(const struct convert_segment *sg, uint64_t row, uint64_t n, uint8_t *dst,
                      float *f)
{
    static const float e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    const uint64_t nb = n / 32;
    const uint8_t *blocks = (const uint8_t *)sg->src->data + row * nb * 16;
    const uint8_t *scales = (const uint8_t *)sg->scales->data + row * nb;
    uint8_t c[32];

    for (uint64_t b = 0; b < nb; b++) {
        hf_mxfp4_codes(blocks + b * 16, c);
        if (dst) {
            struct block_mxfp4 *o = (struct block_mxfp4 *)dst + b;
            o->e = scales[b];
            for (int j = 0; j < 16; j++)
                o->qs[j] = (uint8_t)(c[j] | c[j + 16] << 4);
            continue;
        }
        for (int j = 0; j < 32; j++)
            f[b * 32 + j] = ldexpf(e2m1[c[j]], (int)scales[b] - 127);
    }
}

/* Applies t->op to the n values of output row r (from src); -EINVAL naming the tensor when
 * ssm_a would not be finite and negative. */
static int row_op(const struct convert_tensor *t, const struct safetensors_tensor *src, uint64_t r,
                  float *x, uint64_t n)
{
    for (uint64_t i = 0; t->op != CONVERT_OP_NONE && i < n; i++) {
        if (t->op == CONVERT_OP_ADD_ONE) {
            x[i] += 1.0f;
            continue;
        }
        float a = x[i];
        x[i] = -expf(a);
        if (!(x[i] < 0.0f) || !isfinite(x[i]))
            return err_set(-EINVAL,
                           "tensor '%s' (from '%s'): element %llu of row %llu: -exp(%g) = %g; "
                           "strata needs a finite negative decay",
                           t->name, src->name, (unsigned long long)i, (unsigned long long)r,
                           (double)a, (double)x[i]);
    }
    return 0;
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
        uint64_t elem = sg->elem0 + (r - seg_row0) * (sg->row_step ? sg->row_step : ne0);
        enum safetensors_dtype dt = sg->src->dtype;

        if (sg->scales) {
            if (t->type == QUANT_MXFP4) {
                mxfp4_row(sg, elem, ne0, dst, NULL);
                continue;
            }
            mxfp4_row(sg, elem, ne0, NULL, scratch);
        } else if (sg->elem_step <= 1 && t->op == CONVERT_OP_NONE && !t->col_perm &&
                   ((t->type == QUANT_F32 && dt == SAFETENSORS_F32) ||
                    (t->type == QUANT_BF16 && dt == SAFETENSORS_BF16) ||
                    (t->type == QUANT_F16 && dt == SAFETENSORS_F16))) {
            memcpy(dst, (const uint8_t *)sg->src->data + elem * safetensors_dtype_size(dt),
                   t->row_bytes);
            continue;
        } else if (t->col_perm) {
            const uint64_t step = sg->elem_step ? sg->elem_step : 1;
            for (uint64_t i = 0; i < ne0; i++)
                src_to_f32(sg->src, elem + t->col_perm[i] * step, 1, 1, &scratch[i]);
        } else {
            src_to_f32(sg->src, elem, ne0, sg->elem_step ? sg->elem_step : 1, scratch);
        }
        int rc = row_op(t, sg->src, r, scratch, ne0);
        if (rc)
            return rc;
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
        rc = quant_ref_quantize(t->type, scratch, dst, (int64_t)ne0);
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
        t->type = t->force_type >= 0 ? (uint32_t)t->force_type
                                     : quant_mix_tensor_type(cfg->mix, t->name, t->n_dims,
                                                             t->ne[0], &t->fell_back);
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
    rc = rc ? rc : plan_build(cfg, &plan, c, &hp);
    if (rc)
        goto out;
    st.n_unused = report_unused(cfg, c);
    rc = gguf_writer_open(cfg->out_path, GGUF_DEFAULT_ALIGNMENT, &w);
    if (rc)
        goto out;
    rc = add_hparams(w, cfg, c, &hp);
    rc = rc ? rc : add_sampling(w, cfg, c);
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
