/* sysinfo: facts about the host that the engine and the CLI report: hwloc topology (packages,
 * physical cores, NUMA nodes), io_uring availability, jemalloc, CUDA devices, and the host
 * memory a size derived from user input is checked against. */
#ifndef STRATA_SYSINFO_H
#define STRATA_SYSINFO_H

#include <stdbool.h>
#include <stdint.h>

struct sysinfo_host {
    char cpu_model[128];
    int packages;
    int cores;      /* physical cores */
    int pus;        /* hardware threads */
    int numa_nodes;
    uint64_t ram_bytes;
    bool uring_ok;          /* io_uring_queue_init succeeded */
    char uring_why[128];    /* when !uring_ok */
    const char *jemalloc;   /* version string, or NULL when not linked */
    char hwloc_version[32];
};

/* Fills *out; 0 or -errno (hwloc topology failure). */
int sysinfo_host_get(struct sysinfo_host *out);

/* The bytes of host memory a new allocation can have without swapping: MemAvailable of
 * /proc/meminfo, or, where that line is missing, the physical memory (sysconf's
 * _SC_PHYS_PAGES * page size), and no more than the room left under the memory.max of this
 * process's cgroup (v2) and its ancestors, page cache counted as free. 0 when neither can be
 * read. */
uint64_t sysinfo_mem_available(void);

#endif
