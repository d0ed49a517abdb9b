#include "errors.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define ERR_MSG_MAX 1024

static _Thread_local char err_buf[ERR_MSG_MAX];

int err_set(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof(err_buf), fmt, ap);
    va_end(ap);
    return code;
}

int err_wrap(int code, const char *fmt, ...)
{
    char prefix[ERR_MSG_MAX];
    char old[ERR_MSG_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    size_t np = strlen(prefix), no;

    memcpy(old, err_buf, sizeof(old));
    no = strnlen(old, sizeof(old) - 1);
    if (np > sizeof(err_buf) - 1)
        np = sizeof(err_buf) - 1;
    if (no > sizeof(err_buf) - 1 - np)
        no = sizeof(err_buf) - 1 - np;
    memcpy(err_buf, prefix, np);
    memcpy(err_buf + np, old, no);
    err_buf[np + no] = '\0';
    return code;
}

const char *err_msg(void)
{
    return err_buf;
}

void err_clear(void)
{
    err_buf[0] = '\0';
}
