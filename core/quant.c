#include "quant.h"

#include <ctype.h>
#include <string.h>

#include "errors.h"

#define T(id, nm, blk, sz, deq, q) [id] = {nm, blk, sz, deq, q}

static const struct quant_type_info type_table[QUANT_TYPE_COUNT] = {
    T(QUANT_F32, "F32", 1, 4, true, true),
    T(QUANT_F16, "F16", 1, 2, true, true),
    T(QUANT_Q4_0, "Q4_0", QK_32, sizeof(struct block_q4_0), true, true),
    T(QUANT_Q4_1, "Q4_1", QK_32, sizeof(struct block_q4_1), false, false),
    T(QUANT_Q5_0, "Q5_0", QK_32, sizeof(struct block_q5_0), false, false),
    T(QUANT_Q5_1, "Q5_1", QK_32, sizeof(struct block_q5_1), false, false),
    T(QUANT_Q8_0, "Q8_0", QK_32, sizeof(struct block_q8_0), true, true),
    T(QUANT_Q8_1, "Q8_1", QK_32, sizeof(struct block_q8_1), false, false),
    T(QUANT_Q2_K, "Q2_K", QK_K, sizeof(struct block_q2_k), true, false),
    T(QUANT_Q3_K, "Q3_K", QK_K, sizeof(struct block_q3_k), true, false),
    T(QUANT_Q4_K, "Q4_K", QK_K, sizeof(struct block_q4_k), true, true),
    T(QUANT_Q5_K, "Q5_K", QK_K, sizeof(struct block_q5_k), true, true),
    T(QUANT_Q6_K, "Q6_K", QK_K, sizeof(struct block_q6_k), true, true),
    T(QUANT_Q8_K, "Q8_K", QK_K, sizeof(struct block_q8_k), false, false),
    T(QUANT_IQ4_NL, "IQ4_NL", QK_32, sizeof(struct block_iq4_nl), false, false),
    T(QUANT_IQ4_XS, "IQ4_XS", QK_K, sizeof(struct block_iq4_xs), false, false),
    T(QUANT_I8, "I8", 1, 1, false, false),
    T(QUANT_I16, "I16", 1, 2, false, false),
    T(QUANT_I32, "I32", 1, 4, false, false),
    T(QUANT_I64, "I64", 1, 8, false, false),
    T(QUANT_F64, "F64", 1, 8, false, false),
    T(QUANT_BF16, "BF16", 1, 2, true, true),
    T(QUANT_MXFP4, "MXFP4", QK_32, sizeof(struct block_mxfp4), true, true),
};

const struct quant_type_info *quant_type_find(uint32_t type)
{
    if (type >= QUANT_TYPE_COUNT || type_table[type].name == NULL)
        return NULL;
    return &type_table[type];
}

const char *quant_type_name(uint32_t type)
{
    const struct quant_type_info *t = quant_type_find(type);
    return t ? t->name : "unknown";
}

int quant_type_parse(const char *name, enum quant_type *out)
{
    for (uint32_t id = 0; id < QUANT_TYPE_COUNT; id++) {
        const char *n = type_table[id].name;
        if (n && strcasecmp(n, name) == 0) {
            *out = (enum quant_type)id;
            return 0;
        }
    }
    return err_set(-EINVAL, "unknown tensor type '%s'", name);
}

int quant_row_bytes(uint32_t type, uint64_t n, uint64_t *out)
{
    const struct quant_type_info *t = quant_type_find(type);
    if (!t)
        return err_set(-EINVAL, "unknown tensor type id %u", type);
    if (n % t->block)
        return err_set(-EINVAL, "row of %llu elements is not a multiple of the %s block (%u)",
                       (unsigned long long)n, t->name, t->block);
    if (__builtin_mul_overflow(n / t->block, (uint64_t)t->bytes, out))
        return err_set(-EOVERFLOW, "row of %llu %s elements overflows 64 bits",
                       (unsigned long long)n, t->name);
    return 0;
}

int quant_tensor_bytes(uint32_t type, uint32_t n_dims, const uint64_t *ne, uint64_t *out)
{
    uint64_t bytes = 0;
    int rc;

    if (n_dims == 0)
        return quant_row_bytes(type, 1, out);
    rc = quant_row_bytes(type, ne[0], &bytes);
    if (rc)
        return rc;
    for (uint32_t i = 1; i < n_dims; i++) {
        if (__builtin_mul_overflow(bytes, ne[i], &bytes))
            return err_set(-EOVERFLOW, "tensor size overflows 64 bits at dimension %u", i);
    }
    *out = bytes;
    return 0;
}
