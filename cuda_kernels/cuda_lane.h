/* cuda_lane: the CPU lane inside a recorded decode step (--residency gpu --placement hybrid).
 * Per layer call of one token, after the GPU's cache looked the experts up without admitting
 * any (cuda_devcache_call.no_admit):
 *   post: of the selected experts without a slot (slot_of < 0), a share (cpu_share) are the
 *         CPU's: their table entries point at zero bytes for the expert kernels that follow (a
 *         zero expert adds exactly 0; the others are read in place over PCIe by those kernels),
 *         the layer's input row, the routing and the CPU's list go to the layer's message in
 *         page-locked host memory, and its tag word is set to the step's number last;
 *   join: after the expert kernels, when the CPU had experts, waits until the host has set the
 *         message's done word to the step's number (bounded: after CUDA_LANE_WAIT_NS it sets
 *         *err and adds nothing), adds the host's row to the layer's output, and points the
 *         CPU's experts' entries back at their mapped host bytes.
 * The host (moe_layer_lane_serve) polls each layer's tag, computes the listed experts with the
 * CPU lane into the message's y row and sets done. Nothing returns to the host between the
 * layers, so the step stays one graph; a step with no miss costs two one-block launches a
 * layer. */
#ifndef STRATA_CUDA_LANE_H
#define STRATA_CUDA_LANE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_LANE_MAX_K 32               /* a warp's lanes: one per pair of the token */
#define CUDA_LANE_WAIT_NS 10000000000ull /* 10 s: the host is gone */

/* One layer's message, in page-locked host memory mapped into the device. With experts for
 * the CPU the device writes the fields above `tag` and the layer's x row, then tag; without,
 * tag alone (one 8-byte store); the host writes y (of the call's layer) and then done. */
struct cuda_lane_msg {
    int32_t ids[CUDA_LANE_MAX_K]; /* the token's routing */
    float w[CUDA_LANE_MAX_K];
    uint8_t cpu[CUDA_LANE_MAX_K]; /* 1: pair i's expert is the CPU's */
    uint64_t tag;                 /* the step's number << 8 | experts for the CPU (0: nothing
                                   * to do), written last by the device */
    uint32_t pad0[14];
    uint32_t done; /* the step's number, written last by the host (own cache line) */
    uint32_t pad1[15];
};

struct cuda_lane_call {
    const int32_t *ids; /* (k) device: the token's routing */
    const float *w;     /* (k) device */
    int k, n_expert, n_embd;
    const int32_t *slot_of;    /* (n_expert) device: the layer's slot of each expert, or -1 */
    void **tab;                /* the layer's pointer table: [part * n_expert + expert] */
    const uint8_t *zero;       /* device: zero bytes, at least a part's */
    const uint8_t *mapped[3];  /* expert 0 of each part in mapped host memory */
    uint64_t stride[3];        /* bytes of each part per expert */
    const float *x;            /* (n_embd) device: the layer's input row */
    float *out;                /* (n_embd) device: the expert kernels' output, added to */
    struct cuda_lane_msg *msg; /* the device's address of the layer's message */
    float *xh;                 /* (n_embd) the device's address of the host's copy of x */
    const float *yh;           /* (n_embd) the device's address of the host's result */
    const uint32_t *seq;       /* device: the step's number */
    int32_t *list;             /* (k + 1) device scratch of the layer: [0] count, then the
                                * CPU's experts, from post to join */
    uint32_t *err;             /* device: set to 1 when a join gave up waiting */
    float cpu_share;           /* of a call's n misses (in the order of ids) the CPU takes
                                * the first max(1, ceil(n cpu_share)); the expert kernels read
                                * the others in place from mapped host memory */
    int32_t *admit;            /* (k) device, or NULL: post writes the first n_admit of the
                                * call's misses, -1 for the rest (the ids of an admission
                                * behind the call: expert_cache_prefetch_device) */
    int n_admit;
    /* a device that is the host's own memory (tests/ simulations) calls serve(ctx, layer)
     * where the join waits; NULL on a GPU */
    int (*serve)(void *ctx, int layer);
    void *serve_ctx;
    int layer;
};

/* post and join above, each one block on `stream`. 0 or -errno. */
int cuda_lane_post(const struct cuda_lane_call *a, void *stream);
int cuda_lane_join(const struct cuda_lane_call *a, void *stream);

#ifdef __cplusplus
}
#endif
#endif
