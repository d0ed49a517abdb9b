/* cuda_attention with CUDA: kernels first, then the C launchers that check shapes, plan the
 * key split, pick a kernel and check the launch. Contracts in cuda_attention.h; design and
 * tolerances in docs/cuda-ops.md. */
#include "cuda_attention.h"
#include "cuda_mem.h"
#include "cuda_ops_util.cuh"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

/* ==== kernels ================================================================================ */

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
    const float *const *kz, *const *vz; /* lockstep rows: block z (blockIdx.z of the decode
                                         * kernel) is token z with its own caches */
    int zrows; /* the decode kernel's block z is query token z, computed as a call of its own
                * (its caches kz[z], or k and v at position pos0 + z); the combine follows */
    const int32_t *pos_dev;
    int pos0, n_tok, n_ctx, n_head, n_head_kv, hd, G;
    float scale;
    const float *sinks; /* NULL or (n_head): a logit per head in each row's softmax sum */
    int window;         /* > 0: row t sees keys pos(t) - window + 1 .. pos(t) only */
    int R, T, n_split;
    float *part_acc;        /* (n_split, n_tok * n_head, hd) */
    float *part_m, *part_l; /* (n_split, n_tok * n_head) */
    int8_t *q8s;     /* NULL, or the output's 8-bit copy (cuda_attn_args.q8_codes): written */
    float2 *q8d;     /* by k_attn_combine and the decode kernel's own merge */
    int early;       /* decode kernel: keys below every row's position loaded before the wait */
    int trace;       /* STRATA_ATTN_TRACE: the decode and merge kernels stamp their stages */
    int lk;          /* head_dim 128 decode: lane-per-key scores (STRATA_ATTN_LK=0: off) */
    unsigned *count; /* decode kernel: NULL, or a counter per (grid z, kv head): the last of a
                      * kv head's split blocks to finish merges the splits itself (as
                      * k_attn_combine would) and sets the counter back to zero */
};

static __device__ __forceinline__ int attn_pos(const struct attn_params &p, int t)
{
    int pos = p.pos_dev ? p.pos_dev[t] : p.pos0 + t;
    return pos < p.n_ctx ? pos : p.n_ctx - 1;
}

/* One kernel over ~120 lines: the phases of the tile loop (scores, softmax, P V) share the
 * query rows, scores and running max/sum in shared memory, the accumulators in registers and
 * one sequence of barriers. */
static __global__ void __launch_bounds__(ATT_THREADS) k_attn(struct attn_params p)
{
    ops_pdl_begin();
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
            if (key < ke && key <= rpos[r] && (p.window <= 0 || key > rpos[r] - p.window)) {
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
            float m_new = fmaxf(m_old, ops_warp_max(s));
            float pr = 0.0f, alpha = 1.0f;
            if (m_new != -INFINITY) { /* a row without keys yet keeps acc = 0, l = 0 */
                pr = expf(s - m_new);
                alpha = expf(m_old - m_new);
            }
            float psum = ops_warp_sum(pr);
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
                p.out[row * hd + d] =
                    acc[i] / (ls[r] + (p.sinks ? expf(p.sinks[row % p.n_head] - ms[r]) : 0.0f));
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

/* STRATA_ATTN_TRACE: %globaltimer stamps of each block's thread 0 (attn_trace_print) */
static __device__ unsigned long long attn_trace_d[256 * 8], attn_trace_c[256 * 4];
static __device__ __forceinline__ void attn_stamp(const struct attn_params &p,
                                                  unsigned long long *buf, int per, int i)
{
    if (p.trace && threadIdx.x == 0) {
        const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        if (b < 256) {
            unsigned long long t;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
            buf[b * per + i] = t;
        }
    }
}

/* The merge factors of one row's ns <= 32 key splits by one warp (every lane): lane s writes
 * f[s] = e^(m_s - M) (M the largest m_s; -1 for a split without keys) and every lane returns
 * sum_s l_s f[s] by a butterfly, plus e^(sink - M) when sink is given. m may be f (each lane
 * reads its own split before writing it). k_attn_combine and the decode kernel's own merge both
 * use it, so they agree bit for bit. */
static __device__ __forceinline__ float attn_merge_factors(const float *m, const float *l, int ns,
                                                           const float *sink, float *f, int lane)
{
    const float ms = lane < ns ? m[lane] : -INFINITY;
    const float mx = ops_warp_max(ms);
    const float fs = ms != -INFINITY ? expf(ms - mx) : -1.0f;
    if (lane < ns)
        f[lane] = fs;
    float t = ops_warp_sum(fs >= 0.0f ? l[lane] * fs : 0.0f);
    if (sink)
        t += expf(*sink - mx);
    return t;
}

/* Merges the splits of one (token, head) row: out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M)
 * l_s, splits in order; a split without keys (m = -inf) contributes nothing. Every split's max
 * and sum and each thread's accumulator values (its first dimension) are requested at once,
 * before any of them is used: one round trip to L2 instead of one per phase. */
static __global__ void __launch_bounds__(ATT_THREADS) k_attn_combine(struct attn_params p)
{
    attn_stamp(p, attn_trace_c, 4, 0);
    ops_pdl_begin();
    attn_stamp(p, attn_trace_c, 4, 1);
    /* each split's factor e^(m_s - M) once (not once per dimension); -1: no keys */
    __shared__ float f[ATT_MAX_SPLIT], sm[ATT_MAX_SPLIT], sl[ATT_MAX_SPLIT];
    __shared__ float lsum;
    const int64_t nth = (int64_t)p.n_tok * p.n_head;
    int64_t row = blockIdx.x;
    if (p.zrows) { /* row z's splits and output follow those of rows before it */
        const int64_t z = row / nth, per = (int64_t)p.n_split * nth;
        row -= z * nth;
        p.part_acc += z * per * p.hd;
        p.part_m += z * per;
        p.part_l += z * per;
        p.out += z * nth * p.hd;
        if (p.q8s) {
            p.q8s += z * nth * p.hd;
            p.q8d += z * nth * p.hd / 32;
        }
    }
    const int tid = threadIdx.x, ns = p.n_split;
    for (int s = tid; s < ns; s += ATT_THREADS) {
        sm[s] = p.part_m[s * nth + row];
        sl[s] = p.part_l[s * nth + row];
    }
    float a[ATT_MAX_SPLIT]; /* dimension tid of every split */
#pragma unroll
    for (int s = 0; s < ATT_MAX_SPLIT; s++)
        a[s] = s < ns && tid < p.hd ? p.part_acc[(s * nth + row) * p.hd + tid] : 0.0f;
    __syncthreads();
    attn_stamp(p, attn_trace_c, 4, 2);
    if (tid < 32) { /* the sink's term at the same reference maximum */
        const float l =
            attn_merge_factors(sm, sl, ns, p.sinks ? p.sinks + row % p.n_head : NULL, f, tid);
        if (tid == 0)
            lsum = l;
    }
    __syncthreads();
    for (int d = tid; d < p.hd; d += ATT_THREADS) {
        float o = 0.0f;
        if (d == tid) {
#pragma unroll
            for (int s = 0; s < ATT_MAX_SPLIT; s++)
                if (s < ns && f[s] >= 0.0f)
                    o += a[s] * f[s];
        } else {
            for (int s = 0; s < ns; s++)
                if (f[s] >= 0.0f)
                    o += p.part_acc[(s * nth + row) * p.hd + d] * f[s];
        }
        p.out[row * p.hd + d] = o / lsum;
        if (p.q8s) /* hd is a multiple of 32: whole warps */
            ops_q8_store(o / lsum, row * p.hd + d, p.q8s, p.q8d);
    }
    attn_stamp(p, attn_trace_c, 4, 3);
}

/* ---- decode attention: few rows, keys spread over many blocks ----------------------------------
 * For n_tok <= ATTD_MAX_TOK the rows of one kv head (n_tok * G <= ATTD_MAX_ROWS) are too few to
 * fill a block tile, so k_attn_dec gives each block one kv head and one chunk of keys. The
 * chunk goes through shared memory in tiles of attd_sub(D) keys (16 KiB of K and of V): every
 * thread issues its share of a tile's loads at once, the next tile's while the current one is
 * used. Lane l holds D = head_dim / 32 dimensions of every row's query; the block's warps take
 * the tile's keys in turn, a score is a warp sum; then each thread accumulates P V for its own
 * dimensions. At head_dim 128 (the tile's 32 keys) lane j takes key j instead (lk): each warp
 * dots a quarter of the dimensions of key j with every row's query, its partials are added in
 * warp order, and a warp per row finds the tile's maximum and probability sum by butterflies,
 * where the lanes' scores took 5 dependent shuffles per (row, key) (bench/cuda-resident.md).
 * The key chunk depends only on the largest position (never on how many blocks were
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
template <int D>
static __device__ __forceinline__ void attd_load(const float *row, int lane, float *v)
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

    __device__ __forceinline__ void load(const struct attn_params &p, int64_t kv_off, int k0, int n,
                                         int tid)
    {
        load_part(p, kv_off, k0, n, tid, 0, n);
    }
    /* keys k0 + j for j in [jlo, jhi) of the n in the tile; keys n.. zero, the others kept */
    __device__ __forceinline__ void load_part(const struct attn_params &p, int64_t kv_off, int k0,
                                              int n, int tid, int jlo, int jhi)
    {
        const int64_t kvw = (int64_t)p.n_head_kv * HD;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            int e = tid + i * ATTD_THREADS, j = e / (HD / 4), c = e - j * (HD / 4);
            if (j < n) {
                if (j >= jlo && j < jhi) {
                    int64_t at = (int64_t)(k0 + j) * kvw + kv_off + 4 * c;
                    k[i] = *(const float4 *)(p.k + at);
                    v[i] = *(const float4 *)(p.v + at);
                }
            } else {
                k[i] = v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        }
    }
    /* swz: key j's float4 c of K at c ^ (j mod HD / 4) of its row (k_attn_dec's LK scores) */
    __device__ __forceinline__ void store(float *ks, float *vs, int tid, bool swz) const
    {
        constexpr int C4 = HD / 4;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            int e = tid + i * ATTD_THREADS, j = e / C4, c = e - j * C4;
            ((float4 *)ks)[swz ? j * C4 + (c ^ (j & (C4 - 1))) : e] = k[i];
            ((float4 *)vs)[e] = v[i];
        }
    }
};

/* The merge of k_attn_combine for the RMAX rows of kv head kvh, by the block that finished
 * last: the same operations in the same order, so the same bits. Every split's max and sum are
 * loaded at once into shared memory; each thread then sums its dimension of every row, splits
 * in order, the rows' loads side by side. The other blocks' partial results are read past L1
 * (__ldcg). */
template <int RMAX>
static __device__ __forceinline__ void attd_merge(const struct attn_params &p, int kvh, int tid)
{
    __shared__ float f[RMAX][ATTD_CHUNKS], sl[RMAX][ATTD_CHUNKS];
    __shared__ float ls[RMAX];
    const int64_t nth = (int64_t)p.n_tok * p.n_head;
    const int ns = p.n_split, hd = p.hd;
    int64_t rowv[RMAX];
#pragma unroll
    for (int r = 0; r < RMAX; r++)
        rowv[r] = (int64_t)(r / p.G) * p.n_head + kvh * p.G + r % p.G;
    for (int e = tid; e < RMAX * ns; e += ATTD_THREADS) {
        const int r = e / ns, s = e - r * ns;
        const int64_t row = (int64_t)(r / p.G) * p.n_head + kvh * p.G + r % p.G;
        f[r][s] = __ldcg(p.part_m + s * nth + row);
        sl[r][s] = __ldcg(p.part_l + s * nth + row);
    }
    __syncthreads();
    for (int r = tid >> 5; r < RMAX; r += ATTD_WARPS) { /* a warp per row, as k_attn_combine */
        const float l = attn_merge_factors(
            f[r], sl[r], ns, p.sinks ? p.sinks + kvh * p.G + r % p.G : NULL, f[r], tid & 31);
        if ((tid & 31) == 0)
            ls[r] = l;
    }
    __syncthreads();
    for (int d = tid; d < hd; d += ATTD_THREADS) {
        float o[RMAX];
#pragma unroll
        for (int r = 0; r < RMAX; r++)
            o[r] = 0.0f;
        for (int s = 0; s < ns; s++) {
            float a[RMAX];
#pragma unroll
            for (int r = 0; r < RMAX; r++)
                a[r] = __ldcg(p.part_acc + (s * nth + rowv[r]) * hd + d);
#pragma unroll
            for (int r = 0; r < RMAX; r++)
                if (f[r][s] >= 0.0f)
                    o[r] += a[r] * f[r][s];
        }
#pragma unroll
        for (int r = 0; r < RMAX; r++) {
            p.out[rowv[r] * hd + d] = o[r] / ls[r];
            if (p.q8s) /* hd is a multiple of 32: whole warps */
                ops_q8_store(o[r] / ls[r], rowv[r] * hd + d, p.q8s, p.q8d);
        }
    }
}

/* RMAX is the exact row count (n_tok * G): loops without guards keep the code small, which
 * matters here, since each warp runs it once or twice and an instruction cache miss costs as
 * much as a tile (guarding the loops up to 16 rows makes the kernel bound by instruction
 * fetch: docs/cuda-ops.md).
 * One kernel over ~120 lines: the query rows (q[RMAX][D]), the next tile's loads and the P V
 * accumulators live in registers across the tile loop, and the scores, max and sums in shared
 * memory between its phases. */
template <int D, int RMAX>
static __global__ void __launch_bounds__(ATTD_THREADS) k_attn_dec(struct attn_params p)
{
    attn_stamp(p, attn_trace_d, 8, 0);
    constexpr int SUB = attd_sub(D), HD = 32 * D;
    /* head_dim 128 (D = 4): lane j scores key j of the tile (LK, below) */
    constexpr bool LK = D == 4;
    __shared__ __align__(16) float ks[SUB * HD], vs[SUB * HD];
    __shared__ __align__(16) float ps[RMAX][SUB]; /* scores, then probabilities, of one tile */
    __shared__ float wm[ATTD_WARPS][RMAX]; /* per-warp partial max */
    __shared__ float pd[LK ? ATTD_WARPS : 1][LK ? RMAX : 1][LK ? SUB : 1]; /* warps' partial dots */
    constexpr bool QS = LK && RMAX <= 8; /* the rows' queries in shared memory (16 rows: L1) */
    __shared__ __align__(16) float qs[QS ? RMAX : 1][QS ? HD : 4];
    __shared__ float rm[RMAX], rl[RMAX], ral[RMAX];
    __shared__ int rpos[RMAX];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kvh = blockIdx.y, split = blockIdx.x, rows = p.n_tok * p.G;
    const int64_t qw = (int64_t)p.n_head * HD, kv_off = (int64_t)kvh * HD;
    /* the lowest position the call's rows write their K and V at: the keys below it are not
     * written by the kernels this one waits on. The rows of the grid's z may share a cache
     * (the tokens of one stream's prompt), so with them it is the lowest over all of them
     * (past 64 rows none are loaded early). */
    int pmin = p.zrows && gridDim.z > 64 ? 0 : INT_MAX;
    for (int z = 0; p.zrows && z < (int)gridDim.z && pmin > 0; z++)
        pmin = ops_imin(pmin, attn_pos(p, z));
    if (p.zrows) { /* token z (one per block row of the grid) as a call of its own */
        const int64_t z = blockIdx.z, per = (int64_t)p.n_split * p.n_head;
        if (p.kz) { /* lockstep rows: its own caches */
            p.k = p.kz[z];
            p.v = p.vz[z];
        }
        p.q += z * qw;
        if (p.pos_dev)
            p.pos_dev += z;
        else
            p.pos0 += (int)z;
        p.part_acc += z * per * HD;
        p.part_m += z * per;
        p.part_l += z * per;
        p.out += z * qw;
        if (p.q8s) {
            p.q8s += z * qw;
            p.q8d += z * qw / 32;
        }
    }

    /* keys klo .. kmax - 1: every row's, from the first key any row's window holds. The
     * positions and cache pointers are the step's (written before its first kernel), so they
     * are read before the wait, and so are the first tile's keys below pmin. */
    int kmax = 0, klo = INT_MAX;
    for (int t = 0; t < p.n_tok; t++) {
        const int pos = attn_pos(p, t);
        kmax = ops_imax(kmax, pos + 1);
        klo = ops_imin(klo, pos - p.window + 1);
        pmin = ops_imin(pmin, pos);
    }
    klo = p.window > 0 ? ops_imax(klo, 0) : 0;
    const int chunk = attd_chunk(kmax - klo, SUB);
    const int kb = klo + split * chunk, ke = ops_imin(kb + chunk, kmax);

    attd_tile<D> tile;
    const int n0 = ops_imin(SUB, ke - kb);
    const int jearly = p.early ? pmin - kb : 0; /* keys loaded before the wait: j < jearly */
    if (kb < ke)
        tile.load_part(p, kv_off, kb, n0, tid, 0, jearly);
    attn_stamp(p, attn_trace_d, 8, 1);
    ops_pdl_begin();
    attn_stamp(p, attn_trace_d, 8, 2);
    if (kb < ke && jearly < n0)
        tile.load_part(p, kv_off, kb, n0, tid, jearly, n0);
    /* head_dim 64 (D = 2): a warp scores 4 keys at a time, lane 8 kq + ds holding dims 4 ds..
     * and 32 + 4 ds.. of every row (8 of them) for key kq of the 4: three shuffles per score
     * instead of five, and a quarter of them (up to 8 rows). Otherwise lane l holds D dims of
     * every row. */
    constexpr bool K4 = D == 2 && RMAX <= 8; /* 16 rows would spill */
    const bool lk = LK && p.lk;
    if (QS && lk) /* read in the tile loop, after its first barrier */
        for (int e = tid; e < RMAX * HD / 4; e += ATTD_THREADS) {
            const int r = e / (HD / 4), c = e - r * (HD / 4);
            const int64_t h = kvh * p.G + r % p.G;
            ((float4 *)qs[r])[c] = ((const float4 *)(p.q + (r / p.G) * qw + h * HD))[c];
        }
    float q[RMAX][K4 ? 8 : D];
#pragma unroll
    for (int r = 0; r < (lk ? 0 : RMAX); r++) {
        int t = r / p.G, h = kvh * p.G + r % p.G;
        const float *src = p.q + t * qw + (int64_t)h * HD;
        if constexpr (K4) {
            const int ds = lane & 7;
            const float4 a = *(const float4 *)(src + 4 * ds),
                         b = *(const float4 *)(src + 32 + 4 * ds);
            q[r][0] = a.x, q[r][1] = a.y, q[r][2] = a.z, q[r][3] = a.w;
            q[r][4] = b.x, q[r][5] = b.y, q[r][6] = b.z, q[r][7] = b.w;
        } else {
            attd_load<D>(src, lane, q[r]);
        }
    }
    if (tid < RMAX) {
        rpos[tid] = tid < rows ? attn_pos(p, tid / p.G) : -1;
        rm[tid] = -INFINITY;
        rl[tid] = 0.0f;
    }
    /* thread tid accumulates dimensions tid, tid + 128, ... of every row; below 128 dims, KH
     * threads share a dimension, each taking every KH-th key */
    constexpr int DT = (HD + ATTD_THREADS - 1) / ATTD_THREADS;
    constexpr int KH = HD < ATTD_THREADS ? ATTD_THREADS / HD : 1;
    float acc[RMAX][DT];
#pragma unroll
    for (int r = 0; r < RMAX; r++)
#pragma unroll
        for (int i = 0; i < DT; i++)
            acc[r][i] = 0.0f;

    for (int k0 = kb; k0 < ke; k0 += SUB) {
        const int n = ops_imin(SUB, ke - k0);
        tile.store(ks, vs, tid, lk);
        __syncthreads();
        if (k0 == kb)
            attn_stamp(p, attn_trace_d, 8, 3);
        if (k0 + SUB < ke) /* the next tile's loads fly while this one is used */
            tile.load(p, kv_off, k0 + SUB, ops_imin(SUB, ke - k0 - SUB), tid);
        if (lk) {
            /* lane j, key j: warp w's quarter of the dimensions (CW float4s of the swizzled row,
             * conflict-free) dotted with every row's query (broadcast loads), one partial per
             * (warp, row, key); then warp w takes rows w, w + 4, ..: the four partials in warp
             * order, the tile's max and sum by warp butterflies, and the probabilities */
            constexpr int C4 = HD / 4, CW = C4 / ATTD_WARPS;
            const int j = lane, key = k0 + j;
            float4 kc[CW];
#pragma unroll
            for (int c = 0; c < CW; c++)
                kc[c] = ((const float4 *)ks)[j * C4 + ((warp * CW + c) ^ (j & (C4 - 1)))];
#pragma unroll
            for (int r = 0; r < RMAX; r++) {
                const int t = r / p.G, h = kvh * p.G + r % p.G;
                const float4 *qr = (QS ? (const float4 *)qs[r]
                                       : (const float4 *)(p.q + t * qw + (int64_t)h * HD)) +
                                   warp * CW;
                float d = 0.0f;
#pragma unroll
                for (int c = 0; c < CW; c++) {
                    const float4 qv = qr[c];
                    d = fmaf(qv.x, kc[c].x, d);
                    d = fmaf(qv.y, kc[c].y, d);
                    d = fmaf(qv.z, kc[c].z, d);
                    d = fmaf(qv.w, kc[c].w, d);
                }
                pd[warp][r][j] = d;
            }
            __syncthreads();
            if (k0 == kb)
                attn_stamp(p, attn_trace_d, 8, 4);
            for (int r = warp; r < RMAX; r += ATTD_WARPS) {
                float dot = pd[0][r][j];
#pragma unroll
                for (int w = 1; w < ATTD_WARPS; w++)
                    dot += pd[w][r][j];
                const bool in =
                    j < n && key <= rpos[r] && (p.window <= 0 || key > rpos[r] - p.window);
                const float sc = in ? dot * p.scale : -INFINITY;
                const float m_old = rm[r], m_new = fmaxf(m_old, ops_warp_max(sc));
                const float pr = j < n && m_new != -INFINITY ? expf(sc - m_new) : 0.0f;
                ps[r][j] = pr;
                const float sum = ops_warp_sum(pr);
                if (lane == 0) {
                    const float a = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
                    ral[r] = a;
                    rm[r] = m_new;
                    rl[r] = rl[r] * a + sum;
                }
            }
            __syncthreads();
            if (k0 == kb)
                attn_stamp(p, attn_trace_d, 8, 5);
        } else {
            float wmax[RMAX];
#pragma unroll
        for (int r = 0; r < RMAX; r++)
            wmax[r] = -INFINITY;
        if constexpr (K4) { /* scores: warp w takes keys 4 w .. 4 w + 3, 4 w + 16 .., ... */
            const int kq = lane >> 3, ds = lane & 7;
#pragma unroll 1
            for (int jb = 4 * warp; jb < n; jb += 4 * ATTD_WARPS) {
                const int j = jb + kq, key = k0 + j; /* j < SUB: rows past n hold zeros */
                const float4 a = *(const float4 *)(ks + j * HD + 4 * ds),
                             b = *(const float4 *)(ks + j * HD + 32 + 4 * ds);
                const float kr[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int r = 0; r < RMAX; r++) {
                    float dot = 0.0f;
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        dot = fmaf(q[r][i], kr[i], dot);
                    dot += __shfl_xor_sync(0xffffffffu, dot, 1);
                    dot += __shfl_xor_sync(0xffffffffu, dot, 2);
                    dot += __shfl_xor_sync(0xffffffffu, dot, 4);
                    const bool in =
                        j < n && key <= rpos[r] && (p.window <= 0 || key > rpos[r] - p.window);
                    const float sc = in ? dot * p.scale : -INFINITY;
                    if (ds == 0 && j < n)
                        ps[r][j] = sc;
                    wmax[r] = fmaxf(wmax[r], sc);
                }
            }
#pragma unroll
            for (int r = 0; r < RMAX; r++) {
                wmax[r] = fmaxf(wmax[r], __shfl_xor_sync(0xffffffffu, wmax[r], 8));
                wmax[r] = fmaxf(wmax[r], __shfl_xor_sync(0xffffffffu, wmax[r], 16));
            }
        }
        /* scores: warp w takes keys w, w + 4, ... of the tile */
#pragma unroll 1
        for (int j = warp; j < (K4 ? 0 : n); j += ATTD_WARPS) {
            float kr[D];
            attd_load<D>(ks + j * HD, lane, kr);
#pragma unroll
            for (int r = 0; r < RMAX; r++) {
                float dot = 0.0f;
#pragma unroll
                for (int i = 0; i < D; i++)
                    dot = fmaf(q[r][i], kr[i], dot);
                dot = ops_warp_sum(dot);
                const int key = k0 + j;
                const bool in = key <= rpos[r] && (p.window <= 0 || key > rpos[r] - p.window);
                float sc = in ? dot * p.scale : -INFINITY;
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
        if (k0 == kb)
            attn_stamp(p, attn_trace_d, 8, 4);
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
        if (k0 == kb)
            attn_stamp(p, attn_trace_d, 8, 5);
        /* each row's sum in key order by one thread; P V by every thread for its dimensions */
        if (tid < rows) {
            float sum = 0.0f;
            for (int j = 0; j < n; j++)
                sum += ps[tid][j];
            rl[tid] = rl[tid] * ral[tid] + sum;
        }
        }
#pragma unroll
        for (int i = 0; i < DT; i++) {
            /* HD < ATTD_THREADS (head_dim 64): thread tid takes dimension tid % HD of the keys
             * j = tid / HD (mod KH), its partial sums added at the end */
            int d = HD < ATTD_THREADS ? tid % HD : tid + i * ATTD_THREADS;
            if (d < HD) {
#pragma unroll
                for (int r = 0; r < RMAX; r++)
                    acc[r][i] *= ral[r];
                int j = HD < ATTD_THREADS ? tid / HD : 0;
                if constexpr (KH == 1) { /* four keys' probabilities per load, the same order */
                    for (; j + 4 <= n; j += 4) {
                        const float v0 = vs[j * HD + d], v1 = vs[(j + 1) * HD + d],
                                    v2 = vs[(j + 2) * HD + d], v3 = vs[(j + 3) * HD + d];
#pragma unroll
                        for (int r = 0; r < RMAX; r++) {
                            const float4 pp = *(const float4 *)&ps[r][j];
                            acc[r][i] = fmaf(pp.x, v0, acc[r][i]);
                            acc[r][i] = fmaf(pp.y, v1, acc[r][i]);
                            acc[r][i] = fmaf(pp.z, v2, acc[r][i]);
                            acc[r][i] = fmaf(pp.w, v3, acc[r][i]);
                        }
                    }
                }
#pragma unroll 4
                for (; j < n; j += KH) {
                    float v = vs[j * HD + d];
#pragma unroll
                    for (int r = 0; r < RMAX; r++)
                        acc[r][i] = fmaf(ps[r][j], v, acc[r][i]);
                }
            }
        }
        __syncthreads(); /* before the next tile overwrites ks, vs, ps, rm and ral */
    }
    if constexpr (KH > 1) { /* the key classes' partial sums, in class order */
        __shared__ float ah[KH > 1 ? KH - 1 : 1][RMAX][HD];
        const int h = tid / HD, d = tid % HD;
        if (h > 0)
#pragma unroll
            for (int r = 0; r < RMAX; r++)
                ah[h - 1][r][d] = acc[r][0];
        __syncthreads();
        if (h == 0)
#pragma unroll
            for (int c = 0; c < KH - 1; c++)
#pragma unroll
                for (int r = 0; r < RMAX; r++)
                    acc[r][0] += ah[c][r][d];
    }

    attn_stamp(p, attn_trace_d, 8, 6);
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
    attn_stamp(p, attn_trace_d, 8, 7);
    if (!p.count)
        return;
    /* the last block of this kv head (and grid row z) merges the splits */
    __shared__ int last;
    unsigned *ctr = p.count + (int64_t)blockIdx.z * gridDim.y + kvh;
    __threadfence();
    __syncthreads();
    if (tid == 0)
        last = atomicAdd(ctr, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    attd_merge<RMAX>(p, kvh, tid);
    if (tid == 0)
        *ctr = 0;
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

/* One kernel over ~120 lines: every value of a warp's 16 rows (the Q fragments, the S and P
 * fragments, the running max and sum, the O accumulators) stays in mma fragment registers from
 * the first key tile to the output; the phases only exchange them through registers. */
template <int HD>
static __global__ void __launch_bounds__(ATTP_THREADS, attp_min_blocks(HD))
    k_attn_pf(struct attn_params p)
{
    ops_pdl_wait();
    constexpr int KT = attp_keys(HD), LD = HD + ATTP_PAD, DO = attp_out_dims(HD);
    constexpr int NK = HD / 16, NT = ATTP_SUB / 8, NP = ATTP_SUB / 16, ND = DO / 8;
    __shared__ __align__(16) uint16_t ks[KT * LD], vs[KT * LD]; /* fp16 (key, dim) tiles */
    __shared__ int wkey[ATTP_THREADS / 32], wlow[ATTP_THREADS / 32]; /* per warp: last key,
                                                                      * first in a window */
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

    /* the warp's last key and first key in a window (INT_MAX: none), then the block's: the
     * split is cut from the block's */
    int wpos = ops_imax(pos[0], pos[1]), wlo = INT_MAX;
#pragma unroll
    for (int i = 0; i < 2; i++)
        if (pos[i] >= 0)
            wlo = ops_imin(wlo, p.window > 0 ? ops_imax(pos[i] - p.window + 1, 0) : 0);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        wpos = ops_imax(wpos, __shfl_xor_sync(0xffffffffu, wpos, o));
        wlo = ops_imin(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
    }
    if (lane == 0) {
        wkey[warp] = wpos;
        wlow[warp] = wlo;
    }
    __syncthreads();
    int kmax = 0, klo = INT_MAX;
#pragma unroll
    for (int w = 0; w < ATTP_THREADS / 32; w++) {
        kmax = ops_imax(kmax, wkey[w] + 1);
        klo = ops_imin(klo, wlow[w]);
    }
    klo = ops_imin(klo, kmax); /* a block of padding rows only: no keys */
    const int chunk = ops_cdiv(ops_cdiv(kmax - klo, p.n_split), KT) * KT;
    const int kb = klo + split * chunk, ke = ops_imin(kb + chunk, kmax);

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
                if (k1 + ATTP_SUB <= wlo) /* before every window of the warp's rows */
                    continue;
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
                        const int ps = pos[e >> 1];
                        const bool in =
                            key < ke && key <= ps && (p.window <= 0 || key > ps - p.window);
                        float x = in ? s[nt][e] * sl2 : -INFINITY;
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
            float inv = 1.0f;
            if (p.n_split == 1) { /* the sink's term at the row's maximum, in log2 units */
                const float sk =
                    p.sinks ? exp2f(p.sinks[row % p.n_head] * 1.44269504088896340736f - m[i])
                            : 0.0f;
                inv = 1.0f / (l[i] + sk);
            }
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

/* Scratch bytes of ns key splits of nth (token, head) rows of head_dim: the partial
 * accumulators (ns, nth, head_dim), then the maxima (ns, nth) and sums (ns, nth). */
static size_t attn_scratch_need(int ns, int64_t nth, int head_dim)
{
    return CUDA_ATTN_COUNT_BYTES + sizeof(float) * (size_t)ns * nth * (head_dim + 2);
}

/* Points p's partial results into scratch, laid out as attn_scratch_need counts it. */
static void attn_scratch_use(struct attn_params *p, void *scratch, int ns, int64_t nth,
                             int head_dim)
{
    p->part_acc = (float *)((uint8_t *)scratch + CUDA_ATTN_COUNT_BYTES);
    p->part_m = p->part_acc + (size_t)ns * nth * head_dim;
    p->part_l = p->part_m + (size_t)ns * nth;
}

extern "C" size_t cuda_attention_scratch_bytes(int n_head, int head_dim)
{
    if (n_head < 1 || head_dim < 1)
        return 0;
    /* the split-K rows of k_attn, or CUDA_ATTN_EXACT_MAX_TOK rows of ATTD_CHUNKS splits */
    const size_t rows = ops_imax(ATT_SPLIT_ROWS, ATTD_CHUNKS * CUDA_ATTN_EXACT_MAX_TOK);
    return CUDA_ATTN_COUNT_BYTES + sizeof(float) * rows * n_head * (head_dim + 2);
}

extern "C" int cuda_attention_rows_ok(int n_head, int n_head_kv, int head_dim)
{
    if (n_head < 1 || n_head_kv < 1 || n_head % n_head_kv || head_dim % 32)
        return 0;
    const int rows = n_head / n_head_kv, D = head_dim / 32;
    return rows <= ATTD_MAX_ROWS && (D == 2 || D == 4 || D == 8) && rows * D <= 64 &&
           !(rows & (rows - 1));
}

extern "C" size_t cuda_attention_rows_scratch_bytes(int n_tok, int n_head, int head_dim)
{
    if (n_tok < 1 || n_head < 1 || head_dim < 1)
        return 0;
    return attn_scratch_need(ATTD_CHUNKS, (int64_t)n_tok * n_head, head_dim);
}

/* The keys a decode call's splits are planned for: those of the cache up to the last position,
 * and with a window at most the window's (plus the other query rows' positions). */
static bool attd_q_ok(const struct cuda_attn_args *a)
{
    return a->head_dim != 64 || ops_aligned(a->q, 16); /* head_dim 64 loads q as float4 */
}

static int attd_keys(const struct cuda_attn_args *a, int n_tok)
{
    int keys = a->pos_dev ? a->n_ctx : a->pos0 + a->n_tok;
    return a->window > 0 ? ops_imin(keys, a->window + n_tok - 1) : keys;
}

/* Launches k_attn_dec<D, rows> when D matches and rows is 1, 2, 4, 8 or 16 (rows * D <= 64). */
template <int D>
static bool attd_dispatch(int d, int rows, dim3 grid, const struct attn_params &p, cudaStream_t s)
{
    if (d != D)
        return false;
    switch (rows) {
    case 1:
        ops_launch(k_attn_dec<D, 1>, grid, ATTD_THREADS, 0, s, p);
        return true;
    case 2:
        ops_launch(k_attn_dec<D, 2>, grid, ATTD_THREADS, 0, s, p);
        return true;
    case 4:
        ops_launch(k_attn_dec<D, 4>, grid, ATTD_THREADS, 0, s, p);
        return true;
    case 8:
        ops_launch(k_attn_dec<D, 8>, grid, ATTD_THREADS, 0, s, p);
        return true;
    case 16:
        if constexpr (D <= 4) {
            ops_launch(k_attn_dec<D, 16>, grid, ATTD_THREADS, 0, s, p);
            return true;
        }
        return false;
    default:
        return false;
    }
}

/* After the decode kernel's launch: its last blocks merged the splits (count set), or the
 * combine runs now. Sets p->count before the launch when the merge is to be fused. */
static void attd_count_plan(const struct cuda_attn_args *a, struct attn_params *p, int nz)
{
    p->count = !a->combine_apart && (int64_t)nz * a->n_head_kv <= CUDA_ATTN_COUNT_BYTES / 4
                   ? (unsigned *)a->scratch
                   : NULL;
}

/* STRATA_ATTN_TRACE (a diagnostic): at exit, when the blocks of the last decode call and of its
 * merge reached each stage (%globaltimer of thread 0, ns after the first decode block began; the
 * earliest, the median and the latest block). Decode stamps: 0 start, 1 loads before the wait
 * issued, 2 past the wait, 3 first tile in shared memory, 4 its scores (lane-per-key: the
 * partial dots), 5 its probabilities, 6 every tile done, 7 partial results written; merge: 0
 * start, 1 past the wait, 2 partial results loaded, 3 done. */
static void attn_trace_print(void)
{
    static unsigned long long d[256 * 8], c[256 * 4];
    if (cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpyFromSymbol(d, attn_trace_d, sizeof(d)) != cudaSuccess ||
        cudaMemcpyFromSymbol(c, attn_trace_c, sizeof(c)) != cudaSuccess)
        return;
    /* blocks of the last call only: begun within 100 us of the latest start (an earlier call
     * with more blocks leaves older stamps in the rest) */
    unsigned long long t0 = ~0ull, last = 0;
    for (int b = 0; b < 256; b++)
        last = d[b * 8] > last ? d[b * 8] : last;
    for (int b = 0; b < 256; b++)
        if (d[b * 8] && d[b * 8] + 100000 > last)
            t0 = d[b * 8] < t0 ? d[b * 8] : t0;
    static long long v[256];
    for (int i = 0; i < 8 + 4; i++) {
        int n = 0;
        for (int b = 0; b < 256; b++) {
            const unsigned long long t = i < 8 ? d[b * 8 + i] : c[b * 4 + i - 8];
            if (t && t >= t0) /* blocks without keys skip the tile stamps */
                v[n++] = (long long)(t - t0);
        }
        for (int x = 1; x < n; x++)
            for (int y = x; y > 0 && v[y] < v[y - 1]; y--) {
                const long long z = v[y];
                v[y] = v[y - 1];
                v[y - 1] = z;
            }
        if (n)
            fprintf(stderr, "attention trace: %s stamp %d, %3d blocks: %lld %lld %lld ns\n",
                    i < 8 ? "decode" : "merge", i < 8 ? i : i - 8, n, v[0], v[n / 2], v[n - 1]);
    }
}

static int attn_trace_on(void)
{
    static int on = -1;
    if (on < 0) {
        on = getenv("STRATA_ATTN_TRACE") != NULL;
        if (on)
            atexit(attn_trace_print);
    }
    return on;
}

/* The decode kernel where it applies (few rows, head_dim 64/128/256, scratch given): launches
 * it and the combine, true; else false and nothing launched. */
static bool attd_launch(const struct cuda_attn_args *a, struct attn_params *p, cudaStream_t s)
{
    const int rows = a->n_tok * p->G, D = a->head_dim / 32;
    if (a->n_tok > ATTD_MAX_TOK || rows > ATTD_MAX_ROWS || a->head_dim % 32 ||
        (D != 2 && D != 4 && D != 8) || rows * D > 64 || (rows & (rows - 1)) || !a->scratch ||
        !attd_q_ok(a))
        return false;
    int ns = ops_imin(ATTD_CHUNKS, ops_cdiv(attd_keys(a, a->n_tok), attd_sub(D)));
    int64_t nth = (int64_t)a->n_tok * a->n_head;
    if (a->scratch_bytes < attn_scratch_need(ns, nth, a->head_dim) || !ops_aligned(a->scratch, 4))
        return false;
    p->n_split = ns;
    attn_scratch_use(p, a->scratch, ns, nth, a->head_dim);
    attd_count_plan(a, p, 1);
    p->early = (ops_early() & OPS_EARLY_ATTN) != 0;
    dim3 grid((unsigned)ns, (unsigned)a->n_head_kv);
    if (!attd_dispatch<2>(D, rows, grid, *p, s) && !attd_dispatch<4>(D, rows, grid, *p, s) &&
        !attd_dispatch<8>(D, rows, grid, *p, s)) {
        p->count = NULL;
        return false;
    }
    if (!p->count)
        ops_launch(k_attn_combine, (unsigned)nth, ATT_THREADS, 0, s, *p);
    return true;
}

/* k_rows: the decode kernel with one query token per grid row z, each of its own caches; the
 * split count is planned from n_ctx (above every row's position), and each row's chunk from its
 * own position, as attd_launch does for that row alone. 0, -ENOTSUP or -EINVAL. */
static int attd_rows_launch(const struct cuda_attn_args *a, struct attn_params *p, cudaStream_t s)
{
    const int rows = p->G, D = a->head_dim / 32;
    if (!a->pos_dev || !a->v_rows || !a->out || !a->q || a->n_tok > 65535)
        return -EINVAL;
    if (!cuda_attention_rows_ok(a->n_head, a->n_head_kv, a->head_dim) || !attd_q_ok(a))
        return -ENOTSUP;
    int ns = ops_imin(ATTD_CHUNKS, ops_cdiv(a->n_ctx, attd_sub(D)));
    int64_t nth = (int64_t)a->n_tok * a->n_head;
    if (!a->scratch || a->scratch_bytes < attn_scratch_need(ns, nth, a->head_dim) ||
        !ops_aligned(a->scratch, 4))
        return -EINVAL;
    p->n_tok = 1;
    p->zrows = 1;
    p->kz = a->k_rows;
    p->vz = a->v_rows;
    p->n_split = ns;
    attn_scratch_use(p, a->scratch, ns, nth, a->head_dim);
    attd_count_plan(a, p, a->n_tok);
    p->early = (ops_early() & OPS_EARLY_ATTN) != 0;
    dim3 grid((unsigned)ns, (unsigned)a->n_head_kv, (unsigned)a->n_tok);
    if (!attd_dispatch<2>(D, rows, grid, *p, s) && !attd_dispatch<4>(D, rows, grid, *p, s) &&
        !attd_dispatch<8>(D, rows, grid, *p, s))
        return -ENOTSUP;
    if (!p->count)
        ops_launch(k_attn_combine, (unsigned)nth, ATT_THREADS, 0, s, *p);
    return cuda_last_error("cuda_attention (rows)");
}

/* A few query rows of one stream (2 .. CUDA_ATTN_EXACT_MAX_TOK): the decode kernel with one
 * token per grid row z, each split and combined as a call for that token alone would be
 * (attd_launch), so that every row's bits do not depend on the rows beside it. True when it
 * launched; false (nothing launched) where the decode kernel does not take the heads or the
 * scratch is short. */
static bool attd_each_launch(const struct cuda_attn_args *a, struct attn_params *p, cudaStream_t s)
{
    const int D = a->head_dim / 32;
    if (a->n_tok < 2 || a->n_tok > CUDA_ATTN_EXACT_MAX_TOK ||
        !cuda_attention_rows_ok(a->n_head, a->n_head_kv, a->head_dim) || !attd_q_ok(a))
        return false;
    int ns = ops_imin(ATTD_CHUNKS, ops_cdiv(attd_keys(a, 1), attd_sub(D)));
    int64_t nth = (int64_t)a->n_tok * a->n_head;
    if (!a->scratch || a->scratch_bytes < attn_scratch_need(ns, nth, a->head_dim) ||
        !ops_aligned(a->scratch, 4))
        return false;
    struct attn_params q = *p;
    q.n_tok = 1;
    q.zrows = 1;
    q.n_split = ns;
    attn_scratch_use(&q, a->scratch, ns, nth, a->head_dim);
    attd_count_plan(a, &q, a->n_tok);
    q.early = (ops_early() & OPS_EARLY_ATTN) != 0;
    dim3 grid((unsigned)ns, (unsigned)a->n_head_kv, (unsigned)a->n_tok);
    if (!attd_dispatch<2>(D, p->G, grid, q, s) && !attd_dispatch<4>(D, p->G, grid, q, s) &&
        !attd_dispatch<8>(D, p->G, grid, q, s))
        return false;
    if (!q.count)
        ops_launch(k_attn_combine, (unsigned)nth, ATT_THREADS, 0, s, q);
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
    if (a->window > 0) /* a block's rows span ATTP_ROWS / G + 1 tokens at most */
        keys = ops_imin(keys, a->window + ATTP_ROWS / p->G + 1);
    int ns = ops_cdiv(ATT_TARGET_BLOCKS, blocks);
    ns = ops_imin(ns, ATT_MAX_SPLIT);
    ns = ops_imin(ns, ATT_SPLIT_ROWS / a->n_tok);
    ns = ops_imax(ops_imin(ns, ops_cdiv(keys, attp_keys(HD))), 1);
    const int64_t nth = (int64_t)a->n_tok * a->n_head;
    if (ns > 1 && (!a->scratch || a->scratch_bytes < attn_scratch_need(ns, nth, hd) ||
                   !ops_aligned(a->scratch, 8)))
        ns = 1;
    struct attn_params q = *p;
    q.n_split = ns;
    if (ns > 1)
        attn_scratch_use(&q, a->scratch, ns, nth, hd);
    dim3 grid((unsigned)ops_cdiv(rows, ATTP_ROWS), (unsigned)a->n_head_kv, (unsigned)ns);
    switch (HD) {
    case 64:
        ops_launch(k_attn_pf<64>, grid, ATTP_THREADS, 0, s, q);
        break;
    case 128:
        ops_launch(k_attn_pf<128>, grid, ATTP_THREADS, 0, s, q);
        break;
    default:
        ops_launch(k_attn_pf<256>, grid, ATTP_THREADS, 0, s, q);
        break;
    }
    if (ns > 1)
        ops_launch(k_attn_combine, (unsigned)nth, ATT_THREADS, 0, s, q);
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
    struct attn_params p = {};
    p.lk = !(getenv("STRATA_ATTN_LK") && getenv("STRATA_ATTN_LK")[0] == '0');
    p.trace = attn_trace_on();
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
    p.sinks = a->sinks;
    p.window = a->window;
    if (a->q8_done)
        *a->q8_done = 0;
    if (a->q8_codes && (!a->q8_scales || !ops_aligned(a->q8_scales, 8)))
        return -EINVAL;
    if (a->head_dim % 32 == 0) { /* else no 8-bit copy (q8_done stays 0) */
        p.q8s = a->q8_codes;
        p.q8d = (float2 *)a->q8_scales;
    }
    if (a->k_rows) {
        if (a->sinks || a->window > 0)
            return -ENOTSUP;
        int rc = attd_rows_launch(a, &p, (cudaStream_t)a->stream);
        if (!rc && a->q8_done && p.q8s)
            *a->q8_done = 1;
        return rc;
    }
    if (!a->out || !a->q || !a->k_cache || !a->v_cache)
        return -EINVAL;
    struct attn_plan pl;
    attn_plan_make(a, &pl);
    if (pl.smem > 48 * 1024) /* cannot happen for head_dim <= 256; no opt-in attribute is set */
        return -EINVAL;
    int64_t nth = (int64_t)a->n_tok * a->n_head;
    p.R = pl.R;
    p.T = pl.T;
    p.n_split = pl.n_split;
    if (pl.n_split > 1) {
        if (!a->scratch || a->scratch_bytes < attn_scratch_need(pl.n_split, nth, a->head_dim) ||
            !ops_aligned(a->scratch, 4))
            return -EINVAL;
        attn_scratch_use(&p, a->scratch, pl.n_split, nth, a->head_dim);
    }
    cudaStream_t s = (cudaStream_t)a->stream;
    if (attd_each_launch(a, &p, s) || attd_launch(a, &p, s)) {
        int rc = cuda_last_error("cuda_attention");
        if (!rc && a->q8_done && p.q8s)
            *a->q8_done = 1;
        return rc;
    }
    p.q8s = NULL; /* the 8-bit copy comes with the decode kernel only */
    p.q8d = NULL;
    if (attp_launch(a, &p, s))
        return cuda_last_error("cuda_attention");
    dim3 grid((unsigned)ops_cdiv(a->n_tok * p.G, pl.R), (unsigned)a->n_head_kv,
              (unsigned)pl.n_split);
    ops_launch(k_attn, grid, ATT_THREADS, pl.smem, s, p);
    if (pl.n_split > 1)
        ops_launch(k_attn_combine, (unsigned)nth, ATT_THREADS, 0, s, p);
    return cuda_last_error("cuda_attention");
}
