/* host_tier: tier T1, the stacked expert tensors in host memory the GPU can read. The model's
 * mapping (or its --no-mmap copy) is registered in place as pinned, device-mapped memory where
 * the driver allows it; otherwise every expert is copied into an anonymous mapping on the GPU's
 * NUMA node (huge pages where given) and that is registered, or, last, into cudaHostAlloc
 * memory. Either way c->lay[l] gives each stacked tensor's host address (for DMA copies and the
 * CPU lane) and mapped address (for zero-copy kernels). Runs once, at open, on the opening
 * thread; the copy uses an OpenMP team (a layer per thread). */
#include "cache_priv.h"

#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "clock.h"
#include "cuda_info.h"
#include "disk_tier.h"
#include "errors.h"
#include "topo.h"

/* Registers [lo, lo + bytes) in place, 1 GiB at a time (progress); every piece must map to
 * its own host address (UVA), so one expert may straddle two pieces. */
static int ec_register(struct expert_cache *c, uint8_t *lo, size_t bytes, bool read_only)
{
    size_t done = 0;
    int rc = 0;
    bool tty = c->log && isatty(fileno(c->log));

    while (done < bytes) {
        size_t n = bytes - done < c->reg_chunk ? bytes - done : c->reg_chunk;
        void *dev = NULL;
        rc = cuda_host_register(lo + done, n, read_only, &dev);
        if (!rc && dev != (void *)(lo + done)) {
            cuda_host_unregister(lo + done);
            rc = -ENOTSUP;
        }
        if (rc)
            break;
        done += n;
        if (tty)
            fprintf(c->log, "\rstrata: pinning host experts in place: %.1f / %.1f GiB", done / 1073741824.0,
                    bytes / 1073741824.0);
    }
    if (tty)
        fprintf(c->log, "\n");
    if (rc) {
        for (size_t off = 0; off < done; off += c->reg_chunk)
            cuda_host_unregister(lo + off);
        return rc;
    }
    c->reg_lo = lo;
    c->reg_bytes = bytes;
    return 0;
}

/* The NUMA node of CUDA device 0 (hwloc), or -1 when unknown. */
static int ec_gpu_node(void)
{
    struct cuda_device_info d;
    struct topo *t = NULL;
    const char *why = NULL;
    int node = -1;
    if (cuda_device_count(&why) > 0 && cuda_device_info_get(0, &d) == 0 && topo_open(&t) == 0) {
        node = topo_pci_numa_node(t, d.pci_bus_id);
        node = node < 0 ? -1 : node;
    }
    topo_close(t);
    return node;
}

/* An anonymous mapping of `bytes` whose pages come from NUMA node `node` (when >= 0), on huge
 * pages where the kernel gives them; NULL on failure. */
static void *ec_arena_map(size_t bytes, int node)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    madvise(p, bytes, MADV_HUGEPAGE);
    struct topo *t = NULL;
    if (node >= 0 && topo_open(&t) == 0)
        topo_membind_area(t, p, bytes, node); /* best effort: first touch places it anyway */
    topo_close(t);
    return p;
}

/* Copies every stacked expert tensor into pinned memory (when the model's own memory cannot
 * be pinned in place): an anonymous mapping on the GPU's NUMA node, registered; else
 * cudaHostAlloc memory. */
static int ec_copy_pinned(struct expert_cache *c, int *node_out)
{
    uint64_t total = 0, done = 0;
    void *dev = NULL;
    bool tty = c->log && isatty(fileno(c->log));
    int node = ec_gpu_node();

    for (int l = 0; l < c->n_layer; l++)
        for (int p = 0; p < P_N; p++)
            total += align_up(ec_weight(c->m, l, p)->bytes, 4096);
    *node_out = -1;
    c->arena = ec_arena_map(total, node);
    if (c->arena) {
        c->arena_bytes = total;
        *node_out = node;
    } else if (cuda_host_alloc(&c->pinned, total, &dev)) {
        return err_set(-ENOMEM, "cannot allocate %.2f GiB of pinned host memory for the experts",
                       total / 1073741824.0);
    }
    uint8_t *h = c->arena ? c->arena : c->pinned, *d = c->arena ? c->arena : dev;
    uint64_t off = 0;
    for (int l = 0; l < c->n_layer; l++) { /* the layout first: tensor after tensor */
        for (int p = 0; p < P_N; p++) {
            c->lay[l].host[p] = h + off;
            c->lay[l].mapped[p] = d + off;
            off += align_up(ec_weight(c->m, l, p)->bytes, 4096);
        }
    }
    /* then the copy, a layer per thread at a time (first touch places the pages too) */
#pragma omp parallel for schedule(dynamic, 1)
    for (int l = 0; l < c->n_layer; l++) {
        uint64_t bytes = 0;
        for (int p = 0; p < P_N; p++) {
            const struct weight *w = ec_weight(c->m, l, p);
            memcpy((void *)c->lay[l].host[p], w->data, w->bytes);
            bytes += align_up(w->bytes, 4096);
        }
        uint64_t so_far;
#pragma omp atomic capture
        so_far = done += bytes;
        if (tty && omp_get_thread_num() == 0)
            fprintf(c->log, "\rstrata: copying experts to pinned memory: %.1f / %.1f GiB",
                    so_far / 1073741824.0, total / 1073741824.0);
    }
    if (tty)
        fprintf(c->log, "\n");
    /* the arena is pinned after it is filled (registration needs the pages present) */
    if (c->arena && ec_register(c, c->arena, c->arena_bytes, false)) {
        err_clear();
        void *p = NULL;
        if (cuda_host_alloc(&p, total, &dev)) {
            return err_set(-ENOMEM, "cannot pin %.2f GiB of host memory for the experts",
                           total / 1073741824.0);
        }
        memcpy(p, c->arena, total);
        for (int l = 0; l < c->n_layer; l++) {
            for (int q = 0; q < P_N; q++) {
                size_t off = (size_t)(c->lay[l].host[q] - (const uint8_t *)c->arena);
                c->lay[l].host[q] = (uint8_t *)p + off;
                c->lay[l].mapped[q] = (uint8_t *)dev + off;
            }
        }
        munmap(c->arena, c->arena_bytes);
        c->arena = NULL;
        c->pinned = p;
        *node_out = -1;
    }
    return 0;
}

/* With a host tier: the strides, and the tier's slots registered (the file is not). */
static int ec_tier_register(struct expert_cache *c)
{
    uint8_t *pool;
    size_t bytes;
    double t0 = clock_now_s();
    for (int l = 0; l < c->n_layer; l++)
        for (int p = 0; p < P_N; p++)
            c->lay[l].stride[p] = ec_weight(c->m, l, p)->bytes / (uint64_t)c->n_expert;
    disk_tier_memory(c->tier, &pool, &bytes);
    size_t ne = (size_t)c->n_expert;
    c->tier_ptr = calloc(3 * ne, sizeof(*c->tier_ptr));
    c->tier_got = calloc(3 * ne, sizeof(*c->tier_got));
    c->tier_ids = malloc(sizeof(*c->tier_ids) * ne);
    if (!c->tier_ptr || !c->tier_got || !c->tier_ids)
        return err_set(-ENOMEM, "out of memory");
    int rc = ec_register(c, pool, bytes, false);
    if (rc)
        return err_set(rc, "expert cache: cannot pin the host tier's %.2f GiB",
                       bytes / 1073741824.0);
    c->tier_park = pool;
    if (c->log)
        fprintf(c->log,
                "strata: expert cache: misses read through the host tier (%.2f GiB "
                "pinned in %.2f s), not the file mapping\n",
                bytes / 1073741824.0, clock_now_s() - t0);
    return 0;
}

int ec_host_tier(struct expert_cache *c)
{
    const struct model *m = c->m;
    uintptr_t lo = UINTPTR_MAX, hi = 0, page = (uintptr_t)sysconf(_SC_PAGESIZE);
    double t0 = clock_now_s();
    uint64_t expert_bytes = 0;

    if (c->tier)
        return ec_tier_register(c);

    for (int l = 0; l < c->n_layer; l++) {
        for (int p = 0; p < P_N; p++) {
            const struct weight *w = ec_weight(m, l, p);
            uintptr_t a = (uintptr_t)w->data;
            lo = a < lo ? a : lo;
            hi = a + w->bytes > hi ? a + w->bytes : hi;
            c->lay[l].stride[p] = w->bytes / (uint64_t)c->n_expert;
            c->lay[l].host[p] = w->data;
            expert_bytes += w->bytes;
        }
    }
    lo &= ~(page - 1);
    hi = (hi + page - 1) & ~(page - 1);
    int rc = ec_register(c, (uint8_t *)lo, hi - lo, m->copy == NULL);
    if (!rc) {
        for (int l = 0; l < c->n_layer; l++)
            for (int p = 0; p < P_N; p++)
                c->lay[l].mapped[p] = (uint8_t *)c->lay[l].host[p];
        if (c->log)
            fprintf(c->log,
                    "strata: host experts (%.2f GiB): the %s registered in place as pinned, "
                    "mapped memory in %.2f s\n",
                    expert_bytes / 1073741824.0, m->copy ? "--no-mmap copy" : "file mapping",
                    clock_now_s() - t0);
        return 0;
    }
    err_clear();
    int node = -1;
    rc = ec_copy_pinned(c, &node);
    if (!rc && c->log) {
        char where[64] = "";
        if (node >= 0)
            snprintf(where, sizeof(where), " on NUMA node %d", node);
        fprintf(c->log,
                "strata: host experts (%.2f GiB): in-place pinning refused, copied into %s "
                "pinned memory%s in %.2f s\n",
                expert_bytes / 1073741824.0, c->arena ? "registered" : "allocated", where,
                clock_now_s() - t0);
    }
    return rc;
}

void ec_host_tier_close(struct expert_cache *c)
{
    if (c->reg_lo)
        for (size_t off = 0; off < c->reg_bytes; off += c->reg_chunk)
            cuda_host_unregister(c->reg_lo + off);
    cuda_host_free(c->pinned);
    if (c->arena)
        munmap(c->arena, c->arena_bytes);
    free(c->tier_ptr);
    free(c->tier_got);
    free(c->tier_ids);
}
