#include "sampler.h"

#include <math.h>
#include <stdbool.h>
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
        .temperature = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .repeat_penalty = 1.0f,
        .repeat_last_n = 64,
        .seed = 0,
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
    s->cand = malloc(sizeof(*s->cand) * 2 * (size_t)n_vocab); /* + sampler_sort_all's buffer */
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

void sampler_penalize_tokens(float *logits, int n_vocab, const int32_t *recent, int n,
                             float penalty)
{
    for (int i = 0; i < n; i++) {
        int32_t t = recent[i];
        int seen = 0;
        for (int j = 0; j < i; j++)
            seen |= recent[j] == t;
        if (seen || t < 0 || t >= n_vocab)
            continue;
        logits[t] = logits[t] > 0 ? logits[t] / penalty : logits[t] * penalty;
    }
}

static void sampler_penalize(struct sampler *s, float *logits)
{
    sampler_penalize_tokens(logits, s->n_vocab, s->recent, s->n_recent, s->cfg.repeat_penalty);
}

static int sampler_cand_cmp(const void *a, const void *b)
{
    const struct sampler_cand *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : 1;
}

/* An unsigned key whose ascending order is v's descending order (-0 taken as +0, as the
 * comparator's == does). */
static uint32_t sampler_desc_key(float v)
{
    uint32_t u;
    v += 0.0f;
    memcpy(&u, &v, sizeof(u));
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u;
    return ~u;
}

/* cand[0..n) = every logit, in sampler_cand_cmp's order (descending, ties to the lower id):
 * a stable radix sort of 3 passes over 11, 11 and 10 bits of sampler_desc_key, from the id
 * order, through the second half of cand: linear in n where qsort is not. */
static void sampler_sort_all(struct sampler *s, const float *logits, int n)
{
    enum { BITS = 11, BUCKETS = 1 << BITS };
    uint32_t count[3][BUCKETS]; /* 24 KiB */
    struct sampler_cand *a = s->cand, *b = s->cand + n;
    memset(count, 0, sizeof(count));
    for (int i = 0; i < n; i++) {
        uint32_t k = sampler_desc_key(logits[i]);
        a[i] = (struct sampler_cand){i, logits[i]};
        for (int p = 0; p < 3; p++)
            count[p][(k >> (BITS * p)) & (BUCKETS - 1)]++;
    }
    for (int p = 0; p < 3; p++) {
        uint32_t sum = 0;
        for (int d = 0; d < BUCKETS; d++) {
            uint32_t c = count[p][d];
            count[p][d] = sum;
            sum += c;
        }
        for (int i = 0; i < n; i++)
            b[count[p][(sampler_desc_key(a[i].v) >> (BITS * p)) & (BUCKETS - 1)]++] = a[i];
        struct sampler_cand *t = a;
        a = b;
        b = t;
    }
    if (a != s->cand)
        memcpy(s->cand, a, sizeof(*a) * (size_t)n);
}

/* Keeps the k largest logits in cand[0..k), sorted descending, ties to the lower id. Only a
 * logit above the current k-th is inserted (its id is larger than every kept one, so an equal
 * value never is): one compare per logit for the rest of the vocabulary. */
static int sampler_top_k(struct sampler *s, const float *logits, int k)
{
    int n = s->n_vocab;
    if (k <= 0 || k >= n) {
        sampler_sort_all(s, logits, n);
        return n;
    }
    for (int i = 0; i < k; i++)
        s->cand[i] = (struct sampler_cand){i, logits[i]};
    qsort(s->cand, (size_t)k, sizeof(*s->cand), sampler_cand_cmp);
    float thr = s->cand[k - 1].v;
    for (int i = k; i < n; i++) {
        float v = logits[i];
        if (!(v > thr))
            continue;
        int j = k - 1;
        while (j > 0 && v > s->cand[j - 1].v) {
            s->cand[j] = s->cand[j - 1];
            j--;
        }
        s->cand[j] = (struct sampler_cand){i, v};
        thr = s->cand[k - 1].v;
    }
    return k;
}

/* top-k off: the candidates top-p and min-p can keep, without sorting the whole vocabulary.
 * The softmax's sum runs over every logit; then the best 64, then 1024, until their
 * probabilities cover top_p, or reach below min_p of the best; else the whole vocabulary,
 * sorted. cand[0..n) holds probabilities, descending: the same values and order
 * as sorting everything first. */
static int sampler_nucleus(struct sampler *s, const float *logits)
{
    const struct sampler_config *c = &s->cfg;
    int nv = s->n_vocab;
    float mx = logits[sampler_argmax(logits, nv)];
    double sum = 0;
    for (int i = 0; i < nv; i++)
        sum += expf((logits[i] - mx) / c->temperature);
    for (int k = 64;;) {
        int n = sampler_top_k(s, logits, k < nv ? k : nv);
        double cum = 0;
        for (int i = 0; i < n; i++) {
            s->cand[i].v = (float)(expf((s->cand[i].v - mx) / c->temperature) / sum);
            cum += s->cand[i].v;
        }
        if (n == nv || (c->top_p < 1.0f && cum >= c->top_p) ||
            (c->min_p > 0.0f && s->cand[n - 1].v < c->min_p * s->cand[0].v))
            return n;
        /* the window insertion is O(n k): one larger window, and only if it can be enough
         * (the next candidates are each at most as likely as the last one) */
        bool may = c->min_p > 0.0f ||
                   (c->top_p < 1.0f && cum + (double)(1024 - n) * s->cand[n - 1].v >= c->top_p);
        k = k < 1024 && may ? 1024 : nv;
    }
}

/* The chain up to the draw: s->cand[0..n) holds the candidates with their weights (not
 * normalized), *sum their total. Returns n, or 0 for greedy (temperature <= 0). */
static int sampler_dist(struct sampler *s, float *logits, double *sum_out)
{
    const struct sampler_config *c = &s->cfg;
    int n;
    double sum = 0, cum = 0;

    if (c->repeat_penalty != 1.0f)
        sampler_penalize(s, logits);
    if (c->temperature <= 0.0f)
        return 0;
    if (c->top_k > 0 && c->top_k < s->n_vocab) {
        n = sampler_top_k(s, logits, c->top_k);
        float mx = s->cand[0].v;
        for (int i = 0; i < n; i++) {
            s->cand[i].v = expf((s->cand[i].v - mx) / c->temperature);
            sum += s->cand[i].v;
        }
        for (int i = 0; i < n; i++)
            s->cand[i].v = (float)(s->cand[i].v / sum);
    } else {
        n = sampler_nucleus(s, logits);
    }
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
    *sum_out = sum;
    return n;
}

int32_t sampler_sample(struct sampler *s, float *logits)
{
    double sum = 0, cum = 0, r;
    int n = sampler_dist(s, logits, &sum);

    if (n == 0)
        return sampler_argmax(logits, s->n_vocab);
    r = rng_f32(&s->rng) * sum;
    for (int i = 0; i < n; i++) {
        cum += s->cand[i].v;
        if (r < cum)
            return s->cand[i].id;
    }
    return s->cand[n - 1].id;
}

int32_t sampler_pick_draft(const int32_t *ids, const float *w, int n, int32_t draft, double u1,
                           double u2, bool *accepted)
{
    double sum = 0, wd = 0, cum = 0;
    for (int i = 0; i < n; i++) {
        sum += w[i];
        if (ids[i] == draft)
            wd = w[i];
    }
    *accepted = u1 * sum < wd;
    if (*accepted)
        return draft;
    double r = u2 * (sum - wd);
    int32_t last = -1;
    for (int i = 0; i < n; i++) {
        if (ids[i] == draft)
            continue;
        cum += w[i];
        last = ids[i];
        if (r < cum)
            return ids[i];
    }
    return last >= 0 ? last : draft; /* only the draft had weight: it is the only choice */
}

int32_t sampler_sample_draft(struct sampler *s, float *logits, int32_t draft, bool *accepted)
{
    double sum = 0;
    int n = sampler_dist(s, logits, &sum);

    if (n == 0) {
        int32_t t = sampler_argmax(logits, s->n_vocab);
        *accepted = t == draft;
        return t;
    }
    /* the candidates as two arrays for sampler_pick_draft (the scratch's second half) */
    int32_t *ids = (int32_t *)(s->cand + s->n_vocab);
    float *w = (float *)(ids + n);
    for (int i = 0; i < n; i++) {
        ids[i] = s->cand[i].id;
        w[i] = s->cand[i].v;
    }
    double u1 = rng_f32(&s->rng), u2 = rng_f32(&s->rng);
    return sampler_pick_draft(ids, w, n, draft, u1, u2, accepted);
}
