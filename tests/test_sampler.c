/* sampler: greedy, top-k, top-p, min-p, temperature and repetition penalty on fresh random
 * logits, against direct computations; seeded determinism; empirical frequencies. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"
#include "testutil.h"

#define NV 1000

static void fill_logits(struct rng *r, float *l, int n)
{
    for (int i = 0; i < n; i++)
        l[i] = 3.0f * rng_normal(r);
}

static int32_t sample_once(struct sampler_config cfg, const float *logits)
{
    struct sampler s;
    float l[NV];
    int32_t t;
    memcpy(l, logits, sizeof(l));
    sampler_init(&s, &cfg, NV);
    t = sampler_sample(&s, l);
    sampler_free(&s);
    return t;
}

/* The sampling chain the plain way, for comparison: every logit sorted (descending, ties to
 * the lower id), the first top_k kept (0: all), probabilities over the kept ones in sorted
 * order, top-p, min-p, then the draw from the same random stream as sampler_init's. The
 * sampler must give the same token (it only avoids sorting everything). */
struct ref_cand {
    int32_t id;
    float v;
};

static int ref_cmp(const void *a, const void *b)
{
    const struct ref_cand *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : 1;
}

static int32_t ref_sample(const struct sampler_config *c, struct rng *rr, const float *logits,
                          int nv, struct ref_cand *cand)
{
    for (int i = 0; i < nv; i++)
        cand[i] = (struct ref_cand){i, logits[i]};
    qsort(cand, (size_t)nv, sizeof(*cand), ref_cmp);
    int n = c->top_k > 0 && c->top_k < nv ? c->top_k : nv;
    double sum = 0, cum = 0;
    float mx = cand[0].v;
    if (c->top_k > 0 && c->top_k < nv) {
        for (int i = 0; i < n; i++) {
            cand[i].v = expf((cand[i].v - mx) / c->temperature);
            sum += cand[i].v;
        }
        for (int i = 0; i < n; i++)
            cand[i].v = (float)(cand[i].v / sum);
    } else { /* top-k off: the sum over the vocabulary in id order */
        for (int i = 0; i < nv; i++)
            sum += expf((logits[i] - mx) / c->temperature);
        for (int i = 0; i < n; i++)
            cand[i].v = (float)(expf((cand[i].v - mx) / c->temperature) / sum);
    }
    if (c->top_p < 1.0f) {
        for (int i = 0; i < n; i++) {
            cum += cand[i].v;
            if (cum >= c->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (c->min_p > 0.0f) {
        int keep = 1;
        while (keep < n && cand[keep].v >= c->min_p * cand[0].v)
            keep++;
        n = keep;
    }
    sum = 0;
    for (int i = 0; i < n; i++)
        sum += cand[i].v;
    double r = rng_f32(rr) * sum;
    cum = 0;
    for (int i = 0; i < n; i++) {
        cum += cand[i].v;
        if (r < cum)
            return cand[i].id;
    }
    return cand[n - 1].id;
}

/* rank of token t among logits (0 = largest) */
static int rank_of(const float *l, int32_t t)
{
    int r = 0;
    for (int i = 0; i < NV; i++)
        r += l[i] > l[t];
    return r;
}

int main(void)
{
    struct rng r;
    float logits[NV];
    rng_seed(&r, test_seed("test_sampler"), 1);

    for (int trial = 0; trial < 20; trial++) {
        struct sampler_config c = sampler_config_default();
        fill_logits(&r, logits, NV);
        int32_t best = sampler_argmax(logits, NV);
        CHECK(rank_of(logits, best) == 0, "argmax");
        c.temperature = 0;
        CHECK(sample_once(c, logits) == best, "greedy picks the argmax");
        c = sampler_config_default();
        c.top_k = 1;
        c.seed = rng_u64(&r);
        CHECK(sample_once(c, logits) == best, "top-k 1 picks the argmax");
        c.top_k = 5;
        c.top_p = 1;
        c.min_p = 0;
        for (int i = 0; i < 50; i++) {
            c.seed = rng_u64(&r);
            CHECK(rank_of(logits, sample_once(c, logits)) < 5, "top-k 5 stays in the top 5");
        }
        /* same seed, same token */
        c = sampler_config_default();
        c.seed = 1234;
        CHECK(sample_once(c, logits) == sample_once(c, logits), "seeded determinism");
    }

    /* top-p: with probabilities 0.5, 0.3, 0.2 and top_p 0.7, only the first two can appear */
    {
        float l[NV];
        for (int i = 0; i < NV; i++)
            l[i] = -1e9f;
        l[10] = logf(0.5f);
        l[20] = logf(0.3f);
        l[30] = logf(0.2f);
        struct sampler_config c = {.temperature = 1,
                                   .top_k = 0,
                                   .top_p = 0.7f,
                                   .min_p = 0,
                                   .repeat_penalty = 1,
                                   .repeat_last_n = 0};
        int counts[3] = {0};
        for (int i = 0; i < 2000; i++) {
            c.seed = rng_u64(&r);
            int32_t t = sample_once(c, l);
            CHECK(t == 10 || t == 20, "top-p 0.7 kept token %d", t);
            counts[t == 10 ? 0 : 1]++;
        }
        /* renormalised: 0.625 / 0.375 */
        CHECK(fabs(counts[0] / 2000.0 - 0.625) < 0.05, "top-p frequencies %d %d", counts[0],
              counts[1]);
        /* min-p 0.5 keeps tokens with p >= 0.25: only 10 and 20 */
        c.top_p = 1;
        c.min_p = 0.5f;
        for (int i = 0; i < 500; i++) {
            c.seed = rng_u64(&r);
            int32_t t = sample_once(c, l);
            CHECK(t == 10 || t == 20, "min-p kept token %d", t);
        }
        /* plain temperature 1: frequencies follow the softmax */
        c.min_p = 0;
        int n30 = 0;
        for (int i = 0; i < 4000; i++) {
            c.seed = rng_u64(&r);
            n30 += sample_once(c, l) == 30;
        }
        CHECK(fabs(n30 / 4000.0 - 0.2) < 0.03, "p(30) = %.3f, expected 0.2", n30 / 4000.0);
    }

    /* repetition penalty: a penalised argmax loses to a close second */
    {
        float l[NV];
        struct sampler s;
        struct sampler_config c = {.temperature = 0, .repeat_penalty = 2.0f, .repeat_last_n = 4};
        for (int i = 0; i < NV; i++)
            l[i] = 0;
        l[7] = 4.0f;
        l[8] = 3.0f;
        sampler_init(&s, &c, NV);
        sampler_accept(&s, 7);
        CHECK(sampler_sample(&s, l) == 8, "penalty moves the choice");
        sampler_free(&s);
    }
    /* the sampler against the plain chain, on peaked and flat logits over a large vocabulary
     * (top-k on and off; top-p and min-p in every combination): the same tokens. The last
     * spread rounds logits to halves, with every other zero negative: long runs of ties and
     * signed zeros for the full sort, which must keep the lower id first and -0 equal to +0. */
    {
        enum { BIG = 20000 };
        static float l[BIG], w[BIG];
        static struct ref_cand cand[BIG];
        static const struct sampler_config cs[] = {
            {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f},
            {.temperature = 0.8f, .top_k = 0, .top_p = 0.95f, .min_p = 0.05f},
            {.temperature = 1.0f, .top_k = 0, .top_p = 0.9f},
            {.temperature = 0.7f, .top_k = 0, .top_p = 1.0f, .min_p = 0.1f},
            {.temperature = 1.2f, .top_k = 0, .top_p = 1.0f},
            {.temperature = 0.9f, .top_k = 3000, .top_p = 0.5f},
        };
        static const float spread[] = {0.5f, 3.0f, 8.0f, 2.0f};
        int same = 0, total = 0;
        rng_seed(&r, test_seed("test_sampler") + 1, 9);
        for (size_t ci = 0; ci < sizeof(cs) / sizeof(cs[0]); ci++) {
            for (int si = 0; si < 4; si++) {
                struct sampler s;
                struct rng rr;
                struct sampler_config c = cs[ci];
                c.repeat_penalty = 1.0f;
                c.seed = 1000 + ci * 4 + si;
                sampler_init(&s, &c, BIG);
                rng_seed(&rr, c.seed, 0x5a3d1e);
                for (int step = 0; step < 6; step++) {
                    for (int i = 0; i < BIG; i++) {
                        float v = spread[si] * rng_normal(&r);
                        if (si == 3)
                            v = roundf(2.0f * v) / 2.0f == 0.0f && (i & 1)
                                    ? -0.0f
                                    : roundf(2.0f * v) / 2.0f;
                        l[i] = w[i] = v;
                    }
                    int32_t got = sampler_sample(&s, w), want = ref_sample(&c, &rr, l, BIG, cand);
                    same += got == want;
                    total++;
                }
                sampler_free(&s);
            }
        }
        /* all logits zero, every other one negative: with top-k and top-p off the draw walks
         * the whole sorted vocabulary, so it lands on the id the plain chain's order gives */
        for (int seed = 0; seed < 10; seed++) {
            struct sampler s;
            struct rng rr;
            struct sampler_config c = {
                .temperature = 1.0f, .top_p = 1.0f, .repeat_penalty = 1.0f, .seed = 77 + seed};
            sampler_init(&s, &c, BIG);
            rng_seed(&rr, c.seed, 0x5a3d1e);
            for (int i = 0; i < BIG; i++)
                l[i] = w[i] = (i & 1) ? -0.0f : 0.0f;
            int32_t got = sampler_sample(&s, w), want = ref_sample(&c, &rr, l, BIG, cand);
            same += got == want;
            total++;
            sampler_free(&s);
        }
        printf("sampler vs sorting everything: %d of %d tokens equal\n", same, total);
        CHECK(same == total, "the sampler differs from the plain chain (%d of %d)", same, total);
    }
    return test_finish("test_sampler");
}
