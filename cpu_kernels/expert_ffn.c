/* expert_ffn: SwiGLU expert on the CPU (contract in expert_ffn.h).
 *
 * One parallel region runs every batch of up to MATMUL_MAX_BATCH tokens in four phases:
 *   1. convert the batch's x rows for gate (and up, if its activation format differs)
 *   2. gate and up rows [r0, r1) of this thread, then h = silu(g) * u on the same rows
 *   3. convert the h rows for down
 *   4. down rows [r0, r1) of this thread, accumulated into out
 * with a barrier after phases 1, 2 and 3. Phase 2 and 4 split rows with matmul_split, so the
 * thread that computed g and u of a row also forms its h, and the thread that owns an out
 * element is the same in every batch. No barrier is needed after phase 4: a thread entering
 * the next batch's phase k has passed the barrier that ends every reader of what phase k
 * writes (phase 1 -> act_x read in phase 2; 2 -> g, u read in 3; 3 -> act_h read in 4).
 */
#include "expert_ffn.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#include "cpu_features.h"
#include "matmul.h"
#include "vec_dot.h"

#define BATCH MATMUL_MAX_BATCH

static size_t align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* Bytes between converted activation rows (F32 activations are copied, like the others). */
static size_t act_stride(uint32_t wtype, int64_t n)
{
    return align64(vec_dot_act_bytes(wtype, n));
}

/* Byte offsets of the scratch regions. */
struct ffn_layout {
    size_t act_gate; /* (BATCH, act_stride(gate_type, n_embd)) x converted for gate */
    size_t act_up;   /* (BATCH, act_stride(up_type, n_embd)) x for up; = act_gate if shared */
    size_t g;        /* (BATCH, n_ff) floats: gate outputs, then h in place */
    size_t u;        /* (BATCH, n_ff) floats: up outputs */
    size_t act_h;    /* (BATCH, act_stride(down_type, n_ff)) h converted for down */
    size_t yv;       /* (BATCH, n_embd) floats: down outputs */
    size_t total;
};

static bool shapes_ok(const struct expert_ffn_weights *w)
{
    return w && vec_dot_supported(w->gate_type) && vec_dot_supported(w->up_type) &&
           vec_dot_supported(w->down_type) && w->n_embd > 0 && w->n_ff > 0 &&
           w->n_embd % vec_dot_block(w->gate_type) == 0 &&
           w->n_embd % vec_dot_block(w->up_type) == 0 && w->n_ff % vec_dot_block(w->down_type) == 0;
}

static bool up_shares_act(const struct expert_ffn_weights *w)
{
    return vec_dot_act_type(w->up_type) == vec_dot_act_type(w->gate_type);
}

static void layout_get(const struct expert_ffn_weights *w, struct ffn_layout *l)
{
    size_t off = 0;
    l->act_gate = off;
    off += BATCH * act_stride(w->gate_type, w->n_embd);
    l->act_up = l->act_gate;
    if (!up_shares_act(w)) {
        l->act_up = off;
        off += BATCH * act_stride(w->up_type, w->n_embd);
    }
    l->g = off;
    off += align64(BATCH * (size_t)w->n_ff * sizeof(float));
    l->u = off;
    off += align64(BATCH * (size_t)w->n_ff * sizeof(float));
    l->act_h = off;
    off += BATCH * act_stride(w->down_type, w->n_ff);
    l->yv = off;
    off += align64(BATCH * (size_t)w->n_embd * sizeof(float));
    l->total = off;
}

size_t expert_ffn_scratch_bytes(const struct expert_ffn_weights *w)
{
    struct ffn_layout l;
    if (!shapes_ok(w))
        return 0;
    layout_get(w, &l);
    return l.total;
}

static int args_check(const struct expert_ffn_args *a)
{
    if (!a || !shapes_ok(a->w) || a->n_tokens < 0)
        return -EINVAL;
    if (a->n_tokens == 0)
        return 0;
    if (!a->w->gate || !a->w->up || !a->w->down || !a->x || !a->out || !a->scratch)
        return -EINVAL;
    if ((uintptr_t)a->scratch % sizeof(float) != 0 ||
        a->scratch_bytes < expert_ffn_scratch_bytes(a->w))
        return -EINVAL;
    if (a->x_stride < a->w->n_embd || a->out_stride < a->w->n_embd)
        return -EINVAL;
    if (a->tokens)
        for (int i = 0; i < a->n_tokens; i++)
            if (a->tokens[i] < 0)
                return -EINVAL;
    return 0;
}

static inline float silu(float v)
{
    return v / (1.0f + expf(-v));
}

/* h of row r of n_ff from its gate and up values (expert_ffn.h). */
static inline float ffn_act(const struct expert_ffn_weights *w, float g, float u, int64_t r)
{
    if (w->gate_b)
        g += w->gate_b[r];
    if (w->up_b)
        u += w->up_b[r];
    if (w->act == EXPERT_ACT_SWIGLU_OAI) {
        g = g < EXPERT_OAI_LIMIT ? g : EXPERT_OAI_LIMIT;
        u = u < -EXPERT_OAI_LIMIT ? -EXPERT_OAI_LIMIT : u > EXPERT_OAI_LIMIT ? EXPERT_OAI_LIMIT : u;
        return g / (1.0f + expf(-EXPERT_OAI_ALPHA * g)) * (u + 1.0f);
    }
    return silu(g) * u;
}

/* Row r of n_embd of the down projection, with the bias where there is one. */
static inline float ffn_down(const struct expert_ffn_weights *w, float y, int64_t r)
{
    return w->down_b ? y + w->down_b[r] : y;
}

/* The work of thread ith of nth for the batch of tokens [t0, t0 + mb). */
static void batch_run(const struct expert_ffn_args *a, const struct ffn_layout *l, int t0, int mb,
                      int ith, int nth)
{
    const struct expert_ffn_weights *w = a->w;
    uint8_t *s = a->scratch;
    const size_t gate_stride = act_stride(w->gate_type, w->n_embd);
    const size_t up_stride = act_stride(w->up_type, w->n_embd);
    const size_t h_stride = act_stride(w->down_type, w->n_ff);
    float *g = (float *)(s + l->g), *u = (float *)(s + l->u), *yv = (float *)(s + l->yv);
    int64_t r0, r1;

    /* 1. convert x */
    vec_dot_quantize_fn q_gate = vec_dot_quantize_get(w->gate_type, CPU_ISA_COUNT);
    vec_dot_quantize_fn q_up = vec_dot_quantize_get(w->up_type, CPU_ISA_COUNT);
    for (int j = ith; j < mb; j += nth) {
        int64_t row = a->tokens ? a->tokens[t0 + j] : t0 + j;
        const float *xr = a->x + row * a->x_stride;
        q_gate(xr, s + l->act_gate + j * gate_stride, w->n_embd);
        if (!up_shares_act(w))
            q_up(xr, s + l->act_up + j * up_stride, w->n_embd);
    }
#pragma omp barrier

    /* 2. gate, up and h on this thread's rows of n_ff */
    struct matmul_args mg = {.wtype = w->gate_type,
                             .w = w->gate,
                             .w_stride = vec_dot_row_bytes(w->gate_type, w->n_embd),
                             .n_in = w->n_embd,
                             .n_out = w->n_ff,
                             .m = mb,
                             .y = g,
                             .y_stride = w->n_ff};
    struct matmul_args mu = mg;
    mu.wtype = w->up_type;
    mu.w = w->up;
    mu.w_stride = vec_dot_row_bytes(w->up_type, w->n_embd);
    mu.y = u;
    matmul_split(w->n_ff, ith, nth, &r0, &r1);
    matmul_rows(&mg, s + l->act_gate, gate_stride, r0, r1);
    matmul_rows(&mu, s + l->act_up, up_stride, r0, r1);
    for (int j = 0; j < mb; j++)
        for (int64_t r = r0; r < r1; r++)
            g[j * w->n_ff + r] = ffn_act(w, g[j * w->n_ff + r], u[j * w->n_ff + r], r);
#pragma omp barrier

    /* 3. convert h */
    vec_dot_quantize_fn q_down = vec_dot_quantize_get(w->down_type, CPU_ISA_COUNT);
    for (int j = ith; j < mb; j += nth)
        q_down(g + j * w->n_ff, s + l->act_h + j * h_stride, w->n_ff);
#pragma omp barrier

    /* 4. down on this thread's rows of n_embd, accumulated into out */
    struct matmul_args md = {.wtype = w->down_type,
                             .w = w->down,
                             .w_stride = vec_dot_row_bytes(w->down_type, w->n_ff),
                             .n_in = w->n_ff,
                             .n_out = w->n_embd,
                             .m = mb,
                             .y = yv,
                             .y_stride = w->n_embd};
    matmul_split(w->n_embd, ith, nth, &r0, &r1);
    matmul_rows(&md, s + l->act_h, h_stride, r0, r1);
    for (int j = 0; j < mb; j++) {
        int64_t row = a->tokens ? a->tokens[t0 + j] : t0 + j;
        float wt = a->token_weights ? a->token_weights[t0 + j] : 1.0f;
        float *o = a->out + row * a->out_stride;
        for (int64_t r = r0; r < r1; r++)
            o[r] += wt * ffn_down(w, yv[j * w->n_embd + r], r);
    }
}

int expert_ffn_run(const struct expert_ffn_args *a)
{
    int rc = args_check(a);
    if (rc || a->n_tokens == 0)
        return rc;

    struct ffn_layout l;
    layout_get(a->w, &l);
    int64_t widest = a->w->n_ff > a->w->n_embd ? a->w->n_ff : a->w->n_embd;
    const int nt = matmul_team(a->n_threads, (widest + 15) / 16);

#pragma omp parallel num_threads(nt)
    {
        int ith = omp_get_thread_num(), nth = omp_get_num_threads();
        for (int t0 = 0; t0 < a->n_tokens; t0 += BATCH) {
            int mb = a->n_tokens - t0 < BATCH ? a->n_tokens - t0 : BATCH;
            batch_run(a, &l, t0, mb, ith, nth);
        }
    }
    return 0;
}

/* ---- group ---- */

/* Byte offsets of the group scratch: per pair, x converted for gate (and up), g/u floats, and
 * h converted for down; per thread, one batch of down outputs for a unit of rows. */
struct group_layout {
    size_t act_gate, act_up, g, u, act_h, ytmp, y, total;
    size_t gate_stride, up_stride, h_stride;
};

#define GROUP_MAX_THREADS 1024
/* Groups of at most this many pairs and experts (decode, lockstep steps, short prompts)
 * compute each expert's down projection whole into y (pairs, n_embd), then add the pairs up:
 * contiguous reads of each expert's matrix instead of 16-row slices of every expert in turn. */
#define GROUP_Y_PAIRS 256

static void group_layout_get(const struct expert_ffn_weights *w, int n_pairs,
                             struct group_layout *l)
{
    size_t off = 0, n = (size_t)n_pairs;
    l->gate_stride = act_stride(w->gate_type, w->n_embd);
    l->up_stride = act_stride(w->up_type, w->n_embd);
    l->h_stride = act_stride(w->down_type, w->n_ff);
    l->act_gate = off;
    off += n * l->gate_stride;
    l->act_up = l->act_gate;
    if (!up_shares_act(w)) {
        l->act_up = off;
        off += n * l->up_stride;
    }
    l->g = off;
    off += align64(n * (size_t)w->n_ff * sizeof(float));
    l->u = off;
    off += align64(n * (size_t)w->n_ff * sizeof(float));
    l->act_h = off;
    off += n * l->h_stride;
    l->ytmp = off; /* (threads, BATCH, 16) floats */
    off += align64((size_t)GROUP_MAX_THREADS * BATCH * 16 * sizeof(float));
    l->y = off; /* (min(pairs, GROUP_Y_PAIRS), n_embd) floats */
    off += align64((n < GROUP_Y_PAIRS ? n : GROUP_Y_PAIRS) * (size_t)w->n_embd * sizeof(float));
    l->total = off;
}

size_t expert_ffn_group_scratch_bytes(const struct expert_ffn_weights *w, int n_pairs)
{
    struct group_layout l;
    if (!shapes_ok(w) || n_pairs < 0)
        return 0;
    group_layout_get(w, n_pairs, &l);
    return l.total;
}

static int group_check(const struct expert_ffn_group_args *a)
{
    if (!a || a->n_experts < 0 || !a->w || !a->offset || !shapes_ok(&a->w[0]))
        return -EINVAL;
    const struct expert_ffn_weights *w0 = &a->w[0];
    for (int i = 0; i < a->n_experts; i++) {
        const struct expert_ffn_weights *w = &a->w[i];
        if (w->gate_type != w0->gate_type || w->up_type != w0->up_type ||
            w->down_type != w0->down_type || w->n_embd != w0->n_embd || w->n_ff != w0->n_ff ||
            !w->gate || !w->up || !w->down || a->offset[i + 1] < a->offset[i])
            return -EINVAL;
    }
    int n_pairs = a->offset[a->n_experts] - a->offset[0];
    if (n_pairs > 0 && (!a->tokens || !a->x || !a->out || !a->scratch))
        return -EINVAL;
    if (a->scratch_bytes < expert_ffn_group_scratch_bytes(w0, a->offset[a->n_experts]))
        return -EINVAL;
    if (a->x_stride < w0->n_embd || a->out_stride < w0->n_embd)
        return -EINVAL;
    return 0;
}

struct group_flow; /* a small group's flow state, below */

/* Phase 2 of the group: gate/up/h for rows [u0*16, u1*16) of expert i, all its pairs. */
static void group_gate_up(const struct expert_ffn_group_args *a, const struct group_layout *l,
                          struct group_flow *flow, int i, int64_t r0, int64_t r1)
{
    (void)flow;
    const struct expert_ffn_weights *w = &a->w[i];
    uint8_t *s = a->scratch;
    int64_t nf = w->n_ff;
    struct matmul_args mg = {.wtype = w->gate_type,
                             .w = w->gate,
                             .w_stride = vec_dot_row_bytes(w->gate_type, w->n_embd),
                             .n_in = w->n_embd,
                             .n_out = nf,
                             .y_stride = nf};
    struct matmul_args mu = mg;
    mu.wtype = w->up_type;
    mu.w = w->up;
    mu.w_stride = vec_dot_row_bytes(w->up_type, w->n_embd);
    for (int p0 = a->offset[i]; p0 < a->offset[i + 1]; p0 += BATCH) {
        int mb = a->offset[i + 1] - p0 < BATCH ? a->offset[i + 1] - p0 : BATCH;
        float *g = (float *)(s + l->g) + (size_t)p0 * nf;
        float *u = (float *)(s + l->u) + (size_t)p0 * nf;
        mg.m = mu.m = mb;
        mg.y = g;
        mu.y = u;
        matmul_rows(&mg, s + l->act_gate + (size_t)p0 * l->gate_stride, l->gate_stride, r0, r1);
        matmul_rows(&mu, s + l->act_up + (size_t)p0 * l->up_stride, l->up_stride, r0, r1);
        for (int j = 0; j < mb; j++)
            for (int64_t r = r0; r < r1; r++)
                g[j * nf + r] = ffn_act(w, g[j * nf + r], u[j * nf + r], r);
    }
}

/* Phase 4: rows [r0, r1) (at most 16) of every expert's down projection, accumulated. The
 * matmul sees the slice of rows as its own matrix, so its outputs land in ytmp (BATCH, 16). */
static void group_down(const struct expert_ffn_group_args *a, const struct group_layout *l,
                       float *ytmp, int64_t r0, int64_t r1)
{
    uint8_t *s = a->scratch;
    for (int i = 0; i < a->n_experts; i++) {
        const struct expert_ffn_weights *w = &a->w[i];
        size_t row_bytes = vec_dot_row_bytes(w->down_type, w->n_ff);
        struct matmul_args md = {.wtype = w->down_type,
                                 .w = (const uint8_t *)w->down + (size_t)r0 * row_bytes,
                                 .w_stride = row_bytes,
                                 .n_in = w->n_ff,
                                 .n_out = r1 - r0,
                                 .y = ytmp,
                                 .y_stride = 16};
        for (int p0 = a->offset[i]; p0 < a->offset[i + 1]; p0 += BATCH) {
            int mb = a->offset[i + 1] - p0 < BATCH ? a->offset[i + 1] - p0 : BATCH;
            md.m = mb;
            matmul_rows(&md, s + l->act_h + (size_t)p0 * l->h_stride, l->h_stride, 0, r1 - r0);
            for (int j = 0; j < mb; j++) {
                float *o = a->out + (int64_t)a->tokens[p0 + j] * a->out_stride;
                float wt = a->token_weights ? a->token_weights[p0 + j] : 1.0f;
                for (int64_t r = r0; r < r1; r++)
                    o[r] += wt * ffn_down(w, ytmp[j * 16 + r - r0], r);
            }
        }
    }
}

/* Phase 4 of a small group: rows [r0, r1) of expert i's down projection for all its pairs,
 * into y. */
static void group_down_rows(const struct expert_ffn_group_args *a, const struct group_layout *l,
                            struct group_flow *flow, int i, int64_t r0, int64_t r1)
{
    (void)flow;
    const struct expert_ffn_weights *w = &a->w[i];
    uint8_t *s = a->scratch;
    struct matmul_args md = {.wtype = w->down_type,
                             .w = w->down,
                             .w_stride = vec_dot_row_bytes(w->down_type, w->n_ff),
                             .n_in = w->n_ff,
                             .n_out = w->n_embd,
                             .y_stride = w->n_embd};
    for (int p0 = a->offset[i]; p0 < a->offset[i + 1]; p0 += BATCH) {
        md.m = a->offset[i + 1] - p0 < BATCH ? a->offset[i + 1] - p0 : BATCH;
        md.y = (float *)(s + l->y) + (size_t)(p0 - a->offset[0]) * w->n_embd;
        matmul_rows(&md, s + l->act_h + (size_t)p0 * l->h_stride, l->h_stride, r0, r1);
    }
}

/* A small group's flow state (expert_ffn_group_run): per expert, the gate/up units done and
 * whether its h is converted; NULL outside the flow. */
struct group_flow {
    atomic_int units_done[GROUP_Y_PAIRS];
    atomic_int h_ready[GROUP_Y_PAIRS];
    int64_t ff_units;
    vec_dot_quantize_fn q_down;
};

typedef void (*group_run_fn)(const struct expert_ffn_group_args *, const struct group_layout *,
                             struct group_flow *, int, int64_t, int64_t);

/* Hands out items [0, n_items) of (expert, 16-row unit) from the shared counter *next by
 * matmul_grab, shrinking chunks when `contiguous` (decode: long reads of each matrix), else
 * single items (prefill: uneven token lists), and calls run(a, l, flow, expert, r0, r1) for each
 * expert's run of rows in a chunk (rows capped at n_rows). Inside a parallel region; no
 * barrier at the end. */
static void group_items(const struct expert_ffn_group_args *a, const struct group_layout *l,
                        struct group_flow *flow, int64_t units, int64_t n_rows, bool contiguous,
                        int nth, atomic_llong *next, group_run_fn run)
{
    int64_t n_items = (int64_t)a->n_experts * units;
    for (int64_t c, cn; (c = matmul_grab(next, n_items, nth, contiguous, &cn)), cn > 0;) {
        for (int64_t it = c, i1 = c + cn; it < i1;) {
            int e = (int)(it / units);
            int64_t u0 = it % units, u1 = units;
            if (i1 - it < u1 - u0)
                u1 = u0 + (i1 - it);
            run(a, l, flow, e, u0 * 16, u1 * 16 < n_rows ? u1 * 16 : n_rows);
            it += u1 - u0;
        }
    }
}

/* Waits until *f is set (acquire): spins a while, then yields the processor. */
static void flow_wait(atomic_int *f)
{
    for (int spins = 0; !atomic_load_explicit(f, memory_order_acquire); spins++) {
        if (spins < 2048)
            cpu_relax();
        else
            sched_yield();
    }
}

/* The flow's phase 2: gate/up rows of expert i; the thread that completes the expert's last
 * unit converts its pairs' h (phase 3 for them) and marks it ready. */
static void flow_gate_up(const struct expert_ffn_group_args *a, const struct group_layout *l,
                         struct group_flow *flow, int i, int64_t r0, int64_t r1)
{
    group_gate_up(a, l, flow, i, r0, r1);
    int n = (int)((r1 - r0 + 15) / 16);
    if (atomic_fetch_add_explicit(&flow->units_done[i], n, memory_order_acq_rel) + n ==
        flow->ff_units) {
        const struct expert_ffn_weights *w = &a->w[i];
        for (int p = a->offset[i]; p < a->offset[i + 1]; p++)
            flow->q_down((float *)((uint8_t *)a->scratch + l->g) + (size_t)p * w->n_ff,
                         (uint8_t *)a->scratch + l->act_h + (size_t)p * l->h_stride, w->n_ff);
        atomic_store_explicit(&flow->h_ready[i], 1, memory_order_release);
    }
}

/* The flow's phase 4: down rows of expert i once its h is ready. */
static void flow_down_rows(const struct expert_ffn_group_args *a, const struct group_layout *l,
                           struct group_flow *flow, int i, int64_t r0, int64_t r1)
{
    flow_wait(&flow->h_ready[i]);
    group_down_rows(a, l, flow, i, r0, r1);
}

/* STRATA_MOE_FLOW=0 in the environment (or expert_ffn_set_flow(0)): a small group's down phase
 * after a barrier behind every expert's gate/up rows, as the other paths run (for
 * comparisons). */
static int flow_on = -1;

void expert_ffn_set_flow(int on)
{
    flow_on = on != 0;
}

static bool flow_enabled(void)
{
    return cpu_env_switch(&flow_on, "STRATA_MOE_FLOW");
}

/* STRATA_MOE_TRACE=1 (a diagnostic): each thread of a decode call (one pair per expert) stamps
 * the ends of its phases; at exit the mean over calls of the earliest and latest thread at each
 * stamp, in µs from the call's start, goes to stderr. */
enum { TR_IN, TR_P1, TR_P2, TR_B2, TR_P3, TR_P4, TR_B4, TR_ADD, TR_N };
static double tr_stamp[GROUP_MAX_THREADS][TR_N];
static double tr_lo[TR_N + 1], tr_hi[TR_N + 1];
static long tr_calls;
static int tr_threads;

static double tr_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static void tr_print(void)
{
    static const char *name[TR_N + 1] = {"entered",         "x converted", "gate/up done",
                                         "gate/up barrier", "h converted", "down done",
                                         "down barrier",    "added",       "returned"};
    if (!tr_calls)
        return;
    fprintf(stderr,
            "expert_ffn trace: %ld decode calls, %d threads; µs from the call's start, "
            "earliest and latest thread:\n",
            tr_calls, tr_threads);
    for (int k = 0; k <= TR_N; k++)
        fprintf(stderr, "  %-16s %8.1f %8.1f\n", name[k], tr_lo[k] / tr_calls, tr_hi[k] / tr_calls);
}

static int tr_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("STRATA_MOE_TRACE");
        on = e && *e == '1';
        if (on)
            atexit(tr_print);
    }
    return on;
}

static void tr_add(double t0, int nth)
{
    double end = tr_now();
    tr_threads = nth;
    for (int k = 0; k < TR_N; k++) {
        double lo = 1e30, hi = -1e30;
        for (int i = 0; i < nth; i++) {
            double v = tr_stamp[i][k] - t0;
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        tr_lo[k] += lo;
        tr_hi[k] += hi;
    }
    tr_lo[TR_N] += end - t0;
    tr_hi[TR_N] += end - t0;
    tr_calls++;
}

int expert_ffn_group_run(const struct expert_ffn_group_args *a)
{
    int rc = group_check(a);
    if (rc || a->n_experts == 0 || a->offset[a->n_experts] == a->offset[0])
        return rc;

    const struct expert_ffn_weights *w0 = &a->w[0];
    struct group_layout l;
    group_layout_get(w0, a->offset[a->n_experts], &l);
    int p_begin = a->offset[0], p_end = a->offset[a->n_experts];
    int64_t ff_units = (w0->n_ff + 15) / 16, embd_units = (w0->n_embd + 15) / 16;
    /* decode: exactly one pair per expert */
    bool one_each = true;
    for (int i = 0; i < a->n_experts; i++)
        one_each &= a->offset[i + 1] - a->offset[i] == 1;
    /* small groups (decode, lockstep steps): each expert's down rows whole, as a flow */
    const bool down_whole = p_end - p_begin <= GROUP_Y_PAIRS && a->n_experts <= GROUP_Y_PAIRS;
    int nt = a->n_threads > 0 ? a->n_threads : omp_get_max_threads();
    if (nt > GROUP_MAX_THREADS)
        nt = GROUP_MAX_THREADS;
    uint8_t *s = a->scratch;
    vec_dot_quantize_fn q_gate = vec_dot_quantize_get(w0->gate_type, CPU_ISA_COUNT);
    vec_dot_quantize_fn q_up = vec_dot_quantize_get(w0->up_type, CPU_ISA_COUNT);
    vec_dot_quantize_fn q_down = vec_dot_quantize_get(w0->down_type, CPU_ISA_COUNT);
    const bool trace = one_each && down_whole && tr_on();
    int pair_expert[GROUP_Y_PAIRS]; /* small groups: the expert of each pair */
    if (down_whole)
        for (int i = 0; i < a->n_experts; i++)
            for (int p = a->offset[i]; p < a->offset[i + 1]; p++)
                pair_expert[p - p_begin] = i;
    /* small groups as a flow: an expert's down rows start as soon as its own h is converted, so
     * the threads that finish gate/up first go on with down rows instead of waiting at a
     * barrier */
    const bool flow_run = down_whole && flow_enabled();
    struct group_flow flow;
    if (flow_run) {
        for (int i = 0; i < a->n_experts; i++) {
            atomic_init(&flow.units_done[i], 0);
            atomic_init(&flow.h_ready[i], 0);
        }
        flow.ff_units = ff_units;
        flow.q_down = q_down;
    }
    atomic_llong next_gu = 0, next_down = 0;
    const double t0 = trace ? tr_now() : 0;
    int team = 0;

#pragma omp parallel num_threads(nt)
    {
        int ith = omp_get_thread_num(), nth = omp_get_num_threads();
        float *ytmp = (float *)(s + l.ytmp) + (size_t)ith * BATCH * 16;
        double *st = tr_stamp[ith];
        if (trace) {
            st[TR_IN] = tr_now();
            if (ith == 0)
                team = nth;
        }

        /* 1. x of every pair, converted */
#pragma omp for schedule(static)
        for (int p = p_begin; p < p_end; p++) {
            const float *xr = a->x + (int64_t)a->tokens[p] * a->x_stride;
            q_gate(xr, s + l.act_gate + (size_t)p * l.gate_stride, w0->n_embd);
            if (!up_shares_act(w0))
                q_up(xr, s + l.act_up + (size_t)p * l.up_stride, w0->n_embd);
        }
        if (trace)
            st[TR_P1] = tr_now();
        if (flow_run) {
            /* 2 and 3. gate, up, h and its conversion per expert (flow_gate_up); 4. down rows
             * of every expert once its h is ready, into y */
            group_items(a, &l, &flow, ff_units, w0->n_ff, true, nth, &next_gu, flow_gate_up);
            if (trace)
                st[TR_P2] = st[TR_B2] = st[TR_P3] = tr_now();
            group_items(a, &l, &flow, embd_units, w0->n_embd, true, nth, &next_down,
                        flow_down_rows);
        } else {
            /* 2. gate, up, h over (expert, 16-row unit) items, handed out dynamically so a
             * preempted thread does not hold up the layer */
            group_items(a, &l, NULL, ff_units, w0->n_ff, one_each, nth, &next_gu, group_gate_up);
            if (trace)
                st[TR_P2] = tr_now();
#pragma omp barrier
            if (trace)
                st[TR_B2] = tr_now();
                /* 3. h of every pair, converted */
#pragma omp for schedule(static)
            for (int p = p_begin; p < p_end; p++)
                q_down((float *)(s + l.g) + (size_t)p * w0->n_ff,
                       s + l.act_h + (size_t)p * l.h_stride, w0->n_ff);
            if (down_whole) {
                if (trace)
                    st[TR_P3] = tr_now();
                /* 4. down (small groups): every expert's rows into y */
                group_items(a, &l, NULL, embd_units, w0->n_embd, true, nth, &next_down,
                            group_down_rows);
            }
        }
        if (down_whole) {
            /* then y added up per output unit in expert order (the order of group_down) */
            if (trace)
                st[TR_P4] = tr_now();
#pragma omp barrier
            if (trace)
                st[TR_B4] = tr_now();
#pragma omp for schedule(static)
            for (int64_t u = 0; u < embd_units; u++) {
                int64_t r0 = u * 16, r1 = (u + 1) * 16 < w0->n_embd ? (u + 1) * 16 : w0->n_embd;
                for (int p = p_begin; p < p_end; p++) {
                    float *o = a->out + (int64_t)a->tokens[p] * a->out_stride;
                    const float *y = (const float *)(s + l.y) + (size_t)(p - p_begin) * w0->n_embd;
                    float wt = a->token_weights ? a->token_weights[p] : 1.0f;
                    const struct expert_ffn_weights *w = &a->w[pair_expert[p - p_begin]];
                    for (int64_t r = r0; r < r1; r++)
                        o[r] += wt * ffn_down(w, y[r], r);
                }
            }
            if (trace)
                st[TR_ADD] = tr_now();
        } else {
            /* 4. down: 16-row units of n_embd, handed out dynamically */
#pragma omp for schedule(dynamic, 1) nowait
            for (int64_t u = 0; u < embd_units; u++) {
                int64_t r1 = (u + 1) * 16 < w0->n_embd ? (u + 1) * 16 : w0->n_embd;
                group_down(a, &l, ytmp, u * 16, r1);
            }
        }
    }
    if (trace)
        tr_add(t0, team);
    return 0;
}
