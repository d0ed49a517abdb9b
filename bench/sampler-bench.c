/* The sampler's time per token over Qwen3's vocabulary (151936 logits ~ N(0, SD^2)) for the
 * default chain (top-k 40, top-p 0.95, min-p 0.05) and with top-k off. Build and run from the
 * repository root (bench/sampler.md):
 *   gcc -O2 -Iruntime -o /tmp/sampler-bench bench/sampler-bench.c runtime/sampler.c \
 *       runtime/errors.c -lm && /tmp/sampler-bench 3
 * The number after each time is the sum of the sampled ids: equal sums, equal choices. */
#include "sampler.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static float gauss(void)
{
    double u = (rand() + 1.0) / (RAND_MAX + 2.0), v = (rand() + 1.0) / (RAND_MAX + 2.0);
    return (float)(sqrt(-2 * log(u)) * cos(6.2831853 * v));
}
int main(int argc, char **argv)
{
    int n = 151936;
    float *l = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * n);
    float sd = argc > 1 ? atof(argv[1]) : 3.0f;
    srand(1);
    for (int i = 0; i < n; i++)
        l[i] = sd * gauss();
    int ks[] = {40, 0, 0, 0};
    float ps[] = {0.95f, 0.95f, 1.0f, 0.9f};
    float mp[] = {0.05f, 0.05f, 0.05f, 0.0f};
    for (int c = 0; c < 4; c++) {
        struct sampler_config cfg = sampler_config_default();
        cfg.top_k = ks[c];
        cfg.top_p = ps[c];
        cfg.min_p = mp[c];
        struct sampler s;
        sampler_init(&s, &cfg, n);
        double t0 = now();
        int reps = 20;
        long acc = 0;
        for (int r = 0; r < reps; r++) {
            for (int i = 0; i < n; i++)
                w[i] = l[i];
            acc += sampler_sample(&s, w);
        }
        printf("sd %.1f top_k %d top_p %.2f min_p %.2f: %.3f ms per token (%ld)\n", sd, ks[c],
               ps[c], mp[c], (now() - t0) / reps * 1e3, acc);
        sampler_free(&s);
    }
}
