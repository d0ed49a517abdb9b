/* strata run: generate from a prompt, streaming text to stdout, then one line of speeds. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "chat.h"
#include "clock.h"
#include "cli.h"
#include "run_opts.h"
#include "strata.h"

/* Ctrl-C (SIGINT) sets this; prefill stops after its current chunk, generation after its
 * current token, and run exits 130 after saying so. */
static volatile sig_atomic_t run_interrupted;

static void run_on_sigint(int sig)
{
    (void)sig;
    run_interrupted = 1;
}

/* ctx: NULL, or the harmony splitter of a gpt-oss --chat reply */
static int run_emit(void *ctx, const char *text, size_t len)
{
    if (ctx)
        return chat_harmony_feed(ctx, text, len) ? 1 : run_interrupted;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return run_interrupted;
}

/* Prefill progress on stderr once it has taken 2 s: tokens done and tok/s, on one line
 * rewritten in place on a terminal, every 10% otherwise. */
struct run_progress {
    double t0;
    int shown; /* last tenth printed, -1 none */
    bool tty;
};

static int run_on_progress(void *ctx, int done, int total)
{
    struct run_progress *p = ctx;
    double dt = clock_now_s() - p->t0;
    int tenth = (int)(10LL * done / total);
    if (dt >= 2.0 && (p->tty || tenth > p->shown)) {
        fprintf(stderr, "%sstrata: prompt %d / %d tokens, %.1f tok/s%s", p->tty ? "\r" : "",
                done, total, done / dt, p->tty && done < total ? "" : "\n");
        p->shown = tenth;
    }
    return run_interrupted;
}

/* The whole prompt text, -f then -p, into *text (malloc'd): 0, or the exit code after the
 * message (args_read_prompt's). */
static int run_prompt_text(const struct run_opts *o, char **text)
{
    size_t len = 0;
    int rc;

    *text = NULL;
    if (o->prompt_file && (rc = args_read_prompt("run", "-f", o->prompt_file, text, &len)))
        return rc;
    if (o->prompt) {
        char *t = realloc(*text, len + strlen(o->prompt) + 1);
        if (!t)
            goto oom;
        *text = t;
        strcpy(*text + len, o->prompt);
    }
    if (!*text && !(*text = strdup("")))
        goto oom;
    return 0;
oom:
    free(*text);
    *text = NULL;
    fprintf(stderr, "strata run: out of memory\n");
    return 1;
}

void run_print_stats(const struct strata_generate_stats *st, const struct strata_sampling *sc)
{
    fprintf(stderr, "\nprompt: %d tokens, %.2f tok/s | generation: %d tokens, %.2f tok/s%s",
            st->n_prompt, st->t_prompt_s > 0 ? st->n_prompt / st->t_prompt_s : 0.0, st->n_gen,
            st->t_gen_s > 0 && st->n_gen > 1 ? (st->n_gen - 1) / st->t_gen_s : 0.0,
            st->stopped_ctx ? " (context full)" : "");
    if (sc->temperature > 0)
        fprintf(stderr, " | seed %llu", (unsigned long long)sc->seed);
    fputc('\n', stderr);
    if (st->spec_unavailable)
        fprintf(stderr, "speculative: no memory for the verify pass's rows (under --vram-budget "
                        "they need room beside the cache); decoded without drafts\n");
    if (st->n_verify)
        fprintf(stderr,
                "speculative: %d verify passes, %d drafted, %d accepted (%.1f%%), %.2f tokens "
                "per pass\n",
                st->n_verify, st->n_drafted, st->n_accepted,
                st->n_drafted ? 100.0 * st->n_accepted / st->n_drafted : 0.0,
                (double)(st->n_accepted + st->n_verify) / st->n_verify);
    if (st->n_paused)
        fprintf(stderr,
                "speculative: %d steps without drafts (drafting paused after passes "
                "that kept none)\n",
                st->n_paused);
    if (st->n_lookahead)
        fprintf(stderr,
                "speculative: %d passes looked ahead, %lld experts copied before their pass\n",
                st->n_lookahead, st->lookahead_experts);
    if (st->n_verify) {
        fprintf(stderr, "speculative: accepted by draft position:");
        for (int i = 0; i < 16 && st->drafted_at[i]; i++)
            fprintf(stderr, " %d:%.0f%%", i + 1, 100.0 * st->accepted_at[i] / st->drafted_at[i]);
        fprintf(stderr, "\n");
    }
}

int cmd_run(int argc, char **argv)
{
    struct run_opts o;
    struct run_session s;
    struct strata_generate_stats st;
    char *text, *rendered = NULL;
    int32_t *ids = NULL;
    int n = 0, rc;

    run_opts_init(&o);
    rc = run_opts_parse(&o, argc, argv, "run");
    if (rc)
        return rc == 1 ? 0 : rc;
    if (!o.prompt && !o.prompt_file) {
        fprintf(stderr, "strata run: give a prompt with -p TEXT or -f FILE (see --help)\n");
        return 2;
    }
    rc = run_prompt_text(&o, &text);
    if (rc)
        return rc;
    if (run_session_open(&o, &s)) {
        free(text);
        return 1;
    }
    run_opts_sampling(&o, s.s, true); /* before the drafter takes the sampler's penalty */
    run_session_spec(&s, &o.gen);
    const enum chat_format fmt = (enum chat_format)run_chat_format(&s);
    struct chat_harmony h, *split = NULL;
    struct run_harmony_out hout;
    if (o.chat_template) {
        struct chat_msg msgs[2];
        char today[32];
        struct chat_style style = {.format = fmt, .think = o.think, .start = true,
                                   .date = run_today(today, sizeof(today))};
        int nm = 0;
        if (o.system)
            msgs[nm++] = (struct chat_msg){"system", o.system};
        msgs[nm++] = (struct chat_msg){"user", text};
        if (chat_render(&style, msgs, nm, true, &rendered)) {
            free(text);
            run_session_close(&s);
            return cli_fail("chat template");
        }
        if (fmt == CHAT_FORMAT_HARMONY) {
            run_harmony_start(&h, &hout, o.hide_reasoning);
            split = &h;
            for (const char *const *stop = chat_stops(fmt);
                 *stop && o.gen.n_stop < STRATA_MAX_STOP; stop++)
                o.gen.stop[o.gen.n_stop++] = *stop;
        }
    }
    rc = run_tokenize(&s, rendered ? rendered : text, &ids, &n);
    if (!rc && n == 0) {
        fprintf(stderr, "strata run: the prompt is empty\n");
        rc = 2;
    }
    if (!rc && n >= o.n_ctx) {
        fprintf(stderr,
                "strata run: the prompt is %d tokens, and the context holds %d (-c): raise -c "
                "above %d or shorten the prompt\n",
                n, o.n_ctx, n);
        rc = 2;
    }
    if (!rc) {
        struct run_progress prog = {.t0 = clock_now_s(), .shown = -1,
                                    .tty = isatty(STDERR_FILENO)};
        struct sigaction sa = {.sa_handler = run_on_sigint}, old_int;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, &old_int);
        strata_stream_set_progress(s.stream, run_on_progress, &prog);
        fputs(rendered ? rendered : text, stdout);
        if (split)
            fputc('\n', stdout);
        rc = strata_generate(s.stream, ids, n, &o.gen, run_emit, split, NULL, &st);
        if (split) {
            chat_harmony_flush(split);
            chat_harmony_free(split);
        }
        sigaction(SIGINT, &old_int, NULL);
        if (run_interrupted) {
            fflush(stdout);
            fprintf(stderr, "\nstrata run: interrupted (Ctrl-C) after %d tokens in the context\n",
                    strata_stream_pos(s.stream));
            rc = 130;
        } else if (rc) {
            rc = cli_fail("generation");
        } else {
            run_print_stats(&st, &o.gen.sampling);
        }
    }
    free(ids);
    free(text);
    free(rendered);
    run_session_close(&s);
    return rc;
}
