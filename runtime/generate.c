#include "generate.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "errors.h"
#include "model.h"
#include "strata.h"
#include "stream.h"
#include "tokenizer.h"

double generate_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Text produced but not yet emitted, held back while it could still become a stop string. */
struct gen_text {
    char *buf;
    size_t len, cap;
};

static int gen_text_append(struct gen_text *t, const char *s, size_t n)
{
    if (t->len + n > t->cap) {
        size_t cap = (t->len + n) * 2 + 64;
        char *b = realloc(t->buf, cap);
        if (!b)
            return -ENOMEM;
        t->buf = b;
        t->cap = cap;
    }
    memcpy(t->buf + t->len, s, n);
    t->len += n;
    return 0;
}

/* Finds the earliest stop string in t; returns its offset or -1. */
static long gen_find_stop(const struct gen_text *t, const struct generate_config *cfg)
{
    long best = -1;
    for (int i = 0; i < cfg->n_stop; i++) {
        size_t sl = strlen(cfg->stop[i]);
        if (!sl || sl > t->len)
            continue;
        for (size_t at = 0; at + sl <= t->len; at++) {
            if (!memcmp(t->buf + at, cfg->stop[i], sl)) {
                if (best < 0 || (long)at < best)
                    best = (long)at;
                break;
            }
        }
    }
    return best;
}

/* Bytes at the end of t that are a proper prefix of some stop string (must be held back). */
static size_t gen_hold(const struct gen_text *t, const struct generate_config *cfg)
{
    size_t hold = 0;
    for (int i = 0; i < cfg->n_stop; i++) {
        size_t sl = strlen(cfg->stop[i]);
        for (size_t k = sl ? sl - 1 : 0; k > hold; k--) {
            if (k <= t->len && !memcmp(t->buf + t->len - k, cfg->stop[i], k)) {
                hold = k;
                break;
            }
        }
    }
    return hold;
}

/* Emits what can no longer be part of a stop string; returns 1 when a stop string ended it. */
static int gen_flush(struct gen_text *t, const struct generate_config *cfg, generate_emit_fn emit,
                     void *ctx, bool final, int *user_stop)
{
    long stop = gen_find_stop(t, cfg);
    size_t n = stop >= 0 ? (size_t)stop : t->len - (final ? 0 : gen_hold(t, cfg));

    if (n && emit && emit(ctx, t->buf, n))
        *user_stop = 1;
    if (t->len > n)
        memmove(t->buf, t->buf + n, t->len - n);
    t->len -= n;
    return stop >= 0;
}

int generate_draft_len(double accept_ema, int kmax)
{
    double run = accept_ema < 0.99 ? accept_ema / (1 - accept_ema) : 100;
    int k = 1 + (int)(2 * run);
    return k < kmax ? k : kmax;
}

void generate_pace_init(struct strata_draft_pace *p)
{
    memset(p, 0, sizeof(*p));
    p->accept_ema = 0.5;
}

int generate_pace_len(struct strata_draft_pace *p, int kmax)
{
    if (p->pause > 0) {
        p->pause--;
        p->n_paused++;
        return 0;
    }
    return generate_draft_len(p->accept_ema, kmax);
}

void generate_pace_update(struct strata_draft_pace *p, int k, int acc)
{
    if (k <= 0)
        return;
    p->accept_ema = 0.9 * p->accept_ema + 0.1 * ((double)acc / k);
    if (acc > 0) {
        p->miss_run = 0;
        p->pause_len = 0;
        return;
    }
    if (++p->miss_run < GENERATE_PACE_MISSES)
        return;
    p->pause_len = p->pause_len ? 2 * p->pause_len : 4;
    if (p->pause_len > GENERATE_PACE_MAX_PAUSE)
        p->pause_len = GENERATE_PACE_MAX_PAUSE;
    p->pause = p->pause_len;
}

int generate_ngram_source(const int32_t *hist, int n_hist, int ngram)
{
    for (int m = ngram; m >= 2; m--) {
        if (n_hist < m + 1)
            continue;
        const int32_t *pat = hist + n_hist - m;
        for (int j = n_hist - m - 1; j >= 0; j--) /* the latest occurrence first */
            if (!memcmp(hist + j, pat, sizeof(int32_t) * (size_t)m))
                return j + m;
    }
    return -1;
}

int generate_ngram_draft(const int32_t *hist, int n_hist, int ngram, int k, int32_t *out)
{
    int src = generate_ngram_source(hist, n_hist, ngram), n = 0;
    for (int i = src; src >= 0 && i < n_hist && n < k; i++)
        out[n++] = hist[i];
    return n;
}

/* The generation loop's state. */
struct gen {
    struct stream *s;
    const struct tokenizer *tok;
    const struct generate_config *cfg;
    generate_emit_fn emit;
    void *ctx;
    int32_t *out_ids;
    struct generate_stats *st;
    struct sampler smp;
    struct tokenizer_stream ts;
    struct gen_text text;
    int user_stop;
    int32_t *hist; /* prompt and generated ids (speculative drafts look them up) */
    int n_hist;
    int hist_pos0; /* the stream position of hist[0] */
    int32_t *log;  /* lookahead: the stream's routing log, hist's positions (-1: unknown) */
    int32_t *look; /* (n_layer, (kmax + 1) k) a lookahead's experts */
    int pos; /* tokens before the one being handled (-1: the stream's position) */
};

/* Handles generated token id: end of generation, its text and the stop strings, n_predict and
 * the context. 1 when generation ends, 0 to go on, or -errno. */
static int gen_token(struct gen *g, int32_t id)
{
    const struct generate_config *cfg = g->cfg;
    struct generate_stats *st = g->st;
    char piece[4096];
    int n, rc;

    if (!cfg->ignore_eos && g->tok && tokenizer_is_eog(g->tok, id)) {
        st->stopped_eog = true;
        return 1;
    }
    if (g->out_ids)
        g->out_ids[st->n_gen] = id;
    st->n_gen++;
    sampler_accept(&g->smp, id);
    if (g->hist)
        g->hist[g->n_hist++] = id;
    if (g->tok) {
        n = tokenizer_stream_feed(g->tok, &g->ts, id, piece, sizeof(piece));
        if (n > 0 && (rc = gen_text_append(&g->text, piece, (size_t)n)))
            return rc;
        if (gen_flush(&g->text, cfg, g->emit, g->ctx, false, &g->user_stop)) {
            st->stopped_string = true;
            return 1;
        }
    }
    if (st->n_gen == cfg->n_predict || g->user_stop)
        return 1;
    if ((g->pos >= 0 ? g->pos : g->s->pos) >= g->s->n_ctx) {
        st->stopped_ctx = true;
        return 1;
    }
    return 0;
}

/* Drafts to verify after token id (already handled, not yet evaluated): how many the budget
 * allows (n_predict, the context, the adaptive length), looked up in the history. */
static int gen_drafts(struct gen *g, int k_adapt, int32_t *d)
{
    const struct generate_config *cfg = g->cfg;
    int k = k_adapt;
    int left = cfg->n_predict - g->st->n_gen; /* accepted drafts count as generated tokens */
    int room = g->s->n_ctx - g->s->pos - 1;
    k = k < left ? k : left;
    k = k < room ? k : room;
    if (k < 1)
        return 0;
    if (cfg->draft_fn)
        return cfg->draft_fn(cfg->draft_ctx, g->hist, g->n_hist, k, d);
    return generate_ngram_draft(g->hist, g->n_hist, cfg->draft_ngram, k, d);
}

/* Before the verify pass of id (hist's last token) and k prompt-lookup drafts hist[src ..]:
 * the experts each layer chose at the rows' sources src - 1 .. src + k - 1 (those evaluated
 * already), to the backend's lookahead. */
static int gen_lookahead(struct gen *g, int src, int k)
{
    const struct model_hparams *hp = &g->s->m->hp;
    struct backend *b = g->s->b;
    const int nl = (int)hp->n_layer, kk = (int)hp->n_expert_used, n = (k + 1) * kk;
    bool any = false;
    for (int r = 0; r <= k; r++) {
        int h = src - 1 + r;
        const int32_t *row = h < g->n_hist - 1 ? stream_route_log_at(g->s, g->hist_pos0 + h) : NULL;
        for (int l = 0; l < nl; l++)
            for (int i = 0; i < kk; i++) {
                int32_t e = row ? row[(size_t)l * kk + i] : -1;
                g->look[(size_t)l * n + (size_t)r * kk + i] = e;
                any |= e >= 0;
            }
    }
    if (!any)
        return 0;
    int rc = b->ops->lookahead(b, g->look, n);
    if (rc < 0)
        return rc;
    g->st->n_lookahead++;
    g->st->lookahead_experts += rc;
    return 0;
}

int generate_run(struct stream *s, const struct tokenizer *tok, const int32_t *prompt,
                 int n_prompt, const struct generate_config *cfg, generate_emit_fn emit,
                 void *ctx, int32_t *out_ids, struct generate_stats *st)
{
    uint32_t n_vocab = s->m->hp.n_vocab;
    bool spec = cfg->draft_max > 0 && cfg->draft_ngram >= 2;
    const int kmax = spec ? cfg->draft_max : 0;
    float *logits = malloc(sizeof(float) * n_vocab * (size_t)(kmax + 1));
    int32_t *drafts = malloc(sizeof(int32_t) * (size_t)(kmax + 1));
    struct gen g = {.s = s, .tok = tok, .cfg = cfg, .emit = emit, .ctx = ctx, .out_ids = out_ids,
                    .st = st, .pos = -1};
    struct stream_batch *bt = NULL;
    int rc;
    double t0;

    memset(st, 0, sizeof(*st));
    if (!logits || !drafts) {
        free(logits);
        free(drafts);
        return err_set(-ENOMEM, "out of memory");
    }
    rc = sampler_init(&g.smp, &cfg->sampling, (int)n_vocab);
    if (!rc && spec) {
        g.hist = malloc(sizeof(int32_t) * ((size_t)n_prompt + (size_t)cfg->n_predict + 1));
        if (!g.hist) {
            rc = err_set(-ENOMEM, "out of memory");
        } else if (stream_batch_open(s->b, 1, kmax + 1, &bt)) {
            /* no memory for the verify rows (a device budget planned without them): plain
             * decoding, reported in the statistics */
            spec = false;
            st->spec_unavailable = true;
            free(g.hist);
            g.hist = NULL;
        }
    }
    /* the lookahead before every step needs the history without drafts too (no memory for
     * it: no lookahead) */
    const bool look_all = cfg->lookahead == GENERATE_LOOKAHEAD_ALWAYS && s->b->ops->lookahead;
    if (!rc && !g.hist && look_all)
        g.hist = malloc(sizeof(int32_t) * ((size_t)n_prompt + (size_t)cfg->n_predict + 1));
    if (rc) {
        free(logits);
        free(drafts);
        free(g.hist);
        sampler_free(&g.smp);
        return rc;
    }
    tokenizer_stream_init(&g.ts, TOKENIZER_DECODE_SKIP_CONTROL);
    for (int i = 0; i < n_prompt; i++)
        sampler_accept(&g.smp, prompt[i]);
    if (g.hist) {
        memcpy(g.hist, prompt, sizeof(int32_t) * (size_t)n_prompt);
        g.n_hist = n_prompt;
        g.hist_pos0 = s->pos;
    }
    /* the lookahead's routing log: one entry of n_layer * k ids per position of hist */
    const bool look_drafts =
        spec && !cfg->draft_fn && s->b->ops->lookahead && cfg->lookahead != GENERATE_LOOKAHEAD_OFF;
    const int ngram = cfg->draft_ngram >= 2 ? cfg->draft_ngram : 3;
    if (g.hist && (look_all || look_drafts)) {
        const size_t row = (size_t)s->m->hp.n_layer * s->m->hp.n_expert_used;
        const size_t cap = (size_t)n_prompt + (size_t)cfg->n_predict + 1;
        g.log = malloc(sizeof(int32_t) * row * cap);
        g.look = malloc(sizeof(int32_t) * row * (size_t)(kmax + 1));
        if (g.log && g.look)
            memset(g.log, 0xff, sizeof(int32_t) * row * cap);
        if (!g.log || !g.look || stream_set_route_log(s, g.log, s->pos, (int)cap)) {
            free(g.log); /* no memory for it: drafts without their lookahead */
            free(g.look);
            g.log = g.look = NULL;
        }
    }

    /* greedy without penalties needs only the argmax, which the backend takes where the
     * logits are (on the GPU only the id comes back) */
    bool argmax_only =
        !spec && cfg->sampling.temperature <= 0.0f && cfg->sampling.repeat_penalty == 1.0f;
    int32_t next = 0, pending = -1;
    struct strata_draft_pace pace;
    generate_pace_init(&pace);
    t0 = generate_now();
    rc = argmax_only ? stream_eval_argmax(s, prompt, n_prompt, &next)
                     : stream_eval(s, prompt, n_prompt, logits);
    st->t_prompt_s = generate_now() - t0;
    st->n_prompt = n_prompt;
    t0 = generate_now();
    while (!rc && st->n_gen < cfg->n_predict && !g.user_stop) {
        int32_t id;
        if (pending >= 0)
            id = pending, pending = -1;
        else
            id = argmax_only ? next : sampler_sample(&g.smp, logits);
        int r = gen_token(&g, id);
        if (r) {
            rc = r < 0 ? r : 0;
            break;
        }
        /* a pass of id alone, or of id and drafts; the adaptive length is the run of accepted
         * drafts the running acceptance share predicts, doubled, at least 1 (0 while drafting
         * is paused after passes that kept nothing) */
        int k_adapt = spec ? generate_pace_len(&pace, kmax) : 0;
        st->n_paused = pace.n_paused;
        int k = k_adapt > 0 ? gen_drafts(&g, k_adapt, drafts + 1) : 0;
        /* the rows' sources: id's earlier occurrence and, for prompt-lookup drafts, the run
         * after it */
        if (g.log && ((k > 0 && look_drafts) || look_all)) {
            int src = generate_ngram_source(g.hist, g.n_hist, ngram);
            rc = src >= 0 ? gen_lookahead(&g, src, look_drafts ? k : 0) : 0;
            if (rc)
                break;
        }
        if (k == 0) {
            rc = argmax_only ? stream_eval_argmax(s, &id, 1, &next)
                             : stream_eval(s, &id, 1, logits);
            continue;
        }
        const int base = s->pos;
        drafts[0] = id;
        rc = stream_batch_eval_all(bt, s, drafts, k + 1, logits);
        if (rc)
            break;
        st->n_verify++;
        st->n_drafted += k;
        for (int j = 0; j < k; j++)
            st->drafted_at[j < GENERATE_SPEC_POS ? j : GENERATE_SPEC_POS - 1]++;
        int i, done = 0, acc = 0;
        for (i = 0; i < k && !done; i++) {
            bool accepted;
            int32_t t =
                sampler_sample_draft(&g.smp, logits + (size_t)i * n_vocab, drafts[1 + i], &accepted);
            if (!accepted) {
                pending = t;
                break;
            }
            st->accepted_at[i < GENERATE_SPEC_POS ? i : GENERATE_SPEC_POS - 1]++;
            acc++;
            g.pos = base + 1 + i; /* id and the drafts before this one are in the cache */
            r = gen_token(&g, t);
            g.pos = -1;
            if (r) {
                rc = r < 0 ? r : 0;
                done = 1;
            }
        }
        st->n_accepted += acc;
        generate_pace_update(&pace, k, acc);
        /* the cache keeps id and the accepted drafts, but not the last token generated when
         * generation ends here: as plain decoding, which never evaluates that one */
        r = stream_truncate(s, base + 1 + acc - (done && acc > 0 ? 1 : 0));
        if (r) {
            rc = r;
            break;
        }
        if (done)
            break;
        if (pending < 0) /* every draft accepted: the last row's logits come next */
            memmove(logits, logits + (size_t)k * n_vocab, sizeof(float) * n_vocab);
    }
    st->t_gen_s = generate_now() - t0;
    if (!rc && tok && !st->stopped_string) {
        char tail[8];
        int n = tokenizer_stream_flush(&g.ts, tail, sizeof(tail));
        if (n > 0)
            gen_text_append(&g.text, tail, (size_t)n);
        if (gen_flush(&g.text, cfg, emit, ctx, true, &g.user_stop))
            st->stopped_string = true;
    }
    stream_batch_close(bt);
    if (g.log)
        stream_set_route_log(s, NULL, 0, 0);
    free(g.log);
    free(g.look);
    free(g.hist);
    free(g.text.buf);
    free(logits);
    free(drafts);
    sampler_free(&g.smp);
    return rc;
}
