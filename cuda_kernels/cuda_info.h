/* cuda_info: which CUDA devices the process sees. Without a CUDA build (cuda_info_stub.c)
 * every function reports zero devices, so callers need no #ifdef. */
#ifndef STRATA_CUDA_INFO_H
#define STRATA_CUDA_INFO_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cuda_device_info {
    char name[256];
    int major, minor;    /* compute capability */
    int sm_count;
    size_t total_bytes;  /* device memory */
    size_t free_bytes;   /* free when queried */
    int pci_bus, pci_device, pci_domain;
    char pci_bus_id[32]; /* "0000:3b:00.0", for hwloc NUMA lookup */
};

/* True when strata was built with the CUDA backend. */
bool cuda_backend_built(void);

/* Number of usable devices (0 without CUDA, without a driver or without a GPU). When 0, *why
 * (if non-NULL) points to a static reason string. */
int cuda_device_count(const char **why);

/* Fills *out for device dev; 0 or -ENODEV. */
int cuda_device_info_get(int dev, struct cuda_device_info *out);

#ifdef __cplusplus
}
#endif
#endif
