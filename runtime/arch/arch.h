/* arch: the trunk forward of one architecture, written against the backend op table
 * (runtime/backend.h); its loader is in core/ (model_arch.h). */
#ifndef STRATA_ARCH_H
#define STRATA_ARCH_H

#include <stdint.h>

struct model;
struct backend;
struct stream;

struct arch {
    const char *name; /* general.architecture */
    /* Runs n_tok tokens of one stream from its current position, appends to its KV cache and
     * leaves the last position's logits (n_vocab floats) in s->logits (backend memory). */
    int (*forward)(struct backend *b, struct stream *s, const int32_t *ids, int n_tok);
};

/* The forward of the architecture named NAME, or NULL. */
const struct arch *arch_find(const char *name);

extern const struct arch arch_qwen3moe;

#endif
