/* cachesim: replays a routing trace through strata's SLRU (slru.h) at several pool sizes, in
 * decode order (token by token, layer by layer), the way the expert cache sees it without
 * prefetching: slru_step per layer, a lookup per chosen expert, an admission (guarding the next
 * layer) per miss. For `strata stats-routing`, to put a model's routing next to the hit rates
 * the residency cache can reach. */
#ifndef STRATA_CACHESIM_H
#define STRATA_CACHESIM_H

#include <stdint.h>

struct cachesim;

/* Pools of fractions[i] * n_layer * n_expert slots (at least 1), i < n (at most 8).
 * 0, -EINVAL, -ENOMEM. */
int cachesim_open(int n_layer, int n_expert, int k, const double *fractions, int n,
                  struct cachesim **out);
void cachesim_close(struct cachesim *s);

/* One token: ids (n_layer, k), the experts each layer chose. */
void cachesim_token(struct cachesim *s, const int32_t *ids);

int cachesim_count(const struct cachesim *s);
int cachesim_slots(const struct cachesim *s, int i);
double cachesim_fraction(const struct cachesim *s, int i);
/* Hits over lookups of pool i so far (0 before any lookup). */
double cachesim_hit_rate(const struct cachesim *s, int i);

#endif
