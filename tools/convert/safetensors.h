/* safetensors: a read-only view of one .safetensors file (Hugging Face's tensor container).
 *
 * Layout: u64 LE header length N, N bytes of JSON ({name: {dtype, shape, data_offsets},
 * "__metadata__": {...}}), then the data section; data_offsets [begin, end) are relative to
 * the data section. The file is hostile input: safetensors_open checks the header length, the
 * JSON types, every shape product and offset for overflow and that each tensor's bytes lie
 * inside the file and match dtype x shape, and names the tensor and file in its message. It
 * maps the file read-only and never reads outside the mapping.
 */
#ifndef STRATA_SAFETENSORS_H
#define STRATA_SAFETENSORS_H

#include <stdbool.h>
#include <stdint.h>

#define SAFETENSORS_MAX_DIMS 8
#define SAFETENSORS_MAX_HEADER (100u << 20) /* the reference implementation's limit */

enum safetensors_dtype {
    SAFETENSORS_UNKNOWN = 0, /* a dtype strata does not name: kept in the table, not usable */
    SAFETENSORS_BOOL,
    SAFETENSORS_U8,
    SAFETENSORS_I8,
    SAFETENSORS_F8_E4M3,
    SAFETENSORS_F8_E5M2,
    SAFETENSORS_I16,
    SAFETENSORS_U16,
    SAFETENSORS_F16,
    SAFETENSORS_BF16,
    SAFETENSORS_I32,
    SAFETENSORS_U32,
    SAFETENSORS_F32,
    SAFETENSORS_I64,
    SAFETENSORS_U64,
    SAFETENSORS_F64,
};

struct safetensors_tensor {
    char *name; /* NUL-terminated, owned by the file */
    enum safetensors_dtype dtype;
    char dtype_name[16];                  /* as written in the header (truncated) */
    uint32_t n_dims;                      /* 0 = scalar */
    uint64_t shape[SAFETENSORS_MAX_DIMS]; /* PyTorch order: shape[n_dims-1] is contiguous */
    uint64_t n_elements;                  /* product of shape */
    uint64_t size;                        /* bytes: end - begin */
    const void *data;                     /* view into the mapping; may be unaligned */
    const struct safetensors_file *file;  /* the owner */
};

struct safetensors_file {
    char *path;           /* owned copy */
    const uint8_t *base;  /* the mapping, or the caller's buffer (safetensors_open_memory) */
    bool mapped;          /* base is our mapping, unmapped by safetensors_close */
    uint64_t size;        /* bytes in the file */
    uint64_t data_offset; /* 8 + header length */
    uint32_t n_tensors;
    struct safetensors_tensor *tensors; /* (n_tensors) owned, sorted by name */
};

/* Opens and validates PATH. 0, or -ENOENT/-EIO (the file), -EINVAL (malformed: the message
 * names the file, the tensor and the field), -ENOMEM. */
int safetensors_open(const char *path, struct safetensors_file **out);
/* The same checks over a caller-owned buffer that must outlive f (tests, fuzzing); NAME stands
 * for the file in messages. */
int safetensors_open_memory(const void *buf, uint64_t size, const char *name,
                            struct safetensors_file **out);

void safetensors_close(struct safetensors_file *f);

/* The tensor called NAME, or NULL. */
const struct safetensors_tensor *safetensors_find(const struct safetensors_file *f,
                                                  const char *name);

/* Bytes per element of a dtype; 0 for SAFETENSORS_UNKNOWN. */
uint32_t safetensors_dtype_size(enum safetensors_dtype t);

/* Formats a tensor's shape as "[a, b, c]" into buf; returns buf. */
const char *safetensors_shape_str(const struct safetensors_tensor *t, char *buf, unsigned size);

#endif
