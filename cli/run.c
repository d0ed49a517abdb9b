/* strata run: generate from a prompt, streaming text to stdout, then one line of speeds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "cli.h"
#include "run_opts.h"
#include "strata.h"

static int run_emit(void *ctx, const char *text, size_t len)
{
    (void)ctx;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

/* The whole prompt text: -p, -f, or both (file first); malloc'd. */
static char *run_prompt_text(const struct run_opts *o)
{
    char *text = NULL;
    size_t len = 0;

    if (o->prompt_file) {
        FILE *f = fopen(o->prompt_file, "rb");
        if (!f) {
            perror(o->prompt_file);
            return NULL;
        }
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        text = malloc((size_t)(n > 0 ? n : 0) + 1);
        len = text && n > 0 ? fread(text, 1, (size_t)n, f) : 0;
        fclose(f);
        if (!text)
            return NULL;
        text[len] = '\0';
    }
    if (o->prompt) {
        char *t = realloc(text, len + strlen(o->prompt) + 1);
        if (!t) {
            free(text);
            return NULL;
        }
        text = t;
        strcpy(text + len, o->prompt);
    }
    return text ? text : strdup("");
}

void run_print_stats(const struct strata_generate_stats *st)
{
    fprintf(stderr, "\nprompt: %d tokens, %.2f tok/s | generation: %d tokens, %.2f tok/s%s\n",
            st->n_prompt, st->t_prompt_s > 0 ? st->n_prompt / st->t_prompt_s : 0.0, st->n_gen,
            st->t_gen_s > 0 && st->n_gen > 1 ? (st->n_gen - 1) / st->t_gen_s : 0.0,
            st->stopped_ctx ? " (context full)" : "");
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
    text = run_prompt_text(&o);
    if (!text)
        return 1;
    if (o.chat_template) {
        struct chat_msg msgs[2];
        int nm = 0;
        if (o.system)
            msgs[nm++] = (struct chat_msg){"system", o.system};
        msgs[nm++] = (struct chat_msg){"user", text};
        if (chat_render_chatml(msgs, nm, true, o.think, &rendered)) {
            free(text);
            return cli_fail("chat template");
        }
    }
    if (run_session_open(&o, &s)) {
        free(text);
        free(rendered);
        return 1;
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
        fputs(rendered ? rendered : text, stdout);
        rc = strata_generate(s.stream, ids, n, &o.gen, run_emit, NULL, NULL, &st);
        if (rc)
            rc = cli_fail("generation");
        else
            run_print_stats(&st);
    }
    free(ids);
    free(text);
    free(rendered);
    run_session_close(&s);
    return rc;
}
