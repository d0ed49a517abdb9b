#include "sysinfo.h"

#include <hwloc.h>
#include <liburing.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "errors.h"

/* jemalloc's mallctl, present only when the static archive is linked (not in sanitizer
 * builds, where the sanitizers own malloc). */
extern int mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen)
    __attribute__((weak));

static void sysinfo_cpu_model(char *buf, size_t size)
{
    char line[256];
    FILE *f = fopen("/proc/cpuinfo", "r");

    snprintf(buf, size, "unknown");
    if (!f)
        return;
    while (fgets(line, sizeof(line), f)) {
        char *colon = strchr(line, ':');
        if (!strncmp(line, "model name", 10) && colon) {
            snprintf(buf, size, "%s", colon + 2);
            buf[strcspn(buf, "\n")] = '\0';
            break;
        }
    }
    fclose(f);
}

static void sysinfo_uring(struct sysinfo_host *out)
{
    struct io_uring ring;
    int rc = io_uring_queue_init(4, &ring, 0);

    out->uring_ok = rc == 0;
    if (rc == 0)
        io_uring_queue_exit(&ring);
    else
        snprintf(out->uring_why, sizeof(out->uring_why), "io_uring_queue_init: %s",
                 strerror(-rc));
}

int sysinfo_host_get(struct sysinfo_host *out)
{
    hwloc_topology_t topo;
    hwloc_obj_t root;
    unsigned v = hwloc_get_api_version();

    memset(out, 0, sizeof(*out));
    sysinfo_cpu_model(out->cpu_model, sizeof(out->cpu_model));
    snprintf(out->hwloc_version, sizeof(out->hwloc_version), "%u.%u.%u", v >> 16,
             (v >> 8) & 0xff, v & 0xff);
    if (hwloc_topology_init(&topo) || hwloc_topology_load(topo))
        return err_set(-EIO, "hwloc: cannot load the machine topology");
    out->packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
    out->cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    out->pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
    out->numa_nodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    root = hwloc_get_root_obj(topo);
    out->ram_bytes = root->total_memory;
    hwloc_topology_destroy(topo);

    sysinfo_uring(out);
    if (mallctl) {
        size_t len = sizeof(out->jemalloc);
        if (mallctl("version", &out->jemalloc, &len, NULL, 0))
            out->jemalloc = NULL;
    }
    return 0;
}

/* The first unsigned number in file path; false if there is none ("max"). */
static bool sysinfo_read_u64(const char *path, uint64_t *out)
{
    unsigned long long v;
    FILE *f = fopen(path, "r");
    bool ok = f && fscanf(f, "%llu", &v) == 1;
    if (f)
        fclose(f);
    if (ok)
        *out = v;
    return ok;
}

/* The least headroom (limit - usage, the page cache charged to it counted as free: it can be
 * reclaimed) of this process's memory cgroup and its ancestors, under cgroup v2 (memory.max,
 * memory.current, memory.stat's file) or v1 (memory.limit_in_bytes, memory.usage_in_bytes,
 * memory.stat's cache); UINT64_MAX where none is limited or none can be read. */
static uint64_t sysinfo_cgroup_room(void)
{
    static const struct {
        const char *root, *max, *cur, *cache;
    } ver[2] = {
        {"/sys/fs/cgroup", "memory.max", "memory.current", "file %llu"},
        {"/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "cache %llu"},
    };
    char line[512], dir[768];
    uint64_t room = UINT64_MAX;
    for (int v = 0; v < 2; v++) {
        FILE *f = fopen("/proc/self/cgroup", "r");
        if (!f)
            return room;
        const char *path = NULL;
        while (!path && fgets(line, sizeof(line), f)) {
            if (v == 0) {
                path = strncmp(line, "0::", 3) ? NULL : line + 3;
            } else {
                char *c = strstr(line, ":memory:");
                path = c ? c + 8 : NULL;
            }
        }
        fclose(f);
        if (!path)
            continue;
        line[strcspn(line, "\n")] = 0;
        int n = snprintf(dir, sizeof(dir), "%s%s", ver[v].root, path);
        if (n < 0 || (size_t)n >= sizeof(dir))
            continue;
        size_t root_len = strlen(ver[v].root);
        for (;;) {
            char p[800];
            uint64_t max, cur;
            snprintf(p, sizeof(p), "%s/%s", dir, ver[v].max);
            if (sysinfo_read_u64(p, &max)) {
                snprintf(p, sizeof(p), "%s/%s", dir, ver[v].cur);
                if (sysinfo_read_u64(p, &cur)) {
                    char stat[128];
                    unsigned long long cache = 0;
                    snprintf(p, sizeof(p), "%s/memory.stat", dir);
                    FILE *fs = fopen(p, "r");
                    while (fs && fgets(stat, sizeof(stat), fs))
                        if (sscanf(stat, ver[v].cache, &cache) == 1)
                            break;
                    if (fs)
                        fclose(fs);
                    cur = cur > cache ? cur - cache : 0;
                    uint64_t r = max > cur ? max - cur : 0;
                    room = r < room ? r : room;
                }
            }
            char *slash = strrchr(dir, '/');
            if (!slash || (size_t)(slash - dir) < root_len)
                break;
            *slash = 0;
        }
    }
    return room;
}

uint64_t sysinfo_mem_available(void)
{
    char line[256];
    unsigned long long kb;
    long pages, page;
    uint64_t avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");

    if (f) {
        while (fgets(line, sizeof(line), f)) {
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                avail = (uint64_t)kb * 1024;
                break;
            }
        }
        fclose(f);
    }
    if (!avail) {
        pages = sysconf(_SC_PHYS_PAGES);
        page = sysconf(_SC_PAGESIZE);
        avail = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    }
    uint64_t room = sysinfo_cgroup_room();
    return room < avail ? room : avail;
}
