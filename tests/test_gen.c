/* test_gen: the synthetic checkpoint generator (tools/gen).
 *
 * - drawing: every drawable type, dequantized with the scalar reference, has mean ~0 and the
 *   requested std; invalid requests are refused;
 * - mixes and presets: the type rules and the shape fallback;
 * - vocabulary: byte map, synthetic BPE consistency, tokenizer.json loading and padding;
 * - files: the tiny preset in every mix opens with gguf_open, has exactly the qwen3moe tensors
 *   with the right types and shapes and metadata, is < 10 MB, and every tensor's dequantized
 *   values are well-scaled; same seed with other thread counts gives identical bytes, another
 *   seed other bytes; cancellation and bad arguments leave no file behind;
 * - hybrid files (qwen3next, qwen35moe): the tiny presets in every mix have exactly the keys,
 *   tensors, shapes and types of the strata contract (docs/formats.md §4(c), §4(f)), written out
 *   here independently of gen.c; ssm_a is strictly negative; 1 and 2 threads give the same
 *   bytes; rope.dimension_sections at the real head size; bad GDN shapes are refused.
 * Seeds come from test_seed (replay with STRATA_TEST_SEED).
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errors.h"
#include "gen.h"
#include "gguf.h"
#include "quant.h"
#include "quant_ref.h"
#include "testutil.h"

static char tmpdir[64];

static const char *tmp_path(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", tmpdir, name);
    return buf;
}

static void moments(const float *x, size_t n, double *mean, double *std)
{
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++)
        s += x[i];
    *mean = s / (double)n;
    for (size_t i = 0; i < n; i++)
        s2 += (x[i] - *mean) * (x[i] - *mean);
    *std = sqrt(s2 / (double)n);
}

static bool all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            return false;
    }
    return true;
}

/* ---- drawing ------------------------------------------------------------------------------ */

static void test_draw(uint64_t seed)
{
    static const uint32_t types[] = {QUANT_F32,  QUANT_Q8_0, QUANT_Q4_K,
                                     QUANT_Q5_K, QUANT_Q6_K, QUANT_MXFP4};
    const uint64_t n = 512 * QK_K;
    struct rng r;
    float *y = malloc(n * sizeof(float));

    rng_seed(&r, seed, 1);
    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
        uint32_t type = types[k];
        uint32_t fan_in = 64 + rng_below(&r, 8192);
        float std = 1.0f / sqrtf((float)fan_in);
        uint64_t bytes;
        CHECK(quant_row_bytes(type, n, &bytes) == 0, "row bytes");
        uint8_t *a = malloc(bytes), *b = malloc(bytes);
        test_poison_bytes(a, bytes);
        test_poison_bytes(b, bytes);

        struct rng ra, rb;
        rng_seed(&ra, seed, 100 + k);
        rb = ra;
        CHECK(gen_blocks_draw(type, a, n, 0.0f, std, &ra) == 0, "%s: %s", quant_type_name(type),
              err_msg());
        CHECK(gen_blocks_draw(type, b, n, 0.0f, std, &rb) == 0, "%s", quant_type_name(type));
        CHECK(!memcmp(a, b, bytes), "%s: same stream, different blocks", quant_type_name(type));
        rng_seed(&rb, seed + 1, 100 + k);
        CHECK(gen_blocks_draw(type, b, n, 0.0f, std, &rb) == 0, "%s", quant_type_name(type));
        CHECK(memcmp(a, b, bytes), "%s: other stream, same blocks", quant_type_name(type));

        test_poison_f32(y, n);
        CHECK(quant_ref_dequantize(type, a, y, (int64_t)n) == 0, "dequantize %s",
              quant_type_name(type));
        double mean, sd;
        moments(y, n, &mean, &sd);
        CHECK(all_finite(y, n), "%s: non-finite value", quant_type_name(type));
        /* The expected errors are ~0.3% of std for the mean and < 1% for the std. */
        CHECK(fabs(mean) < 0.02 * std, "%s: mean %g, std %g", quant_type_name(type), mean,
              (double)std);
        CHECK(fabs(sd / std - 1.0) < 0.03, "%s: std %g, want %g (fan-in %u)", quant_type_name(type),
              sd, (double)std, fan_in);
        printf("draw %-5s fan-in %4u: mean %+.4f std, std %.4f of target\n", quant_type_name(type),
               fan_in, mean / std, sd / std);

        if (type == QUANT_Q8_0) {
            const struct block_q8_0 *q = (const void *)a;
            bool full_range = true;
            for (uint64_t i = 0; i < n / QK_32; i++)
                for (int j = 0; j < QK_32; j++)
                    full_range &= q[i].qs[j] != -128;
            CHECK(full_range, "Q8_0 code -128 drawn");
        }
        free(a);
        free(b);
    }

    /* F32 with a mean: norm weights. */
    test_poison_f32(y, n);
    CHECK(gen_blocks_draw(QUANT_F32, y, n, 1.0f, 0.05f, &r) == 0, "F32 with mean");
    double mean, sd;
    moments(y, n, &mean, &sd);
    CHECK(fabs(mean - 1.0) < 0.002 && fabs(sd / 0.05 - 1.0) < 0.03, "norm: mean %g std %g", mean,
          sd);

    uint8_t blk[sizeof(struct block_q8_0) * 4];
    CHECK(gen_blocks_draw(QUANT_Q4_0, blk, 32, 0.0f, 1.0f, &r) == -EINVAL, "Q4_0 is not drawn");
    CHECK(gen_blocks_draw(QUANT_Q8_0, blk, 48, 0.0f, 1.0f, &r) == -EINVAL, "48 values");
    CHECK(gen_blocks_draw(QUANT_Q8_0, blk, 32, 1.0f, 1.0f, &r) == -EINVAL, "Q8_0 with mean");
    CHECK(!gen_blocks_can_draw(QUANT_Q4_0) && gen_blocks_can_draw(QUANT_MXFP4) &&
              gen_blocks_can_draw(QUANT_Q6_K),
          "can_draw");
    free(y);
}

/* ---- mixes and presets -------------------------------------------------------------------- */

static void test_mixes(void)
{
    enum quant_mix m;
    bool fb;

    CHECK(quant_mix_parse("Q4_K_M", &m) == 0 && m == QUANT_MIX_Q4_K_M, "parse Q4_K_M");
    CHECK(quant_mix_parse("q8_0", &m) == 0 && m == QUANT_MIX_Q8_0, "parse q8_0");
    CHECK(quant_mix_parse("q4_k_s", &m) == -EINVAL && strstr(err_msg(), "q4_k_s"), "unknown mix: %s",
          err_msg());
    CHECK(quant_mix_file_type(QUANT_MIX_F32) == 0 && quant_mix_file_type(QUANT_MIX_Q8_0) == 7 &&
              quant_mix_file_type(QUANT_MIX_Q4_K_M) == 15,
          "file types");

    static const struct {
        enum quant_mix mix;
        const char *name;
        uint32_t n_dims;
        uint64_t ne0;
        uint32_t want;
        bool fell_back;
    } cases[] = {
        {QUANT_MIX_Q4_K_M, "blk.0.ffn_gate_exps.weight", 3, 2048, QUANT_Q4_K, false},
        {QUANT_MIX_Q4_K_M, "blk.7.ffn_up_exps.weight", 3, 2048, QUANT_Q4_K, false},
        {QUANT_MIX_Q4_K_M, "blk.7.ffn_down_exps.weight", 3, 768, QUANT_Q6_K, false},
        {QUANT_MIX_Q4_K_M, "blk.7.ffn_down_exps.weight", 3, 128, QUANT_Q8_0, true},
        {QUANT_MIX_Q4_K_M, "blk.7.ffn_down_exps.weight", 3, 100, QUANT_F32, true},
        {QUANT_MIX_Q4_K_M, "blk.0.attn_q.weight", 2, 2048, QUANT_Q8_0, false},
        {QUANT_MIX_Q4_K_M, "blk.0.attn_output.weight", 2, 4096, QUANT_Q8_0, false},
        {QUANT_MIX_Q4_K_M, "token_embd.weight", 2, 2048, QUANT_Q4_K, false},
        {QUANT_MIX_Q4_K_M, "output.weight", 2, 2048, QUANT_Q6_K, false},
        {QUANT_MIX_Q4_K_M, "blk.0.ffn_gate_inp.weight", 2, 2048, QUANT_F32, false},
        {QUANT_MIX_Q4_K_M, "blk.0.attn_q_norm.weight", 1, 128, QUANT_F32, false},
        {QUANT_MIX_Q8_0, "blk.0.ffn_down_exps.weight", 3, 768, QUANT_Q8_0, false},
        {QUANT_MIX_Q8_0, "blk.0.ffn_gate_inp.weight", 2, 2048, QUANT_F32, false},
        {QUANT_MIX_Q8_0, "output_norm.weight", 1, 2048, QUANT_F32, false},
        {QUANT_MIX_Q8_0, "token_embd.weight", 2, 40, QUANT_F32, true},
        {QUANT_MIX_F32, "blk.0.ffn_up_exps.weight", 3, 2048, QUANT_F32, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint32_t t =
            quant_mix_tensor_type(cases[i].mix, cases[i].name, cases[i].n_dims, cases[i].ne0, &fb);
        CHECK(t == cases[i].want && fb == cases[i].fell_back, "%s %s ne0 %llu: %s%s, want %s",
              quant_mix_name(cases[i].mix), cases[i].name, (unsigned long long)cases[i].ne0,
              quant_type_name(t), fb ? " (fallback)" : "", quant_type_name(cases[i].want));
    }

    const struct gen_preset *p = gen_preset_find("30b-a3b");
    CHECK(p && p->n_layer == 48 && p->n_embd == 2048 && p->n_head == 32 && p->n_head_kv == 4 &&
              p->head_dim == 128 && p->n_expert == 128 && p->n_expert_used == 8 &&
              p->n_ff_exp == 768 && p->n_vocab == 151936 && p->n_ctx == 40960,
          "30b-a3b preset");
    p = gen_preset_find("235b-a22b");
    CHECK(p && p->n_layer == 94 && p->n_embd == 4096 && p->n_head == 64 && p->n_ff_exp == 1536,
          "235b-a22b preset");
    CHECK(gen_preset_find("7b") == NULL, "unknown preset found");
}

/* ---- vocabulary --------------------------------------------------------------------------- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool find_token(char *const *sorted, uint32_t n, const char *s)
{
    return bsearch(&s, sorted, n, sizeof(char *), cmp_str) != NULL;
}

/* Byte tokens at ids 0..255, unique tokens, and every merge "a b" with a, b and ab tokens. */
static void check_vocab(const char *what, char **tokens, uint32_t n, char **merges,
                        uint32_t n_merges)
{
    char **sorted = malloc(n * sizeof(char *));
    uint32_t bad = 0;

    for (int b = 0; b < 256; b++) {
        char u[3];
        gen_byte_to_utf8((uint8_t)b, u);
        bad += strcmp(tokens[b], u) != 0;
    }
    CHECK(bad == 0, "%s: %u byte tokens are not at their byte's id", what, bad);
    memcpy(sorted, tokens, n * sizeof(char *));
    qsort(sorted, n, sizeof(char *), cmp_str);
    for (uint32_t i = 1; i < n; i++)
        bad += !strcmp(sorted[i - 1], sorted[i]);
    CHECK(bad == 0, "%s: %u duplicate tokens", what, bad);
    for (uint32_t m = 0; m < n_merges; m++) {
        char buf[256];
        const char *sp = strchr(merges[m], ' ');
        if (!sp || strchr(sp + 1, ' ') || strlen(merges[m]) >= sizeof(buf)) {
            bad++;
            continue;
        }
        size_t ll = (size_t)(sp - merges[m]);
        memcpy(buf, merges[m], ll);
        buf[ll] = 0;
        bool ok = find_token(sorted, n, buf) && find_token(sorted, n, sp + 1);
        strcpy(buf + ll, sp + 1);
        ok = ok && find_token(sorted, n, buf);
        if (!ok && bad++ < 5)
            fprintf(stderr, "%s: merge %u '%s' is not made of tokens\n", what, m, merges[m]);
    }
    CHECK(bad == 0, "%s: %u inconsistent merges", what, bad);
    free(sorted);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* A small tokenizer.json: 256 byte tokens, three merges (both merge formats), added tokens. */
static void write_tokenizer_json(const char *path, uint32_t extra_id)
{
    size_t cap = 64 * 1024, len = 0;
    char *s = malloc(cap);

    len += (size_t)snprintf(s + len, cap - len, "{\"version\": \"1.0\", \"added_tokens\": [");
    len += (size_t)snprintf(s + len, cap - len,
                            "{\"id\": 259, \"content\": \"<|endoftext|>\", \"special\": true},"
                            "{\"id\": 260, \"content\": \"<|im_start|>\", \"special\": true},"
                            "{\"id\": 261, \"content\": \"<|im_end|>\", \"special\": true},"
                            "{\"id\": %u, \"content\": \"<think>\", \"special\": false}",
                            extra_id);
    len += (size_t)snprintf(s + len, cap - len, "], \"model\": {\"type\": \"BPE\", \"vocab\": {");
    for (int b = 0; b < 256; b++) {
        char u[3];
        gen_byte_to_utf8((uint8_t)b, u);
        if (b == '"' || b == '\\')
            len += (size_t)snprintf(s + len, cap - len, "\"\\%s\": %d, ", u, b);
        else
            len += (size_t)snprintf(s + len, cap - len, "\"%s\": %d, ", u, b);
    }
    len += (size_t)snprintf(s + len, cap - len,
                            "\"\xC4\xA0t\": 256, \"he\": 257, \"\xC4\xA0the\": 258}, "
                            "\"merges\": [\"\xC4\xA0 t\", [\"h\", \"e\"], "
                            "[\"\xC4\xA0t\", \"he\"]]}}");
    write_text(path, s);
    free(s);
}

static void test_vocab(void)
{
    char u[3], path[128];
    struct gen_vocab v;

    CHECK(gen_byte_to_utf8(' ', u) == 2 && !strcmp(u, "\xC4\xA0"), "space is U+0120");
    CHECK(gen_byte_to_utf8('\n', u) == 2 && !strcmp(u, "\xC4\x8A"), "newline is U+010A");
    CHECK(gen_byte_to_utf8('A', u) == 1 && !strcmp(u, "A"), "A");
    CHECK(gen_byte_to_utf8(0x7F, u) == 2 && !strcmp(u, "\xC4\xA1"), "DEL is U+0121");
    CHECK(gen_byte_to_utf8(0xAD, u) == 2 && !strcmp(u, "\xC5\x83"), "0xAD is U+0143");
    CHECK(gen_byte_to_utf8(0xE9, u) == 2 && !strcmp(u, "\xC3\xA9"), "0xE9 is U+00E9");

    CHECK(gen_vocab_build(200, 0, &v) == -EINVAL, "200 tokens accepted");
    CHECK(gen_vocab_build(151936, 151643, &v) == 0, "qwen-size vocab: %s", err_msg());
    CHECK(v.n_tokens == 151936 && v.bos_id == 151643 && v.eos_id == 151645 && v.pad_id == 151643,
          "qwen-size ids");
    CHECK(!strcmp(v.tokens[151643], "<|endoftext|>") && !strcmp(v.tokens[151644], "<|im_start|>") &&
              !strcmp(v.tokens[151645], "<|im_end|>") && v.types[151644] == GEN_TOKEN_CONTROL,
          "qwen-size specials");
    CHECK(!strcmp(v.tokens[151935], "[PAD151935]") && v.types[151935] == GEN_TOKEN_UNUSED &&
              v.types[151642] == GEN_TOKEN_UNUSED,
          "qwen-size padding");
    uint32_t n_normal = 0;
    for (uint32_t i = 0; i < v.n_tokens; i++)
        n_normal += v.types[i] == GEN_TOKEN_NORMAL;
    CHECK(n_normal > 1000 && v.n_merges >= n_normal - 256, "%u learned tokens, %u merges", n_normal,
          v.n_merges);
    check_vocab("qwen-size synthetic", v.tokens, v.n_tokens, v.merges, v.n_merges);
    gen_vocab_free(&v);

    write_tokenizer_json(tmp_path(path, sizeof(path), "tokenizer.json"), 262);
    CHECK(gen_vocab_load(path, 1024, &v) == 0, "load tokenizer.json: %s", err_msg());
    CHECK(v.n_tokens == 1024 && v.n_merges == 3, "%u tokens, %u merges", v.n_tokens, v.n_merges);
    if (v.n_tokens == 1024 && v.n_merges == 3) {
        CHECK(!strcmp(v.merges[1], "h e") && !strcmp(v.merges[2], "\xC4\xA0t he"),
              "merges '%s' '%s'", v.merges[1], v.merges[2]);
        CHECK(!strcmp(v.tokens[258], "\xC4\xA0the") && v.types[258] == GEN_TOKEN_NORMAL,
              "token 258");
        CHECK(v.types[259] == GEN_TOKEN_CONTROL && v.types[262] == GEN_TOKEN_USER_DEFINED &&
                  v.types[263] == GEN_TOKEN_UNUSED && !strcmp(v.tokens[1023], "[PAD1023]"),
              "types");
        CHECK(v.bos_id == 259 && v.eos_id == 261 && v.pad_id == 259, "bos %u eos %u pad %u",
              v.bos_id, v.eos_id, v.pad_id);
        CHECK(!strcmp(v.tokens['"'], "\""), "escaped quote token '%s'", v.tokens['"']);
        check_vocab("tokenizer.json", v.tokens, v.n_tokens, v.merges, v.n_merges);
    }
    gen_vocab_free(&v);

    write_tokenizer_json(path, 1500); /* larger than the preset: the vocabulary grows */
    CHECK(gen_vocab_load(path, 1024, &v) == 0 && v.n_tokens == 1501, "grown vocab: %u", v.n_tokens);
    gen_vocab_free(&v);

    write_text(path, "{\"model\": {\"vocab\": [1, 2]}}");
    CHECK(gen_vocab_load(path, 1024, &v) == -EINVAL && strstr(err_msg(), path),
          "bad tokenizer.json: %s", err_msg());
    write_text(path, "{ not json");
    CHECK(gen_vocab_load(path, 1024, &v) == -EINVAL, "broken JSON accepted");
}

/* ---- files -------------------------------------------------------------------------------- */

struct want_tensor {
    char name[64];
    uint32_t n_dims;
    uint64_t ne[3];
    uint32_t type;
    double mean, std; /* expected dequantized moments */
};

/* The tensor list of a qwen3moe file, written out independently of gen.c. */
static uint32_t want_tensors(const struct gen_preset *p, enum quant_mix mix, uint32_t n_vocab,
                             struct want_tensor *w)
{
    uint64_t d = p->n_embd, q = (uint64_t)p->n_head * p->head_dim;
    uint64_t kv = (uint64_t)p->n_head_kv * p->head_dim, ff = p->n_ff_exp, e = p->n_expert;
    bool kq = mix == QUANT_MIX_Q4_K_M;
    uint32_t big = mix == QUANT_MIX_F32 ? QUANT_F32 : QUANT_Q8_0;
    uint32_t n = 0;

#define W(nm, nd, ty, m, s, ...)                                                                   \
    do {                                                                                           \
        w[n] = (struct want_tensor){                                                               \
            .n_dims = nd, .ne = {__VA_ARGS__}, .type = ty, .mean = m, .std = s};                   \
        snprintf(w[n].name, sizeof(w[n].name), "%s", nm);                                          \
        n++;                                                                                       \
    } while (0)
    char nm[64];
#define B(l, s) (snprintf(nm, sizeof(nm), "blk.%u.%s", l, s), nm)
    /* Q4_K/Q6_K need rows that are a multiple of 256, else Q8_0. */
    uint32_t k4_d = kq && d % 256 == 0 ? QUANT_Q4_K : big;
    uint32_t k6_d = kq && d % 256 == 0 ? QUANT_Q6_K : big;
    uint32_t k6_ff = kq && ff % 256 == 0 ? QUANT_Q6_K : big;

    W("token_embd.weight", 2, k4_d, 0, 1, d, n_vocab);
    for (uint32_t l = 0; l < p->n_layer; l++) {
        W(B(l, "attn_norm.weight"), 1, QUANT_F32, 1, 0.05, d);
        W(B(l, "attn_q.weight"), 2, big, 0, 1 / sqrt((double)d), d, q);
        W(B(l, "attn_k.weight"), 2, big, 0, 1 / sqrt((double)d), d, kv);
        W(B(l, "attn_v.weight"), 2, big, 0, 1 / sqrt((double)d), d, kv);
        W(B(l, "attn_output.weight"), 2, big, 0, 1 / sqrt((double)q), q, d);
        W(B(l, "attn_q_norm.weight"), 1, QUANT_F32, 1, 0.05, p->head_dim);
        W(B(l, "attn_k_norm.weight"), 1, QUANT_F32, 1, 0.05, p->head_dim);
        W(B(l, "ffn_norm.weight"), 1, QUANT_F32, 1, 0.05, d);
        W(B(l, "ffn_gate_inp.weight"), 2, QUANT_F32, 0, 1 / sqrt((double)d), d, e);
        W(B(l, "ffn_gate_exps.weight"), 3, k4_d, 0, 1 / sqrt((double)d), d, ff, e);
        W(B(l, "ffn_up_exps.weight"), 3, k4_d, 0, 1 / sqrt((double)d), d, ff, e);
        W(B(l, "ffn_down_exps.weight"), 3, k6_ff, 0, 1 / sqrt((double)ff), ff, d, e);
    }
    W("output_norm.weight", 1, QUANT_F32, 1, 0.05, d);
    W("output.weight", 2, k6_d, 0, 1 / sqrt((double)d), d, n_vocab);
#undef B
#undef W
    return n;
}

static int write_file(const struct gen_preset *p, enum quant_mix mix, uint64_t seed, uint32_t threads,
                      const char *vocab, const char *path, struct gen_stats *st)
{
    struct gen_config cfg = {.arch = "qwen3moe",
                             .preset = *p,
                             .mix = mix,
                             .seed = seed,
                             .n_threads = threads,
                             .vocab_path = vocab,
                             .out_path = path};
    return gen_file_write(&cfg, st);
}

static uint32_t kv_u32(const struct gguf_file *f, const char *key)
{
    uint32_t v = UINT32_MAX;
    CHECK(gguf_get_u32(f, key, &v) == 0, "%s: %s", key, err_msg());
    return v;
}

static bool kv_str_is(const struct gguf_file *f, const char *key, const char *want)
{
    struct gguf_str s;
    if (gguf_get_str(f, key, &s))
        return false;
    return s.len == strlen(want) && !memcmp(s.ptr, want, s.len);
}

/* A string array as NUL-terminated copies (one allocation each, freed by free_strs). */
static char **kv_strs(const struct gguf_file *f, const char *key, uint32_t *n)
{
    const struct gguf_value *v;
    *n = 0;
    if (gguf_get_arr(f, key, &v) || v->arr.elem_type != GGUF_TYPE_STRING)
        return NULL;
    char **s = calloc(v->arr.count, sizeof(char *));
    for (uint64_t i = 0; i < v->arr.count; i++)
        s[i] = strndup(v->arr.strs[i].ptr, v->arr.strs[i].len);
    *n = (uint32_t)v->arr.count;
    return s;
}

static void free_strs(char **s, uint32_t n)
{
    for (uint32_t i = 0; s && i < n; i++)
        free(s[i]);
    free(s);
}

static void check_metadata(const struct gguf_file *f, const struct gen_preset *p, enum quant_mix mix,
                           uint32_t n_vocab)
{
    float eps = 0, base = 0;

    CHECK(kv_str_is(f, "general.architecture", "qwen3moe"), "general.architecture");
    CHECK(gguf_find_kv(f, "general.name") != NULL, "general.name");
    CHECK(kv_u32(f, "general.file_type") == quant_mix_file_type(mix), "file_type");
    CHECK(kv_u32(f, "general.quantization_version") == 2, "quantization_version");
    CHECK(kv_u32(f, "qwen3moe.block_count") == p->n_layer, "block_count");
    CHECK(kv_u32(f, "qwen3moe.context_length") == p->n_ctx, "context_length");
    CHECK(kv_u32(f, "qwen3moe.embedding_length") == p->n_embd, "embedding_length");
    CHECK(kv_u32(f, "qwen3moe.feed_forward_length") == p->n_ff, "feed_forward_length");
    CHECK(kv_u32(f, "qwen3moe.expert_feed_forward_length") == p->n_ff_exp, "expert ff");
    CHECK(kv_u32(f, "qwen3moe.expert_count") == p->n_expert, "expert_count");
    CHECK(kv_u32(f, "qwen3moe.expert_used_count") == p->n_expert_used, "expert_used_count");
    CHECK(kv_u32(f, "qwen3moe.attention.head_count") == p->n_head, "head_count");
    CHECK(kv_u32(f, "qwen3moe.attention.head_count_kv") == p->n_head_kv, "head_count_kv");
    CHECK(kv_u32(f, "qwen3moe.attention.key_length") == p->head_dim, "key_length");
    CHECK(kv_u32(f, "qwen3moe.attention.value_length") == p->head_dim, "value_length");
    CHECK(gguf_get_f32(f, "qwen3moe.attention.layer_norm_rms_epsilon", &eps) == 0 &&
              eps == p->rms_eps,
          "rms eps %g", (double)eps);
    CHECK(gguf_get_f32(f, "qwen3moe.rope.freq_base", &base) == 0 && base == p->rope_base,
          "rope base %g", (double)base);
    CHECK(kv_str_is(f, "tokenizer.ggml.model", "gpt2"), "tokenizer.ggml.model");
    CHECK(kv_str_is(f, "tokenizer.ggml.pre", "qwen2"), "tokenizer.ggml.pre");
    struct gguf_str tmpl = {0};
    CHECK(gguf_get_str(f, "tokenizer.chat_template", &tmpl) == 0 &&
              memmem(tmpl.ptr, tmpl.len, "<|im_start|>", 12),
          "chat template");

    uint32_t n_tok, n_merges;
    char **tokens = kv_strs(f, "tokenizer.ggml.tokens", &n_tok);
    char **merges = kv_strs(f, "tokenizer.ggml.merges", &n_merges);
    const struct gguf_value *types;
    CHECK(tokens && n_tok == n_vocab, "tokens: %u, want %u", n_tok, n_vocab);
    CHECK(merges && n_merges > 0, "merges");
    CHECK(gguf_get_arr(f, "tokenizer.ggml.token_type", &types) == 0 &&
              types->arr.elem_type == GGUF_TYPE_INT32 && types->arr.count == n_vocab,
          "token_type");
    uint32_t bos = kv_u32(f, "tokenizer.ggml.bos_token_id");
    uint32_t eos = kv_u32(f, "tokenizer.ggml.eos_token_id");
    uint32_t pad = kv_u32(f, "tokenizer.ggml.padding_token_id");
    if (tokens && n_tok == n_vocab && bos < n_tok && eos < n_tok && pad < n_tok) {
        CHECK(!strcmp(tokens[bos], "<|endoftext|>") && !strcmp(tokens[eos], "<|im_end|>") &&
                  pad == bos,
              "bos '%s' eos '%s'", tokens[bos], tokens[eos]);
        int32_t eos_type;
        memcpy(&eos_type, (const char *)types->arr.data + 4 * eos, 4);
        CHECK(eos_type == GEN_TOKEN_CONTROL, "eos type %d", eos_type);
        check_vocab("file", tokens, n_tok, merges, n_merges);
    }
    free_strs(tokens, n_tok);
    free_strs(merges, n_merges);
}

/* Every tensor: name, type, shape, and dequantized moments. */
static void check_tensors(const struct gguf_file *f, const struct want_tensor *w, uint32_t n)
{
    CHECK(f->n_tensors == n, "%llu tensors, want %u", (unsigned long long)f->n_tensors, n);
    for (uint32_t i = 0; i < n; i++) {
        const struct gguf_tensor *t = gguf_find_tensor(f, w[i].name);
        CHECK(t != NULL, "missing %s", w[i].name);
        if (!t)
            continue;
        bool shape = t->n_dims == w[i].n_dims;
        for (uint32_t d = 0; d < w[i].n_dims; d++)
            shape &= t->ne[d] == w[i].ne[d];
        CHECK(shape, "%s: shape", w[i].name);
        CHECK(t->type == w[i].type, "%s: %s, want %s", w[i].name, quant_type_name(t->type),
              quant_type_name(w[i].type));
        if (!shape || t->type != w[i].type)
            continue;

        uint64_t ne = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        float *y = malloc(ne * sizeof(float));
        test_poison_f32(y, ne);
        CHECK(quant_ref_dequantize(t->type, t->data, y, (int64_t)ne) == 0, "%s: dequantize",
              w[i].name);
        double mean, sd;
        moments(y, ne, &mean, &sd);
        /* Statistical slack: 5 standard errors of the sample mean (std) plus 2% (8%) of std;
         * the 32-value q/k norms get almost no std check, the weights a tight one. */
        double tol_mean = 5 * w[i].std / sqrt((double)ne) + 0.02 * w[i].std;
        double tol_std = 5 / sqrt(2.0 * (double)ne) + 0.08;
        CHECK(all_finite(y, ne), "%s: non-finite value", w[i].name);
        CHECK(fabs(mean - w[i].mean) < tol_mean, "%s (%s): mean %g, want %g +- %g", w[i].name,
              quant_type_name(t->type), mean, w[i].mean, tol_mean);
        CHECK(fabs(sd / w[i].std - 1) < tol_std, "%s (%s): std %g, want %g +- %.0f%%", w[i].name,
              quant_type_name(t->type), sd, w[i].std, 100 * tol_std);
        if (strstr(w[i].name, "blk.0.ffn_") && strstr(w[i].name, "_exps"))
            printf("  %-26s %-5s fan-in %4llu: mean %+.4f std, std %.4f of 1/sqrt(fan-in)\n",
                   w[i].name, quant_type_name(t->type), (unsigned long long)t->ne[0],
                   mean / w[i].std, sd / w[i].std);
        free(y);
    }
}

static bool files_equal(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        same = ca == cb;
        if (ca == EOF)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

static uint64_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

static void check_file(const char *path, const struct gen_preset *p, enum quant_mix mix,
                       uint32_t n_vocab)
{
    struct gguf_file *f = NULL;
    struct want_tensor *w = calloc((size_t)p->n_layer * 12 + 3, sizeof(*w));
    uint32_t n = want_tensors(p, mix, n_vocab, w);

    CHECK(gguf_open(path, &f) == 0, "gguf_open %s: %s", path, err_msg());
    if (f) {
        check_metadata(f, p, mix, n_vocab);
        check_tensors(f, w, n);
        gguf_close(f);
    }
    free(w);
}

static uint32_t count_dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    uint32_t n = 0;
    while (d && (e = readdir(d)))
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

static void test_files(uint64_t seed)
{
    const struct gen_preset *tiny = gen_preset_find("tiny");
    char path[128], path2[128];
    struct gen_stats st;

    snprintf(path, sizeof(path), "%s/tiny-bf16.gguf", tmpdir);
    CHECK(write_file(tiny, QUANT_MIX_BF16, seed, 2, NULL, path, &st) == -EINVAL &&
              access(path, F_OK) != 0,
          "gen accepted the bf16 mix, which it cannot draw");
    for (int m = 0; m < QUANT_MIX_COUNT; m++) {
        if (m == QUANT_MIX_BF16)
            continue; /* refused above */
        snprintf(path, sizeof(path), "%s/tiny-%s.gguf", tmpdir, quant_mix_name(m));
        CHECK(write_file(tiny, m, seed, 2, NULL, path, &st) == 0, "write %s: %s", path, err_msg());
        uint64_t size = file_size(path);
        printf("tiny %-6s: %llu bytes, %llu tensors, %llu fallback\n", quant_mix_name(m),
               (unsigned long long)size, (unsigned long long)st.n_tensors,
               (unsigned long long)st.n_fallback);
        CHECK(size > 0 && size < 10u * 1000 * 1000, "%s: %llu bytes", path,
              (unsigned long long)size);
        /* ffn_down_exps rows are 128 long in tiny: Q6_K falls back to Q8_0 in both layers. */
        CHECK(st.n_fallback == (m == QUANT_MIX_Q4_K_M ? 2u : 0u), "%llu fallbacks",
              (unsigned long long)st.n_fallback);
        check_file(path, tiny, m, tiny->n_vocab);
    }

    /* Same seed, other thread counts: identical bytes; another seed: other bytes. */
    snprintf(path, sizeof(path), "%s/tiny-q4_k_m.gguf", tmpdir);
    tmp_path(path2, sizeof(path2), "tiny-again.gguf");
    CHECK(write_file(tiny, QUANT_MIX_Q4_K_M, seed, 1, NULL, path2, NULL) == 0, "%s", err_msg());
    CHECK(files_equal(path, path2), "same seed, 1 vs 2 threads: files differ");
    CHECK(write_file(tiny, QUANT_MIX_Q4_K_M, seed, 5, NULL, path2, NULL) == 0, "%s", err_msg());
    CHECK(files_equal(path, path2), "same seed, 2 vs 5 threads: files differ");
    CHECK(write_file(tiny, QUANT_MIX_Q4_K_M, seed + 1, 2, NULL, path2, NULL) == 0, "%s", err_msg());
    CHECK(!files_equal(path, path2), "seeds %llu and %llu gave the same file",
          (unsigned long long)seed, (unsigned long long)seed + 1);

    /* Rows of 256 everywhere: the expert down projection keeps Q6_K. */
    struct gen_preset wide = *tiny;
    wide.n_layer = 1;
    wide.n_ff_exp = 256;
    tmp_path(path2, sizeof(path2), "wide.gguf");
    CHECK(write_file(&wide, QUANT_MIX_Q4_K_M, seed, 2, NULL, path2, &st) == 0, "%s", err_msg());
    CHECK(st.n_fallback == 0, "wide: %llu fallbacks", (unsigned long long)st.n_fallback);
    check_file(path2, &wide, QUANT_MIX_Q4_K_M, wide.n_vocab);

    /* A real-style tokenizer.json: its tokens, padded to the preset's vocabulary. */
    char tok[128];
    write_tokenizer_json(tmp_path(tok, sizeof(tok), "tokenizer.json"), 262);
    CHECK(write_file(&wide, QUANT_MIX_Q8_0, seed, 2, tok, path2, &st) == 0, "%s", err_msg());
    CHECK(st.n_vocab == wide.n_vocab, "vocab %u", st.n_vocab);
    check_file(path2, &wide, QUANT_MIX_Q8_0, wide.n_vocab);
    write_tokenizer_json(tok, 1500);
    CHECK(write_file(&wide, QUANT_MIX_Q8_0, seed, 2, tok, path2, &st) == 0, "%s", err_msg());
    CHECK(st.n_vocab == 1501, "grown vocab %u", st.n_vocab);
    check_file(path2, &wide, QUANT_MIX_Q8_0, 1501);
    unlink(tok);
    unlink(path2);
    unlink(tmp_path(path2, sizeof(path2), "tiny-again.gguf"));
    for (int m = 0; m < QUANT_MIX_COUNT; m++) {
        if (m == QUANT_MIX_BF16)
            continue; /* gen does not draw bf16 (refused: checked in check_errors) */
        snprintf(path, sizeof(path), "%s/tiny-%s.gguf", tmpdir, quant_mix_name(m));
        unlink(path);
    }

    /* Failures leave nothing behind. */
    CHECK(count_dir_entries(tmpdir) == 0, "leftover files in %s", tmpdir);
    volatile sig_atomic_t cancel = 1;
    struct gen_config cfg = {.arch = "qwen3moe",
                             .preset = *tiny,
                             .mix = QUANT_MIX_Q8_0,
                             .seed = seed,
                             .n_threads = 2,
                             .out_path = path,
                             .cancel = &cancel};
    CHECK(gen_file_write(&cfg, NULL) == -EINTR, "cancelled write: %s", err_msg());
    CHECK(count_dir_entries(tmpdir) == 0, "cancelled write left a file in %s", tmpdir);
    cfg.cancel = NULL;
    cfg.arch = "llama";
    CHECK(gen_file_write(&cfg, NULL) == -EINVAL && strstr(err_msg(), "llama"), "unknown arch: %s",
          err_msg());
    cfg.arch = "qwen3moe";
    cfg.vocab_path = "/nonexistent/tokenizer.json";
    CHECK(gen_file_write(&cfg, NULL) == -EINVAL && strstr(err_msg(), "/nonexistent"),
          "missing vocab: %s", err_msg());
    cfg.vocab_path = NULL;
    snprintf(path, sizeof(path), "%s/no/such/dir.gguf", tmpdir);
    CHECK(gen_file_write(&cfg, NULL) < 0 && strstr(err_msg(), "no/such"), "bad path: %s",
          err_msg());
    cfg.out_path = NULL;
    CHECK(gen_file_write(&cfg, NULL) == -EINVAL, "no output path");
    cfg.out_path = path;
    cfg.preset.n_expert_used = cfg.preset.n_expert + 1;
    CHECK(gen_file_write(&cfg, NULL) == -EINVAL, "top-%u of %u experts accepted",
          cfg.preset.n_expert_used, cfg.preset.n_expert);
    CHECK(count_dir_entries(tmpdir) == 0, "failed writes left files in %s", tmpdir);
}

/* ---- hybrid architectures (qwen3next, qwen35moe) ----------------------------------------- */

/* The tensor list of a qwen3next / qwen35moe file, from the contract (not from gen.c). */
static uint32_t want_hybrid(const char *arch, const struct gen_preset *p, enum quant_mix mix,
                            uint32_t n_vocab, struct want_tensor *w)
{
    uint64_t d = p->n_embd, hd = p->head_dim, nh = p->n_head, nkv = p->n_head_kv;
    uint64_t e = p->n_expert, f = p->n_ff_exp, fs = p->n_ff_shexp, ds = p->ssm_d_state;
    uint64_t nk = p->ssm_n_group, nv = p->ssm_dt_rank, kc = p->ssm_d_conv;
    uint64_t K = nk * ds, V = nv * ds, C = 2 * K + V;
    bool kq = mix == QUANT_MIX_Q4_K_M;
    uint32_t big = mix == QUANT_MIX_F32 ? QUANT_F32 : QUANT_Q8_0, f32 = QUANT_F32;
    uint32_t n = 0;
    char nm[64];

#define W(tn, nd, ty, m, s, ...)                                                                   \
    do {                                                                                           \
        w[n] = (struct want_tensor){                                                               \
            .n_dims = nd, .ne = {__VA_ARGS__}, .type = ty, .mean = m, .std = s};                   \
        snprintf(w[n].name, sizeof(w[n].name), "%s", tn);                                          \
        n++;                                                                                       \
    } while (0)
#define B(l, s) (snprintf(nm, sizeof(nm), "blk.%u.%s", l, s), nm)
#define FAN(x) (1 / sqrt((double)(x)))
    /* q4_k_m: K-quants where rows are a multiple of 256, else Q8_0; attention, GDN and shared
     * expert matrices Q8_0 (rows are multiples of 32 in every preset tested). */
    uint32_t k4_d = kq && d % 256 == 0 ? QUANT_Q4_K : big;
    uint32_t k6_d = kq && d % 256 == 0 ? QUANT_Q6_K : big;
    uint32_t k6_f = kq && f % 256 == 0 ? QUANT_Q6_K : big;

    W("token_embd.weight", 2, k4_d, 0, 1, d, n_vocab);
    for (uint32_t l = 0; l < p->n_layer; l++) {
        W(B(l, "attn_norm.weight"), 1, f32, 1, 0.05, d);
        if ((l + 1) % p->full_attn_interval == 0) {
            W(B(l, "attn_q.weight"), 2, big, 0, FAN(d), d, nh * hd * 2);
            W(B(l, "attn_k.weight"), 2, big, 0, FAN(d), d, nkv * hd);
            W(B(l, "attn_v.weight"), 2, big, 0, FAN(d), d, nkv * hd);
            W(B(l, "attn_output.weight"), 2, big, 0, FAN(nh * hd), nh * hd, d);
            W(B(l, "attn_q_norm.weight"), 1, f32, 1, 0.05, hd);
            W(B(l, "attn_k_norm.weight"), 1, f32, 1, 0.05, hd);
        } else {
            W(B(l, "attn_qkv.weight"), 2, big, 0, FAN(d), d, C);
            W(B(l, "attn_gate.weight"), 2, big, 0, FAN(d), d, V);
            if (!strcmp(arch, "qwen3next")) {
                W(B(l, "ssm_ba.weight"), 2, big, 0, FAN(d), d, 2 * nv);
            } else {
                W(B(l, "ssm_beta.weight"), 2, big, 0, FAN(d), d, nv);
                W(B(l, "ssm_alpha.weight"), 2, big, 0, FAN(d), d, nv);
            }
            W(B(l, "ssm_conv1d.weight"), 2, f32, 0, FAN(kc), kc, C);
            W(B(l, "ssm_dt.bias"), 1, f32, 1, 0.05, nv);
            W(B(l, "ssm_a"), 1, f32, -4, 0.5, nv);
            W(B(l, "ssm_norm.weight"), 1, f32, 1, 0.05, ds);
            W(B(l, "ssm_out.weight"), 2, big, 0, FAN(V), V, d);
        }
        W(B(l, "post_attention_norm.weight"), 1, f32, 1, 0.05, d);
        W(B(l, "ffn_gate_inp.weight"), 2, f32, 0, FAN(d), d, e);
        W(B(l, "ffn_gate_exps.weight"), 3, k4_d, 0, FAN(d), d, f, e);
        W(B(l, "ffn_up_exps.weight"), 3, k4_d, 0, FAN(d), d, f, e);
        W(B(l, "ffn_down_exps.weight"), 3, k6_f, 0, FAN(f), f, d, e);
        W(B(l, "ffn_gate_inp_shexp.weight"), 1, f32, 0, FAN(d), d);
        W(B(l, "ffn_gate_shexp.weight"), 2, big, 0, FAN(d), d, fs);
        W(B(l, "ffn_up_shexp.weight"), 2, big, 0, FAN(d), d, fs);
        W(B(l, "ffn_down_shexp.weight"), 2, big, 0, FAN(fs), fs, d);
    }
    W("output_norm.weight", 1, f32, 1, 0.05, d);
    W("output.weight", 2, k6_d, 0, FAN(d), d, n_vocab);
#undef FAN
#undef B
#undef W
    return n;
}

static int write_hybrid(const char *arch, const struct gen_preset *p, enum quant_mix mix,
                        uint64_t seed, uint32_t threads, const char *path, struct gen_stats *st)
{
    struct gen_config cfg = {.arch = arch,
                             .preset = *p,
                             .mix = mix,
                             .seed = seed,
                             .n_threads = threads,
                             .out_path = path};
    return gen_file_write(&cfg, st);
}

/* The keys of the contract: every required one with the preset's value, the optional ones gen
 * writes, no feed_forward_length, and qwen35moe's rope.dimension_sections (want_sec). */
static void check_hybrid_metadata(const struct gguf_file *f, const char *arch,
                                  const struct gen_preset *p, enum quant_mix mix,
                                  const int32_t *want_sec)
{
    static const char *const u32_keys[] = {
        "block_count",
        "context_length",
        "embedding_length",
        "attention.head_count",
        "attention.head_count_kv",
        "attention.key_length",
        "attention.value_length",
        "expert_count",
        "expert_used_count",
        "expert_feed_forward_length",
        "expert_shared_feed_forward_length",
        "ssm.conv_kernel",
        "ssm.state_size",
        "ssm.group_count",
        "ssm.time_step_rank",
        "ssm.inner_size",
        "rope.dimension_count",
        "full_attention_interval",
    };
    const uint32_t want[] = {
        p->n_layer,       p->n_ctx,
        p->n_embd,        p->n_head,
        p->n_head_kv,     p->head_dim,
        p->head_dim,      p->n_expert,
        p->n_expert_used, p->n_ff_exp,
        p->n_ff_shexp,    p->ssm_d_conv,
        p->ssm_d_state,   p->ssm_n_group,
        p->ssm_dt_rank,   p->ssm_dt_rank * p->ssm_d_state,
        p->n_rot,         p->full_attn_interval,
    };
    char key[128];
    float eps = 0, base = 0;

    CHECK(kv_str_is(f, "general.architecture", arch), "%s: general.architecture", arch);
    CHECK(kv_u32(f, "general.file_type") == quant_mix_file_type(mix), "%s: file_type", arch);
    for (size_t i = 0; i < sizeof(u32_keys) / sizeof(u32_keys[0]); i++) {
        snprintf(key, sizeof(key), "%s.%s", arch, u32_keys[i]);
        uint32_t v = kv_u32(f, key);
        CHECK(v == want[i], "%s: %u, want %u", key, v, want[i]);
    }
    snprintf(key, sizeof(key), "%s.attention.layer_norm_rms_epsilon", arch);
    CHECK(gguf_get_f32(f, key, &eps) == 0 && eps == p->rms_eps, "%s %g", key, (double)eps);
    snprintf(key, sizeof(key), "%s.rope.freq_base", arch);
    CHECK(gguf_get_f32(f, key, &base) == 0 && base == p->rope_base, "%s %g", key, (double)base);
    snprintf(key, sizeof(key), "%s.feed_forward_length", arch);
    CHECK(gguf_find_kv(f, key) == NULL, "%s written", key);
    snprintf(key, sizeof(key), "%s.nextn_predict_layers", arch);
    CHECK(gguf_find_kv(f, key) == NULL, "%s written (no MTP blocks)", key);
    CHECK(kv_str_is(f, "tokenizer.ggml.pre", "qwen2"), "%s: tokenizer.ggml.pre", arch);

    snprintf(key, sizeof(key), "%s.rope.dimension_sections", arch);
    const struct gguf_value *sec = NULL;
    if (!want_sec) {
        CHECK(gguf_find_kv(f, key) == NULL, "%s written", key);
        return;
    }
    CHECK(gguf_get_arr(f, key, &sec) == 0 && sec->arr.elem_type == GGUF_TYPE_INT32 &&
              sec->arr.count == 4,
          "%s: %s", key, err_msg());
    if (!sec || sec->arr.elem_type != GGUF_TYPE_INT32 || sec->arr.count != 4)
        return;
    int32_t s[4], sum = 0;
    memcpy(s, sec->arr.data, sizeof(s));
    for (int i = 0; i < 4; i++)
        sum += s[i];
    CHECK(!memcmp(s, want_sec, sizeof(s)), "%s: [%d, %d, %d, %d], want [%d, %d, %d, %d]", key, s[0],
          s[1], s[2], s[3], want_sec[0], want_sec[1], want_sec[2], want_sec[3]);
    CHECK(2 * sum == (int32_t)p->n_rot, "%s: 2 * sum %d != n_rot %u", key, 2 * sum, p->n_rot);
}

/* Every value of every blk.N.ssm_a is < 0; returns how many tensors were checked. */
static uint32_t check_ssm_a_negative(const struct gguf_file *f, const struct gen_preset *p)
{
    uint32_t n = 0;
    for (uint32_t l = 0; l < p->n_layer; l++) {
        char nm[64];
        snprintf(nm, sizeof(nm), "blk.%u.ssm_a", l);
        const struct gguf_tensor *t = gguf_find_tensor(f, nm);
        if (!t || t->type != QUANT_F32)
            continue;
        const float *a = t->data;
        for (uint64_t i = 0; i < t->ne[0]; i++)
            CHECK(a[i] < 0.0f, "%s[%llu] = %g is not negative", nm, (unsigned long long)i,
                  (double)a[i]);
        n++;
    }
    return n;
}

static void check_hybrid_file(const char *path, const char *arch, const struct gen_preset *p,
                              enum quant_mix mix, const int32_t *want_sec)
{
    struct gguf_file *f = NULL;
    struct want_tensor *w = calloc((size_t)p->n_layer * 19 + 3, sizeof(*w));
    uint32_t n = want_hybrid(arch, p, mix, p->n_vocab, w), n_gdn = 0;

    for (uint32_t l = 0; l < p->n_layer; l++)
        n_gdn += (l + 1) % p->full_attn_interval != 0;
    CHECK(gguf_open(path, &f) == 0, "gguf_open %s: %s", path, err_msg());
    if (f) {
        check_hybrid_metadata(f, arch, p, mix, want_sec);
        check_tensors(f, w, n);
        CHECK(check_ssm_a_negative(f, p) == n_gdn, "%s: ssm_a of %u GDN layers", path, n_gdn);
        gguf_close(f);
    }
    free(w);
}

static void test_hybrid(uint64_t seed)
{
    static const char *const archs[] = {"qwen3next", "qwen35moe"};
    static const int32_t sec_tiny[4] = {3, 3, 2, 0}, sec_real[4] = {11, 11, 10, 0};
    char path[128], path2[128];
    struct gen_stats st;

    const struct gen_preset *p = gen_preset_find_arch("qwen3next", "80b-a3b");
    CHECK(p && p->n_layer == 48 && p->n_embd == 2048 && p->n_head == 16 && p->n_head_kv == 2 &&
              p->head_dim == 256 && p->n_rot == 64 && p->n_expert == 512 &&
              p->n_expert_used == 10 && p->n_ff_exp == 512 && p->n_ff_shexp == 512 &&
              p->n_vocab == 151936 && p->rope_base == 1e7f && p->ssm_d_conv == 4 &&
              p->ssm_d_state == 128 && p->ssm_n_group == 16 && p->ssm_dt_rank == 32 &&
              p->full_attn_interval == 4 && p->n_ctx == 262144,
          "qwen3next 80b-a3b preset");
    p = gen_preset_find_arch("qwen35moe", "35b-a3b");
    CHECK(p && p->n_layer == 40 && p->n_embd == 2048 && p->n_head == 16 && p->n_head_kv == 2 &&
              p->head_dim == 256 && p->n_rot == 64 && p->n_expert == 256 && p->n_expert_used == 8 &&
              p->n_ff_exp == 512 && p->n_ff_shexp == 512 && p->n_vocab == 248320 &&
              p->ssm_n_group == 16 && p->ssm_dt_rank == 32 && p->ssm_d_state == 128 &&
              p->full_attn_interval == 4,
          "qwen35moe 35b-a3b preset");

    for (size_t a = 0; a < 2; a++) {
        const char *arch = archs[a];
        const int32_t *sec = a == 1 ? sec_tiny : NULL;
        const struct gen_preset *tiny = gen_preset_find_arch(arch, "tiny");
        CHECK(tiny != NULL, "%s tiny preset", arch);
        if (!tiny)
            continue;
        CHECK(tiny->ssm_dt_rank == 2 * tiny->ssm_n_group && tiny->full_attn_interval == 2 &&
                  tiny->n_layer == 4,
              "%s tiny: r = %u, interval %u", arch, tiny->ssm_dt_rank / tiny->ssm_n_group,
              tiny->full_attn_interval);
        for (int m = 0; m < QUANT_MIX_COUNT; m++) {
            if (m == QUANT_MIX_BF16)
                continue;
            struct gen_preset ps = *tiny;
            if (m == QUANT_MIX_F32)
                ps.n_layer = 2; /* one GDN and one full-attention layer, a smaller file */
            snprintf(path, sizeof(path), "%s/%s-tiny-%s.gguf", tmpdir, arch, quant_mix_name(m));
            CHECK(write_hybrid(arch, &ps, m, seed, 2, path, &st) == 0, "write %s: %s", path,
                  err_msg());
            printf("%s tiny %-6s: %llu bytes, %llu tensors, %llu fallback\n", arch,
                   quant_mix_name(m), (unsigned long long)file_size(path),
                   (unsigned long long)st.n_tensors, (unsigned long long)st.n_fallback);
            CHECK(st.n_fallback == 0, "%s %s: %llu fallbacks", arch, quant_mix_name(m),
                  (unsigned long long)st.n_fallback);
            check_hybrid_file(path, arch, &ps, m, sec);
            if (m == QUANT_MIX_Q4_K_M) {
                tmp_path(path2, sizeof(path2), "hybrid-again.gguf");
                CHECK(write_hybrid(arch, &ps, m, seed, 1, path2, NULL) == 0, "%s", err_msg());
                CHECK(files_equal(path, path2), "%s: same seed, 1 vs 2 threads: files differ",
                      arch);
                unlink(path2);
            }
            unlink(path);
        }

        /* The real head size (256, 64 rotated): qwen35moe's sections are Qwen3.5's. */
        struct gen_preset real = *tiny;
        real.n_layer = 2;
        real.head_dim = 256;
        real.n_rot = 64;
        real.ssm_d_state = 128;
        tmp_path(path, sizeof(path), "hybrid-real.gguf");
        CHECK(write_hybrid(arch, &real, QUANT_MIX_Q8_0, seed, 2, path, NULL) == 0, "%s", err_msg());
        check_hybrid_file(path, arch, &real, QUANT_MIX_Q8_0, a == 1 ? sec_real : NULL);
        unlink(path);

        /* Refused: v heads not a multiple of q/k heads, odd or too many rotated dims, no
         * interval, another architecture's preset. */
        struct gen_preset bad = *tiny;
        bad.ssm_dt_rank = 3;
        CHECK(write_hybrid(arch, &bad, QUANT_MIX_Q8_0, seed, 2, path, NULL) == -EINVAL &&
                  strstr(err_msg(), "v heads"),
              "%s: 3 v heads over 2 groups: %s", arch, err_msg());
        bad = *tiny;
        bad.n_rot = 15;
        CHECK(write_hybrid(arch, &bad, QUANT_MIX_Q8_0, seed, 2, path, NULL) == -EINVAL,
              "%s: odd n_rot accepted", arch);
        bad.n_rot = bad.head_dim + 2;
        CHECK(write_hybrid(arch, &bad, QUANT_MIX_Q8_0, seed, 2, path, NULL) == -EINVAL,
              "%s: n_rot > head_dim accepted", arch);
        bad = *tiny;
        bad.full_attn_interval = 0;
        CHECK(write_hybrid(arch, &bad, QUANT_MIX_Q8_0, seed, 2, path, NULL) == -EINVAL,
              "%s: interval 0 accepted", arch);
        CHECK(write_hybrid(archs[1 - a], tiny, QUANT_MIX_Q8_0, seed, 2, path, NULL) == -EINVAL &&
                  strstr(err_msg(), arch),
              "%s preset written as %s: %s", arch, archs[1 - a], err_msg());
    }
    CHECK(count_dir_entries(tmpdir) == 0, "hybrid tests left files in %s", tmpdir);
}

int main(void)
{
    uint64_t seed = test_seed("test_gen");

    snprintf(tmpdir, sizeof(tmpdir), "/tmp/strata-test-gen.XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_draw(seed);
    test_mixes();
    test_vocab();
    test_files(seed);
    test_hybrid(seed);
    char path[128];
    unlink(tmp_path(path, sizeof(path), "tokenizer.json"));
    rmdir(tmpdir);
    return test_finish("test_gen");
}
