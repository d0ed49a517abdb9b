#include "model.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "errors.h"
#include "gguf.h"
#include "model_arch.h"
#include "quant.h"
#include "tokenizer.h"

static const struct model_arch model_arch_table[] = {
    {"qwen3moe", model_qwen3moe_load},
    {"gpt-oss", model_gptoss_load},
    {"qwen3next", model_qwen3next_load},
    {"qwen35moe", model_qwen3next_load},
};

const struct model_arch *model_arch_find(const char *name)
{
    for (size_t i = 0; i < sizeof(model_arch_table) / sizeof(model_arch_table[0]); i++) {
        if (!strcmp(model_arch_table[i].name, name))
            return &model_arch_table[i];
    }
    return NULL;
}

static int model_weight_fill(const struct gguf_tensor *t, uint32_t n_dims, const uint64_t *ne,
                             struct weight *w)
{
    const struct quant_type_info *ti = quant_type_find(t->type);

    if (!ti || !ti->can_dequantize)
        return err_set(-EINVAL, "tensor '%s' has type %s, which strata cannot compute with",
                       t->name, quant_type_name(t->type));
    for (uint32_t i = 0; i < GGUF_MAX_DIMS; i++) {
        uint64_t want = i < n_dims ? ne[i] : 1;
        if (t->ne[i] != want) {
            char got[96], exp[96];
            snprintf(got, sizeof(got), "{%llu, %llu, %llu, %llu}", (unsigned long long)t->ne[0],
                     (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                     (unsigned long long)t->ne[3]);
            snprintf(exp, sizeof(exp), "{%llu, %llu, %llu, %llu}", (unsigned long long)ne[0],
                     (unsigned long long)(n_dims > 1 ? ne[1] : 1),
                     (unsigned long long)(n_dims > 2 ? ne[2] : 1),
                     (unsigned long long)(n_dims > 3 ? ne[3] : 1));
            return err_set(-EINVAL, "tensor '%s' has shape %s, expected %s", t->name, got, exp);
        }
    }
    memset(w, 0, sizeof(*w));
    w->name = t->name;
    w->type = t->type;
    w->n_dims = n_dims;
    memcpy(w->ne, t->ne, sizeof(w->ne));
    w->bytes = t->size;
    w->data = t->data;
    return quant_row_bytes(t->type, t->ne[0], &w->row_bytes);
}

int model_weight_find(const struct model *m, const char *name, uint32_t n_dims,
                      const uint64_t *ne, struct weight *w)
{
    const struct gguf_tensor *t = gguf_find_tensor(m->file, name);
    if (!t)
        return -ENOENT;
    return model_weight_fill(t, n_dims, ne, w);
}

int model_weight_get(const struct model *m, const char *name, uint32_t n_dims,
                     const uint64_t *ne, struct weight *w)
{
    int rc = model_weight_find(m, name, n_dims, ne, w);
    if (rc == -ENOENT)
        return err_set(rc, "required tensor '%s' is missing", name);
    return rc;
}

int model_arch_u32(const struct model *m, const char *key, uint32_t *out)
{
    char full[128];
    snprintf(full, sizeof(full), "%s.%s", m->arch->name, key);
    return gguf_get_u32(m->file, full, out);
}

int model_arch_f32(const struct model *m, const char *key, float *out)
{
    char full[128];
    snprintf(full, sizeof(full), "%s.%s", m->arch->name, key);
    return gguf_get_f32(m->file, full, out);
}

int model_arch_u32_or(const struct model *m, const char *key, uint32_t def, uint32_t *out)
{
    int rc = model_arch_u32(m, key, out);
    if (rc == -ENOENT) {
        *out = def;
        err_clear();
        return 0;
    }
    return rc;
}

int model_check_blocks(const struct model *m, const char *count_key, uint32_t n_layer)
{
    for (uint64_t i = 0; i < m->file->n_tensors; i++) {
        const char *name = m->file->tensors[i].name, *p;
        uint64_t n = 0;

        if (strncmp(name, "blk.", 4))
            continue;
        for (p = name + 4; *p >= '0' && *p <= '9'; p++)
            n = n > UINT32_MAX ? n : n * 10 + (uint64_t)(*p - '0');
        if (p == name + 4 || *p != '.')
            continue; /* not a block tensor name: the loaders ignore it */
        if (n >= n_layer)
            return err_set(-EINVAL, "tensor '%s' is in block %llu but %s is %u", name,
                           (unsigned long long)n, count_key, n_layer);
    }
    return 0;
}

int model_check_finite(const struct weight *w)
{
    const uint32_t *v = w->data; /* F32 bit patterns; tensor data is 32-byte aligned */
    uint64_t n = w->bytes / sizeof(float);
    uint32_t bad = 0;

    if (w->type != QUANT_F32)
        return 0;
    for (uint64_t i = 0; i < n; i++) /* exponent all ones: inf or NaN */
        bad |= (uint32_t)((v[i] & 0x7f800000u) == 0x7f800000u);
    if (!bad)
        return 0;
    for (uint64_t i = 0; i < n; i++) {
        float x;
        memcpy(&x, &v[i], sizeof(x));
        if (!isfinite(x))
            return err_set(-EINVAL, "tensor '%s' holds %s at element %llu", w->name,
                           isnan(x) ? "NaN" : "an infinity", (unsigned long long)i);
    }
    return 0;
}

uint64_t model_expert_bytes(const struct model *m, uint32_t layer)
{
    const struct layer_weights *lw = &m->layers[layer];
    uint64_t n = m->hp.n_expert;
    return lw->gate_exps.bytes / n + lw->up_exps.bytes / n + lw->down_exps.bytes / n;
}

static int model_load_arch(struct model *m)
{
    struct gguf_str s;
    char name[64];
    int rc = gguf_get_str(m->file, "general.architecture", &s);

    if (rc)
        return rc;
    if (s.len >= sizeof(name))
        return err_set(-EINVAL, "general.architecture is %llu bytes long",
                       (unsigned long long)s.len);
    memcpy(name, s.ptr, s.len);
    name[s.len] = '\0';
    m->arch = model_arch_find(name);
    if (!m->arch)
        return err_set(-ENOTSUP,
                       "unsupported architecture '%s' (strata supports: qwen3moe, gpt-oss, "
                       "qwen3next, qwen35moe)",
                       name);
    return m->arch->load(m);
}

int model_open(const char *path, struct model **out)
{
    return model_open_opts(path, NULL, out);
}

int model_open_opts(const char *path, const struct model_open_opts *opts, struct model **out)
{
    struct model *m = calloc(1, sizeof(*m));
    int rc;

    if (!m)
        return err_set(-ENOMEM, "out of memory");
    if (opts)
        m->opts = *opts;
    rc = gguf_open(path, &m->file);
    if (rc)
        goto out_free;
    rc = model_load_arch(m);
    if (rc)
        goto out_wrap;
    if (gguf_find_kv(m->file, "tokenizer.ggml.tokens")) {
        rc = tokenizer_open_gguf(m->file, &m->tok);
        if (rc)
            goto out_wrap;
        if ((uint32_t)tokenizer_n_vocab(m->tok) > m->hp.n_vocab) {
            rc = err_set(-EINVAL, "the vocabulary has %d tokens but token_embd has %u rows",
                         tokenizer_n_vocab(m->tok), m->hp.n_vocab);
            goto out_wrap;
        }
    }
    *out = m;
    return 0;

out_wrap:
    err_wrap(rc, "%s: ", path);
out_free:
    model_close(m);
    return rc;
}

void model_weights_each(struct model *m, void (*fn)(struct weight *w, void *arg), void *arg)
{
    const bool head_tied = m->mtp && m->mtp->head_norm.data == m->output_norm.data;
    fn(&m->tok_embd, arg);
    fn(&m->output_norm, arg);
    if (m->output.data != m->tok_embd.data)
        fn(&m->output, arg);
    else
        m->output = m->tok_embd; /* keep the tie: output follows tok_embd */
    if (m->mtp) {
        struct weight *mw[] = {&m->mtp->eh_proj, &m->mtp->enorm, &m->mtp->hnorm};
        for (size_t i = 0; i < sizeof(mw) / sizeof(mw[0]); i++)
            fn(mw[i], arg);
        if (!head_tied)
            fn(&m->mtp->head_norm, arg);
        else
            m->mtp->head_norm = m->output_norm; /* keep the view: it follows output_norm */
    }
    for (uint32_t l = 0; m->layers && l < m->hp.n_layer + (m->mtp ? 1 : 0); l++) {
        struct layer_weights *lw = l < m->hp.n_layer ? &m->layers[l] : &m->mtp->lw;
        struct weight *all[] = {&lw->attn_norm,   &lw->wq,
                                &lw->wk,          &lw->wv,
                                &lw->wo,          &lw->q_norm,
                                &lw->k_norm,      &lw->ffn_norm,
                                &lw->router,      &lw->gate_exps,
                                &lw->up_exps,     &lw->down_exps,
                                &lw->bq,          &lw->bk,
                                &lw->bv,          &lw->bo,
                                &lw->sinks,       &lw->router_b,
                                &lw->gate_exps_b, &lw->up_exps_b,
                                &lw->down_exps_b, &lw->shexp_gate_inp,
                                &lw->gate_shexp,  &lw->up_shexp,
                                &lw->down_shexp,  &lw->ssm_qkv,
                                &lw->ssm_z,       &lw->ssm_ba,
                                &lw->ssm_beta,    &lw->ssm_alpha,
                                &lw->ssm_conv,    &lw->ssm_dt_b,
                                &lw->ssm_a,       &lw->ssm_norm,
                                &lw->ssm_out};
        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
            if (all[i]->data)
                fn(all[i], arg);
        }
    }
}

struct model_rebase {
    const uint8_t *from; /* start of the file's data section */
    uint8_t *to;         /* start of the copy */
};

static void model_rebase_one(struct weight *w, void *arg)
{
    const struct model_rebase *r = arg;
    w->data = r->to + ((const uint8_t *)w->data - r->from);
}

int model_load_copy(struct model *m, int n_threads)
{
    const uint8_t *src = m->file->base + m->file->data_offset;
    uint64_t bytes = m->file->size - m->file->data_offset;
    size_t align = (size_t)2 << 20, rounded = (bytes + align - 1) / align * align;
    uint8_t *dst;

    if (m->copy)
        return 0;
    dst = aligned_alloc(align, rounded ? rounded : align);
    if (!dst)
        return err_set(-ENOMEM, "cannot allocate %.2f GB to copy the weights",
                       (double)bytes / 1e9);
    madvise(dst, rounded, MADV_HUGEPAGE);
    if (n_threads <= 0)
        n_threads = omp_get_max_threads();
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (uint64_t off = 0; off < bytes; off += align)
        memcpy(dst + off, src + off, bytes - off < align ? bytes - off : align);
    struct model_rebase r = {.from = src, .to = dst};
    model_weights_each(m, model_rebase_one, &r);
    m->copy = dst;
    m->copy_bytes = bytes;
    return 0;
}

void model_close(struct model *m)
{
    if (!m)
        return;
    free(m->copy);
    tokenizer_close(m->tok);
    free(m->layers);
    free(m->mtp);
    gguf_close(m->file);
    free(m);
}
