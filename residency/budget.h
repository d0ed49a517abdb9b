/* budget: the VRAM budget arithmetic of --vram-budget: what the trunk, KV cache and
 * scratch take, and how many fixed-size expert slots the rest holds. */
#ifndef STRATA_BUDGET_H
#define STRATA_BUDGET_H

#include <stdint.h>

struct model;

/* Parses a size: a plain byte count, or a number with K/M/G/T (powers of 1024; "GiB" too) or
 * KB/MB/GB/TB (powers of 1000), case-insensitive, e.g. "8G", "7.5GiB", "8000MB".
 * 0, or -EINVAL naming the text. */
int budget_parse_size(const char *s, uint64_t *out);

struct budget_plan {
    uint64_t budget;     /* bytes asked for */
    uint64_t fixed;      /* trunk + kv + scratch */
    uint64_t slot_bytes; /* one slot: the largest expert's gate + up + down */
    uint64_t n_slots;    /* slots the rest holds */
    double per_layer;    /* n_slots / n_layer */
};

/* n bytes as "x.xx GiB" from 1 GiB up, else "x.x MiB" (a tiny model's shortfall is not
 * 0.00 GiB); returns buf. */
const char *budget_size(char buf[32], uint64_t n);

/* The slot pool left by a budget. -ENOSPC when the fixed part alone exceeds it (the message
 * names the shortfall and each part), -EINVAL for a zero slot size or layer count. */
int budget_plan_slots(uint64_t budget, uint64_t trunk, uint64_t kv, uint64_t scratch,
                      uint64_t slot_bytes, int n_layer, struct budget_plan *out);

/* A model's trunk bytes (every weight but the stacked experts) and its slot size (the largest
 * expert of any layer). */
void budget_model_sizes(const struct model *m, uint64_t *trunk, uint64_t *slot_bytes);

#endif
