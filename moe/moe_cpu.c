/* moe_cpu: the CPU lane. The layer's CPU-lane experts run together through
 * expert_ffn_group_run (one OpenMP region per layer, work split over all experts' rows), which
 * accumulates router-weighted outputs in plan order, so the sum is the same for any thread
 * count. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "expert_ffn.h"
#include "moe.h"

struct moe_cpu {
    void *scratch; /* expert_ffn_group scratch, grown to the largest need seen */
    size_t scratch_bytes;
    struct expert_ffn_weights *w; /* (n_expert_cap) per-expert views of the plan */
    int32_t *offset;              /* (n_expert_cap + 1) */
    int n_expert_cap;
    int max_tok, n_embd, n_ff;
};

int moe_cpu_open(int max_tok, int n_embd, int n_ff, struct moe_cpu **out)
{
    struct moe_cpu *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->max_tok = max_tok;
    c->n_embd = n_embd;
    c->n_ff = n_ff;
    *out = c;
    return 0;
}

void moe_cpu_close(struct moe_cpu *c)
{
    if (!c)
        return;
    free(c->scratch);
    free(c->w);
    free(c->offset);
    free(c);
}

/* Grows the scratch and the per-expert arrays to what this plan needs. */
static int moe_cpu_reserve(struct moe_cpu *c, const struct expert_ffn_weights *w, int n_pairs,
                           int n_active)
{
    size_t need = expert_ffn_group_scratch_bytes(w, n_pairs);
    if (need == 0)
        return -EINVAL;
    if (n_active > c->n_expert_cap) {
        free(c->w);
        free(c->offset);
        c->w = malloc(sizeof(*c->w) * (size_t)n_active);
        c->offset = malloc(sizeof(*c->offset) * (size_t)(n_active + 1));
        c->n_expert_cap = c->w && c->offset ? n_active : 0;
        if (!c->n_expert_cap)
            return -ENOMEM;
    }
    if (need <= c->scratch_bytes)
        return 0;
    free(c->scratch);
    c->scratch = NULL;
    c->scratch_bytes = 0;
    if (posix_memalign(&c->scratch, 64, need))
        return -ENOMEM;
    c->scratch_bytes = need;
    return 0;
}

int moe_cpu_run(struct moe_cpu *c, const struct moe_plan *p, const struct moe_experts *ex,
                const float *in, float *out)
{
    struct expert_ffn_weights w0 = {
        .gate_type = ex->gate_type, .up_type = ex->up_type, .down_type = ex->down_type,
        .n_embd = ex->n_embd, .n_ff = ex->n_ff, .act = (enum expert_act)ex->act,
    };
    int n = 0, rc;

    memset(out, 0, sizeof(float) * (size_t)p->n_tok * ex->n_embd);
    rc = moe_cpu_reserve(c, &w0, p->offset[p->n_active], p->n_active);
    if (rc)
        return rc;
    /* The plan's pairs are grouped by expert; each maximal run of consecutive CPU-lane
     * experts has contiguous pair ranges and goes through the kernel in one call. */
    for (int i = 0; i < p->n_active; i++) {
        if (p->lane[i] != MOE_LANE_CPU)
            continue;
        int e = p->expert[i];
        c->w[n] = w0;
        if (ex->ptrs) {
            c->w[n].gate = ex->ptrs[3 * (size_t)e];
            c->w[n].up = ex->ptrs[3 * (size_t)e + 1];
            c->w[n].down = ex->ptrs[3 * (size_t)e + 2];
        } else {
            c->w[n].gate = ex->gate + (size_t)e * ex->gate_stride;
            c->w[n].up = ex->up + (size_t)e * ex->up_stride;
            c->w[n].down = ex->down + (size_t)e * ex->down_stride;
        }
        if (ex->gate_b)
            c->w[n].gate_b = ex->gate_b + (size_t)e * ex->n_ff;
        if (ex->up_b)
            c->w[n].up_b = ex->up_b + (size_t)e * ex->n_ff;
        if (ex->down_b)
            c->w[n].down_b = ex->down_b + (size_t)e * ex->n_embd;
        c->offset[n] = p->offset[i];
        c->offset[n + 1] = p->offset[i + 1];
        n++;
        if (i + 1 < p->n_active && p->lane[i + 1] == MOE_LANE_CPU)
            continue;
        struct expert_ffn_group_args a = {
            .n_experts = n, .w = c->w, .offset = c->offset, .tokens = p->tok,
            .token_weights = p->wt, .x = in, .x_stride = ex->n_embd, .out = out,
            .out_stride = ex->n_embd, .scratch = c->scratch, .scratch_bytes = c->scratch_bytes,
        };
        rc = expert_ffn_group_run(&a);
        if (rc)
            return rc;
        n = 0;
    }
    return 0;
}

static double moe_cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Best of reps of one moe_cpu_run over n_tok tokens, each routed to experts 0..k-1. */
static double moe_cpu_time(struct moe_cpu *c, const struct moe_experts *ex, int n_expert, int k,
                           int n_tok, int reps, const float *in, float *out)
{
    struct moe_plan p;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_tok * k);
    float *w = malloc(sizeof(float) * (size_t)n_tok * k);
    double best = -1;
    if (ids && w && moe_plan_init(&p, n_tok, k, n_expert) == 0) {
        for (int t = 0; t < n_tok; t++) {
            for (int j = 0; j < k; j++) {
                ids[t * k + j] = j;
                w[t * k + j] = 1.0f / k;
            }
        }
        moe_plan_build(&p, ids, w, n_tok);
        for (int r = 0; r < reps; r++) {
            double t0 = moe_cpu_now();
            if (moe_cpu_run(c, &p, ex, in, out))
                break;
            double dt = moe_cpu_now() - t0;
            best = best < 0 || dt < best ? dt : best;
        }
        moe_plan_free(&p);
    }
    free(ids);
    free(w);
    return best;
}

double moe_cpu_pair_seconds(struct moe_cpu *c, const struct moe_experts *ex, int n_expert, int k,
                            int n_tok, int reps)
{
    if (n_tok < 2 || n_tok > c->max_tok || k < 1 || k > n_expert || reps < 1)
        return -1;
    float *in = calloc((size_t)n_tok * c->n_embd, sizeof(float));
    float *out = malloc(sizeof(float) * (size_t)n_tok * c->n_embd);
    double r = -1;
    if (in && out) {
        for (size_t i = 0; i < (size_t)n_tok * c->n_embd; i++)
            in[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
        double one = moe_cpu_time(c, ex, n_expert, k, 1, reps, in, out);
        double many = moe_cpu_time(c, ex, n_expert, k, n_tok, reps, in, out);
        if (one >= 0 && many >= 0)
            r = many > one ? (many - one) / ((double)(n_tok - 1) * k) : 0.0;
    }
    free(in);
    free(out);
    return r;
}
