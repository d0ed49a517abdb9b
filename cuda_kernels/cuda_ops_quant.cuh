/* cuda_ops_quant: device-side decoding of weight rows, shared by cuda_ops.cu (embedding rows)
 * and cuda_moe.cu (expert GEMV/GEMM). Internal to cuda_kernels/: included only by .cu files.
 *
 * The unit of work is a GROUP of 256 consecutive elements of a row, decoded by one warp: lane l
 * decodes 8 elements, two runs of 4 consecutive elements starting at element a0 and a1 (both
 * multiples of 4, so the matching activations are two float4 loads). The runs are chosen so that
 * a lane reads whole bytes of the block (both nibbles of a Q4_0/MXFP4 byte, low and high nibble of
 * a Q4_K sub-block pair, low and high nibble of a Q6_K ql byte) and lanes of a warp read
 * neighbouring bytes. 32-element types cover 8 blocks per group; a row whose length is not a
 * multiple of 256 leaves lanes of its last group without elements (decode returns false).
 *
 * Values are exactly quant_ref_dequantize's: the same operations in the same order, each rounded
 * on its own (__fmul_rn/__fsub_rn keep nvcc from contracting them into FMAs).
 *
 * Alignment: rows of F32/F16/BF16 must start at 16-byte boundaries (one 16-byte load per run);
 * Q4_0, Q8_0 and the K-quants at 2-byte boundaries (blocks are read with 16-bit loads: their
 * sizes 18, 34, 144, 176, 210 keep every field 2-byte aligned); MXFP4 (17-byte blocks) is read
 * bytewise. cq_row_align() gives the requirement per type.
 */
#ifndef STRATA_CUDA_OPS_QUANT_CUH
#define STRATA_CUDA_OPS_QUANT_CUH

#include <stdint.h>

#include "../cpu_kernels/quant_blocks.h"

#define CQ_GROUP 256 /* elements of a row decoded by one warp per step */

/* ---- host-side type facts ---------------------------------------------------------------- */

/* Whether the group decoder supports weights of this ggml type. */
static inline bool cq_supported(uint32_t type)
{
    switch (type) {
    case QUANT_F32:
    case QUANT_F16:
    case QUANT_BF16:
    case QUANT_Q4_0:
    case QUANT_Q8_0:
    case QUANT_MXFP4:
    case QUANT_Q4_K:
    case QUANT_Q5_K:
    case QUANT_Q6_K:
        return true;
    default:
        return false;
    }
}

/* Elements per block: a row length must be a multiple. F32/F16/BF16 rows are decoded 8 elements
 * per lane, so they need multiples of 8. */
static inline int64_t cq_block_elems(uint32_t type)
{
    switch (type) {
    case QUANT_F32:
    case QUANT_F16:
    case QUANT_BF16:
        return 8;
    case QUANT_Q4_0:
    case QUANT_Q8_0:
    case QUANT_MXFP4:
        return 32;
    case QUANT_Q4_K:
    case QUANT_Q5_K:
    case QUANT_Q6_K:
        return 256;
    default:
        return 0;
    }
}

/* Bytes of a row of n elements; 0 when the type is unsupported or n is not a block multiple. */
static inline uint64_t cq_row_bytes(uint32_t type, int64_t n)
{
    int64_t be = cq_block_elems(type);
    if (be == 0 || n <= 0 || n % be)
        return 0;
    switch (type) {
    case QUANT_F32:
        return (uint64_t)n * 4;
    case QUANT_F16:
    case QUANT_BF16:
        return (uint64_t)n * 2;
    case QUANT_Q4_0:
        return (uint64_t)(n / 32) * 18;
    case QUANT_Q8_0:
        return (uint64_t)(n / 32) * 34;
    case QUANT_MXFP4:
        return (uint64_t)(n / 32) * 17;
    case QUANT_Q4_K:
        return (uint64_t)(n / 256) * 144;
    case QUANT_Q5_K:
        return (uint64_t)(n / 256) * 176;
    case QUANT_Q6_K:
        return (uint64_t)(n / 256) * 210;
    default:
        return 0;
    }
}

/* Required alignment (bytes) of a row start, and so of the base pointer and every stride. */
static inline uint64_t cq_row_align(uint32_t type)
{
    switch (type) {
    case QUANT_F32:
    case QUANT_F16:
    case QUANT_BF16:
        return 16;
    case QUANT_MXFP4:
        return 1;
    default:
        return 2;
    }
}

/* ---- device helpers ----------------------------------------------------------------------- */

static __device__ __forceinline__ uint32_t cq_ld_u16(const uint8_t *p) /* p 2-byte aligned */
{
    return *(const uint16_t *)p;
}

/* Four bytes at a 2-byte aligned address, little-endian. */
static __device__ __forceinline__ uint32_t cq_ld_u32_a2(const uint8_t *p)
{
    return cq_ld_u16(p) | cq_ld_u16(p + 2) << 16;
}

/* Four bytes at any address. */
static __device__ __forceinline__ uint32_t cq_ld_u32_a1(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* IEEE binary16 bits -> float, exact (subnormals are man * 2^-24, exact in float). */
static __device__ __forceinline__ float cq_f16(uint32_t h)
{
    uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0) {
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    uint32_t bits =
        exp == 0x1f ? (sign | 0x7f800000u | man << 13) : (sign | (exp + 112) << 23 | man << 13);
    return __uint_as_float(bits);
}

static __device__ __forceinline__ float cq_bf16(uint32_t b)
{
    return __uint_as_float(b << 16);
}

/* E2M1 code (0..15) -> twice its value, an integer (docs/formats.md, MXFP4 kvalues_mxfp4). */
static __device__ __forceinline__ int cq_e2m1_doubled(uint32_t c)
{
    uint32_t m = c & 7;
    int mag = m < 2 ? (int)m : (2 + (int)(m & 1)) << ((m >> 1) - 1);
    return c & 8 ? -mag : mag;
}

/* 2^(e - 128) from the bit pattern; e = 0 and 1 give the float32 subnormals. */
static __device__ __forceinline__ float cq_e8m0_half(uint32_t e)
{
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

/* 6-bit scale and min of sub-block j (0..7) of Q4_K/Q5_K from the 12 packed bytes q. */
static __device__ __forceinline__ void cq_k4_scale_min(const uint8_t *q, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* ---- group decoders ------------------------------------------------------------------------
 * cq_decode<TYPE>(row, n, g, lane, v, &a0, &a1): lane's 8 values of group g of a row of n
 * elements: v[0..3] are elements a0..a0+3, v[4..7] are a1..a1+3. Returns false (v, a0, a1
 * untouched) when the lane has no elements in this group. */
template <uint32_t TYPE> struct cq_decoder;

template <> struct cq_decoder<QUANT_F32> {
    static __device__ __forceinline__ bool decode(const uint8_t *row, int64_t n, int64_t g,
                                                  int lane, float *v, int64_t *a0, int64_t *a1)
    {
        int64_t e = g * CQ_GROUP + 8 * lane;
        if (e >= n)
            return false;
        const float4 *p = (const float4 *)(row + 4 * e);
        float4 x0 = p[0], x1 = p[1];
        v[0] = x0.x, v[1] = x0.y, v[2] = x0.z, v[3] = x0.w;
        v[4] = x1.x, v[5] = x1.y, v[6] = x1.z, v[7] = x1.w;
        *a0 = e, *a1 = e + 4;
        return true;
    }
};

template <bool BF> struct cq_decoder_half {
    static __device__ __forceinline__ bool decode(const uint8_t *row, int64_t n, int64_t g,
                                                  int lane, float *v, int64_t *a0, int64_t *a1)
    {
        int64_t e = g * CQ_GROUP + 8 * lane;
        if (e >= n)
            return false;
        uint4 w = *(const uint4 *)(row + 2 * e);
        uint32_t h[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[2 * i] = BF ? cq_bf16(h[i] & 0xffff) : cq_f16(h[i] & 0xffff);
            v[2 * i + 1] = BF ? cq_bf16(h[i] >> 16) : cq_f16(h[i] >> 16);
        }
        *a0 = e, *a1 = e + 4;
        return true;
    }
};
template <> struct cq_decoder<QUANT_F16> : cq_decoder_half<false> {
};
template <> struct cq_decoder<QUANT_BF16> : cq_decoder_half<true> {
};

/* Q8_0: lane l takes 8 consecutive codes of block 8g + l/4. */
template <> struct cq_decoder<QUANT_Q8_0> {
    static __device__ __forceinline__ bool decode(const uint8_t *row, int64_t n, int64_t g,
                                                  int lane, float *v, int64_t *a0, int64_t *a1)
    {
        int64_t b = g * 8 + (lane >> 2);
        if (b * 32 >= n)
            return false;
        const uint8_t *p = row + b * 34;
        int o = 8 * (lane & 3);
        float d = cq_f16(cq_ld_u16(p));
        uint32_t w0 = cq_ld_u32_a2(p + 2 + o), w1 = cq_ld_u32_a2(p + 6 + o);
#pragma unroll
        for (int c = 0; c < 4; c++) {
            v[c] = __fmul_rn((float)(int8_t)(w0 >> 8 * c), d);
            v[4 + c] = __fmul_rn((float)(int8_t)(w1 >> 8 * c), d);
        }
        *a0 = b * 32 + o, *a1 = b * 32 + o + 4;
        return true;
    }
};

/* Q4_0: lane l takes bytes 4(l%4)..+3 of block 8g + l/4: elements j (low nibble) and j + 16. */
template <> struct cq_decoder<QUANT_Q4_0> {
    static __device__ __forceinline__ bool decode(const uint8_t *row, int64_t n, int64_t g,
                                                  int lane, float *v, int64_t *a0, int64_t *a1)
    {
        int64_t b = g * 8 + (lane >> 2);
        if (b * 32 >= n)
            return false;
        const uint8_t *p = row + b * 18;
        int o = 4 * (lane & 3);
        float d = cq_f16(cq_ld_u16(p));
        uint32_t w = cq_ld_u32_a2(p + 2 + o);
#pragma unroll
        for (int c = 0; c < 4; c++) {
            v[c] = __fmul_rn(d, (float)((int)((w >> 8 * c) & 0xF) - 8));
            v[4 + c] = __fmul_rn(d, (float)((int)((w >> (8 * c + 4)) & 0xF) - 8));
        }
        *a0 = b * 32 + o, *a1 = b * 32 + o + 16;
        return true;
    }
};

/* MXFP4: laid out like Q4_0 with a one-byte E8M0 scale; read bytewise (17-byte blocks). */
template <> struct cq_decoder<QUANT_MXFP4> {
    static __device__ __forceinline__ bool decode(const uint8_t *row, int64_t n, int64_t g,
                                                  int lane, float *v, int64_t *a0, int64_t *a1)
    {
        int64_t b = g * 8 + (lane >> 2);
        if (b * 32 >= n)
            return false;
        const uint8_t *p = row + b * 17;
        int o = 4 * (lane & 3);
        float d = cq_e8m0_half(p[0]);
        uint32_t w = cq_ld_u32_a1(p + 1 + o);
#pragma unroll
        for (int c = 0; c < 4; c++) {
            v[c] = __fmul_rn(d, (float)cq_e2m1_doubled((w >> 8 * c) & 0xF));
            v[4 + c] = __fmul_rn(d, (float)cq_e2m1_doubled((w >> (8 * c + 4)) & 0xF));
        }
        *a0 = b * 32 + o, *a1 = b * 32 + o + 16;
        return true;
    }
};

/* Q4_K / Q5_K: lane l works on sub-blocks 2m and 2m+1 (m = l/8), which share the 32 qs bytes
 * 32m..32m+31 (low / high nibble); it takes bytes o..o+3 (o = 4(l%8)): elements 64m + o + c of
 * sub-block 2m and 64m + 32 + o + c of sub-block 2m+1. Q5_K adds bit j of qh[o + c]. */
template <bool Q5> struct cq_decoder_k45 {
    static __device__ __forceinline__ bool decode(const uint8_t *row, int64_t n, int64_t g,
                                                  int lane, float *v, int64_t *a0, int64_t *a1)
    {
        (void)n;
        const uint8_t *p = row + g * (Q5 ? 176 : 144);
        const uint8_t *qs = p + (Q5 ? 48 : 16);
        int m = lane >> 3, o = 4 * (lane & 7);
        float d = cq_f16(cq_ld_u16(p)), dmin = cq_f16(cq_ld_u16(p + 2));
        int sc0, mn0, sc1, mn1;
        cq_k4_scale_min(p + 4, 2 * m, &sc0, &mn0);
        cq_k4_scale_min(p + 4, 2 * m + 1, &sc1, &mn1);
        float dl0 = __fmul_rn(d, (float)sc0), ml0 = __fmul_rn(dmin, (float)mn0);
        float dl1 = __fmul_rn(d, (float)sc1), ml1 = __fmul_rn(dmin, (float)mn1);
        uint32_t w = cq_ld_u32_a2(qs + 32 * m + o);
        uint32_t h = Q5 ? cq_ld_u32_a2(p + 16 + o) : 0;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            uint32_t q0 = (w >> 8 * c) & 0xF, q1 = (w >> (8 * c + 4)) & 0xF;
            if (Q5) {
                q0 |= ((h >> (8 * c + 2 * m)) & 1) << 4;
                q1 |= ((h >> (8 * c + 2 * m + 1)) & 1) << 4;
            }
            v[c] = __fsub_rn(__fmul_rn(dl0, (float)q0), ml0);
            v[4 + c] = __fsub_rn(__fmul_rn(dl1, (float)q1), ml1);
        }
        *a0 = g * CQ_GROUP + 64 * m + o, *a1 = g * CQ_GROUP + 64 * m + 32 + o;
        return true;
    }
};
template <> struct cq_decoder<QUANT_Q4_K> : cq_decoder_k45<false> {
};
template <> struct cq_decoder<QUANT_Q5_K> : cq_decoder_k45<true> {
};

/* Q6_K: element i = 128h + 32s + l has its low 4 bits in ql[64h + 32(s%2) + l] (low nibble for
 * s < 2, high for s >= 2) and its high 2 bits at bit 2s of qh[32h + l]. Lane l (h = l/16,
 * s0 = (l%16)/8, o = 4(l%8)) takes ql bytes 64h + 32 s0 + o..+3: elements with s = s0 (low
 * nibbles) and s = s0 + 2 (high nibbles), positions o..o+3. */
template <> struct cq_decoder<QUANT_Q6_K> {
    static __device__ __forceinline__ bool decode(const uint8_t *row, int64_t n, int64_t g,
                                                  int lane, float *v, int64_t *a0, int64_t *a1)
    {
        (void)n;
        const uint8_t *p = row + g * 210;
        int h = lane >> 4, s0 = (lane >> 3) & 1, o = 4 * (lane & 7), s1 = s0 + 2;
        float d = cq_f16(cq_ld_u16(p + 208));
        const int8_t *sc = (const int8_t *)(p + 192);
        float dl0 = __fmul_rn(d, (float)sc[8 * h + 2 * s0 + o / 16]);
        float dl1 = __fmul_rn(d, (float)sc[8 * h + 2 * s1 + o / 16]);
        uint32_t wl = cq_ld_u32_a2(p + 64 * h + 32 * s0 + o);
        uint32_t wh = cq_ld_u32_a2(p + 128 + 32 * h + o);
#pragma unroll
        for (int c = 0; c < 4; c++) {
            int q0 = (int)(((wl >> 8 * c) & 0xF) | ((wh >> (8 * c + 2 * s0)) & 3) << 4);
            int q1 = (int)(((wl >> (8 * c + 4)) & 0xF) | ((wh >> (8 * c + 2 * s1)) & 3) << 4);
            v[c] = __fmul_rn(dl0, (float)(q0 - 32));
            v[4 + c] = __fmul_rn(dl1, (float)(q1 - 32));
        }
        *a0 = g * CQ_GROUP + 128 * h + 32 * s0 + o, *a1 = g * CQ_GROUP + 128 * h + 32 * s1 + o;
        return true;
    }
};

/* acc + v . x[a0..a0+3, a1..a1+3], in a fixed order of fused multiply-adds; x 16-byte aligned. */
static __device__ __forceinline__ float cq_dot8(const float *v, const float *x, int64_t a0,
                                                int64_t a1, float acc)
{
    float4 x0 = *(const float4 *)(x + a0), x1 = *(const float4 *)(x + a1);
    acc = fmaf(v[0], x0.x, acc);
    acc = fmaf(v[1], x0.y, acc);
    acc = fmaf(v[2], x0.z, acc);
    acc = fmaf(v[3], x0.w, acc);
    acc = fmaf(v[4], x1.x, acc);
    acc = fmaf(v[5], x1.y, acc);
    acc = fmaf(v[6], x1.z, acc);
    acc = fmaf(v[7], x1.w, acc);
    return acc;
}

/* ---- dot-product steps ----------------------------------------------------------------------
 * cq_step<TYPE>: one lane's share of group g of a weight row, loaded once (load) and applied to
 * any number of activation rows (dot: acc + w . x over the lane's 8 elements). The generic step
 * is the group decoder and cq_dot8. Q4_K and Q6_K have their own, with fewer instructions:
 * lane l takes 8 consecutive elements that share one scale (and min), keeps their integer
 * codes q as floats (built from the bytes with a byte permute and one subtraction instead of
 * an int-to-float conversion), and factors the scale out:
 *     w . x = dl * (q . x) - ml * sum(x)        (Q6_K: ml = 32 dl, q = 6-bit code)
 * The Q6_K step reads twice the bytes of the generic one (each lane uses one nibble of its ql
 * bytes): slower for one token, faster for the grouped kernels (bench/cuda-resident.md).
 * Every kernel that calls dot for a type uses the same step, so paths that share a step agree
 * bit for bit. */
template <uint32_t TYPE> struct cq_step {
    float v[8];
    int64_t a0, a1;
    __device__ __forceinline__ bool load(const uint8_t *row, int64_t n, int64_t g, int lane)
    {
        return cq_decoder<TYPE>::decode(row, n, g, lane, v, &a0, &a1);
    }
    __device__ __forceinline__ float dot(const float *x, float acc) const
    {
        return cq_dot8(v, x, a0, a1, acc);
    }
};

/* byte c (0..3) of w as a float: 0x4B0000bb is 2^23 + b */
static __device__ __forceinline__ float cq_byte_f(uint32_t w, int c)
{
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | (uint32_t)c)) - 8388608.0f;
}

/* the factored step shared by Q4_K and Q6_K: codes q[8] of elements e0..e0+7 */
struct cq_fstep {
    float q[8];
    float dl, ml;
    int64_t e0;
    __device__ __forceinline__ void codes(uint32_t w0, uint32_t w1)
    {
#pragma unroll
        for (int c = 0; c < 4; c++) {
            q[c] = cq_byte_f(w0, c);
            q[4 + c] = cq_byte_f(w1, c);
        }
    }
    __device__ __forceinline__ float dot(const float *x, float acc) const
    {
        float4 x0 = *(const float4 *)(x + e0), x1 = *(const float4 *)(x + e0 + 4);
        float qx = q[0] * x0.x;
        qx = fmaf(q[1], x0.y, qx);
        qx = fmaf(q[2], x0.z, qx);
        qx = fmaf(q[3], x0.w, qx);
        qx = fmaf(q[4], x1.x, qx);
        qx = fmaf(q[5], x1.y, qx);
        qx = fmaf(q[6], x1.z, qx);
        qx = fmaf(q[7], x1.w, qx);
        float sx = __fadd_rn(__fadd_rn(__fadd_rn(x0.x, x0.y), __fadd_rn(x0.z, x0.w)),
                             __fadd_rn(__fadd_rn(x1.x, x1.y), __fadd_rn(x1.z, x1.w)));
        acc = fmaf(dl, qx, acc);
        return fmaf(-ml, sx, acc);
    }
};

/* Q4_K: lane l takes sub-block j = l / 4 (scale and min j), elements 32 j + 8 (l % 4) + 0..7:
 * the low (j even) or high (j odd) nibbles of qs bytes 32 (j / 2) + 8 (l % 4) + 0..7. */
template <> struct cq_step<QUANT_Q4_K> : cq_fstep {
    __device__ __forceinline__ bool load(const uint8_t *row, int64_t n, int64_t g, int lane)
    {
        (void)n;
        const uint8_t *p = row + g * 144;
        const int j = lane >> 2, o = 8 * (lane & 3);
        float d = cq_f16(cq_ld_u16(p)), dmin = cq_f16(cq_ld_u16(p + 2));
        /* scale and min of sub-block j (cq_k4_scale_min without a branch) */
        const uint8_t *sc = p + 4;
        int lo = j < 4 ? sc[j] : sc[j + 4], hs = j < 4 ? 0 : sc[j - 4] >> 6,
            hm = j < 4 ? 0 : sc[j] >> 6;
        int scale = j < 4 ? lo & 63 : (lo & 0xF) | hs << 4;
        int mn = j < 4 ? sc[j + 4] & 63 : (lo >> 4) | hm << 4;
        dl = __fmul_rn(d, (float)scale);
        ml = __fmul_rn(dmin, (float)mn);
        const uint8_t *qs = p + 16 + 32 * (j >> 1) + o;
        const int sh = 4 * (j & 1);
        codes((cq_ld_u32_a2(qs) >> sh) & 0x0F0F0F0Fu, (cq_ld_u32_a2(qs + 4) >> sh) & 0x0F0F0F0Fu);
        e0 = g * CQ_GROUP + 32 * j + o;
        return true;
    }
};

/* Q6_K: lane l takes elements 8 l + 0..7 = 128 h + 32 s + l0 + 0..7 (h = l / 16, s = l / 4 % 4,
 * l0 = 8 (l % 4)), which share scale 8 h + 2 s + l0 / 16: low 4 bits in ql[64 h + 32 (s % 2) +
 * l0 + c] (high nibble for s >= 2), high 2 bits at bit 2 s of qh[32 h + l0 + c]. */
template <> struct cq_step<QUANT_Q6_K> : cq_fstep {
    __device__ __forceinline__ bool load(const uint8_t *row, int64_t n, int64_t g, int lane)
    {
        (void)n;
        const uint8_t *p = row + g * 210;
        const int h = lane >> 4, s = (lane >> 2) & 3, l0 = 8 * (lane & 3);
        float d = cq_f16(cq_ld_u16(p + 208));
        dl = __fmul_rn(d, (float)((const int8_t *)(p + 192))[8 * h + 2 * s + l0 / 16]);
        ml = __fmul_rn(dl, 32.0f);
        const uint8_t *ql = p + 64 * h + 32 * (s & 1) + l0, *qh = p + 128 + 32 * h + l0;
        const int sl = 4 * (s >> 1), shh = 2 * s;
        uint32_t w0 = (cq_ld_u32_a2(ql) >> sl) & 0x0F0F0F0Fu, w1 = (cq_ld_u32_a2(ql + 4) >> sl) & 0x0F0F0F0Fu;
        w0 |= ((cq_ld_u32_a2(qh) >> shh) & 0x03030303u) << 4;
        w1 |= ((cq_ld_u32_a2(qh + 4) >> shh) & 0x03030303u) << 4;
        codes(w0, w1);
        e0 = g * CQ_GROUP + 8 * lane;
        return true;
    }
};

#endif
