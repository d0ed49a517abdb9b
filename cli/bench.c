/* strata bench: prompt processing and decode speed of one model, next to the floor set by
 * the bandwidth measured in the same run (DESIGN §2). On the CPU the floor of a decode token
 * is the bytes it must read (trunk weights, the routed experts, the output head, the KV
 * cache) over the host read bandwidth; on the GPU, over the device copy bandwidth, and under
 * a budget, the bytes each lane moves over that lane's measured bandwidth. */
#include <omp.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "backend_profile.h"
#include "budget.h"
#include "cli.h"
#include "clock.h"
#include "cpu_features.h"
#include "cuda_mem.h"
#include "disk_tier.h"
#include "errors.h"
#include "gemm.h"
#include "gguf.h"
#include "membw.h"
#include "model.h"
#include "model_arch.h"
#include "rng.h"
#include "run_opts.h"
#include "sampler.h"
#include "strata.h"
#include "strata_internal.h"
#include "topo.h"

struct bench_opts {
    const char *model;
    int n_prompt, n_gen, n_threads;
    double bw_gib; /* size of the bandwidth probe */
    int op_times;  /* --op-times: time per op */
    const char *profile;   /* --profile FILE: a residency profile restored at start */
    bool profile_freeze;   /* --profile-freeze */
    bool profile_optional; /* --profile-optional */
    int no_mmap;   /* --no-mmap: weights copied to anonymous huge pages */
    int no_mtp;    /* --no-mtp: the MTP block left unloaded */
    int cuda;      /* --device cuda */
    int bind;      /* --bind: one thread per physical core, bound */
    uint64_t vram_budget; /* --vram-budget */
    uint64_t host_budget; /* --host-budget */
    bool host_pread, host_buffered; /* --host-io pread, --host-buffered */
    bool host_ahead;                /* --host-read-ahead */
    bool no_host_tier;              /* --host-budget 0 */
    int residency;        /* --residency */
    int stats;            /* --stats */
    int prefetch;         /* --prefetch */
    int prefetch_depth;   /* --prefetch-depth N */
    int prefetch_top;     /* --prefetch-top M */
    int streams;          /* --streams N: also N streams decoding in lockstep */
    int cpu_moe_layers;   /* --placement */
    bool gather;          /* --streaming kernel */
    bool graph;           /* --graph */
    bool no_graph;        /* --no-graph */
    bool hybrid;
    bool stream;        /* --placement stream */
    bool residency_set; /* --residency was given */
    const char *stats_json;
    const char *cuda_flag;   /* the first option given that needs --device cuda, or NULL */
    bool device_cpu;         /* --device cpu was given */
    const char *prompt_file; /* -f: prompt text instead of random ids */
    int tg_greedy;           /* --tg greedy: decode feeds back the argmax */
    int draft_max;           /* --spec ngram|draft|mtp [--draft-max K]: also speculative
                              * decoding */
    const char *draft_model; /* --spec draft: -md FILE */
    const char *draft_device; /* --draft-device (default auto) */
    bool spec_ngram, spec_draft;
    bool spec_mtp;           /* --spec mtp: the model's MTP block drafts */
    int lookahead;           /* --lookahead off: STRATA_LOOKAHEAD_OFF */
    const int32_t *prompt;   /* the prompt's ids (bench_spec) */
};

static void bench_usage(void)
{
    printf("usage: strata bench [-m FILE] [options]\n\n"
           "Measures prompt processing (pp) and decode (tg) speed and prints decode as a fraction\n"
           "of its floor: bytes read per token / host read bandwidth (all processors reading)\n"
           "measured in the same run.\n\n"
           "  -m, --model FILE      GGUF model (default: the shipped default model,\n"
           "                        " STRATA_DEFAULT_MODEL ")\n"
           "  -p, --n-prompt N      prompt tokens, evaluated in one batch (default 512)\n"
           "  -n, --n-gen N         decode steps (default 128)\n"
           "  -f, --file FILE       prompt text (tokenized, cut to -p tokens; fewer tokens\n"
           "                        shorten the prompt) instead of random token ids\n"
           "      --tg random|greedy  decode input: random ids (default: with random weights\n"
           "                        greedy decoding repeats itself and so does its routing),\n"
           "                        or the argmax fed back (trained models, with -f)\n"
           "  -t, --threads N       CPU threads (default: all; on --device cpu with 6 or more\n"
           "                        processors the fastest of all, 3/4 and 1/2, timed on the\n"
           "                        first decode steps, 1/2 not where cores run one thread\n"
           "                        each and 3/4 was clearly slower; the CPU expert lane's\n"
           "                        with --device cuda; --cpu-threads is the same)\n"
           "      --bw-gib G        size of the bandwidth probe in GiB (default 2)\n"
           "      --op-times        also print the time spent in each op (pp and tg; CPU)\n"
           "      --no-mmap         copy the weights into anonymous memory on huge pages\n"
           "      --no-mtp          leave the model's multi-token-prediction block unloaded\n"
           "      --bind            bind the CPU threads one per physical core (hwloc)\n"
           "      --device cpu|cuda backend (default cpu; cuda: every weight on the GPU, and the\n"
           "                        floor is bytes per token / device copy bandwidth)\n"
           "      --host-budget SIZE|auto  CPU, CUDA with --placement static (its CPU\n"
           "                        layers) or the expert cache (copy path, hybrid): the\n"
           "                        routed experts read from the file into a host tier of\n"
           "                        SIZE (at least a layer's experts); reports its hit rate\n"
           "                        and read GB/s, the disk's bandwidth probed and learned\n"
           "                        (--host-io auto|uring|pread, --host-buffered as for\n"
           "                        strata run; --host-read-ahead: read the next layer's\n"
           "                        predicted experts while a layer computes, paced)\n"
           "      --vram-budget SIZE  cap GPU memory (implies --device cuda): experts served by\n"
           "                        the VRAM slot cache from pinned host memory; also reports\n"
           "                        hit rate and streamed GB/s of decode and of the prompt\n"
           "                        against the pinned H2D bandwidth measured in the same run\n"
           "      --residency copy|zerocopy|gpu  how decode serves cache misses: copies,\n"
           "                        reads in place, or lookups and copies by the GPU itself\n"
           "                        (giving it means --placement stream)\n"
           "      --placement auto|stream|hybrid|static|static:N  experts cached, misses\n"
           "                        served by whichever of copies, zero-copy reads (graph),\n"
           "                        hybrid and the GPU's own cache (graph) decodes fastest,\n"
           "                        timed on the first decode steps, zero-copy first and\n"
           "                        alone where it misses little (auto, the default),\n"
           "                        cached with misses\n"
           "                        served as --residency says (stream; copy unless given),\n"
           "                        the cache with misses split between PCIe and the CPU\n"
           "                        (hybrid), or the first N layers' experts on the CPU and\n"
           "                        the rest resident (static:N; static = the smallest N\n"
           "                        fitting the budget)\n"
           "      --graph           record a decode step as a CUDA graph once and replay it\n"
           "                        (all resident, or --residency zerocopy|gpu; the default\n"
           "                        with every weight resident and --placement auto, where\n"
           "                        --graph adds the --streams steps)\n"
           "      --no-graph        launch every decode step kernel by kernel\n"
           "      --streaming dma|kernel  misses copied by DMA per piece (default) or by one\n"
           "                        gather kernel per batch\n"
           "      --prefetch        stream the experts the next layer's router predicts\n"
           "      --prefetch-depth N  the same for the next N layers (1-4)\n"
           "      --prefetch-top M    copy each token's M most likely predicted experts only\n"
           "                          (default half of the k chosen; 32: all)\n"
           "      --spec ngram|draft|mtp  with --tg greedy: then generate the tg tokens again\n"
           "                        with strata_generate, without and with drafts (--draft-max\n"
           "                        K, default 8): prompt lookup, the greedy tokens of -md FILE\n"
           "                        (a small model with the same vocabulary, on --draft-device\n"
           "                        auto|cpu|cuda, default auto), or those of the model's own\n"
           "                        MTP block (mtp; the plain run goes without it); tok/s of\n"
           "                        both, acceptance, tokens per verify pass, expert bytes\n"
           "                        moved per token, the draft model's (block's) share of the\n"
           "                        time; with ngram each of plain and drafts runs three\n"
           "                        times: without, with and again without the lookahead\n"
           "                        (--lookahead in strata run --help: plain with always,\n"
           "                        drafts with drafts), the two without on either side\n"
           "      --lookahead on|off  off: plain and drafts once each\n"
           "      --streams N       then also N streams (each the prompt rotated by its index)\n"
           "                        decoding -n tokens in lockstep, one forward per step:\n"
           "                        aggregate and per-stream tok/s, hit rate and expert bytes\n"
           "                        moved per generated token (the logits of every row come\n"
           "                        back to the host each step)\n"
           "      --profile FILE    restore a residency profile (strata profile warmup) into\n"
           "                        the expert cache before the timed runs, checked by its\n"
           "                        probe; --profile-freeze pins its frozen set for good,\n"
           "                        --profile-optional goes on cold when it does not fit\n"
           "      --stats           print the expert cache's per-layer table\n"
           "      --stats-json FILE write it as JSON\n");
}

/* --bw-gib: a positive size in GiB, at most half the physical memory (the probe is allocated
 * next to the model's weights: a larger one gets processes OOM-killed). */
static int bench_parse_bw(const char *opt, const char *v, double *out)
{
    double phys = (double)args_phys_bytes(), gib = 1073741824.0;
    double max = phys > 0 ? phys / 2 / gib : 1 << 20;
    char wants[160];
    int rc = args_float("bench", opt, v, 0, 1 << 20, out);

    if (rc)
        return rc;
    if (!(*out > 0))
        return args_fail("bench", opt, v, "a positive number of GiB");
    if (*out > max) {
        snprintf(wants, sizeof(wants),
                 "a probe of at most half the physical memory (%.1f GiB / 2 = %.1f GiB)",
                 phys / gib, max);
        return args_fail("bench", opt, v, wants);
    }
    return 0;
}

static int bench_parse(int argc, char **argv, struct bench_opts *o)
{
    *o = (struct bench_opts){.n_prompt = 512, .n_gen = 128, .bw_gib = 2.0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            bench_usage();
            return 1;
        }
        if (!o->cuda_flag && run_opts_is_cuda_only(a))
            o->cuda_flag = a;
        if (!strcmp(a, "--op-times")) {
            o->op_times = 1;
            continue;
        }
        if (!strcmp(a, "--profile-freeze")) {
            o->profile_freeze = true;
            continue;
        }
        if (!strcmp(a, "--profile-optional")) {
            o->profile_optional = true;
            continue;
        }
        if (!strcmp(a, "--no-mtp")) {
            o->no_mtp = 1;
            continue;
        }
        if (!strcmp(a, "--no-mmap")) {
            o->no_mmap = 1;
            continue;
        }
        if (!strcmp(a, "--host-buffered")) {
            o->host_buffered = true;
            continue;
        }
        if (!strcmp(a, "--host-read-ahead")) {
            o->host_ahead = true;
            continue;
        }
        if (!strcmp(a, "--bind")) {
            o->bind = 1;
            continue;
        }
        if (!strcmp(a, "--stats")) {
            o->stats = 1;
            continue;
        }
        if (!strcmp(a, "--prefetch")) {
            o->prefetch = 1;
            continue;
        }
        if (!strcmp(a, "--graph")) {
            o->graph = true;
            continue;
        }
        if (!strcmp(a, "--no-graph")) {
            o->no_graph = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "strata bench: %s needs a value (see --help)\n", a);
            return 2;
        }
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            o->model = v;
        else if (!strcmp(a, "--device") && (!strcmp(v, "cpu") || !strcmp(v, "cuda"))) {
            o->cuda = !strcmp(v, "cuda");
            o->device_cpu = !o->cuda;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--n-prompt"))
            rc = args_i32("bench", a, v, 1, 1 << 20, &o->n_prompt);
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-gen"))
            rc = args_i32("bench", a, v, 1, 1 << 20, &o->n_gen);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads") || !strcmp(a, "--cpu-threads"))
            rc = args_threads("bench", a, v, 0, ARGS_MAX_THREADS, &o->n_threads);
        else if (!strcmp(a, "--bw-gib"))
            rc = bench_parse_bw(a, v, &o->bw_gib);
        else if (!strcmp(a, "--host-budget"))
            rc = !strcmp(v, "auto") ? (o->host_budget = STRATA_HOST_BUDGET_AUTO, 0)
                 : !strcmp(v, "0")  ? (o->host_budget = 0, o->no_host_tier = true, 0)
                                    : args_size("bench", a, v, 1, UINT64_MAX - 1, &o->host_budget);
        else if (!strcmp(a, "--host-io")) {
            if (strcmp(v, "auto") && strcmp(v, "uring") && strcmp(v, "pread")) {
                fprintf(stderr, "strata bench: --host-io auto, uring or pread, not '%s'\n", v);
                rc = 2;
            }
            o->host_pread = !strcmp(v, "pread");
        } else if (!strcmp(a, "--vram-budget")) {
            rc = args_size("bench", a, v, 1, UINT64_MAX, &o->vram_budget);
            o->cuda = 1;
        } else if (!strcmp(a, "--placement")) {
            if (run_opts_placement(v, "bench", &o->cpu_moe_layers, &o->hybrid, &o->stream))
                return 2;
            o->cuda = 1;
        } else if (!strcmp(a, "--streaming") && (!strcmp(v, "dma") || !strcmp(v, "kernel"))) {
            o->gather = !strcmp(v, "kernel");
        } else if (!strcmp(a, "--residency")) {
            if (run_opts_residency(v, "bench", &o->residency))
                return 2;
            o->residency_set = true;
        } else if (!strcmp(a, "--stats-json"))
            o->stats_json = v;
        else if (!strcmp(a, "--profile"))
            o->profile = v;
        else if (!strcmp(a, "--streams"))
            rc = args_i32("bench", a, v, 1, 256, &o->streams);
        else if (!strcmp(a, "--prefetch-top")) {
            rc = args_i32("bench", a, v, 1, 32, &o->prefetch_top);
            o->prefetch = true;
        } else if (!strcmp(a, "--prefetch-depth")) {
            rc = args_i32("bench", a, v, 1, 4, &o->prefetch_depth);
            o->prefetch = 1;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file"))
            o->prompt_file = v;
        else if (!strcmp(a, "--tg") && (!strcmp(v, "random") || !strcmp(v, "greedy")))
            o->tg_greedy = !strcmp(v, "greedy");
        else if (!strcmp(a, "--spec") &&
                 (!strcmp(v, "ngram") || !strcmp(v, "draft") || !strcmp(v, "mtp"))) {
            o->draft_max = o->draft_max ? o->draft_max : 8;
            o->spec_ngram = !strcmp(v, "ngram");
            o->spec_draft = !strcmp(v, "draft");
            o->spec_mtp = !strcmp(v, "mtp");
        } else if (!strcmp(a, "-md") || !strcmp(a, "--draft-model"))
            o->draft_model = v;
        else if (!strcmp(a, "--draft-device") &&
                 (!strcmp(v, "auto") || !strcmp(v, "cpu") || !strcmp(v, "cuda")))
            o->draft_device = v;
        else if (!strcmp(a, "--draft-max"))
            rc = args_i32("bench", a, v, 1, 64, &o->draft_max);
        else if (!strcmp(a, "--lookahead") && (!strcmp(v, "on") || !strcmp(v, "off")))
            o->lookahead = !strcmp(v, "off") ? STRATA_LOOKAHEAD_OFF : STRATA_LOOKAHEAD_DRAFTS;
        else {
            fprintf(stderr, "strata bench: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (rc)
            return rc;
        i++;
    }
    if (run_opts_model("bench", &o->model))
        return 1;
    if (o->spec_draft != (o->draft_model != NULL)) {
        fprintf(stderr, "strata bench: %s\n",
                o->spec_draft ? "--spec draft needs -md FILE"
                              : "-md is the draft model of --spec draft: add it");
        return 2;
    }
    if (o->draft_max && !o->tg_greedy) {
        fprintf(stderr, "strata bench: --spec and --draft-max measure greedy generation: add -f "
                        "TEXT --tg greedy\n");
        return 2;
    }
    if ((o->profile_freeze || o->profile_optional) && !o->profile) {
        fprintf(stderr, "strata bench: --profile-freeze and --profile-optional go with --profile "
                        "FILE\n");
        return 2;
    }
    if (o->profile && !o->vram_budget) {
        fprintf(stderr, "strata bench: --profile restores experts into the expert cache, which "
                        "needs --vram-budget\n");
        return 2;
    }
    if (o->host_budget && o->cuda && !o->device_cpu && !o->cpu_moe_layers && !o->vram_budget) {
        fprintf(stderr, "strata bench: --host-budget runs on the CPU device, or on CUDA under "
                        "--vram-budget (the expert cache) or with --placement static\n");
        return 2;
    }
    if (o->host_budget && o->vram_budget && !o->cpu_moe_layers &&
        o->residency != STRATA_FILL_COPY) {
        fprintf(stderr, "strata bench: --host-budget under the expert cache copies its misses "
                        "from the tier: not with --residency zerocopy or gpu\n");
        return 2;
    }
    if (o->host_budget && o->no_mmap) {
        fprintf(stderr, "strata bench: --host-budget reads experts from the file; --no-mmap "
                        "copies them all to memory\n");
        return 2;
    }
    if (o->device_cpu || !o->cuda)
        return run_opts_cuda_only("bench", o->cuda_flag, "cpu");
    return 0;
}

/* -f: the prompt file's tokens, at most *n of them (*n becomes the count). 0, or the exit
 * code after printing the error. */
static int bench_prompt_text(const struct strata *st, const char *path, int32_t *ids, int *n)
{
    struct strata_model_info mi;
    char *text;
    size_t len;
    int rc;

    strata_model_info(st, &mi);
    if (!mi.has_tokenizer) {
        fprintf(stderr, "strata bench: %s: the model has no tokenizer\n", path);
        return 1;
    }
    if ((rc = args_read_prompt("bench", "-f", path, &text, &len)))
        return rc;
    len = len < (1u << 20) ? len : 1u << 20; /* the first MiB holds more than -p's tokens */
    int32_t *all = malloc(sizeof(int32_t) * (len + 4));
    int k = all ? strata_tokenize(st, text, len, 0, all, (int)(len + 4)) : -ENOMEM;
    free(text);
    if (k <= 0) {
        fprintf(stderr, "strata bench: %s: no prompt tokens\n", path);
        free(all);
        return 1;
    }
    *n = k < *n ? k : *n;
    memcpy(ids, all, sizeof(int32_t) * (size_t)*n);
    free(all);
    return 0;
}

/* Weight bytes one decode token reads: every tensor of the main layers and the head once,
 * one row of the token embedding, and of each layer's expert tensors (names with "_exps.",
 * biases included) the share of the n_used experts a token selects; an MTP block past the
 * main layers is not read. *cpu_experts (when not NULL) receives the expert share of the
 * first n_cpu layers: what a static placement reads from host memory. */
static double bench_token_bytes(const struct model *m, uint32_t n_cpu, double *cpu_experts)
{
    const struct model_hparams *hp = &m->hp;
    const struct gguf_file *f = m->file;
    double b = 0, cpu = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const char *name = f->tensors[i].name;
        double sz = (double)f->tensors[i].size;
        unsigned layer;
        if (!strcmp(name, "token_embd.weight")) {
            b += (double)m->tok_embd.row_bytes;
        } else if (sscanf(name, "blk.%u.", &layer) == 1) {
            if (layer >= hp->n_layer)
                continue;
            if (strstr(name, "_exps.")) {
                sz *= (double)hp->n_expert_used / hp->n_expert;
                if (layer < n_cpu)
                    cpu += sz;
            }
            b += sz;
        } else {
            b += sz;
        }
    }
    if (cpu_experts)
        *cpu_experts = cpu;
    return b;
}

/* The bench options as the API's config: the CPU, or CUDA (--device cuda, --vram-budget,
 * --placement), a stream of the prompt and the decode steps, the prompt in one batch. The
 * CUDA options are dropped on the CPU (a later --device cpu overrides them). */
static enum strata_placement bench_placement(const struct bench_opts *o)
{
    return run_opts_placement_pick(o->cpu_moe_layers, o->hybrid, o->stream, o->residency_set,
                                   o->prefetch);
}

static void bench_config(const struct bench_opts *o, struct strata_config *cfg)
{
    strata_config_init(cfg);
    cfg->model_path = o->model;
    cfg->device = o->cuda ? STRATA_DEVICE_CUDA : STRATA_DEVICE_CPU;
    if (o->cuda) {
        cfg->vram_budget = o->vram_budget;
        cfg->placement = bench_placement(o);
    }
    if (o->cpu_moe_layers)
        cfg->cpu_moe_layers = o->cpu_moe_layers;
    cfg->fill = (enum strata_fill)o->residency;
    cfg->flags = (o->graph ? STRATA_FLAG_GRAPH : 0) | (o->no_graph ? STRATA_FLAG_NO_GRAPH : 0) |
                 (o->prefetch ? STRATA_FLAG_PREFETCH : 0) | (o->gather ? STRATA_FLAG_GATHER : 0) |
                 (o->no_mmap ? STRATA_FLAG_NO_MMAP : 0) | (o->no_mtp ? STRATA_FLAG_NO_MTP : 0) |
                 (o->profile_freeze ? STRATA_FLAG_PROFILE_FREEZE : 0) |
                 (o->profile_optional ? STRATA_FLAG_PROFILE_OPTIONAL : 0);
    cfg->profile = o->profile;
    cfg->prefetch_depth = o->prefetch_depth;
    cfg->prefetch_top = o->prefetch_top;
    cfg->n_threads = o->n_threads;
    cfg->host_budget = o->host_budget; /* the CPU device, static's CPU layers, the cache */
    cfg->flags |= (o->host_pread ? STRATA_FLAG_NO_URING : 0) |
                  (o->host_buffered ? STRATA_FLAG_NO_DIRECT : 0) |
                  (o->host_ahead ? STRATA_FLAG_READ_AHEAD : 0) |
                  (o->no_host_tier ? STRATA_FLAG_NO_HOST_TIER : 0);
    /* the first stream and, with --streams N, N more: their KV caches count against the budget */
    cfg->n_ctx = o->n_prompt + o->n_gen + 1;
    cfg->n_streams = 1 + (o->streams > 1 ? o->streams : 0);
    cfg->n_batch = o->n_prompt;
    cfg->log = stderr;
}

/* What one bench run measured. */
struct bench_run {
    int threads, procs;
    double bw_all, bw_run, bw_after, bw; /* host read GB/s: all processors, the run's threads,
                                          * after decode; bw is the highest */
    double bw_map;                       /* the same sweep over the model's mapping */
    uint64_t mlen;                       /* bytes of that sweep */
    double t_copy, t_warm, t_pp, t_tg;   /* --no-mmap copy, first token, prefill, decode */
    struct strata_stats p0, p1, c0, c1;  /* around prefill and around decode */
    bool pp_cached, cached;
    double disk_bps;                /* --host-budget: the probed read bandwidth (the
                                     * mean of the probes before and after the run) */
    double disk_before, disk_after; /* the two probes */
    uint64_t disk_bytes, disk_at;   /* over this many bytes from there */
    bool disk_direct, disk_uring;
};

#define BENCH_DISK_BLOCK (1u << 20) /* the disk probe: reads of 1 MiB, */
#define BENCH_DISK_DEPTH 32         /* 32 in flight, */
#define BENCH_DISK_GIB 1.0          /* over 1 GiB of the experts */

/* The host read bandwidth with every processor and with the run's threads, and over the
 * model's own mapping (page cache, usually 4 KiB pages). */
static void bench_bandwidths(const struct bench_opts *o, const struct model *m, bool tier,
                             struct bench_run *r)
{
    r->threads = omp_get_max_threads();
    /* The floor is physical: the machine's read bandwidth with every processor reading,
     * whatever thread count the kernels run best with. */
    r->procs = omp_get_num_procs();
    r->bw_all = membw_measure((size_t)(o->bw_gib * (1u << 30)), r->procs, 5);
    r->bw_run = r->threads == r->procs
                    ? r->bw_all
                    : membw_measure((size_t)(o->bw_gib * (1u << 30)), r->threads, 5);
    r->bw = r->bw_all > r->bw_run ? r->bw_all : r->bw_run;
    const struct gguf_file *gf = m->file;
    uint64_t m0 = gf->data_offset / 4096 * 4096;
    r->mlen = gf->size - m0 < (uint64_t)(o->bw_gib * (1u << 30)) ? gf->size - m0
                                                                  : (uint64_t)(o->bw_gib * (1u << 30));
    r->bw_map = membw_read(gf->base + m0, r->mlen / 64 * 64, r->threads, 5);
    if (tier && gf->path) { /* where the host tier reads: layer 0's experts on */
        uint64_t at = (uint64_t)((const uint8_t *)m->layers[0].gate_exps.data - gf->base);
        uint64_t want = (uint64_t)(BENCH_DISK_GIB * (1u << 30));
        r->disk_bytes = gf->size - at < want ? (gf->size - at) / 4096 * 4096 : want;
        r->disk_at = at;
        r->disk_bps = disk_tier_probe(gf->path, at, r->disk_bytes,
                                      BENCH_DISK_BLOCK, BENCH_DISK_DEPTH, &r->disk_direct,
                                      &r->disk_uring);
    }
}

/* The timed part: the first token (page-in), the prompt in one batch, then n_gen decode steps
 * as greedy generation runs them (only the id is read back). 0 or -errno. */
static int bench_timed(const struct bench_opts *o, struct strata *st, struct strata_stream *ss,
                       struct backend *b, const int32_t *ids, struct rng *rng,
                       struct bench_run *r)
{
    const struct model_hparams *hp = &strata_model_of(st)->hp;
    float *logits = malloc(sizeof(float) * hp->n_vocab);
    if (!logits)
        return -ENOMEM;
    /* touch the weights once so the page cache, not the disk, is measured */
    double t0 = clock_now_s();
    int rc = strata_eval(ss, ids, 1, logits);
    r->t_warm = clock_now_s() - t0;
    strata_stream_truncate(ss, 0);

    if (o->op_times)
        backend_profile_report(b, stdout, "the first token");
    strata_get_stats(st, &r->p0);
    r->pp_cached = r->p0.has_cache;
    t0 = clock_now_s();
    rc = rc ? rc : strata_eval(ss, ids, o->n_prompt, logits);
    r->t_pp = clock_now_s() - t0;
    if (r->pp_cached)
        strata_get_stats(st, &r->p1);
    if (o->op_times)
        backend_profile_report(b, stdout, "prompt processing");
    int32_t tok = sampler_argmax(logits, (int)hp->n_vocab);
    strata_get_stats(st, &r->c0);
    r->cached = r->c0.has_cache;
    t0 = clock_now_s();
    for (int i = 0; !rc && i < o->n_gen; i++) {
        if (!o->tg_greedy)
            tok = (int32_t)rng_below(rng, hp->n_vocab);
        rc = strata_eval_argmax(ss, &tok, 1, &tok);
    }
    r->t_tg = clock_now_s() - t0;
    if (r->cached)
        strata_get_stats(st, &r->c1);
    /* the machine's bandwidth drifts between runs (shared hosts): probe again after the
     * timed runs, and let the floor use the highest probe of the run */
    r->bw_after = membw_measure((size_t)(o->bw_gib * (1u << 30)), r->procs, 5);
    r->bw = r->bw > r->bw_after ? r->bw : r->bw_after;
    /* the disk drifts too (a virtio disk moved 1.78 -> 2.11 GB/s between runs): the tier's
     * reads are held to the mean of a probe before and one after them */
    r->disk_before = r->disk_bps;
    if (r->disk_bps > 0) {
        bool direct, uring;
        r->disk_after = disk_tier_probe(strata_model_of(st)->file->path, r->disk_at, r->disk_bytes,
                                        BENCH_DISK_BLOCK, BENCH_DISK_DEPTH, &direct, &uring);
        if (r->disk_after > 0)
            r->disk_bps = (r->disk_before + r->disk_after) / 2;
    }
    if (o->op_times)
        backend_profile_report(b, stdout, "decode");
    free(logits);
    return rc;
}

/* One bench_spec run: what it generated and what the cache did meanwhile. */
struct spec_run {
    struct strata_generate_stats gs;
    struct strata_stats d; /* the cache's counters over the run */
    double tps;            /* tok/s of its decode loop */
};

static double spec_moved(const struct spec_run *r)
{
    return r->gs.n_gen
               ? ((double)r->d.bytes_streamed + (double)r->d.bytes_zero_copy) / r->gs.n_gen / 1e6
               : 0.0;
}

static double spec_hits(const struct spec_run *r)
{
    uint64_t acc = r->d.hits + r->d.misses;
    return acc ? 100.0 * (double)r->d.hits / (double)acc : 0.0;
}

/* A lookahead run l against the runs without it just before (a) and after (b): the same
 * tokens, so the cache each meets differs only by what the run before left in it. */
static void spec_print_lookahead(const char *what, const struct spec_run *a,
                                 const struct spec_run *l, const struct spec_run *b)
{
    double base = (a->tps + b->tps) / 2;
    printf("spec         %s with the lookahead: %.2f tok/s against %.2f and %.2f without "
           "(before and after) = %.2fx; %d forwards looked ahead, %lld experts copied ahead "
           "(%llu used, %llu late, %.1f MB wasted); hit rate %.1f%% (without: %.1f%%, "
           "%.1f%%); experts moved %.1f MB per token (without: %.1f, %.1f)\n",
           what, l->tps, a->tps, b->tps, base > 0 ? l->tps / base : 0.0, l->gs.n_lookahead,
           l->gs.lookahead_experts, (unsigned long long)l->d.prefetch_used,
           (unsigned long long)l->d.prefetch_late, l->d.prefetch_wasted / 1e6, spec_hits(l),
           spec_hits(a), spec_hits(b), spec_moved(l), spec_moved(a), spec_moved(b));
}

/* --spec: greedy generation after the prompt with strata_generate, plain and with drafts, in
 * the same process: tok/s of each, the drafts' statistics and the experts moved per token.
 * With ngram drafts and the lookahead not off, six runs: plain without, with (ALWAYS) and
 * again without the lookahead, then drafts the same way. */
static int bench_spec(const struct bench_opts *o, struct strata *st, struct strata_stream *ss)
{
    struct spec_run r[6];
    const bool look = o->spec_ngram && o->lookahead != STRATA_LOOKAHEAD_OFF;
    const int runs = look ? 6 : 2, P = 0, D = look ? 3 : 1;
    int32_t last;
    int rc = 0;
    struct strata *dm = NULL;
    struct strata_drafter *dr = NULL;
    struct strata_mtp *mtp = NULL;
    long long d_eval = 0;
    double d_secs = 0;

    if (o->spec_draft && /* the draft model, whole, following the target's history */
        (run_open_draft(o->draft_model, o->draft_device, o->n_threads, o->n_prompt + o->n_gen + 1,
                        false, st, &dm, &dr) ||
         strata_drafter_set_prefix(dr, o->prompt, o->n_prompt - 1))) {
        strata_drafter_close(dr);
        strata_close(dm);
        return 1;
    }
    for (int k = 0; k < runs && !rc; k++) {
        struct strata_generate_params p;
        struct strata_stats a, b;
        const bool drafts = k >= D;
        strata_generate_params_init(&p);
        p.n_predict = o->n_gen;
        p.sampling.temperature = 0;
        p.ignore_eos = true;
        p.draft_max = drafts ? o->draft_max : 0;
        p.lookahead = !look || (k - (drafts ? D : P)) != 1 ? STRATA_LOOKAHEAD_OFF
                      : drafts                             ? STRATA_LOOKAHEAD_DRAFTS
                                                           : STRATA_LOOKAHEAD_ALWAYS;
        if (dr) {
            p.draft_fn = strata_drafter_draft;
            p.draft_ctx = dr;
        }
        /* the prompt's last token again, after the rest of it */
        strata_stream_truncate(ss, o->n_prompt - 1);
        if (drafts && o->spec_mtp) { /* the block follows the stream from here (the rest of the
                                      * prompt is evaluated again for it) */
            if ((rc = strata_mtp_open(ss, &mtp)))
                break;
            p.draft_fn = strata_mtp_draft;
            p.draft_ctx = mtp;
        }
        last = o->prompt[o->n_prompt - 1];
        strata_get_stats(st, &a);
        rc = strata_generate(ss, &last, 1, &p, NULL, NULL, NULL, &r[k].gs);
        strata_get_stats(st, &b);
        r[k].d = (struct strata_stats){
            .bytes_streamed = b.bytes_streamed - a.bytes_streamed,
            .bytes_zero_copy = b.bytes_zero_copy - a.bytes_zero_copy,
            .prefetched = b.prefetched - a.prefetched,
            .prefetch_used = b.prefetch_used - a.prefetch_used,
            .prefetch_late = b.prefetch_late - a.prefetch_late,
            .prefetch_wasted = b.prefetch_wasted - a.prefetch_wasted,
            .hits = b.hits - a.hits,
            .misses = b.misses - a.misses,
        };
        r[k].tps = r[k].gs.n_gen > 1 ? (r[k].gs.n_gen - 1) / r[k].gs.t_gen_s : 0;
    }
    if (dr)
        strata_drafter_stats(dr, &d_eval, &d_secs);
    if (mtp)
        strata_mtp_stats(mtp, &d_eval, &d_secs);
    strata_mtp_close(mtp);
    strata_drafter_close(dr);
    strata_close(dm);
    if (rc)
        return cli_fail(o->spec_mtp && !mtp ? "--spec mtp" : "--spec: generation");
    const struct strata_generate_stats *g = &r[D].gs;
    double t0 = r[P].tps, t1 = r[D].tps;
    printf("spec         greedy generation of %d tokens: %.2f tok/s plain, %.2f tok/s with "
           "%s drafts (--draft-max %d) = %.2fx\n",
           g->n_gen, t0, t1,
           o->spec_draft ? "draft-model"
           : o->spec_mtp ? "MTP"
                         : "ngram",
           o->draft_max, t0 > 0 ? t1 / t0 : 0.0);
    if (o->spec_draft)
        printf("spec         draft model %s: %lld tokens evaluated in %.2f s (%.0f%% of the "
               "generation with drafts)\n",
               o->draft_model, d_eval, d_secs, g->t_gen_s > 0 ? 100.0 * d_secs / g->t_gen_s : 0.0);
    if (o->spec_mtp)
        printf("spec         MTP block: %lld rows (following the stream and drafting); "
               "drafting took %.2f s (%.0f%% of the generation with drafts)\n",
               d_eval, d_secs, g->t_gen_s > 0 ? 100.0 * d_secs / g->t_gen_s : 0.0);
    printf("spec         %d verify passes, %d drafted, %d accepted (%.1f%%), %.2f tokens per "
           "pass",
           g->n_verify, g->n_drafted, g->n_accepted,
           g->n_drafted ? 100.0 * g->n_accepted / g->n_drafted : 0.0,
           g->n_verify ? (double)(g->n_verify + g->n_accepted) / g->n_verify : 0.0);
    if (g->n_paused)
        printf(", %d steps paused", g->n_paused);
    if (spec_moved(&r[P]) > 0 || spec_moved(&r[D]) > 0)
        printf("; experts moved %.1f MB per token plain, %.1f with drafts", spec_moved(&r[P]),
               spec_moved(&r[D]));
    printf("\n");
    if (look) {
        spec_print_lookahead("plain", &r[0], &r[1], &r[2]);
        spec_print_lookahead("drafts", &r[3], &r[4], &r[5]);
    }
    return 0;
}

/* The expert cache's part of the report: hit rate, what PCIe moved against its measured
 * bandwidth, the CPU lane, and the floors of streaming alone and of both lanes together. */
static void bench_print_cache(const struct bench_opts *o, struct strata *st,
                              const struct model *m, const struct bench_run *r, double tg)
{
    const struct model_hparams *hp = &m->hp;
    const struct strata_stats *c0 = &r->c0, *c1 = &r->c1;
    /* the streaming lane: misses over PCIe, against pinned H2D measured now */
    double h2d = cuda_h2d_bandwidth(NULL, (size_t)256 << 20, 10);
    uint64_t acc = (c1->hits - c0->hits) + (c1->misses - c0->misses);
    double moved = (double)(c1->bytes_streamed - c0->bytes_streamed) +
                   (double)(c1->bytes_zero_copy - c0->bytes_zero_copy);
    double per_tok = moved / o->n_gen, pcie_floor = per_tok / h2d;
    printf("cache        %d slots; decode hit rate %.1f%% (%llu of %llu expert uses), %llu "
           "evictions\n",
           c1->slots, acc ? 100.0 * (c1->hits - c0->hits) / acc : 0.0,
           (unsigned long long)(c1->hits - c0->hits), (unsigned long long)acc,
           (unsigned long long)(c1->evictions - c0->evictions));
    printf("pcie         %.1f GB/s pinned H2D (256 MiB, median of 10); decode moved %.1f MB "
           "per token (%.1f copied, %.1f read in place) = %.1f GB/s = %.0f%% of H2D\n",
           h2d / 1e9, per_tok / 1e6,
           (double)(c1->bytes_streamed - c0->bytes_streamed) / o->n_gen / 1e6,
           (double)(c1->bytes_zero_copy - c0->bytes_zero_copy) / o->n_gen / 1e6,
           moved / r->t_tg / 1e9, 100.0 * moved / r->t_tg / h2d);
    if (r->pp_cached) { /* prefill streams most of a layer's experts: often PCIe-bound */
        double pmoved = (double)(r->p1.bytes_streamed - r->p0.bytes_streamed) +
                        (double)(r->p1.bytes_zero_copy - r->p0.bytes_zero_copy);
        printf("pcie pp      prefill moved %.2f GB in %.3f s = %.1f GB/s = %.0f%% of H2D\n",
               pmoved / 1e9, r->t_pp, pmoved / r->t_pp / 1e9, 100.0 * pmoved / r->t_pp / h2d);
    }
    if (c1->prefetched > c0->prefetched) {
        double pf = (double)(c1->prefetched - c0->prefetched);
        double used = (double)(c1->prefetch_used - c0->prefetch_used);
        double late = (double)(c1->prefetch_late - c0->prefetch_late);
        double wasted = (double)(c1->prefetch_wasted - c0->prefetch_wasted);
        double slot = (double)model_expert_bytes(m, 0);
        char late_s[96] = "";
        if (o->residency != STRATA_FILL_GPU) /* the GPU's cache: a layer waits for them all */
            snprintf(late_s, sizeof(late_s),
                     " (%.1f%% of those still copying when their layer ran)",
                     used > 0 ? 100 * late / used : 0.0);
        printf("prefetch     %.1f experts per token copied ahead, %.1f%% of them used%s; %.1f MB "
               "per token evicted unused (%.1f%% of what prefetch copied)",
               pf / o->n_gen, 100 * used / pf, late_s, wasted / o->n_gen / 1e6,
               100 * wasted / (pf * slot));
        if (c1->prefetch_jobs > c0->prefetch_jobs)
            printf("; %.1f layer calls' predictions per token made by the worker thread",
                   (double)(c1->prefetch_jobs - c0->prefetch_jobs) / o->n_gen);
        printf("\n");
    }
    if (c1->cpu_computed > c0->cpu_computed)
        printf("cpu lane     %.1f of %.1f missed experts per token computed on the CPU "
               "(%.2f of them also copied into a slot behind their layer)\n",
               (double)(c1->cpu_computed - c0->cpu_computed) / o->n_gen,
               (double)(c1->misses - c0->misses) / o->n_gen,
               (double)(c1->cpu_admitted - c0->cpu_admitted) / o->n_gen);
    printf("floor        %.1f tok/s if streaming alone bounds decode (bytes moved / H2D) -> "
           "decode at %.0f%% of it\n",
           pcie_floor > 0 ? 1.0 / pcie_floor : 0.0, 100.0 * tg * pcie_floor);
    /* DESIGN §2 with both lanes: every missed expert's bytes, read by PCIe and the CPU
     * together (their bandwidths add when the lanes finish a layer together) */
    double miss_bytes = 0;
    for (uint32_t l = 0; l < hp->n_layer; l++)
        miss_bytes += (double)model_expert_bytes(m, l) / hp->n_layer;
    miss_bytes *= (double)(c1->misses - c0->misses) / o->n_gen;
    double both_floor = miss_bytes / (h2d + r->bw);
    printf("floor2       %.1f tok/s if the misses (%.1f MB per token) were read by PCIe and "
           "the CPU together (%.1f + %.1f GB/s) -> decode at %.0f%% of it\n",
           both_floor > 0 ? 1.0 / both_floor : 0.0, miss_bytes / 1e6, h2d / 1e9, r->bw / 1e9,
           100.0 * tg * both_floor);
    if (o->stats)
        strata_print_cache_stats(st, stdout);
    if (o->stats_json && strata_write_cache_stats_json(st, o->stats_json))
        cli_fail("--stats-json");
}

/* --streams N: N fresh streams, stream i prefilled with the prompt rotated by i tokens (their
 * routing differs), then n_gen steps of all N in lockstep (random ids, or each row's argmax
 * with --tg greedy). Prints aggregate and per-stream decode and what the cache moved per
 * generated token. 0 or the exit code after the message. */
static int bench_lockstep(const struct bench_opts *o, struct strata *st, const int32_t *ids,
                          struct rng *rng)
{
    const struct model_hparams *hp = &strata_model_of(st)->hp;
    int n = o->streams, nv = (int)hp->n_vocab, rc = 0;
    struct strata_stream **ss = calloc((size_t)n, sizeof(*ss));
    struct strata_batch *b = NULL;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *rot = malloc(sizeof(int32_t) * (size_t)o->n_prompt);
    float *logits = malloc(sizeof(float) * (size_t)n * nv);
    struct strata_stats s0, s1;

    if (!ss || !tok || !rot || !logits) {
        rc = cli_fail("out of memory");
        goto out;
    }
    if (strata_streams_check(st, n, o->n_prompt + o->n_gen + 1)) {
        fprintf(stderr, "strata bench: --streams %d: %s\n", n, strata_error());
        rc = 2;
        goto out;
    }
    if (strata_batch_open(st, n, &b)) {
        rc = cli_fail("--streams");
        goto out;
    }
    for (int i = 0; i < n && !rc; i++) {
        for (int j = 0; j < o->n_prompt; j++)
            rot[j] = ids[(j + i) % o->n_prompt];
        if (strata_stream_open(st, o->n_prompt + o->n_gen + 1, &ss[i]) ||
            strata_eval(ss[i], rot, o->n_prompt, logits))
            rc = cli_fail("--streams: a stream's prompt");
        else
            tok[i] = sampler_argmax(logits, nv);
    }
    strata_get_stats(st, &s0);
    double t0 = clock_now_s();
    for (int t = 0; !rc && t < o->n_gen; t++) {
        for (int i = 0; i < n && !o->tg_greedy; i++)
            tok[i] = (int32_t)rng_below(rng, hp->n_vocab);
        if (strata_batch_eval(b, ss, n, tok, logits)) {
            rc = cli_fail("--streams: a lockstep step");
            break;
        }
        for (int i = 0; i < n; i++)
            tok[i] = sampler_argmax(logits + (size_t)i * nv, nv);
    }
    double dt = clock_now_s() - t0;
    if (rc)
        goto out;
    strata_get_stats(st, &s1);
    double gen = (double)n * o->n_gen;
    printf("lockstep     %d streams x tg%d: %.2f tok/s aggregate, %.2f per stream\n", n,
           o->n_gen, gen / dt, o->n_gen / dt);
    if (s1.has_cache) {
        uint64_t acc = (s1.hits - s0.hits) + (s1.misses - s0.misses);
        double moved = (double)(s1.bytes_streamed - s0.bytes_streamed) +
                       (double)(s1.bytes_zero_copy - s0.bytes_zero_copy);
        printf("lockstep     hit rate %.1f%% (%llu expert uses), %.2f MB of experts moved per "
               "generated token; placement %s at the end%s\n",
               acc ? 100.0 * (s1.hits - s0.hits) / acc : 0.0, (unsigned long long)acc,
               moved / gen / 1e6, s1.placement,
               s1.placement_timing ? " (auto: still timing the modes)" : "");
    }
out:
    for (int i = 0; ss && i < n; i++)
        strata_stream_close(ss[i]);
    strata_batch_close(b);
    free(ss);
    free(tok);
    free(rot);
    free(logits);
    return rc;
}

/* The report: what ran, the bandwidths, pp and tg, and decode against its floor. */
static void bench_print(const struct bench_opts *o, struct strata *st, const struct model *m,
                        const struct bench_run *r)
{
    const struct model_hparams *hp = &m->hp;
    struct strata_stats now;
    strata_get_stats(st, &now);
    double cpu_ebytes = 0;
    double wbytes = bench_token_bytes(m, o->cuda ? (uint32_t)now.cpu_moe_layers : 0, &cpu_ebytes);
    double kv_per_pos = 2.0 * hp->n_layer * hp->n_head_kv * hp->head_dim * sizeof(float);
    double kvbytes = kv_per_pos * (o->n_prompt + o->n_gen / 2.0); /* mean context of the run */
    double floor_s = (wbytes + kvbytes) / r->bw;
    double tg = o->n_gen / r->t_tg;
    printf("model        %s (%s, %u layers, %u experts top-%u)\n", o->model, m->arch->name,
           hp->n_layer, hp->n_expert, hp->n_expert_used);
    if (o->cuda)
        printf("backend      cuda, %.2f GiB of VRAM%s\n", now.vram_bytes / 1073741824.0,
               now.graph ? ", decode steps replayed from a CUDA graph" : "");
    if (o->cuda && now.cpu_moe_layers)
        printf("placement    static: experts of %d of %u layers on the CPU (%d threads), the "
               "rest resident\n",
               now.cpu_moe_layers, hp->n_layer, r->threads);
    else if (o->cuda && now.has_cache)
        printf("placement    %s at the end of decode%s\n", now.placement,
               now.placement_timing ? " (auto: still timing the modes)"
               : bench_placement(o) == STRATA_PLACEMENT_AUTO
                   ? " (auto: each mode timed on the first decode steps)"
                   : "");
    else
        printf("backend      cpu, %d threads%s; %s kernels%s\n", now.threads,
               !o->cuda && now.threads != r->threads ? " at the end of decode (timed on the "
                                                       "first decode steps)"
                                                     : "",
               cpu_isa_name(cpu_isa_best()), gemm_amx_status() ? "" : ", AMX tiles for batches");
    printf("host read    %.1f GB/s with %d threads, %.1f GB/s with %d; %.1f GB/s with %d after "
           "decode (%.1f GiB probe, median of 5); the floor uses the highest\n",
           r->bw_all / 1e9, r->procs, r->bw_run / 1e9, r->threads, r->bw_after / 1e9, r->procs,
           o->bw_gib);
    printf("model read   %.1f GB/s (the same sweep over %.2f GiB of the model's mapping)\n",
           r->bw_map / 1e9, r->mlen / 1073741824.0);
    if (o->no_mmap)
        printf("weights      copied to anonymous huge pages in %.2f s (--no-mmap)\n", r->t_copy);
    printf("first token  %.2f s (page-in)\n", r->t_warm);
    struct strata_profile_status ps;
    strata_profile_status(st, &ps);
    if (ps.restored)
        printf("profile      %s: %d of %d experts placed (%d frozen) in %.2f s before the first "
               "token, %.1f%% of the warmup's expert choices%s\n",
               o->profile, ps.placed, ps.planned, ps.n_frozen, ps.seconds, 100 * ps.coverage,
               ps.replanned ? " (planned again for this budget)" : "");
    printf("pp%-4d       %.1f tok/s\n", o->n_prompt, o->n_prompt / r->t_pp);
    printf("tg%-4d       %.2f tok/s\n", o->n_gen, tg);
    printf("bytes/token  %.3f GB weights + %.3f GB KV cache (mean)\n", wbytes / 1e9,
           kvbytes / 1e9);
    if (o->cuda) {
        /* all resident: the floor is HBM, read once per token */
        double hbm = cuda_copy_bandwidth((size_t)1 << 30, 10);
        double hbm_floor = (wbytes + kvbytes) / hbm;
        printf("device copy  %.0f GB/s (1 GiB device-to-device, read + written, median of 10)\n",
               hbm / 1e9);
        if (!r->cached && cpu_ebytes > 0) {
            /* static: the CPU layers' experts from host memory, the rest from HBM */
            double f = (wbytes + kvbytes - cpu_ebytes) / hbm + cpu_ebytes / r->bw;
            printf("floor        %.1f tok/s: %.3f GB of experts per token at %.1f GB/s of host "
                   "memory, the rest at %.0f GB/s of HBM -> decode at %.1f%% of the floor\n",
                   1.0 / f, cpu_ebytes / 1e9, r->bw / 1e9, hbm / 1e9, 100.0 * tg * f);
        } else if (!r->cached) {
            printf("floor        %.1f tok/s at %.0f GB/s of HBM -> decode at %.1f%% of the "
                   "floor\n",
                   1.0 / hbm_floor, hbm / 1e9, 100.0 * tg * hbm_floor);
        }
    }
    if (r->cached)
        bench_print_cache(o, st, m, r, tg);
    strata_get_stats(st, &now);
    double lane_s = o->cuda ? now.cpu_lane_seconds - r->c0.cpu_lane_seconds : 0;
    if (lane_s > 0) /* the PCIe lane's busy share is the "% of H2D" above */
        printf("lanes        CPU lane busy %.0f%% of decode (%.2f ms of experts per token)\n",
               100.0 * lane_s / r->t_tg, 1e3 * lane_s / o->n_gen);
    if (o->cuda && now.lane_cpu_bps > 0)
        printf("lanes        measured at open: PCIe %.1f GB/s, CPU %.1f GB/s; the CPU lane ran "
               "at %.1f GB/s\n",
               now.lane_pcie_bps / 1e9, now.lane_cpu_bps_open / 1e9, now.lane_cpu_bps / 1e9);
    if (!o->cuda) {
        printf("floor        %.2f tok/s at %.1f GB/s -> decode at %.0f%% of the floor\n",
               1.0 / floor_s, r->bw / 1e9, 100.0 * tg * floor_s);
    }
    if (now.has_host_tier && r->disk_bps > 0) {
        printf("disk read    %.2f GB/s (%s, %s: %d reads of %u KiB in flight over %.1f MiB of the "
               "file from layer 0's experts)",
               r->disk_before / 1e9, r->disk_direct ? "O_DIRECT" : "buffered",
               r->disk_uring ? "io_uring" : "pread", r->disk_uring ? BENCH_DISK_DEPTH : 1,
               BENCH_DISK_BLOCK >> 10, r->disk_bytes / 1048576.0);
        if (r->disk_after > 0)
            printf(" before the run, %.2f GB/s after: the tier is held to their mean, %.2f GB/s",
                   r->disk_after / 1e9, r->disk_bps / 1e9);
        printf("\n");
    }
    if (now.has_host_tier) {
        uint64_t acc = now.tier_hits + now.tier_misses;
        printf("host tier    %d slots (%s, %s); over the whole run: hit rate %.1f%% of %llu "
               "expert uses, %.2f GB read, %.2f s waited for reads\n",
               now.tier_slots, now.tier_uring ? "io_uring" : "pread",
               now.tier_direct ? "O_DIRECT" : "buffered", acc ? 100.0 * now.tier_hits / acc : 0.0,
               (unsigned long long)acc, now.tier_bytes_read / 1e9, now.tier_read_seconds);
        if (now.tier_ahead)
            printf("host tier    read ahead: %llu experts of the next layer while a layer "
                   "computed, %llu of them used (%.0f%%)\n",
                   (unsigned long long)now.tier_ahead, (unsigned long long)now.tier_ahead_used,
                   100.0 * now.tier_ahead_used / now.tier_ahead);
        else if (now.tier_read_seconds > 0)
            printf("host tier    reads at %.2f GB/s\n",
                   now.tier_bytes_read / 1e9 / now.tier_read_seconds);
        if (r->disk_bps > 0 && now.tier_read_seconds > 0 && !now.tier_ahead)
            printf("host tier    reads at %.0f%% of the probed disk bandwidth\n",
                   100.0 * now.tier_bytes_read / now.tier_read_seconds / r->disk_bps);
        if (now.tier_disk_bps > 0)
            printf("host tier    learned from its reads: %.2f GB/s + %.2f ms a batch%s",
                   now.tier_disk_bps / 1e9, now.tier_disk_lat_s * 1e3, r->disk_bps > 0 ? "" : "\n");
        if (now.tier_disk_bps > 0 && r->disk_bps > 0)
            printf(" (%.0f%% of the probe)\n", 100.0 * now.tier_disk_bps / r->disk_bps);
        if (now.tier_ahead_paced)
            printf("host tier    %llu predicted experts not read ahead: the disk would not "
                   "land them in the %.2f ms before their layer\n",
                   (unsigned long long)now.tier_ahead_paced, now.tier_window_s * 1e3);
    }
}

int cmd_bench(int argc, char **argv)
{
    struct bench_opts o;
    struct strata_config cfg;
    struct strata *st = NULL;
    struct strata_stream *ss = NULL;
    struct bench_run r = {0};
    int32_t *ids = NULL;
    int rc = bench_parse(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;

    if (o.bind) { /* before the model is read, over every core */
        struct topo *t = NULL;
        int nb = topo_open(&t) ? -1 : topo_bind_openmp(t, -1, o.n_threads);
        topo_close(t);
        if (nb < 0)
            return cli_fail("--bind");
    }
    bench_config(&o, &cfg);
    if (strata_load(&cfg, &st))
        return cli_open_fail();
    const struct model *m = strata_model_of(st);
    r.t_copy = strata_copy_seconds(st);
    int brc = strata_start(st);
    if (o.cuda && o.op_times) {
        fprintf(stderr, "strata bench: --op-times times ops as they run, so only with --device "
                        "cpu\n");
        o.op_times = 0;
    }
    if (!brc && o.profile && run_profile_check(st, o.profile)) {
        rc = cli_fail("the profile's probe");
        goto out;
    }
    if (brc || (o.op_times && strata_profile_open(st)) ||
        strata_stream_open(st, o.n_prompt + o.n_gen + 1, &ss)) {
        rc = cli_fail("starting the engine");
        goto out;
    }
    struct strata_stats st0;
    strata_get_stats(st, &st0); /* a tier: asked for, or taken for experts that do not fit */
    bench_bandwidths(&o, m, st0.has_host_tier, &r);
    ids = malloc(sizeof(int32_t) * (size_t)o.n_prompt);
    if (!ids) {
        rc = cli_fail("out of memory");
        goto out;
    }
    struct rng rng;
    rng_seed(&rng, 1234, 0);
    for (int i = 0; i < o.n_prompt; i++)
        ids[i] = (int32_t)rng_below(&rng, m->hp.n_vocab);
    if (o.prompt_file && (rc = bench_prompt_text(st, o.prompt_file, ids, &o.n_prompt)))
        goto out;
    /* the profiling wrapper with --profile */
    if (bench_timed(&o, st, ss, strata_backend_of(st), ids, &rng, &r)) {
        rc = cli_fail("benchmark");
        goto out;
    }
    bench_print(&o, st, m, &r);
    o.prompt = ids;
    if (o.draft_max && (rc = bench_spec(&o, st, ss)))
        goto out;
    if (o.streams > 1)
        rc = bench_lockstep(&o, st, ids, &rng);
out:
    free(ids);
    strata_stream_close(ss);
    strata_close(st);
    return rc;
}
