/* tokenizer: byte-level BPE encode/decode. See tokenizer.h for the pipeline and contracts. */
#include "tokenizer.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pcre2.h>
#include <utf8proc.h>
#include <xxhash.h>

#include "errors.h"
#include "gguf.h"

/* ---- built-in pre-tokenizers -------------------------------------------------------------
 * The Split regexes of the Hugging Face tokenizer.json files these GGUF names stand for. */

#define RE_CONTRACTIONS "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
#define RE_QWEN2                                                                           \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*" \
                    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* Qwen3.5's: qwen2's with combining marks (\p{M}) inside letter runs, not punctuation runs */
#define RE_QWEN35                                                                                  \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"                                \
                    "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static const struct tokenizer_pre pre_table[] = {
    {"qwen2", 1, {RE_QWEN2}, TOKENIZER_VOCAB_NFC},
    {"qwen35", 1, {RE_QWEN35}, TOKENIZER_VOCAB_NFC},
    {"deepseek-r1-qwen", 1, {RE_QWEN2}, TOKENIZER_VOCAB_NFC}, /* Qwen2.5 vocabulary */
    {"megrez", 1, {RE_QWEN2}, TOKENIZER_VOCAB_NFC},
    {"llama-bpe",
     1,
     {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                      "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     TOKENIZER_VOCAB_IGNORE_MERGES},
    {"gpt-4o",
     1,
     {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
      "+" RE_CONTRACTIONS "?"
      "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
      "*" RE_CONTRACTIONS "?"
      "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     TOKENIZER_VOCAB_IGNORE_MERGES},
    {"deepseek-v3",
     3,
     {"\\p{N}{1,3}",
      /* [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+ with the code points as UTF-8 */
      "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
      "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
      "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
     0},
    {"gpt-2",
     1,
     {"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},
     0},
};

const struct tokenizer_pre *tokenizer_pre_find(const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < sizeof(pre_table) / sizeof(pre_table[0]); i++)
        if (strcmp(pre_table[i].name, name) == 0)
            return &pre_table[i];
    return NULL;
}

const struct tokenizer_pre *tokenizer_pre_match(uint32_t n, const char *const *regex)
{
    for (size_t i = 0; i < sizeof(pre_table) / sizeof(pre_table[0]); i++) {
        const struct tokenizer_pre *p = &pre_table[i];
        if (p->n_regex != n)
            continue;
        uint32_t k = 0;
        while (k < n && strcmp(p->regex[k], regex[k]) == 0)
            k++;
        if (k == n)
            return p;
    }
    return NULL;
}

/* ---- GPT-2 byte map -----------------------------------------------------------------------
 * Printable Latin-1 bytes (0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF) stand for themselves; the other 68
 * bytes map in order to U+0100..U+0143. */

uint32_t tokenizer_byte_to_codepoint(uint8_t b)
{
    if (b <= 0x20)
        return 0x100 + b;
    if (b >= 0x7F && b <= 0xA0)
        return 0x100 + 33 + (b - 0x7F);
    if (b == 0xAD)
        return 0x100 + 67;
    return b;
}

/* The byte code point CP stands for, or -1 when CP is outside the map. */
static int byte_from_codepoint(int32_t cp)
{
    if (cp < 0)
        return -1;
    if (cp < 0x100)
        return tokenizer_byte_to_codepoint((uint8_t)cp) == (uint32_t)cp ? cp : -1;
    if (cp <= 0x100 + 32)
        return cp - 0x100;
    if (cp <= 0x100 + 66)
        return cp - 0x100 - 33 + 0x7F;
    if (cp == 0x100 + 67)
        return 0xAD;
    return -1;
}

/* ---- the tokenizer ------------------------------------------------------------------------ */

struct tok_entry {
    uint32_t text_off;  /* into tok->text: the token as stored */
    uint32_t text_len;
    uint32_t bytes_off; /* into tok->bytes: what it decodes to */
    uint32_t bytes_len;
    int8_t type;        /* enum tokenizer_token_type */
    uint8_t eog;        /* ends generation */
};

/* One merge: the pair (left, right) of token ids becomes token `result` at priority `rank`. */
struct pair_slot {
    uint64_t key; /* (uint64_t)left << 32 | right; PAIR_EMPTY when free */
    uint32_t rank;
    int32_t result;
};

#define PAIR_EMPTY UINT64_MAX
#define TOKENIZER_MAX_TOKENS (1u << 30) /* keeps every table size within 32 bits */

struct tokenizer {
    uint32_t n_vocab;
    struct tok_entry *entries; /* (n_vocab) owned */
    char *text;                /* token texts back to back, owned */
    uint8_t *bytes;            /* decoded token bytes back to back, owned */
    uint32_t *text_slots;      /* (text_mask + 1) owned: 1 + id of that text, 0 free */
    uint32_t text_mask;
    struct pair_slot *pairs;   /* (1 << pair_bits) owned: the merge table */
    uint32_t pair_bits;
    int32_t byte_id[256];      /* token of each byte's one-symbol text, -1 when absent */
    /* Added tokens to split the input on (CONTROL and USER_DEFINED), sorted by first byte, then
     * by length, longest first: those starting with byte b are added[added_first[b] ..
     * added_first[b + 1]). */
    int32_t *added;            /* (n_added) owned */
    uint32_t n_added;
    uint32_t added_first[257];
    uint32_t n_re;
    pcre2_code *re[TOKENIZER_MAX_PRE_REGEX];  /* compiled (and JIT-compiled) patterns, owned */
    char *re_src[TOKENIZER_MAX_PRE_REGEX];    /* the patterns as given, owned */
    char pre_name[64];
    uint32_t flags;            /* enum tokenizer_vocab_flags */
    int32_t bos_id, eos_id, eot_id, eom_id, unk_id, pad_id;
};

static uint64_t hash_text(const void *p, size_t n)
{
    return XXH3_64bits(p, n);
}

static uint32_t pair_hash(uint64_t key, uint32_t bits)
{
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

static int32_t text_find(const struct tokenizer *tok, const char *s, size_t n)
{
    uint32_t i = (uint32_t)hash_text(s, n) & tok->text_mask;
    for (;;) {
        uint32_t v = tok->text_slots[i];
        if (v == 0)
            return -1;
        const struct tok_entry *e = &tok->entries[v - 1];
        if (e->text_len == n && memcmp(tok->text + e->text_off, s, n) == 0)
            return (int32_t)(v - 1);
        i = (i + 1) & tok->text_mask;
    }
}

static const struct pair_slot *pair_find(const struct tokenizer *tok, int32_t left, int32_t right)
{
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    uint32_t mask = (1u << tok->pair_bits) - 1;
    uint32_t i = pair_hash(key, tok->pair_bits);
    for (;;) {
        const struct pair_slot *s = &tok->pairs[i];
        if (s->key == key)
            return s;
        if (s->key == PAIR_EMPTY)
            return NULL;
        i = (i + 1) & mask;
    }
}

/* Writes the UTF-8 form of CP (< 0x800, as every byte-map code point is); returns its length. */
static size_t utf8_put_small(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* Decodes byte-level token text: each code point in the byte map becomes its byte; anything
 * else (not valid UTF-8, or outside the map) is copied as it is. Returns the length written. */
static uint32_t bytelevel_decode(const char *text, uint32_t n, uint8_t *out)
{
    uint32_t o = 0;
    for (uint32_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)text + i, n - i, &cp);
        int b = k > 0 ? byte_from_codepoint(cp) : -1;
        if (b >= 0) {
            out[o++] = (uint8_t)b;
            i += (uint32_t)k;
        } else if (k > 0) {
            memcpy(out + o, text + i, (size_t)k);
            o += (uint32_t)k;
            i += (uint32_t)k;
        } else {
            out[o++] = (uint8_t)text[i++];
        }
    }
    return o;
}

static bool token_type_valid(int32_t t)
{
    return t >= TOKENIZER_TOKEN_NORMAL && t <= TOKENIZER_TOKEN_BYTE;
}

static size_t str_len(const char *const *strs, const uint32_t *lens, uint32_t i)
{
    return lens ? lens[i] : strlen(strs[i]);
}

static int build_tokens(struct tokenizer *tok, const struct tokenizer_vocab *v)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        if (!v->tokens[i])
            return err_set(-EINVAL, "tokenizer: token %u has no text", i);
        total += str_len(v->tokens, v->token_lens, i);
    }
    if (total >= UINT32_MAX)
        return err_set(-EOVERFLOW, "tokenizer: %llu bytes of token text (limit 4 GiB)",
                       (unsigned long long)total);
    tok->entries = calloc(v->n_tokens, sizeof(*tok->entries));
    tok->text = malloc(total + 1);
    tok->bytes = malloc(total + 1);
    uint32_t cap = 16;
    while (cap < 2ull * v->n_tokens)
        cap <<= 1;
    tok->text_slots = calloc(cap, sizeof(*tok->text_slots));
    tok->text_mask = cap - 1;
    if (!tok->entries || !tok->text || !tok->bytes || !tok->text_slots)
        return err_set(-ENOMEM, "tokenizer: out of memory for %u tokens", v->n_tokens);

    uint32_t off = 0, boff = 0;
    for (uint32_t id = 0; id < v->n_tokens; id++) {
        struct tok_entry *e = &tok->entries[id];
        uint32_t n = (uint32_t)str_len(v->tokens, v->token_lens, id);
        int32_t type = v->token_types ? v->token_types[id] : TOKENIZER_TOKEN_NORMAL;
        if (!token_type_valid(type))
            return err_set(-EINVAL, "tokenizer: token %u has type %d (valid: 1..6)", id, type);
        memcpy(tok->text + off, v->tokens[id], n);
        e->text_off = off;
        e->text_len = n;
        e->type = (int8_t)type;
        e->bytes_off = boff;
        if (type == TOKENIZER_TOKEN_NORMAL)
            e->bytes_len = bytelevel_decode(tok->text + off, n, tok->bytes + boff);
        else if (type == TOKENIZER_TOKEN_UNUSED)
            e->bytes_len = 0;
        else {
            memcpy(tok->bytes + boff, tok->text + off, n);
            e->bytes_len = n;
        }
        off += n;
        boff += e->bytes_len;

        /* The first id with a given text wins. */
        uint32_t h = (uint32_t)hash_text(tok->text + e->text_off, n) & tok->text_mask;
        for (;;) {
            uint32_t s = tok->text_slots[h];
            if (s == 0) {
                tok->text_slots[h] = id + 1;
                break;
            }
            const struct tok_entry *o = &tok->entries[s - 1];
            if (o->text_len == n &&
                memcmp(tok->text + o->text_off, tok->text + e->text_off, n) == 0)
                break;
            h = (h + 1) & tok->text_mask;
        }
    }
    tok->n_vocab = v->n_tokens;

    for (int b = 0; b < 256; b++) {
        char s[2];
        size_t n = utf8_put_small(tokenizer_byte_to_codepoint((uint8_t)b), s);
        tok->byte_id[b] = text_find(tok, s, n);
    }
    return 0;
}

static int build_merges(struct tokenizer *tok, const struct tokenizer_vocab *v)
{
    uint32_t bits = 4;
    while ((1ull << bits) < 2ull * v->n_merges)
        bits++;
    if (bits > 31)
        return err_set(-EOVERFLOW, "tokenizer: %u merges", v->n_merges);
    tok->pair_bits = bits;
    tok->pairs = malloc(sizeof(*tok->pairs) << bits);
    char *buf = NULL;
    size_t buf_cap = 0;
    if (!tok->pairs)
        return err_set(-ENOMEM, "tokenizer: out of memory for %u merges", v->n_merges);
    for (size_t i = 0; i < (1u << bits); i++)
        tok->pairs[i].key = PAIR_EMPTY;

    int rc = 0;
    for (uint32_t rank = 0; rank < v->n_merges; rank++) {
        const char *m = v->merges[rank];
        if (!m) {
            rc = err_set(-EINVAL, "tokenizer: merge %u is NULL", rank);
            break;
        }
        size_t n = str_len(v->merges, v->merge_lens, rank);
        /* "left right": the separator is the first space after the first byte. */
        const char *sp = n > 1 ? memchr(m + 1, ' ', n - 1) : NULL;
        if (!sp) {
            rc = err_set(-EINVAL, "tokenizer: merge %u ('%.*s') has no space separator", rank,
                         (int)(n < 64 ? n : 64), m);
            break;
        }
        size_t nl = (size_t)(sp - m), nr = n - nl - 1;
        if (nl + nr > buf_cap) {
            buf_cap = 2 * (nl + nr) + 64;
            char *nb = realloc(buf, buf_cap);
            if (!nb) {
                rc = err_set(-ENOMEM, "tokenizer: out of memory");
                break;
            }
            buf = nb;
        }
        memcpy(buf, m, nl);
        memcpy(buf + nl, sp + 1, nr);
        int32_t left = text_find(tok, m, nl), right = text_find(tok, sp + 1, nr);
        int32_t result = text_find(tok, buf, nl + nr);
        /* A merge naming a token the vocabulary lacks can never apply: skip it. */
        if (left < 0 || right < 0 || result < 0)
            continue;
        uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
        uint32_t mask = (1u << bits) - 1;
        uint32_t h = pair_hash(key, bits);
        while (tok->pairs[h].key != PAIR_EMPTY && tok->pairs[h].key != key)
            h = (h + 1) & mask;
        if (tok->pairs[h].key == PAIR_EMPTY) /* a repeated pair keeps its first (lowest) rank */
            tok->pairs[h] = (struct pair_slot){key, rank, result};
    }
    free(buf);
    return rc;
}

/* Sort key of an added token: first byte, then longer first, then id. */
struct added_key {
    uint8_t first;
    uint32_t len;
    int32_t id;
};

static int added_cmp(const void *a, const void *b)
{
    const struct added_key *x = a, *y = b;
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static bool is_added(const struct tok_entry *e)
{
    return (e->type == TOKENIZER_TOKEN_CONTROL || e->type == TOKENIZER_TOKEN_USER_DEFINED) &&
           e->text_len > 0;
}

static int build_added(struct tokenizer *tok)
{
    uint32_t n = 0;
    for (uint32_t id = 0; id < tok->n_vocab; id++)
        n += is_added(&tok->entries[id]);
    struct added_key *keys = malloc((n ? n : 1) * sizeof(*keys));
    tok->added = malloc((n ? n : 1) * sizeof(*tok->added));
    if (!keys || !tok->added) {
        free(keys);
        return err_set(-ENOMEM, "tokenizer: out of memory");
    }
    n = 0;
    for (uint32_t id = 0; id < tok->n_vocab; id++) {
        const struct tok_entry *e = &tok->entries[id];
        if (is_added(e))
            keys[n++] = (struct added_key){(uint8_t)tok->text[e->text_off], e->text_len,
                                           (int32_t)id};
    }
    qsort(keys, n, sizeof(*keys), added_cmp);
    uint32_t k = 0;
    for (int b = 0; b < 256; b++) {
        tok->added_first[b] = k;
        while (k < n && keys[k].first == b)
            k++;
    }
    tok->added_first[256] = n;
    for (k = 0; k < n; k++)
        tok->added[k] = keys[k].id;
    tok->n_added = n;
    free(keys);
    return 0;
}

/* Hugging Face's regex engine (Oniguruma) takes \s as Unicode White_Space; PCRE2's \s also
 * matches U+180E (a space before Unicode 6.3). Spells \s out as White_Space (inside and outside
 * classes) and \S (outside classes) as its complement, so both engines cut the same pieces. */
#define WHITE_SPACE                                                                         \
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"           \
    "\\x{202F}\\x{205F}\\x{3000}"

/* Returns the rewritten pattern (malloc'd) or NULL. */
static char *regex_rewrite_space(const char *src)
{
    static const char in_cls[] = WHITE_SPACE, out_s[] = "[" WHITE_SPACE "]",
                      out_not_s[] = "[^" WHITE_SPACE "]";
    size_t n = strlen(src);
    char *out = malloc(n * sizeof(out_not_s) + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = src[i];
        if (c == '\\' && i + 1 < n) {
            char d = src[i + 1];
            const char *rep = NULL;
            if (d == 's')
                rep = in_class ? in_cls : out_s;
            else if (d == 'S' && !in_class)
                rep = out_not_s;
            if (rep) {
                memcpy(out + o, rep, strlen(rep));
                o += strlen(rep);
            } else {
                out[o++] = c;
                out[o++] = d;
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            out[o++] = c;
            /* A ']' right after '[' or '[^' is a literal. */
            if (i + 1 < n && src[i + 1] == '^')
                out[o++] = src[++i];
            if (i + 1 < n && src[i + 1] == ']')
                out[o++] = src[++i];
            continue;
        }
        if (in_class && c == ']')
            in_class = false;
        out[o++] = c;
    }
    out[o] = '\0';
    return out;
}

static int build_regex(struct tokenizer *tok, const struct tokenizer_vocab *v)
{
    const char *const *src = v->pre_regex;
    uint32_t n = v->n_pre_regex;
    const struct tokenizer_pre *pre = NULL;
    if (n > TOKENIZER_MAX_PRE_REGEX)
        return err_set(-EINVAL, "tokenizer: %u pre-tokenizer regexes (at most %d)", n,
                       TOKENIZER_MAX_PRE_REGEX);
    if (n == 0) {
        if (!v->pre)
            return err_set(-EINVAL, "tokenizer: neither pre-tokenizer regexes nor a pre name");
        pre = tokenizer_pre_find(v->pre);
        if (!pre)
            return err_set(-ENOTSUP,
                           "tokenizer: pre-tokenizer '%s' is not supported "
                           "(known: qwen2, qwen35, llama-bpe, gpt-4o, deepseek-v3, gpt-2)",
                           v->pre);
        src = pre->regex;
        n = pre->n_regex;
        tok->flags |= pre->flags;
    } else {
        pre = tokenizer_pre_match(n, src);
    }
    const char *name = v->pre ? v->pre : pre ? pre->name : "";
    snprintf(tok->pre_name, sizeof(tok->pre_name), "%s", name);

    for (uint32_t k = 0; k < n; k++) {
        if (!src[k])
            return err_set(-EINVAL, "tokenizer: pre-tokenizer regex %u is NULL", k);
        tok->re_src[k] = strdup(src[k]);
        char *pat = regex_rewrite_space(src[k]);
        if (!tok->re_src[k] || !pat) {
            free(pat);
            return err_set(-ENOMEM, "tokenizer: out of memory");
        }
        int errcode;
        PCRE2_SIZE erroff;
        tok->re[k] = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &errcode,
                                   &erroff, NULL);
        free(pat);
        if (!tok->re[k]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(errcode, msg, sizeof(msg));
            return err_set(-EINVAL, "tokenizer: pre-tokenizer regex %u does not compile at "
                           "offset %zu: %s (pattern: %s)", k, (size_t)erroff, (char *)msg, src[k]);
        }
        /* Without JIT (unsupported CPU or build) pcre2_match interprets: slower, same result. */
        (void)pcre2_jit_compile(tok->re[k], PCRE2_JIT_COMPLETE);
        tok->n_re = k + 1;
    }
    return 0;
}

static const char *const eog_texts[] = {
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|return|>", "<|call|>",
    "<end_of_turn>", "<|end_of_text|>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", /* DeepSeek */
};

static int check_special_id(const struct tokenizer *tok, const char *what, int32_t id)
{
    if (id < -1 || id >= (int64_t)tok->n_vocab)
        return err_set(-EINVAL, "tokenizer: %s id %d is outside the vocabulary (%u tokens)",
                       what, id, tok->n_vocab);
    return 0;
}

int tokenizer_open_vocab(const struct tokenizer_vocab *v, struct tokenizer **out)
{
    *out = NULL;
    if (!v || v->n_tokens == 0 || !v->tokens)
        return err_set(-EINVAL, "tokenizer: empty vocabulary");
    if (v->n_tokens > TOKENIZER_MAX_TOKENS)
        return err_set(-EINVAL, "tokenizer: %u tokens (at most %u)", v->n_tokens,
                       TOKENIZER_MAX_TOKENS);
    if (v->n_merges && !v->merges)
        return err_set(-EINVAL, "tokenizer: %u merges but no merge array", v->n_merges);
    struct tokenizer *tok = calloc(1, sizeof(*tok));
    if (!tok)
        return err_set(-ENOMEM, "tokenizer: out of memory");
    tok->flags = v->flags;
    tok->bos_id = v->bos_id;
    tok->eos_id = v->eos_id;
    tok->eot_id = v->eot_id;
    tok->eom_id = v->eom_id;
    tok->unk_id = v->unk_id;
    tok->pad_id = v->pad_id;

    int rc = build_tokens(tok, v);
    if (!rc)
        rc = build_merges(tok, v);
    if (!rc)
        rc = build_added(tok);
    if (!rc)
        rc = build_regex(tok, v);
    if (!rc)
        rc = check_special_id(tok, "bos", tok->bos_id);
    if (!rc)
        rc = check_special_id(tok, "eos", tok->eos_id);
    if (!rc)
        rc = check_special_id(tok, "eot", tok->eot_id);
    if (!rc)
        rc = check_special_id(tok, "eom", tok->eom_id);
    if (!rc)
        rc = check_special_id(tok, "unknown", tok->unk_id);
    if (!rc)
        rc = check_special_id(tok, "padding", tok->pad_id);
    if (rc) {
        tokenizer_close(tok);
        return rc;
    }

    int32_t ends[] = {tok->eos_id, tok->eot_id, tok->eom_id};
    for (size_t i = 0; i < sizeof(ends) / sizeof(ends[0]); i++)
        if (ends[i] >= 0)
            tok->entries[ends[i]].eog = 1;
    for (size_t i = 0; i < sizeof(eog_texts) / sizeof(eog_texts[0]); i++) {
        int32_t id = text_find(tok, eog_texts[i], strlen(eog_texts[i]));
        if (id >= 0 && tok->entries[id].type == TOKENIZER_TOKEN_CONTROL)
            tok->entries[id].eog = 1;
    }
    *out = tok;
    return 0;
}

void tokenizer_close(struct tokenizer *tok)
{
    if (!tok)
        return;
    for (uint32_t k = 0; k < TOKENIZER_MAX_PRE_REGEX; k++) {
        pcre2_code_free(tok->re[k]);
        free(tok->re_src[k]);
    }
    free(tok->added);
    free(tok->pairs);
    free(tok->text_slots);
    free(tok->bytes);
    free(tok->text);
    free(tok->entries);
    free(tok);
}

/* ---- GGUF --------------------------------------------------------------------------------- */

/* Optional u32 id key: -1 when absent. */
static int gguf_id(const struct gguf_file *f, const char *key, int32_t *out)
{
    *out = -1;
    if (!gguf_find_kv(f, key))
        return 0;
    uint32_t v;
    int rc = gguf_get_u32(f, key, &v);
    if (rc)
        return rc;
    if (v > INT32_MAX)
        return err_set(-EINVAL, "gguf: %s = %u is not a token id", key, v);
    *out = (int32_t)v;
    return 0;
}

static int gguf_flag(const struct gguf_file *f, const char *key, uint32_t bit, uint32_t *flags)
{
    if (!gguf_find_kv(f, key))
        return 0;
    bool b;
    int rc = gguf_get_bool(f, key, &b);
    if (!rc && b)
        *flags |= bit;
    return rc;
}

/* A string array key as (pointers, lengths) views into the mapping. */
static int gguf_str_array(const struct gguf_file *f, const char *key, uint32_t *n,
                          const char ***strs, uint32_t **lens)
{
    const struct gguf_value *val;
    int rc = gguf_get_arr(f, key, &val);
    if (rc)
        return rc;
    if (val->arr.elem_type != GGUF_TYPE_STRING)
        return err_set(-EINVAL, "gguf: %s is an array of %s, expected string", key,
                       gguf_value_type_name(val->arr.elem_type));
    if (val->arr.count > INT32_MAX)
        return err_set(-EINVAL, "gguf: %s has %llu entries", key,
                       (unsigned long long)val->arr.count);
    *n = (uint32_t)val->arr.count;
    *strs = malloc((*n ? *n : 1) * sizeof(**strs));
    *lens = malloc((*n ? *n : 1) * sizeof(**lens));
    if (!*strs || !*lens)
        return err_set(-ENOMEM, "gguf: out of memory for %s", key);
    for (uint32_t i = 0; i < *n; i++) {
        if (val->arr.strs[i].len > UINT32_MAX)
            return err_set(-EINVAL, "gguf: %s[%u] is %llu bytes long", key, i,
                           (unsigned long long)val->arr.strs[i].len);
        (*strs)[i] = val->arr.strs[i].ptr;
        (*lens)[i] = (uint32_t)val->arr.strs[i].len;
    }
    return 0;
}

int tokenizer_open_gguf(const struct gguf_file *f, struct tokenizer **out)
{
    *out = NULL;
    struct tokenizer_vocab v = {0};
    const char **tokens = NULL, **merges = NULL;
    uint32_t *token_lens = NULL, *merge_lens = NULL;
    int32_t *types = NULL;
    char model[32], pre[64] = "";
    struct gguf_str s;

    int rc = gguf_get_str(f, "tokenizer.ggml.model", &s);
    if (rc)
        return rc;
    snprintf(model, sizeof(model), "%.*s", (int)(s.len < 31 ? s.len : 31), s.ptr);
    if (s.len != 4 || memcmp(s.ptr, "gpt2", 4) != 0)
        return err_set(-ENOTSUP, "gguf: tokenizer.ggml.model is '%s'; strata supports only "
                       "'gpt2' (byte-level BPE)", model);
    if (gguf_find_kv(f, "tokenizer.ggml.pre")) {
        rc = gguf_get_str(f, "tokenizer.ggml.pre", &s);
        if (rc)
            return rc;
        if (s.len >= sizeof(pre))
            return err_set(-ENOTSUP, "gguf: tokenizer.ggml.pre is %llu bytes long",
                           (unsigned long long)s.len);
        memcpy(pre, s.ptr, s.len);
        pre[s.len] = '\0';
    } else {
        return err_set(
            -ENOTSUP, "gguf: tokenizer.ggml.pre is absent; strata needs the "
                      "pre-tokenizer named (qwen2, qwen35, llama-bpe, gpt-4o, deepseek-v3, gpt-2)");
    }
    v.pre = pre;

    rc = gguf_str_array(f, "tokenizer.ggml.tokens", &v.n_tokens, &tokens, &token_lens);
    if (rc)
        goto out;
    v.tokens = tokens;
    v.token_lens = token_lens;
    if (gguf_find_kv(f, "tokenizer.ggml.merges")) {
        rc = gguf_str_array(f, "tokenizer.ggml.merges", &v.n_merges, &merges, &merge_lens);
        if (rc)
            goto out;
        v.merges = merges;
        v.merge_lens = merge_lens;
    }
    if (gguf_find_kv(f, "tokenizer.ggml.token_type")) {
        const struct gguf_value *val;
        rc = gguf_get_arr(f, "tokenizer.ggml.token_type", &val);
        if (rc)
            goto out;
        if (val->arr.elem_type != GGUF_TYPE_INT32 && val->arr.elem_type != GGUF_TYPE_UINT32) {
            rc = err_set(-EINVAL, "gguf: tokenizer.ggml.token_type is an array of %s, expected "
                         "int32", gguf_value_type_name(val->arr.elem_type));
            goto out;
        }
        if (val->arr.count != v.n_tokens) {
            rc = err_set(-EINVAL, "gguf: tokenizer.ggml.token_type has %llu entries, "
                         "tokenizer.ggml.tokens %u", (unsigned long long)val->arr.count,
                         v.n_tokens);
            goto out;
        }
        types = malloc((v.n_tokens ? v.n_tokens : 1) * sizeof(*types));
        if (!types) {
            rc = err_set(-ENOMEM, "gguf: out of memory");
            goto out;
        }
        memcpy(types, val->arr.data, (size_t)v.n_tokens * sizeof(*types));
        v.token_types = types;
    }
    if ((rc = gguf_id(f, "tokenizer.ggml.bos_token_id", &v.bos_id)) ||
        (rc = gguf_id(f, "tokenizer.ggml.eos_token_id", &v.eos_id)) ||
        (rc = gguf_id(f, "tokenizer.ggml.eot_token_id", &v.eot_id)) ||
        (rc = gguf_id(f, "tokenizer.ggml.eom_token_id", &v.eom_id)) ||
        (rc = gguf_id(f, "tokenizer.ggml.unknown_token_id", &v.unk_id)) ||
        (rc = gguf_id(f, "tokenizer.ggml.padding_token_id", &v.pad_id)) ||
        (rc = gguf_flag(f, "tokenizer.ggml.add_bos_token", TOKENIZER_VOCAB_ADD_BOS, &v.flags)) ||
        (rc = gguf_flag(f, "tokenizer.ggml.add_eos_token", TOKENIZER_VOCAB_ADD_EOS, &v.flags)))
        goto out;
    rc = tokenizer_open_vocab(&v, out);
    if (rc)
        err_wrap(rc, "%s: ", f->path ? f->path : "gguf in memory");
out:
    free(tokens);
    free(token_lens);
    free(merges);
    free(merge_lens);
    free(types);
    return rc;
}

/* ---- encode ------------------------------------------------------------------------------- */

/* A candidate merge of the symbols at `pos` and `right`, valid while they still hold these ids. */
struct bpe_item {
    uint32_t rank;
    uint32_t pos;
    uint32_t right;
    int32_t left_id;
    int32_t right_id;
    int32_t result;
};

struct encoder {
    const struct tokenizer *tok;
    int32_t *ids;           /* (cap) caller's output */
    size_t cap;
    size_t count;           /* ids produced so far (may exceed cap) */
    pcre2_match_data *md[TOKENIZER_MAX_PRE_REGEX]; /* owned, one per regex level */
    /* BPE scratch, grown as needed: one symbol per byte of the piece. */
    int32_t *sym_id;        /* (sym_cap) */
    int32_t *sym_prev;      /* (sym_cap) */
    int32_t *sym_next;      /* (sym_cap) */
    size_t sym_cap;
    struct bpe_item *heap;  /* (heap_cap) binary min-heap on (rank, pos) */
    size_t heap_len, heap_cap;
    char *buf;              /* (buf_cap) byte-level text of a piece, for IGNORE_MERGES */
    size_t buf_cap;
};

static void encoder_push(struct encoder *e, int32_t id)
{
    if (e->count < e->cap)
        e->ids[e->count] = id;
    e->count++;
}

static bool item_before(const struct bpe_item *a, const struct bpe_item *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct encoder *e, struct bpe_item it)
{
    size_t i = e->heap_len++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!item_before(&it, &e->heap[p]))
            break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = it;
}

static struct bpe_item heap_pop(struct encoder *e)
{
    struct bpe_item top = e->heap[0];
    struct bpe_item last = e->heap[--e->heap_len];
    size_t n = e->heap_len, i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && item_before(&e->heap[c + 1], &e->heap[c]))
            c++;
        if (!item_before(&e->heap[c], &last))
            break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n > 0)
        e->heap[i] = last;
    return top;
}

/* Queues the merge of symbols l and r if the vocabulary has one. The heap never outgrows its
 * capacity: there are n - 1 initial pairs and each merge adds at most two. */
static void bpe_try_pair(struct encoder *e, int32_t l, int32_t r)
{
    if (l < 0 || r < 0 || e->sym_id[l] < 0 || e->sym_id[r] < 0)
        return;
    const struct pair_slot *p = pair_find(e->tok, e->sym_id[l], e->sym_id[r]);
    if (p)
        heap_push(e, (struct bpe_item){p->rank, (uint32_t)l, (uint32_t)r, e->sym_id[l],
                                       e->sym_id[r], p->result});
}

static int bpe_reserve(struct encoder *e, size_t n)
{
    if (n > e->sym_cap) {
        size_t cap = n < 256 ? 256 : n;
        int32_t *a = realloc(e->sym_id, cap * sizeof(int32_t));
        if (a)
            e->sym_id = a;
        int32_t *b = realloc(e->sym_prev, cap * sizeof(int32_t));
        if (b)
            e->sym_prev = b;
        int32_t *c = realloc(e->sym_next, cap * sizeof(int32_t));
        if (c)
            e->sym_next = c;
        if (!a || !b || !c)
            return err_set(-ENOMEM, "tokenizer: out of memory for a %zu-byte piece", n);
        e->sym_cap = cap;
    }
    if (3 * n > e->heap_cap) {
        size_t cap = 3 * n < 768 ? 768 : 3 * n;
        struct bpe_item *h = realloc(e->heap, cap * sizeof(*h));
        if (!h)
            return err_set(-ENOMEM, "tokenizer: out of memory for a %zu-byte piece", n);
        e->heap = h;
        e->heap_cap = cap;
    }
    return 0;
}

static int emit_symbol(struct encoder *e, int32_t id, uint8_t byte)
{
    if (id >= 0) {
        encoder_push(e, id);
        return 0;
    }
    if (e->tok->unk_id >= 0) {
        encoder_push(e, e->tok->unk_id);
        return 0;
    }
    return err_set(-EINVAL, "tokenizer: byte 0x%02x has no token and there is no unknown token",
                   byte);
}

/* With IGNORE_MERGES: the id of the NORMAL token spelling the whole piece, or -1. */
static int32_t whole_piece(struct encoder *e, const uint8_t *s, size_t n)
{
    if (2 * n > e->buf_cap) {
        size_t cap = 2 * n < 256 ? 256 : 2 * n;
        char *b = realloc(e->buf, cap);
        if (!b)
            return -1; /* falls back to merging, which gives the same ids when it succeeds */
        e->buf = b;
        e->buf_cap = cap;
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        o += utf8_put_small(tokenizer_byte_to_codepoint(s[i]), e->buf + o);
    int32_t id = text_find(e->tok, e->buf, o);
    return id >= 0 && e->tok->entries[id].type == TOKENIZER_TOKEN_NORMAL ? id : -1;
}

/* Byte-pair encodes one pre-tokenized piece: one symbol per byte, then repeatedly the adjacent
 * pair with the lowest merge rank (leftmost among equals) becomes its merged token. */
static int bpe_piece(struct encoder *e, const uint8_t *s, size_t n)
{
    const struct tokenizer *tok = e->tok;
    if (n == 1)
        return emit_symbol(e, tok->byte_id[s[0]], s[0]);
    if (tok->flags & TOKENIZER_VOCAB_IGNORE_MERGES) {
        int32_t id = whole_piece(e, s, n);
        if (id >= 0) {
            encoder_push(e, id);
            return 0;
        }
    }
    if (n > INT32_MAX)
        return err_set(-EOVERFLOW, "tokenizer: a %zu-byte piece", n);
    int rc = bpe_reserve(e, n);
    if (rc)
        return rc;
    int32_t *id = e->sym_id, *prev = e->sym_prev, *next = e->sym_next;
    for (size_t i = 0; i < n; i++) {
        id[i] = tok->byte_id[s[i]];
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    e->heap_len = 0;
    for (size_t i = 0; i + 1 < n; i++)
        bpe_try_pair(e, (int32_t)i, (int32_t)i + 1);
    while (e->heap_len > 0) {
        struct bpe_item it = heap_pop(e);
        int32_t l = (int32_t)it.pos, r = (int32_t)it.right;
        if (next[l] != r || id[l] != it.left_id || id[r] != it.right_id)
            continue; /* stale: one side has merged since */
        id[l] = it.result;
        id[r] = -1;
        next[l] = next[r];
        if (next[r] >= 0)
            prev[next[r]] = l;
        bpe_try_pair(e, prev[l], l);
        bpe_try_pair(e, l, next[l]);
    }
    for (int32_t i = 0; i >= 0; i = next[i]) {
        rc = emit_symbol(e, id[i], s[i]);
        if (rc)
            return rc;
    }
    return 0;
}

/* Applies regex LEVEL to s[0..n): each match and each gap between matches goes on to the next
 * level; after the last level, to BPE. The subject is the piece alone, so lookaheads such as
 * \s+(?!\S) cannot see past it. */
static int pretokenize(struct encoder *e, const uint8_t *s, size_t n, uint32_t level)
{
    if (n == 0)
        return 0;
    if (level == e->tok->n_re)
        return bpe_piece(e, s, n);
    const pcre2_code *re = e->tok->re[level];
    pcre2_match_data *md = e->md[level];
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t pos = 0, from = 0;
    int rc;
    while (from < n) {
        int m = pcre2_match(re, s, n, from, 0, md, NULL);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        if (m < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(m, msg, sizeof(msg));
            return err_set(-EINVAL, "tokenizer: pre-tokenizer regex %u failed at byte %zu: %s",
                           level, from, (char *)msg);
        }
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {
            /* An empty match splits nothing: search again one byte further on (PCRE2 accepts
             * any start offset with PCRE2_MATCH_INVALID_UTF). */
            from = ms + 1;
            continue;
        }
        if (ms > pos && (rc = pretokenize(e, s + pos, ms - pos, level + 1)))
            return rc;
        if ((rc = pretokenize(e, s + ms, me - ms, level + 1)))
            return rc;
        pos = from = me;
    }
    return pretokenize(e, s + pos, n - pos, level + 1);
}

/* Text outside added tokens: NFC when the vocabulary asks for it, then pre-tokenize. */
static int encode_segment(struct encoder *e, const uint8_t *s, size_t n)
{
    if (n == 0)
        return 0;
    if (!(e->tok->flags & TOKENIZER_VOCAB_NFC))
        return pretokenize(e, s, n, 0);
    /* Every code point below U+0300 (UTF-8 lead bytes below 0xCC) is NFC-stable and cannot
     * combine with what precedes it, so text made only of those needs no normalization. */
    size_t i = 0;
    while (i < n && s[i] < 0xCC)
        i++;
    if (i == n)
        return pretokenize(e, s, n, 0);

    /* Normalize each maximal valid UTF-8 run; invalid bytes pass through unchanged. */
    uint8_t *norm = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (i = 0; i < n;) {
        size_t j = i;
        while (j < n) {
            utf8proc_int32_t cp;
            utf8proc_ssize_t k = utf8proc_iterate(s + j, (utf8proc_ssize_t)(n - j), &cp);
            if (k <= 0)
                break;
            j += (size_t)k;
        }
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t dn = 0;
        if (j > i) {
            dn = utf8proc_map(s + i, (utf8proc_ssize_t)(j - i), &dst,
                              UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (dn < 0) {
                rc = err_set(-EINVAL, "tokenizer: NFC failed at byte %zu: %s", i,
                             utf8proc_errmsg(dn));
                break;
            }
        }
        size_t need = len + (size_t)dn + 1;
        if (need > cap) {
            cap = 2 * need;
            uint8_t *nb = realloc(norm, cap);
            if (!nb) {
                free(dst);
                rc = err_set(-ENOMEM, "tokenizer: out of memory normalizing %zu bytes", n);
                break;
            }
            norm = nb;
        }
        if (dn > 0)
            memcpy(norm + len, dst, (size_t)dn);
        len += (size_t)dn;
        free(dst);
        if (j < n)
            norm[len++] = s[j++]; /* the invalid byte */
        i = j;
    }
    if (!rc)
        rc = pretokenize(e, norm, len, 0);
    free(norm);
    return rc;
}

/* The added token starting at s (longest first), or -1. */
static int32_t added_match(const struct tokenizer *tok, const uint8_t *s, size_t n, bool special)
{
    for (uint32_t k = tok->added_first[s[0]]; k < tok->added_first[s[0] + 1]; k++) {
        const struct tok_entry *e = &tok->entries[tok->added[k]];
        if (e->type == TOKENIZER_TOKEN_CONTROL && !special)
            continue;
        if (e->text_len <= n && memcmp(tok->text + e->text_off, s, e->text_len) == 0)
            return tok->added[k];
    }
    return -1;
}

int tokenizer_encode(const struct tokenizer *tok, const char *text, size_t len, uint32_t flags,
                     int32_t *ids, size_t cap)
{
    if (!text && len)
        return err_set(-EINVAL, "tokenizer_encode: NULL text of %zu bytes", len);
    if (!ids && cap)
        return err_set(-EINVAL, "tokenizer_encode: NULL ids with capacity %zu", cap);
    struct encoder e = {.tok = tok, .ids = ids, .cap = cap};
    int rc = 0;
    for (uint32_t k = 0; k < tok->n_re; k++) {
        e.md[k] = pcre2_match_data_create_from_pattern(tok->re[k], NULL);
        if (!e.md[k]) {
            rc = err_set(-ENOMEM, "tokenizer: out of memory");
            goto out;
        }
    }
    if ((flags & TOKENIZER_ENCODE_ADD_SPECIAL) && (tok->flags & TOKENIZER_VOCAB_ADD_BOS) &&
        tok->bos_id >= 0)
        encoder_push(&e, tok->bos_id);

    const uint8_t *s = (const uint8_t *)text;
    bool special = flags & TOKENIZER_ENCODE_PARSE_SPECIAL;
    size_t seg = 0;
    for (size_t i = 0; i < len;) {
        if (tok->added_first[s[i]] == tok->added_first[s[i] + 1]) {
            i++;
            continue;
        }
        int32_t id = added_match(tok, s + i, len - i, special);
        if (id < 0) {
            i++;
            continue;
        }
        if ((rc = encode_segment(&e, s + seg, i - seg)))
            goto out;
        encoder_push(&e, id);
        i += tok->entries[id].text_len;
        seg = i;
    }
    if ((rc = encode_segment(&e, s + seg, len - seg)))
        goto out;
    if ((flags & TOKENIZER_ENCODE_ADD_SPECIAL) && (tok->flags & TOKENIZER_VOCAB_ADD_EOS) &&
        tok->eos_id >= 0)
        encoder_push(&e, tok->eos_id);
    if (e.count > INT32_MAX)
        rc = err_set(-EOVERFLOW, "tokenizer: %zu tokens", e.count);
out:
    for (uint32_t k = 0; k < tok->n_re; k++)
        pcre2_match_data_free(e.md[k]);
    free(e.sym_id);
    free(e.sym_prev);
    free(e.sym_next);
    free(e.heap);
    free(e.buf);
    return rc ? rc : (int)e.count;
}

/* ---- decode ------------------------------------------------------------------------------- */

const uint8_t *tokenizer_token_bytes(const struct tokenizer *tok, int32_t id, size_t *len)
{
    if (id < 0 || (uint32_t)id >= tok->n_vocab) {
        *len = 0;
        return NULL;
    }
    *len = tok->entries[id].bytes_len;
    return tok->bytes + tok->entries[id].bytes_off;
}

static bool decode_skips(const struct tokenizer *tok, int32_t id, uint32_t flags)
{
    return (flags & TOKENIZER_DECODE_SKIP_CONTROL) &&
           tok->entries[id].type == TOKENIZER_TOKEN_CONTROL;
}

long tokenizer_decode(const struct tokenizer *tok, const int32_t *ids, size_t n, uint32_t flags,
                      char *out, size_t cap)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t bl;
        const uint8_t *b = tokenizer_token_bytes(tok, ids[i], &bl);
        if (!b)
            return err_set(-EINVAL, "tokenizer_decode: id %d at %zu is outside the vocabulary "
                           "(%u tokens)", ids[i], i, tok->n_vocab);
        if (decode_skips(tok, ids[i], flags))
            continue;
        if (total < cap)
            memcpy(out + total, b, bl < cap - total ? bl : cap - total);
        total += bl;
    }
    if (total > LONG_MAX)
        return err_set(-EOVERFLOW, "tokenizer_decode: %zu bytes", total);
    return (long)total;
}

void tokenizer_stream_init(struct tokenizer_stream *s, uint32_t flags)
{
    memset(s, 0, sizeof(*s));
    s->flags = flags;
}

/* Length of the UTF-8 sequence lead byte B starts, or 0 if B cannot start one. */
static int utf8_seq_len(uint8_t b)
{
    if (b < 0x80)
        return 1;
    if (b >= 0xC2 && b <= 0xDF)
        return 2;
    if (b >= 0xE0 && b <= 0xEF)
        return 3;
    if (b >= 0xF0 && b <= 0xF4)
        return 4;
    return 0;
}

/* Whether s[0..n) (n shorter than its sequence) can still grow into a valid character. */
static bool utf8_valid_prefix(const uint8_t *s, size_t n)
{
    if (n >= 2) {
        uint8_t a = s[0], b = s[1];
        uint8_t lo = 0x80, hi = 0xBF;
        if (a == 0xE0)
            lo = 0xA0;
        else if (a == 0xED)
            hi = 0x9F;
        else if (a == 0xF0)
            lo = 0x90;
        else if (a == 0xF4)
            hi = 0x8F;
        if (b < lo || b > hi)
            return false;
    }
    for (size_t i = 2; i < n; i++)
        if ((s[i] & 0xC0) != 0x80)
            return false;
    return true;
}

/* Where the incomplete tail of s[0..n) starts (n when the text ends on a boundary). */
static size_t utf8_incomplete_tail(const uint8_t *s, size_t n)
{
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        uint8_t b = s[n - back];
        if ((b & 0xC0) == 0x80)
            continue; /* continuation byte: look further back for the lead */
        int need = utf8_seq_len(b);
        if (need > (int)back && utf8_valid_prefix(s + n - back, back))
            return n - back;
        return n;
    }
    return n;
}

int tokenizer_stream_feed(const struct tokenizer *tok, struct tokenizer_stream *s, int32_t id,
                          char *out, size_t cap)
{
    size_t bl;
    const uint8_t *b = tokenizer_token_bytes(tok, id, &bl);
    if (!b)
        return err_set(-EINVAL, "tokenizer_stream_feed: id %d is outside the vocabulary (%u "
                       "tokens)", id, tok->n_vocab);
    if (decode_skips(tok, id, s->flags))
        bl = 0;
    if (bl > INT_MAX - 4)
        return err_set(-EOVERFLOW, "tokenizer_stream_feed: token of %zu bytes", bl);
    /* The stream so far ends with pending + token; an incomplete character at its end lies
     * within the last 3 bytes. Byte i of pending + token: */
    size_t np = s->n_pending, total = np + bl;
#define STREAM_BYTE(i) ((i) < np ? s->pending[(i)] : b[(i) - np])
    uint8_t last[3];
    size_t nl = total < 3 ? total : 3;
    for (size_t i = 0; i < nl; i++)
        last[i] = STREAM_BYTE(total - nl + i);
    size_t hold = nl - utf8_incomplete_tail(last, nl);
    size_t emit = total - hold;
    if (emit > cap)
        return -ENOSPC;
    size_t from_pending = emit < np ? emit : np;
    if (from_pending)
        memcpy(out, s->pending, from_pending);
    if (emit > from_pending)
        memcpy(out + from_pending, b, emit - from_pending);
    uint8_t tail[3];
    for (size_t i = emit; i < total; i++)
        tail[i - emit] = STREAM_BYTE(i);
#undef STREAM_BYTE
    memcpy(s->pending, tail, hold);
    s->n_pending = (uint32_t)hold;
    return (int)emit;
}

int tokenizer_stream_flush(struct tokenizer_stream *s, char *out, size_t cap)
{
    if (s->n_pending > cap)
        return -ENOSPC;
    int n = (int)s->n_pending;
    if (n)
        memcpy(out, s->pending, s->n_pending);
    s->n_pending = 0;
    return n;
}

/* ---- lookups ------------------------------------------------------------------------------ */

uint32_t tokenizer_n_vocab(const struct tokenizer *tok)
{
    return tok->n_vocab;
}

int32_t tokenizer_token_find(const struct tokenizer *tok, const char *text, size_t len)
{
    return text_find(tok, text, len);
}

enum tokenizer_token_type tokenizer_token_type(const struct tokenizer *tok, int32_t id)
{
    if (id < 0 || (uint32_t)id >= tok->n_vocab)
        return TOKENIZER_TOKEN_UNUSED;
    return (enum tokenizer_token_type)tok->entries[id].type;
}

int32_t tokenizer_bos(const struct tokenizer *tok)
{
    return tok->bos_id;
}

int32_t tokenizer_eos(const struct tokenizer *tok)
{
    return tok->eos_id;
}

bool tokenizer_is_eog(const struct tokenizer *tok, int32_t id)
{
    return id >= 0 && (uint32_t)id < tok->n_vocab && tok->entries[id].eog;
}

uint32_t tokenizer_pre_regex(const struct tokenizer *tok, const char *const **regex)
{
    *regex = (const char *const *)tok->re_src;
    return tok->n_re;
}

const char *tokenizer_pre_name(const struct tokenizer *tok)
{
    return tok->pre_name;
}
