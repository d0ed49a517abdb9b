/* slru: the host-side policy of the VRAM expert slot cache (DESIGN §6).
 *
 * DESIGN. Fixed-size slots hold experts, keyed by (layer, expert). New arrivals enter the
 * probation segment; a second hit promotes to the protected segment (whose size is capped at a
 * share of the slots not pinned; its LRU tail is demoted back to probation's head). Pinned
 * slots (a frozen profile) leave both segments for a list of their own, so no operation walks
 * them. A victim is the least recent evictable slot of probation, then of protected, where
 * evictable means: not in use in the current step (looked up or admitted since the last
 * slru_step: the experts of the layer being computed), not of the layer after the guard (the
 * next one to compute: a global LRU would evict exactly the experts needed soonest), and fair:
 * while the admitting layer holds fewer movable slots than its share (the slots not pinned /
 * n_layer), victims come only from layers above their share (from any layer when none is), so
 * one layer cannot starve the others; once at its share, a layer recycles its own slots only,
 * and when all of them are in use the expert is served without a slot. A lockstep batch's
 * layer call looks up the union of its rows' choices, which can exceed the share: taking the
 * excess from other layers would evict, step after step, the experts the layers after it
 * are about to use.
 * Admission is frequency-aware: every layer counts, per expert, the steps that looked it up
 * (once a step; a layer's counts halve every 64 of its steps, SLRU_FREQ_WINDOW). An expert
 * that would evict one of its own layer's slots is admitted only if it is used at least as
 * often as that victim; otherwise it is served without a slot and the victim stays. Recency
 * then orders experts of like frequency, and the experts only one row of a wide step chose
 * cannot push out the layer's hot set. Pinned slots count against neither rule.
 * Ownership: single-threaded; the MoE dispatch that owns it calls every function (the device
 * side reads a slot table the caller keeps in sync). No locks.
 */
#ifndef STRATA_SLRU_H
#define STRATA_SLRU_H

#include <stdbool.h>
#include <stdint.h>

struct slru_config {
    int n_layer, n_expert; /* key space */
    int n_slots;           /* slots in the pool, >= 1 */
    int protected_pct;     /* protected segment cap as % of n_slots; 0 = default 50 */
};

struct slru_layer_stats {
    uint64_t hits, misses, promotions, evictions, admissions;
    uint64_t bypassed; /* admissions refused (-ENOSPC): served without a slot */
};

struct slru;

/* 0, -EINVAL (bad sizes) or -ENOMEM. */
int slru_open(const struct slru_config *cfg, struct slru **out);
void slru_close(struct slru *c);

/* Starts a step (one layer's plan): slots used before it are no longer "in use". */
void slru_step(struct slru *c);

/* The slot holding (layer, expert), or -1. Marks it in use for this step. Counts a hit (and promotes a probation slot hit
 * for the second time) or a miss in the layer's stats, and the step's use of the expert in its
 * frequency (once a step, however often it is looked up). */
int slru_lookup(struct slru *c, int layer, int expert);

/* The slot holding (layer, expert), or -1, without touching recency or stats. */
int slru_peek(const struct slru *c, int layer, int expert);

/* Places (layer, expert) (not resident) in a slot: a free one, or a victim as the DESIGN above
 * says: never a slot in use this step, never one of layer (guard + 1) % n_layer (guard < 0: no
 * guard). The new slot is in use for this step. Returns the slot
 * (>= 0) and, when a resident expert was evicted, its key in *ev_layer and *ev_expert (else -1);
 * -ENOSPC when no slot may be taken (every candidate pinned, in use, guarded or another layer's
 * fair share) or the victim, a slot of the same layer, is used more often than (layer, expert):
 * the caller then serves the expert without caching it (counted as bypassed); -EEXIST if it is
 * already resident, -EINVAL for a bad key. */
int slru_admit(struct slru *c, int layer, int expert, int guard, int *ev_layer, int *ev_expert);

/* Pins a resident expert for good (frozen profile): it leaves the segments, is never a victim
 * and still counts its hits. 0, -ENOENT. */
int slru_pin(struct slru *c, int layer, int expert);

/* Takes a slot out of the pool for good (the memory behind it is being given back): a free
 * slot leaves the free list; a resident expert is evicted first (counted as an eviction), its
 * key in *ev_layer / *ev_expert (else -1), pinned or in use or not. The fair share and the
 * protected cap shrink with the pool. 0, -EINVAL for a bad slot, -EALREADY if retired. */
int slru_retire(struct slru *c, int slot, int *ev_layer, int *ev_expert);

/* Empties every slot, pinned ones too (retired ones stay out of the pool); statistics and use
 * counts stay. With slru_place, for taking over a slot state kept elsewhere. */
void slru_clear(struct slru *c);

/* Puts (layer, expert) into the free slot `slot`, as the most recent probation slot, not in use
 * in the current step; no statistic counts it. 0, -EINVAL (bad key or slot), -EEXIST (the key
 * is resident), -EBUSY (the slot is held or retired). */
int slru_place(struct slru *c, int slot, int layer, int expert);

/* Slots still in the pool (n_slots minus the retired ones). */
int slru_live_slots(const struct slru *c);

/* Key of a slot: 0 and the key, or -ENOENT for a free slot. */
int slru_slot_key(const struct slru *c, int slot, int *layer, int *expert);

/* Whether a slot holds a pinned expert / was taken out of the pool (slru_retire). */
bool slru_slot_pinned(const struct slru *c, int slot);
bool slru_slot_retired(const struct slru *c, int slot);

/* Zeroes every layer's statistics. */
void slru_reset_stats(struct slru *c);

const struct slru_layer_stats *slru_stats(const struct slru *c, int layer);
/* Slots held by a layer. */
int slru_layer_held(const struct slru *c, int layer);

/* Checks every internal invariant (lists, map, counts, caps); 0 or -EFAULT. For tests. */
int slru_check(const struct slru *c);

#endif
