/* slot_pool: tier T0, fixed-size VRAM slots (one expert's gate + up + down each, allocated in
 * chunks of up to SLOTS_PER_ALLOC) under the SLRU policy of slru.h, and the per-layer device
 * pointer tables the expert kernels read: each entry points at the expert's slot when it is
 * resident, else at its bytes in mapped host memory (host_tier.c). The tables have a pinned
 * host mirror; a layer's device copy is refreshed on the compute stream when it changed.
 * Shrinking gives whole chunks back after syncing both streams. */
#include "cache_priv.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "slru.h"

int ec_slots(struct expert_cache *c, const struct expert_cache_config *cfg)
{
    uint64_t s[P_N] = {0};
    for (int l = 0; l < c->n_layer; l++)
        for (int p = 0; p < P_N; p++)
            s[p] = c->lay[l].stride[p] > s[p] ? c->lay[l].stride[p] : s[p];
    c->off[P_GATE] = 0;
    c->off[P_UP] = align_up(s[P_GATE], SLOT_ALIGN);
    c->off[P_DOWN] = c->off[P_UP] + align_up(s[P_UP], SLOT_ALIGN);
    c->slot_bytes = c->off[P_DOWN] + align_up(s[P_DOWN], SLOT_ALIGN);

    uint64_t want = cfg->n_slots > 0 ? (uint64_t)cfg->n_slots : cfg->pool_bytes / c->slot_bytes;
    uint64_t all = (uint64_t)c->n_layer * c->n_expert;
    if (want > all)
        want = all;
    if (want < 1)
        return err_set(-ENOSPC, "the budget leaves no room for a single expert slot (%.1f MiB)",
                       c->slot_bytes / 1048576.0);
    c->slot = calloc(want, sizeof(*c->slot));
    c->slot_gen = calloc(want, sizeof(*c->slot_gen));
    c->slot_pf = calloc(want, 1);
    c->slot_ev = calloc(want, sizeof(*c->slot_ev));
    c->slot_pf_seq = calloc(want, sizeof(*c->slot_pf_seq));
    c->slot_cap = (int)want;
    c->chunks = calloc(want, sizeof(*c->chunks));
    c->chunk_first = calloc(want, sizeof(*c->chunk_first));
    c->chunk_n = calloc(want, sizeof(*c->chunk_n));
    if (!c->slot || !c->chunks || !c->slot_gen || !c->slot_pf || !c->chunk_first || !c->chunk_n ||
        !c->slot_ev || !c->slot_pf_seq)
        return err_set(-ENOMEM, "out of memory");
    uint64_t got = 0;
    int per = SLOTS_PER_ALLOC;
    while (got < want) {
        int n = want - got < (uint64_t)per ? (int)(want - got) : per;
        void *p = NULL;
        if (cuda_malloc(&p, (size_t)n * c->slot_bytes)) {
            if (per > 1) {
                per /= 2;
                continue;
            }
            break;
        }
        c->chunk_first[c->n_chunks] = (int)got;
        c->chunk_n[c->n_chunks] = n;
        c->chunks[c->n_chunks++] = p;
        for (int i = 0; i < n; i++)
            c->slot[got + i] = (uint8_t *)p + (size_t)i * c->slot_bytes;
        got += n;
    }
    if (got == 0)
        return err_set(-ENOMEM, "no device memory for even one expert slot (%.1f MiB)",
                       c->slot_bytes / 1048576.0);
    if (got < want && c->log)
        fprintf(c->log,
                "strata: the device refused memory after %" PRIu64 " of %" PRIu64
                " expert slots: continuing with the smaller pool\n",
                got, want);
    c->n_slots = (int)got;
    return 0;
}

int expert_cache_slots(const struct expert_cache *c)
{
    return slru_live_slots(c->slru);
}

uint64_t expert_cache_slot_bytes(const struct expert_cache *c)
{
    return c->slot_bytes;
}

uint64_t expert_cache_vram_bytes(const struct expert_cache *c)
{
    return (uint64_t)slru_live_slots(c->slru) * c->slot_bytes +
           (uint64_t)c->n_layer * P_N * c->n_expert * sizeof(void *);
}

void **ec_entry(struct expert_cache *c, int l, int p, int e)
{
    return &c->tab_host[((size_t)l * P_N + p) * c->n_expert + e];
}

const uint8_t *ec_host_addr(const struct expert_cache *c, int l, int p, int e)
{
    if (!c->tier)
        return c->lay[l].mapped[p] + (uint64_t)e * c->lay[l].stride[p];
    const uint8_t *t = l == c->tier_layer ? c->tier_ptr[3 * (size_t)e + p] : NULL;
    return t ? t : c->tier_park;
}

void ec_point_host(struct expert_cache *c, int l, int e)
{
    for (int p = 0; p < P_N; p++)
        *ec_entry(c, l, p, e) = (void *)ec_host_addr(c, l, p, e);
    c->dirty[l] = 1;
}

void ec_point_slot(struct expert_cache *c, int l, int e, int s)
{
    for (int p = 0; p < P_N; p++)
        *ec_entry(c, l, p, e) = c->slot[s] + c->off[p];
    c->dirty[l] = 1;
}

bool ec_in_slot(struct expert_cache *c, int l, int e)
{
    const uint8_t *a = *ec_entry(c, l, P_GATE, e);
    if (c->tier) /* an entry not in a slot points into the registered tier memory */
        return !(a >= c->reg_lo && a < c->reg_lo + c->reg_bytes);
    return a != c->lay[l].mapped[P_GATE] + (uint64_t)e * c->lay[l].stride[P_GATE];
}

void ec_tables(struct expert_cache *c, int l, struct expert_tables *t)
{
    void **base = c->tab_dev + (size_t)l * P_N * c->n_expert;
    t->gate = (const void *const *)base;
    t->up = (const void *const *)(base + c->n_expert);
    t->down = (const void *const *)(base + 2 * (size_t)c->n_expert);
}

int ec_upload(struct expert_cache *c, int l)
{
    if (!c->dirty[l] && !c->recording)
        return 0;
    size_t off = (size_t)l * P_N * c->n_expert;
    int rc = cuda_h2d(c->tab_dev + off, c->tab_host + off, sizeof(void *) * P_N * c->n_expert,
                      c->compute);
    c->dirty[l] = 0;
    return rc ? err_set(rc, "expert cache: updating the slot table of layer %d failed", l) : 0;
}

int expert_cache_shrink(struct expert_cache *c, uint64_t bytes)
{
    int settled = ec_settle(c);
    if (settled)
        return settled;
    int freed = 0;
    uint64_t got = 0;
    if (c->dev)
        return err_set(-ENOTSUP, "expert cache: the GPU runs the cache: its slots cannot be "
                                 "given back");
    /* nothing may be copying into or reading from the memory about to go */
    int rc = ec_flush(c);
    rc = rc ? rc : cuda_stream_sync(c->compute);
    rc = rc ? rc : cuda_stream_sync(c->copy);
    rc = rc ? rc : cuda_stream_sync(c->pf_stream);
    if (rc)
        return err_set(rc, "expert cache: sync before shrinking failed");
    memset(c->slot_pf, 0, (size_t)c->n_slots);
    c->copies_pending = false;
    while (c->n_chunks > 0 && got < bytes) {
        int i = c->n_chunks - 1;
        for (int s = c->chunk_first[i]; s < c->chunk_first[i] + c->chunk_n[i]; s++) {
            int el, ee;
            if (slru_retire(c->slru, s, &el, &ee))
                continue;
            if (el >= 0) {
                ec_point_host(c, el, ee);
                c->prefetched[(size_t)el * c->n_expert + ee] = 0;
            }
            c->slot_gen[s]++; /* a pending switch to this slot must not happen */
            c->slot[s] = NULL;
        }
        cuda_free(c->chunks[i]);
        c->chunks[i] = NULL;
        c->n_chunks--;
        freed += c->chunk_n[i];
        got += (uint64_t)c->chunk_n[i] * c->slot_bytes;
    }
    return freed;
}
