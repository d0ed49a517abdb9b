#include "cachesim.h"

#include <errno.h>
#include <stdlib.h>

#include "slru.h"

#define CACHESIM_MAX 8

struct cachesim {
    int n_layer, n_expert, k, n;
    double frac[CACHESIM_MAX];
    int slots[CACHESIM_MAX];
    struct slru *pool[CACHESIM_MAX];
    uint64_t hits[CACHESIM_MAX], lookups;
    uint32_t *seen; /* (n_expert) stamp of the last layer call that looked the expert up */
    uint32_t stamp;
};

int cachesim_open(int n_layer, int n_expert, int k, const double *fractions, int n,
                  struct cachesim **out)
{
    if (n_layer < 1 || n_expert < 1 || k < 1 || k > n_expert || n < 1 || n > CACHESIM_MAX)
        return -EINVAL;
    struct cachesim *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    *s = (struct cachesim){.n_layer = n_layer, .n_expert = n_expert, .k = k, .n = n};
    s->seen = calloc((size_t)n_expert, sizeof(*s->seen));
    if (!s->seen) {
        free(s);
        return -ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        double keys = (double)n_layer * n_expert;
        int slots = (int)(fractions[i] * keys + 0.5);
        slots = slots < 1 ? 1 : slots > (int)keys ? (int)keys : slots;
        struct slru_config c = {.n_layer = n_layer, .n_expert = n_expert, .n_slots = slots};
        s->frac[i] = fractions[i];
        s->slots[i] = slots;
        int rc = slru_open(&c, &s->pool[i]);
        if (rc) {
            s->n = i;
            cachesim_close(s);
            return rc;
        }
    }
    *out = s;
    return 0;
}

void cachesim_close(struct cachesim *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n; i++)
        slru_close(s->pool[i]);
    free(s->seen);
    free(s);
}

void cachesim_step(struct cachesim *s, const int32_t *ids, int n_tok)
{
    size_t per_tok = (size_t)s->n_layer * s->k;
    for (int l = 0; l < s->n_layer; l++) {
        s->stamp++;
        for (int i = 0; i < s->n; i++)
            slru_step(s->pool[i]);
        for (int t = 0; t < n_tok; t++) {
            const int32_t *row = ids + (size_t)t * per_tok + (size_t)l * s->k;
            for (int j = 0; j < s->k; j++) {
                int e = row[j], el, ee;
                if (e < 0 || e >= s->n_expert || s->seen[e] == s->stamp)
                    continue;
                s->seen[e] = s->stamp;
                s->lookups++;
                for (int i = 0; i < s->n; i++) {
                    if (slru_lookup(s->pool[i], l, e) >= 0)
                        s->hits[i]++;
                    else /* -ENOSPC: served without caching */
                        slru_admit(s->pool[i], l, e, l, &el, &ee);
                }
            }
        }
    }
}

void cachesim_token(struct cachesim *s, const int32_t *ids)
{
    cachesim_step(s, ids, 1);
}

int cachesim_count(const struct cachesim *s)
{
    return s->n;
}

int cachesim_slots(const struct cachesim *s, int i)
{
    return s->slots[i];
}

double cachesim_fraction(const struct cachesim *s, int i)
{
    return s->frac[i];
}

double cachesim_hit_rate(const struct cachesim *s, int i)
{
    return s->lookups ? (double)s->hits[i] / (double)s->lookups : 0.0;
}

uint64_t cachesim_lookups(const struct cachesim *s)
{
    return s->lookups;
}

uint64_t cachesim_misses(const struct cachesim *s, int i)
{
    return s->lookups - s->hits[i];
}
