#include "ops_cpu.h"

#include <math.h>

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

/* One (token, head) of attention: online softmax over keys 0..last. */
static void ops_attention_row(const struct ops_attn *a, int t, int h)
{
    float acc[OPS_MAX_HEAD_DIM];
    int hd = a->head_dim, kvw = a->n_head_kv * hd;
    int kvh = h / (a->n_head / a->n_head_kv), last = a->pos0 + t;
    const float *q = a->q + ((size_t)t * a->n_head + h) * hd;
    float *o = a->out + ((size_t)t * a->n_head + h) * hd;
    float m = -INFINITY, l = 0.0f;

    for (int i = 0; i < hd; i++)
        acc[i] = 0.0f;
    for (int j = 0; j <= last; j++) {
        const float *k = a->k_cache + (size_t)j * kvw + (size_t)kvh * hd;
        const float *v = a->v_cache + (size_t)j * kvw + (size_t)kvh * hd;
        float s = 0.0f;
        for (int i = 0; i < hd; i++)
            s += q[i] * k[i];
        s *= a->scale;
        if (s > m) {
            float r = expf(m - s);
            l *= r;
            for (int i = 0; i < hd; i++)
                acc[i] *= r;
            m = s;
        }
        float p = expf(s - m);
        l += p;
        for (int i = 0; i < hd; i++)
            acc[i] += p * v[i];
    }
    for (int i = 0; i < hd; i++)
        o[i] = acc[i] / l;
}

void ops_attention(const struct ops_attn *a)
{
    int n = a->n_tok * a->n_head;

#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < n; i++)
        ops_attention_row(a, i / a->n_head, i % a->n_head);
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
