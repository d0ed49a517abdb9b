/* cuda_ops with CUDA: kernels first, then the C launchers that check shapes, compute the grid
 * and check the launch. Contracts in cuda_ops.h; design and tolerances in docs/cuda-ops.md. */
#include "cuda_check.h"
#include "cuda_mem.h"
#include "cuda_ops.h"
#include "cuda_ops_quant.cuh"

#include <errno.h>
#include <math.h>
#include <stdint.h>

static __host__ __device__ __forceinline__ int ops_imin(int a, int b)
{
    return a < b ? a : b;
}

static __host__ __device__ __forceinline__ int ops_imax(int a, int b)
{
    return a > b ? a : b;
}

static __host__ __device__ __forceinline__ int ops_cdiv(int a, int b)
{
    return (a + b - 1) / b;
}

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
};

#define NORM_MAX_PER 8 /* elements per thread kept in registers: rows up to 2048 */

static __global__ void __launch_bounds__(NORM_THREADS) k_rmsnorm(struct rmsnorm_params p)
{
    __shared__ double part[NORM_THREADS / 32];
    int64_t base = (int64_t)blockIdx.x * p.dim;
    const float *in = p.in + base;
    float *res = p.resid ? p.resid + base : NULL;
    float *out = p.out + base;
    double ss = 0.0;
    /* rows up to NORM_THREADS * NORM_MAX_PER: every load is issued before any store (in, out
     * and resid may alias, so a store between loads would serialize them), and the values
     * stay in registers for the second pass */
    const bool regs = p.dim <= NORM_THREADS * NORM_MAX_PER;
    float xv[NORM_MAX_PER], wv[NORM_MAX_PER]; /* the weight too, before the reduction */

    if (regs) {
#pragma unroll
        for (int j = 0; j < NORM_MAX_PER; j++) {
            int i = threadIdx.x + j * NORM_THREADS;
            xv[j] = i < p.dim ? in[i] : 0.0f;
            wv[j] = p.w && i < p.dim ? p.w[i] : 1.0f;
            if (res && i < p.dim)
                xv[j] = __fadd_rn(res[i], xv[j]);
        }
#pragma unroll
        for (int j = 0; j < NORM_MAX_PER; j++) {
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
    if (regs) {
#pragma unroll
        for (int j = 0; j < NORM_MAX_PER; j++) {
            int i = threadIdx.x + j * NORM_THREADS;
            if (i < p.dim) {
                float y = __fmul_rn(xv[j], inv);
                out[i] = p.w ? __fmul_rn(y, wv[j]) : y;
            }
        }
        return;
    }
    for (int i = threadIdx.x; i < p.dim; i += NORM_THREADS) {
        float y = __fmul_rn(res ? res[i] : in[i], inv);
        out[i] = p.w ? __fmul_rn(y, p.w[i]) : y;
    }
}

/* ---- RoPE: one block per (token, ROPE_HEADS heads); cos/sin of each pair index, then the heads - */

#define ROPE_THREADS 128
#define ROPE_MAX_HALF 512 /* head_dim <= 1024 */
#define ROPE_HEADS 4      /* heads per block (grid: tokens x head groups) */
#define ROPE_PER 4        /* pairs per thread kept in registers: 4 heads of head_dim <= 256 */

struct rope_params {
    float *x;
    int n_heads, head_dim, pos0;
    const int32_t *pos_dev;
    float base;
};

static __global__ void __launch_bounds__(ROPE_THREADS) k_rope_neox(struct rope_params p)
{
    __shared__ float cs[ROPE_MAX_HALF], sn[ROPE_MAX_HALF];
    int t = blockIdx.x, half = p.head_dim / 2;
    double pos = p.pos_dev ? p.pos_dev[t] : p.pos0 + t;

    for (int i = threadIdx.x; i < half; i += ROPE_THREADS) {
        double theta = pos * pow((double)p.base, -2.0 * i / p.head_dim), c, sv;
        sincos(theta, &sv, &c); /* one argument reduction for both */
        cs[i] = (float)c;
        sn[i] = (float)sv;
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

/* ---- KV store and add: grid-stride copies -------------------------------------------------- */

struct kv_store_params {
    float *cache;
    const float *src;
    int64_t total; /* n_tok * width */
    int width, n_ctx, pos0;
    const int32_t *pos_dev;
};

static __global__ void k_kv_store(struct kv_store_params p)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int t = (int)(i / p.width), c = (int)(i - (int64_t)t * p.width);
        int pos = p.pos_dev ? p.pos_dev[t] : p.pos0 + t;
        if (pos >= 0 && pos < p.n_ctx)
            p.cache[(int64_t)pos * p.width + c] = p.src[i];
    }
}

static __global__ void k_add(float *x, const float *y, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = __fadd_rn(x[i], y[i]);
}

/* ---- argmax: one block per row; (value, index) pairs reduced with ties to the lower index --- */

#define ARGMAX_THREADS 256

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

static __global__ void __launch_bounds__(ARGMAX_THREADS)
    k_argmax(const float *x, int n, int32_t *out)
{
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ int si[ARGMAX_THREADS / 32];
    const float *row = x + (int64_t)blockIdx.x * n;
    float bv = -INFINITY;
    int bi = -1;

    for (int i = threadIdx.x; i < n; i += ARGMAX_THREADS) {
        float v = row[i];
        if (bi < 0 || v > bv) /* ascending i: the first of equal values stays */
            bv = v, bi = i;
    }
    ops_warp_best(&bv, &bi);
    if ((threadIdx.x & 31) == 0) {
        sv[threadIdx.x >> 5] = bv;
        si[threadIdx.x >> 5] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ARGMAX_THREADS / 32; w++)
            if (ops_better(sv[w], si[w], bv, bi))
                bv = sv[w], bi = si[w];
        out[blockIdx.x] = bi;
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
    mx = cq_warp_max(mx);
#pragma unroll
    for (int i = 0; i < PL; i++)
        if (lane + 32 * i < p.n_expert)
            sum += expf(v[i] - mx);
    sum = cq_warp_sum(sum);
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

/* ---- attention -------------------------------------------------------------------------------
 * One block of ATT_THREADS handles R query rows of one kv head for one key split. A row is a
 * (token, head) pair of that kv head's group: row index rg = t * G + g over the whole call, so
 * a block's rows can span tokens (decode: the G heads of the token; prefill: G heads x R/G
 * tokens). The block walks its key range in tiles of T keys through shared memory:
 *   scores S = scale * Q K^T (R x T), masked to -inf past each row's position and the range;
 *   per row (one warp): new max, p = exp(S - max), l and the rescale factor alpha, while the
 *   V tile is loaded over the K tile;
 *   the accumulators (R x head_dim, in registers, ATT_MAX_ACC per thread) = alpha * acc + P V.
 * With one split the block writes acc / l; with several it writes (acc, max, l) to scratch
 * and k_attn_combine merges the splits of each row. Shared memory per block stays under 48 KiB
 * for head_dim <= 256: R = min(64, 4096 / head_dim) rows, T = 32 keys (16 above head_dim 128),
 * rows padded to head_dim + 1 floats so that column walks hit distinct banks. */

#define ATT_THREADS 128
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_MAX_ACC 32 /* R * head_dim <= ATT_THREADS * ATT_MAX_ACC = 4096 */
#define ATT_MAX_ROWS 64
#define ATT_MAX_SPLIT 32
#define ATT_SPLIT_ROWS 64     /* n_split * n_tok <= 64: bounds the scratch for any n_tok */
#define ATT_TARGET_BLOCKS 256 /* enough blocks to fill an H100/H200-class GPU twice */

struct attn_params {
    float *out;
    const float *q, *k, *v;
    const int32_t *pos_dev;
    int pos0, n_tok, n_ctx, n_head, n_head_kv, hd, G;
    float scale;
    int R, T, n_split;
    float *part_acc;        /* (n_split, n_tok * n_head, hd) */
    float *part_m, *part_l; /* (n_split, n_tok * n_head) */
};

static __device__ __forceinline__ int attn_pos(const struct attn_params &p, int t)
{
    int pos = p.pos_dev ? p.pos_dev[t] : p.pos0 + t;
    return pos < p.n_ctx ? pos : p.n_ctx - 1;
}

static __global__ void __launch_bounds__(ATT_THREADS) k_attn(struct attn_params p)
{
    extern __shared__ float att_smem[];
    const int R = p.R, T = p.T, hd = p.hd, ld = hd + 1;
    float *qs = att_smem;        /* (R, ld) query rows */
    float *kv = qs + R * ld;     /* (T, ld) the K tile, then the V tile */
    float *ps = kv + T * ld;     /* (R, T) scores, then probabilities */
    float *ms = ps + R * T;      /* (R) running max */
    float *ls = ms + R;          /* (R) running sum of probabilities */
    float *al = ls + R;          /* (R) rescale factor of this tile */
    int *rpos = (int *)(al + R); /* (R) last key of each row, -1 for padding rows */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kvh = blockIdx.y, split = blockIdx.z, r0 = blockIdx.x * R;
    const int n_rows = ops_imin(R, p.n_tok * p.G - r0);
    const int64_t qw = (int64_t)p.n_head * hd, kvw = (int64_t)p.n_head_kv * hd;
    const int64_t kv_off = (int64_t)kvh * hd;

    for (int r = tid; r < R; r += ATT_THREADS) {
        rpos[r] = r < n_rows ? attn_pos(p, (r0 + r) / p.G) : -1;
        ms[r] = -INFINITY;
        ls[r] = 0.0f;
    }
    for (int e = tid; e < R * hd; e += ATT_THREADS) {
        int r = e / hd, d = e - r * hd;
        float val = 0.0f;
        if (r < n_rows) {
            int rg = r0 + r, t = rg / p.G, h = kvh * p.G + rg % p.G;
            val = p.q[t * qw + (int64_t)h * hd + d];
        }
        qs[r * ld + d] = val;
    }
    __syncthreads();

    /* this split's keys: the block's key count divided evenly, in whole tiles */
    int kmax = 0;
    for (int r = 0; r < n_rows; r++)
        kmax = ops_imax(kmax, rpos[r] + 1);
    int chunk = ops_cdiv(ops_cdiv(kmax, p.n_split), T) * T;
    int kb = split * chunk, ke = ops_imin(kb + chunk, kmax);

    float acc[ATT_MAX_ACC];
#pragma unroll
    for (int i = 0; i < ATT_MAX_ACC; i++)
        acc[i] = 0.0f;

    for (int k0 = kb; k0 < ke; k0 += T) {
        for (int e = tid; e < T * hd; e += ATT_THREADS) {
            int j = e / hd, d = e - j * hd, key = k0 + j;
            kv[j * ld + d] = key < ke ? p.k[(int64_t)key * kvw + kv_off + d] : 0.0f;
        }
        __syncthreads();
        for (int e = tid; e < R * T; e += ATT_THREADS) {
            int r = e / T, j = e - r * T, key = k0 + j;
            float s = -INFINITY;
            if (key < ke && key <= rpos[r]) {
                const float *qr = qs + r * ld, *kr = kv + j * ld;
                float dot = 0.0f;
                for (int d = 0; d < hd; d++)
                    dot = fmaf(qr[d], kr[d], dot);
                s = dot * p.scale;
            }
            ps[e] = s;
        }
        __syncthreads();
        /* the K tile was last read before this barrier: load V over it, then the softmax */
        for (int e = tid; e < T * hd; e += ATT_THREADS) {
            int j = e / hd, d = e - j * hd, key = k0 + j;
            kv[j * ld + d] = key < ke ? p.v[(int64_t)key * kvw + kv_off + d] : 0.0f;
        }
        for (int r = warp; r < R; r += ATT_WARPS) {
            float s = lane < T ? ps[r * T + lane] : -INFINITY;
            float m_old = ms[r];
            float m_new = fmaxf(m_old, cq_warp_max(s));
            float pr = 0.0f, alpha = 1.0f;
            if (m_new != -INFINITY) { /* a row without keys yet keeps acc = 0, l = 0 */
                pr = expf(s - m_new);
                alpha = expf(m_old - m_new);
            }
            float psum = cq_warp_sum(pr);
            if (lane < T)
                ps[r * T + lane] = pr;
            if (lane == 0) {
                ms[r] = m_new;
                ls[r] = ls[r] * alpha + psum;
                al[r] = alpha;
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ATT_MAX_ACC; i++) {
            int e = tid + i * ATT_THREADS;
            if (e < R * hd) {
                int r = e / hd, d = e - r * hd;
                const float *pr = ps + r * T;
                float a = acc[i] * al[r];
                for (int j = 0; j < T; j++)
                    a = fmaf(pr[j], kv[j * ld + d], a);
                acc[i] = a;
            }
        }
        __syncthreads(); /* before the next tile overwrites kv and ps */
    }

    const int64_t nth = (int64_t)p.n_tok * p.n_head;
#pragma unroll
    for (int i = 0; i < ATT_MAX_ACC; i++) {
        int e = tid + i * ATT_THREADS;
        if (e < n_rows * hd) {
            int r = e / hd, d = e - r * hd, rg = r0 + r;
            int64_t row = (int64_t)(rg / p.G) * p.n_head + kvh * p.G + rg % p.G;
            if (p.n_split == 1)
                p.out[row * hd + d] = acc[i] / ls[r];
            else
                p.part_acc[((int64_t)split * nth + row) * hd + d] = acc[i];
        }
    }
    if (p.n_split > 1) {
        for (int r = tid; r < n_rows; r += ATT_THREADS) {
            int rg = r0 + r;
            int64_t row = (int64_t)(rg / p.G) * p.n_head + kvh * p.G + rg % p.G;
            p.part_m[split * nth + row] = ms[r];
            p.part_l[split * nth + row] = ls[r];
        }
    }
}

/* Merges the splits of one (token, head) row: out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M)
 * l_s, splits in order; a split without keys (m = -inf) contributes nothing. */
static __global__ void __launch_bounds__(ATT_THREADS) k_attn_combine(struct attn_params p)
{
    /* each split's factor e^(m_s - M) once (not once per dimension); -1: no keys */
    __shared__ float f[ATT_MAX_SPLIT];
    __shared__ float lsum;
    const int64_t nth = (int64_t)p.n_tok * p.n_head, row = blockIdx.x;
    float mx = -INFINITY;
    for (int s = 0; s < p.n_split; s++)
        mx = fmaxf(mx, p.part_m[s * nth + row]);
    for (int s = threadIdx.x; s < p.n_split; s += ATT_THREADS) {
        float m = p.part_m[s * nth + row];
        f[s] = m != -INFINITY ? expf(m - mx) : -1.0f;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float l = 0.0f;
        for (int s = 0; s < p.n_split; s++)
            if (f[s] >= 0.0f)
                l += p.part_l[s * nth + row] * f[s];
        lsum = l;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < p.hd; d += ATT_THREADS) {
        float o = 0.0f;
        for (int s = 0; s < p.n_split; s++)
            if (f[s] >= 0.0f)
                o += p.part_acc[(s * nth + row) * p.hd + d] * f[s];
        p.out[row * p.hd + d] = o / lsum;
    }
}

/* ---- decode attention: few rows, keys spread over many blocks ----------------------------------
 * For n_tok <= ATTD_MAX_TOK the rows of one kv head (n_tok * G <= ATTD_MAX_ROWS) are too few to
 * fill a block tile, so k_attn_dec gives each block one kv head and one chunk of keys. The
 * chunk goes through shared memory in tiles of attd_sub(D) keys (16 KiB of K and of V): every
 * thread issues its share of a tile's loads at once, the next tile's while the current one is
 * used. Lane l holds D = head_dim / 32 dimensions of every row's query; the block's warps take
 * the tile's keys in turn, a score is a warp sum; then each thread accumulates P V for its own
 * dimensions. The key chunk depends only on the largest position (never on how many blocks were
 * launched), so a graph launched for the whole cache and an eager launch for the current
 * position split the keys the same way, and k_attn_combine skips empty chunks: same bits. */

#define ATTD_THREADS 128
#define ATTD_WARPS (ATTD_THREADS / 32)
#define ATTD_MAX_TOK 2
#define ATTD_MAX_ROWS 16
#define ATTD_CHUNKS 32 /* at most this many key chunks (<= ATT_SPLIT_ROWS / ATTD_MAX_TOK) */

/* keys per tile: 4096 floats of K (and of V) */
static __host__ __device__ constexpr int attd_sub(int D)
{
    return 128 / D;
}

static __host__ __device__ __forceinline__ int attd_chunk(int kmax, int sub)
{
    return ops_cdiv(ops_cdiv(kmax, ATTD_CHUNKS), sub) * sub;
}

/* the D dimensions lane `lane` owns: 32 V (i / V) + V lane + i % V, V = min(D, 4) */
template <int D> static __device__ __forceinline__ void attd_load(const float *row, int lane, float *v)
{
    constexpr int V = D < 4 ? D : 4;
#pragma unroll
    for (int i = 0; i < D; i += V) {
        const float *src = row + 32 * i + V * lane;
        if constexpr (V == 4) {
            float4 x = *(const float4 *)src;
            v[i] = x.x, v[i + 1] = x.y, v[i + 2] = x.z, v[i + 3] = x.w;
        } else if constexpr (V == 2) {
            float2 x = *(const float2 *)src;
            v[i] = x.x, v[i + 1] = x.y;
        } else {
            v[i] = *src;
        }
    }
}

/* one tile (SUB keys x 32 D floats) of K and of V: float4 e of the tile, per thread */
template <int D> struct attd_tile {
    static constexpr int SUB = attd_sub(D), HD = 32 * D;
    static constexpr int PER = SUB * HD / 4 / ATTD_THREADS; /* float4s per thread: 8 */
    float4 k[PER], v[PER];

    __device__ __forceinline__ void load(const struct attn_params &p, int64_t kv_off, int k0,
                                         int n, int tid)
    {
        const int64_t kvw = (int64_t)p.n_head_kv * HD;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            int e = tid + i * ATTD_THREADS, j = e / (HD / 4), c = e - j * (HD / 4);
            if (j < n) {
                int64_t at = (int64_t)(k0 + j) * kvw + kv_off + 4 * c;
                k[i] = *(const float4 *)(p.k + at);
                v[i] = *(const float4 *)(p.v + at);
            } else {
                k[i] = v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        }
    }
    __device__ __forceinline__ void store(float *ks, float *vs, int tid) const
    {
#pragma unroll
        for (int i = 0; i < PER; i++) {
            int e = tid + i * ATTD_THREADS;
            ((float4 *)ks)[e] = k[i];
            ((float4 *)vs)[e] = v[i];
        }
    }
};

/* RMAX is the exact row count (n_tok * G): loops without guards keep the code small, which
 * matters here, since each warp runs it once or twice and an instruction cache miss costs as
 * much as a tile (a version guarded up to 16 rows was bound by instruction fetch) */
template <int D, int RMAX>
static __global__ void __launch_bounds__(ATTD_THREADS) k_attn_dec(struct attn_params p)
{
    constexpr int SUB = attd_sub(D), HD = 32 * D;
    __shared__ __align__(16) float ks[SUB * HD], vs[SUB * HD];
    __shared__ float ps[RMAX][SUB];        /* scores, then probabilities, of one tile */
    __shared__ float wm[ATTD_WARPS][RMAX]; /* per-warp partial max */
    __shared__ float rm[RMAX], rl[RMAX], ral[RMAX];
    __shared__ int rpos[RMAX];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kvh = blockIdx.y, split = blockIdx.x, rows = p.n_tok * p.G;
    const int64_t qw = (int64_t)p.n_head * HD, kv_off = (int64_t)kvh * HD;

    int kmax = 0;
    for (int t = 0; t < p.n_tok; t++)
        kmax = ops_imax(kmax, attn_pos(p, t) + 1);
    const int chunk = attd_chunk(kmax, SUB);
    const int kb = split * chunk, ke = ops_imin(kb + chunk, kmax);

    attd_tile<D> tile;
    if (kb < ke)
        tile.load(p, kv_off, kb, ops_imin(SUB, ke - kb), tid);
    float q[RMAX][D];
#pragma unroll
    for (int r = 0; r < RMAX; r++) {
        int t = r / p.G, h = kvh * p.G + r % p.G;
        attd_load<D>(p.q + t * qw + (int64_t)h * HD, lane, q[r]);
    }
    if (tid < RMAX) {
        rpos[tid] = tid < rows ? attn_pos(p, tid / p.G) : -1;
        rm[tid] = -INFINITY;
        rl[tid] = 0.0f;
    }
    /* thread tid accumulates dimensions tid, tid + 128, ... of every row */
    constexpr int DT = (HD + ATTD_THREADS - 1) / ATTD_THREADS;
    float acc[RMAX][DT];
#pragma unroll
    for (int r = 0; r < RMAX; r++)
#pragma unroll
        for (int i = 0; i < DT; i++)
            acc[r][i] = 0.0f;

    for (int k0 = kb; k0 < ke; k0 += SUB) {
        const int n = ops_imin(SUB, ke - k0);
        tile.store(ks, vs, tid);
        __syncthreads();
        if (k0 + SUB < ke) /* the next tile's loads fly while this one is used */
            tile.load(p, kv_off, k0 + SUB, ops_imin(SUB, ke - k0 - SUB), tid);
        /* scores: warp w takes keys w, w + 4, ... of the tile */
        float wmax[RMAX];
#pragma unroll
        for (int r = 0; r < RMAX; r++)
            wmax[r] = -INFINITY;
#pragma unroll 1
        for (int j = warp; j < n; j += ATTD_WARPS) {
            float kr[D];
            attd_load<D>(ks + j * HD, lane, kr);
#pragma unroll
            for (int r = 0; r < RMAX; r++) {
                float dot = 0.0f;
#pragma unroll
                for (int i = 0; i < D; i++)
                    dot = fmaf(q[r][i], kr[i], dot);
                dot = cq_warp_sum(dot);
                float sc = k0 + j <= rpos[r] ? dot * p.scale : -INFINITY;
                if (lane == 0)
                    ps[r][j] = sc;
                wmax[r] = fmaxf(wmax[r], sc);
            }
        }
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < RMAX; r++)
                wm[warp][r] = wmax[r];
        __syncthreads();
        /* one thread per row: the new running max and the rescale factor */
        if (tid < rows) {
            float m_old = rm[tid], m_new = m_old;
            for (int w = 0; w < ATTD_WARPS; w++)
                m_new = fmaxf(m_new, wm[w][tid]);
            ral[tid] = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
            rm[tid] = m_new;
        }
        __syncthreads();
        /* probabilities, in place */
        for (int e = tid; e < rows * SUB; e += ATTD_THREADS) {
            int r = e / SUB, j = e - r * SUB;
            if (j < n) {
                float m = rm[r];
                ps[r][j] = m == -INFINITY ? 0.0f : expf(ps[r][j] - m);
            }
        }
        __syncthreads();
        /* each row's sum in key order by one thread; P V by every thread for its dimensions */
        if (tid < rows) {
            float sum = 0.0f;
            for (int j = 0; j < n; j++)
                sum += ps[tid][j];
            rl[tid] = rl[tid] * ral[tid] + sum;
        }
#pragma unroll
        for (int i = 0; i < DT; i++) {
            int d = tid + i * ATTD_THREADS;
            if (d < HD) {
#pragma unroll
                for (int r = 0; r < RMAX; r++)
                    acc[r][i] *= ral[r];
#pragma unroll 4
                for (int j = 0; j < n; j++) {
                    float v = vs[j * HD + d];
#pragma unroll
                    for (int r = 0; r < RMAX; r++)
                        acc[r][i] = fmaf(ps[r][j], v, acc[r][i]);
                }
            }
        }
        __syncthreads(); /* before the next tile overwrites ks, vs, ps, rm and ral */
    }

    const int64_t nth = (int64_t)p.n_tok * p.n_head;
#pragma unroll
    for (int r = 0; r < RMAX; r++) {
        int64_t row = (int64_t)(r / p.G) * p.n_head + kvh * p.G + r % p.G;
#pragma unroll
        for (int i = 0; i < DT; i++) {
            int d = tid + i * ATTD_THREADS;
            if (d < HD)
                p.part_acc[((int64_t)split * nth + row) * HD + d] = acc[r][i];
        }
        if (tid == 0) {
            p.part_m[split * nth + row] = rm[r];
            p.part_l[split * nth + row] = rl[r];
        }
    }
}

/* ---- prefill attention on tensor cores -------------------------------------------------------
 * Many query rows (prefill): flash-attention-2 on fp16 mma.sync (m16n8k16, float accumulators;
 * sm_80+, as the matmul module). fp16 rather than bf16: 3 more mantissa bits make the scores 8x
 * more exact, and activations stay far inside its range (beyond it they are clamped, not inf).
 * One block of ATTP_THREADS per (ATTP_ROWS rows of one kv head, key split), rows indexed
 * t * G + g as in k_attn; each warp owns 16 rows and keeps everything in registers, in the mma
 * fragment layouts:
 *   Q: the A fragments of its 16 rows x HD, read from global memory once (float -> fp16);
 *   S = Q K^T for ATTP_SUB keys at a time (4 accumulator fragments), scaled by scale * log2(e),
 *   masked to -inf past each row's position and the split's keys; exp2 against the running max
 *   (a row's max is reduced over the quad of lanes that hold it);
 *   P: the S accumulators rounded to fp16 are already the A fragments of P V; the running sum
 *   adds the rounded values, so the weights that multiply V sum exactly to the divisor;
 *   O: DO / 8 accumulator fragments, rescaled by alpha, += P V.
 * K and V go through shared memory in tiles of KT keys as fp16 (converted while staging, zero
 * past the split's last key, so P = 0 never meets a NaN), rows padded by ATTP_PAD so the 8 rows of
 * an ldmatrix fall in distinct banks; K is read with ldmatrix, V with ldmatrix.trans. At most
 * 34 KiB of static shared memory (no opt-in attribute). A warp stops at its rows' last key; the
 * row tiles run last rows (most keys) first. The split, the combine and the scratch are those of
 * k_attn, with the max handed over in natural-log units. HD is 64, 128 or 256 (two passes of 128
 * output dims); a smaller head_dim, a multiple of 16, skips the unused 16-dim steps. */

#define ATTP_THREADS 128
#define ATTP_ROWS 64 /* 16 per warp */
#define ATTP_PAD 8   /* fp16 per shared row: 16-byte rows, ldmatrix rows in distinct banks */

#define ATTP_SUB 32 /* keys per softmax step (S fragments in registers) */

/* keys per shared tile: K and V tiles stay under 48 KiB */
static __host__ __device__ constexpr int attp_keys(int HD)
{
    return HD > 128 ? 32 : 64;
}

/* output dims per pass: head_dim 256 runs two passes (the scores twice) so that the
 * accumulators and the Q fragments fit in the registers */
static __host__ __device__ constexpr int attp_out_dims(int HD)
{
    return HD > 128 ? 128 : HD;
}

/* blocks per SM the registers are capped for (168 per thread at head_dim 128: no spills) */
static __host__ __device__ constexpr int attp_min_blocks(int HD)
{
    return HD > 128 ? 2 : HD > 64 ? 3 : 4;
}

/* (lo, hi) rounded to fp16, lo in the low half (the element order of an mma fragment register);
 * beyond the fp16 range clamped to +-65504 instead of inf */
static __device__ __forceinline__ uint32_t attp_pack(float lo, float hi)
{
    uint32_t r;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* the sum of the two fp16 of a packed register, as floats */
static __device__ __forceinline__ float attp_sum2(uint32_t r)
{
    float lo, hi;
    asm("{\n .reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}\n"
        : "=f"(lo), "=f"(hi)
        : "r"(r));
    return lo + hi;
}

/* four 8x8 16-bit matrices: lane l gives the shared address of row l % 8 of matrix l / 8 */
static __device__ __forceinline__ void attp_ldsm4(uint32_t r[4], uint32_t a)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

/* the same, each matrix transposed */
static __device__ __forceinline__ void attp_ldsm4_t(uint32_t r[4], uint32_t a)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

/* c (16x8 float) += a (16x16 fp16, row major) b (16x8 fp16, column major) */
static __device__ __forceinline__ void attp_mma(float c[4], const uint32_t a[4], uint32_t b0,
                                                uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Keys k0 .. k0 + KT - 1 of K and V (k, v: key k0 of this kv head) into the fp16 tiles, rows
 * n.. and columns hd.. zero. Consecutive threads take consecutive float4 of a key row. */
template <int HD>
static __device__ __forceinline__ void attp_stage(uint16_t *ks, uint16_t *vs, const float *k,
                                                  const float *v, int64_t kvw, int n, int hd,
                                                  int tid)
{
    constexpr int KT = attp_keys(HD), LD = HD + ATTP_PAD, C4 = HD / 4;
    constexpr int PER = KT * C4 / ATTP_THREADS; /* float4 of K (and of V) per thread */
    constexpr int CH = 4;                       /* of them in flight: 32 registers */
    static_assert(PER % CH == 0, "whole chunks of float4 per thread");
#pragma unroll 1 /* bounds the loads in flight (and the registers they hold) to one chunk */
    for (int c = 0; c < PER; c += CH) {
        float4 kx[CH], vx[CH];
#pragma unroll
        for (int i = 0; i < CH; i++) {
            int e = tid + (c + i) * ATTP_THREADS, j = e / C4, d = 4 * (e % C4);
            kx[i] = vx[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (j < n && d < hd) {
                kx[i] = __ldg((const float4 *)(k + j * kvw + d));
                vx[i] = __ldg((const float4 *)(v + j * kvw + d));
            }
        }
#pragma unroll
        for (int i = 0; i < CH; i++) {
            int e = tid + (c + i) * ATTP_THREADS, j = e / C4, d = 4 * (e % C4);
            *(uint2 *)(ks + j * LD + d) =
                make_uint2(attp_pack(kx[i].x, kx[i].y), attp_pack(kx[i].z, kx[i].w));
            *(uint2 *)(vs + j * LD + d) =
                make_uint2(attp_pack(vx[i].x, vx[i].y), attp_pack(vx[i].z, vx[i].w));
        }
    }
}

template <int HD>
static __global__ void __launch_bounds__(ATTP_THREADS, attp_min_blocks(HD))
    k_attn_pf(struct attn_params p)
{
    constexpr int KT = attp_keys(HD), LD = HD + ATTP_PAD, DO = attp_out_dims(HD);
    constexpr int NK = HD / 16, NT = ATTP_SUB / 8, NP = ATTP_SUB / 16, ND = DO / 8;
    __shared__ __align__(16) uint16_t ks[KT * LD], vs[KT * LD]; /* fp16 (key, dim) tiles */
    __shared__ int wkey[ATTP_THREADS / 32];                     /* per-warp last position */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tq = lane & 3;  /* fragment row group, column pair */
    const int lm = lane >> 3, lr = lane & 7; /* ldmatrix: matrix, row */
    const int kvh = blockIdx.y, split = blockIdx.z, hd = p.hd;
    const int r0 = (gridDim.x - 1 - blockIdx.x) * ATTP_ROWS + warp * 16;
    const int n_rows = p.n_tok * p.G;
    const int64_t qw = (int64_t)p.n_head * hd, kvw = (int64_t)p.n_head_kv * hd;

    /* this lane's rows r0 + g and r0 + g + 8: (token, head) element offset, last key */
    int64_t off[2];
    int pos[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int rg = r0 + g + 8 * i;
        off[i] = -1;
        pos[i] = -1;
        if (rg < n_rows) {
            int t = rg / p.G;
            off[i] = t * qw + (int64_t)(kvh * p.G + rg % p.G) * hd;
            pos[i] = attn_pos(p, t);
        }
    }
    /* A fragment kk: a0 row g dims 16 kk + 2 tq (+1), a1 row g + 8, a2/a3 the same dims + 8 */
    uint32_t qa[NK][4];
#pragma unroll
    for (int kk = 0; kk < NK; kk++) {
        float2 x[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int64_t ro = off[i & 1];
            int d = 16 * kk + 2 * tq + 8 * (i >> 1);
            x[i] = ro >= 0 && 16 * kk < hd ? *(const float2 *)(p.q + ro + d) : make_float2(0, 0);
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
            qa[kk][i] = attp_pack(x[i].x, x[i].y);
    }

    /* the warp's last key, then the block's: the split is cut from the block's */
    int wpos = ops_imax(pos[0], pos[1]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        wpos = ops_imax(wpos, __shfl_xor_sync(0xffffffffu, wpos, o));
    if (lane == 0)
        wkey[warp] = wpos;
    __syncthreads();
    int kmax = 0;
#pragma unroll
    for (int w = 0; w < ATTP_THREADS / 32; w++)
        kmax = ops_imax(kmax, wkey[w] + 1);
    const int chunk = ops_cdiv(ops_cdiv(kmax, p.n_split), KT) * KT;
    const int kb = split * chunk, ke = ops_imin(kb + chunk, kmax);

    const float sl2 = p.scale * 1.44269504088896340736f; /* scores in log2 units */
    const float *kbase = p.k + (int64_t)kvh * hd, *vbase = p.v + (int64_t)kvh * hd;
    /* this lane's ldmatrix rows: K keys lr (+8), dims 0 (+8); V keys lr (+8), dims 0 (+8) */
    const uint32_t ks_lane =
        (uint32_t)__cvta_generic_to_shared(ks + (lr + 8 * (lm >> 1)) * LD + 8 * (lm & 1));
    const uint32_t vs_lane =
        (uint32_t)__cvta_generic_to_shared(vs + (lr + 8 * (lm & 1)) * LD + 8 * (lm >> 1));
    const int64_t nth = (int64_t)p.n_tok * p.n_head;

    /* output dims d0 .. d0 + DO per pass; every pass computes the same scores */
#pragma unroll 1
    for (int d0 = 0; d0 < hd; d0 += DO) {
        float o[ND][4];
#pragma unroll
        for (int nd = 0; nd < ND; nd++)
            o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

        for (int k0 = kb; k0 < ke; k0 += KT) {
            __syncthreads(); /* every warp is done with the previous tile */
            attp_stage<HD>(ks, vs, kbase + k0 * kvw, vbase + k0 * kvw, kvw, ke - k0, hd, tid);
            __syncthreads();
#pragma unroll 1
            for (int sub = 0; sub < KT; sub += ATTP_SUB) {
                const int k1 = k0 + sub;
                if (k1 >= ke || k1 > wpos) /* no key left for the warp's rows in this tile */
                    break;
                /* opaque, so the constant offsets below fold into the ldmatrix instructions
                 * instead of one address register per fragment */
                uint32_t ka = ks_lane + 2 * sub * LD, va = vs_lane + 2 * (sub * LD + d0);
                asm volatile("" : "+r"(ka), "+r"(va));

                /* S = Q K^T; element e of s[nt]: row g + 8 (e / 2), key k1 + 8 nt + 2 tq + e % 2 */
                float s[NT][4];
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < NK; kk++) {
                    if (16 * kk >= hd)
                        break;
#pragma unroll
                    for (int nt = 0; nt < NT; nt += 2) {
                        uint32_t b[4]; /* keys 8 nt.. and 8 nt + 8.., dims 16 kk.. and +8.. */
                        attp_ldsm4(b, ka + 2 * (8 * nt * LD + 16 * kk));
                        attp_mma(s[nt], qa[kk], b[0], b[1]);
                        attp_mma(s[nt + 1], qa[kk], b[2], b[3]);
                    }
                }

                float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int key = k1 + 8 * nt + 2 * tq + (e & 1);
                        float x = key < ke && key <= pos[e >> 1] ? s[nt][e] * sl2 : -INFINITY;
                        s[nt][e] = x;
                        mx[e >> 1] = fmaxf(mx[e >> 1], x);
                    }
                }
                float base[2], alpha[2];
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                    float mn = fmaxf(m[i], mx[i]);
                    base[i] = mn == -INFINITY ? 0.0f : mn; /* a row without keys yet: p = 0 */
                    alpha[i] = exp2f(m[i] - base[i]);
                    m[i] = mn;
                }
                /* P as A fragments of 16 keys: a0 row g keys 0..7, a1 row g + 8, a2/a3 keys
                 * 8..15, i.e. s[2 kp] and s[2 kp + 1] */
                uint32_t pa[NP][4];
                float ls[2] = {0.0f, 0.0f};
#pragma unroll
                for (int kp = 0; kp < NP; kp++) {
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float *sf = s[2 * kp + (i >> 1)];
                        int h = i & 1;
                        pa[kp][i] =
                            attp_pack(exp2f(sf[2 * h] - base[h]), exp2f(sf[2 * h + 1] - base[h]));
                        ls[h] += attp_sum2(pa[kp][i]);
                    }
                }
#pragma unroll
                for (int i = 0; i < 2; i++)
                    l[i] = l[i] * alpha[i] + ls[i];
#pragma unroll
                for (int nd = 0; nd < ND; nd++) {
                    o[nd][0] *= alpha[0], o[nd][1] *= alpha[0];
                    o[nd][2] *= alpha[1], o[nd][3] *= alpha[1];
                }
                /* O += P V; element e of o[nd]: row g + 8 (e / 2), dim d0 + 8 nd + 2 tq + e % 2 */
#pragma unroll
                for (int kp = 0; kp < NP; kp++) {
#pragma unroll
                    for (int nd = 0; nd < ND; nd += 2) {
                        if (d0 + 8 * nd >= hd)
                            break;
                        uint32_t b[4]; /* keys 16 kp.. and +8.., dims 8 nd.. and 8 nd + 8.. */
                        attp_ldsm4_t(b, va + 2 * (16 * kp * LD + 8 * nd));
                        attp_mma(o[nd], pa[kp], b[0], b[1]);
                        attp_mma(o[nd + 1], pa[kp], b[2], b[3]);
                    }
                }
            }
        }

        /* the row sums over the quad (every lane of it gets the same sum) */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
            l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            if (off[i] < 0)
                continue;
            int64_t row = off[i] / hd; /* t * n_head + h */
            float *dst =
                p.n_split == 1 ? p.out + off[i] : p.part_acc + ((int64_t)split * nth + row) * hd;
            float inv = p.n_split == 1 ? 1.0f / l[i] : 1.0f;
#pragma unroll
            for (int nd = 0; nd < ND; nd++)
                if (d0 + 8 * nd < hd)
                    *(float2 *)(dst + d0 + 8 * nd + 2 * tq) =
                        make_float2(o[nd][2 * i] * inv, o[nd][2 * i + 1] * inv);
            if (p.n_split > 1 && d0 == 0 && tq == 0) {
                p.part_m[split * nth + row] = m[i] * 0.69314718055994530942f; /* ln 2 */
                p.part_l[split * nth + row] = l[i];
            }
        }
    }
}

/* ==== launchers ============================================================================== */

static bool ops_aligned(const void *p, uint64_t a)
{
    return ((uintptr_t)p & (a - 1)) == 0;
}

extern "C" int cuda_type_supported(uint32_t type)
{
    return cq_supported(type);
}

template <uint32_t TYPE>
static void embed_launch(const struct embed_params &p, dim3 grid, cudaStream_t s)
{
    k_embed<TYPE><<<grid, EMBED_WARPS * 32, 0, s>>>(p);
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
    struct rmsnorm_params p = {a->out, a->in, a->resid, a->w, a->dim, a->eps};
    k_rmsnorm<<<a->rows, NORM_THREADS, 0, (cudaStream_t)a->stream>>>(p);
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
    struct rope_params p = {a->x, a->n_heads, a->head_dim, a->pos0, a->pos_dev, a->base};
    dim3 grid((unsigned)a->n_tok, (unsigned)ops_cdiv(a->n_heads, ROPE_HEADS));
    k_rope_neox<<<grid, ROPE_THREADS, 0, (cudaStream_t)a->stream>>>(p);
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
    if (!a->cache || !a->src)
        return -EINVAL;
    struct kv_store_params p = {
        a->cache, a->src, (int64_t)a->n_tok * a->width, a->width, a->n_ctx, a->pos0, a->pos_dev};
    k_kv_store<<<ops_stride_blocks(p.total, 256), 256, 0, (cudaStream_t)a->stream>>>(p);
    return cuda_last_error("cuda_kv_store");
}

/* How cuda_attention runs a call: rows per block, keys per tile, key splits, shared bytes. */
struct attn_plan {
    int R, T, n_split;
    size_t smem;
};

static void attn_plan_make(const struct cuda_attn_args *a, struct attn_plan *pl)
{
    int G = a->n_head / a->n_head_kv, rows = a->n_tok * G;
    int R = ops_imin(ATT_MAX_ROWS, 4096 / a->head_dim);
    R = ops_imin(R, rows);
    int T = a->head_dim > 128 ? 16 : 32;
    int blocks = ops_cdiv(rows, R) * a->n_head_kv;
    int keys = a->pos_dev ? a->n_ctx : ops_imin(a->pos0 + a->n_tok, a->n_ctx);
    int ns = ops_cdiv(ATT_TARGET_BLOCKS, blocks);
    ns = ops_imin(ns, ATT_MAX_SPLIT);
    ns = ops_imin(ns, ATT_SPLIT_ROWS / a->n_tok);
    ns = ops_imin(ns, ops_cdiv(keys, T));
    pl->R = R;
    pl->T = T;
    pl->n_split = ops_imax(ns, 1);
    pl->smem = sizeof(float) * ((size_t)(R + T) * (a->head_dim + 1) + (size_t)R * T + 4 * R);
}

extern "C" size_t cuda_attention_scratch_bytes(int n_head, int head_dim)
{
    if (n_head < 1 || head_dim < 1)
        return 0;
    return sizeof(float) * (size_t)ATT_SPLIT_ROWS * n_head * (head_dim + 2);
}

/* Launches k_attn_dec<D, rows> when D matches and rows is 1, 2, 4, 8 or 16 (rows * D <= 64). */
template <int D>
static bool attd_dispatch(int d, int rows, dim3 grid, const struct attn_params &p, cudaStream_t s)
{
    if (d != D)
        return false;
    switch (rows) {
    case 1:
        k_attn_dec<D, 1><<<grid, ATTD_THREADS, 0, s>>>(p);
        return true;
    case 2:
        k_attn_dec<D, 2><<<grid, ATTD_THREADS, 0, s>>>(p);
        return true;
    case 4:
        k_attn_dec<D, 4><<<grid, ATTD_THREADS, 0, s>>>(p);
        return true;
    case 8:
        k_attn_dec<D, 8><<<grid, ATTD_THREADS, 0, s>>>(p);
        return true;
    case 16:
        if constexpr (D <= 4) {
            k_attn_dec<D, 16><<<grid, ATTD_THREADS, 0, s>>>(p);
            return true;
        }
        return false;
    default:
        return false;
    }
}

/* The decode kernel where it applies (few rows, head_dim 64/128/256, scratch given): launches
 * it and the combine, true; else false and nothing launched. */
static bool attd_launch(const struct cuda_attn_args *a, struct attn_params *p, cudaStream_t s)
{
    const int rows = a->n_tok * p->G, D = a->head_dim / 32;
    if (a->n_tok > ATTD_MAX_TOK || rows > ATTD_MAX_ROWS || a->head_dim % 32 ||
        (D != 2 && D != 4 && D != 8) || rows * D > 64 || (rows & (rows - 1)) || !a->scratch)
        return false;
    int keys = a->pos_dev ? a->n_ctx : a->pos0 + a->n_tok;
    int ns = ops_imin(ATTD_CHUNKS, ops_cdiv(keys, attd_sub(D)));
    int64_t nth = (int64_t)a->n_tok * a->n_head;
    size_t need = sizeof(float) * (size_t)ns * nth * (a->head_dim + 2);
    if (a->scratch_bytes < need || !ops_aligned(a->scratch, 4))
        return false;
    p->n_split = ns;
    p->part_acc = (float *)a->scratch;
    p->part_m = p->part_acc + (size_t)ns * nth * a->head_dim;
    p->part_l = p->part_m + (size_t)ns * nth;
    dim3 grid((unsigned)ns, (unsigned)a->n_head_kv);
    if (!attd_dispatch<2>(D, rows, grid, *p, s) && !attd_dispatch<4>(D, rows, grid, *p, s) &&
        !attd_dispatch<8>(D, rows, grid, *p, s))
        return false;
    k_attn_combine<<<(unsigned)nth, ATT_THREADS, 0, s>>>(*p);
    return true;
}

/* The tensor-core prefill kernel where it applies (n_tok >= CUDA_ATTN_TC_MIN_TOK, n_tok * G >=
 * CUDA_ATTN_TC_MIN_ROWS, head_dim a multiple of 16, K/V 16-byte and q/out 8-byte aligned):
 * launches it (and the combine when the keys are split), true; else false and nothing launched.
 * The split follows k_attn's plan with ATTP_ROWS rows and attp_keys keys per block; without
 * enough scratch the keys are not split. */
static bool attp_launch(const struct cuda_attn_args *a, struct attn_params *p, cudaStream_t s)
{
    const int rows = a->n_tok * p->G, hd = a->head_dim;
    if (a->n_tok < CUDA_ATTN_TC_MIN_TOK || rows < CUDA_ATTN_TC_MIN_ROWS || hd % 16 ||
        !ops_aligned(a->k_cache, 16) || !ops_aligned(a->v_cache, 16) || !ops_aligned(a->q, 8) ||
        !ops_aligned(a->out, 8))
        return false;
    const int HD = hd <= 64 ? 64 : hd <= 128 ? 128 : 256;
    int blocks = ops_cdiv(rows, ATTP_ROWS) * a->n_head_kv;
    int keys = a->pos_dev ? a->n_ctx : ops_imin(a->pos0 + a->n_tok, a->n_ctx);
    int ns = ops_cdiv(ATT_TARGET_BLOCKS, blocks);
    ns = ops_imin(ns, ATT_MAX_SPLIT);
    ns = ops_imin(ns, ATT_SPLIT_ROWS / a->n_tok);
    ns = ops_imax(ops_imin(ns, ops_cdiv(keys, attp_keys(HD))), 1);
    const int64_t nth = (int64_t)a->n_tok * a->n_head;
    size_t need = sizeof(float) * (size_t)ns * nth * (hd + 2);
    if (ns > 1 && (!a->scratch || a->scratch_bytes < need || !ops_aligned(a->scratch, 8)))
        ns = 1;
    struct attn_params q = *p;
    q.n_split = ns;
    if (ns > 1) {
        q.part_acc = (float *)a->scratch;
        q.part_m = q.part_acc + (size_t)ns * nth * hd;
        q.part_l = q.part_m + (size_t)ns * nth;
    }
    dim3 grid((unsigned)ops_cdiv(rows, ATTP_ROWS), (unsigned)a->n_head_kv, (unsigned)ns);
    switch (HD) {
    case 64:
        k_attn_pf<64><<<grid, ATTP_THREADS, 0, s>>>(q);
        break;
    case 128:
        k_attn_pf<128><<<grid, ATTP_THREADS, 0, s>>>(q);
        break;
    default:
        k_attn_pf<256><<<grid, ATTP_THREADS, 0, s>>>(q);
        break;
    }
    if (ns > 1)
        k_attn_combine<<<(unsigned)nth, ATT_THREADS, 0, s>>>(q);
    return true;
}

extern "C" int cuda_attention(const struct cuda_attn_args *a)
{
    if (!a || a->n_tok < 0 || a->n_ctx < 1 || a->n_head < 1 || a->n_head_kv < 1 ||
        a->n_head % a->n_head_kv || a->head_dim < 2 || a->head_dim % 2 ||
        a->head_dim > CUDA_ATTN_MAX_HEAD_DIM)
        return -EINVAL;
    if (!a->pos_dev && (a->pos0 < 0 || (int64_t)a->pos0 + a->n_tok > a->n_ctx))
        return -EINVAL;
    if (a->n_tok == 0)
        return 0;
    if (!a->out || !a->q || !a->k_cache || !a->v_cache)
        return -EINVAL;
    struct attn_plan pl;
    attn_plan_make(a, &pl);
    if (pl.smem > 48 * 1024) /* cannot happen for head_dim <= 256; no opt-in attribute is set */
        return -EINVAL;
    int64_t nth = (int64_t)a->n_tok * a->n_head;
    struct attn_params p = {};
    p.out = a->out;
    p.q = a->q;
    p.k = a->k_cache;
    p.v = a->v_cache;
    p.pos_dev = a->pos_dev;
    p.pos0 = a->pos0;
    p.n_tok = a->n_tok;
    p.n_ctx = a->n_ctx;
    p.n_head = a->n_head;
    p.n_head_kv = a->n_head_kv;
    p.hd = a->head_dim;
    p.G = a->n_head / a->n_head_kv;
    p.scale = a->scale;
    p.R = pl.R;
    p.T = pl.T;
    p.n_split = pl.n_split;
    if (pl.n_split > 1) {
        size_t need = sizeof(float) * (size_t)pl.n_split * nth * (a->head_dim + 2);
        if (!a->scratch || a->scratch_bytes < need || !ops_aligned(a->scratch, 4))
            return -EINVAL;
        p.part_acc = (float *)a->scratch;
        p.part_m = p.part_acc + (size_t)pl.n_split * nth * a->head_dim;
        p.part_l = p.part_m + (size_t)pl.n_split * nth;
    }
    cudaStream_t s = (cudaStream_t)a->stream;
    if (attd_launch(a, &p, s) || attp_launch(a, &p, s))
        return cuda_last_error("cuda_attention");
    dim3 grid((unsigned)ops_cdiv(a->n_tok * p.G, pl.R), (unsigned)a->n_head_kv,
              (unsigned)pl.n_split);
    k_attn<<<grid, ATT_THREADS, pl.smem, s>>>(p);
    if (pl.n_split > 1)
        k_attn_combine<<<(unsigned)nth, ATT_THREADS, 0, s>>>(p);
    return cuda_last_error("cuda_attention");
}

extern "C" int cuda_add(float *x, const float *y, size_t n, void *stream)
{
    if (n == 0)
        return 0;
    if (!x || !y)
        return -EINVAL;
    k_add<<<ops_stride_blocks((int64_t)n, 256), 256, 0, (cudaStream_t)stream>>>(x, y, n);
    return cuda_last_error("cuda_add");
}

extern "C" int cuda_argmax(const float *x, int rows, int n, int32_t *out, void *stream)
{
    if (rows < 0 || n < 1)
        return -EINVAL;
    if (rows == 0)
        return 0;
    if (!x || !out)
        return -EINVAL;
    k_argmax<<<rows, ARGMAX_THREADS, 0, (cudaStream_t)stream>>>(x, n, out);
    return cuda_last_error("cuda_argmax");
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
        k_softmax_topk<4><<<blocks, TOPK_WARPS * 32, 0, s>>>(p);
    else if (a->n_expert <= 32 * 8)
        k_softmax_topk<8><<<blocks, TOPK_WARPS * 32, 0, s>>>(p);
    else if (a->n_expert <= 32 * 16)
        k_softmax_topk<16><<<blocks, TOPK_WARPS * 32, 0, s>>>(p);
    else
        k_softmax_topk<TOPK_PER_LANE><<<blocks, TOPK_WARPS * 32, 0, s>>>(p);
    return cuda_last_error("cuda_softmax_topk");
}
