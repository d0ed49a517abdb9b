#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

struct sampler_cand {
    int32_t id;
    float v; /* logit, then probability */
};

struct sampler_config sampler_config_default(void)
{
    return (struct sampler_config){
        .temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
        .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 0,
    };
}

int sampler_init(struct sampler *s, const struct sampler_config *cfg, int n_vocab)
{
    memset(s, 0, sizeof(*s));
    s->cfg = *cfg;
    s->n_vocab = n_vocab;
    if (s->cfg.repeat_last_n < 0)
        s->cfg.repeat_last_n = 0;
    rng_seed(&s->rng, cfg->seed, 0x5a3d1e);
    s->cand = malloc(sizeof(*s->cand) * (size_t)n_vocab);
    s->recent = malloc(sizeof(*s->recent) * (size_t)(s->cfg.repeat_last_n + 1));
    if (!s->cand || !s->recent) {
        sampler_free(s);
        return err_set(-ENOMEM, "sampler: out of memory");
    }
    return 0;
}

void sampler_free(struct sampler *s)
{
    free(s->cand);
    free(s->recent);
    s->cand = NULL;
    s->recent = NULL;
}

void sampler_accept(struct sampler *s, int32_t tok)
{
    int cap = s->cfg.repeat_last_n;
    if (cap == 0)
        return;
    s->recent[s->recent_head] = tok;
    s->recent_head = (s->recent_head + 1) % cap;
    if (s->n_recent < cap)
        s->n_recent++;
}

int32_t sampler_argmax(const float *logits, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++) {
        if (logits[i] > logits[best])
            best = i;
    }
    return best;
}

/* Penalises each distinct recent token once (CTRL-style: divide positive logits, multiply
 * negative ones). */
static void sampler_penalize(struct sampler *s, float *logits)
{
    float p = s->cfg.repeat_penalty;
    for (int i = 0; i < s->n_recent; i++) {
        int32_t t = s->recent[i];
        int seen = 0;
        for (int j = 0; j < i; j++)
            seen |= s->recent[j] == t;
        if (seen || t < 0 || t >= s->n_vocab)
            continue;
        logits[t] = logits[t] > 0 ? logits[t] / p : logits[t] * p;
    }
}

static int sampler_cand_cmp(const void *a, const void *b)
{
    const struct sampler_cand *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : 1;
}

/* Keeps the k largest logits in cand[0..k), sorted descending. */
static int sampler_top_k(struct sampler *s, const float *logits, int k)
{
    int n = s->n_vocab;
    for (int i = 0; i < n; i++)
        s->cand[i] = (struct sampler_cand){i, logits[i]};
    if (k <= 0 || k > n)
        k = n;
    if (k < n) {
        /* partial selection: keep a sorted window of the best k (k is small in practice) */
        qsort(s->cand, (size_t)k, sizeof(*s->cand), sampler_cand_cmp);
        for (int i = k; i < n; i++) {
            struct sampler_cand c = s->cand[i];
            if (sampler_cand_cmp(&c, &s->cand[k - 1]) >= 0)
                continue;
            int j = k - 1;
            while (j > 0 && sampler_cand_cmp(&c, &s->cand[j - 1]) < 0) {
                s->cand[j] = s->cand[j - 1];
                j--;
            }
            s->cand[j] = c;
        }
    } else {
        qsort(s->cand, (size_t)n, sizeof(*s->cand), sampler_cand_cmp);
    }
    return k;
}

int32_t sampler_sample(struct sampler *s, float *logits)
{
    const struct sampler_config *c = &s->cfg;
    int n;
    double sum = 0, cum = 0, r;

    if (c->repeat_penalty != 1.0f)
        sampler_penalize(s, logits);
    if (c->temperature <= 0.0f)
        return sampler_argmax(logits, s->n_vocab);
    n = sampler_top_k(s, logits, c->top_k);
    float mx = s->cand[0].v;
    for (int i = 0; i < n; i++) {
        s->cand[i].v = expf((s->cand[i].v - mx) / c->temperature);
        sum += s->cand[i].v;
    }
    for (int i = 0; i < n; i++)
        s->cand[i].v = (float)(s->cand[i].v / sum);
    if (c->top_p < 1.0f) {
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += s->cand[i].v;
            if (cum >= c->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (c->min_p > 0.0f) {
        float floor_p = c->min_p * s->cand[0].v;
        int keep = 1;
        while (keep < n && s->cand[keep].v >= floor_p)
            keep++;
        n = keep;
    }
    sum = 0;
    for (int i = 0; i < n; i++)
        sum += s->cand[i].v;
    r = rng_f32(&s->rng) * sum;
    cum = 0;
    for (int i = 0; i < n; i++) {
        cum += s->cand[i].v;
        if (r < cum)
            return s->cand[i].id;
    }
    return s->cand[n - 1].id;
}
