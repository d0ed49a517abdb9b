#include "expert_cache.h"

#include <errno.h>
#include <inttypes.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda_info.h"
#include "cuda_mem.h"
#include "errors.h"
#include "model.h"
#include "slru.h"
#include "topo.h"

/* Host registration granule (progress reports, and the UVA check), 1 GiB unless the config's
 * pin_chunk says otherwise (tests make experts straddle registrations with small pieces). */
#define REG_CHUNK_DEFAULT (1ull << 30)
#define SLOT_ALIGN 256
#define SLOTS_PER_ALLOC 32

enum { P_GATE = 0, P_UP, P_DOWN, P_N };

struct ec_layer {
    const uint8_t *host[P_N]; /* expert 0 of each stacked tensor in host memory */
    uint8_t *mapped[P_N];     /* the same bytes as kernels address them (zero-copy) */
    uint64_t stride[P_N];     /* bytes per expert */
};

struct ec_pending {
    int layer, expert, slot;
    uint32_t gen; /* the slot's admission count when this copy was enqueued */
};

struct expert_cache {
    const struct model *m;
    int n_layer, n_expert, n_slots, max_pairs;
    struct slru *slru;
    void *compute, *copy;
    void *copy_done; /* event */
    FILE *log;
    bool gather;
    struct cuda_gather batch; /* pieces not yet launched (gather mode) */

    /* host tier */
    uint8_t *reg_lo;  /* registered range (in place), or NULL */
    size_t reg_bytes;
    uint64_t reg_chunk; /* its pieces */
    void *pinned;     /* the copy in cudaHostAlloc memory (last resort), or NULL */
    void *arena;      /* the copy in an anonymous mapping on the GPU's node, registered */
    size_t arena_bytes;
    struct ec_layer *lay;

    /* slots */
    void **chunks;
    int *chunk_first, *chunk_n; /* the slots of each chunk */
    int n_chunks;
    uint8_t **slot;
    uint32_t *slot_gen; /* (n_slots) admissions into each slot so far */
    uint64_t slot_bytes, off[P_N];

    /* tables: [(layer * 3 + part) * n_expert + expert] */
    void **tab_host; /* pinned mirror */
    void *tab_host_dev;
    void **tab_dev;
    uint8_t *dirty; /* (n_layer) the device copy is stale */

    /* prefetch */
    const int32_t *pred_dev; /* set by expert_cache_predict_next for the next prepare_copy */
    int n_pred;
    int32_t *pred_host;      /* pinned (max_pairs) */
    void *pred_host_dev;
    bool copies_pending;     /* copies enqueued that no compute work has waited for yet */
    bool recording;          /* a graph is being recorded: upload every table */
    uint8_t *prefetched;     /* (n_layer * n_expert) admitted by prediction, not yet used */

    /* hybrid */
    bool hybrid;
    expert_cache_split_fn split; /* the caller's choice of lane for each miss */
    void *split_ctx;
    int max_cpu_tok;
    void *zero_slot;         /* slot_bytes of zeros: what a CPU-lane expert's entries point at */
    int32_t *cpu_ids;        /* (n_expert) the last call's CPU-lane experts */
    int n_cpu;
    int32_t *miss_ids;       /* (n_expert) scratch: this call's misses */
    int32_t *pair_count;     /* (n_expert) scratch: pairs routed to each expert this call */
    uint8_t *miss_cpu;       /* (n_expert) scratch: split's answer, 1 = the CPU lane */
    int32_t *zeroed;         /* (n_layer * n_expert) experts whose entries point at zero_slot,
                                per layer, reverted at that layer's next call */
    bool admit_idle;         /* admit a CPU-lane miss when PCIe got nothing */
    int32_t bg_id;           /* a CPU-lane expert to admit behind this call's copies, or -1 */
    int *n_zeroed;           /* (n_layer) */

    /* (b) */
    int32_t *ids_host; /* pinned (n_layer * max_pairs) */
    void *ids_host_dev;
    int *n_pending_ids; /* (n_layer), -1 = none */
    struct ec_pending *pend; /* admissions whose copies may still run */
    int n_pend, cap_pend;
    struct ec_pending *next; /* admissions of this step end */
    int n_next;

    uint32_t *seen; /* (n_expert) stamp of the last call that saw the expert */
    uint32_t stamp;
    struct expert_cache_layer_stats *stats;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

static const struct weight *ec_weight(const struct model *m, int l, int p)
{
    const struct layer_weights *lw = &m->layers[l];
    return p == P_GATE ? &lw->gate_exps : p == P_UP ? &lw->up_exps : &lw->down_exps;
}

static uint64_t ec_expert_bytes(const struct expert_cache *c, int l)
{
    return c->lay[l].stride[P_GATE] + c->lay[l].stride[P_UP] + c->lay[l].stride[P_DOWN];
}

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

static int ec_host_tier(struct expert_cache *c)
{
    const struct model *m = c->m;
    uintptr_t lo = UINTPTR_MAX, hi = 0, page = (uintptr_t)sysconf(_SC_PAGESIZE);
    double t0 = now_s();
    uint64_t expert_bytes = 0;

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
                    now_s() - t0);
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
                now_s() - t0);
    }
    return rc;
}

static int ec_slots(struct expert_cache *c, const struct expert_cache_config *cfg)
{
    uint64_t s[P_N] = {0};
    for (int l = 0; l < c->n_layer; l++)
        for (int p = 0; p < P_N; p++)
            s[p] = c->lay[l].stride[p] > s[p] ? c->lay[l].stride[p] : s[p];
    c->off[P_GATE] = 0;
    c->off[P_UP] = align_up(s[P_GATE], SLOT_ALIGN);
    c->off[P_DOWN] = c->off[P_UP] + align_up(s[P_UP], SLOT_ALIGN);
    c->slot_bytes = c->off[P_DOWN] + align_up(s[P_DOWN], SLOT_ALIGN);

    uint64_t want = cfg->n_slots > 0 ? (uint64_t)cfg->n_slots : cfg->pool_bytes / c->slot_bytes;
    uint64_t all = (uint64_t)c->n_layer * c->n_expert;
    if (want > all)
        want = all;
    if (want < 1)
        return err_set(-ENOSPC, "the budget leaves no room for a single expert slot (%.1f MiB)",
                       c->slot_bytes / 1048576.0);
    c->slot = calloc(want, sizeof(*c->slot));
    c->slot_gen = calloc(want, sizeof(*c->slot_gen));
    c->chunks = calloc(want, sizeof(*c->chunks));
    c->chunk_first = calloc(want, sizeof(*c->chunk_first));
    c->chunk_n = calloc(want, sizeof(*c->chunk_n));
    if (!c->slot || !c->chunks || !c->slot_gen || !c->chunk_first || !c->chunk_n)
        return err_set(-ENOMEM, "out of memory");
    uint64_t got = 0;
    int per = SLOTS_PER_ALLOC;
    while (got < want) {
        int n = want - got < (uint64_t)per ? (int)(want - got) : per;
        void *p = NULL;
        if (cuda_malloc(&p, (size_t)n * c->slot_bytes)) {
            if (per > 1) {
                per /= 2;
                continue;
            }
            break;
        }
        c->chunk_first[c->n_chunks] = (int)got;
        c->chunk_n[c->n_chunks] = n;
        c->chunks[c->n_chunks++] = p;
        for (int i = 0; i < n; i++)
            c->slot[got + i] = (uint8_t *)p + (size_t)i * c->slot_bytes;
        got += n;
    }
    if (got == 0)
        return err_set(-ENOMEM, "no device memory for even one expert slot (%.1f MiB)",
                       c->slot_bytes / 1048576.0);
    if (got < want && c->log)
        fprintf(c->log,
                "strata: the device refused memory after %" PRIu64 " of %" PRIu64
                " expert slots: continuing with the smaller pool\n",
                got, want);
    c->n_slots = (int)got;
    return 0;
}

int expert_cache_open(const struct model *m, const struct expert_cache_config *cfg, void *compute_stream,
                      struct expert_cache **out)
{
    struct expert_cache *c = calloc(1, sizeof(*c));
    int rc;

    if (!c)
        return err_set(-ENOMEM, "out of memory");
    c->m = m;
    c->n_layer = (int)m->hp.n_layer;
    c->n_expert = (int)m->hp.n_expert;
    c->max_pairs = cfg->max_pairs > 0 ? cfg->max_pairs : 1;
    c->compute = compute_stream;
    c->log = cfg->log;
    c->gather = cfg->gather;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    c->reg_chunk = cfg->pin_chunk / page * page;
    if (!c->reg_chunk)
        c->reg_chunk = REG_CHUNK_DEFAULT;
    size_t nt = (size_t)c->n_layer * P_N * (size_t)c->n_expert;
    c->lay = calloc((size_t)c->n_layer, sizeof(*c->lay));
    c->dirty = calloc((size_t)c->n_layer, 1);
    c->n_pending_ids = malloc(sizeof(int) * (size_t)c->n_layer);
    c->seen = calloc((size_t)c->n_expert, sizeof(*c->seen));
    c->stats = calloc((size_t)c->n_layer, sizeof(*c->stats));
    c->prefetched = calloc((size_t)c->n_layer * (size_t)c->n_expert, 1);
    if (!c->lay || !c->dirty || !c->n_pending_ids || !c->seen || !c->stats || !c->prefetched) {
        rc = err_set(-ENOMEM, "out of memory");
        goto fail;
    }
    for (int l = 0; l < c->n_layer; l++)
        c->n_pending_ids[l] = -1;
    rc = cuda_stream_create(&c->copy);
    rc = rc ? rc : cuda_event_create(&c->copy_done);
    rc = rc ? rc : ec_host_tier(c);
    rc = rc ? rc : ec_slots(c, cfg);
    if (rc)
        goto fail;
    struct slru_config sc = {.n_layer = c->n_layer, .n_expert = c->n_expert,
                             .n_slots = c->n_slots, .protected_pct = cfg->protected_pct};
    rc = slru_open(&sc, &c->slru);
    rc = rc ? rc : cuda_host_alloc((void **)&c->tab_host, nt * sizeof(void *), &c->tab_host_dev);
    rc = rc ? rc : cuda_malloc((void **)&c->tab_dev, nt * sizeof(void *));
    rc = rc ? rc : cuda_host_alloc((void **)&c->pred_host, sizeof(int32_t) * (size_t)c->max_pairs,
                                   &c->pred_host_dev);
    rc = rc ? rc : cuda_host_alloc((void **)&c->ids_host,
                                   sizeof(int32_t) * (size_t)c->n_layer * (size_t)c->max_pairs,
                                   &c->ids_host_dev);
    if (rc) {
        rc = err_set(rc, "expert cache: cannot allocate its tables");
        goto fail;
    }
    for (int l = 0; l < c->n_layer; l++)
        for (int p = 0; p < P_N; p++)
            for (int e = 0; e < c->n_expert; e++)
                c->tab_host[((size_t)l * P_N + p) * c->n_expert + e] =
                    c->lay[l].mapped[p] + (uint64_t)e * c->lay[l].stride[p];
    rc = cuda_h2d(c->tab_dev, c->tab_host, nt * sizeof(void *), c->compute);
    rc = rc ? rc : cuda_stream_sync(c->compute);
    if (rc) {
        rc = err_set(rc, "expert cache: uploading its tables failed");
        goto fail;
    }
    if (c->log)
        fprintf(c->log,
                "strata: expert cache: %d slots of %.2f MiB (%.2f GiB, %.1f per layer, %.1f%% of "
                "the %d experts)\n",
                c->n_slots, c->slot_bytes / 1048576.0,
                (double)c->n_slots * c->slot_bytes / 1073741824.0,
                (double)c->n_slots / c->n_layer,
                100.0 * c->n_slots / ((double)c->n_layer * c->n_expert), c->n_layer * c->n_expert);
    *out = c;
    return 0;
fail:
    expert_cache_close(c);
    return rc;
}

void expert_cache_close(struct expert_cache *c)
{
    if (!c)
        return;
    if (c->copy)
        cuda_stream_sync(c->copy);
    if (c->compute)
        cuda_stream_sync(c->compute);
    for (int i = 0; i < c->n_chunks; i++)
        cuda_free(c->chunks[i]);
    if (c->reg_lo)
        for (size_t off = 0; off < c->reg_bytes; off += c->reg_chunk)
            cuda_host_unregister(c->reg_lo + off);
    cuda_host_free(c->pinned);
    if (c->arena)
        munmap(c->arena, c->arena_bytes);
    cuda_host_free(c->tab_host);
    cuda_host_free(c->ids_host);
    cuda_host_free(c->pred_host);
    cuda_free(c->zero_slot);
    free(c->cpu_ids);
    free(c->miss_ids);
    free(c->pair_count);
    free(c->miss_cpu);
    free(c->zeroed);
    free(c->n_zeroed);
    cuda_free(c->tab_dev);
    cuda_event_destroy(c->copy_done);
    cuda_stream_destroy(c->copy);
    slru_close(c->slru);
    free(c->chunks);
    free(c->chunk_first);
    free(c->chunk_n);
    free(c->slot);
    free(c->slot_gen);
    free(c->lay);
    free(c->dirty);
    free(c->n_pending_ids);
    free(c->pend);
    free(c->next);
    free(c->seen);
    free(c->stats);
    free(c->prefetched);
    free(c);
}

int expert_cache_slots(const struct expert_cache *c)
{
    return slru_live_slots(c->slru);
}

uint64_t expert_cache_slot_bytes(const struct expert_cache *c)
{
    return c->slot_bytes;
}

uint64_t expert_cache_vram_bytes(const struct expert_cache *c)
{
    return (uint64_t)slru_live_slots(c->slru) * c->slot_bytes +
           (uint64_t)c->n_layer * P_N * c->n_expert * sizeof(void *);
}

static void **ec_entry(struct expert_cache *c, int l, int p, int e)
{
    return &c->tab_host[((size_t)l * P_N + p) * c->n_expert + e];
}

static void ec_point_host(struct expert_cache *c, int l, int e)
{
    for (int p = 0; p < P_N; p++)
        *ec_entry(c, l, p, e) = c->lay[l].mapped[p] + (uint64_t)e * c->lay[l].stride[p];
    c->dirty[l] = 1;
}

static void ec_point_slot(struct expert_cache *c, int l, int e, int s)
{
    for (int p = 0; p < P_N; p++)
        *ec_entry(c, l, p, e) = c->slot[s] + c->off[p];
    c->dirty[l] = 1;
}

static bool ec_in_slot(struct expert_cache *c, int l, int e)
{
    return *ec_entry(c, l, P_GATE, e) !=
           (void *)(c->lay[l].mapped[P_GATE] + (uint64_t)e * c->lay[l].stride[P_GATE]);
}

/* Enqueues a host-to-slot copy. DMA from registered memory must stay inside one registration,
 * so a source that straddles two of ec_register's pieces is copied in two parts. */
static int ec_h2d(struct expert_cache *c, uint8_t *dst, const uint8_t *src, uint64_t n)
{
    while (n) {
        uint64_t part = n;
        if (c->reg_lo) {
            uint64_t off = (uint64_t)(src - c->reg_lo), end = (off / c->reg_chunk + 1) * c->reg_chunk;
            part = end - off < n ? end - off : n;
        }
        int rc = cuda_h2d(dst, src, part, c->copy);
        if (rc)
            return rc;
        dst += part;
        src += part;
        n -= part;
    }
    return 0;
}

/* Gather mode: launches the pieces collected so far on the copy stream. */
static int ec_flush(struct expert_cache *c)
{
    int rc = c->batch.n ? cuda_gather_copy(&c->batch, c->copy) : 0;
    c->batch.n = 0;
    return rc;
}

/* One piece of an expert into its slot: a DMA copy, or (gather mode) an item of the next
 * gather launch, which reads the mapped host bytes itself. */
static int ec_copy_piece(struct expert_cache *c, uint8_t *dst, const uint8_t *host,
                         const uint8_t *mapped, uint64_t n)
{
    if (!c->gather)
        return ec_h2d(c, dst, host, n);
    if (c->batch.n == CUDA_GATHER_MAX) {
        int rc = ec_flush(c);
        if (rc)
            return rc;
    }
    c->batch.item[c->batch.n].src = mapped;
    c->batch.item[c->batch.n].dst = dst;
    c->batch.item[c->batch.n].bytes = n;
    c->batch.n++;
    return 0;
}

/* Admits (l, e) into a slot and enqueues its copy; the evicted expert goes back to host. The
 * slot, or -1 when every slot is guarded (the expert stays in host memory). */
static int ec_admit(struct expert_cache *c, int l, int e, int *rc)
{
    int el = -1, ee = -1;
    int s = slru_admit(c->slru, l, e, l, &el, &ee);
    if (s < 0) {
        if (s != -ENOSPC)
            *rc = err_set(s, "expert cache: admitting expert %d of layer %d failed", e, l);
        return -1;
    }
    if (el >= 0) {
        ec_point_host(c, el, ee);
        c->prefetched[(size_t)el * c->n_expert + ee] = 0;
    }
    c->slot_gen[s]++;
    for (int p = 0; p < P_N && !*rc; p++) {
        uint64_t at = (uint64_t)e * c->lay[l].stride[p];
        *rc = ec_copy_piece(c, c->slot[s] + c->off[p], c->lay[l].host[p] + at,
                            c->lay[l].mapped[p] + at, c->lay[l].stride[p]);
    }
    if (*rc)
        *rc = err_set(*rc, "expert cache: streaming expert %d of layer %d failed", e, l);
    c->stats[l].bytes_copied += ec_expert_bytes(c, l);
    return s;
}

static void ec_tables(struct expert_cache *c, int l, struct expert_tables *t)
{
    void **base = c->tab_dev + (size_t)l * P_N * c->n_expert;
    t->gate = (const void *const *)base;
    t->up = (const void *const *)(base + c->n_expert);
    t->down = (const void *const *)(base + 2 * (size_t)c->n_expert);
}

static int ec_upload(struct expert_cache *c, int l)
{
    if (!c->dirty[l] && !c->recording)
        return 0;
    size_t off = (size_t)l * P_N * c->n_expert;
    int rc = cuda_h2d(c->tab_dev + off, c->tab_host + off, sizeof(void *) * P_N * c->n_expert,
                      c->compute);
    c->dirty[l] = 0;
    return rc ? err_set(rc, "expert cache: updating the slot table of layer %d failed", l) : 0;
}

/* Hybrid: the misses of this call, each to PCIe (admitted and copied) or the CPU (entries on
 * the zero slot until the layer's next call). Returns whether anything was copied. */
static bool ec_assign_misses(struct expert_cache *c, int layer, const int32_t *ids, int n_pairs,
                             int n_miss, int *rc)
{
    bool copied = false;
    memset(c->pair_count, 0, sizeof(*c->pair_count) * (size_t)c->n_expert);
    for (int j = 0; j < n_pairs; j++)
        if (ids[j] >= 0 && ids[j] < c->n_expert)
            c->pair_count[ids[j]]++;
    c->split(c->split_ctx, layer, c->miss_ids, n_miss, c->pair_count,
             ec_expert_bytes(c, layer), c->miss_cpu);
    /* A CPU-lane expert is not cached, so with the PCIe lane idle this call the cache would
     * stop learning (bench/hybrid.md: at 12 GiB on the H200 hybrid without it held a 97.0% hit
     * rate where streaming alone reached 99.8%): with admit_idle the first CPU-lane miss is
     * also copied into a slot, behind the call's copies, for the layer's next call; this call
     * still computes it on the CPU. */
    c->bg_id = -1;
    int n_pcie = 0;
    for (int i = 0; i < n_miss; i++)
        n_pcie += !c->miss_cpu[i];
    for (int i = 0; i < n_miss && c->admit_idle && !n_pcie && c->bg_id < 0; i++)
        c->bg_id = c->miss_ids[i];
    for (int i = 0; i < n_miss && !*rc; i++) {
        int e = c->miss_ids[i];
        if (c->miss_cpu[i]) {
            for (int p = 0; p < P_N; p++)
                *ec_entry(c, layer, p, e) = (uint8_t *)c->zero_slot + c->off[p];
            c->dirty[layer] = 1;
            c->zeroed[(size_t)layer * c->n_expert + c->n_zeroed[layer]++] = e;
            c->cpu_ids[c->n_cpu++] = e;
            c->stats[layer].cpu_computed++;
            continue;
        }
        int s = ec_admit(c, layer, e, rc);
        if (s >= 0) {
            ec_point_slot(c, layer, e, s);
            copied = true;
        } else {
            c->stats[layer].bytes_zerocopy += ec_expert_bytes(c, layer);
        }
    }
    return copied;
}

static int ec_cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int expert_cache_prepare_copy(struct expert_cache *c, int layer, const int32_t *ids_dev,
                              int n_pairs, struct expert_tables *t)
{
    int32_t *ids = c->ids_host + (size_t)layer * c->max_pairs;
    bool copied = false;
    int rc = 0;

    if (n_pairs > c->max_pairs)
        return err_set(-EINVAL, "expert cache: %d pairs (at most %d)", n_pairs, c->max_pairs);
    if (c->n_pending_ids[layer] >= 0) { /* (b) ids of this layer not yet accounted */
        rc = cuda_stream_sync(c->compute); /* nothing may read a slot it re-assigns */
        rc = rc ? err_set(rc, "expert cache: sync failed") : expert_cache_step_end(c);
        if (rc)
            return rc;
    }
    int n_pred = layer + 1 < c->n_layer && c->pred_dev ? c->n_pred : 0;
    if (n_pred > c->max_pairs)
        n_pred = c->max_pairs;
    rc = cuda_d2h(ids, ids_dev, sizeof(int32_t) * (size_t)n_pairs, c->compute);
    if (!rc && n_pred)
        rc = cuda_d2h(c->pred_host, c->pred_dev, sizeof(int32_t) * (size_t)n_pred, c->compute);
    c->pred_dev = NULL;
    rc = rc ? rc : cuda_stream_sync(c->compute);
    if (rc)
        return err_set(rc, "expert cache: reading layer %d's routing back failed", layer);
    slru_step(c->slru);
    c->stamp++;
    /* the CPU lane's zero entries of this layer's previous call go back to host memory (that
     * call's kernel and table upload are done: the stream was synced above) */
    if (c->hybrid) {
        for (int i = 0; i < c->n_zeroed[layer]; i++) {
            int e = c->zeroed[(size_t)layer * c->n_expert + i];
            int s = slru_peek(c->slru, layer, e); /* admitted in the background since */
            if (s >= 0)
                ec_point_slot(c, layer, e, s);
            else
                ec_point_host(c, layer, e);
        }
        c->n_zeroed[layer] = 0;
        c->n_cpu = 0;
        c->bg_id = -1;
    }
    bool split = c->hybrid && n_pairs <= c->max_cpu_tok * (int)c->m->hp.n_expert_used;
    int n_miss = 0;
    for (int i = 0; i < n_pairs && !rc; i++) {
        int e = ids[i];
        if (e < 0 || e >= c->n_expert || c->seen[e] == c->stamp)
            continue; /* a bad id is the kernel's to report (NaN) */
        c->seen[e] = c->stamp;
        uint8_t *pf = &c->prefetched[(size_t)layer * c->n_expert + e];
        if (*pf && slru_peek(c->slru, layer, e) >= 0)
            c->stats[layer].prefetch_used++;
        *pf = 0;
        if (slru_lookup(c->slru, layer, e) >= 0) {
            if (!ec_in_slot(c, layer, e)) /* admitted by (b) and not yet switched */
                c->stats[layer].bytes_zerocopy += ec_expert_bytes(c, layer);
            continue;
        }
        if (split) { /* decided together below */
            c->miss_ids[n_miss++] = e;
            continue;
        }
        int s = ec_admit(c, layer, e, &rc);
        if (s >= 0) {
            ec_point_slot(c, layer, e, s);
            copied = true;
        } else {
            c->stats[layer].bytes_zerocopy += ec_expert_bytes(c, layer);
        }
    }
    if (split && n_miss && !rc) {
        qsort(c->miss_ids, (size_t)n_miss, sizeof(int32_t), ec_cmp_i32);
        copied |= ec_assign_misses(c, layer, ids, n_pairs, n_miss, &rc);
        qsort(c->cpu_ids, (size_t)c->n_cpu, sizeof(int32_t), ec_cmp_i32);
    }
    rc = rc ? rc : ec_upload(c, layer);
    /* this layer's experts wait for every copy enqueued so far: its misses, and experts a
     * prediction at the previous layer admitted, whose entries already point at their slots */
    rc = rc ? rc : ec_flush(c);
    if (!rc && (copied || c->copies_pending)) {
        rc = cuda_event_record(c->copy_done, c->copy);
        rc = rc ? rc : cuda_stream_wait(c->compute, c->copy_done);
        if (rc)
            rc = err_set(rc, "expert cache: ordering layer %d after its copies failed", layer);
        c->copies_pending = false;
    }
    /* then a CPU-lane expert of this call, for the layer's next call (its entries stay on the
     * zero slot until then; the next layer's call waits for the copy) */
    if (!rc && c->hybrid && c->bg_id >= 0 && slru_peek(c->slru, layer, c->bg_id) < 0 &&
        ec_admit(c, layer, c->bg_id, &rc) >= 0) {
        c->stats[layer].cpu_admitted++;
        c->copies_pending = true;
    }
    /* then the predicted experts of the next layer start copying behind them */
    for (int i = 0; i < n_pred && !rc; i++) {
        int e = c->pred_host[i], next = layer + 1;
        if (e < 0 || e >= c->n_expert || slru_peek(c->slru, next, e) >= 0)
            continue;
        int s = ec_admit(c, next, e, &rc);
        if (s < 0)
            continue;
        ec_point_slot(c, next, e, s);
        c->prefetched[(size_t)next * c->n_expert + e] = 1;
        c->stats[next].prefetched++;
        c->copies_pending = true;
    }
    rc = rc ? rc : ec_flush(c);
    ec_tables(c, layer, t);
    return rc;
}

void expert_cache_set_hybrid_admit(struct expert_cache *c, bool on)
{
    c->admit_idle = on;
}

int expert_cache_set_hybrid(struct expert_cache *c, expert_cache_split_fn split, void *ctx,
                            int max_cpu_tok)
{
    size_t ne = (size_t)c->n_expert;
    c->cpu_ids = malloc(sizeof(*c->cpu_ids) * ne);
    c->miss_ids = malloc(sizeof(*c->miss_ids) * ne);
    c->pair_count = malloc(sizeof(*c->pair_count) * ne);
    c->miss_cpu = malloc(ne);
    c->zeroed = malloc(sizeof(*c->zeroed) * ne * (size_t)c->n_layer);
    c->n_zeroed = calloc((size_t)c->n_layer, sizeof(*c->n_zeroed));
    if (!c->cpu_ids || !c->miss_ids || !c->pair_count || !c->miss_cpu ||
        !c->zeroed || !c->n_zeroed)
        return err_set(-ENOMEM, "out of memory");
    int rc = cuda_malloc(&c->zero_slot, c->slot_bytes);
    rc = rc ? rc : cuda_memset(c->zero_slot, 0, c->slot_bytes, c->compute);
    rc = rc ? rc : cuda_stream_sync(c->compute);
    if (rc)
        return err_set(rc, "expert cache: no device memory for the zero slot");
    c->split = split;
    c->split_ctx = ctx;
    c->max_cpu_tok = max_cpu_tok;
    c->bg_id = -1;
    c->hybrid = true;
    return 0;
}

int expert_cache_cpu_experts(const struct expert_cache *c, const int32_t **ids)
{
    *ids = c->cpu_ids;
    return c->n_cpu;
}

void expert_cache_predict_next(struct expert_cache *c, const int32_t *pred_dev, int n)
{
    c->pred_dev = pred_dev;
    c->n_pred = n;
}

int expert_cache_prepare_zerocopy(struct expert_cache *c, int layer, const int32_t *ids_dev,
                                  int n_pairs, struct expert_tables *t)
{
    int rc = 0;
    if (n_pairs > c->max_pairs)
        return err_set(-EINVAL, "expert cache: %d pairs (at most %d)", n_pairs, c->max_pairs);
    if (c->n_pending_ids[layer] >= 0) { /* the layer ran twice in one step: settle the first */
        rc = cuda_stream_sync(c->compute);
        rc = rc ? err_set(rc, "expert cache: sync failed") : expert_cache_step_end(c);
        if (rc)
            return rc;
    }
    rc = ec_upload(c, layer);
    if (!rc && c->copies_pending) { /* a prediction's copies (copy path) must land first */
        rc = ec_flush(c);
        rc = rc ? rc : cuda_event_record(c->copy_done, c->copy);
        rc = rc ? rc : cuda_stream_wait(c->compute, c->copy_done);
        c->copies_pending = false;
    }
    rc = rc ? rc
            : cuda_d2h(c->ids_host + (size_t)layer * c->max_pairs, ids_dev,
                       sizeof(int32_t) * (size_t)n_pairs, c->compute);
    if (rc)
        return err_set(rc, "expert cache: layer %d: enqueueing the routing read-back failed",
                       layer);
    c->n_pending_ids[layer] = n_pairs;
    ec_tables(c, layer, t);
    return 0;
}

static int ec_push_next(struct expert_cache *c, int l, int e, int s, uint32_t gen)
{
    if (c->n_next == c->cap_pend) {
        int cap = c->cap_pend ? 2 * c->cap_pend : 256;
        struct ec_pending *a = realloc(c->pend, sizeof(*a) * (size_t)cap);
        if (!a)
            return err_set(-ENOMEM, "out of memory");
        c->pend = a;
        struct ec_pending *b = realloc(c->next, sizeof(*b) * (size_t)cap);
        if (!b)
            return err_set(-ENOMEM, "out of memory");
        c->next = b;
        c->cap_pend = cap;
    }
    c->next[c->n_next++] = (struct ec_pending){l, e, s, gen};
    return 0;
}

void expert_cache_set_recording(struct expert_cache *c, bool recording)
{
    c->recording = recording;
}

void expert_cache_replayed(struct expert_cache *c, int n_pairs)
{
    for (int l = 0; l < c->n_layer; l++)
        c->n_pending_ids[l] = n_pairs;
}

int expert_cache_step_end(struct expert_cache *c)
{
    int rc = cuda_stream_sync(c->copy); /* the previous step end's admissions have landed */
    if (rc)
        return err_set(rc, "expert cache: waiting for the copy stream failed");
    c->n_next = 0;
    for (int l = 0; l < c->n_layer && !rc; l++) {
        int n = c->n_pending_ids[l];
        if (n < 0)
            continue;
        c->n_pending_ids[l] = -1;
        const int32_t *ids = c->ids_host + (size_t)l * c->max_pairs;
        slru_step(c->slru);
        c->stamp++;
        for (int i = 0; i < n && !rc; i++) {
            int e = ids[i];
            if (e < 0 || e >= c->n_expert || c->seen[e] == c->stamp)
                continue;
            c->seen[e] = c->stamp;
            if (!ec_in_slot(c, l, e))
                c->stats[l].bytes_zerocopy += ec_expert_bytes(c, l);
            if (slru_lookup(c->slru, l, e) >= 0)
                continue;
            int s = ec_admit(c, l, e, &rc);
            if (s >= 0 && !rc)
                rc = ec_push_next(c, l, e, s, c->slot_gen[s]);
        }
    }
    rc = rc ? rc : ec_flush(c);
    /* The previous step end's admissions are complete: switch those whose slot has seen no
     * admission since. Still holding the expert is not enough: evicted and admitted again into
     * the same slot above, its new copy is in flight behind another expert's bytes. */
    for (int i = 0; i < c->n_pend; i++) {
        struct ec_pending *p = &c->pend[i];
        if (c->slot_gen[p->slot] == p->gen &&
            slru_peek(c->slru, p->layer, p->expert) == p->slot)
            ec_point_slot(c, p->layer, p->expert, p->slot);
    }
    struct ec_pending *t = c->pend;
    c->pend = c->next;
    c->next = t;
    c->n_pend = c->n_next;
    c->n_next = 0;
    return rc;
}

const struct expert_cache_layer_stats *expert_cache_stats(const struct expert_cache *c, int layer)
{
    struct expert_cache_layer_stats *s = &c->stats[layer];
    const struct slru_layer_stats *q = slru_stats(c->slru, layer);
    s->hits = q->hits;
    s->misses = q->misses;
    s->promotions = q->promotions;
    s->evictions = q->evictions;
    s->admissions = q->admissions;
    return s;
}

void expert_cache_print_stats(const struct expert_cache *c, FILE *f)
{
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
    }
    uint64_t acc = tot.hits + tot.misses;
    fprintf(f, "%5s %6d %10" PRIu64 " %10" PRIu64 " %6.1f%% %10" PRIu64 " %10" PRIu64
               " %10" PRIu64 " %12.1f %12.1f %6" PRIu64 "/%-6" PRIu64 "\n",
            "all", expert_cache_slots(c), tot.hits, tot.misses, acc ? 100.0 * tot.hits / acc : 0.0,
            tot.promotions, tot.evictions, tot.admissions, tot.bytes_copied / 1e6,
            tot.bytes_zerocopy / 1e6, tot.prefetched, tot.prefetch_used);
    if (c->hybrid)
        fprintf(f,
                "CPU lane: %" PRIu64 " expert computations (misses not streamed), %" PRIu64
                " of those experts copied into a slot behind the call for the next one\n",
                tot.cpu_computed, tot.cpu_admitted);
}

int expert_cache_write_stats_json(const struct expert_cache *c, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return err_set(-errno, "%s: %s", path, strerror(errno));
    fprintf(f, "{\"slots\": %d, \"slot_bytes\": %" PRIu64 ", \"layers\": [",
            expert_cache_slots(c), c->slot_bytes);
    for (int l = 0; l < c->n_layer; l++) {
        const struct expert_cache_layer_stats *s = expert_cache_stats(c, l);
        fprintf(f,
                "%s\n  {\"layer\": %d, \"slots\": %d, \"hits\": %" PRIu64 ", \"misses\": %" PRIu64
                ", \"promotions\": %" PRIu64 ", \"evictions\": %" PRIu64
                ", \"admissions\": %" PRIu64 ", \"bytes_streamed\": %" PRIu64
                ", \"bytes_zero_copy\": %" PRIu64 ", \"prefetched\": %" PRIu64
                ", \"prefetch_used\": %" PRIu64 ", \"cpu_computed\": %" PRIu64
                ", \"cpu_admitted\": %" PRIu64 "}",
                l ? "," : "", l, slru_layer_held(c->slru, l), s->hits, s->misses, s->promotions,
                s->evictions, s->admissions, s->bytes_copied, s->bytes_zerocopy, s->prefetched,
                s->prefetch_used, s->cpu_computed, s->cpu_admitted);
    }
    fprintf(f, "\n]}\n");
    if (fclose(f))
        return err_set(-EIO, "%s: write failed", path);
    return 0;
}

int expert_cache_shrink(struct expert_cache *c, uint64_t bytes)
{
    int freed = 0;
    uint64_t got = 0;
    /* nothing may be copying into or reading from the memory about to go */
    int rc = ec_flush(c);
    rc = rc ? rc : cuda_stream_sync(c->compute);
    rc = rc ? rc : cuda_stream_sync(c->copy);
    if (rc)
        return err_set(rc, "expert cache: sync before shrinking failed");
    c->copies_pending = false;
    while (c->n_chunks > 0 && got < bytes) {
        int i = c->n_chunks - 1;
        for (int s = c->chunk_first[i]; s < c->chunk_first[i] + c->chunk_n[i]; s++) {
            int el, ee;
            if (slru_retire(c->slru, s, &el, &ee))
                continue;
            if (el >= 0) {
                ec_point_host(c, el, ee);
                c->prefetched[(size_t)el * c->n_expert + ee] = 0;
            }
            c->slot_gen[s]++; /* a pending switch to this slot must not happen */
            c->slot[s] = NULL;
        }
        cuda_free(c->chunks[i]);
        c->chunks[i] = NULL;
        c->n_chunks--;
        freed += c->chunk_n[i];
        got += (uint64_t)c->chunk_n[i] * c->slot_bytes;
    }
    return freed;
}
