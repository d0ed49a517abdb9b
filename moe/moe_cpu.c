/* moe_cpu: the CPU lane. Each selected expert runs over its token list with expert_ffn
 * (OpenMP inside), accumulating router-weighted outputs in plan order, so the sum is the same
 * for any thread count. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "expert_ffn.h"
#include "moe.h"

struct moe_cpu {
    void *scratch; /* expert_ffn scratch, sized for the largest expert types */
    size_t scratch_bytes;
    int max_tok, n_embd, n_ff;
};

int moe_cpu_open(int max_tok, int n_embd, int n_ff, struct moe_cpu **out)
{
    struct moe_cpu *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->max_tok = max_tok;
    c->n_embd = n_embd;
    c->n_ff = n_ff;
    *out = c;
    return 0;
}

void moe_cpu_close(struct moe_cpu *c)
{
    if (!c)
        return;
    free(c->scratch);
    free(c);
}

/* Grows the scratch to what expert_ffn needs for these weights. */
static int moe_cpu_scratch(struct moe_cpu *c, const struct expert_ffn_weights *w)
{
    size_t need = expert_ffn_scratch_bytes(w);
    if (need == 0)
        return -EINVAL;
    if (need <= c->scratch_bytes)
        return 0;
    free(c->scratch);
    c->scratch = NULL;
    c->scratch_bytes = 0;
    if (posix_memalign(&c->scratch, 64, need))
        return -ENOMEM;
    c->scratch_bytes = need;
    return 0;
}

int moe_cpu_run(struct moe_cpu *c, const struct moe_plan *p, const struct moe_experts *ex,
                const float *in, float *out)
{
    struct expert_ffn_weights w = {
        .gate_type = ex->gate_type, .up_type = ex->up_type, .down_type = ex->down_type,
        .n_embd = ex->n_embd, .n_ff = ex->n_ff,
    };
    int rc;

    memset(out, 0, sizeof(float) * (size_t)p->n_tok * ex->n_embd);
    for (int i = 0; i < p->n_active; i++) {
        int e = p->expert[i];
        if (p->lane[i] != MOE_LANE_CPU)
            continue;
        w.gate = ex->gate + (size_t)e * ex->gate_stride;
        w.up = ex->up + (size_t)e * ex->up_stride;
        w.down = ex->down + (size_t)e * ex->down_stride;
        rc = moe_cpu_scratch(c, &w);
        if (rc)
            return rc;
        struct expert_ffn_args a = {
            .w = &w, .n_tokens = p->offset[i + 1] - p->offset[i],
            .tokens = p->tok + p->offset[i], .token_weights = p->wt + p->offset[i],
            .x = in, .x_stride = ex->n_embd, .out = out, .out_stride = ex->n_embd,
            .scratch = c->scratch, .scratch_bytes = c->scratch_bytes,
        };
        rc = expert_ffn_run(&a);
        if (rc)
            return rc;
    }
    return 0;
}
