/* cuda_mma8: the device core of the tensor-core kernels on 8-bit codes (the MoE's mma8 path,
 * cuda_moe.cu; the GEMM8 path of cuda_matmul.cu). A block multiplies up to M8_BM activation
 * rows, given as 8-bit codes with a (d, d * sum) pair per 32 elements (the direct path's and the
 * MMV path's format), by M8_BN weight rows of Q8_0, Q4_K or Q6_K, walking K a stage of M8_KS
 * elements at a time: the rows' raw blocks arrive by 16-byte cp.async granules (any alignment:
 * a block keeps its offset within its first granule; granules past the matrix are copied byte
 * by byte), are unpacked once into signed 8-bit codes and per-unit scales in shared memory, and
 * the next stage's raw blocks (and, where two activation buffers fit two blocks per SM, its
 * activation codes) are copied while the MMAs run. Each 32-element unit is one s8 MMA (m16n8k32;
 * Q6_K's halves of 16 with their own scales two m16n8k16) whose integer sums are scaled in float
 * as the direct 8-bit path scales a unit (moe_q8_unit::apply in cuda_moe.cu), units added in
 * order, so every output is deterministic. Included by those two files only. */
#ifndef STRATA_CUDA_MMA8_CUH
#define STRATA_CUDA_MMA8_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_ops_quant.cuh"

/* Byte i (0..11) of three little-endian words. */
static __device__ __forceinline__ uint32_t moe_byte12(uint32_t w0, uint32_t w1, uint32_t w2, int i)
{
    const uint32_t w = i < 4 ? w0 : i < 8 ? w1 : w2;
    return (w >> 8 * (i % 4)) & 0xFF;
}

/* 6-bit scale and min of Q4_K sub-block j from a block's first 16 bytes (hd.x: d and dmin,
 * hd.y..w: the 12 packed scale bytes), as cq_k4_scale_min reads them from memory. */
static __device__ __forceinline__ void moe_q4k_scale_min(uint4 hd, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = (int)(moe_byte12(hd.y, hd.z, hd.w, j) & 63);
        *m = (int)(moe_byte12(hd.y, hd.z, hd.w, j + 4) & 63);
    } else {
        const uint32_t hi = moe_byte12(hd.y, hd.z, hd.w, j + 4);
        *sc = (int)((hi & 0xF) | (moe_byte12(hd.y, hd.z, hd.w, j - 4) >> 6) << 4);
        *m = (int)((hi >> 4) | (moe_byte12(hd.y, hd.z, hd.w, j) >> 6) << 4);
    }
}

#define M8_BM 64           /* activation rows per tile (MoE pairs: MOE_TILE_MMA) */
#define M8_BN 128          /* weight rows per block */
#define M8_KS 256          /* elements per stage: one Q4_K / Q6_K block, eight Q8_0 blocks */
#define M8_LD (M8_KS + 16) /* shared row of codes, bytes (rows fall in distinct banks) */
#define M8_CLD (M8_BN + 4) /* padded row of the float result tile (gate/up) */

template <uint32_t WT> struct m8_fmt;
/* BB: bytes per block; SLOT: a block's shared slot (its offset in the first granule and a
 * word's reach past its end); AB: activation stages in shared memory (2: the next stage's codes
 * are copied during this stage's MMAs, where two blocks per SM still fit) */
template <> struct m8_fmt<QUANT_Q4_K> {
    static constexpr int BB = 144, SLOT = ((15 + BB + 4) + 15) / 16 * 16, AB = 2;
};
template <> struct m8_fmt<QUANT_Q6_K> {
    static constexpr int BB = 210, SLOT = ((15 + BB + 4) + 15) / 16 * 16, AB = 1;
};
template <> struct m8_fmt<QUANT_Q8_0> { /* BB: the stage's eight blocks of 34 bytes */
    static constexpr int BB = 8 * 34, SLOT = ((15 + BB + 4) + 15) / 16 * 16, AB = 1;
};

/* Whether the type has the kernels. */
static constexpr bool m8_type(uint32_t t)
{
    return t == QUANT_Q4_K || t == QUANT_Q6_K || t == QUANT_Q8_0;
}

#define M8_ABYTES ((uint64_t)M8_BM * M8_LD + 8ull * M8_BM * 8) /* one stage of codes + scales */

template <uint32_t WT> static constexpr uint64_t m8_smem_bytes()
{
    return m8_fmt<WT>::AB * M8_ABYTES + (uint64_t)M8_BN * M8_LD + 8ull * M8_BN * 8 +
           (uint64_t)M8_BN * m8_fmt<WT>::SLOT;
}

/* The 32-bit word at any byte address of shared memory (two aligned loads and a funnel shift;
 * may read up to 3 bytes past the word's last byte). */
static __device__ __forceinline__ uint32_t m8_word(const uint8_t *p)
{
    const uintptr_t a = (uintptr_t)p;
    const uint32_t *w = (const uint32_t *)(a & ~(uintptr_t)3);
    return __funnelshift_r(w[0], w[1], 8u * (uint32_t)(a & 3));
}

static __device__ __forceinline__ void m8_cp16(void *smem, const void *gmem)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

static __device__ __forceinline__ void m8_cp8(void *smem, const void *gmem)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(s), "l"(gmem) : "memory");
}

static __device__ __forceinline__ void m8_cp_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

static __device__ __forceinline__ void m8_cp_wait_all(void)
{
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}

/* c = A B for one 16 x 8 tile over 32 k (s8 x s8 -> s32). */
static __device__ __forceinline__ void m8_mma32(int (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
#else
    (void)a, (void)b0, (void)b1;
    c[0] = c[1] = c[2] = c[3] = 0;
    __trap();
#endif
}

/* c = A B for one 16 x 8 tile over 16 k. */
static __device__ __forceinline__ void m8_mma16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%7,%7,%7};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(0));
#else
    (void)a0, (void)a1, (void)b;
    c[0] = c[1] = c[2] = c[3] = 0;
    __trap();
#endif
}

/* The raw blocks of stage s of the tile's weight rows (row n at rows[n]) into their slots: the
 * 16-byte granules covering each block, by cp.async where the granule lies inside [lo[n],
 * hi[n]) (the row's matrix), else byte by byte inside it; off[n] = the block's offset in its
 * slot. The caller commits and waits. */
template <uint32_t WT>
static __device__ __forceinline__ void m8_load_raw(uint8_t *raw, const uint8_t *const *rows,
                                                   const uintptr_t *lo, const uintptr_t *hi,
                                                   int *off, int64_t s)
{
    constexpr int BB = m8_fmt<WT>::BB, SLOT = m8_fmt<WT>::SLOT, NG = SLOT / 16;
    for (int i = threadIdx.x; i < M8_BN * NG; i += blockDim.x) {
        const int n = i / NG, c = i - n * NG;
        const uintptr_t src = (uintptr_t)(rows[n] + s * BB), a0 = src & ~(uintptr_t)15;
        const int o = (int)(src - a0);
        if (c == 0)
            off[n] = o;
        if (16 * c >= o + BB)
            continue;
        const uintptr_t g = a0 + 16 * (uintptr_t)c;
        uint8_t *dst = raw + n * SLOT + 16 * c;
        if (g >= lo[n] && g + 16 <= hi[n]) {
            m8_cp16(dst, (const void *)g);
        } else {
            for (int b = 0; b < 16; b++)
                if (g + b >= lo[n] && g + b < hi[n])
                    dst[b] = *(const uint8_t *)(g + b);
        }
    }
}

/* The raw blocks into codes (bq: row n's 256 codes at n * M8_LD) and per-unit scales (bd[j *
 * M8_BN + n]): Q4_K (d sc, dmin m) with codes 0..15; Q6_K (d, sc0 | sc1 << 16 as bits) with codes
 * q - 32; Q8_0 (d, 0) with its codes. */
template <uint32_t WT>
static __device__ __forceinline__ void m8_unpack(const uint8_t *raw, const int *off, int8_t *bq,
                                                 float2 *bd)
{
    constexpr int SLOT = m8_fmt<WT>::SLOT;
    for (int i = threadIdx.x; i < M8_BN * 8; i += blockDim.x) {
        const int n = i % M8_BN, j = i / M8_BN; /* a warp's lanes on consecutive rows */
        const uint8_t *b = raw + n * SLOT + off[n];
        uint32_t q[8];
        if constexpr (WT == QUANT_Q4_K) {
            const uint4 hd =
                make_uint4(m8_word(b), m8_word(b + 4), m8_word(b + 8), m8_word(b + 12));
            int sc, m;
            moe_q4k_scale_min(hd, j, &sc, &m);
            const uint8_t *qs = b + 16 + 32 * (j / 2);
            const int sh = 4 * (j & 1);
            if ((off[n] & 15) == 0) { /* 16-byte aligned rows: two 16-byte loads */
                const uint4 q0 = *(const uint4 *)qs, q1 = *(const uint4 *)(qs + 16);
                const uint32_t qa[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
                for (int w = 0; w < 8; w++)
                    q[w] = (qa[w] >> sh) & 0x0F0F0F0Fu;
            } else {
#pragma unroll
                for (int w = 0; w < 8; w++)
                    q[w] = (m8_word(qs + 4 * w) >> sh) & 0x0F0F0F0Fu;
            }
            bd[j * M8_BN + n] =
                make_float2(cq_f16(hd.x & 0xFFFF) * (float)sc, cq_f16(hd.x >> 16) * (float)m);
        } else if constexpr (WT == QUANT_Q8_0) {
            const uint8_t *blk = b + 34 * j;
#pragma unroll
            for (int w = 0; w < 8; w++)
                q[w] = m8_word(blk + 2 + 4 * w);
            bd[j * M8_BN + n] = make_float2(cq_f16(m8_word(blk) & 0xFFFF), 0.0f);
        } else {
            const int h = j / 4, s = j % 4;
            const uint8_t *ql = b + 64 * h + 32 * (s % 2), *qh = b + 128 + 32 * h;
            const int shl = 4 * (s / 2), shh = 2 * s;
#pragma unroll
            for (int w = 0; w < 8; w++) {
                const uint32_t lo = (m8_word(ql + 4 * w) >> shl) & 0x0F0F0F0Fu;
                const uint32_t hi = ((m8_word(qh + 4 * w) >> shh) & 0x03030303u) << 4;
                q[w] = __vsub4(lo | hi, 0x20202020u);
            }
            const int8_t *sc = (const int8_t *)(b + 192) + 8 * h + 2 * s;
            const uint32_t s01 =
                (uint32_t)(uint16_t)(int16_t)sc[0] | (uint32_t)(uint16_t)(int16_t)sc[1] << 16;
            bd[j * M8_BN + n] =
                make_float2(cq_f16(m8_word(b + 208) & 0xFFFF), __uint_as_float(s01));
        }
        uint4 *dst = (uint4 *)(bq + n * M8_LD + 32 * j);
        dst[0] = make_uint4(q[0], q[1], q[2], q[3]);
        dst[1] = make_uint4(q[4], q[5], q[6], q[7]);
    }
}

/* How the 8 warps split a tile: a grid of WM x (8 / WM) warps, each owning MI 16-pair tiles
 * by NI 8-row tiles (pairs from pm(w), weight rows from pn(w)). The tile's pair count picks the
 * smallest layout that covers it (m8_lay64, 48, 32, 16), so that pairs past the tile's end cost no
 * MMAs while every warp keeps a share of the work. */
template <int MI_, int NI_, int WM_> struct m8_lay {
    static constexpr int MI = MI_, NI = NI_, WM = WM_, WN = 8 / WM_, ROWS = 16 * MI_ * WM_;
    static __device__ __forceinline__ int pm(int warp)
    {
        return (warp / WN) * 16 * MI;
    }
    static __device__ __forceinline__ int pn(int warp)
    {
        return (warp % WN) * 8 * NI;
    }
};
using m8_lay64 = m8_lay<2, 4, 2>;
using m8_lay48 = m8_lay<3, 2, 1>;
using m8_lay32 = m8_lay<2, 2, 1>;
using m8_lay16 = m8_lay<1, 2, 1>;

/* The stage's MMAs: unit j of every (pair, row) of the warp's block, added to acc in
 * moe_q8_unit's arithmetic (acc[mi][ni][c]: pair row L::pm + 16 mi + g (+ 8 for c >= 2),
 * weight row L::pn + 8 ni + 2 t + (c & 1)). */
template <uint32_t WT, class L>
static __device__ __forceinline__ void m8_stage_mma(const int8_t *aq, const float2 *ad,
                                                    const int8_t *bq, const float2 *bd,
                                                    float (&acc)[L::MI][L::NI][4])
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3, pm = L::pm(warp), pn = L::pn(warp);
#pragma unroll 2
    for (int j = 0; j < 8; j++) {
        uint32_t a[L::MI][4];
        float2 xa[L::MI][2];
#pragma unroll
        for (int mi = 0; mi < L::MI; mi++) {
            const int r = pm + 16 * mi + g;
            const int8_t *p0 = aq + r * M8_LD + 32 * j + 4 * t, *p1 = p0 + 8 * M8_LD;
            a[mi][0] = *(const uint32_t *)p0;
            a[mi][1] = *(const uint32_t *)p1;
            a[mi][2] = *(const uint32_t *)(p0 + 16);
            a[mi][3] = *(const uint32_t *)(p1 + 16);
            xa[mi][0] = ad[j * M8_BM + r];
            xa[mi][1] = ad[j * M8_BM + r + 8];
        }
#pragma unroll
        for (int ni = 0; ni < L::NI; ni++) {
            const int8_t *pb = bq + (pn + 8 * ni + g) * M8_LD + 32 * j + 4 * t;
            const uint32_t b0 = *(const uint32_t *)pb, b1 = *(const uint32_t *)(pb + 16);
            const int nc = pn + 8 * ni + 2 * t;
            const float2 w[2] = {bd[j * M8_BN + nc], bd[j * M8_BN + nc + 1]};
#pragma unroll
            for (int mi = 0; mi < L::MI; mi++) {
                if constexpr (WT == QUANT_Q4_K) {
                    int c[4];
                    m8_mma32(c, a[mi], b0, b1);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const float2 wu = w[e & 1], x = xa[mi][e >> 1];
                        acc[mi][ni][e] = acc[mi][ni][e] + wu.x * x.x * (float)c[e] - wu.y * x.y;
                    }
                } else if constexpr (WT == QUANT_Q8_0) {
                    int c[4];
                    m8_mma32(c, a[mi], b0, b1);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const float2 wu = w[e & 1], x = xa[mi][e >> 1];
                        acc[mi][ni][e] = acc[mi][ni][e] + wu.x * x.x * (float)c[e];
                    }
                } else {
                    int c0[4], c1[4];
                    m8_mma16(c0, a[mi][0], a[mi][1], b0);
                    m8_mma16(c1, a[mi][2], a[mi][3], b1);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const float2 wu = w[e & 1], x = xa[mi][e >> 1];
                        const uint32_t s01 = __float_as_uint(wu.y);
                        const int sc0 = (int)(int16_t)(s01 & 0xFFFF), sc1 = (int)s01 >> 16;
                        acc[mi][ni][e] =
                            acc[mi][ni][e] + wu.x * x.x * (float)(sc0 * c0[e] + sc1 * c1[e]);
                    }
                }
            }
        }
    }
}

/* The codes (M8_BM rows of M8_KS at row i's src[i] + s * M8_KS) and scales (ad[j * M8_BM + i] =
 * sd[i][s * 8 + j]) of stage s into a = codes, then scales, by cp.async (the caller commits and
 * waits); the first ROWS rows, those the tile's layout multiplies. */
template <int ROWS>
static __device__ __forceinline__ void m8_load_act(uint8_t *a, const int8_t *const *src,
                                                   const float2 *const *sd, int64_t s)
{
    int8_t *aq = (int8_t *)a;
    float2 *ad = (float2 *)(a + M8_BM * M8_LD);
    for (int i = threadIdx.x; i < ROWS * (M8_KS / 16); i += blockDim.x) {
        const int r = i / (M8_KS / 16), c = i % (M8_KS / 16);
        m8_cp16(aq + r * M8_LD + 16 * c, src[r] + s * M8_KS + 16 * c);
    }
    for (int i = threadIdx.x; i < ROWS * 8; i += blockDim.x) {
        const int r = i >> 3, j = i & 7;
        m8_cp8(ad + j * M8_BM + r, sd[r] + s * 8 + j);
    }
}

/* The tile's K loop: stage s's raw weight blocks (copied during the previous stage's MMAs) are
 * unpacked, the next stage's raw blocks (and, with two activation buffers, its activations)
 * started, then the MMAs; with one activation buffer a stage's activations are copied at its
 * start. Ends with a barrier: shared memory is free for the epilogue. */
template <uint32_t WT, class L>
static __device__ __forceinline__ void m8_run(uint8_t *smem, const int8_t *const *src,
                                              const float2 *const *sd, const uint8_t *const *rows,
                                              const uintptr_t *lo, const uintptr_t *hi, int *off,
                                              int64_t n_in, float (&acc)[L::MI][L::NI][4])
{
    constexpr int AB = m8_fmt<WT>::AB;
    int8_t *bq = (int8_t *)(smem + AB * M8_ABYTES);
    float2 *bd = (float2 *)(bq + M8_BN * M8_LD);
    uint8_t *raw = (uint8_t *)(bd + 8 * M8_BN);
#pragma unroll
    for (int mi = 0; mi < L::MI; mi++)
#pragma unroll
        for (int ni = 0; ni < L::NI; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[mi][ni][e] = 0.0f;
    const int64_t ns = n_in / M8_KS;
    m8_load_raw<WT>(raw, rows, lo, hi, off, 0);
    if (AB == 2)
        m8_load_act<L::ROWS>(smem, src, sd, 0);
    for (int64_t s = 0; s < ns; s++) {
        uint8_t *a = smem + (AB == 2 ? (s & 1) * M8_ABYTES : 0);
        if (AB == 1)
            m8_load_act<L::ROWS>(a, src, sd, s);
        m8_cp_wait_all();
        __syncthreads();
        m8_unpack<WT>(raw, off, bq, bd);
        __syncthreads();
        if (s + 1 < ns) {
            m8_load_raw<WT>(raw, rows, lo, hi, off, s + 1);
            if (AB == 2)
                m8_load_act<L::ROWS>(smem + ((s + 1) & 1) * M8_ABYTES, src, sd, s + 1);
            m8_cp_commit();
        }
        m8_stage_mma<WT, L>((const int8_t *)a, (const float2 *)(a + M8_BM * M8_LD), bq, bd, acc);
        __syncthreads();
    }
    m8_cp_wait_all();
    __syncthreads();
}

#endif
