/* tune: the order of the trials, the skipped steps, the second measurement of the first
 * setting, the choice of the cheapest (ties to the lower index), dropped settings, restarts
 * and the one-setting case, on step times made up per setting (deterministic); and the
 * automatic placement's rules (placement_rules.h) on made-up copy-trial figures. */
#include <string.h>

#include "placement_rules.h"
#include "testutil.h"
#include "tune.h"

/* The modes placement_skip keeps for a copy trial of `misses` per step, `xfer` ms of copies
 * in a `step` ms step, zero-copy among the modes: a bit per mode kept. */
static unsigned kept(double misses, double xfer, double step)
{
    const bool zc = !placement_skip(MOE_MODE_ZEROCOPY, true, misses, xfer, step);
    unsigned k = 0;
    for (int m = 0; m < MOE_MODES; m++)
        k |= (unsigned)!placement_skip((enum moe_mode)m, zc, misses, xfer, step) << m;
    return k;
}

static void placement_rules(void)
{
    const unsigned copy = 1u << MOE_MODE_COPY, zc = 1u << MOE_MODE_ZEROCOPY,
                   hy = 1u << MOE_MODE_HYBRID, dev = 1u << MOE_MODE_DEVICE,
                   ln = 1u << MOE_MODE_LANE;
    /* 12 GiB on the 30b-a3b preset: 1.4 misses, 0.07 of 3.99 ms: zero-copy alone is timed */
    CHECK(kept(1.4, 0.07, 3.99) == (copy | zc), "few misses: kept %#x", kept(1.4, 0.07, 3.99));
    /* under one miss per step: hybrid out on its own rule as well */
    CHECK(kept(0.5, 0.02, 4.0) == (copy | zc), "under one miss: kept %#x", kept(0.5, 0.02, 4.0));
    /* 8 GiB: 62.7 misses, 3.47 of 7.54 ms: no zero-copy; hybrid and the GPU's cache (with
     * and without the CPU lane) timed */
    CHECK(kept(62.7, 3.47, 7.54) == (copy | hy | dev | ln), "many misses: kept %#x",
          kept(62.7, 3.47, 7.54));
    /* the share's edge: exactly a tenth keeps zero-copy */
    CHECK(kept(5.0, 0.4, 4.0) == (copy | zc), "at a tenth: kept %#x", kept(5.0, 0.4, 4.0));
    CHECK(kept(5.0, 0.41, 4.0) == (copy | hy | dev | ln), "past a tenth: kept %#x",
          kept(5.0, 0.41, 4.0));
    /* without zero-copy among the modes (no mapped memory) the others are timed at any rate */
    CHECK(!placement_skip(MOE_MODE_DEVICE, false, 1.4, 0.07, 3.99) &&
              !placement_skip(MOE_MODE_HYBRID, false, 1.4, 0.07, 3.99),
          "modes dropped for a zero-copy that is not timed");
    CHECK(placement_skip(MOE_MODE_HYBRID, false, 0.5, 0.02, 4.0) != NULL &&
              placement_skip(MOE_MODE_LANE, false, 0.5, 0.02, 4.0) != NULL,
          "a CPU lane timed under one miss per step");

    /* timing again: a move of more than one miss and half the rate, either way, except a fall
     * under zero-copy */
    CHECK(placement_retime(MOE_MODE_COPY, 1.4, 6.6) && placement_retime(MOE_MODE_DEVICE, 12, 6),
          "a move of over half not timed again");
    CHECK(!placement_retime(MOE_MODE_ZEROCOPY, 1.4, 6.6), "a fall under zero-copy timed again");
    CHECK(placement_retime(MOE_MODE_ZEROCOPY, 12.0, 6.0), "a rise under zero-copy ignored");
    CHECK(!placement_retime(MOE_MODE_COPY, 1.8, 1.0) && !placement_retime(MOE_MODE_COPY, 7, 5),
          "a small move timed again");
}

/* Runs steps of made-up costs until decided (at most max_steps): cost[s] per step of setting
 * s, plus `cold` on every step of the first trial and `switch_s` on the first step after each
 * change of setting. The settings used, step by step, go to used (max_steps entries). Returns
 * the steps run. */
static int drive(struct tune *t, const double *cost, double cold, double switch_s, int *used,
                 int max_steps)
{
    int n = 0, prev = t->cur, trial0 = 1;
    while (!tune_decided(t) && n < max_steps) {
        int s = t->cur;
        double sec = cost[s] + (s != prev ? switch_s : 0.0) + (trial0 ? cold : 0.0);
        used[n++] = s;
        prev = s;
        int next = tune_observe(t, sec);
        if (next != s)
            trial0 = 0;
    }
    return n;
}

int main(void)
{
    struct tune t;
    int used[64];

    /* three settings from 1: trials 1, 2, 0, then 1 again on a close call (the best other
     * less than TUNE_CLEAR ahead of the cold first trial); 2 skipped + 3 timed steps each */
    {
        const double cost[3] = {4.0, 3.75, 3.625}; /* sums of three stay exact */
        tune_init(&t, 3, 1, 2, 3);
        int n = drive(&t, cost, 0.25, 100.0, used, 64);
        const int want[20] = {1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1};
        CHECK(n == 20, "%d steps to decide, want 20", n);
        CHECK(!memcmp(used, want, sizeof(want)), "trial order");
        CHECK(tune_decided(&t) && t.cur == 2, "decided %d on %d, want 2", tune_decided(&t), t.cur);
        /* the switch costs fell on skipped steps; the cold first trial was measured again */
        CHECK(t.cost[0] == 4.0 && t.cost[1] == 3.75 && t.cost[2] == 3.625, "costs %g %g %g",
              t.cost[0], t.cost[1], t.cost[2]);
        CHECK(tune_observe(&t, 1e9) == 2 && t.cur == 2, "a decided tuner stays");
    }
    /* a clear lead: no second trial of the first setting; setting 0, dearer than 2 by more
     * than TUNE_CUT, ends its trial after 2 of its 3 timed steps */
    {
        const double cost[3] = {5.0, 4.0, 3.0};
        tune_init(&t, 3, 1, 2, 3);
        int n = drive(&t, cost, 10.0, 100.0, used, 64);
        CHECK(n == 14 && t.cur == 2 && t.cost[1] == 14.0, "clear lead: %d steps, picked %d", n,
              t.cur);
        CHECK(t.cost[0] == 5.0 && t.cut[0] && !t.cut[1] && !t.cut[2], "cut: cost %g, cut %d%d%d",
              t.cost[0], t.cut[0], t.cut[1], t.cut[2]);
    }
    /* trials cut at half their window (2 skipped + 8 timed: after 4 timed steps) when dearer
     * than the best measured by more than TUNE_CUT, measured over the steps they ran; exactly
     * TUNE_CUT dearer runs the whole window; the first trial has nothing to lose to */
    {
        const double cost[3] = {4.0, 5.0625, 5.0};
        tune_init(&t, 3, 0, 2, 8);
        int n = drive(&t, cost, 0.0, 0.0, used, 64);
        CHECK(n == 10 + 6 + 10 && t.cur == 0 && tune_decided(&t), "cut: %d steps, picked %d", n,
              t.cur);
        CHECK(t.cut[1] && !t.cut[2] && !t.cut[0] && t.cost[1] == 5.0625 && t.cost[2] == 5.0,
              "cut %d%d%d, costs %g %g", t.cut[0], t.cut[1], t.cut[2], t.cost[1], t.cost[2]);
        /* a trial whose first timed steps are dear but whose mean at half the window is within
         * TUNE_CUT runs on, and its whole window counts */
        tune_init(&t, 2, 0, 0, 4);
        for (int i = 0; i < 4; i++)
            tune_observe(&t, 4.0);
        const double slow_start[4] = {6.0, 4.0, 3.0, 3.0}; /* 5.0 after two: 1.25x */
        for (int i = 0; i < 4; i++)
            tune_observe(&t, slow_start[i]);
        CHECK(!t.cut[1] && t.cost[1] == 4.0, "slow start: cut %d, cost %g", t.cut[1], t.cost[1]);
        /* the first setting's second trial (a close call) is cut like any other */
        const double close2[2] = {4.0, 3.75};
        tune_init(&t, 2, 0, 0, 4);
        n = drive(&t, close2, 0.0, 0.0, used, 64);
        CHECK(n == 12 && t.cur == 1 && !t.cut[0], "close call: %d steps, picked %d", n, t.cur);
        tune_init(&t, 2, 0, 0, 4);
        for (int i = 0; i < 8; i++)
            tune_observe(&t, i < 4 ? 4.0 : 3.75);
        tune_observe(&t, 5.0);
        CHECK(!tune_decided(&t), "cut after one timed step of four");
        tune_observe(&t, 5.0);
        CHECK(tune_decided(&t) && t.cut[0] && t.cost[0] == 5.0 && t.cur == 1,
              "second trial: decided %d, cut %d, cost %g, picked %d", tune_decided(&t), t.cut[0],
              t.cost[0], t.cur);
    }
    /* the cold first trial alone would have lost the close call: its second measurement wins */
    {
        const double cost[2] = {2.0, 2.4};
        tune_init(&t, 2, 0, 0, 2);
        drive(&t, cost, 0.5, 0.0, used, 64);
        CHECK(t.cur == 0 && t.cost[0] == 2.0, "picked %d (cost %g), want 0 at 2", t.cur, t.cost[0]);
    }
    /* recheck_first: the first setting timed again whenever another led it, by any margin
     * (its first trial paid for a cold start); not when it led */
    {
        const double cost[2] = {3.5, 4.5};
        tune_init(&t, 2, 0, 0, 2);
        t.recheck_first = true;
        drive(&t, cost, 3.0, 0.0, used, 64); /* the cold first trial: 6.5 against 4.5 */
        CHECK(t.cur == 0 && t.cost[0] == 3.5, "recheck: picked %d (cost %g), want 0 at 3.5", t.cur,
              t.cost[0]);
        tune_init(&t, 2, 0, 0, 2);
        drive(&t, cost, 3.0, 0.0, used, 64); /* without it: a clear lead, no second trial */
        CHECK(t.cur == 1 && t.cost[0] == 6.5, "no recheck: picked %d (cost %g)", t.cur, t.cost[0]);
        tune_init(&t, 2, 0, 0, 2);
        t.recheck_first = true;
        /* the first leads: no second trial (the other's trial cut after 1 of 2 steps) */
        int n = drive(&t, cost, 0.0, 0.0, used, 64);
        CHECK(n == 3 && t.cur == 0, "recheck while leading: %d steps, picked %d", n, t.cur);
    }
    /* ties go to the lower index */
    {
        const double cost[3] = {1.0, 1.0, 1.0};
        tune_init(&t, 3, 2, 1, 1);
        drive(&t, cost, 0.0, 0.0, used, 64);
        CHECK(t.cur == 0, "tie picked %d", t.cur);
    }
    /* restart: trials again from the setting in use, then the new cheapest */
    {
        const double cost[3] = {3.0, 2.0, 1.0}, later[3] = {1.0, 2.0, 3.0};
        tune_init(&t, 3, 0, 0, 1);
        drive(&t, cost, 0.0, 0.0, used, 64);
        CHECK(t.cur == 2, "first decision %d", t.cur);
        tune_restart(&t);
        CHECK(!tune_decided(&t) && t.cur == 2, "restart from the setting in use");
        int n = drive(&t, later, 0.0, 0.0, used, 64); /* 0 leads clearly: no second trial */
        CHECK(n == 3 && used[0] == 2 && used[1] == 0 && used[2] == 1, "restart order (%d steps)",
              n);
        CHECK(t.cur == 0, "after restart picked %d", t.cur);
    }
    /* settings dropped after the first trial: the next one in turn is skipped; with every
     * other dropped, the first stays without its second trial; the first cannot be dropped */
    {
        tune_init(&t, 3, 0, 0, 1);
        CHECK(tune_observe(&t, 5.0) == 1 && t.cur == 1, "after the first trial: %d", t.cur);
        tune_drop(&t, 1);
        CHECK(t.cur == 2 && !tune_decided(&t), "dropping the next one: %d", t.cur);
        tune_drop(&t, 0);
        CHECK(t.cur == 2 && !t.dropped[0], "the first one was dropped");
        CHECK(tune_observe(&t, 4.6) == 0, "then the first again (a close call)");
        CHECK(tune_observe(&t, 6.0) == 2 && tune_decided(&t), "picked %d", t.cur);
        CHECK(t.cost[1] == 0.0, "a dropped setting was timed");

        tune_init(&t, 3, 1, 1, 2);
        for (int i = 0; i < 3; i++)
            tune_observe(&t, 1.0);
        CHECK(t.cur == 2, "trial order from 1: %d", t.cur);
        tune_drop(&t, 2);
        tune_drop(&t, 0);
        CHECK(tune_decided(&t) && t.cur == 1 && t.cost[1] == 1.0, "all others dropped: %d %d",
              tune_decided(&t), t.cur);
        /* a setting whose trial has begun stays */
        tune_init(&t, 3, 0, 1, 2);
        for (int i = 0; i < 4; i++) /* 3 steps of 0, then 1's first */
            tune_observe(&t, 1.0);
        tune_drop(&t, 1);
        CHECK(t.cur == 1 && !t.dropped[1], "dropped a setting under trial");
    }
    /* costs that rise along the index (fewer threads past a bandwidth knee): a second setting
     * dearer than the first by more than TUNE_CLEAR rules out the third untimed; within it,
     * or cheaper, every setting is timed */
    {
        const double knee[3] = {30.0, 34.5, 44.0}, close[3] = {30.0, 32.0, 28.0};
        tune_init(&t, 3, 0, 1, 3);
        int n = 0;
        while (!tune_decided(&t) && n < 64) {
            tune_observe(&t, knee[t.cur]);
            tune_drop_past_dearer(&t);
            used[t.cur]++, n++;
        }
        CHECK(tune_decided(&t) && t.cur == 0 && n == 8 && t.cost[2] == 0.0 && t.dropped[2],
              "past the knee: %d steps, picked %d, third timed %g", n, t.cur, t.cost[2]);
        tune_init(&t, 3, 0, 1, 3);
        n = 0;
        while (!tune_decided(&t) && n < 64) {
            tune_observe(&t, close[t.cur]);
            tune_drop_past_dearer(&t);
            n++;
        }
        CHECK(tune_decided(&t) && t.cur == 2 && t.cost[2] == 28.0 && !t.dropped[2],
              "within the margin: picked %d, third timed %g", t.cur, t.cost[2]);
        tune_init(&t, 3, 0, 1, 3); /* before anything is timed: nothing dropped */
        tune_drop_past_dearer(&t);
        CHECK(!t.dropped[1] && !t.dropped[2], "dropped before any trial");
    }
    /* one setting: decided at once; out-of-range arguments are clamped */
    {
        tune_init(&t, 1, 5, -1, 0);
        CHECK(tune_decided(&t) && t.cur == 0 && tune_observe(&t, 1.0) == 0, "one setting");
        tune_init(&t, 9, 7, 0, 1);
        CHECK(t.n == TUNE_MAX && t.cur == 0, "clamped to %d settings from %d", t.n, t.cur);
    }
    placement_rules();
    return test_finish("test_tune");
}
