/* ops_cpu: the non-matmul ops of the CPU backend, in float32 with OpenMP: RMSNorm, NEOX RoPE,
 * causal GQA attention over a KV cache, softmax, SiLU. Shapes (rows, cols), cols contiguous. */
#ifndef STRATA_OPS_CPU_H
#define STRATA_OPS_CPU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OPS_MAX_HEAD_DIM 1024

/* out (rows, dim) = in / sqrt(mean(in^2) + eps) * w; w (dim) may be NULL (no scale).
 * out may equal in. */
void ops_rmsnorm(float *out, const float *in, const float *w, int rows, int dim, float eps);

/* NEOX RoPE in place: x (n_tok, n_heads*head_dim); token t at position pos0+t; the pair
 * (x[i], x[i + head_dim/2]) of each head rotates by pos * base^(-2i/head_dim). */
void ops_rope_neox(float *x, int n_tok, int n_heads, int head_dim, int pos0, float base);

/* The same rotation with caller-given angles per position, freq (head_dim/2): the pair i of
 * each head rotates by pos * freq[i], both of its results scaled by mscale (YaRN's attention
 * factor; 1 for none). */
void ops_rope_neox_freq(float *x, int n_tok, int n_heads, int head_dim, int pos0,
                        const double *freq, float mscale);

/* NEOX RoPE of the first n_rot dims of each head (even n_rot <= head_dim): the pair
 * (x[i], x[i + n_rot/2]) rotates by pos * base^(-2i/n_rot); dims n_rot.. pass through. */
void ops_rope_neox_partial(float *x, int n_tok, int n_heads, int head_dim, int n_rot, int pos0,
                           float base);

/* ops_rope_neox_freq over the first n_rot dims of each head (freq (n_rot/2)). */
void ops_rope_neox_rot(float *x, int n_tok, int n_heads, int head_dim, int n_rot, int pos0,
                       const double *freq, float mscale);

/* YaRN's angles and attention factor, as transformers' yarn rope computes them: the
 * frequencies base^(-2i/head_dim), divided by factor where the dimension's wavelength is long
 * (fewer than beta_slow turns over n_ctx_orig positions), unchanged where it is short (more
 * than beta_fast turns), a linear ramp between (the correction range, rounded outward when
 * truncate); *mscale = 0.1 ln(factor) + 1 (1 for factor <= 1). freq (head_dim/2). */
void ops_rope_yarn_freq(int head_dim, float base, float factor, uint32_t n_ctx_orig,
                        float beta_fast, float beta_slow, int truncate, double *freq,
                        float *mscale);

struct ops_attn {
    float *out;           /* (n_tok, n_head*head_dim) */
    const float *q;       /* (n_tok, n_head*head_dim) */
    const float *k_cache; /* (>= pos0+n_tok, n_head_kv*head_dim) */
    const float *v_cache; /* same */
    int pos0, n_tok;
    int n_head, n_head_kv, head_dim;
    float scale;
    const float *sinks; /* (n_head) or NULL: a logit per head in the softmax's denominator
                         * that takes no value (gpt-oss's attention sinks) */
    int window;         /* > 0: query at position p sees keys p - window + 1 .. p only */
};

/* Causal attention (head_dim <= OPS_MAX_HEAD_DIM): query t (position pos0+t) of head h
 * attends to keys 0..pos0+t (the last `window` of them when window > 0) of kv head
 * h / (n_head/n_head_kv), softmax(scale q.k) weighted sum of v, the sink's e^sink added to
 * the softmax's denominator when sinks are given. Online softmax in float; the result does not
 * depend on the thread count. */
void ops_attention(const struct ops_attn *a);

/* In-place softmax of x (n). */
void ops_softmax(float *x, int n);

static inline float ops_silu(float x)
{
    return x / (1.0f + __builtin_expf(-x));
}

#ifdef __cplusplus
}
#endif

#endif
