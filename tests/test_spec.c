/* spec: speculative decoding with prompt-lookup drafts (strata_generate's draft_max).
 *  1. generate_ngram_draft finds the latest earlier occurrence of the longest suffix (3..2),
 *     and generate_ngram_source (strata_ngram_source) the index its drafts start at;
 *  2. sampler_pick_draft's rule leaves the distribution unchanged: over a 2000 x 2000 grid of
 *     its two uniforms each token's share equals its probability within 1 / 2000 (a
 *     deterministic quadrature, not a statistical test);
 *  3. greedy generation with drafts gives the same ids as without, on tiny f32 and q8_0 models
 *     and the shipped default model, and accepts drafts where the text repeats; sampled
 *     generation with drafts is reproducible for a seed; the budget (n_predict) and the
 *     context end it as they end plain generation; bad draft settings are refused;
 *  4. sampled output keeps its distribution end to end: 4000 seeded generations of 3 tokens on
 *     the tiny f32 model (temperature 0.7, top-k 6), plain and with two drafts a pass (the
 *     successor the plain runs saw most often: kept and rejected both happen), give the same
 *     distribution of the 2nd and the 3rd token by a chi-square test of homogeneity whose
 *     false-failure rate is below 1e-6 (5e-7 each, Wilson-Hilferty quantiles); the seeds are
 *     fixed, so the outcome is too;
 *  5. a draft model (strata_drafter): with the model itself as its draft every draft is
 *     accepted; with the model itself but its second-to-last draft of each pass changed (so
 *     the drafter has evaluated a token the target then rejects, and must roll back) the
 *     drafts before it are kept and the rest rejected; with another tiny model of the same
 *     vocabulary they are rejected; greedy output equals plain decoding's with each; sampled
 *     generations in a row on one drafter stay reproducible; a draft whose vocabulary differs
 *     is refused, naming the difference; greedy under a repetition penalty of 1.5, the model
 *     as its own draft with the penalty set (strata_drafter_set_penalty) has every draft kept,
 *     and the output is plain decoding's with and without it;
 *  6. the model's MTP block (strata_mtp, tiny qwen3next and qwen35moe with a block, f32):
 *     greedy generation with its drafts gives plain decoding's ids, in one call and in a second
 *     call on the same stream; with its drafts replaced by plain decoding's tokens (the last
 *     of every third pass spoiled) drafts are kept and rejected and the ids are still plain
 *     decoding's, and afterwards the block's cache is that of a stream that evaluated the same
 *     ids in one prefill (the same drafts, its logits within 1e-4); a block opened on a stream
 *     that already holds tokens drafts as one opened before them; sampled generation with its
 *     drafts is reproducible for a seed. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "gen.h"
#include "generate.h"
#include "mtp.h"
#include "quant_mix.h"
#include "sampler.h"
#include "strata.h"
#include "strata_priv.h"
#include "stream.h"
#include "testutil.h"

static const char *NAME = "test_spec";

/* Under AddressSanitizer (CI's second pass, 10-20 times slower) the same checks on less work:
 * the distribution test's bound holds for any sample count, only its power drops. */
#if defined(__SANITIZE_ADDRESS__)
#define SPEC_SAMPLES 1000
#define SPEC_PROMPTS 1
#else
#define SPEC_SAMPLES 4000
#define SPEC_PROMPTS 3
#endif
static char tmpdir[] = "/tmp/strata-test-spec-XXXXXX";

static void test_ngram(void)
{
    int32_t out[8];
    /* ... 5 6 7 9 ... 5 6 7 : the latest "5 6 7" is followed by 9 1 */
    const int32_t h[] = {1, 5, 6, 7, 8, 2, 5, 6, 7, 9, 1, 5, 6, 7};
    int n = generate_ngram_draft(h, 14, 3, 4, out);
    CHECK(n == 4 && out[0] == 9 && out[1] == 1 && out[2] == 5 && out[3] == 6,
          "3-gram: %d drafts, first %d", n, n ? out[0] : -1);
    /* no earlier "3 4 7": falls back to "4 7", whose latest occurrence is at the start */
    const int32_t h2[] = {4, 7, 2, 2, 3, 4, 7};
    n = generate_ngram_draft(h2, 7, 3, 8, out);
    CHECK(n == 5 && out[0] == 2 && out[4] == 7, "2-gram fallback: %d drafts", n);
    /* a single token never drafts (the shortest suffix is 2) */
    const int32_t h3[] = {1, 2, 3, 1};
    CHECK(generate_ngram_draft(h3, 4, 3, 8, out) == 0, "1-gram drafted");
    /* the drafts stop at the end of the history */
    const int32_t h4[] = {8, 9, 8, 9};
    n = generate_ngram_draft(h4, 4, 3, 8, out);
    CHECK(n == 2 && out[0] == 8 && out[1] == 9, "short history: %d drafts", n);
    /* the source index: where the drafts start (the lookahead's rows repeat src - 1 ..) */
    CHECK(generate_ngram_source(h, 14, 3) == 9 && h[9 - 1] == 7, "3-gram source %d, want 9",
          generate_ngram_source(h, 14, 3));
    CHECK(generate_ngram_source(h2, 7, 3) == 2, "2-gram source %d, want 2",
          generate_ngram_source(h2, 7, 3));
    CHECK(generate_ngram_source(h3, 4, 3) == -1, "1-gram source %d, want -1",
          generate_ngram_source(h3, 4, 3));
    CHECK(strata_ngram_source(h4, 4, 3) == 2, "short history source %d, want 2",
          strata_ngram_source(h4, 4, 3));
}

static void test_rule(void)
{
    const int32_t ids[] = {3, 11, 5, 7};
    const float w[] = {0.5f, 0.25f, 0.15f, 0.10f}; /* weights need not be normalized */
    const int32_t drafts[] = {3, 5, 7, 42};        /* 42: a draft outside the candidates */
    const int G = 2000;
    for (int di = 0; di < 4; di++) {
        double count[4] = {0}, acc = 0;
        for (int a = 0; a < G; a++)
            for (int b = 0; b < G; b++) {
                bool accepted;
                int32_t t = sampler_pick_draft(ids, w, 4, drafts[di], (a + 0.5) / G,
                                               (b + 0.5) / G, &accepted);
                acc += accepted;
                for (int i = 0; i < 4; i++)
                    count[i] += t == ids[i];
            }
        double worst = 0;
        for (int i = 0; i < 4; i++) {
            double d = fabs(count[i] / ((double)G * G) - w[i] / 1.0);
            worst = d > worst ? d : worst;
        }
        double want_acc = 0;
        for (int i = 0; i < 4; i++)
            want_acc += ids[i] == drafts[di] ? w[i] : 0;
        printf("rule: draft %d accepted %.4f (p %.4f), worst share error %.2g\n", drafts[di],
               acc / ((double)G * G), want_acc, worst);
        CHECK(worst <= 1.0 / G, "draft %d: a token's share is off by %g", drafts[di], worst);
        CHECK(fabs(acc / ((double)G * G) - want_acc) <= 1.0 / G, "draft %d: acceptance %g",
              drafts[di], acc / ((double)G * G));
    }
}

struct gen_out {
    int32_t ids[256];
    struct strata_generate_stats st;
    int rc;
};

/* n_predict tokens after prompt on a fresh stream of n_ctx positions, drafted by fn (NULL:
 * prompt lookup) when draft_max > 0. */
static float g_penalty = 1.0f; /* run_with's repetition penalty */

static void run_with(struct strata *s, const int32_t *prompt, int n_prompt, int n_predict,
                     int n_ctx, float temp, int draft_max,
                     int (*fn)(void *, const int32_t *, int, int, int32_t *), void *fn_ctx,
                     struct gen_out *o)
{
    struct strata_stream *st = NULL;
    struct strata_generate_params p;
    strata_generate_params_init(&p);
    p.n_predict = n_predict;
    p.sampling.temperature = temp;
    p.sampling.repeat_penalty = g_penalty;
    p.sampling.seed = 1234;
    p.draft_max = draft_max;
    p.draft_fn = fn;
    p.draft_ctx = fn_ctx;
    memset(o, 0, sizeof(*o));
    o->rc = strata_stream_open(s, n_ctx, &st);
    if (!o->rc)
        o->rc = strata_generate(st, prompt, n_prompt, &p, NULL, NULL, o->ids, &o->st);
    strata_stream_close(st);
}

static void run(struct strata *s, const int32_t *prompt, int n_prompt, int n_predict, int n_ctx,
                float temp, int draft_max, struct gen_out *o)
{
    run_with(s, prompt, n_prompt, n_predict, n_ctx, temp, draft_max, NULL, NULL, o);
}

static struct strata *open_cpu(const char *path);

static void check_model(const char *label, const char *path, bool want_accepts)
{
    struct strata *s = open_cpu(path);
    if (!s)
        return;
    static const char *const texts[] = {"def fibonacci(n):", "import os\nimport sys\n",
                                        "class Stack:\n    def push(self, x):"};
    struct strata_model_info mi;
    strata_model_info(s, &mi);
    int accepted = 0;
    for (int t = 0; t < SPEC_PROMPTS; t++) {
        int32_t prompt[64];
        int n = 0;
        if (mi.has_tokenizer) {
            n = strata_tokenize(s, texts[t], strlen(texts[t]), STRATA_TOKENIZE_ADD_BOS, prompt, 64);
        } else {
            for (; n < 6; n++)
                prompt[n] = (int32_t)((7 * t + 3 * n + 1) % (int)mi.n_vocab);
        }
        struct gen_out a, b, c, d;
        run(s, prompt, n, 64, 512, 0.0f, 0, &a);
        run(s, prompt, n, 64, 512, 0.0f, 8, &b);
        int same = a.st.n_gen == b.st.n_gen && !memcmp(a.ids, b.ids, sizeof(int32_t) * a.st.n_gen);
        printf("%s, prompt %d: greedy %d tokens, with drafts %d (%s): %d passes, %d drafted, %d "
               "accepted\n",
               label, t, a.st.n_gen, b.st.n_gen, same ? "the same ids" : "DIFFERENT",
               b.st.n_verify, b.st.n_drafted, b.st.n_accepted);
        CHECK(!a.rc && !b.rc && same, "%s prompt %d: greedy with drafts differs (rc %d %d)",
              label, t, a.rc, b.rc);
        accepted += b.st.n_accepted;
        /* sampled: reproducible for a seed, budget respected */
        run(s, prompt, n, 32, 512, 0.8f, 8, &c);
        run(s, prompt, n, 32, 512, 0.8f, 8, &d);
        CHECK(!c.rc && !d.rc && c.st.n_gen == d.st.n_gen &&
                  !memcmp(c.ids, d.ids, sizeof(int32_t) * c.st.n_gen) && c.st.n_gen <= 32,
              "%s prompt %d: sampled generation with drafts not reproducible", label, t);
        /* the budget and the context end generation as without drafts */
        for (int np = 1; np <= 3; np++) {
            run(s, prompt, n, np, 512, 0.0f, 8, &b);
            CHECK(!b.rc && b.st.n_gen <= np && !memcmp(a.ids, b.ids, sizeof(int32_t) * b.st.n_gen),
                  "%s: n_predict %d with drafts: rc %d, %d tokens", label, np, b.rc, b.st.n_gen);
        }
        run(s, prompt, n, 200, n + 40, 0.0f, 0, &a);
        run(s, prompt, n, 200, n + 40, 0.0f, 8, &b);
        CHECK(!a.rc && !b.rc && a.st.n_gen == b.st.n_gen && a.st.stopped_ctx == b.st.stopped_ctx &&
                  !memcmp(a.ids, b.ids, sizeof(int32_t) * a.st.n_gen),
              "%s: a full context ends generation differently with drafts (%d / %d tokens)",
              label, a.st.n_gen, b.st.n_gen);
    }
    if (want_accepts)
        CHECK(accepted > 0, "%s: no draft was ever accepted", label);
    struct strata_stream *st = NULL;
    struct strata_generate_params p;
    strata_generate_params_init(&p);
    p.draft_max = 65;
    int32_t one = 1;
    CHECK(!strata_stream_open(s, 64, &st) &&
              strata_generate(st, &one, 1, &p, NULL, NULL, NULL, NULL) == -EINVAL,
          "draft_max 65 was not refused");
    p.draft_max = 4;
    p.draft_ngram = 1;
    CHECK(strata_generate(st, &one, 1, &p, NULL, NULL, NULL, NULL) == -EINVAL,
          "draft_ngram 1 was not refused");
    strata_stream_close(st);
    strata_close(s);
}

/* Draft source for the distribution test: after token x, the token that most often followed
 * x in the plain generations (ctx: the table, -1 where none did); two drafts at most. */
static int table_drafts(void *ctx, const int32_t *hist, int n_hist, int k, int32_t *out)
{
    const int32_t *next = ctx;
    int n = 0;
    int32_t x = hist[n_hist - 1];
    while (n < k && n < 2 && next[x] >= 0)
        x = out[n++] = next[x];
    return n;
}

/* Chi-square homogeneity of two histograms (bins with fewer than 10 together lumped); *dof
 * receives the degrees of freedom. */
static double chi2_two(const int *a, const int *b, int n, double na, double nb, int *dof)
{
    double stat = 0, oa = 0, ob = 0;
    int bins = 0;
    for (int i = 0; i <= n; i++) {
        double x = i < n ? a[i] : oa, y = i < n ? b[i] : ob;
        if (i < n && x + y < 10) {
            oa += x, ob += y;
            continue;
        }
        if (x + y == 0)
            continue;
        double ea = (x + y) * na / (na + nb), eb = (x + y) * nb / (na + nb);
        stat += (x - ea) * (x - ea) / ea + (y - eb) * (y - eb) / eb;
        bins++;
    }
    *dof = bins - 1;
    return stat;
}

static void test_distribution(const char *path)
{
    struct strata_config cfg;
    struct strata *s = NULL;
    struct strata_stream *ss = NULL;
    strata_config_init(&cfg);
    cfg.model_path = path;
    cfg.device = STRATA_DEVICE_CPU;
    cfg.n_threads = 1;
    if (strata_open(&cfg, &s) || strata_stream_open(s, 64, &ss)) {
        CHECK(0, "distribution: open: %s", strata_error());
        strata_close(s);
        return;
    }
    struct strata_model_info mi;
    strata_model_info(s, &mi);
    const int nv = (int)mi.n_vocab, N = SPEC_SAMPLES;
    int *h[2][2];
    for (int m = 0; m < 2; m++)
        for (int p = 0; p < 2; p++)
            h[m][p] = calloc((size_t)nv, sizeof(int));
    const int32_t prompt[4] = {5, 17, 5, 17};
    int verify = 0, drafted = 0, accepted = 0, rc = 0;
    int *pairs = calloc((size_t)nv * (size_t)nv, sizeof(int));
    int32_t *next = malloc(sizeof(int32_t) * (size_t)nv);
    for (int m = 0; m < 2 && !rc; m++)
        for (int i = 0; i < N && !rc; i++) {
            struct generate_config gc = {.n_predict = 3, .ignore_eos = true};
            gc.sampling = sampler_config_default();
            gc.sampling.temperature = 0.7f;
            gc.sampling.top_k = 6;
            gc.sampling.top_p = 1.0f;
            gc.sampling.min_p = 0.0f;
            gc.sampling.seed = (uint64_t)i + 1;
            if (m) {
                gc.draft_max = 2;
                gc.draft_ngram = 2;
                gc.draft_fn = table_drafts;
                gc.draft_ctx = next;
            }
            int32_t out[3];
            struct generate_stats gs;
            stream_truncate(ss->st, 0);
            rc = generate_run(ss->st, NULL, prompt, 4, &gc, NULL, NULL, out, &gs);
            if (!rc && gs.n_gen == 3) {
                h[m][0][out[1]]++;
                h[m][1][out[2]]++;
                if (!m) {
                    pairs[(size_t)prompt[3] * nv + out[0]]++;
                    pairs[(size_t)out[0] * nv + out[1]]++;
                    pairs[(size_t)out[1] * nv + out[2]]++;
                }
            }
            if (!m && i == N - 1) /* the drafts' table, from the plain runs */
                for (int x = 0; x < nv; x++) {
                    int best = -1;
                    for (int y = 0; y < nv; y++)
                        if (pairs[(size_t)x * nv + y] &&
                            (best < 0 || pairs[(size_t)x * nv + y] > pairs[(size_t)x * nv + best]))
                            best = y;
                    next[x] = best;
                }
            verify += gs.n_verify, drafted += gs.n_drafted, accepted += gs.n_accepted;
        }
    CHECK(rc == 0, "distribution: generation failed: %d", rc);
    for (int p = 0; p < 2; p++) {
        int dof;
        double stat = chi2_two(h[0][p], h[1][p], nv, N, N, &dof);
        /* the chi-square quantile at 1 - 5e-7 (z = 4.8916), Wilson-Hilferty */
        double q = 2.0 / (9.0 * dof), crit = dof * pow(1 - q + 4.8916 * sqrt(q), 3);
        printf("distribution: token %d, plain against drafts: chi2 %.1f on %d dof (bound %.1f); "
               "%d passes, %d drafted, %d accepted\n",
               p + 2, stat, dof, crit, verify, drafted, accepted);
        CHECK(dof >= 1 && stat <= crit, "token %d: chi2 %.1f > %.1f on %d dof", p + 2, stat, crit,
              dof);
    }
    CHECK(accepted > 0 && accepted < drafted, "distribution: %d of %d drafts accepted (want some "
                                              "of each)",
          accepted, drafted);
    for (int m = 0; m < 2; m++)
        for (int p = 0; p < 2; p++)
            free(h[m][p]);
    free(pairs);
    free(next);
    strata_stream_close(ss);
    strata_close(s);
}

static struct strata *open_cpu(const char *path)
{
    struct strata_config cfg;
    struct strata *s = NULL;
    strata_config_init(&cfg);
    cfg.model_path = path;
    cfg.device = STRATA_DEVICE_CPU;
    cfg.n_threads = 2;
    CHECK(strata_open(&cfg, &s) == 0, "open %s: %s", path, strata_error());
    return s;
}

/* Greedy (temp 0) or sampled generation of n tokens with drafter d (NULL: plain). */
static void run_draft(struct strata *s, struct strata_drafter *d, const int32_t *prompt, int n,
                      int n_predict, float temp, struct gen_out *o)
{
    run_with(s, prompt, n, n_predict, 256, temp, d ? 6 : 0, d ? strata_drafter_draft : NULL, d, o);
}

/* The drafter's drafts with the second-to-last one changed (k >= 3). */
static int spoiled_drafts(void *ctx, const int32_t *hist, int n_hist, int k, int32_t *out)
{
    int n = strata_drafter_draft(ctx, hist, n_hist, k, out);
    if (n >= 3)
        out[n - 2] = (out[n - 2] + 1) % 1024;
    return n;
}

/* Drafts that are never kept: the plain greedy continuation (g_wrong_plain, indexed by the
 * position after the prompt) plus one. */
static const int32_t *g_wrong_plain;
static int g_wrong_prompt;

static int wrong_drafts(void *ctx, const int32_t *hist, int n_hist, int k, int32_t *out)
{
    (void)ctx, (void)hist;
    int n = 0;
    for (int at = n_hist - g_wrong_prompt; n < k && at >= 0 && at < 64; n++, at++)
        out[n] = (g_wrong_plain[at] + 1) % 1024;
    return n;
}

/* The pace of drafting: 4 passes in a row that keep nothing pause drafting for 4 steps, each
 * probe pass that keeps nothing doubles the pause up to 64, a kept draft ends it. */
static void test_pace(void)
{
    struct strata_draft_pace p;
    strata_draft_pace_init(&p);
    int k0 = strata_draft_pace_len(&p, 8);
    CHECK(k0 == strata_draft_len(0.5, 8), "first length %d", k0);
    for (int i = 0; i < 3; i++) {
        strata_draft_pace_update(&p, 1, 0);
        CHECK(strata_draft_pace_len(&p, 8) > 0, "paused after %d misses", i + 1);
    }
    int want[] = {4, 8, 16, 32, 64, 64}, bad = 0;
    for (int round = 0; round < 6; round++) {
        strata_draft_pace_update(&p, 1, 0); /* the 4th miss, then each probe's */
        int paused = 0;
        while (strata_draft_pace_len(&p, 8) == 0 && paused < 1000)
            paused++;
        bad += paused != want[round];
    }
    CHECK(bad == 0 && p.n_paused == 4 + 8 + 16 + 32 + 64 + 64, "pauses: %d wrong, %d steps", bad,
          p.n_paused);
    strata_draft_pace_update(&p, 2, 1); /* a kept draft: no pause, the miss run starts over */
    int k = strata_draft_pace_len(&p, 8);
    for (int i = 0; i < 3; i++)
        strata_draft_pace_update(&p, 1, 0);
    CHECK(k > 0 && strata_draft_pace_len(&p, 8) > 0, "a kept draft did not end the pause");
    strata_draft_pace_update(&p, 1, 0);
    CHECK(strata_draft_pace_len(&p, 8) == 0 && p.pause == 3, "the pause did not restart at 4");
    printf("draft pace: pauses of 4, 8, 16, 32, 64 and 64 steps after passes keeping none; a "
           "kept draft ends them\n");
}

static void test_drafter(const char *target, const char *other, const char *foreign)
{
    struct strata *t = open_cpu(target), *self = open_cpu(target), *o = open_cpu(other);
    struct strata *q = open_cpu(target);
    struct strata_drafter *ds = NULL, *dother = NULL, *dq = NULL;
    const int32_t prompt[6] = {3, 17, 40, 5, 99, 7};
    struct gen_out plain, a, b, c, d, e;
    if (!t || !self || !o || !q)
        goto out;
    CHECK(strata_drafter_open(self, t, 256, &ds) == 0 &&
              strata_drafter_open(o, t, 256, &dother) == 0 &&
              strata_drafter_open(q, t, 256, &dq) == 0,
          "drafter: %s", strata_error());
    if (!ds || !dother || !dq)
        goto out;
    run_draft(t, NULL, prompt, 6, 64, 0.0f, &plain);
    run_draft(t, ds, prompt, 6, 64, 0.0f, &a);
    run_draft(t, dother, prompt, 6, 64, 0.0f, &b);
    run_with(t, prompt, 6, 64, 256, 0.0f, 6, spoiled_drafts, dq, &e);
    CHECK(!plain.rc && !a.rc && !b.rc && !e.rc && a.st.n_gen == plain.st.n_gen &&
              b.st.n_gen == plain.st.n_gen && e.st.n_gen == plain.st.n_gen &&
              !memcmp(a.ids, plain.ids, sizeof(int32_t) * plain.st.n_gen) &&
              !memcmp(b.ids, plain.ids, sizeof(int32_t) * plain.st.n_gen) &&
              !memcmp(e.ids, plain.ids, sizeof(int32_t) * plain.st.n_gen),
          "greedy with a draft model differs from plain decoding");
    CHECK(a.st.n_drafted > 0 && a.st.n_accepted == a.st.n_drafted,
          "the model as its own draft: %d of %d accepted", a.st.n_accepted, a.st.n_drafted);
    CHECK(e.st.n_accepted > 0 && e.st.n_accepted < e.st.n_drafted,
          "spoiled drafts: %d of %d accepted (want some of each)", e.st.n_accepted,
          e.st.n_drafted);
    CHECK(b.st.n_accepted < b.st.n_drafted, "another model as draft: %d of %d accepted",
          b.st.n_accepted, b.st.n_drafted);
    /* drafts never kept: drafting pauses (a pass every few steps, then every 64), the output
     * stays plain decoding's */
    g_wrong_plain = plain.ids, g_wrong_prompt = 6;
    run_with(t, prompt, 6, 64, 256, 0.0f, 4, wrong_drafts, NULL, &d);
    CHECK(!d.rc && d.st.n_gen == plain.st.n_gen &&
              !memcmp(d.ids, plain.ids, sizeof(int32_t) * plain.st.n_gen),
          "greedy with drafts never kept differs from plain decoding");
    CHECK(d.st.n_accepted == 0 && d.st.n_verify >= 4 && d.st.n_verify <= 10 &&
              d.st.n_paused >= 64 - 1 - 10,
          "drafts never kept: %d passes, %d accepted, %d steps paused", d.st.n_verify,
          d.st.n_accepted, d.st.n_paused);
    printf("drafts never kept: %d verify passes in 64 tokens, %d steps paused\n", d.st.n_verify,
           d.st.n_paused);
    printf("draft model: itself %d/%d accepted, spoiled %d/%d, another tiny model %d/%d; "
           "greedy ids as plain\n",
           a.st.n_accepted, a.st.n_drafted, e.st.n_accepted, e.st.n_drafted, b.st.n_accepted,
           b.st.n_drafted);
    /* greedy under a repetition penalty: the drafter that applies it has every draft kept,
     * one that does not only some (printed); both leave the output plain decoding's */
    g_penalty = 1.5f;
    struct gen_out pp, pa, pb;
    run_draft(t, NULL, prompt, 6, 64, 0.0f, &pp);
    run_draft(t, ds, prompt, 6, 64, 0.0f, &pb);
    CHECK(strata_drafter_set_penalty(ds, 1.5f, 64) == 0, "set_penalty: %s", strata_error());
    run_draft(t, ds, prompt, 6, 64, 0.0f, &pa);
    CHECK(strata_drafter_set_penalty(ds, 1.0f, 64) == 0 &&
              strata_drafter_set_penalty(ds, 0.0f, 64) == -EINVAL,
          "set_penalty: off, and 0 refused");
    g_penalty = 1.0f;
    CHECK(!pp.rc && !pa.rc && !pb.rc && pa.st.n_gen == pp.st.n_gen && pb.st.n_gen == pp.st.n_gen &&
              !memcmp(pa.ids, pp.ids, sizeof(int32_t) * pp.st.n_gen) &&
              !memcmp(pb.ids, pp.ids, sizeof(int32_t) * pp.st.n_gen),
          "greedy under a penalty with a draft model differs from plain decoding");
    CHECK(pa.st.n_drafted > 0 && pa.st.n_accepted == pa.st.n_drafted,
          "the model as its own draft under the same penalty: %d of %d accepted", pa.st.n_accepted,
          pa.st.n_drafted);
    printf("penalty 1.5: itself with the penalty %d/%d accepted, without it %d/%d\n",
           pa.st.n_accepted, pa.st.n_drafted, pb.st.n_accepted, pb.st.n_drafted);
    /* the same drafter again after other histories: sampled runs reproduce */
    run_draft(t, dother, prompt, 6, 40, 0.8f, &c);
    run_draft(t, dother, prompt + 1, 5, 40, 0.8f, &d);
    run_draft(t, dother, prompt, 6, 40, 0.8f, &d);
    CHECK(!c.rc && !d.rc && c.st.n_gen == d.st.n_gen &&
              !memcmp(c.ids, d.ids, sizeof(int32_t) * c.st.n_gen),
          "sampled generation with a reused drafter is not reproducible");
    long long n_eval = 0;
    double secs = 0;
    strata_drafter_stats(dother, &n_eval, &secs);
    CHECK(n_eval > 0 && secs >= 0, "drafter stats %lld %g", n_eval, secs);
    if (foreign) {
        struct strata *f = open_cpu(foreign);
        struct strata_drafter *df = NULL;
        CHECK(f && strata_drafter_open(f, t, 256, &df) == -EINVAL &&
                  strstr(strata_error(), "vocabulary"),
              "a draft with another vocabulary was not refused: %s", strata_error());
        printf("  refused: %s\n", strata_error());
        strata_drafter_close(df);
        strata_close(f);
    }
out:
    strata_drafter_close(ds);
    strata_drafter_close(dother);
    strata_drafter_close(dq);
    strata_close(t);
    strata_close(self);
    strata_close(o);
    strata_close(q);
}

/* ---- the MTP block --------------------------------------------------------------------------- */

/* Generation with the MTP block's drafts (draft_max 0: plain) on stream st, which the block
 * follows when mtp is not NULL; fn replaces strata_mtp_draft when given. */
static void mtp_gen(struct strata_stream *st, struct strata_mtp *mtp, const int32_t *prompt, int n,
                    int n_predict, float temp, int draft_max,
                    int (*fn)(void *, const int32_t *, int, int, int32_t *), void *fn_ctx,
                    struct gen_out *o)
{
    struct strata_generate_params p;
    strata_generate_params_init(&p);
    p.n_predict = n_predict;
    p.sampling.temperature = temp;
    p.sampling.seed = 99;
    p.draft_max = draft_max;
    p.draft_fn = fn ? fn : mtp ? strata_mtp_draft : NULL;
    p.draft_ctx = fn ? fn_ctx : mtp;
    memset(o, 0, sizeof(*o));
    o->rc = strata_generate(st, prompt, n, &p, NULL, NULL, o->ids, &o->st);
}

/* The MTP block's drafts, then replaced by the tokens plain decoding generated there; the last
 * of every third pass spoiled. */
struct mtp_forced {
    struct strata_mtp *mtp;
    const int32_t *plain; /* plain decoding's ids after the prompt */
    int n_prompt, n_plain, pass;
};

static int mtp_forced_drafts(void *ctx, const int32_t *hist, int n_hist, int k, int32_t *out)
{
    struct mtp_forced *f = ctx;
    int n = strata_mtp_draft(f->mtp, hist, n_hist, k, out);
    int g = n_hist - f->n_prompt; /* hist ends with plain[g - 1]: the drafts are plain[g..] */
    for (int i = 0; i < n; i++)
        out[i] = g + i < f->n_plain ? f->plain[g + i] : out[i];
    if (n >= 2 && ++f->pass % 3 == 0)
        out[n - 1] = (out[n - 1] + 1) % 1024;
    return n;
}

/* The block's drafts (MTP_CHECK_K) and last logits on stream st after token id. */
#define MTP_CHECK_K 3
static int mtp_peek(struct strata_stream *st, int32_t id, int32_t *d, float *lg)
{
    struct stream *s = st->st;
    int n = mtp_draft(s, id, MTP_CHECK_K, d);
    if (n != MTP_CHECK_K)
        return -1;
    return s->b->ops->read(s->b, lg, s->mtp->logits, s->m->hp.n_vocab);
}

static void test_mtp(const char *arch)
{
    char path[512];
    struct gen_preset pr = *gen_preset_find_arch(arch, "tiny");
    pr.n_nextn = 1;
    pr.arch = arch;
    if (test_gen_model(&pr, QUANT_MIX_F32, 11, tmpdir, arch, path, sizeof(path))) {
        CHECK(0, "gen %s: %s", arch, strata_error());
        return;
    }
    struct strata *s = open_cpu(path);
    struct strata_stream *a = NULL, *b = NULL;
    struct strata_mtp *ma = NULL, *mb = NULL;
    const int32_t prompt[6] = {3, 17, 40, 5, 99, 7};
    struct gen_out plain, plain2, spec, spec2, forced, c, d;
    float *la = NULL, *lb = NULL;
    if (!s)
        goto out;
    const int V = 1024;
    la = test_xmalloc(sizeof(float) * V), lb = test_xmalloc(sizeof(float) * V);
    /* plain, then a second call on the same stream */
    CHECK(strata_stream_open(s, 256, &a) == 0, "stream: %s", strata_error());
    mtp_gen(a, NULL, prompt, 6, 48, 0.0f, 0, NULL, NULL, &plain);
    mtp_gen(a, NULL, prompt + 2, 3, 24, 0.0f, 0, NULL, NULL, &plain2);
    strata_stream_close(a);
    /* with the block's drafts */
    CHECK(strata_stream_open(s, 256, &a) == 0 && strata_mtp_open(a, &ma) == 0, "mtp: %s",
          strata_error());
    if (!ma)
        goto out;
    mtp_gen(a, ma, prompt, 6, 48, 0.0f, 4, NULL, NULL, &spec);
    mtp_gen(a, ma, prompt + 2, 3, 24, 0.0f, 4, NULL, NULL, &spec2);
    CHECK(!plain.rc && !spec.rc && !plain2.rc && !spec2.rc && plain.st.n_gen == spec.st.n_gen &&
              plain2.st.n_gen == spec2.st.n_gen &&
              !memcmp(plain.ids, spec.ids, sizeof(int32_t) * plain.st.n_gen) &&
              !memcmp(plain2.ids, spec2.ids, sizeof(int32_t) * plain2.st.n_gen),
          "%s: greedy with MTP drafts differs from plain decoding (rc %d %d)", arch, spec.rc,
          spec2.rc);
    CHECK(spec.st.n_verify > 0 && spec.st.n_drafted > 0, "%s: no MTP drafts (%d passes)", arch,
          spec.st.n_verify);
    strata_mtp_close(ma);
    ma = NULL;
    strata_stream_close(a);
    /* forced drafts: kept and rejected; then the block's cache against a fresh prefill's */
    CHECK(strata_stream_open(s, 256, &a) == 0 && strata_mtp_open(a, &ma) == 0, "mtp: %s",
          strata_error());
    struct mtp_forced f = {.mtp = ma, .plain = plain.ids, .n_prompt = 6, .n_plain = plain.st.n_gen};
    if (ma)
        mtp_gen(a, ma, prompt, 6, 48, 0.0f, 4, mtp_forced_drafts, &f, &forced);
    CHECK(ma && !forced.rc && forced.st.n_gen == plain.st.n_gen &&
              !memcmp(plain.ids, forced.ids, sizeof(int32_t) * plain.st.n_gen),
          "%s: greedy with forced drafts differs from plain decoding", arch);
    CHECK(forced.st.n_accepted > 0 && forced.st.n_accepted < forced.st.n_drafted,
          "%s: forced drafts: %d of %d kept (want some of each)", arch, forced.st.n_accepted,
          forced.st.n_drafted);
    int32_t hist[128], da[MTP_CHECK_K], db[MTP_CHECK_K];
    int nh = ma ? strata_stream_pos(a) : 0;
    memcpy(hist, prompt, sizeof(prompt));
    memcpy(hist + 6, plain.ids, sizeof(int32_t) * (size_t)(nh - 6));
    int32_t last = plain.ids[nh - 6]; /* generated, not evaluated */
    CHECK(strata_stream_open(s, 256, &b) == 0 && strata_mtp_open(b, &mb) == 0 &&
              strata_eval(b, hist, nh, NULL) == 0,
          "fresh stream: %s", strata_error());
    int ra = ma ? mtp_peek(a, last, da, la) : -1, rb = mb ? mtp_peek(b, last, db, lb) : -1;
    double e = test_norm_rel_err(la, lb, V);
    CHECK(!ra && !rb && !memcmp(da, db, sizeof(da)) && e < 1e-4,
          "%s: the block's cache after generation differs from a prefill's: drafts %d %d %d / "
          "%d %d %d, logits rel err %.3g",
          arch, da[0], da[1], da[2], db[0], db[1], db[2], e);
    /* a block opened on a stream that holds tokens already */
    strata_mtp_close(mb);
    mb = NULL;
    strata_stream_close(b);
    CHECK(strata_stream_open(s, 256, &b) == 0 && strata_eval(b, hist, nh, NULL) == 0 &&
              strata_mtp_open(b, &mb) == 0,
          "a block opened late: %s", strata_error());
    rb = mb ? mtp_peek(b, last, db, lb) : -1;
    double e2 = test_norm_rel_err(la, lb, V);
    CHECK(!rb && !memcmp(da, db, sizeof(da)) && e2 < 1e-4,
          "%s: a block opened on a stream of %d tokens drafts %d %d %d (logits rel err %.3g)", arch,
          nh, db[0], db[1], db[2], e2);
    /* sampled: reproducible */
    strata_stream_truncate(a, 0);
    mtp_gen(a, ma, prompt, 6, 32, 0.8f, 4, NULL, NULL, &c);
    strata_stream_truncate(a, 0);
    mtp_gen(a, ma, prompt, 6, 32, 0.8f, 4, NULL, NULL, &d);
    CHECK(!c.rc && !d.rc && c.st.n_gen == d.st.n_gen &&
              !memcmp(c.ids, d.ids, sizeof(int32_t) * c.st.n_gen),
          "%s: sampled generation with MTP drafts is not reproducible", arch);
    long long rows = 0;
    double secs = 0;
    if (ma)
        strata_mtp_stats(ma, &rows, &secs);
    printf("%s MTP block: greedy ids as plain (%d + %d tokens; %d drafted, %d accepted); forced "
           "drafts %d/%d kept; its cache after generation as a prefill's (logits %.3g, opened "
           "late %.3g); %lld block rows\n",
           arch, spec.st.n_gen, spec2.st.n_gen, spec.st.n_drafted + spec2.st.n_drafted,
           spec.st.n_accepted + spec2.st.n_accepted, forced.st.n_accepted, forced.st.n_drafted, e,
           e2, rows);
out:
    strata_mtp_close(ma);
    strata_mtp_close(mb);
    strata_stream_close(a);
    strata_stream_close(b);
    strata_close(s);
    free(la), free(lb);
    unlink(path);
}

int main(void)
{
    char f32[512], q8[512], path[512];
    test_ngram();
    test_rule();
    test_pace();
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    const struct gen_preset *p = gen_preset_find("tiny");
    if (test_gen_model(p, QUANT_MIX_F32, 7, tmpdir, "tiny", f32, sizeof(f32)) ||
        test_gen_model(p, QUANT_MIX_Q8_0, 7, tmpdir, "tiny", q8, sizeof(q8))) {
        fprintf(stderr, "setup: %s\n", strata_error());
        return 1;
    }
    char other[512];
    test_data_path(path, sizeof(path), "../../models/strata-default.gguf");
    if (test_gen_model(p, QUANT_MIX_F32, 8, tmpdir, "tiny-other", other, sizeof(other))) {
        fprintf(stderr, "setup: %s\n", strata_error());
        return 1;
    }
    test_drafter(f32, other, access(path, R_OK) == 0 ? path : NULL);
    unlink(other);
    test_mtp("qwen3next");
    test_mtp("qwen35moe");
    test_distribution(f32);
    check_model("tiny f32", f32, false);
    check_model("tiny q8_0", q8, false);
    test_data_path(path, sizeof(path), "../../models/strata-default.gguf");
    if (access(path, R_OK) == 0)
        check_model("default model", path, true);
    unlink(f32);
    unlink(q8);
    rmdir(tmpdir);
    return test_finish(NAME);
}
