/* cuda_moe with CUDA: kernels first, then the launcher. Contracts in cuda_moe.h; design and
 * tolerances in docs/cuda-ops.md.
 *
 * Three kinds of kernel:
 * - float: every dot product is one warp walking a weight row in 256-element groups
 *   (cuda_ops_quant.cuh): lane l decodes its 8 weights once and applies them to each activation
 *   row of the work item, accumulating with fmaf in group order, then the warp sums its lanes by
 *   a fixed butterfly. A work item is one (token, expert) pair on the direct path and a tile of
 *   up to 4 or 16 pairs of one expert on the grouped path (by the average pairs per expert); the
 *   per-pair arithmetic is the same either way, which is why the two paths agree bit for bit.
 * - 8-bit (the direct path on Q4_K/Q6_K/MXFP4): activation codes and __dp4a, one 32-element
 *   unit per lane and step.
 * - tensor cores (the mma path): bf16 tiles in shared memory, WMMA.
 */
#include "cuda_check.h"
#include "cuda_mem.h"
#include "cuda_moe.h"
#include "cuda_ops.h"
#include "cuda_ops_quant.cuh"
#include "cuda_ops_util.cuh"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <mma.h>

namespace cg = cooperative_groups;

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MOE_WARPS 8          /* output rows per block, one per warp */
#define MOE_TILE_SMALL 4     /* pairs per tile on the grouped path: few pairs per expert */
#define MOE_TILE_LARGE 16    /* ... and from MOE_TILE_LARGE / 2 pairs per expert on average */
#define MOE_TILE_MMA 64      /* pairs per tile on the tensor-core path */
#define MOE_SORT_THREADS 256 /* chunks of the counting sort, one per thread */
#define MOE_DOWN_KMAX                                                                              \
    1 /* experts a float direct down warp walks side by side (more, or                             \
       * staging the rows, measured slower: bench/cuda-resident.md) */

static __host__ __device__ __forceinline__ int64_t moe_cdiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

struct moe_params {
    const float *in; /* (n_tok, in_stride) */
    int64_t in_stride;
    float *out; /* (n_tok, out_stride) */
    int64_t out_stride;
    int n_tok, k, n_expert, n_pairs;
    int tile; /* pairs per tile on the grouped path: MOE_TILE_SMALL or MOE_TILE_LARGE */
    int64_t n_embd, n_ff;
    const int32_t *ids; /* (n_pairs) */
    const float *wts;   /* (n_pairs) */
    /* NULL, or the router logits (n_expert) of a one-token bulk call that selects its experts
     * in its kernels (moe_topk_select; cuda_moe_args.logits): ids and wts are then ids_w and
     * wts_w, written by gate/up's first block */
    const float *logits;
    int32_t *ids_w;
    float *wts_w;
    const uint8_t *gate, *up, *down;
    uint64_t gate_stride, up_stride, down_stride; /* bytes per expert */
    const void *const *gate_ptrs;
    const void *const *up_ptrs;
    const void *const *down_ptrs;
    uint64_t gate_row, up_row, down_row; /* bytes per row */
    const float *gate_b, *up_b;          /* NULL or (n_expert, n_ff): gpt-oss's biases */
    const float *down_b;                 /* NULL or (n_expert, n_embd) */
    int oai;                             /* h = gpt-oss's clamped SwiGLU instead of silu(gate) up */
    int gu2; /* 8-bit gate/up: a warp's two rows in one walk (moe_q8_gu_rows2; STRATA_MOE_GU2=0:
              * a walk per row, for comparisons) */
    /* scratch views */
    float *h;              /* (n_pairs, n_ff) silu(gate x) * up x of each pair */
    int8_t *hq;            /* (n_pairs, n_ff) h as 8-bit codes (the 8-bit direct path) */
    float2 *hd;            /* (n_pairs, n_ff / 32) their (d, d * sum) per 32 elements */
    const int8_t *in_q8;   /* NULL or (n_tok, n_embd): cuda_moe_args.in_q8 */
    const float2 *in_q8_d; /* (n_tok, n_embd / 32) */
    int8_t *xq;            /* (n_tok, n_embd) the inputs as 8-bit codes (grouped 8-bit path) */
    float2 *xd;            /* (n_tok, n_embd / 32) their (d, d * sum) per 32 elements */
    float *y;              /* (n_pairs, n_embd) w * down h of each pair (grouped path) */
    int32_t *cnt;          /* (MOE_SORT_THREADS, n_expert + 1) per-chunk counts, then cursors */
    int32_t *off;          /* (n_expert + 2) start of each bin in sorted */
    int32_t *sorted;       /* (n_pairs) pair indices grouped by expert, ascending within one */
    int32_t *tile_e;       /* (max_tiles) bin (expert; n_expert = invalid id) of each tile */
    int32_t *tile_b;       /* (max_tiles) first position in sorted */
    int32_t *tile_n;       /* (max_tiles) pairs in the tile, 1..tile */
    int32_t *n_tiles;      /* (1) tiles written by the sort */
};

/* ==== kernels ================================================================================ */

static __device__ __forceinline__ const uint8_t *moe_expert(const uint8_t *base, uint64_t stride,
                                                            const void *const *ptrs, int e)
{
    return ptrs ? (const uint8_t *)ptrs[e] : base + (uint64_t)e * stride;
}

static __device__ __forceinline__ float moe_silu(float v)
{
    return v / (1.0f + expf(-v));
}

/* h of row r of expert e from its gate and up sums: silu(g) u, or with gpt-oss's biases and
 * activation min(g', 7) sigmoid(1.702 min(g', 7)) (clamp(u', -7, 7) + 1), g' = g + b_gate,
 * u' = u + b_up (cpu_kernels/expert_ffn.h) */
static __device__ __forceinline__ float moe_h(const struct moe_params &p, int e, int64_t r, float g,
                                              float u)
{
    if (p.gate_b) {
        g = __fadd_rn(g, p.gate_b[(int64_t)e * p.n_ff + r]);
        u = __fadd_rn(u, p.up_b[(int64_t)e * p.n_ff + r]);
    }
    if (p.oai) {
        g = fminf(g, 7.0f);
        u = fminf(fmaxf(u, -7.0f), 7.0f);
        return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-1.702f * g))), __fadd_rn(u, 1.0f));
    }
    return __fmul_rn(moe_silu(g), u);
}

/* Row r of expert e's down projection with its bias, where it has one. */
static __device__ __forceinline__ float moe_down_b(const struct moe_params &p, int e, int64_t r,
                                                   float y)
{
    return p.down_b ? __fadd_rn(y, p.down_b[(int64_t)e * p.n_embd + r]) : y;
}

/* The pairs of work item w: on the direct path pair w alone, on the grouped path tile w of the
 * sort. Fills pairs[0..TM) (unused slots repeat a valid pair) and *e; returns the number of
 * pairs, 0 when the tile does not exist. */
template <int TM>
static __device__ __forceinline__ int moe_work(const struct moe_params &p, bool grouped, int w,
                                               int *pairs, int *e)
{
    if (!grouped) {
#pragma unroll
        for (int i = 0; i < TM; i++)
            pairs[i] = w;
        *e = p.ids[w];
        return 1;
    }
    if (w >= *p.n_tiles)
        return 0;
    int b = p.tile_b[w], n = p.tile_n[w];
    *e = p.tile_e[w];
#pragma unroll
    for (int i = 0; i < TM; i++)
        pairs[i] = p.sorted[b + (i < n ? i : 0)];
    return n;
}

/* h[pair, r] = silu(gate_e[r] . x) * (up_e[r] . x) for the pairs of one work item. */
template <uint32_t WT, int TM>
static __global__ void __launch_bounds__(MOE_WARPS * 32)
    k_moe_gate_up(struct moe_params p, bool grouped)
{
    ops_pdl_begin();
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.y * MOE_WARPS + (threadIdx.x >> 5);
    if (r >= p.n_ff)
        return;
    int pairs[TM], e;
    int np = moe_work<TM>(p, grouped, blockIdx.x, pairs, &e);
    if (np == 0)
        return;
    if (e < 0 || e >= p.n_expert) {
#pragma unroll
        for (int i = 0; i < TM; i++)
            if (lane == 0 && i < np)
                p.h[(int64_t)pairs[i] * p.n_ff + r] = NAN;
        return;
    }
    const uint8_t *gr = moe_expert(p.gate, p.gate_stride, p.gate_ptrs, e) + r * p.gate_row;
    const uint8_t *ur = moe_expert(p.up, p.up_stride, p.up_ptrs, e) + r * p.up_row;
    const float *x[TM];
    float ag[TM], au[TM];
#pragma unroll
    for (int i = 0; i < TM; i++) {
        x[i] = p.in + (int64_t)(pairs[i] / p.k) * p.in_stride;
        ag[i] = au[i] = 0.0f;
    }
    const int64_t ng = moe_cdiv(p.n_embd, CQ_GROUP);
    /* unrolled: the loads of several groups are in flight at once (each group's arithmetic,
     * and so every sum's order, is unchanged) */
#pragma unroll 4
    for (int64_t g = 0; g < ng; g++) {
        cq_step<WT> sg, su;
        if (sg.load(gr, p.n_embd, g, lane)) {
#pragma unroll
            for (int i = 0; i < TM; i++)
                ag[i] = sg.dot(x[i], ag[i]);
        }
        if (su.load(ur, p.n_embd, g, lane)) {
#pragma unroll
            for (int i = 0; i < TM; i++)
                au[i] = su.dot(x[i], au[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < TM; i++) {
        float gs = ops_warp_sum(ag[i]), us = ops_warp_sum(au[i]);
        if (lane == 0 && i < np)
            p.h[(int64_t)pairs[i] * p.n_ff + r] = moe_h(p, e, r, gs, us);
    }
}

/* Direct path: out[t, r] = sum_j w_j * (down_{e_j}[r] . h_j), j = 0..k-1 in order. With
 * k <= KMAX the k dot products run side by side (KMAX accumulators, one group of every expert
 * per step), so the loads of all k rows are in flight together; each dot product still sums
 * its groups in order, and the k results are combined in order j, as with KMAX = 1. */
template <uint32_t WT, int KMAX>
static __global__ void __launch_bounds__(MOE_WARPS * 32) k_moe_down_direct(struct moe_params p)
{
    ops_pdl_begin();
    const int lane = threadIdx.x & 31, t = blockIdx.x;
    const int64_t r = (int64_t)blockIdx.y * MOE_WARPS + (threadIdx.x >> 5);
    if (r >= p.n_embd)
        return;
    const int64_t ng = moe_cdiv(p.n_ff, CQ_GROUP);
    float acc = 0.0f;
    for (int j0 = 0; j0 < p.k; j0 += KMAX) {
        const uint8_t *dr[KMAX];
        const float *hx[KMAX];
        float s[KMAX];
        bool ok[KMAX];
        int ex[KMAX];
#pragma unroll
        for (int i = 0; i < KMAX; i++) {
            int j = j0 + i, pr = t * p.k + (j < p.k ? j : 0), e = p.ids[pr];
            ok[i] = j < p.k && e >= 0 && e < p.n_expert;
            ex[i] = ok[i] ? e : 0;
            dr[i] = moe_expert(p.down, p.down_stride, p.down_ptrs, ok[i] ? e : 0) + r * p.down_row;
            hx[i] = p.h + (int64_t)pr * p.n_ff;
            s[i] = 0.0f;
        }
        for (int64_t g = 0; g < ng; g++) {
#pragma unroll
            for (int i = 0; i < KMAX; i++) {
                cq_step<WT> st;
                if (ok[i] && st.load(dr[i], p.n_ff, g, lane))
                    s[i] = st.dot(hx[i], s[i]);
            }
        }
#pragma unroll
        for (int i = 0; i < KMAX; i++) {
            int j = j0 + i;
            if (j >= p.k)
                break;
            float ws = moe_down_b(p, ex[i], r, ops_warp_sum(s[i]));
            acc = ok[i] ? __fadd_rn(acc, __fmul_rn(p.wts[t * p.k + j], ws)) : NAN;
        }
    }
    if (lane == 0)
        p.out[(int64_t)t * p.out_stride + r] = acc;
}

/* ---- direct gate/up, rows staged through shared memory -----------------------------------------
 * The steps above read a weight row with many small loads, a group at a time. Here a warp first
 * copies its gate and up rows into its own shared memory with 16-byte loads, all in flight
 * together, and then runs the same steps on the copy: the arithmetic, and so every bit, is
 * unchanged. It helps gate/up a little (the kernels are bound by instructions more than by
 * loads) and measured slower for down, which is not staged (bench/cuda-resident.md). */

/* The 16-byte chunk at c (16-byte aligned) of the row [a0, a1): one load when it lies inside,
 * else the bytes inside, one at a time, and zeros. */
static __device__ __forceinline__ uint4 moe_chunk(uintptr_t c, uintptr_t a0, uintptr_t a1)
{
    if (c >= a0 && c + 16 <= a1)
        return *(const uint4 *)c;
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 16; j++)
        if (c + j >= a0 && c + j < a1)
            w[j / 4] |= (uint32_t) * (const uint8_t *)(c + j) << 8 * (j % 4);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* Copies NR rows of n bytes (rows[i] unused where !use[i]) to smem + i * stride (16-byte
 * aligned, moe_stage_bytes(n) each) and sets out[i] to where row i starts there. Each pass
 * issues every lane's loads (CPL chunks of each row) before any store, so they are all in
 * flight at once; only bytes of the rows are read. */
template <int NR, int CPL>
static __device__ __forceinline__ void moe_stage(const uint8_t *const *rows, const bool *use,
                                                 uint64_t n, uint8_t *smem, uint64_t stride,
                                                 int lane, const uint8_t **out)
{
    uintptr_t a0[NR], c0[NR];
    int chunks = 0;
#pragma unroll
    for (int i = 0; i < NR; i++) {
        a0[i] = (uintptr_t)rows[i];
        c0[i] = a0[i] & ~(uintptr_t)15;
        int ch = (int)((((a0[i] + n + 15) & ~(uintptr_t)15) - c0[i]) / 16);
        chunks = ch > chunks ? ch : chunks;
        out[i] = smem + i * stride + (a0[i] - c0[i]);
    }
    for (int base = 0; base < chunks; base += 32 * CPL) {
        uint4 v[NR][CPL];
#pragma unroll
        for (int i = 0; i < NR; i++)
#pragma unroll
            for (int k = 0; k < CPL; k++) {
                int ci = base + lane + 32 * k;
                uintptr_t c = c0[i] + 16 * (uintptr_t)ci;
                if (use[i] && c < a0[i] + n)
                    v[i][k] = moe_chunk(c, a0[i], a0[i] + n);
            }
#pragma unroll
        for (int i = 0; i < NR; i++)
#pragma unroll
            for (int k = 0; k < CPL; k++) {
                int ci = base + lane + 32 * k;
                if (use[i] && c0[i] + 16 * (uintptr_t)ci < a0[i] + n)
                    ((uint4 *)(smem + i * stride))[ci] = v[i][k];
            }
    }
    __syncwarp();
}

/* bytes of one staged row in shared memory (row bytes, the misalignment, rounded to 16) */
static __host__ __device__ __forceinline__ uint64_t moe_stage_bytes(uint64_t row)
{
    return (row + 32 + 15) & ~(uint64_t)15;
}

#define MOE_STAGE_MAX_SMEM (40 * 1024) /* dynamic shared memory of a staged block */

/* direct gate/up: one (pair, row) per warp, its gate and up rows staged */
template <uint32_t WT>
static __global__ void __launch_bounds__(MOE_WARPS * 32) k_moe_gate_up_staged(struct moe_params p)
{
    ops_pdl_begin();
    extern __shared__ __align__(16) uint8_t moe_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t r = (int64_t)blockIdx.y * MOE_WARPS + warp;
    if (r >= p.n_ff)
        return;
    const int pair = blockIdx.x, e = p.ids[pair];
    if (e < 0 || e >= p.n_expert) {
        if (lane == 0)
            p.h[(int64_t)pair * p.n_ff + r] = NAN;
        return;
    }
    /* gate_type == up_type: both rows have gate_row bytes */
    const uint64_t sg = moe_stage_bytes(p.gate_row);
    const uint8_t *src[2] = {moe_expert(p.gate, p.gate_stride, p.gate_ptrs, e) + r * p.gate_row,
                             moe_expert(p.up, p.up_stride, p.up_ptrs, e) + r * p.up_row};
    const bool use[2] = {true, true};
    const uint8_t *rows[2];
    moe_stage<2, 4>(src, use, p.gate_row, moe_smem + (uint64_t)warp * 2 * sg, sg, lane, rows);
    const uint8_t *gr = rows[0], *ur = rows[1];
    const float *x = p.in + (int64_t)(pair / p.k) * p.in_stride;
    float ag = 0.0f, au = 0.0f;
    const int64_t ng = moe_cdiv(p.n_embd, CQ_GROUP);
    for (int64_t g = 0; g < ng; g++) {
        cq_step<WT> a, b;
        if (a.load(gr, p.n_embd, g, lane))
            ag = a.dot(x, ag);
        if (b.load(ur, p.n_embd, g, lane))
            au = b.dot(x, au);
    }
    float gs = ops_warp_sum(ag), us = ops_warp_sum(au);
    if (lane == 0)
        p.h[(int64_t)pair * p.n_ff + r] = moe_h(p, e, r, gs, us);
}

/* Grouped path: y[pair, r] = w_pair * (down_e[r] . h_pair) for the pairs of one tile. */
template <uint32_t WT, int TM>
static __global__ void __launch_bounds__(MOE_WARPS * 32) k_moe_down_grouped(struct moe_params p)
{
    ops_pdl_begin();
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.y * MOE_WARPS + (threadIdx.x >> 5);
    if (r >= p.n_embd)
        return;
    int pairs[TM], e;
    int np = moe_work<TM>(p, true, blockIdx.x, pairs, &e);
    if (np == 0)
        return;
    if (e < 0 || e >= p.n_expert) {
#pragma unroll
        for (int i = 0; i < TM; i++)
            if (lane == 0 && i < np)
                p.y[(int64_t)pairs[i] * p.n_embd + r] = NAN;
        return;
    }
    const uint8_t *dr = moe_expert(p.down, p.down_stride, p.down_ptrs, e) + r * p.down_row;
    float acc[TM];
#pragma unroll
    for (int i = 0; i < TM; i++)
        acc[i] = 0.0f;
    const int64_t ng = moe_cdiv(p.n_ff, CQ_GROUP);
    for (int64_t g = 0; g < ng; g++) {
        cq_step<WT> st;
        if (st.load(dr, p.n_ff, g, lane)) {
#pragma unroll
            for (int i = 0; i < TM; i++)
                acc[i] = st.dot(p.h + (int64_t)pairs[i] * p.n_ff, acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < TM; i++) {
        float s = moe_down_b(p, e, r, ops_warp_sum(acc[i]));
        if (lane == 0 && i < np)
            p.y[(int64_t)pairs[i] * p.n_embd + r] = __fmul_rn(p.wts[pairs[i]], s);
    }
}

/* Grouped path: out[t, r] = sum_j y[t*k + j, r], j in order (the direct path's sum). */
static __global__ void k_moe_combine(struct moe_params p)
{
    ops_pdl_begin();
    const int64_t total = (int64_t)p.n_tok * p.n_embd;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / p.n_embd, r = i - t * p.n_embd;
        float s = 0.0f;
        for (int j = 0; j < p.k; j++)
            s = __fadd_rn(s, p.y[(t * p.k + j) * p.n_embd + r]);
        p.out[t * p.out_stride + r] = s;
    }
}

/* ---- 8-bit direct path (decode) ----------------------------------------------------------------
 * For Q4_K, Q6_K and MXFP4 weights the direct path runs on integer dot products, as the CPU
 * backend and
 * cuda_matmul's MMV do: each block first quantizes its activation rows into shared memory (8-bit
 * codes with one float scale per 32 elements, q = rint(x / d), d = max|x| / 127, and d times the
 * sum of the codes), then a lane takes one 32-element unit of a weight row at a time, dots its
 * codes with __dp4a and scales the integer sum once (16-byte loads where rows allow; this beat
 * cq_decoder's neighbouring-bytes layout and its many 2-byte loads). Far fewer instructions
 * than decoding every weight to float (the float direct kernels are instruction-bound); the
 * error is the activation rounding's (about 0.4% rms per unit), the same as the CPU backend's.
 * gpt-oss's biases and clamped SwiGLU apply to the unit sums as on the float paths (moe_h; down:
 * w_j b_j added per row after the units, j in order). Measurements: docs/cuda-ops.md. */

#define MOE_Q8_GU_WARPS 16 /* gate/up: 16 warps of 2 rows, one 32-row unit of h per block */
#define MOE_Q8_GU_ROWS 32
#ifndef MOE_Q6_WORDS
#define MOE_Q6_WORDS 1 /* Q6_K bits by aligned four-byte words (moe_q8_unit<QUANT_Q6_K>) */
#endif
#ifndef MOE_Q8_DN_SPLIT
#define MOE_Q8_DN_SPLIT                                                                            \
    2 /* down: warps per row, each taking every 2nd expert (k = 8 experts of                       \
       * 24 units at 768 inputs: 96 unit steps per warp, every lane busy) */
#endif
#define MOE_Q8_DN_ROWS (MOE_WARPS / MOE_Q8_DN_SPLIT)
#define MOE_Q8_MAX_SMEM (48 * 1024)
#define MOE_B8_GU_STAGES 4 /* gate/up: barriers, each for 8 gate and 8 up rows (4 warps' rows) */
#define MOE_B8_DN_ROWS 8   /* down: output rows per block, MOE_Q8_DN_SPLIT warps each */
#define MOE_B8_DN_THREADS (MOE_B8_DN_ROWS * MOE_Q8_DN_SPLIT * 32)
#define MOE_B8_PAD 16 /* shared bytes past the last row: an MXFP4 unit's aligned words */
#define MOE_B8_AUTO_SMEM (110 * 1024) /* the automatic choice: two gate/up blocks per SM */

static constexpr bool moe_q8_type(uint32_t t)
{
    return t == QUANT_Q4_K || t == QUANT_Q6_K || t == QUANT_MXFP4;
}

/* bytes of the 8-bit copy of n_rows rows of n elements: codes, then (d, d * sum) per unit */
static __host__ __device__ __forceinline__ uint64_t moe_q8_bytes(int64_t n_rows, int64_t n)
{
    return (uint64_t)n_rows * n + (uint64_t)n_rows * (n / 32) * 8;
}

/* Quantizes n_rows rows of n floats (n a multiple of 32; src row i at src[i]) into qs (codes,
 * row after row) and ds ((d, d * sum) per 32-element unit). Every thread of the block takes
 * part; four neighbouring threads share a unit (8 elements each). A warp runs the loop while any
 * of its lanes has elements (the shuffles need the whole warp), lanes past the end on zeros
 * that they do not store. Ends with a barrier. */
static __device__ __forceinline__ void moe_q8_quantize(const float *const *src, int n_rows,
                                                       int64_t n, int8_t *qs, float2 *ds)
{
    const int64_t total = (int64_t)n_rows * n, lane8 = 8 * (int64_t)(threadIdx.x & 31);
    for (int64_t i = 8 * (int64_t)threadIdx.x; i - lane8 < total; i += 8 * (int64_t)blockDim.x) {
        const bool in = i < total;
        const int64_t row = in ? i / n : 0, c = in ? i - row * n : 0;
        const float4 *x = (const float4 *)(src[row] + c);
        const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f), a = in ? x[0] : z, b = in ? x[1] : z;
        float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        float amax = 0.0f;
#pragma unroll
        for (int t = 0; t < 8; t++)
            amax = fmaxf(amax, fabsf(v[t]));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        uint32_t w[2] = {0, 0};
#pragma unroll
        for (int t = 0; t < 8; t++) {
            const int q = __float2int_rn(v[t] * id);
            sum += q;
            w[t / 4] |= (uint32_t)(q & 0xFF) << 8 * (t % 4);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (!in)
            continue;
        *(uint2 *)(qs + i) = make_uint2(w[0], w[1]);
        if ((threadIdx.x & 3) == 0)
            ds[i / 32] = make_float2(d, d * (float)sum);
    }
    __syncthreads();
}

template <uint32_t WT> struct moe_q8_unit;

/* the 32 activation codes of unit u, 4 per word (two 16-byte loads) */
static __device__ __forceinline__ void moe_q8_x(const int8_t *xq, int64_t u, int *xs)
{
    const int4 x0 = *(const int4 *)(xq + 32 * u), x1 = *(const int4 *)(xq + 32 * u + 16);
    xs[0] = x0.x, xs[1] = x0.y, xs[2] = x0.z, xs[3] = x0.w;
    xs[4] = x1.x, xs[5] = x1.y, xs[6] = x1.z, xs[7] = x1.w;
}

/* the integer dot product of a unit's 32 weight codes q (4 per word) with unit u's codes */
static __device__ __forceinline__ int moe_q8_dot(const uint32_t *q, const int8_t *xq, int64_t u)
{
    int xs[8];
    moe_q8_x(xq, u, xs);
    int dot = 0;
#pragma unroll
    for (int i = 0; i < 8; i++)
        dot = __dp4a((int)q[i], xs[i], dot);
    return dot;
}

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

/* Q4_K unit u = sub-block j = u % 8 of block u / 8: codes are the low (j even) or high nibbles
 * of qs[32 (j / 2) ..], value d sc q - dmin m. A unit is loaded once (load16 on a 16-byte
 * aligned row: three 16-byte loads, header and 32 code bytes; load elsewhere) and applied to
 * one or more activation rows: dot = load + apply, the arithmetic every 8-bit kernel shares. */
template <> struct moe_q8_unit<QUANT_Q4_K> {
    static constexpr bool A16 = true; /* 144-byte blocks: 16-byte aligned rows stay aligned */
    struct w {
        uint32_t q[8]; /* the unit's 32 codes, 4 per word */
        float dsc, dm; /* d sc and dmin m */
    };

    static __device__ __forceinline__ w load16(const uint8_t *row, int64_t u)
    {
        const uint8_t *b = row + (u / 8) * 144;
        const int j = (int)(u % 8);
        const uint4 hd = *(const uint4 *)b;
        const uint4 q0 = *(const uint4 *)(b + 16 + 32 * (j / 2)),
                    q1 = *(const uint4 *)(b + 32 + 32 * (j / 2));
        int sc, m;
        moe_q4k_scale_min(hd, j, &sc, &m);
        const int sh = 4 * (j & 1);
        const uint32_t q[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
        w r;
#pragma unroll
        for (int i = 0; i < 8; i++)
            r.q[i] = (q[i] >> sh) & 0x0F0F0F0Fu;
        r.dsc = cq_f16(hd.x & 0xFFFF) * (float)sc;
        r.dm = cq_f16(hd.x >> 16) * (float)m;
        return r;
    }

    static __device__ __forceinline__ w load(const uint8_t *row, int64_t u)
    {
        const uint8_t *b = row + (u / 8) * 144;
        const int j = (int)(u % 8);
        int sc, m;
        cq_k4_scale_min(b + 4, j, &sc, &m);
        const uint8_t *q = b + 16 + 32 * (j / 2);
        const int sh = 4 * (j & 1);
        w r;
#pragma unroll
        for (int i = 0; i < 8; i++)
            r.q[i] = (cq_ld_u32_a2(q + 4 * i) >> sh) & 0x0F0F0F0Fu;
        r.dsc = cq_f16(cq_ld_u16(b)) * (float)sc;
        r.dm = cq_f16(cq_ld_u16(b + 2)) * (float)m;
        return r;
    }

    static __device__ __forceinline__ float apply(const w &wu, int64_t u, const int8_t *xq,
                                                  const float2 *xd, float acc)
    {
        const int dot = moe_q8_dot(wu.q, xq, u);
        const float2 x = xd[u];
        return acc + wu.dsc * x.x * (float)dot - wu.dm * x.y;
    }

    static __device__ __forceinline__ float dot16(const uint8_t *row, int64_t u, const int8_t *xq,
                                                  const float2 *xd, float acc)
    {
        return apply(load16(row, u), u, xq, xd, acc);
    }

    static __device__ __forceinline__ float dot(const uint8_t *row, int64_t u, const int8_t *xq,
                                                const float2 *xd, float acc)
    {
        return apply(load(row, u), u, xq, xd, acc);
    }
};

/* Q6_K unit u = elements 32 s .. of half h (s8 = u % 8 = 4 h + s) of block u / 8: low bits in
 * ql[64 h + 32 (s % 2) ..] (nibble s / 2), high bits 2 s of qh[32 h ..], scales 8 h + 2 s and
 * + 1 for its two halves of 16; value d sc (q - 32). */
template <> struct moe_q8_unit<QUANT_Q6_K> {
    static constexpr bool A16 = false; /* 210-byte blocks */
    struct w {
        uint32_t q[8]; /* the unit's 32 codes minus 32, 4 per word */
        int sc0, sc1;  /* the scales of its two halves */
        float d;
    };

    /* The 8 little-endian words at the 2-byte aligned p (32 bytes of ql or qh) from the 9
     * aligned words around them: 9 four-byte loads and 8 funnel shifts instead of 16 two-byte
     * loads (the same words). MOE_Q6_WORDS=0, a build setting for comparisons, takes the
     * two-byte loads: slower on the 30b-a3b preset in one lease (tg128 328.8 / 329.5 against
     * 331.6 / 332.1, lockstep 8 streams 748.9 / 757.2 against 780.8 / 777.2, pp64 -3.7%;
     * bench/lockstep.md). The words read past the 32 bytes stay inside the 210-byte block (ql
     * and qh are followed by qh, the scales and d) or, before it, in the block before, which
     * exists where p is not 4-byte aligned (a tensor starts aligned). */
    static __device__ __forceinline__ void words8(const uint8_t *p, uint32_t *out)
    {
        const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
        const uint32_t sh = (uint32_t)((uintptr_t)p & 2) * 8;
        uint32_t v[9];
#pragma unroll
        for (int i = 0; i < 9; i++)
            v[i] = a[i];
#pragma unroll
        for (int i = 0; i < 8; i++)
            out[i] = __funnelshift_r(v[i], v[i + 1], sh);
    }

    static __device__ __forceinline__ w load(const uint8_t *row, int64_t u)
    {
        const uint8_t *b = row + (u / 8) * 210;
        const int s8 = (int)(u % 8), h = s8 / 4, s = s8 % 4;
        const uint8_t *ql = b + 64 * h + 32 * (s % 2), *qh = b + 128 + 32 * h;
        const int shl = 4 * (s / 2), shh = 2 * s;
        w r;
        uint32_t lw[8], hw[8];
        if (MOE_Q6_WORDS) {
            words8(ql, lw);
            words8(qh, hw);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) {
                lw[i] = cq_ld_u32_a2(ql + 4 * i);
                hw[i] = cq_ld_u32_a2(qh + 4 * i);
            }
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t lo = (lw[i] >> shl) & 0x0F0F0F0Fu;
            const uint32_t hi = ((hw[i] >> shh) & 0x03030303u) << 4;
            r.q[i] = __vsub4(lo | hi, 0x20202020u);
        }
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * h + 2 * s;
        r.sc0 = sc[0];
        r.sc1 = sc[1];
        r.d = cq_f16(cq_ld_u16(b + 208));
        return r;
    }

    static __device__ __forceinline__ float apply(const w &wu, int64_t u, const int8_t *xq,
                                                  const float2 *xd, float acc)
    {
        int xs[8];
        moe_q8_x(xq, u, xs);
        int dot[2] = {0, 0};
#pragma unroll
        for (int i = 0; i < 8; i++)
            dot[i / 4] = __dp4a((int)wu.q[i], xs[i], dot[i / 4]);
        return acc + wu.d * xd[u].x * (float)(wu.sc0 * dot[0] + wu.sc1 * dot[1]);
    }

    static __device__ __forceinline__ float dot(const uint8_t *row, int64_t u, const int8_t *xq,
                                                const float2 *xd, float acc)
    {
        return apply(load(row, u), u, xq, xd, acc);
    }
};

/* MXFP4 unit u = block u (17 bytes: an E8M0 scale, then 16 bytes whose low nibbles are elements
 * 0..15 and high nibbles 16..31), value 2^(e - 128) c with c the E2M1 code doubled, an integer
 * in -12..12 (cq_e2m1_doubled). The 16 code bytes sit at any alignment (rows of 17-byte blocks):
 * they are read as the four or five aligned words that hold them and shifted into place, so a
 * load may read up to 3 bytes past the block's end, inside the aligned word that holds its last
 * byte. The codes become signed bytes by two byte permutes (positive and negative magnitudes)
 * selected by each nibble's sign bit. */
template <> struct moe_q8_unit<QUANT_MXFP4> {
    static constexpr bool A16 = false;
    struct w {
        uint32_t q[8]; /* elements 0..15 in q[0..3], 16..31 in q[4..7], 4 per word */
        float d;
    };

    /* the doubled E2M1 values of four nibbles (one in the low half of each byte) */
    static __device__ __forceinline__ uint32_t codes4(uint32_t nib)
    {
        const uint32_t m = nib & 0x07070707u, s = m | (m >> 4);
        const uint32_t sel = (s & 0xFFu) | ((s >> 8) & 0xFF00u);
        const uint32_t pos = __byte_perm(0x03020100u, 0x0C080604u, sel); /* 0 1 2 3 4 6 8 12 */
        const uint32_t neg = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, sel); /* their negatives */
        const uint32_t sg = ((nib & 0x08080808u) >> 3) * 0xFFu;          /* 0xFF: negative */
        return (pos & ~sg) | (neg & sg);
    }

    static __device__ __forceinline__ w load(const uint8_t *row, int64_t u)
    {
        const uint8_t *b = row + u * 17;
        const uintptr_t a = (uintptr_t)(b + 1);
        const uint32_t *p = (const uint32_t *)(a & ~(uintptr_t)3);
        const uint32_t sh = 8u * (uint32_t)(a & 3);
        uint32_t x[5];
#pragma unroll
        for (int i = 0; i < 4; i++)
            x[i] = p[i];
        x[4] = sh ? p[4] : 0u;
        w r;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t q = __funnelshift_r(x[i], x[i + 1], sh);
            r.q[i] = codes4(q & 0x0F0F0F0Fu);
            r.q[4 + i] = codes4((q >> 4) & 0x0F0F0F0Fu);
        }
        r.d = cq_e8m0_half(*b);
        return r;
    }

    static __device__ __forceinline__ float apply(const w &wu, int64_t u, const int8_t *xq,
                                                  const float2 *xd, float acc)
    {
        const int dot = moe_q8_dot(wu.q, xq, u);
        return acc + wu.d * xd[u].x * (float)dot;
    }

    static __device__ __forceinline__ float dot(const uint8_t *row, int64_t u, const int8_t *xq,
                                                const float2 *xd, float acc)
    {
        return apply(load(row, u), u, xq, xd, acc);
    }
};

/* unit u of a row: by 16-byte loads where the type has them (A16) and the row is aligned */
template <uint32_t WT>
static __device__ __forceinline__ typename moe_q8_unit<WT>::w moe_q8_load(const uint8_t *row,
                                                                          int64_t u, bool a16)
{
    if constexpr (moe_q8_unit<WT>::A16)
        if (a16)
            return moe_q8_unit<WT>::load16(row, u);
    return moe_q8_unit<WT>::load(row, u);
}

/* One gate row and one up row dotted with x's codes by a warp, lane l taking units l, l + 32,
 * ... (16-byte loads where the type has them and both rows are aligned; not unrolled:
 * unrolling measured slower, docs/cuda-ops.md): the warp's two sums, on every lane. */
template <uint32_t WT>
static __device__ __forceinline__ float2 moe_q8_gu_row(const uint8_t *gr, const uint8_t *ur,
                                                       int64_t nu, int lane, const int8_t *xq,
                                                       const float2 *xd)
{
    float ag = 0.0f, au = 0.0f;
    bool done = false;
    if constexpr (moe_q8_unit<WT>::A16) {
        if ((((uintptr_t)gr | (uintptr_t)ur) & 15) == 0) {
            for (int64_t u = lane; u < nu; u += 32) {
                ag = moe_q8_unit<WT>::dot16(gr, u, xq, xd, ag);
                au = moe_q8_unit<WT>::dot16(ur, u, xq, xd, au);
            }
            done = true;
        }
    }
    if (!done) {
        for (int64_t u = lane; u < nu; u += 32) {
            ag = moe_q8_unit<WT>::dot(gr, u, xq, xd, ag);
            au = moe_q8_unit<WT>::dot(ur, u, xq, xd, au);
        }
    }
    return make_float2(ops_warp_sum(ag), ops_warp_sum(au));
}

/* The types whose gate/up kernels walk two rows at once (Q6_K's units need too many registers
 * for four in flight: 78 in the direct kernel instead of 57). */
static __host__ __device__ constexpr bool moe_gu2_type(uint32_t t)
{
    return t == QUANT_Q4_K || t == QUANT_MXFP4;
}

/* moe_q8_gu_row for two rows (gate and up rows g0, u0, then g1, u1) in one walk over the units:
 * each unit's activation codes are loaded once for the four dots (the compiler shares the
 * loads within an iteration, not across two walks), every sum in moe_q8_gu_row's order, so the
 * same bits. (g0 sum, u0 sum, g1 sum, u1 sum), on every lane. */
template <uint32_t WT>
static __device__ __forceinline__ float4 moe_q8_gu_rows2(const uint8_t *g0, const uint8_t *u0,
                                                         const uint8_t *g1, const uint8_t *u1,
                                                         int64_t nu, int lane, const int8_t *xq,
                                                         const float2 *xd)
{
    float a0 = 0.0f, b0 = 0.0f, a1 = 0.0f, b1 = 0.0f;
    bool done = false;
    if constexpr (moe_q8_unit<WT>::A16) {
        if ((((uintptr_t)g0 | (uintptr_t)u0 | (uintptr_t)g1 | (uintptr_t)u1) & 15) == 0) {
            for (int64_t u = lane; u < nu; u += 32) {
                a0 = moe_q8_unit<WT>::dot16(g0, u, xq, xd, a0);
                b0 = moe_q8_unit<WT>::dot16(u0, u, xq, xd, b0);
                a1 = moe_q8_unit<WT>::dot16(g1, u, xq, xd, a1);
                b1 = moe_q8_unit<WT>::dot16(u1, u, xq, xd, b1);
            }
            done = true;
        }
    }
    if (!done) {
        for (int64_t u = lane; u < nu; u += 32) {
            a0 = moe_q8_unit<WT>::dot(g0, u, xq, xd, a0);
            b0 = moe_q8_unit<WT>::dot(u0, u, xq, xd, b0);
            a1 = moe_q8_unit<WT>::dot(g1, u, xq, xd, a1);
            b1 = moe_q8_unit<WT>::dot(u1, u, xq, xd, b1);
        }
    }
    return make_float4(ops_warp_sum(a0), ops_warp_sum(b0), ops_warp_sum(a1), ops_warp_sum(b1));
}

/* Four rows' gate and up dots in one walk (k_moe_gate_up_b8 with four rows per warp): g[i],
 * u[i] row i's gate and up rows; out[2 i], out[2 i + 1] its gate and up sums, each the sum
 * moe_q8_gu_row gives (the same units in the same order per lane, the same warp reduction). */
template <uint32_t WT>
static __device__ __forceinline__ void
moe_q8_gu_rows4(const uint8_t *const *g, const uint8_t *const *u, int64_t nu, int lane,
                const int8_t *xq, const float2 *xd, float *out)
{
    float a[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        a[i] = 0.0f;
    bool done = false;
    if constexpr (moe_q8_unit<WT>::A16) {
        uintptr_t al = 0;
#pragma unroll
        for (int i = 0; i < 4; i++)
            al |= (uintptr_t)g[i] | (uintptr_t)u[i];
        if ((al & 15) == 0) {
            for (int64_t v = lane; v < nu; v += 32)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    a[2 * i] = moe_q8_unit<WT>::dot16(g[i], v, xq, xd, a[2 * i]);
                    a[2 * i + 1] = moe_q8_unit<WT>::dot16(u[i], v, xq, xd, a[2 * i + 1]);
                }
            done = true;
        }
    }
    if (!done)
        for (int64_t v = lane; v < nu; v += 32)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                a[2 * i] = moe_q8_unit<WT>::dot(g[i], v, xq, xd, a[2 * i]);
                a[2 * i + 1] = moe_q8_unit<WT>::dot(u[i], v, xq, xd, a[2 * i + 1]);
            }
#pragma unroll
    for (int i = 0; i < 8; i++)
        out[i] = ops_warp_sum(a[i]);
}

/* A warp writes 32 values of h (lane i holding value i) as unit hu of codes, as
 * moe_q8_quantize does. */
static __device__ __forceinline__ void moe_q8_h_unit(const struct moe_params &p, int64_t hu,
                                                     float v, int lane)
{
    const float amax = ops_warp_max(fabsf(v));
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int q = __float2int_rn(v * id);
    p.hq[hu * 32 + lane] = (int8_t)q;
    const int sum = __reduce_add_sync(0xffffffffu, q);
    if (lane == 0)
        p.hd[hu] = make_float2(amax / 127.0f, amax / 127.0f * (float)sum);
}

/* The block's down rows r0 .. r0 + rows - 1 of token t from the warps' sums (part, badw: warp
 * MOE_Q8_DN_SPLIT r + s for row r), added in order s, then w_j b_j in order j, by threads
 * 0 .. rows - 1. */
static __device__ __forceinline__ void moe_q8_down_store(const struct moe_params &p, int t,
                                                         int64_t r0, int rows, const float *part,
                                                         const int *badw)
{
    if (threadIdx.x >= rows)
        return;
    const int64_t rr = r0 + threadIdx.x;
    float s = 0.0f;
    int anybad = 0;
    for (int i = 0; i < MOE_Q8_DN_SPLIT; i++) {
        s = __fadd_rn(s, part[threadIdx.x * MOE_Q8_DN_SPLIT + i]);
        anybad |= badw[threadIdx.x * MOE_Q8_DN_SPLIT + i];
    }
    if (p.down_b && !anybad && rr < p.n_embd) /* sum_j w_j b_j, j in order */
        for (int j = 0; j < p.k; j++) {
            const int64_t pr = (int64_t)t * p.k + j;
            s = fmaf(p.wts[pr], p.down_b[(int64_t)p.ids[pr] * p.n_embd + rr], s);
        }
    if (rr < p.n_embd)
        p.out[(int64_t)t * p.out_stride + rr] = anybad ? NAN : s;
}

/* direct gate/up on codes: block (pair, MOE_Q8_GU_ROWS rows), warp w rows 2w and 2w + 1. The
 * block's 32 values of h are then quantized (one unit of codes for the down kernel). */
template <uint32_t WT>
static __global__ void __launch_bounds__(MOE_Q8_GU_WARPS * 32) k_moe_gate_up_q8(struct moe_params p)
{
    ops_pdl_begin();
    extern __shared__ __align__(16) uint8_t moe_smem[];
    __shared__ float hs[MOE_Q8_GU_ROWS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, pair = blockIdx.x;
    const int e = p.ids[pair];
    const int64_t rb = (int64_t)blockIdx.y * MOE_Q8_GU_ROWS, r0 = rb + 2 * warp;
    const int64_t hu = ((int64_t)pair * p.n_ff + rb) / 32; /* the block's unit of h */
    if (e < 0 || e >= p.n_expert) { /* uniform over the block: no barrier below is reached */
        if (warp == 0) {
            p.hq[hu * 32 + lane] = 0;
            if (lane == 0)
                p.hd[hu] = make_float2(NAN, NAN);
        }
        return;
    }
    const uint8_t *gb = moe_expert(p.gate, p.gate_stride, p.gate_ptrs, e);
    const uint8_t *ub = moe_expert(p.up, p.up_stride, p.up_ptrs, e);
    if (threadIdx.x == 0) { /* the block's rows of gate and up, on their way to L2 while x is
                             * quantized (prefetching the down rows here as well measured
                             * slower: bench/cuda-resident.md) */
        const int64_t re = min(rb + MOE_Q8_GU_ROWS, p.n_ff);
        ops_l2_prefetch(gb + rb * p.gate_row, gb + re * p.gate_row);
        ops_l2_prefetch(ub + rb * p.up_row, ub + re * p.up_row);
    }
    const int64_t nu = p.n_embd / 32, t = pair / p.k;
    const int8_t *xq = p.in_q8 + t * p.n_embd;
    const float2 *xd = p.in_q8_d + t * nu;
    if (!p.in_q8) { /* quantized here, into shared memory */
        int8_t *sq = (int8_t *)moe_smem;
        float2 *sd = (float2 *)(moe_smem + p.n_embd);
        const float *src = p.in + t * p.in_stride;
        moe_q8_quantize(&src, 1, p.n_embd, sq, sd);
        xq = sq;
        xd = sd;
    }
    if (moe_gu2_type(WT) && p.gu2) {
        const float4 gu = moe_q8_gu_rows2<WT>(gb + r0 * p.gate_row, ub + r0 * p.up_row,
                                              gb + (r0 + 1) * p.gate_row, ub + (r0 + 1) * p.up_row,
                                              nu, lane, xq, xd);
        if (lane == 0) {
            hs[2 * warp] = moe_h(p, e, r0, gu.x, gu.y);
            hs[2 * warp + 1] = moe_h(p, e, r0 + 1, gu.z, gu.w);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int64_t r = r0 + i;
            const float2 gu =
                moe_q8_gu_row<WT>(gb + r * p.gate_row, ub + r * p.up_row, nu, lane, xq, xd);
            if (lane == 0)
                hs[2 * warp + i] = moe_h(p, e, r, gu.x, gu.y);
        }
    }
    __syncthreads();
    if (warp == 0)
        moe_q8_h_unit(p, hu, hs[lane], lane);
}

/* direct down on codes: block (token, MOE_Q8_DN_ROWS rows); MOE_Q8_DN_SPLIT warps per row, warp
 * s taking experts s, s + MOE_Q8_DN_SPLIT, ... with its lanes walking their (expert, unit)
 * pairs, each unit's integer dot scaled by w_j; the warps' sums are added in order s
 * (deterministic). */
template <uint32_t WT>
static __global__ void __launch_bounds__(MOE_WARPS * 32) k_moe_down_q8(struct moe_params p)
{
    ops_pdl_begin();
    __shared__ float part[MOE_WARPS];
    __shared__ int badw[MOE_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = blockIdx.x;
    const int sub = warp % MOE_Q8_DN_SPLIT, rl = warp / MOE_Q8_DN_SPLIT;
    const int64_t r0 = (int64_t)blockIdx.y * MOE_Q8_DN_ROWS, r = r0 + rl;
    const int nu = (int)(p.n_ff / 32);
    float acc = 0.0f;
    bool bad = false;
    if (r < p.n_embd) {
        /* (expert, unit) steps in turn, no divisions: j advances when u passes the row's end */
        int j = sub, u = lane;
        while (u >= nu && j < p.k)
            u -= nu, j += MOE_Q8_DN_SPLIT;
#pragma unroll 2
        for (; j < p.k;) {
            const int64_t pr = (int64_t)t * p.k + j;
            const int e = p.ids[pr];
            if (e < 0 || e >= p.n_expert) {
                bad = true;
            } else {
                const uint8_t *dr =
                    moe_expert(p.down, p.down_stride, p.down_ptrs, e) + r * p.down_row;
                const float s =
                    moe_q8_unit<WT>::dot(dr, u, p.hq + pr * p.n_ff, p.hd + pr * nu, 0.0f);
                acc = fmaf(p.wts[pr], s, acc);
            }
            u += 32;
            while (u >= nu && j < p.k)
                u -= nu, j += MOE_Q8_DN_SPLIT;
        }
    }
    acc = ops_warp_sum(acc);
    bad = __any_sync(0xffffffffu, bad);
    if (lane == 0) {
        part[warp] = acc;
        badw[warp] = bad;
    }
    __syncthreads();
    moe_q8_down_store(p, t, r0, MOE_Q8_DN_ROWS, part, badw);
}

/* ---- bulk 8-bit path (decode, lockstep steps) --------------------------------------------------
 * The direct path's arithmetic with each block's weight rows brought into shared memory by bulk
 * copies (cp.async.bulk, the copy engine of compute capability 9.0) before any dot: one
 * instruction moves a block's rows, so every row of the call is in flight at once instead of a
 * warp's next units waiting on its last ones. Gate/up: block (pair, MOE_Q8_GU_ROWS rows), and
 * only the first pair of each expert does work, for every pair that chose that expert (their h
 * as the direct kernel computes it, bit for bit). Down: block (token, MOE_B8_DN_ROWS rows) with
 * the direct kernel's warps and sums; its copies are issued before it waits on gate/up (the ids
 * come from the router's kernel before gate/up, finished once gate/up runs), so the down rows
 * stream in while gate/up computes. Rows that are not 16-byte aligned are copied by the
 * block's threads instead (and on devices without bulk copies). */

static __device__ __forceinline__ uint32_t moe_smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* Whether this device code has bulk copies; the host also asks the device (moe_bulk_ok). */
static __device__ __forceinline__ bool moe_bulk_dev(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return true;
#else
    return false;
#endif
}

/* mbarrier bar (one arrival expected) made visible to the bulk copies. One thread. */
static __device__ __forceinline__ void moe_bar_init(uint64_t *bar)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(moe_smem_u32(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
    (void)bar;
#endif
}

/* The one arrival on bar, announcing bytes to come by bulk copies. */
static __device__ __forceinline__ void moe_bar_expect(uint64_t *bar, uint32_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(moe_smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
#else
    (void)bar;
    (void)bytes;
#endif
}

/* bytes (a multiple of 16, both addresses 16-byte aligned) from global src to shared dst,
 * counted on bar. */
static __device__ __forceinline__ void moe_bulk_copy(void *dst, const void *src, uint32_t bytes,
                                                     uint64_t *bar)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                 "%2, [%3];" ::"r"(moe_smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(moe_smem_u32(bar))
                 : "memory");
#else
    (void)dst;
    (void)src;
    (void)bytes;
    (void)bar;
#endif
}

/* Waits until bar's first phase completes (its copies have landed). */
static __device__ __forceinline__ void moe_bar_wait(uint64_t *bar)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t done = 0;
    while (!done)
        asm volatile(
            "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n\t"
            "selp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done)
            : "r"(moe_smem_u32(bar))
            : "memory");
#else
    (void)bar;
#endif
}

/* A copy the bulk engine can take: 16-byte aligned source and size. */
static __device__ __forceinline__ bool moe_bulk_fits(const void *src, uint64_t bytes)
{
    return moe_bulk_dev() && (((uintptr_t)src | bytes) & 15) == 0;
}

/* The block's threads copy bytes from src to shared dst (byte loads: any alignment). */
static __device__ __forceinline__ void moe_block_copy(uint8_t *dst, const uint8_t *src,
                                                      uint64_t bytes)
{
    for (uint64_t i = threadIdx.x; i < bytes; i += blockDim.x)
        dst[i] = src[i];
}

/* gate/up: block (pair, MOE_Q8_GU_ROWS rows), 16 warps of 2 rows. Shared memory: the 32 gate
 * rows, then the 32 up rows, then MOE_B8_PAD bytes. Pairs are taken 32 at a time from this
 * block's pair on: those of expert e are computed (h per pair into hs), then warp i quantizes
 * pair i's 32 values as k_moe_gate_up_q8 does. */
/* Experts a one-token bulk call selects inside its kernels: at most this many (the shared
 * logits of k_moe_down_b8), k at most 32. */
#define MOE_TOPK_FUSE_MAX 256

/* The k experts of p.logits (ops_topk_select), the block's selection into sids; with write,
 * gate/up's first block also writes ids_w and wts_w. */
static __device__ void moe_topk_select(const struct moe_params &p, float *lv, int *sids, bool write)
{
    ops_topk_select(p.logits, p.n_expert, p.k, lv, sids, write ? p.ids_w : nullptr,
                    write ? p.wts_w : nullptr);
}

template <uint32_t WT, int RW = 2, int TR = MOE_Q8_GU_ROWS>
static __global__ void __launch_bounds__(TR / RW * 32, TR<MOE_Q8_GU_ROWS ? 4 : RW> 2 ? 2 : 1)
    k_moe_gate_up_b8(struct moe_params p)
{
    constexpr int W = TR / RW; /* warps: RW rows (gate and up) each */
    /* TR = 16: the two blocks of a 32-row unit of h form a cluster (moe_gu16) */
    constexpr bool HALF = TR < MOE_Q8_GU_ROWS;
    static_assert(TR == MOE_Q8_GU_ROWS || 2 * TR == MOE_Q8_GU_ROWS, "a unit of h in 1 or 2 blocks");
    static_assert(W % MOE_B8_GU_STAGES == 0, "whole stages per warp group");
    ops_pdl_begin();
    extern __shared__ __align__(128) uint8_t moe_smem[];
    __shared__ __align__(8) uint64_t bar[MOE_B8_GU_STAGES];
    __shared__ __align__(16) float hs[32][TR];
    __shared__ int list[32], sids[32];
    __shared__ int n_list, bulk;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, pair = blockIdx.x;
    if (p.logits) /* hs holds the logits until the first barrier of the loop below */
        moe_topk_select(p, &hs[0][0], sids, blockIdx.x == 0 && blockIdx.y == 0);
    const int32_t *ids = p.logits ? sids : p.ids;
    const int e = ids[pair];
    const int64_t rb = (int64_t)blockIdx.y * TR;
    const int64_t ub = rb / 32 * 32; /* the first row of rb's unit of h */
    if (e < 0 || e >= p.n_expert) {  /* uniform over the block (and cluster): as k_moe_gate_up_q8 */
        if (warp == 0 && rb == ub) {
            const int64_t hu = ((int64_t)pair * p.n_ff + ub) / 32;
            p.hq[hu * 32 + lane] = 0;
            if (lane == 0)
                p.hd[hu] = make_float2(NAN, NAN);
        }
        return;
    }
    /* the first pair of expert e does the work of all of e's pairs */
    int dup = 0;
    for (int q = threadIdx.x; q < pair; q += blockDim.x)
        dup |= ids[q] == e;
    const uint8_t *gb = moe_expert(p.gate, p.gate_stride, p.gate_ptrs, e) + rb * p.gate_row;
    const uint8_t *upb = moe_expert(p.up, p.up_stride, p.up_ptrs, e) + rb * p.up_row;
    constexpr int SR = TR / MOE_B8_GU_STAGES; /* rows per stage */
    uint8_t *sg = moe_smem, *su = moe_smem + TR * p.gate_row;
    if (threadIdx.x == 0) {
        const uint64_t gs = SR * p.gate_row, us = SR * p.up_row;
        bulk = moe_bulk_fits(gb, gs) && moe_bulk_fits(upb, us);
        if (bulk)
            for (int s = 0; s < MOE_B8_GU_STAGES; s++)
                moe_bar_init(&bar[s]);
    }
    if (__syncthreads_or(dup))
        return;
    if (bulk) {
        if (threadIdx.x == 0) {
            const uint64_t gs = SR * p.gate_row, us = SR * p.up_row;
            for (int s = 0; s < MOE_B8_GU_STAGES; s++) {
                moe_bar_expect(&bar[s], (uint32_t)(gs + us));
                moe_bulk_copy(sg + s * gs, gb + s * gs, (uint32_t)gs, &bar[s]);
                moe_bulk_copy(su + s * us, upb + s * us, (uint32_t)us, &bar[s]);
            }
        }
    } else {
        moe_block_copy(sg, gb, TR * p.gate_row);
        moe_block_copy(su, upb, TR * p.up_row);
    }
    const int64_t nu = p.n_embd / 32;
    bool waited = !bulk;
    for (int q0 = pair; q0 < p.n_pairs; q0 += 32) {
        if (warp == 0) {
            const int q = q0 + lane;
            const bool m = q < p.n_pairs && ids[q] == e;
            const unsigned b = __ballot_sync(0xffffffffu, m);
            if (m)
                list[__popc(b & ((1u << lane) - 1u))] = q;
            if (lane == 0)
                n_list = __popc(b);
        }
        __syncthreads(); /* also: the block copy above has landed */
        const int nl = n_list;
        if (nl > 0 && !waited) {
            moe_bar_wait(&bar[warp / (W / MOE_B8_GU_STAGES)]);
            waited = true;
        }
        for (int pi = 0; pi < nl; pi++) { /* no pairs: straight to the barriers below */
            const int pr = list[pi];
            const int64_t t = pr / p.k;
            const int8_t *xq = p.in_q8 + t * p.n_embd;
            const float2 *xd = p.in_q8_d + t * nu;
            if constexpr (RW == 4) {
                const uint8_t *g[4], *u[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    g[i] = sg + (4 * warp + i) * p.gate_row;
                    u[i] = su + (4 * warp + i) * p.up_row;
                }
                float gu[8];
                moe_q8_gu_rows4<WT>(g, u, nu, lane, xq, xd, gu);
                if (lane == 0)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        hs[pi][4 * warp + i] =
                            moe_h(p, e, rb + 4 * warp + i, gu[2 * i], gu[2 * i + 1]);
            } else if (moe_gu2_type(WT) && p.gu2) {
                const int64_t rl = 2 * warp;
                const float4 gu = moe_q8_gu_rows2<WT>(sg + rl * p.gate_row, su + rl * p.up_row,
                                                      sg + (rl + 1) * p.gate_row,
                                                      su + (rl + 1) * p.up_row, nu, lane, xq, xd);
                if (lane == 0) {
                    hs[pi][rl] = moe_h(p, e, rb + rl, gu.x, gu.y);
                    hs[pi][rl + 1] = moe_h(p, e, rb + rl + 1, gu.z, gu.w);
                }
            } else {
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int64_t rl = 2 * warp + i;
                    const float2 gu = moe_q8_gu_row<WT>(sg + rl * p.gate_row, su + rl * p.up_row,
                                                        nu, lane, xq, xd);
                    if (lane == 0)
                        hs[pi][rl] = moe_h(p, e, rb + rl, gu.x, gu.y);
                }
            }
        }
        if constexpr (HALF) {
            /* the lower block of the cluster writes the unit: its 16 values, then the upper
             * block's from that block's shared memory (both blocks have the same pairs) */
            cg::cluster_group cl = cg::this_cluster();
            cl.sync();
            if (rb == ub) {
                const float *up16 = cl.map_shared_rank(&hs[0][0], cl.block_rank() ^ 1u);
                for (int pi = warp; pi < nl; pi += W)
                    moe_q8_h_unit(p, ((int64_t)list[pi] * p.n_ff + ub) / 32,
                                  lane < TR ? hs[pi][lane] : up16[pi * TR + lane - TR], lane);
            }
            cl.sync(); /* the upper block's hs read; list, n_list and hs are reused */
        } else {
            __syncthreads();
            for (int pi = warp; pi < nl; pi += W)
                moe_q8_h_unit(p, ((int64_t)list[pi] * p.n_ff + rb) / 32, hs[pi][lane], lane);
            __syncthreads(); /* list, n_list and hs are reused */
        }
    }
}

/* down: block (token, MOE_B8_DN_ROWS rows); shared memory holds the rows of the token's k
 * experts (expert j's MOE_B8_DN_ROWS rows at j * MOE_B8_DN_ROWS * down_row). The warps, their
 * (expert, unit) walk and the sums are k_moe_down_q8's, so the outputs are its bits. */
template <uint32_t WT>
static __global__ void __launch_bounds__(MOE_B8_DN_THREADS, 2) k_moe_down_b8(struct moe_params p)
{
    extern __shared__ __align__(128) uint8_t moe_smem[];
    __shared__ __align__(8) uint64_t bar;
    __shared__ float part[MOE_B8_DN_ROWS * MOE_Q8_DN_SPLIT];
    __shared__ int badw[MOE_B8_DN_ROWS * MOE_Q8_DN_SPLIT];
    __shared__ int bulk, sids[32];
    __shared__ __align__(16) float lv[MOE_TOPK_FUSE_MAX];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = blockIdx.x;
    const int sub = warp % MOE_Q8_DN_SPLIT, rl = warp / MOE_Q8_DN_SPLIT;
    const int64_t r0 = (int64_t)blockIdx.y * MOE_B8_DN_ROWS, r = r0 + rl;
    const uint64_t rows = MOE_B8_DN_ROWS * p.down_row; /* bytes per expert */
    /* before the wait: ids are the router's (done before gate/up began), weights are weights;
     * a call that selects its experts selects them here from the router's logits, as gate/up's
     * blocks did (after the wait, ids are gate/up's copy of the same) */
    if (p.logits)
        moe_topk_select(p, lv, sids, false);
    const int32_t *ids = p.logits ? sids : p.ids;
    if (threadIdx.x == 0) {
        bool ok = true;
        uint32_t bytes = 0;
        for (int j = 0; j < p.k; j++) {
            const int e = ids[(int64_t)t * p.k + j];
            if (e >= 0 && e < p.n_expert) {
                ok = ok &&
                     moe_bulk_fits(
                         moe_expert(p.down, p.down_stride, p.down_ptrs, e) + r0 * p.down_row, rows);
                bytes += (uint32_t)rows;
            }
        }
        bulk = ok;
        if (ok) {
            moe_bar_init(&bar);
            moe_bar_expect(&bar, bytes);
            for (int j = 0; j < p.k; j++) {
                const int e = ids[(int64_t)t * p.k + j];
                if (e >= 0 && e < p.n_expert)
                    moe_bulk_copy(moe_smem + j * rows,
                                  moe_expert(p.down, p.down_stride, p.down_ptrs, e) +
                                      r0 * p.down_row,
                                  (uint32_t)rows, &bar);
            }
        }
    }
    ops_pdl_begin();
    __syncthreads();
    if (bulk) {
        moe_bar_wait(&bar);
    } else {
        for (int j = 0; j < p.k; j++) {
            const int e = p.ids[(int64_t)t * p.k + j];
            if (e >= 0 && e < p.n_expert)
                moe_block_copy(moe_smem + j * rows,
                               moe_expert(p.down, p.down_stride, p.down_ptrs, e) + r0 * p.down_row,
                               rows);
        }
        __syncthreads();
    }
    const int nu = (int)(p.n_ff / 32);
    float acc = 0.0f;
    bool bad = false;
    if (r < p.n_embd) { /* k_moe_down_q8's walk on the shared rows, not unrolled (32 registers:
                         * two blocks of 1024 threads per SM) */
        int j = sub, u = lane;
        while (u >= nu && j < p.k)
            u -= nu, j += MOE_Q8_DN_SPLIT;
#pragma unroll 1
        for (; j < p.k;) {
            const int64_t pr = (int64_t)t * p.k + j;
            const int e = p.ids[pr];
            if (e < 0 || e >= p.n_expert) {
                bad = true;
            } else {
                const uint8_t *dr = moe_smem + (j * MOE_B8_DN_ROWS + rl) * p.down_row;
                const float s =
                    moe_q8_unit<WT>::dot(dr, u, p.hq + pr * p.n_ff, p.hd + pr * nu, 0.0f);
                acc = fmaf(p.wts[pr], s, acc);
            }
            u += 32;
            while (u >= nu && j < p.k)
                u -= nu, j += MOE_Q8_DN_SPLIT;
        }
    }
    acc = ops_warp_sum(acc);
    bad = __any_sync(0xffffffffu, bad);
    if (lane == 0) {
        part[warp] = acc;
        badw[warp] = bad;
    }
    __syncthreads();
    moe_q8_down_store(p, t, r0, MOE_B8_DN_ROWS, part, badw);
}

/* x of every token as 8-bit codes into scratch (xq, xd), for the bulk path when the caller has
 * no copy: block t, row t. */
static __global__ void __launch_bounds__(MOE_SORT_THREADS) k_moe_quant_x(struct moe_params p)
{
    ops_pdl_begin();
    const int t = blockIdx.x;
    const float *src = p.in + (int64_t)t * p.in_stride;
    moe_q8_quantize(&src, 1, p.n_embd, p.xq + (int64_t)t * p.n_embd,
                    p.xd + (int64_t)t * (p.n_embd / 32));
}

/* ---- grouped 8-bit path (lockstep steps) -------------------------------------------------------
 * The direct path reads an expert's weights once per pair that chose it; a step of several
 * streams picks many experts more than once. Here the pairs are sorted by expert (k_moe_sort,
 * tiles of up to MOE_TILE_Q8 pairs of one expert) and each weight unit is loaded once and
 * applied to every pair of its tile. The inputs are quantized once per token into scratch
 * (xq, xd) by the blocks of k_moe_prep_q8 that do not sort. Gate/up performs the direct path's
 * arithmetic per pair (the same load/apply, the same lane order and butterfly), so h, hq and hd
 * equal the direct path's bit for bit; down writes w * (down_e h) per pair to y, each row one
 * warp over its units, and k_moe_combine sums each token's k pairs in order j: the outputs
 * differ from the direct path's by the order of the down sums only (docs/cuda-ops.md). */

#define MOE_TILE_Q8 8 /* pairs per tile on the grouped 8-bit path */

static __device__ void moe_sort_body(const struct moe_params &p);

/* Block 0 sorts the pairs by expert (k_moe_sort's body); block 1 + t quantizes token t's input
 * row into xq / xd. */
static __global__ void __launch_bounds__(MOE_SORT_THREADS) k_moe_prep_q8(struct moe_params p)
{
    ops_pdl_begin();
    if (blockIdx.x == 0) {
        moe_sort_body(p);
        return;
    }
    const int t = blockIdx.x - 1;
    const float *src = p.in + (int64_t)t * p.in_stride;
    moe_q8_quantize(&src, 1, p.n_embd, p.xq + (int64_t)t * p.n_embd,
                    p.xd + (int64_t)t * (p.n_embd / 32));
}

/* gate/up of one tile: block (tile, MOE_Q8_GU_ROWS rows), warp w rows 2w and 2w + 1 for every
 * pair of the tile, then each pair's 32 values of h quantized as k_moe_gate_up_q8 does. With
 * SMEM the tile's input codes are first copied into shared memory (MOE_TILE_Q8 rows of
 * moe_q8_bytes), else read from scratch. */
template <uint32_t WT, bool SMEM>
static __global__ void __launch_bounds__(MOE_Q8_GU_WARPS * 32)
    k_moe_gate_up_gq8(struct moe_params p)
{
    ops_pdl_begin();
    constexpr int TQ = MOE_TILE_Q8;
    extern __shared__ __align__(16) uint8_t moe_smem[];
    __shared__ float hs[TQ][MOE_Q8_GU_ROWS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, w = blockIdx.x;
    if (w >= *p.n_tiles)
        return;
    const int b = p.tile_b[w], np = p.tile_n[w], e = p.tile_e[w];
    const int64_t rb = (int64_t)blockIdx.y * MOE_Q8_GU_ROWS, r0 = rb + 2 * warp;
    const int64_t nu = p.n_embd / 32;
    int pairs[TQ];
    const int8_t *xq[TQ];
    const float2 *xd[TQ];
#pragma unroll
    for (int i = 0; i < TQ; i++) {
        pairs[i] = p.sorted[b + (i < np ? i : 0)];
        const int64_t t = pairs[i] / p.k;
        xq[i] = p.xq + t * p.n_embd;
        xd[i] = p.xd + t * nu;
    }
    if constexpr (SMEM) { /* np is uniform over the block: the barrier is reached by all */
        int8_t *sq = (int8_t *)moe_smem;
        float2 *sd = (float2 *)(moe_smem + (int64_t)TQ * p.n_embd);
        const int64_t n16 = p.n_embd / 16;
        for (int64_t j = threadIdx.x; j < np * n16; j += blockDim.x) {
            const int i = (int)(j / n16);
            const int64_t c = j - i * n16;
            const int64_t t = p.sorted[b + i] / p.k;
            ((int4 *)(sq + i * p.n_embd))[c] = ((const int4 *)(p.xq + t * p.n_embd))[c];
        }
        for (int64_t j = threadIdx.x; j < np * nu; j += blockDim.x) {
            const int i = (int)(j / nu);
            const int64_t c = j - i * nu;
            const int64_t t = p.sorted[b + i] / p.k;
            sd[i * nu + c] = p.xd[t * nu + c];
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < TQ; i++) {
            const int ii = i < np ? i : 0;
            xq[i] = sq + ii * p.n_embd;
            xd[i] = sd + ii * nu;
        }
    }
    if (e < 0 || e >= p.n_expert) { /* uniform over the block: no barrier below is reached */
        if (warp < np) {
            const int64_t hu = ((int64_t)pairs[warp] * p.n_ff + rb) / 32;
            p.hq[hu * 32 + lane] = 0;
            if (lane == 0)
                p.hd[hu] = make_float2(NAN, NAN);
        }
        return;
    }
    const uint8_t *gb = moe_expert(p.gate, p.gate_stride, p.gate_ptrs, e);
    const uint8_t *ub = moe_expert(p.up, p.up_stride, p.up_ptrs, e);
#pragma unroll
    for (int ri = 0; ri < 2; ri++) {
        const int64_t r = r0 + ri;
        const uint8_t *gr = gb + r * p.gate_row, *ur = ub + r * p.up_row;
        float ag[TQ], au[TQ];
#pragma unroll
        for (int i = 0; i < TQ; i++)
            ag[i] = au[i] = 0.0f;
        const bool a16 = moe_q8_unit<WT>::A16 && (((uintptr_t)gr | (uintptr_t)ur) & 15) == 0;
        for (int64_t u = lane; u < nu; u += 32) {
            const typename moe_q8_unit<WT>::w wg = moe_q8_load<WT>(gr, u, a16),
                                              wu = moe_q8_load<WT>(ur, u, a16);
#pragma unroll
            for (int i = 0; i < TQ; i++) {
                if (i < np) {
                    ag[i] = moe_q8_unit<WT>::apply(wg, u, xq[i], xd[i], ag[i]);
                    au[i] = moe_q8_unit<WT>::apply(wu, u, xq[i], xd[i], au[i]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < TQ; i++) {
            if (i < np) {
                const float gs = ops_warp_sum(ag[i]), us = ops_warp_sum(au[i]);
                if (lane == 0)
                    hs[i][2 * warp + ri] = moe_h(p, e, r0 + ri, gs, us);
            }
        }
    }
    __syncthreads();
    if (warp < np) { /* as k_moe_gate_up_q8, one unit per pair */
        const int64_t hu = ((int64_t)pairs[warp] * p.n_ff + rb) / 32;
        moe_q8_h_unit(p, hu, hs[warp][lane], lane);
    }
}

/* down of one tile: block (tile, MOE_WARPS rows), warp w row w for every pair of the tile:
 * y[pair, r] = w_pair * (down_e[r] . h_pair), its lanes walking the row's units. */
template <uint32_t WT>
static __global__ void __launch_bounds__(MOE_WARPS * 32) k_moe_down_gq8(struct moe_params p)
{
    ops_pdl_begin();
    constexpr int TQ = MOE_TILE_Q8;
    const int lane = threadIdx.x & 31, w = blockIdx.x;
    const int64_t r = (int64_t)blockIdx.y * MOE_WARPS + (threadIdx.x >> 5);
    if (w >= *p.n_tiles || r >= p.n_embd)
        return;
    const int b = p.tile_b[w], np = p.tile_n[w], e = p.tile_e[w];
    const int64_t nu = p.n_ff / 32;
    int pairs[TQ];
#pragma unroll
    for (int i = 0; i < TQ; i++)
        pairs[i] = p.sorted[b + (i < np ? i : 0)];
    if (e < 0 || e >= p.n_expert) {
        if (lane < np)
            p.y[(int64_t)p.sorted[b + lane] * p.n_embd + r] = NAN;
        return;
    }
    const uint8_t *dr = moe_expert(p.down, p.down_stride, p.down_ptrs, e) + r * p.down_row;
    const bool a16 = moe_q8_unit<WT>::A16 && ((uintptr_t)dr & 15) == 0;
    float acc[TQ];
#pragma unroll
    for (int i = 0; i < TQ; i++)
        acc[i] = 0.0f;
    for (int64_t u = lane; u < nu; u += 32) {
        const typename moe_q8_unit<WT>::w wd = moe_q8_load<WT>(dr, u, a16);
#pragma unroll
        for (int i = 0; i < TQ; i++)
            if (i < np)
                acc[i] = moe_q8_unit<WT>::apply(wd, u, p.hq + (int64_t)pairs[i] * p.n_ff,
                                                p.hd + (int64_t)pairs[i] * nu, acc[i]);
    }
#pragma unroll
    for (int i = 0; i < TQ; i++) {
        if (i < np) {
            const float s = ops_warp_sum(acc[i]);
            if (lane == 0)
                p.y[(int64_t)pairs[i] * p.n_embd + r] =
                    __fmul_rn(p.wts[pairs[i]], moe_down_b(p, e, r, s));
        }
    }
}

/* ---- tensor-core path (prefill) ------------------------------------------------------------
 * A tile of up to MOE_TILE_MMA pairs of one expert against MMA_ROWS weight rows, in K steps of
 * one decode group (CQ_GROUP elements): the activations (float) and the decoded weights (exactly
 * quant_ref's values) are rounded to bf16 into shared memory and multiplied with WMMA
 * 16x16x16 fragments accumulating in float. Warp w owns the 32 x 32 output block of pair rows
 * 32 (w / 4).. and weight rows 32 (w % 4)..; every output is one fixed sequence of MMAs, so the
 * result is deterministic (but not the float path's bits: docs/cuda-ops.md gives the error). */

#define MMA_ROWS 128           /* weight rows of a tile: 64 gate + 64 up, or 128 down */
#define MMA_LD (CQ_GROUP + 8)  /* padded shared row (bf16 elements) */
#define MMA_CLD (MMA_ROWS + 4) /* padded row of the float result tile */
#define MMA_SMEM ((MOE_TILE_MMA + MMA_ROWS) * MMA_LD * 2)

/* Fast bf16 decoding of a whole group for the types that dominate (Q4_K gate/up, Q6_K down):
 * lane l takes cq_decoder's 8 elements, but builds each pair of bf16 values from its codes
 * with integer operations (bf16 bits 0x4300 | c are exactly 128 + c for c < 128) and finishes
 * them with one exact subtraction and one bf16x2 multiply(-add) by the sub-block's scale (and
 * min) rounded to bf16: no int-to-float conversions. Writes the lane's 8 values into the
 * group's shared row (bf16, 16-byte aligned). */
template <uint32_t WT> struct moe_bf16_group {
    static constexpr bool FAST = false;
    static __device__ __forceinline__ void decode(const uint8_t *, int64_t, int, __nv_bfloat16 *) {}
};

static __device__ __forceinline__ __nv_bfloat162 moe_bf2(uint32_t bits)
{
    return *(const __nv_bfloat162 *)&bits;
}

static __device__ __forceinline__ uint32_t moe_bf2_bits(__nv_bfloat162 v)
{
    return *(const uint32_t *)&v;
}

/* The pairs (byte 0, byte 1) and (byte 2, byte 3) of c (each byte < 128) as bf16x2 128 + c. */
static __device__ __forceinline__ void moe_bf2_codes(uint32_t c, __nv_bfloat162 *p01,
                                                     __nv_bfloat162 *p23)
{
    *p01 = moe_bf2(__byte_perm(c, 0, 0x4140) | 0x43004300u);
    *p23 = moe_bf2(__byte_perm(c, 0, 0x4342) | 0x43004300u);
}

template <> struct moe_bf16_group<QUANT_Q4_K> {
    static constexpr bool FAST = true;
    static __device__ __forceinline__ void decode(const uint8_t *row, int64_t g, int lane,
                                                  __nv_bfloat16 *dst)
    {
        const uint8_t *b = row + g * 144;
        const int m = lane >> 3, o = 4 * (lane & 7);
        const uint32_t w = cq_ld_u32_a2(b + 16 + 32 * m + o);
        int sc0, m0, sc1, m1;
        cq_k4_scale_min(b + 4, 2 * m, &sc0, &m0);
        cq_k4_scale_min(b + 4, 2 * m + 1, &sc1, &m1);
        const float d = cq_f16(cq_ld_u16(b)), dmin = cq_f16(cq_ld_u16(b + 2));
        const __nv_bfloat162 k128 = __float2bfloat162_rn(128.0f);
        const __nv_bfloat162 dl0 = __float2bfloat162_rn(d * (float)sc0),
                             ml0 = __float2bfloat162_rn(-dmin * (float)m0);
        const __nv_bfloat162 dl1 = __float2bfloat162_rn(d * (float)sc1),
                             ml1 = __float2bfloat162_rn(-dmin * (float)m1);
        __nv_bfloat162 a01, a23, b01, b23;
        moe_bf2_codes(w & 0x0F0F0F0Fu, &a01, &a23);
        moe_bf2_codes((w >> 4) & 0x0F0F0F0Fu, &b01, &b23);
        a01 = __hfma2(__hsub2(a01, k128), dl0, ml0);
        a23 = __hfma2(__hsub2(a23, k128), dl0, ml0);
        b01 = __hfma2(__hsub2(b01, k128), dl1, ml1);
        b23 = __hfma2(__hsub2(b23, k128), dl1, ml1);
        *(uint2 *)(dst + 64 * m + o) = make_uint2(moe_bf2_bits(a01), moe_bf2_bits(a23));
        *(uint2 *)(dst + 64 * m + 32 + o) = make_uint2(moe_bf2_bits(b01), moe_bf2_bits(b23));
    }
};

template <> struct moe_bf16_group<QUANT_Q6_K> {
    static constexpr bool FAST = true;
    static __device__ __forceinline__ void decode(const uint8_t *row, int64_t g, int lane,
                                                  __nv_bfloat16 *dst)
    {
        const uint8_t *b = row + g * 210;
        const int h = lane >> 4, s0 = (lane >> 3) & 1, o = 4 * (lane & 7), s1 = s0 + 2;
        const uint32_t wl = cq_ld_u32_a2(b + 64 * h + 32 * s0 + o);
        const uint32_t wh = cq_ld_u32_a2(b + 128 + 32 * h + o);
        const uint32_t c0 = (wl & 0x0F0F0F0Fu) | ((wh >> 2 * s0) & 0x03030303u) << 4;
        const uint32_t c1 = ((wl >> 4) & 0x0F0F0F0Fu) | ((wh >> 2 * s1) & 0x03030303u) << 4;
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * h + o / 16;
        const float d = cq_f16(cq_ld_u16(b + 208));
        const __nv_bfloat162 k160 = __float2bfloat162_rn(160.0f); /* 128 + the offset 32 */
        const __nv_bfloat162 dl0 = __float2bfloat162_rn(d * (float)sc[2 * s0]),
                             dl1 = __float2bfloat162_rn(d * (float)sc[2 * s1]);
        __nv_bfloat162 a01, a23, b01, b23;
        moe_bf2_codes(c0, &a01, &a23);
        moe_bf2_codes(c1, &b01, &b23);
        a01 = __hmul2(__hsub2(a01, k160), dl0);
        a23 = __hmul2(__hsub2(a23, k160), dl0);
        b01 = __hmul2(__hsub2(b01, k160), dl1);
        b23 = __hmul2(__hsub2(b23, k160), dl1);
        const int e0 = 128 * h + 32 * s0 + o;
        *(uint2 *)(dst + e0) = make_uint2(moe_bf2_bits(a01), moe_bf2_bits(a23));
        *(uint2 *)(dst + e0 + 64) = make_uint2(moe_bf2_bits(b01), moe_bf2_bits(b23));
    }
};

/* Q4_K on rows at 16-byte boundaries: lane l of a warp decodes sub-block j = l % 8 (32
 * elements) of group g of its row with three 16-byte loads (header, 32 code bytes), the
 * values built as in moe_bf16_group. */
static __device__ __forceinline__ void moe_bf16_q4k_unit(const uint8_t *row, int64_t g, int j,
                                                         __nv_bfloat16 *dst)
{
    const uint8_t *b = row + g * 144;
    const uint4 hd = *(const uint4 *)b;
    const uint4 q0 = *(const uint4 *)(b + 16 + 32 * (j / 2)),
                q1 = *(const uint4 *)(b + 32 + 32 * (j / 2));
    int sc, m;
    moe_q4k_scale_min(hd, j, &sc, &m);
    const float d = cq_f16(hd.x & 0xFFFF), dmin = cq_f16(hd.x >> 16);
    const __nv_bfloat162 k128 = __float2bfloat162_rn(128.0f);
    const __nv_bfloat162 dl = __float2bfloat162_rn(d * (float)sc),
                         ml = __float2bfloat162_rn(-dmin * (float)m);
    const int sh = 4 * (j & 1);
    const uint32_t q[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    uint32_t out[16];
#pragma unroll
    for (int w = 0; w < 8; w++) {
        __nv_bfloat162 a, c;
        moe_bf2_codes((q[w] >> sh) & 0x0F0F0F0Fu, &a, &c);
        out[2 * w] = moe_bf2_bits(__hfma2(__hsub2(a, k128), dl, ml));
        out[2 * w + 1] = moe_bf2_bits(__hfma2(__hsub2(c, k128), dl, ml));
    }
    uint4 *o = (uint4 *)(dst + 32 * j);
#pragma unroll
    for (int i = 0; i < 4; i++)
        o[i] = make_uint4(out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]);
}

/* x rows (float, NULL: a padding row) and weight rows (NULL: not computed) of one tile, in
 * shared memory, then acc = X W^T over n elements. */
struct mma_tile {
    const float *x[MOE_TILE_MMA];
    const uint8_t *w[MMA_ROWS];
    int a16; /* every weight row starts on a 16-byte boundary */
};

template <uint32_t WT>
static __device__ __forceinline__ void
moe_mma_run(const struct mma_tile &t, int64_t n, __nv_bfloat16 *as, __nv_bfloat16 *bs,
            nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> (&acc)[2][2])
{
    using namespace nvcuda;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = warp / 4, wn = warp % 4;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::fill_fragment(acc[i][j], 0.0f);
    const int64_t ng = moe_cdiv(n, CQ_GROUP);
    for (int64_t g = 0; g < ng; g++) {
        const int64_t k0 = g * CQ_GROUP;
        const int kn = (int)(n - k0 < CQ_GROUP ? n - k0 : CQ_GROUP); /* a multiple of 4 */
        /* activations: 64 rows of CQ_GROUP / 4 float4 each; zeros past the row and for padding */
        for (int i = tid; i < MOE_TILE_MMA * (CQ_GROUP / 4); i += blockDim.x) {
            const int r = i / (CQ_GROUP / 4), c = 4 * (i % (CQ_GROUP / 4));
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (t.x[r] && c < kn)
                v = *(const float4 *)(t.x[r] + k0 + c);
            __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y),
                           hi = __floats2bfloat162_rn(v.z, v.w);
            uint2 u = make_uint2(*(const uint32_t *)&lo, *(const uint32_t *)&hi);
            *(uint2 *)(as + r * MMA_LD + c) = u;
        }
        /* weights: each warp decodes MMA_ROWS / 8 rows, one group each (a row that is not
         * computed decodes the tile's first row again: its columns are discarded), several
         * rows' loads in flight at once; the last, partial group's tail is zeroed first */
        bool fast = false;
        if constexpr (WT == QUANT_Q4_K) {
            if (t.a16) {
#pragma unroll
                for (int step = 0; step < MMA_ROWS / 32; step++) {
                    const int r = (step * 8 + warp) * 4 + lane / 8;
                    moe_bf16_q4k_unit(t.w[r] ? t.w[r] : t.w[0], g, lane % 8, bs + r * MMA_LD);
                }
                fast = true;
            }
        }
        if (!fast) {
            if (kn < CQ_GROUP) {
                for (int r = warp; r < MMA_ROWS; r += 8)
                    for (int c = kn + lane; c < CQ_GROUP; c += 32)
                        bs[r * MMA_LD + c] = __float2bfloat16(0.0f);
                __syncwarp();
            }
#pragma unroll 4
            for (int r = warp; r < MMA_ROWS; r += 8) {
                __nv_bfloat16 *row = bs + r * MMA_LD;
                const uint8_t *src = t.w[r] ? t.w[r] : t.w[0];
                if constexpr (moe_bf16_group<WT>::FAST) {
                    moe_bf16_group<WT>::decode(src, g, lane, row);
                    continue;
                }
                float v[8];
                int64_t a0, a1;
                if (cq_decoder<WT>::decode(src, n, g, lane, v, &a0, &a1)) {
                    __nv_bfloat162 b[4];
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        b[c] = __floats2bfloat162_rn(v[2 * c], v[2 * c + 1]);
                    *(uint2 *)(row + (a0 - k0)) =
                        make_uint2(*(const uint32_t *)&b[0], *(const uint32_t *)&b[1]);
                    *(uint2 *)(row + (a1 - k0)) =
                        make_uint2(*(const uint32_t *)&b[2], *(const uint32_t *)&b[3]);
                }
            }
        }
        __syncthreads();
#pragma unroll 4
        for (int kk = 0; kk < CQ_GROUP; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[2];
#pragma unroll
            for (int i = 0; i < 2; i++)
                wmma::load_matrix_sync(fa[i], as + (wm * 32 + 16 * i) * MMA_LD + kk, MMA_LD);
#pragma unroll
            for (int j = 0; j < 2; j++)
                wmma::load_matrix_sync(fb[j], bs + (wn * 32 + 16 * j) * MMA_LD + kk, MMA_LD);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++)
                    wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }
}

/* The accumulators into the float tile cs (MOE_TILE_MMA x MMA_CLD), which may overlay as/bs:
 * call after moe_mma_run's last barrier; cs is complete after this function's barrier. */
static __device__ __forceinline__ void
moe_mma_store(float *cs,
              nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> (&acc)[2][2])
{
    const int warp = threadIdx.x >> 5, wm = warp / 4, wn = warp % 4;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            nvcuda::wmma::store_matrix_sync(cs + (wm * 32 + 16 * i) * MMA_CLD + wn * 32 + 16 * j,
                                            acc[i][j], MMA_CLD, nvcuda::wmma::mem_row_major);
    __syncthreads();
}

/* The pairs of tile blockIdx.x into pairs[] (shared); returns their number (0: no such tile)
 * and the expert in *e. */
static __device__ __forceinline__ int moe_mma_pairs(const struct moe_params &p, int *pairs, int *e)
{
    const int w = blockIdx.x;
    if (w >= *p.n_tiles)
        return 0;
    const int b = p.tile_b[w], np = p.tile_n[w];
    *e = p.tile_e[w];
    for (int i = threadIdx.x; i < np; i += blockDim.x)
        pairs[i] = p.sorted[b + i];
    __syncthreads();
    return np;
}

/* h[pair, r] = silu(gate_e[r] . x) * (up_e[r] . x) for rows r0 .. r0 + 63 of one tile */
template <uint32_t WT>
static __global__ void __launch_bounds__(256) k_moe_gate_up_mma(struct moe_params p)
{
    ops_pdl_wait();
    extern __shared__ __align__(128) uint8_t moe_smem[];
    __shared__ struct mma_tile t;
    __shared__ int pairs[MOE_TILE_MMA];
    int e;
    const int np = moe_mma_pairs(p, pairs, &e);
    const int64_t r0 = (int64_t)blockIdx.y * (MMA_ROWS / 2);
    if (np == 0)
        return;
    if (e < 0 || e >= p.n_expert) {
        for (int i = threadIdx.x; i < np * (MMA_ROWS / 2); i += blockDim.x) {
            int64_t r = r0 + i % (MMA_ROWS / 2);
            if (r < p.n_ff)
                p.h[(int64_t)pairs[i / (MMA_ROWS / 2)] * p.n_ff + r] = NAN;
        }
        return;
    }
    const uint8_t *gb = moe_expert(p.gate, p.gate_stride, p.gate_ptrs, e);
    const uint8_t *ub = moe_expert(p.up, p.up_stride, p.up_ptrs, e);
    uintptr_t mis = 0;
    for (int i = threadIdx.x; i < MOE_TILE_MMA + MMA_ROWS; i += blockDim.x) {
        if (i < MOE_TILE_MMA) {
            t.x[i] = i < np ? p.in + (int64_t)(pairs[i] / p.k) * p.in_stride : nullptr;
        } else {
            const int j = i - MOE_TILE_MMA, half = MMA_ROWS / 2;
            const int64_t r = r0 + j % half;
            t.w[j] = r >= p.n_ff ? nullptr : (j < half ? gb + r * p.gate_row : ub + r * p.up_row);
            mis |= (uintptr_t)t.w[j] & 15;
        }
    }
    t.a16 = 1;
    if (__syncthreads_or(mis != 0) && threadIdx.x == 0)
        t.a16 = 0;
    __syncthreads();
    __nv_bfloat16 *as = (__nv_bfloat16 *)moe_smem, *bs = as + MOE_TILE_MMA * MMA_LD;
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc[2][2];
    moe_mma_run<WT>(t, p.n_embd, as, bs, acc);
    float *cs = (float *)moe_smem;
    moe_mma_store(cs, acc);
    for (int i = threadIdx.x; i < np * (MMA_ROWS / 2); i += blockDim.x) {
        const int pr = i / (MMA_ROWS / 2), c = i % (MMA_ROWS / 2);
        if (r0 + c < p.n_ff) {
            const float g = cs[pr * MMA_CLD + c], u = cs[pr * MMA_CLD + MMA_ROWS / 2 + c];
            p.h[(int64_t)pairs[pr] * p.n_ff + r0 + c] = moe_h(p, e, r0 + c, g, u);
        }
    }
}

/* y[pair, r] = w_pair * (down_e[r] . h_pair) for rows r0 .. r0 + 127 of one tile */
template <uint32_t WT>
static __global__ void __launch_bounds__(256) k_moe_down_mma(struct moe_params p)
{
    ops_pdl_wait();
    extern __shared__ __align__(128) uint8_t moe_smem[];
    __shared__ struct mma_tile t;
    __shared__ int pairs[MOE_TILE_MMA];
    int e;
    const int np = moe_mma_pairs(p, pairs, &e);
    const int64_t r0 = (int64_t)blockIdx.y * MMA_ROWS;
    if (np == 0)
        return;
    if (e < 0 || e >= p.n_expert) {
        for (int i = threadIdx.x; i < np * MMA_ROWS; i += blockDim.x) {
            int64_t r = r0 + i % MMA_ROWS;
            if (r < p.n_embd)
                p.y[(int64_t)pairs[i / MMA_ROWS] * p.n_embd + r] = NAN;
        }
        return;
    }
    const uint8_t *db = moe_expert(p.down, p.down_stride, p.down_ptrs, e);
    uintptr_t mis = 0;
    for (int i = threadIdx.x; i < MOE_TILE_MMA + MMA_ROWS; i += blockDim.x) {
        if (i < MOE_TILE_MMA) {
            t.x[i] = i < np ? p.h + (int64_t)pairs[i] * p.n_ff : nullptr;
        } else {
            const int64_t r = r0 + (i - MOE_TILE_MMA);
            t.w[i - MOE_TILE_MMA] = r >= p.n_embd ? nullptr : db + r * p.down_row;
            mis |= (uintptr_t)t.w[i - MOE_TILE_MMA] & 15;
        }
    }
    t.a16 = 1;
    if (__syncthreads_or(mis != 0) && threadIdx.x == 0)
        t.a16 = 0;
    __syncthreads();
    __nv_bfloat16 *as = (__nv_bfloat16 *)moe_smem, *bs = as + MOE_TILE_MMA * MMA_LD;
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc[2][2];
    moe_mma_run<WT>(t, p.n_ff, as, bs, acc);
    float *cs = (float *)moe_smem;
    moe_mma_store(cs, acc);
    for (int i = threadIdx.x; i < np * MMA_ROWS; i += blockDim.x) {
        const int pr = i / MMA_ROWS, c = i % MMA_ROWS;
        if (r0 + c < p.n_embd)
            p.y[(int64_t)pairs[pr] * p.n_embd + r0 + c] =
                __fmul_rn(p.wts[pairs[pr]], moe_down_b(p, e, r0 + c, cs[pr * MMA_CLD + c]));
    }
}

/* ---- tensor cores on 8-bit codes (prefill) -------------------------------------------------
 * For Q4_K and Q6_K experts the tensor-core path can run on the 8-bit direct path's codes: the
 * inputs quantized once per token (k_moe_prep_q8, which also sorts), h quantized per 32 rows by
 * the gate/up kernel, and every product an integer MMA (m16n8k32 on s8, Q6_K's halves of 16 on
 * m16n8k16) whose per-unit sums are scaled in float exactly as moe_q8_unit's apply() scales
 * them. A block owns a tile of up to M8_BM pairs of one expert against M8_BN weight rows (64
 * gate + 64 up, or 128 down) and walks K a quant block (256 elements) per stage: the weight
 * rows' raw blocks arrive by 16-byte cp.async granules (any alignment: each slot keeps its
 * block at the source's offset within its first granule), are unpacked once into signed 8-bit
 * codes and per-unit scales in shared memory, and the next stage's raw blocks are copied while
 * the MMAs run. Warp w owns pairs 32 (w / 4).. and weight rows 32 (w % 4)..; each output's units
 * are added in order, so results are deterministic; against the direct 8-bit path only the
 * order of the unit sums differs (docs/cuda-ops.md). */

#define M8_BM 64           /* pairs per tile: MOE_TILE_MMA */
#define M8_BN 128          /* weight rows per block */
#define M8_KS 256          /* elements per stage: one Q4_K / Q6_K block */
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

#define M8_ABYTES ((uint64_t)M8_BM * M8_LD + 8ull * M8_BM * 8) /* one stage of codes + scales */

template <uint32_t WT> static constexpr uint64_t m8_smem_bytes()
{
    return m8_fmt<WT>::AB * M8_ABYTES + (uint64_t)M8_BN * M8_LD + 8ull * M8_BN * 8 +
           (uint64_t)M8_BN * m8_fmt<WT>::SLOT;
}

/* Whether both weight types have the kernels and the shapes fit their stages and tiles. */
static bool moe_m8_ok(uint32_t gate_type, uint32_t down_type, int64_t n_embd, int64_t n_ff)
{
    const bool gt = gate_type == QUANT_Q4_K || gate_type == QUANT_Q6_K;
    const bool dt = down_type == QUANT_Q4_K || down_type == QUANT_Q6_K;
    return gt && dt && n_embd % M8_KS == 0 && n_ff % M8_KS == 0;
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

/* A tile's rows, in shared memory: activation row i's codes at src[i] and (d, d * sum) per unit
 * at sd[i]; weight row n at rows[n], inside the matrix [lo[n], hi[n]); off[n]: where the current
 * stage's block of row n starts in its slot. */
struct m8_rows {
    const int8_t *src[M8_BM];
    const float2 *sd[M8_BM];
    const uint8_t *rows[M8_BN];
    uintptr_t lo[M8_BN], hi[M8_BN];
    int off[M8_BN];
};

/* The raw blocks of stage s of the tile's weight rows into their slots: the 16-byte granules
 * covering each block, by cp.async where the granule lies inside its row's matrix, else byte by
 * byte inside it; t.off[n] = the block's offset in its slot. The caller commits and waits. */
template <uint32_t WT>
static __device__ __forceinline__ void m8_load_raw(uint8_t *raw, struct m8_rows &t, int64_t s)
{
    const uint8_t *const *rows = t.rows;
    const uintptr_t *lo = t.lo, *hi = t.hi;
    int *off = t.off;
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
 * q - 32. */
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

/* f(layout) with the smallest layout that covers np pairs (a value of its type). */
template <class F> static __device__ __forceinline__ void m8_by_layout(int np, F f)
{
    if (np > 48)
        f(m8_lay64{});
    else if (np > 32)
        f(m8_lay48{});
    else if (np > 16)
        f(m8_lay32{});
    else
        f(m8_lay16{});
}

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
static __device__ __forceinline__ void m8_load_act(uint8_t *a, const struct m8_rows &t, int64_t s)
{
    const int8_t *const *src = t.src;
    const float2 *const *sd = t.sd;
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
static __device__ __forceinline__ void m8_run(uint8_t *smem, struct m8_rows &t, int64_t n_in,
                                              float (&acc)[L::MI][L::NI][4])
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
    m8_load_raw<WT>(raw, t, 0);
    if (AB == 2)
        m8_load_act<L::ROWS>(smem, t, 0);
    for (int64_t s = 0; s < ns; s++) {
        uint8_t *a = smem + (AB == 2 ? (s & 1) * M8_ABYTES : 0);
        if (AB == 1)
            m8_load_act<L::ROWS>(a, t, s);
        m8_cp_wait_all();
        __syncthreads();
        m8_unpack<WT>(raw, t.off, bq, bd);
        __syncthreads();
        if (s + 1 < ns) {
            m8_load_raw<WT>(raw, t, s + 1);
            if (AB == 2)
                m8_load_act<L::ROWS>(smem + ((s + 1) & 1) * M8_ABYTES, t, s + 1);
            m8_cp_commit();
        }
        m8_stage_mma<WT, L>((const int8_t *)a, (const float2 *)(a + M8_BM * M8_LD), bq, bd, acc);
        __syncthreads();
    }
    m8_cp_wait_all();
    __syncthreads();
}

/* The tile's gate and up sums (layout L) into the float tile at smem (pair row i, weight row n
 * at i * M8_CLD + n), complete after the closing barrier. */
template <uint32_t WT, class L>
static __device__ __forceinline__ void m8_gate_up_sums(uint8_t *smem, struct m8_rows &rw,
                                                       int64_t n_in)
{
    float acc[L::MI][L::NI][4];
    m8_run<WT, L>(smem, rw, n_in, acc);
    float *cs = (float *)smem;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3, pm = L::pm(warp), pn = L::pn(warp);
#pragma unroll
    for (int mi = 0; mi < L::MI; mi++)
#pragma unroll
        for (int ni = 0; ni < L::NI; ni++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                cs[(pm + 16 * mi + g + 8 * (c >> 1)) * M8_CLD + pn + 8 * ni + 2 * t + (c & 1)] =
                    acc[mi][ni][c];
    __syncthreads();
}

/* The tile's down sums (layout L) times each pair's weight (+ its bias) into y (rows r0 ..). */
template <uint32_t WT, class L>
static __device__ __forceinline__ void m8_down_sums(const struct moe_params &p, uint8_t *smem,
                                                    struct m8_rows &rw, const int *pairs, int np,
                                                    int e, int64_t r0)
{
    float acc[L::MI][L::NI][4];
    m8_run<WT, L>(smem, rw, p.n_ff, acc);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3, pm = L::pm(warp), pn = L::pn(warp);
#pragma unroll
    for (int mi = 0; mi < L::MI; mi++)
#pragma unroll
        for (int c = 0; c < 4; c += 2) {
            const int pi = pm + 16 * mi + g + 8 * (c >> 1);
            if (pi >= np)
                continue;
            const int pr = pairs[pi];
            const float wt = p.wts[pr];
#pragma unroll
            for (int ni = 0; ni < L::NI; ni++)
#pragma unroll
                for (int cc = 0; cc < 2; cc++) {
                    const int64_t r = r0 + pn + 8 * ni + 2 * t + cc;
                    p.y[(int64_t)pr * p.n_embd + r] =
                        __fmul_rn(wt, moe_down_b(p, e, r, acc[mi][ni][c + cc]));
                }
        }
}

/* gate/up of one tile on codes: block (tile, 64 rows of h); h of each pair quantized per 32 rows
 * into hq / hd as k_moe_gate_up_q8 does. */
template <uint32_t WT>
static __global__ void __launch_bounds__(256, 2) k_moe_gate_up_m8(struct moe_params p)
{
    ops_pdl_wait();
    extern __shared__ __align__(128) uint8_t moe_smem[];
    __shared__ struct m8_rows t;
    __shared__ int pairs[M8_BM];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int e;
    const int np = moe_mma_pairs(p, pairs, &e);
    const int64_t r0 = (int64_t)blockIdx.y * (M8_BN / 2);
    if (np == 0)
        return;
    if (e < 0 || e >= p.n_expert) { /* as k_moe_gate_up_gq8 */
        for (int i = warp; i < 2 * np; i += 8) {
            const int64_t hu = ((int64_t)pairs[i >> 1] * p.n_ff + r0) / 32 + (i & 1);
            p.hq[hu * 32 + lane] = 0;
            if (lane == 0)
                p.hd[hu] = make_float2(NAN, NAN);
        }
        return;
    }
    const uint8_t *gb = moe_expert(p.gate, p.gate_stride, p.gate_ptrs, e);
    const uint8_t *ub = moe_expert(p.up, p.up_stride, p.up_ptrs, e);
    const int64_t nu = p.n_embd / 32;
    for (int i = threadIdx.x; i < M8_BM + M8_BN; i += blockDim.x) {
        if (i < M8_BM) {
            const int64_t tk = pairs[i < np ? i : 0] / p.k;
            t.src[i] = p.xq + tk * p.n_embd;
            t.sd[i] = p.xd + tk * nu;
        } else {
            const int n = i - M8_BM, half = M8_BN / 2;
            const uint8_t *base = n < half ? gb : ub;
            const uint64_t rb = n < half ? p.gate_row : p.up_row;
            t.rows[n] = base + (r0 + n % half) * rb;
            t.lo[n] = (uintptr_t)base;
            t.hi[n] = (uintptr_t)(base + p.n_ff * rb);
        }
    }
    __syncthreads();
    m8_by_layout(np, [&](auto lay) { m8_gate_up_sums<WT, decltype(lay)>(moe_smem, t, p.n_embd); });
    const float *cs = (const float *)moe_smem;
    for (int i = warp; i < 2 * np; i += 8) { /* (pair, unit of 32 rows) per warp */
        const int pi = i >> 1, u = i & 1, rr = 32 * u + lane;
        const float v = moe_h(p, e, r0 + rr, cs[pi * M8_CLD + rr], cs[pi * M8_CLD + 64 + rr]);
        moe_q8_h_unit(p, ((int64_t)pairs[pi] * p.n_ff + r0) / 32 + u, v, lane);
    }
}

/* down of one tile on codes: block (tile, 128 rows); y[pair, r] = w_pair (down_e[r] . h_pair)
 * (+ its bias), as k_moe_down_gq8. */
template <uint32_t WT>
static __global__ void __launch_bounds__(256, 2) k_moe_down_m8(struct moe_params p)
{
    ops_pdl_wait();
    extern __shared__ __align__(128) uint8_t moe_smem[];
    __shared__ struct m8_rows t;
    __shared__ int pairs[M8_BM];
    int e;
    const int np = moe_mma_pairs(p, pairs, &e);
    const int64_t r0 = (int64_t)blockIdx.y * M8_BN;
    if (np == 0)
        return;
    if (e < 0 || e >= p.n_expert) {
        for (int i = threadIdx.x; i < np * M8_BN; i += blockDim.x)
            p.y[(int64_t)pairs[i / M8_BN] * p.n_embd + r0 + i % M8_BN] = NAN;
        return;
    }
    const uint8_t *db = moe_expert(p.down, p.down_stride, p.down_ptrs, e);
    const int64_t nu = p.n_ff / 32;
    for (int i = threadIdx.x; i < M8_BM + M8_BN; i += blockDim.x) {
        if (i < M8_BM) {
            const int64_t pr = pairs[i < np ? i : 0];
            t.src[i] = p.hq + pr * p.n_ff;
            t.sd[i] = p.hd + pr * nu;
        } else {
            const int n = i - M8_BM;
            t.rows[n] = db + (r0 + n) * p.down_row;
            t.lo[n] = (uintptr_t)db;
            t.hi[n] = (uintptr_t)(db + p.n_embd * p.down_row);
        }
    }
    __syncthreads();
    m8_by_layout(
        np, [&](auto lay) { m8_down_sums<WT, decltype(lay)>(p, moe_smem, t, pairs, np, e, r0); });
}

/* Bin of an expert id: the id, or n_expert for an invalid one. */
static __device__ __forceinline__ int moe_bin(const struct moe_params &p, int e)
{
    return e >= 0 && e < p.n_expert ? e : p.n_expert;
}

#define MOE_SORT_SMALL 1024 /* pairs up to which moe_sort_small sorts in shared memory */

/* The same sort and tile list for up to MOE_SORT_SMALL pairs, every thread on its own pairs
 * with no serial step: pair q of bin b goes to (pairs of smaller bins) + (pairs of bin b
 * before q), each counted over the bins in shared memory; the first pair of each bin writes
 * its bin's tiles after (tiles of smaller bins). */
static __device__ void moe_sort_small(const struct moe_params &p)
{
    __shared__ int bin[MOE_SORT_SMALL], first[MOE_SORT_SMALL], cnt[MOE_SORT_SMALL];
    const int n = p.n_pairs;
    for (int q = threadIdx.x; q < n; q += blockDim.x)
        bin[q] = moe_bin(p, p.ids[q]);
    __syncthreads();
    for (int q = threadIdx.x; q < n; q += blockDim.x) {
        const int b = bin[q];
        int before = 0, rank = 0, same = 0;
        for (int q2 = 0; q2 < n; q2++) {
            const int b2 = bin[q2];
            before += b2 < b;
            same += b2 == b;
            rank += b2 == b && q2 < q;
        }
        p.sorted[before + rank] = q;
        first[q] = rank == 0 ? before : -1; /* where the bin starts, on its first pair */
        cnt[q] = same;
    }
    __syncthreads();
    for (int q = threadIdx.x; q < n; q += blockDim.x) {
        if (first[q] < 0)
            continue;
        const int b = bin[q], c = cnt[q];
        int t = 0;
        for (int q2 = 0; q2 < n; q2++)
            if (first[q2] >= 0 && bin[q2] < b)
                t += (cnt[q2] + p.tile - 1) / p.tile;
        for (int s = 0; s < c; s += p.tile, t++) {
            p.tile_e[t] = b;
            p.tile_b[t] = first[q] + s;
            p.tile_n[t] = c - s < p.tile ? c - s : p.tile;
        }
        if (first[q] + c == n) /* the last bin: t is the number of tiles */
            *p.n_tiles = t;
    }
}

#define MOE_SORT_WARPS (MOE_SORT_THREADS / 32)
#define MOE_SORT_MAX_BINS 640 /* experts + 1 that moe_sort_warps takes (its shared counts) */
#define MOE_SORT_WARPS_MIN                                                                         \
    256 /* pairs from which it sorts (below: moe_sort_small, whose                                 \
         * threads each compare their pairs with all n) */

/* The same stable sort and tile list in shared memory, for more than MOE_SORT_WARPS_MIN pairs
 * and up to MOE_SORT_MAX_BINS bins. Warp w owns the contiguous segment w of the pairs and walks it
 * 32 pairs at a time, in order; the lanes holding one bin find each other with a match, so
 * each pair's rank among its warp's pairs of that bin is a count of lower lanes plus what the
 * warp's earlier rounds counted:
 *   1. hist[w][b] = pairs of segment w in bin b;
 *   2. per bin (threads over bins): exclusive scan over the warps, cnt[b] = the bin's size;
 *      warp 0: exclusive scans of the sizes (-> start[b]) and of the bins' tile counts (->
 *      tile0[b]);
 *   3. each warp places its pairs at start[b] + hist[w][b] + rank; each bin writes its tiles. */
static __device__ void moe_sort_warps(const struct moe_params &p)
{
    __shared__ int hist[MOE_SORT_WARPS][MOE_SORT_MAX_BINS];
    __shared__ int cnt[MOE_SORT_MAX_BINS], start[MOE_SORT_MAX_BINS], tile0[MOE_SORT_MAX_BINS];
    const int nb = p.n_expert + 1, n = p.n_pairs;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int seg = (int)moe_cdiv(n, MOE_SORT_WARPS);
    const int q0 = min(warp * seg, n), q1 = min(q0 + seg, n);
    const unsigned below = (1u << lane) - 1u;
    for (int i = threadIdx.x; i < MOE_SORT_WARPS * nb; i += blockDim.x)
        hist[i / nb][i % nb] = 0;
    __syncthreads();
    for (int q = q0 + lane; q - lane < q1; q += 32) { /* the same trip count on every lane */
        const bool in = q < q1;
        const int b = in ? moe_bin(p, p.ids[q]) : -1 - lane; /* lanes past the end: alone */
        const unsigned m = __match_any_sync(0xffffffffu, b);
        if (in && (m & below) == 0) /* the group's lowest lane */
            hist[warp][b] += __popc(m);
        __syncwarp();
    }
    __syncthreads();
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        int run = 0;
        for (int w = 0; w < MOE_SORT_WARPS; w++) {
            const int v = hist[w][b];
            hist[w][b] = run;
            run += v;
        }
        cnt[b] = run;
    }
    __syncthreads();
    if (warp == 0) { /* lane l scans bins [l * per, (l + 1) * per), then across the lanes */
        const int per = (nb + 31) / 32, b0 = lane * per, b1 = min(b0 + per, nb);
        int sp = 0, st = 0;
        for (int b = b0; b < b1; b++)
            sp += cnt[b], st += (cnt[b] + p.tile - 1) / p.tile;
        int ip = sp, it = st; /* inclusive scans across the lanes */
        for (int d = 1; d < 32; d <<= 1) {
            const int vp = __shfl_up_sync(0xffffffffu, ip, d),
                      vt = __shfl_up_sync(0xffffffffu, it, d);
            if (lane >= d)
                ip += vp, it += vt;
        }
        int pp = ip - sp, pt = it - st;
        for (int b = b0; b < b1; b++) {
            start[b] = pp, tile0[b] = pt;
            pp += cnt[b], pt += (cnt[b] + p.tile - 1) / p.tile;
        }
        if (lane == 31)
            *p.n_tiles = it;
    }
    __syncthreads();
    for (int q = q0 + lane; q - lane < q1; q += 32) {
        const bool in = q < q1;
        const int b = in ? moe_bin(p, p.ids[q]) : -1 - lane;
        const unsigned m = __match_any_sync(0xffffffffu, b);
        if (in)
            p.sorted[start[b] + hist[warp][b] + __popc(m & below)] = q;
        __syncwarp();
        if (in && (m & below) == 0)
            hist[warp][b] += __popc(m);
        __syncwarp();
    }
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        const int c = cnt[b];
        int t = tile0[b];
        for (int s = 0; s < c; s += p.tile, t++) {
            p.tile_e[t] = b;
            p.tile_b[t] = start[b] + s;
            p.tile_n[t] = c - s < p.tile ? c - s : p.tile;
        }
    }
}

/* Stable counting sort of the pairs by expert, in one block (deterministic, no atomics), for
 * more bins than moe_sort_warps takes; moe_sort_warps from MOE_SORT_WARPS_MIN pairs, and
 * moe_sort_small below that (and up to MOE_SORT_SMALL pairs) instead.
 * Thread c owns the contiguous chunk c of the pairs and row c of cnt:
 *   1. cnt[c][b] = pairs of chunk c in bin b;
 *   2. per bin b (threads over bins): exclusive scan over the chunks -> cnt[c][b] is where
 *      chunk c starts inside bin b; off[b] = the bin's size;
 *   3. thread 0: exclusive scan of the sizes -> off, and the tile list (up to p.tile pairs of
 *      one bin per tile);
 *   4. thread c places its chunk's pairs in order at off[b] + cnt[c][b]++.
 * Global memory written before a __syncthreads is visible to the block after it. */
static __device__ void moe_sort_body(const struct moe_params &p)
{
    if (p.n_pairs > MOE_SORT_WARPS_MIN && p.n_expert + 1 <= MOE_SORT_MAX_BINS) {
        moe_sort_warps(p);
        return;
    }
    if (p.n_pairs <= MOE_SORT_SMALL) {
        moe_sort_small(p);
        return;
    }
    const int nb = p.n_expert + 1, c = threadIdx.x;
    const int len = (int)moe_cdiv(p.n_pairs, MOE_SORT_THREADS);
    const int q0 = c * len < p.n_pairs ? c * len : p.n_pairs;
    const int q1 = q0 + len < p.n_pairs ? q0 + len : p.n_pairs;
    int32_t *my = p.cnt + (int64_t)c * nb;

    for (int b = 0; b < nb; b++)
        my[b] = 0;
    for (int q = q0; q < q1; q++)
        my[moe_bin(p, p.ids[q])]++;
    __syncthreads();
    for (int b = c; b < nb; b += MOE_SORT_THREADS) {
        int run = 0;
        for (int c2 = 0; c2 < MOE_SORT_THREADS; c2++) {
            int v = p.cnt[(int64_t)c2 * nb + b];
            p.cnt[(int64_t)c2 * nb + b] = run;
            run += v;
        }
        p.off[b] = run;
    }
    __syncthreads();
    if (c == 0) {
        int pos = 0, nt = 0;
        for (int b = 0; b < nb; b++) {
            int n = p.off[b];
            p.off[b] = pos;
            for (int s = 0; s < n; s += p.tile) {
                p.tile_e[nt] = b;
                p.tile_b[nt] = pos + s;
                p.tile_n[nt] = n - s < p.tile ? n - s : p.tile;
                nt++;
            }
            pos += n;
        }
        p.off[nb] = pos;
        *p.n_tiles = nt;
    }
    __syncthreads();
    for (int q = q0; q < q1; q++) {
        int b = moe_bin(p, p.ids[q]);
        p.sorted[p.off[b] + my[b]++] = q;
    }
}

static __global__ void __launch_bounds__(MOE_SORT_THREADS) k_moe_sort(struct moe_params p)
{
    ops_pdl_begin();
    moe_sort_body(p);
}

/* ==== launcher =============================================================================== */

/* Scratch layout: each array starts on a 256-byte boundary. */
struct moe_layout {
    size_t h, hq, hd, xq, xd, y, cnt, off, sorted, tile_e, tile_b, tile_n, n_tiles, total;
    int max_tiles;
};

static size_t moe_take(size_t *at, size_t bytes)
{
    size_t o = *at;
    *at += (bytes + 255) & ~(size_t)255;
    return o;
}

/* Pairs per tile: large tiles share each decoded weight among more pairs, but cost their full
 * width in arithmetic even when an expert has few pairs. */
static int moe_tile_of(int n_tok, int k, int n_expert)
{
    return (int64_t)n_tok * k >= (int64_t)n_expert * (MOE_TILE_LARGE / 2) ? MOE_TILE_LARGE
                                                                          : MOE_TILE_SMALL;
}

static void moe_layout_make(int n_tok, int k, int n_expert, int64_t n_embd, int64_t n_ff,
                            struct moe_layout *l)
{
    size_t pairs = (size_t)n_tok * k, at = 0;
    size_t bins = (size_t)n_expert + 1;
    /* sum over bins of ceil(count / tile) <= pairs / tile + non-empty bins; the small tile
     * bounds both choices */
    l->max_tiles = (int)(moe_cdiv((int64_t)pairs, MOE_TILE_SMALL) + (pairs < bins ? pairs : bins));
    l->h = moe_take(&at, sizeof(float) * pairs * n_ff);
    l->hq = moe_take(&at, pairs * n_ff);
    l->hd = moe_take(&at, sizeof(float) * 2 * pairs * (n_ff / 32 + 1));
    l->xq = moe_take(&at, (size_t)n_tok * n_embd);
    l->xd = moe_take(&at, sizeof(float) * 2 * (size_t)n_tok * (n_embd / 32 + 1));
    l->y = moe_take(&at, sizeof(float) * pairs * n_embd);
    l->cnt = moe_take(&at, sizeof(int32_t) * MOE_SORT_THREADS * bins);
    l->off = moe_take(&at, sizeof(int32_t) * (bins + 1));
    l->sorted = moe_take(&at, sizeof(int32_t) * pairs);
    l->tile_e = moe_take(&at, sizeof(int32_t) * l->max_tiles);
    l->tile_b = moe_take(&at, sizeof(int32_t) * l->max_tiles);
    l->tile_n = moe_take(&at, sizeof(int32_t) * l->max_tiles);
    l->n_tiles = moe_take(&at, sizeof(int32_t));
    l->total = at;
}

static bool moe_shapes_ok(const struct cuda_moe_args *a)
{
    return a && a->n_tok >= 0 && a->n_expert >= 1 && a->k >= 1 && a->k <= a->n_expert &&
           a->n_embd >= 1 && a->n_ff >= 1 && (int64_t)a->n_tok * a->k <= INT32_MAX / 2;
}

extern "C" size_t cuda_moe_scratch_bytes(const struct cuda_moe_args *a)
{
    struct moe_layout l;
    if (!moe_shapes_ok(a))
        return 0;
    moe_layout_make(a->n_tok, a->k, a->n_expert, a->n_embd, a->n_ff, &l);
    return l.total;
}

/* Checks one stacked weight: rows of n_in elements of type, n_rows rows per expert. */
static bool moe_weight_ok(const void *base, uint64_t stride, const void *const *ptrs, uint32_t type,
                          int64_t n_in, int64_t n_rows)
{
    uint64_t rb = cq_row_bytes(type, n_in), al = cq_row_align(type);
    if (!rb || rb % al)
        return false;
    if (ptrs)
        return true; /* device pointers: their alignment is the caller's contract */
    return base && stride >= rb * (uint64_t)n_rows && stride % al == 0 && ops_aligned(base, al);
}

/* Whether the direct path runs on 8-bit codes: gate/up and down Q4_K, Q6_K or MXFP4, rows of
 * whole 32-element units (h is written a unit per block), the activation codes within the
 * default shared memory. p.hq is set exactly then. */
static bool moe_q8_ok(uint32_t gate_type, uint32_t down_type, int64_t n_embd, int64_t n_ff)
{
    return moe_q8_type(gate_type) && moe_q8_type(down_type) && n_embd % 32 == 0 && n_ff % 32 == 0 &&
           moe_q8_bytes(1, n_embd) <= MOE_Q8_MAX_SMEM;
}

template <uint32_t WT>
static void moe_launch_gate_up(const struct moe_params &p, bool grouped, unsigned items,
                               cudaStream_t s)
{
    dim3 grid(items, (unsigned)moe_cdiv(p.n_ff, MOE_WARPS));
    const uint64_t smem = MOE_WARPS * 2 * moe_stage_bytes(p.gate_row);
    if constexpr (moe_q8_type(WT)) {
        if (!grouped && p.hq) {
            ops_launch(k_moe_gate_up_q8<WT>,
                       dim3(items, (unsigned)moe_cdiv(p.n_ff, MOE_Q8_GU_ROWS)),
                       MOE_Q8_GU_WARPS * 32, p.in_q8 ? 0 : moe_q8_bytes(1, p.n_embd), s, p);
            return;
        }
    }
    if (grouped && p.tile == MOE_TILE_LARGE)
        ops_launch(k_moe_gate_up<WT, MOE_TILE_LARGE>, grid, MOE_WARPS * 32, 0, s, p, true);
    else if (grouped)
        ops_launch(k_moe_gate_up<WT, MOE_TILE_SMALL>, grid, MOE_WARPS * 32, 0, s, p, true);
    else if (smem <= MOE_STAGE_MAX_SMEM)
        ops_launch(k_moe_gate_up_staged<WT>, grid, MOE_WARPS * 32, smem, s, p);
    else
        ops_launch(k_moe_gate_up<WT, 1>, grid, MOE_WARPS * 32, 0, s, p, false);
}

/* The tensor-core kernels need more than the default 48 KiB of dynamic shared memory: raised
 * once per kernel, on first use (a plain attribute call, legal inside a stream capture). */
template <typename K> static void moe_smem_optin(K *kernel, bool *done)
{
    if (!*done) {
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, MMA_SMEM);
        *done = true;
    }
}

template <uint32_t WT>
static void moe_launch_mma(const struct moe_params &p, unsigned tiles, cudaStream_t s)
{
    static bool done;
    moe_smem_optin(k_moe_gate_up_mma<WT>, &done);
    ops_launch(k_moe_gate_up_mma<WT>, dim3(tiles, (unsigned)moe_cdiv(p.n_ff, MMA_ROWS / 2)), 256,
               MMA_SMEM, s, p);
}

template <uint32_t WT>
static void moe_launch_down_mma(const struct moe_params &p, unsigned tiles, cudaStream_t s)
{
    static bool done;
    moe_smem_optin(k_moe_down_mma<WT>, &done);
    ops_launch(k_moe_down_mma<WT>, dim3(tiles, (unsigned)moe_cdiv(p.n_embd, MMA_ROWS)), 256,
               MMA_SMEM, s, p);
}

template <uint32_t WT>
static void moe_launch_down(const struct moe_params &p, bool grouped, unsigned items,
                            cudaStream_t s)
{
    dim3 grid(items, (unsigned)moe_cdiv(p.n_embd, MOE_WARPS));
    if constexpr (moe_q8_type(WT)) {
        if (!grouped && p.hq) {
            ops_launch(k_moe_down_q8<WT>, dim3(items, (unsigned)moe_cdiv(p.n_embd, MOE_Q8_DN_ROWS)),
                       MOE_WARPS * 32, 0, s, p);
            return;
        }
    }
    if (grouped && p.tile == MOE_TILE_LARGE)
        ops_launch(k_moe_down_grouped<WT, MOE_TILE_LARGE>, grid, MOE_WARPS * 32, 0, s, p);
    else if (grouped)
        ops_launch(k_moe_down_grouped<WT, MOE_TILE_SMALL>, grid, MOE_WARPS * 32, 0, s, p);
    else
        ops_launch(k_moe_down_direct<WT, MOE_DOWN_KMAX>, grid, MOE_WARPS * 32, 0, s, p);
}

/* The 8-bit tensor-core kernels (Q4_K and Q6_K only: moe_m8_ok). */
template <uint32_t WT>
static void moe_launch_gate_up_m8(const struct moe_params &p, unsigned tiles, cudaStream_t s)
{
    static bool done;
    if (!done) {
        cudaFuncSetAttribute(k_moe_gate_up_m8<WT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)m8_smem_bytes<WT>());
        done = true;
    }
    ops_launch(k_moe_gate_up_m8<WT>, dim3(tiles, (unsigned)(p.n_ff / (M8_BN / 2))), 256,
               m8_smem_bytes<WT>(), s, p);
}

template <uint32_t WT>
static void moe_launch_down_m8(const struct moe_params &p, unsigned tiles, cudaStream_t s)
{
    static bool done;
    if (!done) {
        cudaFuncSetAttribute(k_moe_down_m8<WT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)m8_smem_bytes<WT>());
        done = true;
    }
    ops_launch(k_moe_down_m8<WT>, dim3(tiles, (unsigned)(p.n_embd / M8_BN)), 256,
               m8_smem_bytes<WT>(), s, p);
}

/* Whether the automatic choice may take the 8-bit tensor-core path: not when the environment's
 * STRATA_MOE_M8 is 0 (for comparisons). */
static bool moe_m8_auto(void)
{
    static int on = -1;
    if (on < 0) {
        const char *env = getenv("STRATA_MOE_M8");
        on = !(env && *env && atoi(env) == 0);
    }
    return on == 1;
}

/* The grouped 8-bit kernels exist for Q4_K, Q6_K and MXFP4 only (p.hq is set for no other
 * type). */
template <uint32_t WT>
static void moe_launch_gate_up_gq8(const struct moe_params &p, unsigned tiles, cudaStream_t s)
{
    if constexpr (moe_q8_type(WT)) {
        const dim3 grid(tiles, (unsigned)moe_cdiv(p.n_ff, MOE_Q8_GU_ROWS));
        const uint64_t smem = moe_q8_bytes(MOE_TILE_Q8, p.n_embd);
        if (smem + sizeof(float) * MOE_TILE_Q8 * MOE_Q8_GU_ROWS <= MOE_Q8_MAX_SMEM)
            ops_launch(k_moe_gate_up_gq8<WT, true>, grid, MOE_Q8_GU_WARPS * 32, smem, s, p);
        else
            ops_launch(k_moe_gate_up_gq8<WT, false>, grid, MOE_Q8_GU_WARPS * 32, 0, s, p);
    }
}

template <uint32_t WT>
static void moe_launch_down_gq8(const struct moe_params &p, unsigned tiles, cudaStream_t s)
{
    if constexpr (moe_q8_type(WT))
        ops_launch(k_moe_down_gq8<WT>, dim3(tiles, (unsigned)moe_cdiv(p.n_embd, MOE_WARPS)),
                   MOE_WARPS * 32, 0, s, p);
}

/* ---- bulk 8-bit launchers ---- */

/* Whether the device has bulk copies (compute capability 9.0 and later); decided once. */
static bool moe_bulk_dev_ok(void)
{
    static int on = -1; /* a race writes the same value */
    if (on < 0) {
        int dev = 0, major = 0;
        on =
            cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
            major >= 9;
    }
    return on == 1;
}

/* Whether the 8-bit gate/up kernels walk a warp's two rows at once: unless STRATA_MOE_GU2 is
 * "0" in the environment. */
static int moe_gu2(void)
{
    static int on = -1;
    if (on < 0) {
        const char *env = getenv("STRATA_MOE_GU2");
        on = !(env && env[0] == '0');
    }
    return on;
}

/* Whether the bulk gate/up kernel takes four rows per warp (eight warps of 512-thread blocks'
 * sixteen: at 75-86 registers one sixteen-warp block fit an SM where the shared memory held two;
 * each unit is walked once for four rows' gate and up dots; the same bits) for a call of
 * `tokens` tokens: Q4_K and MXFP4 one-token calls (tg128 +4.0% with graphs, +3.9% without on the
 * 30b-a3b preset, +2.7% / +3.1% on gpt-oss-20b's shapes; bench/cuda-resident.md,
 * bench/gptoss.md), where lockstep steps kept two rows (8 streams 798.7 against 792.7 tok/s
 * with four, one run); Q6_K (not measured) keeps two. STRATA_MOE_GU4=1 in the environment takes
 * four for every call and type, 0 two (for comparisons). */
static bool moe_gu4(uint32_t wt, int tokens)
{
    static int mode = -1;
    if (mode < 0) {
        const char *env = getenv("STRATA_MOE_GU4");
        mode = env && *env ? (env[0] == '1' ? 1 : 0) : 2;
    }
    return mode == 1 || (mode == 2 && (wt == QUANT_Q4_K || wt == QUANT_MXFP4) && tokens == 1);
}

/* Whether the bulk gate/up kernel of a one-token call runs as blocks of 16 rows, two to a
 * cluster that writes each 32-row unit of h together (the lower block quantizes the unit with
 * the upper block's 16 values read from its shared memory; the same bits): twice the blocks of
 * the 32-row kernel, 384 for the 30b-a3b preset's 8 x 768 rows where 192 blocks of two per SM
 * left SMs idle (0.73 waves). Four rows per warp, as moe_gu4. Only with STRATA_MOE_GU16=1 in the
 * environment, on devices with clusters (compute capability 9.0), for n_ff a multiple of 32: on
 * the H200 it decoded 7.5% slower than the 32-row kernel (bench/cuda-resident.md). */
static bool moe_gu16(uint32_t wt, const struct moe_params &p)
{
    static int on = -1;
    if (on < 0) {
        const char *env = getenv("STRATA_MOE_GU16");
        on = env && env[0] == '1' && moe_bulk_dev_ok();
    }
    return on && moe_gu4(wt, p.n_tok) && p.n_tok == 1 && p.n_ff % MOE_Q8_GU_ROWS == 0;
}

/* Whether a one-token bulk call given its router's logits selects its experts inside its two
 * kernels (moe_topk_select) rather than by a cuda_softmax_topk launch before them: the same ids
 * and weights either way. STRATA_MOE_TOPK_FUSE=0 in the environment launches the top-k kernel
 * (for comparisons). */
static bool moe_topk_fuse(void)
{
    static int on = -1;
    if (on < 0) {
        const char *env = getenv("STRATA_MOE_TOPK_FUSE");
        on = !(env && env[0] == '0');
    }
    return on;
}

/* Up to how many tokens the automatic choice takes the bulk path: CUDA_MOE_BULK8_MAX_TOK, or
 * the number STRATA_MOE_BULK gives in the environment (0: never; for comparisons). */
static int moe_bulk_max_tok(void)
{
    static int n = -1;
    if (n < 0) {
        const char *env = getenv("STRATA_MOE_BULK");
        const int v = env && *env ? atoi(env) : CUDA_MOE_BULK8_MAX_TOK;
        n = v < 0 ? 0 : v;
    }
    return n;
}

/* Lets kernel take bytes of dynamic shared memory (*allowed: what it was last raised to, per
 * kernel); false when the device cannot give them. A plain attribute call: legal inside a
 * stream capture. */
template <typename K> static bool moe_smem_allow(K *kernel, uint64_t bytes, uint64_t *allowed)
{
    if (bytes <= MOE_Q8_MAX_SMEM - 8 * 1024 || bytes <= *allowed) /* room for static arrays */
        return true;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    *allowed = bytes;
    return true;
}

/* A bulk gate/up block of rows rows (MOE_Q8_GU_ROWS, or half of it under moe_gu16). */
static uint64_t moe_b8_gu_smem(const struct moe_params &p, int rows = MOE_Q8_GU_ROWS)
{
    return rows * (p.gate_row + p.up_row) + MOE_B8_PAD;
}

static uint64_t moe_b8_dn_smem(const struct moe_params &p)
{
    return (uint64_t)p.k * MOE_B8_DN_ROWS * p.down_row + MOE_B8_PAD;
}

/* Raises both kernels' shared memory as needed; false (nothing launched) when either cannot
 * have it. */
template <uint32_t GT, uint32_t DT> static bool moe_b8_ready(const struct moe_params &p)
{
    if constexpr (moe_q8_type(GT) && moe_q8_type(DT)) {
        static uint64_t gu, gu4, gu16, dn;
        return moe_smem_allow(k_moe_gate_up_b8<GT>, moe_b8_gu_smem(p), &gu) &&
               moe_smem_allow(k_moe_gate_up_b8<GT, 4>, moe_b8_gu_smem(p), &gu4) &&
               moe_smem_allow(k_moe_gate_up_b8<GT, 4, MOE_Q8_GU_ROWS / 2>,
                              moe_b8_gu_smem(p, MOE_Q8_GU_ROWS / 2), &gu16) &&
               moe_smem_allow(k_moe_down_b8<DT>, moe_b8_dn_smem(p), &dn);
    }
    return false;
}

template <uint32_t GT> static bool moe_b8_ready_g(uint32_t dt, const struct moe_params &p)
{
    switch (dt) {
    case QUANT_Q4_K:
        return moe_b8_ready<GT, QUANT_Q4_K>(p);
    case QUANT_Q6_K:
        return moe_b8_ready<GT, QUANT_Q6_K>(p);
    case QUANT_MXFP4:
        return moe_b8_ready<GT, QUANT_MXFP4>(p);
    default:
        return false;
    }
}

static bool moe_b8_ready_any(uint32_t gt, uint32_t dt, const struct moe_params &p)
{
    switch (gt) {
    case QUANT_Q4_K:
        return moe_b8_ready_g<QUANT_Q4_K>(dt, p);
    case QUANT_Q6_K:
        return moe_b8_ready_g<QUANT_Q6_K>(dt, p);
    case QUANT_MXFP4:
        return moe_b8_ready_g<QUANT_MXFP4>(dt, p);
    default:
        return false;
    }
}

template <uint32_t WT>
static void moe_launch_gate_up_b8(const struct moe_params &p, unsigned items, cudaStream_t s)
{
    if constexpr (moe_q8_type(WT)) {
        if (moe_gu16(WT, p)) { /* clusters of two 16-row blocks per unit of h */
            const dim3 grid(items, (unsigned)(p.n_ff / (MOE_Q8_GU_ROWS / 2)));
            ops_launch_cluster(k_moe_gate_up_b8<WT, 4, MOE_Q8_GU_ROWS / 2>, grid,
                               MOE_Q8_GU_ROWS / 2 / 4 * 32, moe_b8_gu_smem(p, MOE_Q8_GU_ROWS / 2),
                               s, dim3(1, 2, 1), p);
            return;
        }
        const dim3 grid(items, (unsigned)moe_cdiv(p.n_ff, MOE_Q8_GU_ROWS));
        if (moe_gu4(WT, p.n_tok))
            ops_launch(k_moe_gate_up_b8<WT, 4>, grid, MOE_Q8_GU_ROWS / 4 * 32, moe_b8_gu_smem(p), s,
                       p);
        else
            ops_launch(k_moe_gate_up_b8<WT>, grid, MOE_Q8_GU_WARPS * 32, moe_b8_gu_smem(p), s, p);
    }
}

template <uint32_t WT>
static void moe_launch_down_b8(const struct moe_params &p, unsigned items, cudaStream_t s)
{
    if constexpr (moe_q8_type(WT))
        ops_launch(k_moe_down_b8<WT>, dim3(items, (unsigned)moe_cdiv(p.n_embd, MOE_B8_DN_ROWS)),
                   MOE_B8_DN_THREADS, moe_b8_dn_smem(p), s, p);
}

#define MOE_DISPATCH(type, fn, ...)                                                                \
    switch (type) {                                                                                \
    case QUANT_F32:                                                                                \
        fn<QUANT_F32>(__VA_ARGS__);                                                                \
        break;                                                                                     \
    case QUANT_F16:                                                                                \
        fn<QUANT_F16>(__VA_ARGS__);                                                                \
        break;                                                                                     \
    case QUANT_BF16:                                                                               \
        fn<QUANT_BF16>(__VA_ARGS__);                                                               \
        break;                                                                                     \
    case QUANT_Q4_0:                                                                               \
        fn<QUANT_Q4_0>(__VA_ARGS__);                                                               \
        break;                                                                                     \
    case QUANT_Q8_0:                                                                               \
        fn<QUANT_Q8_0>(__VA_ARGS__);                                                               \
        break;                                                                                     \
    case QUANT_MXFP4:                                                                              \
        fn<QUANT_MXFP4>(__VA_ARGS__);                                                              \
        break;                                                                                     \
    case QUANT_Q4_K:                                                                               \
        fn<QUANT_Q4_K>(__VA_ARGS__);                                                               \
        break;                                                                                     \
    case QUANT_Q5_K:                                                                               \
        fn<QUANT_Q5_K>(__VA_ARGS__);                                                               \
        break;                                                                                     \
    case QUANT_Q6_K:                                                                               \
        fn<QUANT_Q6_K>(__VA_ARGS__);                                                               \
        break;                                                                                     \
    default:                                                                                       \
        return -EINVAL;                                                                            \
    }

extern "C" int cuda_moe_ffn(const struct cuda_moe_args *a)
{
    if (!moe_shapes_ok(a) || a->gate_type != a->up_type || !cq_supported(a->gate_type) ||
        !cq_supported(a->down_type))
        return -EINVAL;
    if (!moe_weight_ok(a->gate, a->gate_stride, a->gate_ptrs, a->gate_type, a->n_embd, a->n_ff) ||
        !moe_weight_ok(a->up, a->up_stride, a->up_ptrs, a->up_type, a->n_embd, a->n_ff) ||
        !moe_weight_ok(a->down, a->down_stride, a->down_ptrs, a->down_type, a->n_ff, a->n_embd))
        return -EINVAL;
    if (a->n_embd % 4 || a->n_ff % 4 || a->in_stride < a->n_embd || a->in_stride % 4 ||
        a->out_stride < a->n_embd)
        return -EINVAL;
    if (a->n_tok == 0)
        return 0;
    struct moe_layout l;
    moe_layout_make(a->n_tok, a->k, a->n_expert, a->n_embd, a->n_ff, &l);
    const int32_t *ids = a->logits ? a->ids_out : a->ids;
    const float *weights = a->logits ? a->weights_out : a->weights;
    if (!a->out || !a->in || !ops_aligned(a->in, 16) || !ids || !weights || !a->scratch ||
        !ops_aligned(a->scratch, 16) || a->scratch_bytes < l.total)
        return -EINVAL;

    struct moe_params p = {};
    uint8_t *sc = (uint8_t *)a->scratch;
    p.in = a->in;
    p.in_stride = a->in_stride;
    if (a->in_q8 && a->in_q8_scales && a->n_embd % 32 == 0 && ops_aligned(a->in_q8, 16) &&
        ops_aligned(a->in_q8_scales, 8)) {
        p.in_q8 = a->in_q8;
        p.in_q8_d = (const float2 *)a->in_q8_scales;
    }
    p.out = a->out;
    p.out_stride = a->out_stride;
    p.n_tok = a->n_tok;
    p.k = a->k;
    p.n_expert = a->n_expert;
    p.n_pairs = a->n_tok * a->k;
    p.tile = moe_tile_of(a->n_tok, a->k, a->n_expert);
    p.n_embd = a->n_embd;
    p.n_ff = a->n_ff;
    p.ids = ids;
    p.wts = weights;
    p.gate = (const uint8_t *)a->gate;
    p.up = (const uint8_t *)a->up;
    p.down = (const uint8_t *)a->down;
    p.gate_stride = a->gate_stride;
    p.up_stride = a->up_stride;
    p.down_stride = a->down_stride;
    p.gate_ptrs = a->gate_ptrs;
    p.up_ptrs = a->up_ptrs;
    p.down_ptrs = a->down_ptrs;
    p.gate_row = cq_row_bytes(a->gate_type, a->n_embd);
    p.up_row = cq_row_bytes(a->up_type, a->n_embd);
    p.down_row = cq_row_bytes(a->down_type, a->n_ff);
    p.h = (float *)(sc + l.h);
    p.gate_b = a->gate_b;
    p.up_b = a->up_b;
    p.down_b = a->down_b;
    p.oai = a->act_oai;
    p.gu2 = moe_gu2();
    if (moe_q8_ok(a->gate_type, a->down_type, a->n_embd, a->n_ff)) {
        p.hq = (int8_t *)(sc + l.hq);
        p.hd = (float2 *)(sc + l.hd);
        p.xq = (int8_t *)(sc + l.xq);
        p.xd = (float2 *)(sc + l.xd);
    }
    p.y = (float *)(sc + l.y);
    p.cnt = (int32_t *)(sc + l.cnt);
    p.off = (int32_t *)(sc + l.off);
    p.sorted = (int32_t *)(sc + l.sorted);
    p.tile_e = (int32_t *)(sc + l.tile_e);
    p.tile_b = (int32_t *)(sc + l.tile_b);
    p.tile_n = (int32_t *)(sc + l.tile_n);
    p.n_tiles = (int32_t *)(sc + l.n_tiles);

    const bool bulk8 =
        p.hq && a->n_embd % MOE_B8_DN_ROWS == 0 &&
        (a->path == CUDA_MOE_PATH_BULK8 ||
         (a->path == CUDA_MOE_PATH_AUTO && a->n_tok <= moe_bulk_max_tok() &&
          a->n_tok < CUDA_MOE_GROUPED8_MIN_TOK && moe_b8_gu_smem(p) <= MOE_B8_AUTO_SMEM)) &&
        moe_bulk_dev_ok() && moe_b8_ready_any(a->gate_type, a->down_type, p);
    const bool grouped8 =
        !bulk8 && p.hq &&
        (a->path == CUDA_MOE_PATH_GROUPED8 ||
         (a->path == CUDA_MOE_PATH_AUTO && a->n_tok >= CUDA_MOE_GROUPED8_MIN_TOK &&
          a->n_tok <= CUDA_MOE_GROUPED8_MAX_TOK));
    const int direct_max = p.hq ? CUDA_MOE_GROUPED8_MIN_TOK - 1 : CUDA_MOE_DIRECT_MAX_TOK;
    const bool autop = a->path == CUDA_MOE_PATH_AUTO && a->n_tok > direct_max && !grouped8;
    bool mma =
        a->path == CUDA_MOE_PATH_MMA || (autop && a->n_tok >= CUDA_MOE_MMA_MIN_TOK &&
                                         a->gate_type != QUANT_F32 && a->down_type != QUANT_F32);
    const bool m8 = p.hq && moe_m8_ok(a->gate_type, a->down_type, a->n_embd, a->n_ff) &&
                    (a->path == CUDA_MOE_PATH_MMA8 || (mma && autop && moe_m8_auto()));
    mma = mma || (a->path == CUDA_MOE_PATH_MMA8 && !m8);
    bool grouped = a->path == CUDA_MOE_PATH_GROUPED || (autop && !mma) ||
                   (a->path == CUDA_MOE_PATH_GROUPED8 && !p.hq);
    cudaStream_t s = (cudaStream_t)a->stream;
    if (a->logits) { /* the experts are still to be selected: in the bulk kernels, or first */
        if (bulk8 && a->n_tok == 1 && a->n_expert <= MOE_TOPK_FUSE_MAX && a->k <= 32 &&
            moe_topk_fuse()) {
            p.logits = a->logits;
            p.ids_w = a->ids_out;
            p.wts_w = a->weights_out;
        } else {
            const struct cuda_topk_args tk = {
                .logits = a->logits,
                .n_tok = a->n_tok,
                .n_expert = a->n_expert,
                .k = a->k,
                .ids = a->ids_out,
                .w = a->weights_out,
                .stream = a->stream,
            };
            const int rc = cuda_softmax_topk(&tk);
            if (rc)
                return rc;
        }
    }
    if (bulk8) {
        if (!p.in_q8) {
            ops_launch(k_moe_quant_x, a->n_tok, MOE_SORT_THREADS, 0, s, p);
            p.in_q8 = p.xq;
            p.in_q8_d = p.xd;
        }
        MOE_DISPATCH(a->gate_type, moe_launch_gate_up_b8, p, (unsigned)p.n_pairs, s);
        MOE_DISPATCH(a->down_type, moe_launch_down_b8, p, (unsigned)a->n_tok, s);
    } else if (grouped8) {
        p.tile = MOE_TILE_Q8;
        ops_launch(k_moe_prep_q8, 1 + a->n_tok, MOE_SORT_THREADS, 0, s, p);
        MOE_DISPATCH(a->gate_type, moe_launch_gate_up_gq8, p, (unsigned)l.max_tiles, s);
        MOE_DISPATCH(a->down_type, moe_launch_down_gq8, p, (unsigned)l.max_tiles, s);
        int64_t total = (int64_t)a->n_tok * a->n_embd;
        unsigned blocks = (unsigned)(moe_cdiv(total, 256) < 4096 ? moe_cdiv(total, 256) : 4096);
        ops_launch(k_moe_combine, blocks, 256, 0, s, p);
    } else if (m8) {
        p.tile = MOE_TILE_MMA;
        int64_t bins = (int64_t)a->n_expert + 1;
        unsigned tiles =
            (unsigned)(moe_cdiv(p.n_pairs, MOE_TILE_MMA) + (p.n_pairs < bins ? p.n_pairs : bins));
        ops_launch(k_moe_prep_q8, 1 + a->n_tok, MOE_SORT_THREADS, 0, s, p);
        if (a->gate_type == QUANT_Q4_K)
            moe_launch_gate_up_m8<QUANT_Q4_K>(p, tiles, s);
        else
            moe_launch_gate_up_m8<QUANT_Q6_K>(p, tiles, s);
        if (a->down_type == QUANT_Q4_K)
            moe_launch_down_m8<QUANT_Q4_K>(p, tiles, s);
        else
            moe_launch_down_m8<QUANT_Q6_K>(p, tiles, s);
        int64_t total = (int64_t)a->n_tok * a->n_embd;
        unsigned blocks = (unsigned)(moe_cdiv(total, 256) < 4096 ? moe_cdiv(total, 256) : 4096);
        ops_launch(k_moe_combine, blocks, 256, 0, s, p);
    } else if (mma) {
        p.tile = MOE_TILE_MMA;
        int64_t bins = (int64_t)a->n_expert + 1;
        unsigned tiles =
            (unsigned)(moe_cdiv(p.n_pairs, MOE_TILE_MMA) + (p.n_pairs < bins ? p.n_pairs : bins));
        ops_launch(k_moe_sort, 1, MOE_SORT_THREADS, 0, s, p);
        MOE_DISPATCH(a->gate_type, moe_launch_mma, p, tiles, s);
        MOE_DISPATCH(a->down_type, moe_launch_down_mma, p, tiles, s);
        int64_t total = (int64_t)a->n_tok * a->n_embd;
        unsigned blocks = (unsigned)(moe_cdiv(total, 256) < 4096 ? moe_cdiv(total, 256) : 4096);
        ops_launch(k_moe_combine, blocks, 256, 0, s, p);
    } else if (grouped) {
        ops_launch(k_moe_sort, 1, MOE_SORT_THREADS, 0, s, p);
        MOE_DISPATCH(a->gate_type, moe_launch_gate_up, p, true, (unsigned)l.max_tiles, s);
        MOE_DISPATCH(a->down_type, moe_launch_down, p, true, (unsigned)l.max_tiles, s);
        int64_t total = (int64_t)a->n_tok * a->n_embd;
        unsigned blocks = (unsigned)(moe_cdiv(total, 256) < 4096 ? moe_cdiv(total, 256) : 4096);
        ops_launch(k_moe_combine, blocks, 256, 0, s, p);
    } else {
        MOE_DISPATCH(a->gate_type, moe_launch_gate_up, p, false, (unsigned)p.n_pairs, s);
        MOE_DISPATCH(a->down_type, moe_launch_down, p, false, (unsigned)a->n_tok, s);
    }
    return cuda_last_error("cuda_moe_ffn");
}
