/* qwen3moe: the forward of Qwen3-30B-A3B / 235B-A22B (its loader is core/model_qwen3moe.c).
 *
 * Per layer: x += Wo·Attn(RoPE(qknorm(Wq,Wk·rms(x))), Wv·rms(x)); x += MoE(rms(x)).
 * Written once against the backend op table; it knows nothing of tiers or devices.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "arch.h"
#include "backend.h"
#include "errors.h"
#include "model.h"
#include "stream.h"

static int qwen3moe_add_norm(struct backend *b, struct stream *s, const struct weight *w, int n)
{
    return arch_add_norm(b, &s->m->hp, s->x, s->proj, s->xn, w, n);
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

    rc = arch_matmul_qkv(b, s->q, s->k, s->v, lw, s->xn, n);
    if (op->qk_rope_store) {
        struct qk_rope_args qa = arch_qk_rope_args(hp, s->q, s->k, s->v, s->pos, n, kc, vc);
        qa.q_norm = &lw->q_norm;
        qa.k_norm = &lw->k_norm;
        rc = rc ? rc : op->qk_rope_store(b, &qa);
    } else {
        rc =
            rc ? rc
               : op->rmsnorm(b, s->q, s->q, &lw->q_norm, n * hp->n_head, hp->head_dim, hp->rms_eps);
        rc = rc ? rc
                : op->rmsnorm(b, s->k, s->k, &lw->k_norm, n * hp->n_head_kv, hp->head_dim,
                              hp->rms_eps);
        rc = rc ? rc : op->rope(b, s->q, n, hp->n_head, hp->head_dim, s->pos, hp->rope_base);
        rc = rc ? rc : op->rope(b, s->k, n, hp->n_head_kv, hp->head_dim, s->pos, hp->rope_base);
        rc = rc ? rc : op->kv_store(b, kc, s->k, s->pos, n, kvw);
        rc = rc ? rc : op->kv_store(b, vc, s->v, s->pos, n, kvw);
    }
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

/* Lockstep attention of layer l: the projections and norms over all n rows at once, then row
 * i's RoPE, KV append and attention at stream i's own position and cache. */
static int qwen3moe_attention_batch(struct backend *b, struct stream_batch *bt,
                                    struct stream *const *ss, const struct layer_weights *lw,
                                    uint32_t l, int n)
{
    const struct backend_ops *op = b->ops;
    const struct model_hparams *hp = &bt->m->hp;
    int kvw = hp->n_head_kv * hp->head_dim, qw = hp->n_head * hp->head_dim, rc = 0;

    rc = rc ? rc : arch_matmul_qkv(b, bt->q, bt->k, bt->v, lw, bt->xn, n);
    if (op->attention_rows) { /* the norms too */
        struct attn_rows_args ra = {
            .out = bt->att, .q = bt->q, .k = bt->k, .v = bt->v, .layer = (int)l, .n = n,
            .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
            .scale = 1.0f / sqrtf((float)hp->head_dim), .rope_base = hp->rope_base,
            .q_norm = &lw->q_norm, .k_norm = &lw->k_norm, .rms_eps = hp->rms_eps,
        };
        rc = rc ? rc : op->attention_rows(b, &ra);
        return rc ? rc : op->matmul(b, bt->proj, &lw->wo, bt->att, n);
    }
    rc = rc ? rc : op->rmsnorm(b, bt->q, bt->q, &lw->q_norm, n * hp->n_head, hp->head_dim,
                               hp->rms_eps);
    rc = rc ? rc : op->rmsnorm(b, bt->k, bt->k, &lw->k_norm, n * hp->n_head_kv, hp->head_dim,
                               hp->rms_eps);
    for (int i = 0; i < n && !rc; i++) {
        struct stream *s = ss[i];
        const int pos = bt->row_pos[i];
        float *q = bt->q + (size_t)i * qw, *k = bt->k + (size_t)i * kvw;
        float *v = bt->v + (size_t)i * kvw;
        float *kc = s->k_cache + l * s->kv_layer_floats, *vc = s->v_cache + l * s->kv_layer_floats;
        rc = op->rope(b, q, 1, hp->n_head, hp->head_dim, pos, hp->rope_base);
        rc = rc ? rc : op->rope(b, k, 1, hp->n_head_kv, hp->head_dim, pos, hp->rope_base);
        rc = rc ? rc : op->kv_store(b, kc, k, pos, 1, kvw);
        rc = rc ? rc : op->kv_store(b, vc, v, pos, 1, kvw);
        if (rc)
            break;
        struct attn_args a = {
            .out = bt->att + (size_t)i * qw, .q = q, .k_cache = kc, .v_cache = vc,
            .pos0 = pos, .n_tok = 1, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv,
            .head_dim = hp->head_dim, .scale = 1.0f / sqrtf((float)hp->head_dim),
        };
        rc = op->attention(b, &a);
    }
    return rc ? rc : op->matmul(b, bt->proj, &lw->wo, bt->att, n);
}

static int qwen3moe_forward_batch(struct backend *b, struct stream_batch *bt,
                                  struct stream *const *ss, const int32_t *ids, int n)
{
    const struct backend_ops *op = b->ops;
    const struct model *m = bt->m;
    const struct model_hparams *hp = &m->hp;
    int rc = op->rows_begin ? op->rows_begin(b, bt->arena, ss, bt->row_pos, ids, n) : 0;
    if (rc == 1) /* the backend replayed the step */
        return 0;

    rc = rc ? rc : op->embed(b, bt->x, &m->tok_embd, ids, n);

    rc = rc ? rc : op->rmsnorm(b, bt->xn, bt->x, &m->layers[0].attn_norm, n, hp->n_embd,
                               hp->rms_eps);
    for (uint32_t l = 0; !rc && l < hp->n_layer; l++) {
        const struct layer_weights *lw = &m->layers[l];
        rc = qwen3moe_attention_batch(b, bt, ss, lw, l, n);
        rc = rc ? rc : arch_add_norm(b, hp, bt->x, bt->proj, bt->xn, &lw->ffn_norm, n);
        if (rc)
            break;
        /* every row's experts routed together: an expert is fetched once for the step */
        struct moe_args ma = {
            .out = bt->proj, .in = bt->xn, .n_tok = n, .pos0 = 0, .layer = (int)l, .lw = lw,
            .hp = hp,
        };
        rc = op->moe_ffn(b, &ma);
        if (rc)
            break;
        if (l + 1 < hp->n_layer)
            rc = arch_add_norm(b, hp, bt->x, bt->proj, bt->xn,
                                        &m->layers[l + 1].attn_norm, n);
        else
            rc = op->add(b, bt->x, bt->proj, (size_t)n * hp->n_embd);
    }
    rc = rc ? rc : op->rmsnorm(b, bt->xn, bt->x, &m->output_norm, n, hp->n_embd, hp->rms_eps);
    return rc ? rc : op->matmul(b, bt->logits, &m->output, bt->xn, n);
}

const struct arch arch_qwen3moe = {
    .name = "qwen3moe",
    .forward = qwen3moe_forward,
    .forward_batch = qwen3moe_forward_batch,
};
