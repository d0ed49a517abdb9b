/* strata convert: a Hugging Face checkpoint directory -> GGUF (tools/convert/convert.h). */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "convert.h"
#include "errors.h"
#include "quant.h"

#define CONVERT_DEFAULT_MIX "bf16"

static volatile sig_atomic_t convert_cancel;

static void convert_on_signal(int sig)
{
    (void)sig;
    convert_cancel = 1;
}

static void convert_usage(FILE *out)
{
    fprintf(out,
            "usage: strata convert HF_DIR -o FILE.gguf [options]\n\n"
            "Converts a Hugging Face checkpoint (config.json, model.safetensors or sharded\n"
            "model-*.safetensors with model.safetensors.index.json, tokenizer.json,\n"
            "tokenizer_config.json) into a GGUF file. Architectures: Qwen3MoeForCausalLM,\n"
            "GptOssForCausalLM, Qwen3NextForCausalLM, Qwen3_5MoeForCausalLM and\n"
            "Qwen3_5MoeForConditionalGeneration (the text model; vision weights are left\n"
            "out). Weights may be F32, BF16 or F16; experts per expert or fused\n"
            "(gate_up_proj); gpt-oss experts also as MXFP4 blocks (the published files).\n\n"
            "options:\n"
            "  -o, --output F   output file (required; written to a temp file, then renamed)\n"
            "  --quant MIX      f32, bf16, q8_0 or q4_k_m (default %s)\n"
            "                     f32     every tensor F32\n"
            "                     bf16    matrices BF16; norms and router F32\n"
            "                     q8_0    matrices Q8_0; norms and router F32\n"
            "                     q4_k_m  experts gate/up Q4_K, down Q6_K; attention Q8_0;\n"
            "                             token_embd Q4_K, output Q6_K; norms and router F32.\n"
            "                             A row length that is not a multiple of the block\n"
            "                             falls back to Q8_0, else F32.\n"
            "                   gpt-oss: experts F32 (f32), BF16 (bf16) or MXFP4 (q8_0,\n"
            "                   q4_k_m); biases and sinks F32\n"
            "  --threads N      OpenMP threads (default: OpenMP's default, all cores)\n"
            "  --name NAME      general.name (default: the directory's name)\n"
            "  --no-mtp         qwen3next / qwen35moe: drop the multi-token-prediction head\n"
            "                   (mtp.*): block_count = num_hidden_layers, no nextn key\n"
            "                   (default: keep it as llama.cpp does, as block\n"
            "                   num_hidden_layers with nextn.* tensors, block_count + 1,\n"
            "                   nextn_predict_layers 1; more than one MTP layer is refused)\n"
            "  --allow-unknown-keys\n"
            "                   convert a config.json with keys strata does not know (a warning\n"
            "                   per key) instead of refusing it (default: refuse; the keys\n"
            "                   strata knows: docs/convert-keys.md)\n"
            "  -q, --quiet      no progress on stderr\n"
            "  -h, --help       this text\n",
            CONVERT_DEFAULT_MIX);
}

static int convert_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int convert_usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "strata convert: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(strata convert --help lists the options)\n");
    va_end(ap);
    return 2;
}

struct convert_cli_state {
    bool quiet;
};

/* One line per tensor: index, name, type, shape, cumulative size. Notices always. */
static void convert_progress(void *arg, const struct convert_event *ev)
{
    const struct convert_cli_state *s = arg;

    if (ev->kind == CONVERT_EVENT_NOTICE || ev->kind == CONVERT_EVENT_WARNING) {
        fprintf(stderr, "strata convert: %s: %s\n",
                ev->kind == CONVERT_EVENT_WARNING ? "warning" : "note", ev->text);
        return;
    }
    if (s->quiet)
        return;
    char shape[96];
    int n = snprintf(shape, sizeof(shape), "{");
    for (uint32_t i = 0; i < ev->n_dims && n < (int)sizeof(shape); i++)
        n += snprintf(shape + n, sizeof(shape) - (size_t)n, "%s%llu", i ? ", " : "",
                      (unsigned long long)ev->ne[i]);
    if (n < (int)sizeof(shape))
        snprintf(shape + n, sizeof(shape) - (size_t)n, "}");
    fprintf(stderr, "[%4u/%4u] %-32s %-5s %-22s %8.1f / %.1f MB  %6.1f s%s\n", ev->index, ev->count,
            ev->name, quant_type_name(ev->type), shape, (double)ev->done_bytes / 1e6,
            (double)ev->total_bytes / 1e6, ev->seconds, ev->fell_back ? "  (fallback)" : "");
}

int cmd_convert(int argc, char **argv)
{
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'},
        {"quant", required_argument, NULL, 'm'},
        {"threads", required_argument, NULL, 't'},
        {"name", required_argument, NULL, 'n'},
        {"allow-unknown-keys", no_argument, NULL, 'u'},
        {"no-mtp", no_argument, NULL, 'M'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct convert_config cfg = {.cancel = &convert_cancel};
    struct convert_cli_state st = {0};
    struct convert_stats stats;
    const char *mix = CONVERT_DEFAULT_MIX;
    int v, c;

    optind = 1;
    while ((c = getopt_long(argc, argv, "o:qh", opts, NULL)) != -1) {
        switch (c) {
        case 'o':
            cfg.out_path = optarg;
            break;
        case 'm':
            mix = optarg;
            break;
        case 'n':
            cfg.name = optarg;
            break;
        case 't':
            if (args_threads("convert", "--threads", optarg, 1, ARGS_MAX_THREADS, &v))
                return 2;
            cfg.n_threads = (uint32_t)v;
            break;
        case 'u':
            cfg.allow_unknown_keys = true;
            break;
        case 'M':
            cfg.no_mtp = true;
            break;
        case 'q':
            st.quiet = true;
            break;
        case 'h':
            convert_usage(stdout);
            return 0;
        default:
            return convert_usage_error("bad option");
        }
    }
    if (optind != argc - 1)
        return convert_usage_error("give exactly one HF_DIR (got %d)", argc - optind);
    cfg.hf_dir = argv[optind];
    if (!cfg.out_path)
        return convert_usage_error("-o FILE is required");
    if (quant_mix_parse(mix, &cfg.mix))
        return convert_usage_error("%s", err_msg());
    cfg.progress = convert_progress;
    cfg.progress_arg = &st;

    struct sigaction sa = {.sa_handler = convert_on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int rc = convert_run(&cfg, &stats);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    if (rc)
        return cli_fail("convert");
    bool billions = stats.n_params >= 1000000000ull;
    fprintf(stderr,
            "strata convert: wrote %s: %s, %u tensors, %.2f %c params, %.1f MB, vocab %u, %u "
            "fallback%s, %.1f s\n",
            cfg.out_path, quant_mix_name(cfg.mix), stats.n_tensors,
            (double)stats.n_params / (billions ? 1e9 : 1e6), billions ? 'B' : 'M',
            (double)stats.data_bytes / 1e6, stats.n_vocab, stats.n_fallback,
            stats.n_fallback == 1 ? "" : "s", stats.seconds);
    return 0;
}
