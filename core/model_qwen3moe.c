/* model_qwen3moe: the qwen3moe loader (Qwen3-30B-A3B / 235B-A22B): its hyperparameter keys
 * and weight names, validated and filled into struct model. Formats: docs/formats.md (qwen3moe).
 * The forward is runtime/arch/qwen3moe.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "errors.h"
#include "gguf.h"
#include "model.h"
#include "model_arch.h"

#define ARCH "qwen3moe"

static int qwen3moe_hparams(struct model *m)
{
    struct model_hparams *hp = &m->hp;
    int rc = 0;

    rc = rc ? rc : model_arch_u32(m, "block_count", &hp->n_layer);
    rc = rc ? rc : model_arch_u32(m, "embedding_length", &hp->n_embd);
    rc = rc ? rc : model_arch_u32(m, "attention.head_count", &hp->n_head);
    rc = rc ? rc : model_arch_u32(m, "attention.head_count_kv", &hp->n_head_kv);
    rc = rc ? rc : model_arch_u32(m, "expert_count", &hp->n_expert);
    rc = rc ? rc : model_arch_u32(m, "expert_used_count", &hp->n_expert_used);
    rc = rc ? rc : model_arch_u32(m, "expert_feed_forward_length", &hp->n_ff_exp);
    rc = rc ? rc : model_arch_f32(m, "attention.layer_norm_rms_epsilon", &hp->rms_eps);
    if (rc)
        return rc;
    /* optional keys: absent takes the default; present but of a wrong type is refused */
    if ((rc = model_arch_u32(m, "attention.key_length", &hp->head_dim)) == -ENOENT)
        hp->head_dim = hp->n_embd / (hp->n_head ? hp->n_head : 1);
    else if (rc)
        return rc;
    if ((rc = model_arch_f32(m, "rope.freq_base", &hp->rope_base)) == -ENOENT)
        hp->rope_base = 10000.0f;
    else if (rc)
        return rc;
    if ((rc = model_arch_u32(m, "context_length", &hp->n_ctx_train)) == -ENOENT)
        hp->n_ctx_train = 4096;
    else if (rc)
        return rc;
    else if (!hp->n_ctx_train)
        return err_set(-EINVAL, ARCH ".context_length is 0");
    err_clear();

    if (!hp->n_layer || !hp->n_embd || !hp->n_head || !hp->n_head_kv || !hp->head_dim ||
        !hp->n_expert || !hp->n_expert_used || !hp->n_ff_exp)
        return err_set(-EINVAL, ARCH ": a size key is zero (layers %u, embd %u, heads %u/%u, "
                                     "head dim %u, experts %u used %u, expert ffn %u)",
                       hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->head_dim,
                       hp->n_expert, hp->n_expert_used, hp->n_ff_exp);
    if (hp->n_head % hp->n_head_kv)
        return err_set(-EINVAL, ARCH ": head_count %u is not a multiple of head_count_kv %u",
                       hp->n_head, hp->n_head_kv);
    if (hp->n_expert_used > hp->n_expert || hp->n_expert > 4096)
        return err_set(-EINVAL, ARCH ": expert_used_count %u with expert_count %u",
                       hp->n_expert_used, hp->n_expert);
    if (hp->head_dim % 2 || hp->head_dim > 1024 || hp->n_layer > 4096)
        return err_set(-EINVAL, ARCH ": head dim %u / %u layers not supported", hp->head_dim,
                       hp->n_layer);
    if (!isfinite(hp->rms_eps) || !(hp->rms_eps > 0.0f))
        return err_set(-EINVAL, ARCH ".attention.layer_norm_rms_epsilon is %g: it must be finite "
                                     "and positive", hp->rms_eps);
    if (!isfinite(hp->rope_base) || !(hp->rope_base > 0.0f))
        return err_set(-EINVAL, ARCH ".rope.freq_base is %g: it must be finite and positive",
                       hp->rope_base);
    return 0;
}

/* Loads blk.L.NAME.weight with the given dims. */
static int qwen3moe_layer_weight(const struct model *m, uint32_t l, const char *name,
                                 uint32_t n_dims, uint64_t a, uint64_t b, uint64_t c,
                                 struct weight *w)
{
    char full[96];
    uint64_t ne[3] = {a, b, c};
    snprintf(full, sizeof(full), "blk.%u.%s.weight", l, name);
    return model_weight_get(m, full, n_dims, ne, w);
}

static int qwen3moe_layer(struct model *m, uint32_t l)
{
    const struct model_hparams *hp = &m->hp;
    struct layer_weights *lw = &m->layers[l];
    uint64_t e = hp->n_embd, qw = (uint64_t)hp->n_head * hp->head_dim;
    uint64_t kvw = (uint64_t)hp->n_head_kv * hp->head_dim, f = hp->n_ff_exp, n = hp->n_expert;
    int rc = 0;

    rc = rc ? rc : qwen3moe_layer_weight(m, l, "attn_norm", 1, e, 1, 1, &lw->attn_norm);
    rc = rc ? rc : qwen3moe_layer_weight(m, l, "attn_q", 2, e, qw, 1, &lw->wq);
    rc = rc ? rc : qwen3moe_layer_weight(m, l, "attn_k", 2, e, kvw, 1, &lw->wk);
    rc = rc ? rc : qwen3moe_layer_weight(m, l, "attn_v", 2, e, kvw, 1, &lw->wv);
    rc = rc ? rc : qwen3moe_layer_weight(m, l, "attn_output", 2, qw, e, 1, &lw->wo);
    rc = rc ? rc : qwen3moe_layer_weight(m, l, "attn_q_norm", 1, hp->head_dim, 1, 1, &lw->q_norm);
    rc = rc ? rc : qwen3moe_layer_weight(m, l, "attn_k_norm", 1, hp->head_dim, 1, 1, &lw->k_norm);
    rc = rc ? rc : qwen3moe_layer_weight(m, l, "ffn_norm", 1, e, 1, 1, &lw->ffn_norm);
    rc = rc ? rc : qwen3moe_layer_weight(m, l, "ffn_gate_inp", 2, e, n, 1, &lw->router);
    rc = rc ? rc : qwen3moe_layer_weight(m, l, "ffn_gate_exps", 3, e, f, n, &lw->gate_exps);
    rc = rc ? rc : qwen3moe_layer_weight(m, l, "ffn_up_exps", 3, e, f, n, &lw->up_exps);
    rc = rc ? rc : qwen3moe_layer_weight(m, l, "ffn_down_exps", 3, f, e, n, &lw->down_exps);
    if (rc)
        return rc;
    if (lw->attn_norm.type || lw->q_norm.type || lw->k_norm.type || lw->ffn_norm.type ||
        lw->router.type)
        return err_set(-EINVAL, "layer %u: norms and router must be F32", l);
    rc = rc ? rc : model_check_finite(&lw->attn_norm);
    rc = rc ? rc : model_check_finite(&lw->q_norm);
    rc = rc ? rc : model_check_finite(&lw->k_norm);
    rc = rc ? rc : model_check_finite(&lw->ffn_norm);
    rc = rc ? rc : model_check_finite(&lw->router);
    return rc;
}

int model_qwen3moe_load(struct model *m)
{
    struct model_hparams *hp = &m->hp;
    const struct gguf_tensor *emb;
    int rc = qwen3moe_hparams(m);

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
        rc = qwen3moe_layer(m, l);
        if (rc == -ENOENT) /* a layer short of the block count */
            return err_wrap(rc, ARCH ".block_count is %u: ", hp->n_layer);
        if (rc)
            return rc;
    }
    return 0;
}
