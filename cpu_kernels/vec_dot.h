/* vec_dot: the dot product of one quantized weight row with one activation row, the inner
 * loop of every CPU matmul. The activation is first converted to the 8-bit format matching the
 * weight type (the scheme of ggml's CPU kernels), so the inner loop multiplies integers:
 *
 *   weight type                    activation format
 *   Q8_0, Q4_0, MXFP4              Q8_0 (block 32: f16 d, 32 int8 codes in [-127, 127]),
 *                                  the row's blocks followed by one vec_dot_q8_0_extra each
 *   Q2_K, Q3_K, Q4_K, Q5_K, Q6_K   Q8_K (block 256: f32 d, 256 int8 codes in [-127, 127],
 *                                        16 int16 sums of 16 codes)
 *   F32, F16, BF16                 F32 (a plain copy)
 *
 * Every kernel has a scalar reference; AVX2 and AVX-512 (with VNNI where present) variants are
 * chosen at run time from cpu_isa_best(). Integer sums are exact in every variant. The SIMD
 * variants of the types gemm covers (gemm.h: Q4_K, Q5_K and Q6_K at AVX2 and AVX-512, Q8_0,
 * MXFP4 and Q4_0 at AVX-512) also share one float arithmetic with gemm, operation for operation
 * (those files are built with -ffp-contract=off, so every FMA is one written as such), and so give
 * a row the same bits alone, in vec_dot_rows and in a gemm batch. Per block, in order, with a_d the
 * activation block's scale, each product x * y below one float multiplication and each
 * accumulator starting at 0:
 *   Q4_K, Q5_K  isum = sum of scale * code * a, msum = sum of min * (the sum of the sub-block's
 *               activation codes), exact integers; acc_i = fma(isum, d * a_d, acc_i),
 *               acc_m = fma(msum, dmin * a_d, acc_m); the dot is acc_i - acc_m
 *   Q6_K        isum = sum of scale * (code - 32) * a; acc = fma(isum, d * a_d, acc)
 *   Q2_K, Q3_K  as Q4_K and as Q6_K (values: code - 4)
 *   Q8_0        block b's isum = sum of w * a; acc[b % VEC_DOT_Q8_0_ACC] =
 *               fma(isum, d_w * d_a, acc[b % VEC_DOT_Q8_0_ACC]); the dot is
 *               (acc[0] + acc[1]) + (acc[2] + acc[3])
 *   MXFP4, Q4_0 as Q8_0 (AVX-512 only); MXFP4's w the doubled E2M1 values and d_w half
 *               the block scale (vec_dot_e8m0_half), Q4_0's w the nibbles - 8
 * Everything else (the other types, Q8_0, MXFP4 and Q4_0 at AVX2, the scalar kernels) sums in
 * orders of its own.
 * Activation quantization: d = max|x| / 127, q = round-half-even(x / d) computed as x * (1/d);
 * the SIMD quantizers produce the same codes and sums as the scalar one, bit for bit.
 */
#ifndef STRATA_VEC_DOT_H
#define STRATA_VEC_DOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu_features.h"
#include "quant_blocks.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether a dot kernel exists for weights of this ggml type id. */
bool vec_dot_supported(uint32_t wtype);

/* Elements per block of a supported weight type (n must be a multiple); 0 if unsupported. */
int64_t vec_dot_block(uint32_t wtype);

/* Bytes of a weight row of n elements (n a block multiple); 0 if unsupported. */
size_t vec_dot_row_bytes(uint32_t wtype, int64_t n);

/* QUANT_Q8_0, QUANT_Q8_K or QUANT_F32 for a supported weight type; QUANT_TYPE_COUNT if not. */
enum quant_type vec_dot_act_type(uint32_t wtype);

/* Bytes of one activation row of n elements for weights of type wtype; 0 if unsupported. */
size_t vec_dot_act_bytes(uint32_t wtype, int64_t n);

/* Converts n floats (a block multiple) to the activation format of wtype. */
typedef void (*vec_dot_quantize_fn)(const float *x, void *act, int64_t n);

/* The activation quantizer for wtype at the given ISA level (clamped to cpu_isa_best(); the
 * best variant at or below that level). NULL if wtype is unsupported. */
vec_dot_quantize_fn vec_dot_quantize_get(uint32_t wtype, enum cpu_isa isa);

/* Converts x (n floats) into act (vec_dot_act_bytes(wtype, n) bytes) with the best quantizer.
 * wtype must be supported and n a block multiple. */
void vec_dot_quantize_act(uint32_t wtype, const float *x, void *act, int64_t n);

/* sum_i w[i] * a[i] over n elements (a block multiple) of one weight row and one activation
 * row in the matching format. */
typedef float (*vec_dot_fn)(int64_t n, const void *w_row, const void *act);

/* The dot kernel for wtype at the given ISA level: isa is clamped to cpu_isa_best() and the
 * best variant at or below it is returned (a type without a SIMD variant at that level gets
 * the next lower one). NULL if wtype is unsupported. */
vec_dot_fn vec_dot_get(uint32_t wtype, enum cpu_isa isa);

/* One weight row against VEC_DOT_ROWS activation rows (act + r * act_stride bytes, each in
 * the format of vec_dot_act_type), out[r] for each: the weights are unpacked once for all
 * rows, which is what makes batches (prefill, the CPU lane's expert groups) cheaper per dot
 * than one vec_dot_fn call per row. out[r] equals the vec_dot_fn of the same ISA level on
 * row r bit for bit. */
#define VEC_DOT_ROWS 4
typedef void (*vec_dot_rows_fn)(int64_t n, const void *w_row, const void *act, size_t act_stride,
                                float *out);
/* The multi-row kernel for wtype at the given ISA level (clamped as in vec_dot_get), or NULL
 * where there is none (then call the vec_dot_fn once per row): Q8_0, Q4_K, Q5_K and Q6_K with
 * AVX2 and AVX-512. */
vec_dot_rows_fn vec_dot_rows_get(uint32_t wtype, enum cpu_isa isa);

/* Float accumulators per Q8_0 dot (see above): enough independent FMA chains to keep a
 * single dot streaming. */
#define VEC_DOT_Q8_0_ACC 4

/* ---- per-ISA tables: for vec_dot.c only. Each returns NULL for a type it does not cover.
 * The SIMD files are compiled with their instruction sets, so these must only be called when
 * cpu_isa_best() reaches that level. */
vec_dot_fn vec_dot_scalar_get(uint32_t wtype);
vec_dot_quantize_fn vec_dot_scalar_quantize_get(enum quant_type act_type);
vec_dot_fn vec_dot_avx2_get(uint32_t wtype);
vec_dot_quantize_fn vec_dot_avx2_quantize_get(enum quant_type act_type);
vec_dot_fn vec_dot_avx512_get(uint32_t wtype, bool vnni);
vec_dot_rows_fn vec_dot_avx512_rows_get(uint32_t wtype, bool vnni);
vec_dot_rows_fn vec_dot_avx2_rows_get(uint32_t wtype);
vec_dot_quantize_fn vec_dot_avx512_quantize_get(enum quant_type act_type);

/* ---- helpers shared by the scalar and SIMD kernels (internal) ---- */

/* The SIMD kernels prefetch weight bytes this far ahead of the block they are working on; in
 * a matmul that is the start of the following rows. Interleaved with computation, the hardware
 * prefetchers alone keep too few reads in flight per core to stream at the read bandwidth.
 * A prefetch past the end of the weights is harmless (prefetches never fault). */
#define VEC_DOT_PREFETCH_BYTES 4096

/* Prefetches the `bytes` of weights starting VEC_DOT_PREFETCH_BYTES after p, one request per
 * 64 bytes; called once per block (or group of blocks) of consecutive weights, this covers
 * every line. For the SIMD files (needs <immintrin.h>). */
#define VEC_DOT_PREFETCH(p, bytes)                                                                 \
    do {                                                                                           \
        for (int pf_off_ = 0; pf_off_ < (int)(bytes); pf_off_ += 64)                               \
            _mm_prefetch((const char *)(p) + VEC_DOT_PREFETCH_BYTES + pf_off_, _MM_HINT_T0);       \
    } while (0)

/* After the blocks of a Q8_0 activation row, one per block: what gemm's kernels (gemm.h), whose
 * weight codes carry +128, need per block without recomputing it for every tile of rows. */
struct vec_dot_q8_0_extra {
    float d;     /* the block's scale, as a float */
    int32_t off; /* -128 * the sum of the block's codes */
};

/* Where the extras of a Q8_0 activation row of n elements start: after the blocks, rounded up
 * to 8 bytes (34-byte blocks would misalign them; rows must start 4-byte aligned). */
static inline size_t vec_dot_q8_0_extras_at(int64_t n)
{
    return ((size_t)(n / QK_32) * sizeof(struct block_q8_0) + 7) & ~(size_t)7;
}

/* The extras of a Q8_0 activation row of n elements. */
static inline struct vec_dot_q8_0_extra *vec_dot_q8_0_extras(void *act, int64_t n)
{
    return (struct vec_dot_q8_0_extra *)((uint8_t *)act + vec_dot_q8_0_extras_at(n));
}

/* Unpacks the 12-byte 6-bit scale/min field of Q4_K/Q5_K (docs/formats.md, K-quants) into 8
 * scales and 8 mins, one byte each: word 0 = scales 0..3, 1 = scales 4..7, 2 = mins 0..3,
 * 3 = mins 4..7. */
static inline void vec_dot_k4_scales(const uint8_t *s12, uint32_t out[4])
{
    uint32_t u0 =
        (uint32_t)s12[0] | (uint32_t)s12[1] << 8 | (uint32_t)s12[2] << 16 | (uint32_t)s12[3] << 24;
    uint32_t u1 =
        (uint32_t)s12[4] | (uint32_t)s12[5] << 8 | (uint32_t)s12[6] << 16 | (uint32_t)s12[7] << 24;
    uint32_t u2 = (uint32_t)s12[8] | (uint32_t)s12[9] << 8 | (uint32_t)s12[10] << 16 |
                  (uint32_t)s12[11] << 24;
    out[0] = u0 & 0x3f3f3f3fu;
    out[1] = (u2 & 0x0f0f0f0fu) | ((u0 >> 6) & 0x03030303u) << 4;
    out[2] = u1 & 0x3f3f3f3fu;
    out[3] = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 6) & 0x03030303u) << 4;
}

/* Q3_K's 16 6-bit scales, stored with a bias of 32: the low 4 bits from the nibbles of bytes
 * 0..7, the high 2 bits from bytes 8..11; out[i] = scale i (-32..31). */
static inline void vec_dot_q3_k_scales(const uint8_t *s, int16_t out[16])
{
    for (int i = 0; i < 16; i++) {
        int lo = i < 8 ? s[i] & 0x0f : s[i - 8] >> 4;
        int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        out[i] = (int16_t)((lo | hi << 4) - 32);
    }
}

/* Half the MXFP4 block scale, 2^(e - 128): the E2M1 code table used by the kernels holds
 * doubled values (integers), docs/formats.md, MXFP4. e < 2 gives the float denormals 2^-128,
 * 2^-127. */
static inline float vec_dot_e8m0_half(uint8_t e)
{
    uint32_t bits = e >= 2 ? (uint32_t)(e - 1) << 23 : 0x00200000u << e;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
}

/* E2M1 code -> twice its value (int8), docs/formats.md, MXFP4. */
#define VEC_DOT_MXFP4_VALUES                                                                       \
    {                                                                                              \
        0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12                                    \
    }

#ifdef __AVX2__
#include <immintrin.h>
/* vec_dot_q3_k_scales as 16 signed bytes (s: a block's scales, which follow its qs: the 16
 * bytes ending with them lie inside the block). */
static inline __m128i vec_dot_q3_k_scales8(const uint8_t *s)
{
    __m128i x = _mm_srli_si128(_mm_loadu_si128((const __m128i *)(s - 4)), 4);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(x, m4), _mm_and_si128(_mm_srli_epi16(x, 4), m4));
    /* scale i's high bits: byte 8 + i % 4, shifted by 2 (i / 4): dword k shifted by 2k */
    __m128i hb = _mm_shuffle_epi32(_mm_srli_si128(x, 8), 0);
    __m128i hi = _mm_and_si128(_mm_srlv_epi32(hb, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
}
#endif

#ifdef __AVX512F__
#include <immintrin.h>
/* Nibbles of two 16-byte code arrays (Q4_0, MXFP4 blocks) as one zmm in element order: [q0's
 * elements 0-31, q1's 0-31], element j of a block the low nibble of byte j, element j + 16 its
 * high nibble (matching two Q8_0 activation blocks loaded side by side). */
static inline __m512i vec_dot_nibbles_pair(const uint8_t *q0, const uint8_t *q1)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i x =
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)q0)),
                                _mm_loadu_si128((const __m128i *)q1), 1);
    __m256i lo = _mm256_and_si256(x, m4), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
    /* qwords: lo 0,1 (q0 first half), hi 0,1 (q0 second half), lo 2,3, hi 2,3 */
    return _mm512_permutex2var_epi64(_mm512_castsi256_si512(lo),
                                     _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11),
                                     _mm512_castsi256_si512(hi));
}

/* The doubled E2M1 values (VEC_DOT_MXFP4_VALUES) of 64 codes, one per byte. */
static inline __m512i vec_dot_mxfp4_values(__m512i codes)
{
    static const int8_t values[16] = VEC_DOT_MXFP4_VALUES;
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)values)),
                               codes);
}

/* vec_dot_e8m0_half of the low byte of each dword of g (the AVX-512 kernels: vec_dot and gemm
 * take their MXFP4 scales from here, the same floats). */
static inline __m512 vec_dot_e8m0_half16(__m512i g)
{
    __m512i e = _mm512_and_si512(g, _mm512_set1_epi32(0xff));
    __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    __m512i denormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, denormal));
}
#endif

#ifdef __cplusplus
}
#endif

#endif
