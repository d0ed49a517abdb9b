/* vocab_json: Hugging Face tokenizer.json -> GGUF-style vocabulary. See vocab_json.h. */
#include "vocab_json.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <json-c/json.h>

#include "errors.h"

struct vocab_json_block {
    struct vocab_json_block *next;
    size_t used, cap;
    char data[];
};

/* N bytes of string storage owned by VJ, or NULL. */
static char *vj_alloc(struct vocab_json *vj, size_t n)
{
    struct vocab_json_block *b = vj->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > (1u << 20) ? n : (1u << 20);
        b = malloc(sizeof(*b) + cap);
        if (!b)
            return NULL;
        b->next = vj->blocks;
        b->used = 0;
        b->cap = cap;
        vj->blocks = b;
    }
    char *p = b->data + b->used;
    b->used += n;
    return p;
}

static char *vj_strdup(struct vocab_json *vj, const char *s, size_t n)
{
    char *p = vj_alloc(vj, n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

static int oom(const struct vocab_json *vj)
{
    return err_set(-ENOMEM, "%s: out of memory", vj->path);
}

/* Member KEY of OBJ if it exists and is not null. */
static json_object *member(json_object *obj, const char *key)
{
    json_object *v = NULL;
    if (!obj || !json_object_is_type(obj, json_type_object) ||
        !json_object_object_get_ex(obj, key, &v))
        return NULL;
    return v;
}

static const char *member_string(json_object *obj, const char *key)
{
    json_object *v = member(obj, key);
    return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

static bool member_bool(json_object *obj, const char *key, bool dflt)
{
    json_object *v = member(obj, key);
    return v && json_object_is_type(v, json_type_boolean) ? json_object_get_boolean(v) : dflt;
}

static int parse_model(struct vocab_json *vj, json_object *model)
{
    const char *type = member_string(model, "type");
    if (!model || !json_object_is_type(model, json_type_object))
        return err_set(-EINVAL, "%s: no \"model\" object", vj->path);
    if (!type || strcmp(type, "BPE") != 0)
        return err_set(-ENOTSUP, "%s: model.type is '%s'; only BPE is supported", vj->path,
                       type ? type : "(missing)");
    if (member_bool(model, "byte_fallback", false))
        return err_set(-ENOTSUP, "%s: model.byte_fallback is not supported", vj->path);
    json_object *dropout = member(model, "dropout");
    if (dropout && json_object_get_double(dropout) != 0.0)
        return err_set(-ENOTSUP, "%s: model.dropout is not supported", vj->path);
    const char *keys[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const char *s = member_string(model, keys[i]);
        if (s && s[0])
            return err_set(-ENOTSUP, "%s: model.%s '%s' is not supported", vj->path, keys[i], s);
    }
    if (member_bool(model, "ignore_merges", false))
        vj->vocab.flags |= TOKENIZER_VOCAB_IGNORE_MERGES;
    return 0;
}

/* Fills tokens, lengths and types from model.vocab and added_tokens; gaps become [PAD<id>]. */
static int parse_tokens(struct vocab_json *vj, json_object *model, json_object *added)
{
    json_object *vocab = member(model, "vocab");
    if (!vocab || !json_object_is_type(vocab, json_type_object))
        return err_set(-EINVAL, "%s: model.vocab is missing or not an object", vj->path);
    if (added && !json_object_is_type(added, json_type_array))
        return err_set(-EINVAL, "%s: added_tokens is not an array", vj->path);

    int64_t max_id = -1;
    json_object_object_foreach(vocab, key, val)
    {
        if (!json_object_is_type(val, json_type_int))
            return err_set(-EINVAL, "%s: model.vocab['%s'] is not an integer id", vj->path, key);
        int64_t id = json_object_get_int64(val);
        if (id < 0 || id >= INT32_MAX)
            return err_set(-EINVAL, "%s: model.vocab['%s'] = %lld is out of range", vj->path,
                           key, (long long)id);
        if (id > max_id)
            max_id = id;
    }
    size_t n_added = added ? json_object_array_length(added) : 0;
    vj->added = calloc(n_added ? n_added : 1, sizeof(*vj->added));
    if (!vj->added)
        return oom(vj);
    for (size_t i = 0; i < n_added; i++) {
        json_object *a = json_object_array_get_idx(added, i);
        json_object *idv = member(a, "id");
        json_object *cv = member(a, "content");
        if (!idv || !json_object_is_type(idv, json_type_int) || !cv ||
            !json_object_is_type(cv, json_type_string))
            return err_set(-EINVAL, "%s: added_tokens[%zu] lacks an integer \"id\" or a string "
                           "\"content\"", vj->path, i);
        int64_t id = json_object_get_int64(idv);
        if (id < 0 || id >= INT32_MAX)
            return err_set(-EINVAL, "%s: added_tokens[%zu].id = %lld is out of range", vj->path,
                           i, (long long)id);
        struct vocab_json_added *t = &vj->added[i];
        t->id = (int32_t)id;
        t->content = vj_strdup(vj, json_object_get_string(cv),
                               (size_t)json_object_get_string_len(cv));
        if (!t->content)
            return oom(vj);
        t->special = member_bool(a, "special", false);
        t->lstrip = member_bool(a, "lstrip", false);
        t->rstrip = member_bool(a, "rstrip", false);
        t->single_word = member_bool(a, "single_word", false);
        t->normalized = member_bool(a, "normalized", false);
        if (id > max_id)
            max_id = id;
    }
    vj->n_added = (uint32_t)n_added;
    if (max_id < 0)
        return err_set(-EINVAL, "%s: model.vocab is empty", vj->path);

    uint32_t n = (uint32_t)max_id + 1;
    vj->tokens = calloc(n, sizeof(*vj->tokens));
    vj->token_lens = calloc(n, sizeof(*vj->token_lens));
    vj->token_types = calloc(n, sizeof(*vj->token_types));
    if (!vj->tokens || !vj->token_lens || !vj->token_types)
        return oom(vj);
    json_object_object_foreach(vocab, key2, val2)
    {
        int32_t id = (int32_t)json_object_get_int64(val2);
        if (vj->tokens[id])
            return err_set(-EINVAL, "%s: model.vocab gives id %d to both '%s' and '%s'", vj->path,
                           id, vj->tokens[id], key2);
        size_t len = strlen(key2);
        if (!(vj->tokens[id] = vj_strdup(vj, key2, len)))
            return oom(vj);
        vj->token_lens[id] = (uint32_t)len;
        vj->token_types[id] = TOKENIZER_TOKEN_NORMAL;
    }
    /* An added token's id may also be in model.vocab (DeepSeek); the added entry decides. */
    for (uint32_t i = 0; i < vj->n_added; i++) {
        const struct vocab_json_added *t = &vj->added[i];
        vj->tokens[t->id] = (char *)t->content;
        vj->token_lens[t->id] = (uint32_t)strlen(t->content);
        vj->token_types[t->id] =
            t->special ? TOKENIZER_TOKEN_CONTROL : TOKENIZER_TOKEN_USER_DEFINED;
    }
    for (uint32_t id = 0; id < n; id++) {
        if (vj->tokens[id])
            continue;
        char pad[24];
        int len = snprintf(pad, sizeof(pad), "[PAD%u]", id);
        if (!(vj->tokens[id] = vj_strdup(vj, pad, (size_t)len)))
            return oom(vj);
        vj->token_lens[id] = (uint32_t)len;
        vj->token_types[id] = TOKENIZER_TOKEN_UNUSED;
    }
    vj->vocab.n_tokens = n;
    return 0;
}

static bool json_is_array_of_2(json_object *m)
{
    return m && json_object_is_type(m, json_type_array) && json_object_array_length(m) == 2;
}

static int parse_merges(struct vocab_json *vj, json_object *model)
{
    json_object *merges = member(model, "merges");
    if (!merges) {
        vj->vocab.n_merges = 0;
        return 0;
    }
    if (!json_object_is_type(merges, json_type_array))
        return err_set(-EINVAL, "%s: model.merges is not an array", vj->path);
    size_t n = json_object_array_length(merges);
    if (n > INT32_MAX)
        return err_set(-EINVAL, "%s: %zu merges", vj->path, n);
    vj->merges = calloc(n ? n : 1, sizeof(*vj->merges));
    vj->merge_lens = calloc(n ? n : 1, sizeof(*vj->merge_lens));
    if (!vj->merges || !vj->merge_lens)
        return oom(vj);
    for (size_t i = 0; i < n; i++) {
        json_object *m = json_object_array_get_idx(merges, i);
        if (json_object_is_type(m, json_type_string)) {
            size_t len = (size_t)json_object_get_string_len(m);
            if (!(vj->merges[i] = vj_strdup(vj, json_object_get_string(m), len)))
                return oom(vj);
            vj->merge_lens[i] = (uint32_t)len;
            continue;
        }
        json_object *l = json_is_array_of_2(m) ? json_object_array_get_idx(m, 0) : NULL;
        json_object *r = l ? json_object_array_get_idx(m, 1) : NULL;
        if (!l || !r || !json_object_is_type(l, json_type_string) ||
            !json_object_is_type(r, json_type_string))
            return err_set(-EINVAL, "%s: model.merges[%zu] is neither \"left right\" nor "
                           "[left, right]", vj->path, i);
        size_t nl = (size_t)json_object_get_string_len(l);
        size_t nr = (size_t)json_object_get_string_len(r);
        const char *ls = json_object_get_string(l), *rs = json_object_get_string(r);
        /* "left right" splits at the first space after the first byte: a space inside a part
         * other than the first byte of left would make it ambiguous. */
        if (nl == 0 || nr == 0 || memchr(ls + 1, ' ', nl - 1) || memchr(rs, ' ', nr))
            return err_set(-ENOTSUP, "%s: model.merges[%zu] ['%s', '%s'] cannot be written as "
                           "\"left right\"", vj->path, i, ls, rs);
        char *s = vj_alloc(vj, nl + nr + 2);
        if (!s)
            return oom(vj);
        memcpy(s, ls, nl);
        s[nl] = ' ';
        memcpy(s + nl + 1, rs, nr);
        s[nl + nr + 1] = '\0';
        vj->merges[i] = s;
        vj->merge_lens[i] = (uint32_t)(nl + nr + 1);
    }
    vj->vocab.n_merges = (uint32_t)n;
    return 0;
}

static int add_regex(struct vocab_json *vj, const char *re)
{
    if (vj->vocab.n_pre_regex == TOKENIZER_MAX_PRE_REGEX)
        return err_set(-ENOTSUP, "%s: more than %d Split pre-tokenizers", vj->path,
                       TOKENIZER_MAX_PRE_REGEX);
    char *copy = vj_strdup(vj, re, strlen(re));
    if (!copy)
        return oom(vj);
    vj->vocab.pre_regex[vj->vocab.n_pre_regex++] = copy;
    return 0;
}

/* One element of the pre-tokenizer chain; *byte_level is set by ByteLevel. */
static int parse_pre_one(struct vocab_json *vj, json_object *p, size_t idx, bool *byte_level)
{
    const char *type = member_string(p, "type");
    if (!type)
        return err_set(-EINVAL, "%s: pre_tokenizer %zu has no type", vj->path, idx);
    if (strcmp(type, "ByteLevel") == 0) {
        if (member_bool(p, "add_prefix_space", false))
            return err_set(-ENOTSUP, "%s: pre_tokenizer ByteLevel.add_prefix_space is not "
                           "supported", vj->path);
        *byte_level = true;
        /* use_regex: GPT-2's pattern, the one the built-in "gpt-2" pre-tokenizer holds. */
        return member_bool(p, "use_regex", true)
                   ? add_regex(vj, tokenizer_pre_find("gpt-2")->regex[0])
                   : 0;
    }
    if (strcmp(type, "Split") == 0) {
        const char *re = member_string(member(p, "pattern"), "Regex");
        const char *behavior = member_string(p, "behavior");
        if (!re)
            return err_set(-ENOTSUP, "%s: pre_tokenizer %zu: Split without a Regex pattern is "
                           "not supported", vj->path, idx);
        if (!behavior || strcmp(behavior, "Isolated") != 0 || member_bool(p, "invert", false))
            return err_set(-ENOTSUP, "%s: pre_tokenizer %zu: Split behavior '%s'%s is not "
                           "supported (only Isolated)", vj->path, idx,
                           behavior ? behavior : "(missing)",
                           member_bool(p, "invert", false) ? " with invert" : "");
        if (*byte_level)
            return err_set(-ENOTSUP, "%s: pre_tokenizer %zu: a Split after ByteLevel is not "
                           "supported", vj->path, idx);
        return add_regex(vj, re);
    }
    return err_set(-ENOTSUP, "%s: pre_tokenizer type '%s' is not supported", vj->path, type);
}

static int parse_pre(struct vocab_json *vj, json_object *pre)
{
    bool byte_level = false;
    int rc = 0;
    const char *type = member_string(pre, "type");
    if (!pre)
        return err_set(-ENOTSUP, "%s: no pre_tokenizer (byte-level BPE needs one)", vj->path);
    if (type && strcmp(type, "Sequence") == 0) {
        json_object *list = member(pre, "pretokenizers");
        if (!list || !json_object_is_type(list, json_type_array))
            return err_set(-EINVAL, "%s: pre_tokenizer Sequence without a pretokenizers array",
                           vj->path);
        for (size_t i = 0; !rc && i < json_object_array_length(list); i++)
            rc = parse_pre_one(vj, json_object_array_get_idx(list, i), i, &byte_level);
    } else {
        rc = parse_pre_one(vj, pre, 0, &byte_level);
    }
    if (rc)
        return rc;
    if (!byte_level)
        return err_set(-ENOTSUP, "%s: the pre_tokenizer has no ByteLevel step", vj->path);
    if (vj->vocab.n_pre_regex == 0)
        return err_set(-ENOTSUP, "%s: the pre_tokenizer splits nothing (no Split regex and "
                       "ByteLevel.use_regex false)", vj->path);
    const struct tokenizer_pre *known = tokenizer_pre_match(vj->vocab.n_pre_regex,
                                                            vj->vocab.pre_regex);
    vj->vocab.pre = known ? known->name : NULL;
    return 0;
}

static int parse_normalizer(struct vocab_json *vj, json_object *norm)
{
    if (!norm)
        return 0;
    const char *type = member_string(norm, "type");
    if (type && strcmp(type, "NFC") == 0) {
        vj->vocab.flags |= TOKENIZER_VOCAB_NFC;
        return 0;
    }
    if (type && strcmp(type, "Sequence") == 0) {
        json_object *list = member(norm, "normalizers");
        if (!list || !json_object_is_type(list, json_type_array))
            return err_set(-EINVAL, "%s: normalizer Sequence without a normalizers array",
                           vj->path);
        for (size_t i = 0; i < json_object_array_length(list); i++) {
            int rc = parse_normalizer(vj, json_object_array_get_idx(list, i));
            if (rc)
                return rc;
        }
        return 0;
    }
    return err_set(-ENOTSUP, "%s: normalizer '%s' is not supported (only NFC)", vj->path,
                   type ? type : "(no type)");
}

static int parse_decoder(struct vocab_json *vj, json_object *dec)
{
    const char *type = member_string(dec, "type");
    if (!dec || (type && strcmp(type, "ByteLevel") == 0))
        return 0;
    return err_set(-ENOTSUP, "%s: decoder '%s' is not supported (only ByteLevel)", vj->path,
                   type ? type : "(no type)");
}

static int32_t find_token(const struct vocab_json *vj, const char *text)
{
    for (uint32_t id = 0; id < vj->vocab.n_tokens; id++)
        if (strcmp(vj->tokens[id], text) == 0)
            return (int32_t)id;
    return -1;
}

static void vocab_views(struct vocab_json *vj)
{
    vj->vocab.tokens = (const char *const *)vj->tokens;
    vj->vocab.token_lens = vj->token_lens;
    vj->vocab.token_types = vj->token_types;
    vj->vocab.merges = (const char *const *)vj->merges;
    vj->vocab.merge_lens = vj->merge_lens;
}

int vocab_json_load(const char *path, struct vocab_json **out)
{
    *out = NULL;
    if (access(path, R_OK) != 0)
        return err_set(-errno, "%s: %s", path, strerror(errno));
    json_object *root = json_object_from_file(path);
    if (!root)
        return err_set(-EINVAL, "%s: not valid JSON: %s", path, json_util_get_last_err());
    struct vocab_json *vj = calloc(1, sizeof(*vj));
    if (!vj) {
        json_object_put(root);
        return err_set(-ENOMEM, "%s: out of memory", path);
    }
    vj->vocab.bos_id = vj->vocab.eos_id = vj->vocab.eot_id = -1;
    vj->vocab.eom_id = vj->vocab.unk_id = vj->vocab.pad_id = -1;
    int rc = 0;
    if (!(vj->path = strdup(path)))
        rc = err_set(-ENOMEM, "%s: out of memory", path);
    json_object *model = member(root, "model");
    if (!rc && !json_object_is_type(root, json_type_object))
        rc = err_set(-EINVAL, "%s: the top level is not an object", path);
    if (!rc)
        rc = parse_model(vj, model);
    if (!rc)
        rc = parse_tokens(vj, model, member(root, "added_tokens"));
    if (!rc)
        rc = parse_merges(vj, model);
    if (!rc)
        rc = parse_pre(vj, member(root, "pre_tokenizer"));
    if (!rc)
        rc = parse_normalizer(vj, member(root, "normalizer"));
    if (!rc)
        rc = parse_decoder(vj, member(root, "decoder"));
    const char *unk = member_string(model, "unk_token");
    if (!rc && unk && (vj->vocab.unk_id = find_token(vj, unk)) < 0)
        rc = err_set(-EINVAL, "%s: model.unk_token '%s' is not in the vocabulary", path, unk);
    json_object_put(root);
    if (rc) {
        vocab_json_free(vj);
        return rc;
    }
    vocab_views(vj);
    *out = vj;
    return 0;
}

/* A special token in tokenizer_config.json: a string, or an object with "content". */
static const char *config_token(json_object *cfg, const char *key)
{
    json_object *v = member(cfg, key);
    if (!v)
        return NULL;
    if (json_object_is_type(v, json_type_string))
        return json_object_get_string(v);
    return member_string(v, "content");
}

int vocab_json_load_config(struct vocab_json *vj, const char *config_path)
{
    if (access(config_path, R_OK) != 0)
        return err_set(-errno, "%s: %s", config_path, strerror(errno));
    json_object *cfg = json_object_from_file(config_path);
    if (!cfg)
        return err_set(-EINVAL, "%s: not valid JSON: %s", config_path, json_util_get_last_err());
    int rc = 0;
    const char *keys[] = {"bos_token", "eos_token", "pad_token"};
    int32_t *ids[] = {&vj->vocab.bos_id, &vj->vocab.eos_id, &vj->vocab.pad_id};
    for (int i = 0; i < 3 && !rc; i++) {
        const char *text = config_token(cfg, keys[i]);
        if (!text)
            continue;
        int32_t id = find_token(vj, text);
        if (id < 0)
            rc = err_set(-EINVAL, "%s: %s '%s' is not in the vocabulary of %s", config_path,
                         keys[i], text, vj->path);
        *ids[i] = id;
    }
    json_object *b = member(cfg, "add_bos_token");
    if (b)
        vj->vocab.flags = json_object_get_boolean(b) ? vj->vocab.flags | TOKENIZER_VOCAB_ADD_BOS
                                                     : vj->vocab.flags & ~TOKENIZER_VOCAB_ADD_BOS;
    json_object *e = member(cfg, "add_eos_token");
    if (e)
        vj->vocab.flags = json_object_get_boolean(e) ? vj->vocab.flags | TOKENIZER_VOCAB_ADD_EOS
                                                     : vj->vocab.flags & ~TOKENIZER_VOCAB_ADD_EOS;
    json_object_put(cfg);
    return rc;
}

int vocab_json_pad(struct vocab_json *vj, uint32_t n_tokens)
{
    uint32_t old = vj->vocab.n_tokens;
    if (n_tokens <= old)
        return 0;
    char **t = realloc(vj->tokens, n_tokens * sizeof(*t));
    if (t)
        vj->tokens = t;
    uint32_t *l = realloc(vj->token_lens, n_tokens * sizeof(*l));
    if (l)
        vj->token_lens = l;
    int32_t *ty = realloc(vj->token_types, n_tokens * sizeof(*ty));
    if (ty)
        vj->token_types = ty;
    vocab_views(vj);
    if (!t || !l || !ty)
        return oom(vj);
    for (uint32_t id = old; id < n_tokens; id++) {
        char pad[24];
        int len = snprintf(pad, sizeof(pad), "[PAD%u]", id);
        if (!(vj->tokens[id] = vj_strdup(vj, pad, (size_t)len))) {
            vj->vocab.n_tokens = id;
            return oom(vj);
        }
        vj->token_lens[id] = (uint32_t)len;
        vj->token_types[id] = TOKENIZER_TOKEN_UNUSED;
    }
    vj->vocab.n_tokens = n_tokens;
    return 0;
}

void vocab_json_free(struct vocab_json *vj)
{
    if (!vj)
        return;
    while (vj->blocks) {
        struct vocab_json_block *next = vj->blocks->next;
        free(vj->blocks);
        vj->blocks = next;
    }
    free(vj->added);
    free(vj->tokens);
    free(vj->token_lens);
    free(vj->token_types);
    free(vj->merges);
    free(vj->merge_lens);
    free(vj->path);
    free(vj);
}
