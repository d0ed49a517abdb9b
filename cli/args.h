/* args: the one place the command line's numbers, sizes and prompt files are read, strictly.
 * A value is the whole argument: no empty text, no leading blanks, no trailing junk ('5x',
 * '1e3' for an integer), no overflow, and floats are finite. A parser that fails prints one
 * line naming the command, the option, the accepted range and the text,
 *   strata run: -s wants an integer in 0..18446744073709551615, not 'abc'
 * and returns 2, the usage-error exit code; on success it returns 0 and sets *out. cmd is the
 * subcommand ("run"), opt the option as the user typed it ("-s" or "--seed"). */
#ifndef STRATA_CLI_ARGS_H
#define STRATA_CLI_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The most threads any command accepts (-t before the CPU cap). */
#define ARGS_MAX_THREADS 4096

/* The same checks without a message (for values inside a larger argument): true if text is
 * a decimal integer in [min, max], or (args_parse_u64) decimal or 0x-hex in [min, max]. */
bool args_parse_int(const char *text, long long min, long long max, long long *out);
bool args_parse_u64(const char *text, uint64_t min, uint64_t max, uint64_t *out);

/* A decimal integer in [min, max]; args_i32 stores it in an int (min, max in int's range). */
int args_int(const char *cmd, const char *opt, const char *text, long long min, long long max,
             long long *out);
int args_i32(const char *cmd, const char *opt, const char *text, int min, int max, int *out);

/* A decimal (or 0x-hex) unsigned 64-bit integer in [min, max]; '-' is refused. */
int args_u64(const char *cmd, const char *opt, const char *text, uint64_t min, uint64_t max,
             uint64_t *out);

/* A finite number in [min, max]; args_f32 rounds the text to float once (strtof). */
int args_float(const char *cmd, const char *opt, const char *text, double min, double max,
               double *out);
int args_f32(const char *cmd, const char *opt, const char *text, float min, float max,
             float *out);

/* A size as budget_parse_size (residency/budget.h) reads it ("8G", "7.5GiB", "8000MB", a
 * byte count), in [min, max] bytes. */
int args_size(const char *cmd, const char *opt, const char *text, uint64_t min, uint64_t max,
              uint64_t *out);

/* A thread count in [min, max] (0 meaning "all" where min is 0), capped at the online CPUs
 * with a notice on stderr: "strata run: -t 4096 is more than the 2 CPUs here; using 2". */
int args_threads(const char *cmd, const char *opt, const char *text, int min, int max,
                 int *out);

/* Prints "strata CMD: OPT wants WANTS, not 'TEXT'" and returns 2, for the checks the parsers
 * above do not make (an open interval, a value that depends on the machine). */
int args_fail(const char *cmd, const char *opt, const char *text, const char *wants);

/* The machine's physical memory in bytes (sysconf), 0 if unknown. */
uint64_t args_phys_bytes(void);

/* Reads a prompt file to its end (a file, a pipe, /dev/stdin, <(cmd), or "-" for stdin) into
 * a malloc'd, NUL-terminated *text of *len bytes. Refuses, with a message naming cmd, opt and
 * the path, and returns 2: a directory, an empty file, a NUL byte (its offset named). A file
 * that cannot be opened or read: the message and 1. */
int args_read_prompt(const char *cmd, const char *opt, const char *path, char **text,
                     size_t *len);

#endif
