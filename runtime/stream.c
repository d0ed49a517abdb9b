#include "stream.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arch/arch.h"
#include "backend.h"
#include "errors.h"
#include "model_arch.h"
#include "mtp.h"
#include "sampler.h"

uint64_t stream_hybrid_floats(const struct model_hparams *hp)
{
    if (!hp->full_attn_interval)
        return 0;
    uint64_t qw = (uint64_t)hp->n_head * hp->head_dim, d = hp->ssm_d_state;
    uint64_t vw = hp->ssm_n_v * d, cw = 2 * hp->ssm_n_k * d + vw;
    return 3 * qw + cw + 2 * vw + 2 * (uint64_t)hp->ssm_n_v;
}

static void stream_hybrid_free(struct backend *b, struct stream_hybrid *hy)
{
    if (hy)
        b->ops->free(b, hy->mem);
    free(hy);
}

/* The hybrid scratch for `rows` tokens, or NULL with *rc = 0 when the model needs none. */
static struct stream_hybrid *stream_hybrid_alloc(struct backend *b, size_t rows, int *rc)
{
    const struct model_hparams *hp = &b->model->hp;
    size_t qw = (size_t)hp->n_head * hp->head_dim, d = hp->ssm_d_state;
    size_t vw = hp->ssm_n_v * d, cw = 2 * hp->ssm_n_k * d + vw;
    struct stream_hybrid *hy;

    *rc = 0;
    if (!hp->full_attn_interval)
        return NULL;
    if (!(hy = calloc(1, sizeof(*hy))) ||
        !(hy->mem = b->ops->alloc(b, rows * stream_hybrid_floats(hp)))) {
        free(hy);
        *rc = err_set(-ENOMEM, "out of memory for the hybrid layers' scratch");
        return NULL;
    }
    hy->qg = hy->mem;
    hy->gate = hy->qg + rows * 2 * qw;
    hy->qkv = hy->gate + rows * qw;
    hy->z = hy->qkv + rows * cw;
    hy->ba = hy->z + rows * vw;
    hy->o = hy->ba + rows * 2 * hp->ssm_n_v;
    return hy;
}

/* The floats of the conv states and of the delta rule states of s (each one span). */
static void stream_state_floats(const struct stream *s, size_t *conv, size_t *ssm)
{
    const struct model_hparams *hp = &s->m->hp;
    *conv = (size_t)model_n_ssm_layers(hp) * model_conv_state_floats(hp);
    *ssm = (size_t)model_n_ssm_layers(hp) * model_ssm_state_floats(hp);
}

/* Copies the recurrent state of s aside as its checkpoint at s->pos (allocated on first use);
 * a backend without copy keeps none. */
static int stream_checkpoint(struct stream *s)
{
    struct backend *b = s->b;
    size_t conv, ssm;
    if (!s->conv_state || !b->ops->copy)
        return 0;
    stream_state_floats(s, &conv, &ssm);
    if (!s->ckpt && !(s->ckpt = b->ops->alloc(b, conv + ssm)))
        return err_wrap(-ENOMEM, "a checkpoint of the recurrent state: ");
    int rc = b->ops->copy(b, s->ckpt, s->conv_state, conv);
    rc = rc ? rc : b->ops->copy(b, s->ckpt + conv, s->ssm_state, ssm);
    rc = rc ? rc : mtp_checkpoint(s);
    s->ckpt_pos = rc ? -1 : s->pos;
    return rc;
}

static int stream_restore(struct stream *s)
{
    struct backend *b = s->b;
    size_t conv, ssm;
    stream_state_floats(s, &conv, &ssm);
    int rc = b->ops->copy(b, s->conv_state, s->ckpt, conv);
    rc = rc ? rc : b->ops->copy(b, s->ssm_state, s->ckpt + conv, ssm);
    if (!rc)
        s->pos = s->ckpt_pos;
    return rc ? rc : mtp_restore(s);
}

/* Zeroes the recurrent state of s (an empty stream). */
static int stream_state_reset(struct stream *s)
{
    const struct model_hparams *hp = &s->m->hp;
    struct backend *b = s->b;
    size_t n = model_n_ssm_layers(hp);

    if (!s->conv_state)
        return 0;
    if (!b->ops->zero)
        return err_set(-ENOTSUP, "the %s backend cannot reset a recurrent state", b->ops->name);
    int rc = b->ops->zero(b, s->conv_state, n * model_conv_state_floats(hp));
    return rc ? rc : b->ops->zero(b, s->ssm_state, n * model_ssm_state_floats(hp));
}

int stream_size_get(const struct model *m, int n_ctx, int max_tok, struct stream_size *out)
{
    const struct model_hparams *hp = &m->hp;
    uint64_t kvw, act, kv;

    if (n_ctx <= 0 || max_tok <= 0)
        return err_set(-EINVAL, "stream: context %d and batch %d must be positive", n_ctx,
                       max_tok);
    /* floats: kvw = n_head_kv*head_dim; act = 3 n_embd + 2 n_head*head_dim + 2 kvw per token
     * (and the hybrid scratch); the recurrent state is a few MiB per layer at most */
    kvw = (uint64_t)hp->n_head_kv * hp->head_dim;
    act = 3 * (uint64_t)hp->n_embd + 2 * (uint64_t)hp->n_head * hp->head_dim + 2 * kvw +
          stream_hybrid_floats(hp);
    /* the state and the checkpoint a lockstep step of several rows may copy it into */
    uint64_t state = 2 * (uint64_t)model_n_ssm_layers(hp) *
                     (model_conv_state_floats(hp) + model_ssm_state_floats(hp)) * sizeof(float);
    if (__builtin_mul_overflow(kvw, (uint64_t)n_ctx, &kv) ||
        __builtin_mul_overflow(kv, 2 * (uint64_t)model_n_kv_layers(hp) * sizeof(float), &kv) ||
        __builtin_add_overflow(kv, state, &kv) ||
        __builtin_mul_overflow(act, (uint64_t)max_tok, &act) ||
        __builtin_add_overflow(act, (uint64_t)hp->n_vocab, &act) ||
        __builtin_mul_overflow(act, sizeof(float), &act) || kv > SIZE_MAX || act > SIZE_MAX)
        return err_set(-EOVERFLOW,
                       "stream: the KV cache of %d positions or the activations of %d tokens "
                       "overflow 64 bits (%u layers, %u KV heads of %u)",
                       n_ctx, max_tok, hp->n_layer, hp->n_head_kv, hp->head_dim);
    out->kv_bytes = kv;
    out->arena_bytes = act;
    return 0;
}

int stream_size_check_host(const struct stream_size *sz, int n_ctx, uint64_t avail)
{
    const double gib = 1024.0 * 1024.0 * 1024.0;
    uint64_t need = sz->kv_bytes + sz->arena_bytes; /* each < SIZE_MAX: no overflow */

    if (need <= avail / 10 * 9)
        return 0;
    return err_set(-ENOMEM,
                   "a stream of %d positions needs %.1f GiB (KV cache %.1f GiB + activations "
                   "%.1f GiB) but %.1f GiB are available (a stream may take 90%%): use a "
                   "smaller context",
                   n_ctx, need / gib, sz->kv_bytes / gib, sz->arena_bytes / gib, avail / gib);
}

int stream_open(struct backend *b, int n_ctx, int max_tok, struct stream **out)
{
    const struct model_hparams *hp = &b->model->hp;
    struct stream *s;
    struct stream_size sz;
    size_t qw = (size_t)hp->n_head * hp->head_dim, kvw = (size_t)hp->n_head_kv * hp->head_dim;
    size_t e = hp->n_embd, t = (size_t)max_tok;
    int rc;

    const struct arch *arch = arch_find(b->model->arch->name);
    if (!arch)
        return err_set(-ENOTSUP, "stream: no forward for architecture '%s'",
                       b->model->arch->name);
    rc = stream_size_get(b->model, n_ctx, max_tok, &sz);
    if (rc)
        return rc;
    s = calloc(1, sizeof(*s));
    if (!s)
        return err_set(-ENOMEM, "out of memory");
    s->b = b;
    s->m = b->model;
    s->arch = arch;
    s->n_ctx = n_ctx;
    s->max_tok = max_tok;
    s->kv_layer_floats = (size_t)n_ctx * kvw;
    s->k_cache = b->ops->alloc(b, s->kv_layer_floats * model_n_kv_layers(hp));
    s->v_cache = b->ops->alloc(b, s->kv_layer_floats * model_n_kv_layers(hp));
    s->arena = b->ops->alloc(b, (sz.arena_bytes / sizeof(float)) - t * stream_hybrid_floats(hp));
    if (!s->k_cache || !s->v_cache || !s->arena) {
        stream_close(s);
        return err_wrap(-ENOMEM, "stream of %d tokens: ", n_ctx);
    }
    s->ckpt_pos = -1;
    if (model_n_ssm_layers(hp)) {
        size_t n = model_n_ssm_layers(hp);
        s->conv_state = b->ops->alloc(b, n * model_conv_state_floats(hp));
        s->ssm_state = b->ops->alloc(b, n * model_ssm_state_floats(hp));
        s->hist = malloc(sizeof(int32_t) * (size_t)n_ctx);
        if (!s->conv_state || !s->ssm_state || !s->hist) {
            stream_close(s);
            return err_wrap(-ENOMEM, "the recurrent state of a stream: ");
        }
        rc = stream_state_reset(s);
        if (rc) {
            stream_close(s);
            return rc;
        }
    }
    s->hy = stream_hybrid_alloc(b, t, &rc);
    if (rc) {
        stream_close(s);
        return rc;
    }
    s->x = s->arena;
    s->xn = s->x + t * e;
    s->proj = s->xn + t * e;
    s->q = s->proj + t * e;
    s->att = s->q + t * qw;
    s->k = s->att + t * qw;
    s->v = s->k + t * kvw;
    s->logits = s->v + t * kvw;
    *out = s;
    return 0;
}

void stream_close(struct stream *s)
{
    if (!s)
        return;
    mtp_close(s);
    s->b->ops->free(s->b, s->k_cache);
    s->b->ops->free(s->b, s->v_cache);
    s->b->ops->free(s->b, s->arena);
    if (s->ckpt)
        s->b->ops->free(s->b, s->ckpt);
    if (s->conv_state)
        s->b->ops->free(s->b, s->conv_state);
    if (s->ssm_state)
        s->b->ops->free(s->b, s->ssm_state);
    stream_hybrid_free(s->b, s->hy);
    free(s->hist);
    free(s->logits_host);
    free(s->route_rows);
    free(s);
}

int stream_set_route_log(struct stream *s, int32_t *log, int pos0, int cap)
{
    if (log && !s->route_rows &&
        !(s->route_rows = malloc(sizeof(*s->route_rows) * (size_t)s->max_tok)))
        return err_set(-ENOMEM, "out of memory");
    s->route_log = cap > 0 ? log : NULL;
    s->route_log_pos0 = pos0;
    s->route_log_cap = cap > 0 ? cap : 0;
    return 0;
}

static int32_t *stream_log_row(const struct stream *s, int pos)
{
    if (!s->route_log || pos < s->route_log_pos0 || pos - s->route_log_pos0 >= s->route_log_cap)
        return NULL;
    return s->route_log +
           (size_t)(pos - s->route_log_pos0) * s->m->hp.n_layer * s->m->hp.n_expert_used;
}

const int32_t *stream_route_log_at(const struct stream *s, int pos)
{
    return stream_log_row(s, pos);
}

/* The backend's routing log for a forward of n rows (rows[r]: NULL or a log entry), or none
 * when no row is logged. */
static void stream_log_rows(struct backend *b, int32_t **rows, int n)
{
    bool any = false;
    for (int r = 0; r < n && !any; r++)
        any = rows[r] != NULL;
    b->route_rows = any ? rows : NULL;
    b->n_route_rows = any ? n : 0;
}

static void stream_log_end(struct backend *b)
{
    b->route_rows = NULL;
    b->n_route_rows = 0;
}

int stream_eval(struct stream *s, const int32_t *ids, int n, float *logits_host)
{
    int rc = 0;

    if (n <= 0)
        return err_set(-EINVAL, "stream_eval: no tokens");
    if (s->pos + n > s->n_ctx)
        return err_set(-ENOSPC, "context full: %d tokens in the cache + %d new > %d", s->pos, n,
                       s->n_ctx);
    const struct backend_ops *op = s->b->ops;
    if (op->eval_begin)
        op->eval_begin(s->b, n);
    for (int i = 0; i < n; i += s->max_tok) {
        int chunk = n - i < s->max_tok ? n - i : s->max_tok;
        /* a backend may replay a recorded step instead of the forward (CUDA graphs) */
        int replayed = op->step_begin ? op->step_begin(s->b, s, ids + i, chunk, s->pos) : 0;
        if (replayed < 0)
            return replayed;
        if (!replayed) {
            if (s->route_log) {
                for (int r = 0; r < chunk; r++)
                    s->route_rows[r] = stream_log_row(s, s->pos + r);
                stream_log_rows(s->b, s->route_rows, chunk);
            }
            rc = s->arch->forward(s->b, s, ids + i, chunk);
            stream_log_end(s->b);
            if (op->step_end)
                rc = op->step_end(s->b, rc);
        }
        if (!rc && s->mtp) /* the chunk's final residuals are in s->x */
            rc = mtp_follow(s, s->x, ids + i, chunk, s->pos);
        if (rc)
            return rc;
        if (s->hist)
            memmove(s->hist + s->pos, ids + i, sizeof(int32_t) * chunk);
        s->pos += chunk;
        if (s->progress && n > s->max_tok && s->progress(s->progress_ctx, i + chunk, n))
            return err_set(-EINTR, "stopped after %d of %d tokens", i + chunk, n);
    }
    if (logits_host)
        return s->b->ops->read(s->b, logits_host, s->logits, s->m->hp.n_vocab);
    return 0;
}

int stream_batch_open(struct backend *b, int max_streams, int max_n, struct stream_batch **out)
{
    const struct model_hparams *hp = &b->model->hp;
    size_t t = (size_t)max_n, e = hp->n_embd, qw = (size_t)hp->n_head * hp->head_dim;
    size_t kvw = (size_t)hp->n_head_kv * hp->head_dim;
    struct stream_batch *bt;

    if (max_streams < 1 || max_streams > 4096 || max_n < max_streams || max_n > 8192)
        return err_set(-EINVAL, "batch: %d streams (1..4096) and %d rows (streams..8192)",
                       max_streams, max_n);
    const struct arch *arch = arch_find(b->model->arch->name);
    if (!arch || !arch->forward_batch)
        return err_set(-ENOTSUP, "batch: no lockstep forward for architecture '%s'",
                       b->model->arch->name);
    bt = calloc(1, sizeof(*bt));
    if (!bt)
        return err_set(-ENOMEM, "out of memory");
    bt->b = b;
    bt->m = b->model;
    bt->max_n = max_n;
    bt->max_streams = max_streams;
    bt->row_st = malloc(sizeof(*bt->row_st) * t);
    bt->row_pos = malloc(sizeof(*bt->row_pos) * t);
    bt->route_rows = malloc(sizeof(*bt->route_rows) * t);
    if (!bt->row_st || !bt->row_pos || !bt->route_rows) {
        free(bt->row_st);
        free(bt->row_pos);
        free(bt->route_rows);
        free(bt);
        return err_set(-ENOMEM, "out of memory");
    }
    bt->arena = b->ops->alloc(b, t * (3 * e + 2 * qw + 2 * kvw + hp->n_vocab));
    if (!bt->arena) {
        free(bt->row_st);
        free(bt->row_pos);
        free(bt->route_rows);
        free(bt);
        return err_wrap(-ENOMEM, "batch of %d streams: ", max_n);
    }
    bt->x = bt->arena;
    bt->xn = bt->x + t * e;
    bt->proj = bt->xn + t * e;
    bt->q = bt->proj + t * e;
    bt->att = bt->q + t * qw;
    bt->k = bt->att + t * qw;
    bt->v = bt->k + t * kvw;
    bt->logits = bt->v + t * kvw;
    int rc;
    bt->hy = stream_hybrid_alloc(b, t, &rc);
    if (rc) {
        stream_batch_close(bt);
        return rc;
    }
    *out = bt;
    return 0;
}

void stream_batch_close(struct stream_batch *bt)
{
    if (!bt)
        return;
    bt->b->ops->free(bt->b, bt->arena);
    stream_hybrid_free(bt->b, bt->hy);
    free(bt->row_st);
    free(bt->row_pos);
    free(bt->route_rows);
    free(bt);
}

static int batch_eval(struct stream_batch *bt, struct stream *const *ss, const int *n_tok, int n,
                      const int32_t *ids, float *logits_host, bool all_rows)
{
    const struct backend_ops *op = bt->b->ops;
    const size_t nv = bt->m->hp.n_vocab;
    int rows = 0;
    if (n < 1 || n > bt->max_streams)
        return err_set(-EINVAL, "batch: %d streams in a step (1..%d)", n, bt->max_streams);
    for (int i = 0; i < n; i++) {
        int t = n_tok ? n_tok[i] : 1;
        if (ss[i]->b != bt->b)
            return err_set(-EINVAL, "batch: stream %d belongs to another backend", i);
        if (t < 1 || t > bt->max_n - rows)
            return err_set(-EINVAL, "batch: %d tokens of stream %d after %d rows (at most %d)",
                           t, i, rows, bt->max_n);
        if (ss[i]->pos + t > ss[i]->n_ctx)
            return err_set(-ENOSPC, "context full: stream %d holds %d of %d tokens, %d more",
                           i, ss[i]->pos, ss[i]->n_ctx, t);
        for (int j = 0; j < i; j++)
            if (ss[j] == ss[i])
                return err_set(-EINVAL, "batch: stream %d appears twice in a step", i);
        for (int j = 0; j < t; j++, rows++) {
            bt->row_st[rows] = ss[i];
            bt->row_pos[rows] = ss[i]->pos + j;
        }
    }
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) /* several rows of a recurrent stream: a checkpoint */
        if (ss[i]->hist && n_tok && n_tok[i] > 1)
            rc = stream_checkpoint(ss[i]);
    if (rc)
        return rc;
    for (int r = 0; r < rows; r++)
        bt->route_rows[r] = stream_log_row(bt->row_st[r], bt->row_pos[r]);
    stream_log_rows(bt->b, bt->route_rows, rows);
    rc = ss[0]->arch->forward_batch(bt->b, bt, bt->row_st, ids, rows);
    stream_log_end(bt->b);
    if (op->step_end) /* a step the caller ran: the backend's bookkeeping after it */
        rc = op->step_end(bt->b, rc);
    if (rc)
        return rc;
    for (int i = 0, r = 0; i < n && !rc; i++) { /* MTP states, from the rows' residuals */
        int t = n_tok ? n_tok[i] : 1;
        if (ss[i]->mtp)
            rc = mtp_follow(ss[i], bt->x + (size_t)r * bt->m->hp.n_embd, ids + r, t, ss[i]->pos);
        r += t;
    }
    if (rc)
        return rc;
    for (int i = 0, r = 0; i < n; i++) { /* the ids of recurrent streams */
        int t = n_tok ? n_tok[i] : 1;
        if (ss[i]->hist)
            memcpy(ss[i]->hist + ss[i]->pos, ids + r, sizeof(int32_t) * t);
        r += t;
    }
    if (rows == n || all_rows) {
        for (int i = 0; i < n; i++)
            ss[i]->pos += n_tok ? n_tok[i] : 1;
        return op->read(bt->b, logits_host, bt->logits, (size_t)rows * nv);
    }
    for (int i = 0, r = 0; i < n && !rc; i++) {
        r += n_tok[i];
        ss[i]->pos += n_tok[i];
        rc = op->read(bt->b, logits_host + (size_t)i * nv, bt->logits + (size_t)(r - 1) * nv, nv);
    }
    return rc;
}

int stream_batch_eval(struct stream_batch *bt, struct stream *const *ss, const int *n_tok, int n,
                      const int32_t *ids, float *logits_host)
{
    return batch_eval(bt, ss, n_tok, n, ids, logits_host, false);
}

int stream_batch_eval_rows(struct stream_batch *bt, struct stream *const *ss, const int *n_tok,
                           int n, const int32_t *ids, float *logits_host)
{
    return batch_eval(bt, ss, n_tok, n, ids, logits_host, true);
}

int stream_batch_eval_all(struct stream_batch *bt, struct stream *s, const int32_t *ids, int n,
                          float *logits_host)
{
    const struct backend_ops *op = bt->b->ops;
    if (s->b != bt->b)
        return err_set(-EINVAL, "batch: the stream belongs to another backend");
    if (n < 1 || n > bt->max_n)
        return err_set(-EINVAL, "batch: %d tokens in a step (1..%d)", n, bt->max_n);
    if (s->pos + n > s->n_ctx)
        return err_set(-ENOSPC, "context full: the stream holds %d of %d tokens, %d more", s->pos,
                       s->n_ctx, n);
    for (int j = 0; j < n; j++) {
        bt->row_st[j] = s;
        bt->row_pos[j] = s->pos + j;
    }
    for (int j = 0; j < n; j++)
        bt->route_rows[j] = stream_log_row(s, s->pos + j);
    stream_log_rows(bt->b, bt->route_rows, n);
    int rc = s->hist && n > 1 ? stream_checkpoint(s) : 0;
    rc = rc ? rc : s->arch->forward_batch(bt->b, bt, bt->row_st, ids, n);
    stream_log_end(bt->b);
    if (op->step_end)
        rc = op->step_end(bt->b, rc);
    if (!rc && s->mtp)
        rc = mtp_follow(s, bt->x, ids, n, s->pos);
    if (rc)
        return rc;
    if (s->hist)
        memcpy(s->hist + s->pos, ids, sizeof(int32_t) * n);
    s->pos += n;
    return op->read(bt->b, logits_host, bt->logits, (size_t)n * bt->m->hp.n_vocab);
}

int stream_truncate(struct stream *s, int pos)
{
    if (pos < 0 || pos > s->pos)
        return 0;
    if (pos < s->pos)
        mtp_truncate(s, pos);
    if (!s->hist || pos == s->pos) {
        s->pos = pos;
        return 0;
    }
    /* the recurrent state holds all s->pos tokens: back to the checkpoint when pos is at or
     * after it, else start over; then evaluate the ids up to pos */
    int rc;
    if (s->ckpt_pos >= 0 && pos >= s->ckpt_pos) {
        rc = stream_restore(s);
    } else {
        s->pos = 0;
        s->ckpt_pos = -1;
        rc = stream_state_reset(s);
    }
    if (rc || pos == s->pos)
        return rc;
    stream_progress_fn progress = s->progress;
    s->progress = NULL;
    /* hist[s->pos, pos) is rewritten with itself */
    rc = stream_eval(s, s->hist + s->pos, pos - s->pos, NULL);
    s->progress = progress;
    if (rc) {
        s->pos = 0;
        s->ckpt_pos = -1;
        stream_state_reset(s);
    }
    return rc;
}

int stream_eval_argmax(struct stream *s, const int32_t *ids, int n, int32_t *next)
{
    int rc = stream_eval(s, ids, n, NULL);
    if (rc)
        return rc;
    if (s->b->ops->read_argmax)
        return s->b->ops->read_argmax(s->b, s->logits, (int)s->m->hp.n_vocab, next);
    if (!s->logits_host && !(s->logits_host = malloc(sizeof(float) * s->m->hp.n_vocab)))
        return err_set(-ENOMEM, "out of memory");
    rc = s->b->ops->read(s->b, s->logits_host, s->logits, s->m->hp.n_vocab);
    if (!rc)
        *next = sampler_argmax(s->logits_host, (int)s->m->hp.n_vocab);
    return rc;
}
