/* cuda_ops: the non-matmul ops of the CUDA backend, float32 activations on the device:
 * embedding rows, RMSNorm (with an optional fused residual add), NEOX RoPE, KV-cache store,
 * add, argmax and the MoE router's softmax + top-k. Attention is in cuda_attention.h.
 *
 * Every launcher only enqueues work on `stream` (a cudaStream_t; NULL is the legacy default
 * stream): no allocation, no synchronisation, no read of device memory by the host, so a
 * sequence of them can be captured in a CUDA graph. For graph replay of decode, positions and
 * key counts can come from device memory (pos_dev) instead of the launch arguments.
 * All pointers named "device" are device (or device-mapped) memory. Shapes are (rows, cols)
 * with cols contiguous. Launchers return 0, -EINVAL for bad shapes, types or alignment (nothing
 * is launched), or -EIO when the launch fails (the CUDA error is printed). Results are
 * deterministic: no float atomics, every sum in a fixed order.
 * Without a CUDA build (cuda_ops_stub.c) every launcher returns -ENODEV.
 * Design and tolerances: docs/cuda-ops.md.
 */
#ifndef STRATA_CUDA_OPS_H
#define STRATA_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Largest n_expert / k cuda_softmax_topk supports. */
#define CUDA_TOPK_MAX_EXPERT 1024
#define CUDA_TOPK_MAX_K 32

/* Whether embedding rows / expert weights of this ggml type can be decoded on the device
 * (F32, F16, BF16, Q4_0, Q8_0, MXFP4, Q4_K, Q5_K, Q6_K). */
int cuda_type_supported(uint32_t type);

/* ---- embedding ----------------------------------------------------------------------------- */

struct cuda_embed_args {
    float *out;         /* (n, n_embd) device */
    const void *table;  /* (n_vocab rows of row_bytes) device; 16-byte aligned for F32/F16/BF16,
                         * 2-byte for the block types except MXFP4 */
    uint32_t type;      /* ggml type id of the table, cuda_type_supported() */
    uint64_t row_bytes; /* bytes between rows, >= the bytes of n_embd elements of type */
    int64_t n_embd;     /* elements per row, a multiple of the type's block (8 for F32/F16/BF16) */
    int64_t n_vocab;    /* rows of the table; an id outside [0, n_vocab) gives a row of NaN */
    const int32_t *ids; /* (n) device token ids */
    int n;              /* rows to gather, >= 0 */
    void *stream;
};

/* out[i] = dequantized row ids[i] of the table, exactly as quant_ref_dequantize decodes it. */
int cuda_embed(const struct cuda_embed_args *a);

/* ---- RMSNorm ------------------------------------------------------------------------------- */

struct cuda_rmsnorm_args {
    float *out;      /* (rows, dim) device; may equal in or resid */
    const float *in; /* (rows, dim) device */
    float *resid;    /* NULL, or (rows, dim) device: first resid += in, then the norm is taken
                      * of the updated resid (the fused "x += f(x); h = norm(x)") */
    const float *w;  /* (dim) device F32 scale, or NULL for none */
    int rows, dim;   /* rows >= 0, dim >= 1 */
    float eps;
    void *stream;
    int8_t *q8_codes; /* NULL, or with dim a multiple of 32: out's 8-bit copy as cuda_matmul's
                       * MMV path makes it (codes (rows, dim) here, one (d, d * sum) float pair
                       * per 32 elements at q8_scales), so that a matmul of out can take x_ready
                       * (cuda_matmul_q8_layout gives the two places in its scratch) */
    void *q8_scales;
};

/* out = x / sqrt(mean(x^2) + eps) * w with x = in (or resid after resid += in), as ops_rmsnorm:
 * (x * inv) * w, the sum of squares in double. */
int cuda_rmsnorm(const struct cuda_rmsnorm_args *a);

/* ---- RoPE ---------------------------------------------------------------------------------- */

struct cuda_rope_args {
    float *x;                     /* (n_tok, n_heads*head_dim) device, rotated in place */
    int n_tok, n_heads, head_dim; /* head_dim even */
    int pos0;               /* position of token 0 (token t at pos0 + t) when pos_dev is NULL */
    const int32_t *pos_dev; /* NULL, or (n_tok) device: position of each token (graph replay) */
    float base;             /* rope.freq_base */
    void *stream;
    const double *freq;     /* NULL, or (head_dim/2) host: pair i's angle per position instead
                             * of base^(-2i/head_dim) (YaRN, ops_rope_yarn_freq), head_dim/2 <=
                             * CUDA_ROPE_MAX_FREQ; copied into the launch */
    float mscale;           /* with freq: cos and sin scaled by it */
};
#define CUDA_ROPE_MAX_FREQ 128

/* NEOX RoPE as ops_rope_neox (with freq: as ops_rope_neox_freq): the pair (x[i],
 * x[i + head_dim/2]) of every head rotates by pos * base^(-2i/head_dim) (or pos * freq[i]);
 * the angle, cos and sin in double, rounded to float (then scaled by mscale). */
int cuda_rope_neox(const struct cuda_rope_args *a);

/* ---- KV cache store ------------------------------------------------------------------------ */

struct cuda_kv_store_args {
    float *cache;     /* (n_ctx, width) device */
    const float *src; /* (n_tok, width) device */
    int n_tok, width, n_ctx;
    int pos0;               /* row of token 0 (token t to row pos0 + t) when pos_dev is NULL */
    const int32_t *pos_dev; /* NULL, or (n_tok) device: cache row of each token; a row outside
                             * [0, n_ctx) is skipped */
    float *const *caches_dev; /* NULL, or (n_tok) device array of device pointers: token t's own
                               * cache (lockstep rows; cache is then ignored, pos_dev needed,
                               * n_ctx bounds every one of them) */
    void *stream;
};

/* cache row pos(t) = src row t. With pos_dev NULL, pos0 + n_tok <= n_ctx is checked. */
int cuda_kv_store(const struct cuda_kv_store_args *a);

/* ---- attention prologue: q/k norms, RoPE and the KV store in one launch ------------------- */

#define CUDA_QKR_MAX_HEAD_DIM 256

struct cuda_qk_rope_store_args {
    float *q;       /* (n_tok, n_head * head_dim) device: normed and rotated in place */
    float *k;       /* (n_tok, n_head_kv * head_dim) device: normed and rotated in place */
    const float *v; /* (n_tok, n_head_kv * head_dim) device */
    const float *q_norm, *k_norm; /* (head_dim) device F32 per-head RMSNorm scales, or NULL:
                                   * that tensor is rotated without a norm */
    float eps;
    int n_tok, n_head, n_head_kv, head_dim; /* head_dim even, <= CUDA_QKR_MAX_HEAD_DIM */
    int pos0;                               /* position of token 0 when pos_dev is NULL */
    const int32_t *pos_dev;   /* NULL, or (n_tok) device positions (graph replay, lockstep) */
    float base;               /* rope.freq_base */
    float *k_cache, *v_cache; /* (n_ctx, n_head_kv * head_dim) device: row pos(t) = k, v of t */
    float *const *caches_dev; /* NULL, or (2 * n_tok) device: token t's own k cache at [t] and
                               * v cache at [n_tok + t] (lockstep rows; pos_dev needed) */
    int n_ctx;                /* rows of the caches; a row outside [0, n_ctx) is skipped */
    void *stream;
    const double *freq; /* NULL, or (head_dim/2) host: YaRN's angles per position and pair, as
                         * cuda_rope_args.freq (copied into the launch) */
    float mscale;       /* with freq: cos and sin scaled by it */
};

/* Bit for bit what cuda_rmsnorm over the heads of q and of k (rows of head_dim, the scales
 * q_norm and k_norm), cuda_rope_neox of both (with freq and mscale where given) and
 * cuda_kv_store of k and v give, in one launch of a block per (token, head). With pos_dev NULL,
 * pos0 + n_tok <= n_ctx is checked. */
int cuda_qk_rope_store(const struct cuda_qk_rope_store_args *a);

/* ---- elementwise, argmax, router ----------------------------------------------------------- */

/* x (n) += y (n), device. */
int cuda_add(float *x, const float *y, size_t n, void *stream);

/* x (rows, dim) += bias (dim) on every row, device. */
int cuda_add_bias(float *x, const float *bias, int rows, int dim, void *stream);

/* out[r] = index of the largest of x[r*n .. r*n + n) (rows of n floats, device), ties to the
 * lowest index, as sampler_argmax (inputs without NaN). out (rows) int32 device. */
int cuda_argmax(const float *x, int rows, int n, int32_t *out, void *stream);

/* cuda_argmax of one row of n floats, over several blocks (a long row of logits: one block
 * reads it at one SM's bandwidth): the same index. scratch: CUDA_ARGMAX_SCRATCH bytes of device
 * memory, 16-byte aligned, zeroed before its first call (each call leaves it so). */
#define CUDA_ARGMAX_SCRATCH 2048
int cuda_argmax_wide(const float *x, int n, int32_t *out, void *scratch, void *stream);

struct cuda_topk_args {
    const float *logits;    /* (n_tok, n_expert) device router logits, finite */
    int n_tok, n_expert, k; /* n_expert <= CUDA_TOPK_MAX_EXPERT, 1 <= k <= min(n_expert, 32) */
    int32_t *ids;           /* (n_tok, k) device: selected experts, largest logit first, ties to
                             * the lower id */
    float *w;               /* (n_tok, k) device: their softmax probabilities renormalised to 1 */
    void *stream;
};

/* The router of moe_route_softmax_topk on the device: the same ids, weights within float
 * rounding (the softmax denominator is summed in another order). */
int cuda_softmax_topk(const struct cuda_topk_args *a);

#ifdef __cplusplus
}
#endif

#endif
