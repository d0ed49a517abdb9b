/* backend_cuda: the op table enqueued on one CUDA stream with the kernels of cuda_kernels/.
 * Without a budget every weight is uploaded to the device at open (the all-resident mode: the
 * ceiling every offload mode is measured against). Under --vram-budget the trunk (everything
 * but the stacked experts) is uploaded and the experts are served by the expert cache
 * (residency/expert_cache.h) from VRAM slots or pinned host memory. Plain C over the C
 * launchers: no CUDA headers here.
 *
 * Ownership: the backend owns the device copies of the weights (recorded in each weight's dev
 * field of the model, cleared again at close), the scratch buffers below, and the stream.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "budget.h"
#include "cuda_info.h"
#include "cuda_matmul.h"
#include "cuda_mem.h"
#include "cuda_moe.h"
#include "cuda_ops.h"
#include "errors.h"
#include "expert_cache.h"
#include "stream.h"
#include "lane.h"
#include "membw.h"
#include "moe.h"

#define CUDA_BACKEND_MAX_TOK 512 /* tokens per launch of the batched ops; larger calls split */

struct backend_cuda {
    struct backend base;
    struct model *model;      /* the model whose weights carry our dev pointers */
    void *stream;             /* cudaStream_t */
    int32_t *ids_dev;         /* (MAX_TOK) token ids for embed */
    void *mm_scratch;         /* cuda_matmul scratch for any weight at MAX_TOK rows */
    size_t mm_scratch_bytes;
    void *attn_scratch;
    size_t attn_scratch_bytes;
    float *router_logits;     /* (MAX_TOK, n_expert) */
    int32_t *route_ids;       /* (MAX_TOK, k) */
    float *route_w;           /* (MAX_TOK, k) */
    void *moe_scratch;
    size_t moe_scratch_bytes;
    size_t weight_bytes;      /* uploaded weights */
    size_t alloc_bytes;       /* everything else cuda_alloc handed out */
    int rc;                   /* first error of the weight upload */
    bool offload;             /* experts stay in host memory, served by cache */
    struct expert_cache *cache;
    enum backend_residency residency;
    bool prefetch;
    int32_t *pred_ids;        /* (MAX_TOK, k) predicted experts of the next layer */
    float *pred_w;
    uint64_t budget;          /* 0 = no cap */
    /* static placement: experts of layers [0, static_n) run on the CPU */
    int static_n;
    struct moe_cpu *cpu_lane;
    struct moe_plan plan;
    float *in_h, *out_h;      /* (MAX_TOK, n_embd) host copies of the layer's input / output */
    int32_t *ids_h;           /* (MAX_TOK, k) */
    float *w_h;
    bool hybrid;              /* cache misses split with the CPU lane (shares the above) */
    float *cpu_partial;       /* (MAX_TOK, n_embd) device: the CPU lane's sum, added to out */
    /* graph decode: one-token steps recorded once and replayed */
    bool graph;               /* wanted, and possible (all resident, no CPU lane) */
    bool recording;           /* between step_begin and step_end of the recording */
    void *graph_exec;         /* the recorded step, or NULL */
    const struct stream *graph_stream; /* the stream whose buffers it writes */
    const float *graph_bufs[3];        /* and those buffers (a new stream may reuse the address) */
    int32_t *step_pin;        /* pinned host [0] token id, [1] position: read by the graph */
    void *step_pin_dev;
    int32_t *step_dev;        /* (2) device copy of step_pin */
    int32_t *argmax_dev;      /* (1) read_argmax's result */
};

#define CUDA_BACKEND_ZEROCOPY_MAX_TOK 16 /* larger calls (prefill) copy misses into slots */

static struct backend_cuda *cuda_of(struct backend *b)
{
    return (struct backend_cuda *)b;
}

static int cuda_fail(int rc, const char *what)
{
    return err_set(rc ? rc : -EIO, "cuda backend: %s failed", what);
}

static size_t cuda_held_bytes(const struct backend_cuda *c)
{
    return c->weight_bytes + c->alloc_bytes + (c->cache ? expert_cache_vram_bytes(c->cache) : 0);
}

/* An allocation did not fit (the budget, or the device refused): the expert pool gives up
 * slots for it, says so, and generation goes on with fewer. false when it has none left. */
static bool cuda_make_room(struct backend_cuda *c, uint64_t bytes)
{
    int freed = c->cache ? expert_cache_shrink(c->cache, bytes) : 0;
    if (freed <= 0)
        return false;
    fprintf(stderr,
            "strata: device memory ran short by %.1f MiB: the expert pool gave up %d slots "
            "(%d left); continuing\n",
            bytes / 1048576.0, freed, expert_cache_slots(c->cache));
    return true;
}

static float *cuda_alloc(struct backend *b, size_t n)
{
    struct backend_cuda *c = cuda_of(b);
    size_t bytes = (n ? n : 1) * sizeof(float);
    void *p = NULL;
    while (c->budget && cuda_held_bytes(c) + bytes > c->budget) {
        if (!cuda_make_room(c, cuda_held_bytes(c) + bytes - c->budget)) {
            err_set(-ENOMEM,
                    "cuda backend: %.1f MiB more would exceed --vram-budget (%.2f of %.2f GiB "
                    "held, no expert slot left to give up)",
                    bytes / 1048576.0, cuda_held_bytes(c) / 1073741824.0,
                    c->budget / 1073741824.0);
            return NULL;
        }
    }
    int rc = cuda_malloc(&p, bytes);
    while (rc && cuda_make_room(c, bytes))
        rc = cuda_malloc(&p, bytes);
    if (rc) {
        err_set(-ENOMEM, "cuda backend: cannot allocate %.1f MiB of device memory",
                n * sizeof(float) / 1048576.0);
        return NULL;
    }
    cuda_memset(p, 0, n * sizeof(float), cuda_of(b)->stream);
    cuda_of(b)->alloc_bytes += n * sizeof(float);
    return p;
}

static void cuda_free_op(struct backend *b, float *p)
{
    (void)b;
    cuda_free(p);
}

static int cuda_embed_op(struct backend *b, float *out, const struct weight *w,
                         const int32_t *ids, int n)
{
    struct backend_cuda *c = cuda_of(b);
    if (c->recording) { /* the id arrives in step_dev[0], copied at the start of the graph */
        struct cuda_embed_args a = {
            .out = out, .table = w->dev, .type = w->type, .row_bytes = w->row_bytes,
            .n_embd = (int64_t)w->ne[0], .n_vocab = (int64_t)w->ne[1], .ids = c->step_dev,
            .n = 1, .stream = c->stream,
        };
        int rc = cuda_embed(&a);
        return rc ? cuda_fail(rc, "embed") : 0;
    }
    for (int i0 = 0; i0 < n; i0 += CUDA_BACKEND_MAX_TOK) {
        int m = n - i0 < CUDA_BACKEND_MAX_TOK ? n - i0 : CUDA_BACKEND_MAX_TOK;
        for (int i = 0; i < m; i++) {
            if (ids[i0 + i] < 0 || (uint64_t)ids[i0 + i] >= w->ne[1])
                return err_set(-EINVAL, "token id %d is outside the vocabulary (%llu)",
                               ids[i0 + i], (unsigned long long)w->ne[1]);
        }
        int rc = cuda_h2d(c->ids_dev, ids + i0, sizeof(int32_t) * (size_t)m, c->stream);
        struct cuda_embed_args a = {
            .out = out + (size_t)i0 * w->ne[0], .table = w->dev, .type = w->type,
            .row_bytes = w->row_bytes, .n_embd = (int64_t)w->ne[0],
            .n_vocab = (int64_t)w->ne[1], .ids = c->ids_dev, .n = m, .stream = c->stream,
        };
        rc = rc ? rc : cuda_embed(&a);
        if (rc)
            return cuda_fail(rc, "embed");
        /* ids_dev is reused by the next chunk: the copy above must not overtake this launch */
        if (i0 + m < n && (rc = cuda_stream_sync(c->stream)))
            return cuda_fail(rc, "embed");
    }
    return 0;
}

static int cuda_rmsnorm_op(struct backend *b, float *out, const float *in, const struct weight *w,
                           int rows, int dim, float eps)
{
    struct cuda_rmsnorm_args a = {
        .out = out, .in = in, .w = w->dev, .rows = rows, .dim = dim, .eps = eps,
        .stream = cuda_of(b)->stream,
    };
    int rc = cuda_rmsnorm(&a);
    return rc ? cuda_fail(rc, "rmsnorm") : 0;
}

static int cuda_matmul_op(struct backend *b, float *out, const struct weight *w, const float *in,
                          int m)
{
    struct backend_cuda *c = cuda_of(b);
    for (int r = 0; r < m; r += CUDA_BACKEND_MAX_TOK) {
        int n = m - r < CUDA_BACKEND_MAX_TOK ? m - r : CUDA_BACKEND_MAX_TOK;
        struct cuda_matmul_args a = {
            .wtype = w->type, .w = w->dev, .w_stride = w->row_bytes,
            .n_in = (int64_t)w->ne[0], .n_out = (int64_t)w->ne[1], .m = n,
            .x = in + (size_t)r * w->ne[0], .x_stride = (int64_t)w->ne[0],
            .y = out + (size_t)r * w->ne[1], .y_stride = (int64_t)w->ne[1],
            .scratch = c->mm_scratch, .scratch_bytes = c->mm_scratch_bytes,
            .stream = c->stream,
        };
        int rc = cuda_matmul(&a);
        if (rc)
            return err_set(rc, "cuda matmul over '%s' (%llu x %llu, m %d) failed", w->name,
                           (unsigned long long)w->ne[1], (unsigned long long)w->ne[0], n);
    }
    return 0;
}

static int cuda_rope_op(struct backend *b, float *x, int n_tok, int n_heads, int head_dim,
                        int pos0, float base)
{
    struct cuda_rope_args a = {
        .x = x, .n_tok = n_tok, .n_heads = n_heads, .head_dim = head_dim, .pos0 = pos0,
        .pos_dev = cuda_of(b)->recording ? cuda_of(b)->step_dev + 1 : NULL, .base = base,
        .stream = cuda_of(b)->stream,
    };
    int rc = cuda_rope_neox(&a);
    return rc ? cuda_fail(rc, "rope") : 0;
}

static int cuda_kv_store_op(struct backend *b, float *cache, const float *src, int pos0,
                            int n_tok, int width)
{
    struct backend_cuda *c = cuda_of(b);
    struct cuda_kv_store_args a = {
        .cache = cache, .src = src, .n_tok = n_tok, .width = width, .n_ctx = pos0 + n_tok,
        .pos0 = pos0, .stream = c->stream,
    };
    if (c->recording) { /* the row comes from step_dev[1]; the cache holds graph_stream's n_ctx */
        a.pos_dev = c->step_dev + 1;
        a.n_ctx = c->graph_stream->n_ctx;
    }
    int rc = cuda_kv_store(&a);
    return rc ? cuda_fail(rc, "kv_store") : 0;
}

static int cuda_attention_op(struct backend *b, const struct attn_args *at)
{
    struct backend_cuda *c = cuda_of(b);
    struct cuda_attn_args a = {
        .out = at->out, .q = at->q, .k_cache = at->k_cache, .v_cache = at->v_cache,
        .pos0 = at->pos0, .n_tok = at->n_tok, .n_ctx = at->pos0 + at->n_tok,
        .pos_dev = c->recording ? c->step_dev + 1 : NULL,
        .n_head = at->n_head, .n_head_kv = at->n_head_kv, .head_dim = at->head_dim,
        .scale = at->scale, .scratch = c->attn_scratch, .scratch_bytes = c->attn_scratch_bytes,
        .stream = c->stream,
    };
    if (c->recording) /* keys up to the position in step_dev[1], of a cache this long */
        a.n_ctx = c->graph_stream->n_ctx;
    int rc = cuda_attention(&a);
    return rc ? cuda_fail(rc, "attention") : 0;
}

static int cuda_add_op(struct backend *b, float *x, const float *y, size_t n)
{
    int rc = cuda_add(x, y, n, cuda_of(b)->stream);
    return rc ? cuda_fail(rc, "add") : 0;
}

/* Hybrid: the layer's input, routing ids and weights to the host, enqueued before the cache's
 * read-back sync so they arrive with it. */
static int cuda_cpu_lane_inputs(struct backend_cuda *c, const float *in, int nt, int k)
{
    size_t e = c->model->hp.n_embd;
    int rc = cuda_d2h(c->in_h, in, sizeof(float) * (size_t)nt * e, c->stream);
    rc = rc ? rc : cuda_d2h(c->ids_h, c->route_ids, sizeof(int32_t) * (size_t)nt * k, c->stream);
    rc = rc ? rc : cuda_d2h(c->w_h, c->route_w, sizeof(float) * (size_t)nt * k, c->stream);
    return rc ? cuda_fail(rc, "reading the CPU lane's inputs back") : 0;
}

/* Hybrid: the experts the cache gave to the CPU, computed here while the GPU kernel (which
 * reads zeros for them) runs, and added to its output. */
static int cuda_cpu_lane_add(struct backend_cuda *c, const struct moe_args *ma, float *out, int nt)
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
    rc = moe_cpu_run(c->cpu_lane, &c->plan, &ex, c->in_h, c->out_h);
    if (rc)
        return err_set(rc, "layer %d: CPU lane experts failed", ma->layer);
    rc = cuda_h2d(c->cpu_partial, c->out_h, sizeof(float) * (size_t)nt * e, c->stream);
    rc = rc ? rc : cuda_add(out, c->cpu_partial, (size_t)nt * e, c->stream);
    return rc ? cuda_fail(rc, "adding the CPU lane's experts") : 0;
}

/* Static placement: this layer's experts on the CPU. The routing stays on the GPU; its ids,
 * weights and the layer's input come to the host once, the result goes back once. */
static int cuda_moe_on_cpu(struct backend_cuda *c, const struct moe_args *ma, const float *in,
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
        return cuda_fail(rc, "reading a CPU layer's input back");
    moe_experts_of(ma->lw, hp, &ex);
    moe_plan_build(&c->plan, c->ids_h, c->w_h, nt);
    rc = moe_cpu_run(c->cpu_lane, &c->plan, &ex, c->in_h, c->out_h);
    if (rc)
        return err_set(rc, "layer %d: CPU experts failed", ma->layer);
    /* pageable source: the call returns once out_h is staged, so out_h may be reused */
    rc = cuda_h2d(out, c->out_h, sizeof(float) * (size_t)nt * e, c->stream);
    return rc ? cuda_fail(rc, "sending a CPU layer's output") : 0;
}

/* The next layer's router applied to this layer's MoE input: its likely experts, for the
 * cache to start streaming (reuses router_logits: this layer's top-k is already taken). */
static int cuda_predict_next(struct backend *b, const struct moe_args *ma, const float *in, int nt)
{
    struct backend_cuda *c = cuda_of(b);
    const struct model_hparams *hp = ma->hp;
    int rc = cuda_matmul_op(b, c->router_logits, &c->model->layers[ma->layer + 1].router, in, nt);
    struct cuda_topk_args tk = {
        .logits = c->router_logits, .n_tok = nt, .n_expert = (int)hp->n_expert,
        .k = (int)hp->n_expert_used, .ids = c->pred_ids, .w = c->pred_w, .stream = c->stream,
    };
    rc = rc ? rc : cuda_softmax_topk(&tk);
    if (rc)
        return cuda_fail(rc, "predicting the next layer's experts");
    expert_cache_predict_next(c->cache, c->pred_ids, nt * (int)hp->n_expert_used);
    return 0;
}

static int cuda_moe_ffn_op(struct backend *b, const struct moe_args *ma)
{
    struct backend_cuda *c = cuda_of(b);
    const struct layer_weights *lw = ma->lw;
    const struct model_hparams *hp = ma->hp;
    uint64_t n = hp->n_expert;
    int rc = 0;

    for (int t0 = 0; t0 < ma->n_tok && !rc; t0 += CUDA_BACKEND_MAX_TOK) {
        int nt = ma->n_tok - t0 < CUDA_BACKEND_MAX_TOK ? ma->n_tok - t0 : CUDA_BACKEND_MAX_TOK;
        const float *in = ma->in + (size_t)t0 * hp->n_embd;
        rc = cuda_matmul_op(b, c->router_logits, &lw->router, in, nt);
        if (rc)
            break;
        struct cuda_topk_args tk = {
            .logits = c->router_logits, .n_tok = nt, .n_expert = (int)n,
            .k = (int)hp->n_expert_used, .ids = c->route_ids, .w = c->route_w,
            .stream = c->stream,
        };
        rc = cuda_softmax_topk(&tk);
        if (!rc && ma->layer < c->static_n) {
            rc = cuda_moe_on_cpu(c, ma, in, ma->out + (size_t)t0 * hp->n_embd, nt);
            continue;
        }
        struct expert_tables tab = {0};
        if (!rc && c->cache) {
            int pairs = nt * (int)hp->n_expert_used;
            bool zc = !c->hybrid && c->residency == BACKEND_RESIDENCY_ZEROCOPY &&
                      nt <= CUDA_BACKEND_ZEROCOPY_MAX_TOK;
            /* the CPU lane's inputs, read back under the cache's own sync */
            if (c->hybrid)
                rc = cuda_cpu_lane_inputs(c, in, nt, (int)hp->n_expert_used);
            if (!rc && !zc && c->prefetch && ma->layer + 1 < (int)hp->n_layer)
                rc = cuda_predict_next(b, ma, in, nt);
            if (!rc)
                rc = zc ? expert_cache_prepare_zerocopy(c->cache, ma->layer, c->route_ids, pairs,
                                                        &tab)
                        : expert_cache_prepare_copy(c->cache, ma->layer, c->route_ids, pairs, &tab);
            if (rc)
                break;
        }
        struct cuda_moe_args a = {
            .out = ma->out + (size_t)t0 * hp->n_embd, .out_stride = hp->n_embd, .in = in,
            .in_stride = hp->n_embd, .n_tok = nt, .k = (int)hp->n_expert_used,
            .n_expert = (int)n, .n_embd = hp->n_embd, .n_ff = hp->n_ff_exp,
            .ids = c->route_ids, .weights = c->route_w, .gate_type = lw->gate_exps.type,
            .up_type = lw->up_exps.type, .down_type = lw->down_exps.type,
            .gate = lw->gate_exps.dev, .up = lw->up_exps.dev, .down = lw->down_exps.dev,
            .gate_stride = lw->gate_exps.bytes / n, .up_stride = lw->up_exps.bytes / n,
            .down_stride = lw->down_exps.bytes / n, .gate_ptrs = tab.gate, .up_ptrs = tab.up,
            .down_ptrs = tab.down, .scratch = c->moe_scratch,
            .scratch_bytes = c->moe_scratch_bytes, .stream = c->stream,
        };
        rc = rc ? rc : cuda_moe_ffn(&a);
        if (rc)
            rc = err_set(rc, "layer %d: cuda experts failed (types %u/%u/%u)", ma->layer,
                         lw->gate_exps.type, lw->up_exps.type, lw->down_exps.type);
        if (!rc && c->hybrid) /* while the GPU computes its part */
            rc = cuda_cpu_lane_add(c, ma, ma->out + (size_t)t0 * hp->n_embd, nt);
    }
    return rc;
}

static int cuda_read_op(struct backend *b, float *host, const float *src, size_t n)
{
    struct backend_cuda *c = cuda_of(b);
    int rc = cuda_d2h(host, src, n * sizeof(float), c->stream);
    rc = rc ? rc : cuda_stream_sync(c->stream);
    if (rc)
        return cuda_fail(rc, "reading results back");
    /* the step is over and the stream idle: the cache's between-token work */
    return c->cache ? expert_cache_step_end(c->cache) : 0;
}

/* Graph decode: a one-token step at position pos of stream s is replayed from the recording
 * when there is one for s; else it is recorded (step_end then runs it). Everything position-
 * or token-dependent reads step_dev, filled from step_pin by the graph's first node. */
static int cuda_step_begin(struct backend *b, const struct stream *s, const int32_t *ids, int n,
                           int pos)
{
    struct backend_cuda *c = cuda_of(b);
    if (!c->graph || n != 1)
        return 0;
    bool same = c->graph_stream == s && c->graph_bufs[0] == s->arena &&
                c->graph_bufs[1] == s->k_cache && c->graph_bufs[2] == s->v_cache;
    if (c->graph_exec && !same) { /* another stream's buffers: record anew */
        cuda_graph_destroy(c->graph_exec);
        c->graph_exec = NULL;
    }
    if (ids[0] < 0 || (uint64_t)ids[0] >= c->model->tok_embd.ne[1])
        return err_set(-EINVAL, "token id %d is outside the vocabulary (%llu)", ids[0],
                       (unsigned long long)c->model->tok_embd.ne[1]);
    c->step_pin[0] = ids[0]; /* the previous replay is done: read synced the stream */
    c->step_pin[1] = pos;
    if (c->graph_exec) {
        int rc = cuda_graph_launch(c->graph_exec, c->stream);
        if (rc)
            return cuda_fail(rc, "replaying the decode graph");
        if (c->cache) /* the replay read every layer's routing back, as recorded */
            expert_cache_replayed(c->cache, (int)c->model->hp.n_expert_used);
        return 1;
    }
    int rc = cuda_graph_begin(c->stream);
    rc = rc ? rc : cuda_h2d(c->step_dev, c->step_pin, 2 * sizeof(int32_t), c->stream);
    if (rc)
        return cuda_fail(rc, "starting the decode graph");
    c->recording = true;
    c->graph_stream = s;
    c->graph_bufs[0] = s->arena;
    c->graph_bufs[1] = s->k_cache;
    c->graph_bufs[2] = s->v_cache;
    if (c->cache)
        expert_cache_set_recording(c->cache, true);
    return 0;
}

static int cuda_step_end(struct backend *b, int rc)
{
    struct backend_cuda *c = cuda_of(b);
    if (!c->recording)
        return rc;
    c->recording = false;
    if (c->cache)
        expert_cache_set_recording(c->cache, false);
    void *exec = NULL;
    int grc = cuda_graph_end(c->stream, &exec);
    if (rc) { /* the forward failed while recording: nothing was run */
        cuda_graph_destroy(exec);
        return rc;
    }
    if (grc)
        return cuda_fail(grc, "recording the decode graph");
    c->graph_exec = exec;
    grc = cuda_graph_launch(exec, c->stream);
    return grc ? cuda_fail(grc, "running the decode graph") : 0;
}

static int cuda_read_argmax_op(struct backend *b, const float *x, int n, int32_t *out)
{
    struct backend_cuda *c = cuda_of(b);
    int rc = cuda_argmax(x, 1, n, c->argmax_dev, c->stream);
    rc = rc ? rc : cuda_d2h(out, c->argmax_dev, sizeof(int32_t), c->stream);
    rc = rc ? rc : cuda_stream_sync(c->stream);
    if (rc)
        return cuda_fail(rc, "argmax on the device");
    /* the step is over, as after read */
    return c->cache ? expert_cache_step_end(c->cache) : 0;
}

static void cuda_weight_release(struct weight *w, void *arg)
{
    (void)arg;
    cuda_free(w->dev);
    w->dev = NULL;
}

static void cuda_close_op(struct backend *b)
{
    struct backend_cuda *c = cuda_of(b);
    if (c->stream)
        cuda_stream_sync(c->stream);
    expert_cache_close(c->cache);
    model_weights_each(c->model, cuda_weight_release, NULL);
    cuda_free(c->ids_dev);
    cuda_free(c->mm_scratch);
    cuda_free(c->attn_scratch);
    cuda_free(c->router_logits);
    cuda_free(c->route_ids);
    cuda_free(c->route_w);
    cuda_free(c->moe_scratch);
    cuda_free(c->pred_ids);
    cuda_free(c->pred_w);
    cuda_free(c->cpu_partial);
    cuda_graph_destroy(c->graph_exec);
    cuda_host_free(c->step_pin);
    cuda_free(c->step_dev);
    cuda_free(c->argmax_dev);
    moe_cpu_close(c->cpu_lane);
    moe_plan_free(&c->plan);
    free(c->in_h);
    free(c->out_h);
    free(c->ids_h);
    free(c->w_h);
    cuda_stream_destroy(c->stream);
    free(c);
}

static const struct backend_ops cuda_ops_table = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free_op,
    .embed = cuda_embed_op,
    .rmsnorm = cuda_rmsnorm_op,
    .matmul = cuda_matmul_op,
    .rope = cuda_rope_op,
    .kv_store = cuda_kv_store_op,
    .attention = cuda_attention_op,
    .add = cuda_add_op,
    .moe_ffn = cuda_moe_ffn_op,
    .read = cuda_read_op,
    .step_begin = cuda_step_begin,
    .step_end = cuda_step_end,
    .read_argmax = cuda_read_argmax_op,
    .close = cuda_close_op,
};

/* The layer whose stacked experts w is, or -1. */
static int cuda_expert_layer(const struct model *m, const struct weight *w)
{
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        const struct layer_weights *lw = &m->layers[l];
        if (w == &lw->gate_exps || w == &lw->up_exps || w == &lw->down_exps)
            return (int)l;
    }
    return -1;
}

/* Uploads one weight and grows the matmul scratch to what it needs at MAX_TOK rows. */
static void cuda_weight_upload(struct weight *w, void *arg)
{
    struct backend_cuda *c = arg;
    int el = cuda_expert_layer(c->model, w);
    /* experts stay in host memory: all of them under the cache, the CPU layers' (static),
     * or, while the static split is not yet known (-1), all of them for now */
    if (c->rc || (el >= 0 && (c->offload || el < c->static_n || c->static_n < 0)))
        return;
    if (cuda_malloc(&w->dev, w->bytes)) {
        c->rc = err_set(-ENOMEM, "cuda backend: no device memory for '%s' (%.1f MiB; %.2f GiB "
                                 "of weights uploaded so far)",
                        w->name, w->bytes / 1048576.0, c->weight_bytes / 1073741824.0);
        return;
    }
    if (cuda_h2d(w->dev, w->data, w->bytes, c->stream)) {
        c->rc = err_set(-EIO, "cuda backend: uploading '%s' failed", w->name);
        return;
    }
    c->weight_bytes += w->bytes;
    if (w->n_dims >= 2 && !cuda_matmul_supported(w->type) && w != &c->model->tok_embd)
        c->rc = err_set(-ENOTSUP, "cuda backend: no GPU kernel for '%s' of type %u", w->name,
                        w->type);
    size_t s = cuda_matmul_scratch_bytes(w->type, (int64_t)w->ne[0], (int64_t)w->ne[1],
                                         CUDA_BACKEND_MAX_TOK);
    if (w->n_dims == 2 && s > c->mm_scratch_bytes)
        c->mm_scratch_bytes = s;
}

static int cuda_buffers(struct backend_cuda *c)
{
    const struct model_hparams *hp = &c->model->hp;
    const struct layer_weights *lw = &c->model->layers[0];
    size_t t = CUDA_BACKEND_MAX_TOK, k = hp->n_expert_used;
    struct cuda_moe_args probe = {
        .n_tok = (int)t, .k = (int)k, .n_expert = (int)hp->n_expert, .n_embd = hp->n_embd,
        .n_ff = hp->n_ff_exp, .gate_type = lw->gate_exps.type, .up_type = lw->up_exps.type,
        .down_type = lw->down_exps.type,
    };
    int rc = 0;

    c->attn_scratch_bytes = cuda_attention_scratch_bytes((int)hp->n_head, (int)hp->head_dim);
    c->moe_scratch_bytes = cuda_moe_scratch_bytes(&probe);
    rc = rc ? rc : cuda_malloc((void **)&c->ids_dev, sizeof(int32_t) * t);
    rc = rc ? rc : cuda_malloc(&c->mm_scratch, c->mm_scratch_bytes);
    rc = rc ? rc : cuda_malloc(&c->attn_scratch, c->attn_scratch_bytes);
    rc = rc ? rc : cuda_malloc((void **)&c->router_logits, sizeof(float) * t * hp->n_expert);
    rc = rc ? rc : cuda_malloc((void **)&c->route_ids, sizeof(int32_t) * t * k);
    rc = rc ? rc : cuda_malloc((void **)&c->route_w, sizeof(float) * t * k);
    rc = rc ? rc : cuda_malloc(&c->moe_scratch, c->moe_scratch_bytes);
    rc = rc ? rc : cuda_malloc((void **)&c->argmax_dev, sizeof(int32_t));
    if (c->prefetch) {
        rc = rc ? rc : cuda_malloc((void **)&c->pred_ids, sizeof(int32_t) * t * k);
        rc = rc ? rc : cuda_malloc((void **)&c->pred_w, sizeof(float) * t * k);
        c->alloc_bytes += t * k * (sizeof(int32_t) + sizeof(float));
    }
    if (rc)
        return err_set(rc, "cuda backend: cannot allocate the scratch buffers");
    c->alloc_bytes += c->mm_scratch_bytes + c->attn_scratch_bytes + c->moe_scratch_bytes +
                      t * (sizeof(int32_t) + sizeof(float) * hp->n_expert) +
                      t * k * (sizeof(int32_t) + sizeof(float));
    return 0;
}

static int cuda_open_cache(struct backend_cuda *c, const struct backend_cuda_config *cfg);
static int cuda_open_static(struct backend_cuda *c, const struct backend_cuda_config *cfg);
static int cuda_open_cpu_lane(struct backend_cuda *c);

int backend_cuda_open(struct model *m, const struct backend_cuda_config *cfg,
                      struct backend **out)
{
    const char *why = NULL;
    struct backend_cuda *c;
    int rc;

    if (cuda_device_count(&why) <= (cfg ? cfg->device : 0))
        return err_set(-ENODEV, "no CUDA device %d: %s", cfg ? cfg->device : 0,
                       why ? why : "fewer devices");
    c = calloc(1, sizeof(*c));
    if (!c)
        return err_set(-ENOMEM, "out of memory");
    c->base.ops = &cuda_ops_table;
    c->base.model = m;
    c->base.impl = c;
    c->model = m;
    rc = cuda_set_device(cfg ? cfg->device : 0);
    rc = rc ? rc : cuda_stream_create(&c->stream);
    rc = rc ? rc : cuda_matmul_init();
    if (rc) {
        cuda_close_op(&c->base);
        return err_set(rc, "cuda backend: cannot start on device %d", cfg ? cfg->device : 0);
    }
    c->budget = cfg ? cfg->vram_budget : 0;
    c->static_n = cfg ? cfg->cpu_moe_layers : 0;
    if (c->static_n < -1 || c->static_n > (int)m->hp.n_layer ||
        (c->static_n < 0 && !c->budget)) {
        cuda_close_op(&c->base);
        return err_set(-EINVAL, "static placement of %d layers (the model has %u; automatic "
                                "needs --vram-budget)",
                       cfg->cpu_moe_layers, m->hp.n_layer);
    }
    c->offload = cfg && (cfg->vram_budget || cfg->expert_slots > 0) && !c->static_n;
    c->residency = cfg ? cfg->residency : BACKEND_RESIDENCY_COPY;
    c->prefetch = cfg && cfg->prefetch && c->offload;
    model_weights_each(m, cuda_weight_upload, c);
    rc = c->rc ? c->rc : cuda_buffers(c);
    rc = rc ? rc : cuda_stream_sync(c->stream);
    rc = rc ? rc : cuda_open_static(c, cfg);
    rc = rc ? rc : cuda_open_cache(c, cfg);
    /* graph decode needs a step without host syncs: all resident, or the cache serving misses
     * in place (b) with no CPU lane and no prediction (both sync per layer) */
    c->graph = cfg && cfg->graph && !c->static_n &&
               (!c->cache || (c->residency == BACKEND_RESIDENCY_ZEROCOPY && !c->hybrid &&
                              !c->prefetch));
    if (!rc && c->graph) {
        rc = cuda_host_alloc((void **)&c->step_pin, 2 * sizeof(int32_t), &c->step_pin_dev);
        rc = rc ? rc : cuda_malloc((void **)&c->step_dev, 2 * sizeof(int32_t));
        if (rc)
            rc = err_set(rc, "cuda backend: the decode graph's buffers");
    }
    if (rc) {
        cuda_close_op(&c->base);
        return rc;
    }
    *out = &c->base;
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
static int cuda_open_static(struct backend_cuda *c, const struct backend_cuda_config *cfg)
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
            cuda_weight_upload((struct weight *)&lw->gate_exps, c);
            cuda_weight_upload((struct weight *)&lw->up_exps, c);
            cuda_weight_upload((struct weight *)&lw->down_exps, c);
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
static int cuda_open_cache(struct backend_cuda *c, const struct backend_cuda_config *cfg)
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
    c->hybrid = rc == 0;
    return rc;
}

size_t backend_cuda_vram_bytes(const struct backend *b)
{
    return cuda_held_bytes((const struct backend_cuda *)b);
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

bool backend_cuda_graph(const struct backend *b)
{
    return ((const struct backend_cuda *)b)->graph;
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
    }
    t->slots = expert_cache_slots(c->cache);
    return 0;
}
