/* strata_restore: residency profiles in the public API: cfg.profile read, checked against the
 * model, planned for this run's slot count and placed into the expert cache at start; the
 * post-restore probe; the probe runner the warmup records with. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "clock.h"
#include "errors.h"
#include "model.h"
#include "profile.h"
#include "strata.h"
#include "strata_internal.h"
#include "strata_priv.h"

const char *strata_probe_mode(const struct strata *s)
{
    if (!s->cuda)
        return "cpu";
    if (s->cfg.placement == STRATA_PLACEMENT_HYBRID)
        return "cuda-hybrid";
    if (s->core && backend_cuda_cpu_moe_layers(s->core) > 0)
        return "cuda-static";
    return "cuda";
}

/* Progress of the copies on the log, when it is a terminal-like stream (one line, redrawn). */
static void strata_restore_progress(void *ctx, int done, int total)
{
    FILE *log = ctx;
    fprintf(log, "\rstrata: restoring the profile: %d/%d experts", done, total);
    if (done == total)
        fputc('\n', log);
    fflush(log);
}

/* Fills the pool: the frozen set first (pinned with STRATA_FLAG_PROFILE_FREEZE), then the
 * other experts the warmup chose, most chosen first (seeds the cache may evict). Fills
 * s->prof. */
static int strata_restore_place(struct strata *s, struct profile *p, int slots)
{
    const struct strata_config *cfg = &s->cfg;
    int rc;
    int32_t *layer = malloc(sizeof(int32_t) * (size_t)(slots > 0 ? slots : 1));
    int32_t *expert = malloc(sizeof(int32_t) * (size_t)(slots > 0 ? slots : 1));
    double t0 = clock_now_s();

    if (!layer || !expert) {
        free(layer);
        free(expert);
        return err_set(-ENOMEM, "out of memory");
    }
    int n = profile_seed_list(p, slots, layer, expert);
    int n_frozen = p->n_frozen < n ? p->n_frozen : n;
    bool freeze = cfg->flags & STRATA_FLAG_PROFILE_FREEZE;
    void (*prog)(void *, int, int) = cfg->log && n >= 256 ? strata_restore_progress : NULL;
    rc = backend_cuda_restore(s->core, layer, expert, n_frozen, freeze, NULL, NULL);
    if (rc >= 0 && rc == n_frozen) {
        int more = backend_cuda_restore(s->core, layer + n_frozen, expert + n_frozen,
                                        n - n_frozen, false, prog, cfg->log);
        rc = more < 0 ? more : rc + more;
    }
    if (rc >= 0) {
        /* the coverage of what was placed (a shrunk pool may hold less than the plan) */
        uint64_t all = 0, hit = 0;
        for (size_t i = 0; i < (size_t)p->geo.n_layer * p->geo.n_expert; i++)
            all += p->count[i];
        for (int i = 0; i < rc; i++)
            hit += p->count[(size_t)layer[i] * p->geo.n_expert + expert[i]];
        s->prof.restored = true;
        s->prof.frozen = freeze && n_frozen > 0;
        s->prof.n_frozen = freeze ? n_frozen : 0;
        s->prof.planned = n;
        s->prof.placed = rc;
        s->prof.slots = slots;
        s->prof.coverage = all ? (double)hit / (double)all : 0;
        s->prof.seconds = clock_now_s() - t0;
        backend_cuda_reset_stats(s->core);
        rc = 0;
    }
    free(layer);
    free(expert);
    return rc;
}

int strata_restore(struct strata *s)
{
    const struct strata_config *cfg = &s->cfg;
    bool optional = cfg->flags & STRATA_FLAG_PROFILE_OPTIONAL;
    struct profile *p = calloc(1, sizeof(*p));
    struct moe_cache_totals t;
    int rc;

    if (!p)
        return err_set(-ENOMEM, "out of memory");
    if (!s->cuda || backend_cuda_cache_totals(s->core, &t) != 0)
        rc = err_set(-ENOTSUP,
                     "--profile %s: a profile is restored into the expert cache, which this run "
                     "does not have (it needs --device cuda with --vram-budget, placement "
                     "stream or hybrid)",
                     cfg->profile);
    else
        rc = profile_read(cfg->profile, p);
    rc = rc ? rc : profile_check(p, s->model, cfg->profile);
    if (rc) {
        profile_free(p);
        free(p);
        if (!optional)
            return rc;
        if (cfg->log)
            fprintf(cfg->log, "strata: the profile is not used (--profile-optional): %s; the "
                              "cache starts cold\n", err_msg());
        return 0;
    }
    if (p->slots != t.slots) {
        int was = p->slots;
        profile_plan(p, t.slots, p->dynamic_pct);
        s->prof.replanned = true;
        if (cfg->log)
            fprintf(cfg->log,
                    "strata: %s was planned for %d expert slots, this run has %d: planned again "
                    "from its counts (%d frozen, %d%% dynamic)\n",
                    cfg->profile, was, t.slots, p->n_frozen, p->dynamic_pct);
    }
    rc = strata_restore_place(s, p, t.slots);
    if (rc) {
        profile_free(p);
        free(p);
        return rc;
    }
    s->profile = p;
    if (cfg->log)
        fprintf(cfg->log,
                "strata: %s: %d experts placed into %d slots in %.2f s (%d of them frozen); they "
                "took %.1f%% of the warmup's expert choices (%d texts, %llu tokens)\n",
                cfg->profile, s->prof.placed, t.slots, s->prof.seconds, s->prof.n_frozen,
                100 * s->prof.coverage, p->n_texts, (unsigned long long)p->n_tokens);
    return 0;
}

void strata_restore_free(struct strata *s)
{
    if (s->profile) {
        profile_free(s->profile);
        free(s->profile);
        s->profile = NULL;
    }
}

void strata_profile_status(const struct strata *s, struct strata_profile_status *out)
{
    *out = s->prof;
}

int strata_probe_run(struct strata *s, const int32_t *prompt, int n_prompt, int32_t *out,
                     int n_out)
{
    struct strata_stream *st = NULL;
    int32_t tok = -1;
    int rc = strata_stream_open(s, n_prompt + n_out + 1, &st);

    /* the automatic placement holds still on GPU kernels (copies): the probe's class */
    if (!rc && s->cuda)
        rc = backend_cuda_auto_hold(s->core, true);
    rc = rc ? rc : strata_eval_argmax(st, prompt, n_prompt, &tok);
    for (int i = 0; i < n_out && !rc; i++) {
        out[i] = tok;
        if (i + 1 < n_out)
            rc = strata_eval_argmax(st, &tok, 1, &tok);
    }
    if (s->cuda) {
        int hrc = backend_cuda_auto_hold(s->core, false);
        rc = rc ? rc : hrc;
    }
    strata_stream_close(st);
    return rc;
}

int strata_profile_probe(struct strata *s, struct strata_probe_report *r)
{
    const struct profile *p = s->profile;
    const char *mode = strata_probe_mode(s);
    int32_t out[PROFILE_PROBE_MAX];

    memset(r, 0, sizeof(*r));
    r->diff_at = -1;
    if (!p)
        return err_set(-ENOENT, "no profile was restored");
    if (!p->n_probe_prompt || !p->n_probe_out) {
        snprintf(r->why, sizeof(r->why), "the profile holds no probe");
        return 0;
    }
    if (strcmp(mode, p->probe_mode)) {
        snprintf(r->why, sizeof(r->why), "its probe was recorded on %s, this run is %s",
                 p->probe_mode, mode);
        return 0;
    }
    int rc = strata_probe_run(s, p->probe_prompt, p->n_probe_prompt, out, p->n_probe_out);
    if (rc)
        return rc;
    r->compared = true;
    r->exact = !strcmp(mode, "cuda") || !strcmp(mode, "cpu");
    r->n = p->n_probe_out;
    for (int i = 0; i < r->n && r->diff_at < 0; i++)
        if (out[i] != p->probe_out[i])
            r->diff_at = i;
    r->match = r->diff_at < 0;
    backend_cuda_reset_stats(s->core);
    return 0;
}
