/* strata inspect: a GGUF file's header, metadata, tensor table, bytes per type and expert
 * bytes per layer. Everything it prints comes from the validated table of gguf_open. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "errors.h"
#include "gguf.h"
#include "quant.h"
#include "run_opts.h"

#define INSPECT_TENSORS_SHOWN 20 /* tensors listed without --tensors */
#define INSPECT_ELEMS_SHOWN 8    /* array elements listed without --kv-full */
#define INSPECT_STR_SHOWN 64     /* string bytes shown without --kv-full */

enum inspect_flags {
    INSPECT_ALL_TENSORS = 1 << 0, /* --tensors */
    INSPECT_KV_FULL = 1 << 1,     /* --kv-full */
};

typedef unsigned long long ull; /* for printf of uint64_t */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata inspect [FILE] [--tensors] [--kv-full]\n\n"
            "Validates a GGUF file and prints its header (version, alignment, data offset, file\n"
            "size), all metadata, the tensor table, bytes per tensor type and, for MoE models,\n"
            "the expert bytes per layer (blk.N.ffn_{gate,up,down,gate_up}_exps, *_shexp).\n\n"
            "FILE defaults to the shipped default model (" STRATA_DEFAULT_MODEL ").\n\n"
            "options:\n"
            "  --tensors   list every tensor (default: the first %d and a count)\n"
            "  --kv-full   print strings and arrays in full (default: strings cut at %d bytes,\n"
            "              arrays show their first %d elements)\n"
            "  -h, --help  this text\n\n"
            "Exit status: 0 on success, 1 if the file cannot be opened or is malformed (the\n"
            "message names the key or tensor and the byte offset).\n",
            INSPECT_TENSORS_SHOWN, INSPECT_STR_SHOWN, INSPECT_ELEMS_SHOWN);
}

/* "1.50 GiB" style size into buf. */
static const char *human_bytes(uint64_t n, char *buf, size_t size)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)n;
    int u = 0;

    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, size, "%llu B", (ull)n);
    else
        snprintf(buf, size, "%.2f %s", v, units[u]);
    return buf;
}

/* ---- metadata ------------------------------------------------------------------------------ */

/* Prints a string quoted, control bytes escaped, cut at max bytes (0: no limit). */
static void print_str(struct gguf_str s, uint64_t max)
{
    uint64_t n = max && s.len > max ? max : s.len;

    while (n < s.len && n > 0 && ((unsigned char)s.ptr[n] & 0xc0) == 0x80)
        n--; /* cut before a UTF-8 continuation byte, not inside a character */

    putchar('"');
    for (uint64_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch == '\n')
            fputs("\\n", stdout);
        else if (ch < 0x20 || ch == 0x7f)
            printf("\\x%02x", ch);
        else
            putchar(ch);
    }
    putchar('"');
    if (n < s.len)
        printf("... (%llu bytes)", (ull)s.len);
}

static void print_scalar(const struct gguf_value *v, unsigned flags)
{
    switch (v->type) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_UINT64: printf("%llu", (ull)v->u64); break;
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_INT16:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_INT64: printf("%lld", (long long)v->i64); break;
    case GGUF_TYPE_FLOAT32:
    case GGUF_TYPE_FLOAT64: printf("%.9g", v->f64); break;
    case GGUF_TYPE_BOOL: fputs(v->u64 ? "true" : "false", stdout); break;
    case GGUF_TYPE_STRING:
        print_str(v->str, flags & INSPECT_KV_FULL ? 0 : INSPECT_STR_SHOWN);
        break;
    default: fputs("?", stdout); break;
    }
}

static void print_array(const struct gguf_value *v, unsigned flags)
{
    uint64_t n = v->arr.count;
    struct gguf_value e;

    if (!(flags & INSPECT_KV_FULL) && n > INSPECT_ELEMS_SHOWN)
        n = INSPECT_ELEMS_SHOWN;
    printf("%s[%llu]", gguf_value_type_name(v->arr.elem_type), (ull)v->arr.count);
    for (uint64_t i = 0; i < n; i++) {
        fputs(i ? ", " : " ", stdout);
        if (gguf_arr_get(v, i, &e) == 0)
            print_scalar(&e, flags);
    }
    if (n < v->arr.count)
        fputs(", ...", stdout);
}

static void print_metadata(const struct gguf_file *f, unsigned flags)
{
    int width = 0;

    for (uint64_t i = 0; i < f->n_kv; i++) {
        int len = (int)strlen(f->kv[i].key);
        width = len > width ? len : width;
    }
    width = width > 44 ? 44 : width;
    printf("\nmetadata (%llu keys):\n", (ull)f->n_kv);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const struct gguf_value *v = &f->kv[i].value;
        printf("  %-*s  %-7s  ", width, f->kv[i].key, gguf_value_type_name(v->type));
        if (v->type == GGUF_TYPE_ARRAY)
            print_array(v, flags);
        else
            print_scalar(v, flags);
        putchar('\n');
    }
}

/* ---- tensors ------------------------------------------------------------------------------- */

static const char *dims_str(const struct gguf_tensor *t, char *buf, size_t size)
{
    size_t off = 0;

    buf[0] = '\0';
    for (uint32_t d = 0; d < t->n_dims && off < size; d++)
        off += (size_t)snprintf(buf + off, size - off, "%s%llu", d ? " x " : "", (ull)t->ne[d]);
    return buf;
}

static void print_tensors(const struct gguf_file *f, unsigned flags)
{
    uint64_t n = f->n_tensors;
    char dims[96], hb[32];

    if (!(flags & INSPECT_ALL_TENSORS) && n > INSPECT_TENSORS_SHOWN)
        n = INSPECT_TENSORS_SHOWN;
    printf("\ntensors (%llu):\n", (ull)f->n_tensors);
    if (n)
        printf("  %5s  %-40s %-7s %-24s %14s %14s\n", "#", "name", "type", "dims (ne0 first)",
               "file offset", "bytes");
    for (uint64_t i = 0; i < n; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        printf("  %5llu  %-40s %-7s %-24s %14llu %14llu  %s\n", (ull)i, t->name,
               quant_type_name(t->type), dims_str(t, dims, sizeof(dims)),
               (ull)(f->data_offset + t->offset), (ull)t->size,
               human_bytes(t->size, hb, sizeof(hb)));
    }
    if (n < f->n_tensors)
        printf("  ... %llu more (--tensors lists all)\n", (ull)(f->n_tensors - n));
}

static void print_type_bytes(const struct gguf_file *f)
{
    uint64_t count[QUANT_TYPE_COUNT] = {0}, bytes[QUANT_TYPE_COUNT] = {0};
    char hb[32];

    for (uint64_t i = 0; i < f->n_tensors; i++) {
        count[f->tensors[i].type]++; /* type < QUANT_TYPE_COUNT: checked by gguf_open */
        bytes[f->tensors[i].type] += f->tensors[i].size;
    }
    if (f->n_tensors == 0)
        return;
    printf("\nbytes per type:\n  %-7s %8s %16s %12s %8s\n", "type", "tensors", "bytes", "",
           "% file");
    for (uint32_t t = 0; t < QUANT_TYPE_COUNT; t++) {
        if (!count[t])
            continue;
        printf("  %-7s %8llu %16llu %12s %7.2f%%\n", quant_type_name(t), (ull)count[t],
               (ull)bytes[t], human_bytes(bytes[t], hb, sizeof(hb)),
               100.0 * (double)bytes[t] / (double)f->size);
    }
}

/* ---- experts per layer --------------------------------------------------------------------- */

struct layer_experts {
    uint64_t layer;
    uint64_t routed_bytes; /* all *_exps tensors of the layer */
    uint64_t n_expert;     /* last dim of the *_exps tensors; 0 if none seen */
    bool mismatch;         /* *_exps tensors disagree on the expert count */
    uint64_t shared_bytes; /* *_shexp tensors */
};

static const char *const routed_suffixes[] = {
    "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight",
    "ffn_gate_up_exps.weight", "ffn_gate_exps.bias", "ffn_up_exps.bias",
    "ffn_down_exps.bias", "ffn_gate_up_exps.bias"};
static const char *const shared_suffixes[] = {"ffn_gate_shexp.weight", "ffn_up_shexp.weight",
                                              "ffn_down_shexp.weight"};

static bool suffix_in(const char *s, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(s, list[i]))
            return true;
    }
    return false;
}

/* "blk.N.<rest>": *layer = N and *rest points after the dot; false for other names. */
static bool name_split_layer(const char *name, uint64_t *layer, const char **rest)
{
    char *end;

    if (strncmp(name, "blk.", 4) != 0 || name[4] < '0' || name[4] > '9')
        return false;
    *layer = strtoull(name + 4, &end, 10);
    if (*end != '.')
        return false;
    *rest = end + 1;
    return true;
}

static struct layer_experts *layer_slot(struct layer_experts *ls, uint64_t *n, uint64_t layer)
{
    for (uint64_t i = 0; i < *n; i++) {
        if (ls[i].layer == layer)
            return &ls[i];
    }
    memset(&ls[*n], 0, sizeof(ls[*n]));
    ls[*n].layer = layer;
    return &ls[(*n)++];
}

static void layer_add(struct layer_experts *l, const struct gguf_tensor *t, bool routed)
{
    uint64_t e = t->ne[t->n_dims - 1];

    if (!routed) {
        l->shared_bytes += t->size;
        return;
    }
    l->routed_bytes += t->size;
    if (l->n_expert && l->n_expert != e)
        l->mismatch = true;
    l->n_expert = l->n_expert ? l->n_expert : e;
}

static int cmp_layer(const void *a, const void *b)
{
    uint64_t x = ((const struct layer_experts *)a)->layer;
    uint64_t y = ((const struct layer_experts *)b)->layer;
    return (x > y) - (x < y);
}

/* Collects per-layer expert bytes into ls (room for n_tensors); returns the layer count. */
static uint64_t experts_collect(const struct gguf_file *f, struct layer_experts *ls)
{
    uint64_t n = 0, layer;
    const char *rest;

    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_tensor *t = &f->tensors[i];
        bool routed, shared;

        if (!name_split_layer(t->name, &layer, &rest))
            continue;
        routed = suffix_in(rest, routed_suffixes, 8);
        shared = suffix_in(rest, shared_suffixes, 3);
        if (routed || shared)
            layer_add(layer_slot(ls, &n, layer), t, routed);
    }
    qsort(ls, n, sizeof(*ls), cmp_layer);
    return n;
}

static void print_layer(const struct layer_experts *l)
{
    char per[32], hb[32];

    if (l->n_expert && !l->mismatch)
        snprintf(per, sizeof(per), "%llu", (ull)(l->routed_bytes / l->n_expert));
    else
        snprintf(per, sizeof(per), "%s", l->mismatch ? "mismatch" : "-");
    printf("  %6llu %8llu %16llu %12s %14s %14llu\n", (ull)l->layer, (ull)l->n_expert,
           (ull)l->routed_bytes, human_bytes(l->routed_bytes, hb, sizeof(hb)), per,
           (ull)l->shared_bytes);
}

static int print_experts(const struct gguf_file *f)
{
    struct layer_experts *ls = malloc((f->n_tensors ? f->n_tensors : 1) * sizeof(*ls));
    uint64_t n, routed = 0, shared = 0, experts = 0;
    char hb[32];

    if (!ls)
        return err_set(-ENOMEM, "out of memory");
    n = experts_collect(f, ls);
    if (n == 0) {
        printf("\nexperts per layer: none (no blk.N.ffn_*_exps tensors)\n");
        free(ls);
        return 0;
    }
    printf("\nexperts per layer (routed: ffn_{gate,up,down,gate_up}_exps; shared: *_shexp):\n");
    printf("  %6s %8s %16s %12s %14s %14s\n", "layer", "experts", "routed bytes", "",
           "bytes/expert", "shared bytes");
    for (uint64_t i = 0; i < n; i++) {
        print_layer(&ls[i]);
        routed += ls[i].routed_bytes;
        shared += ls[i].shared_bytes;
        experts += ls[i].n_expert;
    }
    printf("  %6s %8llu %16llu %12s %14s %14llu\n", "total", (ull)experts, (ull)routed,
           human_bytes(routed, hb, sizeof(hb)), "", (ull)shared);
    printf("  routed experts are %.2f%% of the file, shared experts %.2f%%\n",
           100.0 * (double)routed / (double)f->size, 100.0 * (double)shared / (double)f->size);
    free(ls);
    return 0;
}

/* ---- command ------------------------------------------------------------------------------- */

static void print_header(const struct gguf_file *f)
{
    char hb[32];

    printf("file          %s\n", f->path);
    printf("GGUF version  %u\n", f->version);
    printf("alignment     %llu\n", (ull)f->alignment);
    printf("data offset   %llu (0x%llx)\n", (ull)f->data_offset, (ull)f->data_offset);
    printf("file size     %llu (%s)\n", (ull)f->size, human_bytes(f->size, hb, sizeof(hb)));
    printf("keys          %llu\n", (ull)f->n_kv);
    printf("tensors       %llu\n", (ull)f->n_tensors);
}

int cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    struct gguf_file *f = NULL;
    unsigned flags = 0;
    int rc;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--tensors")) {
            flags |= INSPECT_ALL_TENSORS;
        } else if (!strcmp(argv[i], "--kv-full")) {
            flags |= INSPECT_KV_FULL;
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "strata inspect: unexpected argument '%s' (see --help)\n", argv[i]);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (run_opts_model("inspect", &path))
        return 1;
    rc = gguf_open(path, &f);
    if (rc)
        return cli_fail("inspect");
    print_header(f);
    print_metadata(f, flags);
    print_tensors(f, flags);
    print_type_bytes(f);
    rc = print_experts(f);
    gguf_close(f);
    return rc ? cli_fail("inspect") : 0;
}
