/* profile: a residency profile, the saved statistics of a warmup workload and the frozen set
 * chosen from them, bound to one model and its expert geometry (DESIGN §7).
 *
 * A warmup counts, per (layer, expert), how often the router chose it and the last step that
 * did. profile_plan picks, for a pool of S expert slots, the experts that hold slots for good
 * (the frozen set: the most chosen, ties to the most recent, then the lowest layer and id) and
 * leaves a share of the pool dynamic (SLRU) for the rest; a run with another slot count plans
 * again from the counts.
 *
 * The file is text, one record per line, versioned ("strata-profile 1"), ending with "end" so
 * that a truncated file is told apart from a whole one. Unknown keys, out-of-range numbers, a
 * missing or repeated record, a frozen id that is out of range or repeated: each is refused
 * with the line number and what was wrong, never a crash. The model's identity is the xxHash64
 * of its GGUF header (metadata and tensor table, everything before the data section); the
 * geometry (layers, experts, experts per token, bytes and quant types of one expert) is stored
 * beside it so that a mismatch says what differs. Written through core/outfile (temp file,
 * fsync, rename): a writer killed half-way leaves the previous file as it was.
 *
 * Threads: none; a profile is a plain value owned by its caller. */
#ifndef STRATA_PROFILE_H
#define STRATA_PROFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct model;

#define PROFILE_VERSION 1
#define PROFILE_PROBE_MAX 64 /* ids of the probe prompt, and of its greedy continuation */
#define PROFILE_DYNAMIC_PCT 25 /* default share of the slots left dynamic */

struct profile_geometry {
    int n_layer, n_expert, n_expert_used;
    uint64_t expert_bytes; /* gate + up + down of the largest expert */
    uint32_t type[3];      /* gate, up, down quant types of layer 0 */
};

struct profile {
    uint64_t model_hash;
    char arch[32];
    struct profile_geometry geo;
    uint64_t vram_budget; /* the budget of the warmup run, 0 = none */
    int slots;            /* slots the frozen set was planned for, 0 = no plan */
    int dynamic_pct;      /* share of those slots left dynamic */
    int n_texts;          /* the warmup workload */
    uint64_t n_tokens;    /* tokens evaluated (prompts and decode steps) */
    uint64_t n_steps;     /* routing calls observed per layer */
    /* the probe: a fixed prompt and its greedy continuation under the warmup's plain cache,
     * with the backend, placement and fill it ran under */
    char probe_mode[48];
    int n_probe_prompt, n_probe_out;
    int32_t probe_prompt[PROFILE_PROBE_MAX], probe_out[PROFILE_PROBE_MAX];
    uint64_t *count; /* (n_layer * n_expert) times chosen */
    uint64_t *last;  /* (n_layer * n_expert) the last step that chose it (1-based), 0 = never */
    uint8_t *frozen; /* (n_layer * n_expert) 1 = holds a slot for good */
    int n_frozen;
};

/* The identity and geometry of model m (its file's header is hashed). */
void profile_identity(const struct model *m, uint64_t *hash, struct profile_geometry *geo);

/* An empty profile for model m: zero counts, no plan. 0 or -ENOMEM. */
int profile_init(struct profile *p, const struct model *m);
void profile_free(struct profile *p);

/* One routing call: ids (n_tok * k) chosen at layer. Bumps the step counter when layer is 0. */
void profile_add(struct profile *p, int layer, const int32_t *ids, int n_tok, int k);

/* Plans the frozen set for a pool of slots (>= 0), leaving dynamic_pct percent (0..100) of it
 * (at least one slot when slots > 1) dynamic; only experts chosen at least once are frozen.
 * Sets slots, dynamic_pct, frozen and n_frozen. */
void profile_plan(struct profile *p, int slots, int dynamic_pct);

/* The frozen set in the plan's order (most chosen first): layer[i], expert[i] for i <
 * n_frozen. */
void profile_frozen_list(const struct profile *p, int32_t *layer, int32_t *expert);

/* What a restore places into a pool of `max` slots, in order: the frozen set (most chosen
 * first), then the other experts that were chosen at least once, most chosen first. Returns
 * how many (<= max) went into layer[], expert[]; the first n_frozen of them are the frozen
 * set (fewer when max is smaller). */
int profile_seed_list(const struct profile *p, int max, int32_t *layer, int32_t *expert);

/* The share (0..1) of the counted choices of layer (or of all layers, layer < 0) that fall on
 * frozen experts; 0 when nothing was counted. */
double profile_coverage(const struct profile *p, int layer);

/* Whether p was made for model m: 0, or -ESTALE with a message naming path and what differs
 * (the file's identity, and each geometry field that disagrees). */
int profile_check(const struct profile *p, const struct model *m, const char *path);

/* Writes p to path atomically. 0 or -errno with a message. */
int profile_write(const struct profile *p, const char *path);

/* Parses a profile from len bytes (name for the messages). 0, or -EINVAL with a message naming
 * the line and what is wrong (-ENOMEM). On failure *p holds nothing to free. */
int profile_parse(const char *buf, size_t len, const char *name, struct profile *p);
/* Reads and parses path. 0 or -errno (-ENOENT, -EISDIR, -EINVAL, -EFBIG over 64 MiB). */
int profile_read(const char *path, struct profile *p);

#endif
