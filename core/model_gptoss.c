/* model_gptoss: the gpt-oss loader (gpt-oss-20b / gpt-oss-120b): its hyperparameter keys and
 * weight names, validated and filled into struct model. Formats: docs/formats.md (gpt-oss).
 * strata has no gpt-oss forward yet: the engine refuses to start on such a model. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "gguf.h"
#include "model.h"
#include "model_arch.h"

#define ARCH "gpt-oss"

/* rope.scaling.*: absent or type "none" leaves YaRN off; "yarn" needs factor and
 * original_context_length; another type is refused. */
static int gptoss_rope_scaling(struct model *m)
{
    struct model_hparams *hp = &m->hp;
    struct gguf_str type;
    int rc = gguf_get_str(m->file, ARCH ".rope.scaling.type", &type);

    if (rc == -ENOENT) {
        err_clear();
        return 0;
    }
    if (rc)
        return rc;
    if (type.len == 4 && !memcmp(type.ptr, "none", 4))
        return 0;
    if (type.len != 4 || memcmp(type.ptr, "yarn", 4))
        return err_set(-EINVAL, ARCH ".rope.scaling.type is '%.*s' (strata reads yarn or none)",
                       (int)(type.len > 32 ? 32 : type.len), (const char *)type.ptr);
    rc = model_arch_f32(m, "rope.scaling.factor", &hp->rope_yarn_factor);
    rc = rc ? rc
            : model_arch_u32(m, "rope.scaling.original_context_length", &hp->rope_yarn_n_ctx_orig);
    if (rc)
        return rc;
    if (!isfinite(hp->rope_yarn_factor) || !(hp->rope_yarn_factor >= 1.0f) ||
        !hp->rope_yarn_n_ctx_orig)
        return err_set(-EINVAL, ARCH ": yarn factor %g and original context %u (factor >= 1, "
                                     "context > 0)",
                       hp->rope_yarn_factor, hp->rope_yarn_n_ctx_orig);
    return 0;
}

static int gptoss_hparams_read(struct model *m)
{
    struct model_hparams *hp = &m->hp;
    uint32_t value_length = 0;
    int rc = 0;

    rc = rc ? rc : model_arch_u32(m, "block_count", &hp->n_layer);
    rc = rc ? rc : model_arch_u32(m, "embedding_length", &hp->n_embd);
    rc = rc ? rc : model_arch_u32(m, "attention.head_count", &hp->n_head);
    rc = rc ? rc : model_arch_u32(m, "attention.head_count_kv", &hp->n_head_kv);
    rc = rc ? rc : model_arch_u32(m, "attention.key_length", &hp->head_dim);
    rc = rc ? rc : model_arch_u32(m, "expert_count", &hp->n_expert);
    rc = rc ? rc : model_arch_u32(m, "expert_used_count", &hp->n_expert_used);
    rc = rc ? rc : model_arch_u32(m, "expert_feed_forward_length", &hp->n_ff_exp);
    rc = rc ? rc : model_arch_u32(m, "attention.sliding_window", &hp->n_swa);
    rc = rc ? rc : model_arch_f32(m, "attention.layer_norm_rms_epsilon", &hp->rms_eps);
    rc = rc ? rc : model_arch_f32(m, "rope.freq_base", &hp->rope_base);
    /* optional keys: absent takes the default; present but of a wrong type is refused */
    rc = rc ? rc : model_arch_u32_or(m, "attention.value_length", hp->head_dim, &value_length);
    rc = rc ? rc : model_arch_u32_or(m, "attention.sliding_window_pattern", 2, &hp->swa_period);
    rc = rc ? rc : model_arch_u32_or(m, "context_length", 4096, &hp->n_ctx_train);
    rc = rc ? rc : gptoss_rope_scaling(m);
    if (rc)
        return rc;
    hp->swiglu_oai = true;
    if (value_length != hp->head_dim)
        return err_set(-EINVAL, ARCH ": value_length %u differs from key_length %u",
                       value_length, hp->head_dim);
    return 0;
}

static int gptoss_hparams(struct model *m)
{
    struct model_hparams *hp = &m->hp;
    int rc = gptoss_hparams_read(m);

    if (rc)
        return rc;
    if (!hp->n_layer || !hp->n_embd || !hp->n_head || !hp->n_head_kv || !hp->head_dim ||
        !hp->n_expert || !hp->n_expert_used || !hp->n_ff_exp || !hp->n_swa)
        return err_set(-EINVAL, ARCH ": a size key is zero (layers %u, embd %u, heads %u/%u, "
                                     "head dim %u, experts %u used %u, expert ffn %u, sliding "
                                     "window %u)",
                       hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->head_dim,
                       hp->n_expert, hp->n_expert_used, hp->n_ff_exp, hp->n_swa);
    if (!hp->n_ctx_train)
        return err_set(-EINVAL, ARCH ".context_length is 0");
    if (!hp->swa_period)
        return err_set(-EINVAL, ARCH ".attention.sliding_window_pattern is 0 (a period >= 1)");
    if (hp->n_head % hp->n_head_kv)
        return err_set(-EINVAL, ARCH ": head_count %u is not a multiple of head_count_kv %u",
                       hp->n_head, hp->n_head_kv);
    if (hp->n_expert_used > hp->n_expert || hp->n_expert > 4096)
        return err_set(-EINVAL, ARCH ": expert_used_count %u with expert_count %u",
                       hp->n_expert_used, hp->n_expert);
    if (hp->head_dim % 2 || hp->head_dim > 1024 || hp->n_layer > 4096 || hp->n_head > 4096)
        return err_set(-EINVAL, ARCH ": head dim %u / %u heads / %u layers not supported",
                       hp->head_dim, hp->n_head, hp->n_layer);
    if (!isfinite(hp->rms_eps) || !(hp->rms_eps > 0.0f))
        return err_set(-EINVAL, ARCH ".attention.layer_norm_rms_epsilon is %g: it must be finite "
                                     "and positive", hp->rms_eps);
    if (!isfinite(hp->rope_base) || !(hp->rope_base > 0.0f))
        return err_set(-EINVAL, ARCH ".rope.freq_base is %g: it must be finite and positive",
                       hp->rope_base);
    return 0;
}

/* Loads blk.L.NAME.SUFFIX ("weight" or "bias") with the given dims. */
static int gptoss_layer_tensor(const struct model *m, uint32_t l, const char *name,
                               const char *suffix, uint32_t n_dims, uint64_t a, uint64_t b,
                               uint64_t c, struct weight *w)
{
    char full[96];
    uint64_t ne[3] = {a, b, c};
    snprintf(full, sizeof(full), "blk.%u.%s.%s", l, name, suffix);
    return model_weight_get(m, full, n_dims, ne, w);
}

/* The layer's small tensors must be F32 and finite: norms, biases, sinks, router. */
static int gptoss_layer_f32(uint32_t l, struct weight *const *ws, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (ws[i]->type)
            return err_set(-EINVAL, "layer %u: tensor '%s' must be F32 (norms, biases, sinks "
                                    "and router are)",
                           l, ws[i]->name);
        int rc = model_check_finite(ws[i]);
        if (rc)
            return rc;
    }
    return 0;
}

static int gptoss_layer(struct model *m, uint32_t l)
{
    const struct model_hparams *hp = &m->hp;
    struct layer_weights *lw = &m->layers[l];
    uint64_t e = hp->n_embd, qw = (uint64_t)hp->n_head * hp->head_dim;
    uint64_t kvw = (uint64_t)hp->n_head_kv * hp->head_dim, f = hp->n_ff_exp, n = hp->n_expert;
    int rc = 0;

#define W(nm, nd, a, b, c, w)                                                                      \
    (rc = rc ? rc : gptoss_layer_tensor(m, l, nm, "weight", nd, a, b, c, w))
#define B(nm, nd, a, b, w) (rc = rc ? rc : gptoss_layer_tensor(m, l, nm, "bias", nd, a, b, 1, w))
    W("attn_norm", 1, e, 1, 1, &lw->attn_norm);
    W("attn_q", 2, e, qw, 1, &lw->wq);
    B("attn_q", 1, qw, 1, &lw->bq);
    W("attn_k", 2, e, kvw, 1, &lw->wk);
    B("attn_k", 1, kvw, 1, &lw->bk);
    W("attn_v", 2, e, kvw, 1, &lw->wv);
    B("attn_v", 1, kvw, 1, &lw->bv);
    W("attn_output", 2, qw, e, 1, &lw->wo);
    B("attn_output", 1, e, 1, &lw->bo);
    W("attn_sinks", 1, hp->n_head, 1, 1, &lw->sinks);
    W("post_attention_norm", 1, e, 1, 1, &lw->ffn_norm);
    W("ffn_gate_inp", 2, e, n, 1, &lw->router);
    B("ffn_gate_inp", 1, n, 1, &lw->router_b);
    W("ffn_gate_exps", 3, e, f, n, &lw->gate_exps);
    B("ffn_gate_exps", 2, f, n, &lw->gate_exps_b);
    W("ffn_up_exps", 3, e, f, n, &lw->up_exps);
    B("ffn_up_exps", 2, f, n, &lw->up_exps_b);
    W("ffn_down_exps", 3, f, e, n, &lw->down_exps);
    B("ffn_down_exps", 2, e, n, &lw->down_exps_b);
#undef W
#undef B
    if (rc)
        return rc;
    struct weight *small[] = {&lw->attn_norm, &lw->bq,       &lw->bk,          &lw->bv,
                              &lw->bo,        &lw->sinks,    &lw->ffn_norm,    &lw->router,
                              &lw->router_b,  &lw->gate_exps_b, &lw->up_exps_b, &lw->down_exps_b};
    return gptoss_layer_f32(l, small, sizeof(small) / sizeof(small[0]));
}

/* Whether the file has any tensor of block l (blk.L.*). */
static bool gptoss_block_present(const struct model *m, uint32_t l)
{
    char pre[32];
    size_t n = (size_t)snprintf(pre, sizeof(pre), "blk.%u.", l);
    for (uint64_t i = 0; i < m->file->n_tensors; i++) {
        if (!strncmp(m->file->tensors[i].name, pre, n))
            return true;
    }
    return false;
}

int model_gptoss_load(struct model *m)
{
    struct model_hparams *hp = &m->hp;
    const struct gguf_tensor *emb;
    int rc = gptoss_hparams(m);

    if (rc)
        return rc;
    emb = gguf_find_tensor(m->file, "token_embd.weight");
    if (!emb)
        return err_set(-ENOENT, "required tensor 'token_embd.weight' is missing");
    if (emb->n_dims != 2 || emb->ne[1] == 0 || emb->ne[1] > (1u << 24))
        return err_set(-EINVAL, "token_embd.weight must be 2-D (n_embd, n_vocab)");
    hp->n_vocab = (uint32_t)emb->ne[1];
    {
        uint64_t ne[2] = {hp->n_embd, hp->n_vocab};
        uint64_t nn[1] = {hp->n_embd};
        rc = model_weight_get(m, "token_embd.weight", 2, ne, &m->tok_embd);
        rc = rc ? rc : model_weight_get(m, "output_norm.weight", 1, nn, &m->output_norm);
        if (!rc && m->output_norm.type)
            rc = err_set(-EINVAL, "tensor 'output_norm.weight' must be F32");
        rc = rc ? rc : model_check_finite(&m->output_norm);
        if (rc)
            return rc;
        rc = model_weight_find(m, "output.weight", 2, ne, &m->output);
        if (rc == -ENOENT)
            m->output = m->tok_embd; /* tied embeddings */
        else if (rc)
            return rc;
    }
    rc = model_check_blocks(m, ARCH ".block_count", hp->n_layer);
    if (rc)
        return rc;
    m->layers = calloc(hp->n_layer, sizeof(*m->layers));
    if (!m->layers)
        return err_set(-ENOMEM, "out of memory");
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        rc = gptoss_layer(m, l);
        if (rc == -ENOENT && !gptoss_block_present(m, l)) /* short of the block count */
            return err_wrap(rc, ARCH ".block_count is %u: ", hp->n_layer);
        if (rc)
            return rc;
    }
    return 0;
}
