/* sampler: greedy, top-k, top-p, min-p, temperature and repetition penalty on fresh random
 * logits, against direct computations; seeded determinism; empirical frequencies. */
#include <math.h>
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
        struct sampler_config c = {.temperature = 1, .top_k = 0, .top_p = 0.7f, .min_p = 0,
                                   .repeat_penalty = 1, .repeat_last_n = 0};
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
    return test_finish("test_sampler");
}
