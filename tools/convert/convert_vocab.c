/* The tokenizer.* keys of a converted file, from tokenizer.json (core/vocab_json.h),
 * tokenizer_config.json and chat_template.jinja. Formats: docs/formats.md §5, §6.5. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <json-c/json.h>

#include "convert_priv.h"
#include "errors.h"
#include "gguf.h"
#include "hf_ckpt.h"
#include "tokenizer.h"
#include "vocab_json.h"

/* Reads a whole text file into a malloc'd NUL-terminated string; NULL with a message. */
static char *file_read(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;

    if (!f) {
        err_set(-errno, "%s: %s", path, strerror(errno));
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = '\0';
    } else {
        free(buf);
        buf = NULL;
        err_set(-EIO, "%s: cannot read", path);
    }
    fclose(f);
    return buf;
}

/* tokenizer.chat_template (and .NAME variants) from chat_template.jinja, which newer
 * transformers write, or tokenizer_config.json's chat_template (a string or a list of
 * {name, template}). */
static int add_chat_template(const struct convert_config *cfg, struct hf_ckpt *c,
                             struct gguf_writer *w)
{
    char path[4096], key[256];
    json_object *tc, *ct;
    int rc = 0;

    if (hf_ckpt_path(c, "chat_template.jinja", path, sizeof(path)) && access(path, R_OK) == 0) {
        char *text = file_read(path);
        if (!text)
            return -EIO;
        rc = gguf_writer_add_str(w, "tokenizer.chat_template", text);
        free(text);
        return rc;
    }
    if (!hf_ckpt_path(c, "tokenizer_config.json", path, sizeof(path)) || access(path, R_OK))
        return 0;
    if (!(tc = json_object_from_file(path)))
        return err_set(-EINVAL, "%s: not valid JSON: %s", path, json_util_get_last_err());
    if (!json_object_object_get_ex(tc, "chat_template", &ct) ||
        json_object_is_type(ct, json_type_null)) {
        convert_notice(cfg, "no chat template (chat_template.jinja or tokenizer_config.json)");
    } else if (json_object_is_type(ct, json_type_string)) {
        rc = gguf_writer_add_str(w, "tokenizer.chat_template", json_object_get_string(ct));
    } else if (json_object_is_type(ct, json_type_array)) {
        for (size_t i = 0; !rc && i < json_object_array_length(ct); i++) {
            json_object *e = json_object_array_get_idx(ct, i), *n, *t;
            if (!json_object_object_get_ex(e, "name", &n) ||
                !json_object_object_get_ex(e, "template", &t) ||
                !json_object_is_type(n, json_type_string) ||
                !json_object_is_type(t, json_type_string)) {
                rc = err_set(-EINVAL, "%s: chat_template[%zu] needs string name and template", path,
                             i);
                break;
            }
            const char *name = json_object_get_string(n);
            if (!strcmp(name, "default"))
                snprintf(key, sizeof(key), "tokenizer.chat_template");
            else
                snprintf(key, sizeof(key), "tokenizer.chat_template.%s", name);
            rc = gguf_writer_add_str(w, key, json_object_get_string(t));
        }
    } else {
        rc = err_set(-EINVAL, "%s: chat_template is neither a string nor a list", path);
    }
    json_object_put(tc);
    return rc;
}

/* config.json's KEY (an integer, or the first of a list) when it is a valid id; from the text
 * config (text_config) first, then the top level. */
static int32_t config_id(const struct hf_ckpt *c, const char *key, uint32_t n_vocab)
{
    json_object *v = hf_ckpt_config_get(c, key);
    if (!v && c->config != c->config_root &&
        (!json_object_object_get_ex(c->config_root, key, &v) ||
         json_object_is_type(v, json_type_null)))
        v = NULL;
    if (v && json_object_is_type(v, json_type_array))
        v = json_object_array_length(v) ? json_object_array_get_idx(v, 0) : NULL;
    if (!v || !json_object_is_type(v, json_type_int))
        return -1;
    int64_t id = json_object_get_int64(v);
    return id >= 0 && id < n_vocab ? (int32_t)id : -1;
}

/* Loads tokenizer.json (+ tokenizer_config.json) and pads it to n_vocab. */
static int vocab_load(const struct convert_config *cfg, struct hf_ckpt *c, uint32_t n_vocab,
                      struct vocab_json **out)
{
    char path[4096];
    struct vocab_json *vj;
    int rc;

    if (!hf_ckpt_path(c, "tokenizer.json", path, sizeof(path)))
        return err_set(-ENAMETOOLONG, "%s: path too long", c->dir);
    if ((rc = vocab_json_load(path, &vj)))
        return rc;
    hf_ckpt_path(c, "tokenizer_config.json", path, sizeof(path));
    if (access(path, R_OK) == 0 && (rc = vocab_json_load_config(vj, path)))
        goto out_free;
    if (!vj->vocab.pre) {
        rc = err_set(-ENOTSUP,
                     "%s/tokenizer.json: its pre-tokenizer regex is not one strata "
                     "knows (known: qwen2, llama-bpe, gpt-4o, deepseek-v3, gpt-2)",
                     c->dir);
        goto out_free;
    }
    if (vj->vocab.n_tokens > n_vocab) {
        rc = err_set(-EINVAL, "%s/tokenizer.json has %u tokens, more than vocab_size %u", c->dir,
                     vj->vocab.n_tokens, n_vocab);
        goto out_free;
    }
    const struct tokenizer_pre *pre = tokenizer_pre_find(vj->vocab.pre);
    if (pre && (pre->flags & TOKENIZER_VOCAB_NFC) != (vj->vocab.flags & TOKENIZER_VOCAB_NFC))
        convert_notice(cfg,
                       "tokenizer.json %s NFC-normalize, but the GGUF pre-tokenizer '%s' "
                       "%s: strata will follow the GGUF",
                       vj->vocab.flags & TOKENIZER_VOCAB_NFC ? "does" : "does not", pre->name,
                       pre->flags & TOKENIZER_VOCAB_NFC ? "does" : "does not");
    if ((rc = vocab_json_pad(vj, n_vocab)))
        goto out_free;
    if (vj->vocab.bos_id < 0)
        vj->vocab.bos_id = config_id(c, "bos_token_id", n_vocab);
    if (vj->vocab.eos_id < 0)
        vj->vocab.eos_id = config_id(c, "eos_token_id", n_vocab);
    if (vj->vocab.pad_id < 0)
        vj->vocab.pad_id = config_id(c, "pad_token_id", n_vocab);
    *out = vj;
    return 0;

out_free:
    vocab_json_free(vj);
    return rc;
}

static int add_id(struct gguf_writer *w, const char *key, int32_t id)
{
    return id < 0 ? 0 : gguf_writer_add_u32(w, key, (uint32_t)id);
}

int convert_vocab_add(const struct convert_config *cfg, struct hf_ckpt *c, struct gguf_writer *w,
                      uint32_t n_vocab, uint32_t *n_written)
{
    struct vocab_json *vj = NULL;
    uint64_t *lens = NULL;
    int rc = vocab_load(cfg, c, n_vocab, &vj);

    if (rc)
        return rc;
    const struct tokenizer_vocab *v = &vj->vocab;
    uint32_t n_lens = v->n_tokens > v->n_merges ? v->n_tokens : v->n_merges;
    lens = malloc((n_lens ? n_lens : 1) * sizeof(*lens));
    if (!lens) {
        rc = err_set(-ENOMEM, "out of memory");
        goto out;
    }
    rc = rc ? rc : gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
    rc = rc ? rc : gguf_writer_add_str(w, "tokenizer.ggml.pre", v->pre);
    for (uint32_t i = 0; i < v->n_tokens; i++)
        lens[i] = v->token_lens[i];
    rc =
        rc ? rc : gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", v->tokens, lens, v->n_tokens);
    rc = rc ? rc
            : gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v->token_types,
                                  v->n_tokens);
    for (uint32_t i = 0; i < v->n_merges; i++)
        lens[i] = v->merge_lens[i];
    rc =
        rc ? rc : gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", v->merges, lens, v->n_merges);
    rc = rc ? rc : add_id(w, "tokenizer.ggml.bos_token_id", v->bos_id);
    rc = rc ? rc : add_id(w, "tokenizer.ggml.eos_token_id", v->eos_id);
    rc = rc ? rc : add_id(w, "tokenizer.ggml.unknown_token_id", v->unk_id);
    rc = rc ? rc : add_id(w, "tokenizer.ggml.padding_token_id", v->pad_id);
    rc = rc ? rc
            : gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token",
                                   v->flags & TOKENIZER_VOCAB_ADD_BOS);
    rc = rc ? rc
            : gguf_writer_add_bool(w, "tokenizer.ggml.add_eos_token",
                                   v->flags & TOKENIZER_VOCAB_ADD_EOS);
    rc = rc ? rc : add_chat_template(cfg, c, w);
    if (!rc)
        *n_written = v->n_tokens;
out:
    free(lens);
    vocab_json_free(vj);
    return rc;
}
