/* gemm: picks the kernel for the host (contract in gemm.h). */
#include "gemm.h"

#include "cpu_features.h"

gemm_fn gemm_get(uint32_t wtype)
{
    if (cpu_isa_best() < CPU_ISA_AVX512VNNI)
        return NULL;
    return gemm_avx512_get(wtype);
}
