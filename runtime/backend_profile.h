/* backend_profile: wraps a backend and times each op (wall clock around the call; the
 * wrapped backend must execute ops synchronously, as the CPU backend does). For
 * `strata bench --profile`: where a step's time goes. */
#ifndef STRATA_BACKEND_PROFILE_H
#define STRATA_BACKEND_PROFILE_H

#include <stdio.h>

struct backend;

/* A backend that forwards to inner and owns it (closing it closes inner). 0 or -ENOMEM. */
int backend_profile_open(struct backend *inner, struct backend **out);

/* Prints calls, total and mean time per op since the last reset, and resets. */
void backend_profile_report(struct backend *b, FILE *f, const char *title);

#endif
