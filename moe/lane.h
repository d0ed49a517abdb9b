/* lane: where each missed expert of a layer is served, PCIe (stream into a VRAM slot) or the
 * CPU (compute from host memory), by a cost model fed with bandwidths measured at start-up and
 * the work already queued on each lane, so that both lanes finish the layer together
 * (DESIGN §2: the floor is set by the busiest lane). Pure arithmetic: no threads, no memory. */
#ifndef STRATA_LANE_H
#define STRATA_LANE_H

#include <stdint.h>

struct lane_model {
    double pcie_bps;    /* measured host-to-device bytes/s; <= 0: the lane is off */
    double cpu_bps;     /* measured host read bytes/s at the CPU lane's thread count; <= 0: off */
    double cpu_pair_s;  /* CPU seconds per (token, expert) pair beyond reading the bytes (the
                           arithmetic of prefill batches); 0 for decode */
    double pcie_busy_s; /* seconds of copies already queued when the layer is planned */
    double cpu_busy_s;  /* seconds of CPU expert work already queued */
};

struct lane_item {
    uint64_t bytes; /* the expert's gate + up + down bytes */
    int n_tok;      /* tokens routed to it in this layer */
};

/* Seconds the item takes on each lane (+inf where the lane is off). */
double lane_cost_pcie(const struct lane_model *m, const struct lane_item *it);
double lane_cost_cpu(const struct lane_model *m, const struct lane_item *it);

/* Assigns each of the n items to MOE_LANE_PCIE or MOE_LANE_CPU (out, n entries). Up to 8 items
 * (a decode step's misses) every assignment is tried and the first best kept; more items go
 * largest first to the lane on which each finishes earlier (ties to PCIe, which also caches
 * it), then single moves and pair swaps improve the result while they can. Deterministic.
 * Returns the time both lanes are done (the layer's makespan, seconds from now,
 * queued work included); +inf when both lanes are off. */
double lane_assign(const struct lane_model *m, const struct lane_item *items, int n,
                   uint8_t *out);

#endif
