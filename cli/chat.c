/* strata chat: an interactive conversation in the model's chat template (ChatML). The KV cache
 * is kept across turns: each turn evaluates only its new tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "chat.h"
#include "cli.h"
#include "run_opts.h"
#include "strata.h"

static int chat_emit(void *ctx, const char *text, size_t len)
{
    (void)ctx;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

/* Evaluates one turn: the rendered text of the new messages, then the reply. A turn that does
 * not fit in what is left of the context is not evaluated (said on stderr; the loop goes on,
 * and /reset empties the context); a reply cut off by the context is not closed. */
static int chat_turn(struct run_session *s, const struct run_opts *o, const char *rendered)
{
    struct strata_generate_stats st;
    struct strata_generate_params gc = o->gen;
    struct strata_stream *str = s->stream;
    int32_t *ids = NULL;
    int n = 0, rc;

    if (run_tokenize(s, rendered, &ids, &n))
        return 1;
    if (strata_stream_pos(str) + n + 2 > strata_stream_n_ctx(str)) {
        /* room for one reply token and <|im_end|> */
        fprintf(stderr,
                "strata chat: this message (%d tokens) does not fit in the context (%d of %d "
                "used): /reset starts over, or restart with a larger -c\n",
                n, strata_stream_pos(str), strata_stream_n_ctx(str));
        free(ids);
        return 0;
    }
    if (gc.n_stop < STRATA_MAX_STOP)
        gc.stop[gc.n_stop++] = "<|im_end|>";
    rc = strata_generate(str, ids, n, &gc, chat_emit, NULL, NULL, &st);
    free(ids);
    if (rc)
        return cli_fail("generation");
    if (st.stopped_ctx || strata_stream_pos(str) + 2 > strata_stream_n_ctx(str)) {
        fprintf(stderr, "\nstrata chat: the context is full (%d tokens): /reset starts over\n",
                strata_stream_pos(str));
        return 0;
    }
    /* close the assistant turn in the cache so the next turn follows the template */
    if (run_tokenize(s, "<|im_end|>\n", &ids, &n))
        return 1;
    rc = strata_eval(str, ids, n, NULL);
    free(ids);
    if (rc)
        return cli_fail("generation");
    if (o->verbose)
        run_print_stats(&st);
    else
        putchar('\n');
    return 0;
}

int cmd_chat(int argc, char **argv)
{
    struct run_opts o;
    struct run_session s;
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
            first = true;
            fprintf(stderr, "strata chat: the conversation is forgotten\n");
            continue;
        }
        if (!line[0])
            continue;
        if (first && o.system)
            msgs[nm++] = (struct chat_msg){"system", o.system};
        msgs[nm++] = (struct chat_msg){"user", line};
        first = false;
        if (chat_render_chatml(msgs, nm, true, o.think, &rendered)) {
            rc = cli_fail("chat template");
            break;
        }
        rc = chat_turn(&s, &o, rendered);
        free(rendered);
        if (rc)
            break;
    }
    free(line);
    run_session_close(&s);
    return rc;
}
