/* sysinfo: facts about the host that the engine and the CLI report: hwloc topology (packages,
 * physical cores, NUMA nodes), io_uring availability, jemalloc, CUDA devices. */
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

#endif
