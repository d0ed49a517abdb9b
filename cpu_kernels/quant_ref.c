/* quant_ref: scalar reference (de)quantizers (contracts in quant_ref.h, layouts in
 * docs/formats.md and quant_blocks.h).
 *
 * Dequantizers are the numerical definition of each format and match gguf-py's numpy
 * dequantizers bit for bit. Numpy rounds every array operation to float32 separately, so the code
 * below performs the same operations in the same order: first the per-sub-block factor (d*sc,
 * dmin*m), then factor*q, then the subtraction of the min term. The order shows in the sign of
 * zero ((d*sc)*0 is -0 when d*sc < 0, d*(sc*0) is not) and, for Q6_K, in the last bit: d*sc*q
 * can need 25 significant bits there (f16 d, int8 sc, 6-bit q). The other products are exact in
 * float32, which also makes the results independent of FMA contraction. Contraction is switched
 * off for the whole file anyway so that the quantizers' output does not depend on the build
 * (-march=native).
 *
 * Quantizers are plain and unhurried: Q8_0/Q4_0/MXFP4 follow the formulas in docs/formats.md; the
 * K-quants search a scale (and min) per sub-block over a few candidate grids, refitting each by
 * weighted least squares, then encode those scales relative to the super-block's f16 factors
 * and pick every level against the decoded factors, so that the stored levels are the best ones
 * for what dequantization actually computes.
 *
 * Blocks are copied in and out with memcpy: block data inside a GGUF row need not be aligned
 * for the struct, and building each block in a zeroed local guarantees every byte is written.
 */
#include "quant_ref.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "fp16.h"

/* Every float operation below rounds separately (see the top comment). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* E2M1 code -> value, doubled so that every entry is an integer (docs/formats.md, MXFP4). */
static const int8_t mxfp4_doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* Nearest integer (halves away from zero), clamped to [lo, hi]; NaN gives lo. */
static int round_clamp(float v, int lo, int hi)
{
    if (!(v > (float)lo))
        return lo;
    if (v >= (float)hi)
        return hi;
    return (int)lroundf(v);
}

/* ---- dequantizers (one block each) ------------------------------------------------------- */

static void dequant_f32(const uint8_t *src, float *y)
{
    memcpy(y, src, sizeof(float));
}

static void dequant_f16(const uint8_t *src, float *y)
{
    uint16_t h;
    memcpy(&h, src, 2);
    y[0] = fp16_to_f32(h);
}

static void dequant_bf16(const uint8_t *src, float *y)
{
    uint16_t h;
    memcpy(&h, src, 2);
    y[0] = bf16_to_f32(h);
}

static void dequant_q8_0(const uint8_t *src, float *y)
{
    struct block_q8_0 b;
    memcpy(&b, src, sizeof b);
    float d = fp16_to_f32(b.d);
    for (int i = 0; i < QK_32; i++)
        y[i] = (float)b.qs[i] * d;
}

static void dequant_q4_0(const uint8_t *src, float *y)
{
    struct block_q4_0 b;
    memcpy(&b, src, sizeof b);
    float d = fp16_to_f32(b.d);
    for (int j = 0; j < QK_32 / 2; j++) {
        y[j] = d * (float)((b.qs[j] & 0xF) - 8);
        y[j + QK_32 / 2] = d * (float)((b.qs[j] >> 4) - 8);
    }
}

/* 2^(e - 128): half the E8M0 scale, so that value = mxfp4_doubled[code] * half. Built from the
 * bit pattern; e = 0 and 1 give the float32 subnormals 2^-128 and 2^-127. */
static float mxfp4_half_scale(uint8_t e)
{
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return fp16_bits_to_f32_raw(bits);
}

static void dequant_mxfp4(const uint8_t *src, float *y)
{
    struct block_mxfp4 b;
    memcpy(&b, src, sizeof b);
    float d = mxfp4_half_scale(b.e);
    for (int j = 0; j < QK_32 / 2; j++) {
        y[j] = d * (float)mxfp4_doubled[b.qs[j] & 0xF];
        y[j + QK_32 / 2] = d * (float)mxfp4_doubled[b.qs[j] >> 4];
    }
}

/* Q2_K: 16 sub-blocks of 16. Element i = 128h + 32s + l holds bits 2s..2s+1 of qs[32h + l];
 * scales[i/16] has the 4-bit scale in its low nibble and the 4-bit min in its high nibble. */
static void dequant_q2_k(const uint8_t *src, float *y)
{
    struct block_q2_k b;
    memcpy(&b, src, sizeof b);
    float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
    for (int i = 0; i < QK_K; i++) {
        int h = i / 128, s = (i / 32) % 4, l = i % 32;
        int q = (b.qs[32 * h + l] >> (2 * s)) & 3;
        float dl = d * (float)(b.scales[i / 16] & 0xF);
        float ml = dmin * (float)(b.scales[i / 16] >> 4);
        y[i] = dl * (float)q - ml;
    }
}

/* Q3_K 6-bit scale of sub-block i (0..15), bias removed: low 4 bits from scales[0..7] (low
 * nibbles for i < 8, high nibbles for i >= 8), high 2 bits from scales[8 + i%4] at bit 2*(i/4). */
static int q3_k_scale(const uint8_t *scales, int i)
{
    int lo = i < 8 ? scales[i] & 0xF : scales[i - 8] >> 4;
    int hi = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (lo | hi << 4) - 32;
}

/* Q3_K: element i = 128h + 32s + l: low 2 bits are bits 2s..2s+1 of qs[32h + l]; bit (i/32) of
 * hmask[l] set means q = low, clear means q = low - 4. */
static void dequant_q3_k(const uint8_t *src, float *y)
{
    struct block_q3_k b;
    memcpy(&b, src, sizeof b);
    float d = fp16_to_f32(b.d);
    for (int i = 0; i < QK_K; i++) {
        int h = i / 128, s = (i / 32) % 4, l = i % 32;
        int low = (b.qs[32 * h + l] >> (2 * s)) & 3;
        int high_set = (b.hmask[l] >> (i / 32)) & 1;
        float dl = d * (float)q3_k_scale(b.scales, i / 16);
        y[i] = dl * (float)(low - (high_set ? 0 : 4));
    }
}

/* 6-bit scale and min of sub-block j (0..7) of Q4_K/Q5_K (docs/formats.md, K-quants). */
static void k4_scale_min_get(const uint8_t *q, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* The inverse of k4_scale_min_get for all 8 sub-blocks (values 0..63). */
static void k4_scale_min_set(uint8_t *q, const uint8_t *sc, const uint8_t *m)
{
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        q[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
        q[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | (m[j + 4] & 0xF) << 4);
    }
}

/* Low 4 bits of element i of Q4_K/Q5_K: sub-block j = i/32 lives in qs[32*(j/2) + i%32], low
 * nibble for even j, high nibble for odd j. */
static int k4_nibble_index(int i)
{
    return 32 * (i / 64) + i % 32;
}

static int k4_nibble_shift(int i)
{
    return 4 * ((i / 32) % 2);
}

static void dequant_q4_k(const uint8_t *src, float *y)
{
    struct block_q4_k b;
    memcpy(&b, src, sizeof b);
    float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
    for (int j = 0; j < QK_K / 32; j++) {
        int sc, m;
        k4_scale_min_get(b.scales, j, &sc, &m);
        float dl = d * (float)sc, ml = dmin * (float)m;
        for (int i = 32 * j; i < 32 * j + 32; i++) {
            int q = (b.qs[k4_nibble_index(i)] >> k4_nibble_shift(i)) & 0xF;
            y[i] = dl * (float)q - ml;
        }
    }
}

/* Q5_K: Q4_K's nibbles plus a 5th bit, bit j of qh[i % 32] for element i of sub-block j. */
static void dequant_q5_k(const uint8_t *src, float *y)
{
    struct block_q5_k b;
    memcpy(&b, src, sizeof b);
    float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
    for (int j = 0; j < QK_K / 32; j++) {
        int sc, m;
        k4_scale_min_get(b.scales, j, &sc, &m);
        float dl = d * (float)sc, ml = dmin * (float)m;
        for (int i = 32 * j; i < 32 * j + 32; i++) {
            int q = (b.qs[k4_nibble_index(i)] >> k4_nibble_shift(i)) & 0xF;
            q |= ((b.qh[i % 32] >> j) & 1) << 4;
            y[i] = dl * (float)q - ml;
        }
    }
}

/* Q6_K bit positions of element i = 128h + 32s + l: the low 4 bits are in ql[64h + 32(s%2) + l]
 * (low nibble for s < 2, high nibble for s >= 2), the high 2 bits are bits 2s..2s+1 of
 * qh[32h + l]. */
static int q6_k_ql_index(int i)
{
    return 64 * (i / 128) + 32 * ((i / 32) % 2) + i % 32;
}

static int q6_k_ql_shift(int i)
{
    return 4 * (((i / 32) % 4) / 2);
}

static int q6_k_qh_index(int i)
{
    return 32 * (i / 128) + i % 32;
}

static int q6_k_qh_shift(int i)
{
    return 2 * ((i / 32) % 4);
}

static void dequant_q6_k(const uint8_t *src, float *y)
{
    struct block_q6_k b;
    memcpy(&b, src, sizeof b);
    float d = fp16_to_f32(b.d);
    for (int i = 0; i < QK_K; i++) {
        int low = (b.ql[q6_k_ql_index(i)] >> q6_k_ql_shift(i)) & 0xF;
        int high = (b.qh[q6_k_qh_index(i)] >> q6_k_qh_shift(i)) & 3;
        float dl = d * (float)b.scales[i / 16];
        y[i] = dl * (float)((low | high << 4) - 32);
    }
}

/* ---- quantizers (one block each) --------------------------------------------------------- */

static void quant_f32(const float *x, uint8_t *dst)
{
    memcpy(dst, x, sizeof(float));
}

static void quant_f16(const float *x, uint8_t *dst)
{
    uint16_t h = fp16_from_f32(x[0]);
    memcpy(dst, &h, 2);
}

static void quant_bf16(const float *x, uint8_t *dst)
{
    uint16_t h = bf16_from_f32(x[0]);
    memcpy(dst, &h, 2);
}

static float abs_max(const float *x, int n)
{
    float amax = 0;
    for (int i = 0; i < n; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    return amax;
}

/* d = max|x| / 127, q = round(x / d) with halves away from zero; 1/d is taken before d is
 * rounded to f16, as ggml does. */
static void quant_q8_0(const float *x, uint8_t *dst)
{
    struct block_q8_0 b;
    memset(&b, 0, sizeof b);
    float d = abs_max(x, QK_32) / 127.0f;
    float id = d != 0 ? 1.0f / d : 0.0f;
    b.d = fp16_from_f32(d);
    for (int i = 0; i < QK_32; i++)
        b.qs[i] = (int8_t)round_clamp(x[i] * id, -127, 127);
    memcpy(dst, &b, sizeof b);
}

/* The element of largest magnitude gets level -8 (d = it / -8), so the block spends its extra
 * negative level on its extreme; q = trunc(x/d + 8.5), at most 15. */
static void quant_q4_0(const float *x, uint8_t *dst)
{
    struct block_q4_0 b;
    memset(&b, 0, sizeof b);
    float vmax = 0;
    for (int i = 0; i < QK_32; i++)
        if (fabsf(x[i]) > fabsf(vmax))
            vmax = x[i];
    float d = vmax / -8.0f;
    float id = d != 0 ? 1.0f / d : 0.0f;
    b.d = fp16_from_f32(d);
    for (int j = 0; j < QK_32 / 2; j++) {
        int lo = round_clamp(floorf(x[j] * id + 8.5f), 0, 15);
        int hi = round_clamp(floorf(x[j + QK_32 / 2] * id + 8.5f), 0, 15);
        b.qs[j] = (uint8_t)(lo | hi << 4);
    }
    memcpy(dst, &b, sizeof b);
}

/* e = floor(log2(max|x|)) - 2 + 127 (exactly, from the binary exponent), so max|x| / 2^(e-127)
 * lies in [4, 8); then each element takes the nearest E2M1 value (the first code on a tie). */
static void quant_mxfp4(const float *x, uint8_t *dst)
{
    struct block_mxfp4 b;
    memset(&b, 0, sizeof b);
    float amax = abs_max(x, QK_32);
    int e = 0;
    if (amax > 0) {
        int exp2;
        frexpf(amax, &exp2); /* amax = m * 2^exp2, m in [0.5, 1) */
        e = exp2 - 1 - 2 + 127;
        e = e < 0 ? 0 : e > 254 ? 254 : e;
    }
    b.e = (uint8_t)e;
    float d = mxfp4_half_scale(b.e);
    for (int i = 0; i < QK_32; i++) {
        int best = 0;
        float best_err = INFINITY;
        for (int c = 0; c < 16; c++) {
            float err = fabsf(d * (float)mxfp4_doubled[c] - x[i]);
            if (err < best_err) {
                best_err = err;
                best = c;
            }
        }
        if (i < QK_32 / 2)
            b.qs[i] = (uint8_t)best;
        else
            b.qs[i - QK_32 / 2] |= (uint8_t)(best << 4);
    }
    memcpy(dst, &b, sizeof b);
}

/* Importance of each element in the K-quant fits: the sub-block's RMS plus |x|, which favours
 * large weights without ignoring small ones. */
static void kq_weights(const float *x, int n, float *w)
{
    float sum2 = 0;
    for (int i = 0; i < n; i++)
        sum2 += x[i] * x[i];
    float rms = sqrtf(sum2 / (float)n);
    for (int i = 0; i < n; i++)
        w[i] = rms + fabsf(x[i]);
}

/* An affine sub-block code y = scale*L - min with L in 0..nmax, scale >= 0, min >= 0 (the
 * format can only subtract). */
struct kq_affine {
    float scale;
    float min;
};

/* Weighted squared error of x against the affine code with each level chosen nearest. */
static float kq_affine_err(const float *x, const float *w, int n, int nmax, struct kq_affine f)
{
    float err = 0;
    for (int i = 0; i < n; i++) {
        int l = f.scale > 0 ? round_clamp((x[i] + f.min) / f.scale, 0, nmax) : 0;
        float diff = f.scale * (float)l - f.min - x[i];
        err += w[i] * diff * diff;
    }
    return err;
}

/* Searches the affine code for one sub-block. Candidate k assigns levels on a grid of
 * (nmax + rmin + k*rstep) steps across [min(x, 0), max(x)], then refits scale and min to those
 * levels by weighted least squares; the plain min/max grid is the starting point. */
static struct kq_affine kq_fit_affine(const float *x, const float *w, int n, int nmax, float rmin,
                                      float rstep, int nstep)
{
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    if (lo > 0)
        lo = 0;
    if (hi == lo)
        return (struct kq_affine){0, -lo};

    struct kq_affine best = {(hi - lo) / (float)nmax, -lo};
    float best_err = kq_affine_err(x, w, n, nmax, best);
    for (int k = 0; k <= nstep; k++) {
        float iscale = ((float)nmax + rmin + rstep * (float)k) / (hi - lo);
        float sw = 0, sl = 0, sl2 = 0, sx = 0, slx = 0;
        for (int i = 0; i < n; i++) {
            float l = (float)round_clamp(iscale * (x[i] - lo), 0, nmax);
            sw += w[i];
            sl += w[i] * l;
            sl2 += w[i] * l * l;
            sx += w[i] * x[i];
            slx += w[i] * l * x[i];
        }
        float det = sw * sl2 - sl * sl;
        if (!(det > 0))
            continue;
        /* minimise sum w (scale*l + offset - x)^2; the format needs offset <= 0 */
        float scale = (sw * slx - sx * sl) / det;
        float offset = (sl2 * sx - sl * slx) / det;
        if (offset > 0) {
            offset = 0;
            scale = slx / sl2;
        }
        if (!(scale > 0))
            continue;
        struct kq_affine cand = {scale, -offset};
        float err = kq_affine_err(x, w, n, nmax, cand);
        if (err < best_err) {
            best_err = err;
            best = cand;
        }
    }
    return best;
}

/* Best code for a sub-block when the scale is zero: the constant -min nearest the weighted
 * mean of x that the format can express (min >= 0). */
static struct kq_affine kq_fit_constant(const float *x, const float *w, int n)
{
    float sw = 0, swx = 0;
    for (int i = 0; i < n; i++) {
        sw += w[i];
        swx += w[i] * x[i];
    }
    float mean = sw > 0 ? swx / sw : 0;
    return (struct kq_affine){0, mean < 0 ? -mean : 0};
}

/* Shared by Q4_K and Q5_K: fits the 8 sub-blocks, encodes scales and mins as 6-bit multiples
 * of the f16 factors d and dmin, and returns the levels (0..nmax) chosen against the decoded
 * factors in L[256]. The 6-bit values are taken relative to the decoded d and dmin, not to the
 * exact maxima, because for small blocks the f16 rounding of d is coarse (subnormal). If d
 * rounds to zero the sub-blocks can only hold constants, and are refitted as such before dmin
 * is chosen: the affine mins alone would then shift every value without a scale to undo it. */
static void kq_encode_affine(const float *x, int nmax, float rmin, float rstep, int nstep,
                             f16_bits *d_out, f16_bits *dmin_out, uint8_t *scales, uint8_t *L)
{
    struct kq_affine fit[QK_K / 32];
    float w[QK_K / 32][32], max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        kq_weights(x + 32 * j, 32, w[j]);
        fit[j] = kq_fit_affine(x + 32 * j, w[j], 32, nmax, rmin, rstep, nstep);
        max_scale = fmaxf(max_scale, fit[j].scale);
    }
    *d_out = fp16_from_f32(max_scale / 63.0f);
    float d = fp16_to_f32(*d_out);
    for (int j = 0; j < QK_K / 32; j++) {
        if (d == 0)
            fit[j] = kq_fit_constant(x + 32 * j, w[j], 32);
        max_min = fmaxf(max_min, fit[j].min);
    }
    *dmin_out = fp16_from_f32(max_min / 63.0f);
    float dmin = fp16_to_f32(*dmin_out);

    uint8_t sc[QK_K / 32], m[QK_K / 32];
    for (int j = 0; j < QK_K / 32; j++) {
        sc[j] = (uint8_t)(d > 0 ? round_clamp(fit[j].scale / d, 0, 63) : 0);
        m[j] = (uint8_t)(dmin > 0 ? round_clamp(fit[j].min / dmin, 0, 63) : 0);
    }
    k4_scale_min_set(scales, sc, m);

    for (int j = 0; j < QK_K / 32; j++) {
        float dl = d * (float)sc[j], ml = dmin * (float)m[j];
        for (int i = 32 * j; i < 32 * j + 32; i++)
            L[i] = (uint8_t)(dl > 0 ? round_clamp((x[i] + ml) / dl, 0, nmax) : 0);
    }
}

static void quant_q4_k(const float *x, uint8_t *dst)
{
    struct block_q4_k b;
    uint8_t L[QK_K];
    memset(&b, 0, sizeof b);
    kq_encode_affine(x, 15, -1.0f, 0.1f, 20, &b.d, &b.dmin, b.scales, L);
    for (int i = 0; i < QK_K; i++)
        b.qs[k4_nibble_index(i)] |= (uint8_t)(L[i] << k4_nibble_shift(i));
    memcpy(dst, &b, sizeof b);
}

static void quant_q5_k(const float *x, uint8_t *dst)
{
    struct block_q5_k b;
    uint8_t L[QK_K];
    memset(&b, 0, sizeof b);
    kq_encode_affine(x, 31, -0.5f, 0.1f, 15, &b.d, &b.dmin, b.scales, L);
    for (int i = 0; i < QK_K; i++) {
        b.qs[k4_nibble_index(i)] |= (uint8_t)((L[i] & 0xF) << k4_nibble_shift(i));
        b.qh[i % 32] |= (uint8_t)((L[i] >> 4) << (i / 32));
    }
    memcpy(dst, &b, sizeof b);
}

/* Weighted squared error of x against scale*L with L in -nmax..nmax-1 chosen nearest. */
static float kq_symmetric_err(const float *x, const float *w, int n, int nmax, float scale)
{
    float err = 0;
    for (int i = 0; i < n; i++) {
        int l = scale != 0 ? round_clamp(x[i] / scale, -nmax, nmax - 1) : 0;
        float diff = scale * (float)l - x[i];
        err += w[i] * diff * diff;
    }
    return err;
}

/* Searches a signed scale for x ~ scale*L, L in -nmax..nmax-1. The element of largest
 * magnitude is aimed at level -nmax (the side with the extra level) on grids stretched by
 * k/10 levels, k = -9..9; each grid's levels are refitted by weighted least squares. */
static float kq_fit_symmetric(const float *x, const float *w, int n, int nmax)
{
    float vmax = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > fabsf(vmax))
            vmax = x[i];
    if (vmax == 0)
        return 0;

    float best = -vmax / (float)nmax;
    float best_err = kq_symmetric_err(x, w, n, nmax, best);
    for (int k = -9; k <= 9; k++) {
        float iscale = -((float)nmax + 0.1f * (float)k) / vmax;
        float slx = 0, sl2 = 0;
        for (int i = 0; i < n; i++) {
            float l = (float)round_clamp(iscale * x[i], -nmax, nmax - 1);
            slx += w[i] * l * x[i];
            sl2 += w[i] * l * l;
        }
        if (!(sl2 > 0))
            continue;
        float scale = slx / sl2;
        float err = kq_symmetric_err(x, w, n, nmax, scale);
        if (err < best_err) {
            best_err = err;
            best = scale;
        }
    }
    return best;
}

/* Q6_K: a signed scale per 16 elements, encoded as int8 multiples of the decoded f16 d, where
 * the largest magnitude scale maps to -128; levels are then chosen against the decoded d*scale. */
static void quant_q6_k(const float *x, uint8_t *dst)
{
    struct block_q6_k b;
    memset(&b, 0, sizeof b);
    float scale[QK_K / 16], w[16], smax = 0;
    for (int j = 0; j < QK_K / 16; j++) {
        kq_weights(x + 16 * j, 16, w);
        scale[j] = kq_fit_symmetric(x + 16 * j, w, 16, 32);
        if (fabsf(scale[j]) > fabsf(smax))
            smax = scale[j];
    }
    b.d = fp16_from_f32(smax / -128.0f);
    float d = fp16_to_f32(b.d);
    for (int j = 0; j < QK_K / 16; j++)
        b.scales[j] = (int8_t)(d != 0 ? round_clamp(scale[j] / d, -128, 127) : 0);

    for (int i = 0; i < QK_K; i++) {
        float dl = d * (float)b.scales[i / 16];
        int q = dl != 0 ? round_clamp(x[i] / dl, -32, 31) + 32 : 32;
        b.ql[q6_k_ql_index(i)] |= (uint8_t)((q & 0xF) << q6_k_ql_shift(i));
        b.qh[q6_k_qh_index(i)] |= (uint8_t)((q >> 4) << q6_k_qh_shift(i));
    }
    memcpy(dst, &b, sizeof b);
}

/* ---- dispatch ---------------------------------------------------------------------------- */

struct quant_ref_format {
    uint32_t type;
    uint32_t block; /* elements per block */
    uint32_t bytes; /* bytes per block */
    void (*dequantize)(const uint8_t *src, float *y);
    void (*quantize)(const float *x, uint8_t *dst); /* NULL: no reference quantizer */
};

static const struct quant_ref_format formats[] = {
    {QUANT_F32, 1, 4, dequant_f32, quant_f32},
    {QUANT_F16, 1, 2, dequant_f16, quant_f16},
    {QUANT_BF16, 1, 2, dequant_bf16, quant_bf16},
    {QUANT_Q8_0, QK_32, sizeof(struct block_q8_0), dequant_q8_0, quant_q8_0},
    {QUANT_Q4_0, QK_32, sizeof(struct block_q4_0), dequant_q4_0, quant_q4_0},
    {QUANT_MXFP4, QK_32, sizeof(struct block_mxfp4), dequant_mxfp4, quant_mxfp4},
    {QUANT_Q2_K, QK_K, sizeof(struct block_q2_k), dequant_q2_k, NULL},
    {QUANT_Q3_K, QK_K, sizeof(struct block_q3_k), dequant_q3_k, NULL},
    {QUANT_Q4_K, QK_K, sizeof(struct block_q4_k), dequant_q4_k, quant_q4_k},
    {QUANT_Q5_K, QK_K, sizeof(struct block_q5_k), dequant_q5_k, quant_q5_k},
    {QUANT_Q6_K, QK_K, sizeof(struct block_q6_k), dequant_q6_k, quant_q6_k},
};

static const struct quant_ref_format *format_find(uint32_t type)
{
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (formats[i].type == type)
            return &formats[i];
    return NULL;
}

bool quant_ref_can_dequantize(uint32_t type)
{
    return format_find(type) != NULL;
}

bool quant_ref_can_quantize(uint32_t type)
{
    const struct quant_ref_format *f = format_find(type);
    return f && f->quantize;
}

int quant_ref_dequantize(uint32_t type, const void *src, float *dst, int64_t n)
{
    const struct quant_ref_format *f = format_find(type);
    if (!f || n < 0 || n % f->block)
        return -EINVAL;
    const uint8_t *s = src;
    for (int64_t b = 0; b < n / f->block; b++)
        f->dequantize(s + b * f->bytes, dst + b * f->block);
    return 0;
}

int quant_ref_quantize(uint32_t type, const float *src, void *dst, int64_t n)
{
    const struct quant_ref_format *f = format_find(type);
    if (!f || !f->quantize || n < 0 || n % f->block)
        return -EINVAL;
    uint8_t *d = dst;
    for (int64_t b = 0; b < n / f->block; b++)
        f->quantize(src + b * f->block, d + b * f->bytes);
    return 0;
}
