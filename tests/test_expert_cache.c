/* expert_cache bookkeeping without a GPU: this program supplies its own cuda_mem (host memory
 * as "device" memory, streams as queues of deferred operations), drives the cache the way the
 * CUDA backend does, layer by layer and step by step, and has a fake expert kernel, queued on
 * the compute stream like the real one, read every chosen expert through the device tables at
 * the moment it would run and compare the bytes with the model's. The copy stream's work runs
 * eagerly, lazily (only when waited for), or interleaved at random with the compute stream's,
 * so a table entry that points at a slot before its copy has landed, or a slot overwritten
 * while an entry still points at it, shows up as wrong bytes. Both ways of serving misses
 * (copy, zerocopy) and mixes of them (prefill-sized calls take the copy path), with and
 * without a (partly wrong) prediction of the next layer's experts prefetched, with the pool
 * shrinking half-way (an allocation elsewhere took its memory), with the experts pinned in
 * place or (when in-place pinning is refused) copied into a registered arena, hybrid (misses
 * split between the copy stream and the CPU lane, whose experts must read as zeros), with host
 * memory registered in pieces small enough that copies straddle them. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_devcache_ref.h"
#include "cuda_mem.h"
#include "errors.h"
#include "expert_cache.h"
#include "lane.h"
#include "mock_cuda_host.h"
#include "model.h"
#include "moe.h"
#include "testutil.h"

/* ---- a queued, host-memory cuda_mem --------------------------------------------------- */

enum op_kind { OP_COPY, OP_CHECK, OP_WAIT };

struct op {
    enum op_kind kind;
    void *dst;
    const void *src;
    size_t n;
    void (*check)(void *arg);
    void *arg;
    struct mstream *wait_on; /* OP_WAIT: flush that stream up to wait_upto */
    uint64_t wait_upto;
};

struct mstream {
    struct op *q;
    size_t n, cap, head; /* ops [head, n) pending */
    uint64_t done;       /* ops executed so far (absolute index) */
};

struct mevent {
    struct mstream *s;
    uint64_t upto; /* absolute op count at record time */
};

enum copy_mode { COPY_EAGER, COPY_LAZY, COPY_RANDOM };
static enum copy_mode g_mode;
/* the streams after the test's compute stream: the cache's copy and prefetch streams */
#define MAX_BG 4
static struct mstream *g_bg[MAX_BG];
static struct rng g_rng;
static int g_streams;

static void run_one(struct mstream *s);

static void flush_to(struct mstream *s, uint64_t upto)
{
    while (s->done < upto && s->head < s->n)
        run_one(s);
}

static void run_one(struct mstream *s)
{
    struct op o = s->q[s->head++];
    s->done++;
    if (o.kind == OP_COPY)
        memcpy(o.dst, o.src, o.n);
    else if (o.kind == OP_CHECK)
        o.check(o.arg);
    else
        flush_to(o.wait_on, o.wait_upto);
}

static bool is_bg(const struct mstream *s)
{
    for (int i = 0; i < MAX_BG; i++)
        if (g_bg[i] == s)
            return true;
    return false;
}

/* The background streams advance at random while the compute stream works. */
static void maybe_progress_copies(void)
{
    if (g_mode != COPY_RANDOM)
        return;
    for (int i = 0; i < MAX_BG; i++)
        while (g_bg[i] && g_bg[i]->head < g_bg[i]->n && rng_below(&g_rng, 2))
            run_one(g_bg[i]);
}

static void push(struct mstream *s, struct op o)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->q = realloc(s->q, sizeof(*s->q) * s->cap);
        if (!s->q)
            abort();
    }
    s->q[s->n++] = o;
    bool bg = is_bg(s);
    if (bg && g_mode == COPY_EAGER)
        flush_to(s, s->done + (s->n - s->head));
    if (!bg)
        maybe_progress_copies();
}

int cuda_h2d(void *dst, const void *src, size_t bytes, void *stream)
{
    push(stream, (struct op){.kind = OP_COPY, .dst = dst, .src = src, .n = bytes});
    return 0;
}

int cuda_d2h(void *dst, const void *src, size_t bytes, void *stream)
{
    return cuda_h2d(dst, src, bytes, stream);
}

int cuda_d2d(void *dst, const void *src, size_t bytes, void *stream)
{
    return cuda_h2d(dst, src, bytes, stream);
}

/* The gather kernel's pieces are copies on its stream, in order. */
int cuda_gather_copy(const struct cuda_gather *g, void *stream)
{
    for (int i = 0; i < g->n; i++)
        push(stream, (struct op){.kind = OP_COPY, .dst = g->item[i].dst, .src = g->item[i].src,
                                 .n = g->item[i].bytes});
    return 0;
}

int cuda_stream_create(void **stream)
{
    struct mstream *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    if (++g_streams >= 2) /* the test's compute stream is first, the cache's streams next */
        for (int i = 0; i < MAX_BG; i++)
            if (!g_bg[i]) {
                g_bg[i] = s;
                break;
            }
    *stream = s;
    return 0;
}

void cuda_stream_destroy(void *stream)
{
    struct mstream *s = stream;
    if (!s)
        return;
    for (int i = 0; i < MAX_BG; i++)
        if (g_bg[i] == s)
            g_bg[i] = NULL;
    g_streams--;
    free(s->q);
    free(s);
}

int cuda_stream_sync(void *stream)
{
    struct mstream *s = stream;
    flush_to(s, s->done + (s->n - s->head));
    return 0;
}

double cuda_h2d_bandwidth(const void *src, size_t bytes, int reps)
{
    (void)src, (void)bytes, (void)reps;
    return 0;
}

static bool g_refuse_read_only; /* as a driver without read-only registration would */

int cuda_host_register(void *p, size_t bytes, int read_only, void **dev_ptr)
{
    (void)bytes;
    *dev_ptr = p;
    return read_only && g_refuse_read_only ? -ENOTSUP : 0;
}

int cuda_event_create(void **ev)
{
    *ev = calloc(1, sizeof(struct mevent));
    return *ev ? 0 : -ENOMEM;
}

int cuda_event_record(void *ev, void *stream)
{
    struct mevent *e = ev;
    struct mstream *s = stream;
    e->s = s;
    e->upto = s->done + (s->n - s->head);
    return 0;
}

int cuda_event_done(void *ev)
{
    const struct mevent *e = ev;
    return !e->s || e->s->done >= e->upto;
}

int cuda_stream_wait(void *stream, void *ev)
{
    struct mevent *e = ev;
    push(stream, (struct op){.kind = OP_WAIT, .wait_on = e->s, .wait_upto = e->upto});
    return 0;
}

/* ---- the model and the fake kernel ------------------------------------------------------- */

#define N_LAYER 4
#define N_EXPERT 16
#define K 4
#define MAX_TOK 24

/* The GPU's own expert cache: its scalar reference, queued on the stream like its kernel (it
 * reads and writes "device" state when it runs, not when it is enqueued) */
static uint64_t g_helped; /* prefetched parts a lookup copied itself: its batch still pending */

static void devcache_run_op(void *arg)
{
    const struct cuda_devcache_call *a = arg;
    for (int i = 0; a->pend && !a->prefetch && i < a->n_pairs; i++) {
        int e = a->ids[i], s = e >= 0 && e < a->n_expert ? a->slot_of[e] : -1;
        bool first = true; /* each expert once */
        for (int j = 0; j < i; j++)
            first &= a->ids[j] != e;
        for (int p = 0; first && s >= 0 && a->pend[s] && p < 3; p++) {
            uint32_t j = (uint32_t)(a->pend[s] - 1 + p);
            g_helped += a->pf_done[j] < devcache_ref_chunks(a->pf_jobs[j].bytes);
        }
    }
    devcache_ref_run(arg);
    free(arg);
}

int cuda_devcache_run(const struct cuda_devcache_call *a, int blocks, void *stream)
{
    if (a->logits) /* the expert cache's own tests pass ids */
        return -ENOTSUP;
    struct cuda_devcache_call *k = test_xmalloc(sizeof(*k));
    (void)blocks;
    *k = *a;
    push(stream, (struct op){.kind = OP_CHECK, .check = devcache_run_op, .arg = k});
    return 0;
}

/* cuda_devcache_copy: the batch's remaining copies, when the stream gets to them */
struct devcache_copy_op {
    const struct cuda_devcache_job *jobs;
    const uint32_t *n_jobs;
    uint32_t *claim, *done;
};

static void devcache_copy_op(void *arg)
{
    struct devcache_copy_op *k = arg;
    devcache_ref_copy_batch(k->jobs, k->n_jobs, k->claim, k->done);
    free(k);
}

int cuda_devcache_copy(const struct cuda_devcache_job *jobs, const uint32_t *n_jobs,
                       uint32_t *claim, uint32_t *done, int blocks, void *stream)
{
    struct devcache_copy_op *k = test_xmalloc(sizeof(*k));
    (void)blocks;
    *k = (struct devcache_copy_op){jobs, n_jobs, claim, done};
    push(stream, (struct op){.kind = OP_CHECK, .check = devcache_copy_op, .arg = k});
    return 0;
}

static const uint64_t strides[3] = {4096 + 96, 4096 + 96, 6144 + 32}; /* not page multiples */

struct kernel_check {
    const struct model *m;
    int layer, n_pairs;
    int32_t ids[MAX_TOK * K];
    int n_cpu;                /* hybrid: experts the CPU computes, whose entries read zeros */
    int32_t cpu[N_EXPERT];
    struct expert_tables t;
    int *bad;
};

static void kernel_read(void *arg)
{
    struct kernel_check *k = arg;
    const struct layer_weights *lw = &k->m->layers[k->layer];
    const struct weight *w[3] = {&lw->gate_exps, &lw->up_exps, &lw->down_exps};
    const void *const *tab[3] = {k->t.gate, k->t.up, k->t.down};
    static const uint8_t zeros[8192];
    for (int i = 0; i < k->n_pairs; i++) {
        int e = k->ids[i];
        bool on_cpu = false;
        for (int j = 0; j < k->n_cpu; j++)
            on_cpu |= k->cpu[j] == e;
        for (int p = 0; p < 3; p++) {
            const uint8_t *want = on_cpu ? zeros
                                         : (const uint8_t *)w[p]->data + (uint64_t)e * strides[p];
            if (memcmp(tab[p][e], want, strides[p])) {
                if (getenv("STRATA_TEST_VERBOSE"))
                    fprintf(stderr, "layer %d expert %d part %d: entry %p, host %p\n", k->layer, e, p,
                            tab[p][e], (const void *)want);
                (*k->bad)++;
            }
        }
    }
    free(k);
}

static void make_model(struct model *m, struct layer_weights *layers, struct rng *r)
{
    memset(m, 0, sizeof(*m));
    m->hp.n_layer = N_LAYER;
    m->hp.n_expert = N_EXPERT;
    m->hp.n_expert_used = K;
    m->layers = layers;
    for (int l = 0; l < N_LAYER; l++) {
        struct weight *w[3] = {&layers[l].gate_exps, &layers[l].up_exps, &layers[l].down_exps};
        for (int p = 0; p < 3; p++) {
            uint8_t *d = test_xmalloc(strides[p] * N_EXPERT);
            for (uint64_t i = 0; i < strides[p] * N_EXPERT; i++)
                d[i] = (uint8_t)rng_below(r, 256);
            w[p]->data = d;
            w[p]->bytes = strides[p] * N_EXPERT;
        }
    }
}

/* Skewed routing: a few experts per layer are popular, so the cache both hits and evicts. */
static int32_t pick_expert(struct rng *r)
{
    return rng_below(r, 3) ? (int32_t)rng_below(r, 5) : (int32_t)rng_below(r, N_EXPERT);
}

static void route(struct rng *r, int n_tok, int32_t *ids)
{
    for (int t = 0; t < n_tok; t++) {
        for (int j = 0; j < K; j++) {
            int32_t e;
            bool dup;
            do {
                e = pick_expert(r);
                dup = false;
                for (int i = 0; i < j; i++)
                    dup |= ids[t * K + i] == e;
            } while (dup);
            ids[t * K + j] = e;
        }
    }
}

/* One scenario: steps of a prompt (n_prompt tokens) then decode, served as the backend would. */
/* One run of the cache as the backend drives it. */
struct scenario_cfg {
    enum copy_mode mode; /* how the mock copy stream progresses */
    bool zerocopy;       /* decode-sized calls take (b) */
    bool gpu;            /* every call takes (c), the GPU's own cache (its scalar reference) */
    bool prefetch;       /* a partly wrong prediction of the next layer */
    int depth;           /* with prefetch: of the next depth layers (0 = 1) */
    int n_frozen;        /* experts restored and pinned before the first step (a profile) */
    bool shrink;         /* the pool gives up slots half-way */
    bool hybrid;         /* misses split with the CPU lane */
    bool cpu_fast;       /* hybrid with a CPU lane 4x PCIe: lone misses go to the CPU and are
                          * also admitted behind the call */
    bool gather;         /* copies through cuda_gather_copy */
    int switch_every;    /* with gpu: every this many steps the device gives the slots back and
                          * the host path (copy, or zero-copy with zerocopy) serves as many,
                          * then the device takes them again (the automatic placement's trials) */
    int n_slots, n_steps;
    uint64_t seed;
};

/* The hybrid split as the MoE layer makes it: lane_assign over a lane model (ctx). */
static void lane_split(void *ctx, int layer, const int32_t *miss_ids, int n_miss,
                       const int32_t *pair_count, uint64_t expert_bytes, uint8_t *to_cpu)
{
    struct lane_item items[N_EXPERT] = {{0}};
    uint8_t lane[N_EXPERT] = {0};
    (void)layer;
    for (int i = 0; i < n_miss; i++)
        items[i] = (struct lane_item){expert_bytes, pair_count[miss_ids[i]]};
    lane_assign(ctx, items, n_miss, lane);
    for (int i = 0; i < n_miss; i++)
        to_cpu[i] = lane[i] == MOE_LANE_CPU;
}

/* (c)'s policy on a fixed sequence: 8 slots over 4 layers, one expert of layer 0 restored
 * and pinned first, so layer 0's list is that slot and 2 more (7 left: 2, 2, 2, 1). Layer 0
 * then routes {1}, {2}, {1}, {3}: 1 and 2 take the free slots, 1 hits, 3 evicts 2 (the least
 * recently used), and the pinned expert stays. */
static void gpu_policy(const struct model *m, uint64_t seed)
{
    void *compute = NULL;
    struct expert_cache *c = NULL;
    int32_t *ids_dev = NULL;
    int bad = 0;
    g_mode = COPY_RANDOM;
    rng_seed(&g_rng, seed, 1);
    CHECK(cuda_stream_create(&compute) == 0, "stream");
    struct expert_cache_config cfg = {.n_slots = 8, .max_pairs = MAX_TOK * K, .pin_chunk = 4096};
    if (expert_cache_open((struct model *)m, &cfg, compute, &c)) {
        CHECK(0, "open: %s", err_msg());
        return;
    }
    CHECK(cuda_malloc((void **)&ids_dev, sizeof(int32_t)) == 0, "ids");
    int32_t pl = 0, pe = 5;
    CHECK(expert_cache_preload(c, &pl, &pe, 1, true, NULL, NULL) == 1, "preload: %s", err_msg());
    static const int32_t seq[] = {1, 2, 1, 3};
    for (int i = 0; i < 4; i++) {
        struct kernel_check *k = test_xmalloc(sizeof(*k));
        *k = (struct kernel_check){.m = m, .layer = 0, .n_pairs = 1, .bad = &bad};
        k->ids[0] = seq[i];
        cuda_h2d(ids_dev, &seq[i], sizeof(int32_t), compute);
        CHECK(expert_cache_prepare_device(c, 0, ids_dev, 1, &k->t) == 0, "prepare: %s", err_msg());
        push(compute, (struct op){.kind = OP_CHECK, .check = kernel_read, .arg = k});
    }
    cuda_stream_sync(compute);
    CHECK(expert_cache_on_device(c), "the GPU did not take the cache over");
    CHECK(expert_cache_check(c) == 0, "the device state is inconsistent");
    CHECK(bad == 0, "%d expert reads saw wrong bytes", bad);
    CHECK(expert_cache_slot_of(c, 0, 5) >= 0, "the pinned expert was evicted");
    CHECK(expert_cache_slot_of(c, 0, 1) >= 0 && expert_cache_slot_of(c, 0, 3) >= 0,
          "experts 1 and 3 are not resident");
    CHECK(expert_cache_slot_of(c, 0, 2) < 0, "expert 2 (least recently used) was not evicted");
    const struct expert_cache_layer_stats *s = expert_cache_stats(c, 0);
    /* admissions and bytes copied: the restore's one (the SLRU's count, carried over) and
     * the three misses' */
    CHECK(s->hits == 1 && s->misses == 3 && s->evictions == 1 && s->admissions == 4 &&
              s->bytes_copied == 4 * (strides[0] + strides[1] + strides[2]),
          "layer 0: %llu hits, %llu misses, %llu evictions, %llu admissions (want 1, 3, 1, 4)",
          (unsigned long long)s->hits, (unsigned long long)s->misses,
          (unsigned long long)s->evictions, (unsigned long long)s->admissions);
    CHECK(expert_cache_preload(c, &pl, &pe, 1, true, NULL, NULL) < 0,
          "a preload after the GPU took over was accepted");
    CHECK(expert_cache_shrink(c, 1) < 0, "a shrink after the GPU took over was accepted");
    expert_cache_close(c);
    cuda_free(ids_dev);
    cuda_stream_destroy(compute);
}

/* The layers' shares when the GPU takes the slots over: by the copy path's counts of each
 * layer's choices (layer 0 chose all 16 experts, the others 4): 40 slots go as 16 (all of
 * layer 0's experts), then, the counts tied at 0, 12, 6, 6 (each layer at least k + k/2 = 6);
 * with STRATA_DEVCACHE_EVEN=1, 10 each; without counts (no copy-path call), 10 each. */
static void gpu_shares(const struct model *m, uint64_t seed)
{
    static const int want[3][N_LAYER] = {{16, 12, 6, 6}, {10, 10, 10, 10}, {10, 10, 10, 10}};
    for (int run = 0; run < 3; run++) {
        void *compute = NULL;
        struct expert_cache *c = NULL;
        int32_t *ids_dev = NULL, ids[16];
        struct expert_tables t;
        g_mode = COPY_RANDOM;
        rng_seed(&g_rng, seed, 1);
        CHECK(cuda_stream_create(&compute) == 0, "stream");
        struct expert_cache_config cfg = {
            .n_slots = 40, .max_pairs = MAX_TOK * K, .pin_chunk = 4096};
        if (expert_cache_open((struct model *)m, &cfg, compute, &c)) {
            CHECK(0, "open: %s", err_msg());
            return;
        }
        CHECK(cuda_malloc((void **)&ids_dev, sizeof(ids)) == 0, "ids");
        if (run == 1)
            setenv("STRATA_DEVCACHE_EVEN", "1", 1);
        for (int l = 0; l < N_LAYER && run < 2; l++) {
            for (int i = 0; i < 16; i++)
                ids[i] = l == 0 ? i : i % 4;
            cuda_h2d(ids_dev, ids, sizeof(ids), compute);
            CHECK(expert_cache_prepare_copy(c, l, ids_dev, 16, &t) == 0, "copy: %s", err_msg());
            cuda_stream_sync(compute);
        }
        CHECK(expert_cache_device_start(c) == 0, "start: %s", err_msg());
        unsetenv("STRATA_DEVCACHE_EVEN");
        for (int l = 0; l < N_LAYER; l++)
            CHECK(expert_cache_device_slots(c, l) == want[run][l],
                  "shares, run %d: layer %d holds %d slots (want %d)", run, l,
                  expert_cache_device_slots(c, l), want[run][l]);
        CHECK(expert_cache_check(c) == 0, "the device state is inconsistent");
        expert_cache_close(c);
        cuda_free(ids_dev);
        cuda_stream_destroy(compute);
    }
}

/* The reference's state for a few hand-set calls: 8 experts, up to 4 slots of 48 bytes. */
enum { DC_NE = 8, DC_SLOTS = 4 };
struct dc_fixture {
    int32_t slot_of[DC_NE], owner[DC_SLOTS], list[DC_SLOTS], ids[2];
    uint32_t stamp[DC_SLOTS], clock, freq[DC_NE], n_jobs[2];
    uint8_t pf[DC_SLOTS], bytes[DC_SLOTS][64], host[DC_NE * 48];
    uint8_t *slot_ptr[DC_SLOTS];
    void *tab[3 * DC_NE];
    unsigned long long stats[DEVCACHE_NSTAT];
    struct cuda_devcache_job jobs[3 * DC_NE];
    struct cuda_devcache_call a;
};

/* Slots 0..n_held-1 hold experts 0..n_held-1, the others are free; the call lists n_list slots
 * and looks up ids[0..1]. */
static void dc_fixture_init(struct dc_fixture *f, int n_held, int n_list)
{
    memset(f, 0, sizeof(*f));
    for (int e = 0; e < DC_NE; e++)
        f->slot_of[e] = e < n_held ? e : -1;
    for (int i = 0; i < DC_SLOTS; i++) {
        f->owner[i] = i < n_held ? i : -1;
        f->list[i] = i;
        f->slot_ptr[i] = f->bytes[i];
    }
    f->a = (struct cuda_devcache_call){.ids = f->ids,
                                       .n_pairs = 2,
                                       .n_expert = DC_NE,
                                       .slot_of = f->slot_of,
                                       .list = f->list,
                                       .n_list = n_list,
                                       .pf = f->pf,
                                       .owner = f->owner,
                                       .stamp = f->stamp,
                                       .clock = &f->clock,
                                       .freq = f->freq,
                                       .tab = f->tab,
                                       .slot_ptr = f->slot_ptr,
                                       .stats = f->stats,
                                       .jobs = f->jobs,
                                       .n_jobs = f->n_jobs};
    for (int p = 0; p < 3; p++) {
        f->a.mapped[p] = f->host + p * DC_NE * 16;
        f->a.stride[p] = 16;
        f->a.off[p] = 16 * (uint64_t)p;
    }
}

/* The GPU's cache's victim rule on its reference alone: one layer of 8 experts, 3 slots
 * holding experts 0, 1, 2 (0 the least recent); 0 used five times, 1 once, 2 three times: a
 * miss takes 1's slot (the least used), not 0's (the least recent); a free slot goes before
 * any; the counts halve when the clock reaches a multiple of CUDA_DEVCACHE_AGE, and a
 * prediction counts nothing. */
static void devcache_victims(void)
{
    struct dc_fixture f;
    dc_fixture_init(&f, 3, 3);
    static const uint32_t stamp[DC_SLOTS] = {1, 2, 3, 0}, freq[DC_NE] = {5, 1, 3};
    memcpy(f.stamp, stamp, sizeof(stamp));
    memcpy(f.freq, freq, sizeof(freq));
    f.clock = 3;
    f.ids[0] = f.ids[1] = 7;
    uint32_t *fr = f.freq;
    int32_t *so = f.slot_of;
    devcache_ref_run(&f.a);
    CHECK(so[7] == 1 && so[1] == -1 && so[0] == 0 && so[2] == 2,
          "expert 7 took slot %d (want 1, the least used), expert 1 at %d", so[7], so[1]);
    CHECK(fr[7] == 1 && fr[0] == 5 && f.clock == 4, "counts %u %u, clock %u", fr[7], fr[0],
          f.clock);
    f.a.n_list = 4; /* slot 3 free: taken before any resident expert */
    f.ids[0] = f.ids[1] = 6;
    devcache_ref_run(&f.a);
    CHECK(so[6] == 3 && so[7] == 1, "expert 6 took slot %d (want 3, the free one)", so[6]);
    f.clock = CUDA_DEVCACHE_AGE - 1; /* the next call halves every count first */
    f.ids[0] = f.ids[1] = 0;
    devcache_ref_run(&f.a);
    CHECK(fr[0] == 3 && fr[2] == 1 && fr[7] == 0 && fr[6] == 0,
          "after the halving: %u %u %u %u (want 3 1 0 0)", fr[0], fr[2], fr[7], fr[6]);
    f.a.prefetch = 1; /* a prediction: no count, no clock */
    f.ids[0] = f.ids[1] = 5;
    devcache_ref_run(&f.a);
    CHECK(fr[5] == 0 && f.clock == CUDA_DEVCACHE_AGE && so[5] >= 0,
          "a prediction counted: %u, clock %u", fr[5], f.clock);
}

/* The CPU lane's rules on the reference (cuda_devcache_ref.h): a no_admit call counts its miss
 * and its use and gives it no slot, nor counts it as read in place; a gated prediction takes
 * its victim only when used at least as often as the victim's owner. */
static void devcache_lane_rules(void)
{
    struct dc_fixture f;
    dc_fixture_init(&f, 2, 2);
    f.stamp[0] = f.stamp[1] = 1;
    f.clock = 3;
    f.freq[0] = 4;
    f.freq[1] = 2;
    f.ids[0] = f.ids[1] = 3;
    f.a.no_admit = 1;
    const unsigned long long *st = f.stats;
    int32_t *so = f.slot_of;
    devcache_ref_run(&f.a);
    CHECK(so[3] == -1 && so[0] == 0 && so[1] == 1 && st[DEVCACHE_MISSES] == 1 &&
              st[DEVCACHE_BYTES_INPLACE] == 0 && st[DEVCACHE_EVICTIONS] == 0 && f.freq[3] == 1 &&
              f.clock == 4,
          "no_admit: expert 3 at slot %d, %llu misses, %llu bytes read in place, count %u", so[3],
          st[DEVCACHE_MISSES], st[DEVCACHE_BYTES_INPLACE], f.freq[3]);
    f.a.no_admit = 0;
    f.a.prefetch = f.a.gate = 1; /* expert 1 (used twice) is the victim; 3 was used once */
    devcache_ref_run(&f.a);
    CHECK(so[3] == -1 && so[1] == 1 && st[DEVCACHE_PF_ADMITTED] == 0,
          "gate: expert 3, used less than expert 1, took slot %d", so[3]);
    f.freq[3] = 2; /* used as often as the victim: admitted */
    devcache_ref_run(&f.a);
    CHECK(so[3] == 1 && so[1] == -1 && st[DEVCACHE_PF_ADMITTED] == 1,
          "gate: expert 3, used as often as expert 1, at slot %d (want 1)", so[3]);
}

static void scenario(const struct model *m, const struct scenario_cfg *sc)
{
    enum copy_mode mode = sc->mode;
    bool zerocopy = sc->zerocopy, prefetch = sc->prefetch, shrink = sc->shrink,
         hybrid = sc->hybrid;
    int n_slots = sc->n_slots, n_steps = sc->n_steps;
    uint64_t seed = sc->seed;
    static const char *mode_name[] = {"eager", "lazy", "random"};
    void *compute = NULL;
    struct expert_cache *c = NULL;
    int32_t *ids_dev = NULL, *pred_dev = NULL;
    static int32_t routed[N_LAYER][MAX_TOK * K], pred[EXPERT_CACHE_MAX_DEPTH * MAX_TOK * K];
    int depth = sc->depth < 1 ? 1 : sc->depth;
    int32_t fl[N_LAYER * N_EXPERT], fe[N_LAYER * N_EXPERT];
    int bad = 0;
    struct rng r;

    g_mode = mode;
    rng_seed(&g_rng, seed, 1);
    rng_seed(&r, seed, 2);
    CHECK(cuda_stream_create(&compute) == 0, "stream");
    /* 4 KiB registrations: copies straddle them */
    struct expert_cache_config cfg = {.n_slots = n_slots, .max_pairs = MAX_TOK * K,
                                      .gather = sc->gather, .pin_chunk = 4096};
    int rc = expert_cache_open((struct model *)m, &cfg, compute, &c);
    CHECK(rc == 0, "open: %s", err_msg());
    if (rc)
        return;
    uint64_t cpu_total = 0;
    if (hybrid) {
        /* equal bandwidths: lane_assign splits the misses between the lanes */
        static struct lane_model lm;
        lm = (struct lane_model){.pcie_bps = 1e9, .cpu_bps = sc->cpu_fast ? 4e9 : 1e9};
        CHECK(expert_cache_set_hybrid(c, lane_split, &lm, 4) == 0, "hybrid: %s", err_msg());
        expert_cache_set_hybrid_admit(c, sc->cpu_fast);
    }
    CHECK(cuda_malloc((void **)&ids_dev, sizeof(int32_t) * MAX_TOK * K) == 0, "ids");
    CHECK(cuda_malloc((void **)&pred_dev, sizeof(pred)) == 0, "pred");
    /* a profile's frozen set: distinct (layer, expert) pairs, placed and pinned */
    for (int i = 0; i < sc->n_frozen; i++) {
        fl[i] = i % N_LAYER;
        fe[i] = (i / N_LAYER * 5 + 3) % N_EXPERT;
    }
    if (sc->n_frozen) {
        int placed = expert_cache_preload(c, fl, fe, sc->n_frozen, true, NULL, NULL);
        CHECK(placed == sc->n_frozen, "preload: %d of %d placed (%s)", placed, sc->n_frozen,
              err_msg());
    }
    int n_back = 0;
    uint64_t acc_before = 0;
    for (int step = 0; step < n_steps && !rc; step++) {
        int n_tok = step == 0 ? MAX_TOK : 1 + (int)rng_below(&r, 2);
        const bool gpu = sc->gpu && (!sc->switch_every || (step / sc->switch_every) % 2 == 0);
        if (sc->gpu && !gpu && expert_cache_on_device(c)) { /* between steps, stream synced */
            uint64_t acc = 0;
            for (int l = 0; l < N_LAYER; l++)
                acc += expert_cache_stats(c, l)->hits + expert_cache_stats(c, l)->misses;
            rc = expert_cache_device_stop(c);
            CHECK(rc == 0 && !expert_cache_on_device(c), "device stop: %s", err_msg());
            CHECK(expert_cache_check(c) == 0, "step %d: the SLRU's state after the hand-back",
                  step);
            uint64_t after = 0;
            for (int l = 0; l < N_LAYER; l++)
                after += expert_cache_stats(c, l)->hits + expert_cache_stats(c, l)->misses;
            CHECK(after == acc && acc > acc_before, "step %d: lookups counted %llu, then %llu",
                  step, (unsigned long long)acc, (unsigned long long)after);
            acc_before = acc;
            n_back++;
        }
        for (int l = 0; l < N_LAYER; l++)
            route(&r, n_tok, routed[l]);
        for (int l = 0; l < N_LAYER && !rc; l++) {
            /* the router's kernel writes the ids on the compute stream */
            struct kernel_check *k = test_xmalloc(sizeof(*k));
            k->m = m;
            k->layer = l;
            k->n_pairs = n_tok * K;
            k->bad = &bad;
            memcpy(k->ids, routed[l], sizeof(int32_t) * (size_t)n_tok * K);
            cuda_h2d(ids_dev, k->ids, sizeof(int32_t) * (size_t)n_tok * K, compute);
            bool copy_path = !gpu && (!zerocopy || n_tok > 16);
            if (prefetch && copy_path && l + 1 < N_LAYER) {
                /* a prediction of the next layers: mostly right, some wrong */
                int nd = 0, n = n_tok * K;
                for (; nd < depth && l + 1 + nd < N_LAYER; nd++)
                    for (int i = 0; i < n; i++)
                        pred[nd * n + i] = rng_below(&r, 4) ? routed[l + 1 + nd][i]
                                                            : (int32_t)rng_below(&r, N_EXPERT);
                cuda_h2d(pred_dev, pred, sizeof(int32_t) * (size_t)(nd * n), compute);
                if (depth == 1)
                    expert_cache_predict_next(c, pred_dev, n);
                else
                    expert_cache_predict_ahead(c, pred_dev, n, nd);
            }
            /* the backend's rule: decode-sized calls take the chosen path, prefill copies */
            rc = gpu          ? expert_cache_prepare_device(c, l, ids_dev, n_tok * K, &k->t)
                 : !copy_path ? expert_cache_prepare_zerocopy(c, l, ids_dev, n_tok * K, &k->t)
                              : expert_cache_prepare_copy(c, l, ids_dev, n_tok * K, &k->t);
            CHECK(rc == 0, "prepare: %s", err_msg());
            if (!rc && gpu && prefetch && l + 1 < N_LAYER) {
                /* (c)'s prediction of the next layer, made after this layer's lookup */
                int n = n_tok * K;
                for (int i = 0; i < n; i++)
                    pred[i] =
                        rng_below(&r, 4) ? routed[l + 1][i] : (int32_t)rng_below(&r, N_EXPERT);
                cuda_h2d(pred_dev, pred, sizeof(int32_t) * (size_t)n, compute);
                rc = expert_cache_prefetch_device(c, l + 1, pred_dev, n);
                CHECK(rc == 0, "prefetch: %s", err_msg());
            }
            const int32_t *cpu;
            k->n_cpu = hybrid ? expert_cache_cpu_experts(c, &cpu) : 0;
            if (k->n_cpu)
                memcpy(k->cpu, cpu, sizeof(int32_t) * (size_t)k->n_cpu);
            cpu_total += (uint64_t)k->n_cpu;
            CHECK(!hybrid || copy_path, "hybrid runs on the copy path");
            push(compute, (struct op){.kind = OP_CHECK, .check = kernel_read, .arg = k});
        }
        /* the logits read-back syncs the compute stream, then the step ends */
        cuda_stream_sync(compute);
        if (!rc)
            rc = expert_cache_step_end(c);
        CHECK(expert_cache_check(c) == 0, "step %d: the slot policy's invariants broke", step);
        for (int i = 0; i < sc->n_frozen && !shrink; i++)
            CHECK(expert_cache_slot_of(c, fl[i], fe[i]) >= 0, "step %d: frozen expert %d of "
                  "layer %d was evicted", step, fe[i], fl[i]);
        /* half-way, an allocation elsewhere takes two slots' worth of the pool */
        if (!rc && step == n_steps / 2 && shrink) {
            int before = expert_cache_slots(c);
            int freed = expert_cache_shrink(c, 2 * expert_cache_slot_bytes(c));
            CHECK(freed > 0 && expert_cache_slots(c) == before - freed,
                  "shrink: %d freed, %d -> %d slots", freed, before, expert_cache_slots(c));
        }
    }
    cuda_stream_sync(compute);
    if (sc->switch_every) {
        printf("gpu: the device gave the slots back %d times\n", n_back);
        CHECK(n_back >= 2, "the device gave the slots back %d times", n_back);
    }
    uint64_t hits = 0, misses = 0, ev = 0, zc = 0, pf = 0, pfu = 0;
    for (int l = 0; l < N_LAYER; l++) {
        const struct expert_cache_layer_stats *s = expert_cache_stats(c, l);
        hits += s->hits;
        misses += s->misses;
        ev += s->evictions;
        zc += s->bytes_zerocopy;
        pf += s->prefetched;
        pfu += s->prefetch_used;
        CHECK(s->prefetch_used <= s->prefetched && s->prefetch_late <= s->prefetch_used &&
                  s->prefetch_wasted <= s->prefetched * (uint64_t)expert_cache_slot_bytes(c),
              "layer %d: prefetched %llu, used %llu, late %llu, wasted %llu bytes", l,
              (unsigned long long)s->prefetched, (unsigned long long)s->prefetch_used,
              (unsigned long long)s->prefetch_late, (unsigned long long)s->prefetch_wasted);
    }
    printf("%-8s%s%s %-6s %2d slots: %d wrong expert reads; %llu hits, %llu misses, %llu "
           "evictions, %llu bytes read in place, %llu prefetched (%llu used)\n",
           sc->gpu    ? "gpu"
           : zerocopy ? "zerocopy"
                      : "copy",
           prefetch ? "+pf" : "   ", sc->gather ? "+g" : "  ", mode_name[mode], n_slots, bad,
           (unsigned long long)hits, (unsigned long long)misses, (unsigned long long)ev,
           (unsigned long long)zc, (unsigned long long)pf, (unsigned long long)pfu);
    if (prefetch && !zerocopy)
        CHECK(pf > 0, "nothing was prefetched");
    CHECK(bad == 0, "%s, %s copies, %d slots: %d expert reads saw wrong bytes",
          zerocopy ? "zerocopy" : "copy", mode_name[mode], n_slots, bad);
    CHECK(misses > 0 && (n_slots >= N_LAYER * N_EXPERT || ev > 0), "the scenario never evicted");
    if (shrink)
        CHECK(expert_cache_slots(c) < n_slots, "the pool did not shrink");
    if (hybrid) {
        printf("         hybrid: %llu experts computed by the CPU lane\n",
               (unsigned long long)cpu_total);
        CHECK(cpu_total > 0 && misses > cpu_total, "the lanes were not both used");
        uint64_t admitted = 0;
        for (int l = 0; l < N_LAYER; l++)
            admitted += expert_cache_stats(c, l)->cpu_admitted;
        printf("         hybrid: %llu of them copied into a slot behind their call\n",
               (unsigned long long)admitted);
        CHECK(!sc->cpu_fast || admitted > 0, "no CPU-lane expert was admitted behind its call");
    }
    expert_cache_close(c);
    cuda_free(ids_dev);
    cuda_free(pred_dev);
    cuda_stream_destroy(compute);
}

int main(void)
{
    struct model m;
    static struct layer_weights layers[N_LAYER];
    struct rng r;
    uint64_t seed = test_seed("test_expert_cache");

    devcache_victims();
    devcache_lane_rules();
    rng_seed(&r, seed, 0);
    make_model(&m, layers, &r);
    static const int slots[] = {K + 1, 2 * K, 3 * K, N_LAYER * N_EXPERT};
    /* the model's memory cannot be pinned in place: the experts are copied to a registered
     * arena, and everything must read the same bytes from there */
    g_refuse_read_only = true;
    scenario(&m, &(struct scenario_cfg){.mode = COPY_RANDOM, .prefetch = true, .shrink = true,
                                        .n_slots = 2 * K, .n_steps = 40, .seed = seed + 11});
    scenario(&m, &(struct scenario_cfg){.mode = COPY_RANDOM, .zerocopy = true, .n_slots = 2 * K,
                                        .n_steps = 40, .seed = seed + 12});
    g_refuse_read_only = false;
    /* hybrid: misses split between the copy stream and the CPU lane (entries on zeros) */
    for (int mode = 0; mode < 3; mode++)
        for (size_t s = 0; s < 3; s++)
            scenario(&m, &(struct scenario_cfg){.mode = (enum copy_mode)mode, .prefetch = s == 1,
                                                .shrink = s == 2, .hybrid = true,
                                                .n_slots = slots[s], .n_steps = 40,
                                                .seed = seed + 20 + s});
    /* hybrid with a fast CPU lane: calls whose misses all go to the CPU admit one of them
     * behind their copies; its entries must read zeros for the call and the slot after */
    for (int mode = 0; mode < 3; mode++)
        scenario(&m, &(struct scenario_cfg){.mode = (enum copy_mode)mode, .hybrid = true,
                                            .cpu_fast = true, .n_slots = slots[0], .n_steps = 40,
                                            .seed = seed + 30 + mode});
    g_refuse_read_only = false;
    for (int zc = 0; zc < 2; zc++)
        for (int pf = 0; pf < 2; pf++)
            for (int mode = 0; mode < 3; mode++)
                for (size_t s = 0; s < sizeof(slots) / sizeof(slots[0]); s++)
                    scenario(&m, &(struct scenario_cfg){
                                         .mode = (enum copy_mode)mode, .zerocopy = zc,
                                         .prefetch = pf, .shrink = s % 2, .gather = s >= 2,
                                         .n_slots = slots[s], .n_steps = 40, .seed = seed + s});
    /* depth 2..4 predictions, and a profile's pinned set, with each copy progression */
    for (int mode = 0; mode < 3; mode++)
        for (int d = 2; d <= 4; d++)
            scenario(&m, &(struct scenario_cfg){.mode = (enum copy_mode)mode, .prefetch = true,
                                                .depth = d, .n_frozen = d == 3 ? K : 0,
                                                .gather = d == 4, .n_slots = 3 * K,
                                                .n_steps = 40, .seed = seed + 40 + d});
    for (int mode = 0; mode < 3; mode++)
        scenario(&m, &(struct scenario_cfg){.mode = (enum copy_mode)mode, .zerocopy = true,
                                            .n_frozen = 2 * K, .n_slots = 3 * K, .n_steps = 40,
                                            .seed = seed + 50 + mode});
    scenario(&m, &(struct scenario_cfg){.mode = COPY_RANDOM, .hybrid = true, .prefetch = true,
                                        .depth = 3, .n_frozen = K, .n_slots = 3 * K,
                                        .n_steps = 40, .seed = seed + 60});
    /* (c), the GPU's own cache, from every pool size, with a profile's pinned set handed over
     * from the SLRU, and with the pool holding every expert */
    for (int mode = 0; mode < 3; mode++)
        for (size_t s = 0; s < sizeof(slots) / sizeof(slots[0]); s++)
            scenario(&m, &(struct scenario_cfg){.mode = (enum copy_mode)mode,
                                                .gpu = true,
                                                .prefetch = s % 2,
                                                .n_frozen = s == 2 ? K : 0,
                                                .n_slots = slots[s],
                                                .n_steps = 40,
                                                .seed = seed + 70 + s});
    printf("gpu: %llu prefetched parts copied by the lookup that used them (their batch's "
           "copy launch had not run)\n",
           (unsigned long long)g_helped);
    CHECK(g_helped > 0, "no lookup found its prefetch still copying");
    /* (c) taking the slots and giving them back every 5 steps, the host path copying or
     * reading in place between; with a profile's pinned set, and with predictions on the
     * device */
    for (int mode = 0; mode < 3; mode++)
        for (int zc = 0; zc < 2; zc++)
            scenario(&m, &(struct scenario_cfg){.mode = (enum copy_mode)mode,
                                                .gpu = true,
                                                .zerocopy = zc,
                                                .prefetch = mode == 1,
                                                .switch_every = 5,
                                                .n_frozen = zc ? K : 0,
                                                .n_slots = 3 * K,
                                                .n_steps = 40,
                                                .seed = seed + 90 + mode});
    gpu_policy(&m, seed + 80);
    gpu_shares(&m, seed + 81);
    for (int l = 0; l < N_LAYER; l++) {
        free((void *)layers[l].gate_exps.data);
        free((void *)layers[l].up_exps.data);
        free((void *)layers[l].down_exps.data);
    }
    return test_finish("test_expert_cache");
}
