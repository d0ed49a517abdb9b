/* test_hf_ref: the CPU engine against Hugging Face transformers, without a GPU or Python.
 *
 * tests/data/hf-ref/ is written by tests/hf/compare_qwen3moe.py (its ci-ref/ output; see
 * docs/hf-reference.md), hf-ref-qwen3next/ and hf-ref-qwen35moe/ by compare_qwen3next.py and
 * hf-ref-gptoss/ by compare_gptoss.py. Each holds a tiny random-weight checkpoint (hf/:
 * config.json, model.safetensors, tokenizer files), its strata f32 GGUF (model.gguf), and, for a
 * few prompts, transformers' float32 greedy tokens and its logits after the prompt and after each
 * greedy token (logits.bin, described by ref.json, which also names the versions used).
 *
 * Checks: every logits block within TOL (max |strata - hf| / max |hf|) of transformers', with
 * transformers' tokens fed back so every block is at the same positions; strata's argmax equal
 * to transformers' greedy token at every step, except at a near-tie (transformers' gap between
 * the two tokens within twice the measured error), reported; the prompt text tokenized by
 * strata equal to the ids `tokenizers` gave; and converting hf/ again gives the same tensor
 * bytes as model.gguf. Exit 77 when every folder is absent.
 */
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <json-c/json.h>

#include "backend.h"
#include "convert.h"
#include "errors.h"
#include "gguf.h"
#include "model.h"
#include "stream.h"
#include "testutil.h"
#include "tokenizer.h"

#define NAME "test_hf_ref"
#define TOL 1e-3 /* the f32 criterion of tests/hf/compare_qwen3moe.py */
#define MAX_IDS 4096

struct ref_case {
    const char *text;
    int32_t ids[MAX_IDS];
    int n_ids;
    int32_t greedy[MAX_IDS];
    int n_greedy;
    size_t block0;
};

static int json_ids(json_object *arr, int32_t *out, int cap)
{
    if (!arr || !json_object_is_type(arr, json_type_array) ||
        (int)json_object_array_length(arr) > cap)
        return -1;
    int n = (int)json_object_array_length(arr);
    for (int i = 0; i < n; i++)
        out[i] = (int32_t)json_object_get_int(json_object_array_get_idx(arr, i));
    return n;
}

static json_object *member(json_object *o, const char *key)
{
    json_object *v = NULL;
    return json_object_object_get_ex(o, key, &v) ? v : NULL;
}

static int32_t argmax(const float *x, uint32_t n)
{
    int32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = (int32_t)i;
    return best;
}

static double max_abs(const float *a, const float *b, uint32_t n)
{
    double m = 0;
    for (uint32_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        m = d > m || isnan(d) ? d : m;
    }
    return m;
}

/* Runs one case; returns the largest relative error seen. */
static double check_case(struct stream *s, const struct model *m, const struct ref_case *c,
                         const float *ref, uint32_t nv, int idx, int *near_ties)
{
    float *lg = malloc(nv * sizeof(float));
    double worst = 0;

    stream_truncate(s, 0);
    test_poison_f32(lg, nv);
    int rc = stream_eval(s, c->ids, c->n_ids, lg);
    CHECK(rc == 0, "case %d: eval: %s", idx, err_msg());
    for (int i = 0; !rc && i <= c->n_greedy; i++) {
        const float *r = ref + (c->block0 + (size_t)i) * nv;
        double e = test_max_rel_err(lg, r, nv);
        worst = e > worst || isnan(e) ? e : worst;
        CHECK(e <= TOL, "case %d block %d: max rel err %g > %g", idx, i, e, TOL);
        if (i == c->n_greedy)
            break;
        int32_t mine = argmax(lg, nv), theirs = c->greedy[i];
        if (mine != theirs) {
            double gap = (double)r[theirs] - r[mine];
            bool tie = gap <= 2 * max_abs(lg, r, nv);
            printf("  case %d step %d: strata picks %d, transformers %d (gap %.3g): %s\n", idx, i,
                   mine, theirs, gap, tie ? "near-tie" : "MISMATCH");
            CHECK(tie, "case %d step %d: greedy token %d, transformers %d", idx, i, mine, theirs);
            *near_ties += tie;
        }
        /* feed transformers' token so that the next block is at the same positions */
        rc = stream_eval(s, &theirs, 1, lg);
        CHECK(rc == 0, "case %d step %d: eval: %s", idx, i, err_msg());
    }
    if (m->tok && c->text) {
        int32_t ids[MAX_IDS];
        int n = tokenizer_encode(m->tok, c->text, strlen(c->text),
                                 TOKENIZER_ENCODE_PARSE_SPECIAL | TOKENIZER_ENCODE_ADD_SPECIAL, ids,
                                 MAX_IDS);
        CHECK(n == c->n_ids && !memcmp(ids, c->ids, sizeof(int32_t) * (size_t)n),
              "case %d: strata tokenizes '%s' into %d ids, tokenizers gave %d", idx, c->text, n,
              c->n_ids);
    }
    free(lg);
    return worst;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

/* Converting hf/ again must give model.gguf's tensors, byte for byte. */
static void check_reconvert(const char *dir, const char *gguf_path)
{
    char hf[600], tmpdir[] = "/tmp/strata-test-hf-ref-XXXXXX", out[600];
    snprintf(hf, sizeof(hf), "%s/hf", dir);
    if (access(hf, R_OK) != 0) {
        printf("  no hf/ directory: reconversion not checked\n");
        return;
    }
    if (!mkdtemp(tmpdir))
        return;
    snprintf(out, sizeof(out), "%s/re.gguf", tmpdir);
    struct convert_config cfg = {.hf_dir = hf, .out_path = out, .mix = QUANT_MIX_F32};
    int rc = convert_run(&cfg, NULL);
    CHECK(rc == 0, "converting %s: %s", hf, err_msg());
    struct gguf_file *a = NULL, *b = NULL;
    if (!rc && !gguf_open(gguf_path, &a) && !gguf_open(out, &b)) {
        uint64_t same = 0;
        CHECK(a->n_tensors == b->n_tensors, "tensor counts %llu vs %llu",
              (unsigned long long)a->n_tensors, (unsigned long long)b->n_tensors);
        for (uint64_t i = 0; i < a->n_tensors; i++) {
            const struct gguf_tensor *x = &a->tensors[i];
            const struct gguf_tensor *y = gguf_find_tensor(b, x->name);
            bool eq = y && y->type == x->type && y->size == x->size &&
                      !memcmp(x->ne, y->ne, sizeof(x->ne)) && !memcmp(x->data, y->data, x->size);
            CHECK(eq, "tensor %s differs after reconversion", x->name);
            same += eq;
        }
        printf("  reconverting hf/: %llu/%llu tensors byte-identical to model.gguf\n",
               (unsigned long long)same, (unsigned long long)a->n_tensors);
    }
    gguf_close(a);
    gguf_close(b);
    nftw(tmpdir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

/* One reference folder of tests/data; 0 when absent (skipped). */
static int check_dir(const char *name)
{
    char dir[512], path[600];
    test_data_path(dir, sizeof(dir), name);
    snprintf(path, sizeof(path), "%s/ref.json", dir);
    if (access(path, R_OK) != 0) {
        printf("%s: %s absent (written by tests/hf/compare_*.py): skipped\n", NAME, path);
        return 0;
    }
    json_object *root = json_object_from_file(path);
    CHECK(root != NULL, "%s: %s", path, json_util_get_last_err());
    if (!root)
        return 1;
    json_object *cases = member(root, "cases"), *refv = member(root, "reference");
    uint32_t nv = (uint32_t)json_object_get_int(member(root, "n_vocab"));
    int n_cases = cases ? (int)json_object_array_length(cases) : 0;
    printf("%s: %s: reference %s, %d cases, vocab %u\n", NAME, name,
           refv ? json_object_get_string(refv) : "?", n_cases, nv);
    /* the reference logits */
    snprintf(path, sizeof(path), "%s/%s", dir, json_object_get_string(member(root, "logits")));
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "%s: %s", path, strerror(errno));
    float *ref = NULL;
    size_t n_floats = 0;
    if (f) {
        fseek(f, 0, SEEK_END);
        n_floats = (size_t)ftell(f) / sizeof(float);
        fseek(f, 0, SEEK_SET);
        ref = malloc(n_floats * sizeof(float));
        CHECK(fread(ref, sizeof(float), n_floats, f) == n_floats, "reading %s", path);
        fclose(f);
    }

    snprintf(path, sizeof(path), "%s/%s", dir, json_object_get_string(member(root, "model")));
    struct model *m = NULL;
    struct backend *b = NULL;
    struct stream *s = NULL;
    struct backend_cpu_config bc = {0};
    int rc = model_open(path, &m);
    CHECK(rc == 0, "model_open %s: %s", path, err_msg());
    if (!rc) {
        CHECK(m->hp.n_vocab == nv, "model vocab %u, reference %u", m->hp.n_vocab, nv);
        rc = backend_cpu_open(m, &bc, &b);
        rc = rc ? rc : stream_open(b, 2 * MAX_IDS, 64, &s);
        CHECK(rc == 0, "engine: %s", err_msg());
    }
    double worst = 0;
    int near_ties = 0;
    struct ref_case *c = malloc(sizeof(*c));
    for (int i = 0; !rc && ref && m->hp.n_vocab == nv && i < n_cases; i++) {
        json_object *jc = json_object_array_get_idx(cases, i);
        c->text = json_object_get_string(member(jc, "text"));
        c->n_ids = json_ids(member(jc, "ids"), c->ids, MAX_IDS);
        c->n_greedy = json_ids(member(jc, "greedy"), c->greedy, MAX_IDS);
        c->block0 = (size_t)json_object_get_int64(member(jc, "block0"));
        bool ok = c->n_ids > 0 && c->n_greedy >= 0 &&
                  (c->block0 + (size_t)c->n_greedy + 1) * nv <= n_floats;
        CHECK(ok, "case %d: malformed ids/greedy/block0, or logits.bin too short", i);
        if (!ok)
            continue;
        double e = check_case(s, m, c, ref, nv, i, &near_ties);
        printf("  case %d: %d prompt ids, %d greedy tokens: max rel err %.3g\n", i, c->n_ids,
               c->n_greedy, e);
        worst = e > worst ? e : worst;
    }
    printf("  worst max rel err %.3g (tolerance %g), %d near-tie(s)\n", worst, TOL, near_ties);
    free(c);
    stream_close(s);
    backend_close(b);
    model_close(m);
    check_reconvert(dir, path);
    free(ref);
    json_object_put(root);
    return 1;
}

int main(void)
{
    /* qwen3moe (compare_qwen3moe.py), qwen3next and qwen35moe (compare_qwen3next.py), gpt-oss
     * (compare_gptoss.py) */
    const char *dirs[] = {"hf-ref", "hf-ref-qwen3next", "hf-ref-qwen35moe", "hf-ref-gptoss"};
    int found = 0;
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
        found += check_dir(dirs[i]);
    if (!found)
        return TEST_SKIP;
    return test_finish(NAME);
}
