/* test_gptoss_load: the gpt-oss loader on files of tools/gen. The tiny gpt-oss preset (and
 * it at the q8_0 mix) opens with every hyperparameter and every tensor of docs/formats.md
 * (gpt-oss) bound at its shape and type, the even layers sliding; qwen3moe's tiny still opens
 * with no gpt-oss weights bound. Rewritten copies with a tensor dropped, a wrong shape, a wrong
 * type, a missing key, a sliding_window_pattern or a rope scaling type strata does not read are
 * refused naming the tensor or key. strata_open runs a gpt-oss file on the CPU and refuses the
 * CUDA device with -ENOTSUP (its forward: test_gptoss_forward). Deterministic. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "errors.h"
#include "gen.h"
#include "gguf.h"
#include "model.h"
#include "model_arch.h"
#include "quant.h"
#include "quant_mix.h"
#include "strata.h"
#include "strata_internal.h"
#include "testutil.h"

static char tmpdir[64];

/* One change when rewriting: a tensor left out, a tensor whose ne[0] and ne[1] are swapped
 * (same bytes), a tensor retyped to the same bytes (F32 -> I32, id 26), a key left out, or a
 * u32/string key added. */
struct edit {
    const char *drop_tensor;
    const char *swap_tensor;
    const char *retype_tensor;
    const char *drop_key;
    const char *add_u32_key;
    uint32_t add_u32;
    const char *add_str_key;
    const char *add_str;
};

static int edit_kv(void *ctx, struct gguf_writer *w, const struct gguf_kv *kv)
{
    const struct edit *e = ctx;
    (void)w;
    return e->drop_key && !strcmp(kv->key, e->drop_key) ? TEST_KV_SKIP : TEST_KV_COPY;
}

static int edit_add_kvs(void *ctx, struct gguf_writer *w)
{
    const struct edit *e = ctx;
    int rc = 0;
    if (e->add_u32_key)
        rc = gguf_writer_add_u32(w, e->add_u32_key, e->add_u32);
    if (!rc && e->add_str_key)
        rc = gguf_writer_add_str(w, e->add_str_key, e->add_str);
    return rc;
}

static bool edit_tensor(void *ctx, const struct gguf_tensor *t, uint32_t *type, uint64_t *ne)
{
    const struct edit *e = ctx;
    if (e->drop_tensor && !strcmp(t->name, e->drop_tensor))
        return false;
    if (e->swap_tensor && !strcmp(t->name, e->swap_tensor)) {
        ne[0] = t->ne[1];
        ne[1] = t->ne[0];
    }
    if (e->retype_tensor && !strcmp(t->name, e->retype_tensor))
        *type = 26; /* I32: 4 bytes an element like F32 */
    return true;
}

/* Copies src to dst with e applied. 0 or -errno. */
static int rewrite(const char *src, const char *dst, const struct edit *e)
{
    const struct test_rewrite rw = {(void *)e, edit_kv, edit_add_kvs, edit_tensor};
    return test_gguf_rewrite(src, dst, &rw);
}

static int gen_gptoss(const struct gen_preset *p, enum quant_mix mix, const char *path)
{
    struct gen_config cfg = {.arch = "gpt-oss", .preset = *p, .mix = mix, .seed = 1,
                             .n_threads = 2, .out_path = path};
    return gen_file_write(&cfg, NULL);
}

/* w is bound to tensor `name` with dims d0, d1, d2 (0: absent) and type `type`. */
static void check_weight(const struct weight *w, const char *name, uint32_t type, uint64_t d0,
                         uint64_t d1, uint64_t d2)
{
    uint32_t n_dims = d2 ? 3 : d1 ? 2 : 1;

    CHECK(w->data != NULL && w->name && !strcmp(w->name, name), "%s: not bound (%s)", name,
          w->name ? w->name : "no name");
    if (!w->data || !w->name)
        return;
    CHECK(w->type == type, "%s: type %s, want %s", name, quant_type_name(w->type),
          quant_type_name(type));
    CHECK(w->n_dims == n_dims && w->ne[0] == d0 && w->ne[1] == (d1 ? d1 : 1) &&
              w->ne[2] == (d2 ? d2 : 1),
          "%s: dims %u {%llu, %llu, %llu}", name, w->n_dims, (unsigned long long)w->ne[0],
          (unsigned long long)w->ne[1], (unsigned long long)w->ne[2]);
}

static void check_model(const struct model *m, const struct gen_preset *p, uint32_t big)
{
    const struct model_hparams *hp = &m->hp;
    uint64_t d = p->n_embd, q = (uint64_t)p->n_head * p->head_dim;
    uint64_t kv = (uint64_t)p->n_head_kv * p->head_dim, ff = p->n_ff_exp, e = p->n_expert;
    const uint32_t f32 = QUANT_F32, mx = big == QUANT_F32 ? QUANT_F32 : QUANT_MXFP4;
    char nm[64];

    CHECK(!strcmp(m->arch->name, "gpt-oss"), "arch %s", m->arch->name);
    CHECK(hp->n_layer == p->n_layer && hp->n_embd == p->n_embd && hp->n_head == p->n_head &&
              hp->n_head_kv == p->n_head_kv && hp->head_dim == p->head_dim &&
              hp->n_expert == p->n_expert && hp->n_expert_used == p->n_expert_used &&
              hp->n_ff_exp == p->n_ff_exp && hp->n_ctx_train == p->n_ctx &&
              hp->n_vocab == p->n_vocab,
          "sizes: layers %u embd %u heads %u/%u x %u experts %u/%u ff %u ctx %u vocab %u",
          hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_expert_used,
          hp->n_expert, hp->n_ff_exp, hp->n_ctx_train, hp->n_vocab);
    CHECK(hp->rms_eps == p->rms_eps && hp->rope_base == p->rope_base, "eps %g base %g",
          hp->rms_eps, hp->rope_base);
    CHECK(hp->n_swa == p->n_swa && hp->swa_period == 2, "sliding window %u period %u", hp->n_swa,
          hp->swa_period);
    CHECK(hp->rope_yarn_factor == p->yarn_factor && hp->rope_yarn_n_ctx_orig == p->yarn_n_ctx_orig,
          "yarn %g / %u", hp->rope_yarn_factor, hp->rope_yarn_n_ctx_orig);
    for (uint32_t l = 0; l < hp->n_layer; l++)
        CHECK(model_layer_is_swa(hp, l) == (l % 2 == 0), "layer %u: sliding %d", l,
              model_layer_is_swa(hp, l));

    check_weight(&m->tok_embd, "token_embd.weight", big, d, p->n_vocab, 0);
    check_weight(&m->output, "output.weight", big, d, p->n_vocab, 0);
    check_weight(&m->output_norm, "output_norm.weight", f32, d, 0, 0);
#define B(s) (snprintf(nm, sizeof(nm), "blk.%u.%s", l, s), nm)
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const struct layer_weights *lw = &m->layers[l];
        check_weight(&lw->attn_norm, B("attn_norm.weight"), f32, d, 0, 0);
        check_weight(&lw->wq, B("attn_q.weight"), big, d, q, 0);
        check_weight(&lw->bq, B("attn_q.bias"), f32, q, 0, 0);
        check_weight(&lw->wk, B("attn_k.weight"), big, d, kv, 0);
        check_weight(&lw->bk, B("attn_k.bias"), f32, kv, 0, 0);
        check_weight(&lw->wv, B("attn_v.weight"), big, d, kv, 0);
        check_weight(&lw->bv, B("attn_v.bias"), f32, kv, 0, 0);
        check_weight(&lw->wo, B("attn_output.weight"), big, q, d, 0);
        check_weight(&lw->bo, B("attn_output.bias"), f32, d, 0, 0);
        check_weight(&lw->sinks, B("attn_sinks.weight"), f32, p->n_head, 0, 0);
        check_weight(&lw->ffn_norm, B("post_attention_norm.weight"), f32, d, 0, 0);
        check_weight(&lw->router, B("ffn_gate_inp.weight"), f32, d, e, 0);
        check_weight(&lw->router_b, B("ffn_gate_inp.bias"), f32, e, 0, 0);
        check_weight(&lw->gate_exps, B("ffn_gate_exps.weight"), mx, d, ff, e);
        check_weight(&lw->gate_exps_b, B("ffn_gate_exps.bias"), f32, ff, e, 0);
        check_weight(&lw->up_exps, B("ffn_up_exps.weight"), mx, d, ff, e);
        check_weight(&lw->up_exps_b, B("ffn_up_exps.bias"), f32, ff, e, 0);
        check_weight(&lw->down_exps, B("ffn_down_exps.weight"), mx, ff, d, e);
        check_weight(&lw->down_exps_b, B("ffn_down_exps.bias"), f32, d, e, 0);
        CHECK(!lw->q_norm.data && !lw->k_norm.data, "layer %u: QK-norms bound", l);
    }
#undef B
    /* an expert's gate + up + down slices: 3 * d * ff values at 17 bytes per 32 (MXFP4) or 4
     * bytes each (the f32 mix) */
    CHECK(model_expert_bytes(m, 0) == (mx == f32 ? 3 * d * ff * 4 : 3 * d * ff / 32 * 17),
          "expert bytes %llu",
          (unsigned long long)model_expert_bytes(m, 0));
}

/* Counts the weights model_weights_each visits. */
static void count_one(struct weight *w, void *arg)
{
    (void)w;
    (*(uint32_t *)arg)++;
}

static void check_opens(const char *path, const struct gen_preset *p, uint32_t big)
{
    struct model *m = NULL;
    uint32_t n = 0;
    int rc = model_open(path, &m);

    CHECK(rc == 0, "%s: %s", path, err_msg());
    if (rc)
        return;
    check_model(m, p, big);
    model_weights_each(m, count_one, &n);
    CHECK(n == 3 + 19 * p->n_layer, "model_weights_each visited %u weights", n);
    /* the copy rebases every bound weight and only those */
    CHECK(model_load_copy(m, 1) == 0, "copy: %s", err_msg());
    check_model(m, p, big);
    model_close(m);
}

static void expect_refused(const char *path, int code, const char *w1, const char *w2)
{
    struct model *m = NULL;
    int rc = model_open(path, &m);

    CHECK(rc == code, "%s: model_open returned %d, expected %d (%s)", path, rc, code, err_msg());
    CHECK(w1 == NULL || strstr(err_msg(), w1), "%s: message '%s' does not name '%s'", path,
          err_msg(), w1);
    CHECK(w2 == NULL || strstr(err_msg(), w2), "%s: message '%s' does not name '%s'", path,
          err_msg(), w2);
    if (!rc)
        model_close(m);
    printf("  refused %-24s %s\n", strrchr(path, '/') + 1, err_msg());
}

static void check_rewrites(const char *good)
{
    char path[256];
    struct {
        const char *file;
        struct edit e;
        int code;
        const char *w1, *w2;
    } cases[] = {
        {"no-sinks.gguf", {.drop_tensor = "blk.1.attn_sinks.weight"}, -ENOENT,
         "blk.1.attn_sinks.weight", "missing"},
        {"no-qbias.gguf", {.drop_tensor = "blk.0.attn_q.bias"}, -ENOENT, "blk.0.attn_q.bias",
         NULL},
        {"no-down-bias.gguf", {.drop_tensor = "blk.3.ffn_down_exps.bias"}, -ENOENT,
         "blk.3.ffn_down_exps.bias", NULL},
        {"no-post-norm.gguf", {.drop_tensor = "blk.2.post_attention_norm.weight"}, -ENOENT,
         "blk.2.post_attention_norm.weight", NULL},
        {"gate-bias-shape.gguf", {.swap_tensor = "blk.1.ffn_gate_exps.bias"}, -EINVAL,
         "blk.1.ffn_gate_exps.bias", "expected {64, 8, 1, 1}"},
        {"router-shape.gguf", {.swap_tensor = "blk.0.ffn_gate_inp.weight"}, -EINVAL,
         "blk.0.ffn_gate_inp.weight", "expected {64, 8, 1, 1}"},
        {"sinks-type.gguf", {.retype_tensor = "blk.2.attn_sinks.weight"}, -EINVAL,
         "blk.2.attn_sinks.weight", NULL},
        {"no-swa.gguf", {.drop_key = "gpt-oss.attention.sliding_window"}, -ENOENT,
         "gpt-oss.attention.sliding_window", NULL},
        {"no-yarn-factor.gguf", {.drop_key = "gpt-oss.rope.scaling.factor"}, -ENOENT,
         "gpt-oss.rope.scaling.factor", NULL},
        {"swa-pattern-0.gguf",
         {.add_u32_key = "gpt-oss.attention.sliding_window_pattern", .add_u32 = 0}, -EINVAL,
         "sliding_window_pattern", NULL},
        {"rope-linear.gguf", {.drop_key = "gpt-oss.rope.scaling.type",
                              .add_str_key = "gpt-oss.rope.scaling.type", .add_str = "linear"},
         -EINVAL, "gpt-oss.rope.scaling.type", "linear"},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", tmpdir, cases[i].file);
        int rc = rewrite(good, path, &cases[i].e);
        CHECK(rc == 0, "rewrite %s: %s", cases[i].file, err_msg());
        if (rc)
            continue;
        expect_refused(path, cases[i].code, cases[i].w1, cases[i].w2);
        unlink(path);
    }

    /* a period of 3 is read: layers 0, 1 slide, 2 does not, 3 does */
    struct edit e3 = {.add_u32_key = "gpt-oss.attention.sliding_window_pattern", .add_u32 = 3};
    struct model *m = NULL;
    snprintf(path, sizeof(path), "%s/swa-pattern-3.gguf", tmpdir);
    CHECK(rewrite(good, path, &e3) == 0, "rewrite: %s", err_msg());
    CHECK(model_open(path, &m) == 0, "pattern 3: %s", err_msg());
    if (m) {
        CHECK(model_layer_is_swa(&m->hp, 0) && model_layer_is_swa(&m->hp, 1) &&
                  !model_layer_is_swa(&m->hp, 2) && model_layer_is_swa(&m->hp, 3),
              "pattern 3: period %u", m->hp.swa_period);
        model_close(m);
    }
    unlink(path);
}

/* The public API opens a gpt-oss file on the CPU (test_cuda_backend runs it on CUDA). */
static void check_engine_cpu(const char *path)
{
    struct strata_config cfg;
    struct strata *s = NULL;

    strata_config_init(&cfg);
    cfg.model_path = path;
    cfg.device = STRATA_DEVICE_CPU;
    cfg.n_threads = 1;
    int rc = strata_open(&cfg, &s);
    CHECK(rc == 0, "strata_open on the CPU: %s", strata_error());
    strata_close(s);
}

static void check_qwen3moe_untouched(void)
{
    char path[256];
    struct gen_config cfg = {.arch = "qwen3moe", .preset = *gen_preset_find("tiny"),
                             .mix = QUANT_MIX_F32, .seed = 1, .n_threads = 2, .out_path = path};
    struct model *m = NULL;
    uint32_t n = 0;

    snprintf(path, sizeof(path), "%s/qwen3moe-tiny.gguf", tmpdir);
    CHECK(gen_file_write(&cfg, NULL) == 0, "gen qwen3moe: %s", err_msg());
    CHECK(model_open(path, &m) == 0, "qwen3moe: %s", err_msg());
    if (m) {
        CHECK(m->hp.n_swa == 0 && !model_layer_is_swa(&m->hp, 0) && m->hp.rope_yarn_factor == 0,
              "qwen3moe has gpt-oss hparams");
        CHECK(!m->layers[0].bq.data && !m->layers[0].sinks.data && !m->layers[1].down_exps_b.data,
              "qwen3moe has gpt-oss weights");
        model_weights_each(m, count_one, &n);
        CHECK(n == 3 + 12 * m->hp.n_layer, "qwen3moe: %u weights visited", n);
        model_close(m);
    }
    unlink(path);
}

int main(void)
{
    char good[256], q8[256];
    const struct gen_preset *p = gen_preset_find_arch("gpt-oss", "tiny");

    snprintf(tmpdir, sizeof(tmpdir), "/tmp/strata-gptoss-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    CHECK(p && p->n_layer == 4 && !strcmp(p->arch, "gpt-oss"), "no gpt-oss tiny preset");
    if (!p)
        return test_finish("test_gptoss_load");
    snprintf(good, sizeof(good), "%s/tiny-f32.gguf", tmpdir);
    snprintf(q8, sizeof(q8), "%s/tiny-q8_0.gguf", tmpdir);
    CHECK(gen_gptoss(p, QUANT_MIX_F32, good) == 0, "gen f32: %s", err_msg());
    CHECK(gen_gptoss(p, QUANT_MIX_Q8_0, q8) == 0, "gen q8_0: %s", err_msg());
    check_opens(good, p, QUANT_F32);
    check_opens(q8, p, QUANT_Q8_0);
    check_rewrites(good);
    check_engine_cpu(good);
    check_qwen3moe_untouched();

    /* gen refuses a preset of the other architecture */
    struct gen_config bad = {.arch = "gpt-oss", .preset = *gen_preset_find("tiny"),
                             .mix = QUANT_MIX_F32, .seed = 1, .out_path = good};
    CHECK(gen_file_write(&bad, NULL) == -EINVAL && strstr(err_msg(), "qwen3moe"),
          "qwen3moe preset as gpt-oss: %s", err_msg());
    unlink(good);
    unlink(q8);
    rmdir(tmpdir);
    return test_finish("test_gptoss_load");
}
