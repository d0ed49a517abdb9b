/* backend_cpu: the op table executed at once on the host with the CPU kernels (OpenMP).
 * It is the numerical reference for the CUDA backend and the engine of CPU-only runs. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "errors.h"
#include "matmul.h"
#include "moe.h"
#include "ops_cpu.h"
#include "quant_ref.h"

struct backend_cpu {
    struct backend base;
    struct moe_cpu *moe;     /* CPU expert lane */
    struct moe_plan plan;    /* reused every layer */
    float *router_logits;    /* (max_tok, n_expert) */
    int32_t *route_ids;      /* (max_tok, k) */
    float *route_w;          /* (max_tok, k) */
    int max_tok;
    struct backend_cpu_config cfg;
};

#define CPU_MAX_TOK 512 /* tokens per moe_ffn call; larger batches are split */

static struct backend_cpu *cpu_of(struct backend *b)
{
    return (struct backend_cpu *)b;
}

static float *cpu_alloc(struct backend *b, size_t n)
{
    float *p = NULL;
    (void)b;
    if (posix_memalign((void **)&p, 64, (n ? n : 1) * sizeof(float))) {
        err_set(-ENOMEM, "cannot allocate %zu MiB of host memory", n * sizeof(float) >> 20);
        return NULL;
    }
    memset(p, 0, n * sizeof(float));
    return p;
}

static void cpu_free(struct backend *b, float *p)
{
    (void)b;
    free(p);
}

static int cpu_embed(struct backend *b, float *out, const struct weight *w, const int32_t *ids,
                     int n)
{
    (void)b;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint64_t)ids[i] >= w->ne[1])
            return err_set(-EINVAL, "token id %d is outside the vocabulary (%llu)", ids[i],
                           (unsigned long long)w->ne[1]);
        const uint8_t *row = (const uint8_t *)w->data + (size_t)ids[i] * w->row_bytes;
        int rc = quant_ref_dequantize(w->type, row, out + (size_t)i * w->ne[0], (int64_t)w->ne[0]);
        if (rc)
            return err_set(rc, "%s: cannot dequantize type %u", w->name, w->type);
    }
    return 0;
}

static int cpu_rmsnorm(struct backend *b, float *out, const float *in, const struct weight *w,
                       int rows, int dim, float eps)
{
    (void)b;
    ops_rmsnorm(out, in, (const float *)w->data, rows, dim, eps);
    return 0;
}

/* matmul_run takes up to MATMUL_MAX_BATCH rows; larger batches (prefill) go in slices. */
static int cpu_matmul(struct backend *b, float *out, const struct weight *w, const float *in,
                      int m)
{
    (void)b;
    for (int r = 0; r < m; r += MATMUL_MAX_BATCH) {
        int n = m - r < MATMUL_MAX_BATCH ? m - r : MATMUL_MAX_BATCH;
        struct matmul_args a = {
            .wtype = w->type, .w = w->data, .w_stride = w->row_bytes,
            .n_in = (int64_t)w->ne[0], .n_out = (int64_t)w->ne[1], .m = n,
            .x = in + (size_t)r * w->ne[0], .x_stride = (int64_t)w->ne[0],
            .y = out + (size_t)r * w->ne[1], .y_stride = (int64_t)w->ne[1],
        };
        int rc = matmul_run(&a);
        if (rc)
            return err_set(rc, "matmul over '%s' (%llu rows of %llu) failed", w->name,
                           (unsigned long long)w->ne[1], (unsigned long long)w->ne[0]);
    }
    return 0;
}

static int cpu_rope(struct backend *b, float *x, int n_tok, int n_heads, int head_dim, int pos0,
                    float base)
{
    (void)b;
    ops_rope_neox(x, n_tok, n_heads, head_dim, pos0, base);
    return 0;
}

static int cpu_kv_store(struct backend *b, float *cache, const float *src, int pos0, int n_tok,
                        int width)
{
    (void)b;
    memcpy(cache + (size_t)pos0 * width, src, sizeof(float) * (size_t)n_tok * width);
    return 0;
}

static int cpu_attention(struct backend *b, const struct attn_args *a)
{
    (void)b;
    struct ops_attn o = {
        .out = a->out, .q = a->q, .k_cache = a->k_cache, .v_cache = a->v_cache,
        .pos0 = a->pos0, .n_tok = a->n_tok, .n_head = a->n_head, .n_head_kv = a->n_head_kv,
        .head_dim = a->head_dim, .scale = a->scale,
    };
    ops_attention(&o);
    return 0;
}

static int cpu_add(struct backend *b, float *x, const float *y, size_t n)
{
    (void)b;
    for (size_t i = 0; i < n; i++)
        x[i] += y[i];
    return 0;
}

static int cpu_moe_ffn(struct backend *b, const struct moe_args *a)
{
    struct backend_cpu *c = cpu_of(b);
    const struct model_hparams *hp = a->hp;
    struct moe_experts ex;
    int rc = 0;

    moe_experts_of(a->lw, a->hp, &ex);
    for (int t0 = 0; t0 < a->n_tok && !rc; t0 += c->max_tok) {
        int n = a->n_tok - t0 < c->max_tok ? a->n_tok - t0 : c->max_tok;
        const float *in = a->in + (size_t)t0 * hp->n_embd;
        rc = cpu_matmul(b, c->router_logits, &a->lw->router, in, n);
        if (rc)
            break;
        moe_route_softmax_topk(c->router_logits, n, (int)hp->n_expert, (int)hp->n_expert_used,
                               c->route_ids, c->route_w);
        if (c->cfg.route_observer) {
            struct route_event ev = {
                .layer = a->layer, .n_tok = n, .k = (int)hp->n_expert_used,
                .pos0 = a->pos0 + t0, .ids = c->route_ids, .weights = c->route_w, .in = in,
            };
            c->cfg.route_observer(c->cfg.route_ctx, &ev);
        }
        moe_plan_build(&c->plan, c->route_ids, c->route_w, n);
        rc = moe_cpu_run(c->moe, &c->plan, &ex, in, a->out + (size_t)t0 * hp->n_embd);
        if (rc)
            rc = err_set(rc, "layer %d: CPU experts failed (types %u/%u/%u)", a->layer,
                         ex.gate_type, ex.up_type, ex.down_type);
    }
    return rc;
}

static int cpu_read(struct backend *b, float *host, const float *src, size_t n)
{
    (void)b;
    memcpy(host, src, n * sizeof(float));
    return 0;
}

static void cpu_close(struct backend *b)
{
    struct backend_cpu *c = cpu_of(b);
    moe_cpu_close(c->moe);
    moe_plan_free(&c->plan);
    free(c->router_logits);
    free(c->route_ids);
    free(c->route_w);
    free(c);
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .add = cpu_add,
    .moe_ffn = cpu_moe_ffn,
    .read = cpu_read,
    .close = cpu_close,
};

int backend_cpu_open(const struct model *m, const struct backend_cpu_config *cfg,
                     struct backend **out)
{
    const struct model_hparams *hp = &m->hp;
    struct backend_cpu *c = calloc(1, sizeof(*c));
    int rc;

    if (!c)
        return err_set(-ENOMEM, "out of memory");
    c->base.ops = &cpu_ops;
    c->base.model = m;
    c->base.impl = c;
    c->max_tok = CPU_MAX_TOK;
    if (cfg)
        c->cfg = *cfg;
    if (cfg && cfg->n_threads > 0)
        omp_set_num_threads(cfg->n_threads);
    c->router_logits = malloc(sizeof(float) * (size_t)c->max_tok * hp->n_expert);
    c->route_ids = malloc(sizeof(int32_t) * (size_t)c->max_tok * hp->n_expert_used);
    c->route_w = malloc(sizeof(float) * (size_t)c->max_tok * hp->n_expert_used);
    rc = moe_plan_init(&c->plan, c->max_tok, (int)hp->n_expert_used, (int)hp->n_expert);
    if (!rc)
        rc = moe_cpu_open(c->max_tok, (int)hp->n_embd, (int)hp->n_ff_exp, &c->moe);
    if (rc || !c->router_logits || !c->route_ids || !c->route_w) {
        cpu_close(&c->base);
        return err_set(-ENOMEM, "cpu backend: out of memory");
    }
    *out = &c->base;
    return 0;
}
