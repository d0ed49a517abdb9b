/* gguf: the reader. The writer is in gguf_write.c.
 *
 * The file is parsed once, front to back, through a cursor whose read helpers check the bytes
 * left before every read. Nothing is allocated in proportion to a count read from the file
 * before that count has been checked against the bytes left; the kv, tensor and string-array
 * tables also grow as records are actually parsed, so memory follows the bytes consumed.
 *
 * Messages: the cursor reports "truncated at byte P: ..." and the record parsers prefix it
 * with the record ("key 'k' (record at byte N): ", "tensor 't' (info at byte N): "); gguf_open
 * prefixes the path. Data ranges are printed as absolute file offsets.
 *
 * Choices where the format is loose (also listed in gguf.h):
 * - an empty tensor (some ne == 0) is rejected: no model has one, and every tensor then owns a
 *   nonempty byte range, which makes the overlap check exact;
 * - dims above INT64_MAX are rejected (ggml stores ne as int64_t);
 * - tensor names longer than GGUF_NAME_MAX are rejected, as ggml does;
 * - tensor data may come in any order with gaps; only alignment, bounds and overlap are checked;
 * - a file without tensors may end before the padded data start.
 */
#include "gguf.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errors.h"
#include "quant.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads little-endian fields with memcpy: port the cursor to a big-endian host"
#endif

#define KV_MIN_BYTES 14     /* key len (8) + 1 key byte + type (4) + a 1-byte value */
#define TENSOR_MIN_BYTES 33 /* name len (8) + 1 name byte + n_dims (4) + 1 dim + type + offset */

/* The file plus what only the reader needs: sorted views for lookup. */
struct gguf_file_impl {
    struct gguf_file pub;
    const struct gguf_kv **kv_by_key;          /* (n_kv) sorted by key, owned */
    const struct gguf_tensor **tensor_by_name; /* (n_tensors) sorted by name, owned */
};

static struct gguf_file_impl *impl_of(const struct gguf_file *f)
{
    return (struct gguf_file_impl *)((char *)f - offsetof(struct gguf_file_impl, pub));
}

typedef unsigned long long ull; /* for printf of uint64_t */

/* ---- cursor -------------------------------------------------------------------------------- */

struct cursor {
    const uint8_t *base; /* (size) the whole file */
    uint64_t size;
    uint64_t pos;
};

static uint64_t cur_left(const struct cursor *c)
{
    return c->size - c->pos;
}

/* Takes n bytes: *p points at them. */
static int cur_take(struct cursor *c, uint64_t n, const void **p, const char *what)
{
    if (n > cur_left(c))
        return err_set(-EINVAL, "truncated at byte %llu: %s needs %llu bytes, file has %llu",
                       (ull)c->pos, what, (ull)n, (ull)c->size);
    *p = c->base + c->pos;
    c->pos += n;
    return 0;
}

static int cur_u32(struct cursor *c, uint32_t *v, const char *what)
{
    const void *p = NULL;
    int rc = cur_take(c, sizeof(*v), &p, what);
    if (rc == 0)
        memcpy(v, p, sizeof(*v));
    return rc;
}

static int cur_u64(struct cursor *c, uint64_t *v, const char *what)
{
    const void *p = NULL;
    int rc = cur_take(c, sizeof(*v), &p, what);
    if (rc == 0)
        memcpy(v, p, sizeof(*v));
    return rc;
}

static int cur_str(struct cursor *c, struct gguf_str *s, const char *what)
{
    uint64_t at = c->pos;
    const void *p = NULL;
    int rc = cur_u64(c, &s->len, what);
    if (rc)
        return rc;
    if (s->len > cur_left(c))
        return err_set(-EINVAL, "%s at byte %llu: length %llu runs past the end of the file "
                       "(%llu bytes left)", what, (ull)at, (ull)s->len, (ull)cur_left(c));
    rc = cur_take(c, s->len, &p, what);
    s->ptr = p;
    return rc;
}

/* Reads a key or tensor name into a NUL-terminated copy: 1..max bytes, no NUL inside. */
static int cur_name(struct cursor *c, uint64_t max, char **out, const char *what)
{
    uint64_t at = c->pos;
    struct gguf_str s = {0};
    int rc = cur_str(c, &s, what);
    if (rc)
        return rc;
    if (s.len == 0 || s.len > max)
        return err_set(-EINVAL, "%s at byte %llu: length %llu is outside 1..%llu", what,
                       (ull)at, (ull)s.len, (ull)max);
    if (memchr(s.ptr, '\0', s.len))
        return err_set(-EINVAL, "%s at byte %llu contains a NUL byte", what, (ull)at);
    *out = strndup(s.ptr, s.len);
    if (!*out)
        return err_set(-ENOMEM, "out of memory copying %s", what);
    return 0;
}

/* Returns arr with room for n + 1 elements of elem bytes (capacity *cap; new room zeroed),
 * or NULL with a message (arr is then unchanged and still the caller's). */
static void *table_grow(void *arr, uint64_t *cap, uint64_t n, size_t elem)
{
    uint64_t new_cap = *cap ? *cap * 2 : 16;
    char *p;

    if (n < *cap)
        return arr;
    p = realloc(arr, new_cap * elem);
    if (!p) {
        err_set(-ENOMEM, "out of memory growing a table to %llu entries", (ull)new_cap);
        return NULL;
    }
    memset(p + *cap * elem, 0, (new_cap - *cap) * elem);
    *cap = new_cap;
    return p;
}

/* ---- values -------------------------------------------------------------------------------- */

static const uint8_t type_size[GGUF_TYPE_COUNT] = {
    [GGUF_TYPE_UINT8] = 1,   [GGUF_TYPE_INT8] = 1,    [GGUF_TYPE_UINT16] = 2,
    [GGUF_TYPE_INT16] = 2,   [GGUF_TYPE_UINT32] = 4,  [GGUF_TYPE_INT32] = 4,
    [GGUF_TYPE_FLOAT32] = 4, [GGUF_TYPE_BOOL] = 1,    [GGUF_TYPE_UINT64] = 8,
    [GGUF_TYPE_INT64] = 8,   [GGUF_TYPE_FLOAT64] = 8,
};

static const char *const type_names[GGUF_TYPE_COUNT] = {
    "UINT8", "INT8",   "UINT16", "INT16", "UINT32", "INT32",   "FLOAT32",
    "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64", "FLOAT64",
};

const char *gguf_value_type_name(enum gguf_value_type t)
{
    return (unsigned)t < GGUF_TYPE_COUNT ? type_names[t] : "unknown";
}

uint64_t gguf_value_type_size(enum gguf_value_type t)
{
    return (unsigned)t < GGUF_TYPE_COUNT ? type_size[t] : 0;
}

/* Decodes a fixed-size value of type t from raw LE bytes p (type_size[t] of them). */
static void value_decode(enum gguf_value_type t, const uint8_t *p, struct gguf_value *v)
{
    union {
        uint16_t u16;
        uint32_t u32;
        uint64_t u64;
        int16_t i16;
        int32_t i32;
        int64_t i64;
        float f32;
        double f64;
    } x;

    memcpy(&x, p, type_size[t]);
    v->type = t;
    switch (t) {
    case GGUF_TYPE_UINT8: v->u64 = p[0]; break;
    case GGUF_TYPE_BOOL: v->u64 = p[0]; break;
    case GGUF_TYPE_INT8: v->i64 = (int8_t)p[0]; break;
    case GGUF_TYPE_UINT16: v->u64 = x.u16; break;
    case GGUF_TYPE_INT16: v->i64 = x.i16; break;
    case GGUF_TYPE_UINT32: v->u64 = x.u32; break;
    case GGUF_TYPE_INT32: v->i64 = x.i32; break;
    case GGUF_TYPE_UINT64: v->u64 = x.u64; break;
    case GGUF_TYPE_INT64: v->i64 = x.i64; break;
    case GGUF_TYPE_FLOAT32: v->f64 = x.f32; break;
    case GGUF_TYPE_FLOAT64: v->f64 = x.f64; break;
    default: break;
    }
}

static int check_bools(const uint8_t *p, uint64_t n, uint64_t at)
{
    for (uint64_t i = 0; i < n; i++) {
        if (p[i] > 1)
            return err_set(-EINVAL, "BOOL value %u at byte %llu is not 0 or 1", p[i],
                           (ull)(at + i));
    }
    return 0;
}

static int read_scalar(struct cursor *c, enum gguf_value_type t, struct gguf_value *v)
{
    uint64_t at = c->pos;
    const void *p = NULL;
    int rc = cur_take(c, type_size[t], &p, type_names[t]);
    if (rc == 0)
        rc = t == GGUF_TYPE_BOOL ? check_bools(p, 1, at) : 0;
    if (rc == 0)
        value_decode(t, p, v);
    return rc;
}

static int read_str_array(struct cursor *c, uint64_t count, struct gguf_value *v)
{
    struct gguf_str *strs = NULL;
    uint64_t cap = 0;
    int rc = 0;

    if (count > cur_left(c) / sizeof(uint64_t))
        return err_set(-EINVAL, "array of %llu STRINGs at byte %llu cannot fit in the %llu "
                       "bytes left", (ull)count, (ull)c->pos, (ull)cur_left(c));
    for (uint64_t i = 0; i < count && rc == 0; i++) {
        struct gguf_str *grown = table_grow(strs, &cap, i, sizeof(*strs));
        if (!grown) {
            rc = -ENOMEM;
            break;
        }
        strs = grown;
        rc = cur_str(c, &strs[i], "array STRING element");
    }
    if (rc) {
        free(strs);
        return rc;
    }
    v->arr.strs = strs;
    return 0;
}

static int read_array(struct cursor *c, struct gguf_value *v)
{
    uint32_t et;
    uint64_t count, at;
    const void *p = NULL;
    int rc = cur_u32(c, &et, "array element type");

    if (rc == 0)
        rc = cur_u64(c, &count, "array count");
    if (rc)
        return rc;
    if (et >= GGUF_TYPE_COUNT)
        return err_set(-EINVAL, "unknown array element type %u at byte %llu", et,
                       (ull)(c->pos - 12));
    if (et == GGUF_TYPE_ARRAY)
        return err_set(-EINVAL, "nested array at byte %llu is not supported",
                       (ull)(c->pos - 12));
    v->type = GGUF_TYPE_ARRAY;
    v->arr.elem_type = et;
    v->arr.count = count;
    if (et == GGUF_TYPE_STRING)
        return read_str_array(c, count, v);

    at = c->pos;
    if (count > cur_left(c) / type_size[et])
        return err_set(-EINVAL, "array of %llu %s elements at byte %llu runs past the end of "
                       "the file (%llu bytes left)", (ull)count, type_names[et], (ull)at,
                       (ull)cur_left(c));
    rc = cur_take(c, count * type_size[et], &p, "array elements");
    if (rc == 0 && et == GGUF_TYPE_BOOL)
        rc = check_bools(p, count, at);
    v->arr.data = p;
    return rc;
}

static int read_value(struct cursor *c, struct gguf_value *v)
{
    uint32_t t;
    int rc = cur_u32(c, &t, "value type");
    if (rc)
        return rc;
    if (t >= GGUF_TYPE_COUNT)
        return err_set(-EINVAL, "unknown value type %u at byte %llu", t, (ull)(c->pos - 4));
    if (t == GGUF_TYPE_ARRAY)
        return read_array(c, v);
    if (t == GGUF_TYPE_STRING) {
        v->type = GGUF_TYPE_STRING;
        return cur_str(c, &v->str, "STRING value");
    }
    return read_scalar(c, t, v);
}

/* ---- records ------------------------------------------------------------------------------- */

static int read_kvs(struct cursor *c, struct gguf_file *f, uint64_t n_kv)
{
    uint64_t cap = 0;

    for (uint64_t i = 0; i < n_kv; i++) {
        struct gguf_kv *kv = table_grow(f->kv, &cap, i, sizeof(*f->kv));
        int rc;

        if (!kv)
            return -ENOMEM;
        f->kv = kv;
        kv = &f->kv[i];
        kv->offset = c->pos;
        rc = cur_name(c, GGUF_KEY_MAX, &kv->key, "key");
        if (rc)
            return err_wrap(rc, "key #%llu (record at byte %llu): ", (ull)i, (ull)kv->offset);
        f->n_kv = i + 1; /* the key (and any string index) is now freed by gguf_close */
        rc = read_value(c, &kv->value);
        if (rc)
            return err_wrap(rc, "key '%s' (record at byte %llu): ", kv->key, (ull)kv->offset);
    }
    return 0;
}

static int read_dims(struct cursor *c, struct gguf_tensor *t)
{
    int rc = cur_u32(c, &t->n_dims, "n_dims");
    if (rc)
        return rc;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return err_set(-EINVAL, "n_dims %u at byte %llu is outside 1..%d", t->n_dims,
                       (ull)(c->pos - 4), GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        rc = cur_u64(c, &t->ne[d], "dimension");
        if (rc)
            return rc;
        if (t->ne[d] == 0 || t->ne[d] > INT64_MAX)
            return err_set(-EINVAL, "dimension %u = %llu at byte %llu is outside 1..2^63-1", d,
                           (ull)t->ne[d], (ull)(c->pos - 8));
    }
    return 0;
}

/* The fields after the name: dims, type, offset; then the size from the type table. */
static int read_tensor_fields(struct cursor *c, struct gguf_tensor *t, uint64_t alignment)
{
    int rc = read_dims(c, t);

    if (rc == 0)
        rc = cur_u32(c, &t->type, "type");
    if (rc)
        return rc;
    if (!quant_type_find(t->type))
        return err_set(-EINVAL, "unknown type id %u at byte %llu", t->type, (ull)(c->pos - 4));
    rc = cur_u64(c, &t->offset, "offset");
    if (rc == 0)
        rc = quant_tensor_bytes(t->type, t->n_dims, t->ne, &t->size);
    if (rc)
        return rc;
    if (t->offset % alignment)
        return err_set(-EINVAL, "data offset %llu is not a multiple of the alignment %llu",
                       (ull)t->offset, (ull)alignment);
    return 0;
}

static int read_tensor_infos(struct cursor *c, struct gguf_file *f, uint64_t n_tensors)
{
    uint64_t cap = 0;

    for (uint64_t i = 0; i < n_tensors; i++) {
        struct gguf_tensor *t = table_grow(f->tensors, &cap, i, sizeof(*f->tensors));
        int rc;

        if (!t)
            return -ENOMEM;
        f->tensors = t;
        t = &f->tensors[i];
        t->info_offset = c->pos;
        rc = cur_name(c, GGUF_NAME_MAX, &t->name, "tensor name");
        if (rc)
            return err_wrap(rc, "tensor #%llu (info at byte %llu): ", (ull)i,
                            (ull)t->info_offset);
        f->n_tensors = i + 1;
        rc = read_tensor_fields(c, t, f->alignment);
        if (rc)
            return err_wrap(rc, "tensor '%s' (info at byte %llu): ", t->name,
                            (ull)t->info_offset);
    }
    return 0;
}

/* ---- whole-file checks --------------------------------------------------------------------- */

static int read_header(struct cursor *c, struct gguf_file *f, uint64_t *n_tensors,
                       uint64_t *n_kv)
{
    uint32_t magic;
    int rc = cur_u32(c, &magic, "magic");

    if (rc == 0 && magic != GGUF_MAGIC)
        return err_set(-EINVAL, "bad magic 0x%08x at byte 0: not a GGUF file", magic);
    if (rc == 0)
        rc = cur_u32(c, &f->version, "version");
    if (rc)
        return rc;
    if (f->version == 1)
        return err_set(-EINVAL, "GGUF version 1 (32-bit counts) is not supported; convert the "
                       "file to version 3");
    if (f->version != 0 && (f->version & 0xffff) == 0)
        return err_set(-EINVAL, "GGUF version field 0x%08x looks big-endian; only "
                       "little-endian files are supported", f->version);
    if (f->version != 2 && f->version != 3)
        return err_set(-EINVAL, "unsupported GGUF version %u (2 and 3 are)", f->version);
    rc = cur_u64(c, n_tensors, "tensor_count");
    if (rc == 0)
        rc = cur_u64(c, n_kv, "kv_count");
    if (rc)
        return rc;
    if (*n_kv > cur_left(c) / KV_MIN_BYTES ||
        *n_tensors > (cur_left(c) - *n_kv * KV_MIN_BYTES) / TENSOR_MIN_BYTES)
        return err_set(-EINVAL, "header counts (%llu tensors, %llu keys) cannot fit in the "
                       "%llu bytes after the header", (ull)*n_tensors, (ull)*n_kv,
                       (ull)cur_left(c));
    return 0;
}

static int alignment_find(struct gguf_file *f)
{
    const struct gguf_kv *kv = gguf_find_kv(f, "general.alignment");
    uint64_t a;

    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!kv)
        return 0;
    if (kv->value.type != GGUF_TYPE_UINT32)
        return err_set(-EINVAL, "key 'general.alignment' (record at byte %llu): type %s, "
                       "expected UINT32", (ull)kv->offset, gguf_value_type_name(kv->value.type));
    a = kv->value.u64;
    if (a == 0 || (a & (a - 1)))
        return err_set(-EINVAL, "key 'general.alignment' (record at byte %llu): %llu is not a "
                       "nonzero power of two", (ull)kv->offset, (ull)a);
    f->alignment = a;
    return 0;
}

/* Places every tensor's data at data_offset + offset and checks it lies inside the file. */
static int tensors_place(struct gguf_file *f)
{
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        struct gguf_tensor *t = &f->tensors[i];
        uint64_t start, end;

        if (__builtin_add_overflow(f->data_offset, t->offset, &start) ||
            __builtin_add_overflow(start, t->size, &end))
            return err_set(-EINVAL, "tensor '%s' (info at byte %llu): data offset %llu + %llu "
                           "+ size %llu overflows 64 bits", t->name, (ull)t->info_offset,
                           (ull)f->data_offset, (ull)t->offset, (ull)t->size);
        if (end > f->size)
            return err_set(-EINVAL, "tensor '%s' (info at byte %llu): data [%llu, %llu) "
                           "extends past end of file (size %llu)", t->name,
                           (ull)t->info_offset, (ull)start, (ull)end, (ull)f->size);
        t->data = f->base + start;
    }
    return 0;
}

static int cmp_kv_key(const void *a, const void *b)
{
    return strcmp((*(const struct gguf_kv *const *)a)->key,
                  (*(const struct gguf_kv *const *)b)->key);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp((*(const struct gguf_tensor *const *)a)->name,
                  (*(const struct gguf_tensor *const *)b)->name);
}

static int cmp_tensor_offset(const void *a, const void *b)
{
    uint64_t x = (*(const struct gguf_tensor *const *)a)->offset;
    uint64_t y = (*(const struct gguf_tensor *const *)b)->offset;
    return (x > y) - (x < y);
}

/* (n) pointers to the n tensors of f, sorted by cmp; NULL when out of memory. */
static const struct gguf_tensor **tensors_sorted(const struct gguf_file *f,
                                                 int (*cmp)(const void *, const void *))
{
    const struct gguf_tensor **idx = malloc((f->n_tensors ? f->n_tensors : 1) * sizeof(*idx));
    if (!idx)
        return NULL;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        idx[i] = &f->tensors[i];
    qsort(idx, f->n_tensors, sizeof(*idx), cmp);
    return idx;
}

static int kv_index_build(struct gguf_file_impl *fi)
{
    struct gguf_file *f = &fi->pub;
    const struct gguf_kv **idx = malloc((f->n_kv ? f->n_kv : 1) * sizeof(*idx));

    if (!idx)
        return err_set(-ENOMEM, "out of memory indexing %llu keys", (ull)f->n_kv);
    for (uint64_t i = 0; i < f->n_kv; i++)
        idx[i] = &f->kv[i];
    qsort(idx, f->n_kv, sizeof(*idx), cmp_kv_key);
    fi->kv_by_key = idx;
    for (uint64_t i = 1; i < f->n_kv; i++) {
        const struct gguf_kv *a = idx[i - 1], *b = idx[i];
        if (!strcmp(a->key, b->key))
            return err_set(-EINVAL, "duplicate key '%s' (records at bytes %llu and %llu)",
                           a->key, (ull)a->offset, (ull)b->offset);
    }
    return 0;
}

static int tensor_index_build(struct gguf_file_impl *fi)
{
    struct gguf_file *f = &fi->pub;
    const struct gguf_tensor **idx = tensors_sorted(f, cmp_tensor_name);

    if (!idx)
        return err_set(-ENOMEM, "out of memory indexing %llu tensors", (ull)f->n_tensors);
    fi->tensor_by_name = idx;
    for (uint64_t i = 1; i < f->n_tensors; i++) {
        const struct gguf_tensor *a = idx[i - 1], *b = idx[i];
        if (!strcmp(a->name, b->name))
            return err_set(-EINVAL, "duplicate tensor name '%s' (infos at bytes %llu and %llu)",
                           a->name, (ull)a->info_offset, (ull)b->info_offset);
    }
    return 0;
}

/* Sorts a copy of the table by offset: each tensor must end before the next begins. Runs
 * after tensors_place, so offset + size cannot overflow. */
static int overlap_check(const struct gguf_file *f)
{
    const struct gguf_tensor **by_off = tensors_sorted(f, cmp_tensor_offset);
    int rc = 0;

    if (!by_off)
        return err_set(-ENOMEM, "out of memory sorting %llu tensors", (ull)f->n_tensors);
    for (uint64_t i = 1; i < f->n_tensors && rc == 0; i++) {
        const struct gguf_tensor *a = by_off[i - 1], *b = by_off[i];
        if (a->offset + a->size > b->offset)
            rc = err_set(-EINVAL, "tensor '%s' (info at byte %llu): data [%llu, %llu) overlaps "
                         "tensor '%s' (info at byte %llu) at [%llu, %llu)", b->name,
                         (ull)b->info_offset, (ull)(f->data_offset + b->offset),
                         (ull)(f->data_offset + b->offset + b->size), a->name,
                         (ull)a->info_offset, (ull)(f->data_offset + a->offset),
                         (ull)(f->data_offset + a->offset + a->size));
    }
    free(by_off);
    return rc;
}

static int file_parse(struct gguf_file_impl *fi)
{
    struct gguf_file *f = &fi->pub;
    struct cursor c = {.base = f->base, .size = f->size, .pos = 0};
    uint64_t n_tensors = 0, n_kv = 0;
    int rc = read_header(&c, f, &n_tensors, &n_kv);

    if (rc == 0)
        rc = read_kvs(&c, f, n_kv);
    if (rc == 0)
        rc = kv_index_build(fi);
    if (rc == 0)
        rc = alignment_find(f);
    if (rc == 0)
        rc = read_tensor_infos(&c, f, n_tensors);
    if (rc)
        return rc;
    /* c.pos <= size < 2^64 - 2^32 in practice and alignment <= 2^31: no overflow. */
    f->data_offset = (c.pos + f->alignment - 1) & ~(f->alignment - 1);
    rc = tensors_place(f);
    if (rc == 0)
        rc = tensor_index_build(fi);
    if (rc == 0)
        rc = overlap_check(f);
    return rc;
}

/* ---- open / close -------------------------------------------------------------------------- */

static struct gguf_file_impl *file_alloc(const void *base, uint64_t size)
{
    struct gguf_file_impl *fi = calloc(1, sizeof(*fi));
    if (!fi) {
        err_set(-ENOMEM, "out of memory");
        return NULL;
    }
    fi->pub.base = base;
    fi->pub.size = size;
    fi->pub.fd = -1;
    return fi;
}

int gguf_open_memory(const void *buf, uint64_t size, struct gguf_file **out)
{
    struct gguf_file_impl *fi = file_alloc(buf, size);
    int rc;

    *out = NULL;
    if (!fi)
        return -ENOMEM;
    rc = file_parse(fi);
    if (rc) {
        gguf_close(&fi->pub);
        return rc;
    }
    *out = &fi->pub;
    return 0;
}

/* Opens and maps path read-only into a fresh file; does not parse. */
static int file_map(const char *path, struct gguf_file_impl **out)
{
    struct gguf_file_impl *fi;
    struct stat st;
    void *base;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return err_set(-errno, "cannot open: %s", strerror(errno));
    if (fstat(fd, &st) < 0) {
        int rc = -errno;
        close(fd);
        return err_set(rc, "cannot stat: %s", strerror(-rc));
    }
    if (!S_ISREG(st.st_mode) || st.st_size == 0) {
        close(fd);
        return err_set(-EINVAL, "%s", S_ISREG(st.st_mode) ? "empty file" : "not a regular file");
    }
    base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        int rc = -errno;
        close(fd);
        return err_set(rc, "cannot map %llu bytes: %s", (ull)st.st_size, strerror(-rc));
    }
    fi = file_alloc(base, (uint64_t)st.st_size);
    if (!fi) {
        munmap(base, (size_t)st.st_size);
        close(fd);
        return -ENOMEM;
    }
    fi->pub.fd = fd;
    fi->pub.mapped = true;
    fi->pub.mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    *out = fi;
    return 0;
}

int gguf_open(const char *path, struct gguf_file **out)
{
    struct gguf_file_impl *fi = NULL;
    int rc = file_map(path, &fi);

    *out = NULL;
    if (rc == 0) {
        fi->pub.path = strdup(path);
        rc = fi->pub.path ? file_parse(fi) : err_set(-ENOMEM, "out of memory");
    }
    if (rc) {
        if (fi)
            gguf_close(&fi->pub);
        return err_wrap(rc, "%s: ", path);
    }
    *out = &fi->pub;
    return 0;
}

void gguf_close(struct gguf_file *f)
{
    struct gguf_file_impl *fi;

    if (!f)
        return;
    fi = impl_of(f);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const struct gguf_value *v = &f->kv[i].value;
        free(f->kv[i].key);
        if (v->type == GGUF_TYPE_ARRAY && v->arr.elem_type == GGUF_TYPE_STRING)
            free((void *)v->arr.strs);
    }
    for (uint64_t i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->kv);
    free(f->tensors);
    free(fi->kv_by_key);
    free(fi->tensor_by_name);
    if (f->mapped)
        munmap((void *)f->base, (size_t)f->size);
    if (f->fd >= 0)
        close(f->fd);
    free(f->path);
    free(fi);
}

/* ---- lookup -------------------------------------------------------------------------------- */

const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key)
{
    struct gguf_kv probe = {.key = (char *)key};
    const struct gguf_kv *pp = &probe, **hit;

    hit = bsearch(&pp, impl_of(f)->kv_by_key, f->n_kv, sizeof(pp), cmp_kv_key);
    return hit ? *hit : NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name)
{
    struct gguf_tensor probe = {.name = (char *)name};
    const struct gguf_tensor *pp = &probe, **hit;

    hit = bsearch(&pp, impl_of(f)->tensor_by_name, f->n_tensors, sizeof(pp), cmp_tensor_name);
    return hit ? *hit : NULL;
}

/* ---- typed getters ------------------------------------------------------------------------- */

static int kv_get(const struct gguf_file *f, const char *key, const struct gguf_kv **out)
{
    *out = gguf_find_kv(f, key);
    if (!*out)
        return err_set(-ENOENT, "key '%s' not found", key);
    return 0;
}

static int kv_type_error(const struct gguf_kv *kv, const char *expected)
{
    return err_set(-EINVAL, "key '%s' (record at byte %llu): type %s, expected %s", kv->key,
                   (ull)kv->offset, gguf_value_type_name(kv->value.type), expected);
}

static bool type_is_unsigned(enum gguf_value_type t)
{
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 ||
           t == GGUF_TYPE_UINT64;
}

static bool type_is_signed(enum gguf_value_type t)
{
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 ||
           t == GGUF_TYPE_INT64;
}

/* Any integer value as a uint64_t no larger than max. */
static int kv_unsigned(const struct gguf_file *f, const char *key, uint64_t max, uint64_t *out)
{
    const struct gguf_kv *kv;
    int rc = kv_get(f, key, &kv);
    if (rc)
        return rc;
    if (type_is_signed(kv->value.type) && kv->value.i64 >= 0)
        *out = (uint64_t)kv->value.i64;
    else if (type_is_unsigned(kv->value.type))
        *out = kv->value.u64;
    else if (type_is_signed(kv->value.type))
        return err_set(-ERANGE, "key '%s' (record at byte %llu): %lld is negative", key,
                       (ull)kv->offset, (long long)kv->value.i64);
    else
        return kv_type_error(kv, "an integer");
    if (*out > max)
        return err_set(-ERANGE, "key '%s' (record at byte %llu): %llu exceeds %llu", key,
                       (ull)kv->offset, (ull)*out, (ull)max);
    return 0;
}

int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out)
{
    uint64_t v;
    int rc = kv_unsigned(f, key, UINT32_MAX, &v);
    if (rc == 0)
        *out = (uint32_t)v;
    return rc;
}

int gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out)
{
    return kv_unsigned(f, key, UINT64_MAX, out);
}

int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out)
{
    const struct gguf_kv *kv;
    int rc = kv_get(f, key, &kv);
    if (rc)
        return rc;
    if (type_is_signed(kv->value.type)) {
        *out = kv->value.i64;
        return 0;
    }
    if (!type_is_unsigned(kv->value.type))
        return kv_type_error(kv, "an integer");
    if (kv->value.u64 > INT64_MAX)
        return err_set(-ERANGE, "key '%s' (record at byte %llu): %llu exceeds INT64_MAX", key,
                       (ull)kv->offset, (ull)kv->value.u64);
    *out = (int64_t)kv->value.u64;
    return 0;
}

/* FLOAT32 and FLOAT64 convert (a FLOAT64 rounds to the nearest float); integers do not. */
int gguf_get_f32(const struct gguf_file *f, const char *key, float *out)
{
    const struct gguf_kv *kv;
    int rc = kv_get(f, key, &kv);
    if (rc)
        return rc;
    if (kv->value.type != GGUF_TYPE_FLOAT32 && kv->value.type != GGUF_TYPE_FLOAT64)
        return kv_type_error(kv, "FLOAT32");
    *out = (float)kv->value.f64;
    return 0;
}

int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out)
{
    const struct gguf_kv *kv;
    int rc = kv_get(f, key, &kv);
    if (rc)
        return rc;
    if (kv->value.type != GGUF_TYPE_BOOL)
        return kv_type_error(kv, "BOOL");
    *out = kv->value.u64 != 0;
    return 0;
}

int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out)
{
    const struct gguf_kv *kv;
    int rc = kv_get(f, key, &kv);
    if (rc)
        return rc;
    if (kv->value.type != GGUF_TYPE_STRING)
        return kv_type_error(kv, "STRING");
    *out = kv->value.str;
    return 0;
}

int gguf_get_arr(const struct gguf_file *f, const char *key, const struct gguf_value **out)
{
    const struct gguf_kv *kv;
    int rc = kv_get(f, key, &kv);
    if (rc)
        return rc;
    if (kv->value.type != GGUF_TYPE_ARRAY)
        return kv_type_error(kv, "ARRAY");
    *out = &kv->value;
    return 0;
}

int gguf_arr_get(const struct gguf_value *arr, uint64_t i, struct gguf_value *out)
{
    enum gguf_value_type t;

    if (arr->type != GGUF_TYPE_ARRAY)
        return err_set(-EINVAL, "value of type %s is not an array",
                       gguf_value_type_name(arr->type));
    if (i >= arr->arr.count)
        return err_set(-ERANGE, "index %llu is past the end of an array of %llu", (ull)i,
                       (ull)arr->arr.count);
    t = arr->arr.elem_type;
    if (t == GGUF_TYPE_STRING) {
        out->type = GGUF_TYPE_STRING;
        out->str = arr->arr.strs[i];
        return 0;
    }
    value_decode(t, (const uint8_t *)arr->arr.data + i * type_size[t], out);
    return 0;
}
