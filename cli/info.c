/* strata info: what this machine offers strata. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cpu_features.h"
#include "cuda_info.h"
#include "gemm.h"
#include "sysinfo.h"

static void info_usage(void)
{
    printf("usage: strata info\n\n"
           "Prints the CPU model and SIMD level the kernels will use, whether AMX tiles run\n"
           "the batched ones (and if not, why), the hwloc topology (packages, physical\n"
           "cores, NUMA nodes, RAM), whether io_uring works, the jemalloc version, and the\n"
           "CUDA devices this build can use.\n");
}

static void info_cpu(void)
{
    const struct cpu_features *f = cpu_features_get();

    printf("cpu kernels:  %s (avx2 %d, avx512f %d, avx512bw %d, avx512vnni %d, avx512bf16 %d, "
           "amx-int8 %d)\n",
           cpu_isa_name(cpu_isa_best()), f->avx2, f->avx512f, f->avx512bw, f->avx512vnni,
           f->avx512bf16, f->amx_int8);
    const char *why = gemm_amx_status();
    printf("amx tiles:    %s\n", why ? why : "used for batches of 16 and more rows (gemm)");
}

static void info_cuda(void)
{
    const char *why = NULL;
    int n = cuda_device_count(&why);

    if (n == 0) {
        printf("cuda:         none (%s)\n", why ? why : "unknown");
        return;
    }
    for (int i = 0; i < n; i++) {
        struct cuda_device_info d;
        if (cuda_device_info_get(i, &d))
            continue;
        printf("cuda %d:       %s, sm_%d%d, %d SMs, %.1f GiB (%.1f free), pci %s\n", i, d.name,
               d.major, d.minor, d.sm_count, d.total_bytes / 1073741824.0,
               d.free_bytes / 1073741824.0, d.pci_bus_id);
    }
}

int cmd_info(int argc, char **argv)
{
    struct sysinfo_host h;

    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        info_usage();
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "strata info: unexpected argument '%s'\n", argv[1]);
        return 2;
    }
    if (sysinfo_host_get(&h))
        return cli_fail("info");
    printf("cpu:          %s\n", h.cpu_model);
    printf("topology:     %d package(s), %d cores, %d threads, %d NUMA node(s), %.1f GiB RAM "
           "(hwloc %s)\n",
           h.packages, h.cores, h.pus, h.numa_nodes, h.ram_bytes / 1073741824.0,
           h.hwloc_version);
    info_cpu();
    printf("io_uring:     %s\n", h.uring_ok ? "available" : h.uring_why);
    printf("jemalloc:     %s\n", h.jemalloc ? h.jemalloc : "not linked (sanitizer build)");
    info_cuda();
    return 0;
}
