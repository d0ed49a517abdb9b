#include "routing_stats.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "outfile.h"

#define PRED_SLOTS 4096 /* pending predictions per depth and layer, at token % PRED_SLOTS */

struct routing_stats {
    int n_layer, n_expert, k;
    uint64_t *count;   /* (n_layer, n_expert) selections */
    int64_t *last;     /* (n_layer, n_expert) token of the previous selection, -1 none */
    uint64_t *reuse;   /* (n_layer, REUSE_BUCKETS) */
    int32_t *pred;     /* (ROUTING_DEPTHS, n_layer, PRED_SLOTS, k) pending predictions */
    int64_t *pred_tok; /* (ROUTING_DEPTHS, n_layer, PRED_SLOTS) text_base + token a pending
                        * prediction is for, -1 none: a text never scores another's */
    uint64_t *pred_n, *pred_hit; /* (ROUTING_DEPTHS, n_layer) */
    uint64_t *rank_hit;          /* (k) depth 1, all layers: hits of the i-th predicted expert
                                  * (the router's order, largest weight first) */
    uint64_t rank_n;             /* depth-1 predictions scored (tokens x layers) */
    uint64_t *emb_n, *emb_hit;   /* (n_layer) */
    uint64_t *src_n, *src_hit;   /* (n_layer) */
    int64_t text_base;           /* added to token indices so texts never look adjacent */
    int64_t text_end;            /* one past the largest index seen in the current text */
};

int routing_stats_open(int n_layer, int n_expert, int k, struct routing_stats **out)
{
    struct routing_stats *rs;
    size_t le = (size_t)n_layer * n_expert;
    size_t dl = (size_t)ROUTING_DEPTHS * n_layer;
    size_t slots = dl * PRED_SLOTS;

    if (n_layer < 1 || n_expert < 1 || k < 1 || k > n_expert)
        return err_set(-EINVAL, "routing stats: %d layers, %d experts, top-%d", n_layer, n_expert,
                       k);
    if (slots > SIZE_MAX / sizeof(int32_t) / (size_t)k)
        return err_set(-ENOMEM, "routing stats: %d layers of top-%d predictions overflow", n_layer,
                       k);
    rs = calloc(1, sizeof(*rs));
    if (!rs)
        return err_set(-ENOMEM, "out of memory");
    rs->n_layer = n_layer;
    rs->n_expert = n_expert;
    rs->k = k;
    rs->count = calloc(le, sizeof(*rs->count));
    rs->last = malloc(le * sizeof(*rs->last));
    rs->reuse = calloc((size_t)n_layer * REUSE_BUCKETS, sizeof(*rs->reuse));
    rs->pred = malloc(slots * (size_t)k * sizeof(*rs->pred));
    rs->pred_tok = malloc(slots * sizeof(*rs->pred_tok));
    rs->pred_n = calloc(dl, sizeof(*rs->pred_n));
    rs->pred_hit = calloc(dl, sizeof(*rs->pred_hit));
    rs->rank_hit = calloc((size_t)k, sizeof(*rs->rank_hit));
    rs->emb_n = calloc((size_t)n_layer, sizeof(*rs->emb_n));
    rs->emb_hit = calloc((size_t)n_layer, sizeof(*rs->emb_hit));
    rs->src_n = calloc((size_t)n_layer, sizeof(*rs->src_n));
    rs->src_hit = calloc((size_t)n_layer, sizeof(*rs->src_hit));
    if (!rs->count || !rs->last || !rs->reuse || !rs->pred || !rs->pred_tok || !rs->pred_n ||
        !rs->pred_hit || !rs->rank_hit || !rs->emb_n || !rs->emb_hit || !rs->src_n ||
        !rs->src_hit) {
        routing_stats_close(rs);
        return err_set(-ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < le; i++)
        rs->last[i] = -1;
    for (size_t i = 0; i < slots; i++)
        rs->pred_tok[i] = -1;
    *out = rs;
    return 0;
}

void routing_stats_close(struct routing_stats *rs)
{
    if (!rs)
        return;
    free(rs->count);
    free(rs->last);
    free(rs->reuse);
    free(rs->pred);
    free(rs->pred_tok);
    free(rs->pred_n);
    free(rs->pred_hit);
    free(rs->rank_hit);
    free(rs->emb_n);
    free(rs->emb_hit);
    free(rs->src_n);
    free(rs->src_hit);
    free(rs);
}

void routing_stats_new_text(struct routing_stats *rs)
{
    /* a gap larger than any bucket: the first selection of a text counts as REUSE_FIRST */
    rs->text_base = rs->text_end + 1000000;
    rs->text_end = rs->text_base;
}

static enum routing_reuse routing_bucket(int64_t d)
{
    return d == 1 ? REUSE_1 : d <= 8 ? REUSE_2_8 : d <= 64 ? REUSE_9_64 : REUSE_FAR;
}

/* (depth, layer)'s index in pred_n and pred_hit; its pending slots start at row * PRED_SLOTS */
static size_t routing_pred_row(const struct routing_stats *rs, int layer, int depth)
{
    return (size_t)(depth - 1) * rs->n_layer + (size_t)layer;
}

void routing_stats_predict(struct routing_stats *rs, int layer, int depth, int tok,
                           const int32_t *pred)
{
    if (depth < 1 || depth > ROUTING_DEPTHS || layer < depth || layer >= rs->n_layer || tok < 0)
        return;
    size_t slot = routing_pred_row(rs, layer, depth) * PRED_SLOTS + (size_t)tok % PRED_SLOTS;
    rs->pred_tok[slot] = rs->text_base + tok;
    memcpy(rs->pred + slot * rs->k, pred, sizeof(int32_t) * (size_t)rs->k);
}

void routing_stats_add(struct routing_stats *rs, int layer, int tok, const int32_t *ids)
{
    int64_t t = rs->text_base + tok;

    if (t + 1 > rs->text_end)
        rs->text_end = t + 1;
    for (int j = 0; j < rs->k; j++) {
        size_t key = (size_t)layer * rs->n_expert + ids[j];
        int64_t prev = rs->last[key];
        enum routing_reuse b =
            prev < rs->text_base || prev < 0 ? REUSE_FIRST : routing_bucket(t - prev);
        rs->reuse[(size_t)layer * REUSE_BUCKETS + b]++;
        rs->count[key]++;
        rs->last[key] = t;
    }
    for (int d = 1; d <= ROUTING_DEPTHS && d <= layer; d++) {
        size_t row = routing_pred_row(rs, layer, d);
        size_t slot = row * PRED_SLOTS + (size_t)tok % PRED_SLOTS;
        if (rs->pred_tok[slot] != t)
            continue;
        const int32_t *p = rs->pred + slot * rs->k;
        for (int j = 0; j < rs->k; j++)
            for (int i = 0; i < rs->k; i++) {
                rs->pred_hit[row] += p[i] == ids[j];
                if (d == 1)
                    rs->rank_hit[i] += p[i] == ids[j];
            }
        rs->rank_n += d == 1;
        rs->pred_n[row] += (uint64_t)rs->k;
        rs->pred_tok[slot] = -1;
    }
}

static int routing_cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

void routing_stats_layer(const struct routing_stats *rs, int layer, struct routing_layer_report *r)
{
    uint64_t *c = malloc(sizeof(uint64_t) * (size_t)rs->n_expert);
    uint64_t total = 0, top10 = 0, top20 = 0;
    int n10 = (rs->n_expert + 9) / 10, n20 = (rs->n_expert + 4) / 5;

    memset(r, 0, sizeof(*r));
    if (!c)
        return;
    memcpy(c, rs->count + (size_t)layer * rs->n_expert, sizeof(uint64_t) * (size_t)rs->n_expert);
    qsort(c, (size_t)rs->n_expert, sizeof(uint64_t), routing_cmp_desc);
    for (int e = 0; e < rs->n_expert; e++) {
        total += c[e];
        top10 += e < n10 ? c[e] : 0;
        top20 += e < n20 ? c[e] : 0;
    }
    free(c);
    r->selections = total;
    r->top10_share = total ? (double)top10 / total : 0;
    r->top20_share = total ? (double)top20 / total : 0;
    memcpy(r->reuse, rs->reuse + (size_t)layer * REUSE_BUCKETS, sizeof(r->reuse));
    for (int d = 1; d <= ROUTING_DEPTHS; d++) {
        r->predicted[d - 1] = rs->pred_n[routing_pred_row(rs, layer, d)];
        r->predicted_hit[d - 1] = rs->pred_hit[routing_pred_row(rs, layer, d)];
    }
    r->emb_predicted = rs->emb_n[layer];
    r->emb_hit = rs->emb_hit[layer];
    r->src_predicted = rs->src_n[layer];
    r->src_hit = rs->src_hit[layer];
}

/* k predicted ids against k chosen ones: the count of n and hit at layer */
static void routing_score(const struct routing_stats *rs, uint64_t *n, uint64_t *hit, int layer,
                          const int32_t *pred, const int32_t *actual)
{
    if (layer < 0 || layer >= rs->n_layer)
        return;
    for (int i = 0; i < rs->k; i++)
        for (int j = 0; j < rs->k; j++)
            hit[layer] += pred[i] == actual[j];
    n[layer] += (uint64_t)rs->k;
}

void routing_stats_embedding(struct routing_stats *rs, int layer, const int32_t *pred,
                             const int32_t *actual)
{
    routing_score(rs, rs->emb_n, rs->emb_hit, layer, pred, actual);
}

void routing_stats_source(struct routing_stats *rs, int layer, const int32_t *pred,
                          const int32_t *actual)
{
    routing_score(rs, rs->src_n, rs->src_hit, layer, pred, actual);
}

static double routing_pct(uint64_t a, uint64_t b)
{
    return b ? 100.0 * (double)a / (double)b : 0.0;
}

/* One recall column of the table: " 12.3%" in 10 characters, or "-" where none was predicted. */
static void routing_print_recall(FILE *f, uint64_t hit, uint64_t n)
{
    if (n)
        fprintf(f, " %8.1f%%", routing_pct(hit, n));
    else
        fprintf(f, " %9s", "-");
}

void routing_stats_print(const struct routing_stats *rs, FILE *f)
{
    struct routing_layer_report t = {0};
    double s10 = 0, s20 = 0;

    fprintf(f, "%5s %10s %7s %7s %8s %8s %8s %8s %9s %9s %9s %9s %9s %9s\n", "layer", "selections",
            "top10%", "top20%", "reuse@1", "reuse<=8", "<=64", "first", "recall", "recall@2",
            "recall@3", "recall@4", "emb", "src");
    for (int l = 0; l < rs->n_layer; l++) {
        struct routing_layer_report r;
        routing_stats_layer(rs, l, &r);
        uint64_t again = r.selections - r.reuse[REUSE_FIRST];
        fprintf(f, "%5d %10llu %6.1f%% %6.1f%% %7.1f%% %7.1f%% %7.1f%% %7.1f%%", l,
                (unsigned long long)r.selections, 100 * r.top10_share, 100 * r.top20_share,
                routing_pct(r.reuse[REUSE_1], r.selections),
                routing_pct(r.reuse[REUSE_1] + r.reuse[REUSE_2_8], r.selections),
                routing_pct(again - r.reuse[REUSE_FAR], r.selections),
                routing_pct(r.reuse[REUSE_FIRST], r.selections));
        for (int d = 0; d < ROUTING_DEPTHS; d++) {
            routing_print_recall(f, r.predicted_hit[d], r.predicted[d]);
            t.predicted[d] += r.predicted[d];
            t.predicted_hit[d] += r.predicted_hit[d];
        }
        routing_print_recall(f, r.emb_hit, r.emb_predicted);
        t.emb_hit += r.emb_hit;
        t.emb_predicted += r.emb_predicted;
        routing_print_recall(f, r.src_hit, r.src_predicted);
        t.src_hit += r.src_hit;
        t.src_predicted += r.src_predicted;
        fprintf(f, "\n");
        t.selections += r.selections;
        for (int b = 0; b < REUSE_BUCKETS; b++)
            t.reuse[b] += r.reuse[b];
        s10 += r.top10_share * (double)r.selections;
        s20 += r.top20_share * (double)r.selections;
    }
    fprintf(f, "%5s %10llu %6.1f%% %6.1f%% %7.1f%% %7.1f%% %7.1f%% %7.1f%%", "all",
            (unsigned long long)t.selections, routing_pct((uint64_t)s10, t.selections),
            routing_pct((uint64_t)s20, t.selections), routing_pct(t.reuse[REUSE_1], t.selections),
            routing_pct(t.reuse[REUSE_1] + t.reuse[REUSE_2_8], t.selections),
            routing_pct(t.selections - t.reuse[REUSE_FIRST] - t.reuse[REUSE_FAR], t.selections),
            routing_pct(t.reuse[REUSE_FIRST], t.selections));
    for (int d = 0; d < ROUTING_DEPTHS; d++)
        routing_print_recall(f, t.predicted_hit[d], t.predicted[d]);
    routing_print_recall(f, t.emb_hit, t.emb_predicted);
    routing_print_recall(f, t.src_hit, t.src_predicted);
    fprintf(f, "\n");
    if (!rs->rank_n)
        return;
    fprintf(f, "depth 1 by rank (the predicted experts in the router's order, largest weight "
               "first): share selected");
    for (int i = 0; i < rs->k; i++)
        fprintf(f, " %.1f%%", routing_pct(rs->rank_hit[i], rs->rank_n));
    fprintf(f, "\n");
}

int routing_stats_write_dat(const struct routing_stats *rs, const char *path)
{
    struct outfile of;
    int rc = outfile_open(path, &of);
    FILE *f = of.f;

    if (rc)
        return rc;
    fprintf(f, "# layer top10 top20 reuse1 reuse8 recall recall2 recall3 recall4 emb src "
               "(percent; NaN: no prediction)\n");
    for (int l = 0; l < rs->n_layer; l++) {
        struct routing_layer_report r;
        routing_stats_layer(rs, l, &r);
        fprintf(f, "%d %.3f %.3f %.3f %.3f", l, 100 * r.top10_share, 100 * r.top20_share,
                routing_pct(r.reuse[REUSE_1], r.selections),
                routing_pct(r.reuse[REUSE_1] + r.reuse[REUSE_2_8], r.selections));
        /* recall at depth d: NaN for layers l < d, which have no layer l-d to predict from */
        for (int d = 0; d < ROUTING_DEPTHS; d++) {
            if (r.predicted[d])
                fprintf(f, " %.3f", routing_pct(r.predicted_hit[d], r.predicted[d]));
            else
                fprintf(f, " NaN");
        }
        if (r.emb_predicted)
            fprintf(f, " %.3f", routing_pct(r.emb_hit, r.emb_predicted));
        else
            fprintf(f, " NaN");
        if (r.src_predicted)
            fprintf(f, " %.3f", routing_pct(r.src_hit, r.src_predicted));
        else
            fprintf(f, " NaN");
        fprintf(f, "\n");
    }
    return outfile_commit(&of);
}
