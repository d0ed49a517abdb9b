/* model_qwen3next: the loader of qwen3next (Qwen3-Next-80B-A3B) and qwen35moe (Qwen3.5 /
 * Qwen3.6 MoE): hybrid models whose layers are Gated DeltaNet (a linear attention with a
 * recurrent state) except every full_attention_interval-th, which is gated attention; every
 * layer has routed experts and a shared expert. The two differ in how a Gated DeltaNet layer
 * stores its beta/alpha projections (one grouped ssm_ba, or ssm_beta + ssm_alpha) and in which
 * q/k head a value head reads. Formats: docs/formats.md (qwen3next); the forward is
 * runtime/arch/qwen3next.c. The first MTP block (nextn_predict_layers) is loaded into m->mtp
 * unless the opener skips it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "gguf.h"
#include "model.h"
#include "model_arch.h"

static const char *q3n_arch(const struct model *m)
{
    return m->arch->name;
}

static int q3n_hparams_read(struct model *m, uint32_t *value_length, uint32_t *inner,
                            uint32_t *blocks)
{
    struct model_hparams *hp = &m->hp;
    int rc = 0;

    rc = rc ? rc : model_arch_u32(m, "block_count", blocks);
    rc = rc ? rc : model_arch_u32(m, "embedding_length", &hp->n_embd);
    rc = rc ? rc : model_arch_u32(m, "attention.head_count", &hp->n_head);
    rc = rc ? rc : model_arch_u32(m, "attention.head_count_kv", &hp->n_head_kv);
    rc = rc ? rc : model_arch_u32(m, "attention.key_length", &hp->head_dim);
    rc = rc ? rc : model_arch_u32(m, "expert_count", &hp->n_expert);
    rc = rc ? rc : model_arch_u32(m, "expert_used_count", &hp->n_expert_used);
    rc = rc ? rc : model_arch_u32(m, "expert_feed_forward_length", &hp->n_ff_exp);
    rc = rc ? rc : model_arch_u32(m, "expert_shared_feed_forward_length", &hp->n_ff_shexp);
    rc = rc ? rc : model_arch_u32(m, "ssm.conv_kernel", &hp->ssm_d_conv);
    rc = rc ? rc : model_arch_u32(m, "ssm.state_size", &hp->ssm_d_state);
    rc = rc ? rc : model_arch_u32(m, "ssm.group_count", &hp->ssm_n_k);
    rc = rc ? rc : model_arch_u32(m, "ssm.time_step_rank", &hp->ssm_n_v);
    rc = rc ? rc : model_arch_u32(m, "ssm.inner_size", inner);
    rc = rc ? rc : model_arch_u32(m, "rope.dimension_count", &hp->n_rot);
    rc = rc ? rc : model_arch_f32(m, "attention.layer_norm_rms_epsilon", &hp->rms_eps);
    rc = rc ? rc : model_arch_f32(m, "rope.freq_base", &hp->rope_base);
    /* optional keys: absent takes the default; present but of a wrong type is refused */
    rc = rc ? rc : model_arch_u32_or(m, "attention.value_length", hp->head_dim, value_length);
    rc = rc ? rc : model_arch_u32_or(m, "full_attention_interval", 4, &hp->full_attn_interval);
    rc = rc ? rc : model_arch_u32_or(m, "nextn_predict_layers", 0, &hp->n_nextn);
    rc = rc ? rc : model_arch_u32_or(m, "context_length", 4096, &hp->n_ctx_train);
    return rc;
}

/* rope.dimension_sections (qwen35moe's M-RoPE sections, optional): text positions rotate the
 * same pairs whatever the sections, so strata only checks that they cover n_rot/2 pairs. */
static int q3n_rope_sections(const struct model *m)
{
    char key[128];
    const struct gguf_value *v;
    snprintf(key, sizeof(key), "%s.rope.dimension_sections", q3n_arch(m));
    int rc = gguf_get_arr(m->file, key, &v);
    if (rc == -ENOENT) {
        err_clear();
        return 0;
    }
    if (rc)
        return rc;
    if (v->arr.elem_type != GGUF_TYPE_INT32 && v->arr.elem_type != GGUF_TYPE_UINT32)
        return err_set(-EINVAL, "%s is not an integer array", key);
    uint64_t sum = 0;
    const uint8_t *p = v->arr.data;
    for (uint64_t i = 0; i < v->arr.count; i++) {
        int32_t x;
        memcpy(&x, p + 4 * i, 4);
        if (x < 0)
            return err_set(-EINVAL, "%s[%llu] is %d", key, (unsigned long long)i, (int)x);
        sum += (uint64_t)x;
    }
    if (sum * 2 != m->hp.n_rot)
        return err_set(-EINVAL, "%s sums to %llu pairs but rope.dimension_count is %u", key,
                       (unsigned long long)sum, m->hp.n_rot);
    return 0;
}

static int q3n_hparams(struct model *m)
{
    struct model_hparams *hp = &m->hp;
    const char *a = q3n_arch(m);
    uint32_t value_length = 0, inner = 0, blocks = 0;
    int rc = q3n_hparams_read(m, &value_length, &inner, &blocks);

    if (rc)
        return rc;
    if (!blocks || !hp->n_embd || !hp->n_head || !hp->n_head_kv || !hp->head_dim || !hp->n_expert ||
        !hp->n_expert_used || !hp->n_ff_exp || !hp->n_ff_shexp || !hp->ssm_d_conv ||
        !hp->ssm_d_state || !hp->ssm_n_k || !hp->ssm_n_v || !hp->n_rot || !hp->full_attn_interval)
        return err_set(-EINVAL,
                       "%s: a size key is zero (blocks %u, embd %u, heads %u/%u, head dim %u, "
                       "experts %u used %u, expert ffn %u, shared ffn %u, conv %u, state %u, "
                       "groups %u, v heads %u, rope dims %u, full attention interval %u)",
                       a, blocks, hp->n_embd, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_expert,
                       hp->n_expert_used, hp->n_ff_exp, hp->n_ff_shexp, hp->ssm_d_conv,
                       hp->ssm_d_state, hp->ssm_n_k, hp->ssm_n_v, hp->n_rot,
                       hp->full_attn_interval);
    if (hp->n_nextn >= blocks)
        return err_set(-EINVAL, "%s: nextn_predict_layers %u leaves no layer of block_count %u", a,
                       hp->n_nextn, blocks);
    hp->n_layer = blocks - hp->n_nextn;
    if (!hp->n_ctx_train)
        return err_set(-EINVAL, "%s.context_length is 0", a);
    if (value_length != hp->head_dim)
        return err_set(-EINVAL, "%s: value_length %u differs from key_length %u", a, value_length,
                       hp->head_dim);
    if (hp->n_head % hp->n_head_kv)
        return err_set(-EINVAL, "%s: head_count %u is not a multiple of head_count_kv %u", a,
                       hp->n_head, hp->n_head_kv);
    if (hp->n_expert_used > hp->n_expert || hp->n_expert > 4096)
        return err_set(-EINVAL, "%s: expert_used_count %u with expert_count %u", a,
                       hp->n_expert_used, hp->n_expert);
    if (hp->head_dim % 2 || hp->head_dim > 1024 || hp->n_layer > 4096 || hp->n_head > 4096)
        return err_set(-EINVAL, "%s: head dim %u / %u heads / %u layers not supported", a,
                       hp->head_dim, hp->n_head, hp->n_layer);
    if (hp->n_rot % 2 || hp->n_rot > hp->head_dim)
        return err_set(-EINVAL, "%s.rope.dimension_count %u: an even count <= head dim %u", a,
                       hp->n_rot, hp->head_dim);
    if (hp->ssm_n_v % hp->ssm_n_k || hp->ssm_n_v > 4096)
        return err_set(-EINVAL,
                       "%s: ssm.time_step_rank %u (v heads) is not a multiple of "
                       "ssm.group_count %u (q/k heads)",
                       a, hp->ssm_n_v, hp->ssm_n_k);
    if (hp->ssm_d_state > 256 || hp->ssm_d_conv > 16)
        return err_set(-EINVAL,
                       "%s: ssm.state_size %u (<= 256) / ssm.conv_kernel %u (<= 16) not "
                       "supported",
                       a, hp->ssm_d_state, hp->ssm_d_conv);
    if ((uint64_t)hp->ssm_n_v * hp->ssm_d_state != inner)
        return err_set(-EINVAL,
                       "%s.ssm.inner_size %u is not time_step_rank %u x state_size %u "
                       "(strata reads v heads as wide as the state)",
                       a, inner, hp->ssm_n_v, hp->ssm_d_state);
    if (!isfinite(hp->rms_eps) || !(hp->rms_eps > 0.0f))
        return err_set(-EINVAL,
                       "%s.attention.layer_norm_rms_epsilon is %g: it must be finite "
                       "and positive",
                       a, hp->rms_eps);
    if (!isfinite(hp->rope_base) || !(hp->rope_base > 0.0f))
        return err_set(-EINVAL, "%s.rope.freq_base is %g: it must be finite and positive", a,
                       hp->rope_base);
    hp->attn_gated = true;
    hp->ssm_v_tiled = !strcmp(a, "qwen35moe");
    return q3n_rope_sections(m);
}

/* Loads blk.L.NAME with the given dims (NAME includes its suffix). */
static int q3n_tensor(const struct model *m, uint32_t l, const char *name, uint32_t n_dims,
                      uint64_t a, uint64_t b, uint64_t c, struct weight *w)
{
    char full[96];
    uint64_t ne[3] = {a, b, c};
    snprintf(full, sizeof(full), "blk.%u.%s", l, name);
    return model_weight_get(m, full, n_dims, ne, w);
}

/* F32 and finite: norms, routers, the conv and the recurrence's scalars. */
static int q3n_small(uint32_t l, const struct weight *w)
{
    if (w->type)
        return err_set(-EINVAL, "layer %u: %s must be F32", l, w->name);
    return model_check_finite(w);
}

static int q3n_layer_ssm(struct model *m, uint32_t l)
{
    const struct model_hparams *hp = &m->hp;
    struct layer_weights *lw = &m->layers[l];
    uint64_t e = hp->n_embd, d = hp->ssm_d_state, nv = hp->ssm_n_v;
    uint64_t kw = hp->ssm_n_k * d, vw = nv * d, c = 2 * kw + vw;
    char full[64];
    int rc = 0;

    snprintf(full, sizeof(full), "blk.%u.ssm_in.weight", l);
    if (gguf_find_tensor(m->file, full))
        return err_set(-EINVAL,
                       "tensor '%s': the fused qkvz layout of early qwen3next "
                       "conversions is not read; reconvert the checkpoint (strata "
                       "convert writes attn_qkv and attn_gate)",
                       full);
    rc = rc ? rc : q3n_tensor(m, l, "attn_qkv.weight", 2, e, c, 1, &lw->ssm_qkv);
    rc = rc ? rc : q3n_tensor(m, l, "attn_gate.weight", 2, e, vw, 1, &lw->ssm_z);
    if (hp->ssm_v_tiled) {
        rc = rc ? rc : q3n_tensor(m, l, "ssm_beta.weight", 2, e, nv, 1, &lw->ssm_beta);
        rc = rc ? rc : q3n_tensor(m, l, "ssm_alpha.weight", 2, e, nv, 1, &lw->ssm_alpha);
    } else {
        rc = rc ? rc : q3n_tensor(m, l, "ssm_ba.weight", 2, e, 2 * nv, 1, &lw->ssm_ba);
    }
    rc = rc ? rc : q3n_tensor(m, l, "ssm_conv1d.weight", 2, hp->ssm_d_conv, c, 1, &lw->ssm_conv);
    rc = rc ? rc : q3n_tensor(m, l, "ssm_dt.bias", 1, nv, 1, 1, &lw->ssm_dt_b);
    rc = rc ? rc : q3n_tensor(m, l, "ssm_a", 1, nv, 1, 1, &lw->ssm_a);
    rc = rc ? rc : q3n_tensor(m, l, "ssm_norm.weight", 1, d, 1, 1, &lw->ssm_norm);
    rc = rc ? rc : q3n_tensor(m, l, "ssm_out.weight", 2, vw, e, 1, &lw->ssm_out);
    rc = rc ? rc : q3n_small(l, &lw->ssm_conv);
    rc = rc ? rc : q3n_small(l, &lw->ssm_dt_b);
    rc = rc ? rc : q3n_small(l, &lw->ssm_a);
    rc = rc ? rc : q3n_small(l, &lw->ssm_norm);
    if (rc)
        return rc;
    const float *a = lw->ssm_a.data; /* the state decays by exp(a * softplus(.)) <= 1 */
    for (uint64_t i = 0; i < nv; i++)
        if (!(a[i] <= 0.0f))
            return err_set(-EINVAL, "%s[%llu] is %g: it holds -exp(A_log), never positive",
                           lw->ssm_a.name, (unsigned long long)i, a[i]);
    return 0;
}

static int q3n_layer_attn(struct model *m, uint32_t l, struct layer_weights *lw)
{
    const struct model_hparams *hp = &m->hp;
    uint64_t e = hp->n_embd, qw = (uint64_t)hp->n_head * hp->head_dim;
    uint64_t kvw = (uint64_t)hp->n_head_kv * hp->head_dim;
    int rc = 0;

    rc = rc ? rc : q3n_tensor(m, l, "attn_q.weight", 2, e, 2 * qw, 1, &lw->wq);
    rc = rc ? rc : q3n_tensor(m, l, "attn_k.weight", 2, e, kvw, 1, &lw->wk);
    rc = rc ? rc : q3n_tensor(m, l, "attn_v.weight", 2, e, kvw, 1, &lw->wv);
    rc = rc ? rc : q3n_tensor(m, l, "attn_output.weight", 2, qw, e, 1, &lw->wo);
    rc = rc ? rc : q3n_tensor(m, l, "attn_q_norm.weight", 1, hp->head_dim, 1, 1, &lw->q_norm);
    rc = rc ? rc : q3n_tensor(m, l, "attn_k_norm.weight", 1, hp->head_dim, 1, 1, &lw->k_norm);
    rc = rc ? rc : q3n_small(l, &lw->q_norm);
    return rc ? rc : q3n_small(l, &lw->k_norm);
}

/* Layer l's tensors into lw (blocks past n_layer: the MTP block, an attention layer). */
static int q3n_layer(struct model *m, uint32_t l, struct layer_weights *lw)
{
    const struct model_hparams *hp = &m->hp;
    uint64_t e = hp->n_embd, f = hp->n_ff_exp, n = hp->n_expert, fs = hp->n_ff_shexp;
    int rc = 0;

    rc = rc ? rc : q3n_tensor(m, l, "attn_norm.weight", 1, e, 1, 1, &lw->attn_norm);
    rc = rc ? rc : q3n_tensor(m, l, "post_attention_norm.weight", 1, e, 1, 1, &lw->ffn_norm);
    rc = rc ? rc : q3n_tensor(m, l, "ffn_gate_inp.weight", 2, e, n, 1, &lw->router);
    rc = rc ? rc : q3n_tensor(m, l, "ffn_gate_exps.weight", 3, e, f, n, &lw->gate_exps);
    rc = rc ? rc : q3n_tensor(m, l, "ffn_up_exps.weight", 3, e, f, n, &lw->up_exps);
    rc = rc ? rc : q3n_tensor(m, l, "ffn_down_exps.weight", 3, f, e, n, &lw->down_exps);
    rc = rc ? rc : q3n_tensor(m, l, "ffn_gate_inp_shexp.weight", 1, e, 1, 1, &lw->shexp_gate_inp);
    rc = rc ? rc : q3n_tensor(m, l, "ffn_gate_shexp.weight", 2, e, fs, 1, &lw->gate_shexp);
    rc = rc ? rc : q3n_tensor(m, l, "ffn_up_shexp.weight", 2, e, fs, 1, &lw->up_shexp);
    rc = rc ? rc : q3n_tensor(m, l, "ffn_down_shexp.weight", 2, fs, e, 1, &lw->down_shexp);
    rc = rc ? rc : q3n_small(l, &lw->attn_norm);
    rc = rc ? rc : q3n_small(l, &lw->ffn_norm);
    rc = rc ? rc : q3n_small(l, &lw->router);
    rc = rc ? rc : q3n_small(l, &lw->shexp_gate_inp);
    if (rc)
        return rc;
    if (l < hp->n_layer && model_layer_is_ssm(hp, l))
        return q3n_layer_ssm(m, l);
    return q3n_layer_attn(m, l, lw);
}

/* The first MTP block (block n_layer): its nextn tensors and its attention layer. Later ones,
 * if a file has them, are counted and left unloaded. */
static int q3n_mtp(struct model *m)
{
    const struct model_hparams *hp = &m->hp;
    const uint32_t l = hp->n_layer;
    const uint64_t e = hp->n_embd;
    struct mtp_weights *mt = calloc(1, sizeof(*mt));
    int rc = 0;

    if (!mt)
        return err_set(-ENOMEM, "out of memory");
    m->mtp = mt;
    rc = rc ? rc : q3n_tensor(m, l, "nextn.eh_proj.weight", 2, 2 * e, e, 1, &mt->eh_proj);
    rc = rc ? rc : q3n_tensor(m, l, "nextn.enorm.weight", 1, e, 1, 1, &mt->enorm);
    rc = rc ? rc : q3n_tensor(m, l, "nextn.hnorm.weight", 1, e, 1, 1, &mt->hnorm);
    rc = rc ? rc : q3n_small(l, &mt->enorm);
    rc = rc ? rc : q3n_small(l, &mt->hnorm);
    if (rc)
        return err_wrap(rc, "the MTP block (--no-mtp skips it): ");
    char name[64];
    snprintf(name, sizeof(name), "blk.%u.nextn.shared_head_norm.weight", l);
    rc = model_weight_find(m, name, 1, (const uint64_t[]){e}, &mt->head_norm);
    if (rc == -ENOENT)
        mt->head_norm = m->output_norm;
    else if (rc || (rc = q3n_small(l, &mt->head_norm)))
        return err_wrap(rc, "the MTP block (--no-mtp skips it): ");
    rc = q3n_layer(m, l, &mt->lw);
    return rc ? err_wrap(rc, "the MTP block (--no-mtp skips it): ") : 0;
}

int model_qwen3next_load(struct model *m)
{
    struct model_hparams *hp = &m->hp;
    const struct gguf_tensor *emb;
    char key[96];
    int rc = q3n_hparams(m);

    if (rc)
        return rc;
    emb = gguf_find_tensor(m->file, "token_embd.weight");
    if (!emb)
        return err_set(-ENOENT, "required tensor 'token_embd.weight' is missing");
    if (emb->n_dims != 2 || emb->ne[1] == 0 || emb->ne[1] > (1u << 24))
        return err_set(-EINVAL, "token_embd.weight must be 2-D (n_embd, n_vocab)");
    hp->n_vocab = (uint32_t)emb->ne[1];
    uint64_t ne[2] = {hp->n_embd, hp->n_vocab}, nn[1] = {hp->n_embd};
    rc = model_weight_get(m, "token_embd.weight", 2, ne, &m->tok_embd);
    rc = rc ? rc : model_weight_get(m, "output_norm.weight", 1, nn, &m->output_norm);
    rc = rc ? rc : model_check_finite(&m->output_norm);
    if (rc)
        return rc;
    rc = model_weight_find(m, "output.weight", 2, ne, &m->output);
    if (rc == -ENOENT)
        m->output = m->tok_embd; /* tied embeddings */
    else if (rc)
        return rc;
    snprintf(key, sizeof(key), "%s.block_count", q3n_arch(m));
    rc = model_check_blocks(m, key, hp->n_layer + hp->n_nextn);
    if (rc)
        return rc;
    m->layers = calloc(hp->n_layer, sizeof(*m->layers));
    if (!m->layers)
        return err_set(-ENOMEM, "out of memory");
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        rc = q3n_layer(m, l, &m->layers[l]);
        if (rc == -ENOENT) /* a layer short of the block count */
            return err_wrap(rc, "%s: ", key);
        if (rc)
            return rc;
    }
    return hp->n_nextn && !m->opts.skip_mtp ? q3n_mtp(m) : 0;
}
