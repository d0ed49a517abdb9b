/* preload: a residency profile's experts placed into slots before the first token, in one pass
 * over the copy stream, optionally pinned for good (frozen). */
#include "cache_priv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "slru.h"

/* With a tier: the experts of the run of entries from i on that share entry i's layer (one
 * layer's worth at most, none twice, none in a slot) fetched into the tier, once the copies
 * from its previous fetch have landed. 0 or -errno. */
static int ec_preload_fetch(struct expert_cache *c, const int32_t *layer, const int32_t *expert,
                            int i, int n)
{
    int l = layer[i], k = 0;
    int rc = ec_flush(c);
    rc = rc ? rc : cuda_stream_sync(c->copy);
    if (rc)
        return rc;
    c->stamp++;
    for (int j = i; j < n && layer[j] == l && k < c->n_expert; j++) {
        int e = expert[j];
        if (e < 0 || e >= c->n_expert || c->seen[e] == c->stamp || slru_peek(c->slru, l, e) >= 0)
            continue;
        c->seen[e] = c->stamp;
        c->tier_ids[k++] = e;
    }
    return ec_tier_fetch(c, l, c->tier_ids, k);
}

int expert_cache_preload(struct expert_cache *c, const int32_t *layer, const int32_t *expert,
                         int n, bool pin, expert_cache_progress_fn progress, void *ctx)
{
    int settled = ec_settle(c);
    if (settled)
        return settled;
    int placed = 0, rc = 0, *slot_of = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));

    if (!slot_of)
        return err_set(-ENOMEM, "out of memory");
    if (c->dev) {
        free(slot_of);
        return err_set(-EBUSY, "expert cache: the GPU runs the cache already: a profile is "
                               "restored before the first token");
    }
    /* nothing may be reading the tables or copying while they change */
    rc = ec_flush(c);
    rc = rc ? rc : cuda_stream_sync(c->compute);
    rc = rc ? rc : cuda_stream_sync(c->copy);
    rc = rc ? rc : cuda_stream_sync(c->pf_stream);
    if (rc) {
        free(slot_of);
        return err_set(rc, "expert cache: sync before restoring a profile failed");
    }
    slru_step(c->slru); /* every expert placed below stays in use: none evicts another */
    for (int i = 0; i < n && !rc; i++) {
        slot_of[i] = -1;
        int l = layer[i], e = expert[i];
        if (l < 0 || l >= c->n_layer || e < 0 || e >= c->n_expert) {
            rc = err_set(-EINVAL, "expert cache: no expert %d in layer %d to restore", e, l);
            break;
        }
        if (slru_peek(c->slru, l, e) >= 0) {
            slot_of[i] = slru_peek(c->slru, l, e);
        } else {
            if (c->tier && !ec_tier_has(c, l, e) && (rc = ec_preload_fetch(c, layer, expert, i, n)))
                break;
            if ((slot_of[i] = ec_admit(c, l, e, &rc)) < 0)
                break; /* the pool is full */
        }
        placed++;
        if (pin && !rc)
            slru_pin(c->slru, l, e);
        if (progress && (i + 1) % 64 == 0)
            progress(ctx, i + 1, n);
    }
    rc = rc ? rc : ec_flush(c);
    rc = rc ? rc : cuda_stream_sync(c->copy);
    for (int i = 0; i < placed && !rc; i++)
        ec_point_slot(c, layer[i], expert[i], slot_of[i]);
    for (int l = 0; l < c->n_layer && !rc; l++)
        rc = ec_upload(c, l);
    rc = rc ? rc : cuda_stream_sync(c->compute);
    free(slot_of);
    if (rc)
        return err_set(rc, "expert cache: restoring a profile failed");
    if (progress)
        progress(ctx, n, n);
    slru_step(c->slru);
    return placed;
}

int expert_cache_slot_of(const struct expert_cache *c, int layer, int expert)
{
    (void)ec_settle(c);
    if (c->dev)
        return ec_dev_slot_of(c, layer, expert);
    return slru_peek(c->slru, layer, expert);
}

int expert_cache_check(const struct expert_cache *c)
{
    int settled = ec_settle(c);
    if (settled)
        return settled;
    return c->dev ? ec_dev_check(c) : slru_check(c->slru);
}

void expert_cache_reset_stats(struct expert_cache *c)
{
    (void)ec_settle(c);
    memset(c->stats, 0, sizeof(*c->stats) * (size_t)c->n_layer);
    if (c->slru_off)
        memset(c->slru_off, 0, sizeof(*c->slru_off) * (size_t)c->n_layer);
    slru_reset_stats(c->slru);
    if (c->dev)
        ec_dev_reset_stats(c);
}
