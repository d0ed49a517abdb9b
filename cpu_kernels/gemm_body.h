/* gemm_body.h: the K-quant gemm kernels (Q4_K, Q5_K, Q6_K with Q8_K activations; gemm.h),
 * written once and included by gemm_avx512.c (16 rows per vector, VNNI) and gemm_avx2.c (8
 * rows per vector). The including file defines:
 *   LANES, TOK, MAX_M, GEMM_MAX_ACC (most accumulators per activation row of its kernels);
 *   VI, VF (integer and float vectors of LANES dwords)
 *   struct tile, tile_init, tile_gather, load_transposed (4 * LANES bytes of every row of the
 *   tile, transposed: x[i] = bytes 4i .. 4i+3), store_tile (one vector of outputs to y, the
 *   tile's rows only), f16_low (the f16 in the low half of every dword, as floats)
 *   SCALE(x): a sub-block's integer scale (one int32 per lane) in the form SB_END uses
 *   SB_START(s), DOT2(t, c0, a0, c1, a1, sc), SB_END(s, t, sc): one sub-block's codes
 *   times activation codes, each step of 8 elements adding the 4-byte dot products of codes
 *   c0, c1 (unsigned) with the broadcast activation codes a0, a1 (signed), and the total
 *   times the scale sc added to the int32 lanes of s (AVX-512: plain dots, one vpmulld per
 *   sub-block; AVX2: the scale is the vpmaddwd multiplier)
 *   PAIRS(s, p, b): s + p . b over int16 pairs (vpdpwssd / vpmaddwd)
 *   V_* for the element-wise intrinsics below.
 *
 * A block of 256 elements of 16 (or 8) weight rows is packed once: codes[k4] holds elements
 * 4 k4 .. 4 k4 + 3 of every row (lane r = row r) as unsigned bytes, with the integer scale of
 * each sub-block, d and dmin as floats, and the pairs of the offset term
 * sum_i pairs[i] . (bsums[2i], bsums[2i + 1]) (Q4_K/Q5_K: the mins; Q6_K: the scales, for the
 * +32 of its codes). Activation rows then go through the block TOK at a time. The float
 * arithmetic per output is vec_dot.h's (the integer sums of a block, then one FMA per
 * accumulator). GEMM_DRIVER and FOR_NT also serve the including file's other kernels
 * (gemm_avx512.c's Q8_0).
 */

#define K4 (QK_K / 4) /* 4-element steps per block */

/* Byte k (0..3) of every dword, zero-extended. */
AI VI byte_of(VI x, int k)
{
    return V_AND(V_SRLI32(x, 8 * k), V_SET1_32(0xff));
}

/* Byte k (0..3) of every dword, sign-extended. */
AI VI sbyte_of(VI x, int k)
{
    return V_SRAI32(V_SLLI32(x, 24 - 8 * k), 24);
}

AI VI bcast32(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return V_SET1_32(v);
}

struct kq_pack {
    VI codes[K4];
    VI scale[16]; /* SCALE of the integer scale of each sub-block */
    VI pairs[8];
    VF d, dmin; /* dmin: Q4_K/Q5_K only */
};

/* Q4_K and Q5_K (five): codes as they are, Q5_K's 5th bit of element 32s + l being bit s of
 * qh[l]; a 6-bit scale per 32 elements, pairs = (min, min). Both formats start with d, dmin
 * and the 12 scale bytes. */
AI void k45_pack(const struct tile *t, int64_t blk, struct kq_pack *p, bool five)
{
    const VI m4 = V_SET1_8(0x0f), one = V_SET1_8(1);
    const size_t at = (size_t)blk * (five ? sizeof(struct block_q5_k) : sizeof(struct block_q4_k));
    const size_t qs_at = five ? offsetof(struct block_q5_k, qs) : offsetof(struct block_q4_k, qs);
    VI qh[LANES]; /* qh[b4] = qh bytes 4 b4 .. 4 b4 + 3, b4 < 8 */
    if (five)
        load_transposed(t, at + offsetof(struct block_q5_k, qh), qh);
    for (int piece = 0; piece < QK_K / 2 / (4 * LANES); piece++) {
        VI x[LANES];
        load_transposed(t, at + qs_at + 4 * LANES * piece, x);
        /* qs byte b of 32-byte chunk c: low nibble = element 64c + b, high = 64c + 32 + b */
        for (int i = 0; i < LANES; i++) {
            const int o = 4 * LANES * piece + 4 * i, c = o / 32, b4 = o % 32 / 4;
            VI lo = V_AND(x[i], m4), hi = V_AND(V_SRLI16(x[i], 4), m4);
            if (five) {
                lo = V_OR(lo, V_SLLI16(V_AND(V_SRLI16(qh[b4], 2 * c), one), 4));
                hi = V_OR(hi, V_SLLI16(V_AND(V_SRLI16(qh[b4], 2 * c + 1), one), 4));
            }
            p->codes[16 * c + b4] = lo;
            p->codes[16 * c + 8 + b4] = hi;
        }
    }
    VI dd = tile_gather(t, at);
    VI u0 = tile_gather(t, at + 4), u1 = tile_gather(t, at + 8), u2 = tile_gather(t, at + 12);
    p->d = f16_low(dd);
    p->dmin = f16_low(V_SRLI32(dd, 16));
    /* vec_dot_k4_scales across lanes: sc 0..3, sc 4..7, mins 0..3, mins 4..7 */
    const VI m6 = V_SET1_32(0x3f3f3f3f), m2 = V_SET1_32(0x03030303), m4w = V_SET1_32(0x0f0f0f0f);
    VI s[4];
    s[0] = V_AND(u0, m6);
    s[1] = V_OR(V_AND(u2, m4w), V_SLLI32(V_AND(V_SRLI32(u0, 6), m2), 4));
    s[2] = V_AND(u1, m6);
    s[3] = V_OR(V_AND(V_SRLI32(u2, 4), m4w), V_SLLI32(V_AND(V_SRLI32(u1, 6), m2), 4));
    for (int sb = 0; sb < 8; sb++) {
        p->scale[sb] = SCALE(byte_of(s[sb / 4], sb % 4));
        VI mn = byte_of(s[2 + sb / 4], sb % 4);
        p->pairs[sb] = V_OR(mn, V_SLLI32(mn, 16));
    }
}

/* Q6_K: 6-bit codes (value + 32); a signed 8-bit scale per 16 elements, pairs = scales 2i, 2i+1.
 * Element 128h + 32s + l: low 4 bits from ql[64h + 32(s & 1) + l] (low nibble for s < 2),
 * high 2 bits (qh[32h + l] >> 2s) & 3 (vec_dot.c's dot_q6_k_scalar). */
AI void q6_k_pack(const struct tile *t, int64_t blk, struct kq_pack *p)
{
    const VI lo4 = V_SET1_8(0x0f), hi2 = V_SET1_8(0x30);
    const size_t at = (size_t)blk * sizeof(struct block_q6_k);
    VI ql[QK_K / 8], qh[QK_K / 16]; /* dword i = bytes 4i .. 4i + 3 */
    for (int piece = 0; piece < QK_K / 2 / (4 * LANES); piece++)
        load_transposed(t, at + offsetof(struct block_q6_k, ql) + 4 * LANES * piece,
                        ql + LANES * piece);
    for (int piece = 0; piece < QK_K / 4 / (4 * LANES); piece++)
        load_transposed(t, at + offsetof(struct block_q6_k, qh) + 4 * LANES * piece,
                        qh + LANES * piece);
    for (int h = 0; h < 2; h++)
        for (int l4 = 0; l4 < 8; l4++) {
            VI a = ql[16 * h + l4], b = ql[16 * h + 8 + l4], q = qh[8 * h + l4];
            VI lo[4] = {V_AND(a, lo4), V_AND(b, lo4), V_AND(V_SRLI16(a, 4), lo4),
                        V_AND(V_SRLI16(b, 4), lo4)};
            VI hi[4] = {V_SLLI16(q, 4), V_SLLI16(q, 2), q, V_SRLI16(q, 2)};
            for (int s = 0; s < 4; s++)
                p->codes[32 * h + 8 * s + l4] = V_OR(lo[s], V_AND(hi[s], hi2));
        }
    /* scales[16] at 192, d at 208: the dword at 206 keeps the gather inside the block */
    p->d = f16_low(V_SRLI32(tile_gather(t, at + offsetof(struct block_q6_k, d) - 2), 16));
    for (int k = 0; k < 4; k++) {
        VI sc = tile_gather(t, at + offsetof(struct block_q6_k, scales) + 4 * k), s8[4];
        for (int b = 0; b < 4; b++) {
            s8[b] = sbyte_of(sc, b);
            p->scale[4 * k + b] = SCALE(s8[b]);
        }
        for (int i = 0; i < 2; i++)
            p->pairs[2 * k + i] =
                V_OR(V_AND(s8[2 * i], V_SET1_32(0xffff)), V_SLLI32(s8[2 * i + 1], 16));
    }
}

/* Sub-blocks of k4_sub steps (8: 32 elements, Q4_K/Q5_K; 4: 16 elements, Q6_K) of block blk;
 * nt activation rows, each with KQ_ACC accumulators at acc + KQ_ACC * LANES * j (0 before
 * block 0). As in vec_dot.h: isum = sum of scale * codes . a (Q6_K: minus 32 * scales .
 * bsums), msum = mins . bsums; acc[0] += isum * (d * a_d), acc[1] += msum * (dmin * a_d), one
 * FMA each (Q6_K: acc[0] only). */
#define KQ_ACC 2

/* Block blk's integer sum isum (sum over sub-blocks of scale * codes . a) of one activation
 * row a (its Q8_K block) into that row's accumulators acc, as above. */
AI void kq_block_end(const struct kq_pack *p, bool mins, const struct block_q8_k *a, VI isum,
                     int64_t blk, float *acc)
{
    VI off = V_SETZERO_I();
    for (int i = 0; i < 8; i++)
        off = PAIRS(off, p->pairs[i], bcast32(&a->bsums[2 * i]));
    const VF ad = V_SET1_F(a->d);
    if (!mins)
        isum = V_SUB32(isum, V_SLLI32(off, 5));
    V_STORE_F(acc, V_FMADD(V_CVT(isum), V_MUL(p->d, ad), blk ? V_LOAD_F(acc) : V_SETZERO_F()));
    if (mins)
        V_STORE_F(acc + LANES, V_FMADD(V_CVT(off), V_MUL(p->dmin, ad),
                                       blk ? V_LOAD_F(acc + LANES) : V_SETZERO_F()));
}

AI void kq_rows(const struct kq_pack *p, int k4_sub, const uint8_t *act, size_t act_stride,
                int64_t blk, float *acc, int nt)
{
    const bool mins = k4_sub == 8;
    const struct block_q8_k *a[TOK];
    VI isum[TOK], part[TOK]; /* the block's sum, the sub-block's (SB_START .. SB_END) */
    for (int j = 0; j < nt; j++) {
        a[j] = (const struct block_q8_k *)(act + (size_t)j * act_stride) + blk;
        isum[j] = V_SETZERO_I();
    }
    for (int sb = 0; sb < K4 / k4_sub; sb++) {
        for (int j = 0; j < nt; j++)
            part[j] = SB_START(isum[j]);
        for (int i = 0; i < k4_sub; i += 2) {
            const int k4 = k4_sub * sb + i;
            const VI c0 = p->codes[k4], c1 = p->codes[k4 + 1];
            for (int j = 0; j < nt; j++)
                part[j] = DOT2(part[j], c0, bcast32(a[j]->qs + 4 * k4), c1,
                               bcast32(a[j]->qs + 4 * k4 + 4), p->scale[sb]);
        }
        for (int j = 0; j < nt; j++)
            isum[j] = SB_END(isum[j], part[j], p->scale[sb]);
    }
    for (int j = 0; j < nt; j++)
        kq_block_end(p, mins, a[j], isum[j], blk, acc + KQ_ACC * LANES * j);
}

/* Output row j of a K-quant tile from its accumulators: acc[0] - acc[1] (mins), acc[0]. */
AI VF kq_finish(const float *acc, bool mins)
{
    return mins ? V_SUB_F(V_LOAD_F(acc), V_LOAD_F(acc + LANES)) : V_LOAD_F(acc);
}

/* Runs the statements given for every tile of LANES rows (t) and every pass of at most
 * MAX_M activation rows (j0, mm), with acc: nacc vectors of LANES floats per activation row,
 * which the statements initialize; finish(acc + LANES * j * nacc) is then output row j of the
 * tile. Uses n_rows, w, w_stride, m, y, y_stride of the calling kernel. */
#define GEMM_DRIVER(nacc, finish, ...)                                                             \
    for (int64_t r0 = 0; r0 < n_rows; r0 += LANES) {                                               \
        struct tile t;                                                                             \
        tile_init(&t, (const uint8_t *)w + (size_t)r0 * w_stride, w_stride,                        \
                  n_rows - r0 < LANES ? n_rows - r0 : LANES);                                      \
        for (int j0 = 0; j0 < m; j0 += MAX_M) {                                                    \
            const int mm = m - j0 < MAX_M ? m - j0 : MAX_M;                                        \
            float acc[MAX_M * LANES * GEMM_MAX_ACC] __attribute__((aligned(64)));                  \
            __VA_ARGS__;                                                                           \
            for (int j = 0; j < mm; j++)                                                           \
                store_tile(finish(acc + LANES * j * (nacc)), &t,                                   \
                           y + (int64_t)(j0 + j) * y_stride + r0);                                 \
        }                                                                                          \
    }

/* Calls body(NT) with NT = min(nt, TOK) as a constant, so the token loops unroll. */
#if TOK > 4
#define FOR_NT_WIDE(body)                                                                          \
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
        break;
#else
#define FOR_NT_WIDE(body)
#endif
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
        FOR_NT_WIDE(body)                                                                          \
    default:                                                                                       \
        body(TOK);                                                                                 \
        break;                                                                                     \
    }

/* kq_rows for 16 activation rows by another route (gemm_avx512.c's AMX tiles). */
typedef void (*kq_rows16_fn)(const struct kq_pack *p, int k4_sub, const uint8_t *act,
                             size_t act_stride, int64_t blk, float *acc);

/* Every tile of LANES rows and block of a K-quant matrix through pack and kq_rows; with
 * rows16, groups of 16 activation rows through it, the rest through kq_rows. */
AI void kq_gemm(int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *act,
                size_t act_stride, int m, float *y, int64_t y_stride, int k4_sub,
                void (*pack)(const struct tile *, int64_t, struct kq_pack *), kq_rows16_fn rows16)
{
    struct kq_pack p __attribute__((aligned(64)));
    const uint8_t *x = act;
#define KQ_ROWS(NT)                                                                                \
    kq_rows(&p, k4_sub, x + (size_t)(j0 + j) * act_stride, act_stride, blk,                        \
            acc + KQ_ACC * LANES * j, NT)
#define KQ_FINISH(acc) kq_finish(acc, k4_sub == 8)
    GEMM_DRIVER(KQ_ACC, KQ_FINISH, {
        for (int64_t blk = 0; blk < n / QK_K; blk++) {
            pack(&t, blk, &p);
            int j = 0;
            for (; rows16 && j + 16 <= mm; j += 16)
                rows16(&p, k4_sub, x + (size_t)(j0 + j) * act_stride, act_stride, blk,
                       acc + KQ_ACC * LANES * j);
            for (; j < mm; j += TOK)
                FOR_NT(mm - j, KQ_ROWS);
        }
    })
#undef KQ_ROWS
#undef KQ_FINISH
}

static void q4_k_pack(const struct tile *t, int64_t blk, struct kq_pack *p)
{
    k45_pack(t, blk, p, false);
}

static void q5_k_pack(const struct tile *t, int64_t blk, struct kq_pack *p)
{
    k45_pack(t, blk, p, true);
}

static void q6_k_pack_fn(const struct tile *t, int64_t blk, struct kq_pack *p)
{
    q6_k_pack(t, blk, p);
}

static void gemm_q4_k(int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *act,
                      size_t act_stride, int m, float *y, int64_t y_stride)
{
    kq_gemm(n, w, w_stride, n_rows, act, act_stride, m, y, y_stride, 8, q4_k_pack, NULL);
}

static void gemm_q5_k(int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *act,
                      size_t act_stride, int m, float *y, int64_t y_stride)
{
    kq_gemm(n, w, w_stride, n_rows, act, act_stride, m, y, y_stride, 8, q5_k_pack, NULL);
}

static void gemm_q6_k(int64_t n, const void *w, size_t w_stride, int64_t n_rows, const void *act,
                      size_t act_stride, int m, float *y, int64_t y_stride)
{
    kq_gemm(n, w, w_stride, n_rows, act, act_stride, m, y, y_stride, 4, q6_k_pack_fn, NULL);
}

/* The K-quant kernels of this build, or NULL. */
static gemm_fn kq_get(uint32_t wtype)
{
    switch (wtype) {
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
