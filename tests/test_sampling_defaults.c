/* test_sampling_defaults: a model file's own sampling defaults (general.sampling.* keys, as
 * llama.cpp's GGUF writer names them). strata_sampling_from_model reads each key that is
 * present, of a number type and in the range the CLI flag takes, and reports which; it ignores
 * the rest and never touches the seed. strata run takes them for the flags not given (its
 * --verbose line), a flag given wins, and the seed is random unless -s gives it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "errors.h"
#include "gen.h"
#include "gguf.h"
#include "quant_mix.h"
#include "strata.h"
#include "testutil.h"

#define NAME "test_sampling_defaults"

static char tmpdir[64];

struct key {
    const char *name;
    enum gguf_value_type type; /* FLOAT32, UINT32 or STRING */
    double v;
};

struct keys {
    const struct key *k;
    int n;
};

static int add_keys(void *ctx, struct gguf_writer *w)
{
    const struct keys *ks = ctx;
    int rc = 0;
    for (int i = 0; !rc && i < ks->n; i++) {
        const struct key *k = &ks->k[i];
        rc = k->type == GGUF_TYPE_FLOAT32  ? gguf_writer_add_f32(w, k->name, (float)k->v)
             : k->type == GGUF_TYPE_UINT32 ? gguf_writer_add_u32(w, k->name, (uint32_t)k->v)
                                           : gguf_writer_add_str(w, k->name, "0.5");
    }
    return rc;
}

/* Copies src to dst with the keys added. 0 or -errno. */
static int with_keys(const char *src, const char *dst, const struct key *k, int n)
{
    struct keys ks = {k, n};
    return test_gguf_rewrite(src, dst, &(struct test_rewrite){.ctx = &ks, .add_kvs = add_keys});
}

/* The sampling settings strata_sampling_from_model leaves for path, and its mask. */
static unsigned from_model(const char *path, struct strata_sampling *p)
{
    struct strata_config cfg;
    struct strata *s = NULL;
    strata_config_init(&cfg);
    cfg.model_path = path;
    cfg.device = STRATA_DEVICE_CPU;
    cfg.n_threads = 1;
    strata_sampling_init(p);
    p->seed = 77;
    int rc = strata_open(&cfg, &s);
    CHECK(rc == 0, "strata_open %s: %s", path, strata_error());
    unsigned set = rc ? 0 : strata_sampling_from_model(s, p);
    strata_close(s);
    return set;
}

/* strata run's stderr for args (a shell fragment) on model path, into buf. */
static void run_cli(const char *path, const char *args, char *buf, size_t size)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s run -m %s -p hi -n 2 -t 1 --verbose %s 2>&1 >/dev/null",
             STRATA_BINARY, path, args);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(buf, 1, size - 1, p) : 0;
    buf[n] = 0;
    CHECK(p && pclose(p) == 0, "%s failed: %s", cmd, buf);
}

int main(void)
{
    char base[256], good[300], bad[300], out[8192];
    const struct gen_preset *pr = gen_preset_find("tiny");
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/strata-sampling-XXXXXX");
    if (!pr || !mkdtemp(tmpdir))
        return 1;
    int rc = test_gen_model(pr, QUANT_MIX_F32, 1, tmpdir, "tiny", base, sizeof(base));
    CHECK(rc == 0, "gen: %s", err_msg());
    if (rc)
        return test_finish(NAME);

    struct strata_sampling d, p;
    strata_sampling_init(&d);
    unsigned set = from_model(base, &p);
    CHECK(set == 0 && p.temperature == d.temperature && p.top_k == d.top_k &&
              p.repeat_penalty == d.repeat_penalty && p.seed == 77,
          "a file without the keys changed the settings (mask %#x)", set);

    const struct key all[] = {
        {"general.sampling.temp", GGUF_TYPE_FLOAT32, 0.3},
        {"general.sampling.top_k", GGUF_TYPE_UINT32, 7},
        {"general.sampling.top_p", GGUF_TYPE_FLOAT32, 0.5},
        {"general.sampling.min_p", GGUF_TYPE_FLOAT32, 0.2},
        {"general.sampling.penalty_repeat", GGUF_TYPE_FLOAT32, 1.25},
        {"general.sampling.penalty_last_n", GGUF_TYPE_UINT32, 32},
    };
    snprintf(good, sizeof(good), "%s/good.gguf", tmpdir);
    CHECK(with_keys(base, good, all, 6) == 0, "writing %s: %s", good, err_msg());
    set = from_model(good, &p);
    CHECK(set == 0x3f && p.temperature == 0.3f && p.top_k == 7 && p.top_p == 0.5f &&
              p.min_p == 0.2f && p.repeat_penalty == 1.25f && p.repeat_last_n == 32 && p.seed == 77,
          "every key: mask %#x, temp %g top-k %d top-p %g min-p %g penalty %g last-n %d seed "
          "%llu",
          set, p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty, p.repeat_last_n,
          (unsigned long long)p.seed);
    printf("  every key read: temp %.2f, top-k %d, top-p %.2f, min-p %.2f, penalty %.2f, "
           "last-n %d\n",
           p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty, p.repeat_last_n);

    const struct key wrong[] = {
        {"general.sampling.temp", GGUF_TYPE_FLOAT32, -1},          /* below the range */
        {"general.sampling.top_p", GGUF_TYPE_FLOAT32, 2},          /* above it */
        {"general.sampling.top_k", GGUF_TYPE_STRING, 0},           /* not a number */
        {"general.sampling.penalty_repeat", GGUF_TYPE_FLOAT32, 0}, /* below 0.01 */
        {"general.sampling.min_p", GGUF_TYPE_FLOAT32, 0.1},        /* the one that holds */
    };
    snprintf(bad, sizeof(bad), "%s/bad.gguf", tmpdir);
    CHECK(with_keys(base, bad, wrong, 5) == 0, "writing %s: %s", bad, err_msg());
    set = from_model(bad, &p);
    CHECK(set == STRATA_SAMPLING_MIN_P && p.min_p == 0.1f && p.temperature == d.temperature &&
              p.top_p == d.top_p && p.top_k == d.top_k && p.repeat_penalty == d.repeat_penalty,
          "keys out of range or of the wrong type: mask %#x", set);
    printf("  out of range or not a number: ignored (mask %#x)\n", set);

    /* the CLI: the file's keys for the flags not given, the flags given win */
    run_cli(good, "", out, sizeof(out));
    CHECK(strstr(out, "sampling defaults from the model file: temp 0.30, top-k 7, top-p 0.50, "
                      "min-p 0.20, repeat-penalty 1.25, repeat-last-n 32") != NULL,
          "run without flags:\n%s", out);
    run_cli(good, "--temp 0.9 --top-k 3 -s 5", out, sizeof(out));
    CHECK(strstr(out, "temp 0.90, top-k 3, top-p 0.50") && strstr(out, "sampling seed 5\n"),
          "run with --temp 0.9 --top-k 3 -s 5:\n%s", out);
    /* two runs without -s draw different seeds (a 64-bit draw twice the same: 2^-64) */
    char seed1[64] = "", seed2[64] = "";
    run_cli(base, "", out, sizeof(out));
    const char *at = strstr(out, "sampling seed ");
    if (at)
        sscanf(at, "sampling seed %63s", seed1);
    run_cli(base, "", out, sizeof(out));
    at = strstr(out, "sampling seed ");
    if (at)
        sscanf(at, "sampling seed %63s", seed2);
    CHECK(*seed1 && *seed2 && strcmp(seed1, seed2), "seeds without -s: '%s', '%s'", seed1, seed2);
    printf("  strata run: flags over the file's keys; seeds without -s %s, %s\n", seed1, seed2);

    unlink(good), unlink(bad), unlink(base);
    rmdir(tmpdir);
    return test_finish(NAME);
}
