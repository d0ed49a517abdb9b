/* gen draw: random quantized blocks drawn directly as codes and scales.
 *
 * Codes are uniform over their range; scales are chosen from the second moments below so that
 * the dequantized values have the requested std, and mins (Q4_K/Q5_K) cancel the code mean of
 * each sub-block, so that the values have mean ~0. Block layouts: docs/formats.md §2.
 *
 *   format  codes q           code variance       sub-block scale        super-block scale d
 *   Q8_0    -127..127         (255^2 - 1)/12      -                      std·u/sqrt(E q² E u²),
 *                                                                          u ~ U[.5, 1.5)
 *   Q4_K    0..15 (mean 7.5)  (16^2 - 1)/12       sc 32..63, min m = sc  std/sqrt(21.25 E sc²),
 *                                                                          dmin = 7.5 d
 *   Q5_K    0..31 (mean 15.5) (32^2 - 1)/12       sc 32..63, min m = sc  std/sqrt(85.25 E sc²),
 *                                                                          dmin = 15.5 d
 *   Q6_K    -32..31           341.25 (+0.25 mean²) ±(64..127)           std/sqrt(341.5 E sc²)
 *   MXFP4   E2M1, 16 codes    68.5/8 (mean 0)      -                      2^(e-127), e random
 *                                                                          between two powers
 *
 * Q6_K has no min; its codes have mean -0.5, and the random sign of each sub-block's scale
 * makes the tensor mean 0 (a sub-block's own mean is off by 0.5/18.5 of its std).
 */
#include <math.h>
#include <string.h>

#include "errors.h"
#include "fp16.h"
#include "gen.h"
#include "quant.h"

/* Second moments of the scale distributions above. */
#define SC_K_MOMENT2 (47.5 * 47.5 + (32.0 * 32.0 - 1.0) / 12.0)  /* sc uniform on 32..63 */
#define SC_Q6_MOMENT2 (95.5 * 95.5 + (64.0 * 64.0 - 1.0) / 12.0) /* |sc| uniform on 64..127 */
#define Q8_CODE_MOMENT2 ((255.0 * 255.0 - 1.0) / 12.0)
#define Q8_U_MOMENT2 (1.0 + 1.0 / 12.0) /* u uniform on [0.5, 1.5) */

static void fill_random(struct rng *r, uint8_t *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x = rng_u64(r);
        memcpy(p + i, &x, 8);
    }
    if (i < n) {
        uint64_t x = rng_u64(r);
        memcpy(p + i, &x, n - i);
    }
}

static void draw_q8_0(struct block_q8_0 *b, float std, struct rng *r)
{
    float u = rng_uniform(r, 0.5f, 1.5f);

    b->d = fp16_from_f32((float)(std * u / sqrt(Q8_CODE_MOMENT2 * Q8_U_MOMENT2)));
    fill_random(r, (uint8_t *)b->qs, sizeof(b->qs));
    /* -128 is outside the reference quantizer's range: redraw it (uniform on -127..127). */
    for (int i = 0; i < QK_32; i++) {
        while (b->qs[i] == -128)
            b->qs[i] = (int8_t)rng_u64(r);
    }
}

/* Eight 6-bit sub-block scales, each in 32..63, from one 64-bit draw (5 random bits each). */
static void draw_k_scales(uint8_t sc[8], struct rng *r)
{
    uint64_t x = rng_u64(r);
    for (int s = 0; s < 8; s++)
        sc[s] = (uint8_t)(32 + ((x >> (5 * s)) & 31));
}

/* Packs 8 scales and 8 mins (6 bits each) into the 12-byte K-quant layout (docs/formats.md §2.4, Q4_K and Q5_K scales). */
static void pack_k_scales(uint8_t out[K_SCALE_SIZE], const uint8_t sc[8], const uint8_t m[8])
{
    for (int j = 0; j < 4; j++) {
        out[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        out[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
        out[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}

/* d and dmin of a K-quant super-block whose codes have variance code_var and mean code_mean;
 * with m = sc, dmin·m = code_mean·d·sc cancels the code mean of every sub-block. */
static void draw_k_super(f16_bits *d, f16_bits *dmin, uint8_t scales[K_SCALE_SIZE], float std,
                         double code_var, double code_mean, struct rng *r)
{
    uint8_t sc[8];

    draw_k_scales(sc, r);
    *d = fp16_from_f32((float)(std / sqrt(code_var * SC_K_MOMENT2)));
    *dmin = fp16_from_f32((float)(code_mean * fp16_to_f32(*d)));
    pack_k_scales(scales, sc, sc);
}

static void draw_q4_k(struct block_q4_k *b, float std, struct rng *r)
{
    draw_k_super(&b->d, &b->dmin, b->scales, std, (16.0 * 16.0 - 1.0) / 12.0, 7.5, r);
    fill_random(r, b->qs, sizeof(b->qs));
}

static void draw_q5_k(struct block_q5_k *b, float std, struct rng *r)
{
    draw_k_super(&b->d, &b->dmin, b->scales, std, (32.0 * 32.0 - 1.0) / 12.0, 15.5, r);
    fill_random(r, b->qh, sizeof(b->qh));
    fill_random(r, b->qs, sizeof(b->qs));
}

static void draw_q6_k(struct block_q6_k *b, float std, struct rng *r)
{
    uint64_t x = rng_u64(r), signs = rng_u64(r);

    fill_random(r, b->ql, sizeof(b->ql));
    fill_random(r, b->qh, sizeof(b->qh));
    for (int s = 0; s < QK_K / 16; s++) {
        if (s == 10)
            x = rng_u64(r); /* ten 6-bit fields per draw */
        int mag = 64 + (int)((x >> (6 * (s % 10))) & 63);
        b->scales[s] = (int8_t)((signs >> s) & 1 ? -mag : mag);
    }
    b->d = fp16_from_f32((float)(std / sqrt((341.25 + 0.25) * SC_Q6_MOMENT2)));
}

/* MXFP4: codes uniform over the 16 E2M1 values (mean 0, second moment MXFP4_CODE_MOMENT2); the
 * scale is a power of two, so the block takes 2^a or 2^(a+1) around the wanted scale t with the
 * probability that makes the mean squared scale t². */
#define MXFP4_CODE_MOMENT2 (68.5 / 8.0) /* (0 + .25 + 1 + 2.25 + 4 + 9 + 16 + 36) / 8 */

static void draw_mxfp4(struct block_mxfp4 *b, float std, struct rng *r)
{
    double t = std / sqrt(MXFP4_CODE_MOMENT2), a = floor(log2(t));
    double p = (t * t / exp2(2.0 * a) - 1.0) / 3.0; /* (1-p) 4^a + p 4^(a+1) = t² */
    int e = (int)a + 127 + (rng_f32(r) < p);

    b->e = (uint8_t)(e < 1 ? 1 : e > 254 ? 254 : e);
    fill_random(r, b->qs, sizeof(b->qs));
}

bool gen_blocks_can_draw(uint32_t type)
{
    switch (type) {
    case QUANT_F32:
    case QUANT_Q8_0:
    case QUANT_Q4_K:
    case QUANT_Q5_K:
    case QUANT_Q6_K:
    case QUANT_MXFP4:
        return true;
    default:
        return false;
    }
}

int gen_blocks_draw(uint32_t type, void *dst, uint64_t n, float mean, float std, struct rng *r)
{
    const struct quant_type_info *t = quant_type_find(type);

    if (!t || !gen_blocks_can_draw(type))
        return err_set(-EINVAL, "gen: cannot draw tensor type %s", quant_type_name(type));
    if (n % t->block)
        return err_set(-EINVAL, "gen: %llu values are not a multiple of the %s block (%u)",
                       (unsigned long long)n, t->name, t->block);
    if (type != QUANT_F32 && mean != 0.0f)
        return err_set(-EINVAL, "gen: %s values are drawn with mean 0, not %g", t->name,
                       (double)mean);

    uint64_t nb = n / t->block;
    switch (type) {
    case QUANT_F32: {
        float *y = dst;
        for (uint64_t i = 0; i < n; i++)
            y[i] = mean + std * rng_normal(r);
        break;
    }
    case QUANT_Q8_0:
        for (uint64_t i = 0; i < nb; i++)
            draw_q8_0((struct block_q8_0 *)dst + i, std, r);
        break;
    case QUANT_Q4_K:
        for (uint64_t i = 0; i < nb; i++)
            draw_q4_k((struct block_q4_k *)dst + i, std, r);
        break;
    case QUANT_Q5_K:
        for (uint64_t i = 0; i < nb; i++)
            draw_q5_k((struct block_q5_k *)dst + i, std, r);
        break;
    case QUANT_Q6_K:
        for (uint64_t i = 0; i < nb; i++)
            draw_q6_k((struct block_q6_k *)dst + i, std, r);
        break;
    case QUANT_MXFP4:
        for (uint64_t i = 0; i < nb; i++)
            draw_mxfp4((struct block_mxfp4 *)dst + i, std, r);
        break;
    }
    return 0;
}
