/* strata chat: an interactive conversation in the model's chat format (ChatML; harmony for
 * gpt-oss). The KV cache is kept across turns: each turn evaluates only its new tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "chat.h"
#include "cli.h"
#include "run_opts.h"
#include "strata.h"

/* How a reply is printed: as it comes (ChatML), or split into channels (harmony). */
struct chat_out {
    struct chat_harmony *h; /* NULL: ChatML */
};

/* The ids the stream's cache holds, in order (--spec draft: the drafter's prefix, so that its
 * drafts see the whole conversation); n always equals the stream's position. */
struct chat_conv {
    int32_t *ids;
    int n, cap;
};

static int conv_add(struct chat_conv *c, const int32_t *ids, int n)
{
    if (c->n + n > c->cap) {
        int cap = (c->n + n) * 2;
        int32_t *p = realloc(c->ids, sizeof(int32_t) * (size_t)cap);
        if (!p)
            return cli_fail("out of memory");
        c->ids = p;
        c->cap = cap;
    }
    memcpy(c->ids + c->n, ids, sizeof(int32_t) * (size_t)n);
    c->n += n;
    return 0;
}

static int chat_emit(void *ctx, const char *text, size_t len)
{
    struct chat_out *o = ctx;
    if (o->h)
        return chat_harmony_feed(o->h, text, len);
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

/* Evaluates text into the stream (the template's pieces between turns). 0 or 1. */
static int chat_eval_text(struct run_session *s, struct chat_conv *conv, const char *text)
{
    int32_t *ids = NULL;
    int n = 0, rc;
    if (run_tokenize(s, text, &ids, &n))
        return 1;
    rc = n ? strata_eval(s->stream, ids, n, NULL) : 0;
    rc = rc ? cli_fail("generation") : conv_add(conv, ids, n);
    free(ids);
    return rc;
}

/* Evaluates one turn: the rendered text of the new messages, then the reply. A turn that does
 * not fit in what is left of the context is not evaluated (said on stderr; the loop goes on,
 * and /reset empties the context); a reply cut off by the context is not closed. A harmony
 * reply is kept in the cache as the template renders history: its final channel only. */
static int chat_turn(struct run_session *s, const struct run_opts *o, enum chat_format fmt,
                     struct chat_conv *conv, const char *rendered)
{
    struct strata_generate_stats st;
    struct strata_generate_params gc = o->gen;
    struct strata_stream *str = s->stream;
    struct chat_harmony h;
    struct run_harmony_out hout;
    struct chat_out out = {.h = fmt == CHAT_FORMAT_HARMONY ? &h : NULL};
    int32_t *ids = NULL;
    int n = 0, rc;

    if (run_tokenize(s, rendered, &ids, &n))
        return 1;
    if (strata_stream_pos(str) + n + 2 > strata_stream_n_ctx(str)) {
        /* room for one reply token and the end of the turn */
        fprintf(stderr,
                "strata chat: this message (%d tokens) does not fit in the context (%d of %d "
                "used): /reset starts over, or restart with a larger -c\n",
                n, strata_stream_pos(str), strata_stream_n_ctx(str));
        free(ids);
        return 0;
    }
    for (const char *const *stop = chat_stops(fmt); *stop && gc.n_stop < STRATA_MAX_STOP; stop++)
        gc.stop[gc.n_stop++] = *stop;
    const int reply_pos = strata_stream_pos(str) + n;
    int32_t *gen = malloc(sizeof(int32_t) * (size_t)(gc.n_predict > 0 ? gc.n_predict : 1));
    if (!gen) {
        free(ids);
        return cli_fail("out of memory");
    }
    /* the drafter sees the conversation before this turn (the ids the cache holds) */
    const int n_pre = conv->n == strata_stream_pos(str) ? conv->n : 0;
    if (s->drafter && strata_drafter_set_prefix(s->drafter, conv->ids, n_pre)) {
        free(ids), free(gen);
        return cli_fail("out of memory");
    }
    if (out.h)
        run_harmony_start(&h, &hout, o->hide_reasoning);
    rc = strata_generate(str, ids, n, &gc, chat_emit, &out, gen, &st);
    /* the cache now holds this turn's rendered ids and the reply's tokens before the last */
    const int n_gen_cached = strata_stream_pos(str) - reply_pos;
    if (!rc)
        rc = conv_add(conv, ids, n) || conv_add(conv, gen, n_gen_cached > 0 ? n_gen_cached : 0);
    free(ids);
    free(gen);
    if (out.h)
        chat_harmony_flush(&h);
    if (rc) {
        if (out.h)
            chat_harmony_free(&h);
        return cli_fail("generation");
    }
    if (st.stopped_ctx || strata_stream_pos(str) + 2 > strata_stream_n_ctx(str)) {
        fprintf(stderr, "\nstrata chat: the context is full (%d tokens): /reset starts over\n",
                strata_stream_pos(str));
        if (out.h)
            chat_harmony_free(&h);
        return 0;
    }
    /* close the assistant turn in the cache so the next turn follows the template */
    if (out.h) {
        const char *final = h.final ? h.final : "";
        size_t len = strlen(final) + 64;
        char *t = malloc(len);
        strata_stream_truncate(str, reply_pos);
        conv->n = reply_pos < conv->n ? reply_pos : conv->n;
        if (t)
            snprintf(t, len, "<|channel|>final<|message|>%s<|end|>", final);
        rc = t ? chat_eval_text(s, conv, t) : cli_fail("out of memory");
        free(t);
        chat_harmony_free(&h);
    } else {
        rc = chat_eval_text(s, conv, "<|im_end|>\n");
    }
    if (rc)
        return rc;
    if (o->verbose)
        run_print_stats(&st, &o->gen.sampling);
    else
        putchar('\n');
    return 0;
}

int cmd_chat(int argc, char **argv)
{
    struct run_opts o;
    struct run_session s;
    struct chat_conv conv = {0};
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    bool first = true, tty = isatty(STDIN_FILENO);
    int rc;

    run_opts_init(&o);
    o.gen.n_predict = RUN_CHAT_N_PREDICT;
    rc = run_opts_parse(&o, argc, argv, "chat");
    if (rc)
        return rc == 1 ? 0 : rc;
    if (run_session_open(&o, &s))
        return 1;
    run_opts_sampling(&o, s.s, true); /* before the drafter takes the sampler's penalty */
    run_session_spec(&s, &o.gen);
    char today[32];
    struct chat_style style = {.format = (enum chat_format)run_chat_format(&s), .think = o.think,
                               .date = run_today(today, sizeof(today))};
    fprintf(stderr, "strata chat: type a message and press Enter; /reset forgets the conversation; "
                    "Ctrl-D or /exit to quit\n");
    for (;;) {
        struct chat_msg msgs[2];
        char *rendered = NULL;
        int nm = 0;

        if (tty) { /* a piped transcript stays free of prompts */
            fputs("> ", stdout);
            fflush(stdout);
        }
        if ((got = getline(&line, &cap, stdin)) < 0)
            break;
        if (strlen(line) != (size_t)got) {
            fprintf(stderr, "strata chat: a NUL byte at byte offset %zu of this message; it is "
                            "skipped (messages are UTF-8 text)\n", strlen(line));
            continue;
        }
        line[strcspn(line, "\n")] = '\0';
        if (!strcmp(line, "/exit"))
            break;
        if (!strcmp(line, "/reset")) {
            strata_stream_truncate(s.stream, 0);
            conv.n = 0;
            first = true;
            fprintf(stderr, "strata chat: the conversation is forgotten\n");
            continue;
        }
        if (!line[0])
            continue;
        if (first && o.system)
            msgs[nm++] = (struct chat_msg){"system", o.system};
        msgs[nm++] = (struct chat_msg){"user", line};
        style.start = first;
        first = false;
        if (chat_render(&style, msgs, nm, true, &rendered)) {
            rc = cli_fail("chat template");
            break;
        }
        rc = chat_turn(&s, &o, style.format, &conv, rendered);
        free(rendered);
        if (rc)
            break;
    }
    free(line);
    free(conv.ids);
    run_session_close(&s);
    return rc;
}
