#include "budget.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "errors.h"
#include "model.h"

int budget_parse_size(const char *s, uint64_t *out)
{
    static const struct {
        const char *suffix;
        double mul;
    } units[] = {
        {"", 1},         {"b", 1},          {"k", 1024.0},     {"kib", 1024.0},
        {"kb", 1e3},     {"m", 1048576.0},  {"mib", 1048576.0}, {"mb", 1e6},
        {"g", 1073741824.0}, {"gib", 1073741824.0}, {"gb", 1e9},
        {"t", 1099511627776.0}, {"tib", 1099511627776.0}, {"tb", 1e12},
    };
    char *end;
    double v = strtod(s, &end);

    if (end == s || !(v >= 0) || !isfinite(v))
        return err_set(-EINVAL, "'%s' is not a size (examples: 8G, 7.5GiB, 8000MB)", s);
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (!strcasecmp(end, units[i].suffix)) {
            double b = v * units[i].mul;
            if (b >= 18446744073709551615.0)
                return err_set(-EINVAL, "size '%s' is too large", s);
            *out = (uint64_t)b;
            return 0;
        }
    }
    return err_set(-EINVAL, "'%s': unknown unit '%s' (use K, M, G, T, KiB.., or KB..)", s, end);
}

const char *budget_size(char buf[32], uint64_t n)
{
    if (n >= (1ull << 30))
        snprintf(buf, 32, "%.2f GiB", n / 1073741824.0);
    else
        snprintf(buf, 32, "%.1f MiB", n / 1048576.0);
    return buf;
}

int budget_plan_slots(uint64_t budget, uint64_t trunk, uint64_t kv, uint64_t scratch,
                      uint64_t slot_bytes, int n_layer, struct budget_plan *out)
{
    uint64_t fixed = trunk + kv + scratch;

    if (slot_bytes == 0 || n_layer <= 0)
        return err_set(-EINVAL, "budget: slot size %llu, %d layers",
                       (unsigned long long)slot_bytes, n_layer);
    if (fixed > budget) {
        char b0[32], b1[32], b2[32], b3[32], b4[32];
        return err_set(-ENOSPC,
                       "a VRAM budget of %s is %s short: the trunk takes %s, the KV cache %s and "
                       "scratch %s before any expert slot",
                       budget_size(b0, budget), budget_size(b1, fixed - budget),
                       budget_size(b2, trunk), budget_size(b3, kv), budget_size(b4, scratch));
    }
    out->budget = budget;
    out->fixed = fixed;
    out->slot_bytes = slot_bytes;
    out->n_slots = (budget - fixed) / slot_bytes;
    out->per_layer = (double)out->n_slots / n_layer;
    return 0;
}

struct budget_sum {
    const struct model *m;
    uint64_t trunk;
};

static void budget_add(struct weight *w, void *arg)
{
    struct budget_sum *b = arg;
    for (uint32_t l = 0; l < b->m->hp.n_layer; l++) {
        const struct layer_weights *lw = &b->m->layers[l];
        if (w == &lw->gate_exps || w == &lw->up_exps || w == &lw->down_exps)
            return;
    }
    b->trunk += w->bytes;
}

void budget_model_sizes(const struct model *m, uint64_t *trunk, uint64_t *slot_bytes)
{
    struct budget_sum b = {m, 0};
    uint64_t slot = 0;
    model_weights_each((struct model *)m, budget_add, &b);
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        uint64_t e = model_expert_bytes(m, l);
        slot = e > slot ? e : slot;
    }
    *trunk = b.trunk;
    *slot_bytes = slot;
}
