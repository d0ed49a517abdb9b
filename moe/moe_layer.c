#include "moe_layer.h"

#include <errno.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "clock.h"
#include "cuda_devcache.h"
#include "cuda_lane.h"
#include "disk_tier.h"
#include "errors.h"
#include "expert_cache.h"
#include "lane.h"
#include "membw.h"
#include "model.h"
#include "moe.h"
#include "pf_worker.h"
#include "predict.h"

#define ZEROCOPY_MAX_TOK EXPERT_CACHE_ZC_TOK /* larger calls (prefill) copy misses into slots */

struct moe_layer {
    const struct model *m;
    const struct moe_device_ops *ops;
    void *dev;
    struct moe_layer_config cfg;
    int32_t *route_ids; /* (max_tok, k) device: the layer's routing */
    float *route_w;     /* (max_tok, k) device */
    /* with route2: two buffers of (2 max_tok, k), the one of the layer's parity in route_ids /
     * route_w during its call, so that a prediction's listing still to run on another stream
     * reads ids the next layer's routing does not overwrite */
    int32_t *route_ids2;
    float *route_w2;
    /* placement */
    int cpu_layers;     /* experts of layers [0, cpu_layers) on the CPU lane */
    struct expert_cache *cache;
    bool hybrid, prefetch;
    int device_max_tok;  /* the GPU's own cache: larger calls take the host path */
    struct predict pred; /* pred.ids, pred.w: (max_tok, k) device, owned here */
    bool route2;         /* predictions routed with the layer's own (ops->route2) */
    struct pf_worker *pfw; /* makes the copy path's predictions after the layer's launch */
    uint64_t *pf_seen;   /* (n_layer + 1) the layer's misses and used prefetches when last seen */
    int *pf_quiet;       /* (n_layer + 1) calls of the layer before it without either */
    uint64_t n_predictions;
    /* the routing log of the forward under way (moe_layer_set_log): row r's choices at layer l
     * go to log[r][l * k ..], rows with a NULL entry or beyond n_log are not logged */
    int32_t *const *log;
    int n_log;
    uint64_t n_lookahead; /* lookahead calls, and experts they admitted */
    uint64_t lookahead_admitted;
    /* the CPU lane */
    struct moe_cpu *cpu;
    struct moe_plan plan;
    float *in_h, *out_h; /* (max_tok, n_embd) host copies of the layer's input / the lane's sum */
    int32_t *ids_h;      /* (max_tok, k) */
    float *w_h;
    float *cpu_partial;  /* (max_tok, n_embd) device: the hybrid lane's sum, added to out */
    /* experts with biases or gpt-oss's activation give a nonzero output from the zero slot the
     * GPU reads for a CPU-lane expert: hybrid then hands the GPU the weights with the CPU
     * lane's pairs at 0 */
    float *w_gpu;        /* (max_tok, k) device, or NULL */
    float *w_gpu_h;      /* (max_tok, k) host */
    uint8_t *on_cpu;     /* (n_expert) host */
    struct lane_model lanes;     /* hybrid's cost model, measured at open (cpu_bps
                                  * learned with STRATA_LANE_LEARN=1) */
    double cpu_bps_open;         /* lanes.cpu_bps as measured at open */
    double cpu_w_bytes, cpu_w_s; /* the CPU lane's calls: decayed sums of bytes and seconds */
    double cpu_bps_learned;      /* the CPU lane's rate as its calls ran (0: none yet) */
    bool lanes_given;            /* cfg.lane_*_bps set the model: nothing is learned */
    bool lanes_learn;            /* STRATA_LANE_LEARN=1: the split takes the learned rate */
    struct lane_item *items; /* (n_expert) scratch of the split */
    uint8_t *item_lane;
    double cpu_s;        /* wall seconds in the CPU lane */
    int32_t *obs_ids;    /* (max_tok, k) host: the routing handed to the observer (device) */
    float *obs_w;
    /* host tier (cfg.tier): one call's experts and their addresses */
    int32_t *tier_ids;         /* (n_expert) */
    const uint8_t **tier_got;  /* (3 n_expert) in tier_ids' order */
    const uint8_t **tier_ptrs; /* (3 n_expert) by expert id */
    int32_t *ahead_ids;        /* (max_tok, k) the next layer's predicted routing */
    float *ahead_w;
    uint8_t *ahead_seen;       /* (n_expert) */
    /* the CPU lane inside a decode graph (cfg.fill MOE_FILL_DEVICE with cfg.hybrid) */
    bool lane;       /* on */
    bool lane_ready; /* its buffers open (also for the automatic placement) */
    bool recording; /* a graph is being recorded */
    bool lane_call; /* this layer call posted to the lane: join after the experts */
    struct cuda_lane_msg *lane_msg, *lane_msg_d; /* (n_layer) host / device addresses */
    float *lane_x, *lane_x_d;                    /* (n_layer, n_embd) the layers' input rows */
    float *lane_y, *lane_y_d;                    /* (n_layer, n_embd) the CPU's sums */
    int32_t *lane_list;                          /* (n_layer, k + 1) device scratch */
    int32_t *lane_admit;  /* (n_layer, k) device: each call's experts admitted behind it */
    int lane_n_admit;     /* misses of a call admitted behind it (0..k) */
    float lane_cpu_share; /* of a call's misses, the CPU's share (cuda_lane_call) */
    uint32_t *lane_err;   /* device */
    uint8_t *lane_rec;    /* (n_layer) layers whose lane calls the recorded graph holds */
    uint64_t lane_served; /* layer calls served, and experts computed in them */
    uint64_t lane_experts;
};

/* ---- the CPU lane ------------------------------------------------------------------------- */

static void *ml_alloc(struct moe_layer *ml, size_t bytes);

static void *ml_host_alloc(struct moe_layer *ml, size_t bytes)
{
    return ml->ops->host_alloc ? ml->ops->host_alloc(ml->dev, bytes) : malloc(bytes);
}

static void ml_host_free(struct moe_layer *ml, void *p)
{
    if (ml->ops->host_free)
        ml->ops->host_free(ml->dev, p);
    else
        free(p);
}

static int ml_open_cpu_lane(struct moe_layer *ml)
{
    const struct model_hparams *hp = &ml->m->hp;
    size_t t = (size_t)ml->cfg.max_tok, k = hp->n_expert_used;
    if (ml->cpu)
        return 0;
    if (!ml->ops->host) { /* a host device's buffers are host memory already */
        /* what comes back from the device is page-locked, so that reading it back costs no
         * wait of its own (the expert cache's sync of the layer covers it); out_h stays
         * pageable: to_device may return as soon as it is staged, and the next layer's lane
         * writes it again */
        ml->in_h = ml_host_alloc(ml, sizeof(float) * t * hp->n_embd);
        ml->out_h = malloc(sizeof(float) * t * hp->n_embd);
        ml->ids_h = ml_host_alloc(ml, sizeof(int32_t) * t * k);
        ml->w_h = ml_host_alloc(ml, sizeof(float) * t * k);
        if (!ml->in_h || !ml->out_h || !ml->ids_h || !ml->w_h)
            return err_set(-ENOMEM, "the CPU expert lane: out of memory");
    }
    if (ml->cfg.tier) {
        ml->tier_ids = malloc(sizeof(int32_t) * hp->n_expert);
        ml->tier_got = calloc(3 * (size_t)hp->n_expert, sizeof(*ml->tier_got));
        ml->tier_ptrs = calloc(3 * (size_t)hp->n_expert, sizeof(*ml->tier_ptrs));
        ml->ahead_ids = malloc(sizeof(int32_t) * t * k);
        ml->ahead_w = malloc(sizeof(float) * t * k);
        ml->ahead_seen = malloc(hp->n_expert);
        if (!ml->tier_ids || !ml->tier_got || !ml->tier_ptrs || !ml->ahead_ids || !ml->ahead_w ||
            !ml->ahead_seen)
            return err_set(-ENOMEM, "the CPU expert lane: out of memory");
    }
    int rc = moe_plan_init(&ml->plan, (int)t, (int)k, (int)hp->n_expert);
    rc = rc ? rc : moe_cpu_open((int)t, (int)hp->n_embd, (int)hp->n_ff_exp, &ml->cpu);
    return rc ? err_set(rc, "the CPU expert lane") : 0;
}

/* With a host tier: the plan's CPU-lane experts made resident there, their addresses in
 * ml->tier_ptrs (indexed by expert) for ex. */
static int ml_tier_fetch(struct moe_layer *ml, const struct moe_args *a, struct moe_experts *ex)
{
    const struct moe_plan *p = &ml->plan;
    int n = 0;
    for (int i = 0; i < p->n_active; i++)
        if (p->lane[i] == MOE_LANE_CPU)
            ml->tier_ids[n++] = p->expert[i];
    int rc = disk_tier_get(ml->cfg.tier, a->layer, ml->tier_ids, n, ml->tier_got);
    for (int i = 0; !rc && i < n; i++)
        for (int q = 0; q < 3; q++)
            ml->tier_ptrs[3 * (size_t)ml->tier_ids[i] + q] = ml->tier_got[3 * (size_t)i + q];
    ex->ptrs = ml->tier_ptrs;
    return rc;
}

/* With a host tier and tier_ahead: layer + 1's router on this layer's input, and the reads of
 * the experts it picks started before this layer computes. A failed prediction only costs
 * reads. */
static void ml_tier_ahead(struct moe_layer *ml, const struct moe_args *a, const float *in_h)
{
    const struct model_hparams *hp = a->hp;
    const int nt = ml->plan.n_tok, k = (int)hp->n_expert_used;
    if (a->layer + 1 >= (int)hp->n_layer ||
        ml->ops->route(ml->dev, &ml->m->layers[a->layer + 1], in_h, nt, ml->ahead_ids,
                       ml->ahead_w))
        return;
    memset(ml->ahead_seen, 0, hp->n_expert);
    int n = 0;
    for (int i = 0; i < nt * k; i++) {
        int e = ml->ahead_ids[i];
        if (e >= 0 && e < (int)hp->n_expert && !ml->ahead_seen[e]) {
            ml->ahead_seen[e] = 1;
            ml->tier_ids[n++] = e;
        }
    }
    disk_tier_read_ahead(ml->cfg.tier, a->layer + 1, ml->tier_ids, n);
}

/* out_h (nt, n_embd) = the plan's CPU-lane experts over in_h, timed. */
static int ml_cpu_run(struct moe_layer *ml, const struct moe_args *a, const float *in_h,
                      float *out_h)
{
    struct moe_experts ex;
    moe_experts_of(a->lw, a->hp, &ex);
    if (ml->cfg.tier && ml->cache) { /* hybrid: the cache fetched every miss into the tier */
        ex.ptrs = expert_cache_tier_ptrs(ml->cache);
    } else if (ml->cfg.tier && a->layer < (int)a->hp->n_layer) { /* the MTP block: the mapping */
        int rc = ml_tier_fetch(ml, a, &ex);
        if (rc)
            return err_wrap(rc, "layer %d: ", a->layer);
        if (ml->cfg.tier_ahead)
            ml_tier_ahead(ml, a, in_h);
    }
    double t0 = clock_now_s();
    int rc = moe_cpu_run(ml->cpu, &ml->plan, &ex, in_h, out_h);
    ml->cpu_s += clock_now_s() - t0;
    if (rc)
        return err_set(rc, "layer %d: CPU experts failed (types %u/%u/%u)", a->layer,
                       ex.gate_type, ex.up_type, ex.down_type);
    return 0;
}

/* The layer's input and routing to the host buffers (enqueued; the caller syncs). */
static int ml_stage_inputs(struct moe_layer *ml, const float *in, int nt)
{
    size_t e = ml->m->hp.n_embd, k = ml->m->hp.n_expert_used;
    int rc = ml->ops->to_host(ml->dev, ml->in_h, in, sizeof(float) * (size_t)nt * e);
    rc = rc ? rc : ml->ops->to_host(ml->dev, ml->ids_h, ml->route_ids, sizeof(int32_t) * nt * k);
    rc = rc ? rc : ml->ops->to_host(ml->dev, ml->w_h, ml->route_w, sizeof(float) * nt * k);
    return rc ? err_set(rc, "reading the CPU lane's inputs back failed") : 0;
}

/* A CPU layer: every expert of the call on the CPU lane. The routing stays where it ran; on a
 * device, its ids, weights and the layer's input come to the host once and the result goes
 * back once. */
static int ml_run_cpu_layer(struct moe_layer *ml, const struct moe_args *a, const float *in,
                            float *out, int nt)
{
    if (ml->ops->host) {
        moe_plan_build(&ml->plan, ml->route_ids, ml->route_w, nt);
        return ml_cpu_run(ml, a, in, out);
    }
    int rc = ml_stage_inputs(ml, in, nt);
    rc = rc ? rc : ml->ops->sync(ml->dev);
    if (rc)
        return err_set(rc, "layer %d: reading a CPU layer's input back failed", a->layer);
    moe_plan_build(&ml->plan, ml->ids_h, ml->w_h, nt);
    rc = ml_cpu_run(ml, a, ml->in_h, ml->out_h);
    rc = rc ? rc : ml->ops->to_device(ml->dev, out, ml->out_h, sizeof(float) * nt * a->hp->n_embd);
    return rc;
}

/* Hybrid: the CPU lane's rate as its calls ran. The rate measured at open is the host's read
 * bandwidth, which the expert kernels reach only in part (on the H200 machine's 16 vCPUs they
 * stop scaling past 8-12 threads, bench/cpu-decode.md). Each call's seconds, less its pairs'
 * arithmetic (cpu_pair_s), over its experts' bytes is a sample; the rate is the ratio of their
 * sums, each older call weighing 0.9 less (through the origin: a call's fixed cost counts as
 * bytes), never above the measured bandwidth. --stats prints it; the split takes it only with
 * STRATA_LANE_LEARN=1: on the 30b-a3b preset it decoded 12% faster at 8 GiB and 6% slower at
 * 4 GiB, where hybrid is the fastest placement (bench/hybrid.md). The split balances copies
 * against the CPU lane, while the CPU lane also overlaps the GPU's own expert kernel, so the
 * optimistic rate makes up for that slack. Nothing is learned with the lanes given (tests
 * want a fixed split). */
static void ml_learn_cpu(struct moe_layer *ml, const struct moe_args *a, double seconds)
{
    const struct moe_plan *p = &ml->plan;
    int n = 0, pairs = 0;
    for (int i = 0; i < p->n_active; i++)
        if (p->lane[i] == MOE_LANE_CPU)
            n++, pairs += p->offset[i + 1] - p->offset[i];
    if (ml->lanes_given || n == 0 || !(seconds > 0))
        return;
    const struct layer_weights *lw = a->lw;
    double bytes = (double)(lw->gate_exps.bytes + lw->up_exps.bytes + lw->down_exps.bytes) /
                   a->hp->n_expert * n;
    double s = seconds - pairs * ml->lanes.cpu_pair_s;
    s = s > 0.1 * seconds ? s : 0.1 * seconds;
    ml->cpu_w_bytes = 0.9 * ml->cpu_w_bytes + bytes;
    ml->cpu_w_s = 0.9 * ml->cpu_w_s + s;
    double rate = ml->cpu_w_bytes / ml->cpu_w_s;
    ml->cpu_bps_learned = rate < ml->cpu_bps_open ? rate : ml->cpu_bps_open;
    if (ml->lanes_learn)
        ml->lanes.cpu_bps = ml->cpu_bps_learned;
}

/* Hybrid: the experts the cache gave to the CPU, computed here while the GPU kernel (which
 * reads zeros for them) runs, and added to its output. */
static int ml_hybrid_add(struct moe_layer *ml, const struct moe_args *a, float *out, int nt)
{
    const int32_t *cpu;
    int n_cpu = expert_cache_cpu_experts(ml->cache, &cpu);
    size_t e = a->hp->n_embd;
    if (!n_cpu)
        return 0;
    moe_plan_build(&ml->plan, ml->ids_h, ml->w_h, nt);
    for (int i = 0, j = 0; i < ml->plan.n_active; i++) { /* both lists ascend */
        while (j < n_cpu && cpu[j] < ml->plan.expert[i])
            j++;
        ml->plan.lane[i] = j < n_cpu && cpu[j] == ml->plan.expert[i] ? MOE_LANE_CPU : MOE_LANE_GPU;
    }
    double s0 = ml->cpu_s;
    int rc = ml_cpu_run(ml, a, ml->in_h, ml->out_h);
    if (!rc)
        ml_learn_cpu(ml, a, ml->cpu_s - s0);
    rc = rc ? rc : ml->ops->to_device(ml->dev, ml->cpu_partial, ml->out_h, sizeof(float) * nt * e);
    rc = rc ? rc : ml->ops->add(ml->dev, out, ml->cpu_partial, (size_t)nt * e);
    return rc ? err_set(rc, "layer %d: adding the CPU lane's experts failed", a->layer) : 0;
}

/* Hybrid with biased experts: the routing weights for the GPU's kernel, with the pairs of the
 * CPU lane's experts at 0 (their zero slots would add biases); the host routing was read back
 * under the cache's sync. */
static int ml_hybrid_gpu_weights(struct moe_layer *ml, int nt)
{
    const int32_t *cpu;
    int n_cpu = expert_cache_cpu_experts(ml->cache, &cpu);
    const int n_expert = (int)ml->m->hp.n_expert, pairs = nt * (int)ml->m->hp.n_expert_used;
    memset(ml->on_cpu, 0, (size_t)n_expert);
    for (int i = 0; i < n_cpu; i++)
        if (cpu[i] >= 0 && cpu[i] < n_expert)
            ml->on_cpu[cpu[i]] = 1;
    for (int i = 0; i < pairs; i++) {
        int e = ml->ids_h[i];
        ml->w_gpu_h[i] = e >= 0 && e < n_expert && ml->on_cpu[e] ? 0.0f : ml->w_h[i];
    }
    int rc = ml->ops->to_device(ml->dev, ml->w_gpu, ml->w_gpu_h, sizeof(float) * (size_t)pairs);
    return rc ? err_set(rc, "the GPU's share of the hybrid routing") : 0;
}

/* The cache's split of a call's misses: lane_assign over the lane model measured at open. */
static void ml_split(void *ctx, int layer, const int32_t *miss_ids, int n_miss,
                     const int32_t *pair_count, uint64_t expert_bytes, uint8_t *to_cpu)
{
    struct moe_layer *ml = ctx;
    (void)layer;
    for (int i = 0; i < n_miss; i++)
        ml->items[i] = (struct lane_item){expert_bytes, pair_count[miss_ids[i]]};
    lane_assign(&ml->lanes, ml->items, n_miss, ml->item_lane);
    for (int i = 0; i < n_miss; i++)
        to_cpu[i] = ml->item_lane[i] == MOE_LANE_CPU;
}

/* ---- one layer ---------------------------------------------------------------------------- */

/* Cache placement: hits from slots; misses copied, read in place or given to the CPU lane. */
/* Whether to predict layer t's experts in this call of layer t - 1. A layer that went
 * MOE_PREFETCH_QUIET decode calls without a miss or a used prefetch (all its experts resident:
 * a budget that holds nearly every expert) is not predicted until it misses again: the
 * predictor's router, read-back and copies cost each layer more than the rare miss they save
 * (W1-real at 2 GiB, 98.9% hits: 0.89x the plain cache with prediction at every layer). Prompt
 * calls are always predicted. */
static bool ml_predict_worth(struct moe_layer *ml, int t, int nt)
{
    const struct expert_cache_layer_stats *st = expert_cache_stats(ml->cache, t);
    uint64_t act = st->misses + st->prefetch_used;
    if (act != ml->pf_seen[t]) {
        ml->pf_seen[t] = act;
        ml->pf_quiet[t] = 0;
    } else if (ml->pf_quiet[t] < MOE_PREFETCH_QUIET) {
        ml->pf_quiet[t]++;
    }
    return nt > 1 || ml->pf_quiet[t] < MOE_PREFETCH_QUIET;
}

/* Whether a cached layer's one-token call may select its experts from the router's logits
 * (ml_selects: in the GPU's own cache's lookup, or in the expert kernels of zero-copy misses):
 * STRATA_CACHE_SELECT=0 in the environment keeps the top-k launch before them (for
 * comparisons; the same bits). Decided once. */
static bool ml_select_env(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("STRATA_CACHE_SELECT");
        on = !(v && v[0] == '0');
    }
    return on;
}

/* Whether a call of nt tokens at this layer serves its misses in place (b). */
static bool ml_zerocopy(const struct moe_layer *ml, int nt)
{
    return ml->cache && !ml->hybrid && ml->cfg.fill == MOE_FILL_ZEROCOPY && nt <= ZEROCOPY_MAX_TOK;
}

/* Tokens of a call above which the GPU's own cache hands a call to the host path:
 * ML_DEVICE_MAX_TOK, or STRATA_DEVCACHE_HOST_TOK from the environment when the layer opens
 * (1..4096; for tests). Lockstep steps of many streams and drafts stay below it. */
#define ML_DEVICE_MAX_TOK 128
static int ml_device_max_tok_env(void)
{
    const char *v = getenv("STRATA_DEVCACHE_HOST_TOK");
    int x = v ? atoi(v) : 0;
    return x >= 1 && x <= 4096 ? x : ML_DEVICE_MAX_TOK;
}

/* Predicted experts copied per token: cfg's, else the first half of the k (largest router
 * weight first): on the shipped model's routing the first four of eight are selected 72-97% of
 * the time and the last four 38-61%, and at 1 GiB copying only the first four cut the bytes
 * prefetched in vain from 28.8% to 12.3% with the GPU's cache and decoded faster
 * (bench/profiles.md). */
static int ml_prefetch_top(const struct moe_layer_config *cfg, const struct model_hparams *hp)
{
    return cfg->prefetch_top > 0 ? cfg->prefetch_top : ((int)hp->n_expert_used + 1) / 2;
}

/* Whether this call of a cached layer may predict the next layer's experts: the GPU's own cache
 * on decode-sized calls does, the host paths but (b) do where ml_predict_worth then says so. */
static bool ml_may_predict(const struct moe_layer *ml, const struct moe_args *a, int nt)
{
    return ml->cache && ml->prefetch && a->layer + 1 < (int)a->hp->n_layer &&
           a->layer >= ml->cpu_layers && !ml_zerocopy(ml, nt);
}

/* Whether a call of nt tokens routes by route_logits, the experts selected from the router's
 * logits by the experts call (all resident, or zero-copy misses whose routing goes to the
 * step's slice, read back after the step) or by the GPU's own cache's lookup: one token, no
 * prediction, nothing reading the routing before them. */
static bool ml_selects(const struct moe_layer *ml, const struct moe_args *a, int nt, bool slice)
{
    if (!ml->ops->route_logits || nt != 1 || a->layer >= (int)a->hp->n_layer || ml->hybrid ||
        ml->cfg.observer || ml->log || a->layer < ml->cpu_layers)
        return false;
    if (!ml->cache)
        return true;
    if (ml_zerocopy(ml, nt))
        return slice && ml_select_env();
    return ml->cfg.fill == MOE_FILL_DEVICE && nt <= ml->device_max_tok &&
           !ml_may_predict(ml, a, nt) && ml_select_env() &&
           a->hp->n_expert <= CUDA_DEVCACHE_SELECT_MAX && a->hp->n_expert_used <= 32;
}

/* pred: ml_may_predict; ahead: NULL, or the next layer's routing of this call's tokens, made
 * with this layer's (route2) */
static int ml_run_cached(struct moe_layer *ml, const struct moe_args *a, const float *in, int nt,
                         int32_t *ids, bool pred, const int32_t *ahead, const float *logits,
                         struct expert_tables *tab)
{
    int pairs = nt * (int)a->hp->n_expert_used, rc = 0;
    bool zc = ml_zerocopy(ml, nt);
    /* the GPU's own cache serves decode-sized calls; a prompt (nearly every expert of the
     * layer: copies are all it does) takes the host path, the device giving the slots back
     * until the next decode call takes them again */
    if (ml->cfg.fill == MOE_FILL_DEVICE && nt > ml->device_max_tok)
        rc = expert_cache_device_stop(ml->cache);
    else if (ml->cfg.fill == MOE_FILL_DEVICE) { /* then the next layers' predicted experts */
        /* in a recorded one-token step under the lane, misses take no slot: the CPU lane
         * computes them (ml_lane_post, after the lookup) */
        ml->lane_call = ml->lane && ml->recording && nt == 1;
        expert_cache_device_admit(ml->cache, !ml->lane_call);
        rc = logits ? expert_cache_prepare_device_select(ml->cache, a->layer, logits, ids,
                                                         ml->route_w, pairs, tab)
                    : expert_cache_prepare_device(ml->cache, a->layer, ids, pairs, tab);
        if (!rc && pred) {
            rc = predict_device(&ml->pred, a->layer, in, nt, ahead);
            ml->n_predictions++;
        }
        return rc;
    }
    /* the CPU lane's inputs, read back under the cache's own sync */
    if (ml->hybrid)
        rc = ml_stage_inputs(ml, in, nt);
    if (!rc && pred && ml_predict_worth(ml, a->layer + 1, nt)) {
        rc = predict_ahead(&ml->pred, a->layer, in, nt, ahead);
        ml->n_predictions++;
    }
    if (rc)
        return rc;
    return zc ? expert_cache_prepare_zerocopy(ml->cache, a->layer, ids, pairs, tab)
              : expert_cache_prepare_copy(ml->cache, a->layer, ids, pairs, tab);
}

/* ---- the CPU lane inside a decode graph (cuda_lane.h) ------------------------------------ */

static int ml_lane_serve_cb(void *ctx, int layer);

/* The layer's post (join false) or join in the graph being recorded. */
static int ml_lane_call(struct moe_layer *ml, const struct moe_args *a, const int32_t *ids,
                        const float *in, float *out, bool join)
{
    const struct model_hparams *hp = a->hp;
    const int l = a->layer, k = (int)hp->n_expert_used;
    struct expert_cache_lane_view v;
    int rc = expert_cache_lane_view(ml->cache, l, &v);
    if (rc)
        return rc;
    struct cuda_lane_call c = {
        .ids = ids,
        .w = ml->route_w,
        .k = k,
        .n_expert = (int)hp->n_expert,
        .n_embd = (int)hp->n_embd,
        .slot_of = v.slot_of,
        .tab = v.tab,
        .zero = v.zero,
        .x = in,
        .out = out,
        .msg = ml->lane_msg_d + l,
        .xh = ml->lane_x_d + (size_t)l * hp->n_embd,
        .yh = ml->lane_y_d + (size_t)l * hp->n_embd,
        .list = ml->lane_list + (size_t)l * (k + 1),
        .err = ml->lane_err,
        .cpu_share = ml->lane_cpu_share,
        .admit = ml->lane_n_admit ? ml->lane_admit + (size_t)l * k : NULL,
        .n_admit = ml->lane_n_admit,
        .layer = l,
    };
    for (int p = 0; p < 3; p++) {
        c.mapped[p] = v.mapped[p];
        c.stride[p] = v.stride[p];
    }
    c.serve = ml_lane_serve_cb; /* called by a device that is host memory only */
    c.serve_ctx = ml;
    rc = ml->ops->lane(ml->dev, &c, join);
    if (rc)
        return err_set(rc, "layer %d: the CPU lane's %s in the graph", l, join ? "join" : "post");
    ml->lane_rec[l] = 1;
    /* after the join (which points the CPU's experts back at host memory): the first
     * lane_n_admit of them admitted into slots for the layer's next calls and copied on the
     * prefetch stream, beside the next layers' work */
    if (join && c.admit)
        rc = expert_cache_admit_device(ml->cache, l, c.admit, k);
    return rc;
}

/* Layer l's message of step seq: its CPU experts computed into its y row, then done set. */
static int ml_lane_serve_layer(struct moe_layer *ml, int l, uint32_t seq, bool compute)
{
    const struct model_hparams *hp = &ml->m->hp;
    struct cuda_lane_msg *m = &ml->lane_msg[l];
    const int k = (int)hp->n_expert_used;
    const unsigned n_cpu = (unsigned)(__atomic_load_n(&m->tag, __ATOMIC_ACQUIRE) & 0xFF);
    int rc = 0;
    if (compute && n_cpu) {
        moe_plan_build(&ml->plan, m->ids, m->w, 1);
        for (int i = 0; i < ml->plan.n_active; i++) {
            ml->plan.lane[i] = MOE_LANE_GPU;
            for (int j = 0; j < k; j++)
                if (m->cpu[j] && m->ids[j] == ml->plan.expert[i])
                    ml->plan.lane[i] = MOE_LANE_CPU;
        }
        struct moe_args a = {.n_tok = 1, .layer = l, .lw = &ml->m->layers[l], .hp = hp};
        double s0 = ml->cpu_s;
        rc = ml_cpu_run(ml, &a, ml->lane_x + (size_t)l * hp->n_embd,
                        ml->lane_y + (size_t)l * hp->n_embd);
        if (!rc)
            ml_learn_cpu(ml, &a, ml->cpu_s - s0);
        ml->lane_served++;
        ml->lane_experts += n_cpu;
    }
    __atomic_store_n(&m->done, seq, __ATOMIC_RELEASE);
    return rc;
}

/* Waits for layer l's message of step seq: 0, or -ETIMEDOUT after 10 s. */
static int ml_lane_wait(const struct cuda_lane_msg *m, uint32_t seq)
{
    double t0 = 0;
    for (unsigned spin = 0; (uint32_t)(__atomic_load_n(&m->tag, __ATOMIC_ACQUIRE) >> 8) != seq;
         spin++) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        if ((spin & 0xFFFF) == 0xFFFF) {
            double t = clock_now_s();
            t0 = t0 > 0 ? t0 : t;
            if (t - t0 > 10.0)
                return -ETIMEDOUT;
        }
    }
    return 0;
}

/* cuda_lane_call.serve of a device that is host memory: the join's wait, served in place */
static int ml_lane_serve_cb(void *ctx, int layer)
{
    struct moe_layer *ml = ctx;
    const struct cuda_lane_msg *m = &ml->lane_msg[layer];
    return ml_lane_serve_layer(ml, layer, (uint32_t)(m->tag >> 8), true);
}

bool moe_layer_lane_on(const struct moe_layer *ml)
{
    return ml && ml->lane;
}

int moe_layer_lane_serve(struct moe_layer *ml, uint32_t seq)
{
    int rc = 0;
    if (!ml || !ml->lane)
        return 0;
    for (int l = 0; l < (int)ml->m->hp.n_layer; l++) {
        struct cuda_lane_msg *m = &ml->lane_msg[l];
        if (!ml->lane_rec[l] || __atomic_load_n(&m->done, __ATOMIC_ACQUIRE) == seq)
            continue;
        int w = ml_lane_wait(m, seq);
        if (w && !rc)
            rc = err_set(w,
                         "layer %d: the GPU did not post the CPU lane's experts of step %u "
                         "within 10 s",
                         l, seq);
        int s = ml_lane_serve_layer(ml, l, seq, !rc);
        rc = rc ? rc : s;
    }
    return rc;
}

/* Every miss of a layer call is a candidate for a slot behind the call (STRATA_LANE_ADMIT in
 * the environment: at most that many, 0..k), admitted where it is used at least as often as
 * its victim (cuda_devcache_call.gate) and copied on the prefetch stream while the next layers
 * run. Of the misses the CPU computes ML_LANE_CPU_SHARE (STRATA_LANE_CPU_SHARE: (0, 1]), the
 * expert kernels read the rest in place. */
#define ML_LANE_CPU_SHARE 1.0f

/* The lane's buffers: a message and two rows a layer in page-locked host memory the device
 * maps, the experts' lists on the device. */
static int ml_open_lane(struct moe_layer *ml)
{
    const struct model_hparams *hp = &ml->m->hp;
    const struct layer_weights *lw0 = &ml->m->layers[0];
    const size_t nl = hp->n_layer, ne = hp->n_embd, k = hp->n_expert_used;
    void *d = NULL;
    if (!ml->ops->lane || !ml->ops->mapped_alloc)
        return err_set(-ENOTSUP, "this device has no CPU lane inside its decode graph");
    if (ml->cfg.tier || ml->cfg.prefetch || k > CUDA_LANE_MAX_K ||
        hp->n_expert > CUDA_DEVCACHE_MAX_EXPERT)
        return err_set(-ENOTSUP,
                       "hybrid under the GPU's own cache (--residency gpu) runs "
                       "without a host tier or prediction, for at most %d of %d "
                       "experts a token",
                       CUDA_LANE_MAX_K, CUDA_DEVCACHE_MAX_EXPERT);
    if (hp->swiglu_oai || lw0->gate_exps_b.data || lw0->down_exps_b.data)
        return err_set(-ENOTSUP, "hybrid under the GPU's own cache: experts with biases or "
                                 "gpt-oss's activation are not computed from zero slots");
    int rc = ml_open_cpu_lane(ml);
    if (rc)
        return rc;
    /* the host's read bandwidth with the lane's threads: the ceiling of the rate --stats
     * reports as the lane's calls run (ml_learn_cpu) */
    if (!ml->hybrid && !ml->cfg.modes) { /* else ml_open_hybrid measured it */
        ml->lanes_given = ml->cfg.lane_cpu_bps > 0;
        ml->lanes.cpu_bps = ml->cpu_bps_open =
            ml->lanes_given ? ml->cfg.lane_cpu_bps
                            : membw_measure((size_t)256 << 20, omp_get_max_threads(), 3);
    }
    ml->lane_msg = ml->ops->mapped_alloc(ml->dev, sizeof(struct cuda_lane_msg) * nl, &d);
    ml->lane_msg_d = d;
    ml->lane_x = ml->ops->mapped_alloc(ml->dev, sizeof(float) * nl * ne, &d);
    ml->lane_x_d = d;
    ml->lane_y = ml->ops->mapped_alloc(ml->dev, sizeof(float) * nl * ne, &d);
    ml->lane_y_d = d;
    ml->lane_list = ml_alloc(ml, sizeof(int32_t) * nl * (k + 1));
    ml->lane_err = ml_alloc(ml, sizeof(uint32_t));
    ml->lane_admit = ml_alloc(ml, sizeof(int32_t) * nl * k);
    const char *na = getenv("STRATA_LANE_ADMIT"), *cs = getenv("STRATA_LANE_CPU_SHARE");
    ml->lane_n_admit = na && *na ? atoi(na) : (int)k;
    ml->lane_cpu_share = cs && *cs ? (float)atof(cs) : ML_LANE_CPU_SHARE;
    ml->lane_cpu_share =
        ml->lane_cpu_share > 0 && ml->lane_cpu_share <= 1 ? ml->lane_cpu_share : 1.0f;
    ml->lane_n_admit = ml->lane_n_admit < 0        ? 0
                       : ml->lane_n_admit > (int)k ? (int)k
                                                   : ml->lane_n_admit;
    ml->lane_rec = calloc(nl, 1);
    if (!ml->lane_msg || !ml->lane_x || !ml->lane_y || !ml->lane_list || !ml->lane_err ||
        !ml->lane_rec || !ml->lane_admit)
        return err_set(-ENOMEM, "the CPU lane inside the decode graph: out of memory");
    memset(ml->lane_msg, 0, sizeof(struct cuda_lane_msg) * nl);
    uint32_t zero = 0;
    rc = ml->ops->to_device(ml->dev, ml->lane_err, &zero, sizeof(zero));
    rc = rc ? rc : ml->ops->sync(ml->dev);
    if (rc)
        return err_set(rc, "the CPU lane inside the decode graph");
    ml->lane_ready = true;
    if (ml->cfg.log && !ml->cfg.modes)
        fprintf(ml->cfg.log,
                "strata: hybrid under the GPU's own cache: in graph decode steps the CPU lane "
                "(%d threads) computes %.0f%% of the misses, the GPU reads the rest in place; "
                "up to %d of each call's then copied into slots behind it where used at least "
                "as often as their victims\n",
                omp_get_max_threads(), 100.0 * ml->lane_cpu_share, ml->lane_n_admit);
    return 0;
}

/* Whether a call of nt tokens at this layer leaves its routing in host memory: the host's own
 * routing, or the copy path's read-back. */
static const int32_t *ml_host_ids(const struct moe_layer *ml, int layer, int nt, const int32_t *ids)
{
    if (ml->ops->host)
        return ids;
    if (ml->cache && layer >= ml->cpu_layers && !ml_zerocopy(ml, nt) &&
        !expert_cache_on_device(ml->cache))
        return expert_cache_host_ids(ml->cache, layer);
    return NULL;
}

/* Rows t0 .. t0 + nt of the forward: their choices at this layer into the routing log. */
static void ml_log(struct moe_layer *ml, const struct moe_args *a, int t0, int nt,
                   const int32_t *ids)
{
    const int k = (int)a->hp->n_expert_used;
    const int32_t *h = ml_host_ids(ml, a->layer, nt, ids);
    if (!h)
        return;
    for (int r = 0; r < nt && t0 + r < ml->n_log; r++)
        if (ml->log[t0 + r])
            memcpy(ml->log[t0 + r] + (size_t)a->layer * k, h + (size_t)r * k,
                   sizeof(int32_t) * (size_t)k);
}

void moe_layer_set_log(struct moe_layer *ml, int32_t *const *rows, int n)
{
    ml->log = n > 0 ? rows : NULL;
    ml->n_log = n > 0 ? n : 0;
}

int moe_layer_lookahead(struct moe_layer *ml, const int32_t *ids, int n)
{
    /* not under hybrid: its CPU lane serves misses without PCIe, and the lookahead's copies
     * took slots from experts the lane's own admissions kept (the H200, W1-real at 1 GiB:
     * plain decode's hit rate 73% with it against 78-80% without; bench/speculative.md) */
    if (!ml->cache || ml->hybrid || ml->cpu_layers || ml->cfg.fill == MOE_FILL_ZEROCOPY ||
        ml->cfg.fill == MOE_FILL_DEVICE)
        return 0;
    int rc = expert_cache_lookahead(ml->cache, ids, n);
    if (rc < 0)
        return rc;
    ml->n_lookahead++;
    ml->lookahead_admitted += (uint64_t)rc;
    return rc;
}

/* The observer gets the routing in host memory: read back (a sync) on a device. */
static int ml_observe(struct moe_layer *ml, const struct moe_args *a, const float *in, int nt,
                      int t0, const int32_t *ids)
{
    size_t pairs = (size_t)nt * a->hp->n_expert_used;
    struct moe_route_event ev = {
        .layer = a->layer,
        .n_tok = nt,
        .k = (int)a->hp->n_expert_used,
        .pos0 = a->pos0 + t0,
        .ids = ids,
        .weights = ml->route_w,
        .in = in,
    };
    if (!ml->ops->host) {
        int rc = ml->ops->to_host(ml->dev, ml->obs_ids, ids, sizeof(int32_t) * pairs);
        rc = rc ? rc : ml->ops->to_host(ml->dev, ml->obs_w, ml->route_w, sizeof(float) * pairs);
        rc = rc ? rc : ml->ops->sync(ml->dev);
        if (rc)
            return err_set(rc, "reading layer %d's routing back for its observer", a->layer);
        ev.ids = ml->obs_ids;
        ev.weights = ml->obs_w;
        ev.in = NULL;
    }
    ml->cfg.observer(ml->cfg.observer_ctx, &ev);
    return 0;
}

int moe_layer_run(struct moe_layer *ml, const struct moe_args *a)
{
    const struct model_hparams *hp = a->hp;
    /* the MTP block (layer n_layer): outside the cache, the tier and the statistics; its
     * experts are resident on a device (uploaded with the trunk), on the CPU lane on a host */
    const bool mtp = a->layer >= (int)hp->n_layer;
    int rc = 0;

    for (int t0 = 0; t0 < a->n_tok && !rc; t0 += ml->cfg.max_tok) {
        int nt = a->n_tok - t0 < ml->cfg.max_tok ? a->n_tok - t0 : ml->cfg.max_tok;
        const float *in = a->in + (size_t)t0 * hp->n_embd;
        float *out = a->out + (size_t)t0 * hp->n_embd;
        /* (b) in decode: the layer's own slice, read back with the others once per step */
        int32_t *ids = ml->route_ids, *slice = NULL;
        if (!mtp && a->layer >= ml->cpu_layers && ml_zerocopy(ml, nt))
            slice = expert_cache_zc_ids(ml->cache, a->layer, nt * (int)hp->n_expert_used);
        if (ml->route_ids2) {
            const size_t off = (size_t)(a->layer & 1) * 2 * ml->cfg.max_tok * hp->n_expert_used;
            ids = ml->route_ids = ml->route_ids2 + off;
            ml->route_w = ml->route_w2 + off;
        }
        ids = slice ? slice : ids;
        /* with a prediction to make, the next layer's router from the same launch where the
         * backend has one (route2): its routing lands after this layer's */
        const bool pred = !mtp && ml_may_predict(ml, a, nt);
        const int32_t *ahead = NULL;
        const float *logits = NULL;
        if (ml_selects(ml, a, nt, slice != NULL)) {
            rc = ml->ops->route_logits(ml->dev, a->lw, in, nt, &logits);
        } else if (pred && ml->route2 && !slice &&
                   (ml->cfg.fill == MOE_FILL_DEVICE || ml->pred.depth == 1)) {
            rc = ml->ops->route2(ml->dev, a->lw, &ml->m->layers[a->layer + 1], in, nt, ids,
                                 ml->route_w);
            ahead = ids + (size_t)nt * hp->n_expert_used;
        } else {
            rc = ml->ops->route(ml->dev, a->lw, in, nt, ids, ml->route_w);
        }
        if (rc)
            break;
        if (ml->cfg.observer && !mtp && (rc = ml_observe(ml, a, in, nt, t0, ids)))
            break;
        if (ml->log && !mtp && ml->ops->host) /* on a device: after the cache read it back */
            ml_log(ml, a, t0, nt, ids);
        if (mtp ? ml->ops->host : a->layer < ml->cpu_layers) {
            rc = ml_run_cpu_layer(ml, a, in, out, nt);
            continue;
        }
        struct expert_tables tab = {0};
        if (ml->cache && !mtp &&
            (rc = ml_run_cached(ml, a, in, nt, ids, pred, ahead, logits, &tab)))
            break;
        if (ml->cache && !slice) /* the GPU's own lookup selected them */
            logits = NULL;
        if (ml->log && !mtp && !ml->ops->host)
            ml_log(ml, a, t0, nt, ids);
        struct moe_expert_call call = {
            .out = out,
            .in = in,
            .n_tok = nt,
            .layer = a->layer,
            .ids = ids,
            .w = ml->route_w,
            .logits = logits,
            .select_ids = logits ? ids : NULL,
            .select_w = logits ? ml->route_w : NULL,
            .lw = a->lw,
            .gate = tab.gate,
            .up = tab.up,
            .down = tab.down,
        };
        if (ml->hybrid && ml->w_gpu && !mtp) {
            if ((rc = ml_hybrid_gpu_weights(ml, nt)))
                break;
            call.w = ml->w_gpu;
        }
        const bool lane = ml->lane_call && !mtp;
        ml->lane_call = false;
        if (lane && (rc = ml_lane_call(ml, a, ids, in, out, false)))
            break;
        rc = ml->ops->experts(ml->dev, &call);
        if (!rc && lane)
            rc = ml_lane_call(ml, a, ids, in, out, true);
        if (!rc && ml->pfw) /* the next layers' predicted experts, beside this layer's work */
            rc = pf_worker_kick(ml->pfw);
        if (!rc && ml->hybrid && !mtp) /* while the GPU computes its part */
            rc = ml_hybrid_add(ml, a, out, nt);
    }
    return rc;
}

/* ---- open / close ------------------------------------------------------------------------- */

static void *ml_alloc(struct moe_layer *ml, size_t bytes)
{
    return ml->ops->alloc(ml->dev, bytes);
}

/* Static placement: for -1 the split itself: the experts of the last layers are uploaded while
 * they fit in what the budget leaves after the trunk, scratch and the stream; the layers
 * before them run on the CPU. Otherwise layers [N, n_layer) are uploaded. */
static int ml_open_static(struct moe_layer *ml)
{
    const struct model_hparams *hp = &ml->m->hp;
    int n = ml->cfg.cpu_layers, l = (int)hp->n_layer;
    uint64_t weights, other;
    ml->ops->held(ml->dev, &weights, &other);
    uint64_t used = weights + other + ml->cfg.stream_bytes;
    while (l > 0) {
        const struct layer_weights *lw = &ml->m->layers[l - 1];
        uint64_t need = lw->gate_exps.bytes + lw->up_exps.bytes + lw->down_exps.bytes;
        if (n >= 0 ? l <= n : used + need > ml->cfg.vram_budget)
            break;
        int rc = ml->ops->upload(ml->dev, &lw->gate_exps);
        rc = rc ? rc : ml->ops->upload(ml->dev, &lw->up_exps);
        rc = rc ? rc : ml->ops->upload(ml->dev, &lw->down_exps);
        if (rc)
            return rc;
        used += need;
        l--;
    }
    ml->cpu_layers = l;
    if (n < 0 && ml->cfg.log)
        fprintf(ml->cfg.log,
                "strata: static placement under %.2f GiB: experts of layers 0..%d on the CPU, "
                "of %d..%u resident\n",
                ml->cfg.vram_budget / 1073741824.0, l - 1, l, hp->n_layer - 1);
    return l ? ml_open_cpu_lane(ml) : 0;
}

/* Hybrid: the lanes, measured now: pinned H2D, host reads by the CPU lane's threads, and the
 * CPU's arithmetic per (token, expert) pair on layer 0's experts (what bounds it in prefill). */
static int ml_open_hybrid(struct moe_layer *ml)
{
    const struct model_hparams *hp = &ml->m->hp;
    const bool given = ml->cfg.lane_pcie_bps > 0 && ml->cfg.lane_cpu_bps > 0;
    ml->lanes = given ? (struct lane_model){.pcie_bps = ml->cfg.lane_pcie_bps,
                                            .cpu_bps = ml->cfg.lane_cpu_bps}
                      : (struct lane_model){
                            .pcie_bps = ml->ops->h2d_bandwidth(ml->dev),
                            .cpu_bps = membw_measure((size_t)256 << 20, omp_get_max_threads(), 3),
                        };
    const char *learn = getenv("STRATA_LANE_LEARN");
    ml->lanes_given = given;
    ml->lanes_learn = learn && !strcmp(learn, "1");
    ml->cpu_bps_open = ml->lanes.cpu_bps;
    int rc = ml_open_cpu_lane(ml);
    if (!rc && !given) {
        struct moe_experts ex;
        moe_experts_of(&ml->m->layers[0], hp, &ex);
        double pair = moe_cpu_pair_seconds(ml->cpu, &ex, (int)hp->n_expert,
                                           (int)hp->n_expert_used, 64, 3);
        ml->lanes.cpu_pair_s = pair > 0 ? pair : 0;
    }
    if (ml->cfg.log)
        fprintf(ml->cfg.log,
                "strata: hybrid lanes: PCIe %.1f GB/s, CPU %.1f GB/s and %.1f us per (token, "
                "expert) pair with %d threads (%s)\n",
                ml->lanes.pcie_bps / 1e9, ml->lanes.cpu_bps / 1e9, ml->lanes.cpu_pair_s * 1e6,
                omp_get_max_threads(), given ? "given" : "measured");
    ml->items = malloc(sizeof(*ml->items) * hp->n_expert);
    ml->item_lane = malloc(hp->n_expert);
    if (!rc && (!ml->items || !ml->item_lane))
        rc = -ENOMEM;
    if (!rc && !(ml->cpu_partial = ml_alloc(ml, sizeof(float) * ml->cfg.max_tok * hp->n_embd)))
        rc = -ENOMEM;
    const struct layer_weights *lw0 = &ml->m->layers[0];
    if (!rc && (hp->swiglu_oai || lw0->gate_exps_b.data || lw0->down_exps_b.data)) {
        size_t pairs = (size_t)ml->cfg.max_tok * hp->n_expert_used;
        ml->w_gpu = ml_alloc(ml, sizeof(float) * pairs);
        ml->w_gpu_h = malloc(sizeof(float) * pairs);
        ml->on_cpu = malloc(hp->n_expert);
        if (!ml->w_gpu || !ml->w_gpu_h || !ml->on_cpu)
            rc = -ENOMEM;
    }
    if (rc)
        return err_set(rc, "the hybrid CPU lane");
    /* every call may split: prefill too, priced by the pair cost above */
    rc = expert_cache_set_hybrid(ml->cache, ml_split, ml, ml->cfg.max_tok);
    if (!rc && !ml->cfg.hybrid_no_admit)
        expert_cache_set_hybrid_admit(ml->cache, true);
    ml->hybrid = rc == 0;
    return rc;
}

/* Several streams (a lockstep batch) under the budget: how many fit next to the trunk, scratch
 * and a cache of at least one token's experts in every layer; -ENOSPC with the arithmetic when
 * cfg->n_streams do not, else 0 (and the count in the log). */
static int ml_streams_fit(struct moe_layer *ml, uint64_t weights, uint64_t other, uint64_t slot)
{
    const struct moe_layer_config *cfg = &ml->cfg;
    const struct model_hparams *hp = &ml->m->hp;
    char b[7][32];
    uint64_t min_pool = (uint64_t)hp->n_layer * hp->n_expert_used * slot;
    uint64_t fixed = weights + other + min_pool;
    uint64_t left = cfg->vram_budget > fixed ? cfg->vram_budget - fixed : 0;
    uint64_t fit = cfg->stream_one ? left / cfg->stream_one : 0;
    if (fit < (uint64_t)cfg->n_streams)
        return err_set(-ENOSPC,
                       "%d streams of %d positions need %d x %s (KV cache, activations, batch "
                       "rows) = %s; --vram-budget %s leaves %s after the trunk (%s), scratch (%s) "
                       "and the smallest expert cache (%s: %u experts in each of %u layers): at "
                       "most %llu such streams fit",
                       cfg->n_streams, cfg->n_ctx, cfg->n_streams,
                       budget_size(b[0], cfg->stream_one), budget_size(b[1], cfg->stream_bytes),
                       budget_size(b[2], cfg->vram_budget), budget_size(b[3], left),
                       budget_size(b[4], weights), budget_size(b[5], other),
                       budget_size(b[6], min_pool), hp->n_expert_used, hp->n_layer,
                       (unsigned long long)fit);
    if (cfg->log)
        fprintf(cfg->log,
                "strata: %d streams of %d positions: %s of KV caches, activations and batch rows "
                "(at most %llu such streams fit this budget)\n",
                cfg->n_streams, cfg->n_ctx, budget_size(b[0], cfg->stream_bytes),
                (unsigned long long)fit);
    return 0;
}

/* The expert cache gets what the trunk, scratch and the streams leave of the budget. */
static int ml_open_cache(struct moe_layer *ml)
{
    const struct model_hparams *hp = &ml->m->hp;
    const struct moe_layer_config *cfg = &ml->cfg;
    uint64_t weights, other;
    ml->ops->held(ml->dev, &weights, &other);
    uint64_t fixed = weights + other + cfg->stream_bytes;
    struct expert_cache_config ec = {
        .n_slots = cfg->expert_slots,
        .max_pairs = cfg->max_tok * (int)hp->n_expert_used,
        .gather = cfg->gather,
        .pin_chunk = cfg->pin_chunk,
        .log = cfg->log,
        .tier = cfg->tier,
        .prefetch_top = ml_prefetch_top(cfg, hp),
    };
    if (cfg->tier && cfg->fill == MOE_FILL_ZEROCOPY)
        return err_set(-ENOTSUP, "a host tier under the expert cache serves its copy path and "
                                 "the hybrid lane (not zero-copy misses)");
    if (cfg->fill == MOE_FILL_DEVICE && (cfg->tier || cfg->modes))
        return err_set(-ENOTSUP, "the GPU's own expert cache (--residency gpu) runs without a "
                                 "host tier or automatic placement");
    if (cfg->vram_budget) {
        uint64_t trunk, slot;
        struct budget_plan plan;
        budget_model_sizes(ml->m, &trunk, &slot);
        int rc = cfg->n_streams > 1 ? ml_streams_fit(ml, weights, other, slot) : 0;
        rc = rc ? rc : budget_plan_slots(cfg->vram_budget, weights, cfg->stream_bytes, other, slot,
                                   (int)hp->n_layer, &plan);
        if (rc)
            return rc;
        /* the slot tables come out of the pool too */
        uint64_t tables = (uint64_t)hp->n_layer * 3 * hp->n_expert * sizeof(void *);
        ec.pool_bytes = cfg->vram_budget - fixed > tables ? cfg->vram_budget - fixed - tables : 0;
        if (cfg->log)
            fprintf(cfg->log,
                    "strata: --vram-budget %.2f GiB: trunk %.2f GiB, KV cache and activations "
                    "%.2f GiB, scratch %.2f GiB, %.2f GiB left for expert slots\n",
                    cfg->vram_budget / 1073741824.0, weights / 1073741824.0,
                    cfg->stream_bytes / 1073741824.0, other / 1073741824.0,
                    ec.pool_bytes / 1073741824.0);
    }
    int rc = expert_cache_open(ml->m, &ec, cfg->stream, &ml->cache);
    if (!rc && cfg->fill == MOE_FILL_DEVICE && cfg->hybrid) {
        rc = ml_open_lane(ml);
        ml->lane = rc == 0;
    } else if (!rc && (cfg->hybrid || cfg->modes)) {
        rc = ml_open_hybrid(ml);
    }
    /* the automatic placement may time the lane too, where this model and device allow it */
    if (!rc && cfg->modes && ml_open_lane(ml))
        err_clear();
    if (!rc && cfg->modes && !cfg->hybrid)
        rc = moe_layer_set_mode(ml,
                                cfg->fill == MOE_FILL_ZEROCOPY ? MOE_MODE_ZEROCOPY : MOE_MODE_COPY);
    return rc;
}

int moe_layer_open(const struct model *m, const struct moe_layer_config *cfg,
                   const struct moe_device_ops *ops, void *dev, struct moe_layer **out)
{
    const struct model_hparams *hp = &m->hp;
    struct moe_layer *ml = calloc(1, sizeof(*ml));
    int rc = 0;

    if (!ml)
        return err_set(-ENOMEM, "out of memory");
    ml->m = m;
    ml->ops = ops;
    ml->dev = dev;
    ml->cfg = *cfg;
    ml->device_max_tok = ml_device_max_tok_env();
    if (ml->cfg.max_tok <= 0)
        ml->cfg.max_tok = 512;
    size_t pairs = (size_t)ml->cfg.max_tok * hp->n_expert_used;
    if (cfg->observer && !ops->host) {
        ml->obs_ids = malloc(sizeof(int32_t) * pairs);
        ml->obs_w = malloc(sizeof(float) * pairs);
        if (!ml->obs_ids || !ml->obs_w) {
            rc = err_set(-ENOMEM, "out of memory");
            goto fail;
        }
    }
    /* STRATA_ROUTE2=0 in the environment routes predictions on their own (for comparisons) */
    const char *r2 = getenv("STRATA_ROUTE2");
    ml->route2 = ops->route2 && !(r2 && *r2 && atoi(r2) == 0);
    if (ml->route2 && (cfg->prefetch || (cfg->tier && cfg->tier_ahead))) {
        ml->route_ids = ml->route_ids2 = ml_alloc(ml, sizeof(int32_t) * 4 * pairs);
        ml->route_w = ml->route_w2 = ml_alloc(ml, sizeof(float) * 4 * pairs);
    } else {
        ml->route_ids = ml_alloc(ml, sizeof(int32_t) * pairs);
        ml->route_w = ml_alloc(ml, sizeof(float) * pairs);
    }
    /* with a host tier under the cache, predictions read ahead into the tier */
    ml->prefetch = (cfg->prefetch || (cfg->tier && cfg->tier_ahead)) && cfg->cache && !ops->host;
    if (ml->prefetch) {
        int depth = cfg->prefetch_depth < 1 ? 1 : cfg->prefetch_depth;
        depth = depth > EXPERT_CACHE_MAX_DEPTH ? EXPERT_CACHE_MAX_DEPTH : depth;
        ml->pred = (struct predict){
            .m = m,
            .route = ops->route,
            .route_ctx = dev,
            .depth = depth,
            .top = ml_prefetch_top(cfg, hp),
            .ids = ml_alloc(ml, sizeof(int32_t) * pairs * depth),
            .w = ml_alloc(ml, sizeof(float) * pairs * depth),
        };
    }
    ml->pf_seen = calloc((size_t)hp->n_layer + 1, sizeof(*ml->pf_seen));
    ml->pf_quiet = calloc((size_t)hp->n_layer + 1, sizeof(*ml->pf_quiet));
    if (!ml->route_ids || !ml->route_w || (ml->prefetch && (!ml->pred.ids || !ml->pred.w)) ||
        !ml->pf_seen || !ml->pf_quiet) {
        rc = err_set(-ENOMEM, "the MoE layer's routing buffers");
        goto fail;
    }
    if (ops->host) { /* the CPU backend: every expert on the CPU lane */
        ml->cpu_layers = (int)hp->n_layer;
        rc = ml_open_cpu_lane(ml);
    } else if (cfg->cache) {
        rc = ml_open_cache(ml);
        ml->pred.cache = ml->cache;
        /* the copy path's predicted admissions and copies made after the layer's launch (not
         * with a host tier, whose read-ahead the CPU lane reads beside it), on this thread:
         * on the worker's own thread (STRATA_PF_WORKER=2 in the environment) they started
         * later and decoded 3% slower on the H200 machine (bench/profiles.md); 0 makes them
         * inside the cache's lookup as before */
        const char *pw = getenv("STRATA_PF_WORKER");
        const int mode = pw && *pw ? atoi(pw) : 1;
        if (!rc && ml->prefetch && !cfg->tier && mode > 0)
            rc = pf_worker_open(&ml->pfw, ml->cache, cfg->device, mode > 1);
    } else {
        ml->cpu_layers = cfg->cpu_layers;
        rc = ml_open_static(ml);
    }
    if (rc)
        goto fail;
    *out = ml;
    return 0;
fail:
    moe_layer_close(ml);
    return rc;
}

void moe_layer_close(struct moe_layer *ml)
{
    if (!ml)
        return;
    pf_worker_close(ml->pfw);
    expert_cache_close(ml->cache);
    ml->ops->free(ml->dev, ml->route_ids2 ? ml->route_ids2 : ml->route_ids);
    ml->ops->free(ml->dev, ml->route_w2 ? (void *)ml->route_w2 : (void *)ml->route_w);
    free(ml->pf_seen);
    free(ml->pf_quiet);
    ml->ops->free(ml->dev, ml->pred.ids);
    ml->ops->free(ml->dev, ml->pred.w);
    ml->ops->free(ml->dev, ml->cpu_partial);
    ml->ops->free(ml->dev, ml->w_gpu);
    free(ml->w_gpu_h);
    free(ml->on_cpu);
    moe_cpu_close(ml->cpu);
    moe_plan_free(&ml->plan);
    if (ml->in_h)
        ml_host_free(ml, ml->in_h);
    free(ml->out_h);
    if (ml->ids_h)
        ml_host_free(ml, ml->ids_h);
    if (ml->w_h)
        ml_host_free(ml, ml->w_h);
    free(ml->items);
    free(ml->item_lane);
    free(ml->obs_ids);
    free(ml->obs_w);
    free(ml->tier_ids);
    free(ml->tier_got);
    free(ml->tier_ptrs);
    free(ml->ahead_ids);
    free(ml->ahead_w);
    free(ml->ahead_seen);
    if (ml->lane_msg)
        ml_host_free(ml, ml->lane_msg);
    if (ml->lane_x)
        ml_host_free(ml, ml->lane_x);
    if (ml->lane_y)
        ml_host_free(ml, ml->lane_y);
    ml->ops->free(ml->dev, ml->lane_list);
    ml->ops->free(ml->dev, ml->lane_err);
    ml->ops->free(ml->dev, ml->lane_admit);
    free(ml->lane_rec);
    free(ml);
}

/* ---- between steps, and what the backend asks ---------------------------------------------- */

int moe_layer_step_flush(struct moe_layer *ml)
{
    return ml->cache ? expert_cache_step_flush(ml->cache) : 0;
}

int moe_layer_step_end(struct moe_layer *ml)
{
    return ml->cache ? expert_cache_step_end(ml->cache) : 0;
}

int moe_layer_graph_ready(struct moe_layer *ml)
{
    int rc =
        ml->cache && ml->cfg.fill == MOE_FILL_DEVICE ? expert_cache_device_start(ml->cache) : 0;
    struct expert_cache_lane_view v; /* the zero slot made before a recording needs it */
    return rc || !ml->lane ? rc : expert_cache_lane_view(ml->cache, 0, &v);
}

uint32_t moe_layer_graph_epoch(const struct moe_layer *ml)
{
    return ml->cache ? expert_cache_device_epoch(ml->cache) : 0;
}

void moe_layer_set_recording(struct moe_layer *ml, bool on)
{
    if (on && ml->lane) /* the layers of the new recording post to the lane */
        memset(ml->lane_rec, 0, ml->m->hp.n_layer);
    ml->recording = on;
    if (ml->cache)
        expert_cache_set_recording(ml->cache, on);
}

void moe_layer_replayed(struct moe_layer *ml)
{
    if (ml->cache)
        expert_cache_replayed(ml->cache, (int)ml->m->hp.n_expert_used);
}

bool moe_layer_mode_ok(const struct moe_layer *ml, enum moe_mode mode)
{
    return ml->cache && ml->cfg.modes && !ml->prefetch && (unsigned)mode < MOE_MODES &&
           ((mode != MOE_MODE_ZEROCOPY && mode != MOE_MODE_DEVICE) || !ml->cfg.tier) &&
           (mode != MOE_MODE_DEVICE || ml->m->hp.n_expert <= CUDA_DEVCACHE_MAX_EXPERT) &&
           (mode != MOE_MODE_LANE || ml->lane_ready);
}

int moe_layer_set_mode(struct moe_layer *ml, enum moe_mode mode)
{
    if (!moe_layer_mode_ok(ml, mode))
        return err_set(-ENOTSUP, "the expert cache cannot switch to mode %d", (int)mode);
    if (mode != MOE_MODE_DEVICE && mode != MOE_MODE_LANE) {
        int rc = expert_cache_device_stop(ml->cache);
        if (rc)
            return rc;
    }
    expert_cache_hybrid_pause(ml->cache, mode != MOE_MODE_HYBRID);
    ml->hybrid = mode == MOE_MODE_HYBRID;
    ml->lane = mode == MOE_MODE_LANE;
    ml->cfg.fill = mode == MOE_MODE_ZEROCOPY                          ? MOE_FILL_ZEROCOPY
                   : mode == MOE_MODE_DEVICE || mode == MOE_MODE_LANE ? MOE_FILL_DEVICE
                                                                      : MOE_FILL_COPY;
    return 0;
}

double moe_layer_miss_seconds(const struct moe_layer *ml)
{
    uint64_t trunk, slot;
    if (!ml->cache || ml->lanes.pcie_bps <= 0)
        return 0;
    budget_model_sizes(ml->m, &trunk, &slot);
    return (double)slot / ml->lanes.pcie_bps;
}

enum moe_mode moe_layer_mode(const struct moe_layer *ml)
{
    return ml->hybrid                          ? MOE_MODE_HYBRID
           : ml->lane                          ? MOE_MODE_LANE
           : ml->cfg.fill == MOE_FILL_ZEROCOPY ? MOE_MODE_ZEROCOPY
           : ml->cfg.fill == MOE_FILL_DEVICE   ? MOE_MODE_DEVICE
                                               : MOE_MODE_COPY;
}

bool moe_layer_graph_safe(const struct moe_layer *ml)
{
    return !ml->cpu_layers && !ml->cfg.observer &&
           (!ml->cache || (ml->cfg.fill == MOE_FILL_DEVICE && !ml->hybrid) ||
            (ml->cfg.fill == MOE_FILL_ZEROCOPY && !ml->hybrid && !ml->prefetch));
}

uint64_t moe_layer_vram_bytes(const struct moe_layer *ml)
{
    return ml && ml->cache ? expert_cache_vram_bytes(ml->cache) : 0;
}

int moe_layer_shrink(struct moe_layer *ml, uint64_t bytes)
{
    return ml && ml->cache ? expert_cache_shrink(ml->cache, bytes) : 0;
}

int moe_layer_preload(struct moe_layer *ml, const int32_t *layer, const int32_t *expert, int n,
                      bool pin, void (*progress)(void *ctx, int done, int total), void *ctx)
{
    if (!ml || !ml->cache)
        return err_set(-ENOTSUP, "there is no expert cache to restore a profile into");
    return expert_cache_preload(ml->cache, layer, expert, n, pin, progress, ctx);
}

void moe_layer_reset_stats(struct moe_layer *ml)
{
    if (ml && ml->cache)
        expert_cache_reset_stats(ml->cache);
}

int moe_layer_slots(const struct moe_layer *ml)
{
    return ml->cache ? expert_cache_slots(ml->cache) : 0;
}

int moe_layer_print_stats(const struct moe_layer *ml, FILE *f)
{
    if (ml->cache)
        expert_cache_print_stats(ml->cache, f);
    return 0;
}

int moe_layer_write_stats_json(const struct moe_layer *ml, const char *path)
{
    return ml->cache ? expert_cache_write_stats_json(ml->cache, path) : 0;
}

int moe_layer_cache_totals(const struct moe_layer *ml, struct moe_cache_totals *t)
{
    memset(t, 0, sizeof(*t));
    if (!ml->cache)
        return -ENOENT;
    for (uint32_t l = 0; l < ml->m->hp.n_layer; l++) {
        const struct expert_cache_layer_stats *s = expert_cache_stats(ml->cache, (int)l);
        t->hits += s->hits;
        t->misses += s->misses;
        t->evictions += s->evictions;
        t->bytes_copied += s->bytes_copied;
        t->bytes_zerocopy += s->bytes_zerocopy;
        t->cpu_computed += s->cpu_computed;
        t->cpu_admitted += s->cpu_admitted;
        t->prefetched += s->prefetched;
        t->prefetch_used += s->prefetch_used;
        t->prefetch_late += s->prefetch_late;
        t->prefetch_wasted += s->prefetch_wasted;
    }
    t->cpu_computed += ml->lane_experts; /* the lane inside the graph: not the cache's count */
    t->slots = expert_cache_slots(ml->cache);
    t->predictions = ml->n_predictions;
    unsigned long long kicked, made;
    pf_worker_counts(ml->pfw, &kicked, &made);
    t->worker_jobs = ml->pfw && pf_worker_threaded(ml->pfw) ? made : 0;
    t->lookaheads = ml->n_lookahead;
    t->lookahead_admitted = ml->lookahead_admitted;
    return 0;
}

double moe_layer_cpu_seconds(const struct moe_layer *ml)
{
    return ml->cpu_s;
}

void moe_layer_lane_rates(const struct moe_layer *ml, double *pcie_bps, double *cpu_bps_open,
                          double *cpu_bps)
{
    *pcie_bps = ml->lanes.pcie_bps;
    *cpu_bps_open = ml->cpu_bps_open;
    *cpu_bps = ml->cpu_bps_learned;
}

int moe_layer_cpu_layers(const struct moe_layer *ml)
{
    return ml->ops->host ? 0 : ml->cpu_layers;
}
