/* cachesim: a pool that holds every expert misses each key once and then always hits; a token
 * stream that repeats one choice hits from its second token on; against uniform random
 * routing a pool of a quarter of the experts hits about a quarter of the time. Lockstep: the
 * same skewed tokens replayed one stream at a time and 8 streams at a time keep most of their
 * hit rate (a wide step's one-row experts do not flush the layers' hot sets). */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cachesim.h"
#include "testutil.h"

#define NL 4
#define NE 16
#define K 2

/* Lockstep replay: S streams of T tokens routed by a per-layer Zipf(1) popularity over 128
 * experts, top-8 (fixed seed), decoded n_par streams at a time; the hit rates at pools of a
 * third and a tenth of the experts. */
#define LS_L 8
#define LS_E 128
#define LS_K 8
#define LS_S 16
#define LS_T 64

static void lockstep_trace(int32_t *ids) /* (LS_S, LS_T, LS_L, LS_K) */
{
    struct rng r;
    double w[LS_L][LS_E];
    rng_seed(&r, 20261201, 7); /* fixed: the thresholds below are for this trace */
    for (int l = 0; l < LS_L; l++) {
        int perm[LS_E];
        for (int e = 0; e < LS_E; e++)
            perm[e] = e;
        for (int e = LS_E - 1; e > 0; e--) {
            int j = (int)rng_below(&r, (uint32_t)e + 1), x = perm[e];
            perm[e] = perm[j];
            perm[j] = x;
        }
        for (int i = 0; i < LS_E; i++)
            w[l][perm[i]] = 1.0 / (i + 1);
    }
    for (int t = 0; t < LS_S * LS_T; t++)
        for (int l = 0; l < LS_L; l++) {
            bool taken[LS_E] = {false};
            double total = 0;
            for (int e = 0; e < LS_E; e++)
                total += w[l][e];
            for (int j = 0; j < LS_K; j++) {
                double u = rng_f32(&r) * total, acc = 0;
                int e = 0;
                for (; e < LS_E - 1; e++) {
                    if (taken[e])
                        continue;
                    acc += w[l][e];
                    if (u < acc)
                        break;
                }
                while (taken[e])
                    e--;
                taken[e] = true;
                total -= w[l][e];
                ids[((size_t)t * LS_L + l) * LS_K + j] = e;
            }
        }
}

static void lockstep_rates(const int32_t *ids, int n_par, double *hit)
{
    const double fr[] = {1.0 / 3, 0.1};
    size_t per_tok = (size_t)LS_L * LS_K;
    int32_t *step = malloc(sizeof(int32_t) * per_tok * n_par);
    struct cachesim *s = NULL;
    CHECK(step && cachesim_open(LS_L, LS_E, LS_K, fr, 2, &s) == 0, "open");
    for (int g = 0; g < LS_S / n_par; g++)
        for (int t = 0; t < LS_T; t++) {
            for (int i = 0; i < n_par; i++)
                memcpy(step + i * per_tok, ids + ((size_t)(g * n_par + i) * LS_T + t) * per_tok,
                       sizeof(int32_t) * per_tok);
            cachesim_step(s, step, n_par);
        }
    for (int i = 0; i < 2; i++)
        hit[i] = cachesim_hit_rate(s, i);
    cachesim_close(s);
    free(step);
}

static void check_lockstep(void)
{
    int32_t *ids = malloc(sizeof(int32_t) * LS_S * LS_T * LS_L * LS_K);
    double h1[2], h8[2];
    CHECK(ids != NULL, "alloc");
    lockstep_trace(ids);
    lockstep_rates(ids, 1, h1);
    lockstep_rates(ids, 8, h8);
    printf("lockstep, Zipf routing: hit rate N=1 %.3f (1/3 pool) %.3f (1/10), N=8 %.3f %.3f\n",
           h1[0], h1[1], h8[0], h8[1]);
    CHECK(h8[0] > h1[0] - 0.15, "N=8, a third cached: %.3f against %.3f at N=1", h8[0], h1[0]);
    CHECK(h8[1] > 0.15, "N=8, a tenth cached: %.3f (N=1: %.3f)", h8[1], h1[1]);
    free(ids);
}

int main(void)
{
    struct rng r;
    rng_seed(&r, test_seed("test_cachesim"), 3);
    const double fr[] = {1.0, 0.25, 1.0 / NE};
    struct cachesim *s = NULL;
    CHECK(cachesim_open(NL, NE, K, fr, 3, &s) == 0, "open");
    CHECK(cachesim_slots(s, 0) == NL * NE && cachesim_slots(s, 2) == NL, "slot counts %d %d",
          cachesim_slots(s, 0), cachesim_slots(s, 2));

    /* uniform random routing, 4000 tokens */
    int32_t ids[NL * K];
    bool seen[NL][NE] = {{false}};
    int distinct = 0, T = 4000;
    for (int t = 0; t < T; t++) {
        for (int l = 0; l < NL; l++) {
            ids[l * K] = (int32_t)rng_below(&r, NE);
            do
                ids[l * K + 1] = (int32_t)rng_below(&r, NE);
            while (ids[l * K + 1] == ids[l * K]);
            for (int j = 0; j < K; j++) {
                distinct += !seen[l][ids[l * K + j]];
                seen[l][ids[l * K + j]] = true;
            }
        }
        cachesim_token(s, ids);
    }
    double full = cachesim_hit_rate(s, 0), want = 1.0 - (double)distinct / (T * NL * K);
    CHECK(fabs(full - want) < 1e-12, "a full pool: hit rate %g, expected %g", full, want);
    /* with uniform routing a pool of a quarter of the experts hits about a quarter of the time
     * (a policy cannot beat chance there); one slot per layer, with two experts per layer and
     * token, hardly ever */
    double one = cachesim_hit_rate(s, 2), quarter = cachesim_hit_rate(s, 1);
    printf("uniform routing, %d tokens: hit rate %.3f (all cached), %.3f (25%%), %.3f (1 slot "
           "per layer)\n", T, full, quarter, one);
    CHECK(one < 0.1, "one slot per layer: %g", one);
    CHECK(quarter > 0.18 && quarter < 0.32, "25%% pool: %g", quarter);
    cachesim_close(s);

    /* the same choice every token: everything but the first token hits */
    CHECK(cachesim_open(NL, NE, K, fr + 1, 1, &s) == 0, "open");
    for (int l = 0; l < NL; l++)
        ids[l * K] = 1, ids[l * K + 1] = 2;
    for (int t = 0; t < 10; t++)
        cachesim_token(s, ids);
    CHECK(fabs(cachesim_hit_rate(s, 0) - 0.9) < 1e-12, "repeating choice: %g",
          cachesim_hit_rate(s, 0));
    cachesim_close(s);
    CHECK(cachesim_open(NL, NE, K, fr, 0, &s) == -EINVAL, "no pools accepted");
    check_lockstep();
    return test_finish("test_cachesim");
}
