/* test_cuda_matmul: y = x W^T on the GPU (cuda_matmul) against CPU double-precision references
 * built from quant_ref-decoded weights, for every supported type, m in {1, 2, 3, 8, 16, 24,
 * 40, 64, 512} (the large-m cases on the smaller shapes only, to bound the CPU time), several
 * shapes including partial tiles, weights at odd base offsets and odd row strides, activation
 * rows with padding and through a gather list.
 *
 * Each output is checked against the exact sum of the products the kernel is meant to form:
 * - MMV, quantized types: decoded weights times the 8-bit activations, quantized here exactly
 *   as the kernel does (d = max|x|/127, q = round-to-even(x * (127/max|x|))); allowed error
 *   TOL_ACC * sum_i |w_i xq_i| (float32 accumulation of exact integer block sums);
 * - MMV, F32/F16/BF16: decoded weights times the float activations, TOL_ACC * sum |w_i x_i|;
 * - GEMM: weights and activations rounded to BF16 as the kernel does, TOL_GEMM *
 *   sum |w16_i x16_i| (tensor-core products, float32 accumulation); every GEMM tile shape is
 *   forced on ragged shapes (test_gemm_tiles) and the tiles must give the same bits.
 * The error against the plain float reference (decoded weights, float activations), relative
 * to sum |w_i x_i|, is printed for information. Outputs are poisoned with NaN first, and the
 * padding between output rows must stay NaN. Also: CUDA graph capture and replay give the same
 * bits as a direct call, bad arguments are refused, scratch sizes never shrink with m, and the
 * GEMV of each type on a 256 MB matrix and the m = 512 GEMM on prefill shapes per tile are timed
 * (median of 20, not asserted).
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "cuda_matmul.h"
#include "cuda_mem.h"
#include "cuda_ops.h"
#include "fp16.h"
#include "quant.h"
#include "quant_ref.h"
#include "testutil.h"

/* float32 accumulation error allowed, relative to sum_i |w_i a_i| of the products formed */
#define TOL_ACC 1e-5
/* BF16 tensor-core products with float32 accumulation, relative to sum_i |w16_i x16_i| */
#define TOL_GEMM 1e-4
/* largest m * n_in * n_out checked (bounds the time of the CPU reference) */
#define CASE_BUDGET 2.5e8

static const uint32_t types[] = {QUANT_F32,   QUANT_F16,  QUANT_BF16, QUANT_Q8_0, QUANT_Q4_0,
                                 QUANT_MXFP4, QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K};
static const int ms[] = {1, 2, 3, 8, 16, 24, 40, 64, 512};
#define N_TYPES (int)(sizeof(types) / sizeof(types[0]))
#define N_MS (int)(sizeof(ms) / sizeof(ms[0]))

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of host memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static int64_t type_block(uint32_t type)
{
    return quant_type_find(type)->block;
}

static size_t type_row_bytes(uint32_t type, int64_t n)
{
    uint64_t b = 0;
    if (quant_row_bytes(type, (uint64_t)n, &b) != 0)
        return 0;
    return (size_t)b;
}

static bool is_quantized(uint32_t type)
{
    return type != QUANT_F32 && type != QUANT_F16 && type != QUANT_BF16;
}

static enum cuda_matmul_path path_expected(uint32_t type, int m, enum cuda_matmul_path forced)
{
    if (forced != CUDA_MATMUL_PATH_AUTO)
        return forced;
    return type == QUANT_F32 || m < CUDA_MATMUL_GEMM_MIN_M ? CUDA_MATMUL_PATH_MMV
                                                           : CUDA_MATMUL_PATH_GEMM;
}

static const char *path_name(enum cuda_matmul_path p)
{
    return p == CUDA_MATMUL_PATH_GEMM ? "gemm" : "mmv";
}

/* Offsets of the f16 scale fields of a block (-1: none). */
static void scale_offsets(uint32_t type, int *d, int *dmin)
{
    *d = -1, *dmin = -1;
    switch (type) {
    case QUANT_Q8_0:
    case QUANT_Q4_0:
        *d = 0;
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

/* rows weight rows of n elements at byte stride `stride` (the last row without padding): every
 * quant byte random, scales set to sane values; float types N(0, 0.05^2). The padding after
 * each row is 0xFF (NaN as f16/bf16/f32), so a kernel that used it would produce NaN. */
static void fill_weights(uint32_t type, uint8_t *w, int64_t rows, int64_t n, size_t stride,
                         struct rng *r)
{
    const size_t rb = type_row_bytes(type, n);
    const int64_t blk = type_block(type);
    const size_t bsize = rb / (size_t)(n / blk);
    int d_off, dmin_off;
    scale_offsets(type, &d_off, &dmin_off);
    memset(w, 0xFF, (size_t)(rows - 1) * stride + rb);
    for (int64_t row = 0; row < rows; row++) {
        uint8_t *p = w + row * stride;
        if (blk == 1) {
            for (int64_t i = 0; i < n; i++) {
                const float v = rng_normal(r) * 0.05f;
                const uint16_t h = type == QUANT_F16 ? fp16_from_f32(v) : bf16_from_f32(v);
                if (type == QUANT_F32)
                    memcpy(p + 4 * i, &v, 4);
                else
                    memcpy(p + 2 * i, &h, 2);
            }
            continue;
        }
        for (size_t i = 0; i < rb; i++)
            p[i] = (uint8_t)rng_u32(r);
        for (int64_t b = 0; b < n / blk; b++) {
            uint8_t *bp = p + b * bsize;
            const uint16_t d = fp16_from_f32(rng_uniform(r, 1e-3f, 1e-2f));
            const uint16_t dm = fp16_from_f32(rng_uniform(r, 1e-3f, 1e-2f));
            if (type == QUANT_MXFP4)
                bp[0] = (uint8_t)(115 + rng_below(r, 16));
            if (d_off >= 0)
                memcpy(bp + d_off, &d, 2);
            if (dmin_off >= 0)
                memcpy(bp + dmin_off, &dm, 2);
        }
    }
}

/* The kernel's 8-bit activations of one row, decoded: block-wise d = max|x|/127 and
 * q = round-to-even(x * (127/max|x|)), in the same float operations as quantize_q8_kernel. */
static void q8_replica(const float *x, int64_t n, double *out)
{
    for (int64_t b = 0; b < n; b += 32) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[b + i]));
        const float d = amax / 127.0f;
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int i = 0; i < 32; i++) {
            long q = lrintf(x[b + i] * id);
            q = q < -127 ? -127 : q > 127 ? 127 : q;
            out[b + i] = (double)d * (double)q;
        }
    }
}

static double bf16_round(float v)
{
    return (double)bf16_to_f32(bf16_from_f32(v));
}

/* ---- one case: host data, device buffers, a call, the check ---- */

struct mm_case {
    uint32_t type;
    int64_t n_in, n_out;
    int m;
    enum cuda_matmul_path path; /* forced path, or AUTO */
    enum cuda_matmul_tile tile; /* forced GEMM tile, or AUTO */
    size_t w_pad;               /* bytes of padding after each weight row */
    int x_pad;                  /* floats of padding after each activation row (x_stride - n_in) */
    size_t w_off;               /* byte offset of W from its allocation */
    bool gather;                /* activation rows through x_rows */
};

struct mm_data {
    struct mm_case c;
    size_t row_bytes, w_stride, w_bytes;
    int x_rows_n; /* activation rows allocated */
    int64_t x_stride, y_stride;
    uint8_t *wh;      /* host weights */
    float *xh;        /* host activations (x_rows_n rows of x_stride) */
    int32_t *rows_h;  /* host gather list (m) or NULL */
    float *yh;        /* host copy of y (m rows of y_stride) */
    uint8_t *wd_base; /* device allocation of W; W is at wd_base + w_off */
    float *xd, *yd;
    int32_t *rows_d;
    void *scratch;
    size_t scratch_bytes;
    struct cuda_matmul_args a;
};

static int data_setup(struct mm_data *d, const struct mm_case *c, struct rng *r, void *stream)
{
    memset(d, 0, sizeof *d);
    d->c = *c;
    d->row_bytes = type_row_bytes(c->type, c->n_in);
    d->w_stride = d->row_bytes + c->w_pad;
    d->w_bytes = (size_t)(c->n_out - 1) * d->w_stride + d->row_bytes;
    d->x_rows_n = c->gather ? c->m + 3 : c->m;
    d->x_stride = c->n_in + c->x_pad;
    d->y_stride = c->n_out + 3;

    d->wh = (uint8_t *)xmalloc(d->w_bytes);
    fill_weights(c->type, d->wh, c->n_out, c->n_in, d->w_stride, r);
    const size_t xn = (size_t)d->x_rows_n * (size_t)d->x_stride;
    d->xh = (float *)xmalloc(xn * sizeof(float));
    for (size_t i = 0; i < xn; i++)
        d->xh[i] = rng_normal(r);
    for (int i = 0; i < 32 && i < c->n_in; i++) /* an all-zero block: d = 0 */
        d->xh[i] = 0.0f;
    if (d->x_rows_n > 1) /* a row of large values */
        for (int64_t i = 0; i < c->n_in; i++)
            d->xh[d->x_stride + i] *= 100.0f;
    if (c->gather) {
        d->rows_h = (int32_t *)xmalloc((size_t)c->m * sizeof(int32_t));
        for (int j = 0; j < c->m; j++)
            d->rows_h[j] = (int32_t)rng_below(r, (uint32_t)d->x_rows_n);
        if (c->m > 1)
            d->rows_h[c->m - 1] = d->rows_h[0]; /* a repeat */
    }
    const size_t yn = (size_t)c->m * (size_t)d->y_stride;
    d->yh = (float *)xmalloc(yn * sizeof(float));
    test_poison_f32(d->yh, yn);

    d->scratch_bytes = cuda_matmul_scratch_bytes(c->type, c->n_in, c->n_out, c->m);
    int rc = cuda_malloc((void **)&d->wd_base, d->w_bytes + c->w_off);
    rc = rc ? rc : cuda_malloc((void **)&d->xd, xn * sizeof(float));
    rc = rc ? rc : cuda_malloc((void **)&d->yd, yn * sizeof(float));
    if (c->gather)
        rc = rc ? rc : cuda_malloc((void **)&d->rows_d, (size_t)c->m * sizeof(int32_t));
    if (d->scratch_bytes)
        rc = rc ? rc : cuda_malloc(&d->scratch, d->scratch_bytes);
    if (rc)
        return rc;
    rc = cuda_h2d(d->wd_base + c->w_off, d->wh, d->w_bytes, stream);
    rc = rc ? rc : cuda_h2d(d->xd, d->xh, xn * sizeof(float), stream);
    rc = rc ? rc : cuda_h2d(d->yd, d->yh, yn * sizeof(float), stream);
    if (c->gather)
        rc = rc ? rc : cuda_h2d(d->rows_d, d->rows_h, (size_t)c->m * sizeof(int32_t), stream);
    if (d->scratch_bytes)
        rc = rc ? rc : cuda_memset(d->scratch, 0xA5, d->scratch_bytes, stream);
    rc = rc ? rc : cuda_stream_sync(stream);

    struct cuda_matmul_args *a = &d->a;
    a->wtype = c->type;
    a->w = d->wd_base + c->w_off;
    a->w_stride = d->w_stride;
    a->n_in = c->n_in;
    a->n_out = c->n_out;
    a->m = c->m;
    a->x = d->xd;
    a->x_stride = d->x_stride;
    a->x_rows = d->rows_d;
    a->y = d->yd;
    a->y_stride = d->y_stride;
    a->scratch = d->scratch;
    a->scratch_bytes = d->scratch_bytes;
    a->path = c->path;
    a->tile = c->tile;
    a->stream = stream;
    return rc;
}

static void data_free(struct mm_data *d)
{
    cuda_free(d->wd_base), cuda_free(d->xd), cuda_free(d->yd), cuda_free(d->rows_d);
    cuda_free(d->scratch);
    free(d->wh), free(d->xh), free(d->rows_h), free(d->yh);
}

/* Runs the call and copies y back into d->yh. */
static int data_run(struct mm_data *d)
{
    int rc = cuda_matmul(&d->a);
    if (rc)
        return rc;
    const size_t yn = (size_t)d->c.m * (size_t)d->y_stride;
    rc = cuda_d2h(d->yh, d->yd, yn * sizeof(float), d->a.stream);
    return rc ? rc : cuda_stream_sync(d->a.stream);
}

struct case_result {
    double bound_frac; /* worst |y - ref| / bound */
    double err_float;  /* worst |y - float reference| / sum |w x| */
    bool pass;
};

static const char *tile_name(enum cuda_matmul_tile t)
{
    switch (t) {
    case CUDA_MATMUL_TILE_128X128:
        return " tile 128x128";
    case CUDA_MATMUL_TILE_64X128:
        return " tile 64x128";
    case CUDA_MATMUL_TILE_64X64:
        return " tile 64x64";
    case CUDA_MATMUL_TILE_32X64:
        return " tile 32x64";
    default:
        return "";
    }
}

static void case_describe(const struct mm_case *c, char *buf, size_t size)
{
    snprintf(buf, size, "%s %s%s m %d n_in %lld n_out %lld w_pad %zu w_off %zu x_pad %d%s",
             quant_type_name(c->type), path_name(path_expected(c->type, c->m, c->path)),
             tile_name(c->tile), c->m, (long long)c->n_in, (long long)c->n_out, c->w_pad, c->w_off,
             c->x_pad, c->gather ? " gather" : "");
}

/* What one output must be: the exact sum of the products the kernel forms, the error allowed,
 * and the plain float reference with its magnitude (for information). */
struct ref_out {
    double want, bound, fref, fmag;
};

/* The (m, n_out) expected outputs of a case, by the rules in the header comment. */
static struct ref_out *case_reference(const struct mm_data *d)
{
    const struct mm_case *c = &d->c;
    const int64_t n = c->n_in;
    const enum cuda_matmul_path path = path_expected(c->type, c->m, c->path);
    const bool q8 = path == CUDA_MATMUL_PATH_MMV && is_quantized(c->type);
    const double tol = path == CUDA_MATMUL_PATH_GEMM ? TOL_GEMM : TOL_ACC;

    /* weights as decoded (wf) and as multiplied by the kernel (wk) */
    float *wf = (float *)xmalloc((size_t)(c->n_out * n) * sizeof(float));
    double *wk = (double *)xmalloc((size_t)(c->n_out * n) * sizeof(double));
    for (int64_t o = 0; o < c->n_out; o++) {
        CHECK(quant_ref_dequantize(c->type, d->wh + o * d->w_stride, wf + o * n, n) == 0,
              "quant_ref cannot decode %s", quant_type_name(c->type));
        for (int64_t i = 0; i < n; i++)
            wk[o * n + i] =
                path == CUDA_MATMUL_PATH_GEMM ? bf16_round(wf[o * n + i]) : (double)wf[o * n + i];
    }
    /* activations as multiplied by the kernel, per allocated row */
    double *ak = (double *)xmalloc((size_t)d->x_rows_n * (size_t)n * sizeof(double));
    for (int r = 0; r < d->x_rows_n; r++) {
        const float *x = d->xh + r * d->x_stride;
        double *a = ak + (int64_t)r * n;
        if (q8)
            q8_replica(x, n, a);
        else
            for (int64_t i = 0; i < n; i++)
                a[i] = path == CUDA_MATMUL_PATH_GEMM ? bf16_round(x[i]) : (double)x[i];
    }

    struct ref_out *ref =
        (struct ref_out *)xmalloc((size_t)c->m * (size_t)c->n_out * sizeof(struct ref_out));
    for (int j = 0; j < c->m; j++) {
        const int xr = d->rows_h ? d->rows_h[j] : j;
        const float *x = d->xh + xr * d->x_stride;
        const double *a = ak + (int64_t)xr * n;
        for (int64_t o = 0; o < c->n_out; o++) {
            const double *w = wk + o * n;
            const float *wfo = wf + o * n;
            double s = 0, mag = 0, f = 0, fmag = 0;
            for (int64_t i = 0; i < n; i++) {
                s += w[i] * a[i];
                mag += fabs(w[i] * a[i]);
                f += (double)wfo[i] * x[i];
                fmag += fabs((double)wfo[i] * x[i]);
            }
            struct ref_out *e = &ref[(int64_t)j * c->n_out + o];
            e->want = s;
            e->bound = tol * mag + 1e-30;
            e->fref = f;
            e->fmag = fmag;
        }
    }
    free(wf), free(wk), free(ak);
    return ref;
}

/* Checks d->yh against the expected outputs; the padding between output rows must be NaN. */
static struct case_result case_compare(const struct mm_data *d, const struct ref_out *ref)
{
    const struct mm_case *c = &d->c;
    struct case_result res = {0, 0, true};
    char desc[160];
    case_describe(c, desc, sizeof desc);
    int bad = 0, touched = 0;
    for (int j = 0; j < c->m; j++) {
        for (int64_t o = 0; o < c->n_out; o++) {
            const struct ref_out *e = &ref[(int64_t)j * c->n_out + o];
            const double got = d->yh[j * d->y_stride + o];
            const double diff = fabs(got - e->want);
            if (!(diff <= e->bound)) {
                if (bad < 3)
                    fprintf(stderr,
                            "  FAIL %s: y[%d][%lld] = %.9g, want %.9g (diff %.3g, bound %.3g; "
                            "float reference %.9g)\n",
                            desc, j, (long long)o, got, e->want, diff, e->bound, e->fref);
                bad++;
            }
            res.bound_frac = fmax(res.bound_frac, isnan(diff) ? INFINITY : diff / e->bound);
            res.err_float = fmax(res.err_float,
                                 isnan(got) ? INFINITY : fabs(got - e->fref) / (e->fmag + 1e-30));
        }
        for (int64_t o = c->n_out; o < d->y_stride; o++)
            touched += !isnan(d->yh[j * d->y_stride + o]);
    }
    CHECK(bad == 0, "%s: %d of %lld outputs beyond the error bound (worst %.3g of it)", desc, bad,
          (long long)(c->m * c->n_out), res.bound_frac);
    CHECK(touched == 0, "%s: %d padding outputs written", desc, touched);
    res.pass = bad == 0 && touched == 0;
    return res;
}

static struct case_result case_check(const struct mm_data *d)
{
    struct ref_out *ref = case_reference(d);
    const struct case_result res = case_compare(d, ref);
    free(ref);
    return res;
}

static struct case_result case_run(const struct mm_case *c, struct rng *r, void *stream)
{
    struct mm_data d;
    struct case_result res = {0, 0, false};
    char desc[160];
    case_describe(c, desc, sizeof desc);
    int rc = data_setup(&d, c, r, stream);
    CHECK(rc == 0, "%s: setup failed (%d)", desc, rc);
    if (rc == 0) {
        rc = data_run(&d);
        CHECK(rc == 0, "%s: cuda_matmul failed (%d)", desc, rc);
        if (rc == 0)
            res = case_check(&d);
    }
    data_free(&d);
    return res;
}

/* ---- correctness over types, m and shapes ---- */

/* The n_in of shape k (0..3) for a type: small, partial tiles, large, several tiles. */
static int64_t shape_n_in(uint32_t type, int k)
{
    static const int64_t q32[] = {256, 768, 2880, 5120};
    static const int64_t qk[] = {256, 768, 2048, 5120};
    static const int64_t fl[] = {256, 300, 2048, 2880};
    if (!is_quantized(type))
        return fl[k];
    return type_block(type) == QK_K ? qk[k] : q32[k];
}

static void test_types(struct rng *r, void *stream)
{
    /* (n_in shape index, n_out) pairs */
    static const struct {
        int k;
        int64_t n_out;
    } shapes[] = {{0, 1}, {0, 7}, {1, 130}, {1, 512}, {2, 2048}, {2, 4099}, {3, 7}};
    static const size_t offs[] = {0, 1, 2, 4, 6, 13};
    static const size_t pads[] = {0, 3, 16};
    int serial = 0;
    printf("  type  path    m  cases  worst/bound  err vs float  result\n");
    for (int t = 0; t < N_TYPES; t++) {
        const uint32_t type = types[t];
        for (int mi = 0; mi < N_MS; mi++) {
            const int m = ms[mi];
            struct case_result agg = {0, 0, true};
            int n = 0;
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                struct mm_case c = {};
                c.type = type;
                c.n_in = shape_n_in(type, shapes[s].k);
                c.n_out = shapes[s].n_out;
                c.m = m;
                if ((double)m * (double)c.n_in * (double)c.n_out > CASE_BUDGET)
                    continue;
                c.path = CUDA_MATMUL_PATH_AUTO;
                c.w_off = offs[serial % 6];
                c.w_pad = pads[serial % 3];
                c.x_pad = m % 2 ? 5 : 0;
                c.gather = serial % 3 == 1;
                serial++;
                const struct case_result cr = case_run(&c, r, stream);
                agg.bound_frac = fmax(agg.bound_frac, cr.bound_frac);
                agg.err_float = fmax(agg.err_float, cr.err_float);
                agg.pass = agg.pass && cr.pass;
                n++;
            }
            printf("  %-5s %-4s %4d  %5d  %11.3g  %12.3g  %s\n", quant_type_name(type),
                   path_name(path_expected(type, m, CUDA_MATMUL_PATH_AUTO)), m, n, agg.bound_frac,
                   agg.err_float, agg.pass ? "ok" : "FAIL");
        }
        fflush(stdout);
    }
}

/* One-row calls on matrices of many short rows (the output heads: rows of 2048 inputs, at
 * least MMV_PACK_MIN_ROWS of them) take four rows per warp: checked against the reference, and
 * bit for bit against the one-row-per-warp kernel, which a call of fewer rows takes, on the
 * same weights (a row count that is not a multiple of four leaves a partial last warp; the
 * odd weight offset an unaligned stage). */
static void test_pack(struct rng *r, void *stream)
{
    static const uint32_t pt[] = {QUANT_Q6_K, QUANT_Q4_K, QUANT_Q5_K, QUANT_Q4_0, QUANT_MXFP4};
    for (size_t t = 0; t < sizeof pt / sizeof pt[0]; t++) {
        struct mm_case c = {};
        c.type = pt[t];
        c.n_in = 2048;
        c.n_out = 16387;
        c.m = 1;
        c.path = CUDA_MATMUL_PATH_AUTO;
        c.w_off = t % 2 ? 6 : 0;
        char desc[160];
        case_describe(&c, desc, sizeof desc);
        struct mm_data d;
        int rc = data_setup(&d, &c, r, stream);
        CHECK(rc == 0, "%s: setup failed (%d)", desc, rc);
        if (rc == 0)
            rc = data_run(&d);
        CHECK(rc == 0, "%s: cuda_matmul failed (%d)", desc, rc);
        if (rc == 0) {
            const struct case_result cr = case_check(&d);
            const int64_t few = 4099; /* one row per warp */
            float *packed = (float *)xmalloc((size_t)few * sizeof(float));
            memcpy(packed, d.yh, (size_t)few * sizeof(float));
            d.a.n_out = few;
            rc = data_run(&d);
            size_t diff = 0;
            for (int64_t o = 0; rc == 0 && o < few; o++)
                diff += memcmp(&packed[o], &d.yh[o], sizeof(float)) != 0;
            printf("  packed rows %-5s n_out %lld: worst/bound %.3g, %zu of %lld outputs differ "
                   "from one row per warp\n",
                   quant_type_name(c.type), (long long)c.n_out, cr.bound_frac, diff,
                   (long long)few);
            CHECK(rc == 0 && diff == 0, "%s: %zu outputs differ from one row per warp (rc %d)",
                  desc, diff, rc);
            free(packed);
        }
        data_free(&d);
    }
}

/* Every GEMM tile on every type, on shapes that leave each edge ragged: m not a multiple of any
 * BM (33, 517) or of 64 (100), n_out not a multiple of BN (200, 130, 136), n_in ending inside a
 * raw stage and inside a 64-wide step (32-element blocks: 800, 288, 1056; K-quants: 768, 256 =
 * a single stage, 1280; F16/BF16: 302, 129, 1000), activation rows not 16-byte aligned (x_pad 5:
 * float loads, every fourth row aligned) and aligned (float4 loads; with F16/BF16 n_in 129 a
 * partial last float4), gathers with repeats, weights at odd offsets and strides. Each tile is
 * checked against the reference, and the tiles must agree bit for bit: every output is the same
 * float sum of the same mma.m16n8k16 steps in the same order whatever the tile. */
static void test_gemm_tiles(struct rng *r, void *stream)
{
    static const enum cuda_matmul_tile tiles[] = {CUDA_MATMUL_TILE_128X128, CUDA_MATMUL_TILE_64X128,
                                                  CUDA_MATMUL_TILE_64X64, CUDA_MATMUL_TILE_32X64};
    static const struct {
        int m;
        int64_t n_out;
        bool gather;
        size_t w_off, w_pad;
        int64_t n_in_q32, n_in_qk, n_in_fl;
    } shapes[] = {{33, 200, true, 1, 3, 800, 768, 302},
                  {100, 130, false, 6, 0, 288, 256, 129},
                  {517, 136, true, 13, 16, 1056, 1280, 1000}};
    const int nt = (int)(sizeof tiles / sizeof tiles[0]);
    for (int t = 0; t < N_TYPES; t++) {
        const uint32_t type = types[t];
        if (type == QUANT_F32)
            continue;
        struct case_result agg = {0, 0, true};
        bool same = true;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            struct mm_case c = {};
            c.type = type;
            c.n_in = !is_quantized(type)        ? shapes[s].n_in_fl
                     : type_block(type) == QK_K ? shapes[s].n_in_qk
                                                : shapes[s].n_in_q32;
            c.n_out = shapes[s].n_out;
            c.m = shapes[s].m;
            c.path = CUDA_MATMUL_PATH_GEMM;
            c.w_off = shapes[s].w_off;
            c.w_pad = shapes[s].w_pad;
            /* shape 0: most rows misaligned; the others: x_stride a multiple of 4 floats */
            c.x_pad = s == 0 ? 5 : (int)(4 * (s - 1) + (4 - c.n_in % 4) % 4);
            c.gather = shapes[s].gather;
            char desc[160];
            case_describe(&c, desc, sizeof desc);
            struct mm_data d;
            int rc = data_setup(&d, &c, r, stream);
            CHECK(rc == 0, "%s: setup failed (%d)", desc, rc);
            const size_t yn = (size_t)c.m * (size_t)d.y_stride;
            float *first = (float *)xmalloc(yn * sizeof(float));
            struct ref_out *ref = rc == 0 ? case_reference(&d) : NULL;
            for (int k = 0; rc == 0 && k < nt; k++) {
                d.c.tile = d.a.tile = tiles[k];
                case_describe(&d.c, desc, sizeof desc);
                test_poison_f32(d.yh, yn);
                rc = cuda_h2d(d.yd, d.yh, yn * sizeof(float), stream);
                rc = rc ? rc : data_run(&d);
                CHECK(rc == 0, "%s: cuda_matmul failed (%d)", desc, rc);
                if (rc)
                    break;
                const struct case_result cr = case_compare(&d, ref);
                agg.bound_frac = fmax(agg.bound_frac, cr.bound_frac);
                agg.err_float = fmax(agg.err_float, cr.err_float);
                agg.pass = agg.pass && cr.pass;
                if (k == 0) {
                    memcpy(first, d.yh, yn * sizeof(float));
                    continue;
                }
                for (int j = 0; j < c.m; j++) {
                    const bool eq =
                        memcmp(first + (size_t)j * d.y_stride, d.yh + (size_t)j * d.y_stride,
                               (size_t)c.n_out * sizeof(float)) == 0;
                    CHECK(eq, "%s: row %d differs from tile 128x128's bits", desc, j);
                    same = same && eq;
                    if (!eq)
                        break;
                }
            }
            agg.pass = agg.pass && rc == 0;
            free(ref);
            free(first);
            data_free(&d);
        }
        printf("  gemm tiles %-5s (4 tiles x 3 ragged shapes): worst %.3g of bound, err vs float "
               "%.3g, tiles %s  %s\n",
               quant_type_name(type), agg.bound_frac, agg.err_float,
               same ? "bit-identical" : "DIFFER", agg.pass && same ? "ok" : "FAIL");
        fflush(stdout);
    }
}

/* Both kernels outside their automatic range: GEMM for tiny m, MMV in several passes. */
static void test_forced_paths(struct rng *r, void *stream)
{
    int serial = 0;
    for (int t = 0; t < N_TYPES; t++) {
        const uint32_t type = types[t];
        const int64_t n_in = shape_n_in(type, 1);
        const struct {
            enum cuda_matmul_path path;
            int m;
            int64_t n_out;
        } cs[] = {{CUDA_MATMUL_PATH_GEMM, 1, 130},
                  {CUDA_MATMUL_PATH_GEMM, 5, 7},
                  {CUDA_MATMUL_PATH_MMV, 40, 130},
                  {CUDA_MATMUL_PATH_MMV, 64, 33}};
        struct case_result agg = {0, 0, true};
        for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
            if (type == QUANT_F32 && cs[k].path == CUDA_MATMUL_PATH_GEMM)
                continue;
            struct mm_case c = {};
            c.type = type;
            c.n_in = n_in;
            c.n_out = cs[k].n_out;
            c.m = cs[k].m;
            c.path = cs[k].path;
            c.w_off = (size_t)(serial % 3);
            c.w_pad = serial % 2 ? 5 : 0;
            c.x_pad = c.m % 2 ? 5 : 0;
            c.gather = serial % 2 == 0;
            serial++;
            const struct case_result cr = case_run(&c, r, stream);
            agg.bound_frac = fmax(agg.bound_frac, cr.bound_frac);
            agg.pass = agg.pass && cr.pass;
        }
        printf("  forced paths %-5s (gemm m 1, 5; mmv m 40, 64): worst %.3g of bound  %s\n",
               quant_type_name(type), agg.bound_frac, agg.pass ? "ok" : "FAIL");
    }
}

/* ---- graph capture ---- */

static void test_graph(struct rng *r, void *stream)
{
    const struct {
        uint32_t type;
        int m;
        int64_t n_in, n_out;
        bool gather;
    } cs[] = {{QUANT_Q4_K, 1, 2048, 300, false}, {QUANT_Q8_0, 8, 2880, 300, true},
              {QUANT_MXFP4, 3, 2880, 77, true},  {QUANT_Q6_K, 64, 768, 300, false},
              {QUANT_F32, 5, 300, 300, false},   {QUANT_BF16, 40, 2048, 130, true}};
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
        struct mm_case c = {};
        c.type = cs[k].type;
        c.n_in = cs[k].n_in;
        c.n_out = cs[k].n_out;
        c.m = cs[k].m;
        c.path = CUDA_MATMUL_PATH_AUTO;
        c.w_pad = 2;
        c.w_off = 1;
        c.x_pad = c.m % 2 ? 5 : 0;
        c.gather = cs[k].gather;
        char desc[160];
        case_describe(&c, desc, sizeof desc);
        struct mm_data d;
        int rc = data_setup(&d, &c, r, stream);
        rc = rc ? rc : data_run(&d);
        CHECK(rc == 0, "graph %s: direct call failed (%d)", desc, rc);
        const size_t yn = (size_t)c.m * (size_t)d.y_stride;
        float *direct = (float *)xmalloc(yn * sizeof(float));
        memcpy(direct, d.yh, yn * sizeof(float));

        cudaGraph_t graph = NULL;
        cudaGraphExec_t exec = NULL;
        cudaStream_t st = (cudaStream_t)stream;
        int crc = -1;
        bool ok =
            rc == 0 && cuda_memset(d.yd, 0xFF, yn * sizeof(float), stream) == 0 &&
            CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal)) == cudaSuccess;
        if (ok) {
            crc = cuda_matmul(&d.a);
            ok = CUDA_CHECK(cudaStreamEndCapture(st, &graph)) == cudaSuccess && crc == 0;
        }
        ok = ok && CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0)) == cudaSuccess;
        for (int rep = 0; ok && rep < 2; rep++) {
            ok = CUDA_CHECK(cudaGraphLaunch(exec, st)) == cudaSuccess &&
                 cuda_d2h(d.yh, d.yd, yn * sizeof(float), stream) == 0 &&
                 cuda_stream_sync(stream) == 0;
            CHECK(ok, "graph %s: capture or replay failed (cuda_matmul in capture: %d)", desc, crc);
            /* outputs only: the padding between rows holds each run's own poison */
            for (int j = 0; ok && j < c.m; j++)
                CHECK(memcmp(direct + (size_t)j * d.y_stride, d.yh + (size_t)j * d.y_stride,
                             (size_t)c.n_out * sizeof(float)) == 0,
                      "graph %s: replay %d row %d differs from the direct call", desc, rep, j);
        }
        CHECK(ok, "graph %s: capture failed (cuda_matmul in capture: %d)", desc, crc);
        if (exec)
            cudaGraphExecDestroy(exec);
        if (graph)
            cudaGraphDestroy(graph);
        free(direct);
        data_free(&d);
    }
    printf("  graph capture and replay: %zu cases checked bit for bit\n", sizeof cs / sizeof cs[0]);
}

/* ---- an m-row call against m one-row calls ---- */

/* Each row of an m-row MMV call (2 to 8 rows: lockstep decode steps; the 32-element block types
 * take two weight rows per warp there) equals a one-row call on that row alone, bit for bit:
 * the dots take the same parts in the same order and reduce the same way. Odd row counts leave
 * a warp whose second row is past the end; misaligned rows (w_off) stage across granules. */
static void test_rows_bitwise(struct rng *r, void *stream)
{
    static const uint32_t ts[] = {QUANT_Q8_0, QUANT_Q4_0, QUANT_MXFP4, QUANT_Q4_K, QUANT_Q6_K};
    static const int mv[] = {2, 3, 5, 8};
    static const int64_t n_outs[] = {257, 2048, 9};
    size_t cases = 0, bad_total = 0;
    for (size_t t = 0; t < sizeof ts / sizeof ts[0]; t++)
        for (size_t k = 0; k < sizeof mv / sizeof mv[0]; k++) {
            const uint32_t type = ts[t];
            const int m = mv[k];
            const int64_t n_in = type_block(type) == QK_K ? 2048 : 2880;
            const int64_t n_out = n_outs[(t + k) % 3];
            const size_t rb = type_row_bytes(type, n_in), stride = rb + (k % 2 ? 3 : 0);
            const size_t w_off = (t + k) % 2 ? 6 : 0;
            const size_t wb = w_off + stride * (size_t)n_out;
            uint8_t *w = (uint8_t *)xmalloc(wb);
            memset(w, 0, wb);
            fill_weights(type, w + w_off, n_out, n_in, stride, r);
            float *x = (float *)xmalloc(sizeof(float) * (size_t)m * n_in);
            for (int64_t i = 0; i < (int64_t)m * n_in; i++)
                x[i] = rng_normal(r);
            uint8_t *d_w = NULL;
            float *d_x = NULL, *d_y[2] = {};
            void *scratch = NULL;
            const size_t sb = cuda_matmul_scratch_bytes(type, n_in, n_out, m);
            const size_t yb = sizeof(float) * (size_t)m * n_out;
            int rc = cuda_malloc((void **)&d_w, wb);
            rc = rc ? rc : cuda_h2d(d_w, w, wb, stream);
            rc = rc ? rc : cuda_malloc((void **)&d_x, sizeof(float) * (size_t)m * n_in);
            rc = rc ? rc : cuda_h2d(d_x, x, sizeof(float) * (size_t)m * n_in, stream);
            rc = rc ? rc : cuda_malloc(&scratch, sb ? sb : 16);
            for (int v = 0; v < 2; v++) {
                rc = rc ? rc : cuda_malloc((void **)&d_y[v], yb);
                rc = rc ? rc : cuda_memset(d_y[v], 0xFF, yb, stream);
            }
            struct cuda_matmul_args a = {};
            a.wtype = type, a.w = d_w + w_off, a.w_stride = stride, a.n_in = n_in;
            a.n_out = n_out, a.x_stride = n_in, a.y_stride = n_out;
            a.scratch = scratch, a.scratch_bytes = sb, a.stream = stream;
            for (int j = 0; !rc && j < m; j++) { /* one row at a time */
                struct cuda_matmul_args one = a;
                one.m = 1, one.x = d_x + (size_t)j * n_in, one.y = d_y[0] + (size_t)j * n_out;
                rc = cuda_matmul(&one);
            }
            a.m = m, a.x = d_x, a.y = d_y[1];
            rc = rc ? rc : cuda_matmul(&a);
            size_t bad = 0;
            if (!rc) {
                float *y0 = (float *)xmalloc(yb), *y1 = (float *)xmalloc(yb);
                rc = cuda_d2h(y0, d_y[0], yb, stream);
                rc = rc ? rc : cuda_d2h(y1, d_y[1], yb, stream);
                rc = rc ? rc : cuda_stream_sync(stream);
                for (size_t i = 0; !rc && i < (size_t)m * n_out; i++)
                    bad += memcmp(&y0[i], &y1[i], sizeof(float)) != 0;
                free(y0), free(y1);
            }
            CHECK(rc == 0 && bad == 0,
                  "rows bitwise %s m %d n_out %lld: rc %d, %zu of %lld outputs differ from "
                  "one-row calls",
                  quant_type_name(type), m, (long long)n_out, rc, bad, (long long)m * n_out);
            cases++;
            bad_total += bad;
            cuda_free(d_w), cuda_free(d_x), cuda_free(d_y[0]), cuda_free(d_y[1]);
            cuda_free(scratch);
            free(w), free(x);
        }
    printf("  m-row calls against one-row calls: %zu cases, %zu outputs differ\n", cases,
           bad_total);
}

/* ---- further matrices in one call ---- */

/* A call with more[] against one call per matrix (the later ones with x_ready), bit for bit:
 * one launch where every matrix takes the same MMV kernel (a warp per row, or a block per row
 * for two routers), one call each elsewhere (m = 1 with a short matrix and a long one, the
 * GEMM path, F32 float32 tiles). Every other case gives each matrix a bias, which the
 * reference adds by cuda_add_bias after its plain call: the same bits again. */
static void test_more(struct rng *r, void *stream)
{
    const struct {
        uint32_t type;
        int m, n_more;
        int64_t n_in, n_out[3];
    } cs[] = {
        {QUANT_Q8_0, 1, 2, 2048, {4096, 512, 512}}, {QUANT_Q4_K, 1, 2, 2048, {1024, 300, 257}},
        {QUANT_Q6_K, 3, 2, 768, {200, 64, 64}},     {QUANT_Q8_0, 1, 1, 2880, {4096, 100, 0}},
        {QUANT_Q4_0, 16, 2, 512, {96, 32, 33}},     {QUANT_Q8_0, 40, 2, 1024, {256, 64, 64}},
        {QUANT_F32, 1, 2, 300, {400, 300, 300}},    {QUANT_MXFP4, 8, 1, 2880, {512, 512, 0}},
        {QUANT_F32, 1, 1, 2048, {128, 128, 0}},     {QUANT_F32, 8, 1, 2048, {128, 128, 0}},
        {QUANT_F32, 2, 2, 256, {100, 100, 56}},     {QUANT_F32, 64, 1, 256, {128, 128, 0}},
        {QUANT_Q8_0, 8, 2, 1024, {263, 260, 301}},
    };
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
        const uint32_t type = cs[k].type;
        const int m = cs[k].m, nm = 1 + cs[k].n_more;
        const int64_t n_in = cs[k].n_in;
        const size_t rb = type_row_bytes(type, n_in), stride = rb + 16;
        float *x = (float *)xmalloc(sizeof(float) * (size_t)m * n_in);
        for (int64_t i = 0; i < (int64_t)m * n_in; i++)
            x[i] = rng_normal(r);
        float *d_x = NULL, *d_y[2][3] = {}, *d_b[3] = {};
        const bool biased = k % 2 == 1;
        uint8_t *d_w[3] = {};
        void *scratch = NULL;
        const size_t sb = cuda_matmul_scratch_bytes(type, n_in, 1, m);
        int rc = cuda_malloc((void **)&d_x, sizeof(float) * (size_t)m * n_in);
        rc = rc ? rc : cuda_h2d(d_x, x, sizeof(float) * (size_t)m * n_in, stream);
        rc = rc ? rc : cuda_malloc(&scratch, sb ? sb : 16);
        for (int i = 0; !rc && i < nm; i++) {
            const int64_t no = cs[k].n_out[i];
            uint8_t *w = (uint8_t *)xmalloc(stride * (size_t)no);
            fill_weights(type, w, no, n_in, stride, r);
            rc = cuda_malloc((void **)&d_w[i], stride * (size_t)no);
            rc = rc ? rc : cuda_h2d(d_w[i], w, (size_t)(no - 1) * stride + rb, stream);
            for (int v = 0; !rc && v < 2; v++) {
                rc = cuda_malloc((void **)&d_y[v][i], sizeof(float) * (size_t)m * no);
                rc = rc ? rc : cuda_memset(d_y[v][i], 0xFF, sizeof(float) * (size_t)m * no, stream);
            }
            if (biased) {
                float *b = (float *)xmalloc(sizeof(float) * (size_t)no);
                for (int64_t j = 0; j < no; j++)
                    b[j] = 3.0f * rng_normal(r);
                rc = rc ? rc : cuda_malloc((void **)&d_b[i], sizeof(float) * (size_t)no);
                rc = rc ? rc : cuda_h2d(d_b[i], b, sizeof(float) * (size_t)no, stream);
                free(b);
            }
            free(w);
        }
        CHECK(rc == 0, "more case %zu: setup failed (%d)", k, rc);
        struct cuda_matmul_args a = {};
        a.wtype = type, a.n_in = n_in, a.m = m, a.x = d_x, a.x_stride = n_in;
        a.scratch = scratch, a.scratch_bytes = sb, a.stream = stream;
        int rs = 0;
        for (int i = 0; !rc && i < nm; i++) { /* one call per matrix */
            struct cuda_matmul_args one = a;
            one.w = d_w[i], one.w_stride = stride, one.n_out = cs[k].n_out[i];
            one.y = d_y[0][i], one.y_stride = cs[k].n_out[i];
            one.x_ready = i > 0 && is_quantized(type) && m < CUDA_MATMUL_GEMM_MIN_M;
            rs = rs ? rs : cuda_matmul(&one);
            if (biased)
                rs = rs ? rs : cuda_add_bias(d_y[0][i], d_b[i], m, (int)cs[k].n_out[i], stream);
        }
        a.w = d_w[0], a.w_stride = stride, a.n_out = cs[k].n_out[0];
        a.y = d_y[1][0], a.y_stride = cs[k].n_out[0], a.bias = d_b[0];
        a.n_more = nm - 1;
        for (int i = 1; i < nm; i++)
            a.more[i - 1] = (struct cuda_matmul_more){d_w[i],    stride,         cs[k].n_out[i],
                                                      d_y[1][i], cs[k].n_out[i], d_b[i]};
        int rt = rc ? rc : cuda_matmul(&a);
        size_t bad = 0;
        for (int i = 0; !rc && i < nm; i++) {
            const size_t n = (size_t)m * cs[k].n_out[i];
            float *y0 = (float *)xmalloc(sizeof(float) * n),
                  *y1 = (float *)xmalloc(sizeof(float) * n);
            cuda_d2h(y0, d_y[0][i], sizeof(float) * n, stream);
            cuda_d2h(y1, d_y[1][i], sizeof(float) * n, stream);
            cuda_stream_sync(stream);
            for (size_t j = 0; j < n; j++)
                bad += memcmp(&y0[j], &y1[j], sizeof(float)) != 0;
            free(y0), free(y1);
        }
        printf("  %d matrices in one call%s, type %u, m %d, n_in %lld: rc %d/%d, %zu outputs "
               "differ\n",
               nm, biased ? " with biases" : "", type, m, (long long)n_in, rs, rt, bad);
        CHECK(rc == 0 && rs == 0 && rt == 0 && bad == 0,
              "more case %zu: rc %d/%d, %zu outputs differ from one call per matrix", k, rs, rt,
              bad);
        for (int i = 0; i < nm; i++)
            cuda_free(d_w[i]), cuda_free(d_y[0][i]), cuda_free(d_y[1][i]), cuda_free(d_b[i]);
        cuda_free(d_x), cuda_free(scratch);
        free(x);
    }
}

/* ---- arguments ---- */

static void test_args(void)
{
    alignas(16) static float dummy[1024];
    uint8_t *w = (uint8_t *)dummy;
    struct cuda_matmul_args ok;
    memset(&ok, 0, sizeof ok);
    ok.wtype = QUANT_Q4_K;
    ok.w = w;
    ok.w_stride = 144;
    ok.n_in = 256;
    ok.n_out = 1;
    ok.m = 1;
    ok.x = dummy;
    ok.x_stride = 256;
    ok.y = dummy + 512;
    ok.y_stride = 1;
    ok.scratch = dummy + 768;
    ok.scratch_bytes = cuda_matmul_scratch_bytes(QUANT_Q4_K, 256, 1, 1);
    CHECK(ok.scratch_bytes > 0 && ok.scratch_bytes <= 1024, "scratch for 256 Q4_K: %zu",
          ok.scratch_bytes);
    CHECK(cuda_matmul_check(&ok) == 0, "valid arguments refused");
    struct cuda_matmul_args a = ok;
    a.m = 0;
    CHECK(cuda_matmul(&a) == -EINVAL, "m = 0 accepted");
    a = ok, a.n_in = 128;
    CHECK(cuda_matmul(&a) == -EINVAL, "n_in not a block multiple accepted");
    a = ok, a.wtype = QUANT_Q4_1;
    CHECK(cuda_matmul(&a) == -EINVAL, "unsupported type accepted");
    a = ok, a.w_stride = 143;
    CHECK(cuda_matmul(&a) == -EINVAL, "short weight stride accepted");
    a = ok, a.scratch_bytes -= 1;
    CHECK(cuda_matmul(&a) == -EINVAL, "small scratch accepted");
    a = ok, a.scratch = (uint8_t *)a.scratch + 4;
    CHECK(cuda_matmul(&a) == -EINVAL, "misaligned scratch accepted");
    a = ok, a.scratch = NULL;
    CHECK(cuda_matmul(&a) == -EINVAL, "missing scratch accepted");
    a = ok, a.y = NULL;
    CHECK(cuda_matmul(&a) == -EINVAL, "NULL y accepted");
    a = ok, a.x = (const float *)(w + 2);
    CHECK(cuda_matmul(&a) == -EINVAL, "misaligned x accepted");
    a = ok, a.x_stride = 255;
    CHECK(cuda_matmul(&a) == -EINVAL, "short x stride accepted");
    a = ok, a.m = 2, a.y_stride = 0;
    CHECK(cuda_matmul(&a) == -EINVAL, "short y stride accepted");
    a = ok, a.path = (enum cuda_matmul_path)7;
    CHECK(cuda_matmul(&a) == -EINVAL, "unknown path accepted");
    a = ok, a.wtype = QUANT_F32, a.w_stride = 1024, a.path = CUDA_MATMUL_PATH_GEMM;
    CHECK(cuda_matmul(&a) == -EINVAL, "GEMM for F32 accepted");
    a = ok, a.path = CUDA_MATMUL_PATH_GEMM, a.scratch = NULL, a.scratch_bytes = 0;
    CHECK(cuda_matmul_check(&a) == 0, "GEMM without scratch refused");
    a.tile = CUDA_MATMUL_TILE_32X64;
    CHECK(cuda_matmul_check(&a) == 0, "GEMM with a forced tile refused");
    a.tile = (enum cuda_matmul_tile)9;
    CHECK(cuda_matmul(&a) == -EINVAL, "unknown GEMM tile accepted");
    a.tile = CUDA_MATMUL_TILE_AUTO, a.m = 65535 * 32 + 1;
    CHECK(cuda_matmul_check(&a) == -EINVAL, "GEMM grid beyond 65535 rows of 32 accepted");
    a = ok, a.wtype = QUANT_F16, a.n_in = 300, a.w_stride = 600, a.x_stride = 300;
    a.scratch = NULL, a.scratch_bytes = 0;
    CHECK(cuda_matmul_check(&a) == 0, "F16 n_in 300 without scratch refused");
    CHECK(!cuda_matmul_supported(QUANT_Q2_K) && cuda_matmul_supported(QUANT_MXFP4),
          "supported types");

    /* scratch sizes never shrink as m grows, so one buffer serves every smaller call */
    for (int t = 0; t < N_TYPES; t++)
        for (int m = 1; m < 600; m++)
            CHECK(cuda_matmul_scratch_bytes(types[t], 2048, 64, m + 1) >=
                      cuda_matmul_scratch_bytes(types[t], 2048, 64, m),
                  "%s scratch shrinks at m %d", quant_type_name(types[t]), m);
    printf("  argument checks done\n");
}

/* ---- timing (informational) ---- */

__global__ void fill_random_kernel(uint32_t *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 0x9E3779B1u ^ seed;
        h ^= h >> 15, h *= 0x85EBCA77u, h ^= h >> 13, h *= 0xC2B2AE3Du, h ^= h >> 16;
        p[i] = h;
    }
}

/* Reads n 16-byte words; writes only if the xor of everything is a magic value. */
__global__ void read_kernel(const uint4 *p, size_t n, uint32_t *out)
{
    uint32_t acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u)
        *out = acc;
}

/* Median milliseconds of 20 calls of fn(arg) on stream after 3 warm-ups; < 0 on failure. */
template <typename Fn> static float time_median(Fn fn, cudaStream_t st)
{
    enum { WARM = 3, REPS = 20 };
    cudaEvent_t ev[2 * REPS];
    float ms_v[REPS];
    for (int i = 0; i < 2 * REPS; i++)
        if (CUDA_CHECK(cudaEventCreate(&ev[i])) != cudaSuccess)
            return -1;
    bool ok = true;
    for (int i = 0; i < WARM && ok; i++)
        ok = fn() == 0;
    for (int i = 0; i < REPS && ok; i++) {
        ok = CUDA_CHECK(cudaEventRecord(ev[2 * i], st)) == cudaSuccess && fn() == 0 &&
             CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], st)) == cudaSuccess;
    }
    ok = ok && CUDA_CHECK(cudaStreamSynchronize(st)) == cudaSuccess;
    for (int i = 0; i < REPS && ok; i++)
        ok = CUDA_CHECK(cudaEventElapsedTime(&ms_v[i], ev[2 * i], ev[2 * i + 1])) == cudaSuccess;
    for (int i = 0; i < 2 * REPS; i++)
        cudaEventDestroy(ev[i]);
    if (!ok)
        return -1;
    qsort(ms_v, REPS, sizeof(float), test_cmp_float);
    return 0.5f * (ms_v[REPS / 2 - 1] + ms_v[REPS / 2]);
}

/* GEMM m = 512 on prefill shapes of a 2048-wide model, per tile (auto first), Q8_0 and Q4_K:
 * microseconds and TFLOP/s (median of 20). w, x, y: the bench buffers (256 MB, 512 x 4096,
 * 512 x 14336 floats). */
static void bench_gemm_tiles(const uint8_t *w, const float *x, float *y, cudaStream_t st)
{
    static const uint32_t btypes[] = {QUANT_Q8_0, QUANT_Q4_K};
    static const int64_t shapes[][2] = {{4096, 2048}, {2048, 4096}, {512, 2048}}; /* n_out, n_in */
    const int m = 512;
    printf("  bench: gemm m=512  type  n_out x n_in   auto      128x128   64x128    64x64     "
           "32x64   (us, TFLOP/s of auto)\n");
    for (size_t t = 0; t < sizeof btypes / sizeof btypes[0]; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            struct cuda_matmul_args a;
            memset(&a, 0, sizeof a);
            a.wtype = btypes[t];
            a.w = w;
            a.n_in = shapes[s][1];
            a.n_out = shapes[s][0];
            a.w_stride = type_row_bytes(a.wtype, a.n_in);
            a.m = m;
            a.x = x;
            a.x_stride = a.n_in;
            a.y = y;
            a.y_stride = a.n_out;
            a.path = CUDA_MATMUL_PATH_GEMM;
            a.stream = st;
            float us[5];
            for (int k = 0; k < 5; k++) {
                a.tile = (enum cuda_matmul_tile)k;
                us[k] = 1e3f * time_median([&]() { return cuda_matmul(&a); }, st);
            }
            const double flop = 2.0 * m * (double)a.n_in * (double)a.n_out;
            printf("  bench: gemm m=512  %-5s %5lld x %-5lld %8.1f  %8.1f  %8.1f  %8.1f  %8.1f  "
                   "%6.1f\n",
                   quant_type_name(a.wtype), (long long)a.n_out, (long long)a.n_in, us[0], us[1],
                   us[2], us[3], us[4], flop / (us[0] * 1e-6) / 1e12);
            CHECK(us[0] > 0 && us[1] > 0 && us[2] > 0 && us[3] > 0 && us[4] > 0,
                  "bench gemm %s: a timed call failed", quant_type_name(a.wtype));
            fflush(stdout);
        }
}

static void bench(void *stream)
{
    const size_t wbytes = (size_t)256 << 20;
    const int64_t n_in = 4096, n_gemm = 14336;
    const int m_max = 512;
    cudaStream_t st = (cudaStream_t)stream;
    uint8_t *w = NULL;
    float *x = NULL, *y = NULL;
    void *scratch = NULL;
    uint32_t *sink = NULL;
    size_t sbytes = 0;
    for (int t = 0; t < N_TYPES; t++) {
        const size_t s = cuda_matmul_scratch_bytes(types[t], n_in, n_gemm, m_max);
        sbytes = s > sbytes ? s : sbytes;
    }
    /* y: m = 1 and 8 over the whole 256 MB (at most wbytes / 2048 rows), m = 512 over n_gemm */
    const size_t yfloats =
        (size_t)m_max * n_gemm > 8 * (wbytes / 2048) ? (size_t)m_max * n_gemm : 8 * (wbytes / 2048);
    int rc = cuda_malloc((void **)&w, wbytes);
    rc = rc ? rc : cuda_malloc((void **)&x, (size_t)m_max * n_in * sizeof(float));
    rc = rc ? rc : cuda_malloc((void **)&y, yfloats * sizeof(float));
    rc = rc ? rc : cuda_malloc(&scratch, sbytes);
    rc = rc ? rc : cuda_malloc((void **)&sink, sizeof(uint32_t));
    CHECK(rc == 0, "bench: allocation failed (%d)", rc);
    if (rc == 0) {
        fill_random_kernel<<<1024, 256, 0, st>>>((uint32_t *)w, wbytes / 4, 0x1234u);
        fill_random_kernel<<<256, 256, 0, st>>>((uint32_t *)x, (size_t)m_max * n_in, 0x777u);
        rc = cuda_last_error("bench fill");
        rc = rc ? rc : cuda_stream_sync(stream);
        CHECK(rc == 0, "bench: fill failed");
    }
    if (rc == 0) {
        /* the random x bits include NaN and huge values; timing does not care */
        const float tr = time_median(
            [&]() {
                read_kernel<<<132 * 8, 512, 0, st>>>((const uint4 *)w, wbytes / 16, sink);
                return cuda_last_error("read_kernel");
            },
            st);
        printf("  bench: plain read of %zu MB: %.3f ms, %.0f GB/s (the roofline for GEMV)\n",
               wbytes >> 20, tr, (double)wbytes / (tr * 1e-3) / 1e9);
        printf("  bench: type  gemv m=1 (n_in 4096, 256 MB)  m=8 (same)   m=512 4096x14336\n");
    }
    for (int t = 0; rc == 0 && t < N_TYPES; t++) {
        const uint32_t type = types[t];
        const size_t rb = type_row_bytes(type, n_in);
        struct cuda_matmul_args a;
        memset(&a, 0, sizeof a);
        a.wtype = type;
        a.w = w;
        a.w_stride = rb;
        a.n_in = n_in;
        a.n_out = (int64_t)(wbytes / rb);
        a.x = x;
        a.x_stride = n_in;
        a.y = y;
        a.scratch = scratch;
        a.scratch_bytes = sbytes;
        a.stream = stream;
        float res[3];
        const int mv[3] = {1, 8, m_max};
        for (int k = 0; k < 3; k++) {
            a.m = mv[k];
            a.n_out = k < 2 ? (int64_t)(wbytes / rb) : n_gemm;
            a.y_stride = a.n_out;
            res[k] = time_median([&]() { return cuda_matmul(&a); }, st);
        }
        const double gb = (double)(wbytes / rb) * (double)rb / 1e9;
        const double flop = 2.0 * m_max * (double)n_in * (double)n_gemm;
        printf("  bench: %-5s %9.3f ms %7.0f GB/s  %7.0f GB/s  %8.3f ms %6.1f TFLOP/s\n",
               quant_type_name(type), res[0], gb / (res[0] * 1e-3), gb / (res[1] * 1e-3), res[2],
               flop / (res[2] * 1e-3) / 1e12);
        CHECK(res[0] > 0 && res[1] > 0 && res[2] > 0, "bench %s: a timed call failed",
              quant_type_name(type));
        fflush(stdout);
    }
    bench_gemm_tiles(w, x, y, st);
    cuda_free(w), cuda_free(x), cuda_free(y), cuda_free(scratch), cuda_free(sink);
}

int main(void)
{
    if (!test_gpu_available("test_cuda_matmul"))
        return TEST_SKIP;
    const uint64_t seed = test_seed("test_cuda_matmul");
    struct rng r;
    rng_seed(&r, seed, 0);
    int rc = cuda_matmul_init();
    CHECK(rc == 0, "cuda_matmul_init failed (%d)", rc);
    void *stream = NULL;
    rc = rc ? rc : cuda_stream_create(&stream);
    CHECK(rc == 0, "no stream");
    if (rc)
        return test_finish("test_cuda_matmul");

    test_args();
    test_types(&r, stream);
    test_pack(&r, stream);
    test_gemm_tiles(&r, stream);
    test_forced_paths(&r, stream);
    test_graph(&r, stream);
    test_rows_bitwise(&r, stream);
    test_more(&r, stream);
    bench(stream);

    cuda_stream_destroy(stream);
    return test_finish("test_cuda_matmul");
}
