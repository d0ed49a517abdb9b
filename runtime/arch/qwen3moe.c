/* qwen3moe: Qwen3-30B-A3B / 235B-A22B. Facts: FORMATS.md §4(a).
 *
 * Per layer: x += Wo·Attn(RoPE(qknorm(Wq,Wk·rms(x))), Wv·rms(x)); x += MoE(rms(x)).
 * Written once against the backend op table; it knows nothing of tiers or devices.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../backend.h"
#include "../errors.h"
#include "../gguf.h"
#include "../stream.h"
#include "arch.h"

#define ARCH "qwen3moe"

static int qwen3moe_u32(const struct model *m, const char *key, uint32_t *out)
{
    char full[128];
    snprintf(full, sizeof(full), ARCH ".%s", key);
    return gguf_get_u32(m->file, full, out);
}

static int qwen3moe_f32(const struct model *m, const char *key, float *out)
{
    char full[128];
    snprintf(full, sizeof(full), ARCH ".%s", key);
    return gguf_get_f32(m->file, full, out);
}

static int qwen3moe_hparams(struct model *m)
{
    struct model_hparams *hp = &m->hp;
    int rc = 0;

    rc = rc ? rc : qwen3moe_u32(m, "block_count", &hp->n_layer);
    rc = rc ? rc : qwen3moe_u32(m, "embedding_length", &hp->n_embd);
    rc = rc ? rc : qwen3moe_u32(m, "attention.head_count", &hp->n_head);
    rc = rc ? rc : qwen3moe_u32(m, "attention.head_count_kv", &hp->n_head_kv);
    rc = rc ? rc : qwen3moe_u32(m, "expert_count", &hp->n_expert);
    rc = rc ? rc : qwen3moe_u32(m, "expert_used_count", &hp->n_expert_used);
    rc = rc ? rc : qwen3moe_u32(m, "expert_feed_forward_length", &hp->n_ff_exp);
    rc = rc ? rc : qwen3moe_f32(m, "attention.layer_norm_rms_epsilon", &hp->rms_eps);
    if (rc)
        return rc;
    if (qwen3moe_u32(m, "attention.key_length", &hp->head_dim))
        hp->head_dim = hp->n_embd / (hp->n_head ? hp->n_head : 1);
    if (qwen3moe_f32(m, "rope.freq_base", &hp->rope_base))
        hp->rope_base = 10000.0f;
    if (qwen3moe_u32(m, "context_length", &hp->n_ctx_train))
        hp->n_ctx_train = 4096;
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
    if (!(hp->rms_eps > 0.0f) || !(hp->rope_base > 0.0f))
        return err_set(-EINVAL, ARCH ": rms epsilon %g and rope base %g must be positive",
                       hp->rms_eps, hp->rope_base);
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
    return 0;
}

static int qwen3moe_load(struct model *m)
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
        if (rc)
            return rc;
        rc = model_weight_find(m, "output.weight", 2, ne, &m->output);
        if (rc == -ENOENT)
            m->output = m->tok_embd; /* tied embeddings */
        else if (rc)
            return rc;
    }
    m->layers = calloc(hp->n_layer, sizeof(*m->layers));
    if (!m->layers)
        return err_set(-ENOMEM, "out of memory");
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        rc = qwen3moe_layer(m, l);
        if (rc)
            return rc;
    }
    return 0;
}

/* x += y; out = rmsnorm(x) * w: one op where the backend has it, else add then rmsnorm. */
static int qwen3moe_add_norm(struct backend *b, struct stream *s, const struct weight *w, int n)
{
    const struct backend_ops *op = b->ops;
    const struct model_hparams *hp = &s->m->hp;
    if (op->add_rmsnorm)
        return op->add_rmsnorm(b, s->x, s->proj, s->xn, w, n, hp->n_embd, hp->rms_eps);
    int rc = op->add(b, s->x, s->proj, (size_t)n * hp->n_embd);
    return rc ? rc : op->rmsnorm(b, s->xn, s->x, w, n, hp->n_embd, hp->rms_eps);
}

/* Attention of layer l on xn = attn_norm(x) (the caller's), ending with proj = its output
 * projection (the caller adds it to x). */
static int qwen3moe_attention(struct backend *b, struct stream *s, const struct layer_weights *lw,
                              uint32_t l, int n)
{
    const struct backend_ops *op = b->ops;
    const struct model_hparams *hp = &s->m->hp;
    int kvw = hp->n_head_kv * hp->head_dim;
    float *kc = s->k_cache + l * s->kv_layer_floats, *vc = s->v_cache + l * s->kv_layer_floats;
    int rc = 0;

    rc = rc ? rc : op->matmul(b, s->q, &lw->wq, s->xn, n);
    rc = rc ? rc : op->matmul(b, s->k, &lw->wk, s->xn, n);
    rc = rc ? rc : op->matmul(b, s->v, &lw->wv, s->xn, n);
    rc = rc ? rc : op->rmsnorm(b, s->q, s->q, &lw->q_norm, n * hp->n_head, hp->head_dim,
                               hp->rms_eps);
    rc = rc ? rc : op->rmsnorm(b, s->k, s->k, &lw->k_norm, n * hp->n_head_kv, hp->head_dim,
                               hp->rms_eps);
    rc = rc ? rc : op->rope(b, s->q, n, hp->n_head, hp->head_dim, s->pos, hp->rope_base);
    rc = rc ? rc : op->rope(b, s->k, n, hp->n_head_kv, hp->head_dim, s->pos, hp->rope_base);
    rc = rc ? rc : op->kv_store(b, kc, s->k, s->pos, n, kvw);
    rc = rc ? rc : op->kv_store(b, vc, s->v, s->pos, n, kvw);
    if (rc)
        return rc;
    struct attn_args a = {
        .out = s->att, .q = s->q, .k_cache = kc, .v_cache = vc, .pos0 = s->pos, .n_tok = n,
        .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
        .scale = 1.0f / sqrtf((float)hp->head_dim),
    };
    rc = op->attention(b, &a);
    return rc ? rc : op->matmul(b, s->proj, &lw->wo, s->att, n);
}

static int qwen3moe_forward(struct backend *b, struct stream *s, const int32_t *ids, int n)
{
    const struct backend_ops *op = b->ops;
    const struct model *m = s->m;
    const struct model_hparams *hp = &m->hp;
    const float *last;
    int rc = op->embed(b, s->x, &m->tok_embd, ids, n);

    /* each residual add is fused with the norm that reads its result: x += attention, xn =
     * ffn_norm(x); x += experts, xn = the next layer's attn_norm(x) (the last layer's add
     * stands alone: the output norm reads only the last row) */
    rc = rc ? rc : op->rmsnorm(b, s->xn, s->x, &m->layers[0].attn_norm, n, hp->n_embd,
                               hp->rms_eps);
    for (uint32_t l = 0; !rc && l < hp->n_layer; l++) {
        const struct layer_weights *lw = &m->layers[l];
        rc = qwen3moe_attention(b, s, lw, l, n);
        rc = rc ? rc : qwen3moe_add_norm(b, s, &lw->ffn_norm, n);
        if (rc)
            break;
        struct moe_args ma = {
            .out = s->proj, .in = s->xn, .n_tok = n, .pos0 = s->pos, .layer = (int)l, .lw = lw,
            .hp = hp,
        };
        rc = op->moe_ffn(b, &ma);
        if (rc)
            break;
        if (l + 1 < hp->n_layer)
            rc = qwen3moe_add_norm(b, s, &m->layers[l + 1].attn_norm, n);
        else
            rc = op->add(b, s->x, s->proj, (size_t)n * hp->n_embd);
    }
    if (rc)
        return rc;
    last = s->x + (size_t)(n - 1) * hp->n_embd;
    rc = op->rmsnorm(b, s->xn, last, &m->output_norm, 1, hp->n_embd, hp->rms_eps);
    return rc ? rc : op->matmul(b, s->logits, &m->output, s->xn, 1);
}

const struct arch arch_qwen3moe = {
    .name = ARCH,
    .load = qwen3moe_load,
    .forward = qwen3moe_forward,
};
