/* arch: the trunk forward of one architecture, written against the backend op table
 * (runtime/backend.h); its loader is in core/ (model_arch.h). */
#ifndef STRATA_ARCH_H
#define STRATA_ARCH_H

#include <stdint.h>

struct model;
struct backend;
struct stream;
struct stream_batch;

struct arch {
    const char *name; /* general.architecture */
    /* Runs n_tok tokens of one stream from its current position, appends to its KV cache and
     * leaves the last position's logits (n_vocab floats) in s->logits (backend memory). */
    int (*forward)(struct backend *b, struct stream *s, const int32_t *ids, int n_tok);
    /* One token of each of n streams (ss[i] takes ids[i] at its own position), in one pass
     * over bt's n rows; leaves every row's logits in bt->logits (n, n_vocab). The caller
     * advances the positions. NULL: the architecture has no lockstep forward. */
    int (*forward_batch)(struct backend *b, struct stream_batch *bt, struct stream *const *ss,
                         const int32_t *ids, int n);
};

/* The forward of the architecture named NAME, or NULL. */
const struct arch *arch_find(const char *name);

extern const struct arch arch_qwen3moe;

#endif
