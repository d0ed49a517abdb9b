#include "lane.h"

#include <math.h>
#include <stdlib.h>

#include "moe.h"

#define LANE_EXACT_MAX 8 /* up to this many items, every assignment is tried (2^8 sums) */

double lane_cost_pcie(const struct lane_model *m, const struct lane_item *it)
{
    return m->pcie_bps > 0 ? (double)it->bytes / m->pcie_bps : INFINITY;
}

double lane_cost_cpu(const struct lane_model *m, const struct lane_item *it)
{
    return m->cpu_bps > 0 ? (double)it->bytes / m->cpu_bps + it->n_tok * m->cpu_pair_s
                          : INFINITY;
}

/* Larger first; equal sizes keep their order (index tie-break), so the result is stable. */
struct lane_order {
    double key;
    int idx;
};

static int lane_order_cmp(const void *a, const void *b)
{
    const struct lane_order *x = a, *y = b;
    if (x->key != y->key)
        return x->key > y->key ? -1 : 1;
    return x->idx < y->idx ? -1 : 1;
}

/* Puts item i on the lane where it finishes first (ties: PCIe). */
static void lane_place(const struct lane_model *m, const struct lane_item *it, uint8_t *out,
                       double *pcie, double *cpu)
{
    double a = *pcie + lane_cost_pcie(m, it), b = *cpu + lane_cost_cpu(m, it);
    if (a <= b) {
        *out = MOE_LANE_PCIE;
        *pcie = a;
    } else {
        *out = MOE_LANE_CPU;
        *cpu = b;
    }
}

/* Finish times of both lanes for an assignment. */
static void lane_loads(const struct lane_model *m, const struct lane_item *it, int n,
                       const uint8_t *out, double *pcie, double *cpu)
{
    *pcie = m->pcie_busy_s > 0 ? m->pcie_busy_s : 0;
    *cpu = m->cpu_busy_s > 0 ? m->cpu_busy_s : 0;
    for (int i = 0; i < n; i++) {
        if (out[i] == MOE_LANE_CPU)
            *cpu += lane_cost_cpu(m, &it[i]);
        else
            *pcie += lane_cost_pcie(m, &it[i]);
    }
}

/* Few items (a decode step's misses): the best of every assignment, first found on ties. */
static double lane_exact(const struct lane_model *m, const struct lane_item *it, int n,
                         uint8_t *out)
{
    double best = INFINITY;
    uint32_t best_mask = 0;
    for (uint32_t mask = 0; mask < (1u << n); mask++) {
        double p = m->pcie_busy_s > 0 ? m->pcie_busy_s : 0;
        double c = m->cpu_busy_s > 0 ? m->cpu_busy_s : 0;
        for (int i = 0; i < n; i++) {
            if (mask >> i & 1)
                c += lane_cost_cpu(m, &it[i]);
            else
                p += lane_cost_pcie(m, &it[i]);
        }
        double mk = p > c ? p : c;
        if (mk < best) {
            best = mk;
            best_mask = mask;
        }
    }
    for (int i = 0; i < n; i++)
        out[i] = best_mask >> i & 1 ? MOE_LANE_CPU : MOE_LANE_PCIE;
    return best;
}

/* Improves an assignment by moving one item or swapping two across lanes while the makespan
 * drops (a few passes; each O(n^2)). */
static double lane_improve(const struct lane_model *m, const struct lane_item *it, int n,
                           uint8_t *out)
{
    double p, c;
    lane_loads(m, it, n, out, &p, &c);
    for (int pass = 0; pass < 8; pass++) {
        int better = 0;
        for (int i = 0; i < n; i++) {
            double ci = lane_cost_cpu(m, &it[i]), pi = lane_cost_pcie(m, &it[i]);
            double np = out[i] == MOE_LANE_CPU ? p + pi : p - pi;
            double nc = out[i] == MOE_LANE_CPU ? c - ci : c + ci;
            if ((np > nc ? np : nc) < (p > c ? p : c) - 1e-15) {
                out[i] = out[i] == MOE_LANE_CPU ? MOE_LANE_PCIE : MOE_LANE_CPU;
                p = np, c = nc, better = 1;
            }
        }
        for (int i = 0; i < n; i++) {
            if (out[i] != MOE_LANE_PCIE)
                continue;
            for (int j = 0; j < n; j++) {
                if (out[j] != MOE_LANE_CPU)
                    continue;
                double np = p - lane_cost_pcie(m, &it[i]) + lane_cost_pcie(m, &it[j]);
                double nc = c - lane_cost_cpu(m, &it[j]) + lane_cost_cpu(m, &it[i]);
                if ((np > nc ? np : nc) < (p > c ? p : c) - 1e-15) {
                    out[i] = MOE_LANE_CPU;
                    out[j] = MOE_LANE_PCIE;
                    p = np, c = nc, better = 1;
                    break;
                }
            }
        }
        if (!better)
            break;
    }
    return p > c ? p : c;
}

double lane_assign(const struct lane_model *m, const struct lane_item *items, int n,
                   uint8_t *out)
{
    double pcie = m->pcie_busy_s > 0 ? m->pcie_busy_s : 0;
    double cpu = m->cpu_busy_s > 0 ? m->cpu_busy_s : 0;
    struct lane_order *ord;

    if (m->pcie_bps <= 0 && m->cpu_bps <= 0)
        return INFINITY;
    if (n <= LANE_EXACT_MAX && m->pcie_bps > 0 && m->cpu_bps > 0)
        return lane_exact(m, items, n, out);
    ord = malloc(sizeof(*ord) * (size_t)(n > 0 ? n : 1));
    if (!ord) { /* no memory for the order: the same rule in the given order */
        for (int i = 0; i < n; i++)
            lane_place(m, &items[i], &out[i], &pcie, &cpu);
        return pcie > cpu ? pcie : cpu;
    }
    for (int i = 0; i < n; i++) {
        double a = lane_cost_pcie(m, &items[i]), b = lane_cost_cpu(m, &items[i]);
        ord[i] = (struct lane_order){a < b ? a : b, i};
    }
    qsort(ord, (size_t)n, sizeof(*ord), lane_order_cmp);
    for (int j = 0; j < n; j++)
        lane_place(m, &items[ord[j].idx], &out[ord[j].idx], &pcie, &cpu);
    free(ord);
    if (m->pcie_bps > 0 && m->cpu_bps > 0)
        return lane_improve(m, items, n, out);
    return pcie > cpu ? pcie : cpu;
}
