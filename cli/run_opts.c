#include "run_opts.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "chat.h"
#include "clock.h"
#include "cli.h"
#include "cuda_info.h"
#include "errors.h"
#include "strata_internal.h"

void run_opts_init(struct run_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->n_ctx = 4096;
    o->n_batch = 512;
    o->think = true;
    o->device = "auto";
    o->residency = "copy";
    strata_generate_params_init(&o->gen);
    o->gen.n_predict = 128;
    o->gen.sampling.seed = 0xC0FFEE;
}

const char *run_opts_default_model(void)
{
    static const char *candidates[] = {STRATA_DEFAULT_MODEL, "models/strata-default.gguf"};
    for (size_t i = 0; i < sizeof(candidates) / sizeof(candidates[0]); i++) {
        if (access(candidates[i], R_OK) == 0)
            return candidates[i];
    }
    return NULL;
}

int run_opts_model(const char *cmd, const char **model)
{
    if (!*model)
        *model = run_opts_default_model();
    if (*model)
        return 0;
    fprintf(stderr, "strata %s: no -m FILE given and the default model (%s) is not present\n", cmd,
            STRATA_DEFAULT_MODEL);
    return 1;
}

static void run_opts_usage(const char *cmd)
{
    struct run_opts d;
    bool chat = strcmp(cmd, "chat") == 0;
    run_opts_init(&d);
    if (chat)
        d.gen.n_predict = RUN_CHAT_N_PREDICT;
    printf("usage: strata %s [-m FILE] %s[options]\n\n", cmd,
           strcmp(cmd, "run") ? "" : "-p PROMPT ");
    if (chat)
        printf("One message per line. In the session, /reset forgets the conversation and /exit\n"
               "(or Ctrl-D) quits; a message that no longer fits in the context (-c) is refused\n"
               "with a note, and the session goes on.\n\n");
    printf("model and machine:\n"
           "  -m, --model FILE        GGUF model (default: the shipped default model, %s)\n"
           "  -t, --threads N         CPU threads (default: all cores, except on --device cpu\n"
           "                          with 6 or more: the fastest of all, 3/4 and 1/2 of\n"
           "                          them, timed on the first decode steps, 1/2 not where\n"
           "                          cores run one thread each and 3/4 was clearly slower);\n"
           "                          with --device cuda they run the CPU expert lane\n"
           "                          (--cpu-threads is the same)\n"
           "  -c, --ctx-size N        context length in tokens (default %d)\n"
           "  -b, --batch-size N      prompt tokens per forward pass (default %d)\n"
           "      --device auto|cpu|cuda  backend (default %s: cuda when a GPU is present,\n"
           "                          with every weight on it if it fits, else under a\n"
           "                          budget of 90%% of its free memory; cpu otherwise)\n"
           "      --host-budget SIZE|auto|0  read the routed experts from the file into a\n"
           "                          host tier of SIZE (at least one layer's experts; auto:\n"
           "                          the memory available at start, the cgroup's limit\n"
           "                          counted, less a tenth and, on the CPU, the trunk; the\n"
           "                          default when the experts do not fit in that memory; 0:\n"
           "                          never), least recently used out, instead of the\n"
           "                          mapping (for a model larger than RAM): on --device\n"
           "                          cpu, for --placement static's CPU layers, and under\n"
           "                          --vram-budget for the expert cache, whose misses are\n"
           "                          copied on from the tier or computed there by the\n"
           "                          hybrid lane (copy residency); -v says how it reads\n"
           "      --host-io auto|uring|pread  how the tier reads (default auto: io_uring\n"
           "                          where it works)\n"
           "      --host-buffered     never O_DIRECT (default: O_DIRECT where the file system\n"
           "                          takes it)\n"
           "      --host-read-ahead   read the next layer's predicted experts while a layer\n"
           "                          computes (io_uring), as many as the disk, learned from\n"
           "                          the tier's reads, lands before that layer\n"
           "      --vram-budget SIZE  cap strata's GPU memory (e.g. 8G, 7.5GiB, 8000MB): the\n"
           "                          trunk and KV cache stay resident, experts live in pinned\n"
           "                          host memory and are cached in VRAM slots (implies\n"
           "                          --device cuda)\n"
           "      --residency copy|zerocopy|gpu  how expert-cache misses are served in\n"
           "                          decode: copied into slots before the layer runs, read\n"
           "                          in place over PCIe and cached between tokens, or\n"
           "                          looked up and copied by the GPU itself (no host sync,\n"
           "                          every call; each layer recycles the slot of its least\n"
           "                          used expert); giving it means --placement stream\n"
           "                          (default: auto's choice); gpu with --placement hybrid:\n"
           "                          the GPU's cache leaves its misses to the CPU lane\n"
           "                          inside the decode graph (bench/lane.md)\n"
           "      --placement auto|stream|hybrid|static|static:N  with --device cuda:\n"
           "                          auto (default) = experts cached in VRAM under\n"
           "                          --vram-budget, misses copied, read in place (decode\n"
           "                          as a CUDA graph), split with the CPU (hybrid),\n"
           "                          looked up and copied by the GPU (as a graph) or\n"
           "                          computed by the CPU inside that graph, whichever\n"
           "                          decodes fastest: zero-copy first, kept alone when\n"
           "                          its first decode steps miss little, else the GPU's\n"
           "                          cache and its CPU lane (hybrid where the lane cannot\n"
           "                          run) timed on the next decode steps (10 each; 6\n"
           "                          for one already over 25%% slower than the best; the\n"
           "                          GPU's cache, timed first while it fills, again last\n"
           "                          if the lane led it), again when the miss rate moves;\n"
           "                          the choice is printed\n"
           "                          (bench/lane.md); stream = the same cache, misses\n"
           "                          served as --residency says (%s unless given);\n"
           "                          hybrid = the cache, its\n"
           "                          misses split between PCIe and the CPU by measured\n"
           "                          bandwidths (bench/hybrid.md), or with --residency gpu\n"
           "                          computed by the CPU inside the GPU cache's decode\n"
           "                          graph; static:N = the experts\n"
           "                          of the first N layers on the CPU, the rest resident\n"
           "                          (llama.cpp --n-cpu-moe N); static = the smallest N\n"
           "                          that fits --vram-budget\n"
           "      --graph             record a decode step once as a CUDA graph and replay it:\n"
           "                          all resident, --residency gpu (with --prefetch too), or\n"
           "                          zerocopy (ignored with copy, zerocopy + --prefetch,\n"
           "                          hybrid or static, which sync per layer; --residency\n"
           "                          gpu --placement hybrid always replays a graph;\n"
           "                          --placement auto uses a graph for zero-copy and the\n"
           "                          GPU's cache, and with every weight resident for one\n"
           "                          stream's steps: --graph adds lockstep steps)\n"
           "      --no-graph          launch every decode step kernel by kernel\n"
           "      --streaming dma|kernel  how misses are copied into slots: a DMA copy per\n"
           "                          piece (default), or one gather kernel per batch reading\n"
           "                          host memory itself (no faster than DMA on the GPUs in\n"
           "                          bench/residency.md)\n"
           "      --prefetch          with --vram-budget: stream the experts layer l+1's router\n"
           "                          picks from layer l's input while layer l computes; in\n"
           "                          decode only for layers that missed in their last 8\n"
           "                          calls (off by default: it speeds prefill up, and decode\n"
           "                          by about nothing, bench/profiles.md); with --residency\n"
           "                          gpu at every call, copied beside the layer's work\n"
           "                          (slower than without on the models in bench/gpucache.md)\n"
           "      --prefetch-depth N  --prefetch for the next N layers (1-4): routers l+1..l+N\n"
           "                          applied to layer l's input; deeper predictions are\n"
           "                          dropped while the copies are behind\n"
           "      --prefetch-top M    --prefetch copying each token's M most likely predicted\n"
           "                          experts only (1-32; default half of the k chosen): the\n"
           "                          lesser ones are used least (--residency gpu: one-token\n"
           "                          steps; 32: all of them)\n"
           "      --profile FILE      restore a residency profile (strata profile warmup): the\n"
           "                          expert slots are filled with its experts, the most used\n"
           "                          first, before the first token, then its probe checks\n"
           "                          them (needs --vram-budget; bench/profiles.md)\n"
           "      --profile-freeze    pin the profile's frozen set (the share its warmup\n"
           "                          chose) for good; without it every restored expert only\n"
           "                          seeds the cache\n"
           "      --profile-optional  a profile that does not fit this model or run is\n"
           "                          reported and the cache starts cold\n"
           "      --stats             print the expert cache's per-layer table and the host\n"
           "                          tier's counts at exit (CUDA, or --host-budget)\n"
           "      --stats-json FILE   write that table as JSON\n"
           "      --bind              bind the CPU threads one per physical core (hwloc), on\n"
           "                          the GPU's NUMA node with --device cuda\n"
           "      --no-mmap           copy the weights into anonymous memory on huge pages\n"
           "                          (more RAM, faster CPU decode than the page cache)\n"
           "      --no-mtp            leave the model's multi-token-prediction block unloaded\n"
           "                          (qwen3next, qwen35moe; only --spec mtp uses it)\n",
           STRATA_DEFAULT_MODEL, d.n_ctx, d.n_batch, d.device, d.residency);
    if (chat)
        printf("messages (read from stdin, one a line; chat takes no -p or -f):\n"
               "      --system TEXT       system message, sent before the first message\n"
               "      --no-think          Qwen3, Qwen3.5: pre-fill an empty <think></think> block\n"
               "                          (Qwen3.5 otherwise opens the reply with <think>);\n"
               "                          gpt-oss: reasoning effort low (default medium)\n"
               "      --hide-reasoning    gpt-oss: do not print the analysis channel (default:\n"
               "                          printed, dimmed on a terminal)\n");
    else
        printf("prompt:\n"
               "  -p, --prompt TEXT       prompt text\n"
               "  -f, --file FILE         read the prompt from FILE (a file or a pipe; - is\n"
               "                          stdin); prompts are UTF-8 text; a NUL byte is refused,\n"
               "                          other invalid UTF-8 is kept as bytes (the byte-level\n"
               "                          tokenizer encodes any byte)\n"
               "      --chat              wrap the prompt in the model's chat template (ChatML;\n"
               "                          qwen35moe: Qwen3.5's; gpt-oss: harmony, its reply\n"
               "                          split into channels)\n"
               "      --system TEXT       system message for --chat and strata chat\n"
               "      --no-think          Qwen3, Qwen3.5: pre-fill an empty <think></think> block\n"
               "                          (Qwen3.5 otherwise opens the reply with <think>);\n"
               "                          gpt-oss: reasoning effort low (default medium)\n"
               "      --hide-reasoning    gpt-oss with --chat: do not print the analysis channel\n"
               "                          (default: printed, dimmed on a terminal)\n");
    printf("generation (a model file's general.sampling.* keys replace these defaults for the\n"
           "flags not given; --verbose prints the settings used):\n"
           "  -n, --n-predict N       tokens to generate (default %d)\n"
           "      --temp T            temperature, 0 = greedy (default %.2f)\n"
           "      --top-k K           0 = off (default %d)\n"
           "      --top-p P           1 = off (default %.2f)\n"
           "      --min-p P           0 = off (default %.2f)\n"
           "      --repeat-penalty R  1 = off (default %.2f)\n"
           "      --repeat-last-n N   tokens the penalty looks back (default %d)\n"
           "  -s, --seed S            sampling seed (default: a random one, which run prints\n"
           "                          after the generation and chat with --verbose)\n"
           "      --stop TEXT         stop when TEXT is generated (up to %d)\n"
           "      --ignore-eos        do not stop at end-of-generation tokens\n"
           "      --spec none|ngram|draft|mtp\n"
           "                          speculative decoding: drafted tokens are verified with\n"
           "                          the next token in one forward pass; greedy output is\n"
           "                          unchanged, sampled output keeps its distribution.\n"
           "                          ngram: the tokens that followed the latest earlier\n"
           "                          occurrence of the last 3..2 tokens (prompt lookup);\n"
           "                          draft: the greedy tokens of --draft-model;\n"
           "                          mtp: the greedy tokens of the model's own MTP block\n"
           "                          (qwen3next, qwen35moe files with one) (default none)\n"
           "      --draft-max K       drafted tokens per pass at most, adapting below it to\n"
           "                          the acceptance rate (default 8 with --spec)\n"
           "      --draft-ngram N     longest suffix looked up, 2..8 (default 3)\n"
           "      --lookahead drafts|always|off\n"
           "                          under --vram-budget (copy and hybrid placements): where\n"
           "                          the text's last tokens appeared before, copy into VRAM\n"
           "                          ahead of the forward the experts each layer chose\n"
           "                          there: before the verify passes of --spec ngram\n"
           "                          (drafts, the default), before every decode step too\n"
           "                          (always), or never (off)\n"
           "  -md, --draft-model F    the draft model of --spec draft: a small GGUF with the\n"
           "                          same vocabulary (checked token by token)\n"
           "      --draft-device D    where the draft model runs: auto, cpu or cuda (default\n"
           "                          auto: the GPU when there is one; all its weights\n"
           "                          resident, outside --vram-budget)\n"
           "  -v, --verbose           print model and timing details\n",
           d.gen.n_predict, d.gen.sampling.temperature, d.gen.sampling.top_k, d.gen.sampling.top_p,
           d.gen.sampling.min_p, d.gen.sampling.repeat_penalty, d.gen.sampling.repeat_last_n,
           STRATA_MAX_STOP);
    if (!strcmp(cmd, "run"))
        printf("\nA prompt that takes over 2 s to evaluate shows its progress on stderr; Ctrl-C\n"
               "stops the prompt or the generation after the current step (exit 130).\n");
}

static bool opt_is(const char *arg, const char *a, const char *b)
{
    return !strcmp(arg, a) || (b && !strcmp(arg, b));
}

#define IS(a, b) opt_is(arg, a, b)

static bool run_opts_word_in(const char *list, const char *a)
{
    size_t n = strlen(a);
    for (const char *w = list; *w; w += strspn(w, " ")) {
        size_t len = strcspn(w, " ");
        if (len == n && !strncmp(w, a, n))
            return true;
        w += len;
    }
    return false;
}

bool run_opts_flag_in(const char *with_value, const char *bare, const char *a,
                      bool *takes_value)
{
    *takes_value = run_opts_word_in(with_value, a);
    return *takes_value || run_opts_word_in(bare, a);
}

bool run_opts_is_cuda_only(const char *arg)
{
    static const char *const cuda_only[] = {"--graph",      "--prefetch",       "--stats",
                                            "--stats-json", "--residency",      "--streaming",
                                            "--placement",  "--prefetch-depth", "--prefetch-top"};
    for (size_t i = 0; i < sizeof(cuda_only) / sizeof(cuda_only[0]); i++)
        if (!strcmp(arg, cuda_only[i]))
            return true;
    return false;
}

bool run_opts_uses_cpu(const char *device)
{
    return !strcmp(device, "cpu") || (!strcmp(device, "auto") && cuda_device_count(NULL) <= 0);
}

int run_opts_cuda_only(const char *cmd, const char *flag, const char *device)
{
    if (!flag || !run_opts_uses_cpu(device))
        return 0;
    fprintf(stderr,
            "strata %s: %s needs the CUDA backend (--device cuda); this run uses the CPU%s\n", cmd,
            flag, strcmp(device, "auto") ? "" : " (no CUDA device found)");
    return 2;
}

int run_opts_parse(struct run_opts *o, int argc, char **argv, const char *cmd)
{
    struct strata_sampling *sc = &o->gen.sampling;

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0, used = 1;

        if (IS("-h", "--help")) {
            run_opts_usage(cmd);
            return 1;
        } else if (IS("--chat", NULL) && !strcmp(cmd, "chat")) {
            fprintf(stderr, "strata chat: --chat is an option of strata run; chat always "
                            "renders its messages with the model's chat template\n");
            return 2;
        } else if (IS("--chat", NULL)) {
            o->chat_template = true, used = 0;
        } else if (IS("--no-think", NULL)) {
            o->think = false, used = 0;
        } else if (IS("--think", NULL)) {
            o->think = true, used = 0;
        } else if (IS("--hide-reasoning", NULL)) {
            o->hide_reasoning = true, used = 0;
        } else if (IS("--ignore-eos", NULL)) {
            o->gen.ignore_eos = true, used = 0;
        } else if (IS("--bind", NULL)) {
            o->bind = true, used = 0;
        } else if (IS("--no-mmap", NULL)) {
            o->no_mmap = true, used = 0;
        } else if (IS("--no-mtp", NULL)) {
            o->no_mtp = true, used = 0;
        } else if (IS("--host-buffered", NULL)) {
            o->host_buffered = true, used = 0;
        } else if (IS("--host-read-ahead", NULL)) {
            o->host_ahead = true, used = 0;
        } else if (IS("-v", "--verbose")) {
            o->verbose = true, used = 0;
        } else if (IS("--stats", NULL)) {
            o->stats = true, used = 0;
        } else if (IS("--prefetch", NULL)) {
            o->prefetch = true, used = 0;
        } else if (IS("--graph", NULL)) {
            o->graph = true, used = 0;
        } else if (IS("--no-graph", NULL)) {
            o->no_graph = true, used = 0;
        } else if (IS("--profile-freeze", NULL)) {
            o->profile_freeze = true, used = 0;
        } else if (IS("--profile-optional", NULL)) {
            o->profile_optional = true, used = 0;
        } else if (v && (IS("-p", "--prompt") || IS("-f", "--file")) && !strcmp(cmd, "chat")) {
            fprintf(stderr, "strata chat: %s: chat takes no prompt; it reads one message per "
                            "line from stdin (strata run -p TEXT generates from a prompt)\n",
                    arg);
            return 2;
        } else if (!v) {
            fprintf(stderr, "strata %s: %s needs a value (or is unknown; see --help)\n", cmd,
                    arg);
            return 2;
        } else if (IS("-m", "--model")) {
            o->model = v;
        } else if (IS("-p", "--prompt")) {
            o->prompt = v;
        } else if (IS("-f", "--file")) {
            o->prompt_file = v;
        } else if (IS("--system", NULL)) {
            o->system = v;
        } else if (IS("--device", NULL)) {
            o->device = v;
            o->device_set = true;
        } else if (IS("--vram-budget", NULL)) {
            rc = args_size(cmd, arg, v, 1, UINT64_MAX, &o->vram_budget);
        } else if (IS("--host-budget", NULL)) {
            rc = !strcmp(v, "auto") ? (o->host_budget = STRATA_HOST_BUDGET_AUTO, 0)
                 : !strcmp(v, "0")  ? (o->host_budget = 0, o->no_host_tier = true, 0)
                                    : args_size(cmd, arg, v, 1, UINT64_MAX - 1, &o->host_budget);
        } else if (IS("--host-io", NULL)) {
            if (strcmp(v, "auto") && strcmp(v, "uring") && strcmp(v, "pread")) {
                fprintf(stderr, "strata %s: --host-io auto, uring or pread, not '%s'\n", cmd, v);
                return 2;
            }
            o->host_io = v;
        } else if (IS("--placement", NULL)) {
            if ((rc = run_opts_placement(v, cmd, &o->cpu_moe_layers, &o->hybrid, &o->stream)))
                return rc;
            if (!o->device_set)
                o->device = "cuda";
        } else if (IS("--streaming", NULL)) {
            if (strcmp(v, "dma") && strcmp(v, "kernel")) {
                fprintf(stderr, "strata %s: --streaming must be dma or kernel, not '%s'\n", cmd,
                        v);
                return 2;
            }
            o->gather = !strcmp(v, "kernel");
        } else if (IS("--residency", NULL)) {
            int mode;
            if ((rc = run_opts_residency(v, cmd, &mode)))
                return rc;
            o->residency = v;
            o->residency_set = true;
        } else if (IS("--stats-json", NULL)) {
            o->stats_json = v;
        } else if (IS("--profile", NULL)) {
            o->profile = v;
        } else if (IS("--prefetch-depth", NULL)) {
            rc = args_i32(cmd, arg, v, 1, 4, &o->prefetch_depth);
            o->prefetch = true;
        } else if (IS("--prefetch-top", NULL)) {
            rc = args_i32(cmd, arg, v, 1, 32, &o->prefetch_top);
            o->prefetch = true;
        } else if (IS("-t", "--threads") || IS("--cpu-threads", NULL)) {
            rc = args_threads(cmd, arg, v, 1, ARGS_MAX_THREADS, &o->n_threads);
        } else if (IS("-c", "--ctx-size")) {
            rc = args_i32(cmd, arg, v, 16, 1 << 20, &o->n_ctx);
            o->ctx_set = true;
        } else if (IS("-b", "--batch-size")) {
            rc = args_i32(cmd, arg, v, 1, 65536, &o->n_batch);
        } else if (IS("-n", "--n-predict")) {
            rc = args_i32(cmd, arg, v, 0, 1 << 20, &o->gen.n_predict);
        } else if (IS("--temp", NULL)) {
            rc = args_f32(cmd, arg, v, 0, 100, &sc->temperature);
            o->sampling_set |= STRATA_SAMPLING_TEMP;
        } else if (IS("--top-k", NULL)) {
            rc = args_i32(cmd, arg, v, 0, 1 << 24, &sc->top_k);
            o->sampling_set |= STRATA_SAMPLING_TOP_K;
        } else if (IS("--top-p", NULL)) {
            rc = args_f32(cmd, arg, v, 0, 1, &sc->top_p);
            o->sampling_set |= STRATA_SAMPLING_TOP_P;
        } else if (IS("--min-p", NULL)) {
            rc = args_f32(cmd, arg, v, 0, 1, &sc->min_p);
            o->sampling_set |= STRATA_SAMPLING_MIN_P;
        } else if (IS("--repeat-penalty", NULL)) {
            rc = args_f32(cmd, arg, v, 0.01f, 100, &sc->repeat_penalty);
            o->sampling_set |= STRATA_SAMPLING_REPEAT_PENALTY;
        } else if (IS("--repeat-last-n", NULL)) {
            rc = args_i32(cmd, arg, v, 0, 1 << 20, &sc->repeat_last_n);
            o->sampling_set |= STRATA_SAMPLING_REPEAT_LAST_N;
        } else if (IS("--spec", NULL)) {
            if (!strcmp(v, "none") || !strcmp(v, "ngram") || !strcmp(v, "draft") ||
                !strcmp(v, "mtp")) {
                o->spec_ngram = !strcmp(v, "ngram");
                o->spec_draft = !strcmp(v, "draft");
                o->spec_mtp = !strcmp(v, "mtp");
            } else {
                rc = args_fail(cmd, arg, v, "none, ngram, draft or mtp");
            }
        } else if (IS("-md", "--draft-model")) {
            o->draft_model = v;
        } else if (IS("--draft-device", NULL)) {
            if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "cuda"))
                rc = args_fail(cmd, arg, v, "auto, cpu or cuda");
            o->draft_device = v;
        } else if (IS("--draft-max", NULL)) {
            rc = args_i32(cmd, arg, v, 1, 64, &o->gen.draft_max);
            o->draft_max_set = true;
        } else if (IS("--draft-ngram", NULL)) {
            rc = args_i32(cmd, arg, v, 2, 8, &o->gen.draft_ngram);
        } else if (IS("--lookahead", NULL)) {
            if (!strcmp(v, "drafts"))
                o->gen.lookahead = STRATA_LOOKAHEAD_DRAFTS;
            else if (!strcmp(v, "always"))
                o->gen.lookahead = STRATA_LOOKAHEAD_ALWAYS;
            else if (!strcmp(v, "off"))
                o->gen.lookahead = STRATA_LOOKAHEAD_OFF;
            else
                rc = args_fail(cmd, arg, v, "drafts, always or off");
        } else if (IS("-s", "--seed")) {
            rc = args_u64(cmd, arg, v, 0, UINT64_MAX, &sc->seed);
            o->seed_set = true;
        } else if (IS("--stop", NULL)) {
            if (o->gen.n_stop == STRATA_MAX_STOP) {
                fprintf(stderr, "strata: at most %d --stop strings\n", STRATA_MAX_STOP);
                return 2;
            }
            o->gen.stop[o->gen.n_stop++] = v;
        } else {
            fprintf(stderr, "strata %s: unknown option '%s' (see --help)\n", cmd, arg);
            return 2;
        }
        if (rc)
            return rc;
        if (!o->cuda_flag && run_opts_is_cuda_only(arg) && strcmp(arg, "--stats"))
            o->cuda_flag = arg;
        i += used;
    }
    /* --stats prints the host tier's counts on the CPU too */
    if (!o->cuda_flag && o->stats && !o->host_budget)
        o->cuda_flag = "--stats";
    return run_opts_check(o, cmd);
}

int run_opts_check(struct run_opts *o, const char *cmd)
{
    const bool spec = o->spec_ngram || o->spec_draft || o->spec_mtp;
    if (o->draft_max_set && !spec) {
        fprintf(stderr,
                "strata %s: --draft-max applies to speculative decoding: add --spec "
                "ngram, draft or mtp\n",
                cmd);
        return 2;
    }
    if (o->spec_draft != (o->draft_model != NULL)) {
        fprintf(stderr, "strata %s: %s\n", cmd,
                o->spec_draft ? "--spec draft needs --draft-model FILE (-md)"
                              : "--draft-model is the draft model of --spec draft: add it");
        return 2;
    }
    if (o->draft_device && !o->spec_draft) {
        fprintf(stderr, "strata %s: --draft-device applies to --spec draft\n", cmd);
        return 2;
    }
    if (!spec)
        o->gen.draft_max = 0;
    else if (!o->draft_max_set)
        o->gen.draft_max = 8;
    if (strcmp(o->device, "cpu") && strcmp(o->device, "cuda") && strcmp(o->device, "auto")) {
        fprintf(stderr, "strata %s: --device must be auto, cpu or cuda, not '%s'\n", cmd,
                o->device);
        return 2;
    }
    if (o->device_set && !strcmp(o->device, "cpu") && o->cuda_flag)
        return run_opts_cuda_only(cmd, o->cuda_flag, o->device);
    if ((o->host_io || o->host_buffered || o->host_ahead) && !o->host_budget) {
        fprintf(stderr, "strata %s: --host-io, --host-buffered and --host-read-ahead need "
                        "--host-budget\n", cmd);
        return 2;
    }
    if (o->host_budget && !o->cpu_moe_layers && !o->vram_budget &&
        (!o->device_set || strcmp(o->device, "cpu"))) {
        fprintf(stderr,
                "strata %s: --host-budget runs on the CPU device, or on CUDA under "
                "--vram-budget (the expert cache) or with --placement static: add one of "
                "--device cpu, --vram-budget or --placement static\n",
                cmd);
        return 2;
    }
    if (o->host_budget && o->vram_budget && !o->cpu_moe_layers && o->residency &&
        strcmp(o->residency, "copy")) {
        fprintf(stderr,
                "strata %s: --host-budget under the expert cache copies its misses from the "
                "tier into VRAM: not with --residency %s, whose kernels read experts from "
                "host memory at any time\n",
                cmd, o->residency);
        return 2;
    }
    if (o->host_budget && o->no_mmap) {
        fprintf(stderr, "strata %s: --host-budget reads experts from the file; --no-mmap "
                        "copies them all to memory\n", cmd);
        return 2;
    }
    if ((o->vram_budget || o->cpu_moe_layers) && o->device_set && strcmp(o->device, "cuda")) {
        fprintf(stderr, "strata %s: --vram-budget and --placement need --device cuda\n", cmd);
        return 2;
    }
    if (o->hybrid && !o->vram_budget) {
        fprintf(stderr, "strata %s: --placement hybrid needs --vram-budget\n", cmd);
        return 2;
    }
    if (o->cpu_moe_layers < 0 && !o->vram_budget) {
        fprintf(stderr, "strata %s: --placement static picks N from --vram-budget: give one, "
                        "or static:N\n", cmd);
        return 2;
    }
    if ((o->profile_freeze || o->profile_optional) && !o->profile) {
        fprintf(stderr, "strata %s: --profile-freeze and --profile-optional go with --profile "
                        "FILE\n", cmd);
        return 2;
    }
    if (o->profile && !o->vram_budget && !o->profile_optional) {
        fprintf(stderr, "strata %s: --profile restores experts into the expert cache, which "
                        "needs --vram-budget\n", cmd);
        return 2;
    }
    if (o->vram_budget)
        o->device = "cuda";
    return run_opts_cuda_only(cmd, o->cuda_flag, o->device);
}

int run_opts_placement(const char *v, const char *cmd, int *out, bool *hybrid, bool *stream)
{
    long long n;
    *hybrid = false;
    *stream = false;
    if (!strcmp(v, "auto")) {
        *out = 0;
    } else if (!strcmp(v, "stream")) {
        *out = 0;
        *stream = true;
    } else if (!strcmp(v, "hybrid")) {
        *out = 0;
        *hybrid = true;
    } else if (!strcmp(v, "static")) {
        *out = -1;
    } else if (!strncmp(v, "static:", 7) && args_parse_int(v + 7, 1, 1 << 20, &n)) {
        *out = (int)n;
    } else {
        fprintf(stderr,
                "strata %s: --placement must be auto, stream, hybrid, static or "
                "static:N (N >= 1), not '%s'\n",
                cmd, v);
        return 2;
    }
    return 0;
}

enum strata_placement run_opts_placement_pick(int cpu_moe_layers, bool hybrid, bool stream,
                                              bool residency_set, bool prefetch)
{
    return hybrid                                ? STRATA_PLACEMENT_HYBRID
           : cpu_moe_layers                      ? STRATA_PLACEMENT_STATIC
           : stream || residency_set || prefetch ? STRATA_PLACEMENT_STREAM
                                                 : STRATA_PLACEMENT_AUTO;
}

int run_opts_residency(const char *v, const char *cmd, int *out)
{
    if (!strcmp(v, "copy"))
        *out = STRATA_FILL_COPY;
    else if (!strcmp(v, "zerocopy"))
        *out = STRATA_FILL_ZEROCOPY;
    else if (!strcmp(v, "gpu"))
        *out = STRATA_FILL_GPU;
    else {
        fprintf(stderr, "strata %s: --residency must be copy, zerocopy or gpu, not '%s'\n", cmd, v);
        return 2;
    }
    return 0;
}

void run_opts_config(const struct run_opts *o, const char *path, struct strata_config *cfg)
{
    int fill = STRATA_FILL_COPY;

    strata_config_init(cfg);
    cfg->model_path = path;
    cfg->device = !strcmp(o->device, "cpu")    ? STRATA_DEVICE_CPU
                  : !strcmp(o->device, "cuda") ? STRATA_DEVICE_CUDA
                                               : STRATA_DEVICE_AUTO;
    cfg->vram_budget = o->vram_budget;
    cfg->host_budget = o->host_budget;
    cfg->placement = run_opts_placement_pick(o->cpu_moe_layers, o->hybrid, o->stream,
                                             o->residency_set, o->prefetch);
    if (o->cpu_moe_layers)
        cfg->cpu_moe_layers = o->cpu_moe_layers;
    run_opts_residency(o->residency, "run", &fill);
    cfg->fill = (enum strata_fill)fill;
    cfg->flags = (o->graph ? STRATA_FLAG_GRAPH : 0) | (o->no_graph ? STRATA_FLAG_NO_GRAPH : 0) |
                 (o->prefetch ? STRATA_FLAG_PREFETCH : 0) | (o->gather ? STRATA_FLAG_GATHER : 0) |
                 (o->no_mmap ? STRATA_FLAG_NO_MMAP : 0) | (o->no_mtp ? STRATA_FLAG_NO_MTP : 0) |
                 (o->bind ? STRATA_FLAG_BIND : 0) |
                 (o->profile_freeze ? STRATA_FLAG_PROFILE_FREEZE : 0) |
                 (o->profile_optional ? STRATA_FLAG_PROFILE_OPTIONAL : 0) |
                 (o->host_io && !strcmp(o->host_io, "pread") ? STRATA_FLAG_NO_URING : 0) |
                 (o->host_buffered ? STRATA_FLAG_NO_DIRECT : 0) |
                 (o->host_ahead ? STRATA_FLAG_READ_AHEAD : 0) |
                 (o->no_host_tier ? STRATA_FLAG_NO_HOST_TIER : 0);
    cfg->profile = o->profile;
    cfg->prefetch_depth = o->prefetch_depth;
    cfg->prefetch_top = o->prefetch_top;
    cfg->n_threads = o->n_threads;
    cfg->n_ctx = o->n_ctx;
    cfg->n_batch = o->n_batch;
    cfg->log = stderr;
}

int run_profile_check(struct strata *s, const char *path)
{
    struct strata_profile_status ps;
    struct strata_probe_report r;

    strata_profile_status(s, &ps);
    if (!ps.restored)
        return 0; /* --profile-optional said why */
    int rc = strata_profile_probe(s, &r);
    if (rc)
        return rc;
    if (!r.compared)
        fprintf(stderr, "strata: %s: the probe was not compared: %s\n", path, r.why);
    else if (r.match)
        fprintf(stderr, "strata: %s: probe ok: %d greedy tokens equal those of the warmup\n",
                path, r.n);
    else if (r.exact)
        fprintf(stderr,
                "strata: error: %s: probe FAILED: greedy token %d of %d differs from the "
                "warmup's, and this backend computes every expert with the same kernels: the "
                "restored cache serves wrong bytes (please report it)\n",
                path, r.diff_at, r.n);
    else
        fprintf(stderr,
                "strata: %s: probe: greedy token %d of %d differs from the warmup's (the CPU "
                "lane agrees with the GPU within tolerance, not bit for bit)\n",
                path, r.diff_at, r.n);
    return 0;
}

int run_chat_format(const struct run_session *s)
{
    struct strata_model_info mi;
    strata_model_info(s->s, &mi);
    return chat_format_of_arch(mi.arch);
}

const char *run_today(char *buf, size_t size)
{
    time_t now = time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm) || !strftime(buf, size, "%Y-%m-%d", &tm))
        snprintf(buf, size, "unknown");
    return buf;
}

/* Prints a harmony reply's text: the final channel as is, the others (reasoning) dimmed on a
 * terminal or hidden; the answer starts on a line of its own after reasoning. */
static void run_harmony_emit(void *ctx, const char *channel, const char *text, size_t len)
{
    struct run_harmony_out *o = ctx;
    bool final = !strcmp(channel, "final"), tty = isatty(STDOUT_FILENO);
    if (!final && o->hide)
        return;
    if (final && o->last == 1)
        fputc('\n', stdout);
    if (!final && tty)
        fputs("\033[2m", stdout);
    fwrite(text, 1, len, stdout);
    if (!final && tty)
        fputs("\033[0m", stdout);
    o->last = final ? 2 : 1;
    fflush(stdout);
}

void run_harmony_start(struct chat_harmony *h, struct run_harmony_out *out, bool hide)
{
    *out = (struct run_harmony_out){.hide = hide};
    chat_harmony_init(h, run_harmony_emit, out);
}

int run_open_draft(const char *path, const char *device, int n_threads, int n_ctx, bool verbose,
                   const struct strata *target, struct strata **draft,
                   struct strata_drafter **drafter)
{
    struct strata_config cfg;
    const char *dev = device ? device : "auto";
    struct strata_model_info mi;

    strata_config_init(&cfg);
    cfg.model_path = path;
    cfg.device = !strcmp(dev, "cpu")    ? STRATA_DEVICE_CPU
                 : !strcmp(dev, "cuda") ? STRATA_DEVICE_CUDA
                                        : STRATA_DEVICE_AUTO;
    cfg.n_threads = n_threads;
    cfg.n_ctx = n_ctx;
    cfg.log = verbose ? stderr : NULL;
    if (strata_open(&cfg, draft) || strata_drafter_open(*draft, target, n_ctx, drafter))
        return cli_fail("--draft-model");
    strata_model_info(*draft, &mi);
    if (verbose)
        fprintf(stderr, "strata: draft model %s: %s, %u layers, d %u; backend %s\n", path,
                mi.arch, mi.n_layer, mi.n_embd, mi.device);
    return 0;
}

void run_session_spec(const struct run_session *s, struct strata_generate_params *p)
{
    if (s->drafter) {
        /* drafts as the greedy sampler would pick them, penalty included; if that cannot be
         * set (out of memory) the drafts are the plain argmax, which changes no output */
        strata_drafter_set_penalty(s->drafter, p->sampling.repeat_penalty,
                                   p->sampling.repeat_last_n);
        p->draft_fn = strata_drafter_draft;
        p->draft_ctx = s->drafter;
    } else if (s->mtp) {
        p->draft_fn = strata_mtp_draft;
        p->draft_ctx = s->mtp;
    }
}

uint64_t run_random_seed(void)
{
    uint64_t seed;
    if (getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed))
        seed = (uint64_t)(clock_now_s() * 1e9) ^ ((uint64_t)getpid() << 32);
    return seed;
}

void run_opts_sampling_take(struct run_opts *o, const struct strata_sampling *f, unsigned mask)
{
    struct strata_sampling *sc = &o->gen.sampling;
    unsigned got = mask & ~o->sampling_set;
    if (got & STRATA_SAMPLING_TEMP)
        sc->temperature = f->temperature;
    if (got & STRATA_SAMPLING_TOP_K)
        sc->top_k = f->top_k;
    if (got & STRATA_SAMPLING_TOP_P)
        sc->top_p = f->top_p;
    if (got & STRATA_SAMPLING_MIN_P)
        sc->min_p = f->min_p;
    if (got & STRATA_SAMPLING_REPEAT_PENALTY)
        sc->repeat_penalty = f->repeat_penalty;
    if (got & STRATA_SAMPLING_REPEAT_LAST_N)
        sc->repeat_last_n = f->repeat_last_n;
    if (got && o->verbose)
        fprintf(stderr,
                "strata: sampling defaults from the model file: temp %.2f, top-k %d, top-p "
                "%.2f, min-p %.2f, repeat-penalty %.2f, repeat-last-n %d\n",
                sc->temperature, sc->top_k, sc->top_p, sc->min_p, sc->repeat_penalty,
                sc->repeat_last_n);
}

void run_opts_sampling(struct run_opts *o, const struct strata *st, bool random_seed)
{
    struct strata_sampling *sc = &o->gen.sampling, f = *sc;
    run_opts_sampling_take(o, &f, strata_sampling_from_model(st, &f));
    if (random_seed && !o->seed_set)
        sc->seed = run_random_seed();
    if (o->verbose)
        fprintf(stderr, "strata: sampling seed %llu\n", (unsigned long long)sc->seed);
}

int run_session_open(const struct run_opts *o, struct run_session *s)
{
    const char *path = o->model ? o->model : run_opts_default_model();
    struct strata_config cfg;
    struct strata_model_info mi;
    struct strata_stats ss;
    double t0 = clock_now_s();
    int node;

    memset(s, 0, sizeof(*s));
    if (!path) {
        fprintf(stderr, "strata: no -m FILE given and the default model (%s) is not present\n",
                STRATA_DEFAULT_MODEL);
        return 1;
    }
    run_opts_config(o, path, &cfg);
    if (strata_load(&cfg, &s->s))
        return cli_open_fail();
    int bound = strata_bound_threads(s->s, &node);
    if (bound && o->verbose)
        fprintf(stderr, "strata: %d threads bound one per core (NUMA node %d)\n", bound, node);
    strata_model_info(s->s, &mi);
    if (!mi.has_tokenizer) {
        fprintf(stderr, "strata: %s has no tokenizer (tokenizer.ggml.* keys)\n", path);
        run_session_close(s);
        return 1;
    }
    s->stats = o->stats;
    s->stats_json = o->stats_json;
    if (strata_start(s->s)) {
        run_session_close(s);
        return cli_fail("starting the engine");
    }
    if (o->profile && run_profile_check(s->s, o->profile)) {
        run_session_close(s);
        return cli_fail("the profile's probe");
    }
    if (strata_stream_open(s->s, o->n_ctx, &s->stream)) {
        run_session_close(s);
        return cli_fail("starting the engine");
    }
    if (o->draft_model && run_open_draft(o->draft_model, o->draft_device, o->n_threads, o->n_ctx,
                                         o->verbose, s->s, &s->draft, &s->drafter)) {
        run_session_close(s);
        return 1;
    }
    if (o->spec_mtp && strata_mtp_open(s->stream, &s->mtp)) {
        run_session_close(s);
        return cli_fail("--spec mtp");
    }
    strata_model_info(s->s, &mi);
    if (o->ctx_set && mi.n_ctx_train && (uint32_t)o->n_ctx > mi.n_ctx_train)
        fprintf(stderr,
                "strata: warning: -c %d is above the %u tokens %s was trained on; past them "
                "the output may degrade\n",
                o->n_ctx, mi.n_ctx_train, path);
    if (o->verbose) {
        fprintf(stderr,
                "strata: %s: %s, %u layers, d %u, %u/%u heads of %u, %u experts (top %u) of "
                "ffn %u, vocab %u; backend %s, %d threads; loaded in %.2f s\n",
                path, mi.arch, mi.n_layer, mi.n_embd, mi.n_head, mi.n_head_kv, mi.head_dim,
                mi.n_expert, mi.n_expert_used, mi.n_ff_exp, mi.n_vocab, mi.device, mi.n_threads,
                clock_now_s() - t0);
    }
    if (!strcmp(mi.device, "cuda")) {
        strata_get_stats(s->s, &ss);
        fprintf(stderr, "strata: cuda: %.2f GiB of VRAM in use (weights, KV cache, scratch)\n",
                ss.vram_bytes / 1073741824.0);
    }
    return 0;
}

void run_session_close(struct run_session *s)
{
    if (s->s) { /* the expert cache's statistics: nothing without one */
        if (s->stats)
            strata_print_cache_stats(s->s, stderr);
        if (s->stats_json && strata_write_cache_stats_json(s->s, s->stats_json))
            cli_fail("--stats-json");
    }
    strata_mtp_close(s->mtp);
    strata_stream_close(s->stream);
    strata_drafter_close(s->drafter);
    strata_close(s->draft);
    strata_close(s->s);
    memset(s, 0, sizeof(*s));
}

int run_tokenize(const struct run_session *s, const char *text, int32_t **ids, int *n)
{
    size_t len = strlen(text);
    int32_t *buf = malloc(sizeof(int32_t) * (len + 4));
    int rc;

    if (!buf) {
        fprintf(stderr, "strata: out of memory\n");
        return 1;
    }
    /* byte-level BPE never yields more ids than bytes (+ BOS/EOS) */
    rc = strata_tokenize(s->s, text, len, STRATA_TOKENIZE_SPECIAL | STRATA_TOKENIZE_ADD_BOS, buf,
                         (int)(len + 4));
    if (rc < 0) {
        free(buf);
        return cli_fail("tokenizing the prompt");
    }
    *ids = buf;
    *n = rc;
    return 0;
}
