/* cuda_matmul: y = x W^T for GGUF-layout weights (contracts in cuda_matmul.h, design and
 * tolerances in docs/cuda-matmul.md, block layouts in ../shared/reference/FORMATS.md §2).
 *
 * DESIGN
 * MMV kernel (decode, lockstep, speculative verify: m small). One warp owns one weight row.
 * The row is cut into tiles of whole blocks (about 2 KB) and each tile is copied into the
 * warp's shared memory with 16-byte cp.async copies of the aligned 16-byte granules that cover
 * it, double-buffered so that the next tile is in flight while the current one is decoded.
 * Blocks of 34, 18, 17 or 210 bytes are not 4-byte aligned in a row, so decoding reads
 * shared memory through sm_words(), which builds any unaligned 32-bit word from two aligned
 * ones with a funnel shift. Granules that straddle the ends of the whole matrix are copied
 * byte by byte, so nothing outside the caller's bytes is read. Each lane takes a "part" of a
 * block (32 to 64 elements), dots it with the activation rows of its chunk (up to 16), and the
 * warp sums its lanes with shuffles at the end. Activations of quantized types are 8-bit
 * integers with a float scale per 32 elements (made by quantize_q8_kernel into the scratch),
 * and parts use dp4a; F32/F16/BF16 weights use the float activations and FMA.
 *
 * GEMM kernel (prefill: m large). A CTA computes a 64 x 128 tile of y with eight warps of
 * 32 x 32 WMMA BF16 fragments and float32 accumulators. Per 64-wide step of n_in it converts
 * the activation tile to BF16 and dequantizes the weight tile to float exactly as quant_ref
 * does (no FMA contraction) and rounds it to BF16, both into shared memory.
 *
 * No kernel keeps state between launches; no launch depends on the host seeing results.
 */
#include "cuda_matmul.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <errno.h>
#include <float.h>
#include <stdint.h>
#include <stdio.h>

#include <type_traits>

#include "../cpu_kernels/quant_blocks.h"
#include "cuda_check.h"
#include "cuda_mem.h"

namespace
{

constexpr int WARP = 32;
constexpr unsigned FULL_MASK = 0xffffffffu;
constexpr int MMV_WARPS = 4; /* warps per MMV CTA, one weight row each */
constexpr int MMV_THREADS = MMV_WARPS * WARP;
/* m = 1 with at most this many rows: a block per row (4 warps split its tiles), so that a
 * router (128 rows) keeps enough loads in flight: on the H200 the F32 router took 8.5 us with
 * a warp per row (6% occupancy), 4.3 us split; the 512-row k/v projections got slower split
 * (3.9 -> 4.7 us), hence the bound */
constexpr int64_t MMV_SPLIT_MAX_ROWS = 256;
constexpr int MMV_MAX_M = CUDA_MATMUL_MMV_MAX_M;
constexpr int Q8_WARPS = 8; /* 32-element activation blocks per quantize CTA */

/* ---- small device helpers ---------------------------------------------------------------- */

__device__ __forceinline__ float f16_bits_f32(uint32_t h)
{
    return __half2float(__ushort_as_half((unsigned short)(h & 0xFFFF)));
}

__device__ __forceinline__ float bf16_bits_f32(uint32_t b)
{
    return __uint_as_float((b & 0xFFFF) << 16);
}

/* 2^(e - 128), half the MXFP4 E8M0 scale (the value table below is doubled), from its bit
 * pattern; e = 0 and 1 give the float32 subnormals 2^-128 and 2^-127 (as quant_ref does). */
__device__ __forceinline__ float mxfp4_half_scale(uint32_t e)
{
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

/* The doubled E2M1 values (FORMATS.md §2.6) of the four 4-bit codes in the low 16 bits of q16
 * (code n in bits 4n..4n+3), as four int8 in the bytes of the result. Codes 8..15 are the
 * negatives of 0..7, so two byte permutes look up both signs and a third picks per byte. */
__device__ __forceinline__ uint32_t mxfp4_lookup4(uint32_t q16)
{
    const uint32_t idx = q16 & 0x7777u;
    const uint32_t pos = __byte_perm(0x03020100u, 0x0C080604u, idx); /* 0 1 2 3 4 6 8 12 */
    const uint32_t neg = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, idx); /* negated */
    const uint32_t sel = 0x3210u | ((q16 & 0x8888u) >> 1);           /* +4: byte of neg */
    return __byte_perm(pos, neg, sel);
}

/* The little-endian 32-bit word at byte offset off of a shared buffer, any alignment. Reads
 * the aligned words s[off/4] and s[off/4 + 1]. */
__device__ __forceinline__ uint32_t sm_word(const uint32_t *s, uint32_t off)
{
    const uint32_t i = off >> 2, sh = (off & 3) * 8;
    return __funnelshift_r(s[i], s[i + 1], sh);
}

/* N consecutive 32-bit words from byte offset off of a shared buffer, any alignment. */
template <int N>
__device__ __forceinline__ void sm_words(const uint32_t *s, uint32_t off, uint32_t *out)
{
    const uint32_t i = off >> 2, sh = (off & 3) * 8;
    uint32_t prev = s[i];
#pragma unroll
    for (int k = 0; k < N; k++) {
        const uint32_t next = s[i + k + 1];
        out[k] = __funnelshift_r(prev, next, sh);
        prev = next;
    }
}

/* NW little-endian 32-bit words from global memory at p, any alignment, with the widest loads
 * the address allows. */
template <int NW> __device__ __forceinline__ void ld_words(const uint8_t *p, uint32_t *w)
{
    const uintptr_t a = (uintptr_t)p;
    if ((a & 3) == 0) {
#pragma unroll
        for (int k = 0; k < NW; k++)
            w[k] = __ldg((const unsigned int *)p + k);
    } else if ((a & 1) == 0) {
#pragma unroll
        for (int k = 0; k < NW; k++)
            w[k] = (uint32_t)__ldg((const unsigned short *)p + 2 * k) |
                   (uint32_t)__ldg((const unsigned short *)p + 2 * k + 1) << 16;
    } else {
#pragma unroll
        for (int k = 0; k < NW; k++)
            w[k] = (uint32_t)__ldg(p + 4 * k) | (uint32_t)__ldg(p + 4 * k + 1) << 8 |
                   (uint32_t)__ldg(p + 4 * k + 2) << 16 | (uint32_t)__ldg(p + 4 * k + 3) << 24;
    }
}

__device__ __forceinline__ uint32_t ld_u16(const uint8_t *p)
{
    return (uint32_t)__ldg(p) | (uint32_t)__ldg(p + 1) << 8;
}

/* Byte t (compile-time after unrolling) of a little-endian word array. */
__device__ __forceinline__ uint32_t word_byte(const uint32_t *w, int t)
{
    return (w[t >> 2] >> (8 * (t & 3))) & 0xFF;
}

/* 6-bit scale and min of sub-block j (0..7) of Q4_K/Q5_K from the 12 scale bytes held in
 * three words (FORMATS.md §2.4); j may be a run-time value. */
__device__ __forceinline__ void k4_scale_min(const uint32_t *sw, int j, int *sc, int *m)
{
    const int t = 8 * (j & 3);
    const uint32_t b0 = (sw[0] >> t) & 0xFF, b1 = (sw[1] >> t) & 0xFF, b2 = (sw[2] >> t) & 0xFF;
    if (j < 4) {
        *sc = (int)(b0 & 63);
        *m = (int)(b1 & 63);
    } else {
        *sc = (int)((b2 & 0xF) | (b0 >> 6) << 4);
        *m = (int)((b2 >> 4) | (b1 >> 6) << 4);
    }
}

/* sum_k dot4(v[k], x[k]) over four words (16 int8 pairs), added to c. */
__device__ __forceinline__ int dp4a_16(const uint32_t *v, int4 x, int c)
{
    c = __dp4a((int)v[0], x.x, c);
    c = __dp4a((int)v[1], x.y, c);
    c = __dp4a((int)v[2], x.z, c);
    c = __dp4a((int)v[3], x.w, c);
    return c;
}

/* ---- cp.async (sm_80+) ------------------------------------------------------------------- */

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Waits until at most N of this thread's committed groups are still in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Copies the bytes [g0, g1) of a weight matrix that spans [lo, hi) into buf: 16-byte granule k
 * of buf holds the bytes at (g0 & ~15) + 16k, so byte g0 lands at offset g0 & 15. Granules
 * wholly inside the matrix go by cp.async (the caller commits and waits); the ones that
 * straddle its ends are copied byte by byte, inside bytes only. Called by all lanes of a warp. */
__device__ void tile_stage(uint32_t *buf, const uint8_t *g0, const uint8_t *g1, uintptr_t lo,
                           uintptr_t hi, int lane)
{
    const uintptr_t a0 = (uintptr_t)g0 & ~(uintptr_t)15;
    const uintptr_t a1 = ((uintptr_t)g1 + 15) & ~(uintptr_t)15;
    const int n = (int)((a1 - a0) >> 4);
    for (int k = lane; k < n; k += WARP) {
        const uintptr_t src = a0 + 16 * (uintptr_t)k;
        uint8_t *dst = (uint8_t *)buf + 16 * k;
        if (src >= lo && src + 16 <= hi) {
            cp_async16(dst, (const void *)src);
        } else {
            for (int b = 0; b < 16; b++)
                if (src + b >= lo && src + b < hi)
                    dst[b] = *(const uint8_t *)(src + b);
        }
    }
}

/* ---- weight formats ----------------------------------------------------------------------
 * Each format gives: QK (elements per block; for F32/F16/BF16 a 32-element staging unit), BS
 * (its bytes), PARTS (lanes' work units per block), TB (blocks per MMV tile), FLOAT_X (MMV
 * uses float activations), dot<M>() (one part of one block staged in shared memory at byte
 * offset off, against the chunk's activation rows), and dequant8() (elements k..k+7 of a
 * row in global memory, k a multiple of 8, as quant_ref decodes them; zero past n_in). */

/* The activation rows of one MMV chunk. */
template <int M> struct mmv_rows {
    const int8_t *qs;  /* quantized types: (mc rows of n_in) 8-bit activations, scratch */
    const float2 *ds;  /* quantized types: (mc rows of n_in/32) scale d and d * sum(q) */
    const float *x[M]; /* float types: activation row j, device */
    int64_t n_in;
    int mc; /* rows in this chunk, 1..M */
};

struct fmt_q8_0 {
    static constexpr int QK = 32, BS = 34, PARTS = 1, TB = 64;
    static constexpr bool FLOAT_X = false;

    template <int M>
    static __device__ __forceinline__ void dot(const uint32_t *s, uint32_t off, int part,
                                               int64_t blk, const mmv_rows<M> &r, float *acc)
    {
        (void)part;
        const float d = f16_bits_f32(sm_word(s, off));
        uint32_t q[8];
        sm_words<8>(s, off + 2, q);
#pragma unroll
        for (int j = 0; j < M; j++) {
            if (j >= r.mc)
                break;
            const int4 *xp = (const int4 *)(r.qs + j * r.n_in + blk * QK);
            int sum = dp4a_16(q, __ldg(xp), 0);
            sum = dp4a_16(q + 4, __ldg(xp + 1), sum);
            const float2 dx = __ldg(r.ds + j * (r.n_in / 32) + blk);
            acc[j] += d * dx.x * (float)sum;
        }
    }

    static __device__ __forceinline__ void dequant8(const uint8_t *row, int64_t k, int64_t n_in,
                                                    float *v)
    {
        (void)n_in;
        const uint8_t *b = row + (k / QK) * BS;
        const int o = (int)(k % QK);
        const float d = f16_bits_f32(ld_u16(b));
        uint32_t w[2];
        ld_words<2>(b + 2 + o, w);
#pragma unroll
        for (int t = 0; t < 8; t++)
            v[t] = (float)(int8_t)word_byte(w, t) * d;
    }
};

struct fmt_q4_0 {
    static constexpr int QK = 32, BS = 18, PARTS = 1, TB = 128;
    static constexpr bool FLOAT_X = false;

    template <int M>
    static __device__ __forceinline__ void dot(const uint32_t *s, uint32_t off, int part,
                                               int64_t blk, const mmv_rows<M> &r, float *acc)
    {
        (void)part;
        const float d = f16_bits_f32(sm_word(s, off));
        uint32_t q[4], lo[4], hi[4];
        sm_words<4>(s, off + 2, q);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            lo[k] = q[k] & 0x0F0F0F0Fu;        /* elements 4k..4k+3 */
            hi[k] = (q[k] >> 4) & 0x0F0F0F0Fu; /* elements 16+4k.. */
        }
#pragma unroll
        for (int j = 0; j < M; j++) {
            if (j >= r.mc)
                break;
            const int4 *xp = (const int4 *)(r.qs + j * r.n_in + blk * QK);
            const int sum = dp4a_16(hi, __ldg(xp + 1), dp4a_16(lo, __ldg(xp), 0));
            const float2 dx = __ldg(r.ds + j * (r.n_in / 32) + blk);
            acc[j] += d * (dx.x * (float)sum - 8.0f * dx.y);
        }
    }

    static __device__ __forceinline__ void dequant8(const uint8_t *row, int64_t k, int64_t n_in,
                                                    float *v)
    {
        (void)n_in;
        const uint8_t *b = row + (k / QK) * BS;
        const int o = (int)(k % QK);
        const float d = f16_bits_f32(ld_u16(b));
        uint32_t w[2];
        ld_words<2>(b + 2 + (o & 15), w);
        const int shift = o < 16 ? 0 : 4;
#pragma unroll
        for (int t = 0; t < 8; t++)
            v[t] = d * (float)((int)((word_byte(w, t) >> shift) & 0xF) - 8);
    }
};

struct fmt_mxfp4 {
    static constexpr int QK = 32, BS = 17, PARTS = 1, TB = 128;
    static constexpr bool FLOAT_X = false;

    template <int M>
    static __device__ __forceinline__ void dot(const uint32_t *s, uint32_t off, int part,
                                               int64_t blk, const mmv_rows<M> &r, float *acc)
    {
        (void)part;
        const float d = mxfp4_half_scale(sm_word(s, off) & 0xFF);
        uint32_t q[4], va[4], vb[4];
        sm_words<4>(s, off + 1, q);
        /* byte k of q[i] holds element 4i+k (low nibble) and 16+4i+k (high nibble), so the low
         * half of q[i] codes elements 4i, 16+4i, 4i+1, 17+4i and the high half 4i+2, 18+4i,
         * 4i+3, 19+4i; the activations are permuted to the same order below */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            va[i] = mxfp4_lookup4(q[i] & 0xFFFF);
            vb[i] = mxfp4_lookup4(q[i] >> 16);
        }
#pragma unroll
        for (int j = 0; j < M; j++) {
            if (j >= r.mc)
                break;
            const int4 *xp = (const int4 *)(r.qs + j * r.n_in + blk * QK);
            const int4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
            const uint32_t xl[4] = {(uint32_t)x0.x, (uint32_t)x0.y, (uint32_t)x0.z, (uint32_t)x0.w};
            const uint32_t xh[4] = {(uint32_t)x1.x, (uint32_t)x1.y, (uint32_t)x1.z, (uint32_t)x1.w};
            int sum = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                sum = __dp4a((int)va[i], (int)__byte_perm(xl[i], xh[i], 0x5140), sum);
                sum = __dp4a((int)vb[i], (int)__byte_perm(xl[i], xh[i], 0x7362), sum);
            }
            const float2 dx = __ldg(r.ds + j * (r.n_in / 32) + blk);
            acc[j] += d * dx.x * (float)sum;
        }
    }

    static __device__ __forceinline__ void dequant8(const uint8_t *row, int64_t k, int64_t n_in,
                                                    float *v)
    {
        (void)n_in;
        const uint8_t *b = row + (k / QK) * BS;
        const int o = (int)(k % QK);
        const float d = mxfp4_half_scale(__ldg(b));
        uint32_t w[2];
        ld_words<2>(b + 1 + (o & 15), w);
        const int shift = o < 16 ? 0 : 4;
#pragma unroll
        for (int t = 0; t < 8; t++) {
            const uint32_t code = (word_byte(w, t) >> shift) & 0xF;
            const int mag = (int)(__byte_perm(0x03020100u, 0x0C080604u, code & 7) & 0xFF);
            v[t] = d * (float)((code & 8) ? -mag : mag);
        }
    }
};

/* Q4_K and Q5_K: part c (0..3) is the 64 elements of sub-blocks 2c and 2c+1, whose low 4 bits
 * are the low and high nibbles of qs[32c .. 32c+31]. */
template <bool Q5> struct fmt_qk45 {
    static constexpr int QK = 256, BS = Q5 ? 176 : 144, PARTS = 4, TB = 16;
    static constexpr int QS = Q5 ? 48 : 16; /* offset of qs[128] */
    static constexpr bool FLOAT_X = false;

    template <int M>
    static __device__ __forceinline__ void dot(const uint32_t *s, uint32_t off, int part,
                                               int64_t blk, const mmv_rows<M> &r, float *acc)
    {
        const uint32_t dm = sm_word(s, off);
        const float d = f16_bits_f32(dm), dmin = f16_bits_f32(dm >> 16);
        uint32_t sw[3], q[8], va[8], vb[8];
        sm_words<3>(s, off + 4, sw);
        int sc0, m0, sc1, m1;
        k4_scale_min(sw, 2 * part, &sc0, &m0);
        k4_scale_min(sw, 2 * part + 1, &sc1, &m1);
        sm_words<8>(s, off + QS + 32 * part, q);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            va[k] = q[k] & 0x0F0F0F0Fu;
            vb[k] = (q[k] >> 4) & 0x0F0F0F0Fu;
        }
        if constexpr (Q5) {
            uint32_t h[8];
            /* qh[l]: bit j is the 5th bit of element l of sub-block j */
            sm_words<8>(s, off + 16, h);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                va[k] |= ((h[k] >> (2 * part)) & 0x01010101u) << 4;
                vb[k] |= ((h[k] >> (2 * part + 1)) & 0x01010101u) << 4;
            }
        }
        const int64_t e = blk * QK + 64 * part; /* first element of the part */
#pragma unroll
        for (int j = 0; j < M; j++) {
            if (j >= r.mc)
                break;
            const int4 *xp = (const int4 *)(r.qs + j * r.n_in + e);
            int sa = dp4a_16(va, __ldg(xp), 0);
            sa = dp4a_16(va + 4, __ldg(xp + 1), sa);
            int sb = dp4a_16(vb, __ldg(xp + 2), 0);
            sb = dp4a_16(vb + 4, __ldg(xp + 3), sb);
            const float2 *dp = r.ds + j * (r.n_in / 32) + e / 32;
            const float2 da = __ldg(dp), db = __ldg(dp + 1);
            acc[j] += d * (da.x * (float)(sc0 * sa) + db.x * (float)(sc1 * sb)) -
                      dmin * ((float)m0 * da.y + (float)m1 * db.y);
        }
    }

    static __device__ __forceinline__ void dequant8(const uint8_t *row, int64_t k, int64_t n_in,
                                                    float *v)
    {
        (void)n_in;
        const uint8_t *b = row + (k / QK) * BS;
        const int o = (int)(k % QK), j = o / 32, l0 = o % 32;
        uint32_t hd[4], qs[2];
        ld_words<4>(b, hd); /* d, dmin, scales[12] */
        const float d = f16_bits_f32(hd[0]), dmin = f16_bits_f32(hd[0] >> 16);
        int sc, m;
        k4_scale_min(hd + 1, j, &sc, &m);
        const float dl = __fmul_rn(d, (float)sc), ml = __fmul_rn(dmin, (float)m);
        ld_words<2>(b + QS + 32 * (j / 2) + l0, qs);
        const int shift = 4 * (j & 1);
        uint32_t qh[2] = {0, 0};
        if constexpr (Q5)
            ld_words<2>(b + 16 + l0, qh);
#pragma unroll
        for (int t = 0; t < 8; t++) {
            uint32_t q = (word_byte(qs, t) >> shift) & 0xF;
            if constexpr (Q5)
                q |= ((word_byte(qh, t) >> j) & 1) << 4;
            v[t] = __fsub_rn(__fmul_rn(dl, (float)q), ml);
        }
    }
};

/* Q6_K: part p covers half h = p/2 and, within it, l = 16(p%2) .. +15 of each of the four
 * 32-element groups s; element 128h + 32s + l has its low 4 bits in ql[64h + 32(s%2) + l]
 * (low nibble for s < 2) and its high 2 bits at bit 2s of qh[32h + l]; its scale is
 * scales[8h + 2s + p%2]. */
struct fmt_q6_k {
    static constexpr int QK = 256, BS = 210, PARTS = 4, TB = 16;
    static constexpr bool FLOAT_X = false;

    /* (v - 32) per byte for bytes v in 0..63: v ^ 32 is v - 32 in 6-bit two's complement;
     * copying its bit 5 into bits 6 and 7 sign-extends it (0x20 * 6 = 0xC0, no carries). */
    static __device__ __forceinline__ uint32_t minus32(uint32_t v)
    {
        const uint32_t x = v ^ 0x20202020u;
        return x | (x & 0x20202020u) * 6u;
    }

    template <int M>
    static __device__ __forceinline__ void dot(const uint32_t *s, uint32_t off, int part,
                                               int64_t blk, const mmv_rows<M> &r, float *acc)
    {
        const int h = part >> 1, lh = part & 1;
        uint32_t a[4], b[4], hb[4], sw[2];
        sm_words<4>(s, off + 64 * h + 16 * lh, a);      /* ql, groups s = 0 and 2 */
        sm_words<4>(s, off + 64 * h + 32 + 16 * lh, b); /* ql, groups s = 1 and 3 */
        sm_words<4>(s, off + 128 + 32 * h + 16 * lh, hb);
        sm_words<2>(s, off + 192 + 8 * h, sw); /* scales[8h .. 8h+7] */
        const float d = f16_bits_f32(sm_word(s, off + 208));
        uint32_t v[4][4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[0][k] = minus32((a[k] & 0x0F0F0F0Fu) | ((hb[k] << 4) & 0x30303030u));
            v[1][k] = minus32((b[k] & 0x0F0F0F0Fu) | ((hb[k] << 2) & 0x30303030u));
            v[2][k] = minus32(((a[k] >> 4) & 0x0F0F0F0Fu) | (hb[k] & 0x30303030u));
            v[3][k] = minus32(((b[k] >> 4) & 0x0F0F0F0Fu) | ((hb[k] >> 2) & 0x30303030u));
        }
        float sc[4];
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const int t = lh + 2 * g; /* byte of sw */
            sc[g] = (float)(int8_t)((sw[g >> 1] >> (8 * (t & 3))) & 0xFF);
        }
        const int64_t e = blk * QK + 128 * h + 16 * lh;
#pragma unroll
        for (int j = 0; j < M; j++) {
            if (j >= r.mc)
                break;
            const int8_t *xr = r.qs + j * r.n_in + e;
            const float2 *dp = r.ds + j * (r.n_in / 32) + (blk * QK + 128 * h) / 32;
            float sum = 0.0f;
#pragma unroll
            for (int g = 0; g < 4; g++) {
                const int si = dp4a_16(v[g], __ldg((const int4 *)(xr + 32 * g)), 0);
                sum += sc[g] * __ldg(dp + g).x * (float)si;
            }
            acc[j] += d * sum;
        }
    }

    static __device__ __forceinline__ void dequant8(const uint8_t *row, int64_t k, int64_t n_in,
                                                    float *v)
    {
        (void)n_in;
        const uint8_t *b = row + (k / QK) * BS;
        const int o = (int)(k % QK), h = o / 128, g = (o / 32) % 4, l0 = o % 32;
        uint32_t ql[2], qh[2];
        ld_words<2>(b + 64 * h + 32 * (g % 2) + l0, ql);
        ld_words<2>(b + 128 + 32 * h + l0, qh);
        const float d = f16_bits_f32(ld_u16(b + 208));
        const float dl = __fmul_rn(d, (float)(int8_t)__ldg(b + 192 + o / 16));
        const int shift = 4 * (g / 2);
#pragma unroll
        for (int t = 0; t < 8; t++) {
            const int low = (int)((word_byte(ql, t) >> shift) & 0xF);
            const int high = (int)((word_byte(qh, t) >> (2 * g)) & 3);
            v[t] = __fmul_rn(dl, (float)((low | high << 4) - 32));
        }
    }
};

/* Dot of 8 float weights with elements e..e+7 of each activation row (fewer at the row end). */
template <int M>
__device__ __forceinline__ void mmv_float_dot(const float *wf, int64_t e, const mmv_rows<M> &r,
                                              float *acc)
{
    const int64_t left = r.n_in - e;
#pragma unroll
    for (int j = 0; j < M; j++) {
        if (j >= r.mc)
            break;
        const float *xp = r.x[j] + e;
        if (left >= 8) {
#pragma unroll
            for (int i = 0; i < 8; i++)
                acc[j] = fmaf(wf[i], __ldg(xp + i), acc[j]);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++)
                if (i < left)
                    acc[j] = fmaf(wf[i], __ldg(xp + i), acc[j]);
        }
    }
}

/* F32, F16, BF16: staged in units of 32 elements, a part is 8 elements. */
template <uint32_t T> struct fmt_float {
    static constexpr int ES = T == QUANT_F32 ? 4 : 2; /* bytes per element */
    static constexpr int QK = 32, BS = 32 * ES, PARTS = 4, TB = 2048 / BS;
    static constexpr bool FLOAT_X = true;

    static __device__ __forceinline__ float from_bits(uint32_t bits)
    {
        if constexpr (T == QUANT_F32)
            return __uint_as_float(bits);
        else if constexpr (T == QUANT_F16)
            return f16_bits_f32(bits);
        else
            return bf16_bits_f32(bits);
    }

    /* element i of words holding 8 consecutive elements */
    static __device__ __forceinline__ float elem(const uint32_t *w, int i)
    {
        if constexpr (ES == 4)
            return from_bits(w[i]);
        else
            return from_bits(w[i / 2] >> (16 * (i % 2)));
    }

    template <int M>
    static __device__ __forceinline__ void dot(const uint32_t *s, uint32_t off, int part,
                                               int64_t blk, const mmv_rows<M> &r, float *acc)
    {
        const int64_t e = blk * QK + 8 * part;
        if (e >= r.n_in)
            return;
        uint32_t w[2 * ES];
        sm_words<2 * ES>(s, off + 8 * ES * part, w);
        float wf[8];
#pragma unroll
        for (int i = 0; i < 8; i++)
            wf[i] = elem(w, i);
        mmv_float_dot<M>(wf, e, r, acc);
    }

    static __device__ __forceinline__ void dequant8(const uint8_t *row, int64_t k, int64_t n_in,
                                                    float *v)
    {
        const uint8_t *p = row + k * ES;
        if (k + 8 <= n_in) {
            uint32_t w[2 * ES];
            ld_words<2 * ES>(p, w);
#pragma unroll
            for (int i = 0; i < 8; i++)
                v[i] = elem(w, i);
            return;
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            v[i] = 0.0f;
            if (k + i < n_in) {
                uint32_t bits;
                if constexpr (ES == 4)
                    ld_words<1>(p + 4 * i, &bits);
                else
                    bits = ld_u16(p + 2 * i);
                v[i] = from_bits(bits);
            }
        }
    }
};

/* ---- MMV --------------------------------------------------------------------------------- */

struct mmv_params {
    const uint8_t *w; /* (n_out rows of w_stride bytes) */
    size_t w_stride;
    size_t row_bytes;     /* bytes of the n_in elements of a row */
    uintptr_t w_lo, w_hi; /* the matrix bytes: [w, w + (n_out-1)*w_stride + row_bytes) */
    int64_t n_in, n_out;
    int m;
    const int8_t *xq;  /* quantized types: (m rows of n_in) scratch */
    const float2 *xds; /* quantized types: (m rows of n_in/32) scratch */
    const float *x;    /* float types: (rows of x_stride) */
    int64_t x_stride;
    const int32_t *x_rows; /* (m) or NULL */
    float *y;              /* (m rows of y_stride) */
    int64_t y_stride;
};

/* Words of one tile buffer: the granules of a tile that starts at any alignment, plus the
 * word sm_words reads past the last byte, rounded to 16 bytes. */
template <typename F> constexpr int mmv_tile_words = ((F::TB * F::BS + 32) / 4 + 4 + 3) / 4 * 4;

/* KS = 1: one warp per row, the kernel synchronizes nothing wider than a warp. KS = MMV_WARPS
 * (few rows, m = 1: too few warps to keep the loads in flight): the block's warps share one
 * row, warp w taking tiles w, w + KS, ..., and their sums are added in warp order. */
template <typename F, int M, int KS>
__global__ void __launch_bounds__(MMV_THREADS) mmv_kernel(const mmv_params p)
{
    __shared__ __align__(16) uint32_t tiles[MMV_WARPS][2][mmv_tile_words<F>];
    __shared__ float red[KS > 1 ? KS : 1][M];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int64_t row = KS > 1 ? (int64_t)blockIdx.x : (int64_t)blockIdx.x * MMV_WARPS + warp;
    const int kw = KS > 1 ? warp : 0; /* this warp's first tile */
    if (row >= p.n_out)
        return; /* whole warps (KS = 1) or whole blocks (KS > 1) */

    const int j0 = blockIdx.y * MMV_MAX_M;
    mmv_rows<M> r;
    r.n_in = p.n_in;
    r.mc = min(M, p.m - j0);
    if constexpr (F::FLOAT_X) {
        r.qs = nullptr;
        r.ds = nullptr;
#pragma unroll
        for (int j = 0; j < M; j++) {
            const int jj = j0 + min(j, r.mc - 1);
            const int64_t xr = p.x_rows ? (int64_t)__ldg(p.x_rows + jj) : (int64_t)jj;
            r.x[j] = p.x + xr * p.x_stride;
        }
    } else {
        r.qs = p.xq + (int64_t)j0 * p.n_in;
        r.ds = p.xds + (int64_t)j0 * (p.n_in / 32);
#pragma unroll
        for (int j = 0; j < M; j++)
            r.x[j] = nullptr;
    }

    float acc[M];
#pragma unroll
    for (int j = 0; j < M; j++)
        acc[j] = 0.0f;

    const uint8_t *wrow = p.w + row * p.w_stride;
    const int64_t nblk = (p.n_in + F::QK - 1) / F::QK;
    const int ntile = (int)((nblk + F::TB - 1) / F::TB);
    const int64_t tile_bytes = (int64_t)F::TB * F::BS;

    if (kw < ntile) {
        const int64_t b0 = (int64_t)kw * tile_bytes;
        tile_stage(tiles[warp][0], wrow + b0, wrow + min(b0 + tile_bytes, (int64_t)p.row_bytes),
                   p.w_lo, p.w_hi, lane);
    }
    cp_async_commit();
    for (int t = kw, it = 0; t < ntile; t += KS, it++) {
        if (t + KS < ntile) {
            const int64_t b0 = (int64_t)(t + KS) * tile_bytes;
            tile_stage(tiles[warp][(it + 1) & 1], wrow + b0,
                       wrow + min(b0 + tile_bytes, (int64_t)p.row_bytes), p.w_lo, p.w_hi, lane);
        }
        cp_async_commit(); /* possibly empty: keeps "all but the newest group" = tile t */
        cp_async_wait<1>();
        __syncwarp();

        const uint32_t *s = tiles[warp][it & 1];
        const int64_t tb0 = (int64_t)t * F::TB;
        const uint32_t shift = (uint32_t)((uintptr_t)(wrow + tb0 * F::BS) & 15);
        const int nparts = (int)min((int64_t)F::TB, nblk - tb0) * F::PARTS;
        for (int q = lane; q < nparts; q += WARP) {
            const int blk = q / F::PARTS, part = q % F::PARTS;
            F::template dot<M>(s, shift + (uint32_t)(blk * F::BS), part, tb0 + blk, r, acc);
        }
        __syncwarp(); /* the buffer is refilled by the next iteration's tile_stage */
    }

#pragma unroll
    for (int j = 0; j < M; j++)
#pragma unroll
        for (int o = WARP / 2; o > 0; o >>= 1)
            acc[j] += __shfl_xor_sync(FULL_MASK, acc[j], o);
    if constexpr (KS > 1) {
        if (lane == 0)
#pragma unroll
            for (int j = 0; j < M; j++)
                red[warp][j] = acc[j];
        __syncthreads();
        if (warp != 0)
            return;
#pragma unroll
        for (int j = 0; j < M; j++) {
            acc[j] = red[0][j];
#pragma unroll
            for (int w = 1; w < KS; w++)
                acc[j] += red[w][j];
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int j = 0; j < M; j++)
            if (j < r.mc)
                p.y[(int64_t)(j0 + j) * p.y_stride + row] = acc[j];
    }
}

/* ---- activation quantization ------------------------------------------------------------- */

struct q8_params {
    const float *x; /* (rows of x_stride) */
    int64_t x_stride;
    const int32_t *x_rows; /* (m) or NULL */
    int8_t *qs;            /* (m rows of n_in) */
    float2 *ds;            /* (m rows of n_in/32) */
    int64_t n_in;
};

/* One warp per 32-element block of one activation row: d = max|x| / 127, q = round-to-even(x *
 * (127 / max|x|)), ds = (d, d * sum q). A block holding a NaN or infinity gets d = NaN, so the
 * outputs that use it are NaN. grid (ceil(n_in/32 / Q8_WARPS), m). */
__global__ void __launch_bounds__(Q8_WARPS *WARP) quantize_q8_kernel(const q8_params p)
{
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int64_t nb = p.n_in / 32;
    const int64_t b = (int64_t)blockIdx.x * Q8_WARPS + warp;
    if (b >= nb)
        return;
    const int j = blockIdx.y;
    const int64_t xr = p.x_rows ? (int64_t)__ldg(p.x_rows + j) : (int64_t)j;
    const float v = __ldg(p.x + xr * p.x_stride + b * 32 + lane);
    const bool finite = __all_sync(FULL_MASK, fabsf(v) <= FLT_MAX);
    float amax = fabsf(v);
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, o));
    const float d = finite ? amax / 127.0f : __uint_as_float(0x7fc00000u);
    const float id = amax > 0.0f && finite ? 127.0f / amax : 0.0f;
    const int q = max(-127, min(127, __float2int_rn(v * id)));
    int sum = q;
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1)
        sum += __shfl_xor_sync(FULL_MASK, sum, o);
    p.qs[(int64_t)j * p.n_in + b * 32 + lane] = (int8_t)q;
    if (lane == 0)
        p.ds[(int64_t)j * nb + b] = make_float2(d, d * (float)sum);
}

/* ---- GEMM -------------------------------------------------------------------------------- */

constexpr int GBM = 64, GBN = 128, GBK = 64, GLD = GBK + 8; /* GLD: padded smem row */
constexpr int GTHREADS = 256;

struct gemm_params {
    const uint8_t *w; /* (n_out rows of w_stride bytes) */
    size_t w_stride;
    int64_t n_in, n_out;
    int m;
    const float *x; /* (rows of x_stride) */
    int64_t x_stride;
    const int32_t *x_rows; /* (m) or NULL */
    float *y;              /* (m rows of y_stride) */
    int64_t y_stride;
};

/* Eight consecutive bf16 values as 16 bytes (for one 16-byte shared store). */
__device__ __forceinline__ uint4 pack_bf16x8(const float *v)
{
    uint32_t u[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
        u[i] = *(const uint32_t *)&h;
    }
    return make_uint4(u[0], u[1], u[2], u[3]);
}

/* y tile (m0.., n0..) of 64 x 128; warp w computes rows 32(w/4).. and columns 32(w%4).. */
template <typename F> __global__ void __launch_bounds__(GTHREADS) gemm_kernel(const gemm_params p)
{
    using namespace nvcuda;
    __shared__ __align__(32) __nv_bfloat16 as[GBM][GLD]; /* activations (m, k) */
    __shared__ __align__(32) __nv_bfloat16 bs[GBN][GLD]; /* weights (n, k): W^T col-major */
    __shared__ __align__(32) float cs[GTHREADS / WARP][16 * 16];

    const int tid = threadIdx.x, warp = tid / WARP, lane = tid % WARP;
    const int wm = warp / 4, wn = warp % 4;
    const int64_t n0 = (int64_t)blockIdx.x * GBN;
    const int m0 = blockIdx.y * GBM;

    /* activation rows this thread loads: 2 groups of 8 (rows tid/8 and 32 + tid/8) */
    const float *xrow[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int rr = m0 + (tid + GTHREADS * i) / 8;
        xrow[i] = nullptr;
        if (rr < p.m)
            xrow[i] = p.x + (p.x_rows ? (int64_t)__ldg(p.x_rows + rr) : (int64_t)rr) * p.x_stride;
    }

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::fill_fragment(acc[i][j], 0.0f);

    for (int64_t k0 = 0; k0 < p.n_in; k0 += GBK) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int g = tid + GTHREADS * i, rr = g / 8, c = (g % 8) * 8;
            float v[8];
#pragma unroll
            for (int t = 0; t < 8; t++)
                v[t] = xrow[i] && k0 + c + t < p.n_in ? __ldg(xrow[i] + k0 + c + t) : 0.0f;
            *(uint4 *)&as[rr][c] = pack_bf16x8(v);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int g = tid + GTHREADS * i, rr = g / 8, c = (g % 8) * 8;
            float v[8];
            const int64_t wr = n0 + rr;
            if (wr < p.n_out && k0 + c < p.n_in) {
                F::dequant8(p.w + wr * p.w_stride, k0 + c, p.n_in, v);
            } else {
#pragma unroll
                for (int t = 0; t < 8; t++)
                    v[t] = 0.0f;
            }
            *(uint4 *)&bs[rr][c] = pack_bf16x8(v);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GBK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[2];
#pragma unroll
            for (int i = 0; i < 2; i++)
                wmma::load_matrix_sync(fa[i], &as[wm * 32 + 16 * i][kk], GLD);
#pragma unroll
            for (int j = 0; j < 2; j++)
                wmma::load_matrix_sync(fb[j], &bs[wn * 32 + 16 * j][kk], GLD);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++)
                    wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            wmma::store_matrix_sync(cs[warp], acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            for (int e = lane; e < 256; e += WARP) {
                const int64_t yr = m0 + wm * 32 + 16 * i + e / 16;
                const int64_t yc = n0 + wn * 32 + 16 * j + e % 16;
                if (yr < p.m && yc < p.n_out)
                    p.y[yr * p.y_stride + yc] = cs[warp][e];
            }
            __syncwarp();
        }
}

} /* namespace */

/* ---- host side --------------------------------------------------------------------------- */

namespace
{

struct fmt_info {
    uint32_t type;
    int64_t block; /* elements per ggml block (1 for F32/F16/BF16) */
    size_t bytes;  /* bytes per ggml block */
    bool quantized;
};

const fmt_info fmt_table[] = {
    {QUANT_F32, 1, 4, false},
    {QUANT_F16, 1, 2, false},
    {QUANT_BF16, 1, 2, false},
    {QUANT_Q8_0, QK_32, sizeof(struct block_q8_0), true},
    {QUANT_Q4_0, QK_32, sizeof(struct block_q4_0), true},
    {QUANT_MXFP4, QK_32, sizeof(struct block_mxfp4), true},
    {QUANT_Q4_K, QK_K, sizeof(struct block_q4_k), true},
    {QUANT_Q5_K, QK_K, sizeof(struct block_q5_k), true},
    {QUANT_Q6_K, QK_K, sizeof(struct block_q6_k), true},
};

static_assert(fmt_q8_0::BS == sizeof(struct block_q8_0), "Q8_0 block size");
static_assert(fmt_q4_0::BS == sizeof(struct block_q4_0), "Q4_0 block size");
static_assert(fmt_mxfp4::BS == sizeof(struct block_mxfp4), "MXFP4 block size");
static_assert(fmt_qk45<false>::BS == sizeof(struct block_q4_k), "Q4_K block size");
static_assert(fmt_qk45<true>::BS == sizeof(struct block_q5_k), "Q5_K block size");
static_assert(fmt_q6_k::BS == sizeof(struct block_q6_k), "Q6_K block size");

const fmt_info *fmt_find(uint32_t type)
{
    for (const fmt_info &f : fmt_table)
        if (f.type == type)
            return &f;
    return nullptr;
}

constexpr int64_t MAX_N_IN = (int64_t)1 << 28;
constexpr int MAX_GRID_Y = 65535;

size_t align16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* Bytes of the 8-bit activation rows at the start of the scratch; the (d, d*sum) pairs follow. */
size_t q8_qs_bytes(int64_t n_in, int m)
{
    return align16((size_t)m * (size_t)n_in);
}

enum cuda_matmul_path path_choose(const struct cuda_matmul_args *a)
{
    if (a->path != CUDA_MATMUL_PATH_AUTO)
        return a->path;
    if (a->wtype == QUANT_F32 || a->m < CUDA_MATMUL_GEMM_MIN_M)
        return CUDA_MATMUL_PATH_MMV;
    return CUDA_MATMUL_PATH_GEMM;
}

int rc_of(cudaError_t e)
{
    return e == cudaSuccess ? 0 : (e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO);
}

template <typename F> void mmv_launch(const mmv_params &p, cudaStream_t st)
{
    const dim3 grid((unsigned)((p.n_out + MMV_WARPS - 1) / MMV_WARPS),
                    (unsigned)((p.m + MMV_MAX_M - 1) / MMV_MAX_M));
    if (p.m == 1 && p.n_out <= MMV_SPLIT_MAX_ROWS)
        mmv_kernel<F, 1, MMV_WARPS><<<dim3((unsigned)p.n_out, 1), MMV_THREADS, 0, st>>>(p);
    else if (p.m == 1)
        mmv_kernel<F, 1, 1><<<grid, MMV_THREADS, 0, st>>>(p);
    else if (p.m == 2)
        mmv_kernel<F, 2, 1><<<grid, MMV_THREADS, 0, st>>>(p);
    else if (p.m <= 4)
        mmv_kernel<F, 4, 1><<<grid, MMV_THREADS, 0, st>>>(p);
    else if (p.m <= 8)
        mmv_kernel<F, 8, 1><<<grid, MMV_THREADS, 0, st>>>(p);
    else
        mmv_kernel<F, MMV_MAX_M, 1><<<grid, MMV_THREADS, 0, st>>>(p);
}

template <typename F> void gemm_launch(const gemm_params &p, cudaStream_t st)
{
    const dim3 grid((unsigned)((p.n_out + GBN - 1) / GBN), (unsigned)((p.m + GBM - 1) / GBM));
    gemm_kernel<F><<<grid, GTHREADS, 0, st>>>(p);
}

struct mmv_launch_fn {
    const mmv_params &p;
    cudaStream_t st;
    template <typename F> void operator()()
    {
        mmv_launch<F>(p, st);
    }
};

struct gemm_launch_fn {
    const gemm_params &p;
    cudaStream_t st;
    template <typename F> void operator()()
    {
        if constexpr (!std::is_same_v<F, fmt_float<QUANT_F32>>) /* checked: F32 has no GEMM */
            gemm_launch<F>(p, st);
    }
};

/* Calls fn.template operator()<F>() with the format of type (a supported type). */
template <typename Fn> void fmt_dispatch(uint32_t type, Fn &&fn)
{
    switch (type) {
    case QUANT_F32:
        fn.template operator()<fmt_float<QUANT_F32>>();
        break;
    case QUANT_F16:
        fn.template operator()<fmt_float<QUANT_F16>>();
        break;
    case QUANT_BF16:
        fn.template operator()<fmt_float<QUANT_BF16>>();
        break;
    case QUANT_Q8_0:
        fn.template operator()<fmt_q8_0>();
        break;
    case QUANT_Q4_0:
        fn.template operator()<fmt_q4_0>();
        break;
    case QUANT_MXFP4:
        fn.template operator()<fmt_mxfp4>();
        break;
    case QUANT_Q4_K:
        fn.template operator()<fmt_qk45<false>>();
        break;
    case QUANT_Q5_K:
        fn.template operator()<fmt_qk45<true>>();
        break;
    case QUANT_Q6_K:
        fn.template operator()<fmt_q6_k>();
        break;
    default:
        break;
    }
}

/* cudaFuncGetAttributes loads a kernel's module when lazy loading is on. */
template <typename K> cudaError_t kernel_preload(K *kernel)
{
    cudaFuncAttributes attr;
    return CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
}

struct preload_fn {
    cudaError_t e = cudaSuccess;
    template <typename F> void operator()()
    {
        if (e == cudaSuccess)
            e = kernel_preload(mmv_kernel<F, 1, MMV_WARPS>);
        if (e == cudaSuccess)
            e = kernel_preload(mmv_kernel<F, 1, 1>);
        if (e == cudaSuccess)
            e = kernel_preload(mmv_kernel<F, 2, 1>);
        if (e == cudaSuccess)
            e = kernel_preload(mmv_kernel<F, 4, 1>);
        if (e == cudaSuccess)
            e = kernel_preload(mmv_kernel<F, 8, 1>);
        if (e == cudaSuccess)
            e = kernel_preload(mmv_kernel<F, MMV_MAX_M, 1>);
        if constexpr (!std::is_same_v<F, fmt_float<QUANT_F32>>)
            if (e == cudaSuccess)
                e = kernel_preload(gemm_kernel<F>);
    }
};

} /* namespace */

extern "C" bool cuda_matmul_supported(uint32_t wtype)
{
    return fmt_find(wtype) != nullptr;
}

extern "C" size_t cuda_matmul_scratch_bytes(uint32_t wtype, int64_t n_in, int64_t n_out, int m)
{
    (void)n_out;
    const fmt_info *f = fmt_find(wtype);
    if (!f || n_in <= 0 || n_in > MAX_N_IN || n_in % f->block || m < 1)
        return 0;
    if (!f->quantized)
        return 0;
    return q8_qs_bytes(n_in, m) + (size_t)m * (size_t)(n_in / 32) * sizeof(float2);
}

extern "C" int cuda_matmul_init(void)
{
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        fprintf(stderr, "cuda_matmul_init: no usable CUDA device\n");
        return -ENODEV;
    }
    if (major < 8) {
        fprintf(stderr,
                "cuda_matmul_init: device %d has compute capability %d.x; cp.async and "
                "BF16 tensor cores need 8.0 or newer\n",
                dev, major);
        return -ENODEV;
    }
    preload_fn pre;
    for (const fmt_info &f : fmt_table)
        fmt_dispatch(f.type, pre);
    if (pre.e == cudaSuccess)
        pre.e = kernel_preload(quantize_q8_kernel);
    return rc_of(pre.e);
}

extern "C" int cuda_matmul_check(const struct cuda_matmul_args *a)
{
    if (!a)
        return -EINVAL;
    const fmt_info *f = fmt_find(a->wtype);
    if (!f)
        return -EINVAL;
    if (a->n_in <= 0 || a->n_in > MAX_N_IN || a->n_in % f->block)
        return -EINVAL;
    if (a->n_out <= 0 || a->n_out > INT32_MAX || a->m < 1)
        return -EINVAL;
    if (!a->w || !a->x || !a->y)
        return -EINVAL;
    if ((uintptr_t)a->x % 4 || (uintptr_t)a->y % 4)
        return -EINVAL;
    const size_t row_bytes = (size_t)(a->n_in / f->block) * f->bytes;
    if (a->w_stride < row_bytes || (size_t)(a->n_out - 1) > (SIZE_MAX - row_bytes) / a->w_stride)
        return -EINVAL;
    if (a->x_stride < a->n_in || a->y_stride < a->n_out)
        return -EINVAL;
    if (a->path != CUDA_MATMUL_PATH_AUTO && a->path != CUDA_MATMUL_PATH_MMV &&
        a->path != CUDA_MATMUL_PATH_GEMM)
        return -EINVAL;
    const enum cuda_matmul_path path = path_choose(a);
    if (path == CUDA_MATMUL_PATH_GEMM) {
        if (a->wtype == QUANT_F32 || (a->m + GBM - 1) / GBM > MAX_GRID_Y)
            return -EINVAL;
        return 0;
    }
    if (a->m > MAX_GRID_Y) /* the quantize grid has one row per activation row */
        return -EINVAL;
    if (f->quantized) {
        const size_t need = cuda_matmul_scratch_bytes(a->wtype, a->n_in, a->n_out, a->m);
        if (!a->scratch || a->scratch_bytes < need || (uintptr_t)a->scratch % 16)
            return -EINVAL;
    }
    return 0;
}

extern "C" int cuda_matmul(const struct cuda_matmul_args *a)
{
    int rc = cuda_matmul_check(a);
    if (rc)
        return rc;
    const fmt_info *f = fmt_find(a->wtype);
    const cudaStream_t st = (cudaStream_t)a->stream;
    const size_t row_bytes = (size_t)(a->n_in / f->block) * f->bytes;

    if (path_choose(a) == CUDA_MATMUL_PATH_GEMM) {
        const gemm_params p = {(const uint8_t *)a->w, a->w_stride, a->n_in, a->n_out,   a->m, a->x,
                               a->x_stride,           a->x_rows,   a->y,    a->y_stride};
        fmt_dispatch(a->wtype, gemm_launch_fn{p, st});
        return cuda_last_error("cuda_matmul (gemm)");
    }

    mmv_params p = {};
    p.w = (const uint8_t *)a->w;
    p.w_stride = a->w_stride;
    p.row_bytes = row_bytes;
    p.w_lo = (uintptr_t)a->w;
    p.w_hi = p.w_lo + (size_t)(a->n_out - 1) * a->w_stride + row_bytes;
    p.n_in = a->n_in;
    p.n_out = a->n_out;
    p.m = a->m;
    p.x = a->x;
    p.x_stride = a->x_stride;
    p.x_rows = a->x_rows;
    p.y = a->y;
    p.y_stride = a->y_stride;
    if (f->quantized) {
        p.xq = (int8_t *)a->scratch;
        p.xds = (float2 *)((uint8_t *)a->scratch + q8_qs_bytes(a->n_in, a->m));
    }
    if (f->quantized && !a->x_ready) {
        q8_params q = {};
        q.x = a->x;
        q.x_stride = a->x_stride;
        q.x_rows = a->x_rows;
        q.qs = (int8_t *)a->scratch;
        q.ds = (float2 *)((uint8_t *)a->scratch + q8_qs_bytes(a->n_in, a->m));
        q.n_in = a->n_in;
        const dim3 grid((unsigned)((a->n_in / 32 + Q8_WARPS - 1) / Q8_WARPS), (unsigned)a->m);
        quantize_q8_kernel<<<grid, Q8_WARPS * WARP, 0, st>>>(q);
        p.xq = q.qs;
        p.xds = q.ds;
    }
    fmt_dispatch(a->wtype, mmv_launch_fn{p, st});
    return cuda_last_error("cuda_matmul (mmv)");
}
