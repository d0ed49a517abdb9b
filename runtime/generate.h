/* generate: the generation loop of one stream: prefill the prompt, then sample and decode
 * token by token, streaming complete UTF-8 text to a callback, stopping at an end-of-generation
 * token, a stop string or the token budget. */
#ifndef STRATA_GENERATE_H
#define STRATA_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sampler.h"

struct stream;
struct tokenizer;

#define GENERATE_MAX_STOP 8

struct generate_config {
    int n_predict;                 /* tokens to generate at most; default 128 */
    struct sampler_config sampling;
    const char *stop[GENERATE_MAX_STOP]; /* stop strings (not emitted) */
    int n_stop;
    bool ignore_eos;               /* keep going past end-of-generation tokens */
};

struct generate_stats {
    int n_prompt, n_gen;
    double t_prompt_s, t_gen_s;    /* wall time of prefill and of the decode loop */
    bool stopped_eog, stopped_string, stopped_ctx;
};

/* Receives generated text as it completes; return nonzero to stop. */
typedef int (*generate_emit_fn)(void *ctx, const char *text, size_t len);

/* Evaluates prompt[0..n_prompt) on s (after what s already holds) and generates. When
 * out_ids is non-NULL it receives the generated ids (up to n_predict). 0 or -errno. */
int generate_run(struct stream *s, const struct tokenizer *tok, const int32_t *prompt,
                 int n_prompt, const struct generate_config *cfg, generate_emit_fn emit,
                 void *ctx, int32_t *out_ids, struct generate_stats *st);

/* Seconds on a monotonic clock. */
double generate_now(void);

#endif
