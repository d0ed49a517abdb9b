/* backend_cuda_offload: the CUDA backend when experts do not all live in VRAM: the expert
 * cache under --vram-budget (residency/expert_cache.h) with its prediction and hybrid CPU lane,
 * and static placement (the first layers' experts on the CPU lane). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda_priv.h"
#include "budget.h"
#include "cuda_mem.h"
#include "cuda_ops.h"
#include "errors.h"
#include "expert_cache.h"
#include "generate.h"
#include "lane.h"
#include "membw.h"
#include "moe.h"

static int cuda_open_cpu_lane(struct backend_cuda *c);

/* Hybrid: the layer's input, routing ids and weights to the host, enqueued before the cache's
 * read-back sync so they arrive with it. */
int backend_cuda_lane_inputs(struct backend_cuda *c, const float *in, int nt, int k)
{
    size_t e = c->model->hp.n_embd;
    int rc = cuda_d2h(c->in_h, in, sizeof(float) * (size_t)nt * e, c->stream);
    rc = rc ? rc : cuda_d2h(c->ids_h, c->route_ids, sizeof(int32_t) * (size_t)nt * k, c->stream);
    rc = rc ? rc : cuda_d2h(c->w_h, c->route_w, sizeof(float) * (size_t)nt * k, c->stream);
    return rc ? backend_cuda_fail(rc, "reading the CPU lane's inputs back") : 0;
}

/* Hybrid: the experts the cache gave to the CPU, computed here while the GPU kernel (which
 * reads zeros for them) runs, and added to its output. */
int backend_cuda_lane_add(struct backend_cuda *c, const struct moe_args *ma, float *out, int nt)
{
    const int32_t *cpu;
    int n_cpu = expert_cache_cpu_experts(c->cache, &cpu), rc;
    size_t e = ma->hp->n_embd;
    struct moe_experts ex;
    if (!n_cpu)
        return 0;
    moe_experts_of(ma->lw, ma->hp, &ex);
    moe_plan_build(&c->plan, c->ids_h, c->w_h, nt);
    for (int i = 0, j = 0; i < c->plan.n_active; i++) { /* both lists ascend */
        while (j < n_cpu && cpu[j] < c->plan.expert[i])
            j++;
        c->plan.lane[i] = j < n_cpu && cpu[j] == c->plan.expert[i] ? MOE_LANE_CPU : MOE_LANE_GPU;
    }
    double t0 = generate_now();
    rc = moe_cpu_run(c->cpu_lane, &c->plan, &ex, c->in_h, c->out_h);
    c->cpu_lane_s += generate_now() - t0;
    if (rc)
        return err_set(rc, "layer %d: CPU lane experts failed", ma->layer);
    rc = cuda_h2d(c->cpu_partial, c->out_h, sizeof(float) * (size_t)nt * e, c->stream);
    rc = rc ? rc : cuda_add(out, c->cpu_partial, (size_t)nt * e, c->stream);
    return rc ? backend_cuda_fail(rc, "adding the CPU lane's experts") : 0;
}

/* Static placement: this layer's experts on the CPU. The routing stays on the GPU; its ids,
 * weights and the layer's input come to the host once, the result goes back once. */
int backend_cuda_moe_on_cpu(struct backend_cuda *c, const struct moe_args *ma, const float *in,
                           float *out, int nt)
{
    const struct model_hparams *hp = ma->hp;
    size_t k = hp->n_expert_used, e = hp->n_embd;
    struct moe_experts ex;
    int rc = cuda_d2h(c->in_h, in, sizeof(float) * (size_t)nt * e, c->stream);
    rc = rc ? rc : cuda_d2h(c->ids_h, c->route_ids, sizeof(int32_t) * (size_t)nt * k, c->stream);
    rc = rc ? rc : cuda_d2h(c->w_h, c->route_w, sizeof(float) * (size_t)nt * k, c->stream);
    rc = rc ? rc : cuda_stream_sync(c->stream);
    if (rc)
        return backend_cuda_fail(rc, "reading a CPU layer's input back");
    moe_experts_of(ma->lw, hp, &ex);
    moe_plan_build(&c->plan, c->ids_h, c->w_h, nt);
    double t0 = generate_now();
    rc = moe_cpu_run(c->cpu_lane, &c->plan, &ex, c->in_h, c->out_h);
    c->cpu_lane_s += generate_now() - t0;
    if (rc)
        return err_set(rc, "layer %d: CPU experts failed", ma->layer);
    /* pageable source: the call returns once out_h is staged, so out_h may be reused */
    rc = cuda_h2d(out, c->out_h, sizeof(float) * (size_t)nt * e, c->stream);
    return rc ? backend_cuda_fail(rc, "sending a CPU layer's output") : 0;
}

/* The next layer's router applied to this layer's MoE input: its likely experts, for the
 * cache to start streaming (reuses router_logits: this layer's top-k is already taken). */
int backend_cuda_predict_next(struct backend *b, const struct moe_args *ma, const float *in, int nt)
{
    struct backend_cuda *c = cuda_of(b);
    const struct model_hparams *hp = ma->hp;
    int rc = backend_cuda_matmul(b, c->router_logits, &c->model->layers[ma->layer + 1].router, in, nt);
    struct cuda_topk_args tk = {
        .logits = c->router_logits, .n_tok = nt, .n_expert = (int)hp->n_expert,
        .k = (int)hp->n_expert_used, .ids = c->pred_ids, .w = c->pred_w, .stream = c->stream,
    };
    rc = rc ? rc : cuda_softmax_topk(&tk);
    if (rc)
        return backend_cuda_fail(rc, "predicting the next layer's experts");
    expert_cache_predict_next(c->cache, c->pred_ids, nt * (int)hp->n_expert_used);
    return 0;
}

/* What stream_open will allocate for n_ctx positions and max_tok tokens (stream.c's sizes). */
static uint64_t cuda_stream_bytes(const struct model_hparams *hp, uint64_t n_ctx, uint64_t t)
{
    uint64_t qw = (uint64_t)hp->n_head * hp->head_dim, kvw = (uint64_t)hp->n_head_kv * hp->head_dim;
    uint64_t kv = 2 * n_ctx * kvw * hp->n_layer;
    uint64_t arena = t * hp->n_embd * 3 + t * qw * 2 + t * kvw * 2 + hp->n_vocab;
    return sizeof(float) * (kv + arena);
}

/* Static placement: the CPU lane's state, and for -1 the split itself: the experts of the last
 * layers are uploaded while they fit in what the budget leaves after the trunk, scratch and
 * the stream; the layers before them run on the CPU. */
int backend_cuda_open_static(struct backend_cuda *c, const struct backend_cuda_config *cfg)
{
    const struct model_hparams *hp = &c->model->hp;
    if (!c->static_n)
        return 0;
    if (c->static_n < 0) {
        uint64_t stream = cuda_stream_bytes(hp, cfg->n_ctx > 0 ? (uint64_t)cfg->n_ctx : 4096,
                                            cfg->max_tok > 0 ? (uint64_t)cfg->max_tok : 512);
        uint64_t used = c->weight_bytes + c->alloc_bytes + stream;
        int l = (int)hp->n_layer;
        c->static_n = 0; /* uploads below must not be skipped */
        while (l > 0) {
            const struct layer_weights *lw = &c->model->layers[l - 1];
            uint64_t need = lw->gate_exps.bytes + lw->up_exps.bytes + lw->down_exps.bytes;
            if (used + need > c->budget)
                break;
            backend_cuda_weight_upload((struct weight *)&lw->gate_exps, c);
            backend_cuda_weight_upload((struct weight *)&lw->up_exps, c);
            backend_cuda_weight_upload((struct weight *)&lw->down_exps, c);
            if (c->rc)
                return c->rc;
            used += need;
            l--;
        }
        c->static_n = l;
        if (cfg->log)
            fprintf(cfg->log,
                    "strata: static placement under %.2f GiB: experts of layers 0..%d on the CPU, "
                    "of %d..%u resident\n",
                    c->budget / 1073741824.0, l - 1, l, hp->n_layer - 1);
    }
    return c->static_n ? cuda_open_cpu_lane(c) : 0;
}

/* The CPU lane's host buffers, plan and scratch (static placement and hybrid). */
static int cuda_open_cpu_lane(struct backend_cuda *c)
{
    const struct model_hparams *hp = &c->model->hp;
    size_t t = CUDA_BACKEND_MAX_TOK, k = hp->n_expert_used;
    if (c->cpu_lane)
        return 0;
    c->in_h = malloc(sizeof(float) * t * hp->n_embd);
    c->out_h = malloc(sizeof(float) * t * hp->n_embd);
    c->ids_h = malloc(sizeof(int32_t) * t * k);
    c->w_h = malloc(sizeof(float) * t * k);
    int rc = !c->in_h || !c->out_h || !c->ids_h || !c->w_h ? -ENOMEM : 0;
    rc = rc ? rc : moe_plan_init(&c->plan, (int)t, (int)k, (int)hp->n_expert);
    rc = rc ? rc : moe_cpu_open((int)t, (int)hp->n_embd, (int)hp->n_ff_exp, &c->cpu_lane);
    return rc ? err_set(rc, "cuda backend: the CPU expert lane") : 0;
}

/* Under a budget or a slot count: the expert cache gets what the trunk, scratch and the
 * stream leave. */
int backend_cuda_open_cache(struct backend_cuda *c, const struct backend_cuda_config *cfg)
{
    const struct model_hparams *hp = &c->model->hp;
    if (!c->offload)
        return 0;
    uint64_t stream = cuda_stream_bytes(hp, cfg->n_ctx > 0 ? (uint64_t)cfg->n_ctx : 4096,
                                        cfg->max_tok > 0 ? (uint64_t)cfg->max_tok : 512);
    uint64_t fixed = c->weight_bytes + c->alloc_bytes + stream;
    struct expert_cache_config ec = {
        .n_slots = cfg->expert_slots, .max_pairs = CUDA_BACKEND_MAX_TOK * (int)hp->n_expert_used,
        .gather = cfg->gather_copies, .log = cfg->log,
    };
    if (cfg->vram_budget) {
        uint64_t trunk, slot;
        struct budget_plan plan;
        budget_model_sizes(c->model, &trunk, &slot);
        int rc = budget_plan_slots(cfg->vram_budget, c->weight_bytes, stream,
                                   c->alloc_bytes, slot, (int)hp->n_layer, &plan);
        if (rc)
            return rc;
        /* the slot tables come out of the pool too */
        uint64_t tables = (uint64_t)hp->n_layer * 3 * hp->n_expert * sizeof(void *);
        ec.pool_bytes = cfg->vram_budget - fixed > tables ? cfg->vram_budget - fixed - tables : 0;
        if (cfg->log)
            fprintf(cfg->log,
                    "strata: --vram-budget %.2f GiB: trunk %.2f GiB, KV cache and activations "
                    "%.2f GiB, scratch %.2f GiB, %.2f GiB left for expert slots\n",
                    cfg->vram_budget / 1073741824.0, c->weight_bytes / 1073741824.0,
                    stream / 1073741824.0, c->alloc_bytes / 1073741824.0,
                    ec.pool_bytes / 1073741824.0);
    }
    int rc = expert_cache_open(c->model, &ec, c->stream, &c->cache);
    if (rc || !cfg->hybrid)
        return rc;
    /* the lanes, measured now: pinned H2D, host reads by the CPU lane's threads, and the CPU's
     * arithmetic per (token, expert) pair on layer 0's experts (what bounds it in prefill) */
    struct lane_model lm = {
        .pcie_bps = cuda_h2d_bandwidth(NULL, (size_t)64 << 20, 5),
        .cpu_bps = membw_measure((size_t)256 << 20, omp_get_max_threads(), 3),
    };
    rc = cuda_open_cpu_lane(c);
    if (!rc) {
        struct moe_experts ex;
        moe_experts_of(&c->model->layers[0], hp, &ex);
        double pair = moe_cpu_pair_seconds(c->cpu_lane, &ex, (int)hp->n_expert,
                                           (int)hp->n_expert_used, 64, 3);
        lm.cpu_pair_s = pair > 0 ? pair : 0;
    }
    if (cfg->log)
        fprintf(cfg->log,
                "strata: hybrid lanes: PCIe %.1f GB/s, CPU %.1f GB/s and %.1f us per (token, "
                "expert) pair with %d threads (measured)\n",
                lm.pcie_bps / 1e9, lm.cpu_bps / 1e9, lm.cpu_pair_s * 1e6, omp_get_max_threads());
    rc = rc ? rc : cuda_malloc((void **)&c->cpu_partial,
                               sizeof(float) * CUDA_BACKEND_MAX_TOK * hp->n_embd);
    if (rc)
        return err_set(rc, "cuda backend: the hybrid CPU lane");
    c->alloc_bytes += sizeof(float) * CUDA_BACKEND_MAX_TOK * hp->n_embd;
    /* every call may split: prefill too, priced by the pair cost above */
    rc = expert_cache_set_hybrid(c->cache, &lm, CUDA_BACKEND_MAX_TOK);
    /* on unless STRATA_HYBRID_ADMIT=0 (a hook for comparing; bench/hybrid.md): without it the
     * CPU lane's experts never warm the cache */
    const char *admit = getenv("STRATA_HYBRID_ADMIT");
    if (!rc && !(admit && strcmp(admit, "0") == 0))
        expert_cache_set_hybrid_admit(c->cache, true);
    c->hybrid = rc == 0;
    return rc;
}

int backend_cuda_print_stats(const struct backend *b, FILE *f)
{
    const struct backend_cuda *c = (const struct backend_cuda *)b;
    if (c->cache)
        expert_cache_print_stats(c->cache, f);
    return 0;
}

int backend_cuda_write_stats_json(const struct backend *b, const char *path)
{
    const struct backend_cuda *c = (const struct backend_cuda *)b;
    return c->cache ? expert_cache_write_stats_json(c->cache, path) : 0;
}

double backend_cuda_cpu_lane_seconds(const struct backend *b)
{
    return ((const struct backend_cuda *)b)->cpu_lane_s;
}

int backend_cuda_cpu_moe_layers(const struct backend *b)
{
    return ((const struct backend_cuda *)b)->static_n;
}

int backend_cuda_cache_totals(const struct backend *b, struct backend_cache_totals *t)
{
    const struct backend_cuda *c = (const struct backend_cuda *)b;
    memset(t, 0, sizeof(*t));
    if (!c->cache)
        return -ENOENT;
    for (uint32_t l = 0; l < c->model->hp.n_layer; l++) {
        const struct expert_cache_layer_stats *s = expert_cache_stats(c->cache, (int)l);
        t->hits += s->hits;
        t->misses += s->misses;
        t->evictions += s->evictions;
        t->bytes_copied += s->bytes_copied;
        t->bytes_zerocopy += s->bytes_zerocopy;
        t->cpu_computed += s->cpu_computed;
        t->cpu_admitted += s->cpu_admitted;
    }
    t->slots = expert_cache_slots(c->cache);
    return 0;
}
