/* profile_fuzz: libFuzzer target for the residency profile parser (profiles/profile.c).
 *
 * Parses the input with profile_parse; an accepted profile must keep the promises profile.h
 * makes (counts, recency and the frozen mask sized by its geometry, n_frozen equal to the mask's
 * population and within the planned slots, probe lengths in range), and must survive being
 * planned again, listed and printed: every byte of its arrays is read, so the sanitizers see
 * a size that lies. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "profile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_require(int cond)
{
    if (!cond)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct profile p;

    if (profile_parse((const char *)data, size, "fuzz", &p))
        return 0;
    size_t n = (size_t)p.geo.n_layer * (size_t)p.geo.n_expert;
    fuzz_require(p.geo.n_layer >= 1 && p.geo.n_expert >= 1 && p.geo.n_expert_used >= 1 &&
                 p.geo.n_expert_used <= p.geo.n_expert);
    fuzz_require(p.n_probe_prompt >= 0 && p.n_probe_prompt <= PROFILE_PROBE_MAX &&
                 p.n_probe_out >= 0 && p.n_probe_out <= PROFILE_PROBE_MAX);
    int frozen = 0;
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        frozen += p.frozen[i] != 0;
        sum += p.count[i] + p.last[i];
    }
    fuzz_require(frozen == p.n_frozen && (!p.slots || p.n_frozen <= p.slots));
    int32_t *layer = malloc(sizeof(int32_t) * (size_t)(frozen ? frozen : 1));
    int32_t *expert = malloc(sizeof(int32_t) * (size_t)(frozen ? frozen : 1));
    fuzz_require(layer && expert);
    profile_frozen_list(&p, layer, expert);
    for (int i = 0; i < frozen; i++)
        fuzz_require(layer[i] >= 0 && layer[i] < p.geo.n_layer && expert[i] >= 0 &&
                     expert[i] < p.geo.n_expert);
    (void)profile_coverage(&p, -1);
    profile_plan(&p, p.slots / 2, p.dynamic_pct);
    fuzz_require(p.n_frozen <= p.slots);
    free(layer);
    free(expert);
    profile_free(&p);
    return (int)(sum & 0);
}
