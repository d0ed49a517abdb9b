/* simple: a program on strata's public API (include/strata.h) and nothing else. It opens a
 * model, tokenizes a prompt, generates 64 tokens greedily, printing the text as it comes, and
 * ends with one line of speeds.
 *
 *     build/examples/simple [MODEL.gguf [PROMPT]]
 *
 * MODEL defaults to the model shipped in models/, PROMPT to a line of Python.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata.h"

/* strata_generate hands over whole UTF-8 characters as they are decoded; nonzero stops it. */
static int print_text(void *ctx, const char *text, size_t len)
{
    (void)ctx;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    const char *model = argc > 1 ? argv[1] : STRATA_DEFAULT_MODEL;
    const char *prompt = argc > 2 ? argv[2] : "def fibonacci(n):";
    const unsigned tok_flags = STRATA_TOKENIZE_SPECIAL | STRATA_TOKENIZE_ADD_BOS;
    struct strata_config cfg;
    struct strata_generate_params gp;
    struct strata_generate_stats gs;
    struct strata_model_info mi;
    struct strata *s = NULL;
    struct strata_stream *st = NULL;
    int32_t *ids = NULL;
    int n, rc = 1;

    strata_config_init(&cfg);
    cfg.model_path = model;
    cfg.device = STRATA_DEVICE_AUTO; /* the GPU when there is one, else the CPU */
    cfg.log = stderr;                /* say how the weights were placed */
    if (strata_open(&cfg, &s)) {
        fprintf(stderr, "simple: %s\n", strata_error());
        return 1;
    }
    strata_model_info(s, &mi);
    fprintf(stderr, "simple: %s, %u layers, %u experts (top %u), on the %s\n", mi.arch, mi.n_layer,
            mi.n_expert, mi.n_expert_used, mi.device);

    /* the first call counts the ids, the second writes them */
    n = strata_tokenize(s, prompt, strlen(prompt), tok_flags, NULL, 0);
    if (n <= 0 || !(ids = malloc(sizeof(*ids) * (size_t)n)) ||
        strata_tokenize(s, prompt, strlen(prompt), tok_flags, ids, n) != n) {
        fprintf(stderr, "simple: tokenizing '%s': %s\n", prompt,
                n == 0 ? "no tokens" : strata_error());
        goto out;
    }

    if (strata_stream_open(s, 0, &st)) { /* 0: the config's context (n_ctx) */
        fprintf(stderr, "simple: %s\n", strata_error());
        goto out;
    }
    strata_generate_params_init(&gp);
    gp.n_predict = 64;
    gp.sampling.temperature = 0; /* greedy */
    fputs(prompt, stdout);
    if (strata_generate(st, ids, n, &gp, print_text, NULL, NULL, &gs)) {
        fprintf(stderr, "\nsimple: generation: %s\n", strata_error());
        goto out;
    }
    fprintf(stderr, "\nprompt: %d tokens, %.2f tok/s | generation: %d tokens, %.2f tok/s\n",
            gs.n_prompt, gs.t_prompt_s > 0 ? gs.n_prompt / gs.t_prompt_s : 0.0, gs.n_gen,
            gs.t_gen_s > 0 && gs.n_gen > 1 ? (gs.n_gen - 1) / gs.t_gen_s : 0.0);
    rc = 0;
out:
    free(ids);
    strata_stream_close(st);
    strata_close(s);
    return rc;
}
