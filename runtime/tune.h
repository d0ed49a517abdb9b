/* tune: picks the fastest of a few interchangeable settings of a running engine (the CPU
 * thread count, the expert cache's placement) by timing decode steps under each in turn. Pure
 * bookkeeping: the caller times its steps and applies the setting tune_observe returns.
 *
 * A trial runs `skip` steps (a setting's first steps pay for its switch: a graph recording,
 * threads starting) and then `window` timed steps, whose mean is the setting's cost. The
 * settings are tried from `first` on in index order, wrapping, and `first` once more at the
 * end: the first trial ran on the coldest caches, so its second measurement replaces it. Then
 * the cheapest stays (ties to the lower index) until tune_restart. */
#ifndef STRATA_TUNE_H
#define STRATA_TUNE_H

#include <stdbool.h>

#define TUNE_MAX 4 /* settings at most */

struct tune {
    int n, skip, window;
    int cur;               /* the setting in use */
    int trial;             /* trials done (0 .. n + 1); n + 1 once decided */
    int seen;              /* steps of the current trial */
    double sum;            /* seconds of its timed steps */
    double cost[TUNE_MAX]; /* seconds per step measured for each setting (0: not yet) */
    int first;
};

/* n settings (1..TUNE_MAX; one: nothing to try, decided at once), trials starting with
 * `first`. skip >= 0, window >= 1. */
void tune_init(struct tune *t, int n, int first, int skip, int window);

/* One step ran under the setting in use and took `seconds`: returns the setting for the next
 * step (the same or another). */
int tune_observe(struct tune *t, double seconds);

/* Whether every trial is done (the setting in use is the cheapest measured). */
bool tune_decided(const struct tune *t);

/* Trials again from the setting in use (the conditions changed). */
void tune_restart(struct tune *t);

#endif
