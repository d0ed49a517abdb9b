/* test_convert_qwen3next: strata convert on tiny Qwen3NextForCausalLM and
 * Qwen3_5MoeForConditionalGeneration checkpoints written here.
 *
 * The checkpoints: hidden 64, 4 layers, 4 q / 2 kv heads of 32 (partial_rotary_factor 0.25: 8
 * rotated dims), 8 experts top-2 of ffn 32 with a shared expert of 32, Gated DeltaNet with 2 key
 * and 6 value heads of 16 (3 per key head, so that the tiled order is not its own inverse), conv
 * kernel 4, vocab 304 with the tokenizer of tests/data/hf-ref.
 * qwen3next: full attention every 2 layers (1, 3), its fused in_proj_qkvz / in_proj_ba,
 * experts per expert in even layers and fused (gate_up_proj [E, 2F, H], down_proj [E, H, F])
 * in odd ones. qwen35moe: text_config with layer_types only (full attention at layer 3, the
 * interval 4 inferred), in_proj_qkv / in_proj_z / in_proj_b / in_proj_a, mrope_section [2, 1, 1],
 * fused experts except in layer 0, the text model under model.language_model. plus
 * model.visual.* tensors that must be dropped; and the same weights as a text-only
 * Qwen3_5MoeForCausalLM config (prefix model.). Both have an MTP head (mtp_num_hidden_layers 1:
 * mtp.fc, mtp.pre_fc_norm_embedding / _hidden, mtp.norm and mtp.layers.0, a full-attention
 * layer with per-expert experts in qwen3next, fused in qwen35moe), written by default as block
 * 4 (blk.4.nextn.eh_proj / enorm / hnorm / shared_head_norm + the layer's tensors,
 * block_count 5, nextn_predict_layers 1) and dropped by --no-mtp (the output without it).
 * Every expected GGUF tensor is computed here from the HF values by index arithmetic written
 * independently of the converter's segment plan (FORMATS §4(c), §4(f), /tmp contract): norms
 * + 1 except linear_attn.norm, ssm_a = -exp(A_log), the qkvz split, the ba grouping, the tiled
 * value-head permutation (V rows of in_proj_qkv and conv1d, z, b, a, A_log, dt_bias, out_proj's
 * columns), the expert split. Checks at f32: every key, and every tensor's name, shape, type and
 * values bit for bit, and no other tensor; at q8_0: the norms, router, shared-expert gate,
 * conv, dt, a F32, the matrices Q8_0; strata opens each file and gives finite logits (the
 * forward itself is checked by the runtime's tests). The MTP head is also dropped when the
 * config has no mtp_num_hidden_layers or the checkpoint no mtp.* tensor, and --no-mtp converts
 * mtp_num_hidden_layers 2 and mtp_use_dedicated_embeddings true, which are refused (by name)
 * without it, as is an MTP layer short of a tensor. Then the key audit refuses, naming the key:
 * for qwen3next norm_topk_prob false, linear_value_head_dim != linear_key_head_dim,
 * linear_num_value_heads not a multiple of the key heads, layer_types off the interval
 * pattern, decoder_sparse_step 2, rope_scaling yarn; for qwen35moe a mrope_section that does
 * not cover the rotated dims, layer_types off the pattern, an unknown key in text_config,
 * tie_word_embeddings that disagree. Deterministic (fixed seed). */
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
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
#include "quant.h"
#include "strata.h"
#include "testutil.h"

#define NAME "test_convert_qwen3next"
#define SEED 0x51e3a7u
#define H 64
#define NL 4
#define NH 4
#define NKV 2
#define HD 32
#define NROT 8 /* HD x 0.25 */
#define E 8
#define TOPK 2
#define F 32
#define FS 32
#define NK 2
#define NV 6 /* r = 3 != NK: the tiled permutation differs from its inverse */
#define D 16
#define KC 4
#define NVOCAB 304
#define R (NV / NK)
#define KD (NK * D)
#define VD (NV * D)
#define CH (2 * KD + VD) /* conv channels */
#define QW (NH * HD)
#define KVW (NKV * HD)

enum arch { QWEN3NEXT, QWEN35MOE };

static char tmp_root[256];
static struct rng rng;

/* ---- the HF tensors, kept by name --------------------------------------------------------- */

struct hft {
    char name[128];
    uint32_t n_dims;
    uint64_t shape[3];
    uint64_t n;
    float *data;
};

static struct hft hf[512];
static int n_hf;

/* A new HF tensor of random values (mean + scale·N(0, 1)). */
static float *hf_new(float mean, float scale, uint32_t n_dims, uint64_t a, uint64_t b, uint64_t c,
                     const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static float *hf_new(float mean, float scale, uint32_t n_dims, uint64_t a, uint64_t b, uint64_t c,
                     const char *fmt, ...)
{
    struct hft *t = &hf[n_hf++];
    va_list ap;
    uint64_t dims[3] = {a, b, c};

    va_start(ap, fmt);
    vsnprintf(t->name, sizeof(t->name), fmt, ap);
    va_end(ap);
    t->n_dims = n_dims;
    t->n = 1;
    for (uint32_t i = 0; i < n_dims; i++) {
        t->shape[i] = dims[i];
        t->n *= dims[i];
    }
    t->data = test_xmalloc(t->n * sizeof(float));
    for (uint64_t i = 0; i < t->n; i++)
        t->data[i] = mean + scale * rng_normal(&rng);
    return t->data;
}

static void hf_free_all(void)
{
    for (int i = 0; i < n_hf; i++)
        free(hf[i].data);
    n_hf = 0;
}

/* The values of HF tensor NAME (the test's own bookkeeping; NULL fails). */
static const float *hf_get(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const float *hf_get(const char *fmt, ...)
{
    char name[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    for (int i = 0; i < n_hf; i++)
        if (!strcmp(hf[i].name, name))
            return hf[i].data;
    fprintf(stderr, "test bug: no HF tensor %s\n", name);
    exit(1);
}

/* HF tensors whose names start with this are left out of the files written (NULL: none). */
static const char *st_skip;

static bool st_skipped(const struct hft *t)
{
    return st_skip && !strncmp(t->name, st_skip, strlen(st_skip));
}

/* Writes the HF tensors as F32 safetensors; names starting with `from` start with `to` instead. */
static void st_write(const char *path, const char *from, const char *to)
{
    json_object *hdr = json_object_new_object();
    uint64_t off = 0;
    char name[160];

    for (int i = 0; i < n_hf; i++) {
        if (st_skipped(&hf[i]))
            continue;
        json_object *e = json_object_new_object(), *sh = json_object_new_array();
        json_object *offs = json_object_new_array();
        for (uint32_t d = 0; d < hf[i].n_dims; d++)
            json_object_array_add(sh, json_object_new_int64((int64_t)hf[i].shape[d]));
        json_object_array_add(offs, json_object_new_int64((int64_t)off));
        json_object_array_add(offs, json_object_new_int64((int64_t)(off + hf[i].n * 4)));
        json_object_object_add(e, "dtype", json_object_new_string("F32"));
        json_object_object_add(e, "shape", sh);
        json_object_object_add(e, "data_offsets", offs);
        const char *rest = hf[i].name, *head = "";
        if (!strncmp(rest, from, strlen(from))) {
            head = to;
            rest += strlen(from);
        }
        snprintf(name, sizeof(name), "%.20s%.127s", head, rest);
        json_object_object_add(hdr, name, e);
        off += hf[i].n * 4;
    }
    const char *js = json_object_to_json_string_ext(hdr, JSON_C_TO_STRING_PLAIN);
    uint64_t hl = (strlen(js) + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "open %s", path);
    if (f) {
        for (int i = 0; i < 8; i++)
            fputc((int)(hl >> (8 * i)) & 0xff, f);
        fputs(js, f);
        for (uint64_t i = strlen(js); i < hl; i++)
            fputc(' ', f);
        for (int i = 0; i < n_hf; i++)
            if (!st_skipped(&hf[i]))
                fwrite(hf[i].data, 4, hf[i].n, f);
        CHECK(fclose(f) == 0, "close %s", path);
    }
    json_object_put(hdr);
}

/* ---- the checkpoints ---------------------------------------------------------------------- */

/* Layer l is full attention; so is the MTP layer, block NL, whatever the interval. */
static bool layer_full(enum arch a, int l)
{
    return l == NL || (l + 1) % (a == QWEN3NEXT ? 2 : 4) == 0;
}

/* Experts fused in this layer (else per expert); the MTP layer (NL): per expert in qwen3next,
 * fused in qwen35moe. */
static bool layer_fused(enum arch a, int l)
{
    return a == QWEN3NEXT ? l % 2 == 1 : l != 0;
}

/* The routed experts of one layer: per expert, or gate_up_proj / down_proj with the same
 * values (gate rows first). */
static void experts_build(const char *lp, bool fused)
{
    const float s = 1.0f / sqrtf(H);
    if (!fused) {
        for (int e = 0; e < E; e++) {
            hf_new(0, s, 2, F, H, 0, "%smlp.experts.%d.gate_proj.weight", lp, e);
            hf_new(0, s, 2, F, H, 0, "%smlp.experts.%d.up_proj.weight", lp, e);
            hf_new(0, s, 2, H, F, 0, "%smlp.experts.%d.down_proj.weight", lp, e);
        }
        return;
    }
    hf_new(0, s, 3, E, 2 * F, H, "%smlp.experts.gate_up_proj", lp);
    hf_new(0, s, 3, E, H, F, "%smlp.experts.down_proj", lp);
}

/* One decoder layer under lp (layer l's kind of attention and expert storage). */
static void layer_build(enum arch a, const char *lp, int l)
{
    const float s = 1.0f / sqrtf(H);

    hf_new(0, 0.1f, 1, H, 0, 0, "%sinput_layernorm.weight", lp);
    hf_new(0, 0.1f, 1, H, 0, 0, "%spost_attention_layernorm.weight", lp);
    if (layer_full(a, l)) {
        hf_new(0, s, 2, 2 * QW, H, 0, "%sself_attn.q_proj.weight", lp);
        hf_new(0, s, 2, KVW, H, 0, "%sself_attn.k_proj.weight", lp);
        hf_new(0, s, 2, KVW, H, 0, "%sself_attn.v_proj.weight", lp);
        hf_new(0, 1.0f / sqrtf(QW), 2, H, QW, 0, "%sself_attn.o_proj.weight", lp);
        hf_new(0, 0.1f, 1, HD, 0, 0, "%sself_attn.q_norm.weight", lp);
        hf_new(0, 0.1f, 1, HD, 0, 0, "%sself_attn.k_norm.weight", lp);
    } else {
        if (a == QWEN3NEXT) {
            hf_new(0, s, 2, 2 * KD + 2 * VD, H, 0, "%slinear_attn.in_proj_qkvz.weight", lp);
            hf_new(0, s, 2, 2 * NV, H, 0, "%slinear_attn.in_proj_ba.weight", lp);
        } else {
            hf_new(0, s, 2, CH, H, 0, "%slinear_attn.in_proj_qkv.weight", lp);
            hf_new(0, s, 2, VD, H, 0, "%slinear_attn.in_proj_z.weight", lp);
            hf_new(0, s, 2, NV, H, 0, "%slinear_attn.in_proj_b.weight", lp);
            hf_new(0, s, 2, NV, H, 0, "%slinear_attn.in_proj_a.weight", lp);
        }
        hf_new(0, 0.5f, 3, CH, 1, KC, "%slinear_attn.conv1d.weight", lp);
        hf_new(1.0f, 0.3f, 1, NV, 0, 0, "%slinear_attn.dt_bias", lp);
        hf_new(0.5f, 0.5f, 1, NV, 0, 0, "%slinear_attn.A_log", lp);
        hf_new(1.0f, 0.1f, 1, D, 0, 0, "%slinear_attn.norm.weight", lp);
        hf_new(0, 1.0f / sqrtf(VD), 2, H, VD, 0, "%slinear_attn.out_proj.weight", lp);
    }
    hf_new(0, s, 2, E, H, 0, "%smlp.gate.weight", lp);
    experts_build(lp, layer_fused(a, l));
    hf_new(0, s, 2, 1, H, 0, "%smlp.shared_expert_gate.weight", lp);
    hf_new(0, s, 2, FS, H, 0, "%smlp.shared_expert.gate_proj.weight", lp);
    hf_new(0, s, 2, FS, H, 0, "%smlp.shared_expert.up_proj.weight", lp);
    hf_new(0, 1.0f / sqrtf(FS), 2, H, FS, 0, "%smlp.shared_expert.down_proj.weight", lp);
}

static void model_build(enum arch a)
{
    const char *pre = a == QWEN3NEXT ? "model." : "model.language_model.";
    const float s = 1.0f / sqrtf(H);
    char lp[96];

    hf_free_all();
    hf_new(0, 1.0f, 2, NVOCAB, H, 0, "%sembed_tokens.weight", pre);
    for (int l = 0; l < NL; l++) {
        snprintf(lp, sizeof(lp), "%slayers.%d.", pre, l);
        layer_build(a, lp, l);
    }
    hf_new(0, 0.1f, 1, H, 0, 0, "%snorm.weight", pre);
    hf_new(0, s, 2, NVOCAB, H, 0, "lm_head.weight");
    /* the MTP head, kept as block NL unless --no-mtp */
    hf_new(0, 1.0f / sqrtf(2 * H), 2, H, 2 * H, 0, "mtp.fc.weight");
    hf_new(0, 0.1f, 1, H, 0, 0, "mtp.pre_fc_norm_embedding.weight");
    hf_new(0, 0.1f, 1, H, 0, 0, "mtp.pre_fc_norm_hidden.weight");
    hf_new(0, 0.1f, 1, H, 0, 0, "mtp.norm.weight");
    layer_build(a, "mtp.layers.0.", NL);
    /* what the converter must drop */
    if (a == QWEN35MOE)
        hf_new(0, s, 2, 32, 48, 0, "model.visual.patch_embed.proj.weight");
}

/* ---- config.json -------------------------------------------------------------------------- */

#define TEXT_KEYS                                                                                  \
    "\"hidden_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 4,"                   \
    "\"num_key_value_heads\": 2, \"head_dim\": 32, \"moe_intermediate_size\": 32,"                 \
    "\"shared_expert_intermediate_size\": 32, \"num_experts\": 8, \"num_experts_per_tok\": 2,"     \
    "\"vocab_size\": 304, \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-06,"              \
    "\"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 16, \"linear_value_head_dim\": 16,"   \
    "\"linear_num_key_heads\": 2, \"linear_num_value_heads\": 6, \"hidden_act\": \"silu\","        \
    "\"attention_bias\": false, \"attention_dropout\": 0.0, \"norm_topk_prob\": true,"             \
    "\"router_aux_loss_coef\": 0.001, \"output_router_logits\": false,"                            \
    "\"initializer_range\": 0.02, \"use_cache\": true, \"tie_word_embeddings\": false,"            \
    "\"bos_token_id\": null, \"eos_token_id\": null, \"pad_token_id\": null"

static const char *const config_qwen3next =
    "{\"architectures\": [\"Qwen3NextForCausalLM\"], \"model_type\": \"qwen3_next\"," TEXT_KEYS
    ", \"intermediate_size\": 96, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [],"
    "\"use_sliding_window\": false, \"full_attention_interval\": 2,"
    "\"layer_types\": [\"linear_attention\", \"full_attention\", \"linear_attention\","
    "\"full_attention\"], \"rope_theta\": 10000000.0, \"partial_rotary_factor\": 0.25,"
    "\"rope_scaling\": null, \"torch_dtype\": \"float32\","
    "\"mtp_num_hidden_layers\": 1, \"mtp_use_dedicated_embeddings\": false,"
    "\"transformers_version\": \"4.57.0.dev0\"}";

#define TEXT35_KEYS                                                                                \
    TEXT_KEYS ", \"model_type\": \"qwen3_5_moe_text\","                                            \
              "\"layer_types\": [\"linear_attention\", \"linear_attention\","                      \
              "\"linear_attention\", \"full_attention\"], \"attn_output_gate\": true,"             \
              "\"mtp_num_hidden_layers\": 1, \"mtp_use_dedicated_embeddings\": false,"             \
              "\"mamba_ssm_dtype\": \"float32\", \"dtype\": \"float32\","                          \
              "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000.0,"      \
              "\"partial_rotary_factor\": 0.25, \"mrope_section\": [2, 1, 1],"                     \
              "\"mrope_interleaved\": true}"

static const char *const config_qwen35moe =
    "{\"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"], \"model_type\": "
    "\"qwen3_5_moe\", \"tie_word_embeddings\": false, \"transformers_version\": \"5.0.0\","
    "\"image_token_id\": 248056, \"video_token_id\": 248057, \"vision_start_token_id\": 248053,"
    "\"vision_end_token_id\": 248054, \"vision_config\": {\"depth\": 2, \"hidden_size\": 32,"
    "\"model_type\": \"qwen3_5_moe_vision\"}, \"text_config\": {" TEXT35_KEYS "}}";

/* A text-only Qwen3_5MoeForCausalLM: the text config at the top level. */
static const char *const config_qwen35moe_text =
    "{\"architectures\": [\"Qwen3_5MoeForCausalLM\"], " TEXT35_KEYS "}";

/* config.json edits: the key at a dotted path set to a JSON text, or removed (json NULL). */
struct edit {
    const char *path;
    const char *json;
};

static json_object *config_build(const char *text, const struct edit *ed, int n_ed)
{
    json_object *c = json_tokener_parse(text);
    CHECK(c != NULL, "test bug: config does not parse");
    for (int i = 0; c && i < n_ed; i++) {
        char path[128], *k = path, *dot;
        json_object *at = c;
        snprintf(path, sizeof(path), "%s", ed[i].path);
        while ((dot = strchr(k, '.'))) {
            *dot = '\0';
            json_object_object_get_ex(at, k, &at);
            k = dot + 1;
        }
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

/* Writes tmp_root/NAME: the config with its edits, the HF tensors (prefix `from` renamed `to`),
 * the tokenizer. */
static const char *ckpt_write(const char *name, const char *config, const struct edit *ed, int n_ed,
                              const char *from, const char *to, char *dir, size_t size)
{
    char path[600], data[512];
    snprintf(dir, size, "%s/%s", tmp_root, name);
    mkdir(dir, 0755);
    json_object *c = config_build(config, ed, n_ed);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    CHECK(json_object_to_file_ext(path, c, JSON_C_TO_STRING_PRETTY) == 0, "write %s", path);
    json_object_put(c);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    st_write(path, from, to);
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

static int convert(const char *dir, const char *out, enum quant_mix mix, bool no_mtp,
                   struct convert_stats *st)
{
    struct convert_config cfg = {
        .hf_dir = dir, .out_path = out, .mix = mix, .n_threads = 2, .no_mtp = no_mtp};
    return convert_run(&cfg, st);
}

/* ---- the expected GGUF tensors ------------------------------------------------------------ */

struct want {
    char name[64];
    uint32_t n_dims;
    uint64_t ne[3];
    bool f32; /* F32 in every mix */
    float *v; /* (ne0 x rows) the expected values, row-major */
};

static struct want wants[256];
static int n_want;

static float *want_add(bool f32, uint32_t n_dims, uint64_t ne0, uint64_t ne1, uint64_t ne2,
                       const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static float *want_add(bool f32, uint32_t n_dims, uint64_t ne0, uint64_t ne1, uint64_t ne2,
                       const char *fmt, ...)
{
    struct want *w = &wants[n_want++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->name, sizeof(w->name), fmt, ap);
    va_end(ap);
    w->n_dims = n_dims;
    w->ne[0] = ne0, w->ne[1] = ne1 ? ne1 : 1, w->ne[2] = ne2 ? ne2 : 1;
    w->f32 = f32;
    w->v = test_xmalloc(ne0 * w->ne[1] * w->ne[2] * sizeof(float));
    return w->v;
}

static void wants_free(void)
{
    for (int i = 0; i < n_want; i++)
        free(wants[i].v);
    n_want = 0;
}

/* A GGUF tensor equal to HF tensor `src` of n floats, optionally + 1. */
static void want_copy(bool f32, bool plus1, uint32_t n_dims, uint64_t ne0, uint64_t ne1,
                      const float *src, const char *name)
{
    float *v = want_add(f32, n_dims, ne0, ne1, 0, "%s", name);
    for (uint64_t i = 0; i < ne0 * (ne1 ? ne1 : 1); i++)
        v[i] = plus1 ? src[i] + 1.0f : src[i];
}

/* The HF value head that GGUF value head p holds: qwen35moe tiles them (p = s·NK + g holds HF
 * head g·R + s), qwen3next keeps HF order. */
static int vsrc(enum arch a, int p)
{
    return a == QWEN35MOE ? (p % NK) * R + p / NK : p;
}

/* HF row of the conv channel / in_proj_qkv output at GGUF channel o. */
static int chan_src(enum arch a, int o)
{
    return o < 2 * KD ? o : 2 * KD + vsrc(a, (o - 2 * KD) / D) * D + (o - 2 * KD) % D;
}

/* attn_qkv / attn_gate from qwen3next's in_proj_qkvz: key head g's group holds, in this order,
 * q (D rows), k (D), the v of its R value heads (R·D), their z (R·D). */
static void want_qkvz(const char *lp, int l)
{
    const float *src = hf_get("%slinear_attn.in_proj_qkvz.weight", lp);
    const int G = 2 * D + 2 * R * D;
    float *qkv = want_add(false, 2, H, CH, 0, "blk.%d.attn_qkv.weight", l);
    float *z = want_add(false, 2, H, VD, 0, "blk.%d.attn_gate.weight", l);
    for (int o = 0; o < CH; o++) {
        int row;
        if (o < KD) /* q of key head o / D */
            row = (o / D) * G + o % D;
        else if (o < 2 * KD) /* k */
            row = ((o - KD) / D) * G + D + (o - KD) % D;
        else { /* v of value head j, in key head j / R's group at slot j % R */
            int j = (o - 2 * KD) / D, e = (o - 2 * KD) % D;
            row = (j / R) * G + 2 * D + (j % R) * D + e;
        }
        memcpy(&qkv[o * H], &src[row * H], H * sizeof(float));
    }
    for (int o = 0; o < VD; o++) {
        int j = o / D, e = o % D;
        memcpy(&z[o * H], &src[((j / R) * G + 2 * D + R * D + (j % R) * D + e) * H],
               H * sizeof(float));
    }
}

static void want_gdn(enum arch a, const char *lp, int l)
{
    char nm[64];
    if (a == QWEN3NEXT) {
        want_qkvz(lp, l);
        snprintf(nm, sizeof(nm), "blk.%d.ssm_ba.weight", l);
        want_copy(false, false, 2, H, 2 * NV, hf_get("%slinear_attn.in_proj_ba.weight", lp), nm);
    } else {
        const float *qkv = hf_get("%slinear_attn.in_proj_qkv.weight", lp);
        const float *z = hf_get("%slinear_attn.in_proj_z.weight", lp);
        const float *b = hf_get("%slinear_attn.in_proj_b.weight", lp);
        const float *al = hf_get("%slinear_attn.in_proj_a.weight", lp);
        float *wq = want_add(false, 2, H, CH, 0, "blk.%d.attn_qkv.weight", l);
        float *wz = want_add(false, 2, H, VD, 0, "blk.%d.attn_gate.weight", l);
        float *wb = want_add(false, 2, H, NV, 0, "blk.%d.ssm_beta.weight", l);
        float *wa = want_add(false, 2, H, NV, 0, "blk.%d.ssm_alpha.weight", l);
        for (int o = 0; o < CH; o++)
            memcpy(&wq[o * H], &qkv[chan_src(a, o) * H], H * sizeof(float));
        for (int o = 0; o < VD; o++)
            memcpy(&wz[o * H], &z[(vsrc(a, o / D) * D + o % D) * H], H * sizeof(float));
        for (int p = 0; p < NV; p++) {
            memcpy(&wb[p * H], &b[vsrc(a, p) * H], H * sizeof(float));
            memcpy(&wa[p * H], &al[vsrc(a, p) * H], H * sizeof(float));
        }
    }
    const float *conv = hf_get("%slinear_attn.conv1d.weight", lp);
    const float *dt = hf_get("%slinear_attn.dt_bias", lp);
    const float *alog = hf_get("%slinear_attn.A_log", lp);
    const float *out = hf_get("%slinear_attn.out_proj.weight", lp);
    float *wc = want_add(true, 2, KC, CH, 0, "blk.%d.ssm_conv1d.weight", l);
    float *wdt = want_add(true, 1, NV, 0, 0, "blk.%d.ssm_dt.bias", l);
    float *wssm = want_add(true, 1, NV, 0, 0, "blk.%d.ssm_a", l);
    for (int o = 0; o < CH; o++)
        for (int k = 0; k < KC; k++)
            wc[o * KC + k] = conv[chan_src(a, o) * KC + k];
    for (int p = 0; p < NV; p++) {
        wdt[p] = dt[vsrc(a, p)];
        wssm[p] = -expf(alog[vsrc(a, p)]);
    }
    snprintf(nm, sizeof(nm), "blk.%d.ssm_norm.weight", l);
    want_copy(true, false, 1, D, 0, hf_get("%slinear_attn.norm.weight", lp), nm);
    float *wo = want_add(false, 2, VD, H, 0, "blk.%d.ssm_out.weight", l);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < VD; i++)
            wo[h * VD + i] = out[h * VD + vsrc(a, i / D) * D + i % D];
}

static void want_attn(const char *lp, int l)
{
    static const struct {
        const char *gguf, *hf;
        uint64_t ne0, ne1;
        bool norm;
    } map[] = {
        {"attn_q.weight", "self_attn.q_proj.weight", H, 2 * QW, false},
        {"attn_k.weight", "self_attn.k_proj.weight", H, KVW, false},
        {"attn_v.weight", "self_attn.v_proj.weight", H, KVW, false},
        {"attn_output.weight", "self_attn.o_proj.weight", QW, H, false},
        {"attn_q_norm.weight", "self_attn.q_norm.weight", HD, 0, true},
        {"attn_k_norm.weight", "self_attn.k_norm.weight", HD, 0, true},
    };
    char nm[64];
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
        snprintf(nm, sizeof(nm), "blk.%d.%s", l, map[i].gguf);
        want_copy(map[i].norm, map[i].norm, map[i].ne1 ? 2 : 1, map[i].ne0, map[i].ne1,
                  hf_get("%s%s", lp, map[i].hf), nm);
    }
}

/* The experts as per-expert matrices, whichever way the layer stores them. */
static float expert_w(const char *lp, bool fused, int proj, int e, int row, int col)
{
    static const char *const name[] = {"gate_proj", "up_proj", "down_proj"};
    if (!fused)
        return hf_get("%smlp.experts.%d.%s.weight", lp, e,
                      name[proj])[row * (proj == 2 ? F : H) + col];
    if (proj == 2)
        return hf_get("%smlp.experts.down_proj", lp)[((uint64_t)e * H + row) * F + col];
    return hf_get("%smlp.experts.gate_up_proj",
                  lp)[((uint64_t)e * 2 * F + proj * F + row) * H + col];
}

static void want_moe(enum arch a, const char *lp, int l)
{
    char nm[64];
    snprintf(nm, sizeof(nm), "blk.%d.ffn_gate_inp.weight", l);
    want_copy(true, false, 2, H, E, hf_get("%smlp.gate.weight", lp), nm);
    const bool fused = layer_fused(a, l);
    float *g = want_add(false, 3, H, F, E, "blk.%d.ffn_gate_exps.weight", l);
    float *u = want_add(false, 3, H, F, E, "blk.%d.ffn_up_exps.weight", l);
    float *dn = want_add(false, 3, F, H, E, "blk.%d.ffn_down_exps.weight", l);
    for (int e = 0; e < E; e++)
        for (int f = 0; f < F; f++)
            for (int h = 0; h < H; h++) {
                g[((e * F) + f) * H + h] = expert_w(lp, fused, 0, e, f, h);
                u[((e * F) + f) * H + h] = expert_w(lp, fused, 1, e, f, h);
                dn[((e * H) + h) * F + f] = expert_w(lp, fused, 2, e, h, f);
            }
    snprintf(nm, sizeof(nm), "blk.%d.ffn_gate_inp_shexp.weight", l);
    want_copy(true, false, 1, H, 0, hf_get("%smlp.shared_expert_gate.weight", lp), nm);
    snprintf(nm, sizeof(nm), "blk.%d.ffn_gate_shexp.weight", l);
    want_copy(false, false, 2, H, FS, hf_get("%smlp.shared_expert.gate_proj.weight", lp), nm);
    snprintf(nm, sizeof(nm), "blk.%d.ffn_up_shexp.weight", l);
    want_copy(false, false, 2, H, FS, hf_get("%smlp.shared_expert.up_proj.weight", lp), nm);
    snprintf(nm, sizeof(nm), "blk.%d.ffn_down_shexp.weight", l);
    want_copy(false, false, 2, FS, H, hf_get("%smlp.shared_expert.down_proj.weight", lp), nm);
}

/* Block l from the HF layer under lp. */
static void want_layer(enum arch a, const char *lp, int l)
{
    char nm[64];
    snprintf(nm, sizeof(nm), "blk.%d.attn_norm.weight", l);
    want_copy(true, true, 1, H, 0, hf_get("%sinput_layernorm.weight", lp), nm);
    snprintf(nm, sizeof(nm), "blk.%d.post_attention_norm.weight", l);
    want_copy(true, true, 1, H, 0, hf_get("%spost_attention_layernorm.weight", lp), nm);
    if (layer_full(a, l))
        want_attn(lp, l);
    else
        want_gdn(a, lp, l);
    want_moe(a, lp, l);
}

/* The MTP head as llama.cpp's converters write it (FORMATS §4(f)): block NL's nextn.eh_proj is
 * mtp.fc [H, 2H] as it is (ne {2H, H}), enorm / hnorm / shared_head_norm are
 * pre_fc_norm_embedding / pre_fc_norm_hidden / norm + 1 (F32), and mtp.layers.0 is block NL,
 * a full-attention layer converted as a main one. */
static void want_mtp(enum arch a)
{
    static const struct {
        const char *gguf, *hf;
    } norms[] = {
        {"nextn.enorm.weight", "mtp.pre_fc_norm_embedding.weight"},
        {"nextn.hnorm.weight", "mtp.pre_fc_norm_hidden.weight"},
        {"nextn.shared_head_norm.weight", "mtp.norm.weight"},
    };
    char nm[64];
    snprintf(nm, sizeof(nm), "blk.%d.nextn.eh_proj.weight", NL);
    want_copy(false, false, 2, 2 * H, H, hf_get("mtp.fc.weight"), nm);
    for (size_t i = 0; i < sizeof(norms) / sizeof(norms[0]); i++) {
        snprintf(nm, sizeof(nm), "blk.%d.%s", NL, norms[i].gguf);
        want_copy(true, true, 1, H, 0, hf_get("%s", norms[i].hf), nm);
    }
    want_layer(a, "mtp.layers.0.", NL);
}

/* The tensors of a conversion, with the MTP block or (--no-mtp) without. */
static void wants_build(enum arch a, bool mtp)
{
    const char *pre = a == QWEN3NEXT ? "model." : "model.language_model.";
    char lp[96];

    wants_free();
    want_copy(false, false, 2, H, NVOCAB, hf_get("%sembed_tokens.weight", pre),
              "token_embd.weight");
    for (int l = 0; l < NL; l++) {
        snprintf(lp, sizeof(lp), "%slayers.%d.", pre, l);
        want_layer(a, lp, l);
    }
    if (mtp)
        want_mtp(a);
    want_copy(true, true, 1, H, 0, hf_get("%snorm.weight", pre), "output_norm.weight");
    want_copy(false, false, 2, H, NVOCAB, hf_get("lm_head.weight"), "output.weight");
}

/* ---- checks ------------------------------------------------------------------------------- */

/* Every wanted tensor with its shape and type (F32 under f32; under q8_0 F32 where forced,
 * else Q8_0) and, at f32, its values bit for bit; and no other tensor. */
static void check_tensors(const struct gguf_file *g, bool q8, const char *label)
{
    int bad_shape = 0, bad_type = 0, bad_vals = 0;
    for (int i = 0; i < n_want; i++) {
        const struct want *w = &wants[i];
        const struct gguf_tensor *t = gguf_find_tensor(g, w->name);
        CHECK(t != NULL, "%s: tensor %s missing", label, w->name);
        if (!t)
            continue;
        bool shape = t->n_dims == w->n_dims;
        for (uint32_t d = 0; d < 3; d++)
            shape = shape && t->ne[d] == w->ne[d];
        uint32_t want_type = !q8 || w->f32 ? QUANT_F32 : QUANT_Q8_0;
        CHECK(shape, "%s: %s has %u dims {%llu, %llu, %llu}, want %u {%llu, %llu, %llu}", label,
              w->name, t->n_dims, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
              (unsigned long long)t->ne[2], w->n_dims, (unsigned long long)w->ne[0],
              (unsigned long long)w->ne[1], (unsigned long long)w->ne[2]);
        CHECK(t->type == want_type, "%s: %s has type %u, want %u", label, w->name, t->type,
              want_type);
        bad_shape += !shape;
        bad_type += t->type != want_type;
        if (!shape || q8 || t->type != QUANT_F32)
            continue;
        uint64_t n = w->ne[0] * w->ne[1] * w->ne[2], diff = 0;
        for (uint64_t k = 0; k < n; k++) {
            float x;
            memcpy(&x, (const uint8_t *)t->data + k * 4, 4);
            diff += memcmp(&x, &w->v[k], 4) != 0;
        }
        CHECK(diff == 0, "%s: %s: %llu of %llu values differ from the HF mapping", label, w->name,
              (unsigned long long)diff, (unsigned long long)n);
        bad_vals += diff != 0;
    }
    CHECK(g->n_tensors == (uint64_t)n_want, "%s: %llu tensors, want %d", label,
          (unsigned long long)g->n_tensors, n_want);
    printf("  %s: %d tensors, shapes %s, types %s%s\n", label, n_want, bad_shape ? "WRONG" : "ok",
           bad_type ? "WRONG" : "ok",
           q8         ? ""
           : bad_vals ? ", values WRONG"
                      : ", values bit-exact");
}

static void expect_u32(const struct gguf_file *g, const char *arch, const char *key, uint32_t v)
{
    char k[128];
    uint32_t got = 0;
    snprintf(k, sizeof(k), "%s.%s", arch, key);
    CHECK(gguf_get_u32(g, k, &got) == 0 && got == v, "%s = %u, want %u (%s)", k, got, v, err_msg());
}

static void expect_f32(const struct gguf_file *g, const char *arch, const char *key, float v)
{
    char k[128];
    float got = 0;
    snprintf(k, sizeof(k), "%s.%s", arch, key);
    CHECK(gguf_get_f32(g, k, &got) == 0 && got == v, "%s = %g, want %g", k, got, v);
}

/* The keys; with the MTP block, block_count NL + 1 and nextn_predict_layers 1. */
static void check_keys(const struct gguf_file *g, enum arch a, bool mtp)
{
    const char *arch = a == QWEN3NEXT ? "qwen3next" : "qwen35moe";
    struct gguf_str s = {0};
    char k[128];

    CHECK(gguf_get_str(g, "general.architecture", &s) == 0 && s.len == strlen(arch) &&
              !memcmp(s.ptr, arch, s.len),
          "general.architecture");
    const struct {
        const char *key;
        uint32_t v;
    } u[] = {
        {"block_count", NL + mtp},
        {"context_length", 512},
        {"embedding_length", H},
        {"attention.head_count", NH},
        {"attention.head_count_kv", NKV},
        {"attention.key_length", HD},
        {"attention.value_length", HD},
        {"expert_count", E},
        {"expert_used_count", TOPK},
        {"expert_feed_forward_length", F},
        {"expert_shared_feed_forward_length", FS},
        {"ssm.conv_kernel", KC},
        {"ssm.state_size", D},
        {"ssm.group_count", NK},
        {"ssm.time_step_rank", NV},
        {"ssm.inner_size", VD},
        {"rope.dimension_count", NROT},
        {"full_attention_interval", a == QWEN3NEXT ? 2 : 4},
    };
    for (size_t i = 0; i < sizeof(u) / sizeof(u[0]); i++)
        expect_u32(g, arch, u[i].key, u[i].v);
    expect_f32(g, arch, "attention.layer_norm_rms_epsilon", 1e-6f);
    expect_f32(g, arch, "rope.freq_base", 1e7f);
    if (mtp)
        expect_u32(g, arch, "nextn_predict_layers", 1);
    static const char *const absent[] = {"feed_forward_length", "nextn_predict_layers"};
    for (size_t i = 0; i < (mtp ? 1u : 2u); i++) {
        snprintf(k, sizeof(k), "%s.%s", arch, absent[i]);
        CHECK(gguf_find_kv(g, k) == NULL, "%s is written", k);
    }
    snprintf(k, sizeof(k), "%s.rope.dimension_sections", arch);
    const struct gguf_value *arr = NULL;
    if (a == QWEN3NEXT) {
        CHECK(gguf_find_kv(g, k) == NULL, "%s is written", k);
    } else {
        const int want[4] = {2, 1, 1, 0};
        CHECK(gguf_get_arr(g, k, &arr) == 0 && arr->arr.elem_type == GGUF_TYPE_INT32 &&
                  arr->arr.count == 4,
              "%s: an i32 array of 4", k);
        for (int i = 0; arr && i < 4; i++) {
            struct gguf_value e;
            CHECK(gguf_arr_get(arr, (uint64_t)i, &e) == 0 && e.i64 == want[i], "%s[%d]", k, i);
        }
    }
    CHECK(gguf_get_str(g, "tokenizer.ggml.pre", &s) == 0, "tokenizer.ggml.pre");
    printf("  %s keys%s ok (tokenizer.ggml.pre %.*s)\n", arch, mtp ? " with MTP" : "", (int)s.len,
           s.ptr);
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
    float *lg = test_xmalloc(sizeof(float) * NVOCAB);
    CHECK(strata_stream_open(s, 64, &st) == 0 && strata_eval(st, ids, 12, lg) == 0, "eval: %s",
          strata_error());
    int finite = 0;
    for (int i = 0; i < NVOCAB; i++)
        finite += isfinite(lg[i]);
    CHECK(finite == NVOCAB, "%d of %d logits finite", finite, NVOCAB);
    printf("  %s: strata opens it, %d of %d logits finite\n", strrchr(path, '/') + 1, finite,
           NVOCAB);
    strata_stream_close(st);
    strata_close(s);
    free(lg);
}

/* Converts checkpoint directory dir (q8: at q8_0, else f32; no_mtp: --no-mtp) and checks the
 * file against the wanted tensors with the MTP block (mtp) or without, and that it runs. */
static void check_one(enum arch a, const char *name, const char *dir, bool q8, bool no_mtp,
                      bool mtp)
{
    char out[600], label[128];
    struct convert_stats st;
    struct gguf_file *g = NULL;

    wants_build(a, mtp);
    snprintf(out, sizeof(out), "%s/%s-%s%s.gguf", tmp_root, name, q8 ? "q8_0" : "f32",
             no_mtp ? "-no-mtp" : "");
    int rc = convert(dir, out, q8 ? QUANT_MIX_Q8_0 : QUANT_MIX_F32, no_mtp, &st);
    CHECK(rc == 0, "convert %s: %s", name, err_msg());
    if (rc || gguf_open(out, &g))
        return;
    CHECK(st.n_unused == 0, "%s: %u checkpoint tensors unused", name, st.n_unused);
    snprintf(label, sizeof(label), "%s at %s%s", name, q8 ? "q8_0" : "f32",
             no_mtp ? " --no-mtp"
             : mtp  ? " with MTP"
                    : " without MTP");
    if (!q8)
        check_keys(g, a, mtp);
    check_tensors(g, q8, label);
    gguf_close(g);
    check_runs(out);
}

/* Converts the current checkpoint at f32 and q8_0, with the MTP block (the default) and with
 * --no-mtp (what a converter that drops mtp.* writes), and checks each. */
static void check_conversion(enum arch a, const char *name, const char *config, const char *from,
                             const char *to)
{
    char dir[512];

    ckpt_write(name, config, NULL, 0, from, to, dir, sizeof(dir));
    for (int no_mtp = 0; no_mtp < 2; no_mtp++)
        for (int q8 = 0; q8 < 2; q8++)
            check_one(a, name, dir, q8, no_mtp, !no_mtp);
}

/* A config edit (and st_skip) that converts at f32 with the MTP block or without. */
static void check_mtp_case(enum arch a, const char *name, const char *config, const struct edit *ed,
                           bool no_mtp, bool mtp)
{
    char dir[512];

    ckpt_write(name, config, ed, ed ? 1 : 0, "", "", dir, sizeof(dir));
    check_one(a, name, dir, false, no_mtp, mtp);
}

/* The conversion fails with want_rc (-ENOTSUP by default), its message containing word, and
 * leaves no file. */
static int want_rc = -ENOTSUP;

static void expect_refused(const char *label, const char *config, const struct edit *ed, int n_ed,
                           const char *word)
{
    char dir[512], out[600];
    ckpt_write("refused", config, ed, n_ed, "", "", dir, sizeof(dir));
    snprintf(out, sizeof(out), "%s/refused.gguf", tmp_root);
    int rc = convert(dir, out, QUANT_MIX_F32, false, NULL);
    CHECK(rc == want_rc && strstr(err_msg(), word) && access(out, F_OK) != 0,
          "%s: rc %d, message %s", label, rc, err_msg());
    printf("  refused %-34s %s\n", label, err_msg());
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

int main(void)
{
    rng_seed(&rng, SEED, 1);
    snprintf(tmp_root, sizeof(tmp_root), "/tmp/strata-test-convert-qwen3next-XXXXXX");
    if (!mkdtemp(tmp_root)) {
        perror("mkdtemp");
        return 1;
    }

    /* qwen3next */
    model_build(QWEN3NEXT);
    check_conversion(QWEN3NEXT, "qwen3next", config_qwen3next, "", "");
    const struct edit mtp2 = {"mtp_num_hidden_layers", "2"};
    const struct edit mtp0 = {"mtp_num_hidden_layers", NULL};
    const struct edit mtp_emb = {"mtp_use_dedicated_embeddings", "true"};
    check_mtp_case(QWEN3NEXT, "qwen3next-mtp2", config_qwen3next, &mtp2, true, false);
    check_mtp_case(QWEN3NEXT, "qwen3next-mtp-absent", config_qwen3next, &mtp0, false, false);
    check_mtp_case(QWEN3NEXT, "qwen3next-mtp-emb", config_qwen3next, &mtp_emb, true, false);
    expect_refused("qwen3next mtp_num_hidden_layers 2", config_qwen3next, &mtp2, 1,
                   "mtp_num_hidden_layers = 2");
    expect_refused("qwen3next mtp_use_dedicated_embeddings", config_qwen3next, &mtp_emb, 1,
                   "mtp_use_dedicated_embeddings = true");
    st_skip = "mtp.layers.0.self_attn.k_norm";
    want_rc = -ENOENT;
    expect_refused("qwen3next MTP layer incomplete", config_qwen3next, NULL, 0,
                   "mtp.layers.0.self_attn.k_norm.weight");
    want_rc = -ENOTSUP;
    st_skip = NULL;
    const struct edit topk = {"norm_topk_prob", "false"};
    const struct edit vdim = {"linear_value_head_dim", "32"};
    const struct edit nv = {"linear_num_value_heads", "5"};
    const struct edit types = {"layer_types", "[\"linear_attention\", \"linear_attention\","
                                              "\"linear_attention\", \"full_attention\"]"};
    const struct edit step = {"decoder_sparse_step", "2"};
    const struct edit yarn = {"rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0}"};
    const struct edit prf = {"partial_rotary_factor", "0.3"};
    expect_refused("qwen3next norm_topk_prob false", config_qwen3next, &topk, 1, "norm_topk_prob");
    expect_refused("qwen3next value head dim 32", config_qwen3next, &vdim, 1,
                   "linear_value_head_dim");
    expect_refused("qwen3next 5 value heads", config_qwen3next, &nv, 1, "linear_num_value_heads");
    expect_refused("qwen3next layer_types off the interval", config_qwen3next, &types, 1,
                   "layer_types");
    expect_refused("qwen3next decoder_sparse_step 2", config_qwen3next, &step, 1,
                   "decoder_sparse_step");
    expect_refused("qwen3next rope_scaling yarn", config_qwen3next, &yarn, 1,
                   "rope_scaling.rope_type");
    expect_refused("qwen3next partial_rotary_factor 0.3", config_qwen3next, &prf, 1,
                   "partial_rotary_factor");

    /* qwen35moe: ConditionalGeneration, then the same weights as a text-only CausalLM */
    model_build(QWEN35MOE);
    check_conversion(QWEN35MOE, "qwen35moe", config_qwen35moe, "", "");
    check_conversion(QWEN35MOE, "qwen35moe-text", config_qwen35moe_text, "model.language_model.",
                     "model.");
    st_skip = "mtp."; /* what transformers' save_pretrained writes: config says 1, no tensors */
    check_mtp_case(QWEN35MOE, "qwen35moe-no-mtp-tensors", config_qwen35moe, NULL, false, false);
    st_skip = NULL;
    const struct edit mtp2_35 = {"text_config.mtp_num_hidden_layers", "2"};
    expect_refused("qwen35moe mtp_num_hidden_layers 2", config_qwen35moe, &mtp2_35, 1,
                   "text_config.mtp_num_hidden_layers = 2");
    const struct edit mrope = {"text_config.rope_parameters.mrope_section", "[11, 11, 10]"};
    const struct edit types35 = {"text_config.layer_types",
                                 "[\"linear_attention\", \"full_attention\","
                                 "\"linear_attention\", \"linear_attention\"]"};
    const struct edit unknown = {"text_config.foo_scale", "3"};
    const struct edit tied = {"text_config.tie_word_embeddings", "true"};
    const struct edit vdim35 = {"text_config.linear_value_head_dim", "8"};
    expect_refused("qwen35moe mrope_section [11, 11, 10]", config_qwen35moe, &mrope, 1,
                   "mrope_section");
    expect_refused("qwen35moe layer_types off the interval", config_qwen35moe, &types35, 1,
                   "layer_types");
    expect_refused("qwen35moe unknown text_config key", config_qwen35moe, &unknown, 1,
                   "text_config.foo_scale");
    expect_refused("qwen35moe tie_word_embeddings differ", config_qwen35moe, &tied, 1,
                   "tie_word_embeddings");
    expect_refused("qwen35moe value head dim 8", config_qwen35moe, &vdim35, 1,
                   "linear_value_head_dim");

    nftw(tmp_root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    wants_free();
    hf_free_all();
    return test_finish(NAME);
}
