/* expert_ffn_group_run: one MoE layer's experts in one parallel region must give exactly the
 * bytes of calling expert_ffn_run expert by expert (same operations, same order), for decode
 * (one token), lockstep-like steps (8 tokens, 64 pairs: the small-group flow with several pairs
 * per expert; 256, and 90 pairs on one expert) and prefill-like plans (uneven token lists,
 * repeated tokens, more than 256 pairs), for 1, 2, 3 and 5 threads, with and without the flow, on
 * fresh random Q4_K/Q6_K and Q8_0 experts, and as many pairs as experts but not one each. Also the
 * CPU lane's per-pair cost measurement (moe_cpu_pair_seconds) gives a sane figure. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "expert_ffn.h"
#include "gen.h"
#include "moe.h"
#include "quant.h"
#include "testutil.h"

static void *draw(uint32_t type, int64_t n, float std, struct rng *r)
{
    uint64_t bytes;
    quant_row_bytes(type, (uint64_t)n, &bytes);
    void *p = malloc(bytes);
    gen_blocks_draw(type, p, (uint64_t)n, 0.0f, std, r);
    return p;
}

/* n_exp stacked random experts (gate, up of gu_type; down of down_type); strides in gs, ds. */
static void draw_experts(struct rng *r, uint32_t gu_type, uint32_t down_type, int n_exp, int n_embd,
                         int n_ff, uint8_t **gate, uint8_t **up, uint8_t **down, uint64_t *gs,
                         uint64_t *ds)
{
    quant_row_bytes(gu_type, (uint64_t)n_embd * n_ff, gs);
    quant_row_bytes(down_type, (uint64_t)n_embd * n_ff, ds);
    *gate = draw(gu_type, (int64_t)n_exp * n_embd * n_ff, 0.05f, r);
    *up = draw(gu_type, (int64_t)n_exp * n_embd * n_ff, 0.05f, r);
    *down = draw(down_type, (int64_t)n_exp * n_embd * n_ff, 0.06f, r);
}

/* The weights of experts ids[0..n) of the stacked arrays, into w (n entries). */
static void expert_table(const int32_t *ids, int n, uint32_t gu_type, uint32_t down_type,
                         const uint8_t *gate, const uint8_t *up, const uint8_t *down, uint64_t gs,
                         uint64_t ds, int n_embd, int n_ff, struct expert_ffn_weights *w)
{
    for (int i = 0; i < n; i++)
        w[i] = (struct expert_ffn_weights){.gate_type = gu_type,
                                           .up_type = gu_type,
                                           .down_type = down_type,
                                           .gate = gate + ids[i] * gs,
                                           .up = up + ids[i] * gs,
                                           .down = down + ids[i] * ds,
                                           .n_embd = n_embd,
                                           .n_ff = n_ff};
}

/* The reference: expert_ffn_run for each expert in turn over its pairs, accumulated into out. */
static void serial_run(const struct expert_ffn_weights *w, int n, const int32_t *offset,
                       const int32_t *tokens, const float *wt, const float *x, int n_embd,
                       float *out)
{
    size_t sb = expert_ffn_scratch_bytes(&w[0]);
    void *scratch = malloc(sb);
    for (int i = 0; i < n; i++) {
        struct expert_ffn_args a = {.w = &w[i],
                                    .n_tokens = offset[i + 1] - offset[i],
                                    .tokens = tokens + offset[i],
                                    .token_weights = wt + offset[i],
                                    .x = x,
                                    .x_stride = n_embd,
                                    .out = out,
                                    .out_stride = n_embd,
                                    .scratch = scratch,
                                    .scratch_bytes = sb};
        CHECK(expert_ffn_run(&a) == 0, "expert_ffn_run");
    }
    free(scratch);
}

/* n_tok tokens routed top-k over 16 random experts; with `hot`, expert 0 first for every token
 * (more pairs than a matmul batch on one expert). */
static void one_case(struct rng *r, uint32_t gu_type, uint32_t down_type, int n_tok, int k,
                     bool hot)
{
    const int n_exp = 16, n_embd = 512, n_ff = 256;
    uint64_t gs, ds;
    uint8_t *gate, *up, *down;
    draw_experts(r, gu_type, down_type, n_exp, n_embd, n_ff, &gate, &up, &down, &gs, &ds);
    float *x = malloc(sizeof(float) * n_tok * n_embd);
    float *logits = malloc(sizeof(float) * n_tok * n_exp);
    int32_t *ids = malloc(sizeof(int32_t) * n_tok * k);
    float *wt = malloc(sizeof(float) * n_tok * k);
    size_t ob = sizeof(float) * n_tok * n_embd;
    float *ref = malloc(ob), *got[2] = {malloc(ob), malloc(ob)};
    struct moe_plan p;

    for (int i = 0; i < n_tok * n_embd; i++)
        x[i] = rng_normal(r);
    for (int i = 0; i < n_tok * n_exp; i++)
        logits[i] = rng_normal(r) + (hot && i % n_exp == 0 ? 100.0f : 0.0f);
    moe_route_softmax_topk(logits, n_tok, n_exp, k, ids, wt);
    moe_plan_init(&p, n_tok, k, n_exp);
    moe_plan_build(&p, ids, wt, n_tok);
    for (int i = 0; i < n_tok * n_embd; i++)
        ref[i] = rng_normal(r); /* outputs accumulate: start from the same random values */
    memcpy(got[0], ref, ob);
    memcpy(got[1], ref, ob);

    struct expert_ffn_weights *w = malloc(sizeof(*w) * p.n_active);
    expert_table(p.expert, p.n_active, gu_type, down_type, gate, up, down, gs, ds, n_embd, n_ff, w);
    serial_run(w, p.n_active, p.offset, p.tok, p.wt, x, n_embd, ref);
    size_t gb = expert_ffn_group_scratch_bytes(&w[0], p.offset[p.n_active]);
    void *gscratch = malloc(gb);
    /* 1, 2, 3 and 5 threads; groups of at most 256 pairs also without their flow */
    static const int threads[] = {1, 2, 3, 5};
    for (int c = 0; c < 8; c++) {
        int t = threads[c % 4], flow = c < 4;
        if (!flow && p.offset[p.n_active] > 256)
            break;
        expert_ffn_set_flow(flow);
        test_poison_bytes(gscratch, gb);
        memcpy(got[1], got[0], ob);
        struct expert_ffn_group_args g = {.n_experts = p.n_active,
                                          .w = w,
                                          .offset = p.offset,
                                          .tokens = p.tok,
                                          .token_weights = p.wt,
                                          .x = x,
                                          .x_stride = n_embd,
                                          .out = got[1],
                                          .out_stride = n_embd,
                                          .scratch = gscratch,
                                          .scratch_bytes = gb,
                                          .n_threads = t};
        CHECK(expert_ffn_group_run(&g) == 0, "expert_ffn_group_run");
        CHECK(memcmp(got[1], ref, ob) == 0,
              "group (%d threads, flow %d, %s/%s, %d tokens top-%d) differs from "
              "expert-by-expert: max rel err %g",
              t, flow, quant_type_name(gu_type), quant_type_name(down_type), n_tok, k,
              test_max_rel_err(got[1], ref, (size_t)n_tok * n_embd));
    }
    expert_ffn_set_flow(1);
    /* too little scratch and mismatched shapes are refused */
    struct expert_ffn_group_args bad = {.n_experts = p.n_active,
                                        .w = w,
                                        .offset = p.offset,
                                        .tokens = p.tok,
                                        .x = x,
                                        .x_stride = n_embd,
                                        .out = got[0],
                                        .out_stride = n_embd,
                                        .scratch = gscratch,
                                        .scratch_bytes = gb - 1};
    CHECK(expert_ffn_group_run(&bad) == -EINVAL, "short scratch accepted");
    free(w), free(gscratch), free(gate), free(up), free(down), free(x);
    free(logits), free(ids), free(wt), free(ref), free(got[0]), free(got[1]);
    moe_plan_free(&p);
}

/* As many pairs as experts, but not one each (2, 0, 1: an expert without pairs, a token in
 * two experts); the same bytes as expert by expert, with and without the flow. */
static void uneven_one_token(struct rng *r)
{
    const int n_embd = 512, n_ff = 256;
    uint64_t gs, ds;
    uint8_t *gate, *up, *down;
    draw_experts(r, QUANT_Q4_K, QUANT_Q6_K, 3, n_embd, n_ff, &gate, &up, &down, &gs, &ds);
    int32_t offset[4] = {0, 2, 2, 3}, tokens[3] = {0, 1, 0};
    float wt[3] = {0.5f, 0.3f, 0.2f}, *x = malloc(sizeof(float) * 2 * n_embd);
    size_t ob = sizeof(float) * 2 * n_embd;
    float *ref = malloc(ob), *got = malloc(ob);
    struct expert_ffn_weights w[3];
    for (int i = 0; i < 2 * n_embd; i++) {
        x[i] = rng_normal(r);
        ref[i] = got[i] = rng_normal(r);
    }
    const int32_t ids[3] = {0, 1, 2};
    expert_table(ids, 3, QUANT_Q4_K, QUANT_Q6_K, gate, up, down, gs, ds, n_embd, n_ff, w);
    serial_run(w, 3, offset, tokens, wt, x, n_embd, ref);
    size_t gb = expert_ffn_group_scratch_bytes(&w[0], 3);
    void *gscratch = malloc(gb);
    struct expert_ffn_group_args g = {.n_experts = 3,
                                      .w = w,
                                      .offset = offset,
                                      .tokens = tokens,
                                      .token_weights = wt,
                                      .x = x,
                                      .x_stride = n_embd,
                                      .out = got,
                                      .out_stride = n_embd,
                                      .scratch = gscratch,
                                      .scratch_bytes = gb};
    float *start = malloc(ob);
    memcpy(start, got, ob);
    for (int flow = 1; flow >= 0; flow--) {
        expert_ffn_set_flow(flow);
        memcpy(got, start, ob);
        CHECK(expert_ffn_group_run(&g) == 0, "expert_ffn_group_run");
        CHECK(memcmp(got, ref, ob) == 0,
              "pairs 2/0/1, flow %d: group differs from expert-by-expert (%g)", flow,
              test_max_rel_err(got, ref, 2 * (size_t)n_embd));
    }
    expert_ffn_set_flow(1);
    free(start), free(gate), free(up), free(down), free(x), free(ref), free(got), free(gscratch);
}

/* moe_cpu_pair_seconds: the CPU lane's per-pair arithmetic, measured on random Q4_K/Q6_K
 * experts: a sane figure (0 to 10 ms a pair; printed), and bad sizes refused. */
static void pair_seconds(struct rng *r)
{
    const int n_exp = 8, n_embd = 512, n_ff = 256, k = 4;
    uint64_t gs, ds;
    uint8_t *gate, *up, *down;
    draw_experts(r, QUANT_Q4_K, QUANT_Q6_K, n_exp, n_embd, n_ff, &gate, &up, &down, &gs, &ds);
    struct moe_experts ex = {.gate = gate,
                             .up = up,
                             .down = down,
                             .gate_type = QUANT_Q4_K,
                             .up_type = QUANT_Q4_K,
                             .down_type = QUANT_Q6_K,
                             .gate_stride = gs,
                             .up_stride = gs,
                             .down_stride = ds,
                             .n_embd = n_embd,
                             .n_ff = n_ff};
    struct moe_cpu *c = NULL;
    CHECK(moe_cpu_open(64, n_embd, n_ff, &c) == 0, "moe_cpu_open");
    double s = moe_cpu_pair_seconds(c, &ex, n_exp, k, 64, 3);
    printf("CPU lane: %.2f us per (token, expert) pair (d %d, ffn %d, Q4_K/Q6_K)\n", s * 1e6,
           n_embd, n_ff);
    /* a timing: only its sanity is checked (a loaded machine can make it 0, never negative) */
    CHECK(s >= 0 && s < 1e-2, "pair seconds %g", s);
    CHECK(moe_cpu_pair_seconds(c, &ex, n_exp, k, 65, 1) < 0, "more tokens than max_tok accepted");
    moe_cpu_close(c);
    free(gate), free(up), free(down);
}

int main(void)
{
    struct rng r;
    rng_seed(&r, test_seed("test_expert_group"), 4);
    one_case(&r, QUANT_Q4_K, QUANT_Q6_K, 1, 4, false); /* decode */
    for (int i = 0; i < 16; i++)                       /* decode's flow, again and again */
        one_case(&r, QUANT_Q4_K, QUANT_Q6_K, 1, 8, false);
    one_case(&r, QUANT_Q4_K, QUANT_Q6_K, 8, 8, false);  /* lockstep: several pairs an expert */
    one_case(&r, QUANT_Q4_K, QUANT_Q6_K, 32, 8, false); /* 256 pairs: the last small group */
    one_case(&r, QUANT_Q4_K, QUANT_Q6_K, 33, 8, false); /* 264: the barrier path */
    one_case(&r, QUANT_Q4_K, QUANT_Q6_K, 90, 2, true);  /* 90 pairs on expert 0 */
    one_case(&r, QUANT_Q4_K, QUANT_Q6_K, 37, 4, false); /* uneven lists, > 16 per expert */
    one_case(&r, QUANT_Q8_0, QUANT_Q8_0, 5, 2, false);
    one_case(&r, QUANT_F32, QUANT_F32, 3, 3, false);
    uneven_one_token(&r);
    pair_seconds(&r);
    return test_finish("test_expert_group");
}
