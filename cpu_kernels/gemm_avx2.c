/* gemm_avx2: the K-quant gemm kernels (gemm_body.h) for AVX2 CPUs and AVX-512 ones without
 * VNNI: 8 weight rows per vector, 8 x 8 dword transposes, and per two 4-element steps two
 * vpmaddubsw added in int16 and one vpmaddwd by the sub-block's scale. The int16 sums cannot
 * saturate: codes are at most 63 and activation codes at most 127 in magnitude, so four
 * products stay within 4 * 63 * 127 = 32004, and two of them times a scale (at most 128 in
 * magnitude) fit int32. Q8_0's codes + 128 would not fit, so Q8_0 keeps the dots here.
 */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "gemm.h"
#include "quant_blocks.h"

#define AI static inline __attribute__((always_inline))

#define LANES 8
#define TOK 4    /* activation rows per register tile */
#define MAX_M 64 /* activation rows per pass over the weights */
#define GEMM_MAX_ACC 2 /* float accumulators per output (gemm_body.h) */

struct tile {
    const uint8_t *row[LANES];
    __m256i offs;
    __m256i live; /* all-ones in the lanes of real rows */
};

static void tile_init(struct tile *t, const uint8_t *w, size_t w_stride, int64_t n_rows)
{
    int32_t offs[LANES], live[LANES];
    for (int r = 0; r < LANES; r++) {
        int64_t rr = r < n_rows ? r : n_rows - 1;
        t->row[r] = w + (size_t)rr * w_stride;
        offs[r] = (int32_t)((size_t)rr * w_stride);
        live[r] = r < n_rows ? -1 : 0;
    }
    t->offs = _mm256_loadu_si256((const __m256i *)offs);
    t->live = _mm256_loadu_si256((const __m256i *)live);
}

AI __m256i tile_gather(const struct tile *t, size_t at)
{
    return _mm256_i32gather_epi32((const int *)(const void *)(t->row[0] + at), t->offs, 1);
}

/* 32 bytes at byte `at` of every row, transposed: x[i] = bytes at + 4i .. at + 4i + 3. */
AI void load_transposed(const struct tile *t, size_t at, __m256i x[LANES])
{
    __m256i a[LANES], u[LANES];
    for (int r = 0; r < LANES; r++)
        a[r] = _mm256_loadu_si256((const __m256i *)(t->row[r] + at));
    for (int g = 0; g < 2; g++) {
        __m256i t0 = _mm256_unpacklo_epi32(a[4 * g], a[4 * g + 1]);
        __m256i t1 = _mm256_unpackhi_epi32(a[4 * g], a[4 * g + 1]);
        __m256i t2 = _mm256_unpacklo_epi32(a[4 * g + 2], a[4 * g + 3]);
        __m256i t3 = _mm256_unpackhi_epi32(a[4 * g + 2], a[4 * g + 3]);
        /* per 128-bit lane L of u[4g + k]: rows 4g .. 4g+3 of column 4L + k */
        u[4 * g + 0] = _mm256_unpacklo_epi64(t0, t2);
        u[4 * g + 1] = _mm256_unpackhi_epi64(t0, t2);
        u[4 * g + 2] = _mm256_unpacklo_epi64(t1, t3);
        u[4 * g + 3] = _mm256_unpackhi_epi64(t1, t3);
    }
    for (int k = 0; k < 4; k++) {
        x[k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
        x[4 + k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
    }
}

/* Outputs v (lane r: row r of the tile) to y, the tile's rows only. */
AI void store_tile(__m256 v, const struct tile *t, float *y)
{
    _mm256_maskstore_ps(y, t->live, v);
}

/* The f16 in the low half of every dword, as floats. */
AI __m256 f16_low(__m256i x)
{
    __m256i w = _mm256_and_si256(x, _mm256_set1_epi32(0xffff));
    w = _mm256_permutevar8x32_epi32(_mm256_packus_epi32(w, w),
                                    _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
    return _mm256_cvtph_ps(_mm256_castsi256_si128(w));
}

#define VI __m256i
#define VF __m256
#define V_AND _mm256_and_si256
#define V_OR _mm256_or_si256
#define V_SRLI16 _mm256_srli_epi16
#define V_SLLI16 _mm256_slli_epi16
#define V_SRLI32 _mm256_srli_epi32
#define V_SLLI32 _mm256_slli_epi32
#define V_SRAI32 _mm256_srai_epi32
#define V_SET1_8(x) _mm256_set1_epi8((char)(x))
#define V_SET1_32 _mm256_set1_epi32
#define V_SET1_F _mm256_set1_ps
#define V_SETZERO_I _mm256_setzero_si256
#define V_SETZERO_F _mm256_setzero_ps
#define V_CVT _mm256_cvtepi32_ps
#define V_MUL _mm256_mul_ps
#define V_SUB_F _mm256_sub_ps
#define V_SUB32 _mm256_sub_epi32
#define V_FMADD _mm256_fmadd_ps
#define V_LOAD_F _mm256_load_ps
#define V_STORE_F _mm256_store_ps
/* the scale as two int16 in every dword, the multiplier of vpmaddwd */
#define SCALE(x)                                                                                   \
    _mm256_or_si256(_mm256_and_si256((x), _mm256_set1_epi32(0xffff)), _mm256_slli_epi32((x), 16))
#define SB_START(s) (s)
#define DOT2(t, c0, a0, c1, a1, sc)                                                                \
    _mm256_add_epi32((t), _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16((c0), (a0)),     \
                                                             _mm256_maddubs_epi16((c1), (a1))),    \
                                            (sc)))
#define SB_END(s, t, sc) (t)
#define PAIRS(s, p, b) _mm256_add_epi32((s), _mm256_madd_epi16((p), (b)))

#include "gemm_body.h"

gemm_fn gemm_avx2_get(uint32_t wtype)
{
    return kq_get(wtype);
}
