/* run_opts: the options strata run and strata chat share (model, threads, context, sampling,
 * device and placement), parsed llama.cpp-style, and the session they open through the API
 * (include/strata.h). strata logits and bench reuse the placement parsing. */
#ifndef STRATA_RUN_OPTS_H
#define STRATA_RUN_OPTS_H

#include <stdbool.h>
#include <stdint.h>

#include "strata.h"

/* strata chat's default reply length (-n); strata run's is run_opts_init's. */
#define RUN_CHAT_N_PREDICT 1024

struct run_opts {
    const char *model;     /* -m */
    const char *prompt;    /* -p */
    const char *prompt_file; /* -f */
    const char *system;    /* --system (chat) */
    int n_threads;         /* -t, 0 = all cores */
    int n_ctx;             /* -c */
    bool ctx_set;          /* -c was given (warned about above the trained context) */
    int n_batch;           /* -b */
    bool chat_template;    /* --chat: wrap -p in the model's chat template */
    bool think;            /* --think / --no-think */
    bool hide_reasoning;   /* --hide-reasoning: harmony's analysis channel not printed */
    bool verbose;
    bool no_mmap;          /* --no-mmap: weights copied to anonymous huge pages */
    bool no_mtp;           /* --no-mtp: the model's MTP block left unloaded */
    bool bind;             /* --bind: one OpenMP thread per physical core, bound */
    const char *device;    /* --device cpu */
    bool device_set;       /* --device was given */
    uint64_t vram_budget;  /* --vram-budget, 0 = none */
    uint64_t host_budget;  /* --host-budget, 0 = none */
    const char *host_io;   /* --host-io auto|uring|pread */
    bool host_buffered;    /* --host-buffered */
    bool host_ahead;       /* --host-read-ahead */
    bool no_host_tier;     /* --host-budget 0 */
    const char *residency; /* --residency copy|zerocopy */
    bool stats;            /* --stats */
    bool prefetch;         /* --prefetch */
    int prefetch_depth;    /* --prefetch-depth N (implies --prefetch), 0 = 1 */
    int prefetch_top;      /* --prefetch-top M (implies --prefetch), 0 = half of k */
    bool gather;           /* --streaming kernel */
    bool graph;            /* --graph */
    bool no_graph;         /* --no-graph */
    int cpu_moe_layers;    /* --placement static[:N]: -1 auto, N, 0 = stream (the cache) */
    bool hybrid;           /* --placement hybrid */
    bool stream;           /* --placement stream */
    bool residency_set;    /* --residency was given */
    const char *stats_json; /* --stats-json FILE */
    const char *profile;   /* --profile FILE */
    bool profile_freeze;   /* --profile-freeze */
    bool profile_optional; /* --profile-optional */
    const char *cuda_flag; /* the first option given that only the CUDA backend takes, or NULL */
    struct strata_generate_params gen;
    unsigned sampling_set; /* the sampling flags given (enum strata_sampling_field) */
    bool seed_set;         /* -s given */
    bool spec_ngram;    /* --spec ngram */
    bool spec_draft;    /* --spec draft */
    bool spec_mtp;      /* --spec mtp */
    bool draft_max_set; /* --draft-max given (it needs --spec) */
    const char *draft_model;  /* --draft-model FILE (-md), with --spec draft */
    const char *draft_device; /* --draft-device auto|cpu|cuda (default auto) */
};

/* Sets the defaults. */
void run_opts_init(struct run_opts *o);

/* Parses argv[1..argc); returns 0, 1 when --help was printed, or 2 on a bad option (message
 * printed). cmd is "run" or "chat" (for the help text). */
int run_opts_parse(struct run_opts *o, int argc, char **argv, const char *cmd);

struct run_session;
struct chat_harmony;

/* --spec draft: the draft model at path opened whole (no budget, no placement) on device
 * (auto|cpu|cuda; NULL = auto) and a drafter of n_ctx positions for target; 0, or 1 after the
 * message (what was opened is left in *draft / *drafter for the caller to close). */
int run_open_draft(const char *path, const char *device, int n_threads, int n_ctx, bool verbose,
                   const struct strata *target, struct strata **draft,
                   struct strata_drafter **drafter);

/* The sampling settings of a command on model st: the model file's general.sampling.* keys
 * for the flags not given (said with verbose), and unless random_seed is false or -s was given,
 * a seed drawn from the system's entropy. */
void run_opts_sampling(struct run_opts *o, const struct strata *st, bool random_seed);
/* A seed from the system's entropy (the clock and pid if that fails). */
uint64_t run_random_seed(void);
/* The fields of f in mask (strata_sampling_from_*'s) that no flag gave, into o. */
void run_opts_sampling_take(struct run_opts *o, const struct strata_sampling *f, unsigned mask);

/* With --spec draft (mtp), p's draft source becomes the session's draft model (the model's MTP
 * block). */
void run_session_spec(const struct run_session *s, struct strata_generate_params *p);

/* The chat format of the session's model (harmony for gpt-oss, else ChatML). */
int run_chat_format(const struct run_session *s);

/* Today's date as YYYY-MM-DD into buf (the harmony header's "Current date"). */
const char *run_today(char *buf, size_t size);

/* A harmony reply printed as it streams: the final channel as text, the others (reasoning)
 * dimmed on a terminal, or not at all with hide. run_harmony_start initialises h to print
 * through out. */
struct run_harmony_out {
    bool hide;
    int last; /* what was printed last: 0 nothing, 1 reasoning, 2 the answer */
};
void run_harmony_start(struct chat_harmony *h, struct run_harmony_out *out, bool hide);

/* The default model path (shipped with strata), or NULL if it is not present. */
const char *run_opts_default_model(void);

/* *model, or the shipped default model when *model is NULL (-m / FILE not given): 0, or 1
 * after printing that neither is there. */
int run_opts_model(const char *cmd, const char **model);

/* What run and chat hold open. */
struct run_session {
    struct strata *s;
    struct strata_stream *stream;
    struct strata *draft;            /* --spec draft: the draft model, */
    struct strata_drafter *drafter;  /* following the stream's history */
    struct strata_mtp *mtp;          /* --spec mtp: the model's MTP block on the stream */
    bool stats;             /* print the expert cache's table at close */
    const char *stats_json; /* and/or write it there */
};

/* Whether a is one of the space-separated flags of with_value (then *takes_value = true) or of
 * bare: for commands that pass some of run_opts' flags on to run_opts_parse and refuse the
 * rest. */
bool run_opts_flag_in(const char *with_value, const char *bare, const char *a,
                      bool *takes_value);

/* The checks run_opts_parse ends with (device, and the placement options that need a budget or
 * CUDA; a budget implies --device cuda): 0, or 2 after printing the error. */
int run_opts_check(struct run_opts *o, const char *cmd);

/* Whether arg is an option only the CUDA backend takes: --graph, --prefetch, --stats,
 * --stats-json, --residency, --streaming, --placement (--vram-budget implies the backend). */
bool run_opts_is_cuda_only(const char *arg);

/* Whether --device's value (auto|cpu|cuda) means the CPU backend: cpu, or auto on a machine
 * without a CUDA device. */
bool run_opts_uses_cpu(const char *device);

/* flag (e.g. "--graph", NULL when none was given) on a run of device's backend: 0 when it
 * applies, or 2 after printing why not when the backend is the CPU. */
int run_opts_cuda_only(const char *cmd, const char *flag, const char *device);

/* o as the API's config for the model at path (set-up reports to stderr). */
void run_opts_config(const struct run_opts *o, const char *path, struct strata_config *cfg);

/* --residency's value as enum strata_fill: 0 and *out, or 2 after printing the error. */
int run_opts_residency(const char *v, const char *cmd, int *out);

/* --placement's value (auto | stream | hybrid | static | static:N) as cpu_moe_layers (0 = the
 * cache, -1 = static from the budget, N), hybrid and stream: 0, or 2 after printing the
 * error. */
int run_opts_placement(const char *v, const char *cmd, int *cpu_moe_layers, bool *hybrid,
                       bool *stream);
/* The placement those flags ask for: static, hybrid, stream (--placement stream, or a
 * --residency or --prefetch that names the cache's way), else auto. */
enum strata_placement run_opts_placement_pick(int cpu_moe_layers, bool hybrid, bool stream,
                                              bool residency_set, bool prefetch);

/* Opens the model (o->model or the default), the backend and a stream; prints what it loaded
 * with -v, and a warning when -c is above the model's trained context. 0, or 1 after printing the error. run_session_close prints/writes the expert
 * cache's statistics when --stats / --stats-json asked for them. */
int run_session_open(const struct run_opts *o, struct run_session *s);
/* After a start with --profile path: runs the profile's probe and reports it on stderr (a
 * mismatch where the kernels are the same is an error line). 0 or -errno. */
int run_profile_check(struct strata *s, const char *path);
void run_session_close(struct run_session *s);

/* Tokenizes text (specials parsed) into a malloc'd array; *n receives the count. 0 or 1 after
 * printing the error. */
int run_tokenize(const struct run_session *s, const char *text, int32_t **ids, int *n);

/* Prints "prompt: N tokens, X tok/s | generation: M tokens, Y tok/s" to stderr, then with
 * "| seed S" when sampling (temperature > 0): the -s that repeats the output. */
void run_print_stats(const struct strata_generate_stats *st, const struct strata_sampling *sc);

#endif
