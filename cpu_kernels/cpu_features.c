/* cpu_features: cpuid + xgetbv, read once (pthread_once), and the ISA level the kernels use.
 *
 * An instruction set counts only if the CPU has it AND the OS saves its register state on
 * context switches (XCR0, read with xgetbv): a hypervisor may hide AVX-512 state even when
 * cpuid reports the instructions.
 *
 * Debugging hook: the environment variable STRATA_CPU_ISA=scalar|avx2|avx512|avx512vnni caps
 * the level cpu_isa_best() returns (it never raises it). It is read here and nowhere else.
 */
#include "cpu_features.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define CPU_FEATURES_X86 1
#endif

static struct cpu_features features;
static enum cpu_isa isa_best = CPU_ISA_SCALAR;
static pthread_once_t features_once = PTHREAD_ONCE_INIT;

static const char *const isa_names[CPU_ISA_COUNT] = {"scalar", "avx2", "avx512", "avx512vnni"};

#ifdef CPU_FEATURES_X86
/* XCR0 via xgetbv; only valid when cpuid reports OSXSAVE. */
static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect_x86(struct cpu_features *f)
{
    unsigned int eax, ebx, ecx, edx;
    unsigned int max_leaf = __get_cpuid_max(0, NULL);

    if (max_leaf < 1 || !__get_cpuid(1, &eax, &ebx, &ecx, &edx))
        return;
    bool osxsave = ecx & (1u << 27);
    bool avx = ecx & (1u << 28);
    bool fma = ecx & (1u << 12);
    bool f16c = ecx & (1u << 29);

    uint64_t xcr0 = osxsave ? read_xcr0() : 0;
    bool os_avx = (xcr0 & 0x6) == 0x6;                /* SSE + AVX (YMM) state */
    bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0; /* opmask + ZMM_Hi256 + Hi16_ZMM */
    bool os_amx = (xcr0 & 0x60000) == 0x60000;        /* TILECFG + TILEDATA */

    if (max_leaf < 7 || !os_avx)
        return;
    f->fma = avx && fma;
    f->f16c = avx && f16c;

    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    unsigned int leaf7_max_sub = eax;
    f->avx2 = avx && (ebx & (1u << 5));
    if (os_avx512) {
        f->avx512f = ebx & (1u << 16);
        f->avx512dq = ebx & (1u << 17);
        f->avx512bw = ebx & (1u << 30);
        f->avx512vl = ebx & (1u << 31);
        f->avx512vnni = ecx & (1u << 11);
    }
    if (os_amx) {
        f->amx_bf16 = edx & (1u << 22);
        f->amx_int8 = edx & (1u << 25);
    }
    if (leaf7_max_sub >= 1) {
        __cpuid_count(7, 1, eax, ebx, ecx, edx);
        f->avxvnni = f->avx2 && (eax & (1u << 4));
        f->avx512bf16 = os_avx512 && (eax & (1u << 5));
    }
}
#endif

static enum cpu_isa isa_from_features(const struct cpu_features *f)
{
    if (!(f->avx2 && f->fma && f->f16c))
        return CPU_ISA_SCALAR;
    if (!(f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq))
        return CPU_ISA_AVX2;
    return f->avx512vnni ? CPU_ISA_AVX512VNNI : CPU_ISA_AVX512;
}

bool cpu_env_switch(int *state, const char *name)
{
    if (*state < 0) {
        const char *e = getenv(name);
        *state = !(e && *e == '0');
    }
    return *state;
}

/* Applies the STRATA_CPU_ISA cap; an unknown value is reported once and ignored. */
static enum cpu_isa isa_apply_env_cap(enum cpu_isa isa)
{
    const char *env = getenv("STRATA_CPU_ISA");
    if (!env || !*env)
        return isa;
    for (int i = 0; i < CPU_ISA_COUNT; i++) {
        if (!strcmp(env, isa_names[i]))
            return (enum cpu_isa)i < isa ? (enum cpu_isa)i : isa;
    }
    fprintf(stderr,
            "strata: STRATA_CPU_ISA='%s' is not one of scalar, avx2, avx512, "
            "avx512vnni; ignored\n",
            env);
    return isa;
}

static void features_init(void)
{
#ifdef CPU_FEATURES_X86
    detect_x86(&features);
#endif
    isa_best = isa_apply_env_cap(isa_from_features(&features));
}

const struct cpu_features *cpu_features_get(void)
{
    pthread_once(&features_once, features_init);
    return &features;
}

enum cpu_isa cpu_isa_best(void)
{
    pthread_once(&features_once, features_init);
    return isa_best;
}

const char *cpu_isa_name(enum cpu_isa isa)
{
    return (unsigned)isa < CPU_ISA_COUNT ? isa_names[isa] : "unknown";
}
