/* mtp: a stream's multi-token-prediction state, for speculative decoding with the model's own
 * MTP block (qwen3next, qwen35moe: struct model.mtp; the block's forward is the arch's
 * mtp_forward).
 *
 * The block's row for position t joins h_t, the main model's hidden state at t after the output
 * norm, with the token at t + 1, at rope position t, and predicts the token at t + 2. Its
 * attention has a KV cache of its own, which must hold a row for every position the stream
 * holds: after each forward of the stream (prefill chunks, decode steps, verify passes, the
 * re-evaluations of a rewind) mtp_follow runs the block on the rows that forward completed,
 * from the main model's final residuals, and keeps the last position's hidden state (its next
 * token is not known yet). A rewind (mtp_truncate) forgets the rows past it.
 *
 * Drafting (mtp_draft) after token x_p was sampled (the stream holds p positions): the row
 * (h_{p-1}, x_p) at p - 1 gives draft 1 and stays in the cache (x_p is final); draft j + 1 comes
 * from the row (the block's own output at the previous row, draft j) at p - 1 + j, written to
 * the cache beyond what it holds (the next forward writes over it). Drafts are greedy.
 */
#ifndef STRATA_MTP_H
#define STRATA_MTP_H

#include <stdint.h>

#include "stream.h"

#define MTP_MAX_ROWS 32 /* rows per block forward; longer runs go in pieces */

struct stream_mtp {
    int pos;        /* the block's KV cache holds rows for positions [0, pos) */
    int h_pos;      /* the position whose hidden state h_last holds; -1: none */
    int h_ckpt_pos; /* the position h_ckpt holds; -1: none */
    int max_rows;
    float *k_cache, *v_cache; /* (n_ctx, n_head_kv*head_dim) the block's attention, backend
                               * memory */
    /* scratch, backend memory, views into arena */
    float *arena;
    float *h;             /* (max_rows, n_embd) the rows' hidden states (output-normed) */
    float *h_last;        /* (n_embd) */
    float *h_ckpt;        /* (n_embd) h_last when the stream took its checkpoint */
    float *e;             /* (max_rows, n_embd) the rows' token embeddings */
    float *cat;           /* (max_rows, 2 n_embd) per row [enorm(e) | hnorm(h)], eh_proj's input */
    float *x, *xn, *proj; /* (max_rows, n_embd) the block's residual stream and its scratch */
    float *q, *att;       /* (max_rows, n_head*head_dim) */
    float *k, *v;         /* (max_rows, n_head_kv*head_dim) */
    float *out;           /* (max_rows, n_embd) the block's output after its head norm */
    float *logits;        /* (n_vocab) of the last row */
    struct stream_hybrid hy; /* qg and gate only (the gated attention's), views into arena */
    float *logits_host;      /* (n_vocab) host, for backends without read_argmax */
    long long n_rows;        /* rows the block has run (following and drafting) */
};

/* Gives stream s an MTP state (its forwards feed it from then on); the positions s already
 * holds are evaluated again so that the block's cache covers them. 0, or -ENOTSUP ("this model
 * has no MTP block" / "the MTP block was not loaded (--no-mtp)"), -ENOMEM. */
int mtp_open(struct stream *s);
void mtp_close(struct stream *s);

/* After a forward of stream s over ids[0..n) at positions [pos0, pos0 + n), whose final
 * residuals (before the output norm) are x (n, n_embd, backend memory): the block's rows for
 * the positions that forward completed. 0 or -errno. */
int mtp_follow(struct stream *s, const float *x, const int32_t *ids, int n, int pos0);

/* The stream keeps positions [0, pos): the block's rows from pos - 1 on are forgotten (row
 * pos - 1 needs the token at pos, which is gone). */
void mtp_truncate(struct stream *s, int pos);

/* The stream takes (restores) the checkpoint of its recurrent state: the last hidden state
 * goes with it, so that a rewind to the checkpoint's position finds it. 0 or -errno. */
int mtp_checkpoint(struct stream *s);
int mtp_restore(struct stream *s);

/* Up to k greedy drafts after token id (sampled, not yet evaluated: it goes at position
 * s->pos) into out; their number (0 when the hidden state of position s->pos - 1 is not
 * there: an empty stream). -errno when the block's forward fails. */
int mtp_draft(struct stream *s, int32_t id, int k, int32_t *out);

#endif
