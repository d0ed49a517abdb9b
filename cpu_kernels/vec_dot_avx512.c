/* vec_dot_avx512: AVX-512 (F/BW/VL/DQ) dot kernels and activation quantizers, each in two
 * variants: with VNNI (vpdpbusd, vpdpwssd) and without (vpmaddubsw + vpmaddwd + add). The file
 * is compiled with every AVX-512 flag, so it is called only when cpu_isa_best() >=
 * CPU_ISA_AVX512, and the VNNI instructions only appear in the vnni=true instances.
 *
 * vpdpbusd multiplies unsigned by signed bytes. Weights that are naturally unsigned or made so
 * by an offset go in as they are, with the offset times the activation sum removed afterwards
 * (Q4_0: nibble = value + 8; MXFP4: table of value + 12; Q6_K: code = value + 32, removed with
 * the bsums). Q8_0 uses |w| times a * sign(w) (one masked negation per activation row instead
 * of a second dpbusd and a subtraction; without VNNI the offset would saturate vpmaddubsw);
 * activation codes are in [-127, 127], so negating them cannot overflow.
 *
 * Q8_0 and the K-quants with 8-bit activations also come as multi-row bodies: one weight row
 * unpacked once against up to VEC_DOT_ROWS activation rows (vec_dot_rows_fn); the single dot
 * is the same body with one row.
 */
#include <immintrin.h>
#include <string.h>

#include "vec_dot.h"

#define AI static inline __attribute__((always_inline))

/* acc + sum over each 4 bytes of u (unsigned) * s (signed); pair sums must fit int16 on the
 * non-VNNI path (|u| * |s| * 2 <= 32767), true for every caller here. */
AI __m512i dpbusd(__m512i acc, __m512i u, __m512i s, bool vnni)
{
    if (vnni)
        return _mm512_dpbusd_epi32(acc, u, s);
    __m512i p = _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
    return _mm512_add_epi32(acc, p);
}

AI __m256i dpbusd_256(__m256i acc, __m256i u, __m256i s, bool vnni)
{
    if (vnni)
        return _mm256_dpbusd_epi32(acc, u, s);
    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
    return _mm256_add_epi32(acc, p);
}

/* acc + sum over each 2 words of a * b (int16). */
AI __m512i dpwssd(__m512i acc, __m512i a, __m512i b, bool vnni)
{
    if (vnni)
        return _mm512_dpwssd_epi32(acc, a, b);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
}

AI __m512i load_2x256(const void *lo, const void *hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo)),
                              _mm256_loadu_si256((const __m256i *)hi), 1);
}

/* A zmm of 32 words: the low 16 = a, the high 16 = b. */
AI __m512i words_2x16(short a, short b)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(a)), _mm256_set1_epi16(b),
                              1);
}

AI float f16_load(uint16_t h)
{
    return _cvtsh_ss(h);
}

/* 16 packed nibbles -> 32 bytes: element j = low nibble of q[j], element j+16 = high nibble. */
AI __m256i nibbles_32(const uint8_t *q)
{
    __m128i x = _mm_loadu_si128((const __m128i *)q);
    __m256i both = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

/* ---- activation quantizers (same codes as the scalar ones, bit for bit) ---- */

/* 16 floats * id -> 16 int32 codes, clamped to [-127, 127] and rounded half to even. */
AI __m512i act_codes(const float *x, __m512 id)
{
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x), id);
    v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
    return _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

AI float absmax(const float *x, int n)
{
    __m512 m = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16)
        m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + j)));
    return _mm512_reduce_max_ps(m);
}

static void quantize_q8_0_avx512(const float *x, void *act, int64_t n)
{
    struct block_q8_0 *y = act;
    struct vec_dot_q8_0_extra *e = vec_dot_q8_0_extras(act, n);
    for (int64_t b = 0; b < n / QK_32; b++, x += QK_32) {
        float d = absmax(x, QK_32) / 127.0f;
        __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
        y[b].d = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        __m512i q0 = act_codes(x, id), q1 = act_codes(x + 16, id);
        _mm_storeu_si128((__m128i *)y[b].qs, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(y[b].qs + 16), _mm512_cvtepi32_epi8(q1));
        e[b].d = _cvtsh_ss(y[b].d);
        e[b].off = -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
}

static void quantize_q8_k_avx512(const float *x, void *act, int64_t n)
{
    struct block_q8_k *y = act;
    for (int64_t b = 0; b < n / QK_K; b++, x += QK_K) {
        float d = absmax(x, QK_K) / 127.0f;
        __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
        y[b].d = d;
        for (int g = 0; g < QK_K / 16; g++) {
            __m512i c = act_codes(x + 16 * g, id);
            _mm_storeu_si128((__m128i *)(y[b].qs + 16 * g), _mm512_cvtepi32_epi8(c));
            y[b].bsums[g] = (int16_t)_mm512_reduce_add_epi32(c);
        }
    }
}

static void quantize_f32_copy(const float *x, void *act, int64_t n)
{
    memcpy(act, x, (size_t)n * sizeof(float));
}

vec_dot_quantize_fn vec_dot_avx512_quantize_get(enum quant_type act_type)
{
    switch (act_type) {
    case QUANT_Q8_0:
        return quantize_q8_0_avx512;
    case QUANT_Q8_K:
        return quantize_q8_k_avx512;
    case QUANT_F32:
        return quantize_f32_copy;
    default:
        return NULL;
    }
}

/* ---- 32-element blocks with Q8_0 activations ----
 * Blocks go in groups of 16: one gather each fetches the 16 weight and the 16 activation
 * scales (a vector conversion instead of 32 scalar ones). Q8_0, MXFP4 and Q4_0 (one body) sum
 * each block's dot first (vec_dot.h's order).
 * Each body is an always-inline function of `vnni`, instantiated twice. */

#define GROUP 16

/* Byte offsets of 16 consecutive blocks of `size` bytes. */
AI __m512i block_offsets(int size)
{
    return _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(size));
}

/* The f16 at the start of each of 16 blocks (offsets from block_offsets), as floats. The
 * gather reads 4 bytes per block, all inside the block. */
AI __m512 f16_scales16(const void *base, __m512i offs)
{
    __m512i g = _mm512_i32gather_epi32(offs, base, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
}

AI __m256i dot_s8_256(__m256i w, __m256i a, bool vnni)
{
    return dpbusd_256(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w), vnni);
}

/* Signed weight bytes w times activation bytes a as |w| * (a * sign(w)): vpdpbusd takes its
 * first operand unsigned (|-128| = 128 read unsigned is right too) and the activation codes are
 * in [-127, 127], so negating them cannot overflow. |w| and the sign mask are the weight half,
 * shared by all activation rows; each row adds one masked negation and one dpbusd. */
AI __m512i dot_s8_act(__m512i w_abs, __mmask64 w_neg, __m512i a, bool vnni)
{
    __m512i as = _mm512_mask_sub_epi8(a, w_neg, _mm512_setzero_si512(), a);
    return dpbusd(_mm512_setzero_si512(), w_abs, as, vnni);
}

/* The scales of 16 activation blocks, from their extras (vec_dot.h: floats 8 bytes apart). */
AI __m512 act_scales16(const struct vec_dot_q8_0_extra *e)
{
    const __m512i even =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    return _mm512_permutex2var_ps(_mm512_loadu_ps(e), even, _mm512_loadu_ps(e + 8));
}

/* The scales of activation blocks b, b + 1 (both present), i2, i3 from their extras. */
AI __m128 act_scales4(const struct vec_dot_q8_0_extra *e, int64_t b, int64_t i2, int64_t i3)
{
    __m128 x0 = _mm_loadu_ps(&e[b].d);
    __m128 x1 = _mm_castsi128_ps(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)&e[i2]),
                                                    _mm_loadl_epi64((const __m128i *)&e[i3])));
    return _mm_shuffle_ps(x0, x1, 0x88);
}

/* The sum of the 8 lanes of x, in lane 0. */
AI __m128i sum8_epi32(__m256i x)
{
    __m128i x4 = _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    x4 = _mm_add_epi32(x4, _mm_shuffle_epi32(x4, 0x4e));
    return _mm_add_epi32(x4, _mm_shuffle_epi32(x4, 0xb1));
}

/* Per 128 bits: [a0 + a1, a2 + a3, b0 + b1, b2 + b3] (in-lane shuffles only). */
AI __m512i pair_sums(__m512i a, __m512i b)
{
    __m512 fa = _mm512_castsi512_ps(a), fb = _mm512_castsi512_ps(b);
    return _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(fa, fb, 0x88)),
                            _mm512_castps_si512(_mm512_shuffle_ps(fa, fb, 0xdd)));
}

/* 128-bit lanes: [a0 + a1, a2 + a3, b0 + b1, b2 + b3]. */
AI __m512i lane_sums(__m512i a, __m512i b)
{
    return _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, 0x88), _mm512_shuffle_i32x4(a, b, 0xdd));
}

/* The dots of 4 blocks in lanes 0-3 from p0 and p1, whose dpbusd lanes 0-7 and 8-15 hold the
 * 4-element sums of blocks (0, 2) and (1, 3). */
AI __m128i quad_sums(__m512i p0, __m512i p1)
{
    __m512i q = pair_sums(p0, p1); /* 128-bit lanes 0, 1: [0 0 1 1]; 2, 3: [2 2 3 3] */
    q = pair_sums(q, q);           /* [0 1 0 1], [2 3 2 3] */
    q = _mm512_add_epi32(q, _mm512_shuffle_i32x4(q, q, 0xb1)); /* lanes 0, 2 complete */
    return _mm_unpacklo_epi64(_mm512_castsi512_si128(q), _mm512_extracti32x4_epi32(q, 2));
}

/* Q8_0, MXFP4 and Q4_0 weights in one body (wt: which): blocks of 32 signed values (MXFP4: the
 * doubled E2M1 values of its table, VEC_DOT_MXFP4_VALUES; Q4_0: the nibbles - 8) with one float
 * scale each (MXFP4: half the block scale, vec_dot_e8m0_half). */
AI size_t q8w_size(uint32_t wt)
{
    return wt == QUANT_MXFP4  ? sizeof(struct block_mxfp4)
           : wt == QUANT_Q4_0 ? sizeof(struct block_q4_0)
                              : sizeof(struct block_q8_0);
}

/* The values of blocks i and j, [i 0-31, j 0-31]. */
AI __m512i q8w_pair(const uint8_t *w, int64_t i, int64_t j, uint32_t wt)
{
    if (wt == QUANT_MXFP4) {
        const struct block_mxfp4 *m = (const struct block_mxfp4 *)w;
        return vec_dot_mxfp4_values(vec_dot_nibbles_pair(m[i].qs, m[j].qs));
    }
    if (wt == QUANT_Q4_0) {
        const struct block_q4_0 *q = (const struct block_q4_0 *)w;
        return _mm512_sub_epi8(vec_dot_nibbles_pair(q[i].qs, q[j].qs), _mm512_set1_epi8(8));
    }
    const struct block_q8_0 *q = (const struct block_q8_0 *)w;
    return load_2x256(q[i].qs, q[j].qs);
}

/* The values of block i. */
AI __m256i q8w_one(const uint8_t *w, int64_t i, uint32_t wt)
{
    if (wt == QUANT_MXFP4) {
        const struct block_mxfp4 *m = (const struct block_mxfp4 *)w;
        return _mm512_castsi512_si256(
            vec_dot_mxfp4_values(_mm512_castsi256_si512(nibbles_32(m[i].qs))));
    }
    if (wt == QUANT_Q4_0)
        return _mm256_sub_epi8(nibbles_32(((const struct block_q4_0 *)w)[i].qs),
                               _mm256_set1_epi8(8));
    return _mm256_loadu_si256((const __m256i *)((const struct block_q8_0 *)w)[i].qs);
}

/* The scale of block i. */
AI float q8w_scale(const uint8_t *w, int64_t i, uint32_t wt)
{
    if (wt == QUANT_MXFP4)
        return vec_dot_e8m0_half(((const struct block_mxfp4 *)w)[i].e);
    uint16_t d;
    memcpy(&d, w + (size_t)i * q8w_size(wt), 2); /* Q8_0 and Q4_0 start with their f16 d */
    return f16_load(d);
}

/* The scales of the 16 blocks from b (offs: block_offsets of the type's size). */
AI __m512 q8w_scales16(const uint8_t *w, int64_t b, __m512i offs, uint32_t wt)
{
    const uint8_t *base = w + (size_t)b * q8w_size(wt);
    return wt == QUANT_MXFP4 ? vec_dot_e8m0_half16(_mm512_i32gather_epi32(offs, base, 1))
                             : f16_scales16(base, offs);
}

/* The Q8_0 (MXFP4, Q4_0: wt) dot of one weight row with nr activation rows (act + r * act_stride),
 * out[r], in vec_dot.h's order: each row's arithmetic is the single dot's (nr = 1), so every out[r]
 * equals it bit for bit; the weights are loaded and prepared once for all rows.
 *
 * Groups of 16 blocks: one gather fetches the 16 weight scales (the activation scales are
 * floats in the row's extras); blocks k and k + 4 (k = 0..3, 8..11) fill a zmm whose dpbusd
 * lanes hold 4-element sums, 8 per block; two rounds of pair_sums and one of lane_sums turn
 * the 8 vectors into one with the 16 blocks' dots in block order, and one FMA per quarter adds
 * them to the 4 accumulators (lane k of an xmm: blocks b % 4 == k). The blocks after the last
 * group go 4 at a time the same way, with scalar weight scales (a block past the end reads the
 * last one again and is masked out); a lone last block takes a 256-bit dot. */
AI void dot_q8w_body(int64_t n, const void *w_row, const void *act, size_t act_stride, int nr,
                     float *out, bool vnni, uint32_t wt)
{
    const uint8_t *w = w_row;
    const struct block_q8_0 *a[VEC_DOT_ROWS];
    const struct vec_dot_q8_0_extra *e[VEC_DOT_ROWS];
    const __m512i offs = block_offsets((int)q8w_size(wt));
    __m128 acc[VEC_DOT_ROWS];
    for (int r = 0; r < nr; r++) {
        a[r] = (const struct block_q8_0 *)((const uint8_t *)act + r * act_stride);
        e[r] = vec_dot_q8_0_extras((void *)a[r], n);
        acc[r] = _mm_setzero_ps();
    }
    _Static_assert(VEC_DOT_Q8_0_ACC == 4 && GROUP == 16, "one xmm of accumulators per row");
    int64_t nb = n / QK_32, b = 0;
    for (; b + GROUP <= nb; b += GROUP) {
        VEC_DOT_PREFETCH(w + (size_t)b * q8w_size(wt), GROUP * q8w_size(wt));
        __m512 dw = q8w_scales16(w, b, offs, wt), d[VEC_DOT_ROWS];
        for (int r = 0; r < nr; r++)
            d[r] = _mm512_mul_ps(dw, act_scales16(e[r] + b));
        __m512i q[VEC_DOT_ROWS][4];
        for (int k = 0; k < 4; k++) {
            /* blocks i, i + 4 and i + 1, i + 5: after pair_sums, 128-bit lanes 0-1 hold blocks
             * i, i + 1 and lanes 2-3 i + 4, i + 5 */
            const int64_t i = b + 8 * (k / 2) + 2 * (k % 2);
            __m512i w0 = q8w_pair(w, i, i + 4, wt);
            __m512i w1 = q8w_pair(w, i + 1, i + 5, wt);
            __m512i wa0 = _mm512_abs_epi8(w0), wa1 = _mm512_abs_epi8(w1);
            __mmask64 wn0 = _mm512_movepi8_mask(w0), wn1 = _mm512_movepi8_mask(w1);
            for (int r = 0; r < nr; r++) {
                const struct block_q8_0 *ar = a[r];
                __m512i p0 = dot_s8_act(wa0, wn0, load_2x256(ar[i].qs, ar[i + 4].qs), vnni);
                __m512i p1 = dot_s8_act(wa1, wn1, load_2x256(ar[i + 1].qs, ar[i + 5].qs), vnni);
                q[r][k] = pair_sums(p0, p1);
            }
        }
        for (int r = 0; r < nr; r++) {
            /* pair_sums: 128-bit lanes 0-1 blocks 0-3 (halves), 2-3 blocks 4-7; 8-15 alike */
            __m512 s = _mm512_cvtepi32_ps(
                lane_sums(pair_sums(q[r][0], q[r][1]), pair_sums(q[r][2], q[r][3])));
            acc[r] = _mm_fmadd_ps(_mm512_castps512_ps128(s), _mm512_castps512_ps128(d[r]), acc[r]);
            acc[r] =
                _mm_fmadd_ps(_mm512_extractf32x4_ps(s, 1), _mm512_extractf32x4_ps(d[r], 1), acc[r]);
            acc[r] =
                _mm_fmadd_ps(_mm512_extractf32x4_ps(s, 2), _mm512_extractf32x4_ps(d[r], 2), acc[r]);
            acc[r] =
                _mm_fmadd_ps(_mm512_extractf32x4_ps(s, 3), _mm512_extractf32x4_ps(d[r], 3), acc[r]);
        }
    }
    for (; b + 1 < nb; b += 4) {
        const int cnt = nb - b < 4 ? (int)(nb - b) : 4; /* 2, 3 or 4 */
        const int64_t i1 = b + 1, i2 = cnt > 2 ? b + 2 : i1, i3 = b + cnt - 1;
        const __mmask8 live = (__mmask8)((1u << cnt) - 1);
        __m512i w0 = q8w_pair(w, b, i2, wt), w1 = q8w_pair(w, i1, i3, wt);
        __m512i wa0 = _mm512_abs_epi8(w0), wa1 = _mm512_abs_epi8(w1);
        __mmask64 wn0 = _mm512_movepi8_mask(w0), wn1 = _mm512_movepi8_mask(w1);
        __m128 dw = _mm_setr_ps(q8w_scale(w, b, wt), q8w_scale(w, i1, wt), q8w_scale(w, i2, wt),
                                q8w_scale(w, i3, wt));
        for (int r = 0; r < nr; r++) {
            const struct block_q8_0 *ar = a[r];
            __m512i p0 = dot_s8_act(wa0, wn0, load_2x256(ar[b].qs, ar[i2].qs), vnni);
            __m512i p1 = dot_s8_act(wa1, wn1, load_2x256(ar[i1].qs, ar[i3].qs), vnni);
            __m128 d = _mm_mul_ps(dw, act_scales4(e[r], b, i2, i3));
            acc[r] = _mm_mask3_fmadd_ps(_mm_cvtepi32_ps(quad_sums(p0, p1)), d, acc[r], live);
        }
    }
    if (b < nb) { /* a lone last block, into accumulator 0 (b is a multiple of 4) */
        __m256i w0 = q8w_one(w, b, wt);
        for (int r = 0; r < nr; r++) {
            __m256i p = dot_s8_256(w0, _mm256_loadu_si256((const __m256i *)a[r][b].qs), vnni);
            __m128 d = _mm_set_ss(q8w_scale(w, b, wt) * e[r][b].d);
            acc[r] = _mm_mask3_fmadd_ss(_mm_cvtepi32_ps(sum8_epi32(p)), d, acc[r], 1);
        }
    }
    for (int r = 0; r < nr; r++) {
        __m128 h = _mm_add_ps(acc[r], _mm_movehdup_ps(acc[r])); /* lanes 0, 2: acc 0+1, 2+3 */
        out[r] = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehl_ps(h, h)));
    }
}

/* ---- K-quants with Q8_K activations ---- */

/* sum_s mins[s] * (bsums[2s] + bsums[2s+1]) as 8 int32 lanes (8 mins as bytes): each min is
 * duplicated to the two bsums of its sub-block. */
AI __m256i k4_mins16(uint64_t mins8)
{
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_cvtsi64_si128((long long)mins8), dup));
}

/* sum_s mins[s] * (bsums[2s] + bsums[2s+1]) as 8 int32 lanes, from k4_mins16 (each min
 * duplicated to the two bsums of its sub-block). */
AI __m256i k4_min_sums(const int16_t *bsums, __m256i mins16)
{
    return _mm256_madd_epi16(mins16, _mm256_loadu_si256((const __m256i *)bsums));
}

/* [isum, msum, isum, msum]: the sums of the lanes of i and of m. */
AI __m128i isum_msum(__m512i i, __m256i m)
{
    __m256i i8 = _mm256_add_epi32(_mm512_castsi512_si256(i), _mm512_extracti64x4_epi64(i, 1));
    __m256i t = _mm256_hadd_epi32(i8, m); /* per 128 bits: i pairs, i pairs, m pairs, m pairs */
    __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    return _mm_hadd_epi32(t4, t4);
}

/* The sum of the 16 lanes of x, in lane 0. */
AI __m128i sum16_epi32(__m512i x)
{
    return sum8_epi32(_mm256_add_epi32(_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64(x, 1)));
}

/* [d, dmin] of a Q4_K/Q5_K block (d, dmin adjacent f16) as floats; times a Q8_K block's d
 * gives [d * a_d, dmin * a_d]. */
AI __m128 k4_d_dmin(const void *d_dmin)
{
    uint32_t bits;
    memcpy(&bits, d_dmin, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)bits));
}

/* Q4_K and Q5_K share everything but the 5th bit. One zmm holds 64 code bytes of qs: its low
 * nibbles are sub-blocks 4j (bytes 0..31) and 4j+2 (bytes 32..63), its high nibbles 4j+1 and
 * 4j+3, so the matching activations are the 256-bit halves of two 64-byte loads. nr activation
 * rows at act + r * act_stride, as in dot_q8_0_body (bit for bit the single dot's sums). */
AI void dot_k45_body(int64_t n, const void *w_row, const void *act, size_t act_stride, int nr,
                     float *out, bool five, bool vnni)
{
    const struct block_q8_k *a[VEC_DOT_ROWS];
    const size_t bsize = five ? sizeof(struct block_q5_k) : sizeof(struct block_q4_k);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    /* word index vectors selecting the scale of each 16-word half */
    const __m512i sidx[4] = {words_2x16(0, 2), words_2x16(1, 3), words_2x16(4, 6),
                             words_2x16(5, 7)};
    __m128 acc[VEC_DOT_ROWS]; /* lane 0: acc_i, lane 1: acc_m (vec_dot.h) */
    for (int r = 0; r < nr; r++) {
        a[r] = (const struct block_q8_k *)((const uint8_t *)act + r * act_stride);
        acc[r] = _mm_setzero_ps();
    }
    for (int64_t b = 0; b < n / QK_K; b++) {
        const uint8_t *blk = (const uint8_t *)w_row + b * bsize;
        VEC_DOT_PREFETCH(blk, bsize);
        /* Q4_K and Q5_K start alike: d, dmin, scales[12]; then Q5_K has qh[32] before qs */
        const struct block_q4_k *w4 = (const struct block_q4_k *)blk;
        const uint8_t *qs = five ? ((const struct block_q5_k *)blk)->qs : w4->qs;
        uint32_t sm[4];
        vec_dot_k4_scales(w4->scales, sm);
        const __m256i mins16 = k4_mins16((uint64_t)sm[2] | (uint64_t)sm[3] << 32);
        const __m128 dd = k4_d_dmin(&w4->d);
        __m512i sc = _mm512_castsi128_si512(_mm_cvtepu8_epi16(
            _mm_cvtsi64_si128((long long)((uint64_t)sm[0] | (uint64_t)sm[1] << 32))));
        __m512i qh = _mm512_setzero_si512();
        if (five)
            qh = _mm512_broadcast_i64x4(
                _mm256_loadu_si256((const __m256i *)((const struct block_q5_k *)blk)->qh));
        __m512i isum[VEC_DOT_ROWS][2];
        for (int r = 0; r < nr; r++)
            isum[r][0] = isum[r][1] = _mm512_setzero_si512();
        for (int j = 0; j < 2; j++) {
            __m512i qb = _mm512_loadu_si512(qs + 64 * j);
            __m512i lo = _mm512_and_si512(qb, m4);
            __m512i hi = _mm512_and_si512(_mm512_srli_epi16(qb, 4), m4);
            if (five) {
                /* 5th bit of sub-block s is bit s of qh: add 16 where it is set */
                const __m512i sixteen = _mm512_set1_epi8(16);
                __m512i blo = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (4 * j))),
                                                 _mm256_set1_epi8((char)(1 << (4 * j + 2))), 1);
                __m512i bhi = _mm512_slli_epi16(blo, 1);
                lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, blo), lo, sixteen);
                hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(qh, bhi), hi, sixteen);
            }
            __m512i slo = _mm512_permutexvar_epi16(sidx[2 * j], sc);
            __m512i shi = _mm512_permutexvar_epi16(sidx[2 * j + 1], sc);
            for (int r = 0; r < nr; r++) {
                const int8_t *y = a[r][b].qs;
                __m512i y0 = _mm512_loadu_si512(y + 128 * j);
                __m512i y1 = _mm512_loadu_si512(y + 128 * j + 64);
                __m512i plo = _mm512_maddubs_epi16(lo, _mm512_shuffle_i64x2(y0, y1, 0x44));
                __m512i phi = _mm512_maddubs_epi16(hi, _mm512_shuffle_i64x2(y0, y1, 0xee));
                isum[r][j] = dpwssd(isum[r][j], plo, slo, vnni);
                isum[r][j] = dpwssd(isum[r][j], phi, shi, vnni);
            }
        }
        for (int r = 0; r < nr; r++) {
            __m128 f = _mm_mul_ps(dd, _mm_set1_ps(a[r][b].d)); /* [d * a_d, dmin * a_d, 0, 0] */
            __m128i im = isum_msum(_mm512_add_epi32(isum[r][0], isum[r][1]),
                                   k4_min_sums(a[r][b].bsums, mins16));
            acc[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(im), f, acc[r]);
        }
    }
    for (int r = 0; r < nr; r++)
        out[r] = _mm_cvtss_f32(_mm_sub_ss(acc[r], _mm_movehdup_ps(acc[r])));
}

/* Lanes 0, 1: the sums of the lanes of x and of y (sharing their steps). */
AI __m128i sums2_epi32(__m512i x, __m512i y)
{
    __m256i x8 = _mm256_add_epi32(_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64(x, 1));
    __m256i y8 = _mm256_add_epi32(_mm512_castsi512_si256(y), _mm512_extracti64x4_epi64(y, 1));
    __m256i t = _mm256_hadd_epi32(x8, y8); /* per 128 bits: x pairs, x pairs, y pairs, y pairs */
    __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    return _mm_hadd_epi32(t4, t4);
}

/* Q6_K constants: scale index vectors (word i of the products of half h, part t uses scale
 * 8h + 4t + i/8) and shift counts for the high bits. */
struct q6_k_consts {
    __m512i sidx[4], shift_lo, shift_hi, m4, m3;
};

AI void q6_k_consts_init(struct q6_k_consts *c)
{
    for (int k = 0; k < 4; k++) {
        short base = (short)(4 * k);
        c->sidx[k] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_setr_epi16(base, base, base, base, base, base, base, base,
                                                     base + 1, base + 1, base + 1, base + 1,
                                                     base + 1, base + 1, base + 1, base + 1)),
            _mm256_setr_epi16(base + 2, base + 2, base + 2, base + 2, base + 2, base + 2, base + 2,
                              base + 2, base + 3, base + 3, base + 3, base + 3, base + 3, base + 3,
                              base + 3, base + 3),
            1);
    }
    c->shift_lo = words_2x16(0, 2), c->shift_hi = words_2x16(4, 6);
    c->m4 = _mm512_set1_epi8(0x0f), c->m3 = _mm512_set1_epi8(3);
}

/* Block wb of a Q6_K row against block b of nr activation rows: isum[r] in 16 int32 lanes
 * summing to sum of scale * (code - 32) * a. Per half h, one zmm of ql gives sub-blocks (of
 * 32) 0,1 in its low nibbles and 2,3 in its high nibbles, in element order; codes go in
 * unsigned (0..63), and the offset as bsums times -32 * the scales. */
AI void q6_k_isum(const struct block_q6_k *wb, const struct block_q8_k *const *a, int64_t b, int nr,
                  const struct q6_k_consts *c, __m512i *isum, bool vnni)
{
    VEC_DOT_PREFETCH(wb, sizeof(*wb));
    __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)wb->scales));
    __m512i sc = _mm512_castsi256_si512(sc16);
    __m512i off = _mm512_zextsi256_si512(
        _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5)));
    for (int r = 0; r < nr; r++)
        isum[r] = dpwssd(_mm512_setzero_si512(),
                         _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a[r][b].bsums)),
                         off, vnni);
    for (int h = 0; h < 2; h++) {
        __m512i ql = _mm512_loadu_si512(wb->ql + 64 * h);
        __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(wb->qh + 32 * h)));
        __m512i hlo = _mm512_and_si512(_mm512_srlv_epi16(qh, c->shift_lo), c->m3);
        __m512i hhi = _mm512_and_si512(_mm512_srlv_epi16(qh, c->shift_hi), c->m3);
        __m512i qlo = _mm512_or_si512(_mm512_and_si512(ql, c->m4), _mm512_slli_epi16(hlo, 4));
        __m512i qhi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), c->m4),
                                      _mm512_slli_epi16(hhi, 4));
        __m512i slo = _mm512_permutexvar_epi16(c->sidx[2 * h], sc);
        __m512i shi = _mm512_permutexvar_epi16(c->sidx[2 * h + 1], sc);
        for (int r = 0; r < nr; r++) {
            const int8_t *y = a[r][b].qs;
            __m512i plo = _mm512_maddubs_epi16(qlo, _mm512_loadu_si512(y + 128 * h));
            __m512i phi = _mm512_maddubs_epi16(qhi, _mm512_loadu_si512(y + 128 * h + 64));
            isum[r] = dpwssd(isum[r], plo, slo, vnni);
            isum[r] = dpwssd(isum[r], phi, shi, vnni);
        }
    }
}

/* Q6_K: nr activation rows at act + r * act_stride, as in dot_q8_0_body; blocks in pairs, whose
 * sums share their reduction steps. The bsums of an activation block are 16 words, so the upper
 * half of their zmm is never used (the offset vector is 0 there). */
AI void dot_q6_k_body(int64_t n, const void *w_row, const void *act, size_t act_stride, int nr,
                      float *out, bool vnni)
{
    const struct block_q6_k *w = w_row;
    const struct block_q8_k *a[VEC_DOT_ROWS];
    struct q6_k_consts c;
    q6_k_consts_init(&c);
    __m128 acc[VEC_DOT_ROWS]; /* lane 0 (vec_dot.h) */
    for (int r = 0; r < nr; r++) {
        a[r] = (const struct block_q8_k *)((const uint8_t *)act + r * act_stride);
        acc[r] = _mm_setzero_ps();
    }
    const int64_t nb = n / QK_K;
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        __m512i i0[VEC_DOT_ROWS], i1[VEC_DOT_ROWS];
        q6_k_isum(&w[b], a, b, nr, &c, i0, vnni);
        q6_k_isum(&w[b + 1], a, b + 1, nr, &c, i1, vnni);
        float dw0 = f16_load(w[b].d), dw1 = f16_load(w[b + 1].d);
        for (int r = 0; r < nr; r++) {
            __m128 s = _mm_cvtepi32_ps(sums2_epi32(i0[r], i1[r]));
            acc[r] = _mm_fmadd_ss(s, _mm_set_ss(dw0 * a[r][b].d), acc[r]);
            acc[r] = _mm_fmadd_ss(_mm_movehdup_ps(s), _mm_set_ss(dw1 * a[r][b + 1].d), acc[r]);
        }
    }
    if (b < nb) {
        __m512i i0[VEC_DOT_ROWS];
        q6_k_isum(&w[b], a, b, nr, &c, i0, vnni);
        float dw = f16_load(w[b].d);
        for (int r = 0; r < nr; r++)
            acc[r] = _mm_fmadd_ss(_mm_cvtepi32_ps(sum16_epi32(i0[r])), _mm_set_ss(dw * a[r][b].d),
                                  acc[r]);
    }
    for (int r = 0; r < nr; r++)
        out[r] = _mm_cvtss_f32(acc[r]);
}

/* Q2_K and Q3_K: per 64 elements (half h, quarter pair jj) one zmm of 2-bit codes (Q3_K: with
 * the high bit, 0..7) in element order against 64 activation codes, the pair sums (vpmaddubsw)
 * scaled per 16-element sub-block by vpdpwssd with the sub-block's scale repeated over its 8
 * words (q6_k_consts' sidx). In vec_dot.h's K-quant order per block: Q2_K acc_i = fma(isum,
 * d * a_d), acc_m = fma(msum, dmin * a_d), the dot acc_i - acc_m, where msum = mins . bsums;
 * Q3_K acc = fma(isum, d * a_d), where isum takes 4 * scales . bsums off (its values are the
 * codes - 4). */

/* The 2-bit fields j (bits 2j, 2j + 1) of 32 bytes. */
AI __m256i bits2(__m256i q, int j)
{
    return _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), _mm256_set1_epi8(3));
}

/* Codes j and j + 1 of 32 bytes (Q3_K: with the high bits from hm, bits 4h + j and 4h + j + 1
 * of each byte) side by side: 64 elements in order. */
AI __m512i low_pair(__m256i q, __m256i hm, int h, int j, bool high)
{
    __m256i c0 = bits2(q, j), c1 = bits2(q, j + 1);
    if (high) {
        const __m256i one = _mm256_set1_epi8(1);
        c0 = _mm256_or_si256(
            c0, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + j), one), 2));
        c1 = _mm256_or_si256(
            c1, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + j + 1), one), 2));
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1);
}

/* Q2_K (q3 false) or Q3_K (q3 true): one weight row against nr activation rows (act + r *
 * act_stride), as in dot_q8w_body: the codes and scales are unpacked once per block, and each
 * row's arithmetic is the single dot's (nr = 1). */
AI void dot_lowk_body(int64_t n, const void *w_row, const void *act, size_t act_stride, int nr,
                      float *out, bool vnni, bool q3)
{
    const struct block_q8_k *a[VEC_DOT_ROWS];
    const size_t bsize = q3 ? sizeof(struct block_q3_k) : sizeof(struct block_q2_k);
    struct q6_k_consts c;
    q6_k_consts_init(&c);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128 acc[VEC_DOT_ROWS]; /* Q2_K: lane 0 acc_i, lane 1 acc_m; Q3_K: lane 0 */
    for (int r = 0; r < nr; r++) {
        a[r] = (const struct block_q8_k *)((const uint8_t *)act + r * act_stride);
        acc[r] = _mm_setzero_ps();
    }
    for (int64_t b = 0; b < n / QK_K; b++) {
        const uint8_t *blk = (const uint8_t *)w_row + b * bsize;
        const struct block_q2_k *w2 = (const struct block_q2_k *)blk;
        const struct block_q3_k *w3 = (const struct block_q3_k *)blk;
        VEC_DOT_PREFETCH(blk, bsize);
        __m256i sc16, mins = _mm256_setzero_si256(), hm = _mm256_setzero_si256();
        if (q3) {
            sc16 = _mm256_cvtepi8_epi16(vec_dot_q3_k_scales8(w3->scales));
            hm = _mm256_loadu_si256((const __m256i *)w3->hmask);
        } else {
            __m128i s8 = _mm_loadu_si128((const __m128i *)w2->scales);
            sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s8, m4));
            mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), m4));
        }
        const __m512i sc = _mm512_castsi256_si512(sc16);
        /* Q3_K's values are the codes - 4: -4 * scales . bsums to start */
        const __m512i off4 = _mm512_zextsi256_si512(
            _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 2)));
        __m512i isum[VEC_DOT_ROWS];
        for (int r = 0; r < nr; r++)
            isum[r] = q3 ? dpwssd(_mm512_setzero_si512(),
                                  _mm512_castsi256_si512(
                                      _mm256_loadu_si256((const __m256i *)a[r][b].bsums)),
                                  off4, vnni)
                         : _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)((q3 ? w3->qs : w2->qs) + 32 * h));
            for (int jj = 0; jj < 2; jj++) {
                __m512i codes = low_pair(q, hm, h, 2 * jj, q3);
                __m512i sv = _mm512_permutexvar_epi16(c.sidx[2 * h + jj], sc);
                for (int r = 0; r < nr; r++) {
                    __m512i p = _mm512_maddubs_epi16(
                        codes, _mm512_loadu_si512(a[r][b].qs + 128 * h + 64 * jj));
                    isum[r] = dpwssd(isum[r], p, sv, vnni);
                }
            }
        }
        for (int r = 0; r < nr; r++) {
            if (q3) {
                acc[r] = _mm_fmadd_ss(_mm_cvtepi32_ps(sum16_epi32(isum[r])),
                                      _mm_set_ss(f16_load(w3->d) * a[r][b].d), acc[r]);
            } else {
                __m256i msum =
                    _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)a[r][b].bsums));
                __m128 f = _mm_mul_ps(k4_d_dmin(&w2->d), _mm_set1_ps(a[r][b].d));
                acc[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(isum_msum(isum[r], msum)), f, acc[r]);
            }
        }
    }
    for (int r = 0; r < nr; r++)
        out[r] = _mm_cvtss_f32(q3 ? acc[r] : _mm_sub_ss(acc[r], _mm_movehdup_ps(acc[r])));
}

/* ---- float weights with F32 activations ---- */

AI __m512 load_f32x16(const void *p, __mmask16 k)
{
    return _mm512_maskz_loadu_ps(k, p);
}

AI __m512 load_f16x16(const void *p, __mmask16 k)
{
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p));
}

AI __m512 load_bf16x16(const void *p, __mmask16 k)
{
    __m512i x = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}

/* wsize: bytes per weight element (4 F32, 2 F16/BF16); bf16 selects the BF16 decoding. */
AI float dot_float_body(int64_t n, const void *w_row, const void *act, int wsize, bool bf16)
{
    const uint8_t *w = w_row;
    const float *a = act;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
#define LOADW(i, k)                                                                                \
    (wsize == 4 ? load_f32x16(w + 4 * (i), k)                                                      \
     : bf16     ? load_bf16x16(w + 2 * (i), k)                                                     \
                : load_f16x16(w + 2 * (i), k))
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        VEC_DOT_PREFETCH(w + wsize * i, 64 * wsize);
        for (int k = 0; k < 4; k++)
            acc[k] =
                _mm512_fmadd_ps(LOADW(i + 16 * k, 0xffff), _mm512_loadu_ps(a + i + 16 * k), acc[k]);
    }
    for (; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        acc[0] = _mm512_fmadd_ps(LOADW(i, k), _mm512_maskz_loadu_ps(k, a + i), acc[0]);
    }
#undef LOADW
    return _mm512_reduce_add_ps(
        _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

/* ---- instances ---- */

#define INSTANCES(name, call)                                                                      \
    static float dot_##name##_avx512(int64_t n, const void *w, const void *a)                      \
    {                                                                                              \
        bool vnni = false;                                                                         \
        return call;                                                                               \
    }                                                                                              \
    static float dot_##name##_avx512vnni(int64_t n, const void *w, const void *a)                  \
    {                                                                                              \
        bool vnni = true;                                                                          \
        return call;                                                                               \
    }

/* A single dot and a VEC_DOT_ROWS-row dot from one multi-row body. */
#define ROWS_INSTANCES(name, body)                                                                 \
    AI float one_##name(int64_t n, const void *w, const void *a, bool vnni)                        \
    {                                                                                              \
        float out;                                                                                 \
        body(n, w, a, 0, 1, &out, vnni);                                                           \
        return out;                                                                                \
    }                                                                                              \
    INSTANCES(name, one_##name(n, w, a, vnni))                                                     \
    static void dot_##name##_rows_avx512(int64_t n, const void *w, const void *a, size_t stride,   \
                                         float *out)                                               \
    {                                                                                              \
        body(n, w, a, stride, VEC_DOT_ROWS, out, false);                                           \
    }                                                                                              \
    static void dot_##name##_rows_avx512vnni(int64_t n, const void *w, const void *a,              \
                                             size_t stride, float *out)                            \
    {                                                                                              \
        body(n, w, a, stride, VEC_DOT_ROWS, out, true);                                            \
    }

/* A multi-row body of the ROWS_INSTANCES form from one shared by two types (flag: which). */
#define FLAG_BODY(name, shared, flag)                                                              \
    AI void name(int64_t n, const void *w, const void *a, size_t stride, int nr, float *out,       \
                 bool vnni)                                                                        \
    {                                                                                              \
        shared(n, w, a, stride, nr, out, vnni, flag);                                              \
    }
#define K45_BODY(n, w, a, stride, nr, out, vnni, five)                                             \
    dot_k45_body(n, w, a, stride, nr, out, five, vnni)
FLAG_BODY(dot_q4_k_rows_body, K45_BODY, false)
FLAG_BODY(dot_q5_k_rows_body, K45_BODY, true)
FLAG_BODY(dot_q8_0_body, dot_q8w_body, QUANT_Q8_0)
FLAG_BODY(dot_mxfp4_body, dot_q8w_body, QUANT_MXFP4)
FLAG_BODY(dot_q4_0_body, dot_q8w_body, QUANT_Q4_0)
FLAG_BODY(dot_q2_k_body, dot_lowk_body, false)
FLAG_BODY(dot_q3_k_body, dot_lowk_body, true)
#undef K45_BODY
#undef FLAG_BODY

ROWS_INSTANCES(q8_0, dot_q8_0_body)
ROWS_INSTANCES(mxfp4, dot_mxfp4_body)
ROWS_INSTANCES(q4_0, dot_q4_0_body)
ROWS_INSTANCES(q2_k, dot_q2_k_body)
ROWS_INSTANCES(q3_k, dot_q3_k_body)
ROWS_INSTANCES(q4_k, dot_q4_k_rows_body)
ROWS_INSTANCES(q5_k, dot_q5_k_rows_body)
ROWS_INSTANCES(q6_k, dot_q6_k_body)

static float dot_f32_avx512(int64_t n, const void *w, const void *a)
{
    return dot_float_body(n, w, a, 4, false);
}

static float dot_f16_avx512(int64_t n, const void *w, const void *a)
{
    return dot_float_body(n, w, a, 2, false);
}

static float dot_bf16_avx512(int64_t n, const void *w, const void *a)
{
    return dot_float_body(n, w, a, 2, true);
}

vec_dot_fn vec_dot_avx512_get(uint32_t wtype, bool vnni)
{
    switch (wtype) {
    case QUANT_F32:
        return dot_f32_avx512;
    case QUANT_F16:
        return dot_f16_avx512;
    case QUANT_BF16:
        return dot_bf16_avx512;
    case QUANT_Q8_0:
        return vnni ? dot_q8_0_avx512vnni : dot_q8_0_avx512;
    case QUANT_Q4_0:
        return vnni ? dot_q4_0_avx512vnni : dot_q4_0_avx512;
    case QUANT_MXFP4:
        return vnni ? dot_mxfp4_avx512vnni : dot_mxfp4_avx512;
    case QUANT_Q2_K:
        return vnni ? dot_q2_k_avx512vnni : dot_q2_k_avx512;
    case QUANT_Q3_K:
        return vnni ? dot_q3_k_avx512vnni : dot_q3_k_avx512;
    case QUANT_Q4_K:
        return vnni ? dot_q4_k_avx512vnni : dot_q4_k_avx512;
    case QUANT_Q5_K:
        return vnni ? dot_q5_k_avx512vnni : dot_q5_k_avx512;
    case QUANT_Q6_K:
        return vnni ? dot_q6_k_avx512vnni : dot_q6_k_avx512;
    default:
        return NULL;
    }
}

vec_dot_rows_fn vec_dot_avx512_rows_get(uint32_t wtype, bool vnni)
{
    static const struct {
        uint32_t type;
        vec_dot_rows_fn fn[2]; /* without, with VNNI */
    } table[] = {
        {QUANT_Q8_0, {dot_q8_0_rows_avx512, dot_q8_0_rows_avx512vnni}},
        {QUANT_MXFP4, {dot_mxfp4_rows_avx512, dot_mxfp4_rows_avx512vnni}},
        {QUANT_Q4_0, {dot_q4_0_rows_avx512, dot_q4_0_rows_avx512vnni}},
        {QUANT_Q2_K, {dot_q2_k_rows_avx512, dot_q2_k_rows_avx512vnni}},
        {QUANT_Q3_K, {dot_q3_k_rows_avx512, dot_q3_k_rows_avx512vnni}},
        {QUANT_Q4_K, {dot_q4_k_rows_avx512, dot_q4_k_rows_avx512vnni}},
        {QUANT_Q5_K, {dot_q5_k_rows_avx512, dot_q5_k_rows_avx512vnni}},
        {QUANT_Q6_K, {dot_q6_k_rows_avx512, dot_q6_k_rows_avx512vnni}},
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (table[i].type == wtype)
            return table[i].fn[vnni];
    return NULL;
}
