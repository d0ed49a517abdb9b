/* gguf: reader (over mmap) and streaming writer for GGUF v2/v3 files.
 *
 * The file is hostile input. gguf_open checks every count, length, offset, product and
 * alignment before use and fails with -EINVAL/-EOVERFLOW/-ERANGE and an err_msg() that names
 * the key or tensor and the byte offset. It never reads outside the mapping.
 *
 * Layout: docs/formats.md §1 (GGUF).
 */
#ifndef STRATA_GGUF_H
#define STRATA_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

enum gguf_value_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
};

/* A string inside the mapping: NOT NUL-terminated. */
struct gguf_str {
    const char *ptr; /* view into the mapping */
    uint64_t len;
};

struct gguf_value {
    enum gguf_value_type type;
    union {
        uint64_t u64; /* UINT8/16/32/64 and BOOL, zero-extended */
        int64_t i64;  /* INT8/16/32/64, sign-extended */
        double f64;   /* FLOAT32/64 */
        struct gguf_str str;
        struct {
            enum gguf_value_type elem_type; /* never ARRAY: nested arrays are rejected */
            uint64_t count;
            const void *data;          /* fixed-size elements: raw LE bytes in the mapping */
            const struct gguf_str *strs; /* STRING elements: (count) index, owned by the file */
        } arr;
    };
};

struct gguf_kv {
    char *key;               /* NUL-terminated copy, owned by the file */
    struct gguf_value value;
    uint64_t offset;         /* byte offset of the record in the file */
};

struct gguf_tensor {
    char *name;                  /* NUL-terminated copy, owned by the file */
    uint32_t n_dims;             /* 1..4 */
    uint64_t ne[GGUF_MAX_DIMS];  /* ne[0] contiguous; unused dims are 1 */
    uint32_t type;               /* ggml type id, known to core/quant.h */
    uint64_t offset;             /* relative to the data section, as stored */
    uint64_t size;               /* bytes, from the type table */
    const void *data;            /* view into the mapping: data_offset + offset */
    uint64_t info_offset;        /* byte offset of the tensor-info record in the file */
};

struct gguf_file {
    const uint8_t *base;  /* the mapping (or the caller's buffer for gguf_open_memory) */
    uint64_t size;        /* bytes in the mapping */
    uint32_t version;     /* 2 or 3 */
    uint64_t alignment;   /* general.alignment or 32 */
    uint64_t data_offset; /* start of the data section in the file */
    uint64_t n_kv;
    struct gguf_kv *kv;           /* (n_kv) owned */
    uint64_t n_tensors;
    struct gguf_tensor *tensors;  /* (n_tensors) owned, in file order */
    char *path;                   /* owned copy, or NULL for memory */
    int fd;                       /* -1 for memory */
    int64_t mtime_ns;             /* the file's modification time when opened (0 for memory) */
    bool mapped;                  /* base came from mmap and is unmapped by gguf_close */
};

/* Opens and validates PATH. On success *out owns the mapping; 0 or -errno. */
int gguf_open(const char *path, struct gguf_file **out);

/* Same checks over a caller-owned buffer that must outlive the file (tests, fuzzing). */
int gguf_open_memory(const void *buf, uint64_t size, struct gguf_file **out);

void gguf_close(struct gguf_file *f);

/* Lookup. _find returns NULL when absent. */
const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);

/* Typed getters: 0, -ENOENT if the key is absent (message names it), -EINVAL if its type does
 * not convert (any integer type converts to another if the value fits, else -ERANGE). */
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out);
int gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out);
int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out);
int gguf_get_f32(const struct gguf_file *f, const char *key, float *out);
int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out);
int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *out);
/* An array value: its element type and count; elements through arr.data / arr.strs. */
int gguf_get_arr(const struct gguf_file *f, const char *key, const struct gguf_value **out);

const char *gguf_value_type_name(enum gguf_value_type t);

/* ---- writer ------------------------------------------------------------------------------
 * Usage: open; add KVs and tensor infos in any order; begin_data (lays out the file, writes
 * the header and pre-sizes the file); write tensor bytes either sequentially in info order with
 * gguf_writer_write, or from several threads with gguf_writer_pwrite; finish (fsync, rename
 * the temp file over PATH). On any failure call gguf_writer_abort (removes the temp file).
 * Nothing appears at PATH until finish succeeds.
 */
struct gguf_writer;

int gguf_writer_open(const char *path, uint32_t alignment, struct gguf_writer **out);
int gguf_writer_add_u32(struct gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_add_i32(struct gguf_writer *w, const char *key, int32_t v);
int gguf_writer_add_u64(struct gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_add_f32(struct gguf_writer *w, const char *key, float v);
int gguf_writer_add_bool(struct gguf_writer *w, const char *key, bool v);
int gguf_writer_add_str(struct gguf_writer *w, const char *key, const char *s);
/* Array of fixed-size elements (elem_type not STRING/ARRAY), copied. */
int gguf_writer_add_arr(struct gguf_writer *w, const char *key, enum gguf_value_type elem_type,
                        const void *data, uint64_t count);
/* Array of strings; lens may be NULL for NUL-terminated strings. Copied. */
int gguf_writer_add_arr_str(struct gguf_writer *w, const char *key, const char *const *strs,
                            const uint64_t *lens, uint64_t count);
/* Declares a tensor; returns its index (>= 0) or -errno (bad shape/type, duplicate name). */
int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, uint32_t type,
                           uint32_t n_dims, const uint64_t *ne);
int gguf_writer_begin_data(struct gguf_writer *w);
/* Size and absolute file offset of tensor idx (valid after begin_data). */
int gguf_writer_tensor_extent(const struct gguf_writer *w, int idx, uint64_t *file_offset,
                              uint64_t *size);
/* Sequential: appends bytes of the tensors in declaration order (any chunking). */
int gguf_writer_write(struct gguf_writer *w, const void *buf, uint64_t len);
/* Positional and thread-safe: writes len bytes at offset `at` inside tensor idx. */
int gguf_writer_pwrite(struct gguf_writer *w, int idx, uint64_t at, const void *buf,
                       uint64_t len);
int gguf_writer_finish(struct gguf_writer *w); /* frees w */
void gguf_writer_abort(struct gguf_writer *w); /* frees w, removes the temp file */

/* ---- additions (appended; the declarations above are unchanged) --------------------------- */

/* What gguf_open accepts, where the format leaves room (details in gguf.c):
 * - versions 2 and 3 only; a version with zero low 16 bits is reported as big-endian;
 * - keys 1..GGUF_KEY_MAX bytes, tensor names 1..GGUF_NAME_MAX bytes, neither with a NUL byte,
 *   both unique; BOOL values (scalars and array elements) 0 or 1; no nested arrays;
 * - general.alignment, if present, a UINT32 nonzero power of two;
 * - n_dims 1..4 and every dim 1..INT64_MAX (an empty tensor is rejected); type ids known to
 *   quant_type_find; ne[0] a multiple of the block;
 * - each tensor offset a multiple of the alignment, its bytes inside the file, no two tensors
 *   overlapping (any order and gaps are allowed). */
#define GGUF_KEY_MAX 65535 /* longest key in bytes (docs/formats.md §1.2) */
#define GGUF_NAME_MAX 63   /* longest tensor name in bytes (ggml's GGML_MAX_NAME, less the NUL) */

/* Encoded size in bytes of one value of a fixed-size type; 0 for STRING, ARRAY and unknown. */
uint64_t gguf_value_type_size(enum gguf_value_type t);

/* Element i of an array value, decoded like a scalar (u64/i64/f64/str per its element type).
 * -EINVAL if arr is not an array, -ERANGE if i >= count. */
int gguf_arr_get(const struct gguf_value *arr, uint64_t i, struct gguf_value *out);

/* A scalar of any type other than STRING and ARRAY. value points at the matching C type:
 * uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool, uint64_t, int64_t,
 * double. The add_u32/... helpers above are this with a fixed type. */
int gguf_writer_add_scalar(struct gguf_writer *w, const char *key, enum gguf_value_type type,
                           const void *value);

/* Adds a copy of a key/value record read by gguf_open (any type, arrays included). */
int gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_kv *kv);

#endif
