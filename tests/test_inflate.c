/* gen_inflate: a generated small model grown to larger per-layer shapes (wider hidden size,
 * more and wider heads, wider expert FFN) keeps its function: the top-k experts of every
 * (token, layer) pair agree on >= 95% (measured figure printed; f32 target) and the final
 * logits stay close; a q8_0 target is reported. Incompatible targets are refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "errors.h"
#include "gen.h"
#include "model.h"
#include "stream.h"
#include "testutil.h"

#define N_TOK 48

static char tmpdir[] = "/tmp/strata-test-inflate-XXXXXX";

struct routes {
    int n_layer, k;
    int32_t ids[8][N_TOK][8]; /* (layer, token, k) */
};

static void observe(void *ctx, const struct moe_route_event *ev)
{
    struct routes *r = ctx;
    for (int t = 0; t < ev->n_tok; t++)
        memcpy(r->ids[ev->layer][ev->pos0 + t], ev->ids + (size_t)t * ev->k,
               sizeof(int32_t) * (size_t)ev->k);
}

/* Runs the prompt; fills the routes and the last logits. */
static int run(const char *path, const int32_t *prompt, struct routes *r, float **logits, int *nv)
{
    struct model *m = NULL;
    struct backend *b = NULL;
    struct stream *s = NULL;
    struct backend_cpu_config bc = {.n_threads = 2, .route_observer = observe, .route_ctx = r};
    int rc = model_open(path, &m);
    rc = rc ? rc : backend_cpu_open(m, &bc, &b);
    rc = rc ? rc : stream_open(b, N_TOK, N_TOK, &s);
    if (!rc) {
        r->n_layer = (int)m->hp.n_layer;
        r->k = (int)m->hp.n_expert_used;
        *nv = (int)m->hp.n_vocab;
        *logits = malloc(sizeof(float) * (size_t)*nv);
        rc = stream_eval(s, prompt, N_TOK, *logits);
    }
    stream_close(s);
    backend_close(b);
    model_close(m);
    return rc;
}

/* Share of (token, layer) pairs whose top-k sets are equal. */
static double agreement(const struct routes *a, const struct routes *b)
{
    int same = 0, total = 0;
    for (int l = 0; l < a->n_layer; l++)
        for (int t = 0; t < N_TOK; t++) {
            int hits = 0;
            for (int i = 0; i < a->k; i++)
                for (int j = 0; j < a->k; j++)
                    hits += a->ids[l][t][i] == b->ids[l][t][j];
            same += hits == a->k;
            total++;
        }
    return (double)same / total;
}

static struct gen_preset small_preset(void)
{
    struct gen_preset p = *gen_preset_find("tiny");
    p.name = NULL;
    p.n_layer = 3;
    p.n_embd = 256;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.head_dim = 32;
    p.n_expert = 16;
    p.n_expert_used = 4;
    p.n_ff_exp = 128;
    return p;
}

int main(void)
{
    char small[512], big[512], big8[512], bad[512];
    struct gen_config gc = {0};
    struct gen_inflate_config ic = {0};
    int32_t prompt[N_TOK];
    struct rng r;
    static struct routes rs, rb, r8;
    float *ls = NULL, *lb = NULL, *l8 = NULL;
    int nv = 0;

    rng_seed(&r, test_seed("test_inflate"), 7);
    if (!mkdtemp(tmpdir))
        return 1;
    snprintf(small, sizeof(small), "%s/small.gguf", tmpdir);
    snprintf(big, sizeof(big), "%s/big.gguf", tmpdir);
    snprintf(big8, sizeof(big8), "%s/big-q8.gguf", tmpdir);
    snprintf(bad, sizeof(bad), "%s/bad.gguf", tmpdir);
    gc.arch = "qwen3moe";
    gc.preset = small_preset();
    gc.mix = QUANT_MIX_F32;
    gc.seed = rng_u64(&r);
    gc.n_threads = 2;
    gc.out_path = small;
    CHECK(gen_file_write(&gc, NULL) == 0, "gen small: %s", err_msg());

    ic.small_path = small;
    ic.target = small_preset();
    ic.target.n_embd = 512;
    ic.target.n_head = 8;
    ic.target.n_head_kv = 4;
    ic.target.head_dim = 64;
    ic.target.n_ff_exp = 256;
    ic.mix = QUANT_MIX_F32;
    ic.seed = 1;
    ic.noise = 1e-3f;
    ic.out_path = big;
    CHECK(gen_inflate(&ic, NULL) == 0, "inflate f32: %s", err_msg());
    ic.mix = QUANT_MIX_Q8_0;
    ic.out_path = big8;
    CHECK(gen_inflate(&ic, NULL) == 0, "inflate q8_0: %s", err_msg());

    for (int i = 0; i < N_TOK; i++)
        prompt[i] = (int32_t)rng_below(&r, 1000);
    CHECK(run(small, prompt, &rs, &ls, &nv) == 0, "run small: %s", err_msg());
    CHECK(run(big, prompt, &rb, &lb, &nv) == 0, "run big: %s", err_msg());
    CHECK(run(big8, prompt, &r8, &l8, &nv) == 0, "run big q8_0: %s", err_msg());
    if (ls && lb && l8) {
        double a = agreement(&rs, &rb), a8 = agreement(&rs, &r8);
        double e = test_max_rel_err(lb, ls, (size_t)nv), e8 = test_max_rel_err(l8, ls, (size_t)nv);
        printf("top-k agreement: f32 %.1f%%, q8_0 %.1f%% of %d (token, layer) pairs; last logits "
               "max rel err f32 %.3g, q8_0 %.3g\n",
               100 * a, 100 * a8, N_TOK * rs.n_layer, e, e8);
        CHECK(a >= 0.95, "f32 inflation changed routing: %.1f%% agreement", 100 * a);
        CHECK(e < 2e-2, "f32 inflation changed the logits: %g", e);
    }

    /* a target with other expert counts, or smaller shapes, is refused and leaves no file */
    ic.target.n_expert = 32;
    ic.out_path = bad;
    CHECK(gen_inflate(&ic, NULL) < 0 && access(bad, F_OK) != 0, "expert count mismatch accepted");
    ic.target = small_preset();
    ic.target.head_dim = 48; /* not a multiple of 32 */
    ic.target.n_head = 4;
    CHECK(gen_inflate(&ic, NULL) < 0, "head dim 48 accepted");
    free(ls);
    free(lb);
    free(l8);
    unlink(small);
    unlink(big);
    unlink(big8);
    rmdir(tmpdir);
    return test_finish("test_inflate");
}
