/* gen_inflate: a small qwen3moe model grown to a real model's per-layer shapes with its
 * function kept, so that experts have their real byte sizes while routing stays the small
 * model's (strata gen --inflate).
 *
 * The small model's hidden dims are the first d of D; every extra dim is zero in the residual
 * stream (embeddings and projections write nothing there) and RMSNorm weights are scaled by
 * sqrt(d/D) for the larger mean. Small head i becomes big head (i / g_s) * g_B + i % g_s, so
 * GQA groups map onto groups; head dim t goes to t*r (first half) or (t - hs/2)*r + hd/2
 * (second half), r = hd/hs, where NEOX RoPE turns it by the same angle. q_norm is scaled by
 * sqrt(hs/hd), which with the larger head's norm and 1/sqrt(hd) score scale gives the small
 * model's scores. Expert FFN rows past the small n_ff, and every padding entry of a matrix,
 * get only a little noise (so no quantized block is all zeros); RMSNorm weights of the extra
 * dims are exactly zero, so that noise never reaches a router.
 */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "gen.h"
#include "gguf.h"
#include "model.h"
#include "quant.h"
#include "quant_ref.h"

struct inflate {
    const struct gen_inflate_config *cfg;
    const struct model *m;           /* the small model */
    const struct gen_preset *t;      /* target shapes */
    struct gguf_writer *w;
    int ds, D, hs, hd, Hs, HB, KVs, KVB, Fs, FB;
    uint64_t written;
};

/* Small head dim t -> big head dim (same NEOX rotation angle). */
static int inflate_hmap(const struct inflate *in, int t)
{
    int r = in->hd / in->hs, half = in->hs / 2;
    return t < half ? t * r : (t - half) * r + in->hd / 2;
}

/* Small q head i -> big q head: GQA groups onto groups. */
static int inflate_qmap(const struct inflate *in, int i)
{
    int gs = in->Hs / in->KVs, gb = in->HB / in->KVB;
    return (i / gs) * gb + i % gs;
}

/* Row r (of all ne1*ne2 rows) of a small weight, dequantized into out (ne0 floats). */
static int inflate_src_row(const struct weight *w, uint64_t r, float *out)
{
    const uint8_t *p = (const uint8_t *)w->data + r * w->row_bytes;
    return quant_ref_dequantize(w->type, p, out, (int64_t)w->ne[0]);
}

/* Noise for padding entries: std noise/sqrt(n_in), from a stream per (tensor, row). */
static void inflate_noise(const struct inflate *in, float *x, int64_t n, int64_t n_in,
                          uint64_t stream)
{
    struct rng r;
    float s = in->cfg->noise / sqrtf((float)n_in);
    rng_seed(&r, in->cfg->seed, stream);
    for (int64_t i = 0; i < n; i++)
        x[i] = s * rng_normal(&r);
}

/* One output row of a big tensor, filled by fill(in, ctx, row, buf) into buf (ne0 floats). */
typedef int (*inflate_row_fn)(const struct inflate *in, const void *ctx, int64_t row, float *buf,
                              uint64_t stream);

/* Writes a tensor of n_rows rows of ne0 elements of `type`, rows made by fill, quantized in
 * parallel chunks. */
static int inflate_emit(struct inflate *in, uint32_t type, int64_t ne0, int64_t n_rows,
                        inflate_row_fn fill, const void *ctx, uint64_t tensor_id)
{
    enum { CHUNK = 256 };
    uint64_t rb;
    int rc = quant_row_bytes(type, (uint64_t)ne0, &rb);
    float *f = malloc(sizeof(float) * (size_t)ne0 * CHUNK);
    uint8_t *q = malloc((size_t)rb * CHUNK);

    if (!rc && (!f || !q))
        rc = err_set(-ENOMEM, "inflate: out of memory");
    for (int64_t r0 = 0; !rc && r0 < n_rows; r0 += CHUNK) {
        int n = n_rows - r0 < CHUNK ? (int)(n_rows - r0) : CHUNK;
        int bad = 0;
#pragma omp parallel for schedule(dynamic, 8) reduction(| : bad)
        for (int i = 0; i < n; i++) {
            float *row = f + (size_t)i * ne0;
            bad |= fill(in, ctx, r0 + i, row, (tensor_id << 32) ^ (uint64_t)(r0 + i)) != 0;
            bad |= quant_ref_quantize(type, row, q + (size_t)i * rb, ne0) != 0;
        }
        if (bad)
            rc = err_set(-EINVAL, "inflate: cannot build or quantize rows %lld.. (type %s)",
                         (long long)r0, quant_type_name(type));
        else
            rc = gguf_writer_write(in->w, q, (uint64_t)rb * (uint64_t)n);
        in->written += (uint64_t)rb * (uint64_t)n;
    }
    free(f);
    free(q);
    return rc;
}

/* ---- row builders ---- */

struct vec_ctx {
    const struct weight *w; /* (n) F32 norm weight */
    int n, n_big;
    float scale;
    int head; /* 1: a q/k norm (head dims mapped), 0: a hidden-size norm */
};

static int row_norm(const struct inflate *in, const void *c, int64_t row, float *buf,
                    uint64_t stream)
{
    const struct vec_ctx *v = c;
    const float *src = v->w->data;
    (void)row, (void)stream;
    memset(buf, 0, sizeof(float) * (size_t)v->n_big);
    for (int t = 0; t < v->n; t++)
        buf[v->head ? inflate_hmap(in, t) : t] = src[t] * v->scale;
    return 0;
}

/* Rows that copy a small row into the first ds (or fs) inputs: embeddings, output head,
 * router, gate/up experts. Rows past the small count are noise only. */
struct pad_ctx {
    const struct weight *w;
    int64_t rows_small; /* small rows per expert (ne1) */
    int64_t rows_big;   /* big rows per expert */
    int64_t n_in_small, n_in_big;
    int exact_zero;     /* 1: zeros, not noise, in the padding (F32 router) */
};

static int row_pad(const struct inflate *in, const void *c, int64_t row, float *buf,
                   uint64_t stream)
{
    const struct pad_ctx *p = c;
    int64_t e = row / p->rows_big, r = row % p->rows_big;
    if (p->exact_zero)
        memset(buf, 0, sizeof(float) * (size_t)p->n_in_big);
    else
        inflate_noise(in, buf, p->n_in_big, p->n_in_big, stream);
    if (r >= p->rows_small)
        return 0;
    return inflate_src_row(p->w, (uint64_t)(e * p->rows_small + r), buf);
}

/* attn_q / attn_k / attn_v: big row (head hb, dim j) from small row (head i, dim t). */
struct qkv_ctx {
    const struct weight *w;
    int kv; /* 1: k or v (heads map to themselves), 0: q */
    int32_t *src_row; /* (big rows) small row or -1, built once */
};

static int row_qkv(const struct inflate *in, const void *c, int64_t row, float *buf,
                   uint64_t stream)
{
    const struct qkv_ctx *q = c;
    inflate_noise(in, buf, in->D, in->D, stream);
    return q->src_row[row] < 0 ? 0 : inflate_src_row(q->w, (uint64_t)q->src_row[row], buf);
}

/* attn_output: big row o < ds takes the small row's inputs at their mapped columns. */
struct wo_ctx {
    const struct weight *w;
    int32_t *col; /* (small inputs Hs*hs) big column of each small input column */
    float *tmp;   /* per-thread scratch, (threads, Hs*hs) */
};

static int row_wo(const struct inflate *in, const void *c, int64_t row, float *buf,
                  uint64_t stream)
{
    const struct wo_ctx *o = c;
    int n_small = in->Hs * in->hs;
    inflate_noise(in, buf, (int64_t)in->HB * in->hd, (int64_t)in->HB * in->hd, stream);
    if (row >= in->ds)
        return 0;
    float *tmp = o->tmp + (size_t)omp_get_thread_num() * n_small;
    int rc = inflate_src_row(o->w, (uint64_t)row, tmp);
    for (int k = 0; !rc && k < n_small; k++)
        buf[o->col[k]] = tmp[k];
    return rc;
}

/* down experts: big row o < ds of expert e takes small row o's fs inputs. */
static int row_down(const struct inflate *in, const void *c, int64_t row, float *buf,
                    uint64_t stream)
{
    const struct weight *w = c;
    int64_t e = row / in->D, o = row % in->D;
    inflate_noise(in, buf, in->FB, in->FB, stream);
    if (o >= in->ds)
        return 0;
    return inflate_src_row(w, (uint64_t)(e * in->ds + o), buf);
}

/* ---- the file ---- */

struct inflate_tensor {
    char name[64];
    uint32_t n_dims;
    uint64_t ne[3];
};

static int inflate_check(const struct inflate *in)
{
    const struct model_hparams *hp = &in->m->hp;
    const struct gen_preset *t = in->t;
    if (hp->n_expert != t->n_expert || hp->n_expert_used != t->n_expert_used)
        return err_set(-EINVAL,
                       "inflate: the small model has %u experts top-%u, the target %u top-%u: "
                       "routing cannot be kept",
                       hp->n_expert, hp->n_expert_used, t->n_expert, t->n_expert_used);
    if (in->ds > in->D || in->Fs > in->FB || in->hs > in->hd || in->hd % in->hs ||
        in->KVs > in->KVB || in->Hs / in->KVs > in->HB / in->KVB)
        return err_set(-EINVAL,
                       "inflate: the small model (d %d, ffn %d, heads %d/%d x %d) does not fit "
                       "in the target (d %d, ffn %d, heads %d/%d x %d)",
                       in->ds, in->Fs, in->Hs, in->KVs, in->hs, in->D, in->FB, in->HB, in->KVB,
                       in->hd);
    return 0;
}

static int inflate_kv(struct inflate *in)
{
    const struct gen_preset *t = in->t;
    const struct model_hparams *hp = &in->m->hp;
    struct gguf_writer *w = in->w;
    int rc = 0;
#define U32(k, v) (rc = rc ? rc : gguf_writer_add_u32(w, k, v))
#define F32(k, v) (rc = rc ? rc : gguf_writer_add_f32(w, k, v))
    rc = gguf_writer_add_str(w, "general.architecture", "qwen3moe");
    rc = rc ? rc : gguf_writer_add_str(w, "general.name", "inflated (strata gen --inflate)");
    U32("general.file_type", quant_mix_file_type(in->cfg->mix));
    U32("general.quantization_version", 2);
    U32("qwen3moe.block_count", hp->n_layer);
    U32("qwen3moe.context_length", hp->n_ctx_train);
    U32("qwen3moe.embedding_length", (uint32_t)in->D);
    U32("qwen3moe.feed_forward_length", t->n_ff);
    U32("qwen3moe.expert_feed_forward_length", (uint32_t)in->FB);
    U32("qwen3moe.expert_count", t->n_expert);
    U32("qwen3moe.expert_used_count", t->n_expert_used);
    U32("qwen3moe.attention.head_count", (uint32_t)in->HB);
    U32("qwen3moe.attention.head_count_kv", (uint32_t)in->KVB);
    U32("qwen3moe.attention.key_length", (uint32_t)in->hd);
    U32("qwen3moe.attention.value_length", (uint32_t)in->hd);
    F32("qwen3moe.attention.layer_norm_rms_epsilon", hp->rms_eps);
    F32("qwen3moe.rope.freq_base", hp->rope_base);
#undef U32
#undef F32
    for (uint64_t i = 0; !rc && i < in->m->file->n_kv; i++) {
        const struct gguf_kv *kv = &in->m->file->kv[i];
        if (!strncmp(kv->key, "tokenizer.", 10))
            rc = gguf_writer_copy_kv(w, kv);
    }
    return rc;
}

/* Declares every tensor in file order; returns the count in *n. */
static int inflate_declare(struct inflate *in, struct inflate_tensor *tt, int *n)
{
    const struct model_hparams *hp = &in->m->hp;
    uint64_t D = (uint64_t)in->D, V = hp->n_vocab, E = hp->n_expert;
    uint64_t q = (uint64_t)in->HB * in->hd, kv = (uint64_t)in->KVB * in->hd;
    int k = 0;
#define T(nm, nd, a, b, c) (snprintf(tt[k].name, sizeof(tt[k].name), "%s", nm), \
                            tt[k].n_dims = nd, tt[k].ne[0] = a, tt[k].ne[1] = b, tt[k].ne[2] = c, k++)
    T("token_embd.weight", 2, D, V, 1);
    T("output_norm.weight", 1, D, 1, 1);
    T("output.weight", 2, D, V, 1);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        char b[64];
#define L(s, nd, x, y, z) (snprintf(b, sizeof(b), "blk.%u.%s.weight", l, s), T(b, nd, x, y, z))
        L("attn_norm", 1, D, 1, 1);
        L("attn_q", 2, D, q, 1);
        L("attn_k", 2, D, kv, 1);
        L("attn_v", 2, D, kv, 1);
        L("attn_output", 2, q, D, 1);
        L("attn_q_norm", 1, (uint64_t)in->hd, 1, 1);
        L("attn_k_norm", 1, (uint64_t)in->hd, 1, 1);
        L("ffn_norm", 1, D, 1, 1);
        L("ffn_gate_inp", 2, D, E, 1);
        L("ffn_gate_exps", 3, D, (uint64_t)in->FB, E);
        L("ffn_up_exps", 3, D, (uint64_t)in->FB, E);
        L("ffn_down_exps", 3, (uint64_t)in->FB, D, E);
#undef L
    }
#undef T
    *n = k;
    for (int i = 0; i < k; i++) {
        uint32_t type = quant_mix_tensor_type(in->cfg->mix, tt[i].name, tt[i].n_dims,
                                              tt[i].ne[0], NULL);
        int rc = gguf_writer_add_tensor(in->w, tt[i].name, type, tt[i].n_dims, tt[i].ne);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Emits one layer's twelve tensors in declaration order. */
static int inflate_layer(struct inflate *in, uint32_t l, const struct inflate_tensor *tt,
                         uint64_t id0)
{
    const struct layer_weights *lw = &in->m->layers[l];
    const struct model_hparams *hp = &in->m->hp;
    int64_t E = hp->n_expert, q_rows = (int64_t)in->HB * in->hd, kv_rows = (int64_t)in->KVB * in->hd;
    float dn = sqrtf((float)in->ds / (float)in->D);
    int n_small_in = in->Hs * in->hs, rc = 0;
    int32_t *qrow = malloc(sizeof(int32_t) * (size_t)q_rows);
    int32_t *krow = malloc(sizeof(int32_t) * (size_t)kv_rows);
    int32_t *col = malloc(sizeof(int32_t) * (size_t)n_small_in);
    float *tmp = malloc(sizeof(float) * (size_t)n_small_in * (size_t)omp_get_max_threads());
#define TY(i) quant_mix_tensor_type(in->cfg->mix, tt[i].name, tt[i].n_dims, tt[i].ne[0], NULL)

    if (!qrow || !krow || !col || !tmp) {
        rc = err_set(-ENOMEM, "inflate: out of memory");
        goto out;
    }
    for (int64_t r = 0; r < q_rows; r++)
        qrow[r] = -1;
    for (int64_t r = 0; r < kv_rows; r++)
        krow[r] = -1;
    for (int i = 0; i < in->Hs; i++)
        for (int t = 0; t < in->hs; t++) {
            int big = inflate_qmap(in, i) * in->hd + inflate_hmap(in, t);
            qrow[big] = i * in->hs + t;
            col[i * in->hs + t] = big;
        }
    for (int c = 0; c < in->KVs; c++)
        for (int t = 0; t < in->hs; t++)
            krow[c * in->hd + inflate_hmap(in, t)] = c * in->hs + t;

    struct vec_ctx an = {&lw->attn_norm, in->ds, in->D, dn, 0};
    struct qkv_ctx cq = {&lw->wq, 0, qrow}, ck = {&lw->wk, 1, krow}, cv = {&lw->wv, 1, krow};
    struct wo_ctx co = {&lw->wo, col, tmp};
    struct vec_ctx qn = {&lw->q_norm, in->hs, in->hd, sqrtf((float)in->hs / (float)in->hd), 1};
    struct vec_ctx kn = {&lw->k_norm, in->hs, in->hd, 1.0f, 1};
    struct vec_ctx fn = {&lw->ffn_norm, in->ds, in->D, dn, 0};
    struct pad_ctx rt = {&lw->router, E, E, in->ds, in->D, 1};
    struct pad_ctx gt = {&lw->gate_exps, in->Fs, in->FB, in->ds, in->D, 0};
    struct pad_ctx up = {&lw->up_exps, in->Fs, in->FB, in->ds, in->D, 0};
    rt.rows_small = rt.rows_big = E; /* one "expert" of E rows */

    rc = rc ? rc : inflate_emit(in, TY(0), in->D, 1, row_norm, &an, id0);
    rc = rc ? rc : inflate_emit(in, TY(1), in->D, q_rows, row_qkv, &cq, id0 + 1);
    rc = rc ? rc : inflate_emit(in, TY(2), in->D, kv_rows, row_qkv, &ck, id0 + 2);
    rc = rc ? rc : inflate_emit(in, TY(3), in->D, kv_rows, row_qkv, &cv, id0 + 3);
    rc = rc ? rc : inflate_emit(in, TY(4), q_rows, in->D, row_wo, &co, id0 + 4);
    rc = rc ? rc : inflate_emit(in, TY(5), in->hd, 1, row_norm, &qn, id0 + 5);
    rc = rc ? rc : inflate_emit(in, TY(6), in->hd, 1, row_norm, &kn, id0 + 6);
    rc = rc ? rc : inflate_emit(in, TY(7), in->D, 1, row_norm, &fn, id0 + 7);
    rc = rc ? rc : inflate_emit(in, TY(8), in->D, E, row_pad, &rt, id0 + 8);
    rc = rc ? rc : inflate_emit(in, TY(9), in->D, E * in->FB, row_pad, &gt, id0 + 9);
    rc = rc ? rc : inflate_emit(in, TY(10), in->D, E * in->FB, row_pad, &up, id0 + 10);
    rc = rc ? rc : inflate_emit(in, TY(11), in->FB, E * in->D, row_down, &lw->down_exps, id0 + 11);
#undef TY
out:
    free(qrow);
    free(krow);
    free(col);
    free(tmp);
    return rc;
}

static int inflate_write(struct inflate *in)
{
    const struct model_hparams *hp = &in->m->hp;
    int n = 0, rc;
    struct inflate_tensor *tt = calloc(3 + 12 * (size_t)hp->n_layer, sizeof(*tt));
    if (!tt)
        return err_set(-ENOMEM, "inflate: out of memory");
    rc = inflate_kv(in);
    rc = rc ? rc : inflate_declare(in, tt, &n);
    rc = rc ? rc : gguf_writer_begin_data(in->w);
    if (!rc) {
        struct pad_ctx emb = {&in->m->tok_embd, hp->n_vocab, hp->n_vocab, in->ds, in->D, 0};
        struct pad_ctx out = {&in->m->output, hp->n_vocab, hp->n_vocab, in->ds, in->D, 0};
        struct vec_ctx on = {&in->m->output_norm, in->ds, in->D,
                             sqrtf((float)in->ds / (float)in->D), 0};
#define TY(i) quant_mix_tensor_type(in->cfg->mix, tt[i].name, tt[i].n_dims, tt[i].ne[0], NULL)
        rc = inflate_emit(in, TY(0), in->D, hp->n_vocab, row_pad, &emb, 0);
        rc = rc ? rc : inflate_emit(in, TY(1), in->D, 1, row_norm, &on, 1);
        rc = rc ? rc : inflate_emit(in, TY(2), in->D, hp->n_vocab, row_pad, &out, 2);
#undef TY
    }
    for (uint32_t l = 0; !rc && l < hp->n_layer; l++)
        rc = inflate_layer(in, l, tt + 3 + 12 * l, 16 + 16 * (uint64_t)l);
    free(tt);
    return rc;
}

int gen_inflate(const struct gen_inflate_config *cfg, struct gen_stats *stats)
{
    struct model *m = NULL;
    struct inflate in = {.cfg = cfg, .t = &cfg->target};
    int rc = model_open(cfg->small_path, &m);

    if (rc)
        return rc;
    in.m = m;
    in.ds = (int)m->hp.n_embd;
    in.D = (int)cfg->target.n_embd;
    in.hs = (int)m->hp.head_dim;
    in.hd = (int)cfg->target.head_dim;
    in.Hs = (int)m->hp.n_head;
    in.HB = (int)cfg->target.n_head;
    in.KVs = (int)m->hp.n_head_kv;
    in.KVB = (int)cfg->target.n_head_kv;
    in.Fs = (int)m->hp.n_ff_exp;
    in.FB = (int)cfg->target.n_ff_exp;
    rc = inflate_check(&in);
    rc = rc ? rc : gguf_writer_open(cfg->out_path, 0, &in.w);
    if (!rc) {
        rc = inflate_write(&in);
        if (rc)
            gguf_writer_abort(in.w);
        else
            rc = gguf_writer_finish(in.w);
    }
    if (!rc && stats) {
        memset(stats, 0, sizeof(*stats));
        stats->data_bytes = in.written;
        stats->n_tensors = 3 + 12 * (uint64_t)m->hp.n_layer;
        stats->n_vocab = m->hp.n_vocab;
    }
    model_close(m);
    return rc;
}
