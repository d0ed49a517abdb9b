/* routing_stats: what a model's router does over a text, the facts the residency cache and the
 * prefetcher live on: per layer, how concentrated expert popularity is (share of activations
 * taken by the top 10% / 20% of experts), how soon a selected expert is selected again at the
 * same layer (reuse distance in tokens), and how well applying layer l+d's router to layer l's
 * MoE input predicts layer l+d's top-k (recall at depth d = 1..ROUTING_DEPTHS), and how well
 * applying layer l's router to the token's own embedding (ffn-normed) predicts it: what a
 * predictor knows of a token before the model has run on it, such as a drafted token before its
 * verify pass; and how well the choice at an earlier position predicts it, where prompt lookup
 * drafted the token from that position (what the lookahead of docs/speculative.md copies). */
#ifndef STRATA_ROUTING_STATS_H
#define STRATA_ROUTING_STATS_H

#include <stdint.h>
#include <stdio.h>

/* Reuse-distance buckets: selected again after 1 token, 2..8, 9..64, more, or never before. */
enum routing_reuse { REUSE_1, REUSE_2_8, REUSE_9_64, REUSE_FAR, REUSE_FIRST, REUSE_BUCKETS };

#define ROUTING_DEPTHS 4 /* predictions are scored at depths 1..ROUTING_DEPTHS layers ahead */

struct routing_layer_report {
    uint64_t selections;             /* (token, expert) selections seen */
    double top10_share, top20_share; /* of selections, by the most popular 10% / 20% experts */
    uint64_t reuse[REUSE_BUCKETS];   /* selections by distance to the previous one */
    /* [d-1], for layer l >= d: (token, expert) pairs predicted from layer l-d, and of them
     * those the layer selected; recall at depth d is predicted_hit[d-1] / predicted[d-1] */
    uint64_t predicted[ROUTING_DEPTHS], predicted_hit[ROUTING_DEPTHS];
    /* pairs predicted from the token's embedding, and of them those the layer selected */
    uint64_t emb_predicted, emb_hit;
    /* pairs predicted from the choice at a prompt-lookup draft's source position, and of them
     * those the layer selected */
    uint64_t src_predicted, src_hit;
};

struct routing_stats;

int routing_stats_open(int n_layer, int n_expert, int k, struct routing_stats **out);
void routing_stats_close(struct routing_stats *rs);

/* Starts a new text: reuse distances do not cross texts. */
void routing_stats_new_text(struct routing_stats *rs);

/* Records token tok's (index within the current text) k selected experts at layer. */
void routing_stats_add(struct routing_stats *rs, int layer, int tok, const int32_t *ids);

/* Records a prediction of layer's k experts for token tok, made from layer - depth before
 * layer ran; it is scored at that depth when routing_stats_add reports the actual selection of
 * (layer, tok) in the same text. Each depth keeps its own pending predictions, a bounded number
 * per layer (a later token at the same slot replaces an unscored one). Ignored unless
 * 1 <= depth <= ROUTING_DEPTHS and depth <= layer < n_layer. */
void routing_stats_predict(struct routing_stats *rs, int layer, int depth, int tok,
                           const int32_t *pred);

/* Scores a prediction of layer's k experts for one token made from its embedding against the k
 * the layer selected. Ignored unless 0 <= layer < n_layer. */
void routing_stats_embedding(struct routing_stats *rs, int layer, const int32_t *pred,
                             const int32_t *actual);

/* Scores layer's k choices at an earlier position (the source of a prompt-lookup draft that
 * equals the token) as the prediction of its k choices for the token. Ignored unless
 * 0 <= layer < n_layer. */
void routing_stats_source(struct routing_stats *rs, int layer, const int32_t *pred,
                          const int32_t *actual);

/* Fills the report of one layer. */
void routing_stats_layer(const struct routing_stats *rs, int layer, struct routing_layer_report *r);

/* Prints the per-layer table (recall at depth 1 as "recall", then "recall@2".."recall@4";
 * "-" where a layer has no prediction at that depth; then "emb", the recall from the token's
 * embedding, and "src", from the draft source's choice, "-" where none was scored), the
 * totals over all layers, and the depth-1 recall split by the rank of the predicted expert
 * (the share of predictions at rank i that the layer selected). */
void routing_stats_print(const struct routing_stats *rs, FILE *f);

/* Writes the per-layer figures as whitespace-separated columns (for gnuplot): layer, top10,
 * top20, reuse1, reuse8, then recall at depths 1..ROUTING_DEPTHS, from the embedding and from
 * the draft source (NaN: no prediction). */
int routing_stats_write_dat(const struct routing_stats *rs, const char *path);

#endif
