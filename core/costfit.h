/* costfit: an affine cost learned online, seconds = fixed + x / rate, by least squares over
 * samples (x, seconds) whose weights decay geometrically, so that it follows a device whose
 * speed changes (another process on the disk, a cache warming up). The host tier learns its
 * disk's read bandwidth (x in bytes) and per-batch latency with it (docs/DESIGN.md §6). Pure
 * arithmetic. */
#ifndef STRATA_COSTFIT_H
#define STRATA_COSTFIT_H

#include <stdbool.h>

struct costfit {
    double keep;                /* weight kept by the older samples at each new one, (0, 1] */
    double w, sx, sy, sxx, sxy; /* decayed sums; x in units of 2^20 */
    int n;                      /* samples seen */
};

/* A fit whose samples weigh keep^age (keep = 0.95: the last ~20 samples decide). */
void costfit_init(struct costfit *f, double keep);

/* One sample: x (> 0) units took seconds (> 0; a clock too coarse to see it says nothing).
 * Others are ignored. */
void costfit_add(struct costfit *f, double x, double seconds);

/* The fit: rate in x per second (> 0) and fixed seconds (>= 0). With samples of one size only,
 * or where the line's intercept would be negative, the fit goes through the origin (fixed 0).
 * false before the first sample. */
bool costfit_get(const struct costfit *f, double *rate, double *fixed);

/* Seconds that x units would take (fixed + x / rate); -1 before the first sample. */
double costfit_seconds(const struct costfit *f, double x);

#endif
