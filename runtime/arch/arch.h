/* arch: the trunk forward of one architecture, written against the backend op table
 * (runtime/backend.h); its loader is in core/ (model_arch.h). */
#ifndef STRATA_ARCH_H
#define STRATA_ARCH_H

#include <stdbool.h>
#include <stdint.h>

struct model;
struct backend;
struct stream;
struct stream_batch;

struct arch {
    const char *name; /* general.architecture */
    /* Runs n_tok tokens of one stream from its current position, appends to its KV cache and
     * leaves the last position's logits (n_vocab floats) in s->logits (backend memory). */
    int (*forward)(struct backend *b, struct stream *s, const int32_t *ids, int n_tok);
    /* n rows in one pass: row i is token ids[i] of stream ss[i] at position bt->row_pos[i]
     * (a stream may have several rows, at consecutive positions in row order); leaves every
     * row's logits in bt->logits (n, n_vocab). The caller advances the positions. NULL: the
     * architecture has no lockstep forward. */
    int (*forward_batch)(struct backend *b, struct stream_batch *bt, struct stream *const *ss,
                         const int32_t *ids, int n);
    /* The model's MTP block (runtime/mtp.h) on n <= s->mtp->max_rows rows of stream s: row i
     * joins h[i] (n_embd, the main model's output-normed hidden state at position pos0 + i,
     * backend memory) with token ids[i] (the one at pos0 + i + 1), writes the block's KV cache
     * at pos0 + i and leaves its output after the head norm in s->mtp->out. NULL: the
     * architecture has no MTP block. */
    int (*mtp_forward)(struct backend *b, struct stream *s, const float *h, const int32_t *ids,
                       int n, int pos0);
};

struct model_hparams;
struct weight;
struct layer_weights;

/* x (n, n_embd) += y; xn = rmsnorm(x) * w: one op where the backend has it, else add then
 * rmsnorm. */
int arch_add_norm(struct backend *b, const struct model_hparams *hp, float *x, const float *y,
                  float *xn, const struct weight *w, int n);

/* q, k, v (n rows) = xn x Wq^T, Wk^T, Wv^T of layer lw: one op where the backend has it, else
 * three matmuls. */
int arch_matmul_qkv(struct backend *b, float *q, float *k, float *v, const struct layer_weights *lw,
                    const float *xn, int n);

/* The attention prologue's arguments (struct backend_ops.qk_rope_store) for n rows of q, k, v
 * at position pos into the caches kc, vc: plain rope at hp's base, no norms (the caller sets
 * q_norm, k_norm, eps or yarn where the architecture has them). */
struct qk_rope_args arch_qk_rope_args(const struct model_hparams *hp, float *q, float *k,
                                      const float *v, int pos, int n, float *kc, float *vc);

/* The forward of the architecture named NAME, or NULL. */
const struct arch *arch_find(const char *name);

extern const struct arch arch_qwen3moe;
extern const struct arch arch_gptoss;
extern const struct arch arch_qwen3next;
extern const struct arch arch_qwen35moe;

#endif
