/* test_vec_dot: the quantized dot kernels and activation quantizers.
 *
 * 1. Activation quantizers: every SIMD level writes the same bytes as the scalar quantizer
 *    (codes, scales, bsums, Q8_0's extras), including exact rounding ties; the scalar one
 *    meets its definition (|x - d q| <= d/2, max |q| = 127, bsums = sums of 16 codes, Q8_0
 *    extras = the scale as a float and -128 * the sum of the codes).
 * 2. Scalar dot kernels against a double-precision sum over weights decoded by quant_ref
 *    (an independent reading of the formats) and activations decoded here.
 * 3. Every SIMD level against the scalar kernel on fresh random rows.
 * Errors are measured against S = sum_i |w_i a_i| (decoded values, double): float
 * accumulation order is the only difference between variants, and that error scales with S,
 * not with the (possibly cancelling) result.
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_features.h"
#include "fp16.h"
#include "quant.h"
#include "quant_ref.h"
#include "testutil.h"
#include "vec_dot.h"

#define SENTINEL 64 /* bytes after each output that must stay untouched */

/* Allowed error relative to S, for scalar vs double and SIMD vs scalar alike: 8 eps sqrt(T),
 * with T the float roundings that accumulate: one per element for float weights, 16 per block
 * (counting at least 4 blocks) for quantized ones: their integer sums are exact, but the SIMD
 * kernels convert up to 16 partial sums per block to float, and with codes fed in unsigned
 * those partial sums can be several times larger than the block's result. The largest errors
 * seen are below half of this; one wrong code in one block exceeds it. */
static double tolerance(uint32_t type, int64_t n)
{
    int64_t blk = vec_dot_block(type);
    int64_t blocks = n / blk < 4 ? 4 : n / blk;
    double terms = blk == 1 ? (double)n : 16.0 * (double)blocks;
    return 8.0 * 0x1p-24 * sqrt(terms);
}

static const uint32_t weight_types[] = {QUANT_F32,  QUANT_F16,   QUANT_BF16, QUANT_Q8_0,
                                        QUANT_Q4_0, QUANT_MXFP4, QUANT_Q2_K, QUANT_Q3_K,
                                        QUANT_Q4_K, QUANT_Q5_K,  QUANT_Q6_K};

static uint16_t random_scale(struct rng *r, float lo, float hi)
{
    return fp16_from_f32(rng_uniform(r, lo, hi));
}

static void random_bytes(struct rng *r, void *dst, size_t n)
{
    uint8_t *p = dst;
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)rng_u32(r);
}

/* n elements of valid random weights of the given type: random code bytes, finite scales of
 * sensible magnitude. */
static void fill_weights(uint32_t type, void *dst, int64_t n, struct rng *r)
{
    int64_t nb = n / vec_dot_block(type);
    switch (type) {
    case QUANT_F32:
        for (int64_t i = 0; i < n; i++)
            ((float *)dst)[i] = rng_normal(r);
        break;
    case QUANT_F16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = fp16_from_f32(rng_normal(r));
        break;
    case QUANT_BF16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = bf16_from_f32(rng_normal(r));
        break;
    case QUANT_Q8_0:
        for (int64_t b = 0; b < nb; b++) {
            struct block_q8_0 *blk = (struct block_q8_0 *)dst + b;
            random_bytes(r, blk->qs, sizeof(blk->qs));
            blk->d = random_scale(r, 1e-3f, 1e-2f);
        }
        break;
    case QUANT_Q4_0:
        for (int64_t b = 0; b < nb; b++) {
            struct block_q4_0 *blk = (struct block_q4_0 *)dst + b;
            random_bytes(r, blk->qs, sizeof(blk->qs));
            blk->d = random_scale(r, 1e-3f, 1e-2f);
        }
        break;
    case QUANT_MXFP4:
        for (int64_t b = 0; b < nb; b++) {
            struct block_mxfp4 *blk = (struct block_mxfp4 *)dst + b;
            random_bytes(r, blk->qs, sizeof(blk->qs));
            blk->e = (uint8_t)(115 + rng_below(r, 16));
        }
        break;
    case QUANT_Q2_K:
        for (int64_t b = 0; b < nb; b++) {
            struct block_q2_k *blk = (struct block_q2_k *)dst + b;
            random_bytes(r, blk, sizeof(*blk));
            blk->d = random_scale(r, 1e-3f, 1e-2f);
            blk->dmin = random_scale(r, 1e-3f, 1e-2f);
        }
        break;
    case QUANT_Q3_K:
        for (int64_t b = 0; b < nb; b++) {
            struct block_q3_k *blk = (struct block_q3_k *)dst + b;
            random_bytes(r, blk, sizeof(*blk));
            blk->d = random_scale(r, 1e-3f, 1e-2f);
        }
        break;
    case QUANT_Q4_K:
        for (int64_t b = 0; b < nb; b++) {
            struct block_q4_k *blk = (struct block_q4_k *)dst + b;
            random_bytes(r, blk, sizeof(*blk));
            blk->d = random_scale(r, 1e-3f, 1e-2f);
            blk->dmin = random_scale(r, 1e-3f, 1e-2f);
        }
        break;
    case QUANT_Q5_K:
        for (int64_t b = 0; b < nb; b++) {
            struct block_q5_k *blk = (struct block_q5_k *)dst + b;
            random_bytes(r, blk, sizeof(*blk));
            blk->d = random_scale(r, 1e-3f, 1e-2f);
            blk->dmin = random_scale(r, 1e-3f, 1e-2f);
        }
        break;
    case QUANT_Q6_K:
        for (int64_t b = 0; b < nb; b++) {
            struct block_q6_k *blk = (struct block_q6_k *)dst + b;
            random_bytes(r, blk, sizeof(*blk));
            blk->d = random_scale(r, 1e-3f, 1e-2f);
        }
        break;
    default:
        abort();
    }
}

/* Activations: normal values with a random scale per 32, an all-zero stretch and an outlier,
 * so zero blocks, tiny blocks and saturating blocks all occur. */
static void fill_acts(float *x, int64_t n, struct rng *r)
{
    for (int64_t i = 0; i < n; i += 32) {
        float scale = powf(10.0f, rng_uniform(r, -3.0f, 2.0f));
        for (int64_t j = i; j < i + 32 && j < n; j++)
            x[j] = scale * rng_normal(r);
    }
    if (n >= 64)
        memset(x + 32, 0, 32 * sizeof(float));
    x[rng_below(r, (uint32_t)n)] *= 100.0f;
}

/* Element i of an activation row in format act_type, decoded. */
static double act_value(enum quant_type act_type, const void *act, int64_t i)
{
    if (act_type == QUANT_Q8_0) {
        const struct block_q8_0 *b = (const struct block_q8_0 *)act + i / QK_32;
        return (double)fp16_to_f32(b->d) * b->qs[i % QK_32];
    }
    if (act_type == QUANT_Q8_K) {
        const struct block_q8_k *b = (const struct block_q8_k *)act + i / QK_K;
        return (double)b->d * b->qs[i % QK_K];
    }
    return ((const float *)act)[i];
}

/* ---- 1. activation quantizers ---- */

static void check_quantizer_definition(enum quant_type at, const float *x, const void *act,
                                       int64_t n)
{
    int64_t qk = at == QUANT_Q8_0 ? QK_32 : QK_K;
    for (int64_t b = 0; b < n / qk; b++) {
        const int8_t *qs;
        float d, amax = 0.0f;
        if (at == QUANT_Q8_0) {
            const struct block_q8_0 *blk = (const struct block_q8_0 *)act + b;
            const struct vec_dot_q8_0_extra *e = vec_dot_q8_0_extras((void *)act, n) + b;
            qs = blk->qs;
            d = fp16_to_f32(blk->d);
            int s = 0;
            for (int j = 0; j < QK_32; j++)
                s += qs[j];
            CHECK(e->d == d && e->off == -128 * s,
                  "Q8_0 block %lld extras: d %g off %d, want %g and %d", (long long)b, e->d, e->off,
                  d, -128 * s);
        } else {
            const struct block_q8_k *blk = (const struct block_q8_k *)act + b;
            qs = blk->qs;
            d = blk->d;
            for (int g = 0; g < QK_K / 16; g++) {
                int s = 0;
                for (int j = 0; j < 16; j++)
                    s += qs[16 * g + j];
                CHECK(blk->bsums[g] == s, "Q8_K block %lld bsums[%d] = %d, codes sum to %d",
                      (long long)b, g, blk->bsums[g], s);
            }
        }
        int qmax = 0;
        for (int j = 0; j < qk; j++) {
            amax = fmaxf(amax, fabsf(x[b * qk + j]));
            qmax = abs(qs[j]) > qmax ? abs(qs[j]) : qmax;
        }
        CHECK(amax == 0.0f ? qmax == 0 : qmax == 127, "%s block %lld: max |code| %d, max |x| %g",
              quant_type_name(at), (long long)b, qmax, amax);
        /* the codes are x * (1 / d32) rounded, d32 = max|x| / 127 in f32: half a step, plus a
         * few ulp of |q| where the rounded 1 / d32 tips a near-tie; Q8_0 stores d32 rounded to
         * f16 (d), which moves each decoded value by |q| * |d - d32| (a lot when d32 is an f16
         * subnormal) */
        double d32 = amax / 127.0f;
        for (int j = 0; j < qk; j++) {
            double err = fabs((double)x[b * qk + j] - (double)d * qs[j]);
            double allowed = 0.5 * d32 + abs(qs[j]) * (fabs(d - d32) + 0x1p-21 * d32) + 1e-30;
            if (err > allowed) {
                CHECK(false, "%s block %lld elem %d: x %g, d %g, code %d", quant_type_name(at),
                      (long long)b, j, x[b * qk + j], d, qs[j]);
                return;
            }
        }
    }
}

static void test_quantizers(struct rng *r)
{
    static const int64_t sizes[] = {256, 768, 2048, 4096};
    const uint32_t wtypes[] = {QUANT_Q8_0, QUANT_Q4_K}; /* -> Q8_0 and Q8_K activations */

    for (size_t t = 0; t < 2; t++) {
        uint32_t wt = wtypes[t];
        enum quant_type at = vec_dot_act_type(wt);
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
            int64_t n = sizes[s];
            size_t bytes = vec_dot_act_bytes(wt, n);
            float *x = malloc((size_t)n * sizeof(float));
            uint8_t *ref = malloc(bytes + SENTINEL), *got = malloc(bytes + SENTINEL);
            fill_acts(x, n, r);
            /* the first 32 values are exact rounding ties: amax 127 makes d = 1 */
            for (int j = 0; j < 32; j++)
                x[j] = (float)(j % 2 ? -1 : 1) * ((float)(j % 7) * 17.0f + 0.5f);
            x[0] = 127.0f;
            if (at == QUANT_Q8_K)
                for (int j = 32; j < QK_K; j++)
                    x[j] = 0.25f * (float)(j % 5) - 0.5f;

            test_poison_bytes(ref, bytes + SENTINEL);
            vec_dot_quantize_get(wt, CPU_ISA_SCALAR)(x, ref, n);
            check_quantizer_definition(at, x, ref, n);
            for (int i = 0; i < SENTINEL; i++)
                CHECK(ref[bytes + i] == 0xA5, "scalar %s quantizer wrote past its output",
                      quant_type_name(at));
            for (int isa = CPU_ISA_AVX2; isa <= (int)cpu_isa_best(); isa++) {
                test_poison_bytes(got, bytes + SENTINEL);
                vec_dot_quantize_get(wt, (enum cpu_isa)isa)(x, got, n);
                CHECK(memcmp(got, ref, bytes) == 0,
                      "%s quantizer at %s differs from scalar, n %lld", quant_type_name(at),
                      cpu_isa_name((enum cpu_isa)isa), (long long)n);
                for (int i = 0; i < SENTINEL; i++)
                    CHECK(got[bytes + i] == 0xA5, "%s %s quantizer wrote past its output",
                          cpu_isa_name((enum cpu_isa)isa), quant_type_name(at));
            }
            free(x);
            free(ref);
            free(got);
        }
    }
}

/* ---- 2 and 3. dot kernels ---- */

struct err_stats {
    double ref;                 /* max |scalar - double ref| / (S tolerance) */
    double simd[CPU_ISA_COUNT]; /* max |isa - scalar| / (S tolerance) */
};

static void test_dot_type(uint32_t type, int64_t n, int rows, struct rng *r, struct err_stats *st)
{
    enum quant_type at = vec_dot_act_type(type);
    size_t wbytes = vec_dot_row_bytes(type, n), abytes = vec_dot_act_bytes(type, n);
    uint8_t *w = malloc(wbytes);
    float *x = malloc((size_t)n * sizeof(float)), *wf = malloc((size_t)n * sizeof(float));
    void *act = malloc(abytes);

    for (int row = 0; row < rows; row++) {
        fill_weights(type, w, n, r);
        fill_acts(x, n, r);
        vec_dot_quantize_act(type, x, act, n);
        CHECK(quant_ref_dequantize(type, w, wf, n) == 0, "quant_ref cannot decode %s",
              quant_type_name(type));

        double ref = 0, s = 0;
        for (int64_t i = 0; i < n; i++) {
            double p = (double)wf[i] * act_value(at, act, i);
            ref += p;
            s += fabs(p);
        }
        if (s == 0)
            s = 1e-30;
        double tol = tolerance(type, n);
        float scalar = vec_dot_get(type, CPU_ISA_SCALAR)(n, w, act);
        double e = fabs(scalar - ref) / s;
        st->ref = fmax(st->ref, e / tol);
        CHECK(e <= tol,
              "%s n %lld row %d: scalar %.9g, double reference %.9g (err %.3g S > %.3g S)",
              quant_type_name(type), (long long)n, row, scalar, ref, e, tol);

        for (int isa = CPU_ISA_AVX2; isa <= (int)cpu_isa_best(); isa++) {
            float v = vec_dot_get(type, (enum cpu_isa)isa)(n, w, act);
            double es = fabs((double)v - scalar) / s;
            if (isnan(v))
                es = INFINITY;
            st->simd[isa] = fmax(st->simd[isa], es / tol);
            CHECK(es <= tol, "%s n %lld row %d: %s %.9g, scalar %.9g (err %.3g S > %.3g S)",
                  quant_type_name(type), (long long)n, row, cpu_isa_name((enum cpu_isa)isa), v,
                  scalar, es, tol);
        }
    }
    free(w);
    free(x);
    free(wf);
    free(act);
}

static void test_dots(struct rng *r)
{
    static const int64_t sizes_k[] = {256, 768, 2048, 4096};
    static const int64_t sizes_32[] = {32, 32 * 37, 2880, 4096};
    static const int64_t sizes_f[] = {1, 37, 1000, 2880, 4096 + 13};

    for (size_t t = 0; t < sizeof(weight_types) / sizeof(weight_types[0]); t++) {
        uint32_t type = weight_types[t];
        int64_t blk = vec_dot_block(type);
        const int64_t *sizes = blk == QK_K ? sizes_k : blk == QK_32 ? sizes_32 : sizes_f;
        size_t count = blk == 1 ? 5 : 4;
        struct err_stats st = {0};
        for (size_t s = 0; s < count; s++)
            test_dot_type(type, sizes[s], 8, r, &st);
        printf("  %-6s (tolerance at n=%lld: %.1e S) worst error / tolerance: scalar vs double "
               "%.3f",
               quant_type_name(type), (long long)sizes[count - 1],
               tolerance(type, sizes[count - 1]), st.ref);
        for (int isa = CPU_ISA_AVX2; isa <= (int)cpu_isa_best(); isa++)
            printf(", %s vs scalar %.3f", cpu_isa_name((enum cpu_isa)isa), st.simd[isa]);
        printf("\n");
    }
}

/* The multi-row kernels against the single dot of the same ISA level, bit for bit, on
 * VEC_DOT_ROWS fresh activation rows spaced wider than a row (the stride is honoured). */
static void test_rows(struct rng *r)
{
    static const int64_t sizes_k[] = {256, 768, 2048};
    static const int64_t sizes_32[] = {32, 64, 32 * 37, 2880};
    int tested = 0;
    for (size_t t = 0; t < sizeof(weight_types) / sizeof(weight_types[0]); t++) {
        uint32_t type = weight_types[t];
        int64_t blk = vec_dot_block(type);
        const int64_t *sizes = blk == QK_K ? sizes_k : sizes_32;
        size_t count = blk == QK_K ? 3 : 4;
        for (int isa = 0; isa <= (int)cpu_isa_best(); isa++) {
            vec_dot_rows_fn rows = vec_dot_rows_get(type, (enum cpu_isa)isa);
            vec_dot_fn dot = vec_dot_get(type, (enum cpu_isa)isa);
            if (!rows)
                continue;
            CHECK(blk == QK_K || blk == QK_32, "%s: a multi-row kernel for block %lld",
                  quant_type_name(type), (long long)blk);
            tested++;
            for (size_t k = 0; k < count; k++) {
                int64_t n = sizes[k];
                size_t abytes = vec_dot_act_bytes(type, n), stride = abytes + 64 + 4 * k;
                uint8_t *w = malloc(vec_dot_row_bytes(type, n));
                uint8_t *act = malloc(stride * VEC_DOT_ROWS);
                float *x = malloc((size_t)n * sizeof(float)), out[VEC_DOT_ROWS];
                fill_weights(type, w, n, r);
                for (int j = 0; j < VEC_DOT_ROWS; j++) {
                    fill_acts(x, n, r);
                    vec_dot_quantize_act(type, x, act + j * stride, n);
                }
                rows(n, w, act, stride, out);
                for (int j = 0; j < VEC_DOT_ROWS; j++) {
                    float one = dot(n, w, act + j * stride);
                    CHECK(memcmp(&one, &out[j], sizeof(float)) == 0,
                          "%s %s n %lld row %d: %d rows give %.9g, one dot %.9g",
                          quant_type_name(type), cpu_isa_name((enum cpu_isa)isa), (long long)n, j,
                          VEC_DOT_ROWS, out[j], one);
                }
                free(w);
                free(act);
                free(x);
            }
        }
    }
    printf("  multi-row kernels: %d (type, ISA) pairs, each equal to its single dot bit for bit\n",
           tested);
    const int best = (int)cpu_isa_best();
    const int want =
        4 * (best >= CPU_ISA_AVX2) + 8 * (best >= CPU_ISA_AVX512 ? best - CPU_ISA_AVX512 + 1 : 0);
    CHECK(tested == want,
          "AVX2 has multi-row Q8_0, Q4_K, Q5_K and Q6_K kernels, each AVX-512 level MXFP4, Q4_0, "
          "Q2_K and Q3_K as well (found %d of %d)",
          tested, want);
}

/* ---- dispatch and sizes ---- */

static void test_dispatch(void)
{
    for (size_t t = 0; t < sizeof(weight_types) / sizeof(weight_types[0]); t++) {
        uint32_t type = weight_types[t];
        uint64_t bytes = 0;
        int64_t n = 4 * QK_K;
        CHECK(vec_dot_supported(type), "%s unsupported", quant_type_name(type));
        CHECK(quant_row_bytes(type, (uint64_t)n, &bytes) == 0 &&
                  bytes == vec_dot_row_bytes(type, n),
              "%s row bytes %zu, type table says %llu", quant_type_name(type),
              vec_dot_row_bytes(type, n), (unsigned long long)bytes);
        CHECK(vec_dot_get(type, CPU_ISA_COUNT) == vec_dot_get(type, cpu_isa_best()),
              "%s: an ISA above the best must fall back to the best", quant_type_name(type));
        for (int isa = 0; isa < CPU_ISA_COUNT; isa++)
            CHECK(vec_dot_get(type, (enum cpu_isa)isa) != NULL &&
                      vec_dot_quantize_get(type, (enum cpu_isa)isa) != NULL,
                  "%s has no kernel at %s", quant_type_name(type), cpu_isa_name((enum cpu_isa)isa));
    }
    CHECK(!vec_dot_supported(QUANT_Q4_1) && vec_dot_get(QUANT_Q4_1, CPU_ISA_SCALAR) == NULL &&
              vec_dot_act_bytes(QUANT_IQ4_XS, 256) == 0 &&
              vec_dot_act_type(999) == QUANT_TYPE_COUNT,
          "unsupported types must be refused");
    CHECK(vec_dot_act_bytes(QUANT_Q4_K, 512) == 2 * sizeof(struct block_q8_k) &&
              vec_dot_act_bytes(QUANT_MXFP4, 64) == /* 2 blocks, padded */ 72 + 2 * 8 &&
              vec_dot_act_bytes(QUANT_BF16, 10) == 40,
          "activation sizes");
}

int main(void)
{
    struct rng r;
    rng_seed(&r, test_seed("test_vec_dot"), 0);
    printf("test_vec_dot: best ISA %s; dot errors relative to S = sum |w_i a_i|, tolerance "
           "8 eps sqrt(T)\n",
           cpu_isa_name(cpu_isa_best()));
    test_dispatch();
    test_quantizers(&r);
    test_dots(&r);
    test_rows(&r);
    return test_finish("test_vec_dot");
}
