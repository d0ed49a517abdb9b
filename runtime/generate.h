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
#define GENERATE_SPEC_POS 16 /* draft positions counted one by one (later ones in the last) */

struct generate_config {
    int n_predict;                 /* tokens to generate at most; default 128 */
    struct sampler_config sampling;
    const char *stop[GENERATE_MAX_STOP]; /* stop strings (not emitted) */
    int n_stop;
    bool ignore_eos;               /* keep going past end-of-generation tokens */
    /* speculative decoding with prompt-lookup drafts: up to draft_max tokens that followed the
     * latest earlier occurrence of the text's last draft_ngram .. 2 tokens, verified in one
     * forward (0 = off) */
    int draft_max;
    int draft_ngram;
    /* another draft source (NULL: prompt lookup): up to k drafts after hist into out, their
     * number */
    int (*draft_fn)(void *ctx, const int32_t *hist, int n_hist, int k, int32_t *out);
    void *draft_ctx;
    /* the lookahead (below): GENERATE_LOOKAHEAD_* */
    int lookahead;
};

/* generate_config.lookahead: before prompt-lookup drafts' verify passes (the default), before
 * every forward of the decode loop, never (the values of strata.h's STRATA_LOOKAHEAD_*) */
enum { GENERATE_LOOKAHEAD_DRAFTS = 0, GENERATE_LOOKAHEAD_ALWAYS = 1, GENERATE_LOOKAHEAD_OFF = 2 };

struct generate_stats {
    int n_prompt, n_gen;
    double t_prompt_s, t_gen_s;    /* wall time of prefill and of the decode loop */
    bool stopped_eog, stopped_string, stopped_ctx;
    int n_verify;            /* speculative: verify passes */
    int n_drafted, n_accepted; /* drafted tokens; of those, accepted */
    bool spec_unavailable;     /* drafts were asked for, but the verify rows did not fit */
    int drafted_at[GENERATE_SPEC_POS], accepted_at[GENERATE_SPEC_POS]; /* per draft position */
    int n_paused; /* steps without drafts while drafting was paused */
    int n_lookahead;             /* forwards preceded by a lookahead */
    long long lookahead_experts; /* experts those lookaheads admitted */
};

/* The drafts a verify pass tries, adapted to the running share of drafts kept (accept_ema, an
 * exponential average): twice the expected run of kept drafts, plus one, at most kmax. */
int generate_draft_len(double accept_ema, int kmax);

/* The pace of drafting (struct strata_draft_pace, include/strata.h): the adaptive length, and a
 * pause after GENERATE_PACE_MISSES verify passes in a row that kept no draft, of 4 steps,
 * doubling with each probe pass that keeps none either (up to GENERATE_PACE_MAX_PAUSE); a kept
 * draft ends it. Drafts that are never kept then cost a pass of two rows only every so often
 * instead of at every step (under a VRAM budget a second row can double the experts a step
 * moves). */
#define GENERATE_PACE_MISSES 4
#define GENERATE_PACE_MAX_PAUSE 64
struct strata_draft_pace;
void generate_pace_init(struct strata_draft_pace *p);
/* The drafts to try this step (at most kmax); 0 while paused (the step is counted in
 * n_paused). */
int generate_pace_len(struct strata_draft_pace *p, int kmax);
/* After a verify pass of k > 0 drafts of which acc were kept. */
void generate_pace_update(struct strata_draft_pace *p, int k, int acc);

/* Prompt lookup: the up to k tokens that followed the latest earlier occurrence of hist's last
 * m tokens, for m = ngram down to 2 (the first m that occurs). Writes them to out; returns
 * their number (0: no occurrence). */
int generate_ngram_draft(const int32_t *hist, int n_hist, int ngram, int k, int32_t *out);
/* The index in hist of prompt lookup's first draft token (the one after the latest earlier
 * occurrence of the last m tokens), or -1: generate_ngram_draft's drafts are hist[src ..]. */
int generate_ngram_source(const int32_t *hist, int n_hist, int ngram);

/* Lookahead: where the text's last tokens occurred before (generate_ngram_source: src), the
 * token about to be evaluated, id (hist's last), repeats position src - 1 in the same local
 * context, and a verify pass of prompt-lookup drafts hist[src ..] repeats the positions after
 * it; each row's routing is expected to be close to what its source position chose (measured
 * on the shipped model: 84% of a layer's choices, against 69% from the previous layer's input;
 * docs/speculative.md). With the lookahead on (GENERATE_LOOKAHEAD_DRAFTS with prompt lookup,
 * ALWAYS), the stream logs its routing per position (stream_set_route_log) and a forward is
 * preceded by the backend's lookahead (backend_ops.lookahead) with the sources' choices:
 * verify passes, and with ALWAYS single decode steps too. */

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
