#include "backend_profile.h"

#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "errors.h"
#include "generate.h"

enum prof_op {
    P_EMBED, P_RMSNORM, P_MATMUL, P_ROPE, P_KV, P_ATTN, P_ADD, P_MOE, P_SHEXP, P_GDN, P_READ,
    P_N
};

static const char *const prof_names[P_N] = {"embed", "rmsnorm",   "matmul",   "rope",
                                            "kv_store", "attention", "add",   "moe_ffn",
                                            "shared_ffn", "deltanet", "read"};

struct backend_prof {
    struct backend base;
    struct backend_ops ops; /* prof_ops less the optional ops the wrapped backend lacks */
    struct backend *inner;
    double t[P_N];
    long n[P_N];
};

static struct backend_prof *prof_of(struct backend *b)
{
    return (struct backend_prof *)b;
}

/* Times one forwarded call: evaluates CALL with `in` bound to the wrapped backend. */
#define PROF(op, CALL)                                                                         \
    do {                                                                                       \
        struct backend_prof *p = prof_of(b);                                                   \
        struct backend *in = p->inner;                                                         \
        double t0 = generate_now();                                                            \
        int rc = CALL;                                                                         \
        p->t[op] += generate_now() - t0;                                                       \
        p->n[op]++;                                                                            \
        return rc;                                                                             \
    } while (0)

static float *prof_alloc(struct backend *b, size_t n)
{
    return prof_of(b)->inner->ops->alloc(prof_of(b)->inner, n);
}

static void prof_free(struct backend *b, float *x)
{
    prof_of(b)->inner->ops->free(prof_of(b)->inner, x);
}

static int prof_embed(struct backend *b, float *out, const struct weight *w, const int32_t *ids,
                      int n)
{
    PROF(P_EMBED, in->ops->embed(in, out, w, ids, n));
}

static int prof_rmsnorm(struct backend *b, float *out, const float *x, const struct weight *w,
                        int rows, int dim, float eps)
{
    PROF(P_RMSNORM, in->ops->rmsnorm(in, out, x, w, rows, dim, eps));
}

static int prof_matmul(struct backend *b, float *out, const struct weight *w, const float *x,
                       int m)
{
    PROF(P_MATMUL, in->ops->matmul(in, out, w, x, m));
}

static int prof_matmul_n(struct backend *b, int n, float *const *out, const struct weight *const *w,
                         const float *x, int m)
{
    PROF(P_MATMUL, in->ops->matmul_n(in, n, out, w, x, m));
}

static int prof_rope(struct backend *b, float *x, int n_tok, int n_heads, int head_dim, int pos0,
                     float base)
{
    PROF(P_ROPE, in->ops->rope(in, x, n_tok, n_heads, head_dim, pos0, base));
}

static int prof_rope_yarn(struct backend *b, float *x, int n_tok, int n_heads, int head_dim,
                          int pos0, const struct rope_yarn *y)
{
    PROF(P_ROPE, in->ops->rope_yarn(in, x, n_tok, n_heads, head_dim, pos0, y));
}

static int prof_add_bias(struct backend *b, float *x, const struct weight *bias, int rows)
{
    PROF(P_ADD, in->ops->add_bias(in, x, bias, rows));
}

static int prof_kv_store(struct backend *b, float *cache, const float *src, int pos0, int n_tok,
                         int width)
{
    PROF(P_KV, in->ops->kv_store(in, cache, src, pos0, n_tok, width));
}

static int prof_attention(struct backend *b, const struct attn_args *a)
{
    PROF(P_ATTN, in->ops->attention(in, a));
}

static int prof_add(struct backend *b, float *x, const float *y, size_t n)
{
    PROF(P_ADD, in->ops->add(in, x, y, n));
}

static int prof_moe_ffn(struct backend *b, const struct moe_args *a)
{
    PROF(P_MOE, in->ops->moe_ffn(in, a));
}

static int prof_rope_partial(struct backend *b, float *x, int n_tok, int n_heads, int head_dim,
                             int n_rot, int pos0, float base)
{
    PROF(P_ROPE, in->ops->rope_partial(in, x, n_tok, n_heads, head_dim, n_rot, pos0, base));
}

static int prof_split_halves(struct backend *b, float *q, float *gate, const float *qg, int rows,
                             int hd)
{
    PROF(P_ADD, in->ops->split_halves(in, q, gate, qg, rows, hd));
}

static int prof_mul_sigmoid(struct backend *b, float *x, const float *gate, size_t n)
{
    PROF(P_ADD, in->ops->mul_sigmoid(in, x, gate, n));
}

static int prof_shared_expert(struct backend *b, float *out, const float *x,
                              const struct layer_weights *lw, int n)
{
    PROF(P_SHEXP, in->ops->shared_expert(in, out, x, lw, n));
}

static int prof_gdn(struct backend *b, const struct gdn_args *a)
{
    PROF(P_GDN, in->ops->gdn(in, a));
}

static int prof_zero(struct backend *b, float *x, size_t n)
{
    PROF(P_ADD, in->ops->zero(in, x, n));
}

static int prof_copy(struct backend *b, float *dst, const float *src, size_t n)
{
    PROF(P_ADD, in->ops->copy(in, dst, src, n));
}

static int prof_read(struct backend *b, float *host, const float *src, size_t n)
{
    PROF(P_READ, in->ops->read(in, host, src, n));
}

static int prof_read_argmax(struct backend *b, const float *x, int n, int32_t *out)
{
    PROF(P_READ, in->ops->read_argmax(in, x, n, out));
}

/* Not timed: the backend's own bookkeeping (the CPU backend times decode steps to pick its
 * thread count). */
static void prof_eval_begin(struct backend *b, int n)
{
    struct backend *in = prof_of(b)->inner;
    in->ops->eval_begin(in, n);
}

static void prof_close(struct backend *b)
{
    backend_close(prof_of(b)->inner);
    free(b);
}

static const struct backend_ops prof_ops = {
    .name = "profiled",
    .alloc = prof_alloc,
    .free = prof_free,
    .embed = prof_embed,
    .rmsnorm = prof_rmsnorm,
    .matmul = prof_matmul,
    .matmul_n = prof_matmul_n,
    .rope = prof_rope,
    .rope_yarn = prof_rope_yarn,
    .add_bias = prof_add_bias,
    .rope_partial = prof_rope_partial,
    .split_halves = prof_split_halves,
    .mul_sigmoid = prof_mul_sigmoid,
    .shared_expert = prof_shared_expert,
    .gdn = prof_gdn,
    .zero = prof_zero,
    .copy = prof_copy,
    .kv_store = prof_kv_store,
    .attention = prof_attention,
    .add = prof_add,
    .moe_ffn = prof_moe_ffn,
    .read = prof_read,
    .read_argmax = prof_read_argmax,
    .eval_begin = prof_eval_begin,
    .close = prof_close,
};

int backend_profile_open(struct backend *inner, struct backend **out)
{
    struct backend_prof *p = calloc(1, sizeof(*p));
    if (!p)
        return err_set(-ENOMEM, "out of memory");
    p->ops = prof_ops;
    if (!inner->ops->rope_yarn)
        p->ops.rope_yarn = NULL;
    if (!inner->ops->add_bias)
        p->ops.add_bias = NULL;
    if (!inner->ops->matmul_n)
        p->ops.matmul_n = NULL;
    if (!inner->ops->eval_begin)
        p->ops.eval_begin = NULL;
    if (!inner->ops->read_argmax)
        p->ops.read_argmax = NULL;
    p->ops.attn_sinks_window = inner->ops->attn_sinks_window;
    if (!inner->ops->rope_partial || !inner->ops->split_halves || !inner->ops->mul_sigmoid ||
        !inner->ops->shared_expert || !inner->ops->gdn) {
        p->ops.rope_partial = NULL;
        p->ops.split_halves = NULL;
        p->ops.mul_sigmoid = NULL;
        p->ops.shared_expert = NULL;
        p->ops.gdn = NULL;
    }
    if (!inner->ops->zero)
        p->ops.zero = NULL;
    if (!inner->ops->copy)
        p->ops.copy = NULL;
    p->base.ops = &p->ops;
    p->base.model = inner->model;
    p->base.impl = p;
    p->inner = inner;
    *out = &p->base;
    return 0;
}

void backend_profile_report(struct backend *b, FILE *f, const char *title)
{
    struct backend_prof *p = prof_of(b);
    double total = 0;
    for (int i = 0; i < P_N; i++)
        total += p->t[i];
    fprintf(f, "profile of %s: %.1f ms in ops\n", title, total * 1e3);
    fprintf(f, "  %-10s %8s %10s %9s %6s\n", "op", "calls", "total ms", "mean us", "share");
    for (int i = 0; i < P_N; i++) {
        if (!p->n[i])
            continue;
        fprintf(f, "  %-10s %8ld %10.2f %9.1f %5.1f%%\n", prof_names[i], p->n[i], p->t[i] * 1e3,
                p->t[i] / p->n[i] * 1e6, total > 0 ? 100 * p->t[i] / total : 0.0);
    }
    memset(p->t, 0, sizeof(p->t));
    memset(p->n, 0, sizeof(p->n));
}
