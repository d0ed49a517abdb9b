/* cachesim: a pool that holds every expert misses each key once and then always hits; a token
 * stream that repeats one choice hits from its second token on; against uniform random
 * routing a pool of a quarter of the experts hits about a quarter of the time. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "cachesim.h"
#include "testutil.h"

#define NL 4
#define NE 16
#define K 2

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
    return test_finish("test_cachesim");
}
