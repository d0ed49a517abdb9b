/* cuda_moe: the expert part of one MoE layer on the device, for n_tok tokens already routed
 * (cuda_softmax_topk in cuda_ops.h, on the same stream: no host round trip).
 *
 * For each token t and each of its k selected experts e_j with router weight w_j:
 *     h_j   = silu(gate_e x_t) * (up_e x_t)          (n_ff)
 *     out_t = sum_j w_j * (down_e h_j)                (n_embd), j = 0..k-1 in order
 * Weights stay quantized and every path is deterministic (same inputs, same bits); the paths
 * differ in how they multiply (errors in docs/cuda-ops.md):
 *   direct  (few tokens: decode): one block per (pair, rows of gate/up) writes h; one per
 *           (token, down rows) sums its k experts. When gate/up and down are both Q4_K, Q6_K or
 *           MXFP4 the weights are dotted with 8-bit activation codes (x and h, one scale per 32
 *           elements, integer dot products, as the CPU backend does); otherwise the direct path
 *           performs the grouped path's float operations.
 *   bulk8   (one-token calls, compute capability 9.0): the 8-bit direct arithmetic on rows
 *           brought into shared memory by bulk copies, the down rows' copies issued before
 *           gate/up ends; outputs equal the 8-bit direct path's bit for bit.
 *   grouped8 (Q4_K/Q6_K/MXFP4 experts, lockstep steps of several tokens): the grouped path's sort,
 *           then each selected expert's 8-bit units loaded once for every pair that chose it.
 *           Its h equals the direct path's bit for bit; down results go per pair to scratch
 *           and are summed in order j, so outputs differ from the direct path's by the order
 *           of those float sums only.
 *   grouped (many tokens): a one-block counting sort groups the (token, j) pairs by expert
 *           (stable: pairs keep their order), tiles of up to 16 pairs of one expert share every
 *           decoded weight (float activations, weights decoded exactly as quant_ref does, float
 *           FMAs in a fixed order), down results go per pair to scratch and a last kernel sums
 *           each token's k pairs in order j. The direct path, where it is not 8-bit, agrees
 *           with it bit for bit.
 *   mma     (prefill, CUDA_MOE_MMA_MIN_TOK tokens and more, not for F32 weights): the grouped
 *           path's sort, then tiles of up to 64 pairs of one expert against 64 gate + 64 up
 *           (or 128 down) rows on tensor cores: activations and decoded weights rounded to
 *           bf16, products summed in float.
 *   mma8    (prefill on Q4_K/Q6_K experts, n_embd and n_ff multiples of 256: what the automatic
 *           choice takes where it would take mma): the same tiles on the 8-bit direct path's
 *           codes (x quantized once per token, h per 32 rows), integer MMAs per 32-element
 *           unit scaled in float as the direct path scales them; outputs differ from the
 *           direct path's by the order of the unit sums (and h codes that round the other way
 *           from it). STRATA_MOE_M8=0 in the environment keeps the automatic choice on mma.
 * Launch rules as cuda_ops.h: enqueue only (no allocation, no sync, no host reads), capturable
 * in a CUDA graph; 0, -EINVAL (nothing launched) or -EIO. Without CUDA: -ENODEV.
 * Design and tolerances: docs/cuda-ops.md.
 */
#ifndef STRATA_CUDA_MOE_H
#define STRATA_CUDA_MOE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum cuda_moe_path {
    CUDA_MOE_PATH_AUTO = 0,     /* direct up to CUDA_MOE_DIRECT_MAX_TOK tokens, then mma from
                                 * CUDA_MOE_MMA_MIN_TOK (not F32), else grouped; Q4_K/Q6_K/
                                 * MXFP4: bulk8 (CUDA_MOE_BULK8_MAX_TOK), direct, grouped8, mma
                                 * (CUDA_MOE_GROUPED8_MIN/MAX_TOK) */
    CUDA_MOE_PATH_DIRECT = 1,   /* one pass per (token, expert) pair */
    CUDA_MOE_PATH_GROUPED = 2,  /* pairs grouped by expert on the device */
    CUDA_MOE_PATH_MMA = 3,      /* grouped, on tensor cores (bf16 products, float sums) */
    CUDA_MOE_PATH_GROUPED8 = 4, /* grouped on 8-bit codes (Q4_K/Q6_K/MXFP4 experts; others take
                                 * the grouped path) */
    CUDA_MOE_PATH_BULK8 = 5,    /* the direct 8-bit arithmetic on weights brought into shared
                                 * memory by bulk copies (compute capability 9.0; else direct) */
    CUDA_MOE_PATH_MMA8 = 6,     /* tensor cores on 8-bit codes (Q4_K/Q6_K experts with n_embd
                                 * and n_ff multiples of 256; others take the mma path) */
};

#define CUDA_MOE_DIRECT_MAX_TOK 4
/* For Q4_K/Q6_K/MXFP4 experts the automatic choice is the 8-bit direct path below
 * CUDA_MOE_GROUPED8_MIN_TOK tokens (decode, lockstep steps), the grouped 8-bit path from there up
 * to CUDA_MOE_GROUPED8_MAX_TOK (short prompts, prompt chunks), then the tensor cores. 30b-a3b's
 * layer on an H200 (us per call; test_cuda_moe prints the table):
 *   tokens       1    8   24   32   48   64  128  512
 *   direct      24  117  316  415  611  806 1590 6273
 *   grouped8    34  146  298  338  378  434  712 2493
 *   mma        104  448  815  873  914  947  974 1127
 *   mma8        73  235  432  474  471  502  513  687 */
#define CUDA_MOE_GROUPED8_MIN_TOK 32
/* ... and the bulk 8-bit path (compute capability 9.0) up to this many tokens (the
 * environment's STRATA_MOE_BULK, a number, replaces it) */
#define CUDA_MOE_BULK8_MAX_TOK 1
#define CUDA_MOE_GROUPED8_MAX_TOK 64
#define CUDA_MOE_MMA_MIN_TOK 32 /* the automatic choice takes the tensor cores from this many
                                 * tokens, for every weight type but F32 (kept exact) */

struct cuda_moe_args {
    float *out;         /* (n_tok rows of out_stride floats) device: n_embd written per row */
    int64_t out_stride; /* >= n_embd */
    const float *in;    /* (n_tok rows of in_stride floats) device, 16-byte aligned: the
                         * ffn-normed hidden states; must not overlap out */
    int64_t in_stride;  /* >= n_embd, a multiple of 4 */
    /* Optional: in's 8-bit copy as cuda_matmul's MMV path keeps it (codes (n_tok rows of
     * n_embd), 16-byte aligned, and per 32 elements (d, d * sum of the codes) as float2), e.g.
     * written by the norm before; the 8-bit direct path reads it instead of quantizing in
     * again. Its codes equal the ones it would make for finite inputs. NULL: quantize. */
    const int8_t *in_q8;
    const void *in_q8_scales;
    int n_tok;          /* >= 0 */
    int k;              /* experts per token, 1..n_expert */
    int n_expert;
    int64_t n_embd;       /* a multiple of gate_type's block (8 for F32/F16/BF16) */
    int64_t n_ff;         /* a multiple of down_type's block */
    const int32_t *ids;   /* (n_tok, k) device: expert of each pair; an id outside
                           * [0, n_expert) makes that token's output NaN */
    const float *weights; /* (n_tok, k) device: router weight of each pair */
    uint32_t gate_type, up_type, down_type; /* cuda_type_supported(); gate_type == up_type */
    const void *gate; /* (n_expert, n_ff rows of n_embd) device (or mapped host) */
    const void *up;   /* (n_expert, n_ff rows of n_embd) */
    const void *down; /* (n_expert, n_embd rows of n_ff) */
    uint64_t gate_stride, up_stride, down_stride; /* bytes between experts; rows are packed */
    /* Optional slot tables: (n_expert) device arrays of per-expert base pointers (VRAM slots or
     * mapped host memory). When non-NULL, expert e's matrix is at ptrs[e] instead of
     * base + e * stride; the pointers must meet the same alignment as the bases. */
    const void *const *gate_ptrs;
    const void *const *up_ptrs;
    const void *const *down_ptrs;
    /* gpt-oss (NULL / 0 otherwise): per-expert biases, gate/up (n_expert, n_ff) and down
     * (n_expert, n_embd) F32 device, and the clamped SwiGLU: h = min(g, 7) sigmoid(1.702
     * min(g, 7)) (clamp(u, -7, 7) + 1) with g, u including their biases, out_t = sum_j w_j
     * (down_e h_j + b_e), on every path (the 8-bit ones apply them to the unit sums). */
    const float *gate_b, *up_b, *down_b;
    int act_oai;
    enum cuda_moe_path path;
    /* Optional: the router's logits (n_tok rows of n_expert floats, device, finite) of a call
     * whose experts are not yet selected. The call selects them as cuda_softmax_topk does (the
     * same ids and weights, bit for bit) into ids_out and weights_out ((n_tok, k) device) and
     * runs with those; ids and weights are then not read. A one-token call on the bulk path
     * selects inside its two kernels (no top-k launch between the router and the experts);
     * other calls launch cuda_softmax_topk first. */
    const float *logits;
    int32_t *ids_out;
    float *weights_out;
    void *scratch; /* cuda_moe_scratch_bytes() bytes of device memory, 16-byte aligned */
    size_t scratch_bytes;
    void *stream; /* cudaStream_t */
};

/* Scratch needed by a call with these shapes (n_tok, k, n_expert, n_embd, n_ff are read), on
 * any path, and by every call with fewer tokens. 0 for invalid shapes. */
size_t cuda_moe_scratch_bytes(const struct cuda_moe_args *a);

/* Runs the experts. The gate/up/down bases and strides must be aligned to 16 bytes for F32, F16
 * and BF16, 2 bytes for Q4_0, Q8_0 and the K-quants (any address for MXFP4). */
int cuda_moe_ffn(const struct cuda_moe_args *a);

#ifdef __cplusplus
}
#endif

#endif
