/* libFuzzer target: the safetensors reader of strata convert (tools/convert/safetensors.c) over
 * arbitrary bytes. Whatever it accepts must keep every tensor inside the data section with a
 * byte size that matches its dtype (when known) and shape, findable by name. */
#include <stdint.h>
#include <stdlib.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct safetensors_file *f;
    if (safetensors_open_memory(data, size, "fuzz", &f))
        return 0;
    const uint8_t *lo = f->base + f->data_offset, *hi = f->base + f->size;
    for (uint32_t i = 0; i < f->n_tensors; i++) {
        const struct safetensors_tensor *t = &f->tensors[i];
        const uint8_t *p = t->data;
        if (p < lo || p > hi || t->size > (uint64_t)(hi - p))
            abort();
        /* unknown dtypes are kept (size 0) for the converter to refuse by name when used */
        uint32_t es = safetensors_dtype_size(t->dtype);
        if (es && t->n_elements * es != t->size)
            abort();
        if (safetensors_find(f, t->name) != t)
            abort();
    }
    safetensors_close(f);
    return 0;
}
