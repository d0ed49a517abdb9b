/* errors: the one error convention of strata.
 *
 * Library functions return 0 (or a count) on success and -errno on failure. The function that
 * detects a failure records a message naming the thing that is wrong (file, key, tensor, byte
 * offset, expected and actual values) in a thread-local buffer with err_set(); callers up the
 * stack may prefix context with err_wrap(). Only main() prints it and exits.
 */
#ifndef STRATA_ERRORS_H
#define STRATA_ERRORS_H

#include <errno.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Records a formatted message for this thread and returns code (a negative errno), so that a
 * failing path reads `return err_set(-EINVAL, "tensor '%s': ...", name);`. */
int err_set(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes the current message with a formatted context ("loading FILE: "), returns code. */
int err_wrap(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The last message recorded on this thread; "" if none. Valid until the next err_set. */
const char *err_msg(void);

void err_clear(void);

#ifdef __cplusplus
}
#endif

#endif
