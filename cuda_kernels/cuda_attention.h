/* cuda_attention: causal GQA attention of the CUDA backend on float32 activations and KV
 * caches in device memory: split-K flash-decoding for few query rows, a float tiled kernel, and
 * an fp16 tensor-core kernel for prefill.
 *
 * The launch rules of cuda_ops.h hold: the launcher only enqueues work on `stream` (no
 * allocation, synchronisation or device read by the host, so it can be captured in a CUDA
 * graph), positions can come from device memory (pos_dev) for graph replay, it returns 0,
 * -EINVAL for bad shapes or alignment (nothing is launched) or -EIO when the launch fails, and
 * results are deterministic (no float atomics, every sum in a fixed order).
 * Without a CUDA build (cuda_attention_stub.c) cuda_attention returns -ENODEV and
 * cuda_attention_scratch_bytes 0.
 * Design and tolerances: docs/cuda-ops.md.
 */
#ifndef STRATA_CUDA_ATTENTION_H
#define STRATA_CUDA_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Largest head_dim cuda_attention supports. */
#define CUDA_ATTN_MAX_HEAD_DIM 256
/* Bytes of counters at the start of the scratch (one per kv head and lockstep row). */
#define CUDA_ATTN_COUNT_BYTES 4096

struct cuda_attn_args {
    float *out;             /* (n_tok, n_head*head_dim) device */
    const float *q;         /* (n_tok, n_head*head_dim) device, normed and rotated; may equal
                             * out (each block reads its query rows before any is written) */
    const float *k_cache;   /* (n_ctx, n_head_kv*head_dim) device; rows 0..pos(t) valid */
    const float *v_cache;   /* (n_ctx, n_head_kv*head_dim) device */
    int pos0;               /* position of query token 0 when pos_dev is NULL (token t at pos0+t) */
    const int32_t *pos_dev; /* NULL, or (n_tok) device: position of each query token; query t
                             * attends to keys 0..pos(t) (clamped to n_ctx - 1) */
    const float *const *k_rows; /* NULL, or (n_tok) device array of device pointers: query t's
                                 * own K cache (lockstep rows, each token of another stream;
                                 * k_cache and v_cache are then ignored); needs pos_dev, and
                                 * n_ctx above every position */
    const float *const *v_rows; /* with k_rows: query t's own V cache */
    int n_tok, n_ctx;       /* n_ctx: rows of the caches; bounds every key index */
    int n_head, n_head_kv, head_dim; /* n_head a multiple of n_head_kv; head_dim even, <= 256 */
    float scale;                     /* usually 1/sqrt(head_dim) */
    const float *sinks; /* NULL, or (n_head) device: a logit per head joining the softmax's
                         * denominator with no value (gpt-oss) */
    int window;         /* > 0: query t sees keys pos(t) - window + 1 .. pos(t) only */
    void *scratch;      /* cuda_attention_scratch_bytes(n_head, head_dim) bytes, device, zeroed
                         * once before its first call (it starts with counters that every call
                         * leaves at zero); one call in flight per scratch */
    size_t scratch_bytes;
    int combine_apart; /* 1: the decode kernel's key splits are merged by a kernel of its own
                        * (the same bits) instead of by each kv head's last block */
    int8_t *q8_codes;  /* NULL, or (used with head_dim a multiple of 32) where the decode kernel's
                        * merge also writes out's 8-bit copy as cuda_matmul's MMV path makes it
                        * (rows n_tok of n_head * head_dim; cuda_matmul_q8_layout) */
    void *q8_scales;
    int *q8_done; /* NULL, or host: set to 1 when the call wrote the 8-bit copy (the
                   * decode kernel ran), else 0 */
    void *stream;
};

/* Scratch for the split-K partial results of any call with these heads (any n_tok, context). */
size_t cuda_attention_scratch_bytes(int n_head, int head_dim);
/* Scratch for a call with k_rows of n_tok rows (any context). */
size_t cuda_attention_rows_scratch_bytes(int n_tok, int n_head, int head_dim);
/* Whether a call with k_rows runs for these heads (else it answers -ENOTSUP). */
int cuda_attention_rows_ok(int n_head, int n_head_kv, int head_dim);

/* Prefill calls (beyond the rows cuda_attention takes row by row, below) run on fp16 tensor
 * cores: n_tok >= CUDA_ATTN_TC_MIN_TOK, n_tok * (n_head /
 * n_head_kv) >= CUDA_ATTN_TC_MIN_ROWS, head_dim a multiple of 16, k_cache/v_cache 16-byte and
 * q/out 8-byte aligned. Q, K, V and the softmax weights are rounded to fp16 there (values beyond
 * +-65504 clamped; products and sums in float): a score s moves by about 3e-4 |s|, and the
 * tested bound is max abs error <= 5e-3 * max |ref| for scores of std <= 3 (docs/cuda-ops.md).
 * Every other call, decode included, stays in float throughout. */
#define CUDA_ATTN_TC_MIN_TOK 3
#define CUDA_ATTN_TC_MIN_ROWS 64

/* Calls of 2 .. CUDA_ATTN_EXACT_MAX_TOK query rows (a speculative verify pass, a short prompt)
 * compute each row as a call of that row alone would, bit for bit, where the decode kernel takes
 * the heads (as for k_rows below): a position's output then does not depend on how many rows
 * its pass holds, so verifying drafts gives plain decoding's logits. */
#define CUDA_ATTN_EXACT_MAX_TOK 16

/* Causal GQA attention as ops_attention: query t of head h attends to keys 0..pos(t) of kv head
 * h / (n_head / n_head_kv) with softmax(scale * q.k) weights, online softmax in float. Few
 * query rows (decode) split the keys over several blocks, and the last of them to finish for a
 * kv head merges the partial softmaxes (split-K flash-decoding; the other kernels merge in a
 * second one); the split is planned from n_ctx when pos_dev is set, so one captured graph serves
 * every position. Up to CUDA_ATTN_EXACT_MAX_TOK rows take that
 * kernel row by row (above); more rows (prefill) take the tensor-core path above. With k_rows,
 * every query row is one token of its own stream: one launch of the decode kernel for all of them
 * (the keys of each split as that row alone would split them, so the result is that of one call per
 * row, bit for bit); -ENOTSUP (nothing launched) where the decode kernel does not apply (head_dim
 * not 64, 128 or 256, n_head / n_head_kv not a power of two up to 16, or more than 64 / (head_dim /
 * 32) of them). */
/* Sinks and a window run on the same kernels: a call's keys start at the first key any of its
 * rows' windows holds (decode splits only those; a prefill block walks only its rows' windows),
 * and each row's sink joins the sum where the splits merge. k_rows with either is refused
 * (-ENOTSUP). */
int cuda_attention(const struct cuda_attn_args *a);

#ifdef __cplusplus
}
#endif

#endif
