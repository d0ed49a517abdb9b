/* cuda_ssm with CUDA: kernels first, then the C launchers that check shapes, compute the grid
 * and check the launch. Contracts in cuda_ssm.h; design and tolerances in docs/cuda-ops.md.
 * The kernels are plain on purpose (one thread per channel or column, loops over tokens in
 * order): each mirrors its CPU op's loops, so a reader can check one against the other. */
#include "cuda_check.h"
#include "cuda_mem.h"
#include "cuda_ops_util.cuh"
#include "cuda_ssm.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>

/* ==== kernels ================================================================================ */

/* As ops_silu: x / (1 + e^-x). */
static __device__ __forceinline__ float ssm_silu(float x)
{
    return x / (1.0f + expf(-x));
}

static __device__ __forceinline__ float ssm_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* ---- causal conv + SiLU: one thread per channel, tokens in order --------------------------- */

#define CONV_THREADS 128

struct ssm_conv_params {
    float *x;       /* (n_tok, ch), in place */
    float *state;   /* (d_conv - 1, ch), row 0 the oldest input */
    const float *w; /* (ch, d_conv) */
    int n_tok, ch, d_conv;
};

static __global__ void __launch_bounds__(CONV_THREADS) k_ssm_conv(struct ssm_conv_params p)
{
    ops_pdl_begin();
    const int c = blockIdx.x * CONV_THREADS + threadIdx.x;
    if (c >= p.ch)
        return;
    const int h = p.d_conv - 1;
    const float *wc = p.w + (int64_t)c * p.d_conv;
    float win[CUDA_SSM_MAX_CONV]; /* the channel's last h inputs, oldest first */

    for (int j = 0; j < h; j++)
        win[j] = p.state[(int64_t)j * p.ch + c];
    for (int t = 0; t < p.n_tok; t++) {
        float *px = p.x + (int64_t)t * p.ch + c;
        const float u = *px;
        float acc = wc[h] * u;
        for (int j = 0; j < h; j++)
            acc += wc[j] * win[j];
        for (int j = 0; j + 1 < h; j++)
            win[j] = win[j + 1];
        if (h)
            win[h - 1] = u;
        *px = ssm_silu(acc);
    }
    for (int j = 0; j < h; j++)
        p.state[(int64_t)j * p.ch + c] = win[j];
}

/* ---- gated delta rule: one block per v head, tokens in order ------------------------------- */

#define GDN_THREADS 128
#define GDN_WARPS (GDN_THREADS / 32)
#define GDN_COLS (CUDA_SSM_MAX_D / GDN_THREADS) /* columns b per thread: tid, tid + 128 */
#define GDN_L2_EPS 1e-6f                        /* as ops_ssm.c's SSM_L2_EPS */
static_assert(CUDA_SSM_MAX_D % GDN_THREADS == 0, "every column b < CUDA_SSM_MAX_D has a thread");

struct gdn_params {
    float *out;       /* (n_tok, n_v*d) */
    const float *qkv; /* (n_tok, 2*n_k*d + n_v*d) */
    const float *z;   /* (n_tok, n_v*d) */
    const float *b, *a;
    int ba_stride;
    bool ba_grouped;
    const float *a_log_neg, *dt_bias; /* (n_v) */
    const float *norm_w;              /* (d) */
    float *state;                     /* (n_v, d, d) */
    int n_tok, n_k, n_v, d;
    bool v_tiled;
    float eps;
};

/* Where v head j reads: its q/k head, and its beta and alpha logits in a token's row. */
struct gdn_head {
    int kh, bi, ai;
};

static __device__ __forceinline__ struct gdn_head gdn_head_of(const struct gdn_params &p, int j)
{
    const int r = p.n_v / p.n_k;
    struct gdn_head h;
    h.kh = p.v_tiled ? j % p.n_k : j / r;
    h.bi = p.ba_grouped ? (j / r) * 2 * r + j % r : j;
    h.ai = p.ba_grouped ? (j / r) * 2 * r + r + j % r : j;
    return h;
}

/* As ops_ssm.c's softplus, with its shortcut above 20. */
static __device__ __forceinline__ float gdn_softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

/* Block of GDN_THREADS: thread tid owns the state columns b = tid + c * GDN_THREADS (c <
 * GDN_COLS, b < d), so it alone reads and writes S[a][b] for every a, across all tokens: no
 * other thread touches its part of the state (and a warp's loads of S[a][.] are coalesced).
 * D > 0 (d == D <= GDN_THREADS, one column per thread): the thread holds its column in
 * registers for the whole call, read once before the first token and written once after the
 * last, so a prefill's tokens cost no state traffic; D == 0: any d up to CUDA_SSM_MAX_D, the
 * state read and written in memory at every token. Both compute the same sums in the same
 * order.
 * Per token, shared memory holds the raw q and k of the head's q/k head, normalized as they
 * are read (times rq, rk); sums over the head (|q|^2, |k|^2, k.q, |o|^2) are fixed-order block
 * reductions: each thread adds its elements in index order, a warp butterfly, then every
 * thread adds the GDN_WARPS warp sums in warp order. Threads without a column (d < 128) still
 * take part in every reduction and barrier. */
template <int D> static __global__ void __launch_bounds__(GDN_THREADS) k_gdn(struct gdn_params p)
{
    ops_pdl_begin();
    static_assert(D >= 0 && D <= GDN_THREADS, "a register column per thread");
    constexpr int NC = D ? 1 : GDN_COLS;                     /* columns per thread */
    __shared__ float sq[CUDA_SSM_MAX_D], sk[CUDA_SSM_MAX_D]; /* raw q, k of head kh */
    __shared__ float red_qk[GDN_WARPS][3];                   /* warp sums of |q|^2, |k|^2, k.q */
    __shared__ float red_o[GDN_WARPS];                       /* warp sums of |o|^2 */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int j = blockIdx.x, d = D ? D : p.d;
    const struct gdn_head hd = gdn_head_of(p, j);
    const int kh = hd.kh, bi = hd.bi, ai = hd.ai;
    const int64_t kw = (int64_t)p.n_k * d, vw = (int64_t)p.n_v * d, cw = 2 * kw + vw;
    const float qscale = 1.0f / sqrtf((float)d);
    const float a_log_neg = p.a_log_neg[j], dt_bias = p.dt_bias[j];
    float *S = p.state + (int64_t)j * d * d; /* S[a][b] at S[a*d + b] */
    float col[D ? D : 1];                    /* D > 0: S[.][tid] */
    if constexpr (D > 0) {
        if (tid < D) {
#pragma unroll
            for (int a = 0; a < D; a++)
                col[a] = S[a * D + tid];
        }
    }

    for (int t = 0; t < p.n_tok; t++) {
        const float *row = p.qkv + (int64_t)t * cw;
        const float *qh = row + (int64_t)kh * d, *kh_row = row + kw + (int64_t)kh * d;
        const float *v = row + 2 * kw + (int64_t)j * d;
        const float *z = p.z + (int64_t)t * vw + (int64_t)j * d;
        float *out = p.out + (int64_t)t * vw + (int64_t)j * d;

        /* 1. raw q and k into shared memory; |q|^2, |k|^2 and the raw k.q */
        float pq = 0.0f, pk = 0.0f, pkq = 0.0f;
        for (int i = tid; i < d; i += GDN_THREADS) {
            const float qi = qh[i], ki = kh_row[i];
            sq[i] = qi;
            sk[i] = ki;
            pq += qi * qi;
            pk += ki * ki;
            pkq += ki * qi;
        }
        pq = ops_warp_sum(pq);
        pk = ops_warp_sum(pk);
        pkq = ops_warp_sum(pkq);
        if (lane == 0) {
            red_qk[warp][0] = pq;
            red_qk[warp][1] = pk;
            red_qk[warp][2] = pkq;
        }
        __syncthreads(); /* red_qk and sq/sk complete */
        float ssq = 0.0f, ssk = 0.0f, kq_raw = 0.0f;
        for (int w = 0; w < GDN_WARPS; w++) {
            ssq += red_qk[w][0];
            ssk += red_qk[w][1];
            kq_raw += red_qk[w][2];
        }
        /* as l2norm_scaled: q = q * (1/sqrt(d)) / sqrt(|q|^2 + eps), k = k / sqrt(|k|^2 + eps) */
        const float rq = qscale / sqrtf(ssq + GDN_L2_EPS), rk = 1.0f / sqrtf(ssk + GDN_L2_EPS);
        const float kq = kq_raw * rq * rk; /* k.q of the normalized vectors */
        const float beta = ssm_sigmoid(p.b[(int64_t)t * p.ba_stride + bi]);
        const float decay =
            expf(a_log_neg * gdn_softplus(p.a[(int64_t)t * p.ba_stride + ai] + dt_bias));

        /* 2. this thread's columns of S: S = decay S; delta = beta (v - S^T k);
         * S += k delta^T; o = S^T q = (decay S_old)^T q + (k.q) delta */
        float o[NC];
        float po = 0.0f;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int b = tid + c * GDN_THREADS;
            o[c] = 0.0f;
            if (b >= d)
                continue;
            float acc_k = 0.0f, acc_q = 0.0f, delta;
            if constexpr (D > 0) {
#pragma unroll
                for (int a = 0; a < D; a++) {
                    const float s = decay * col[a];
                    acc_k += s * (sk[a] * rk);
                    acc_q += s * (sq[a] * rq);
                }
                delta = beta * (v[b] - acc_k);
#pragma unroll
                for (int a = 0; a < D; a++)
                    col[a] = decay * col[a] + (sk[a] * rk) * delta;
            } else {
                for (int a = 0; a < d; a++) {
                    const float s = decay * S[(int64_t)a * d + b];
                    acc_k += s * (sk[a] * rk);
                    acc_q += s * (sq[a] * rq);
                }
                delta = beta * (v[b] - acc_k);
                for (int a = 0; a < d; a++) {
                    float *s = S + (int64_t)a * d + b;
                    *s = decay * *s + (sk[a] * rk) * delta;
                }
            }
            o[c] = acc_q + kq * delta;
            po += o[c] * o[c];
        }

        /* 3. gated RMSNorm over the head's d outputs */
        po = ops_warp_sum(po);
        if (lane == 0)
            red_o[warp] = po;
        __syncthreads(); /* red_o complete */
        float ss = 0.0f;
        for (int w = 0; w < GDN_WARPS; w++)
            ss += red_o[w];
        const float rn = 1.0f / sqrtf(ss / d + p.eps);
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int b = tid + c * GDN_THREADS;
            if (b < d)
                out[b] = o[c] * rn * p.norm_w[b] * ssm_silu(z[b]);
        }
        __syncthreads(); /* every thread is done with sq, sk, red_qk and red_o of token t */
    }
    if constexpr (D > 0) {
        if (tid < D) {
#pragma unroll
            for (int a = 0; a < D; a++)
                S[a * D + tid] = col[a];
        }
    }
}

/* ---- gated delta rule, chunked: the prefill form ---------------------------------------------
 * Over a chunk of C tokens starting from state S0 (all per v head), with q, k normalized as
 * above, gamma_t = prod_{r <= t} decay_r (in the chunk) and u_t the delta row of token t, the
 * recurrence unrolls to
 *   S_t = gamma_t S0 + sum_{s <= t} (gamma_t / gamma_s) k_s u_s^T, so
 *   (I + L) U = diag(beta) V - diag(beta gamma) K S0,  L[t][s] = beta_t (gamma_t/gamma_s) k_t.k_s
 *   (s < t), i.e. U = Ut - W S0 with Ut = (I + L)^-1 diag(beta) V, W = (I + L)^-1 diag(beta
 *   gamma) K;
 *   O = diag(gamma) Q S0 + M U,  M[t][s] = (gamma_t / gamma_s) q_t.k_s (s <= t);
 *   S_end = gamma_end S0 + K^T diag(gamma_end / gamma) U.
 * The ratios come from differences of the cumulative log decay, so none overflows. The columns
 * b of S evolve independently (only the RMSNorm mixes them), so a block takes GDNC_CB columns
 * of one head, GDNC_TA threads per column each holding GDNC_AP rows of S in registers (rows
 * a = ai + k * GDNC_TA); every block of the head repeats the chunk's small products (L, M, W),
 * which need no state. The block writes the raw outputs o; k_gdn_norm then applies the gated
 * RMSNorm in place. Sums run in another order than the recurrent form (docs/cuda-ops.md). */

#define GDNC_C 32  /* tokens per chunk */
#define GDNC_CB 32 /* state columns per block */
#define GDNC_AP 16 /* state rows per thread */

template <int D> struct gdnc_shape {
    static constexpr int TA = D / GDNC_AP;  /* threads per column */
    static constexpr int NT = GDNC_CB * TA; /* threads per block */
    static constexpr int LD = D + 1;        /* row stride of sQ, sK, sW: conflict-free columns */
    static constexpr int LC = GDNC_C + 1;   /* row stride of sL, sM */
    static constexpr int LU = GDNC_CB + 1;  /* row stride of sU */
    /* floats of dynamic shared memory: sQ, sK, sW (C, LD); sU (C, LU); sL, sM (C, LC); and
     * beta, log decay, its cumulative sum, exp(G_end - G_s), rq, rk (C each) */
    static constexpr int SMEM = 3 * GDNC_C * LD + GDNC_C * LU + 2 * GDNC_C * LC + 6 * GDNC_C;
    static_assert(D % GDNC_AP == 0 && 32 % TA == 0, "a column's threads inside one warp");
    static_assert(NT >= D + GDNC_CB, "a thread per column of W and of Ut in the solve");
    static_assert(GDNC_C * D % NT == 0, "the chunk's q and k split evenly over the threads");
};

/* Block (GDNC_CB columns b0.. of v head blockIdx.x; b0 = blockIdx.y * GDNC_CB) of
 * gdnc_shape<D>::NT threads; thread tid = cb * TA + ai owns column b0 + cb, rows ai + k*TA. */
template <int D>
static __global__ void __launch_bounds__(gdnc_shape<D>::NT, 1) k_gdn_chunked(struct gdn_params p)
{
    ops_pdl_wait();
    using sh = gdnc_shape<D>;
    constexpr int C = GDNC_C, TA = sh::TA, NT = sh::NT, NW = NT / 32, LD = sh::LD;
    constexpr int LC = sh::LC, LU = sh::LU;
    extern __shared__ float smem[];
    float *sQ = smem, *sK = sQ + C * LD, *sW = sK + C * LD, *sU = sW + C * LD;
    float *sL = sU + C * LU, *sM = sL + C * LC, *sBeta = sM + C * LC, *sLg = sBeta + C;
    float *sG = sLg + C, *sE = sG + C, *sRq = sE + C, *sRk = sRq + C;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int cb = tid / TA, ai = tid % TA;
    const int j = blockIdx.x, b0 = blockIdx.y * GDNC_CB, b = b0 + cb;
    const struct gdn_head hd = gdn_head_of(p, j);
    const int kh = hd.kh, bi = hd.bi, ai_ = hd.ai;
    const int64_t kw = (int64_t)p.n_k * D, vw = (int64_t)p.n_v * D, cw = 2 * kw + vw;
    const float qscale = 1.0f / sqrtf((float)D);
    const float a_log_neg = p.a_log_neg[j], dt_bias = p.dt_bias[j];
    float *S = p.state + (int64_t)j * D * D; /* S[a][b] at S[a*D + b] */

    float col[GDNC_AP]; /* S[ai + k*TA][b] */
#pragma unroll
    for (int k = 0; k < GDNC_AP; k++)
        col[k] = S[(int64_t)(ai + k * TA) * D + b];

    for (int c0 = 0; c0 < p.n_tok; c0 += C) {
        const int nc = min(C, p.n_tok - c0);
        /* 1. raw q and k rows of the chunk (rows past nc zero), beta and the log decay (0 and
         * 0 past nc, so padded rows change nothing). Every load reads a row of the call (rows
         * past nc read row nc - 1, then the value is dropped), so all are issued at once. */
        constexpr int PER = C * D / NT; /* q (and k) elements per thread */
        float qv[PER], kv[PER];
#pragma unroll
        for (int it = 0; it < PER; it++) {
            const int i = tid + it * NT, t = min(i / D, nc - 1), a = i % D;
            const float *row = p.qkv + (int64_t)(c0 + t) * cw + (int64_t)kh * D + a;
            qv[it] = row[0];
            kv[it] = row[kw];
        }
#pragma unroll
        for (int it = 0; it < PER; it++) {
            const int i = tid + it * NT, t = i / D, a = i % D;
            sQ[t * LD + a] = t < nc ? qv[it] : 0.0f;
            sK[t * LD + a] = t < nc ? kv[it] : 0.0f;
        }
        if (tid < C) {
            const int64_t o = (int64_t)(c0 + min(tid, nc - 1)) * p.ba_stride;
            const float bl = p.b[o + bi], al = p.a[o + ai_];
            sBeta[tid] = tid < nc ? ssm_sigmoid(bl) : 0.0f;
            sLg[tid] = tid < nc ? a_log_neg * gdn_softplus(al + dt_bias) : 0.0f;
        }
        __syncthreads(); /* sQ, sK, sBeta, sLg complete */

        /* 2. row norms (a warp per row), the cumulative log decay */
        for (int t = warp; t < C; t += NW) {
            float pq = 0.0f, pk = 0.0f;
            for (int a = lane; a < D; a += 32) {
                pq += sQ[t * LD + a] * sQ[t * LD + a];
                pk += sK[t * LD + a] * sK[t * LD + a];
            }
            pq = ops_warp_sum(pq);
            pk = ops_warp_sum(pk);
            if (lane == 0) {
                sRq[t] = qscale / sqrtf(pq + GDN_L2_EPS);
                sRk[t] = 1.0f / sqrtf(pk + GDN_L2_EPS);
            }
        }
        if (tid == 0) {
            float g = 0.0f;
            for (int t = 0; t < C; t++) {
                g += sLg[t];
                sG[t] = g;
            }
        }
        __syncthreads(); /* sRq, sRk, sG complete */
        for (int i = tid; i < C * D; i += NT) {
            const int t = i / D, a = i % D;
            sQ[t * LD + a] *= sRq[t];
            sK[t * LD + a] *= sRk[t];
        }
        if (tid < C)
            sE[tid] = expf(sG[nc - 1] - sG[tid]);
        __syncthreads(); /* normalized sQ, sK and sE complete */

        /* 3. L (strictly lower) and M (lower, diagonal included) */
        for (int e = tid; e < C * C; e += NT) {
            const int t = e / C, s = e % C;
            float kk = 0.0f, qk = 0.0f;
            if (s <= t) {
#pragma unroll 8
                for (int a = 0; a < D; a++) {
                    const float ks = sK[s * LD + a];
                    kk += sK[t * LD + a] * ks;
                    qk += sQ[t * LD + a] * ks;
                }
            }
            const float ratio = s <= t ? expf(sG[t] - sG[s]) : 0.0f;
            sL[t * LC + s] = s < t ? sBeta[t] * ratio * kk : 0.0f;
            sM[t * LC + s] = ratio * qk;
        }
        __syncthreads(); /* sL, sM complete */

        /* 4. solve (I + L) X = R by columns, forward: threads 0..D-1 take W's columns
         * (R = diag(beta gamma) K), threads D..D+CB-1 Ut's (R = diag(beta) V) */
        if (tid < D + GDNC_CB) {
            float x[C];
            const bool wcol = tid < D; /* warp-uniform: D is a multiple of 32 */
            const int cc = wcol ? tid : tid - D;
            if (wcol) {
#pragma unroll
                for (int t = 0; t < C; t++)
                    x[t] = sBeta[t] * expf(sG[t]) * sK[t * LD + cc];
            } else {
                /* every load reads a row of the call, so all are issued at once; beta is 0
                 * past nc */
                const float *v = p.qkv + (int64_t)c0 * cw + 2 * kw + (int64_t)j * D + b0 + cc;
#pragma unroll
                for (int t = 0; t < C; t++)
                    x[t] = v[(int64_t)min(t, nc - 1) * cw];
#pragma unroll
                for (int t = 0; t < C; t++)
                    x[t] *= sBeta[t];
            }
#pragma unroll
            for (int s = 0; s < C; s++) {
#pragma unroll
                for (int t = s + 1; t < C; t++)
                    x[t] -= sL[t * LC + s] * x[s];
            }
#pragma unroll
            for (int t = 0; t < C; t++) {
                if (wcol)
                    sW[t * LD + cc] = x[t];
                else
                    sU[t * LU + cc] = x[t];
            }
        }
        __syncthreads(); /* sW, sU complete */

        /* 5. this thread's part of (W S0) and (Q S0) for column b, summed over the column's
         * TA threads; then u = Ut - W S0, o = gamma Q S0 + M u, S = gamma_end S0 + K^T (E u) */
        float u[C], qs[C];
#pragma unroll
        for (int t = 0; t < C; t++) {
            float aw = 0.0f, aq = 0.0f;
#pragma unroll
            for (int k = 0; k < GDNC_AP; k++) {
                aw += sW[t * LD + ai + k * TA] * col[k];
                aq += sQ[t * LD + ai + k * TA] * col[k];
            }
            u[t] = aw;
            qs[t] = aq;
        }
#pragma unroll
        for (int m = 1; m < TA; m <<= 1) {
#pragma unroll
            for (int t = 0; t < C; t++) {
                u[t] += __shfl_xor_sync(0xffffffffu, u[t], m);
                qs[t] += __shfl_xor_sync(0xffffffffu, qs[t], m);
            }
        }
#pragma unroll
        for (int t = 0; t < C; t++)
            u[t] = sU[t * LU + cb] - u[t];
            /* the column's threads take every TA-th output row */
#pragma unroll
        for (int t = 0; t < C; t++) {
            if (t % TA != ai || t >= nc)
                continue;
            float o = expf(sG[t]) * qs[t];
#pragma unroll
            for (int s = 0; s <= t; s++)
                o += sM[t * LC + s] * u[s];
            p.out[(int64_t)(c0 + t) * vw + (int64_t)j * D + b] = o;
        }
        const float g_end = expf(sG[nc - 1]);
#pragma unroll
        for (int t = 0; t < C; t++)
            u[t] *= sE[t];
#pragma unroll
        for (int k = 0; k < GDNC_AP; k++) {
            float acc = g_end * col[k];
#pragma unroll
            for (int s = 0; s < C; s++)
                acc += sK[s * LD + ai + k * TA] * u[s];
            col[k] = acc;
        }
        __syncthreads(); /* every thread is done with the chunk's shared memory */
    }
#pragma unroll
    for (int k = 0; k < GDNC_AP; k++)
        S[(int64_t)(ai + k * TA) * D + b] = col[k];
}

/* The gated RMSNorm over each (token, v head) of d raw outputs, in place: a warp per pair,
 * lane sums in index order then a butterfly. */
#define GDN_NORM_WARPS 4
static __global__ void __launch_bounds__(GDN_NORM_WARPS * 32) k_gdn_norm(struct gdn_params p)
{
    ops_pdl_begin();
    const int lane = threadIdx.x & 31;
    const int64_t pair = (int64_t)blockIdx.x * GDN_NORM_WARPS + (threadIdx.x >> 5);
    if (pair >= (int64_t)p.n_tok * p.n_v)
        return;
    const int64_t off = pair * p.d; /* token pair / n_v, head pair % n_v: rows n_v * d wide */
    float *o = p.out + off;
    const float *z = p.z + off;
    float ss = 0.0f;
    for (int i = lane; i < p.d; i += 32)
        ss += o[i] * o[i];
    ss = ops_warp_sum(ss);
    const float rn = 1.0f / sqrtf(ss / p.d + p.eps);
    for (int i = lane; i < p.d; i += 32)
        o[i] = o[i] * rn * p.norm_w[i] * ssm_silu(z[i]);
}

/* ---- partial NEOX rope: one block per (token, ROPE_P_HEADS heads) --------------------------- */

#define ROPE_P_THREADS 128
#define ROPE_P_MAX_HALF 512 /* head_dim <= 1024 */
#define ROPE_P_HEADS 4

struct rope_partial_params {
    float *x; /* (n_tok, n_heads*head_dim) */
    int n_heads, head_dim, n_rot, pos0;
    const int32_t *pos_dev;
    float base;
};

static __global__ void __launch_bounds__(ROPE_P_THREADS)
    k_rope_partial(struct rope_partial_params p)
{
    ops_pdl_begin();
    __shared__ float cs[ROPE_P_MAX_HALF], sn[ROPE_P_MAX_HALF];
    const int t = blockIdx.x, half = p.n_rot / 2;
    const double pos = p.pos_dev ? (double)p.pos_dev[t] : (double)p.pos0 + t;

    /* as ops_rope_neox_partial: freq = base^(-2i/n_rot), angle, cos and sin in double */
    for (int i = threadIdx.x; i < half; i += ROPE_P_THREADS) {
        const double theta = pos * pow((double)p.base, -2.0 * i / p.n_rot);
        double c, s;
        sincos(theta, &s, &c);
        cs[i] = (float)c;
        sn[i] = (float)s;
    }
    __syncthreads();
    const int h0 = blockIdx.y * ROPE_P_HEADS, nh = min(ROPE_P_HEADS, p.n_heads - h0);
    float *x = p.x + ((int64_t)t * p.n_heads + h0) * p.head_dim;
    /* each pair is read and written by one thread: no ordering between threads needed */
    for (int e = threadIdx.x; e < nh * half; e += ROPE_P_THREADS) {
        const int h = e / half, i = e - h * half;
        float *v = x + (int64_t)h * p.head_dim;
        const float a = v[i], b = v[i + half], c = cs[i], s = sn[i];
        v[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        v[i + half] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
    }
}

/* ---- elementwise: grid-stride loops ------------------------------------------------------- */

#define EW_THREADS 256

static __global__ void k_split_halves(float *q, float *gate, const float *qg, int64_t n, int hd)
{
    ops_pdl_begin();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / hd, c = i - r * hd;
        q[i] = qg[r * 2 * hd + c];
        gate[i] = qg[r * 2 * hd + hd + c];
    }
}

static __global__ void k_mul_sigmoid(float *x, const float *gate, size_t n)
{
    ops_pdl_begin();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], ssm_sigmoid(gate[i]));
}

static __global__ void k_swiglu_inplace(float *u, const float *g, size_t n)
{
    ops_pdl_begin();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        u[i] = __fmul_rn(u[i], ssm_silu(g[i]));
}

/* ---- sigmoid-gated add: one block per row, a fixed-order block reduction for the dot ------- */

#define GATED_THREADS 256

static __global__ void __launch_bounds__(GATED_THREADS)
    k_add_sigmoid_gated(float *out, const float *y, const float *x, const float *w, int dim)
{
    ops_pdl_begin();
    __shared__ float part[GATED_THREADS / 32];
    const int64_t base = (int64_t)blockIdx.x * dim;
    float dot = 0.0f;

    for (int i = threadIdx.x; i < dim; i += GATED_THREADS)
        dot += w[i] * x[base + i];
    dot = ops_warp_sum(dot);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = dot;
    __syncthreads();
    float tot = 0.0f;
    for (int i = 0; i < GATED_THREADS / 32; i++)
        tot += part[i];
    const float s = ssm_sigmoid(tot);
    for (int i = threadIdx.x; i < dim; i += GATED_THREADS)
        out[base + i] = __fadd_rn(out[base + i], __fmul_rn(s, y[base + i]));
}

/* ==== launchers ============================================================================== */

/* Blocks for a grid-stride loop over n elements. */
static unsigned ssm_stride_blocks(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 4096 ? 4096 : b);
}

extern "C" int cuda_ssm_conv(const struct cuda_ssm_conv_args *a)
{
    if (!a || a->n_tok < 0 || a->ch < 1 || a->d_conv < 1 || a->d_conv > CUDA_SSM_MAX_CONV)
        return -EINVAL;
    if (a->n_tok == 0)
        return 0;
    if (!a->x || !a->w || (a->d_conv > 1 && !a->state))
        return -EINVAL;
    struct ssm_conv_params p = {a->x, a->state, a->w, a->n_tok, a->ch, a->d_conv};
    ops_launch(k_ssm_conv, ops_cdiv(a->ch, CONV_THREADS), CONV_THREADS, 0, (cudaStream_t)a->stream,
               p);
    return cuda_last_error("cuda_ssm_conv");
}

/* Launches k_gdn_chunked<D> over (n_v, D / GDNC_CB) blocks, raising its shared memory limit
 * first where it needs more than the default 48 KiB. */
template <int D> static cudaError_t gdnc_launch(const struct gdn_params &p, cudaStream_t st)
{
    using sh = gdnc_shape<D>;
    const size_t bytes = sh::SMEM * sizeof(float);
    if (bytes > 48 * 1024) {
        static cudaError_t set = CUDA_CHECK(cudaFuncSetAttribute(
            k_gdn_chunked<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
        if (set != cudaSuccess)
            return set;
    }
    return ops_launch(k_gdn_chunked<D>, dim3(p.n_v, D / GDNC_CB), sh::NT, bytes, st, p);
}

extern "C" int cuda_gdn(const struct cuda_gdn_args *a)
{
    if (!a || a->n_tok < 0 || a->n_k < 1 || a->n_v < 1 || a->n_v % a->n_k || a->d < 1 ||
        a->d > CUDA_SSM_MAX_D || a->ba_stride < (a->ba_grouped ? 2 * a->n_v : a->n_v))
        return -EINVAL;
    if (a->n_tok == 0)
        return 0;
    if (!a->out || !a->qkv || !a->z || !a->b || !a->a || !a->a_log_neg || !a->dt_bias ||
        !a->norm_w || !a->state)
        return -EINVAL;
    struct gdn_params p = {a->out,       a->qkv,        a->z,         a->b,       a->a,
                           a->ba_stride, a->ba_grouped, a->a_log_neg, a->dt_bias, a->norm_w,
                           a->state,     a->n_tok,      a->n_k,       a->n_v,     a->d,
                           a->v_tiled,   a->eps};
    cudaStream_t st = (cudaStream_t)a->stream;
    const bool chunk_d = a->d == 32 || a->d == 64 || a->d == 128;
    if (a->form == CUDA_GDN_CHUNKED && !chunk_d)
        return -EINVAL;
    if (a->form == CUDA_GDN_CHUNKED ||
        (a->form == CUDA_GDN_AUTO && chunk_d && a->n_tok >= CUDA_GDN_CHUNK_MIN)) {
        cudaError_t e;
        switch (a->d) {
        case 128:
            e = gdnc_launch<128>(p, st);
            break;
        case 64:
            e = gdnc_launch<64>(p, st);
            break;
        default:
            e = gdnc_launch<32>(p, st);
        }
        if (e != cudaSuccess)
            return cuda_last_error("cuda_gdn (chunked)");
        const int64_t pairs = (int64_t)a->n_tok * a->n_v;
        ops_launch(k_gdn_norm, (unsigned)((pairs + GDN_NORM_WARPS - 1) / GDN_NORM_WARPS),
                   GDN_NORM_WARPS * 32, 0, st, p);
        return cuda_last_error("cuda_gdn (norm)");
    }
    switch (a->d) { /* the head dims with a register-resident state column */
    case 128:
        ops_launch(k_gdn<128>, a->n_v, GDN_THREADS, 0, st, p);
        break;
    case 64:
        ops_launch(k_gdn<64>, a->n_v, GDN_THREADS, 0, st, p);
        break;
    case 32:
        ops_launch(k_gdn<32>, a->n_v, GDN_THREADS, 0, st, p);
        break;
    case 16:
        ops_launch(k_gdn<16>, a->n_v, GDN_THREADS, 0, st, p);
        break;
    default:
        ops_launch(k_gdn<0>, a->n_v, GDN_THREADS, 0, st, p);
    }
    return cuda_last_error("cuda_gdn");
}

extern "C" int cuda_rope_partial(const struct cuda_rope_partial_args *a)
{
    if (!a || a->n_tok < 0 || a->n_heads < 1 || a->head_dim < 1 ||
        a->head_dim > 2 * ROPE_P_MAX_HALF || a->n_rot < 0 || a->n_rot % 2 || a->n_rot > a->head_dim)
        return -EINVAL;
    if (a->n_tok == 0 || a->n_rot == 0) /* nothing rotates */
        return 0;
    if (!a->x)
        return -EINVAL;
    struct rope_partial_params p = {a->x,    a->n_heads, a->head_dim, a->n_rot,
                                    a->pos0, a->pos_dev, a->base};
    dim3 grid((unsigned)a->n_tok, (unsigned)ops_cdiv(a->n_heads, ROPE_P_HEADS));
    ops_launch(k_rope_partial, grid, ROPE_P_THREADS, 0, (cudaStream_t)a->stream, p);
    return cuda_last_error("cuda_rope_partial");
}

extern "C" int cuda_split_halves(float *q, float *gate, const float *qg, int rows, int hd,
                                 void *stream)
{
    if (rows < 0 || hd < 1)
        return -EINVAL;
    if (rows == 0)
        return 0;
    if (!q || !gate || !qg)
        return -EINVAL;
    const int64_t n = (int64_t)rows * hd;
    ops_launch(k_split_halves, ssm_stride_blocks(n, EW_THREADS), EW_THREADS, 0,
               (cudaStream_t)stream, q, gate, qg, n, hd);
    return cuda_last_error("cuda_split_halves");
}

extern "C" int cuda_mul_sigmoid(float *x, const float *gate, size_t n, void *stream)
{
    if (n == 0)
        return 0;
    if (!x || !gate)
        return -EINVAL;
    ops_launch(k_mul_sigmoid, ssm_stride_blocks((int64_t)n, EW_THREADS), EW_THREADS, 0,
               (cudaStream_t)stream, x, gate, n);
    return cuda_last_error("cuda_mul_sigmoid");
}

extern "C" int cuda_swiglu_inplace(float *u, const float *g, size_t n, void *stream)
{
    if (n == 0)
        return 0;
    if (!u || !g)
        return -EINVAL;
    ops_launch(k_swiglu_inplace, ssm_stride_blocks((int64_t)n, EW_THREADS), EW_THREADS, 0,
               (cudaStream_t)stream, u, g, n);
    return cuda_last_error("cuda_swiglu_inplace");
}

extern "C" int cuda_add_sigmoid_gated(float *out, const float *y, const float *x, const float *w,
                                      int rows, int dim, void *stream)
{
    if (rows < 0 || dim < 1)
        return -EINVAL;
    if (rows == 0)
        return 0;
    if (!out || !y || !x || !w)
        return -EINVAL;
    ops_launch(k_add_sigmoid_gated, rows, GATED_THREADS, 0, (cudaStream_t)stream, out, y, x, w,
               dim);
    return cuda_last_error("cuda_add_sigmoid_gated");
}
