/* expert_cache: opening and closing the expert cache; its design is in expert_cache.h and
 * the parts are listed in cache_priv.h. */
#include "cache_priv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "errors.h"
#include "slru.h"

int expert_cache_open(const struct model *m, const struct expert_cache_config *cfg, void *compute_stream,
                      struct expert_cache **out)
{
    struct expert_cache *c = calloc(1, sizeof(*c));
    int rc;

    if (!c)
        return err_set(-ENOMEM, "out of memory");
    c->m = m;
    c->n_layer = (int)m->hp.n_layer;
    c->n_expert = (int)m->hp.n_expert;
    c->max_pairs = cfg->max_pairs > 0 ? cfg->max_pairs : 1;
    c->compute = compute_stream;
    c->log = cfg->log;
    c->gather = cfg->gather;
    c->pf_top = cfg->prefetch_top;
    c->tier = cfg->tier;
    c->tier_layer = -1;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    c->reg_chunk = cfg->pin_chunk / page * page;
    if (!c->reg_chunk)
        c->reg_chunk = REG_CHUNK_DEFAULT;
    size_t nt = (size_t)c->n_layer * P_N * (size_t)c->n_expert;
    c->lay = calloc((size_t)c->n_layer, sizeof(*c->lay));
    c->dirty = calloc((size_t)c->n_layer, 1);
    c->n_pending_ids = malloc(sizeof(int) * (size_t)c->n_layer);
    c->seen = calloc((size_t)c->n_expert, sizeof(*c->seen));
    c->stats = calloc((size_t)c->n_layer, sizeof(*c->stats));
    c->prefetched = calloc((size_t)c->n_layer * (size_t)c->n_expert, 1);
    c->use_cnt = calloc((size_t)c->n_layer * (size_t)c->n_expert, sizeof(*c->use_cnt));
    if (!c->lay || !c->dirty || !c->n_pending_ids || !c->seen || !c->stats || !c->prefetched ||
        !c->use_cnt) {
        rc = err_set(-ENOMEM, "out of memory");
        goto fail;
    }
    for (int l = 0; l < c->n_layer; l++)
        c->n_pending_ids[l] = -1;
    rc = cuda_stream_create(&c->copy);
    rc = rc ? rc : cuda_stream_create(&c->pf_stream);
    const char *pl = getenv("STRATA_PF_LIST");
    if (pl && *pl && atoi(pl) == 0)
        c->pf_list = c->pf_stream;
    else
        rc = rc ? rc : cuda_stream_create(&c->pf_list);
    rc = rc ? rc : cuda_event_create(&c->copy_mark);
    c->xfer = c->copy;
    rc = rc ? rc : cuda_event_create(&c->copy_done);
    rc = rc ? rc : ec_host_tier(c);
    rc = rc ? rc : ec_slots(c, cfg);
    if (rc)
        goto fail;
    struct slru_config sc = {.n_layer = c->n_layer, .n_expert = c->n_expert,
                             .n_slots = c->n_slots, .protected_pct = cfg->protected_pct};
    rc = slru_open(&sc, &c->slru);
    rc = rc ? rc : cuda_host_alloc((void **)&c->tab_host, nt * sizeof(void *), &c->tab_host_dev);
    rc = rc ? rc : cuda_malloc((void **)&c->tab_dev, nt * sizeof(void *));
    rc = rc ? rc
            : cuda_host_alloc((void **)&c->pred_host,
                              sizeof(int32_t) * EXPERT_CACHE_MAX_DEPTH * (size_t)c->max_pairs,
                              &c->pred_host_dev);
    rc = rc ? rc : cuda_event_create(&c->pf_last);
    rc = rc ? rc : cuda_host_alloc((void **)&c->ids_host,
                                   sizeof(int32_t) * (size_t)c->n_layer * (size_t)c->max_pairs,
                                   &c->ids_host_dev);
    c->zc_pairs = EXPERT_CACHE_ZC_TOK * (int)m->hp.n_expert_used;
    c->zc_pairs = c->zc_pairs < c->max_pairs ? c->zc_pairs : c->max_pairs;
    const size_t zn = sizeof(int32_t) * (size_t)c->n_layer * (size_t)c->zc_pairs;
    rc = rc ? rc : cuda_malloc((void **)&c->zc_ids_dev, zn);
    rc = rc ? rc : cuda_host_alloc((void **)&c->zc_ids_host, zn, &c->zc_ids_host_dev);
    c->zc_slice = calloc((size_t)c->n_layer, 1);
    c->zc_slice_rec = calloc((size_t)c->n_layer, 1);
    if (!rc && (!c->zc_slice || !c->zc_slice_rec))
        rc = -ENOMEM;
    if (rc) {
        rc = err_set(rc, "expert cache: cannot allocate its tables");
        goto fail;
    }
    for (int l = 0; l < c->n_layer; l++)
        for (int p = 0; p < P_N; p++)
            for (int e = 0; e < c->n_expert; e++)
                c->tab_host[((size_t)l * P_N + p) * c->n_expert + e] =
                    (void *)ec_host_addr(c, l, p, e);
    rc = cuda_h2d(c->tab_dev, c->tab_host, nt * sizeof(void *), c->compute);
    rc = rc ? rc : cuda_stream_sync(c->compute);
    if (rc) {
        rc = err_set(rc, "expert cache: uploading its tables failed");
        goto fail;
    }
    if (c->log)
        fprintf(c->log,
                "strata: expert cache: %d slots of %.2f MiB (%.2f GiB, %.1f per layer, %.1f%% of "
                "the %d experts)\n",
                c->n_slots, c->slot_bytes / 1048576.0,
                (double)c->n_slots * c->slot_bytes / 1073741824.0,
                (double)c->n_slots / c->n_layer,
                100.0 * c->n_slots / ((double)c->n_layer * c->n_expert), c->n_layer * c->n_expert);
    *out = c;
    return 0;
fail:
    expert_cache_close(c);
    return rc;
}

void expert_cache_close(struct expert_cache *c)
{
    if (!c)
        return;
    (void)ec_settle(c);
    free(c->defer);
    if (c->copy)
        cuda_stream_sync(c->copy);
    if (c->pf_stream)
        cuda_stream_sync(c->pf_stream);
    if (c->pf_list)
        cuda_stream_sync(c->pf_list);
    if (c->compute)
        cuda_stream_sync(c->compute);
    for (int i = 0; i < c->n_chunks; i++)
        cuda_free(c->chunks[i]);
    ec_host_tier_close(c);
    cuda_host_free(c->tab_host);
    cuda_host_free(c->ids_host);
    cuda_host_free(c->zc_ids_host);
    cuda_free(c->zc_ids_dev);
    free(c->zc_slice);
    free(c->zc_slice_rec);
    cuda_host_free(c->pred_host);
    cuda_free(c->zero_slot);
    free(c->cpu_ids);
    free(c->miss_ids);
    free(c->pair_count);
    free(c->miss_cpu);
    free(c->zeroed);
    free(c->n_zeroed);
    cuda_free(c->tab_dev);
    ec_dev_close(c);
    free(c->slru_off);
    cuda_event_destroy(c->copy_done);
    if (c->pf_last)
        cuda_event_destroy(c->pf_last);
    cuda_stream_destroy(c->copy);
    if (c->pf_stream)
        cuda_stream_destroy(c->pf_stream);
    if (c->pf_list && c->pf_list != c->pf_stream)
        cuda_stream_destroy(c->pf_list);
    if (c->copy_mark)
        cuda_event_destroy(c->copy_mark);
    free(c->slot_pf);
    for (int s = 0; c->slot_ev && s < c->slot_cap; s++)
        if (c->slot_ev[s])
            cuda_event_destroy(c->slot_ev[s]);
    free(c->slot_ev);
    free(c->slot_pf_seq);
    slru_close(c->slru);
    free(c->chunks);
    free(c->chunk_first);
    free(c->chunk_n);
    free(c->slot);
    free(c->slot_gen);
    free(c->lay);
    free(c->dirty);
    free(c->n_pending_ids);
    free(c->pend);
    free(c->next);
    free(c->seen);
    free(c->use_cnt);
    free(c->stats);
    free(c->prefetched);
    free(c);
}
