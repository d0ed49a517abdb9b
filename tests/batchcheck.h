/* The lockstep checks of test_batch (CPU) and test_cuda_batch (every CUDA placement): on one
 * model opened with a given configuration,
 * - four prompts of different lengths are prefilled alone; then 16 steps decode all four in
 *   one forward per step, each row at its own position, teacher-forced with the single-stream
 *   run's greedy tokens. Every row's logits must match the single-stream logits of that step
 *   within struct tolerance (the batched matmuls and the MoE layer's grouped experts sum in
 *   another order than one row alone), and its argmax must equal the single-stream greedy
 *   token on at least agree_pct of the steps;
 * - the result of a stream does not depend on its partners: the same streams stepped in
 *   another order and in a batch of two give each stream the same logits as in the batch of
 *   four, within the same tolerance;
 * - a prompt evaluated in chunks inside the steps of three decoding streams
 *   (strata_batch_eval_chunks) ends with its prefill logits, the others' rows unchanged, within
 *   the same tolerance;
 * - errors: a step over max_streams, a stream twice in a step, an id outside the vocabulary
 *   (-EINVAL), a full stream (-ENOSPC: no stream advanced).
 * Prompts are fixed (ids from a fixed seed). */
#ifndef STRATA_TESTS_BATCHCHECK_H
#define STRATA_TESTS_BATCHCHECK_H

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "strata.h"
#include "testutil.h"

#define N_STREAMS 4
#define N_STEPS 16

/* rel: the largest row error (max |diff| / max |ref|) allowed; agree_pct: the share of steps
 * whose argmax must equal the single-stream greedy token. */
struct tolerance {
    double rel;
    int agree_pct;
};

static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        best = x[i] > x[best] ? i : best;
    return best;
}

static double row_err(const float *a, const float *ref, int n)
{
    double d = 0, m = 1e-30;
    for (int i = 0; i < n; i++) {
        double e = fabs((double)a[i] - ref[i]);
        if (!(e <= d))
            d = isnan(e) ? INFINITY : e;
        m = fabs(ref[i]) > m ? fabs(ref[i]) : m;
    }
    return d / m;
}

struct single {
    float *logits;          /* (N_STREAMS, N_STEPS, n_vocab): step t's next-token logits */
    int32_t tok[N_STREAMS][N_STEPS + 1]; /* tok[i][0]: after the prompt; tok[i][t+1]: after step t */
};

/* base with the model, context and chunk of these checks; 0 or strata_open's -errno. */
static int open_with(const struct strata_config *base, const char *path, struct strata **s)
{
    struct strata_config cfg = *base;
    cfg.model_path = path;
    cfg.n_threads = 2;
    cfg.n_ctx = 64;
    cfg.n_batch = 32;
    return strata_open(&cfg, s);
}

/* The prompts prefilled on fresh streams; *first (N_STREAMS, n_vocab) their last logits. */
static int prefill(struct strata *s, int32_t prompts[N_STREAMS][16], const int *len,
                   struct strata_stream **st, float *first, int nv)
{
    for (int i = 0; i < N_STREAMS; i++) {
        int rc = strata_stream_open(s, 64, &st[i]);
        rc = rc ? rc : strata_eval(st[i], prompts[i], len[i], first + (size_t)i * nv);
        if (rc)
            return rc;
    }
    return 0;
}

/* The checks on path opened with base (device, placement, slots); label names the case. */
static void check_model(const struct strata_config *base, const char *label, const char *path,
                        const struct tolerance *tol)
{
    struct strata *s = NULL;
    struct strata_model_info mi;
    struct rng r;
    int32_t prompts[N_STREAMS][16];
    static const int len[N_STREAMS] = {5, 9, 13, 7};
    struct strata_stream *st[N_STREAMS] = {0};

    CHECK(open_with(base, path, &s) == 0, "%s: %s", label, strata_error());
    if (!s)
        return;
    strata_model_info(s, &mi);
    int nv = (int)mi.n_vocab;
    rng_seed(&r, 2026, 12);
    for (int i = 0; i < N_STREAMS; i++)
        for (int j = 0; j < len[i]; j++)
            prompts[i][j] = (int32_t)rng_below(&r, mi.n_vocab < 400 ? mi.n_vocab : 400);

    /* one stream at a time */
    struct single ref;
    ref.logits = test_xmalloc(sizeof(float) * (size_t)N_STREAMS * N_STEPS * nv);
    float *first = test_xmalloc(sizeof(float) * (size_t)N_STREAMS * nv);
    CHECK(prefill(s, prompts, len, st, first, nv) == 0, "prefill: %s", strata_error());
    for (int i = 0; i < N_STREAMS; i++) {
        ref.tok[i][0] = argmax(first + (size_t)i * nv, nv);
        for (int t = 0; t < N_STEPS; t++) {
            float *row = ref.logits + ((size_t)i * N_STEPS + t) * nv;
            CHECK(strata_eval(st[i], &ref.tok[i][t], 1, row) == 0, "single step: %s",
                  strata_error());
            ref.tok[i][t + 1] = argmax(row, nv);
        }
        strata_stream_close(st[i]);
        st[i] = NULL;
    }

    /* all four in lockstep, teacher-forced with the single-stream tokens */
    struct strata_batch *b = NULL;
    float *logits = test_xmalloc(sizeof(float) * (size_t)N_STREAMS * nv);
    double worst = 0;
    int agree = 0;
    CHECK(strata_batch_open_rows(s, N_STREAMS, N_STREAMS + 4, &b) == 0, "batch open: %s",
          strata_error());
    CHECK(prefill(s, prompts, len, st, first, nv) == 0, "prefill: %s", strata_error());
    for (int t = 0; b && t < N_STEPS; t++) {
        int32_t ids[N_STREAMS];
        for (int i = 0; i < N_STREAMS; i++)
            ids[i] = ref.tok[i][t];
        if (strata_batch_eval(b, st, N_STREAMS, ids, logits)) {
            CHECK(0, "batch step %d: %s", t, strata_error());
            break;
        }
        for (int i = 0; i < N_STREAMS; i++) {
            const float *row = logits + (size_t)i * nv;
            double e = row_err(row, ref.logits + ((size_t)i * N_STEPS + t) * nv, nv);
            worst = e > worst ? e : worst;
            agree += argmax(row, nv) == ref.tok[i][t + 1];
        }
    }
    for (int i = 0; i < N_STREAMS; i++)
        CHECK(strata_stream_pos(st[i]) == len[i] + N_STEPS, "stream %d at %d, not %d", i,
              strata_stream_pos(st[i]), len[i] + N_STEPS);
    printf("%s: 4 streams in lockstep against one at a time: logits within %.3g of the largest "
           "(tolerance %.3g); argmax agrees on %d of %d steps\n",
           label, worst, tol->rel, agree, N_STREAMS * N_STEPS);
    CHECK(worst <= tol->rel, "lockstep logits off by %.3g (tolerance %.3g)", worst, tol->rel);
    CHECK(agree * 100 >= tol->agree_pct * N_STREAMS * N_STEPS, "argmax agrees on %d of %d",
          agree, N_STREAMS * N_STEPS);

    /* partners do not matter: streams 2 and 0 alone, in that order, for the first 4 steps */
    struct strata_stream *pair[2];
    for (int i = 0; i < N_STREAMS; i++)
        strata_stream_truncate(st[i], len[i]);
    pair[0] = st[2];
    pair[1] = st[0];
    double worst2 = 0;
    for (int t = 0; b && t < 4; t++) {
        int32_t ids[2] = {ref.tok[2][t], ref.tok[0][t]};
        if (strata_batch_eval(b, pair, 2, ids, logits)) {
            CHECK(0, "pair step %d: %s", t, strata_error());
            break;
        }
        double e2 = row_err(logits, ref.logits + ((size_t)2 * N_STEPS + t) * nv, nv);
        double e0 = row_err(logits + nv, ref.logits + ((size_t)0 * N_STEPS + t) * nv, nv);
        worst2 = fmax(worst2, fmax(e2, e0));
    }
    printf("%s: a pair in another order: within %.3g\n", label, worst2);
    CHECK(worst2 <= tol->rel, "a pair's logits off by %.3g", worst2);

    /* a prompt joining the steps in chunks: streams 0..2 decode their first 3 steps while
     * stream 3's prompt (7 tokens) comes in chunks of 3, 3 and 1 in the same steps; every row
     * as before, and stream 3's logits after its last chunk as after its prompt alone */
    for (int i = 0; i < N_STREAMS; i++)
        strata_stream_truncate(st[i], i == 3 ? 0 : len[i]);
    double worst3 = 0;
    for (int t = 0, off = 0; b && t < 3; t++) {
        int32_t ids[N_STREAMS + 3];
        int n_tok[N_STREAMS] = {1, 1, 1, t < 2 ? 3 : len[3] - 6};
        for (int i = 0; i < 3; i++)
            ids[i] = ref.tok[i][t];
        memcpy(ids + 3, prompts[3] + off, sizeof(int32_t) * (size_t)n_tok[3]);
        off += n_tok[3];
        if (strata_batch_eval_chunks(b, st, n_tok, N_STREAMS, ids, logits)) {
            CHECK(0, "chunk step %d: %s", t, strata_error());
            break;
        }
        for (int i = 0; i < 3; i++)
            worst3 = fmax(worst3, row_err(logits + (size_t)i * nv,
                                          ref.logits + ((size_t)i * N_STEPS + t) * nv, nv));
        if (t == 2)
            worst3 = fmax(worst3, row_err(logits + (size_t)3 * nv, first + (size_t)3 * nv, nv));
    }
    CHECK(strata_stream_pos(st[3]) == len[3], "stream 3 at %d after its chunks, not %d",
          strata_stream_pos(st[3]), len[3]);
    printf("%s: a 7-token prompt in chunks of 3, 3, 1 joining three decoding streams: within "
           "%.3g\n", label, worst3);
    CHECK(worst3 <= tol->rel, "chunked prompt rows off by %.3g", worst3);

    /* errors */
    int32_t ids[N_STREAMS + 1] = {1, 2, 3, 4, 5};
    struct strata_stream *twice[2] = {st[1], st[1]};
    struct strata_stream *five[N_STREAMS + 1] = {st[0], st[1], st[2], st[3], st[0]};
    CHECK(strata_batch_eval(b, five, N_STREAMS + 1, ids, logits) == -EINVAL, "five streams");
    CHECK(strata_batch_eval(b, twice, 2, ids, logits) == -EINVAL, "a stream twice");
    ids[0] = (int32_t)nv;
    CHECK(strata_batch_eval(b, st, 1, ids, logits) == -EINVAL, "an id outside the vocabulary");
    int pos1 = strata_stream_pos(st[1]);
    strata_stream_truncate(st[0], 0);
    int32_t fill[64] = {0};
    CHECK(strata_eval(st[0], fill, 64, NULL) == 0, "fill: %s", strata_error());
    ids[0] = 1;
    CHECK(strata_batch_eval(b, st, 2, ids, logits) == -ENOSPC, "a full stream");
    CHECK(strata_stream_pos(st[1]) == pos1, "a refused step advanced a stream");

    for (int i = 0; i < N_STREAMS; i++)
        strata_stream_close(st[i]);
    strata_batch_close(b);
    strata_close(s);
    free(ref.logits);
    free(first);
    free(logits);
}

#endif
