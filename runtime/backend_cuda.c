/* backend_cuda: the op table enqueued on one CUDA stream with the kernels of cuda_kernels/.
 * Without a budget every weight is uploaded to the device at open (the all-resident mode: the
 * ceiling every offload mode is measured against). Under --vram-budget the trunk (everything
 * but the stacked experts) is uploaded and the experts are served by the expert cache
 * (residency/expert_cache.h) from VRAM slots or pinned host memory. Plain C over the C
 * launchers: no CUDA headers here.
 *
 * The expert cache, static placement and the hybrid CPU lane are in backend_cuda_offload.c;
 * the state both files share is in backend_cuda_priv.h.
 *
 * Ownership: the backend owns the device copies of the weights (recorded in each weight's dev
 * field of the model, cleared again at close), the scratch buffers below, and the stream.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_cuda_priv.h"
#include "cuda_info.h"
#include "cuda_matmul.h"
#include "cuda_mem.h"
#include "cuda_moe.h"
#include "cuda_ops.h"
#include "errors.h"
#include "expert_cache.h"
#include "moe.h"
#include "quant_blocks.h"
#include "stream.h"

int backend_cuda_fail(int rc, const char *what)
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
            "strata: device memory ran short by %.1f %s: the expert pool gave up %d slots "
            "(%d left); continuing\n",
            bytes >= (1u << 20) ? bytes / 1048576.0 : bytes / 1024.0,
            bytes >= (1u << 20) ? "MiB" : "KiB", freed, expert_cache_slots(c->cache));
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
    backend_cuda_forget_xq(cuda_of(b));
    struct backend_cuda *c = cuda_of(b);
    if (c->recording) { /* the id arrives in step_dev[0], copied at the start of the graph */
        struct cuda_embed_args a = {
            .out = out, .table = w->dev, .type = w->type, .row_bytes = w->row_bytes,
            .n_embd = (int64_t)w->ne[0], .n_vocab = (int64_t)w->ne[1], .ids = c->step_dev,
            .n = 1, .stream = c->stream,
        };
        int rc = cuda_embed(&a);
        return rc ? backend_cuda_fail(rc, "embed") : 0;
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
            return backend_cuda_fail(rc, "embed");
        /* ids_dev is reused by the next chunk: the copy above must not overtake this launch */
        if (i0 + m < n && (rc = cuda_stream_sync(c->stream)))
            return backend_cuda_fail(rc, "embed");
    }
    return 0;
}

/* One kernel where the forward would launch add then rmsnorm (cuda_rmsnorm's fused residual:
 * the same additions and the same norm, so the same bits). */
static int cuda_add_rmsnorm_op(struct backend *b, float *x, const float *y, float *out,
                               const struct weight *w, int rows, int dim, float eps)
{
    backend_cuda_forget_xq(cuda_of(b));
    struct cuda_rmsnorm_args a = {
        .out = out, .in = y, .resid = x, .w = w->dev, .rows = rows, .dim = dim, .eps = eps,
        .stream = cuda_of(b)->stream,
    };
    int rc = cuda_rmsnorm(&a);
    return rc ? backend_cuda_fail(rc, "add + rmsnorm") : 0;
}

static int cuda_rmsnorm_op(struct backend *b, float *out, const float *in, const struct weight *w,
                           int rows, int dim, float eps)
{
    backend_cuda_forget_xq(cuda_of(b));
    struct cuda_rmsnorm_args a = {
        .out = out, .in = in, .w = w->dev, .rows = rows, .dim = dim, .eps = eps,
        .stream = cuda_of(b)->stream,
    };
    int rc = cuda_rmsnorm(&a);
    return rc ? backend_cuda_fail(rc, "rmsnorm") : 0;
}

int backend_cuda_matmul(struct backend *b, float *out, const struct weight *w, const float *in,
                          int m)
{
    struct backend_cuda *c = cuda_of(b);
    for (int r = 0; r < m; r += CUDA_BACKEND_MAX_TOK) {
        int n = m - r < CUDA_BACKEND_MAX_TOK ? m - r : CUDA_BACKEND_MAX_TOK;
        const float *x = in + (size_t)r * w->ne[0];
        /* a quantized weight on the MMV path quantizes x into mm_scratch: consecutive
         * matmuls of the same x (q, k, v) share it */
        bool q8 = w->type != QUANT_F32 && w->type != QUANT_F16 && w->type != QUANT_BF16 &&
                  n < CUDA_MATMUL_GEMM_MIN_M;
        struct cuda_matmul_args a = {
            .wtype = w->type, .w = w->dev, .w_stride = w->row_bytes,
            .n_in = (int64_t)w->ne[0], .n_out = (int64_t)w->ne[1], .m = n,
            .x = x, .x_stride = (int64_t)w->ne[0],
            .y = out + (size_t)r * w->ne[1], .y_stride = (int64_t)w->ne[1],
            .scratch = c->mm_scratch, .scratch_bytes = c->mm_scratch_bytes,
            .x_ready = q8 && c->xq_src == x && c->xq_m == n && c->xq_n_in == (int64_t)w->ne[0],
            .stream = c->stream,
        };
        int rc = cuda_matmul(&a);
        if (q8) {
            c->xq_src = x;
            c->xq_m = n;
            c->xq_n_in = (int64_t)w->ne[0];
        }
        /* the output may overwrite the quantized rows' source */
        const float *o0 = a.y, *o1 = a.y + (size_t)n * w->ne[1];
        if (c->xq_src && o0 < c->xq_src + (size_t)c->xq_m * c->xq_n_in && c->xq_src < o1)
            c->xq_src = NULL;
        if (rc)
            return err_set(rc, "cuda matmul over '%s' (%llu x %llu, m %d) failed", w->name,
                           (unsigned long long)w->ne[1], (unsigned long long)w->ne[0], n);
    }
    return 0;
}

static int cuda_rope_op(struct backend *b, float *x, int n_tok, int n_heads, int head_dim,
                        int pos0, float base)
{
    backend_cuda_forget_xq(cuda_of(b));
    struct cuda_rope_args a = {
        .x = x, .n_tok = n_tok, .n_heads = n_heads, .head_dim = head_dim, .pos0 = pos0,
        .pos_dev = cuda_of(b)->recording ? cuda_of(b)->step_dev + 1 : NULL, .base = base,
        .stream = cuda_of(b)->stream,
    };
    int rc = cuda_rope_neox(&a);
    return rc ? backend_cuda_fail(rc, "rope") : 0;
}

static int cuda_kv_store_op(struct backend *b, float *cache, const float *src, int pos0,
                            int n_tok, int width)
{
    backend_cuda_forget_xq(cuda_of(b));
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
    return rc ? backend_cuda_fail(rc, "kv_store") : 0;
}

static int cuda_attention_op(struct backend *b, const struct attn_args *at)
{
    backend_cuda_forget_xq(cuda_of(b));
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
    return rc ? backend_cuda_fail(rc, "attention") : 0;
}

static int cuda_add_op(struct backend *b, float *x, const float *y, size_t n)
{
    backend_cuda_forget_xq(cuda_of(b));
    int rc = cuda_add(x, y, n, cuda_of(b)->stream);
    return rc ? backend_cuda_fail(rc, "add") : 0;
}





static int cuda_moe_ffn_op(struct backend *b, const struct moe_args *ma)
{
    backend_cuda_forget_xq(cuda_of(b));
    struct backend_cuda *c = cuda_of(b);
    const struct layer_weights *lw = ma->lw;
    const struct model_hparams *hp = ma->hp;
    uint64_t n = hp->n_expert;
    int rc = 0;

    for (int t0 = 0; t0 < ma->n_tok && !rc; t0 += CUDA_BACKEND_MAX_TOK) {
        int nt = ma->n_tok - t0 < CUDA_BACKEND_MAX_TOK ? ma->n_tok - t0 : CUDA_BACKEND_MAX_TOK;
        const float *in = ma->in + (size_t)t0 * hp->n_embd;
        rc = backend_cuda_matmul(b, c->router_logits, &lw->router, in, nt);
        if (rc)
            break;
        struct cuda_topk_args tk = {
            .logits = c->router_logits, .n_tok = nt, .n_expert = (int)n,
            .k = (int)hp->n_expert_used, .ids = c->route_ids, .w = c->route_w,
            .stream = c->stream,
        };
        rc = cuda_softmax_topk(&tk);
        if (!rc && ma->layer < c->static_n) {
            rc = backend_cuda_moe_on_cpu(c, ma, in, ma->out + (size_t)t0 * hp->n_embd, nt);
            continue;
        }
        struct expert_tables tab = {0};
        if (!rc && c->cache) {
            int pairs = nt * (int)hp->n_expert_used;
            bool zc = !c->hybrid && c->residency == BACKEND_RESIDENCY_ZEROCOPY &&
                      nt <= CUDA_BACKEND_ZEROCOPY_MAX_TOK;
            /* the CPU lane's inputs, read back under the cache's own sync */
            if (c->hybrid)
                rc = backend_cuda_lane_inputs(c, in, nt, (int)hp->n_expert_used);
            if (!rc && !zc && c->prefetch && ma->layer + 1 < (int)hp->n_layer)
                rc = backend_cuda_predict_next(b, ma, in, nt);
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
            rc = backend_cuda_lane_add(c, ma, ma->out + (size_t)t0 * hp->n_embd, nt);
    }
    return rc;
}

static int cuda_read_op(struct backend *b, float *host, const float *src, size_t n)
{
    backend_cuda_forget_xq(cuda_of(b));
    struct backend_cuda *c = cuda_of(b);
    int rc = cuda_d2h(host, src, n * sizeof(float), c->stream);
    rc = rc ? rc : cuda_stream_sync(c->stream);
    if (rc)
        return backend_cuda_fail(rc, "reading results back");
    /* the step is over and the stream idle: the cache's between-token work */
    return c->cache ? expert_cache_step_end(c->cache) : 0;
}

/* Graph decode: a one-token step at position pos of stream s is replayed from the recording
 * when there is one for s; else it is recorded (step_end then runs it). Everything position-
 * or token-dependent reads step_dev, filled from step_pin by the graph's first node. */
static int cuda_step_begin(struct backend *b, const struct stream *s, const int32_t *ids, int n,
                           int pos)
{
    backend_cuda_forget_xq(cuda_of(b));
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
            return backend_cuda_fail(rc, "replaying the decode graph");
        if (c->cache) /* the replay read every layer's routing back, as recorded */
            expert_cache_replayed(c->cache, (int)c->model->hp.n_expert_used);
        return 1;
    }
    int rc = cuda_graph_begin(c->stream);
    rc = rc ? rc : cuda_h2d(c->step_dev, c->step_pin, 2 * sizeof(int32_t), c->stream);
    if (rc)
        return backend_cuda_fail(rc, "starting the decode graph");
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
    backend_cuda_forget_xq(cuda_of(b));
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
        return backend_cuda_fail(grc, "recording the decode graph");
    c->graph_exec = exec;
    grc = cuda_graph_launch(exec, c->stream);
    return grc ? backend_cuda_fail(grc, "running the decode graph") : 0;
}

static int cuda_read_argmax_op(struct backend *b, const float *x, int n, int32_t *out)
{
    backend_cuda_forget_xq(cuda_of(b));
    struct backend_cuda *c = cuda_of(b);
    int rc = cuda_argmax(x, 1, n, c->argmax_dev, c->stream);
    rc = rc ? rc : cuda_d2h(out, c->argmax_dev, sizeof(int32_t), c->stream);
    rc = rc ? rc : cuda_stream_sync(c->stream);
    if (rc)
        return backend_cuda_fail(rc, "argmax on the device");
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
    .matmul = backend_cuda_matmul,
    .rope = cuda_rope_op,
    .kv_store = cuda_kv_store_op,
    .attention = cuda_attention_op,
    .add = cuda_add_op,
    .add_rmsnorm = cuda_add_rmsnorm_op,
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
void backend_cuda_weight_upload(struct weight *w, void *arg)
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
    model_weights_each(m, backend_cuda_weight_upload, c);
    rc = c->rc ? c->rc : cuda_buffers(c);
    rc = rc ? rc : cuda_stream_sync(c->stream);
    rc = rc ? rc : backend_cuda_open_static(c, cfg);
    rc = rc ? rc : backend_cuda_open_cache(c, cfg);
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





size_t backend_cuda_vram_bytes(const struct backend *b)
{
    return cuda_held_bytes((const struct backend_cuda *)b);
}



bool backend_cuda_graph(const struct backend *b)
{
    return ((const struct backend_cuda *)b)->graph;
}


