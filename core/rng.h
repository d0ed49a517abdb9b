/* rng: small deterministic random numbers (xoshiro256**, seeded by splitmix64), header-only.
 * Used by the generator (byte-identical files for the same seed) and by every test that draws
 * fresh random inputs. Not for anything security-related.
 */
#ifndef STRATA_RNG_H
#define STRATA_RNG_H

#include <math.h>
#include <stdint.h>

struct rng {
    uint64_t s[4];
};

static inline uint64_t rng_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Seeds from one 64-bit value; different streams come from (seed, stream) pairs. */
static inline void rng_seed(struct rng *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed ^ (stream * 0xd1342543de82ef95ull);
    for (int i = 0; i < 4; i++)
        r->s[i] = rng_splitmix64(&x);
}

static inline uint64_t rng_u64(struct rng *r)
{
    uint64_t *s = r->s;
    uint64_t t = s[1] << 17;
    uint64_t res = s[1] * 5;
    res = ((res << 7) | (res >> 57)) * 9;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return res;
}

static inline uint32_t rng_u32(struct rng *r)
{
    return (uint32_t)(rng_u64(r) >> 32);
}

/* Uniform in [0, n) (n > 0), without modulo bias worth caring about for n < 2^32. */
static inline uint32_t rng_below(struct rng *r, uint32_t n)
{
    return (uint32_t)(((uint64_t)rng_u32(r) * n) >> 32);
}

/* Uniform float in [0, 1). */
static inline float rng_f32(struct rng *r)
{
    return (float)(rng_u64(r) >> 40) * (1.0f / 16777216.0f);
}

/* Uniform float in [lo, hi). */
static inline float rng_uniform(struct rng *r, float lo, float hi)
{
    return lo + (hi - lo) * rng_f32(r);
}

/* Standard normal (Box-Muller, one value per call). */
static inline float rng_normal(struct rng *r)
{
    float u1 = rng_f32(r), u2 = rng_f32(r);
    if (u1 < 1e-12f)
        u1 = 1e-12f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
}

#endif
