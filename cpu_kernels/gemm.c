/* gemm: picks the kernel for the host (contract in gemm.h). */
#include "gemm.h"

gemm_fn gemm_get(uint32_t wtype, enum cpu_isa isa)
{
    enum cpu_isa best = cpu_isa_best();
    gemm_fn fn = NULL;
    if (isa > best)
        isa = best;
    if (isa >= CPU_ISA_AVX512VNNI)
        fn = gemm_amx_get(wtype);
    if (!fn && isa >= CPU_ISA_AVX512VNNI)
        fn = gemm_avx512_get(wtype);
    if (!fn && isa >= CPU_ISA_AVX2)
        fn = gemm_avx2_get(wtype);
    return fn;
}
