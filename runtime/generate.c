#include "generate.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "errors.h"
#include "model.h"
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
    memmove(t->buf, t->buf + n, t->len - n);
    t->len -= n;
    return stop >= 0;
}

int generate_run(struct stream *s, const struct tokenizer *tok, const int32_t *prompt,
                 int n_prompt, const struct generate_config *cfg, generate_emit_fn emit,
                 void *ctx, int32_t *out_ids, struct generate_stats *st)
{
    uint32_t n_vocab = s->m->hp.n_vocab;
    float *logits = malloc(sizeof(float) * n_vocab);
    struct tokenizer_stream ts;
    struct gen_text text = {0};
    struct sampler smp;
    int rc, user_stop = 0;
    double t0;

    memset(st, 0, sizeof(*st));
    if (!logits)
        return err_set(-ENOMEM, "out of memory");
    rc = sampler_init(&smp, &cfg->sampling, (int)n_vocab);
    if (rc) {
        free(logits);
        return rc;
    }
    tokenizer_stream_init(&ts, TOKENIZER_DECODE_SKIP_CONTROL);
    for (int i = 0; i < n_prompt; i++)
        sampler_accept(&smp, prompt[i]);

    /* greedy without penalties needs only the argmax, which the backend takes where the
     * logits are (on the GPU only the id comes back) */
    bool argmax_only = cfg->sampling.temperature <= 0.0f && cfg->sampling.repeat_penalty == 1.0f;
    int32_t next = 0;
    t0 = generate_now();
    rc = argmax_only ? stream_eval_argmax(s, prompt, n_prompt, &next)
                     : stream_eval(s, prompt, n_prompt, logits);
    st->t_prompt_s = generate_now() - t0;
    st->n_prompt = n_prompt;
    t0 = generate_now();
    while (!rc && st->n_gen < cfg->n_predict && !user_stop) {
        int32_t id = argmax_only ? next : sampler_sample(&smp, logits);
        char piece[4096];
        int n;

        if (!cfg->ignore_eos && tok && tokenizer_is_eog(tok, id)) {
            st->stopped_eog = true;
            break;
        }
        if (out_ids)
            out_ids[st->n_gen] = id;
        st->n_gen++;
        sampler_accept(&smp, id);
        if (tok) {
            n = tokenizer_stream_feed(tok, &ts, id, piece, sizeof(piece));
            if (n > 0 && (rc = gen_text_append(&text, piece, (size_t)n)))
                break;
            if (gen_flush(&text, cfg, emit, ctx, false, &user_stop)) {
                st->stopped_string = true;
                break;
            }
        }
        if (st->n_gen == cfg->n_predict)
            break;
        if (s->pos >= s->n_ctx) {
            st->stopped_ctx = true;
            break;
        }
        rc = argmax_only ? stream_eval_argmax(s, &id, 1, &next) : stream_eval(s, &id, 1, logits);
    }
    st->t_gen_s = generate_now() - t0;
    if (!rc && tok && !st->stopped_string) {
        char tail[8];
        int n = tokenizer_stream_flush(&ts, tail, sizeof(tail));
        if (n > 0)
            gen_text_append(&text, tail, (size_t)n);
        if (gen_flush(&text, cfg, emit, ctx, true, &user_stop))
            st->stopped_string = true;
    }
    free(text.buf);
    free(logits);
    sampler_free(&smp);
    return rc;
}
