/* cuda_info with CUDA: device enumeration through the runtime API. */
#include "cuda_check.h"
#include "cuda_info.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

extern "C" bool cuda_backend_built(void)
{
    return true;
}

extern "C" int cuda_device_count(const char **why)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky-free error so later calls start clean */
        if (why)
            *why = e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice
                       ? "no CUDA device found (no NVIDIA driver or GPU on this machine)"
                       : cudaGetErrorString(e);
        return 0;
    }
    if (n == 0 && why)
        *why = "no CUDA device found (no NVIDIA driver or GPU on this machine)";
    return n;
}

extern "C" int cuda_device_info_get(int dev, struct cuda_device_info *out)
{
    cudaDeviceProp p;
    size_t free_b = 0, total_b = 0;

    if (CUDA_CHECK(cudaGetDeviceProperties(&p, dev)) != cudaSuccess)
        return -ENODEV;
    memset(out, 0, sizeof(*out));
    snprintf(out->name, sizeof(out->name), "%s", p.name);
    out->major = p.major;
    out->minor = p.minor;
    out->sm_count = p.multiProcessorCount;
    out->total_bytes = p.totalGlobalMem;
    out->pci_bus = p.pciBusID;
    out->pci_device = p.pciDeviceID;
    out->pci_domain = p.pciDomainID;
    cudaDeviceGetPCIBusId(out->pci_bus_id, (int)sizeof(out->pci_bus_id), dev);
    if (CUDA_CHECK(cudaSetDevice(dev)) == cudaSuccess &&
        CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b)) == cudaSuccess)
        out->free_bytes = free_b;
    return 0;
}
