/* cpu_features: what the host CPU can execute (cpuid + xgetbv), read once. */
#ifndef STRATA_CPU_FEATURES_H
#define STRATA_CPU_FEATURES_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Instruction-set levels of the CPU kernels, lowest first. */
enum cpu_isa {
    CPU_ISA_SCALAR = 0,
    CPU_ISA_AVX2,       /* AVX2 + FMA + F16C */
    CPU_ISA_AVX512,     /* AVX-512 F/BW/VL/DQ */
    CPU_ISA_AVX512VNNI, /* AVX-512 + VNNI (vpdpbusd) */
    CPU_ISA_COUNT
};

struct cpu_features {
    bool avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16;
    bool avxvnni, amx_int8, amx_bf16;
};

/* The host's features (cached after the first call; thread-safe). */
const struct cpu_features *cpu_features_get(void);

/* The best ISA level the host supports. */
enum cpu_isa cpu_isa_best(void);

/* "scalar", "avx2", "avx512", "avx512vnni". */
const char *cpu_isa_name(enum cpu_isa isa);

/* A kernel choice that is on unless the environment variable `name` is "0", for comparisons:
 * *state < 0 reads it (once), else *state is what a test set. */
bool cpu_env_switch(int *state, const char *name);

#ifdef __cplusplus
}
#endif

#endif
