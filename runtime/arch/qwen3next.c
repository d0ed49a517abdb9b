/* qwen3next / qwen35moe: the forward of Qwen3-Next-80B-A3B and the Qwen3.5 / 3.6 MoE models
 * (their loader is core/model_qwen3next.c).
 *
 * Per layer: x += Mix(rms(x)), then x += MoE(rms(x)) + sigmoid(g.rms(x)) SharedExpert(rms(x)).
 * Mix is, every full_attn_interval-th layer, gated attention: [q | gate] = Wq xn per head,
 * q and k RMS-normed per head, NEOX rope on their first n_rot dims, causal GQA,
 * Wo (attn * sigmoid(gate)); on the other layers a Gated DeltaNet: qkv = Wqkv xn through a
 * short causal conv and SiLU, the gated delta rule over a per-head state, a gated RMSNorm
 * (by silu(Wz xn)), Wout. The recurrent state lives in the stream next to its KV cache
 * (runtime/stream.h). Written against the backend op table; a backend without the hybrid
 * ops is refused by name.
 */
#include <math.h>

#include "arch.h"
#include "backend.h"
#include "errors.h"
#include "model.h"
#include "model_arch.h"
#include "mtp.h"
#include "stream.h"

static int q3n_supported(const struct backend *b)
{
    const struct backend_ops *op = b->ops;
    if (!op->rope_partial || !op->split_halves || !op->mul_sigmoid || !op->shared_expert ||
        !op->gdn || !op->zero)
        return err_set(-ENOTSUP, "%s: the %s backend has no Gated DeltaNet layers yet",
                       b->model->arch->name, op->name);
    return 0;
}

/* The activations of one forward: n rows of x (xn, proj alongside), the attention buffers
 * (q, k, v, att: n rows) and the hybrid scratch. */
struct q3n_rows {
    float *x, *xn, *proj, *q, *k, *v, *att;
    struct stream_hybrid *hy;
    int n;
    struct stream *one; /* non-NULL: every row is its, row i at position pos0 + i */
    int pos0;
    struct stream *const *ss; /* else row i belongs to stream ss[i] at position pos[i] */
    const int *pos;
};

static struct stream *q3n_row_stream(const struct q3n_rows *r, int i)
{
    return r->one ? r->one : r->ss[i];
}

static int q3n_row_pos(const struct q3n_rows *r, int i)
{
    return r->one ? r->pos0 + i : r->pos[i];
}

/* The weights of layer l: the MTP block's attention layer is layer n_layer. */
static const struct layer_weights *q3n_lw(const struct model *m, uint32_t l)
{
    return l < m->hp.n_layer ? &m->layers[l] : &m->mtp->lw;
}

/* Rope, KV append and attention of the n consecutive rows [r, r + n) of one stream. */
static int q3n_attend_run(struct backend *b, const struct q3n_rows *r, uint32_t l, int r0, int n)
{
    const struct backend_ops *op = b->ops;
    struct stream *s = q3n_row_stream(r, r0);
    const struct model_hparams *hp = &s->m->hp;
    const size_t qw = (size_t)hp->n_head * hp->head_dim, kvw = (size_t)hp->n_head_kv * hp->head_dim;
    const size_t kl = model_kv_layer(hp, l);
    const bool mtp = l >= hp->n_layer; /* the MTP block: its own cache */
    float *kc = mtp ? s->mtp->k_cache : s->k_cache + kl * s->kv_layer_floats;
    float *vc = mtp ? s->mtp->v_cache : s->v_cache + kl * s->kv_layer_floats;
    float *q = r->q + r0 * qw, *k = r->k + r0 * kvw;
    const int pos = q3n_row_pos(r, r0);

    int rc = op->rope_partial(b, q, n, hp->n_head, hp->head_dim, hp->n_rot, pos, hp->rope_base);
    rc = rc ? rc
            : op->rope_partial(b, k, n, hp->n_head_kv, hp->head_dim, hp->n_rot, pos, hp->rope_base);
    rc = rc ? rc : op->kv_store(b, kc, k, pos, n, (int)kvw);
    rc = rc ? rc : op->kv_store(b, vc, r->v + r0 * kvw, pos, n, (int)kvw);
    if (rc)
        return rc;
    struct attn_args a = {
        .out = r->att + r0 * qw,
        .q = q,
        .k_cache = kc,
        .v_cache = vc,
        .pos0 = pos,
        .n_tok = n,
        .n_head = hp->n_head,
        .n_head_kv = hp->n_head_kv,
        .head_dim = hp->head_dim,
        .scale = 1.0f / sqrtf((float)hp->head_dim),
    };
    return op->attention(b, &a);
}

/* The runs of consecutive rows of one stream: fn on each. */
static int q3n_each_run(struct backend *b, const struct q3n_rows *r, uint32_t l,
                        int (*fn)(struct backend *, const struct q3n_rows *, uint32_t, int, int))
{
    int rc = 0;
    if (r->one)
        return fn(b, r, l, 0, r->n);
    for (int i = 0; i < r->n && !rc;) {
        int j = i + 1;
        while (j < r->n && r->ss[j] == r->ss[i])
            j++;
        rc = fn(b, r, l, i, j - i);
        i = j;
    }
    return rc;
}

/* Gated attention of layer l from r->xn into r->proj. */
static int q3n_attention(struct backend *b, const struct model *m, const struct q3n_rows *r,
                         uint32_t l)
{
    const struct backend_ops *op = b->ops;
    const struct model_hparams *hp = &m->hp;
    const struct layer_weights *lw = q3n_lw(m, l);
    const int n = r->n, hd = (int)hp->head_dim;
    const size_t qw = (size_t)hp->n_head * hd;

    int rc = arch_matmul_qkv(b, r->hy->qg, r->k, r->v, lw, r->xn, n);
    rc = rc ? rc : op->split_halves(b, r->q, r->hy->gate, r->hy->qg, n * (int)hp->n_head, hd);
    rc = rc ? rc : op->rmsnorm(b, r->q, r->q, &lw->q_norm, n * (int)hp->n_head, hd, hp->rms_eps);
    rc = rc ? rc : op->rmsnorm(b, r->k, r->k, &lw->k_norm, n * (int)hp->n_head_kv, hd, hp->rms_eps);
    rc = rc ? rc : q3n_each_run(b, r, l, q3n_attend_run);
    rc = rc ? rc : op->mul_sigmoid(b, r->att, r->hy->gate, (size_t)n * qw);
    return rc ? rc : op->matmul(b, r->proj, &lw->wo, r->att, n);
}

/* The gated delta rule of the rows [r0, r0 + n) of one stream, layer l. */
static int q3n_gdn_run(struct backend *b, const struct q3n_rows *r, uint32_t l, int r0, int n)
{
    struct stream *s = q3n_row_stream(r, r0);
    const struct model_hparams *hp = &s->m->hp;
    const struct layer_weights *lw = &s->m->layers[l];
    const size_t d = hp->ssm_d_state, vw = hp->ssm_n_v * d, cw = 2 * hp->ssm_n_k * d + vw;
    const size_t nv = hp->ssm_n_v, sl = model_ssm_layer(hp, l);
    const bool grouped = !hp->ssm_v_tiled;
    /* logits: qwen3next's grouped (rows, 2 n_v); qwen35moe's beta rows then alpha rows */
    const float *bl = r->hy->ba + (grouped ? r0 * 2 * nv : r0 * nv);
    const float *al = grouped ? bl : r->hy->ba + (size_t)r->n * nv + r0 * nv;
    struct gdn_args a = {
        .out = r->hy->o + r0 * vw,
        .qkv = r->hy->qkv + r0 * cw,
        .z = r->hy->z + r0 * vw,
        .b = bl,
        .a = al,
        .ba_stride = (int)(grouped ? 2 * nv : nv),
        .ba_grouped = grouped,
        .lw = lw,
        .conv_state = s->conv_state + sl * model_conv_state_floats(hp),
        .ssm_state = s->ssm_state + sl * model_ssm_state_floats(hp),
        .n_tok = n,
        .chunk_ok = r->one != NULL,
    };
    return b->ops->gdn(b, &a);
}

/* Gated DeltaNet mixing of layer l from r->xn into r->proj. */
static int q3n_deltanet(struct backend *b, const struct model *m, const struct q3n_rows *r,
                        uint32_t l)
{
    const struct backend_ops *op = b->ops;
    const struct layer_weights *lw = &m->layers[l];
    const int n = r->n;

    int rc = op->matmul(b, r->hy->qkv, &lw->ssm_qkv, r->xn, n);
    rc = rc ? rc : op->matmul(b, r->hy->z, &lw->ssm_z, r->xn, n);
    if (m->hp.ssm_v_tiled) {
        rc = rc ? rc : op->matmul(b, r->hy->ba, &lw->ssm_beta, r->xn, n);
        rc = rc ? rc
                : op->matmul(b, r->hy->ba + (size_t)n * m->hp.ssm_n_v, &lw->ssm_alpha, r->xn, n);
    } else {
        rc = rc ? rc : op->matmul(b, r->hy->ba, &lw->ssm_ba, r->xn, n);
    }
    rc = rc ? rc : q3n_each_run(b, r, l, q3n_gdn_run);
    return rc ? rc : op->matmul(b, r->proj, &lw->ssm_out, r->hy->o, n);
}

/* Every layer on the n rows of r->x (embedded), leaving x holding the last layer's output. */
static int q3n_layers(struct backend *b, const struct model *m, const struct q3n_rows *r)
{
    const struct backend_ops *op = b->ops;
    const struct model_hparams *hp = &m->hp;
    int rc = op->rmsnorm(b, r->xn, r->x, &m->layers[0].attn_norm, r->n, hp->n_embd, hp->rms_eps);

    for (uint32_t l = 0; !rc && l < hp->n_layer; l++) {
        const struct layer_weights *lw = &m->layers[l];
        rc = model_layer_is_ssm(hp, l) ? q3n_deltanet(b, m, r, l) : q3n_attention(b, m, r, l);
        rc = rc ? rc : arch_add_norm(b, hp, r->x, r->proj, r->xn, &lw->ffn_norm, r->n);
        if (rc)
            break;
        struct moe_args ma = {
            .out = r->proj,
            .in = r->xn,
            .n_tok = r->n,
            .pos0 = q3n_row_pos(r, 0),
            .layer = (int)l,
            .lw = lw,
            .hp = hp,
        };
        rc = op->moe_ffn(b, &ma);
        rc = rc ? rc : op->shared_expert(b, r->proj, r->xn, lw, r->n);
        if (rc)
            break;
        if (l + 1 < hp->n_layer)
            rc = arch_add_norm(b, hp, r->x, r->proj, r->xn, &m->layers[l + 1].attn_norm, r->n);
        else
            rc = op->add(b, r->x, r->proj, (size_t)r->n * hp->n_embd);
    }
    return rc;
}

static int q3n_forward(struct backend *b, struct stream *s, const int32_t *ids, int n)
{
    const struct backend_ops *op = b->ops;
    const struct model *m = s->m;
    const struct model_hparams *hp = &m->hp;
    int rc = q3n_supported(b);

    if (rc)
        return rc;
    if (!s->hy)
        return err_set(-EINVAL, "%s: the stream has no hybrid scratch", m->arch->name);
    rc = op->embed(b, s->x, &m->tok_embd, ids, n);
    if (rc)
        return rc;
    struct q3n_rows r = {
        .x = s->x,
        .xn = s->xn,
        .proj = s->proj,
        .q = s->q,
        .k = s->k,
        .v = s->v,
        .att = s->att,
        .hy = s->hy,
        .n = n,
        .one = s,
        .pos0 = s->pos,
    };
    rc = q3n_layers(b, m, &r);
    if (rc)
        return rc;
    const float *last = s->x + (size_t)(n - 1) * hp->n_embd;
    rc = op->rmsnorm(b, s->xn, last, &m->output_norm, 1, hp->n_embd, hp->rms_eps);
    return rc ? rc : op->matmul(b, s->logits, &m->output, s->xn, 1);
}

static int q3n_forward_batch(struct backend *b, struct stream_batch *bt, struct stream *const *ss,
                             const int32_t *ids, int n)
{
    const struct backend_ops *op = b->ops;
    const struct model *m = bt->m;
    const struct model_hparams *hp = &m->hp;
    int rc = q3n_supported(b);

    rc = rc ? rc : op->embed(b, bt->x, &m->tok_embd, ids, n);
    if (rc)
        return rc;
    struct q3n_rows r = {
        .x = bt->x,
        .xn = bt->xn,
        .proj = bt->proj,
        .q = bt->q,
        .k = bt->k,
        .v = bt->v,
        .att = bt->att,
        .hy = bt->hy,
        .n = n,
        .ss = ss,
        .pos = bt->row_pos,
    };
    rc = q3n_layers(b, m, &r);
    rc = rc ? rc : op->rmsnorm(b, bt->xn, bt->x, &m->output_norm, n, hp->n_embd, hp->rms_eps);
    return rc ? rc : op->matmul(b, bt->logits, &m->output, bt->xn, n);
}

/* The MTP block on n rows: x = eh_proj [enorm(embedding of ids[i]) | hnorm(h[i])], then one
 * gated attention layer (layer n_layer: the block's weights and KV cache) with the MoE and the
 * shared expert, then the head norm into s->mtp->out. */
static int q3n_mtp_forward(struct backend *b, struct stream *s, const float *h, const int32_t *ids,
                           int n, int pos0)
{
    const struct backend_ops *op = b->ops;
    const struct model *m = s->m;
    const struct model_hparams *hp = &m->hp;
    const struct mtp_weights *mw = m->mtp;
    struct stream_mtp *mt = s->mtp;
    const size_t e = hp->n_embd;
    const uint32_t l = hp->n_layer;
    int rc = q3n_supported(b);

    if (rc)
        return rc;
    if (!mw || !mt || n < 1 || n > mt->max_rows)
        return err_set(-EINVAL, "%s: MTP rows %d without the block or its state", m->arch->name, n);
    rc = op->embed(b, mt->e, &m->tok_embd, ids, n);
    rc = rc ? rc : op->rmsnorm(b, mt->e, mt->e, &mw->enorm, n, (int)e, hp->rms_eps);
    rc = rc ? rc : op->rmsnorm(b, mt->xn, h, &mw->hnorm, n, (int)e, hp->rms_eps);
    for (int i = 0; i < n && !rc; i++) { /* eh_proj's input rows: the embedding half first */
        rc = op->copy(b, mt->cat + 2 * e * i, mt->e + e * i, e);
        rc = rc ? rc : op->copy(b, mt->cat + 2 * e * i + e, mt->xn + e * i, e);
    }
    rc = rc ? rc : op->matmul(b, mt->x, &mw->eh_proj, mt->cat, n);
    if (rc)
        return rc;
    struct q3n_rows r = {
        .x = mt->x,
        .xn = mt->xn,
        .proj = mt->proj,
        .q = mt->q,
        .k = mt->k,
        .v = mt->v,
        .att = mt->att,
        .hy = &mt->hy,
        .n = n,
        .one = s,
        .pos0 = pos0,
    };
    rc = op->rmsnorm(b, r.xn, r.x, &mw->lw.attn_norm, n, (int)e, hp->rms_eps);
    rc = rc ? rc : q3n_attention(b, m, &r, l);
    rc = rc ? rc : arch_add_norm(b, hp, r.x, r.proj, r.xn, &mw->lw.ffn_norm, n);
    if (rc)
        return rc;
    struct moe_args ma = {
        .out = r.proj,
        .in = r.xn,
        .n_tok = n,
        .pos0 = pos0,
        .layer = (int)l,
        .lw = &mw->lw,
        .hp = hp,
    };
    rc = op->moe_ffn(b, &ma);
    rc = rc ? rc : op->shared_expert(b, r.proj, r.xn, &mw->lw, n);
    rc = rc ? rc : op->add(b, r.x, r.proj, (size_t)n * e);
    return rc ? rc : op->rmsnorm(b, mt->out, r.x, &mw->head_norm, n, (int)e, hp->rms_eps);
}

const struct arch arch_qwen3next = {
    .name = "qwen3next",
    .forward = q3n_forward,
    .forward_batch = q3n_forward_batch,
    .mtp_forward = q3n_mtp_forward,
};

const struct arch arch_qwen35moe = {
    .name = "qwen35moe",
    .forward = q3n_forward,
    .forward_batch = q3n_forward_batch,
    .mtp_forward = q3n_mtp_forward,
};
