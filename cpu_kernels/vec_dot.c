/* vec_dot: scalar reference kernels, activation quantizers and run-time dispatch.
 *
 * The scalar kernels are the numerical definition the SIMD variants are tested against: each
 * block's integer sum is exact, the float accumulation runs over blocks in order.
 */
#include "vec_dot.h"

#include <math.h>
#include <string.h>

#include "fp16.h"

/* ---- type table ---- */

struct vec_dot_type {
    int64_t block;       /* elements per block */
    size_t bytes;        /* bytes per block */
    enum quant_type act; /* activation format */
};

static const struct vec_dot_type *type_get(uint32_t wtype)
{
    static const struct vec_dot_type f32 = {1, 4, QUANT_F32};
    static const struct vec_dot_type f16 = {1, 2, QUANT_F32};
    static const struct vec_dot_type bf16 = {1, 2, QUANT_F32};
    static const struct vec_dot_type q8_0 = {QK_32, sizeof(struct block_q8_0), QUANT_Q8_0};
    static const struct vec_dot_type q4_0 = {QK_32, sizeof(struct block_q4_0), QUANT_Q8_0};
    static const struct vec_dot_type mxfp4 = {QK_32, sizeof(struct block_mxfp4), QUANT_Q8_0};
    static const struct vec_dot_type q2_k = {QK_K, sizeof(struct block_q2_k), QUANT_Q8_K};
    static const struct vec_dot_type q3_k = {QK_K, sizeof(struct block_q3_k), QUANT_Q8_K};
    static const struct vec_dot_type q4_k = {QK_K, sizeof(struct block_q4_k), QUANT_Q8_K};
    static const struct vec_dot_type q5_k = {QK_K, sizeof(struct block_q5_k), QUANT_Q8_K};
    static const struct vec_dot_type q6_k = {QK_K, sizeof(struct block_q6_k), QUANT_Q8_K};

    switch (wtype) {
    case QUANT_F32:
        return &f32;
    case QUANT_F16:
        return &f16;
    case QUANT_BF16:
        return &bf16;
    case QUANT_Q8_0:
        return &q8_0;
    case QUANT_Q4_0:
        return &q4_0;
    case QUANT_MXFP4:
        return &mxfp4;
    case QUANT_Q2_K:
        return &q2_k;
    case QUANT_Q3_K:
        return &q3_k;
    case QUANT_Q4_K:
        return &q4_k;
    case QUANT_Q5_K:
        return &q5_k;
    case QUANT_Q6_K:
        return &q6_k;
    default:
        return NULL;
    }
}

bool vec_dot_supported(uint32_t wtype)
{
    return type_get(wtype) != NULL;
}

int64_t vec_dot_block(uint32_t wtype)
{
    const struct vec_dot_type *t = type_get(wtype);
    return t ? t->block : 0;
}

size_t vec_dot_row_bytes(uint32_t wtype, int64_t n)
{
    const struct vec_dot_type *t = type_get(wtype);
    return t ? (size_t)(n / t->block) * t->bytes : 0;
}

enum quant_type vec_dot_act_type(uint32_t wtype)
{
    const struct vec_dot_type *t = type_get(wtype);
    return t ? t->act : QUANT_TYPE_COUNT;
}

size_t vec_dot_act_bytes(uint32_t wtype, int64_t n)
{
    switch (vec_dot_act_type(wtype)) {
    case QUANT_Q8_0:
        return vec_dot_q8_0_extras_at(n) + (size_t)(n / QK_32) * sizeof(struct vec_dot_q8_0_extra);
    case QUANT_Q8_K:
        return (size_t)(n / QK_K) * sizeof(struct block_q8_k);
    case QUANT_F32:
        return (size_t)n * sizeof(float);
    default:
        return 0;
    }
}

/* ---- scalar activation quantizers ---- */

/* Round half to even (the SIMD conversions' rounding), clamped to the int8 code range. */
static inline int8_t act_code(float v)
{
    v = nearbyintf(v);
    return (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
}

static void quantize_q8_0_scalar(const float *x, void *act, int64_t n)
{
    struct block_q8_0 *y = act;
    struct vec_dot_q8_0_extra *e = vec_dot_q8_0_extras(act, n);
    for (int64_t b = 0; b < n / QK_32; b++, x += QK_32) {
        float amax = 0.0f;
        for (int j = 0; j < QK_32; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int32_t sum = 0;
        y[b].d = fp16_from_f32(d);
        for (int j = 0; j < QK_32; j++) {
            y[b].qs[j] = act_code(x[j] * id);
            sum += y[b].qs[j];
        }
        e[b].d = fp16_to_f32(y[b].d);
        e[b].off = -128 * sum;
    }
}

static void quantize_q8_k_scalar(const float *x, void *act, int64_t n)
{
    struct block_q8_k *y = act;
    for (int64_t b = 0; b < n / QK_K; b++, x += QK_K) {
        float amax = 0.0f;
        for (int j = 0; j < QK_K; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = d;
        for (int j = 0; j < QK_K; j++)
            y[b].qs[j] = act_code(x[j] * id);
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++)
                sum += y[b].qs[16 * g + j];
            y[b].bsums[g] = (int16_t)sum;
        }
    }
}

static void quantize_f32_copy(const float *x, void *act, int64_t n)
{
    memcpy(act, x, (size_t)n * sizeof(float));
}

vec_dot_quantize_fn vec_dot_scalar_quantize_get(enum quant_type act_type)
{
    switch (act_type) {
    case QUANT_Q8_0:
        return quantize_q8_0_scalar;
    case QUANT_Q8_K:
        return quantize_q8_k_scalar;
    case QUANT_F32:
        return quantize_f32_copy;
    default:
        return NULL;
    }
}

/* ---- scalar dot kernels: 32-element blocks with Q8_0 activations ---- */

static float dot_q8_0_scalar(int64_t n, const void *w_row, const void *act)
{
    const struct block_q8_0 *w = w_row;
    const struct block_q8_0 *a = act;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_32; b++) {
        int isum = 0;
        for (int j = 0; j < QK_32; j++)
            isum += w[b].qs[j] * a[b].qs[j];
        sum += fp16_to_f32(w[b].d) * fp16_to_f32(a[b].d) * (float)isum;
    }
    return sum;
}

static float dot_q4_0_scalar(int64_t n, const void *w_row, const void *act)
{
    const struct block_q4_0 *w = w_row;
    const struct block_q8_0 *a = act;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_32; b++) {
        int isum = 0;
        for (int j = 0; j < QK_32 / 2; j++) {
            isum += ((w[b].qs[j] & 0x0f) - 8) * a[b].qs[j];
            isum += ((w[b].qs[j] >> 4) - 8) * a[b].qs[j + QK_32 / 2];
        }
        sum += fp16_to_f32(w[b].d) * fp16_to_f32(a[b].d) * (float)isum;
    }
    return sum;
}

static float dot_mxfp4_scalar(int64_t n, const void *w_row, const void *act)
{
    static const int8_t values[16] = VEC_DOT_MXFP4_VALUES;
    const struct block_mxfp4 *w = w_row;
    const struct block_q8_0 *a = act;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_32; b++) {
        int isum = 0;
        for (int j = 0; j < QK_32 / 2; j++) {
            isum += values[w[b].qs[j] & 0x0f] * a[b].qs[j];
            isum += values[w[b].qs[j] >> 4] * a[b].qs[j + QK_32 / 2];
        }
        sum += vec_dot_e8m0_half(w[b].e) * fp16_to_f32(a[b].d) * (float)isum;
    }
    return sum;
}

/* ---- scalar dot kernels: K-quants with Q8_K activations ----
 * Each computes, per super-block, isum = sum_i scale_s(i) * q_i * a_i (integers) and, where the
 * format has mins, msum = sum_s min_s * (sum of the activation codes of sub-block s), then
 * adds d * d_a * isum - dmin * d_a * msum. */

static float dot_q2_k_scalar(int64_t n, const void *w_row, const void *act)
{
    const struct block_q2_k *w = w_row;
    const struct block_q8_k *a = act;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_K; b++) {
        const uint8_t *q = w[b].qs;
        const int8_t *y = a[b].qs;
        int isum = 0, msum = 0;
        for (int g = 0; g < QK_K / 16; g++)
            msum += (w[b].scales[g] >> 4) * a[b].bsums[g];
        /* element 128h + 32j + l: bits 2j of qs[32h + l]; scale index = element / 16 */
        for (int h = 0; h < 2; h++) {
            for (int j = 0; j < 4; j++) {
                for (int l = 0; l < 32; l++) {
                    int e = 128 * h + 32 * j + l;
                    int sc = w[b].scales[e / 16] & 0x0f;
                    isum += sc * ((q[32 * h + l] >> (2 * j)) & 3) * y[e];
                }
            }
        }
        sum += fp16_to_f32(w[b].d) * a[b].d * (float)isum -
               fp16_to_f32(w[b].dmin) * a[b].d * (float)msum;
    }
    return sum;
}

static float dot_q3_k_scalar(int64_t n, const void *w_row, const void *act)
{
    const struct block_q3_k *w = w_row;
    const struct block_q8_k *a = act;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_K; b++) {
        const uint8_t *q = w[b].qs;
        const uint8_t *hm = w[b].hmask;
        const int8_t *y = a[b].qs;
        int16_t sc[16];
        vec_dot_q3_k_scales(w[b].scales, sc);
        int isum = 0;
        /* element 128h + 32j + l: low 2 bits (qs[32h + l] >> 2j) & 3, high bit hmask[l] bit
         * 4h + j; the value is low - 4 when the high bit is clear */
        for (int h = 0; h < 2; h++) {
            for (int j = 0; j < 4; j++) {
                for (int l = 0; l < 32; l++) {
                    int e = 128 * h + 32 * j + l;
                    int v = ((q[32 * h + l] >> (2 * j)) & 3) - ((hm[l] >> (4 * h + j)) & 1 ? 0 : 4);
                    isum += sc[e / 16] * v * y[e];
                }
            }
        }
        sum += fp16_to_f32(w[b].d) * a[b].d * (float)isum;
    }
    return sum;
}

static float dot_q4_k_scalar(int64_t n, const void *w_row, const void *act)
{
    const struct block_q4_k *w = w_row;
    const struct block_q8_k *a = act;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_K; b++) {
        uint32_t sm[4];
        uint8_t sc[8], mn[8];
        vec_dot_k4_scales(w[b].scales, sm);
        memcpy(sc, sm, 8);
        memcpy(mn, sm + 2, 8);
        int isum = 0, msum = 0;
        for (int s = 0; s < 8; s++)
            msum += mn[s] * (a[b].bsums[2 * s] + a[b].bsums[2 * s + 1]);
        /* chunk c: low nibbles of qs[32c..] are sub-block 2c, high nibbles sub-block 2c+1 */
        for (int c = 0; c < 4; c++) {
            int lo = 0, hi = 0;
            for (int l = 0; l < 32; l++) {
                lo += (w[b].qs[32 * c + l] & 0x0f) * a[b].qs[64 * c + l];
                hi += (w[b].qs[32 * c + l] >> 4) * a[b].qs[64 * c + 32 + l];
            }
            isum += sc[2 * c] * lo + sc[2 * c + 1] * hi;
        }
        sum += fp16_to_f32(w[b].d) * a[b].d * (float)isum -
               fp16_to_f32(w[b].dmin) * a[b].d * (float)msum;
    }
    return sum;
}

static float dot_q5_k_scalar(int64_t n, const void *w_row, const void *act)
{
    const struct block_q5_k *w = w_row;
    const struct block_q8_k *a = act;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_K; b++) {
        uint32_t sm[4];
        uint8_t sc[8], mn[8];
        vec_dot_k4_scales(w[b].scales, sm);
        memcpy(sc, sm, 8);
        memcpy(mn, sm + 2, 8);
        int isum = 0, msum = 0;
        for (int s = 0; s < 8; s++)
            msum += mn[s] * (a[b].bsums[2 * s] + a[b].bsums[2 * s + 1]);
        /* as Q4_K; the 5th bit of element l of sub-block s is bit s of qh[l] */
        for (int c = 0; c < 4; c++) {
            int lo = 0, hi = 0;
            for (int l = 0; l < 32; l++) {
                int qlo = (w[b].qs[32 * c + l] & 0x0f) | ((w[b].qh[l] >> (2 * c)) & 1) << 4;
                int qhi = (w[b].qs[32 * c + l] >> 4) | ((w[b].qh[l] >> (2 * c + 1)) & 1) << 4;
                lo += qlo * a[b].qs[64 * c + l];
                hi += qhi * a[b].qs[64 * c + 32 + l];
            }
            isum += sc[2 * c] * lo + sc[2 * c + 1] * hi;
        }
        sum += fp16_to_f32(w[b].d) * a[b].d * (float)isum -
               fp16_to_f32(w[b].dmin) * a[b].d * (float)msum;
    }
    return sum;
}

static float dot_q6_k_scalar(int64_t n, const void *w_row, const void *act)
{
    const struct block_q6_k *w = w_row;
    const struct block_q8_k *a = act;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_K; b++) {
        const int8_t *y = a[b].qs;
        int isum = 0;
        /* element 128h + 32s + l: low 4 bits from ql (table in docs/formats.md, Q6_K), high 2 bits
         * (qh[32h + l] >> 2s) & 3, value - 32; scale index = element / 16 */
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w[b].ql + 64 * h;
            const uint8_t *qh = w[b].qh + 32 * h;
            for (int s = 0; s < 4; s++) {
                for (int l = 0; l < 32; l++) {
                    uint8_t lb = ql[(s & 1) * 32 + l];
                    int low = s < 2 ? lb & 0x0f : lb >> 4;
                    int q = (low | ((qh[l] >> (2 * s)) & 3) << 4) - 32;
                    int e = 128 * h + 32 * s + l;
                    isum += w[b].scales[e / 16] * q * y[e];
                }
            }
        }
        sum += fp16_to_f32(w[b].d) * a[b].d * (float)isum;
    }
    return sum;
}

/* ---- scalar dot kernels: float weights with F32 activations ---- */

static float dot_f32_scalar(int64_t n, const void *w_row, const void *act)
{
    const float *w = w_row;
    const float *a = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++)
        sum += w[i] * a[i];
    return sum;
}

static float dot_f16_scalar(int64_t n, const void *w_row, const void *act)
{
    const uint16_t *w = w_row;
    const float *a = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++)
        sum += fp16_to_f32(w[i]) * a[i];
    return sum;
}

static float dot_bf16_scalar(int64_t n, const void *w_row, const void *act)
{
    const uint16_t *w = w_row;
    const float *a = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++)
        sum += bf16_to_f32(w[i]) * a[i];
    return sum;
}

vec_dot_fn vec_dot_scalar_get(uint32_t wtype)
{
    switch (wtype) {
    case QUANT_F32:
        return dot_f32_scalar;
    case QUANT_F16:
        return dot_f16_scalar;
    case QUANT_BF16:
        return dot_bf16_scalar;
    case QUANT_Q8_0:
        return dot_q8_0_scalar;
    case QUANT_Q4_0:
        return dot_q4_0_scalar;
    case QUANT_MXFP4:
        return dot_mxfp4_scalar;
    case QUANT_Q2_K:
        return dot_q2_k_scalar;
    case QUANT_Q3_K:
        return dot_q3_k_scalar;
    case QUANT_Q4_K:
        return dot_q4_k_scalar;
    case QUANT_Q5_K:
        return dot_q5_k_scalar;
    case QUANT_Q6_K:
        return dot_q6_k_scalar;
    default:
        return NULL;
    }
}

/* ---- dispatch ---- */

static enum cpu_isa isa_clamp(enum cpu_isa isa)
{
    enum cpu_isa best = cpu_isa_best();
    return isa > best ? best : isa;
}

vec_dot_fn vec_dot_get(uint32_t wtype, enum cpu_isa isa)
{
    vec_dot_fn fn = NULL;
    if (!vec_dot_supported(wtype))
        return NULL;
    switch (isa_clamp(isa)) {
    case CPU_ISA_AVX512VNNI:
        fn = vec_dot_avx512_get(wtype, true);
        break;
    case CPU_ISA_AVX512:
        fn = vec_dot_avx512_get(wtype, false);
        break;
    default:
        break;
    }
    if (!fn && isa_clamp(isa) >= CPU_ISA_AVX2)
        fn = vec_dot_avx2_get(wtype);
    return fn ? fn : vec_dot_scalar_get(wtype);
}

vec_dot_rows_fn vec_dot_rows_get(uint32_t wtype, enum cpu_isa isa)
{
    if (!vec_dot_supported(wtype))
        return NULL;
    switch (isa_clamp(isa)) {
    case CPU_ISA_AVX512VNNI:
        return vec_dot_avx512_rows_get(wtype, true);
    case CPU_ISA_AVX512:
        return vec_dot_avx512_rows_get(wtype, false);
    case CPU_ISA_AVX2:
        return vec_dot_avx2_rows_get(wtype);
    default:
        return NULL;
    }
}

vec_dot_quantize_fn vec_dot_quantize_get(uint32_t wtype, enum cpu_isa isa)
{
    enum quant_type act = vec_dot_act_type(wtype);
    vec_dot_quantize_fn fn = NULL;
    if (act == QUANT_TYPE_COUNT)
        return NULL;
    isa = isa_clamp(isa);
    if (isa >= CPU_ISA_AVX512)
        fn = vec_dot_avx512_quantize_get(act);
    if (!fn && isa >= CPU_ISA_AVX2)
        fn = vec_dot_avx2_quantize_get(act);
    return fn ? fn : vec_dot_scalar_quantize_get(act);
}

void vec_dot_quantize_act(uint32_t wtype, const float *x, void *act, int64_t n)
{
    vec_dot_quantize_get(wtype, CPU_ISA_COUNT)(x, act, n);
}
