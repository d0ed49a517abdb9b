/* strata_draft: a draft model for speculative decoding (include/strata.h, strata_drafter).
 * Its stream follows the target's history: each call finds how much of the history the stream
 * already holds (the common prefix), rolls back past it and evaluates the rest, then drafts
 * greedily. The last drafted token is not evaluated: the next call starts with it when the
 * target accepted it. With a repetition penalty (strata_drafter_set_penalty) it picks as the
 * target's greedy sampler does: the argmax after the penalty over the last repeat_last_n
 * tokens of the history and the drafts so far. */
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "errors.h"
#include "sampler.h"
#include "strata.h"

struct strata_drafter {
    struct strata *s;
    struct strata_stream *st;
    int32_t *ids; /* (n_ctx) what the stream holds */
    int n, n_ctx;
    int32_t *pre; /* (n_pre) ids before every history, and pre + hist (n_ctx) */
    int n_pre;
    int32_t *full;
    long long n_eval;
    double seconds;
    float penalty; /* 1: plain argmax on the device */
    int last_n;
    int n_vocab;
    float *logits; /* (n_vocab) with a penalty */
    int32_t *win;  /* (last_n) the tokens it looks at */
};

int strata_drafter_open(struct strata *draft, const struct strata *target, int n_ctx,
                        struct strata_drafter **out)
{
    struct strata_model_info a, b;
    struct strata_drafter *d;
    int rc;

    strata_model_info(draft, &a);
    strata_model_info(target, &b);
    if (!a.has_tokenizer || !b.has_tokenizer)
        return err_set(-EINVAL, "draft model: both models need a tokenizer");
    if (a.n_vocab != b.n_vocab)
        return err_set(-EINVAL, "draft model: its vocabulary has %u tokens, the model's %u",
                       a.n_vocab, b.n_vocab);
    for (uint32_t i = 0; i < a.n_vocab; i++) {
        size_t la = 0, lb = 0;
        const char *ta = strata_token_text(draft, (int32_t)i, &la);
        const char *tb = strata_token_text(target, (int32_t)i, &lb);
        if (la != lb || (la && memcmp(ta, tb, la)))
            return err_set(-EINVAL, "draft model: token %u is '%.*s' there and '%.*s' in the model",
                           i, (int)(la > 32 ? 32 : la), ta ? ta : "", (int)(lb > 32 ? 32 : lb),
                           tb ? tb : "");
    }
    if (!(d = calloc(1, sizeof(*d))) || !(d->ids = malloc(sizeof(int32_t) * (size_t)n_ctx)) ||
        !(d->full = malloc(sizeof(int32_t) * (size_t)n_ctx))) {
        if (d)
            free(d->ids);
        free(d);
        return err_set(-ENOMEM, "out of memory");
    }
    d->s = draft;
    d->n_ctx = n_ctx;
    d->penalty = 1.0f;
    d->n_vocab = (int)a.n_vocab;
    if ((rc = strata_stream_open(draft, n_ctx, &d->st))) {
        free(d->ids);
        free(d->full);
        free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void strata_drafter_close(struct strata_drafter *d)
{
    if (!d)
        return;
    strata_stream_close(d->st);
    free(d->ids);
    free(d->full);
    free(d->pre);
    free(d->logits);
    free(d->win);
    free(d);
}

int strata_drafter_set_penalty(struct strata_drafter *d, float repeat_penalty, int repeat_last_n)
{
    if (!(repeat_penalty > 0) || repeat_last_n < 0)
        return err_set(-EINVAL, "draft model: repeat penalty %g over %d tokens",
                       (double)repeat_penalty, repeat_last_n);
    free(d->logits);
    free(d->win);
    d->logits = NULL;
    d->win = NULL;
    d->penalty = 1.0f;
    d->last_n = 0;
    if (repeat_penalty == 1.0f || !repeat_last_n)
        return 0;
    d->logits = malloc(sizeof(float) * (size_t)d->n_vocab);
    d->win = malloc(sizeof(int32_t) * (size_t)repeat_last_n);
    if (!d->logits || !d->win)
        return err_set(-ENOMEM, "out of memory");
    d->penalty = repeat_penalty;
    d->last_n = repeat_last_n;
    return 0;
}

int strata_drafter_set_prefix(struct strata_drafter *d, const int32_t *ids, int n)
{
    int32_t *p = NULL;
    if (n > 0 && !(p = malloc(sizeof(int32_t) * (size_t)n)))
        return err_set(-ENOMEM, "out of memory");
    if (n > 0)
        memcpy(p, ids, sizeof(int32_t) * (size_t)n);
    free(d->pre);
    d->pre = p;
    d->n_pre = n > 0 ? n : 0;
    return 0;
}

/* The last last_n tokens of a followed by b into d->win; their count. */
static int drafter_window(struct strata_drafter *d, const int32_t *a, int na, const int32_t *b,
                          int nb)
{
    int n = 0;
    for (int i = na + nb - d->last_n < 0 ? 0 : na + nb - d->last_n; i < na + nb; i++)
        d->win[n++] = i < na ? a[i] : b[i - na];
    return n;
}

/* Evaluates ids into the stream, recording them; *next = the argmax after them, with the
 * penalty over the window of seq (n_seq tokens) followed by drafts (n_drafts). */
static int drafter_eval(struct strata_drafter *d, const int32_t *ids, int n, int32_t *next,
                        const int32_t *seq, int n_seq, const int32_t *drafts, int n_drafts)
{
    int rc;
    if (d->penalty != 1.0f) {
        rc = strata_eval(d->st, ids, n, d->logits);
        if (!rc) {
            int nw = drafter_window(d, seq, n_seq, drafts, n_drafts);
            sampler_penalize_tokens(d->logits, d->n_vocab, d->win, nw, d->penalty);
            *next = sampler_argmax(d->logits, d->n_vocab);
        }
    } else {
        rc = strata_eval_argmax(d->st, ids, n, next);
    }
    if (rc) {
        d->n = strata_stream_pos(d->st); /* what a failed evaluation left is unknown: trust
                                          * the stream's count, and forget the rest */
        return rc;
    }
    memcpy(d->ids + d->n, ids, sizeof(int32_t) * (size_t)n);
    d->n += n;
    d->n_eval += n;
    return 0;
}

int strata_drafter_draft(void *drafter, const int32_t *hist, int n_hist, int k, int32_t *out)
{
    struct strata_drafter *d = drafter;
    int p = 0, i = 0;
    int32_t t;

    if (n_hist < 1 || k < 1 || d->n_pre + n_hist + k > d->n_ctx)
        return 0;
    /* the penalty looks at what the target's sampler saw: this call's history, no prefix */
    const int32_t *seen = hist;
    const int n_seen = n_hist;
    if (d->n_pre) { /* the prefix, then the history */
        memcpy(d->full, d->pre, sizeof(int32_t) * (size_t)d->n_pre);
        memcpy(d->full + d->n_pre, hist, sizeof(int32_t) * (size_t)n_hist);
        hist = d->full;
        n_hist += d->n_pre;
    }
    double t0 = clock_now_s();
    while (p < d->n && p < n_hist && d->ids[p] == hist[p])
        p++;
    if (p == n_hist) /* all held: the last one again, for its logits */
        p--;
    strata_stream_truncate(d->st, p);
    d->n = p;
    if (!drafter_eval(d, hist + p, n_hist - p, &t, seen, n_seen, out, 0)) {
        for (out[i++] = t; i < k; i++)
            if (drafter_eval(d, &out[i - 1], 1, &out[i], seen, n_seen, out, i))
                break;
    }
    d->seconds += clock_now_s() - t0;
    return i;
}

void strata_drafter_stats(const struct strata_drafter *d, long long *n_eval, double *seconds)
{
    *n_eval = d->n_eval;
    *seconds = d->seconds;
}
