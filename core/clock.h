/* clock: seconds on a monotonic clock, for timing lanes and loops. */
#ifndef STRATA_CLOCK_H
#define STRATA_CLOCK_H

#include <time.h>

static inline double clock_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
