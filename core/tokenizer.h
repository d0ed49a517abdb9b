/* tokenizer: byte-level BPE (GGUF tokenizer.ggml.model "gpt2": Qwen2/3, gpt-oss, DeepSeek-V3,
 * Llama-3), encode and decode, matching Hugging Face `tokenizers` on the same vocabulary.
 *
 * Encode pipeline: split the text on added tokens (leftmost-longest; USER_DEFINED tokens always,
 * CONTROL tokens only with TOKENIZER_ENCODE_PARSE_SPECIAL); NFC-normalize each remaining segment
 * when the vocabulary asks for it (utf8proc); cut it into pieces with the pre-tokenizer regexes
 * (PCRE2 with JIT, applied in sequence; both matches and the gaps between them become pieces);
 * map each piece's bytes to their byte-level symbols and merge adjacent symbols by lowest merge
 * rank (ties: leftmost), with a heap, so a piece of n bytes costs O(n log n).
 *
 * Invalid UTF-8 in the input never matches a regex, so each invalid byte becomes a piece of its
 * own and is encoded as its byte token; decoding gives the same bytes back.
 *
 * A tokenizer is immutable after open: encode and decode may run from several threads at once.
 * The GGUF keys: docs/formats.md §5 (tokenizer.json: §6.5); docs/tokenizer.md.
 */
#ifndef STRATA_TOKENIZER_H
#define STRATA_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gguf_file;

/* tokenizer.ggml.token_type values. */
enum tokenizer_token_type {
    TOKENIZER_TOKEN_NORMAL = 1,       /* text is byte-level encoded; decoded through the byte map */
    TOKENIZER_TOKEN_UNKNOWN = 2,
    TOKENIZER_TOKEN_CONTROL = 3,      /* special added token: raw text, parsed on request */
    TOKENIZER_TOKEN_USER_DEFINED = 4, /* non-special added token: raw text, always matched */
    TOKENIZER_TOKEN_UNUSED = 5,       /* padding entry: never produced, decodes to nothing */
    TOKENIZER_TOKEN_BYTE = 6,         /* SentencePiece byte token; not used by byte-level BPE */
};

/* struct tokenizer_vocab.flags */
enum tokenizer_vocab_flags {
    TOKENIZER_VOCAB_NFC = 1u << 0,           /* NFC-normalize text outside added tokens */
    TOKENIZER_VOCAB_IGNORE_MERGES = 1u << 1, /* a piece that is a whole token is emitted as is */
    TOKENIZER_VOCAB_ADD_BOS = 1u << 2,       /* TOKENIZER_ENCODE_ADD_SPECIAL prepends bos_id */
    TOKENIZER_VOCAB_ADD_EOS = 1u << 3,       /* TOKENIZER_ENCODE_ADD_SPECIAL appends eos_id */
};

#define TOKENIZER_MAX_PRE_REGEX 4

/* A vocabulary described by caller-owned arrays (GGUF-style); tokenizer_open_vocab copies what
 * it keeps, so the arrays may go away after the call. */
struct tokenizer_vocab {
    uint32_t n_tokens;
    const char *const *tokens;   /* (n_tokens) text as stored: byte-level encoded for NORMAL */
    const uint32_t *token_lens;  /* (n_tokens) byte lengths, or NULL: tokens are NUL-terminated */
    const int32_t *token_types;  /* (n_tokens) enum tokenizer_token_type, or NULL: all NORMAL */
    uint32_t n_merges;
    const char *const *merges;   /* (n_merges) "left right", rank = index */
    const uint32_t *merge_lens;  /* (n_merges) byte lengths, or NULL: NUL-terminated */
    /* Pre-tokenizer: n_pre_regex Split patterns (Hugging Face regex syntax), applied in order.
     * When n_pre_regex is 0, the patterns of the GGUF name `pre` are used (see
     * tokenizer_pre_find). */
    const char *pre;                                /* GGUF tokenizer.ggml.pre, or NULL */
    uint32_t n_pre_regex;
    const char *pre_regex[TOKENIZER_MAX_PRE_REGEX]; /* NUL-terminated patterns */
    uint32_t flags;                                 /* enum tokenizer_vocab_flags */
    int32_t bos_id, eos_id, eot_id, eom_id, unk_id, pad_id; /* -1 when absent */
};

/* What a GGUF pre-tokenizer name stands for. */
struct tokenizer_pre {
    const char *name;                               /* "qwen2", "llama-bpe", "gpt-4o", ... */
    uint32_t n_regex;
    const char *regex[TOKENIZER_MAX_PRE_REGEX];     /* static strings */
    uint32_t flags;                                 /* TOKENIZER_VOCAB_NFC / _IGNORE_MERGES */
};

/* The built-in pre-tokenizer named NAME, or NULL when strata does not know it. */
const struct tokenizer_pre *tokenizer_pre_find(const char *name);
/* The built-in pre-tokenizer whose regex list equals (n, regex), or NULL. */
const struct tokenizer_pre *tokenizer_pre_match(uint32_t n, const char *const *regex);

struct tokenizer;

/* Builds a tokenizer from in-memory arrays. 0 or -errno (-EINVAL: inconsistent vocabulary, a
 * regex that does not compile; -ENOTSUP: unknown pre name; -ENOMEM). */
int tokenizer_open_vocab(const struct tokenizer_vocab *v, struct tokenizer **out);

/* Builds a tokenizer from the tokenizer.ggml.* keys of F (model must be "gpt2"). F may be closed
 * afterwards. 0 or -errno; the message names the key. */
int tokenizer_open_gguf(const struct gguf_file *f, struct tokenizer **out);

void tokenizer_close(struct tokenizer *tok);

/* tokenizer_encode flags */
enum tokenizer_encode_flags {
    TOKENIZER_ENCODE_PARSE_SPECIAL = 1u << 0, /* CONTROL token texts in the input become ids */
    TOKENIZER_ENCODE_ADD_SPECIAL = 1u << 1,   /* BOS/EOS as the vocabulary's add_bos/add_eos say */
};

/* Encodes LEN bytes of TEXT (need not be NUL-terminated, may contain NUL and invalid UTF-8).
 * Writes at most CAP ids and returns the number of ids the text encodes to, which may exceed
 * CAP (then only the first CAP were written: call again with a larger buffer), or -errno
 * (-ENOMEM, -EOVERFLOW past INT32_MAX ids, -EINVAL when a byte has no token). */
int tokenizer_encode(const struct tokenizer *tok, const char *text, size_t len, uint32_t flags,
                     int32_t *ids, size_t cap);

/* tokenizer_decode / tokenizer_stream flags */
enum tokenizer_decode_flags {
    TOKENIZER_DECODE_SKIP_CONTROL = 1u << 0, /* CONTROL tokens decode to nothing */
};

/* The bytes token ID stands for (byte-level decoded for NORMAL tokens, raw text for added ones,
 * nothing for UNUSED); *len receives their count. NULL for an id out of range. The bytes are
 * not NUL-terminated and may be an incomplete UTF-8 sequence. */
const uint8_t *tokenizer_token_bytes(const struct tokenizer *tok, int32_t id, size_t *len);

/* Decodes N ids into OUT (CAP bytes). Returns the byte count of the full text, which may exceed
 * CAP (then the output is truncated), or -EINVAL for an id out of range. The output is exactly
 * the concatenation of the tokens' bytes and is not NUL-terminated. */
long tokenizer_decode(const struct tokenizer *tok, const int32_t *ids, size_t n, uint32_t flags,
                      char *out, size_t cap);

/* Streaming decoder: feed tokens one at a time; it emits only whole UTF-8 characters and holds
 * an incomplete trailing sequence until the next token completes it. Bytes that cannot start or
 * continue a valid sequence are emitted as they are, so the concatenated output of all calls
 * plus the final flush equals tokenizer_decode of the same ids, byte for byte. */
struct tokenizer_stream {
    uint8_t pending[4]; /* an incomplete UTF-8 prefix (at most 3 bytes) */
    uint32_t n_pending;
    uint32_t flags;     /* enum tokenizer_decode_flags */
};

#define TOKENIZER_STREAM_MAX_PIECE 3 /* bytes a call may emit beyond the token's own */

void tokenizer_stream_init(struct tokenizer_stream *s, uint32_t flags);

/* Appends the complete characters now available after token ID to OUT. Returns the bytes
 * written, -ENOSPC when CAP is too small (nothing written, state unchanged; a CAP of the token's
 * length + TOKENIZER_STREAM_MAX_PIECE always suffices), -EINVAL for a bad id. */
int tokenizer_stream_feed(const struct tokenizer *tok, struct tokenizer_stream *s, int32_t id,
                          char *out, size_t cap);

/* Emits what is held (an incomplete sequence at the end of the text) and resets. Returns the
 * bytes written (at most 3) or -ENOSPC. */
int tokenizer_stream_flush(struct tokenizer_stream *s, char *out, size_t cap);

/* Lookups */
uint32_t tokenizer_n_vocab(const struct tokenizer *tok);
/* Id of the token whose stored text is exactly TEXT (any type), or -1. */
int32_t tokenizer_token_find(const struct tokenizer *tok, const char *text, size_t len);
enum tokenizer_token_type tokenizer_token_type(const struct tokenizer *tok, int32_t id);
int32_t tokenizer_bos(const struct tokenizer *tok); /* -1 when none */
int32_t tokenizer_eos(const struct tokenizer *tok); /* -1 when none */
/* End of generation: eos/eot/eom ids, and CONTROL tokens with a well-known end text
 * (<|im_end|>, <|endoftext|>, <|return|>, <|call|>, <|eot_id|>, <｜end▁of▁sentence｜>...). */
bool tokenizer_is_eog(const struct tokenizer *tok, int32_t id);
/* The pre-tokenizer patterns in use, and its GGUF name ("" when built from bare patterns). */
uint32_t tokenizer_pre_regex(const struct tokenizer *tok, const char *const **regex);
const char *tokenizer_pre_name(const struct tokenizer *tok);

/* The GPT-2 byte-level map: the code point that stands for byte B in token text. */
uint32_t tokenizer_byte_to_codepoint(uint8_t b);

#endif
