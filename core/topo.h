/* topo: where strata's CPU work should run (hwloc): the NUMA node nearest a GPU, its physical
 * cores, and binding the OpenMP threads one per physical core there, so CPU expert work reads
 * the memory of its own node and never shares a core between two threads. */
#ifndef STRATA_TOPO_H
#define STRATA_TOPO_H

#include <stddef.h>

struct topo;

int topo_open(struct topo **out);
void topo_close(struct topo *t);

/* Physical cores in the machine. */
int topo_n_cores(const struct topo *t);

/* The NUMA node (logical index) of the PCI device "dddd:bb:dd.f" (cuda_info's pci_bus_id), or
 * 0 when hwloc cannot place it (no I/O topology, a VM); -EINVAL for a malformed id. */
int topo_pci_numa_node(struct topo *t, const char *pci_bus_id);

/* Physical cores of NUMA node `node` (logical index; -1: the whole machine). */
int topo_node_cores(const struct topo *t, int node);

/* Binds the OpenMP threads (n_threads, 0: one per core of the node) one per physical core of
 * node `node` (-1: all cores), in core order, and makes n_threads the OpenMP default.
 * Returns the thread count used, or -errno when the OS refuses the binding (containers). */
int topo_bind_openmp(struct topo *t, int node, int n_threads);

/* Binds the pages of [p, p + len) (not yet touched) to NUMA node `node` (logical index), so
 * they are allocated there. 0, -EINVAL for a bad node, -ENOSYS where the OS refuses. */
int topo_membind_area(struct topo *t, void *p, size_t len, int node);

/* The physical core (logical index) the calling thread is bound to, or -1 when it is not
 * bound to exactly one core. */
int topo_thread_core(struct topo *t);

#endif
