/* topo: the hwloc view (cores, NUMA node of a PCI id) and OpenMP binding one thread per
 * physical core: after topo_bind_openmp every thread reports its own core, all distinct; memory
 * of an area bound to node 0 (refusal tolerated), a missing node refused.
 * Exits 77 where the OS refuses thread binding (some containers). */
#include <errno.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "errors.h"
#include "testutil.h"
#include "topo.h"

int main(void)
{
    struct topo *t;
    int cores[1024];
    CHECK(topo_open(&t) == 0, "topo_open: %s", err_msg());
    int n = topo_n_cores(t);
    CHECK(n >= 1 && n <= 1024, "%d cores", n);
    CHECK(topo_node_cores(t, -1) == n, "machine cores %d vs %d", topo_node_cores(t, -1), n);
    CHECK(topo_node_cores(t, 0) >= 1, "node 0 has no cores");
    CHECK(topo_pci_numa_node(t, "not-a-bus-id") == -EINVAL, "bad bus id accepted");
    CHECK(topo_pci_numa_node(t, "0000:ff:1f.7") >= 0, "an absent device must map to node 0");
    /* memory binding: node 0 exists everywhere; a node that does not is refused */
    size_t len = (size_t)4 << 20;
    uint8_t *area = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(area != MAP_FAILED, "mmap");
    if (area != MAP_FAILED) {
        int mb = topo_membind_area(t, area, len, 0);
        CHECK(mb == 0 || mb == -ENOSYS, "membind to node 0: %d", mb);
        CHECK(topo_membind_area(t, area, len, 999) == -EINVAL, "node 999 accepted");
        memset(area, 1, len); /* the pages appear, on node 0 */
        CHECK(area[len - 1] == 1, "the bound area is usable");
        munmap(area, len);
    }
    int rc = topo_bind_openmp(t, -1, 0);
    if (rc == -EPERM) {
        printf("test_topo: skipped binding: %s\n", err_msg());
        topo_close(t);
        return test_failures ? 1 : TEST_SKIP;
    }
    CHECK(rc == n, "bound %d threads, expected %d", rc, n);
#pragma omp parallel num_threads(n)
    cores[omp_get_thread_num()] = topo_thread_core(t);
    for (int i = 0; i < n; i++) {
        CHECK(cores[i] == i, "thread %d on core %d, expected core %d", i, cores[i], i);
        for (int j = 0; j < i; j++)
            CHECK(cores[i] != cores[j], "threads %d and %d share core %d", i, j, cores[i]);
    }
    printf("test_topo: %d cores (%d on node 0), %d threads bound one per core\n", n,
           topo_node_cores(t, 0), rc);
    topo_close(t);
    return test_finish("test_topo");
}
