/* test_model_checks: model_open refuses metadata and weights that make no sense, naming the key
 * or tensor: a block count that disagrees with the blk.N tensors, context_length 0, a norm
 * epsilon that is not finite and positive, NaN or infinity in an F32 norm or router. Each bad
 * file is the tiny f32 model of tools/gen (seed 1) with one change, made by patching its bytes
 * or by rewriting it through core/gguf_write; the unchanged model still opens. Also the hybrid
 * qwen3next loader's own checks (check_hybrid). Deterministic. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "errors.h"
#include "gen.h"
#include "gguf.h"
#include "model.h"
#include "quant_mix.h"
#include "testutil.h"

static char tmpdir[64];

/* One key to replace when rewriting (type FLOAT32 or UINT32), and a block whose tensors are
 * left out (-1: none). */
struct edit {
    const char *key;
    enum gguf_value_type type;
    uint32_t u;
    float f;
    int drop_block;
};

static bool in_block(const char *name, int block)
{
    char pre[32];
    snprintf(pre, sizeof(pre), "blk.%d.", block);
    return block >= 0 && !strncmp(name, pre, strlen(pre));
}

static int edit_kv(void *ctx, struct gguf_writer *w, const struct gguf_kv *kv)
{
    const struct edit *e = ctx;
    if (!e->key || strcmp(kv->key, e->key))
        return TEST_KV_COPY;
    int rc = e->type == GGUF_TYPE_FLOAT32 ? gguf_writer_add_f32(w, kv->key, e->f)
                                          : gguf_writer_add_u32(w, kv->key, e->u);
    return rc ? rc : TEST_KV_DONE;
}

static bool edit_tensor(void *ctx, const struct gguf_tensor *t, uint32_t *type, uint64_t *ne)
{
    const struct edit *e = ctx;
    (void)type, (void)ne;
    return !in_block(t->name, e->drop_block);
}

/* Copies src to dst with e applied. 0 or -errno. */
static int rewrite(const char *src, const char *dst, const struct edit *e)
{
    const struct test_rewrite rw = {.ctx = (void *)e, .kv = edit_kv, .tensor = edit_tensor};
    return test_gguf_rewrite(src, dst, &rw);
}

/* Copies src to dst with element `elem` of F32 tensor `name` set to v. 0 or -errno. */
static int patch(const char *src, const char *dst, const char *name, uint64_t elem, float v)
{
    struct gguf_file *f;
    const struct gguf_tensor *t;
    FILE *out;
    int rc = gguf_open(src, &f);

    if (rc)
        return rc;
    t = gguf_find_tensor(f, name);
    if (!t || t->type != 0 || (elem + 1) * sizeof(float) > t->size) {
        gguf_close(f);
        return err_set(-EINVAL, "%s: no F32 tensor '%s' with element %llu", src, name,
                       (unsigned long long)elem);
    }
    uint64_t at = (uint64_t)((const uint8_t *)t->data - f->base) + elem * sizeof(float);
    uint8_t *copy = test_xmalloc(f->size);
    memcpy(copy, f->base, f->size);
    memcpy(copy + at, &v, sizeof(v));
    out = fopen(dst, "wb");
    rc = out && fwrite(copy, 1, f->size, out) == f->size ? 0 : -EIO;
    if (out && fclose(out))
        rc = -EIO;
    free(copy);
    gguf_close(f);
    return rc ? err_set(rc, "%s: cannot write", dst) : 0;
}

/* model_open(path) must fail with `code` and a message containing every string of want. */
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
    printf("  refused %-28s %s\n", strrchr(path, '/') + 1, err_msg());
}

static void expect_opens(const char *path)
{
    struct model *m = NULL;
    int rc = model_open(path, &m);
    CHECK(rc == 0, "%s: %s", path, err_msg());
    model_close(m);
}

static void check_rewrites(const char *good, const struct gen_preset *p)
{
    char path[256];
    uint32_t n = p->n_layer;
    struct {
        const char *file;
        struct edit e;
        int code;
        const char *w1, *w2;
    } cases[] = {
        {"same.gguf", {.drop_block = -1}, 0, NULL, NULL},
        {"blocks-less.gguf", {"qwen3moe.block_count", GGUF_TYPE_UINT32, n - 1, 0, -1}, -EINVAL,
         "qwen3moe.block_count", "blk.1."},
        {"blocks-more.gguf", {"qwen3moe.block_count", GGUF_TYPE_UINT32, n + 1, 0, -1}, -ENOENT,
         "qwen3moe.block_count", "blk.2."},
        {"block-dropped.gguf", {.drop_block = 0}, -ENOENT, "qwen3moe.block_count", "blk.0."},
        {"ctx0.gguf", {"qwen3moe.context_length", GGUF_TYPE_UINT32, 0, 0, -1}, -EINVAL,
         "qwen3moe.context_length", NULL},
        {"eps-nan.gguf",
         {"qwen3moe.attention.layer_norm_rms_epsilon", GGUF_TYPE_FLOAT32, 0, NAN, -1}, -EINVAL,
         "qwen3moe.attention.layer_norm_rms_epsilon", NULL},
        {"eps-inf.gguf",
         {"qwen3moe.attention.layer_norm_rms_epsilon", GGUF_TYPE_FLOAT32, 0, INFINITY, -1},
         -EINVAL, "qwen3moe.attention.layer_norm_rms_epsilon", NULL},
        {"eps-zero.gguf",
         {"qwen3moe.attention.layer_norm_rms_epsilon", GGUF_TYPE_FLOAT32, 0, 0.0f, -1}, -EINVAL,
         "qwen3moe.attention.layer_norm_rms_epsilon", NULL},
        {"eps-neg.gguf",
         {"qwen3moe.attention.layer_norm_rms_epsilon", GGUF_TYPE_FLOAT32, 0, -1e-6f, -1},
         -EINVAL, "qwen3moe.attention.layer_norm_rms_epsilon", NULL},
        {"rope-inf.gguf", {"qwen3moe.rope.freq_base", GGUF_TYPE_FLOAT32, 0, INFINITY, -1},
         -EINVAL, "qwen3moe.rope.freq_base", NULL},
    };

    CHECK(n == 2, "the tiny preset has %u layers; the expected messages assume 2", n);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", tmpdir, cases[i].file);
        int rc = rewrite(good, path, &cases[i].e);
        CHECK(rc == 0, "rewrite %s: %s", cases[i].file, err_msg());
        if (rc)
            continue;
        if (cases[i].code)
            expect_refused(path, cases[i].code, cases[i].w1, cases[i].w2);
        else
            expect_opens(path);
        unlink(path);
    }
}

static void check_patches(const char *good)
{
    char path[256];
    struct {
        const char *tensor;
        uint64_t elem;
        float v;
        const char *what;
    } cases[] = {
        {"blk.0.attn_norm.weight", 5, NAN, "NaN"},
        {"blk.1.ffn_norm.weight", 0, -INFINITY, "infinity"},
        {"blk.1.attn_q_norm.weight", 1, NAN, "NaN"},
        {"blk.0.attn_k_norm.weight", 2, INFINITY, "infinity"},
        {"blk.1.ffn_gate_inp.weight", 77, NAN, "NaN"},
        {"output_norm.weight", 3, NAN, "NaN"},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(path, sizeof(path), "%s/patched-%zu.gguf", tmpdir, i);
        int rc = patch(good, path, cases[i].tensor, cases[i].elem, cases[i].v);
        CHECK(rc == 0, "patch %s: %s", cases[i].tensor, err_msg());
        if (rc)
            continue;
        expect_refused(path, -EINVAL, cases[i].tensor, cases[i].what);
        unlink(path);
    }
    /* a large finite value is not refused: only NaN and infinities are */
    snprintf(path, sizeof(path), "%s/patched-big.gguf", tmpdir);
    if (!patch(good, path, "blk.0.attn_norm.weight", 0, 3e38f)) {
        expect_opens(path);
        unlink(path);
    }
}

/* qwen3next (tiny, f32, 4 layers: blocks 0 and 2 Gated DeltaNet, 1 and 3 attention): a
 * positive ssm_a (the state would grow), a NaN in the conv kernel, sizes that disagree
 * (inner_size, v heads not a multiple of q/k heads, a rope count over the head, a conv too
 * long), a missing layer, an MTP block counted but absent: each refused by name. */
static void check_hybrid(void)
{
    char good[256], path[256];
    const struct gen_preset *p = gen_preset_find_arch("qwen3next", "tiny");
    if (test_gen_model(p, QUANT_MIX_F32, 1, tmpdir, "q3n", good, sizeof(good))) {
        CHECK(0, "gen qwen3next: %s", err_msg());
        return;
    }
    expect_opens(good);
    struct {
        const char *file;
        struct edit e;
        int code;
        const char *w1, *w2;
    } cases[] = {
        {"q3n-inner.gguf", {"qwen3next.ssm.inner_size", GGUF_TYPE_UINT32, 100, 0, -1}, -EINVAL,
         "qwen3next.ssm.inner_size", NULL},
        {"q3n-vheads.gguf", {"qwen3next.ssm.time_step_rank", GGUF_TYPE_UINT32, 3, 0, -1},
         -EINVAL, "ssm.time_step_rank", "ssm.group_count"},
        {"q3n-rot.gguf", {"qwen3next.rope.dimension_count", GGUF_TYPE_UINT32, 130, 0, -1},
         -EINVAL, "qwen3next.rope.dimension_count", NULL},
        {"q3n-conv.gguf", {"qwen3next.ssm.conv_kernel", GGUF_TYPE_UINT32, 17, 0, -1}, -EINVAL,
         "ssm.conv_kernel", NULL},
        {"q3n-drop2.gguf", {.drop_block = 2}, -ENOENT, "blk.2.", NULL},
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
    /* a file that counts an MTP block (nextn_predict_layers 1, block_count 5) without it */
    struct gen_preset pm = *p;
    pm.n_nextn = 1;
    char mtp[256];
    if (!test_gen_model(&pm, QUANT_MIX_F32, 1, tmpdir, "q3n-mtp", mtp, sizeof(mtp))) {
        expect_opens(mtp);
        snprintf(path, sizeof(path), "%s/q3n-mtp-dropped.gguf", tmpdir);
        CHECK(rewrite(mtp, path, &(struct edit){.drop_block = 4}) == 0, "rewrite: %s",
              err_msg());
        expect_refused(path, -ENOENT, "MTP block", "blk.4.nextn.eh_proj");
        unlink(path);
        unlink(mtp);
    } else {
        CHECK(0, "gen qwen3next --mtp 1: %s", err_msg());
    }
    struct {
        const char *tensor;
        uint64_t elem;
        float v;
        const char *what;
    } pc[] = {
        {"blk.0.ssm_a", 1, 0.5f, "never positive"},
        {"blk.2.ssm_conv1d.weight", 9, NAN, "NaN"},
        {"blk.0.ssm_dt.bias", 0, INFINITY, "infinity"},
        {"blk.1.ffn_gate_inp_shexp.weight", 4, NAN, "NaN"},
    };
    for (size_t i = 0; i < sizeof(pc) / sizeof(pc[0]); i++) {
        snprintf(path, sizeof(path), "%s/q3n-patched-%zu.gguf", tmpdir, i);
        int rc = patch(good, path, pc[i].tensor, pc[i].elem, pc[i].v);
        CHECK(rc == 0, "patch %s: %s", pc[i].tensor, err_msg());
        if (rc)
            continue;
        expect_refused(path, -EINVAL, pc[i].tensor, pc[i].what);
        unlink(path);
    }
    unlink(good);
}

int main(void)
{
    char good[256];
    const struct gen_preset *p = gen_preset_find("tiny");
    int rc;

    snprintf(tmpdir, sizeof(tmpdir), "/tmp/strata-model-checks-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    if (!p) {
        fprintf(stderr, "no tiny preset\n");
        return 1;
    }
    rc = test_gen_model(p, QUANT_MIX_F32, 1, tmpdir, "tiny", good, sizeof(good));
    CHECK(rc == 0, "gen: %s", err_msg());
    if (!rc) {
        expect_opens(good);
        check_rewrites(good, p);
        check_patches(good);
        unlink(good);
    }
    check_hybrid();
    rmdir(tmpdir);
    return test_finish("test_model_checks");
}
