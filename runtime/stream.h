/* stream: one generating sequence: its KV cache, position and the activation scratch of the
 * forward, all in the backend's memory. */
#ifndef STRATA_STREAM_H
#define STRATA_STREAM_H

#include <stddef.h>
#include <stdint.h>

struct arch;
struct backend;
struct stream_mtp;

/* Called by stream_eval after each chunk of an evaluation longer than one chunk (prefill) with
 * the tokens done and the total; nonzero stops the evaluation. */
typedef int (*stream_progress_fn)(void *ctx, int done, int total);
struct model;

/* The scratch of hybrid Gated DeltaNet models' forwards, for `rows` tokens (backend memory,
 * one allocation): the gated attention's q | gate projection and its halves, and a recurrent
 * layer's qkv, z, beta/alpha logits and output. */
struct stream_hybrid {
    float *mem;
    float *qg;   /* (rows, 2 n_head*head_dim) */
    float *gate; /* (rows, n_head*head_dim) */
    float *qkv;  /* (rows, 2 n_k*d_state + n_v*d_state) */
    float *z;    /* (rows, n_v*d_state) */
    float *ba;   /* (rows, 2 n_v) */
    float *o;    /* (rows, n_v*d_state) */
};

struct stream {
    struct backend *b;
    const struct model *m;
    const struct arch *arch; /* the forward of m's architecture */
    int n_ctx;     /* KV cache capacity in tokens */
    int max_tok;   /* tokens per forward call (prefill chunk) */
    int pos;       /* tokens already in the KV cache */
    size_t kv_layer_floats; /* n_ctx * n_head_kv * head_dim */
    float *k_cache, *v_cache; /* (model_n_kv_layers, n_ctx, n_head_kv*head_dim), backend
                               * memory; layer l at model_kv_layer(l) */
    /* Gated DeltaNet models (NULL otherwise): each recurrent layer's state after pos tokens,
     * layer l at model_ssm_layer(l), backend memory; and the ids in the cache (host), which a
     * rewind re-evaluates since the state cannot be taken back */
    float *conv_state; /* (n_ssm_layers, model_conv_state_floats) */
    float *ssm_state;  /* (n_ssm_layers, model_ssm_state_floats) */
    int32_t *hist;     /* (n_ctx) */
    /* a copy of both states at position ckpt_pos (< 0: none), taken before a lockstep step
     * evaluates several rows of the stream (a speculative verify, a prompt chunk): a rewind to
     * a position at or after it restores the copy and re-evaluates only the ids between */
    float *ckpt;
    int ckpt_pos;
    /* scratch, backend memory, views into one allocation (arena) */
    float *arena;
    float *x;      /* (max_tok, n_embd) residual stream */
    float *xn;     /* (max_tok, n_embd) normed */
    float *q;      /* (max_tok, n_head*head_dim) */
    float *k, *v;  /* (max_tok, n_head_kv*head_dim) */
    float *att;    /* (max_tok, n_head*head_dim) */
    float *proj;   /* (max_tok, n_embd) attention output / moe output */
    float *logits; /* (n_vocab) of the last position */
    struct stream_hybrid *hy;    /* Gated DeltaNet models' extra scratch, else NULL */
    stream_progress_fn progress; /* NULL: none */
    void *progress_ctx;
    float *logits_host; /* (n_vocab) host copy for stream_eval_argmax on backends without
                         * read_argmax; allocated on first use, owned */
    struct stream_mtp *mtp; /* owned: the MTP block's state, which every forward feeds
                             * (runtime/mtp.h); NULL: none */
    /* the routing log (stream_set_route_log): a view the caller owns, NULL: none */
    int32_t *route_log;
    int route_log_pos0, route_log_cap;
    int32_t **route_rows; /* (max_tok) owned scratch: a forward's rows in the log */
};

/* The backend memory a stream needs, in bytes. */
struct stream_size {
    uint64_t kv_bytes;    /* the K and V caches: 2 * n_kv_layers * n_ctx * n_head_kv*head_dim
                           * floats, and Gated DeltaNet layers' recurrent state and its
                           * checkpoint */
    uint64_t arena_bytes; /* the activations: max_tok * (3 n_embd + 2 n_head*head_dim +
                           * 2 n_head_kv*head_dim) + n_vocab floats */
};

/* Fills *out for a stream of n_ctx tokens, max_tok per forward call, on model m. 0, -EINVAL
 * (n_ctx or max_tok not positive) or -EOVERFLOW (a product does not fit 64 bits); the message
 * says which. */
int stream_size_get(const struct model *m, int n_ctx, int max_tok, struct stream_size *out);

/* Floats per row of struct stream_hybrid (0 for models without Gated DeltaNet layers). */
struct model_hparams;
uint64_t stream_hybrid_floats(const struct model_hparams *hp);

/* Checks that a stream of *sz (n_ctx tokens) fits in host memory of which avail bytes are
 * available, keeping a margin: at most 90% of avail. 0, or -ENOMEM with the stream's sizes and
 * avail in the message. Allocates nothing. */
int stream_size_check_host(const struct stream_size *sz, int n_ctx, uint64_t avail);

/* Allocates a stream of n_ctx tokens on backend b; 0 or -errno. The caller checks the sizes
 * against the memory it has first (stream_size_check_host for host memory). */
int stream_open(struct backend *b, int n_ctx, int max_tok, struct stream **out);
void stream_close(struct stream *s);

/* Evaluates n ids from the current position (in chunks of max_tok), appends them to the KV
 * cache and copies the last position's logits (n_vocab floats) to logits_host if non-NULL.
 * -ENOSPC (message says so) when the cache would overflow; -EINTR when the progress callback
 * stopped it (the chunks done stay in the cache: s->pos counts them). */
int stream_eval(struct stream *s, const int32_t *ids, int n, float *logits_host);

/* stream_eval, then *next = the argmax of the last position's logits (ties to the lowest id,
 * as sampler_argmax), taken by the backend where the logits are when it can (the GPU: only the
 * id crosses). For greedy decoding without penalties. */
int stream_eval_argmax(struct stream *s, const int32_t *ids, int n, int32_t *next);

/* The routing log of stream s: from now on every forward that runs the stream's positions
 * p in [pos0, pos0 + cap) writes each layer's k choices for p to log + (p - pos0) * n_layer * k
 * (layer l at l * k), where the backend has them in host memory (moe_layer_set_log; elsewhere
 * the entries keep what the caller put there). log NULL ends it. The caller owns log and keeps
 * it alive until then. 0 or -ENOMEM. */
int stream_set_route_log(struct stream *s, int32_t *log, int pos0, int cap);
/* Stream s's routing log entry for position pos (n_layer * k ids), NULL outside the log. */
const int32_t *stream_route_log_at(const struct stream *s, int pos);

/* Forgets tokens from position pos on (pos <= s->pos). A model with recurrent state cannot
 * take it back: the stream restores its checkpoint when pos is at or after it (a lockstep step
 * of several rows of the stream takes one first) and re-evaluates the ids from there to pos,
 * else starts over and re-evaluates its first pos tokens (their ids are kept): a prefill of
 * pos tokens. 0 or -errno (the re-evaluation failed: the stream is then empty). */
int stream_truncate(struct stream *s, int pos);

/* Lockstep decode of several streams on one backend: the activations of up to max_n rows (one
 * per stream) and their logits, in the backend's memory. */
struct stream_batch {
    struct backend *b;
    const struct model *m;
    int max_n;             /* rows per step */
    int max_streams;       /* distinct streams per step */
    struct stream **row_st; /* (max_n) the stream of each row of the step being run */
    int *row_pos;          /* (max_n) its position */
    float *arena;
    float *x, *xn, *proj;  /* (max_n, n_embd) */
    float *q, *att;        /* (max_n, n_head*head_dim) */
    float *k, *v;          /* (max_n, n_head_kv*head_dim) */
    float *logits;         /* (max_n, n_vocab) */
    struct stream_hybrid *hy; /* Gated DeltaNet models' extra scratch, else NULL */
    int32_t **route_rows;     /* (max_n) the rows' entries in their streams' routing logs */
};

/* A batch of up to max_streams streams and max_rows rows (tokens) per step. */
int stream_batch_open(struct backend *b, int max_streams, int max_rows,
                      struct stream_batch **out);
void stream_batch_close(struct stream_batch *bt);

/* One step: stream ss[i] (i < n <= max_streams, distinct streams of bt's backend) evaluates
 * n_tok[i] >= 1 tokens (NULL: one each) from its position on, their ids consecutive in ids
 * (stream 0's first), every token one row of one forward (at most max_rows); logits_host (n,
 * n_vocab) receives each stream's logits after its last token. A stream's rows attend to its
 * earlier rows of the step as a prompt's tokens do. -ENOSPC when a stream would overflow its
 * cache (nothing is evaluated). 0 or -errno. */
int stream_batch_eval(struct stream_batch *bt, struct stream *const *ss, const int *n_tok, int n,
                      const int32_t *ids, float *logits_host);

/* stream_batch_eval, but logits_host (sum of n_tok, n_vocab) receives every row's logits, in
 * row order (the verify rows of speculative decoding in a lockstep step). */
int stream_batch_eval_rows(struct stream_batch *bt, struct stream *const *ss, const int *n_tok,
                           int n, const int32_t *ids, float *logits_host);

/* One stream evaluates ids[0..n) (n <= max_rows) in one forward of the batch, every token one
 * row attending to the earlier ones, and logits_host (n, n_vocab) receives every row's logits:
 * the verify pass of speculative decoding. The stream's position advances by n
 * (stream_truncate takes back what is rejected). 0 or -errno (-ENOSPC: nothing evaluated). */
int stream_batch_eval_all(struct stream_batch *bt, struct stream *s, const int32_t *ids, int n,
                          float *logits_host);

#endif
