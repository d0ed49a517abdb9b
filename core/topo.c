#include "topo.h"

#include <errno.h>
#include <hwloc.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "errors.h"

struct topo {
    hwloc_topology_t h;
};

int topo_open(struct topo **out)
{
    struct topo *t = calloc(1, sizeof(*t));
    if (!t)
        return err_set(-ENOMEM, "out of memory");
    if (hwloc_topology_init(&t->h) ||
        hwloc_topology_set_io_types_filter(t->h, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) ||
        hwloc_topology_load(t->h)) {
        free(t);
        return err_set(-EIO, "hwloc: cannot load the machine topology");
    }
    *out = t;
    return 0;
}

void topo_close(struct topo *t)
{
    if (!t)
        return;
    hwloc_topology_destroy(t->h);
    free(t);
}

int topo_n_cores(const struct topo *t)
{
    return hwloc_get_nbobjs_by_type(t->h, HWLOC_OBJ_CORE);
}

int topo_pci_numa_node(struct topo *t, const char *pci_bus_id)
{
    unsigned dom, bus, dev, fn;
    if (sscanf(pci_bus_id, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4)
        return err_set(-EINVAL, "'%s' is not a PCI bus id (dddd:bb:dd.f)", pci_bus_id);
    hwloc_obj_t pci = hwloc_get_pcidev_by_busid(t->h, dom, bus, dev, fn);
    hwloc_obj_t anc = pci ? hwloc_get_non_io_ancestor_obj(t->h, pci) : NULL;
    if (!anc)
        return 0;
    hwloc_obj_t node = hwloc_get_next_obj_covering_cpuset_by_type(t->h, anc->cpuset,
                                                                  HWLOC_OBJ_NUMANODE, NULL);
    return node ? (int)node->logical_index : 0;
}

/* The cpuset of node (-1: machine); NULL if there is no such node. */
static hwloc_const_cpuset_t topo_node_set(const struct topo *t, int node)
{
    if (node < 0)
        return hwloc_topology_get_topology_cpuset(t->h);
    hwloc_obj_t o = hwloc_get_obj_by_type(t->h, HWLOC_OBJ_NUMANODE, (unsigned)node);
    return o ? o->cpuset : NULL;
}

int topo_node_cores(const struct topo *t, int node)
{
    hwloc_const_cpuset_t set = topo_node_set(t, node);
    return set ? hwloc_get_nbobjs_inside_cpuset_by_type(t->h, set, HWLOC_OBJ_CORE) : 0;
}

int topo_bind_openmp(struct topo *t, int node, int n_threads)
{
    hwloc_const_cpuset_t set = topo_node_set(t, node);
    int cores = set ? hwloc_get_nbobjs_inside_cpuset_by_type(t->h, set, HWLOC_OBJ_CORE) : 0;
    int failed = 0;

    if (cores <= 0)
        return err_set(-EINVAL, "NUMA node %d has no cores", node);
    if (n_threads <= 0)
        n_threads = cores;
#pragma omp parallel num_threads(n_threads) reduction(+ : failed)
    {
        int ith = omp_get_thread_num();
        hwloc_obj_t core = hwloc_get_obj_inside_cpuset_by_type(t->h, set, HWLOC_OBJ_CORE,
                                                               (unsigned)(ith % cores));
        hwloc_bitmap_t one = hwloc_bitmap_dup(core->cpuset);
        hwloc_bitmap_singlify(one); /* one hardware thread of the core */
        failed += hwloc_set_cpubind(t->h, one, HWLOC_CPUBIND_THREAD) != 0;
        hwloc_bitmap_free(one);
    }
    if (failed)
        return err_set(-EPERM, "hwloc: the OS refused to bind %d of %d threads", failed,
                       n_threads);
    omp_set_num_threads(n_threads);
    return n_threads;
}

int topo_thread_core(struct topo *t)
{
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    int core = -1;
    if (set && hwloc_get_cpubind(t->h, set, HWLOC_CPUBIND_THREAD) == 0) {
        hwloc_obj_t o = hwloc_get_obj_covering_cpuset(t->h, set);
        if (o && o->type != HWLOC_OBJ_CORE)
            o = hwloc_get_ancestor_obj_by_type(t->h, HWLOC_OBJ_CORE, o);
        if (o)
            core = (int)o->logical_index;
    }
    hwloc_bitmap_free(set);
    return core;
}

int topo_membind_area(struct topo *t, void *p, size_t len, int node)
{
    hwloc_obj_t o = node >= 0 ? hwloc_get_obj_by_type(t->h, HWLOC_OBJ_NUMANODE, (unsigned)node)
                              : NULL;
    if (!o)
        return -EINVAL;
    if (hwloc_set_area_membind(t->h, p, len, o->nodeset, HWLOC_MEMBIND_BIND,
                               HWLOC_MEMBIND_BYNODESET) != 0)
        return -ENOSYS;
    return 0;
}
