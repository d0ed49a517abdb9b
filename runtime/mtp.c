#include "mtp.h"

#include <stdlib.h>
#include <string.h>

#include "arch/arch.h"
#include "backend.h"
#include "errors.h"
#include "model.h"
#include "model_arch.h"
#include "sampler.h"

static void mtp_free(struct backend *b, struct stream_mtp *mt)
{
    if (!mt)
        return;
    if (mt->k_cache)
        b->ops->free(b, mt->k_cache);
    if (mt->v_cache)
        b->ops->free(b, mt->v_cache);
    if (mt->arena)
        b->ops->free(b, mt->arena);
    free(mt->logits_host);
    free(mt);
}

/* The state's buffers for stream s: the block's KV cache and max_rows rows of scratch. */
static int mtp_alloc(struct stream *s, struct stream_mtp *mt)
{
    struct backend *b = s->b;
    const struct model_hparams *hp = &s->m->hp;
    const size_t t = MTP_MAX_ROWS, e = hp->n_embd, qw = (size_t)hp->n_head * hp->head_dim;
    const size_t kvw = (size_t)hp->n_head_kv * hp->head_dim;

    mt->max_rows = MTP_MAX_ROWS;
    mt->k_cache = b->ops->alloc(b, (size_t)s->n_ctx * kvw);
    mt->v_cache = b->ops->alloc(b, (size_t)s->n_ctx * kvw);
    /* h, e, x, xn, proj, out (6), cat (2); q, att, gate (3), qg (2); k, v (2); h_last, h_ckpt,
     * logits */
    mt->arena = b->ops->alloc(b, t * (8 * e + 5 * qw + 2 * kvw) + 2 * e + hp->n_vocab);
    if (!mt->k_cache || !mt->v_cache || !mt->arena)
        return err_wrap(-ENOMEM, "the MTP block's cache (%d positions): ", s->n_ctx);
    float *p = mt->arena;
    mt->h = p, p += t * e;
    mt->e = p, p += t * e;
    mt->x = p, p += t * e;
    mt->xn = p, p += t * e;
    mt->proj = p, p += t * e;
    mt->out = p, p += t * e;
    mt->cat = p, p += t * 2 * e;
    mt->q = p, p += t * qw;
    mt->att = p, p += t * qw;
    mt->hy.gate = p, p += t * qw;
    mt->hy.qg = p, p += t * 2 * qw;
    mt->k = p, p += t * kvw;
    mt->v = p, p += t * kvw;
    mt->h_last = p, p += e;
    mt->h_ckpt = p, p += e;
    mt->logits = p;
    return 0;
}

int mtp_open(struct stream *s)
{
    const struct model *m = s->m;
    struct stream_mtp *mt;
    int rc;

    if (s->mtp)
        return 0;
    if (!m->mtp)
        return err_set(-ENOTSUP, m->hp.n_nextn ? "the MTP block was not loaded (--no-mtp)"
                                               : "this model has no MTP block");
    if (!s->arch->mtp_forward || !s->b->ops->copy)
        return err_set(-ENOTSUP, "the %s forward on the %s backend cannot run the MTP block",
                       m->arch->name, s->b->ops->name);
    if (!(mt = calloc(1, sizeof(*mt))))
        return err_set(-ENOMEM, "out of memory");
    mt->h_pos = -1;
    mt->h_ckpt_pos = -1;
    if ((rc = mtp_alloc(s, mt))) {
        mtp_free(s->b, mt);
        return rc;
    }
    s->mtp = mt;
    if (s->pos > 0) { /* what the stream holds, evaluated again for the block's rows */
        const int pos = s->pos;
        int32_t *ids = s->hist ? malloc(sizeof(int32_t) * (size_t)pos) : NULL;
        if (!ids) {
            mtp_close(s);
            return err_set(s->hist ? -ENOMEM : -ENOTSUP,
                           "the MTP block needs the stream's tokens to follow it");
        }
        memcpy(ids, s->hist, sizeof(int32_t) * (size_t)pos);
        stream_progress_fn progress = s->progress;
        s->progress = NULL;
        rc = stream_truncate(s, 0);
        rc = rc ? rc : stream_eval(s, ids, pos, NULL);
        s->progress = progress;
        free(ids);
        if (rc) {
            mtp_close(s);
            return rc;
        }
    }
    return 0;
}

void mtp_close(struct stream *s)
{
    mtp_free(s->b, s->mtp);
    s->mtp = NULL;
}

/* The block's rows [0, n) (n <= max_rows) from mt->h and ids at positions pos0... */
static int mtp_rows(struct stream *s, const int32_t *ids, int n, int pos0)
{
    struct stream_mtp *mt = s->mtp;
    mt->n_rows += n;
    return s->arch->mtp_forward(s->b, s, mt->h, ids, n, pos0);
}

int mtp_follow(struct stream *s, const float *x, const int32_t *ids, int n, int pos0)
{
    struct stream_mtp *mt = s->mtp;
    const struct backend_ops *op = s->b->ops;
    const struct model_hparams *hp = &s->m->hp;
    const size_t e = hp->n_embd;
    const struct weight *onorm = &s->m->output_norm;
    int rc = 0;

    if (!mt || n < 1)
        return 0;
    /* row t needs h_t and the token at t + 1: rows [first, pos0 + n - 1) are complete now;
     * row pos0 - 1 takes h_last, the others this forward's rows */
    int first = mt->pos > pos0 - 1 ? mt->pos : pos0 - 1;
    if (first == pos0 - 1 && mt->h_pos != pos0 - 1)
        first = pos0; /* h_{pos0 - 1} is gone: its row is left out */
    for (int t = first; t < pos0 + n - 1 && !rc;) {
        int m = pos0 + n - 1 - t < mt->max_rows ? pos0 + n - 1 - t : mt->max_rows;
        int i0 = t - pos0, r = 0; /* row t's hidden state is x row i0 (h_last when -1) */
        if (i0 < 0) {
            rc = op->copy(s->b, mt->h, mt->h_last, e);
            r = 1;
        }
        if (!rc && m > r)
            rc = op->rmsnorm(s->b, mt->h + r * e, x + (size_t)(i0 + r) * e, onorm, m - r, (int)e,
                             hp->rms_eps);
        rc = rc ? rc : mtp_rows(s, ids + i0 + 1, m, t);
        t += m;
    }
    if (rc)
        return rc;
    if (pos0 + n - 1 > mt->pos)
        mt->pos = pos0 + n - 1;
    rc = op->rmsnorm(s->b, mt->h_last, x + (size_t)(n - 1) * e, onorm, 1, (int)e, hp->rms_eps);
    mt->h_pos = rc ? -1 : pos0 + n - 1;
    return rc;
}

void mtp_truncate(struct stream *s, int pos)
{
    struct stream_mtp *mt = s->mtp;
    if (!mt)
        return;
    int keep = pos > 0 ? pos - 1 : 0;
    if (mt->pos > keep)
        mt->pos = keep;
    if (mt->h_pos > pos - 1)
        mt->h_pos = -1;
}

int mtp_checkpoint(struct stream *s)
{
    struct stream_mtp *mt = s->mtp;
    if (!mt)
        return 0;
    mt->h_ckpt_pos = -1;
    if (mt->h_pos < 0 || mt->h_pos != s->pos - 1)
        return 0;
    int rc = s->b->ops->copy(s->b, mt->h_ckpt, mt->h_last, s->m->hp.n_embd);
    if (!rc)
        mt->h_ckpt_pos = mt->h_pos;
    return rc;
}

int mtp_restore(struct stream *s)
{
    struct stream_mtp *mt = s->mtp;
    if (!mt || mt->h_ckpt_pos < 0 || mt->h_ckpt_pos != s->pos - 1)
        return 0;
    int rc = s->b->ops->copy(s->b, mt->h_last, mt->h_ckpt, s->m->hp.n_embd);
    mt->h_pos = rc ? -1 : mt->h_ckpt_pos;
    return rc;
}

/* The argmax of the block's last logits. */
static int mtp_argmax(struct stream *s, int32_t *out)
{
    struct stream_mtp *mt = s->mtp;
    struct backend *b = s->b;
    const int nv = (int)s->m->hp.n_vocab;
    if (b->ops->read_argmax)
        return b->ops->read_argmax(b, mt->logits, nv, out);
    if (!mt->logits_host && !(mt->logits_host = malloc(sizeof(float) * (size_t)nv)))
        return err_set(-ENOMEM, "out of memory");
    int rc = b->ops->read(b, mt->logits_host, mt->logits, (size_t)nv);
    if (!rc)
        *out = sampler_argmax(mt->logits_host, nv);
    return rc;
}

int mtp_draft(struct stream *s, int32_t id, int k, int32_t *out)
{
    struct stream_mtp *mt = s->mtp;
    struct backend *b = s->b;
    const struct model *m = s->m;
    const size_t e = m->hp.n_embd;
    const int p = s->pos;
    int rc, i;

    if (!mt || k < 1 || p < 1 || mt->h_pos != p - 1 || mt->pos < p - 1 || p - 1 + k > s->n_ctx)
        return 0;
    rc = b->ops->copy(b, mt->h, mt->h_last, e);
    for (i = 0; i < k && !rc; i++) {
        int32_t tok = i ? out[i - 1] : id;
        rc = mtp_rows(s, &tok, 1, p - 1 + i);
        if (!rc && i == 0 && mt->pos < p) /* row p - 1 is final (id was sampled); the rows
                                           * after it hold drafts */
            mt->pos = p;
        rc = rc ? rc : b->ops->matmul(b, mt->logits, &m->output, mt->out, 1);
        rc = rc ? rc : mtp_argmax(s, &out[i]);
        if (!rc && i + 1 < k) /* the next row's hidden state: this row's output */
            rc = b->ops->copy(b, mt->h, mt->out, e);
    }
    return rc ? rc : i;
}
