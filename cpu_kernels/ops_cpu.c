#include "ops_cpu.h"

#include <math.h>
#include <omp.h>
#include <stdbool.h>

#include "attn_body.h"
#include "cpu_features.h"

void ops_rmsnorm(float *out, const float *in, const float *w, int rows, int dim, float eps)
{
#pragma omp parallel for schedule(static) if (rows * dim > 32768)
    for (int r = 0; r < rows; r++) {
        const float *x = in + (size_t)r * dim;
        float *y = out + (size_t)r * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++)
            ss += (double)x[i] * x[i];
        float inv = 1.0f / sqrtf((float)(ss / dim) + eps);
        for (int i = 0; i < dim; i++)
            y[i] = x[i] * inv * (w ? w[i] : 1.0f);
    }
}

void ops_rope_neox(float *x, int n_tok, int n_heads, int head_dim, int pos0, float base)
{
    int half = head_dim / 2;

#pragma omp parallel for schedule(static) if (n_tok > 4)
    for (int t = 0; t < n_tok; t++) {
        double pos = pos0 + t;
        for (int i = 0; i < half; i++) {
            double theta = pos * pow((double)base, -2.0 * i / head_dim);
            float c = (float)cos(theta), s = (float)sin(theta);
            for (int h = 0; h < n_heads; h++) {
                float *v = x + ((size_t)t * n_heads + h) * head_dim;
                float a = v[i], b = v[i + half];
                v[i] = a * c - b * s;
                v[i + half] = a * s + b * c;
            }
        }
    }
}

/* Units of (query token, up to ATTN_MAX_HEADS heads of one KV head), so that each key and
 * value row read serves all the heads that share it; one head per unit when there are too few
 * units for the threads (decode). */
void ops_attention(const struct ops_attn *a)
{
    const int group = a->n_head / a->n_head_kv;
    int hp = group < ATTN_MAX_HEADS ? group : ATTN_MAX_HEADS;
    if (a->n_tok * a->n_head_kv * ((group + hp - 1) / hp) < 2 * omp_get_max_threads())
        hp = 1;
    const int per_kv = (group + hp - 1) / hp, n = a->n_tok * a->n_head_kv * per_kv;
    const bool avx512 = cpu_isa_best() >= CPU_ISA_AVX512;

#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < n; i++) {
        int t = i / (a->n_head_kv * per_kv), g = i / per_kv % a->n_head_kv, c = i % per_kv;
        int h0 = g * group + c * hp, nh = group - c * hp < hp ? group - c * hp : hp;
        if (avx512)
            ops_attn_unit_avx512(a, t, h0, nh);
        else
            attn_unit(a, t, h0, nh);
    }
}

void ops_softmax(float *x, int n)
{
    float m = -INFINITY, sum = 0.0f;
    for (int i = 0; i < n; i++)
        m = x[i] > m ? x[i] : m;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    for (int i = 0; i < n; i++)
        x[i] /= sum;
}
