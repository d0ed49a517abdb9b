/* convert_priv: what the pieces of the converter share (not part of its API). */
#ifndef STRATA_CONVERT_PRIV_H
#define STRATA_CONVERT_PRIV_H

#include <stdint.h>

#include "convert.h"

struct gguf_writer;
struct hf_ckpt;

/* The architectures strata converts: config.json's model_type / architectures[0]. */
enum convert_arch {
    CONVERT_ARCH_QWEN3MOE, /* qwen3_moe, Qwen3MoeForCausalLM */
    CONVERT_ARCH_GPTOSS,   /* gpt_oss, GptOssForCausalLM */
};

/* Sends a NOTICE event to cfg->progress (printf-style). */
void convert_notice(const struct convert_config *cfg, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Sends a WARNING event to cfg->progress (printf-style). */
void convert_warning(const struct convert_config *cfg, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Checks every member of c's config.json (and of its rope_scaling / rope_parameters objects)
 * against the architecture's key table of convert_keys.c (docs/convert-keys.md). 0, or
 * -ENOTSUP naming the key, its value and why for a value strata does not compute, for keys
 * that transformers versions read differently and disagree, and for a key the table lacks (a
 * WARNING event instead when cfg->allow_unknown_keys); -EINVAL for a malformed rope_theta. */
int convert_keys_check(const struct convert_config *cfg, const struct hf_ckpt *c,
                       enum convert_arch arch);

/* Adds the tokenizer.* keys from c's tokenizer.json (+ tokenizer_config.json, chat_template.jinja),
 * padded to n_vocab tokens; *n_written receives the token count. 0 or -errno. */
int convert_vocab_add(const struct convert_config *cfg, struct hf_ckpt *c, struct gguf_writer *w,
                      uint32_t n_vocab, uint32_t *n_written);

#endif
