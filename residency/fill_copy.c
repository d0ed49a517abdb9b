/* fill_copy: serving misses by path (a). After a layer's routing the host reads the chosen ids
 * back (one sync of the compute stream), looks each expert up in the SLRU, copies misses into
 * slots on the copy stream (a DMA per piece, or one gather kernel per batch) and makes the
 * compute stream wait for the copies with an event before the layer's experts run. Around that:
 * the hybrid split (the caller's split function sends some misses to the CPU lane, their
 * entries on an all-zero slot for the call), and prediction (the next layer's predicted experts
 * admitted behind this layer's copies, never evicting this layer's or the next but one's). */
#include "cache_priv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "disk_tier.h"
#include "errors.h"
#include "slru.h"

/* Enqueues a host-to-slot copy. DMA from registered memory must stay inside one registration,
 * so a source that straddles two of ec_register's pieces is copied in two parts. */
static int ec_h2d(struct expert_cache *c, uint8_t *dst, const uint8_t *src, uint64_t n)
{
    while (n) {
        uint64_t part = n;
        if (c->reg_lo) {
            uint64_t off = (uint64_t)(src - c->reg_lo), end = (off / c->reg_chunk + 1) * c->reg_chunk;
            part = end - off < n ? end - off : n;
        }
        int rc = cuda_h2d(dst, src, part, c->xfer);
        if (rc)
            return rc;
        dst += part;
        src += part;
        n -= part;
    }
    return 0;
}

/* Gather mode: launches the pieces collected so far on the copy stream. */
int ec_flush(struct expert_cache *c)
{
    int rc = c->batch.n ? cuda_gather_copy(&c->batch, c->xfer) : 0;
    c->batch.n = 0;
    return rc;
}

/* One piece of an expert into its slot: a DMA copy, or (gather mode) an item of the next
 * gather launch, which reads the mapped host bytes itself. */
static int ec_copy_piece(struct expert_cache *c, uint8_t *dst, const uint8_t *host,
                         const uint8_t *mapped, uint64_t n)
{
    if (!c->gather)
        return ec_h2d(c, dst, host, n);
    if (c->batch.n == CUDA_GATHER_MAX) {
        int rc = ec_flush(c);
        if (rc)
            return rc;
    }
    c->batch.item[c->batch.n].src = mapped;
    c->batch.item[c->batch.n].dst = dst;
    c->batch.item[c->batch.n].bytes = n;
    c->batch.n++;
    return 0;
}

int ec_admit(struct expert_cache *c, int l, int e, int *rc)
{
    return ec_admit_guard(c, l, e, l, rc);
}

/* Admits (l, e) into a slot and enqueues its copy; the evicted expert goes back to host (a
 * prefetched one that was never used counts as wasted). The slot, or -1 when every slot is
 * guarded (the expert stays in host memory). */
int ec_admit_guard(struct expert_cache *c, int l, int e, int guard, int *rc)
{
    int el = -1, ee = -1;
    int s = slru_admit(c->slru, l, e, guard, &el, &ee);
    if (s < 0) {
        if (s != -ENOSPC)
            *rc = err_set(s, "expert cache: admitting expert %d of layer %d failed", e, l);
        return -1;
    }
    if (el >= 0) {
        ec_point_host(c, el, ee);
        uint8_t *pf = &c->prefetched[(size_t)el * c->n_expert + ee];
        if (*pf)
            c->stats[el].prefetch_wasted += ec_expert_bytes(c, el);
        *pf = 0;
    }
    c->slot_gen[s]++;
    if (c->xfer == c->pf_stream) {
        c->slot_pf[s] = 1;
    } else if (c->slot_pf[s]) { /* a prefetch may still be writing this slot */
        int done = cuda_event_done(c->pf_last);
        *rc = done < 0 ? done : done ? 0 : cuda_stream_wait(c->copy, c->pf_last);
        memset(c->slot_pf, 0, (size_t)c->n_slots); /* every prefetch so far is ordered now */
    }
    for (int p = 0; p < P_N && !*rc; p++) {
        uint64_t at = (uint64_t)e * c->lay[l].stride[p];
        if (c->tier && !ec_tier_has(c, l, e)) { /* not fetched: a bug, never garbage */
            *rc = -EFAULT;
            break;
        }
        const uint8_t *host = c->tier ? ec_host_addr(c, l, p, e) : c->lay[l].host[p] + at;
        /* the tier's memory is registered in place: its mapped address is its host one */
        *rc = ec_copy_piece(c, c->slot[s] + c->off[p], host,
                            c->tier ? (uint8_t *)host : c->lay[l].mapped[p] + at,
                            c->lay[l].stride[p]);
    }
    if (*rc)
        *rc = err_set(*rc, "expert cache: streaming expert %d of layer %d failed", e, l);
    c->stats[l].bytes_copied += ec_expert_bytes(c, l);
    return s;
}

int ec_tier_fetch(struct expert_cache *c, int layer, const int32_t *ids, int n)
{
    memset(c->tier_ptr, 0, sizeof(*c->tier_ptr) * 3 * (size_t)c->n_expert);
    c->tier_layer = layer;
    if (n == 0)
        return 0;
    /* a copy out of the tier may still be running behind the previous call (hybrid admits a
     * CPU-lane expert there, from its tier slot): it must end before this request can read
     * another expert into that slot */
    int rc = c->copies_pending ? cuda_stream_sync(c->copy) : 0;
    if (rc)
        return err_set(rc, "expert cache: layer %d: waiting for copies out of the tier", layer);
    rc = disk_tier_get(c->tier, layer, ids, n, c->tier_got);
    if (rc)
        return err_wrap(rc, "expert cache: layer %d: ", layer);
    for (int i = 0; i < n; i++)
        for (int p = 0; p < P_N; p++)
            c->tier_ptr[3 * (size_t)ids[i] + p] = c->tier_got[3 * (size_t)i + p];
    return 0;
}

/* With a tier: this call's misses (c->tier_ids, n) fetched into it, then admitted and copied on
 * from there (or, when every slot is guarded, read in place there). Whether any was copied. */
static bool ec_tier_misses(struct expert_cache *c, int layer, int n, int *rc)
{
    bool copied = false;
    *rc = ec_tier_fetch(c, layer, c->tier_ids, n);
    for (int i = 0; i < n && !*rc; i++) {
        int e = c->tier_ids[i];
        int s = ec_admit(c, layer, e, rc);
        if (s >= 0) {
            ec_point_slot(c, layer, e, s);
            copied = true;
        } else {
            ec_point_host(c, layer, e);
            c->stats[layer].bytes_zerocopy += ec_expert_bytes(c, layer);
        }
    }
    return copied;
}

/* With a tier, predictions read the next layer's experts that no slot holds into the tier
 * ahead (disk_tier_read_ahead), instead of copying them into VRAM. */
static void ec_tier_ahead(struct expert_cache *c, int layer, int n_pred)
{
    int t = layer + 1, n = 0;
    c->stamp++;
    for (int i = 0; i < n_pred && layer + 1 < c->n_layer; i++) {
        int e = c->pred_host[i];
        if (e < 0 || e >= c->n_expert || c->seen[e] == c->stamp || slru_peek(c->slru, t, e) >= 0)
            continue;
        c->seen[e] = c->stamp;
        c->tier_ids[n++] = e;
    }
    if (n)
        disk_tier_read_ahead(c->tier, t, c->tier_ids, n);
}

/* Hybrid: the misses of this call, each to PCIe (admitted and copied) or the CPU (entries on
 * the zero slot until the layer's next call). Returns whether anything was copied. */
static bool ec_assign_misses(struct expert_cache *c, int layer, const int32_t *ids, int n_pairs,
                             int n_miss, int *rc)
{
    bool copied = false;
    memset(c->pair_count, 0, sizeof(*c->pair_count) * (size_t)c->n_expert);
    for (int j = 0; j < n_pairs; j++)
        if (ids[j] >= 0 && ids[j] < c->n_expert)
            c->pair_count[ids[j]]++;
    c->split(c->split_ctx, layer, c->miss_ids, n_miss, c->pair_count,
             ec_expert_bytes(c, layer), c->miss_cpu);
    /* A CPU-lane expert is not cached, so with the PCIe lane idle this call the cache would
     * stop learning (bench/hybrid.md: at 12 GiB on the H200 hybrid without it held a 97.0% hit
     * rate where streaming alone reached 99.8%): with admit_idle the first CPU-lane miss is
     * also copied into a slot, behind the call's copies, for the layer's next call; this call
     * still computes it on the CPU. */
    c->bg_id = -1;
    int n_pcie = 0;
    for (int i = 0; i < n_miss; i++)
        n_pcie += !c->miss_cpu[i];
    for (int i = 0; i < n_miss && c->admit_idle && !n_pcie && c->bg_id < 0; i++)
        c->bg_id = c->miss_ids[i];
    for (int i = 0; i < n_miss && !*rc; i++) {
        int e = c->miss_ids[i];
        if (c->miss_cpu[i]) {
            for (int p = 0; p < P_N; p++)
                *ec_entry(c, layer, p, e) = (uint8_t *)c->zero_slot + c->off[p];
            c->dirty[layer] = 1;
            c->zeroed[(size_t)layer * c->n_expert + c->n_zeroed[layer]++] = e;
            c->cpu_ids[c->n_cpu++] = e;
            c->stats[layer].cpu_computed++;
            continue;
        }
        int s = ec_admit(c, layer, e, rc);
        if (s >= 0) {
            ec_point_slot(c, layer, e, s);
            copied = true;
        } else { /* every slot guarded: read in place, from this call's tier slot with a tier */
            ec_point_host(c, layer, e);
            c->stats[layer].bytes_zerocopy += ec_expert_bytes(c, layer);
        }
    }
    return copied;
}

/* Admits predicted expert (t, e) on the prefetch stream (c->xfer) with an event behind its
 * copy, marked prefetched for the statistics and for the wait of the layer that uses it.
 * Whether it took a slot. */
static bool ec_pf_admit(struct expert_cache *c, int t, int e, int guard, int *rc)
{
    int s = ec_admit_guard(c, t, e, guard, rc);
    if (s < 0)
        return false;
    /* an event behind this expert's copy (gather mode: its pieces launched first) */
    if (!*rc && c->gather)
        *rc = ec_flush(c);
    if (!*rc && !c->slot_ev[s])
        *rc = cuda_event_create(&c->slot_ev[s]);
    *rc = *rc ? *rc : cuda_event_record(c->slot_ev[s], c->pf_stream);
    c->slot_pf_seq[s] = ++c->pf_seq;
    ec_point_slot(c, t, e, s);
    c->prefetched[(size_t)t * c->n_expert + e] = 1;
    c->stats[t].prefetched++;
    return true;
}

/* The predictions read back at layer's call, n_pred ids for each of n_depth layers ahead:
 * admitted behind the call's own copies, the next layer's first (never evicting the layer
 * after it, as a miss would not), deeper ones never evicting layer or layer + 1. Deeper blocks
 * are dropped while the previous prefetches are still copying. */
static int ec_prefetch(struct expert_cache *c, int layer, int n_pred, int n_depth)
{
    int rc = 0, busy = 0;
    bool any = false;
    if (n_depth > 1 && c->pf_last_set && (busy = cuda_event_done(c->pf_last)) < 0)
        return err_set(busy, "expert cache: querying the prefetch copies failed");
    busy = c->pf_last_set && busy == 0;
    /* the batch goes on the prefetch stream, after everything the copy stream holds (a victim
     * slot may still be receiving a copy there) */
    if (c->tier) {
        ec_tier_ahead(c, layer, n_pred);
        return 0;
    }
    rc = ec_flush(c);
    rc = rc ? rc : cuda_event_record(c->copy_mark, c->copy);
    rc = rc ? rc : cuda_stream_wait(c->pf_stream, c->copy_mark);
    c->xfer = c->pf_stream;
    for (int j = 0; j < n_depth && !rc && layer + 1 + j < c->n_layer; j++) {
        int t = layer + 1 + j;
        bool into = false;
        if (j > 0 && busy) {
            c->stats[t].prefetch_dropped += (uint64_t)n_pred;
            continue;
        }
        const int k = (int)c->m->hp.n_expert_used;
        for (int i = 0; i < n_pred && !rc; i++) {
            if (c->pf_top > 0 && i % k >= c->pf_top) /* a token's lesser predictions */
                continue;
            int e = c->pred_host[(size_t)j * n_pred + i];
            if (e < 0 || e >= c->n_expert || slru_peek(c->slru, t, e) >= 0)
                continue;
            into |= ec_pf_admit(c, t, e, j == 0 ? t : layer, &rc);
        }
        any |= into;
    }
    rc = rc ? rc : ec_flush(c);
    c->xfer = c->copy;
    if (any && !rc) {
        rc = cuda_event_record(c->pf_last, c->pf_stream);
        c->pf_last_set = true;
    }
    return rc ? err_set(rc, "expert cache: prefetching after layer %d failed", layer) : 0;
}

static int ec_cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int ec_run_pending(struct expert_cache *c)
{
    struct ec_defer *d = c->defer;
    if (!d || !d->pending)
        return 0;
    d->pending = false;
    return ec_prefetch(c, d->layer, d->n_pred, d->n_depth);
}

int ec_settle(const struct expert_cache *c)
{
    struct ec_defer *d = c->defer;
    if (!d)
        return 0;
    int rc = d->settle(d->ctx);
    int rp = ec_run_pending(d->owner);
    return rc ? rc : rp;
}

int expert_cache_defer_prefetch(struct expert_cache *c, expert_cache_settle_fn settle, void *ctx)
{
    int rc = ec_settle(c);
    if (!settle) {
        free(c->defer);
        c->defer = NULL;
        return rc;
    }
    if (!c->defer && !(c->defer = calloc(1, sizeof(*c->defer))))
        return err_set(-ENOMEM, "out of memory");
    *c->defer = (struct ec_defer){.settle = settle, .ctx = ctx, .owner = c};
    return rc;
}

int expert_cache_run_pending(struct expert_cache *c)
{
    return ec_run_pending(c);
}

bool expert_cache_has_pending(const struct expert_cache *c)
{
    return c->defer && c->defer->pending;
}

int expert_cache_prepare_copy(struct expert_cache *c, int layer, const int32_t *ids_dev,
                              int n_pairs, struct expert_tables *t)
{
    int32_t *ids = c->ids_host + (size_t)layer * c->max_pairs;
    bool copied = false;
    int rc = ec_settle(c);

    if (rc)
        return rc;
    if (n_pairs > c->max_pairs)
        return err_set(-EINVAL, "expert cache: %d pairs (at most %d)", n_pairs, c->max_pairs);
    if (c->n_pending_ids[layer] >= 0) { /* (b) ids of this layer not yet accounted */
        rc = cuda_stream_sync(c->compute); /* nothing may read a slot it re-assigns */
        rc = rc ? err_set(rc, "expert cache: sync failed") : expert_cache_step_end(c);
        if (rc)
            return rc;
    }
    int n_pred = layer + 1 < c->n_layer && c->pred_dev ? c->n_pred : 0;
    int n_depth = n_pred ? c->n_depth : 0;
    rc = cuda_d2h(ids, ids_dev, sizeof(int32_t) * (size_t)n_pairs, c->compute);
    if (!rc && n_pred)
        rc = cuda_d2h(c->pred_host, c->pred_dev, sizeof(int32_t) * (size_t)n_pred * n_depth,
                      c->compute);
    c->pred_dev = NULL;
    rc = rc ? rc : cuda_stream_sync(c->compute);
    if (rc)
        return err_set(rc, "expert cache: reading layer %d's routing back failed", layer);
    for (int i = 0; i < n_pairs; i++) /* the layer's demand, for a hand-over to the device */
        if (ids[i] >= 0 && ids[i] < c->n_expert)
            c->use_cnt[(size_t)layer * c->n_expert + ids[i]] += 1;
    /* prefetched experts this call uses that are still copying make its experts wait (too
     * late): for the latest of them, which the prefetch stream copies last */
    int wait_slot = -1;
    uint64_t wait_seq = 0;
    slru_step(c->slru);
    c->stamp++;
    /* the CPU lane's zero entries of this layer's previous call go back to host memory (that
     * call's kernel and table upload are done: the stream was synced above) */
    if (c->hybrid) {
        for (int i = 0; i < c->n_zeroed[layer]; i++) {
            int e = c->zeroed[(size_t)layer * c->n_expert + i];
            int s = slru_peek(c->slru, layer, e); /* admitted in the background since */
            if (s >= 0)
                ec_point_slot(c, layer, e, s);
            else
                ec_point_host(c, layer, e);
        }
        c->n_zeroed[layer] = 0;
        c->n_cpu = 0;
        c->bg_id = -1;
    }
    bool split = c->hybrid && n_pairs <= c->max_cpu_tok * (int)c->m->hp.n_expert_used;
    int n_miss = 0, n_tier = 0;
    for (int i = 0; i < n_pairs && !rc; i++) {
        int e = ids[i];
        if (e < 0 || e >= c->n_expert || c->seen[e] == c->stamp)
            continue; /* a bad id is the kernel's to report (NaN) */
        c->seen[e] = c->stamp;
        uint8_t *pf = &c->prefetched[(size_t)layer * c->n_expert + e];
        int ps = *pf ? slru_peek(c->slru, layer, e) : -1;
        if (ps >= 0) {
            c->stats[layer].prefetch_used++;
            int done = cuda_event_done(c->slot_ev[ps]);
            if (done < 0)
                rc = err_set(done, "expert cache: querying layer %d's prefetch copies failed",
                             layer);
            if (done == 0) {
                c->stats[layer].prefetch_late++;
                if (c->slot_pf_seq[ps] > wait_seq)
                    wait_seq = c->slot_pf_seq[ps], wait_slot = ps;
            }
        }
        *pf = 0;
        if (slru_lookup(c->slru, layer, e) >= 0) {
            if (!ec_in_slot(c, layer, e)) /* admitted by (b) and not yet switched */
                c->stats[layer].bytes_zerocopy += ec_expert_bytes(c, layer);
            continue;
        }
        if (split) { /* decided together below */
            c->miss_ids[n_miss++] = e;
            continue;
        }
        if (c->tier) { /* fetched together below */
            c->tier_ids[n_tier++] = e;
            continue;
        }
        int s = ec_admit(c, layer, e, &rc);
        if (s >= 0) {
            ec_point_slot(c, layer, e, s);
            copied = true;
        } else {
            c->stats[layer].bytes_zerocopy += ec_expert_bytes(c, layer);
        }
    }
    if (split && n_miss && !rc) {
        qsort(c->miss_ids, (size_t)n_miss, sizeof(int32_t), ec_cmp_i32);
        /* with a tier, both lanes' misses from one request: the CPU lane reads them there */
        if (c->tier && (rc = ec_tier_fetch(c, layer, c->miss_ids, n_miss)))
            return rc;
        copied |= ec_assign_misses(c, layer, ids, n_pairs, n_miss, &rc);
        qsort(c->cpu_ids, (size_t)c->n_cpu, sizeof(int32_t), ec_cmp_i32);
    }
    if (c->tier && n_tier && !rc)
        copied |= ec_tier_misses(c, layer, n_tier, &rc);
    rc = rc ? rc : ec_upload(c, layer);
    /* this layer's experts wait for every copy enqueued so far: its misses, and experts a
     * prediction at the previous layer admitted, whose entries already point at their slots */
    rc = rc ? rc : ec_flush(c);
    if (!rc && (copied || c->copies_pending)) {
        rc = cuda_event_record(c->copy_done, c->copy);
        rc = rc ? rc : cuda_stream_wait(c->compute, c->copy_done);
        if (rc)
            rc = err_set(rc, "expert cache: ordering layer %d after its copies failed", layer);
        c->copies_pending = false;
    }
    if (!rc && wait_slot >= 0 && (rc = cuda_stream_wait(c->compute, c->slot_ev[wait_slot])))
        rc = err_set(rc, "expert cache: ordering layer %d after its prefetches failed", layer);
    /* then a CPU-lane expert of this call, for the layer's next call (its entries stay on the
     * zero slot until then; the next layer's call waits for the copy) */
    if (!rc && c->hybrid && c->bg_id >= 0 && slru_peek(c->slru, layer, c->bg_id) < 0 &&
        ec_admit(c, layer, c->bg_id, &rc) >= 0) {
        c->stats[layer].cpu_admitted++;
        c->copies_pending = true;
    }
    /* then the predicted experts of the next layers start copying behind them: here, or
     * deferred (expert_cache_defer_prefetch) to after the layer's launch; the table of this
     * layer is final either way (predictions admit into the next layers only) */
    if (!rc && c->defer && n_pred)
        *c->defer = (struct ec_defer){.settle = c->defer->settle,
                                      .ctx = c->defer->ctx,
                                      .owner = c,
                                      .pending = true,
                                      .layer = layer,
                                      .n_pred = n_pred,
                                      .n_depth = n_depth};
    else
        rc = rc ? rc : ec_prefetch(c, layer, n_pred, n_depth);
    rc = rc ? rc : ec_flush(c);
    ec_tables(c, layer, t);
    return rc;
}

void expert_cache_set_hybrid_admit(struct expert_cache *c, bool on)
{
    (void)ec_settle(c);
    c->admit_idle = on;
}

const uint8_t *const *expert_cache_tier_ptrs(const struct expert_cache *c)
{
    return c->tier ? c->tier_ptr : NULL;
}

int expert_cache_set_hybrid(struct expert_cache *c, expert_cache_split_fn split, void *ctx,
                            int max_cpu_tok)
{
    int settled = ec_settle(c);
    if (settled)
        return settled;
    size_t ne = (size_t)c->n_expert;
    c->cpu_ids = malloc(sizeof(*c->cpu_ids) * ne);
    c->miss_ids = malloc(sizeof(*c->miss_ids) * ne);
    c->pair_count = malloc(sizeof(*c->pair_count) * ne);
    c->miss_cpu = malloc(ne);
    c->zeroed = malloc(sizeof(*c->zeroed) * ne * (size_t)c->n_layer);
    c->n_zeroed = calloc((size_t)c->n_layer, sizeof(*c->n_zeroed));
    if (!c->cpu_ids || !c->miss_ids || !c->pair_count || !c->miss_cpu ||
        !c->zeroed || !c->n_zeroed)
        return err_set(-ENOMEM, "out of memory");
    int rc = cuda_malloc(&c->zero_slot, c->slot_bytes);
    rc = rc ? rc : cuda_memset(c->zero_slot, 0, c->slot_bytes, c->compute);
    rc = rc ? rc : cuda_stream_sync(c->compute);
    if (rc)
        return err_set(rc, "expert cache: no device memory for the zero slot");
    c->split = split;
    c->split_ctx = ctx;
    c->max_cpu_tok = max_cpu_tok;
    c->bg_id = -1;
    c->hybrid = true;
    return 0;
}

void expert_cache_hybrid_pause(struct expert_cache *c, bool pause)
{
    (void)ec_settle(c);
    if (!c->split)
        return;
    for (int l = 0; pause && c->hybrid && l < c->n_layer; l++) {
        for (int i = 0; i < c->n_zeroed[l]; i++) {
            int e = c->zeroed[(size_t)l * c->n_expert + i];
            int s = slru_peek(c->slru, l, e);
            if (s >= 0)
                ec_point_slot(c, l, e, s);
            else
                ec_point_host(c, l, e);
        }
        c->n_zeroed[l] = 0;
    }
    if (pause) {
        c->n_cpu = 0;
        c->bg_id = -1;
    }
    c->hybrid = !pause;
}

int expert_cache_cpu_experts(const struct expert_cache *c, const int32_t **ids)
{
    *ids = c->cpu_ids;
    return c->n_cpu;
}

void expert_cache_predict_next(struct expert_cache *c, const int32_t *pred_dev, int n)
{
    expert_cache_predict_ahead(c, pred_dev, n, 1);
}

void expert_cache_predict_ahead(struct expert_cache *c, const int32_t *pred_dev, int n,
                                int n_depth)
{
    (void)ec_settle(c);
    c->pred_dev = pred_dev;
    c->n_pred = n < c->max_pairs ? n : c->max_pairs;
    c->n_depth = n_depth < 1 ? 1 : n_depth > EXPERT_CACHE_MAX_DEPTH ? EXPERT_CACHE_MAX_DEPTH
                                                                     : n_depth;
}

int expert_cache_lookahead(struct expert_cache *c, const int32_t *ids, int n)
{
    int settled = ec_settle(c);
    if (settled)
        return settled;
    int rc = 0, admitted = 0;
    if (c->dev || c->tier || n <= 0)
        return 0;
    /* behind everything the copy stream holds (a victim slot may still be receiving a copy) */
    rc = ec_flush(c);
    rc = rc ? rc : cuda_event_record(c->copy_mark, c->copy);
    rc = rc ? rc : cuda_stream_wait(c->pf_stream, c->copy_mark);
    c->xfer = c->pf_stream;
    for (int l = 0; l < c->n_layer && !rc; l++) {
        c->stamp++;
        for (int i = 0; i < n && !rc; i++) {
            int e = ids[(size_t)l * n + i];
            if (e < 0 || e >= c->n_expert || c->seen[e] == c->stamp)
                continue;
            c->seen[e] = c->stamp;
            if (slru_peek(c->slru, l, e) >= 0)
                continue;
            /* no guard: the SLRU's fairness and frequency rules pick the victim, never a
             * slot in use in the current call */
            admitted += ec_pf_admit(c, l, e, -1, &rc);
        }
    }
    rc = rc ? rc : ec_flush(c);
    c->xfer = c->copy;
    if (admitted && !rc) {
        rc = cuda_event_record(c->pf_last, c->pf_stream);
        c->pf_last_set = true;
    }
    return rc ? err_set(rc, "expert cache: the lookahead's copies failed") : admitted;
}

const int32_t *expert_cache_host_ids(const struct expert_cache *c, int layer)
{
    return c->ids_host + (size_t)layer * c->max_pairs;
}
