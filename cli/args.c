#include "args.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "budget.h"
#include "errors.h"

int args_fail(const char *cmd, const char *opt, const char *text, const char *wants)
{
    fprintf(stderr, "strata %s: %s wants %s, not '%s'\n", cmd, opt, wants, text);
    return 2;
}

/* strto* skip leading blanks; a value must start at its first character. */
static bool args_starts_ok(const char *text)
{
    return text[0] && !isspace((unsigned char)text[0]);
}

bool args_parse_int(const char *text, long long min, long long max, long long *out)
{
    char *end;
    long long v;

    if (!args_starts_ok(text))
        return false;
    errno = 0;
    v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v < min || v > max)
        return false;
    *out = v;
    return true;
}

bool args_parse_u64(const char *text, uint64_t min, uint64_t max, uint64_t *out)
{
    bool hex = text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
    char *end;
    unsigned long long v;

    /* strtoull would take "-5" as 2^64 - 5, and "0x" as 0 followed by junk */
    if (!args_starts_ok(text) || text[0] == '-' || text[0] == '+' ||
        (hex && !isxdigit((unsigned char)text[2])))
        return false;
    errno = 0;
    v = strtoull(text, &end, hex ? 16 : 10);
    if (errno || end == text || *end || v < min || v > max)
        return false;
    *out = v;
    return true;
}

int args_int(const char *cmd, const char *opt, const char *text, long long min, long long max,
             long long *out)
{
    char wants[96];

    if (args_parse_int(text, min, max, out))
        return 0;
    snprintf(wants, sizeof(wants), "an integer in %lld..%lld", min, max);
    return args_fail(cmd, opt, text, wants);
}

int args_i32(const char *cmd, const char *opt, const char *text, int min, int max, int *out)
{
    long long v;
    int rc = args_int(cmd, opt, text, min, max, &v);

    if (!rc)
        *out = (int)v;
    return rc;
}

int args_u64(const char *cmd, const char *opt, const char *text, uint64_t min, uint64_t max,
             uint64_t *out)
{
    char wants[96];

    if (args_parse_u64(text, min, max, out))
        return 0;
    snprintf(wants, sizeof(wants), "an integer in %" PRIu64 "..%" PRIu64, min, max);
    return args_fail(cmd, opt, text, wants);
}

/* strtod or strtof over the whole text; false unless finite and in [min, max]. */
static bool args_parse_float(const char *text, bool single, double min, double max, double *out)
{
    char *end;
    double v;

    if (!args_starts_ok(text))
        return false;
    errno = 0;
    v = single ? (double)strtof(text, &end) : strtod(text, &end);
    /* ERANGE on underflow too: a denormal is still a number, unlike an overflow */
    if ((errno && !(errno == ERANGE && fabs(v) < 1)) || end == text || *end || !isfinite(v) ||
        !(v >= min && v <= max))
        return false;
    *out = v;
    return true;
}

static int args_float_fail(const char *cmd, const char *opt, const char *text, double min,
                           double max)
{
    char wants[96];

    snprintf(wants, sizeof(wants), "a number in %.10g..%.10g", min, max);
    return args_fail(cmd, opt, text, wants);
}

int args_float(const char *cmd, const char *opt, const char *text, double min, double max,
               double *out)
{
    if (args_parse_float(text, false, min, max, out))
        return 0;
    return args_float_fail(cmd, opt, text, min, max);
}

int args_f32(const char *cmd, const char *opt, const char *text, float min, float max,
             float *out)
{
    double v;

    if (!args_parse_float(text, true, min, max, &v))
        return args_float_fail(cmd, opt, text, min, max);
    *out = (float)v;
    return 0;
}

int args_size(const char *cmd, const char *opt, const char *text, uint64_t min, uint64_t max,
              uint64_t *out)
{
    uint64_t v = 0;
    int bad = 0; /* 1: out of range or not a number, 2: budget_parse_size's reason */

    if (!args_starts_ok(text) || text[0] == '-')
        bad = 1;
    else if (budget_parse_size(text, &v))
        bad = 2;
    else if (v < min || v > max)
        bad = 1;
    if (!bad) {
        *out = v;
        return 0;
    }
    fprintf(stderr,
            "strata %s: %s wants a size such as 8G, 7.5GiB or 8000MB, of %" PRIu64 "..%" PRIu64
            " bytes, not '%s'%s%s%s\n",
            cmd, opt, min, max, text, bad == 2 ? " (" : "", bad == 2 ? err_msg() : "",
            bad == 2 ? ")" : "");
    return 2;
}

int args_threads(const char *cmd, const char *opt, const char *text, int min, int max, int *out)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int rc = args_i32(cmd, opt, text, min, max, out);

    if (!rc && ncpu > 0 && *out > ncpu) {
        fprintf(stderr, "strata %s: %s %d is more than the %ld CPUs here; using %ld\n", cmd, opt,
                *out, ncpu, ncpu);
        *out = (int)ncpu;
    }
    return rc;
}

uint64_t args_phys_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);

    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

/* Reads f to its end into a malloc'd buffer (NUL-terminated); -errno. */
static int args_slurp(FILE *f, char **text, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);

    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *t = cap > SIZE_MAX / 4 ? NULL : realloc(buf, 2 * cap + 1);
        if (!t) {
            free(buf);
            return -ENOMEM;
        }
        buf = t;
        cap *= 2;
    }
    if (!buf)
        return -ENOMEM;
    if (ferror(f)) {
        int e = errno ? -errno : -EIO;
        free(buf);
        return e;
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return 0;
}

int args_read_prompt(const char *cmd, const char *opt, const char *path, char **text,
                     size_t *len)
{
    bool is_stdin = !strcmp(path, "-");
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    struct stat sb;
    int rc;

    if (!f) {
        fprintf(stderr, "strata %s: %s %s: %s\n", cmd, opt, path, strerror(errno));
        return 1;
    }
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "strata %s: %s %s: is a directory\n", cmd, opt, path);
        rc = 2;
        goto out;
    }
    rc = args_slurp(f, text, len);
    if (rc) {
        fprintf(stderr, "strata %s: %s %s: %s\n", cmd, opt, path, strerror(-rc));
        rc = 1;
        goto out;
    }
    if (*len == 0) {
        fprintf(stderr, "strata %s: %s %s: the file is empty (no prompt)\n", cmd, opt, path);
        rc = 2;
    } else if (strlen(*text) != *len) {
        fprintf(stderr,
                "strata %s: %s %s: a NUL byte at byte offset %zu (prompts are UTF-8 text)\n",
                cmd, opt, path, strlen(*text));
        rc = 2;
    }
    if (rc) {
        free(*text);
        *text = NULL;
    }
out:
    if (!is_stdin)
        fclose(f);
    return rc;
}
