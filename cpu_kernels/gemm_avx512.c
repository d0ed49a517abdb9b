/* gemm_avx512: the gemm kernels with AVX-512 VNNI (contract and scheme in gemm.h).
 *
 * For each tile of 16 weight rows and each chunk of 256 elements (one Q4_K/Q6_K block, up to 8
 * Q8_0 blocks), the chunk is packed once: codes[k4] holds elements 4*k4 .. 4*k4+3 of the 16
 * rows as unsigned bytes (lane r = row r), plus per-lane scale vectors. Activation rows then
 * go through the chunk TOK at a time, each with its own int32 and float accumulators, and one
 * vpdpbusd per 4 elements against its 4 codes broadcast. Per-row results for the tile stay in
 * acc (one 16-float vector per activation row) across chunks and are stored at the end.
 */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "gemm.h"
#include "quant_blocks.h"
#include "vec_dot.h"

#define AI static inline __attribute__((always_inline))

#define LANES 16
#define CHUNK 256
#define K4 (CHUNK / 4) /* 4-element steps per chunk */
#define TOK 8          /* activation rows per register tile */
#define MAX_M 64       /* activation rows per pass over the weights (acc on the stack) */

/* Lane offsets of a tile's 16 rows from its first: rows past n_rows repeat the last row, so
 * every load stays inside the weights; their lanes are never stored. */
struct tile {
    const uint8_t *row[LANES];
    __m512i offs;
    __mmask16 live;
};

static void tile_init(struct tile *t, const uint8_t *w, size_t w_stride, int64_t n_rows)
{
    int32_t offs[LANES];
    for (int r = 0; r < LANES; r++) {
        int64_t rr = r < n_rows ? r : n_rows - 1;
        t->row[r] = w + (size_t)rr * w_stride;
        offs[r] = (int32_t)((size_t)rr * w_stride);
    }
    t->offs = _mm512_loadu_si512(offs);
    t->live = n_rows >= LANES ? (__mmask16)0xffff : (__mmask16)((1u << n_rows) - 1);
}

/* The dword at byte `at` of every row of the tile. */
AI __m512i tile_gather(const struct tile *t, size_t at)
{
    return _mm512_i32gather_epi32(t->offs, t->row[0] + at, 1);
}

/* x[i] lane j <- x[j] lane i (dwords). */
AI void transpose16(__m512i x[LANES])
{
    __m512i t[LANES], u[LANES];
    for (int i = 0; i < LANES; i += 2) {
        t[i] = _mm512_unpacklo_epi32(x[i], x[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(x[i], x[i + 1]);
    }
    /* per 128-bit lane L of u[4g + k]: rows 4g .. 4g+3 of column 4L + k */
    for (int g = 0; g < 4; g++) {
        u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int k = 0; k < 4; k++) {
        __m512i v0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x44);
        __m512i v1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xee);
        __m512i v2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x44);
        __m512i v3 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xee);
        x[k] = _mm512_shuffle_i32x4(v0, v2, 0x88);
        x[4 + k] = _mm512_shuffle_i32x4(v0, v2, 0xdd);
        x[8 + k] = _mm512_shuffle_i32x4(v1, v3, 0x88);
        x[12 + k] = _mm512_shuffle_i32x4(v1, v3, 0xdd);
    }
}

/* 64 bytes at byte `at` of every row, transposed: x[i] = bytes at + 4i .. at + 4i + 3. */
AI void load_transposed(const struct tile *t, size_t at, __m512i x[LANES])
{
    for (int r = 0; r < LANES; r++)
        x[r] = _mm512_loadu_si512(t->row[r] + at);
    transpose16(x);
}

AI __m512i bcast32(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* Byte k (0..3) of every dword, zero-extended. */
AI __m512i byte_of(__m512i x, int k)
{
    return _mm512_and_si512(_mm512_srli_epi32(x, 8 * k), _mm512_set1_epi32(0xff));
}

/* Byte k (0..3) of every dword, sign-extended. */
AI __m512i sbyte_of(__m512i x, int k)
{
    return _mm512_srai_epi32(_mm512_slli_epi32(x, 24 - 8 * k), 24);
}

/* acc[t] (16 floats each, rows of the tile) for m activation rows, stored to y. */
static void store_tile(const float *acc, int m, const struct tile *t, float *y, int64_t y_stride)
{
    for (int j = 0; j < m; j++)
        _mm512_mask_storeu_ps(y + (int64_t)j * y_stride, t->live, _mm512_load_ps(acc + 16 * j));
}

/* Runs the statements given over every tile of 16 rows and every pass of at most MAX_M activation
 * rows. */
#define GEMM_DRIVER(...)                                                                           \
    for (int64_t r0 = 0; r0 < n_rows; r0 += LANES) {                                               \
        struct tile t;                                                                             \
        tile_init(&t, (const uint8_t *)w + (size_t)r0 * w_stride, w_stride,                        \
                  n_rows - r0 < LANES ? n_rows - r0 : LANES);                                      \
        for (int j0 = 0; j0 < m; j0 += MAX_M) {                                                    \
            int mm = m - j0 < MAX_M ? m - j0 : MAX_M;                                              \
            float acc[MAX_M * LANES] __attribute__((aligned(64)));                                 \
            memset(acc, 0, sizeof(float) * LANES * (size_t)mm);                                    \
            __VA_ARGS__;                                                                           \
            store_tile(acc, mm, &t, y + (int64_t)j0 * y_stride + r0, y_stride);                    \
        }                                                                                          \
    }

/* Calls body(NT) with NT = nt as a constant (1..TOK), so the token loops unroll. */
#define FOR_NT(nt, body)                                                                           \
    switch (nt) {                                                                                  \
    case 1:                                                                                        \
        body(1);                                                                                   \
        break;                                                                                     \
    case 2:                                                                                        \
        body(2);                                                                                   \
        break;                                                                                     \
    case 3:                                                                                        \
        body(3);                                                                                   \
        break;                                                                                     \
    case 4:                                                                                        \
        body(4);                                                                                   \
        break;                                                                                     \
    case 5:                                                                                        \
        body(5);                                                                                   \
        break;                                                                                     \
    case 6:                                                                                        \
        body(6);                                                                                   \
        break;                                                                                     \
    case 7:                                                                                        \
        body(7);                                                                                   \
        break;                                                                                     \
    default:                                                                                       \
        body(8);                                                                                   \
        break;                                                                                     \
    }

/* ---- K-quants (Q8_K activations) ---- */

/* A packed chunk of one K-quant block: codes, the float scale of each sub-block, and the
 * offset term sum_i pairs[i] . (bsums[2i], bsums[2i + 1]) (vpdpwssd), times off_scale, taken
 * off the block's sum: Q4_K's mins (dmin * min of sub-block i, bsums of its 32 elements) and
 * Q6_K's +32 codes (32 * d * scale of each 16 elements). */
struct kq_pack {
    __m512i codes[K4];
    __m512 scale[16];
    __m512i pairs[8];
    __m512 off_scale;
};

/* Sub-blocks of k4_sub steps (8: 32 elements, 4: 16 elements) of one Q8_K block; nt
 * activation rows; acc[j] += d_j * (sum of scale * codes . a - off_scale * offset term). */
AI void kq_rows(const struct kq_pack *p, int k4_sub, const uint8_t *act, size_t act_stride,
                int64_t blk, float *acc, int nt)
{
    const struct block_q8_k *a[TOK];
    __m512i isum[TOK];
    __m512 sum[TOK];
    for (int j = 0; j < nt; j++) {
        a[j] = (const struct block_q8_k *)(act + (size_t)j * act_stride) + blk;
        sum[j] = _mm512_setzero_ps();
    }
    for (int sb = 0; sb < K4 / k4_sub; sb++) {
        for (int j = 0; j < nt; j++)
            isum[j] = _mm512_setzero_si512();
        for (int i = 0; i < k4_sub; i++) {
            const int k4 = k4_sub * sb + i;
            const __m512i c = p->codes[k4];
            for (int j = 0; j < nt; j++)
                isum[j] = _mm512_dpbusd_epi32(isum[j], c, bcast32(a[j]->qs + 4 * k4));
        }
        for (int j = 0; j < nt; j++)
            sum[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), p->scale[sb], sum[j]);
    }
    for (int j = 0; j < nt; j++) {
        __m512i off = _mm512_setzero_si512();
        for (int i = 0; i < 8; i++)
            off = _mm512_dpwssd_epi32(off, p->pairs[i], bcast32(&a[j]->bsums[2 * i]));
        sum[j] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(off), p->off_scale, sum[j]);
        _mm512_store_ps(acc + 16 * j, _mm512_fmadd_ps(sum[j], _mm512_set1_ps(a[j]->d),
                                                      _mm512_load_ps(acc + 16 * j)));
    }
}

/* Every tile and block of a K-quant matrix through pack and kq_rows. */
AI void kq_gemm(int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *act,
                size_t act_stride, int m, float *y, int64_t y_stride, int k4_sub,
                void (*pack)(const struct tile *, int64_t, struct kq_pack *))
{
    struct kq_pack p __attribute__((aligned(64)));
    const uint8_t *x = act;
#define KQ_ROWS(NT)                                                                                \
    kq_rows(&p, k4_sub, x + (size_t)(j0 + j) * act_stride, act_stride, blk, acc + 16 * j, NT)
    GEMM_DRIVER({
        for (int64_t blk = 0; blk < n / QK_K; blk++) {
            pack(&t, blk, &p);
            for (int j = 0; j < mm; j += TOK)
                FOR_NT(mm - j, KQ_ROWS);
        }
    })
#undef KQ_ROWS
}

/* Q4_K and Q5_K: codes as they are (Q5_K's 5th bit of element 32s + l is bit s of qh[l]);
 * scale = d * 6-bit scale per 32 elements, pairs = (min, min). The two formats share d, dmin
 * and scales at the start of the block. */
AI void k45_pack(const struct tile *t, int64_t blk, struct kq_pack *p, bool five)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), one = _mm512_set1_epi8(1);
    const size_t at = (size_t)blk * (five ? sizeof(struct block_q5_k) : sizeof(struct block_q4_k));
    const size_t qs_at = five ? offsetof(struct block_q5_k, qs) : offsetof(struct block_q4_k, qs);
    __m512i qh[LANES]; /* qh[b4]: qh bytes 4 b4 .. 4 b4 + 3 (the first 8 of a 64-byte load) */
    if (five)
        load_transposed(t, at + offsetof(struct block_q5_k, qh), qh);
    for (int half = 0; half < 2; half++) {
        __m512i x[LANES];
        load_transposed(t, at + qs_at + 64 * half, x);
        /* qs byte b of 32-byte chunk c: low nibble = element 64c + b, high = 64c + 32 + b */
        for (int i = 0; i < LANES; i++) {
            int c = 2 * half + i / 8, b4 = i % 8;
            __m512i lo = _mm512_and_si512(x[i], m4);
            __m512i hi = _mm512_and_si512(_mm512_srli_epi16(x[i], 4), m4);
            if (five) {
                __m512i h0 = _mm512_and_si512(_mm512_srli_epi16(qh[b4], 2 * c), one);
                __m512i h1 = _mm512_and_si512(_mm512_srli_epi16(qh[b4], 2 * c + 1), one);
                lo = _mm512_or_si512(lo, _mm512_slli_epi16(h0, 4));
                hi = _mm512_or_si512(hi, _mm512_slli_epi16(h1, 4));
            }
            p->codes[16 * c + b4] = lo;
            p->codes[16 * c + 8 + b4] = hi;
        }
    }
    __m512i dd = tile_gather(t, at);
    __m512i u0 = tile_gather(t, at + 4), u1 = tile_gather(t, at + 8), u2 = tile_gather(t, at + 12);
    __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
    p->off_scale = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
    /* vec_dot_k4_scales across lanes: sc 0..3, sc 4..7, mins 0..3, mins 4..7 */
    const __m512i m6 = _mm512_set1_epi32(0x3f3f3f3f), m2 = _mm512_set1_epi32(0x03030303),
                  m4w = _mm512_set1_epi32(0x0f0f0f0f);
    __m512i s[4];
    s[0] = _mm512_and_si512(u0, m6);
    s[1] = _mm512_or_si512(_mm512_and_si512(u2, m4w),
                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), m2), 4));
    s[2] = _mm512_and_si512(u1, m6);
    s[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m4w),
                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), m2), 4));
    for (int sb = 0; sb < 8; sb++) {
        p->scale[sb] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(byte_of(s[sb / 4], sb % 4)));
        __m512i mn = byte_of(s[2 + sb / 4], sb % 4);
        p->pairs[sb] = _mm512_or_si512(mn, _mm512_slli_epi32(mn, 16));
    }
}

static void q4_k_pack(const struct tile *t, int64_t blk, struct kq_pack *p)
{
    k45_pack(t, blk, p, false);
}

static void q5_k_pack(const struct tile *t, int64_t blk, struct kq_pack *p)
{
    k45_pack(t, blk, p, true);
}

static void gemm_q4_k(int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *act,
                      size_t act_stride, int m, float *y, int64_t y_stride)
{
    kq_gemm(n, w, w_stride, n_rows, act, act_stride, m, y, y_stride, 8, q4_k_pack);
}

static void gemm_q5_k(int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *act,
                      size_t act_stride, int m, float *y, int64_t y_stride)
{
    kq_gemm(n, w, w_stride, n_rows, act, act_stride, m, y, y_stride, 8, q5_k_pack);
}

/* Q6_K: 6-bit codes (value + 32); scale = d * scale per 16 elements, pairs = scales 2i, 2i+1. */
static void q6_k_pack(const struct tile *t, int64_t blk, struct kq_pack *p)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0f), hi2 = _mm512_set1_epi8(0x30);
    const size_t at = (size_t)blk * sizeof(struct block_q6_k);
    __m512i ql[2][LANES], qh[LANES];
    load_transposed(t, at + offsetof(struct block_q6_k, ql), ql[0]);
    load_transposed(t, at + offsetof(struct block_q6_k, ql) + 64, ql[1]);
    load_transposed(t, at + offsetof(struct block_q6_k, qh), qh);
    /* element 128h + 32s + l: low 4 bits from ql[64h + 32(s & 1) + l] (low nibble for s < 2),
     * high 2 bits (qh[32h + l] >> 2s) & 3 (vec_dot.c's dot_q6_k_scalar) */
    for (int h = 0; h < 2; h++)
        for (int l4 = 0; l4 < 8; l4++) {
            __m512i a = ql[h][l4], b = ql[h][l4 + 8], q = qh[8 * h + l4];
            __m512i lo[4] = {_mm512_and_si512(a, lo4), _mm512_and_si512(b, lo4),
                             _mm512_and_si512(_mm512_srli_epi16(a, 4), lo4),
                             _mm512_and_si512(_mm512_srli_epi16(b, 4), lo4)};
            __m512i hi[4] = {_mm512_slli_epi16(q, 4), _mm512_slli_epi16(q, 2), q,
                             _mm512_srli_epi16(q, 2)};
            for (int s = 0; s < 4; s++)
                p->codes[32 * h + 8 * s + l4] =
                    _mm512_or_si512(lo[s], _mm512_and_si512(hi[s], hi2));
        }
    /* scales[16] at 192, d at 208: the dword at 206 keeps the gather inside the block */
    __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(
        _mm512_srli_epi32(tile_gather(t, at + offsetof(struct block_q6_k, d) - 2), 16)));
    p->off_scale = _mm512_mul_ps(d, _mm512_set1_ps(32.0f));
    for (int k = 0; k < 4; k++) {
        __m512i sc = tile_gather(t, at + offsetof(struct block_q6_k, scales) + 4 * k);
        __m512i s8[4];
        for (int b = 0; b < 4; b++) {
            s8[b] = sbyte_of(sc, b);
            p->scale[4 * k + b] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(s8[b]));
        }
        for (int i = 0; i < 2; i++)
            p->pairs[2 * k + i] =
                _mm512_or_si512(_mm512_and_si512(s8[2 * i], _mm512_set1_epi32(0xffff)),
                                _mm512_slli_epi32(s8[2 * i + 1], 16));
    }
}

static void gemm_q6_k(int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *act,
                      size_t act_stride, int m, float *y, int64_t y_stride)
{
    kq_gemm(n, w, w_stride, n_rows, act, act_stride, m, y, y_stride, 4, q6_k_pack);
}

/* ---- Q8_0 ---- */

#define Q8_BLOCKS (CHUNK / QK_32) /* blocks per chunk */

struct q8_0_pack {
    __m512i codes[K4];
    __m512 d[Q8_BLOCKS];
};

/* Blocks [b0, b0 + nb) (nb <= Q8_BLOCKS) packed; a missing odd partner block is loaded as
 * a copy of the last one and never used. */
static void q8_0_pack(const struct tile *t, int64_t b0, int nb, struct q8_0_pack *p)
{
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int b = 0; b < nb; b += 2) {
        size_t at0 = (size_t)(b0 + b) * sizeof(struct block_q8_0) + offsetof(struct block_q8_0, qs);
        size_t at1 = b + 1 < nb ? at0 + sizeof(struct block_q8_0) : at0;
        __m512i x[LANES];
        for (int r = 0; r < LANES; r++)
            x[r] = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(t->row[r] + at0))),
                _mm256_loadu_si256((const __m256i *)(t->row[r] + at1)), 1);
        transpose16(x);
        for (int i = 0; i < LANES && b * 8 + i < nb * 8; i++)
            p->codes[b * 8 + i] = _mm512_xor_si512(x[i], flip);
    }
    for (int b = 0; b < nb; b++)
        p->d[b] = _mm512_cvtph_ps(
            _mm512_cvtepi32_epi16(tile_gather(t, (size_t)(b0 + b) * sizeof(struct block_q8_0))));
}

AI void q8_0_rows(const struct q8_0_pack *p, const uint8_t *act, size_t act_stride, int64_t n,
                  int64_t b0, int nb, float *acc, int nt)
{
    const struct block_q8_0 *a[TOK];
    const struct vec_dot_q8_0_extra *pa[TOK];
    __m512i isum[TOK];
    __m512 sum[TOK];
    for (int j = 0; j < nt; j++) {
        a[j] = (const struct block_q8_0 *)(act + (size_t)j * act_stride) + b0;
        pa[j] = vec_dot_q8_0_extras((void *)(act + (size_t)j * act_stride), n) + b0;
        sum[j] = _mm512_load_ps(acc + 16 * j);
    }
    for (int b = 0; b < nb; b++) {
        for (int j = 0; j < nt; j++)
            isum[j] = _mm512_set1_epi32(pa[j][b].off);
        for (int i = 0; i < 8; i++) {
            const __m512i c = p->codes[8 * b + i];
            for (int j = 0; j < nt; j++)
                isum[j] = _mm512_dpbusd_epi32(isum[j], c, bcast32(a[j][b].qs + 4 * i));
        }
        for (int j = 0; j < nt; j++)
            sum[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]),
                                     _mm512_mul_ps(p->d[b], _mm512_set1_ps(pa[j][b].d)), sum[j]);
    }
    for (int j = 0; j < nt; j++)
        _mm512_store_ps(acc + 16 * j, sum[j]);
}

static void gemm_q8_0(int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *act,
                      size_t act_stride, int m, float *y, int64_t y_stride)
{
    struct q8_0_pack p __attribute__((aligned(64)));
    const uint8_t *x = act;
    const int64_t n_blk = n / QK_32;
#define Q80_ROWS(NT)                                                                               \
    q8_0_rows(&p, x + (size_t)(j0 + j) * act_stride, act_stride, n, b0, nb, acc + 16 * j, NT)
    GEMM_DRIVER({
        for (int64_t b0 = 0; b0 < n_blk; b0 += Q8_BLOCKS) {
            int nb = n_blk - b0 < Q8_BLOCKS ? (int)(n_blk - b0) : Q8_BLOCKS;
            q8_0_pack(&t, b0, nb, &p);
            for (int j = 0; j < mm; j += TOK)
                FOR_NT(mm - j, Q80_ROWS);
        }
    })
#undef Q80_ROWS
}

gemm_fn gemm_avx512_get(uint32_t wtype)
{
    switch (wtype) {
    case QUANT_Q8_0:
        return gemm_q8_0;
    case QUANT_Q4_K:
        return gemm_q4_k;
    case QUANT_Q5_K:
        return gemm_q5_k;
    case QUANT_Q6_K:
        return gemm_q6_k;
    default:
        return NULL;
    }
}
