#include "arch.h"

#include <string.h>

#include "backend.h"
#include "model.h"

struct qk_rope_args arch_qk_rope_args(const struct model_hparams *hp, float *q, float *k,
                                      const float *v, int pos, int n, float *kc, float *vc)
{
    return (struct qk_rope_args){
        .q = q,
        .k = k,
        .v = v,
        .eps = hp->rms_eps,
        .rope_base = hp->rope_base,
        .pos0 = pos,
        .n_tok = n,
        .n_head = (int)hp->n_head,
        .n_head_kv = (int)hp->n_head_kv,
        .head_dim = (int)hp->head_dim,
        .k_cache = kc,
        .v_cache = vc,
    };
}

int arch_add_norm(struct backend *b, const struct model_hparams *hp, float *x, const float *y,
                  float *xn, const struct weight *w, int n)
{
    const struct backend_ops *op = b->ops;
    if (op->add_rmsnorm)
        return op->add_rmsnorm(b, x, y, xn, w, n, hp->n_embd, hp->rms_eps);
    int rc = op->add(b, x, y, (size_t)n * hp->n_embd);
    return rc ? rc : op->rmsnorm(b, xn, x, w, n, hp->n_embd, hp->rms_eps);
}

int arch_matmul_qkv(struct backend *b, float *q, float *k, float *v, const struct layer_weights *lw,
                    const float *xn, int n)
{
    const struct backend_ops *op = b->ops;
    if (op->matmul_n) {
        float *const out[3] = {q, k, v};
        const struct weight *const w[3] = {&lw->wq, &lw->wk, &lw->wv};
        return op->matmul_n(b, 3, out, w, xn, n);
    }
    int rc = op->matmul(b, q, &lw->wq, xn, n);
    rc = rc ? rc : op->matmul(b, k, &lw->wk, xn, n);
    return rc ? rc : op->matmul(b, v, &lw->wv, xn, n);
}

static const struct arch *const arch_table[] = {&arch_qwen3moe, &arch_gptoss, &arch_qwen3next,
                                                &arch_qwen35moe};

const struct arch *arch_find(const char *name)
{
    for (size_t i = 0; i < sizeof(arch_table) / sizeof(arch_table[0]); i++) {
        if (!strcmp(arch_table[i]->name, name))
            return arch_table[i];
    }
    return NULL;
}
