/* predict: which experts a layer will want, known before its routing runs. The next layer's
 * router applied to this layer's MoE input predicts layer l + 1's experts while layer l
 * computes; the expert cache starts copying the ones it does not hold behind layer l's own
 * copies (residency/expert_cache.h, expert_cache_predict_next).
 *
 * Threads: one, the MoE layer's caller; the router runs on the backend's stream through the
 * route callback, and the predicted ids stay in device memory until the cache reads them back
 * with the layer's own ids (one sync for both). */
#ifndef STRATA_PREDICT_H
#define STRATA_PREDICT_H

#include <stdint.h>

struct expert_cache;
struct model;
struct weight;

/* ids, w (n_tok, k), device memory = the softmax top-k of router applied to in (n_tok rows).
 * 0 or -errno. */
typedef int (*predict_route_fn)(void *ctx, const struct weight *router, const float *in,
                                int n_tok, int32_t *ids, float *w);

struct predict {
    const struct model *m;
    struct expert_cache *cache;
    predict_route_fn route;
    void *route_ctx;
    int32_t *ids; /* (max_tok, k) device, owned by the caller: the predicted experts */
    float *w;     /* (max_tok, k) device, owned by the caller: their weights (unused) */
};

/* Predicts layer + 1's experts from in (n_tok rows of layer's MoE input, device memory) and
 * hands them to the cache for its next prepare_copy. layer + 1 < n_layer. 0 or -errno. */
int predict_next_layer(struct predict *p, int layer, const float *in, int n_tok);

#endif
