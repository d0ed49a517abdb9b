/* gen vocab: byte-level BPE vocabularies for generated files.
 *
 * The synthetic vocabulary is learned here by plain BPE over gen_corpus_text(): the text is
 * split into pieces by an ASCII version of the qwen2 pre-tokenizer rule (docs/formats.md §5), each
 * piece starts as its bytes, and the most frequent adjacent pair (ties: smallest left id, then
 * smallest right id) is merged until the vocabulary is full or every piece is one token. Token
 * text is written in the GPT-2 byte-to-unicode map, so any GGUF reader that handles Qwen's
 * `gpt2` tokenizer model reads it. Real vocabularies come from a tokenizer.json (json-c).
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "errors.h"
#include "gen.h"

#define N_BYTE_TOKENS 256
#define N_SPECIAL 3

static const char *const special_names[N_SPECIAL] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

int gen_byte_to_utf8(uint8_t b, char out[3])
{
    uint32_t cp;

    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) {
        cp = b;
    } else { /* the 68 other bytes, in byte order, from U+0100 */
        uint32_t k = 0;
        for (uint32_t c = 0; c < b; c++) {
            if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE))
                k++;
        }
        cp = 0x100 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    out[2] = 0;
    return 2;
}

/* Token text of a byte string: each byte through the byte map (at most 2 UTF-8 bytes each). */
static char *bytes_to_text(const uint8_t *p, size_t n)
{
    char *s = malloc(2 * n + 1), *q = s;
    if (!s)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        char u[3];
        int len = gen_byte_to_utf8(p[i], u);
        memcpy(q, u, (size_t)len);
        q += len;
    }
    *q = 0;
    return s;
}

/* ---- pre-tokenization --------------------------------------------------------------------- */

static bool is_letter(uint8_t c)
{
    return isalpha(c) || c >= 0x80;
}

static bool is_space(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static bool is_newline(uint8_t c)
{
    return c == '\n' || c == '\r';
}

/* Length of the contraction ('s 't 're 've 'm 'll 'd, any case) at p, or 0. */
static size_t contraction_len(const uint8_t *p, size_t n)
{
    static const char *const suffixes[] = {"s", "t", "re", "ve", "m", "ll", "d"};

    if (n < 2 || p[0] != '\'')
        return 0;
    for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
        size_t len = strlen(suffixes[i]);
        if (len + 1 <= n && !strncasecmp((const char *)p + 1, suffixes[i], len))
            return len + 1;
    }
    return 0;
}

/* Length of the next piece at p (n > 0 bytes left): the qwen2 alternatives in order, with ASCII
 * classes (bytes >= 0x80 count as letters). */
static size_t piece_len(const uint8_t *p, size_t n)
{
    size_t i, len = contraction_len(p, n);

    if (len)
        return len;
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    i = (!is_letter(p[0]) && !isdigit(p[0]) && !is_newline(p[0]) && n > 1 && is_letter(p[1])) ? 1
                                                                                              : 0;
    if (is_letter(p[i])) {
        while (i < n && is_letter(p[i]))
            i++;
        return i;
    }
    if (isdigit(p[0])) /* \p{N}: one digit */
        return 1;
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    i = (p[0] == ' ' && n > 1) ? 1 : 0;
    if (!is_space(p[i]) && !is_letter(p[i]) && !isdigit(p[i])) {
        while (i < n && !is_space(p[i]) && !is_letter(p[i]) && !isdigit(p[i]))
            i++;
        while (i < n && is_newline(p[i]))
            i++;
        return i;
    }
    /* whitespace: \s*[\r\n]+ (up to the run's last newline), \s+(?!\S), \s+ */
    size_t end = 0, last_nl = 0;
    while (end < n && is_space(p[end])) {
        if (is_newline(p[end]))
            last_nl = end + 1;
        end++;
    }
    if (last_nl)
        return last_nl;
    if (end < n && end > 1)
        return end - 1; /* leave one space to start the next word */
    return end;
}

/* ---- BPE training ------------------------------------------------------------------------- */

struct word {
    int32_t *ids; /* (len) token ids, view into the training arena */
    uint32_t len;
    uint32_t freq;
};

struct bpe {
    struct word *words; /* (n_words) unique pieces */
    uint32_t n_words;
    int32_t *arena;    /* all words' ids, owned */
    uint8_t **tok;     /* (n_tok) token bytes, owned */
    uint32_t *tok_len; /* (n_tok) */
    uint32_t n_tok, cap_tok;
    uint32_t (*merges)[2]; /* (n_merges) left, right ids */
    uint32_t n_merges, cap_merges;
};

static uint64_t hash_bytes(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Splits the corpus into unique pieces with their counts. */
static int bpe_words_init(struct bpe *b, const uint8_t *text, size_t n)
{
    size_t cap = 4096, mask = cap - 1; /* hash table of piece starts; corpus pieces < cap/2 */
    struct {
        size_t off, len;
        uint32_t freq;
        bool used;
    } *tab = calloc(cap, sizeof(*tab));
    size_t n_unique = 0, n_sym = 0;

    if (!tab)
        return err_set(-ENOMEM, "gen vocab: out of memory");
    for (size_t i = 0; i < n;) {
        size_t len = piece_len(text + i, n - i);
        size_t h = hash_bytes(text + i, len) & mask;
        while (tab[h].used && (tab[h].len != len || memcmp(text + tab[h].off, text + i, len)))
            h = (h + 1) & mask;
        if (!tab[h].used) {
            if (++n_unique > cap / 2) {
                free(tab);
                return err_set(-E2BIG, "gen vocab: corpus has too many distinct pieces");
            }
            tab[h].used = true;
            tab[h].off = i;
            tab[h].len = len;
            n_sym += len;
        }
        tab[h].freq++;
        i += len;
    }
    b->words = calloc(n_unique, sizeof(*b->words));
    b->arena = malloc(n_sym * sizeof(*b->arena));
    if (!b->words || !b->arena) {
        free(tab);
        return err_set(-ENOMEM, "gen vocab: out of memory");
    }
    /* Order of words does not change the result: pair counts are sums and ties break by id. */
    int32_t *a = b->arena;
    for (size_t h = 0; h < cap; h++) {
        if (!tab[h].used)
            continue;
        struct word *w = &b->words[b->n_words++];
        w->ids = a;
        w->len = (uint32_t)tab[h].len;
        w->freq = tab[h].freq;
        for (size_t k = 0; k < tab[h].len; k++)
            *a++ = text[tab[h].off + k];
    }
    free(tab);
    return 0;
}

static int bpe_add_token(struct bpe *b, uint8_t *bytes, uint32_t len)
{
    if (b->n_tok == b->cap_tok) {
        uint32_t cap = b->cap_tok ? 2 * b->cap_tok : 1024;
        uint8_t **tok = realloc(b->tok, cap * sizeof(*tok));
        if (tok)
            b->tok = tok;
        uint32_t *tl = tok ? realloc(b->tok_len, cap * sizeof(*tl)) : NULL;
        if (!tl) {
            free(bytes);
            return err_set(-ENOMEM, "gen vocab: out of memory");
        }
        b->tok_len = tl;
        b->cap_tok = cap;
    }
    b->tok[b->n_tok] = bytes;
    b->tok_len[b->n_tok] = len;
    b->n_tok++;
    return 0;
}

static int bpe_add_merge(struct bpe *b, uint32_t left, uint32_t right)
{
    if (b->n_merges == b->cap_merges) {
        uint32_t cap = b->cap_merges ? 2 * b->cap_merges : 1024;
        void *m = realloc(b->merges, cap * sizeof(*b->merges));
        if (!m)
            return err_set(-ENOMEM, "gen vocab: out of memory");
        b->merges = m;
        b->cap_merges = cap;
    }
    b->merges[b->n_merges][0] = left;
    b->merges[b->n_merges][1] = right;
    b->n_merges++;
    return 0;
}

/* Id of the token with these bytes, or -1 (linear: the learned vocabulary is small). */
static int64_t bpe_find(const struct bpe *b, const uint8_t *p, uint32_t len)
{
    for (uint32_t t = 0; t < b->n_tok; t++) {
        if (b->tok_len[t] == len && !memcmp(b->tok[t], p, len))
            return t;
    }
    return -1;
}

struct pair_count {
    uint64_t key; /* left << 32 | right, or UINT64_MAX when empty */
    uint64_t count;
};

/* The most frequent adjacent pair over all words (ties: smallest key); false if none. */
static bool bpe_best_pair(const struct bpe *b, struct pair_count *tab, size_t cap, uint64_t *best)
{
    size_t mask = cap - 1;
    struct pair_count top = {UINT64_MAX, 0};

    for (size_t i = 0; i < cap; i++)
        tab[i].key = UINT64_MAX;
    for (uint32_t w = 0; w < b->n_words; w++) {
        const struct word *wd = &b->words[w];
        for (uint32_t i = 0; i + 1 < wd->len; i++) {
            uint64_t key = (uint64_t)(uint32_t)wd->ids[i] << 32 | (uint32_t)wd->ids[i + 1];
            size_t h = (size_t)((key * 0x9e3779b97f4a7c15ull) >> 40) & mask;
            while (tab[h].key != UINT64_MAX && tab[h].key != key)
                h = (h + 1) & mask;
            if (tab[h].key == UINT64_MAX) {
                tab[h].key = key;
                tab[h].count = 0;
            }
            tab[h].count += wd->freq;
        }
    }
    for (size_t i = 0; i < cap; i++) {
        if (tab[i].key == UINT64_MAX)
            continue;
        if (tab[i].count > top.count || (tab[i].count == top.count && tab[i].key < top.key))
            top = tab[i];
    }
    *best = top.key;
    return top.count > 0;
}

static void bpe_apply(struct bpe *b, int32_t left, int32_t right, int32_t merged)
{
    for (uint32_t w = 0; w < b->n_words; w++) {
        struct word *wd = &b->words[w];
        uint32_t o = 0;
        for (uint32_t i = 0; i < wd->len; i++) {
            if (i + 1 < wd->len && wd->ids[i] == left && wd->ids[i + 1] == right) {
                wd->ids[o++] = merged;
                i++;
            } else {
                wd->ids[o++] = wd->ids[i];
            }
        }
        wd->len = o;
    }
}

static void bpe_free(struct bpe *b)
{
    for (uint32_t t = 0; t < b->n_tok; t++)
        free(b->tok[t]);
    free(b->tok);
    free(b->tok_len);
    free(b->merges);
    free(b->words);
    free(b->arena);
}

/* Learns merges until there are max_tokens tokens or no pair is left. */
static int bpe_train(struct bpe *b, uint32_t max_tokens)
{
    const char *text = gen_corpus_text();
    size_t cap = 1;
    int rc;

    for (int c = 0; c < N_BYTE_TOKENS; c++) {
        uint8_t *p = malloc(1);
        if (!p)
            return err_set(-ENOMEM, "gen vocab: out of memory");
        p[0] = (uint8_t)c;
        if ((rc = bpe_add_token(b, p, 1)))
            return rc;
    }
    rc = bpe_words_init(b, (const uint8_t *)text, strlen(text));
    if (rc)
        return rc;
    while (cap < 2 * strlen(text))
        cap <<= 1;
    struct pair_count *tab = malloc(cap * sizeof(*tab));
    if (!tab)
        return err_set(-ENOMEM, "gen vocab: out of memory");

    uint64_t key;
    while (b->n_tok < max_tokens && bpe_best_pair(b, tab, cap, &key)) {
        uint32_t l = (uint32_t)(key >> 32), r = (uint32_t)key;
        uint32_t len = b->tok_len[l] + b->tok_len[r];
        uint8_t *p = malloc(len);
        if (!p) {
            rc = err_set(-ENOMEM, "gen vocab: out of memory");
            break;
        }
        memcpy(p, b->tok[l], b->tok_len[l]);
        memcpy(p + b->tok_len[l], b->tok[r], b->tok_len[r]);
        /* Two merge paths can spell the same bytes ("a bc", "ab c"): reuse the token. */
        int64_t id = bpe_find(b, p, len);
        if (id < 0) {
            id = b->n_tok;
            if ((rc = bpe_add_token(b, p, len)))
                break;
        } else {
            free(p);
        }
        if ((rc = bpe_add_merge(b, l, r)))
            break;
        bpe_apply(b, (int32_t)l, (int32_t)r, (int32_t)id);
    }
    free(tab);
    return rc;
}

/* ---- the vocabulary ----------------------------------------------------------------------- */

static int vocab_alloc(struct gen_vocab *v, uint32_t n_tokens, uint32_t n_merges)
{
    memset(v, 0, sizeof(*v));
    v->tokens = calloc(n_tokens, sizeof(*v->tokens));
    v->types = calloc(n_tokens, sizeof(*v->types));
    v->merges = calloc(n_merges ? n_merges : 1, sizeof(*v->merges));
    if (!v->tokens || !v->types || !v->merges) {
        free(v->tokens);
        free(v->types);
        free(v->merges);
        memset(v, 0, sizeof(*v));
        return err_set(-ENOMEM, "gen vocab: out of memory for %u tokens", n_tokens);
    }
    v->n_tokens = n_tokens;
    v->n_merges = n_merges;
    return 0;
}

/* Fills every still-empty id with `[PAD<id>]` (UNUSED). */
static int vocab_pad(struct gen_vocab *v)
{
    for (uint32_t id = 0; id < v->n_tokens; id++) {
        if (v->tokens[id])
            continue;
        char buf[32];
        snprintf(buf, sizeof(buf), "[PAD%" PRIu32 "]", id);
        if (!(v->tokens[id] = strdup(buf)))
            return err_set(-ENOMEM, "gen vocab: out of memory");
        v->types[id] = GEN_TOKEN_UNUSED;
    }
    return 0;
}

void gen_vocab_free(struct gen_vocab *v)
{
    if (!v)
        return;
    for (uint32_t i = 0; v->tokens && i < v->n_tokens; i++)
        free(v->tokens[i]);
    for (uint32_t i = 0; v->merges && i < v->n_merges; i++)
        free(v->merges[i]);
    free(v->tokens);
    free(v->types);
    free(v->merges);
    memset(v, 0, sizeof(*v));
}

int gen_vocab_build(uint32_t n_vocab, uint32_t special_base, struct gen_vocab *out)
{
    struct bpe b = {0};
    int rc;

    if (special_base == 0 && n_vocab >= N_SPECIAL)
        special_base = n_vocab - N_SPECIAL;
    if (special_base < N_BYTE_TOKENS || special_base > n_vocab - N_SPECIAL)
        return err_set(-EINVAL,
                       "gen vocab: %u tokens cannot hold 256 byte tokens and the "
                       "special tokens at id %u",
                       n_vocab, special_base);
    if ((rc = bpe_train(&b, special_base)))
        goto out;
    if ((rc = vocab_alloc(out, n_vocab, b.n_merges)))
        goto out;
    for (uint32_t t = 0; t < b.n_tok; t++) {
        if (!(out->tokens[t] = bytes_to_text(b.tok[t], b.tok_len[t])))
            goto nomem;
        out->types[t] = GEN_TOKEN_NORMAL;
    }
    for (uint32_t m = 0; m < b.n_merges; m++) {
        char *l = out->tokens[b.merges[m][0]], *r = out->tokens[b.merges[m][1]];
        size_t ll = strlen(l), rl = strlen(r);
        char *s = malloc(ll + rl + 2);
        if (!s)
            goto nomem;
        memcpy(s, l, ll);
        s[ll] = ' ';
        memcpy(s + ll + 1, r, rl + 1);
        out->merges[m] = s;
    }
    for (uint32_t i = 0; i < N_SPECIAL; i++) {
        if (!(out->tokens[special_base + i] = strdup(special_names[i])))
            goto nomem;
        out->types[special_base + i] = GEN_TOKEN_CONTROL;
    }
    out->bos_id = out->pad_id = special_base;
    out->eos_id = special_base + 2;
    if ((rc = vocab_pad(out)))
        gen_vocab_free(out);
    goto out;
nomem:
    gen_vocab_free(out);
    rc = err_set(-ENOMEM, "gen vocab: out of memory");
out:
    bpe_free(&b);
    return rc;
}

/* ---- tokenizer.json ----------------------------------------------------------------------- */

#define HF_MAX_TOKENS (1u << 24) /* ids above this are rejected as corrupt */

static int hf_put(struct gen_vocab *v, const char *path, int64_t id, const char *text, int32_t type)
{
    if (id < 0 || id >= (int64_t)v->n_tokens)
        return err_set(-EINVAL, "%s: token '%s' has id %" PRId64 " outside 0..%u", path, text, id,
                       v->n_tokens - 1);
    if (v->tokens[id]) {
        if (strcmp(v->tokens[id], text))
            return err_set(-EINVAL, "%s: id %" PRId64 " is both '%s' and '%s'", path, id,
                           v->tokens[id], text);
        v->types[id] = type; /* an added token that repeats a vocab entry sets its type */
        return 0;
    }
    if (!(v->tokens[id] = strdup(text)))
        return err_set(-ENOMEM, "gen vocab: out of memory");
    v->types[id] = type;
    return 0;
}

/* One merge as "left right": tokenizers < 0.20 store strings, newer ones [left, right]. */
static char *hf_merge_text(struct json_object *m)
{
    if (json_object_is_type(m, json_type_string))
        return strdup(json_object_get_string(m));
    if (json_object_is_type(m, json_type_array) && json_object_array_length(m) == 2) {
        const char *l = json_object_get_string(json_object_array_get_idx(m, 0));
        const char *r = json_object_get_string(json_object_array_get_idx(m, 1));
        if (!l || !r)
            return NULL;
        char *s = malloc(strlen(l) + strlen(r) + 2);
        if (s)
            sprintf(s, "%s %s", l, r);
        return s;
    }
    return NULL;
}

static int64_t hf_find(const struct gen_vocab *v, const char *text)
{
    for (uint32_t id = 0; id < v->n_tokens; id++) {
        if (v->tokens[id] && !strcmp(v->tokens[id], text))
            return id;
    }
    return -1;
}

static int hf_fill(struct gen_vocab *v, const char *path, struct json_object *vocab,
                   struct json_object *added, struct json_object *merges)
{
    int rc;

    json_object_object_foreach(vocab, text, val)
    {
        if ((rc = hf_put(v, path, json_object_get_int64(val), text, GEN_TOKEN_NORMAL)))
            return rc;
    }
    for (size_t i = 0; added && i < json_object_array_length(added); i++) {
        struct json_object *t = json_object_array_get_idx(added, i), *id, *content, *special;
        if (!json_object_object_get_ex(t, "id", &id) ||
            !json_object_object_get_ex(t, "content", &content))
            return err_set(-EINVAL, "%s: added_tokens[%zu] lacks id or content", path, i);
        const char *text = json_object_get_string(content);
        size_t len = strlen(text);
        /* Like llama.cpp's converter: special, or spelled <|...|>, means CONTROL. */
        bool control = (json_object_object_get_ex(t, "special", &special) &&
                        json_object_get_boolean(special)) ||
                       (len >= 4 && !strncmp(text, "<|", 2) && !strcmp(text + len - 2, "|>"));
        if ((rc = hf_put(v, path, json_object_get_int64(id), text,
                         control ? GEN_TOKEN_CONTROL : GEN_TOKEN_USER_DEFINED)))
            return rc;
    }
    for (uint32_t m = 0; m < v->n_merges; m++) {
        if (!(v->merges[m] = hf_merge_text(json_object_array_get_idx(merges, m))))
            return err_set(-EINVAL, "%s: model.merges[%u] is neither \"a b\" nor [a, b]", path, m);
    }
    return vocab_pad(v);
}

/* Largest id in model.vocab and added_tokens, plus one. */
static uint32_t hf_count(struct json_object *vocab, struct json_object *added)
{
    int64_t top = -1;

    json_object_object_foreach(vocab, text, val)
    {
        (void)text;
        int64_t id = json_object_get_int64(val);
        if (id > top)
            top = id;
    }
    for (size_t i = 0; added && i < json_object_array_length(added); i++) {
        struct json_object *id;
        if (json_object_object_get_ex(json_object_array_get_idx(added, i), "id", &id) &&
            json_object_get_int64(id) > top)
            top = json_object_get_int64(id);
    }
    return top < 0 ? 0 : top >= (int64_t)HF_MAX_TOKENS ? HF_MAX_TOKENS : (uint32_t)(top + 1);
}

int gen_vocab_load(const char *path, uint32_t n_vocab, struct gen_vocab *out)
{
    struct json_object *root = json_object_from_file(path), *model, *vocab, *merges, *added, *type;
    int rc;

    memset(out, 0, sizeof(*out));
    if (!root)
        return err_set(-EINVAL, "%s: cannot read as JSON: %s", path, json_util_get_last_err());
    if (!json_object_object_get_ex(root, "model", &model) ||
        !json_object_object_get_ex(model, "vocab", &vocab) ||
        !json_object_is_type(vocab, json_type_object) ||
        !json_object_object_get_ex(model, "merges", &merges) ||
        !json_object_is_type(merges, json_type_array)) {
        rc = err_set(-EINVAL, "%s: not a tokenizer.json with model.vocab and model.merges", path);
        goto out;
    }
    if (json_object_object_get_ex(model, "type", &type) &&
        strcmp(json_object_get_string(type), "BPE")) {
        rc = err_set(-EINVAL, "%s: model.type is '%s', gen writes byte-level BPE only", path,
                     json_object_get_string(type));
        goto out;
    }
    if (!json_object_object_get_ex(root, "added_tokens", &added) ||
        !json_object_is_type(added, json_type_array))
        added = NULL;

    uint32_t n = hf_count(vocab, added);
    if (n < n_vocab)
        n = n_vocab;
    if ((rc = vocab_alloc(out, n, (uint32_t)json_object_array_length(merges))))
        goto out;
    if ((rc = hf_fill(out, path, vocab, added, merges))) {
        gen_vocab_free(out);
        goto out;
    }
    int64_t eot = hf_find(out, special_names[0]), im_end = hf_find(out, special_names[2]);
    if (eot < 0 && im_end < 0) {
        gen_vocab_free(out);
        rc = err_set(-EINVAL, "%s: has neither %s nor %s for the bos/eos ids", path,
                     special_names[0], special_names[2]);
        goto out;
    }
    out->eos_id = (uint32_t)(im_end >= 0 ? im_end : eot);
    out->bos_id = out->pad_id = (uint32_t)(eot >= 0 ? eot : im_end);
out:
    json_object_put(root);
    return rc;
}
