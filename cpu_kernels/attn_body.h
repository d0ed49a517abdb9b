/* attn_body: one unit of ops_attention (one query token against the keys it may see, for up
 * to ATTN_MAX_HEADS query heads that share a KV head), written once with GCC vector types and
 * compiled three times: by ops_cpu.c for any x86-64 and by ops_cpu_avx512.c with AVX-512, in
 * vectors of 16 floats, and by ops_cpu_avx2.c with AVX2 + FMA in vectors of 8 (ATTN_VEC).
 * Internal to those files.
 *
 * Keys go in blocks of ATTN_KEYS, which stay in L1 while every head of the unit uses them:
 * scores 4 keys at a time (one reduction of 4 dot products), the softmax weights with a vector
 * exp, then each head's weighted sum of the block's value rows with its vector pieces held
 * in registers; the online softmax rescales a head's sums once per block, when the block
 * raises its running maximum. A unit may cover a range of keys only and leave a partial
 * result (decode's key chunks, combined by ops_attention). */
#ifndef STRATA_ATTN_BODY_H
#define STRATA_ATTN_BODY_H

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "ops_cpu.h"

#define ATTN_MAX_HEADS 16
#define ATTN_KEYS 32
#define ATTN_TOKENS 8           /* query tokens of a prompt per attn_tokens call at most */
#define ATTN_TOKEN_FLOATS 16384 /* and their heads' sums: nt * nh * head_dim at most */

/* Floats per vector: 16 (one AVX-512 register; the default), or 8 where the including file
 * defines ATTN_VEC 8 (one AVX2 register). Tiles of scores cover ATTN_TILE_H heads x 4 keys,
 * sized to the 32 or 16 registers. */
#ifndef ATTN_VEC
#define ATTN_VEC 16
#endif
#if ATTN_VEC == 16
#define ATTN_TILE_H 4
#elif ATTN_VEC == 8
#define ATTN_TILE_H 2
#else
#error "ATTN_VEC must be 16 or 8"
#endif
typedef float attn_vf __attribute__((vector_size(4 * ATTN_VEC)));
typedef int attn_vi __attribute__((vector_size(4 * ATTN_VEC)));

/* Vectors pass between the static, inlined helpers below; GCC warns that without AVX-512 (or
 * AVX) such arguments use another calling convention, which cannot matter inside one file.
 * Off for the rest of the including file: GCC reports it when it emits the function, after
 * the header has ended. */
#pragma GCC diagnostic ignored "-Wpsabi"
#define ATTN_INLINE static inline __attribute__((always_inline))

/* The AVX-512 and AVX2 builds of attn_unit (ops_cpu_avx512.c, ops_cpu_avx2.c); call only when
 * cpu_isa_best() reaches that level. */
void ops_attn_unit_avx512(const struct ops_attn *a, int t, int h0, int nh, int j_begin, int j_end,
                          float *part, size_t part_stride);
void ops_attn_unit_avx2(const struct ops_attn *a, int t, int h0, int nh, int j_begin, int j_end,
                        float *part, size_t part_stride);
/* The same builds of attn_tokens. */
void ops_attn_tokens_avx512(const struct ops_attn *a, int t0, int nt, int h0, int nh);
void ops_attn_tokens_avx2(const struct ops_attn *a, int t0, int nt, int h0, int nh);

/* Unaligned moves between floats and a vector. */
#define ATTN_LOAD(v, p) memcpy(&(v), (p), sizeof(attn_vf))
#define ATTN_STORE(p, v) memcpy((p), &(v), sizeof(attn_vf))

/* The sum of v's lanes, halving: lanes l and l + w added for w = ATTN_VEC / 2, ..., 1. */
ATTN_INLINE float attn_hsum(attn_vf v)
{
#if ATTN_VEC == 16
    v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
#else
    v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
    v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5);
    v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6);
#endif
    return v[0];
}

/* x . y over n floats: ATTN_VEC lanes, summed by attn_hsum, then the tail. */
ATTN_INLINE float attn_dot(const float *x, const float *y, int n)
{
    attn_vf acc = {0}, vx, vy;
    int i = 0;
    for (; i + ATTN_VEC <= n; i += ATTN_VEC) {
        ATTN_LOAD(vx, x + i);
        ATTN_LOAD(vy, y + i);
        acc += vx * vy;
    }
    float s = 0.0f;
    for (; i < n; i++)
        s += x[i] * y[i];
    return attn_hsum(acc) + s;
}

/* Sums of each of a0..a3's lanes, in lanes ATTN_R4(0..3): halves, quarters, pairs. */
#define ATTN_R4(r) ((r) * (ATTN_VEC / 4))
ATTN_INLINE attn_vf attn_reduce4(attn_vf a0, attn_vf a1, attn_vf a2, attn_vf a3)
{
#if ATTN_VEC == 16
    /* [a0 lo + hi (8), a1 lo + hi (8)], the same for a2, a3 */
    attn_vf b01 =
        __builtin_shufflevector(a0, a1, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
        __builtin_shufflevector(a0, a1, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30,
                                31);
    attn_vf b23 =
        __builtin_shufflevector(a2, a3, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
        __builtin_shufflevector(a2, a3, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30,
                                31);
    /* 4 lanes per row: [a0 (4), a1 (4), a2 (4), a3 (4)] */
    attn_vf c = __builtin_shufflevector(b01, b23, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25,
                                        26, 27) +
                __builtin_shufflevector(b01, b23, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28,
                                        29, 30, 31);
    c += __builtin_shufflevector(c, c, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    c += __builtin_shufflevector(c, c, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
#else
    /* [a0 lo + hi (4), a1 lo + hi (4)], the same for a2, a3 */
    attn_vf b01 = __builtin_shufflevector(a0, a1, 0, 1, 2, 3, 8, 9, 10, 11) +
                  __builtin_shufflevector(a0, a1, 4, 5, 6, 7, 12, 13, 14, 15);
    attn_vf b23 = __builtin_shufflevector(a2, a3, 0, 1, 2, 3, 8, 9, 10, 11) +
                  __builtin_shufflevector(a2, a3, 4, 5, 6, 7, 12, 13, 14, 15);
    /* 2 lanes per row: [a0 (2), a1 (2), a2 (2), a3 (2)] */
    attn_vf c = __builtin_shufflevector(b01, b23, 0, 1, 4, 5, 8, 9, 12, 13) +
                __builtin_shufflevector(b01, b23, 2, 3, 6, 7, 10, 11, 14, 15);
    c += __builtin_shufflevector(c, c, 1, 0, 3, 2, 5, 4, 7, 6);
#endif
    return c;
}

/* The dots of x with 4 rows y(r) = y0 + r * y_stride, r < 4, over n floats, into out[4]:
 * ATTN_VEC lanes per row, reduced by attn_reduce4, plus the tail past the last vector. */
ATTN_INLINE void attn_dot4(const float *x, const float *y0, size_t y_stride, int n, float *out)
{
    attn_vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, vx, v;
    int i = 0;
    for (; i + ATTN_VEC <= n; i += ATTN_VEC) {
        ATTN_LOAD(vx, x + i);
        ATTN_LOAD(v, y0 + i);
        a0 += vx * v;
        ATTN_LOAD(v, y0 + y_stride + i);
        a1 += vx * v;
        ATTN_LOAD(v, y0 + 2 * y_stride + i);
        a2 += vx * v;
        ATTN_LOAD(v, y0 + 3 * y_stride + i);
        a3 += vx * v;
    }
    attn_vf c = attn_reduce4(a0, a1, a2, a3);
    for (int r = 0; r < 4; r++) {
        float t = 0.0f;
        for (int k = i; k < n; k++)
            t += x[k] * y0[r * y_stride + k];
        out[r] = c[ATTN_R4(r)] + t;
    }
}

/* attn_dot4 for ATTN_TILE_H query rows at once (x(h) = x0 + h * n): out[h][0..4) for each,
 * the same sums in the same order, with each row of y loaded once for all of them. */
ATTN_INLINE void attn_dot4_tile(const float *x0, const float *y0, size_t y_stride, int n,
                                float out[ATTN_TILE_H][4])
{
    attn_vf a[ATTN_TILE_H][4], vx[ATTN_TILE_H], vy[4];
    for (int h = 0; h < ATTN_TILE_H; h++)
        for (int r = 0; r < 4; r++)
            a[h][r] = (attn_vf){0};
    int i = 0;
    for (; i + ATTN_VEC <= n; i += ATTN_VEC) {
        for (int h = 0; h < ATTN_TILE_H; h++)
            ATTN_LOAD(vx[h], x0 + (size_t)h * n + i);
        for (int r = 0; r < 4; r++)
            ATTN_LOAD(vy[r], y0 + r * y_stride + i);
        for (int h = 0; h < ATTN_TILE_H; h++)
            for (int r = 0; r < 4; r++)
                a[h][r] += vx[h] * vy[r];
    }
    for (int h = 0; h < ATTN_TILE_H; h++) {
        attn_vf c = attn_reduce4(a[h][0], a[h][1], a[h][2], a[h][3]);
        for (int r = 0; r < 4; r++) {
            float t = 0.0f;
            for (int k = i; k < n; k++)
                t += x0[(size_t)h * n + k] * y0[r * y_stride + k];
            out[h][r] = c[ATTN_R4(r)] + t;
        }
    }
}

/* e^x in each lane, for x <= 0 (softmax weights): x = n ln2 + r with |r| <= ln2/2, e^r by
 * its Taylor series to r^7 (truncation under 1e-8 relative), times 2^n built in the exponent
 * bits. x below -87 gives e^-87 (1.6e-38) instead of a smaller number or 0. */
ATTN_INLINE attn_vf attn_exp(attn_vf x)
{
    const attn_vf lo = (attn_vf){0} - 87.0f, magic = (attn_vf){0} + 12582912.0f;
    attn_vi below = x < lo; /* all ones where x < lo */
    x = (attn_vf)(((attn_vi)lo & below) | ((attn_vi)x & ~below));
    attn_vf n = (x * 1.44269504f + magic) - magic; /* round to nearest */
    attn_vf r = x - n * 0.693145752f - n * 1.42860677e-6f;
    attn_vf p = (attn_vf){0} + (1.0f / 5040);
    p = p * r + (1.0f / 720);
    p = p * r + (1.0f / 120);
    p = p * r + (1.0f / 24);
    p = p * r + (1.0f / 6);
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    attn_vi e = (__builtin_convertvector(n, attn_vi) + 127) << 23;
    return p * (attn_vf)e;
}

/* One element past the last whole vector: y * c, then + p[j * p_stride] * v[j * v_stride] for
 * each j, fused where the CPU has FMA (as the vector code's adds are compiled): written out,
 * so that the result does not hang on which multiply the compiler chooses to fuse. */
ATTN_INLINE float attn_accumulate1(float y, float c, const float *p, int p_stride, const float *v,
                                   size_t v_stride, int nj)
{
#ifdef __FMA__
    if (nj < 1)
        return y * c;
    float t = __builtin_fmaf(y, c, v[0] * p[0]);
    for (int j = 1; j < nj; j++)
        t = __builtin_fmaf(v[j * v_stride], p[j * p_stride], t);
#else
    float t = y * c;
    for (int j = 0; j < nj; j++)
        t = t + v[j * v_stride] * p[j * p_stride];
#endif
    return t;
}

/* y = y * c + sum_j p[j] * v(j) over n floats, v(j) = v0 + j * v_stride, for j < nj: each
 * ATTN_VEC floats of y stay in a register across the block's keys (the value rows, read for every
 * head of the unit, stay in L1). */
ATTN_INLINE void attn_accumulate(float *y, float c, const float *p, const float *v0,
                                 size_t v_stride, int nj, int n)
{
    attn_vf vy, vx;
    int i = 0;
    for (; i + ATTN_VEC <= n; i += ATTN_VEC) {
        ATTN_LOAD(vy, y + i);
        vy = vy * c;
        for (int j = 0; j < nj; j++) {
            ATTN_LOAD(vx, v0 + j * v_stride + i);
            vy = vy + vx * p[j];
        }
        ATTN_STORE(y + i, vy);
    }
    for (; i < n; i++)
        y[i] = attn_accumulate1(y[i], c, p, 1, v0 + i, v_stride, nj);
}

/* attn_accumulate for 8 heads (y(h) = y0 + h * n, head h's weight of key j at
 * p[j * p_stride + h]), each vector of v read once for all 8: the same operations per element,
 * in the same order. */
ATTN_INLINE void attn_accumulate8(float *y0, const float *c, const float *p, int p_stride,
                                  const float *v0, size_t v_stride, int nj, int n)
{
    attn_vf vy[8], vx;
    int i = 0;
    for (; i + ATTN_VEC <= n; i += ATTN_VEC) {
        for (int h = 0; h < 8; h++) {
            ATTN_LOAD(vy[h], y0 + (size_t)h * n + i);
            vy[h] = vy[h] * c[h];
        }
        for (int j = 0; j < nj; j++) {
            ATTN_LOAD(vx, v0 + j * v_stride + i);
            for (int h = 0; h < 8; h++)
                vy[h] = vy[h] + vx * p[j * p_stride + h];
        }
        for (int h = 0; h < 8; h++)
            ATTN_STORE(y0 + (size_t)h * n + i, vy[h]);
    }
    for (int h = 0; h < 8; h++)
        for (int k = i; k < n; k++)
            y0[(size_t)h * n + k] = attn_accumulate1(y0[(size_t)h * n + k], c[h], p + h, p_stride,
                                                     v0 + k, v_stride, nj);
}

/* A unit's end: heads h0 .. h0+nh-1 with running maxima m, sums l and unnormalised sums acc
 * (hd floats a head) to part (attn_unit) or, divided, to the output. */
ATTN_INLINE void attn_unit_out(const struct ops_attn *a, int t, int h0, int nh, const float *m,
                               const float *l, const float *acc, float *part, size_t part_stride)
{
    const int hd = a->head_dim;
    if (part) {
        for (int h = 0; h < nh; h++) {
            float *ph = part + (size_t)h * part_stride;
            ph[0] = m[h];
            ph[1] = l[h];
            memcpy(ph + 2, acc + (size_t)h * hd, sizeof(float) * (size_t)hd);
        }
        return;
    }
    float *o = a->out + ((size_t)t * a->n_head + h0) * hd;
    for (int h = 0; h < nh; h++) {
        float den = l[h] + (a->sinks ? expf(a->sinks[h0 + h] - m[h]) : 0.0f);
        for (int i = 0; i < hd; i++)
            o[(size_t)h * hd + i] = acc[(size_t)h * hd + i] / den;
    }
}

/* Asks for the key and value rows of the block after the one at j0 (keys j0 + ATTN_KEYS up to
 * j_end) of KV head kvh, a request per 64 bytes, while this block is computed. A block's rows
 * lie a whole KV row apart (every KV head's floats between them), a pattern the hardware's
 * prefetchers do not follow within a block: without these requests each pass over a block's
 * rows waited on their misses (single thread, 4096 keys from L3: 3.2-3.5 ms a layer against
 * 1.9-2.2 with them; in L2, 5% slower). */
ATTN_INLINE void attn_prefetch_next(const struct ops_attn *a, int kvh, int j0, int j_end)
{
    const int hd = a->head_dim, kvw = a->n_head_kv * hd, jn = j0 + ATTN_KEYS;
    const int n = j_end - jn < ATTN_KEYS ? j_end - jn : ATTN_KEYS;
    const size_t off = (size_t)jn * kvw + (size_t)kvh * hd;
    for (int r = 0; r < n; r++)
        for (int i = 0; i < hd; i += 64 / (int)sizeof(float)) {
            __builtin_prefetch(a->k_cache + off + (size_t)r * kvw + i, 0, 3);
            __builtin_prefetch(a->v_cache + off + (size_t)r * kvw + i, 0, 3);
        }
}

/* The scaled scores of a block of nj keys from k0 (a KV row apart) for heads h < nh of the
 * queries at q: head h's score of key j to s[h * sh + j * sj]. */
ATTN_INLINE void attn_block_scores(const struct ops_attn *a, const float *q, const float *k0,
                                   int nh, int nj, float *s, int sh, int sj)
{
    const int hd = a->head_dim, kvw = a->n_head_kv * hd;
    int j = 0;
    for (; j + 4 <= nj; j += 4) {
        int h = 0;
        for (; h + ATTN_TILE_H <= nh; h += ATTN_TILE_H) {
            float d[ATTN_TILE_H][4];
            attn_dot4_tile(q + (size_t)h * hd, k0 + (size_t)j * kvw, kvw, hd, d);
            for (int hh = 0; hh < ATTN_TILE_H; hh++)
                for (int r = 0; r < 4; r++)
                    s[(h + hh) * sh + (j + r) * sj] = d[hh][r] * a->scale;
        }
        for (; h < nh; h++) {
            float d[4];
            attn_dot4(q + (size_t)h * hd, k0 + (size_t)j * kvw, kvw, hd, d);
            for (int r = 0; r < 4; r++)
                s[h * sh + (j + r) * sj] = d[r] * a->scale;
        }
    }
    for (; j < nj; j++)
        for (int h = 0; h < nh; h++)
            s[h * sh + j * sj] = attn_dot(q + (size_t)h * hd, k0 + (size_t)j * kvw, hd) * a->scale;
}

/* The online softmax's step over a block of nj keys for nh heads, nh a multiple of 8 (the
 * models here whose query heads share a KV head in eights or sixteens: the 30b-a3b and
 * 235b-a22b shapes, gpt-oss, Qwen3-Next), with the scores kept key by key (head h of key j at
 * s[j * nh + h]): the running maxima m, their rescaling c and the sums l of 8 heads take one
 * vector operation per key instead of a chain of dependent scalar operations per head. Each
 * head's max, exp and sum are the same operations in the same order as the scalar step in
 * attn_unit, so the results are the same bits. */
ATTN_INLINE void attn_softmax_wide(float *s, int nh, int nj, float *m, float *l, float *c)
{
    typedef float v8 __attribute__((vector_size(32)));
    typedef int v8i __attribute__((vector_size(32)));
    float bm[2 * ATTN_MAX_HEADS]; /* the new maxima, twice over */
    for (int g = 0; g < nh / 8; g++) {
        v8 b, mg, x;
        memcpy(&mg, m + 8 * g, sizeof(mg));
        b = mg;
        for (int j = 0; j < nj; j++) {
            memcpy(&x, s + j * nh + 8 * g, sizeof(x));
            v8i up = x > b; /* where the key raises the maximum; never for a NaN */
            b = (v8)(((v8i)x & up) | ((v8i)b & ~up));
        }
        for (int h = 0; h < 8; h++)
            c[8 * g + h] = b[h] > mg[h] ? expf(mg[h] - b[h]) : 1.0f;
        memcpy(m + 8 * g, &b, sizeof(b));
        memcpy(bm + 8 * g, &b, sizeof(b));
        memcpy(bm + nh + 8 * g, &b, sizeof(b));
    }
    /* lane i of the vector at s + i0 is head (i0 + i) % nh */
    for (int i = 0; i < ATTN_KEYS * nh; i += ATTN_VEC) {
        attn_vf v, b;
        ATTN_LOAD(v, s + i);
        ATTN_LOAD(b, bm + i % nh);
        v = attn_exp(v - b);
        ATTN_STORE(s + i, v);
    }
    for (int g = 0; g < nh / 8; g++) {
        v8 lg, x;
        memcpy(&lg, l + 8 * g, sizeof(lg));
        memcpy(&x, c + 8 * g, sizeof(x));
        lg *= x;
        for (int j = 0; j < nj; j++) {
            memcpy(&x, s + j * nh + 8 * g, sizeof(x));
            lg += x;
        }
        memcpy(l + 8 * g, &lg, sizeof(lg));
    }
}

/* One block of nj keys from j0 for the query rows at q (heads h < nh of one token, KV head
 * kvh): their scores into s, the online softmax's step on the running maxima m and sums l, the
 * weighted values added into acc (hd floats a head). s holds ATTN_MAX_HEADS x ATTN_KEYS floats;
 * its lanes past nj go through attn_exp unused. */
ATTN_INLINE void attn_block(const struct ops_attn *a, const float *q, int kvh, int nh, int j0,
                            int nj, float *s, float *m, float *l, float *acc)
{
    float c[ATTN_MAX_HEADS];
    const int hd = a->head_dim, kvw = a->n_head_kv * hd;
    const float *k0 = a->k_cache + (size_t)j0 * kvw + (size_t)kvh * hd;
    const float *v0 = a->v_cache + (size_t)j0 * kvw + (size_t)kvh * hd;
    /* scores key by key (attn_softmax_wide) where the heads come in eights, else head by head */
    if (nh % 8 == 0) {
        attn_block_scores(a, q, k0, nh, nj, s, 1, nh);
        attn_softmax_wide(s, nh, nj, m, l, c);
        for (int h = 0; h < nh; h += 8)
            attn_accumulate8(acc + (size_t)h * hd, c + h, s + h, nh, v0, kvw, nj, hd);
        return;
    }
    attn_block_scores(a, q, k0, nh, nj, s, ATTN_KEYS, 1);
    for (int h = 0; h < nh; h++) {
        float *sh = s + h * ATTN_KEYS, bm = m[h];
        for (int j = 0; j < nj; j++)
            bm = sh[j] > bm ? sh[j] : bm;
        c[h] = bm > m[h] ? expf(m[h] - bm) : 1.0f;
        l[h] *= c[h];
        m[h] = bm;
        for (int j = 0; j < ATTN_KEYS; j += ATTN_VEC) {
            attn_vf v;
            ATTN_LOAD(v, sh + j);
            v = attn_exp(v - bm);
            ATTN_STORE(sh + j, v);
        }
        for (int j = 0; j < nj; j++)
            l[h] += sh[j];
        attn_accumulate(acc + (size_t)h * hd, c[h], sh, v0, kvw, nj, hd);
    }
}

/* Query token t, heads h0 .. h0+nh-1 (nh <= ATTN_MAX_HEADS, one KV head), keys
 * [j_begin, j_end) (j_end <= pos0 + t + 1). part NULL: the keys are all the token sees, and
 * the output goes to a->out (the sink's term added to the denominator). Else the unnormalised partial result goes to part: for head h,
 * part + h * part_stride = [running max m, sum l, acc (head_dim)], m = -inf and l = 0 for no
 * keys (ops_attention combines the parts). */
static void attn_unit(const struct ops_attn *a, int t, int h0, int nh, int j_begin, int j_end,
                      float *part, size_t part_stride)
{
    float acc[ATTN_MAX_HEADS * OPS_MAX_HEAD_DIM];
    float s[ATTN_MAX_HEADS * ATTN_KEYS] __attribute__((aligned(64)));
    float m[ATTN_MAX_HEADS], l[ATTN_MAX_HEADS];
    const int hd = a->head_dim, kvh = h0 / (a->n_head / a->n_head_kv);
    const float *q = a->q + ((size_t)t * a->n_head + h0) * hd;

    for (int h = 0; h < nh; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
    }
    memset(acc, 0, sizeof(float) * (size_t)nh * hd);
    memset(s, 0, sizeof(s));
    for (int j0 = j_begin; j0 < j_end; j0 += ATTN_KEYS) {
        attn_prefetch_next(a, kvh, j0, j_end);
        attn_block(a, q, kvh, nh, j0, j_end - j0 < ATTN_KEYS ? j_end - j0 : ATTN_KEYS, s, m, l,
                   acc);
    }
    attn_unit_out(a, t, h0, nh, m, l, acc, part, part_stride);
}

/* attn_unit for nt consecutive query tokens t0 .. t0+nt-1 of a prompt without a window (each
 * token's keys 0 .. pos0 + t), nt <= ATTN_TOKENS and nt * nh * head_dim <= ATTN_TOKEN_FLOATS:
 * key block by key block, every token that sees the block takes its step while the block's
 * rows are in cache, instead of each token reading every key and value row from L2 or L3
 * again. Each token's blocks, and the operations in each, are attn_unit's: the same bits. */
static void attn_tokens(const struct ops_attn *a, int t0, int nt, int h0, int nh)
{
    float acc[ATTN_TOKEN_FLOATS];
    float s[ATTN_MAX_HEADS * ATTN_KEYS] __attribute__((aligned(64)));
    float m[ATTN_TOKENS][ATTN_MAX_HEADS], l[ATTN_TOKENS][ATTN_MAX_HEADS];
    const int hd = a->head_dim, kvh = h0 / (a->n_head / a->n_head_kv);
    const int end = a->pos0 + t0 + nt; /* the last token's keys end here */

    for (int i = 0; i < nt; i++)
        for (int h = 0; h < nh; h++) {
            m[i][h] = -INFINITY;
            l[i][h] = 0.0f;
        }
    memset(acc, 0, sizeof(float) * (size_t)nt * nh * hd);
    memset(s, 0, sizeof(s));
    for (int j0 = 0; j0 < end; j0 += ATTN_KEYS) {
        attn_prefetch_next(a, kvh, j0, end);
        for (int i = 0; i < nt; i++) {
            const int j_end = a->pos0 + t0 + i + 1;
            if (j0 >= j_end)
                continue;
            attn_block(a, a->q + ((size_t)(t0 + i) * a->n_head + h0) * hd, kvh, nh, j0,
                       j_end - j0 < ATTN_KEYS ? j_end - j0 : ATTN_KEYS, s, m[i], l[i],
                       acc + (size_t)i * nh * hd);
        }
    }
    for (int i = 0; i < nt; i++)
        attn_unit_out(a, t0 + i, h0, nh, m[i], l[i], acc + (size_t)i * nh * hd, NULL, 0);
}

#endif
