/* test_qwen3next_forward: strata's qwen3next and qwen35moe forwards on the CPU backend against
 * a scalar reference written here from the models' definition (transformers'
 * Qwen3NextForCausalLM, Qwen3_5MoeForCausalLM; docs/formats.md): every weight dequantized to
 * float, token after token through
 *   - Gated DeltaNet layers: qkv projection, causal depthwise conv over the last d_conv raw
 *     inputs (zeros before the first) and SiLU, q and k L2-normed (q also by 1/sqrt(d)), per v
 *     head beta = sigmoid(b), g = ssm_a softplus(a + dt_bias), S = e^g S, S += k (beta (v -
 *     S^T k))^T, o = S^T q, RMSNorm(o) w silu(z); the v head's q/k head j / r (qwen3next, with
 *     its grouped ssm_ba) or j mod n_k (qwen35moe, separate beta and alpha);
 *   - gated attention layers: per head [q | gate], q/k RMSNorm, NEOX rope on the first n_rot
 *     dims, causal GQA, times sigmoid(gate);
 *   - MoE: softmax over all experts, top-k, renormalized; plus the shared expert scaled by
 *     sigmoid(w . x).
 *
 * Files: each architecture's tiny preset of tools/gen (layers of both kinds, 4 v heads over 2
 * q/k heads) over 40 tokens (past the conv window and several prefill chunks).
 *   - f32: bound 1e-4 relative (norm) on the logits.
 *   - q8_0: the reference rounds activations before each quantized product as the CPU kernels
 *     do; bound 1e-1 (a boundary flip carries through the recurrent state and the KV rows).
 * Checks per file: prefill in one call, token by token, in chunks (3 + 9 + 28); a rewind to
 * position 23 (the stream re-evaluates its first 23 tokens) then the rest; the lockstep batch
 * of 3 streams at positions 0, 17, 35; a step of 5 rows of one stream beside 1 of another,
 * every row's logits, then rewinds of that stream into those rows (its checkpoint) and before
 * them (it starts over); greedy continuation of 12 tokens equal to the reference's argmax
 * chain (f32). Every delta-rule call of a prompt says the backend may take a chunked form
 * (gdn_args.chunk_ok), and none of a lockstep step's rows does (the CUDA backend keeps them
 * bit-identical to one row at a time).
 * The MTP block (tiny f32 files with one, both architectures): its logits and 3 chained drafts
 * against the reference's (row t: x = eh_proj [enorm(embedding of the token at t + 1) |
 * hnorm(the output-normed hidden state at t)], the attention layer with the MoE and the shared
 * expert at position t, the head norm, the output matrix; a draft row's hidden state is the
 * previous row's head-normed output), bound 1e-4, after prefill in chunks, token by token, a
 * rewind, a step of 10 rows with rewinds into them and onto their checkpoint; refused without
 * a block and with --no-mtp.
 * Deterministic: gen's seeds 1 and 5 and fixed token ids. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "errors.h"
#include "fp16.h"
#include "gen.h"
#include "model.h"
#include "mtp.h"
#include "quant.h"
#include "quant_mix.h"
#include "quant_ref.h"
#include "strata.h"
#include "strata_internal.h"
#include "stream.h"
#include "testutil.h"

#define N_TOK 40
#define N_GREEDY 12
#define N_CTX 128

/* ---- the scalar reference ------------------------------------------------------------------ */

/* Whether activations are rounded to Q8_0 before a product with a quantized weight, as the CPU
 * kernels do (test_ref_linear's q8_act). */
static bool ref_q8_act;

/* y (ne[1]) = W (slice e) x (ne[0]), in double. */
static void ref_linear(const struct weight *w, uint64_t e, const float *x, float *y)
{
    test_ref_linear(w, e, x, NULL, ref_q8_act, y);
}

static void ref_rmsnorm(const float *x, const float *w, int n, float eps, float *y)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++)
        y[i] = x[i] * inv * (w ? w[i] : 1.0f);
}

static float sigm(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

static float silu(float x)
{
    return x * sigm(x);
}

/* NEOX rope of the first n_rot dims of each of n_heads heads at position pos. */
static void ref_rope(const struct model_hparams *hp, float *x, int n_heads, int pos)
{
    const int hd = (int)hp->head_dim, half = (int)hp->n_rot / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + h * hd;
        for (int i = 0; i < half; i++) {
            double theta = pos * pow(hp->rope_base, -2.0 * i / hp->n_rot);
            float c = (float)cos(theta), s = (float)sin(theta), a = v[i], b = v[i + half];
            v[i] = a * c - b * s;
            v[i + half] = b * c + a * s;
        }
    }
}

/* Gated attention of layer lw over all n_tok tokens (at positions 0..): x += Wo(attn *
 * sigmoid(gate)). */
static void ref_attention(const struct model *m, const struct layer_weights *lw, float *x,
                          int n_tok)
{
    const struct model_hparams *hp = &m->hp;
    const int d = (int)hp->n_embd, hd = (int)hp->head_dim, nh = (int)hp->n_head;
    const int nkv = (int)hp->n_head_kv, qw = nh * hd, kvw = nkv * hd;
    float *xn = test_xmalloc(sizeof(float) * d), *qg = test_xmalloc(sizeof(float) * 2 * qw);
    float *q = test_xmalloc(sizeof(float) * n_tok * qw),
          *gt = test_xmalloc(sizeof(float) * n_tok * qw);
    float *kk = test_xmalloc(sizeof(float) * n_tok * kvw);
    float *vv = test_xmalloc(sizeof(float) * n_tok * kvw);
    float *att = test_xmalloc(sizeof(float) * qw), *o = test_xmalloc(sizeof(float) * d);
    double *sc = test_xmalloc(sizeof(double) * n_tok);

    for (int t = 0; t < n_tok; t++) {
        ref_rmsnorm(x + t * d, lw->attn_norm.data, d, hp->rms_eps, xn);
        ref_linear(&lw->wq, 0, xn, qg);
        for (int h = 0; h < nh; h++) {
            memcpy(q + t * qw + h * hd, qg + h * 2 * hd, sizeof(float) * hd);
            memcpy(gt + t * qw + h * hd, qg + h * 2 * hd + hd, sizeof(float) * hd);
            ref_rmsnorm(q + t * qw + h * hd, lw->q_norm.data, hd, hp->rms_eps, q + t * qw + h * hd);
        }
        ref_linear(&lw->wk, 0, xn, kk + t * kvw);
        ref_linear(&lw->wv, 0, xn, vv + t * kvw);
        for (int h = 0; h < nkv; h++)
            ref_rmsnorm(kk + t * kvw + h * hd, lw->k_norm.data, hd, hp->rms_eps,
                        kk + t * kvw + h * hd);
        ref_rope(hp, q + t * qw, nh, t);
        ref_rope(hp, kk + t * kvw, nkv, t);
    }
    for (int t = 0; t < n_tok; t++) {
        for (int h = 0; h < nh; h++) {
            const int g = h / (nh / nkv);
            double mx = -INFINITY, den = 0;
            for (int j = 0; j <= t; j++) {
                double s = 0;
                for (int i = 0; i < hd; i++)
                    s += (double)q[t * qw + h * hd + i] * kk[j * kvw + g * hd + i];
                sc[j] = s / sqrt((double)hd);
                mx = fmax(mx, sc[j]);
            }
            for (int j = 0; j <= t; j++)
                den += exp(sc[j] - mx);
            for (int i = 0; i < hd; i++) {
                double a = 0;
                for (int j = 0; j <= t; j++)
                    a += exp(sc[j] - mx) / den * vv[j * kvw + g * hd + i];
                att[h * hd + i] = (float)a * sigm(gt[t * qw + h * hd + i]);
            }
        }
        ref_linear(&lw->wo, 0, att, o);
        for (int i = 0; i < d; i++)
            x[t * d + i] += o[i];
    }
    free(xn), free(qg), free(q), free(gt), free(kk), free(vv), free(att), free(o), free(sc);
}

/* A Gated DeltaNet layer over all n_tok tokens from a zero state: x += Wout(o). */
static void ref_deltanet(const struct model *m, uint32_t l, float *x, int n_tok)
{
    const struct model_hparams *hp = &m->hp;
    const struct layer_weights *lw = &m->layers[l];
    const int D = (int)hp->n_embd, d = (int)hp->ssm_d_state, nk = (int)hp->ssm_n_k;
    const int nv = (int)hp->ssm_n_v, r = nv / nk, K = nk * d, V = nv * d, C = 2 * K + V;
    const int kc = (int)hp->ssm_d_conv;
    const float *cw = lw->ssm_conv.data, *an = lw->ssm_a.data, *dtb = lw->ssm_dt_b.data;
    float *xn = test_xmalloc(sizeof(float) * D), *raw = test_xmalloc(sizeof(float) * n_tok * C);
    float *cv = test_xmalloc(sizeof(float) * C), *z = test_xmalloc(sizeof(float) * V);
    float *bl = test_xmalloc(sizeof(float) * nv), *al = test_xmalloc(sizeof(float) * nv);
    float *ba = test_xmalloc(sizeof(float) * 2 * nv), *o = test_xmalloc(sizeof(float) * V);
    float *y = test_xmalloc(sizeof(float) * D);
    double *S = calloc((size_t)nv * d * d, sizeof(double));
    double qv[256], kv[256], mem[256], oh[256];

    for (int t = 0; t < n_tok; t++) {
        ref_rmsnorm(x + t * D, lw->attn_norm.data, D, hp->rms_eps, xn);
        ref_linear(&lw->ssm_qkv, 0, xn, raw + (size_t)t * C);
        ref_linear(&lw->ssm_z, 0, xn, z);
        if (hp->ssm_v_tiled) {
            ref_linear(&lw->ssm_beta, 0, xn, bl);
            ref_linear(&lw->ssm_alpha, 0, xn, al);
        } else {
            ref_linear(&lw->ssm_ba, 0, xn, ba);
            for (int j = 0; j < nv; j++) {
                bl[j] = ba[(j / r) * 2 * r + j % r];
                al[j] = ba[(j / r) * 2 * r + r + j % r];
            }
        }
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int j = 0; j < kc; j++) {
                int tt = t - (kc - 1) + j;
                if (tt >= 0)
                    s += (double)cw[c * kc + j] * raw[(size_t)tt * C + c];
            }
            cv[c] = silu((float)s);
        }
        for (int j = 0; j < nv; j++) {
            const int kh = hp->ssm_v_tiled ? j % nk : j / r;
            double nq = 0, nkk = 0;
            for (int i = 0; i < d; i++) {
                nq += (double)cv[kh * d + i] * cv[kh * d + i];
                nkk += (double)cv[K + kh * d + i] * cv[K + kh * d + i];
            }
            for (int i = 0; i < d; i++) {
                qv[i] = cv[kh * d + i] / sqrt(nq + 1e-6) / sqrt((double)d);
                kv[i] = cv[K + kh * d + i] / sqrt(nkk + 1e-6);
            }
            const double beta = sigm(bl[j]);
            const double sp = log1p(exp((double)al[j] + dtb[j]));
            const double decay = exp(an[j] * sp);
            double *Sj = S + (size_t)j * d * d;
            for (int b = 0; b < d; b++) {
                double acc = 0;
                for (int a = 0; a < d; a++) {
                    Sj[a * d + b] *= decay;
                    acc += Sj[a * d + b] * kv[a];
                }
                mem[b] = beta * (cv[2 * K + j * d + b] - acc);
            }
            for (int b = 0; b < d; b++) {
                double acc = 0;
                for (int a = 0; a < d; a++) {
                    Sj[a * d + b] += kv[a] * mem[b];
                    acc += Sj[a * d + b] * qv[a];
                }
                oh[b] = acc;
            }
            double ss = 0;
            for (int b = 0; b < d; b++)
                ss += oh[b] * oh[b];
            const double rn = 1.0 / sqrt(ss / d + hp->rms_eps);
            for (int b = 0; b < d; b++)
                o[j * d + b] = (float)(oh[b] * rn) * ((const float *)lw->ssm_norm.data)[b] *
                               silu(z[j * d + b]);
        }
        ref_linear(&lw->ssm_out, 0, o, y);
        for (int i = 0; i < D; i++)
            x[t * D + i] += y[i];
    }
    free(xn), free(raw), free(cv), free(z), free(bl), free(al), free(ba), free(o), free(y);
    free(S);
}

/* The routed experts and the shared expert of layer lw on every token: x += both. */
static void ref_moe(const struct model *m, const struct layer_weights *lw, float *x, int n_tok)
{
    const struct model_hparams *hp = &m->hp;
    const int D = (int)hp->n_embd, ff = (int)hp->n_ff_exp, fs = (int)hp->n_ff_shexp;
    const int ne = (int)hp->n_expert, k = (int)hp->n_expert_used;
    const int fm = ff > fs ? ff : fs;
    float *xn = test_xmalloc(sizeof(float) * D), *lg = test_xmalloc(sizeof(float) * ne);
    float *g = test_xmalloc(sizeof(float) * fm), *u = test_xmalloc(sizeof(float) * fm);
    float *y = test_xmalloc(sizeof(float) * D), *o = test_xmalloc(sizeof(float) * D);

    for (int t = 0; t < n_tok; t++) {
        ref_rmsnorm(x + t * D, lw->ffn_norm.data, D, hp->rms_eps, xn);
        ref_linear(&lw->router, 0, xn, lg);
        double mx = -INFINITY, den = 0;
        for (int e = 0; e < ne; e++)
            mx = fmax(mx, lg[e]);
        for (int e = 0; e < ne; e++)
            den += exp(lg[e] - mx);
        int sel[64];
        bool used[4096] = {0};
        double wsum = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < ne; e++)
                if (!used[e] && (best < 0 || lg[e] > lg[best]))
                    best = e;
            used[best] = true;
            sel[j] = best;
            wsum += exp(lg[best] - mx) / den;
        }
        for (int i = 0; i < D; i++)
            o[i] = 0;
        for (int j = 0; j < k; j++) {
            const int e = sel[j];
            const float wgt = (float)(exp(lg[e] - mx) / den / wsum);
            ref_linear(&lw->gate_exps, (uint64_t)e, xn, g);
            ref_linear(&lw->up_exps, (uint64_t)e, xn, u);
            for (int i = 0; i < ff; i++)
                g[i] = silu(g[i]) * u[i];
            ref_linear(&lw->down_exps, (uint64_t)e, g, y);
            for (int i = 0; i < D; i++)
                o[i] += wgt * y[i];
        }
        ref_linear(&lw->gate_shexp, 0, xn, g);
        ref_linear(&lw->up_shexp, 0, xn, u);
        for (int i = 0; i < fs; i++)
            g[i] = silu(g[i]) * u[i];
        ref_linear(&lw->down_shexp, 0, g, y);
        double gd = 0;
        for (int i = 0; i < D; i++)
            gd += (double)((const float *)lw->shexp_gate_inp.data)[i] * xn[i];
        const float sg = sigm((float)gd);
        for (int i = 0; i < D; i++)
            x[t * D + i] += o[i] + sg * y[i];
    }
    free(xn), free(lg), free(g), free(u), free(y), free(o);
}

/* Logits (n_tok, n_vocab) at every position of ids; hid (n_tok, n_embd), if not NULL,
 * receives the hidden states after the output norm. */
static float *ref_forward_hid(const struct model *m, const int32_t *ids, int n_tok, float *hid)
{
    const struct model_hparams *hp = &m->hp;
    const int D = (int)hp->n_embd, V = (int)hp->n_vocab;
    float *x = test_xmalloc(sizeof(float) * n_tok * D), *xn = test_xmalloc(sizeof(float) * D);
    float *logits = test_xmalloc(sizeof(float) * n_tok * V);

    for (int t = 0; t < n_tok; t++)
        test_ref_row(&m->tok_embd, 0, (uint64_t)ids[t], x + t * D);
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        if (model_layer_is_ssm(hp, l))
            ref_deltanet(m, l, x, n_tok);
        else
            ref_attention(m, &m->layers[l], x, n_tok);
        ref_moe(m, &m->layers[l], x, n_tok);
    }
    for (int t = 0; t < n_tok; t++) {
        ref_rmsnorm(x + t * D, m->output_norm.data, D, hp->rms_eps, xn);
        if (hid)
            memcpy(hid + (size_t)t * D, xn, sizeof(float) * D);
        ref_linear(&m->output, 0, xn, logits + (size_t)t * V);
    }
    free(x), free(xn);
    return logits;
}

static float *ref_forward(const struct model *m, const int32_t *ids, int n_tok)
{
    return ref_forward_hid(m, ids, n_tok, NULL);
}

/* The MTP block (docs/formats.md) over rows 0..n: row t joins hid[t] (the main model's hidden
 * state after the output norm) with the token nxt[t]: x = eh_proj [enorm(embedding) |
 * hnorm(hid)], at position t; the attention layer with the MoE and the shared expert; the head
 * norm into out (n, n_embd) and the output matrix into logits (n, n_vocab). */
static void ref_mtp(const struct model *m, const float *hid, const int32_t *nxt, int n, float *out,
                    float *logits)
{
    const struct model_hparams *hp = &m->hp;
    const struct mtp_weights *mw = m->mtp;
    const int D = (int)hp->n_embd, V = (int)hp->n_vocab;
    float *x = test_xmalloc(sizeof(float) * n * D), *cat = test_xmalloc(sizeof(float) * 2 * D);
    float *e = test_xmalloc(sizeof(float) * D);

    for (int t = 0; t < n; t++) {
        test_ref_row(&m->tok_embd, 0, (uint64_t)nxt[t], e);
        ref_rmsnorm(e, mw->enorm.data, D, hp->rms_eps, cat);
        ref_rmsnorm(hid + (size_t)t * D, mw->hnorm.data, D, hp->rms_eps, cat + D);
        ref_linear(&mw->eh_proj, 0, cat, x + (size_t)t * D);
    }
    ref_attention(m, &mw->lw, x, n);
    ref_moe(m, &mw->lw, x, n);
    for (int t = 0; t < n; t++) {
        ref_rmsnorm(x + (size_t)t * D, mw->head_norm.data, D, hp->rms_eps, out + (size_t)t * D);
        ref_linear(&m->output, 0, out + (size_t)t * D, logits + (size_t)t * V);
    }
    free(x), free(cat), free(e);
}

static int32_t argmax(const float *v, int n)
{
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

/* ---- strata against it --------------------------------------------------------------------- */

/* The backend's delta-rule calls, counted by gdn_args.chunk_ok, then forwarded. */
static const struct backend_ops *gdn_inner;
static struct backend_ops gdn_spy_ops;
static int gdn_calls[2];

static int gdn_spy(struct backend *b, const struct gdn_args *a)
{
    gdn_calls[a->chunk_ok]++;
    return gdn_inner->gdn(b, a);
}

static struct strata *open_cpu(const char *path)
{
    struct strata_config cfg;
    struct strata *s = NULL;
    strata_config_init(&cfg);
    cfg.model_path = path;
    cfg.device = STRATA_DEVICE_CPU;
    cfg.n_threads = 2;
    cfg.n_ctx = N_CTX;
    cfg.n_batch = 16; /* prefill chunks of 16: the recurrent state crosses chunk boundaries */
    int rc = strata_open(&cfg, &s);
    CHECK(rc == 0, "strata_open %s: %s", path, strata_error());
    if (rc)
        return NULL;
    struct backend *b = strata_backend_of(s);
    gdn_inner = b->ops;
    gdn_spy_ops = *b->ops;
    gdn_spy_ops.gdn = gdn_spy;
    b->ops = &gdn_spy_ops;
    return s;
}

static double err_at(const float *lg, const float *ref, int t, int V)
{
    return test_norm_rel_err(lg, ref + (size_t)t * V, V);
}

static void check_file(const char *path, const char *label, double tol, bool exact_greedy)
{
    struct strata *s = open_cpu(path);
    if (!s)
        return;
    const struct model *m = strata_model_of(s);
    const int V = (int)m->hp.n_vocab;
    int32_t ids[N_TOK + N_GREEDY];
    for (int i = 0; i < N_TOK; i++)
        ids[i] = (int32_t)((i * 7919 + 13) % V);
    float *ref = ref_forward(m, ids, N_TOK);
    float *lg = test_xmalloc(sizeof(float) * V);
    struct strata_stream *st = NULL;
    double worst = 0, e;

    CHECK(strata_stream_open(s, N_CTX, &st) == 0, "stream: %s", strata_error());
    gdn_calls[0] = gdn_calls[1] = 0;
    CHECK(strata_eval(st, ids, N_TOK, lg) == 0, "eval: %s", strata_error());
    CHECK(gdn_calls[1] > 0 && gdn_calls[0] == 0,
          "%s prefill: %d delta-rule calls allow a chunked form, %d do not", label, gdn_calls[1],
          gdn_calls[0]);
    worst = fmax(worst, e = err_at(lg, ref, N_TOK - 1, V));
    CHECK(e < tol, "%s prefill: rel err %.3g", label, e);
    CHECK(strata_stream_truncate(st, 0) == 0, "truncate: %s", strata_error());
    for (int t = 0; t < N_TOK; t++) {
        CHECK(strata_eval(st, ids + t, 1, lg) == 0, "eval: %s", strata_error());
        worst = fmax(worst, e = err_at(lg, ref, t, V));
        CHECK(e < tol, "%s decode position %d: rel err %.3g", label, t, e);
    }
    CHECK(strata_stream_truncate(st, 0) == 0, "truncate: %s", strata_error());
    const int chunks[3] = {3, 9, 28};
    for (int c = 0, at = 0; c < 3; at += chunks[c], c++) {
        CHECK(strata_eval(st, ids + at, chunks[c], lg) == 0, "eval: %s", strata_error());
        worst = fmax(worst, e = err_at(lg, ref, at + chunks[c] - 1, V));
        CHECK(e < tol, "%s chunk %d: rel err %.3g", label, c, e);
    }
    /* a rewind: the recurrent state is rebuilt from the kept ids */
    CHECK(strata_stream_truncate(st, 23) == 0, "truncate to 23: %s", strata_error());
    CHECK(strata_stream_pos(st) == 23, "position after the rewind: %d", strata_stream_pos(st));
    CHECK(strata_eval(st, ids + 23, N_TOK - 23, lg) == 0, "eval: %s", strata_error());
    worst = fmax(worst, e = err_at(lg, ref, N_TOK - 1, V));
    CHECK(e < tol, "%s after a rewind to 23: rel err %.3g", label, e);
    printf("  %s: logits vs reference, worst rel err %.3g over prefill, %d decode steps, "
           "chunks and a rewind\n",
           label, worst, N_TOK);

    int32_t got[N_GREEDY];
    CHECK(strata_stream_truncate(st, 0) == 0, "truncate: %s", strata_error());
    CHECK(strata_eval(st, ids, N_TOK, lg) == 0, "eval: %s", strata_error());
    for (int i = 0; i < N_GREEDY; i++) {
        got[i] = argmax(lg, V);
        CHECK(strata_eval(st, &got[i], 1, lg) == 0, "eval: %s", strata_error());
    }
    memcpy(ids + N_TOK, got, sizeof(got));
    float *ref2 = ref_forward(m, ids, N_TOK + N_GREEDY - 1);
    int same = 0;
    for (int i = 0; i < N_GREEDY; i++)
        same += argmax(ref2 + (size_t)(N_TOK - 1 + i) * V, V) == got[i];
    CHECK(same == N_GREEDY || !exact_greedy, "%s greedy: %d of %d tokens are the reference's",
          label, same, N_GREEDY);
    printf("  %s: greedy %d of %d tokens identical to the reference\n", label, same, N_GREEDY);
    free(ref2);

    /* lockstep: three streams at positions 0, 17 and 35, one row each */
    struct strata_stream *sts[3] = {NULL, NULL, NULL};
    struct strata_batch *bt = NULL;
    const int pre[3] = {0, 17, 35};
    for (int i = 0; i < 3; i++) {
        CHECK(strata_stream_open(s, N_CTX, &sts[i]) == 0, "stream: %s", strata_error());
        if (pre[i])
            CHECK(strata_eval(sts[i], ids, pre[i], lg) == 0, "eval: %s", strata_error());
    }
    CHECK(strata_batch_open(s, 3, &bt) == 0, "batch: %s", strata_error());
    float *rows = test_xmalloc(sizeof(float) * 3 * V);
    int32_t next[3];
    for (int i = 0; i < 3; i++)
        next[i] = ids[pre[i]];
    gdn_calls[0] = gdn_calls[1] = 0;
    CHECK(strata_batch_eval(bt, sts, 3, next, rows) == 0, "batch eval: %s", strata_error());
    double be = 0;
    for (int i = 0; i < 3; i++)
        be = fmax(be, err_at(rows + (size_t)i * V, ref, pre[i], V));
    CHECK(be < tol, "%s lockstep rows: rel err %.3g", label, be);
    printf("  %s: lockstep batch of 3 streams at positions 0, 17, 35: rel err %.3g\n", label, be);
    strata_batch_close(bt);

    /* a step of 5 rows of one stream (at 18) beside 1 of another (at 36), every row's logits;
     * then rewinds: into those rows (the checkpoint taken before them), and before them (the
     * stream starts over) */
    bt = NULL;
    CHECK(strata_batch_open_rows(s, 2, 8, &bt) == 0, "batch rows: %s", strata_error());
    struct strata_stream *two[2] = {sts[1], sts[2]};
    const int n_tok[2] = {5, 1};
    int32_t step[6];
    memcpy(step, ids + 18, 5 * sizeof(int32_t));
    step[5] = ids[36];
    float *all = test_xmalloc(sizeof(float) * 6 * V);
    CHECK(strata_batch_eval_rows(bt, two, n_tok, 2, step, all) == 0, "rows: %s", strata_error());
    CHECK(gdn_calls[0] > 0 && gdn_calls[1] == 0,
          "%s lockstep rows: %d delta-rule calls allow a chunked form", label, gdn_calls[1]);
    double re = 0;
    for (int i = 0; i < 5; i++)
        re = fmax(re, err_at(all + (size_t)i * V, ref, 18 + i, V));
    re = fmax(re, err_at(all + (size_t)5 * V, ref, 36, V));
    CHECK(re < tol, "%s 5 + 1 rows: rel err %.3g", label, re);
    const int back[2] = {20, 10}; /* after the checkpoint at 18, before it */
    double we = 0;
    for (int i = 0; i < 2; i++) {
        CHECK(strata_stream_truncate(sts[1], back[i]) == 0, "truncate: %s", strata_error());
        CHECK(strata_stream_pos(sts[1]) == back[i], "position %d", strata_stream_pos(sts[1]));
        CHECK(strata_eval(sts[1], ids + back[i], 1, lg) == 0, "eval: %s", strata_error());
        we = fmax(we, err_at(lg, ref, back[i], V));
    }
    CHECK(we < tol, "%s rewinds to 20 and 10 after the rows: rel err %.3g", label, we);
    printf("  %s: 5 + 1 rows of two streams: rel err %.3g; rewinds into and before them: %.3g\n",
           label, re, we);
    free(all);
    strata_batch_close(bt);
    for (int i = 0; i < 3; i++)
        strata_stream_close(sts[i]);
    free(rows);
    strata_stream_close(st);
    free(lg);
    free(ref);
    strata_close(s);
}

static void count_one(struct weight *w, void *arg)
{
    (void)w;
    (*(unsigned *)arg)++;
}

/* A file with an MTP block (gen --mtp 1): the loader fills m->mtp (nextn tensors at block
 * n_layer, an attention layer's weights) unless skip_mtp; the main forward is the same either
 * way; the weights are visited (and so copied by --no-mmap and uploaded by CUDA) once each. */
static void check_mtp(const char *dir)
{
    char path[256];
    struct gen_preset p = *gen_preset_find_arch("qwen35moe", "tiny");
    p.n_nextn = 1;
    snprintf(path, sizeof(path), "%s/mtp.gguf", dir);
    struct gen_config cfg = {.arch = "qwen35moe", .preset = p, .mix = QUANT_MIX_Q8_0, .seed = 3,
                             .n_threads = 2, .out_path = path};
    CHECK(gen_file_write(&cfg, NULL) == 0, "gen mtp: %s", err_msg());
    struct model *m = NULL, *k = NULL;
    struct model_open_opts skip = {.skip_mtp = true};
    CHECK(model_open(path, &m) == 0, "open: %s", err_msg());
    CHECK(model_open_opts(path, &skip, &k) == 0, "open --no-mtp: %s", err_msg());
    if (!m || !k) {
        model_close(m), model_close(k);
        unlink(path);
        return;
    }
    const uint64_t H = m->hp.n_embd;
    CHECK(m->hp.n_layer == p.n_layer && m->hp.n_nextn == 1, "layers %u, nextn %u", m->hp.n_layer,
          m->hp.n_nextn);
    CHECK(m->mtp && !k->mtp, "mtp %p (skipped: %p)", (void *)m->mtp, (void *)k->mtp);
    if (m->mtp) {
        const struct mtp_weights *mt = m->mtp;
        char want[64];
        snprintf(want, sizeof(want), "blk.%u.nextn.eh_proj.weight", p.n_layer);
        CHECK(!strcmp(mt->eh_proj.name, want) && mt->eh_proj.ne[0] == 2 * H &&
                  mt->eh_proj.ne[1] == H,
              "eh_proj %s %llu x %llu", mt->eh_proj.name, (unsigned long long)mt->eh_proj.ne[0],
              (unsigned long long)mt->eh_proj.ne[1]);
        CHECK(mt->enorm.data && mt->hnorm.data && mt->head_norm.data &&
                  mt->head_norm.data != m->output_norm.data,
              "the MTP norms");
        CHECK(mt->lw.wq.ne[1] == 2 * (uint64_t)p.n_head * p.head_dim && mt->lw.q_norm.data &&
                  mt->lw.gate_exps.ne[2] == p.n_expert && mt->lw.down_shexp.data &&
                  !mt->lw.ssm_qkv.data,
              "the MTP layer is an attention layer with the MoE and the shared expert");
    }
    unsigned nm = 0, nk = 0;
    model_weights_each(m, count_one, &nm);
    model_weights_each(k, count_one, &nk);
    CHECK(nm == nk + 4 + 16, "weights visited: %u with MTP, %u without", nm, nk);
    model_close(m);
    model_close(k);
    /* the main forward ignores the block; --no-mmap's copy rebases it */
    const int32_t ids[5] = {11, 503, 77, 900, 3};
    float *la = NULL, *lb = NULL;
    for (int i = 0; i < 2; i++) {
        struct strata_config sc;
        struct strata *s = NULL;
        struct strata_stream *st = NULL;
        strata_config_init(&sc);
        sc.model_path = path;
        sc.device = STRATA_DEVICE_CPU;
        sc.n_threads = 2;
        sc.n_ctx = 32;
        sc.flags = i ? STRATA_FLAG_NO_MTP : STRATA_FLAG_NO_MMAP;
        float *lg = test_xmalloc(sizeof(float) * 1024);
        CHECK(strata_open(&sc, &s) == 0, "strata_open: %s", strata_error());
        CHECK(s && strata_stream_open(s, 32, &st) == 0, "stream: %s", strata_error());
        CHECK(st && strata_eval(st, ids, 5, lg) == 0, "eval: %s", strata_error());
        strata_stream_close(st);
        strata_close(s);
        *(i ? &lb : &la) = lg;
    }
    CHECK(!memcmp(la, lb, sizeof(float) * 1024), "logits with and without the MTP block differ");
    printf("  qwen35moe with an MTP block: loaded (%u weights, 20 of them its own), skipped with "
           "--no-mtp, the same logits either way\n",
           nm);
    free(la), free(lb);
    unlink(path);
}

#define MTP_K 3

/* After the stream holds ids[0..N_TOK): drafts after token nxt (k = 1, then MTP_K) against
 * the reference's chain; the relative errors of the block's last logits in *e1 (k = 1) and *ek
 * (the MTP_K-th row). */
static void mtp_probe(struct strata_stream *st, int32_t nxt, const float *ref_lg,
                      const int32_t *ref_d, const char *what, double tol, double *worst)
{
    struct stream *s = strata_stream_of(st);
    const int V = (int)s->m->hp.n_vocab;
    float *lg = test_xmalloc(sizeof(float) * V);
    int32_t d[MTP_K];
    int n = mtp_draft(s, nxt, 1, d);
    CHECK(n == 1 && s->b->ops->read(s->b, lg, s->mtp->logits, (size_t)V) == 0,
          "%s: draft 1: %d (%s)", what, n, err_msg());
    double e1 = test_norm_rel_err(lg, ref_lg + (size_t)(N_TOK - 1) * V, V);
    n = mtp_draft(s, nxt, MTP_K, d);
    CHECK(n == MTP_K && s->b->ops->read(s->b, lg, s->mtp->logits, (size_t)V) == 0,
          "%s: %d drafts: %d (%s)", what, MTP_K, n, err_msg());
    double ek = test_norm_rel_err(lg, ref_lg + (size_t)(N_TOK + MTP_K - 2) * V, V);
    CHECK(e1 < tol && ek < tol, "%s: MTP logits rel err %.3g (row 1), %.3g (row %d)", what, e1, ek,
          MTP_K);
    CHECK(!memcmp(d, ref_d, sizeof(d)), "%s: drafts %d %d %d, the reference's %d %d %d", what, d[0],
          d[1], d[2], ref_d[0], ref_d[1], ref_d[2]);
    *worst = fmax(*worst, fmax(e1, ek));
    free(lg);
}

/* The MTP block's forward (runtime/mtp.h, the arch's mtp_forward) against ref_mtp on a tiny f32
 * file with a block: the stream's rows through prefill in chunks, token by token, a rewind,
 * and the rows of a verify pass with a rewind into them; the drafts chain the block's own
 * output. */
static void check_mtp_forward(const char *dir, const char *arch)
{
    char path[256];
    struct gen_preset p = *gen_preset_find_arch(arch, "tiny");
    p.n_nextn = 1;
    snprintf(path, sizeof(path), "%s/mtp-fwd.gguf", dir);
    struct gen_config cfg = {.arch = arch,
                             .preset = p,
                             .mix = QUANT_MIX_F32,
                             .seed = 5,
                             .n_threads = 2,
                             .out_path = path};
    CHECK(gen_file_write(&cfg, NULL) == 0, "gen mtp: %s", err_msg());
    struct strata *s = open_cpu(path);
    if (!s) {
        unlink(path);
        return;
    }
    const struct model *m = strata_model_of(s);
    const int V = (int)m->hp.n_vocab, D = (int)m->hp.n_embd, R = N_TOK + MTP_K - 1;
    int32_t ids[N_TOK], nxt[N_TOK + MTP_K];
    for (int i = 0; i < N_TOK; i++)
        ids[i] = (int32_t)((i * 7919 + 13) % V);
    const int32_t next = 321;
    float *hid = test_xmalloc(sizeof(float) * R * D), *out = test_xmalloc(sizeof(float) * R * D);
    float *rl = test_xmalloc(sizeof(float) * (size_t)R * V);
    free(ref_forward_hid(m, ids, N_TOK, hid));
    for (int t = 0; t + 1 < N_TOK; t++)
        nxt[t] = ids[t + 1];
    nxt[N_TOK - 1] = next;
    int32_t rd[MTP_K];
    for (int j = 0; j < MTP_K; j++) { /* row N_TOK - 1 + j: its draft, then the chain's row */
        ref_mtp(m, hid, nxt, N_TOK + j, out, rl);
        rd[j] = argmax(rl + (size_t)(N_TOK - 1 + j) * V, V);
        if (j + 1 == MTP_K)
            break;
        memcpy(hid + (size_t)(N_TOK + j) * D, out + (size_t)(N_TOK - 1 + j) * D, sizeof(float) * D);
        nxt[N_TOK + j] = rd[j];
    }

    struct strata_stream *st = NULL;
    struct strata_mtp *mtp = NULL;
    double worst = 0;
    const double tol = 1e-4;
    CHECK(strata_stream_open(s, N_CTX, &st) == 0, "stream: %s", strata_error());
    CHECK(st && strata_mtp_open(st, &mtp) == 0, "mtp: %s", strata_error());
    if (!mtp)
        goto out;
    CHECK(strata_eval(st, ids, N_TOK, NULL) == 0, "eval: %s", strata_error());
    mtp_probe(st, next, rl, rd, "prefill in chunks of 16", tol, &worst);
    CHECK(strata_stream_truncate(st, 0) == 0, "truncate: %s", strata_error());
    for (int t = 0; t < N_TOK; t++)
        CHECK(strata_eval(st, ids + t, 1, NULL) == 0, "eval: %s", strata_error());
    mtp_probe(st, next, rl, rd, "token by token", tol, &worst);
    CHECK(strata_stream_truncate(st, 23) == 0, "truncate: %s", strata_error());
    CHECK(strata_eval(st, ids + 23, N_TOK - 23, NULL) == 0, "eval: %s", strata_error());
    mtp_probe(st, next, rl, rd, "a rewind to 23", tol, &worst);
    /* a verify pass's rows (30..39 in one step), a rewind into them (its checkpoint), the rest */
    struct strata_batch *bt = NULL;
    float *rows = test_xmalloc(sizeof(float) * 10 * (size_t)V);
    const int ten = 10;
    CHECK(strata_stream_truncate(st, 30) == 0, "truncate: %s", strata_error());
    CHECK(strata_batch_open_rows(s, 1, 10, &bt) == 0, "batch: %s", strata_error());
    CHECK(bt && strata_batch_eval_rows(bt, &st, &ten, 1, ids + 30, rows) == 0, "rows: %s",
          strata_error());
    mtp_probe(st, next, rl, rd, "a step of 10 rows", tol, &worst);
    CHECK(strata_stream_truncate(st, 36) == 0, "truncate: %s", strata_error());
    CHECK(strata_eval(st, ids + 36, N_TOK - 36, NULL) == 0, "eval: %s", strata_error());
    mtp_probe(st, next, rl, rd, "a rewind into the step's rows", tol, &worst);
    /* a rewind onto the step's checkpoint (30): nothing is evaluated again, the last hidden
     * state comes back with the checkpoint; the draft after ids[30] is the reference's row 29 */
    float *rl30 = test_xmalloc(sizeof(float) * 30 * (size_t)V);
    ref_mtp(m, hid, nxt, 30, out, rl30);
    float *lg = test_xmalloc(sizeof(float) * V);
    struct stream *ss = strata_stream_of(st);
    int32_t d1 = -1;
    CHECK(strata_stream_truncate(st, 30) == 0 && ss->ckpt_pos == 30,
          "truncate to the "
          "checkpoint: %s (checkpoint at %d)",
          strata_error(), ss->ckpt_pos);
    CHECK(mtp_draft(ss, ids[30], 1, &d1) == 1 &&
              ss->b->ops->read(ss->b, lg, ss->mtp->logits, (size_t)V) == 0,
          "no draft after a rewind onto the checkpoint");
    double ec = test_norm_rel_err(lg, rl30 + (size_t)29 * V, V);
    CHECK(d1 == argmax(rl30 + (size_t)29 * V, V) && ec < tol,
          "after a rewind onto the checkpoint: draft %d, the reference's %d, rel err %.3g", d1,
          argmax(rl30 + (size_t)29 * V, V), ec);
    worst = fmax(worst, ec);
    free(rl30), free(lg);
    strata_batch_close(bt);
    free(rows);
    printf("  %s MTP block vs reference: worst rel err %.3g of its logits, drafts %d %d %d equal "
           "over prefill, decode, rewinds and a step's rows\n",
           arch, worst, rd[0], rd[1], rd[2]);
out:
    strata_mtp_close(mtp);
    strata_stream_close(st);
    strata_close(s);
    free(hid), free(out), free(rl);
    unlink(path);
}

/* --spec mtp's refusals: a file without a block, and one opened with STRATA_FLAG_NO_MTP. */
static void check_mtp_refusals(const char *dir)
{
    char path[256];
    for (int i = 0; i < 2; i++) {
        struct gen_preset p = *gen_preset_find_arch("qwen3next", "tiny");
        p.n_nextn = (uint32_t)i;
        snprintf(path, sizeof(path), "%s/mtp-refuse.gguf", dir);
        struct gen_config cfg = {.arch = "qwen3next",
                                 .preset = p,
                                 .mix = QUANT_MIX_Q8_0,
                                 .seed = 1,
                                 .n_threads = 2,
                                 .out_path = path};
        CHECK(gen_file_write(&cfg, NULL) == 0, "gen: %s", err_msg());
        struct strata_config sc;
        struct strata *s = NULL;
        struct strata_stream *st = NULL;
        struct strata_mtp *mtp = NULL;
        strata_config_init(&sc);
        sc.model_path = path;
        sc.device = STRATA_DEVICE_CPU;
        sc.n_threads = 2;
        sc.n_ctx = 32;
        sc.flags = i ? STRATA_FLAG_NO_MTP : 0;
        CHECK(strata_open(&sc, &s) == 0, "open: %s", strata_error());
        CHECK(s && strata_stream_open(s, 32, &st) == 0, "stream: %s", strata_error());
        int rc = st ? strata_mtp_open(st, &mtp) : 0;
        const char *want =
            i ? "the MTP block was not loaded (--no-mtp)" : "this model has no MTP block";
        CHECK(rc == -ENOTSUP && strstr(strata_error(), want), "%s: %d '%s'", want, rc,
              strata_error());
        strata_mtp_close(mtp);
        strata_stream_close(st);
        strata_close(s);
        unlink(path);
    }
    printf("  --spec mtp refused without a block and with --no-mtp\n");
}

int main(void)
{
    char dir[] = "/tmp/strata_q3n_fwd_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    const char *arches[2] = {"qwen3next", "qwen35moe"};
    const int mixes[2] = {QUANT_MIX_F32, QUANT_MIX_Q8_0};
    const double tols[2] = {1e-4, 1e-1};
    for (int a = 0; a < 2; a++) {
        const struct gen_preset *p = gen_preset_find_arch(arches[a], "tiny");
        CHECK(p != NULL, "gen has no tiny %s preset", arches[a]);
        if (!p)
            continue;
        for (int i = 0; i < 2; i++) {
            char path[256], label[64];
            snprintf(path, sizeof(path), "%s/%s-%d.gguf", dir, arches[a], i);
            snprintf(label, sizeof(label), "%s %s", arches[a], i ? "q8_0" : "f32");
            struct gen_config cfg = {.arch = arches[a],
                                     .preset = *p,
                                     .mix = mixes[i],
                                     .seed = 1,
                                     .n_threads = 2,
                                     .out_path = path};
            int rc = gen_file_write(&cfg, NULL);
            CHECK(rc == 0, "gen %s: %s", label, err_msg());
            if (!rc) {
                ref_q8_act = mixes[i] != QUANT_MIX_F32;
                check_file(path, label, tols[i], mixes[i] == QUANT_MIX_F32);
            }
            unlink(path);
        }
    }
    check_mtp(dir);
    check_mtp_forward(dir, "qwen3next");
    check_mtp_forward(dir, "qwen35moe");
    check_mtp_refusals(dir);
    rmdir(dir);
    return test_finish("test_qwen3next_forward");
}
