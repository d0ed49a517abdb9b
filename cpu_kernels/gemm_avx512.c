/* gemm_avx512: the gemm kernels with AVX-512 VNNI (contract and scheme in gemm.h).
 *
 * For each tile of 16 weight rows and each chunk (one Q4_K/Q6_K block of 256 elements, up to 16
 * Q8_0 blocks), the chunk is packed once: codes[k4] holds elements 4*k4 .. 4*k4+3 of the 16
 * rows as unsigned bytes (lane r = row r), plus per-lane scale vectors. Activation rows then
 * go through the chunk TOK at a time, each with its own int32 accumulators, and one vpdpbusd
 * per 4 elements against its 4 codes broadcast. Each block's integer sums then go into the
 * float accumulators of its activation row (a few 16-float vectors in acc, kept across chunks)
 * exactly as vec_dot adds them, and the accumulators are combined as vec_dot combines them
 * when the tile is stored.
 */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "gemm.h"
#include "quant_blocks.h"
#include "vec_dot.h"

#define AI static inline __attribute__((always_inline))

#define LANES 16
#define CHUNK 512 /* elements per packed Q8_0 chunk */
#define TOK 8     /* activation rows per register tile */
#define MAX_M 64  /* activation rows per pass over the weights (acc on the stack) */
#define GEMM_MAX_ACC 4 /* Q8_0's accumulators per output (K-quants: 2) */

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

/* Outputs v (lane r: row r of the tile) to y, the tile's rows only. */
AI void store_tile(__m512 v, const struct tile *t, float *y)
{
    _mm512_mask_storeu_ps(y, t->live, v);
}

/* The f16 in the low half of every dword, as floats. */
AI __m512 f16_low(__m512i x)
{
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(x));
}

#define VI __m512i
#define VF __m512
#define V_AND _mm512_and_si512
#define V_OR _mm512_or_si512
#define V_SRLI16 _mm512_srli_epi16
#define V_SLLI16 _mm512_slli_epi16
#define V_SRLI32 _mm512_srli_epi32
#define V_SLLI32 _mm512_slli_epi32
#define V_SRAI32 _mm512_srai_epi32
#define V_SET1_8(x) _mm512_set1_epi8((char)(x))
#define V_SET1_32 _mm512_set1_epi32
#define V_SET1_F _mm512_set1_ps
#define V_SETZERO_I _mm512_setzero_si512
#define V_SETZERO_F _mm512_setzero_ps
#define V_CVT _mm512_cvtepi32_ps
#define V_MUL _mm512_mul_ps
#define V_SUB_F _mm512_sub_ps
#define V_SUB32 _mm512_sub_epi32
#define V_FMADD _mm512_fmadd_ps
#define V_LOAD_F _mm512_load_ps
#define V_STORE_F _mm512_store_ps
#define SCALE(x) (x)
#define SB_START(s) _mm512_setzero_si512()
#define DOT2(t, c0, a0, c1, a1, sc)                                                                \
    _mm512_dpbusd_epi32(_mm512_dpbusd_epi32((t), (c0), (a0)), (c1), (a1))
#define SB_END(s, t, sc) _mm512_add_epi32((s), _mm512_mullo_epi32((t), (sc)))
#define PAIRS(s, p, b) _mm512_dpwssd_epi32((s), (p), (b))

#include "gemm_body.h"

/* ---- Q8_0 ---- */

#define Q8_BLOCKS (CHUNK / QK_32) /* blocks per chunk */
#define Q8_ACC VEC_DOT_Q8_0_ACC   /* accumulators per output, vec_dot.h */
_Static_assert(Q8_BLOCKS % Q8_ACC == 0 && Q8_ACC <= GEMM_MAX_ACC, "Q8_0 accumulators");

struct q8_0_pack {
    __m512i codes[CHUNK / 4];
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

/* Blocks [b0, b0 + nb) of nt activation rows, each with Q8_ACC accumulators at
 * acc + Q8_ACC * 16 * j. As in vec_dot.h: block b's exact integer dot, times d_w * d_a, is
 * added by one FMA to accumulator b % Q8_ACC (b0 is a multiple of Q8_ACC), which holds 0
 * before the first chunk. Each accumulator's blocks in turn, so one register per row (the
 * chunk of 16 blocks makes that 4 blocks per load and store of an accumulator). */
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
    }
    for (int k = 0; k < Q8_ACC && k < nb; k++) {
        for (int j = 0; j < nt; j++)
            sum[j] = b0 ? _mm512_load_ps(acc + 16 * (Q8_ACC * j + k)) : _mm512_setzero_ps();
        for (int b = k; b < nb; b += Q8_ACC) {
            for (int j = 0; j < nt; j++)
                isum[j] = _mm512_set1_epi32(pa[j][b].off);
            for (int i = 0; i < 8; i++) {
                const __m512i c = p->codes[8 * b + i];
                for (int j = 0; j < nt; j++)
                    isum[j] = _mm512_dpbusd_epi32(isum[j], c, bcast32(a[j][b].qs + 4 * i));
            }
            for (int j = 0; j < nt; j++)
                sum[j] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]),
                                    _mm512_mul_ps(p->d[b], _mm512_set1_ps(pa[j][b].d)), sum[j]);
        }
        for (int j = 0; j < nt; j++)
            _mm512_store_ps(acc + 16 * (Q8_ACC * j + k), sum[j]);
    }
}

/* Output row j of a Q8_0 tile from its accumulators at p: (acc[0] + acc[1]) + (acc[2] +
 * acc[3]), those no block reached (rows of fewer than 4 blocks: n_blk of gemm_q8_0) being 0. */
_Static_assert(Q8_ACC == 4, "Q8_FINISH combines four accumulators");
#define Q8_ACC_AT(p, k) ((k) < n_blk ? _mm512_load_ps((p) + 16 * (k)) : _mm512_setzero_ps())
#define Q8_FINISH(p)                                                                               \
    _mm512_add_ps(_mm512_add_ps(Q8_ACC_AT(p, 0), Q8_ACC_AT(p, 1)),                                 \
                  _mm512_add_ps(Q8_ACC_AT(p, 2), Q8_ACC_AT(p, 3)))

static void gemm_q8_0(int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *act,
                      size_t act_stride, int m, float *y, int64_t y_stride)
{
    struct q8_0_pack p __attribute__((aligned(64)));
    const uint8_t *x = act;
    const int64_t n_blk = n / QK_32;
#define Q80_ROWS(NT)                                                                               \
    q8_0_rows(&p, x + (size_t)(j0 + j) * act_stride, act_stride, n, b0, nb, acc + Q8_ACC * 16 * j, \
              NT)
    GEMM_DRIVER(Q8_ACC, Q8_FINISH, {
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
    return wtype == QUANT_Q8_0 ? gemm_q8_0 : kq_get(wtype);
}
