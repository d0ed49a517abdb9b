/* cachesim: replays a routing trace through strata's SLRU (slru.h) at several pool sizes, in
 * decode order (step by step, layer by layer), the way the copy path of the expert cache sees
 * it without prefetching: per layer and step one slru_step, then each distinct expert the
 * step's tokens chose (in token order) looked up once, and a miss admitted (guarding the next
 * layer; a refused admission is served without caching). A step is one token of one stream, or
 * (cachesim_step) one token of each of n streams decoding in lockstep, whose layer call routes
 * all their rows at once. Hits and lookups count distinct (layer, expert) per step, as the
 * cache's statistics do. For `strata stats-routing` and tools/lockstep_sim, to put a model's
 * routing next to the hit rates the residency cache can reach. */
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
/* One lockstep step of n_tok tokens (n_tok >= 1): ids (n_tok, n_layer, k), token-major. Ids
 * outside [0, n_expert) are skipped. */
void cachesim_step(struct cachesim *s, const int32_t *ids, int n_tok);

int cachesim_count(const struct cachesim *s);
int cachesim_slots(const struct cachesim *s, int i);
double cachesim_fraction(const struct cachesim *s, int i);
/* Hits over lookups of pool i so far (0 before any lookup). */
double cachesim_hit_rate(const struct cachesim *s, int i);
/* Lookups so far (the same for every pool) and misses of pool i: what the cache copies. */
uint64_t cachesim_lookups(const struct cachesim *s);
uint64_t cachesim_misses(const struct cachesim *s, int i);

#endif
