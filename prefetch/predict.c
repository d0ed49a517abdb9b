#include "predict.h"

#include "errors.h"
#include "expert_cache.h"
#include "model.h"

int predict_ahead(struct predict *p, int layer, const float *in, int n_tok, const int32_t *first)
{
    const struct model_hparams *hp = &p->m->hp;
    size_t n = (size_t)n_tok * hp->n_expert_used;
    if (first && p->depth == 1) {
        expert_cache_predict_ahead(p->cache, first, (int)n, 1);
        return 0;
    }
    int j = 0;
    for (; j < p->depth && layer + 1 + j < (int)hp->n_layer; j++) {
        int t = layer + 1 + j;
        int rc = p->route(p->route_ctx, &p->m->layers[t], in, n_tok, p->ids + j * n,
                          p->w + j * n);
        if (rc)
            return err_set(rc, "predicting the experts of layer %d failed", t);
    }
    expert_cache_predict_ahead(p->cache, p->ids, (int)n, j);
    return 0;
}

int predict_device(struct predict *p, int layer, const float *in, int n_tok, const int32_t *first)
{
    const struct model_hparams *hp = &p->m->hp;
    size_t n = (size_t)n_tok * hp->n_expert_used;
    for (int j = 0; j < p->depth && layer + 1 + j < (int)hp->n_layer; j++) {
        int t = layer + 1 + j, rc = 0;
        const int32_t *ids = j == 0 && first ? first : p->ids + j * n;
        if (ids != first)
            rc = p->route(p->route_ctx, &p->m->layers[t], in, n_tok, p->ids + j * n, p->w + j * n);
        int np = n_tok == 1 && p->top > 0 && p->top < (int)n ? p->top : (int)n;
        rc = rc ? rc : expert_cache_prefetch_device(p->cache, t, ids, np);
        if (rc)
            return err_set(rc, "predicting the experts of layer %d failed", t);
    }
    return 0;
}
