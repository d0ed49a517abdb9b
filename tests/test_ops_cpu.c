/* ops_cpu: RMSNorm, NEOX RoPE (plain and YaRN) and causal GQA attention (also with gpt-oss's
 * sinks and sliding window) against double-precision references written the naive way (full
 * softmax, explicit rotation), on fresh random data with poisoned outputs. Tolerance: 1e-5 relative
 * (float32 arithmetic, different summation order); attention adds 2 * 2^-24 times the largest
 * score's sum of |terms| (float scores of sharp queries). Attention must also give the same bytes
 * with 1, 2 and 3 threads. */
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "ops_cpu.h"
#include "testutil.h"

#define TOL 1e-5

static float *rand_vec(struct rng *r, size_t n)
{
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        v[i] = rng_normal(r);
    return v;
}

static void check_rmsnorm(struct rng *r)
{
    int rows = 1 + rng_below(r, 9), dim = 16 * (1 + rng_below(r, 64));
    float *x = rand_vec(r, (size_t)rows * dim), *w = rand_vec(r, dim);
    float *y = malloc(sizeof(float) * rows * dim), *ref = malloc(sizeof(float) * rows * dim);

    test_poison_f32(y, (size_t)rows * dim);
    ops_rmsnorm(y, x, w, rows, dim, 1e-6f);
    for (int i = 0; i < rows; i++) {
        double ss = 0;
        for (int j = 0; j < dim; j++)
            ss += (double)x[i * dim + j] * x[i * dim + j];
        double inv = 1.0 / sqrt(ss / dim + 1e-6);
        for (int j = 0; j < dim; j++)
            ref[i * dim + j] = (float)(x[i * dim + j] * inv * w[j]);
    }
    double e = test_max_rel_err(y, ref, (size_t)rows * dim);
    CHECK(e < TOL, "rmsnorm rows %d dim %d: rel err %g", rows, dim, e);
    /* in place gives the same */
    ops_rmsnorm(x, x, w, rows, dim, 1e-6f);
    CHECK(memcmp(x, y, sizeof(float) * rows * dim) == 0, "rmsnorm in place differs");
    free(x), free(w), free(y), free(ref);
}

static void check_rope(struct rng *r)
{
    int n_tok = 1 + rng_below(r, 6), heads = 1 + rng_below(r, 4), hd = 2 * (4 + rng_below(r, 60));
    int pos0 = rng_below(r, 5000);
    size_t n = (size_t)n_tok * heads * hd;
    float *x = rand_vec(r, n), *ref = malloc(n * sizeof(float));
    double base = 1e6;

    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < hd / 2; i++) {
                const float *v = x + ((size_t)t * heads + h) * hd;
                double th = (pos0 + t) / pow(base, 2.0 * i / hd);
                ref[((size_t)t * heads + h) * hd + i] =
                    (float)(v[i] * cos(th) - v[i + hd / 2] * sin(th));
                ref[((size_t)t * heads + h) * hd + i + hd / 2] =
                    (float)(v[i] * sin(th) + v[i + hd / 2] * cos(th));
            }
    ops_rope_neox(x, n_tok, heads, hd, pos0, (float)base);
    double e = test_max_rel_err(x, ref, n);
    CHECK(e < TOL, "rope tok %d heads %d hd %d pos %d: rel err %g", n_tok, heads, hd, pos0, e);
    free(x), free(ref);
}

/* YaRN at gpt-oss's settings (head dim 64, base 150000, factor 32 over 4096 positions, betas 32
 * and 1, no rounding): the correction range is dims 8.09 .. 17.40 of 64, so pairs 0..8 keep
 * base^(-2i/64), pairs 18..31 are divided by 32, pairs between mix the two linearly; the
 * attention factor is 0.1 ln 32 + 1. Then a rotation with those angles and the factor against
 * the explicit one. */
static void check_yarn(struct rng *r)
{
    double freq[32];
    float ms;
    const double lo = 64 * log(4096 / (32 * 2 * M_PI)) / (2 * log(150000.0));
    const double hi = 64 * log(4096 / (2 * M_PI)) / (2 * log(150000.0));
    ops_rope_yarn_freq(64, 150000.0f, 32.0f, 4096, 32.0f, 1.0f, 0, freq, &ms);
    CHECK(fabs(ms - (0.1 * log(32.0) + 1)) < 1e-6, "yarn attention factor %g", ms);
    for (int i = 0; i < 32; i++) {
        double plain = pow(150000.0, -2.0 * i / 64), ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1);
        double want = plain / 32 * ramp + plain * (1 - ramp);
        CHECK(fabs(freq[i] - want) <= 1e-6 * want, "yarn pair %d: %g, want %g (ramp %g)", i,
              freq[i], want, ramp);
    }
    const int n_tok = 3, heads = 2, hd = 64, pos0 = 5000;
    float *x = rand_vec(r, n_tok * heads * hd), *ref = malloc(sizeof(float) * n_tok * heads * hd);
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < hd / 2; i++) {
                const float *v = x + (t * heads + h) * hd;
                double th = (pos0 + t) * freq[i];
                ref[(t * heads + h) * hd + i] =
                    (float)(ms * (v[i] * cos(th) - v[i + 32] * sin(th)));
                ref[(t * heads + h) * hd + i + 32] =
                    (float)(ms * (v[i] * sin(th) + v[i + 32] * cos(th)));
            }
    ops_rope_neox_freq(x, n_tok, heads, hd, pos0, freq, ms);
    double e = test_max_rel_err(x, ref, (size_t)n_tok * heads * hd);
    CHECK(e < TOL, "yarn rope: rel err %g", e);
    free(x), free(ref);
}

static void attention_case(struct rng *r, int kvh, int group, int hd, int pos0, int n_tok,
                           bool sharp, int window, bool sinks)
{
    int nh = kvh * group, ctx = pos0 + n_tok, kvw = kvh * hd;
    float *q = rand_vec(r, (size_t)n_tok * nh * hd), *k = rand_vec(r, (size_t)ctx * kvw);
    float *v = rand_vec(r, (size_t)ctx * kvw);
    float *out = malloc(sizeof(float) * n_tok * nh * hd),
          *ref = malloc(sizeof(float) * n_tok * nh * hd);
    double *p = malloc(sizeof(double) * ctx), smax = 0;
    float scale = (sharp ? 50.0f : 1.0f) / sqrtf((float)hd);
    float *sink = sinks ? rand_vec(r, (size_t)nh) : NULL;

    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < nh; h++) {
            int g = h / group, last = pos0 + t;
            int j0 = window > 0 && last + 1 > window ? last + 1 - window : 0;
            double mx = sink ? sink[h] : -1e300, sum = 0;
            for (int j = j0; j <= last; j++) {
                double s = 0, sabs = 0;
                for (int i = 0; i < hd; i++) {
                    double qk =
                        (double)q[((size_t)t * nh + h) * hd + i] * k[(size_t)j * kvw + g * hd + i];
                    s += qk;
                    sabs += fabs(qk);
                }
                smax = fmax(smax, sabs * scale);
                p[j] = s * scale;
                mx = p[j] > mx ? p[j] : mx;
            }
            for (int j = j0; j <= last; j++)
                sum += (p[j] = exp(p[j] - mx));
            if (sink)
                sum += exp(sink[h] - mx);
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int j = j0; j <= last; j++)
                    o += p[j] / sum * v[(size_t)j * kvw + g * hd + i];
                ref[((size_t)t * nh + h) * hd + i] = (float)o;
            }
        }
    test_poison_f32(out, (size_t)n_tok * nh * hd);
    struct ops_attn a = {.out = out,
                         .q = q,
                         .k_cache = k,
                         .v_cache = v,
                         .pos0 = pos0,
                         .n_tok = n_tok,
                         .n_head = nh,
                         .n_head_kv = kvh,
                         .head_dim = hd,
                         .scale = scale,
                         .sinks = sink,
                         .window = window};
    ops_attention(&a);
    /* A float score is off the double one by up to a few ulp of its terms' magnitude, and a
     * softmax weight moves by that absolute amount in relative terms: with sharp queries
     * (terms up to ~600) that alone reaches 1e-5. Over 600 seeds (19200 cases) the error stayed
     * within 0.5 * smax * 2^-24 for sharp cases and under 1.9e-6 for the others. */
    double tol = TOL + 2.0 * smax * 0x1p-24,
           e = test_max_rel_err(out, ref, (size_t)n_tok * nh * hd);
    CHECK(e < tol,
          "attention heads %d/%d hd %d pos0 %d tok %d%s window %d%s: rel err %g "
          "(tolerance %g)",
          nh, kvh, hd, pos0, n_tok, sharp ? " sharp" : "", window, sinks ? " sinks" : "", e, tol);
    /* one thread (whole heads per unit), three (one head per unit where units are few) and
     * sixteen (split decode: fewer heads per unit): the same bytes as the default */
    float *again = malloc(sizeof(float) * n_tok * nh * hd);
    int threads = omp_get_max_threads();
    static const int counts[] = {1, 3, 16};
    for (int c = 0; c < 3; c++) {
        int nt = counts[c];
        omp_set_num_threads(nt);
        a.out = again;
        test_poison_f32(again, (size_t)n_tok * nh * hd);
        ops_attention(&a);
        CHECK(memcmp(again, out, sizeof(float) * n_tok * nh * hd) == 0,
              "attention heads %d/%d hd %d pos0 %d tok %d: %d threads change the result", nh, kvh,
              hd, pos0, n_tok, nt);
    }
    omp_set_num_threads(threads);
    free(again);
    free(q), free(k), free(v), free(out), free(ref), free(p), free(sink);
}

/* Groups past ATTN_MAX_HEADS (16) are split; contexts past ATTN_KEYS (32) take several key
 * blocks, and with few tokens and KV heads (decode) past ATTN_CHUNK (256) several chunks whose
 * parts are combined; sharp queries put scores hundreds apart (weights that underflow). */
static void check_attention(struct rng *r)
{
    bool wide = rng_below(r, 4) == 0, sharp = rng_below(r, 4) == 0;
    int kvh = 1 + rng_below(r, 3), group = wide ? 1 + rng_below(r, 20) : 1 + rng_below(r, 4);
    int hd = 8 * (1 + rng_below(r, 16));
    int pos0 = wide ? rng_below(r, 700) : rng_below(r, 40), n_tok = 1 + rng_below(r, 8);
    /* a quarter with gpt-oss's sliding window (which may leave whole chunks empty) and sinks */
    bool oss = rng_below(r, 4) == 0;
    int window = oss ? 1 + rng_below(r, 300) : 0;
    attention_case(r, kvh, group, hd, pos0, n_tok, sharp, window, oss);
}

int main(void)
{
    struct rng r;
    rng_seed(&r, test_seed("test_ops_cpu"), 2);
    for (int i = 0; i < 30; i++) {
        check_rmsnorm(&r);
        check_rope(&r);
        check_attention(&r);
    }
    /* chunks of 256 keys: token 0 sees keys 0..254 only, so its second chunk is empty */
    check_yarn(&r);
    attention_case(&r, 1, 4, 64, 254, 5, false, 0, false);
    attention_case(&r, 2, 8, 128, 1000, 1, true, 0, false);
    /* heads in eights and sixteens a KV head (30b-a3b, 235b-a22b): the key-by-key scores of
     * attn_unit8, a short last block, three tokens */
    attention_case(&r, 4, 16, 128, 700, 1, false, 0, false);
    attention_case(&r, 4, 8, 128, 333, 3, true, 0, false);
    /* prompts: tokens in groups that share each key block (attn_tokens; 1 thread groups 8,
     * 16 threads none), a group past the end, and a window, which takes one token a unit */
    attention_case(&r, 2, 8, 64, 40, 70, false, 0, false);
    attention_case(&r, 1, 3, 32, 0, 45, false, 0, true);
    attention_case(&r, 2, 8, 64, 100, 40, false, 50, true);
    /* gpt-oss's shape: 64/8 heads x 64, a window of 128 at position 1000 (decode: the first
     * three chunks hold no visible key), and its full layers with sinks */
    attention_case(&r, 8, 8, 64, 1000, 1, false, 128, true);
    attention_case(&r, 8, 8, 64, 1000, 1, false, 0, true);
    attention_case(&r, 8, 8, 64, 100, 7, false, 128, true);
    return test_finish("test_ops_cpu");
}
