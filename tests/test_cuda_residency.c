/* cuda residency: with experts in pinned host memory and a VRAM slot pool far too
 * small to hold them, every logit must be bit-identical to the all-resident run, in both ways
 * of serving misses (copy into slots; read in place and cache between tokens), with the model
 * mapped and with --no-mmap's copy, while the pool misses on every token; the copy path also
 * with --prefetch (the next layer's predicted experts streamed ahead). Also: a budget the
 * trunk cannot fit in is refused with the shortfall named, and a budget that fits gives a
 * pool. Static placement (the first layers' experts on the CPU) is checked against the
 * all-resident run within a tolerance, and so is the automatic placement, which tries copy,
 * hybrid and zero-copy decode in turn before it keeps one. Host memory is pinned in 64 KiB pieces
 * here (backend_cuda_config.pin_chunk), so expert copies straddle registrations as they do in 1 GiB
 * pieces on real models. The host tier (host_budget of one layer's experts): the copy path and
 * static placement reading through it are bit-identical to reading the mapping, and so is
 * hybrid with its split fixed. Models: the `tiny` preset widened to 4 layers of 16 experts (top-4),
 * f32 and q4_k_m. Exits 77 without a GPU. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "disk_tier.h"
#include "errors.h"
#include "gen.h"
#include "model.h"
#include "sampler.h"
#include "stream.h"
#include "testutil.h"

#define N_PROMPT 12
#define N_STEPS 64

static char tmpdir[] = "/tmp/strata-test-cuda-residency-XXXXXX";

struct run {
    float *logits;  /* (1 + N_STEPS, n_vocab): the prompt's, then one per greedy step */
    int32_t ids[N_STEPS];
    struct moe_cache_totals tot;
    struct disk_tier_stats tier; /* with host_budget */
};

/* Prompt, then greedy steps, recording every logit vector. */
static int run_model(const char *path, const struct backend_cuda_config *cc, int no_mmap,
                     const int32_t *prompt, struct run *out)
{
    struct model *m = NULL;
    struct backend *b = NULL;
    struct stream *s = NULL;
    struct backend_cuda_config c64 = *cc;
    c64.pin_chunk = 65536; /* expert copies straddle registrations */
    int rc = model_open(path, &m);
    rc = rc ? rc : (no_mmap ? model_load_copy(m, 2) : 0);
    rc = rc ? rc : backend_cuda_open(m, &c64, &b);
    rc = rc ? rc : stream_open(b, 128, 32, &s);
    if (rc) {
        fprintf(stderr, "%s: %s\n", path, err_msg());
        goto out;
    }
    int nv = (int)m->hp.n_vocab;
    out->logits = test_xmalloc(sizeof(float) * (size_t)nv * (N_STEPS + 1));
    test_poison_f32(out->logits, (size_t)nv * (N_STEPS + 1));
    rc = stream_eval(s, prompt, N_PROMPT, out->logits);
    for (int i = 0; !rc && i < N_STEPS; i++) {
        out->ids[i] = sampler_argmax(out->logits + (size_t)i * nv, nv);
        rc = stream_eval(s, &out->ids[i], 1, out->logits + (size_t)(i + 1) * nv);
    }
    if (rc)
        fprintf(stderr, "%s: %s\n", path, err_msg());
    backend_cuda_cache_totals(b, &out->tot);
    backend_cuda_tier_stats(b, &out->tier);
    if (!rc && getenv("STRATA_TEST_VERBOSE"))
        backend_cuda_print_stats(b, stdout);
out:
    stream_close(s);
    backend_close(b);
    model_close(m);
    return rc;
}

/* The all-resident run every other configuration is compared with. 0, or -1 (a failed
 * check recorded). */
static int reference(const char *path, const int32_t *prompt, struct run *ref)
{
    struct backend_cuda_config all = {.device = 0};
    memset(ref, 0, sizeof(*ref));
    if (run_model(path, &all, 0, prompt, ref)) {
        CHECK(0, "%s: the all-resident run failed", path);
        return -1;
    }
    return 0;
}

/* The first of n floats whose bits differ, or n. */
static size_t first_difference(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)))
            return i;
    return n;
}

static void exact(const char *path, const int32_t *prompt)
{
    struct run ref;
    if (reference(path, prompt, &ref))
        return;
    struct model *m = NULL;
    model_open(path, &m);
    int nv = (int)m->hp.n_vocab, n_keys = (int)(m->hp.n_layer * m->hp.n_expert);
    int k = (int)m->hp.n_expert_used;
    model_close(m);
    static const char *mode_name[] = {"copy", "zerocopy",    "copy+prefetch", "gather+prefetch",
                                      "gpu",  "gpu+prefetch"};
    const int slots[] = {k + 1, 2 * k, n_keys / 3};
    for (int mode = 0; mode < 6; mode++) {
        for (size_t si = 0; si < sizeof(slots) / sizeof(slots[0]); si++) {
            for (int no_mmap = 0; no_mmap < 2; no_mmap++) {
                if (no_mmap && si)
                    continue;
                struct backend_cuda_config cc = {
                    .device = 0,
                    .expert_slots = slots[si],
                    .residency = mode == 1   ? BACKEND_RESIDENCY_ZEROCOPY
                                 : mode >= 4 ? BACKEND_RESIDENCY_GPU
                                             : BACKEND_RESIDENCY_COPY,
                    .prefetch = mode == 2 || mode == 3 || mode == 5,
                    .gather_copies = mode == 3,
                };
                struct run r = {0};
                int rc = run_model(path, &cc, no_mmap, prompt, &r);
                CHECK(rc == 0, "%s %s %d slots: failed", path, mode_name[mode], slots[si]);
                if (rc)
                    continue;
                size_t n = (size_t)nv * (N_STEPS + 1);
                size_t first = first_difference(r.logits, ref.logits, n);
                uint64_t acc = r.tot.hits + r.tot.misses;
                printf("%s: %-13s %3d slots%s: %s; hit rate %.1f%%, %llu evictions, %.2f MB "
                       "copied, %.2f MB read in place\n",
                       path, mode_name[mode], r.tot.slots, no_mmap ? " (--no-mmap)" : "",
                       first == n ? "logits bit-identical" : "LOGITS DIFFER",
                       acc ? 100.0 * r.tot.hits / acc : 0.0,
                       (unsigned long long)r.tot.evictions, r.tot.bytes_copied / 1e6,
                       r.tot.bytes_zerocopy / 1e6);
                CHECK(first == n, "%s %s %d slots: logit %zu (step %zu) differs: %g vs %g", path,
                      mode_name[mode], slots[si], first, first / nv, r.logits[first],
                      ref.logits[first]);
                CHECK(r.tot.slots == slots[si], "pool of %d slots, asked for %d", r.tot.slots,
                      slots[si]);
                /* the smallest pools miss all the time and evict (the SLRU serves an expert
                 * used less often than every slot's without a slot, so not at every miss) */
                if (si == 0)
                    CHECK(r.tot.misses >= N_STEPS && r.tot.evictions >= N_STEPS / 4,
                          "%s %s: only %llu misses, %llu evictions", path, mode_name[mode],
                          (unsigned long long)r.tot.misses, (unsigned long long)r.tot.evictions);
                CHECK(r.tot.bytes_copied > 0, "nothing was streamed");
                free(r.logits);
            }
        }
    }
    free(ref.logits);
}

static void budgets(const char *path)
{
    struct model *m = NULL;
    struct backend *b = NULL;
    CHECK(model_open(path, &m) == 0, "%s", err_msg());
    if (!m)
        return;
    /* 1 MiB cannot hold the trunk: refused, and the message says by how much */
    struct backend_cuda_config cc = {.device = 0, .vram_budget = 1 << 20, .n_ctx = 128,
                                     .max_tok = 32};
    int rc = backend_cuda_open(m, &cc, &b);
    printf("1 MiB budget: rc %d: %s\n", rc, rc ? err_msg() : "");
    CHECK(rc == -ENOSPC, "a 1 MiB budget gave %d", rc);
    CHECK(strstr(err_msg(), "short") != NULL, "the message does not name the shortfall: %s",
          err_msg());
    if (!rc)
        backend_close(b);
    /* 64 MiB holds the trunk and every expert of these models: a pool, and the stream fits */
    cc.vram_budget = 64ull << 20;
    struct stream *s = NULL;
    size_t held8192 = cc.vram_budget;
    rc = backend_cuda_open(m, &cc, &b);
    CHECK(rc == 0, "64 MiB budget: %s", err_msg());
    if (!rc) {
        struct moe_cache_totals t;
        CHECK(backend_cuda_cache_totals(b, &t) == 0 && t.slots > 0, "no slots");
        CHECK(stream_open(b, 128, 32, &s) == 0, "the stream does not fit: %s", err_msg());
        CHECK(backend_cuda_vram_bytes(b) <= cc.vram_budget, "%zu bytes held over the budget",
              backend_cuda_vram_bytes(b));
        printf("64 MiB budget: %d slots, %.1f MiB held\n", t.slots,
               backend_cuda_vram_bytes(b) / 1048576.0);
        stream_close(s);
        s = NULL;
        CHECK(stream_open(b, 8192, 32, &s) == 0, "8192 positions under 64 MiB: %s", err_msg());
        held8192 = backend_cuda_vram_bytes(b);
        stream_close(s);
        backend_close(b);
    }
    /* a stream larger than the one declared at open: the pool gives up slots for it. The
     * budget is 1 MiB under what the full pool and an 8192-position stream held under 64 MiB
     * (the pool is sized at open for 128 positions, and 8192 add far more than 1 MiB of KV) */
    cc.vram_budget = held8192 - (1ull << 20);
    rc = backend_cuda_open(m, &cc, &b);
    CHECK(rc == 0, "64 MiB budget: %s", err_msg());
    if (!rc) {
        struct moe_cache_totals t0, t1;
        backend_cuda_cache_totals(b, &t0);
        rc = stream_open(b, 8192, 32, &s);
        backend_cuda_cache_totals(b, &t1);
        printf("a 8192-position stream under a pool sized for 128: %s; slots %d -> %d, %.1f MiB "
               "held\n",
               rc ? err_msg() : "opened", t0.slots, t1.slots,
               backend_cuda_vram_bytes(b) / 1048576.0);
        CHECK(rc == 0 && t1.slots < t0.slots, "the pool did not shrink for the stream");
        CHECK(backend_cuda_vram_bytes(b) <= cc.vram_budget, "over the budget after shrinking");
        if (!rc) {
            float *l = test_xmalloc(sizeof(float) * m->hp.n_vocab);
            int32_t ids[4] = {1, 2, 3, 4};
            CHECK(stream_eval(s, ids, 4, l) == 0, "decoding after the shrink: %s", err_msg());
            free(l);
        }
        stream_close(s);
        backend_close(b);
    }
    model_close(m);
}

/* Experts computed by the CPU lane: static placement (--placement static:2, the first two
 * layers' experts on the CPU) and hybrid (a 6-slot cache whose misses the cost model splits
 * between PCIe and the CPU). Not bitwise: prompt logits within tol of the all-resident run, and
 * the argmax of the all-resident run's own greedy tokens, fed to both (teacher forcing),
 * agreeing on >= min_pct% of the positions. f32: 95%. Quantized weights: the CPU kernels round
 * activations to 8 bits for their integer dot products while the GPU's stay float, and on
 * these random-weight models near-ties flip; two seeds gave logits 0.012 / 0.081 off and 47 /
 * 45 of 48, and the simulation's q8_0 model reached 0.137 on one of 17 seeds, so q4_k_m is
 * held to 0.2 and 85%. */
static void cpu_lane(const char *path, const int32_t *prompt, double tol, int min_pct,
                     const char *what, const struct backend_cuda_config *cc)
{
    struct run ref;
    if (reference(path, prompt, &ref))
        return;
    struct model *m = NULL;
    struct backend *b = NULL;
    struct stream *s = NULL;
    struct backend_cuda_config c64 = *cc;
    c64.pin_chunk = 65536;
    int rc = model_open(path, &m);
    rc = rc ? rc : backend_cuda_open(m, &c64, &b);
    rc = rc ? rc : stream_open(b, 128, 32, &s);
    CHECK(rc == 0, "%s %s: %s", path, what, err_msg());
    if (!rc) {
        int nv = (int)m->hp.n_vocab, agree = 0, seen[4] = {0};
        float *l = test_xmalloc(sizeof(float) * (size_t)nv);
        double err = 0, step_err = 0;
        rc = stream_eval(s, prompt, N_PROMPT, l);
        if (!rc)
            err = test_max_rel_err(l, ref.logits, (size_t)nv);
        for (int i = 0; !rc && i < N_STEPS; i++) {
            agree += sampler_argmax(l, nv) == ref.ids[i];
            rc = stream_eval(s, &ref.ids[i], 1, l);
            const char *pl = backend_cuda_placement(b); /* the mode that step ran in */
            seen[0] += !strcmp(pl, "copy");
            seen[1] += !strcmp(pl, "hybrid");
            seen[2] += !strcmp(pl, "zero-copy graph");
            seen[3] += !strcmp(pl, "gpu cache + CPU lane graph");
            double e = rc ? 0 : test_max_rel_err(l, ref.logits + (size_t)(i + 1) * nv, (size_t)nv);
            step_err = e > step_err ? e : step_err;
        }
        if (cc->auto_place) {
            /* the trials (10 steps each, 6 for one cut short as over 25% slower than the best
             * at half its window: copy, hybrid, zero-copy graph, the GPU's cache with and
             * without the CPU lane in its graph, copy again on a close call) fit in N_STEPS,
             * then one of them stays; each step within the hybrid tolerance */
            const char *end = backend_cuda_placement(b);
            printf("%s: %s: steps in copy %d, hybrid %d, zero-copy graph %d, the CPU lane in the "
                   "GPU cache's graph %d; then %s; decode logits max rel err %.3g\n",
                   path, what, seen[0], seen[1], seen[2], seen[3], end, step_err);
            CHECK(seen[0] >= 6 && seen[1] >= 6 && seen[2] >= 6 && seen[3] >= 6,
                  "%s: a mode was not tried (copy %d, hybrid %d, zero-copy %d, lane %d steps)",
                  what, seen[0], seen[1], seen[2], seen[3]);
            CHECK(!backend_cuda_auto_timing(b), "%s: undecided after %d steps (%s)", what, N_STEPS,
                  end);
            CHECK(step_err <= tol * 10, "%s: decode logits off by %g", what, step_err);
            /* held for a probe: copies, then back */
            CHECK(backend_cuda_auto_hold(b, true) == 0 &&
                      !strcmp(backend_cuda_placement(b), "copy"),
                  "%s: held in %s", what, backend_cuda_placement(b));
            CHECK(backend_cuda_auto_hold(b, false) == 0 && !strcmp(backend_cuda_placement(b), end),
                  "%s: released into %s, was %s", what, backend_cuda_placement(b), end);
        }
        printf("%s: %s: prompt logits max rel err %.3g (tol %.3g), argmax agrees on %d of %d "
               "teacher-forced positions\n",
               path, what, err, tol, agree, N_STEPS);
        if (getenv("STRATA_TEST_VERBOSE"))
            backend_cuda_print_stats(b, stdout);
        if (cc->hybrid && cc->residency == BACKEND_RESIDENCY_GPU) {
            /* the lane inside the graph computed the misses of every recorded step */
            struct moe_cache_totals t;
            backend_cuda_cache_totals(b, &t);
            printf("%s: %s: %llu experts on the CPU lane, %llu hits, %llu misses; decode "
                   "logits max rel err %.3g\n",
                   path, what, (unsigned long long)t.cpu_computed, (unsigned long long)t.hits,
                   (unsigned long long)t.misses, step_err);
            CHECK(t.cpu_computed > 0, "%s: the CPU lane computed nothing", what);
            CHECK(step_err <= tol * 10, "%s: decode logits off by %g", what, step_err);
        }
        CHECK(rc == 0, "%s decoding: %s", what, err_msg());
        CHECK(err <= tol, "%s logits off by %g", what, err);
        CHECK(agree * 100 >= min_pct * N_STEPS, "%s agrees on only %d of %d", what, agree,
              N_STEPS);
        free(l);
    }
    stream_close(s);
    backend_close(b);
    if (cc->cpu_moe_layers == 0) {
        model_close(m);
        free(ref.logits);
        return;
    }
    /* static: the split follows the budget (64 MiB holds every expert of these models) */
    struct backend_cuda_config ca = {.device = 0, .cpu_moe_layers = -1, .vram_budget = 64 << 20,
                                     .n_ctx = 128, .max_tok = 32};
    rc = backend_cuda_open(m, &ca, &b);
    CHECK(rc == 0, "static under 64 MiB: %s", err_msg());
    if (!rc) {
        printf("%s: static under 64 MiB: %d CPU layers\n", path, backend_cuda_cpu_moe_layers(b));
        CHECK(backend_cuda_cpu_moe_layers(b) == 0, "a budget that holds everything gave %d CPU "
              "layers", backend_cuda_cpu_moe_layers(b));
        backend_close(b);
    }
    model_close(m);
    free(ref.logits);
}

static int n_vocab_of(const char *path)
{
    struct model *m = NULL;
    int nv = model_open(path, &m) ? 0 : (int)m->hp.n_vocab;
    model_close(m);
    return nv;
}

/* Graph decode (--graph): one-token steps recorded once and replayed. The attention splits
 * its keys by the cache length instead of the position when the position comes from device
 * memory, so logits may differ in rounding: within 1e-4 of the largest, greedy identical. */
static void graph_decode(const char *path, const int32_t *prompt)
{
    struct run ref, g = {0};
    struct backend_cuda_config gc = {.device = 0, .graph = true};
    if (reference(path, prompt, &ref))
        return;
    int rc = run_model(path, &gc, 0, prompt, &g);
    CHECK(rc == 0, "%s: graph decode failed", path);
    if (!rc) {
        int nv = n_vocab_of(path), same = 0;
        double err = test_max_rel_err(g.logits, ref.logits, (size_t)nv * (N_STEPS + 1));
        while (same < N_STEPS && g.ids[same] == ref.ids[same])
            same++;
        printf("%s: graph decode: logits within %.3g of running the ops, greedy identical for "
               "%d of %d steps\n", path, err, same, N_STEPS);
        CHECK(err <= 1e-4, "graph decode logits off by %g", err);
        CHECK(same == N_STEPS, "graph decode greedy diverges at step %d", same);
        /* the GPU's own cache in the same graph, with the next layer's experts predicted and
         * copied on a branch of the graph: its lookups and copies are kernels of the step, and
         * the experts' bytes are the same, so the logits are the resident graph's */
        struct model *m = NULL;
        model_open(path, &m);
        int k = m ? (int)m->hp.n_expert_used : 1;
        model_close(m);
        struct backend_cuda_config gg = {.device = 0,
                                         .graph = true,
                                         .expert_slots = k + 1,
                                         .residency = BACKEND_RESIDENCY_GPU,
                                         .prefetch = true};
        struct run d = {0};
        rc = run_model(path, &gg, 0, prompt, &d);
        CHECK(rc == 0, "%s: gpu cache graph decode failed", path);
        if (!rc) {
            size_t n = (size_t)nv * (N_STEPS + 1), first = first_difference(d.logits, g.logits, n);
            uint64_t acc = d.tot.hits + d.tot.misses;
            printf("%s: gpu cache + prefetch in a graph, %d slots: %s; hit rate %.1f%%, %llu "
                   "evictions, %llu prefetched (%llu used)\n",
                   path, d.tot.slots,
                   first == n ? "logits bit-identical to the resident graph" : "LOGITS DIFFER",
                   acc ? 100.0 * d.tot.hits / acc : 0.0, (unsigned long long)d.tot.evictions,
                   (unsigned long long)d.tot.prefetched, (unsigned long long)d.tot.prefetch_used);
            CHECK(first == n, "gpu cache graph: logit %zu differs: %g vs %g", first,
                  first < n ? d.logits[first] : 0.0f, first < n ? g.logits[first] : 0.0f);
            CHECK(d.tot.evictions > 0 && d.tot.prefetched > 0,
                  "gpu cache graph: nothing evicted or prefetched");
        }
        free(d.logits);
    }
    free(g.logits);
    free(ref.logits);
}

/* The tiny preset widened to 4 layers of 16 experts, top-4. */
/* The host tier (host_budget of about one layer's experts, so every layer is read from the
 * file again at every step): the copy path, with and without predictions read ahead, gives
 * the all-resident logits bit for bit; static placement's CPU layers give the logits of the
 * same placement reading the mapping bit for bit; the hybrid lane gives the prompt's logits
 * within its tolerance of all resident (its greedy steps may part from them), and with its
 * lanes' bandwidths given (the same split in every run) the logits of the same run reading the
 * mapping bit for bit. Every run reads from the file at least once a step. */
static void tier(const char *path, const int32_t *prompt, double tol)
{
    struct run ref, map = {0};
    if (reference(path, prompt, &ref))
        return;
    struct model *m = NULL;
    if (model_open(path, &m))
        return;
    int nv = (int)m->hp.n_vocab, ne = (int)m->hp.n_expert;
    uint64_t eb = 0;
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        const struct layer_weights *lw = &m->layers[l];
        uint64_t b = (lw->gate_exps.bytes + lw->up_exps.bytes + lw->down_exps.bytes) / ne;
        eb = b > eb ? b : eb;
    }
    model_close(m);
    /* a slot holds an expert's three parts, each rounded out to 4 KiB with 8 KiB to spare
     * (disk_tier.c): at most 3 x 12 KiB more than its bytes */
    const uint64_t one_layer = (uint64_t)ne * (eb + 3 * 12288);
    struct backend_cuda_config st = {.device = 0, .cpu_moe_layers = 2};
    CHECK(run_model(path, &st, 0, prompt, &map) == 0, "%s static:2 from the mapping", path);
    /* hybrid with its lanes' bandwidths given (both lanes at work, the same split in every
     * run), from the mapping */
    struct backend_cuda_config hg = {
        .device = 0, .expert_slots = 6, .hybrid = true, .lane_pcie_bps = 8e9, .lane_cpu_bps = 8e9};
    struct run hmap = {0};
    CHECK(run_model(path, &hg, 0, prompt, &hmap) == 0, "%s hybrid from the mapping", path);
    static const char *what[] = {"copy, 6 slots", "copy, 6 slots, predictions", "static:2",
                                 "hybrid, 6 slots", "hybrid, lanes given, 6 slots"};
    size_t n = (size_t)nv * (N_STEPS + 1);
    for (int c = 0; c < 5; c++) {
        struct backend_cuda_config cc = {.device = 0, .host_budget = one_layer};
        if (c == 4)
            cc = hg, cc.host_budget = one_layer;
        if (c < 2 || c == 3)
            cc.expert_slots = 6;
        cc.prefetch = c == 1;
        cc.tier_ahead = c == 1;
        cc.cpu_moe_layers = c == 2 ? 2 : 0;
        cc.hybrid = c >= 3;
        struct run r = {0};
        int rc = run_model(path, &cc, 0, prompt, &r);
        CHECK(rc == 0, "%s %s with a host tier: failed", path, what[c]);
        if (rc)
            continue;
        const float *want = c == 2 ? map.logits : c == 4 ? hmap.logits : ref.logits;
        size_t first = want ? first_difference(r.logits, want, n) : 0;
        /* hybrid: its greedy ids may part from all resident's, so the prompt's logits only */
        double err = test_max_rel_err(r.logits, ref.logits, c >= 3 ? (size_t)nv : n);
        printf("%s: %s, host tier of %d slots: %llu reads from the file, %.2f MB; %s (max rel "
               "err %.3g against all resident%s); %llu CPU-lane experts, %.2f MB read in "
               "place\n",
               path, what[c], r.tier.n_slots, (unsigned long long)r.tier.misses,
               r.tier.bytes_read / 1e6,
               first == n ? (c == 4 ? "bit-identical to the mapping" : "bit-identical")
                          : "logits differ",
               err, c >= 3 ? ", the prompt's" : "", (unsigned long long)r.tot.cpu_computed,
               r.tot.bytes_zerocopy / 1e6);
        CHECK(r.tier.misses >= (uint64_t)N_STEPS, "%s %s: the tier read %llu times", path, what[c],
              (unsigned long long)r.tier.misses);
        if (c >= 3)
            CHECK(err <= tol, "%s %s: logits off by %g", path, what[c], err);
        if (c == 4)
            CHECK(r.tot.cpu_computed > 0 && r.tot.bytes_copied > 0, "%s %s: one lane idle", path,
                  what[c]);
        if (c != 3)
            CHECK(first == n, "%s %s: logit %zu differs (%g vs %g)", path, what[c], first,
                  r.logits[first], want ? want[first] : 0.0f);
        free(r.logits);
    }
    free(hmap.logits);
    free(map.logits);
    free(ref.logits);
}

static int gen_model(enum quant_mix mix, char *path, size_t size)
{
    struct gen_preset p = *gen_preset_find("tiny");
    p.n_layer = 4;
    p.n_expert = 16;
    p.n_expert_used = 4;
    return test_gen_model(&p, mix, 23, tmpdir, "wide", path, size);
}

int main(void)
{
    char f32[512], q4[512];
    int32_t prompt[N_PROMPT];
    struct rng r;

    if (!test_gpu_available("test_cuda_residency"))
        return TEST_SKIP;
    rng_seed(&r, test_seed("test_cuda_residency"), 7);
    if (!mkdtemp(tmpdir) || gen_model(QUANT_MIX_F32, f32, sizeof(f32)) ||
        gen_model(QUANT_MIX_Q4_K_M, q4, sizeof(q4))) {
        fprintf(stderr, "setup: %s\n", err_msg());
        return 1;
    }
    for (int i = 0; i < N_PROMPT; i++)
        prompt[i] = (int32_t)rng_below(&r, 1000);
    exact(f32, prompt);
    exact(q4, prompt);
    budgets(q4);
    graph_decode(f32, prompt);
    graph_decode(q4, prompt);
    struct backend_cuda_config st = {.device = 0, .cpu_moe_layers = 2};
    struct backend_cuda_config hy = {.device = 0, .expert_slots = 6, .hybrid = true};
    tier(f32, prompt, 1e-3);
    tier(q4, prompt, 0.2);
    cpu_lane(f32, prompt, 1e-3, 95, "static:2", &st);
    cpu_lane(q4, prompt, 0.2, 85, "static:2", &st);
    cpu_lane(f32, prompt, 1e-3, 95, "hybrid, 6 slots", &hy);
    cpu_lane(q4, prompt, 0.2, 85, "hybrid, 6 slots", &hy);
    struct backend_cuda_config hg = hy; /* the CPU lane inside the GPU's cache's graph */
    hg.residency = BACKEND_RESIDENCY_GPU;
    cpu_lane(f32, prompt, 1e-3, 95, "hybrid in the GPU cache's graph, 6 slots", &hg);
    cpu_lane(q4, prompt, 0.2, 85, "hybrid in the GPU cache's graph, 6 slots", &hg);
    struct backend_cuda_config au = {
        .device = 0, .expert_slots = 6, .auto_place = true, .auto_try_all = true};
    cpu_lane(f32, prompt, 1e-3, 95, "auto, 6 slots", &au);
    cpu_lane(q4, prompt, 0.2, 85, "auto, 6 slots", &au);
    unlink(f32);
    unlink(q4);
    rmdir(tmpdir);
    return test_finish("test_cuda_residency");
}
