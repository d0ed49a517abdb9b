/* moe: the pieces of the MoE FFN path: routing (softmax -> top-k -> renormalise), the
 * per-layer expert plan (which experts, which tokens, which router weights, and the lane each
 * expert is computed on) and the CPU lane. moe_layer.h puts them together for one layer.
 */
#ifndef STRATA_MOE_H
#define STRATA_MOE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Softmax over the n_expert logits of each token, top-k (ties to the lower id), weights
 * renormalised to sum 1 (qwen3moe). logits (n_tok, n_expert); ids, w (n_tok, k). */
void moe_route_softmax_topk(const float *logits, int n_tok, int n_expert, int k, int32_t *ids,
                            float *w);

enum moe_lane {
    MOE_LANE_CPU = 0,  /* computed on the CPU from host memory */
    MOE_LANE_GPU = 1,  /* computed on the GPU from its VRAM slot (a hit) */
    MOE_LANE_PCIE = 2, /* streamed over PCIe into a slot, then computed on the GPU */
};

/* The plan of one layer for one step. */
struct moe_plan {
    int n_tok, k, n_expert;
    int n_active;    /* experts selected by at least one token */
    int32_t *expert; /* (n_active) expert ids, ascending */
    int32_t *offset; /* (n_active + 1) ranges into tok / wt */
    int32_t *tok;    /* (n_tok * k) token index of each (expert, token) pair, grouped by expert */
    float *wt;       /* (n_tok * k) router weight of each pair */
    uint8_t *lane;   /* (n_active) enum moe_lane */
    int32_t *count;  /* (n_expert) scratch */
    /* all arrays are views into one allocation owned by the plan */
    void *mem;
    int max_tok;
};

int moe_plan_init(struct moe_plan *p, int max_tok, int k, int n_expert);
void moe_plan_free(struct moe_plan *p);

/* Groups the routed (token, expert) pairs by expert; tokens stay in ascending order within an
 * expert, so every consumer sees a deterministic order. n_tok <= max_tok. */
void moe_plan_build(struct moe_plan *p, const int32_t *ids, const float *w, int n_tok);

/* The stacked expert tensors of one layer, as the CPU lane reads them (host memory). */
struct moe_experts {
    const uint8_t *gate, *up; /* (n_expert, n_ff rows of n_embd) of gate_type / up_type */
    const uint8_t *down;      /* (n_expert, n_embd rows of n_ff) of down_type */
    uint32_t gate_type, up_type, down_type;
    uint64_t gate_stride, up_stride, down_stride; /* bytes per expert */
    int n_embd, n_ff;
    const float *gate_b, *up_b; /* (n_expert, n_ff) F32 biases, or NULL */
    const float *down_b;        /* (n_expert, n_embd), or NULL */
    int act;                    /* enum expert_act (cpu_kernels/expert_ffn.h) */
    /* NULL, or (n_expert, 3) host addresses of each expert's gate, up and down rows (a host
     * tier's slots), used instead of base + e * stride for the experts a call computes */
    const uint8_t *const *ptrs;
};

struct layer_weights;
struct model_hparams;

/* The stacked experts of a model layer as the CPU lane reads them (host pointers). */
void moe_experts_of(const struct layer_weights *lw, const struct model_hparams *hp,
                    struct moe_experts *ex);

struct moe_cpu;

/* Per-backend CPU-lane state (scratch for up to max_tok tokens). */
int moe_cpu_open(int max_tok, int n_embd, int n_ff, struct moe_cpu **out);
void moe_cpu_close(struct moe_cpu *c);

/* out (n_tok, n_embd) = sum over the plan's CPU-lane experts of w * expert(in). Writes every
 * element of out (zeros where no expert contributes). in (n_tok, n_embd). */
int moe_cpu_run(struct moe_cpu *c, const struct moe_plan *p, const struct moe_experts *ex,
                const float *in, float *out);

/* The CPU lane's arithmetic per (token, expert) pair beyond reading the expert's bytes, for
 * lane_model.cpu_pair_s: times k experts of ex with 1 token and with n_tok tokens each (best of
 * reps), and returns (t_many - t_one) / ((n_tok - 1) * k) seconds, at least 0. n_tok <= the
 * max_tok of moe_cpu_open, k <= the layer's experts; -1 on failure. */
double moe_cpu_pair_seconds(struct moe_cpu *c, const struct moe_experts *ex, int n_expert, int k,
                            int n_tok, int reps);

#ifdef __cplusplus
}
#endif

#endif
