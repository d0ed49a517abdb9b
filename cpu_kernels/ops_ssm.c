#include "ops_ssm.h"

#include <math.h>
#include <string.h>

#include "cpu_features.h"
#include "ops_cpu.h"
#include "ssm_body.h"

#define SSM_MAX_CONV 16

void ops_ssm_conv(float *x, float *state, const float *w, int n_tok, int ch, int d_conv)
{
    const int h = d_conv - 1;

#pragma omp parallel for schedule(static) if ((size_t)n_tok * ch > 4096)
    for (int c = 0; c < ch; c++) {
        float win[SSM_MAX_CONV]; /* the channel's last h inputs, oldest first */
        const float *wc = w + (size_t)c * d_conv;
        for (int j = 0; j < h; j++)
            win[j] = state[(size_t)j * ch + c];
        for (int t = 0; t < n_tok; t++) {
            float *p = x + (size_t)t * ch + c, u = *p, acc = wc[h] * u;
            for (int j = 0; j < h; j++)
                acc += wc[j] * win[j];
            for (int j = 0; j + 1 < h; j++)
                win[j] = win[j + 1];
            if (h)
                win[h - 1] = u;
            *p = ops_silu(acc);
        }
        for (int j = 0; j < h; j++)
            state[(size_t)j * ch + c] = win[j];
    }
}

typedef void (*gdn_head_fn)(const struct ops_gdn *g, int j);

/* The build of gdn_head for this CPU. */
static gdn_head_fn gdn_head_pick(void)
{
    if (cpu_isa_best() >= CPU_ISA_AVX512)
        return ops_gdn_head_avx512;
    if (cpu_isa_best() >= CPU_ISA_AVX2)
        return ops_gdn_head_avx2;
    return gdn_head;
}

void ops_gdn(const struct ops_gdn *g)
{
    const gdn_head_fn head = gdn_head_pick();

#pragma omp parallel for schedule(static)
    for (int j = 0; j < g->n_v; j++)
        head(g, j);
}
