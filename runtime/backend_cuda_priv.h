/* backend_cuda_priv: the CUDA backend's state and the functions its two files share
 * (backend_cuda.c: the op table, graphs, open/close; backend_cuda_offload.c: the expert cache,
 * static placement and the hybrid CPU lane). Not for use outside runtime/backend_cuda*.c. */
#ifndef STRATA_BACKEND_CUDA_PRIV_H
#define STRATA_BACKEND_CUDA_PRIV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "moe.h"

#define CUDA_BACKEND_MAX_TOK 512 /* tokens per launch of the batched ops; larger calls split */

struct backend_cuda {
    struct backend base;
    struct model *model;      /* the model whose weights carry our dev pointers */
    void *stream;             /* cudaStream_t */
    int32_t *ids_dev;         /* (MAX_TOK) token ids for embed */
    void *mm_scratch;         /* cuda_matmul scratch for any weight at MAX_TOK rows */
    size_t mm_scratch_bytes;
    /* the activations mm_scratch holds in 8 bits (q, k and v share theirs): NULL after any
     * op other than a matmul, which may have written them (backend_cuda_forget_xq) */
    double cpu_lane_s;        /* wall seconds in the CPU lane's expert runs (moe_cpu_run) */
    const float *xq_src;
    int xq_m;
    int64_t xq_n_in;
    void *attn_scratch;
    size_t attn_scratch_bytes;
    float *router_logits;     /* (MAX_TOK, n_expert) */
    int32_t *route_ids;       /* (MAX_TOK, k) */
    float *route_w;           /* (MAX_TOK, k) */
    void *moe_scratch;
    size_t moe_scratch_bytes;
    size_t weight_bytes;      /* uploaded weights */
    size_t alloc_bytes;       /* everything else cuda_alloc handed out */
    int rc;                   /* first error of the weight upload */
    bool offload;             /* experts stay in host memory, served by cache */
    struct expert_cache *cache;
    enum backend_residency residency;
    bool prefetch;
    int32_t *pred_ids;        /* (MAX_TOK, k) predicted experts of the next layer */
    float *pred_w;
    uint64_t budget;          /* 0 = no cap */
    /* static placement: experts of layers [0, static_n) run on the CPU */
    int static_n;
    struct moe_cpu *cpu_lane;
    struct moe_plan plan;
    float *in_h, *out_h;      /* (MAX_TOK, n_embd) host copies of the layer's input / output */
    int32_t *ids_h;           /* (MAX_TOK, k) */
    float *w_h;
    bool hybrid;              /* cache misses split with the CPU lane (shares the above) */
    float *cpu_partial;       /* (MAX_TOK, n_embd) device: the CPU lane's sum, added to out */
    /* graph decode: one-token steps recorded once and replayed */
    bool graph;               /* wanted, and possible (all resident, no CPU lane) */
    bool recording;           /* between step_begin and step_end of the recording */
    void *graph_exec;         /* the recorded step, or NULL */
    const struct stream *graph_stream; /* the stream whose buffers it writes */
    const float *graph_bufs[3];        /* and those buffers (a new stream may reuse the address) */
    int32_t *step_pin;        /* pinned host [0] token id, [1] position: read by the graph */
    void *step_pin_dev;
    int32_t *step_dev;        /* (2) device copy of step_pin */
    int32_t *argmax_dev;      /* (1) read_argmax's result */
};

#define CUDA_BACKEND_ZEROCOPY_MAX_TOK 16 /* larger calls (prefill) copy misses into slots */

static inline struct backend_cuda *cuda_of(struct backend *b)
{
    return (struct backend_cuda *)b;
}

/* err_set with "cuda backend: WHAT failed"; returns rc (or -EIO). */
int backend_cuda_fail(int rc, const char *what);
/* The matmul op (chunks of MAX_TOK rows). */
int backend_cuda_matmul(struct backend *b, float *out, const struct weight *w, const float *in,
                        int m);
/* Uploads one weight (model_weights_each callback; skips the experts that stay on the host). */
void backend_cuda_weight_upload(struct weight *w, void *arg);

/* backend_cuda_offload.c */
int backend_cuda_open_static(struct backend_cuda *c, const struct backend_cuda_config *cfg);
int backend_cuda_open_cache(struct backend_cuda *c, const struct backend_cuda_config *cfg);
int backend_cuda_lane_inputs(struct backend_cuda *c, const float *in, int nt, int k);
int backend_cuda_lane_add(struct backend_cuda *c, const struct moe_args *ma, float *out, int nt);
int backend_cuda_moe_on_cpu(struct backend_cuda *c, const struct moe_args *ma, const float *in,
                            float *out, int nt);
int backend_cuda_predict_next(struct backend *b, const struct moe_args *ma, const float *in,
                              int nt);

/* Every op but matmul calls this first: it may write what mm_scratch holds quantized. */
static inline void backend_cuda_forget_xq(struct backend_cuda *c)
{
    c->xq_src = NULL;
}

#endif
