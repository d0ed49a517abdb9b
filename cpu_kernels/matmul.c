/* matmul: small-batch quantized matmul over OpenMP threads (contract in matmul.h). */
#include "matmul.h"

#include <errno.h>
#include <omp.h>
#include <stdbool.h>
#include <stdlib.h>

#include "cpu_features.h"
#include "gemm.h"
#include "vec_dot.h"

#define ROWS_PER_UNIT 16 /* split granularity: 16 float outputs = one 64-byte line */
#define DOT_BLOCK 16     /* activation rows per pass of the vec_dot path over the weights */

/* Bytes between converted activation rows in the scratch: rounded up to a cache line. */
static size_t act_stride_bytes(uint32_t wtype, int64_t n_in)
{
    return (vec_dot_act_bytes(wtype, n_in) + 63) & ~(size_t)63;
}

static bool act_is_f32(uint32_t wtype)
{
    return vec_dot_act_type(wtype) == QUANT_F32;
}

size_t matmul_scratch_bytes(uint32_t wtype, int64_t n_in, int m)
{
    if (!vec_dot_supported(wtype) || act_is_f32(wtype) || n_in <= 0 || m <= 0)
        return 0;
    return act_stride_bytes(wtype, n_in) * (size_t)m;
}

int matmul_check(const struct matmul_args *a)
{
    if (!a || !vec_dot_supported(a->wtype))
        return -EINVAL;
    if (a->n_in <= 0 || a->n_in % vec_dot_block(a->wtype) != 0 || a->n_out < 0)
        return -EINVAL;
    if (a->m < 1 || a->m > MATMUL_MAX_BATCH)
        return -EINVAL;
    if (a->w_stride < vec_dot_row_bytes(a->wtype, a->n_in) || a->y_stride < a->n_out)
        return -EINVAL;
    if (a->m > 1 && a->x_stride < a->n_in)
        return -EINVAL;
    if ((!a->w && a->n_out > 0) || !a->x || !a->y)
        return -EINVAL;
    if (a->scratch && a->scratch_bytes < matmul_scratch_bytes(a->wtype, a->n_in, a->m))
        return -EINVAL;
    return 0;
}

int matmul_team(int n_threads, int64_t units)
{
    return units <= 1 ? 1 : n_threads > 0 ? n_threads : omp_get_max_threads();
}

void matmul_split(int64_t n_out, int ith, int nth, int64_t *r0, int64_t *r1)
{
    int64_t units = (n_out + ROWS_PER_UNIT - 1) / ROWS_PER_UNIT;
    int64_t u0 = units * ith / nth, u1 = units * (ith + 1) / nth;
    *r0 = u0 * ROWS_PER_UNIT < n_out ? u0 * ROWS_PER_UNIT : n_out;
    *r1 = u1 * ROWS_PER_UNIT < n_out ? u1 * ROWS_PER_UNIT : n_out;
}

void matmul_rows(const struct matmul_args *a, const void *act, size_t act_stride, int64_t r0,
                 int64_t r1)
{
    vec_dot_fn dot = vec_dot_get(a->wtype, CPU_ISA_COUNT);
    const uint8_t *w = (const uint8_t *)a->w + (size_t)r0 * a->w_stride;
    const int64_t n = a->n_in;

    if (a->m == 1) {
        for (int64_t r = r0; r < r1; r++, w += a->w_stride)
            a->y[r] = dot(n, w, act);
        return;
    }
    /* batches: 16 rows at a time against every activation row (gemm.h) where a kernel exists */
    gemm_fn gemm = a->m >= GEMM_MIN_M && a->w_stride <= GEMM_MAX_STRIDE ? gemm_get(a->wtype, CPU_ISA_COUNT) : NULL;
    if (gemm) {
        gemm(n, w, a->w_stride, r1 - r0, act, act_stride, a->m, a->y + r0, a->y_stride);
        return;
    }
    /* each weight row once from memory (per block of DOT_BLOCK activation rows, which stay in
     * L1), then from L1 for the other activation rows; where a multi-row kernel exists, the
     * row is unpacked once per VEC_DOT_ROWS activation rows */
    vec_dot_rows_fn rows = vec_dot_rows_get(a->wtype, CPU_ISA_COUNT);
    for (int j0 = 0; j0 < a->m; j0 += DOT_BLOCK) {
        const int j1 = a->m - j0 < DOT_BLOCK ? a->m : j0 + DOT_BLOCK;
        const uint8_t *wr = w;
        for (int64_t r = r0; r < r1; r++, wr += a->w_stride) {
            const uint8_t *x = (const uint8_t *)act + (size_t)j0 * act_stride;
            int j = j0;
            if (rows)
                for (float out[VEC_DOT_ROWS]; j + VEC_DOT_ROWS <= j1;
                     j += VEC_DOT_ROWS, x += VEC_DOT_ROWS * act_stride) {
                    rows(n, wr, x, act_stride, out);
                    for (int k = 0; k < VEC_DOT_ROWS; k++)
                        a->y[(j + k) * a->y_stride + r] = out[k];
                }
            for (; j < j1; j++, x += act_stride)
                a->y[j * a->y_stride + r] = dot(n, wr, x);
        }
    }
}

int64_t matmul_grab(atomic_llong *next, int64_t total, int nth, bool shrink, int64_t *n)
{
    long long cur = atomic_load_explicit(next, memory_order_relaxed);
    for (;;) {
        if (cur >= total) {
            *n = 0;
            return total;
        }
        int64_t take = shrink ? (total - cur) / (2 * (int64_t)nth) : 1;
        if (take < 1)
            take = 1;
        if (atomic_compare_exchange_weak_explicit(next, &cur, cur + take, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *n = take;
            return cur;
        }
    }
}

/* STRATA_MATMUL_FINE=0 in the environment keeps 16-row units for every matrix (for
 * comparisons); matmul_set_fine_units sets it for tests. */
static int fine_units = -1;

void matmul_set_fine_units(int on)
{
    fine_units = on != 0;
}

static bool matmul_fine_units(void)
{
    return cpu_env_switch(&fine_units, "STRATA_MATMUL_FINE");
}

int matmul_run(const struct matmul_args *a)
{
    return matmul_run_n(1, a);
}

int matmul_run_n(int n, const struct matmul_args *a)
{
    if (n < 1 || n > MATMUL_MAX_N || !a)
        return -EINVAL;
    int64_t rows = 0;
    for (int i = 0; i < n; i++) {
        int rc = matmul_check(&a[i]);
        if (rc)
            return rc;
        if (a[i].wtype != a[0].wtype || a[i].n_in != a[0].n_in || a[i].m != a[0].m ||
            a[i].x != a[0].x || (a[0].m > 1 && a[i].x_stride != a[0].x_stride))
            return -EINVAL;
        rows += a[i].n_out;
    }
    if (rows == 0)
        return 0;
    const int nt = matmul_team(a[0].n_threads, (rows + ROWS_PER_UNIT - 1) / ROWS_PER_UNIT);
    /* one activation row and fewer 16-row units than two per thread (a MoE router's 128 rows):
     * 4-row units, so that every thread has some (each row's dot is the same either way) */
    const int64_t rpu = a[0].m == 1 && matmul_fine_units() &&
                                (rows + ROWS_PER_UNIT - 1) / ROWS_PER_UNIT < 2 * (int64_t)nt
                            ? ROWS_PER_UNIT / 4
                            : ROWS_PER_UNIT;
    int64_t first[MATMUL_MAX_N + 1]; /* unit ranges of the calls in the shared range */
    first[0] = 0;
    for (int i = 0; i < n; i++)
        first[i + 1] = first[i] + (a[i].n_out + rpu - 1) / rpu;
    const int64_t units = first[n];

    const struct matmul_args *a0 = &a[0];
    const bool f32 = act_is_f32(a0->wtype);
    void *owned = NULL, *scratch = a0->scratch;
    if (!f32 && !scratch) {
        owned = aligned_alloc(64, matmul_scratch_bytes(a0->wtype, a0->n_in, a0->m));
        if (!owned)
            return -ENOMEM;
        scratch = owned;
    }
    const void *act = f32 ? (const void *)a0->x : scratch;
    const size_t act_stride =
        f32 ? (size_t)a0->x_stride * sizeof(float) : act_stride_bytes(a0->wtype, a0->n_in);
    vec_dot_quantize_fn quantize = vec_dot_quantize_get(a0->wtype, CPU_ISA_COUNT);
    atomic_llong next = 0;

#pragma omp parallel num_threads(nt)
    {
        int ith = omp_get_thread_num(), nth = omp_get_num_threads();
        if (!f32) {
            for (int j = ith; j < a0->m; j += nth)
                quantize(a0->x + j * a0->x_stride, (uint8_t *)scratch + j * act_stride, a0->n_in);
#pragma omp barrier
        }
        /* units of rpu rows in shrinking chunks (matmul_grab); a chunk that crosses from
         * one matrix into the next runs as one piece of each */
        for (int64_t c, cn; (c = matmul_grab(&next, units, nth, true, &cn)), cn > 0;) {
            for (int i = 0; i < n && cn > 0; i++) {
                if (c >= first[i + 1])
                    continue;
                int64_t u1 = c + cn < first[i + 1] ? c + cn : first[i + 1];
                int64_t r0 = (c - first[i]) * rpu, r1 = (u1 - first[i]) * rpu;
                matmul_rows(&a[i], act, act_stride, r0, r1 < a[i].n_out ? r1 : a[i].n_out);
                cn -= u1 - c;
                c = u1;
            }
        }
    }
    free(owned);
    return 0;
}
