/* placement_rules: what the automatic placement (backend_cuda.c) concludes from figures it
 * measured, kept apart from the backend so that tests can check each rule on made-up figures.
 *
 * The expert cache serves decode's misses four ways (moe_layer.h): copies into slots,
 * zero-copy reads in place (in a graph), copies beside the CPU lane (hybrid) and the GPU's own
 * cache (in a graph). The first trial runs copies and measures the misses per step; these
 * rules say which other trials cannot win and need not run (each trial costs ten decode steps
 * in a mode that may be much slower, and the GPU's cache's trial also leaves the pool holding
 * its choices), and when a later miss rate means the modes must be timed again. */
#ifndef STRATA_PLACEMENT_RULES_H
#define STRATA_PLACEMENT_RULES_H

#include <stdbool.h>

#include "moe_layer.h"

/* zero-copy is not timed when the misses' copies take over this share of a copy step (it
 * reads misses at about half the DMA's rate), and at or under it the modes made for many
 * misses (hybrid, the GPU's cache) are not */
#define PLACEMENT_ZC_SHARE 0.1

/* Why `mode` need not be timed after the copy trial measured `misses` missed experts per step,
 * whose copies take `xfer_s` seconds of a `step_s`-second copy step; zc_listed: zero-copy is
 * among the modes to time. NULL: time it. */
const char *placement_skip(enum moe_mode mode, bool zc_listed, double misses, double xfer_s,
                           double step_s);

/* Whether a miss rate of `rate` per step, measured once decided on `mode` at `decided` per
 * step, calls for timing the modes again: a move of more than one miss and more than half,
 * except a fall under zero-copy, the mode already chosen for the fewest misses. */
bool placement_retime(enum moe_mode mode, double rate, double decided);

#endif
