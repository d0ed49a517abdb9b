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
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "gemm.h"
#include "quant_blocks.h"
#include "vec_dot.h"

#ifdef GEMM_AMX_EMU
/* The test build (tests/gemm_amx_emu.c) defines AMX_TILE_* in C and renames what this file
 * exports. */
#define GEMM_EXPORT(name) name##_emu
#else
#define GEMM_EXPORT(name) name
/* The compiler's tileloadd and ldtilecfg do not declare the memory they read (ldtilecfg: the
 * configuration's first 8 bytes only), so a compiler barrier before each makes the stores
 * they depend on (the packs, the whole configuration) happen first. */
#define AMX_BARRIER() __asm__ volatile("" ::: "memory")
#define AMX_TILE_CFG(cfg)                                                                          \
    do {                                                                                           \
        AMX_BARRIER();                                                                             \
        _tile_loadconfig(cfg);                                                                     \
    } while (0)
#define AMX_TILE_RELEASE() _tile_release()
#define AMX_TILE_ZERO(t) _tile_zero(t)
#define AMX_TILE_LOAD(t, base, stride)                                                             \
    do {                                                                                           \
        AMX_BARRIER();                                                                             \
        _tile_loadd(t, base, stride);                                                              \
    } while (0)
#define AMX_TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define AMX_TILE_DPBSUD(c, a, b) _tile_dpbsud(c, a, b) /* a: signed bytes, b: unsigned */
#endif

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

/* Blocks [b0, b0 + nb) (nb <= Q8_BLOCKS) of Q8_0, MXFP4 or Q4_0 weights (wt) as vec_dot's
 * AVX-512 kernel of that type takes them (MXFP4: the doubled E2M1 values and half the block
 * scales; Q4_0: the nibbles - 8), packed; a missing odd partner block is loaded as a copy of the
 * last one and never used. */
AI void q8_0_pack(const struct tile *t, int64_t b0, int nb, struct q8_0_pack *p, uint32_t wt)
{
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const size_t bs = wt == QUANT_MXFP4  ? sizeof(struct block_mxfp4)
                      : wt == QUANT_Q4_0 ? sizeof(struct block_q4_0)
                                         : sizeof(struct block_q8_0);
    const size_t qs = wt == QUANT_MXFP4  ? offsetof(struct block_mxfp4, qs)
                      : wt == QUANT_Q4_0 ? offsetof(struct block_q4_0, qs)
                                         : offsetof(struct block_q8_0, qs);
    for (int b = 0; b < nb; b += 2) {
        size_t at0 = (size_t)(b0 + b) * bs + qs;
        size_t at1 = b + 1 < nb ? at0 + bs : at0;
        __m512i x[LANES];
        for (int r = 0; r < LANES; r++) {
            const uint8_t *q0 = t->row[r] + at0, *q1 = t->row[r] + at1;
            if (wt == QUANT_MXFP4)
                x[r] = vec_dot_mxfp4_values(vec_dot_nibbles_pair(q0, q1));
            else if (wt == QUANT_Q4_0)
                x[r] = _mm512_sub_epi8(vec_dot_nibbles_pair(q0, q1), _mm512_set1_epi8(8));
            else
                x[r] = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)q0)),
                    _mm256_loadu_si256((const __m256i *)q1), 1);
        }
        transpose16(x);
        for (int i = 0; i < LANES && b * 8 + i < nb * 8; i++)
            p->codes[b * 8 + i] = _mm512_xor_si512(x[i], flip);
    }
    for (int b = 0; b < nb; b++) {
        __m512i g = tile_gather(t, (size_t)(b0 + b) * bs);
        p->d[b] =
            wt == QUANT_MXFP4 ? vec_dot_e8m0_half16(g) : _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
    }
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

/* q8_0_rows for 16 activation rows by another route (the AMX tiles below). */
typedef void (*q8_0_rows16_fn)(const struct q8_0_pack *p, const uint8_t *act, size_t act_stride,
                               int64_t n, int64_t b0, int nb, float *acc);

/* Every tile and chunk of a Q8_0 matrix through q8_0_pack and q8_0_rows; with rows16, groups
 * of 16 activation rows through it, the rest through q8_0_rows. */
AI void q8_0_gemm(int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *act,
                  size_t act_stride, int m, float *y, int64_t y_stride, uint32_t wt,
                  q8_0_rows16_fn rows16)
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
            q8_0_pack(&t, b0, nb, &p, wt);
            int j = 0;
            for (; rows16 && j + 16 <= mm; j += 16)
                rows16(&p, x + (size_t)(j0 + j) * act_stride, act_stride, n, b0, nb,
                       acc + Q8_ACC * 16 * j);
            for (; j < mm; j += TOK)
                FOR_NT(mm - j, Q80_ROWS);
        }
    })
#undef Q80_ROWS
}

/* The 32-element block kernels around q8_0_gemm (rows16: NULL, or the AMX rows). */
#define Q8W_KERNEL(name, wt, rows16, cfg, release)                                                 \
    static void name(int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *act,   \
                     size_t act_stride, int m, float *y, int64_t y_stride)                         \
    {                                                                                              \
        cfg;                                                                                       \
        q8_0_gemm(n, w, w_stride, n_rows, act, act_stride, m, y, y_stride, wt, rows16);            \
        release;                                                                                   \
    }
Q8W_KERNEL(gemm_q8_0, QUANT_Q8_0, NULL, (void)0, (void)0)
Q8W_KERNEL(gemm_mxfp4, QUANT_MXFP4, NULL, (void)0, (void)0)
Q8W_KERNEL(gemm_q4_0, QUANT_Q4_0, NULL, (void)0, (void)0)

gemm_fn GEMM_EXPORT(gemm_avx512_get)(uint32_t wtype)
{
    return wtype == QUANT_Q8_0    ? gemm_q8_0
           : wtype == QUANT_MXFP4 ? gemm_mxfp4
           : wtype == QUANT_Q4_0  ? gemm_q4_0
                                  : kq_get(wtype);
}

/* ---- AMX: the integer sums by int8 tiles ----
 *
 * The same packs and the same float arithmetic as above, with each sub-block's integer dots
 * (Q8_0: each block's) for 16 activation rows x 16 weight rows made by one tdpbsud: tile A
 * holds the 16 activation rows' signed codes of the sub-block (read in place, act_stride
 * apart), tile B the packed codes, which are already in the instruction's layout (row k4 =
 * elements 4 k4 .. 4 k4 + 3 of the 16 weight rows), and tile C the 16 x 16 int32 dots, stored
 * to memory and taken from there as the VNNI kernels take their registers. The integers are
 * exact either way, so every output is the VNNI kernel's, bit for bit. Activation rows left
 * over from groups of 16 go through the VNNI rows.
 *
 * Tiles: 0 and 1 C, 4 and 5 A, 6 and 7 B (two sub-blocks in flight). */

struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* The tiles for sub-blocks of k4_sub 4-element steps (Q4_K, Q5_K, Q8_0: 8; Q6_K: 4). */
static void amx_config(int k4_sub)
{
    struct amx_cfg c __attribute__((aligned(64)));
    memset(&c, 0, sizeof(c));
    c.palette = 1;
    for (int t = 0; t < 2; t++) /* C: 16 activation rows x 16 int32 dots */
        c.rows[t] = 16, c.colsb[t] = 64;
    for (int t = 4; t < 6; t++) /* A: 16 activation rows x the sub-block's codes */
        c.rows[t] = 16, c.colsb[t] = (uint16_t)(4 * k4_sub);
    for (int t = 6; t < 8; t++) /* B: k4_sub steps x 16 weight rows x 4 codes */
        c.rows[t] = (uint8_t)k4_sub, c.colsb[t] = 64;
    AMX_TILE_CFG(&c);
}

/* Sub-blocks s and s + 1: c[s], c[s + 1] = the dots of 16 activation rows (a_at(s): the first
 * row's codes of sub-block s, act_stride apart) with the 16 weight rows of codes b_at(s). */
#define AMX_PAIR(c, s, a_at, b_at, act_stride)                                                     \
    do {                                                                                           \
        AMX_TILE_LOAD(4, a_at(s), (act_stride));                                                   \
        AMX_TILE_LOAD(6, b_at(s), 64);                                                             \
        AMX_TILE_LOAD(5, a_at((s) + 1), (act_stride));                                             \
        AMX_TILE_LOAD(7, b_at((s) + 1), 64);                                                       \
        AMX_TILE_ZERO(0);                                                                          \
        AMX_TILE_ZERO(1);                                                                          \
        AMX_TILE_DPBSUD(0, 4, 6);                                                                  \
        AMX_TILE_DPBSUD(1, 5, 7);                                                                  \
        AMX_TILE_STORE(0, (c)[s], 64);                                                             \
        AMX_TILE_STORE(1, (c)[(s) + 1], 64);                                                       \
    } while (0)

#define AMX_ROWS 16 /* activation rows per tile product (the rows16 of the drivers) */

/* kq_rows for 16 activation rows (act: the first, act_stride apart), block blk. */
AI void kq_rows_amx(const struct kq_pack *p, int k4_sub, const uint8_t *act, size_t act_stride,
                    int64_t blk, float *acc)
{
    const int nsb = K4 / k4_sub;
    int32_t c[QK_K / 16][AMX_ROWS * LANES] __attribute__((aligned(64)));
    const uint8_t *a0 =
        act + (size_t)blk * sizeof(struct block_q8_k) + offsetof(struct block_q8_k, qs);
#define KQ_A_AT(s) (a0 + 4 * k4_sub * (s))
#define KQ_B_AT(s) ((const void *)&p->codes[k4_sub * (s)])
    for (int s = 0; s < nsb; s += 2)
        AMX_PAIR(c, s, KQ_A_AT, KQ_B_AT, act_stride);
#undef KQ_A_AT
#undef KQ_B_AT
    for (int j = 0; j < AMX_ROWS; j++) {
        const struct block_q8_k *a =
            (const struct block_q8_k *)(act + (size_t)j * act_stride) + blk;
        __m512i isum = _mm512_setzero_si512();
        for (int s = 0; s < nsb; s++)
            isum = SB_END(isum, _mm512_load_si512(c[s] + LANES * j), p->scale[s]);
        kq_block_end(p, k4_sub == 8, a, isum, blk, acc + KQ_ACC * LANES * j);
    }
}

/* q8_0_rows for 16 activation rows (act: the first, act_stride apart). */
AI void q8_0_rows_amx(const struct q8_0_pack *p, const uint8_t *act, size_t act_stride, int64_t n,
                      int64_t b0, int nb, float *acc)
{
    int32_t c[Q8_BLOCKS + 1][AMX_ROWS * LANES] __attribute__((aligned(64)));
    const uint8_t *a0 =
        act + (size_t)b0 * sizeof(struct block_q8_0) + offsetof(struct block_q8_0, qs);
    /* an odd last block is paired with itself (its second product is not used) */
#define Q8_A_AT(b) (a0 + (size_t)((b) < nb ? (b) : nb - 1) * sizeof(struct block_q8_0))
#define Q8_B_AT(b) ((const void *)&p->codes[8 * ((b) < nb ? (b) : nb - 1)])
    for (int b = 0; b < nb; b += 2)
        AMX_PAIR(c, b, Q8_A_AT, Q8_B_AT, act_stride);
#undef Q8_A_AT
#undef Q8_B_AT
    for (int k = 0; k < Q8_ACC && k < nb; k++)
        for (int j = 0; j < AMX_ROWS; j++) {
            const uint8_t *aj = act + (size_t)j * act_stride;
            const struct vec_dot_q8_0_extra *pa = vec_dot_q8_0_extras((void *)aj, n) + b0;
            float *accj = acc + 16 * (Q8_ACC * j + k);
            __m512 sum = b0 ? _mm512_load_ps(accj) : _mm512_setzero_ps();
            for (int b = k; b < nb; b += Q8_ACC) {
                __m512i isum = _mm512_add_epi32(_mm512_set1_epi32(pa[b].off),
                                                _mm512_load_si512(c[b] + LANES * j));
                sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum),
                                      _mm512_mul_ps(p->d[b], _mm512_set1_ps(pa[b].d)), sum);
            }
            _mm512_store_ps(accj, sum);
        }
}

Q8W_KERNEL(gemm_q8_0_amx, QUANT_Q8_0, q8_0_rows_amx, amx_config(8), AMX_TILE_RELEASE())
Q8W_KERNEL(gemm_mxfp4_amx, QUANT_MXFP4, q8_0_rows_amx, amx_config(8), AMX_TILE_RELEASE())
Q8W_KERNEL(gemm_q4_0_amx, QUANT_Q4_0, q8_0_rows_amx, amx_config(8), AMX_TILE_RELEASE())
#undef Q8W_KERNEL

/* The K-quant kernels: tiles shaped for sub-blocks of k4_sub steps around kq_gemm. */
#define KQ_AMX_KERNEL(name, k4_sub, pack)                                                          \
    static void name(int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *act,   \
                     size_t act_stride, int m, float *y, int64_t y_stride)                         \
    {                                                                                              \
        amx_config(k4_sub);                                                                        \
        kq_gemm(n, w, w_stride, n_rows, act, act_stride, m, y, y_stride, k4_sub, pack,             \
                kq_rows_amx);                                                                      \
        AMX_TILE_RELEASE();                                                                        \
    }
KQ_AMX_KERNEL(gemm_q4_k_amx, 8, q4_k_pack)
KQ_AMX_KERNEL(gemm_q5_k_amx, 8, q5_k_pack)
KQ_AMX_KERNEL(gemm_q6_k_amx, 4, q6_k_pack_fn)
#undef KQ_AMX_KERNEL

#ifndef GEMM_AMX_EMU
/* Whether this process may run the tile instructions: the CPU reports AMX int8 and the OS
 * saves the tile state (cpu_features), Linux grants the process the tile data state
 * (arch_prctl ARCH_REQ_XCOMP_PERM, which every process must ask for before its first tile
 * instruction), and a 16 x 16 product of known codes, run with SIGILL caught, gives the sums
 * computed here. NULL when usable, else why not. */
#define AMX_ARCH_REQ_XCOMP_PERM 0x1023
#define AMX_XFEATURE_XTILEDATA 18

static const char *amx_why;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static sigjmp_buf amx_jmp;

static void amx_trap(int sig)
{
    (void)sig;
    siglongjmp(amx_jmp, 1);
}

static bool amx_probe(void)
{
    int8_t a[AMX_ROWS][32] __attribute__((aligned(64)));
    uint8_t b[8][64] __attribute__((aligned(64)));
    int32_t c[AMX_ROWS][LANES] __attribute__((aligned(64)));
    for (int i = 0; i < AMX_ROWS; i++)
        for (int k = 0; k < 32; k++)
            a[i][k] = (int8_t)((i * 37 + k * 11) % 255 - 127);
    for (int k = 0; k < 8; k++)
        for (int l = 0; l < 64; l++)
            b[k][l] = (uint8_t)((k * 53 + l * 29) % 256);
    struct sigaction sa, old;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = amx_trap;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGILL, &sa, &old))
        return false;
    volatile bool ran = false;
    if (!sigsetjmp(amx_jmp, 1)) {
        amx_config(8);
        AMX_TILE_LOAD(4, a, 32);
        AMX_TILE_LOAD(6, b, 64);
        AMX_TILE_ZERO(0);
        AMX_TILE_DPBSUD(0, 4, 6);
        AMX_TILE_STORE(0, c, 64);
        AMX_TILE_RELEASE();
        ran = true;
    }
    sigaction(SIGILL, &old, NULL);
    if (!ran)
        return false;
    for (int i = 0; i < AMX_ROWS; i++)
        for (int r = 0; r < LANES; r++) {
            int32_t want = 0;
            for (int k = 0; k < 32; k++)
                want += a[i][k] * b[k / 4][4 * r + k % 4];
            if (c[i][r] != want)
                return false;
        }
    return true;
}

static void amx_init(void)
{
    if (!cpu_features_get()->amx_int8)
        amx_why = "no AMX int8 (CPU or OS)";
    else if (syscall(SYS_arch_prctl, AMX_ARCH_REQ_XCOMP_PERM, AMX_XFEATURE_XTILEDATA))
        amx_why = "the kernel did not grant the tile state";
    else if (!amx_probe())
        amx_why = "a test product faulted or came out wrong";
}

static const char *amx_ready(void)
{
    pthread_once(&amx_once, amx_init);
    return amx_why;
}
#else
static const char *amx_ready(void)
{
    return NULL; /* emulated tiles: always */
}
#endif

static int amx_on = -1;

const char *GEMM_EXPORT(gemm_amx_status)(void)
{
    if (cpu_isa_best() < CPU_ISA_AVX512VNNI)
        return "below AVX-512 VNNI";
    if (!cpu_env_switch(&amx_on, "STRATA_CPU_AMX"))
        return "off (STRATA_CPU_AMX=0)";
    return amx_ready();
}

gemm_fn GEMM_EXPORT(gemm_amx_get)(uint32_t wtype)
{
    if (GEMM_EXPORT(gemm_amx_status)())
        return NULL;
    switch (wtype) {
    case QUANT_Q8_0:
        return gemm_q8_0_amx;
    case QUANT_MXFP4:
        return gemm_mxfp4_amx;
    case QUANT_Q4_0:
        return gemm_q4_0_amx;
    case QUANT_Q4_K:
        return gemm_q4_k_amx;
    case QUANT_Q5_K:
        return gemm_q5_k_amx;
    case QUANT_Q6_K:
        return gemm_q6_k_amx;
    default:
        return NULL;
    }
}
