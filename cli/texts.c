/* texts: prompt files read a text at a time (see texts.h). */
#include "texts.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int texts_open(const char *cmd, const char *opt, const char *path, const char *sep,
               struct texts *t)
{
    struct stat sb;

    memset(t, 0, sizeof(*t));
    t->sep = sep;
    if (!strcmp(path, "-")) {
        t->f = stdin;
        return 0;
    }
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "strata %s: %s %s: is a directory\n", cmd, opt, path);
        return 2;
    }
    t->f = fopen(path, "r");
    if (!t->f) {
        fprintf(stderr, "strata %s: %s %s: %s\n", cmd, opt, path, strerror(errno));
        return 2;
    }
    t->own = true;
    return 0;
}

const char *texts_next(struct texts *t, size_t *len)
{
    char *line = NULL;
    size_t lcap = 0, n_text = 0;
    ssize_t n;
    bool any = false;

    while ((n = getline(&line, &lcap, t->f)) > 0) {
        any = true;
        size_t body = strcspn(line, "\r\n");
        if (!t->sep)
            n = (ssize_t)body;
        else if (body == strlen(t->sep) && !strncmp(line, t->sep, body))
            break;
        if (n_text + (size_t)n + 1 > t->cap) {
            size_t c = 2 * (n_text + (size_t)n + 1);
            char *b = realloc(t->buf, c);
            if (!b) {
                free(line);
                return NULL;
            }
            t->buf = b;
            t->cap = c;
        }
        memcpy(t->buf + n_text, line, (size_t)n);
        n_text += (size_t)n;
        if (!t->sep)
            break;
    }
    free(line);
    if (!any)
        return NULL;
    if (!t->buf && !(t->buf = calloc(1, 1)))
        return NULL;
    t->buf[n_text] = 0;
    *len = n_text;
    return t->buf;
}

void texts_close(struct texts *t)
{
    if (t->own && t->f)
        fclose(t->f);
    free(t->buf);
    memset(t, 0, sizeof(*t));
}

bool texts_have_gnuplot(void)
{
    const char *path = getenv("PATH");
    char file[4096];

    while (path && *path) {
        size_t len = strcspn(path, ":");
        int n = snprintf(file, sizeof(file), "%.*s%sgnuplot", (int)len, path, len ? "/" : "");
        if (n > 0 && (size_t)n < sizeof(file) && access(file, X_OK) == 0)
            return true;
        path += len + (path[len] == ':');
    }
    return false;
}
