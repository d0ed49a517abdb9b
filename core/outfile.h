/* outfile: output files written safely: into a temp file PATH.tmp.<pid> in the same directory,
 * renamed over PATH only when complete, so that PATH holds either the old file or the whole new
 * one, never a partial write.
 *
 * An existing PATH that is not a regular file (directory, FIFO, device, socket) is refused
 * before anything is written: renaming over a FIFO or device would replace it, and writing into
 * one directly would block or send the bytes elsewhere.
 *
 * Pending temp files are kept in a process-wide registry (a fixed static array, so that a
 * signal handler can read it): outfile_install_signal_cleanup makes SIGINT and SIGTERM remove
 * them before the process dies. gguf_writer (core/gguf_write.c) registers its temp file too.
 * Registry slots are claimed and released with lock-free atomics; any thread may open, commit
 * or abort its own files. A relative temp path is resolved against the working directory at
 * the time of the signal, so do not chdir while a file is pending.
 */
#ifndef STRATA_OUTFILE_H
#define STRATA_OUTFILE_H

#include <stdio.h>

#define OUTFILE_MAX_PENDING 32 /* temp files pending at once in one process */

struct outfile {
    FILE *f;        /* the temp file's stream; write through it */
    char *path;     /* owned: the final name */
    char *tmp_path; /* owned: PATH.tmp.<pid> */
    int slot;       /* registry slot of tmp_path, -1 none */
};

/* Removes temp files PATH.tmp.<pid> left beside PATH by a process that no longer exists (one
 * killed by SIGKILL or a power cut cannot clean up after itself); a temp file of a live process
 * is left alone. Each removal is reported on stderr. Best effort; the number removed. Called by
 * outfile_open and by gguf_writer before they create their own temp file. */
int outfile_sweep_stale(const char *path);

/* Checks that PATH may be replaced: 0 if it does not exist or is a regular file (symlinks
 * followed); -EISDIR for a directory, -EINVAL for a FIFO, device or socket, -errno when stat
 * fails otherwise; the message names the path and what it is. */
int outfile_check_target(const char *path);

/* Creates PATH's temp file and registers it. 0 or -errno with a message naming the path; on
 * failure *of holds nothing to free. */
int outfile_open(const char *path, struct outfile *of);

/* Flushes, fsyncs and closes the temp file, checks PATH again, renames the temp file over it
 * and fsyncs the directory. 0 or -errno; on failure the temp file is removed. Either way *of is
 * released. */
int outfile_commit(struct outfile *of);

/* Closes and removes the temp file and releases *of. Safe on a zeroed or released outfile. */
void outfile_abort(struct outfile *of);

/* Registers a pending temp file for removal on SIGINT/SIGTERM: returns a slot (>= 0) for
 * outfile_unregister, -ENAMETOOLONG or -ENOSPC (all OUTFILE_MAX_PENDING slots taken), with a
 * message. */
int outfile_register(const char *tmp_path);

/* Forgets slot (after the temp file was renamed or removed); a negative slot is ignored. */
void outfile_unregister(int slot);

/* fsyncs the directory holding path, so that a rename into it is durable (best effort). */
void outfile_dir_sync(const char *path);

/* Installs a handler for SIGINT and SIGTERM, where the disposition is still the default, that
 * unlinks every registered temp file and then re-raises the signal with the default action.
 * A handler the caller had installed is left alone (its owner cancels and aborts the writes).
 * Idempotent. 0 or -errno. */
int outfile_install_signal_cleanup(void);

#endif
