#include "ops_cpu.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "attn_body.h"
#include "cpu_features.h"

/* sum of x[i]^2 in double: each square is exact, and eight running sums (combined in a fixed
 * order) keep the adds from waiting on one another, as one chain of 2048 dependent double adds
 * did (3 us of every decode norm, on one thread while the others wait) */
static double sum_squares(const float *x, int n)
{
    double acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += (double)x[i + k] * x[i + k];
    for (int k = 0; i < n; i++, k++)
        acc[k] += (double)x[i] * x[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

void ops_rmsnorm(float *out, const float *in, const float *w, int rows, int dim, float eps)
{
#pragma omp parallel for schedule(static) if (rows * dim > 32768)
    for (int r = 0; r < rows; r++) {
        const float *x = in + (size_t)r * dim;
        float *y = out + (size_t)r * dim;
        double ss = sum_squares(x, dim);
        float inv = 1.0f / sqrtf((float)(ss / dim) + eps);
        for (int i = 0; i < dim; i++)
            y[i] = x[i] * inv * (w ? w[i] : 1.0f);
    }
}

void ops_rope_neox(float *x, int n_tok, int n_heads, int head_dim, int pos0, float base)
{
    double freq[OPS_MAX_HEAD_DIM / 2]; /* base^(-2i/head_dim), once per call, not per token */
    for (int i = 0; i < head_dim / 2; i++)
        freq[i] = pow((double)base, -2.0 * i / head_dim);
    ops_rope_neox_freq(x, n_tok, n_heads, head_dim, pos0, freq, 1.0f);
}

void ops_rope_neox_freq(float *x, int n_tok, int n_heads, int head_dim, int pos0,
                        const double *freq, float mscale)
{
    ops_rope_neox_rot(x, n_tok, n_heads, head_dim, head_dim, pos0, freq, mscale);
}

void ops_rope_neox_partial(float *x, int n_tok, int n_heads, int head_dim, int n_rot, int pos0,
                           float base)
{
    double freq[OPS_MAX_HEAD_DIM / 2];
    for (int i = 0; i < n_rot / 2; i++)
        freq[i] = pow((double)base, -2.0 * i / n_rot);
    ops_rope_neox_rot(x, n_tok, n_heads, head_dim, n_rot, pos0, freq, 1.0f);
}

/* One token's rotation angles as floats (cos, sin times mscale), kept per thread: decode
 * rotates q and k of every layer at one position with the same frequencies, so the 2 x n_rot / 2
 * double cos and sin calls run once a token instead of twice a layer. */
struct rope_angles {
    bool valid;
    int pos, half;
    float mscale;
    double freq[OPS_MAX_HEAD_DIM / 2];
    float c[OPS_MAX_HEAD_DIM / 2], s[OPS_MAX_HEAD_DIM / 2];
};
static _Thread_local struct rope_angles rope_last;

static const struct rope_angles *rope_angles_at(int pos, int half, const double *freq, float mscale)
{
    struct rope_angles *r = &rope_last;
    if (r->valid && r->pos == pos && r->half == half && r->mscale == mscale &&
        !memcmp(r->freq, freq, sizeof(double) * (size_t)half))
        return r;
    for (int i = 0; i < half; i++) {
        double theta = (double)pos * freq[i];
        r->c[i] = (float)cos(theta) * mscale;
        r->s[i] = (float)sin(theta) * mscale;
    }
    memcpy(r->freq, freq, sizeof(double) * (size_t)half);
    r->pos = pos, r->half = half, r->mscale = mscale, r->valid = true;
    return r;
}

void ops_rope_neox_rot(float *x, int n_tok, int n_heads, int head_dim, int n_rot, int pos0,
                       const double *freq, float mscale)
{
    int half = n_rot / 2;
    if (n_tok == 1) {
        const struct rope_angles *r = rope_angles_at(pos0, half, freq, mscale);
        for (int h = 0; h < n_heads; h++) { /* along each head's contiguous halves */
            float *v = x + (size_t)h * head_dim, *w = v + half;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = w[i];
                v[i] = a * r->c[i] - b * r->s[i];
                w[i] = a * r->s[i] + b * r->c[i];
            }
        }
        return;
    }

#pragma omp parallel for schedule(static) if (n_tok > 4)
    for (int t = 0; t < n_tok; t++) {
        double pos = pos0 + t;
        for (int i = 0; i < half; i++) {
            double theta = pos * freq[i];
            float c = (float)cos(theta) * mscale, s = (float)sin(theta) * mscale;
            for (int h = 0; h < n_heads; h++) {
                float *v = x + ((size_t)t * n_heads + h) * head_dim;
                float a = v[i], b = v[i + half];
                v[i] = a * c - b * s;
                v[i + half] = a * s + b * c;
            }
        }
    }
}

/* The dimension index (of head_dim) whose wavelength turns `turns` times over n positions. */
static double yarn_dim(double turns, int head_dim, double base, double n)
{
    return head_dim * log(n / (turns * 2.0 * M_PI)) / (2.0 * log(base));
}

void ops_rope_yarn_freq(int head_dim, float base, float factor, uint32_t n_ctx_orig,
                        float beta_fast, float beta_slow, int truncate, double *freq, float *mscale)
{
    int half = head_dim / 2;
    double lo = yarn_dim(beta_fast, head_dim, base, n_ctx_orig);
    double hi = yarn_dim(beta_slow, head_dim, base, n_ctx_orig);
    if (truncate) {
        lo = floor(lo);
        hi = ceil(hi);
    }
    lo = lo > 0 ? lo : 0;
    hi = hi < head_dim - 1 ? hi : head_dim - 1;
    if (lo == hi)
        hi += 0.001;
    for (int i = 0; i < half; i++) {
        /* float32 like the reference: base^(2i/d) and its inverses */
        float pf = powf(base, (float)(2 * i) / (float)head_dim);
        float extra = 1.0f / pf, inter = 1.0f / (factor * pf);
        float ramp = (float)((i - lo) / (hi - lo));
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float keep = 1.0f - ramp; /* the share of the unscaled frequency */
        freq[i] = inter * (1.0f - keep) + extra * keep;
    }
    *mscale = factor <= 1.0f ? 1.0f : 0.1f * logf(factor) + 1.0f;
}

/* A few query tokens (decode) split their keys into chunks of ATTN_CHUNK, so that a long
 * context gives every thread work while each key and value row is still read once for all
 * the heads that share it; the chunks' partial sums are then combined in chunk order. The
 * split depends only on the shapes, never on the thread count, so results do not either. */
#define ATTN_CHUNK 256
#define ATTN_SPLIT_BELOW 16 /* split when n_tok * n_head_kv is below this */

typedef void (*attn_unit_fn)(const struct ops_attn *a, int t, int h0, int nh, int j_begin,
                             int j_end, float *part, size_t part_stride);

typedef void (*attn_tokens_fn)(const struct ops_attn *a, int t0, int nt, int h0, int nh);

/* The build of attn_unit for this CPU. */
static attn_unit_fn attn_unit_pick(void)
{
    if (cpu_isa_best() >= CPU_ISA_AVX512)
        return ops_attn_unit_avx512;
    if (cpu_isa_best() >= CPU_ISA_AVX2)
        return ops_attn_unit_avx2;
    return attn_unit;
}

/* The build of attn_tokens for this CPU. */
static attn_tokens_fn attn_tokens_pick(void)
{
    if (cpu_isa_best() >= CPU_ISA_AVX512)
        return ops_attn_tokens_avx512;
    if (cpu_isa_best() >= CPU_ISA_AVX2)
        return ops_attn_tokens_avx2;
    return attn_tokens;
}

/* out = the chunks' parts of (t, h) combined: sum of acc e^(m - M) over sum of l e^(m - M),
 * M the largest m, in chunk order. */
static void attn_combine(const struct ops_attn *a, const float *parts, int n_chunks, int t, int h)
{
    const int hd = a->head_dim;
    const size_t stride = (size_t)hd + 2;
    const float *p = parts + ((size_t)t * a->n_head + h) * n_chunks * stride;
    float *o = a->out + ((size_t)t * a->n_head + h) * hd;
    float mx = -INFINITY, l = 0.0f;
    for (int c = 0; c < n_chunks; c++)
        mx = p[c * stride] > mx ? p[c * stride] : mx;
    for (int i = 0; i < hd; i++)
        o[i] = 0.0f;
    for (int c = 0; c < n_chunks; c++) {
        const float *pc = p + c * stride;
        if (pc[1] == 0.0f)
            continue; /* no keys in this chunk */
        float f = expf(pc[0] - mx);
        l += pc[1] * f;
        for (int i = 0; i < hd; i++)
            o[i] += pc[2 + i] * f;
    }
    if (a->sinks)
        l += expf(a->sinks[h] - mx);
    for (int i = 0; i < hd; i++)
        o[i] /= l;
}

/* Units of (query token, up to ATTN_MAX_HEADS heads of one KV head[, key chunk]), so that each
 * key and value row read serves all the heads that share it; without a split and with too few
 * units for the threads, one head per unit (the same arithmetic per head either way). */
/* Decode's partial results, per calling thread: grown to the largest split seen and kept, and
 * freed when the thread exits (a pthread key's destructor: a server's engine thread ends while
 * the process goes on). */
static _Thread_local float *parts;
static _Thread_local size_t parts_cap;
static pthread_key_t parts_key;
static pthread_once_t parts_once = PTHREAD_ONCE_INIT;

static void parts_key_make(void)
{
    pthread_key_create(&parts_key, free);
}

/* STRATA_ATTN_HEADS=N in the environment (a diagnostic, for comparisons): N query heads per
 * unit (at most the group and ATTN_MAX_HEADS), whatever the shapes and threads; each head's
 * result is the same. */
static int attn_heads_env(void)
{
    static int n = -1;
    if (n < 0) {
        const char *e = getenv("STRATA_ATTN_HEADS");
        n = e ? atoi(e) : 0;
        n = n > 0 ? n : 0;
    }
    return n;
}

void ops_attention(const struct ops_attn *a)
{
    const int group = a->n_head / a->n_head_kv, ctx = a->pos0 + a->n_tok;
    int hp = group < ATTN_MAX_HEADS ? group : ATTN_MAX_HEADS;
    int n_chunks = 1;
    if (a->n_tok * a->n_head_kv < ATTN_SPLIT_BELOW && ctx > ATTN_CHUNK) {
        n_chunks = (ctx + ATTN_CHUNK - 1) / ATTN_CHUNK;
        size_t need = (size_t)a->n_tok * a->n_head * n_chunks * ((size_t)a->head_dim + 2);
        if (need > parts_cap) {
            float *p = realloc(parts, need * sizeof(float));
            if (!p)
                n_chunks = 1; /* out of memory: unsplit, slower but right */
            else {
                parts = p;
                parts_cap = need;
                pthread_once(&parts_once, parts_key_make);
                pthread_setspecific(parts_key, p);
            }
        }
    }
    const int n_threads = omp_get_max_threads();
    if (n_chunks == 1 && a->n_tok * a->n_head_kv * ((group + hp - 1) / hp) < 2 * n_threads)
        hp = 1;
    /* split decode: fewer heads per unit until every thread has a unit (4 KV heads of 8 query
     * heads at 512 keys: 8 units of 8 heads, 16 of 4) */
    while (hp > 1 && a->n_tok * a->n_head_kv * ((group + hp - 1) / hp) * n_chunks < n_threads)
        hp = (hp + 1) / 2;
    const int forced = attn_heads_env();
    if (forced > 0) {
        hp = forced < group ? forced : group;
        hp = hp < ATTN_MAX_HEADS ? hp : ATTN_MAX_HEADS;
    }
    const int per_kv = (group + hp - 1) / hp, n = a->n_tok * a->n_head_kv * per_kv * n_chunks;
    const size_t stride = (size_t)a->head_dim + 2;
    const attn_unit_fn unit = attn_unit_pick();
    float *const buf = parts; /* thread-local to this thread: the team uses the pointer */
    /* a prompt's tokens in groups of nt (attn_tokens: each key block read once for the group),
     * as many as the sums allow while every thread still has two units; without a window, the
     * same blocks for every token */
    int nt = 1;
    if (n_chunks == 1 && a->window <= 0)
        while (nt < ATTN_TOKENS && 2 * nt * hp * a->head_dim <= ATTN_TOKEN_FLOATS &&
               (a->n_tok + 2 * nt - 1) / (2 * nt) * a->n_head_kv * per_kv >= 2 * n_threads)
            nt *= 2;
    if (nt > 1) {
        const attn_tokens_fn tokens = attn_tokens_pick();
        const int groups = (a->n_tok + nt - 1) / nt, ng = groups * a->n_head_kv * per_kv;
#pragma omp parallel for schedule(dynamic, 1)
        for (int i = 0; i < ng; i++) {
            int u = i / (a->n_head_kv * per_kv), g = i / per_kv % a->n_head_kv, c = i % per_kv;
            int h0 = g * group + c * hp, nh = group - c * hp < hp ? group - c * hp : hp;
            /* the last groups first: their tokens see the most keys */
            int t0 = (groups - 1 - u) * nt;
            tokens(a, t0, a->n_tok - t0 < nt ? a->n_tok - t0 : nt, h0, nh);
        }
        return;
    }

#pragma omp parallel
    {
#pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < n; i++) {
            int k = i % n_chunks, u = i / n_chunks;
            int t = u / (a->n_head_kv * per_kv), g = u / per_kv % a->n_head_kv, c = u % per_kv;
            int h0 = g * group + c * hp, nh = group - c * hp < hp ? group - c * hp : hp;
            int last = a->pos0 + t;
            int first = a->window > 0 && last + 1 > a->window ? last + 1 - a->window : 0;
            if (n_chunks == 1) {
                unit(a, t, h0, nh, first, last + 1, NULL, 0);
                continue;
            }
            int j0 = k * ATTN_CHUNK > first ? k * ATTN_CHUNK : first,
                j1 = (k + 1) * ATTN_CHUNK < last + 1 ? (k + 1) * ATTN_CHUNK : last + 1;
            float *part = buf + (((size_t)t * a->n_head + h0) * n_chunks + k) * stride;
            unit(a, t, h0, nh, j0, j1 > j0 ? j1 : j0, part, n_chunks * stride);
        }
        if (n_chunks > 1) {
#pragma omp for schedule(static)
            for (int i = 0; i < a->n_tok * a->n_head; i++)
                attn_combine(a, buf, n_chunks, i / a->n_head, i % a->n_head);
        }
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
