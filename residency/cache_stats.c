/* cache_stats: the expert cache's per-layer statistics (the SLRU's counters with the fill
 * paths' byte counts), printed as a table or written as JSON (docs/formats.md). */
#include "cache_priv.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "errors.h"
#include "outfile.h"
#include "slru.h"

const struct expert_cache_layer_stats *expert_cache_stats(const struct expert_cache *c, int layer)
{
    (void)ec_settle(c);
    struct expert_cache_layer_stats *s = &c->stats[layer];
    if (c->dev) {
        if (ec_dev_stats(c, layer, s))
            fprintf(stderr, "strata: reading the GPU cache's counters failed\n");
        return s;
    }
    const struct slru_layer_stats *q = slru_stats(c->slru, layer);
    const struct expert_cache_layer_stats *o = c->slru_off ? &c->slru_off[layer] : NULL;
    s->hits = q->hits + (o ? o->hits : 0);
    s->misses = q->misses + (o ? o->misses : 0);
    s->promotions = q->promotions + (o ? o->promotions : 0);
    s->evictions = q->evictions + (o ? o->evictions : 0);
    s->admissions = q->admissions + (o ? o->admissions : 0);
    return s;
}

void expert_cache_print_stats(const struct expert_cache *c, FILE *f)
{
    (void)ec_settle(c);
    struct expert_cache_layer_stats tot = {0};
    fprintf(f, "expert cache: %d slots of %.2f MiB\n", expert_cache_slots(c),
            c->slot_bytes / 1048576.0);
    fprintf(f, "%5s %6s %10s %10s %7s %10s %10s %10s %12s %12s %11s\n", "layer", "slots", "hits",
            "misses", "hit%", "promoted", "evicted", "admitted", "streamed MB", "zero-copy MB",
            "prefetch/used");
    for (int l = 0; l < c->n_layer; l++) {
        const struct expert_cache_layer_stats *s = expert_cache_stats(c, l);
        uint64_t acc = s->hits + s->misses;
        fprintf(f, "%5d %6d %10" PRIu64 " %10" PRIu64 " %6.1f%% %10" PRIu64 " %10" PRIu64
                   " %10" PRIu64 " %12.1f %12.1f %6" PRIu64 "/%-6" PRIu64 "\n",
                l, slru_layer_held(c->slru, l), s->hits, s->misses,
                acc ? 100.0 * s->hits / acc : 0.0, s->promotions, s->evictions, s->admissions,
                s->bytes_copied / 1e6, s->bytes_zerocopy / 1e6, s->prefetched, s->prefetch_used);
        tot.hits += s->hits;
        tot.misses += s->misses;
        tot.promotions += s->promotions;
        tot.evictions += s->evictions;
        tot.admissions += s->admissions;
        tot.bytes_copied += s->bytes_copied;
        tot.bytes_zerocopy += s->bytes_zerocopy;
        tot.prefetched += s->prefetched;
        tot.cpu_computed += s->cpu_computed;
        tot.cpu_admitted += s->cpu_admitted;
        tot.prefetch_used += s->prefetch_used;
        tot.prefetch_late += s->prefetch_late;
        tot.prefetch_wasted += s->prefetch_wasted;
        tot.prefetch_dropped += s->prefetch_dropped;
    }
    uint64_t acc = tot.hits + tot.misses;
    fprintf(f, "%5s %6d %10" PRIu64 " %10" PRIu64 " %6.1f%% %10" PRIu64 " %10" PRIu64
               " %10" PRIu64 " %12.1f %12.1f %6" PRIu64 "/%-6" PRIu64 "\n",
            "all", expert_cache_slots(c), tot.hits, tot.misses, acc ? 100.0 * tot.hits / acc : 0.0,
            tot.promotions, tot.evictions, tot.admissions, tot.bytes_copied / 1e6,
            tot.bytes_zerocopy / 1e6, tot.prefetched, tot.prefetch_used);
    if (tot.prefetched || tot.prefetch_dropped)
        fprintf(f,
                "prefetch: %" PRIu64 " experts copied ahead, %" PRIu64 " used (%" PRIu64
                " of them still copying when their layer ran), %.1f MB evicted unused; %" PRIu64
                " predictions dropped (the copy stream was behind)\n",
                tot.prefetched, tot.prefetch_used, tot.prefetch_late, tot.prefetch_wasted / 1e6,
                tot.prefetch_dropped);
    if (c->split)
        fprintf(f,
                "CPU lane: %" PRIu64 " expert computations (misses not streamed), %" PRIu64
                " of those experts copied into a slot behind the call for the next one\n",
                tot.cpu_computed, tot.cpu_admitted);
}

int expert_cache_write_stats_json(const struct expert_cache *c, const char *path)
{
    int settled = ec_settle(c);
    if (settled)
        return settled;
    struct outfile of;
    int rc = outfile_open(path, &of);
    FILE *f = of.f;

    if (rc)
        return rc;
    fprintf(f, "{\"slots\": %d, \"slot_bytes\": %" PRIu64 ", \"layers\": [",
            expert_cache_slots(c), c->slot_bytes);
    for (int l = 0; l < c->n_layer; l++) {
        const struct expert_cache_layer_stats *s = expert_cache_stats(c, l);
        fprintf(f,
                "%s\n  {\"layer\": %d, \"slots\": %d, \"hits\": %" PRIu64 ", \"misses\": %" PRIu64
                ", \"promotions\": %" PRIu64 ", \"evictions\": %" PRIu64
                ", \"admissions\": %" PRIu64 ", \"bytes_streamed\": %" PRIu64
                ", \"bytes_zero_copy\": %" PRIu64 ", \"prefetched\": %" PRIu64
                ", \"prefetch_used\": %" PRIu64 ", \"prefetch_late\": %" PRIu64
                ", \"prefetch_wasted_bytes\": %" PRIu64 ", \"prefetch_dropped\": %" PRIu64
                ", \"cpu_computed\": %" PRIu64 ", \"cpu_admitted\": %" PRIu64 "}",
                l ? "," : "", l, slru_layer_held(c->slru, l), s->hits, s->misses, s->promotions,
                s->evictions, s->admissions, s->bytes_copied, s->bytes_zerocopy, s->prefetched,
                s->prefetch_used, s->prefetch_late, s->prefetch_wasted, s->prefetch_dropped,
                s->cpu_computed, s->cpu_admitted);
    }
    fprintf(f, "\n]}\n");
    return outfile_commit(&of);
}
