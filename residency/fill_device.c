/* fill_device: serving misses by path (c), the GPU's own cache (cuda_devcache.h). At a layer
 * call the host only enqueues one kernel launch: the lookup (hits, least recently used victims
 * among the layer's slots, table entries) and the copies. Nothing is read back and nothing
 * waits, so decode steps record into one CUDA graph.
 *
 * The first call takes the SLRU's state over (ec_dev_init): every slot goes to one layer's
 * list (its pinned experts, then a share of the rest by the layer's demand as the copy path
 * counted it, or an even one without counts; never more than n_expert), the
 * experts the SLRU held keep their slots where their layer's share allows, and from then on
 * the device state rules: the SLRU is not consulted again, preloading and shrinking are
 * refused, and statistics come from the device's counters.
 *
 * Prediction (expert_cache_prefetch_device): the experts predicted for a layer's next call
 * are admitted by a one-block launch on a listing stream of its own (stamped as in use by that
 * call, so its own misses cannot evict them), which lists their copies as the layer's batch; a
 * copy launch of few blocks follows it on the prefetch stream, beside the compute stream's
 * work. The layer's call makes the compute stream wait for the listing only, which waits for
 * nothing but the compute stream's work before it: not for the copies of the layers predicted
 * before (on the prefetch stream, a listing behind them made every layer wait for the previous
 * layer's whole batch). Its lookup copies what its hits still need of the batch itself, so a
 * wasted prediction costs the layer nothing but PCIe time. Only that layer's slots and state
 * change meanwhile, and each layer has its own batch and event. A layer's next listing follows
 * its previous batch's copies: the compute stream waits for every copy (pf_last) at the end of
 * each step (expert_cache_step_flush, which in a recorded graph joins the fork) and at a call
 * with no listing since its layer's last batch, and a second listing of a layer within one
 * step (--prefetch-depth) waits for pf_last itself. */
#include "cache_priv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_devcache.h"
#include "errors.h"
#include "slru.h"

/* STRATA_DEVCACHE_EVEN=1: every layer an even share of the slots (for comparisons). */
static bool ec_dev_even(void)
{
    const char *e = getenv("STRATA_DEVCACHE_EVEN");
    return e && !strcmp(e, "1");
}

/* Fewest unpinned slots a layer's list gets under demand-weighted shares: a call of one token
 * needs k at once (no more can be hits), and a few beyond them keep a layer whose routing the
 * host saw little of from thrashing. */
#define EC_DEV_MIN_SHARE(k) ((k) + (k) / 2)

/* Demand-weighted shares of the dyn unpinned slots: each layer first gets
 * EC_DEV_MIN_SHARE(k) (at most its room), then slot by slot the layer whose next most used
 * expert (by use_cnt, its pinned ones left out) was chosen most often: the slots go to the
 * experts the copy path's calls chose most, over all layers. Layers differ a lot: on the
 * 48-layer 30b-a3b preset the first layers choose all 128 experts in a 128-token window, the
 * deepest 25-33, and even shares left the first ones thrashing while the deep ones held more
 * slots than experts they use (bench/devcache_replay.py on tools/lockstep_sim's trace: 24.6
 * misses a token at 37% of the experts with even shares, 6.0 with these; 11.0 and 0.4 at 59%;
 * 83.2 and 81.8 at 13.5%). Returns false (want untouched) without counts to go by, or with
 * fewer slots than the floor in every layer takes. */
static bool ec_dev_demand(const struct expert_cache *c, const int *pinned, int dyn, int *want)
{
    const int nl = c->n_layer, ne = c->n_expert, k = (int)c->m->hp.n_expert_used;
    if (dyn < nl * EC_DEV_MIN_SHARE(k)) /* too few slots for a floor in every layer */
        return false;
    uint64_t total = 0;
    for (size_t i = 0; i < (size_t)nl * ne; i++)
        total += c->use_cnt[i];
    uint32_t *sorted = total ? malloc(sizeof(uint32_t) * (size_t)nl * ne) : NULL;
    if (!sorted)
        return false;
    for (int l = 0; l < nl; l++) { /* each layer's counts, most used first, pinned ones out */
        uint32_t *row = sorted + (size_t)l * ne;
        int n = 0;
        for (int e = 0; e < ne; e++) {
            const int s = slru_peek(c->slru, l, e);
            if (s < 0 || !slru_slot_pinned(c->slru, s))
                row[n++] = c->use_cnt[(size_t)l * ne + e];
        }
        for (; n < ne; n++)
            row[n] = 0;
        for (int i = 1; i < ne; i++) /* insertion sort, descending: n_expert is small */
            for (int j = i; j > 0 && row[j] > row[j - 1]; j--) {
                uint32_t t = row[j];
                row[j] = row[j - 1];
                row[j - 1] = t;
            }
    }
    int left = dyn;
    for (int l = 0; l < nl; l++) {
        const int room = ne - pinned[l], base = EC_DEV_MIN_SHARE(k);
        want[l] = base < room ? base : room;
        left -= want[l];
    }
    while (left > 0) { /* the next slot to the layer whose next expert is used most */
        int best = -1;
        for (int l = 0; l < nl; l++)
            if (pinned[l] + want[l] < ne &&
                (best < 0 ||
                 sorted[(size_t)l * ne + want[l]] > sorted[(size_t)best * ne + want[best]]))
                best = l;
        if (best < 0)
            break;
        want[best]++;
        left--;
    }
    free(sorted);
    return true;
}

/* How many slots each layer's list gets: its pinned ones plus a share of the others, at most
 * n_expert in all: by demand where the copy path counted the layers' choices since the last
 * hand-over (ec_dev_demand), else an even share (the rest of it going round to layers with
 * room). */
static void ec_dev_shares(const struct expert_cache *c, const int *pinned, int live, int *want)
{
    int n_pin = 0, left = 0;
    for (int l = 0; l < c->n_layer; l++)
        n_pin += pinned[l];
    int dyn = live - n_pin;
    if (!ec_dev_even() && ec_dev_demand(c, pinned, dyn, want))
        return;
    for (int l = 0; l < c->n_layer; l++) {
        int share = dyn / c->n_layer + (l < dyn % c->n_layer);
        int room = c->n_expert - pinned[l];
        want[l] = share < room ? share : room;
        left += share - want[l];
    }
    for (bool more = true; left > 0 && more;) {
        more = false;
        for (int l = 0; l < c->n_layer && left > 0; l++)
            if (pinned[l] + want[l] < c->n_expert) {
                want[l]++;
                left--;
                more = true;
            }
    }
}

/* The host side of the state, built from the SLRU's: the lists, slot_of, owner, stamp. */
static int ec_dev_build(struct expert_cache *c, int32_t *slot_of, int32_t *owner, uint32_t *stamp,
                        int32_t *list)
{
    const int ns = c->n_slots, nl = c->n_layer, ne = c->n_expert;
    int *pinned = calloc((size_t)nl, sizeof(int)), *want = calloc((size_t)nl, sizeof(int));
    int *kept = calloc((size_t)nl, sizeof(int));
    int32_t *free_s = malloc(sizeof(int32_t) * (size_t)ns),
            *lay = malloc(sizeof(int32_t) * (size_t)ns);
    if (!pinned || !want || !kept || !free_s || !lay) {
        free(pinned), free(want), free(kept), free(free_s), free(lay);
        return err_set(-ENOMEM, "out of memory");
    }
    int live = 0, n_free = 0;
    for (int i = 0; i < nl * ne; i++)
        slot_of[i] = -1;
    for (int s = 0; s < ns; s++) {
        int l, e;
        owner[s] = -1;
        stamp[s] = 0;
        lay[s] = -1;
        if (slru_slot_retired(c->slru, s))
            continue;
        live++;
        if (slru_slot_key(c->slru, s, &l, &e) == 0 && slru_slot_pinned(c->slru, s))
            pinned[l]++;
    }
    ec_dev_shares(c, pinned, live, want);
    for (int s = 0; s < ns; s++) {
        int l, e;
        if (slru_slot_retired(c->slru, s))
            continue;
        if (slru_slot_key(c->slru, s, &l, &e) != 0) {
            free_s[n_free++] = s;
            continue;
        }
        bool pin = slru_slot_pinned(c->slru, s);
        if (!pin && kept[l] == want[l]) { /* beyond the layer's share: back to host memory */
            ec_point_host(c, l, e);
            free_s[n_free++] = s;
            continue;
        }
        kept[l] += !pin;
        lay[s] = l;
        owner[s] = e;
        ec_point_slot(c, l, e, s); /* an admission of (b) still waiting for its switch */
        stamp[s] = pin ? CUDA_DEVCACHE_PINNED : 1;
        slot_of[(size_t)l * ne + e] = s;
    }
    int f = 0;
    for (int l = 0; l < nl; l++)
        for (; kept[l] < want[l] && f < n_free; kept[l]++)
            lay[free_s[f++]] = l;
    int at = 0;
    for (int l = 0; l < nl; l++) {
        c->dev_list_at[l] = at;
        for (int s = 0; s < ns; s++)
            if (lay[s] == l)
                list[at++] = s;
        c->dev_list_n[l] = at - c->dev_list_at[l];
    }
    free(pinned), free(want), free(kept), free(free_s), free(lay);
    return 0;
}

static int ec_dev_init(struct expert_cache *c)
{
    const size_t ns = (size_t)c->n_slots, nl = (size_t)c->n_layer, ne = (size_t)c->n_expert;
    if (c->tier)
        return err_set(-ENOTSUP, "expert cache: the GPU's own cache with a host tier");
    if (ne > CUDA_DEVCACHE_MAX_EXPERT)
        return err_set(-ENOTSUP,
                       "expert cache: the GPU's own cache takes at most %d experts "
                       "a layer (the model has %zu)",
                       CUDA_DEVCACHE_MAX_EXPERT, ne);
    c->dev_list_at = calloc(nl, sizeof(int));
    c->dev_list_n = calloc(nl, sizeof(int));
    c->dev_base = calloc(nl, sizeof(*c->dev_base));
    c->dev_stats_h = calloc(nl * DEVCACHE_NSTAT, sizeof(*c->dev_stats_h));
    c->pf_done = calloc(nl, sizeof(*c->pf_done));
    c->pf_pending = calloc(nl, 1);
    c->pf_live = calloc(nl, 1);
    int32_t *slot_of = malloc(sizeof(int32_t) * nl * ne), *owner = malloc(sizeof(int32_t) * ns);
    int32_t *list = malloc(sizeof(int32_t) * ns);
    uint32_t *stamp = malloc(sizeof(uint32_t) * ns), *clock = malloc(sizeof(uint32_t) * nl);
    int rc = !c->dev_list_at || !c->dev_list_n || !c->dev_base || !c->dev_stats_h || !slot_of ||
                     !owner || !list || !stamp || !clock || !c->pf_done || !c->pf_pending ||
                     !c->pf_live
                 ? err_set(-ENOMEM, "out of memory")
                 : 0;
    /* nothing may be copying or reading the tables while the state changes hands */
    rc = rc ? rc : ec_flush(c);
    rc = rc ? rc : cuda_stream_sync(c->compute);
    rc = rc ? rc : cuda_stream_sync(c->copy);
    rc = rc ? rc : cuda_stream_sync(c->pf_list);
    rc = rc ? rc : cuda_stream_sync(c->pf_stream);
    rc = rc ? rc : ec_dev_build(c, slot_of, owner, stamp, list);
    /* the host paths' bookkeeping of copies in flight is void: every copy has landed, and the
     * device admits without it */
    c->n_pend = c->n_next = 0;
    memset(c->slot_pf, 0, (size_t)ns);
    memset(c->prefetched, 0, nl * ne);
    for (size_t l = 0; l < nl && clock; l++)
        clock[l] = 1; /* slots the SLRU held have stamp 1, free ones 0: free ones go first */
    rc = rc ? rc : cuda_malloc((void **)&c->d_slot_of, sizeof(int32_t) * nl * ne);
    rc = rc ? rc : cuda_malloc((void **)&c->d_owner, sizeof(int32_t) * ns);
    rc = rc ? rc : cuda_malloc((void **)&c->d_stamp, sizeof(uint32_t) * ns);
    rc = rc ? rc : cuda_malloc((void **)&c->d_list, sizeof(int32_t) * ns);
    rc = rc ? rc : cuda_malloc((void **)&c->d_clock, sizeof(uint32_t) * nl);
    rc = rc ? rc : cuda_malloc((void **)&c->d_freq, sizeof(uint32_t) * nl * ne);
    rc = rc ? rc : cuda_memset(c->d_freq, 0, sizeof(uint32_t) * nl * ne, c->compute);
    rc = rc ? rc : cuda_malloc((void **)&c->d_slot_ptr, sizeof(uint8_t *) * ns);
    rc = rc ? rc
            : cuda_malloc((void **)&c->d_stats, sizeof(unsigned long long) * nl * DEVCACHE_NSTAT);
    rc = rc ? rc : cuda_malloc((void **)&c->d_jobs, sizeof(struct cuda_devcache_job) * 3 * ne);
    rc = rc ? rc : cuda_malloc((void **)&c->d_n_jobs, sizeof(uint32_t) * 2);
    rc = rc ? rc : cuda_malloc((void **)&c->d_pf, ns);
    rc = rc ? rc
            : cuda_malloc((void **)&c->d_pf_jobs, sizeof(struct cuda_devcache_job) * 3 * ne * nl);
    rc = rc ? rc : cuda_malloc((void **)&c->d_pf_n_jobs, sizeof(uint32_t) * 2 * nl);
    rc = rc ? rc : cuda_malloc((void **)&c->d_pend, sizeof(int32_t) * ns);
    rc = rc ? rc : cuda_malloc((void **)&c->d_pf_claim, sizeof(uint32_t) * 3 * ne * nl);
    rc = rc ? rc : cuda_malloc((void **)&c->d_pf_done, sizeof(uint32_t) * 3 * ne * nl);
    rc = rc ? rc : cuda_memset(c->d_pf_n_jobs, 0, sizeof(uint32_t) * 2 * nl, c->compute);
    rc = rc ? rc : cuda_memset(c->d_pend, 0, sizeof(int32_t) * ns, c->compute);
    for (size_t l = 0; l < nl && !rc; l++)
        rc = cuda_event_create(&c->pf_done[l]);
    rc = rc ? rc : cuda_memset(c->d_pf, 0, ns, c->compute);
    rc = rc ? rc : cuda_malloc((void **)&c->d_sync, 2 * sizeof(uint32_t));
    rc = rc ? rc : cuda_memset(c->d_sync, 0, 2 * sizeof(uint32_t), c->compute);
    rc = rc ? rc : cuda_h2d(c->d_slot_of, slot_of, sizeof(int32_t) * nl * ne, c->compute);
    rc = rc ? rc : cuda_h2d(c->d_owner, owner, sizeof(int32_t) * ns, c->compute);
    rc = rc ? rc : cuda_h2d(c->d_stamp, stamp, sizeof(uint32_t) * ns, c->compute);
    rc = rc ? rc : cuda_h2d(c->d_list, list, sizeof(int32_t) * ns, c->compute);
    rc = rc ? rc : cuda_h2d(c->d_clock, clock, sizeof(uint32_t) * nl, c->compute);
    rc = rc ? rc : cuda_h2d(c->d_slot_ptr, c->slot, sizeof(uint8_t *) * ns, c->compute);
    rc = rc ? rc
            : cuda_memset(c->d_stats, 0, sizeof(unsigned long long) * nl * DEVCACHE_NSTAT,
                          c->compute);
    rc = rc ? rc : cuda_h2d(c->tab_dev, c->tab_host, sizeof(void *) * nl * P_N * ne, c->compute);
    rc = rc ? rc : cuda_stream_sync(c->compute); /* the host arrays are freed below */
    free(slot_of), free(owner), free(list), free(stamp), free(clock);
    if (rc)
        return err_set(rc, "expert cache: handing the slots to the GPU failed");
    memset(c->dirty, 0, nl);
    memset(c->use_cnt, 0, sizeof(*c->use_cnt) * nl * ne); /* the next hand-over's from now */
    for (size_t l = 0; l < nl; l++) /* what the SLRU counted until now */
        c->dev_base[l] = *expert_cache_stats(c, (int)l);
    c->dev = true;
    c->dev_epoch++;
    if (c->log) {
        int lo = c->n_expert, hi = 0;
        for (size_t l = 0; l < nl; l++) {
            lo = c->dev_list_n[l] < lo ? c->dev_list_n[l] : lo;
            hi = c->dev_list_n[l] > hi ? c->dev_list_n[l] : hi;
        }
        fprintf(c->log, "strata: the GPU runs the expert cache: %d to %d slots a layer\n", lo, hi);
    }
    return 0;
}

/* STRATA_DEVCACHE_LRU=1: victims by recency alone (cuda_devcache.h), for comparisons. */
static int ec_dev_by_recency(void)
{
    static int v = -1; /* decided once; a race writes the same value */
    if (v < 0) {
        const char *e = getenv("STRATA_DEVCACHE_LRU");
        v = e && !strcmp(e, "1");
    }
    return v;
}

/* The arguments of a layer's lookup: its slices of the state, its table, its counters. */
static struct cuda_devcache_call ec_dev_call(struct expert_cache *c, int layer,
                                             const int32_t *ids_dev, int n_pairs)
{
    const size_t ne = (size_t)c->n_expert;
    struct cuda_devcache_call a = {
        .ids = ids_dev,
        .n_pairs = n_pairs,
        .n_expert = c->n_expert,
        .slot_of = c->d_slot_of + (size_t)layer * ne,
        .list = c->d_list + c->dev_list_at[layer],
        .n_list = c->dev_list_n[layer],
        .pf = c->d_pf,
        .owner = c->d_owner,
        .stamp = c->d_stamp,
        .clock = c->d_clock + layer,
        .freq = c->d_freq + (size_t)layer * ne,
        .by_recency = ec_dev_by_recency(),
        .no_admit = c->dev_no_admit,
        .tab = c->tab_dev + (size_t)layer * P_N * ne,
        .slot_ptr = c->d_slot_ptr,
        .stats = c->d_stats + (size_t)layer * DEVCACHE_NSTAT,
        .jobs = c->d_jobs,
        .n_jobs = c->d_n_jobs,
        .sync = c->d_sync,
        .pend = c->d_pend,
        .pf_jobs = c->d_pf_jobs + (size_t)layer * 3 * ne,
        .pf_claim = c->d_pf_claim + (size_t)layer * 3 * ne,
        .pf_done = c->d_pf_done + (size_t)layer * 3 * ne,
    };
    for (int p = 0; p < P_N; p++) {
        a.mapped[p] = c->lay[layer].mapped[p];
        a.stride[p] = c->lay[layer].stride[p];
        a.off[p] = c->off[p];
    }
    return a;
}

int ec_dev_join(struct expert_cache *c)
{
    int rc = c->pf_last_set ? cuda_stream_wait(c->compute, c->pf_last) : 0;
    c->pf_last_set = false;
    memset(c->pf_live, 0, (size_t)c->n_layer);
    /* every listing and copy so far is behind the compute stream now: no layer's next call
     * waits for its batch (a batch the CPU lane's admissions listed for the next step would
     * otherwise make a later recording wait on an event of an earlier one) */
    memset(c->pf_pending, 0, (size_t)c->n_layer);
    return rc;
}

static int ec_prepare_device(struct expert_cache *c, int layer, const int32_t *ids_dev, int n_pairs,
                             const float *logits, float *w_dev, struct expert_tables *t);

int expert_cache_prepare_device(struct expert_cache *c, int layer, const int32_t *ids_dev,
                                int n_pairs, struct expert_tables *t)
{
    return ec_prepare_device(c, layer, ids_dev, n_pairs, NULL, NULL, t);
}

int expert_cache_prepare_device_select(struct expert_cache *c, int layer, const float *logits,
                                       int32_t *ids_dev, float *w_dev, int n_pairs,
                                       struct expert_tables *t)
{
    if (!logits || !ids_dev || !w_dev || n_pairs < 1 || n_pairs > 32 ||
        c->n_expert > CUDA_DEVCACHE_SELECT_MAX)
        return err_set(-EINVAL, "expert cache: layer %d: no selection of %d of %d experts", layer,
                       n_pairs, c->n_expert);
    return ec_prepare_device(c, layer, ids_dev, n_pairs, logits, w_dev, t);
}

static int ec_prepare_device(struct expert_cache *c, int layer, const int32_t *ids_dev, int n_pairs,
                             const float *logits, float *w_dev, struct expert_tables *t)
{
    int settled = ec_settle(c);
    if (settled)
        return settled;
    if (n_pairs > c->max_pairs)
        return err_set(-EINVAL, "expert cache: %d pairs (at most %d)", n_pairs, c->max_pairs);
    int rc = c->dev ? 0 : ec_dev_init(c);
    if (rc)
        return rc;
    struct cuda_devcache_call a = ec_dev_call(c, layer, ids_dev, n_pairs);
    if (logits) { /* the lookup selects the experts first, into ids_dev and w_dev */
        a.logits = logits;
        a.ids_w = (int32_t *)ids_dev;
        a.w_w = w_dev;
    }
    /* the layer's prefetch decisions (its slots, its state) first; the lookup then copies
     * what it uses of their batch (none: no batch to look at) */
    if (!c->pf_pending[layer])
        a.pend = NULL;
    if (c->pf_pending[layer])
        rc = cuda_stream_wait(c->compute, c->pf_done[layer]);
    else if (c->pf_live[layer])
        rc = ec_dev_join(c);
    c->pf_pending[layer] = 0;
    /* without admissions or a batch to finish nothing is copied: one block does the
     * bookkeeping */
    rc = rc ? rc : cuda_devcache_run(&a, a.no_admit && !a.pend ? 1 : 0, c->compute);
    if (rc)
        return err_set(rc, "expert cache: layer %d: the GPU's lookup failed", layer);
    ec_tables(c, layer, t);
    return 0;
}

/* Blocks of a prefetch's copy kernel: a sixth of an H100/H200's SMs, which still keeps more
 * than 2 MB of reads in flight over PCIe */
#define EC_PF_BLOCKS 22

static int ec_dev_prefetch(struct expert_cache *c, int layer, const int32_t *ids_dev, int n_pairs,
                           bool gate);

int expert_cache_prefetch_device(struct expert_cache *c, int layer, const int32_t *ids_dev,
                                 int n_pairs)
{
    return ec_dev_prefetch(c, layer, ids_dev, n_pairs, false);
}

int expert_cache_admit_device(struct expert_cache *c, int layer, const int32_t *ids_dev,
                              int n_pairs)
{
    return ec_dev_prefetch(c, layer, ids_dev, n_pairs, true);
}

static int ec_dev_prefetch(struct expert_cache *c, int layer, const int32_t *ids_dev, int n_pairs,
                           bool gate)
{
    int settled = ec_settle(c);
    if (settled)
        return settled;
    if (!c->dev)
        return err_set(-EINVAL, "expert cache: a GPU prefetch before the GPU took the cache over");
    if (layer < 0 || layer >= c->n_layer || n_pairs > c->max_pairs)
        return err_set(-EINVAL, "expert cache: prefetch of %d pairs for layer %d", n_pairs, layer);
    const size_t ne = (size_t)c->n_expert;
    struct cuda_devcache_job *jobs = c->d_pf_jobs + (size_t)layer * 3 * ne;
    uint32_t *n_jobs = c->d_pf_n_jobs + 2 * (size_t)layer;
    struct cuda_devcache_call a = ec_dev_call(c, layer, ids_dev, n_pairs);
    a.prefetch = 1;
    a.list_only = 1;
    a.no_admit = 0; /* a prediction is there to be admitted */
    a.gate = gate;
    a.jobs = jobs;
    a.n_jobs = n_jobs;
    a.sync = c->d_sync + 1;
    /* the listing after the compute stream's work so far (and, when the layer has a batch
     * from earlier in this step, after that batch's copies: the listing retires it), on a
     * stream of its own; its copies after it on the prefetch stream */
    int rc = cuda_event_record(c->copy_mark, c->compute);
    rc = rc ? rc : cuda_stream_wait(c->pf_list, c->copy_mark);
    if (!rc && c->pf_live[layer] && c->pf_last_set)
        rc = cuda_stream_wait(c->pf_list, c->pf_last);
    rc = rc ? rc : cuda_devcache_run(&a, 1, c->pf_list);
    rc = rc ? rc : cuda_event_record(c->pf_done[layer], c->pf_list);
    rc = rc ? rc : cuda_stream_wait(c->pf_stream, c->pf_done[layer]);
    rc = rc ? rc
            : cuda_devcache_copy(jobs, n_jobs, a.pf_claim, a.pf_done, EC_PF_BLOCKS, c->pf_stream);
    rc = rc ? rc : cuda_event_record(c->pf_last, c->pf_stream);
    if (rc)
        return err_set(rc, "expert cache: layer %d: the GPU's prefetch failed", layer);
    c->pf_last_set = true;
    c->pf_pending[layer] = 1;
    c->pf_live[layer] = 1;
    return 0;
}

void expert_cache_device_admit(struct expert_cache *c, bool admit)
{
    c->dev_no_admit = !admit;
}

int expert_cache_lane_view(struct expert_cache *c, int layer, struct expert_cache_lane_view *v)
{
    if (!c->dev || layer < 0 || layer >= c->n_layer)
        return err_set(-EINVAL, "expert cache: no GPU cache state for layer %d", layer);
    if (!c->zero_slot) {
        int rc = cuda_malloc(&c->zero_slot, c->slot_bytes);
        rc = rc ? rc : cuda_memset(c->zero_slot, 0, c->slot_bytes, c->compute);
        if (rc) {
            cuda_free(c->zero_slot);
            c->zero_slot = NULL;
            return err_set(rc, "expert cache: no device memory for the zero slot");
        }
    }
    const size_t ne = (size_t)c->n_expert;
    v->slot_of = c->d_slot_of + (size_t)layer * ne;
    v->tab = c->tab_dev + (size_t)layer * P_N * ne;
    v->zero = c->zero_slot;
    for (int p = 0; p < P_N; p++) {
        v->mapped[p] = c->lay[layer].mapped[p];
        v->stride[p] = c->lay[layer].stride[p];
    }
    return 0;
}

int expert_cache_device_start(struct expert_cache *c)
{
    int settled = ec_settle(c);
    if (settled)
        return settled;
    return c->dev ? 0 : ec_dev_init(c);
}

int expert_cache_device_slots(const struct expert_cache *c, int layer)
{
    return c->dev && layer >= 0 && layer < c->n_layer ? c->dev_list_n[layer] : -1;
}

bool expert_cache_on_device(const struct expert_cache *c)
{
    return c->dev;
}

uint32_t expert_cache_device_epoch(const struct expert_cache *c)
{
    return c->dev_epoch;
}

int ec_dev_stats(const struct expert_cache *c, int layer, struct expert_cache_layer_stats *s)
{
    unsigned long long *d = c->dev_stats_h + (size_t)layer * DEVCACHE_NSTAT;
    int rc = cuda_d2h(d, c->d_stats + (size_t)layer * DEVCACHE_NSTAT, sizeof(*d) * DEVCACHE_NSTAT,
                      c->compute);
    rc = rc ? rc : cuda_stream_sync(c->compute);
    if (rc)
        return rc;
    const struct expert_cache_layer_stats *b = &c->dev_base[layer];
    *s = *b;
    s->hits += d[DEVCACHE_HITS];
    s->misses += d[DEVCACHE_MISSES];
    s->evictions += d[DEVCACHE_EVICTIONS];
    s->admissions += d[DEVCACHE_ADMISSIONS];
    s->bytes_copied += d[DEVCACHE_BYTES_COPIED];
    s->bytes_zerocopy += d[DEVCACHE_BYTES_INPLACE];
    s->admissions += d[DEVCACHE_PF_ADMITTED];
    s->prefetched += d[DEVCACHE_PF_ADMITTED];
    s->prefetch_used += d[DEVCACHE_PF_USED];
    s->prefetch_wasted += d[DEVCACHE_PF_WASTED_BYTES];
    return 0;
}

int ec_dev_reset_stats(struct expert_cache *c)
{
    memset(c->dev_base, 0, sizeof(*c->dev_base) * (size_t)c->n_layer);
    return cuda_memset(c->d_stats, 0,
                       sizeof(unsigned long long) * (size_t)c->n_layer * DEVCACHE_NSTAT,
                       c->compute);
}

int ec_dev_slot_of(const struct expert_cache *c, int layer, int expert)
{
    int32_t s = -1;
    if (layer < 0 || layer >= c->n_layer || expert < 0 || expert >= c->n_expert)
        return -1;
    int rc =
        cuda_d2h(&s, c->d_slot_of + (size_t)layer * c->n_expert + expert, sizeof(s), c->compute);
    rc = rc ? rc : cuda_stream_sync(c->compute);
    return rc ? -1 : s;
}

/* The device state downloaded and checked: every live slot in exactly one layer's list, owner
 * and slot_of inverse of each other within the layer, table entries at the slot or at the
 * host bytes accordingly. 0 or -EFAULT (-errno when the download fails). */
int ec_dev_check(const struct expert_cache *c)
{
    const size_t ns = (size_t)c->n_slots, nl = (size_t)c->n_layer, ne = (size_t)c->n_expert;
    int32_t *slot_of = malloc(sizeof(int32_t) * nl * ne), *owner = malloc(sizeof(int32_t) * ns);
    int32_t *list = malloc(sizeof(int32_t) * ns);
    void **tab = malloc(sizeof(void *) * nl * P_N * ne);
    int *in = calloc(ns, sizeof(int));
    int rc = !slot_of || !owner || !list || !tab || !in ? -ENOMEM : 0;
    rc = rc ? rc : cuda_d2h(slot_of, c->d_slot_of, sizeof(int32_t) * nl * ne, c->compute);
    rc = rc ? rc : cuda_d2h(owner, c->d_owner, sizeof(int32_t) * ns, c->compute);
    rc = rc ? rc : cuda_d2h(list, c->d_list, sizeof(int32_t) * ns, c->compute);
    rc = rc ? rc : cuda_d2h(tab, c->tab_dev, sizeof(void *) * nl * P_N * ne, c->compute);
    rc = rc ? rc : cuda_stream_sync(c->compute);
    for (size_t l = 0; l < nl && !rc; l++) {
        for (int i = 0; i < c->dev_list_n[l] && !rc; i++) {
            int s = list[c->dev_list_at[l] + i];
            if (s < 0 || (size_t)s >= ns || in[s]++)
                rc = -EFAULT; /* a slot lost to the range or held twice */
            else if (owner[s] >= 0 && slot_of[l * ne + (size_t)owner[s]] != s)
                rc = -EFAULT;
        }
        for (size_t e = 0; e < ne && !rc; e++) {
            int s = slot_of[l * ne + e];
            for (int p = 0; p < P_N && !rc; p++) {
                const void *want =
                    s >= 0 ? (const void *)(c->slot[s] + c->off[p])
                           : (const void *)(c->lay[l].mapped[p] + e * c->lay[l].stride[p]);
                if (tab[(l * P_N + (size_t)p) * ne + e] != want ||
                    (s >= 0 && ((size_t)s >= ns || owner[s] != (int)e)))
                    rc = -EFAULT;
            }
        }
    }
    free(slot_of), free(owner), free(list), free(tab), free(in);
    return rc;
}

void ec_dev_close(struct expert_cache *c)
{
    void *dev_mem[] = {c->d_slot_of,  c->d_owner,   c->d_stamp,     c->d_list,   c->d_clock,
                       c->d_slot_ptr, c->d_stats,   c->d_jobs,      c->d_n_jobs, c->d_pf,
                       c->d_sync,     c->d_pf_jobs, c->d_pf_n_jobs, c->d_pend,   c->d_pf_claim,
                       c->d_pf_done,  c->d_freq};
    for (size_t i = 0; i < sizeof(dev_mem) / sizeof(dev_mem[0]); i++)
        cuda_free(dev_mem[i]);
    for (int l = 0; c->pf_done && l < c->n_layer; l++)
        cuda_event_destroy(c->pf_done[l]);
    free(c->pf_done);
    free(c->pf_pending);
    free(c->pf_live);
    free(c->dev_list_at);
    free(c->dev_list_n);
    free(c->dev_base);
    free(c->dev_stats_h);
    c->d_slot_of = c->d_owner = c->d_list = c->d_pend = NULL;
    c->d_stamp = c->d_clock = c->d_n_jobs = c->d_sync = c->d_pf_n_jobs = c->d_freq = NULL;
    c->d_pf_claim = c->d_pf_done = NULL;
    c->d_slot_ptr = NULL;
    c->d_stats = NULL;
    c->d_jobs = c->d_pf_jobs = NULL;
    c->d_pf = c->pf_pending = c->pf_live = NULL;
    c->pf_done = NULL;
    c->dev_list_at = c->dev_list_n = NULL;
    c->dev_base = NULL;
    c->dev_stats_h = NULL;
    c->dev = false;
}

/* (layer, slot) by stamp: the order the SLRU takes the slots back in, least recent first */
struct ec_dev_back {
    uint32_t stamp;
    int32_t slot;
};

static int ec_dev_back_cmp(const void *x, const void *y)
{
    const struct ec_dev_back *a = x, *b = y;
    return a->stamp != b->stamp ? (a->stamp < b->stamp ? -1 : 1)
                                : (a->slot > b->slot) - (a->slot < b->slot);
}

int expert_cache_device_stop(struct expert_cache *c)
{
    int settled = ec_settle(c);
    if (settled)
        return settled;
    if (!c->dev)
        return 0;
    const size_t ns = (size_t)c->n_slots, nl = (size_t)c->n_layer, ne = (size_t)c->n_expert;
    int32_t *owner = malloc(sizeof(int32_t) * ns), *list = malloc(sizeof(int32_t) * ns);
    int32_t *lay = malloc(sizeof(int32_t) * ns);
    uint32_t *stamp = malloc(sizeof(uint32_t) * ns);
    struct ec_dev_back *order = malloc(sizeof(*order) * ns);
    struct expert_cache_layer_stats *tot = calloc(nl, sizeof(*tot));
    if (!c->slru_off)
        c->slru_off = calloc(nl, sizeof(*c->slru_off));
    int rc = !owner || !list || !lay || !stamp || !order || !tot || !c->slru_off
                 ? err_set(-ENOMEM, "out of memory")
                 : 0;
    for (size_t l = 0; l < nl && !rc; l++) /* what was counted until now (syncs compute) */
        rc = ec_dev_stats(c, (int)l, &tot[l]);
    rc = rc ? rc : cuda_stream_sync(c->pf_list);
    rc = rc ? rc : cuda_stream_sync(c->pf_stream);
    rc = rc ? rc : cuda_stream_sync(c->copy);
    rc = rc ? rc : cuda_d2h(owner, c->d_owner, sizeof(int32_t) * ns, c->compute);
    rc = rc ? rc : cuda_d2h(stamp, c->d_stamp, sizeof(uint32_t) * ns, c->compute);
    rc = rc ? rc : cuda_d2h(list, c->d_list, sizeof(int32_t) * ns, c->compute);
    rc = rc ? rc : cuda_d2h(c->tab_host, c->tab_dev, sizeof(void *) * nl * P_N * ne, c->compute);
    rc = rc ? rc : cuda_stream_sync(c->compute);
    if (rc) {
        free(owner), free(list), free(lay), free(stamp), free(order), free(tot);
        return err_set(rc, "expert cache: taking the slots back from the GPU failed");
    }
    /* the SLRU holds what the slots hold, least recent first, pinned ones pinned */
    for (size_t s = 0; s < ns; s++)
        lay[s] = -1;
    for (size_t l = 0; l < nl; l++)
        for (int i = 0; i < c->dev_list_n[l]; i++)
            lay[list[c->dev_list_at[l] + i]] = (int32_t)l;
    int n = 0;
    for (size_t s = 0; s < ns; s++)
        if (lay[s] >= 0 && owner[s] >= 0)
            order[n++] = (struct ec_dev_back){stamp[s], (int32_t)s};
    qsort(order, (size_t)n, sizeof(*order), ec_dev_back_cmp);
    slru_clear(c->slru);
    for (int i = 0; i < n && !rc; i++) {
        int s = order[i].slot;
        rc = slru_place(c->slru, s, lay[s], owner[s]);
        if (!rc && order[i].stamp == CUDA_DEVCACHE_PINNED)
            rc = slru_pin(c->slru, lay[s], owner[s]);
    }
    /* the statistics go on from the device's totals */
    for (size_t l = 0; l < nl && !rc; l++) {
        const struct slru_layer_stats *q = slru_stats(c->slru, (int)l);
        struct expert_cache_layer_stats *o = &c->slru_off[l];
        o->hits = tot[l].hits - q->hits;
        o->misses = tot[l].misses - q->misses;
        o->promotions = tot[l].promotions - q->promotions;
        o->evictions = tot[l].evictions - q->evictions;
        o->admissions = tot[l].admissions - q->admissions;
        c->stats[l] = tot[l];
    }
    free(owner), free(list), free(lay), free(stamp), free(order), free(tot);
    if (rc)
        return err_set(rc, "expert cache: the slots the GPU gave back do not fit the policy");
    memset(c->dirty, 0, nl); /* the device's tables are the host's again */
    ec_dev_close(c);
    if (c->log)
        fprintf(c->log, "strata: the GPU gave the expert cache back to the host\n");
    return 0;
}
