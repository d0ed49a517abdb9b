/* profile: counting, planning, and the text file of a residency profile (see profile.h). */
#include "profile.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "errors.h"
#include "gguf.h"
#include "model.h"
#include "model_arch.h"
#include "outfile.h"
#include "quant.h"

#define PROFILE_MAX_FILE (64ull << 20)
#define PROFILE_MAX_LAYERS 4096
#define PROFILE_MAX_EXPERTS 65536

/* ---- identity, counting, planning ----------------------------------------------------------- */

void profile_identity(const struct model *m, uint64_t *hash, struct profile_geometry *geo)
{
    const struct gguf_file *f = m->file;
    *hash = XXH64(f->base, (size_t)f->data_offset, 0);
    memset(geo, 0, sizeof(*geo));
    geo->n_layer = (int)m->hp.n_layer;
    geo->n_expert = (int)m->hp.n_expert;
    geo->n_expert_used = (int)m->hp.n_expert_used;
    for (int l = 0; l < geo->n_layer; l++) {
        const struct layer_weights *lw = &m->layers[l];
        uint64_t b = (lw->gate_exps.bytes + lw->up_exps.bytes + lw->down_exps.bytes) /
                     (geo->n_expert ? (uint64_t)geo->n_expert : 1);
        geo->expert_bytes = b > geo->expert_bytes ? b : geo->expert_bytes;
    }
    if (geo->n_layer > 0) {
        geo->type[0] = m->layers[0].gate_exps.type;
        geo->type[1] = m->layers[0].up_exps.type;
        geo->type[2] = m->layers[0].down_exps.type;
    }
}

static int profile_alloc(struct profile *p)
{
    size_t n = (size_t)p->geo.n_layer * (size_t)p->geo.n_expert;
    p->count = calloc(n ? n : 1, sizeof(*p->count));
    p->last = calloc(n ? n : 1, sizeof(*p->last));
    p->frozen = calloc(n ? n : 1, 1);
    if (p->count && p->last && p->frozen)
        return 0;
    profile_free(p);
    return err_set(-ENOMEM, "out of memory");
}

int profile_init(struct profile *p, const struct model *m)
{
    memset(p, 0, sizeof(*p));
    profile_identity(m, &p->model_hash, &p->geo);
    snprintf(p->arch, sizeof(p->arch), "%s", m->arch->name);
    p->dynamic_pct = PROFILE_DYNAMIC_PCT;
    snprintf(p->probe_mode, sizeof(p->probe_mode), "none");
    return profile_alloc(p);
}

void profile_free(struct profile *p)
{
    free(p->count);
    free(p->last);
    free(p->frozen);
    memset(p, 0, sizeof(*p));
}

void profile_add(struct profile *p, int layer, const int32_t *ids, int n_tok, int k)
{
    if (layer < 0 || layer >= p->geo.n_layer)
        return;
    if (layer == 0)
        p->n_steps++;
    for (int i = 0; i < n_tok * k; i++) {
        if (ids[i] < 0 || ids[i] >= p->geo.n_expert)
            continue;
        size_t at = (size_t)layer * p->geo.n_expert + ids[i];
        p->count[at]++;
        p->last[at] = p->n_steps;
    }
}

static const struct profile *plan_of; /* qsort has no context argument */

static int plan_cmp(const void *a, const void *b)
{
    size_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    const struct profile *p = plan_of;
    if (p->count[x] != p->count[y])
        return p->count[x] > p->count[y] ? -1 : 1;
    if (p->last[x] != p->last[y])
        return p->last[x] > p->last[y] ? -1 : 1;
    return (x > y) - (x < y); /* layer-major index: lower layer, then lower id */
}

void profile_plan(struct profile *p, int slots, int dynamic_pct)
{
    size_t n = (size_t)p->geo.n_layer * p->geo.n_expert;
    uint32_t *order = malloc(sizeof(*order) * (n ? n : 1));
    long dyn = slots > 1 ? ((long)slots * dynamic_pct + 99) / 100 : 0;

    if (slots > 1 && dyn < 1)
        dyn = 1;
    if (dyn > slots)
        dyn = slots;
    p->slots = slots;
    p->dynamic_pct = dynamic_pct;
    memset(p->frozen, 0, n);
    p->n_frozen = 0;
    if (!order)
        return; /* no frozen set: the cache starts cold */
    for (size_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    plan_of = p;
    qsort(order, n, sizeof(*order), plan_cmp);
    for (size_t i = 0; i < n && p->n_frozen < slots - dyn && p->count[order[i]]; i++) {
        p->frozen[order[i]] = 1;
        p->n_frozen++;
    }
    free(order);
}

void profile_frozen_list(const struct profile *p, int32_t *layer, int32_t *expert)
{
    size_t n = (size_t)p->geo.n_layer * p->geo.n_expert;
    uint32_t *order = malloc(sizeof(*order) * (n ? n : 1));
    int k = 0;
    if (!order) { /* index order then */
        for (size_t i = 0; i < n; i++)
            if (p->frozen[i]) {
                layer[k] = (int32_t)(i / p->geo.n_expert);
                expert[k++] = (int32_t)(i % p->geo.n_expert);
            }
        return;
    }
    for (size_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    plan_of = p;
    qsort(order, n, sizeof(*order), plan_cmp);
    for (size_t i = 0; i < n; i++)
        if (p->frozen[order[i]]) {
            layer[k] = (int32_t)(order[i] / p->geo.n_expert);
            expert[k++] = (int32_t)(order[i] % p->geo.n_expert);
        }
    free(order);
}

int profile_seed_list(const struct profile *p, int max, int32_t *layer, int32_t *expert)
{
    size_t n = (size_t)p->geo.n_layer * p->geo.n_expert;
    uint32_t *order = malloc(sizeof(*order) * (n ? n : 1));
    int k = 0;
    if (!order)
        return 0;
    for (size_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    plan_of = p;
    qsort(order, n, sizeof(*order), plan_cmp);
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < n && k < max; i++) {
            size_t x = order[i];
            if (pass == 0 ? !p->frozen[x] : p->frozen[x] || !p->count[x])
                continue;
            layer[k] = (int32_t)(x / p->geo.n_expert);
            expert[k++] = (int32_t)(x % p->geo.n_expert);
        }
    free(order);
    return k;
}

double profile_coverage(const struct profile *p, int layer)
{
    uint64_t all = 0, hit = 0;
    int l0 = layer < 0 ? 0 : layer, l1 = layer < 0 ? p->geo.n_layer : layer + 1;
    for (int l = l0; l < l1; l++) {
        for (int e = 0; e < p->geo.n_expert; e++) {
            size_t at = (size_t)l * p->geo.n_expert + e;
            all += p->count[at];
            hit += p->frozen[at] ? p->count[at] : 0;
        }
    }
    return all ? (double)hit / (double)all : 0;
}

static const char *type_name(uint32_t t)
{
    const char *n = quant_type_name(t);
    return n ? n : "?";
}

int profile_check(const struct profile *p, const struct model *m, const char *path)
{
    uint64_t hash;
    struct profile_geometry g;
    char why[512];
    size_t at = 0;

    profile_identity(m, &hash, &g);
#define WHY(...) at += (size_t)snprintf(why + at, at < sizeof(why) ? sizeof(why) - at : 0, __VA_ARGS__)
    if (g.n_layer != p->geo.n_layer)
        WHY("; layers %d here, %d in the profile", g.n_layer, p->geo.n_layer);
    if (g.n_expert != p->geo.n_expert)
        WHY("; experts %d here, %d in the profile", g.n_expert, p->geo.n_expert);
    if (g.n_expert_used != p->geo.n_expert_used)
        WHY("; experts per token %d here, %d in the profile", g.n_expert_used,
            p->geo.n_expert_used);
    if (g.expert_bytes != p->geo.expert_bytes)
        WHY("; expert bytes %" PRIu64 " here, %" PRIu64 " in the profile", g.expert_bytes,
            p->geo.expert_bytes);
    for (int i = 0; i < 3; i++)
        if (g.type[i] != p->geo.type[i])
            WHY("; %s type %s here, %s in the profile", i == 0 ? "gate" : i == 1 ? "up" : "down",
                type_name(g.type[i]), type_name(p->geo.type[i]));
#undef WHY
    if (hash == p->model_hash && at == 0)
        return 0;
    return err_set(-ESTALE,
                   "%s was made for another model (file identity %016" PRIx64 ", this model's is "
                   "%016" PRIx64 ")%s%s",
                   path, p->model_hash, hash, at ? ": " : "", at ? why + 2 : "");
}

/* ---- writing ------------------------------------------------------------------------------ */

static void put_ids(FILE *f, const char *key, const int32_t *ids, int n)
{
    fprintf(f, "%s %d", key, n);
    for (int i = 0; i < n; i++)
        fprintf(f, " %" PRId32, ids[i]);
    fputc('\n', f);
}

static void profile_emit(const struct profile *p, FILE *f)
{
    const struct profile_geometry *g = &p->geo;
    fprintf(f, "strata-profile %d\n", PROFILE_VERSION);
    fprintf(f, "# a strata residency profile: `strata profile show FILE` summarises it\n");
    fprintf(f, "model %016" PRIx64 " %s\n", p->model_hash, p->arch);
    fprintf(f, "geometry %d %d %d %" PRIu64 " %s %s %s\n", g->n_layer, g->n_expert,
            g->n_expert_used, g->expert_bytes, type_name(g->type[0]), type_name(g->type[1]),
            type_name(g->type[2]));
    fprintf(f, "budget %" PRIu64 " %d %d\n", p->vram_budget, p->slots, p->dynamic_pct);
    fprintf(f, "warmup %d %" PRIu64 " %" PRIu64 "\n", p->n_texts, p->n_tokens, p->n_steps);
    fprintf(f, "probe %s\n", p->probe_mode);
    put_ids(f, "probe-prompt", p->probe_prompt, p->n_probe_prompt);
    put_ids(f, "probe-out", p->probe_out, p->n_probe_out);
    for (int l = 0; l < g->n_layer; l++) {
        const size_t b = (size_t)l * g->n_expert;
        fprintf(f, "count %d", l);
        for (int e = 0; e < g->n_expert; e++)
            fprintf(f, " %" PRIu64, p->count[b + e]);
        fprintf(f, "\nlast %d", l);
        for (int e = 0; e < g->n_expert; e++)
            fprintf(f, " %" PRIu64, p->last[b + e]);
        fprintf(f, "\nfrozen %d", l);
        for (int e = 0; e < g->n_expert; e++)
            if (p->frozen[b + e])
                fprintf(f, " %d", e);
        fputc('\n', f);
    }
    fprintf(f, "end\n");
}

int profile_write(const struct profile *p, const char *path)
{
    struct outfile of;
    int rc = outfile_open(path, &of);
    if (rc)
        return rc;
    profile_emit(p, of.f);
    return outfile_commit(&of);
}

/* ---- parsing ------------------------------------------------------------------------------ */

struct pp {
    const char *name;
    int line;
    char *cur, *end; /* the rest of the current line */
};

static int pp_fail(const struct pp *s, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return err_set(-EINVAL, "%s:%d: %s", s->name, s->line, msg);
}

/* The next space-separated word of the line, NUL-terminated in place; NULL at its end. */
static char *pp_word(struct pp *s)
{
    while (s->cur < s->end && *s->cur == ' ')
        s->cur++;
    if (s->cur >= s->end)
        return NULL;
    char *w = s->cur;
    while (s->cur < s->end && *s->cur != ' ')
        s->cur++;
    if (s->cur < s->end)
        *s->cur++ = 0;
    return w;
}

/* A decimal integer in [lo, hi] as the next word. */
static int pp_u64(struct pp *s, const char *what, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *w = pp_word(s), *e;
    if (!w)
        return pp_fail(s, "%s is missing", what);
    if (*w < '0' || *w > '9')
        return pp_fail(s, "%s: '%.32s' is not a number", what, w);
    errno = 0;
    unsigned long long v = strtoull(w, &e, 10);
    if (errno || *e || v < lo || v > hi)
        return pp_fail(s, "%s: '%.32s' is not a number in %" PRIu64 "..%" PRIu64, what, w, lo, hi);
    *out = v;
    return 0;
}

static int pp_int(struct pp *s, const char *what, int lo, int hi, int *out)
{
    uint64_t v;
    int rc = pp_u64(s, what, (uint64_t)lo, (uint64_t)hi, &v);
    if (!rc)
        *out = (int)v;
    return rc;
}

static int pp_eol(struct pp *s)
{
    char *w = pp_word(s);
    return w ? pp_fail(s, "unexpected '%.32s' at the end of the line", w) : 0;
}

static int pp_type(struct pp *s, uint32_t *out)
{
    char *w = pp_word(s);
    if (!w)
        return pp_fail(s, "a quant type is missing");
    for (uint32_t t = 0; t < 64; t++) {
        const char *n = quant_type_name(t);
        if (n && !strcmp(n, w)) {
            *out = t;
            return 0;
        }
    }
    return pp_fail(s, "unknown quant type '%.32s'", w);
}

static int pp_ids(struct pp *s, const char *what, int32_t *ids, int *n, int max_id)
{
    *n = 0;
    int rc = pp_int(s, what, 0, PROFILE_PROBE_MAX, n);
    for (int i = 0; i < *n && !rc; i++) {
        int v = 0;
        rc = pp_int(s, what, 0, max_id, &v);
        ids[i] = v;
    }
    return rc ? rc : pp_eol(s);
}

enum { R_MODEL, R_GEOMETRY, R_BUDGET, R_WARMUP, R_PROBE, R_PROBE_PROMPT, R_PROBE_OUT, R_N };
static const char *const pp_records[R_N] = {"model",  "geometry",     "budget",   "warmup",
                                            "probe",  "probe-prompt", "probe-out"};

/* count/last/frozen L ...: one layer's record. seen: (n_layer * 3) records met so far. */
static int pp_layer(struct pp *s, struct profile *p, int which, uint8_t *seen)
{
    static const char *const names[3] = {"count", "last", "frozen"};
    const struct profile_geometry *g = &p->geo;
    int l, rc;

    if (!p->count)
        return pp_fail(s, "'%s' before 'geometry'", names[which]);
    if ((rc = pp_int(s, "the layer", 0, g->n_layer - 1, &l)))
        return rc;
    if (seen[(size_t)l * 3 + which]++)
        return pp_fail(s, "a second '%s' record for layer %d", names[which], l);
    size_t b = (size_t)l * g->n_expert;
    if (which < 2) {
        uint64_t *dst = which == 0 ? p->count : p->last;
        for (int e = 0; e < g->n_expert && !rc; e++)
            rc = pp_u64(s, which == 0 ? "a count" : "a step", 0, UINT64_MAX, &dst[b + e]);
        return rc ? rc : pp_eol(s);
    }
    char *w;
    while ((w = pp_word(s))) {
        char *e;
        errno = 0;
        long v = strtol(w, &e, 10);
        if (*w < '0' || *w > '9' || errno || *e || v >= g->n_expert)
            return pp_fail(s, "frozen expert '%.32s' is not an id in 0..%d", w, g->n_expert - 1);
        if (p->frozen[b + v])
            return pp_fail(s, "expert %ld of layer %d is frozen twice", v, l);
        p->frozen[b + v] = 1;
        p->n_frozen++;
    }
    return 0;
}

static int pp_record(struct pp *s, struct profile *p, int r)
{
    struct profile_geometry *g = &p->geo;
    int rc = 0;
    switch (r) {
    case R_MODEL: {
        char *h = pp_word(s), *a, *e;
        if (!h || strlen(h) != 16)
            return pp_fail(s, "the model identity must be 16 hex digits");
        errno = 0;
        p->model_hash = strtoull(h, &e, 16);
        if (errno || *e)
            return pp_fail(s, "the model identity '%.32s' is not hex", h);
        if (!(a = pp_word(s)) || strlen(a) >= sizeof(p->arch))
            return pp_fail(s, "the architecture is missing or too long");
        snprintf(p->arch, sizeof(p->arch), "%s", a);
        return pp_eol(s);
    }
    case R_GEOMETRY:
        rc = pp_int(s, "layers", 1, PROFILE_MAX_LAYERS, &g->n_layer);
        rc = rc ? rc : pp_int(s, "experts", 1, PROFILE_MAX_EXPERTS, &g->n_expert);
        rc = rc ? rc : pp_int(s, "experts per token", 1, g->n_expert, &g->n_expert_used);
        rc = rc ? rc : pp_u64(s, "expert bytes", 1, UINT64_MAX, &g->expert_bytes);
        for (int i = 0; i < 3 && !rc; i++)
            rc = pp_type(s, &g->type[i]);
        rc = rc ? rc : pp_eol(s);
        return rc ? rc : profile_alloc(p);
    case R_BUDGET: {
        int max_slots = g->n_layer ? g->n_layer * g->n_expert : 0;
        if (!p->count)
            return pp_fail(s, "'budget' before 'geometry'");
        rc = pp_u64(s, "the budget", 0, UINT64_MAX, &p->vram_budget);
        rc = rc ? rc : pp_int(s, "slots", 0, max_slots, &p->slots);
        rc = rc ? rc : pp_int(s, "the dynamic share", 0, 100, &p->dynamic_pct);
        return rc ? rc : pp_eol(s);
    }
    case R_WARMUP:
        rc = pp_int(s, "texts", 0, INT32_MAX, &p->n_texts);
        rc = rc ? rc : pp_u64(s, "tokens", 0, UINT64_MAX, &p->n_tokens);
        rc = rc ? rc : pp_u64(s, "steps", 0, UINT64_MAX, &p->n_steps);
        return rc ? rc : pp_eol(s);
    case R_PROBE: {
        char *w = pp_word(s);
        if (!w || strlen(w) >= sizeof(p->probe_mode))
            return pp_fail(s, "the probe's mode is missing or too long");
        snprintf(p->probe_mode, sizeof(p->probe_mode), "%s", w);
        return pp_eol(s);
    }
    case R_PROBE_PROMPT:
        return pp_ids(s, "a probe prompt id", p->probe_prompt, &p->n_probe_prompt, INT32_MAX);
    default:
        return pp_ids(s, "a probe output id", p->probe_out, &p->n_probe_out, INT32_MAX);
    }
}

/* The lines of buf (a private copy) into p. */
static int pp_lines(struct pp *s, char *buf, size_t len, struct profile *p)
{
    uint8_t seen_rec[R_N] = {0}, *seen = NULL;
    char *at = buf, *end = buf + len;
    bool head = false, done = false;
    int rc = 0;

    while (at < end && !rc) {
        char *nl = memchr(at, '\n', (size_t)(end - at));
        if (!nl)
            nl = end; /* an unterminated last line: reported below if it was not "end" */
        *nl = 0;      /* buf has a NUL at end */
        s->line++;
        s->cur = at;
        s->end = nl;
        at = nl + 1;
        for (char *c = s->cur; c < s->end; c++)
            if (*c == '\t' || *c == '\r')
                *c = ' ';
            else if (!rc && ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e))
                rc = pp_fail(s, "a byte 0x%02x that is not printable text", (unsigned char)*c);
        if (!rc && done)
            rc = pp_fail(s, "text after 'end'");
        if (rc)
            break;
        char *key = pp_word(s);
        if (!key || *key == '#')
            continue;
        if (!head) {
            int v;
            if (strcmp(key, "strata-profile"))
                rc = pp_fail(s, "not a strata profile (no 'strata-profile' line first)");
            else if (!(rc = pp_int(s, "the version", 0, INT32_MAX, &v)) && v != PROFILE_VERSION)
                rc = pp_fail(s, "format version %d; this strata reads version %d", v,
                             PROFILE_VERSION);
            head = true;
            rc = rc ? rc : pp_eol(s);
            continue;
        }
        if (!strcmp(key, "end")) {
            done = true;
            rc = pp_eol(s);
            continue;
        }
        int which = !strcmp(key, "count") ? 0 : !strcmp(key, "last") ? 1
                    : !strcmp(key, "frozen") ? 2 : -1;
        if (which >= 0) {
            if (!seen && p->count && !(seen = calloc((size_t)p->geo.n_layer * 3, 1)))
                rc = err_set(-ENOMEM, "out of memory");
            else
                rc = pp_layer(s, p, which, seen);
            continue;
        }
        int r = 0;
        while (r < R_N && strcmp(key, pp_records[r]))
            r++;
        if (r == R_N) {
            rc = pp_fail(s, "unknown record '%.32s'", key);
        } else if (seen_rec[r]++) {
            rc = pp_fail(s, "a second '%s' record", pp_records[r]);
        } else if (r == R_GEOMETRY && p->count) {
            rc = pp_fail(s, "'geometry' after the layer records");
        } else {
            rc = pp_record(s, p, r);
        }
    }
    if (!rc && !head)
        rc = err_set(-EINVAL, "%s: empty: not a strata profile", s->name);
    if (!rc && !done)
        rc = err_set(-EINVAL, "%s: no 'end' line: the file is truncated", s->name);
    for (int r = 0; r < R_N && !rc; r++)
        if (!seen_rec[r])
            rc = err_set(-EINVAL, "%s: the '%s' record is missing", s->name, pp_records[r]);
    for (size_t i = 0; !rc && i < (size_t)p->geo.n_layer * 3; i++)
        if (!seen || !seen[i])
            rc = err_set(-EINVAL, "%s: the '%s' record of layer %zu is missing", s->name,
                         i % 3 == 0 ? "count" : i % 3 == 1 ? "last" : "frozen", i / 3);
    if (!rc && p->slots && p->n_frozen > p->slots)
        rc = err_set(-EINVAL, "%s: %d experts frozen, more than the %d slots planned for",
                     s->name, p->n_frozen, p->slots);
    free(seen);
    return rc;
}

int profile_parse(const char *buf, size_t len, const char *name, struct profile *p)
{
    struct pp s = {.name = name};
    char *copy = malloc(len + 1);
    int rc;

    memset(p, 0, sizeof(*p));
    if (!copy)
        return err_set(-ENOMEM, "out of memory");
    memcpy(copy, buf, len);
    copy[len] = 0;
    rc = pp_lines(&s, copy, len, p);
    free(copy);
    if (rc)
        profile_free(p);
    return rc;
}

int profile_read(const char *path, struct profile *p)
{
    struct stat sb;
    FILE *f;
    char *buf;
    size_t n;
    int rc;

    memset(p, 0, sizeof(*p));
    if (stat(path, &sb) < 0)
        return err_set(-errno, "%s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode))
        return err_set(-EISDIR, "%s: is a directory, not a profile", path);
    if (!S_ISREG(sb.st_mode))
        return err_set(-EINVAL, "%s: not a regular file", path);
    if ((uint64_t)sb.st_size > PROFILE_MAX_FILE)
        return err_set(-EFBIG, "%s: %lld bytes, more than a profile holds (%llu MiB at most)",
                       path, (long long)sb.st_size, PROFILE_MAX_FILE >> 20);
    if (!(f = fopen(path, "rb")))
        return err_set(-errno, "%s: %s", path, strerror(errno));
    buf = malloc((size_t)sb.st_size + 1);
    if (!buf) {
        fclose(f);
        return err_set(-ENOMEM, "out of memory");
    }
    n = fread(buf, 1, (size_t)sb.st_size, f);
    fclose(f);
    rc = profile_parse(buf, n, path, p);
    free(buf);
    return rc;
}
