/* tune: picks the fastest of a few interchangeable settings of a running engine (the CPU
 * thread count, the expert cache's placement) by timing decode steps under each in turn. Pure
 * bookkeeping: the caller times its steps and applies the setting tune_observe returns.
 *
 * A trial runs `skip` steps (a setting's first steps pay for its switch: a graph recording,
 * threads starting) and then `window` timed steps, whose mean is the setting's cost. The
 * settings are tried from `first` on in index order, wrapping, and `first` once more at the
 * end when another is ahead of it by less than TUNE_CLEAR: the first trial ran on the coldest
 * caches, so on a close call its second measurement replaces it. The caller may drop settings
 * not yet tried (what the first trial measured rules them out). A trial whose timed steps
 * measure dearer than the cheapest setting so far by more than TUNE_CUT ends after half its
 * window: each of its further steps would cost that much, and it cannot win. Then the
 * cheapest stays (ties to the lower index) until tune_restart. */
#ifndef STRATA_TUNE_H
#define STRATA_TUNE_H

#include <stdbool.h>

#define TUNE_MAX 5     /* settings at most */
#define TUNE_CLEAR 0.1 /* a lead that needs no second trial of the first setting */
#define TUNE_CUT                                                                                   \
    0.25 /* a trial this much dearer than the best measured ends at half its window                \
          */

struct tune {
    int n, skip, window, first;
    int cur;                /* the setting in use */
    int plan[TUNE_MAX + 1]; /* the trials, in order */
    int n_plan, trial;      /* trials planned, done; trial > n_plan once decided */
    int seen;               /* steps of the current trial */
    double sum;             /* seconds of its timed steps */
    double cost[TUNE_MAX];  /* seconds per step measured for each setting (0: not yet) */
    bool dropped[TUNE_MAX]; /* ruled out by the caller */
    bool cut[TUNE_MAX];     /* its trial ended early: it measured dearer than TUNE_CUT allows */
    bool recheck_first;     /* set by the caller after tune_init: the first setting's second
                             * trial whenever another measured cheaper, not only on a close
                             * call (its first trial paid for a cold start the others did not) */
};

/* n settings (1..TUNE_MAX; one: nothing to try, decided at once), trials starting with
 * `first`. skip >= 0, window >= 1. */
void tune_init(struct tune *t, int n, int first, int skip, int window);

/* One step ran under the setting in use and took `seconds`: returns the setting for the next
 * step (the same or another). */
int tune_observe(struct tune *t, double seconds);

/* Rules setting i out of the trials still to come (not the first; the one in use only before
 * its first step, the caller then applies t->cur); when only the first one's second trial is
 * left, the cheapest measured stays at once. */
void tune_drop(struct tune *t, int i);

/* For settings whose cost moves one way along the index once it starts to rise (fewer
 * threads past a memory-bandwidth knee): where a setting after the first measured dearer than
 * the first by more than TUNE_CLEAR, the settings after it not yet timed are dropped
 * (tune_drop). Call after tune_observe, then apply t->cur. */
void tune_drop_past_dearer(struct tune *t);

/* Whether every trial is done (the setting in use is the cheapest measured). */
bool tune_decided(const struct tune *t);

/* Trials of every setting again, from the one in use (the conditions changed). */
void tune_restart(struct tune *t);

#endif
