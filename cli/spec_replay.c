/* strata spec-replay: a draft source's acceptance on a fixed text, teacher-forced: the text
 * stands for what the model generates, and at each verify pass the drafts are compared with
 * the text's next tokens (greedy acceptance: a draft is kept while it equals the token the
 * text has there). Nothing is generated, so draft sources can be compared on the same text
 * in seconds. The pass loop is strata_generate's (generate_ngram_draft, the same adaptive
 * draft length). With --spec mtp the model's MTP block drafts: the model evaluates the text
 * (on the CPU), each pass's token and kept drafts in one call, and the block follows it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "generate.h"
#include "run_opts.h"
#include "strata.h"

#define REPLAY_KMAX 64

static void replay_usage(void)
{
    printf("usage: strata spec-replay [-m MODEL] --spec ngram|mtp -f TEXT [--draft-max K]\n"
           "                          [--draft-ngram N] [--skip N] [-t N]\n\n"
           "Replays TEXT (tokenized with the model's vocabulary) as if the model had generated\n"
           "it: from token --skip on (default 1), each verify pass drafts up to K tokens from\n"
           "what precedes (ngram, prompt lookup: what followed the latest earlier occurrence\n"
           "of the last N..2 tokens; mtp: the model's own MTP block, qwen3next and qwen35moe\n"
           "files with one, while the model evaluates the text on the CPU with -t N threads,\n"
           "default all), keeps them while they equal the text's next tokens, and moves\n"
           "past the kept ones and one more (the token the pass itself yields). Prints the\n"
           "passes, drafted and accepted tokens, tokens per pass, and the acceptance at each\n"
           "draft position. --draft-max K as strata run (default 8, adapting below it to the\n"
           "running acceptance; --fixed keeps it at K), --draft-ngram N (default 3).\n");
}

/* What a replay is given and what it counts. */
struct replay {
    const int32_t *ids; /* the text's ids */
    int n, skip, kmax, ngram;
    bool fixed;
    struct strata_stream *st; /* mtp: the model's stream, the block following it; else NULL */
    struct strata_mtp *mtp;
    long long passes, drafted, accepted, at_pos[REPLAY_KMAX], tried_pos[REPLAY_KMAX];
};

/* The verify passes over ids[skip..n). 0, or 1 after the message (an evaluation failed). */
static int replay_run(struct replay *r)
{
    const int32_t *ids = r->ids;
    double ema = 0.5;
    int32_t d[REPLAY_KMAX];
    /* ids[0..i) are in the cache but for the last, ids[i - 1], which the next pass evaluates */
    for (int i = r->skip; i < r->n;) {
        int k = r->fixed ? r->kmax : generate_draft_len(ema, r->kmax);
        k = k < r->n - i ? k : r->n - i;
        int nd = r->mtp ? strata_mtp_draft(r->mtp, ids, i, k, d)
                        : generate_ngram_draft(ids, i, r->ngram, k, d);
        int a = 0;
        while (a < nd && d[a] == ids[i + a])
            a++;
        /* the pass's token and the kept drafts go into the model's cache */
        if (r->mtp && strata_eval(r->st, ids + i - 1, a + 1, NULL))
            return cli_fail("evaluating the text");
        r->passes++;
        if (!nd) {
            i++;
            continue;
        }
        r->drafted += nd;
        r->accepted += a;
        for (int j = 0; j < nd; j++) {
            r->tried_pos[j]++;
            r->at_pos[j] += j < a;
        }
        ema = 0.9 * ema + 0.1 * ((double)a / nd);
        i += a + 1;
    }
    return 0;
}

int cmd_spec_replay(int argc, char **argv)
{
    const char *model = NULL, *file = NULL, *spec = NULL;
    int kmax = 8, ngram = 3, skip = 1, threads = 0, rc = 0;
    bool fixed = false;

    for (int i = 1; i < argc && !rc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            replay_usage();
            return 0;
        } else if (!strcmp(a, "--fixed")) {
            fixed = true;
        } else if (!v) {
            fprintf(stderr, "strata spec-replay: %s needs a value or is unknown (see --help)\n",
                    a);
            rc = 2;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            model = argv[++i];
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            file = argv[++i];
        } else if (!strcmp(a, "--spec")) {
            spec = argv[++i];
        } else if (!strcmp(a, "--draft-max")) {
            rc = args_i32("spec-replay", a, argv[++i], 1, REPLAY_KMAX, &kmax);
        } else if (!strcmp(a, "--draft-ngram")) {
            rc = args_i32("spec-replay", a, argv[++i], 2, 8, &ngram);
        } else if (!strcmp(a, "--skip")) {
            rc = args_i32("spec-replay", a, argv[++i], 1, 1 << 30, &skip);
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            rc = args_i32("spec-replay", a, argv[++i], 1, 4096, &threads);
        } else {
            fprintf(stderr, "strata spec-replay: unknown option '%s' (see --help)\n", a);
            rc = 2;
        }
    }
    if (rc)
        return rc;
    if (!spec || (strcmp(spec, "ngram") && strcmp(spec, "mtp"))) {
        fprintf(stderr, "strata spec-replay: --spec %s: the draft sources are: ngram, mtp\n",
                spec ? spec : "(missing)");
        return 2;
    }
    const bool mtp = !strcmp(spec, "mtp");
    if (!file) {
        fprintf(stderr, "strata spec-replay: need -f TEXT\n");
        return 2;
    }
    if (run_opts_model("spec-replay", &model))
        return 2;
    char *text = NULL;
    size_t len = 0;
    if ((rc = args_read_prompt("spec-replay", "-f", file, &text, &len)))
        return rc;
    struct strata_config cfg;
    struct strata *s = NULL;
    strata_config_init(&cfg);
    cfg.model_path = model;
    cfg.device = STRATA_DEVICE_CPU;
    cfg.n_threads = threads;
    if (mtp) /* the text's tokens: at most its bytes + BOS/EOS */
        cfg.n_ctx = len + 4 < (1u << 30) ? (int)len + 4 : 1 << 30;
    if (strata_open(&cfg, &s)) {
        free(text);
        return cli_open_fail();
    }
    int32_t *ids = malloc(sizeof(int32_t) * (len + 4));
    int n = ids ? strata_tokenize(s, text, len, STRATA_TOKENIZE_SPECIAL, ids, (int)(len + 4)) : -1;
    free(text);
    if (n < 0) {
        free(ids);
        strata_close(s);
        return cli_fail("tokenizing the text");
    }
    if (n <= skip) {
        fprintf(stderr, "strata spec-replay: the text has %d tokens, not more than --skip %d\n",
                n, skip);
        free(ids);
        strata_close(s);
        return 2;
    }
    /* mtp: a stream that holds the text before token skip - 1, the block following it */
    struct replay r = {
        .ids = ids, .n = n, .skip = skip, .kmax = kmax, .ngram = ngram, .fixed = fixed};
    if (mtp && (strata_stream_open(s, n + 1, &r.st) || strata_mtp_open(r.st, &r.mtp) ||
                (skip > 1 && strata_eval(r.st, ids, skip - 1, NULL))))
        rc = cli_fail("--spec mtp");
    rc = rc ? rc : replay_run(&r);
    if (!rc) {
        long long tokens = n - skip;
        printf("spec-replay: %s, %d tokens (%lld replayed), --spec %s --draft-max %d%s", file, n,
               tokens, spec, kmax, fixed ? " (fixed)" : "");
        if (!mtp)
            printf(" --draft-ngram %d", ngram);
        printf("\npasses %lld, drafted %lld, accepted %lld (%.1f%%), %.2f tokens per pass\n",
               r.passes, r.drafted, r.accepted, r.drafted ? 100.0 * r.accepted / r.drafted : 0.0,
               r.passes ? (double)tokens / r.passes : 0.0);
        printf("acceptance by draft position:");
        for (int j = 0; j < kmax && r.tried_pos[j]; j++)
            printf(" %d:%.0f%%", j + 1, 100.0 * r.at_pos[j] / r.tried_pos[j]);
        printf("\n");
    }
    strata_mtp_close(r.mtp);
    strata_stream_close(r.st);
    strata_close(s);
    free(ids);
    return rc;
}
