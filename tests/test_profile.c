/* test_profile: residency profiles (profiles/profile.h) without a GPU.
 * - round trip: counts from a random workload, planned, written and read back equal field by
 *   field, and the frozen set is the plan's (the most chosen, a share of the slots dynamic);
 * - re-plan: the same counts planned for other slot counts freeze the top of one ranking;
 * - every proper prefix of a profile is refused (truncation), the whole file without its last
 *   newline is read; hand edits (a word that is not a number, an id out of range or repeated,
 *   an unknown record, a repeated record, another version, text after "end", a binary byte, more
 *   frozen than slots) are refused naming the line;
 * - a profile of another model is refused naming what differs: the geometry (experts), or only
 *   the identity (same shapes, other weights and metadata);
 * - atomic write: a writer killed by SIGKILL at arbitrary moments while it rewrites the file
 *   over and over never leaves a file that does not parse.
 * The workload is random (test_seed) but every check holds for any draw. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "errors.h"
#include "gen.h"
#include "model.h"
#include "plan_sim.h"
#include "profile.h"
#include "quant_mix.h"
#include "rng.h"
#include "testutil.h"

static char tmpdir[] = "/tmp/strata-test-profile-XXXXXX";

static int gen_model(int n_expert, uint64_t seed, const char *name, char *path, size_t size)
{
    struct gen_preset p = *gen_preset_find("tiny");
    p.n_layer = 3;
    p.n_expert = n_expert;
    p.n_expert_used = 2;
    p.n_embd = 64;
    p.n_ff_exp = 32;
    p.n_vocab = 512;
    return test_gen_model(&p, QUANT_MIX_Q8_0, seed, tmpdir, name, path, size);
}

/* A random routing workload (skewed: low ids more popular) and a probe. */
static void fill_workload(struct profile *p, struct rng *r)
{
    int k = p->geo.n_expert_used, ne = p->geo.n_expert;
    int32_t ids[64];
    for (int step = 0; step < 200; step++) {
        int n_tok = 1 + (int)rng_below(r, 8);
        for (int l = 0; l < p->geo.n_layer; l++) {
            for (int i = 0; i < n_tok * k; i++) {
                uint32_t a = rng_below(r, (uint32_t)ne), b = rng_below(r, (uint32_t)ne);
                ids[i] = (int32_t)(a < b ? a : b);
            }
            profile_add(p, l, ids, n_tok, k);
        }
        p->n_tokens += (uint64_t)n_tok;
    }
    p->n_texts = 7;
    p->n_probe_prompt = 5;
    p->n_probe_out = 3;
    for (int i = 0; i < 5; i++)
        p->probe_prompt[i] = (int32_t)rng_below(r, 256);
    for (int i = 0; i < 3; i++)
        p->probe_out[i] = (int32_t)rng_below(r, 256);
    snprintf(p->probe_mode, sizeof(p->probe_mode), "cuda");
}

static bool same(const struct profile *a, const struct profile *b)
{
    size_t n = (size_t)a->geo.n_layer * a->geo.n_expert;
    return a->model_hash == b->model_hash && !strcmp(a->arch, b->arch) &&
           !memcmp(&a->geo, &b->geo, sizeof(a->geo)) && a->vram_budget == b->vram_budget &&
           a->slots == b->slots && a->dynamic_pct == b->dynamic_pct && a->n_texts == b->n_texts &&
           a->n_tokens == b->n_tokens && a->n_steps == b->n_steps &&
           !strcmp(a->probe_mode, b->probe_mode) && a->n_probe_prompt == b->n_probe_prompt &&
           a->n_probe_out == b->n_probe_out &&
           !memcmp(a->probe_prompt, b->probe_prompt, sizeof(a->probe_prompt)) &&
           !memcmp(a->probe_out, b->probe_out, sizeof(a->probe_out)) &&
           !memcmp(a->count, b->count, n * sizeof(*a->count)) &&
           !memcmp(a->last, b->last, n * sizeof(*a->last)) && !memcmp(a->frozen, b->frozen, n) &&
           a->n_frozen == b->n_frozen;
}

/* The plan is the top of the ranking (count, then recency, then layer and id), slots minus the
 * dynamic share long, never an expert that was not chosen. */
static void check_plan(const struct profile *p, int slots, int pct)
{
    size_t n = (size_t)p->geo.n_layer * p->geo.n_expert;
    long dyn = slots > 1 ? ((long)slots * pct + 99) / 100 : 0;
    dyn = slots > 1 && dyn < 1 ? 1 : dyn;
    long used = 0;
    for (size_t i = 0; i < n; i++)
        used += p->count[i] > 0;
    long want = slots - dyn < used ? slots - dyn : used;
    CHECK(p->n_frozen == want, "%d slots, %d%% dynamic: %d frozen, want %ld", slots, pct,
          p->n_frozen, want);
    for (size_t i = 0; i < n; i++) {
        if (!p->frozen[i])
            continue;
        CHECK(p->count[i] > 0, "an expert never chosen is frozen");
        for (size_t j = 0; j < n; j++) {
            bool better = p->count[j] > p->count[i] ||
                          (p->count[j] == p->count[i] && p->last[j] > p->last[i]);
            CHECK(!better || p->frozen[j], "expert %zu (count %llu) frozen, %zu (count %llu) not",
                  i, (unsigned long long)p->count[i], j, (unsigned long long)p->count[j]);
        }
    }
    int32_t layer[512], expert[512];
    profile_frozen_list(p, layer, expert);
    for (int i = 1; i < p->n_frozen; i++) {
        size_t a = (size_t)layer[i - 1] * p->geo.n_expert + expert[i - 1];
        size_t b = (size_t)layer[i] * p->geo.n_expert + expert[i];
        CHECK(p->frozen[b] && p->count[a] >= p->count[b], "frozen list out of order at %d", i);
    }
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = test_xmalloc(1 << 20);
    *len = f ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    if (f)
        fclose(f);
    buf[*len] = 0;
    return buf;
}

/* The text with the first occurrence of `from` replaced by `to`, parsed: must fail with `msg`
 * in the message. */
static void edited(const char *text, const char *from, const char *to, const char *msg)
{
    const char *at = strstr(text, from);
    CHECK(at != NULL, "'%s' not in the profile", from);
    if (!at)
        return;
    size_t n = strlen(text), fl = strlen(from), tl = strlen(to);
    char *buf = test_xmalloc(n + tl + 1);
    memcpy(buf, text, (size_t)(at - text));
    memcpy(buf + (at - text), to, tl);
    strcpy(buf + (at - text) + tl, at + fl);
    struct profile q;
    int rc = profile_parse(buf, strlen(buf), "edited", &q);
    CHECK(rc == -EINVAL && strstr(err_msg(), msg), "'%s' -> '%s': %d (%s), want '%s'", from, to,
          rc, err_msg(), msg);
    if (!rc)
        profile_free(&q);
    free(buf);
}

static void check_corruption(const char *path)
{
    size_t len;
    char *text = slurp(path, &len);
    struct profile q;
    int bad = 0;
    for (size_t cut = 0; cut + 1 < len; cut++) {
        if (profile_parse(text, cut, "prefix", &q) == 0) {
            bad++;
            profile_free(&q);
        }
    }
    CHECK(bad == 0, "%d proper prefixes of %zu bytes were read as whole profiles", bad, len);
    CHECK(profile_parse(text, len - 1, "no newline", &q) == 0, "the file without its last "
          "newline: %s", err_msg());
    profile_free(&q);
    CHECK(profile_parse(text, len / 2, "half", &q) == -EINVAL && strstr(err_msg(), "half:"),
          "half a file: %s", err_msg());
    edited(text, "strata-profile 1", "strata-profile 2", "format version 2");
    edited(text, "strata-profile 1", "hello", "not a strata profile");
    edited(text, "\nwarmup 7", "\nwarmup x7", "texts: 'x7' is not a number");
    edited(text, "\nwarmup 7", "\nwarmup -7", "is not a number");
    edited(text, "\nfrozen 0", "\nfrozen 0 999", "frozen expert '999' is not an id");
    edited(text, "\nfrozen 1", "\nfrozen 1 0 0", "frozen twice");
    edited(text, "\nprobe cuda", "\nprobe cuda\nwhatever 1", "unknown record 'whatever'");
    edited(text, "\nprobe cuda", "\nprobe cuda\nprobe cpu", "a second 'probe' record");
    edited(text, "\ncount 2", "\ncount 1", "a second 'count' record for layer 1");
    edited(text, "\nend", "\nend\nmore", "text after 'end'");
    edited(text, "\nprobe cuda", "\nprobe c\001da", "not printable");
    edited(text, "\nlast 0 ", "\nlast 0 1 ", "unexpected");
    edited(text, "\nbudget 1234 20 ", "\nbudget 1234 1 ", "more than the 1 slots");
    edited(text, "\ngeometry 3 ", "\ngeometry 99999 ", "layers: '99999' is not a number in");
    free(text);
}

/* The frozen share chosen by replay: six hot experts of layer 0 used in turn between cold
 * ones that never come back soon, in a pool of 8 slots whose protected segment holds 4. The
 * SLRU alone keeps losing two of the hot six to the cold stream; freezing them keeps them all.
 * The replay must find that (decode hit rate 50%: every hot use, no cold one) and freeze at
 * least the six; and a seeded pool never does worse than a cold one there. */
static void check_choose(const struct model *m)
{
    struct profile p;
    struct profile_trace tr = {0};
    struct profile_sim_report r;
    CHECK(profile_init(&p, m) == 0, "init");
    for (int text = 0; text < 2; text++)
        for (int call = 0; call < 600; call++) {
            int32_t ids[2] = {call % 6, 6 + call % 10};
            profile_add(&p, 0, ids, 1, 2);
            CHECK(profile_trace_add(&tr, text, 0, ids, 1, 2) == 0, "trace");
        }
    CHECK(profile_choose(&p, &tr, 8, &r) == 0, "choose: %s", err_msg());
    printf("replay: cold %.3f", r.cold);
    for (int i = 0; i < PROFILE_SIM_SHARES; i++)
        printf(", %d%% dynamic %.3f", r.share_pct[i], r.share_hit[i]);
    printf(" -> %d%% dynamic, %d frozen\n", r.chosen_pct, p.n_frozen);
    CHECK(r.lookups == 1200, "%llu lookups replayed, want 1200", (unsigned long long)r.lookups);
    CHECK(r.chosen_pct <= 25 && p.n_frozen >= 6, "chose %d%% dynamic (%d frozen)", r.chosen_pct,
          p.n_frozen);
    for (int e = 0; e < 6; e++)
        CHECK(p.frozen[e], "hot expert %d is not frozen", e);
    CHECK(r.share_hit[0] < 0.5 && r.share_hit[3] > 0.499, "hit rates: none frozen %.3f, 75%% "
          "frozen %.3f", r.share_hit[0], r.share_hit[3]);
    CHECK(r.share_hit[0] >= r.cold, "seeding lost to a cold pool: %.3f < %.3f", r.share_hit[0],
          r.cold);
    profile_trace_free(&tr);
    profile_free(&p);
}

/* A child rewrites path with profiles a and b in turn until killed; the file must always parse
 * as one of them. */
static void check_atomic(const char *path, const struct profile *a, const struct profile *b)
{
    struct profile q;
    CHECK(profile_write(a, path) == 0, "first write: %s", err_msg());
    for (int round = 0; round < 20; round++) {
        pid_t pid = fork();
        CHECK(pid >= 0, "fork");
        if (pid == 0) {
            for (int i = 0;; i++)
                if (profile_write(i & 1 ? b : a, path))
                    _exit(3);
        }
        struct timespec ts = {0, 200000 + 137000 * round}; /* 0.2..2.8 ms */
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        int rc = profile_read(path, &q);
        CHECK(rc == 0 && (same(&q, a) || same(&q, b)),
              "round %d: after SIGKILL the file is neither profile: %s", round, err_msg());
        if (!rc)
            profile_free(&q);
    }
    /* the temp files of the killed writers stay until the next writer sweeps them */
    CHECK(profile_write(a, path) == 0, "rewrite: %s", err_msg());
}

int main(void)
{
    char m1[512], m2[512], m3[512], path[600], path2[600];
    struct model *a = NULL, *b = NULL, *c = NULL;
    struct profile p, q;
    struct rng r;

    rng_seed(&r, test_seed("test_profile"), 3);
    if (!mkdtemp(tmpdir) || gen_model(16, 5, "a", m1, sizeof(m1)) ||
        gen_model(8, 5, "b", m2, sizeof(m2)) || gen_model(16, 6, "c", m3, sizeof(m3)) ||
        model_open(m1, &a) || model_open(m2, &b) || model_open(m3, &c)) {
        fprintf(stderr, "setup: %s\n", err_msg());
        return 1;
    }
    CHECK(profile_init(&p, a) == 0, "init");
    fill_workload(&p, &r);
    p.vram_budget = 1234;
    profile_plan(&p, 20, 25);
    check_plan(&p, 20, 25);
    snprintf(path, sizeof(path), "%s/a.profile", tmpdir);
    CHECK(profile_write(&p, path) == 0, "write: %s", err_msg());
    CHECK(profile_read(path, &q) == 0, "read: %s", err_msg());
    CHECK(same(&p, &q), "the profile read back differs from the one written");
    CHECK(profile_check(&q, a, path) == 0, "its own model: %s", err_msg());
    profile_free(&q);

    /* re-plan for other pools: the same ranking's top */
    static const int pools[][2] = {{1, 25}, {2, 25}, {7, 0}, {33, 50}, {48, 100}, {48, 10}};
    for (size_t i = 0; i < sizeof(pools) / sizeof(pools[0]); i++) {
        profile_plan(&p, pools[i][0], pools[i][1]);
        check_plan(&p, pools[i][0], pools[i][1]);
    }
    profile_plan(&p, 20, 25);

    /* stale: other geometry; same geometry but another model */
    CHECK(profile_check(&p, b, path) == -ESTALE && strstr(err_msg(), "experts 8 here, 16 in "
          "the profile"), "another geometry: %s", err_msg());
    CHECK(profile_check(&p, c, path) == -ESTALE && strstr(err_msg(), "another model") &&
          !strstr(err_msg(), "here,"), "another model of the same shapes: %s", err_msg());

    check_corruption(path);
    check_choose(a);
    CHECK(profile_read(tmpdir, &q) == -EISDIR, "a directory: %s", err_msg());

    struct profile p2;
    CHECK(profile_init(&p2, a) == 0, "init 2");
    fill_workload(&p2, &r);
    profile_plan(&p2, 9, 30);
    snprintf(path2, sizeof(path2), "%s/atomic.profile", tmpdir);
    check_atomic(path2, &p, &p2);
    profile_free(&p2);
    profile_free(&p);
    model_close(a);
    model_close(b);
    model_close(c);
    unlink(path);
    unlink(path2);
    unlink(m1);
    unlink(m2);
    unlink(m3);
    CHECK(rmdir(tmpdir) == 0, "%s is not empty at the end", tmpdir);
    return test_finish("test_profile");
}
