/* ops_ssm: the recurrent ops of Gated DeltaNet layers (qwen3next, qwen35moe) on the CPU, in
 * float32 with OpenMP over heads: the short causal depthwise conv with its rolling state, and
 * the gated delta rule with its per-head state, each token after the other (the recurrent
 * form; a prefill of n tokens costs n steps). The delta rule's head step is built for plain
 * x86-64, AVX2 and AVX-512 (ssm_body.h) and picked at run time. Shapes (rows, cols), cols
 * contiguous. */
#ifndef STRATA_OPS_SSM_H
#define STRATA_OPS_SSM_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Causal depthwise conv then SiLU, in place: x (n_tok, ch); channel c of token t becomes
 * silu(sum_j w[c*d_conv + j] * u_{t - (d_conv-1) + j}) where u is the channel's input, the
 * d_conv - 1 inputs before token 0 read from state (d_conv - 1, ch) (row 0 the oldest), which
 * then holds the last d_conv - 1 inputs. */
void ops_ssm_conv(float *x, float *state, const float *w, int n_tok, int ch, int d_conv);

struct ops_gdn {
    float *out;         /* (n_tok, n_v*d): gated, normed head outputs */
    const float *qkv;   /* (n_tok, 2*n_k*d + n_v*d): conv'd q | k | v */
    const float *z;     /* (n_tok, n_v*d): the output gate's input */
    const float *b, *a; /* beta and alpha logits: row t at b + t*ba_stride (see ba_grouped) */
    int ba_stride;
    bool ba_grouped;        /* v head j's logits at [(j/r)*2r + j%r] (b) and [(j/r)*2r + r + j%r]
                             * (a), r = n_v/n_k; else at [j] of b and of a */
    const float *a_log_neg; /* (n_v): -exp(A_log) */
    const float *dt_bias;   /* (n_v) */
    const float *norm_w;    /* (d): the gated RMSNorm's weight */
    float *state;           /* (n_v, d, d): S[j][k][v], updated */
    int n_tok, n_k, n_v, d;
    bool v_tiled; /* v head j reads q/k head j % n_k, else j / (n_v/n_k) */
    float eps;    /* the RMSNorm's epsilon */
};

/* For each token in order and each v head j (k = its q/k head): q = l2norm(q_k)/sqrt(d),
 * kk = l2norm(k_k) (epsilon 1e-6 under the root), beta = sigmoid(b_j),
 * g = a_log_neg_j * softplus(a_j + dt_bias_j); S = e^g S; S += kk (beta (v_j - S^T kk))^T;
 * o = S^T q; out_j = rmsnorm(o) * norm_w * silu(z_j). */
void ops_gdn(const struct ops_gdn *g);

#ifdef __cplusplus
}
#endif

#endif
