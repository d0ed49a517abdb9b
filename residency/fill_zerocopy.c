/* fill_zerocopy: serving misses by path (b). Nothing waits: a layer's tables are uploaded as
 * they are, misses are read in place over PCIe by the kernels, and the routing ids go back to
 * the host asynchronously. Once per step (expert_cache_step_end, after the host synced the
 * compute stream anyway) the SLRU is updated and misses admitted: copied into their slots on
 * the copy stream, and their entries switched to the slot at the next step end, once the copy
 * is known complete and the slot has seen no admission since. A victim's entry goes back to
 * host memory before its slot is overwritten, while nothing runs. Inside a recorded CUDA graph
 * every layer's table is uploaded at every replay from the pinned mirror. */
#include "cache_priv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "slru.h"

int expert_cache_prepare_zerocopy(struct expert_cache *c, int layer, const int32_t *ids_dev,
                                  int n_pairs, struct expert_tables *t)
{
    int settled = ec_settle(c);
    if (settled)
        return settled;
    int rc = 0;
    if (n_pairs > c->max_pairs)
        return err_set(-EINVAL, "expert cache: %d pairs (at most %d)", n_pairs, c->max_pairs);
    if (c->tier) /* misses would be read in place, after the host tier has moved on */
        return err_set(-ENOTSUP, "expert cache: zero-copy misses with a host tier");
    if (c->n_pending_ids[layer] >= 0) { /* the layer ran twice in one step: settle the first */
        rc = cuda_stream_sync(c->compute);
        rc = rc ? err_set(rc, "expert cache: sync failed") : expert_cache_step_end(c);
        if (rc)
            return rc;
    }
    if (c->recording && !c->tab_all) { /* every layer's table in one upload per replay */
        size_t nt = (size_t)c->n_layer * P_N * (size_t)c->n_expert;
        rc = cuda_h2d(c->tab_dev, c->tab_host, nt * sizeof(void *), c->compute);
        if (rc)
            return err_set(rc, "expert cache: uploading the slot tables failed");
        memset(c->dirty, 0, (size_t)c->n_layer);
        c->tab_all = true;
    } else if (!c->recording) {
        rc = ec_upload(c, layer);
    }
    if (!rc && c->copies_pending) { /* a prediction's copies (copy path) must land first */
        rc = ec_flush(c);
        rc = rc ? rc : cuda_event_record(c->copy_done, c->copy);
        rc = rc ? rc : cuda_stream_wait(c->compute, c->copy_done);
        c->copies_pending = false;
    }
    /* and so must the prefetch stream's: a copy-path call (a prompt) may have pointed entries
     * at predicted experts whose copies its layers never waited for, since they did not use
     * them; this call reads whatever its entries point at */
    if (!rc && c->pf_last_set) {
        rc = cuda_stream_wait(c->compute, c->pf_last);
        c->pf_last_set = false;
    }
    const bool slice =
        ids_dev == c->zc_ids_dev + (size_t)layer * c->zc_pairs && n_pairs <= c->zc_pairs;
    if (!slice)
        rc = rc ? rc
                : cuda_d2h(c->ids_host + (size_t)layer * c->max_pairs, ids_dev,
                           sizeof(int32_t) * (size_t)n_pairs, c->compute);
    if (rc)
        return err_set(rc, "expert cache: layer %d: enqueueing the routing read-back failed",
                       layer);
    c->n_pending_ids[layer] = n_pairs;
    c->zc_slice[layer] = slice;
    if (slice)
        c->zc_flushed = false;
    if (c->recording)
        c->zc_slice_rec[layer] = slice;
    ec_tables(c, layer, t);
    return 0;
}

static int ec_push_next(struct expert_cache *c, int l, int e, int s, uint32_t gen)
{
    if (c->n_next == c->cap_pend) {
        int cap = c->cap_pend ? 2 * c->cap_pend : 256;
        struct ec_pending *a = realloc(c->pend, sizeof(*a) * (size_t)cap);
        if (!a)
            return err_set(-ENOMEM, "out of memory");
        c->pend = a;
        struct ec_pending *b = realloc(c->next, sizeof(*b) * (size_t)cap);
        if (!b)
            return err_set(-ENOMEM, "out of memory");
        c->next = b;
        c->cap_pend = cap;
    }
    c->next[c->n_next++] = (struct ec_pending){l, e, s, gen};
    return 0;
}

int32_t *expert_cache_zc_ids(struct expert_cache *c, int layer, int n_pairs)
{
    (void)ec_settle(c);
    return layer >= 0 && layer < c->n_layer && n_pairs <= c->zc_pairs
               ? c->zc_ids_dev + (size_t)layer * c->zc_pairs
               : NULL;
}

/* Whether a layer's pending ids wait in its slice. */
static bool ec_zc_waiting(const struct expert_cache *c)
{
    for (int l = 0; l < c->n_layer; l++)
        if (c->n_pending_ids[l] >= 0 && c->zc_slice[l])
            return true;
    return false;
}

int expert_cache_step_flush(struct expert_cache *c)
{
    int settled = ec_settle(c);
    if (settled)
        return settled;
    if (c->dev) { /* (c): the step's prefetch copies join it */
        int rc = ec_dev_join(c);
        return rc ? err_set(rc, "expert cache: joining the prefetch stream failed") : 0;
    }
    if (c->zc_flushed || !ec_zc_waiting(c))
        return 0;
    int rc = cuda_d2h(c->zc_ids_host, c->zc_ids_dev,
                      sizeof(int32_t) * (size_t)c->n_layer * (size_t)c->zc_pairs, c->compute);
    if (rc)
        return err_set(rc, "expert cache: enqueueing the routing read-back failed");
    c->zc_flushed = true;
    if (c->recording)
        c->zc_flush_rec = true;
    return 0;
}

void expert_cache_set_recording(struct expert_cache *c, bool recording)
{
    (void)ec_settle(c);
    c->recording = recording;
    c->tab_all = false;
    if (recording) {
        memset(c->zc_slice_rec, 0, (size_t)c->n_layer);
        c->zc_flush_rec = false;
    }
}

void expert_cache_replayed(struct expert_cache *c, int n_pairs)
{
    (void)ec_settle(c);
    if (c->dev) /* (c) read nothing back */
        return;
    for (int l = 0; l < c->n_layer; l++) {
        c->n_pending_ids[l] = n_pairs;
        c->zc_slice[l] = c->zc_slice_rec[l];
    }
    c->zc_flushed = c->zc_flush_rec;
}

int expert_cache_step_end(struct expert_cache *c)
{
    int settled = ec_settle(c);
    if (settled)
        return settled;
    int rc = cuda_stream_sync(c->copy); /* the previous step end's admissions have landed */
    if (rc)
        return err_set(rc, "expert cache: waiting for the copy stream failed");
    if (!c->zc_flushed && ec_zc_waiting(c)) { /* nobody flushed: read the slices back now */
        rc = expert_cache_step_flush(c);
        rc = rc ? rc : cuda_stream_sync(c->compute);
        if (rc)
            return err_set(rc, "expert cache: reading the routing back failed");
    }
    c->zc_flushed = false;
    c->n_next = 0;
    for (int l = 0; l < c->n_layer && !rc; l++) {
        int n = c->n_pending_ids[l];
        if (n < 0)
            continue;
        c->n_pending_ids[l] = -1;
        const int32_t *ids = c->zc_slice[l] ? c->zc_ids_host + (size_t)l * c->zc_pairs
                                            : c->ids_host + (size_t)l * c->max_pairs;
        c->zc_slice[l] = 0;
        slru_step(c->slru);
        c->stamp++;
        for (int i = 0; i < n && !rc; i++) {
            int e = ids[i];
            if (e < 0 || e >= c->n_expert || c->seen[e] == c->stamp)
                continue;
            c->seen[e] = c->stamp;
            if (!ec_in_slot(c, l, e))
                c->stats[l].bytes_zerocopy += ec_expert_bytes(c, l);
            if (slru_lookup(c->slru, l, e) >= 0)
                continue;
            int s = ec_admit(c, l, e, &rc);
            if (s >= 0 && !rc)
                rc = ec_push_next(c, l, e, s, c->slot_gen[s]);
        }
    }
    rc = rc ? rc : ec_flush(c);
    /* The previous step end's admissions are complete: switch those whose slot has seen no
     * admission since. Still holding the expert is not enough: evicted and admitted again into
     * the same slot above, its new copy is in flight behind another expert's bytes. */
    for (int i = 0; i < c->n_pend; i++) {
        struct ec_pending *p = &c->pend[i];
        if (c->slot_gen[p->slot] == p->gen &&
            slru_peek(c->slru, p->layer, p->expert) == p->slot)
            ec_point_slot(c, p->layer, p->expert, p->slot);
    }
    struct ec_pending *t = c->pend;
    c->pend = c->next;
    c->next = t;
    c->n_pend = c->n_next;
    c->n_next = 0;
    return rc;
}
