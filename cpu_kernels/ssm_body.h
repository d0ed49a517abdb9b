/* ssm_body: one v head of ops_gdn (the gated delta rule over a call's tokens), written once in
 * plain C loops over the state's contiguous rows and compiled three times: by ops_ssm.c for
 * any x86-64, by ops_ssm_avx2.c with AVX2 + FMA and by ops_ssm_avx512.c with AVX-512, where
 * GCC vectorizes the same loops 8 and 16 floats wide. Internal to those files. */
#ifndef STRATA_SSM_BODY_H
#define STRATA_SSM_BODY_H

#include <math.h>
#include <string.h>

#include "ops_cpu.h"
#include "ops_ssm.h"

#define SSM_MAX_D 256
#define SSM_L2_EPS 1e-6f

/* The AVX-512 and AVX2 builds of gdn_head (ops_ssm_avx512.c, ops_ssm_avx2.c); call only when
 * cpu_isa_best() reaches that level. */
void ops_gdn_head_avx512(const struct ops_gdn *g, int j);
void ops_gdn_head_avx2(const struct ops_gdn *g, int j);

/* x (n) scaled to unit length: x / sqrt(sum x^2 + eps), times s. */
static inline void l2norm_scaled(float *out, const float *x, int n, float s)
{
    float ss = 0.0f;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    float r = s / sqrtf(ss + SSM_L2_EPS);
    for (int i = 0; i < n; i++)
        out[i] = x[i] * r;
}

static inline float softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

/* V head j of g over all of g's tokens, in order: its state S[j] updated in place. */
static inline void gdn_head(const struct ops_gdn *g, int j)
{
    const int d = g->d, r = g->n_v / g->n_k;
    const size_t kw = (size_t)g->n_k * d, vw = (size_t)g->n_v * d, cw = 2 * kw + vw;
    const float qscale = 1.0f / sqrtf((float)d);

    float q[SSM_MAX_D], k[SSM_MAX_D], mem[SSM_MAX_D], o[SSM_MAX_D];
    float *S = g->state + (size_t)j * d * d;
    const int kh = g->v_tiled ? j % g->n_k : j / r;
    const int bi = g->ba_grouped ? (j / r) * 2 * r + j % r : j;
    const int ai = g->ba_grouped ? (j / r) * 2 * r + r + j % r : j;
    for (int t = 0; t < g->n_tok; t++) {
        const float *row = g->qkv + (size_t)t * cw;
        const float *v = row + 2 * kw + (size_t)j * d;
        const float bl = g->b[(size_t)t * g->ba_stride + bi];
        const float al = g->a[(size_t)t * g->ba_stride + ai];
        const float beta = 1.0f / (1.0f + expf(-bl));
        const float decay = expf(g->a_log_neg[j] * softplus(al + g->dt_bias[j]));
        l2norm_scaled(q, row + (size_t)kh * d, d, qscale);
        l2norm_scaled(k, row + kw + (size_t)kh * d, d, 1.0f);
        memset(mem, 0, sizeof(float) * d);
        for (int a = 0; a < d; a++) { /* S = decay S; mem = S^T k */
            float *restrict s = S + (size_t)a * d, ka = k[a];
            for (int b = 0; b < d; b++) {
                s[b] *= decay;
                mem[b] += s[b] * ka;
            }
        }
        for (int b = 0; b < d; b++) /* mem becomes delta */
            mem[b] = beta * (v[b] - mem[b]);
        memset(o, 0, sizeof(float) * d);
        for (int a = 0; a < d; a++) { /* S += k delta^T; o = S^T q */
            float *restrict s = S + (size_t)a * d, ka = k[a], qa = q[a];
            for (int b = 0; b < d; b++) {
                s[b] += ka * mem[b];
                o[b] += s[b] * qa;
            }
        }
        float ss = 0.0f;
        for (int b = 0; b < d; b++)
            ss += o[b] * o[b];
        const float rn = 1.0f / sqrtf(ss / d + g->eps);
        const float *z = g->z + (size_t)t * vw + (size_t)j * d;
        float *out = g->out + (size_t)t * vw + (size_t)j * d;
        for (int b = 0; b < d; b++)
            out[b] = o[b] * rn * g->norm_w[b] * ops_silu(z[b]);
    }
}

#endif
