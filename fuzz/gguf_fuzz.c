/* gguf_fuzz: libFuzzer target for the GGUF reader.
 *
 * Parses the input with gguf_open_memory and, when it is accepted, reads every byte that the
 * parsed file points at (strings, array elements, the first and last byte of every tensor) and
 * checks the invariants gguf.h promises, so the sanitizers see any view outside the input and
 * a broken invariant crashes. tests/test_gguf.c includes this file to run the same walk over
 * its malformed corpus.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_require(int cond)
{
    if (!cond)
        abort();
}

/* Sums the bytes of a view so that every one of them is read. */
static unsigned fuzz_touch(const uint8_t *base, uint64_t size, const void *p, uint64_t n)
{
    const uint8_t *b = p;
    unsigned sum = 0;

    fuzz_require(n == 0 || (b >= base && n <= size && (uint64_t)(b - base) <= size - n));
    for (uint64_t i = 0; i < n; i++)
        sum += b[i];
    return sum;
}

static unsigned fuzz_walk_kv(const struct gguf_file *f, const struct gguf_kv *kv)
{
    const struct gguf_value *v = &kv->value;
    struct gguf_value e;
    unsigned sum = 0;

    fuzz_require(gguf_find_kv(f, kv->key) == kv);
    fuzz_require(kv->key[0] != '\0' && strlen(kv->key) <= GGUF_KEY_MAX);
    if (v->type == GGUF_TYPE_STRING)
        return fuzz_touch(f->base, f->size, v->str.ptr, v->str.len);
    if (v->type == GGUF_TYPE_BOOL)
        fuzz_require(v->u64 <= 1);
    if (v->type != GGUF_TYPE_ARRAY)
        return 0;
    fuzz_require(v->arr.elem_type != GGUF_TYPE_ARRAY);
    for (uint64_t i = 0; i < v->arr.count; i++) {
        fuzz_require(gguf_arr_get(v, i, &e) == 0);
        fuzz_require(e.type == v->arr.elem_type);
        if (e.type == GGUF_TYPE_STRING)
            sum += fuzz_touch(f->base, f->size, e.str.ptr, e.str.len);
        else if (e.type == GGUF_TYPE_BOOL)
            fuzz_require(e.u64 <= 1);
    }
    return sum;
}

static unsigned fuzz_walk_tensor(const struct gguf_file *f, const struct gguf_tensor *t)
{
    const uint8_t *d = t->data;

    fuzz_require(gguf_find_tensor(f, t->name) == t);
    fuzz_require(t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS && t->size > 0);
    fuzz_require(t->offset % f->alignment == 0);
    fuzz_require(d == f->base + f->data_offset + t->offset);
    return fuzz_touch(f->base, f->size, d, 1) + fuzz_touch(f->base, f->size, d + t->size - 1, 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gguf_file *f;
    volatile unsigned sink = 0;

    if (gguf_open_memory(data, size, &f) != 0)
        return 0;
    fuzz_require(f->alignment != 0 && (f->alignment & (f->alignment - 1)) == 0);
    for (uint64_t i = 0; i < f->n_kv; i++)
        sink += fuzz_walk_kv(f, &f->kv[i]);
    for (uint64_t i = 0; i < f->n_tensors; i++)
        sink += fuzz_walk_tensor(f, &f->tensors[i]);
    gguf_close(f);
    (void)sink;
    return 0;
}
