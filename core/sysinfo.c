#include "sysinfo.h"

#include <hwloc.h>
#include <liburing.h>
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

uint64_t sysinfo_mem_available(void)
{
    char line[256];
    unsigned long long kb;
    long pages, page;
    FILE *f = fopen("/proc/meminfo", "r");

    if (f) {
        while (fgets(line, sizeof(line), f)) {
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                fclose(f);
                return (uint64_t)kb * 1024;
            }
        }
        fclose(f);
    }
    pages = sysconf(_SC_PHYS_PAGES);
    page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}
