/* strata: command-line entry point; dispatches to one subcommand per file in cli/. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "errors.h"
#include "outfile.h"
#include "strata_internal.h"

struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
};

static const struct command commands[] = {
    {"run", cmd_run, "generate text from a prompt"},
    {"chat", cmd_chat, "talk with a model in its chat template"},
    {"batch", cmd_batch, "generate for many prompts (JSON Lines) decoded together in lockstep"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server on the lockstep engine"},
    {"spec-replay", cmd_spec_replay, "a speculative draft source's acceptance on a fixed text"},
    {"inspect", cmd_inspect, "print a GGUF file's metadata, tensor table and byte counts"},
    {"gen", cmd_gen, "write a synthetic checkpoint with random, well-scaled weights"},
    {"convert", cmd_convert, "convert a Hugging Face checkpoint (safetensors) to GGUF"},
    {"logits", cmd_logits, "print or dump a prompt's logits and greedy tokens (for comparisons)"},
    {"bench", cmd_bench, "prompt and decode speed against the floor of measured bandwidth"},
    {"stats-routing", cmd_stats_routing,
     "expert popularity, reuse distance and next-layer prediction recall over texts"},
    {"profile", cmd_profile, "record a workload's experts (warmup) and show a residency profile"},
    {"info", cmd_info, "print this machine's CPU features, topology and libraries"},
    {"bench-kernels", cmd_bench_kernels,
     "CPU matvec per quant type against the measured host read bandwidth"},
};

static void usage(FILE *out)
{
    fprintf(out, "strata %s: Mixture-of-Experts inference beyond the GPU's memory\n\n"
                 "usage: strata COMMAND [options]   (strata COMMAND --help for its options)\n\n"
                 "commands:\n",
            STRATA_VERSION);
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(out, "  %-14s %s\n", commands[i].name, commands[i].summary);
}

int cli_fail(const char *what)
{
    fprintf(stderr, "strata: %s: %s\n", what, err_msg());
    return 1;
}

int cli_open_fail(void)
{
    switch (strata_failed_step()) {
    case STRATA_STEP_LOAD:
        return cli_fail("loading the model");
    case STRATA_STEP_BIND:
        return cli_fail("--bind");
    case STRATA_STEP_COPY:
        return cli_fail("copying the weights");
    case STRATA_STEP_CONFIG:
    case STRATA_STEP_ENGINE:
        break;
    }
    return cli_fail("starting the engine");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("strata %s\n", STRATA_VERSION);
        return 0;
    }
    /* SIGINT and SIGTERM remove half-written output files before the process ends */
    outfile_install_signal_cleanup();
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "strata: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
