/* cuda spec: speculative decoding on the GPU. Greedy generation with prompt-lookup drafts
 * (--spec ngram, up to 8 drafts a verify pass) gives the same ids as plain greedy decoding in
 * each placement: all resident (also with graphs), the expert cache with too few slots (copy
 * and zero-copy fills), static; on the shipped default model (q4_k_m) and on a generated tiny
 * qwen3next f32 checkpoint, whose rejected drafts restore its recurrent state from the
 * checkpoint taken on the GPU. Besides prompt lookup, an oracle drafter proposes plain
 * decoding's own next tokens with the third of each pass wrong, so every pass both keeps and
 * rejects drafts. Prompt lookup runs with its lookahead (the drafted runs' earlier routing
 * copied ahead; the copy placement's passes report it). A verify pass's rows take the kernels a
 * lockstep step's rows take, which test_cuda_batch holds bit-identical to single-row decoding in these placements.
 * The hybrid placement chooses each miss's lane by measured cost, so its two runs may compute
 * a row on different lanes; it is reported, not held to identity.
 * The MTP block (--spec mtp) on tiny qwen3next and qwen35moe f32 checkpoints with one, in each
 * placement (all resident, graphs, the cache with copy and zero-copy fills, static, hybrid
 * reported): its drafts after a prompt equal the CPU backend's; greedy generation with its
 * drafts, and with an oracle that runs the block and then replaces its drafts as above, gives
 * plain decoding's ids. Exits 77 without a GPU. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen.h"
#include "quant_mix.h"
#include "strata.h"
#include "testutil.h"

#define NAME "test_cuda_spec"
#define N_GEN 64

static char tmpdir[] = "/tmp/strata-test-cuda-spec-XXXXXX";

struct place {
    const char *name;
    enum strata_placement placement;
    enum strata_fill fill;
    int slots, cpu_layers;
    unsigned flags;
    bool exact; /* held to identical ids */
};

/* Drafts that plain decoding's own ids would accept, except the third of every pass, which is
 * off by one: each pass keeps two drafts and rejects the rest, so both the accepting and the
 * rolling-back paths run on every model (a random model seldom repeats itself for prompt
 * lookup to find). */
struct oracle {
    const int32_t *plain; /* plain greedy ids */
    int n_plain, n_prompt, n_vocab;
};

static int oracle_draft(void *ctx, const int32_t *hist, int n_hist, int max, int32_t *out)
{
    const struct oracle *o = ctx;
    (void)hist;
    int g = n_hist - o->n_prompt, n = 0;
    for (; n < max && g + n < o->n_plain; n++)
        out[n] = n == 2 ? (o->plain[g + n] + 1) % o->n_vocab : o->plain[g + n];
    return n;
}

/* N_GEN greedy ids after prompt on a fresh stream, with draft_max drafts a pass (0: plain),
 * from fn (NULL: prompt lookup). */
static int generate(struct strata *s, const int32_t *prompt, int n, int draft_max,
                    int (*fn)(void *, const int32_t *, int, int, int32_t *), void *fn_ctx,
                    int32_t *ids, struct strata_generate_stats *st)
{
    struct strata_stream *str = NULL;
    struct strata_generate_params p;
    strata_generate_params_init(&p);
    p.n_predict = N_GEN;
    p.sampling.temperature = 0.0f;
    p.draft_max = draft_max;
    p.draft_fn = fn;
    p.draft_ctx = fn_ctx;
    memset(st, 0, sizeof(*st));
    int rc = strata_stream_open(s, 1024, &str);
    if (!rc)
        rc = strata_generate(str, prompt, n, &p, NULL, NULL, ids, st);
    strata_stream_close(str);
    return rc;
}

/* Opens path on the GPU in placement pl, or on the CPU when pl is NULL. */
static int open_placed(const char *path, const struct place *pl, struct strata **s)
{
    struct strata_config cfg;
    strata_config_init(&cfg);
    cfg.model_path = path;
    cfg.device = pl ? STRATA_DEVICE_CUDA : STRATA_DEVICE_CPU;
    if (pl) {
        cfg.placement = pl->placement;
        cfg.fill = pl->fill;
        cfg.expert_slots = pl->slots;
        cfg.cpu_moe_layers = pl->cpu_layers;
        cfg.flags = pl->flags;
    }
    return strata_open(&cfg, s);
}

static void check_place(const char *model, const char *path, const struct place *pl)
{
    struct strata *s = NULL;
    int rc = open_placed(path, pl, &s);
    CHECK(rc == 0, "%s, %s: strata_open: %s", model, pl->name, strata_error());
    if (rc)
        return;
    struct strata_model_info mi;
    strata_model_info(s, &mi);
    static const char *const texts[] = {"def fibonacci(n):",
                                        "class Stack:\n    def push(self, x):"};
    for (int t = 0; t < 2; t++) {
        int32_t prompt[64], a[N_GEN + 8], b[N_GEN + 8];
        int n = 0;
        if (mi.has_tokenizer)
            n = strata_tokenize(s, texts[t], strlen(texts[t]), STRATA_TOKENIZE_ADD_BOS, prompt, 64);
        for (; n < 6; n++) /* a tiny generated vocabulary may not spell the text */
            prompt[n] = (int32_t)((7 * t + 3 * n + 1) % (int)mi.n_vocab);

        struct strata_generate_stats sa, sb;
        int ra = generate(s, prompt, n, 0, NULL, NULL, a, &sa);
        struct oracle o = {a, sa.n_gen, n, (int)mi.n_vocab};
        for (int k = 0; k < 2; k++) { /* prompt lookup, then the oracle */
            int rb = generate(s, prompt, n, 8, k ? oracle_draft : NULL, &o, b, &sb);
            int same = 0;
            while (same < sa.n_gen && same < sb.n_gen && a[same] == b[same])
                same++;
            printf("%s, %s, prompt %d: %d greedy tokens, with %s drafts %d of them the same; "
                   "%d verify passes, %d drafted, %d accepted; %d looked ahead, %lld experts "
                   "copied ahead\n",
                   model, pl->name, t, sa.n_gen, k ? "oracle" : "ngram", same, sb.n_verify,
                   sb.n_drafted, sb.n_accepted, sb.n_lookahead, sb.lookahead_experts);
            CHECK(!ra && !rb, "%s, %s: generate: %d %d (%s)", model, pl->name, ra, rb,
                  strata_error());
            if (k)
                CHECK(sb.n_accepted > 0 && sb.n_accepted < sb.n_drafted,
                      "%s, %s, prompt %d: oracle drafts: %d of %d accepted", model, pl->name, t,
                      sb.n_accepted, sb.n_drafted);
            if (pl->exact)
                CHECK(sa.n_gen == sb.n_gen && same == sa.n_gen,
                      "%s, %s, prompt %d: greedy with %s drafts leaves plain decoding at token "
                      "%d",
                      model, pl->name, t, k ? "oracle" : "ngram", same);
        }
    }
    strata_close(s);
}

/* ---- the MTP block ------------------------------------------------------------------------- */

/* The oracle's drafts after the MTP block has drafted (so that the block runs, and its cache
 * follows accepted and rejected rows). */
struct mtp_oracle {
    struct oracle o;
    struct strata_mtp *mtp;
};

static int mtp_oracle_draft(void *ctx, const int32_t *hist, int n_hist, int max, int32_t *out)
{
    struct mtp_oracle *m = ctx;
    strata_mtp_draft(m->mtp, hist, n_hist, max, out);
    return oracle_draft(&m->o, hist, n_hist, max, out);
}

/* N_GEN greedy ids after prompt on a fresh stream followed by the MTP block, drafted by it
 * (mo NULL) or by the oracle after it; d3, if not NULL, receives the block's 3 drafts after
 * the prompt and token first instead (nothing generated). */
static int generate_mtp(struct strata *s, const int32_t *prompt, int n, struct mtp_oracle *mo,
                        int32_t first, int32_t *d3, int32_t *ids, struct strata_generate_stats *st)
{
    struct strata_stream *str = NULL;
    struct strata_mtp *mtp = NULL;
    struct strata_generate_params p;
    strata_generate_params_init(&p);
    p.n_predict = N_GEN;
    p.sampling.temperature = 0.0f;
    p.draft_max = 8;
    memset(st, 0, sizeof(*st));
    int rc = strata_stream_open(s, 1024, &str);
    rc = rc ? rc : strata_mtp_open(str, &mtp);
    if (!rc && d3) {
        int32_t hist[65];
        memcpy(hist, prompt, sizeof(int32_t) * (size_t)n);
        hist[n] = first;
        rc = strata_eval(str, prompt, n, NULL);
        if (!rc && strata_mtp_draft(mtp, hist, n + 1, 3, d3) != 3)
            rc = -EIO;
    } else if (!rc) {
        if (mo)
            mo->mtp = mtp;
        p.draft_fn = mo ? mtp_oracle_draft : strata_mtp_draft;
        p.draft_ctx = mo ? (void *)mo : (void *)mtp;
        rc = strata_generate(str, prompt, n, &p, NULL, NULL, ids, st);
    }
    strata_mtp_close(mtp);
    strata_stream_close(str);
    return rc;
}

static void check_mtp_place(const char *model, const char *path, const struct place *pl,
                            const int32_t *cpu_d3, int32_t first)
{
    struct strata *s = NULL;
    int rc = open_placed(path, pl, &s);
    CHECK(rc == 0, "%s MTP, %s: strata_open: %s", model, pl ? pl->name : "cpu", strata_error());
    if (rc)
        return;
    const int32_t prompt[6] = {3, 17, 40, 5, 99, 7};
    int32_t a[N_GEN + 8], b[N_GEN + 8], d3[3];
    struct strata_generate_stats sa, sb;
    int ra = generate(s, prompt, 6, 0, NULL, NULL, a, &sa);
    int rd = generate_mtp(s, prompt, 6, NULL, first, d3, NULL, &sb);
    CHECK(!ra && !rd, "%s MTP, %s: %d %d (%s)", model, pl ? pl->name : "cpu", ra, rd,
          strata_error());
    if (!pl) { /* the CPU backend: the reference drafts */
        memcpy((int32_t *)cpu_d3, d3, sizeof(d3));
        strata_close(s);
        return;
    }
    CHECK(!memcmp(d3, cpu_d3, sizeof(d3)), "%s MTP, %s: drafts %d %d %d, the CPU's %d %d %d", model,
          pl->name, d3[0], d3[1], d3[2], cpu_d3[0], cpu_d3[1], cpu_d3[2]);
    struct mtp_oracle mo = {.o = {a, sa.n_gen, 6, 1024}};
    for (int k = 0; k < 2; k++) { /* the block's drafts, then the oracle after the block */
        int rb = generate_mtp(s, prompt, 6, k ? &mo : NULL, 0, NULL, b, &sb);
        int same = 0;
        while (same < sa.n_gen && same < sb.n_gen && a[same] == b[same])
            same++;
        printf("%s, %s: drafts after the prompt %d %d %d (the CPU's: %s); %d greedy tokens, with "
               "%s drafts %d of them the same; %d verify passes, %d drafted, %d accepted\n",
               model, pl->name, d3[0], d3[1], d3[2],
               memcmp(d3, cpu_d3, sizeof(d3)) ? "DIFFERENT" : "the same", sa.n_gen,
               k ? "oracle-after-MTP" : "MTP", same, sb.n_verify, sb.n_drafted, sb.n_accepted);
        CHECK(!rb && sb.n_drafted > 0, "%s MTP, %s: generate %d, %d drafted (%s)", model, pl->name,
              rb, sb.n_drafted, strata_error());
        if (k)
            CHECK(sb.n_accepted > 0 && sb.n_accepted < sb.n_drafted,
                  "%s MTP, %s: oracle drafts: %d of %d accepted", model, pl->name, sb.n_accepted,
                  sb.n_drafted);
        if (pl->exact)
            CHECK(sa.n_gen == sb.n_gen && same == sa.n_gen,
                  "%s MTP, %s: greedy with drafts leaves plain decoding at token %d", model,
                  pl->name, same);
    }
    strata_close(s);
}

static void check_mtp(const char *arch)
{
    char path[512], label[64];
    struct gen_preset p = *gen_preset_find_arch(arch, "tiny");
    p.n_nextn = 1;
    p.arch = arch;
    snprintf(label, sizeof(label), "tiny %s f32 + MTP", arch);
    if (test_gen_model(&p, QUANT_MIX_F32, 4, tmpdir, "mtp", path, sizeof(path))) {
        CHECK(0, "gen %s: %s", arch, strata_error());
        return;
    }
    /* the first greedy token after the prompt, on the CPU, and the block's drafts there */
    struct strata_config cfg;
    struct strata *s = NULL;
    strata_config_init(&cfg);
    cfg.model_path = path;
    cfg.device = STRATA_DEVICE_CPU;
    const int32_t prompt[6] = {3, 17, 40, 5, 99, 7};
    int32_t first = -1, cpu_d3[3] = {-1, -1, -1};
    struct strata_stream *st = NULL;
    if (!strata_open(&cfg, &s) && !strata_stream_open(s, 64, &st))
        strata_eval_argmax(st, prompt, 6, &first);
    strata_stream_close(st);
    strata_close(s);
    CHECK(first >= 0, "%s: the first token on the CPU: %s", arch, strata_error());
    check_mtp_place(label, path, NULL, cpu_d3, first);
    const struct place pl[] = {
        {"all resident", STRATA_PLACEMENT_STREAM, STRATA_FILL_COPY, 0, 0, 0, true},
        {"all resident, graphs", STRATA_PLACEMENT_STREAM, STRATA_FILL_COPY, 0, 0, STRATA_FLAG_GRAPH,
         true},
        {"6 slots, copy", STRATA_PLACEMENT_STREAM, STRATA_FILL_COPY, 6, 0, 0, true},
        {"6 slots, zero-copy", STRATA_PLACEMENT_STREAM, STRATA_FILL_ZEROCOPY, 6, 0, 0, true},
        {"static, 2 layers on the CPU", STRATA_PLACEMENT_STATIC, STRATA_FILL_COPY, 0, 2, 0, true},
        {"6 slots, hybrid", STRATA_PLACEMENT_HYBRID, STRATA_FILL_COPY, 6, 0, 0, false},
    };
    for (size_t i = 0; i < sizeof(pl) / sizeof(pl[0]); i++)
        check_mtp_place(label, path, &pl[i], cpu_d3, first);
    unlink(path);
}

int main(void)
{
    char q3n[512], path[512];

    if (!test_gpu_available("test_cuda_spec"))
        return TEST_SKIP;
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    const struct gen_preset *p = gen_preset_find_arch("qwen3next", "tiny");
    if (!p || test_gen_model(p, QUANT_MIX_F32, 3, tmpdir, "q3n", q3n, sizeof(q3n))) {
        fprintf(stderr, "setup: %s\n", strata_error());
        return 1;
    }
    const struct place tiny[] = {
        {"all resident", STRATA_PLACEMENT_STREAM, STRATA_FILL_COPY, 0, 0, 0, true},
        {"all resident, graphs", STRATA_PLACEMENT_STREAM, STRATA_FILL_COPY, 0, 0, STRATA_FLAG_GRAPH,
         true},
        {"6 slots, copy", STRATA_PLACEMENT_STREAM, STRATA_FILL_COPY, 6, 0, 0, true},
    };
    for (int i = 0; i < 3; i++)
        check_place("tiny qwen3next f32", q3n, &tiny[i]);
    check_mtp("qwen3next");
    check_mtp("qwen35moe");
    test_data_path(path, sizeof(path), "../../models/strata-default.gguf");
    if (access(path, R_OK) == 0) {
        const struct place def[] = {
            {"all resident", STRATA_PLACEMENT_STREAM, STRATA_FILL_COPY, 0, 0, 0, true},
            {"all resident, graphs", STRATA_PLACEMENT_STREAM, STRATA_FILL_COPY, 0, 0,
             STRATA_FLAG_GRAPH, true},
            {"40 slots, copy", STRATA_PLACEMENT_STREAM, STRATA_FILL_COPY, 40, 0, 0, true},
            {"40 slots, zero-copy", STRATA_PLACEMENT_STREAM, STRATA_FILL_ZEROCOPY, 40, 0, 0, true},
            {"static, 4 layers on the CPU", STRATA_PLACEMENT_STATIC, STRATA_FILL_COPY, 0, 4, 0,
             true},
            {"40 slots, hybrid", STRATA_PLACEMENT_HYBRID, STRATA_FILL_COPY, 40, 0, 0, false},
        };
        for (int i = 0; i < 6; i++)
            check_place("default model", path, &def[i]);
    }
    unlink(q3n);
    rmdir(tmpdir);
    return test_finish(NAME);
}
