#include "membw.h"

#include <emmintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double membw_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Sums 64-byte lines [l0, l1) with SSE2 (baseline x86-64); four accumulators keep enough
 * loads in flight for the memory system to be the limit. */
static uint64_t membw_sum_lines(const uint8_t *buf, size_t l0, size_t l1)
{
    __m128i a = _mm_setzero_si128(), b = a, c = a, d = a;
    for (size_t l = l0; l < l1; l++) {
        const __m128i *p = (const __m128i *)(buf + l * 64);
        a = _mm_add_epi64(a, _mm_load_si128(p));
        b = _mm_add_epi64(b, _mm_load_si128(p + 1));
        c = _mm_add_epi64(c, _mm_load_si128(p + 2));
        d = _mm_add_epi64(d, _mm_load_si128(p + 3));
    }
    a = _mm_add_epi64(_mm_add_epi64(a, b), _mm_add_epi64(c, d));
    return (uint64_t)_mm_cvtsi128_si64(a) + (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(a, a));
}

static int membw_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double membw_read(const void *buf, size_t bytes, int n_threads, int reps)
{
    size_t lines = bytes / 64;
    double *t = malloc(sizeof(double) * (size_t)(reps > 0 ? reps : 1));
    volatile uint64_t sink = 0;
    double med;

    if (!t || lines == 0) {
        free(t);
        return 0;
    }
    if (n_threads <= 0)
        n_threads = omp_get_max_threads();
    for (int r = 0; r < reps; r++) {
        uint64_t total = 0;
        double t0 = membw_now();
#pragma omp parallel num_threads(n_threads) reduction(+ : total)
        {
            int ith = omp_get_thread_num(), nth = omp_get_num_threads();
            size_t l0 = lines * ith / nth, l1 = lines * (ith + 1) / nth;
            total += membw_sum_lines(buf, l0, l1);
        }
        t[r] = membw_now() - t0;
        sink += total;
    }
    (void)sink;
    qsort(t, (size_t)reps, sizeof(double), membw_cmp);
    med = t[reps / 2];
    free(t);
    return med > 0 ? (double)(lines * 64) / med : 0;
}

double membw_measure(size_t bytes, int n_threads, int reps)
{
    uint8_t *buf = NULL;
    size_t lines = bytes / 64;
    double bw;

    if (n_threads <= 0)
        n_threads = omp_get_max_threads();
    if (posix_memalign((void **)&buf, 4096, lines * 64))
        return 0;
#pragma omp parallel num_threads(n_threads)
    {
        int ith = omp_get_thread_num(), nth = omp_get_num_threads();
        size_t l0 = lines * ith / nth, l1 = lines * (ith + 1) / nth;
        memset(buf + l0 * 64, (int)(ith + 1), (l1 - l0) * 64);
    }
    membw_read(buf, lines * 64, n_threads, 1); /* warm-up */
    bw = membw_read(buf, lines * 64, n_threads, reps);
    free(buf);
    return bw;
}
