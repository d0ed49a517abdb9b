#include "moe.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "expert_ffn.h"
#include "model.h"

void moe_route_softmax_topk(const float *logits, int n_tok, int n_expert, int k, int32_t *ids,
                            float *w)
{
    for (int t = 0; t < n_tok; t++) {
        const float *l = logits + (size_t)t * n_expert;
        int32_t *id = ids + (size_t)t * k;
        float *wt = w + (size_t)t * k;
        float mx = -INFINITY, sum = 0.0f, sel = 0.0f;

        for (int e = 0; e < n_expert; e++)
            mx = l[e] > mx ? l[e] : mx;
        for (int e = 0; e < n_expert; e++)
            sum += expf(l[e] - mx);
        /* top-k by insertion into a sorted window (k is small) */
        int n = 0;
        for (int e = 0; e < n_expert; e++) {
            if (n == k && l[e] <= l[id[k - 1]])
                continue;
            int j = n < k ? n++ : k - 1;
            while (j > 0 && l[e] > l[id[j - 1]]) {
                id[j] = id[j - 1];
                j--;
            }
            id[j] = e;
        }
        for (int i = 0; i < k; i++) {
            wt[i] = expf(l[id[i]] - mx) / sum;
            sel += wt[i];
        }
        for (int i = 0; i < k; i++)
            wt[i] /= sel;
    }
}

int moe_plan_init(struct moe_plan *p, int max_tok, int k, int n_expert)
{
    size_t pairs = (size_t)max_tok * k;
    size_t bytes = sizeof(int32_t) * (size_t)n_expert * 3 + sizeof(int32_t) * 2 +
                   (sizeof(int32_t) + sizeof(float)) * pairs + (size_t)n_expert;
    uint8_t *m;

    memset(p, 0, sizeof(*p));
    m = calloc(1, bytes);
    if (!m)
        return -ENOMEM;
    p->mem = m;
    p->max_tok = max_tok;
    p->k = k;
    p->n_expert = n_expert;
    p->expert = (int32_t *)m;
    p->offset = p->expert + n_expert;
    p->count = p->offset + n_expert + 1;
    p->tok = p->count + n_expert + 1;
    p->wt = (float *)(p->tok + pairs);
    p->lane = (uint8_t *)(p->wt + pairs);
    return 0;
}

void moe_plan_free(struct moe_plan *p)
{
    free(p->mem);
    memset(p, 0, sizeof(*p));
}

void moe_plan_build(struct moe_plan *p, const int32_t *ids, const float *w, int n_tok)
{
    int n = 0, pos = 0;

    p->n_tok = n_tok;
    memset(p->count, 0, sizeof(int32_t) * (size_t)p->n_expert);
    for (int i = 0; i < n_tok * p->k; i++)
        p->count[ids[i]]++;
    for (int e = 0; e < p->n_expert; e++) {
        if (!p->count[e])
            continue;
        p->expert[n] = e;
        p->offset[n] = pos;
        p->lane[n] = MOE_LANE_CPU;
        pos += p->count[e];
        p->count[e] = p->offset[n]; /* becomes the fill cursor of expert e */
        n++;
    }
    p->offset[n] = pos;
    p->n_active = n;
    for (int t = 0; t < n_tok; t++) {
        for (int j = 0; j < p->k; j++) {
            int e = ids[t * p->k + j];
            int at = p->count[e]++;
            p->tok[at] = t;
            p->wt[at] = w[t * p->k + j];
        }
    }
}

void moe_experts_of(const struct layer_weights *lw, const struct model_hparams *hp,
                    struct moe_experts *ex)
{
    uint64_t n = hp->n_expert;
    *ex = (struct moe_experts){
        .gate = lw->gate_exps.data, .up = lw->up_exps.data, .down = lw->down_exps.data,
        .gate_type = lw->gate_exps.type, .up_type = lw->up_exps.type,
        .down_type = lw->down_exps.type,
        .gate_stride = lw->gate_exps.bytes / n, .up_stride = lw->up_exps.bytes / n,
        .down_stride = lw->down_exps.bytes / n,
        .n_embd = (int)hp->n_embd, .n_ff = (int)hp->n_ff_exp,
        .gate_b = lw->gate_exps_b.data, .up_b = lw->up_exps_b.data, .down_b = lw->down_exps_b.data,
        .act = hp->swiglu_oai ? EXPERT_ACT_SWIGLU_OAI : EXPERT_ACT_SILU,
    };
}
