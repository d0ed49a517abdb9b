/* slru: the residency policy. Directed cases for each rule (probation first, promotion on the
 * second hit, scan resistance, the guard of the current and next layer, per-layer fairness,
 * pins, stats, lockstep-wide steps, frequency-aware admission), then a random workload checked
 * against the invariants after every step. */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "slru.h"
#include "testutil.h"

static struct slru *open_cache(int n_layer, int n_expert, int n_slots, int prot_pct)
{
    struct slru_config cfg = {.n_layer = n_layer, .n_expert = n_expert, .n_slots = n_slots,
                              .protected_pct = prot_pct};
    struct slru *c = NULL;
    CHECK(slru_open(&cfg, &c) == 0, "slru_open");
    return c;
}

/* One step of one expert: miss then admit, as the dispatch does; returns the slot. */
static int touch(struct slru *c, int l, int e, int guard, int *evl, int *eve)
{
    slru_step(c);
    int s = slru_lookup(c, l, e);
    *evl = *eve = -1;
    if (s >= 0)
        return s;
    return slru_admit(c, l, e, guard, evl, eve);
}

static void check_probation_first(void)
{
    struct slru *c = open_cache(1, 16, 4, 50);
    int evl, eve;
    /* fill: 0 1 2 3 in probation; hit 0 and 1 -> protected (cap 2) */
    for (int e = 0; e < 4; e++)
        CHECK(touch(c, 0, e, -1, &evl, &eve) == e, "fill slot %d", e);
    CHECK(slru_lookup(c, 0, 0) == 0 && slru_lookup(c, 0, 1) == 1, "hits");
    CHECK(slru_stats(c, 0)->promotions == 2, "two promotions");
    /* new arrivals evict probation's LRU (2, then 3), never the protected 0 and 1 */
    touch(c, 0, 4, -1, &evl, &eve);
    CHECK(eve == 2, "first victim is probation's LRU (2), got %d", eve);
    touch(c, 0, 5, -1, &evl, &eve);
    CHECK(eve == 3, "second victim 3, got %d", eve);
    /* a scan of one-time experts never touches the protected pair */
    for (int e = 6; e < 16; e++)
        touch(c, 0, e, -1, &evl, &eve);
    CHECK(slru_peek(c, 0, 0) >= 0 && slru_peek(c, 0, 1) >= 0, "scan evicted protected");
    CHECK(slru_check(c) == 0, "invariants");
    /* a third protected hit overflows the cap: protected LRU (0) drops to probation */
    touch(c, 0, 15, -1, &evl, &eve);
    slru_lookup(c, 0, 1);
    CHECK(slru_lookup(c, 0, 15) >= 0, "15 resident");
    touch(c, 0, 6, -1, &evl, &eve);
    CHECK(slru_check(c) == 0, "invariants after demotion");
    CHECK(slru_admit(c, 0, 6, -1, &evl, &eve) == -EEXIST, "double admit");
    CHECK(slru_admit(c, 1, 0, -1, &evl, &eve) == -EINVAL, "bad layer");
    slru_close(c);
}

static void check_guard(void)
{
    /* 4 layers, 8 slots (fair share 2). While layer 1 runs, layer 2 (the next) is off limits;
     * layer 1, at its share, recycles its own least recent slot. */
    struct slru *c = open_cache(4, 8, 8, 50);
    int evl, eve;
    for (int l = 0; l < 4; l++)
        for (int e = 0; e < 2; e++)
            touch(c, l, e, -1, &evl, &eve);
    for (int i = 0; i < 50; i++) {
        int s = touch(c, 1, 2 + i % 6, 1, &evl, &eve);
        CHECK(s >= 0, "admit under guard");
        CHECK(evl == 1, "step %d: evicted layer %d, expected layer 1's own slot", i, evl);
    }
    for (int e = 0; e < 2; e++)
        CHECK(slru_peek(c, 2, e) >= 0, "next layer's expert %d evicted", e);
    /* guard wraps: computing the last layer protects layer 0; a layer under its share
     * (layer 3 lost nothing, so take a fresh cache) */
    CHECK(slru_check(c) == 0, "invariants");
    slru_close(c);

    /* the experts in use this step are never victims; when nothing else is left: -ENOSPC */
    c = open_cache(2, 4, 2, 50);
    touch(c, 0, 0, -1, &evl, &eve);
    touch(c, 1, 0, -1, &evl, &eve);
    slru_step(c);
    CHECK(slru_lookup(c, 0, 0) == 0, "hit");
    CHECK(slru_admit(c, 0, 1, 0, &evl, &eve) == -ENOSPC,
          "evicted an in-use expert or the next layer's");
    /* wrap: computing layer 1 guards layer 0 */
    slru_step(c);
    CHECK(slru_lookup(c, 1, 0) == 1, "hit");
    CHECK(slru_admit(c, 1, 1, 1, &evl, &eve) == -ENOSPC, "wrapped guard");
    /* a new step frees layer 1's expert (looked up in two steps) for one of layer 1 looked up
     * as often */
    slru_step(c);
    CHECK(slru_lookup(c, 1, 2) < 0, "miss");
    slru_step(c);
    CHECK(slru_lookup(c, 1, 2) < 0, "miss");
    CHECK(slru_admit(c, 1, 2, -1, &evl, &eve) >= 0 && evl == 1 && eve == 0,
          "admit without guard");
    CHECK(slru_check(c) == 0, "invariants");
    slru_close(c);
}

static void check_fairness(void)
{
    /* 4 layers, 8 slots: fair share 2. Layer 0 streams new experts while the others hold
     * their two each: layer 0 must recycle its own slots and never take theirs. */
    struct slru *c = open_cache(4, 64, 8, 50);
    int evl, eve;
    for (int l = 1; l < 4; l++)
        for (int e = 0; e < 2; e++)
            touch(c, l, e, -1, &evl, &eve);
    for (int e = 0; e < 60; e++) {
        touch(c, 0, e, -1, &evl, &eve);
        CHECK(evl == -1 || evl == 0, "layer 0 took a slot of layer %d", evl);
    }
    for (int l = 1; l < 4; l++)
        CHECK(slru_layer_held(c, l) == 2, "layer %d holds %d", l, slru_layer_held(c, l));
    /* a layer under its share takes from layers above theirs */
    struct slru *d = open_cache(2, 64, 4, 50);
    for (int e = 0; e < 4; e++)
        touch(d, 0, e, -1, &evl, &eve); /* layer 0 holds 4 > share 2 */
    touch(d, 1, 0, -1, &evl, &eve);
    CHECK(evl == 0, "under-share layer 1 should evict from layer 0, got %d", evl);
    CHECK(slru_check(c) == 0 && slru_check(d) == 0, "invariants");
    slru_close(c);
    slru_close(d);
}

static void check_pins_and_stats(void)
{
    struct slru *c = open_cache(1, 32, 4, 25);
    int evl, eve;
    for (int e = 0; e < 4; e++)
        touch(c, 0, e, -1, &evl, &eve);
    CHECK(slru_pin(c, 0, 0) == 0 && slru_pin(c, 0, 1) == 0, "pin");
    CHECK(slru_pin(c, 0, 9) == -ENOENT, "pin of a non-resident expert");
    for (int e = 4; e < 32; e++)
        touch(c, 0, e, -1, &evl, &eve);
    CHECK(slru_peek(c, 0, 0) >= 0 && slru_peek(c, 0, 1) >= 0, "pinned expert evicted");
    const struct slru_layer_stats *st = slru_stats(c, 0);
    CHECK(st->misses == 32 && st->admissions == 32 && st->evictions == 28 && st->hits == 0,
          "stats: misses %llu admissions %llu evictions %llu hits %llu",
          (unsigned long long)st->misses, (unsigned long long)st->admissions,
          (unsigned long long)st->evictions, (unsigned long long)st->hits);
    CHECK(slru_check(c) == 0, "invariants with pins over the protected cap");
    slru_close(c);
}

/* Taking over a state kept elsewhere: slru_clear empties every slot but keeps the counts and
 * retired slots out; slru_place puts keys into chosen slots, refusing held, retired and bad
 * ones and keys already resident; the last placed is the most recent. */
static void check_clear_place(void)
{
    struct slru *c = open_cache(2, 8, 6, 25);
    int evl, eve;
    for (int e = 0; e < 6; e++)
        touch(c, e % 2, e, -1, &evl, &eve);
    CHECK(slru_pin(c, 0, 0) == 0, "pin");
    CHECK(slru_retire(c, 5, &evl, &eve) == 0, "retire");
    uint64_t misses = slru_stats(c, 0)->misses;
    slru_clear(c);
    CHECK(slru_check(c) == 0 && slru_layer_held(c, 0) == 0 && slru_layer_held(c, 1) == 0,
          "clear left slots held");
    CHECK(slru_stats(c, 0)->misses == misses, "clear dropped the counts");
    CHECK(slru_place(c, 3, 1, 7) == 0 && slru_place(c, 0, 0, 2) == 0 && slru_place(c, 4, 0, 5) == 0,
          "place");
    CHECK(slru_place(c, 3, 1, 6) == -EBUSY, "a held slot taken");
    CHECK(slru_place(c, 5, 1, 6) == -EBUSY, "a retired slot taken");
    CHECK(slru_place(c, 1, 0, 2) == -EEXIST, "a resident key placed twice");
    CHECK(slru_place(c, 9, 1, 6) == -EINVAL && slru_place(c, 1, 2, 0) == -EINVAL, "bad args");
    CHECK(slru_pin(c, 0, 2) == 0, "pin a placed key");
    CHECK(slru_peek(c, 1, 7) == 3 && slru_peek(c, 0, 2) == 0 && slru_peek(c, 0, 5) == 4,
          "placed keys not where they were put");
    CHECK(slru_check(c) == 0, "invariants after placing");
    /* slots 1 and 2 are free: two admissions take them, then the least recent placed goes */
    slru_step(c);
    CHECK(slru_admit(c, 1, 0, -1, &evl, &eve) >= 0 && slru_admit(c, 1, 1, -1, &evl, &eve) >= 0,
          "admit into the free slots");
    slru_step(c);
    int s = slru_admit(c, 1, 2, -1, &evl, &eve);
    CHECK(s == 3 && evl == 1 && eve == 7, "victim %d (%d, %d), expected slot 3 (1, 7)", s, evl,
          eve);
    CHECK(slru_check(c) == 0, "invariants after admitting");
    slru_close(c);
}

/* One layer call of a lockstep step: slru_step, then each expert of ids (distinct) looked up and
 * a miss admitted guarding the next layer (of a model of more than one layer), as the copy path
 * does. Returns the hits. */
static int layer_call(struct slru *c, int n_layer, int l, const int *ids, int n, int *foreign)
{
    int hits = 0, evl, eve;
    slru_step(c);
    for (int i = 0; i < n; i++) {
        if (slru_lookup(c, l, ids[i]) >= 0) {
            hits++;
            continue;
        }
        int s = slru_admit(c, l, ids[i], n_layer > 1 ? l : -1, &evl, &eve);
        CHECK(s >= 0 || s == -ENOSPC, "admit: %d", s);
        *foreign += s >= 0 && evl >= 0 && evl != l;
    }
    return hits;
}

static void check_wide_steps(void)
{
    /* 4 layers, 32 slots (share 8). Every layer uses its 6 hot experts every step; from step
     * 20 on, layer 0's calls (a lockstep batch) add 10 experts that one row each chose, new
     * every step: a union of 16, twice its share. Layer 0 must not take the other layers'
     * slots for them (they would miss their hot sets a few layers later, every step), and its
     * own hot set must survive. */
    struct slru *c = open_cache(4, 1024, 32, 50);
    int ids[16], foreign = 0, hits_other = 0, hits_hot = 0, next = 6;
    for (int step = 0; step < 60; step++) {
        for (int l = 0; l < 4; l++) {
            int n = 0;
            for (int e = 0; e < 6; e++)
                ids[n++] = e;
            for (int j = 0; l == 0 && step >= 20 && j < 10; j++)
                ids[n++] = next++;
            int h = layer_call(c, 4, l, ids, n, &foreign);
            if (step >= 20 && l)
                hits_other += h;
            if (step >= 20 && !l)
                hits_hot += h;
        }
        CHECK(slru_check(c) == 0, "invariants at step %d", step);
    }
    CHECK(foreign == 0, "a wide step of layer 0 took %d slots of other layers", foreign);
    CHECK(hits_other == 40 * 3 * 6, "other layers hit %d of %d", hits_other, 40 * 3 * 6);
    CHECK(hits_hot == 40 * 6, "layer 0's hot set hit %d of %d", hits_hot, 40 * 6);
    CHECK(slru_stats(c, 0)->bypassed > 0, "layer 0 served no expert without a slot");
    slru_close(c);
}

static void check_frequency_admission(void)
{
    /* One layer, 8 slots, 64 experts. Each step uses 4 of 6 hot experts (drawn) and 4 experts
     * nobody uses again: a union that fits the slots. By recency alone each step's one-time
     * experts push out the hot ones it skipped; by frequency the hot six stay resident and
     * the one-time experts share the other two slots. */
    struct slru *c = open_cache(1, 4096, 8, 50);
    struct rng r;
    rng_seed(&r, 20261201, 1); /* fixed: the counts below are exact */
    int ids[8], foreign = 0, hot_hits = 0, hot_looks = 0, next = 6;
    for (int step = 0; step < 400; step++) {
        int n = 0;
        unsigned mask = 0;
        while (n < 4) {
            int e = (int)rng_below(&r, 6);
            if (!(mask & 1u << e)) {
                mask |= 1u << e;
                ids[n++] = e;
            }
        }
        for (int j = 0; j < 4; j++)
            ids[n++] = next++;
        int h = layer_call(c, 1, 0, ids, n, &foreign);
        if (step >= 100) {
            hot_hits += h;
            hot_looks += 4;
        }
    }
    CHECK(hot_hits == hot_looks, "hot experts hit %d of %d after warm-up", hot_hits, hot_looks);
    for (int e = 0; e < 6; e++)
        CHECK(slru_peek(c, 0, e) >= 0, "hot expert %d evicted", e);
    CHECK(slru_check(c) == 0, "invariants");
    slru_close(c);
}

static void check_random(struct rng *r)
{
    for (int trial = 0; trial < 20; trial++) {
        int nl = 1 + (int)rng_below(r, 6), ne = 2 + (int)rng_below(r, 30);
        int ns = 1 + (int)rng_below(r, (uint32_t)(nl * ne));
        struct slru *c = open_cache(nl, ne, ns, (int)rng_below(r, 101));
        uint64_t lookups = 0, admitted = 0, refused = 0, now = 1;
        uint64_t used[6 * 32] = {0}; /* shadow: step in which each key was last touched */
        bool retired[6 * 32] = {false};
        int n_retired = 0;
        for (int step = 0; step < 3000; step++) {
            int l = (int)rng_below(r, (uint32_t)nl);
            /* skewed popularity: low ids are hot */
            int e = (int)(rng_below(r, (uint32_t)ne) * rng_f32(r));
            int guard = rng_below(r, 4) ? l : -1, evl, eve;
            if (rng_below(r, 3) == 0) {
                slru_step(c);
                now++;
            }
            int s = slru_lookup(c, l, e);
            lookups++;
            if (s < 0) {
                s = slru_admit(c, l, e, guard, &evl, &eve);
                if (s == -ENOSPC) {
                    refused++;
                } else {
                    admitted++;
                    CHECK(s >= 0 && slru_peek(c, l, e) == s, "admit");
                    CHECK(s < 0 || !retired[s], "a retired slot %d was handed out", s);
                    CHECK(evl < 0 || slru_peek(c, evl, eve) < 0, "victim still mapped");
                    CHECK(evl < 0 || guard < 0 || evl != (guard + 1) % nl,
                          "next layer %d evicted (guard %d)", evl, guard);
                    CHECK(evl < 0 || used[evl * 32 + eve] != now,
                          "evicted (%d, %d), in use this step", evl, eve);
                }
            } else {
                int kl, ke;
                CHECK(slru_slot_key(c, s, &kl, &ke) == 0 && kl == l && ke == e, "slot key");
            }
            if (s >= 0)
                used[l * 32 + e] = now;
            if (step % 97 == 0 && rng_below(r, 3) == 0 && slru_peek(c, l, e) >= 0)
                slru_pin(c, l, e);
            /* now and then the pool shrinks: a slot (free, resident or pinned) is retired */
            if (rng_below(r, 150) == 0 && n_retired + 1 < ns) {
                int t = (int)rng_below(r, (uint32_t)ns), rl, re;
                int rc = slru_retire(c, t, &rl, &re);
                CHECK(rc == (retired[t] ? -EALREADY : 0), "retire %d: %d", t, rc);
                if (rc == 0) {
                    CHECK(rl < 0 || slru_peek(c, rl, re) < 0, "retired expert still mapped");
                    retired[t] = true;
                    n_retired++;
                    CHECK(slru_live_slots(c) == ns - n_retired, "live slots");
                }
            }
            if (slru_check(c) != 0) {
                CHECK(0, "invariants broken at trial %d step %d", trial, step);
                break;
            }
        }
        uint64_t hits = 0, misses = 0, adm = 0;
        for (int l = 0; l < nl; l++) {
            hits += slru_stats(c, l)->hits;
            misses += slru_stats(c, l)->misses;
            adm += slru_stats(c, l)->admissions;
        }
        CHECK(hits + misses == lookups && adm == admitted && misses == admitted + refused,
              "stats add up: hits %llu misses %llu lookups %llu", (unsigned long long)hits,
              (unsigned long long)misses, (unsigned long long)lookups);
        slru_close(c);
    }
}

int main(void)
{
    struct rng r;
    rng_seed(&r, test_seed("test_slru"), 6);
    check_probation_first();
    check_guard();
    check_fairness();
    check_pins_and_stats();
    check_clear_place();
    check_wide_steps();
    check_frequency_admission();
    check_random(&r);
    return test_finish("test_slru");
}
