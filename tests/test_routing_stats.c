/* routing_stats: popularity shares, reuse-distance buckets and prediction recall at depths
 * 1..ROUTING_DEPTHS on hand-made selection sequences whose figures are worked out in the
 * comments, and the printed table's recall columns. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "routing_stats.h"
#include "testutil.h"

/* Checks the recall counts of one layer at every depth: want[d - 1] = {hits, predicted}. */
static void check_depths(const struct routing_stats *rs, int layer, const int want[][2])
{
    struct routing_layer_report r;
    routing_stats_layer(rs, layer, &r);
    for (int d = 0; d < ROUTING_DEPTHS; d++)
        CHECK(r.predicted_hit[d] == (uint64_t)want[d][0] && r.predicted[d] == (uint64_t)want[d][1],
              "layer %d depth %d: recall %llu/%llu, want %d/%d", layer, d + 1,
              (unsigned long long)r.predicted_hit[d], (unsigned long long)r.predicted[d],
              want[d][0], want[d][1]);
}

/* Splits line at whitespace into at most max tokens (in place); returns how many. */
static int split_ws(char *line, char **tok, int max)
{
    int n = 0;
    for (char *p = strtok(line, " \n"); p && n < max; p = strtok(NULL, " \n"))
        tok[n++] = p;
    return n;
}

/* The printed table: the header, then per layer (and "all") the four recall columns, the
 * embedding's and the draft source's ("-": none predicted in these sequences). */
static void check_table(const struct routing_stats *rs, int n_layer, const char *const want[][4])
{
    static const char *const head[14] = {"layer",    "selections", "top10%", "top20%", "reuse@1",
                                         "reuse<=8", "<=64",       "first",  "recall", "recall@2",
                                         "recall@3", "recall@4",   "emb",    "src"};
    FILE *f = tmpfile();
    char line[512], *tok[16];
    int n;

    CHECK(f != NULL, "tmpfile");
    if (!f)
        return;
    routing_stats_print(rs, f);
    rewind(f);
    CHECK(fgets(line, sizeof(line), f) != NULL, "no header");
    n = split_ws(line, tok, 16);
    CHECK(n == 14, "header has %d columns, want 14", n);
    for (int i = 0; i < n && i < 14; i++)
        CHECK(!strcmp(tok[i], head[i]), "header column %d: '%s', want '%s'", i, tok[i], head[i]);
    for (int l = 0; l <= n_layer; l++) { /* the last row is the totals */
        CHECK(fgets(line, sizeof(line), f) != NULL, "no row %d", l);
        n = split_ws(line, tok, 16);
        CHECK(n == 14, "row %d has %d columns, want 14", l, n);
        if (n != 14)
            continue;
        CHECK(!strcmp(tok[12], "-"), "row %d: embedding recall '%s', want '-'", l, tok[12]);
        CHECK(!strcmp(tok[13], "-"), "row %d: source recall '%s', want '-'", l, tok[13]);
        CHECK(l < n_layer || !strcmp(tok[0], "all"), "totals row starts with '%s'", tok[0]);
        for (int d = 0; d < ROUTING_DEPTHS; d++)
            CHECK(!strcmp(tok[8 + d], want[l][d]), "row %d depth %d: '%s', want '%s'", l, d + 1,
                  tok[8 + d], want[l][d]);
    }
    fclose(f);
}

/* Predictions of the same (layer, token) at depths 1..4 are kept apart and each scored at its
 * own depth; depths a layer cannot have, or outside 1..4, are ignored; a pending prediction
 * is scored once, and never by another text. */
static void test_depths(void)
{
    struct routing_stats *rs = NULL;
    CHECK(routing_stats_open(6, 10, 2, &rs) == 0, "open");
    if (!rs)
        return;
    routing_stats_new_text(rs);

    /* layer 4, t0, actual {1,2}: d1 {1,2} 2 hits, d2 {2,7} 1, d3 {7,8} 0, d4 {2,1} 2;
     * t1, actual {3,4}: d2 {3,9} 1, d4 {4,3} 2 (no d1 or d3 prediction) */
    const int32_t a40[2] = {1, 2}, a41[2] = {3, 4};
    const int32_t p40[4][2] = {{1, 2}, {2, 7}, {7, 8}, {2, 1}};
    const int32_t p41d2[2] = {3, 9}, p41d4[2] = {4, 3}, junk[2] = {1, 2};
    routing_stats_predict(rs, 4, 0, 0, junk); /* depth 0 and 5: ignored */
    routing_stats_predict(rs, 4, ROUTING_DEPTHS + 1, 0, junk);
    for (int d = 1; d <= ROUTING_DEPTHS; d++)
        routing_stats_predict(rs, 4, d, 0, p40[d - 1]);
    routing_stats_predict(rs, 4, 2, 1, p41d2);
    routing_stats_predict(rs, 4, 4, 1, p41d4);
    routing_stats_add(rs, 4, 0, a40);
    routing_stats_add(rs, 4, 1, a41);
    routing_stats_add(rs, 4, 0, a40); /* the same again: its predictions were scored once */
    check_depths(rs, 4, (const int[][2]){{2, 2}, {2, 4}, {0, 2}, {4, 4}});

    /* layer 5, t0, actual {5,6}: d1 {5,0} 1 hit, d3 {6,0} 1 */
    const int32_t a50[2] = {5, 6}, p50d1[2] = {5, 0}, p50d3[2] = {6, 0};
    routing_stats_predict(rs, 5, 1, 0, p50d1);
    routing_stats_predict(rs, 5, 3, 0, p50d3);
    routing_stats_add(rs, 5, 0, a50);
    check_depths(rs, 5, (const int[][2]){{1, 2}, {0, 0}, {1, 2}, {0, 0}});

    /* layer 2, t0, actual {0,1}: d1 {0,1} 2 hits, d2 {1,9} 1; d3 and d4 need a layer -1, -2 */
    const int32_t a20[2] = {0, 1}, p20d1[2] = {0, 1}, p20d2[2] = {1, 9};
    routing_stats_predict(rs, 2, 1, 0, p20d1);
    routing_stats_predict(rs, 2, 2, 0, p20d2);
    routing_stats_predict(rs, 2, 3, 0, a20);
    routing_stats_predict(rs, 2, 4, 0, a20);
    routing_stats_add(rs, 2, 0, a20);
    check_depths(rs, 2, (const int[][2]){{2, 2}, {1, 2}, {0, 0}, {0, 0}});

    /* layer 3, t5: predicted in this text, selected in the next one: not scored */
    routing_stats_predict(rs, 3, 1, 5, a20);
    routing_stats_new_text(rs);
    routing_stats_add(rs, 3, 5, a20);
    check_depths(rs, 3, (const int[][2]){{0, 0}, {0, 0}, {0, 0}, {0, 0}});
    check_depths(rs, 0, (const int[][2]){{0, 0}, {0, 0}, {0, 0}, {0, 0}});

    /* totals: d1 (2+2+1)/6 83.3%, d2 (1+2)/6 50.0%, d3 (0+1)/4 25.0%, d4 4/4 100.0% */
    check_table(rs, 6,
                (const char *const[][4]){{"-", "-", "-", "-"},
                                         {"-", "-", "-", "-"},
                                         {"100.0%", "50.0%", "-", "-"},
                                         {"-", "-", "-", "-"},
                                         {"100.0%", "50.0%", "0.0%", "100.0%"},
                                         {"50.0%", "-", "50.0%", "-"},
                                         {"83.3%", "50.0%", "25.0%", "100.0%"}});
    routing_stats_close(rs);
}

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
    routing_stats_predict(rs, 1, 1, 0, p0);
    routing_stats_predict(rs, 1, 1, 1, p1);
    routing_stats_add(rs, 1, 0, a0);
    routing_stats_add(rs, 1, 1, a1);
    routing_stats_add(rs, 1, 2, a2);
    routing_stats_layer(rs, 1, &r);
    CHECK(r.predicted[0] == 4 && r.predicted_hit[0] == 3, "recall %llu/%llu",
          (unsigned long long)r.predicted_hit[0], (unsigned long long)r.predicted[0]);
    routing_stats_layer(rs, 0, &r);
    CHECK(r.predicted[0] == 0, "layer 0 has no predictions");

    /* from the embedding: {3,4} vs {4,3}: 2 of 2; {5,6} vs {6,7}: 1 of 2; out of range ignored */
    const int32_t e0[2] = {3, 4}, ea0[2] = {4, 3}, e1[2] = {5, 6}, ea1[2] = {6, 7};
    routing_stats_embedding(rs, 0, e0, ea0);
    routing_stats_embedding(rs, 0, e1, ea1);
    routing_stats_embedding(rs, 2, e1, ea1);
    routing_stats_embedding(rs, -1, e1, ea1);
    routing_stats_layer(rs, 0, &r);
    CHECK(r.emb_predicted == 4 && r.emb_hit == 3, "embedding recall %llu/%llu",
          (unsigned long long)r.emb_hit, (unsigned long long)r.emb_predicted);
    routing_stats_layer(rs, 1, &r);
    CHECK(r.emb_predicted == 0, "layer 1 has no embedding predictions");

    /* from a draft's source position, counted apart from the embedding's: {5,6} vs {6,7} at
     * layer 1: 1 of 2; out of range ignored */
    routing_stats_source(rs, 1, e1, ea1);
    routing_stats_source(rs, 5, e1, ea1);
    routing_stats_layer(rs, 1, &r);
    CHECK(r.src_predicted == 2 && r.src_hit == 1 && r.emb_predicted == 0, "source recall %llu/%llu",
          (unsigned long long)r.src_hit, (unsigned long long)r.src_predicted);
    routing_stats_layer(rs, 0, &r);
    CHECK(r.src_predicted == 0 && r.emb_predicted == 4, "layer 0: source %llu, embedding %llu",
          (unsigned long long)r.src_predicted, (unsigned long long)r.emb_predicted);

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
    test_depths();
    return test_finish("test_routing_stats");
}
