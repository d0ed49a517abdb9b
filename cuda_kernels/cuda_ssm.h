/* cuda_ssm: the device ops of the hybrid Gated DeltaNet models (qwen3next, qwen35moe), float32
 * activations on the device: the causal depthwise conv with its rolling state, the gated delta
 * rule with its per-head state and gated RMSNorm, partial NEOX rope, and the small elementwise
 * ops of gated attention and the shared expert. Each mirrors a CPU op (cpu_kernels/ops_ssm.h,
 * ops_cpu.h, runtime/backend_cpu.c) within float rounding (sums in another order).
 *
 * As in cuda_ops.h: launchers only enqueue work on `stream` (a cudaStream_t, NULL = the legacy
 * default stream), never allocate or synchronise, so they can be captured in a CUDA graph;
 * pointers are device memory; they return 0, -EINVAL for bad shapes (nothing launched) or -EIO
 * when the launch fails. Deterministic: no float atomics, fixed summation orders. Without a
 * CUDA build (cuda_ssm_stub.c) every launcher returns -ENODEV. A call with no tokens (rows,
 * elements) returns 0 without launching.
 */
#ifndef STRATA_CUDA_SSM_H
#define STRATA_CUDA_SSM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_SSM_MAX_CONV 16  /* d_conv */
#define CUDA_SSM_MAX_D 256    /* d_state */

/* Causal depthwise conv then SiLU in place, as ops_ssm_conv: x (n_tok, ch); channel c of token
 * t becomes silu(sum_j w[c*d_conv + j] * u_{t-(d_conv-1)+j}), the d_conv - 1 inputs before
 * token 0 read from state (d_conv - 1, ch) (row 0 the oldest), which then holds the last
 * d_conv - 1 inputs. n_tok >= 1, 1 <= d_conv <= CUDA_SSM_MAX_CONV. */
struct cuda_ssm_conv_args {
    float *x, *state;
    const float *w; /* (ch, d_conv) */
    int n_tok, ch, d_conv;
    void *stream;
};
int cuda_ssm_conv(const struct cuda_ssm_conv_args *a);

/* The gated delta rule over n_tok tokens in order, as ops_gdn (the same fields and meaning):
 * per v head j, q/k head kh = v_tiled ? j % n_k : j / (n_v/n_k); q = l2norm(q)/sqrt(d),
 * k = l2norm(k) (1e-6 under the root); beta = sigmoid(b), decay = exp(a_log_neg_j *
 * softplus(a + dt_bias_j)); S = decay S; S += k (beta (v - S^T k))^T; o = S^T q;
 * out = o / sqrt(mean(o^2) + eps) * norm_w * silu(z). state (n_v, d, d) S[j][k][v], updated.
 * 1 <= d <= CUDA_SSM_MAX_D, n_v a multiple of n_k, ba_stride >= 2 n_v (ba_grouped) or n_v.
 * The two forms compute the same values with sums in other orders (docs/cuda-ops.md). */
enum cuda_gdn_form {
    CUDA_GDN_AUTO,      /* chunked from CUDA_GDN_CHUNK_MIN tokens where d allows, else recurrent */
    CUDA_GDN_RECURRENT, /* token after token: a call of n tokens equals n calls of one, bit for
                         * bit (speculative verify passes rely on it) */
    CUDA_GDN_CHUNKED,   /* chunks of 32 tokens as small matrix products (d 32, 64 or 128, else
                         * -EINVAL): the prefill form */
};
#define CUDA_GDN_CHUNK_MIN 32

struct cuda_gdn_args {
    float *out;         /* (n_tok, n_v*d) */
    const float *qkv;   /* (n_tok, 2*n_k*d + n_v*d) */
    const float *z;     /* (n_tok, n_v*d) */
    const float *b, *a; /* row t at + t*ba_stride */
    int ba_stride;
    bool ba_grouped;    /* v head j's logits at [(j/r)*2r + j%r] (b), [(j/r)*2r + r + j%r] (a) */
    const float *a_log_neg, *dt_bias; /* (n_v) */
    const float *norm_w;              /* (d) */
    float *state;
    int n_tok, n_k, n_v, d;
    bool v_tiled;
    float eps;
    enum cuda_gdn_form form;
    void *stream;
};
int cuda_gdn(const struct cuda_gdn_args *a);

/* NEOX rope of the first n_rot dims of each head, as ops_rope_neox_partial: the pair (x[i],
 * x[i + n_rot/2]) rotates by pos * base^(-2i/n_rot) (angle, cos and sin in double, rounded to
 * float); dims n_rot.. pass through. Token t at pos0 + t, or at pos_dev[t] when pos_dev is
 * non-NULL (graph replay). Even n_rot <= head_dim <= 1024 (n_rot 0: nothing to do). */
struct cuda_rope_partial_args {
    float *x; /* (n_tok, n_heads*head_dim) */
    int n_tok, n_heads, head_dim, n_rot;
    int pos0;
    const int32_t *pos_dev;
    float base;
    void *stream;
};
int cuda_rope_partial(const struct cuda_rope_partial_args *a);

/* q (rows, hd), gate (rows, hd) = the first and second halves of each row of qg (rows, 2 hd). */
int cuda_split_halves(float *q, float *gate, const float *qg, int rows, int hd, void *stream);

/* x (n) *= sigmoid(gate (n)). */
int cuda_mul_sigmoid(float *x, const float *gate, size_t n, void *stream);

/* u (n) = silu(g (n)) * u. */
int cuda_swiglu_inplace(float *u, const float *g, size_t n, void *stream);

/* out (rows, dim) += sigmoid(w . x_r) * y_r for each row r: the shared expert's gated add
 * (w (dim), x and y (rows, dim)). The dot in float, a fixed order. */
int cuda_add_sigmoid_gated(float *out, const float *y, const float *x, const float *w, int rows,
                           int dim, void *stream);

#ifdef __cplusplus
}
#endif

#endif
