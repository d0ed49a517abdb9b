/* cuda backend: the same qwen3moe forward on the GPU against the CPU backend (the reference),
 * on generated `tiny` checkpoints:
 * - prefill logits: f32 within 1e-3 of the largest logit, q4_k_m within 5e-2 (both sides
 *   quantize activations to 8 bits, in different ways); measured errors printed;
 * - greedy decode of 64 tokens: identical on f32; agreement counted on q4_k_m;
 * - CUDA prefill vs CUDA one-token decode steps within 1e-3 (f32);
 * - an 80-token prompt (the tensor-core prefill kernels): f32 within 1e-2 (the prefill
 *   attention rounds Q, K and V to fp16: 3e-5 and 2.9e-3 measured on two prompts), q4_k_m
 *   within 1e-1 of the CPU and of one-token steps.
 * - gpt-oss (tiny, f32 and q8_0 with MXFP4 experts; YaRN rope, biases, sinks, windows of 16
 *   positions, experts on the CPU lane): f32 prefill logits within 1e-3 and greedy identical
 *   for 64 tokens (past the window), q8_0 within 5e-2; prefill vs one-token steps within 1e-3
 *   on a 12- and an 80-token prompt (the attention's float kernel either way).
 * - qwen3next and qwen35moe (tiny, f32 and q8_0: Gated DeltaNet layers with their state on the
 *   device, gated attention with partial rope, the shared expert): f32 prefill logits within
 *   1e-3 and greedy identical for 64 tokens on a 12- and an 80-token prompt (the 80 take the
 *   chunked delta rule, the CPU the recurrent one), q8_0 within 5e-2; prefill vs one-token
 *   steps within 1e-3 on a 12- and an 80-token prompt.
 * - one-token steps replayed from a CUDA graph equal the same steps launched one by one, bit
 *   for bit (tiny qwen3moe f32 and q4_k_m, gpt-oss q8_0, qwen3next and qwen35moe q8_0, and the
 *   shipped default model).
 * The prompt comes from a fixed seed (STRATA_TEST_SEED replaces it), so a run is repeatable.
 * Exits 77 without a GPU. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "errors.h"
#include "gen.h"
#include "model.h"
#include "sampler.h"
#include "stream.h"
#include "testutil.h"

#define N_PROMPT 12
#define N_GREEDY 64
#define N_LONG 80         /* >= CUDA_MATMUL_GEMM_MIN_M and CUDA_MOE_MMA_MIN_TOK */
#define TOL_LONG_Q4 1e-1 /* q4_k_m with a long prompt: bf16 prefill against 8-bit activations */
#define TOL_LONG_F32 1e-2 /* f32 with a long prompt: fp16 tensor-core attention */

static char tmpdir[] = "/tmp/strata-test-cuda-backend-XXXXXX";

struct engine {
    struct model *m;
    struct backend *b;
    struct stream *s;
};

/* cuda: 0 the CPU backend, 1 CUDA, 2 CUDA with one-token steps replayed from a graph */
static int engine_open(struct engine *e, const char *path, int cuda)
{
    struct backend_cpu_config bc = {.n_threads = 2};
    struct backend_cuda_config cc = {.device = 0, .graph = cuda == 2};
    memset(e, 0, sizeof(*e));
    if (model_open(path, &e->m) ||
        (cuda ? backend_cuda_open(e->m, &cc, &e->b) : backend_cpu_open(e->m, &bc, &e->b)) ||
        stream_open(e->b, 256, 64, &e->s)) {
        fprintf(stderr, "engine_open %s (%s): %s\n", path, cuda ? "cuda" : "cpu", err_msg());
        return -1;
    }
    return 0;
}

static void engine_close(struct engine *e)
{
    stream_close(e->s);
    backend_close(e->b);
    model_close(e->m);
}

/* Greedy ids after the prompt; logits of the prompt in first_logits. */
static int greedy(struct engine *e, const int32_t *prompt, int n_prompt, int32_t *ids,
                  float *first_logits)
{
    int nv = (int)e->m->hp.n_vocab;
    float *l = malloc(sizeof(float) * nv);
    int rc = stream_eval(e->s, prompt, n_prompt, l);
    if (!rc)
        memcpy(first_logits, l, sizeof(float) * nv);
    for (int i = 0; !rc && i < N_GREEDY; i++) {
        ids[i] = sampler_argmax(l, nv);
        rc = stream_eval(e->s, &ids[i], 1, l);
    }
    free(l);
    return rc;
}

static void compare(const char *path, double tol, int require_greedy, const int32_t *prompt,
                    int n_prompt)
{
    struct engine cpu, gpu;
    if (engine_open(&cpu, path, 0) || engine_open(&gpu, path, 1)) {
        CHECK(0, "%s: cannot open both engines", path);
        return;
    }
    int nv = (int)cpu.m->hp.n_vocab;
    float *lc = malloc(sizeof(float) * nv), *lg = malloc(sizeof(float) * nv);
    int32_t ic[N_GREEDY], ig[N_GREEDY];
    test_poison_f32(lg, nv);
    CHECK(greedy(&cpu, prompt, n_prompt, ic, lc) == 0, "cpu: %s", err_msg());
    CHECK(greedy(&gpu, prompt, n_prompt, ig, lg) == 0, "cuda: %s", err_msg());
    double err = test_max_rel_err(lg, lc, nv);
    int same = 0;
    while (same < N_GREEDY && ic[same] == ig[same])
        same++;
    printf("%s, %d-token prompt: cuda vs cpu prefill logits max rel err %.3g (tol %.g); greedy "
           "identical for %d of %d tokens\n",
           path, n_prompt, err, tol, same, N_GREEDY);
    CHECK(err <= tol, "%s: cuda logits differ from cpu: %g > %g", path, err, tol);
    if (require_greedy)
        CHECK(same == N_GREEDY, "%s: greedy tokens diverge at step %d (cpu %d, cuda %d)", path,
              same, same < N_GREEDY ? ic[same] : -1, same < N_GREEDY ? ig[same] : -1);
    free(lc);
    free(lg);
    engine_close(&cpu);
    engine_close(&gpu);
}

static void prefill_vs_decode(const char *path, const int32_t *prompt, int n_prompt, double tol)
{
    struct engine a, b;
    if (engine_open(&a, path, 1) || engine_open(&b, path, 1)) {
        CHECK(0, "%s: cannot open", path);
        return;
    }
    int nv = (int)a.m->hp.n_vocab;
    float *la = malloc(sizeof(float) * nv), *lb = malloc(sizeof(float) * nv);
    CHECK(stream_eval(a.s, prompt, n_prompt, la) == 0, "prefill: %s", err_msg());
    for (int i = 0; i < n_prompt; i++)
        CHECK(stream_eval(b.s, &prompt[i], 1, lb) == 0, "decode: %s", err_msg());
    double err = test_max_rel_err(la, lb, nv);
    printf("%s, %d-token prompt: cuda prefill vs decode max rel err %.3g (tol %.g)\n", path,
           n_prompt, err, tol);
    CHECK(err <= tol, "%s: cuda prefill vs decode: %g", path, err);
    free(la);
    free(lb);
    engine_close(&a);
    engine_close(&b);
}

/* One-token steps replayed from a CUDA graph (its kernel-to-kernel edges programmatic on
 * compute capability 9.0 and later: cuda_mem.h) against the same steps launched one by one:
 * the same kernels on the same data, so every step's logits are equal bit for bit. */
static void graph_vs_eager(const char *path, const int32_t *prompt, int n_prompt)
{
    struct engine a, b;
    if (engine_open(&a, path, 1) || engine_open(&b, path, 2)) {
        CHECK(0, "%s: cannot open", path);
        return;
    }
    int nv = (int)a.m->hp.n_vocab, differ = -1;
    float *la = malloc(sizeof(float) * nv), *lb = malloc(sizeof(float) * nv);
    CHECK(stream_eval(a.s, prompt, n_prompt, la) == 0, "eager prefill: %s", err_msg());
    CHECK(stream_eval(b.s, prompt, n_prompt, lb) == 0, "graph prefill: %s", err_msg());
    for (int i = 0; i < N_GREEDY && differ < 0; i++) {
        int32_t id = sampler_argmax(la, nv);
        test_poison_f32(lb, nv);
        CHECK(stream_eval(a.s, &id, 1, la) == 0, "eager step: %s", err_msg());
        CHECK(stream_eval(b.s, &id, 1, lb) == 0, "graph step: %s", err_msg());
        if (memcmp(la, lb, sizeof(float) * nv) != 0)
            differ = i;
    }
    printf("%s: %d graph-replayed steps %s the eager steps' logits\n", path, N_GREEDY,
           differ < 0 ? "equal" : "differ from");
    CHECK(differ < 0, "%s: graph logits differ from eager at step %d", path, differ);
    free(la);
    free(lb);
    engine_close(&a);
    engine_close(&b);
}

static int gen_tiny(const char *arch, enum quant_mix mix, char *path, size_t size)
{
    struct gen_config cfg = {0};
    snprintf(path, size, "%s/tiny-%s-%s.gguf", tmpdir, arch, quant_mix_name(mix));
    cfg.arch = arch;
    cfg.preset = *gen_preset_find_arch(arch, "tiny");
    cfg.mix = mix;
    cfg.seed = 11;
    cfg.n_threads = 2;
    cfg.out_path = path;
    return gen_file_write(&cfg, NULL);
}

int main(void)
{
    char f32[512], q4[512], oss[512], oss8[512], hy[2][2][512];
    const char *hybrid[2] = {"qwen3next", "qwen35moe"};
    int32_t prompt[N_LONG];
    struct rng r;

    if (!test_gpu_available("test_cuda_backend"))
        return TEST_SKIP;
    const char *seed = getenv("STRATA_TEST_SEED");
    rng_seed(&r, seed ? strtoull(seed, NULL, 0) : 2026, 5);
    if (!mkdtemp(tmpdir) || gen_tiny("qwen3moe", QUANT_MIX_F32, f32, sizeof(f32)) ||
        gen_tiny("qwen3moe", QUANT_MIX_Q4_K_M, q4, sizeof(q4)) ||
        gen_tiny("gpt-oss", QUANT_MIX_F32, oss, sizeof(oss)) ||
        gen_tiny("gpt-oss", QUANT_MIX_Q8_0, oss8, sizeof(oss8)) ||
        gen_tiny(hybrid[0], QUANT_MIX_F32, hy[0][0], sizeof(hy[0][0])) ||
        gen_tiny(hybrid[0], QUANT_MIX_Q8_0, hy[0][1], sizeof(hy[0][1])) ||
        gen_tiny(hybrid[1], QUANT_MIX_F32, hy[1][0], sizeof(hy[1][0])) ||
        gen_tiny(hybrid[1], QUANT_MIX_Q8_0, hy[1][1], sizeof(hy[1][1]))) {
        fprintf(stderr, "setup: %s\n", err_msg());
        return 1;
    }
    for (int i = 0; i < N_LONG; i++)
        prompt[i] = (int32_t)rng_below(&r, 1000);
    compare(f32, 1e-3, 1, prompt, N_PROMPT);
    compare(q4, 5e-2, 0, prompt, N_PROMPT);
    prefill_vs_decode(f32, prompt, N_PROMPT, 1e-3);
    /* a prompt long enough for the tensor-core prefill (bf16 GEMMs and MoE tiles) against the
     * CPU and against one-token steps (8-bit activation codes on Q4_K/Q6_K) */
    compare(f32, TOL_LONG_F32, 1, prompt, N_LONG);
    compare(q4, TOL_LONG_Q4, 0, prompt, N_LONG);
    prefill_vs_decode(q4, prompt, N_LONG, TOL_LONG_Q4);
    graph_vs_eager(f32, prompt, N_PROMPT);
    graph_vs_eager(q4, prompt, N_PROMPT);
    compare(oss, 1e-3, 1, prompt, N_PROMPT);
    compare(oss8, 5e-2, 0, prompt, N_PROMPT);
    graph_vs_eager(oss8, prompt, N_PROMPT);
    prefill_vs_decode(oss, prompt, N_PROMPT, 1e-3);
    prefill_vs_decode(oss, prompt, N_LONG, 1e-3);
    for (int a = 0; a < 2; a++) {
        compare(hy[a][0], 1e-3, 1, prompt, N_PROMPT);
        compare(hy[a][0], 1e-3, 1, prompt, N_LONG);
        compare(hy[a][1], 5e-2, 0, prompt, N_PROMPT);
        prefill_vs_decode(hy[a][0], prompt, N_PROMPT, 1e-3);
        prefill_vs_decode(hy[a][0], prompt, N_LONG, 1e-3);
        graph_vs_eager(hy[a][1], prompt, N_PROMPT);
        unlink(hy[a][0]);
        unlink(hy[a][1]);
    }
    char def[512];
    test_data_path(def, sizeof(def), "../../models/strata-default.gguf");
    if (access(def, R_OK) == 0)
        graph_vs_eager(def, prompt, N_PROMPT);
    unlink(f32);
    unlink(q4);
    unlink(oss);
    unlink(oss8);
    rmdir(tmpdir);
    return test_finish("test_cuda_backend");
}
