#include "tune.h"

#include <string.h>

void tune_init(struct tune *t, int n, int first, int skip, int window)
{
    memset(t, 0, sizeof(*t));
    t->n = n < 1 ? 1 : n > TUNE_MAX ? TUNE_MAX : n;
    t->first = first >= 0 && first < t->n ? first : 0;
    t->cur = t->first;
    t->skip = skip < 0 ? 0 : skip;
    t->window = window < 1 ? 1 : window;
    t->trial = t->n == 1 ? t->n + 1 : 0;
}

bool tune_decided(const struct tune *t)
{
    return t->trial > t->n;
}

void tune_restart(struct tune *t)
{
    tune_init(t, t->n, t->cur, t->skip, t->window);
}

int tune_observe(struct tune *t, double seconds)
{
    if (tune_decided(t))
        return t->cur;
    if (++t->seen > t->skip)
        t->sum += seconds;
    if (t->seen < t->skip + t->window)
        return t->cur;
    t->cost[t->cur] = t->sum / t->window;
    t->seen = 0;
    t->sum = 0;
    if (++t->trial < t->n) { /* the next setting in turn */
        t->cur = (t->first + t->trial) % t->n;
    } else if (t->trial == t->n) { /* the first one again */
        t->cur = t->first;
    } else { /* decided: the cheapest */
        int best = 0;
        for (int i = 1; i < t->n; i++)
            if (t->cost[i] < t->cost[best])
                best = i;
        t->cur = best;
    }
    return t->cur;
}
