/* expert_ffn: one expert's SwiGLU feed-forward on the CPU for a list of tokens, OpenMP.
 *
 * For each listed token t (row tokens[i] of x and out, router weight wt_i):
 *     g = gate x_t + gate_b, u = up x_t + up_b    (n_ff; the biases where given)
 *     h = act(g, u)                               (silu(g) u, or swigluoai below)
 *     out_t += wt_i * (down h + down_b)           (n_embd)
 * The result is ACCUMULATED into out, so a caller combining several experts zeroes out (or
 * starts from the residual) once and calls this per expert. Tokens are processed in batches of
 * up to MATMUL_MAX_BATCH through matmul's pieces, all inside one parallel region; every output
 * element is computed by one thread in a fixed order, so results do not depend on the thread
 * count.
 */
#ifndef STRATA_EXPERT_FFN_H
#define STRATA_EXPERT_FFN_H

#include <stddef.h>
#include <stdint.h>

/* The gated activation h = act(g, u). */
enum expert_act {
    EXPERT_ACT_SILU = 0,       /* silu(g) * u */
    EXPERT_ACT_SWIGLU_OAI = 1, /* gpt-oss: g' = min(g, L), u' = clamp(u, -L, L),
                                * h = g' sigmoid(A g') (u' + 1); A, L below */
};
#define EXPERT_OAI_ALPHA 1.702f
#define EXPERT_OAI_LIMIT 7.0f

/* One expert's weights, each a contiguous row-major matrix of its quant type. */
struct expert_ffn_weights {
    uint32_t gate_type, up_type, down_type; /* ggml type ids, vec_dot_supported() */
    const void *gate;                       /* (n_ff rows, n_embd) gate_type, host memory */
    const void *up;                         /* (n_ff rows, n_embd) up_type, host memory */
    const void *down;                       /* (n_embd rows, n_ff) down_type, host memory */
    int64_t n_embd;                         /* model width; a block multiple of gate/up */
    int64_t n_ff;                           /* expert hidden width; a block multiple of down */
    const float *gate_b, *up_b;             /* (n_ff) biases, or NULL */
    const float *down_b;                    /* (n_embd) bias, or NULL */
    enum expert_act act;
};

struct expert_ffn_args {
    const struct expert_ffn_weights *w;
    int n_tokens;               /* listed tokens, >= 0 */
    const int32_t *tokens;      /* (n_tokens) row indices into x and out; NULL: 0..n_tokens-1 */
    const float *token_weights; /* (n_tokens) router weight per listed token; NULL: all 1 */
    const float *x;             /* (rows, x_stride) input hidden states, n_embd used per row */
    int64_t x_stride;           /* floats between rows of x, >= n_embd */
    float *out;                 /* (rows, out_stride) accumulated into, n_embd per row;
                                 * must not overlap x */
    int64_t out_stride;         /* floats between rows of out, >= n_embd */
    void *scratch;              /* expert_ffn_scratch_bytes(w) bytes, caller-owned */
    size_t scratch_bytes;       /* size of scratch */
    int n_threads;              /* threads to use; 0: OpenMP's default */
};

/* Scratch bytes expert_ffn_run needs for these weights (any number of tokens); 0 if a weight
 * type is unsupported or a shape is not a block multiple. */
size_t expert_ffn_scratch_bytes(const struct expert_ffn_weights *w);

/* Runs the expert for the listed tokens. Returns 0, or -EINVAL for unsupported types, shapes
 * that are not block multiples, strides too small, NULL pointers or too little scratch. */
int expert_ffn_run(const struct expert_ffn_args *a);

#endif

/* ---- a group of experts (one MoE layer) in one parallel region ---------------------------
 *
 * The experts of one layer, each with its own list of (token, router weight) pairs, as the
 * MoE plan groups them: pairs [offset[i], offset[i+1]) belong to expert i. All experts share
 * the types and shapes of w[0]. Four phases separated by barriers, each split over all threads
 * at once rather than expert by expert: convert x for every pair; gate/up rows of all experts;
 * convert h; down rows of n_embd for all experts, accumulated into out in expert order, then
 * pair order. Groups of at most 256 pairs (decode, lockstep steps, short prompts) instead read
 * each expert's down matrix in long runs into per-pair buffers (16-row slices of every expert
 * in turn read slower), each expert's as soon as its h is ready (expert_ffn_set_flow), and a
 * fifth phase adds the buffers up in that same order. Every output element sees the same
 * operations in the same order as calling expert_ffn_run per expert in that order, so the
 * result is bit-identical to it and does not depend on the thread count.
 */
struct expert_ffn_group_args {
    int n_experts;
    const struct expert_ffn_weights *w; /* (n_experts) same types and shapes */
    const int32_t *offset;              /* (n_experts + 1) pair ranges, ascending */
    const int32_t *tokens;              /* (offset[n_experts]) rows of x and out */
    const float *token_weights;         /* (offset[n_experts]) router weights */
    const float *x;                     /* (rows, x_stride) */
    int64_t x_stride;
    float *out;                         /* (rows, out_stride) accumulated into */
    int64_t out_stride;
    void *scratch;                      /* expert_ffn_group_scratch_bytes() bytes */
    size_t scratch_bytes;
    int n_threads;                      /* 0: OpenMP's default */
};

/* Scratch bytes for n_pairs (token, expert) pairs of experts shaped like w; 0 if unsupported. */
size_t expert_ffn_group_scratch_bytes(const struct expert_ffn_weights *w, int n_pairs);

/* Runs the group. 0, or -EINVAL (types/shapes differ between experts, bad arguments). */
int expert_ffn_group_run(const struct expert_ffn_group_args *a);

/* Groups of at most 256 pairs run as a flow by default: an expert's down rows start as soon as
 * its own gate/up rows are done and its pairs' h converted, with no barrier between the
 * phases; the same operations on the same values, so the same bits. 0 puts the barrier back
 * (as STRATA_MOE_FLOW=0 in the environment does), for comparisons and tests. */
void expert_ffn_set_flow(int on);
