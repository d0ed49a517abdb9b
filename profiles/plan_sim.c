/* plan_sim: the frozen share of a residency profile chosen by replaying its warmup (see
 * plan_sim.h). */
#include "plan_sim.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "profile.h"
#include "slru.h"

#define SIM_DECODE_MAX_TOK 16 /* calls of at most this many tokens count (the decode path) */

int profile_trace_add(struct profile_trace *tr, int text, int layer, const int32_t *ids,
                      int n_tok, int k)
{
    size_t n = (size_t)n_tok * (size_t)k;
    if (tr->n_ids + n > tr->cap_ids) {
        size_t cap = tr->cap_ids ? 2 * tr->cap_ids : 1 << 16;
        while (cap < tr->n_ids + n)
            cap *= 2;
        int32_t *p = realloc(tr->ids, sizeof(*p) * cap);
        if (!p)
            return -ENOMEM;
        tr->ids = p;
        tr->cap_ids = cap;
    }
    if (tr->n_calls == tr->cap_calls) {
        size_t cap = tr->cap_calls ? 2 * tr->cap_calls : 1 << 12;
        uint32_t *c = realloc(tr->call, sizeof(*c) * 4 * cap);
        if (!c)
            return -ENOMEM;
        tr->call = c;
        uint64_t *o = realloc(tr->offset, sizeof(*o) * cap);
        if (!o)
            return -ENOMEM;
        tr->offset = o;
        tr->cap_calls = cap;
    }
    memcpy(tr->ids + tr->n_ids, ids, sizeof(*ids) * n);
    uint32_t *c = tr->call + 4 * tr->n_calls;
    c[0] = (uint32_t)layer;
    c[1] = (uint32_t)n;
    c[2] = (uint32_t)text;
    c[3] = (uint32_t)n_tok;
    tr->offset[tr->n_calls++] = tr->n_ids;
    tr->n_ids += n;
    tr->k = k;
    return 0;
}

void profile_trace_free(struct profile_trace *tr)
{
    free(tr->ids);
    free(tr->call);
    free(tr->offset);
    memset(tr, 0, sizeof(*tr));
}

/* Replays the calls of texts with (text % 2 == parity) through a pool of `slots`, seeded with
 * the first n_seed experts of order (layer-major indices) of which the first n_pin are pinned.
 * Returns the decode-sized calls' hits / lookups (*lookups set), or -1 on failure. */
static double sim_replay(const struct profile *p, const struct profile_trace *tr, int parity,
                         int slots, const uint32_t *order, int n_seed, int n_pin,
                         uint64_t *lookups)
{
    const int ne = p->geo.n_expert;
    struct slru_config sc = {.n_layer = p->geo.n_layer, .n_expert = ne, .n_slots = slots};
    struct slru *s;
    uint32_t *seen = calloc((size_t)ne, sizeof(*seen)), stamp = 0;
    uint64_t hits = 0, n = 0;
    int el, ee;

    if (!seen || slru_open(&sc, &s)) {
        free(seen);
        return -1;
    }
    slru_step(s);
    for (int i = 0; i < n_seed; i++)
        slru_admit(s, (int)(order[i] / ne), (int)(order[i] % ne), -1, &el, &ee);
    for (int i = 0; i < n_pin; i++)
        slru_pin(s, (int)(order[i] / ne), (int)(order[i] % ne));
    for (size_t c = 0; c < tr->n_calls; c++) {
        const uint32_t *cl = tr->call + 4 * c;
        if ((int)(cl[2] % 2) != parity || (int)cl[0] >= p->geo.n_layer)
            continue;
        int layer = (int)cl[0];
        bool decode = cl[3] <= SIM_DECODE_MAX_TOK;
        const int32_t *ids = tr->ids + tr->offset[c];
        slru_step(s);
        stamp++;
        for (uint32_t j = 0; j < cl[1]; j++) {
            int e = ids[j];
            if (e < 0 || e >= ne || seen[e] == stamp)
                continue;
            seen[e] = stamp;
            bool hit = slru_lookup(s, layer, e) >= 0;
            if (decode) {
                hits += hit;
                n++;
            }
            if (!hit)
                slru_admit(s, layer, e, layer, &el, &ee);
        }
    }
    slru_close(s);
    free(seen);
    *lookups = n;
    return n ? (double)hits / (double)n : 0;
}

static const uint64_t *cmp_count, *cmp_last;

static int sim_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    if (cmp_count[x] != cmp_count[y])
        return cmp_count[x] > cmp_count[y] ? -1 : 1;
    if (cmp_last[x] != cmp_last[y])
        return cmp_last[x] > cmp_last[y] ? -1 : 1;
    return (x > y) - (x < y);
}

int profile_choose(struct profile *p, const struct profile_trace *tr, int slots,
                   struct profile_sim_report *r)
{
    static const int shares[PROFILE_SIM_SHARES] = {100, 75, 50, 25, 10};
    const size_t n = (size_t)p->geo.n_layer * p->geo.n_expert;
    int rc = 0;

    memset(r, 0, sizeof(*r));
    r->slots = slots;
    if (slots < 1 || !tr->n_calls || (tr->k && tr->k != p->geo.n_expert_used))
        return err_set(-EINVAL, "profile: nothing to choose the frozen share from");
    /* the ranking from the even texts (all of them when there is only one) */
    int parity = 1;
    bool odd = false;
    for (size_t c = 0; c < tr->n_calls && !odd; c++)
        odd = tr->call[4 * c + 2] % 2 == 1;
    uint64_t *count = calloc(n, sizeof(*count)), *last = calloc(n, sizeof(*last));
    uint32_t *order = malloc(sizeof(*order) * n);
    if (!count || !last || !order) {
        rc = err_set(-ENOMEM, "out of memory");
        goto out;
    }
    uint64_t step = 0;
    for (size_t c = 0; c < tr->n_calls; c++) {
        const uint32_t *cl = tr->call + 4 * c;
        if ((odd && cl[2] % 2 == 1) || (int)cl[0] >= p->geo.n_layer)
            continue;
        step += cl[0] == 0;
        for (uint32_t j = 0; j < cl[1]; j++) {
            int e = tr->ids[tr->offset[c] + j];
            if (e >= 0 && e < p->geo.n_expert) {
                count[(size_t)cl[0] * p->geo.n_expert + e]++;
                last[(size_t)cl[0] * p->geo.n_expert + e] = step;
            }
        }
    }
    if (!odd)
        parity = 0;
    size_t ranked = 0;
    for (size_t i = 0; i < n; i++)
        if (count[i])
            order[ranked++] = (uint32_t)i;
    cmp_count = count;
    cmp_last = last;
    qsort(order, ranked, sizeof(*order), sim_cmp);
    int n_seed = (size_t)slots < ranked ? slots : (int)ranked;
    r->cold = sim_replay(p, tr, parity, slots, order, 0, 0, &r->lookups);
    double best = -1;
    for (int i = 0; i < PROFILE_SIM_SHARES; i++) {
        long dyn = slots > 1 ? ((long)slots * shares[i] + 99) / 100 : 0;
        dyn = slots > 1 && dyn < 1 ? 1 : dyn;
        int n_pin = (int)(slots - dyn) < n_seed ? (int)(slots - dyn) : n_seed;
        uint64_t lk;
        r->share_pct[i] = shares[i];
        r->share_hit[i] = sim_replay(p, tr, parity, slots, order, n_seed, n_pin, &lk);
        if (r->share_hit[i] < 0) {
            rc = err_set(-ENOMEM, "out of memory");
            goto out;
        }
        if (r->share_hit[i] > best + 1e-9) { /* ties keep the larger dynamic share */
            best = r->share_hit[i];
            r->chosen_pct = shares[i];
        }
    }
    profile_plan(p, slots, r->chosen_pct);
out:
    free(count);
    free(last);
    free(order);
    return rc;
}
