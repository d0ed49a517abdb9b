/* test_gguf: the GGUF reader and writer.
 *
 * (a) the golden file written by llama.cpp's gguf-py (tests/data/quant-golden.gguf): tensor
 *     table and metadata as its README describes them;
 * (b) writer -> reader round trips of every value type, string arrays and tensors of several
 *     types, written sequentially in random chunks and positionally from several threads;
 *     abort and failed finish leave nothing behind;
 * (c) a malformed corpus built from a valid small file: every truncation, and one patch per
 *     rule the reader enforces; each must fail with -errno and a message naming the thing;
 *     then random byte flips. Every input also goes through the fuzz target's walk.
 * (d) `strata inspect` on the golden file and a bad one, when the binary is built.
 */
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "errors.h"
#include "gguf.h"
#include "quant.h"
#include "testutil.h"

/* LLVMFuzzerTestOneInput: the fuzz target's walk, run here over every corpus input. */
#include "../fuzz/gguf_fuzz.c"

static char tmp_dir[] = "/tmp/test_gguf.XXXXXX";

static const char *tmp_file(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", tmp_dir, name);
    return buf;
}

static bool file_exists(const char *path)
{
    return access(path, F_OK) == 0;
}

static bool temp_of_exists(const char *path)
{
    char tmp[512];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    return file_exists(tmp);
}

/* Reads a whole file into an exact-size malloc'ed buffer (so ASan sees any overread). */
static uint8_t *file_read(const char *path, uint64_t *size)
{
    FILE *fp = fopen(path, "rb");
    uint8_t *buf = NULL;
    long n;

    if (!fp)
        return NULL;
    if (fseek(fp, 0, SEEK_END) == 0 && (n = ftell(fp)) > 0 && fseek(fp, 0, SEEK_SET) == 0) {
        buf = malloc((size_t)n);
        if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
            free(buf);
            buf = NULL;
        }
        *size = (uint64_t)n;
    }
    fclose(fp);
    return buf;
}

static bool str_eq(struct gguf_str s, const char *c)
{
    return s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0;
}

/* ---- (a) golden file ----------------------------------------------------------------------- */

static const char *const golden_types[] = {"Q8_0",  "Q4_0", "Q4_K", "Q5_K", "Q6_K",
                                           "Q2_K",  "Q3_K", "MXFP4", "F16", "BF16"};
#define N_GOLDEN (sizeof(golden_types) / sizeof(golden_types[0]))

static void golden_check_tensor(const struct gguf_file *f, const char *name, uint32_t type)
{
    const struct gguf_tensor *t = gguf_find_tensor(f, name);
    uint64_t bytes = 0;

    CHECK(t != NULL, "tensor '%s' missing", name);
    if (!t)
        return;
    CHECK(t->type == type, "'%s': type %s, expected %s", name, quant_type_name(t->type),
          quant_type_name(type));
    CHECK(t->n_dims == 2 && t->ne[0] == 1024 && t->ne[1] == 6 && t->ne[2] == 1 && t->ne[3] == 1,
          "'%s': dims %u {%llu, %llu, %llu, %llu}, expected 2 {1024, 6}", name, t->n_dims,
          (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
          (unsigned long long)t->ne[2], (unsigned long long)t->ne[3]);
    CHECK(quant_tensor_bytes(type, 2, t->ne, &bytes) == 0 && t->size == bytes,
          "'%s': size %llu, expected %llu", name, (unsigned long long)t->size,
          (unsigned long long)bytes);
    CHECK(t->offset % f->alignment == 0, "'%s': offset %llu not aligned", name,
          (unsigned long long)t->offset);
    CHECK((const uint8_t *)t->data == f->base + f->data_offset + t->offset &&
              f->data_offset + t->offset + t->size <= f->size,
          "'%s': data view outside the file", name);
}

static void golden_check_table(const struct gguf_file *f)
{
    struct gguf_str s = {0};
    char name[32];

    CHECK(f->version == 3, "version %u", f->version);
    CHECK(f->alignment == 32, "alignment %llu", (unsigned long long)f->alignment);
    CHECK(f->data_offset % 32 == 0, "data offset %llu", (unsigned long long)f->data_offset);
    CHECK(f->n_tensors == 2 * N_GOLDEN, "%llu tensors", (unsigned long long)f->n_tensors);
    for (size_t i = 0; i < N_GOLDEN; i++) {
        enum quant_type id = QUANT_F32;
        CHECK(quant_type_parse(golden_types[i], &id) == 0, "%s", golden_types[i]);
        snprintf(name, sizeof(name), "%s.q", golden_types[i]);
        golden_check_tensor(f, name, id);
        snprintf(name, sizeof(name), "%s.f32", golden_types[i]);
        golden_check_tensor(f, name, QUANT_F32);
    }
    CHECK(gguf_get_str(f, "general.architecture", &s) == 0 && str_eq(s, "golden"),
          "general.architecture: %s", err_msg());
    CHECK(gguf_get_str(f, "golden.description", &s) == 0 &&
              memmem(s.ptr, s.len, "gguf-py", 7) != NULL,
          "golden.description: %s", err_msg());
}

static void test_golden(void)
{
    char path[512];
    struct gguf_file *f = NULL, *m = NULL;
    uint8_t *buf;
    uint64_t size = 0;
    uint32_t u;
    int rc;

    test_data_path(path, sizeof(path), "quant-golden.gguf");
    rc = gguf_open(path, &f);
    CHECK(rc == 0, "gguf_open(%s): %d %s", path, rc, err_msg());
    if (rc)
        return;
    golden_check_table(f);

    /* Getter errors name the key. */
    rc = gguf_get_u32(f, "general.architecture", &u);
    CHECK(rc == -EINVAL && strstr(err_msg(), "general.architecture"), "%d %s", rc, err_msg());
    rc = gguf_get_u32(f, "no.such.key", &u);
    CHECK(rc == -ENOENT && strstr(err_msg(), "no.such.key"), "%d %s", rc, err_msg());
    CHECK(gguf_find_tensor(f, "Q4_K") == NULL, "prefix must not match");

    /* The same bytes through gguf_open_memory give the same table. */
    buf = file_read(path, &size);
    CHECK(buf && size == f->size, "reading %s", path);
    if (buf && gguf_open_memory(buf, size, &m) == 0) {
        golden_check_table(m);
        CHECK(m->data_offset == f->data_offset && m->n_kv == f->n_kv, "memory != mmap");
        CHECK(LLVMFuzzerTestOneInput(buf, size) == 0, "fuzz walk");
        gguf_close(m);
    } else {
        CHECK(0, "gguf_open_memory: %s", err_msg());
    }
    free(buf);
    gguf_close(f);
}

/* ---- (b) round trip ------------------------------------------------------------------------ */

struct rt_tensor {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint8_t *data; /* (size) random bytes */
    uint64_t size;
};

static struct rt_tensor rt_tensors[] = {
    {"token_embd.weight", QUANT_F32, 2, {64, 3}, NULL, 0},
    {"blk.0.ffn_up_exps.weight", QUANT_Q4_K, 3, {256, 4, 3}, NULL, 0},
    {"blk.0.ffn_down_exps.weight", QUANT_Q8_0, 3, {96, 2, 3}, NULL, 0},
    {"mx", QUANT_MXFP4, 4, {64, 1, 1, 2}, NULL, 0},
    {"half", QUANT_F16, 1, {7}, NULL, 0},
    {"brain", QUANT_BF16, 2, {5, 3}, NULL, 0},
    {"six", QUANT_Q6_K, 2, {512, 2}, NULL, 0},
};
#define N_RT (sizeof(rt_tensors) / sizeof(rt_tensors[0]))

#define N_SCALAR_TYPES 11
static const enum gguf_value_type scalar_types[N_SCALAR_TYPES] = {
    GGUF_TYPE_UINT8,  GGUF_TYPE_INT8,  GGUF_TYPE_UINT16,  GGUF_TYPE_INT16,
    GGUF_TYPE_UINT32, GGUF_TYPE_INT32, GGUF_TYPE_FLOAT32, GGUF_TYPE_BOOL,
    GGUF_TYPE_UINT64, GGUF_TYPE_INT64, GGUF_TYPE_FLOAT64};

/* Everything the round trip writes, drawn once from the seed. */
struct rt_values {
    uint8_t scalar[N_SCALAR_TYPES][8]; /* LE bytes of each scalar */
    uint8_t arr[N_SCALAR_TYPES][64 * 8];
    uint64_t arr_count[N_SCALAR_TYPES];
};

static const char *const rt_strs[] = {"", "a", "h\xc3\xa9llo", "tok\0en", "last"};
static const uint64_t rt_lens[] = {0, 1, 6, 6, 4};

/* Random but valid bytes of one value of type t (finite floats, 0/1 bools). */
static void rt_random_value(struct rng *r, enum gguf_value_type t, uint8_t *out)
{
    uint64_t bits = rng_u64(r);
    float f = rng_normal(r) * 1000.0f;
    double d = (double)rng_normal(r) * 1e9;

    if (t == GGUF_TYPE_BOOL)
        bits &= 1;
    memcpy(out, &bits, gguf_value_type_size(t));
    if (t == GGUF_TYPE_FLOAT32)
        memcpy(out, &f, sizeof(f));
    if (t == GGUF_TYPE_FLOAT64)
        memcpy(out, &d, sizeof(d));
}

static void rt_values_draw(struct rng *r, struct rt_values *v)
{
    for (int i = 0; i < N_SCALAR_TYPES; i++) {
        enum gguf_value_type t = scalar_types[i];
        rt_random_value(r, t, v->scalar[i]);
        v->arr_count[i] = i == 3 ? 0 : 1 + rng_below(r, 64);
        for (uint64_t j = 0; j < v->arr_count[i]; j++)
            rt_random_value(r, t, v->arr[i] + j * gguf_value_type_size(t));
    }
}

static void rt_tensors_draw(struct rng *r)
{
    for (size_t i = 0; i < N_RT; i++) {
        struct rt_tensor *t = &rt_tensors[i];
        CHECK(quant_tensor_bytes(t->type, t->n_dims, t->ne, &t->size) == 0, "%s", t->name);
        t->data = malloc(t->size);
        for (uint64_t j = 0; j < t->size; j++)
            t->data[j] = (uint8_t)rng_u32(r);
    }
}

static int rt_add_kvs(struct gguf_writer *w, const struct rt_values *v)
{
    char key[64];
    int rc = 0;

    for (int i = 0; i < N_SCALAR_TYPES && rc == 0; i++) {
        enum gguf_value_type t = scalar_types[i];
        bool b = v->scalar[i][0];
        snprintf(key, sizeof(key), "s.%s", gguf_value_type_name(t));
        rc = gguf_writer_add_scalar(w, key, t, t == GGUF_TYPE_BOOL ? (const void *)&b
                                                                   : v->scalar[i]);
        snprintf(key, sizeof(key), "a.%s", gguf_value_type_name(t));
        if (rc == 0)
            rc = gguf_writer_add_arr(w, key, t, v->arr[i], v->arr_count[i]);
    }
    if (rc == 0)
        rc = gguf_writer_add_u32(w, "h.u32", 4000000000u);
    if (rc == 0)
        rc = gguf_writer_add_i32(w, "h.i32", -123456);
    if (rc == 0)
        rc = gguf_writer_add_u64(w, "h.u64", 0xfedcba9876543210ull);
    if (rc == 0)
        rc = gguf_writer_add_f32(w, "h.f32", 1e-6f);
    if (rc == 0)
        rc = gguf_writer_add_bool(w, "h.bool", true);
    if (rc == 0)
        rc = gguf_writer_add_str(w, "general.architecture", "t\xc3\xa9st");
    if (rc == 0)
        rc = gguf_writer_add_arr_str(w, "h.strs", rt_strs, rt_lens, 5);
    if (rc == 0)
        rc = gguf_writer_add_arr_str(w, "h.cstrs", rt_strs + 1, NULL, 2);
    return rc;
}

/* Decodes scalar bytes the way the reader should: the expected gguf_value. */
static struct gguf_value rt_expected(enum gguf_value_type t, const uint8_t *b)
{
    struct gguf_value v = {.type = t};
    uint64_t u = 0;
    float f;
    double d;

    memcpy(&u, b, gguf_value_type_size(t));
    switch (t) {
    case GGUF_TYPE_INT8: v.i64 = (int8_t)u; break;
    case GGUF_TYPE_INT16: v.i64 = (int16_t)u; break;
    case GGUF_TYPE_INT32: v.i64 = (int32_t)u; break;
    case GGUF_TYPE_INT64: v.i64 = (int64_t)u; break;
    case GGUF_TYPE_FLOAT32: memcpy(&f, b, 4); v.f64 = f; break;
    case GGUF_TYPE_FLOAT64: memcpy(&d, b, 8); v.f64 = d; break;
    default: v.u64 = u; break;
    }
    return v;
}

static bool value_eq(const struct gguf_value *a, const struct gguf_value *b)
{
    if (a->type != b->type)
        return false;
    if (a->type == GGUF_TYPE_FLOAT32 || a->type == GGUF_TYPE_FLOAT64)
        return a->f64 == b->f64;
    return a->u64 == b->u64; /* i64 shares the bits */
}

static void rt_check_typed(const struct gguf_file *f, const struct rt_values *v)
{
    char key[64];

    for (int i = 0; i < N_SCALAR_TYPES; i++) {
        enum gguf_value_type t = scalar_types[i];
        struct gguf_value want = rt_expected(t, v->scalar[i]), e;
        const struct gguf_kv *kv;
        const struct gguf_value *arr = NULL;
        uint64_t esz = gguf_value_type_size(t);

        snprintf(key, sizeof(key), "s.%s", gguf_value_type_name(t));
        kv = gguf_find_kv(f, key);
        CHECK(kv && value_eq(&kv->value, &want), "%s: wrong value", key);
        snprintf(key, sizeof(key), "a.%s", gguf_value_type_name(t));
        CHECK(gguf_get_arr(f, key, &arr) == 0, "%s: %s", key, err_msg());
        if (!arr)
            continue;
        CHECK(arr->arr.elem_type == t && arr->arr.count == v->arr_count[i], "%s: type/count",
              key);
        CHECK(arr->arr.count == 0 || memcmp(arr->arr.data, v->arr[i], esz * arr->arr.count) == 0,
              "%s: bytes differ", key);
        for (uint64_t j = 0; j < arr->arr.count; j++) {
            want = rt_expected(t, v->arr[i] + j * esz);
            CHECK(gguf_arr_get(arr, j, &e) == 0 && value_eq(&e, &want), "%s[%llu]", key,
                  (unsigned long long)j);
        }
        CHECK(gguf_arr_get(arr, arr->arr.count, &e) == -ERANGE, "%s: index past end", key);
    }
}

static void rt_check_getters(const struct gguf_file *f)
{
    uint32_t u32 = 0;
    uint64_t u64 = 0;
    int64_t i64 = 0;
    float f32 = 0;
    bool b = false;
    struct gguf_str s = {0};
    const struct gguf_value *arr = NULL;
    struct gguf_value e;

    CHECK(gguf_get_u32(f, "h.u32", &u32) == 0 && u32 == 4000000000u, "h.u32");
    CHECK(gguf_get_i64(f, "h.i32", &i64) == 0 && i64 == -123456, "h.i32");
    CHECK(gguf_get_u32(f, "h.i32", &u32) == -ERANGE && strstr(err_msg(), "h.i32"), "neg");
    CHECK(gguf_get_u64(f, "h.u64", &u64) == 0 && u64 == 0xfedcba9876543210ull, "h.u64");
    CHECK(gguf_get_u32(f, "h.u64", &u32) == -ERANGE, "u64 -> u32 must not fit");
    CHECK(gguf_get_i64(f, "h.u64", &i64) == -ERANGE, "u64 -> i64 must not fit");
    CHECK(gguf_get_u64(f, "h.u32", &u64) == 0 && u64 == 4000000000u, "u32 -> u64");
    CHECK(gguf_get_f32(f, "h.f32", &f32) == 0 && f32 == 1e-6f, "h.f32");
    CHECK(gguf_get_f32(f, "h.u32", &f32) == -EINVAL, "u32 is not a float");
    CHECK(gguf_get_bool(f, "h.bool", &b) == 0 && b, "h.bool");
    CHECK(gguf_get_bool(f, "h.u32", &b) == -EINVAL && strstr(err_msg(), "h.u32"), "bool type");
    CHECK(gguf_get_u64(f, "h.bool", &u64) == -EINVAL, "a bool is not an integer");
    CHECK(gguf_get_str(f, "general.architecture", &s) == 0 && str_eq(s, "t\xc3\xa9st"), "arch");
    CHECK(gguf_get_str(f, "h.strs", &s) == -EINVAL, "array is not a string");
    CHECK(gguf_get_arr(f, "h.strs", &arr) == 0 && arr->arr.elem_type == GGUF_TYPE_STRING &&
              arr->arr.count == 5, "h.strs");
    for (uint64_t i = 0; arr && i < arr->arr.count; i++) {
        CHECK(gguf_arr_get(arr, i, &e) == 0 && e.str.len == rt_lens[i] &&
                  memcmp(e.str.ptr, rt_strs[i], rt_lens[i]) == 0, "h.strs[%llu]",
              (unsigned long long)i);
    }
    CHECK(gguf_get_arr(f, "h.cstrs", &arr) == 0 && arr->arr.count == 2 &&
              str_eq(arr->arr.strs[0], "a") && str_eq(arr->arr.strs[1], "h\xc3\xa9llo"),
          "h.cstrs");
    CHECK(gguf_get_arr(f, "h.u32", &arr) == -EINVAL, "scalar is not an array");
}

/* Tensors: table, bytes, alignment, zero padding up to the next tensor and the end. */
static void rt_check_tensors(const struct gguf_file *f)
{
    uint64_t end = f->data_offset;

    CHECK(f->n_tensors == N_RT, "%llu tensors", (unsigned long long)f->n_tensors);
    for (size_t i = 0; i < N_RT && i < f->n_tensors; i++) {
        const struct rt_tensor *w = &rt_tensors[i];
        const struct gguf_tensor *t = &f->tensors[i];
        uint64_t start = f->data_offset + t->offset;

        CHECK(!strcmp(t->name, w->name) && gguf_find_tensor(f, w->name) == t, "%s", w->name);
        CHECK(t->type == w->type && t->n_dims == w->n_dims && t->size == w->size, "%s", w->name);
        for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
            CHECK(t->ne[d] == (d < w->n_dims ? w->ne[d] : 1), "%s dim %u", w->name, d);
        CHECK(start % f->alignment == 0 && start >= end, "%s at %llu", w->name,
              (unsigned long long)start);
        for (uint64_t p = end; p < start; p++)
            CHECK(f->base[p] == 0, "padding byte %llu is %u", (unsigned long long)p, f->base[p]);
        CHECK(memcmp(t->data, w->data, w->size) == 0, "%s: data differs", w->name);
        end = start + t->size;
    }
    CHECK(f->size == ((end + f->alignment - 1) & ~(f->alignment - 1)), "file size %llu",
          (unsigned long long)f->size);
    for (uint64_t p = end; p < f->size; p++)
        CHECK(f->base[p] == 0, "trailing byte %llu is %u", (unsigned long long)p, f->base[p]);
}

static void rt_check_file(const char *path, uint32_t alignment, const struct rt_values *v)
{
    struct gguf_file *f = NULL;
    int rc = gguf_open(path, &f);

    CHECK(rc == 0, "gguf_open(%s): %s", path, err_msg());
    if (rc)
        return;
    CHECK(f->version == 3 && f->alignment == alignment, "version %u alignment %llu",
          f->version, (unsigned long long)f->alignment);
    CHECK((gguf_find_kv(f, "general.alignment") != NULL) == (alignment != 32),
          "general.alignment written only when not the default");
    CHECK(f->n_kv == 2 * N_SCALAR_TYPES + 8 + (alignment != 32), "%llu keys",
          (unsigned long long)f->n_kv);
    rt_check_typed(f, v);
    rt_check_getters(f);
    rt_check_tensors(f);
    CHECK(LLVMFuzzerTestOneInput(f->base, f->size) == 0, "fuzz walk");
    gguf_close(f);
}

static struct gguf_writer *rt_writer_open(const char *path, uint32_t alignment,
                                          const struct rt_values *v)
{
    struct gguf_writer *w = NULL;
    int rc = gguf_writer_open(path, alignment, &w);

    if (rc == 0)
        rc = rt_add_kvs(w, v);
    for (size_t i = 0; i < N_RT && rc >= 0; i++) {
        const struct rt_tensor *t = &rt_tensors[i];
        rc = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne);
        CHECK(rc == (int)i, "add_tensor %s: %d %s", t->name, rc, err_msg());
    }
    if (rc >= 0)
        rc = gguf_writer_begin_data(w);
    CHECK(rc >= 0, "writer setup for %s: %s", path, err_msg());
    if (rc < 0) {
        gguf_writer_abort(w);
        return NULL;
    }
    return w;
}

/* Sequential writes in random chunks that cross tensor boundaries. */
static void rt_write_sequential(struct rng *r, const char *path, const struct rt_values *v)
{
    struct gguf_writer *w = rt_writer_open(path, 64, v);
    int rc = 0;

    if (!w)
        return;
    for (size_t i = 0; i < N_RT && rc == 0; i++) {
        const struct rt_tensor *t = &rt_tensors[i];
        uint64_t done = 0;
        while (done < t->size && rc == 0) {
            uint64_t n = 1 + rng_below(r, 200);
            n = n > t->size - done ? t->size - done : n;
            rc = gguf_writer_write(w, t->data + done, n);
            done += n;
        }
    }
    CHECK(rc == 0, "write: %s", err_msg());
    rc = gguf_writer_write(w, "x", 1);
    CHECK(rc == -EINVAL && *err_msg(), "write past the last tensor: %d", rc);
    CHECK(temp_of_exists(path) && !file_exists(path), "before finish only the temp file exists");
    rc = gguf_writer_finish(w);
    CHECK(rc == 0, "finish: %s", err_msg());
    CHECK(!temp_of_exists(path), "temp file of %s left behind", path);
    rt_check_file(path, 64, v);
}

struct rt_job {
    struct gguf_writer *w;
    int tid, n_threads;
    int rc;
};

#define RT_CHUNK 37

/* Thread tid writes chunks tid, tid + n_threads, ... of every tensor. */
static void *rt_pwrite_thread(void *arg)
{
    struct rt_job *job = arg;

    for (size_t i = 0; i < N_RT && job->rc == 0; i++) {
        const struct rt_tensor *t = &rt_tensors[i];
        for (uint64_t at = (uint64_t)job->tid * RT_CHUNK; at < t->size && job->rc == 0;
             at += (uint64_t)job->n_threads * RT_CHUNK) {
            uint64_t n = t->size - at < RT_CHUNK ? t->size - at : RT_CHUNK;
            job->rc = gguf_writer_pwrite(job->w, (int)i, at, t->data + at, n);
        }
    }
    return NULL;
}

static void rt_write_threads(const char *path, const struct rt_values *v)
{
    enum { N_THREADS = 4 };
    struct gguf_writer *w = rt_writer_open(path, 0, v);
    struct rt_job jobs[N_THREADS];
    pthread_t th[N_THREADS];
    uint64_t off = 0, size = 0;

    if (!w)
        return;
    for (int i = 0; i < N_THREADS; i++) {
        jobs[i] = (struct rt_job){.w = w, .tid = i, .n_threads = N_THREADS};
        pthread_create(&th[i], NULL, rt_pwrite_thread, &jobs[i]);
    }
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].rc == 0, "thread %d: %d", i, jobs[i].rc);
    }
    CHECK(gguf_writer_tensor_extent(w, 1, &off, &size) == 0 && size == rt_tensors[1].size &&
              off % 32 == 0, "extent");
    CHECK(gguf_writer_pwrite(w, 1, size - 1, "ab", 2) == -EINVAL &&
              strstr(err_msg(), rt_tensors[1].name), "pwrite past the tensor end");
    CHECK(gguf_writer_pwrite(w, (int)N_RT, 0, "a", 1) == -EINVAL, "bad tensor index");
    CHECK(gguf_writer_finish(w) == 0, "finish: %s", err_msg());
    CHECK(!temp_of_exists(path), "temp file of %s left behind", path);
    rt_check_file(path, 32, v);
}

/* Every rule the writer enforces fails with a message, and abort leaves nothing. */
static void rt_writer_errors(const char *path)
{
    static const uint64_t ne_bad[] = {33, 2}, ne_ok[] = {32, 2}, ne5[] = {1, 1, 1, 1, 1};
    struct gguf_writer *w = NULL;
    int rc;

    CHECK(gguf_writer_open(path, 3, &w) == -EINVAL && w == NULL, "alignment 3");
    CHECK(gguf_writer_open(path, 32, &w) == 0, "open: %s", err_msg());
    if (!w)
        return;
    CHECK(gguf_writer_add_u32(w, "k", 1) == 0, "k");
    CHECK(gguf_writer_add_str(w, "k", "x") == -EINVAL && strstr(err_msg(), "'k'"), "dup key");
    CHECK(gguf_writer_add_u32(w, "", 1) == -EINVAL, "empty key");
    CHECK(gguf_writer_add_u32(w, "general.alignment", 64) == -EINVAL, "alignment key");
    CHECK(gguf_writer_add_arr(w, "a", GGUF_TYPE_STRING, "x", 1) == -EINVAL, "string as fixed");
    CHECK(gguf_writer_add_arr(w, "b", GGUF_TYPE_BOOL, "\x02", 1) == -EINVAL, "bool 2");
    CHECK(gguf_writer_add_tensor(w, "t", QUANT_Q8_0, 2, ne_bad) < 0 && strstr(err_msg(), "'t'"),
          "ne0 33 for Q8_0");
    CHECK(gguf_writer_add_tensor(w, "t", 4, 2, ne_ok) < 0, "retired type id 4");
    CHECK(gguf_writer_add_tensor(w, "t", QUANT_F32, 0, ne_ok) < 0, "n_dims 0");
    CHECK(gguf_writer_add_tensor(w, "t", QUANT_F32, 5, ne5) < 0, "n_dims 5");
    CHECK(gguf_writer_add_tensor(w, "t", QUANT_Q8_0, 2, ne_ok) == 0, "t: %s", err_msg());
    CHECK(gguf_writer_add_tensor(w, "t", QUANT_Q8_0, 2, ne_ok) < 0, "duplicate tensor");
    CHECK(gguf_writer_add_tensor(w, "u", QUANT_F32, 2, ne_ok) == 1, "u: %s", err_msg());
    CHECK(gguf_writer_write(w, "x", 1) == -EINVAL, "write before begin_data");
    CHECK(gguf_writer_begin_data(w) == 0, "begin_data: %s", err_msg());
    CHECK(gguf_writer_add_u32(w, "late", 1) == -EINVAL, "key after begin_data");
    CHECK(gguf_writer_write(w, "xyz", 3) == 0, "write");
    CHECK(temp_of_exists(path), "temp file exists while writing");
    gguf_writer_abort(w);
    CHECK(!temp_of_exists(path) && !file_exists(path), "abort left a file behind");

    /* A finish with the sequential stream incomplete fails and leaves nothing. */
    CHECK(gguf_writer_open(path, 32, &w) == 0, "open: %s", err_msg());
    if (!w)
        return;
    gguf_writer_add_tensor(w, "t", QUANT_Q8_0, 2, ne_ok);
    gguf_writer_begin_data(w);
    gguf_writer_write(w, "xyz", 3);
    rc = gguf_writer_finish(w);
    CHECK(rc == -EINVAL && strstr(err_msg(), "'t'") && strstr(err_msg(), "byte 3"), "%d %s", rc,
          err_msg());
    CHECK(!temp_of_exists(path) && !file_exists(path), "failed finish left a file behind");
}

static void test_roundtrip(uint64_t seed)
{
    struct rng r;
    struct rt_values *v = calloc(1, sizeof(*v));
    char p1[512], p2[512], p3[512];

    rng_seed(&r, seed, 1);
    rt_values_draw(&r, v);
    rt_tensors_draw(&r);
    rt_write_sequential(&r, tmp_file(p1, sizeof(p1), "seq.gguf"), v);
    rt_write_threads(tmp_file(p2, sizeof(p2), "threads.gguf"), v);
    rt_writer_errors(tmp_file(p3, sizeof(p3), "aborted.gguf"));
    free(v);
}

/* ---- (c) malformed corpus ------------------------------------------------------------------ */

/* The valid base file: its bytes and where its fields are. */
struct base {
    uint8_t *buf;
    uint64_t size;
    uint64_t end;          /* end of the last tensor's data */
    struct gguf_file *f;   /* parsed view of buf */
};

static int base_build(const char *path, struct base *b)
{
    static const uint64_t ne0[] = {8, 2}, ne1[] = {32, 2};
    static const int32_t arr[] = {1, 2, 3};
    static const char *const strs[] = {"x", "yy"};
    static const uint8_t zeros[64 + 68];
    struct gguf_writer *w = NULL;
    int rc = gguf_writer_open(path, 64, &w);

    if (rc)
        return rc;
    gguf_writer_add_str(w, "general.architecture", "test");
    gguf_writer_add_u32(w, "kv.u32", 7);
    gguf_writer_add_i32(w, "kv.i32", -5);
    gguf_writer_add_bool(w, "kv.bool", true);
    gguf_writer_add_arr(w, "kv.arr", GGUF_TYPE_INT32, arr, 3);
    gguf_writer_add_arr_str(w, "kv.strs", strs, NULL, 2);
    gguf_writer_add_tensor(w, "t0", QUANT_F32, 2, ne0);
    gguf_writer_add_tensor(w, "t1", QUANT_Q8_0, 2, ne1);
    gguf_writer_begin_data(w);
    gguf_writer_write(w, zeros, 64 + 68);
    rc = gguf_writer_finish(w);
    if (rc)
        return rc;
    b->buf = file_read(path, &b->size);
    if (!b->buf)
        return -EIO;
    rc = gguf_open_memory(b->buf, b->size, &b->f);
    if (rc == 0)
        b->end = b->f->data_offset + b->f->tensors[1].offset + b->f->tensors[1].size;
    return rc;
}

/* Byte offsets of the fields of a KV record and a tensor info in the base file. */
static uint64_t kv_type_at(const struct base *b, const char *key)
{
    return gguf_find_kv(b->f, key)->offset + 8 + strlen(key);
}

static uint64_t kv_value_at(const struct base *b, const char *key)
{
    return kv_type_at(b, key) + 4;
}

static uint64_t ti_ndims_at(const struct base *b, const char *name)
{
    return gguf_find_tensor(b->f, name)->info_offset + 8 + strlen(name);
}

static uint64_t ti_dim_at(const struct base *b, const char *name, int d)
{
    return ti_ndims_at(b, name) + 4 + 8 * (uint64_t)d;
}

static uint64_t ti_type_at(const struct base *b, const char *name)
{
    return ti_dim_at(b, name, (int)gguf_find_tensor(b->f, name)->n_dims);
}

static uint64_t ti_offset_at(const struct base *b, const char *name)
{
    return ti_type_at(b, name) + 4;
}

struct patch {
    uint64_t at;
    uint64_t value;
    int width; /* bytes: 1, 4 or 8; 0 ends the list */
};

struct bad_case {
    const char *what;
    struct patch p[2];
    const char *expect[2]; /* substrings the message must contain (NULL: none) */
};

/* Opens buf (exact size, malloc'ed), expects failure with a message containing expect[]. */
static void expect_reject(const char *what, uint8_t *buf, uint64_t size,
                          const char *const expect[2])
{
    struct gguf_file *f = NULL;
    int rc;

    err_clear();
    rc = gguf_open_memory(buf, size, &f);
    CHECK(rc < 0 && rc > -4096 && f == NULL, "%s: accepted (rc %d)", what, rc);
    if (rc == 0)
        gguf_close(f);
    CHECK(err_msg()[0] != '\0', "%s: empty message", what);
    for (int i = 0; i < 2; i++) {
        CHECK(!expect[i] || strstr(err_msg(), expect[i]), "%s: message '%s' lacks '%s'", what,
              err_msg(), expect[i]);
    }
    LLVMFuzzerTestOneInput(buf, size);
}

static void run_bad_case(const struct base *b, const struct bad_case *c)
{
    uint8_t *buf = malloc(b->size);

    memcpy(buf, b->buf, b->size);
    for (int i = 0; i < 2 && c->p[i].width; i++) {
        CHECK(c->p[i].at + (uint64_t)c->p[i].width <= b->size, "%s: patch outside", c->what);
        memcpy(buf + c->p[i].at, &c->p[i].value, (size_t)c->p[i].width);
    }
    expect_reject(c->what, buf, b->size, c->expect);
    free(buf);
}

#define P1(at, v, w) {{(at), (v), (w)}, {0, 0, 0}}

static void bad_header_cases(const struct base *b)
{
    const struct bad_case cases[] = {
        {"bad magic", P1(0, 'X', 1), {"magic", NULL}},
        {"version 1", P1(4, 1, 4), {"version 1", NULL}},
        {"version 0x03000000", P1(4, 0x03000000, 4), {"big-endian", NULL}},
        {"version 4", P1(4, 4, 4), {"version 4", NULL}},
        {"tensor_count 2^62", P1(8, 1ull << 62, 8), {"cannot fit", NULL}},
        {"kv_count 2^62", P1(16, 1ull << 62, 8), {"cannot fit", NULL}},
        {"kv_count + 1", P1(16, b->f->n_kv + 1, 8), {NULL, NULL}},
        {"tensor_count + 1", P1(8, b->f->n_tensors + 1, 8), {NULL, NULL}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        run_bad_case(b, &cases[i]);
}

static void bad_kv_cases(const struct base *b)
{
    const uint64_t arch = gguf_find_kv(b->f, "general.architecture")->offset;
    const uint64_t i32_key = gguf_find_kv(b->f, "kv.i32")->offset + 8;
    const struct bad_case cases[] = {
        {"key length 2^63", P1(arch, 1ull << 63, 8), {"key #", "runs past"}},
        {"key length past end", P1(arch, b->size, 8), {"key #", "runs past"}},
        {"key length 0", P1(arch, 0, 8), {"key #", "outside 1.."}},
        {"key with NUL", P1(i32_key + 1, 0, 1), {"NUL", NULL}},
        {"string length 2^63", P1(kv_value_at(b, "general.architecture"), 1ull << 63, 8),
         {"general.architecture", "runs past"}},
        {"string length past end", P1(kv_value_at(b, "general.architecture"), b->size, 8),
         {"general.architecture", "runs past"}},
        {"unknown value type", P1(kv_type_at(b, "kv.u32"), 13, 4), {"kv.u32", "value type"}},
        {"bool value 2", P1(kv_value_at(b, "kv.bool"), 2, 1), {"kv.bool", "not 0 or 1"}},
        {"nested array", P1(kv_value_at(b, "kv.arr"), GGUF_TYPE_ARRAY, 4), {"kv.arr", "nested"}},
        {"unknown element type", P1(kv_value_at(b, "kv.arr"), 13, 4), {"kv.arr", "element"}},
        {"array count 2^62", P1(kv_value_at(b, "kv.arr") + 4, 1ull << 62, 8), {"kv.arr", NULL}},
        {"string array count 2^62", P1(kv_value_at(b, "kv.strs") + 4, 1ull << 62, 8),
         {"kv.strs", NULL}},
        {"string element length 2^63", P1(kv_value_at(b, "kv.strs") + 12, 1ull << 63, 8),
         {"kv.strs", "runs past"}},
        {"duplicate key", P1(i32_key + 3, 'u', 1), {"duplicate key 'kv.u32'", NULL}},
        {"alignment 0", P1(kv_value_at(b, "general.alignment"), 0, 4),
         {"general.alignment", "power of two"}},
        {"alignment 3", P1(kv_value_at(b, "general.alignment"), 3, 4),
         {"general.alignment", "power of two"}},
        {"alignment as INT32", P1(kv_type_at(b, "general.alignment"), GGUF_TYPE_INT32, 4),
         {"general.alignment", "UINT32"}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        run_bad_case(b, &cases[i]);
}

static void bad_tensor_cases(const struct base *b)
{
    const uint64_t t0 = gguf_find_tensor(b->f, "t0")->info_offset;
    const uint64_t t1 = gguf_find_tensor(b->f, "t1")->info_offset;
    const uint64_t t1_off = gguf_find_tensor(b->f, "t1")->offset;
    const struct bad_case cases[] = {
        {"name length 64", P1(t0, 64, 8), {"tensor #0", "outside 1..63"}},
        {"name length 2^63", P1(t0, 1ull << 63, 8), {"tensor #0", "runs past"}},
        {"n_dims 5", P1(ti_ndims_at(b, "t0"), 5, 4), {"'t0'", "n_dims"}},
        {"n_dims 0", P1(ti_ndims_at(b, "t0"), 0, 4), {"'t0'", "n_dims"}},
        {"dim 0", P1(ti_dim_at(b, "t0", 1), 0, 8), {"'t0'", "dimension 1"}},
        {"dim 2^63", P1(ti_dim_at(b, "t0", 0), 1ull << 63, 8), {"'t0'", "dimension 0"}},
        {"dims product overflows",
         {{ti_dim_at(b, "t0", 0), 1ull << 31, 8}, {ti_dim_at(b, "t0", 1), 1ull << 31, 8}},
         {"'t0'", "overflow"}},
        {"row bytes overflow", P1(ti_dim_at(b, "t0", 0), 1ull << 62, 8), {"'t0'", "overflow"}},
        {"ne0 not a block multiple", P1(ti_dim_at(b, "t1", 0), 33, 8), {"'t1'", "multiple"}},
        {"unknown type id", P1(ti_type_at(b, "t0"), 99, 4), {"'t0'", "unknown type id 99"}},
        {"retired type id", P1(ti_type_at(b, "t0"), 4, 4), {"'t0'", "unknown type id 4"}},
        {"misaligned offset", P1(ti_offset_at(b, "t1"), t1_off + 1, 8), {"'t1'", "alignment"}},
        {"data out of range", P1(ti_offset_at(b, "t1"), t1_off + 64 * 1000, 8),
         {"'t1'", "past end of file"}},
        {"offset near 2^64", P1(ti_offset_at(b, "t1"), ~63ull, 8), {"'t1'", "overflow"}},
        {"overlapping tensors", P1(ti_offset_at(b, "t1"), 0, 8), {"overlaps", "'t0'"}},
        {"partial overlap",
         {{kv_value_at(b, "general.alignment"), 32, 4}, {ti_offset_at(b, "t1"), 32, 8}},
         {"overlaps", "'t1'"}},
        {"duplicate tensor name", P1(t1 + 9, '0', 1), {"duplicate tensor name 't0'", NULL}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        run_bad_case(b, &cases[i]);
}

/* The same file labelled version 2 (identical layout to v3 for little-endian files). */
static void v2_accepted(const struct base *b)
{
    uint8_t *buf = malloc(b->size);
    struct gguf_file *f = NULL;
    int rc;

    memcpy(buf, b->buf, b->size);
    buf[4] = 2;
    rc = gguf_open_memory(buf, b->size, &f);
    CHECK(rc == 0 && f->version == 2 && f->n_tensors == 2, "v2: %d %s", rc, err_msg());
    gguf_close(f);
    free(buf);
}

/* Every prefix shorter than the end of the last tensor must be rejected. */
static void bad_truncations(const struct base *b)
{
    static const char *const expect[2] = {"byte", NULL};
    char what[64];

    for (uint64_t n = 0; n < b->end; n++) {
        uint8_t *buf = malloc(n ? n : 1);
        memcpy(buf, b->buf, n);
        snprintf(what, sizeof(what), "truncated to %llu bytes", (unsigned long long)n);
        expect_reject(what, buf, n, expect);
        free(buf);
    }
}

/* Random byte flips in the header, KV and info sections: reject cleanly or parse cleanly. */
static void random_flips(const struct base *b, uint64_t seed, int iterations)
{
    struct rng r;
    uint8_t *buf = malloc(b->size);
    int accepted = 0;

    rng_seed(&r, seed, 2);
    for (int it = 0; it < iterations; it++) {
        struct gguf_file *f = NULL;
        int flips = 1 + (int)rng_below(&r, 4), rc;

        memcpy(buf, b->buf, b->size);
        for (int k = 0; k < flips; k++)
            buf[rng_below(&r, (uint32_t)b->f->data_offset)] = (uint8_t)rng_u32(&r);
        err_clear();
        rc = gguf_open_memory(buf, b->size, &f);
        CHECK(rc == 0 || (rc < 0 && err_msg()[0]), "flip %d: rc %d without a message", it, rc);
        accepted += rc == 0;
        gguf_close(f);
        LLVMFuzzerTestOneInput(buf, b->size);
    }
    printf("test_gguf: %d random byte-flip files, %d still valid\n", iterations, accepted);
    free(buf);
}

static void test_malformed(uint64_t seed)
{
    char path[512];
    struct base b = {0};
    struct gguf_file *f = NULL;
    int rc = base_build(tmp_file(path, sizeof(path), "base.gguf"), &b);

    CHECK(rc == 0, "base file: %s", err_msg());
    if (rc)
        return;
    v2_accepted(&b);
    bad_header_cases(&b);
    bad_kv_cases(&b);
    bad_tensor_cases(&b);
    bad_truncations(&b);
    random_flips(&b, seed, 20000);

    /* Through gguf_open, the message starts with the path. */
    if (truncate(path, (off_t)b.end - 1) == 0) {
        rc = gguf_open(path, &f);
        CHECK(rc == -EINVAL && strncmp(err_msg(), path, strlen(path)) == 0 &&
                  strstr(err_msg(), "'t1'"), "%d %s", rc, err_msg());
    }
    CHECK(gguf_open(tmp_file(path, sizeof(path), "missing.gguf"), &f) == -ENOENT, "missing");
    CHECK(gguf_open(tmp_dir, &f) == -EINVAL && f == NULL, "directory");
    gguf_close(b.f);
    free(b.buf);
}

/* ---- (d) strata inspect -------------------------------------------------------------------- */

static int run_cli(const char *args, const char *out_path)
{
    char cmd[2048];
    int st;

    snprintf(cmd, sizeof(cmd), "'%s' %s > '%s' 2>&1", STRATA_BINARY, args, out_path);
    st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool file_contains(const char *path, const char *needle)
{
    uint64_t n = 0;
    uint8_t *buf = file_read(path, &n);
    bool hit = buf && memmem(buf, n, needle, strlen(needle)) != NULL;
    free(buf);
    return hit;
}

static void test_inspect(void)
{
    char golden[512], out[512], bad[512], args[1200], seq[512];
    int rc;

    if (access(STRATA_BINARY, X_OK) != 0) {
        printf("test_gguf: %s not built, skipping the inspect checks\n", STRATA_BINARY);
        return;
    }
    test_data_path(golden, sizeof(golden), "quant-golden.gguf");
    tmp_file(out, sizeof(out), "inspect.txt");
    snprintf(args, sizeof(args), "inspect '%s' --tensors", golden);
    rc = run_cli(args, out);
    CHECK(rc == 0 && file_contains(out, "BF16.f32") && file_contains(out, "golden"),
          "inspect golden: exit %d", rc);
    snprintf(args, sizeof(args), "inspect '%s'", tmp_file(seq, sizeof(seq), "seq.gguf"));
    rc = run_cli(args, out);
    CHECK(rc == 0 && file_contains(out, "blk.0.ffn_up_exps.weight") &&
              file_contains(out, "experts"), "inspect seq.gguf: exit %d", rc);
    snprintf(args, sizeof(args), "inspect '%s'", tmp_file(bad, sizeof(bad), "base.gguf"));
    rc = run_cli(args, out);
    CHECK(rc == 1 && file_contains(out, "strata: ") && file_contains(out, "'t1'"),
          "inspect of a truncated file: exit %d", rc);
    rc = run_cli("inspect --help", out);
    CHECK(rc == 0 && file_contains(out, "--kv-full"), "inspect --help: exit %d", rc);
}

static void tmp_dir_remove(void)
{
    static const char *const names[] = {"seq.gguf", "threads.gguf", "base.gguf", "inspect.txt"};
    char p[512];

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        unlink(tmp_file(p, sizeof(p), names[i]));
    CHECK(rmdir(tmp_dir) == 0, "%s not empty at the end", tmp_dir);
}

int main(void)
{
    uint64_t seed = test_seed("test_gguf");

    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_golden();
    test_roundtrip(seed);
    test_malformed(seed);
    test_inspect();
    tmp_dir_remove();
    for (size_t i = 0; i < N_RT; i++)
        free(rt_tensors[i].data);
    return test_finish("test_gguf");
}
