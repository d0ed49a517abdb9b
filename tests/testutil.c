#include "testutil.h"

#include "cuda_info.h"
#include "cuda_mem.h"
#include "fp16.h"
#include "gen.h"
#include "gguf.h"
#include "model.h"
#include "quant.h"
#include "quant_ref.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

int test_failures;

int test_finish(const char *name)
{
    if (test_failures) {
        fprintf(stderr, "%s: %d check(s) FAILED\n", name, test_failures);
        return 1;
    }
    printf("%s: all checks passed\n", name);
    return 0;
}

void test_poison_f32(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
}

void test_poison_bytes(void *p, size_t n)
{
    memset(p, 0xA5, n);
}

double test_max_rel_err(const float *a, const float *b, size_t n)
{
    double maxdiff = 0, maxref = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i]))
            return INFINITY;
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > maxdiff)
            maxdiff = d;
        if (fabs((double)b[i]) > maxref)
            maxref = fabs((double)b[i]);
    }
    return maxdiff / maxref;
}

double test_norm_rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i]))
            return INFINITY;
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

int test_cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

const char *test_data_path(char *buf, size_t size, const char *name)
{
    /* STRATA_TEST_DATA relocates the data folder (tests run from a copied build tree) */
    const char *dir = getenv("STRATA_TEST_DATA");
    snprintf(buf, size, "%s/%s", dir ? dir : STRATA_TEST_DATA, name);
    return buf;
}

uint64_t test_seed(const char *name)
{
    /* fixed unless asked for another: FNV-1a of the test's name, so a run can fail only where
     * every run of that build fails */
    const char *env = getenv("STRATA_TEST_SEED");
    uint64_t seed = 0xcbf29ce484222325ULL;
    for (const char *c = name; *c; c++)
        seed = (seed ^ (unsigned char)*c) * 0x100000001b3ULL;
    if (env)
        seed = strtoull(env, NULL, 0);
    printf("%s: seed %llu (replay with STRATA_TEST_SEED=%llu)\n", name, (unsigned long long)seed,
           (unsigned long long)seed);
    return seed;
}

int test_gpu_available(const char *name)
{
    const char *why = NULL;
    if (cuda_device_count(&why) > 0)
        return 1;
    printf("%s: skipped: no usable CUDA device (%s)\n", name, why ? why : "unknown");
    return 0;
}

static void test_fatal(const char *what)
{
    fprintf(stderr, "%s failed\n", what);
    exit(1);
}

void *test_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        test_fatal("malloc");
    return p;
}

void *test_dev_alloc(size_t bytes)
{
    void *p = NULL;
    if (cuda_malloc(&p, bytes))
        test_fatal("cuda_malloc");
    return p;
}

void test_dev_put(void *dev, const void *host, size_t bytes)
{
    if (cuda_h2d(dev, host, bytes, NULL) || cuda_stream_sync(NULL))
        test_fatal("cuda_h2d");
}

void *test_dev_dup(const void *host, size_t bytes)
{
    void *d = test_dev_alloc(bytes);
    test_dev_put(d, host, bytes);
    return d;
}

void test_dev_get(void *host, const void *dev, size_t bytes)
{
    if (cuda_stream_sync(NULL) || cuda_d2h(host, dev, bytes, NULL) || cuda_stream_sync(NULL))
        test_fatal("cuda_d2h");
}

void test_dev_poison(void *dev, size_t bytes)
{
    if (cuda_memset(dev, 0xFF, bytes, NULL) || cuda_stream_sync(NULL))
        test_fatal("cuda_memset");
}

float *test_rand_normal(struct rng *r, size_t n, float std)
{
    float *v = test_xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        v[i] = std * rng_normal(r);
    return v;
}

uint64_t test_row_bytes(uint32_t type, int64_t n)
{
    uint64_t rb = 0;
    if (n < 0 || quant_row_bytes(type, (uint64_t)n, &rb))
        test_fatal("quant_row_bytes");
    return rb;
}

int test_gen_model(const struct gen_preset *p, int mix, uint64_t seed, const char *dir,
                   const char *name, char *buf, size_t size)
{
    struct gen_config cfg = {0};
    snprintf(buf, size, "%s/%s-%s.gguf", dir, name, quant_mix_name((enum quant_mix)mix));
    cfg.arch = p->arch ? p->arch : "qwen3moe";
    cfg.preset = *p;
    cfg.mix = (enum quant_mix)mix;
    cfg.seed = seed;
    cfg.n_threads = 2;
    cfg.out_path = buf;
    return gen_file_write(&cfg, NULL);
}

void test_ref_row(const struct weight *w, uint64_t e, uint64_t r, float *out)
{
    const uint8_t *p = (const uint8_t *)w->data + (e * w->ne[1] + r) * w->row_bytes;
    int rc = quant_ref_dequantize(w->type, p, out, (int64_t)w->ne[0]);
    CHECK(rc == 0, "dequantize %s", w->name);
}

static void test_ref_round_q8(const float *x, float *xq, int64_t n)
{
    for (int64_t b = 0; b < n; b += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[b + j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        float dh = fp16_to_f32(fp16_from_f32(d));
        for (int j = 0; j < 32; j++) {
            float c = nearbyintf(x[b + j] * id);
            xq[b + j] = dh * fminf(fmaxf(c, -127.0f), 127.0f);
        }
    }
}

void test_ref_linear(const struct weight *w, uint64_t e, const float *x, const float *bias,
                     int q8_act, float *y)
{
    float *row = test_xmalloc(sizeof(float) * w->ne[0]);
    float *xq = test_xmalloc(sizeof(float) * w->ne[0]);
    memcpy(xq, x, sizeof(float) * w->ne[0]);
    if (q8_act && w->type != QUANT_F32 && w->type != QUANT_F16 && w->type != QUANT_BF16)
        test_ref_round_q8(x, xq, (int64_t)w->ne[0]);
    for (uint64_t r = 0; r < w->ne[1]; r++) {
        test_ref_row(w, e, r, row);
        double s = 0;
        for (uint64_t i = 0; i < w->ne[0]; i++)
            s += (double)row[i] * xq[i];
        y[r] = (float)s + (bias ? bias[r] : 0.0f);
    }
    free(row);
    free(xq);
}

int test_gguf_rewrite(const char *src, const char *dst, const struct test_rewrite *rw)
{
    struct gguf_file *f;
    struct gguf_writer *w;
    int rc = gguf_open(src, &f);
    if (rc)
        return rc;
    rc = gguf_writer_open(dst, (uint32_t)f->alignment, &w);
    if (rc) {
        gguf_close(f);
        return rc;
    }
    for (uint64_t i = 0; !rc && i < f->n_kv; i++) {
        const struct gguf_kv *kv = &f->kv[i];
        if (!strcmp(kv->key, "general.alignment"))
            continue;
        int a = rw->kv ? rw->kv(rw->ctx, w, kv) : TEST_KV_COPY;
        rc = a < 0 ? a : a == TEST_KV_COPY ? gguf_writer_copy_kv(w, kv) : 0;
    }
    if (!rc && rw->add_kvs)
        rc = rw->add_kvs(rw->ctx, w);
    bool *keep = calloc(f->n_tensors ? f->n_tensors : 1, sizeof(bool));
    if (!keep)
        rc = rc ? rc : -ENOMEM;
    for (uint64_t i = 0; !rc && i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        uint64_t ne[GGUF_MAX_DIMS];
        uint32_t type = t->type;
        memcpy(ne, t->ne, sizeof(ne));
        keep[i] = !rw->tensor || rw->tensor(rw->ctx, t, &type, ne);
        if (keep[i]) {
            int idx = gguf_writer_add_tensor(w, t->name, type, t->n_dims, ne);
            rc = idx < 0 ? idx : 0;
        }
    }
    rc = rc ? rc : gguf_writer_begin_data(w);
    for (uint64_t i = 0; !rc && i < f->n_tensors; i++)
        if (keep[i])
            rc = gguf_writer_write(w, f->tensors[i].data, f->tensors[i].size);
    free(keep);
    if (rc)
        gguf_writer_abort(w);
    else
        rc = gguf_writer_finish(w);
    gguf_close(f);
    return rc;
}
