/* vec_dot_avx2: AVX2 + FMA + F16C dot kernels and activation quantizers (compiled with those
 * flags; called only when cpu_isa_best() >= CPU_ISA_AVX2). Same results as the scalar
 * references in vec_dot.c up to float accumulation order (the K-quants' is vec_dot.h's, shared
 * with gemm); the quantizers are bit-identical.
 *
 * Signed int8 x int8 products use the sign trick: |w| (unsigned) times a * sign(w) (signed)
 * with vpmaddubsw, which cannot overflow because activation codes lie in [-127, 127].
 */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "vec_dot.h"

static inline float hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hmax_ps(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float f16_load(uint16_t h)
{
    return _cvtsh_ss(h);
}

/* 32 signed bytes x 32 signed bytes -> 8 int32 partial sums. */
static inline __m256i dot_i8_i8(__m256i w, __m256i a)
{
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* dot_i8_i8 from |w| (wa, shared by every activation row) and w. */
static inline __m256i dot_abs_i8(__m256i wa, __m256i w, __m256i a)
{
    __m256i p = _mm256_maddubs_epi16(wa, _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* 16 packed nibbles -> 32 bytes: element j = low nibble of q[j], element j+16 = high nibble. */
static inline __m256i nibbles_32(const uint8_t *q)
{
    __m128i x = _mm_loadu_si128((const __m128i *)q);
    __m256i both = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

/* ---- activation quantizers ---- */

/* Rounds 8 floats (already scaled) to int32 codes in [-127, 127], half to even. */
static inline __m256i act_codes(__m256 v)
{
    v = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    return _mm256_cvtps_epi32(v);
}

/* 32 floats -> 32 int8 codes (x * id rounded), in element order. */
static inline __m256i act_codes_32(const float *x, __m256 id)
{
    __m256i c0 = act_codes(_mm256_mul_ps(_mm256_loadu_ps(x), id));
    __m256i c1 = act_codes(_mm256_mul_ps(_mm256_loadu_ps(x + 8), id));
    __m256i c2 = act_codes(_mm256_mul_ps(_mm256_loadu_ps(x + 16), id));
    __m256i c3 = act_codes(_mm256_mul_ps(_mm256_loadu_ps(x + 24), id));
    /* packs work per 128-bit lane: restore element order with one dword permute */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(c0, c1), _mm256_packs_epi32(c2, c3));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static inline float absmax(const float *x, int n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8)
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
    return hmax_ps(m);
}

/* The sum of 32 signed bytes: (q + 128) summed by vpsadbw, minus 32 * 128. */
static inline int32_t sum_s8_32(__m256i q)
{
    __m256i s =
        _mm256_sad_epu8(_mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
    __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    return (int32_t)(_mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1)) - 32 * 128;
}

static void quantize_q8_0_avx2(const float *x, void *act, int64_t n)
{
    struct block_q8_0 *y = act;
    struct vec_dot_q8_0_extra *e = vec_dot_q8_0_extras(act, n);
    for (int64_t b = 0; b < n / QK_32; b++, x += QK_32) {
        float d = absmax(x, QK_32) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        __m256i q = act_codes_32(x, _mm256_set1_ps(id));
        _mm256_storeu_si256((__m256i *)y[b].qs, q);
        e[b].d = _cvtsh_ss(y[b].d);
        e[b].off = -128 * sum_s8_32(q);
    }
}

static void quantize_q8_k_avx2(const float *x, void *act, int64_t n)
{
    struct block_q8_k *y = act;
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < n / QK_K; b++, x += QK_K) {
        float d = absmax(x, QK_K) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        __m256 idv = _mm256_set1_ps(id);
        y[b].d = d;
        for (int j = 0; j < QK_K / 32; j++) {
            __m256i q = act_codes_32(x + 32 * j, idv);
            _mm256_storeu_si256((__m256i *)(y[b].qs + 32 * j), q);
            /* the two sums of 16 codes: pairs (maddubs by 1), quads (madd by 1), then the
             * four quads of each 128-bit lane */
            __m256i s16 = _mm256_maddubs_epi16(ones, q);
            __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
            s32 = _mm256_hadd_epi32(s32, s32);
            s32 = _mm256_hadd_epi32(s32, s32);
            y[b].bsums[2 * j] = (int16_t)_mm256_extract_epi32(s32, 0);
            y[b].bsums[2 * j + 1] = (int16_t)_mm256_extract_epi32(s32, 4);
        }
    }
}

static void quantize_f32_copy(const float *x, void *act, int64_t n)
{
    memcpy(act, x, (size_t)n * sizeof(float));
}

vec_dot_quantize_fn vec_dot_avx2_quantize_get(enum quant_type act_type)
{
    switch (act_type) {
    case QUANT_Q8_0:
        return quantize_q8_0_avx2;
    case QUANT_Q8_K:
        return quantize_q8_k_avx2;
    case QUANT_F32:
        return quantize_f32_copy;
    default:
        return NULL;
    }
}

/* ---- 32-element blocks with Q8_0 activations ---- */

/* The Q8_0 dot of one weight row with nr activation rows (act + r * act_stride), out[r]: each
 * row's arithmetic is the single dot's (nr = 1) in the same order, so every out[r] equals it
 * bit for bit; |w| and the sign of w are taken once for all rows. */
static inline __attribute__((always_inline)) void
dot_q8_0_rows(int64_t n, const void *w_row, const void *act, size_t act_stride, int nr, float *out)
{
    const struct block_q8_0 *w = w_row;
    const struct block_q8_0 *a[VEC_DOT_ROWS];
    __m256 acc0[VEC_DOT_ROWS], acc1[VEC_DOT_ROWS];
    for (int r = 0; r < nr; r++) {
        a[r] = (const struct block_q8_0 *)((const uint8_t *)act + r * act_stride);
        acc0[r] = acc1[r] = _mm256_setzero_ps();
    }
    int64_t nb = n / QK_32, b = 0;
    for (; b + 1 < nb; b += 2) {
        VEC_DOT_PREFETCH(&w[b], 2 * sizeof(*w));
        __m256i w0 = _mm256_loadu_si256((const __m256i *)w[b].qs);
        __m256i w1 = _mm256_loadu_si256((const __m256i *)w[b + 1].qs);
        __m256i wa0 = _mm256_sign_epi8(w0, w0), wa1 = _mm256_sign_epi8(w1, w1);
        float dw0 = f16_load(w[b].d), dw1 = f16_load(w[b + 1].d);
        for (int r = 0; r < nr; r++) {
            __m256i p0 = dot_abs_i8(wa0, w0, _mm256_loadu_si256((const __m256i *)a[r][b].qs));
            __m256i p1 = dot_abs_i8(wa1, w1, _mm256_loadu_si256((const __m256i *)a[r][b + 1].qs));
            float d0 = dw0 * f16_load(a[r][b].d);
            float d1 = dw1 * f16_load(a[r][b + 1].d);
            acc0[r] = _mm256_fmadd_ps(_mm256_set1_ps(d0), _mm256_cvtepi32_ps(p0), acc0[r]);
            acc1[r] = _mm256_fmadd_ps(_mm256_set1_ps(d1), _mm256_cvtepi32_ps(p1), acc1[r]);
        }
    }
    for (; b < nb; b++) {
        __m256i w0 = _mm256_loadu_si256((const __m256i *)w[b].qs);
        __m256i wa0 = _mm256_sign_epi8(w0, w0);
        for (int r = 0; r < nr; r++) {
            __m256i p = dot_abs_i8(wa0, w0, _mm256_loadu_si256((const __m256i *)a[r][b].qs));
            float d = f16_load(w[b].d) * f16_load(a[r][b].d);
            acc0[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc0[r]);
        }
    }
    for (int r = 0; r < nr; r++)
        out[r] = hsum_ps(_mm256_add_ps(acc0[r], acc1[r]));
}

static float dot_q4_0_avx2(int64_t n, const void *w_row, const void *act)
{
    const struct block_q4_0 *w = w_row;
    const struct block_q8_0 *a = act;
    const __m256i eight = _mm256_set1_epi8(8);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t nb = n / QK_32, b = 0;
    for (; b + 1 < nb; b += 2) {
        VEC_DOT_PREFETCH(&w[b], 2 * sizeof(*w));
        __m256i q0 = _mm256_sub_epi8(nibbles_32(w[b].qs), eight);
        __m256i q1 = _mm256_sub_epi8(nibbles_32(w[b + 1].qs), eight);
        __m256i p0 = dot_i8_i8(q0, _mm256_loadu_si256((const __m256i *)a[b].qs));
        __m256i p1 = dot_i8_i8(q1, _mm256_loadu_si256((const __m256i *)a[b + 1].qs));
        float d0 = f16_load(w[b].d) * f16_load(a[b].d);
        float d1 = f16_load(w[b + 1].d) * f16_load(a[b + 1].d);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), _mm256_cvtepi32_ps(p0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1), _mm256_cvtepi32_ps(p1), acc1);
    }
    for (; b < nb; b++) {
        __m256i q = _mm256_sub_epi8(nibbles_32(w[b].qs), eight);
        __m256i p = dot_i8_i8(q, _mm256_loadu_si256((const __m256i *)a[b].qs));
        float d = f16_load(w[b].d) * f16_load(a[b].d);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc0);
    }
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

static float dot_mxfp4_avx2(int64_t n, const void *w_row, const void *act)
{
    static const int8_t values[16] = VEC_DOT_MXFP4_VALUES;
    const struct block_mxfp4 *w = w_row;
    const struct block_q8_0 *a = act;
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)values));
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t nb = n / QK_32, b = 0;
    for (; b + 1 < nb; b += 2) {
        VEC_DOT_PREFETCH(&w[b], 2 * sizeof(*w));
        __m256i q0 = _mm256_shuffle_epi8(table, nibbles_32(w[b].qs));
        __m256i q1 = _mm256_shuffle_epi8(table, nibbles_32(w[b + 1].qs));
        __m256i p0 = dot_i8_i8(q0, _mm256_loadu_si256((const __m256i *)a[b].qs));
        __m256i p1 = dot_i8_i8(q1, _mm256_loadu_si256((const __m256i *)a[b + 1].qs));
        float d0 = vec_dot_e8m0_half(w[b].e) * f16_load(a[b].d);
        float d1 = vec_dot_e8m0_half(w[b + 1].e) * f16_load(a[b + 1].d);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), _mm256_cvtepi32_ps(p0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1), _mm256_cvtepi32_ps(p1), acc1);
    }
    for (; b < nb; b++) {
        __m256i q = _mm256_shuffle_epi8(table, nibbles_32(w[b].qs));
        __m256i p = dot_i8_i8(q, _mm256_loadu_si256((const __m256i *)a[b].qs));
        float d = vec_dot_e8m0_half(w[b].e) * f16_load(a[b].d);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc0);
    }
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

/* ---- K-quants with Q8_K activations ---- */

/* sum_s mins[s] * (bsums[2s] + bsums[2s+1]) as 4 int32 lanes (8 mins as bytes). */
static inline __m128i k4_min_sums(const int16_t *bsums, uint64_t mins8)
{
    __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bsums),
                                _mm_loadu_si128((const __m128i *)(bsums + 8)));
    __m128i m = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mins8));
    return _mm_madd_epi16(bs, m);
}

/* [isum, msum, isum, msum]: the sums of the lanes of i and of m. */
static inline __m128i isum_msum(__m256i i, __m128i m)
{
    __m128i i4 = _mm_add_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    __m128i t = _mm_hadd_epi32(i4, m); /* i pairs, i pairs, m pairs, m pairs */
    return _mm_hadd_epi32(t, t);
}

/* The sum of the 8 lanes of x, in lane 0. */
static inline __m128i sum_epi32(__m256i x)
{
    __m128i x4 = _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    x4 = _mm_add_epi32(x4, _mm_shuffle_epi32(x4, 0x4e));
    return _mm_add_epi32(x4, _mm_shuffle_epi32(x4, 0xb1));
}

/* Q4_K and Q5_K (five: the 5th bit from qh), one weight row against nr activation rows, as in
 * dot_q8_0_rows: the codes and scales are unpacked once, each row's sums are the single dot's,
 * added in vec_dot.h's order. */
static inline __attribute__((always_inline)) void dot_k45_rows(int64_t n, const void *w_row,
                                                               const void *act, size_t act_stride,
                                                               int nr, float *out, bool five)
{
    const struct block_q8_k *a[VEC_DOT_ROWS];
    const size_t bsize = five ? sizeof(struct block_q5_k) : sizeof(struct block_q4_k);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i m1 = _mm256_set1_epi8(1);
    __m128 acc[VEC_DOT_ROWS]; /* lane 0: acc_i, lane 1: acc_m (vec_dot.h) */
    for (int r = 0; r < nr; r++) {
        a[r] = (const struct block_q8_k *)((const uint8_t *)act + r * act_stride);
        acc[r] = _mm_setzero_ps();
    }
    for (int64_t b = 0; b < n / QK_K; b++) {
        const uint8_t *blk = (const uint8_t *)w_row + b * bsize;
        /* Q4_K and Q5_K start alike: d, dmin, scales[12]; then Q5_K has qh[32] before qs */
        const struct block_q4_k *w4 = (const struct block_q4_k *)blk;
        const uint8_t *q = five ? ((const struct block_q5_k *)blk)->qs : w4->qs;
        uint32_t sm[4];
        VEC_DOT_PREFETCH(blk, bsize);
        vec_dot_k4_scales(w4->scales, sm);
        uint64_t mins8 = (uint64_t)sm[2] | (uint64_t)sm[3] << 32;
        /* scales as words, each duplicated into both 128-bit lanes for a per-lane shuffle */
        __m128i sc8 = _mm_cvtsi64_si128((long long)((uint64_t)sm[0] | (uint64_t)sm[1] << 32));
        __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc8));
        __m256i qh = five
                         ? _mm256_loadu_si256((const __m256i *)((const struct block_q5_k *)blk)->qh)
                         : _mm256_setzero_si256();
        __m256i isum[VEC_DOT_ROWS];
        for (int r = 0; r < nr; r++)
            isum[r] = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i qb = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
            __m256i lo = _mm256_and_si256(qb, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4);
            if (five) {
                /* 5th bits: bit 2c (low nibbles) and 2c+1 (high nibbles) of qh, to bit 4 */
                lo = _mm256_or_si256(
                    lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), m1), 4));
                hi = _mm256_or_si256(
                    hi,
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), m1), 4));
            }
            /* broadcast word 2c / 2c+1 of the scales */
            __m256i slo =
                _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0100 * (4 * c + 1) + 4 * c)));
            __m256i shi = _mm256_shuffle_epi8(
                sc16, _mm256_set1_epi16((short)(0x0100 * (4 * c + 3) + 4 * c + 2)));
            for (int r = 0; r < nr; r++) {
                const int8_t *y = a[r][b].qs;
                __m256i plo =
                    _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(y + 64 * c)));
                __m256i phi = _mm256_maddubs_epi16(
                    hi, _mm256_loadu_si256((const __m256i *)(y + 64 * c + 32)));
                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(plo, slo));
                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(phi, shi));
            }
        }
        uint32_t d_dmin; /* the f16 d and dmin, adjacent */
        memcpy(&d_dmin, &w4->d, 4);
        const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128((int)d_dmin)); /* [d, dmin, 0, 0] */
        for (int r = 0; r < nr; r++) {
            __m128 f = _mm_mul_ps(dd, _mm_set1_ps(a[r][b].d));
            __m128i im = isum_msum(isum[r], k4_min_sums(a[r][b].bsums, mins8));
            acc[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(im), f, acc[r]);
        }
    }
    for (int r = 0; r < nr; r++)
        out[r] = _mm_cvtss_f32(_mm_sub_ss(acc[r], _mm_movehdup_ps(acc[r])));
}

static inline __attribute__((always_inline)) void
dot_q4_k_rows(int64_t n, const void *w, const void *a, size_t stride, int nr, float *out)
{
    dot_k45_rows(n, w, a, stride, nr, out, false);
}

static inline __attribute__((always_inline)) void
dot_q5_k_rows(int64_t n, const void *w, const void *a, size_t stride, int nr, float *out)
{
    dot_k45_rows(n, w, a, stride, nr, out, true);
}

/* Q6_K, one weight row against nr activation rows, as in dot_k45_rows. */
static inline __attribute__((always_inline)) void
dot_q6_k_rows(int64_t n, const void *w_row, const void *act, size_t act_stride, int nr, float *out)
{
    const struct block_q6_k *w = w_row;
    const struct block_q8_k *a[VEC_DOT_ROWS];
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i m3 = _mm256_set1_epi8(3);
    __m128 acc[VEC_DOT_ROWS]; /* lane 0 (vec_dot.h) */
    for (int r = 0; r < nr; r++) {
        a[r] = (const struct block_q8_k *)((const uint8_t *)act + r * act_stride);
        acc[r] = _mm_setzero_ps();
    }
    for (int64_t b = 0; b < n / QK_K; b++) {
        __m128i sc8 = _mm_loadu_si128((const __m128i *)w[b].scales);
        VEC_DOT_PREFETCH(&w[b], sizeof(*w));
        /* codes are used unsigned (0..63); the -32 offset is taken out with the bsums */
        __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        __m256i isum[VEC_DOT_ROWS];
        for (int r = 0; r < nr; r++)
            isum[r] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w[b].ql + 64 * h;
            __m256i qh = _mm256_loadu_si256((const __m256i *)(w[b].qh + 32 * h));
            __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
            q[1] = _mm256_or_si256(
                _mm256_and_si256(l1, m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
            q[2] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
            q[3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
            for (int s = 0; s < 4; s++) {
                int k = 8 * h + 2 * s; /* scale index of the first 16 elements */
                __m128i idx = _mm_setr_epi8(k, k, k, k, k, k, k, k, k + 1, k + 1, k + 1, k + 1,
                                            k + 1, k + 1, k + 1, k + 1);
                __m256i scv = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, idx));
                for (int r = 0; r < nr; r++) {
                    __m256i p = _mm256_maddubs_epi16(
                        q[s], _mm256_loadu_si256((const __m256i *)(a[r][b].qs + 128 * h + 32 * s)));
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, scv));
                }
            }
        }
        float dw = f16_load(w[b].d);
        for (int r = 0; r < nr; r++) {
            __m256i offset =
                _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a[r][b].bsums), sc16);
            isum[r] = _mm256_sub_epi32(isum[r], _mm256_slli_epi32(offset, 5));
            acc[r] = _mm_fmadd_ss(_mm_cvtepi32_ps(sum_epi32(isum[r])), _mm_set_ss(dw * a[r][b].d),
                                  acc[r]);
        }
    }
    for (int r = 0; r < nr; r++)
        out[r] = _mm_cvtss_f32(acc[r]);
}

/* Q2_K and Q3_K: per 32 elements (half h, quarter j) the 2-bit codes (Q3_K: with the high bit
 * of hmask, 0..7) against the activation codes by vpmaddubsw, then vpmaddwd with the two
 * 16-element sub-blocks' scales (sc8: the 16 scales as signed bytes) over their 8 words each.
 * Q2_K's mins and Q3_K's -4 come off through the bsums; per block the K-quant order of
 * vec_dot.h. */
static inline __attribute__((always_inline)) __m256i
low_bits_isum(const uint8_t *qs, const uint8_t *hmask, const int8_t *y, __m128i sc8, bool high)
{
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    __m256i hm = high ? _mm256_loadu_si256((const __m256i *)hmask) : _mm256_setzero_si256();
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
        for (int j = 0; j < 4; j++) {
            __m256i c = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
            if (high)
                c = _mm256_or_si256(
                    c,
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + j), one), 2));
            const char k = (char)(8 * h + 2 * j); /* the scales of words 0-7 and 8-15 */
            __m256i scv = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
                sc8, _mm_setr_epi8(k, k, k, k, k, k, k, k, (char)(k + 1), (char)(k + 1),
                                   (char)(k + 1), (char)(k + 1), (char)(k + 1), (char)(k + 1),
                                   (char)(k + 1), (char)(k + 1))));
            __m256i p = _mm256_maddubs_epi16(
                c, _mm256_loadu_si256((const __m256i *)(y + 128 * h + 32 * j)));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scv));
        }
    }
    return isum;
}

static float dot_q2_k_avx2(int64_t n, const void *w_row, const void *act)
{
    const struct block_q2_k *w = w_row;
    const struct block_q8_k *a = act;
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128 acc = _mm_setzero_ps(); /* lane 0: acc_i, lane 1: acc_m */
    for (int64_t b = 0; b < n / QK_K; b++) {
        VEC_DOT_PREFETCH(&w[b], sizeof(*w));
        __m128i s8 = _mm_loadu_si128((const __m128i *)w[b].scales);
        __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), m4));
        __m256i m8 = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)a[b].bsums));
        __m128i msum = _mm_add_epi32(_mm256_castsi256_si128(m8), _mm256_extracti128_si256(m8, 1));
        __m256i isum = low_bits_isum(w[b].qs, NULL, a[b].qs, _mm_and_si128(s8, m4), false);
        uint32_t d_dmin; /* the f16 d and dmin, adjacent */
        memcpy(&d_dmin, &w[b].d, 4);
        __m128 f = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128((int)d_dmin)), _mm_set1_ps(a[b].d));
        acc = _mm_fmadd_ps(_mm_cvtepi32_ps(isum_msum(isum, msum)), f, acc);
    }
    return _mm_cvtss_f32(_mm_sub_ss(acc, _mm_movehdup_ps(acc)));
}

static float dot_q3_k_avx2(int64_t n, const void *w_row, const void *act)
{
    const struct block_q3_k *w = w_row;
    const struct block_q8_k *a = act;
    __m128 acc = _mm_setzero_ps();
    for (int64_t b = 0; b < n / QK_K; b++) {
        VEC_DOT_PREFETCH(&w[b], sizeof(*w));
        __m128i sc8 = vec_dot_q3_k_scales8(w[b].scales);
        __m256i isum = low_bits_isum(w[b].qs, w[b].hmask, a[b].qs, sc8, true);
        /* the values are the codes - 4 */
        __m256i off = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a[b].bsums),
                                        _mm256_cvtepi8_epi16(sc8));
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(off, 2));
        acc = _mm_fmadd_ss(_mm_cvtepi32_ps(sum_epi32(isum)), _mm_set_ss(f16_load(w[b].d) * a[b].d),
                           acc);
    }
    return _mm_cvtss_f32(acc);
}

/* A single dot and a VEC_DOT_ROWS-row dot from one multi-row body. */
#define ROWS_INSTANCES(name)                                                                       \
    static float dot_##name##_avx2(int64_t n, const void *w, const void *a)                        \
    {                                                                                              \
        float out;                                                                                 \
        dot_##name##_rows(n, w, a, 0, 1, &out);                                                    \
        return out;                                                                                \
    }                                                                                              \
    static void dot_##name##_rows_avx2(int64_t n, const void *w, const void *a, size_t stride,     \
                                       float *out)                                                 \
    {                                                                                              \
        dot_##name##_rows(n, w, a, stride, VEC_DOT_ROWS, out);                                     \
    }

ROWS_INSTANCES(q8_0)
ROWS_INSTANCES(q4_k)
ROWS_INSTANCES(q5_k)
ROWS_INSTANCES(q6_k)

/* ---- float weights with F32 activations ---- */

static float dot_f32_avx2(int64_t n, const void *w_row, const void *act)
{
    const float *w = w_row;
    const float *a = act;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        VEC_DOT_PREFETCH(w + i, 32 * sizeof(float));
        for (int k = 0; k < 4; k++)
            acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8 * k), _mm256_loadu_ps(a + i + 8 * k),
                                     acc[k]);
    }
    for (; i + 8 <= n; i += 8)
        acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(a + i), acc[0]);
    float sum =
        hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++)
        sum += w[i] * a[i];
    return sum;
}

static inline __m256 load_f16x8(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline __m256 load_bf16x8(const uint16_t *p)
{
    __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}

static float dot_f16_avx2(int64_t n, const void *w_row, const void *act)
{
    const uint16_t *w = w_row;
    const float *a = act;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        VEC_DOT_PREFETCH(w + i, 32 * sizeof(uint16_t));
        for (int k = 0; k < 4; k++)
            acc[k] =
                _mm256_fmadd_ps(load_f16x8(w + i + 8 * k), _mm256_loadu_ps(a + i + 8 * k), acc[k]);
    }
    for (; i + 8 <= n; i += 8)
        acc[0] = _mm256_fmadd_ps(load_f16x8(w + i), _mm256_loadu_ps(a + i), acc[0]);
    float sum =
        hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++)
        sum += f16_load(w[i]) * a[i];
    return sum;
}

static float dot_bf16_avx2(int64_t n, const void *w_row, const void *act)
{
    const uint16_t *w = w_row;
    const float *a = act;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        VEC_DOT_PREFETCH(w + i, 32 * sizeof(uint16_t));
        for (int k = 0; k < 4; k++)
            acc[k] =
                _mm256_fmadd_ps(load_bf16x8(w + i + 8 * k), _mm256_loadu_ps(a + i + 8 * k), acc[k]);
    }
    for (; i + 8 <= n; i += 8)
        acc[0] = _mm256_fmadd_ps(load_bf16x8(w + i), _mm256_loadu_ps(a + i), acc[0]);
    float sum =
        hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) {
        uint32_t bits = (uint32_t)w[i] << 16;
        float f;
        memcpy(&f, &bits, 4);
        sum += f * a[i];
    }
    return sum;
}

vec_dot_fn vec_dot_avx2_get(uint32_t wtype)
{
    switch (wtype) {
    case QUANT_F32:
        return dot_f32_avx2;
    case QUANT_F16:
        return dot_f16_avx2;
    case QUANT_BF16:
        return dot_bf16_avx2;
    case QUANT_Q8_0:
        return dot_q8_0_avx2;
    case QUANT_Q4_0:
        return dot_q4_0_avx2;
    case QUANT_MXFP4:
        return dot_mxfp4_avx2;
    case QUANT_Q2_K:
        return dot_q2_k_avx2;
    case QUANT_Q3_K:
        return dot_q3_k_avx2;
    case QUANT_Q4_K:
        return dot_q4_k_avx2;
    case QUANT_Q5_K:
        return dot_q5_k_avx2;
    case QUANT_Q6_K:
        return dot_q6_k_avx2;
    default:
        return NULL;
    }
}

vec_dot_rows_fn vec_dot_avx2_rows_get(uint32_t wtype)
{
    switch (wtype) {
    case QUANT_Q8_0:
        return dot_q8_0_rows_avx2;
    case QUANT_Q4_K:
        return dot_q4_k_rows_avx2;
    case QUANT_Q5_K:
        return dot_q5_k_rows_avx2;
    case QUANT_Q6_K:
        return dot_q6_k_rows_avx2;
    default:
        return NULL;
    }
}
