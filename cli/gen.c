/* strata gen: writes a synthetic checkpoint (tools/gen/gen.h) from command-line options. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "errors.h"
#include "gen.h"

#define GEN_DEFAULT_ARCH "qwen3moe"
#define GEN_DEFAULT_PRESET "tiny"
#define GEN_DEFAULT_MIX "q4_k_m"
#define GEN_DEFAULT_SEED 1

static volatile sig_atomic_t gen_cancel;

static void gen_on_signal(int sig)
{
    (void)sig;
    gen_cancel = 1;
}

static void gen_usage(FILE *out)
{
    uint32_t n;
    const struct gen_preset *p = gen_presets(&n);

    fprintf(out,
            "usage: strata gen [options] -o FILE\n\n"
            "Writes a GGUF checkpoint with random, well-scaled weights at a real model's shapes.\n"
            "The same seed and options give a byte-identical file for any --threads.\n\n"
            "options:\n"
            "  --arch NAME      architecture: qwen3moe, gpt-oss, qwen3next or qwen35moe\n"
            "                   (default %s); qwen3next and qwen35moe mix Gated DeltaNet (GDN)\n"
            "                   layers with full attention every N-th layer\n"
            "  --preset NAME    model size (default %s), one of (by architecture):\n",
            GEN_DEFAULT_ARCH, GEN_DEFAULT_PRESET);
    for (uint32_t i = 0; i < n; i++) {
        fprintf(out,
                "                     %-9s %-9s %u layers, d %u, %u/%u heads x %u, %u experts "
                "top-%u x %u, vocab %u\n",
                p[i].arch, p[i].name, p[i].n_layer, p[i].n_embd, p[i].n_head, p[i].n_head_kv,
                p[i].head_dim, p[i].n_expert, p[i].n_expert_used, p[i].n_ff_exp, p[i].n_vocab);
        if (p[i].full_attn_interval)
            fprintf(out,
                    "                                         + shared expert x %u, rope %u "
                    "dims, GDN %u q/k + %u v heads x %u, conv %u, full attention every %u\n",
                    p[i].n_ff_shexp, p[i].n_rot, p[i].ssm_n_group, p[i].ssm_dt_rank,
                    p[i].ssm_d_state, p[i].ssm_d_conv, p[i].full_attn_interval);
    }
    fprintf(out,
            "  --quant MIX      f32, q8_0 or q4_k_m (default %s); gpt-oss experts are MXFP4\n"
            "                   under q8_0 and q4_k_m\n"
            "  --seed S         random seed (default %d)\n"
            "  --threads N      worker threads (default: online CPUs)\n"
            "  --layers N       override the preset's layer count (quick files at real shapes)\n"
            "  --mtp 0|1        qwen3next / qwen35moe: also write a multi-token-prediction block\n"
            "                   (nextn_predict_layers; default 0)\n"
            "  --vocab PATH     take vocab, merges and added tokens from a Hugging Face\n"
            "                   tokenizer.json (default: a synthetic BPE vocabulary)\n"
            "  --inflate SMALL  instead of random weights, grow the qwen3moe model SMALL to the\n"
            "                   preset's per-layer shapes (hidden size, heads, head dim, expert\n"
            "                   FFN) keeping its function and routing; layers, vocabulary and\n"
            "                   tokenizer stay SMALL's; its expert count and top-k must match\n"
            "  -o, --output F   output file (required; written to a temp file, then renamed)\n"
            "  -q, --quiet      no progress on stderr\n"
            "  -h, --help       this text\n",
            GEN_DEFAULT_MIX, GEN_DEFAULT_SEED);
}

/* Writes the names of arch's presets ("tiny, 30b-a3b, ...") to buf; how many there are (0: an
 * unknown architecture). */
static uint32_t gen_preset_names(const char *arch, char *buf, size_t size)
{
    uint32_t n, found = 0;
    const struct gen_preset *p = gen_presets(&n);
    size_t len = 0;

    buf[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (strcmp(p[i].arch, arch))
            continue;
        int k = snprintf(buf + len, size - len, "%s%s", found ? ", " : "", p[i].name);
        if (k > 0 && (size_t)k < size - len)
            len += (size_t)k;
        found++;
    }
    return found;
}

static int gen_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int gen_usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "strata gen: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(strata gen --help lists the options)\n");
    va_end(ap);
    return 2;
}

struct gen_progress_state {
    bool tty;
    bool shown;      /* something was printed (short writes print nothing) */
    int last_decile; /* for non-terminal stderr: one line per 10% */
};

/* Prints percent and GB/s once the write has taken a second: on a terminal one updating line,
 * elsewhere one line per 10%. */
static void gen_progress(void *arg, uint64_t done, uint64_t total, double seconds)
{
    struct gen_progress_state *ps = arg;
    double pct = total ? 100.0 * (double)done / (double)total : 100.0;
    double gbs = seconds > 0 ? (double)done / seconds / 1e9 : 0.0;
    int decile = (int)(pct / 10);

    if (seconds < 1.0 && !ps->shown)
        return;
    if (!ps->tty && decile <= ps->last_decile)
        return;
    ps->shown = true;
    ps->last_decile = decile;
    fprintf(stderr, "%sgen: %5.1f%%  %.2f / %.2f GB  %.2f GB/s%s", ps->tty ? "\r" : "", pct,
            (double)done / 1e9, (double)total / 1e9, gbs, !ps->tty || done == total ? "\n" : "   ");
}

/* gen --inflate SMALL: grows SMALL to cfg's preset shapes. The exit code. */
static int gen_run_inflate(const struct gen_config *cfg, const char *inflate)
{
    struct gen_inflate_config ic = {
        .small_path = inflate, .target = cfg->preset, .mix = cfg->mix, .seed = cfg->seed,
        .noise = 1e-3f, .out_path = cfg->out_path,
    };
    struct gen_stats ist;
    if (gen_inflate(&ic, &ist))
        return cli_fail("gen --inflate");
    printf("wrote %s: %s inflated to %s shapes, %s, %" PRIu64 " tensors, %.4g GB of weights\n",
           cfg->out_path, inflate, cfg->preset.name, quant_mix_name(cfg->mix), ist.n_tensors,
           (double)ist.data_bytes / 1e9);
    return 0;
}

/* Writes the random checkpoint; SIGINT and SIGTERM cancel it (the temp file is removed). The
 * exit code. */
static int gen_run_write(struct gen_config *cfg, bool quiet)
{
    struct sigaction sa = {.sa_handler = gen_on_signal}, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    cfg->cancel = &gen_cancel;

    struct gen_stats st;
    int rc = gen_file_write(cfg, &st);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (rc)
        return cli_fail("gen");

    if (st.n_fallback && !quiet)
        fprintf(stderr,
                "strata gen: note: %" PRIu64 " tensors fell back to Q8_0/F32 because their "
                "rows are not a multiple of the mix type's block\n",
                st.n_fallback);
    printf("wrote %s: %s %s, %u layers, %" PRIu64 " tensors, %.4g M params, %.4g GB of "
           "weights, vocab %u, seed %" PRIu64 ", %u threads, %.1f s (%.2f GB/s)\n",
           cfg->out_path, cfg->preset.name, quant_mix_name(cfg->mix), cfg->preset.n_layer, st.n_tensors,
           (double)st.n_params / 1e6, (double)st.data_bytes / 1e9, st.n_vocab, cfg->seed,
           st.n_threads, st.seconds,
           st.seconds > 0 ? (double)st.data_bytes / st.seconds / 1e9 : 0.0);
    return 0;
}

int cmd_gen(int argc, char **argv)
{
    static const struct option opts[] = {
        {"arch", required_argument, NULL, 'a'},
        {"preset", required_argument, NULL, 'p'},
        {"quant", required_argument, NULL, 'm'},
        {"seed", required_argument, NULL, 's'},
        {"threads", required_argument, NULL, 't'},
        {"layers", required_argument, NULL, 'l'},
        {"mtp", required_argument, NULL, 'T'},
        {"vocab", required_argument, NULL, 'v'},
        {"inflate", required_argument, NULL, 'i'},
        {"output", required_argument, NULL, 'o'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *preset_name = GEN_DEFAULT_PRESET, *mix_name = GEN_DEFAULT_MIX;
    const char *inflate = NULL; /* --inflate SMALL */
    struct gen_config cfg = {.arch = GEN_DEFAULT_ARCH, .seed = GEN_DEFAULT_SEED};
    struct gen_progress_state ps = {.tty = isatty(STDERR_FILENO), .last_decile = -1};
    uint64_t layers = 0, mtp = 0;
    bool quiet = false, mtp_set = false;
    int c, threads;

    optind = 1;
    while ((c = getopt_long(argc, argv, "o:qh", opts, NULL)) != -1) {
        switch (c) {
        case 'a':
            cfg.arch = optarg;
            break;
        case 'p':
            preset_name = optarg;
            break;
        case 'm':
            mix_name = optarg;
            break;
        case 'i':
            inflate = optarg;
            break;
        case 'v':
            cfg.vocab_path = optarg;
            break;
        case 'o':
            cfg.out_path = optarg;
            break;
        case 'q':
            quiet = true;
            break;
        case 's':
            if (args_u64("gen", "--seed", optarg, 0, UINT64_MAX, &cfg.seed))
                return 2;
            break;
        case 't':
            if (args_threads("gen", "--threads", optarg, 1, 1024, &threads))
                return 2;
            cfg.n_threads = (uint32_t)threads;
            break;
        case 'l':
            if (args_u64("gen", "--layers", optarg, 1, 100000, &layers))
                return 2;
            break;
        case 'T':
            if (args_u64("gen", "--mtp", optarg, 0, 1, &mtp))
                return 2;
            mtp_set = true;
            break;
        case 'h':
            gen_usage(stdout);
            return 0;
        default:
            return gen_usage_error("bad option");
        }
    }
    if (optind < argc)
        return gen_usage_error("unexpected argument '%s'", argv[optind]);
    char known[256];
    if (!gen_preset_names(cfg.arch, known, sizeof(known)))
        return gen_usage_error(
            "unknown architecture '%s' (known: qwen3moe, gpt-oss, qwen3next, qwen35moe)", cfg.arch);
    if (strcmp(cfg.arch, "qwen3moe") && inflate)
        return gen_usage_error("--inflate grows qwen3moe models only");
    const struct gen_preset *preset = gen_preset_find_arch(cfg.arch, preset_name);
    if (!preset)
        return gen_usage_error("unknown preset '%s' for %s (known: %s)", preset_name, cfg.arch,
                               known);
    if (quant_mix_parse(mix_name, &cfg.mix))
        return gen_usage_error("%s", err_msg());
    if (!cfg.out_path)
        return gen_usage_error("missing output file: -o FILE");
    cfg.preset = *preset;
    if (layers)
        cfg.preset.n_layer = (uint32_t)layers;
    if (mtp_set && mtp && strcmp(cfg.arch, "qwen3next") && strcmp(cfg.arch, "qwen35moe"))
        return gen_usage_error("--mtp: only qwen3next and qwen35moe have MTP blocks");
    if (mtp_set)
        cfg.preset.n_nextn = (uint32_t)mtp;
    if (!quiet) {
        cfg.progress = gen_progress;
        cfg.progress_arg = &ps;
    }

    return inflate ? gen_run_inflate(&cfg, inflate) : gen_run_write(&cfg, quiet);
}
