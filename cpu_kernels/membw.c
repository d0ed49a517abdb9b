#include "membw.h"

#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "cpu_features.h"

static double membw_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Sum of the 64-bit words of lines [l0, l1) of 64 bytes, 16-byte loads (baseline x86-64);
 * four accumulators keep enough loads in flight for memory to be the limit. */
static uint64_t membw_lines_sse2(const uint8_t *buf, size_t l0, size_t l1)
{
    const __m128i *q = (const __m128i *)(buf + l0 * 64);
    __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t l = l0; l < l1; l++, q += 4) {
        a0 = _mm_add_epi64(a0, _mm_load_si128(q));
        a1 = _mm_add_epi64(a1, _mm_load_si128(q + 1));
        a2 = _mm_add_epi64(a2, _mm_load_si128(q + 2));
        a3 = _mm_add_epi64(a3, _mm_load_si128(q + 3));
    }
    __m128i s = _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3));
    return (uint64_t)_mm_cvtsi128_si64(s) + (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(s, s));
}

/* The same with one 64-byte load per line, four lines per iteration. */
__attribute__((target("avx512f"))) static uint64_t membw_lines_avx512(const uint8_t *buf,
                                                                      size_t l0, size_t l1)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    size_t l = l0;
    for (; l + 4 <= l1; l += 4) {
        const uint8_t *p = buf + l * 64;
        a0 = _mm512_add_epi64(a0, _mm512_load_si512(p));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + 64));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + 128));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + 192));
    }
    for (; l < l1; l++)
        a0 = _mm512_add_epi64(a0, _mm512_load_si512(buf + l * 64));
    /* folded by xor: the header's _mm512_reduce_add_epi64 adds as signed long long, which
     * overflows (undefined) on arbitrary memory */
    __m512i s = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
    uint64_t lanes[8], r = 0;
    _mm512_storeu_si512(lanes, s);
    for (int i = 0; i < 8; i++)
        r ^= lanes[i];
    return r;
}

bool membw_wide(void)
{
    return cpu_isa_best() >= CPU_ISA_AVX512;
}

uint64_t membw_sweep(const void *buf, size_t bytes, int n_threads)
{
    size_t lines = bytes / 64;
    bool wide = membw_wide();
    uint64_t total = 0;

    if (n_threads <= 0)
        n_threads = omp_get_max_threads();
#pragma omp parallel num_threads(n_threads) reduction(+ : total)
    {
        int ith = omp_get_thread_num(), nth = omp_get_num_threads();
        size_t l0 = lines * ith / nth, l1 = lines * (ith + 1) / nth;
        total += wide ? membw_lines_avx512(buf, l0, l1) : membw_lines_sse2(buf, l0, l1);
    }
    return total;
}

void *membw_alloc(size_t bytes, int n_threads)
{
    size_t align = (size_t)2 << 20, lines = bytes / 64;
    uint8_t *p = aligned_alloc(align, (bytes + align - 1) / align * align);

    if (!p)
        return NULL;
    madvise(p, bytes, MADV_HUGEPAGE);
    if (n_threads <= 0)
        n_threads = omp_get_max_threads();
#pragma omp parallel num_threads(n_threads)
    {
        int ith = omp_get_thread_num(), nth = omp_get_num_threads();
        size_t l0 = lines * ith / nth, l1 = lines * (ith + 1) / nth;
        memset(p + l0 * 64, ith + 1, (l1 - l0) * 64);
    }
    return p;
}

static int membw_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double membw_read(const void *buf, size_t bytes, int n_threads, int reps)
{
    double *t = malloc(sizeof(double) * (size_t)(reps > 0 ? reps : 1));
    volatile uint64_t sink = membw_sweep(buf, bytes, n_threads);
    double med;

    if (!t || bytes < 64) {
        free(t);
        return 0;
    }
    if (reps < 1)
        reps = 1;
    for (int r = 0; r < reps; r++) {
        double t0 = membw_now();
        sink += membw_sweep(buf, bytes, n_threads);
        t[r] = membw_now() - t0;
    }
    (void)sink;
    qsort(t, (size_t)reps, sizeof(double), membw_cmp);
    med = t[reps / 2];
    free(t);
    return med > 0 ? (double)(bytes / 64 * 64) / med : 0;
}

double membw_measure(size_t bytes, int n_threads, int reps)
{
    void *buf = membw_alloc(bytes / 64 * 64, n_threads);
    double bw;

    if (!buf)
        return 0;
    bw = membw_read(buf, bytes / 64 * 64, n_threads, reps);
    free(buf);
    return bw;
}
