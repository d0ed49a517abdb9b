/* gen: lays out a synthetic qwen3moe, gpt-oss, qwen3next or qwen35moe GGUF and fills it from
 * worker threads.
 *
 * DESIGN. The calling thread builds the plan (metadata, tensor list with types, shapes and
 * value distributions), declares it to the GGUF writer and calls gguf_writer_begin_data. Tensor
 * data is cut into jobs: fixed chunks of GEN_CHUNK_ELEMS values of one tensor, numbered in file
 * order. Workers take the next job number from an atomic counter, draw the chunk into their
 * own buffer from the random stream (seed, tensor index << 32 | chunk index) and write it with
 * gguf_writer_pwrite (positional, thread-safe). A chunk's bytes depend only on the seed, the
 * tensor and the chunk, so the file does not depend on the thread count or on scheduling.
 * Shared state: the job counter and the byte counter (atomics), and under `lock` the first
 * error and the count of finished workers; the calling thread waits on `done_cond` with a
 * timeout to report progress. A failing or cancelled worker stops all others at their next
 * job. Shutdown: every worker exits after the last job; the calling thread joins them, then
 * finishes (fsync, rename) or aborts (temp file removed) the writer.
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "errors.h"
#include "gen.h"
#include "gguf.h"
#include "quant.h"

#define GEN_CHUNK_ELEMS (1u << 20) /* values per job: a multiple of every block size */
#define GEN_MAX_TENSORS_PER_LAYER 19 /* gpt-oss and a qwen35moe GDN layer; qwen3moe 12 */
#define GEN_NORM_STD 0.05f /* norm weights are 1 + N(0, GEN_NORM_STD^2) */
/* Gated DeltaNet parameters (qwen3next, qwen35moe): ssm_dt.bias is N(1, 0.05^2); ssm_a
 * (= -exp(A_log)) is N(-4, 0.5^2), which rng_normal's bound |z| < 7.5 keeps below -0.28; values
 * above GEN_SSM_A_MAX would still be clamped to it, so that ssm_a is strictly negative whatever
 * the normal draw. */
#define GEN_DT_BIAS_MEAN 1.0f
#define GEN_DT_BIAS_STD 0.05f
#define GEN_SSM_A_MEAN (-4.0f)
#define GEN_SSM_A_STD 0.5f
#define GEN_SSM_A_MAX (-0.01f)
#define GEN_BIAS_STD 0.02f /* gpt-oss biases are N(0, GEN_BIAS_STD^2); its sinks N(0, 1) */
#define GEN_TYPE_MIX UINT32_MAX /* plan_add: the mix chooses the type */
#define GEN_FTYPE_MXFP4_MOE 38  /* general.file_type: MXFP4 experts, the rest Q8_0 */

/* A short ChatML template of our own for the Qwen3 special tokens. */
static const char chat_template[] =
    "{%- for message in messages -%}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}\n";

struct gen_tensor {
    char name[64];
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[3]; /* ggml order: ne[0] contiguous */
    uint64_t n_elem;
    float mean, std;    /* distribution of the dequantized values */
    bool negative;      /* F32 only: values above GEN_SSM_A_MAX are clamped to it (ssm_a) */
    int idx;            /* index in the GGUF writer */
    uint64_t first_job; /* job number of chunk 0 */
    uint64_t n_chunks;
};

struct gen_run {
    const struct gen_config *cfg;
    struct gguf_writer *w;
    struct gen_tensor *t; /* (n_t) in file order, owned */
    uint32_t n_t;
    uint64_t n_jobs;
    uint64_t total_bytes;
    size_t buf_bytes; /* largest chunk in bytes */

    _Atomic uint64_t next_job;
    _Atomic uint64_t done_bytes;
    atomic_bool stop;

    pthread_mutex_t lock;
    pthread_cond_t done_cond;
    uint32_t n_finished; /* under lock */
    int rc;              /* first error, under lock */
    char msg[512];       /* its message, under lock */
};

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- plan --------------------------------------------------------------------------------- */

/* Appends a tensor; type GEN_TYPE_MIX lets the mix choose (quant_mix_tensor_type). */
static void plan_add(struct gen_run *run, const struct gen_config *cfg, uint64_t *n_fallback,
                     const char *name, uint32_t type, uint32_t n_dims, const uint64_t *ne,
                     float mean, float std)
{
    struct gen_tensor *t = &run->t[run->n_t++];
    bool fell_back;

    snprintf(t->name, sizeof(t->name), "%s", name);
    t->n_dims = n_dims;
    t->n_elem = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        t->ne[d] = ne[d];
        t->n_elem *= ne[d];
    }
    if (type == GEN_TYPE_MIX) {
        t->type = quant_mix_tensor_type(cfg->mix, name, n_dims, ne[0], &fell_back);
        *n_fallback += fell_back;
    } else {
        t->type = type;
    }
    t->mean = mean;
    t->std = std;
    t->n_chunks = (t->n_elem + GEN_CHUNK_ELEMS - 1) / GEN_CHUNK_ELEMS;
    t->first_job = run->n_jobs;
    run->n_jobs += t->n_chunks;
}

/* The qwen3moe tensor list (docs/formats.md §4.2) in file order: token_embd, the layers, then
 * output_norm and output. Fan-in scaling: std = 1/sqrt(input length of the product). */
static int plan_build_qwen3moe(struct gen_run *run, const struct gen_config *cfg,
                               uint32_t n_vocab, uint64_t *n_fallback)
{
    const struct gen_preset *p = &cfg->preset;
    uint64_t d = p->n_embd, q = (uint64_t)p->n_head * p->head_dim;
    uint64_t kv = (uint64_t)p->n_head_kv * p->head_dim, ff = p->n_ff_exp, e = p->n_expert;
    float s_d = 1.0f / sqrtf((float)d), s_q = 1.0f / sqrtf((float)q);
    float s_ff = 1.0f / sqrtf((float)ff);
    char name[64];

    run->t = calloc((size_t)p->n_layer * GEN_MAX_TENSORS_PER_LAYER + 3, sizeof(*run->t));
    if (!run->t)
        return err_set(-ENOMEM, "gen: out of memory for the tensor list");

#define ADD(nm, nd, m, s, ...)                                                                     \
    plan_add(run, cfg, n_fallback, nm, GEN_TYPE_MIX, nd, (const uint64_t[]){__VA_ARGS__}, m, s)
#define BLK(suffix) (snprintf(name, sizeof(name), "blk.%u.%s", l, suffix), name)

    ADD("token_embd.weight", 2, 0.0f, 1.0f, d, n_vocab);
    for (uint32_t l = 0; l < p->n_layer; l++) {
        ADD(BLK("attn_norm.weight"), 1, 1.0f, GEN_NORM_STD, d);
        ADD(BLK("attn_q.weight"), 2, 0.0f, s_d, d, q);
        ADD(BLK("attn_k.weight"), 2, 0.0f, s_d, d, kv);
        ADD(BLK("attn_v.weight"), 2, 0.0f, s_d, d, kv);
        ADD(BLK("attn_output.weight"), 2, 0.0f, s_q, q, d);
        ADD(BLK("attn_q_norm.weight"), 1, 1.0f, GEN_NORM_STD, p->head_dim);
        ADD(BLK("attn_k_norm.weight"), 1, 1.0f, GEN_NORM_STD, p->head_dim);
        ADD(BLK("ffn_norm.weight"), 1, 1.0f, GEN_NORM_STD, d);
        ADD(BLK("ffn_gate_inp.weight"), 2, 0.0f, s_d, d, e);
        ADD(BLK("ffn_gate_exps.weight"), 3, 0.0f, s_d, d, ff, e);
        ADD(BLK("ffn_up_exps.weight"), 3, 0.0f, s_d, d, ff, e);
        ADD(BLK("ffn_down_exps.weight"), 3, 0.0f, s_ff, ff, d, e);
    }
    ADD("output_norm.weight", 1, 1.0f, GEN_NORM_STD, d);
    ADD("output.weight", 2, 0.0f, s_d, d, n_vocab);
#undef BLK
#undef ADD
    return 0;
}

/* The gpt-oss tensor list (docs/formats.md, gpt-oss) in file order: token_embd, the layers,
 * then output_norm and output. Experts are MXFP4 (as converted checkpoints carry them) except
 * under the f32 mix, which is all F32 (the reference checks); norms, biases, sinks and the
 * router F32; the other matrices take the mix's type. */
static int plan_build_gptoss(struct gen_run *run, const struct gen_config *cfg, uint32_t n_vocab,
                             uint64_t *n_fallback)
{
    const struct gen_preset *p = &cfg->preset;
    uint64_t d = p->n_embd, q = (uint64_t)p->n_head * p->head_dim;
    uint64_t kv = (uint64_t)p->n_head_kv * p->head_dim, ff = p->n_ff_exp, e = p->n_expert;
    float s_d = 1.0f / sqrtf((float)d), s_q = 1.0f / sqrtf((float)q);
    float s_ff = 1.0f / sqrtf((float)ff), b = GEN_BIAS_STD;
    const uint32_t mix = GEN_TYPE_MIX, f32 = QUANT_F32;
    const uint32_t mx = cfg->mix == QUANT_MIX_F32 ? QUANT_F32 : QUANT_MXFP4;
    char name[64];

    run->t = calloc((size_t)p->n_layer * GEN_MAX_TENSORS_PER_LAYER + 3, sizeof(*run->t));
    if (!run->t)
        return err_set(-ENOMEM, "gen: out of memory for the tensor list");

#define ADD(nm, ty, nd, m, s, ...)                                                                 \
    plan_add(run, cfg, n_fallback, nm, ty, nd, (const uint64_t[]){__VA_ARGS__}, m, s)
#define BLK(suffix) (snprintf(name, sizeof(name), "blk.%u.%s", l, suffix), name)

    ADD("token_embd.weight", mix, 2, 0.0f, 1.0f, d, n_vocab);
    for (uint32_t l = 0; l < p->n_layer; l++) {
        ADD(BLK("attn_norm.weight"), f32, 1, 1.0f, GEN_NORM_STD, d);
        ADD(BLK("attn_q.weight"), mix, 2, 0.0f, s_d, d, q);
        ADD(BLK("attn_q.bias"), f32, 1, 0.0f, b, q);
        ADD(BLK("attn_k.weight"), mix, 2, 0.0f, s_d, d, kv);
        ADD(BLK("attn_k.bias"), f32, 1, 0.0f, b, kv);
        ADD(BLK("attn_v.weight"), mix, 2, 0.0f, s_d, d, kv);
        ADD(BLK("attn_v.bias"), f32, 1, 0.0f, b, kv);
        ADD(BLK("attn_output.weight"), mix, 2, 0.0f, s_q, q, d);
        ADD(BLK("attn_output.bias"), f32, 1, 0.0f, b, d);
        ADD(BLK("attn_sinks.weight"), f32, 1, 0.0f, 1.0f, (uint64_t)p->n_head);
        ADD(BLK("post_attention_norm.weight"), f32, 1, 1.0f, GEN_NORM_STD, d);
        ADD(BLK("ffn_gate_inp.weight"), f32, 2, 0.0f, s_d, d, e);
        ADD(BLK("ffn_gate_inp.bias"), f32, 1, 0.0f, b, e);
        ADD(BLK("ffn_gate_exps.weight"), mx, 3, 0.0f, s_d, d, ff, e);
        ADD(BLK("ffn_gate_exps.bias"), f32, 2, 0.0f, b, ff, e);
        ADD(BLK("ffn_up_exps.weight"), mx, 3, 0.0f, s_d, d, ff, e);
        ADD(BLK("ffn_up_exps.bias"), f32, 2, 0.0f, b, ff, e);
        ADD(BLK("ffn_down_exps.weight"), mx, 3, 0.0f, s_ff, ff, d, e);
        ADD(BLK("ffn_down_exps.bias"), f32, 2, 0.0f, b, d, e);
    }
    ADD("output_norm.weight", f32, 1, 1.0f, GEN_NORM_STD, d);
    ADD("output.weight", mix, 2, 0.0f, s_d, d, n_vocab);
#undef BLK
#undef ADD
    return 0;
}

/* The qwen3next / qwen35moe tensor list (docs/formats.md §4(c), §4(f)) in file order:
 * token_embd, the layers, then output_norm and output. Layer l is full attention iff
 * (l + 1) % full_attn_interval == 0 (gated attention: attn_q holds q and its gate per head),
 * else Gated DeltaNet; every layer has the routed experts plus a shared expert with a sigmoid
 * gate. qwen3next has one ssm_ba {H, 2 n_v}, qwen35moe ssm_beta and ssm_alpha {H, n_v}. Norms,
 * the router, the shared expert's gate and the GDN vectors and conv are F32; the other matrices
 * take the mix's type. */
static int plan_build_hybrid(struct gen_run *run, const struct gen_config *cfg, uint32_t n_vocab,
                             uint64_t *n_fallback)
{
    const struct gen_preset *p = &cfg->preset;
    bool ba = !strcmp(cfg->arch, "qwen3next");
    uint64_t d = p->n_embd, hd = p->head_dim, q = (uint64_t)p->n_head * hd;
    uint64_t kv = (uint64_t)p->n_head_kv * hd, ff = p->n_ff_exp, fs = p->n_ff_shexp;
    uint64_t e = p->n_expert, ds = p->ssm_d_state, nv = p->ssm_dt_rank, kc = p->ssm_d_conv;
    uint64_t v = nv * ds, c = 2 * (uint64_t)p->ssm_n_group * ds + v; /* V, conv channels C */
    float s_d = 1.0f / sqrtf((float)d), s_q = 1.0f / sqrtf((float)q);
    float s_ff = 1.0f / sqrtf((float)ff), s_fs = 1.0f / sqrtf((float)fs);
    float s_v = 1.0f / sqrtf((float)v), s_kc = 1.0f / sqrtf((float)kc);
    const uint32_t mix = GEN_TYPE_MIX, f32 = QUANT_F32;
    char name[64];

    run->t = calloc((size_t)(p->n_layer + p->n_nextn) * GEN_MAX_TENSORS_PER_LAYER + 4,
                    sizeof(*run->t));
    if (!run->t)
        return err_set(-ENOMEM, "gen: out of memory for the tensor list");

#define ADD(nm, ty, nd, m, s, ...)                                                                 \
    plan_add(run, cfg, n_fallback, nm, ty, nd, (const uint64_t[]){__VA_ARGS__}, m, s)
#define BLK(suffix) (snprintf(name, sizeof(name), "blk.%u.%s", l, suffix), name)

    ADD("token_embd.weight", mix, 2, 0.0f, 1.0f, d, n_vocab);
    for (uint32_t l = 0; l < p->n_layer + p->n_nextn; l++) {
        if (l >= p->n_layer) { /* the MTP block: its own projection and norms, then a layer */
            ADD(BLK("nextn.eh_proj.weight"), mix, 2, 0.0f, 1.0f / sqrtf(2.0f * d), 2 * d, d);
            ADD(BLK("nextn.enorm.weight"), f32, 1, 1.0f, GEN_NORM_STD, d);
            ADD(BLK("nextn.hnorm.weight"), f32, 1, 1.0f, GEN_NORM_STD, d);
            ADD(BLK("nextn.shared_head_norm.weight"), f32, 1, 1.0f, GEN_NORM_STD, d);
        }
        ADD(BLK("attn_norm.weight"), f32, 1, 1.0f, GEN_NORM_STD, d);
        if (l >= p->n_layer || (l + 1) % p->full_attn_interval == 0) {
            ADD(BLK("attn_q.weight"), mix, 2, 0.0f, s_d, d, 2 * q);
            ADD(BLK("attn_k.weight"), mix, 2, 0.0f, s_d, d, kv);
            ADD(BLK("attn_v.weight"), mix, 2, 0.0f, s_d, d, kv);
            ADD(BLK("attn_output.weight"), mix, 2, 0.0f, s_q, q, d);
            ADD(BLK("attn_q_norm.weight"), f32, 1, 1.0f, GEN_NORM_STD, hd);
            ADD(BLK("attn_k_norm.weight"), f32, 1, 1.0f, GEN_NORM_STD, hd);
        } else {
            ADD(BLK("attn_qkv.weight"), mix, 2, 0.0f, s_d, d, c);
            ADD(BLK("attn_gate.weight"), mix, 2, 0.0f, s_d, d, v);
            if (ba) {
                ADD(BLK("ssm_ba.weight"), mix, 2, 0.0f, s_d, d, 2 * nv);
            } else {
                ADD(BLK("ssm_beta.weight"), mix, 2, 0.0f, s_d, d, nv);
                ADD(BLK("ssm_alpha.weight"), mix, 2, 0.0f, s_d, d, nv);
            }
            ADD(BLK("ssm_conv1d.weight"), f32, 2, 0.0f, s_kc, kc, c);
            ADD(BLK("ssm_dt.bias"), f32, 1, GEN_DT_BIAS_MEAN, GEN_DT_BIAS_STD, nv);
            ADD(BLK("ssm_a"), f32, 1, GEN_SSM_A_MEAN, GEN_SSM_A_STD, nv);
            run->t[run->n_t - 1].negative = true;
            ADD(BLK("ssm_norm.weight"), f32, 1, 1.0f, GEN_NORM_STD, ds);
            ADD(BLK("ssm_out.weight"), mix, 2, 0.0f, s_v, v, d);
        }
        ADD(BLK("post_attention_norm.weight"), f32, 1, 1.0f, GEN_NORM_STD, d);
        ADD(BLK("ffn_gate_inp.weight"), f32, 2, 0.0f, s_d, d, e);
        ADD(BLK("ffn_gate_exps.weight"), mix, 3, 0.0f, s_d, d, ff, e);
        ADD(BLK("ffn_up_exps.weight"), mix, 3, 0.0f, s_d, d, ff, e);
        ADD(BLK("ffn_down_exps.weight"), mix, 3, 0.0f, s_ff, ff, d, e);
        ADD(BLK("ffn_gate_inp_shexp.weight"), f32, 1, 0.0f, s_d, d);
        ADD(BLK("ffn_gate_shexp.weight"), mix, 2, 0.0f, s_d, d, fs);
        ADD(BLK("ffn_up_shexp.weight"), mix, 2, 0.0f, s_d, d, fs);
        ADD(BLK("ffn_down_shexp.weight"), mix, 2, 0.0f, s_fs, fs, d);
    }
    ADD("output_norm.weight", f32, 1, 1.0f, GEN_NORM_STD, d);
    ADD("output.weight", mix, 2, 0.0f, s_d, d, n_vocab);
#undef BLK
#undef ADD
    return 0;
}

static bool gen_is_gptoss(const struct gen_config *cfg)
{
    return !strcmp(cfg->arch, "gpt-oss");
}

/* qwen3next and qwen35moe: Gated DeltaNet layers between gated attention layers. */
static bool gen_is_hybrid(const struct gen_config *cfg)
{
    return !strcmp(cfg->arch, "qwen3next") || !strcmp(cfg->arch, "qwen35moe");
}

/* The hybrid architectures' own hyper-parameters. */
static int check_hybrid(const struct gen_preset *p)
{
    const char *name = p->name ? p->name : "(custom)";

    if (!p->n_ff_shexp || !p->ssm_d_conv || !p->ssm_d_state || !p->ssm_n_group || !p->ssm_dt_rank ||
        !p->full_attn_interval)
        return err_set(-EINVAL, "gen: preset '%s' has a zero shared-expert or GDN dimension", name);
    if (p->ssm_dt_rank % p->ssm_n_group)
        return err_set(-EINVAL, "gen: %u GDN v heads are not a multiple of %u q/k heads",
                       p->ssm_dt_rank, p->ssm_n_group);
    if (!p->n_rot || p->n_rot % 2 || p->n_rot > p->head_dim)
        return err_set(-EINVAL, "gen: rope dimension count %u is not even in 2..%u", p->n_rot,
                       p->head_dim);
    if (p->n_nextn > 1)
        return err_set(-EINVAL, "gen: %u MTP blocks (gen writes 0 or 1)", p->n_nextn);
    if ((uint64_t)p->ssm_dt_rank * p->ssm_d_state > UINT32_MAX)
        return err_set(-EINVAL, "gen: GDN inner size %u x %u does not fit ssm.inner_size",
                       p->ssm_dt_rank, p->ssm_d_state);
    return 0;
}

static int check_preset(const struct gen_config *cfg)
{
    const struct gen_preset *p = &cfg->preset;

    if (!cfg->arch ||
        (strcmp(cfg->arch, "qwen3moe") && strcmp(cfg->arch, "gpt-oss") && !gen_is_hybrid(cfg)))
        return err_set(-EINVAL,
                       "gen: unknown architecture '%s' (known: qwen3moe, gpt-oss, qwen3next, "
                       "qwen35moe)",
                       cfg->arch ? cfg->arch : "(none)");
    if (p->arch && strcmp(p->arch, cfg->arch))
        return err_set(-EINVAL, "gen: preset '%s' is a %s preset, not %s",
                       p->name ? p->name : "(custom)", p->arch, cfg->arch);
    if (gen_is_gptoss(cfg) && (p->n_embd % 32 || p->n_ff_exp % 32 || !p->n_swa))
        return err_set(-EINVAL, "gen: gpt-oss needs embd %u and expert ffn %u multiples of 32 "
                                "(MXFP4 rows) and a sliding window (%u)",
                       p->n_embd, p->n_ff_exp, p->n_swa);
    if (!cfg->out_path)
        return err_set(-EINVAL, "gen: no output path");
    if (cfg->mix != QUANT_MIX_F32 && cfg->mix != QUANT_MIX_Q8_0 && cfg->mix != QUANT_MIX_Q4_K_M)
        return err_set(-EINVAL, "gen: mix '%s' cannot be drawn (gen writes f32, q8_0, q4_k_m)",
                       quant_mix_name(cfg->mix));
    if (!p->n_layer || !p->n_embd || !p->n_ff_exp || !p->n_expert || !p->n_head || !p->n_head_kv ||
        !p->head_dim || !p->n_vocab)
        return err_set(-EINVAL, "gen: preset '%s' has a zero dimension",
                       p->name ? p->name : "(custom)");
    if (p->n_expert_used == 0 || p->n_expert_used > p->n_expert)
        return err_set(-EINVAL, "gen: %u of %u experts used per token", p->n_expert_used,
                       p->n_expert);
    if (p->n_head % p->n_head_kv)
        return err_set(-EINVAL, "gen: %u query heads are not a multiple of %u kv heads", p->n_head,
                       p->n_head_kv);
    if (p->n_layer > 100000)
        return err_set(-EINVAL, "gen: %u layers is not a model", p->n_layer);
    return gen_is_hybrid(cfg) ? check_hybrid(p) : 0;
}

/* ---- metadata ----------------------------------------------------------------------------- */

/* qwen35moe's rope.dimension_sections: Qwen3.5's [11, 11, 10, 0] scaled to n_rot/2 rotated
 * pairs (t and h rounded, w the rest), so that 2 * sum == n_rot; n_rot 64 gives [11, 11, 10, 0]. */
static void rope_sections(uint32_t n_rot, int32_t out[4])
{
    int32_t half = (int32_t)(n_rot / 2), th = (11 * half + 16) / 32;

    out[0] = th;
    out[1] = th;
    out[2] = half - 2 * th;
    out[3] = 0;
}

/* The qwen3next / qwen35moe keys beyond the qwen3moe ones. */
static int write_metadata_hybrid(struct gguf_writer *w, const struct gen_config *cfg)
{
    const struct gen_preset *p = &cfg->preset;
    char key[96];
    int rc = 0;

#define U32(k, val)                                                                                \
    (snprintf(key, sizeof(key), "%s.%s", cfg->arch, k),                                            \
     rc = rc ? rc : gguf_writer_add_u32(w, key, val))
    U32("expert_shared_feed_forward_length", p->n_ff_shexp);
    U32("rope.dimension_count", p->n_rot);
    U32("ssm.conv_kernel", p->ssm_d_conv);
    U32("ssm.state_size", p->ssm_d_state);
    U32("ssm.group_count", p->ssm_n_group);
    U32("ssm.time_step_rank", p->ssm_dt_rank);
    U32("ssm.inner_size", p->ssm_dt_rank * p->ssm_d_state);
    U32("full_attention_interval", p->full_attn_interval);
    if (p->n_nextn)
        U32("nextn_predict_layers", p->n_nextn);
#undef U32
    if (!rc && !strcmp(cfg->arch, "qwen35moe")) {
        int32_t sec[4];
        rope_sections(p->n_rot, sec);
        snprintf(key, sizeof(key), "%s.rope.dimension_sections", cfg->arch);
        rc = gguf_writer_add_arr(w, key, GGUF_TYPE_INT32, sec, 4);
    }
    return rc;
}

static int write_metadata(struct gguf_writer *w, const struct gen_config *cfg,
                          const struct gen_vocab *v)
{
    const struct gen_preset *p = &cfg->preset;
    const struct gen_preset *base = p->name ? gen_preset_find_arch(cfg->arch, p->name) : NULL;
    const char *a = cfg->arch;
    bool oss = gen_is_gptoss(cfg), hybrid = gen_is_hybrid(cfg);
    char name[160], layers[32] = "", key[96];
    uint32_t ftype = quant_mix_file_type(cfg->mix);
    int rc = 0;

    if (base && base->n_layer != p->n_layer)
        snprintf(layers, sizeof(layers), ", %u layers", p->n_layer);
    snprintf(name, sizeof(name), "%s (synthetic, strata gen %s seed %" PRIu64 "%s)",
             p->model_name ? p->model_name : a, quant_mix_name(cfg->mix), cfg->seed, layers);
    if (oss && cfg->mix == QUANT_MIX_Q8_0)
        ftype = GEN_FTYPE_MXFP4_MOE;

#define U32(key, val) (rc = rc ? rc : gguf_writer_add_u32(w, key, val))
#define F32(key, val) (rc = rc ? rc : gguf_writer_add_f32(w, key, val))
#define STR(key, val) (rc = rc ? rc : gguf_writer_add_str(w, key, val))
#define AK(k) (snprintf(key, sizeof(key), "%s.%s", a, k), key) /* an {arch}.* key */
    STR("general.architecture", a);
    STR("general.name", name);
    U32("general.file_type", ftype);
    U32("general.quantization_version", 2);
    U32(AK("block_count"), p->n_layer + p->n_nextn);
    U32(AK("context_length"), p->n_ctx);
    U32(AK("embedding_length"), p->n_embd);
    if (!hybrid) /* qwen3next and qwen35moe have no dense FFN */
        U32(AK("feed_forward_length"), p->n_ff);
    U32(AK("expert_feed_forward_length"), p->n_ff_exp);
    U32(AK("expert_count"), p->n_expert);
    U32(AK("expert_used_count"), p->n_expert_used);
    U32(AK("attention.head_count"), p->n_head);
    U32(AK("attention.head_count_kv"), p->n_head_kv);
    U32(AK("attention.key_length"), p->head_dim);
    U32(AK("attention.value_length"), p->head_dim);
    F32(AK("attention.layer_norm_rms_epsilon"), p->rms_eps);
    F32(AK("rope.freq_base"), p->rope_base);
    if (oss) { /* sliding_window_pattern is left out: absent means period 2 */
        U32(AK("attention.sliding_window"), p->n_swa);
        STR(AK("rope.scaling.type"), "yarn");
        F32(AK("rope.scaling.factor"), p->yarn_factor);
        U32(AK("rope.scaling.original_context_length"), p->yarn_n_ctx_orig);
    }
    if (!rc && hybrid)
        rc = write_metadata_hybrid(w, cfg);
    STR("tokenizer.ggml.model", "gpt2");
    STR("tokenizer.ggml.pre", "qwen2");
    if (!rc)
        rc = gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens,
                                     NULL, v->n_tokens);
    if (!rc)
        rc = gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v->types,
                                 v->n_tokens);
    if (!rc)
        rc = gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges,
                                     NULL, v->n_merges);
    U32("tokenizer.ggml.bos_token_id", v->bos_id);
    U32("tokenizer.ggml.eos_token_id", v->eos_id);
    U32("tokenizer.ggml.padding_token_id", v->pad_id);
    if (!rc)
        rc = gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", false);
    STR("tokenizer.chat_template", chat_template);
#undef AK
#undef U32
#undef F32
#undef STR
    return rc;
}

/* ---- workers ------------------------------------------------------------------------------ */

static void run_fail(struct gen_run *run, int rc, const char *msg)
{
    pthread_mutex_lock(&run->lock);
    if (!run->rc) {
        run->rc = rc;
        snprintf(run->msg, sizeof(run->msg), "%s", msg);
    }
    pthread_mutex_unlock(&run->lock);
    atomic_store(&run->stop, true);
}

/* The tensor that owns job j: binary search over first_job. */
static struct gen_tensor *job_tensor(struct gen_run *run, uint64_t j)
{
    uint32_t lo = 0, hi = run->n_t;
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (run->t[mid].first_job <= j)
            lo = mid;
        else
            hi = mid;
    }
    return &run->t[lo];
}

static int do_job(struct gen_run *run, uint64_t j, void *buf)
{
    struct gen_tensor *t = job_tensor(run, j);
    uint64_t chunk = j - t->first_job, first = chunk * GEN_CHUNK_ELEMS;
    uint64_t n = t->n_elem - first < GEN_CHUNK_ELEMS ? t->n_elem - first : GEN_CHUNK_ELEMS;
    uint64_t at, bytes;
    struct rng r;
    int rc;

    if ((rc = quant_row_bytes(t->type, first, &at)) || (rc = quant_row_bytes(t->type, n, &bytes)))
        return rc;
    rng_seed(&r, run->cfg->seed, (uint64_t)(t - run->t) << 32 | chunk);
    if ((rc = gen_blocks_draw(t->type, buf, n, t->mean, t->std, &r)))
        return err_wrap(rc, "tensor '%s': ", t->name);
    if (t->negative && t->type == QUANT_F32) {
        float *y = buf;
        for (uint64_t i = 0; i < n; i++)
            y[i] = y[i] <= GEN_SSM_A_MAX ? y[i] : GEN_SSM_A_MAX;
    }
    if ((rc = gguf_writer_pwrite(run->w, t->idx, at, buf, bytes)))
        return err_wrap(rc, "tensor '%s' chunk %" PRIu64 ": ", t->name, chunk);
    atomic_fetch_add(&run->done_bytes, bytes);
    return 0;
}

static void *worker_main(void *arg)
{
    struct gen_run *run = arg;
    void *buf = malloc(run->buf_bytes);

    if (!buf)
        run_fail(run, -ENOMEM, "gen: out of memory for a chunk buffer");
    while (buf && !atomic_load(&run->stop)) {
        if (run->cfg->cancel && *run->cfg->cancel) {
            run_fail(run, -EINTR, "gen: interrupted");
            break;
        }
        uint64_t j = atomic_fetch_add(&run->next_job, 1);
        if (j >= run->n_jobs)
            break;
        int rc = do_job(run, j, buf);
        if (rc) {
            run_fail(run, rc, err_msg());
            break;
        }
    }
    free(buf);
    pthread_mutex_lock(&run->lock);
    run->n_finished++;
    pthread_cond_signal(&run->done_cond);
    pthread_mutex_unlock(&run->lock);
    return NULL;
}

/* Starts n workers, reports progress until all have finished, joins them. */
static int run_workers(struct gen_run *run, uint32_t n, double t0)
{
    pthread_t *th = calloc(n, sizeof(*th));
    uint32_t started = 0;
    int rc = 0;

    if (!th)
        return err_set(-ENOMEM, "gen: out of memory for %u threads", n);
    for (; started < n; started++) {
        if ((rc = pthread_create(&th[started], NULL, worker_main, run))) {
            run_fail(run, -rc, "gen: cannot start a worker thread");
            break;
        }
    }
    pthread_mutex_lock(&run->lock);
    while (run->n_finished < started) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 250 * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&run->done_cond, &run->lock, &until);
        if (run->n_finished < started && run->cfg->progress) {
            pthread_mutex_unlock(&run->lock);
            run->cfg->progress(run->cfg->progress_arg, atomic_load(&run->done_bytes),
                               run->total_bytes, now_seconds() - t0);
            pthread_mutex_lock(&run->lock);
        }
    }
    pthread_mutex_unlock(&run->lock);
    for (uint32_t i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    free(th);
    if (run->rc)
        return err_set(run->rc, "%s", run->msg);
    return rc;
}

/* ---- the whole write ---------------------------------------------------------------------- */

static int declare_tensors(struct gen_run *run, uint64_t *n_params)
{
    uint64_t max_chunk = 0;

    *n_params = 0;
    for (uint32_t i = 0; i < run->n_t; i++) {
        struct gen_tensor *t = &run->t[i];
        uint64_t bytes;
        int rc = quant_tensor_bytes(t->type, t->n_dims, t->ne, &bytes);
        if (rc)
            return err_wrap(rc, "tensor '%s': ", t->name);
        t->idx = gguf_writer_add_tensor(run->w, t->name, t->type, t->n_dims, t->ne);
        if (t->idx < 0)
            return t->idx;
        if ((rc = quant_row_bytes(
                 t->type, t->n_elem < GEN_CHUNK_ELEMS ? t->n_elem : GEN_CHUNK_ELEMS, &bytes)))
            return rc;
        if (bytes > max_chunk)
            max_chunk = bytes;
        *n_params += t->n_elem;
    }
    run->buf_bytes = (size_t)max_chunk;
    return 0;
}

static uint32_t default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 1024 ? 1024 : (uint32_t)n;
}

int gen_file_write(const struct gen_config *cfg, struct gen_stats *stats)
{
    struct gen_run run = {.cfg = cfg};
    struct gen_vocab vocab = {0};
    struct gen_stats st = {0};
    double t0 = now_seconds();
    int rc;

    if ((rc = check_preset(cfg)))
        return rc;
    rc = cfg->vocab_path ? gen_vocab_load(cfg->vocab_path, cfg->preset.n_vocab, &vocab)
                         : gen_vocab_build(cfg->preset.n_vocab, cfg->preset.special_base, &vocab);
    if (rc)
        return rc;
    if (gen_is_gptoss(cfg))
        rc = plan_build_gptoss(&run, cfg, vocab.n_tokens, &st.n_fallback);
    else if (gen_is_hybrid(cfg))
        rc = plan_build_hybrid(&run, cfg, vocab.n_tokens, &st.n_fallback);
    else
        rc = plan_build_qwen3moe(&run, cfg, vocab.n_tokens, &st.n_fallback);
    if (rc)
        goto out_vocab;
    if ((rc = gguf_writer_open(cfg->out_path, GGUF_DEFAULT_ALIGNMENT, &run.w)))
        goto out_plan;
    if ((rc = write_metadata(run.w, cfg, &vocab)) || (rc = declare_tensors(&run, &st.n_params)) ||
        (rc = gguf_writer_begin_data(run.w)))
        goto out_abort;
    for (uint32_t i = 0; i < run.n_t; i++) {
        uint64_t off, size;
        if ((rc = gguf_writer_tensor_extent(run.w, run.t[i].idx, &off, &size)))
            goto out_abort;
        run.total_bytes += size;
    }

    st.n_threads = cfg->n_threads ? cfg->n_threads : default_threads();
    pthread_mutex_init(&run.lock, NULL);
    pthread_cond_init(&run.done_cond, NULL);
    rc = run_workers(&run, st.n_threads, t0);
    pthread_cond_destroy(&run.done_cond);
    pthread_mutex_destroy(&run.lock);
    if (rc)
        goto out_abort;
    if (cfg->progress)
        cfg->progress(cfg->progress_arg, run.total_bytes, run.total_bytes, now_seconds() - t0);
    rc = gguf_writer_finish(run.w);
    run.w = NULL;
    if (rc)
        goto out_plan;

    st.n_tensors = run.n_t;
    st.data_bytes = run.total_bytes;
    st.n_vocab = vocab.n_tokens;
    st.seconds = now_seconds() - t0;
    if (stats)
        *stats = st;
    goto out_plan;

out_abort:
    gguf_writer_abort(run.w);
out_plan:
    free(run.t);
out_vocab:
    gen_vocab_free(&vocab);
    return rc;
}
