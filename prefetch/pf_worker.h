/* pf_worker: the prefetch worker of the host-driven expert cache (--prefetch with the copy and
 * hybrid placements). The cache leaves each layer's predicted admissions and copies pending
 * (expert_cache_defer_prefetch); once the layer's experts are launched, pf_worker_kick makes
 * them (SLRU admissions, copies on the cache's prefetch stream, their events), on the caller's
 * thread or handed to the worker's own thread, which makes them while the caller's thread goes
 * on launching (and the hybrid CPU lane computes); the cache's next entry point waits for it.
 * moe_layer takes the caller's thread unless STRATA_PF_WORKER=2: on the H200 machine the
 * thread's wake-up made the copies start later (more of them still copying when their layer
 * ran) and decode 3% slower (bench/profiles.md).
 *
 * DESIGN. Ownership: the cache belongs to the caller's thread, except from a kick until the
 * settle that follows it (the cache calls it at its next entry point), when it belongs to the
 * worker; in between the caller touches only the cache's getters that the job does not write
 * (cpu_experts, tier_ptrs, host_ids, the slot counts: expert_cache.h). One mutex guards the
 * worker's state (busy, stop, rc); one condition variable wakes the thread (a kick, or stop),
 * another the settling caller. Lock order: that mutex alone; the job runs without it.
 * Invariants: at most one job in flight; settle returns only once busy is false; the job's
 * decisions, copies and statistics are those prepare_copy would have made itself, in the same
 * order (the caller settles before any other cache call), so logits and statistics do not
 * depend on the worker. The thread makes the backend's device current before its first CUDA
 * call. Shutdown: pf_worker_close settles, sets stop, wakes and joins the thread, and hands
 * prediction back to prepare_copy. Without a thread (threaded false) a kick makes the job on
 * the caller's thread at once: after the layer's launch, but not beside it. */
#ifndef STRATA_PF_WORKER_H
#define STRATA_PF_WORKER_H

#include <stdbool.h>

struct expert_cache;
struct pf_worker;

/* Starts a worker for c (its thread when threaded, making CUDA device `device` current) and
 * defers c's predictions to it. 0 or -errno (nothing started). */
int pf_worker_open(struct pf_worker **out, struct expert_cache *c, int device, bool threaded);

/* Hands the predictions the last prepare_copy left pending to the worker; nothing when there
 * are none. Returns at once (threaded) or once they are made. 0 or -errno (a job's error when
 * made here). */
int pf_worker_kick(struct pf_worker *w);

/* Whether the jobs run on the worker's own thread. */
bool pf_worker_threaded(const struct pf_worker *w);

/* Jobs handed over so far, and those made (by the thread, when threaded). */
void pf_worker_counts(const struct pf_worker *w, unsigned long long *kicked,
                      unsigned long long *made);

/* Settles, stops the thread and gives c's predictions back to prepare_copy. NULL: nothing. */
void pf_worker_close(struct pf_worker *w);

#endif
