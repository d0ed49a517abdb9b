/* strata_internal: what the strata command line needs of an opened model beyond the public API
 * (include/strata.h): the engine's own objects, for commands that measure or observe them (bench,
 * stats-routing), and strata_open in its two steps, for commands that read the model before
 * they start the engine (logits prints the prompt's ids first). Not installed; programs outside
 * cli/ and tests/ use strata.h only.
 */
#ifndef STRATA_INTERNAL_H
#define STRATA_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "strata.h"

struct backend;
struct model;
struct stream;

/* The step of strata_open (or strata_load / strata_start) that failed last on this thread, so
 * the command line can say which ("loading the model: ...") in front of strata_error(). */
enum strata_step {
    STRATA_STEP_CONFIG = 0, /* the config was refused before anything was read */
    STRATA_STEP_LOAD,       /* model_open: the file */
    STRATA_STEP_BIND,       /* STRATA_FLAG_BIND: hwloc or the OS refused */
    STRATA_STEP_COPY,       /* STRATA_FLAG_NO_MMAP: model_load_copy */
    STRATA_STEP_ENGINE,     /* the backend (strata_start), a profiling wrapper or a stream */
};
enum strata_step strata_failed_step(void);

/* strata_sampling_from_model's reading of an open GGUF file (f NULL: nothing). */
struct gguf_file;
unsigned strata_sampling_from_gguf(const struct gguf_file *f, struct strata_sampling *p);

/* strata_open's first half: checks cfg, opens the model, binds the threads (BIND) and copies
 * the weights (NO_MMAP). The handle's tokenizer, model info and strata_model_of work; streams
 * need strata_start. 0 or -errno (strata_error()); *out is untouched on failure. */
int strata_load(const struct strata_config *cfg, struct strata **out);
/* strata_open's second half: opens the backend the config asks for (AUTO's retry included).
 * 0 or -errno; s stays loaded (strata_close frees it). */
int strata_start(struct strata *s);

/* Wraps the started backend in backend_profile.h's timer (CPU device; before any stream is
 * opened). 0 or -errno. strata_backend_of then returns the wrapper. */
int strata_profile_open(struct strata *s);

struct model *strata_model_of(struct strata *s);
/* The backend streams run on (the profiling wrapper when there is one); NULL before
 * strata_start. */
struct backend *strata_backend_of(struct strata *s);
struct stream *strata_stream_of(struct strata_stream *st);

/* Wall seconds model_load_copy took (STRATA_FLAG_NO_MMAP), 0 without it. */
double strata_copy_seconds(const struct strata *s);
/* STRATA_FLAG_BIND: the OpenMP threads bound and the NUMA node (-1: all); 0 without it. */
int strata_bound_threads(const struct strata *s, int *node);

/* The probe of a residency profile: n_prompt ids evaluated on a fresh stream, then n_out greedy
 * tokens (the prompt's argmax, then one-token steps) into out. 0 or -errno. */
int strata_probe_run(struct strata *s, const int32_t *prompt, int n_prompt, int32_t *out,
                     int n_out);

#endif
