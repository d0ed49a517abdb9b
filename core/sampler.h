/* sampler: picks the next token from logits. Order of the chain (llama.cpp's habit):
 * repetition penalty -> top-k -> temperature -> softmax -> top-p -> min-p -> draw.
 * temperature <= 0 means greedy (argmax; ties to the lowest id). Deterministic for a seed. */
#ifndef STRATA_SAMPLER_H
#define STRATA_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "rng.h"

struct sampler_config {
    float temperature;    /* 0 = greedy; default 0.8 */
    int top_k;            /* 0 = off; default 40 */
    float top_p;          /* 1 = off; default 0.95 */
    float min_p;          /* 0 = off; default 0.05 */
    float repeat_penalty; /* 1 = off; default 1.0 */
    int repeat_last_n;    /* window of recent tokens the penalty looks at; default 64 */
    uint64_t seed;
};

/* The defaults above. */
struct sampler_config sampler_config_default(void);

struct sampler {
    struct sampler_config cfg;
    struct rng rng;
    int n_vocab;
    int32_t *recent;   /* (repeat_last_n) ring of recent tokens, owned */
    int n_recent, recent_head;
    struct sampler_cand *cand; /* (2 n_vocab) scratch, owned */
};

int sampler_init(struct sampler *s, const struct sampler_config *cfg, int n_vocab);
void sampler_free(struct sampler *s);

/* Chooses a token from logits (n_vocab floats; modified in place by the penalty). */
int32_t sampler_sample(struct sampler *s, float *logits);

/* Speculative decoding's acceptance rule for a drafted token (a draft distribution that puts
 * all its mass on `draft`): sampler_sample's chain gives the distribution p; the draft is
 * accepted with probability p(draft), else a token is drawn from p without the draft,
 * renormalized, so the result is distributed as p. Greedy: the argmax, accepted when it is the
 * draft. Consumes two draws of the RNG when sampling (none when greedy). *accepted tells which.
 * Modifies logits in place (the penalty), as sampler_sample does. */
int32_t sampler_sample_draft(struct sampler *s, float *logits, int32_t draft, bool *accepted);

/* The rule on candidates ids[0..n) with weights w (not normalized) and two uniforms in [0, 1):
 * accepted when u1 * sum(w) < w(draft); otherwise the candidate, the draft left out, at u2 of
 * the remaining weight. */
int32_t sampler_pick_draft(const int32_t *ids, const float *w, int n, int32_t draft, double u1,
                           double u2, bool *accepted);

/* The repetition penalty on logits: each distinct token of recent[0..n) once, CTRL-style
 * (positive logits divided by penalty, negative ones multiplied); ids outside [0, n_vocab)
 * skipped. sampler_sample applies it over the tokens sampler_accept recorded. */
void sampler_penalize_tokens(float *logits, int n_vocab, const int32_t *recent, int n,
                             float penalty);

/* Records a token (prompt or generated) for the repetition penalty. */
void sampler_accept(struct sampler *s, int32_t tok);

/* argmax with ties to the lowest id. */
int32_t sampler_argmax(const float *logits, int n);

#endif
