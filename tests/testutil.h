/* testutil: what every test program shares: a check macro that reports file and line, the
 * skip code, poisoning of outputs, error measures and the test data directory. */
#ifndef STRATA_TESTUTIL_H
#define STRATA_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "rng.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TEST_SKIP 77

extern int test_failures;

/* Records a failure with file and line and the formatted reason; the test goes on. */
#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);          \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fputc('\n', stderr);                                                               \
            test_failures++;                                                                   \
        }                                                                                      \
    } while (0)

/* Ends the test: prints a summary line and returns the exit code main should return. */
int test_finish(const char *name);

/* Fills n floats with a NaN pattern so an unwritten output element fails every comparison. */
void test_poison_f32(float *p, size_t n);
/* Fills bytes with 0xA5. */
void test_poison_bytes(void *p, size_t n);

/* max_i |a_i - b_i| / max(max_i |b_i|, tiny); NaN in either gives +inf. */
double test_max_rel_err(const float *a, const float *b, size_t n);
/* ||a - b||_2 / ||b||_2; NaN gives +inf. */
double test_norm_rel_err(const float *a, const float *b, size_t n);
/* qsort's comparison of floats, ascending. */
int test_cmp_float(const void *a, const void *b);

struct gen_preset;

/* A generated qwen3moe checkpoint of preset p (gen_preset_find's, possibly edited) at mix
 * (enum quant_mix) with seed, written by 2 threads to dir/name-MIX.gguf; the path goes to
 * buf. 0 or -errno (err_msg says why). */
int test_gen_model(const struct gen_preset *p, int mix, uint64_t seed, const char *dir,
                   const char *name, char *buf, size_t size);

/* ---- scalar references of the whole-model tests (test_*_forward) ------------------------ */

struct weight;

/* Row r (ne[0] floats) of weight w, slice e of a 3-D stack, dequantized (a failure is a
 * failed check). */
void test_ref_row(const struct weight *w, uint64_t e, uint64_t r, float *out);

/* y (ne[1]) = W (slice e) x (ne[0]) [+ bias], summed in double. q8_act: x rounded first as the
 * CPU kernels round activations before a product with a block-quantized weight
 * (cpu_kernels/vec_dot.h: Q8_0 blocks of 32, d = max|x| / 127 kept as f16, codes
 * round-half-even of x / d); off: the model's definition, float activations. */
void test_ref_linear(const struct weight *w, uint64_t e, const float *x, const float *bias,
                     int q8_act, float *y);

/* Path under tests/data: writes into buf and returns it. */
const char *test_data_path(char *buf, size_t size, const char *name);

/* Allocation helpers that end the test (exit 1, naming what failed) instead of returning
 * NULL. The dev_ ones use the default CUDA stream and synchronise. */
void *test_xmalloc(size_t n);
void *test_dev_alloc(size_t bytes);
void test_dev_put(void *dev, const void *host, size_t bytes);
void *test_dev_dup(const void *host, size_t bytes);
void test_dev_get(void *host, const void *dev, size_t bytes);
void test_dev_poison(void *dev, size_t bytes); /* 0xFF bytes: NaN floats, -1 ints */

/* n floats drawn from normal(0, std^2), test_xmalloc'd. */
float *test_rand_normal(struct rng *r, size_t n, float std);
/* Bytes of a row of n elements of a ggml type (ends the test on a bad type or length). */
uint64_t test_row_bytes(uint32_t type, int64_t n);

/* For GPU tests: returns 1 when a CUDA device is usable; else prints why and returns 0 (the
 * test then exits TEST_SKIP). */
int test_gpu_available(const char *name);

/* ---- rewriting a GGUF file (hostile and edited variants of a generated one) -------------- */

struct gguf_kv;
struct gguf_tensor;
struct gguf_writer;

enum test_kv_action {
    TEST_KV_COPY, /* the key as it is */
    TEST_KV_SKIP, /* left out */
    TEST_KV_DONE, /* the callback wrote its own value */
};

/* What test_gguf_rewrite changes; a NULL callback changes nothing. */
struct test_rewrite {
    void *ctx;
    /* each key of the source but general.alignment: enum test_kv_action, or -errno */
    int (*kv)(void *ctx, struct gguf_writer *w, const struct gguf_kv *kv);
    /* after the copied keys: keys to add; 0 or -errno */
    int (*add_kvs)(void *ctx, struct gguf_writer *w);
    /* each tensor: false leaves it out; its type and shape may be changed in place (the bytes
     * are copied as they are) */
    bool (*tensor)(void *ctx, const struct gguf_tensor *t, uint32_t *type, uint64_t *ne);
};

/* Copies src to dst through gguf_writer with rw's changes. 0 or -errno. */
int test_gguf_rewrite(const char *src, const char *dst, const struct test_rewrite *rw);

/* Seed for fresh random data: STRATA_TEST_SEED if set (to replay a failure), else the time.
 * The seed is printed so a failure can be reproduced. */
uint64_t test_seed(const char *name);

#ifdef __cplusplus
}
#endif

#endif
