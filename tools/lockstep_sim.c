/* lockstep_sim: the expert cache's hit rate when N streams decode in lockstep, on the CPU.
 *
 * A lockstep step runs every layer once for N tokens, so a layer's lookups in one step are the
 * union of the N tokens' top-k choices. The trace is S streams of T tokens each, either drawn
 * (--synthetic: per layer a Zipf popularity over a random order of the experts, each token k
 * distinct experts drawn by weight; fixed seeds) or recorded from a model run on the CPU
 * (-m: each text file given is one stream, its first T tokens evaluated with a route observer).
 * For N dividing S, the streams are split into S / N groups that decode one after the other,
 * so every N replays the same tokens; each group's steps go through cachesim_step at every pool
 * size. Printed per N and pool: the hit rate over distinct (layer, expert) per step, misses per
 * layer call, and the hit rate of a static oracle holding each layer's share of slots filled
 * with the layer's most often used experts of the whole replay (what capacity explains).
 *
 *   lockstep_sim --synthetic [--layers 48] [--zipf 1.0] [--streams 16] [--tokens 256]
 *   lockstep_sim -m models/strata-default.gguf [--save FILE] TEXT...   (one stream per text)
 *   lockstep_sim --load FILE                                           (a saved trace)
 * Common: --fractions 0.333,0.1 (pool sizes as shares of all experts), --seed N.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cachesim.h"
#include "rng.h"
#include "strata.h"

#define LS_MAX_POOLS 4

struct ls_trace {
    int n_layer, n_expert, k, n_streams, n_tok;
    int32_t *ids; /* (n_streams, n_tok, n_layer, k) */
};

struct ls_opts {
    const char *model, *save, *load;
    int synthetic, n_layer, n_streams, n_tok, streams_set;
    double zipf;
    uint64_t seed;
    double frac[LS_MAX_POOLS];
    int n_frac;
};

static int32_t *ls_tok(const struct ls_trace *tr, int stream, int t)
{
    return tr->ids + ((size_t)stream * tr->n_tok + t) * tr->n_layer * tr->k;
}

/* Zipf(alpha) popularity per layer over a random permutation; k distinct draws per token. */
static int ls_synthetic(const struct ls_opts *o, struct ls_trace *tr)
{
    *tr = (struct ls_trace){.n_layer = o->n_layer, .n_expert = 128, .k = 8,
                            .n_streams = o->n_streams, .n_tok = o->n_tok};
    size_t n = (size_t)tr->n_streams * tr->n_tok * tr->n_layer * tr->k;
    double *w = malloc(sizeof(double) * (size_t)tr->n_layer * tr->n_expert);
    tr->ids = malloc(sizeof(int32_t) * n);
    if (!w || !tr->ids) {
        free(w);
        return -ENOMEM;
    }
    struct rng r;
    rng_seed(&r, o->seed, 0);
    for (int l = 0; l < tr->n_layer; l++) {
        double *wl = w + (size_t)l * tr->n_expert;
        int perm[128];
        for (int e = 0; e < tr->n_expert; e++)
            perm[e] = e;
        for (int e = tr->n_expert - 1; e > 0; e--) {
            int j = (int)rng_below(&r, (uint32_t)e + 1), x = perm[e];
            perm[e] = perm[j];
            perm[j] = x;
        }
        for (int i = 0; i < tr->n_expert; i++)
            wl[perm[i]] = 1.0 / pow(i + 1.0, o->zipf);
    }
    for (int s = 0; s < tr->n_streams; s++) {
        rng_seed(&r, o->seed, 1 + (uint64_t)s);
        for (int t = 0; t < tr->n_tok; t++) {
            int32_t *tok = ls_tok(tr, s, t);
            for (int l = 0; l < tr->n_layer; l++) {
                const double *wl = w + (size_t)l * tr->n_expert;
                double total = 0;
                for (int e = 0; e < tr->n_expert; e++)
                    total += wl[e];
                unsigned char taken[128] = {0};
                for (int j = 0; j < tr->k; j++) {
                    double u = rng_f32(&r) * total, acc = 0;
                    int e = 0;
                    for (; e < tr->n_expert - 1; e++) {
                        if (taken[e])
                            continue;
                        acc += wl[e];
                        if (u < acc)
                            break;
                    }
                    while (taken[e]) /* rounding at the end of the range */
                        e = (e + tr->n_expert - 1) % tr->n_expert;
                    taken[e] = 1;
                    total -= wl[e];
                    tok[l * tr->k + j] = e;
                }
            }
        }
    }
    free(w);
    return 0;
}

struct ls_rec {
    struct ls_trace *tr;
    int stream;
};

static void ls_observe(void *arg, const struct strata_route_event *ev)
{
    struct ls_rec *c = arg;
    for (int t = 0; t < ev->n_tok; t++) {
        int pos = ev->pos0 + t;
        if (pos < c->tr->n_tok && ev->k == c->tr->k)
            memcpy(ls_tok(c->tr, c->stream, pos) + (size_t)ev->layer * ev->k,
                   ev->ids + (size_t)t * ev->k, sizeof(int32_t) * (size_t)ev->k);
    }
}

static char *ls_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n)) && fread(buf, 1, (size_t)n, f) == (size_t)n) {
        *len = (size_t)n;
    } else {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

/* One stream per text whose first n_tok tokens exist; the others are skipped (said). */
static int ls_record(const struct ls_opts *o, char **texts, int n_texts, struct ls_trace *tr)
{
    struct strata_config cfg;
    struct strata *st = NULL;
    struct strata_stream *ss = NULL;
    struct strata_model_info mi;
    struct ls_rec rec = {.tr = tr};
    int32_t *tok = NULL;
    int rc;

    strata_config_init(&cfg);
    cfg.model_path = o->model;
    cfg.device = STRATA_DEVICE_CPU;
    cfg.route_observer = ls_observe;
    cfg.route_ctx = &rec;
    if ((rc = strata_open(&cfg, &st))) {
        fprintf(stderr, "lockstep_sim: %s\n", strata_error());
        return rc;
    }
    strata_model_info(st, &mi);
    *tr = (struct ls_trace){.n_layer = (int)mi.n_layer, .n_expert = (int)mi.n_expert,
                            .k = (int)mi.n_expert_used, .n_tok = o->n_tok};
    tr->ids = malloc(sizeof(int32_t) * (size_t)n_texts * o->n_tok * tr->n_layer * tr->k);
    tok = malloc(sizeof(int32_t) * (size_t)(o->n_tok + 1));
    if (!tr->ids || !tok || (rc = strata_stream_open(st, o->n_tok + 1, &ss))) {
        rc = rc ? rc : -ENOMEM;
        goto out;
    }
    for (int i = 0; i < n_texts && tr->n_streams < o->n_streams; i++) {
        size_t len = 0;
        char *text = ls_read_file(texts[i], &len);
        int n = text ? strata_tokenize(st, text, len, 0, tok, o->n_tok + 1) : -ENOENT;
        free(text);
        if (n < o->n_tok) {
            fprintf(stderr, "lockstep_sim: %s: %d tokens, need %d: skipped\n", texts[i], n,
                    o->n_tok);
            continue;
        }
        rec.stream = tr->n_streams;
        strata_stream_truncate(ss, 0);
        if ((rc = strata_eval(ss, tok, o->n_tok, NULL))) {
            fprintf(stderr, "lockstep_sim: %s: %s\n", texts[i], strata_error());
            goto out;
        }
        tr->n_streams++;
    }
out:
    free(tok);
    strata_stream_close(ss);
    strata_close(st);
    return rc;
}

static int ls_save(const char *path, const struct ls_trace *tr)
{
    FILE *f = fopen(path, "wb");
    int32_t h[5] = {tr->n_layer, tr->n_expert, tr->k, tr->n_streams, tr->n_tok};
    size_t n = (size_t)tr->n_streams * tr->n_tok * tr->n_layer * tr->k;
    int ok = f && fwrite(h, sizeof(h), 1, f) == 1 && fwrite(tr->ids, sizeof(int32_t), n, f) == n;
    if (f && fclose(f))
        ok = 0;
    return ok ? 0 : -EIO;
}

static int ls_load(const char *path, struct ls_trace *tr)
{
    FILE *f = fopen(path, "rb");
    int32_t h[5];
    int rc = -EIO;
    if (!f)
        return -ENOENT;
    if (fread(h, sizeof(h), 1, f) == 1 && h[0] > 0 && h[0] <= 1024 && h[1] > 0 && h[1] <= 4096 &&
        h[2] > 0 && h[2] <= h[1] && h[3] > 0 && h[3] <= 1024 && h[4] > 0 && h[4] <= 1 << 20) {
        *tr = (struct ls_trace){h[0], h[1], h[2], h[3], h[4], NULL};
        size_t n = (size_t)h[3] * h[4] * h[0] * h[2];
        tr->ids = malloc(sizeof(int32_t) * n);
        rc = tr->ids && fread(tr->ids, sizeof(int32_t), n, f) == n ? 0 : -EIO;
    }
    fclose(f);
    return rc;
}

/* The static oracle at this N: each layer's share of slots holding its experts used in the
 * most steps; its hits over the replay's distinct lookups. */
static double ls_oracle(const struct ls_trace *tr, int n_par, int slots)
{
    size_t keys = (size_t)tr->n_layer * tr->n_expert;
    uint64_t *cnt = calloc(keys, sizeof(*cnt)), total = 0, hit = 0;
    uint32_t *seen = calloc(keys, sizeof(*seen)), stamp = 0;
    int share = slots / tr->n_layer;
    if (!cnt || !seen) {
        free(cnt);
        free(seen);
        return -1;
    }
    for (int g = 0; g < tr->n_streams / n_par; g++)
        for (int t = 0; t < tr->n_tok; t++, stamp++)
            for (int s = g * n_par; s < (g + 1) * n_par; s++)
                for (int l = 0; l < tr->n_layer; l++)
                    for (int j = 0; j < tr->k; j++) {
                        size_t key = (size_t)l * tr->n_expert + ls_tok(tr, s, t)[l * tr->k + j];
                        if (seen[key] != stamp + 1) {
                            seen[key] = stamp + 1;
                            cnt[key]++;
                            total++;
                        }
                    }
    for (int l = 0; l < tr->n_layer; l++) {
        uint64_t *c = cnt + (size_t)l * tr->n_expert;
        for (int i = 0; i < share && i < tr->n_expert; i++) { /* selection of the largest */
            int best = 0;
            for (int e = 1; e < tr->n_expert; e++)
                best = c[e] > c[best] ? e : best;
            hit += c[best];
            c[best] = 0;
        }
    }
    free(cnt);
    free(seen);
    return total ? (double)hit / (double)total : 0;
}

static int ls_replay(const struct ls_opts *o, const struct ls_trace *tr)
{
    static const int ns[] = {1, 2, 4, 8, 16, 32};
    size_t per_tok = (size_t)tr->n_layer * tr->k;
    int32_t *buf = malloc(sizeof(int32_t) * per_tok * (size_t)tr->n_streams);
    if (!buf)
        return -ENOMEM;
    printf("trace: %d streams x %d tokens, %d layers, %d experts, top-%d\n", tr->n_streams,
           tr->n_tok, tr->n_layer, tr->n_expert, tr->k);
    printf("%4s %8s %6s %9s %9s %11s %9s\n", "N", "pool", "slots", "per-layer", "hit rate",
           "miss/call", "oracle");
    for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
        int n_par = ns[ni];
        struct cachesim *sim = NULL;
        if (n_par > tr->n_streams || tr->n_streams % n_par)
            continue;
        int rc = cachesim_open(tr->n_layer, tr->n_expert, tr->k, o->frac, o->n_frac, &sim);
        if (rc) {
            free(buf);
            return rc;
        }
        for (int g = 0; g < tr->n_streams / n_par; g++)
            for (int t = 0; t < tr->n_tok; t++) {
                for (int i = 0; i < n_par; i++)
                    memcpy(buf + i * per_tok, ls_tok(tr, g * n_par + i, t),
                           sizeof(int32_t) * per_tok);
                cachesim_step(sim, buf, n_par);
            }
        double calls = (double)tr->n_streams / n_par * tr->n_tok * tr->n_layer;
        for (int i = 0; i < cachesim_count(sim); i++) {
            int slots = cachesim_slots(sim, i);
            printf("%4d %7.1f%% %6d %9.1f %8.1f%% %11.2f %8.1f%%\n", n_par,
                   100 * cachesim_fraction(sim, i), slots, (double)slots / tr->n_layer,
                   100 * cachesim_hit_rate(sim, i), cachesim_misses(sim, i) / calls,
                   100 * ls_oracle(tr, n_par, slots));
        }
        cachesim_close(sim);
    }
    free(buf);
    return 0;
}

static int ls_parse(int argc, char **argv, struct ls_opts *o, char ***texts, int *n_texts)
{
    *o = (struct ls_opts){.n_layer = 48, .n_streams = 16, .n_tok = 256, .zipf = 1.0,
                          .seed = 1, .frac = {1.0 / 3, 0.1}, .n_frac = 2};
    *texts = argv + argc;
    *n_texts = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--synthetic")) {
            o->synthetic = 1;
            continue;
        }
        if (a[0] != '-') {
            *texts = argv + i;
            *n_texts = argc - i;
            break;
        }
        if (!v) {
            fprintf(stderr, "lockstep_sim: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "-m"))
            o->model = v;
        else if (!strcmp(a, "--save"))
            o->save = v;
        else if (!strcmp(a, "--load"))
            o->load = v;
        else if (!strcmp(a, "--layers"))
            o->n_layer = atoi(v);
        else if (!strcmp(a, "--streams"))
            o->n_streams = atoi(v), o->streams_set = 1;
        else if (!strcmp(a, "--tokens"))
            o->n_tok = atoi(v);
        else if (!strcmp(a, "--zipf"))
            o->zipf = atof(v);
        else if (!strcmp(a, "--seed"))
            o->seed = strtoull(v, NULL, 0);
        else if (!strcmp(a, "--fractions")) {
            char *end = (char *)v;
            for (o->n_frac = 0; o->n_frac < LS_MAX_POOLS && *end;) {
                o->frac[o->n_frac++] = strtod(end, &end);
                if (*end == ',')
                    end++;
            }
        } else {
            fprintf(stderr, "lockstep_sim: unknown option %s\n", a);
            return 2;
        }
    }
    if (o->n_layer < 1 || o->n_streams < 1 || o->n_tok < 1 || o->n_frac < 1 ||
        (!o->synthetic && !o->load && !(o->model && *n_texts))) {
        fprintf(stderr, "usage: see the comment at the top of tools/lockstep_sim.c\n");
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct ls_opts o;
    struct ls_trace tr = {0};
    char **texts;
    int n_texts, rc = ls_parse(argc, argv, &o, &texts, &n_texts);
    if (rc)
        return rc;
    rc = o.load ? ls_load(o.load, &tr)
                : o.synthetic ? ls_synthetic(&o, &tr) : ls_record(&o, texts, n_texts, &tr);
    if (!rc && o.save)
        rc = ls_save(o.save, &tr);
    if (!rc && o.load && o.streams_set && o.n_streams < tr.n_streams)
        tr.n_streams = o.n_streams; /* the first n_streams of the saved ones */
    if (!rc)
        rc = ls_replay(&o, &tr);
    if (rc)
        fprintf(stderr, "lockstep_sim: failed: %s\n", strerror(-rc));
    free(tr.ids);
    return rc ? 1 : 0;
}
