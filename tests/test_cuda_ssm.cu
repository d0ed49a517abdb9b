/* cuda_ssm against the CPU references on fresh random data (the test's fixed seed), outputs
 * NaN-poisoned before each run and followed by a NaN guard that must stay untouched, one line
 * per case with its shape and error (relative, norm: ||got - ref|| / ||ref||):
 *   conv        vs ops_ssm_conv, 37 tokens in two calls (13 + 24) from a random state: 1e-5;
 *               the state after the calls: exact (it holds copies of inputs);
 *   gdn         vs ops_gdn (one call on the CPU; on the device the tokens in two calls or a
 *               call per token, the state carried), output and final state: 1e-4 (float,
 *               sums in another order, errors carried through the state). The recurrent
 *               form over 37 tokens; the chunked form over 5-300 tokens, chunks whole and
 *               partial, with fast and slow decays;
 *   gdn forms   chunked against recurrent on the device, 16-512 tokens at qwen3next-80b's
 *               head shape: 1e-4; the time of each printed;
 *   rope        vs ops_rope_neox_partial (pos0 + t, and per-token device positions): 1e-5;
 *               the dims past n_rot bit-identical to the input;
 *   split       exact copy; mul_sigmoid, swiglu vs backend_cpu.c's loops: 1e-5;
 *   gated add   vs cpu_shared_expert's sigmoid(w . x) y: 1e-5;
 *   graph       one decode step (conv, gdn, rope with device positions) captured in a CUDA
 *               graph and replayed over 5 tokens against the CPU step: 1e-4;
 *   bad shapes  refused with -EINVAL.
 * Replay a failure with STRATA_TEST_SEED. Exits 77 without a GPU. */
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "cuda_mem.h"
#include "cuda_ssm.h"
#include "ops_cpu.h"
#include "ops_ssm.h"
#include "testutil.h"

#define TOL_CONV 1e-5
#define TOL_GDN 1e-4
#define TOL_ROPE 1e-5
#define TOL_EW 1e-5
#define GUARD 64 /* floats of 0xFF after every device buffer, checked after each case */

static const char *NAME = "test_cuda_ssm";

/* ---- helpers ------------------------------------------------------------------------------ */

static void fatal(const char *what)
{
    fprintf(stderr, "%s: %s failed\n", NAME, what);
    exit(1);
}

static float *xmalloc_f(size_t n)
{
    return (float *)test_xmalloc(n * sizeof(float));
}

static void fill(struct rng *r, float *x, size_t n, float mean, float std)
{
    for (size_t i = 0; i < n; i++)
        x[i] = mean + std * rng_normal(r);
}

static float *rand_f(struct rng *r, size_t n, float mean, float std)
{
    float *x = xmalloc_f(n);
    fill(r, x, n, mean, std);
    return x;
}

/* A device buffer of n floats (a copy of host, or NaN when host is NULL) and GUARD NaN floats
 * (0xFF bytes) after it. */
static float *dev_buf(const float *host, size_t n)
{
    float *d = (float *)test_dev_alloc((n + GUARD) * sizeof(float));
    test_dev_poison(d, (n + GUARD) * sizeof(float));
    if (host && n)
        test_dev_put(d, host, n * sizeof(float));
    return d;
}

/* Whether the GUARD floats after the n of d are still all 0xFF bytes. */
static bool guard_ok(const float *d, size_t n)
{
    unsigned char g[GUARD * sizeof(float)];
    test_dev_get(g, d + n, sizeof(g));
    for (size_t i = 0; i < sizeof(g); i++)
        if (g[i] != 0xFF)
            return false;
    return true;
}

/* Number of floats whose bits differ. */
static size_t bits_differ(const float *a, const float *b, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += memcmp(a + i, b + i, sizeof(float)) != 0;
    return bad;
}

/* ---- conv --------------------------------------------------------------------------------- */

static void test_conv(struct rng *r)
{
    static const int cases[][2] = {{8192, 4}, {37, 4}, {101, 16}, {37, 1}}; /* ch, d_conv */
    const int n = 37, n1 = 13;
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const int ch = cases[ci][0], kc = cases[ci][1];
        const size_t nx = (size_t)n * ch, ns = (size_t)(kc - 1) * ch;
        float *x = rand_f(r, nx, 0.0f, 1.0f), *w = rand_f(r, (size_t)ch * kc, 0.0f, 0.5f);
        float *st = rand_f(r, ns, 0.0f, 1.0f);
        float *ref = xmalloc_f(nx), *got = xmalloc_f(nx);
        float *st_ref = xmalloc_f(ns), *st_got = xmalloc_f(ns);
        memcpy(ref, x, nx * sizeof(float));
        memcpy(st_ref, st, ns * sizeof(float));
        ops_ssm_conv(ref, kc > 1 ? st_ref : NULL, w, n, ch, kc);

        float *d_x = dev_buf(x, nx), *d_w = dev_buf(w, (size_t)ch * kc);
        float *d_st = kc > 1 ? dev_buf(st, ns) : NULL; /* no state without history */
        struct cuda_ssm_conv_args a = {d_x, d_st, d_w, n1, ch, kc, NULL};
        int rc = cuda_ssm_conv(&a);
        a.x = d_x + (size_t)n1 * ch;
        a.n_tok = n - n1;
        rc = rc ? rc : cuda_ssm_conv(&a);
        test_dev_get(got, d_x, nx * sizeof(float));
        size_t st_bad = 0;
        bool guards = guard_ok(d_x, nx);
        if (d_st) {
            test_dev_get(st_got, d_st, ns * sizeof(float));
            st_bad = bits_differ(st_got, st_ref, ns);
            guards = guards && guard_ok(d_st, ns);
        }
        double e = test_norm_rel_err(got, ref, nx);
        printf("conv ch %5d d_conv %2d, %d tokens in calls of %d + %d: rc %d, rel err %.3g, "
               "%zu state values differ\n",
               ch, kc, n, n1, n - n1, rc, e, st_bad);
        CHECK(rc == 0 && e <= TOL_CONV && st_bad == 0 && guards,
              "conv ch %d d_conv %d: rc %d err %g state %zu differ guards %d", ch, kc, rc, e,
              st_bad, guards);
        cuda_free(d_x), cuda_free(d_w), cuda_free(d_st);
        free(x), free(w), free(st), free(ref), free(got), free(st_ref), free(st_got);
    }
}

/* ---- gated delta rule --------------------------------------------------------------------- */

struct gdn_case {
    int nk, nv, d;
    bool tiled, grouped;
    int first; /* tokens of the first device call; the rest in one call (1: one per call) */
    int n;     /* tokens (0: 37) */
    enum cuda_gdn_form form;
    bool slow; /* A_log in [-6, -4): decays near 1, so the state carries far; else [0, 2) */
};

static void test_gdn_case(struct rng *r, const struct gdn_case *c)
{
    const int n = c->n ? c->n : 37, d = c->d, nv = c->nv;
    const size_t kw = (size_t)c->nk * d, vw = (size_t)nv * d, cw = 2 * kw + vw;
    const int bs = c->grouped ? 2 * nv : nv + 3; /* split: padded rows, to check the stride */
    const size_t nst = (size_t)nv * d * d, nout = (size_t)n * vw;
    float *qkv = rand_f(r, n * cw, 0.0f, 1.0f), *z = rand_f(r, nout, 0.0f, 1.0f);
    float *bb = rand_f(r, (size_t)n * bs, 0.0f, 1.0f), *aa = rand_f(r, (size_t)n * bs, 0.0f, 1.0f);
    float *an = xmalloc_f(nv), *dt = rand_f(r, nv, 1.0f, 0.1f), *nw = rand_f(r, d, 1.0f, 0.1f);
    float *st = rand_f(r, nst, 0.0f, 0.3f); /* a state left by earlier tokens */
    float *st_ref = xmalloc_f(nst), *st_got = xmalloc_f(nst);
    float *ref = xmalloc_f(nout), *got = xmalloc_f(nout);
    for (int j = 0; j < nv; j++) /* -exp(A_log) */
        an[j] = -expf(c->slow ? rng_uniform(r, -6.0f, -4.0f) : rng_uniform(r, 0.0f, 2.0f));
    const float *a_host = c->grouped ? bb : aa; /* grouped: one array holds both */
    memcpy(st_ref, st, nst * sizeof(float));

    struct ops_gdn g = {};
    g.out = ref, g.qkv = qkv, g.z = z, g.b = bb, g.a = a_host, g.ba_stride = bs;
    g.ba_grouped = c->grouped, g.a_log_neg = an, g.dt_bias = dt, g.norm_w = nw, g.state = st_ref;
    g.n_tok = n, g.n_k = c->nk, g.n_v = nv, g.d = d, g.v_tiled = c->tiled, g.eps = 1e-6f;
    ops_gdn(&g);

    float *d_qkv = dev_buf(qkv, n * cw), *d_z = dev_buf(z, nout), *d_out = dev_buf(NULL, nout);
    float *d_b = dev_buf(bb, (size_t)n * bs), *d_a = dev_buf(aa, (size_t)n * bs);
    float *d_an = dev_buf(an, nv), *d_dt = dev_buf(dt, nv), *d_nw = dev_buf(nw, d);
    float *d_st = dev_buf(st, nst);
    struct cuda_gdn_args a = {};
    a.b = d_b, a.a = c->grouped ? d_b : d_a, a.ba_stride = bs, a.ba_grouped = c->grouped;
    a.a_log_neg = d_an, a.dt_bias = d_dt, a.norm_w = d_nw, a.state = d_st, a.n_k = c->nk;
    a.n_v = nv, a.d = d, a.v_tiled = c->tiled, a.eps = 1e-6f, a.form = c->form, a.stream = NULL;
    int rc = 0, calls = 0;
    for (int t0 = 0; t0 < n && !rc; calls++) {
        int m = c->first == 1 ? 1 : t0 == 0 ? c->first : n - t0;
        a.out = d_out + t0 * vw, a.qkv = d_qkv + t0 * cw, a.z = d_z + t0 * vw;
        a.b = d_b + (size_t)t0 * bs, a.a = (c->grouped ? d_b : d_a) + (size_t)t0 * bs;
        a.n_tok = m;
        rc = cuda_gdn(&a);
        t0 += m;
    }
    test_dev_get(got, d_out, nout * sizeof(float));
    test_dev_get(st_got, d_st, nst * sizeof(float));
    bool guards = guard_ok(d_out, nout) && guard_ok(d_st, nst);
    double e = test_norm_rel_err(got, ref, nout), es = test_norm_rel_err(st_got, st_ref, nst);
    static const char *const forms[] = {"auto     ", "recurrent", "chunked  "};
    printf("gdn %s n_k %2d n_v %2d d %3d %s, %s, %s decay, %3d tokens in %2d calls: rc %d, rel "
           "err %.3g, state rel err %.3g\n",
           forms[c->form], c->nk, nv, d,
           c->tiled ? "v head j reads j mod n_k" : "v head j reads j / r    ",
           c->grouped ? "grouped ba" : "split ba  ", c->slow ? "slow" : "fast", n, calls, rc, e,
           es);
    CHECK(rc == 0 && e <= TOL_GDN && es <= TOL_GDN && guards,
          "gdn n_k %d n_v %d d %d n %d form %d: rc %d err %g state err %g guards %d", c->nk, nv, d,
          n, (int)c->form, rc, e, es, guards);
    cuda_free(d_qkv), cuda_free(d_z), cuda_free(d_out), cuda_free(d_b), cuda_free(d_a);
    cuda_free(d_an), cuda_free(d_dt), cuda_free(d_nw), cuda_free(d_st);
    free(qkv), free(z), free(bb), free(aa), free(an), free(dt), free(nw), free(st);
    free(st_ref), free(st_got), free(ref), free(got);
}

static void test_gdn(struct rng *r)
{
    const enum cuda_gdn_form R = CUDA_GDN_RECURRENT, C = CUDA_GDN_CHUNKED;
    static const struct gdn_case cases[] = {
        {16, 32, 128, false, true, 13, 0, R, false}, /* qwen3next-80b's shape */
        {16, 32, 128, true, false, 1, 0, R, false},  /* qwen35moe's head mapping, decode */
        {2, 4, 32, false, true, 13, 0, R, false},    /* d < 128: idle threads in reductions */
        {2, 4, 32, true, false, 13, 0, R, false},    /* the other head mapping and ba layout */
        {3, 6, 16, true, false, 13, 0, R, false},    /* d < 32: a partial first warp */
        {2, 4, 64, true, true, 1, 0, R, false},      /* tiled heads with grouped ba, per token */
        {1, 2, 256, false, false, 13, 0, R, false},  /* two columns per thread */
        {1, 1, 160, false, true, 13, 0, R, false},   /* a second column for only some threads */
        /* the chunked form: whole chunks, a partial last chunk, calls that end mid-chunk,
         * one token, and a state carried through 300 tokens of slow decay */
        {16, 32, 128, false, true, 64, 128, C, false}, /* qwen3next-80b: 2 + 2 chunks */
        {16, 32, 128, true, false, 100, 300, C, true}, /* qwen35moe: 100 + 200, slow decay */
        {16, 32, 128, true, false, 1, 5, C, false},    /* a chunk of one token per call */
        {2, 4, 64, true, true, 37, 83, C, false},      /* d 64: 37 + 46 */
        {2, 4, 64, false, false, 83, 83, C, true},     /* one call of 2 chunks and 19 tokens */
        {3, 6, 32, false, true, 20, 70, C, false},     /* d 32: 20 + 50 */
        {1, 2, 32, true, false, 70, 70, C, true},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        test_gdn_case(r, &cases[i]);
}

/* The two forms on the device over one call of n tokens at qwen3next-80b's head shape (n_k 16,
 * n_v 32, d 128), from one state: the outputs and states within TOL_GDN, and the time of each
 * (median of 5 runs, printed, not checked). */
static void test_gdn_forms(struct rng *r)
{
    static const int ns[] = {16, 32, 64, 128, 512};
    const int nk = 16, nv = 32, d = 128, nmax = 512;
    const size_t cw = (size_t)(2 * nk + nv) * d, vw = (size_t)nv * d, nst = (size_t)nv * d * d;
    float *d_qkv = dev_buf(NULL, nmax * cw), *d_z = dev_buf(NULL, nmax * vw);
    float *d_ba = dev_buf(NULL, (size_t)nmax * 2 * nv), *d_an = dev_buf(NULL, nv);
    float *d_dt = dev_buf(NULL, nv), *d_nw = dev_buf(NULL, d), *d_st0 = dev_buf(NULL, nst);
    float *d_st[2] = {dev_buf(NULL, nst), dev_buf(NULL, nst)};
    float *d_out[2] = {dev_buf(NULL, nmax * vw), dev_buf(NULL, nmax * vw)};
    {
        float *h = rand_f(r, nmax * cw, 0.0f, 1.0f);
        test_dev_put(d_qkv, h, nmax * cw * sizeof(float));
        fill(r, h, nmax * vw, 0.0f, 1.0f);
        test_dev_put(d_z, h, nmax * vw * sizeof(float));
        fill(r, h, (size_t)nmax * 2 * nv, 0.0f, 1.0f);
        test_dev_put(d_ba, h, (size_t)nmax * 2 * nv * sizeof(float));
        for (int j = 0; j < nv; j++)
            h[j] = -expf(rng_uniform(r, -6.0f, 2.0f));
        test_dev_put(d_an, h, nv * sizeof(float));
        fill(r, h, nv, 1.0f, 0.1f);
        test_dev_put(d_dt, h, nv * sizeof(float));
        fill(r, h, d, 1.0f, 0.1f);
        test_dev_put(d_nw, h, d * sizeof(float));
        fill(r, h, nst, 0.0f, 0.3f);
        test_dev_put(d_st0, h, nst * sizeof(float));
        free(h);
    }
    float *h_out[2] = {xmalloc_f(nmax * vw), xmalloc_f(nmax * vw)};
    float *h_st[2] = {xmalloc_f(nst), xmalloc_f(nst)};
    cudaEvent_t e0, e1;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess)
        fatal("cudaEventCreate");
    for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
        const int n = ns[i];
        float ms[2];
        int rc = 0;
        for (int f = 0; f < 2; f++) {
            struct cuda_gdn_args a = {};
            a.out = d_out[f], a.qkv = d_qkv, a.z = d_z, a.b = d_ba, a.a = d_ba;
            a.ba_stride = 2 * nv, a.ba_grouped = true, a.a_log_neg = d_an, a.dt_bias = d_dt;
            a.norm_w = d_nw, a.state = d_st[f], a.n_tok = n, a.n_k = nk, a.n_v = nv, a.d = d;
            a.eps = 1e-6f, a.form = f ? CUDA_GDN_CHUNKED : CUDA_GDN_RECURRENT, a.stream = NULL;
            float t[5];
            for (int k = 0; k < 5 && !rc; k++) {
                /* the state is restored before each run; the first result is kept */
                if (cudaMemcpy(d_st[f], d_st0, nst * sizeof(float), cudaMemcpyDeviceToDevice) !=
                    cudaSuccess)
                    fatal("cudaMemcpy");
                cudaEventRecord(e0, NULL);
                rc = cuda_gdn(&a);
                cudaEventRecord(e1, NULL);
                if (cudaEventSynchronize(e1) != cudaSuccess)
                    fatal("cudaEventSynchronize");
                cudaEventElapsedTime(&t[k], e0, e1);
                if (k == 0) {
                    test_dev_get(h_out[f], d_out[f], (size_t)n * vw * sizeof(float));
                    test_dev_get(h_st[f], d_st[f], nst * sizeof(float));
                }
            }
            qsort(t, 5, sizeof(float), test_cmp_float);
            ms[f] = t[2];
        }
        double e = test_norm_rel_err(h_out[1], h_out[0], (size_t)n * vw);
        double es = test_norm_rel_err(h_st[1], h_st[0], nst);
        printf("gdn forms, %3d tokens: chunked against recurrent rel err %.3g, state %.3g; "
               "recurrent %.1f us, chunked %.1f us (%.2fx)\n",
               n, e, es, 1e3 * ms[0], 1e3 * ms[1], ms[0] / ms[1]);
        CHECK(rc == 0 && e <= TOL_GDN && es <= TOL_GDN,
              "gdn forms at %d tokens: rc %d err %g state err %g", n, rc, e, es);
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cuda_free(d_qkv), cuda_free(d_z), cuda_free(d_ba), cuda_free(d_an), cuda_free(d_dt);
    cuda_free(d_nw), cuda_free(d_st0);
    for (int f = 0; f < 2; f++)
        cuda_free(d_st[f]), cuda_free(d_out[f]), free(h_out[f]), free(h_st[f]);
}

/* ---- partial rope ------------------------------------------------------------------------- */

static void test_rope(struct rng *r)
{
    struct {
        int n_tok, heads, hd, n_rot, pos0;
        float base;
        bool dev;
    } cases[] = {
        {37, 16, 256, 64, 5, 1e7f, false}, /* qwen3next: head_dim 256, a quarter rotated */
        {37, 2, 256, 64, 0, 1e7f, true},   {1, 16, 256, 64, 4095, 1e7f, false},
        {7, 3, 128, 128, 17, 1e4f, false}, {5, 5, 96, 32, 1000, 1e6f, true},
    };
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const int n_tok = cases[ci].n_tok, heads = cases[ci].heads, hd = cases[ci].hd;
        const int n_rot = cases[ci].n_rot;
        const size_t row = (size_t)heads * hd, n = n_tok * row;
        float *x = rand_f(r, n, 0.0f, 1.0f), *ref = xmalloc_f(n), *got = xmalloc_f(n);
        int32_t *pos = (int32_t *)test_xmalloc(sizeof(int32_t) * n_tok);
        memcpy(ref, x, n * sizeof(float));
        for (int t = 0; t < n_tok; t++) {
            pos[t] = cases[ci].dev ? (int32_t)rng_below(r, 100000) : cases[ci].pos0 + t;
            ops_rope_neox_partial(ref + t * row, 1, heads, hd, n_rot, pos[t], cases[ci].base);
        }
        float *d_x = dev_buf(x, n);
        int32_t *d_pos = (int32_t *)test_dev_dup(pos, sizeof(int32_t) * n_tok);
        struct cuda_rope_partial_args a = {d_x, n_tok, heads, hd, n_rot, 0, NULL, 0.0f, NULL};
        a.pos0 = cases[ci].pos0, a.pos_dev = cases[ci].dev ? d_pos : NULL, a.base = cases[ci].base;
        int rc = cuda_rope_partial(&a);
        test_dev_get(got, d_x, n * sizeof(float));
        double e = test_norm_rel_err(got, ref, n);
        size_t pass_bad = 0; /* dims n_rot.. of each head must be the input's bits */
        for (size_t h = 0; h < (size_t)n_tok * heads; h++)
            pass_bad += bits_differ(got + h * hd + n_rot, x + h * hd + n_rot, hd - n_rot);
        bool guards = guard_ok(d_x, n);
        printf("rope_partial n_tok %2d heads %2d head_dim %3d n_rot %3d %s: rc %d, rel err %.3g, "
               "%zu pass-through values differ\n",
               n_tok, heads, hd, n_rot, cases[ci].dev ? "device positions" : "pos0 + t        ", rc,
               e, pass_bad);
        CHECK(rc == 0 && e <= TOL_ROPE && pass_bad == 0 && guards,
              "rope_partial case %zu: rc %d err %g pass-through %zu guards %d", ci, rc, e, pass_bad,
              guards);
        cuda_free(d_x), cuda_free(d_pos);
        free(x), free(ref), free(got), free(pos);
    }
}

/* ---- elementwise ops (references: runtime/backend_cpu.c's loops) -------------------------- */

static void test_split_halves(struct rng *r)
{
    static const int cases[][2] = {{37 * 16, 256}, {3, 7}}; /* rows, hd */
    for (int ci = 0; ci < 2; ci++) {
        const int rows = cases[ci][0], hd = cases[ci][1];
        const size_t n = (size_t)rows * hd;
        float *qg = rand_f(r, 2 * n, 0.0f, 1.0f), *q = xmalloc_f(n), *gate = xmalloc_f(n);
        float *q_ref = xmalloc_f(n), *g_ref = xmalloc_f(n);
        for (int row = 0; row < rows; row++) { /* as cpu_split_halves */
            memcpy(q_ref + (size_t)row * hd, qg + (size_t)row * 2 * hd, sizeof(float) * hd);
            memcpy(g_ref + (size_t)row * hd, qg + (size_t)row * 2 * hd + hd, sizeof(float) * hd);
        }
        float *d_qg = dev_buf(qg, 2 * n), *d_q = dev_buf(NULL, n), *d_g = dev_buf(NULL, n);
        int rc = cuda_split_halves(d_q, d_g, d_qg, rows, hd, NULL);
        test_dev_get(q, d_q, n * sizeof(float));
        test_dev_get(gate, d_g, n * sizeof(float));
        size_t bad = bits_differ(q, q_ref, n) + bits_differ(gate, g_ref, n);
        bool guards = guard_ok(d_q, n) && guard_ok(d_g, n);
        printf("split_halves rows %3d hd %3d: rc %d, %zu values differ\n", rows, hd, rc, bad);
        CHECK(rc == 0 && bad == 0 && guards,
              "split_halves rows %d hd %d: rc %d, %zu differ, guards %d", rows, hd, rc, bad,
              guards);
        cuda_free(d_qg), cuda_free(d_q), cuda_free(d_g);
        free(qg), free(q), free(gate), free(q_ref), free(g_ref);
    }
}

/* mode 0: x *= sigmoid(g) (cpu_mul_sigmoid); 1: u *= silu(g) (cpu_shared_expert's swiglu) */
static void test_gates(struct rng *r)
{
    static const size_t ns[] = {37 * 4096 + 3, 5};
    for (int mode = 0; mode < 2; mode++) {
        for (int ni = 0; ni < 2; ni++) {
            const size_t n = ns[ni] + (mode ? 2 : 0);
            float *x = rand_f(r, n, 0.0f, 1.0f), *g = rand_f(r, n, 0.0f, 3.0f);
            float *ref = xmalloc_f(n), *got = xmalloc_f(n);
            for (size_t i = 0; i < n; i++)
                ref[i] = x[i] * (mode ? ops_silu(g[i]) : 1.0f / (1.0f + expf(-g[i])));
            float *d_x = dev_buf(x, n), *d_g = dev_buf(g, n);
            int rc =
                mode ? cuda_swiglu_inplace(d_x, d_g, n, NULL) : cuda_mul_sigmoid(d_x, d_g, n, NULL);
            test_dev_get(got, d_x, n * sizeof(float));
            double e = test_norm_rel_err(got, ref, n);
            bool guards = guard_ok(d_x, n);
            printf("%s n %6zu: rc %d, rel err %.3g\n", mode ? "swiglu_inplace" : "mul_sigmoid   ",
                   n, rc, e);
            CHECK(rc == 0 && e <= TOL_EW && guards, "%s n %zu: rc %d err %g guards %d",
                  mode ? "swiglu_inplace" : "mul_sigmoid", n, rc, e, guards);
            cuda_free(d_x), cuda_free(d_g);
            free(x), free(g), free(ref), free(got);
        }
    }
}

static void test_add_sigmoid_gated(struct rng *r)
{
    static const int cases[][2] = {{37, 2048}, {1, 2048}, {3, 33}}; /* rows, dim */
    for (int ci = 0; ci < 3; ci++) {
        const int rows = cases[ci][0], dim = cases[ci][1];
        const size_t n = (size_t)rows * dim;
        float *out = rand_f(r, n, 0.0f, 1.0f), *y = rand_f(r, n, 0.0f, 1.0f);
        float *x = rand_f(r, n, 0.0f, 1.0f);
        float *w = rand_f(r, dim, 0.0f, 1.5f / sqrtf((float)dim)); /* w.x ~ N(0, 1.5^2) */
        float *ref = xmalloc_f(n), *got = xmalloc_f(n);
        memcpy(ref, out, n * sizeof(float));
        for (int row = 0; row < rows; row++) { /* as cpu_shared_expert */
            const float *xr = x + (size_t)row * dim;
            float dot = 0.0f;
            for (int i = 0; i < dim; i++)
                dot += w[i] * xr[i];
            float s = 1.0f / (1.0f + expf(-dot));
            for (int i = 0; i < dim; i++)
                ref[(size_t)row * dim + i] += s * y[(size_t)row * dim + i];
        }
        float *d_out = dev_buf(out, n), *d_y = dev_buf(y, n), *d_x = dev_buf(x, n);
        float *d_w = dev_buf(w, dim);
        int rc = cuda_add_sigmoid_gated(d_out, d_y, d_x, d_w, rows, dim, NULL);
        test_dev_get(got, d_out, n * sizeof(float));
        double e = test_norm_rel_err(got, ref, n);
        bool guards = guard_ok(d_out, n);
        printf("add_sigmoid_gated rows %2d dim %4d: rc %d, rel err %.3g\n", rows, dim, rc, e);
        CHECK(rc == 0 && e <= TOL_EW && guards,
              "add_sigmoid_gated rows %d dim %d: rc %d err %g guards %d", rows, dim, rc, e, guards);
        cuda_free(d_out), cuda_free(d_y), cuda_free(d_x), cuda_free(d_w);
        free(out), free(y), free(x), free(w), free(ref), free(got);
    }
}

/* ---- a decode step captured in a CUDA graph ----------------------------------------------- */

/* conv + gdn on one token (qwen3next-like layer, smaller: n_k 2, n_v 4, d 128) and partial
 * rope at a device position, captured once and replayed with new inputs each step. */
static void test_graph(struct rng *r)
{
    const int nk = 2, nv = 4, d = 128, kc = 4, steps = 5, heads = 4, hd = 256, n_rot = 64;
    const size_t kw = (size_t)nk * d, vw = (size_t)nv * d, cw = 2 * kw + vw;
    const size_t ncs = (size_t)(kc - 1) * cw, nst = (size_t)nv * d * d, nr = (size_t)heads * hd;
    const int bs = 2 * nv;
    float *w = rand_f(r, cw * kc, 0.0f, 0.5f), *an = xmalloc_f(nv);
    float *dt = rand_f(r, nv, 1.0f, 0.1f), *nw = rand_f(r, d, 1.0f, 0.1f);
    float *cs = rand_f(r, ncs, 0.0f, 1.0f), *st = rand_f(r, nst, 0.0f, 0.3f);
    float *qkv = xmalloc_f(cw), *z = xmalloc_f(vw), *ba = xmalloc_f(bs), *x = xmalloc_f(nr);
    float *ref = xmalloc_f(vw), *got = xmalloc_f(vw), *xg = xmalloc_f(nr);
    for (int j = 0; j < nv; j++)
        an[j] = -expf(rng_uniform(r, 0.0f, 2.0f));
    float *d_w = dev_buf(w, cw * kc), *d_an = dev_buf(an, nv), *d_dt = dev_buf(dt, nv);
    float *d_nw = dev_buf(nw, d), *d_cs = dev_buf(cs, ncs), *d_st = dev_buf(st, nst);
    float *d_qkv = dev_buf(NULL, cw), *d_z = dev_buf(NULL, vw), *d_ba = dev_buf(NULL, bs);
    float *d_out = dev_buf(NULL, vw), *d_x = dev_buf(NULL, nr);
    int32_t *d_pos = (int32_t *)test_dev_alloc(sizeof(int32_t));
    cudaStream_t s;
    cudaGraph_t graph;
    cudaGraphExec_t exec;

    if (CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)))
        fatal("cudaStreamCreate");
    if (CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal)))
        fatal("cudaStreamBeginCapture");
    struct cuda_ssm_conv_args cv = {d_qkv, d_cs, d_w, 1, (int)cw, kc, s};
    struct cuda_gdn_args g = {};
    g.out = d_out, g.qkv = d_qkv, g.z = d_z, g.b = d_ba, g.a = d_ba, g.ba_stride = bs;
    g.ba_grouped = true, g.a_log_neg = d_an, g.dt_bias = d_dt, g.norm_w = d_nw, g.state = d_st;
    g.n_tok = 1, g.n_k = nk, g.n_v = nv, g.d = d, g.v_tiled = false, g.eps = 1e-6f, g.stream = s;
    struct cuda_rope_partial_args rp = {d_x, 1, heads, hd, n_rot, 0, d_pos, 1e7f, s};
    int rc = cuda_ssm_conv(&cv);
    rc = rc ? rc : cuda_gdn(&g);
    rc = rc ? rc : cuda_rope_partial(&rp);
    if (CUDA_CHECK(cudaStreamEndCapture(s, &graph)) ||
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0)))
        fatal("graph capture");
    CHECK(rc == 0, "launch inside capture failed: %d", rc);

    double worst = 0, worst_rope = 0;
    for (int step = 0; step < steps; step++) {
        int32_t pos = 1000 + 7 * step;
        fill(r, qkv, cw, 0.0f, 1.0f), fill(r, z, vw, 0.0f, 1.0f), fill(r, ba, bs, 0.0f, 1.0f);
        fill(r, x, nr, 0.0f, 1.0f);
        test_dev_put(d_qkv, qkv, cw * sizeof(float));
        test_dev_put(d_z, z, vw * sizeof(float));
        test_dev_put(d_ba, ba, bs * sizeof(float));
        test_dev_put(d_x, x, nr * sizeof(float));
        test_dev_put(d_pos, &pos, sizeof(int32_t));
        test_dev_poison(d_out, vw * sizeof(float));
        if (CUDA_CHECK(cudaGraphLaunch(exec, s)) || CUDA_CHECK(cudaStreamSynchronize(s)))
            fatal("cudaGraphLaunch");
        ops_ssm_conv(qkv, cs, w, 1, (int)cw, kc); /* the same step on the CPU */
        struct ops_gdn o = {};
        o.out = ref, o.qkv = qkv, o.z = z, o.b = ba, o.a = ba, o.ba_stride = bs;
        o.ba_grouped = true, o.a_log_neg = an, o.dt_bias = dt, o.norm_w = nw, o.state = st;
        o.n_tok = 1, o.n_k = nk, o.n_v = nv, o.d = d, o.v_tiled = false, o.eps = 1e-6f;
        ops_gdn(&o);
        ops_rope_neox_partial(x, 1, heads, hd, n_rot, pos, 1e7f);
        test_dev_get(got, d_out, vw * sizeof(float));
        test_dev_get(xg, d_x, nr * sizeof(float));
        double e = test_norm_rel_err(got, ref, vw), er = test_norm_rel_err(xg, x, nr);
        worst = e > worst ? e : worst;
        worst_rope = er > worst_rope ? er : worst_rope;
        CHECK(e <= TOL_GDN && er <= TOL_ROPE, "graph step %d: gdn err %g rope err %g", step, e, er);
    }
    printf("graph decode step (conv, gdn n_k %d n_v %d d %d, rope_partial at device positions) "
           "replayed %d times: worst gdn rel err %.3g, rope %.3g\n",
           nk, nv, d, steps, worst, worst_rope);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
    cuda_free(d_w), cuda_free(d_an), cuda_free(d_dt), cuda_free(d_nw), cuda_free(d_cs);
    cuda_free(d_st), cuda_free(d_qkv), cuda_free(d_z), cuda_free(d_ba), cuda_free(d_out);
    cuda_free(d_x), cuda_free(d_pos);
    free(w), free(an), free(dt), free(nw), free(cs), free(st), free(qkv), free(z), free(ba);
    free(x), free(ref), free(got), free(xg);
}

/* ---- shapes the launchers must refuse (fake pointers: nothing may be launched) ------------- */

static void test_bad_shapes(void)
{
    float *p = (float *)8;
    struct cuda_ssm_conv_args cv = {p, p, p, 1, 8, CUDA_SSM_MAX_CONV + 1, NULL};
    CHECK(cuda_ssm_conv(&cv) == -EINVAL, "conv with d_conv %d was not refused", cv.d_conv);
    struct cuda_gdn_args g = {};
    g.out = p, g.qkv = p, g.z = p, g.b = p, g.a = p, g.ba_stride = 6, g.a_log_neg = p;
    g.dt_bias = p, g.norm_w = p, g.state = p, g.n_tok = 1, g.n_k = 4, g.n_v = 6, g.d = 32;
    CHECK(cuda_gdn(&g) == -EINVAL, "gdn with n_v %% n_k != 0 was not refused");
    g.n_k = 3, g.d = CUDA_SSM_MAX_D + 1;
    CHECK(cuda_gdn(&g) == -EINVAL, "gdn with d %d was not refused", g.d);
    g.d = 32, g.ba_grouped = true; /* grouped needs a stride of 2 n_v */
    CHECK(cuda_gdn(&g) == -EINVAL, "gdn with a short ba stride was not refused");
    struct cuda_rope_partial_args rp = {p, 1, 2, 64, 33, 0, NULL, 1e4f, NULL};
    CHECK(cuda_rope_partial(&rp) == -EINVAL, "rope_partial with odd n_rot was not refused");
    rp.n_rot = 66;
    CHECK(cuda_rope_partial(&rp) == -EINVAL, "rope_partial with n_rot > head_dim was not refused");
    CHECK(cuda_add_sigmoid_gated(p, p, p, p, 1, 0, NULL) == -EINVAL,
          "add_sigmoid_gated with dim 0 was not refused");
    CHECK(cuda_split_halves(p, p, p, -1, 8, NULL) == -EINVAL,
          "split_halves with rows -1 was not refused");
    printf("bad shapes refused\n");
}

int main(void)
{
    if (!test_gpu_available(NAME))
        return TEST_SKIP;
    struct rng r;
    rng_seed(&r, test_seed(NAME), 0);
    test_conv(&r);
    test_gdn(&r);
    test_gdn_forms(&r);
    test_rope(&r);
    test_split_halves(&r);
    test_gates(&r);
    test_add_sigmoid_gated(&r);
    test_graph(&r);
    test_bad_shapes();
    return test_finish(NAME);
}
