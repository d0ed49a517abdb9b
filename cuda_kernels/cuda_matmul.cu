/* cuda_matmul: y = x W^T for GGUF-layout weights (contracts in cuda_matmul.h, design and
 * tolerances in docs/cuda-matmul.md, block layouts in docs/formats.md).
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
 * GEMM kernel (prefill: m large). A CTA of eight warps computes a BM x BN tile of y (128 x 128,
 * 64 x 128, 64 x 64 or 32 x 64, picked per call so that the grid fills the SMs) with
 * mma.m16n8k16 BF16 fragments (ldmatrix loads) and float32 accumulators. The weight rows of the
 * tile stream through a ring of three raw stages in shared memory (cp.async of the 16-byte
 * granules covering 256 elements of each row, 128 for F16/BF16: whole blocks, any alignment,
 * the same granule rules as MMV), so two stages are in flight while one is decoded. Each
 * 64-wide step of n_in decodes its slice of the current stage exactly as quant_ref does (no
 * FMA contraction) and rounds it to BF16, stores the activations loaded (float4 where the row
 * is 16-byte aligned) during the previous step as BF16, starts loading the next step's, and
 * runs the MMAs; the BF16 step tiles are double-buffered, one barrier per step. Every output is
 * the same float sum in the same k order whatever the tile, so the tile choice never changes
 * the bits.
 *
 * No kernel keeps state between launches; no launch depends on the host seeing results.
 */
#include "cuda_matmul.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include <type_traits>

#include "../cpu_kernels/quant_blocks.h"
#include "cuda_check.h"
#include "cuda_mem.h"
#include "cuda_ops_util.cuh"

namespace
{

constexpr int WARP = 32;
constexpr unsigned FULL_MASK = 0xffffffffu;
constexpr int MMV_WARPS = 4; /* warps per MMV CTA, one weight row each */
constexpr int MMV_THREADS = MMV_WARPS * WARP;
constexpr int MMV_MIN_BLOCKS = 10; /* one-row MMV: blocks per SM the registers must allow */
/* m = 1 with at most this many rows: a block per row (4 warps split its tiles), so that a
 * router (128 rows) keeps enough loads in flight; the 512-row k/v projections measured slower
 * split, hence the bound (docs/cuda-matmul.md) */
constexpr int64_t MMV_SPLIT_MAX_ROWS = 256;
constexpr int MMV_PACK = 4;                  /* rows per warp of mmv_pack_kernel */
constexpr int64_t MMV_PACK_MIN_ROWS = 16384; /* matrices it takes: output heads */
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

/* The doubled E2M1 values (docs/formats.md, MXFP4) of the four 4-bit codes in the low 16 bits
 * of q16 (code n in bits 4n..4n+3), as four int8 in the bytes of the result. Codes 8..15 are
 * the negatives of 0..7, so two byte permutes look up both signs and a third picks per byte. */
__device__ __forceinline__ uint32_t mxfp4_lookup4(uint32_t q16)
{
    const uint32_t idx = q16 & 0x7777u;
    const uint32_t pos = __byte_perm(0x03020100u, 0x0C080604u, idx); /* 0 1 2 3 4 6 8 12 */
    const uint32_t neg = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, idx); /* negated */
    const uint32_t sel = 0x3210u | ((q16 & 0x8888u) >> 1);           /* +4: byte of neg */
    return __byte_perm(pos, neg, sel);
}

/* __funnelshift_r and __dp4a; for R > 1 (mmv_kernel's rows per warp) as plain, not volatile,
 * asm: the same instructions, but the intrinsics' volatile asm keeps the compiler from sharing
 * the activation loads around them between the R rows' dots. R = 1 keeps the intrinsics (and
 * the one-row kernels' schedules and registers). */
template <int R = 1>
__device__ __forceinline__ uint32_t mm_shf_r(uint32_t lo, uint32_t hi, uint32_t sh)
{
    if constexpr (R > 1) {
        uint32_t r;
        asm("shf.r.wrap.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(lo), "r"(hi), "r"(sh));
        return r;
    } else {
        return __funnelshift_r(lo, hi, sh);
    }
}

template <int R = 1> __device__ __forceinline__ int mm_dp4a(int a, int b, int c)
{
    if constexpr (R > 1) {
        int r;
        asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
        return r;
    } else {
        return __dp4a(a, b, c);
    }
}

/* The little-endian 32-bit word at byte offset off of a shared buffer, any alignment. Reads
 * the aligned words s[off/4] and s[off/4 + 1]. */
template <int R = 1> __device__ __forceinline__ uint32_t sm_word(const uint32_t *s, uint32_t off)
{
    const uint32_t i = off >> 2, sh = (off & 3) * 8;
    return mm_shf_r<R>(s[i], s[i + 1], sh);
}

/* N consecutive 32-bit words from byte offset off of a shared buffer, any alignment. */
template <int N, int R = 1>
__device__ __forceinline__ void sm_words(const uint32_t *s, uint32_t off, uint32_t *out)
{
    const uint32_t i = off >> 2, sh = (off & 3) * 8;
    uint32_t prev = s[i];
#pragma unroll
    for (int k = 0; k < N; k++) {
        const uint32_t next = s[i + k + 1];
        out[k] = mm_shf_r<R>(prev, next, sh);
        prev = next;
    }
}

/* (float)(byte t of the little-endian word array w) - bias, exactly (bias an integer in 0..255):
 * the byte is placed in the mantissa of 2^23 (one byte permute) and 2^23 + bias subtracted, two
 * full-rate instructions instead of a quarter-rate int-to-float conversion. */
__device__ __forceinline__ float byte_f32(const uint32_t *w, int t, float bias)
{
    const uint32_t f = __byte_perm(w[t >> 2], 0x4B00u, 0x5440u | (uint32_t)(t & 3));
    return __uint_as_float(f) - (8388608.0f + bias);
}

/* 6-bit scale and min of sub-block j (0..7) of Q4_K/Q5_K from the 12 scale bytes held in
 * three words (docs/formats.md, K-quants); j may be a run-time value. */
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
template <int R = 1> __device__ __forceinline__ int dp4a_16(const uint32_t *v, int4 x, int c)
{
    c = mm_dp4a<R>((int)v[0], x.x, c);
    c = mm_dp4a<R>((int)v[1], x.y, c);
    c = mm_dp4a<R>((int)v[2], x.z, c);
    c = mm_dp4a<R>((int)v[3], x.w, c);
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

/* Copies the aligned 16-byte granule at src of a weight matrix that spans [lo, hi) to dst: by
 * cp.async when it lies wholly inside the matrix (the caller commits and waits), else byte by
 * byte, inside bytes only (plain shared stores, visible after the caller's barrier). */
__device__ __forceinline__ void granule_copy(uint8_t *dst, uintptr_t src, uintptr_t lo,
                                             uintptr_t hi)
{
    if (src >= lo && src + 16 <= hi) {
        cp_async16(dst, (const void *)src);
    } else {
        for (int b = 0; b < 16; b++)
            if (src + b >= lo && src + b < hi)
                dst[b] = *(const uint8_t *)(src + b);
    }
}

/* Copies the bytes [g0, g1) of a weight matrix that spans [lo, hi) into buf: 16-byte granule k
 * of buf holds the bytes at (g0 & ~15) + 16k, so byte g0 lands at offset g0 & 15 (granule_copy
 * for each). Called by all lanes of a warp. */
__device__ void tile_stage(uint32_t *buf, const uint8_t *g0, const uint8_t *g1, uintptr_t lo,
                           uintptr_t hi, int lane)
{
    const uintptr_t a0 = (uintptr_t)g0 & ~(uintptr_t)15;
    const uintptr_t a1 = ((uintptr_t)g1 + 15) & ~(uintptr_t)15;
    const int n = (int)((a1 - a0) >> 4);
    for (int k = lane; k < n; k += WARP)
        granule_copy((uint8_t *)buf + 16 * k, a0 + 16 * (uintptr_t)k, lo, hi);
}

/* ---- weight formats ----------------------------------------------------------------------
 * Each format gives: QK (elements per block; for F32/F16/BF16 a 32-element staging unit), BS
 * (its bytes), PARTS (lanes' work units per block), TB (blocks per MMV tile), FLOAT_X (MMV
 * uses float activations), dot<M>() (one part of one block staged in shared memory at byte
 * offset off, against the chunk's activation rows), and dequant8() (GEMM: elements k..k+7 of
 * one row's stage in shared memory, as quant_ref decodes them, see below). */

/* dequant8(s, base, k, n_left, v): the stage of a weight row starts at byte offset base of the
 * shared buffer s with the first element of a block, k (a multiple of 8) counts elements from
 * there, n_left is the number of elements from there to the end of the row (only the float
 * types need it: they zero the elements past it; quantized callers never pass a k >= n_left).
 * The values are quant_ref's, computed with the same operations in the same order. */

/* An activation load of a dot: __ldg for one weight row per warp; a plain load for R > 1, which
 * the compiler can share between the R rows' dots (it must repeat __ldg, a volatile asm). The
 * activations are written by an earlier kernel and only read here. */
template <int R, typename T> __device__ __forceinline__ T mmv_x(const T *p)
{
    if constexpr (R > 1)
        return *p;
    else
        return __ldg(p);
}

/* The activation rows of one MMV chunk (R: weight rows per warp, mmv_kernel). */
template <int M, int R = 1> struct mmv_rows {
    const int8_t *qs;  /* quantized types: (mc rows of n_in) 8-bit activations, scratch */
    const float2 *ds;  /* quantized types: (mc rows of n_in/32) scale d and d * sum(q) */
    const float *x[M]; /* float types: activation row j, device */
    int64_t n_in;
    int mq; /* rows in this chunk, 1..M; with R > 1, rows past it read row mq - 1 */
    __device__ __forceinline__ int64_t row(int j) const
    {
        return R == 1 ? j : min(j, mq - 1);
    }
    /* Whether a dot stops before row j: at mq, or (R > 1) never, so that all M rows' loads
     * are unconditional and the compiler can share them between the R weight rows. */
    __device__ __forceinline__ bool stop(int j) const
    {
        return R == 1 && j >= mq;
    }
};

struct fmt_q8_0 {
    static constexpr int QK = 32, BS = 34, PARTS = 1, TB = 64;
    static constexpr bool FLOAT_X = false;

    template <int M, int R>
    static __device__ __forceinline__ void dot(const uint32_t *s, uint32_t off, int part,
                                               int64_t blk, const mmv_rows<M, R> &r, float *acc)
    {
        (void)part;
        const float d = f16_bits_f32(sm_word<R>(s, off));
        uint32_t q[8];
        sm_words<8, R>(s, off + 2, q);
#pragma unroll
        for (int j = 0; j < M; j++) {
            if (r.stop(j))
                break;
            const int4 *xp = (const int4 *)(r.qs + r.row(j) * r.n_in + blk * QK);
            int sum = dp4a_16<R>(q, mmv_x<R>(xp), 0);
            sum = dp4a_16<R>(q + 4, mmv_x<R>(xp + 1), sum);
            const float2 dx = mmv_x<R>(r.ds + r.row(j) * (r.n_in / 32) + blk);
            acc[j] += d * dx.x * (float)sum;
        }
    }

    static __device__ __forceinline__ void dequant8(const uint32_t *s, uint32_t base, int k,
                                                    int n_left, float *v)
    {
        (void)n_left;
        const uint32_t b = base + (uint32_t)(k / QK) * BS;
        const int o = k % QK;
        const float d = f16_bits_f32(sm_word(s, b));
        uint32_t w[2];
        sm_words<2>(s, b + 2 + o, w);
        w[0] ^= 0x80808080u, w[1] ^= 0x80808080u; /* int8 q -> q + 128 */
#pragma unroll
        for (int t = 0; t < 8; t++)
            v[t] = byte_f32(w, t, 128.0f) * d; /* (float)q * d */
    }
};

struct fmt_q4_0 {
    static constexpr int QK = 32, BS = 18, PARTS = 1, TB = 128;
    static constexpr bool FLOAT_X = false;

    template <int M, int R>
    static __device__ __forceinline__ void dot(const uint32_t *s, uint32_t off, int part,
                                               int64_t blk, const mmv_rows<M, R> &r, float *acc)
    {
        (void)part;
        const float d = f16_bits_f32(sm_word<R>(s, off));
        uint32_t q[4], lo[4], hi[4];
        sm_words<4, R>(s, off + 2, q);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            lo[k] = q[k] & 0x0F0F0F0Fu;        /* elements 4k..4k+3 */
            hi[k] = (q[k] >> 4) & 0x0F0F0F0Fu; /* elements 16+4k.. */
        }
#pragma unroll
        for (int j = 0; j < M; j++) {
            if (r.stop(j))
                break;
            const int4 *xp = (const int4 *)(r.qs + r.row(j) * r.n_in + blk * QK);
            const int sum = dp4a_16<R>(hi, mmv_x<R>(xp + 1), dp4a_16<R>(lo, mmv_x<R>(xp), 0));
            const float2 dx = mmv_x<R>(r.ds + r.row(j) * (r.n_in / 32) + blk);
            acc[j] += d * (dx.x * (float)sum - 8.0f * dx.y);
        }
    }

    static __device__ __forceinline__ void dequant8(const uint32_t *s, uint32_t base, int k,
                                                    int n_left, float *v)
    {
        (void)n_left;
        const uint32_t b = base + (uint32_t)(k / QK) * BS;
        const int o = k % QK;
        const float d = f16_bits_f32(sm_word(s, b));
        uint32_t w[2];
        sm_words<2>(s, b + 2 + (o & 15), w);
        const int shift = o < 16 ? 0 : 4;
        w[0] = (w[0] >> shift) & 0x0F0F0F0Fu, w[1] = (w[1] >> shift) & 0x0F0F0F0Fu;
#pragma unroll
        for (int t = 0; t < 8; t++)
            v[t] = d * byte_f32(w, t, 8.0f); /* d * (float)(q - 8) */
    }
};

struct fmt_mxfp4 {
    static constexpr int QK = 32, BS = 17, PARTS = 1, TB = 128;
    static constexpr bool FLOAT_X = false;

    template <int M, int R>
    static __device__ __forceinline__ void dot(const uint32_t *s, uint32_t off, int part,
                                               int64_t blk, const mmv_rows<M, R> &r, float *acc)
    {
        (void)part;
        const float d = mxfp4_half_scale(sm_word<R>(s, off) & 0xFF);
        uint32_t q[4], va[4], vb[4];
        sm_words<4, R>(s, off + 1, q);
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
            if (r.stop(j))
                break;
            const int4 *xp = (const int4 *)(r.qs + r.row(j) * r.n_in + blk * QK);
            const int4 x0 = mmv_x<R>(xp), x1 = mmv_x<R>(xp + 1);
            const uint32_t xl[4] = {(uint32_t)x0.x, (uint32_t)x0.y, (uint32_t)x0.z, (uint32_t)x0.w};
            const uint32_t xh[4] = {(uint32_t)x1.x, (uint32_t)x1.y, (uint32_t)x1.z, (uint32_t)x1.w};
            int sum = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                sum = mm_dp4a<R>((int)va[i], (int)__byte_perm(xl[i], xh[i], 0x5140), sum);
                sum = mm_dp4a<R>((int)vb[i], (int)__byte_perm(xl[i], xh[i], 0x7362), sum);
            }
            const float2 dx = mmv_x<R>(r.ds + r.row(j) * (r.n_in / 32) + blk);
            acc[j] += d * dx.x * (float)sum;
        }
    }

    static __device__ __forceinline__ void dequant8(const uint32_t *s, uint32_t base, int k,
                                                    int n_left, float *v)
    {
        (void)n_left;
        const uint32_t b = base + (uint32_t)(k / QK) * BS;
        const int o = k % QK;
        const float d = mxfp4_half_scale(sm_word(s, b) & 0xFF);
        uint32_t w[2];
        sm_words<2>(s, b + 1 + (o & 15), w);
        const int shift = o < 16 ? 0 : 4;
        uint32_t q[2]; /* 128 + the signed doubled E2M1 value (-12 .. 12), one byte each */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            /* a selector nibble per code: codes 0, 1 (then 2, 3) land in bytes 0 and 2 */
            const uint32_t c = (w[i] >> shift) & 0x07070707u;
            const uint32_t lo = __byte_perm(0x03020100u, 0x0C080604u, c);
            const uint32_t hi = __byte_perm(0x03020100u, 0x0C080604u, c >> 16);
            const uint32_t mag = __byte_perm(lo, hi, 0x6420u); /* 0 1 2 3 4 6 8 12 */
            const uint32_t neg = ((w[i] >> shift) >> 3 & 0x01010101u) * 0xFFu;
            q[i] = 0x80808080u + (mag & ~neg) - (mag & neg); /* no byte carries or borrows */
        }
#pragma unroll
        for (int t = 0; t < 8; t++)
            v[t] = d * byte_f32(q, t, 128.0f); /* d * (float)(code & 8 ? -mag : mag) */
    }
};

/* Q4_K and Q5_K: part c (0..3) is the 64 elements of sub-blocks 2c and 2c+1, whose low 4 bits
 * are the low and high nibbles of qs[32c .. 32c+31]. */
template <bool Q5> struct fmt_qk45 {
    static constexpr int QK = 256, BS = Q5 ? 176 : 144, PARTS = 4, TB = 16;
    static constexpr int QS = Q5 ? 48 : 16; /* offset of qs[128] */
    static constexpr bool FLOAT_X = false;

    template <int M, int R>
    static __device__ __forceinline__ void dot(const uint32_t *s, uint32_t off, int part,
                                               int64_t blk, const mmv_rows<M, R> &r, float *acc)
    {
        const uint32_t dm = sm_word<R>(s, off);
        const float d = f16_bits_f32(dm), dmin = f16_bits_f32(dm >> 16);
        uint32_t sw[3], q[8], va[8], vb[8];
        sm_words<3, R>(s, off + 4, sw);
        int sc0, m0, sc1, m1;
        k4_scale_min(sw, 2 * part, &sc0, &m0);
        k4_scale_min(sw, 2 * part + 1, &sc1, &m1);
        sm_words<8, R>(s, off + QS + 32 * part, q);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            va[k] = q[k] & 0x0F0F0F0Fu;
            vb[k] = (q[k] >> 4) & 0x0F0F0F0Fu;
        }
        if constexpr (Q5) {
            uint32_t h[8];
            /* qh[l]: bit j is the 5th bit of element l of sub-block j */
            sm_words<8, R>(s, off + 16, h);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                va[k] |= ((h[k] >> (2 * part)) & 0x01010101u) << 4;
                vb[k] |= ((h[k] >> (2 * part + 1)) & 0x01010101u) << 4;
            }
        }
        const int64_t e = blk * QK + 64 * part; /* first element of the part */
#pragma unroll
        for (int j = 0; j < M; j++) {
            if (r.stop(j))
                break;
            const int4 *xp = (const int4 *)(r.qs + r.row(j) * r.n_in + e);
            int sa = dp4a_16<R>(va, mmv_x<R>(xp), 0);
            sa = dp4a_16<R>(va + 4, mmv_x<R>(xp + 1), sa);
            int sb = dp4a_16<R>(vb, mmv_x<R>(xp + 2), 0);
            sb = dp4a_16<R>(vb + 4, mmv_x<R>(xp + 3), sb);
            const float2 *dp = r.ds + r.row(j) * (r.n_in / 32) + e / 32;
            const float2 da = mmv_x<R>(dp), db = mmv_x<R>(dp + 1);
            acc[j] += d * (da.x * (float)(sc0 * sa) + db.x * (float)(sc1 * sb)) -
                      dmin * ((float)m0 * da.y + (float)m1 * db.y);
        }
    }

    static __device__ __forceinline__ void dequant8(const uint32_t *s, uint32_t base, int k,
                                                    int n_left, float *v)
    {
        (void)n_left;
        const uint32_t b = base + (uint32_t)(k / QK) * BS;
        const int o = k % QK, j = o / 32, l0 = o % 32;
        uint32_t hd[4], qs[2];
        sm_words<4>(s, b, hd); /* d, dmin, scales[12] */
        const float d = f16_bits_f32(hd[0]), dmin = f16_bits_f32(hd[0] >> 16);
        int sc, m;
        k4_scale_min(hd + 1, j, &sc, &m);
        const float dl = __fmul_rn(d, (float)sc), ml = __fmul_rn(dmin, (float)m);
        sm_words<2>(s, b + QS + 32 * (j / 2) + l0, qs);
        const int shift = 4 * (j & 1);
        uint32_t q[2] = {(qs[0] >> shift) & 0x0F0F0F0Fu, (qs[1] >> shift) & 0x0F0F0F0Fu};
        if constexpr (Q5) {
            uint32_t qh[2];
            sm_words<2>(s, b + 16 + l0, qh);
            q[0] |= ((qh[0] >> j) & 0x01010101u) << 4;
            q[1] |= ((qh[1] >> j) & 0x01010101u) << 4;
        }
#pragma unroll
        for (int t = 0; t < 8; t++)
            v[t] = __fsub_rn(__fmul_rn(dl, byte_f32(q, t, 0.0f)), ml);
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

    template <int M, int R>
    static __device__ __forceinline__ void dot(const uint32_t *s, uint32_t off, int part,
                                               int64_t blk, const mmv_rows<M, R> &r, float *acc)
    {
        const int h = part >> 1, lh = part & 1;
        uint32_t a[4], b[4], hb[4], sw[2];
        sm_words<4, R>(s, off + 64 * h + 16 * lh, a);      /* ql, groups s = 0 and 2 */
        sm_words<4, R>(s, off + 64 * h + 32 + 16 * lh, b); /* ql, groups s = 1 and 3 */
        sm_words<4, R>(s, off + 128 + 32 * h + 16 * lh, hb);
        sm_words<2, R>(s, off + 192 + 8 * h, sw); /* scales[8h .. 8h+7] */
        const float d = f16_bits_f32(sm_word<R>(s, off + 208));
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
            if (r.stop(j))
                break;
            const int8_t *xr = r.qs + r.row(j) * r.n_in + e;
            const float2 *dp = r.ds + r.row(j) * (r.n_in / 32) + (blk * QK + 128 * h) / 32;
            float sum = 0.0f;
#pragma unroll
            for (int g = 0; g < 4; g++) {
                const int si = dp4a_16<R>(v[g], mmv_x<R>((const int4 *)(xr + 32 * g)), 0);
                sum += sc[g] * mmv_x<R>(dp + g).x * (float)si;
            }
            acc[j] += d * sum;
        }
    }

    static __device__ __forceinline__ void dequant8(const uint32_t *s, uint32_t base, int k,
                                                    int n_left, float *v)
    {
        (void)n_left;
        const uint32_t b = base + (uint32_t)(k / QK) * BS;
        const int o = k % QK, h = o / 128, g = (o / 32) % 4, l0 = o % 32;
        uint32_t ql[2], qh[2];
        sm_words<2>(s, b + 64 * h + 32 * (g % 2) + l0, ql);
        sm_words<2>(s, b + 128 + 32 * h + l0, qh);
        const float d = f16_bits_f32(sm_word(s, b + 208));
        const float dl = __fmul_rn(d, (float)(int8_t)(sm_word(s, b + 192 + o / 16) & 0xFF));
        const int shift = 4 * (g / 2);
        uint32_t q[2]; /* low 4 bits | high 2 bits << 4, per byte */
#pragma unroll
        for (int i = 0; i < 2; i++)
            q[i] = ((ql[i] >> shift) & 0x0F0F0F0Fu) | (((qh[i] >> (2 * g)) & 0x03030303u) << 4);
#pragma unroll
        for (int t = 0; t < 8; t++)
            v[t] = __fmul_rn(dl, byte_f32(q, t, 32.0f)); /* dl * (float)(q - 32) */
    }
};

/* Dot of 8 float weights with elements e..e+7 of each activation row (fewer at the row end). */
template <int M, int R>
__device__ __forceinline__ void mmv_float_dot(const float *wf, int64_t e, const mmv_rows<M, R> &r,
                                              float *acc)
{
    const int64_t left = r.n_in - e;
#pragma unroll
    for (int j = 0; j < M; j++) {
        if (r.stop(j))
            break;
        const float *xp = r.x[j] + e;
        if (left >= 8 && ((uintptr_t)xp & 15) == 0) { /* two 16-byte loads, the same sums */
            const float4 a = mmv_x<R>((const float4 *)xp), b = mmv_x<R>((const float4 *)xp + 1);
            const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 8; i++)
                acc[j] = fmaf(wf[i], xv[i], acc[j]);
        } else if (left >= 8) {
#pragma unroll
            for (int i = 0; i < 8; i++)
                acc[j] = fmaf(wf[i], mmv_x<R>(xp + i), acc[j]);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++)
                if (i < left)
                    acc[j] = fmaf(wf[i], mmv_x<R>(xp + i), acc[j]);
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

    template <int M, int R>
    static __device__ __forceinline__ void dot(const uint32_t *s, uint32_t off, int part,
                                               int64_t blk, const mmv_rows<M, R> &r, float *acc)
    {
        const int64_t e = blk * QK + 8 * part;
        if (e >= r.n_in)
            return;
        uint32_t w[2 * ES];
        sm_words<2 * ES, R>(s, off + 8 * ES * part, w);
        float wf[8];
#pragma unroll
        for (int i = 0; i < 8; i++)
            wf[i] = elem(w, i);
        mmv_float_dot(wf, e, r, acc);
    }

    static __device__ __forceinline__ void dequant8(const uint32_t *s, uint32_t base, int k,
                                                    int n_left, float *v)
    {
        const uint32_t p = base + (uint32_t)k * ES;
        if (k + 8 <= n_left) {
            uint32_t w[2 * ES];
            sm_words<2 * ES>(s, p, w);
#pragma unroll
            for (int i = 0; i < 8; i++)
                v[i] = elem(w, i);
            return;
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            v[i] = 0.0f;
            if (k + i < n_left)
                v[i] = from_bits(sm_word(s, p + (uint32_t)(ES * i))); /* from_bits masks */
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
    const float *bias; /* (n_out) or NULL: added to each sum where y is written */
    int early;         /* the first weight tile staged before the wait (ops_early) */
    /* rows n_out .. of the launch: the further matrices of a call (cuda_matmul_args.more), the
     * matrix i + 1 from row seg_end[i] on; n_out is then the row count of them all */
    int n_seg;
    int64_t seg_end[CUDA_MATMUL_MAX_MORE];
    struct {
        const uint8_t *w;
        size_t w_stride;
        uintptr_t w_lo, w_hi;
        float *y;
        int64_t y_stride;
        const float *bias;
    } seg[CUDA_MATMUL_MAX_MORE];
};

/* Words of one tile buffer: the granules of a tile that starts at any alignment, plus the
 * word sm_words reads past the last byte, rounded to 16 bytes. */
template <typename F> constexpr int mmv_tile_words = ((F::TB * F::BS + 32) / 4 + 4 + 3) / 4 * 4;

/* One-row MMV launches (decode): registers held to what MMV_MIN_BLOCKS blocks per SM allow where
 * their shared memory does too (the H100/H200's 228 KiB, 1 KiB reserved per block), so that a
 * matrix of up to 132 x 10 x 4 rows (q, k and v of the 30b-a3b preset: 5120) runs in one wave
 * instead of 9 blocks per SM and a second wave for the last 92 blocks; elsewhere no bound. */
template <typename F>
constexpr int mmv_min_blocks = (MMV_WARPS * 2 * mmv_tile_words<F> * 4 + 1024) * MMV_MIN_BLOCKS <=
                                       228 * 1024
                                   ? MMV_MIN_BLOCKS
                                   : 1;

/* Where row `row` of an MMV launch lives: its matrix (the call's first or one of its further
 * matrices), the row inside that matrix, and its output. */
struct mmv_dst {
    const uint8_t *w0;
    size_t w_stride;
    uintptr_t w_lo, w_hi;
    float *y;
    int64_t y_stride;
    const float *bias;
    int64_t orow;
};

__device__ __forceinline__ mmv_dst mmv_dst_of(const mmv_params &p, int64_t row)
{
    mmv_dst d = {p.w, p.w_stride, p.w_lo, p.w_hi, p.y, p.y_stride, p.bias, row};
    if (p.n_seg && row >= p.seg_end[0]) {
        const int sg = p.n_seg > 1 && row >= p.seg_end[1] ? 1 : 0;
        d.orow = sg ? row - p.seg_end[1] : row - p.seg_end[0];
        d.w0 = p.seg[sg].w;
        d.w_stride = p.seg[sg].w_stride;
        d.w_lo = p.seg[sg].w_lo;
        d.w_hi = p.seg[sg].w_hi;
        d.y = p.seg[sg].y;
        d.y_stride = p.seg[sg].y_stride;
        d.bias = p.seg[sg].bias;
    }
    return d;
}

/* KS = 1: one warp per R rows (neighbours), the kernel synchronizes nothing wider than a warp.
 * KS = MMV_WARPS (at most 256 rows: too few warps to keep the loads in flight; R = 1): the
 * block's warps share one row, warp w taking tiles w, w + KS, ..., and their sums are added in
 * warp order. With R > 1 a lane applies each activation unit it loads to the R rows' blocks
 * (the loads are the same for every row, so the compiler keeps one copy): R times fewer
 * activation loads per weight byte, which is what an M-row launch spends its time on. Each
 * row's sum is the R = 1 kernel's (lane q takes the same parts in the same order, the same warp
 * reduction): the same bits. */
template <typename F, int M, int KS, int R = 1>
__global__ void __launch_bounds__(MMV_THREADS, M == 1 && KS == 1 && R == 1 ? mmv_min_blocks<F>
                                               : M == 1 && R > 1           ? 6
                                               : R > 1                     ? 4
                                                       : 1) mmv_kernel(const mmv_params p)
{
    static_assert(KS == 1 || R == 1, "rows per warp only with one warp per row");
    __shared__ __align__(16) uint32_t tiles[MMV_WARPS][R][2][mmv_tile_words<F>];
    __shared__ float red[KS > 1 ? KS : 1][M];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int64_t row0 =
        KS > 1 ? (int64_t)blockIdx.x : ((int64_t)blockIdx.x * MMV_WARPS + warp) * R;
    const int kw = KS > 1 ? warp : 0; /* this warp's first tile */
    if (row0 >= p.n_out) {
        ops_pdl_begin();
        return; /* whole warps (KS = 1) or whole blocks (KS > 1) */
    }

    /* the matrix each row belongs to (a call with further matrices); rows past the end repeat
     * the last one and store nothing */
    mmv_dst d[R];
    const uint8_t *wrow[R];
#pragma unroll
    for (int i = 0; i < R; i++) {
        d[i] = mmv_dst_of(p, min(row0 + i, p.n_out - 1));
        wrow[i] = d[i].w0 + d[i].orow * d[i].w_stride;
    }

    /* the rows' weights on their way to L2 while the kernel before this one finishes (a
     * programmatic launch: cuda_ops_util.cuh); only x and y are shared with other kernels */
    if (lane == 0 && kw == 0 && blockIdx.y == 0)
#pragma unroll
        for (int i = 0; i < R; i++)
            ops_l2_prefetch((const void *)max((uintptr_t)wrow[i], d[i].w_lo),
                            (const void *)min((uintptr_t)wrow[i] + p.row_bytes, d[i].w_hi));
    /* ... and the warp's first tile on its way into shared memory (a whole row of the
     * 8-bit types at 2048 inputs), so that after the wait only x is still to come */
    const int64_t nblk = (p.n_in + F::QK - 1) / F::QK;
    const int ntile = (int)((nblk + F::TB - 1) / F::TB);
    const int64_t tile_bytes = (int64_t)F::TB * F::BS;
    for (int pass = p.early ? 0 : 1; pass < 2; pass++) { /* pass 1: after the wait */
        if (pass == 1)
            ops_pdl_begin();
        if (pass == (p.early ? 0 : 1)) {
            if (kw < ntile) {
                const int64_t b0 = (int64_t)kw * tile_bytes;
#pragma unroll
                for (int i = 0; i < R; i++)
                    tile_stage(tiles[warp][i][0], wrow[i] + b0,
                               wrow[i] + min(b0 + tile_bytes, (int64_t)p.row_bytes), d[i].w_lo,
                               d[i].w_hi, lane);
            }
            cp_async_commit();
        }
    }

    const int j0 = blockIdx.y * MMV_MAX_M;
    mmv_rows<M, R> r;
    r.n_in = p.n_in;
    r.mq = min(M, p.m - j0);
    if constexpr (F::FLOAT_X) {
        r.qs = nullptr;
        r.ds = nullptr;
#pragma unroll
        for (int j = 0; j < M; j++) {
            const int jj = j0 + min(j, r.mq - 1);
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

    float acc[R][M];
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int j = 0; j < M; j++)
            acc[i][j] = 0.0f;

    for (int t = kw, it = 0; t < ntile; t += KS, it++) {
        if (t + KS < ntile) {
            const int64_t b0 = (int64_t)(t + KS) * tile_bytes;
#pragma unroll
            for (int i = 0; i < R; i++)
                tile_stage(tiles[warp][i][(it + 1) & 1], wrow[i] + b0,
                           wrow[i] + min(b0 + tile_bytes, (int64_t)p.row_bytes), d[i].w_lo,
                           d[i].w_hi, lane);
        }
        cp_async_commit(); /* possibly empty: keeps "all but the newest group" = tile t */
        cp_async_wait<1>();
        __syncwarp();

        const int64_t tb0 = (int64_t)t * F::TB;
        uint32_t shift[R];
#pragma unroll
        for (int i = 0; i < R; i++)
            shift[i] = (uint32_t)((uintptr_t)(wrow[i] + tb0 * F::BS) & 15);
        const int nparts = (int)min((int64_t)F::TB, nblk - tb0) * F::PARTS;
        for (int q = lane; q < nparts; q += WARP) {
            const int blk = q / F::PARTS, part = q % F::PARTS;
#pragma unroll
            for (int i = 0; i < R; i++)
                F::template dot<M>(tiles[warp][i][it & 1], shift[i] + (uint32_t)(blk * F::BS), part,
                                   tb0 + blk, r, acc[i]);
        }
        __syncwarp(); /* the buffer is refilled by the next iteration's tile_stage */
    }

#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int j = 0; j < M; j++)
#pragma unroll
            for (int o = WARP / 2; o > 0; o >>= 1)
                acc[i][j] += __shfl_xor_sync(FULL_MASK, acc[i][j], o);
    if constexpr (KS > 1) {
        if (lane == 0)
#pragma unroll
            for (int j = 0; j < M; j++)
                red[warp][j] = acc[0][j];
        __syncthreads();
        if (warp != 0)
            return;
#pragma unroll
        for (int j = 0; j < M; j++) {
            acc[0][j] = red[0][j];
#pragma unroll
            for (int w = 1; w < KS; w++)
                acc[0][j] += red[w][j];
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < R; i++) {
            if (row0 + i >= p.n_out)
                break;
            const float b = d[i].bias ? d[i].bias[d[i].orow] : 0.0f;
#pragma unroll
            for (int j = 0; j < M; j++)
                if (j < r.mq)
                    d[i].y[(int64_t)(j0 + j) * d[i].y_stride + d[i].orow] =
                        d[i].bias ? __fadd_rn(acc[i][j], b) : acc[i][j];
        }
    }
}

/* One-row MMV of a large matrix whose rows take at most half a tile each, stored back to back
 * (the K-quant output heads at 2048 inputs): warp w of block b takes the MMV_PACK rows from
 * MMV_PACK (MMV_WARPS b + w), staged two to a tile buffer, all at once, so that four rows are
 * in flight per warp where mmv_kernel has one and a call has a quarter of its blocks. Each
 * row's sum is mmv_kernel's (lane q takes part q, the same warp reduction): the same bits. */
template <typename F>
__global__ void __launch_bounds__(MMV_THREADS, mmv_min_blocks<F>)
    mmv_pack_kernel(const mmv_params p)
{
    static_assert(MMV_PACK == 4, "two rows in each of the two tile buffers");
    __shared__ __align__(16) uint32_t tiles[MMV_WARPS][2][mmv_tile_words<F>];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int64_t r0 = ((int64_t)blockIdx.x * MMV_WARPS + warp) * MMV_PACK;
    if (r0 >= p.n_out) {
        ops_pdl_begin();
        return; /* whole warps */
    }
    for (int pass = p.early ? 0 : 1; pass < 2; pass++) { /* pass 1: after the wait */
        if (pass == 1)
            ops_pdl_begin();
        if (pass == (p.early ? 0 : 1)) {
            for (int b = 0; b < 2; b++) {
                const int64_t ra = r0 + 2 * b;
                if (ra < p.n_out) {
                    const uint8_t *src = p.w + ra * (int64_t)p.row_bytes;
                    const int64_t nr = min((int64_t)2, p.n_out - ra);
                    tile_stage(tiles[warp][b], src, src + nr * (int64_t)p.row_bytes, p.w_lo, p.w_hi,
                               lane);
                }
            }
            cp_async_commit();
        }
    }
    mmv_rows<1> r;
    r.n_in = p.n_in;
    r.mq = 1;
    r.qs = p.xq;
    r.ds = p.xds;
    r.x[0] = nullptr;
    cp_async_wait<0>();
    __syncwarp();
    const int nparts = (int)((p.n_in + F::QK - 1) / F::QK) * F::PARTS;
#pragma unroll
    for (int i = 0; i < MMV_PACK; i++) {
        const int64_t row = r0 + i;
        if (row >= p.n_out) /* the same for the whole warp */
            break;
        const uint32_t *s = tiles[warp][i / 2];
        const uintptr_t src = (uintptr_t)(p.w + (r0 + 2 * (i / 2)) * (int64_t)p.row_bytes);
        const uint32_t off = (uint32_t)(src & 15) + (uint32_t)((i & 1) * p.row_bytes);
        float acc[1] = {0.0f};
        for (int q = lane; q < nparts; q += WARP) {
            const int blk = q / F::PARTS, part = q % F::PARTS;
            F::template dot<1>(s, off + (uint32_t)(blk * F::BS), part, blk, r, acc);
        }
#pragma unroll
        for (int o = WARP / 2; o > 0; o >>= 1)
            acc[0] += __shfl_xor_sync(FULL_MASK, acc[0], o);
        if (lane == 0)
            p.y[row] = p.bias ? __fadd_rn(acc[0], p.bias[row]) : acc[0];
    }
}

/* y[j, o] += bias[o] (m rows of y_stride, n_out each): the bias of the paths that do not add it
 * as they write y */
static __global__ void k_matmul_bias(float *y, int64_t y_stride, const float *bias, int m,
                                     int64_t n_out)
{
    ops_pdl_begin();
    const int64_t total = (int64_t)m * n_out;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t j = i / n_out, o = i - j * n_out;
        y[j * y_stride + o] = __fadd_rn(y[j * y_stride + o], bias[o]);
    }
}

static int matmul_bias_launch(const struct cuda_matmul_args *a, cudaStream_t st)
{
    if (!a->bias)
        return 0;
    const int64_t total = (int64_t)a->m * a->n_out;
    const unsigned blocks = (unsigned)(total / 256 + 1 < 4096 ? total / 256 + 1 : 4096);
    ops_launch(k_matmul_bias, blocks, 256, 0, st, a->y, a->y_stride, a->bias, a->m, a->n_out);
    return cuda_last_error("cuda_matmul (bias)");
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
    ops_pdl_begin();
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

constexpr int GTHREADS = 256; /* 8 warps per CTA, for every tile shape */
constexpr int GWARPS = GTHREADS / WARP;
constexpr int GBK = 64;      /* elements of n_in per MMA step */
constexpr int GLD = GBK + 8; /* bf16 row of a step tile, padded to 144 bytes: the 8 rows one
                              * ldmatrix reads fall on distinct banks */

/* The output tile of a CTA: BM rows of x by BN rows of W. The 8 warps form a WARPS_M x WARPS_N
 * grid, each owning WTM x WTN outputs as FM x FN fragments of mma.m16n8k16. NS raw weight
 * stages are in the shared ring; MINB is the CTAs per SM the registers are budgeted for. Per
 * step a thread loads XI float4 of activations and decodes WI groups of 8 weights. */
template <int BM_, int BN_, int WARPS_M_, int NS_, int MINB_> struct gemm_tile {
    static constexpr int BM = BM_, BN = BN_, NS = NS_, MINB = MINB_;
    static constexpr int WARPS_M = WARPS_M_, WARPS_N = GWARPS / WARPS_M_;
    static constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N, FM = WTM / 16, FN = WTN / 8;
    static constexpr int XI = BM * (GBK / 4) / GTHREADS;
    static constexpr int WI = BN * (GBK / 8) / GTHREADS;
    static_assert(WTM % 16 == 0 && WTN % 16 == 0 && XI >= 1 && WI >= 1 && NS >= 2, "tile");
};
using gemm_tile_128x128 = gemm_tile<128, 128, 2, 3, 1>; /* warps 64 x 32 */
using gemm_tile_64x128 = gemm_tile<64, 128, 2, 3, 1>;   /* warps 32 x 32 */
using gemm_tile_64x64 = gemm_tile<64, 64, 2, 3, 2>;     /* warps 32 x 16 */
using gemm_tile_32x64 = gemm_tile<32, 64, 2, 3, 2>;     /* warps 16 x 16 */

/* The raw stage of a format: GK elements of every row of the tile (whole blocks: one K-quant
 * block, 8 blocks of 32, 128 float elements), SB bytes of a row when full, RB bytes of a row's
 * slot (the 16-byte granules covering SB bytes at any alignment, plus the word sm_words reads
 * past the last byte), NG granules per slot. */
template <typename F> struct gemm_stage {
    static constexpr int GK = F::FLOAT_X ? 128 : 256;
    static constexpr int SUB = GK / GBK; /* MMA steps per stage */
    static constexpr int SB = GK / F::QK * F::BS;
    static constexpr int RB = (SB + 15 + 8 + 15) / 16 * 16;
    static constexpr int NG = RB / 16;
    static_assert(GK % F::QK == 0 && GK % GBK == 0, "stage");
};

/* Dynamic shared memory of gemm_kernel<F, T>: the raw ring, then two bf16 step tiles of x and
 * two of W (128-byte aligned). */
template <typename F, typename T>
constexpr size_t gemm_raw_bytes = ((size_t)T::NS * T::BN * gemm_stage<F>::RB + 127) / 128 * 128;
template <typename F, typename T>
constexpr size_t gemm_smem_bytes = gemm_raw_bytes<F, T> +
                                   (size_t)2 * (T::BM + T::BN) * GLD * sizeof(__nv_bfloat16);

struct gemm_params {
    const uint8_t *w; /* (n_out rows of w_stride bytes) */
    size_t w_stride;
    size_t row_bytes;     /* bytes of the n_in elements of a row */
    uintptr_t w_lo, w_hi; /* the matrix bytes: [w, w + (n_out-1)*w_stride + row_bytes) */
    int64_t n_in, n_out;
    int m;
    const float *x; /* (rows of x_stride), 4-byte aligned */
    int64_t x_stride;
    const int32_t *x_rows; /* (m) or NULL */
    float *y;              /* (m rows of y_stride) */
    int64_t y_stride;
};

__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *(const uint32_t *)&h;
}

/* Eight consecutive bf16 values as 16 bytes (for one 16-byte shared store). */
__device__ __forceinline__ uint4 pack_bf16x8(const float *v)
{
    return make_uint4(bf16x2_bits(v[0], v[1]), bf16x2_bits(v[2], v[3]), bf16x2_bits(v[4], v[5]),
                      bf16x2_bits(v[6], v[7]));
}

/* The four 8 x 8 b16 matrices whose rows lanes 0-7, 8-15, 16-23 and 24-31 point at (16-byte
 * aligned shared addresses); r[i] is lane's (row lane/4, columns 2(lane%4), +1) of matrix i. */
__device__ __forceinline__ void ldmatrix_x4(uint32_t *r, const void *row)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

/* c (16 x 8, float) += a (16 x 16, bf16, row-major) b (16 x 8, bf16, column-major), in the PTX
 * fragment layouts of mma.m16n8k16. */
__device__ __forceinline__ void mma_bf16_16816(float *c, const uint32_t *a, const uint32_t *b)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Starts the copy of raw stage s (elements s*GK ..) of the BN weight rows n0.. into dst: row
 * r's bytes [s*SB, min((s+1)*SB, row_bytes)) go to slot r (dst + r*RB), the byte at address A
 * to offset A - ((row + s*SB) & ~15) (granule_copy). Rows past n_out are left alone. */
template <typename F, typename T>
__device__ __forceinline__ void gemm_stage_w(uint8_t *dst, const gemm_params &p, int64_t n0, int s,
                                             int tid)
{
    using S = gemm_stage<F>;
    constexpr int N = T::BN * S::NG;
    const size_t sb = (size_t)s * S::SB;
    const size_t se = sb + S::SB < p.row_bytes ? sb + S::SB : p.row_bytes;
#pragma unroll
    for (int i = 0; i < (N + GTHREADS - 1) / GTHREADS; i++) {
        const int q = tid + GTHREADS * i, r = q / S::NG, k = q % S::NG;
        if (q >= N || n0 + r >= p.n_out)
            continue;
        const uintptr_t row = (uintptr_t)p.w + (uintptr_t)(n0 + r) * p.w_stride;
        const uintptr_t src = ((row + sb) & ~(uintptr_t)15) + 16 * (uintptr_t)k;
        if (src < row + se)
            granule_copy(dst + r * S::RB + 16 * k, src, p.w_lo, p.w_hi);
    }
}

/* Issues the loads of this thread's activations of the step at k0: XI float4 of rows
 * tid/16 + 16i, elements k0 + 4(tid%16) .. +3; zero past n_in and for rows past m (null).
 * Rows whose address is not 16-byte aligned (any x_stride is allowed) load floats. */
template <typename T>
__device__ __forceinline__ void gemm_load_x(const float *const *xr, int64_t k0, int64_t n_in,
                                            float4 *xv, int tid)
{
    const int64_t k = k0 + 4 * (tid % 16);
#pragma unroll
    for (int i = 0; i < T::XI; i++) {
        const float *r = xr[i];
        if (r && k + 4 <= n_in && ((uintptr_t)r & 15) == 0) {
            xv[i] = __ldg((const float4 *)(r + k));
        } else {
            float t[4];
#pragma unroll
            for (int e = 0; e < 4; e++)
                t[e] = r && k + e < n_in ? __ldg(r + k + e) : 0.0f;
            xv[i] = make_float4(t[0], t[1], t[2], t[3]);
        }
    }
}

/* The activations loaded by gemm_load_x, rounded to bf16, into the step tile as (BM x GLD). */
template <typename T>
__device__ __forceinline__ void gemm_store_x(__nv_bfloat16 *as, const float4 *xv, int tid)
{
#pragma unroll
    for (int i = 0; i < T::XI; i++) {
        const int r = tid / 16 + 16 * i, c = 4 * (tid % 16);
        *(uint2 *)&as[r * GLD + c] =
            make_uint2(bf16x2_bits(xv[i].x, xv[i].y), bf16x2_bits(xv[i].z, xv[i].w));
    }
}

/* Decodes step j of raw stage s (slots in raw) into the step tile bs (BN x GLD): this thread's
 * WI groups of 8 weights, rows tid/8 + 32i, elements 8(tid%8) ..; zero past n_in and for rows
 * past n_out. wsh[i]: the row's address & 15. */
template <typename F, typename T>
__device__ __forceinline__ void gemm_decode_w(__nv_bfloat16 *bs, const uint8_t *raw,
                                              const uint32_t *wsh, const gemm_params &p, int64_t n0,
                                              int s, int j, int tid)
{
    using S = gemm_stage<F>;
    const int64_t k0 = (int64_t)s * S::GK; /* first element of the stage */
    const int n_left = (int)(p.n_in - k0);
    const int kl = j * GBK + 8 * (tid % 8); /* element within the stage */
#pragma unroll
    for (int i = 0; i < T::WI; i++) {
        const int r = tid / 8 + 32 * i;
        float v[8];
        if (n0 + r < p.n_out && kl < n_left) {
            const uint32_t base = (wsh[i] + (uint32_t)s * (uint32_t)S::SB) & 15;
            F::dequant8((const uint32_t *)(raw + r * S::RB), base, kl, n_left, v);
        } else {
#pragma unroll
            for (int t = 0; t < 8; t++)
                v[t] = 0.0f;
        }
        *(uint4 *)&bs[r * GLD + kl - j * GBK] = pack_bf16x8(v);
    }
}

/* acc += the warp's block of as (BM x GLD) times bs (BN x GLD) transposed over one step. The A
 * fragment of rows 16mi.. comes from one ldmatrix (lanes 0-15 rows at column 0, 16-31 at
 * column 8); the B fragments of columns 16q.. (two n8 fragments) from another (lanes 0-7 and
 * 8-15 rows 16q.. at columns 0 and 8, lanes 16-31 the same for rows 16q + 8..). */
template <typename T>
__device__ __forceinline__ void gemm_mma(const __nv_bfloat16 *as, const __nv_bfloat16 *bs,
                                         float (&acc)[T::FM][T::FN][4], int wm, int wn, int lane)
{
#pragma unroll
    for (int kk = 0; kk < GBK; kk += 16) {
        uint32_t a[T::FM][4], b[T::FN][2];
#pragma unroll
        for (int mi = 0; mi < T::FM; mi++)
            ldmatrix_x4(a[mi],
                        as + (wm * T::WTM + 16 * mi + lane % 16) * GLD + kk + 8 * (lane / 16));
#pragma unroll
        for (int q = 0; q < T::FN / 2; q++) {
            uint32_t r[4];
            ldmatrix_x4(r, bs + (wn * T::WTN + 16 * q + 8 * (lane / 16) + lane % 8) * GLD + kk +
                               8 * ((lane / 8) % 2));
            b[2 * q][0] = r[0], b[2 * q][1] = r[1];
            b[2 * q + 1][0] = r[2], b[2 * q + 1][1] = r[3];
        }
#pragma unroll
        for (int mi = 0; mi < T::FM; mi++)
#pragma unroll
            for (int ni = 0; ni < T::FN; ni++)
                mma_bf16_16816(acc[mi][ni], a[mi], b[ni]);
    }
}

/* y tile (m0 .. m0+BM, n0 .. n0+BN). Weights go through a ring of NS raw stages (cp.async of
 * the row bytes, one stage = SUB steps of GBK elements); each step decodes its slice of the
 * current stage to bf16, converts the activations loaded during the previous step, and runs
 * the MMAs; the step tiles are double-buffered, so one barrier per step separates writing tile
 * kb & 1 from reading it, and the writes of step kb + 2 from the reads of step kb. */
template <typename F, typename T>
__global__ void __launch_bounds__(GTHREADS, T::MINB) gemm_kernel(const gemm_params p)
{
    ops_pdl_wait();
    using S = gemm_stage<F>;
    extern __shared__ __align__(128) uint8_t gemm_smem[];
    uint8_t *raw = gemm_smem; /* NS stages of BN slots of RB bytes */
    __nv_bfloat16 *as = (__nv_bfloat16 *)(gemm_smem + gemm_raw_bytes<F, T>); /* 2 x (BM, GLD) */
    __nv_bfloat16 *bs = as + 2 * T::BM * GLD;                                /* 2 x (BN, GLD) */

    const int tid = threadIdx.x, warp = tid / WARP, lane = tid % WARP;
    const int wm = warp / T::WARPS_N, wn = warp % T::WARPS_N;
    const int64_t n0 = (int64_t)blockIdx.x * T::BN;
    const int m0 = blockIdx.y * T::BM;
    const int nsub = (int)((p.n_in + GBK - 1) / GBK);
    const int nstage = (int)((p.n_in + S::GK - 1) / S::GK);

    const float *xr[T::XI]; /* this thread's activation rows; null past m */
#pragma unroll
    for (int i = 0; i < T::XI; i++) {
        const int rr = m0 + tid / 16 + 16 * i;
        xr[i] = nullptr;
        if (rr < p.m)
            xr[i] = p.x + (p.x_rows ? (int64_t)__ldg(p.x_rows + rr) : (int64_t)rr) * p.x_stride;
    }
    uint32_t wsh[T::WI]; /* alignment of this thread's decode rows */
#pragma unroll
    for (int i = 0; i < T::WI; i++)
        wsh[i] =
            (uint32_t)(((uintptr_t)p.w + (uintptr_t)(n0 + tid / 8 + 32 * i) * p.w_stride) & 15);

    float acc[T::FM][T::FN][4];
#pragma unroll
    for (int mi = 0; mi < T::FM; mi++)
#pragma unroll
        for (int ni = 0; ni < T::FN; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[mi][ni][e] = 0.0f;

    /* one cp.async group per stage, empty past the last: the group of stage s is the one with
     * NS - 2 younger groups at the start of stage s */
    for (int s = 0; s < T::NS - 1; s++) {
        if (s < nstage)
            gemm_stage_w<F, T>(raw + (size_t)s * T::BN * S::RB, p, n0, s, tid);
        cp_async_commit();
    }
    float4 xv[T::XI];
    gemm_load_x<T>(xr, 0, p.n_in, xv, tid);

    for (int kb = 0; kb < nsub; kb++) {
        const int s = kb / S::SUB, j = kb % S::SUB, buf = kb & 1;
        if (j == 0) {
            cp_async_wait<T::NS - 2>(); /* this thread's copies of stage s */
            __syncthreads();            /* everyone's; and stage s - 1 is decoded */
            const int sn = s + T::NS - 1;
            if (sn < nstage)
                gemm_stage_w<F, T>(raw + (size_t)(sn % T::NS) * T::BN * S::RB, p, n0, sn, tid);
            cp_async_commit();
        }
        __nv_bfloat16 *at = as + buf * T::BM * GLD, *bt = bs + buf * T::BN * GLD;
        gemm_store_x<T>(at, xv, tid);
        if (kb + 1 < nsub)
            gemm_load_x<T>(xr, (int64_t)(kb + 1) * GBK, p.n_in, xv, tid);
        gemm_decode_w<F, T>(bt, raw + (size_t)(s % T::NS) * T::BN * S::RB, wsh, p, n0, s, j, tid);
        __syncthreads();
        gemm_mma<T>(at, bt, acc, wm, wn, lane);
    }
    cp_async_wait<0>(); /* only empty groups are left; none outlives the kernel */

    /* c fragment: lane holds rows g and g + 8, columns 2t and 2t + 1 */
    const int g = lane / 4, t = lane % 4;
    const bool pair = ((uintptr_t)p.y & 7) == 0 && (p.y_stride & 1) == 0;
#pragma unroll
    for (int mi = 0; mi < T::FM; mi++)
#pragma unroll
        for (int ni = 0; ni < T::FN; ni++) {
            const int64_t col = n0 + wn * T::WTN + 8 * ni + 2 * t;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t row = m0 + wm * T::WTM + 16 * mi + g + 8 * h;
                if (row >= p.m || col >= p.n_out)
                    continue;
                float *yp = p.y + row * p.y_stride + col;
                if (pair && col + 1 < p.n_out) {
                    *(float2 *)yp = make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
                } else {
                    yp[0] = acc[mi][ni][2 * h];
                    if (col + 1 < p.n_out)
                        yp[1] = acc[mi][ni][2 * h + 1];
                }
            }
        }
}

} /* namespace */

/* ---- F32 weights, many activation rows ---------------------------------------------------
 * F32 weights stay in float32 (the router, whose choices must not move): with many rows the MMV
 * kernel re-reads 16 activation rows per weight row from L2. Here a block computes a 32 x 32
 * tile of y from 32-wide K slices of x and W in shared memory, each thread 2 x 2 outputs (small
 * tiles, so that the router's 128 outputs still give enough blocks; docs/cuda-matmul.md); every
 * output is one float FMA chain in k order (deterministic, and no rounding beyond float32's).
 * Each thread loads its part of the next slice into registers while the current one is summed,
 * so the loads' latency is not paid once per slice. */

constexpr int SG_T = 32, SG_K = 32;

__global__ void __launch_bounds__(256) sgemm_f32_kernel(const gemm_params p)
{
    ops_pdl_wait();
    __shared__ float xs[SG_K][SG_T + 2]; /* x slice, transposed: xs[k][row] */
    __shared__ float ws[SG_K][SG_T + 2]; /* W slice, transposed: ws[k][out] */
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int64_t n0 = (int64_t)blockIdx.x * SG_T;
    const int m0 = blockIdx.y * SG_T;
    /* loads: thread tid fills (row tid / 8, k 4 (tid % 8) .. + 3) of both slices */
    const int lr = tid / 8, lk = 4 * (tid % 8);
    const int rr = m0 + lr;
    const float *xrow =
        rr < p.m ? p.x + (p.x_rows ? (int64_t)__ldg(p.x_rows + rr) : (int64_t)rr) * p.x_stride
                 : nullptr;
    const float *wrow = n0 + lr < p.n_out ? (const float *)(p.w + (n0 + lr) * p.w_stride) : nullptr;
    float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    float xn[4], wn[4]; /* the next slice's elements, loaded while the current one is summed */
#pragma unroll
    for (int c = 0; c < 4; c++) {
        const int64_t kk = lk + c;
        xn[c] = xrow && kk < p.n_in ? __ldg(xrow + kk) : 0.0f;
        wn[c] = wrow && kk < p.n_in ? __ldg(wrow + kk) : 0.0f;
    }
    for (int64_t k0 = 0; k0 < p.n_in; k0 += SG_K) {
#pragma unroll
        for (int c = 0; c < 4; c++) {
            xs[lk + c][lr] = xn[c];
            ws[lk + c][lr] = wn[c];
        }
        __syncthreads();
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int64_t kk = k0 + SG_K + lk + c;
            xn[c] = xrow && kk < p.n_in ? __ldg(xrow + kk) : 0.0f;
            wn[c] = wrow && kk < p.n_in ? __ldg(wrow + kk) : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < SG_K; k++) {
            const float2 a = *(const float2 *)&xs[k][2 * ty], b = *(const float2 *)&ws[k][2 * tx];
            acc[0][0] = fmaf(a.x, b.x, acc[0][0]);
            acc[0][1] = fmaf(a.x, b.y, acc[0][1]);
            acc[1][0] = fmaf(a.y, b.x, acc[1][0]);
            acc[1][1] = fmaf(a.y, b.y, acc[1][1]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = m0 + 2 * ty + i;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int64_t c = n0 + 2 * tx + j;
            if (r < p.m && c < p.n_out)
                p.y[(int64_t)r * p.y_stride + c] = acc[i][j];
        }
    }
}

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

/* Whether a one-row MMV call takes mmv_pack_kernel: a quantized matrix of at least
 * MMV_PACK_MIN_ROWS rows of at most half a tile, stored back to back, and no further matrices;
 * STRATA_MMV_PACK=0 in the environment turns it off (for comparisons). */
template <typename F> bool mmv_pack_ok(const mmv_params &p)
{
    static int on = -1; /* decided once; a race writes the same value */
    if (on < 0) {
        const char *env = getenv("STRATA_MMV_PACK");
        on = !(env && *env && atoi(env) == 0);
    }
    return on == 1 && p.m == 1 && p.n_seg == 0 && p.n_out >= MMV_PACK_MIN_ROWS &&
           p.w_stride == p.row_bytes && 2 * (int64_t)p.row_bytes <= (int64_t)F::TB * F::BS;
}

/* Weight rows per warp of the MMV launches of 2 to 8 activation rows (lockstep decode steps):
 * 2 for the 32-element block types (Q8_0, Q4_0, MXFP4: two rows' dots fit 128 registers at 8
 * activation rows, four blocks of 128 threads per SM, without spilling; the K-quants spill and
 * the float types' dots branch per row, so their loads would not be shared: mmv_r2), or 1
 * under STRATA_MMV_ROWS=1 in the environment (for comparisons; the same bits either way).
 * Decided once. */
template <typename F>
constexpr int mmv_r2 =
    !F::FLOAT_X && F::QK == 32 &&
            MMV_WARPS * 2 * 2 * mmv_tile_words<F> * 4 + MMV_MAX_M * 4 <= 48 * 1024
        ? 2
        : 1;

/* Weight rows per warp, 1 or 2, the same bits either way: STRATA_MMV_ROWS in the environment
 * for launches of 2 to 8 activation rows (default 2), STRATA_MMV_ROWS1 for one-row launches of
 * the 32-element block types (default 2: a warp's two rows share each activation load and keep
 * two dots in flight, six blocks of 128 threads per SM hold the q/k/v rows of the 30b-a3b
 * preset in one wave; tg128 +2.8% with graphs, bench/cuda-resident.md). Decided once each. */
static int mmv_env_rows(const char *name, int *cached, int dflt)
{
    if (*cached == 0) { /* a race writes the same value */
        const char *env = getenv(name);
        const int v = env && *env ? atoi(env) : dflt;
        *cached = v == 1 || v == 2 ? v : dflt;
    }
    return *cached;
}

static int mmv_rows_per_warp(void)
{
    static int n = 0;
    return mmv_env_rows("STRATA_MMV_ROWS", &n, 2);
}

static int mmv_one_rows_per_warp(void)
{
    static int n = 0;
    return mmv_env_rows("STRATA_MMV_ROWS1", &n, 2);
}

template <typename F> void mmv_launch(const mmv_params &p, cudaStream_t st)
{
    if constexpr (!F::FLOAT_X) {
        if (mmv_pack_ok<F>(p)) {
            const int64_t warps = (p.n_out + MMV_PACK - 1) / MMV_PACK;
            ops_launch(mmv_pack_kernel<F>, dim3((unsigned)((warps + MMV_WARPS - 1) / MMV_WARPS)),
                       MMV_THREADS, 0, st, p);
            return;
        }
    }
    const dim3 grid((unsigned)((p.n_out + MMV_WARPS - 1) / MMV_WARPS),
                    (unsigned)((p.m + MMV_MAX_M - 1) / MMV_MAX_M));
    if (p.n_out <= MMV_SPLIT_MAX_ROWS) { /* few rows (routers): a block per row */
        const dim3 g1((unsigned)p.n_out, grid.y);
        if (p.m == 1)
            ops_launch(mmv_kernel<F, 1, MMV_WARPS>, g1, MMV_THREADS, 0, st, p);
        else if (p.m == 2)
            ops_launch(mmv_kernel<F, 2, MMV_WARPS>, g1, MMV_THREADS, 0, st, p);
        else if (p.m <= 4)
            ops_launch(mmv_kernel<F, 4, MMV_WARPS>, g1, MMV_THREADS, 0, st, p);
        else if (p.m <= 8)
            ops_launch(mmv_kernel<F, 8, MMV_WARPS>, g1, MMV_THREADS, 0, st, p);
        else
            ops_launch(mmv_kernel<F, MMV_MAX_M, MMV_WARPS>, g1, MMV_THREADS, 0, st, p);
    } else if (p.m == 1) {
        if (mmv_r2<F> == 2 && mmv_one_rows_per_warp() == 2) {
            constexpr int R = mmv_r2<F>;
            const dim3 g2((unsigned)((p.n_out + R * MMV_WARPS - 1) / (R * MMV_WARPS)));
            ops_launch(mmv_kernel<F, 1, 1, R>, g2, MMV_THREADS, 0, st, p);
        } else {
            ops_launch(mmv_kernel<F, 1, 1>, grid, MMV_THREADS, 0, st, p);
        }
    } else if (mmv_r2<F> == 2 && p.m <= 8 && mmv_rows_per_warp() == 2) {
        constexpr int R = mmv_r2<F>;
        const dim3 g2((unsigned)((p.n_out + R * MMV_WARPS - 1) / (R * MMV_WARPS)), grid.y);
        if (p.m == 2)
            ops_launch(mmv_kernel<F, 2, 1, R>, g2, MMV_THREADS, 0, st, p);
        else if (p.m <= 4)
            ops_launch(mmv_kernel<F, 4, 1, R>, g2, MMV_THREADS, 0, st, p);
        else
            ops_launch(mmv_kernel<F, 8, 1, R>, g2, MMV_THREADS, 0, st, p);
    } else if (p.m == 2) {
        ops_launch(mmv_kernel<F, 2, 1>, grid, MMV_THREADS, 0, st, p);
    } else if (p.m <= 4) {
        ops_launch(mmv_kernel<F, 4, 1>, grid, MMV_THREADS, 0, st, p);
    } else if (p.m <= 8) {
        ops_launch(mmv_kernel<F, 8, 1>, grid, MMV_THREADS, 0, st, p);
    } else {
        ops_launch(mmv_kernel<F, MMV_MAX_M, 1>, grid, MMV_THREADS, 0, st, p);
    }
}

/* ---- GEMM tiles ---- */

constexpr int GEMM_N_TILES = 4; /* enum cuda_matmul_tile 1 .. 4 */
constexpr int GEMM_MIN_BM = 32; /* the smallest BM of any tile: bounds grid y */

/* Calls fn.template operator()<T>() with the tile type of t (1 .. GEMM_N_TILES). */
template <typename Fn> void tile_dispatch(enum cuda_matmul_tile t, Fn &&fn)
{
    switch (t) {
    case CUDA_MATMUL_TILE_128X128:
        fn.template operator()<gemm_tile_128x128>();
        break;
    case CUDA_MATMUL_TILE_64X128:
        fn.template operator()<gemm_tile_64x128>();
        break;
    case CUDA_MATMUL_TILE_64X64:
        fn.template operator()<gemm_tile_64x64>();
        break;
    case CUDA_MATMUL_TILE_32X64:
        fn.template operator()<gemm_tile_32x64>();
        break;
    default:
        break;
    }
}

struct gemm_tile_info {
    int bm, bn;
    size_t smem; /* dynamic shared memory bytes for the format */
};

template <typename F> struct gemm_info_fn {
    gemm_tile_info info = {0, 0, 0};
    template <typename T> void operator()()
    {
        info = {T::BM, T::BN, gemm_smem_bytes<F, T>};
    }
};

template <typename F> gemm_tile_info gemm_info(enum cuda_matmul_tile t)
{
    gemm_info_fn<F> fn;
    tile_dispatch(t, fn);
    return fn.info;
}

struct gemm_device {
    int nsm;         /* streaming multiprocessors */
    size_t smem_max; /* dynamic shared memory a CTA may opt into */
};

/* The current device's figures (host-side attribute reads, allowed during a capture). */
int gemm_device_get(gemm_device *d)
{
    int dev = 0, nsm = 0, smem = 0;
    if (CUDA_CHECK(cudaGetDevice(&dev)) != cudaSuccess ||
        CUDA_CHECK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev)) !=
            cudaSuccess ||
        CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) !=
            cudaSuccess) {
        (void)cudaGetLastError();
        return -EIO;
    }
    d->nsm = nsm > 0 ? nsm : 1;
    d->smem_max = smem > 0 ? (size_t)smem : 0;
    return 0;
}

/* The tile with the least estimated time, among those that fit the device's shared memory.
 * Time in units of one MMA per element of n_in: an SM runs ceil(tiles / nsm) tiles (in turn, or
 * side by side sharing it), each costing its BM * BN MMAs plus about 32 for each of its BM + BN
 * rows converted to bf16 (a weight row is decoded once per tile, so its cost is amortized over
 * BM only, and an activation row over BN). Ties go to the larger tile. AUTO if none fits. */
template <typename F>
enum cuda_matmul_tile gemm_tile_choose(int m, int64_t n_out, const gemm_device &d)
{
    enum cuda_matmul_tile best = CUDA_MATMUL_TILE_AUTO;
    double best_cost = 0.0;
    for (int t = 1; t <= GEMM_N_TILES; t++) {
        const gemm_tile_info ti = gemm_info<F>((enum cuda_matmul_tile)t);
        if (ti.smem > d.smem_max)
            continue;
        const double tiles =
            (double)((m + ti.bm - 1) / ti.bm) * (double)((n_out + ti.bn - 1) / ti.bn);
        const double cost = ceil(tiles / d.nsm) * ((double)ti.bm * ti.bn + 32.0 * (ti.bm + ti.bn));
        if (best == CUDA_MATMUL_TILE_AUTO || cost < best_cost) {
            best = (enum cuda_matmul_tile)t;
            best_cost = cost;
        }
    }
    return best;
}

template <typename F> struct gemm_tile_launch_fn {
    const gemm_params &p;
    cudaStream_t st;
    template <typename T> void operator()()
    {
        const dim3 grid((unsigned)((p.n_out + T::BN - 1) / T::BN),
                        (unsigned)((p.m + T::BM - 1) / T::BM));
        ops_launch(gemm_kernel<F, T>, grid, GTHREADS, gemm_smem_bytes<F, T>, st, p);
    }
};

/* Launches the forced tile, or the chosen one for AUTO. 0 or -EINVAL (the tile does not fit
 * the device; or, for AUTO, none does). */
template <typename F>
int gemm_launch(const gemm_params &p, enum cuda_matmul_tile tile, const gemm_device &d,
                cudaStream_t st)
{
    if (tile == CUDA_MATMUL_TILE_AUTO)
        tile = gemm_tile_choose<F>(p.m, p.n_out, d);
    if (tile == CUDA_MATMUL_TILE_AUTO || gemm_info<F>(tile).smem > d.smem_max) {
        fprintf(stderr,
                "cuda_matmul: GEMM tile %d needs more shared memory than the device's %zu "
                "bytes\n",
                (int)tile, d.smem_max);
        return -EINVAL;
    }
    tile_dispatch(tile, gemm_tile_launch_fn<F>{p, st});
    return 0;
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
    enum cuda_matmul_tile tile;
    const gemm_device &d;
    cudaStream_t st;
    int rc = 0;
    template <typename F> void operator()()
    {
        if constexpr (!std::is_same_v<F, fmt_float<QUANT_F32>>) /* checked: F32 has no GEMM */
            rc = gemm_launch<F>(p, tile, d, st);
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

/* Loads gemm_kernel<F, T> and sets its dynamic shared memory limit, if the device has that
 * much, and the largest shared memory carveout (so that the tiles meant to run two CTAs per SM
 * get the room). */
template <typename F> struct gemm_preload_fn {
    size_t smem_max;
    cudaError_t e = cudaSuccess;
    template <typename T> void operator()()
    {
        const size_t bytes = gemm_smem_bytes<F, T>;
        if (e != cudaSuccess || bytes > smem_max)
            return;
        e = kernel_preload(gemm_kernel<F, T>);
        if (e == cudaSuccess)
            e = CUDA_CHECK(cudaFuncSetAttribute(
                gemm_kernel<F, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
        if (e == cudaSuccess)
            e = CUDA_CHECK(cudaFuncSetAttribute(gemm_kernel<F, T>,
                                                cudaFuncAttributePreferredSharedMemoryCarveout,
                                                (int)cudaSharedmemCarveoutMaxShared));
    }
};

struct preload_fn {
    size_t smem_max; /* the device's opt-in shared memory per CTA */
    cudaError_t e = cudaSuccess;
    template <typename F> void operator()()
    {
        if (e == cudaSuccess)
            e = kernel_preload(mmv_kernel<F, 1, MMV_WARPS>);
        if (e == cudaSuccess)
            e = kernel_preload(mmv_kernel<F, 2, MMV_WARPS>);
        if (e == cudaSuccess)
            e = kernel_preload(mmv_kernel<F, 4, MMV_WARPS>);
        if (e == cudaSuccess)
            e = kernel_preload(mmv_kernel<F, 8, MMV_WARPS>);
        if (e == cudaSuccess)
            e = kernel_preload(mmv_kernel<F, MMV_MAX_M, MMV_WARPS>);
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
        if (e == cudaSuccess)
            e = kernel_preload(mmv_kernel<F, 2, 1, mmv_r2<F>>);
        if (e == cudaSuccess)
            e = kernel_preload(mmv_kernel<F, 4, 1, mmv_r2<F>>);
        if (e == cudaSuccess)
            e = kernel_preload(mmv_kernel<F, 8, 1, mmv_r2<F>>);
        if constexpr (!std::is_same_v<F, fmt_float<QUANT_F32>>) {
            for (int t = 1; t <= GEMM_N_TILES && e == cudaSuccess; t++) {
                gemm_preload_fn<F> g{smem_max};
                tile_dispatch((enum cuda_matmul_tile)t, g);
                e = g.e;
            }
        }
    }
};

} /* namespace */

extern "C" size_t cuda_matmul_q8_layout(int64_t n_in, int m)
{
    return q8_qs_bytes(n_in, m);
}

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
    gemm_device gd;
    if (gemm_device_get(&gd) != 0)
        return -EIO;
    preload_fn pre{gd.smem_max};
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
        if ((int)a->tile < 0 || (int)a->tile > GEMM_N_TILES)
            return -EINVAL;
        /* grid y is ceil(m / BM); the automatic choice may take the smallest BM */
        if (a->wtype == QUANT_F32 || (a->m + GEMM_MIN_BM - 1) / GEMM_MIN_BM > MAX_GRID_Y)
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

/* The fields gemm_params and mmv_params share, from the call's arguments. */
template <typename P>
static void params_fill(P *p, const struct cuda_matmul_args *a, size_t row_bytes)
{
    p->w = (const uint8_t *)a->w;
    p->w_stride = a->w_stride;
    p->row_bytes = row_bytes;
    p->w_lo = (uintptr_t)a->w;
    p->w_hi = p->w_lo + (size_t)(a->n_out - 1) * a->w_stride + row_bytes;
    p->n_in = a->n_in;
    p->n_out = a->n_out;
    p->m = a->m;
    p->x = a->x;
    p->x_stride = a->x_stride;
    p->x_rows = a->x_rows;
    p->y = a->y;
    p->y_stride = a->y_stride;
}

/* A call with further matrices: one launch where every matrix takes the same MMV kernel (every
 * one above MMV_SPLIT_MAX_ROWS rows: a warp per row; all of them together at most that many: a
 * block per row, the routers of two layers), else one call per matrix. */
static int matmul_more(const struct cuda_matmul_args *a)
{
    if (a->n_more < 0 || a->n_more > CUDA_MATMUL_MAX_MORE)
        return -EINVAL;
    struct cuda_matmul_args one[1 + CUDA_MATMUL_MAX_MORE];
    const bool mmv = path_choose(a) == CUDA_MATMUL_PATH_MMV &&
                     (a->wtype != QUANT_F32 || a->m < CUDA_MATMUL_SGEMM_MIN_M);
    bool big = true;
    int64_t rows = 0;
    for (int i = 0; i <= a->n_more; i++) {
        one[i] = *a;
        one[i].n_more = 0;
        if (i) {
            one[i].w = a->more[i - 1].w;
            one[i].w_stride = a->more[i - 1].w_stride;
            one[i].n_out = a->more[i - 1].n_out;
            one[i].y = a->more[i - 1].y;
            one[i].y_stride = a->more[i - 1].y_stride;
            one[i].bias = a->more[i - 1].bias;
        }
        int rc = cuda_matmul_check(&one[i]);
        if (rc)
            return rc;
        big = big && one[i].n_out > MMV_SPLIT_MAX_ROWS;
        rows += one[i].n_out;
    }
    if (!mmv || !(big || rows <= MMV_SPLIT_MAX_ROWS)) {
        const fmt_info *f = fmt_find(a->wtype);
        for (int i = 0; i <= a->n_more; i++) {
            one[i].x_ready =
                i ? f->quantized && path_choose(a) == CUDA_MATMUL_PATH_MMV : a->x_ready;
            int rc = cuda_matmul(&one[i]);
            if (rc)
                return rc;
        }
        return 0;
    }
    return -EAGAIN; /* the caller launches them together */
}

extern "C" int cuda_matmul(const struct cuda_matmul_args *a)
{
    int rc = a && a->n_more ? matmul_more(a) : cuda_matmul_check(a);
    if (rc == -EAGAIN)
        rc = 0;
    else if (rc || (a && a->n_more))
        return rc;
    const fmt_info *f = fmt_find(a->wtype);
    const cudaStream_t st = (cudaStream_t)a->stream;
    const size_t row_bytes = (size_t)(a->n_in / f->block) * f->bytes;

    if (a->wtype == QUANT_F32 && a->path == CUDA_MATMUL_PATH_AUTO &&
        a->m >= CUDA_MATMUL_SGEMM_MIN_M && (uintptr_t)a->w % 4 == 0 && a->w_stride % 4 == 0) {
        gemm_params p = {};
        params_fill(&p, a, row_bytes);
        const dim3 grid((unsigned)((a->n_out + SG_T - 1) / SG_T),
                        (unsigned)((a->m + SG_T - 1) / SG_T));
        ops_launch(sgemm_f32_kernel, grid, 256, 0, st, p);
        rc = cuda_last_error("cuda_matmul (f32 tiles)");
        return rc ? rc : matmul_bias_launch(a, st);
    }
    if (path_choose(a) == CUDA_MATMUL_PATH_GEMM) {
        gemm_params p = {};
        params_fill(&p, a, row_bytes);
        gemm_device gd;
        rc = gemm_device_get(&gd);
        if (rc)
            return rc;
        gemm_launch_fn fn{p, a->tile, gd, st};
        fmt_dispatch(a->wtype, fn);
        rc = fn.rc ? fn.rc : cuda_last_error("cuda_matmul (gemm)");
        return rc ? rc : matmul_bias_launch(a, st);
    }

    mmv_params p = {};
    params_fill(&p, a, row_bytes);
    p.bias = a->bias;
    p.early = (ops_early() & OPS_EARLY_MMV) != 0;
    p.n_seg = a->n_more;
    for (int i = 0; i < a->n_more; i++) { /* one launch over the rows of every matrix */
        const struct cuda_matmul_more *mo = &a->more[i];
        p.seg_end[i] = p.n_out;
        p.seg[i].w = (const uint8_t *)mo->w;
        p.seg[i].w_stride = mo->w_stride;
        p.seg[i].w_lo = (uintptr_t)mo->w;
        p.seg[i].w_hi = p.seg[i].w_lo + (size_t)(mo->n_out - 1) * mo->w_stride + row_bytes;
        p.seg[i].y = mo->y;
        p.seg[i].y_stride = mo->y_stride;
        p.seg[i].bias = mo->bias;
        p.n_out += mo->n_out;
    }
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
        ops_launch(quantize_q8_kernel, grid, Q8_WARPS * WARP, 0, st, q);
        p.xq = q.qs;
        p.xds = q.ds;
    }
    fmt_dispatch(a->wtype, mmv_launch_fn{p, st});
    return cuda_last_error("cuda_matmul (mmv)");
}
