/* test_convert: strata convert on tiny Hugging Face checkpoints written here from C.
 *
 * The checkpoint (qwen3_moe, hidden 256, 2 layers, 4/2 heads of 32, 8 experts top-2, expert
 * ffn 64, vocab 272 of which the tokenizer defines 264) holds fresh random weights in F32,
 * BF16 and F16; layer 0 stores its experts per expert, layer 1 fused (gate_up_proj, down_proj).
 * The expected GGUF tensors are computed here from the per-expert values and the mapping of
 * docs/formats.md §6.4, independently of the converter. Checks, for each mix (f32, bf16, q8_0,
 * q4_k_m): names, types, shapes; f32 and bf16 data bit for bit; quantized data within the
 * reference quantizers' bounds; the metadata and vocabulary; model_open and finite logits.
 * Then: sharded input gives the same tensors; any thread count gives the same bytes; the
 * errors for a missing tensor, a wrong shape, a wrong architecture, truncated or malformed
 * safetensors name what is wrong and leave no file; the config.json audit refuses each value
 * strata does not compute and each unknown key (naming the key, the value and why), and with
 * allow_unknown_keys warns once per unknown key and writes the same bytes; a config with every
 * key of no effect writes the same bytes as the plain one; and the strata binary's convert
 * (with and without --allow-unknown-keys) and logits commands agree with the library.
 */
#include <dirent.h>
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

#include "backend.h"
#include "convert.h"
#include "errors.h"
#include "fp16.h"
#include "gguf.h"
#include "model.h"
#include "quant.h"
#include "quant_ref.h"
#include "safetensors.h"
#include "stream.h"
#include "testutil.h"
#include "tokenizer.h"

#define NAME "test_convert"

#define HID 256 /* hidden size: a multiple of 256 so that K-quants apply */
#define NLAYER 2
#define NHEAD 4
#define NKV 2
#define HDIM 32
#define NEXP 8
#define TOPK 2
#define FFN 64    /* expert ffn: down rows of 64 do not fit Q6_K and fall back to Q8_0 */
#define NTOK 264  /* tokens the tokenizer defines: 256 bytes + 5 merges + 3 specials */
#define VOCAB 272 /* vocab_size: 8 [PAD] tokens */

enum dtype { DT_F32, DT_BF16, DT_F16 };
static const char *const dtype_names[] = {"F32", "BF16", "F16"};

/* A logical Hugging Face tensor: name, PyTorch shape, the dtype it is stored in, and its
 * values (exactly representable in that dtype). Experts are always logical per expert. */
struct src {
    char name[96];
    uint32_t n_dims;
    uint64_t shape[3];
    enum dtype dtype;
    float *v; /* (n) */
    uint64_t n;
};

/* A tensor as written to a safetensors file: the concatenation of parts. */
struct ftensor {
    char name[96];
    enum dtype dtype;
    uint32_t n_dims;
    uint64_t shape[3];
    uint32_t n_parts;
    const float *parts[2 * NEXP];
    uint64_t part_n;
};

static struct src srcs[160];
static int n_srcs;
static struct ftensor files[96];
static int n_files;
static char tmp_root[256];

/* ---- the random checkpoint ---------------------------------------------------------------- */

static float round_to(enum dtype dt, float x)
{
    if (dt == DT_BF16)
        return bf16_to_f32(bf16_from_f32(x));
    if (dt == DT_F16)
        return fp16_to_f32(fp16_from_f32(x));
    return x;
}

enum init { INIT_NORM, INIT_MAT, INIT_EMB };

static struct src *src_add(struct rng *r, const char *name, uint32_t n_dims, uint64_t a, uint64_t b,
                           enum dtype dt, enum init init)
{
    struct src *s = &srcs[n_srcs++];
    snprintf(s->name, sizeof(s->name), "%s", name);
    s->n_dims = n_dims;
    s->shape[0] = a;
    s->shape[1] = b;
    s->n = n_dims == 1 ? a : a * b;
    s->dtype = dt;
    s->v = malloc(s->n * sizeof(float));
    float scale = init == INIT_MAT ? 1.0f / sqrtf((float)b) : 1.0f;
    for (uint64_t i = 0; i < s->n; i++) {
        float x = init == INIT_NORM ? 1.0f + 0.1f * rng_normal(r) : scale * rng_normal(r);
        s->v[i] = round_to(dt, x);
    }
    return s;
}

static const struct src *src_find(const char *name)
{
    for (int i = 0; i < n_srcs; i++)
        if (!strcmp(srcs[i].name, name))
            return &srcs[i];
    return NULL;
}

static void file_direct(const struct src *s)
{
    struct ftensor *f = &files[n_files++];
    memset(f, 0, sizeof(*f));
    snprintf(f->name, sizeof(f->name), "%s", s->name);
    f->dtype = s->dtype;
    f->n_dims = s->n_dims;
    memcpy(f->shape, s->shape, sizeof(f->shape));
    f->n_parts = 1;
    f->parts[0] = s->v;
    f->part_n = s->n;
}

static void model_build(uint64_t seed)
{
    struct rng r;
    char n[96];

    rng_seed(&r, seed, 1);
    file_direct(src_add(&r, "model.embed_tokens.weight", 2, VOCAB, HID, DT_BF16, INIT_EMB));
    for (int l = 0; l < NLAYER; l++) {
        enum dtype mat = l == 0 ? DT_F32 : DT_BF16;
        static const struct {
            const char *name;
            uint64_t a, b;
        } direct[] = {
            {"input_layernorm", HID, 0},
            {"self_attn.q_proj", NHEAD * HDIM, HID},
            {"self_attn.k_proj", NKV * HDIM, HID},
            {"self_attn.v_proj", NKV * HDIM, HID},
            {"self_attn.o_proj", HID, NHEAD * HDIM},
            {"self_attn.q_norm", HDIM, 0},
            {"self_attn.k_norm", HDIM, 0},
            {"post_attention_layernorm", HID, 0},
            {"mlp.gate", NEXP, HID},
        };
        for (size_t i = 0; i < sizeof(direct) / sizeof(direct[0]); i++) {
            bool vec = direct[i].b == 0;
            enum dtype dt = vec ? (l == 1 && i == 0 ? DT_F16 : DT_F32) : mat;
            if (!strcmp(direct[i].name, "mlp.gate"))
                dt = DT_F32;
            snprintf(n, sizeof(n), "model.layers.%d.%s.weight", l, direct[i].name);
            file_direct(src_add(&r, n, vec ? 1 : 2, direct[i].a, direct[i].b, dt,
                                vec ? INIT_NORM : INIT_MAT));
        }
        /* experts: layer 0 per expert in BF16, layer 1 fused in F32 */
        enum dtype edt = l == 0 ? DT_BF16 : DT_F32;
        const struct src *gate[NEXP], *up[NEXP], *down[NEXP];
        for (int e = 0; e < NEXP; e++) {
            snprintf(n, sizeof(n), "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
            gate[e] = src_add(&r, n, 2, FFN, HID, edt, INIT_MAT);
            snprintf(n, sizeof(n), "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
            up[e] = src_add(&r, n, 2, FFN, HID, edt, INIT_MAT);
            snprintf(n, sizeof(n), "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
            down[e] = src_add(&r, n, 2, HID, FFN, edt, INIT_MAT);
            if (l == 0) {
                file_direct(gate[e]);
                file_direct(up[e]);
                file_direct(down[e]);
            }
        }
        if (l == 1) {
            struct ftensor *gu = &files[n_files++], *dn = &files[n_files++];
            *gu = (struct ftensor){.dtype = edt,
                                   .n_dims = 3,
                                   .shape = {NEXP, 2 * FFN, HID},
                                   .n_parts = 2 * NEXP,
                                   .part_n = FFN * HID};
            *dn = (struct ftensor){.dtype = edt,
                                   .n_dims = 3,
                                   .shape = {NEXP, HID, FFN},
                                   .n_parts = NEXP,
                                   .part_n = HID * FFN};
            snprintf(gu->name, sizeof(gu->name), "model.layers.%d.mlp.experts.gate_up_proj", l);
            snprintf(dn->name, sizeof(dn->name), "model.layers.%d.mlp.experts.down_proj", l);
            for (int e = 0; e < NEXP; e++) {
                gu->parts[2 * e] = gate[e]->v; /* gate rows first, then up rows */
                gu->parts[2 * e + 1] = up[e]->v;
                dn->parts[e] = down[e]->v;
            }
        }
    }
    file_direct(src_add(&r, "model.norm.weight", 1, HID, 0, DT_F32, INIT_NORM));
    file_direct(src_add(&r, "lm_head.weight", 2, VOCAB, HID, DT_F32, INIT_MAT));
}

/* ---- writing the directory ---------------------------------------------------------------- */

struct variant {
    const char *drop;   /* tensor to leave out */
    const char *shrink; /* tensor whose dim shrink_dim is written 32 smaller */
    uint32_t shrink_dim;
    bool v5_config; /* rope_parameters and num_local_experts instead of the 4.x keys */
    const char *model_type;
    int n_shards;         /* 0 = one model.safetensors */
    const char *patch;    /* JSON object: members set in config.json (added or replaced) */
    const char *drop_key; /* a config.json key to leave out */
};

static int st_write(const char *path, int from, int to, const struct variant *var)
{
    json_object *hdr = json_object_new_object();
    uint64_t off = 0;
    FILE *f;

    for (int i = from; i < to; i++) {
        const struct ftensor *t = &files[i];
        if (var->drop && !strcmp(var->drop, t->name))
            continue;
        bool shrink = var->shrink && !strcmp(var->shrink, t->name);
        uint64_t n = 1;
        json_object *e = json_object_new_object(), *sh = json_object_new_array();
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t dim = t->shape[d] - (shrink && d == var->shrink_dim ? 32 : 0);
            json_object_array_add(sh, json_object_new_int64((int64_t)dim));
            n *= dim;
        }
        uint64_t bytes = n * (t->dtype == DT_F32 ? 4 : 2);
        json_object *offs = json_object_new_array();
        json_object_array_add(offs, json_object_new_int64((int64_t)off));
        json_object_array_add(offs, json_object_new_int64((int64_t)(off + bytes)));
        json_object_object_add(e, "dtype", json_object_new_string(dtype_names[t->dtype]));
        json_object_object_add(e, "shape", sh);
        json_object_object_add(e, "data_offsets", offs);
        json_object_object_add(hdr, t->name, e);
        off += bytes;
    }
    json_object *meta = json_object_new_object();
    json_object_object_add(meta, "format", json_object_new_string("pt"));
    json_object_object_add(hdr, "__metadata__", meta);
    const char *js = json_object_to_json_string_ext(hdr, JSON_C_TO_STRING_PLAIN);
    uint64_t hl = (strlen(js) + 7) / 8 * 8;
    if (!(f = fopen(path, "wb"))) {
        json_object_put(hdr);
        return -1;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)(hl >> (8 * i));
    fwrite(len8, 1, 8, f);
    fputs(js, f);
    for (uint64_t i = strlen(js); i < hl; i++)
        fputc(' ', f);
    json_object_put(hdr);
    for (int i = from; i < to; i++) {
        const struct ftensor *t = &files[i];
        if (var->drop && !strcmp(var->drop, t->name))
            continue;
        uint64_t total = t->part_n * t->n_parts;
        if (var->shrink && !strcmp(var->shrink, t->name)) /* a prefix of the values */
            total = total / t->shape[var->shrink_dim] * (t->shape[var->shrink_dim] - 32);
        for (uint64_t k = 0; k < total; k++) {
            float x = t->parts[k / t->part_n][k % t->part_n];
            if (t->dtype == DT_F32) {
                fwrite(&x, 4, 1, f);
            } else {
                uint16_t h = t->dtype == DT_BF16 ? bf16_from_f32(x) : fp16_from_f32(x);
                fwrite(&h, 2, 1, f);
            }
        }
    }
    return fclose(f);
}

static void json_write(const char *dir, const char *file, json_object *o)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    CHECK(json_object_to_file_ext(path, o, JSON_C_TO_STRING_PRETTY) == 0, "writing %s", path);
    json_object_put(o);
}

static json_object *jarr_str(const char *a, const char *b)
{
    json_object *arr = json_object_new_array();
    json_object_array_add(arr, json_object_new_string(a));
    if (b)
        json_object_array_add(arr, json_object_new_string(b));
    return arr;
}

static void config_write(const char *dir, const struct variant *var)
{
    json_object *c = json_object_new_object();
    const char *mt = var->model_type ? var->model_type : "qwen3_moe";
#define INT(k, v) json_object_object_add(c, k, json_object_new_int64(v))
    json_object_object_add(
        c, "architectures",
        jarr_str(strcmp(mt, "qwen3_moe") ? "LlamaForCausalLM" : "Qwen3MoeForCausalLM", NULL));
    json_object_object_add(c, "model_type", json_object_new_string(mt));
    INT("hidden_size", HID);
    INT("intermediate_size", 512);
    INT("num_hidden_layers", NLAYER);
    INT("num_attention_heads", NHEAD);
    INT("num_key_value_heads", NKV);
    INT("head_dim", HDIM);
    INT(var->v5_config ? "num_local_experts" : "num_experts", NEXP);
    INT("num_experts_per_tok", TOPK);
    INT("moe_intermediate_size", FFN);
    INT("vocab_size", VOCAB);
    INT("max_position_embeddings", 4096);
    INT("decoder_sparse_step", 1);
    INT("eos_token_id", 263);
    json_object_object_add(c, "mlp_only_layers", json_object_new_array());
    json_object_object_add(c, "norm_topk_prob", json_object_new_boolean(1));
    json_object_object_add(c, "tie_word_embeddings", json_object_new_boolean(0));
    json_object_object_add(c, "rms_norm_eps", json_object_new_double(1e-6));
    if (var->v5_config) {
        json_object *rp = json_object_new_object();
        json_object_object_add(rp, "rope_theta", json_object_new_double(1000000.0));
        json_object_object_add(rp, "rope_type", json_object_new_string("default"));
        json_object_object_add(c, "rope_parameters", rp);
    } else {
        json_object_object_add(c, "rope_theta", json_object_new_double(1000000.0));
        json_object_object_add(c, "rope_scaling", NULL);
    }
#undef INT
    if (var->drop_key)
        json_object_object_del(c, var->drop_key);
    if (var->patch) {
        json_object *p = json_tokener_parse(var->patch);
        CHECK(p && json_object_is_type(p, json_type_object), "bad patch %s", var->patch);
        if (p) {
            json_object_object_foreach(p, key, val)
            {
                json_object_object_add(c, key, json_object_get(val));
            }
        }
        json_object_put(p);
    }
    json_write(dir, "config.json", c);
}

#define CHAT_TEMPLATE "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"
#define QWEN2_REGEX                                                                                \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"      \
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static const char *const merges[][2] = {
    {"\xc4\xa0", "t"}, {"h", "e"}, {"\xc4\xa0t", "he"}, {"l", "l"}, {"o", "r"}};

static json_object *added_token(int id, const char *content)
{
    json_object *a = json_object_new_object();
    json_object_object_add(a, "id", json_object_new_int(id));
    json_object_object_add(a, "content", json_object_new_string(content));
    json_object_object_add(a, "single_word", json_object_new_boolean(0));
    json_object_object_add(a, "lstrip", json_object_new_boolean(0));
    json_object_object_add(a, "rstrip", json_object_new_boolean(0));
    json_object_object_add(a, "normalized", json_object_new_boolean(0));
    json_object_object_add(a, "special", json_object_new_boolean(1));
    return a;
}

static void tokenizer_write(const char *dir)
{
    json_object *root = json_object_new_object(), *model = json_object_new_object();
    json_object *vocab = json_object_new_object(), *mg = json_object_new_array();
    char tok[8];

    for (int b = 0; b < 256; b++) {
        uint32_t cp = tokenizer_byte_to_codepoint((uint8_t)b);
        if (cp < 0x80) {
            tok[0] = (char)cp, tok[1] = 0;
        } else {
            tok[0] = (char)(0xc0 | (cp >> 6)), tok[1] = (char)(0x80 | (cp & 0x3f)), tok[2] = 0;
        }
        json_object_object_add(vocab, tok, json_object_new_int(b));
    }
    for (int i = 0; i < 5; i++) {
        char both[16];
        snprintf(both, sizeof(both), "%s%s", merges[i][0], merges[i][1]);
        json_object_object_add(vocab, both, json_object_new_int(256 + i));
        json_object_array_add(mg, jarr_str(merges[i][0], merges[i][1]));
    }
    json_object_object_add(model, "type", json_object_new_string("BPE"));
    json_object_object_add(model, "dropout", NULL);
    json_object_object_add(model, "unk_token", NULL);
    json_object_object_add(model, "continuing_subword_prefix", json_object_new_string(""));
    json_object_object_add(model, "end_of_word_suffix", json_object_new_string(""));
    json_object_object_add(model, "fuse_unk", json_object_new_boolean(0));
    json_object_object_add(model, "byte_fallback", json_object_new_boolean(0));
    json_object_object_add(model, "ignore_merges", json_object_new_boolean(0));
    json_object_object_add(model, "vocab", vocab);
    json_object_object_add(model, "merges", mg);

    json_object *split = json_object_new_object(), *pat = json_object_new_object();
    json_object_object_add(pat, "Regex", json_object_new_string(QWEN2_REGEX));
    json_object_object_add(split, "type", json_object_new_string("Split"));
    json_object_object_add(split, "pattern", pat);
    json_object_object_add(split, "behavior", json_object_new_string("Isolated"));
    json_object_object_add(split, "invert", json_object_new_boolean(0));
    json_object *bl = json_object_new_object();
    json_object_object_add(bl, "type", json_object_new_string("ByteLevel"));
    json_object_object_add(bl, "add_prefix_space", json_object_new_boolean(0));
    json_object_object_add(bl, "trim_offsets", json_object_new_boolean(0));
    json_object_object_add(bl, "use_regex", json_object_new_boolean(0));
    json_object *seq = json_object_new_object(), *list = json_object_new_array();
    json_object_array_add(list, split);
    json_object_array_add(list, json_object_get(bl));
    json_object_object_add(seq, "type", json_object_new_string("Sequence"));
    json_object_object_add(seq, "pretokenizers", list);
    json_object *norm = json_object_new_object();
    json_object_object_add(norm, "type", json_object_new_string("NFC"));

    json_object *added = json_object_new_array();
    json_object_array_add(added, added_token(261, "<|endoftext|>"));
    json_object_array_add(added, added_token(262, "<|im_start|>"));
    json_object_array_add(added, added_token(263, "<|im_end|>"));
    json_object_object_add(root, "version", json_object_new_string("1.0"));
    json_object_object_add(root, "added_tokens", added);
    json_object_object_add(root, "normalizer", norm);
    json_object_object_add(root, "pre_tokenizer", seq);
    json_object_object_add(root, "decoder", bl);
    json_object_object_add(root, "model", model);
    json_write(dir, "tokenizer.json", root);

    json_object *tc = json_object_new_object();
    json_object_object_add(tc, "add_bos_token", json_object_new_boolean(0));
    json_object_object_add(tc, "bos_token", NULL);
    json_object_object_add(tc, "eos_token", json_object_new_string("<|im_end|>"));
    json_object_object_add(tc, "pad_token", json_object_new_string("<|endoftext|>"));
    json_object_object_add(tc, "chat_template", json_object_new_string(CHAT_TEMPLATE));
    json_write(dir, "tokenizer_config.json", tc);

    /* the author's sampling defaults; min_p is not a number and is left out */
    json_object *gc = json_tokener_parse("{\"do_sample\": true, \"temperature\": 0.6, \"top_k\": 20, "
                                         "\"top_p\": 0.95, \"repetition_penalty\": 1.05, "
                                         "\"min_p\": \"low\", \"max_new_tokens\": 100, "
                                         "\"eos_token_id\": [263, 262]}");
    json_write(dir, "generation_config.json", gc);
}

/* Writes a checkpoint directory tmp_root/NAME; returns its path (static buffer per call). */
static const char *ckpt_write(const char *name, const struct variant *var, char *dir, size_t size)
{
    char path[600];
    snprintf(dir, size, "%s/%s", tmp_root, name);
    mkdir(dir, 0755);
    config_write(dir, var);
    tokenizer_write(dir);
    if (var->n_shards <= 1) {
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        CHECK(st_write(path, 0, n_files, var) == 0, "writing %s", path);
        return dir;
    }
    json_object *idx = json_object_new_object(), *map = json_object_new_object();
    int per = (n_files + var->n_shards - 1) / var->n_shards;
    for (int s = 0; s < var->n_shards; s++) {
        char shard[64];
        int from = s * per, to = from + per < n_files ? from + per : n_files;
        snprintf(shard, sizeof(shard), "model-%05d-of-%05d.safetensors", s + 1, var->n_shards);
        snprintf(path, sizeof(path), "%s/%s", dir, shard);
        CHECK(st_write(path, from, to, var) == 0, "writing %s", path);
        for (int i = from; i < to; i++)
            json_object_object_add(map, files[i].name, json_object_new_string(shard));
    }
    json_object_object_add(idx, "metadata", json_object_new_object());
    json_object_object_add(idx, "weight_map", map);
    json_write(dir, "model.safetensors.index.json", idx);
    return dir;
}

/* ---- expectations ------------------------------------------------------------------------- */

struct expect {
    char name[64];
    uint32_t n_dims;
    uint64_t ne[3];
    float *v; /* (n) in ggml order */
    uint64_t n;
};

static struct expect expects[64];
static int n_expects;

static void expect_direct(const char *gguf, const char *hf)
{
    const struct src *s = src_find(hf);
    struct expect *e = &expects[n_expects++];
    snprintf(e->name, sizeof(e->name), "%s", gguf);
    e->n_dims = s->n_dims;
    e->ne[0] = s->n_dims == 1 ? s->shape[0] : s->shape[1];
    e->ne[1] = s->n_dims == 1 ? 1 : s->shape[0];
    e->ne[2] = 1;
    e->n = s->n;
    e->v = malloc(e->n * sizeof(float));
    memcpy(e->v, s->v, e->n * sizeof(float));
}

/* blk.L.ffn_X_exps: the per-expert tensors stacked over E (docs/formats.md §6.4). */
static void expect_experts(int l, const char *gguf, const char *hf, uint64_t rows, uint64_t cols)
{
    struct expect *e = &expects[n_expects++];
    char n[96];
    snprintf(e->name, sizeof(e->name), "blk.%d.%s.weight", l, gguf);
    e->n_dims = 3;
    e->ne[0] = cols;
    e->ne[1] = rows;
    e->ne[2] = NEXP;
    e->n = rows * cols * NEXP;
    e->v = malloc(e->n * sizeof(float));
    for (int x = 0; x < NEXP; x++) {
        snprintf(n, sizeof(n), "model.layers.%d.mlp.experts.%d.%s.weight", l, x, hf);
        memcpy(e->v + (uint64_t)x * rows * cols, src_find(n)->v, rows * cols * sizeof(float));
    }
}

static void expects_build(void)
{
    static const char *const map[][2] = {
        {"attn_norm", "input_layernorm"},    {"attn_q", "self_attn.q_proj"},
        {"attn_k", "self_attn.k_proj"},      {"attn_v", "self_attn.v_proj"},
        {"attn_output", "self_attn.o_proj"}, {"attn_q_norm", "self_attn.q_norm"},
        {"attn_k_norm", "self_attn.k_norm"}, {"ffn_norm", "post_attention_layernorm"},
        {"ffn_gate_inp", "mlp.gate"},
    };
    char g[64], h[96];
    expect_direct("token_embd.weight", "model.embed_tokens.weight");
    for (int l = 0; l < NLAYER; l++) {
        for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
            snprintf(g, sizeof(g), "blk.%d.%s.weight", l, map[i][0]);
            snprintf(h, sizeof(h), "model.layers.%d.%s.weight", l, map[i][1]);
            expect_direct(g, h);
        }
        expect_experts(l, "ffn_gate_exps", "gate_proj", FFN, HID);
        expect_experts(l, "ffn_up_exps", "up_proj", FFN, HID);
        expect_experts(l, "ffn_down_exps", "down_proj", HID, FFN);
    }
    expect_direct("output_norm.weight", "model.norm.weight");
    expect_direct("output.weight", "lm_head.weight");
}

/* The type each mix must give a tensor of this checkpoint (the rules of `strata convert
 * --help`, with this checkpoint's row lengths: expert down rows of 64 fall back to Q8_0). */
static uint32_t expect_type(enum quant_mix mix, const struct expect *e)
{
    if (mix == QUANT_MIX_F32 || e->n_dims == 1 || strstr(e->name, "ffn_gate_inp"))
        return QUANT_F32;
    if (mix == QUANT_MIX_BF16)
        return QUANT_BF16;
    if (mix == QUANT_MIX_Q8_0)
        return QUANT_Q8_0;
    if (strstr(e->name, "ffn_gate_exps") || strstr(e->name, "ffn_up_exps") ||
        !strcmp(e->name, "token_embd.weight"))
        return QUANT_Q4_K;
    if (!strcmp(e->name, "output.weight"))
        return QUANT_Q6_K;
    return QUANT_Q8_0; /* attention, and ffn_down_exps by fallback */
}

/* ---- checks of a converted file ----------------------------------------------------------- */

/* Largest normalised RMS error seen per quantized type, for the summary. */
static double worst_rms[QUANT_TYPE_COUNT];
static double worst_q8_block; /* max |err| / (max|x| / 127) over Q8_0 blocks */

static void check_tensor_data(const struct gguf_tensor *t, const struct expect *e)
{
    if (t->type == QUANT_F32) {
        CHECK(!memcmp(t->data, e->v, e->n * 4), "%s: F32 data differs from the source", e->name);
        return;
    }
    if (t->type == QUANT_BF16) {
        uint64_t bad = 0;
        for (uint64_t i = 0; i < e->n; i++) {
            uint16_t h;
            memcpy(&h, (const uint8_t *)t->data + 2 * i, 2);
            bad += h != bf16_from_f32(e->v[i]);
        }
        CHECK(bad == 0, "%s: %llu BF16 values differ from the source rounded to BF16", e->name,
              (unsigned long long)bad);
        return;
    }
    float *y = malloc(e->n * sizeof(float));
    test_poison_f32(y, e->n);
    CHECK(quant_ref_dequantize(t->type, t->data, y, (int64_t)e->n) == 0, "%s: dequantize", e->name);
    double num = 0, den = 0;
    for (uint64_t i = 0; i < e->n; i++) {
        num += ((double)y[i] - e->v[i]) * ((double)y[i] - e->v[i]);
        den += (double)e->v[i] * e->v[i];
    }
    double rms = den > 0 ? sqrt(num / den) : INFINITY;
    if (!(rms <= worst_rms[t->type]))
        worst_rms[t->type] = rms;
    if (t->type == QUANT_Q8_0) {
        /* each element within 0.6 steps of its block (0.5 from rounding, the rest from the
         * f16 scale) */
        for (uint64_t b = 0; b < e->n / 32; b++) {
            float amax = 0, err = 0;
            for (int i = 0; i < 32; i++) {
                amax = fmaxf(amax, fabsf(e->v[32 * b + i]));
                float d = fabsf(y[32 * b + i] - e->v[32 * b + i]);
                err = d > err || isnan(d) ? d : err;
            }
            double rel = amax > 0 ? err / (amax / 127.0) : (err == 0 ? 0 : INFINITY);
            if (!(rel <= worst_q8_block))
                worst_q8_block = rel;
            if (!(rel <= 0.6)) {
                CHECK(rel <= 0.6, "%s: Q8_0 block %llu error %g steps", e->name,
                      (unsigned long long)b, rel);
                break;
            }
        }
    } else {
        /* docs/quant-tolerances.md "normal" bounds */
        double bound = t->type == QUANT_Q4_K ? 0.09 : t->type == QUANT_Q6_K ? 0.022 : 0;
        CHECK(rms <= bound, "%s: %s round-trip error %g > %g", e->name, quant_type_name(t->type),
              rms, bound);
    }
    free(y);
}

static void check_kv_u32(const struct gguf_file *f, const char *key, uint32_t want)
{
    uint32_t v = 0;
    int rc = gguf_get_u32(f, key, &v);
    CHECK(rc == 0 && v == want, "%s: %u (rc %d), expected %u", key, v, rc, want);
}

static void check_kv_str(const struct gguf_file *f, const char *key, const char *want)
{
    struct gguf_str s = {0};
    int rc = gguf_get_str(f, key, &s);
    CHECK(rc == 0 && s.len == strlen(want) && !memcmp(s.ptr, want, s.len),
          "%s: '%.*s' (rc %d), expected '%s'", key, (int)s.len, s.ptr ? s.ptr : "", rc, want);
}

static void check_metadata(const struct gguf_file *f, enum quant_mix mix)
{
    static const uint32_t ftype[] = {0, 32, 7, 15};
    float base = 0, eps = 0;
    const struct gguf_value *arr;

    check_kv_str(f, "general.architecture", "qwen3moe");
    check_kv_u32(f, "general.file_type", ftype[mix]);
    check_kv_u32(f, "qwen3moe.block_count", NLAYER);
    check_kv_u32(f, "qwen3moe.embedding_length", HID);
    check_kv_u32(f, "qwen3moe.feed_forward_length", 512);
    check_kv_u32(f, "qwen3moe.context_length", 4096);
    check_kv_u32(f, "qwen3moe.attention.head_count", NHEAD);
    check_kv_u32(f, "qwen3moe.attention.head_count_kv", NKV);
    check_kv_u32(f, "qwen3moe.attention.key_length", HDIM);
    check_kv_u32(f, "qwen3moe.attention.value_length", HDIM);
    check_kv_u32(f, "qwen3moe.expert_count", NEXP);
    check_kv_u32(f, "qwen3moe.expert_used_count", TOPK);
    check_kv_u32(f, "qwen3moe.expert_feed_forward_length", FFN);
    CHECK(gguf_get_f32(f, "qwen3moe.rope.freq_base", &base) == 0 && base == 1e6f,
          "rope.freq_base %g", base);
    CHECK(gguf_get_f32(f, "qwen3moe.attention.layer_norm_rms_epsilon", &eps) == 0 && eps == 1e-6f,
          "rms epsilon %g", eps);
    float x = 0;
    CHECK(gguf_get_f32(f, "general.sampling.temp", &x) == 0 && x == 0.6f, "sampling.temp %g", x);
    check_kv_u32(f, "general.sampling.top_k", 20);
    CHECK(gguf_get_f32(f, "general.sampling.top_p", &x) == 0 && x == 0.95f, "sampling.top_p %g",
          x);
    CHECK(gguf_get_f32(f, "general.sampling.penalty_repeat", &x) == 0 && x == 1.05f,
          "sampling.penalty_repeat %g", x);
    CHECK(!gguf_find_kv(f, "general.sampling.min_p"), "min_p \"low\" was written");
    check_kv_str(f, "tokenizer.ggml.model", "gpt2");
    check_kv_str(f, "tokenizer.ggml.pre", "qwen2");
    check_kv_str(f, "tokenizer.chat_template", CHAT_TEMPLATE);
    check_kv_u32(f, "tokenizer.ggml.eos_token_id", 263);
    check_kv_u32(f, "tokenizer.ggml.padding_token_id", 261);
    CHECK(!gguf_find_kv(f, "tokenizer.ggml.bos_token_id"), "no bos expected");
    CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", &arr) == 0 && arr->arr.count == VOCAB,
          "tokens: %llu, expected %d", arr ? (unsigned long long)arr->arr.count : 0ull, VOCAB);
    if (arr && arr->arr.count == VOCAB) {
        struct gguf_value v;
        gguf_arr_get(arr, VOCAB - 1, &v);
        CHECK(v.str.len == 8 && !memcmp(v.str.ptr, "[PAD271]", 8), "last token '%.*s'",
              (int)v.str.len, v.str.ptr);
        gguf_arr_get(arr, 258, &v);
        CHECK(v.str.len == 5 && !memcmp(v.str.ptr, "\xc4\xa0the", 5), "token 258 '%.*s'",
              (int)v.str.len, v.str.ptr);
    }
    CHECK(gguf_get_arr(f, "tokenizer.ggml.token_type", &arr) == 0 && arr->arr.count == VOCAB,
          "token_type count");
    if (arr && arr->arr.count == VOCAB) {
        struct gguf_value a, b, c;
        gguf_arr_get(arr, 10, &a);
        gguf_arr_get(arr, 263, &b);
        gguf_arr_get(arr, 264, &c);
        CHECK(a.i64 == 1 && b.i64 == 3 && c.i64 == 5, "token types %lld %lld %lld",
              (long long)a.i64, (long long)b.i64, (long long)c.i64);
    }
    CHECK(gguf_get_arr(f, "tokenizer.ggml.merges", &arr) == 0 && arr->arr.count == 5, "merges");
}

/* Logits of a fixed prompt through the CPU backend; NULL on failure. */
#define N_PROMPT 6
static const int32_t prompt_ids[N_PROMPT] = {3, 100, 257, 261, 50, 200};

static float *model_logits(struct model *m, bool one_by_one)
{
    struct backend_cpu_config bc = {.n_threads = 0};
    struct backend *b = NULL;
    struct stream *s = NULL;
    float *out = malloc(VOCAB * sizeof(float));
    int rc = backend_cpu_open(m, &bc, &b);

    rc = rc ? rc : stream_open(b, 64, 16, &s);
    test_poison_f32(out, VOCAB);
    for (int i = 0; !rc && i < N_PROMPT; i += one_by_one ? 1 : N_PROMPT)
        rc = stream_eval(s, prompt_ids + i, one_by_one ? 1 : N_PROMPT, out);
    CHECK(rc == 0, "forward: %s", err_msg());
    stream_close(s);
    backend_close(b);
    if (rc) {
        free(out);
        return NULL;
    }
    return out;
}

static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

static double max_rel(const float *a, const float *b, int n)
{
    return test_max_rel_err(a, b, (size_t)n);
}

static float *mix_logits[QUANT_MIX_COUNT];

static void check_converted(const char *path, enum quant_mix mix)
{
    struct gguf_file *f = NULL;
    struct model *m = NULL;
    int rc = gguf_open(path, &f);

    CHECK(rc == 0, "%s: gguf_open: %s", path, err_msg());
    if (rc)
        return;
    CHECK(f->n_tensors == (uint64_t)n_expects, "%s: %llu tensors, expected %d", path,
          (unsigned long long)f->n_tensors, n_expects);
    for (int i = 0; i < n_expects; i++) {
        const struct expect *e = &expects[i];
        const struct gguf_tensor *t = gguf_find_tensor(f, e->name);
        CHECK(t != NULL, "%s: tensor %s missing", quant_mix_name(mix), e->name);
        if (!t)
            continue;
        uint32_t want = expect_type(mix, e);
        CHECK(t->type == want, "%s %s: type %s, expected %s", quant_mix_name(mix), e->name,
              quant_type_name(t->type), quant_type_name(want));
        CHECK(t->n_dims == e->n_dims && t->ne[0] == e->ne[0] && t->ne[1] == e->ne[1] &&
                  t->ne[2] == e->ne[2],
              "%s: ne {%llu, %llu, %llu} (%u dims), expected {%llu, %llu, %llu}", e->name,
              (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
              (unsigned long long)t->ne[2], t->n_dims, (unsigned long long)e->ne[0],
              (unsigned long long)e->ne[1], (unsigned long long)e->ne[2]);
        if (t->type == want && t->ne[0] * t->ne[1] * t->ne[2] == e->n)
            check_tensor_data(t, e);
    }
    check_metadata(f, mix);
    gguf_close(f);

    rc = model_open(path, &m);
    CHECK(rc == 0, "%s: model_open: %s", path, err_msg());
    if (rc)
        return;
    CHECK(m->hp.n_vocab == VOCAB && m->hp.n_expert == NEXP && m->hp.head_dim == HDIM && m->tok &&
              tokenizer_n_vocab(m->tok) == VOCAB,
          "model hparams / vocabulary");
    if (m->tok) {
        int32_t ids[32];
        int n = tokenizer_encode(m->tok, " the hello<|im_end|>", 20, TOKENIZER_ENCODE_PARSE_SPECIAL,
                                 ids, 32);
        /* Ġthe | Ġ he ll o | <|im_end|> */
        static const int32_t want[] = {258, 32, 257, 259, 111, 263};
        CHECK(n == 6 && !memcmp(ids, want, sizeof(want)), "encode: %d ids, first %d", n,
              n > 0 ? ids[0] : -1);
    }
    float *lg = model_logits(m, false);
    if (lg) {
        int bad = 0;
        for (int i = 0; i < VOCAB; i++)
            bad += !isfinite(lg[i]);
        CHECK(bad == 0, "%s: %d non-finite logits", quant_mix_name(mix), bad);
        mix_logits[mix] = lg;
    }
    if (mix == QUANT_MIX_F32 && lg) {
        float *one = model_logits(m, true);
        double d = one ? max_rel(one, lg, VOCAB) : INFINITY;
        printf("  f32: prefill vs one-by-one decode: max rel diff %.3g\n", d);
        CHECK(d <= 1e-4, "prefill vs decode differ by %g", d);
        free(one);
    }
    model_close(m);
}

/* ---- helpers ------------------------------------------------------------------------------ */

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

/* True if DIR holds a file whose name contains PART. */
static bool dir_has(const char *dir, const char *part)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    bool found = false;
    while (d && (de = readdir(d)))
        found |= strstr(de->d_name, part) != NULL;
    if (d)
        closedir(d);
    return found;
}

static uint8_t *file_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc(*len ? *len : 1);
    if (fread(buf, 1, *len, f) != *len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

static int convert_to(const char *dir, const char *out, enum quant_mix mix, uint32_t threads)
{
    struct convert_config cfg = {
        .hf_dir = dir, .out_path = out, .mix = mix, .n_threads = threads, .name = "tiny"};
    err_clear();
    return convert_run(&cfg, NULL);
}

/* A conversion that must fail with code `want` and a message containing `part`, leaving
 * neither the output nor a temp file. */
static void expect_failure(const char *dir, int want, const char *part)
{
    char out[600];
    snprintf(out, sizeof(out), "%s/fail.gguf", tmp_root);
    int rc = convert_to(dir, out, QUANT_MIX_F32, 2);
    printf("  expected failure (%s): %s\n", part, err_msg());
    CHECK(rc == want, "%s: rc %d, expected %d (%s)", dir, rc, want, err_msg());
    CHECK(strstr(err_msg(), part) != NULL, "message '%s' does not name '%s'", err_msg(), part);
    CHECK(access(out, F_OK) != 0 && !dir_has(tmp_root, "fail.gguf.tmp"),
          "a failed conversion left a file");
}

struct warnings {
    int n;
    char text[4][512];
};

static void warnings_collect(void *arg, const struct convert_event *ev)
{
    struct warnings *w = arg;
    if (ev->kind != CONVERT_EVENT_WARNING)
        return;
    if (w->n < 4)
        snprintf(w->text[w->n], sizeof(w->text[0]), "%s", ev->text);
    w->n++;
}

/* True if the files at a and b have the same bytes. */
static bool same_bytes(const char *a, const char *b)
{
    size_t la = 0, lb = 0;
    uint8_t *fa = file_slurp(a, &la), *fb = file_slurp(b, &lb);
    bool same = fa && fb && la == lb && !memcmp(fa, fb, la);
    free(fa);
    free(fb);
    return same;
}

/* ---- the parts of the test ---------------------------------------------------------------- */

static void test_safetensors_hostile(void)
{
    static const struct {
        const char *what, *json;
        uint64_t data_len;
        int64_t len_delta; /* added to the true header length */
        int want;
    } cases[] = {
        {"valid", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16, 0, 0},
        {"header longer than file", "{}", 0, 100, -EINVAL},
        {"end past data", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,32]}}", 16,
         0, -EINVAL},
        {"size mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", 16,
         0, -EINVAL},
        {"begin after end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 16,
         0, -EINVAL},
        {"overflowing shape",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,16]}}",
         16, 0, -EOVERFLOW},
        {"negative dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}", 16,
         0, -EINVAL},
        {"not an object", "[1,2,3]", 0, 0, -EINVAL},
        {"truncated JSON", "{\"a\":{\"dtype\":\"F32\"", 0, 0, -EINVAL},
        {"missing offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4]}}", 16, 0, -EINVAL},
    };
    char path[600];
    snprintf(path, sizeof(path), "%s/hostile.safetensors", tmp_root);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        FILE *f = fopen(path, "wb");
        uint64_t hl = strlen(cases[i].json) + (uint64_t)cases[i].len_delta;
        for (int b = 0; b < 8; b++)
            fputc((int)((hl >> (8 * b)) & 0xff), f);
        fputs(cases[i].json, f);
        for (uint64_t b = 0; b < cases[i].data_len; b++)
            fputc((int)b, f);
        fclose(f);
        struct safetensors_file *sf = NULL;
        int rc = safetensors_open(path, &sf);
        CHECK(rc == cases[i].want, "safetensors '%s': rc %d, expected %d (%s)", cases[i].what, rc,
              cases[i].want, err_msg());
        if (!rc) {
            const struct safetensors_tensor *t = safetensors_find(sf, "a");
            CHECK(t && t->n_elements == 4 && t->dtype == SAFETENSORS_F32 && t->size == 16 &&
                      ((const uint8_t *)t->data)[5] == 5,
                  "valid safetensors: tensor a");
            CHECK(!safetensors_find(sf, "b"), "found a tensor that is not there");
        }
        safetensors_close(sf);
    }
}

static void test_mixes(const char *dir)
{
    char out[600];
    for (int mix = 0; mix < QUANT_MIX_COUNT; mix++) {
        snprintf(out, sizeof(out), "%s/tiny-%s.gguf", tmp_root, quant_mix_name(mix));
        int rc = convert_to(dir, out, (enum quant_mix)mix, 2);
        CHECK(rc == 0, "convert %s: %s", quant_mix_name(mix), err_msg());
        if (!rc)
            check_converted(out, (enum quant_mix)mix);
    }
    printf("  quantized round trip (normalised RMS, worst tensor): Q8_0 %.4f (worst block %.3f "
           "steps), Q4_K %.4f, Q6_K %.4f\n",
           worst_rms[QUANT_Q8_0], worst_q8_block, worst_rms[QUANT_Q4_K], worst_rms[QUANT_Q6_K]);
    /* The same model in each mix: logits correlated with the f32 file's. Only a sanity bound:
     * the mapping is checked exactly above and the model against transformers in tests/hf/.
     * Over 30 seeds the normalised error was 0.002-0.003 (bf16), 0.014-0.22 (q8_0) and
     * 0.07-0.40 (q4_k_m): a changed top-2 choice among 8 random experts gives the tail.
     * Unrelated logits of the same scale would give about 1.4. */
    static const double bound[QUANT_MIX_COUNT] = {0, 0.5, 0.7, 1.0};
    for (int mix = 1; mix < QUANT_MIX_COUNT; mix++) {
        if (!mix_logits[0] || !mix_logits[mix])
            continue;
        double d = test_norm_rel_err(mix_logits[mix], mix_logits[0], VOCAB);
        printf("  logits %s vs f32: normalised error %.4f (sanity bound %.1f)\n",
               quant_mix_name(mix), d, bound[mix]);
        CHECK(d <= bound[mix], "%s logits differ from f32 by %g", quant_mix_name(mix), d);
    }
}

static void test_sharded_and_threads(const char *single_dir)
{
    char dir[512], a[600], b[600], c[600];
    struct variant v5 = {.n_shards = 2, .v5_config = true};
    ckpt_write("sharded", &v5, dir, sizeof(dir));
    snprintf(a, sizeof(a), "%s/tiny-f32.gguf", tmp_root);
    snprintf(b, sizeof(b), "%s/sharded-f32.gguf", tmp_root);
    int rc = convert_to(dir, b, QUANT_MIX_F32, 2);
    CHECK(rc == 0, "sharded convert: %s", err_msg());
    size_t la = 0, lb = 0;
    uint8_t *fa = file_slurp(a, &la), *fb = rc ? NULL : file_slurp(b, &lb);
    CHECK(fa && fb && la == lb && !memcmp(fa, fb, la),
          "sharded input with transformers 5.x config keys gives a different file");
    free(fa);
    free(fb);

    /* q4_k_m with 1 and 3 threads: the same bytes */
    snprintf(b, sizeof(b), "%s/t1.gguf", tmp_root);
    snprintf(c, sizeof(c), "%s/t3.gguf", tmp_root);
    rc = convert_to(single_dir, b, QUANT_MIX_Q4_K_M, 1);
    rc = rc ? rc : convert_to(single_dir, c, QUANT_MIX_Q4_K_M, 3);
    CHECK(rc == 0, "convert: %s", err_msg());
    fa = file_slurp(b, &la);
    fb = file_slurp(c, &lb);
    CHECK(fa && fb && la == lb && !memcmp(fa, fb, la), "1 and 3 threads give different files");
    free(fa);
    free(fb);
}

static void test_errors(const char *good_dir)
{
    char dir[512], path[600];
    struct variant v;

    v = (struct variant){.drop = "model.layers.1.self_attn.k_norm.weight"};
    expect_failure(ckpt_write("missing", &v, dir, sizeof(dir)), -ENOENT,
                   "model.layers.1.self_attn.k_norm.weight");
    v = (struct variant){.drop = "model.layers.0.mlp.experts.3.up_proj.weight"};
    expect_failure(ckpt_write("missing-expert", &v, dir, sizeof(dir)), -ENOENT,
                   "model.layers.0.mlp.experts.3.up_proj.weight");
    v = (struct variant){.drop = "model.layers.1.mlp.experts.gate_up_proj"};
    expect_failure(ckpt_write("missing-fused", &v, dir, sizeof(dir)), -ENOENT,
                   "model.layers.1.mlp.experts.0.gate_proj.weight");
    v = (struct variant){.shrink = "model.layers.0.self_attn.q_proj.weight"};
    expect_failure(ckpt_write("shape", &v, dir, sizeof(dir)), -EINVAL,
                   "'model.layers.0.self_attn.q_proj.weight' has shape [96, 256], expected "
                   "[128, 256]");
    v = (struct variant){.shrink = "model.layers.1.mlp.experts.gate_up_proj", .shrink_dim = 1};
    expect_failure(ckpt_write("shape-fused", &v, dir, sizeof(dir)), -EINVAL,
                   "'model.layers.1.mlp.experts.gate_up_proj' has shape [8, 96, 256], expected "
                   "[8, 128, 256]");
    v = (struct variant){.model_type = "llama"};
    expect_failure(ckpt_write("arch", &v, dir, sizeof(dir)), -ENOTSUP,
                   "unsupported architecture 'LlamaForCausalLM'");

    /* a truncated copy of the good weights */
    v = (struct variant){0};
    ckpt_write("truncated", &v, dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    struct stat st;
    stat(path, &st);
    CHECK(truncate(path, st.st_size - 100) == 0, "truncate");
    expect_failure(dir, -EINVAL, "outside the data section");
    /* a header that is not JSON */
    FILE *f = fopen(path, "r+b");
    fseek(f, 8, SEEK_SET);
    fputs("#!", f);
    fclose(f);
    expect_failure(dir, -EINVAL, "not valid JSON");

    /* missing files */
    snprintf(path, sizeof(path), "%s/nonexistent", tmp_root);
    expect_failure(path, -ENOENT, "config.json");
    v = (struct variant){0};
    ckpt_write("no-tokenizer", &v, dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    unlink(path);
    expect_failure(dir, -ENOENT, "tokenizer.json");
    (void)good_dir;
}

/* config.json values strata does not compute: each refused, the message naming the key, the
 * value and why (docs/convert-keys.md). Only config.json changes between the cases. */
static void test_config_refusals(void)
{
    static const struct {
        const char *patch, *drop, *part;
        int rc;
    } cases[] = {
        {"{\"norm_topk_prob\": false}", NULL, "norm_topk_prob = false is not supported: with",
         -ENOTSUP},
        {NULL, "norm_topk_prob", "norm_topk_prob is absent, which transformers reads as false",
         -ENOTSUP},
        {"{\"norm_topk_prob\": null}", NULL, "norm_topk_prob is absent", -ENOTSUP},
        {"{\"hidden_act\": \"gelu\"}", NULL, "hidden_act = \"gelu\" is not supported: strata",
         -ENOTSUP},
        {"{\"attention_bias\": true}", NULL, "attention_bias = true is not supported", -ENOTSUP},
        {"{\"use_sliding_window\": true, \"sliding_window\": 8}", NULL,
         "use_sliding_window = true is not supported", -ENOTSUP},
        {"{\"mlp_only_layers\": [1]}", NULL, "mlp_only_layers = [1] is not supported", -ENOTSUP},
        {"{\"decoder_sparse_step\": 2}", NULL, "decoder_sparse_step = 2 is not supported",
         -ENOTSUP},
        {"{\"layer_types\": [\"full_attention\", \"sliding_attention\"]}", NULL,
         "layer_types = [\"full_attention\",\"sliding_attention\"] is not supported", -ENOTSUP},
        {"{\"partial_rotary_factor\": 0.5}", NULL, "partial_rotary_factor = 0.5 is not supported",
         -ENOTSUP},
        {"{\"shared_expert_intermediate_size\": 64}", NULL,
         "shared_expert_intermediate_size = 64 is not supported", -ENOTSUP},
        {"{\"use_qk_norm\": false}", NULL, "use_qk_norm = false is not supported", -ENOTSUP},
        {"{\"qk_norm\": false}", NULL, "qk_norm = false is not supported", -ENOTSUP},
        {"{\"quantization_config\": {\"quant_method\": \"fp8\"}}", NULL,
         "quantization_config = {\"quant_method\":\"fp8\"} is not supported", -ENOTSUP},
        {"{\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, "
         "\"original_max_position_embeddings\": 1024}}",
         NULL, "rope_scaling.rope_type = \"yarn\" is not supported", -ENOTSUP},
        {"{\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}}", NULL,
         "rope_scaling.type = \"dynamic\" is not supported", -ENOTSUP},
        {"{\"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 2.0, "
         "\"rope_theta\": 1000000.0}}",
         NULL, "rope_parameters.rope_type = \"linear\" is not supported", -ENOTSUP},
        {"{\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0, "
         "\"partial_rotary_factor\": 0.5}}",
         NULL, "rope_parameters.partial_rotary_factor = 0.5 is not supported", -ENOTSUP},
        {"{\"rope_parameters\": \"default\"}", NULL,
         "rope_parameters = \"default\" is not supported", -ENOTSUP},
        {"{\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0}}", NULL,
         "rope_theta = 1000000.0 and rope_parameters.rope_theta = 10000.0 differ", -ENOTSUP},
        {"{\"rope_parameters\": {\"rope_theta\": \"1e6\"}}", NULL,
         "rope_parameters.rope_theta is \"1e6\", expected a number", -EINVAL},
        {"{\"num_local_experts\": 16}", NULL, "num_experts = 8 and num_local_experts = 16 differ",
         -ENOTSUP},
        {NULL, "num_key_value_heads", "num_key_value_heads is missing", -ENOENT},
    };
    char dir[512];
    struct variant v = {0};

    ckpt_write("keys", &v, dir, sizeof(dir));
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        v = (struct variant){.patch = cases[i].patch, .drop_key = cases[i].drop};
        config_write(dir, &v);
        expect_failure(dir, cases[i].rc, cases[i].part);
    }
}

/* Keys the table lacks: refused by default, at the top level and inside rope_parameters; with
 * allow_unknown_keys one warning per key and the same bytes as the plain checkpoint. */
static void test_config_unknown_keys(void)
{
    char dir[512], out[600], plain[600];
    struct variant v = {.patch = "{\"foo_scale\": 3}"};

    ckpt_write("unknown", &v, dir, sizeof(dir));
    expect_failure(dir, -ENOTSUP,
                   "unknown config key foo_scale (= 3): strata does not know whether it changes "
                   "the computation");
    v.patch = "{\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0, "
              "\"mrope_section\": [8, 8]}}";
    config_write(dir, &v);
    expect_failure(dir, -ENOTSUP, "unknown config key rope_parameters.mrope_section (= [8,8])");

    v.patch = "{\"foo_scale\": 3, \"rope_parameters\": {\"rope_type\": \"default\", "
              "\"rope_theta\": 1000000.0, \"mrope_section\": [8, 8]}}";
    config_write(dir, &v);
    struct warnings w = {0};
    struct convert_config cfg = {.hf_dir = dir,
                                 .out_path = out,
                                 .mix = QUANT_MIX_F32,
                                 .n_threads = 2,
                                 .name = "tiny",
                                 .allow_unknown_keys = true,
                                 .progress = warnings_collect,
                                 .progress_arg = &w};
    snprintf(out, sizeof(out), "%s/unknown-allowed.gguf", tmp_root);
    snprintf(plain, sizeof(plain), "%s/tiny-f32.gguf", tmp_root);
    err_clear();
    int rc = convert_run(&cfg, NULL);
    CHECK(rc == 0, "allow_unknown_keys: %s", err_msg());
    CHECK(w.n == 2 && strstr(w.text[0], "unknown config key foo_scale (= 3) ignored") &&
              strstr(w.text[1], "unknown config key rope_parameters.mrope_section"),
          "allow_unknown_keys: %d warnings, first '%s'", w.n, w.n ? w.text[0] : "");
    CHECK(rc || same_bytes(out, plain),
          "unknown keys allowed: the file differs from the plain one");
    printf("  unknown keys allowed: %d warnings (%s), same bytes as without them\n", w.n,
           w.n ? w.text[0] : "");
}

/* Every key of no effect, the accepted values of the checked keys and the rope parameters the
 * default type ignores: the same bytes as the plain checkpoint. */
static void test_config_no_effect_keys(void)
{
    char dir[512], out[600], plain[600];
    struct variant v = {
        .v5_config = true,
        .patch = "{\"_name_or_path\": \"x/y\", \"transformers_version\": \"5.17.0\", "
                 "\"torch_dtype\": \"bfloat16\", \"dtype\": \"float32\", \"use_cache\": false, "
                 "\"initializer_range\": 0.5, \"attention_dropout\": 0.5, "
                 "\"router_aux_loss_coef\": 0.5, \"output_router_logits\": true, "
                 "\"sliding_window\": 8, \"max_window_layers\": 1, \"output_attentions\": true, "
                 "\"output_hidden_states\": true, \"return_dict\": false, "
                 "\"id2label\": {\"0\": \"LABEL_0\"}, \"label2id\": {\"LABEL_0\": 0}, "
                 "\"tokenizer_class\": \"Qwen2Tokenizer\", \"hidden_act\": \"silu\", "
                 "\"attention_bias\": false, \"use_sliding_window\": false, "
                 "\"layer_types\": [\"full_attention\", \"full_attention\"], "
                 "\"partial_rotary_factor\": 1.0, \"shared_expert_intermediate_size\": 0, "
                 "\"use_qk_norm\": true, \"qk_norm\": true, \"quantization_config\": null, "
                 "\"rope_theta\": 1000000, \"num_experts\": 8, \"rope_scaling\": null, "
                 "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0, "
                 "\"partial_rotary_factor\": 1, \"factor\": 4.0, "
                 "\"original_max_position_embeddings\": 1024, \"beta_fast\": 32, "
                 "\"beta_slow\": 1}}"};

    ckpt_write("no-effect", &v, dir, sizeof(dir));
    snprintf(out, sizeof(out), "%s/no-effect.gguf", tmp_root);
    snprintf(plain, sizeof(plain), "%s/tiny-f32.gguf", tmp_root);
    int rc = convert_to(dir, out, QUANT_MIX_F32, 2);
    CHECK(rc == 0, "no-effect keys: %s", err_msg());
    CHECK(rc || same_bytes(out, plain), "no-effect keys: the file differs from the plain one");
}

/* strata convert refuses an unknown key (status 1, the key named) and converts it with
 * --allow-unknown-keys, printing a warning. */
static void check_cli_unknown_keys(const char *gguf, const char *log)
{
    char cmd[4096], dir[512];
    struct variant v = {.patch = "{\"foo_scale\": 3}"};
    size_t len = 0;

    ckpt_write("unknown-cli", &v, dir, sizeof(dir));
    snprintf(cmd, sizeof(cmd), "'%s' convert '%s' -o '%s' -q 2>'%s'", STRATA_BINARY, dir, gguf,
             log);
    int rc = system(cmd);
    char *text = (char *)file_slurp(log, &len);
    text = text ? realloc(text, len + 1) : NULL;
    if (text)
        text[len] = '\0';
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 1 && text &&
              strstr(text, "unknown config key foo_scale (= 3)"),
          "convert with an unknown key: status %d, stderr '%s'", rc, text ? text : "");
    free(text);
    snprintf(cmd, sizeof(cmd), "'%s' convert '%s' -o '%s' -q --allow-unknown-keys 2>'%s'",
             STRATA_BINARY, dir, gguf, log);
    rc = system(cmd);
    text = (char *)file_slurp(log, &len);
    text = text ? realloc(text, len + 1) : NULL;
    if (text)
        text[len] = '\0';
    CHECK(rc == 0 && text &&
              strstr(text, "strata convert: warning: unknown config key foo_scale (= 3) ignored"),
          "convert --allow-unknown-keys: status %d, stderr '%s'", rc, text ? text : "");
    free(text);
}

/* The strata binary: convert, then logits with --greedy, against the library's results. */
static void test_cli(const char *dir)
{
    char cmd[4096], gguf[600], bin[600], txt[600], log[600];
    snprintf(gguf, sizeof(gguf), "%s/cli.gguf", tmp_root);
    snprintf(bin, sizeof(bin), "%s/cli.bin", tmp_root);
    snprintf(txt, sizeof(txt), "%s/cli.txt", tmp_root);
    snprintf(log, sizeof(log), "%s/cli.log", tmp_root);
    snprintf(cmd, sizeof(cmd), "'%s' convert '%s' -o '%s' --quant q8_0 --threads 2 2>'%s'",
             STRATA_BINARY, dir, gguf, log);
    int rc = system(cmd);
    CHECK(rc == 0, "%s: exit %d", cmd, rc);
    snprintf(cmd, sizeof(cmd), "'%s' convert '%s/nonexistent' -o '%s' 2>'%s'", STRATA_BINARY,
             tmp_root, gguf, log);
    rc = system(cmd);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 1, "convert of a missing directory: status %d", rc);
    check_cli_unknown_keys(gguf, log);

    const int n_greedy = 3;
    snprintf(cmd, sizeof(cmd),
             "'%s' logits -m '%s' --ids 3,100,257,261,50,200 --greedy %d -o '%s' >'%s' 2>'%s'",
             STRATA_BINARY, gguf, n_greedy, bin, txt, log);
    rc = system(cmd);
    CHECK(rc == 0, "%s: exit %d", cmd, rc);
    size_t len = 0, tl = 0;
    uint8_t *data = file_slurp(bin, &len);
    char *text = (char *)file_slurp(txt, &tl);
    CHECK(data && len == (size_t)(1 + n_greedy) * VOCAB * 4, "logits file: %zu bytes", len);
    if (!data || !text || len != (size_t)(1 + n_greedy) * VOCAB * 4) {
        free(data);
        free(text);
        return;
    }
    text = realloc(text, tl + 1);
    text[tl] = '\0';

    /* the same in-process: prefill, then feed back the argmax */
    struct model *m = NULL;
    struct backend *b = NULL;
    struct stream *s = NULL;
    struct backend_cpu_config bc = {0};
    float lg[VOCAB];
    char want[256] = "greedy:";
    rc = model_open(gguf, &m);
    rc = rc ? rc : backend_cpu_open(m, &bc, &b);
    rc = rc ? rc : stream_open(b, 64, 16, &s);
    rc = rc ? rc : stream_eval(s, prompt_ids, N_PROMPT, lg);
    CHECK(rc == 0, "in-process: %s", err_msg());
    for (int i = 0; !rc && i <= n_greedy; i++) {
        double d = max_rel((const float *)data + (size_t)i * VOCAB, lg, VOCAB);
        CHECK(d <= 1e-5, "strata logits block %d differs from the library by %g", i, d);
        if (i == n_greedy)
            break;
        int32_t next = argmax(lg, VOCAB);
        snprintf(want + strlen(want), sizeof(want) - strlen(want), " %d", next);
        rc = stream_eval(s, &next, 1, lg);
    }
    CHECK(strstr(text, want) != NULL, "stdout '%s' lacks '%s'", text, want);
    CHECK(strstr(text, "ids: 3 100 257 261 50 200\n") != NULL, "stdout lacks the prompt ids");
    printf("  strata convert + strata logits --greedy %d: %s, %d logit blocks as the library's\n",
           n_greedy, want, n_greedy + 1);
    stream_close(s);
    backend_close(b);
    model_close(m);
    free(data);
    free(text);
}

int main(void)
{
    uint64_t seed = test_seed(NAME);
    char dir[512];

    snprintf(tmp_root, sizeof(tmp_root), "/tmp/strata-test-convert-XXXXXX");
    if (!mkdtemp(tmp_root)) {
        perror("mkdtemp");
        return 1;
    }
    model_build(seed);
    expects_build();
    test_safetensors_hostile();
    struct variant plain = {0};
    ckpt_write("tiny", &plain, dir, sizeof(dir));
    test_mixes(dir);
    test_sharded_and_threads(dir);
    test_errors(dir);
    test_config_refusals();
    test_config_unknown_keys();
    test_config_no_effect_keys();
    if (access(STRATA_BINARY, X_OK) == 0)
        test_cli(dir);
    else
        printf("  %s not built: skipping the CLI part\n", STRATA_BINARY);

    nftw(tmp_root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    for (int i = 0; i < n_srcs; i++)
        free(srcs[i].v);
    for (int i = 0; i < n_expects; i++)
        free(expects[i].v);
    for (int i = 0; i < QUANT_MIX_COUNT; i++)
        free(mix_logits[i]);
    return test_finish(NAME);
}
