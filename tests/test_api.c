/* api: the public API (include/strata.h) on the CPU, on a generated `tiny` checkpoint (F32,
 * fixed seed, so every run sees the same model and the same token ids):
 * - strata_open / strata_close, strata_model_info against the model's hyperparameters, and
 *   the two steps strata_load / strata_start (strata_internal.h);
 * - strata_tokenize then strata_token_text gives the text back byte for byte; a capacity too
 *   small returns the full count; special tokens parse only when asked;
 * - strata_eval's logits equal stream_eval's on the internal stream, bit for bit, for a prompt
 *   and a decode step; strata_eval_argmax equals their argmax; truncating and evaluating again
 *   gives the same logits;
 * - strata_generate at temperature 0 equals a manual strata_eval + argmax loop (ids and text);
 *   strata_sampler at temperature 0 is the argmax, and two samplers of one seed agree;
 * - the route observer sees every layer for every token, with the stream's positions;
 * - errors: a missing file (-ENOENT, the file named), a host_budget below one layer's experts
 *   (-EINVAL) or with CUDA's zero-copy cache (-ENOTSUP), CUDA options on
 *   the CPU device (-EINVAL), a residency profile without an expert cache (-ENOTSUP; reported
 *   and ignored with STRATA_FLAG_PROFILE_OPTIONAL), the CUDA device
 *   without a GPU (-ENODEV; not checked where a GPU is present), an id outside the vocabulary
 *   (-EINVAL), a context overflow (-ENOSPC), a stream before strata_start (-EINVAL).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_info.h"
#include "gen.h"
#include "model.h"
#include "sampler.h"
#include "strata.h"
#include "strata_internal.h"
#include "stream.h"
#include "testutil.h"

#define N_GEN 16
#define MAX_IDS 256

static char tmpdir[] = "/tmp/strata-test-api-XXXXXX";
static const char *text = "def add(a, b):\n    return a + b  # 42\n\xc3\xa9t\xc3\xa9";

static void config_cpu(struct strata_config *cfg, const char *path)
{
    strata_config_init(cfg);
    cfg->model_path = path;
    cfg->device = STRATA_DEVICE_CPU;
    cfg->n_threads = 2;
    cfg->n_ctx = 128;
    cfg->n_batch = 32;
}

/* Lowest index of the largest value. */
static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        best = x[i] > x[best] ? i : best;
    return best;
}

static void check_info(struct strata *s)
{
    struct strata_model_info mi;
    const struct model *m = strata_model_of(s);

    strata_model_info(s, &mi);
    CHECK(!strcmp(mi.arch, "qwen3moe"), "arch %s", mi.arch);
    CHECK(mi.n_layer == m->hp.n_layer && mi.n_embd == m->hp.n_embd &&
              mi.n_expert == m->hp.n_expert && mi.n_expert_used == m->hp.n_expert_used &&
              mi.n_vocab == m->hp.n_vocab && mi.head_dim == m->hp.head_dim,
          "model info differs from the model's hyperparameters");
    CHECK(!strcmp(mi.device, "cpu") && mi.has_tokenizer, "device %s, tokenizer %d", mi.device,
          mi.has_tokenizer);
}

/* Tokenizes text; the ids' texts concatenated give it back. Returns the count. */
static int check_tokenize(struct strata *s, int32_t *ids)
{
    char back[1024];
    size_t at = 0, len = strlen(text);
    int32_t small[2];
    int n = strata_tokenize(s, text, len, 0, ids, MAX_IDS);

    CHECK(n > 2 && n <= MAX_IDS, "tokenize: %d (%s)", n, strata_error());
    if (n <= 2 || n > MAX_IDS)
        return 0;
    CHECK(strata_tokenize(s, text, len, 0, small, 2) == n, "a short buffer must return %d", n);
    CHECK(small[0] == ids[0] && small[1] == ids[1], "the short buffer holds the first ids");
    CHECK(strata_tokenize(s, text, len, 0, NULL, 0) == n, "counting call");
    for (int i = 0; i < n; i++) {
        size_t tl;
        const char *t = strata_token_text(s, ids[i], &tl);
        CHECK(t && at + tl < sizeof(back), "token %d has no text", ids[i]);
        if (!t || at + tl >= sizeof(back))
            return 0;
        memcpy(back + at, t, tl);
        at += tl;
    }
    CHECK(at == len && !memcmp(back, text, len), "round trip: '%.*s'", (int)at, back);
    CHECK(strata_token_text(s, -1, &at) == NULL, "id -1 has a text");

    int32_t sp[16];
    int k = strata_tokenize(s, "<|im_end|>", 10, STRATA_TOKENIZE_SPECIAL, sp, 16);
    CHECK(k == 1 && strata_token_is_eog(s, sp[0]), "<|im_end|>: %d ids, eog %d", k,
          k > 0 && strata_token_is_eog(s, sp[0]));
    k = strata_tokenize(s, "<|im_end|>", 10, 0, sp, 16);
    CHECK(k > 1, "<|im_end|> without STRATA_TOKENIZE_SPECIAL: %d ids", k);
    return n;
}

/* strata_eval against stream_eval on the internal stream, prompt then one decode step. */
static void check_eval(struct strata *s, const int32_t *ids, int n)
{
    int nv = (int)strata_model_of(s)->hp.n_vocab;
    float *la = test_xmalloc(sizeof(float) * (size_t)nv);
    float *lb = test_xmalloc(sizeof(float) * (size_t)nv);
    struct strata_stream *a = NULL, *b = NULL, *c = NULL;
    int32_t next = -1, next_c = -1;

    if (strata_stream_open(s, 64, &a) || strata_stream_open(s, 64, &b) ||
        strata_stream_open(s, 64, &c)) {
        CHECK(0, "stream: %s", strata_error());
        goto out;
    }
    CHECK(strata_stream_n_ctx(a) == 64, "n_ctx %d", strata_stream_n_ctx(a));
    test_poison_f32(la, (size_t)nv);
    test_poison_f32(lb, (size_t)nv);
    CHECK(strata_eval(a, ids, n, la) == 0, "strata_eval: %s", strata_error());
    CHECK(stream_eval(strata_stream_of(b), ids, n, lb) == 0, "stream_eval: %s", strata_error());
    CHECK(!memcmp(la, lb, sizeof(float) * (size_t)nv), "prompt logits differ");
    CHECK(strata_eval_argmax(c, ids, n, &next_c) == 0, "eval_argmax: %s", strata_error());
    next = argmax(la, nv);
    CHECK(next == next_c, "argmax %d, strata_eval_argmax %d", next, next_c);
    CHECK(strata_stream_pos(a) == n && strata_stream_pos(c) == n, "positions %d %d",
          strata_stream_pos(a), strata_stream_pos(c));

    CHECK(strata_eval(a, &next, 1, la) == 0, "decode: %s", strata_error());
    CHECK(stream_eval(strata_stream_of(b), &next, 1, lb) == 0, "decode: %s", strata_error());
    CHECK(!memcmp(la, lb, sizeof(float) * (size_t)nv), "decode logits differ");

    /* forgetting the decode step and taking it again: the same logits */
    strata_stream_truncate(a, n);
    CHECK(strata_stream_pos(a) == n, "truncate: pos %d", strata_stream_pos(a));
    test_poison_f32(la, (size_t)nv);
    CHECK(strata_eval(a, &next, 1, la) == 0, "decode again: %s", strata_error());
    CHECK(!memcmp(la, lb, sizeof(float) * (size_t)nv), "logits differ after truncate");

    int32_t bad = (int32_t)nv;
    CHECK(strata_eval(a, &bad, 1, la) == -EINVAL, "id %d outside the vocabulary", bad);
    CHECK(strata_stream_pos(a) == n + 1, "a refused id moved the stream");
    int32_t many[80] = {0};
    CHECK(strata_eval(a, many, 80, NULL) == -ENOSPC, "overflow of a 64-position stream");
out:
    strata_stream_close(a);
    strata_stream_close(b);
    strata_stream_close(c);
    free(la);
    free(lb);
}

struct collect {
    char buf[4096];
    size_t len;
};

static int collect_text(void *ctx, const char *t, size_t len)
{
    struct collect *c = ctx;
    if (c->len + len <= sizeof(c->buf)) {
        memcpy(c->buf + c->len, t, len);
        c->len += len;
    }
    return 0;
}

/* strata_generate greedy against strata_eval and the argmax, token by token. */
static void check_generate(struct strata *s, const int32_t *ids, int n)
{
    int nv = (int)strata_model_of(s)->hp.n_vocab;
    float *l = test_xmalloc(sizeof(float) * (size_t)nv);
    struct strata_stream *g = NULL, *m = NULL;
    struct strata_generate_params gp;
    struct strata_generate_stats gs;
    struct collect got = {{0}, 0}, want = {{0}, 0};
    int32_t out[N_GEN], manual[N_GEN + 1];
    int rc;

    if (strata_stream_open(s, 0, &g) || strata_stream_open(s, 0, &m)) {
        CHECK(0, "stream: %s", strata_error());
        goto out;
    }
    strata_generate_params_init(&gp);
    CHECK(gp.n_predict == 128 && gp.sampling.top_k == 40 && gp.sampling.repeat_last_n == 64,
          "generate defaults");
    gp.n_predict = N_GEN;
    gp.sampling.temperature = 0;
    rc = strata_generate(g, ids, n, &gp, collect_text, &got, out, &gs);
    CHECK(rc == 0, "strata_generate: %s", strata_error());
    CHECK(gs.n_prompt == n && gs.n_gen >= 1 && gs.n_gen <= N_GEN, "stats: %d prompt, %d gen",
          gs.n_prompt, gs.n_gen);
    CHECK(gs.n_gen == N_GEN || gs.stopped_eog, "stopped after %d tokens without a reason",
          gs.n_gen);
    printf("test_api: prompt of %d tokens, %d generated greedily (%zu bytes of text)\n", n,
           gs.n_gen, got.len);

    rc = strata_eval(m, ids, n, l);
    for (int i = 0; !rc && i <= gs.n_gen && i <= N_GEN; i++) {
        manual[i] = argmax(l, nv);
        if (i < N_GEN)
            rc = strata_eval(m, &manual[i], 1, l);
    }
    CHECK(rc == 0, "manual loop: %s", strata_error());
    for (int i = 0; i < gs.n_gen; i++) {
        CHECK(out[i] == manual[i], "token %d: generate %d, manual %d", i, out[i], manual[i]);
        size_t tl;
        const char *t = strata_token_text(s, manual[i], &tl);
        bool control = t && tl > 4 && !strncmp(t, "<|", 2) && !strncmp(t + tl - 2, "|>", 2);
        if (t && !control) /* control tokens decode to nothing */
            collect_text(&want, t, tl);
    }
    if (gs.stopped_eog)
        CHECK(strata_token_is_eog(s, manual[gs.n_gen]), "stopped at %d, not an eog token",
              manual[gs.n_gen]);
    CHECK(got.len == want.len && !memcmp(got.buf, want.buf, got.len),
          "emitted text '%.*s', token texts '%.*s'", (int)got.len, got.buf, (int)want.len,
          want.buf);

    /* the sampler: greedy is the argmax; one seed, one sequence */
    struct strata_sampling sp;
    struct strata_sampler *s0 = NULL, *s1 = NULL, *s2 = NULL;
    strata_sampling_init(&sp);
    CHECK(sp.temperature > 0.79f && sp.temperature < 0.81f && sp.top_p > 0.94f,
          "sampling defaults");
    sp.seed = 11;
    struct strata_sampling greedy = sp;
    greedy.temperature = 0;
    if (strata_sampler_open(s, &greedy, &s0) || strata_sampler_open(s, &sp, &s1) ||
        strata_sampler_open(s, &sp, &s2)) {
        CHECK(0, "sampler: %s", strata_error());
    } else {
        float *l2 = test_xmalloc(sizeof(float) * (size_t)nv);
        for (int i = 0; i < 8; i++) {
            strata_stream_truncate(m, 0);
            CHECK(strata_eval(m, ids, n - (i % 3), l) == 0, "eval: %s", strata_error());
            memcpy(l2, l, sizeof(float) * (size_t)nv);
            int32_t want_id = argmax(l, nv);
            CHECK(strata_sampler_sample(s0, l) == want_id, "greedy sampler");
            memcpy(l, l2, sizeof(float) * (size_t)nv);
            int32_t a = strata_sampler_sample(s1, l);
            int32_t b = strata_sampler_sample(s2, l2);
            CHECK(a == b && a >= 0 && a < nv, "samplers of one seed: %d and %d", a, b);
        }
        free(l2);
    }
    strata_sampler_close(s0);
    strata_sampler_close(s1);
    strata_sampler_close(s2);
out:
    strata_stream_close(g);
    strata_stream_close(m);
    free(l);
}

struct routes {
    int n_layer, k, n_expert;
    int tokens[64];   /* (n_layer) tokens seen per layer */
    int next_pos[64]; /* (n_layer) the position each layer expects next */
    int bad;
};

static void route_count(void *ctx, const struct strata_route_event *ev)
{
    struct routes *r = ctx;
    if (ev->layer < 0 || ev->layer >= r->n_layer || ev->k != r->k ||
        ev->pos0 != r->next_pos[ev->layer]) {
        r->bad++;
        return;
    }
    for (int t = 0; t < ev->n_tok; t++) {
        float sum = 0;
        for (int j = 0; j < ev->k; j++) {
            int32_t e = ev->ids[t * ev->k + j];
            r->bad += e < 0 || e >= r->n_expert;
            sum += ev->weights[t * ev->k + j];
        }
        r->bad += fabsf(sum - 1.0f) > 1e-4f || !isfinite(ev->in[0]);
    }
    r->tokens[ev->layer] += ev->n_tok;
    r->next_pos[ev->layer] = ev->pos0 + ev->n_tok;
}

static void check_route_observer(const char *path, const int32_t *ids, int n)
{
    struct strata_config cfg;
    struct strata *s = NULL;
    struct strata_stream *st = NULL;
    struct routes r = {0};
    int32_t next;

    config_cpu(&cfg, path);
    cfg.route_observer = route_count;
    cfg.route_ctx = &r;
    if (strata_open(&cfg, &s) || strata_stream_open(s, 0, &st)) {
        CHECK(0, "open with an observer: %s", strata_error());
        strata_close(s);
        return;
    }
    const struct model *m = strata_model_of(s);
    r.n_layer = (int)m->hp.n_layer;
    r.k = (int)m->hp.n_expert_used;
    r.n_expert = (int)m->hp.n_expert;
    CHECK(r.n_layer <= 64, "n_layer %d", r.n_layer);
    CHECK(strata_eval_argmax(st, ids, n, &next) == 0, "eval: %s", strata_error());
    CHECK(strata_eval(st, &next, 1, NULL) == 0, "decode: %s", strata_error());
    for (int l = 0; l < r.n_layer; l++)
        CHECK(r.tokens[l] == n + 1, "layer %d saw %d tokens, not %d", l, r.tokens[l], n + 1);
    CHECK(r.bad == 0, "%d malformed route events", r.bad);
    strata_stream_close(st);
    strata_close(s);
}

static void check_errors(const char *path)
{
    struct strata_config cfg;
    struct strata *s = NULL;
    struct strata_stream *st = NULL;
    const char *missing = "/nonexistent/strata-test-api.gguf";
    int rc;

    config_cpu(&cfg, missing);
    rc = strata_open(&cfg, &s);
    CHECK(rc == -ENOENT, "missing file: %d", rc);
    CHECK(strstr(strata_error(), missing) != NULL, "the message does not name the file: %s",
          strata_error());
    CHECK(strata_failed_step() == STRATA_STEP_LOAD, "step %d", (int)strata_failed_step());

    config_cpu(&cfg, path);
    cfg.host_budget = 4096; /* less than one layer's experts */
    rc = strata_open(&cfg, &s);
    CHECK(rc == -EINVAL, "host_budget of 4 KiB: %d", rc);
    CHECK(strstr(strata_error(), "one layer has") != NULL, "host_budget message: %s",
          strata_error());
    config_cpu(&cfg, path);
    cfg.device = STRATA_DEVICE_CUDA;
    cfg.vram_budget = 1 << 30;
    cfg.fill = STRATA_FILL_ZEROCOPY;
    cfg.host_budget = 1 << 30;
    rc = strata_open(&cfg, &s);
    CHECK(rc == -ENOTSUP, "host_budget with CUDA's zero-copy cache: %d", rc);
    CHECK(strstr(strata_error(), "zero-copy misses") != NULL, "host_budget message: %s",
          strata_error());

    config_cpu(&cfg, path);
    cfg.vram_budget = 1 << 30;
    CHECK(strata_open(&cfg, &s) == -EINVAL, "vram_budget on the CPU device");
    config_cpu(&cfg, path);
    cfg.placement = STRATA_PLACEMENT_HYBRID;
    CHECK(strata_open(&cfg, &s) == -EINVAL, "hybrid placement on the CPU device");
    config_cpu(&cfg, NULL);
    CHECK(strata_open(&cfg, &s) == -EINVAL, "no model path");

    /* a profile needs the expert cache; optional, it is reported and the run goes on */
    config_cpu(&cfg, path);
    cfg.profile = "/nonexistent.profile";
    rc = strata_open(&cfg, &s);
    CHECK(rc == -ENOTSUP && strstr(strata_error(), "expert cache"), "a profile on the CPU: %d "
          "(%s)", rc, strata_error());
    cfg.flags |= STRATA_FLAG_PROFILE_OPTIONAL;
    rc = strata_open(&cfg, &s);
    CHECK(rc == 0, "an optional profile on the CPU: %d (%s)", rc, strata_error());
    if (!rc) {
        struct strata_profile_status ps;
        struct strata_probe_report pr;
        strata_profile_status(s, &ps);
        CHECK(!ps.restored, "an optional profile on the CPU was restored");
        CHECK(strata_profile_probe(s, &pr) == -ENOENT, "a probe without a profile");
        strata_close(s);
    }

    if (cuda_device_count(NULL) == 0) {
        config_cpu(&cfg, path);
        cfg.device = STRATA_DEVICE_CUDA;
        rc = strata_open(&cfg, &s);
        CHECK(rc == -ENODEV, "CUDA without a GPU: %d (%s)", rc, strata_error());
        CHECK(strata_failed_step() == STRATA_STEP_ENGINE, "step %d", (int)strata_failed_step());
        config_cpu(&cfg, path);
        cfg.device = STRATA_DEVICE_AUTO;
        cfg.vram_budget = 1 << 30;
        CHECK(strata_open(&cfg, &s) == -ENODEV, "AUTO with a VRAM budget and no GPU");
        cfg.vram_budget = 0; /* AUTO without a GPU: the CPU */
        rc = strata_open(&cfg, &s);
        CHECK(rc == 0, "AUTO without a GPU: %s", strata_error());
        if (!rc) {
            struct strata_model_info mi;
            strata_model_info(s, &mi);
            CHECK(!strcmp(mi.device, "cpu"), "AUTO chose %s", mi.device);
            strata_close(s);
        }
    } else {
        printf("test_api: a GPU is present: the -ENODEV checks are skipped\n");
    }

    /* the two steps: the tokenizer before the engine, no stream before it */
    config_cpu(&cfg, path);
    rc = strata_load(&cfg, &s);
    CHECK(rc == 0, "strata_load: %s", strata_error());
    if (rc)
        return;
    CHECK(strata_tokenize(s, "a", 1, 0, NULL, 0) == 1, "tokenize before strata_start");
    CHECK(strata_stream_open(s, 0, &st) == -EINVAL, "a stream before strata_start");
    CHECK(strata_start(s) == 0, "strata_start: %s", strata_error());
    CHECK(strata_stream_open(s, 0, &st) == 0, "stream: %s", strata_error());
    struct strata_stats ss;
    strata_get_stats(s, &ss);
    CHECK(!ss.has_cache && ss.vram_bytes == 0, "CPU statistics");
    CHECK(strata_print_cache_stats(s, stdout) == 0, "no cache, nothing printed");
    strata_stream_close(st);
    strata_close(s);
}

/* Progress of a prefill longer than one chunk (n_batch 32): the callback sees every chunk's
 * end and can stop the evaluation; stopping keeps the chunks done. */
struct progress_log {
    int calls, done[8], total, stop_at;
};

static int on_progress(void *ctx, int done, int total)
{
    struct progress_log *p = ctx;
    if (p->calls < 8)
        p->done[p->calls] = done;
    p->calls++;
    p->total = total;
    return p->stop_at && done >= p->stop_at;
}

static void check_progress(struct strata *s)
{
    int nv = (int)strata_model_of(s)->hp.n_vocab;
    int32_t ids[80];
    float *la = test_xmalloc(sizeof(float) * (size_t)nv);
    float *lb = test_xmalloc(sizeof(float) * (size_t)nv);
    struct strata_stream *a = NULL, *b = NULL;
    struct progress_log stop = {.stop_at = 64}, all = {0};

    for (int i = 0; i < 80; i++)
        ids[i] = (int32_t)((i * 37 + 11) % nv);
    if (strata_stream_open(s, 128, &a) || strata_stream_open(s, 128, &b)) {
        CHECK(0, "stream: %s", strata_error());
        goto out;
    }
    strata_stream_set_progress(a, on_progress, &stop);
    CHECK(strata_eval(a, ids, 80, la) == -EINTR, "a stopped prefill returns -EINTR");
    CHECK(stop.calls == 2 && stop.done[0] == 32 && stop.done[1] == 64 && stop.total == 80,
          "progress calls %d (%d, %d of %d)", stop.calls, stop.done[0], stop.done[1], stop.total);
    CHECK(strata_stream_pos(a) == 64, "the chunks done stay: pos %d", strata_stream_pos(a));
    strata_stream_truncate(a, 0);
    strata_stream_set_progress(a, on_progress, &all);
    test_poison_f32(la, (size_t)nv);
    test_poison_f32(lb, (size_t)nv);
    CHECK(strata_eval(a, ids, 80, la) == 0, "prefill with progress: %s", strata_error());
    CHECK(all.calls == 3 && all.done[2] == 80, "progress calls %d, last %d", all.calls,
          all.done[2]);
    CHECK(strata_eval(b, ids, 80, lb) == 0, "prefill: %s", strata_error());
    CHECK(!memcmp(la, lb, sizeof(float) * (size_t)nv), "progress changed the logits");
    all.calls = 0;
    CHECK(strata_eval(a, ids, 1, la) == 0 && all.calls == 0, "one chunk: no progress call");
out:
    strata_stream_close(a);
    strata_stream_close(b);
    free(la);
    free(lb);
}

int main(void)
{
    char path[512];
    int32_t ids[MAX_IDS];
    struct strata_config cfg;
    struct strata *s = NULL;
    int n;

    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    if (test_gen_model(gen_preset_find("tiny"), QUANT_MIX_F32, 7, tmpdir, "tiny", path,
                       sizeof(path))) {
        fprintf(stderr, "gen: %s\n", strata_error());
        return 1;
    }
    config_cpu(&cfg, path);
    if (strata_open(&cfg, &s)) {
        fprintf(stderr, "strata_open %s: %s\n", path, strata_error());
        return 1;
    }
    check_info(s);
    n = check_tokenize(s, ids);
    if (n > 0) {
        check_eval(s, ids, n);
        check_generate(s, ids, n);
        check_route_observer(path, ids, n);
    }
    check_progress(s);
    strata_close(s);
    check_errors(path);
    unlink(path);
    rmdir(tmpdir);
    return test_finish("test_api");
}
