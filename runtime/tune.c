#include "tune.h"

#include <string.h>

/* The trials from t->first: every setting not dropped in index order, wrapping, then the first
 * again when anything else is tried. */
static void tune_plan(struct tune *t)
{
    t->n_plan = 0;
    for (int k = 0; k < t->n; k++) {
        int i = (t->first + k) % t->n;
        if (!k || !t->dropped[i])
            t->plan[t->n_plan++] = i;
    }
    if (t->n_plan > 1)
        t->plan[t->n_plan++] = t->first;
}

void tune_init(struct tune *t, int n, int first, int skip, int window)
{
    memset(t, 0, sizeof(*t));
    t->n = n < 1 ? 1 : n > TUNE_MAX ? TUNE_MAX : n;
    t->first = first >= 0 && first < t->n ? first : 0;
    t->cur = t->first;
    t->skip = skip < 0 ? 0 : skip;
    t->window = window < 1 ? 1 : window;
    tune_plan(t);
    if (t->n_plan == 1)
        t->trial = t->n_plan + 1;
}

bool tune_decided(const struct tune *t)
{
    return t->trial > t->n_plan;
}

void tune_restart(struct tune *t)
{
    tune_init(t, t->n, t->cur, t->skip, t->window);
}

/* The cheapest setting measured and not dropped (ties to the lower index). */
static int tune_best(const struct tune *t)
{
    int best = -1;
    for (int i = 0; i < t->n; i++)
        if (!t->dropped[i] && t->cost[i] > 0 && (best < 0 || t->cost[i] < t->cost[best]))
            best = i;
    return best < 0 ? t->cur : best;
}

void tune_drop(struct tune *t, int i)
{
    if (i < 0 || i >= t->n || i == t->first || tune_decided(t) || (i == t->cur && t->seen))
        return;
    t->dropped[i] = true;
    int n = t->trial; /* the trials still to come, without i */
    bool other = false;
    for (int k = t->trial; k < t->n_plan; k++)
        if (t->plan[k] != i) {
            other |= t->plan[k] != t->first;
            t->plan[n++] = t->plan[k];
        }
    t->n_plan = n;
    if (!other) { /* only the first one's second trial left: nothing to compare it with */
        t->cur = tune_best(t);
        t->trial = t->n_plan + 1;
    } else {
        t->cur = t->plan[t->trial];
    }
}

void tune_drop_past_dearer(struct tune *t)
{
    const double base = t->cost[t->first];
    if (tune_decided(t) || base <= 0)
        return;
    for (int i = t->first + 1; i < t->n; i++) {
        if (t->cost[i] <= (1.0 + TUNE_CLEAR) * base)
            continue;
        for (int j = i + 1; j < t->n; j++)
            if (t->cost[j] == 0)
                tune_drop(t, j);
        return;
    }
}

/* Whether the trial in use, `timed` steps into its window, already measures dearer than the
 * cheapest setting measured by more than TUNE_CUT: it cannot win, and its other steps would
 * only cost. Never before half the window (its first steps may still be warming up). */
static bool tune_losing(const struct tune *t, int timed)
{
    if (timed < (t->window + 1) / 2 || timed >= t->window)
        return false;
    double best = 0;
    for (int i = 0; i < t->n; i++)
        if (i != t->cur && !t->dropped[i] && t->cost[i] > 0 && (best == 0 || t->cost[i] < best))
            best = t->cost[i];
    return best > 0 && t->sum / timed > (1.0 + TUNE_CUT) * best;
}

int tune_observe(struct tune *t, double seconds)
{
    if (tune_decided(t))
        return t->cur;
    if (++t->seen > t->skip)
        t->sum += seconds;
    const int timed = t->seen - t->skip;
    const bool cut = tune_losing(t, timed);
    if (!cut && t->seen < t->skip + t->window)
        return t->cur;
    t->cost[t->cur] = t->sum / timed;
    t->cut[t->cur] = cut;
    t->seen = 0;
    t->sum = 0;
    /* the first one's second trial only on a close call: the best of the others ahead of it
     * by less than TUNE_CLEAR (it is there for a first trial slowed by cold caches), or with
     * recheck_first whenever another is ahead */
    if (t->trial + 2 == t->n_plan && t->plan[t->trial + 1] == t->first) {
        const int best = tune_best(t);
        if (best == t->first ||
            (!t->recheck_first && t->cost[best] < (1.0 - TUNE_CLEAR) * t->cost[t->first]))
            t->trial++;
    }
    if (++t->trial < t->n_plan)
        t->cur = t->plan[t->trial];
    else
        t->cur = tune_best(t);
    if (t->trial >= t->n_plan)
        t->trial = t->n_plan + 1;
    return t->cur;
}
