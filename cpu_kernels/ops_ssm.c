#include "ops_ssm.h"

#include <math.h>
#include <string.h>

#include "ops_cpu.h"

#define SSM_MAX_CONV 16
#define SSM_MAX_D 256
#define SSM_L2_EPS 1e-6f

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

/* x (n) scaled to unit length: x / sqrt(sum x^2 + eps), times s. */
static void l2norm_scaled(float *out, const float *x, int n, float s)
{
    float ss = 0.0f;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    float r = s / sqrtf(ss + SSM_L2_EPS);
    for (int i = 0; i < n; i++)
        out[i] = x[i] * r;
}

static float softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

void ops_gdn(const struct ops_gdn *g)
{
    const int d = g->d, r = g->n_v / g->n_k;
    const size_t kw = (size_t)g->n_k * d, vw = (size_t)g->n_v * d, cw = 2 * kw + vw;
    const float qscale = 1.0f / sqrtf((float)d);

#pragma omp parallel for schedule(static)
    for (int j = 0; j < g->n_v; j++) {
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
                float *s = S + (size_t)a * d, ka = k[a];
                for (int b = 0; b < d; b++) {
                    s[b] *= decay;
                    mem[b] += s[b] * ka;
                }
            }
            for (int b = 0; b < d; b++) /* mem becomes delta */
                mem[b] = beta * (v[b] - mem[b]);
            memset(o, 0, sizeof(float) * d);
            for (int a = 0; a < d; a++) { /* S += k delta^T; o = S^T q */
                float *s = S + (size_t)a * d, ka = k[a], qa = q[a];
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
}
