/* gpt-oss: the forward of gpt-oss-20b / gpt-oss-120b (its loader is core/model_gptoss.c).
 *
 * Per layer: x += Wo·Attn(YaRN-RoPE(Wq,Wk·rms(x) + b), Wv·rms(x) + bv) + bo, the attention
 * with a learned sink logit per head and, on sliding layers, a window of n_swa positions;
 * x += MoE(rms(x)), routed by softmax over the top-k of (router·x + bias), each expert with
 * biases and the clamped SwiGLU (cpu_kernels/expert_ffn.h). Written against the backend op
 * table; a backend without YaRN, biases or sinks and windows is refused by name.
 */
#include <math.h>

#include "arch.h"
#include "backend.h"
#include "errors.h"
#include "model.h"
#include "stream.h"

/* gpt-oss's YaRN settings besides the file's factor and original context: transformers'
 * defaults for the correction range, which gpt-oss's config does not round (truncate off). */
#define GPTOSS_BETA_FAST 32.0f
#define GPTOSS_BETA_SLOW 1.0f

static int gptoss_supported(const struct backend *b)
{
    const struct backend_ops *op = b->ops;
    if (!op->rope_yarn || !op->add_bias || !op->attn_sinks_window)
        return err_set(-ENOTSUP, "gpt-oss: the %s backend has no %s yet", op->name,
                       !op->rope_yarn  ? "YaRN rope"
                       : !op->add_bias ? "bias add"
                                       : "attention sinks and window");
    return 0;
}

/* The model's YaRN scaling (used where hp->rope_yarn_factor is set). */
static struct rope_yarn gptoss_yarn(const struct model_hparams *hp)
{
    return (struct rope_yarn){
        .base = hp->rope_base,
        .factor = hp->rope_yarn_factor,
        .n_ctx_orig = hp->rope_yarn_n_ctx_orig,
        .beta_fast = GPTOSS_BETA_FAST,
        .beta_slow = GPTOSS_BETA_SLOW,
        .truncate = false,
    };
}

static int gptoss_rope(struct backend *b, const struct model_hparams *hp, float *x, int n,
                       int n_heads, int pos)
{
    if (!hp->rope_yarn_factor)
        return b->ops->rope(b, x, n, n_heads, hp->head_dim, pos, hp->rope_base);
    struct rope_yarn y = gptoss_yarn(hp);
    return b->ops->rope_yarn(b, x, n, n_heads, hp->head_dim, pos, &y);
}

/* out = w·in + bias over n rows. */
static int gptoss_linear(struct backend *b, float *out, const struct weight *w,
                         const struct weight *bias, const float *in, int n)
{
    if (b->ops->matmul_bias_n)
        return b->ops->matmul_bias_n(b, 1, &out, &w, &bias, in, n);
    int rc = b->ops->matmul(b, out, w, in, n);
    return rc ? rc : b->ops->add_bias(b, out, bias, n);
}

/* The q, k, v projections of n rows of xn, with their biases. */
static int gptoss_qkv(struct backend *b, const struct layer_weights *lw, float *q, float *k,
                      float *v, const float *xn, int n)
{
    if (b->ops->matmul_bias_n) {
        float *const out[3] = {q, k, v};
        const struct weight *const w[3] = {&lw->wq, &lw->wk, &lw->wv};
        const struct weight *const bias[3] = {&lw->bq, &lw->bk, &lw->bv};
        return b->ops->matmul_bias_n(b, 3, out, w, bias, xn, n);
    }
    int rc = arch_matmul_qkv(b, q, k, v, lw, xn, n);
    rc = rc ? rc : b->ops->add_bias(b, q, &lw->bq, n);
    rc = rc ? rc : b->ops->add_bias(b, k, &lw->bk, n);
    return rc ? rc : b->ops->add_bias(b, v, &lw->bv, n);
}

/* Rope, KV append and attention of n consecutive tokens of stream s at position pos, layer
 * l: q, k, v (n rows) in, out (n rows) written. */
static int gptoss_attend(struct backend *b, struct stream *s, uint32_t l, float *out, float *q,
                         float *k, const float *v, int pos, int n)
{
    const struct backend_ops *op = b->ops;
    const struct model_hparams *hp = &s->m->hp;
    const struct layer_weights *lw = &s->m->layers[l];
    int kvw = hp->n_head_kv * hp->head_dim;
    float *kc = s->k_cache + l * s->kv_layer_floats, *vc = s->v_cache + l * s->kv_layer_floats;
    int rc = 0;
    if (op->qk_rope_store) { /* rope of q and k and the cache stores in one op */
        const struct rope_yarn y = gptoss_yarn(hp);
        struct qk_rope_args qa = arch_qk_rope_args(hp, q, k, v, pos, n, kc, vc);
        qa.yarn = hp->rope_yarn_factor ? &y : NULL;
        rc = op->qk_rope_store(b, &qa);
    } else {
        rc = gptoss_rope(b, hp, q, n, hp->n_head, pos);
        rc = rc ? rc : gptoss_rope(b, hp, k, n, hp->n_head_kv, pos);
        rc = rc ? rc : op->kv_store(b, kc, k, pos, n, kvw);
        rc = rc ? rc : op->kv_store(b, vc, v, pos, n, kvw);
    }
    if (rc)
        return rc;
    struct attn_args a = {
        .out = out,
        .q = q,
        .k_cache = kc,
        .v_cache = vc,
        .pos0 = pos,
        .n_tok = n,
        .n_head = hp->n_head,
        .n_head_kv = hp->n_head_kv,
        .head_dim = hp->head_dim,
        .scale = 1.0f / sqrtf((float)hp->head_dim),
        .sinks = &lw->sinks,
        .window = model_layer_is_swa(hp, l) ? (int)hp->n_swa : 0,
    };
    return op->attention(b, &a);
}

/* The layers after the embedding, on n rows of x (activations xn, proj); attend(l) runs the
 * attention of layer l from xn into proj. Leaves x holding the last layer's output. */
struct gptoss_rows {
    float *x, *xn, *proj;
    int n;
    int (*attend)(struct backend *b, void *ctx, uint32_t l, int n);
    void *ctx;
};

static int gptoss_layers(struct backend *b, const struct model *m, const struct gptoss_rows *r)
{
    const struct backend_ops *op = b->ops;
    const struct model_hparams *hp = &m->hp;
    int rc = op->rmsnorm(b, r->xn, r->x, &m->layers[0].attn_norm, r->n, hp->n_embd, hp->rms_eps);
    for (uint32_t l = 0; !rc && l < hp->n_layer; l++) {
        const struct layer_weights *lw = &m->layers[l];
        rc = r->attend(b, r->ctx, l, r->n);
        rc = rc ? rc : arch_add_norm(b, hp, r->x, r->proj, r->xn, &lw->ffn_norm, r->n);
        if (rc)
            break;
        struct moe_args ma = {
            .out = r->proj,
            .in = r->xn,
            .n_tok = r->n,
            .layer = (int)l,
            .lw = lw,
            .hp = hp,
        };
        rc = op->moe_ffn(b, &ma);
        if (rc)
            break;
        if (l + 1 < hp->n_layer)
            rc = arch_add_norm(b, hp, r->x, r->proj, r->xn, &m->layers[l + 1].attn_norm, r->n);
        else
            rc = op->add(b, r->x, r->proj, (size_t)r->n * hp->n_embd);
    }
    return rc;
}

static int gptoss_attend_stream(struct backend *b, void *ctx, uint32_t l, int n)
{
    struct stream *s = ctx;
    const struct layer_weights *lw = &s->m->layers[l];
    int rc = gptoss_qkv(b, lw, s->q, s->k, s->v, s->xn, n);
    rc = rc ? rc : gptoss_attend(b, s, l, s->att, s->q, s->k, s->v, s->pos, n);
    return rc ? rc : gptoss_linear(b, s->proj, &lw->wo, &lw->bo, s->att, n);
}

static int gptoss_forward(struct backend *b, struct stream *s, const int32_t *ids, int n)
{
    const struct backend_ops *op = b->ops;
    const struct model *m = s->m;
    const struct model_hparams *hp = &m->hp;
    int rc = gptoss_supported(b);

    rc = rc ? rc : op->embed(b, s->x, &m->tok_embd, ids, n);
    if (rc)
        return rc;
    n = n;
    struct gptoss_rows r = {
        .x = s->x,
        .xn = s->xn,
        .proj = s->proj,
        .n = n,
        .attend = gptoss_attend_stream,
        .ctx = s,
    };
    rc = gptoss_layers(b, m, &r);
    if (rc)
        return rc;
    const float *last = s->x + (size_t)(n - 1) * hp->n_embd;
    rc = op->rmsnorm(b, s->xn, last, &m->output_norm, 1, hp->n_embd, hp->rms_eps);
    return rc ? rc : op->matmul(b, s->logits, &m->output, s->xn, 1);
}

struct gptoss_batch_ctx {
    struct stream_batch *bt;
    struct stream *const *ss;
};

/* Lockstep attention: projections over all rows at once, then each row's rope, KV append and
 * attention in its own stream at its own position. */
static int gptoss_attend_batch(struct backend *b, void *ctx, uint32_t l, int n)
{
    struct gptoss_batch_ctx *c = ctx;
    struct stream_batch *bt = c->bt;
    const struct model_hparams *hp = &bt->m->hp;
    const struct layer_weights *lw = &bt->m->layers[l];
    const int qw = hp->n_head * hp->head_dim, kvw = hp->n_head_kv * hp->head_dim;
    int rc = gptoss_qkv(b, lw, bt->q, bt->k, bt->v, bt->xn, n);
    for (int i = 0; i < n && !rc; i++)
        rc = gptoss_attend(b, c->ss[i], l, bt->att + (size_t)i * qw, bt->q + (size_t)i * qw,
                           bt->k + (size_t)i * kvw, bt->v + (size_t)i * kvw, bt->row_pos[i], 1);
    return rc ? rc : gptoss_linear(b, bt->proj, &lw->wo, &lw->bo, bt->att, n);
}

static int gptoss_forward_batch(struct backend *b, struct stream_batch *bt,
                                struct stream *const *ss, const int32_t *ids, int n)
{
    const struct backend_ops *op = b->ops;
    const struct model *m = bt->m;
    const struct model_hparams *hp = &m->hp;
    int rc = gptoss_supported(b);

    rc = rc ? rc : op->embed(b, bt->x, &m->tok_embd, ids, n);
    if (rc)
        return rc;
    struct gptoss_batch_ctx c = {.bt = bt, .ss = ss};
    struct gptoss_rows r = {
        .x = bt->x,
        .xn = bt->xn,
        .proj = bt->proj,
        .n = n,
        .attend = gptoss_attend_batch,
        .ctx = &c,
    };
    rc = gptoss_layers(b, m, &r);
    rc = rc ? rc : op->rmsnorm(b, bt->xn, bt->x, &m->output_norm, n, hp->n_embd, hp->rms_eps);
    return rc ? rc : op->matmul(b, bt->logits, &m->output, bt->xn, n);
}

const struct arch arch_gptoss = {
    .name = "gpt-oss",
    .forward = gptoss_forward,
    .forward_batch = gptoss_forward_batch,
};
