/* predict: which experts the coming layers will want, known before their routing runs. The
 * router of layer l + j applied to layer l's MoE input predicts layer l + j's experts while
 * layer l computes (j = 1 .. depth); the expert cache starts copying the ones it does not hold
 * behind layer l's own copies (residency/expert_cache.h, expert_cache_predict_ahead).
 *
 * Threads: one, the MoE layer's caller; the routers run on the backend's stream through the
 * route callback (or with the layer's own, route2), and the predicted ids stay in device
 * memory until the cache reads them back with the layer's own ids (one sync for all), or, with
 * the GPU's own cache, until its prefetch kernel reads them. The admissions and copies of the
 * copy path's predictions are the prefetch worker's (pf_worker.h). */
#ifndef STRATA_PREDICT_H
#define STRATA_PREDICT_H

#include <stdint.h>

struct expert_cache;
struct model;
struct layer_weights;

/* ids, w (n_tok, k), device memory = the routing of layer lw (its router, and its bias where
 * it has one) applied to in (n_tok rows). 0 or -errno. */
typedef int (*predict_route_fn)(void *ctx, const struct layer_weights *lw, const float *in,
                                int n_tok, int32_t *ids, float *w);

struct predict {
    const struct model *m;
    struct expert_cache *cache;
    predict_route_fn route;
    void *route_ctx;
    int depth;    /* layers ahead, 1 .. EXPERT_CACHE_MAX_DEPTH */
    int top;      /* the GPU's cache, one-token calls: each token's first `top` predicted
                   * experts only (largest router weight first); 0 = all k */
    int32_t *ids; /* (depth, max_tok, k) device, owned by the caller: the predicted experts */
    float *w;     /* (depth, max_tok, k) device, owned by the caller: their weights (unused) */
};

/* Predicts the experts of layers layer + 1 .. layer + depth (those that exist) from in (n_tok
 * rows of layer's MoE input, device memory) and hands them to the cache for its next
 * prepare_copy. first: NULL, or layer + 1's routing of in (n_tok, k), device, already made
 * (with layer's own, in one launch): taken as it is at depth 1, routed again deeper (the
 * cache reads the depths back from one array). layer + 1 < n_layer. 0 or -errno. */
int predict_ahead(struct predict *p, int layer, const float *in, int n_tok, const int32_t *first);

/* The same for the GPU's own cache (expert_cache_prefetch_device): each predicted layer's
 * experts are admitted and their copies started on the device at once, nothing read back, so
 * it records into a graph. first as above, taken at any depth. 0 or -errno. */
int predict_device(struct predict *p, int layer, const float *in, int n_tok, const int32_t *first);

#endif
