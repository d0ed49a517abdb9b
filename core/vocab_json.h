/* vocab_json: reads a Hugging Face tokenizer.json (byte-level BPE) into a GGUF-style vocabulary:
 * tokens by id as stored (byte-level encoded), token types, merges as "left right", added
 * tokens, the pre-tokenizer's Split regexes and the GGUF pre name they correspond to.
 *
 * Token types: model vocabulary entries are NORMAL (1); added tokens are CONTROL (3) when
 * "special" is true, else USER_DEFINED (4); ids that neither defines (gaps) are "[PAD<id>]"
 * UNUSED (5). The text of an added token is its raw "content".
 *
 * What is accepted (anything else fails with -ENOTSUP and a message naming the field):
 *   model      BPE without byte_fallback, dropout, continuing_subword_prefix or end_of_word_suffix
 *   normalizer null, NFC, or a Sequence of those
 *   pre_tokenizer  ByteLevel, Split (Regex pattern, behavior Isolated, invert false), or a
 *              Sequence of Splits followed by ByteLevel; ByteLevel with use_regex adds the GPT-2
 *              pattern; add_prefix_space must be false
 *   decoder    ByteLevel or null
 * Merges may be "left right" strings or [left, right] arrays (tokenizers >= 0.20).
 */
#ifndef STRATA_VOCAB_JSON_H
#define STRATA_VOCAB_JSON_H

#include <stdbool.h>
#include <stdint.h>

#include "tokenizer.h"

struct vocab_json_added {
    int32_t id;
    const char *content; /* NUL-terminated view into the owning vocab_json's storage */
    bool special, lstrip, rstrip, single_word, normalized;
};

struct vocab_json_block;

struct vocab_json {
    /* Views into the storage below; pass &vj->vocab to tokenizer_open_vocab. bos/eos/pad come
     * from vocab_json_load_config; unk_id from model.unk_token. */
    struct tokenizer_vocab vocab;
    uint32_t n_added;
    struct vocab_json_added *added; /* (n_added) owned, in file order */
    char *path;                     /* owned copy of the tokenizer.json path */
    /* Storage (owned): the arrays vocab points to, and the blocks holding every string. */
    char **tokens;          /* (vocab.n_tokens) views into blocks */
    uint32_t *token_lens;   /* (vocab.n_tokens) */
    int32_t *token_types;   /* (vocab.n_tokens) */
    char **merges;          /* (vocab.n_merges) views into blocks */
    uint32_t *merge_lens;   /* (vocab.n_merges) */
    struct vocab_json_block *blocks; /* owned list of string blocks */
};

/* Reads PATH. 0 or -errno (-ENOENT/-EIO: the file; -EINVAL: malformed JSON or a missing or
 * mistyped field, named in the message; -ENOTSUP: a feature listed above as unsupported). */
int vocab_json_load(const char *path, struct vocab_json **out);

/* Reads a tokenizer_config.json next to it: add_bos_token / add_eos_token, and bos_token /
 * eos_token / pad_token (a string or an {"content": ...} object) resolved to ids. Keys that are
 * absent or null leave the vocabulary unchanged. 0 or -errno. */
int vocab_json_load_config(struct vocab_json *vj, const char *config_path);

/* Extends the vocabulary to N_TOKENS entries with "[PAD<id>]" UNUSED tokens (a checkpoint's
 * vocab_size is often larger than its tokenizer). No-op when already that large. 0 or -ENOMEM. */
int vocab_json_pad(struct vocab_json *vj, uint32_t n_tokens);

void vocab_json_free(struct vocab_json *vj);

#endif
