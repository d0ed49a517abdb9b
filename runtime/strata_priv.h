/* strata_priv: the handle behind the public API, shared by the files that implement it
 * (strata.c: open, tokens, streams, generation, statistics; strata_restore.c: residency
 * profiles). Nothing outside runtime/ includes it. */
#ifndef STRATA_PRIV_H
#define STRATA_PRIV_H

#include <stdbool.h>

#include "strata.h"

struct backend;
struct profile;
struct model;
struct stream;

struct strata {
    struct strata_config cfg; /* the caller's, with model_path pointing at path */
    char *path;               /* owned copy of the model path */
    struct model *model;      /* owned */
    struct backend *backend;  /* owned; what streams run on: core, or the profiler around it */
    struct backend *core;     /* the cpu or cuda backend; a view (backend owns it) */
    bool cuda;                /* core is the cuda backend */
    double t_copy;            /* wall seconds model_load_copy took */
    int bound, bind_node;     /* STRATA_FLAG_BIND: threads bound, NUMA node (-1: all) */
    struct profile *profile;  /* owned: the restored residency profile (its probe), or NULL */
    struct strata_profile_status prof;
};

struct strata_stream {
    struct strata *s;
    struct stream *st; /* owned */
};

/* Restores cfg.profile into the started CUDA backend's expert cache (strata_restore.c). 0, or
 * -errno when the profile cannot be used and is not optional. */
int strata_restore(struct strata *s);
/* Frees what strata_restore kept. */
void strata_restore_free(struct strata *s);

#endif
