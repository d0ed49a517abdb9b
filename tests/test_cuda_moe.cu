/* cuda_moe: one whole MoE layer on the device (cuda_softmax_topk then cuda_moe_ffn) against the
 * CPU path (moe_route_softmax_topk + moe_plan_build + moe_cpu_run) and against a double-precision
 * reference over the exactly dequantized weights, on fresh random data with NaN-poisoned
 * outputs, for gate/up and down types Q4_K/Q5_K/Q6_K/Q8_0/Q4_0/MXFP4/F32/F16/BF16, n_expert
 * 8..128, k 2..8, n_tok 1..300. Per case it prints the errors and checks:
 *   routing: ids equal the CPU's exactly (selection compares the same floats), weights 2e-6;
 *   vs the double reference: norm rel err <= 2e-5 and max err <= 1e-4 of max |ref| (float
 *     dot products with FMAs over exactly decoded weights), for the grouped path and for the
 *     direct path except on Q4_K/Q6_K/MXFP4 gate/up and down, where it uses 8-bit codes: norm
 *     <= 3e-2, max <= 1e-1 (the CPU path's codes are 1-2% off);
 *   vs the CPU path: norm rel err <= 5e-2 (the CPU quantizes activations to Q8_0 / Q8_K; its
 *     own error against the double reference is printed next to it);
 *   the direct and grouped paths agree bit for bit (where the direct path is not 8-bit), and
 *     the slot-table pointers equal the stacked tensors bit for bit on the automatic path;
 *   the tensor-core path (bf16 products) vs the double reference: norm rel err <= 2e-2, max err
 *     <= 8e-2 of max |ref|;
 *   the tensor-core path on 8-bit codes (Q4_K/Q6_K, rows of multiples of 256) vs the double
 *     reference as the direct 8-bit path, and vs that path norm <= 2e-3, max <= 2e-2; on other
 *     types and shapes its request equals the tensor-core path bit for bit;
 *   an expert id outside the table turns that token's row (only) into NaN;
 *   a router + experts step captured in a CUDA graph and replayed on new inputs equals the
 *     eager launches bit for bit (direct and grouped paths);
 *   a call given the router's logits instead of ids (selecting inside the bulk kernels for one
 *     token, by the top-k launch otherwise) writes the top-k launch's ids and weights and the
 *     outputs of the call given them, bit for bit; half the cases with 32 or more experts draw
 *     logits on a grid of 0.5, so that selected logits tie;
 *   gpt-oss's experts (per-expert biases and the clamped SwiGLU, MXFP4 and F32 weights, every
 *     path, the 8-bit ones included) by the same criteria, the references computing biases and
 *     activation as cpu_kernels/expert_ffn.h.
 * Replay a failure with STRATA_TEST_SEED. Exits 77 without a GPU. */
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "cuda_mem.h"
#include "cuda_moe.h"
#include "cuda_ops.h"
#include "expert_ffn.h"
#include "moe.h"
#include "quant.h"
#include "quant_ref.h"
#include "testutil.h"
extern "C" { /* C headers without their own guard */
#include "gen.h"
}

#define TOL_REF_NORM 2e-5
#define TOL_REF_MAX 1e-4
#define TOL_CPU_NORM 5e-2
#define TOL_TOPK_W 2e-6
/* the tensor-core path rounds activations, decoded weights and h to bf16 (8 significant bits):
 * each product is off by up to 2^-8 relatively, about 0.3% rms; both matrix products and the
 * silu stack that up to about 1% in the norm. Dropping one of k = 8 experts, or a group of a
 * row, is off by 10% and more. */
/* the direct path's 8-bit activation codes (Q4_K/Q6_K): x and h each rounded to 8 bits per
 * 32 elements, about 0.5% rms per dot product (the CPU backend's Q8_K codes, one scale per 256,
 * measure 1-2%) */
#define TOL_Q8_NORM 3e-2
#define TOL_Q8_MAX 1e-1
/* grouped 8-bit against direct (8-bit): the same h bits, the down sums in another order (per
 * pair, then over j, against per token across the pairs) */
#define TOL_G8_NORM 1e-5
#define TOL_G8_MAX 1e-4
#define TOL_MMA_NORM 2e-2
#define TOL_MMA_MAX 8e-2
/* tensor cores on 8-bit codes against the direct 8-bit path: the same integer unit sums and
 * scales, added in another order; h's codes may round the other way where a value lies within
 * a float rounding of a code boundary (about 3e-5 of them, each off by one code) */
#define TOL_M8_NORM 2e-3
#define TOL_M8_MAX 2e-2

static const char *NAME = "test_cuda_moe";

/* ---- helpers ------------------------------------------------------------------------------ */

static void fatal(const char *what)
{
    fprintf(stderr, "%s: %s failed\n", NAME, what);
    exit(1);
}

/* n_rows rows of n elements ~ N(0, std^2): drawn codes where gen supports the type, else the
 * reference quantizer over normals. */
static uint8_t *weights_draw(struct rng *r, uint32_t type, int64_t n_rows, int64_t n, float std)
{
    uint64_t rb = test_row_bytes(type, n);
    uint8_t *w = (uint8_t *)test_xmalloc(rb * n_rows);
    float *x = (float *)test_xmalloc(sizeof(float) * n);
    for (int64_t row = 0; row < n_rows; row++) {
        if (type != QUANT_F32 && gen_blocks_can_draw(type)) {
            if (gen_blocks_draw(type, w + row * rb, (uint64_t)n, 0.0f, std, r))
                fatal("gen_blocks_draw");
            continue;
        }
        for (int64_t i = 0; i < n; i++)
            x[i] = std * rng_normal(r);
        if (quant_ref_quantize(type, x, w + row * rb, n))
            fatal("quant_ref_quantize");
    }
    free(x);
    return w;
}

static size_t bits_differ(const float *a, const float *b, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += memcmp(a + i, b + i, sizeof(float)) != 0;
    return bad;
}

/* max |a - b| / max |b| and ||a - b|| / ||b|| */
static void errs(const float *a, const float *b, size_t n, double *emax, double *enorm)
{
    *emax = test_max_rel_err(a, b, n);
    *enorm = test_norm_rel_err(a, b, n);
}

/* ---- one layer ------------------------------------------------------------------------------ */

struct moe_case {
    uint32_t gt, dt; /* gate/up type, down type */
    int n_embd, n_ff, n_expert, k, n_tok;
    bool oai; /* gpt-oss: biases and the clamped SwiGLU */
};

/* Whether the direct path runs on 8-bit activation codes (cuda_moe.h): Q4_K, Q6_K or MXFP4
 * gate/up and down weights (the test's shapes are whole 32-element units). */
static bool q8_type(uint32_t t)
{
    return t == QUANT_Q4_K || t == QUANT_Q6_K || t == QUANT_MXFP4;
}

static bool direct_q8(const struct moe_case *c)
{
    return q8_type(c->gt) && q8_type(c->dt);
}

/* Whether the 8-bit tensor-core path takes the case (cuda_moe.h). */
static bool m8_case(const struct moe_case *c)
{
    bool gt = c->gt == QUANT_Q4_K || c->gt == QUANT_Q6_K;
    bool dt = c->dt == QUANT_Q4_K || c->dt == QUANT_Q6_K;
    return gt && dt && c->n_embd % 256 == 0 && c->n_ff % 256 == 0;
}

/* The path CUDA_MOE_PATH_AUTO takes (0 direct, 1 grouped, 2 mma, 4 grouped 8-bit, 6 mma on
 * 8-bit codes), as cuda_moe.h states it. */
static int auto_path_of(const struct moe_case *c)
{
    bool q8 = direct_q8(c);
    if (q8 && c->n_tok >= CUDA_MOE_GROUPED8_MIN_TOK && c->n_tok <= CUDA_MOE_GROUPED8_MAX_TOK)
        return 4;
    if (c->n_tok <= (q8 ? CUDA_MOE_GROUPED8_MIN_TOK - 1 : CUDA_MOE_DIRECT_MAX_TOK))
        return 0;
    if (c->n_tok >= CUDA_MOE_MMA_MIN_TOK && c->gt != QUANT_F32 && c->dt != QUANT_F32)
        return m8_case(c) ? 6 : 2;
    return 1;
}

/* Host and device copies of one layer's experts and inputs. */
struct layer {
    const struct moe_case *c;
    uint64_t g_row, d_row, g_stride, d_stride;
    uint8_t *gate, *up, *down;    /* host, stacked */
    float **deq;                  /* (n_expert * 3) lazily dequantized gate, up, down */
    void *d_gate, *d_up, *d_down; /* device, stacked */
    void *d_slots;                /* device: every expert again, in reverse order */
    const void **d_ptrs;          /* device (3, n_expert) pointers into d_slots */
    float *gb, *ub, *db;          /* oai: biases (n_expert, n_ff) x2 and (n_expert, n_embd) */
    float *d_gb, *d_ub, *d_db;
};

/* h of one row: silu(g) u, or gpt-oss's min(g', 7) sigmoid(1.702 min(g', 7)) (clamp(u', -7, 7)
 * + 1) with g' = g + gate bias, u' = u + up bias (double). */
static double ref_h(const struct layer *L, int e, int r, double g, double u)
{
    if (!L->c->oai)
        return g / (1.0 + exp(-g)) * u;
    g += L->gb[(size_t)e * L->c->n_ff + r];
    u += L->ub[(size_t)e * L->c->n_ff + r];
    g = g < 7.0 ? g : 7.0;
    u = u < -7.0 ? -7.0 : u > 7.0 ? 7.0 : u;
    return g / (1.0 + exp(-1.702 * g)) * (u + 1.0);
}

static const float *layer_deq(struct layer *L, int e, int which)
{
    const struct moe_case *c = L->c;
    float **slot = &L->deq[e * 3 + which];
    if (!*slot) {
        int64_t rows = which == 2 ? c->n_embd : c->n_ff, n = which == 2 ? c->n_ff : c->n_embd;
        uint32_t t = which == 2 ? c->dt : c->gt;
        const uint8_t *src = which == 0   ? L->gate + e * L->g_stride
                             : which == 1 ? L->up + e * L->g_stride
                                          : L->down + e * L->d_stride;
        *slot = (float *)test_xmalloc(sizeof(float) * rows * n);
        if (quant_ref_dequantize(t, src, *slot, rows * n))
            fatal("quant_ref_dequantize");
    }
    return *slot;
}

static void layer_make(struct rng *r, const struct moe_case *c, struct layer *L)
{
    memset(L, 0, sizeof(*L));
    L->c = c;
    L->g_row = test_row_bytes(c->gt, c->n_embd);
    L->d_row = test_row_bytes(c->dt, c->n_ff);
    L->g_stride = L->g_row * c->n_ff;
    L->d_stride = L->d_row * c->n_embd;
    L->gate = weights_draw(r, c->gt, (int64_t)c->n_expert * c->n_ff, c->n_embd,
                           1.0f / sqrtf((float)c->n_embd));
    L->up = weights_draw(r, c->gt, (int64_t)c->n_expert * c->n_ff, c->n_embd,
                         1.0f / sqrtf((float)c->n_embd));
    L->down = weights_draw(r, c->dt, (int64_t)c->n_expert * c->n_embd, c->n_ff,
                           1.0f / sqrtf((float)c->n_ff));
    L->deq = (float **)calloc((size_t)c->n_expert * 3, sizeof(float *));
    L->d_gate = test_dev_dup(L->gate, L->g_stride * c->n_expert);
    L->d_up = test_dev_dup(L->up, L->g_stride * c->n_expert);
    L->d_down = test_dev_dup(L->down, L->d_stride * c->n_expert);
    /* the slot copy: gate, up, down of expert e in slot n_expert - 1 - e */
    uint64_t slot = 2 * L->g_stride + L->d_stride;
    slot = (slot + 255) & ~(uint64_t)255;
    L->d_slots = test_dev_alloc(slot * c->n_expert);
    const void **ptrs = (const void **)test_xmalloc(sizeof(void *) * 3 * c->n_expert);
    for (int e = 0; e < c->n_expert; e++) {
        uint8_t *s = (uint8_t *)L->d_slots + slot * (c->n_expert - 1 - e);
        test_dev_put(s, L->gate + e * L->g_stride, L->g_stride);
        test_dev_put(s + L->g_stride, L->up + e * L->g_stride, L->g_stride);
        test_dev_put(s + 2 * L->g_stride, L->down + e * L->d_stride, L->d_stride);
        ptrs[e] = s;
        ptrs[c->n_expert + e] = s + L->g_stride;
        ptrs[2 * c->n_expert + e] = s + 2 * L->g_stride;
    }
    L->d_ptrs = (const void **)test_dev_dup(ptrs, sizeof(void *) * 3 * c->n_expert);
    free(ptrs);
    if (c->oai) { /* biases large enough to matter (and to reach the clamps now and then) */
        size_t nf = (size_t)c->n_expert * c->n_ff, ne = (size_t)c->n_expert * c->n_embd;
        L->gb = test_rand_normal(r, nf, 1.5f);
        L->ub = test_rand_normal(r, nf, 1.5f);
        L->db = test_rand_normal(r, ne, 0.5f);
        L->d_gb = (float *)test_dev_dup(L->gb, sizeof(float) * nf);
        L->d_ub = (float *)test_dev_dup(L->ub, sizeof(float) * nf);
        L->d_db = (float *)test_dev_dup(L->db, sizeof(float) * ne);
    }
}

static void layer_free(struct layer *L)
{
    for (int i = 0; i < L->c->n_expert * 3; i++)
        free(L->deq[i]);
    free(L->deq), free(L->gate), free(L->up), free(L->down);
    cuda_free(L->d_gate), cuda_free(L->d_up), cuda_free(L->d_down), cuda_free(L->d_slots);
    cuda_free(L->d_ptrs);
    if (L->c->oai) {
        free(L->gb), free(L->ub), free(L->db);
        cuda_free(L->d_gb), cuda_free(L->d_ub), cuda_free(L->d_db);
    }
}

static struct cuda_moe_args layer_args(const struct layer *L, float *out, const float *in,
                                       const int32_t *ids, const float *w, void *scratch,
                                       size_t scratch_bytes, enum cuda_moe_path path, bool slots)
{
    const struct moe_case *c = L->c;
    struct cuda_moe_args a = {};
    a.out = out, a.out_stride = c->n_embd, a.in = in, a.in_stride = c->n_embd;
    a.n_tok = c->n_tok, a.k = c->k, a.n_expert = c->n_expert;
    a.n_embd = c->n_embd, a.n_ff = c->n_ff, a.ids = ids, a.weights = w;
    a.gate_type = a.up_type = c->gt, a.down_type = c->dt;
    a.gate = L->d_gate, a.up = L->d_up, a.down = L->d_down;
    a.gate_stride = a.up_stride = L->g_stride, a.down_stride = L->d_stride;
    if (slots) {
        a.gate_ptrs = L->d_ptrs;
        a.up_ptrs = L->d_ptrs + c->n_expert;
        a.down_ptrs = L->d_ptrs + 2 * c->n_expert;
    }
    a.path = path, a.scratch = scratch, a.scratch_bytes = scratch_bytes;
    if (c->oai)
        a.gate_b = L->d_gb, a.up_b = L->d_ub, a.down_b = L->d_db, a.act_oai = 1;
    return a;
}

/* out (n_tok, n_embd) = sum_j w_j down_e(silu(gate_e x) * up_e x), in double. */
static void reference_double(struct layer *L, const float *x, const int32_t *ids, const float *w,
                             float *out)
{
    const struct moe_case *c = L->c;
    double *h = (double *)test_xmalloc(sizeof(double) * c->n_ff);
    double *o = (double *)test_xmalloc(sizeof(double) * c->n_embd);
    for (int t = 0; t < c->n_tok; t++) {
        const float *xt = x + (size_t)t * c->n_embd;
        memset(o, 0, sizeof(double) * c->n_embd);
        for (int j = 0; j < c->k; j++) {
            int e = ids[t * c->k + j];
            const float *g = layer_deq(L, e, 0), *u = layer_deq(L, e, 1), *d = layer_deq(L, e, 2);
            for (int r = 0; r < c->n_ff; r++) {
                double sg = 0, su = 0;
                for (int i = 0; i < c->n_embd; i++) {
                    sg += (double)g[(size_t)r * c->n_embd + i] * xt[i];
                    su += (double)u[(size_t)r * c->n_embd + i] * xt[i];
                }
                h[r] = ref_h(L, e, r, sg, su);
            }
            for (int i = 0; i < c->n_embd; i++) {
                double s = c->oai ? L->db[(size_t)e * c->n_embd + i] : 0.0;
                for (int r = 0; r < c->n_ff; r++)
                    s += (double)d[(size_t)i * c->n_ff + r] * h[r];
                o[i] += w[t * c->k + j] * s;
            }
        }
        for (int i = 0; i < c->n_embd; i++)
            out[(size_t)t * c->n_embd + i] = (float)o[i];
    }
    free(h), free(o);
}

/* The CPU backend's path: plan + moe_cpu_run (activations quantized to the dot formats). */
static void reference_cpu(const struct layer *L, const float *x, const int32_t *ids, const float *w,
                          float *out)
{
    const struct moe_case *c = L->c;
    struct moe_plan plan;
    struct moe_cpu *cpu;
    if (moe_plan_init(&plan, c->n_tok, c->k, c->n_expert) ||
        moe_cpu_open(c->n_tok, c->n_embd, c->n_ff, &cpu))
        fatal("moe_plan_init / moe_cpu_open");
    moe_plan_build(&plan, ids, w, c->n_tok);
    struct moe_experts ex = {L->gate,     L->up,       L->down,     c->gt,     c->gt,  c->dt,
                             L->g_stride, L->g_stride, L->d_stride, c->n_embd, c->n_ff};
    if (c->oai) {
        ex.gate_b = L->gb, ex.up_b = L->ub, ex.down_b = L->db;
        ex.act = EXPERT_ACT_SWIGLU_OAI;
    }
    if (moe_cpu_run(cpu, &plan, &ex, x, out))
        fatal("moe_cpu_run");
    moe_cpu_close(cpu);
    moe_plan_free(&plan);
}

static void run_case(struct rng *r, const struct moe_case *c, bool bad_id)
{
    struct layer L;
    layer_make(r, c, &L);
    size_t nx = (size_t)c->n_tok * c->n_embd, nl = (size_t)c->n_tok * c->n_expert;
    size_t nk = (size_t)c->n_tok * c->k;
    float *x = test_rand_normal(r, nx, 1.0f), *logits = test_rand_normal(r, nl, 1.5f);
    if (c->n_expert >= 32 && rng_below(r, 2)) /* ties among the selected and at the k-th */
        for (size_t i = 0; i < nl; i++)
            logits[i] = roundf(logits[i] * 2.0f) / 2.0f;
    int32_t *ids_ref = (int32_t *)test_xmalloc(sizeof(int32_t) * nk),
            *ids_got = (int32_t *)test_xmalloc(sizeof(int32_t) * nk);
    float *w_ref = (float *)test_xmalloc(sizeof(float) * nk),
          *w_got = (float *)test_xmalloc(sizeof(float) * nk);
    float *ref = (float *)test_xmalloc(sizeof(float) * nx),
          *cpu = (float *)test_xmalloc(sizeof(float) * nx);
    float *got[7];
    for (int i = 0; i < 7; i++)
        got[i] = (float *)test_xmalloc(sizeof(float) * nx);

    moe_route_softmax_topk(logits, c->n_tok, c->n_expert, c->k, ids_ref, w_ref);
    reference_double(&L, x, ids_ref, w_ref, ref);
    reference_cpu(&L, x, ids_ref, w_ref, cpu);

    float *d_x = (float *)test_dev_dup(x, nx * sizeof(float));
    float *d_logits = (float *)test_dev_dup(logits, nl * sizeof(float));
    int32_t *d_ids = (int32_t *)test_dev_alloc(sizeof(int32_t) * nk);
    float *d_w = (float *)test_dev_alloc(sizeof(float) * nk),
          *d_out = (float *)test_dev_alloc(sizeof(float) * nx);
    struct cuda_moe_args probe =
        layer_args(&L, NULL, NULL, NULL, NULL, NULL, 0, CUDA_MOE_PATH_AUTO, false);
    size_t sb = cuda_moe_scratch_bytes(&probe);
    void *d_scratch = test_dev_alloc(sb);
    CHECK(sb > 0, "cuda_moe_scratch_bytes returned 0");

    test_dev_poison(d_ids, sizeof(int32_t) * nk);
    test_dev_poison(d_w, sizeof(float) * nk);
    struct cuda_topk_args ta = {d_logits, c->n_tok, c->n_expert, c->k, d_ids, d_w, NULL};
    int rc = cuda_softmax_topk(&ta);
    test_dev_get(ids_got, d_ids, sizeof(int32_t) * nk);
    test_dev_get(w_got, d_w, sizeof(float) * nk);
    size_t id_bad = 0;
    double werr = 0;
    for (size_t i = 0; i < nk; i++) {
        id_bad += ids_got[i] != ids_ref[i];
        double d = isnan(w_got[i]) ? INFINITY : fabs((double)w_got[i] - w_ref[i]);
        werr = d > werr ? d : werr;
    }
    CHECK(rc == 0 && id_bad == 0 && werr <= TOL_TOPK_W,
          "routing: rc %d, %zu ids differ, "
          "weight err %g",
          rc, id_bad, werr);

    /* 0: direct, 1: grouped, 2: tensor cores, 3: slot tables on the automatic path, 4: grouped
     * 8-bit (the grouped path for other types), 5: bulk 8-bit (the direct path elsewhere), 6:
     * tensor cores on 8-bit codes (the tensor-core path elsewhere) */
    static const enum cuda_moe_path paths[7] = {
        CUDA_MOE_PATH_DIRECT,   CUDA_MOE_PATH_GROUPED, CUDA_MOE_PATH_MMA, CUDA_MOE_PATH_AUTO,
        CUDA_MOE_PATH_GROUPED8, CUDA_MOE_PATH_BULK8,   CUDA_MOE_PATH_MMA8};
    for (int i = 0; i < 7; i++) {
        test_dev_poison(d_out, sizeof(float) * nx);
        struct cuda_moe_args a =
            layer_args(&L, d_out, d_x, d_ids, d_w, d_scratch, sb, paths[i], i == 3);
        int rci = cuda_moe_ffn(&a);
        test_dev_get(got[i], d_out, sizeof(float) * nx);
        CHECK(rci == 0, "cuda_moe_ffn path %d: rc %d", i, rci);
    }
    /* the path the automatic choice takes, which the slot-table run must match bit for bit */
    bool q8 = direct_q8(c);
    int auto_path = auto_path_of(c);
    bool m8 = m8_case(c);
    double em, en, fm, fn, cm, cn, gm, gn, mm, mn, g8m, g8n, m8m, m8n, m8rm, m8rn;
    errs(got[6], got[0], nx, &m8m, &m8n);
    errs(got[6], ref, nx, &m8rm, &m8rn);
    size_t dm8 = bits_differ(got[6], got[2], nx);
    errs(got[0], ref, nx, &em, &en);
    errs(got[1], ref, nx, &fm, &fn);
    errs(cpu, ref, nx, &cm, &cn);
    errs(got[0], cpu, nx, &gm, &gn);
    errs(got[2], ref, nx, &mm, &mn);
    errs(got[4], got[0], nx, &g8m, &g8n);
    size_t dg = bits_differ(got[0], got[1], nx), dg8 = bits_differ(got[4], got[1], nx);
    size_t db8 = bits_differ(got[5], got[0], nx);
    size_t ds = bits_differ(got[auto_path], got[3], nx);
    static const char *const path_name[7] = {"direct",   "grouped", "mma", "",
                                             "grouped8", "bulk8",   "mma8"};
    printf("moe %-5s/%-5s%s n_embd %4d n_ff %4d experts %3d k %d n_tok %3d: routing %zu ids "
           "differ, w err %.2g | vs double: direct%s norm %.3g max %.3g, grouped norm %.3g max "
           "%.3g, mma norm %.3g max %.3g, cpu norm %.3g | direct vs cpu: norm %.3g | grouped8 vs "
           "direct: norm %.3g max %.3g | grouped vs direct, slots vs auto (%s): %zu/%zu bits "
           "differ, bulk8 vs direct %zu\n",
           quant_type_name(c->gt), quant_type_name(c->dt), c->oai ? " oai" : "", c->n_embd, c->n_ff,
           c->n_expert, c->k, c->n_tok, id_bad, werr, q8 ? " (8-bit)" : "", en, em, fn, fm, mn, mm,
           cn, gn, g8n, g8m, path_name[auto_path], dg, ds, db8);
    if (m8)
        printf("moe   mma8: vs double norm %.3g max %.3g | vs direct (8-bit) norm %.3g max %.3g\n",
               m8rn, m8rm, m8n, m8m);
    else
        printf("moe   mma8 request on these types/shapes: %zu elements differ from mma\n", dm8);
    CHECK(q8 ? en <= TOL_Q8_NORM && em <= TOL_Q8_MAX : en <= TOL_REF_NORM && em <= TOL_REF_MAX,
          "direct path vs double reference: norm %g max %g", en, em);
    CHECK(fn <= TOL_REF_NORM && fm <= TOL_REF_MAX,
          "grouped path vs double reference: norm %g max %g", fn, fm);
    CHECK(gn <= TOL_CPU_NORM, "gpu vs cpu path: norm %g", gn);
    CHECK(mn <= TOL_MMA_NORM && mm <= TOL_MMA_MAX, "mma vs double reference: norm %g max %g", mn,
          mm);
    CHECK((q8 || dg == 0) && ds == 0 && db8 == 0,
          "paths disagree: grouped %zu, slots %zu, bulk8 %zu elements differ", dg, ds, db8);
    if (m8) {
        CHECK(m8rn <= TOL_Q8_NORM && m8rm <= TOL_Q8_MAX, "mma8 vs double reference: norm %g max %g",
              m8rn, m8rm);
        CHECK(m8n <= TOL_M8_NORM && m8m <= TOL_M8_MAX, "mma8 vs direct 8-bit: norm %g max %g", m8n,
              m8m);
    } else {
        CHECK(dm8 == 0, "mma8 request on %s/%s: %zu elements differ from mma",
              quant_type_name(c->gt), quant_type_name(c->dt), dm8);
    }
    if (q8)
        CHECK(g8n <= TOL_G8_NORM && g8m <= TOL_G8_MAX,
              "grouped 8-bit vs direct 8-bit: norm %g max %g", g8n, g8m);
    else
        CHECK(dg8 == 0, "grouped 8-bit request on %s: %zu elements differ from grouped",
              quant_type_name(c->gt), dg8);

    if (bad_id) { /* one pair routed to a nonexistent expert: only its token turns NaN */
        int t = (int)rng_below(r, (uint32_t)c->n_tok), j = (int)rng_below(r, (uint32_t)c->k);
        int32_t bad = rng_below(r, 2) ? c->n_expert : -1;
        test_dev_put(d_ids + t * c->k + j, &bad, sizeof(bad));
        static const int bad_paths[6] = {0, 1, 2, 4, 5, 6};
        for (int bi = 0; bi < 6; bi++) {
            const int i = bad_paths[bi];
            test_dev_poison(d_out, sizeof(float) * nx);
            struct cuda_moe_args a =
                layer_args(&L, d_out, d_x, d_ids, d_w, d_scratch, sb, paths[i], false);
            int rci = cuda_moe_ffn(&a);
            float *o = got[3];
            test_dev_get(o, d_out, sizeof(float) * nx);
            size_t nan_ok = 0, same = 0;
            for (int tt = 0; tt < c->n_tok; tt++)
                for (int e = 0; e < c->n_embd; e++) {
                    size_t at = (size_t)tt * c->n_embd + e;
                    if (tt == t)
                        nan_ok += isnan(o[at]) != 0;
                    else
                        same += memcmp(o + at, got[i] + at, sizeof(float)) == 0;
                }
            printf("moe invalid id %d at (token %d, k %d), %s path: rc %d, %zu/%d NaN in its row, "
                   "%zu/%zu other elements unchanged\n",
                   bad, t, j,
                   path_name[i],
                   rci, nan_ok, c->n_embd, same, nx - c->n_embd);
            CHECK(rci == 0 && nan_ok == (size_t)c->n_embd && same == nx - c->n_embd,
                  "invalid expert id not contained (path %d)", i);
        }
    }

    /* the call given the router's logits selects its experts (inside the bulk kernels for one
     * token; by the top-k launch first otherwise): the same ids, weights and outputs, bit for
     * bit, as the top-k launch and the call given its ids */
    for (int si = 0; si < 2 && !bad_id; si++) {
        const int pi = si == 0 ? 5 : auto_path;
        int32_t *d_sid = (int32_t *)test_dev_alloc(sizeof(int32_t) * nk);
        float *d_sw = (float *)test_dev_alloc(sizeof(float) * nk);
        int32_t *sid = (int32_t *)test_xmalloc(sizeof(int32_t) * nk);
        float *sw = (float *)test_xmalloc(sizeof(float) * nk);
        test_dev_poison(d_sid, sizeof(int32_t) * nk);
        test_dev_poison(d_sw, sizeof(float) * nk);
        test_dev_poison(d_out, sizeof(float) * nx);
        struct cuda_moe_args a =
            layer_args(&L, d_out, d_x, NULL, NULL, d_scratch, sb,
                       si == 0 ? CUDA_MOE_PATH_BULK8 : CUDA_MOE_PATH_AUTO, false);
        a.logits = d_logits, a.ids_out = d_sid, a.weights_out = d_sw;
        const int rcs = cuda_moe_ffn(&a);
        test_dev_get(got[3], d_out, sizeof(float) * nx);
        test_dev_get(sid, d_sid, sizeof(int32_t) * nk);
        test_dev_get(sw, d_sw, sizeof(float) * nk);
        const size_t dout = bits_differ(got[3], got[pi], nx);
        const bool same =
            !memcmp(sid, ids_got, sizeof(int32_t) * nk) && !memcmp(sw, w_got, sizeof(float) * nk);
        printf("moe   selecting from the logits, %s path: ids and weights %s the top-k "
               "launch's, %zu elements differ\n",
               si == 0 ? "bulk8" : path_name[auto_path], same ? "equal" : "DIFFER FROM", dout);
        CHECK(rcs == 0 && same && dout == 0,
              "selecting from the logits (%s): rc %d, ids and weights %s, %zu elements differ",
              si == 0 ? "bulk8" : "auto", rcs, same ? "equal" : "differ", dout);
        cuda_free(d_sid), cuda_free(d_sw);
        free(sid), free(sw);
    }

    struct cuda_moe_args small =
        layer_args(&L, d_out, d_x, d_ids, d_w, d_scratch, sb - 1, CUDA_MOE_PATH_AUTO, false);
    CHECK(cuda_moe_ffn(&small) == -EINVAL, "too little scratch was not refused");

    cuda_free(d_x), cuda_free(d_logits), cuda_free(d_ids), cuda_free(d_w), cuda_free(d_out);
    cuda_free(d_scratch);
    free(x), free(logits), free(ids_ref), free(ids_got), free(w_ref), free(w_got), free(ref);
    free(cpu);
    for (int i = 0; i < 7; i++)
        free(got[i]);
    layer_free(&L);
}

/* Router + experts captured once in a CUDA graph, replayed on new inputs; each replay must
 * equal the eager launches on the same inputs bit for bit. */
static const char *const path_names_auto[7] = {"direct",   "grouped", "mma", "",
                                               "grouped8", "",        "mma8"};

static void run_graph_case(struct rng *r, const struct moe_case *c)
{
    struct layer L;
    layer_make(r, c, &L);
    size_t nx = (size_t)c->n_tok * c->n_embd, nl = (size_t)c->n_tok * c->n_expert;
    size_t nk = (size_t)c->n_tok * c->k;
    float *d_x = (float *)test_dev_alloc(nx * sizeof(float)),
          *d_logits = (float *)test_dev_alloc(nl * sizeof(float));
    int32_t *d_ids = (int32_t *)test_dev_alloc(sizeof(int32_t) * nk);
    float *d_w = (float *)test_dev_alloc(sizeof(float) * nk),
          *d_out = (float *)test_dev_alloc(sizeof(float) * nx);
    float *g_out = (float *)test_xmalloc(sizeof(float) * nx),
          *e_out = (float *)test_xmalloc(sizeof(float) * nx);
    struct cuda_moe_args probe =
        layer_args(&L, NULL, NULL, NULL, NULL, NULL, 0, CUDA_MOE_PATH_AUTO, false);
    size_t sb = cuda_moe_scratch_bytes(&probe);
    void *d_scratch = test_dev_alloc(sb);
    cudaStream_t s;
    cudaGraph_t graph;
    cudaGraphExec_t exec;

    if (CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) ||
        CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal)))
        fatal("stream capture");
    struct cuda_topk_args ta = {d_logits, c->n_tok, c->n_expert, c->k, d_ids, d_w, s};
    struct cuda_moe_args ma =
        layer_args(&L, d_out, d_x, d_ids, d_w, d_scratch, sb, CUDA_MOE_PATH_AUTO, false);
    ma.stream = s;
    int rc = cuda_softmax_topk(&ta) | cuda_moe_ffn(&ma);
    if (CUDA_CHECK(cudaStreamEndCapture(s, &graph)) ||
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0)))
        fatal("graph instantiate");
    CHECK(rc == 0, "launch inside capture failed: %d", rc);
    size_t worst = 0;
    for (int step = 0; step < 3; step++) {
        float *x = test_rand_normal(r, nx, 1.0f), *logits = test_rand_normal(r, nl, 1.5f);
        test_dev_put(d_x, x, nx * sizeof(float));
        test_dev_put(d_logits, logits, nl * sizeof(float));
        test_dev_poison(d_out, nx * sizeof(float));
        if (CUDA_CHECK(cudaGraphLaunch(exec, s)) || CUDA_CHECK(cudaStreamSynchronize(s)))
            fatal("cudaGraphLaunch");
        test_dev_get(g_out, d_out, nx * sizeof(float));
        test_dev_poison(d_out, nx * sizeof(float));
        ta.stream = ma.stream = NULL;
        rc = cuda_softmax_topk(&ta) | cuda_moe_ffn(&ma);
        ta.stream = ma.stream = s;
        test_dev_get(e_out, d_out, nx * sizeof(float));
        size_t bad = bits_differ(g_out, e_out, nx);
        worst = bad > worst ? bad : worst;
        CHECK(rc == 0 && bad == 0, "graph replay %d: rc %d, %zu elements differ from eager", step,
              rc, bad);
        free(x), free(logits);
    }
    printf("moe graph %-5s/%-5s experts %3d k %d n_tok %3d (%s path): 3 replays, %zu elements "
           "differ from eager launches\n",
           quant_type_name(c->gt), quant_type_name(c->dt), c->n_expert, c->k, c->n_tok,
           path_names_auto[auto_path_of(c)],
           worst);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
    cuda_free(d_x), cuda_free(d_logits), cuda_free(d_ids), cuda_free(d_w), cuda_free(d_out);
    cuda_free(d_scratch);
    free(g_out), free(e_out);
    layer_free(&L);
}

/* Timing (printed, never checked): one 30b-a3b-shaped layer (2048 x 768, 128 experts top-8,
 * Q4_K gate/up, Q6_K down) for decode-sized calls, the lockstep steps of 1 to 64 streams,
 * each path forced: microseconds per call, median of 25, distinct experts per call. */
static void bench_paths(struct rng *r)
{
    static const int toks[] = {1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512};
    enum { NT = 512 };
    struct moe_case c = {QUANT_Q4_K, QUANT_Q6_K, 2048, 768, 128, 8, NT};
    struct layer L;
    layer_make(r, &c, &L);
    float *x = test_rand_normal(r, (size_t)NT * c.n_embd, 1.0f);
    static int32_t ids[NT * 8];
    static float w[NT * 8];
    for (int t = 0; t < NT; t++) /* k distinct experts per token, uniform */
        for (int j = 0; j < 8; j++) {
            int e, dup;
            do {
                e = (int)rng_below(r, 128);
                dup = 0;
                for (int i = 0; i < j; i++)
                    dup |= ids[t * 8 + i] == e;
            } while (dup);
            ids[t * 8 + j] = e;
            w[t * 8 + j] = 0.125f;
        }
    float *d_x = (float *)test_dev_dup(x, sizeof(float) * NT * c.n_embd);
    int32_t *d_ids = (int32_t *)test_dev_dup(ids, sizeof(ids));
    float *d_w = (float *)test_dev_dup(w, sizeof(w));
    float *d_out = (float *)test_dev_alloc(sizeof(float) * NT * c.n_embd);
    struct cuda_moe_args probe = layer_args(&L, d_out, d_x, d_ids, d_w, NULL, 0,
                                            CUDA_MOE_PATH_AUTO, false);
    size_t sb = cuda_moe_scratch_bytes(&probe);
    void *d_scratch = test_dev_alloc(sb);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    printf("  bench: moe 2048x768 Q4_K/Q6_K 128 experts top-8: us per call (median of 25)\n"
           "  bench: moe n_tok distinct    auto   direct  grouped      mma grouped8    bulk8     "
           "mma8\n");
    for (int ti = 0; ti < (int)(sizeof(toks) / sizeof(toks[0])); ti++) {
        int n = toks[ti], distinct = 0;
        bool seen[128] = {false};
        for (int i = 0; i < n * 8; i++)
            distinct += !seen[ids[i]], seen[ids[i]] = true;
        double us[7];
        for (int pi = 0; pi < 7; pi++) {
            c.n_tok = n;
            struct cuda_moe_args a = layer_args(&L, d_out, d_x, d_ids, d_w, d_scratch, sb,
                                                (enum cuda_moe_path)pi, false);
            float t[25];
            int rc = cuda_moe_ffn(&a);
            for (int i = 0; i < 25 && rc == 0; i++) {
                cudaEventRecord(e0, 0);
                rc = cuda_moe_ffn(&a);
                cudaEventRecord(e1, 0);
                cudaEventSynchronize(e1);
                cudaEventElapsedTime(&t[i], e0, e1);
            }
            for (int i = 1; i < 25 && rc == 0; i++) /* insertion sort for the median */
                for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
                    float tmp = t[j];
                    t[j] = t[j - 1];
                    t[j - 1] = tmp;
                }
            us[pi] = rc ? -1 : 1e3 * t[12];
        }
        printf("  bench: moe %5d %8d %7.1f  %7.1f  %7.1f  %7.1f  %7.1f  %7.1f  %7.1f\n", n,
               distinct, us[0], us[1], us[2], us[3], us[4], us[5], us[6]);
    }
    /* as decode runs it: the norm's 8-bit copy of x given (made here on the host, the same
     * format), 16 calls captured in a graph, us per call over the replay (median of 5) */
    int8_t *xq = (int8_t *)test_xmalloc((size_t)64 * c.n_embd);
    float *xd = (float *)test_xmalloc(sizeof(float) * 2 * 64 * (c.n_embd / 32));
    for (int u = 0; u < 64 * c.n_embd / 32; u++) {
        float amax = 0.0f;
        int sum = 0;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[32 * u + i]));
        for (int i = 0; i < 32; i++) {
            int q = amax > 0.0f ? (int)rintf(x[32 * u + i] * (127.0f / amax)) : 0;
            xq[32 * u + i] = (int8_t)q;
            sum += q;
        }
        xd[2 * u] = amax / 127.0f;
        xd[2 * u + 1] = amax / 127.0f * (float)sum;
    }
    int8_t *d_xq = (int8_t *)test_dev_dup(xq, (size_t)64 * c.n_embd);
    float *d_xd = (float *)test_dev_dup(xd, sizeof(float) * 2 * 64 * (c.n_embd / 32));
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    printf("  bench: moe graph of 16 calls, x's 8-bit copy given: us per call (median of 5)\n"
           "  bench: moe n_tok   direct    bulk8\n");
    static const int gtoks[] = {1, 2, 4, 8, 16, 24};
    for (int ti = 0; ti < 6; ti++) {
        double us[2];
        for (int pi = 0; pi < 2; pi++) {
            c.n_tok = gtoks[ti];
            struct cuda_moe_args a =
                layer_args(&L, d_out, d_x, d_ids, d_w, d_scratch, sb,
                           pi ? CUDA_MOE_PATH_BULK8 : CUDA_MOE_PATH_DIRECT, false);
            a.in_q8 = d_xq, a.in_q8_scales = d_xd, a.stream = st;
            cudaGraph_t g;
            cudaGraphExec_t ge;
            int rc = 0;
            if (cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal) != cudaSuccess)
                fatal("bench capture");
            for (int i = 0; i < 16; i++)
                rc |= cuda_moe_ffn(&a);
            if (cudaStreamEndCapture(st, &g) != cudaSuccess ||
                cudaGraphInstantiate(&ge, g, 0) != cudaSuccess)
                fatal("bench graph");
            float t[5];
            cudaGraphLaunch(ge, st);
            for (int i = 0; i < 5; i++) {
                cudaEventRecord(e0, st);
                cudaGraphLaunch(ge, st);
                cudaEventRecord(e1, st);
                cudaEventSynchronize(e1);
                cudaEventElapsedTime(&t[i], e0, e1);
            }
            for (int i = 1; i < 5; i++)
                for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
                    float tmp = t[j];
                    t[j] = t[j - 1];
                    t[j - 1] = tmp;
                }
            us[pi] = rc ? -1 : 1e3 * t[2] / 16;
            cudaGraphExecDestroy(ge);
            cudaGraphDestroy(g);
        }
        printf("  bench: moe %5d  %7.1f  %7.1f\n", gtoks[ti], us[0], us[1]);
    }
    cudaStreamDestroy(st);
    cuda_free(d_xq), cuda_free(d_xd);
    free(xq), free(xd);
    c.n_tok = NT;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cuda_free(d_x), cuda_free(d_ids), cuda_free(d_w), cuda_free(d_out), cuda_free(d_scratch);
    free(x);
    layer_free(&L);
}

int main(void)
{
    if (!test_gpu_available(NAME))
        return TEST_SKIP;
    struct rng r;
    rng_seed(&r, test_seed(NAME), 0);
    static const struct moe_case cases[] = {
        /* qwen3moe Q4_K_M experts: decode and few tokens, 128 experts top-8 */
        {QUANT_Q4_K, QUANT_Q6_K, 512, 768, 128, 8, 1},
        {QUANT_Q4_K, QUANT_Q6_K, 512, 768, 128, 8, 3},
        {QUANT_Q4_K, QUANT_Q6_K, 256, 256, 128, 8, 100},
        {QUANT_Q4_K, QUANT_Q6_K, 512, 256, 64, 8, 300},
        {QUANT_Q5_K, QUANT_Q8_0, 256, 512, 32, 4, 33},
        {QUANT_Q6_K, QUANT_Q5_K, 256, 512, 128, 8, 2},
        {QUANT_Q6_K, QUANT_Q4_K, 256, 512, 32, 4, 3},  /* 8-bit paths, the other types */
        {QUANT_Q4_K, QUANT_Q6_K, 256, 256, 16, 8, 20}, /* grouped 8-bit: experts past one tile */
        {QUANT_Q6_K, QUANT_Q6_K, 512, 256, 128, 8, 32},
        {QUANT_Q4_K, QUANT_Q6_K, 512, 256, 128, 8, 48}, /* grouped 8-bit: a short prompt */
        {QUANT_Q8_0, QUANT_Q8_0, 352, 96, 8, 2, 1},     /* rows not a multiple of 256 */
        {QUANT_Q8_0, QUANT_Q8_0, 352, 96, 8, 2, 40},    /* large tiles */
        {QUANT_MXFP4, QUANT_MXFP4, 352, 160, 32, 4, 5}, /* gpt-oss experts */
        {QUANT_MXFP4, QUANT_MXFP4, 352, 160, 8, 4, 30},
        {QUANT_Q4_0, QUANT_Q4_K, 256, 256, 60, 4, 64},
        {QUANT_F32, QUANT_F32, 200, 72, 8, 2, 16},
        {QUANT_F16, QUANT_BF16, 256, 128, 16, 4, 4},
        {QUANT_BF16, QUANT_F16, 128, 64, 8, 8, 7}, /* k = n_expert */
        /* gpt-oss: biases and the clamped SwiGLU on every path */
        {QUANT_MXFP4, QUANT_MXFP4, 352, 160, 32, 4, 1, true},
        {QUANT_MXFP4, QUANT_MXFP4, 352, 160, 32, 4, 4, true},
        {QUANT_MXFP4, QUANT_MXFP4, 352, 160, 8, 4, 40, true},
        {QUANT_F32, QUANT_F32, 200, 72, 8, 2, 16, true},
        {QUANT_Q4_K, QUANT_Q6_K, 256, 256, 16, 4, 33, true},   /* the grouped 8-bit path */
        {QUANT_MXFP4, QUANT_MXFP4, 2880, 2880, 8, 4, 1, true}, /* gpt-oss's rows (1530 B) */
        {QUANT_MXFP4, QUANT_Q6_K, 352, 256, 16, 4, 2, true},   /* mixed 8-bit types */
        /* tensor cores on 8-bit codes: experts of several tiles, Q6_K gate/up, Q4_K down */
        {QUANT_Q4_K, QUANT_Q6_K, 256, 512, 8, 4, 200},
        {QUANT_Q6_K, QUANT_Q4_K, 512, 256, 32, 8, 90},
        {QUANT_Q4_K, QUANT_Q6_K, 256, 256, 16, 4, 70, true},
        {QUANT_Q4_K, QUANT_Q6_K, 2048, 768, 128, 8, 1}, /* 30b-a3b's layer, one token */
        {QUANT_Q4_K, QUANT_Q4_K, 2048, 768, 128, 8, 1}, /* ... with Q4_K down rows */
    };
    int n = (int)(sizeof(cases) / sizeof(cases[0]));
    for (int i = 0; i < n; i++)
        run_case(&r, &cases[i], i % 3 == 0);
    static const struct moe_case graph_cases[] = {
        {QUANT_Q4_K, QUANT_Q6_K, 256, 256, 64, 8, 1},
        {QUANT_Q4_K, QUANT_Q6_K, 256, 256, 64, 8, 20}, /* grouped 8-bit, a lockstep step */
        {QUANT_Q5_K, QUANT_Q8_0, 256, 256, 64, 8, 20}, /* grouped */
        {QUANT_Q4_K, QUANT_Q6_K, 256, 256, 64, 8, 40}, /* grouped 8-bit */
        /* the tensor-core path, its types' first use (shared memory opt-in inside a capture) */
        {QUANT_Q6_K, QUANT_Q5_K, 256, 256, 64, 8, 40},
        /* the tensor cores on 8-bit codes */
        {QUANT_Q4_K, QUANT_Q6_K, 256, 256, 64, 8, 80},
    };
    for (int i = 0; i < (int)(sizeof(graph_cases) / sizeof(graph_cases[0])); i++)
        run_graph_case(&r, &graph_cases[i]);
    bench_paths(&r);
    return test_finish(NAME);
}
