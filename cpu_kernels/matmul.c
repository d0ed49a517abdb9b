/* matmul: small-batch quantized matmul over OpenMP threads (contract in matmul.h). */
#include "matmul.h"

#include <errno.h>
#include <omp.h>
#include <stdbool.h>
#include <stdlib.h>

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

int matmul_run(const struct matmul_args *a)
{
    int rc = matmul_check(a);
    if (rc)
        return rc;
    if (a->n_out == 0)
        return 0;

    const bool f32 = act_is_f32(a->wtype);
    void *owned = NULL, *scratch = a->scratch;
    if (!f32 && !scratch) {
        owned = aligned_alloc(64, matmul_scratch_bytes(a->wtype, a->n_in, a->m));
        if (!owned)
            return -ENOMEM;
        scratch = owned;
    }
    const void *act = f32 ? (const void *)a->x : scratch;
    const size_t act_stride =
        f32 ? (size_t)a->x_stride * sizeof(float) : act_stride_bytes(a->wtype, a->n_in);
    vec_dot_quantize_fn quantize = vec_dot_quantize_get(a->wtype, CPU_ISA_COUNT);

    int64_t units = (a->n_out + ROWS_PER_UNIT - 1) / ROWS_PER_UNIT;
    const int nt = matmul_team(a->n_threads, units);

#pragma omp parallel num_threads(nt)
    {
        int ith = omp_get_thread_num(), nth = omp_get_num_threads();
        if (!f32) {
            for (int j = ith; j < a->m; j += nth)
                quantize(a->x + j * a->x_stride, (uint8_t *)scratch + j * act_stride, a->n_in);
#pragma omp barrier
        }
        /* Rows go out in chunks of about a quarter of a thread's share, handed out
         * dynamically: a thread the OS or hypervisor preempts does not hold up the rest. */
        int64_t chunk = units / ((int64_t)nth * 4);
        if (chunk < 1)
            chunk = 1;
        int64_t n_chunks = (units + chunk - 1) / chunk;
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t c = 0; c < n_chunks; c++) {
            int64_t r0 = c * chunk * ROWS_PER_UNIT, r1 = (c + 1) * chunk * ROWS_PER_UNIT;
            matmul_rows(a, act, act_stride, r0, r1 < a->n_out ? r1 : a->n_out);
        }
    }
    free(owned);
    return 0;
}
