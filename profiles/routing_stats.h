/* routing_stats: what a model's router does over a text, the facts the residency cache and the
 * prefetcher live on: per layer, how concentrated expert popularity is (share of activations
 * taken by the top 10% / 20% of experts), how soon a selected expert is selected again at the
 * same layer (reuse distance in tokens), and how well applying layer l+1's router to layer l's
 * MoE input predicts layer l+1's top-k (recall). */
#ifndef STRATA_ROUTING_STATS_H
#define STRATA_ROUTING_STATS_H

#include <stdint.h>
#include <stdio.h>

/* Reuse-distance buckets: selected again after 1 token, 2..8, 9..64, more, or never before. */
enum routing_reuse { REUSE_1, REUSE_2_8, REUSE_9_64, REUSE_FAR, REUSE_FIRST, REUSE_BUCKETS };

struct routing_layer_report {
    uint64_t selections;               /* (token, expert) selections seen */
    double top10_share, top20_share;   /* of selections, by the most popular 10% / 20% experts */
    uint64_t reuse[REUSE_BUCKETS];     /* selections by distance to the previous one */
    uint64_t predicted, predicted_hit; /* for layer l >= 1: pairs predicted from layer l-1 */
};

struct routing_stats;

int routing_stats_open(int n_layer, int n_expert, int k, struct routing_stats **out);
void routing_stats_close(struct routing_stats *rs);

/* Starts a new text: reuse distances do not cross texts. */
void routing_stats_new_text(struct routing_stats *rs);

/* Records token tok's (index within the current text) k selected experts at layer. */
void routing_stats_add(struct routing_stats *rs, int layer, int tok, const int32_t *ids);

/* Records a prediction of layer's k experts for token tok, made before layer ran; it is
 * scored when routing_stats_add reports the actual selection of (layer, tok). */
void routing_stats_predict(struct routing_stats *rs, int layer, int tok, const int32_t *pred);

/* Fills the report of one layer. */
void routing_stats_layer(const struct routing_stats *rs, int layer, struct routing_layer_report *r);

/* Prints the per-layer table and the totals. */
void routing_stats_print(const struct routing_stats *rs, FILE *f);

/* Writes the per-layer figures as whitespace-separated columns (for gnuplot). */
int routing_stats_write_dat(const struct routing_stats *rs, const char *path);

#endif
