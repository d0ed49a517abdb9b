/* cuda_ops with CUDA: kernels first, then the C launchers that check shapes, compute the grid
 * and check the launch. Contracts in cuda_ops.h; design and tolerances in docs/cuda-ops.md. */
#include "cuda_check.h"
#include "cuda_mem.h"
#include "cuda_ops.h"
#include "cuda_ops_quant.cuh"
#include "cuda_ops_util.cuh"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>

/* ==== kernels ================================================================================ */

/* ---- embedding: one warp per 256-element group of one row ---------------------------------- */

#define EMBED_WARPS 4

struct embed_params {
    float *out;           /* (n, n_embd) */
    const uint8_t *table; /* (n_vocab rows of row_bytes) */
    uint64_t row_bytes;
    int64_t n_embd, n_vocab;
    const int32_t *ids; /* (n) */
};

template <uint32_t TYPE>
static __global__ void __launch_bounds__(EMBED_WARPS * 32) k_embed(struct embed_params p)
{
    ops_pdl_begin();
    int lane = threadIdx.x & 31;
    int64_t g = (int64_t)blockIdx.y * EMBED_WARPS + (threadIdx.x >> 5);
    if (g * CQ_GROUP >= p.n_embd)
        return;
    int32_t id = p.ids[blockIdx.x];
    bool ok = id >= 0 && id < p.n_vocab;
    const uint8_t *row = p.table + (uint64_t)(ok ? id : 0) * p.row_bytes;
    float v[8];
    int64_t a0, a1;
    if (!cq_decoder<TYPE>::decode(row, p.n_embd, g, lane, v, &a0, &a1))
        return;
    float *o = p.out + (int64_t)blockIdx.x * p.n_embd;
#pragma unroll
    for (int c = 0; c < 4; c++) {
        o[a0 + c] = ok ? v[c] : NAN;
        o[a1 + c] = ok ? v[4 + c] : NAN;
    }
}

/* ---- RMSNorm: one block per row, the sum of squares in double ------------------------------ */

#define NORM_THREADS 256

struct rmsnorm_params {
    float *out;
    const float *in;
    float *resid;
    const float *w;
    int dim;
    float eps;
    int8_t *qs; /* NULL, or out's 8-bit copy (cuda_rmsnorm_args.q8_codes) */
    float2 *qd;
};

/* PER elements per thread kept in registers: rows up to NORM_THREADS * PER (8: 2048, 16: 4096;
 * longer rows take a loop). Both sum each thread's squares in the same order as the loop. */
template <int PER>
static __global__ void __launch_bounds__(NORM_THREADS) k_rmsnorm(struct rmsnorm_params p)
{
    if (p.w && blockIdx.x == 0 && threadIdx.x == 0) /* the weight, ahead of the wait */
        ops_l2_prefetch(p.w, p.w + p.dim);
    ops_pdl_begin();
    __shared__ double part[NORM_THREADS / 32];
    int64_t base = (int64_t)blockIdx.x * p.dim;
    const float *in = p.in + base;
    float *res = p.resid ? p.resid + base : NULL;
    float *out = p.out + base;
    double ss = 0.0;
    /* rows up to NORM_THREADS * PER: every load is issued before any store (in, out and resid
     * may alias, so a store between loads would serialize them), and the values stay in
     * registers for the second pass */
    const bool regs = p.dim <= NORM_THREADS * PER;
    float xv[PER], wv[PER]; /* the weight too, before the reduction */

    if (regs) {
#pragma unroll
        for (int j = 0; j < PER; j++) {
            int i = threadIdx.x + j * NORM_THREADS;
            xv[j] = i < p.dim ? in[i] : 0.0f;
            wv[j] = p.w && i < p.dim ? p.w[i] : 1.0f;
            if (res && i < p.dim)
                xv[j] = __fadd_rn(res[i], xv[j]);
        }
#pragma unroll
        for (int j = 0; j < PER; j++) {
            int i = threadIdx.x + j * NORM_THREADS;
            if (i < p.dim) {
                if (res)
                    res[i] = xv[j];
                ss += (double)xv[j] * xv[j];
            }
        }
    } else {
        /* each thread touches the same elements in both passes, so in/out/resid may alias */
        for (int i = threadIdx.x; i < p.dim; i += NORM_THREADS) {
            float x = in[i];
            if (res) {
                x = __fadd_rn(res[i], x);
                res[i] = x;
            }
            ss += (double)x * x;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = ss;
    __syncthreads();
    double tot = 0.0;
#pragma unroll
    for (int i = 0; i < NORM_THREADS / 32; i++)
        tot += part[i];
    float inv = 1.0f / sqrtf((float)(tot / p.dim) + p.eps);
    /* with the 8-bit copy, dim is a multiple of 32: i < dim is uniform over a warp */
    if (regs) {
        __shared__ __align__(16) float ys[NORM_THREADS * PER];
#pragma unroll
        for (int j = 0; j < PER; j++) {
            int i = threadIdx.x + j * NORM_THREADS;
            if (i < p.dim) {
                float y = __fmul_rn(xv[j], inv);
                y = p.w ? __fmul_rn(y, wv[j]) : y;
                out[i] = y;
                ys[i] = y;
            }
        }
        if (p.qs) { /* the 8-bit copy: 8 consecutive elements per thread (ops_q8_store8) in
                     * each pass of 8 NORM_THREADS elements, every lane in every pass */
            __syncthreads();
#pragma unroll
            for (int k = 0; k < PER / 8; k++) {
                const int i0 = 8 * (threadIdx.x + k * NORM_THREADS);
                float v[8];
                const float4 a = *(const float4 *)(ys + i0), b = *(const float4 *)(ys + i0 + 4);
                v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
                v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
                ops_q8_store8(v, i0 < p.dim, (int64_t)blockIdx.x * p.dim + i0, p.qs, p.qd);
            }
        }
        return;
    }
    for (int i = threadIdx.x; i < p.dim; i += NORM_THREADS) {
        float y = __fmul_rn(res ? res[i] : in[i], inv);
        y = p.w ? __fmul_rn(y, p.w[i]) : y;
        out[i] = y;
        if (p.qs)
            ops_q8_store(y, (int64_t)blockIdx.x * p.dim + i, p.qs, p.qd);
    }
}

/* ---- RoPE: one block per (token, ROPE_HEADS heads); cos/sin of each pair index, then the heads */

#define ROPE_THREADS 128
#define ROPE_MAX_HALF 512 /* head_dim <= 1024 */
#define ROPE_HEADS 4      /* heads per block (grid: tokens x head groups) */
#define ROPE_PER 4        /* pairs per thread kept in registers: 4 heads of head_dim <= 256 */

struct rope_params {
    float *x;
    int n_heads, head_dim, pos0;
    const int32_t *pos_dev;
    float base;
    int n_freq; /* 0: base^(-2i/head_dim); else freq[0..n_freq) and mscale (YaRN) */
    float mscale;
    double freq[CUDA_ROPE_MAX_FREQ];
};

static __global__ void __launch_bounds__(ROPE_THREADS) k_rope_neox(struct rope_params p)
{
    ops_pdl_begin();
    __shared__ float cs[ROPE_MAX_HALF], sn[ROPE_MAX_HALF];
    int t = blockIdx.x, half = p.head_dim / 2;
    double pos = p.pos_dev ? p.pos_dev[t] : p.pos0 + t;

    for (int i = threadIdx.x; i < half; i += ROPE_THREADS) {
        double f = p.n_freq ? p.freq[i] : pow((double)p.base, -2.0 * i / p.head_dim);
        double theta = pos * f, c, sv;
        sincos(theta, &sv, &c); /* one argument reduction for both */
        cs[i] = p.n_freq ? (float)c * p.mscale : (float)c;
        sn[i] = p.n_freq ? (float)sv * p.mscale : (float)sv;
    }
    __syncthreads();
    /* this block's heads: every load is issued before any store (the two halves of a pair
     * are read and written in place, so interleaving would serialize them) */
    const int h0 = blockIdx.y * ROPE_HEADS, nh = min(ROPE_HEADS, p.n_heads - h0);
    float *x = p.x + ((int64_t)t * p.n_heads + h0) * p.head_dim;
    const int n = nh * half;
    if (n <= ROPE_THREADS * ROPE_PER) {
        float a[ROPE_PER], b[ROPE_PER];
#pragma unroll
        for (int j = 0; j < ROPE_PER; j++) {
            int e = threadIdx.x + j * ROPE_THREADS, h = e / half, i = e - h * half;
            if (e < n) {
                a[j] = x[(int64_t)h * p.head_dim + i];
                b[j] = x[(int64_t)h * p.head_dim + i + half];
            }
        }
#pragma unroll
        for (int j = 0; j < ROPE_PER; j++) {
            int e = threadIdx.x + j * ROPE_THREADS, h = e / half, i = e - h * half;
            if (e < n) {
                float c = cs[i], sv = sn[i];
                x[(int64_t)h * p.head_dim + i] = __fsub_rn(__fmul_rn(a[j], c), __fmul_rn(b[j], sv));
                x[(int64_t)h * p.head_dim + i + half] =
                    __fadd_rn(__fmul_rn(a[j], sv), __fmul_rn(b[j], c));
            }
        }
        return;
    }
    for (int e = threadIdx.x; e < n; e += ROPE_THREADS) {
        int h = e / half, i = e - h * half;
        float *v = x + (int64_t)h * p.head_dim;
        float a = v[i], b = v[i + half], c = cs[i], s = sn[i];
        v[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        v[i + half] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
    }
}

/* ---- attention prologue: a block per (token, head) -----------------------------------------
 * Blocks 0 .. n_head - 1 of grid row y take the q heads, the next n_head_kv the k heads (also
 * stored to the cache), the last n_head_kv copy v heads into the cache. Thread i holds element
 * i of the head: the norm's sum of squares goes through the same shuffles and partial sums as
 * k_rmsnorm's (whose threads past head_dim add zeros), the rotation is k_rope_neox's. */

#define QKR_THREADS NORM_THREADS

struct qkr_params {
    float *q, *k;
    const float *v, *qw, *kw;
    float eps;
    int n_tok, n_head, n_kv, hd, pos0;
    const int32_t *pos_dev;
    float base;
    float *kc, *vc;
    float *const *caches;
    int n_ctx;
    int n_freq; /* 0, or hd / 2: freq and mscale as k_rope_neox's */
    float mscale;
    int early; /* the norm weights and angles before the wait (ops_early) */
    double freq[CUDA_ROPE_MAX_FREQ];
};

static __global__ void __launch_bounds__(QKR_THREADS) k_qk_rope_store(struct qkr_params p)
{
    __shared__ double part[QKR_THREADS / 32];
    __shared__ float xs[CUDA_QKR_MAX_HEAD_DIM];
    const int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x, hd = p.hd, half = hd / 2;
    const int64_t kvw = (int64_t)p.n_kv * hd;
    /* before the wait: the position (the step's, written before its first kernel), the norm's
     * weight and the rotation's angle, which depend on nothing the kernels before write */
    const int pos = p.pos_dev ? p.pos_dev[t] : p.pos0 + t;
    const bool store = pos >= 0 && pos < p.n_ctx;
    const bool isq = h < p.n_head, isv = h >= p.n_head + p.n_kv;
    const float *w = isq ? p.qw : p.kw;
    float wv = 1.0f, cf = 0.0f, sf = 0.0f;
    for (int pass = p.early ? 0 : 1; pass < 2; pass++) { /* pass 1: after the wait */
        if (pass == 1)
            ops_pdl_begin();
        if (pass == (p.early ? 0 : 1)) {
            wv = !isv && w && i < hd ? w[i] : 1.0f;
            if (!isv && i < half) {
                double f = p.n_freq ? p.freq[i] : pow((double)p.base, -2.0 * i / hd), c, sv;
                sincos((double)pos * f, &sv, &c);
                cf = p.n_freq ? (float)c * p.mscale : (float)c;
                sf = p.n_freq ? (float)sv * p.mscale : (float)sv;
            }
        }
    }
    if (isv) { /* a v head: into the cache */
        const int64_t off = (int64_t)(h - p.n_head - p.n_kv) * hd + i;
        float *vc = p.caches ? p.caches[p.n_tok + t] : p.vc;
        if (store && i < hd)
            vc[(int64_t)pos * kvw + off] = p.v[(int64_t)t * kvw + off];
        return;
    }
    float *x = isq ? p.q + ((int64_t)t * p.n_head + h) * hd
                   : p.k + (int64_t)t * kvw + (int64_t)(h - p.n_head) * hd;
    float xv = i < hd ? x[i] : 0.0f;
    if (w) {
        double ss = 0.0;
        if (i < hd)
            ss += (double)xv * xv;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if ((i & 31) == 0)
            part[i >> 5] = ss;
        __syncthreads();
        double tot = 0.0;
#pragma unroll
        for (int j = 0; j < QKR_THREADS / 32; j++)
            tot += part[j];
        const float inv = 1.0f / sqrtf((float)(tot / hd) + p.eps);
        xv = __fmul_rn(__fmul_rn(xv, inv), wv);
    }
    if (i < hd)
        xs[i] = xv;
    __syncthreads();
    if (i >= half)
        return;
    const float a = xs[i], b = xs[i + half];
    const float o0 = __fsub_rn(__fmul_rn(a, cf), __fmul_rn(b, sf));
    const float o1 = __fadd_rn(__fmul_rn(a, sf), __fmul_rn(b, cf));
    x[i] = o0;
    x[i + half] = o1;
    if (!isq && store) {
        float *kc =
            (p.caches ? p.caches[t] : p.kc) + (int64_t)pos * kvw + (int64_t)(h - p.n_head) * hd;
        kc[i] = o0;
        kc[i + half] = o1;
    }
}

/* ---- KV store and add: grid-stride copies -------------------------------------------------- */

struct kv_store_params {
    float *cache;
    const float *src;
    int64_t total; /* n_tok * width */
    int width, n_ctx, pos0;
    const int32_t *pos_dev;
    float *const *caches;
};

static __global__ void k_kv_store(struct kv_store_params p)
{
    ops_pdl_begin();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int t = (int)(i / p.width), c = (int)(i - (int64_t)t * p.width);
        int pos = p.pos_dev ? p.pos_dev[t] : p.pos0 + t;
        float *cache = p.caches ? p.caches[t] : p.cache;
        if (pos >= 0 && pos < p.n_ctx)
            cache[(int64_t)pos * p.width + c] = p.src[i];
    }
}

static __global__ void k_add(float *x, const float *y, size_t n)
{
    ops_pdl_begin();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = __fadd_rn(x[i], y[i]);
}

/* ---- argmax: one block per row; (value, index) pairs reduced with ties to the lower index ---
 * A thread walks its elements in ascending order (16-byte loads, four in flight, where the row
 * is aligned), keeping the first of equal values; 1024 threads so that one SM has enough loads
 * in flight for a 200k-entry row of logits. */

#define ARGMAX_THREADS 1024

/* Whether candidate (v2, i2) beats (v1, i1); i < 0 marks "no candidate". */
static __device__ __forceinline__ bool ops_better(float v2, int i2, float v1, int i1)
{
    return i2 >= 0 && (i1 < 0 || v2 > v1 || (v2 == v1 && i2 < i1));
}

/* Butterfly reduction of (v, i) over a warp; every lane ends with the best pair. */
static __device__ __forceinline__ void ops_warp_best(float *v, int *i)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, *v, o);
        int oi = __shfl_xor_sync(0xffffffffu, *i, o);
        if (ops_better(ov, oi, *v, *i))
            *v = ov, *i = oi;
    }
}

/* A thread's best (value, index) over row[lo, hi) of T threads: 16-byte groups t, t + T, ...
 * (four loads in flight) where row + lo is aligned, then the elements past them one at a time;
 * ascending per thread, the first of equal values kept. */
template <int T>
static __device__ __forceinline__ void argmax_walk(const float *row, int lo, int hi, float *pv,
                                                   int *pi)
{
    float bv = -INFINITY;
    int bi = -1;
    int i0 = lo; /* elements before i0 were taken by the vector loop */
    if (((uintptr_t)(row + lo) & 15) == 0) {
        const float4 *r4 = (const float4 *)(row + lo);
        const int n4 = (hi - lo) / 4;
        for (int b = 0; b < n4; b += 4 * T) {
            float4 v[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int j = b + k * T + threadIdx.x;
                v[k] = j < n4 ? r4[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int j = b + k * T + threadIdx.x;
                const float e[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
#pragma unroll
                for (int c = 0; c < 4; c++)
                    if (j < n4 && (bi < 0 || e[c] > bv)) /* ascending: the first equal stays */
                        bv = e[c], bi = lo + 4 * j + c;
            }
        }
        i0 = lo + 4 * n4;
    }
    for (int i = i0 + threadIdx.x; i < hi; i += T) {
        float v = row[i];
        if (bi < 0 || v > bv) /* ascending i: the first of equal values stays */
            bv = v, bi = i;
    }
    *pv = bv;
    *pi = bi;
}

/* The block's best pair of its T threads' (warp butterflies, then the warps in order), in
 * thread 0's *pv, *pi. */
template <int T> static __device__ __forceinline__ void argmax_block(float *pv, int *pi)
{
    __shared__ float sv[T / 32];
    __shared__ int si[T / 32];
    float bv = *pv;
    int bi = *pi;
    ops_warp_best(&bv, &bi);
    if ((threadIdx.x & 31) == 0) {
        sv[threadIdx.x >> 5] = bv;
        si[threadIdx.x >> 5] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < T / 32; w++)
            if (ops_better(sv[w], si[w], bv, bi))
                bv = sv[w], bi = si[w];
        *pv = bv;
        *pi = bi;
    }
}

static __global__ void __launch_bounds__(ARGMAX_THREADS)
    k_argmax(const float *x, int n, int32_t *out)
{
    ops_pdl_begin();
    float bv;
    int bi;
    argmax_walk<ARGMAX_THREADS>(x + (int64_t)blockIdx.x * n, 0, n, &bv, &bi);
    argmax_block<ARGMAX_THREADS>(&bv, &bi);
    if (threadIdx.x == 0)
        out[blockIdx.x] = bi;
}

/* One row over several blocks: block b walks elements [b len, (b + 1) len) as k_argmax walks its
 * row (ascending per thread, the first of equal values kept), writes its best pair to the
 * scratch, and the last block to finish reduces the blocks' pairs with ops_better (ties to the
 * lower index): the index k_argmax gives, as long as the row holds no NaN. */

#define ARGMAX_WIDE_THREADS 256
#define ARGMAX_WIDE_BLOCKS 128 /* at most; CUDA_ARGMAX_SCRATCH holds their pairs */
static_assert(ARGMAX_WIDE_BLOCKS * 8 + 16 <= CUDA_ARGMAX_SCRATCH, "argmax scratch");

static __global__ void __launch_bounds__(ARGMAX_WIDE_THREADS)
    k_argmax_wide(const float *x, int n, int len, int32_t *out, void *scratch)
{
    ops_pdl_begin();
    __shared__ bool last;
    float *pv = (float *)scratch;
    int *pi = (int *)(pv + ARGMAX_WIDE_BLOCKS);
    unsigned *done = (unsigned *)(pi + ARGMAX_WIDE_BLOCKS);
    const int lo = blockIdx.x * len;
    float bv;
    int bi;
    argmax_walk<ARGMAX_WIDE_THREADS>(x, lo, min(n, lo + len), &bv, &bi);
    argmax_block<ARGMAX_WIDE_THREADS>(&bv, &bi);
    if (threadIdx.x == 0) {
        pv[blockIdx.x] = bv;
        pi[blockIdx.x] = bi;
        __threadfence();
        last = atomicAdd(done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last || threadIdx.x >= 32)
        return;
    __threadfence();
    bv = -INFINITY, bi = -1;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += 32) {
        const float v = ((volatile float *)pv)[b];
        const int i = ((volatile int *)pi)[b];
        if (ops_better(v, i, bv, bi))
            bv = v, bi = i;
    }
    ops_warp_best(&bv, &bi);
    if (threadIdx.x == 0) {
        *out = bi;
        *done = 0;
    }
}

/* ---- router: one warp per token; k rounds of a warp argmax over the untaken experts -------- */

#define TOPK_WARPS 4
#define TOPK_PER_LANE (CUDA_TOPK_MAX_EXPERT / 32) /* the most logits a lane holds */

struct topk_params {
    const float *logits;
    int n_tok, n_expert, k;
    int32_t *ids;
    float *w;
};

/* PL: logits per lane, the smallest power of two with 32 PL >= n_expert (every loop below runs
 * over PL entries, so the largest PL for 128 experts would waste most of the warp's work) */
template <int PL>
static __global__ void __launch_bounds__(TOPK_WARPS * 32) k_softmax_topk(struct topk_params p)
{
    ops_pdl_begin();
    int lane = threadIdx.x & 31, t = blockIdx.x * TOPK_WARPS + (threadIdx.x >> 5);
    if (t >= p.n_tok) /* whole warps leave together */
        return;
    const float *l = p.logits + (int64_t)t * p.n_expert;
    float v[PL], selv[CUDA_TOPK_MAX_K];
    float mx = -INFINITY, sum = 0.0f;
    uint32_t taken = 0; /* bit i: expert lane + 32 i already selected */

#pragma unroll
    for (int i = 0; i < PL; i++) {
        int e = lane + 32 * i;
        v[i] = e < p.n_expert ? l[e] : -INFINITY;
        mx = fmaxf(mx, v[i]);
    }
    mx = ops_warp_max(mx);
#pragma unroll
    for (int i = 0; i < PL; i++)
        if (lane + 32 * i < p.n_expert)
            sum += expf(v[i] - mx);
    sum = ops_warp_sum(sum);
    for (int r = 0; r < p.k; r++) {
        float bv = -INFINITY;
        int bi = -1;
#pragma unroll
        for (int i = 0; i < PL; i++) {
            int e = lane + 32 * i;
            if (e < p.n_expert && !((taken >> i) & 1) && (bi < 0 || v[i] > bv))
                bv = v[i], bi = e;
        }
        ops_warp_best(&bv, &bi);
        if ((bi & 31) == lane)
            taken |= 1u << (bi >> 5);
        if (lane == 0)
            p.ids[(int64_t)t * p.k + r] = bi;
        selv[r] = bv;
    }
    /* as moe_route_softmax_topk: w_r = exp(l - mx) / sum, then divided by their sum in order */
    float sel = 0.0f;
    for (int r = 0; r < p.k; r++)
        sel += expf(selv[r] - mx) / sum;
    for (int r = lane; r < p.k; r += 32)
        p.w[(int64_t)t * p.k + r] = expf(selv[r] - mx) / sum / sel;
}

/* ==== launchers ============================================================================== */

extern "C" int cuda_type_supported(uint32_t type)
{
    return cq_supported(type);
}

template <uint32_t TYPE>
static void embed_launch(const struct embed_params &p, dim3 grid, cudaStream_t s)
{
    ops_launch(k_embed<TYPE>, grid, EMBED_WARPS * 32, 0, s, p);
}

extern "C" int cuda_embed(const struct cuda_embed_args *a)
{
    uint64_t rb = a ? cq_row_bytes(a->type, a->n_embd) : 0;
    if (!rb || a->n < 0 || a->n_vocab <= 0 || a->row_bytes < rb ||
        !ops_aligned(a->table, cq_row_align(a->type)) || a->row_bytes % cq_row_align(a->type))
        return -EINVAL;
    if (a->n == 0)
        return 0;
    if (!a->out || !a->table || !a->ids)
        return -EINVAL;
    struct embed_params p = {a->out, (const uint8_t *)a->table, a->row_bytes, a->n_embd, a->n_vocab,
                             a->ids};
    int64_t n_groups = (a->n_embd + CQ_GROUP - 1) / CQ_GROUP;
    dim3 grid((unsigned)a->n, (unsigned)((n_groups + EMBED_WARPS - 1) / EMBED_WARPS));
    cudaStream_t s = (cudaStream_t)a->stream;
    switch (a->type) {
    case QUANT_F32:
        embed_launch<QUANT_F32>(p, grid, s);
        break;
    case QUANT_F16:
        embed_launch<QUANT_F16>(p, grid, s);
        break;
    case QUANT_BF16:
        embed_launch<QUANT_BF16>(p, grid, s);
        break;
    case QUANT_Q4_0:
        embed_launch<QUANT_Q4_0>(p, grid, s);
        break;
    case QUANT_Q8_0:
        embed_launch<QUANT_Q8_0>(p, grid, s);
        break;
    case QUANT_MXFP4:
        embed_launch<QUANT_MXFP4>(p, grid, s);
        break;
    case QUANT_Q4_K:
        embed_launch<QUANT_Q4_K>(p, grid, s);
        break;
    case QUANT_Q5_K:
        embed_launch<QUANT_Q5_K>(p, grid, s);
        break;
    case QUANT_Q6_K:
        embed_launch<QUANT_Q6_K>(p, grid, s);
        break;
    default:
        return -EINVAL;
    }
    return cuda_last_error("cuda_embed");
}

extern "C" int cuda_rmsnorm(const struct cuda_rmsnorm_args *a)
{
    if (!a || a->rows < 0 || a->dim < 1)
        return -EINVAL;
    if (a->rows == 0)
        return 0;
    if (!a->out || !a->in)
        return -EINVAL;
    if (a->q8_codes && (a->dim % 32 || !a->q8_scales || !ops_aligned(a->q8_scales, 8)))
        return -EINVAL;
    struct rmsnorm_params p = {a->out, a->in,  a->resid,    a->w,
                               a->dim, a->eps, a->q8_codes, (float2 *)a->q8_scales};
    if (a->dim > NORM_THREADS * 8 && a->dim <= NORM_THREADS * 16)
        ops_launch(k_rmsnorm<16>, a->rows, NORM_THREADS, 0, (cudaStream_t)a->stream, p);
    else
        ops_launch(k_rmsnorm<8>, a->rows, NORM_THREADS, 0, (cudaStream_t)a->stream, p);
    return cuda_last_error("cuda_rmsnorm");
}

extern "C" int cuda_rope_neox(const struct cuda_rope_args *a)
{
    if (!a || a->n_tok < 0 || a->n_heads < 1 || a->head_dim < 2 || a->head_dim % 2 ||
        a->head_dim / 2 > ROPE_MAX_HALF)
        return -EINVAL;
    if (a->n_tok == 0)
        return 0;
    if (!a->x)
        return -EINVAL;
    if (a->freq && a->head_dim / 2 > CUDA_ROPE_MAX_FREQ)
        return -EINVAL;
    struct rope_params p = {a->x, a->n_heads, a->head_dim, a->pos0, a->pos_dev, a->base, 0, 1.0f,
                            {0}};
    if (a->freq) {
        p.n_freq = a->head_dim / 2;
        p.mscale = a->mscale;
        for (int i = 0; i < p.n_freq; i++)
            p.freq[i] = a->freq[i];
    }
    dim3 grid((unsigned)a->n_tok, (unsigned)ops_cdiv(a->n_heads, ROPE_HEADS));
    ops_launch(k_rope_neox, grid, ROPE_THREADS, 0, (cudaStream_t)a->stream, p);
    return cuda_last_error("cuda_rope_neox");
}

/* Blocks for a grid-stride loop over n elements. */
static unsigned ops_stride_blocks(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 4096 ? 4096 : b);
}

extern "C" int cuda_kv_store(const struct cuda_kv_store_args *a)
{
    if (!a || a->n_tok < 0 || a->width < 1 || a->n_ctx < 1)
        return -EINVAL;
    if (!a->pos_dev && (a->pos0 < 0 || (int64_t)a->pos0 + a->n_tok > a->n_ctx))
        return -EINVAL;
    if (a->n_tok == 0)
        return 0;
    if ((!a->cache && !a->caches_dev) || !a->src || (a->caches_dev && !a->pos_dev))
        return -EINVAL;
    struct kv_store_params p = {a->cache,  a->src,  (int64_t)a->n_tok * a->width, a->width,
                                a->n_ctx,  a->pos0, a->pos_dev, a->caches_dev};
    ops_launch(k_kv_store, ops_stride_blocks(p.total, 256), 256, 0, (cudaStream_t)a->stream, p);
    return cuda_last_error("cuda_kv_store");
}

extern "C" int cuda_qk_rope_store(const struct cuda_qk_rope_store_args *a)
{
    if (!a || a->n_tok < 0 || a->n_head < 1 || a->n_head_kv < 1 || a->head_dim < 2 ||
        a->head_dim % 2 || a->head_dim > CUDA_QKR_MAX_HEAD_DIM || a->n_ctx < 1)
        return -EINVAL;
    if (!a->pos_dev && (a->pos0 < 0 || (int64_t)a->pos0 + a->n_tok > a->n_ctx))
        return -EINVAL;
    if (a->n_tok == 0)
        return 0;
    if (!a->q || !a->k || !a->v || (a->caches_dev ? !a->pos_dev : !a->k_cache || !a->v_cache))
        return -EINVAL;
    if (a->freq && a->head_dim / 2 > CUDA_ROPE_MAX_FREQ)
        return -EINVAL;
    struct qkr_params p = {
        a->q,       a->k,          a->v,        a->q_norm, a->k_norm,  a->eps,  a->n_tok,
        a->n_head,  a->n_head_kv,  a->head_dim, a->pos0,   a->pos_dev, a->base, a->k_cache,
        a->v_cache, a->caches_dev, a->n_ctx,    0,         1.0f,       0,       {},
    };
    p.early = (ops_early() & OPS_EARLY_ROPE) != 0;
    if (a->freq) {
        p.n_freq = a->head_dim / 2;
        p.mscale = a->mscale;
        for (int i = 0; i < p.n_freq; i++)
            p.freq[i] = a->freq[i];
    }
    dim3 grid((unsigned)a->n_tok, (unsigned)(a->n_head + 2 * a->n_head_kv));
    ops_launch(k_qk_rope_store, grid, QKR_THREADS, 0, (cudaStream_t)a->stream, p);
    return cuda_last_error("cuda_qk_rope_store");
}

extern "C" int cuda_add(float *x, const float *y, size_t n, void *stream)
{
    if (n == 0)
        return 0;
    if (!x || !y)
        return -EINVAL;
    ops_launch(k_add, ops_stride_blocks((int64_t)n, 256), 256, 0, (cudaStream_t)stream, x, y, n);
    return cuda_last_error("cuda_add");
}

static __global__ void k_add_bias(float *x, const float *b, int64_t n, int dim)
{
    ops_pdl_begin();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] += b[i % dim];
}

extern "C" int cuda_add_bias(float *x, const float *bias, int rows, int dim, void *stream)
{
    if (rows < 0 || dim < 1)
        return -EINVAL;
    if (rows == 0)
        return 0;
    if (!x || !bias)
        return -EINVAL;
    int64_t n = (int64_t)rows * dim;
    ops_launch(k_add_bias, ops_stride_blocks(n, 256), 256, 0, (cudaStream_t)stream, x, bias, n,
               dim);
    return cuda_last_error("cuda_add_bias");
}

extern "C" int cuda_argmax(const float *x, int rows, int n, int32_t *out, void *stream)
{
    if (rows < 0 || n < 1)
        return -EINVAL;
    if (rows == 0)
        return 0;
    if (!x || !out)
        return -EINVAL;
    ops_launch(k_argmax, rows, ARGMAX_THREADS, 0, (cudaStream_t)stream, x, n, out);
    return cuda_last_error("cuda_argmax");
}

extern "C" int cuda_argmax_wide(const float *x, int n, int32_t *out, void *scratch, void *stream)
{
    if (n < 1 || !x || !out || !scratch || !ops_aligned(scratch, 16))
        return -EINVAL;
    /* blocks of at least 4096 elements (16 per thread), at most ARGMAX_WIDE_BLOCKS */
    int blocks = (int)ops_cdiv(n, 4096);
    blocks = blocks < 1 ? 1 : blocks > ARGMAX_WIDE_BLOCKS ? ARGMAX_WIDE_BLOCKS : blocks;
    const int len = (int)ops_cdiv(ops_cdiv(n, blocks), 4) * 4;
    blocks = (int)ops_cdiv(n, len);
    ops_launch(k_argmax_wide, blocks, ARGMAX_WIDE_THREADS, 0, (cudaStream_t)stream, x, n, len, out,
               scratch);
    return cuda_last_error("cuda_argmax_wide");
}

extern "C" int cuda_softmax_topk(const struct cuda_topk_args *a)
{
    if (!a || a->n_tok < 0 || a->n_expert < 1 || a->n_expert > CUDA_TOPK_MAX_EXPERT || a->k < 1 ||
        a->k > a->n_expert || a->k > CUDA_TOPK_MAX_K)
        return -EINVAL;
    if (a->n_tok == 0)
        return 0;
    if (!a->logits || !a->ids || !a->w)
        return -EINVAL;
    struct topk_params p = {a->logits, a->n_tok, a->n_expert, a->k, a->ids, a->w};
    const unsigned blocks = (unsigned)ops_cdiv(a->n_tok, TOPK_WARPS);
    cudaStream_t s = (cudaStream_t)a->stream;
    if (a->n_expert <= 32 * 4)
        ops_launch(k_softmax_topk<4>, blocks, TOPK_WARPS * 32, 0, s, p);
    else if (a->n_expert <= 32 * 8)
        ops_launch(k_softmax_topk<8>, blocks, TOPK_WARPS * 32, 0, s, p);
    else if (a->n_expert <= 32 * 16)
        ops_launch(k_softmax_topk<16>, blocks, TOPK_WARPS * 32, 0, s, p);
    else
        ops_launch(k_softmax_topk<TOPK_PER_LANE>, blocks, TOPK_WARPS * 32, 0, s, p);
    return cuda_last_error("cuda_softmax_topk");
}
