#include "placement_rules.h"

#include <math.h>

const char *placement_skip(enum moe_mode mode, bool zc_listed, double misses, double xfer_s,
                           double step_s)
{
    const bool few = xfer_s <= PLACEMENT_ZC_SHARE * step_s;
    switch (mode) {
    case MOE_MODE_ZEROCOPY:
        return few ? NULL : "the misses' copies take over a tenth of a copy step";
    case MOE_MODE_HYBRID:
    case MOE_MODE_LANE:
        if (misses < 1.0)
            return "fewer than one miss per step";
        /* fall through */
    case MOE_MODE_DEVICE:
        /* zero-copy in a graph reads so few misses in place for less than their copies' share
         * (on the H200, 30b-a3b preset at 12 GiB, 1.4 misses a step: zero-copy 2.67 ms a step,
         * copies 3.99, hybrid 4.21, the GPU's cache 4.09, whose trial evicted what the pool
         * held: 98.6% hits after it against 99.8% without) */
        return zc_listed && few ? "zero-copy reads so few misses in place" : NULL;
    default:
        return NULL;
    }
}

bool placement_retime(enum moe_mode mode, double rate, double decided)
{
    const double d = rate - decided;
    if (!(fabs(d) > 1.0 && fabs(d) > 0.5 * decided))
        return false;
    return !(mode == MOE_MODE_ZEROCOPY && d < 0);
}
