#include "predict.h"

#include "errors.h"
#include "expert_cache.h"
#include "model.h"

int predict_next_layer(struct predict *p, int layer, const float *in, int n_tok)
{
    const struct model_hparams *hp = &p->m->hp;
    int rc = p->route(p->route_ctx, &p->m->layers[layer + 1].router, in, n_tok, p->ids, p->w);
    if (rc)
        return err_set(rc, "predicting the experts of layer %d failed", layer + 1);
    expert_cache_predict_next(p->cache, p->ids, n_tok * (int)hp->n_expert_used);
    return 0;
}
