/* gguf: the streaming writer. The reader is in gguf.c.
 *
 * The writer always produces GGUF v3. KV records are serialized into a memory buffer as they
 * are added; tensor infos are kept in a table. begin_data lays the file out (tensor data in
 * declaration order, each tensor at a multiple of the alignment, the last one padded too, as
 * gguf-py does), writes header + KVs + infos at the start of the temp file PATH.tmp.<pid> and
 * ftruncates it to its final size, so padding is a zero-filled hole. Tensor bytes then go to
 * fixed positions with pwrite: sequentially (gguf_writer_write) or positionally from any
 * thread (gguf_writer_pwrite). finish fsyncs and renames the temp file over PATH.
 *
 * general.alignment is written only when the alignment is not the default 32 (readers assume
 * 32 when the key is absent); it is owned by the writer, and adding it by hand is rejected.
 *
 * Threads: after begin_data the layout is read-only, so gguf_writer_pwrite may run from many
 * threads at once (pwrite(2) is positional). Everything else is single-threaded: no other
 * call may run concurrently with pwrite.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "errors.h"
#include "gguf.h"
#include "outfile.h"
#include "quant.h"

typedef unsigned long long ull; /* for printf of uint64_t */

#define GGUF_WRITE_VERSION 3

/* A growing byte buffer: p is (len) bytes of (cap), owned. */
struct bytebuf {
    uint8_t *p;
    uint64_t len, cap;
};

struct writer_tensor {
    char *name; /* owned */
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint32_t type;
    uint64_t size;   /* bytes */
    uint64_t offset; /* relative to the data section; set by begin_data */
};

struct gguf_writer {
    char *path;     /* owned: the final name */
    char *tmp_path; /* owned: PATH.tmp.<pid>, renamed to path by finish */
    int fd;         /* the temp file */
    int slot;       /* tmp_path's outfile registry slot (removed on SIGINT/SIGTERM), -1 none */
    uint64_t alignment;

    struct bytebuf meta; /* the serialized KV records */
    char **keys; /* (n_kv) owned copies, for the duplicate check */
    uint64_t n_kv, keys_cap;

    struct writer_tensor *tensors; /* (n_tensors) owned, in declaration order */
    uint64_t n_tensors, tensors_cap;
    /* The tensor names as an open-addressed hash set, for the duplicate check in linear time:
     * (names_cap) slots, a power of two at most half full; 0 = empty, else tensor index + 1.
     * Owned. */
    uint32_t *names;
    uint64_t names_cap;

    bool data_begun;
    uint64_t data_offset; /* start of the data section in the file */
    uint64_t file_size;

    bool seq_used;    /* gguf_writer_write was called */
    uint64_t seq_idx; /* tensor the next sequential byte goes to */
    uint64_t seq_pos; /* byte inside it */
};

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) & ~(a - 1);
}

/* Returns arr with room for n + 1 elements of elem bytes (capacity *cap), or NULL with a
 * message (arr is then unchanged). */
static void *grow(void *arr, uint64_t *cap, uint64_t n, size_t elem)
{
    uint64_t new_cap = *cap ? *cap * 2 : 16;
    void *p;

    if (n < *cap)
        return arr;
    p = realloc(arr, new_cap * elem);
    if (!p) {
        err_set(-ENOMEM, "out of memory");
        return NULL;
    }
    *cap = new_cap;
    return p;
}

static int buf_put(struct bytebuf *b, const void *p, uint64_t n)
{
    if (n == 0)
        return 0;
    while (b->len + n > b->cap) {
        uint64_t cap = b->cap ? b->cap * 2 : 4096;
        uint8_t *m = realloc(b->p, cap);
        if (!m)
            return err_set(-ENOMEM, "out of memory for %llu bytes of metadata", (ull)cap);
        b->p = m;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}

static int buf_put_u32(struct bytebuf *b, uint32_t v)
{
    return buf_put(b, &v, sizeof(v));
}

static int buf_put_u64(struct bytebuf *b, uint64_t v)
{
    return buf_put(b, &v, sizeof(v));
}

static int buf_put_str(struct bytebuf *b, const char *s, uint64_t len)
{
    int rc = buf_put_u64(b, len);
    return rc ? rc : buf_put(b, s, len);
}

/* Writes all n bytes of p at file offset at. */
static int pwrite_all(const struct gguf_writer *w, const void *p, uint64_t n, uint64_t at)
{
    while (n > 0) {
        ssize_t k = pwrite(w->fd, p, n, (off_t)at);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return err_set(k < 0 ? -errno : -EIO, "%s: write of %llu bytes at %llu failed: %s",
                           w->tmp_path, (ull)n, (ull)at, k < 0 ? strerror(errno) : "no progress");
        p = (const char *)p + k;
        n -= (uint64_t)k;
        at += (uint64_t)k;
    }
    return 0;
}

/* ---- open / abort -------------------------------------------------------------------------- */

static void writer_free(struct gguf_writer *w)
{
    outfile_unregister(w->slot);
    for (uint64_t i = 0; i < w->n_kv; i++)
        free(w->keys[i]);
    for (uint64_t i = 0; i < w->n_tensors; i++)
        free(w->tensors[i].name);
    free(w->keys);
    free(w->tensors);
    free(w->names);
    free(w->meta.p);
    free(w->path);
    free(w->tmp_path);
    free(w);
}

void gguf_writer_abort(struct gguf_writer *w)
{
    if (!w)
        return;
    if (w->fd >= 0) {
        close(w->fd);
        unlink(w->tmp_path);
    }
    writer_free(w);
}

static int kv_add_alignment(struct gguf_writer *w);

int gguf_writer_open(const char *path, uint32_t alignment, struct gguf_writer **out)
{
    struct gguf_writer *w;
    int rc;

    *out = NULL;
    if (alignment == 0)
        alignment = GGUF_DEFAULT_ALIGNMENT;
    if (alignment & (alignment - 1))
        return err_set(-EINVAL, "%s: alignment %u is not a power of two", path, alignment);
    w = calloc(1, sizeof(*w));
    if (!w)
        return err_set(-ENOMEM, "out of memory");
    w->fd = -1;
    w->slot = -1;
    w->alignment = alignment;
    w->path = strdup(path);
    if (!w->path || asprintf(&w->tmp_path, "%s.tmp.%d", path, (int)getpid()) < 0) {
        w->tmp_path = NULL;
        writer_free(w);
        return err_set(-ENOMEM, "out of memory");
    }
    rc = outfile_check_target(path);
    if (rc) {
        writer_free(w);
        return rc;
    }
    outfile_sweep_stale(path);
    w->fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        rc = err_set(-errno, "cannot create %s: %s", w->tmp_path, strerror(errno));
        writer_free(w);
        return rc;
    }
    rc = outfile_register(w->tmp_path);
    if (rc >= 0)
        w->slot = rc;
    rc = rc < 0 ? rc : kv_add_alignment(w);
    if (rc) {
        gguf_writer_abort(w);
        return rc;
    }
    *out = w;
    return 0;
}

/* ---- KV records ---------------------------------------------------------------------------- */

static int writer_check_open(const struct gguf_writer *w, const char *what, const char *name)
{
    if (w->data_begun)
        return err_set(-EINVAL, "%s: cannot add %s '%s' after gguf_writer_begin_data",
                       w->path, what, name);
    return 0;
}

/* Checks key (length, duplicates, not general.alignment unless internal) and records it. */
static int key_claim(struct gguf_writer *w, const char *key, bool internal)
{
    size_t len = strlen(key);
    char **keys;
    int rc = writer_check_open(w, "key", key);

    if (rc)
        return rc;
    if (len == 0 || len > GGUF_KEY_MAX)
        return err_set(-EINVAL, "%s: key '%.64s' has length %zu, outside 1..%d", w->path, key,
                       len, GGUF_KEY_MAX);
    if (!internal && !strcmp(key, "general.alignment"))
        return err_set(-EINVAL, "%s: general.alignment is written by the writer; pass the "
                       "alignment to gguf_writer_open", w->path);
    for (uint64_t i = 0; i < w->n_kv; i++) {
        if (!strcmp(w->keys[i], key))
            return err_set(-EINVAL, "%s: duplicate key '%s'", w->path, key);
    }
    keys = grow(w->keys, &w->keys_cap, w->n_kv, sizeof(*w->keys));
    if (!keys)
        return -ENOMEM;
    w->keys = keys;
    w->keys[w->n_kv] = strdup(key);
    if (!w->keys[w->n_kv])
        return err_set(-ENOMEM, "out of memory");
    w->n_kv++;
    return 0;
}

/* Undoes key_claim and any partial record after a failure. */
static int key_unclaim(struct gguf_writer *w, uint64_t meta_len, int rc)
{
    w->n_kv--;
    free(w->keys[w->n_kv]);
    w->meta.len = meta_len;
    return rc;
}

/* Key string and value type: the start of every record. */
static int record_begin(struct gguf_writer *w, const char *key, enum gguf_value_type type,
                        bool internal, uint64_t *meta_len)
{
    int rc = key_claim(w, key, internal);
    if (rc)
        return rc;
    *meta_len = w->meta.len;
    rc = buf_put_str(&w->meta, key, strlen(key));
    if (rc == 0)
        rc = buf_put_u32(&w->meta, type);
    return rc ? key_unclaim(w, *meta_len, rc) : 0;
}

static int check_bools(const struct gguf_writer *w, const char *key, const uint8_t *p,
                       uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        if (p[i] > 1)
            return err_set(-EINVAL, "%s: key '%s': BOOL element %llu is %u, not 0 or 1",
                           w->path, key, (ull)i, p[i]);
    }
    return 0;
}

/* Encodes a C value of the type's matching C type as its LE bytes (bool as one byte). */
static int scalar_encode(enum gguf_value_type type, const void *value, uint8_t out[8])
{
    uint64_t n = gguf_value_type_size(type);
    if (n == 0)
        return -EINVAL;
    if (type == GGUF_TYPE_BOOL)
        out[0] = *(const bool *)value ? 1 : 0;
    else
        memcpy(out, value, n);
    return 0;
}

static int scalar_add(struct gguf_writer *w, const char *key, enum gguf_value_type type,
                      const void *value, bool internal)
{
    uint8_t bytes[8];
    uint64_t meta_len;
    int rc;

    if (scalar_encode(type, value, bytes))
        return err_set(-EINVAL, "%s: key '%s': type %s is not a scalar", w->path, key,
                       gguf_value_type_name(type));
    rc = record_begin(w, key, type, internal, &meta_len);
    if (rc)
        return rc;
    rc = buf_put(&w->meta, bytes, gguf_value_type_size(type));
    return rc ? key_unclaim(w, meta_len, rc) : 0;
}

static int kv_add_alignment(struct gguf_writer *w)
{
    uint32_t a = (uint32_t)w->alignment;
    if (a == GGUF_DEFAULT_ALIGNMENT)
        return 0;
    return scalar_add(w, "general.alignment", GGUF_TYPE_UINT32, &a, true);
}

int gguf_writer_add_scalar(struct gguf_writer *w, const char *key, enum gguf_value_type type,
                           const void *value)
{
    return scalar_add(w, key, type, value, false);
}

int gguf_writer_add_u32(struct gguf_writer *w, const char *key, uint32_t v)
{
    return scalar_add(w, key, GGUF_TYPE_UINT32, &v, false);
}

int gguf_writer_add_i32(struct gguf_writer *w, const char *key, int32_t v)
{
    return scalar_add(w, key, GGUF_TYPE_INT32, &v, false);
}

int gguf_writer_add_u64(struct gguf_writer *w, const char *key, uint64_t v)
{
    return scalar_add(w, key, GGUF_TYPE_UINT64, &v, false);
}

int gguf_writer_add_f32(struct gguf_writer *w, const char *key, float v)
{
    return scalar_add(w, key, GGUF_TYPE_FLOAT32, &v, false);
}

int gguf_writer_add_bool(struct gguf_writer *w, const char *key, bool v)
{
    return scalar_add(w, key, GGUF_TYPE_BOOL, &v, false);
}

int gguf_writer_add_str(struct gguf_writer *w, const char *key, const char *s)
{
    uint64_t meta_len;
    int rc = record_begin(w, key, GGUF_TYPE_STRING, false, &meta_len);
    if (rc)
        return rc;
    rc = buf_put_str(&w->meta, s, strlen(s));
    return rc ? key_unclaim(w, meta_len, rc) : 0;
}

/* Arrays carry LE element bytes as-is: the host is little-endian (checked in gguf.c). */
int gguf_writer_add_arr(struct gguf_writer *w, const char *key, enum gguf_value_type elem_type,
                        const void *data, uint64_t count)
{
    uint64_t esize = gguf_value_type_size(elem_type), meta_len;
    int rc;

    if (esize == 0)
        return err_set(-EINVAL, "%s: key '%s': array element type %s is not fixed-size",
                       w->path, key, gguf_value_type_name(elem_type));
    if (count > UINT64_MAX / esize)
        return err_set(-EOVERFLOW, "%s: key '%s': %llu elements overflow", w->path, key,
                       (ull)count);
    if (elem_type == GGUF_TYPE_BOOL && (rc = check_bools(w, key, data, count)))
        return rc;
    rc = record_begin(w, key, GGUF_TYPE_ARRAY, false, &meta_len);
    if (rc)
        return rc;
    rc = buf_put_u32(&w->meta, elem_type);
    if (rc == 0)
        rc = buf_put_u64(&w->meta, count);
    if (rc == 0)
        rc = buf_put(&w->meta, data, count * esize);
    return rc ? key_unclaim(w, meta_len, rc) : 0;
}

int gguf_writer_add_arr_str(struct gguf_writer *w, const char *key, const char *const *strs,
                            const uint64_t *lens, uint64_t count)
{
    uint64_t meta_len;
    int rc = record_begin(w, key, GGUF_TYPE_ARRAY, false, &meta_len);
    if (rc)
        return rc;
    rc = buf_put_u32(&w->meta, GGUF_TYPE_STRING);
    if (rc == 0)
        rc = buf_put_u64(&w->meta, count);
    for (uint64_t i = 0; i < count && rc == 0; i++)
        rc = buf_put_str(&w->meta, strs[i], lens ? lens[i] : strlen(strs[i]));
    return rc ? key_unclaim(w, meta_len, rc) : 0;
}

/* ---- tensors ------------------------------------------------------------------------------- */

/* The slot of w->names holding name, or the empty slot where it would go; NULL when the set
 * has no slots yet. */
static uint32_t *names_slot(const struct gguf_writer *w, const char *name)
{
    uint64_t mask = w->names_cap - 1, i;

    if (!w->names_cap)
        return NULL;
    i = XXH3_64bits(name, strlen(name)) & mask;
    while (w->names[i] && strcmp(w->tensors[w->names[i] - 1].name, name))
        i = (i + 1) & mask;
    return &w->names[i];
}

/* Adds tensor idx (its name already in w->tensors) to w->names, doubling the table when it
 * would be more than half full. */
static int names_add(struct gguf_writer *w, uint64_t idx)
{
    if (2 * (idx + 1) > w->names_cap) {
        uint64_t cap = w->names_cap ? 2 * w->names_cap : 64;
        uint32_t *old = w->names;
        uint64_t old_cap = w->names_cap;
        uint32_t *p = calloc(cap, sizeof(*p));
        if (!p)
            return err_set(-ENOMEM, "out of memory for %llu tensor names", (ull)cap);
        w->names = p;
        w->names_cap = cap;
        for (uint64_t i = 0; i < old_cap; i++) {
            if (old[i])
                *names_slot(w, w->tensors[old[i] - 1].name) = old[i];
        }
        free(old);
    }
    *names_slot(w, w->tensors[idx].name) = (uint32_t)(idx + 1);
    return 0;
}

static int tensor_check(const struct gguf_writer *w, const char *name, uint32_t type,
                        uint32_t n_dims, const uint64_t *ne, uint64_t *size)
{
    size_t len = strlen(name);
    uint32_t *slot;
    int rc = writer_check_open(w, "tensor", name);

    if (rc)
        return rc;
    if (len == 0 || len > GGUF_NAME_MAX)
        return err_set(-EINVAL, "%s: tensor name '%.80s' has length %zu, outside 1..%d", w->path,
                       name, len, GGUF_NAME_MAX);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return err_set(-EINVAL, "%s: tensor '%s': n_dims %u is outside 1..%d", w->path, name,
                       n_dims, GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] == 0 || ne[d] > INT64_MAX)
            return err_set(-EINVAL, "%s: tensor '%s': dimension %u = %llu is outside "
                           "1..2^63-1", w->path, name, d, (ull)ne[d]);
    }
    rc = quant_tensor_bytes(type, n_dims, ne, size);
    if (rc)
        return err_wrap(rc, "%s: tensor '%s': ", w->path, name);
    slot = names_slot(w, name);
    if (slot && *slot)
        return err_set(-EINVAL, "%s: duplicate tensor name '%s'", w->path, name);
    return 0;
}

int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, uint32_t type,
                           uint32_t n_dims, const uint64_t *ne)
{
    struct writer_tensor *t;
    uint64_t size;
    int rc = tensor_check(w, name, type, n_dims, ne, &size);

    if (rc)
        return rc;
    if (w->n_tensors >= INT32_MAX)
        return err_set(-EOVERFLOW, "%s: too many tensors", w->path);
    t = grow(w->tensors, &w->tensors_cap, w->n_tensors, sizeof(*w->tensors));
    if (!t)
        return -ENOMEM;
    w->tensors = t;
    t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof(*t));
    t->name = strdup(name);
    if (!t->name)
        return err_set(-ENOMEM, "out of memory");
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = d < n_dims ? ne[d] : 1;
    t->type = type;
    t->size = size;
    rc = names_add(w, w->n_tensors);
    if (rc) {
        free(t->name);
        return rc;
    }
    return (int)w->n_tensors++;
}

/* ---- layout and data ----------------------------------------------------------------------- */

/* Serializes the tensor infos (offsets already laid out). */
static int infos_encode(const struct gguf_writer *w, struct bytebuf *b)
{
    int rc = 0;

    for (uint64_t i = 0; i < w->n_tensors && rc == 0; i++) {
        const struct writer_tensor *t = &w->tensors[i];
        rc = buf_put_str(b, t->name, strlen(t->name));
        if (rc == 0)
            rc = buf_put_u32(b, t->n_dims);
        if (rc == 0)
            rc = buf_put(b, t->ne, t->n_dims * sizeof(uint64_t));
        if (rc == 0)
            rc = buf_put_u32(b, t->type);
        if (rc == 0)
            rc = buf_put_u64(b, t->offset);
    }
    return rc;
}

/* Assigns each tensor its data-section offset in declaration order; *data_size is the padded
 * end of the last tensor. */
static int layout_tensors(struct gguf_writer *w, uint64_t *data_size)
{
    uint64_t pos = 0;

    for (uint64_t i = 0; i < w->n_tensors; i++) {
        struct writer_tensor *t = &w->tensors[i];
        t->offset = pos;
        if (__builtin_add_overflow(pos, t->size, &pos) || pos > UINT64_MAX - w->alignment)
            return err_set(-EOVERFLOW, "%s: data section overflows 64 bits at tensor '%s'",
                           w->path, t->name);
        pos = align_up(pos, w->alignment);
    }
    *data_size = pos;
    return 0;
}

/* Lays the file out and writes everything before the data section. */
static int header_write(struct gguf_writer *w)
{
    uint32_t head32[2] = {GGUF_MAGIC, GGUF_WRITE_VERSION};
    uint64_t head64[2] = {w->n_tensors, w->n_kv};
    struct bytebuf infos = {0};
    uint64_t data_size = 0;
    int rc = layout_tensors(w, &data_size);

    if (rc == 0)
        rc = infos_encode(w, &infos);
    if (rc)
        goto out;
    w->data_offset = align_up(24 + w->meta.len + infos.len, w->alignment);
    if (__builtin_add_overflow(w->data_offset, data_size, &w->file_size) ||
        w->file_size > (uint64_t)INT64_MAX) {
        rc = err_set(-EOVERFLOW, "%s: file size overflows", w->path);
        goto out;
    }
    rc = pwrite_all(w, head32, sizeof(head32), 0);
    if (rc == 0)
        rc = pwrite_all(w, head64, sizeof(head64), 8);
    if (rc == 0)
        rc = pwrite_all(w, w->meta.p, w->meta.len, 24);
    if (rc == 0)
        rc = pwrite_all(w, infos.p, infos.len, 24 + w->meta.len);
out:
    free(infos.p);
    return rc;
}

int gguf_writer_begin_data(struct gguf_writer *w)
{
    int rc;

    if (w->data_begun)
        return err_set(-EINVAL, "%s: gguf_writer_begin_data called twice", w->path);
    rc = header_write(w);
    if (rc)
        return rc;
    if (ftruncate(w->fd, (off_t)w->file_size) < 0)
        return err_set(-errno, "%s: cannot size to %llu bytes: %s", w->tmp_path,
                       (ull)w->file_size, strerror(errno));
    w->data_begun = true;
    return 0;
}

static int writer_check_data(const struct gguf_writer *w, int idx)
{
    if (!w->data_begun)
        return err_set(-EINVAL, "%s: tensor data before gguf_writer_begin_data", w->path);
    if (idx < 0 || (uint64_t)idx >= w->n_tensors)
        return err_set(-EINVAL, "%s: tensor index %d is outside 0..%llu", w->path, idx,
                       (ull)w->n_tensors);
    return 0;
}

int gguf_writer_tensor_extent(const struct gguf_writer *w, int idx, uint64_t *file_offset,
                              uint64_t *size)
{
    int rc = writer_check_data(w, idx);
    if (rc)
        return rc;
    *file_offset = w->data_offset + w->tensors[idx].offset;
    *size = w->tensors[idx].size;
    return 0;
}

int gguf_writer_write(struct gguf_writer *w, const void *buf, uint64_t len)
{
    if (!w->data_begun)
        return err_set(-EINVAL, "%s: tensor data before gguf_writer_begin_data", w->path);
    w->seq_used = true;
    while (len > 0) {
        const struct writer_tensor *t;
        uint64_t n;
        int rc;

        if (w->seq_idx >= w->n_tensors)
            return err_set(-EINVAL, "%s: %llu bytes written past the end of the last tensor",
                           w->path, (ull)len);
        t = &w->tensors[w->seq_idx];
        n = t->size - w->seq_pos < len ? t->size - w->seq_pos : len;
        rc = pwrite_all(w, buf, n, w->data_offset + t->offset + w->seq_pos);
        if (rc)
            return err_wrap(rc, "tensor '%s': ", t->name);
        buf = (const char *)buf + n;
        len -= n;
        w->seq_pos += n;
        if (w->seq_pos == t->size) {
            w->seq_idx++;
            w->seq_pos = 0;
        }
    }
    return 0;
}

int gguf_writer_pwrite(struct gguf_writer *w, int idx, uint64_t at, const void *buf,
                       uint64_t len)
{
    const struct writer_tensor *t;
    int rc = writer_check_data(w, idx);

    if (rc)
        return rc;
    t = &w->tensors[idx];
    if (at > t->size || len > t->size - at)
        return err_set(-EINVAL, "%s: tensor '%s': write [%llu, +%llu) outside its %llu bytes",
                       w->path, t->name, (ull)at, (ull)len, (ull)t->size);
    rc = pwrite_all(w, buf, len, w->data_offset + t->offset + at);
    return rc ? err_wrap(rc, "tensor '%s': ", t->name) : 0;
}

/* ---- finish -------------------------------------------------------------------------------- */

static int writer_commit(struct gguf_writer *w)
{
    int rc = w->data_begun ? 0 : gguf_writer_begin_data(w);

    if (rc)
        return rc;
    if (w->seq_used && w->seq_idx < w->n_tensors)
        return err_set(-EINVAL, "%s: sequential writes stopped in tensor '%s' at byte %llu "
                       "of %llu", w->path, w->tensors[w->seq_idx].name, (ull)w->seq_pos,
                       (ull)w->tensors[w->seq_idx].size);
    if (fsync(w->fd) < 0)
        return err_set(-errno, "%s: fsync failed: %s", w->tmp_path, strerror(errno));
    if (close(w->fd) < 0) {
        w->fd = -1;
        return err_set(-errno, "%s: close failed: %s", w->tmp_path, strerror(errno));
    }
    w->fd = -1;
    rc = outfile_check_target(w->path); /* renaming would replace a FIFO or device */
    if (rc)
        return rc;
    if (rename(w->tmp_path, w->path) < 0)
        return err_set(-errno, "cannot rename %s to %s: %s", w->tmp_path, w->path,
                       strerror(errno));
    outfile_dir_sync(w->path);
    return 0;
}

int gguf_writer_finish(struct gguf_writer *w)
{
    int rc = writer_commit(w);
    if (rc) {
        if (w->fd >= 0)
            close(w->fd);
        unlink(w->tmp_path);
        writer_free(w);
        return rc;
    }
    writer_free(w);
    return 0;
}

int gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_kv *kv)
{
    const struct gguf_value *v = &kv->value;

    if (v->type == GGUF_TYPE_STRING) {
        char *str = strndup(v->str.ptr, v->str.len);
        int rc = str ? gguf_writer_add_str(w, kv->key, str) : -ENOMEM;
        free(str);
        return rc;
    }
    if (v->type == GGUF_TYPE_ARRAY && v->arr.elem_type == GGUF_TYPE_STRING) {
        const char **strs = malloc(sizeof(char *) * (v->arr.count ? v->arr.count : 1));
        uint64_t *lens = malloc(sizeof(uint64_t) * (v->arr.count ? v->arr.count : 1));
        int rc = -ENOMEM;
        if (strs && lens) {
            for (uint64_t i = 0; i < v->arr.count; i++) {
                strs[i] = v->arr.strs[i].ptr;
                lens[i] = v->arr.strs[i].len;
            }
            rc = gguf_writer_add_arr_str(w, kv->key, strs, lens, v->arr.count);
        }
        free(strs);
        free(lens);
        return rc;
    }
    if (v->type == GGUF_TYPE_ARRAY)
        return gguf_writer_add_arr(w, kv->key, v->arr.elem_type, v->arr.data, v->arr.count);
    union {
        uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
        float f32; bool b; uint64_t u64; int64_t i64; double f64;
    } x;
    switch (v->type) {
    case GGUF_TYPE_UINT8: x.u8 = (uint8_t)v->u64; break;
    case GGUF_TYPE_INT8: x.i8 = (int8_t)v->i64; break;
    case GGUF_TYPE_UINT16: x.u16 = (uint16_t)v->u64; break;
    case GGUF_TYPE_INT16: x.i16 = (int16_t)v->i64; break;
    case GGUF_TYPE_UINT32: x.u32 = (uint32_t)v->u64; break;
    case GGUF_TYPE_INT32: x.i32 = (int32_t)v->i64; break;
    case GGUF_TYPE_FLOAT32: x.f32 = (float)v->f64; break;
    case GGUF_TYPE_BOOL: x.b = v->u64 != 0; break;
    case GGUF_TYPE_UINT64: x.u64 = v->u64; break;
    case GGUF_TYPE_INT64: x.i64 = v->i64; break;
    default: x.f64 = v->f64; break;
    }
    return gguf_writer_add_scalar(w, kv->key, v->type, &x);
}
