/* gemm_amx_emu: the AMX kernels of cpu_kernels/gemm_avx512.c built with the tile instructions
 * done in C, so that test_matmul checks their logic (tile shapes, the packs as tile B,
 * activation rows read in place, the float arithmetic after the integer sums) on hosts without
 * AMX. Exports gemm_amx_get_emu, gemm_amx_status_emu and gemm_avx512_get_emu.
 *
 * The instructions as Intel's reference gives them (palette 1): a tile is up to 16 rows of up
 * to 64 bytes, shaped by the configuration; tdpbsud adds to each int32 of C (row m, column n)
 * the products of the 4 signed bytes k of A's row m with the 4 unsigned bytes n of B's row k,
 * for k below A's bytes per row / 4. Shapes the hardware refuses (C rows != A rows, A's bytes /
 * 4 != B rows, C bytes != B bytes, a tile not configured) abort here. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct emu_tile {
    int rows, colsb;
    uint8_t d[16][64];
};

static _Thread_local struct emu_tile emu_t[8];
static _Thread_local int emu_configured;

static void emu_fail(const char *what)
{
    fprintf(stderr, "amx emulation: %s\n", what);
    abort();
}

static void emu_cfg(const void *cfg)
{
    const uint8_t *c = cfg;
    if (c[0] != 1)
        emu_fail("palette is not 1");
    for (int t = 0; t < 8; t++) {
        uint16_t colsb;
        memcpy(&colsb, c + 16 + 2 * t, 2);
        if (c[48 + t] > 16 || colsb > 64)
            emu_fail("a tile larger than 16 rows of 64 bytes");
        emu_t[t].rows = c[48 + t];
        emu_t[t].colsb = colsb;
        memset(emu_t[t].d, 0, sizeof(emu_t[t].d));
    }
    emu_configured = 1;
}

static struct emu_tile *emu_tile(int t)
{
    if (!emu_configured || t < 0 || t > 7 || !emu_t[t].rows || !emu_t[t].colsb)
        emu_fail("a tile used without a configuration");
    return &emu_t[t];
}

static void emu_zero(int t)
{
    memset(emu_tile(t)->d, 0, sizeof(emu_t[t].d));
}

static void emu_load(int t, const void *base, long stride)
{
    struct emu_tile *x = emu_tile(t);
    for (int r = 0; r < x->rows; r++)
        memcpy(x->d[r], (const uint8_t *)base + (long)r * stride, (size_t)x->colsb);
}

static void emu_store(int t, void *base, long stride)
{
    struct emu_tile *x = emu_tile(t);
    for (int r = 0; r < x->rows; r++)
        memcpy((uint8_t *)base + (long)r * stride, x->d[r], (size_t)x->colsb);
}

static void emu_dpbsud(int c, int a, int b)
{
    struct emu_tile *tc = emu_tile(c), *ta = emu_tile(a), *tb = emu_tile(b);
    if (tc->rows != ta->rows || ta->colsb % 4 || ta->colsb / 4 != tb->rows ||
        tc->colsb != tb->colsb || tc->colsb % 4)
        emu_fail("tdpbsud shapes do not match");
    for (int m = 0; m < tc->rows; m++)
        for (int n = 0; n < tc->colsb / 4; n++) {
            int32_t acc;
            memcpy(&acc, &tc->d[m][4 * n], 4);
            uint32_t sum = (uint32_t)acc; /* wraps as the hardware does */
            for (int k = 0; k < ta->colsb / 4; k++)
                for (int i = 0; i < 4; i++)
                    sum += (uint32_t)((int32_t)(int8_t)ta->d[m][4 * k + i] *
                                      (int32_t)tb->d[k][4 * n + i]);
            memcpy(&tc->d[m][4 * n], &sum, 4);
        }
}

#define AMX_TILE_CFG(cfg) emu_cfg(cfg)
#define AMX_TILE_RELEASE() (emu_configured = 0)
#define AMX_TILE_ZERO(t) emu_zero(t)
#define AMX_TILE_LOAD(t, base, stride) emu_load(t, base, (long)(stride))
#define AMX_TILE_STORE(t, base, stride) emu_store(t, base, (long)(stride))
#define AMX_TILE_DPBSUD(c, a, b) emu_dpbsud(c, a, b)

#define GEMM_AMX_EMU 1
#include "../cpu_kernels/gemm_avx512.c"
