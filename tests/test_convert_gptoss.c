/* test_convert_gptoss: strata convert on tiny GptOssForCausalLM checkpoints written here.
 *
 * The checkpoint: hidden 64, 2 layers (sliding, full), 8/2 heads of 16, 4 experts top-2, expert
 * ffn 96 (so 2F = 192 != H and F != H: a transposed expert tensor has the wrong shape), vocab
 * 304 with the tokenizer of tests/data/hf-ref, YaRN (factor 4 over 64 positions), window 8.
 * transformers' layouts: attention and router as nn.Linear (W·x) with biases and sinks; experts
 * fused and interleaved (gate = even outputs, up = odd) either as float parameters in x·W order
 * (gate_up_proj [E, H, 2F], down_proj [E, F, H]) or as MXFP4 blocks (gate_up_proj_blocks
 * [E, 2F, H/32, 16], _scales [E, 2F, H/32]; element 2i in the low nibble of byte i).
 * Checks:
 *   - float experts at f32: every GGUF tensor equals, bit for bit, the HF values at the index
 *     the mapping of docs/formats.md §4b gives (computed here independently), the gpt-oss keys
 *     (window, YaRN), the biases and sinks F32; the file opens and generates finite logits;
 *   - MXFP4 experts: at f32 the experts equal transformers' dequantization (value(code) ·
 *     2^(scale − 127)); at q8_0 they stay MXFP4 and dequantize to the same values (lossless);
 *   - the key audit refuses swiglu_limit 8, attention_bias false, layers not alternating
 *     sliding/full, truncate absent (transformers reads true), a yarn factor that disagrees
 *     with max_position_embeddings / original_max_position_embeddings, another rope type and
 *     an unknown key, naming the key.
 * Deterministic (fixed seed). */
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>

#include "convert.h"
#include "errors.h"
#include "gguf.h"
#include "model.h"
#include "quant.h"
#include "quant_ref.h"
#include "strata.h"
#include "strata_internal.h"
#include "testutil.h"

#define NAME "test_convert_gptoss"
#define H 64
#define NL 2
#define NH 8
#define NKV 2
#define HD 16
#define E 4
#define TOPK 2
#define F 96
#define V 304
#define QW (NH * HD)
#define KVW (NKV * HD)

static char tmp_root[256];

/* ---- a safetensors file from C ------------------------------------------------------------ */

struct st_entry {
    char name[96];
    const char *dtype; /* "F32" or "U8" */
    uint32_t n_dims;
    uint64_t shape[4];
    const void *data;
    uint64_t bytes;
};

static struct st_entry entries[128];
static int n_entries;

static void st_add(const char *name, const char *dtype, const void *data, uint32_t n_dims,
                   uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    struct st_entry *e = &entries[n_entries++];
    snprintf(e->name, sizeof(e->name), "%s", name);
    e->dtype = dtype;
    e->n_dims = n_dims;
    uint64_t dims[4] = {a, b, c, d}, n = 1;
    for (uint32_t i = 0; i < n_dims; i++) {
        e->shape[i] = dims[i];
        n *= dims[i];
    }
    e->data = data;
    e->bytes = n * (strcmp(dtype, "U8") ? 4 : 1);
}

static void st_write(const char *path)
{
    json_object *hdr = json_object_new_object();
    uint64_t off = 0;
    for (int i = 0; i < n_entries; i++) {
        json_object *e = json_object_new_object(), *sh = json_object_new_array();
        json_object *offs = json_object_new_array();
        for (uint32_t d = 0; d < entries[i].n_dims; d++)
            json_object_array_add(sh, json_object_new_int64((int64_t)entries[i].shape[d]));
        json_object_array_add(offs, json_object_new_int64((int64_t)off));
        json_object_array_add(offs, json_object_new_int64((int64_t)(off + entries[i].bytes)));
        json_object_object_add(e, "dtype", json_object_new_string(entries[i].dtype));
        json_object_object_add(e, "shape", sh);
        json_object_object_add(e, "data_offsets", offs);
        json_object_object_add(hdr, entries[i].name, e);
        off += entries[i].bytes;
    }
    const char *js = json_object_to_json_string_ext(hdr, JSON_C_TO_STRING_PLAIN);
    uint64_t hl = (strlen(js) + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "open %s", path);
    if (!f) {
        json_object_put(hdr);
        return;
    }
    for (int i = 0; i < 8; i++)
        fputc((int)(hl >> (8 * i)) & 0xff, f);
    fputs(js, f);
    for (uint64_t i = strlen(js); i < hl; i++)
        fputc(' ', f);
    json_object_put(hdr);
    for (int i = 0; i < n_entries; i++)
        fwrite(entries[i].data, 1, entries[i].bytes, f);
    CHECK(fclose(f) == 0, "close %s", path);
}

/* ---- the checkpoint ----------------------------------------------------------------------- */

struct layer {
    float *ln1, *ln2, *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo, *sinks, *wr, *br;
    float *gate_up, *gate_up_b, *down, *down_b; /* float experts, transformers' x·W order */
    uint8_t *gu_blocks, *gu_scales, *d_blocks, *d_scales; /* MXFP4 experts */
};

static struct layer L[NL];
static float *emb, *head, *norm;
static struct rng rng;

static float *rnd(uint64_t n, float scale, float mean)
{
    float *v = test_xmalloc(n * sizeof(float));
    for (uint64_t i = 0; i < n; i++)
        v[i] = mean + scale * rng_normal(&rng);
    return v;
}

static uint8_t *rnd_u8(uint64_t n, uint32_t lo, uint32_t span)
{
    uint8_t *v = test_xmalloc(n);
    for (uint64_t i = 0; i < n; i++)
        v[i] = (uint8_t)(lo + rng_below(&rng, span));
    return v;
}

static void model_build(void)
{
    const float s = 1.0f / sqrtf(H);
    emb = rnd((uint64_t)V * H, 1.0f, 0);
    head = rnd((uint64_t)V * H, s, 0);
    norm = rnd(H, 0.1f, 1.0f);
    for (int l = 0; l < NL; l++) {
        struct layer *y = &L[l];
        y->ln1 = rnd(H, 0.1f, 1.0f), y->ln2 = rnd(H, 0.1f, 1.0f);
        y->wq = rnd(QW * H, s, 0), y->bq = rnd(QW, 0.02f, 0);
        y->wk = rnd(KVW * H, s, 0), y->bk = rnd(KVW, 0.02f, 0);
        y->wv = rnd(KVW * H, s, 0), y->bv = rnd(KVW, 0.02f, 0);
        y->wo = rnd(H * QW, 1.0f / sqrtf(QW), 0), y->bo = rnd(H, 0.02f, 0);
        y->sinks = rnd(NH, 1.0f, 0);
        y->wr = rnd(E * H, s, 0), y->br = rnd(E, 0.02f, 0);
        y->gate_up = rnd((uint64_t)E * H * 2 * F, s, 0);
        y->gate_up_b = rnd((uint64_t)E * 2 * F, 0.02f, 0);
        y->down = rnd((uint64_t)E * F * H, 1.0f / sqrtf(F), 0);
        y->down_b = rnd((uint64_t)E * H, 0.02f, 0);
        y->gu_blocks = rnd_u8((uint64_t)E * 2 * F * (H / 32) * 16, 0, 256);
        y->gu_scales = rnd_u8((uint64_t)E * 2 * F * (H / 32), 118, 8);
        y->d_blocks = rnd_u8((uint64_t)E * H * (F / 32) * 16, 0, 256);
        y->d_scales = rnd_u8((uint64_t)E * H * (F / 32), 118, 8);
    }
}

/* The tensors of the checkpoint; mxfp4: experts as blocks and scales. */
static void tensors_add(bool mxfp4)
{
    char nm[96];
    n_entries = 0;
    st_add("model.embed_tokens.weight", "F32", emb, 2, V, H, 0, 0);
    for (int l = 0; l < NL; l++) {
        struct layer *y = &L[l];
#define T(suffix, p, nd, a, b, c, d)                                                               \
    (snprintf(nm, sizeof(nm), "model.layers.%d.%s", l, suffix),                                    \
     st_add(nm, "F32", p, nd, a, b, c, d))
#define U(suffix, p, nd, a, b, c, d)                                                               \
    (snprintf(nm, sizeof(nm), "model.layers.%d.%s", l, suffix), st_add(nm, "U8", p, nd, a, b, c, d))
        T("input_layernorm.weight", y->ln1, 1, H, 0, 0, 0);
        T("self_attn.q_proj.weight", y->wq, 2, QW, H, 0, 0);
        T("self_attn.q_proj.bias", y->bq, 1, QW, 0, 0, 0);
        T("self_attn.k_proj.weight", y->wk, 2, KVW, H, 0, 0);
        T("self_attn.k_proj.bias", y->bk, 1, KVW, 0, 0, 0);
        T("self_attn.v_proj.weight", y->wv, 2, KVW, H, 0, 0);
        T("self_attn.v_proj.bias", y->bv, 1, KVW, 0, 0, 0);
        T("self_attn.o_proj.weight", y->wo, 2, H, QW, 0, 0);
        T("self_attn.o_proj.bias", y->bo, 1, H, 0, 0, 0);
        T("self_attn.sinks", y->sinks, 1, NH, 0, 0, 0);
        T("post_attention_layernorm.weight", y->ln2, 1, H, 0, 0, 0);
        T("mlp.router.weight", y->wr, 2, E, H, 0, 0);
        T("mlp.router.bias", y->br, 1, E, 0, 0, 0);
        if (mxfp4) {
            U("mlp.experts.gate_up_proj_blocks", y->gu_blocks, 4, E, 2 * F, H / 32, 16);
            U("mlp.experts.gate_up_proj_scales", y->gu_scales, 3, E, 2 * F, H / 32, 0);
            U("mlp.experts.down_proj_blocks", y->d_blocks, 4, E, H, F / 32, 16);
            U("mlp.experts.down_proj_scales", y->d_scales, 3, E, H, F / 32, 0);
        } else {
            T("mlp.experts.gate_up_proj", y->gate_up, 3, E, H, 2 * F, 0);
            T("mlp.experts.down_proj", y->down, 3, E, F, H, 0);
        }
        T("mlp.experts.gate_up_proj_bias", y->gate_up_b, 2, E, 2 * F, 0, 0);
        T("mlp.experts.down_proj_bias", y->down_b, 2, E, H, 0, 0);
#undef T
#undef U
    }
    st_add("model.norm.weight", "F32", norm, 1, H, 0, 0, 0);
    st_add("lm_head.weight", "F32", head, 2, V, H, 0, 0);
}

/* config.json edits: a key set to a JSON text, or removed (value NULL) at path "a" or "a.b". */
struct edit {
    const char *key;
    const char *json;
};

static json_object *config_build(const struct edit *ed, int n_ed)
{
    const char *text =
        "{\"architectures\": [\"GptOssForCausalLM\"], \"model_type\": \"gpt_oss\","
        "\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
        "\"num_key_value_heads\": 2, \"head_dim\": 16, \"intermediate_size\": 96,"
        "\"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"vocab_size\": 304,"
        "\"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-05, \"sliding_window\": 8,"
        "\"layer_types\": [\"sliding_attention\", \"full_attention\"], \"attention_bias\": true,"
        "\"swiglu_limit\": 7.0, \"hidden_act\": \"silu\", \"tie_word_embeddings\": false,"
        "\"attention_dropout\": 0.0, \"router_aux_loss_coef\": 0.9, \"use_cache\": true,"
        "\"output_router_logits\": false, \"initializer_range\": 0.02, \"dtype\": \"float32\","
        "\"transformers_version\": \"5.17.0\", \"pad_token_id\": null, \"eos_token_id\": null,"
        "\"bos_token_id\": null,"
        "\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 150000.0, \"factor\": 4.0,"
        "\"original_max_position_embeddings\": 64, \"beta_fast\": 32.0, \"beta_slow\": 1.0,"
        "\"truncate\": false}}";
    json_object *c = json_tokener_parse(text);
    for (int i = 0; i < n_ed; i++) {
        json_object *at = c;
        char key[64];
        snprintf(key, sizeof(key), "%s", ed[i].key);
        char *dot = strchr(key, '.');
        if (dot) {
            *dot = 0;
            json_object_object_get_ex(c, key, &at);
        }
        const char *k = dot ? dot + 1 : key;
        if (ed[i].json)
            json_object_object_add(at, k, json_tokener_parse(ed[i].json));
        else
            json_object_object_del(at, k);
    }
    return c;
}

static void copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    char buf[4096];
    size_t n;
    CHECK(a && b, "copy %s -> %s", from, to);
    while (a && b && (n = fread(buf, 1, sizeof(buf), a)) > 0)
        fwrite(buf, 1, n, b);
    if (a)
        fclose(a);
    if (b)
        fclose(b);
}

/* Writes tmp_root/NAME with the current tensors and the config edits; returns the path. */
static const char *ckpt_write(const char *name, const struct edit *ed, int n_ed, char *dir,
                              size_t size)
{
    char path[600], data[512];
    snprintf(dir, size, "%s/%s", tmp_root, name);
    mkdir(dir, 0755);
    json_object *c = config_build(ed, n_ed);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    CHECK(json_object_to_file_ext(path, c, JSON_C_TO_STRING_PRETTY) == 0, "write %s", path);
    json_object_put(c);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    st_write(path);
    const char *files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        copy_file(
            test_data_path(data, sizeof(data),
                           i ? "hf-ref/hf/tokenizer_config.json" : "hf-ref/hf/tokenizer.json"),
            path);
    }
    return dir;
}

static int convert(const char *dir, const char *out, enum quant_mix mix)
{
    struct convert_config cfg = {.hf_dir = dir, .out_path = out, .mix = mix, .n_threads = 2};
    return convert_run(&cfg, NULL);
}

/* ---- checks ------------------------------------------------------------------------------- */

/* Row r of tensor NAME (ne0 floats) of an opened GGUF, dequantized. */
static bool gguf_row(const struct gguf_file *g, const char *name, uint64_t r, float *out,
                     uint32_t *type)
{
    const struct gguf_tensor *t = gguf_find_tensor(g, name);
    CHECK(t != NULL, "%s missing", name);
    if (!t)
        return false;
    uint64_t rb = 0;
    quant_row_bytes(t->type, t->ne[0], &rb);
    *type = t->type;
    return quant_ref_dequantize(t->type, (const uint8_t *)t->data + r * rb, out,
                                (int64_t)t->ne[0]) == 0;
}

/* Every element of GGUF tensor NAME (ne0 x rows) equals want(r, i), exactly. */
static void expect_tensor(const struct gguf_file *g, const char *name, uint64_t ne0, uint64_t rows,
                          uint32_t want_type, float (*want)(int l, uint64_t r, uint64_t i), int l)
{
    float *row = test_xmalloc(ne0 * sizeof(float));
    uint64_t bad = 0;
    uint32_t type = 0;
    for (uint64_t r = 0; r < rows; r++) {
        if (!gguf_row(g, name, r, row, &type))
            break;
        for (uint64_t i = 0; i < ne0; i++)
            bad += row[i] != want(l, r, i);
    }
    CHECK(bad == 0 && type == want_type,
          "%s: %llu elements differ from the mapping (type %u, "
          "want %u)",
          name, (unsigned long long)bad, type, want_type);
    free(row);
}

/* The mapping of docs/formats.md §4b, element (row r, column i) of each GGUF tensor. */
static float w_gate(int l, uint64_t r, uint64_t i) /* r = e * F + f, i = h */
{
    return L[l].gate_up[((r / F) * H + i) * 2 * F + 2 * (r % F)];
}
static float w_up(int l, uint64_t r, uint64_t i)
{
    return L[l].gate_up[((r / F) * H + i) * 2 * F + 2 * (r % F) + 1];
}
static float w_down(int l, uint64_t r, uint64_t i) /* r = e * H + h, i = f */
{
    return L[l].down[((r / H) * F + i) * H + r % H];
}
static float b_gate(int l, uint64_t r, uint64_t i) /* r = e, i = f */
{
    return L[l].gate_up_b[r * 2 * F + 2 * i];
}
static float b_up(int l, uint64_t r, uint64_t i)
{
    return L[l].gate_up_b[r * 2 * F + 2 * i + 1];
}
static float b_down(int l, uint64_t r, uint64_t i)
{
    return L[l].down_b[r * H + i];
}
static float sinks(int l, uint64_t r, uint64_t i)
{
    (void)r;
    return L[l].sinks[i];
}
static float bq(int l, uint64_t r, uint64_t i)
{
    (void)r;
    return L[l].bq[i];
}
static float wk(int l, uint64_t r, uint64_t i)
{
    return L[l].wk[r * H + i];
}
static float router_b(int l, uint64_t r, uint64_t i)
{
    (void)r;
    return L[l].br[i];
}

/* transformers' MXFP4: element 2i of a block from the low nibble of byte i, 2i + 1 from the
 * high one, value(code) * 2^(scale - 127). */
static float hf_mxfp4(const uint8_t *blocks, const uint8_t *scales, uint64_t row, uint64_t n,
                      uint64_t i)
{
    static const float lut[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    uint64_t b = i / 32, j = i % 32;
    uint8_t byte = blocks[(row * (n / 32) + b) * 16 + j / 2];
    uint8_t code = j % 2 ? byte >> 4 : byte & 0x0F;
    return ldexpf(lut[code], (int)scales[row * (n / 32) + b] - 127);
}
static float m_gate(int l, uint64_t r, uint64_t i) /* HF row e * 2F + 2f */
{
    return hf_mxfp4(L[l].gu_blocks, L[l].gu_scales, (r / F) * 2 * F + 2 * (r % F), H, i);
}
static float m_up(int l, uint64_t r, uint64_t i)
{
    return hf_mxfp4(L[l].gu_blocks, L[l].gu_scales, (r / F) * 2 * F + 2 * (r % F) + 1, H, i);
}
static float m_down(int l, uint64_t r, uint64_t i)
{
    return hf_mxfp4(L[l].d_blocks, L[l].d_scales, r, F, i);
}

static void check_kv(const struct gguf_file *g)
{
    uint32_t u = 0;
    float f = 0;
    struct gguf_str s = {0};
    CHECK(gguf_get_str(g, "general.architecture", &s) == 0 && s.len == 7 &&
              !memcmp(s.ptr, "gpt-oss", 7),
          "architecture");
    CHECK(gguf_get_u32(g, "gpt-oss.attention.sliding_window", &u) == 0 && u == 8, "window %u", u);
    CHECK(gguf_get_u32(g, "gpt-oss.expert_feed_forward_length", &u) == 0 && u == F, "ffn %u", u);
    CHECK(gguf_get_str(g, "gpt-oss.rope.scaling.type", &s) == 0 && s.len == 4 &&
              !memcmp(s.ptr, "yarn", 4),
          "rope scaling type");
    CHECK(gguf_get_f32(g, "gpt-oss.rope.scaling.factor", &f) == 0 && f == 4.0f, "factor %g", f);
    CHECK(gguf_get_u32(g, "gpt-oss.rope.scaling.original_context_length", &u) == 0 && u == 64,
          "original context %u", u);
    CHECK(gguf_get_f32(g, "gpt-oss.rope.freq_base", &f) == 0 && f == 150000.0f, "base %g", f);
}

/* The converted file runs: a few tokens through strata on the CPU, finite logits. */
static void check_runs(const char *path)
{
    struct strata_config cfg;
    struct strata *s = NULL;
    struct strata_stream *st = NULL;
    strata_config_init(&cfg);
    cfg.model_path = path;
    cfg.device = STRATA_DEVICE_CPU;
    cfg.n_threads = 2;
    cfg.n_ctx = 64;
    int rc = strata_open(&cfg, &s);
    CHECK(rc == 0, "strata_open %s: %s", path, strata_error());
    if (rc)
        return;
    const int32_t ids[12] = {5, 77, 120, 3, 250, 9, 31, 64, 100, 2, 17, 299};
    float *lg = test_xmalloc(sizeof(float) * V);
    CHECK(strata_stream_open(s, 64, &st) == 0 && strata_eval(st, ids, 12, lg) == 0, "eval: %s",
          strata_error());
    int finite = 0;
    for (int i = 0; i < V; i++)
        finite += isfinite(lg[i]);
    CHECK(finite == V, "%d of %d logits finite", finite, V);
    strata_stream_close(st);
    strata_close(s);
    free(lg);
}

static void check_float_experts(void)
{
    char dir[512], out[600];
    tensors_add(false);
    ckpt_write("float", NULL, 0, dir, sizeof(dir));
    snprintf(out, sizeof(out), "%s/float.gguf", tmp_root);
    int rc = convert(dir, out, QUANT_MIX_F32);
    CHECK(rc == 0, "convert float experts: %s", err_msg());
    struct gguf_file *g = NULL;
    if (rc || gguf_open(out, &g))
        return;
    check_kv(g);
    for (int l = 0; l < NL; l++) {
        char nm[96];
#define X(suffix, ne0, rows, type, fn)                                                             \
    (snprintf(nm, sizeof(nm), "blk.%d.%s", l, suffix), expect_tensor(g, nm, ne0, rows, type, fn, l))
        X("ffn_gate_exps.weight", H, (uint64_t)E * F, QUANT_F32, w_gate);
        X("ffn_up_exps.weight", H, (uint64_t)E * F, QUANT_F32, w_up);
        X("ffn_down_exps.weight", F, (uint64_t)E * H, QUANT_F32, w_down);
        X("ffn_gate_exps.bias", F, E, QUANT_F32, b_gate);
        X("ffn_up_exps.bias", F, E, QUANT_F32, b_up);
        X("ffn_down_exps.bias", H, E, QUANT_F32, b_down);
        X("attn_sinks.weight", NH, 1, QUANT_F32, sinks);
        X("attn_q.bias", QW, 1, QUANT_F32, bq);
        X("attn_k.weight", H, KVW, QUANT_F32, wk);
        X("ffn_gate_inp.bias", E, 1, QUANT_F32, router_b);
#undef X
    }
    gguf_close(g);
    printf("  float experts (x·W, gate/up interleaved) at f32: every mapped tensor bit-exact\n");
    check_runs(out);
    /* q8_0: biases and sinks stay F32, the experts become MXFP4 */
    rc = convert(dir, out, QUANT_MIX_Q8_0);
    CHECK(rc == 0, "convert at q8_0: %s", err_msg());
    if (!rc && gguf_open(out, &g) == 0) {
        const struct gguf_tensor *t = gguf_find_tensor(g, "blk.1.ffn_down_exps.weight");
        const struct gguf_tensor *b = gguf_find_tensor(g, "blk.1.ffn_gate_exps.bias");
        CHECK(t && t->type == QUANT_MXFP4 && b && b->type == QUANT_F32, "q8_0 types %u %u",
              t ? t->type : 99, b ? b->type : 99);
        gguf_close(g);
        check_runs(out);
    }
}

static void check_mxfp4_experts(void)
{
    char dir[512], out[600];
    tensors_add(true);
    ckpt_write("mxfp4", NULL, 0, dir, sizeof(dir));
    const enum quant_mix mixes[2] = {QUANT_MIX_F32, QUANT_MIX_Q8_0};
    const uint32_t want[2] = {QUANT_F32, QUANT_MXFP4};
    for (int m = 0; m < 2; m++) {
        snprintf(out, sizeof(out), "%s/mxfp4-%d.gguf", tmp_root, m);
        int rc = convert(dir, out, mixes[m]);
        CHECK(rc == 0, "convert mxfp4 experts: %s", err_msg());
        struct gguf_file *g = NULL;
        if (rc || gguf_open(out, &g))
            continue;
        for (int l = 0; l < NL; l++) {
            char nm[96];
            snprintf(nm, sizeof(nm), "blk.%d.ffn_gate_exps.weight", l);
            expect_tensor(g, nm, H, (uint64_t)E * F, want[m], m_gate, l);
            snprintf(nm, sizeof(nm), "blk.%d.ffn_up_exps.weight", l);
            expect_tensor(g, nm, H, (uint64_t)E * F, want[m], m_up, l);
            snprintf(nm, sizeof(nm), "blk.%d.ffn_down_exps.weight", l);
            expect_tensor(g, nm, F, (uint64_t)E * H, want[m], m_down, l);
        }
        gguf_close(g);
        check_runs(out);
    }
    printf("  MXFP4 experts: transformers' values at f32, the same blocks repacked at q8_0\n");
}

static void expect_refused(const char *label, const struct edit *ed, int n_ed, const char *word)
{
    char dir[512], out[600];
    tensors_add(false);
    ckpt_write("refused", ed, n_ed, dir, sizeof(dir));
    snprintf(out, sizeof(out), "%s/refused.gguf", tmp_root);
    int rc = convert(dir, out, QUANT_MIX_F32);
    CHECK(rc == -ENOTSUP && strstr(err_msg(), word) && access(out, F_OK) != 0,
          "%s: rc %d, message %s", label, rc, err_msg());
    printf("  refused %-22s %s\n", label, err_msg());
}

/* A config the converter takes (0 from convert). */
static void expect_converts(const char *label, const struct edit *ed, int n_ed)
{
    char dir[512], out[600];
    tensors_add(false);
    ckpt_write("accepted", ed, n_ed, dir, sizeof(dir));
    snprintf(out, sizeof(out), "%s/accepted.gguf", tmp_root);
    int rc = convert(dir, out, QUANT_MIX_F32);
    CHECK(rc == 0 && access(out, F_OK) == 0, "%s: rc %d, message %s", label, rc,
          rc ? err_msg() : "");
    printf("  converts %-21s %s\n", label, rc ? "no" : "yes");
    remove(out);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

int main(void)
{
    rng_seed(&rng, test_seed(NAME), 1);
    snprintf(tmp_root, sizeof(tmp_root), "/tmp/strata-test-convert-gptoss-XXXXXX");
    if (!mkdtemp(tmp_root)) {
        perror("mkdtemp");
        return 1;
    }
    model_build();
    check_float_experts();
    check_mxfp4_experts();

    const struct edit limit = {"swiglu_limit", "8.0"}, bias = {"attention_bias", "false"};
    const struct edit layers = {"layer_types", "[\"full_attention\", \"full_attention\"]"};
    const struct edit trunc = {"rope_parameters.truncate", NULL};
    const struct edit factor = {"rope_parameters.factor", "8.0"};
    const struct edit linear = {"rope_parameters.rope_type", "\"linear\""};
    const struct edit unknown = {"foo_scale", "3"};
    expect_refused("swiglu_limit 8", &limit, 1, "swiglu_limit");
    expect_refused("attention_bias false", &bias, 1, "attention_bias");
    expect_refused("layer_types all full", &layers, 1, "layer_types");
    expect_refused("truncate absent", &trunc, 1, "truncate");
    expect_refused("factor 8 (256 / 64 = 4)", &factor, 1, "factor");
    expect_refused("rope_type linear", &linear, 1, "rope_type");
    expect_refused("unknown key", &unknown, 1, "foo_scale");
    /* plain RoPE: truncate is YaRN's, so its absence does not matter there */
    const struct edit plain[] = {{"rope_parameters.rope_type", "\"default\""},
                                 {"rope_parameters.truncate", NULL},
                                 {"rope_parameters.factor", NULL},
                                 {"rope_parameters.original_max_position_embeddings", NULL},
                                 {"rope_parameters.beta_fast", NULL},
                                 {"rope_parameters.beta_slow", NULL}};
    expect_converts("plain rope", plain, 6);

    nftw(tmp_root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    for (int l = 0; l < NL; l++) {
        struct layer *y = &L[l];
        float *fs[] = {y->ln1, y->ln2,     y->wq,        y->bq,   y->wk,    y->bk,
                       y->wv,  y->bv,      y->wo,        y->bo,   y->sinks, y->wr,
                       y->br,  y->gate_up, y->gate_up_b, y->down, y->down_b};
        for (size_t i = 0; i < sizeof(fs) / sizeof(fs[0]); i++)
            free(fs[i]);
        free(y->gu_blocks), free(y->gu_scales), free(y->d_blocks), free(y->d_scales);
    }
    free(emb), free(head), free(norm);
    return test_finish(NAME);
}
