/* cuda_gather_copy: one launch copies up to CUDA_GATHER_MAX pieces, from mapped pinned host
 * memory (read by the kernel, zero-copy) or device memory, into device memory: every byte
 * arrives, aligned pieces (16-byte words) and unaligned ones (bytes) alike, nothing around them
 * is touched (poisoned guards), and bad counts are refused. Exits 77 without a GPU. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_mem.h"
#include "testutil.h"

#define HOST_BYTES (8u << 20)

int main(void)
{
    struct rng r;
    void *host = NULL, *mapped = NULL, *dev = NULL;

    if (!test_gpu_available("test_cuda_gather"))
        return TEST_SKIP;
    rng_seed(&r, test_seed("test_cuda_gather"), 3);
    if (cuda_host_alloc(&host, HOST_BYTES, &mapped) || cuda_malloc(&dev, 2 * HOST_BYTES)) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    uint8_t *h = host;
    for (size_t i = 0; i < HOST_BYTES; i++)
        h[i] = (uint8_t)rng_below(&r, 256);
    test_dev_poison(dev, 2 * HOST_BYTES);
    cuda_stream_sync(NULL);

    /* pieces: aligned expert-sized ones, odd sizes and offsets, one from device memory */
    struct cuda_gather g = {0};
    uint64_t src_off[CUDA_GATHER_MAX], dst_off[CUDA_GATHER_MAX];
    uint64_t at = 0;
    for (int i = 0; i < 12; i++) {
        uint64_t n = i < 6 ? (uint64_t)(16 * (1 + rng_below(&r, 40000)))
                           : (uint64_t)(1 + rng_below(&r, 100000));
        src_off[i] = i < 6 ? 16 * rng_below(&r, (HOST_BYTES - n) / 16) : rng_below(&r, HOST_BYTES - n);
        dst_off[i] = at + (i < 6 ? 0 : 1 + rng_below(&r, 15));
        at = (dst_off[i] + n + 64 + 15) / 16 * 16; /* a 64-byte gap that must stay poisoned */
        g.item[i].src = (const uint8_t *)mapped + src_off[i];
        g.item[i].dst = (uint8_t *)dev + dst_off[i];
        g.item[i].bytes = n;
        g.n++;
    }
    CHECK(cuda_gather_copy(&g, NULL) == 0, "gather");
    CHECK(cuda_stream_sync(NULL) == 0, "sync");
    uint8_t *back = test_xmalloc(at);
    test_dev_get(back, dev, at);
    size_t bad = 0, guard = 0;
    uint64_t prev_end = 0;
    for (int i = 0; i < g.n; i++) {
        bad += memcmp(back + dst_off[i], h + src_off[i], g.item[i].bytes) != 0;
        for (uint64_t b = prev_end; b < dst_off[i]; b++)
            guard += back[b] != 0xFF;
        prev_end = dst_off[i] + g.item[i].bytes;
    }
    printf("test_cuda_gather: %d pieces (%.1f MB) from mapped host memory: %zu wrong, %zu guard "
           "bytes touched\n", g.n, at / 1e6, bad, guard);
    CHECK(bad == 0 && guard == 0, "%zu pieces wrong, %zu guard bytes touched", bad, guard);
    free(back);

    /* device to device, and the limits */
    struct cuda_gather d = {.n = 1};
    d.item[0].src = dev;
    d.item[0].dst = (uint8_t *)dev + HOST_BYTES;
    d.item[0].bytes = 4096;
    CHECK(cuda_gather_copy(&d, NULL) == 0 && cuda_stream_sync(NULL) == 0, "device to device");
    uint8_t a[4096], b[4096];
    test_dev_get(a, dev, 4096);
    test_dev_get(b, (uint8_t *)dev + HOST_BYTES, 4096);
    CHECK(memcmp(a, b, 4096) == 0, "device-to-device copy differs");
    d.n = CUDA_GATHER_MAX + 1;
    CHECK(cuda_gather_copy(&d, NULL) == -EINVAL, "too many pieces accepted");
    cuda_free(dev);
    cuda_host_free(host);
    return test_finish("test_cuda_gather");
}
