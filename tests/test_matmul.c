/* test_matmul: the OpenMP small-batch matmul, its gemm kernels and the SwiGLU expert FFN built
 * on it.
 *
 * gemm (where the host has a kernel, at every ISA level up to the host's): every output equals,
 * bit for bit, the vec_dot of the same level on its row and activation row, and lies within
 * TOL_GEMM * sum |w a| of the scalar vec_dot (the integer sums are exact), over tiles cut
 * short, activation rows past a register tile and past a pass (MAX_M), and a Q8_0 row that
 * ends in an odd block. The AMX kernels are held to the same, on the host's tiles where it has
 * them and with the tiles done in C (gemm_amx_emu.c) on any host with AVX-512 VNNI.
 * matmul: every output equals, bit for bit, the single-threaded best vec_dot of its weight row
 * with its activation row converted by the scalar quantizer, whatever the batch size; it
 * agrees with a double sum over weights decoded by quant_ref and the unconverted float
 * activations within the error of 8-bit activations; padding between output rows stays
 * poisoned; 1 and 2 threads give identical bytes; bad arguments are refused.
 * Batch invariance: for every weight type and several row lengths, each of BATCH_ROWS
 * activation rows through matmul alone (m = 1) gives the same bytes as in every batch of 2 ..
 * BATCH_ROWS rows (speculative decoding's verify pass depends on it, docs/speculative.md).
 * matmul uses the process's ISA level: ctest runs this program again under each lower
 * STRATA_CPU_ISA cap.
 * expert_ffn: against a double-precision reference (decoded weights, float activations, exact
 * silu), tokens listed out of order with a duplicate and crossing a batch boundary; 1 and 2
 * threads identical.
 */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "expert_ffn.h"
#include "fp16.h"
#include "gemm.h"
#include "matmul.h"
#include "quant.h"
#include "quant_ref.h"
#include "testutil.h"
#include "vec_dot.h"

/* float accumulation error allowed, relative to sum_i |w_i x_i| */
#define TOL_FLOAT 1e-5
/* gemm against the scalar dot with the same 8-bit activations, relative to sum_i |w_i a_i|:
 * only the order of float accumulation differs */
#define TOL_GEMM 1e-6
/* expert FFN: norm-relative error allowed against the float reference, with 8-bit activations
 * (two conversions: x and h) and with float activations (F32/F16/BF16 weights) */
#define TOL_FFN_Q8 3e-2
#define TOL_FFN_F 1e-5

static const uint32_t types[] = {QUANT_F32,  QUANT_F16,   QUANT_BF16, QUANT_Q8_0,
                                 QUANT_Q4_0, QUANT_MXFP4, QUANT_Q2_K, QUANT_Q3_K,
                                 QUANT_Q4_K, QUANT_Q5_K,  QUANT_Q6_K};

/* Offsets of the f16 scale fields of a block (-1: none), to overwrite random bytes with sane
 * scales; MXFP4's exponent byte is handled apart. */
static void scale_offsets(uint32_t type, int *d, int *dmin)
{
    *d = -1, *dmin = -1;
    switch (type) {
    case QUANT_Q8_0:
    case QUANT_Q4_0:
        *d = 0;
        break;
    case QUANT_Q2_K:
        *d = 80, *dmin = 82;
        break;
    case QUANT_Q3_K:
        *d = 108;
        break;
    case QUANT_Q4_K:
    case QUANT_Q5_K:
        *d = 0, *dmin = 2;
        break;
    case QUANT_Q6_K:
        *d = 208;
        break;
    default:
        break;
    }
}

/* rows x n elements of valid random weights at row stride `stride` bytes; the padding after
 * each row is 0xFF (NaN as f16/bf16/f32), so a kernel that reads it produces NaN. */
static void fill_weights(uint32_t type, uint8_t *w, int64_t rows, int64_t n, size_t stride,
                         struct rng *r)
{
    size_t row_bytes = vec_dot_row_bytes(type, n);
    int64_t blk = vec_dot_block(type);
    size_t bsize = row_bytes / (size_t)(n / blk);
    int d_off, dmin_off;
    scale_offsets(type, &d_off, &dmin_off);
    memset(w, 0xFF, (size_t)rows * stride);
    for (int64_t row = 0; row < rows; row++) {
        uint8_t *p = w + row * stride;
        if (blk == 1) {
            for (int64_t i = 0; i < n; i++) {
                float v = rng_normal(r) * 0.05f;
                uint16_t h = type == QUANT_F16 ? fp16_from_f32(v) : bf16_from_f32(v);
                if (type == QUANT_F32)
                    memcpy(p + 4 * i, &v, 4);
                else
                    memcpy(p + 2 * i, &h, 2);
            }
            continue;
        }
        for (size_t i = 0; i < row_bytes; i++)
            p[i] = (uint8_t)rng_u32(r);
        for (int64_t b = 0; b < n / blk; b++) {
            uint8_t *bp = p + b * bsize;
            uint16_t d = fp16_from_f32(rng_uniform(r, 1e-3f, 1e-2f));
            uint16_t dm = fp16_from_f32(rng_uniform(r, 1e-3f, 1e-2f));
            if (type == QUANT_MXFP4)
                bp[0] = (uint8_t)(115 + rng_below(r, 16));
            if (d_off >= 0)
                memcpy(bp + d_off, &d, 2);
            if (dmin_off >= 0)
                memcpy(bp + dmin_off, &dm, 2);
        }
    }
}

static void fill_normal(float *x, size_t n, float scale, struct rng *r)
{
    for (size_t i = 0; i < n; i++)
        x[i] = scale * rng_normal(r);
}

/* Decodes rows x n weights (at byte stride) into floats. */
static float *decode(uint32_t type, const uint8_t *w, int64_t rows, int64_t n, size_t stride)
{
    float *f = malloc((size_t)(rows * n) * sizeof(float));
    for (int64_t row = 0; row < rows; row++)
        CHECK(quant_ref_dequantize(type, w + row * stride, f + row * n, n) == 0,
              "quant_ref cannot decode %s", quant_type_name(type));
    return f;
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

static bool is_f32_act(uint32_t type)
{
    return vec_dot_act_type(type) == QUANT_F32;
}

/* ---- matmul ---- */

struct mm_case {
    uint32_t type;
    int64_t n_in, n_out;
    int m;
    size_t pad; /* extra bytes per weight row */
};

static double run_matmul_case(const struct mm_case *c, struct rng *r, double *bound_used)
{
    const char *tn = quant_type_name(c->type);
    size_t row_bytes = vec_dot_row_bytes(c->type, c->n_in);
    size_t w_stride = row_bytes + c->pad;
    int64_t x_stride = c->n_in + 5, y_stride = c->n_out + 3;
    uint8_t *w = malloc((size_t)c->n_out * w_stride);
    float *x = malloc((size_t)(c->m * x_stride) * sizeof(float));
    float *y1 = malloc((size_t)(c->m * y_stride) * sizeof(float));
    float *y2 = malloc((size_t)(c->m * y_stride) * sizeof(float));
    size_t sbytes = matmul_scratch_bytes(c->type, c->n_in, c->m);
    void *scratch = sbytes ? malloc(sbytes) : NULL;
    size_t abytes = vec_dot_act_bytes(c->type, c->n_in);
    uint8_t *act = malloc(abytes * (size_t)c->m);

    fill_weights(c->type, w, c->n_out, c->n_in, w_stride, r);
    fill_normal(x, (size_t)(c->m * x_stride), 1.0f, r);
    test_poison_f32(y1, (size_t)(c->m * y_stride));
    test_poison_f32(y2, (size_t)(c->m * y_stride));

    struct matmul_args a = {.wtype = c->type,
                            .w = w,
                            .w_stride = w_stride,
                            .n_in = c->n_in,
                            .n_out = c->n_out,
                            .m = c->m,
                            .x = x,
                            .x_stride = x_stride,
                            .y = y1,
                            .y_stride = y_stride,
                            .scratch = scratch,
                            .scratch_bytes = sbytes,
                            .n_threads = 1};
    CHECK(matmul_run(&a) == 0, "%s matmul_run failed", tn);
    a.y = y2;
    a.n_threads = 2;
    a.scratch = NULL; /* internal allocation */
    CHECK(matmul_run(&a) == 0, "%s matmul_run (2 threads) failed", tn);
    CHECK(memcmp(y1, y2, (size_t)(c->m * y_stride) * sizeof(float)) == 0,
          "%s n_in %lld n_out %lld m %d: 1 and 2 threads differ", tn, (long long)c->n_in,
          (long long)c->n_out, c->m);

    /* bit-exact against the vec_dot of each row, whatever the batch; padding untouched */
    vec_dot_fn dot = vec_dot_get(c->type, CPU_ISA_COUNT);
    for (int j = 0; j < c->m; j++)
        vec_dot_quantize_get(c->type, CPU_ISA_SCALAR)(x + j * x_stride, act + j * abytes, c->n_in);
    int mismatches = 0, touched = 0;
    for (int j = 0; j < c->m; j++) {
        for (int64_t o = 0; o < c->n_out; o++) {
            float want = dot(c->n_in, w + o * w_stride, act + j * abytes);
            float got = y1[j * y_stride + o];
            mismatches += memcmp(&want, &got, sizeof(float)) != 0;
        }
        for (int64_t o = c->n_out; o < y_stride; o++)
            touched += !isnan(y1[j * y_stride + o]);
    }
    CHECK(mismatches == 0, "%s m %d: %d outputs differ from the vec_dot of their row", tn, c->m,
          mismatches);
    CHECK(touched == 0, "%s m %d: %d padding outputs written", tn, c->m, touched);

    /* against the double reference with float activations: the difference is bounded by
     * sum_i |w_i| |x_i - xq_i| (activation conversion, xq decoded from act) plus float
     * accumulation, TOL_FLOAT * sum_i |w_i x_i| */
    float *wf = decode(c->type, w, c->n_out, c->n_in, w_stride);
    float *ref = malloc((size_t)(c->m * c->n_out) * sizeof(float));
    float *got = malloc((size_t)(c->m * c->n_out) * sizeof(float));
    enum quant_type at = vec_dot_act_type(c->type);
    int over = 0;
    double worst = 0;
    for (int j = 0; j < c->m; j++)
        for (int64_t o = 0; o < c->n_out; o++) {
            double s = 0, bound = 0, sabs = 0;
            for (int64_t i = 0; i < c->n_in; i++) {
                double wv = wf[o * c->n_in + i], xv = x[j * x_stride + i];
                s += wv * xv;
                sabs += fabs(wv * xv);
                bound += fabs(wv) * fabs(xv - act_value(at, act + j * abytes, i));
            }
            bound += TOL_FLOAT * sabs;
            double diff = fabs(y1[j * y_stride + o] - s);
            over += !(diff <= bound);
            worst = fmax(worst, diff / bound);
            ref[j * c->n_out + o] = (float)s;
            got[j * c->n_out + o] = y1[j * y_stride + o];
        }
    CHECK(over == 0,
          "%s n_in %lld n_out %lld m %d: %d outputs beyond the error bound (worst "
          "%.3g of it)",
          tn, (long long)c->n_in, (long long)c->n_out, c->m, over, worst);
    *bound_used = fmax(*bound_used, worst);
    /* informational: the norm-relative error is only meaningful over many outputs */
    double err = c->m * c->n_out >= 64 ? test_norm_rel_err(got, ref, (size_t)(c->m * c->n_out)) : 0;

    free(w), free(x), free(y1), free(y2), free(scratch), free(act), free(wf), free(ref), free(got);
    return err;
}

/* One gemm call of n_rows x m against the vec_dot of the same ISA level (bit for bit) and the
 * scalar vec_dot (same activations); returns the worst |diff| / sum |w a| against the scalar. */
static double run_gemm_case(gemm_fn gemm, enum cpu_isa isa, uint32_t type, int64_t n,
                            int64_t n_rows, int m, struct rng *r)
{
    const char *tn = quant_type_name(type);
    size_t w_stride = vec_dot_row_bytes(type, n) + 64;
    size_t abytes = vec_dot_act_bytes(type, n);
    int64_t y_stride = n_rows + 3;
    uint8_t *w = malloc((size_t)n_rows * w_stride), *act = malloc(abytes * (size_t)m);
    float *x = malloc(sizeof(float) * (size_t)n);
    float *y = malloc(sizeof(float) * (size_t)(m * y_stride));
    enum quant_type at = vec_dot_act_type(type);
    vec_dot_fn ref = vec_dot_get(type, CPU_ISA_SCALAR), same = vec_dot_get(type, isa);

    fill_weights(type, w, n_rows, n, w_stride, r);
    for (int j = 0; j < m; j++) {
        fill_normal(x, (size_t)n, 1.0f, r);
        vec_dot_quantize_act(type, x, act + (size_t)j * abytes, n);
    }
    test_poison_f32(y, (size_t)(m * y_stride));
    gemm(n, w, w_stride, n_rows, act, abytes, m, y, y_stride);
    float *wf = decode(type, w, n_rows, n, w_stride);
    int over = 0, touched = 0, inexact = 0;
    double worst = 0;
    for (int j = 0; j < m; j++) {
        const uint8_t *aj = act + (size_t)j * abytes;
        for (int64_t o = 0; o < n_rows; o++) {
            float want = same(n, w + o * w_stride, aj);
            inexact += memcmp(&want, &y[j * y_stride + o], sizeof(float)) != 0;
            double sabs = 0;
            for (int64_t i = 0; i < n; i++)
                sabs += fabs(wf[o * n + i] * act_value(at, aj, i));
            double diff = fabs((double)y[j * y_stride + o] - ref(n, w + o * w_stride, aj));
            over += !(diff <= TOL_GEMM * sabs);
            worst = fmax(worst, diff / sabs);
        }
        for (int64_t o = n_rows; o < y_stride; o++)
            touched += !isnan(y[j * y_stride + o]);
    }
    CHECK(inexact == 0, "gemm %s %s n %lld rows %lld m %d: %d outputs differ from its vec_dot", tn,
          cpu_isa_name(isa), (long long)n, (long long)n_rows, m, inexact);
    CHECK(over == 0, "gemm %s n %lld rows %lld m %d: %d outputs off the scalar dot (worst %.3g)",
          tn, (long long)n, (long long)n_rows, m, over, worst);
    CHECK(touched == 0, "gemm %s rows %lld m %d: %d outputs written past the rows", tn,
          (long long)n_rows, m, touched);
    free(w), free(act), free(x), free(y), free(wf);
    return worst;
}

/* The AMX kernels with the tile instructions done in C (gemm_amx_emu.c). */
gemm_fn gemm_amx_get_emu(uint32_t wtype);

/* gemm against its level's dot and the scalar dot over tiles cut short, register tiles and
 * groups of 16 activation rows (AMX) left over, and a pass (MAX_M) crossed; one line printed. */
static void gemm_cases(gemm_fn gemm, enum cpu_isa isa, uint32_t type, const char *label,
                       struct rng *r)
{
    /* Q8_0: 37 blocks, so the last chunk has 5 (odd) blocks */
    int64_t n = vec_dot_block(type) == QK_K ? 768 : 32 * 37;
    const struct {
        int64_t rows;
        int m;
    } cases[] = {{16, 1},  {1, 4},   {15, 8},  {17, 9}, {40, 16},
                 {33, 70}, {16, 13}, {17, 32}, {1, 47}};
    double worst = 0;
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++)
        worst = fmax(worst, run_gemm_case(gemm, isa, type, n, cases[k].rows, cases[k].m, r));
    printf("  gemm %-6s %-10s vs the scalar dot: worst |diff| / sum |w a| %.2e (tolerance %.0e)\n",
           quant_type_name(type), label, worst, TOL_GEMM);
}

static void test_gemm(struct rng *r)
{
    static const uint32_t gtypes[] = {QUANT_Q8_0, QUANT_MXFP4, QUANT_Q4_0,
                                      QUANT_Q4_K, QUANT_Q5_K,  QUANT_Q6_K};
    for (int isa = CPU_ISA_AVX2; isa <= (int)cpu_isa_best(); isa++)
        for (size_t t = 0; t < sizeof(gtypes) / sizeof(gtypes[0]); t++) {
            /* a level may pair the gemm of the level below with its own vec_dot */
            gemm_fn gemm = gemm_get(gtypes[t], (enum cpu_isa)isa);
            if (gemm)
                gemm_cases(gemm, (enum cpu_isa)isa, gtypes[t], cpu_isa_name((enum cpu_isa)isa), r);
        }
    /* the AMX kernels: groups of 16 activation rows by tiles, the rest by the VNNI rows, the
     * VNNI kernel's bits either way; the host's tiles where it has them (gemm_get above at
     * avx512vnni), and the tiles done in C on any host with AVX-512 VNNI */
    const char *why = gemm_amx_status();
    printf("  gemm amx on this host: %s\n", why ? why : "used at avx512vnni (above)");
    if (cpu_isa_best() < CPU_ISA_AVX512VNNI)
        return;
    for (size_t t = 0; t < sizeof(gtypes) / sizeof(gtypes[0]); t++) {
        gemm_fn gemm = gemm_amx_get_emu(gtypes[t]);
        CHECK(gemm != NULL, "no emulated AMX kernel for %s", quant_type_name(gtypes[t]));
        if (gemm)
            gemm_cases(gemm, CPU_ISA_AVX512VNNI, gtypes[t], "amx (emulated tiles)", r);
    }
}

static void test_matmul(struct rng *r)
{
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        uint32_t type = types[t];
        int64_t blk = vec_dot_block(type);
        int64_t n_in = blk == QK_K ? 768 : blk == QK_32 ? 32 * 37 : 300;
        double worst = 0, bound_used = 0;
        const struct mm_case cases[] = {
            {type, n_in, 1, 1, 0},    {type, n_in, 37, 1, 64}, {type, n_in, 300, 1, 0},
            {type, n_in, 300, 3, 64}, {type, n_in, 70, 16, 0}, {type, 2 * n_in, 33, 5, 0},
        };
        for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++)
            worst = fmax(worst, run_matmul_case(&cases[k], r, &bound_used));
        printf("  matmul %-6s vs float reference: norm-relative error %.2e (cases with >= 64 "
               "outputs), worst element at %.3f of its bound\n",
               quant_type_name(type), worst, bound_used);
    }
}

/* ---- batch invariance ---- */

#define BATCH_ROWS 17 /* activation rows; batches of 2 .. BATCH_ROWS of them */

/* BATCH_ROWS activation rows through matmul one at a time, then in batches of m = 2 ..
 * BATCH_ROWS rows taken at shifting offsets (so a row lands at every position of a register
 * tile); every batched output must have the bytes of the same row computed alone. Returns the
 * outputs compared. */
static int64_t run_batch_case(uint32_t type, int64_t n, struct rng *r)
{
    const char *tn = quant_type_name(type);
    const int64_t n_out = 37; /* two 16-row tiles and one cut short (five 8-row ones with AVX2) */
    const size_t w_stride = vec_dot_row_bytes(type, n);
    uint8_t *w = test_xmalloc((size_t)n_out * w_stride);
    float *x = test_xmalloc(sizeof(float) * (size_t)(BATCH_ROWS * n));
    float *alone = test_xmalloc(sizeof(float) * (size_t)(BATCH_ROWS * n_out));
    float *y = test_xmalloc(sizeof(float) * (size_t)(BATCH_ROWS * n_out));
    int64_t compared = 0;

    fill_weights(type, w, n_out, n, w_stride, r);
    fill_normal(x, (size_t)(BATCH_ROWS * n), 1.0f, r);
    test_poison_f32(alone, (size_t)(BATCH_ROWS * n_out));
    struct matmul_args a = {.wtype = type,
                            .w = w,
                            .w_stride = w_stride,
                            .n_in = n,
                            .n_out = n_out,
                            .m = 1,
                            .x_stride = n,
                            .y_stride = n_out};
    for (int j = 0; j < BATCH_ROWS; j++) {
        a.x = x + j * n, a.y = alone + j * n_out;
        CHECK(matmul_run(&a) == 0, "%s n %lld: matmul_run of row %d failed", tn, (long long)n, j);
    }
    for (int m = 2; m <= BATCH_ROWS; m++) {
        const int j0 = 5 * m % (BATCH_ROWS - m + 1); /* first row of the batch */
        a.m = m, a.x = x + j0 * n, a.y = y;
        test_poison_f32(y, (size_t)(m * n_out));
        CHECK(matmul_run(&a) == 0, "%s n %lld: matmul_run of m %d failed", tn, (long long)n, m);
        int differ = 0;
        for (int64_t i = 0; i < m * n_out; i++)
            differ += memcmp(&y[i], &alone[j0 * n_out + i], sizeof(float)) != 0;
        compared += m * n_out;
        CHECK(differ == 0,
              "%s n %lld m %d (rows %d .. %d): %d of %lld outputs differ from the rows alone", tn,
              (long long)n, m, j0, j0 + m - 1, differ, (long long)(m * n_out));
    }
    free(w), free(x), free(alone), free(y);
    return compared;
}

static void test_batch_invariance(struct rng *r)
{
    int64_t compared = 0;
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        const int64_t blk = vec_dot_block(types[t]);
        /* row lengths in blocks: 1 to 3 (the kernels' short tails) and enough for several
         * groups of blocks with a tail; float rows of odd lengths */
        const int64_t lens[][4] = {{101, 301, 801, 0}, {1, 2, 3, 37}, {1, 2, 3, 8}};
        const int64_t *len = lens[blk == 1 ? 0 : blk == QK_32 ? 1 : 2];
        for (int k = 0; k < 4 && len[k]; k++)
            compared += run_batch_case(types[t], len[k] * (blk == 1 ? 1 : blk), r);
    }
    printf("  batch invariance at %s: %lld outputs of batches of 2 .. %d rows against the rows "
           "alone, %d weight types\n",
           cpu_isa_name(cpu_isa_best()), (long long)compared, BATCH_ROWS,
           (int)(sizeof(types) / sizeof(types[0])));
}

/* matmul_run_n against one matmul_run per matrix, bit for bit: three matrices of 37, 5 and 64
 * rows (a chunk of the shared range crosses from one into the next), m = 1 and m = 3, 1 to 5
 * threads (at m = 1 from 4 threads in 4-row units, against references in 16-row units); and
 * its refusal of calls that do not share their input. */
static void test_matmul_n(struct rng *r)
{
    const uint32_t ts[] = {QUANT_Q8_0, QUANT_Q4_K, QUANT_F32};
    const int64_t rows[3] = {37, 5, 64};
    int64_t compared = 0;
    for (size_t t = 0; t < sizeof(ts) / sizeof(ts[0]); t++) {
        const char *tn = quant_type_name(ts[t]);
        const int64_t n = 2 * (vec_dot_block(ts[t]) == 1 ? 128 : vec_dot_block(ts[t]));
        const size_t ws = vec_dot_row_bytes(ts[t], n);
        float *x = test_xmalloc(sizeof(float) * (size_t)(3 * n));
        fill_normal(x, (size_t)(3 * n), 1.0f, r);
        uint8_t *w[3];
        float *alone[3], *y[3];
        struct matmul_args a[3],
            one = {
                .wtype = ts[t], .w_stride = ws, .n_in = n, .x = x, .x_stride = n, .n_threads = 1};
        for (int i = 0; i < 3; i++) {
            w[i] = test_xmalloc((size_t)rows[i] * ws);
            fill_weights(ts[t], w[i], rows[i], n, ws, r);
            alone[i] = test_xmalloc(sizeof(float) * (size_t)(3 * rows[i]));
            y[i] = test_xmalloc(sizeof(float) * (size_t)(3 * rows[i]));
        }
        for (int m = 1; m <= 3; m += 2) {
            matmul_set_fine_units(0); /* the references in 16-row units */
            for (int i = 0; i < 3; i++) {
                a[i] = one;
                a[i].w = w[i], a[i].n_out = rows[i], a[i].m = m;
                a[i].y = alone[i], a[i].y_stride = rows[i];
                CHECK(matmul_run(&a[i]) == 0, "%s: matmul_run of matrix %d failed", tn, i);
            }
            matmul_set_fine_units(1); /* 4-row units from 4 threads at m = 1 (7 units) */
            for (int nt = 1; nt <= 5; nt++) {
                for (int i = 0; i < 3; i++) {
                    a[i].y = y[i], a[i].n_threads = nt;
                    test_poison_f32(y[i], (size_t)(m * rows[i]));
                }
                CHECK(matmul_run_n(3, a) == 0, "%s m %d: matmul_run_n on %d threads failed", tn, m,
                      nt);
                int differ = 0;
                for (int i = 0; i < 3; i++)
                    for (int64_t k = 0; k < m * rows[i]; k++, compared++)
                        differ += memcmp(&y[i][k], &alone[i][k], sizeof(float)) != 0;
                CHECK(differ == 0,
                      "%s m %d, %d threads: %d outputs of matmul_run_n differ from "
                      "matmul_run's",
                      tn, m, nt, differ);
            }
        }
        a[1].x = x + n; /* another input */
        CHECK(matmul_run_n(3, a) == -EINVAL, "%s: matmul_run_n took calls with other inputs", tn);
        a[1].x = x;
        CHECK(matmul_run_n(0, a) == -EINVAL && matmul_run_n(MATMUL_MAX_N + 1, a) == -EINVAL,
              "%s: matmul_run_n took a count out of range", tn);
        for (int i = 0; i < 3; i++)
            free(w[i]), free(alone[i]), free(y[i]);
        free(x);
    }
    printf("  matmul_run_n: %lld outputs equal to one matmul_run per matrix (3 matrices, 1 to 5 "
           "threads)\n",
           (long long)compared);
}

static void test_matmul_args(void)
{
    float x[256] = {0}, y[16];
    uint8_t w[sizeof(struct block_q4_k)] = {0};
    char scratch[512];
    struct matmul_args ok = {.wtype = QUANT_Q4_K,
                             .w = w,
                             .w_stride = sizeof(w),
                             .n_in = 256,
                             .n_out = 1,
                             .m = 1,
                             .x = x,
                             .x_stride = 256,
                             .y = y,
                             .y_stride = 1};
    struct matmul_args a = ok;
    CHECK(matmul_run(&a) == 0, "valid arguments refused");
    a.m = 0;
    CHECK(matmul_run(&a) == -EINVAL, "m = 0 accepted");
    a.m = MATMUL_MAX_BATCH + 1;
    CHECK(matmul_run(&a) == -EINVAL, "m > MATMUL_MAX_BATCH accepted");
    a = ok, a.n_in = 128;
    CHECK(matmul_run(&a) == -EINVAL, "n_in not a block multiple accepted");
    a = ok, a.wtype = QUANT_Q4_1;
    CHECK(matmul_run(&a) == -EINVAL, "unsupported type accepted");
    a = ok, a.w_stride = sizeof(w) - 1;
    CHECK(matmul_run(&a) == -EINVAL, "short weight stride accepted");
    a = ok, a.scratch = scratch, a.scratch_bytes = 100;
    CHECK(matmul_run(&a) == -EINVAL, "small scratch accepted");
    a = ok, a.y = NULL;
    CHECK(matmul_run(&a) == -EINVAL, "NULL y accepted");
}

/* ---- expert FFN ---- */

struct ffn_case {
    uint32_t gate, up, down;
    int64_t n_embd, n_ff;
    int n_tokens;
};

static double silu_d(double v)
{
    return v / (1.0 + exp(-v));
}

static double run_ffn_case(const struct ffn_case *c, struct rng *r)
{
    const int rows = c->n_tokens + 3; /* rows of x/out; some are never listed */
    const int64_t E = c->n_embd, F = c->n_ff, xs = E + 7;
    size_t gb = vec_dot_row_bytes(c->gate, E), ub = vec_dot_row_bytes(c->up, E);
    size_t db = vec_dot_row_bytes(c->down, F);
    uint8_t *gate = malloc((size_t)F * gb), *up = malloc((size_t)F * ub);
    uint8_t *down = malloc((size_t)E * db);
    float *x = malloc((size_t)(rows * xs) * sizeof(float));
    float *out0 = malloc((size_t)(rows * xs) * sizeof(float));
    float *out1 = malloc((size_t)(rows * xs) * sizeof(float));
    float *out2 = malloc((size_t)(rows * xs) * sizeof(float));
    int32_t *tok = malloc((size_t)c->n_tokens * sizeof(int32_t));
    float *tw = malloc((size_t)c->n_tokens * sizeof(float));

    fill_weights(c->gate, gate, F, E, gb, r);
    fill_weights(c->up, up, F, E, ub, r);
    fill_weights(c->down, down, E, F, db, r);
    fill_normal(x, (size_t)(rows * xs), 1.0f, r);
    fill_normal(out0, (size_t)(rows * xs), 0.1f, r);
    /* a shuffled subset of the rows, with the last listed token repeating an earlier one */
    int32_t *perm = malloc((size_t)rows * sizeof(int32_t));
    for (int i = 0; i < rows; i++)
        perm[i] = i;
    for (int i = rows - 1; i > 0; i--) {
        int k = (int)rng_below(r, (uint32_t)i + 1);
        int32_t t = perm[i];
        perm[i] = perm[k], perm[k] = t;
    }
    for (int i = 0; i < c->n_tokens; i++) {
        tok[i] = perm[i];
        tw[i] = rng_uniform(r, 0.05f, 1.0f);
    }
    if (c->n_tokens > 2)
        tok[c->n_tokens - 1] = tok[0];

    struct expert_ffn_weights ew = {.gate_type = c->gate,
                                    .up_type = c->up,
                                    .down_type = c->down,
                                    .gate = gate,
                                    .up = up,
                                    .down = down,
                                    .n_embd = E,
                                    .n_ff = F};
    size_t sbytes = expert_ffn_scratch_bytes(&ew);
    void *scratch = malloc(sbytes);
    CHECK(sbytes > 0, "no scratch size");
    memcpy(out1, out0, (size_t)(rows * xs) * sizeof(float));
    memcpy(out2, out0, (size_t)(rows * xs) * sizeof(float));
    test_poison_bytes(scratch, sbytes);
    struct expert_ffn_args a = {.w = &ew,
                                .n_tokens = c->n_tokens,
                                .tokens = tok,
                                .token_weights = tw,
                                .x = x,
                                .x_stride = xs,
                                .out = out1,
                                .out_stride = xs,
                                .scratch = scratch,
                                .scratch_bytes = sbytes,
                                .n_threads = 1};
    CHECK(expert_ffn_run(&a) == 0, "expert_ffn_run failed");
    a.out = out2;
    a.n_threads = 2;
    test_poison_bytes(scratch, sbytes);
    CHECK(expert_ffn_run(&a) == 0, "expert_ffn_run (2 threads) failed");
    CHECK(memcmp(out1, out2, (size_t)(rows * xs) * sizeof(float)) == 0,
          "expert FFN %s/%s/%s: 1 and 2 threads differ", quant_type_name(c->gate),
          quant_type_name(c->up), quant_type_name(c->down));

    /* double reference: decoded weights, float activations */
    float *gf = decode(c->gate, gate, F, E, gb), *uf = decode(c->up, up, F, E, ub);
    float *df = decode(c->down, down, E, F, db);
    double *ref = calloc((size_t)(rows * xs), sizeof(double));
    double *h = malloc((size_t)F * sizeof(double));
    for (int i = 0; i < rows * xs; i++)
        ref[i] = out0[i];
    for (int t = 0; t < c->n_tokens; t++) {
        const float *xt = x + tok[t] * xs;
        for (int64_t f = 0; f < F; f++) {
            double g = 0, u = 0;
            for (int64_t e = 0; e < E; e++) {
                g += (double)gf[f * E + e] * xt[e];
                u += (double)uf[f * E + e] * xt[e];
            }
            h[f] = silu_d(g) * u;
        }
        for (int64_t e = 0; e < E; e++) {
            double s = 0;
            for (int64_t f = 0; f < F; f++)
                s += (double)df[e * F + f] * h[f];
            ref[tok[t] * xs + e] += tw[t] * s;
        }
    }
    /* compare the increments out - out0 (untouched rows and padding must stay equal) */
    float *dg = malloc((size_t)(rows * xs) * sizeof(float));
    float *dr = malloc((size_t)(rows * xs) * sizeof(float));
    for (int i = 0; i < rows * xs; i++) {
        dg[i] = out1[i] - out0[i];
        dr[i] = (float)(ref[i] - out0[i]);
    }
    int touched = 0;
    for (int row = 0; row < rows; row++)
        for (int64_t e = 0; e < xs; e++) {
            bool listed = false;
            for (int t = 0; t < c->n_tokens; t++)
                listed |= tok[t] == row;
            if ((!listed || e >= E) && out1[row * xs + e] != out0[row * xs + e])
                touched++;
        }
    CHECK(touched == 0, "expert FFN wrote %d elements outside the listed rows", touched);
    double err = test_norm_rel_err(dg, dr, (size_t)(rows * xs));
    bool all_f = is_f32_act(c->gate) && is_f32_act(c->up) && is_f32_act(c->down);
    double tol = all_f ? TOL_FFN_F : TOL_FFN_Q8;
    CHECK(err <= tol, "expert FFN %s/%s/%s, %d tokens: norm-relative error %.3g > %.0e",
          quant_type_name(c->gate), quant_type_name(c->up), quant_type_name(c->down), c->n_tokens,
          err, tol);

    free(gate), free(up), free(down), free(x), free(out0), free(out1), free(out2), free(tok);
    free(tw), free(perm), free(scratch), free(gf), free(uf), free(df), free(ref), free(h);
    free(dg), free(dr);
    return err;
}

static void test_expert_ffn(struct rng *r)
{
    const struct ffn_case cases[] = {
        {QUANT_Q4_K, QUANT_Q4_K, QUANT_Q6_K, 512, 768, 21},
        {QUANT_Q8_0, QUANT_Q8_0, QUANT_Q8_0, 576, 320, 1},
        {QUANT_MXFP4, QUANT_MXFP4, QUANT_MXFP4, 576, 320, 17},
        {QUANT_Q4_K, QUANT_Q8_0, QUANT_F16, 512, 256, 5}, /* up converts x separately */
        {QUANT_BF16, QUANT_F32, QUANT_F16, 96, 160, 4},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        double err = run_ffn_case(&cases[k], r);
        printf("  expert FFN %s/%s/%s n_embd %lld n_ff %lld, %d tokens: norm-relative error "
               "%.2e\n",
               quant_type_name(cases[k].gate), quant_type_name(cases[k].up),
               quant_type_name(cases[k].down), (long long)cases[k].n_embd, (long long)cases[k].n_ff,
               cases[k].n_tokens, err);
    }

    struct expert_ffn_weights ew = {.gate_type = QUANT_Q4_K,
                                    .up_type = QUANT_Q4_K,
                                    .down_type = QUANT_Q4_K,
                                    .n_embd = 256,
                                    .n_ff = 100};
    CHECK(expert_ffn_scratch_bytes(&ew) == 0, "n_ff not a block multiple accepted");
}

int main(void)
{
    struct rng r;
    rng_seed(&r, test_seed("test_matmul"), 0);
    printf("test_matmul: best ISA %s, %d OpenMP threads; matmul bound per element: "
           "sum |w||x - xq| + %.0e sum |w x|; FFN norm-relative tolerance %.0e (8-bit "
           "activations) / %.0e (float)\n",
           cpu_isa_name(cpu_isa_best()), omp_get_max_threads(), TOL_FLOAT, TOL_FFN_Q8, TOL_FFN_F);
    test_matmul_args();
    test_gemm(&r);
    test_matmul(&r);
    test_batch_invariance(&r);
    test_matmul_n(&r);
    test_expert_ffn(&r);
    return test_finish("test_matmul");
}
