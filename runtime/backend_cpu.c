/* backend_cpu: the op table executed at once on the host with the CPU kernels (OpenMP).
 * It is the numerical reference for the CUDA backend and the engine of CPU-only runs. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "clock.h"
#include "disk_tier.h"
#include "errors.h"
#include "matmul.h"
#include "moe.h"
#include "moe_layer.h"
#include "ops_cpu.h"
#include "ops_ssm.h"
#include "quant_ref.h"
#include "sampler.h"
#include "topo.h"
#include "tune.h"

struct backend_cpu {
    struct backend base;
    struct moe_layer *moe;   /* the MoE layer: every expert on its CPU lane */
    struct disk_tier *tier;  /* with host_budget: where the lane reads its experts */
    float *router_logits;    /* (max_tok, n_expert) */
    float *shexp;            /* shared expert scratch: (max_tok, 2 n_ff_shexp + n_embd) */
    int max_tok;
    struct backend_cpu_config cfg;
    /* the thread count, timed on the first decode steps when the caller left it open */
    struct tune tune;
    int tune_threads[TUNE_MAX];
    double tune_last; /* when the last one-token evaluation began; 0: not the step before */
    bool tuning;
    bool tune_smt; /* SMT or unknown: every thread count is timed */
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

/* q, k and v of a layer in one parallel region (matmul_run_n) where they share a type;
 * otherwise one matmul each. */
static int cpu_matmul_n(struct backend *b, int n, float *const *out, const struct weight *const *w,
                        const float *in, int m)
{
    bool same = n >= 1 && n <= MATMUL_MAX_N;
    for (int i = 1; same && i < n; i++)
        same = w[i]->type == w[0]->type && w[i]->ne[0] == w[0]->ne[0];
    if (!same) {
        for (int i = 0; i < n; i++) {
            int rc = cpu_matmul(b, out[i], w[i], in, m);
            if (rc)
                return rc;
        }
        return 0;
    }
    for (int r = 0; r < m; r += MATMUL_MAX_BATCH) {
        int rows = m - r < MATMUL_MAX_BATCH ? m - r : MATMUL_MAX_BATCH;
        struct matmul_args a[MATMUL_MAX_N];
        for (int i = 0; i < n; i++)
            a[i] = (struct matmul_args){
                .wtype = w[i]->type,
                .w = w[i]->data,
                .w_stride = w[i]->row_bytes,
                .n_in = (int64_t)w[i]->ne[0],
                .n_out = (int64_t)w[i]->ne[1],
                .m = rows,
                .x = in + (size_t)r * w[i]->ne[0],
                .x_stride = (int64_t)w[i]->ne[0],
                .y = out[i] + (size_t)r * w[i]->ne[1],
                .y_stride = (int64_t)w[i]->ne[1],
            };
        int rc = matmul_run_n(n, a);
        if (rc)
            return err_set(rc, "matmul over '%s' and %d more failed", w[0]->name, n - 1);
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

static int cpu_rope_yarn(struct backend *b, float *x, int n_tok, int n_heads, int head_dim,
                         int pos0, const struct rope_yarn *y)
{
    double freq[OPS_MAX_HEAD_DIM / 2];
    float mscale;
    (void)b;
    if (head_dim > OPS_MAX_HEAD_DIM || head_dim % 2)
        return err_set(-EINVAL, "rope: head dim %d", head_dim);
    ops_rope_yarn_freq(head_dim, y->base, y->factor, y->n_ctx_orig, y->beta_fast, y->beta_slow,
                       y->truncate, freq, &mscale);
    ops_rope_neox_freq(x, n_tok, n_heads, head_dim, pos0, freq, mscale);
    return 0;
}

static int cpu_add_bias(struct backend *b, float *x, const struct weight *bias, int rows)
{
    const float *v = bias->data;
    const size_t n = bias->ne[0];
    (void)b;
    if (bias->type)
        return err_set(-EINVAL, "bias '%s' is not F32", bias->name);
    for (int r = 0; r < rows; r++)
        for (size_t i = 0; i < n; i++)
            x[(size_t)r * n + i] += v[i];
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
        .head_dim = a->head_dim, .scale = a->scale, .window = a->window,
        .sinks = a->sinks ? (const float *)a->sinks->data : NULL,
    };
    ops_attention(&o);
    return 0;
}

static int cpu_rope_partial(struct backend *b, float *x, int n_tok, int n_heads, int head_dim,
                            int n_rot, int pos0, float base)
{
    (void)b;
    if (n_rot > head_dim || n_rot % 2 || head_dim > OPS_MAX_HEAD_DIM)
        return err_set(-EINVAL, "rope: %d of %d dims", n_rot, head_dim);
    ops_rope_neox_partial(x, n_tok, n_heads, head_dim, n_rot, pos0, base);
    return 0;
}

static int cpu_split_halves(struct backend *b, float *q, float *gate, const float *qg, int rows,
                            int hd)
{
    (void)b;
    for (int r = 0; r < rows; r++) {
        memcpy(q + (size_t)r * hd, qg + (size_t)r * 2 * hd, sizeof(float) * hd);
        memcpy(gate + (size_t)r * hd, qg + (size_t)r * 2 * hd + hd, sizeof(float) * hd);
    }
    return 0;
}

static int cpu_mul_sigmoid(struct backend *b, float *x, const float *gate, size_t n)
{
    (void)b;
    for (size_t i = 0; i < n; i++)
        x[i] *= 1.0f / (1.0f + expf(-gate[i]));
    return 0;
}

static int cpu_shared_expert(struct backend *b, float *out, const float *in,
                             const struct layer_weights *lw, int n)
{
    struct backend_cpu *c = cpu_of(b);
    const struct model_hparams *hp = &b->model->hp;
    const size_t fs = hp->n_ff_shexp, e = hp->n_embd;
    const float *gw = lw->shexp_gate_inp.data;

    if (!c->shexp)
        return err_set(-EINVAL, "shared expert: the model has none");
    for (int r0 = 0; r0 < n; r0 += c->max_tok) {
        int m = n - r0 < c->max_tok ? n - r0 : c->max_tok;
        const float *x = in + (size_t)r0 * e;
        float *g = c->shexp, *u = g + (size_t)m * fs, *d = u + (size_t)m * fs;
        int rc = cpu_matmul(b, g, &lw->gate_shexp, x, m);
        rc = rc ? rc : cpu_matmul(b, u, &lw->up_shexp, x, m);
        if (rc)
            return rc;
        for (size_t i = 0; i < (size_t)m * fs; i++)
            u[i] *= ops_silu(g[i]);
        rc = cpu_matmul(b, d, &lw->down_shexp, u, m);
        if (rc)
            return rc;
        for (int r = 0; r < m; r++) {
            const float *xr = x + (size_t)r * e;
            float dot = 0.0f;
            for (size_t i = 0; i < e; i++)
                dot += gw[i] * xr[i];
            float s = 1.0f / (1.0f + expf(-dot));
            float *o = out + (size_t)(r0 + r) * e;
            for (size_t i = 0; i < e; i++)
                o[i] += s * d[(size_t)r * e + i];
        }
    }
    return 0;
}

static int cpu_gdn(struct backend *b, const struct gdn_args *a)
{
    const struct model_hparams *hp = &b->model->hp;
    const struct layer_weights *lw = a->lw;
    const int d = (int)hp->ssm_d_state, ch = (int)(2 * hp->ssm_n_k + hp->ssm_n_v) * d;

    ops_ssm_conv(a->qkv, a->conv_state, lw->ssm_conv.data, a->n_tok, ch, (int)hp->ssm_d_conv);
    struct ops_gdn g = {
        .out = a->out,
        .qkv = a->qkv,
        .z = a->z,
        .b = a->b,
        .a = a->a,
        .ba_stride = a->ba_stride,
        .ba_grouped = a->ba_grouped,
        .a_log_neg = lw->ssm_a.data,
        .dt_bias = lw->ssm_dt_b.data,
        .norm_w = lw->ssm_norm.data,
        .state = a->ssm_state,
        .n_tok = a->n_tok,
        .n_k = (int)hp->ssm_n_k,
        .n_v = (int)hp->ssm_n_v,
        .d = d,
        .v_tiled = hp->ssm_v_tiled,
        .eps = hp->rms_eps,
    };
    ops_gdn(&g);
    return 0;
}

static int cpu_zero(struct backend *b, float *p, size_t n)
{
    (void)b;
    memset(p, 0, n * sizeof(float));
    return 0;
}

static int cpu_copy(struct backend *b, float *dst, const float *src, size_t n)
{
    (void)b;
    memcpy(dst, src, n * sizeof(float));
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
    struct moe_layer *ml = cpu_of(b)->moe;
    moe_layer_set_log(ml, a->n_tok == b->n_route_rows ? b->route_rows : NULL, b->n_route_rows);
    int rc = moe_layer_run(ml, a);
    moe_layer_set_log(ml, NULL, 0);
    return rc;
}

/* Whether some core runs two of the online processors (SMT), or that is unknown. */
static bool cpu_smt(void)
{
    struct topo *t;
    long procs = sysconf(_SC_NPROCESSORS_ONLN);
    if (procs <= 0 || topo_open(&t))
        return true;
    int cores = topo_n_cores(t);
    topo_close(t);
    return cores <= 0 || cores < procs;
}

/* Thread counts tried by the tuner: all processors, 3/4 and 1/2 of them, for hosts where fewer
 * threads decode faster (SMT siblings, a memory-bandwidth knee), all of them first. On the
 * 16-vCPU guest of bench/cpu-decode.md 16 threads decoded 45% slower than 12 while OpenMP teams
 * changed size between calls; with one team size (matmul_team) 16 are the fastest there, 12
 * 15% and 8 30% slower. Without SMT, half the threads are not timed where 3/4 already lost to
 * all of them by a clear margin (tune_drop_past_dearer): past the knee fewer threads only read
 * memory slower, and each step they run is a slow one. Fewer than 6 processors, or
 * OMP_NUM_THREADS set: none. */
static void cpu_tune_open(struct backend_cpu *c)
{
    const int n = omp_get_max_threads();
    const char *env = getenv("OMP_NUM_THREADS");
    if (c->cfg.n_threads > 0 || (env && *env) || n < 6)
        return;
    c->tune_threads[0] = n;
    c->tune_threads[1] = (3 * n + 2) / 4;
    c->tune_threads[2] = n / 2;
    c->tune_smt = cpu_smt();
    tune_init(&c->tune, 3, 0, 1, 3);
    omp_set_num_threads(c->tune_threads[c->tune.cur]);
    c->tuning = true;
}

static void cpu_eval_begin(struct backend *b, int n)
{
    struct backend_cpu *c = cpu_of(b);
    if (!c->tuning)
        return;
    const double now = clock_now_s();
    if (n == 1 && c->tune_last > 0) {
        const int prev = c->tune.cur;
        tune_observe(&c->tune, now - c->tune_last);
        if (!c->tune_smt)
            tune_drop_past_dearer(&c->tune);
        const int next = c->tune.cur;
        if (next != prev)
            omp_set_num_threads(c->tune_threads[next]);
        if (tune_decided(&c->tune)) {
            c->tuning = false;
            if (c->cfg.log) {
                char timed[160];
                int len = 0;
                for (int i = 0; i < 3; i++) {
                    char *at = timed + len;
                    size_t room = sizeof(timed) - (size_t)len;
                    len += c->tune.cost[i] > 0
                               ? snprintf(at, room, "%s%.1f ms with %d%s", i ? ", " : "",
                                          c->tune.cost[i] * 1e3, c->tune_threads[i],
                                          c->tune.cut[i] ? " (cut short)" : "")
                               : snprintf(at, room, "%s%d not timed", i ? ", " : "",
                                          c->tune_threads[i]);
                }
                fprintf(c->cfg.log,
                        "strata: threads: %d from now on (decode steps measured %s; -t sets a "
                        "count)\n",
                        c->tune_threads[next], timed);
            }
        }
    }
    c->tune_last = n == 1 ? now : 0;
}

static int cpu_read(struct backend *b, float *host, const float *src, size_t n)
{
    (void)b;
    memcpy(host, src, n * sizeof(float));
    return 0;
}

/* The argmax where the logits are, without copying them first (the vocabulary's 0.6 MB a
 * greedy decode step). */
static int cpu_read_argmax(struct backend *b, const float *x, int n, int32_t *out)
{
    (void)b;
    *out = sampler_argmax(x, n);
    return 0;
}

static void cpu_close(struct backend *b)
{
    struct backend_cpu *c = cpu_of(b);
    moe_layer_close(c->moe);
    disk_tier_close(c->tier);
    free(c->router_logits);
    free(c->shexp);
    free(c);
}

/* ---- the MoE layer's primitives: host memory, so only routing and nothing staged ---------- */

static void *cpu_moe_alloc(void *dev, size_t bytes)
{
    (void)dev;
    return malloc(bytes ? bytes : 1);
}

static void cpu_moe_free(void *dev, void *p)
{
    (void)dev;
    free(p);
}

static int cpu_moe_route(void *dev, const struct layer_weights *lw, const float *in, int n_tok,
                         int32_t *ids, float *w)
{
    struct backend_cpu *c = dev;
    const struct model_hparams *hp = &c->base.model->hp;
    int rc = cpu_matmul(&c->base, c->router_logits, &lw->router, in, n_tok);
    if (!rc && lw->router_b.data)
        rc = cpu_add_bias(&c->base, c->router_logits, &lw->router_b, n_tok);
    if (!rc)
        moe_route_softmax_topk(c->router_logits, n_tok, (int)hp->n_expert,
                               (int)hp->n_expert_used, ids, w);
    return rc;
}

static const struct moe_device_ops cpu_moe_ops = {
    .host = true,
    .alloc = cpu_moe_alloc,
    .free = cpu_moe_free,
    .route = cpu_moe_route,
};

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .matmul_n = cpu_matmul_n,
    .rope = cpu_rope,
    .rope_yarn = cpu_rope_yarn,
    .add_bias = cpu_add_bias,
    .attn_sinks_window = true,
    .rope_partial = cpu_rope_partial,
    .split_halves = cpu_split_halves,
    .mul_sigmoid = cpu_mul_sigmoid,
    .shared_expert = cpu_shared_expert,
    .gdn = cpu_gdn,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .add = cpu_add,
    .moe_ffn = cpu_moe_ffn,
    .read = cpu_read,
    .read_argmax = cpu_read_argmax,
    .eval_begin = cpu_eval_begin,
    .close = cpu_close,
};

bool backend_cpu_tier_stats(const struct backend *b, struct disk_tier_stats *out)
{
    const struct backend_cpu *c = (const struct backend_cpu *)b;
    if (!c->tier)
        return false;
    disk_tier_get_stats(c->tier, out);
    return true;
}

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
    cpu_tune_open(c);
    c->router_logits = malloc(sizeof(float) * (size_t)c->max_tok * hp->n_expert);
    if (hp->n_ff_shexp) /* gate, up and down outputs */
        c->shexp =
            malloc(sizeof(float) * (size_t)c->max_tok * (2 * (size_t)hp->n_ff_shexp + hp->n_embd));
    if (!c->router_logits || (hp->n_ff_shexp && !c->shexp)) {
        cpu_close(&c->base);
        return err_set(-ENOMEM, "cpu backend: out of memory");
    }
    if (c->cfg.host_budget) {
        struct disk_tier_config tc = {
            .host_budget = c->cfg.host_budget,
            .io = c->cfg.tier_pread ? DISK_TIER_IO_PREAD : DISK_TIER_IO_AUTO,
            .buffered = c->cfg.tier_buffered, .log = c->cfg.log,
        };
        rc = disk_tier_open(m, &tc, &c->tier);
        if (rc) {
            cpu_close(&c->base);
            return rc;
        }
    }
    struct moe_layer_config mc = {
        .max_tok = c->max_tok, .observer = c->cfg.route_observer,
        .observer_ctx = c->cfg.route_ctx, .tier = c->tier, .tier_ahead = c->cfg.tier_ahead,
    };
    rc = moe_layer_open(m, &mc, &cpu_moe_ops, c, &c->moe);
    if (rc) {
        cpu_close(&c->base);
        return err_set(rc, "cpu backend: the MoE layer");
    }
    *out = &c->base;
    return 0;
}
