/* strata serve: an OpenAI-compatible HTTP server (libmicrohttpd) on the lockstep engine.
 *
 * Threads: libmicrohttpd runs one thread per connection; each request is parsed, tokenized and
 * queued there, and its response is produced by a content reader that waits for the engine.
 * One engine thread owns the model: each step it admits queued requests into free streams,
 * evaluates one token of every decoding stream (and a chunk of a joining prompt) in one
 * strata_batch_eval_chunks call, samples every row with its request's own sampler, and wakes
 * the connections. One mutex (serve.mu) guards the queue, the requests' results and the
 * counters; the model is used by the engine thread alone, outside the mutex.
 *
 * Prefix reuse: the server holds --parallel + --park streams. A stream keeps its KV cache
 * after its request ends (parked, with the ids it holds); a new request takes the free stream
 * whose ids share the longest prefix with its prompt (the least recently used one when none
 * does), truncates it to that prefix and evaluates only the rest. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "chat.h"
#include "cli.h"
#include "clock.h"
#include "errors.h"
#include "json_text.h"
#include "model.h"
#include "run_opts.h"
#include "strata.h"
#include "strata_internal.h"
#include "tokenizer.h"

extern const unsigned char serve_page_html[];
extern const unsigned long serve_page_html_len;

#define SERVE_CHUNK 16          /* prompt tokens that join a step while others decode */
#define SERVE_WAIT_MS 200       /* a waiting response checks its client this often */
#define SERVE_ID_MAX 48

struct serve_opts {
    const char *host;
    int port;
    int parallel;     /* requests decoding at once */
    int park;         /* streams beyond them that keep finished requests' caches */
    int queue_max;    /* requests waiting beyond them; more get 429 */
    const char *api_key;
    uint64_t body_max; /* request body bytes */
    int max_tokens;   /* max_tokens a request may ask for (0: the context) */
    const char *alias; /* the model's name in the API */
};

enum req_state { REQ_QUEUED, REQ_RUNNING, REQ_DONE };

struct serve;

struct serve_req {
    struct serve *sv;
    int refs; /* the connection's and the engine's (under mu) */
    bool chat, stream, include_usage;
    char id[SERVE_ID_MAX];
    long long created;
    int32_t *ids;
    int n_prompt;
    struct strata_generate_params gen;
    char *stops[STRATA_MAX_STOP];
    size_t stop_max; /* the longest stop string */
    /* results, under mu */
    enum req_state state;
    char *text;
    size_t len, cap;
    int n_gen, n_cached;
    const char *finish;
    bool gone; /* the client left: the engine drops the request at its next step */
    double t_queued, t_start, t_prompt_done, t_end;
    pthread_cond_t cv;
    struct serve_req *next; /* the queue */
    /* the connection's side (its thread only) */
    struct MHD_Connection *conn;
    size_t sent; /* text bytes sent (stream) */
    int phase;   /* stream: 0 role, 1 content, 2 [DONE] sent; non-stream: 0 body, 1 sent */
    char *out;
    size_t out_len, out_off;
    /* a chat request on a harmony model (gpt-oss): its reply split into channels, the final
     * one as content and the analysis as reasoning_content (NULL otherwise) */
    struct chat_harmony *hm;
    char *part[2]; /* this chunk's content [0] and reasoning [1] */
    size_t n_part[2], cap_part[2];
};

struct serve_slot {
    struct strata_stream *st;
    int32_t *hist; /* the ids in st's cache */
    int n_hist, cap_hist;
    double last_used;
    struct serve_req *req; /* NULL: free (parked) */
    struct strata_sampler *sm;
    struct tokenizer_stream ts;
    int32_t next; /* the token its next step evaluates */
    int fed;      /* prompt tokens in the cache (< n_prompt: the prompt is joining steps) */
    /* --spec ngram: this step's drafts (hist holds the ids they are looked up in) */
    int32_t drafts[64];
    int k;
    struct strata_draft_pace pace; /* the adaptive draft length, paused after misses */
    struct strata_mtp *mtp; /* --spec mtp: the model's MTP block following st */
};

struct serve {
    struct serve_opts so;
    struct run_opts o;
    struct strata *s;
    const struct tokenizer *tok;
    int n_vocab, n_ctx;
    enum chat_format fmt; /* of the model: ChatML, or harmony (gpt-oss) */
    struct serve_slot *slots;
    int n_slots;
    struct strata_batch *bt;
    float *logits;
    pthread_mutex_t mu;
    pthread_cond_t work; /* the engine waits here for requests */
    struct serve_req *head, *tail;
    int n_queued, n_running;
    int n_live; /* requests queued, running, or still being sent */
    bool ready, stopping;
    unsigned long long next_id;
    struct MHD_Daemon *d;
    /* counters (under mu) */
    unsigned long long n_requests, n_ok, n_bad, n_rejected, n_cancelled;
    unsigned long long tok_gen, tok_prompt, tok_cached;
    double t_decode; /* engine seconds in steps with decoding rows */
    unsigned long long tok_decode;
    unsigned long long n_verify, n_drafted, n_accepted; /* --spec */
    double t_start;
};

static volatile sig_atomic_t serve_signals;

static void serve_on_signal(int sig)
{
    (void)sig;
    serve_signals++;
}

/* ---- the command line --------------------------------------------------------------------- */

static void serve_usage(void)
{
    printf(
        "usage: strata serve [-m MODEL] [options]\n"
        "\n"
        "An OpenAI-compatible HTTP server. Requests decode together in lockstep (one forward\n"
        "pass per step for all of them, each expert fetched once per step), and a request whose\n"
        "prompt starts with what an earlier request evaluated reuses that KV cache.\n"
        "\n"
        "Endpoints: POST /v1/chat/completions, POST /v1/completions (stream: true gives\n"
        "server-sent events ending in data: [DONE]), GET /v1/models, GET /health\n"
        "(loading | ready | busy), GET /metrics (Prometheus text), GET / (a chat page).\n"
        "Request keys: model, messages | prompt, max_tokens (max_completion_tokens),\n"
        "temperature, top_p, top_k, min_p, repeat_penalty, seed, stop (a string or up to %d),\n"
        "n (1), stream, stream_options.include_usage; absent ones take the flags' values\n"
        "(for a sampling flag not given, the model file's general.sampling.* key where it has\n"
        "one; no seed: a random one unless -s is given), max_tokens the rest of the context.\n"
        "Other keys are ignored.\n"
        "\n"
        "Server options:\n"
        "      --host ADDR         address to listen on (default 127.0.0.1)\n"
        "      --port N            TCP port (default 8080)\n"
        "      --parallel N        requests decoding at once, in lockstep (default 4)\n"
        "      --park N            further KV caches kept for prefix reuse (default: --parallel)\n"
        "      --queue N           requests waiting for a stream; beyond them 429 (default 64)\n"
        "      --api-key KEY       require \"Authorization: Bearer KEY\" (also STRATA_API_KEY)\n"
        "      --max-body SIZE     request body limit (default 1M)\n"
        "      --max-tokens N      the largest max_tokens a request may ask (default: -c)\n"
        "      --alias NAME        the model's name in the API (default: the file's name)\n"
        "\n"
        "Model, device and sampling options are strata run's (see strata run --help): -m, -t,\n"
        "-c (each stream's context), -b, --device, --vram-budget, --placement, --residency,\n"
        "--streaming, --prefetch[-depth], --profile..., --host-budget..., --temp, --top-k,\n"
        "--top-p, --min-p, --repeat-penalty, --repeat-last-n, -s, --think/--no-think,\n"
        "--spec ngram|mtp [--draft-max K] (each request's step also verifies prompt-lookup\n"
        "drafts, or those of the model's own MTP block: qwen3next, qwen35moe files with one),\n"
        "--system (a system message for chats that have none), --bind, --no-mmap, -v.\n"
        "Every stream's KV cache counts against --vram-budget (--parallel + --park streams).\n"
        "SIGINT/SIGTERM: queued requests are cancelled, running ones finish, then the server\n"
        "exits; a second signal exits at once.\n",
        STRATA_MAX_STOP);
}

static bool serve_run_flag(const char *a, bool *takes_value)
{
    static const char with_value[] =
        "-m --model -t --threads --cpu-threads -c --ctx-size -b --batch-size --device "
        "--vram-budget --placement --residency --streaming --prefetch-depth --prefetch-top "
        "--profile "
        "--stats-json --system --temp --top-k --top-p --min-p --repeat-penalty "
        "--repeat-last-n -s --seed --host-budget --host-io --spec --draft-max --draft-ngram";
    static const char bare[] = "--think --no-think --bind --no-mmap --no-mtp -v --verbose --stats "
                               "--prefetch --profile-freeze --profile-optional --host-buffered "
                               "--host-read-ahead";
    return run_opts_flag_in(with_value, bare, a, takes_value);
}

static int serve_parse(int argc, char **argv, struct serve_opts *so, struct run_opts *o)
{
    char **rest = calloc((size_t)argc + 1, sizeof(char *));
    int n_rest = 1, rc = 0;

    *so = (struct serve_opts){.host = "127.0.0.1", .port = 8080, .parallel = 4, .park = -1,
                              .queue_max = 64, .body_max = 1 << 20};
    so->api_key = getenv("STRATA_API_KEY");
    if (so->api_key && !*so->api_key)
        so->api_key = NULL;
    run_opts_init(o);
    if (!rest) {
        fprintf(stderr, "strata serve: out of memory\n");
        return 2;
    }
    rest[0] = argv[0];
    for (int i = 1; i < argc && !rc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = false;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            serve_usage();
            rc = 1;
        } else if (!strcmp(a, "--spec") && v && !strcmp(v, "draft")) {
            fprintf(stderr, "strata serve: --spec draft is not available in serve (--spec ngram "
                            "and mtp are); run, chat, bench and batch take a draft model\n");
            rc = 2;
        } else if (serve_run_flag(a, &takes)) {
            rest[n_rest++] = argv[i];
            if (takes && v)
                rest[n_rest++] = argv[++i];
        } else if (!v && (!strcmp(a, "--host") || !strcmp(a, "--port") ||
                          !strcmp(a, "--parallel") || !strcmp(a, "--park") ||
                          !strcmp(a, "--queue") || !strcmp(a, "--api-key") ||
                          !strcmp(a, "--max-body") || !strcmp(a, "--max-tokens") ||
                          !strcmp(a, "--alias"))) {
            fprintf(stderr, "strata serve: %s needs a value\n", a);
            rc = 2;
        } else if (!strcmp(a, "--host")) {
            so->host = argv[++i];
        } else if (!strcmp(a, "--port")) {
            rc = args_i32("serve", a, argv[++i], 1, 65535, &so->port);
        } else if (!strcmp(a, "--parallel")) {
            rc = args_i32("serve", a, argv[++i], 1, 256, &so->parallel);
        } else if (!strcmp(a, "--park")) {
            rc = args_i32("serve", a, argv[++i], 0, 1024, &so->park);
        } else if (!strcmp(a, "--queue")) {
            rc = args_i32("serve", a, argv[++i], 0, 1 << 20, &so->queue_max);
        } else if (!strcmp(a, "--api-key")) {
            so->api_key = argv[++i];
            if (!*so->api_key) {
                fprintf(stderr, "strata serve: --api-key is empty\n");
                rc = 2;
            }
        } else if (!strcmp(a, "--max-body")) {
            rc = args_size("serve", a, argv[++i], 64, (uint64_t)1 << 30, &so->body_max);
        } else if (!strcmp(a, "--max-tokens")) {
            rc = args_i32("serve", a, argv[++i], 1, 1 << 24, &so->max_tokens);
        } else if (!strcmp(a, "--alias")) {
            so->alias = argv[++i];
        } else {
            fprintf(stderr, "strata serve: unknown option '%s' (see --help)\n", a);
            rc = 2;
        }
    }
    if (!rc)
        rc = run_opts_parse(o, n_rest, rest, "serve");
    free(rest);
    if (!rc && so->park < 0)
        so->park = so->parallel;
    if (!rc && run_opts_model("serve", &o->model))
        rc = 2;
    return rc;
}

/* ---- requests ----------------------------------------------------------------------------- */

static void req_unref(struct serve_req *r) /* under mu */
{
    if (--r->refs > 0)
        return;
    if (r->t_queued > 0)
        r->sv->n_live--;
    pthread_cond_destroy(&r->cv);
    free(r->ids);
    free(r->text);
    free(r->out);
    for (int i = 0; i < STRATA_MAX_STOP; i++)
        free(r->stops[i]);
    if (r->hm) {
        chat_harmony_free(r->hm);
        free(r->hm);
    }
    free(r->part[0]);
    free(r->part[1]);
    free(r);
}

/* The harmony splitter's output: final text to part[0], the other channels to part[1]. */
static void req_harmony_emit(void *ctx, const char *channel, const char *text, size_t len)
{
    struct serve_req *r = ctx;
    int k = strcmp(channel, "final") != 0;
    if (r->n_part[k] + len + 1 > r->cap_part[k]) {
        size_t cap = (r->n_part[k] + len + 1) * 2;
        char *p = realloc(r->part[k], cap);
        if (!p)
            return; /* out of memory: the piece is lost, the reply goes on */
        r->part[k] = p;
        r->cap_part[k] = cap;
    }
    memcpy(r->part[k] + r->n_part[k], text, len);
    r->n_part[k] += len;
}

static int req_append(struct serve_req *r, const char *s, size_t n)
{
    if (r->len + n + 1 > r->cap) {
        size_t cap = (r->len + n + 1) * 2 + 64;
        char *nb = realloc(r->text, cap);
        if (!nb)
            return -ENOMEM;
        r->text = nb;
        r->cap = cap;
    }
    memcpy(r->text + r->len, s, n);
    r->len += n;
    r->text[r->len] = 0;
    return 0;
}

/* Cuts the text at the earliest stop string ending after byte old_len: true when one was
 * found (strata_generate's rule). */
static bool req_cut_stop(struct serve_req *r, size_t old_len)
{
    long best = -1;
    for (int i = 0; i < r->gen.n_stop; i++) {
        size_t sl = strlen(r->gen.stop[i]);
        if (!sl || sl > r->len)
            continue;
        size_t from = old_len + 1 > sl ? old_len + 1 - sl : 0;
        for (size_t at = from; at + sl <= r->len; at++)
            if (!memcmp(r->text + at, r->gen.stop[i], sl)) {
                if (best < 0 || (long)at < best)
                    best = (long)at;
                break;
            }
    }
    if (best >= 0) {
        r->len = (size_t)best;
        if (r->text)
            r->text[r->len] = 0;
    }
    return best >= 0;
}

/* Text a stream may send: all of it once done; before that, not the tail that could still turn
 * into a stop string. */
static size_t req_sendable(const struct serve_req *r)
{
    if (r->state == REQ_DONE || !r->stop_max)
        return r->len;
    size_t hold = r->stop_max - 1;
    size_t n = r->len > hold ? r->len - hold : 0;
    /* never split a UTF-8 character */
    while (n > 0 && n < r->len && ((unsigned char)r->text[n] & 0xC0) == 0x80)
        n--;
    return n;
}

/* ---- the engine --------------------------------------------------------------------------- */

static int slot_hist_push(struct serve_slot *sl, const int32_t *ids, int n)
{
    if (sl->n_hist + n > sl->cap_hist) {
        int cap = (sl->n_hist + n) * 2 + 64;
        int32_t *nh = realloc(sl->hist, sizeof(int32_t) * (size_t)cap);
        if (!nh)
            return -ENOMEM;
        sl->hist = nh;
        sl->cap_hist = cap;
    }
    memcpy(sl->hist + sl->n_hist, ids, sizeof(int32_t) * (size_t)n);
    sl->n_hist += n;
    return 0;
}

/* Ends slot sl's request (reason NULL: a stop string was cut) and frees the slot; its cache
 * stays (parked). Under mu. */
static void engine_finish(struct serve *sv, struct serve_slot *sl, const char *reason)
{
    struct serve_req *r = sl->req;
    char tail[8];

    if (reason && strcmp(reason, "cancelled")) {
        size_t old = r->len;
        int n = tokenizer_stream_flush(&sl->ts, tail, sizeof(tail));
        if (n > 0)
            req_append(r, tail, (size_t)n);
        if (req_cut_stop(r, old))
            reason = NULL;
    }
    r->finish = reason ? reason : "stop";
    r->state = REQ_DONE;
    r->t_end = clock_now_s();
    if (!strcmp(r->finish, "cancelled"))
        sv->n_cancelled++;
    else
        sv->n_ok++;
    sv->tok_gen += (unsigned long long)r->n_gen;
    pthread_cond_broadcast(&r->cv);
    strata_sampler_close(sl->sm);
    sl->sm = NULL;
    sl->req = NULL;
    sl->last_used = clock_now_s();
    sv->n_running--;
    req_unref(r);
}

/* Handles slot sl's chosen token id in strata_generate's order: end of generation, the text
 * and its stop strings, max_tokens, the context (pos: the tokens before id in the cache).
 * Under mu. */
static void engine_take(struct serve *sv, struct serve_slot *sl, int32_t id, int pos)
{
    struct serve_req *r = sl->req;
    char piece[4096];

    if (!r->gen.ignore_eos && strata_token_is_eog(sv->s, id))
        return engine_finish(sv, sl, "stop");
    r->n_gen++;
    strata_sampler_accept(sl->sm, id);
    size_t old = r->len;
    int n = tokenizer_stream_feed(sv->tok, &sl->ts, id, piece, sizeof(piece));
    if (n > 0 && req_append(r, piece, (size_t)n))
        return engine_finish(sv, sl, "length");
    pthread_cond_broadcast(&r->cv);
    if (req_cut_stop(r, old))
        return engine_finish(sv, sl, NULL);
    if (r->n_gen == r->gen.n_predict)
        return engine_finish(sv, sl, "length");
    if (pos >= strata_stream_n_ctx(sl->st))
        return engine_finish(sv, sl, "length");
    sl->next = id;
}

/* Samples slot sl's next token from logits and handles it. Under mu. */
static void engine_sample(struct serve *sv, struct serve_slot *sl, float *logits)
{
    if (sl->req->n_gen >= sl->req->gen.n_predict)
        return engine_finish(sv, sl, "length");
    engine_take(sv, sl, strata_sampler_sample(sl->sm, logits), strata_stream_pos(sl->st));
}

/* --spec: slot sl's drafts for its next step (sl->k), looked up in the ids its cache holds
 * and the token it evaluates next. Under mu. */
static void engine_draft(struct serve *sv, struct serve_slot *sl)
{
    const struct serve_req *r = sl->req;
    int k = 0;
    sl->k = 0;
    if (!sv->o.gen.draft_max || slot_hist_push(sl, &sl->next, 1))
        return;
    sl->n_hist--; /* sl->next only lends itself to the lookup: it is evaluated by the step */
    k = strata_draft_pace_len(&sl->pace, sv->o.gen.draft_max);
    int left = r->gen.n_predict - r->n_gen;
    int room = strata_stream_n_ctx(sl->st) - strata_stream_pos(sl->st) - 1;
    k = k < left ? k : left;
    k = k < room ? k : room;
    if (k > 0 && sl->mtp)
        sl->k = strata_mtp_draft(sl->mtp, sl->hist, sl->n_hist + 1, k, sl->drafts);
    else if (k > 0)
        sl->k = strata_ngram_draft(sl->hist, sl->n_hist + 1, sv->o.gen.draft_ngram, k,
                                   sl->drafts);
}

/* After a step that evaluated slot sl's token and its sl->k drafts (rows: k + 1 rows of
 * logits): keeps the drafts sampling agrees with, rewinds past the rest, handles the next
 * token. Under mu. */
static void engine_verify(struct serve *sv, struct serve_slot *sl, float *rows)
{
    const size_t nv = (size_t)sv->n_vocab;
    const int k = sl->k, base = strata_stream_pos(sl->st) - (k + 1);
    int acc = 0;

    if (k == 0)
        return engine_sample(sv, sl, rows);
    sv->n_verify++;
    sv->n_drafted += (unsigned long long)k;
    for (int i = 0; i < k; i++) {
        bool ok;
        int32_t t = strata_sampler_sample_draft(sl->sm, rows + (size_t)i * nv, sl->drafts[i], &ok);
        if (!ok) {
            strata_stream_truncate(sl->st, base + 1 + i);
            sl->n_hist = base + 1 + i;
            engine_take(sv, sl, t, base + 1 + i);
            goto out;
        }
        acc++;
        engine_take(sv, sl, t, base + 1 + i);
        if (!sl->req) { /* finished: the cache holds what was evaluated */
            strata_stream_truncate(sl->st, base + 1 + acc);
            sl->n_hist = base + 1 + acc;
            goto out;
        }
    }
    engine_sample(sv, sl, rows + (size_t)k * nv);
out:
    sv->n_accepted += (unsigned long long)acc;
    strata_draft_pace_update(&sl->pace, k, acc);
}

static int lcp(const int32_t *a, int na, const int32_t *b, int nb)
{
    int n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* Admits queued requests into free streams while fewer than --parallel run: the free stream
 * sharing the longest prefix with the prompt, else the least recently used. Under mu. */
static void engine_admit(struct serve *sv)
{
    while (sv->head && sv->n_running < sv->so.parallel) {
        struct serve_req *r = sv->head;
        sv->head = r->next;
        if (!sv->head)
            sv->tail = NULL;
        sv->n_queued--;
        if (r->gone) {
            r->state = REQ_DONE;
            r->finish = "cancelled";
            sv->n_cancelled++;
            req_unref(r);
            continue;
        }
        int best = -1, best_len = -1;
        for (int i = 0; i < sv->n_slots; i++) {
            struct serve_slot *sl = &sv->slots[i];
            if (sl->req)
                continue;
            int c = lcp(sl->hist, sl->n_hist, r->ids, r->n_prompt);
            if (c > best_len ||
                (c == best_len && sl->last_used < sv->slots[best].last_used)) {
                best = i;
                best_len = c;
            }
        }
        struct serve_slot *sl = &sv->slots[best];
        int keep = best_len < r->n_prompt ? best_len : r->n_prompt - 1; /* one to evaluate */
        strata_stream_truncate(sl->st, keep);
        sl->n_hist = keep;
        sl->fed = keep;
        r->n_cached = keep;
        if (strata_sampler_open(sv->s, &r->gen.sampling, &sl->sm)) {
            r->state = REQ_DONE;
            r->finish = "error";
            pthread_cond_broadcast(&r->cv);
            req_unref(r);
            continue;
        }
        for (int i = 0; i < r->n_prompt; i++)
            strata_sampler_accept(sl->sm, r->ids[i]);
        tokenizer_stream_init(&sl->ts, TOKENIZER_DECODE_SKIP_CONTROL);
        sl->req = r;
        strata_draft_pace_init(&sl->pace);
        r->state = REQ_RUNNING;
        r->t_start = clock_now_s();
        sv->n_running++;
        sv->tok_prompt += (unsigned long long)r->n_prompt;
        sv->tok_cached += (unsigned long long)keep;
    }
}

/* One step over the busy slots (decode tokens first, then prompt chunks); a prompt with no
 * one decoding is evaluated alone, whole. 0 or -errno. */
static int engine_step(struct serve *sv, struct strata_stream **sts, struct serve_slot **busy,
                       int *n_tok, int32_t *ids, int max_rows)
{
    int n = 0, rows = 0;
    bool decoding = false;

    pthread_mutex_lock(&sv->mu);
    for (int i = 0; i < sv->n_slots; i++) { /* clients that left free their stream here */
        struct serve_slot *sl = &sv->slots[i];
        if (sl->req && sl->req->gone)
            engine_finish(sv, sl, "cancelled");
        else if (sl->req && sl->fed == sl->req->n_prompt)
            decoding = true;
    }
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < sv->n_slots; i++) {
            struct serve_slot *sl = &sv->slots[i];
            if (!sl->req || (sl->fed < sl->req->n_prompt) != (pass == 1))
                continue;
            if (!pass)
                engine_draft(sv, sl); /* max_rows has room for every slot's drafts */
            int t = pass ? sl->req->n_prompt - sl->fed : 1 + sl->k;
            if (pass && !decoding && n == 0) { /* alone: the whole prompt at once */
                busy[0] = sl;
                n_tok[0] = t;
                n = -1;
                break;
            }
            t = t < max_rows - rows ? t : max_rows - rows;
            if (t < 1)
                continue;
            busy[n] = sl;
            sts[n] = sl->st;
            n_tok[n++] = t;
            if (pass) {
                memcpy(ids + rows, sl->req->ids + sl->fed, sizeof(int32_t) * (size_t)t);
            } else {
                ids[rows] = sl->next;
                memcpy(ids + rows + 1, sl->drafts, sizeof(int32_t) * (size_t)sl->k);
            }
            rows += t;
        }
    pthread_mutex_unlock(&sv->mu);
    if (n == 0)
        return 0;
    double t0 = clock_now_s();
    int rc;
    const bool spec = sv->o.gen.draft_max > 0, alone = n < 0;
    if (n < 0) { /* the owner of busy[0]'s request cannot free it: only the engine does */
        struct serve_slot *sl = busy[0];
        rc = strata_eval(sl->st, sl->req->ids + sl->fed, n_tok[0], sv->logits);
        if (!rc)
            rc = slot_hist_push(sl, sl->req->ids + sl->fed, n_tok[0]);
        n = 1;
    } else {
        rc = (spec ? strata_batch_eval_rows : strata_batch_eval_chunks)(sv->bt, sts, n_tok, n,
                                                                         ids, sv->logits);
        for (int i = 0, at = 0; i < n && !rc; at += n_tok[i], i++)
            rc = slot_hist_push(busy[i], ids + at, n_tok[i]);
    }
    double dt = clock_now_s() - t0;
    pthread_mutex_lock(&sv->mu);
    if (rc) {
        fprintf(stderr, "strata serve: a step failed: %s\n", strata_error());
        for (int i = 0; i < n; i++)
            if (busy[i]->req)
                engine_finish(sv, busy[i], "error");
        pthread_mutex_unlock(&sv->mu);
        return rc;
    }
    int dec = 0;
    for (int i = 0, at = 0; i < n; at += n_tok[i], i++) {
        struct serve_slot *sl = busy[i];
        /* with --spec every row came back: the slot's rows start at `at` */
        float *first = sv->logits + (spec && !alone ? (size_t)at : (size_t)i) * (size_t)sv->n_vocab;
        float *last = spec && !alone ? first + (size_t)(n_tok[i] - 1) * sv->n_vocab : first;
        if (sl->fed == sl->req->n_prompt) {
            int before = sl->req->n_gen;
            if (spec)
                engine_verify(sv, sl, first);
            else
                engine_sample(sv, sl, last);
            dec += sl->req ? sl->req->n_gen - before : 1;
        } else if ((sl->fed += n_tok[i]) == sl->req->n_prompt) {
            sl->req->t_prompt_done = clock_now_s();
            engine_sample(sv, sl, last);
        }
    }
    if (dec) {
        sv->t_decode += dt;
        sv->tok_decode += (unsigned long long)dec;
    }
    pthread_mutex_unlock(&sv->mu);
    return 0;
}

/* Rows a step may have: a token per decoding request, with --spec its drafts, and a prompt
 * chunk. */
static int serve_max_rows(const struct serve *sv)
{
    return sv->so.parallel * (1 + sv->o.gen.draft_max) + SERVE_CHUNK;
}

static void *engine_main(void *arg)
{
    struct serve *sv = arg;
    const int max_rows = serve_max_rows(sv);
    struct strata_stream **sts = malloc(sizeof(*sts) * (size_t)sv->n_slots);
    struct serve_slot **busy = malloc(sizeof(*busy) * (size_t)sv->n_slots);
    int *n_tok = malloc(sizeof(int) * (size_t)sv->n_slots);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)max_rows);

    if (!sts || !busy || !n_tok || !ids) {
        fprintf(stderr, "strata serve: out of memory\n");
        exit(1);
    }
    for (;;) {
        pthread_mutex_lock(&sv->mu);
        while (!sv->n_running && !sv->head && !sv->stopping)
            pthread_cond_wait(&sv->work, &sv->mu);
        if (sv->stopping && !sv->n_running && !sv->head) {
            pthread_mutex_unlock(&sv->mu);
            break;
        }
        engine_admit(sv);
        pthread_mutex_unlock(&sv->mu);
        if (engine_step(sv, sts, busy, n_tok, ids, max_rows)) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    free(sts);
    free(busy);
    free(n_tok);
    free(ids);
    return NULL;
}

/* ---- HTTP --------------------------------------------------------------------------------- */

struct conn_ctx {
    char *body;
    size_t len, cap;
    bool too_big;
};

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *type,
                                 const char *body, const char *retry_after)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), (void *)body,
                                                                MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", type);
    if (retry_after)
        MHD_add_response_header(resp, "Retry-After", retry_after);
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    enum MHD_Result r = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return r;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_object *o)
{
    enum MHD_Result r = send_text(
        c, status, "application/json",
        json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE),
        NULL);
    json_object_put(o);
    return r;
}

/* An OpenAI-style error object. */
static enum MHD_Result send_error(struct serve *sv, struct MHD_Connection *c, unsigned status,
                                  const char *type, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    json_object *e = json_object_new_object(), *o = json_object_new_object();
    json_object_object_add(e, "message", json_object_new_string(msg));
    json_object_object_add(e, "type", json_object_new_string(type));
    json_object_object_add(e, "code", json_object_new_int((int)status));
    json_object_object_add(o, "error", e);
    pthread_mutex_lock(&sv->mu);
    if (status == 429 || status == 503)
        sv->n_rejected++;
    else
        sv->n_bad++;
    pthread_mutex_unlock(&sv->mu);
    if (status == 429 || status == 503) {
        enum MHD_Result r = send_text(
            c, status, "application/json",
            json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN), "1");
        json_object_put(o);
        return r;
    }
    return send_json(c, status, o);
}

/* Whether the Authorization header carries the key (compared in constant time). */
static bool auth_ok(const struct serve *sv, struct MHD_Connection *c)
{
    if (!sv->so.api_key)
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7))
        return false;
    h += 7;
    size_t a = strlen(h), b = strlen(sv->so.api_key);
    unsigned char diff = (unsigned char)(a != b);
    for (size_t i = 0; i < b; i++)
        diff |= (unsigned char)(sv->so.api_key[i] ^ (i < a ? h[i] : 0));
    return diff == 0;
}

/* Whether the client of c closed its side (peeks without consuming). */
static bool client_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0)
        return false;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP))
        return true;
    char ch;
    ssize_t n = recv(ci->connect_fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0;
}

static json_object *req_usage(const struct serve_req *r)
{
    json_object *u = json_object_new_object(), *d = json_object_new_object();
    json_object_object_add(u, "prompt_tokens", json_object_new_int(r->n_prompt));
    json_object_object_add(u, "completion_tokens", json_object_new_int(r->n_gen));
    json_object_object_add(u, "total_tokens", json_object_new_int(r->n_prompt + r->n_gen));
    json_object_object_add(d, "cached_tokens", json_object_new_int(r->n_cached));
    json_object_object_add(u, "prompt_tokens_details", d);
    return u;
}

static const char *finish_api(const char *f)
{
    return !strcmp(f, "stop") || !strcmp(f, "length") ? f : "stop";
}

/* One response object (non-stream) or chunk (stream): text of n bytes, finish (NULL: none
 * yet), role (the first chunk); a harmony reply's reasoning from r->part[1] (the caller
 * empties it). The caller holds mu. */
static char *req_render(const struct serve_req *r, const char *text, size_t n, const char *finish,
                        bool role, bool usage)
{
    json_object *o = json_object_new_object(), *ch = json_object_new_array(),
                *c0 = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_string(r->id));
    json_object_object_add(o, "object",
                           json_object_new_string(r->chat ? (r->stream ? "chat.completion.chunk"
                                                                       : "chat.completion")
                                                          : "text_completion"));
    json_object_object_add(o, "created", json_object_new_int64(r->created));
    json_object_object_add(o, "model", json_object_new_string(r->sv->so.alias));
    json_object_object_add(c0, "index", json_object_new_int(0));
    if (r->chat) {
        json_object *m = json_object_new_object();
        if (role || !r->stream)
            json_object_object_add(m, "role", json_object_new_string("assistant"));
        if (!role || !r->stream)
            json_object_object_add(m, "content", json_text_new(text, n));
        if (r->hm && r->n_part[1])
            json_object_object_add(m, "reasoning_content", json_text_new(r->part[1], r->n_part[1]));
        json_object_object_add(c0, r->stream ? "delta" : "message", m);
    } else {
        json_object_object_add(c0, "text", json_text_new(text, n));
        json_object_object_add(c0, "logprobs", NULL);
    }
    json_object_object_add(c0, "finish_reason",
                           finish ? json_object_new_string(finish_api(finish)) : NULL);
    json_object_array_add(ch, c0);
    json_object_object_add(o, "choices", ch);
    if (usage)
        json_object_object_add(o, "usage", req_usage(r));
    if (finish) {
        json_object *t = json_object_new_object();
        double pm = (r->t_prompt_done - r->t_start) * 1e3, gm = (r->t_end - r->t_prompt_done);
        json_object_object_add(t, "queued_ms", json_object_new_double((r->t_start - r->t_queued) * 1e3));
        json_object_object_add(t, "prompt_ms", json_object_new_double(pm));
        json_object_object_add(t, "predicted_per_second",
                               json_object_new_double(gm > 0 ? r->n_gen / gm : 0));
        json_object_object_add(o, "timings", t);
        /* the seed the request was sampled with: sent back, it repeats the reply */
        json_object_object_add(o, "seed", json_object_new_uint64(r->gen.sampling.seed));
    }
    const char *s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
                                                          JSON_C_TO_STRING_NOSLASHESCAPE);
    size_t len = strlen(s);
    char *out = malloc(len + 16);
    if (out) {
        if (r->stream)
            snprintf(out, len + 16, "data: %s\n\n", s);
        else
            memcpy(out, s, len + 1);
    }
    json_object_put(o);
    return out;
}

/* The content reader of a completion's response: waits for the engine, sends chunks. */
static ssize_t req_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct serve_req *r = cls;
    struct serve *sv = r->sv;
    (void)pos;

    pthread_mutex_lock(&sv->mu);
    for (;;) {
        if (r->out && r->out_off < r->out_len) {
            size_t n = r->out_len - r->out_off < max ? r->out_len - r->out_off : max;
            memcpy(buf, r->out + r->out_off, n);
            r->out_off += n;
            pthread_mutex_unlock(&sv->mu);
            return (ssize_t)n;
        }
        free(r->out);
        r->out = NULL;
        r->out_len = r->out_off = 0;
        if (r->stream) {
            size_t avail = req_sendable(r);
            if (r->phase == 0) {
                r->phase = 1;
                if (!r->chat)
                    continue;
                r->out = req_render(r, "", 0, NULL, true, false);
            } else if (r->phase == 1 && avail > r->sent && r->hm) {
                /* harmony: the new bytes through the splitter; a chunk when they held text */
                chat_harmony_feed(r->hm, r->text + r->sent, avail - r->sent);
                r->sent = avail;
                if (!r->n_part[0] && !r->n_part[1])
                    continue;
                r->out = req_render(r, r->part[0] ? r->part[0] : "", r->n_part[0], NULL, false,
                                    false);
                r->n_part[0] = r->n_part[1] = 0;
            } else if (r->phase == 1 && avail > r->sent) {
                r->out = req_render(r, r->text + r->sent, avail - r->sent, NULL, false, false);
                r->sent = avail;
            } else if (r->phase == 1 && r->state == REQ_DONE && r->hm &&
                       (chat_harmony_flush(r->hm), r->n_part[0] || r->n_part[1])) {
                r->out = req_render(r, r->part[0] ? r->part[0] : "", r->n_part[0], NULL, false,
                                    false);
                r->n_part[0] = r->n_part[1] = 0;
            } else if (r->phase == 1 && r->state == REQ_DONE) {
                r->out = req_render(r, "", 0, r->finish, false, r->include_usage);
                r->phase = 2;
            } else if (r->phase == 2) {
                r->out = strdup("data: [DONE]\n\n");
                r->phase = 3;
            } else if (r->phase == 3) {
                pthread_mutex_unlock(&sv->mu);
                return MHD_CONTENT_READER_END_OF_STREAM;
            }
        } else if (r->state == REQ_DONE) {
            if (r->phase == 1) {
                pthread_mutex_unlock(&sv->mu);
                return MHD_CONTENT_READER_END_OF_STREAM;
            }
            if (r->hm) { /* content: the final channel; reasoning_content: the others */
                chat_harmony_feed(r->hm, r->text ? r->text : "", r->len);
                chat_harmony_flush(r->hm);
                r->out = req_render(r, r->part[0] ? r->part[0] : "", r->n_part[0], r->finish,
                                    false, true);
            } else {
                r->out = req_render(r, r->text ? r->text : "", r->len, r->finish, false, true);
            }
            r->phase = 1;
        }
        if (r->out) {
            r->out_len = strlen(r->out);
            continue;
        }
        if (r->phase >= 2 || (!r->stream && r->state == REQ_DONE)) { /* out of memory */
            pthread_mutex_unlock(&sv->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        /* nothing to send yet: wait for the engine, checking that the client is still there */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += SERVE_WAIT_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        if (pthread_cond_timedwait(&r->cv, &sv->mu, &ts) == ETIMEDOUT && client_gone(r->conn)) {
            r->gone = true;
            pthread_cond_signal(&sv->work);
            pthread_mutex_unlock(&sv->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void req_reader_free(void *cls)
{
    struct serve_req *r = cls;
    struct serve *sv = r->sv;
    pthread_mutex_lock(&sv->mu);
    if (r->state != REQ_DONE) {
        r->gone = true;
        pthread_cond_signal(&sv->work);
    }
    req_unref(r);
    pthread_mutex_unlock(&sv->mu);
}

/* Reads an optional number key into *out within [lo, hi]: 0, or 1 after sending the 400. */
static int key_num(struct serve *sv, struct MHD_Connection *c, json_object *body, const char *key,
                   double lo, double hi, double *out, bool *present, enum MHD_Result *res)
{
    json_object *v;
    *present = false;
    if (!json_object_object_get_ex(body, key, &v) || json_object_is_type(v, json_type_null))
        return 0;
    if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double)) {
        *res = send_error(sv, c, 400, "invalid_request_error", "\"%s\" must be a number", key);
        return 1;
    }
    double d = json_object_get_double(v);
    if (!(d >= lo && d <= hi)) {
        *res = send_error(sv, c, 400, "invalid_request_error", "\"%s\" = %g is outside [%g, %g]",
                          key, d, lo, hi);
        return 1;
    }
    *out = d;
    *present = true;
    return 0;
}

/* Renders the request's prompt (messages through the chat template, or prompt) into *text:
 * 0, or 1 after sending the 400. */
static int req_prompt(struct serve *sv, struct MHD_Connection *c, json_object *body, bool chat,
                      char **text, enum MHD_Result *res)
{
    json_object *v;
    if (!chat) {
        if (!json_object_object_get_ex(body, "prompt", &v) ||
            !json_object_is_type(v, json_type_string) || !json_object_get_string_len(v)) {
            *res = send_error(sv, c, 400, "invalid_request_error",
                              "\"prompt\" must be a non-empty string");
            return 1;
        }
        *text = strdup(json_object_get_string(v));
        return *text ? 0 : (*res = send_error(sv, c, 500, "server_error", "out of memory"), 1);
    }
    if (!json_object_object_get_ex(body, "messages", &v) ||
        !json_object_is_type(v, json_type_array) || !json_object_array_length(v)) {
        *res = send_error(sv, c, 400, "invalid_request_error",
                          "\"messages\" must be a non-empty array of {\"role\", \"content\"}");
        return 1;
    }
    size_t n = json_object_array_length(v);
    struct chat_msg *msgs = calloc(n + 1, sizeof(*msgs));
    int nm = 0;
    if (!msgs) {
        *res = send_error(sv, c, 500, "server_error", "out of memory");
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *m = json_object_array_get_idx(v, i), *role, *content;
        if (!json_object_is_type(m, json_type_object) ||
            !json_object_object_get_ex(m, "role", &role) ||
            !json_object_is_type(role, json_type_string) ||
            !json_object_object_get_ex(m, "content", &content) ||
            !json_object_is_type(content, json_type_string)) {
            free(msgs);
            *res = send_error(sv, c, 400, "invalid_request_error",
                              "messages[%zu] must be {\"role\": string, \"content\": string}", i);
            return 1;
        }
        const char *r = json_object_get_string(role);
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")) {
            free(msgs);
            *res = send_error(sv, c, 400, "invalid_request_error",
                              "messages[%zu]: role \"%.40s\" is not system, user or assistant", i,
                              r);
            return 1;
        }
        if (i == 0 && sv->o.system && strcmp(r, "system"))
            msgs[nm++] = (struct chat_msg){"system", sv->o.system};
        msgs[nm++] = (struct chat_msg){r, json_object_get_string(content)};
    }
    char today[32];
    struct chat_style style = {.format = sv->fmt, .think = sv->o.think, .start = true,
                               .date = run_today(today, sizeof(today))};
    int rc = chat_render(&style, msgs, nm, true, text);
    free(msgs);
    if (rc) {
        *res = rc == -EINVAL ? send_error(sv, c, 400, "invalid_request_error", err_msg())
                             : send_error(sv, c, 500, "server_error", "out of memory");
        return 1;
    }
    return 0;
}

/* POST /v1/chat/completions and /v1/completions. */
static enum MHD_Result handle_completion(struct serve *sv, struct MHD_Connection *c,
                                         struct conn_ctx *cc, bool chat)
{
    enum MHD_Result res = MHD_NO;
    json_object *body = NULL, *v;
    char *text = NULL;
    struct serve_req *r = NULL;
    bool present;
    double d;

    if (!sv->ready)
        return send_error(sv, c, 503, "server_error", "the model is loading");
    if (cc->too_big)
        return send_error(sv, c, 413, "invalid_request_error",
                          "the request body is larger than --max-body (%" PRIu64 " bytes)",
                          sv->so.body_max);
    enum json_tokener_error jerr = json_tokener_success;
    if (cc->len)
        body = json_tokener_parse_verbose(cc->body, &jerr);
    if (!body || !json_object_is_type(body, json_type_object)) {
        res = send_error(sv, c, 400, "invalid_request_error",
                         "the body is not a JSON object%s%s",
                         body ? "" : ": ", body ? "" : (cc->len ? json_tokener_error_desc(jerr)
                                                                : "empty body"));
        json_object_put(body);
        return res;
    }
    if (json_object_object_get_ex(body, "model", &v) && !json_object_is_type(v, json_type_null)) {
        const char *m = json_object_get_string(v);
        if (!json_object_is_type(v, json_type_string) || strcmp(m, sv->so.alias)) {
            res = send_error(sv, c, 404, "invalid_request_error",
                             "model \"%.80s\" does not exist; this server has \"%s\"", m,
                             sv->so.alias);
            goto out;
        }
    }
    if (!(r = calloc(1, sizeof(*r)))) {
        res = send_error(sv, c, 500, "server_error", "out of memory");
        goto out;
    }
    r->sv = sv;
    r->chat = chat;
    r->refs = 1;
    r->conn = c;
    pthread_cond_init(&r->cv, NULL);
    r->gen = sv->o.gen;
    r->gen.n_stop = 0;
    if (key_num(sv, c, body, "n", 1, 1, &d, &present, &res) ||
        key_num(sv, c, body, "temperature", 0, 100, &d, &present, &res))
        goto out;
    if (present)
        r->gen.sampling.temperature = (float)d;
    if (key_num(sv, c, body, "top_p", 0, 1, &d, &present, &res))
        goto out;
    if (present)
        r->gen.sampling.top_p = (float)d;
    if (key_num(sv, c, body, "top_k", 0, 1 << 20, &d, &present, &res))
        goto out;
    if (present)
        r->gen.sampling.top_k = (int)d;
    if (key_num(sv, c, body, "min_p", 0, 1, &d, &present, &res))
        goto out;
    if (present)
        r->gen.sampling.min_p = (float)d;
    if (key_num(sv, c, body, "repeat_penalty", 0, 10, &d, &present, &res))
        goto out;
    if (present)
        r->gen.sampling.repeat_penalty = (float)d;
    if (key_num(sv, c, body, "seed", 0, 9007199254740992.0, &d, &present, &res))
        goto out;
    if (present)
        r->gen.sampling.seed = (uint64_t)d;
    else if (!sv->o.seed_set) /* as OpenAI's API: no seed, a random one, of 53 bits so that
                               * the reply's "seed" can be sent back exactly */
        r->gen.sampling.seed = run_random_seed() >> 11;
    if (key_num(sv, c, body, "presence_penalty", 0, 0, &d, &present, &res) ||
        key_num(sv, c, body, "frequency_penalty", 0, 0, &d, &present, &res))
        goto out;
    int max_tok = sv->so.max_tokens ? sv->so.max_tokens : sv->n_ctx;
    r->gen.n_predict = max_tok;
    const char *mk = json_object_object_get_ex(body, "max_completion_tokens", &v)
                         ? "max_completion_tokens"
                         : "max_tokens";
    if (key_num(sv, c, body, mk, 0, max_tok, &d, &present, &res))
        goto out;
    if (present)
        r->gen.n_predict = (int)d;
    if (json_object_object_get_ex(body, "stream", &v) && !json_object_is_type(v, json_type_null)) {
        if (!json_object_is_type(v, json_type_boolean)) {
            res = send_error(sv, c, 400, "invalid_request_error", "\"stream\" must be a boolean");
            goto out;
        }
        r->stream = json_object_get_boolean(v);
    }
    if (json_object_object_get_ex(body, "stream_options", &v) &&
        json_object_is_type(v, json_type_object)) {
        json_object *u;
        r->include_usage = json_object_object_get_ex(v, "include_usage", &u) &&
                           json_object_get_boolean(u);
    }
    if (json_object_object_get_ex(body, "logprobs", &v) && json_object_get_boolean(v)) {
        res = send_error(sv, c, 400, "invalid_request_error", "logprobs are not supported");
        goto out;
    }
    if (json_object_object_get_ex(body, "stop", &v) && !json_object_is_type(v, json_type_null)) {
        bool arr = json_object_is_type(v, json_type_array);
        size_t n = arr ? json_object_array_length(v) : 1;
        if ((!arr && !json_object_is_type(v, json_type_string)) || n > STRATA_MAX_STOP) {
            res = send_error(sv, c, 400, "invalid_request_error",
                             "\"stop\" must be a string or an array of up to %d strings",
                             STRATA_MAX_STOP);
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            json_object *s = arr ? json_object_array_get_idx(v, i) : v;
            if (!json_object_is_type(s, json_type_string)) {
                res = send_error(sv, c, 400, "invalid_request_error",
                                 "\"stop\"[%zu] must be a string", i);
                goto out;
            }
            if (!json_object_get_string_len(s))
                continue;
            r->stops[r->gen.n_stop] = strdup(json_object_get_string(s));
            r->gen.stop[r->gen.n_stop] = r->stops[r->gen.n_stop];
            size_t sl = strlen(r->stops[r->gen.n_stop]);
            r->stop_max = sl > r->stop_max ? sl : r->stop_max;
            r->gen.n_stop++;
        }
    }
    if (req_prompt(sv, c, body, chat, &text, &res))
        goto out;
    if (chat && sv->fmt == CHAT_FORMAT_HARMONY) { /* the reply's channels, its end markers */
        if (!(r->hm = malloc(sizeof(*r->hm)))) {
            res = send_error(sv, c, 500, "server_error", "out of memory");
            goto out;
        }
        chat_harmony_init(r->hm, req_harmony_emit, r);
        for (const char *const *s = chat_stops(sv->fmt); *s && r->gen.n_stop < STRATA_MAX_STOP;
             s++) {
            if (!(r->stops[r->gen.n_stop] = strdup(*s)))
                break;
            r->gen.stop[r->gen.n_stop] = r->stops[r->gen.n_stop];
            r->stop_max = strlen(*s) > r->stop_max ? strlen(*s) : r->stop_max;
            r->gen.n_stop++;
        }
    }
    size_t tl = strlen(text);
    if (!(r->ids = malloc(sizeof(int32_t) * (tl + 4)))) {
        res = send_error(sv, c, 500, "server_error", "out of memory");
        goto out;
    }
    int n = strata_tokenize(sv->s, text, tl, STRATA_TOKENIZE_SPECIAL | STRATA_TOKENIZE_ADD_BOS,
                            r->ids, (int)(tl + 4));
    if (n <= 0) {
        res = send_error(sv, c, 400, "invalid_request_error", "the prompt has no tokens");
        goto out;
    }
    r->n_prompt = n;
    if (n >= sv->n_ctx) {
        res = send_error(sv, c, 400, "invalid_request_error",
                         "the prompt is %d tokens; the context holds %d (-c)", n, sv->n_ctx);
        goto out;
    }
    pthread_mutex_lock(&sv->mu);
    sv->n_requests++;
    if (sv->stopping) {
        pthread_mutex_unlock(&sv->mu);
        res = send_error(sv, c, 503, "server_error", "the server is shutting down");
        goto out;
    }
    if (sv->n_queued >= sv->so.queue_max && sv->n_running >= sv->so.parallel) {
        pthread_mutex_unlock(&sv->mu);
        res = send_error(sv, c, 429, "rate_limit_error",
                         "%d requests are running and %d waiting (--queue): retry later",
                         sv->so.parallel, sv->n_queued);
        goto out;
    }
    snprintf(r->id, sizeof(r->id), "%s-%llu", chat ? "chatcmpl" : "cmpl", ++sv->next_id);
    r->created = (long long)time(NULL);
    r->t_queued = clock_now_s();
    r->refs = 2; /* the connection's and the engine's */
    sv->n_live++;
    if (sv->tail)
        sv->tail->next = r;
    else
        sv->head = r;
    sv->tail = r;
    sv->n_queued++;
    pthread_cond_signal(&sv->work);
    pthread_mutex_unlock(&sv->mu);
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, req_reader, r, req_reader_free);
    if (!resp) {
        pthread_mutex_lock(&sv->mu);
        r->gone = true;
        req_unref(r);
        pthread_mutex_unlock(&sv->mu);
        r = NULL;
        goto out;
    }
    MHD_add_response_header(resp, "Content-Type",
                            r->stream ? "text/event-stream" : "application/json");
    r = NULL; /* the response owns the connection's reference */
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    res = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
out:
    if (r) {
        pthread_mutex_lock(&sv->mu);
        req_unref(r);
        pthread_mutex_unlock(&sv->mu);
    }
    free(text);
    json_object_put(body);
    return res;
}

static enum MHD_Result handle_models(struct serve *sv, struct MHD_Connection *c)
{
    json_object *o = json_object_new_object(), *a = json_object_new_array(),
                *m = json_object_new_object();
    json_object_object_add(m, "id", json_object_new_string(sv->so.alias));
    json_object_object_add(m, "object", json_object_new_string("model"));
    json_object_object_add(m, "created", json_object_new_int64((int64_t)sv->t_start));
    json_object_object_add(m, "owned_by", json_object_new_string("strata"));
    json_object_array_add(a, m);
    json_object_object_add(o, "object", json_object_new_string("list"));
    json_object_object_add(o, "data", a);
    return send_json(c, 200, o);
}

static enum MHD_Result handle_health(struct serve *sv, struct MHD_Connection *c)
{
    json_object *o = json_object_new_object();
    pthread_mutex_lock(&sv->mu);
    const char *st = !sv->ready                        ? "loading"
                     : sv->n_running >= sv->so.parallel ? "busy"
                                                        : "ready";
    json_object_object_add(o, "status", json_object_new_string(st));
    json_object_object_add(o, "running", json_object_new_int(sv->n_running));
    json_object_object_add(o, "queued", json_object_new_int(sv->n_queued));
    pthread_mutex_unlock(&sv->mu);
    return send_json(c, sv->ready ? 200 : 503, o);
}

static enum MHD_Result handle_metrics(struct serve *sv, struct MHD_Connection *c)
{
    struct strata_stats st = {0};
    char buf[4096];
    if (sv->ready)
        strata_get_stats(sv->s, &st);
    pthread_mutex_lock(&sv->mu);
    double hit = st.hits + st.misses ? (double)st.hits / (double)(st.hits + st.misses) : 0;
    double tier = st.tier_hits + st.tier_misses
                      ? (double)st.tier_hits / (double)(st.tier_hits + st.tier_misses)
                      : 0;
    double pf = st.prefetched ? (double)st.prefetch_used / (double)st.prefetched : 0;
    snprintf(buf, sizeof(buf),
             "# HELP strata_requests_total Completion requests received.\n"
             "# TYPE strata_requests_total counter\nstrata_requests_total %llu\n"
             "# HELP strata_requests_finished_total Requests by outcome.\n"
             "# TYPE strata_requests_finished_total counter\n"
             "strata_requests_finished_total{outcome=\"ok\"} %llu\n"
             "strata_requests_finished_total{outcome=\"cancelled\"} %llu\n"
             "strata_requests_finished_total{outcome=\"invalid\"} %llu\n"
             "strata_requests_finished_total{outcome=\"rejected\"} %llu\n"
             "# TYPE strata_tokens_generated_total counter\nstrata_tokens_generated_total %llu\n"
             "# TYPE strata_prompt_tokens_total counter\nstrata_prompt_tokens_total %llu\n"
             "# HELP strata_prompt_tokens_cached_total Prompt tokens reused from a kept cache.\n"
             "# TYPE strata_prompt_tokens_cached_total counter\n"
             "strata_prompt_tokens_cached_total %llu\n"
             "# HELP strata_decode_tokens_per_second Decode tokens per second of step time.\n"
             "# TYPE strata_decode_tokens_per_second gauge\n"
             "strata_decode_tokens_per_second %.3f\n"
             "# TYPE strata_requests_running gauge\nstrata_requests_running %d\n"
             "# TYPE strata_queue_length gauge\nstrata_queue_length %d\n"
             "# HELP strata_expert_hit_rate VRAM expert cache hits / uses (0 without a cache).\n"
             "# TYPE strata_expert_hit_rate gauge\nstrata_expert_hit_rate %.6f\n"
             "# TYPE strata_host_tier_hit_rate gauge\nstrata_host_tier_hit_rate %.6f\n"
             "# HELP strata_prefetch_accuracy Prefetched experts their layer used / prefetched.\n"
             "# TYPE strata_prefetch_accuracy gauge\nstrata_prefetch_accuracy %.6f\n"
             "# HELP strata_spec_drafted_total Drafted tokens verified (--spec).\n"
             "# TYPE strata_spec_drafted_total counter\nstrata_spec_drafted_total %llu\n"
             "# TYPE strata_spec_accepted_total counter\nstrata_spec_accepted_total %llu\n",
             sv->n_requests, sv->n_ok, sv->n_cancelled, sv->n_bad, sv->n_rejected, sv->tok_gen,
             sv->tok_prompt, sv->tok_cached, sv->t_decode > 0 ? sv->tok_decode / sv->t_decode : 0,
             sv->n_running, sv->n_queued, hit, tier, pf, sv->n_drafted, sv->n_accepted);
    pthread_mutex_unlock(&sv->mu);
    return send_text(c, 200, "text/plain; version=0.0.4", buf, NULL);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    struct serve *sv = cls;
    struct conn_ctx *cc = *con_cls;
    (void)version;

    if (!cc) {
        if (!(cc = calloc(1, sizeof(*cc))))
            return MHD_NO;
        *con_cls = cc;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cc->too_big && cc->len + *upload_size > sv->so.body_max) {
            cc->too_big = true;
        } else if (!cc->too_big) {
            if (cc->len + *upload_size + 1 > cc->cap) {
                size_t cap = (cc->len + *upload_size + 1) * 2;
                char *nb = realloc(cc->body, cap);
                if (!nb)
                    return MHD_NO;
                cc->body = nb;
                cc->cap = cap;
            }
            memcpy(cc->body + cc->len, upload, *upload_size);
            cc->len += *upload_size;
            cc->body[cc->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"),
         post = !strcmp(method, "POST");
    if (!strcmp(url, "/health") && get)
        return handle_health(sv, c);
    if (!strcmp(url, "/") && get)
        return send_text(c, 200, "text/html; charset=utf-8", (const char *)serve_page_html,
                         NULL);
    if (!strcmp(url, "/metrics") && get)
        return handle_metrics(sv, c);
    bool models = !strcmp(url, "/v1/models") || !strcmp(url, "/models");
    bool chat = !strcmp(url, "/v1/chat/completions") || !strcmp(url, "/chat/completions");
    bool compl = !strcmp(url, "/v1/completions") || !strcmp(url, "/completions");
    if (!models && !chat && !compl)
        return send_error(sv, c, 404, "invalid_request_error", "no endpoint %.100s %.200s",
                          method, url);
    if (!auth_ok(sv, c))
        return send_error(sv, c, 401, "invalid_request_error",
                          "a valid \"Authorization: Bearer KEY\" header is required");
    if (models)
        return get ? handle_models(sv, c)
                   : send_error(sv, c, 405, "invalid_request_error", "%s wants GET", url);
    if (!post)
        return send_error(sv, c, 405, "invalid_request_error", "%s wants POST", url);
    return handle_completion(sv, c, cc, chat);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct conn_ctx *cc = *con_cls;
    (void)cls, (void)c, (void)toe;
    if (cc) {
        free(cc->body);
        free(cc);
        *con_cls = NULL;
    }
}

/* ---- the command -------------------------------------------------------------------------- */

static int serve_open_engine(struct serve *sv)
{
    struct strata_config cfg;
    struct strata_model_info mi;

    sv->n_slots = sv->so.parallel + sv->so.park;
    run_opts_config(&sv->o, sv->o.model, &cfg);
    cfg.n_streams = sv->n_slots;
    if (strata_load(&cfg, &sv->s))
        return cli_open_fail();
    run_opts_sampling(&sv->o, sv->s, false); /* requests start from these */
    strata_model_info(sv->s, &mi);
    if (!mi.has_tokenizer) {
        fprintf(stderr, "strata serve: %s has no tokenizer (tokenizer.ggml.* keys)\n",
                sv->o.model);
        return 1;
    }
    if (strata_start(sv->s))
        return cli_open_fail();
    if (sv->o.profile && run_profile_check(sv->s, sv->o.profile))
        return cli_fail("the profile's probe");
    strata_model_info(sv->s, &mi);
    sv->tok = strata_model_of(sv->s)->tok;
    sv->fmt = chat_format_of_arch(mi.arch);
    sv->n_vocab = (int)mi.n_vocab;
    sv->n_ctx = sv->o.n_ctx;
    if (strata_streams_check(sv->s, sv->n_slots, sv->o.n_ctx)) {
        fprintf(stderr, "strata serve: --parallel %d + --park %d streams: %s\n", sv->so.parallel,
                sv->so.park, strata_error());
        return 1;
    }
    sv->slots = calloc((size_t)sv->n_slots, sizeof(*sv->slots));
    int rows = serve_max_rows(sv);
    sv->logits = malloc(sizeof(float) * (size_t)rows * mi.n_vocab);
    if (!sv->slots || !sv->logits) {
        fprintf(stderr, "strata serve: out of memory for %d streams\n", sv->n_slots);
        return 1;
    }
    for (int i = 0; i < sv->n_slots; i++)
        if (strata_stream_open(sv->s, sv->o.n_ctx, &sv->slots[i].st))
            return cli_fail("opening the streams");
    for (int i = 0; sv->o.spec_mtp && i < sv->n_slots; i++)
        if (strata_mtp_open(sv->slots[i].st, &sv->slots[i].mtp))
            return cli_fail("--spec mtp");
    if (strata_batch_open_rows(sv->s, sv->so.parallel, rows, &sv->bt))
        return cli_fail("opening the batch");
    if (sv->o.verbose || !strcmp(mi.device, "cuda")) {
        struct strata_stats st;
        strata_get_stats(sv->s, &st);
        fprintf(stderr,
                "strata serve: %s: %s, %u layers, %u experts (top %u); backend %s; %d streams "
                "of %d tokens (%d decoding at once)%s",
                sv->o.model, mi.arch, mi.n_layer, mi.n_expert, mi.n_expert_used, mi.device,
                sv->n_slots, sv->o.n_ctx, sv->so.parallel, strcmp(mi.device, "cuda") ? "\n" : "");
        if (!strcmp(mi.device, "cuda"))
            fprintf(stderr, ", %.2f GiB of VRAM in use\n", st.vram_bytes / 1073741824.0);
    }
    return 0;
}

int cmd_serve(int argc, char **argv)
{
    struct serve sv = {0};
    pthread_t engine;
    bool engine_on = false;
    int rc;

    rc = serve_parse(argc, argv, &sv.so, &sv.o);
    if (rc)
        return rc == 1 ? 0 : rc;
    if (!sv.so.alias) {
        const char *b = strrchr(sv.o.model, '/');
        sv.so.alias = b ? b + 1 : sv.o.model;
    }
    pthread_mutex_init(&sv.mu, NULL);
    pthread_cond_init(&sv.work, NULL);
    sv.t_start = (double)time(NULL);

    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)sv.so.port)};
    if (inet_pton(AF_INET, sv.so.host, &addr.sin_addr) != 1) {
        fprintf(stderr, "strata serve: --host %s is not an IPv4 address\n", sv.so.host);
        return 2;
    }
    struct sigaction sa = {.sa_handler = serve_on_signal}, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    signal(SIGPIPE, SIG_IGN);
    /* listening before the model loads: /health answers "loading" meanwhile */
    sv.d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                                MHD_USE_ERROR_LOG,
                            0, NULL, NULL, on_request, &sv, MHD_OPTION_SOCK_ADDR, &addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, &sv,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600, MHD_OPTION_END);
    if (!sv.d) {
        fprintf(stderr, "strata serve: cannot listen on %s:%d: %s\n", sv.so.host, sv.so.port,
                strerror(errno));
        rc = 1;
        goto out;
    }
    if (serve_open_engine(&sv)) {
        rc = 1;
        goto out;
    }
    if (serve_signals) {
        rc = 130;
        goto out;
    }
    if (pthread_create(&engine, NULL, engine_main, &sv)) {
        fprintf(stderr, "strata serve: cannot start the engine thread\n");
        rc = 1;
        goto out;
    }
    engine_on = true;
    pthread_mutex_lock(&sv.mu);
    sv.ready = true;
    pthread_mutex_unlock(&sv.mu);
    fprintf(stderr, "strata serve: listening on http://%s:%d (model \"%s\")\n", sv.so.host,
            sv.so.port, sv.so.alias);
    while (!serve_signals) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "strata serve: shutting down: running requests finish (a second signal "
                    "exits at once)\n");
    MHD_quiesce_daemon(sv.d);
    pthread_mutex_lock(&sv.mu);
    sv.stopping = true;
    for (struct serve_req *r = sv.head; r; r = r->next)
        r->gone = true;
    pthread_cond_signal(&sv.work);
    pthread_mutex_unlock(&sv.mu);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    pthread_join(engine, NULL);
    engine_on = false;
    /* the last responses go out before the sockets close (10 s at most) */
    for (int i = 0; i < 100 && serve_signals < 2; i++) {
        pthread_mutex_lock(&sv.mu);
        int live = sv.n_live;
        pthread_mutex_unlock(&sv.mu);
        if (!live)
            break;
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
out:
    if (sv.d)
        MHD_stop_daemon(sv.d);
    if (engine_on) {
        pthread_mutex_lock(&sv.mu);
        sv.stopping = true;
        pthread_cond_signal(&sv.work);
        pthread_mutex_unlock(&sv.mu);
        pthread_join(engine, NULL);
    }
    strata_batch_close(sv.bt);
    for (int i = 0; i < sv.n_slots && sv.slots; i++) {
        strata_sampler_close(sv.slots[i].sm);
        strata_mtp_close(sv.slots[i].mtp);
        strata_stream_close(sv.slots[i].st);
        free(sv.slots[i].hist);
    }
    free(sv.slots);
    free(sv.logits);
    strata_close(sv.s);
    pthread_cond_destroy(&sv.work);
    pthread_mutex_destroy(&sv.mu);
    return rc;
}
