/* strata batch: many prompts from a JSON Lines file, decoded together in lockstep through the
 * batch API (strata_batch_open/eval/close); one result object per input line, in input order,
 * appended to OUT.
 *
 * DESIGN
 *   Jobs. Every non-blank input line is a job, read and checked before the model is opened
 *   (JSON, keys, types, ranges), its prompt rendered; after the model loads, tokenized and
 *   checked against the context. A line that fails a check is a finished job holding an error
 *   and never reaches the engine. --resume marks the jobs whose id OUT already holds as skipped.
 *   Slots. Up to --streams N slots, each a stream of -c positions; a busy slot also holds its
 *   job's sampler and UTF-8 decoder. A free slot takes the next pending job, evaluates its
 *   prompt alone (strata_eval) and samples its first token. Each step evaluates the last token
 *   of every busy slot in one strata_batch_eval and samples each slot from its row of the
 *   logits; a slot whose job is finished is emptied (strata_stream_truncate to 0) and refilled
 *   before the next step. A job's tokens depend only on its prompt, its sampling settings and
 *   its seed: never on N or on the jobs it shares steps with.
 *   Output. Jobs finish out of order; a finished job's result waits in it until every earlier
 *   job is written, then goes to OUT in one write(2) (O_APPEND). next_write is the first job
 *   not yet written; jobs before it hold nothing but their id.
 *   One thread. SIGINT sets a flag: no job starts after it, a prompt being evaluated stops at
 *   its next chunk (-EINTR), the loop ends after the current step, the finished jobs are
 *   written in order and the command exits 130. A second SIGINT ends the process at once.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "chat.h"
#include "cli.h"
#include "clock.h"
#include "errors.h"
#include "gguf.h"
#include "json_text.h"
#include "model.h"
#include "outfile.h"
#include "run_opts.h"
#include "strata.h"
#include "strata_internal.h"
#include "texts.h"
#include "tokenizer.h"

#define BATCH_MAX_STREAMS 4096 /* strata_batch_open's limit */
#define BATCH_CHUNK 16 /* --prefill-chunk's default: with up to 16 decoding streams a step stays
                        * within the MoE layer's 8-bit direct path (32 tokens) */
#define BATCH_SYNC_S 1.0       /* OUT is synced at most this often (and at the end) */

static volatile sig_atomic_t batch_interrupted;

static void batch_on_sigint(int sig)
{
    if (batch_interrupted) { /* the second Ctrl-C: at once */
        signal(sig, SIG_DFL);
        raise(sig);
    }
    batch_interrupted = 1;
}

struct batch_opts {
    const char *input, *out;
    int n_streams;
    int chunk; /* --prefill-chunk: prompt tokens that join a step; 0 = prompts alone */
    bool resume;
};

/* A line's id: an integer, or a string (bytes, not NUL-terminated in JSON terms). */
struct batch_id {
    bool is_str;
    int64_t num;
    char *str; /* malloc'd when is_str */
    size_t len;
};

enum batch_state {
    JOB_PENDING, /* to run */
    JOB_RUNNING, /* in a slot */
    JOB_DONE,    /* result (or error) waiting to be written */
    JOB_WRITTEN, /* in OUT */
    JOB_SKIPPED, /* its id was in OUT already (--resume) */
};

/* Text generated so far (raw bytes). */
struct batch_text {
    char *buf;
    size_t len, cap;
};

struct batch_job {
    int line; /* 1-based line of the input */
    struct batch_id id;
    enum batch_state state;
    char *error;  /* what is wrong with the line (malloc'd), or NULL */
    char *prompt; /* the rendered prompt (malloc'd) until tokenized */
    bool chat;    /* rendered in the model's chat format ("messages", or "prompt" with
                   * --chat): ChatML, or harmony (gpt-oss) */
    int32_t *ids; /* (n_prompt) its tokens (malloc'd) until evaluated */
    int n_prompt;
    struct strata_generate_params gen; /* stop[] points into stops or the --stop arguments */
    char *stops[STRATA_MAX_STOP];      /* the line's own stop strings (malloc'd), then a
                                        * harmony chat job's end markers */
    /* the result */
    struct batch_text text;
    int n_gen;
    const char *finish; /* "stop", "length" or "context" */
    double prompt_ms, gen_ms;
};

struct batch_slot {
    struct strata_stream *st;
    struct batch_job *job;     /* NULL: free */
    struct strata_sampler *sm; /* the job's */
    struct tokenizer_stream ts;
    int32_t next;  /* the token the next step evaluates */
    int fed;       /* prompt tokens evaluated (< n_prompt: the prompt is joining the steps) */
    /* --spec ngram: the job's ids so far (prompt, then generated), the drafts of this step */
    int32_t *hist;
    int n_hist, cap_hist;
    struct strata_draft_pace pace; /* --spec: the adaptive draft length, paused after misses */
    int32_t drafts[64];
    int k;
    struct strata_drafter *drafter; /* --spec draft: its stream on the draft model */
    struct strata_mtp *mtp;         /* --spec mtp: the model's MTP block following st */
    double t_start; /* when its prompt began */
    double t_gen0; /* when its prompt was done */
};

struct batch {
    struct batch_opts bo;
    struct run_opts o;
    struct batch_job *jobs;
    int n_jobs, cap_jobs;
    int next_start, next_write; /* first job not yet started / not yet written */
    int fd;                     /* OUT, O_APPEND */
    bool need_newline;          /* OUT ends without a newline (a torn last line) */
    double t_synced;
    bool dirty;
    /* the engine */
    struct run_session sess; /* the model; its stream is NULL, the slots hold the streams */
    const struct tokenizer *tok;
    struct strata_batch *bt;
    struct batch_slot *slots;
    int n_slots;
    int n_vocab;
    float *logits; /* (n_slots, n_vocab) host */
    /* counts of this run */
    int n_total, n_done, n_failed, n_written;
    long long n_tokens;
    long long n_verify, n_drafted, n_accepted; /* --spec */
    long long drafted_at[16], accepted_at[16]; /* --spec: by position in their pass (the 16th
                                                * and later ones in the last entry) */
    double t0, t_shown;
    bool tty, shown;
    struct chat_style style; /* how chat jobs are rendered: the model's format, read from its
                              * file before the jobs are */
    char today[16];
};

/* ---- the command line --------------------------------------------------------------------- */

static void batch_usage(void)
{
    struct run_opts d;
    run_opts_init(&d);
    printf(
        "usage: strata batch [-m FILE] --input PROMPTS.jsonl -o OUT.jsonl [options]\n\n"
        "Generates for many prompts at once. Up to --streams N lines are decoded together in\n"
        "lockstep: each step is one forward pass over the last token of every stream, so each\n"
        "layer's experts are fetched once for all the streams that chose them. A line entering\n"
        "a free stream while others decode has its prompt joined to their steps, up to\n"
        "--prefill-chunk tokens a step, so they keep decoding; with none decoding it is\n"
        "evaluated alone. A line's output depends only on the\n"
        "line and the flags (each line samples with its own sampler and seed), not on N or on\n"
        "which lines share its steps.\n\n"
        "input (--input FILE; - reads stdin): JSON Lines, one object a line, blank lines\n"
        "skipped. Keys:\n"
        "  \"id\"          string or integer (default: the line number); unique in the file\n"
        "  \"prompt\"      string: the text to continue; with --chat the user message of a\n"
        "                conversation (after --system) in the model's chat template (ChatML;\n"
        "                harmony for gpt-oss)\n"
        "  \"messages\"    instead of \"prompt\": an array of {\"role\": \"system\"|\"user\"|\n"
        "                \"assistant\", \"content\": string}, rendered in that template\n"
        "                with the assistant's turn opened (with --chat, --system goes first\n"
        "                when the first message is not a system message)\n"
        "  \"n_predict\", \"temperature\", \"top_k\", \"top_p\", \"min_p\", \"seed\": this line's\n"
        "                -n, --temp, --top-k, --top-p, --min-p, -s (same ranges)\n"
        "  \"stop\"        array of at most %d non-empty strings: replaces --stop for this line\n"
        "A line that is not a JSON object, has an unknown key, a value of a wrong type or\n"
        "range, an id another line has, an empty prompt or a prompt that does not fit in the\n"
        "context (-c) is reported on stderr with its line number and written to OUT as\n"
        "{\"id\": ..., \"error\": \"line N: ...\"}; the other lines go on.\n\n"
        "output (-o FILE): one JSON object a line, in the input's order:\n"
        "  {\"id\", \"text\", \"tokens\", \"finish_reason\", \"prompt_tokens\",\n"
        "   \"timings\": {\"prompt_ms\", \"gen_ms\"}}\n"
        "\"text\" is the generated text (invalid UTF-8 becomes U+FFFD; a harmony conversation's\n"
        "final channel, its reasoning in \"reasoning\"), \"tokens\" the tokens\n"
        "generated; \"finish_reason\" is \"stop\" (an end-of-generation token, or a stop string,\n"
        "which is cut from the text), \"length\" (n_predict tokens) or \"context\" (the context\n"
        "is full). \"gen_ms\" is wall time from the end of the prompt to the last token, shared\n"
        "with the lines decoded alongside. Lines are appended to OUT (O_APPEND) as soon as\n"
        "every line before them is done, so a crash loses only the lines in flight and those\n"
        "finished behind one; the file is synced at most once a second and at the end.\n\n"
        "batch:\n"
        "      --input FILE        the prompts (required)\n"
        "  -o, --output FILE       where results are appended (required); an existing\n"
        "                          non-empty file is refused without --resume\n"
        "      --resume            continue OUT: the input lines whose id already has an\n"
        "                          object in OUT (a result or an error) are skipped; delete\n"
        "                          the error objects from OUT to run those lines again\n"
        "      --streams N         lines decoded together, 1-%d (default 4); each stream\n"
        "                          holds a KV cache of -c tokens\n"
        "      --prefill-chunk N   prompt tokens a step takes from a line joining the others\n"
        "                          (default %d; 0: every prompt is evaluated alone first)\n\n"
        "prompts:\n"
        "      --chat              render \"prompt\" as a user message in the chat template\n"
        "      --system TEXT       system message (needs --chat)\n"
        "      --no-think          Qwen3, Qwen3.5: pre-fill an empty <think></think> block in\n"
        "                          every rendered conversation (needs --chat)\n\n"
        "generation (the defaults of every line; a model file's general.sampling.* keys\n"
        "replace those of the flags not given):\n"
        "  -n, --n-predict N       tokens to generate at most (default %d)\n"
        "      --temp T            temperature, 0 = greedy (default %.2f)\n"
        "      --top-k K           0 = off (default %d)\n"
        "      --top-p P           1 = off (default %.2f)\n"
        "      --min-p P           0 = off (default %.2f)\n"
        "      --repeat-penalty R  1 = off (default %.2f)\n"
        "      --repeat-last-n N   tokens the penalty looks back (default %d)\n"
        "  -s, --seed S            sampling seed of every line without its own (default %llu)\n"
        "      --stop TEXT         stop when TEXT is generated (up to %d)\n"
        "      --ignore-eos        do not stop at end-of-generation tokens\n"
        "      --spec ngram|draft|mtp  speculative decoding: each stream's step also carries\n"
        "                          up to --draft-max K (default 8) drafts as rows, kept while\n"
        "                          sampling agrees (greedy texts unchanged): prompt lookup\n"
        "                          (--draft-ngram N, default 3), the greedy tokens of -md FILE\n"
        "                          (--draft-device auto|cpu|cuda; each stream has its own\n"
        "                          stream on it), or those of the model's own MTP block\n"
        "                          (qwen3next, qwen35moe files with one; each stream has its\n"
        "                          own block cache); docs/speculative.md\n\n"
        "model and machine (as for strata run; see strata run --help):\n"
        "  -m, --model FILE        GGUF model (default: the shipped default model, %s)\n"
        "  -c, --ctx-size N        context of each stream in tokens (default %d)\n"
        "  -t, --threads N, --cpu-threads N, -b, --batch-size N, --device auto|cpu|cuda,\n"
        "  --vram-budget SIZE (counts the KV caches of all the streams), --placement\n"
        "  stream|hybrid|static|static:N, --residency copy|zerocopy|gpu, --streaming dma|kernel,\n"
        "  --prefetch, --prefetch-depth N, --prefetch-top M, --profile FILE [--profile-freeze]\n"
        "  [--profile-optional], --stats, --stats-json FILE, --bind, --no-mmap, -v, --graph\n"
        "  (every expert resident: each step's shape recorded once as a CUDA graph and\n"
        "  replayed), --host-budget SIZE [--host-io auto|uring|pread] [--host-buffered]\n"
        "  [--host-read-ahead] (--device cpu, --placement static, or the expert cache's\n"
        "  copy path and hybrid lane under --vram-budget)\n\n"
        "Not taken: -p and -f (the prompts come from --input).\n\n"
        "Progress (lines done out of this run's, tokens generated per second since the\n"
        "start) goes to stderr, at most every second on a terminal and every 10 s otherwise.\n"
        "Ctrl-C stops after the current step (a second one ends at once): the lines finished\n"
        "in order are written, the rest can be run with --resume (exit 130). Exit 0 when\n"
        "every line succeeded, 1 when some failed (their error objects are in OUT) or the\n"
        "engine failed, 2 for a bad command line.\n",
        STRATA_MAX_STOP, BATCH_MAX_STREAMS, BATCH_CHUNK, d.gen.n_predict,
        d.gen.sampling.temperature, d.gen.sampling.top_k, d.gen.sampling.top_p,
        d.gen.sampling.min_p, d.gen.sampling.repeat_penalty, d.gen.sampling.repeat_last_n,
        (unsigned long long)d.gen.sampling.seed, STRATA_MAX_STOP, STRATA_DEFAULT_MODEL, d.n_ctx);
}

/* run_opts flags that mean something to a batch (*takes_value set); the others are refused. */
static bool batch_run_flag(const char *a, bool *takes_value)
{
    static const char with_value[] =
        "-m --model -t --threads --cpu-threads -c --ctx-size -b --batch-size --device "
        "--vram-budget --placement --residency --streaming --prefetch-depth --prefetch-top "
        "--profile "
        "--stats-json --system -n --n-predict --temp --top-k --top-p --min-p --repeat-penalty "
        "--repeat-last-n -s --seed --stop --host-budget --host-io --spec --draft-max "
        "--draft-ngram -md --draft-model --draft-device";
    static const char bare[] = "--chat --think --no-think --ignore-eos --bind --no-mmap --no-mtp -v "
                               "--verbose --stats --prefetch --profile-freeze --profile-optional "
                               "--graph --host-buffered --host-read-ahead";
    return run_opts_flag_in(with_value, bare, a, takes_value);
}

/* Takes batch's own flags out of argv and hands the rest to run_opts_parse. 0, 1 (help
 * printed) or 2 (message printed). */
static int batch_parse_flags(int argc, char **argv, struct batch_opts *bo, struct run_opts *o)
{
    char **rest = calloc((size_t)argc + 1, sizeof(char *));
    int n_rest = 1, rc = 0;

    *bo = (struct batch_opts){.n_streams = 4, .chunk = BATCH_CHUNK};
    run_opts_init(o);
    if (!rest) {
        fprintf(stderr, "strata batch: out of memory\n");
        return 2;
    }
    rest[0] = argv[0];
    for (int i = 1; i < argc && !rc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = false;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            batch_usage();
            rc = 1;
        } else if (!strcmp(a, "--resume")) {
            bo->resume = true;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt") || !strcmp(a, "-f") ||
                   !strcmp(a, "--file")) {
            fprintf(stderr,
                    "strata batch: %s: the prompts come from --input FILE, one JSON "
                    "object a line (see --help)\n",
                    a);
            rc = 2;
        } else if (batch_run_flag(a, &takes)) {
            rest[n_rest++] = argv[i];
            if (takes && v)
                rest[n_rest++] = argv[++i];
        } else if (!v) {
            fprintf(stderr, "strata batch: %s needs a value (or is unknown; see --help)\n", a);
            rc = 2;
        } else if (!strcmp(a, "--input")) {
            bo->input = argv[++i];
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            bo->out = argv[++i];
        } else if (!strcmp(a, "--streams")) {
            rc = args_i32("batch", a, argv[++i], 1, BATCH_MAX_STREAMS, &bo->n_streams);
        } else if (!strcmp(a, "--prefill-chunk")) {
            rc = args_i32("batch", a, argv[++i], 0, 4096, &bo->chunk);
        } else {
            fprintf(stderr, "strata batch: unknown option '%s' (see --help)\n", a);
            rc = 2;
        }
    }
    if (!rc)
        rc = run_opts_parse(o, n_rest, rest, "batch");
    free(rest);
    return rc;
}

/* The checks after the flags are parsed: 0 or 2 after the message. */
static int batch_check_flags(const struct batch_opts *bo, struct run_opts *o)
{
    struct stat in_sb, out_sb;

    if (!bo->input || !bo->out) {
        fprintf(stderr, "strata batch: need --input PROMPTS.jsonl and -o OUT.jsonl (see "
                        "--help)\n");
        return 2;
    }
    if ((o->system || !o->think) && !o->chat_template) {
        fprintf(stderr, "strata batch: %s applies to the chat template: add --chat\n",
                o->system ? "--system" : "--no-think");
        return 2;
    }
    if (run_opts_model("batch", &o->model))
        return 2;
    if (outfile_check_target(bo->out)) {
        fprintf(stderr, "strata batch: -o %s\n", err_msg());
        return 2;
    }
    if (stat(bo->out, &out_sb) == 0) {
        if (!bo->resume && out_sb.st_size > 0) {
            fprintf(stderr,
                    "strata batch: -o %s exists and is not empty: --resume continues "
                    "it, or give another path\n",
                    bo->out);
            return 2;
        }
        if (strcmp(bo->input, "-") && stat(bo->input, &in_sb) == 0 &&
            in_sb.st_dev == out_sb.st_dev && in_sb.st_ino == out_sb.st_ino) {
            fprintf(stderr, "strata batch: --input and -o are the same file (%s)\n", bo->out);
            return 2;
        }
    }
    return 0;
}

/* ---- ids ---------------------------------------------------------------------------------- */

static int batch_id_cmp(const struct batch_id *a, const struct batch_id *b)
{
    if (a->is_str != b->is_str)
        return a->is_str ? 1 : -1;
    if (!a->is_str)
        return a->num < b->num ? -1 : a->num > b->num;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->str, b->str, n);
    return c ? c : (a->len < b->len ? -1 : a->len > b->len);
}

static int batch_id_qcmp(const void *a, const void *b)
{
    return batch_id_cmp(a, b);
}

/* The id as JSON (for messages), into buf. */
static const char *batch_id_text(const struct batch_id *id, char *buf, size_t cap)
{
    if (id->is_str)
        snprintf(buf, cap, "\"%.*s\"", (int)(id->len < 60 ? id->len : 60), id->str);
    else
        snprintf(buf, cap, "%" PRId64, id->num);
    return buf;
}

/* v as a line id: 0, or -EINVAL with *why set. */
static int batch_id_read(json_object *v, struct batch_id *id, const char **why)
{
    if (json_object_is_type(v, json_type_string)) {
        size_t len = (size_t)json_object_get_string_len(v);
        char *s = malloc(len + 1);
        if (!s) {
            *why = "out of memory";
            return -ENOMEM;
        }
        memcpy(s, json_object_get_string(v), len + 1);
        *id = (struct batch_id){.is_str = true, .str = s, .len = len};
        return 0;
    }
    if (json_object_is_type(v, json_type_int)) {
        int64_t n = json_object_get_int64(v);
        if (n == INT64_MAX && json_object_get_uint64(v) > (uint64_t)INT64_MAX) {
            *why = "\"id\" is an integer above 2^63-1";
            return -EINVAL;
        }
        *id = (struct batch_id){.num = n};
        return 0;
    }
    *why = "\"id\" wants a string or an integer";
    return -EINVAL;
}

/* ---- reading a line ----------------------------------------------------------------------- */

static char batch_oom[] = "out of memory"; /* a job's error when its message could not be kept */

/* Records what is wrong with job j (the first thing found) and says it on stderr. */
static void batch_job_fail(const struct batch *b, struct batch_job *j, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (j->error)
        return;
    fprintf(stderr, "strata batch: %s:%d: %s\n", strcmp(b->bo.input, "-") ? b->bo.input : "stdin",
            j->line, msg);
    size_t n = strlen(msg) + 32;
    j->error = malloc(n);
    if (j->error)
        snprintf(j->error, n, "line %d: %s", j->line, msg);
    else
        j->error = batch_oom;
    free(j->prompt);
    j->prompt = NULL;
    j->state = JOB_DONE;
}

/* A JSON value as text for a message (at most about 40 bytes). */
static const char *batch_json_text(json_object *v, char *buf, size_t cap)
{
    const char *t = json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN);
    size_t n = strlen(t ? t : "");
    if (n > 40)
        snprintf(buf, cap, "%.37s...", t);
    else
        snprintf(buf, cap, "%s", t ? t : "?");
    return buf;
}

/* key's value v as an integer in [min, max]: 0, or -EINVAL after batch_job_fail. */
static int batch_key_int(const struct batch *b, struct batch_job *j, const char *key,
                         json_object *v, long long min, long long max, long long *out)
{
    char vb[48];
    if (json_object_is_type(v, json_type_int)) {
        int64_t n = json_object_get_int64(v);
        if (n >= min && n <= max) { /* min, max in int's range */
            *out = n;
            return 0;
        }
    }
    batch_job_fail(b, j, "\"%s\" wants an integer in %lld..%lld, not %s", key, min, max,
                   batch_json_text(v, vb, sizeof(vb)));
    return -EINVAL;
}

/* key's value v as a float in [min, max], rounded once from its decimal text as --temp and
 * the like are (strtof): 0, or -EINVAL after batch_job_fail. */
static int batch_key_float(const struct batch *b, struct batch_job *j, const char *key,
                           json_object *v, float min, float max, float *out)
{
    char vb[48];
    if (json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double)) {
        float f = strtof(json_object_get_string(v), NULL);
        if (f >= min && f <= max) { /* false for nan */
            *out = f;
            return 0;
        }
    }
    batch_job_fail(b, j, "\"%s\" wants a number in %g..%g, not %s", key, (double)min, (double)max,
                   batch_json_text(v, vb, sizeof(vb)));
    return -EINVAL;
}

/* "seed": an integer in 0..2^64-1. */
static int batch_key_seed(const struct batch *b, struct batch_job *j, json_object *v, uint64_t *out)
{
    char vb[48];
    if (json_object_is_type(v, json_type_int) && json_object_get_int64(v) >= 0) {
        *out = json_object_get_uint64(v);
        return 0;
    }
    batch_job_fail(b, j, "\"seed\" wants an integer in 0..18446744073709551615, not %s",
                   batch_json_text(v, vb, sizeof(vb)));
    return -EINVAL;
}

/* "stop": an array of at most STRATA_MAX_STOP non-empty strings, copied into the job. */
static int batch_key_stop(const struct batch *b, struct batch_job *j, json_object *v)
{
    char vb[48];
    size_t n = json_object_is_type(v, json_type_array) ? json_object_array_length(v) : 0;

    if (!json_object_is_type(v, json_type_array) || n > STRATA_MAX_STOP) {
        batch_job_fail(b, j, "\"stop\" wants an array of at most %d strings, not %s",
                       STRATA_MAX_STOP, batch_json_text(v, vb, sizeof(vb)));
        return -EINVAL;
    }
    j->gen.n_stop = 0;
    for (size_t i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(v, i);
        size_t len =
            json_object_is_type(e, json_type_string) ? (size_t)json_object_get_string_len(e) : 0;
        if (!len || strlen(json_object_get_string(e)) != len) {
            batch_job_fail(b, j, "\"stop\"[%zu] wants a non-empty string without NUL, not %s", i,
                           batch_json_text(e, vb, sizeof(vb)));
            return -EINVAL;
        }
        if (!(j->stops[i] = strdup(json_object_get_string(e)))) {
            batch_job_fail(b, j, "out of memory");
            return -ENOMEM;
        }
        j->gen.stop[j->gen.n_stop++] = j->stops[i];
    }
    return 0;
}

/* A string value without NUL bytes, or NULL after batch_job_fail. */
static const char *batch_key_string(const struct batch *b, struct batch_job *j, const char *what,
                                    json_object *v)
{
    char vb[48];
    if (!json_object_is_type(v, json_type_string)) {
        batch_job_fail(b, j, "%s wants a string, not %s", what, batch_json_text(v, vb, sizeof(vb)));
        return NULL;
    }
    const char *s = json_object_get_string(v);
    if (strlen(s) != (size_t)json_object_get_string_len(v)) {
        batch_job_fail(b, j, "%s holds a NUL character (\\u0000)", what);
        return NULL;
    }
    return s;
}

/* "messages" rendered in the ChatML template into j->prompt: 0 or -errno after
 * batch_job_fail. */
static int batch_render_messages(const struct batch *b, struct batch_job *j, json_object *v)
{
    static const char *const roles[] = {"system", "user", "assistant"};
    char what[48], vb[48];
    size_t n = json_object_is_type(v, json_type_array) ? json_object_array_length(v) : 0;
    struct chat_msg *msgs;
    int nm = 0, rc = -EINVAL;

    if (!n) {
        batch_job_fail(b, j,
                       "\"messages\" wants a non-empty array of {\"role\", \"content\"}, "
                       "not %s",
                       batch_json_text(v, vb, sizeof(vb)));
        return -EINVAL;
    }
    if (!(msgs = calloc(n + 1, sizeof(*msgs)))) {
        batch_job_fail(b, j, "out of memory");
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *m = json_object_array_get_idx(v, i), *role = NULL, *content = NULL;
        if (!json_object_is_type(m, json_type_object)) {
            batch_job_fail(b, j,
                           "\"messages\"[%zu] wants an object {\"role\", \"content\"}, "
                           "not %s",
                           i, batch_json_text(m, vb, sizeof(vb)));
            goto out;
        }
        json_object_object_foreach(m, key, val)
        {
            if (strcmp(key, "role") && strcmp(key, "content")) {
                batch_job_fail(b, j, "\"messages\"[%zu]: unknown key \"%s\" (role, content)", i,
                               key);
                goto out;
            }
            (void)val;
        }
        json_object_object_get_ex(m, "role", &role);
        json_object_object_get_ex(m, "content", &content);
        if (!role || !content) {
            batch_job_fail(b, j, "\"messages\"[%zu] has no \"%s\"", i, role ? "content" : "role");
            goto out;
        }
        snprintf(what, sizeof(what), "\"messages\"[%zu]'s \"role\"", i);
        const char *r = batch_key_string(b, j, what, role);
        snprintf(what, sizeof(what), "\"messages\"[%zu]'s \"content\"", i);
        const char *c = r ? batch_key_string(b, j, what, content) : NULL;
        if (!c)
            goto out;
        bool known = false;
        for (size_t k = 0; k < sizeof(roles) / sizeof(roles[0]); k++)
            known |= !strcmp(r, roles[k]);
        if (!known) {
            batch_job_fail(b, j,
                           "\"messages\"[%zu]: role \"%s\" is not system, user or "
                           "assistant",
                           i, r);
            goto out;
        }
        if (i == 0 && b->o.system && strcmp(r, "system"))
            msgs[nm++] = (struct chat_msg){"system", b->o.system};
        msgs[nm++] = (struct chat_msg){r, c};
    }
    if ((rc = chat_render(&b->style, msgs, nm, true, &j->prompt)))
        batch_job_fail(b, j, "%s", rc == -EINVAL ? err_msg() : "chat template: out of memory");
    j->chat = true;
out:
    free(msgs);
    return rc;
}

/* "prompt" into j->prompt, rendered with --chat: 0 or -errno after batch_job_fail. */
static int batch_render_prompt(const struct batch *b, struct batch_job *j, json_object *v)
{
    const char *p = batch_key_string(b, j, "\"prompt\"", v);
    struct chat_msg msgs[2];
    int nm = 0;

    if (!p)
        return -EINVAL;
    if (!*p) {
        batch_job_fail(b, j, "the prompt is empty");
        return -EINVAL;
    }
    if (!b->o.chat_template) {
        j->prompt = strdup(p);
    } else {
        if (b->o.system)
            msgs[nm++] = (struct chat_msg){"system", b->o.system};
        msgs[nm++] = (struct chat_msg){"user", p};
        if (chat_render(&b->style, msgs, nm, true, &j->prompt))
            j->prompt = NULL;
        j->chat = true;
    }
    if (!j->prompt) {
        batch_job_fail(b, j, "out of memory");
        return -ENOMEM;
    }
    return 0;
}

/* A harmony chat job also stops at the reply's end markers (after its own stop strings). */
static void batch_harmony_stops(const struct batch *b, struct batch_job *j)
{
    int own = 0;
    while (own < STRATA_MAX_STOP && j->stops[own])
        own++;
    for (const char *const *m = chat_stops(CHAT_FORMAT_HARMONY); *m; m++) {
        if (j->gen.n_stop >= STRATA_MAX_STOP || own >= STRATA_MAX_STOP) {
            batch_job_fail(b, j, "too many stop strings with harmony's end markers (%d at most)",
                           STRATA_MAX_STOP);
            return;
        }
        if (!(j->stops[own] = strdup(*m))) {
            batch_job_fail(b, j, "out of memory");
            return;
        }
        j->gen.stop[j->gen.n_stop++] = j->stops[own++];
    }
}

/* The keys other than "id": sampling overrides and the prompt. */
static void batch_read_keys(const struct batch *b, struct batch_job *j, json_object *obj)
{
    struct strata_sampling *sc = &j->gen.sampling;
    json_object *prompt = NULL, *messages = NULL;
    long long n;

    json_object_object_foreach(obj, key, v)
    {
        int rc = 0;
        if (!strcmp(key, "id")) {
            continue;
        } else if (!strcmp(key, "prompt")) {
            prompt = v;
        } else if (!strcmp(key, "messages")) {
            messages = v;
        } else if (!strcmp(key, "n_predict")) {
            if (!(rc = batch_key_int(b, j, key, v, 0, 1 << 20, &n)))
                j->gen.n_predict = (int)n;
        } else if (!strcmp(key, "temperature")) {
            rc = batch_key_float(b, j, key, v, 0, 100, &sc->temperature);
        } else if (!strcmp(key, "top_k")) {
            if (!(rc = batch_key_int(b, j, key, v, 0, 1 << 24, &n)))
                sc->top_k = (int)n;
        } else if (!strcmp(key, "top_p")) {
            rc = batch_key_float(b, j, key, v, 0, 1, &sc->top_p);
        } else if (!strcmp(key, "min_p")) {
            rc = batch_key_float(b, j, key, v, 0, 1, &sc->min_p);
        } else if (!strcmp(key, "seed")) {
            rc = batch_key_seed(b, j, v, &sc->seed);
        } else if (!strcmp(key, "stop")) {
            rc = batch_key_stop(b, j, v);
        } else {
            batch_job_fail(b, j,
                           "unknown key \"%s\" (the keys: id, prompt, messages, "
                           "n_predict, temperature, top_k, top_p, min_p, seed, stop)",
                           key);
            rc = -EINVAL;
        }
        if (rc)
            return;
    }
    if (prompt && messages)
        batch_job_fail(b, j, "both \"prompt\" and \"messages\": give one");
    else if (!prompt && !messages)
        batch_job_fail(b, j, "no \"prompt\" or \"messages\"");
    else if (prompt)
        batch_render_prompt(b, j, prompt);
    else
        batch_render_messages(b, j, messages);
    if (j->chat && j->state == JOB_PENDING && b->style.format == CHAT_FORMAT_HARMONY)
        batch_harmony_stops(b, j);
}

/* Parses one line (len bytes, no newline) into job j. Errors are kept in the job. */
static void batch_parse_line(const struct batch *b, struct batch_job *j, const char *line,
                             size_t len)
{
    struct json_tokener *tk = json_tokener_new();
    json_object *obj = NULL, *idv = NULL;
    const char *why = NULL;

    j->gen = b->o.gen;
    j->id = (struct batch_id){.num = j->line};
    if (!tk) {
        batch_job_fail(b, j, "out of memory");
        return;
    }
    json_tokener_set_flags(tk, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    if (strlen(line) != len) {
        batch_job_fail(b, j, "a NUL byte at byte offset %zu (lines are UTF-8 JSON)", strlen(line));
        goto out;
    }
    obj = json_tokener_parse_ex(tk, line, (int)len);
    enum json_tokener_error e = json_tokener_get_error(tk);
    size_t end = json_tokener_get_parse_end(tk);
    if (!obj) {
        batch_job_fail(b, j, "not valid JSON: %s at byte offset %zu",
                       e == json_tokener_continue ? "the line ends inside a value"
                                                  : json_tokener_error_desc(e),
                       end);
        goto out;
    }
    if (end + strspn(line + end, " \t\r") != len) {
        batch_job_fail(b, j, "not valid JSON: more after the value, at byte offset %zu", end);
        goto out;
    }
    if (!json_object_is_type(obj, json_type_object)) {
        batch_job_fail(b, j, "not a JSON object (one object a line)");
        goto out;
    }
    if (json_object_object_get_ex(obj, "id", &idv) && batch_id_read(idv, &j->id, &why)) {
        char vb[48];
        batch_job_fail(b, j, "%s, not %s", why, batch_json_text(idv, vb, sizeof(vb)));
        goto out;
    }
    batch_read_keys(b, j, obj);
out:
    json_object_put(obj);
    json_tokener_free(tk);
}

static bool batch_blank(const char *s, size_t n)
{
    return strspn(s, " \t\r\n") >= n;
}

/* Reads and parses every line of --input. 0, or the exit code after the message. */
static int batch_read_input(struct batch *b)
{
    struct texts tx;
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int rc, lineno = 0;

    if ((rc = texts_open("batch", "--input", b->bo.input, NULL, &tx)))
        return rc;
    while ((got = getline(&line, &cap, tx.f)) >= 0) {
        size_t len = (size_t)got;
        lineno++;
        if (len && line[len - 1] == '\n')
            line[--len] = '\0';
        if (batch_blank(line, len) && strlen(line) == len)
            continue;
        if (b->n_jobs == b->cap_jobs) {
            int c = b->cap_jobs ? 2 * b->cap_jobs : 64;
            struct batch_job *nj = realloc(b->jobs, sizeof(*nj) * (size_t)c);
            if (!nj) {
                rc = 1;
                fprintf(stderr, "strata batch: out of memory at line %d of %s\n", lineno,
                        b->bo.input);
                break;
            }
            b->jobs = nj;
            b->cap_jobs = c;
        }
        struct batch_job *j = &b->jobs[b->n_jobs++];
        memset(j, 0, sizeof(*j));
        j->line = lineno;
        if (len > INT_MAX - 1)
            batch_job_fail(b, j, "the line is longer than 2 GiB");
        else
            batch_parse_line(b, j, line, len);
    }
    if (!rc && ferror(tx.f)) {
        fprintf(stderr, "strata batch: --input %s: %s\n", b->bo.input, strerror(errno));
        rc = 1;
    }
    free(line);
    texts_close(&tx);
    return rc;
}

static int batch_job_qcmp(const void *a, const void *b)
{
    const struct batch_job *x = *(const struct batch_job *const *)a;
    const struct batch_job *y = *(const struct batch_job *const *)b;
    int c = batch_id_cmp(&x->id, &y->id);
    return c ? c : (x->line > y->line) - (x->line < y->line);
}

/* A line whose id an earlier line has becomes an error: --resume matches lines by id. 0, or 1
 * after the message. */
static int batch_check_ids(struct batch *b)
{
    struct batch_job **by_id = malloc(sizeof(*by_id) * (size_t)(b->n_jobs ? b->n_jobs : 1));
    char ib[80];

    if (!by_id) {
        fprintf(stderr, "strata batch: out of memory\n");
        return 1;
    }
    for (int i = 0; i < b->n_jobs; i++)
        by_id[i] = &b->jobs[i];
    qsort(by_id, (size_t)b->n_jobs, sizeof(*by_id), batch_job_qcmp); /* by id, then line */
    for (int i = 1, first = 0; i < b->n_jobs; i++) {
        if (batch_id_cmp(&by_id[i]->id, &by_id[first]->id)) {
            first = i;
            continue;
        }
        batch_job_fail(b, by_id[i],
                       "id %s is also line %d's (ids must be unique: --resume "
                       "skips lines by id)",
                       batch_id_text(&by_id[i]->id, ib, sizeof(ib)), by_id[first]->line);
    }
    free(by_id);
    return 0;
}

/* ---- OUT ---------------------------------------------------------------------------------- */

/* --resume: the ids of the objects OUT holds; the jobs with one of them are skipped. 0, or
 * the exit code after the message. */
static int batch_resume(struct batch *b)
{
    struct batch_id *done = NULL;
    size_t n_done = 0, cap_done = 0, cap = 0;
    char *line = NULL;
    ssize_t got;
    int lineno = 0, rc = 0, n_bad = 0;
    FILE *f = fopen(b->bo.out, "r");

    if (!f) {
        if (errno == ENOENT)
            return 0;
        fprintf(stderr, "strata batch: -o %s: %s\n", b->bo.out, strerror(errno));
        return 1;
    }
    while ((got = getline(&line, &cap, f)) >= 0) {
        json_object *obj, *idv = NULL;
        struct batch_id id;
        const char *why;

        lineno++;
        b->need_newline = got > 0 && line[got - 1] != '\n';
        if (batch_blank(line, (size_t)got))
            continue;
        obj = json_tokener_parse(line);
        if (!obj || !json_object_is_type(obj, json_type_object) ||
            !json_object_object_get_ex(obj, "id", &idv) || batch_id_read(idv, &id, &why) ||
            (!json_object_object_get_ex(obj, "text", NULL) &&
             !json_object_object_get_ex(obj, "error", NULL))) {
            if (n_bad++ < 5)
                fprintf(stderr,
                        "strata batch: warning: %s:%d is not a result of strata batch "
                        "(an object with an id and a text or an error); ignored\n",
                        b->bo.out, lineno);
            json_object_put(obj);
            continue;
        }
        json_object_put(obj);
        if (n_done == cap_done) {
            size_t c = cap_done ? 2 * cap_done : 64;
            struct batch_id *nd = realloc(done, sizeof(*nd) * c);
            if (!nd) {
                free(id.str);
                rc = 1;
                fprintf(stderr, "strata batch: out of memory reading %s\n", b->bo.out);
                break;
            }
            done = nd;
            cap_done = c;
        }
        done[n_done++] = id;
    }
    fclose(f);
    free(line);
    if (n_bad > 5)
        fprintf(stderr, "strata batch: warning: %d lines of %s ignored in all\n", n_bad, b->bo.out);
    if (!rc && n_done) {
        int n_skip = 0;
        qsort(done, n_done, sizeof(*done), batch_id_qcmp);
        for (int i = 0; i < b->n_jobs; i++) {
            if (bsearch(&b->jobs[i].id, done, n_done, sizeof(*done), batch_id_qcmp)) {
                b->jobs[i].state = JOB_SKIPPED;
                n_skip++;
            }
        }
        fprintf(stderr, "strata batch: --resume: %s holds %zu results; %d input lines skipped\n",
                b->bo.out, n_done, n_skip);
    }
    for (size_t i = 0; i < n_done; i++)
        free(done[i].str);
    free(done);
    return rc;
}

/* Writes all of buf: 0 or 1 after the message. */
static int batch_write_all(struct batch *b, const char *buf, size_t len)
{
    while (len) {
        ssize_t w = write(b->fd, buf, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            fprintf(stderr, "strata batch: writing %s: %s\n", b->bo.out,
                    w < 0 ? strerror(errno) : "nothing written");
            return 1;
        }
        buf += w;
        len -= (size_t)w;
    }
    b->dirty = true;
    return 0;
}

static json_object *batch_id_json(const struct batch_id *id)
{
    return id->is_str ? json_object_new_string_len(id->str, (int)id->len)
                      : json_object_new_int64(id->num);
}

static json_object *batch_ms_json(double ms)
{
    char buf[64];
    snprintf(buf, sizeof(buf), "%.3f", ms);
    return json_object_new_double_s(ms, buf);
}

static int batch_text_append(struct batch_text *t, const char *s, size_t n);

/* A harmony reply's channels: the final one into out[0], the others (reasoning) into out[1]. */
static void batch_harmony_emit(void *ctx, const char *channel, const char *text, size_t len)
{
    struct batch_text *out = ctx;
    batch_text_append(&out[strcmp(channel, "final") ? 1 : 0], text, len);
}

/* A harmony chat job's text split into its channels: j->text becomes the final channel's, and
 * *reasoning the others' ("" when there were none). 0 or -ENOMEM. */
static int batch_harmony_split(struct batch_job *j, json_object **reasoning)
{
    struct batch_text part[2] = {{0}};
    struct chat_harmony h;
    chat_harmony_init(&h, batch_harmony_emit, part);
    int rc = chat_harmony_feed(&h, j->text.buf ? j->text.buf : "", j->text.len);
    chat_harmony_flush(&h);
    chat_harmony_free(&h);
    if (!rc)
        *reasoning = json_text_new(part[1].buf ? part[1].buf : "", part[1].len);
    if (!rc && !*reasoning)
        rc = -ENOMEM;
    free(j->text.buf);
    free(part[1].buf);
    j->text = part[0];
    return rc;
}

/* Job j's object, one line. 0 or 1 after the message. */
static int batch_write_job(struct batch *b, struct batch_job *j)
{
    json_object *o = json_object_new_object(), *t = NULL;
    const char *s;
    size_t len;
    int rc = 1;

    if (!o)
        goto oom;
    json_object_object_add(o, "id", batch_id_json(&j->id));
    if (j->error) {
        json_object_object_add(o, "error", json_object_new_string(j->error));
    } else {
        json_object *reasoning = NULL;
        if (j->chat && b->style.format == CHAT_FORMAT_HARMONY && batch_harmony_split(j, &reasoning))
            goto oom;
        if (!(t = json_object_new_object())) {
            json_object_put(reasoning);
            goto oom;
        }
        json_object_object_add(o, "text",
                               json_text_new(j->text.buf ? j->text.buf : "", j->text.len));
        if (reasoning)
            json_object_object_add(o, "reasoning", reasoning);
        json_object_object_add(o, "tokens", json_object_new_int(j->n_gen));
        json_object_object_add(o, "finish_reason", json_object_new_string(j->finish));
        json_object_object_add(o, "prompt_tokens", json_object_new_int(j->n_prompt));
        json_object_object_add(t, "prompt_ms", batch_ms_json(j->prompt_ms));
        json_object_object_add(t, "gen_ms", batch_ms_json(j->gen_ms));
        json_object_object_add(o, "timings", t);
    }
    s = json_object_to_json_string_length(
        o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    if (!s)
        goto oom;
    /* one write per line: a crash leaves whole lines (the newline goes with its line) */
    char *line = malloc(len + 2);
    if (!line)
        goto oom;
    size_t at = 0;
    if (b->need_newline)
        line[at++] = '\n';
    memcpy(line + at, s, len);
    line[at + len] = '\n';
    rc = batch_write_all(b, line, at + len + 1);
    b->need_newline = false;
    free(line);
    json_object_put(o);
    return rc;
oom:
    json_object_put(o);
    fprintf(stderr, "strata batch: out of memory writing line %d's result\n", j->line);
    return 1;
}

/* Writes the finished jobs that every earlier job is written before; syncs OUT at most every
 * BATCH_SYNC_S (or now, when final). 0 or 1 after the message. */
static int batch_write_ready(struct batch *b, bool final)
{
    while (b->next_write < b->n_jobs) {
        struct batch_job *j = &b->jobs[b->next_write];
        if (j->state == JOB_DONE) {
            if (batch_write_job(b, j))
                return 1;
            j->state = JOB_WRITTEN;
            b->n_written++;
            free(j->text.buf);
            j->text = (struct batch_text){0};
        } else if (j->state != JOB_SKIPPED) {
            break;
        }
        b->next_write++;
    }
    double now = clock_now_s();
    if (b->dirty && (final || now - b->t_synced >= BATCH_SYNC_S)) {
        fdatasync(b->fd);
        b->t_synced = now;
        b->dirty = false;
    }
    return 0;
}

/* ---- the engine --------------------------------------------------------------------------- */

static int batch_on_progress(void *ctx, int done, int total)
{
    (void)ctx, (void)done, (void)total;
    return batch_interrupted;
}

/* Tokenizes the pending jobs' prompts and checks them against the context. */
static void batch_tokenize(struct batch *b)
{
    struct strata *s = b->sess.s;
    int n_ctx = b->o.n_ctx;

    for (int i = 0; i < b->n_jobs; i++) {
        struct batch_job *j = &b->jobs[i];
        if (j->state != JOB_PENDING)
            continue;
        size_t len = strlen(j->prompt);
        /* byte-level BPE never yields more ids than bytes (+ BOS/EOS) */
        int cap = len + 4 > (size_t)INT_MAX ? INT_MAX : (int)(len + 4);
        j->ids = malloc(sizeof(int32_t) * (size_t)cap);
        int n =
            j->ids ? strata_tokenize(s, j->prompt, len,
                                     STRATA_TOKENIZE_SPECIAL | STRATA_TOKENIZE_ADD_BOS, j->ids, cap)
                   : -ENOMEM;
        free(j->prompt);
        j->prompt = NULL;
        if (n < 0 || n > cap)
            batch_job_fail(b, j, "tokenizing the prompt: %s",
                           n == -ENOMEM ? "out of memory" : strata_error());
        else if (n == 0)
            batch_job_fail(b, j, "the prompt is empty (no tokens)");
        else if (n >= n_ctx)
            batch_job_fail(b, j,
                           "the prompt is %d tokens, and the context holds %d (-c): raise "
                           "-c above %d or shorten the prompt",
                           n, n_ctx, n);
        j->n_prompt = n > 0 ? n : 0;
        if (j->state != JOB_PENDING) {
            free(j->ids);
            j->ids = NULL;
        }
    }
}

/* Loads the model, tokenizes the pending jobs, and when some are left starts the engine with
 * one stream per slot and the batch. 0, or 1 after the message. */
/* Rows a step may have: a token per stream, with --spec its drafts, and a prompt chunk. */
static int batch_max_rows(const struct batch *b)
{
    return b->n_slots * (1 + b->o.gen.draft_max) + b->bo.chunk;
}

static int batch_open_engine(struct batch *b, int n_pending)
{
    struct strata_config cfg;
    struct strata_model_info mi;
    struct run_session *ss = &b->sess;

    b->n_slots = n_pending < b->bo.n_streams ? n_pending : b->bo.n_streams;
    run_opts_config(&b->o, b->o.model, &cfg);
    /* every stream's KV cache and the batch's rows count against --vram-budget */
    cfg.n_streams = b->n_slots;
    if (strata_load(&cfg, &ss->s))
        return cli_open_fail();
    strata_model_info(ss->s, &mi);
    if (!mi.has_tokenizer) {
        fprintf(stderr, "strata batch: %s has no tokenizer (tokenizer.ggml.* keys)\n", b->o.model);
        return 1;
    }
    /* chat jobs were rendered in the format read from the file before it loaded */
    if ((int)chat_format_of_arch(mi.arch) != (int)b->style.format) {
        fprintf(stderr, "strata batch: %s changed while the jobs were read\n", b->o.model);
        return 1;
    }
    batch_tokenize(b);
    n_pending = 0;
    for (int i = 0; i < b->n_jobs; i++)
        n_pending += b->jobs[i].state == JOB_PENDING;
    if (!n_pending)
        return 0;
    b->n_slots = n_pending < b->n_slots ? n_pending : b->n_slots;
    ss->stats = b->o.stats;
    ss->stats_json = b->o.stats_json;
    if (strata_start(ss->s))
        return cli_open_fail();
    if (b->o.profile && run_profile_check(ss->s, b->o.profile))
        return cli_fail("the profile's probe");
    strata_model_info(ss->s, &mi);
    if (b->o.ctx_set && mi.n_ctx_train && (uint32_t)b->o.n_ctx > mi.n_ctx_train)
        fprintf(stderr,
                "strata: warning: -c %d is above the %u tokens %s was trained on; past "
                "them the output may degrade\n",
                b->o.n_ctx, mi.n_ctx_train, b->o.model);
    if (b->o.verbose)
        fprintf(stderr,
                "strata: %s: %s, %u layers, %u experts (top %u), vocab %u; backend %s, "
                "%d threads; %d streams of %d tokens\n",
                b->o.model, mi.arch, mi.n_layer, mi.n_expert, mi.n_expert_used, mi.n_vocab,
                mi.device, mi.n_threads, b->n_slots, b->o.n_ctx);
    b->tok = strata_model_of(ss->s)->tok;
    b->n_vocab = (int)mi.n_vocab;
    b->slots = calloc((size_t)b->n_slots, sizeof(*b->slots));
    b->logits = malloc(sizeof(float) * (size_t)batch_max_rows(b) * mi.n_vocab);
    if (!b->slots || !b->logits) {
        fprintf(stderr, "strata batch: out of memory for %d streams\n", b->n_slots);
        return 1;
    }
    if (strata_streams_check(ss->s, b->n_slots, b->o.n_ctx)) {
        fprintf(stderr, "strata batch: --streams %d: %s\n", b->n_slots, strata_error());
        return 1;
    }
    for (int i = 0; i < b->n_slots; i++) {
        if (strata_stream_open(ss->s, b->o.n_ctx, &b->slots[i].st))
            return cli_fail("opening the streams");
        strata_stream_set_progress(b->slots[i].st, batch_on_progress, NULL);
    }
    /* --spec draft: the draft model once, a drafter (a stream on it) per slot */
    for (int i = 0; b->o.draft_model && i < b->n_slots; i++) {
        int rc = i ? (strata_drafter_open(ss->draft, ss->s, b->o.n_ctx, &b->slots[i].drafter)
                          ? cli_fail("--draft-model")
                          : 0)
                   : run_open_draft(b->o.draft_model, b->o.draft_device, b->o.n_threads,
                                    b->o.n_ctx, b->o.verbose, ss->s, &ss->draft,
                                    &b->slots[0].drafter);
        if (rc)
            return rc;
    }
    /* --spec mtp: the block follows each slot's stream */
    for (int i = 0; b->o.spec_mtp && i < b->n_slots; i++)
        if (strata_mtp_open(b->slots[i].st, &b->slots[i].mtp))
            return cli_fail("--spec mtp");
    if (b->o.gen.draft_max &&
        strata_batch_open_rows(ss->s, b->n_slots, batch_max_rows(b), &b->bt)) {
        fprintf(stderr, "strata batch: --spec: no memory for %d rows a step (%s); decoding "
                        "without drafts\n",
                batch_max_rows(b), strata_error());
        b->o.gen.draft_max = 0;
    }
    if (!b->bt && strata_batch_open_rows(ss->s, b->n_slots, batch_max_rows(b), &b->bt))
        return cli_fail("opening the batch");
    if (!strcmp(mi.device, "cuda")) {
        struct strata_stats st;
        strata_get_stats(ss->s, &st);
        fprintf(stderr, "strata: cuda: %.2f GiB of VRAM in use (weights, KV caches, scratch)\n",
                st.vram_bytes / 1073741824.0);
    }
    return 0;
}

static void batch_close_engine(struct batch *b)
{
    strata_batch_close(b->bt);
    for (int i = 0; i < b->n_slots && b->slots; i++) {
        strata_sampler_close(b->slots[i].sm);
        strata_mtp_close(b->slots[i].mtp);
        strata_stream_close(b->slots[i].st);
        strata_drafter_close(b->slots[i].drafter);
        free(b->slots[i].hist);
    }
    free(b->slots);
    free(b->logits);
    if (b->sess.s)
        run_session_close(&b->sess); /* the cache's statistics (--stats), then the model */
}

static int batch_text_append(struct batch_text *t, const char *s, size_t n)
{
    if (t->len + n > t->cap) {
        size_t cap = (t->len + n) * 2 + 64;
        char *nb = realloc(t->buf, cap);
        if (!nb)
            return -ENOMEM;
        t->buf = nb;
        t->cap = cap;
    }
    memcpy(t->buf + t->len, s, n);
    t->len += n;
    return 0;
}

/* Cuts the text at the earliest stop string that ends after byte old_len (none ended before):
 * true when one was found. The same as strata_generate's search over its held-back text. */
static bool batch_cut_stop(struct batch_job *j, size_t old_len)
{
    struct batch_text *t = &j->text;
    long best = -1;

    for (int i = 0; i < j->gen.n_stop; i++) {
        size_t sl = strlen(j->gen.stop[i]);
        if (!sl || sl > t->len)
            continue;
        size_t from = old_len + 1 > sl ? old_len + 1 - sl : 0;
        for (size_t at = from; at + sl <= t->len; at++) {
            if (!memcmp(t->buf + at, j->gen.stop[i], sl)) {
                if (best < 0 || (long)at < best)
                    best = (long)at;
                break;
            }
        }
    }
    if (best >= 0)
        t->len = (size_t)best;
    return best >= 0;
}

/* Ends slot sl's job with reason ("stop", "length", "context"; NULL for a stop string already
 * cut) and frees the slot. 0 or 1 after the message. */
static int batch_finish(struct batch *b, struct batch_slot *sl, const char *reason)
{
    struct batch_job *j = sl->job;
    char tail[8];

    if (reason) { /* an incomplete character at the end, as strata_generate emits it */
        size_t old = j->text.len;
        int n = tokenizer_stream_flush(&sl->ts, tail, sizeof(tail));
        if (n > 0 && batch_text_append(&j->text, tail, (size_t)n))
            goto oom;
        if (batch_cut_stop(j, old))
            reason = NULL;
    }
    j->finish = reason ? reason : "stop";
    j->gen_ms = (clock_now_s() - sl->t_gen0) * 1e3;
    j->state = JOB_DONE;
    b->n_done++;
    strata_sampler_close(sl->sm);
    sl->sm = NULL;
    sl->job = NULL;
    sl->fed = 0;
    strata_stream_truncate(sl->st, 0);
    return 0;
oom:
    fprintf(stderr, "strata batch: out of memory (line %d's text)\n", j->line);
    return 1;
}

static int batch_hist_push(struct batch_slot *sl, int32_t id)
{
    if (sl->n_hist == sl->cap_hist) {
        int cap = sl->cap_hist * 2 + 64;
        int32_t *nh = realloc(sl->hist, sizeof(int32_t) * (size_t)cap);
        if (!nh)
            return -ENOMEM;
        sl->hist = nh;
        sl->cap_hist = cap;
    }
    sl->hist[sl->n_hist++] = id;
    return 0;
}

/* Handles slot sl's chosen token id in strata_generate's order: end of generation, the text
 * and its stop strings, n_predict, the context (pos: the tokens before id in the cache). 0
 * (the slot goes on, next = id, or it finished), or 1 after the message. */
static int batch_take(struct batch *b, struct batch_slot *sl, int32_t id, int pos)
{
    struct batch_job *j = sl->job;
    char piece[4096];

    if (!j->gen.ignore_eos && strata_token_is_eog(b->sess.s, id))
        return batch_finish(b, sl, "stop");
    j->n_gen++;
    b->n_tokens++;
    strata_sampler_accept(sl->sm, id);
    if (b->o.gen.draft_max && batch_hist_push(sl, id)) {
        fprintf(stderr, "strata batch: out of memory (line %d)\n", j->line);
        return 1;
    }
    size_t old = j->text.len;
    int n = tokenizer_stream_feed(b->tok, &sl->ts, id, piece, sizeof(piece));
    if (n > 0 && batch_text_append(&j->text, piece, (size_t)n)) {
        fprintf(stderr, "strata batch: out of memory (line %d's text)\n", j->line);
        return 1;
    }
    if (batch_cut_stop(j, old))
        return batch_finish(b, sl, NULL);
    if (j->n_gen == j->gen.n_predict)
        return batch_finish(b, sl, "length");
    if (pos >= strata_stream_n_ctx(sl->st))
        return batch_finish(b, sl, "context");
    sl->next = id;
    return 0;
}

/* Samples slot sl's next token from logits (n_vocab) and handles it (batch_take). 0 or 1
 * after the message. */
static int batch_sample(struct batch *b, struct batch_slot *sl, float *logits)
{
    if (sl->job->n_gen >= sl->job->gen.n_predict) /* n_predict 0 */
        return batch_finish(b, sl, "length");
    return batch_take(b, sl, strata_sampler_sample(sl->sm, logits), strata_stream_pos(sl->st));
}

/* --spec: the drafts slot sl's next step verifies with its token (sl->k of them): the
 * adaptive length, within n_predict and the context, looked up in the job's ids. */
static void batch_draft(const struct batch *b, struct batch_slot *sl)
{
    const struct batch_job *j = sl->job;
    int k = 0;
    if (b->o.gen.draft_max && sl->fed == j->n_prompt) {
        k = strata_draft_pace_len(&sl->pace, b->o.gen.draft_max);
        int left = j->gen.n_predict - j->n_gen;
        int room = strata_stream_n_ctx(sl->st) - strata_stream_pos(sl->st) - 1;
        k = k < left ? k : left;
        k = k < room ? k : room;
        if (k > 0 && sl->drafter)
            k = strata_drafter_draft(sl->drafter, sl->hist, sl->n_hist, k, sl->drafts);
        else if (k > 0 && sl->mtp)
            k = strata_mtp_draft(sl->mtp, sl->hist, sl->n_hist, k, sl->drafts);
        else
            k = k > 0 ? strata_ngram_draft(sl->hist, sl->n_hist, b->o.gen.draft_ngram, k,
                                           sl->drafts)
                      : 0;
    }
    sl->k = k;
}

/* After a step that evaluated slot sl's token and its sl->k drafts (rows: their logits, k + 1
 * rows): keeps the drafts sampling agrees with, rewinds the cache past the rest, and handles
 * the next token. 0 or 1 after the message. */
static int batch_verify(struct batch *b, struct batch_slot *sl, float *rows)
{
    const size_t nv = (size_t)b->n_vocab;
    const int k = sl->k, base = strata_stream_pos(sl->st) - (k + 1);
    int acc = 0, rc = 0;

    if (k == 0)
        return batch_sample(b, sl, rows);
    b->n_verify++;
    b->n_drafted += k;
    for (int i = 0; i < k; i++)
        b->drafted_at[i < 16 ? i : 15]++;
    for (int i = 0; i < k; i++) {
        bool ok;
        int32_t t = strata_sampler_sample_draft(sl->sm, rows + (size_t)i * nv, sl->drafts[i], &ok);
        if (!ok) { /* the row's choice is the next token; the cache keeps the drafts before */
            strata_stream_truncate(sl->st, base + 1 + i);
            rc = batch_take(b, sl, t, base + 1 + i);
            goto out;
        }
        acc++;
        b->accepted_at[i < 16 ? i : 15]++;
        if ((rc = batch_take(b, sl, t, base + 1 + i)) || !sl->job)
            goto out;
    }
    rc = batch_sample(b, sl, rows + (size_t)k * nv);
out:
    b->n_accepted += acc;
    strata_draft_pace_update(&sl->pace, k, acc);
    return rc;
}

/* The prompt of slot sl's job is evaluated (its last chunk's logits in `logits`): its
 * timing, its first token. 0 or 1 after the message. */
static int batch_prompt_done(struct batch *b, struct batch_slot *sl, float *logits)
{
    struct batch_job *j = sl->job;
    sl->fed = j->n_prompt;
    sl->t_gen0 = clock_now_s();
    j->prompt_ms = (sl->t_gen0 - sl->t_start) * 1e3;
    free(j->ids);
    j->ids = NULL;
    return batch_sample(b, sl, logits);
}

/* Starts job j in free slot sl: its sampler; with `join`, its prompt is left to join the next
 * steps (batch_loop), else evaluated alone now and its first token sampled. 0, -EINTR (Ctrl-C
 * during the prompt), or 1 after the message. */
static int batch_start(struct batch *b, struct batch_slot *sl, struct batch_job *j, bool join)
{
    int rc;

    if (strata_sampler_open(b->sess.s, &j->gen.sampling, &sl->sm))
        return cli_fail("the sampler");
    /* the draft model drafts what this line's greedy sampler, penalty included, would pick */
    if (sl->drafter && strata_drafter_set_penalty(sl->drafter, j->gen.sampling.repeat_penalty,
                                                  j->gen.sampling.repeat_last_n))
        return cli_fail("the draft model's penalty");
    for (int i = 0; i < j->n_prompt; i++) /* the repetition penalty sees the prompt */
        strata_sampler_accept(sl->sm, j->ids[i]);
    sl->n_hist = 0;
    strata_draft_pace_init(&sl->pace);
    for (int i = 0; b->o.gen.draft_max && i < j->n_prompt; i++)
        if (batch_hist_push(sl, j->ids[i]))
            return cli_fail("out of memory");
    tokenizer_stream_init(&sl->ts, TOKENIZER_DECODE_SKIP_CONTROL);
    sl->job = j;
    sl->fed = 0;
    j->state = JOB_RUNNING;
    sl->t_start = clock_now_s();
    if (join)
        return 0;
    rc = strata_eval(sl->st, j->ids, j->n_prompt, b->logits);
    if (rc) {
        strata_sampler_close(sl->sm);
        sl->sm = NULL;
        sl->job = NULL;
        strata_stream_truncate(sl->st, 0);
        j->state = JOB_PENDING;
        if (rc == -EINTR)
            return rc;
        fprintf(stderr, "strata batch: line %d's prompt: %s\n", j->line, strata_error());
        return 1;
    }
    return batch_prompt_done(b, sl, b->logits);
}

/* Fills the free slots with pending jobs (none after Ctrl-C): while a slot decodes (and
 * --prefill-chunk is not 0) a new job's prompt joins the steps, else it is evaluated alone.
 * 0, or 1 after the message. */
static int batch_fill(struct batch *b)
{
    for (int i = 0; i < b->n_slots; i++) {
        struct batch_slot *sl = &b->slots[i];
        while (!sl->job && !batch_interrupted) {
            while (b->next_start < b->n_jobs && b->jobs[b->next_start].state != JOB_PENDING)
                b->next_start++;
            if (b->next_start == b->n_jobs)
                return 0;
            bool decoding = false;
            for (int k = 0; k < b->n_slots; k++)
                decoding |= b->slots[k].job && b->slots[k].fed == b->slots[k].job->n_prompt;
            int rc = batch_start(b, sl, &b->jobs[b->next_start], decoding && b->bo.chunk > 0);
            if (rc == -EINTR)
                return 0;
            if (rc)
                return rc;
        }
    }
    return 0;
}

static void batch_progress(struct batch *b, bool final)
{
    double now = clock_now_s(), dt = now - b->t0;
    if (!final && now - b->t_shown < (b->tty ? 1.0 : 10.0))
        return;
    if (final && !b->shown)
        return;
    fprintf(stderr, "%sstrata batch: %d / %d lines, %lld tokens, %.1f tok/s%s", b->tty ? "\r" : "",
            b->n_done, b->n_total, b->n_tokens, dt > 0 ? b->n_tokens / dt : 0.0,
            b->tty && !final ? "\033[K" : "\n");
    b->t_shown = now;
    b->shown = true;
}

/* The loop (DESIGN). 0, or 1 after the message. */
static int batch_loop(struct batch *b)
{
    const int max_rows = batch_max_rows(b);
    const size_t nv = (size_t)b->n_vocab;
    struct strata_stream **sts = malloc(sizeof(*sts) * (size_t)b->n_slots);
    struct batch_slot **busy = malloc(sizeof(*busy) * (size_t)b->n_slots);
    int *n_tok = malloc(sizeof(int) * (size_t)b->n_slots);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)max_rows);
    int rc = 0;

    if (!sts || !busy || !n_tok || !ids) {
        fprintf(stderr, "strata batch: out of memory\n");
        rc = 1;
    }
    while (!rc) {
        int n = 0, rows = 0;
        if ((rc = batch_fill(b)) || (rc = batch_write_ready(b, false)))
            break;
        if (batch_interrupted) /* during a prompt: no step after it */
            break;
        /* the decoding slots' tokens first, then the joining prompts' chunks in what is left */
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < b->n_slots; i++) {
                struct batch_slot *sl = &b->slots[i];
                if (!sl->job || (sl->fed < sl->job->n_prompt) != (pass == 1))
                    continue;
                if (!pass)
                    batch_draft(b, sl); /* every stream's drafts fit: max_rows has room */
                int t = pass ? sl->job->n_prompt - sl->fed : 1 + sl->k;
                t = t < max_rows - rows ? t : max_rows - rows;
                if (t < 1)
                    continue;
                busy[n] = sl;
                sts[n] = sl->st;
                n_tok[n++] = t;
                if (pass) {
                    memcpy(ids + rows, sl->job->ids + sl->fed, sizeof(int32_t) * (size_t)t);
                } else {
                    ids[rows] = sl->next;
                    memcpy(ids + rows + 1, sl->drafts, sizeof(int32_t) * (size_t)sl->k);
                }
                rows += t;
            }
        }
        if (!n)
            break; /* nothing pending, or Ctrl-C */
        const bool spec = b->o.gen.draft_max > 0;
        if ((spec ? strata_batch_eval_rows : strata_batch_eval_chunks)(b->bt, sts, n_tok, n, ids,
                                                                       b->logits)) {
            rc = cli_fail("decoding a step");
            break;
        }
        for (int i = 0, at = 0; i < n && !rc; at += n_tok[i], i++) {
            struct batch_slot *sl = busy[i];
            /* with --spec every row came back: the stream's rows start at `at` */
            float *first = b->logits + (spec ? (size_t)at : (size_t)i) * nv;
            float *last = spec ? first + (size_t)(n_tok[i] - 1) * nv : first;
            if (sl->fed == sl->job->n_prompt)
                rc = spec ? batch_verify(b, sl, first) : batch_sample(b, sl, last);
            else if ((sl->fed += n_tok[i]) == sl->job->n_prompt)
                rc = batch_prompt_done(b, sl, last);
        }
        if (!rc)
            rc = batch_write_ready(b, false);
        batch_progress(b, false);
        if (batch_interrupted)
            break;
    }
    free(sts);
    free(busy);
    free(n_tok);
    free(ids);
    return rc;
}

/* ---- the command -------------------------------------------------------------------------- */

static void batch_free(struct batch *b)
{
    for (int i = 0; i < b->n_jobs; i++) {
        struct batch_job *j = &b->jobs[i];
        free(j->id.str);
        if (j->error != batch_oom)
            free(j->error);
        free(j->prompt);
        free(j->ids);
        free(j->text.buf);
        for (int k = 0; k < STRATA_MAX_STOP; k++)
            free(j->stops[k]);
    }
    free(b->jobs);
}

/* The chat format of the model, read from its general.architecture before the jobs are (they
 * are rendered as they are read): ChatML when the file cannot be read (loading it reports
 * why); and its general.sampling.* defaults for the flags not given. */
static void batch_peek_style(struct batch *b)
{
    const char *path = b->o.model ? b->o.model : run_opts_default_model();
    struct gguf_file *f = NULL;
    struct gguf_str a;
    char arch[64] = "";

    if (path && !gguf_open(path, &f) && !gguf_get_str(f, "general.architecture", &a) &&
        a.len < sizeof(arch))
        memcpy(arch, a.ptr, a.len);
    struct strata_sampling fs = b->o.gen.sampling; /* the lines start from these */
    run_opts_sampling_take(&b->o, &fs, strata_sampling_from_gguf(f, &fs));
    gguf_close(f);
    err_clear();
    b->style = (struct chat_style){.format = chat_format_of_arch(arch),
                                   .think = b->o.think,
                                   .start = true,
                                   .date = run_today(b->today, sizeof(b->today))};
}

int cmd_batch(int argc, char **argv)
{
    struct batch b = {.fd = -1};
    int rc, n_pending = 0;

    rc = batch_parse_flags(argc, argv, &b.bo, &b.o);
    if (rc)
        return rc == 1 ? 0 : rc;
    if ((rc = batch_check_flags(&b.bo, &b.o)))
        return rc;
    batch_peek_style(&b);
    if ((rc = batch_read_input(&b)) || (rc = batch_check_ids(&b)))
        goto out;
    if (b.bo.resume && (rc = batch_resume(&b)))
        goto out;
    b.fd = open(b.bo.out, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
    if (b.fd < 0) {
        fprintf(stderr, "strata batch: -o %s: %s\n", b.bo.out, strerror(errno));
        rc = 1;
        goto out;
    }
    for (int i = 0; i < b.n_jobs; i++) {
        b.n_total += b.jobs[i].state != JOB_SKIPPED;
        n_pending += b.jobs[i].state == JOB_PENDING;
    }
    if (!b.n_jobs)
        fprintf(stderr, "strata batch: --input %s holds no lines\n", b.bo.input);
    if (batch_write_ready(&b, false) || (n_pending && batch_open_engine(&b, n_pending))) {
        rc = 1;
        goto out;
    }
    for (int i = 0; i < b.n_jobs; i++) /* parse and tokenizer errors are done lines */
        b.n_failed += b.jobs[i].error != NULL && b.jobs[i].state != JOB_SKIPPED;
    b.n_done = b.n_failed;
    b.t0 = b.t_shown = clock_now_s();
    b.tty = isatty(STDERR_FILENO);
    if (b.bt) {
        struct sigaction sa = {.sa_handler = batch_on_sigint}, old_int;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, &old_int);
        rc = batch_loop(&b);
        sigaction(SIGINT, &old_int, NULL);
    }
    if (batch_write_ready(&b, true))
        rc = 1;
    batch_progress(&b, true);
    double dt = clock_now_s() - b.t0;
    if (batch_interrupted) {
        fprintf(stderr,
                "strata batch: interrupted (Ctrl-C): %d of %d lines done and written "
                "to %s; --resume runs the rest\n",
                b.n_written, b.n_total, b.bo.out);
        rc = 130;
    } else if (!rc) {
        fprintf(stderr,
                "strata batch: %d lines done in %.1f s, %lld tokens generated (%.1f "
                "tok/s); results in %s\n",
                b.n_done, dt, b.n_tokens, dt > 0 ? b.n_tokens / dt : 0.0, b.bo.out);
        if (b.n_verify) {
            fprintf(stderr,
                    "strata batch: speculative: %lld verify passes, %lld drafted, %lld accepted "
                    "(%.1f%%), %.2f tokens per pass\n",
                    b.n_verify, b.n_drafted, b.n_accepted,
                    b.n_drafted ? 100.0 * b.n_accepted / b.n_drafted : 0.0,
                    (double)(b.n_accepted + b.n_verify) / (double)b.n_verify);
            fprintf(stderr, "strata batch: speculative: accepted by draft position:");
            for (int i = 0; i < 16 && b.drafted_at[i]; i++)
                fprintf(stderr, " %d:%.0f%%", i + 1, 100.0 * b.accepted_at[i] / b.drafted_at[i]);
            fprintf(stderr, "\n");
        }
        if (b.n_failed) {
            fprintf(stderr,
                    "strata batch: %d of %d lines failed: their error objects are in "
                    "%s\n",
                    b.n_failed, b.n_total, b.bo.out);
            rc = 1;
        }
    }
out:
    batch_close_engine(&b);
    if (b.fd >= 0)
        close(b.fd);
    batch_free(&b);
    return rc;
}
