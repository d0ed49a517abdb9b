/* test_ops_ssm: the Gated DeltaNet ops of cpu_kernels/ops_ssm.h against scalar double
 * references on fresh random data (seeded): the causal conv + SiLU with its rolling state, and
 * the gated delta rule with its per-head state, for both head mappings and both beta/alpha
 * layouts, evaluated in one call and split over two calls (the state carries the first part);
 * and each build of the delta rule's head step this CPU can run (plain x86-64, AVX2, AVX-512:
 * cpu_kernels/ssm_body.h) against the same reference and against each other.
 * Bound: 1e-5 relative (norm); float against double over 37 tokens. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_features.h"
#include "ops_ssm.h"
#include "rng.h"
#include "ssm_body.h"
#include "testutil.h"

#define TOL 1e-5

static void fill(struct rng *r, float *x, size_t n, float mean, float std)
{
    for (size_t i = 0; i < n; i++)
        x[i] = mean + std * rng_normal(r);
}

static double sigm(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

static double silu(double x)
{
    return x * sigm(x);
}

/* conv: x (n, ch) in place from a zero history */
static void ref_conv(const float *x, float *y, const float *w, int n, int ch, int kc)
{
    for (int t = 0; t < n; t++)
        for (int c = 0; c < ch; c++) {
            double s = 0;
            for (int j = 0; j < kc; j++) {
                int tt = t - (kc - 1) + j;
                if (tt >= 0)
                    s += (double)w[c * kc + j] * x[(size_t)tt * ch + c];
            }
            y[(size_t)t * ch + c] = (float)silu(s);
        }
}

static void check_conv(struct rng *r)
{
    const int n = 37, ch = 96, kc = 4;
    float *x = malloc(sizeof(float) * n * ch), *w = malloc(sizeof(float) * ch * kc);
    float *want = malloc(sizeof(float) * n * ch), *got = malloc(sizeof(float) * n * ch);
    float *state = calloc((size_t)(kc - 1) * ch, sizeof(float));
    fill(r, x, (size_t)n * ch, 0.0f, 1.0f);
    fill(r, w, (size_t)ch * kc, 0.0f, 0.5f);
    ref_conv(x, want, w, n, ch, kc);
    memcpy(got, x, sizeof(float) * n * ch);
    ops_ssm_conv(got, state, w, 10, ch, kc); /* two calls: 10 tokens, then 27 */
    ops_ssm_conv(got + 10 * ch, state, w, n - 10, ch, kc);
    double e = test_norm_rel_err(got, want, n * ch);
    CHECK(e < TOL, "conv split 10 + 27: rel err %.3g", e);
    /* the state holds the last kc - 1 inputs */
    double se = 0;
    for (int j = 0; j < kc - 1; j++)
        for (int c = 0; c < ch; c++)
            se = fmax(se, fabs(state[j * ch + c] - x[(size_t)(n - (kc - 1) + j) * ch + c]));
    CHECK(se == 0, "conv state is not the last inputs: %g", se);
    printf("  conv: %d tokens x %d channels, rel err %.3g\n", n, ch, e);
    free(x), free(w), free(want), free(got), free(state);
}

struct gdn_case {
    int nk, nv, d;
    bool tiled, grouped;
};

static void ref_gdn(const struct ops_gdn *g, float *out)
{
    const int d = g->d, r = g->n_v / g->n_k, kw = g->n_k * d, vw = g->n_v * d;
    double *S = calloc((size_t)g->n_v * d * d, sizeof(double));
    double q[256], k[256], mem[256], o[256];
    for (int t = 0; t < g->n_tok; t++) {
        const float *row = g->qkv + (size_t)t * (2 * kw + vw);
        for (int j = 0; j < g->n_v; j++) {
            const int kh = g->v_tiled ? j % g->n_k : j / r;
            const int bi = g->ba_grouped ? (j / r) * 2 * r + j % r : j;
            const int ai = g->ba_grouped ? (j / r) * 2 * r + r + j % r : j;
            double nq = 0, nk = 0;
            for (int i = 0; i < d; i++) {
                nq += (double)row[kh * d + i] * row[kh * d + i];
                nk += (double)row[kw + kh * d + i] * row[kw + kh * d + i];
            }
            for (int i = 0; i < d; i++) {
                q[i] = row[kh * d + i] / sqrt(nq + 1e-6) / sqrt((double)d);
                k[i] = row[kw + kh * d + i] / sqrt(nk + 1e-6);
            }
            double beta = sigm(g->b[(size_t)t * g->ba_stride + bi]);
            double a = g->a[(size_t)t * g->ba_stride + ai] + g->dt_bias[j];
            double decay = exp(g->a_log_neg[j] * log1p(exp(a)));
            double *Sj = S + (size_t)j * d * d;
            for (int b = 0; b < d; b++) {
                double acc = 0;
                for (int i = 0; i < d; i++)
                    acc += (Sj[i * d + b] *= decay) * k[i];
                mem[b] = beta * (row[2 * kw + j * d + b] - acc);
            }
            double ss = 0;
            for (int b = 0; b < d; b++) {
                double acc = 0;
                for (int i = 0; i < d; i++)
                    acc += (Sj[i * d + b] += k[i] * mem[b]) * q[i];
                o[b] = acc;
                ss += acc * acc;
            }
            for (int b = 0; b < d; b++)
                out[(size_t)t * vw + j * d + b] =
                    (float)(o[b] / sqrt(ss / d + g->eps) * g->norm_w[b] *
                            silu(g->z[(size_t)t * vw + j * d + b]));
        }
    }
    free(S);
}

static void check_gdn(struct rng *r, const struct gdn_case *c)
{
    const int n = 37, d = c->d, kw = c->nk * d, vw = c->nv * d, cw = 2 * kw + vw;
    const int bs = c->grouped ? 2 * c->nv : c->nv;
    float *qkv = malloc(sizeof(float) * n * cw), *z = malloc(sizeof(float) * n * vw);
    float *b = malloc(sizeof(float) * n * bs), *a = malloc(sizeof(float) * n * bs);
    float *an = malloc(sizeof(float) * c->nv), *dt = malloc(sizeof(float) * c->nv);
    float *nw = malloc(sizeof(float) * d), *want = malloc(sizeof(float) * n * vw);
    float *got = malloc(sizeof(float) * n * vw);
    float *state = calloc((size_t)c->nv * d * d, sizeof(float));
    fill(r, qkv, (size_t)n * cw, 0.0f, 1.0f);
    fill(r, z, (size_t)n * vw, 0.0f, 1.0f);
    fill(r, b, (size_t)n * bs, 0.0f, 1.0f);
    fill(r, a, (size_t)n * bs, 0.0f, 1.0f);
    for (int j = 0; j < c->nv; j++)
        an[j] = -expf(rng_uniform(r, 0.0f, 2.0f)); /* -exp(A_log), A_log in [0, 2) */
    fill(r, dt, c->nv, 1.0f, 0.1f);
    fill(r, nw, d, 1.0f, 0.1f);
    struct ops_gdn g = {
        .out = got,
        .qkv = qkv,
        .z = z,
        .b = b,
        .a = c->grouped ? b : a,
        .ba_stride = bs,
        .ba_grouped = c->grouped,
        .a_log_neg = an,
        .dt_bias = dt,
        .norm_w = nw,
        .state = state,
        .n_tok = n,
        .n_k = c->nk,
        .n_v = c->nv,
        .d = d,
        .v_tiled = c->tiled,
        .eps = 1e-6f,
    };
    ref_gdn(&g, want);
    g.n_tok = 13; /* two calls: 13 tokens, then 24, the state carried between */
    ops_gdn(&g);
    g.n_tok = n - 13;
    g.out = got + 13 * vw;
    g.qkv = qkv + 13 * cw;
    g.z = z + 13 * vw;
    g.b = b + 13 * bs;
    g.a = (c->grouped ? b : a) + 13 * bs;
    ops_gdn(&g);
    double e = test_norm_rel_err(got, want, n * vw);
    CHECK(e < TOL, "gdn n_k %d n_v %d d %d %s %s: rel err %.3g", c->nk, c->nv, d,
          c->tiled ? "tiled" : "grouped heads", c->grouped ? "grouped ba" : "split ba", e);
    printf("  gdn: %d q/k heads, %d v heads of %d, %s, %s: rel err %.3g\n", c->nk, c->nv, d,
           c->tiled ? "v head j reads j mod n_k" : "v head j reads j / r",
           c->grouped ? "grouped ssm_ba" : "beta and alpha apart", e);
    /* every build, one call over the 37 tokens from a zero state */
    g.n_tok = n, g.out = got, g.qkv = qkv, g.z = z, g.b = b, g.a = c->grouped ? b : a;
    const struct {
        const char *name;
        void (*head)(const struct ops_gdn *g, int j);
        enum cpu_isa isa;
    } builds[] = {{"x86-64", gdn_head, CPU_ISA_SCALAR},
                  {"avx2", ops_gdn_head_avx2, CPU_ISA_AVX2},
                  {"avx512", ops_gdn_head_avx512, CPU_ISA_AVX512}};
    float *first = malloc(sizeof(float) * n * vw);
    for (size_t k = 0; k < sizeof(builds) / sizeof(builds[0]); k++) {
        if (cpu_isa_best() < builds[k].isa)
            continue;
        memset(state, 0, sizeof(float) * (size_t)c->nv * d * d);
        for (int j = 0; j < c->nv; j++)
            builds[k].head(&g, j);
        double er = test_norm_rel_err(got, want, n * vw);
        double eb = k ? test_norm_rel_err(got, first, n * vw) : 0.0;
        if (!k)
            memcpy(first, got, sizeof(float) * n * vw);
        CHECK(er < TOL && eb < TOL, "gdn %s build, d %d: rel err %.3g, against x86-64 %.3g",
              builds[k].name, d, er, eb);
        printf("    %-6s build: rel err %.3g, against the x86-64 build %.3g\n", builds[k].name, er,
               eb);
    }
    free(first);
    free(qkv), free(z), free(b), free(a), free(an), free(dt), free(nw), free(want), free(got);
    free(state);
}

int main(void)
{
    struct rng r;
    rng_seed(&r, 20261202, 0);
    check_conv(&r);
    const struct gdn_case cases[] = {
        {2, 4, 32, false, true},  {2, 4, 32, true, false}, {3, 6, 16, true, false},
        {1, 1, 128, false, true}, {2, 4, 24, true, true}, /* rows of 24: a vector's tail in every
                                                             build */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check_gdn(&r, &cases[i]);
    return test_finish("test_ops_ssm");
}
