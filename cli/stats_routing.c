/* strata stats-routing: runs texts through a model on the CPU and reports how its routers
 * behave (profiles/routing_stats.h): popularity concentration, reuse distances, and the recall
 * of predicting layer l+d's experts (d = 1..ROUTING_DEPTHS) by applying its router to layer l's
 * MoE input, and layer l's from the token's embedding alone. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "args.h"
#include "cachesim.h"
#include "cli.h"
#include "errors.h"
#include "model.h"
#include "moe.h"
#include "quant_ref.h"
#include "routing_stats.h"
#include "run_opts.h"
#include "strata.h"
#include "strata_internal.h"
#include "texts.h"

struct sr_opts {
    const char *model, *prompts, *plot, *dat;
    const char *separator; /* texts span lines, separated by a line equal to this */
    int n_threads, max_tokens;
};

struct sr_ctx {
    const struct model *m;
    struct routing_stats *rs;
    float *logits;   /* (n_expert) scratch */
    float *pw;       /* (k) scratch */
    int32_t *pred;   /* (k) scratch */
    int32_t *trace;  /* (max_tokens, n_layer, k) the current text's choices, token-major */
    int trace_tok;   /* tokens recorded in it */
    int max_tokens;
    struct cachesim *sim;
    const int32_t *tok; /* the current text's token ids */
    float *emb, *x;     /* (n_embd) scratch */
};

static void sr_usage(void)
{
    printf("usage: strata stats-routing [-m FILE] --prompts FILE [options]\n\n"
           "Runs every text of the prompts file (one per line, or with --separator texts of\n"
           "many lines) through the model on the CPU and prints, per layer: the share of\n"
           "expert activations taken by the most popular 10%% and 20%% of experts, how often a\n"
           "selected expert was also selected at the previous token (reuse@1) or within 8\n"
           "tokens, and the recall of predicting the layer's top-k by applying its router to\n"
           "the MoE input of the layer 1, 2, 3 or 4 layers earlier (depths 1..4: columns\n"
           "recall, recall@2, recall@3, recall@4), and by applying it to the token's own\n"
           "embedding, normed as the layer's MoE input is (column emb: what is known of a\n"
           "token before the model runs on it, such as a drafted token before its verify\n"
           "pass), and by the layer's choice at the position a prompt-lookup draft of the\n"
           "token was copied from, where the draft equals the token (column src: what the\n"
           "lookahead of --spec ngram copies ahead). Then the hit rate strata's expert cache\n"
           "(SLRU) would reach holding 10%%, 25%% and 40%% of the experts, replaying the texts\n"
           "in decode order.\n\n"
           "  -m, --model FILE      GGUF model (default: the shipped default model,\n"
           "                        " STRATA_DEFAULT_MODEL ")\n"
           "      --prompts FILE    texts, one per line; - reads standard input (required)\n"
           "      --separator LINE  texts span several lines and end at a line equal to LINE\n"
           "                        (e.g. source files joined with '<|endoftext|>')\n"
           "      --max-tokens N    tokens per text at most (default 2048)\n"
           "  -t, --threads N       CPU threads (default: all)\n"
           "      --dat FILE        also write the per-layer figures as columns\n"
           "      --plot FILE.png   also draw them with gnuplot (Debian: gnuplot-nox)\n");
}

static int sr_parse(int argc, char **argv, struct sr_opts *o)
{
    *o = (struct sr_opts){.max_tokens = 2048};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            sr_usage();
            return 1;
        }
        if (!v) {
            fprintf(stderr, "strata stats-routing: %s needs a value (see --help)\n", a);
            return 2;
        }
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            o->model = v;
        else if (!strcmp(a, "--prompts"))
            o->prompts = v;
        else if (!strcmp(a, "--plot"))
            o->plot = v;
        else if (!strcmp(a, "--dat"))
            o->dat = v;
        else if (!strcmp(a, "--separator"))
            o->separator = v;
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            rc = args_threads("stats-routing", a, v, 0, ARGS_MAX_THREADS, &o->n_threads);
        else if (!strcmp(a, "--max-tokens"))
            rc = args_i32("stats-routing", a, v, 1, INT32_MAX / 2, &o->max_tokens);
        else {
            fprintf(stderr, "strata stats-routing: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (rc)
            return rc;
        i++;
    }
    if (!o->prompts) {
        fprintf(stderr, "strata stats-routing: need --prompts FILE (see --help)\n");
        return 2;
    }
    if (o->plot && !texts_have_gnuplot()) {
        fprintf(stderr, "strata stats-routing: --plot needs gnuplot, which is not on PATH "
                        "(Debian/Ubuntu: apt-get install gnuplot-nox, or scripts/deps.sh)\n");
        return 2;
    }
    if (run_opts_model("stats-routing", &o->model))
        return 1;
    return 0;
}

/* Applies layer ev->layer + depth's router to layer ev->layer's MoE input and records each
 * token's softmax top-k as the prediction of that layer at this depth. */
static void sr_predict(struct sr_ctx *c, const struct strata_route_event *ev, int depth)
{
    const struct model_hparams *hp = &c->m->hp;
    int target = ev->layer + depth;
    const float *w = c->m->layers[target].router.data; /* (n_expert rows of n_embd) F32 */

    for (int t = 0; t < ev->n_tok; t++) {
        const float *x = ev->in + (size_t)t * hp->n_embd;
        for (uint32_t e = 0; e < hp->n_expert; e++) {
            const float *row = w + (size_t)e * hp->n_embd;
            double s = 0;
            for (uint32_t i = 0; i < hp->n_embd; i++)
                s += (double)row[i] * x[i];
            c->logits[e] = (float)s;
        }
        moe_route_softmax_topk(c->logits, 1, (int)hp->n_expert, ev->k, c->pred, c->pw);
        routing_stats_predict(c->rs, target, depth, ev->pos0 + t, c->pred);
    }
}

/* Scores layer ev->layer's router applied to each token's embedding, RMS-normed with the
 * layer's ffn_norm as its MoE input is, against the layer's choice. */
static void sr_embedding(struct sr_ctx *c, const struct strata_route_event *ev)
{
    const struct model_hparams *hp = &c->m->hp;
    const struct layer_weights *lw = &c->m->layers[ev->layer];
    const struct weight *E = &c->m->tok_embd;
    const float *w = lw->router.data, *g = lw->ffn_norm.data;
    if (!c->tok || !quant_ref_can_dequantize(E->type))
        return;
    for (int t = 0; t < ev->n_tok; t++) {
        int id = c->tok[ev->pos0 + t];
        if (quant_ref_dequantize(E->type, (const uint8_t *)E->data + (size_t)id * E->row_bytes,
                                 c->emb, (int64_t)hp->n_embd))
            return;
        double ss = 0;
        for (uint32_t i = 0; i < hp->n_embd; i++)
            ss += (double)c->emb[i] * c->emb[i];
        float r = (float)(1.0 / sqrt(ss / hp->n_embd + hp->rms_eps));
        for (uint32_t i = 0; i < hp->n_embd; i++)
            c->x[i] = c->emb[i] * r * (g ? g[i] : 1.0f);
        for (uint32_t e = 0; e < hp->n_expert; e++) {
            const float *row = w + (size_t)e * hp->n_embd;
            double s = 0;
            for (uint32_t i = 0; i < hp->n_embd; i++)
                s += (double)row[i] * c->x[i];
            c->logits[e] = (float)s;
        }
        moe_route_softmax_topk(c->logits, 1, (int)hp->n_expert, ev->k, c->pred, c->pw);
        routing_stats_embedding(c->rs, ev->layer, c->pred, ev->ids + (size_t)t * ev->k);
    }
}

/* Each position t of the text whose prompt-lookup draft (--draft-ngram 3, as generation looks
 * it up after tokens 0..t-1) is the token itself: every layer's choice at the draft's source
 * position scored as the prediction of its choice at t. */
static void sr_sources(struct sr_ctx *c, const int32_t *ids, int n)
{
    const struct model_hparams *hp = &c->m->hp;
    const size_t per_tok = (size_t)hp->n_layer * hp->n_expert_used;
    for (int t = 1; t < n; t++) {
        int src = strata_ngram_source(ids, t, 3);
        if (src < 0 || ids[src] != ids[t])
            continue;
        for (uint32_t l = 0; l < hp->n_layer; l++)
            routing_stats_source(c->rs, (int)l,
                                 c->trace + (size_t)src * per_tok + l * hp->n_expert_used,
                                 c->trace + (size_t)t * per_tok + l * hp->n_expert_used);
    }
}

/* Records layer l's choice and predicts layers l+1..l+ROUTING_DEPTHS' from the same input,
 * each with its own router, and layer l's from the tokens' embeddings. */
static void sr_observe(void *arg, const struct strata_route_event *ev)
{
    struct sr_ctx *c = arg;
    const struct model_hparams *hp = &c->m->hp;

    for (int t = 0; t < ev->n_tok; t++) {
        int pos = ev->pos0 + t;
        routing_stats_add(c->rs, ev->layer, pos, ev->ids + (size_t)t * ev->k);
        if (pos < c->max_tokens) {
            memcpy(c->trace + ((size_t)pos * hp->n_layer + (size_t)ev->layer) * ev->k,
                   ev->ids + (size_t)t * ev->k, sizeof(int32_t) * (size_t)ev->k);
            c->trace_tok = pos + 1 > c->trace_tok ? pos + 1 : c->trace_tok;
        }
    }
    for (int d = 1; d <= ROUTING_DEPTHS && ev->layer + d < (int)hp->n_layer; d++)
        sr_predict(c, ev, d);
    sr_embedding(c, ev);
}

/* Evaluates every text of the prompts file on a fresh stream. */
static int sr_run(const struct sr_opts *o, struct strata *st, struct sr_ctx *ctx, struct texts *tx,
                  int *n_texts, long *n_tokens)
{
    const struct model *m = ctx->m;
    struct strata_stream *s = NULL;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)o->max_tokens);
    int rc = 0;

    if (!ids || strata_start(st) || strata_stream_open(st, o->max_tokens, &s))
        rc = err_wrap(-ENOMEM, "starting the engine: ");
    size_t len;
    const char *line;
    while (!rc && (line = texts_next(tx, &len))) {
        if (len == 0)
            continue;
        int n = strata_tokenize(st, line, len, 0, ids, o->max_tokens);
        if (n < 0) {
            rc = n;
            break;
        }
        n = n < o->max_tokens ? n : o->max_tokens;
        strata_stream_truncate(s, 0);
        routing_stats_new_text(ctx->rs);
        ctx->tok = ids;
        ctx->trace_tok = 0;
        rc = strata_eval(s, ids, n, NULL);
        /* the text replayed in decode order through the simulated caches (kept warm) */
        size_t per_tok = (size_t)m->hp.n_layer * m->hp.n_expert_used;
        for (int t = 0; !rc && t < ctx->trace_tok; t++)
            cachesim_token(ctx->sim, ctx->trace + (size_t)t * per_tok);
        sr_sources(ctx, ids, ctx->trace_tok);
        (*n_texts)++;
        *n_tokens += n;
    }
    free(ids);
    strata_stream_close(s);
    return rc;
}

static int sr_plot(const struct sr_opts *o, const char *dat)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "gnuplot -e \"set terminal png size 900,500; set output '%s'; "
             "set xlabel 'layer'; set ylabel 'percent'; set key outside; set yrange [0:100]; "
             "plot '%s' u 1:2 w lp t 'top 10%% share', '' u 1:3 w lp t 'top 20%% share', "
             "'' u 1:4 w lp t 'reuse at next token', '' u 1:5 w lp t 'reuse within 8', "
             "'' u 1:6 w lp t 'recall l-1 -> l', '' u 1:7 w lp t 'recall l-2 -> l', "
             "'' u 1:8 w lp t 'recall l-3 -> l', '' u 1:9 w lp t 'recall l-4 -> l', "
             "'' u 1:10 w lp t 'recall from the embedding', "
             "'' u 1:11 w lp t 'recall from the draft source'\"",
             o->plot, dat);
    if (system(cmd) != 0) {
        fprintf(stderr, "strata stats-routing: gnuplot failed (is it installed?)\n");
        return 1;
    }
    printf("plot: %s\n", o->plot);
    return 0;
}

/* --max-tokens against the machine: the stream's KV cache (F32 K and V rows of every layer)
 * and the routing trace, per token, may take at most half the physical memory. 0, or 2 after
 * printing the arithmetic. */
static int sr_check_memory(const struct sr_opts *o, const struct model_hparams *hp)
{
    double kv = 2.0 * hp->n_layer * hp->n_head_kv * hp->head_dim * sizeof(float);
    double trace = (double)hp->n_layer * hp->n_expert_used * sizeof(int32_t);
    double per_tok = kv + trace + sizeof(int32_t), need = per_tok * o->max_tokens;
    double phys = (double)args_phys_bytes(), gib = 1073741824.0;

    if (phys <= 0 || need <= phys / 2)
        return 0;
    fprintf(stderr,
            "strata stats-routing: --max-tokens %d needs %d x (KV cache 2 x %u layers x %u x %u "
            "x 4 B + trace %u x %u x 4 B + 4 B) = %.2f GiB, more than half the physical memory "
            "(%.2f GiB / 2 = %.2f GiB)\n",
            o->max_tokens, o->max_tokens, hp->n_layer, hp->n_head_kv, hp->head_dim, hp->n_layer,
            hp->n_expert_used, need / gib, phys / gib, phys / 2 / gib);
    return 2;
}

int cmd_stats_routing(int argc, char **argv)
{
    struct sr_opts o;
    struct strata_config cfg;
    struct strata *st = NULL;
    const struct model *m;
    struct sr_ctx ctx = {0};
    int rc = sr_parse(argc, argv, &o), n_texts = 0;
    long n_tokens = 0;
    char dat[1024];

    if (rc)
        return rc == 1 ? 0 : rc;
    struct texts tx;
    if ((rc = texts_open("stats-routing", "--prompts", o.prompts, o.separator, &tx)))
        return rc;
    strata_config_init(&cfg);
    cfg.model_path = o.model;
    cfg.n_threads = o.n_threads > 0 ? o.n_threads : 0; /* -t 0 or less: OpenMP's default */
    cfg.route_observer = sr_observe;
    cfg.route_ctx = &ctx;
    if (strata_load(&cfg, &st)) {
        texts_close(&tx);
        return cli_open_fail();
    }
    m = strata_model_of(st);
    if (!m->tok) {
        strata_close(st);
        texts_close(&tx);
        fprintf(stderr, "strata stats-routing: %s has no tokenizer\n", o.model);
        return 1;
    }
    if ((rc = sr_check_memory(&o, &m->hp))) {
        strata_close(st);
        texts_close(&tx);
        return rc;
    }
    ctx.m = m;
    ctx.logits = malloc(sizeof(float) * m->hp.n_expert);
    ctx.emb = malloc(sizeof(float) * m->hp.n_embd);
    ctx.x = malloc(sizeof(float) * m->hp.n_embd);
    ctx.pw = malloc(sizeof(float) * m->hp.n_expert_used);
    ctx.pred = malloc(sizeof(int32_t) * m->hp.n_expert_used);
    ctx.max_tokens = o.max_tokens;
    ctx.trace = malloc(sizeof(int32_t) * (size_t)o.max_tokens * m->hp.n_layer *
                       m->hp.n_expert_used);
    static const double pools[] = {0.10, 0.25, 0.40};
    if (cachesim_open((int)m->hp.n_layer, (int)m->hp.n_expert, (int)m->hp.n_expert_used, pools,
                      3, &ctx.sim))
        ctx.sim = NULL;
    rc = routing_stats_open((int)m->hp.n_layer, (int)m->hp.n_expert, (int)m->hp.n_expert_used,
                            &ctx.rs);
    if (!rc &&
        (!ctx.logits || !ctx.emb || !ctx.x || !ctx.pw || !ctx.pred || !ctx.trace || !ctx.sim))
        rc = err_set(-ENOMEM, "out of memory");
    rc = rc ? rc : sr_run(&o, st, &ctx, &tx, &n_texts, &n_tokens);
    if (rc) {
        rc = cli_fail("stats-routing");
        goto out;
    }
    if (n_texts == 0) {
        fprintf(stderr, "strata stats-routing: --prompts %s holds no text (it is empty or "
                        "blank)\n", o.prompts);
        rc = 2;
        goto out;
    }
    printf("%s: %d texts, %ld tokens, %u layers, %u experts, top-%u\n", o.model, n_texts,
           n_tokens, m->hp.n_layer, m->hp.n_expert, m->hp.n_expert_used);
    routing_stats_print(ctx.rs, stdout);
    printf("expert cache (strata's SLRU replayed in decode order, no prefetch), hit rate:");
    for (int i = 0; i < cachesim_count(ctx.sim); i++)
        printf("%s %.1f%% with %.0f%% of experts cached (%d slots)", i ? "," : "",
               100.0 * cachesim_hit_rate(ctx.sim, i), 100.0 * cachesim_fraction(ctx.sim, i),
               cachesim_slots(ctx.sim, i));
    printf("\n");
    if (o.dat || o.plot) {
        snprintf(dat, sizeof(dat), "%s", o.dat ? o.dat : "/tmp/strata-routing.dat");
        if (routing_stats_write_dat(ctx.rs, dat)) {
            rc = cli_fail("writing the figures");
            goto out;
        }
        if (o.plot)
            rc = sr_plot(&o, dat);
    }
out:
    texts_close(&tx);
    routing_stats_close(ctx.rs);
    free(ctx.logits);
    free(ctx.emb);
    free(ctx.x);
    free(ctx.pw);
    free(ctx.pred);
    free(ctx.trace);
    cachesim_close(ctx.sim);
    strata_close(st);
    return rc;
}
