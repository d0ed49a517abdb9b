/* test_outfile: output files go through a temp file and a rename: writing over a regular file
 * replaces its content and leaves no temp file; a directory or FIFO target is refused and left
 * as it was (by outfile_open and by gguf_writer); abort leaves nothing; a process killed by
 * SIGTERM while a temp file is pending (outfile or gguf_writer) leaves no temp file behind; one
 * killed by SIGKILL leaves it until the next writer of that path removes it. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "errors.h"
#include "gguf.h"
#include "outfile.h"
#include "testutil.h"

static char tmpdir[64];

static const char *tmp_path(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", tmpdir, name);
    return buf;
}

/* Number of entries of tmpdir whose name contains ".tmp." */
static int count_temps(void)
{
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    int n = 0;

    if (!d)
        return -1;
    while ((e = readdir(d)))
        n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

static bool file_is(const char *path, const char *content)
{
    char buf[256];
    FILE *f = fopen(path, "rb");
    size_t n;

    if (!f)
        return false;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return !strcmp(buf, content);
}

static void write_file(const char *path, const char *content)
{
    FILE *f = fopen(path, "wb");
    CHECK(f && fputs(content, f) >= 0 && fclose(f) == 0, "cannot write %s", path);
}

static void check_replace(void)
{
    char path[256];
    struct outfile of;
    int rc;

    tmp_path(path, sizeof(path), "out.json");
    write_file(path, "old content that is longer\n");
    rc = outfile_open(path, &of);
    CHECK(rc == 0, "open: %s", err_msg());
    if (rc)
        return;
    CHECK(count_temps() == 1, "the temp file is not in the target's directory");
    CHECK(file_is(path, "old content that is longer\n"), "the target changed before commit");
    fputs("new\n", of.f);
    rc = outfile_commit(&of);
    CHECK(rc == 0, "commit: %s", err_msg());
    CHECK(file_is(path, "new\n"), "content not replaced");
    CHECK(count_temps() == 0, "a temp file was left");
    CHECK(of.f == NULL && of.path == NULL && of.slot == -1, "commit did not release the outfile");

    /* a new file */
    tmp_path(path, sizeof(path), "fresh.dat");
    CHECK(outfile_open(path, &of) == 0, "open new: %s", err_msg());
    fputs("x", of.f);
    CHECK(outfile_commit(&of) == 0, "commit new: %s", err_msg());
    CHECK(file_is(path, "x"), "new file content");
    unlink(path);
    tmp_path(path, sizeof(path), "out.json");
    unlink(path);
}

static void check_abort(void)
{
    char path[256];
    struct outfile of, zero = {0};

    outfile_abort(&zero); /* a zeroed one holds nothing */
    tmp_path(path, sizeof(path), "kept.txt");
    write_file(path, "kept\n");
    CHECK(outfile_open(path, &of) == 0, "open: %s", err_msg());
    fputs("lost\n", of.f);
    outfile_abort(&of);
    outfile_abort(&of); /* twice is harmless */
    CHECK(file_is(path, "kept\n"), "abort changed the target");
    CHECK(count_temps() == 0, "abort left a temp file");
    unlink(path);

    tmp_path(path, sizeof(path), "never.txt");
    CHECK(outfile_open(path, &of) == 0, "open: %s", err_msg());
    outfile_abort(&of);
    CHECK(access(path, F_OK) < 0 && count_temps() == 0, "abort of a new file left something");
}

/* target must be refused with code by outfile_open, gguf_writer_open and (when the target
 * appears after open) outfile_commit / gguf_writer_finish, and left as it was. */
static void check_refused(const char *what, int code, const char *kind,
                          int (*make)(const char *path))
{
    char path[256];
    struct outfile of;
    struct gguf_writer *w;
    struct stat before, after;
    int rc;

    tmp_path(path, sizeof(path), what);
    CHECK(make(path) == 0, "cannot make %s", path);
    CHECK(stat(path, &before) == 0, "stat %s", path);

    rc = outfile_open(path, &of);
    CHECK(rc == code, "outfile_open(%s) returned %d, expected %d", what, rc, code);
    CHECK(strstr(err_msg(), path) && strstr(err_msg(), kind), "message '%s' names neither %s "
          "nor '%s'", err_msg(), path, kind);
    if (!rc)
        outfile_abort(&of);
    rc = gguf_writer_open(path, 0, &w);
    CHECK(rc == code, "gguf_writer_open(%s) returned %d, expected %d", what, rc, code);
    CHECK(strstr(err_msg(), path) && strstr(err_msg(), kind), "message '%s'", err_msg());
    if (!rc)
        gguf_writer_abort(w);
    CHECK(count_temps() == 0, "%s: a temp file was left", what);

    /* the target appears while the file is written */
    rmdir(path);
    unlink(path);
    CHECK(outfile_open(path, &of) == 0, "open: %s", err_msg());
    CHECK(gguf_writer_open(path, 0, &w) == -EEXIST, "two temps of one name in one process");
    make(path);
    fputs("data", of.f);
    rc = outfile_commit(&of);
    CHECK(rc == code, "outfile_commit over %s returned %d, expected %d", what, rc, code);
    CHECK(count_temps() == 0, "%s: commit left a temp file", what);

    rmdir(path);
    unlink(path);
    CHECK(gguf_writer_open(path, 0, &w) == 0, "gguf_writer_open: %s", err_msg());
    CHECK(gguf_writer_add_u32(w, "test.key", 1) == 0, "add: %s", err_msg());
    make(path);
    rc = gguf_writer_finish(w);
    CHECK(rc == code, "gguf_writer_finish over %s returned %d, expected %d", what, rc, code);
    CHECK(strstr(err_msg(), kind), "message '%s'", err_msg());
    CHECK(count_temps() == 0, "%s: finish left a temp file", what);

    CHECK(stat(path, &after) == 0 && (after.st_mode & S_IFMT) == (before.st_mode & S_IFMT),
          "%s was replaced", what);
    rmdir(path);
    unlink(path);
}

static int make_dir(const char *path)
{
    return mkdir(path, 0755);
}

static int make_fifo(const char *path)
{
    return mkfifo(path, 0644);
}

/* A child holds a pending temp file (outfile, or gguf_writer when gguf is set) and waits to be
 * killed by SIGTERM; no temp file must remain and the child must die of SIGTERM. */
static void check_signal(bool gguf, int sig)
{
    char path[256];
    int pipefd[2], status = 0;
    pid_t pid;

    tmp_path(path, sizeof(path), gguf ? "sig.gguf" : "sig.json");
    CHECK(pipe(pipefd) == 0, "pipe");
    pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        struct outfile of;
        struct gguf_writer *w;
        close(pipefd[0]);
        if (outfile_install_signal_cleanup())
            _exit(2);
        if (gguf ? gguf_writer_open(path, 0, &w) : outfile_open(path, &of))
            _exit(3);
        if (!gguf)
            fputs("partial", of.f);
        if (write(pipefd[1], "r", 1) != 1)
            _exit(4);
        for (;;)
            pause();
    }
    close(pipefd[1]);
    char c;
    CHECK(read(pipefd[0], &c, 1) == 1, "the child did not get ready");
    close(pipefd[0]);
    CHECK(count_temps() == 1, "the child's temp file is not there");
    kill(pid, sig);
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == sig,
          "the child did not die of signal %d (status %#x)", sig, status);
    CHECK(access(path, F_OK) < 0, "the target appeared");
    if (sig != SIGKILL) {
        CHECK(count_temps() == 0, "%s: the temp file survived signal %d", gguf ? "gguf" : "outfile",
              sig);
        return;
    }
    /* SIGKILL cannot be caught: the temp file stays until the next writer of the same path
     * sweeps it (its process is gone); a temp file of a live process is kept */
    CHECK(count_temps() == 1, "the temp file of a SIGKILLed writer is not there");
    char live[300];
    snprintf(live, sizeof(live), "%s.tmp.1", path); /* pid 1 runs as long as we do */
    write_file(live, "x");
    if (gguf) {
        struct gguf_writer *w;
        CHECK(gguf_writer_open(path, 0, &w) == 0, "gguf_writer_open: %s", err_msg());
        gguf_writer_abort(w);
    } else {
        struct outfile of;
        CHECK(outfile_open(path, &of) == 0, "outfile_open: %s", err_msg());
        outfile_abort(&of);
    }
    CHECK(count_temps() == 1 && access(live, F_OK) == 0,
          "%s: after a new open, %d temp files (want only the live process's)",
          gguf ? "gguf" : "outfile", count_temps());
    unlink(live);
}

/* A handler installed before is left in place. */
static volatile sig_atomic_t got_usr;
static void on_int(int sig)
{
    got_usr = sig;
}

static void check_keeps_handler(void)
{
    struct sigaction sa = {0}, old;
    sa.sa_handler = on_int;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);
    CHECK(outfile_install_signal_cleanup() == 0, "install: %s", err_msg());
    raise(SIGINT);
    CHECK(got_usr == SIGINT, "the caller's SIGINT handler was replaced");
    sigaction(SIGINT, &old, NULL);
}

static void check_registry(void)
{
    int slots[OUTFILE_MAX_PENDING], n = 0, rc;
    for (; n < OUTFILE_MAX_PENDING; n++) {
        slots[n] = outfile_register("/nonexistent/x");
        if (slots[n] < 0)
            break;
    }
    CHECK(n == OUTFILE_MAX_PENDING, "only %d slots", n);
    rc = outfile_register("/nonexistent/y");
    CHECK(rc == -ENOSPC, "a full registry returned %d", rc);
    for (int i = 0; i < n; i++)
        outfile_unregister(slots[i]);
    rc = outfile_register("/nonexistent/z");
    CHECK(rc >= 0, "no slot after release: %d", rc);
    outfile_unregister(rc);
}

int main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/strata-outfile-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    check_replace();
    check_abort();
    check_refused("a-dir", -EISDIR, "directory", make_dir);
    check_refused("a-fifo", -EINVAL, "FIFO", make_fifo);
    {
        struct outfile of;
        int rc = outfile_open("/dev/null", &of);
        CHECK(rc == -EINVAL && strstr(err_msg(), "character device"), "/dev/null: %d %s", rc,
              err_msg());
    }
    check_registry();
    check_signal(false, SIGTERM);
    check_signal(true, SIGTERM);
    check_signal(false, SIGKILL);
    check_signal(true, SIGKILL);
    check_keeps_handler();
    CHECK(rmdir(tmpdir) == 0, "%s is not empty at the end", tmpdir);
    return test_finish("test_outfile");
}
