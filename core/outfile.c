/* outfile: temp file + rename for output files, and the registry of pending temp files that a
 * SIGINT/SIGTERM handler removes (see outfile.h). */
#include "outfile.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errors.h"

/* ---- registry ------------------------------------------------------------------------------
 * A slot goes FREE -> FILLING (claimed by compare-and-swap, path being copied) -> ARMED (the
 * handler may unlink path) -> FREE. The handler reads only ARMED slots. */
enum { SLOT_FREE, SLOT_FILLING, SLOT_ARMED };

struct outfile_slot {
    atomic_int state;
    char path[PATH_MAX]; /* NUL-terminated; valid while ARMED */
};

static struct outfile_slot outfile_slots[OUTFILE_MAX_PENDING];

int outfile_register(const char *tmp_path)
{
    size_t len = strlen(tmp_path);

    if (len >= PATH_MAX)
        return err_set(-ENAMETOOLONG, "%s: path too long (%zu bytes)", tmp_path, len);
    for (int i = 0; i < OUTFILE_MAX_PENDING; i++) {
        struct outfile_slot *s = &outfile_slots[i];
        int expect = SLOT_FREE;
        if (!atomic_compare_exchange_strong(&s->state, &expect, SLOT_FILLING))
            continue;
        memcpy(s->path, tmp_path, len + 1);
        atomic_store(&s->state, SLOT_ARMED);
        return i;
    }
    return err_set(-ENOSPC, "%s: more than %d output files pending at once", tmp_path,
                   OUTFILE_MAX_PENDING);
}

void outfile_unregister(int slot)
{
    if (slot >= 0 && slot < OUTFILE_MAX_PENDING)
        atomic_store(&outfile_slots[slot].state, SLOT_FREE);
}

/* Async-signal-safe: atomic loads, unlink, sigaction and raise only. */
static void outfile_on_signal(int sig)
{
    struct sigaction dfl;

    for (int i = 0; i < OUTFILE_MAX_PENDING; i++) {
        if (atomic_load(&outfile_slots[i].state) == SLOT_ARMED)
            unlink(outfile_slots[i].path);
    }
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    raise(sig); /* blocked until this handler returns, then the default action ends us */
}

int outfile_install_signal_cleanup(void)
{
    static const int sigs[] = {SIGINT, SIGTERM};

    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
        struct sigaction old, sa;
        if (sigaction(sigs[i], NULL, &old) < 0)
            return err_set(-errno, "sigaction(%d): %s", sigs[i], strerror(errno));
        if (old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO))
            continue; /* ours already, or the caller's */
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = outfile_on_signal;
        sigemptyset(&sa.sa_mask);
        sigaddset(&sa.sa_mask, SIGINT);
        sigaddset(&sa.sa_mask, SIGTERM);
        if (sigaction(sigs[i], &sa, NULL) < 0)
            return err_set(-errno, "sigaction(%d): %s", sigs[i], strerror(errno));
    }
    return 0;
}

/* ---- files --------------------------------------------------------------------------------- */

static const char *outfile_kind(mode_t mode)
{
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    if (S_ISSOCK(mode))
        return "a socket";
    return "not a regular file";
}

int outfile_check_target(const char *path)
{
    struct stat st;

    if (stat(path, &st) < 0) {
        if (errno == ENOENT)
            return 0;
        return err_set(-errno, "%s: %s", path, strerror(errno));
    }
    if (S_ISREG(st.st_mode))
        return 0;
    return err_set(S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL,
                   "%s: is %s, not a regular file; refusing to write over it", path,
                   outfile_kind(st.st_mode));
}

int outfile_sweep_stale(const char *path)
{
    char *dcopy = strdup(path), *bcopy = strdup(path);
    int removed = 0;
    DIR *d = NULL;

    if (dcopy && bcopy)
        d = opendir(dirname(dcopy));
    if (!d)
        goto out;
    const char *base = basename(bcopy);
    size_t blen = strlen(base);
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        if (strncmp(n, base, blen) || strncmp(n + blen, ".tmp.", 5))
            continue;
        char *end;
        errno = 0;
        long pid = strtol(n + blen + 5, &end, 10);
        if (errno || *end || end == n + blen + 5 || pid <= 0 || pid > INT_MAX ||
            pid == (long)getpid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue; /* alive, or not ours to judge */
        char *full = NULL;
        if (asprintf(&full, "%s/%s", dirname(strcpy(dcopy, path)), n) < 0)
            continue;
        if (unlink(full) == 0) {
            fprintf(stderr, "strata: removed %s, left behind by process %ld that no longer runs\n",
                    full, pid);
            removed++;
        }
        free(full);
    }
    closedir(d);
out:
    free(dcopy);
    free(bcopy);
    return removed;
}

static void outfile_release(struct outfile *of)
{
    outfile_unregister(of->slot);
    free(of->path);
    free(of->tmp_path);
    memset(of, 0, sizeof(*of));
    of->slot = -1;
}

int outfile_open(const char *path, struct outfile *of)
{
    int fd, rc;

    memset(of, 0, sizeof(*of));
    of->slot = -1;
    rc = outfile_check_target(path);
    if (rc)
        return rc;
    outfile_sweep_stale(path);
    of->path = strdup(path);
    if (!of->path || asprintf(&of->tmp_path, "%s.tmp.%d", path, (int)getpid()) < 0) {
        of->tmp_path = NULL;
        outfile_release(of);
        return err_set(-ENOMEM, "out of memory");
    }
    fd = open(of->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        /* registered only once created: an existing one is not ours to unlink */
        rc = err_set(-errno, "cannot create %s: %s", of->tmp_path, strerror(errno));
        outfile_release(of);
        return rc;
    }
    rc = outfile_register(of->tmp_path);
    if (rc >= 0) {
        of->slot = rc;
        of->f = fdopen(fd, "w");
        rc = of->f ? 0 : err_set(-errno, "%s: fdopen: %s", of->tmp_path, strerror(errno));
    }
    if (rc) {
        close(fd);
        unlink(of->tmp_path);
        outfile_release(of);
        return rc;
    }
    return 0;
}

void outfile_dir_sync(const char *path)
{
    char *copy = strdup(path);
    int fd;

    if (!copy)
        return;
    fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(copy);
}

static int outfile_finish(struct outfile *of)
{
    FILE *f = of->f;
    int rc = 0;

    of->f = NULL;
    if (fflush(f) || ferror(f))
        rc = err_set(errno ? -errno : -EIO, "%s: write failed: %s", of->tmp_path,
                     strerror(errno ? errno : EIO));
    else if (fsync(fileno(f)) < 0)
        rc = err_set(-errno, "%s: fsync failed: %s", of->tmp_path, strerror(errno));
    if (fclose(f) && !rc)
        rc = err_set(-errno, "%s: close failed: %s", of->tmp_path, strerror(errno));
    if (rc)
        return rc;
    rc = outfile_check_target(of->path); /* it may have changed while we wrote */
    if (rc)
        return rc;
    if (rename(of->tmp_path, of->path) < 0)
        return err_set(-errno, "cannot rename %s to %s: %s", of->tmp_path, of->path,
                       strerror(errno));
    outfile_dir_sync(of->path);
    return 0;
}

int outfile_commit(struct outfile *of)
{
    int rc;

    if (!of->f)
        return err_set(-EINVAL, "outfile_commit: no file open");
    errno = 0;
    rc = outfile_finish(of);
    if (rc)
        unlink(of->tmp_path);
    outfile_release(of);
    return rc;
}

void outfile_abort(struct outfile *of)
{
    if (!of)
        return;
    if (of->f) {
        fclose(of->f);
        of->f = NULL;
        unlink(of->tmp_path);
    }
    if (of->path || of->tmp_path) /* an opened one; a zeroed one holds nothing */
        outfile_release(of);
}
