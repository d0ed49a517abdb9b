/* disk_tier: the host tier read from the file, on a generated checkpoint (4 layers of 16
 * experts, q4_k_m):
 * - every expert a call returns holds the file's bytes of its gate, up and down rows, through
 *   io_uring and pread, with O_DIRECT where the file system takes it and buffered;
 * - a budget of one layer's experts misses every expert of a layer it comes back to after
 *   another, a budget of all of them hits from the second pass on; less than a layer is
 *   refused with the arithmetic, a call over the slots with -EINVAL;
 * - a file touched after the model mapped it is refused at open (-ESTALE);
 * - a file cut short under the tier: the read fails with -EIO naming the file, the offset, the
 *   tensor and the expert;
 * - the CPU device with host_budget of one layer's experts (every layer read from the file at
 *   every token) gives the logits of the mapped run bit for bit over a prompt and 16 greedy
 *   steps, with io_uring and with pread, O_DIRECT and buffered, with and without reading the
 *   next layer's predicted experts ahead (io_uring), and with io_uring's reads in 4 KiB pieces
 *   (STRATA_TIER_CHUNK_KIB);
 * - read ahead directly: the experts land with the file's bytes and count as used when asked
 *   for;
 * - the disk learned from the calls' reads on a fake clock (bandwidth and latency exact), and a
 *   read-ahead paced to the experts that disk lands in the window before the next call.
 * The model is fixed (gen seed); no timing is checked (the engine runs set STRATA_TIER_PACE=0,
 * so that what they read ahead does not depend on the machine's speed). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "disk_tier.h"
#include "gen.h"
#include "gguf.h"
#include "model.h"
#include "quant_mix.h"
#include "strata.h"
#include "testutil.h"

#define N_STEPS 16

static char tmpdir[] = "/tmp/strata-test-disk-tier-XXXXXX";

static const uint8_t *expert_part(const struct model *m, int l, int e, int p)
{
    const struct layer_weights *lw = &m->layers[l];
    const struct weight *w = p == 0 ? &lw->gate_exps : p == 1 ? &lw->up_exps : &lw->down_exps;
    return (const uint8_t *)w->data + (size_t)e * (w->bytes / m->hp.n_expert);
}

static uint64_t part_bytes(const struct model *m, int l, int p)
{
    const struct layer_weights *lw = &m->layers[l];
    const struct weight *w = p == 0 ? &lw->gate_exps : p == 1 ? &lw->up_exps : &lw->down_exps;
    return w->bytes / m->hp.n_expert;
}

/* Asks for every expert of each layer in turn, `passes` times; counts wrong bytes. */
static int sweep(struct disk_tier *t, const struct model *m, int passes, size_t *wrong)
{
    int ne = (int)m->hp.n_expert;
    int32_t *ids = malloc(sizeof(int32_t) * ne);
    const uint8_t **ptrs = malloc(sizeof(*ptrs) * 3 * ne);
    int rc = 0;
    for (int e = 0; e < ne; e++)
        ids[e] = (e * 7) % ne; /* every expert, in another order than the file's */
    for (int pass = 0; pass < passes && !rc; pass++)
        for (int l = 0; l < (int)m->hp.n_layer && !rc; l++) {
            rc = disk_tier_get(t, l, ids, ne, ptrs);
            for (int i = 0; !rc && i < ne; i++)
                for (int p = 0; p < 3; p++)
                    *wrong += memcmp(ptrs[3 * i + p], expert_part(m, l, ids[i], p),
                                     part_bytes(m, l, p)) != 0;
        }
    free(ids);
    free(ptrs);
    return rc;
}

static void check_tier(const char *path, uint64_t *layer_bytes)
{
    struct model *m = NULL;
    CHECK(model_open(path, &m) == 0, "%s", strata_error());
    if (!m)
        return;
    int nl = (int)m->hp.n_layer, ne = (int)m->hp.n_expert;
    struct disk_tier *t = NULL;
    struct disk_tier_stats st;

    /* the slot size, from a tier of every expert */
    struct disk_tier_config all = {.host_budget = 1ull << 40};
    CHECK(disk_tier_open(m, &all, &t) == 0, "open: %s", strata_error());
    if (!t) {
        model_close(m);
        return;
    }
    disk_tier_get_stats(t, &st);
    uint64_t slot = st.slot_bytes;
    *layer_bytes = slot * (uint64_t)ne;
    CHECK(st.n_slots == nl * ne, "a budget above the model: %d slots", st.n_slots);
    size_t wrong = 0;
    CHECK(sweep(t, m, 2, &wrong) == 0, "sweep: %s", strata_error());
    disk_tier_get_stats(t, &st);
    printf("every expert held (%d slots of %llu bytes, %s, %s): 2 passes, %llu misses, %llu hits, "
           "%zu parts differ from the file\n",
           st.n_slots, (unsigned long long)slot, st.uring ? "io_uring" : "pread",
           st.direct ? "O_DIRECT" : "buffered", (unsigned long long)st.misses,
           (unsigned long long)st.hits, wrong);
    CHECK(wrong == 0 && st.misses == (uint64_t)nl * ne && st.hits == (uint64_t)nl * ne,
          "all held: %zu wrong, %llu misses, %llu hits", wrong, (unsigned long long)st.misses,
          (unsigned long long)st.hits);
    int32_t ids[64];
    const uint8_t *ptrs[3 * 64];
    for (int i = 0; i < 64; i++)
        ids[i] = i % ne;
    disk_tier_close(t);

    /* one layer's worth, each way of reading */
    static const struct {
        enum disk_tier_io io;
        bool buffered;
        const char *name;
    } ways[] = {{DISK_TIER_IO_URING, false, "io_uring"},
                {DISK_TIER_IO_URING, true, "io_uring, buffered"},
                {DISK_TIER_IO_PREAD, false, "pread"},
                {DISK_TIER_IO_PREAD, true, "pread, buffered"}};
    for (int w = 0; w < 4; w++) {
        struct disk_tier_config one = {.host_budget = *layer_bytes, .io = ways[w].io,
                                       .buffered = ways[w].buffered};
        t = NULL;
        int rc = disk_tier_open(m, &one, &t);
        if (rc == -ENOSYS || rc == -EPERM) { /* io_uring refused here (seccomp, old kernel) */
            printf("%s: %s (not checked)\n", ways[w].name, strata_error());
            continue;
        }
        CHECK(rc == 0, "%s: %s", ways[w].name, strata_error());
        if (!t)
            continue;
        wrong = 0;
        CHECK(sweep(t, m, 2, &wrong) == 0, "%s: %s", ways[w].name, strata_error());
        disk_tier_get_stats(t, &st);
        printf("one layer held (%d slots, %s%s): 2 passes over %d layers, %llu misses, %llu hits, "
               "%.2f MB read, %zu parts differ\n",
               st.n_slots, st.uring ? "io_uring" : "pread",
               st.direct ? ", O_DIRECT" : ", buffered", nl, (unsigned long long)st.misses,
               (unsigned long long)st.hits, st.bytes_read / 1e6, wrong);
        CHECK(wrong == 0 && st.hits == 0 && st.misses == 2ull * nl * ne,
              "%s: %zu wrong, %llu hits", ways[w].name, wrong, (unsigned long long)st.hits);
        CHECK(st.uring == (ways[w].io == DISK_TIER_IO_URING), "%s: io_uring %d", ways[w].name,
              st.uring);
        CHECK(!ways[w].buffered || !st.direct, "%s: O_DIRECT", ways[w].name);
        CHECK(disk_tier_get(t, 0, ids, ne + 1, ptrs) == -EINVAL, "more experts than slots");
        disk_tier_close(t);
    }

    /* read ahead: layer 1's experts started while layer 0's are in use, then asked for */
    struct disk_tier_config ra = {.host_budget = 2 * *layer_bytes, .io = DISK_TIER_IO_URING};
    t = NULL;
    if (disk_tier_open(m, &ra, &t) == 0) {
        int32_t all_ids[64];
        for (int e = 0; e < ne; e++)
            all_ids[e] = e;
        CHECK(disk_tier_get(t, 0, all_ids, ne, ptrs) == 0, "layer 0: %s", strata_error());
        int started = disk_tier_read_ahead(t, 1, all_ids, ne);
        CHECK(disk_tier_get(t, 1, all_ids, ne, ptrs) == 0, "layer 1: %s", strata_error());
        size_t bad = 0;
        for (int e = 0; e < ne; e++)
            for (int p = 0; p < 3; p++)
                bad += memcmp(ptrs[3 * e + p], expert_part(m, 1, e, p), part_bytes(m, 1, p)) != 0;
        disk_tier_get_stats(t, &st);
        printf("read ahead: %d experts of layer 1 started, %llu used, %llu misses, %zu parts "
               "differ\n",
               started, (unsigned long long)st.ahead_used, (unsigned long long)st.misses, bad);
        CHECK(started == ne && st.ahead_used == (uint64_t)ne && st.misses == (uint64_t)ne &&
                  bad == 0,
              "read ahead: %d started, %llu used, %zu differ", started,
              (unsigned long long)st.ahead_used, bad);
        disk_tier_close(t);
    }

    /* the file changed on disk after the model mapped it: refused */
    /* a fixed time long past, so coarse file-system timestamps cannot hide the change */
    struct timespec ts[2] = {{0, UTIME_OMIT}, {1000000000, 0}};
    CHECK(utimensat(AT_FDCWD, path, ts, 0) == 0, "touch");
    t = NULL;
    int rc_stale = disk_tier_open(m, &all, &t);
    printf("after the file's mtime was set back: rc %d: %s\n", rc_stale, strata_error());
    CHECK(rc_stale == -ESTALE && strstr(strata_error(), "changed on disk"), "a touched file: %d",
          rc_stale);
    disk_tier_close(t);

    /* less than a layer */
    struct disk_tier_config small = {.host_budget = *layer_bytes - 1};
    t = NULL;
    CHECK(disk_tier_open(m, &small, &t) == -EINVAL && strstr(strata_error(), "one layer has"),
          "a budget below a layer: %s", strata_error());
    disk_tier_close(t);
    model_close(m);
}

/* The file cut inside the last layer's down experts, under an open tier. */
static void check_short_read(const char *src)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/cut.gguf", tmpdir);
    FILE *in = fopen(src, "rb"), *out = fopen(path, "wb");
    char buf[65536];
    size_t n;
    while (in && out && (n = fread(buf, 1, sizeof(buf), in)) > 0)
        fwrite(buf, 1, n, out);
    if (in)
        fclose(in);
    if (out)
        fclose(out);
    struct model *m = NULL;
    CHECK(model_open(path, &m) == 0, "%s", strata_error());
    if (!m)
        return;
    int l = (int)m->hp.n_layer - 1, ne = (int)m->hp.n_expert;
    const struct weight *down = &m->layers[l].down_exps;
    uint64_t at = (uint64_t)((const uint8_t *)down->data - m->file->base) + down->bytes / 2;
    for (int io = DISK_TIER_IO_URING; io <= DISK_TIER_IO_PREAD; io++) {
        struct disk_tier_config cfg = {.host_budget = 1ull << 40, .io = (enum disk_tier_io)io};
        struct disk_tier *t = NULL;
        if (disk_tier_open(m, &cfg, &t))
            continue;
        CHECK(truncate(path, (off_t)at) == 0, "truncate");
        int32_t ids[64];
        const uint8_t *ptrs[3 * 64];
        for (int e = 0; e < ne; e++)
            ids[e] = e;
        int rc = disk_tier_get(t, l, ids, ne, ptrs);
        printf("file cut at %llu (%s): rc %d: %s\n", (unsigned long long)at,
               io == DISK_TIER_IO_URING ? "io_uring" : "pread", rc, strata_error());
        CHECK(rc == -EIO && strstr(strata_error(), "cut.gguf") &&
                  strstr(strata_error(), down->name) && strstr(strata_error(), "offset"),
              "a cut file: %d (%s)", rc, strata_error());
        disk_tier_close(t);
    }
    model_close(m);
    unlink(path);
}

/* Logits of a prompt and N_STEPS greedy steps on the CPU device. */
/* A clock that moves by fake_step at every reading: a call's reads then take fake_step. */
static double fake_now, fake_step;
static double fake_clock(void)
{
    return fake_now += fake_step;
}

/* The tier learns the disk (bandwidth and per-batch latency) from its calls' reads and paces a
 * read-ahead to what that disk lands before the next call: calls whose reads take exactly
 * LAT + bytes / RATE on the fake clock, then a window W between a read-ahead and the next call
 * worth 3.5 experts of the layer read ahead. Exact arithmetic, no real timing. */
static void check_pacing(const char *path)
{
    const double RATE = 1e9, LAT = 2e-4;
    struct model *m = NULL;
    CHECK(model_open(path, &m) == 0, "%s", strata_error());
    if (!m)
        return;
    const int ne = (int)m->hp.n_expert;
    uint64_t all = UINT64_MAX / 2;
    struct disk_tier_config cfg = {
        .host_budget = all, .io = DISK_TIER_IO_URING, .clock = fake_clock};
    uint64_t span[2][64]; /* the file bytes of each expert of layers 0 and 2 */
    struct disk_tier *t = NULL;
    const uint8_t *ptrs[3 * 64];
    struct disk_tier_stats st;
    fake_step = 0; /* a still clock: the reads teach nothing */
    if (disk_tier_open(m, &cfg, &t)) {
        printf("pacing: skipped (io_uring: %s)\n", strata_error());
        model_close(m);
        return;
    }
    for (int k = 0; k < 2; k++)
        for (int32_t e = 0; e < ne; e++) {
            disk_tier_get_stats(t, &st);
            uint64_t before = st.bytes_read;
            CHECK(disk_tier_get(t, 2 * k, &e, 1, ptrs) == 0, "%s", strata_error());
            disk_tier_get_stats(t, &st);
            span[k][e] = st.bytes_read - before;
        }
    CHECK(st.disk_bps == 0, "a still clock taught a bandwidth");
    disk_tier_close(t);

    CHECK(disk_tier_open(m, &cfg, &t) == 0, "%s", strata_error());
    static const int32_t batch[4][4] = {{0}, {1, 2}, {3, 4, 5}, {6, 7, 8, 9}};
    for (int b = 0; b < 4; b++) {
        double bytes = 0;
        for (int i = 0; i <= b; i++)
            bytes += (double)span[0][batch[b][i]];
        fake_step = LAT + bytes / RATE;
        CHECK(disk_tier_get(t, 0, batch[b], b + 1, ptrs) == 0, "%s", strata_error());
    }
    disk_tier_get_stats(t, &st);
    printf("pacing: learned %.4g GB/s + %.4g ms a batch (the calls took %.4g GB/s + %.4g ms)\n",
           st.disk_bps / 1e9, st.disk_lat_s * 1e3, RATE / 1e9, LAT * 1e3);
    CHECK(fabs(st.disk_bps / RATE - 1) < 1e-6 && fabs(st.disk_lat_s - LAT) < 1e-9,
          "learned %g B/s + %g s", st.disk_bps, st.disk_lat_s);

    int32_t ids[64];
    for (int e = 0; e < ne; e++)
        ids[e] = e;
    /* no window known yet: every expert of layer 1 is started */
    double room = (double)span[1][0] + span[1][1] + span[1][2] + span[1][3] / 2.0;
    fake_step = LAT + room / RATE; /* the window W */
    int started = disk_tier_read_ahead(t, 1, ids, ne);
    CHECK(started == ne, "read ahead with no window known: %d of %d", started, ne);
    CHECK(disk_tier_get(t, 1, ids, ne, ptrs) == 0, "%s", strata_error()); /* window W */
    /* now W holds 3.5 of layer 2's experts at the learned rate, after its latency */
    started = disk_tier_read_ahead(t, 2, ids, ne);
    disk_tier_get_stats(t, &st);
    printf("pacing: window %.4g ms; read ahead %d of layer 2's %d experts, %llu paced\n",
           st.window_s * 1e3, started, ne, (unsigned long long)st.ahead_paced);
    CHECK(started == 3 && st.ahead_paced == (uint64_t)(ne - 3),
          "paced read-ahead: %d started, %llu paced", started, (unsigned long long)st.ahead_paced);
    CHECK(disk_tier_get(t, 2, ids, 3, ptrs) == 0, "%s", strata_error());
    size_t bad = 0;
    for (int e = 0; e < 3; e++)
        for (int p = 0; p < 3; p++)
            bad += memcmp(ptrs[3 * e + p], expert_part(m, 2, e, p), part_bytes(m, 2, p)) != 0;
    disk_tier_get_stats(t, &st);
    CHECK(bad == 0 && st.ahead_used == (uint64_t)ne + 3,
          "paced experts: %zu parts differ, %llu "
          "used",
          bad, (unsigned long long)st.ahead_used);
    disk_tier_close(t);
    model_close(m);
}

static int run(const char *path, uint64_t host_budget, unsigned flags, float *logits, int nv,
               struct strata_stats *st)
{
    struct strata_config cfg;
    struct strata *s = NULL;
    struct strata_stream *ss = NULL;
    static const int32_t prompt[] = {5, 77, 301, 12, 9, 140, 66, 2};
    strata_config_init(&cfg);
    cfg.model_path = path;
    cfg.device = STRATA_DEVICE_CPU;
    cfg.n_threads = 2;
    cfg.n_ctx = 64;
    cfg.host_budget = host_budget;
    cfg.flags = flags;
    int rc = strata_open(&cfg, &s);
    rc = rc ? rc : strata_stream_open(s, 0, &ss);
    rc = rc ? rc : strata_eval(ss, prompt, 8, logits);
    for (int t = 0; !rc && t < N_STEPS; t++) {
        int32_t id = 0;
        const float *prev = logits + (size_t)t * nv;
        for (int v = 1; v < nv; v++)
            id = prev[v] > prev[id] ? v : id;
        rc = strata_eval(ss, &id, 1, logits + (size_t)(t + 1) * nv);
    }
    if (s)
        strata_get_stats(s, st);
    strata_stream_close(ss);
    strata_close(s);
    return rc;
}

static void check_engine(const char *path, uint64_t layer_bytes, int nv)
{
    setenv("STRATA_TIER_PACE", "0", 1);
    size_t n = (size_t)(N_STEPS + 1) * nv;
    float *ref = test_xmalloc(sizeof(float) * n), *got = test_xmalloc(sizeof(float) * n);
    struct strata_stats st;
    CHECK(run(path, 0, 0, ref, nv, &st) == 0, "mapped: %s", strata_error());
    static const unsigned flags[] = {0,
                                     STRATA_FLAG_NO_URING,
                                     STRATA_FLAG_NO_DIRECT,
                                     STRATA_FLAG_NO_URING | STRATA_FLAG_NO_DIRECT,
                                     STRATA_FLAG_READ_AHEAD,
                                     STRATA_FLAG_READ_AHEAD | STRATA_FLAG_NO_DIRECT,
                                     0};
    for (int i = 0; i < 7; i++) {
        test_poison_f32(got, n);
        if (i == 6) /* io_uring reads in pieces of 4 KiB */
            setenv("STRATA_TIER_CHUNK_KIB", "4", 1);
        int rc = run(path, layer_bytes, flags[i], got, nv, &st);
        unsetenv("STRATA_TIER_CHUNK_KIB");
        CHECK(rc == 0, "host tier: %s", strata_error());
        size_t diff = 0;
        for (size_t j = 0; j < n; j++)
            diff += memcmp(&got[j], &ref[j], sizeof(float)) != 0;
        printf("CPU device, host tier of one layer (%d slots, %s, %s%s%s): prompt + %d steps, "
               "%llu misses, %llu hits (%llu of %llu experts read ahead used), %.1f MB read; %zu "
               "of %zu logits differ from the mapped run\n",
               st.tier_slots, st.tier_uring ? "io_uring" : "pread",
               st.tier_direct ? "O_DIRECT" : "buffered",
               flags[i] & STRATA_FLAG_READ_AHEAD ? ", read-ahead" : "",
               i == 6 ? ", reads in 4 KiB pieces" : "", N_STEPS, (unsigned long long)st.tier_misses,
               (unsigned long long)st.tier_hits, (unsigned long long)st.tier_ahead_used,
               (unsigned long long)st.tier_ahead, st.tier_bytes_read / 1e6, diff, n);
        /* read-ahead: the next layer's predicted experts read while a layer computes */
        bool ahead = st.tier_uring && (flags[i] & STRATA_FLAG_READ_AHEAD);
        CHECK(ahead ? st.tier_ahead_used > 0 : st.tier_ahead == 0, "read-ahead %llu/%llu",
              (unsigned long long)st.tier_ahead_used, (unsigned long long)st.tier_ahead);
        CHECK(st.has_host_tier && diff == 0, "host tier flags %u: %zu logits differ", flags[i],
              diff);
        /* every step reads every layer again: its experts were evicted by the layers after */
        CHECK(st.tier_misses >= (uint64_t)(N_STEPS + 1) * 4, "only %llu misses",
              (unsigned long long)st.tier_misses);
    }
    free(ref);
    free(got);
}

int main(void)
{
    char path[512];
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    struct gen_preset p = *gen_preset_find("tiny");
    p.n_layer = 4;
    p.n_expert = 16;
    p.n_expert_used = 4;
    if (test_gen_model(&p, QUANT_MIX_Q4_K_M, 11, tmpdir, "tier", path, sizeof(path))) {
        fprintf(stderr, "setup: %s\n", strata_error());
        return 1;
    }
    uint64_t layer_bytes = 0;
    check_tier(path, &layer_bytes);
    check_short_read(path);
    check_pacing(path);
    if (layer_bytes)
        check_engine(path, layer_bytes, (int)p.n_vocab);
    unlink(path);
    rmdir(tmpdir);
    return test_finish("test_disk_tier");
}
