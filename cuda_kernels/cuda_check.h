/* cuda_check: the one checked-call macro for CUDA runtime calls. It prints the statement, file
 * and line and evaluates to the cudaError_t, so the caller decides what to do (it never hides a
 * return). Use: if (CUDA_CHECK(cudaMalloc(&p, n)) != cudaSuccess) goto out_free; */
#ifndef STRATA_CUDA_CHECK_H
#define STRATA_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>

static inline cudaError_t cuda_check_report(cudaError_t e, const char *stmt, const char *file,
                                            int line)
{
    if (e != cudaSuccess)
        fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", file, line, stmt, cudaGetErrorString(e),
                cudaGetErrorName(e));
    return e;
}

#define CUDA_CHECK(stmt) cuda_check_report((stmt), #stmt, __FILE__, __LINE__)

#endif
