#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>

#include "errors.h"

static const struct {
    const char *name;
    enum safetensors_dtype dtype;
    uint32_t size;
} dtype_table[] = {
    {"BOOL", SAFETENSORS_BOOL, 1},       {"U8", SAFETENSORS_U8, 1},
    {"I8", SAFETENSORS_I8, 1},           {"F8_E4M3", SAFETENSORS_F8_E4M3, 1},
    {"F8_E5M2", SAFETENSORS_F8_E5M2, 1}, {"I16", SAFETENSORS_I16, 2},
    {"U16", SAFETENSORS_U16, 2},         {"F16", SAFETENSORS_F16, 2},
    {"BF16", SAFETENSORS_BF16, 2},       {"I32", SAFETENSORS_I32, 4},
    {"U32", SAFETENSORS_U32, 4},         {"F32", SAFETENSORS_F32, 4},
    {"I64", SAFETENSORS_I64, 8},         {"U64", SAFETENSORS_U64, 8},
    {"F64", SAFETENSORS_F64, 8},
};

uint32_t safetensors_dtype_size(enum safetensors_dtype t)
{
    for (size_t i = 0; i < sizeof(dtype_table) / sizeof(dtype_table[0]); i++)
        if (dtype_table[i].dtype == t)
            return dtype_table[i].size;
    return 0;
}

static enum safetensors_dtype dtype_parse(const char *s)
{
    for (size_t i = 0; i < sizeof(dtype_table) / sizeof(dtype_table[0]); i++)
        if (!strcmp(dtype_table[i].name, s))
            return dtype_table[i].dtype;
    return SAFETENSORS_UNKNOWN;
}

const char *safetensors_shape_str(const struct safetensors_tensor *t, char *buf, unsigned size)
{
    unsigned n = 0;
    n += (unsigned)snprintf(buf, size, "[");
    for (uint32_t i = 0; i < t->n_dims && n < size; i++)
        n += (unsigned)snprintf(buf + n, size - n, "%s%llu", i ? ", " : "",
                                (unsigned long long)t->shape[i]);
    if (n < size)
        snprintf(buf + n, size - n, "]");
    return buf;
}

/* A non-negative JSON integer. */
static int json_u64(json_object *v, uint64_t *out)
{
    if (!v || !json_object_is_type(v, json_type_int))
        return -EINVAL;
    int64_t i = json_object_get_int64(v);
    if (i < 0)
        return -EINVAL;
    if (i == INT64_MAX) /* json-c saturates; take the unsigned reading */
        *out = json_object_get_uint64(v);
    else
        *out = (uint64_t)i;
    return 0;
}

/* Fills t from the header entry VAL of tensor NAME, checking it against the data section of
 * data_size bytes. */
static int tensor_parse(struct safetensors_file *f, const char *name, json_object *val,
                        uint64_t data_size, struct safetensors_tensor *t)
{
    json_object *dtype, *shape, *offs;
    uint64_t begin, end, n = 1;

    if (!json_object_is_type(val, json_type_object) ||
        !json_object_object_get_ex(val, "dtype", &dtype) ||
        !json_object_is_type(dtype, json_type_string) ||
        !json_object_object_get_ex(val, "shape", &shape) ||
        !json_object_is_type(shape, json_type_array) ||
        !json_object_object_get_ex(val, "data_offsets", &offs) ||
        !json_object_is_type(offs, json_type_array) || json_object_array_length(offs) != 2)
        return err_set(-EINVAL,
                       "%s: tensor '%s': the header entry needs a string dtype, an "
                       "array shape and two data_offsets",
                       f->path, name);
    if (json_object_array_length(shape) > SAFETENSORS_MAX_DIMS)
        return err_set(-EINVAL, "%s: tensor '%s' has %zu dims (at most %d)", f->path, name,
                       json_object_array_length(shape), SAFETENSORS_MAX_DIMS);
    t->name = strdup(name);
    if (!t->name)
        return err_set(-ENOMEM, "out of memory");
    t->file = f;
    snprintf(t->dtype_name, sizeof(t->dtype_name), "%s", json_object_get_string(dtype));
    t->dtype = dtype_parse(json_object_get_string(dtype));
    t->n_dims = (uint32_t)json_object_array_length(shape);
    for (uint32_t i = 0; i < t->n_dims; i++) {
        if (json_u64(json_object_array_get_idx(shape, i), &t->shape[i]))
            return err_set(-EINVAL, "%s: tensor '%s': shape[%u] is not a non-negative integer",
                           f->path, name, i);
        if (t->shape[i] && n > UINT64_MAX / t->shape[i])
            return err_set(-EOVERFLOW, "%s: tensor '%s': the shape's element count overflows",
                           f->path, name);
        n *= t->shape[i];
    }
    t->n_elements = n;
    if (json_u64(json_object_array_get_idx(offs, 0), &begin) ||
        json_u64(json_object_array_get_idx(offs, 1), &end))
        return err_set(-EINVAL, "%s: tensor '%s': data_offsets are not non-negative integers",
                       f->path, name);
    if (begin > end || end > data_size)
        return err_set(-EINVAL,
                       "%s: tensor '%s': data_offsets [%llu, %llu) lie outside the "
                       "data section of %llu bytes (truncated file?)",
                       f->path, name, (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)data_size);
    uint32_t es = safetensors_dtype_size(t->dtype);
    if (es && (n > UINT64_MAX / es || n * es != end - begin))
        return err_set(-EINVAL, "%s: tensor '%s': %llu bytes for %llu elements of %s", f->path,
                       name, (unsigned long long)(end - begin), (unsigned long long)n,
                       t->dtype_name);
    t->size = end - begin;
    t->data = f->base + f->data_offset + begin;
    return 0;
}

static int tensor_cmp(const void *a, const void *b)
{
    return strcmp(((const struct safetensors_tensor *)a)->name,
                  ((const struct safetensors_tensor *)b)->name);
}

/* Parses the JSON header at f->base + 8 (len bytes). */
static int header_parse(struct safetensors_file *f, uint64_t len)
{
    struct json_tokener *tok = json_tokener_new();
    json_object *root;
    int rc = 0;

    if (!tok)
        return err_set(-ENOMEM, "out of memory");
    root = json_tokener_parse_ex(tok, (const char *)f->base + 8, (int)len);
    if (!root || json_tokener_get_error(tok) != json_tokener_success) {
        rc = err_set(-EINVAL, "%s: the header is not valid JSON (%s)", f->path,
                     json_tokener_error_desc(json_tokener_get_error(tok)));
        goto out;
    }
    for (size_t i = json_tokener_get_parse_end(tok); i < len; i++) {
        char c = (char)f->base[8 + i];
        if (c != ' ' && c != '\n' && c != '\r' && c != '\t') {
            rc =
                err_set(-EINVAL, "%s: bytes after the header's JSON at offset %zu", f->path, 8 + i);
            goto out;
        }
    }
    if (!json_object_is_type(root, json_type_object)) {
        rc = err_set(-EINVAL, "%s: the header is not a JSON object", f->path);
        goto out;
    }
    size_t n = (size_t)json_object_object_length(root);
    f->tensors = calloc(n ? n : 1, sizeof(*f->tensors));
    if (!f->tensors) {
        rc = err_set(-ENOMEM, "out of memory");
        goto out;
    }
    uint64_t data_size = f->size - f->data_offset;
    json_object_object_foreach(root, key, val)
    {
        if (!strcmp(key, "__metadata__"))
            continue;
        rc = tensor_parse(f, key, val, data_size, &f->tensors[f->n_tensors]);
        f->n_tensors++; /* counted even on failure so that close frees the name */
        if (rc)
            goto out;
    }
    qsort(f->tensors, f->n_tensors, sizeof(*f->tensors), tensor_cmp);
out:
    json_object_put(root);
    json_tokener_free(tok);
    return rc;
}

/* Checks the header length of f->base/f->size and parses the header; messages name f->path. */
static int safetensors_parse(struct safetensors_file *f)
{
    uint64_t hlen = 0;

    if (f->size < 8)
        return err_set(-EINVAL, "%s: %llu bytes, too short for a safetensors header", f->path,
                       (unsigned long long)f->size);
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)f->base[i] << (8 * i);
    if (hlen < 2 || hlen > SAFETENSORS_MAX_HEADER || hlen > f->size - 8)
        return err_set(-EINVAL,
                       "%s: header length %llu does not fit the file of %llu bytes "
                       "(limit %u)",
                       f->path, (unsigned long long)hlen, (unsigned long long)f->size,
                       SAFETENSORS_MAX_HEADER);
    f->data_offset = 8 + hlen;
    return header_parse(f, hlen);
}

int safetensors_open_memory(const void *buf, uint64_t size, const char *name,
                            struct safetensors_file **out)
{
    struct safetensors_file *f = calloc(1, sizeof(*f));
    int rc;

    *out = NULL;
    if (!f || !(f->path = strdup(name ? name : "(memory)"))) {
        free(f);
        return err_set(-ENOMEM, "out of memory");
    }
    f->base = buf;
    f->size = size;
    rc = safetensors_parse(f);
    if (rc) {
        safetensors_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

int safetensors_open(const char *path, struct safetensors_file **out)
{
    struct safetensors_file *f;
    struct stat st;
    int fd, rc;

    *out = NULL;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return err_set(-errno, "%s: %s", path, strerror(errno));
    f = calloc(1, sizeof(*f));
    if (!f || !(f->path = strdup(path))) {
        close(fd);
        free(f);
        return err_set(-ENOMEM, "out of memory");
    }
    if (fstat(fd, &st) < 0) {
        rc = err_set(-errno, "%s: %s", path, strerror(errno));
        goto out_close;
    }
    f->size = (uint64_t)st.st_size;
    if (f->size < 8) {
        rc = err_set(-EINVAL, "%s: %llu bytes, too short for a safetensors header", path,
                     (unsigned long long)f->size);
        goto out_close;
    }
    void *map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        rc = err_set(-errno, "%s: mmap: %s", path, strerror(errno));
        goto out_close;
    }
    close(fd);
    fd = -1;
    f->base = map;
    f->mapped = true;
    rc = safetensors_parse(f);
    if (rc)
        goto out_close;
    *out = f;
    return 0;

out_close:
    if (fd >= 0)
        close(fd);
    safetensors_close(f);
    return rc;
}

void safetensors_close(struct safetensors_file *f)
{
    if (!f)
        return;
    for (uint32_t i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    if (f->base && f->mapped)
        munmap((void *)f->base, f->size);
    free(f->path);
    free(f);
}

const struct safetensors_tensor *safetensors_find(const struct safetensors_file *f,
                                                  const char *name)
{
    struct safetensors_tensor key = {.name = (char *)name};
    return bsearch(&key, f->tensors, f->n_tensors, sizeof(*f->tensors), tensor_cmp);
}
