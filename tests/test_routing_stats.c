/* routing_stats: popularity shares, reuse-distance buckets and prediction recall on a
 * hand-made selection sequence whose figures are worked out in the comments. */
#include <math.h>

#include "routing_stats.h"
#include "testutil.h"

int main(void)
{
    struct routing_stats *rs;
    struct routing_layer_report r;
    CHECK(routing_stats_open(2, 10, 2, &rs) == 0, "open");

    /* layer 0, one text: t0 {0,1}  t1 {0,2}  t2 {0,1}  t3 {5,6}
     * reuse: t1's 0 and t2's 0 at distance 1, t2's 1 at distance 2; five first selections.
     * counts e0 3, e1 2, e2 1, e5 1, e6 1 (8): top 10% (1 expert) 3/8, top 20% (2) 5/8. */
    const int32_t l0[4][2] = {{0, 1}, {0, 2}, {0, 1}, {5, 6}};
    routing_stats_new_text(rs);
    for (int t = 0; t < 4; t++)
        routing_stats_add(rs, 0, t, l0[t]);
    routing_stats_layer(rs, 0, &r);
    CHECK(r.selections == 8, "selections %llu", (unsigned long long)r.selections);
    CHECK(fabs(r.top10_share - 3.0 / 8) < 1e-12 && fabs(r.top20_share - 5.0 / 8) < 1e-12,
          "shares %g %g", r.top10_share, r.top20_share);
    CHECK(r.reuse[REUSE_1] == 2 && r.reuse[REUSE_2_8] == 1 && r.reuse[REUSE_FIRST] == 5 &&
              r.reuse[REUSE_9_64] == 0 && r.reuse[REUSE_FAR] == 0,
          "reuse %llu %llu %llu", (unsigned long long)r.reuse[REUSE_1],
          (unsigned long long)r.reuse[REUSE_2_8], (unsigned long long)r.reuse[REUSE_FIRST]);

    /* layer 1 predictions: t0 {3,4} vs actual {3,9}: 1 of 2; t1 {1,2} vs {2,1}: 2 of 2;
     * t2 has no prediction and does not count. */
    const int32_t p0[2] = {3, 4}, a0[2] = {3, 9}, p1[2] = {1, 2}, a1[2] = {2, 1}, a2[2] = {7, 8};
    routing_stats_predict(rs, 1, 0, p0);
    routing_stats_predict(rs, 1, 1, p1);
    routing_stats_add(rs, 1, 0, a0);
    routing_stats_add(rs, 1, 1, a1);
    routing_stats_add(rs, 1, 2, a2);
    routing_stats_layer(rs, 1, &r);
    CHECK(r.predicted == 4 && r.predicted_hit == 3, "recall %llu/%llu",
          (unsigned long long)r.predicted_hit, (unsigned long long)r.predicted);
    routing_stats_layer(rs, 0, &r);
    CHECK(r.predicted == 0, "layer 0 has no predictions");

    /* a new text: expert 0 again at t0 is a first selection, then distance 12 is 9..64 */
    routing_stats_new_text(rs);
    const int32_t b0[2] = {0, 3}, b12[2] = {0, 4};
    routing_stats_add(rs, 0, 0, b0);
    routing_stats_add(rs, 0, 12, b12);
    routing_stats_layer(rs, 0, &r);
    CHECK(r.reuse[REUSE_FIRST] == 5 + 3 && r.reuse[REUSE_9_64] == 1,
          "across texts: first %llu, 9..64 %llu", (unsigned long long)r.reuse[REUSE_FIRST],
          (unsigned long long)r.reuse[REUSE_9_64]);
    CHECK(routing_stats_open(1, 4, 5, &(struct routing_stats *){NULL}) < 0, "k > n_expert");
    routing_stats_close(rs);
    return test_finish("test_routing_stats");
}
