/* cuda_ops against the CPU references on fresh random data, outputs NaN-poisoned before each
 * run, one line per case with its shape and error:
 *   embed      vs quant_ref_dequantize: bit-exact (every type, random and drawn blocks), and
 *              NaN rows for ids outside the table;
 *   rmsnorm    vs ops_rmsnorm (plain, no weight, in place, fused residual): max rel 2e-6;
 *   rope       vs ops_rope_neox (pos0 and per-token device positions): max rel 2e-6; with
 *              YaRN angles (gpt-oss's settings) vs ops_rope_neox_freq: the same bound;
 *   kv_store   exact copy, rows outside the cache skipped;
 *   qk_rope_store  bit for bit the norms, ropes (plain or YaRN) and stores it fuses;
 *   attention  vs ops_attention: head_dim 64/128/256, GQA 1/4/8, contexts 1..1000, decode
 *              (split-K) and prefill (tiled), host and device positions, in place: max rel 2e-5
 *              (cache rows past the last position are NaN, so reading them fails the case);
 *              calls on the fp16 tensor-core prefill path (cuda_ops.h): max rel 5e-3, with
 *              prefills of 64..300 tokens, GQA 1/4/8, head_dim 64/128 (and 16..256), pos0 0 and
 *              > 0, device positions, split keys; both sides of the path's threshold;
 *              with gpt-oss's attention sinks and sliding windows on the same kernels (decode
 *              of 1 and 2 rows before, at and past the window's edge, keys split; prefills on
 *              the tensor-core path starting past the window, head_dim 16/64/128): the
 *              tolerances above;
 *   add        exact; add_bias exact; argmax: the index of sampler_argmax (ties to the lowest);
 *   topk       vs moe_route_softmax_topk: ids exact (also with tied logits), weights 2e-6 abs;
 *              2..16 rows of one stream at positions 0..1515 (a verify pass): each row bit for
 *              bit the call of that row alone where the decode kernel takes the heads;
 *   graph      a decode step (rope, kv_store, attention with device positions) captured once in
 *              a CUDA graph and replayed at changing positions, vs the CPU step: max rel 2e-5.
 * Replay a failure with STRATA_TEST_SEED. Exits 77 without a GPU. */
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_attention.h"
#include "cuda_check.h"
#include "cuda_matmul.h"
#include "cuda_mem.h"
#include "cuda_ops.h"
#include "moe.h"
#include "ops_cpu.h"
#include "quant.h"
#include "quant_ref.h"
#include "testutil.h"
extern "C" { /* C headers without their own guard */
#include "gen.h"
#include "sampler.h"
}

#define TOL_NORM 2e-6
#define TOL_ROPE 2e-6
#define TOL_ATTN 2e-5
/* The tensor-core prefill rounds Q, K, V and the softmax weights to fp16 (relative error up to
 * 2^-11 each; products and sums in float). A score s moves by about 3e-4 |s|, its weight by as
 * much. A host emulation of the kernel (warp collectives emulated from the PTX fragment layouts)
 * on these inputs (q ~ N(0, qscale^2) with qscale <= 3, k, v ~ N(0, 1), up to 300 x 16 rows)
 * gave max abs error / max |ref| <= 1.3e-3, norm rel ~5e-4. A wrong kernel misses by far more on
 * some row, and the cases have such rows: with pos0 = 0 the first tokens attend 1, 2, 3 keys, so
 * a mask off by one key moves them by ~|v| (emulated: 0.3..1.4 of max |ref|); a wrong head
 * (n_kv >= 2) or token mapping reads unrelated rows (~1); a lost rescale or a lost last partial
 * tile 0.2..1; even a 4% error in the score scale gives 0.02..0.09. */
#define TOL_ATTN_TC 5e-3
#define TOL_TOPK_W 2e-6

static const char *NAME = "test_cuda_ops";

/* ---- host/device helpers ------------------------------------------------------------------ */

static void fatal(const char *what)
{
    fprintf(stderr, "%s: %s failed\n", NAME, what);
    exit(1);
}

/* Replaces an all-ones exponent (inf/NaN) of the f16 at p with a finite one. */
static void f16_sanitize(uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    if (((h >> 10) & 0x1f) == 0x1f)
        h &= ~0x4000;
    memcpy(p, &h, 2);
}

/* Random bytes for n_rows rows of type with every float field finite: every code and scale
 * bit pattern gets exercised. */
static void rows_random_bytes(struct rng *r, uint32_t type, uint8_t *dst, int64_t n_rows, int64_t n,
                              uint64_t row_bytes)
{
    const struct quant_type_info *ti = quant_type_find(type);
    for (uint64_t i = 0; i < (uint64_t)n_rows * row_bytes; i++)
        dst[i] = (uint8_t)rng_u32(r);
    for (int64_t row = 0; row < n_rows; row++) {
        uint8_t *p = dst + row * row_bytes;
        for (int64_t b = 0; b < n / ti->block; b++) {
            uint8_t *blk = p + b * ti->bytes;
            switch (type) {
            case QUANT_F32:
                blk[3] &= ((blk[3] & 0x7f) == 0x7f && (blk[2] & 0x80)) ? 0xbf : 0xff;
                break;
            case QUANT_F16:
                f16_sanitize(blk);
                break;
            case QUANT_BF16:
                blk[1] &= ((blk[1] & 0x7f) == 0x7f && (blk[0] & 0x80)) ? 0xbf : 0xff;
                break;
            case QUANT_Q4_0:
            case QUANT_Q8_0:
                f16_sanitize(blk);
                break;
            case QUANT_Q4_K:
            case QUANT_Q5_K:
                f16_sanitize(blk), f16_sanitize(blk + 2);
                break;
            case QUANT_Q6_K:
                f16_sanitize(blk + 208);
                break;
            default:
                break; /* MXFP4: every byte pattern is finite or inf, never NaN */
            }
        }
    }
}

/* Valid weights ~ N(0, std^2): gen_blocks_draw's direct code draws where it supports the type
 * (and `draw`), else quant_ref_quantize of normals. */
static void rows_draw(struct rng *r, uint32_t type, uint8_t *dst, int64_t n_rows, int64_t n,
                      uint64_t row_bytes, float std, bool draw)
{
    float *x = (float *)test_xmalloc(sizeof(float) * n);
    for (int64_t row = 0; row < n_rows; row++) {
        uint8_t *p = dst + row * row_bytes;
        if (draw && gen_blocks_can_draw(type)) {
            if (gen_blocks_draw(type, p, (uint64_t)n, 0.0f, std, r))
                fatal("gen_blocks_draw");
            continue;
        }
        for (int64_t i = 0; i < n; i++)
            x[i] = std * rng_normal(r);
        if (quant_ref_quantize(type, x, p, n))
            fatal("quant_ref_quantize");
    }
    free(x);
}

/* Number of float elements whose bits differ. */
static size_t bits_differ(const float *a, const float *b, size_t n, size_t *first)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(a + i, b + i, sizeof(float))) {
            if (!bad)
                *first = i;
            bad++;
        }
    }
    return bad;
}

/* ---- embed -------------------------------------------------------------------------------- */

static void test_embed(struct rng *r)
{
    static const uint32_t types[] = {QUANT_F32,   QUANT_F16,  QUANT_BF16, QUANT_Q4_0, QUANT_Q8_0,
                                     QUANT_MXFP4, QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K};
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        uint32_t type = types[ti];
        int64_t blk = quant_type_find(type)->block;
        const int64_t *dims;
        static const int64_t d_k[] = {256, 768, 2048, 0}, d_32[] = {96, 2880, 4096, 0},
                             d_f[] = {8, 200, 1024, 0};
        dims = blk == 256 ? d_k : blk == 32 ? d_32 : d_f;
        for (int di = 0; dims[di]; di++) {
            for (int variant = 0; variant < 2; variant++) {
                int64_t n_embd = dims[di], n_vocab = 20 + rng_below(r, 200);
                int n = 1 + (int)rng_below(r, 40);
                uint64_t rb = test_row_bytes(type, n_embd), row_bytes = rb + 16 * variant;
                uint8_t *table = (uint8_t *)test_xmalloc(row_bytes * n_vocab);
                if (variant == 0)
                    rows_random_bytes(r, type, table, n_vocab, n_embd, row_bytes);
                else
                    rows_draw(r, type, table, n_vocab, n_embd, row_bytes, 1.0f, rng_below(r, 2));
                int32_t *ids = (int32_t *)test_xmalloc(sizeof(int32_t) * n);
                for (int i = 0; i < n; i++)
                    ids[i] = (int32_t)rng_below(r, (uint32_t)n_vocab);
                int bad_row = n > 2 ? (int)rng_below(r, (uint32_t)n) : -1;
                if (bad_row >= 0)
                    ids[bad_row] = rng_below(r, 2) ? (int32_t)n_vocab : -1;
                float *ref = (float *)test_xmalloc(sizeof(float) * n * n_embd);
                float *got = (float *)test_xmalloc(sizeof(float) * n * n_embd);
                for (int i = 0; i < n; i++)
                    if (i != bad_row &&
                        quant_ref_dequantize(type, table + (uint64_t)ids[i] * row_bytes,
                                             ref + (int64_t)i * n_embd, n_embd))
                        fatal("quant_ref_dequantize");
                void *d_table = test_dev_dup(table, row_bytes * n_vocab);
                int32_t *d_ids = (int32_t *)test_dev_dup(ids, sizeof(int32_t) * n);
                float *d_out = (float *)test_dev_alloc(sizeof(float) * n * n_embd);
                test_dev_poison(d_out, sizeof(float) * n * n_embd);
                struct cuda_embed_args a = {d_out,   d_table, type, row_bytes, n_embd,
                                            n_vocab, d_ids,   n,    NULL};
                int rc = cuda_embed(&a);
                test_dev_get(got, d_out, sizeof(float) * n * n_embd);
                size_t bad = 0, first = 0, nan_ok = 1;
                for (int i = 0; i < n; i++) {
                    size_t f = 0, b;
                    if (i == bad_row) {
                        for (int64_t j = 0; j < n_embd; j++)
                            nan_ok &= isnan(got[(int64_t)i * n_embd + j]) != 0;
                        continue;
                    }
                    b = bits_differ(got + (int64_t)i * n_embd, ref + (int64_t)i * n_embd, n_embd,
                                    &f);
                    if (b && !bad)
                        first = (size_t)i * n_embd + f;
                    bad += b;
                }
                printf("embed %-5s n_embd %5lld rows %3d of %3lld (%s%s): rc %d, %zu elements "
                       "differ from quant_ref\n",
                       quant_type_name(type), (long long)n_embd, n, (long long)n_vocab,
                       variant ? "drawn" : "random bytes", variant ? ", padded rows" : "", rc, bad);
                CHECK(rc == 0, "embed %s rc %d", quant_type_name(type), rc);
                CHECK(bad == 0, "embed %s n_embd %lld: %zu differ, first at %zu: %.9g vs %.9g",
                      quant_type_name(type), (long long)n_embd, bad, first, got[first], ref[first]);
                CHECK(nan_ok, "embed %s: id outside the table did not give NaN",
                      quant_type_name(type));
                cuda_free(d_table), cuda_free(d_ids), cuda_free(d_out);
                free(table), free(ids), free(ref), free(got);
            }
        }
    }
}

/* ---- rmsnorm ------------------------------------------------------------------------------ */

static void test_rmsnorm(struct rng *r)
{
    static const int shapes[][2] = {{1, 64},   {3, 128}, {7, 2048}, {300, 1024},
                                    {2, 2880}, {5, 33},  {1, 7168}};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        for (int mode = 0; mode < 4; mode++) { /* 0 plain, 1 no weight, 2 in place, 3 resid */
            int rows = shapes[si][0], dim = shapes[si][1];
            size_t n = (size_t)rows * dim;
            float eps = mode == 1 ? 1e-5f : 1e-6f;
            float *x =
                test_rand_normal(r, n, powf(10.0f, rng_uniform(r, -3.0f, 1.0f))); /* eps matters */
            float *res = test_rand_normal(r, n, 1.0f);
            float *w = test_rand_normal(r, dim, 1.0f);
            float *ref = (float *)test_xmalloc(n * sizeof(float)),
                  *got = (float *)test_xmalloc(n * sizeof(float));
            float *res_ref = (float *)test_xmalloc(n * sizeof(float)),
                  *res_got = (float *)test_xmalloc(n * sizeof(float));
            float *d_x = (float *)test_dev_dup(x, n * sizeof(float));
            float *d_res = (float *)test_dev_dup(res, n * sizeof(float));
            float *d_w = (float *)test_dev_dup(w, dim * sizeof(float));
            float *d_out = mode == 2 ? d_x : (float *)test_dev_alloc(n * sizeof(float));
            if (mode != 2)
                test_dev_poison(d_out, n * sizeof(float));

            if (mode == 3) {
                for (size_t i = 0; i < n; i++)
                    res_ref[i] = res[i] + x[i];
                ops_rmsnorm(ref, res_ref, w, rows, dim, eps);
            } else {
                ops_rmsnorm(ref, x, mode == 1 ? NULL : w, rows, dim, eps);
            }
            struct cuda_rmsnorm_args a = {
                d_out, d_x, mode == 3 ? d_res : NULL, mode == 1 ? NULL : d_w, rows, dim, eps, NULL};
            int rc = cuda_rmsnorm(&a);
            test_dev_get(got, d_out, n * sizeof(float));
            double e = test_max_rel_err(got, ref, n);
            double er = 0;
            if (mode == 3) {
                test_dev_get(res_got, d_res, n * sizeof(float));
                er = test_max_rel_err(res_got, res_ref, n);
            }
            static const char *modes[] = {"weighted", "no weight", "in place", "fused resid"};
            printf("rmsnorm rows %3d dim %5d %-11s: rc %d, max rel err %.3g%s", rows, dim,
                   modes[mode], rc, e, mode == 3 ? "" : "\n");
            if (mode == 3)
                printf(", resid max rel err %.3g\n", er);
            CHECK(rc == 0 && e <= TOL_NORM && er == 0,
                  "rmsnorm rows %d dim %d mode %d: rc %d "
                  "err %g resid err %g",
                  rows, dim, mode, rc, e, er);
            cuda_free(d_x), cuda_free(d_res), cuda_free(d_w);
            if (mode != 2)
                cuda_free(d_out);
            free(x), free(res), free(w), free(ref), free(got), free(res_ref), free(res_got);
        }
    }
}

/* The norm's 8-bit copy against the one cuda_matmul makes of the norm's output (a Q8_0 call on
 * the MMV path), byte for byte; rows and widths past the register path, a NaN block, and the
 * fused residual. */
static void test_rmsnorm_q8(struct rng *r)
{
    static const int shapes[][2] = {{1, 2048}, {3, 4096}, {31, 64}, {2, 2880}, {1, 7168}};
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        const int rows = shapes[si][0], dim = shapes[si][1];
        const size_t n = (size_t)rows * dim, off = cuda_matmul_q8_layout(dim, rows);
        const size_t sb = cuda_matmul_scratch_bytes(QUANT_Q8_0, dim, 32, rows);
        const size_t qb = off + (size_t)rows * (dim / 32) * 8;
        float *x = test_rand_normal(r, n, 1.0f), *res = test_rand_normal(r, n, 1.0f);
        float *w = test_rand_normal(r, dim, 1.0f);
        if (si == 3)
            x[5] = NAN; /* its block of 32 gets d = NaN */
        float *d_x = (float *)test_dev_dup(x, n * sizeof(float));
        float *d_res = (float *)test_dev_dup(res, n * sizeof(float));
        float *d_w = (float *)test_dev_dup(w, dim * sizeof(float));
        float *d_out = (float *)test_dev_alloc(n * sizeof(float));
        uint8_t *d_q = (uint8_t *)test_dev_alloc(qb), *d_s = (uint8_t *)test_dev_alloc(sb);
        test_dev_poison(d_q, qb);
        struct cuda_rmsnorm_args a = {};
        a.out = d_out, a.in = d_x, a.resid = si % 2 ? d_res : NULL, a.w = d_w;
        a.rows = rows, a.dim = dim, a.eps = 1e-6f;
        a.q8_codes = (int8_t *)d_q, a.q8_scales = d_q + off;
        int rc = cuda_rmsnorm(&a);
        /* a zero Q8_0 matrix of 32 rows: only the quantization of x matters */
        const size_t rb = (size_t)(dim / 32) * 34;
        void *d_wq = test_dev_alloc(rb * 32);
        cudaMemset(d_wq, 0, rb * 32);
        float *d_y = (float *)test_dev_alloc(sizeof(float) * 32 * rows);
        struct cuda_matmul_args m = {};
        m.wtype = QUANT_Q8_0, m.w = d_wq, m.w_stride = rb, m.n_in = dim, m.n_out = 32;
        m.m = rows, m.x = d_out, m.x_stride = dim, m.y = d_y, m.y_stride = 32;
        m.scratch = d_s, m.scratch_bytes = sb, m.path = CUDA_MATMUL_PATH_MMV;
        int rm = cuda_matmul(&m);
        uint8_t *got = (uint8_t *)test_xmalloc(qb), *want = (uint8_t *)test_xmalloc(qb);
        test_dev_get(got, d_q, qb);
        test_dev_get(want, d_s, qb);
        size_t bad = 0;
        for (size_t i = 0; i < (size_t)rows * dim; i++)
            bad += got[i] != want[i];
        for (size_t i = off; i < qb; i++)
            bad += got[i] != want[i];
        printf("rmsnorm 8-bit copy rows %2d dim %4d%s%s: rc %d/%d, %zu bytes differ from "
               "cuda_matmul's\n",
               rows, dim, si % 2 ? " resid" : "", si == 3 ? " NaN" : "", rc, rm, bad);
        CHECK(rc == 0 && rm == 0 && bad == 0,
              "rmsnorm 8-bit copy rows %d dim %d: rc %d/%d, %zu "
              "bytes differ",
              rows, dim, rc, rm, bad);
        cuda_free(d_x), cuda_free(d_res), cuda_free(d_w), cuda_free(d_out), cuda_free(d_q);
        cuda_free(d_s), cuda_free(d_wq), cuda_free(d_y);
        free(x), free(res), free(w), free(got), free(want);
    }
    struct cuda_rmsnorm_args bad = {};
    bad.out = bad.resid = (float *)8, bad.in = (const float *)8, bad.rows = 1, bad.dim = 33;
    bad.q8_codes = (int8_t *)8, bad.q8_scales = (void *)8;
    CHECK(cuda_rmsnorm(&bad) == -EINVAL, "an 8-bit copy of 33 columns was not refused");
}

/* ---- rope --------------------------------------------------------------------------------- */

static void test_rope(struct rng *r)
{
    struct {
        int n_tok, heads, hd, pos0;
        float base;
        bool dev;
    } cases[] = {
        {1, 32, 128, 0, 1e6f, false},     {1, 4, 128, 977, 1e6f, true},
        {7, 8, 64, 3, 10000.f, false},    {300, 4, 128, 0, 1e6f, false},
        {33, 2, 256, 30000, 1e6f, true},  {5, 16, 96, 123, 5e5f, false},
        {64, 1, 256, 999, 10000.f, true},
    };
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        int n_tok = cases[ci].n_tok, heads = cases[ci].heads, hd = cases[ci].hd;
        size_t row = (size_t)heads * hd, n = n_tok * row;
        float *x = test_rand_normal(r, n, 1.0f), *ref = (float *)test_xmalloc(n * sizeof(float));
        float *got = (float *)test_xmalloc(n * sizeof(float));
        int32_t *pos = (int32_t *)test_xmalloc(sizeof(int32_t) * n_tok);
        memcpy(ref, x, n * sizeof(float));
        for (int t = 0; t < n_tok; t++) {
            /* device positions: arbitrary per token (lockstep streams), not pos0 + t */
            pos[t] = cases[ci].dev ? (int32_t)rng_below(r, 40000) : cases[ci].pos0 + t;
            ops_rope_neox(ref + t * row, 1, heads, hd, pos[t], cases[ci].base);
        }
        float *d_x = (float *)test_dev_dup(x, n * sizeof(float));
        int32_t *d_pos = (int32_t *)test_dev_dup(pos, sizeof(int32_t) * n_tok);
        struct cuda_rope_args a = {
            d_x, n_tok, heads, hd, cases[ci].pos0, cases[ci].dev ? d_pos : NULL, cases[ci].base,
            NULL};
        int rc = cuda_rope_neox(&a);
        test_dev_get(got, d_x, n * sizeof(float));
        double e = test_max_rel_err(got, ref, n);
        printf("rope n_tok %3d heads %2d head_dim %3d %s base %g: rc %d, max rel err %.3g\n", n_tok,
               heads, hd, cases[ci].dev ? "device positions" : "pos0 + t        ", cases[ci].base,
               rc, e);
        CHECK(rc == 0 && e <= TOL_ROPE, "rope case %zu: rc %d err %g", ci, rc, e);
        cuda_free(d_x), cuda_free(d_pos);
        free(x), free(ref), free(got), free(pos);
    }
    /* YaRN angles and attention factor (gpt-oss: head_dim 64, base 150000, factor 32 over 4096) */
    for (int ci = 0; ci < 3; ci++) {
        int n_tok = ci == 2 ? 200 : 1 + ci * 6, heads = ci ? 8 : 64, hd = 64;
        size_t row = (size_t)heads * hd, n = n_tok * row;
        double freq[32];
        float ms;
        ops_rope_yarn_freq(hd, 150000.0f, 32.0f, 4096, 32.0f, 1.0f, 0, freq, &ms);
        float *x = test_rand_normal(r, n, 1.0f), *ref = (float *)test_xmalloc(n * sizeof(float));
        float *got = (float *)test_xmalloc(n * sizeof(float));
        int32_t *pos = (int32_t *)test_xmalloc(sizeof(int32_t) * n_tok);
        memcpy(ref, x, n * sizeof(float));
        for (int t = 0; t < n_tok; t++) {
            pos[t] = ci == 1 ? (int32_t)rng_below(r, 100000) : 50 * ci + t;
            ops_rope_neox_freq(ref + t * row, 1, heads, hd, pos[t], freq, ms);
        }
        float *d_x = (float *)test_dev_dup(x, n * sizeof(float));
        int32_t *d_pos = (int32_t *)test_dev_dup(pos, sizeof(int32_t) * n_tok);
        struct cuda_rope_args a = {};
        a.x = d_x;
        a.n_tok = n_tok;
        a.n_heads = heads;
        a.head_dim = hd;
        a.pos0 = 50 * ci;
        a.pos_dev = ci == 1 ? d_pos : NULL;
        a.base = 150000.0f;
        a.freq = freq;
        a.mscale = ms;
        int rc = cuda_rope_neox(&a);
        test_dev_get(got, d_x, n * sizeof(float));
        double e = test_max_rel_err(got, ref, n);
        printf("rope YaRN n_tok %3d heads %2d head_dim %d: rc %d, max rel err %.3g\n", n_tok,
               heads, hd, rc, e);
        CHECK(rc == 0 && e <= TOL_ROPE, "rope YaRN case %d: rc %d err %g", ci, rc, e);
        cuda_free(d_x), cuda_free(d_pos);
        free(x), free(ref), free(got), free(pos);
    }
}

/* ---- kv_store ----------------------------------------------------------------------------- */

static void test_kv_store(struct rng *r)
{
    for (int ci = 0; ci < 4; ci++) {
        int n_ctx = 50 + rng_below(r, 200), width = 1 + rng_below(r, 1100);
        int n_tok = 1 + rng_below(r, 40), pos0 = rng_below(r, n_ctx - n_tok + 1);
        bool dev = ci & 1;
        size_t cn = (size_t)n_ctx * width;
        float *cache = test_rand_normal(r, cn, 1.0f), *src = test_rand_normal(r, (size_t)n_tok * width, 1.0f);
        float *ref = (float *)test_xmalloc(cn * sizeof(float)),
              *got = (float *)test_xmalloc(cn * sizeof(float));
        int32_t *pos = (int32_t *)test_xmalloc(sizeof(int32_t) * n_tok);
        memcpy(ref, cache, cn * sizeof(float));
        for (int t = 0; t < n_tok; t++) {
            /* device positions: distinct random rows, one outside the cache when possible */
            pos[t] = dev ? (int32_t)((t * 7919 + ci) % n_ctx) : pos0 + t;
            if (dev && t == n_tok - 1 && n_tok > 1)
                pos[t] = rng_below(r, 2) ? n_ctx : -1;
        }
        if (dev) /* the rows must be distinct for the result to be defined */
            for (int t = 0; t < n_tok; t++)
                for (int u = 0; u < t; u++)
                    if (pos[u] == pos[t])
                        pos[t] = -1;
        for (int t = 0; t < n_tok; t++)
            if (pos[t] >= 0 && pos[t] < n_ctx)
                memcpy(ref + (size_t)pos[t] * width, src + (size_t)t * width,
                       width * sizeof(float));
        float *d_cache = (float *)test_dev_dup(cache, cn * sizeof(float));
        float *d_src = (float *)test_dev_dup(src, (size_t)n_tok * width * sizeof(float));
        int32_t *d_pos = (int32_t *)test_dev_dup(pos, sizeof(int32_t) * n_tok);
        struct cuda_kv_store_args a = {
            d_cache, d_src, n_tok, width, n_ctx, pos0, dev ? d_pos : NULL, NULL};
        int rc = cuda_kv_store(&a);
        test_dev_get(got, d_cache, cn * sizeof(float));
        size_t first = 0, bad = bits_differ(got, ref, cn, &first);
        printf("kv_store n_ctx %3d width %4d n_tok %2d %s: rc %d, %zu elements differ\n", n_ctx,
               width, n_tok, dev ? "device positions" : "pos0 + t", rc, bad);
        CHECK(rc == 0 && bad == 0, "kv_store case %d: rc %d, %zu differ", ci, rc, bad);
        cuda_free(d_cache), cuda_free(d_src), cuda_free(d_pos);
        free(cache), free(src), free(ref), free(got), free(pos);
    }
    struct cuda_kv_store_args bad = {(float *)8, (const float *)8, 4, 16, 10, 7, NULL, NULL};
    CHECK(cuda_kv_store(&bad) == -EINVAL, "kv_store past the cache end was not refused");
}

/* ---- the fused attention prologue against the launches it replaces -------------------------- */

static void test_qk_rope_store(struct rng *r)
{
    struct {
        int n_tok, n_head, n_kv, hd;
        bool norm, dev, rows; /* norms; device positions; a cache per token */
        bool yarn;            /* YaRN's angles and scale (gpt-oss) */
    } cases[] = {
        {1, 32, 4, 128, true, false, false},      {1, 32, 4, 128, true, true, false},
        {5, 64, 4, 128, true, false, false},      {3, 16, 2, 256, true, true, true},
        {9, 8, 8, 64, false, true, false},        {17, 12, 3, 96, true, false, false},
        {300, 32, 4, 128, true, false, false},    {4, 4, 1, 256, true, true, true},
        {1, 64, 8, 64, false, true, false, true}, {7, 64, 8, 64, false, false, false, true},
        {3, 8, 2, 64, false, true, true, true},   {2, 4, 2, 16, false, false, false, true},
    };
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const int n_tok = cases[ci].n_tok, nh = cases[ci].n_head, nkv = cases[ci].n_kv;
        const int hd = cases[ci].hd, n_ctx = n_tok + 40 + rng_below(r, 60);
        const bool dev = cases[ci].dev, rows = cases[ci].rows;
        const int pos0 = dev ? 0 : rng_below(r, n_ctx - n_tok + 1);
        const size_t qn = (size_t)n_tok * nh * hd, kn = (size_t)n_tok * nkv * hd;
        const size_t cn = (size_t)n_ctx * nkv * hd;
        const float base = ci & 1 ? 1e6f : 10000.0f, eps = 1e-6f;
        float *q = test_rand_normal(r, qn, 2.0f), *k = test_rand_normal(r, kn, 2.0f);
        float *v = test_rand_normal(r, kn, 1.0f), *cache = test_rand_normal(r, cn, 1.0f);
        float *qw = test_rand_normal(r, hd, 1.0f), *kw = test_rand_normal(r, hd, 1.0f);
        int32_t *pos = (int32_t *)test_xmalloc(sizeof(int32_t) * n_tok);
        for (int t = 0; t < n_tok; t++) /* distinct rows; one outside the cache */
            pos[t] = dev ? (int32_t)((t * 37 + 5) % n_ctx) : pos0 + t;
        if (dev && n_tok > 2)
            pos[n_tok - 1] = n_ctx + 3;
        float *d_q[2], *d_k[2], *d_kc[2][2], *d_vc[2][2];
        float *d_v = (float *)test_dev_dup(v, kn * sizeof(float));
        float *d_qw = (float *)test_dev_dup(qw, hd * sizeof(float));
        float *d_kw = (float *)test_dev_dup(kw, hd * sizeof(float));
        int32_t *d_pos = (int32_t *)test_dev_dup(pos, sizeof(int32_t) * n_tok);
        for (int w = 0; w < 2; w++) { /* 0: separate launches, 1: fused; two caches (rows) */
            d_q[w] = (float *)test_dev_dup(q, qn * sizeof(float));
            d_k[w] = (float *)test_dev_dup(k, kn * sizeof(float));
            for (int c = 0; c < 2; c++) {
                d_kc[w][c] = (float *)test_dev_dup(cache, cn * sizeof(float));
                d_vc[w][c] = (float *)test_dev_dup(cache, cn * sizeof(float));
            }
        }
        /* lockstep rows: token t's caches are cache t % 2 */
        float *tab[2][128];
        float **d_tab[2] = {NULL, NULL};
        if (rows) {
            CHECK(n_tok <= 64, "case %zu: too many rows for the table", ci);
            for (int w = 0; w < 2; w++) {
                for (int t = 0; t < n_tok; t++) {
                    tab[w][t] = d_kc[w][t % 2];
                    tab[w][n_tok + t] = d_vc[w][t % 2];
                }
                d_tab[w] = (float **)test_dev_dup(tab[w], sizeof(float *) * 2 * n_tok);
            }
        }
        const int32_t *pd = dev ? d_pos : NULL;
        int rc = 0;
        if (cases[ci].norm) {
            struct cuda_rmsnorm_args nq = {d_q[0], d_q[0], NULL, d_qw, n_tok * nh, hd, eps, NULL};
            struct cuda_rmsnorm_args nk = {d_k[0], d_k[0], NULL, d_kw, n_tok * nkv, hd, eps, NULL};
            rc = rc ? rc : cuda_rmsnorm(&nq);
            rc = rc ? rc : cuda_rmsnorm(&nk);
        }
        struct cuda_rope_args rq = {d_q[0], n_tok, nh, hd, pos0, pd, base, NULL};
        double freq[CUDA_ROPE_MAX_FREQ];
        float mscale = 1.0f;
        if (cases[ci].yarn) { /* gpt-oss's scaling */
            ops_rope_yarn_freq(hd, base, 32.0f, 4096, 32.0f, 1.0f, false, freq, &mscale);
            rq.freq = freq, rq.mscale = mscale;
        }
        struct cuda_rope_args rk = rq;
        rk.x = d_k[0], rk.n_heads = nkv;
        rc = rc ? rc : cuda_rope_neox(&rq);
        rc = rc ? rc : cuda_rope_neox(&rk);
        struct cuda_kv_store_args sk = {d_kc[0][0], d_k[0], n_tok, nkv * hd,
                                        n_ctx,      pos0,   pd,    rows ? d_tab[0] : NULL};
        struct cuda_kv_store_args sv = {d_vc[0][0], d_v,  n_tok, nkv * hd,
                                        n_ctx,      pos0, pd,    rows ? d_tab[0] + n_tok : NULL};
        rc = rc ? rc : cuda_kv_store(&sk);
        rc = rc ? rc : cuda_kv_store(&sv);
        struct cuda_qk_rope_store_args fa = {};
        fa.q = d_q[1], fa.k = d_k[1], fa.v = d_v;
        fa.q_norm = cases[ci].norm ? d_qw : NULL, fa.k_norm = cases[ci].norm ? d_kw : NULL;
        fa.eps = eps, fa.n_tok = n_tok, fa.n_head = nh, fa.n_head_kv = nkv, fa.head_dim = hd;
        fa.pos0 = pos0, fa.pos_dev = pd, fa.base = base;
        fa.k_cache = d_kc[1][0], fa.v_cache = d_vc[1][0], fa.caches_dev = rows ? d_tab[1] : NULL;
        fa.n_ctx = n_ctx;
        if (cases[ci].yarn)
            fa.freq = freq, fa.mscale = mscale;
        int rf = cuda_qk_rope_store(&fa);
        size_t bad = 0, first = 0;
        size_t mx = qn > cn ? qn : cn;
        float *a = (float *)test_xmalloc(mx * sizeof(float)),
              *b = (float *)test_xmalloc(mx * sizeof(float));
        test_dev_get(a, d_q[0], qn * sizeof(float));
        test_dev_get(b, d_q[1], qn * sizeof(float));
        bad += bits_differ(a, b, qn, &first);
        test_dev_get(a, d_k[0], kn * sizeof(float));
        test_dev_get(b, d_k[1], kn * sizeof(float));
        bad += bits_differ(a, b, kn, &first);
        for (int c = 0; c < 2; c++) {
            test_dev_get(a, d_kc[0][c], cn * sizeof(float));
            test_dev_get(b, d_kc[1][c], cn * sizeof(float));
            bad += bits_differ(a, b, cn, &first);
            test_dev_get(a, d_vc[0][c], cn * sizeof(float));
            test_dev_get(b, d_vc[1][c], cn * sizeof(float));
            bad += bits_differ(a, b, cn, &first);
        }
        printf("qk_rope_store n_tok %3d heads %2d/%d head_dim %3d%s%s%s%s: rc %d/%d, %zu "
               "elements differ\n",
               n_tok, nh, nkv, hd, cases[ci].norm ? " norms" : "", dev ? " device positions" : "",
               rows ? " rows" : "", cases[ci].yarn ? " yarn" : "", rc, rf, bad);
        CHECK(rc == 0 && rf == 0 && bad == 0, "qk_rope_store case %zu: rc %d/%d, %zu differ", ci,
              rc, rf, bad);
        for (int w = 0; w < 2; w++) {
            cuda_free(d_q[w]), cuda_free(d_k[w]), cuda_free(d_tab[w]);
            for (int c = 0; c < 2; c++)
                cuda_free(d_kc[w][c]), cuda_free(d_vc[w][c]);
        }
        cuda_free(d_v), cuda_free(d_qw), cuda_free(d_kw), cuda_free(d_pos);
        free(q), free(k), free(v), free(cache), free(qw), free(kw), free(pos), free(a), free(b);
    }
    struct cuda_qk_rope_store_args bad = {};
    bad.q = bad.k = (float *)8, bad.v = (const float *)8, bad.k_cache = bad.v_cache = (float *)8;
    bad.n_tok = 4, bad.n_head = bad.n_head_kv = 1, bad.head_dim = 64, bad.pos0 = 7, bad.n_ctx = 10;
    CHECK(cuda_qk_rope_store(&bad) == -EINVAL, "qk_rope_store past the cache end was not refused");
    bad.pos0 = 0, bad.head_dim = 2 * CUDA_QKR_MAX_HEAD_DIM;
    CHECK(cuda_qk_rope_store(&bad) == -EINVAL, "qk_rope_store head_dim %d was not refused",
          bad.head_dim);
}

/* ---- attention ---------------------------------------------------------------------------- */

/* Attention scratch as cuda_attention.h asks for it: zeroed once (its counters). */
static void *attn_scratch_alloc(size_t bytes)
{
    void *p = test_dev_alloc(bytes);
    CHECK(cudaMemset(p, 0, bytes) == cudaSuccess, "cudaMemset of %zu bytes failed", bytes);
    return p;
}

struct attn_case {
    int hd, G, n_kv, n_tok, pos0, ctx_slack;
    bool dev;     /* positions from device memory */
    bool inplace; /* out == q */
    float qscale; /* larger: peakier softmax */
    int window;   /* > 0: sliding window (gpt-oss) */
    bool sinks;   /* per-head sink logits (gpt-oss) */
};

/* cuda_matmul's 8-bit copy of d_x (rows, n_in), codes then scales as its scratch holds them
 * (cuda_matmul_q8_layout), from a Q8_0 call on the MMV path over a zero matrix. */
static uint8_t *q8_reference(const float *d_x, int rows, int n_in, size_t *bytes)
{
    const size_t off = cuda_matmul_q8_layout(n_in, rows);
    const size_t sb = cuda_matmul_scratch_bytes(QUANT_Q8_0, n_in, 32, rows);
    *bytes = off + (size_t)rows * (n_in / 32) * 8;
    const size_t rb = (size_t)(n_in / 32) * 34;
    void *d_w = test_dev_alloc(rb * 32), *d_s = test_dev_alloc(sb);
    float *d_y = (float *)test_dev_alloc(sizeof(float) * 32 * rows);
    cudaMemset(d_w, 0, rb * 32);
    struct cuda_matmul_args m = {};
    m.wtype = QUANT_Q8_0, m.w = d_w, m.w_stride = rb, m.n_in = n_in, m.n_out = 32, m.m = rows;
    m.x = d_x, m.x_stride = n_in, m.y = d_y, m.y_stride = 32, m.scratch = d_s;
    m.scratch_bytes = sb, m.path = CUDA_MATMUL_PATH_MMV;
    CHECK(cuda_matmul(&m) == 0, "the reference quantization failed");
    uint8_t *h = (uint8_t *)test_xmalloc(*bytes);
    test_dev_get(h, d_s, *bytes);
    cuda_free(d_w), cuda_free(d_s), cuda_free(d_y);
    return h;
}

/* Bytes of the 8-bit copy at d_q (codes, then scales from cuda_matmul_q8_layout) that differ
 * from cuda_matmul's copy of d_x. */
static size_t q8_differ(const uint8_t *d_q, const float *d_x, int rows, int n_in)
{
    size_t bytes;
    uint8_t *want = q8_reference(d_x, rows, n_in, &bytes);
    uint8_t *got = (uint8_t *)test_xmalloc(bytes);
    test_dev_get(got, d_q, bytes);
    const size_t off = cuda_matmul_q8_layout(n_in, rows);
    size_t bad = 0;
    for (size_t i = 0; i < bytes; i++)
        bad += (i < (size_t)rows * n_in || i >= off) && got[i] != want[i];
    free(want), free(got);
    return bad;
}

static void run_attn_case(struct rng *r, const struct attn_case *c, void *d_scratch,
                          size_t scratch_bytes)
{
    int n_head = c->G * c->n_kv, hd = c->hd, n_tok = c->n_tok;
    int n_ctx = c->pos0 + n_tok + c->ctx_slack;
    size_t qn = (size_t)n_tok * n_head * hd, kvw = (size_t)c->n_kv * hd, cn = (size_t)n_ctx * kvw;
    /* the path cuda_ops.h promises for this call (device buffers are aligned) */
    bool tc =
        n_tok >= CUDA_ATTN_TC_MIN_TOK && n_tok * c->G >= CUDA_ATTN_TC_MIN_ROWS && hd % 16 == 0;
    double tol = tc ? TOL_ATTN_TC : TOL_ATTN;
    float *q = test_rand_normal(r, qn, c->qscale);
    float *kc = test_rand_normal(r, cn, 1.0f), *vc = test_rand_normal(r, cn, 1.0f);
    float *ref = (float *)test_xmalloc(qn * sizeof(float)),
          *got = (float *)test_xmalloc(qn * sizeof(float));
    int32_t *pos = (int32_t *)test_xmalloc(sizeof(int32_t) * n_tok);
    int last = c->pos0 + n_tok - 1;

    for (int t = 0; t < n_tok; t++)
        pos[t] = c->pos0 + t;
    /* rows past the last position are never valid keys: NaN there fails any case that reads
     * them (the CPU reference never does) */
    for (size_t i = (size_t)(last + 1) * kvw; i < cn; i++)
        kc[i] = vc[i] = NAN;
    float scale = 1.0f / sqrtf((float)hd);
    float *sinks = c->sinks ? test_rand_normal(r, (size_t)n_head, 2.0f) : NULL;
    struct ops_attn o = {ref, q, kc, vc, c->pos0, n_tok, n_head, c->n_kv, hd, scale, sinks,
                         c->window};
    ops_attention(&o);
    float *d_sinks = sinks ? (float *)test_dev_dup(sinks, sizeof(float) * n_head) : NULL;

    float *d_q = (float *)test_dev_dup(q, qn * sizeof(float));
    float *d_k = (float *)test_dev_dup(kc, cn * sizeof(float));
    float *d_v = (float *)test_dev_dup(vc, cn * sizeof(float));
    int32_t *d_pos = (int32_t *)test_dev_dup(pos, sizeof(int32_t) * n_tok);
    float *d_out = c->inplace ? d_q : (float *)test_dev_alloc(qn * sizeof(float));
    if (!c->inplace)
        test_dev_poison(d_out, qn * sizeof(float));
    struct cuda_attn_args a = {};
    a.out = d_out;
    a.q = d_q;
    a.k_cache = d_k;
    a.v_cache = d_v;
    a.pos0 = c->dev ? -12345 : c->pos0; /* must be ignored with device positions */
    a.pos_dev = c->dev ? d_pos : NULL;
    a.n_tok = n_tok;
    a.n_ctx = n_ctx;
    a.n_head = n_head;
    a.n_head_kv = c->n_kv;
    a.head_dim = hd;
    a.scale = scale;
    a.scratch = d_scratch;
    a.scratch_bytes = scratch_bytes;
    a.sinks = d_sinks;
    a.window = c->window;
    int rc = cuda_attention(&a);
    test_dev_get(got, d_out, qn * sizeof(float));
    double e = test_max_rel_err(got, ref, qn), en = test_norm_rel_err(got, ref, qn);
    printf("attention head_dim %3d heads %2d/%d (GQA %d) n_tok %3d keys %4d..%4d n_ctx %4d %s%s"
           " %s%s%s: rc %d, max rel %.3g, norm rel %.3g\n",
           hd, n_head, c->n_kv, c->G, n_tok, c->pos0 + 1, last + 1, n_ctx,
           c->dev ? "dev-pos" : "pos0", c->inplace ? " in-place" : "", tc ? "fp16-tc" : "float",
           c->window ? " window" : "", c->sinks ? " sinks" : "", rc, e, en);
    CHECK(rc == 0 && e <= tol, "attention hd %d G %d n_kv %d n_tok %d pos0 %d (%s): rc %d err %g",
          hd, c->G, c->n_kv, n_tok, c->pos0, tc ? "fp16-tc" : "float", rc, e);
    if (!c->inplace) { /* the splits merged by a kernel of their own: the same bits */
        float *apart = (float *)test_xmalloc(qn * sizeof(float));
        test_dev_poison(d_out, qn * sizeof(float));
        a.combine_apart = 1;
        int rc2 = cuda_attention(&a);
        test_dev_get(apart, d_out, qn * sizeof(float));
        size_t first = 0, bad = bits_differ(apart, got, qn, &first);
        CHECK(rc2 == 0 && bad == 0,
              "attention hd %d G %d n_tok %d: merged apart, rc %d, %zu "
              "elements differ (first %zu)",
              hd, c->G, n_tok, rc2, bad, first);
        a.combine_apart = 0;
        /* one token at device positions (a graph's call) against the same call at pos0: the
         * keys split by the position, not the cache's length, so the same bits */
        if (c->dev && n_tok == 1) {
            a.pos_dev = NULL;
            a.pos0 = c->pos0;
            rc2 = cuda_attention(&a);
            test_dev_get(apart, d_out, qn * sizeof(float));
            bad = bits_differ(apart, got, qn, &first);
            CHECK(rc2 == 0 && bad == 0,
                  "attention hd %d G %d pos %d: at pos0, rc %d, %zu elements differ from the "
                  "call at device positions (first %zu)",
                  hd, c->G, c->pos0, rc2, bad, first);
            a.pos_dev = d_pos;
            a.pos0 = -12345;
        }
        free(apart);
    }
    if (!c->inplace && hd % 32 == 0 && n_tok < 32) { /* the 8-bit copy, both merges */
        const int width = n_head * hd;
        const size_t qb = cuda_matmul_q8_layout(width, n_tok) + (size_t)n_tok * (width / 32) * 8;
        uint8_t *d_q8 = (uint8_t *)test_dev_alloc(qb);
        for (int apart = 0; apart < 2; apart++) {
            int done = -1;
            test_dev_poison(d_q8, qb);
            a.combine_apart = apart;
            a.q8_codes = (int8_t *)d_q8;
            a.q8_scales = d_q8 + cuda_matmul_q8_layout(width, n_tok);
            a.q8_done = &done;
            int rc3 = cuda_attention(&a);
            const bool dec = n_tok == 1 && (hd == 64 || hd == 128 || hd == 256) && c->G <= 16 &&
                             !(c->G & (c->G - 1)) && c->G * (hd / 32) <= 64;
            size_t bad = done == 1 ? q8_differ(d_q8, d_out, n_tok, width) : 0;
            CHECK(rc3 == 0 && (done == 1 || (done == 0 && !dec)) && bad == 0,
                  "attention hd %d G %d n_tok %d 8-bit copy (merge %s): rc %d, done %d, %zu "
                  "bytes differ from cuda_matmul's",
                  hd, c->G, n_tok, apart ? "apart" : "in the kernel", rc3, done, bad);
        }
        a.q8_codes = NULL, a.q8_scales = NULL, a.q8_done = NULL, a.combine_apart = 0;
        cuda_free(d_q8);
    }
    cuda_free(d_q), cuda_free(d_k), cuda_free(d_v), cuda_free(d_pos);
    if (d_sinks)
        cuda_free(d_sinks);
    if (!c->inplace)
        cuda_free(d_out);
    free(q), free(kc), free(vc), free(ref), free(got), free(pos), free(sinks);
}

/* Prefills on the tensor-core path and next to it. Rows of a block are t * G + g in tiles of
 * 64, keys go in tiles of 64 (32 at head_dim 256) and steps of 32: token counts that are not
 * multiples of 16 or 64 leave partial tiles at both ends; pos0 = 0 gives rows with 1, 2, 3 keys
 * (where a mask error shows), pos0 > 0 a continued prompt; n_kv >= 2 so that a wrong head
 * mapping reads another head's keys. */
static void test_attention_tc(struct rng *r, void *d_scratch, size_t scratch_bytes)
{
    static const int hds[] = {64, 128}, gs[] = {1, 4, 8};
    for (int hi = 0; hi < 2; hi++) {
        for (int gi = 0; gi < 3; gi++) {
            int G = gs[gi], n_kv = G == 8 ? 2 : 2 + rng_below(r, 2);
            int toks[] = {64, 65 + (int)rng_below(r, 15), 100 + (int)rng_below(r, 60),
                          200 + (int)rng_below(r, 101)};
            for (int ti = 0; ti < 4; ti++) {
                int pos0 = ti % 2 ? 1 + (int)rng_below(r, 500) : 0;
                struct attn_case c = {};
                c.hd = hds[hi], c.G = G, c.n_kv = n_kv, c.n_tok = toks[ti], c.pos0 = pos0;
                c.ctx_slack = (int)rng_below(r, 30);
                c.dev = ti >= 2;
                c.inplace = ti == 1 && G == 4;
                c.qscale = 1.0f + 2.0f * rng_f32(r);
                run_attn_case(r, &c, d_scratch, scratch_bytes);
            }
        }
    }
    /* {hd, G, n_kv, n_tok, pos0, ctx_slack, dev, inplace, qscale} */
    static const struct attn_case more[] = {
        /* other head sizes: 256 (two passes over the output dims) and multiples of 16 below
         * the kernel's 64/128/256 */
        {256, 4, 2, 70, 0, 5, false, false, 3.0f},
        {256, 8, 1, 100, 33, 0, true, true, 2.0f},
        {16, 4, 2, 50, 0, 3, false, false, 3.0f},
        {48, 8, 2, 9, 0, 1, true, false, 3.0f},
        {80, 4, 2, 33, 0, 1, true, false, 3.0f},
        {96, 1, 3, 130, 17, 2, false, false, 2.0f},
        {192, 2, 2, 65, 0, 0, false, false, 2.0f},
        /* few tokens, long context: the keys are split over blocks and combined (with device
         * positions the split is planned from n_ctx, so most splits are empty) */
        {128, 8, 2, 8, 900, 20, false, false, 3.0f},
        {128, 4, 1, 16, 500, 40, true, false, 2.0f},
        {256, 8, 1, 8, 300, 10, true, false, 2.0f},
        {64, 16, 2, 4, 0, 700, true, false, 3.0f},
        /* a 512-token prompt of 30b-a3b's attention (32/4 heads, head_dim 128): the shape to
         * time with ncu (-k regex:k_attn_pf, the launch of grid 64 x 4) */
        {128, 8, 4, 512, 0, 0, false, false, 2.0f},
        /* the float kernels: just below the row threshold, head_dim 72 / 40 (not multiples of
         * 16) at prefill sizes, and 64 rows of one or two tokens (decode) */
        {128, 1, 2, 63, 0, 3, false, false, 3.0f},
        {64, 8, 2, 7, 200, 3, true, false, 3.0f},
        {72, 4, 2, 100, 0, 5, false, false, 3.0f},
        {40, 8, 1, 150, 21, 0, true, true, 2.0f},
        {64, 64, 1, 1, 300, 0, true, false, 2.0f},
        {128, 32, 1, 2, 0, 50, false, false, 2.0f},
    };
    for (size_t i = 0; i < sizeof(more) / sizeof(more[0]); i++)
        run_attn_case(r, &more[i], d_scratch, scratch_bytes);
}

static void test_attention(struct rng *r)
{
    static const int hds[] = {64, 128, 256}, gs[] = {1, 4, 8};
    size_t scratch_bytes = cuda_attention_scratch_bytes(64, 256);
    void *d_scratch = attn_scratch_alloc(scratch_bytes);
    CHECK(scratch_bytes > 0, "cuda_attention_scratch_bytes returned 0");
    for (int hi = 0; hi < 3; hi++) {
        for (int gi = 0; gi < 3; gi++) {
            int n_kv = gs[gi] == 8 ? 1 + rng_below(r, 2) : 1 + rng_below(r, 4);
            /* decode: contexts 1..1000, tile and split boundaries included */
            static const int dpos[] = {0, 1, 15, 16, 31, 32, 33, 100};
            int np = (int)(sizeof(dpos) / sizeof(dpos[0]));
            for (int pi = 0; pi <= np; pi++) {
                int pos0 = pi < np ? dpos[pi] : 500 + (int)rng_below(r, 500);
                struct attn_case c = {hds[hi],     gs[gi], n_kv,
                                      1,           pos0,   (int)rng_below(r, 50),
                                      pi % 2 == 1, false,  1.0f + 2.0f * rng_f32(r)};
                run_attn_case(r, &c, d_scratch, scratch_bytes);
            }
            /* decode with a graph-sized cache: the split comes from n_ctx, not the position */
            struct attn_case big = {hds[hi], gs[gi], n_kv,  1,   (int)rng_below(r, 40),
                                    960,     true,   false, 1.0f};
            run_attn_case(r, &big, d_scratch, scratch_bytes);
            /* prefill and few-token cases */
            static const int toks[] = {2, 5, 17, 64, 300};
            for (int ti = 0; ti < 5; ti++) {
                int n_tok = toks[ti];
                int pos0 = ti % 2 ? (int)rng_below(r, 700) : 0;
                struct attn_case c = {hds[hi], gs[gi],  n_kv,
                                      n_tok,   pos0,    (int)rng_below(r, 20),
                                      ti == 2, ti == 3, 1.0f + 2.0f * rng_f32(r)};
                run_attn_case(r, &c, d_scratch, scratch_bytes);
            }
        }
    }
    struct attn_case odd = {96, 2, 3, 9, 41, 3, false, false, 2.0f}; /* head_dim 96, GQA 2 */
    run_attn_case(r, &odd, d_scratch, scratch_bytes);
    /* gpt-oss: 64/8 heads of 64, window 128 and sinks; decode past the window (split keys,
     * chunks before the window empty), at the window's edge, device positions, and prefill */
    static const struct attn_case oss[] = {
        {64, 8, 8, 1, 1000, 0, false, false, 1.5f, 128, true},
        {64, 8, 8, 1, 127, 5, true, false, 1.5f, 128, true},
        {64, 8, 8, 1, 128, 0, false, false, 1.5f, 128, false},
        {64, 8, 8, 1, 700, 40, true, false, 1.5f, 0, true},
        {64, 8, 2, 300, 0, 0, false, false, 1.5f, 128, true},
        {64, 8, 2, 64, 200, 7, false, true, 1.5f, 16, true},
        {64, 8, 8, 5, 3000, 0, false, false, 3.0f, 128, true},
        {64, 8, 8, 2, 900, 0, true, false, 1.5f, 128, true},
        {64, 8, 8, 2, 60, 9, false, false, 1.5f, 128, true},
        {64, 8, 2, 200, 500, 3, false, false, 1.5f, 128, true},
        {64, 8, 8, 33, 129, 0, true, false, 2.0f, 128, true},
        {128, 4, 2, 100, 300, 0, false, false, 2.0f, 64, true},
        {128, 4, 2, 1, 300, 0, false, false, 2.0f, 64, false},
        {16, 4, 2, 40, 0, 0, false, false, 1.5f, 8, true},
        {16, 4, 2, 40, 30, 0, false, false, 1.5f, 8, false},
    };
    for (size_t i = 0; i < sizeof(oss) / sizeof(oss[0]); i++)
        run_attn_case(r, &oss[i], d_scratch, scratch_bytes);
    test_attention_tc(r, d_scratch, scratch_bytes);
    cuda_free(d_scratch);
}

/* Lockstep rows: n query tokens, each of its own stream (its own K/V caches of its own length,
 * at its own position), in one call with k_rows/v_rows; the new K/V rows stored first with one
 * kv_store per cache kind (caches_dev). Every output must equal, bit for bit, one eager call per
 * row (the decode kernel splits a row's keys by its own position either way); head shapes the
 * one-launch kernel does not take answer -ENOTSUP. */
static void test_attention_rows(struct rng *r)
{
    /* {head_dim, G, n_kv} */
    static const int shapes[][3] = {{128, 8, 4}, {64, 4, 2}, {256, 2, 1}, {128, 1, 2}};
    static const int rows[] = {1, 3, 8, 16};
    for (int si = 0; si < 4; si++) {
        for (int ri = 0; ri < 4; ri++) {
            int hd = shapes[si][0], G = shapes[si][1], n_kv = shapes[si][2], n = rows[ri];
            int n_head = G * n_kv, kvw = n_kv * hd, qw = n_head * hd, max_ctx = 1;
            float **d_k = (float **)test_xmalloc(sizeof(float *) * 2 * n), **d_v = d_k + n;
            int32_t *pos = (int32_t *)test_xmalloc(sizeof(int32_t) * n);
            int *ctx = (int *)test_xmalloc(sizeof(int) * n);
            float *q = test_rand_normal(r, (size_t)n * qw, 2.0f);
            float *kn = test_rand_normal(r, (size_t)n * kvw, 1.0f);
            float *vn = test_rand_normal(r, (size_t)n * kvw, 1.0f);
            for (int i = 0; i < n; i++) {
                ctx[i] = 1 + (int)rng_below(r, i % 2 ? 40 : 1200);
                pos[i] = i == 0 ? 0 : (int)rng_below(r, (uint32_t)ctx[i]);
                max_ctx = ctx[i] > max_ctx ? ctx[i] : max_ctx;
                float *kc = test_rand_normal(r, (size_t)ctx[i] * kvw, 1.0f);
                float *vc = test_rand_normal(r, (size_t)ctx[i] * kvw, 1.0f);
                d_k[i] = (float *)test_dev_dup(kc, sizeof(float) * (size_t)ctx[i] * kvw);
                d_v[i] = (float *)test_dev_dup(vc, sizeof(float) * (size_t)ctx[i] * kvw);
                free(kc), free(vc);
            }
            float *d_q = (float *)test_dev_dup(q, sizeof(float) * (size_t)n * qw);
            float *d_kn = (float *)test_dev_dup(kn, sizeof(float) * (size_t)n * kvw);
            float *d_vn = (float *)test_dev_dup(vn, sizeof(float) * (size_t)n * kvw);
            void *d_tab = test_dev_dup(d_k, sizeof(float *) * 2 * n);
            int32_t *d_pos = (int32_t *)test_dev_dup(pos, sizeof(int32_t) * n);
            size_t sb = cuda_attention_rows_scratch_bytes(n, n_head, hd);
            size_t one_sb = cuda_attention_scratch_bytes(n_head, hd);
            void *d_scratch = attn_scratch_alloc(sb > one_sb ? sb : one_sb);
            float *d_out = (float *)test_dev_alloc(sizeof(float) * (size_t)n * qw);
            float *d_ref = (float *)test_dev_alloc(sizeof(float) * (size_t)n * qw);
            test_dev_poison(d_out, sizeof(float) * (size_t)n * qw);

            struct cuda_kv_store_args st = {};
            st.src = d_kn;
            st.n_tok = n;
            st.width = kvw;
            st.n_ctx = max_ctx;
            st.pos_dev = d_pos;
            st.caches_dev = (float *const *)d_tab;
            int rc = cuda_kv_store(&st);
            st.src = d_vn;
            st.caches_dev = (float *const *)d_tab + n;
            rc = rc ? rc : cuda_kv_store(&st);
            struct cuda_attn_args a = {};
            a.out = d_out;
            a.q = d_q;
            a.k_rows = (const float *const *)d_tab;
            a.v_rows = (const float *const *)d_tab + n;
            a.pos_dev = d_pos;
            a.n_tok = n;
            a.n_ctx = max_ctx;
            a.n_head = n_head;
            a.n_head_kv = n_kv;
            a.head_dim = hd;
            a.scale = 1.0f / sqrtf((float)hd);
            a.scratch = d_scratch;
            a.scratch_bytes = sb;
            rc = rc ? rc : cuda_attention(&a);
            CHECK(rc == 0, "attention rows head_dim %d G %d: rc %d", hd, G, rc);
            /* the reference: one eager call per row, its new K/V row at pos stored alone */
            for (int i = 0; i < n; i++) {
                struct cuda_attn_args b = {};
                b.out = d_ref + (size_t)i * qw;
                b.q = d_q + (size_t)i * qw;
                b.k_cache = d_k[i];
                b.v_cache = d_v[i];
                b.pos0 = pos[i];
                b.n_tok = 1;
                b.n_ctx = pos[i] + 1;
                b.n_head = n_head;
                b.n_head_kv = n_kv;
                b.head_dim = hd;
                b.scale = a.scale;
                b.scratch = d_scratch;
                b.scratch_bytes = one_sb;
                CHECK(cuda_attention(&b) == 0, "attention row %d", i);
            }
            if (rc == 0) {
                float *got = (float *)test_xmalloc(sizeof(float) * (size_t)n * qw);
                float *ref = (float *)test_xmalloc(sizeof(float) * (size_t)n * qw);
                float *kgot = (float *)test_xmalloc(sizeof(float) * kvw);
                test_dev_get(got, d_out, sizeof(float) * (size_t)n * qw);
                test_dev_get(ref, d_ref, sizeof(float) * (size_t)n * qw);
                size_t first = 0, diff = bits_differ(got, ref, (size_t)n * qw, &first);
                size_t kdiff = 0;
                for (int i = 0; i < n; i++) {
                    test_dev_get(kgot, d_k[i] + (size_t)pos[i] * kvw, sizeof(float) * kvw);
                    kdiff += memcmp(kgot, kn + (size_t)i * kvw, sizeof(float) * kvw) != 0;
                    test_dev_get(kgot, d_v[i] + (size_t)pos[i] * kvw, sizeof(float) * kvw);
                    kdiff += memcmp(kgot, vn + (size_t)i * kvw, sizeof(float) * kvw) != 0;
                }
                printf("attention rows head_dim %3d heads %2d/%d, %2d rows (contexts up to %4d): "
                       "%zu elements differ from one call per row, %zu K/V rows misplaced\n",
                       hd, n_head, n_kv, n, max_ctx, diff, kdiff);
                CHECK(diff == 0 && kdiff == 0, "attention rows: %zu differ (first %zu), %zu K/V",
                      diff, first, kdiff);
                free(got), free(ref), free(kgot);
            }
            for (int i = 0; i < n; i++)
                cuda_free(d_k[i]), cuda_free(d_v[i]);
            cuda_free(d_q), cuda_free(d_kn), cuda_free(d_vn), cuda_free(d_tab), cuda_free(d_pos);
            cuda_free(d_scratch), cuda_free(d_out), cuda_free(d_ref);
            free(d_k), free(pos), free(ctx), free(q), free(kn), free(vn);
        }
    }
    /* head_dim 96 is not one of the decode kernel's */
    struct cuda_attn_args odd = {};
    float *dummy = (float *)test_dev_alloc(64);
    odd.out = dummy, odd.q = dummy, odd.pos_dev = (const int32_t *)dummy;
    odd.k_rows = odd.v_rows = (const float *const *)dummy;
    odd.n_tok = 1, odd.n_ctx = 8, odd.n_head = 2, odd.n_head_kv = 1, odd.head_dim = 96;
    odd.scratch = dummy, odd.scratch_bytes = 64;
    CHECK(cuda_attention(&odd) == -ENOTSUP, "head_dim 96 rows were not refused with -ENOTSUP");
    cuda_free(dummy);
}

/* A few rows of one stream (a speculative verify pass): every output of one call of n rows at
 * pos0 .. pos0 + n - 1 must equal, bit for bit, the call of that row alone, for positions whose
 * keys fill one chunk or many, with positions from the host and from device memory; heads the
 * decode kernel does not take (head_dim 96) go the tiled way and are only held to the float
 * tolerance. */
static void test_attention_exact(struct rng *r)
{
    /* {head_dim, G, n_kv}: 30b-a3b, qwen3next, the shipped model's kind, MHA, and odd */
    static const int shapes[][3] = {{128, 8, 4}, {256, 8, 2}, {64, 4, 2}, {128, 1, 2}, {96, 2, 1}};
    static const int rows[] = {2, 3, 5, 9, CUDA_ATTN_EXACT_MAX_TOK};
    static const int starts[] = {0, 30, 700, 1500};
    const int n_ctx = 1600;
    for (int si = 0; si < 5; si++) {
        int hd = shapes[si][0], G = shapes[si][1], n_kv = shapes[si][2];
        int n_head = G * n_kv, kvw = n_kv * hd, qw = n_head * hd, nmax = CUDA_ATTN_EXACT_MAX_TOK;
        bool exact = cuda_attention_rows_ok(n_head, n_kv, hd);
        float *kc = test_rand_normal(r, (size_t)n_ctx * kvw, 1.0f);
        float *vc = test_rand_normal(r, (size_t)n_ctx * kvw, 1.0f);
        float *q = test_rand_normal(r, (size_t)nmax * qw, 2.0f);
        float *d_k = (float *)test_dev_dup(kc, sizeof(float) * (size_t)n_ctx * kvw);
        float *d_v = (float *)test_dev_dup(vc, sizeof(float) * (size_t)n_ctx * kvw);
        float *d_q = (float *)test_dev_dup(q, sizeof(float) * (size_t)nmax * qw);
        size_t sb = cuda_attention_scratch_bytes(n_head, hd);
        void *d_scratch = attn_scratch_alloc(sb);
        float *d_out = (float *)test_dev_alloc(sizeof(float) * (size_t)nmax * qw);
        float *d_ref = (float *)test_dev_alloc(sizeof(float) * (size_t)nmax * qw);
        int32_t *d_pos = (int32_t *)test_dev_alloc(sizeof(int32_t) * (size_t)nmax);
        float *got = (float *)test_xmalloc(sizeof(float) * (size_t)nmax * qw);
        float *ref = (float *)test_xmalloc(sizeof(float) * (size_t)nmax * qw);
        size_t worst = 0;
        double worst_err = 0.0;
        for (int ri = 0; ri < 5; ri++) {
            for (int pi = 0; pi < 4; pi++) {
                for (int dev = 0; dev < 2; dev++) {
                    int n = rows[ri], pos0 = starts[pi];
                    int32_t pos[CUDA_ATTN_EXACT_MAX_TOK];
                    for (int t = 0; t < n; t++)
                        pos[t] = pos0 + t;
                    test_dev_put(d_pos, pos, sizeof(int32_t) * (size_t)n);
                    test_dev_poison(d_out, sizeof(float) * (size_t)n * qw);
                    struct cuda_attn_args a = {};
                    a.out = d_out;
                    a.q = d_q;
                    a.k_cache = d_k;
                    a.v_cache = d_v;
                    a.pos0 = pos0;
                    a.pos_dev = dev ? d_pos : NULL;
                    a.n_tok = n;
                    a.n_ctx = n_ctx;
                    a.n_head = n_head;
                    a.n_head_kv = n_kv;
                    a.head_dim = hd;
                    a.scale = 1.0f / sqrtf((float)hd);
                    a.scratch = d_scratch;
                    a.scratch_bytes = sb;
                    int rc = cuda_attention(&a);
                    for (int t = 0; t < n && !rc; t++) {
                        struct cuda_attn_args b = a;
                        b.out = d_ref + (size_t)t * qw;
                        b.q = d_q + (size_t)t * qw;
                        b.pos0 = pos0 + t;
                        b.pos_dev = NULL;
                        b.n_tok = 1;
                        rc = cuda_attention(&b);
                    }
                    CHECK(rc == 0, "attention exact hd %d G %d n %d pos0 %d: rc %d", hd, G, n, pos0,
                          rc);
                    if (rc)
                        continue;
                    test_dev_get(got, d_out, sizeof(float) * (size_t)n * qw);
                    test_dev_get(ref, d_ref, sizeof(float) * (size_t)n * qw);
                    size_t first = 0, diff = bits_differ(got, ref, (size_t)n * qw, &first);
                    double err = 0.0;
                    for (size_t i = 0; i < (size_t)n * qw; i++)
                        err = fmax(err, fabs((double)got[i] - ref[i]));
                    worst = diff > worst ? diff : worst;
                    worst_err = fmax(worst_err, err);
                    if (exact)
                        CHECK(diff == 0,
                              "attention exact hd %d G %d n %d pos0 %d %s: %zu of %d "
                              "differ from the rows alone (first %zu, max %g)",
                              hd, G, n, pos0, dev ? "pos_dev" : "pos0", diff, n * qw, first, err);
                    else
                        CHECK(err <= 1e-5,
                              "attention hd %d G %d n %d pos0 %d: max %g from the "
                              "rows alone",
                              hd, G, n, pos0, err);
                }
            }
        }
        printf("attention of 2..%d rows of one stream, head_dim %3d heads %2d/%d, positions up to "
               "%d: %s; at most %zu elements differ from each row alone (max %.3g)\n",
               CUDA_ATTN_EXACT_MAX_TOK, hd, n_head, n_kv, starts[3] + nmax - 1,
               exact ? "row by row (must be 0)" : "tiled kernel", worst, worst_err);
        cuda_free(d_k), cuda_free(d_v), cuda_free(d_q), cuda_free(d_scratch);
        cuda_free(d_out), cuda_free(d_ref), cuda_free(d_pos);
        free(kc), free(vc), free(q), free(got), free(ref);
    }
}

/* ---- add, argmax, topk -------------------------------------------------------------------- */

static void test_add(struct rng *r)
{
    static const size_t ns[] = {1, 7, 2048, 100003};
    for (int i = 0; i < 4; i++) {
        size_t n = ns[i];
        float *x = test_rand_normal(r, n, 1.0f), *y = test_rand_normal(r, n, 1.0f);
        float *ref = (float *)test_xmalloc(n * sizeof(float)),
              *got = (float *)test_xmalloc(n * sizeof(float));
        for (size_t j = 0; j < n; j++)
            ref[j] = x[j] + y[j];
        float *d_x = (float *)test_dev_dup(x, n * sizeof(float)),
              *d_y = (float *)test_dev_dup(y, n * sizeof(float));
        int rc = cuda_add(d_x, d_y, n, NULL);
        test_dev_get(got, d_x, n * sizeof(float));
        size_t first = 0, bad = bits_differ(got, ref, n, &first);
        printf("add n %6zu: rc %d, %zu elements differ\n", n, rc, bad);
        CHECK(rc == 0 && bad == 0, "add n %zu: rc %d, %zu differ", n, rc, bad);
        cuda_free(d_x), cuda_free(d_y);
        free(x), free(y), free(ref), free(got);
    }
}

static void test_add_bias(struct rng *r)
{
    static const int shapes[][2] = {{1, 8}, {7, 2880}, {64, 201}, {0, 5}};
    for (int i = 0; i < 4; i++) {
        int rows = shapes[i][0], dim = shapes[i][1];
        size_t n = (size_t)rows * dim;
        float *x = test_rand_normal(r, n + 1, 1.0f), *b = test_rand_normal(r, dim, 1.0f);
        float *ref = (float *)test_xmalloc((n + 1) * sizeof(float)),
              *got = (float *)test_xmalloc((n + 1) * sizeof(float));
        for (size_t j = 0; j < n; j++)
            ref[j] = x[j] + b[j % dim];
        float *d_x = (float *)test_dev_dup(x, (n + 1) * sizeof(float)),
              *d_b = (float *)test_dev_dup(b, dim * sizeof(float));
        int rc = cuda_add_bias(d_x, d_b, rows, dim, NULL);
        test_dev_get(got, d_x, (n + 1) * sizeof(float));
        size_t first = 0, bad = bits_differ(got, ref, n, &first);
        printf("add_bias rows %2d dim %4d: rc %d, %zu elements differ\n", rows, dim, rc, bad);
        CHECK(rc == 0 && bad == 0 && !memcmp(&got[n], &x[n], sizeof(float)),
              "add_bias %d x %d: rc %d, %zu differ", rows, dim, rc, bad);
        cuda_free(d_x), cuda_free(d_b);
        free(x), free(b), free(ref), free(got);
    }
}

static void test_argmax(struct rng *r)
{
    static const int ns[] = {1, 7, 1000, 1001, 151936, 201088};
    for (int i = 0; i < 6; i++) {
        int n = ns[i], rows = 1 + rng_below(r, 4);
        float *x = test_rand_normal(r, (size_t)rows * n, 3.0f);
        int32_t *got = (int32_t *)test_xmalloc(sizeof(int32_t) * rows);
        for (int row = 0; row < rows; row++) {
            float *xr = x + (size_t)row * n;
            if (row % 2 == 1) { /* ties: the maximum at several places, the lowest must win */
                float mx = xr[sampler_argmax(xr, n)];
                for (int k = 0; k < 3; k++)
                    xr[rng_below(r, n)] = mx;
            }
            if (row == 2)
                for (int j = 0; j < n; j++)
                    xr[j] = -1.5f; /* all equal: index 0 */
        }
        float *d_x = (float *)test_dev_dup(x, sizeof(float) * rows * n);
        int32_t *d_out = (int32_t *)test_dev_alloc(sizeof(int32_t) * rows);
        test_dev_poison(d_out, sizeof(int32_t) * rows);
        int rc = cuda_argmax(d_x, rows, n, d_out, NULL);
        test_dev_get(got, d_out, sizeof(int32_t) * rows);
        int bad = 0;
        for (int row = 0; row < rows; row++)
            bad += got[row] != sampler_argmax(x + (size_t)row * n, n);
        /* each row again over several blocks (twice: the scratch must be left zeroed) */
        void *d_s = test_dev_alloc(CUDA_ARGMAX_SCRATCH);
        cudaMemset(d_s, 0, CUDA_ARGMAX_SCRATCH);
        int wbad = 0;
        for (int row = 0; row < rows; row++)
            for (int k = 0; k < 2; k++) {
                int32_t g = -2;
                rc |= cuda_argmax_wide(d_x + (size_t)row * n, n, d_out, d_s, NULL);
                test_dev_get(&g, d_out, sizeof(g));
                wbad += g != sampler_argmax(x + (size_t)row * n, n);
            }
        cuda_free(d_s);
        printf("argmax rows %d n %6d (with ties): rc %d, %d rows differ, %d over several "
               "blocks\n",
               rows, n, rc, bad, wbad);
        CHECK(rc == 0 && bad == 0 && wbad == 0, "argmax n %d: rc %d, %d rows differ, %d wide", n,
              rc, bad, wbad);
        cuda_free(d_x), cuda_free(d_out);
        free(x), free(got);
    }
}

static void test_topk(struct rng *r)
{
    static const int experts[] = {8, 32, 60, 64, 128, 256, 512, 1024};
    static const int ks[] = {1, 2, 4, 8};
    static const int toks[] = {1, 7, 300};
    for (int ei = 0; ei < 8; ei++) {
        for (int ki = 0; ki < 4; ki++) {
            int n_expert = experts[ei], k = ks[ki], n_tok = toks[(ei + ki) % 3];
            bool ties = (ei + ki) % 2;
            size_t nl = (size_t)n_tok * n_expert, nk = (size_t)n_tok * k;
            float *l = test_rand_normal(r, nl, 2.0f);
            if (ties) /* exact ties: coarse values so that many logits are equal */
                for (size_t i = 0; i < nl; i++)
                    l[i] = floorf(l[i] * 2.0f) * 0.5f;
            int32_t *ids_ref = (int32_t *)test_xmalloc(sizeof(int32_t) * nk);
            int32_t *ids_got = (int32_t *)test_xmalloc(sizeof(int32_t) * nk);
            float *w_ref = (float *)test_xmalloc(sizeof(float) * nk),
                  *w_got = (float *)test_xmalloc(sizeof(float) * nk);
            moe_route_softmax_topk(l, n_tok, n_expert, k, ids_ref, w_ref);
            float *d_l = (float *)test_dev_dup(l, nl * sizeof(float));
            int32_t *d_ids = (int32_t *)test_dev_alloc(sizeof(int32_t) * nk);
            float *d_w = (float *)test_dev_alloc(sizeof(float) * nk);
            test_dev_poison(d_ids, sizeof(int32_t) * nk);
            test_dev_poison(d_w, sizeof(float) * nk);
            struct cuda_topk_args a = {d_l, n_tok, n_expert, k, d_ids, d_w, NULL};
            int rc = cuda_softmax_topk(&a);
            test_dev_get(ids_got, d_ids, sizeof(int32_t) * nk);
            test_dev_get(w_got, d_w, sizeof(float) * nk);
            size_t id_bad = 0;
            double werr = 0;
            for (size_t i = 0; i < nk; i++) {
                id_bad += ids_got[i] != ids_ref[i];
                double d = fabs((double)w_got[i] - w_ref[i]);
                werr = isnan(w_got[i]) ? INFINITY : d > werr ? d : werr;
            }
            printf("topk n_expert %4d k %d n_tok %3d%s: rc %d, %zu ids differ, weights max abs "
                   "err %.3g\n",
                   n_expert, k, n_tok, ties ? " (tied logits)" : "", rc, id_bad, werr);
            CHECK(rc == 0 && id_bad == 0 && werr <= TOL_TOPK_W,
                  "topk n_expert %d k %d: rc %d, %zu ids differ, weight err %g", n_expert, k, rc,
                  id_bad, werr);
            cuda_free(d_l), cuda_free(d_ids), cuda_free(d_w);
            free(l), free(ids_ref), free(ids_got), free(w_ref), free(w_got);
        }
    }
    struct cuda_topk_args bad = {(const float *)8, 1, 8, 9, (int32_t *)8, (float *)8, NULL};
    CHECK(cuda_softmax_topk(&bad) == -EINVAL, "topk with k > n_expert was not refused");
}

/* ---- a decode step captured in a CUDA graph, replayed at changing positions --------------- */

static void test_graph(struct rng *r)
{
    const int hd = 128, n_kv = 2, G = 4, n_head = n_kv * G, n_ctx = 300;
    const float base = 1e6f, scale = 1.0f / sqrtf((float)hd);
    const size_t qn = (size_t)n_head * hd, kvw = (size_t)n_kv * hd, cn = (size_t)n_ctx * kvw;
    float *kc = (float *)test_xmalloc(cn * sizeof(float)), *vc = (float *)test_xmalloc(cn * sizeof(float));
    float *ref = (float *)test_xmalloc(qn * sizeof(float)), *got = (float *)test_xmalloc(qn * sizeof(float));
    for (size_t i = 0; i < cn; i++)
        kc[i] = vc[i] = NAN; /* unwritten cache rows */
    float *d_q = (float *)test_dev_alloc(qn * sizeof(float)),
          *d_out = (float *)test_dev_alloc(qn * sizeof(float));
    float *d_knew = (float *)test_dev_alloc(kvw * sizeof(float)),
          *d_vnew = (float *)test_dev_alloc(kvw * sizeof(float));
    float *d_k = (float *)test_dev_dup(kc, cn * sizeof(float)),
          *d_v = (float *)test_dev_dup(vc, cn * sizeof(float));
    int32_t *d_pos = (int32_t *)test_dev_alloc(sizeof(int32_t));
    size_t sb = cuda_attention_scratch_bytes(n_head, hd);
    void *d_scratch = attn_scratch_alloc(sb);
    cudaStream_t s;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    int rc = 0;

    if (CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)))
        fatal("cudaStreamCreate");
    if (CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal)))
        fatal("cudaStreamBeginCapture");
    struct cuda_rope_args rq = {d_q, 1, n_head, hd, 0, d_pos, base, s};
    struct cuda_rope_args rk = {d_knew, 1, n_kv, hd, 0, d_pos, base, s};
    struct cuda_kv_store_args sk = {d_k, d_knew, 1, (int)kvw, n_ctx, 0, d_pos, NULL, s};
    struct cuda_kv_store_args sv = {d_v, d_vnew, 1, (int)kvw, n_ctx, 0, d_pos, NULL, s};
    struct cuda_attn_args at = {};
    at.out = d_out, at.q = d_q, at.k_cache = d_k, at.v_cache = d_v, at.pos_dev = d_pos;
    at.n_tok = 1, at.n_ctx = n_ctx, at.n_head = n_head, at.n_head_kv = n_kv, at.head_dim = hd;
    at.scale = scale, at.scratch = d_scratch, at.scratch_bytes = sb, at.stream = s;
    rc |= cuda_rope_neox(&rq) | cuda_rope_neox(&rk) | cuda_kv_store(&sk) | cuda_kv_store(&sv);
    rc |= cuda_attention(&at);
    if (CUDA_CHECK(cudaStreamEndCapture(s, &graph)) ||
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0)))
        fatal("graph capture");
    CHECK(rc == 0, "launch inside capture failed: %d", rc);

    double worst = 0;
    int steps = 0;
    for (int pos = 0; pos < n_ctx; pos++) {
        float *q = test_rand_normal(r, qn, 2.0f), *kn = test_rand_normal(r, kvw, 1.0f);
        float *vn = test_rand_normal(r, kvw, 1.0f);
        bool run = pos < 40 || pos >= n_ctx - 8;
        int32_t p32 = pos;
        if (run) { /* a graph step on the device, the same step on the CPU */
            test_dev_put(d_q, q, qn * sizeof(float));
            test_dev_put(d_knew, kn, kvw * sizeof(float));
            test_dev_put(d_vnew, vn, kvw * sizeof(float));
            test_dev_put(d_pos, &p32, sizeof(int32_t));
            test_dev_poison(d_out, qn * sizeof(float));
            if (CUDA_CHECK(cudaGraphLaunch(exec, s)) || CUDA_CHECK(cudaStreamSynchronize(s)))
                fatal("cudaGraphLaunch");
        }
        ops_rope_neox(q, 1, n_head, hd, pos, base);
        ops_rope_neox(kn, 1, n_kv, hd, pos, base);
        memcpy(kc + pos * kvw, kn, kvw * sizeof(float));
        memcpy(vc + pos * kvw, vn, kvw * sizeof(float));
        if (!run) { /* positions skipped by the graph: fill the device cache directly */
            test_dev_put(d_k + pos * kvw, kn, kvw * sizeof(float));
            test_dev_put(d_v + pos * kvw, vn, kvw * sizeof(float));
        } else {
            struct ops_attn o = {ref, q, kc, vc, pos, 1, n_head, n_kv, hd, scale};
            ops_attention(&o);
            test_dev_get(got, d_out, qn * sizeof(float));
            double e = test_max_rel_err(got, ref, qn);
            worst = e > worst ? e : worst;
            steps++;
            CHECK(e <= TOL_ATTN, "graph replay at position %d: max rel err %g", pos, e);
        }
        free(q), free(kn), free(vn);
    }
    printf("graph decode step (rope q/k, kv_store k/v, attention; head_dim %d, heads %d/%d, "
           "n_ctx %d) replayed %d times at positions 0..39 and %d..%d: worst max rel err %.3g\n",
           hd, n_head, n_kv, n_ctx, steps, n_ctx - 8, n_ctx - 1, worst);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
    cuda_free(d_q), cuda_free(d_out), cuda_free(d_knew), cuda_free(d_vnew), cuda_free(d_k);
    cuda_free(d_v), cuda_free(d_pos), cuda_free(d_scratch);
    free(kc), free(vc), free(ref), free(got);
}

int main(void)
{
    if (!test_gpu_available(NAME))
        return TEST_SKIP;
    struct rng r;
    rng_seed(&r, test_seed(NAME), 0);
    test_embed(&r);
    test_rmsnorm(&r);
    test_rmsnorm_q8(&r);
    test_rope(&r);
    test_kv_store(&r);
    test_qk_rope_store(&r);
    test_attention(&r);
    test_attention_rows(&r);
    test_attention_exact(&r);
    test_add(&r);
    test_add_bias(&r);
    test_argmax(&r);
    test_topk(&r);
    test_graph(&r);
    return test_finish(NAME);
}
