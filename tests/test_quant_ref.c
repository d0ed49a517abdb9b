/* test_quant_ref: the scalar reference (de)quantizers of cpu_kernels/quant_ref.c.
 *
 * (a) golden: every block type in tests/data/quant-golden.gguf dequantizes bit for bit to what
 *     gguf-py's numpy dequantizer produced (tests/data/quant-golden.README.md);
 * (b) round trip on fresh random rows: normalised RMS error ||x - x'|| / ||x|| under the per-type
 *     bounds of docs/quant-tolerances.md, nothing non-finite, zero rows stay zero, every output
 *     byte written (two quantizations over differently poisoned buffers agree), no overrun;
 * (c) sizes: rows of several lengths are independent runs of blocks, bad n and types give -EINVAL;
 * (d) Q8_0, Q4_0 and MXFP4 are idempotent: re-quantizing dequantized values reproduces them.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "quant_ref.h"
#include "gguf.h"
#include "quant.h"
#include "testutil.h"

#define SENTINEL_BYTES 64 /* poisoned bytes after every output, checked for overruns */
#define SENTINEL_FLOATS 16

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static size_t row_bytes(uint32_t type, int64_t n)
{
    uint64_t bytes = 0;
    int rc = quant_row_bytes(type, (uint64_t)n, &bytes);
    CHECK(rc == 0, "quant_row_bytes(%s, %lld) = %d", quant_type_name(type), (long long)n, rc);
    return (size_t)bytes;
}

static bool bytes_all(const uint8_t *p, size_t n, uint8_t v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return false;
    return true;
}

/* ---- (a) golden -------------------------------------------------------------------------- */

static void test_golden(void)
{
    static const uint32_t types[] = {QUANT_Q8_0, QUANT_Q4_0, QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K,
                                     QUANT_Q2_K, QUANT_Q3_K, QUANT_MXFP4, QUANT_F16, QUANT_BF16};
    char path[512];
    struct gguf_file *f = NULL;
    test_data_path(path, sizeof path, "quant-golden.gguf");
    int rc = gguf_open(path, &f);
    CHECK(rc == 0, "gguf_open(%s) = %d", path, rc);
    if (rc)
        return;

    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const char *name = quant_type_name(types[t]);
        char qname[64], fname[64];
        snprintf(qname, sizeof qname, "%s.q", name);
        snprintf(fname, sizeof fname, "%s.f32", name);
        const struct gguf_tensor *tq = gguf_find_tensor(f, qname);
        const struct gguf_tensor *tf = gguf_find_tensor(f, fname);
        CHECK(tq && tf, "golden tensors %s / %s missing", qname, fname);
        if (!tq || !tf)
            continue;
        CHECK(tq->type == types[t], "%s has type %u, expected %u", qname, tq->type, types[t]);
        CHECK(tf->type == QUANT_F32, "%s has type %u, expected F32", fname, tf->type);
        CHECK(tq->ne[0] == 1024 && tq->ne[1] == 6 && tf->ne[0] == tq->ne[0] &&
                  tf->ne[1] == tq->ne[1],
              "%s is %llux%llu, %s is %llux%llu, expected 1024x6", qname,
              (unsigned long long)tq->ne[0], (unsigned long long)tq->ne[1], fname,
              (unsigned long long)tf->ne[0], (unsigned long long)tf->ne[1]);
        if (tq->type != types[t] || tf->type != QUANT_F32 || tq->ne[0] != tf->ne[0] ||
            tq->ne[1] != tf->ne[1])
            continue;

        int64_t n = (int64_t)(tq->ne[0] * tq->ne[1]);
        float *want = malloc((size_t)n * sizeof(float));
        float *got = malloc(((size_t)n + SENTINEL_FLOATS) * sizeof(float));
        memcpy(want, tf->data, (size_t)n * sizeof(float));
        test_poison_f32(got, (size_t)n + SENTINEL_FLOATS);
        rc = quant_ref_dequantize(types[t], tq->data, got, n);
        CHECK(rc == 0, "dequantize %s = %d", qname, rc);

        int64_t mismatches = 0, first = -1;
        for (int64_t i = 0; i < n; i++) {
            if (float_bits(got[i]) != float_bits(want[i])) {
                if (first < 0)
                    first = i;
                mismatches++;
            }
        }
        CHECK(mismatches == 0,
              "%s: %lld of %lld values differ from gguf-py; first at %lld (row %lld col %lld): "
              "got %.9g (0x%08x), want %.9g (0x%08x)",
              name, (long long)mismatches, (long long)n, (long long)first,
              (long long)(first / 1024), (long long)(first % 1024), first >= 0 ? got[first] : 0,
              first >= 0 ? float_bits(got[first]) : 0, first >= 0 ? want[first] : 0,
              first >= 0 ? float_bits(want[first]) : 0);
        for (int i = 0; i < SENTINEL_FLOATS; i++)
            CHECK(isnan(got[n + i]), "%s: dequantize wrote past the end (float %d)", name, i);
        printf("golden %-5s: %lld values, %lld mismatches\n", name, (long long)n,
               (long long)mismatches);
        free(want);
        free(got);
    }
    gguf_close(f);
}

/* ---- (b) round trip ---------------------------------------------------------------------- */

enum row_kind { ROW_NORMAL, ROW_OUTLIER, ROW_CONST, ROW_SMALL, ROW_TINY, ROW_ZERO, ROW_KIND_COUNT };

static const char *const row_kind_names[ROW_KIND_COUNT] = {"normal", "outlier", "const",
                                                           "small",  "tiny",    "zero"};
static const int rows_per_kind[ROW_KIND_COUNT] = {24, 12, 6, 8, 4, 2};

/* Upper bounds on ||x - x'|| / ||x|| per row; docs/quant-tolerances.md gives the measured values
 * and the reasoning. normal/outlier: measured worst case plus margin. constant: analytic, the
 * f16 rounding of the block scale, which is subnormal for the smallest constants drawn (0.01).
 * small (1e-7..1e-4): an f16 block scale is subnormal there, rounds by up to a factor 2 and can
 * make a block slightly worse than zero output (measured worst 1.02 over single super-blocks);
 * 1.25 catches real blow-ups. tiny (~1e-8): f16 block scales flush to zero, so the output is
 * zero (error exactly 1), and F16 values round at worst to zero. F32, BF16 and MXFP4 (E8M0
 * scale) keep their normal bound in both. */
struct rt_bound {
    uint32_t type;
    double normal, outlier, constant, small, tiny;
};

static const struct rt_bound rt_bounds[] = {
    /* type      normal  outlier constant small  tiny */
    {QUANT_F32, 0, 0, 0, 0, 0},
    {QUANT_F16, 4.9e-4, 4.9e-4, 4.9e-4, 1.0, 1.0},
    {QUANT_BF16, 3.9e-3, 3.9e-3, 3.9e-3, 3.9e-3, 3.9e-3},
    {QUANT_Q8_0, 7.5e-3, 0.018, 5.0e-4, 1.25, 1.0},
    {QUANT_Q4_0, 0.11, 0.18, 5.0e-4, 1.25, 1.0},
    {QUANT_MXFP4, 0.15, 0.25, 0.2501, 0.15, 0.15},
    {QUANT_Q4_K, 0.09, 0.14, 3.0e-3, 1.25, 1.0},
    {QUANT_Q5_K, 0.045, 0.075, 6.0e-3, 1.25, 1.0},
    {QUANT_Q6_K, 0.022, 0.045, 0.0125, 1.25, 1.0},
};

/* Fills one row of the given kind. Normal rows have a random scale over three decades; outlier
 * rows add a few elements 10-50x larger; const rows repeat one random value; small rows have a
 * scale of 1e-7..1e-4, where f16 block scales turn subnormal; tiny rows are normal values
 * times 1e-8. */
static void row_fill(struct rng *r, enum row_kind kind, float *x, int64_t n)
{
    float sigma = powf(10.0f, rng_uniform(r, -2.0f, 1.0f));
    float sigma_small = powf(10.0f, rng_uniform(r, -7.0f, -4.0f));
    float c = rng_uniform(r, 0.01f, 10.0f) * (rng_below(r, 2) ? 1.0f : -1.0f);
    for (int64_t i = 0; i < n; i++) {
        switch (kind) {
        case ROW_NORMAL:
            x[i] = sigma * rng_normal(r);
            break;
        case ROW_OUTLIER:
            x[i] = sigma * rng_normal(r);
            if (rng_below(r, 64) == 0)
                x[i] *= rng_uniform(r, 10.0f, 50.0f);
            break;
        case ROW_CONST:
            x[i] = c;
            break;
        case ROW_SMALL:
            x[i] = sigma_small * rng_normal(r);
            break;
        case ROW_TINY:
            x[i] = 1e-8f * rng_normal(r);
            break;
        default:
            x[i] = 0;
            break;
        }
    }
}

static void test_round_trip_type(const struct rt_bound *bd, uint64_t seed)
{
    const int64_t n = 4096;
    const char *name = quant_type_name(bd->type);
    size_t bytes = row_bytes(bd->type, n);
    uint8_t *qa = malloc(bytes + SENTINEL_BYTES), *qb = malloc(bytes + SENTINEL_BYTES);
    float *x = malloc((size_t)n * sizeof(float));
    float *y = malloc(((size_t)n + SENTINEL_FLOATS) * sizeof(float));
    struct rng r;
    rng_seed(&r, seed, bd->type);

    double worst[ROW_KIND_COUNT] = {0}, sum[ROW_KIND_COUNT] = {0};
    for (int k = 0; k < ROW_KIND_COUNT; k++) {
        for (int row = 0; row < rows_per_kind[k]; row++) {
            row_fill(&r, (enum row_kind)k, x, n);
            test_poison_bytes(qa, bytes + SENTINEL_BYTES);
            memset(qb, 0x5A, bytes + SENTINEL_BYTES);
            int rca = quant_ref_quantize(bd->type, x, qa, n);
            int rcb = quant_ref_quantize(bd->type, x, qb, n);
            CHECK(rca == 0 && rcb == 0, "%s: quantize = %d, %d", name, rca, rcb);
            CHECK(memcmp(qa, qb, bytes) == 0,
                  "%s %s row %d: output depends on the poison: some byte is not written", name,
                  row_kind_names[k], row);
            CHECK(bytes_all(qa + bytes, SENTINEL_BYTES, 0xA5) &&
                      bytes_all(qb + bytes, SENTINEL_BYTES, 0x5A),
                  "%s: quantize wrote past the end of the row", name);

            test_poison_f32(y, (size_t)n + SENTINEL_FLOATS);
            int rc = quant_ref_dequantize(bd->type, qa, y, n);
            CHECK(rc == 0, "%s: dequantize = %d", name, rc);
            int64_t bad = -1;
            for (int64_t i = 0; i < n && bad < 0; i++)
                if (!isfinite(y[i]))
                    bad = i;
            CHECK(bad < 0, "%s %s row %d: element %lld dequantizes to %g", name,
                  row_kind_names[k], row, (long long)bad, bad >= 0 ? y[bad] : 0.0);
            for (int i = 0; i < SENTINEL_FLOATS; i++)
                CHECK(isnan(y[n + i]), "%s: dequantize wrote past the end", name);

            if (k == ROW_ZERO) {
                int64_t nz = -1;
                for (int64_t i = 0; i < n && nz < 0; i++)
                    if (y[i] != 0.0f)
                        nz = i;
                CHECK(nz < 0, "%s: zero row dequantizes to %g at %lld", name,
                      nz >= 0 ? y[nz] : 0.0, (long long)nz);
                continue;
            }
            double err = test_norm_rel_err(y, x, (size_t)n);
            sum[k] += err;
            if (err > worst[k])
                worst[k] = err;
        }
    }

    printf("round trip %-5s:", name);
    for (int k = 0; k < ROW_ZERO; k++)
        printf(" %s max %.3g mean %.3g;", row_kind_names[k], worst[k], sum[k] / rows_per_kind[k]);
    printf("\n");
    const double bound[ROW_ZERO] = {bd->normal, bd->outlier, bd->constant, bd->small, bd->tiny};
    for (int k = 0; k < ROW_ZERO; k++)
        CHECK(worst[k] <= bound[k], "%s %s rows: normalised RMS error %.4g exceeds bound %.4g",
              name, row_kind_names[k], worst[k], bound[k]);
    free(qa);
    free(qb);
    free(x);
    free(y);
}

static void test_round_trip(uint64_t seed)
{
    for (size_t t = 0; t < sizeof rt_bounds / sizeof rt_bounds[0]; t++) {
        CHECK(quant_ref_can_quantize(rt_bounds[t].type), "%s: no quantizer",
              quant_type_name(rt_bounds[t].type));
        test_round_trip_type(&rt_bounds[t], seed);
    }
}

/* ---- (c) sizes --------------------------------------------------------------------------- */

/* Rows of 1, 3, 7 and 17 blocks: a row is the prefix of a longer one, so its bytes must be the
 * longer row's first bytes and its values the longer row's first values; nothing past it is
 * touched. */
static void test_sizes_type(uint32_t type, uint64_t seed)
{
    static const int64_t lens[] = {1, 3, 7, 17};
    const struct quant_type_info *info = quant_type_find(type);
    const int64_t block = info->block, n_max = 17 * block;
    const char *name = info->name;
    size_t bytes_max = row_bytes(type, n_max);
    float *x = malloc((size_t)n_max * sizeof(float));
    float *y_full = malloc((size_t)n_max * sizeof(float));
    float *y = malloc(((size_t)n_max + SENTINEL_FLOATS) * sizeof(float));
    uint8_t *q_full = malloc(bytes_max), *q = malloc(bytes_max + SENTINEL_BYTES);
    struct rng r;
    rng_seed(&r, seed, 1000 + type);
    for (int64_t i = 0; i < n_max; i++)
        x[i] = rng_normal(&r);
    CHECK(quant_ref_quantize(type, x, q_full, n_max) == 0, "%s: quantize full row", name);
    CHECK(quant_ref_dequantize(type, q_full, y_full, n_max) == 0, "%s: dequantize full row",
          name);

    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
        int64_t n = lens[l] * block;
        size_t bytes = row_bytes(type, n);
        test_poison_bytes(q, bytes_max + SENTINEL_BYTES);
        CHECK(quant_ref_quantize(type, x, q, n) == 0, "%s: quantize %lld", name, (long long)n);
        CHECK(memcmp(q, q_full, bytes) == 0, "%s: row of %lld differs from the prefix", name,
              (long long)n);
        CHECK(bytes_all(q + bytes, bytes_max + SENTINEL_BYTES - bytes, 0xA5),
              "%s: quantize of %lld wrote past %zu bytes", name, (long long)n, bytes);
        test_poison_f32(y, (size_t)n_max + SENTINEL_FLOATS);
        CHECK(quant_ref_dequantize(type, q, y, n) == 0, "%s: dequantize %lld", name,
              (long long)n);
        CHECK(memcmp(y, y_full, (size_t)n * sizeof(float)) == 0,
              "%s: dequantized row of %lld differs from the prefix", name, (long long)n);
        bool untouched = true;
        for (int64_t i = n; i < n_max + SENTINEL_FLOATS; i++)
            untouched = untouched && isnan(y[i]);
        CHECK(untouched, "%s: dequantize of %lld wrote past the row", name, (long long)n);
    }

    /* Bad lengths: not a block multiple (where blocks exceed 1), negative. Nothing written. */
    test_poison_bytes(q, bytes_max + SENTINEL_BYTES);
    test_poison_f32(y, (size_t)n_max + SENTINEL_FLOATS);
    const int64_t bad[] = {block > 1 ? block + 1 : -1, block > 1 ? block / 2 : -2, -block};
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        int rq = quant_ref_quantize(type, x, q, bad[b]);
        int rd = quant_ref_dequantize(type, q_full, y, bad[b]);
        CHECK(rq == -EINVAL && rd == -EINVAL, "%s: n = %lld gives %d / %d, expected -EINVAL",
              name, (long long)bad[b], rq, rd);
    }
    CHECK(quant_ref_quantize(type, x, q, 0) == 0 && quant_ref_dequantize(type, q_full, y, 0) == 0,
          "%s: n = 0 must succeed", name);
    CHECK(bytes_all(q, bytes_max + SENTINEL_BYTES, 0xA5), "%s: failed quantize wrote", name);
    bool untouched = true;
    for (int64_t i = 0; i < n_max + SENTINEL_FLOATS; i++)
        untouched = untouched && isnan(y[i]);
    CHECK(untouched, "%s: failed dequantize wrote", name);

    free(x);
    free(y_full);
    free(y);
    free(q_full);
    free(q);
}

static void test_sizes(uint64_t seed)
{
    for (size_t t = 0; t < sizeof rt_bounds / sizeof rt_bounds[0]; t++)
        test_sizes_type(rt_bounds[t].type, seed);

    /* Types without a reference (de)quantizer. */
    float x[QK_K] = {0}, y[QK_K];
    uint8_t q[512] = {0};
    const uint32_t no_dequant[] = {QUANT_Q4_1, QUANT_Q8_K, QUANT_IQ4_XS, QUANT_I32, 999};
    for (size_t t = 0; t < sizeof no_dequant / sizeof no_dequant[0]; t++) {
        CHECK(!quant_ref_can_dequantize(no_dequant[t]), "type %u claims a dequantizer",
              no_dequant[t]);
        CHECK(quant_ref_dequantize(no_dequant[t], q, y, QK_K) == -EINVAL,
              "dequantize type %u must give -EINVAL", no_dequant[t]);
        CHECK(quant_ref_quantize(no_dequant[t], x, q, QK_K) == -EINVAL,
              "quantize type %u must give -EINVAL", no_dequant[t]);
    }
    const uint32_t dequant_only[] = {QUANT_Q2_K, QUANT_Q3_K};
    for (size_t t = 0; t < 2; t++) {
        CHECK(quant_ref_can_dequantize(dequant_only[t]) && !quant_ref_can_quantize(dequant_only[t]),
              "%s: expected dequantize only", quant_type_name(dequant_only[t]));
        CHECK(quant_ref_quantize(dequant_only[t], x, q, QK_K) == -EINVAL,
              "%s: quantize must give -EINVAL", quant_type_name(dequant_only[t]));
        CHECK(quant_ref_dequantize(dequant_only[t], q, y, QK_K + 1) == -EINVAL,
              "%s: n = %d must give -EINVAL", quant_type_name(dequant_only[t]), QK_K + 1);
    }
}

/* ---- (d) idempotence --------------------------------------------------------------------- */

/* y1 = dequantize(quantize(x)); y2 = dequantize(quantize(y1)); y1 and y2 must be equal as values
 * (a zero may change sign). Holds for these formats because the element that sets the block's
 * scale dequantizes to a value that sets the same scale again, and every other value is already
 * on that grid. */
static void test_idempotent(uint64_t seed)
{
    const uint32_t types[] = {QUANT_Q8_0, QUANT_Q4_0, QUANT_MXFP4};
    const int64_t n = 4096;
    float *x = malloc((size_t)n * sizeof(float)), *y1 = malloc((size_t)n * sizeof(float));
    float *y2 = malloc((size_t)n * sizeof(float));
    uint8_t *q = malloc(row_bytes(QUANT_Q8_0, n));
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const char *name = quant_type_name(types[t]);
        struct rng r;
        rng_seed(&r, seed, 2000 + types[t]);
        int64_t mismatches = 0, first = -1;
        for (int k = 0; k < ROW_ZERO; k++) {
            for (int row = 0; row < rows_per_kind[k]; row++) {
                row_fill(&r, (enum row_kind)k, x, n);
                quant_ref_quantize(types[t], x, q, n);
                quant_ref_dequantize(types[t], q, y1, n);
                quant_ref_quantize(types[t], y1, q, n);
                quant_ref_dequantize(types[t], q, y2, n);
                for (int64_t i = 0; i < n; i++) {
                    if (y1[i] != y2[i]) {
                        if (first < 0)
                            CHECK(false, "%s %s row %d: element %lld %.9g re-quantizes to %.9g",
                                  name, row_kind_names[k], row, (long long)i, y1[i], y2[i]);
                        first = i;
                        mismatches++;
                    }
                }
            }
        }
        printf("idempotent %-5s: %lld mismatches\n", name, (long long)mismatches);
    }
    free(x);
    free(y1);
    free(y2);
    free(q);
}

int main(void)
{
    uint64_t seed = test_seed("test_quant_ref");
    test_golden();
    test_round_trip(seed);
    test_sizes(seed);
    test_idempotent(seed);
    return test_finish("test_quant_ref");
}
