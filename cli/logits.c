/* strata logits: evaluates a prompt and writes the last position's logits, optionally followed
 * by a greedy continuation, so that another implementation (tests/hf/) can compare them.
 *
 * OUT holds (1 + N) blocks of n_vocab float32 (little-endian, as the machine stores them):
 * block 0 = the logits after the prompt; block i = the logits after greedy token i was fed
 * back. Greedy token i + 1 is the argmax (lowest id on ties) of block i.
 *
 * The device and placement flags are strata run's (run_opts.h), so the same prompt's raw
 * logits can be compared across placements (all resident, the expert cache, static, hybrid).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "errors.h"
#include "run_opts.h"
#include "strata.h"
#include "strata_internal.h"

struct logits_opts {
    const char *model;  /* -m */
    const char *prompt; /* -p */
    const char *ids;    /* --ids */
    const char *out;    /* -o */
    int n_greedy;       /* --greedy */
    bool one_by_one;    /* --decode-one-by-one */
    /* -t, --device and the placement flags, as strata run has them (device default cpu) */
    struct run_opts place;
};

static void logits_usage(FILE *out)
{
    fprintf(out,
            "usage: strata logits [-m FILE] (-p TEXT | --ids 1,2,3) [options]\n\n"
            "Evaluates the prompt (special tokens parsed, BOS as the vocabulary says, no chat\n"
            "template) and prints the last position's logits summary; with -o writes them as\n"
            "raw float32. With --greedy N it then feeds back N argmax tokens, printing\n"
            "\"greedy: id id ...\" and appending the logits after each one: OUT holds 1 + N\n"
            "blocks of n_vocab floats.\n\n"
            "options:\n"
            "  -m, --model FILE       GGUF model (default: the shipped default model,\n"
            "                         " STRATA_DEFAULT_MODEL ")\n"
            "  -p, --prompt TEXT      prompt text\n"
            "      --ids LIST         prompt token ids, comma-separated (instead of -p)\n"
            "      --greedy N         greedy tokens to generate after the prompt (default 0)\n"
            "  -o, --output FILE      write the logits there (default: summary only)\n"
            "  -t, --threads N        CPU threads (default: all cores)\n"
            "      --device auto|cpu|cuda  backend (default cpu; auto: cuda when a GPU is\n"
            "                         present, under a budget of 90%% of its free memory when\n"
            "                         the model does not fit)\n"
            "      --vram-budget SIZE cap strata's GPU memory (e.g. 8G, 7.5GiB; implies --device\n"
            "                         cuda): experts live in pinned host memory and are cached\n"
            "                         in VRAM slots\n"
            "      --residency copy|zerocopy|gpu  how decode serves expert-cache misses:\n"
            "                         copied into slots, read in place, or looked up and\n"
            "                         copied by the GPU itself (default copy)\n"
            "      --placement auto|stream|hybrid|static|static:N  experts cached under\n"
            "                         --vram-budget (stream, the default here; auto: strata\n"
            "                         run's, modes switched as timed), the cache with its\n"
            "                         misses split between PCIe and the CPU (hybrid), or the\n"
            "                         first N layers' experts on the CPU and the rest resident\n"
            "                         (static:N; static = the smallest N fitting the budget);\n"
            "                         implies --device cuda unless --device is given\n"
            "      --prefetch         stream the experts the next layer's router predicts\n"
            "      --prefetch-depth N  the same for the next N layers (1-4)\n"
            "      --graph            replay decode steps from a CUDA graph (all resident, or\n"
            "                         --residency zerocopy|gpu)\n"
            "      --streaming dma|kernel  misses copied by DMA per piece (default) or by one\n"
            "                         gather kernel per batch\n"
            "      --decode-one-by-one  feed the prompt one token per forward pass (the decode\n"
            "                         path) instead of one batched prefill\n"
            "  -h, --help             this text\n");
}

static int logits_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int logits_usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "strata logits: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(strata logits --help lists the options)\n");
    va_end(ap);
    return 2;
}

/* Parses "1,2,3" into a malloc'd array; -EINVAL for anything else. */
static int logits_parse_ids(const char *s, int32_t **ids, int *n)
{
    int cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    int32_t *v = malloc(sizeof(*v) * (size_t)cap);
    int k = 0;
    if (!v)
        return -ENOMEM;
    while (*s) {
        char piece[24];
        size_t len = strcspn(s, ",");
        long long x;
        if (len >= sizeof(piece) || (memcpy(piece, s, len), piece[len] = '\0',
                                     !args_parse_int(piece, 0, INT32_MAX, &x))) {
            free(v);
            return -EINVAL;
        }
        v[k++] = (int32_t)x;
        s += len + (s[len] == ',');
    }
    if (k == 0) {
        free(v);
        return -EINVAL;
    }
    *ids = v;
    *n = k;
    return 0;
}

static int logits_prompt(const struct logits_opts *o, const struct strata *st, int32_t **ids,
                         int *n)
{
    struct strata_model_info mi;

    strata_model_info(st, &mi);
    if (o->ids) {
        if (logits_parse_ids(o->ids, ids, n))
            return logits_usage_error("--ids expects comma-separated non-negative integers");
    } else {
        size_t len = strlen(o->prompt);
        if (!mi.has_tokenizer) {
            fprintf(stderr, "strata logits: %s has no tokenizer; use --ids\n", o->model);
            return 1;
        }
        *ids = malloc(sizeof(int32_t) * (len + 4));
        if (!*ids)
            return 1;
        /* byte-level BPE never yields more ids than bytes (+ BOS/EOS) */
        int rc = strata_tokenize(st, o->prompt, len,
                                 STRATA_TOKENIZE_SPECIAL | STRATA_TOKENIZE_ADD_BOS, *ids,
                                 (int)(len + 4));
        if (rc < 0)
            return cli_fail("tokenizing the prompt");
        *n = rc;
    }
    if (*n == 0) {
        fprintf(stderr, "strata logits: the prompt is empty\n");
        return 2;
    }
    for (int i = 0; i < *n; i++) {
        if ((uint32_t)(*ids)[i] >= mi.n_vocab) {
            fprintf(stderr, "strata logits: token id %d is outside the vocabulary (%u)\n",
                    (*ids)[i], mi.n_vocab);
            return 2;
        }
    }
    return 0;
}

/* Index of the largest value (lowest on ties); counts non-finite values in *bad. */
static int32_t logits_argmax(const float *x, uint32_t n, uint32_t *bad)
{
    int32_t best = 0;
    *bad = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            (*bad)++;
        else if (x[i] > x[best] || !isfinite(x[best]))
            best = (int32_t)i;
    }
    return best;
}

static void logits_summary(const float *x, uint32_t n)
{
    uint32_t bad;
    int32_t am = logits_argmax(x, n, &bad);
    double sum = 0, sq = 0;
    float lo = INFINITY;
    for (uint32_t i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            continue;
        sum += x[i];
        sq += (double)x[i] * x[i];
        lo = x[i] < lo ? x[i] : lo;
    }
    printf("n_vocab: %u\nlogits: argmax %d (%.6g), min %.6g, mean %.6g, rms %.6g, "
           "non-finite %u\n",
           n, am, x[am], lo, sum / n, sqrt(sq / n), bad);
}

/* Evaluates ids (batched or one by one) into logits. */
static int logits_eval(struct strata_stream *s, const int32_t *ids, int n, bool one_by_one,
                       float *logits)
{
    if (!one_by_one)
        return strata_eval(s, ids, n, logits);
    for (int i = 0; i < n; i++) {
        int rc = strata_eval(s, ids + i, 1, i == n - 1 ? logits : NULL);
        if (rc)
            return rc;
    }
    return 0;
}

static int logits_run(const struct logits_opts *o, struct strata *st)
{
    struct strata_model_info mi;
    struct strata_stream *s = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    FILE *out = NULL;
    uint32_t nv, bad = 0;
    int n = 0, rc;

    strata_model_info(st, &mi);
    nv = mi.n_vocab;
    rc = logits_prompt(o, st, &ids, &n);
    if (rc)
        goto out;
    printf("ids:");
    for (int i = 0; i < n; i++)
        printf(" %d", ids[i]);
    printf("\n");
    logits = malloc(sizeof(float) * nv);
    if (!logits) {
        rc = 1;
        goto out;
    }
    if (strata_start(st) || strata_stream_open(st, n + o->n_greedy + 1, &s)) {
        rc = cli_fail("starting the engine");
        goto out;
    }
    if (o->out && !(out = fopen(o->out, "wb"))) {
        fprintf(stderr, "strata logits: %s: %s\n", o->out, strerror(errno));
        rc = 1;
        goto out;
    }
    if (logits_eval(s, ids, n, o->one_by_one, logits)) {
        rc = cli_fail("evaluating the prompt");
        goto out;
    }
    logits_summary(logits, nv);
    if (o->n_greedy > 0)
        printf("greedy:");
    for (int i = 0;; i++) {
        uint32_t nb;
        if (out && fwrite(logits, sizeof(float), nv, out) != nv) {
            fprintf(stderr, "strata logits: %s: write failed\n", o->out);
            rc = 1;
            goto out;
        }
        int32_t next = logits_argmax(logits, nv, &nb);
        bad += nb;
        if (i == o->n_greedy)
            break;
        printf(" %d", next);
        fflush(stdout);
        if (strata_eval(s, &next, 1, logits)) {
            rc = cli_fail("decoding");
            goto out;
        }
    }
    if (o->n_greedy > 0)
        printf("\n");
    if (bad) {
        fprintf(stderr, "strata logits: %u non-finite logits\n", bad);
        rc = 1;
    }
out:
    if (out && fclose(out) != 0 && !rc) {
        fprintf(stderr, "strata logits: %s: write failed\n", o->out);
        rc = 1;
    }
    strata_stream_close(s);
    free(logits);
    free(ids);
    return rc;
}

int cmd_logits(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"prompt", required_argument, NULL, 'p'},
        {"ids", required_argument, NULL, 'i'},
        {"greedy", required_argument, NULL, 'g'},
        {"output", required_argument, NULL, 'o'},
        {"threads", required_argument, NULL, 't'},
        {"decode-one-by-one", no_argument, NULL, 'd'},
        {"device", required_argument, NULL, 'D'},
        {"vram-budget", required_argument, NULL, 'V'},
        {"residency", required_argument, NULL, 'R'},
        {"placement", required_argument, NULL, 'P'},
        {"prefetch", no_argument, NULL, 'F'},
        {"prefetch-depth", required_argument, NULL, 'X'},
        {"graph", no_argument, NULL, 'G'},
        {"streaming", required_argument, NULL, 'S'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct logits_opts o = {0};
    struct run_opts *po = &o.place;
    struct strata_config cfg;
    struct strata *st = NULL;
    int c, mode;

    run_opts_init(po);
    po->device = "cpu";
    po->stream = true; /* logits compare placements: one way unless --placement auto */

    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:o:t:h", opts, NULL)) != -1) {
        if (!po->cuda_flag && c > 0 && strchr("RPFGSX", c)) /* the options only CUDA takes */
            po->cuda_flag = c == 'R'   ? "--residency"
                            : c == 'P' ? "--placement"
                            : c == 'F' ? "--prefetch"
                            : c == 'G' ? "--graph"
                            : c == 'X' ? "--prefetch-depth"
                                       : "--streaming";
        switch (c) {
        case 'm':
            o.model = optarg;
            break;
        case 'p':
            o.prompt = optarg;
            break;
        case 'i':
            o.ids = optarg;
            break;
        case 'o':
            o.out = optarg;
            break;
        case 'd':
            o.one_by_one = true;
            break;
        case 'D':
            if (strcmp(optarg, "auto") && strcmp(optarg, "cpu") && strcmp(optarg, "cuda"))
                return logits_usage_error("--device must be auto, cpu or cuda, not '%s'",
                                          optarg);
            po->device = optarg;
            po->device_set = true;
            break;
        case 'V':
            if (args_size("logits", "--vram-budget", optarg, 1, UINT64_MAX, &po->vram_budget))
                return 2;
            break;
        case 'R':
            if (run_opts_residency(optarg, "logits", &mode))
                return 2;
            po->residency = optarg;
            po->residency_set = true;
            break;
        case 'P':
            if (run_opts_placement(optarg, "logits", &po->cpu_moe_layers, &po->hybrid, &po->stream))
                return 2;
            if (!po->device_set)
                po->device = "cuda";
            break;
        case 'X':
            if (args_i32("logits", "--prefetch-depth", optarg, 1, 4, &po->prefetch_depth))
                return 2;
            po->prefetch = true;
            break;
        case 'F':
            po->prefetch = true;
            break;
        case 'G':
            po->graph = true;
            break;
        case 'S':
            if (strcmp(optarg, "dma") && strcmp(optarg, "kernel"))
                return logits_usage_error("--streaming must be dma or kernel, not '%s'", optarg);
            po->gather = !strcmp(optarg, "kernel");
            break;
        case 'g':
            if (args_i32("logits", "--greedy", optarg, 0, 1 << 20, &o.n_greedy))
                return 2;
            break;
        case 't':
            if (args_threads("logits", "--threads", optarg, 1, ARGS_MAX_THREADS, &po->n_threads))
                return 2;
            break;
        case 'h':
            logits_usage(stdout);
            return 0;
        default:
            return logits_usage_error("bad option");
        }
    }
    if (optind != argc)
        return logits_usage_error("unexpected argument '%s'", argv[optind]);
    if (!o.prompt == !o.ids)
        return logits_usage_error("give exactly one of -p TEXT and --ids LIST");
    if (run_opts_model("logits", &o.model))
        return 1;
    if (run_opts_check(po, "logits"))
        return 2;
    run_opts_config(po, o.model, &cfg);
    if (strata_load(&cfg, &st))
        return cli_open_fail();
    int rc = logits_run(&o, st);
    strata_close(st);
    return rc;
}
