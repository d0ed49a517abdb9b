/* backend_cuda: the op table enqueued on one CUDA stream with the kernels of cuda_kernels/.
 * The trunk (every weight but the stacked experts) is uploaded at open; the MoE layer
 * (moe/moe_layer.h) decides where the experts live and run (all resident, the expert cache
 * under --vram-budget, static placement, the hybrid CPU lane) and calls the primitives at the
 * end of this file. Plain C over the C launchers: no CUDA headers here.
 *
 * Ownership: the backend owns the device copies of the weights (recorded in each weight's dev
 * field of the model, cleared again at close), the scratch buffers below, and the stream.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "clock.h"
#include "cuda_attention.h"
#include "cuda_info.h"
#include "cuda_lane.h"
#include "cuda_matmul.h"
#include "cuda_mem.h"
#include "cuda_moe.h"
#include "cuda_ops.h"
#include "cuda_ssm.h"
#include "disk_tier.h"
#include "errors.h"
#include "moe_layer.h"
#include "ops_cpu.h"
#include "placement_rules.h"
#include "quant_blocks.h"
#include "strata.h"
#include "stream.h"
#include "topo.h"
#include "tune.h"

#define CUDA_BACKEND_MAX_TOK 512 /* tokens per launch of the batched ops; larger calls split */
#define CUDA_ROWS_GRAPHS 64      /* lockstep steps of up to this many rows may be graphed */

struct backend_cuda {
    struct backend base;
    struct model *model;      /* the model whose weights carry our dev pointers */
    void *stream;             /* cudaStream_t */
    int32_t *ids_dev;         /* (MAX_TOK) token ids for embed */
    void *mm_scratch;         /* cuda_matmul scratch for any weight at MAX_TOK rows */
    size_t mm_scratch_bytes;
    /* the activations mm_scratch holds in 8 bits (q, k and v share theirs): NULL after any
     * op other than a matmul, which may have written them (backend_cuda_forget_xq) */
    const float *xq_src;
    int xq_m;
    int64_t xq_n_in;
    uint64_t mm_writes; /* how many times 8-bit rows were written into mm_scratch */
    /* during an MoE op: its input when mm_scratch held that input's 8-bit rows at the start
     * (the norm before wrote them), and mm_writes then; the experts read the rows while
     * mm_writes is unchanged (cuda_moe_args.in_q8) */
    const float *moe_q8_in;
    int moe_q8_m;
    uint64_t moe_q8_mark;
    void *attn_scratch;
    size_t attn_scratch_bytes;
    float *router_logits; /* (2 MAX_TOK, n_expert): two layers' (cuda_moe_route2) */
    void *moe_scratch;
    size_t moe_scratch_bytes;
    float *shexp_scratch;     /* the shared expert's gate, up and down rows: (MAX_TOK,
                               * 2 n_ff_shexp + n_embd), or NULL without one */
    size_t weight_bytes;      /* uploaded weights */
    size_t alloc_bytes;       /* everything else cuda_alloc handed out */
    struct cuda_block *blocks; /* cuda_alloc's live allocations, to give their bytes back */
    int n_blocks, cap_blocks;
    int rc;                   /* first error of the weight upload */
    uint64_t budget;          /* 0 = no cap */
    struct moe_layer *moe;    /* the MoE layer: placement, expert cache, CPU lane */
    struct disk_tier *tier;   /* static placement with host_budget: the CPU layers' experts */
    /* graph decode: one-token steps recorded once and replayed */
    bool graph;               /* wanted, and possible (moe_layer_graph_safe) */
    bool rows_graph;          /* lockstep steps too: asked for (--graph) or auto under a cache */
    bool recording;           /* between step_begin and step_end of the recording */
    void *graph_exec;         /* the recorded step, or NULL */
    const struct stream *graph_stream; /* the stream whose buffers it writes */
    uint32_t graph_epoch;              /* and the GPU cache's hand-over it reads the state of */
    const float *graph_bufs[4];        /* and those buffers (a new stream may reuse the address) */
    int32_t *step_pin; /* pinned host [0] token id, [1] position, [2] the step's number
                        * (the CPU lane's, cuda_lane.h): read by the graph */
    void *step_pin_dev;
    int32_t *step_dev;        /* (3) device copy of step_pin */
    uint32_t lane_seq;        /* one-token graph launches so far */
    int32_t *argmax_dev;      /* (1) read_argmax's result */
    void *argmax_scratch;     /* CUDA_ARGMAX_SCRATCH bytes: cuda_argmax_wide's */
    /* lockstep rows (rows_begin): per layer l, n K then n V cache pointers at rows_ptr[2nl],
     * then the n positions; a host copy and the device one, for up to rows_cap rows */
    int rows_n, rows_cap, rows_ctx; /* rows_ctx: above every row's position and cache row */
    void **rows_host;
    float *rows_dev;
    float *rows_scratch;
    size_t rows_scratch_bytes;
    /* lockstep graphs (all resident, --graph): one recorded step per row count, replayed for
     * the same batch (its activations) and the same cache length rows_ctx */
    bool rows_recording;
    int rows_rec_n;
    void *rows_exec[CUDA_ROWS_GRAPHS + 1];
    const void *rows_key[CUDA_ROWS_GRAPHS + 1];
    int rows_key_ctx[CUDA_ROWS_GRAPHS + 1];
    /* automatic placement: the expert cache's modes timed on decode steps (runtime/tune.h);
     * zero-copy runs as a graph */
    bool auto_place;
    bool graph_ok;           /* zero-copy steps may run as a graph (no route observer) */
    bool try_all;            /* cfg.auto_try_all */
    bool auto_held;          /* backend_cuda_auto_hold: copy mode, nothing timed */
    enum moe_mode held_mode; /* the mode to go back to */
    struct tune tune;
    enum moe_mode tune_mode[TUNE_MAX];
    double tune_last;      /* when the last decode step began; 0: not the step before */
    bool tune_rows;        /* that step: a lockstep step (else a stream's evaluation) */
    int tune_n;            /* of this many rows or tokens */
    bool chose_rows;       /* the kind and size of the steps the mode in use was chosen on */
    int chose_n;
    int shape_steps;       /* decided: steps in a row of another kind or size */
    int watch_steps;       /* decided: one-token steps since watch_misses was taken */
    uint64_t watch_misses; /* the cache's misses then */
    double watch_rate;     /* misses per token in the first watch after the decision; < 0: none */
    uint64_t trial_misses; /* the cache's misses when the first trial began */
    bool zc_first;         /* the first trial is zero-copy's, not yet past its skipped steps */
    FILE *log;
};

static inline struct backend_cuda *cuda_of(struct backend *b)
{
    return (struct backend_cuda *)b;
}

/* Every op but matmul calls this first: it may write what mm_scratch holds quantized. */
static inline void backend_cuda_forget_xq(struct backend_cuda *c)
{
    c->xq_src = NULL;
}

/* The automatic placement's clock and trials (below): a step of n rows is about to run. */
static void auto_step(struct backend_cuda *c, bool rows, int n);

static int backend_cuda_fail(int rc, const char *what)
{
    return err_set(rc ? rc : -EIO, "cuda backend: %s failed", what);
}

/* A live allocation of cuda_alloc: freeing it gives its bytes back to the budget. */
struct cuda_block {
    void *p;
    size_t bytes;
};

static int cuda_block_add(struct backend_cuda *c, void *p, size_t bytes)
{
    if (c->n_blocks == c->cap_blocks) {
        int cap = c->cap_blocks ? 2 * c->cap_blocks : 32;
        struct cuda_block *b = realloc(c->blocks, sizeof(*b) * (size_t)cap);
        if (!b)
            return -ENOMEM;
        c->blocks = b;
        c->cap_blocks = cap;
    }
    c->blocks[c->n_blocks++] = (struct cuda_block){p, bytes};
    c->alloc_bytes += bytes;
    return 0;
}

static void cuda_block_forget(struct backend_cuda *c, const void *p)
{
    for (int i = c->n_blocks - 1; i >= 0; i--) {
        if (c->blocks[i].p == p) {
            c->alloc_bytes -= c->blocks[i].bytes;
            c->blocks[i] = c->blocks[--c->n_blocks];
            return;
        }
    }
}

static size_t cuda_held_bytes(const struct backend_cuda *c)
{
    return c->weight_bytes + c->alloc_bytes + moe_layer_vram_bytes(c->moe);
}

/* An allocation did not fit (the budget, or the device refused): the expert pool gives up
 * slots for it, says so, and generation goes on with fewer. false when it has none left. */
static bool cuda_make_room(struct backend_cuda *c, uint64_t bytes)
{
    int freed = moe_layer_shrink(c->moe, bytes);
    if (freed <= 0)
        return false;
    fprintf(stderr,
            "strata: device memory ran short by %.1f %s: the expert pool gave up %d slots "
            "(%d left); continuing\n",
            bytes >= (1u << 20) ? bytes / 1048576.0 : bytes / 1024.0,
            bytes >= (1u << 20) ? "MiB" : "KiB", freed, moe_layer_slots(c->moe));
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
    if (cuda_block_add(c, p, bytes)) {
        cuda_free(p);
        err_set(-ENOMEM, "out of memory");
        return NULL;
    }
    return p;
}

static void cuda_free_op(struct backend *b, float *p)
{
    if (!p)
        return;
    struct backend_cuda *c = cuda_of(b);
    for (int i = 0; i <= CUDA_ROWS_GRAPHS; i++) /* a batch's activations: its graphs go too */
        if (c->rows_key[i] == p) {
            cuda_graph_destroy(c->rows_exec[i]);
            c->rows_exec[i] = NULL;
            c->rows_key[i] = NULL;
        }
    cuda_block_forget(c, p);
    cuda_free(p);
}

static int cuda_embed_op(struct backend *b, float *out, const struct weight *w,
                         const int32_t *ids, int n)
{
    backend_cuda_forget_xq(cuda_of(b));
    struct backend_cuda *c = cuda_of(b);
    if (c->rows_recording) { /* lockstep graph: the ids are in the step's table */
        const struct model_hparams *hp = &c->model->hp;
        struct cuda_embed_args a = {
            .out = out, .table = w->dev, .type = w->type, .row_bytes = w->row_bytes,
            .n_embd = (int64_t)w->ne[0], .n_vocab = (int64_t)w->ne[1],
            .ids = (const int32_t *)((void **)c->rows_dev + 2 * (size_t)n * hp->n_layer) + n,
            .n = n, .stream = c->stream,
        };
        int rc = n == c->rows_n ? cuda_embed(&a) : -EINVAL;
        return rc ? backend_cuda_fail(rc, "embed") : 0;
    }
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
/* A norm of rows of the model's width that the MMV path's matmuls will read (q, k and v after
 * attn_norm): the norm also writes their 8-bit copy into mm_scratch, as the first matmul would,
 * and the matmuls take it (x_ready). */
static void cuda_norm_q8(struct backend_cuda *c, struct cuda_rmsnorm_args *a)
{
    const size_t off = cuda_matmul_q8_layout(a->dim, a->rows);
    if (a->dim != (int)c->model->hp.n_embd || a->dim % 32 || a->rows < 1 ||
        a->rows >= CUDA_MATMUL_GEMM_MIN_M || a->rows > CUDA_BACKEND_MAX_TOK || !off ||
        c->mm_scratch_bytes < off + (size_t)a->rows * (a->dim / 32) * 8)
        return;
    a->q8_codes = c->mm_scratch;
    a->q8_scales = (uint8_t *)c->mm_scratch + off;
    c->mm_writes++;
}

static void cuda_norm_q8_done(struct backend_cuda *c, const struct cuda_rmsnorm_args *a, int rc)
{
    if (rc || !a->q8_codes)
        return;
    c->xq_src = a->out;
    c->xq_m = a->rows;
    c->xq_n_in = a->dim;
}

/* out = rmsnorm(in, or resid after resid += in), with the 8-bit copy where it serves. */
static int cuda_norm_run(struct backend *b, float *out, const float *in, float *resid,
                         const struct weight *w, int rows, int dim, float eps, const char *what)
{
    struct backend_cuda *c = cuda_of(b);
    backend_cuda_forget_xq(c);
    struct cuda_rmsnorm_args a = {
        .out = out,
        .in = in,
        .resid = resid,
        .w = w->dev,
        .rows = rows,
        .dim = dim,
        .eps = eps,
        .stream = c->stream,
    };
    cuda_norm_q8(c, &a);
    int rc = cuda_rmsnorm(&a);
    cuda_norm_q8_done(c, &a, rc);
    return rc ? backend_cuda_fail(rc, what) : 0;
}

static int cuda_add_rmsnorm_op(struct backend *b, float *x, const float *y, float *out,
                               const struct weight *w, int rows, int dim, float eps)
{
    return cuda_norm_run(b, out, y, x, w, rows, dim, eps, "add + rmsnorm");
}

static int cuda_rmsnorm_op(struct backend *b, float *out, const float *in, const struct weight *w,
                           int rows, int dim, float eps)
{
    return cuda_norm_run(b, out, in, NULL, w, rows, dim, eps, "rmsnorm");
}

static bool cuda_bias_ok(const struct weight *bias, const struct weight *w)
{
    return !bias->type && bias->dev && bias->ne[0] == w->ne[1];
}

static int cuda_bias_fail(const struct weight *bias, const struct weight *w)
{
    return err_set(-EINVAL, "cuda matmul bias '%s': not an F32 tensor of %llu on the device",
                   bias->name, (unsigned long long)w->ne[1]);
}

/* out = in x W^T (+ bias: NULL, or an F32 tensor on the device, added where the MMV path writes
 * out, else by cuda_matmul's own bias kernel) */
static int cuda_matmul_run(struct backend *b, float *out, const struct weight *w,
                           const struct weight *bias, const float *in, int m)
{
    if (bias && !cuda_bias_ok(bias, w))
        return cuda_bias_fail(bias, w);
    struct backend_cuda *c = cuda_of(b);
    for (int r = 0; r < m; r += CUDA_BACKEND_MAX_TOK) {
        int n = m - r < CUDA_BACKEND_MAX_TOK ? m - r : CUDA_BACKEND_MAX_TOK;
        const float *x = in + (size_t)r * w->ne[0];
        /* a quantized weight on the MMV path quantizes x into mm_scratch: consecutive
         * matmuls of the same x (q, k, v) share it */
        bool q8 = w->type != QUANT_F32 && w->type != QUANT_F16 && w->type != QUANT_BF16 &&
                  n < CUDA_MATMUL_GEMM_MIN_M;
        struct cuda_matmul_args a = {
            .wtype = w->type,
            .w = w->dev,
            .w_stride = w->row_bytes,
            .n_in = (int64_t)w->ne[0],
            .n_out = (int64_t)w->ne[1],
            .m = n,
            .x = x,
            .x_stride = (int64_t)w->ne[0],
            .y = out + (size_t)r * w->ne[1],
            .y_stride = (int64_t)w->ne[1],
            .bias = bias ? bias->dev : NULL,
            .scratch = c->mm_scratch,
            .scratch_bytes = c->mm_scratch_bytes,
            .x_ready = q8 && c->xq_src == x && c->xq_m == n && c->xq_n_in == (int64_t)w->ne[0],
            .stream = c->stream,
        };
        int rc = cuda_matmul(&a);
        c->mm_writes += q8 && !a.x_ready;
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

static int backend_cuda_matmul(struct backend *b, float *out, const struct weight *w,
                               const float *in, int m)
{
    return cuda_matmul_run(b, out, w, NULL, in, m);
}

static bool cuda_w_q8(uint32_t type)
{
    return type != QUANT_F32 && type != QUANT_F16 && type != QUANT_BF16;
}

/* Weights of one type and n_in on the 8-bit MMV path: one launch for all of them
 * (cuda_matmul's further matrices); else one matmul each. */
static int cuda_matmul_bias_n_op(struct backend *b, int n, float *const *out,
                                 const struct weight *const *w, const struct weight *const *bias,
                                 const float *in, int m)
{
    struct backend_cuda *c = cuda_of(b);
    for (int i = 0; bias && i < n; i++)
        if (bias[i] && !cuda_bias_ok(bias[i], w[i]))
            return cuda_bias_fail(bias[i], w[i]);
    bool one = n >= 2 && n <= 1 + CUDA_MATMUL_MAX_MORE && m < CUDA_MATMUL_GEMM_MIN_M &&
               m <= CUDA_BACKEND_MAX_TOK;
    for (int i = 0; one && i < n; i++)
        one = w[i]->type == w[0]->type && w[i]->ne[0] == w[0]->ne[0] && cuda_w_q8(w[i]->type);
    if (!one) {
        for (int i = 0; i < n; i++) {
            int rc = cuda_matmul_run(b, out[i], w[i], bias ? bias[i] : NULL, in, m);
            if (rc)
                return rc;
        }
        return 0;
    }
    const int64_t n_in = (int64_t)w[0]->ne[0];
    struct cuda_matmul_args a = {
        .wtype = w[0]->type,
        .w = w[0]->dev,
        .w_stride = w[0]->row_bytes,
        .n_in = n_in,
        .n_out = (int64_t)w[0]->ne[1],
        .m = m,
        .x = in,
        .x_stride = n_in,
        .y = out[0],
        .y_stride = (int64_t)w[0]->ne[1],
        .bias = bias && bias[0] ? bias[0]->dev : NULL,
        .scratch = c->mm_scratch,
        .scratch_bytes = c->mm_scratch_bytes,
        .x_ready = c->xq_src == in && c->xq_m == m && c->xq_n_in == n_in,
        .stream = c->stream,
        .n_more = n - 1,
    };
    for (int i = 1; i < n; i++)
        a.more[i - 1] = (struct cuda_matmul_more){
            .w = w[i]->dev,
            .w_stride = w[i]->row_bytes,
            .n_out = (int64_t)w[i]->ne[1],
            .y = out[i],
            .y_stride = (int64_t)w[i]->ne[1],
            .bias = bias && bias[i] ? bias[i]->dev : NULL,
        };
    int rc = cuda_matmul(&a);
    c->mm_writes += !a.x_ready;
    c->xq_src = in;
    c->xq_m = m;
    c->xq_n_in = n_in;
    for (int i = 0; i < n; i++) { /* an output may overwrite the quantized rows' source */
        const float *o0 = out[i], *o1 = out[i] + (size_t)m * w[i]->ne[1];
        if (c->xq_src && o0 < c->xq_src + (size_t)m * n_in && c->xq_src < o1)
            c->xq_src = NULL;
    }
    if (rc)
        return err_set(rc, "cuda matmul over '%s' and %d more (m %d) failed", w[0]->name, n - 1, m);
    return 0;
}

static int cuda_matmul_n_op(struct backend *b, int n, float *const *out,
                            const struct weight *const *w, const float *in, int m)
{
    return cuda_matmul_bias_n_op(b, n, out, w, NULL, in, m);
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

static int cuda_rope_yarn_op(struct backend *b, float *x, int n_tok, int n_heads, int head_dim,
                             int pos0, const struct rope_yarn *y)
{
    double freq[CUDA_ROPE_MAX_FREQ];
    float mscale;
    if (head_dim / 2 > CUDA_ROPE_MAX_FREQ || head_dim % 2)
        return err_set(-EINVAL, "cuda rope: head dim %d (YaRN up to %d)", head_dim,
                       2 * CUDA_ROPE_MAX_FREQ);
    ops_rope_yarn_freq(head_dim, y->base, y->factor, y->n_ctx_orig, y->beta_fast, y->beta_slow,
                       y->truncate, freq, &mscale);
    backend_cuda_forget_xq(cuda_of(b));
    struct cuda_rope_args a = {
        .x = x, .n_tok = n_tok, .n_heads = n_heads, .head_dim = head_dim, .pos0 = pos0,
        .pos_dev = cuda_of(b)->recording ? cuda_of(b)->step_dev + 1 : NULL, .base = y->base,
        .freq = freq, .mscale = mscale, .stream = cuda_of(b)->stream,
    };
    int rc = cuda_rope_neox(&a);
    return rc ? backend_cuda_fail(rc, "rope") : 0;
}

static int cuda_add_bias_op(struct backend *b, float *x, const struct weight *bias, int rows)
{
    if (bias->type || !bias->dev)
        return err_set(-EINVAL, "cuda bias '%s': not an F32 tensor on the device", bias->name);
    backend_cuda_forget_xq(cuda_of(b));
    int rc = cuda_add_bias(x, bias->dev, rows, (int)bias->ne[0], cuda_of(b)->stream);
    return rc ? backend_cuda_fail(rc, "bias") : 0;
}

/* ---- the hybrid Gated DeltaNet models' ops (qwen3next, qwen35moe) ---------------------- */

static int cuda_rope_partial_op(struct backend *b, float *x, int n_tok, int n_heads, int head_dim,
                                int n_rot, int pos0, float base)
{
    struct backend_cuda *c = cuda_of(b);
    backend_cuda_forget_xq(c);
    struct cuda_rope_partial_args a = {
        .x = x,
        .n_tok = n_tok,
        .n_heads = n_heads,
        .head_dim = head_dim,
        .n_rot = n_rot,
        .pos0 = pos0,
        .pos_dev = c->recording ? c->step_dev + 1 : NULL,
        .base = base,
        .stream = c->stream,
    };
    int rc = cuda_rope_partial(&a);
    return rc ? backend_cuda_fail(rc, "partial rope") : 0;
}

static int cuda_split_halves_op(struct backend *b, float *q, float *gate, const float *qg, int rows,
                                int hd)
{
    backend_cuda_forget_xq(cuda_of(b));
    int rc = cuda_split_halves(q, gate, qg, rows, hd, cuda_of(b)->stream);
    return rc ? backend_cuda_fail(rc, "q / gate split") : 0;
}

static int cuda_mul_sigmoid_op(struct backend *b, float *x, const float *gate, size_t n)
{
    backend_cuda_forget_xq(cuda_of(b));
    int rc = cuda_mul_sigmoid(x, gate, n, cuda_of(b)->stream);
    return rc ? backend_cuda_fail(rc, "sigmoid gate") : 0;
}

static int cuda_zero_op(struct backend *b, float *p, size_t n)
{
    int rc = cuda_memset(p, 0, n * sizeof(float), cuda_of(b)->stream);
    return rc ? backend_cuda_fail(rc, "zeroing a state") : 0;
}

static int cuda_copy_op(struct backend *b, float *dst, const float *src, size_t n)
{
    int rc = cuda_d2d(dst, src, n * sizeof(float), cuda_of(b)->stream);
    return rc ? backend_cuda_fail(rc, "copying a state") : 0;
}

/* out += sigmoid(shexp_gate_inp . in) * down(silu(gate in) * up in), MAX_TOK rows at a time. */
static int cuda_shared_expert_op(struct backend *b, float *out, const float *in,
                                 const struct layer_weights *lw, int n)
{
    struct backend_cuda *c = cuda_of(b);
    const struct model_hparams *hp = &c->model->hp;
    const size_t fs = hp->n_ff_shexp, e = hp->n_embd;
    if (!c->shexp_scratch || !lw->shexp_gate_inp.dev)
        return err_set(-EINVAL, "cuda shared expert: the model has none on the device");
    for (int r0 = 0; r0 < n; r0 += CUDA_BACKEND_MAX_TOK) {
        int m = n - r0 < CUDA_BACKEND_MAX_TOK ? n - r0 : CUDA_BACKEND_MAX_TOK;
        const float *x = in + (size_t)r0 * e;
        float *g = c->shexp_scratch, *u = g + (size_t)m * fs, *d = u + (size_t)m * fs;
        int rc = backend_cuda_matmul(b, g, &lw->gate_shexp, x, m);
        rc = rc ? rc : backend_cuda_matmul(b, u, &lw->up_shexp, x, m);
        if (rc)
            return rc;
        backend_cuda_forget_xq(c);
        rc = cuda_swiglu_inplace(u, g, (size_t)m * fs, c->stream);
        if (rc)
            return backend_cuda_fail(rc, "shared expert swiglu");
        rc = backend_cuda_matmul(b, d, &lw->down_shexp, u, m);
        if (rc)
            return rc;
        backend_cuda_forget_xq(c);
        rc = cuda_add_sigmoid_gated(out + (size_t)r0 * e, d, x, lw->shexp_gate_inp.dev, m, (int)e,
                                    c->stream);
        if (rc)
            return backend_cuda_fail(rc, "shared expert gate");
    }
    return 0;
}

static int cuda_gdn_op(struct backend *b, const struct gdn_args *a)
{
    struct backend_cuda *c = cuda_of(b);
    const struct model_hparams *hp = &c->model->hp;
    const struct layer_weights *lw = a->lw;
    const int d = (int)hp->ssm_d_state;
    backend_cuda_forget_xq(c);
    struct cuda_ssm_conv_args cv = {
        .x = a->qkv,
        .state = a->conv_state,
        .w = lw->ssm_conv.dev,
        .n_tok = a->n_tok,
        .ch = (int)(2 * hp->ssm_n_k + hp->ssm_n_v) * d,
        .d_conv = (int)hp->ssm_d_conv,
        .stream = c->stream,
    };
    int rc = cuda_ssm_conv(&cv);
    if (rc)
        return backend_cuda_fail(rc, "deltanet conv");
    struct cuda_gdn_args g = {
        .out = a->out,
        .qkv = a->qkv,
        .z = a->z,
        .b = a->b,
        .a = a->a,
        .ba_stride = a->ba_stride,
        .ba_grouped = a->ba_grouped,
        .a_log_neg = lw->ssm_a.dev,
        .dt_bias = lw->ssm_dt_b.dev,
        .norm_w = lw->ssm_norm.dev,
        .state = a->ssm_state,
        .n_tok = a->n_tok,
        .n_k = (int)hp->ssm_n_k,
        .n_v = (int)hp->ssm_n_v,
        .d = d,
        .v_tiled = hp->ssm_v_tiled,
        .eps = hp->rms_eps,
        .form = a->chunk_ok ? CUDA_GDN_AUTO : CUDA_GDN_RECURRENT,
        .stream = c->stream,
    };
    rc = cuda_gdn(&g);
    return rc ? backend_cuda_fail(rc, "deltanet") : 0;
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

/* rope (plain, or YaRN with q->yarn) of n_heads heads of x */
static int cuda_qkr_rope(struct backend *b, const struct qk_rope_args *q, float *x, int n_heads)
{
    return q->yarn ? cuda_rope_yarn_op(b, x, q->n_tok, n_heads, q->head_dim, q->pos0, q->yarn)
                   : cuda_rope_op(b, x, q->n_tok, n_heads, q->head_dim, q->pos0, q->rope_base);
}

static int cuda_qk_rope_store_op(struct backend *b, const struct qk_rope_args *q)
{
    struct backend_cuda *c = cuda_of(b);
    const int kvw = q->n_head_kv * q->head_dim;
    if (q->head_dim > CUDA_QKR_MAX_HEAD_DIM || (q->yarn && q->head_dim / 2 > CUDA_ROPE_MAX_FREQ)) {
        /* the ops one by one */
        int rc = q->q_norm ? cuda_rmsnorm_op(b, q->q, q->q, q->q_norm, q->n_tok * q->n_head,
                                             q->head_dim, q->eps)
                           : 0;
        rc = rc          ? rc
             : q->k_norm ? cuda_rmsnorm_op(b, q->k, q->k, q->k_norm, q->n_tok * q->n_head_kv,
                                           q->head_dim, q->eps)
                         : 0;
        rc = rc ? rc : cuda_qkr_rope(b, q, q->q, q->n_head);
        rc = rc ? rc : cuda_qkr_rope(b, q, q->k, q->n_head_kv);
        rc = rc ? rc : cuda_kv_store_op(b, q->k_cache, q->k, q->pos0, q->n_tok, kvw);
        return rc ? rc : cuda_kv_store_op(b, q->v_cache, q->v, q->pos0, q->n_tok, kvw);
    }
    backend_cuda_forget_xq(c);
    double freq[CUDA_ROPE_MAX_FREQ];
    float mscale = 1.0f;
    if (q->yarn)
        ops_rope_yarn_freq(q->head_dim, q->yarn->base, q->yarn->factor, q->yarn->n_ctx_orig,
                           q->yarn->beta_fast, q->yarn->beta_slow, q->yarn->truncate, freq,
                           &mscale);
    struct cuda_qk_rope_store_args a = {
        .q = q->q,
        .k = q->k,
        .v = q->v,
        .q_norm = q->q_norm ? q->q_norm->dev : NULL,
        .k_norm = q->k_norm ? q->k_norm->dev : NULL,
        .freq = q->yarn ? freq : NULL,
        .mscale = mscale,
        .eps = q->eps,
        .n_tok = q->n_tok,
        .n_head = q->n_head,
        .n_head_kv = q->n_head_kv,
        .head_dim = q->head_dim,
        .pos0 = q->pos0,
        .base = q->rope_base,
        .k_cache = q->k_cache,
        .v_cache = q->v_cache,
        .n_ctx = q->pos0 + q->n_tok,
        .stream = c->stream,
    };
    if (c->recording) { /* the row comes from step_dev[1]; the cache holds graph_stream's n_ctx */
        a.pos_dev = c->step_dev + 1;
        a.n_ctx = c->graph_stream->n_ctx;
    }
    int rc = cuda_qk_rope_store(&a);
    return rc ? backend_cuda_fail(rc, "qk_rope_store") : 0;
}

/* The attention's output feeds the o projection's MMV matmul: the decode kernel's merge also
 * writes its 8-bit copy into mm_scratch (cuda_attention says whether it ran), and the matmul
 * takes it (x_ready). */
static void cuda_att_q8(struct backend_cuda *c, struct cuda_attn_args *a, int rows, int width,
                        int *done)
{
    const size_t off = cuda_matmul_q8_layout(width, rows);
    if (width % 32 || rows < 1 || rows >= CUDA_MATMUL_GEMM_MIN_M || rows > CUDA_BACKEND_MAX_TOK ||
        !off || c->mm_scratch_bytes < off + (size_t)rows * (width / 32) * 8)
        return;
    a->q8_codes = c->mm_scratch;
    a->q8_scales = (uint8_t *)c->mm_scratch + off;
    a->q8_done = done;
    c->mm_writes++;
}

static void cuda_att_q8_done(struct backend_cuda *c, const float *out, int rows, int width)
{
    c->xq_src = out;
    c->xq_m = rows;
    c->xq_n_in = width;
}

static int cuda_attention_op(struct backend *b, const struct attn_args *at)
{
    if (at->sinks && (at->sinks->type || !at->sinks->dev))
        return err_set(-EINVAL, "cuda attention: sinks '%s' not F32 on the device",
                       at->sinks->name);
    backend_cuda_forget_xq(cuda_of(b));
    struct backend_cuda *c = cuda_of(b);
    struct cuda_attn_args a = {
        .out = at->out, .q = at->q, .k_cache = at->k_cache, .v_cache = at->v_cache,
        .pos0 = at->pos0, .n_tok = at->n_tok, .n_ctx = at->pos0 + at->n_tok,
        .pos_dev = c->recording ? c->step_dev + 1 : NULL,
        .n_head = at->n_head, .n_head_kv = at->n_head_kv, .head_dim = at->head_dim,
        .scale = at->scale, .scratch = c->attn_scratch, .scratch_bytes = c->attn_scratch_bytes,
        .stream = c->stream, .sinks = at->sinks ? at->sinks->dev : NULL, .window = at->window,
    };
    if (c->recording) { /* keys up to the position in step_dev[1], of a cache this long */
        a.n_ctx = c->graph_stream->n_ctx;
        /* inside a graph a launch costs less than the merge adds to the attention's tail
         * (the same bits either way; STRATA_ATTN_MERGE=1 in the environment merges in the
         * attention kernel there too, for comparisons) */
        const char *merge = getenv("STRATA_ATTN_MERGE");
        a.combine_apart = !(merge && atoi(merge) == 1);
    }
    int done = 0;
    cuda_att_q8(c, &a, at->n_tok, at->n_head * at->head_dim, &done);
    int rc = cuda_attention(&a);
    if (!rc && done)
        cuda_att_q8_done(c, at->out, at->n_tok, at->n_head * at->head_dim);
    return rc ? backend_cuda_fail(rc, "attention") : 0;
}

/* The step's table (rows_host) for n rows: cache pointers of every layer, then positions. */
static size_t cuda_rows_table_bytes(const struct model_hparams *hp, int n)
{
    return sizeof(void *) * 2 * (size_t)n * hp->n_layer + sizeof(int32_t) * 2 * (size_t)n;
}

static void cuda_rows_graphs_drop(struct backend_cuda *c)
{
    for (int i = 0; i <= CUDA_ROWS_GRAPHS; i++) {
        cuda_graph_destroy(c->rows_exec[i]);
        c->rows_exec[i] = NULL;
        c->rows_key[i] = NULL;
    }
}

static int cuda_rows_begin_op(struct backend *b, const void *batch, struct stream *const *ss,
                              const int *rpos, const int32_t *ids, int n)
{
    struct backend_cuda *c = cuda_of(b);
    const struct model_hparams *hp = &c->model->hp;
    backend_cuda_forget_xq(c);
    auto_step(c, true, n);
    if (n > c->rows_cap) {
        size_t bytes = cuda_rows_table_bytes(hp, n);
        void **host = realloc(c->rows_host, bytes);
        if (!host)
            return err_set(-ENOMEM, "out of memory");
        c->rows_host = host;
        cuda_rows_graphs_drop(c); /* they read the table being replaced */
        cuda_free_op(b, c->rows_dev);
        cuda_free_op(b, c->rows_scratch);
        c->rows_cap = 0;
        c->rows_scratch_bytes =
            cuda_attention_rows_scratch_bytes(n, (int)hp->n_head, (int)hp->head_dim);
        c->rows_dev = cuda_alloc(b, (bytes + sizeof(float) - 1) / sizeof(float));
        c->rows_scratch = c->rows_dev ? cuda_alloc(b, c->rows_scratch_bytes / sizeof(float) + 1)
                                      : NULL;
        if (!c->rows_dev || !c->rows_scratch)
            return err_wrap(-ENOMEM, "lockstep rows of %d streams: ", n);
        int rc = cuda_memset(c->rows_scratch, 0, c->rows_scratch_bytes, c->stream);
        if (rc)
            return backend_cuda_fail(rc, "lockstep rows' scratch");
        c->rows_cap = n;
    }
    int32_t *pos = (int32_t *)(c->rows_host + 2 * (size_t)n * hp->n_layer);
    int ctx = 1;
    for (uint32_t l = 0; l < hp->n_layer; l++)
        for (int i = 0; i < n; i++) {
            c->rows_host[2 * (size_t)n * l + i] = ss[i]->k_cache + l * ss[i]->kv_layer_floats;
            c->rows_host[2 * (size_t)n * l + n + i] = ss[i]->v_cache + l * ss[i]->kv_layer_floats;
        }
    for (int i = 0; i < n; i++) {
        pos[i] = rpos[i];
        pos[n + i] = ids[i];
        ctx = ss[i]->n_ctx > ctx ? ss[i]->n_ctx : ctx;
    }
    c->rows_n = n;
    c->rows_ctx = ctx;
    /* from pageable memory: the host table may be rewritten as soon as this returns */
    int rc = cuda_h2d(c->rows_dev, c->rows_host, cuda_rows_table_bytes(hp, n), c->stream);
    if (rc)
        return backend_cuda_fail(rc, "lockstep rows");
    /* a graph only where every op reads the table: all resident (no cache, no CPU lane), and
     * attention in one launch (the row-by-row fallback takes positions from the host) */
    if (!c->rows_graph || n > CUDA_ROWS_GRAPHS || moe_layer_slots(c->moe) ||
        moe_layer_cpu_layers(c->moe) ||
        !cuda_attention_rows_ok((int)hp->n_head, (int)hp->n_head_kv, (int)hp->head_dim))
        return 0;
    if (c->rows_exec[n] && c->rows_key[n] == batch && c->rows_key_ctx[n] == ctx) {
        rc = cuda_graph_launch(c->rows_exec[n], c->stream);
        if (rc)
            return backend_cuda_fail(rc, "replaying a lockstep graph");
        moe_layer_replayed(c->moe);
        return 1;
    }
    cuda_graph_destroy(c->rows_exec[n]);
    c->rows_exec[n] = NULL;
    rc = cuda_graph_begin(c->stream);
    if (rc)
        return backend_cuda_fail(rc, "starting a lockstep graph");
    c->rows_recording = true;
    c->rows_rec_n = n;
    c->rows_key[n] = batch;
    c->rows_key_ctx[n] = ctx;
    moe_layer_set_recording(c->moe, true);
    return 0;
}

static int cuda_attention_rows_op(struct backend *b, const struct attn_rows_args *ra)
{
    struct backend_cuda *c = cuda_of(b);
    const struct model_hparams *hp = &c->model->hp;
    const int n = ra->n, kvw = ra->n_head_kv * ra->head_dim;
    backend_cuda_forget_xq(c);
    if (n != c->rows_n || ra->layer < 0 || ra->layer >= (int)hp->n_layer)
        return err_set(-EINVAL, "attention_rows: %d rows at layer %d after rows_begin of %d", n,
                       ra->layer, c->rows_n);
    void **kz = c->rows_host + 2 * (size_t)n * ra->layer;
    void **kz_dev = (void **)c->rows_dev + 2 * (size_t)n * ra->layer;
    const int32_t *pos = (const int32_t *)(c->rows_host + 2 * (size_t)n * hp->n_layer);
    const int32_t *pos_dev = (const int32_t *)((void **)c->rows_dev + 2 * (size_t)n * hp->n_layer);
    int rc = 0;
    if (ra->head_dim <= CUDA_QKR_MAX_HEAD_DIM) { /* norms, RoPE and the stores in one launch */
        struct cuda_qk_rope_store_args qa = {
            .q = ra->q, .k = ra->k, .v = ra->v, .q_norm = ra->q_norm ? ra->q_norm->dev : NULL,
            .k_norm = ra->k_norm ? ra->k_norm->dev : NULL, .eps = ra->rms_eps, .n_tok = n,
            .n_head = ra->n_head, .n_head_kv = ra->n_head_kv, .head_dim = ra->head_dim,
            .pos_dev = pos_dev, .base = ra->rope_base, .caches_dev = (float *const *)kz_dev,
            .n_ctx = c->rows_ctx, .stream = c->stream,
        };
        rc = cuda_qk_rope_store(&qa);
    } else {
        struct cuda_rmsnorm_args nq = {
            .out = ra->q, .in = ra->q, .w = ra->q_norm ? ra->q_norm->dev : NULL,
            .rows = n * ra->n_head, .dim = ra->head_dim, .eps = ra->rms_eps, .stream = c->stream,
        };
        struct cuda_rmsnorm_args nk = nq;
        nk.out = ra->k;
        nk.in = ra->k;
        nk.w = ra->k_norm ? ra->k_norm->dev : NULL;
        nk.rows = n * ra->n_head_kv;
        struct cuda_rope_args rq = {
            .x = ra->q, .n_tok = n, .n_heads = ra->n_head, .head_dim = ra->head_dim,
            .pos_dev = pos_dev, .base = ra->rope_base, .stream = c->stream,
        };
        struct cuda_rope_args rk = rq;
        rk.x = ra->k;
        rk.n_heads = ra->n_head_kv;
        struct cuda_kv_store_args sk = {
            .src = ra->k, .n_tok = n, .width = kvw, .n_ctx = c->rows_ctx, .pos_dev = pos_dev,
            .caches_dev = (float *const *)kz_dev, .stream = c->stream,
        };
        struct cuda_kv_store_args sv = sk;
        sv.src = ra->v;
        sv.caches_dev = (float *const *)kz_dev + n;
        rc = ra->q_norm ? cuda_rmsnorm(&nq) : 0;
        rc = rc ? rc : ra->k_norm ? cuda_rmsnorm(&nk) : 0;
        rc = rc ? rc : cuda_rope_neox(&rq);
        rc = rc ? rc : cuda_rope_neox(&rk);
        rc = rc ? rc : cuda_kv_store(&sk);
        rc = rc ? rc : cuda_kv_store(&sv);
    }
    if (rc)
        return backend_cuda_fail(rc, "attention_rows");
    struct cuda_attn_args a = {
        .out = ra->out, .q = ra->q, .pos_dev = pos_dev, .n_tok = n,
        .k_rows = (const float *const *)kz_dev, .v_rows = (const float *const *)kz_dev + n,
        .n_ctx = c->rows_ctx, .n_head = ra->n_head, .n_head_kv = ra->n_head_kv,
        .head_dim = ra->head_dim, .scale = ra->scale, .scratch = c->rows_scratch,
        .scratch_bytes = c->rows_scratch_bytes, .stream = c->stream,
    };
    int done = 0;
    cuda_att_q8(c, &a, n, ra->n_head * ra->head_dim, &done);
    rc = cuda_attention(&a);
    if (!rc && done)
        cuda_att_q8_done(c, ra->out, n, ra->n_head * ra->head_dim);
    /* heads the one-launch kernel does not take: one call per row */
    for (int i = 0; rc == -ENOTSUP && i < n; i++) {
        struct attn_args at = {
            .out = ra->out + (size_t)i * ra->n_head * ra->head_dim,
            .q = ra->q + (size_t)i * ra->n_head * ra->head_dim,
            .k_cache = kz[i], .v_cache = kz[n + i], .pos0 = pos[i], .n_tok = 1,
            .n_head = ra->n_head, .n_head_kv = ra->n_head_kv, .head_dim = ra->head_dim,
            .scale = ra->scale,
        };
        int r = cuda_attention_op(b, &at);
        if (r)
            return r;
        rc = i + 1 < n ? -ENOTSUP : 0;
    }
    return rc ? backend_cuda_fail(rc, "attention_rows") : 0;
}

static int cuda_add_op(struct backend *b, float *x, const float *y, size_t n)
{
    backend_cuda_forget_xq(cuda_of(b));
    int rc = cuda_add(x, y, n, cuda_of(b)->stream);
    return rc ? backend_cuda_fail(rc, "add") : 0;
}


static int cuda_moe_ffn_op(struct backend *b, const struct moe_args *ma)
{
    struct backend_cuda *c = cuda_of(b);
    const bool q8 = c->xq_src && c->xq_src == ma->in && c->xq_m == ma->n_tok &&
                    c->xq_n_in == (int64_t)ma->hp->n_embd;
    c->moe_q8_in = q8 ? ma->in : NULL;
    c->moe_q8_m = ma->n_tok;
    c->moe_q8_mark = c->mm_writes;
    backend_cuda_forget_xq(c);
    moe_layer_set_log(c->moe, ma->n_tok == b->n_route_rows ? b->route_rows : NULL, b->n_route_rows);
    int rc = moe_layer_run(c->moe, ma);
    moe_layer_set_log(c->moe, NULL, 0);
    c->moe_q8_in = NULL;
    return rc;
}

static int cuda_lookahead_op(struct backend *b, const int32_t *ids, int n)
{
    int rc = moe_layer_lookahead(cuda_of(b)->moe, ids, n);
    return rc < 0 ? err_wrap(rc, "cuda backend: lookahead: ") : rc;
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
    return moe_layer_step_end(c->moe);
}

/* ---- automatic placement -------------------------------------------------------------------
 * The expert cache's four ways to serve decode's misses (copies, zero-copy reads in a graph,
 * copies and the CPU lane, the GPU's own cache in a graph) win at different budgets, models and
 * machines (bench/residency.md: on the H200 at 12 GiB zero-copy with a graph decoded 311 tok/s,
 * copies 234, hybrid 159; at 8 GiB hybrid 151, copies 147, zero-copy 122; bench/gpucache.md:
 * W1-real at 2 GiB the GPU's cache 1865, copies 1483), and the hit rate that decides it is only
 * known once the model runs. Leaving the GPU's cache, the device gives the slots back
 * (expert_cache_device_stop). So each is timed on a few decode steps (tune.h: 2 skipped, 8 timed,
 * 4 for a mode already over a quarter slower than the best, such as the CPU lane's 5.85 ms
 * against the GPU's cache's 3.85 at 8 GiB on the 30b-a3b preset; the first mode timed again
 * last on a close call) and the fastest stays; a miss rate that later
 * moves by more than half (and one miss per token) starts the trials again, unless it fell
 * under zero-copy. Zero-copy in a graph goes first where it can and the first decode step's
 * misses allow (auto_open, auto_gate_zc, auto_probe_zc) and stays alone at a low miss rate;
 * otherwise, and without a graph, the copy trial comes first
 * and measures the misses per token, which rule out trials that cannot win
 * (placement_rules.h): hybrid below one miss per token (nothing for the CPU
 * lane, only its per-layer round trip), zero-copy when the misses' copies alone take over
 * PLACEMENT_ZC_SHARE of a copy step (it reads misses at about half the DMA's rate: 118-141 us
 * per expert against 70-73 on the H200, bench/residency.md), and at or under that share the
 * modes made for many misses, hybrid and the GPU's cache, whose trial also leaves the pool
 * holding its own choices. */

#define AUTO_SKIP 2   /* steps after a switch not timed (a graph is recorded in the first) */
#define AUTO_WINDOW 8 /* steps timed per trial */
#define AUTO_WATCH 64 /* steps per look at the miss rate once decided */

static const char *auto_mode_name(enum moe_mode m, bool graph)
{
    return m == MOE_MODE_HYBRID   ? "hybrid"
           : m == MOE_MODE_DEVICE ? (graph ? "gpu cache graph" : "gpu cache")
           : m == MOE_MODE_LANE   ? "gpu cache + CPU lane graph"
           : m == MOE_MODE_COPY   ? "copy"
           : graph                ? "zero-copy graph"
                                  : "zero-copy";
}

static uint64_t auto_misses(const struct backend_cuda *c)
{
    struct moe_cache_totals t;
    return moe_layer_cache_totals(c->moe, &t) ? 0 : t.misses;
}

/* Serves the next steps in mode m: the stream drained, the graph of another mode dropped. */
static int auto_switch(struct backend_cuda *c, enum moe_mode m)
{
    int rc = cuda_stream_sync(c->stream);
    rc = rc ? rc : moe_layer_step_end(c->moe);
    rc = rc ? rc : moe_layer_set_mode(c->moe, m);
    cuda_graph_destroy(c->graph_exec);
    c->graph_exec = NULL;
    c->graph = !rc && c->graph_ok && moe_layer_graph_safe(c->moe);
    return rc;
}

/* After the first trial (copies): the trials its miss rate rules out (placement_rules.h). */
static void auto_prune(struct backend_cuda *c)
{
    const struct tune *t = &c->tune;
    const double m = (double)(auto_misses(c) - c->trial_misses) / (AUTO_SKIP + AUTO_WINDOW);
    const double xfer = m * moe_layer_miss_seconds(c->moe), step = t->cost[t->first];
    bool zc = false;
    for (int i = 0; i < t->n; i++)
        zc |= c->tune_mode[i] == MOE_MODE_ZEROCOPY && i != t->first && !t->dropped[i] &&
              !placement_skip(MOE_MODE_ZEROCOPY, true, m, xfer, step);
    for (int i = 0; i < t->n; i++) {
        const char *why = placement_skip(c->tune_mode[i], zc, m, xfer, step);
        if (!why || i == t->first)
            continue;
        tune_drop(&c->tune, i);
        if (c->log)
            fprintf(c->log,
                    "strata: placement auto: %s not timed: %.1f missed experts per "
                    "step, %.2f ms of copies in %.2f ms: %s\n",
                    auto_mode_name(c->tune_mode[i], c->graph_ok), m, xfer * 1e3, step * 1e3, why);
    }
}

/* Where zero-copy first did not pay (more misses than a tenth of a step could copy): the trials
 * for many misses, zero-copy (the setting in use) dropped, the first one's misses counted from
 * now. They start with the GPU's cache, whose admissions of every miss fill its slots with
 * the text's experts within a few steps; the CPU lane in its graph follows on that state (its
 * own first steps after the hand-over, admitting less, timed 7.10 and 10.88 ms against 5.0
 * and 7.1 in steady decode at 8 and 4 GiB), then hybrid where the lane cannot run: it computes
 * the same misses on the same CPU with a host round trip per layer, and lost to the lane in
 * every trial where the lane followed the GPU's cache (three leases: 8.22-8.49 against
 * 7.46-7.76 ms a step at 4 GiB, 5.71-6.45 against 5.09-6.27 at 8 GiB); run alone at 8 GiB
 * the two changed places between leases (hybrid 185.0 and 169.4 tok/s, the lane 176.9 and
 * 198.9), at 4 GiB the lane led (137.1 against 124.9; bench/lane.md). Copies are not timed
 * where any of those can run: on the H200 they lost to
 * each of them at every budget with many misses (30b-a3b preset, ms a step: 4 GiB copies
 * 11.74, hybrid 8.35, the GPU's cache 8.82, with the lane 7.76; 8 GiB 7.55, 6.34, 5.43, 5.18),
 * and their trial, the slowest, cost the default about a tenth of a 128-token run. */
static bool auto_has(const struct backend_cuda *c, enum moe_mode m)
{
    for (int i = 0; i < c->tune.n; i++)
        if (c->tune_mode[i] == m)
            return true;
    return false;
}

static void auto_many_misses(struct backend_cuda *c)
{
    static const enum moe_mode pref[] = {MOE_MODE_DEVICE, MOE_MODE_LANE, MOE_MODE_HYBRID};
    struct tune *t = &c->tune;
    const int zc = t->cur;
    int copy = 0, first = -1;
    for (int i = 0; i < t->n; i++)
        if (c->tune_mode[i] == MOE_MODE_COPY)
            copy = i;
    for (int p = 0; p < (int)(sizeof(pref) / sizeof(pref[0])) && first < 0; p++)
        for (int i = 0; i < t->n; i++)
            if (c->tune_mode[i] == pref[p])
                first = i;
    c->zc_first = false;
    tune_init(t, t->n, first >= 0 ? first : copy, AUTO_SKIP, AUTO_WINDOW);
    /* The GPU's cache is timed first, right after the hand-over, while its slots fill with the
     * text's experts: at 8 GiB on the 30b-a3b preset its trial took 6.40-6.55 ms a step and the
     * lane's, after it, 4.63-5.45, yet alone the GPU's cache decoded 265.7 tok/s (3.8 ms a
     * step) against the lane's 243.7. So it is timed again last whenever another led it.
     * STRATA_AUTO_RECHECK=0 in the environment leaves that out (for comparisons). */
    const char *recheck = getenv("STRATA_AUTO_RECHECK");
    t->recheck_first =
        first >= 0 && c->tune_mode[first] == MOE_MODE_DEVICE && !(recheck && !strcmp(recheck, "0"));
    tune_drop(t, zc);
    if (first >= 0)
        tune_drop(t, copy);
    for (int i = 0; i < t->n && auto_has(c, MOE_MODE_LANE); i++)
        if (c->tune_mode[i] == MOE_MODE_HYBRID)
            tune_drop(t, i);
    c->trial_misses = auto_misses(c);
}

/* Zero-copy's first trial past its skipped steps, the last of which took `step` seconds: at a
 * miss rate where it reads its misses in place for under PLACEMENT_ZC_SHARE of a step it stays
 * and nothing else is timed (every other mode is for more misses, and copies, the next
 * cheapest there, run without a graph); above it the trials start over from copies without
 * it. */
static void auto_probe_zc(struct backend_cuda *c, double step)
{
    struct tune *t = &c->tune;
    const double m = (double)(auto_misses(c) - c->trial_misses) / AUTO_SKIP;
    const double xfer = m * moe_layer_miss_seconds(c->moe);
    const bool keep = !placement_skip(MOE_MODE_ZEROCOPY, true, m, xfer, step);
    c->zc_first = false;
    if (c->log)
        fprintf(c->log,
                "strata: placement auto: %s: %.1f missed experts per step, %.2f ms of copies "
                "in a %.2f ms step: %s\n",
                auto_mode_name(MOE_MODE_ZEROCOPY, c->graph_ok), m, xfer * 1e3, step * 1e3,
                keep ? "kept, the other modes not timed (they are for more misses)"
                     : "over a tenth: timing the modes for many misses");
    if (keep) {
        for (int i = 0; i < t->n; i++)
            if (i != t->first)
                tune_drop(t, i);
        return;
    }
    auto_many_misses(c);
}

/* Before zero-copy's first trial: the one decode step on copies that ran since trial_misses
 * was taken, in `step` seconds. Where its misses' copies took over PLACEMENT_ZC_SHARE of it,
 * zero-copy is not tried (its steps there take several copy steps: 14.6 ms against 5.3 at 8
 * GiB on the 30b-a3b preset, 29.8 against 8.9 at 4 GiB) and the trials run from copies without
 * it, this step's successor the copy trial's first; else true. */
static bool auto_gate_zc(struct backend_cuda *c, double step)
{
    const double m = (double)(auto_misses(c) - c->trial_misses);
    const double xfer = m * moe_layer_miss_seconds(c->moe);
    if (!placement_skip(MOE_MODE_ZEROCOPY, true, m, xfer, step))
        return true;
    auto_many_misses(c);
    if (c->log)
        fprintf(c->log,
                "strata: placement auto: %s not tried: %.0f missed experts in the first decode "
                "step, %.2f ms of copies in %.2f ms: over a tenth\n",
                auto_mode_name(MOE_MODE_ZEROCOPY, c->graph_ok), m, xfer * 1e3, step * 1e3);
    return false;
}

/* A step is about to run: a stream's evaluation of n tokens (rows false) or a lockstep step of
 * n rows (rows true). Decode steps are timed from one to the next of the same kind and size
 * (a one-token evaluation, or lockstep steps of n rows); anything else stops the clock. */
static void auto_step(struct backend_cuda *c, bool rows, int n)
{
    if (!c->auto_place || c->auto_held)
        return;
    const double now = clock_now_s();
    const bool timed = rows || n == 1;
    if (!timed || rows != c->tune_rows || n != c->tune_n)
        c->tune_last = 0; /* another kind of step: not one decode step from the last */
    c->tune_rows = rows;
    c->tune_n = n;
    if (timed && tune_decided(&c->tune)) { /* steps of another shape for long: time again */
        c->shape_steps = rows == c->chose_rows && n == c->chose_n ? 0 : c->shape_steps + 1;
        if (c->shape_steps == AUTO_SKIP + AUTO_WINDOW) {
            if (c->log)
                fprintf(c->log,
                        "strata: placement auto: %d steps of %d %s: timing the modes "
                        "again\n",
                        c->shape_steps, n, rows ? "lockstep rows" : "tokens");
            tune_restart(&c->tune);
            c->shape_steps = 0;
            c->tune_last = 0;
        }
    }
    if (timed && c->tune_last == 0 && c->tune.trial == 0 && c->tune.seen == 0)
        c->trial_misses = auto_misses(c);
    if (timed && c->tune.trial == 0 && c->tune.seen == 0 &&
        moe_layer_mode(c->moe) != c->tune_mode[c->tune.cur]) {
        /* zero-copy's first trial (auto_open) from the second one-token step in a row: a
         * lone one (a warm-up before a prompt) and the prompt stay on the copy path, and the
         * step before, on copies, says whether zero-copy is worth its two steps */
        if (c->tune_last > 0) {
            if (!auto_gate_zc(c, now - c->tune_last)) { /* the first trial from this step on */
                const enum moe_mode m = c->tune_mode[c->tune.cur];
                if (m != moe_layer_mode(c->moe) && auto_switch(c, m)) {
                    c->auto_place = false;
                    return;
                }
                c->trial_misses = auto_misses(c);
                c->tune_last = now;
                return;
            }
            if (auto_switch(c, c->tune_mode[c->tune.cur])) {
                c->auto_place = false;
                return;
            }
            c->trial_misses = auto_misses(c);
        }
        c->tune_last = now; /* the step before the trial's first is not timed */
        return;
    }
    if (timed && c->tune_last > 0) {
        if (!tune_decided(&c->tune)) {
            const int prev = c->tune.cur, trial = c->tune.trial;
            int next = tune_observe(&c->tune, now - c->tune_last);
            if (c->zc_first && c->tune.trial == 0 && c->tune.seen == AUTO_SKIP) {
                auto_probe_zc(c, now - c->tune_last);
                next = c->tune.cur;
            }
            if (trial == 0 && c->tune.trial > 0 && !c->try_all && !tune_decided(&c->tune)) {
                auto_prune(c);
                next = c->tune.cur;
            }
            if (next != prev && auto_switch(c, c->tune_mode[next])) {
                c->auto_place = false; /* stays as it is; the next op reports the error */
                return;
            }
            if (tune_decided(&c->tune)) {
                c->chose_rows = rows;
                c->chose_n = n;
                c->shape_steps = 0;
                c->watch_steps = 0;
                c->watch_misses = auto_misses(c);
                c->watch_rate = -1;
                if (c->log && c->tune.cost[next] > 0) { /* (auto_probe_zc said why) */
                    fprintf(c->log, "strata: placement auto:");
                    for (int i = 0, k = 0; i < c->tune.n; i++)
                        if (c->tune.cost[i] > 0)
                            fprintf(c->log, "%s %s %.2f ms%s", k++ ? "," : "",
                                    auto_mode_name(c->tune_mode[i], c->graph_ok),
                                    c->tune.cost[i] * 1e3,
                                    c->tune.cut[i] ? " (trial cut short)" : "");
                    fprintf(c->log, " per step: %s from now on\n",
                            auto_mode_name(c->tune_mode[next], c->graph_ok));
                }
            }
        } else if (++c->watch_steps == AUTO_WATCH) {
            const uint64_t m = auto_misses(c);
            const double rate = (double)(m - c->watch_misses) / AUTO_WATCH;
            c->watch_steps = 0;
            c->watch_misses = m;
            if (c->watch_rate < 0) {
                c->watch_rate = rate;
            } else if (placement_retime(moe_layer_mode(c->moe), rate, c->watch_rate)) {
                if (c->log)
                    fprintf(c->log,
                            "strata: placement auto: %.1f missed experts per step, "
                            "%.1f when decided: timing the modes again\n",
                            rate, c->watch_rate);
                tune_restart(&c->tune);
            }
        }
    }
    c->tune_last = timed ? now : 0;
}

static void cuda_eval_begin(struct backend *b, int n)
{
    auto_step(cuda_of(b), false, n);
}

/* With cfg->auto_place: the modes the cache can take, copy first; but zero-copy in a graph
 * first where it can run (not with auto_try_all), from the first decode step on: at a low miss
 * rate it wins (bench/residency.md: 12 GiB on the 30b-a3b preset, 2.63 ms a step against 4.01
 * for copies) and its two skipped steps measure the misses (auto_probe_zc), so the other
 * trials cost nothing there; above it they cost two steps more. */
static void auto_open(struct backend_cuda *c)
{
    static const enum moe_mode order[] = {MOE_MODE_COPY, MOE_MODE_HYBRID, MOE_MODE_ZEROCOPY,
                                          MOE_MODE_DEVICE, MOE_MODE_LANE};
    int n = 0, first = 0, zc = -1;
    /* STRATA_AUTO_LANE=0 in the environment leaves the CPU lane in the GPU cache's graph out
     * (for comparisons) */
    const char *lane = getenv("STRATA_AUTO_LANE");
    const bool no_lane = lane && !strcmp(lane, "0");
    for (int i = 0; i < (int)(sizeof(order) / sizeof(order[0])); i++)
        if (moe_layer_mode_ok(c->moe, order[i]) && !(no_lane && order[i] == MOE_MODE_LANE)) {
            if (order[i] == moe_layer_mode(c->moe))
                first = n;
            if (order[i] == MOE_MODE_ZEROCOPY)
                zc = n;
            c->tune_mode[n++] = order[i];
        }
    c->auto_place = n > 1;
    c->zc_first = c->auto_place && !c->try_all && c->graph_ok && zc >= 0;
    tune_init(&c->tune, n, c->zc_first ? zc : first, AUTO_SKIP, AUTO_WINDOW);
    if (c->auto_place && c->log) {
        fprintf(c->log, "strata: placement auto: timing");
        for (int i = 0; i < n; i++)
            fprintf(c->log, "%s %s", i ? (i + 1 < n ? "," : " and") : "",
                    auto_mode_name(c->tune_mode[i], c->graph_ok));
        fprintf(c->log, " on the first decode steps (%d each%s)\n", AUTO_SKIP + AUTO_WINDOW,
                c->zc_first ? "; zero-copy first, alone at a low miss rate" : "");
    }
}

int backend_cuda_auto_hold(struct backend *b, bool hold)
{
    struct backend_cuda *c = b ? cuda_of(b) : NULL;
    if (!c || !c->moe || !moe_layer_mode_ok(c->moe, MOE_MODE_COPY) || hold == c->auto_held)
        return 0;
    c->auto_held = hold;
    c->tune_last = 0;
    if (hold) {
        c->held_mode = moe_layer_mode(c->moe);
        return c->held_mode == MOE_MODE_COPY ? 0 : auto_switch(c, MOE_MODE_COPY);
    }
    return c->held_mode == MOE_MODE_COPY ? 0 : auto_switch(c, c->held_mode);
}

const char *backend_cuda_placement(const struct backend *b)
{
    const struct backend_cuda *c = (const struct backend_cuda *)b;
    if (!c->moe || !moe_layer_slots(c->moe))
        return moe_layer_cpu_layers(c->moe) ? "static" : "resident";
    return auto_mode_name(moe_layer_mode(c->moe), c->graph);
}

bool backend_cuda_auto_timing(const struct backend *b)
{
    const struct backend_cuda *c = (const struct backend_cuda *)b;
    return c->auto_place && !tune_decided(&c->tune);
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
    /* the GPU's own cache takes the slots (back) first: a recording of an earlier hand-over
     * reads device state that is gone */
    int rc = moe_layer_graph_ready(c->moe);
    if (rc)
        return backend_cuda_fail(rc, "starting the decode graph");
    bool same = c->graph_stream == s && c->graph_bufs[0] == s->arena &&
                c->graph_bufs[1] == s->k_cache && c->graph_bufs[2] == s->v_cache &&
                c->graph_bufs[3] == s->conv_state &&
                c->graph_epoch == moe_layer_graph_epoch(c->moe);
    if (c->graph_exec && !same) { /* another stream's buffers: record anew */
        cuda_graph_destroy(c->graph_exec);
        c->graph_exec = NULL;
    }
    if (ids[0] < 0 || (uint64_t)ids[0] >= c->model->tok_embd.ne[1])
        return err_set(-EINVAL, "token id %d is outside the vocabulary (%llu)", ids[0],
                       (unsigned long long)c->model->tok_embd.ne[1]);
    c->step_pin[0] = ids[0]; /* the previous replay is done: read synced the stream */
    c->step_pin[1] = pos;
    c->step_pin[2] = (int32_t)++c->lane_seq;
    if (c->graph_exec) {
        rc = cuda_graph_launch(c->graph_exec, c->stream);
        if (rc)
            return backend_cuda_fail(rc, "replaying the decode graph");
        moe_layer_replayed(c->moe); /* every layer's routing was read back, as recorded */
        rc = moe_layer_lane_serve(c->moe, c->lane_seq);
        return rc ? backend_cuda_fail(rc, "the CPU lane of the decode graph") : 1;
    }
    rc = cuda_graph_begin(c->stream);
    rc = rc ? rc : cuda_h2d(c->step_dev, c->step_pin, 3 * sizeof(int32_t), c->stream);
    if (rc)
        return backend_cuda_fail(rc, "starting the decode graph");
    c->recording = true;
    c->graph_stream = s;
    c->graph_epoch = moe_layer_graph_epoch(c->moe);
    c->graph_bufs[0] = s->arena;
    c->graph_bufs[1] = s->k_cache;
    c->graph_bufs[2] = s->v_cache;
    c->graph_bufs[3] = s->conv_state; /* recurrent models: with ssm_state and hy, allocated
                                       * with the stream */
    moe_layer_set_recording(c->moe, true);
    return 0;
}

static int cuda_step_end(struct backend *b, int rc)
{
    backend_cuda_forget_xq(cuda_of(b));
    struct backend_cuda *c = cuda_of(b);
    if (!rc) /* the zero-copy path's routing read-back, inside a recording too */
        rc = moe_layer_step_flush(c->moe);
    if (c->rows_recording) {
        void *exec = NULL;
        int n = c->rows_rec_n;
        c->rows_recording = false;
        moe_layer_set_recording(c->moe, false);
        int grc = cuda_graph_end(c->stream, &exec);
        if (rc || grc) {
            cuda_graph_destroy(exec);
            c->rows_key[n] = NULL;
            return rc ? rc : backend_cuda_fail(grc, "recording a lockstep graph");
        }
        c->rows_exec[n] = exec;
        grc = cuda_graph_launch(exec, c->stream);
        return grc ? backend_cuda_fail(grc, "running a lockstep graph") : 0;
    }
    if (!c->recording)
        return rc;
    c->recording = false;
    moe_layer_set_recording(c->moe, false);
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
    if (grc)
        return backend_cuda_fail(grc, "running the decode graph");
    grc = moe_layer_lane_serve(c->moe, c->lane_seq);
    return grc ? backend_cuda_fail(grc, "the CPU lane of the decode graph") : 0;
}

static int cuda_read_argmax_op(struct backend *b, const float *x, int n, int32_t *out)
{
    backend_cuda_forget_xq(cuda_of(b));
    struct backend_cuda *c = cuda_of(b);
    static int wide = -1; /* STRATA_ARGMAX_WIDE=0: one block (for comparisons) */
    if (wide < 0) {
        const char *env = getenv("STRATA_ARGMAX_WIDE");
        wide = !(env && env[0] == '0');
    }
    int rc = wide ? cuda_argmax_wide(x, n, c->argmax_dev, c->argmax_scratch, c->stream)
                  : cuda_argmax(x, 1, n, c->argmax_dev, c->stream);
    rc = rc ? rc : cuda_d2h(out, c->argmax_dev, sizeof(int32_t), c->stream);
    rc = rc ? rc : cuda_stream_sync(c->stream);
    if (rc)
        return backend_cuda_fail(rc, "argmax on the device");
    /* the step is over, as after read */
    return moe_layer_step_end(c->moe);
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
    moe_layer_close(c->moe);
    disk_tier_close(c->tier);
    model_weights_each(c->model, cuda_weight_release, NULL);
    cuda_free(c->ids_dev);
    cuda_free(c->mm_scratch);
    cuda_free(c->attn_scratch);
    cuda_free(c->router_logits);
    cuda_free(c->moe_scratch);
    cuda_free(c->shexp_scratch);
    cuda_graph_destroy(c->graph_exec);
    cuda_host_free(c->step_pin);
    cuda_free(c->step_dev);
    cuda_free(c->argmax_dev);
    cuda_free(c->argmax_scratch);
    cuda_rows_graphs_drop(c);
    cuda_free(c->rows_dev);
    cuda_free(c->rows_scratch);
    free(c->rows_host);
    cuda_stream_destroy(c->stream);
    free(c->blocks);
    free(c);
}

static const struct backend_ops cuda_ops_table = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free_op,
    .embed = cuda_embed_op,
    .rmsnorm = cuda_rmsnorm_op,
    .matmul = backend_cuda_matmul,
    .matmul_n = cuda_matmul_n_op,
    .matmul_bias_n = cuda_matmul_bias_n_op,
    .rope = cuda_rope_op,
    .rope_yarn = cuda_rope_yarn_op,
    .add_bias = cuda_add_bias_op,
    .attn_sinks_window = true,
    .rope_partial = cuda_rope_partial_op,
    .split_halves = cuda_split_halves_op,
    .mul_sigmoid = cuda_mul_sigmoid_op,
    .shared_expert = cuda_shared_expert_op,
    .gdn = cuda_gdn_op,
    .zero = cuda_zero_op,
    .copy = cuda_copy_op,
    .kv_store = cuda_kv_store_op,
    .qk_rope_store = cuda_qk_rope_store_op,
    .attention = cuda_attention_op,
    .rows_begin = cuda_rows_begin_op,
    .attention_rows = cuda_attention_rows_op,
    .add = cuda_add_op,
    .add_rmsnorm = cuda_add_rmsnorm_op,
    .moe_ffn = cuda_moe_ffn_op,
    .read = cuda_read_op,
    .step_begin = cuda_step_begin,
    .step_end = cuda_step_end,
    .eval_begin = cuda_eval_begin,
    .read_argmax = cuda_read_argmax_op,
    .lookahead = cuda_lookahead_op,
    .close = cuda_close_op,
};

/* Whether w is one of the stacked expert tensors (the MoE layer places those). */
static bool cuda_is_experts(const struct model *m, const struct weight *w)
{
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        const struct layer_weights *lw = &m->layers[l];
        if (w == &lw->gate_exps || w == &lw->up_exps || w == &lw->down_exps)
            return true;
    }
    return false;
}

/* Uploads one weight and grows the matmul scratch to what it needs at MAX_TOK rows. */
static int cuda_weight_upload(struct backend_cuda *c, struct weight *w)
{
    if (cuda_malloc(&w->dev, w->bytes))
        return err_set(-ENOMEM, "cuda backend: no device memory for '%s' (%.1f MiB; %.2f GiB "
                                "of weights uploaded so far)",
                       w->name, w->bytes / 1048576.0, c->weight_bytes / 1073741824.0);
    if (cuda_h2d(w->dev, w->data, w->bytes, c->stream))
        return err_set(-EIO, "cuda backend: uploading '%s' failed", w->name);
    c->weight_bytes += w->bytes;
    if (w->n_dims >= 2 && !cuda_matmul_supported(w->type) && w != &c->model->tok_embd)
        return err_set(-ENOTSUP, "cuda backend: no GPU kernel for '%s' of type %u", w->name,
                       w->type);
    size_t s = cuda_matmul_scratch_bytes(w->type, (int64_t)w->ne[0], (int64_t)w->ne[1],
                                         CUDA_BACKEND_MAX_TOK);
    if (w->n_dims == 2 && s > c->mm_scratch_bytes)
        c->mm_scratch_bytes = s;
    return 0;
}

/* model_weights_each callback: the trunk, everything but the stacked experts. */
static void cuda_trunk_upload(struct weight *w, void *arg)
{
    struct backend_cuda *c = arg;
    if (!c->rc && !cuda_is_experts(c->model, w))
        c->rc = cuda_weight_upload(c, w);
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
    /* its counters start at zero (cuda_attention.h) */
    rc = rc ? rc : cuda_memset(c->attn_scratch, 0, c->attn_scratch_bytes, c->stream);
    rc = rc ? rc : cuda_malloc((void **)&c->router_logits, sizeof(float) * 2 * t * hp->n_expert);
    rc = rc ? rc : cuda_malloc(&c->moe_scratch, c->moe_scratch_bytes);
    rc = rc ? rc : cuda_malloc((void **)&c->argmax_dev, sizeof(int32_t));
    rc = rc ? rc : cuda_malloc(&c->argmax_scratch, CUDA_ARGMAX_SCRATCH);
    rc = rc ? rc : cuda_memset(c->argmax_scratch, 0, CUDA_ARGMAX_SCRATCH, c->stream);
    const size_t shexp = hp->n_ff_shexp ? t * (2 * (size_t)hp->n_ff_shexp + hp->n_embd) : 0;
    if (shexp)
        rc = rc ? rc : cuda_malloc((void **)&c->shexp_scratch, sizeof(float) * shexp);
    if (rc)
        return err_set(rc, "cuda backend: cannot allocate the scratch buffers");
    c->alloc_bytes += c->mm_scratch_bytes + c->attn_scratch_bytes + c->moe_scratch_bytes +
                      t * (sizeof(int32_t) + sizeof(float) * hp->n_expert) + sizeof(float) * shexp;
    return 0;
}

/* What stream_open will allocate for n_ctx positions and max_tok tokens (stream.c's sizes:
 * the KV cache of the attending layers, the recurrent state, the activations). */
static uint64_t cuda_stream_bytes(const struct model_hparams *hp, uint64_t n_ctx, uint64_t t)
{
    uint64_t qw = (uint64_t)hp->n_head * hp->head_dim, kvw = (uint64_t)hp->n_head_kv * hp->head_dim;
    uint64_t kv = 2 * n_ctx * kvw * model_n_kv_layers(hp);
    uint64_t state = 2 * (uint64_t)model_n_ssm_layers(hp) * /* and its checkpoint */
                     (model_conv_state_floats(hp) + model_ssm_state_floats(hp));
    uint64_t arena =
        t * hp->n_embd * 3 + t * qw * 2 + t * kvw * 2 + hp->n_vocab + t * stream_hybrid_floats(hp);
    return sizeof(float) * (kv + state + arena);
}

/* A lockstep batch of t rows (stream_batch_open's arena, rows_begin's table and scratch). */
static uint64_t cuda_batch_bytes(const struct model_hparams *hp, uint64_t t)
{
    uint64_t qw = (uint64_t)hp->n_head * hp->head_dim, kvw = (uint64_t)hp->n_head_kv * hp->head_dim;
    uint64_t arena = sizeof(float) * t *
                     (3 * hp->n_embd + 2 * qw + 2 * kvw + hp->n_vocab + stream_hybrid_floats(hp));
    uint64_t table = sizeof(void *) * 2 * t * hp->n_layer + sizeof(int32_t) * t;
    return arena + table + cuda_attention_rows_scratch_bytes((int)t, (int)hp->n_head,
                                                             (int)hp->head_dim);
}

static const struct moe_device_ops cuda_moe_ops;

/* The MoE layer's configuration from the backend's. */
static struct moe_layer_config cuda_moe_config(struct backend_cuda *c,
                                               const struct backend_cuda_config *cfg)
{
    const struct model_hparams *hp = &c->model->hp;
    const int n_streams = cfg->n_streams > 0 ? cfg->n_streams : 1;
    const uint64_t n_ctx = cfg->n_ctx > 0 ? (uint64_t)cfg->n_ctx : 4096;
    const uint64_t one = cuda_stream_bytes(hp, n_ctx, cfg->max_tok > 0 ? (uint64_t)cfg->max_tok : 512);
    struct moe_layer_config mc = {
        .max_tok = CUDA_BACKEND_MAX_TOK,
        .device = cfg->device,
        .cpu_layers = cfg->cpu_moe_layers,
        .cache = (cfg->vram_budget || cfg->expert_slots > 0) && !cfg->cpu_moe_layers,
        .vram_budget = cfg->vram_budget,
        .expert_slots = cfg->expert_slots,
        .stream_bytes =
            one * n_streams +
            (n_streams > 1 ? cuda_batch_bytes(hp, n_streams + STRATA_BATCH_JOIN_ROWS) : 0),
        .n_streams = n_streams,
        .n_ctx = (int)n_ctx,
        .stream_one = one + (n_streams > 1 ? cuda_batch_bytes(hp, 1) : 0),
        .fill = cfg->residency == BACKEND_RESIDENCY_ZEROCOPY ? MOE_FILL_ZEROCOPY
                : cfg->residency == BACKEND_RESIDENCY_GPU    ? MOE_FILL_DEVICE
                                                             : MOE_FILL_COPY,
        .prefetch = cfg->prefetch,
        .prefetch_depth = cfg->prefetch_depth,
        .prefetch_top = cfg->prefetch_top,
        .hybrid = cfg->hybrid,
        .modes = cfg->auto_place && !cfg->hybrid && !cfg->prefetch &&
                 cfg->residency != BACKEND_RESIDENCY_GPU,
        .hybrid_no_admit = cfg->hybrid_no_admit,
        .lane_pcie_bps = cfg->lane_pcie_bps,
        .lane_cpu_bps = cfg->lane_cpu_bps,
        .gather = cfg->gather_copies,
        .pin_chunk = cfg->pin_chunk,
        .stream = c->stream,
        .observer = cfg->route_observer,
        .observer_ctx = cfg->route_ctx,
        .log = cfg->log,
        .tier = c->tier,
        .tier_ahead = cfg->tier_ahead,
    };
    return mc;
}

int backend_cuda_open(struct model *m, const struct backend_cuda_config *cfg,
                      struct backend **out)
{
    static const struct backend_cuda_config defaults;
    const char *why = NULL;
    struct backend_cuda *c;
    int rc;

    if (!cfg)
        cfg = &defaults;
    if (cuda_device_count(&why) <= cfg->device)
        return err_set(-ENODEV, "no CUDA device %d: %s", cfg->device, why ? why : "fewer devices");
    c = calloc(1, sizeof(*c));
    if (!c)
        return err_set(-ENOMEM, "out of memory");
    c->base.ops = &cuda_ops_table;
    c->base.model = m;
    c->base.impl = c;
    c->model = m;
    rc = cuda_set_device(cfg->device);
    rc = rc ? rc : cuda_stream_create(&c->stream);
    rc = rc ? rc : cuda_matmul_init();
    if (rc) {
        cuda_close_op(&c->base);
        return err_set(rc, "cuda backend: cannot start on device %d", cfg->device);
    }
    c->budget = cfg->vram_budget;
    if (cfg->cpu_moe_layers < -1 || cfg->cpu_moe_layers > (int)m->hp.n_layer ||
        (cfg->cpu_moe_layers < 0 && !c->budget)) {
        cuda_close_op(&c->base);
        return err_set(-EINVAL, "static placement of %d layers (the model has %u; automatic "
                                "needs --vram-budget)",
                       cfg->cpu_moe_layers, m->hp.n_layer);
    }
    if (cfg->host_budget) {
        struct disk_tier_config tc = {
            .host_budget = cfg->host_budget,
            .io = cfg->tier_pread ? DISK_TIER_IO_PREAD : DISK_TIER_IO_AUTO,
            .buffered = cfg->tier_buffered,
            .log = cfg->log,
        };
        /* the tier's slots on the GPU's NUMA node: its copies read them */
        struct cuda_device_info di;
        struct topo *tp = NULL;
        if (cuda_device_info_get(cfg->device, &di) == 0 && topo_open(&tp) == 0) {
            tc.numa_node = topo_pci_numa_node(tp, di.pci_bus_id);
            tc.numa_bind = tc.numa_node >= 0;
        }
        topo_close(tp);
        bool cache = !cfg->cpu_moe_layers && (cfg->vram_budget || cfg->expert_slots > 0);
        rc = !cfg->cpu_moe_layers && !cache
                 ? err_set(-ENOTSUP, "cuda backend: the host tier serves static placement's CPU "
                                     "layers or the expert cache (all resident, no expert is "
                                     "read from host memory)")
             : cache && cfg->residency != BACKEND_RESIDENCY_COPY
                 ? err_set(-ENOTSUP, "cuda backend: a host tier under the expert cache serves "
                                     "its copy path and the hybrid lane (not zero-copy misses)")
                 : disk_tier_open(m, &tc, &c->tier);
        if (rc) {
            cuda_close_op(&c->base);
            return rc;
        }
    }
    model_weights_each(m, cuda_trunk_upload, c);
    rc = c->rc ? c->rc : cuda_buffers(c);
    rc = rc ? rc : cuda_stream_sync(c->stream);
    if (!rc) {
        struct moe_layer_config mc = cuda_moe_config(c, cfg);
        rc = moe_layer_open(m, &mc, &cuda_moe_ops, c, &c->moe);
    }
    rc = rc ? rc : cuda_stream_sync(c->stream);
    c->log = cfg->log;
    c->graph_ok = !cfg->route_observer;
    c->try_all = cfg->auto_try_all;
    if (!rc && cfg->auto_place && !cfg->hybrid && !cfg->prefetch &&
        cfg->residency != BACKEND_RESIDENCY_GPU)
        auto_open(c);
    /* graph decode needs a step without host syncs; all resident, auto placement replays
     * one-token steps from a graph by default (the same bits as launching them one by one) */
    const bool resident = !rc && moe_layer_slots(c->moe) == 0 && !cfg->cpu_moe_layers;
    c->rows_graph = (cfg->graph || c->auto_place) && !rc && moe_layer_graph_safe(c->moe);
    /* the CPU lane under the GPU's own cache is there for graph steps: it implies --graph */
    c->graph = c->rows_graph ||
               (cfg->graph_resident && resident && !rc && moe_layer_graph_safe(c->moe)) ||
               (!rc && c->graph_ok && moe_layer_lane_on(c->moe));
    if (!rc && (c->graph || c->auto_place)) {
        rc = cuda_host_alloc((void **)&c->step_pin, 3 * sizeof(int32_t), &c->step_pin_dev);
        rc = rc ? rc : cuda_malloc((void **)&c->step_dev, 3 * sizeof(int32_t));
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

int backend_cuda_print_stats(const struct backend *b, FILE *f)
{
    return moe_layer_print_stats(((const struct backend_cuda *)b)->moe, f);
}

int backend_cuda_write_stats_json(const struct backend *b, const char *path)
{
    return moe_layer_write_stats_json(((const struct backend_cuda *)b)->moe, path);
}

bool backend_cuda_tier_stats(const struct backend *b, struct disk_tier_stats *out)
{
    const struct backend_cuda *c = b ? (const struct backend_cuda *)b : NULL;
    if (!c || !c->tier)
        return false;
    disk_tier_get_stats(c->tier, out);
    return true;
}

double backend_cuda_cpu_lane_seconds(const struct backend *b)
{
    return moe_layer_cpu_seconds(((const struct backend_cuda *)b)->moe);
}

void backend_cuda_lane_rates(const struct backend *b, double *pcie_bps, double *cpu_bps_open,
                             double *cpu_bps)
{
    moe_layer_lane_rates(((const struct backend_cuda *)b)->moe, pcie_bps, cpu_bps_open, cpu_bps);
}

int backend_cuda_cpu_moe_layers(const struct backend *b)
{
    return moe_layer_cpu_layers(((const struct backend_cuda *)b)->moe);
}

int backend_cuda_restore(struct backend *b, const int32_t *layer, const int32_t *expert, int n,
                         bool pin, void (*progress)(void *ctx, int done, int total), void *ctx)
{
    return moe_layer_preload(((struct backend_cuda *)b)->moe, layer, expert, n, pin, progress,
                             ctx);
}

void backend_cuda_reset_stats(struct backend *b)
{
    moe_layer_reset_stats(((struct backend_cuda *)b)->moe);
}

int backend_cuda_cache_totals(const struct backend *b, struct moe_cache_totals *t)
{
    return moe_layer_cache_totals(((const struct backend_cuda *)b)->moe, t);
}

/* ---- the MoE layer's primitives ------------------------------------------------------------ */

static void *cuda_moe_alloc(void *dev, size_t bytes)
{
    struct backend_cuda *c = dev;
    void *p = NULL;
    if (cuda_malloc(&p, bytes))
        return NULL;
    if (cuda_block_add(c, p, bytes)) {
        cuda_free(p);
        return NULL;
    }
    return p;
}

static void cuda_moe_free(void *dev, void *p)
{
    if (!p)
        return;
    cuda_block_forget(dev, p);
    cuda_free(p);
}

static int cuda_moe_route(void *dev, const struct layer_weights *lw, const float *in, int n_tok,
                          int32_t *ids, float *w)
{
    struct backend_cuda *c = dev;
    const struct model_hparams *hp = &c->model->hp;
    /* gpt-oss: logits + bias, then the same top-k softmax */
    int rc = cuda_matmul_run(&c->base, c->router_logits, &lw->router,
                             lw->router_b.data ? &lw->router_b : NULL, in, n_tok);
    if (rc)
        return rc;
    struct cuda_topk_args tk = {
        .logits = c->router_logits, .n_tok = n_tok, .n_expert = (int)hp->n_expert,
        .k = (int)hp->n_expert_used, .ids = ids, .w = w, .stream = c->stream,
    };
    rc = cuda_softmax_topk(&tk);
    return rc ? backend_cuda_fail(rc, "router top-k") : 0;
}

/* cuda_moe_route's router product alone: the experts call selects from c->router_logits */
static int cuda_moe_route_logits(void *dev, const struct layer_weights *lw, const float *in,
                                 int n_tok, const float **logits)
{
    struct backend_cuda *c = dev;
    int rc = cuda_matmul_run(&c->base, c->router_logits, &lw->router,
                             lw->router_b.data ? &lw->router_b : NULL, in, n_tok);
    *logits = rc ? NULL : c->router_logits;
    return rc;
}

/* Both layers' F32 routers in one matmul launch (cuda_matmul's further matrices: the same bits
 * as a call each), other types one call each; then one top-k over the 2 n_tok rows of logits. */
static int cuda_moe_route2(void *dev, const struct layer_weights *lw,
                           const struct layer_weights *lw2, const float *in, int n_tok,
                           int32_t *ids, float *w)
{
    struct backend_cuda *c = dev;
    const struct model_hparams *hp = &c->model->hp;
    const struct weight *r[2] = {&lw->router, &lw2->router};
    const struct weight *bias[2] = {lw->router_b.data ? &lw->router_b : NULL,
                                    lw2->router_b.data ? &lw2->router_b : NULL};
    float *logits[2] = {c->router_logits, c->router_logits + (size_t)n_tok * hp->n_expert};
    for (int i = 0; i < 2; i++)
        if (bias[i] && !cuda_bias_ok(bias[i], r[i]))
            return cuda_bias_fail(bias[i], r[i]);
    int rc = 0;
    if (r[0]->type == QUANT_F32 && r[1]->type == QUANT_F32 && r[0]->ne[0] == r[1]->ne[0] &&
        n_tok <= CUDA_BACKEND_MAX_TOK) {
        struct cuda_matmul_args a = {
            .wtype = QUANT_F32,
            .w = r[0]->dev,
            .w_stride = r[0]->row_bytes,
            .n_in = (int64_t)r[0]->ne[0],
            .n_out = (int64_t)r[0]->ne[1],
            .m = n_tok,
            .x = in,
            .x_stride = (int64_t)r[0]->ne[0],
            .y = logits[0],
            .y_stride = (int64_t)r[0]->ne[1],
            .bias = bias[0] ? bias[0]->dev : NULL,
            .stream = c->stream,
            .n_more = 1,
        };
        a.more[0] = (struct cuda_matmul_more){
            .w = r[1]->dev,
            .w_stride = r[1]->row_bytes,
            .n_out = (int64_t)r[1]->ne[1],
            .y = logits[1],
            .y_stride = (int64_t)r[1]->ne[1],
            .bias = bias[1] ? bias[1]->dev : NULL,
        };
        rc = cuda_matmul(&a);
        if (rc)
            return err_set(rc, "cuda matmul over '%s' and '%s' (m %d) failed", r[0]->name,
                           r[1]->name, n_tok);
    } else {
        for (int i = 0; i < 2 && !rc; i++)
            rc = cuda_matmul_run(&c->base, logits[i], r[i], bias[i], in, n_tok);
        if (rc)
            return rc;
    }
    struct cuda_topk_args tk = {
        .logits = c->router_logits,
        .n_tok = 2 * n_tok,
        .n_expert = (int)hp->n_expert,
        .k = (int)hp->n_expert_used,
        .ids = ids,
        .w = w,
        .stream = c->stream,
    };
    rc = cuda_softmax_topk(&tk);
    return rc ? backend_cuda_fail(rc, "router top-k") : 0;
}

static int cuda_moe_experts(void *dev, const struct moe_expert_call *e)
{
    struct backend_cuda *c = dev;
    const struct model_hparams *hp = &c->model->hp;
    const struct layer_weights *lw = e->lw;
    uint64_t n = hp->n_expert;
    struct cuda_moe_args a = {
        .out = e->out,
        .out_stride = hp->n_embd,
        .in = e->in,
        .in_stride = hp->n_embd,
        .n_tok = e->n_tok,
        .k = (int)hp->n_expert_used,
        .n_expert = (int)n,
        .n_embd = hp->n_embd,
        .n_ff = hp->n_ff_exp,
        .ids = e->ids,
        .weights = e->w,
        .gate_type = lw->gate_exps.type,
        .up_type = lw->up_exps.type,
        .down_type = lw->down_exps.type,
        .gate = lw->gate_exps.dev,
        .up = lw->up_exps.dev,
        .down = lw->down_exps.dev,
        .gate_stride = lw->gate_exps.bytes / n,
        .up_stride = lw->up_exps.bytes / n,
        .down_stride = lw->down_exps.bytes / n,
        .gate_ptrs = e->gate,
        .up_ptrs = e->up,
        .down_ptrs = e->down,
        .gate_b = lw->gate_exps_b.dev,
        .up_b = lw->up_exps_b.dev,
        .down_b = lw->down_exps_b.dev,
        .act_oai = hp->swiglu_oai,
        .logits = e->logits,
        .ids_out = e->select_ids,
        .weights_out = e->select_w,
        .scratch = c->moe_scratch,
        .scratch_bytes = c->moe_scratch_bytes,
        .stream = c->stream,
    };
    if (c->moe_q8_in && e->in == c->moe_q8_in && e->n_tok == c->moe_q8_m &&
        c->mm_writes == c->moe_q8_mark) { /* the norm's 8-bit rows of in, still there */
        a.in_q8 = c->mm_scratch;
        a.in_q8_scales =
            (const uint8_t *)c->mm_scratch + cuda_matmul_q8_layout((int64_t)hp->n_embd, e->n_tok);
    }
    int rc = cuda_moe_ffn(&a);
    if (rc)
        return err_set(rc, "layer %d: cuda experts failed (types %u/%u/%u)", e->layer,
                       lw->gate_exps.type, lw->up_exps.type, lw->down_exps.type);
    return 0;
}

static int cuda_moe_to_host(void *dev, void *host, const void *src, size_t bytes)
{
    int rc = cuda_d2h(host, src, bytes, ((struct backend_cuda *)dev)->stream);
    return rc ? backend_cuda_fail(rc, "a copy to the host") : 0;
}

static void *cuda_moe_host_alloc(void *dev, size_t bytes)
{
    void *p = NULL, *mapped = NULL;
    (void)dev;
    return cuda_host_alloc(&p, bytes, &mapped) ? NULL : p;
}

static void cuda_moe_host_free(void *dev, void *p)
{
    (void)dev;
    cuda_host_free(p);
}

static int cuda_moe_to_device(void *dev, void *dst, const void *host, size_t bytes)
{
    /* pageable source: the call returns once it is staged, so the caller may reuse it */
    int rc = cuda_h2d(dst, host, bytes, ((struct backend_cuda *)dev)->stream);
    return rc ? backend_cuda_fail(rc, "a copy to the device") : 0;
}

static int cuda_moe_add(void *dev, float *x, const float *y, size_t n)
{
    int rc = cuda_add(x, y, n, ((struct backend_cuda *)dev)->stream);
    return rc ? backend_cuda_fail(rc, "add") : 0;
}

static int cuda_moe_sync(void *dev)
{
    int rc = cuda_stream_sync(((struct backend_cuda *)dev)->stream);
    return rc ? backend_cuda_fail(rc, "stream sync") : 0;
}

static int cuda_moe_upload(void *dev, const struct weight *w)
{
    return cuda_weight_upload(dev, (struct weight *)w);
}

static void cuda_moe_held(void *dev, uint64_t *weights, uint64_t *other)
{
    struct backend_cuda *c = dev;
    *weights = c->weight_bytes;
    *other = c->alloc_bytes;
}

static double cuda_moe_h2d_bandwidth(void *dev)
{
    (void)dev;
    return cuda_h2d_bandwidth(NULL, (size_t)64 << 20, 5);
}

static void *cuda_moe_mapped_alloc(void *dev, size_t bytes, void **dev_ptr)
{
    void *p = NULL;
    (void)dev;
    return cuda_host_alloc(&p, bytes, dev_ptr) ? NULL : p;
}

static int cuda_moe_lane(void *dev, struct cuda_lane_call *a, bool join)
{
    struct backend_cuda *c = dev;
    if (!c->recording || !c->step_dev)
        return err_set(-EINVAL, "the CPU lane runs inside a recorded decode step only");
    a->seq = (const uint32_t *)(c->step_dev + 2);
    int rc = join ? cuda_lane_join(a, c->stream) : cuda_lane_post(a, c->stream);
    return rc ? backend_cuda_fail(rc, "the CPU lane's kernels") : 0;
}

static const struct moe_device_ops cuda_moe_ops = {
    .alloc = cuda_moe_alloc,
    .free = cuda_moe_free,
    .route = cuda_moe_route,
    .route2 = cuda_moe_route2,
    .route_logits = cuda_moe_route_logits,
    .experts = cuda_moe_experts,
    .to_host = cuda_moe_to_host,
    .host_alloc = cuda_moe_host_alloc,
    .host_free = cuda_moe_host_free,
    .to_device = cuda_moe_to_device,
    .add = cuda_moe_add,
    .sync = cuda_moe_sync,
    .upload = cuda_moe_upload,
    .held = cuda_moe_held,
    .h2d_bandwidth = cuda_moe_h2d_bandwidth,
    .mapped_alloc = cuda_moe_mapped_alloc,
    .lane = cuda_moe_lane,
};
