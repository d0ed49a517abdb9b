/* texts: the prompt files of the commands that run a workload (stats-routing, profile warmup):
 * one text per line, or with a separator line texts of many lines; "-" reads standard input.
 * A directory or an unreadable path is refused with a message. Lines have no length limit.
 * And whether gnuplot can be run, for the commands that plot. */
#ifndef STRATA_CLI_TEXTS_H
#define STRATA_CLI_TEXTS_H

#include <stdbool.h>
#include <stdio.h>

struct texts {
    FILE *f;
    const char *sep;  /* separator line, or NULL: one text per line */
    bool own;         /* f is ours to close (not stdin) */
    char *buf;        /* the current text (malloc'd, grown as needed) */
    size_t cap;
};

/* Opens path ("-" = standard input) for cmd's messages. 0, or 2 after printing why not. */
int texts_open(const char *cmd, const char *opt, const char *path, const char *sep,
               struct texts *t);
/* The next text (NUL-terminated, valid until the next call) and its length in *len; NULL at the
 * end. Empty texts are returned too (callers skip them). */
const char *texts_next(struct texts *t, size_t *len);
void texts_close(struct texts *t);

/* Whether an executable gnuplot is in one of PATH's directories (an empty entry is the cwd). */
bool texts_have_gnuplot(void);

#endif
