/* plan_sim: choosing how much of a residency profile to freeze, by replaying the warmup.
 *
 * A warmup records every routing call (layer, tokens, chosen ids) with the index of its text.
 * profile_choose ranks the experts by the counts of the even-numbered texts and replays the
 * odd-numbered ones, in call order, through strata's SLRU (residency/slru.h) with the pool of
 * the run: once cold, then with the pool seeded by the ranking (what a restore does) and the
 * top of the ranking pinned for each candidate frozen share. The decode-sized calls' hit rate
 * decides (the held-back half keeps the choice honest: a set frozen from the very texts it is
 * scored on would look better than it is). The profile is then planned with the full counts
 * at the share that won. Single-threaded; the trace is the caller's. */
#ifndef STRATA_PLAN_SIM_H
#define STRATA_PLAN_SIM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct profile;

struct profile_trace {
    int32_t *ids;      /* every call's ids, one after the other */
    uint32_t *call;    /* (n_calls, 4): layer, ids, text, tokens */
    size_t n_ids, cap_ids, n_calls, cap_calls;
    uint64_t *offset;  /* (n_calls) where a call's ids start */
    int k;             /* ids per token */
};

/* Records one routing call of text `text`: n_tok tokens' k ids at layer. 0 or -ENOMEM. */
int profile_trace_add(struct profile_trace *tr, int text, int layer, const int32_t *ids,
                      int n_tok, int k);
void profile_trace_free(struct profile_trace *tr);

/* What profile_choose measured: the decode hit rate of the held-back texts, cold, seeded with
 * nothing frozen, and seeded with each candidate share frozen. */
#define PROFILE_SIM_SHARES 5
struct profile_sim_report {
    int slots;
    uint64_t lookups; /* decode-sized lookups replayed */
    double cold, share_hit[PROFILE_SIM_SHARES];
    int share_pct[PROFILE_SIM_SHARES]; /* dynamic share of each candidate; 100 = none frozen */
    int chosen_pct;
};

/* Picks p's dynamic share for a pool of `slots` by the replay above and plans p with it
 * (profile_plan). 0, -EINVAL (no slots, or a trace of another geometry), -ENOMEM. */
int profile_choose(struct profile *p, const struct profile_trace *tr, int slots,
                   struct profile_sim_report *r);

#endif
