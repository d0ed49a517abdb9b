/* limits: sizes derived from user input are checked against the machine before anything is
 * allocated:
 * - stream_size_get's arithmetic on hand-set hyperparameters (KV cache 2 * n_layer * n_ctx *
 *   n_head_kv*head_dim floats, the activation arena), and -EOVERFLOW past 64 bits;
 * - stream_size_check_host at the 90% margin of a fixed available size: the last byte that
 *   fits passes, one more is -ENOMEM with the sizes in the message (deterministic: no
 *   /proc/meminfo involved);
 * - sysinfo_mem_available is positive here;
 * - strata_stream_open on the CPU device with INT_MAX positions of the generated `tiny` model
 *   (a 2 TiB KV cache, more than any test machine has) is -ENOMEM and names the sizes, and a
 *   normal stream opens afterwards;
 * - strata_config.n_threads above the online processors is capped to their count.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen.h"
#include "model.h"
#include "strata.h"
#include "stream.h"
#include "sysinfo.h"
#include "testutil.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static char tmpdir[] = "/tmp/strata-test-limits-XXXXXX";

static void check_size(void)
{
    struct model m;
    struct stream_size sz;
    int rc;

    /* a 48-layer model with 4 KV heads of 128, n_embd 2048, 32 heads, vocab 151936 */
    memset(&m, 0, sizeof(m));
    m.hp.n_layer = 48;
    m.hp.n_embd = 2048;
    m.hp.n_head = 32;
    m.hp.n_head_kv = 4;
    m.hp.head_dim = 128;
    m.hp.n_vocab = 151936;
    rc = stream_size_get(&m, 1048576, 512, &sz);
    CHECK(rc == 0, "stream_size_get: %s", strata_error());
    CHECK(sz.kv_bytes == 2ull * 48 * 1048576 * 512 * 4, "KV bytes %llu",
          (unsigned long long)sz.kv_bytes);
    CHECK(sz.arena_bytes == (512ull * (3 * 2048 + 2 * 4096 + 2 * 512) + 151936) * 4,
          "arena bytes %llu", (unsigned long long)sz.arena_bytes);
    CHECK(stream_size_get(&m, 0, 512, &sz) == -EINVAL, "zero context");
    CHECK(stream_size_get(&m, 16, -1, &sz) == -EINVAL, "negative batch");

    m.hp.n_layer = UINT32_MAX;
    m.hp.n_head_kv = UINT32_MAX;
    m.hp.head_dim = UINT32_MAX;
    rc = stream_size_get(&m, INT_MAX, 512, &sz);
    CHECK(rc == -EOVERFLOW, "hostile hyperparameters: %d", rc);
    CHECK(strstr(strata_error(), "overflow") != NULL, "message: %s", strata_error());
}

static void check_margin(void)
{
    /* 16 GiB of KV cache + 0.5 GiB of activations against 20 GiB available: 90% is 18 GiB */
    struct stream_size sz = {.kv_bytes = 16ull << 30, .arena_bytes = 1ull << 29};
    uint64_t avail = 20ull << 30;
    const char *msg;
    int rc;

    CHECK(stream_size_check_host(&sz, 1048576, avail) == 0, "16.5 GiB of 20: %s",
          strata_error());
    sz.arena_bytes = avail / 10 * 9 - sz.kv_bytes; /* exactly 90% */
    CHECK(stream_size_check_host(&sz, 1048576, avail) == 0, "exactly 90%%: %s", strata_error());
    sz.arena_bytes++;
    CHECK(stream_size_check_host(&sz, 1048576, avail) == -ENOMEM, "one byte over 90%%");

    sz.kv_bytes = 32ull << 30;
    sz.arena_bytes = 3ull << 29;
    rc = stream_size_check_host(&sz, 2097152, avail);
    msg = strata_error();
    CHECK(rc == -ENOMEM, "33.5 GiB of 20: %d", rc);
    CHECK(strstr(msg, "2097152 positions") && strstr(msg, "33.5 GiB") &&
              strstr(msg, "KV cache 32.0 GiB") && strstr(msg, "activations 1.5 GiB") &&
              strstr(msg, "20.0 GiB are available"),
          "the message does not name the sizes: %s", msg);
}

static void config_cpu(struct strata_config *cfg, const char *path)
{
    strata_config_init(cfg);
    cfg->model_path = path;
    cfg->device = STRATA_DEVICE_CPU;
    cfg->n_threads = 2;
    cfg->n_ctx = 128;
    cfg->n_batch = 32;
}

static void check_stream_open(const char *path)
{
    struct strata_config cfg;
    struct strata *s = NULL;
    struct strata_stream *st = NULL;
    const char *msg;
    int rc;

    config_cpu(&cfg, path);
    if (strata_open(&cfg, &s)) {
        CHECK(0, "strata_open %s: %s", path, strata_error());
        return;
    }
    rc = strata_stream_open(s, INT_MAX, &st);
    msg = strata_error();
    CHECK(rc == -ENOMEM, "INT_MAX positions: %d (%s)", rc, msg);
    CHECK(st == NULL, "a stream came back");
    CHECK(strstr(msg, "2147483647 positions needs") && strstr(msg, "KV cache 2048.0 GiB") &&
              strstr(msg, "activations") && strstr(msg, "are available"),
          "the message does not name the sizes: %s", msg);
    rc = strata_stream_open(s, 0, &st);
    CHECK(rc == 0, "a stream of cfg.n_ctx after the refusal: %s", strata_error());
    strata_stream_close(st);
    strata_close(s);
}

static void check_threads(const char *path)
{
    struct strata_config cfg;
    struct strata_model_info mi;
    struct strata *s = NULL;
    long n = sysconf(_SC_NPROCESSORS_ONLN);

    config_cpu(&cfg, path);
    cfg.n_threads = 100000;
    if (strata_open(&cfg, &s)) {
        CHECK(0, "strata_open with 100000 threads: %s", strata_error());
        return;
    }
    strata_model_info(s, &mi);
    CHECK(n > 0 && mi.n_threads == n, "100000 threads: %d, %ld processors online", mi.n_threads,
          n);
    strata_close(s);
}

int main(void)
{
    char path[512];

    check_size();
    check_margin();
    CHECK(sysinfo_mem_available() > 0, "no available memory reported");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    if (test_gen_model(gen_preset_find("tiny"), QUANT_MIX_F32, 7, tmpdir, "tiny", path,
                       sizeof(path))) {
        fprintf(stderr, "gen: %s\n", strata_error());
        return 1;
    }
    check_stream_open(path);
    check_threads(path);
    unlink(path);
    rmdir(tmpdir);
    return test_finish("test_limits");
}
