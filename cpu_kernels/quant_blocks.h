/* quant_blocks: ggml tensor type ids and the byte layout of every quantized block strata reads
 * or writes. Facts only (no code): docs/formats.md (type ids, block layouts) is the source.
 * Every struct is packed to the exact on-disk size; the static asserts below pin them.
 */
#ifndef STRATA_QUANT_BLOCKS_H
#define STRATA_QUANT_BLOCKS_H

#include <stdint.h>

/* The size checks below, in C11 and in C++ (.cu files include this header too). */
#ifdef __cplusplus
#define QUANT_STATIC_ASSERT static_assert
#else
#define QUANT_STATIC_ASSERT _Static_assert
#endif

/* ggml_type ids as stored in GGUF tensor infos. */
enum quant_type {
    QUANT_F32 = 0,
    QUANT_F16 = 1,
    QUANT_Q4_0 = 2,
    QUANT_Q4_1 = 3,
    QUANT_Q5_0 = 6,
    QUANT_Q5_1 = 7,
    QUANT_Q8_0 = 8,
    QUANT_Q8_1 = 9,
    QUANT_Q2_K = 10,
    QUANT_Q3_K = 11,
    QUANT_Q4_K = 12,
    QUANT_Q5_K = 13,
    QUANT_Q6_K = 14,
    QUANT_Q8_K = 15,
    QUANT_IQ4_NL = 20,
    QUANT_IQ4_XS = 23,
    QUANT_I8 = 24,
    QUANT_I16 = 25,
    QUANT_I32 = 26,
    QUANT_I64 = 27,
    QUANT_F64 = 28,
    QUANT_BF16 = 30,
    QUANT_MXFP4 = 39,
    QUANT_TYPE_COUNT = 42 /* one past the largest id the type table knows */
};

#define QK_32 32   /* elements per block of the 32-element formats */
#define QK_K 256   /* elements per K-quant super-block */
#define K_SCALE_SIZE 12

typedef uint16_t f16_bits;  /* IEEE binary16, raw bits */
typedef uint16_t bf16_bits; /* bfloat16, raw bits */

struct block_q4_0 {
    f16_bits d;
    uint8_t qs[QK_32 / 2]; /* element j: low nibble of qs[j]; element j+16: high nibble */
};

struct block_q4_1 {
    f16_bits d;
    f16_bits m;
    uint8_t qs[QK_32 / 2];
};

struct block_q5_0 {
    f16_bits d;
    uint8_t qh[4]; /* bit j = 5th bit of element j */
    uint8_t qs[QK_32 / 2];
};

struct block_q5_1 {
    f16_bits d;
    f16_bits m;
    uint8_t qh[4];
    uint8_t qs[QK_32 / 2];
};

struct block_q8_0 {
    f16_bits d;
    int8_t qs[QK_32];
};

/* Activation format for Q4_1/Q5_1 dot products: s = d * sum(qs). */
struct block_q8_1 {
    f16_bits d;
    f16_bits s;
    int8_t qs[QK_32];
};

struct block_mxfp4 {
    uint8_t e;             /* E8M0 shared exponent, bias 127 */
    uint8_t qs[QK_32 / 2]; /* E2M1 codes, packed like Q4_0 */
};

struct block_q2_k {
    uint8_t scales[QK_K / 16]; /* low nibble: scale, high nibble: min, per 16 elements */
    uint8_t qs[QK_K / 4];
    f16_bits d;
    f16_bits dmin;
};

struct block_q3_k {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[K_SCALE_SIZE]; /* 16 6-bit signed scales, bias 32 */
    f16_bits d;
};

struct block_q4_k {
    f16_bits d;
    f16_bits dmin;
    uint8_t scales[K_SCALE_SIZE]; /* 8 6-bit scales and 8 6-bit mins, docs/formats.md, K-quants */
    uint8_t qs[QK_K / 2];
};

struct block_q5_k {
    f16_bits d;
    f16_bits dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};

struct block_q6_k {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    f16_bits d;
};

/* Activation format for K-quant dot products. */
struct block_q8_k {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16]; /* sum of each group of 16 qs */
};

struct block_iq4_nl {
    f16_bits d;
    uint8_t qs[QK_32 / 2];
};

struct block_iq4_xs {
    f16_bits d;
    uint16_t scales_h;
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
};

QUANT_STATIC_ASSERT(sizeof(struct block_q4_0) == 18, "block_q4_0 size");
QUANT_STATIC_ASSERT(sizeof(struct block_q4_1) == 20, "block_q4_1 size");
QUANT_STATIC_ASSERT(sizeof(struct block_q5_0) == 22, "block_q5_0 size");
QUANT_STATIC_ASSERT(sizeof(struct block_q5_1) == 24, "block_q5_1 size");
QUANT_STATIC_ASSERT(sizeof(struct block_q8_0) == 34, "block_q8_0 size");
QUANT_STATIC_ASSERT(sizeof(struct block_q8_1) == 36, "block_q8_1 size");
QUANT_STATIC_ASSERT(sizeof(struct block_mxfp4) == 17, "block_mxfp4 size");
QUANT_STATIC_ASSERT(sizeof(struct block_q2_k) == 84, "block_q2_k size");
QUANT_STATIC_ASSERT(sizeof(struct block_q3_k) == 110, "block_q3_k size");
QUANT_STATIC_ASSERT(sizeof(struct block_q4_k) == 144, "block_q4_k size");
QUANT_STATIC_ASSERT(sizeof(struct block_q5_k) == 176, "block_q5_k size");
QUANT_STATIC_ASSERT(sizeof(struct block_q6_k) == 210, "block_q6_k size");
QUANT_STATIC_ASSERT(sizeof(struct block_q8_k) == 292, "block_q8_k size");
QUANT_STATIC_ASSERT(sizeof(struct block_iq4_nl) == 18, "block_iq4_nl size");
QUANT_STATIC_ASSERT(sizeof(struct block_iq4_xs) == 136, "block_iq4_xs size");

#endif
