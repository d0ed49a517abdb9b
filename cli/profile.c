/* strata profile: residency profiles (profiles/profile.h).
 *   warmup  runs a workload (texts: prefill, then a few greedy decode steps each) and records
 *           per-(layer, expert) counts and recency, plans the frozen set for the run's expert
 *           cache, records the probe, and writes the profile atomically
 *   show    summarises a profile per layer, and draws its counts as a heat map (gnuplot)
 * run, chat and bench restore one with --profile. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "clock.h"
#include "cli.h"
#include "errors.h"
#include "model.h"
#include "outfile.h"
#include "plan_sim.h"
#include "profile.h"
#include "quant.h"
#include "run_opts.h"
#include "strata.h"
#include "strata_internal.h"
#include "texts.h"

#define PROBE_PROMPT_TOKENS 32
#define PROBE_OUT_TOKENS 16

struct warmup_opts {
    const char *prompts, *out, *separator;
    int max_tokens, decode, dynamic_pct;
};

static volatile sig_atomic_t warmup_interrupted;

static void warmup_on_sigint(int sig)
{
    (void)sig;
    warmup_interrupted = 1;
}

static void warmup_usage(void)
{
    printf("usage: strata profile warmup [-m FILE] --prompts FILE -o NAME.profile [options]\n\n"
           "Runs a workload and records which experts each layer's router chooses: every text\n"
           "of the prompts file (one per line, or with --separator texts of many lines) is\n"
           "evaluated, then decoded greedily for a few tokens, each on a fresh context. Then it\n"
           "plans the frozen set for this run's expert cache (the most chosen experts hold\n"
           "slots for good, a share of the slots stays dynamic), records a probe (a prompt and\n"
           "its greedy tokens, for the check after a restore) and writes the profile. Restore\n"
           "it with strata run/chat/bench --profile NAME.profile; another --vram-budget plans\n"
           "again from the counts. Ctrl-C stops after the current text and writes what was\n"
           "counted.\n\n"
           "workload:\n"
           "      --prompts FILE      texts, one per line; - reads standard input (required)\n"
           "      --separator LINE    texts span several lines and end at a line equal to LINE\n"
           "      --max-tokens N      prompt tokens per text at most (default 512)\n"
           "      --decode N          greedy decode steps after each text (default 16)\n"
           "  -o, --output FILE       the profile to write (required)\n"
           "      --dynamic PCT       share of the slots left dynamic (default: the share that\n"
           "                          does best when the odd texts are replayed through the\n"
           "                          cache seeded and frozen from the even ones)\n\n"
           "model and machine (as for strata run):\n"
           "  -m, --model FILE        GGUF model (default: the shipped default model)\n"
           "  -t, --threads N, -c, --ctx-size N, -b, --batch-size N, --device auto|cpu|cuda,\n"
           "  --vram-budget SIZE, --placement stream|hybrid, --residency copy|zerocopy|gpu,\n"
           "  --streaming dma|kernel, --prefetch, --bind, --no-mmap, -v\n\n"
           "Without an expert cache (CPU, or every weight resident) only the counts are\n"
           "recorded; the run that restores the profile plans for its own cache.\n");
}

/* run_opts flags that mean something to a warmup; the others are refused. */
static bool warmup_engine_flag(const char *a, bool *takes_value)
{
    static const char with_value[] = "-m --model -t --threads --cpu-threads -c --ctx-size -b "
                                     "--batch-size --device --vram-budget --placement "
                                     "--residency --streaming --prefetch-depth --prefetch-top";
    static const char bare[] = "--prefetch --bind --no-mmap --no-mtp -v --verbose";
    return run_opts_flag_in(with_value, bare, a, takes_value);
}

/* 0, 1 (help printed) or 2 (message printed). */
static int warmup_parse(int argc, char **argv, struct warmup_opts *w, struct run_opts *o)
{
    char **rest = calloc((size_t)argc + 1, sizeof(char *));
    int n_rest = 1, rc = 0;

    *w = (struct warmup_opts){.max_tokens = 512, .decode = 16, .dynamic_pct = -1};
    run_opts_init(o);
    o->stream = true; /* the warmup counts routing: no timing of the cache's modes */
    if (!rest)
        return 2;
    rest[0] = argv[0];
    for (int i = 1; i < argc && !rc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = false;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            warmup_usage();
            rc = 1;
        } else if (warmup_engine_flag(a, &takes)) {
            rest[n_rest++] = argv[i];
            if (takes && v)
                rest[n_rest++] = argv[++i];
        } else if (!v) {
            fprintf(stderr, "strata profile warmup: %s needs a value (or is unknown; see "
                            "--help)\n", a);
            rc = 2;
        } else if (!strcmp(a, "--prompts")) {
            w->prompts = argv[++i];
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            w->out = argv[++i];
        } else if (!strcmp(a, "--separator")) {
            w->separator = argv[++i];
        } else if (!strcmp(a, "--max-tokens")) {
            rc = args_i32("profile warmup", a, argv[++i], 1, 1 << 20, &w->max_tokens);
        } else if (!strcmp(a, "--decode")) {
            rc = args_i32("profile warmup", a, argv[++i], 0, 1 << 20, &w->decode);
        } else if (!strcmp(a, "--dynamic")) {
            rc = args_i32("profile warmup", a, argv[++i], 0, 100, &w->dynamic_pct);
        } else {
            fprintf(stderr, "strata profile warmup: unknown option '%s' (see --help)\n", a);
            rc = 2;
        }
    }
    if (!rc)
        rc = run_opts_parse(o, n_rest, rest, "profile warmup");
    free(rest);
    if (rc)
        return rc;
    if (!w->prompts || !w->out) {
        fprintf(stderr, "strata profile warmup: need --prompts FILE and -o NAME.profile (see "
                        "--help)\n");
        return 2;
    }
    if (o->cpu_moe_layers) {
        fprintf(stderr, "strata profile warmup: --placement static has no expert cache to "
                        "profile (stream or hybrid)\n");
        return 2;
    }
    /* the context holds a text and its decode steps */
    if (!o->ctx_set && o->n_ctx < w->max_tokens + w->decode + 1)
        o->n_ctx = w->max_tokens + w->decode + 1;
    if (o->n_ctx < w->max_tokens + w->decode + 1) {
        fprintf(stderr, "strata profile warmup: -c %d cannot hold --max-tokens %d and --decode "
                        "%d\n", o->n_ctx, w->max_tokens, w->decode);
        return 2;
    }
    if (run_opts_model("profile warmup", &o->model))
        return 2;
    if (outfile_check_target(w->out)) {
        fprintf(stderr, "strata profile warmup: -o %s\n", err_msg());
        return 2;
    }
    return 0;
}

struct warmup_ctx {
    struct profile *p;
    struct profile_trace trace; /* every routing call, to choose the frozen share */
    bool counting;              /* off while the probe runs */
    bool trace_failed;
};

static void warmup_observe(void *arg, const struct strata_route_event *ev)
{
    struct warmup_ctx *c = arg;
    if (!c->counting)
        return;
    profile_add(c->p, ev->layer, ev->ids, ev->n_tok, ev->k);
    if (!c->trace_failed &&
        profile_trace_add(&c->trace, c->p->n_texts, ev->layer, ev->ids, ev->n_tok, ev->k))
        c->trace_failed = true;
}

/* The plan: for the run's expert cache, the frozen share that the replay of the held-back
 * texts liked best (plan_sim.h); without a cache, none. */
static int warmup_plan(struct warmup_ctx *ctx, const struct warmup_opts *w,
                       const struct strata_stats *ss)
{
    struct profile *p = ctx->p;
    struct profile_sim_report r;
    if (!ss->has_cache || w->dynamic_pct >= 0 || ctx->trace_failed) {
        profile_plan(p, ss->has_cache ? ss->slots : 0,
                     w->dynamic_pct >= 0 ? w->dynamic_pct : PROFILE_DYNAMIC_PCT);
        return 0;
    }
    if (profile_choose(p, &ctx->trace, ss->slots, &r))
        return cli_fail("planning the profile");
    fprintf(stderr, "strata: replaying the odd texts with %d slots (ranked by the even ones): "
                    "decode hit rate cold %.1f%%", r.slots, 100 * r.cold);
    for (int i = 0; i < PROFILE_SIM_SHARES; i++)
        fprintf(stderr, ", %d%% frozen %.1f%%", 100 - r.share_pct[i], 100 * r.share_hit[i]);
    fprintf(stderr, " (%llu lookups): %d%% of the slots frozen\n",
            (unsigned long long)r.lookups, 100 - r.chosen_pct);
    return 0;
}

/* The probe: the first text's first tokens and their greedy continuation, before the workload
 * (a cold cache, the plain one). 0 or 1 after the message. */
static int warmup_probe(struct strata *st, struct profile *p, const int32_t *ids, int n)
{
    p->n_probe_prompt = n < PROBE_PROMPT_TOKENS ? n : PROBE_PROMPT_TOKENS;
    memcpy(p->probe_prompt, ids, sizeof(int32_t) * (size_t)p->n_probe_prompt);
    p->n_probe_out = PROBE_OUT_TOKENS;
    snprintf(p->probe_mode, sizeof(p->probe_mode), "%s", strata_probe_mode(st));
    if (strata_probe_run(st, p->probe_prompt, p->n_probe_prompt, p->probe_out, p->n_probe_out))
        return cli_fail("the probe");
    return 0;
}

/* One text: prefill, then greedy decode steps. */
static int warmup_text(struct strata_stream *s, const int32_t *ids, int n, int decode)
{
    int32_t tok;
    strata_stream_truncate(s, 0);
    int rc = strata_eval_argmax(s, ids, n, &tok);
    for (int i = 0; i < decode && !rc && !warmup_interrupted; i++)
        rc = strata_eval_argmax(s, &tok, 1, &tok);
    return rc;
}

/* Runs every text; counts land in ctx->p. 0 or 1 after the message. */
static int warmup_run(const struct warmup_opts *w, struct strata *st, struct warmup_ctx *ctx,
                      struct texts *tx, int n_ctx)
{
    struct strata_stream *s = NULL;
    int32_t *ids = malloc(sizeof(int32_t) * ((size_t)w->max_tokens + 4));
    bool tty = isatty(STDERR_FILENO), probed = false;
    double t0 = clock_now_s(), t_shown = t0;
    const char *text;
    size_t len;
    int rc = 0;

    if (!ids || strata_stream_open(st, n_ctx, &s)) {
        free(ids);
        return cli_fail("starting the engine");
    }
    while (!rc && !warmup_interrupted && (text = texts_next(tx, &len))) {
        int n = strata_tokenize(st, text, len, 0, ids, w->max_tokens);
        if (n < 0) {
            rc = cli_fail("tokenizing a text");
            break;
        }
        n = n < w->max_tokens ? n : w->max_tokens;
        if (n == 0)
            continue;
        if (!probed) {
            probed = true;
            if ((rc = warmup_probe(st, ctx->p, ids, n)))
                break;
        }
        ctx->counting = true;
        if (warmup_text(s, ids, n, w->decode)) {
            rc = cli_fail("evaluating a text");
            break;
        }
        ctx->counting = false;
        ctx->p->n_texts++;
        ctx->p->n_tokens += (uint64_t)n + (uint64_t)w->decode;
        double now = clock_now_s();
        if (tty || now - t_shown >= 5) {
            fprintf(stderr, "%sstrata: warmup: %d texts, %" PRIu64 " tokens, %.1f tok/s%s",
                    tty ? "\r" : "", ctx->p->n_texts, ctx->p->n_tokens,
                    ctx->p->n_tokens / (now - t0), tty ? "" : "\n");
            t_shown = now;
        }
    }
    if (tty && ctx->p->n_texts)
        fputc('\n', stderr);
    strata_stream_close(s);
    free(ids);
    return rc;
}

static int profile_warmup(int argc, char **argv)
{
    struct warmup_opts w;
    struct run_opts o;
    struct strata_config cfg;
    struct strata *st = NULL;
    struct profile p = {0};
    struct warmup_ctx ctx = {.p = &p};
    struct texts tx = {0};
    struct strata_stats ss;
    int rc = warmup_parse(argc, argv, &w, &o);

    if (rc)
        return rc == 1 ? 0 : rc;
    if ((rc = texts_open("profile warmup", "--prompts", w.prompts, w.separator, &tx)))
        return rc;
    run_opts_config(&o, o.model, &cfg);
    cfg.route_observer = warmup_observe;
    cfg.route_ctx = &ctx;
    if (strata_load(&cfg, &st) || strata_start(st)) {
        rc = cli_open_fail();
        goto out;
    }
    if (!strata_model_of(st)->tok) {
        fprintf(stderr, "strata profile warmup: %s has no tokenizer\n", o.model);
        rc = 1;
        goto out;
    }
    if (profile_init(&p, strata_model_of(st))) {
        rc = cli_fail("profile");
        goto out;
    }
    struct sigaction sa = {.sa_handler = warmup_on_sigint}, old_int;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    rc = warmup_run(&w, st, &ctx, &tx, o.n_ctx);
    sigaction(SIGINT, &old_int, NULL);
    if (rc)
        goto out;
    if (p.n_texts == 0) {
        fprintf(stderr, "strata profile warmup: --prompts %s holds no text (it is empty or "
                        "blank)\n", w.prompts);
        rc = 2;
        goto out;
    }
    strata_get_stats(st, &ss);
    p.vram_budget = o.vram_budget;
    if ((rc = warmup_plan(&ctx, &w, &ss)))
        goto out;
    if (profile_write(&p, w.out)) {
        rc = cli_fail("writing the profile");
        goto out;
    }
    fprintf(stderr,
            "strata: %s: %d texts, %" PRIu64 " tokens; %s%d experts frozen of %d slots, "
            "covering %.1f%% of the expert choices\n",
            w.out, p.n_texts, p.n_tokens, ss.has_cache ? "" : "no expert cache in this run: ",
            p.n_frozen, p.slots, 100 * profile_coverage(&p, -1));
    if (warmup_interrupted) {
        fprintf(stderr, "strata profile warmup: interrupted (Ctrl-C): the profile holds the "
                        "texts counted so far\n");
        rc = 130;
    }
out:
    texts_close(&tx);
    profile_trace_free(&ctx.trace);
    profile_free(&p);
    strata_close(st);
    return rc;
}

/* ---- show --------------------------------------------------------------------------------- */

static void show_usage(void)
{
    printf("usage: strata profile show NAME.profile [--plot FILE.png]\n\n"
           "Prints what a profile holds: the model and geometry it is bound to, the warmup,\n"
           "the plan (slots, frozen, dynamic), and per layer the experts frozen and the share\n"
           "of that layer's expert choices they took. --plot draws the counts as a heat map\n"
           "(layer by expert, gnuplot; Debian: gnuplot-nox).\n");
}

static int show_plot(const struct profile *p, const char *png)
{
    char dat[] = "/tmp/strata-profile-XXXXXX";
    int fd = mkstemp(dat);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        fprintf(stderr, "strata profile show: cannot write the plot's data in /tmp\n");
        return 1;
    }
    for (int l = 0; l < p->geo.n_layer; l++) {
        for (int e = 0; e < p->geo.n_expert; e++)
            fprintf(f, "%s%" PRIu64, e ? " " : "", p->count[(size_t)l * p->geo.n_expert + e]);
        fputc('\n', f);
    }
    fclose(f);
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "gnuplot -e \"set terminal png size 1200,700; set output '%s'; "
             "set xlabel 'expert'; set ylabel 'layer'; set cblabel 'times chosen (log)'; "
             "set logscale cb; set palette rgb 21,22,23; set title '%d texts, %" PRIu64
             " tokens'; plot '%s' matrix using 1:2:(\\$3+1) with image notitle\"",
             png, p->n_texts, p->n_tokens, dat);
    int rc = system(cmd);
    unlink(dat);
    if (rc != 0) {
        fprintf(stderr, "strata profile show: gnuplot failed\n");
        return 1;
    }
    printf("plot: %s\n", png);
    return 0;
}

static int profile_show(int argc, char **argv)
{
    const char *path = NULL, *plot = NULL;
    struct profile p;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            show_usage();
            return 0;
        } else if (!strcmp(argv[i], "--plot") && i + 1 < argc) {
            plot = argv[++i];
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "strata profile show: unexpected '%s' (see --help)\n", argv[i]);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        fprintf(stderr, "strata profile show: which profile? (see --help)\n");
        return 2;
    }
    if (plot && !texts_have_gnuplot()) {
        fprintf(stderr, "strata profile show: --plot needs gnuplot, which is not on PATH "
                        "(Debian/Ubuntu: apt-get install gnuplot-nox)\n");
        return 2;
    }
    if (profile_read(path, &p))
        return cli_fail("reading the profile");
    const struct profile_geometry *g = &p.geo;
    printf("%s: strata profile version %d\n", path, PROFILE_VERSION);
    printf("model: %s, identity %016" PRIx64 "; %d layers, %d experts (top %d), %.2f MiB per "
           "expert (%s, %s, %s)\n",
           p.arch, p.model_hash, g->n_layer, g->n_expert, g->n_expert_used,
           g->expert_bytes / 1048576.0, quant_type_name(g->type[0]), quant_type_name(g->type[1]),
           quant_type_name(g->type[2]));
    printf("warmup: %d texts, %" PRIu64 " tokens; probe: %d + %d tokens on %s\n", p.n_texts,
           p.n_tokens, p.n_probe_prompt, p.n_probe_out, p.probe_mode);
    if (p.slots)
        printf("plan: %d slots (--vram-budget %.2f GiB): %d frozen, %d dynamic (%d%%); the "
               "frozen set took %.1f%% of the expert choices\n",
               p.slots, p.vram_budget / 1073741824.0, p.n_frozen, p.slots - p.n_frozen,
               p.dynamic_pct, 100 * profile_coverage(&p, -1));
    else
        printf("plan: none (the warmup had no expert cache): a run plans for its own slots\n");
    printf("%5s %8s %10s %9s %10s  %s\n", "layer", "frozen", "choices", "coverage", "used",
           "most chosen (expert:share)");
    for (int l = 0; l < g->n_layer; l++) {
        const uint64_t *c = p.count + (size_t)l * g->n_expert;
        uint64_t all = 0;
        int nf = 0, used = 0, top[4] = {-1, -1, -1, -1};
        for (int e = 0; e < g->n_expert; e++) {
            all += c[e];
            used += c[e] > 0;
            nf += p.frozen[(size_t)l * g->n_expert + e];
            for (int j = 0; j < 4; j++) {
                if (top[j] < 0 || c[e] > c[top[j]]) {
                    memmove(top + j + 1, top + j, sizeof(int) * (size_t)(3 - j));
                    top[j] = e;
                    break;
                }
            }
        }
        printf("%5d %8d %10" PRIu64 " %8.1f%% %10d ", l, nf, all, 100 * profile_coverage(&p, l),
               used);
        for (int j = 0; j < 4 && top[j] >= 0 && all; j++)
            printf(" %d:%.1f%%", top[j], 100.0 * c[top[j]] / all);
        printf("\n");
    }
    int rc = plot ? show_plot(&p, plot) : 0;
    profile_free(&p);
    return rc;
}

int cmd_profile(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        printf("usage: strata profile warmup|show ... (strata profile warmup --help)\n\n"
               "  warmup  run a workload, record which experts it uses, plan the frozen set\n"
               "          for the expert cache and write a profile\n"
               "  show    summarise a profile (and draw it with --plot)\n");
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "warmup"))
        return profile_warmup(argc - 1, argv + 1);
    if (!strcmp(argv[1], "show"))
        return profile_show(argc - 1, argv + 1);
    fprintf(stderr, "strata profile: unknown subcommand '%s' (warmup or show)\n", argv[1]);
    return 2;
}
