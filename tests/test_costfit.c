/* costfit: the affine cost (seconds = fixed + x / rate) learned online.
 * - exact samples of three sizes give the line back (rate and fixed to 1e-9);
 * - samples of one size only, and samples whose line would cross zero below x = 0, fit through
 *   the origin; samples of zero seconds (a clock too coarse) and of zero size teach nothing;
 * - noisy samples (each time off by up to 5%, seeded): the fit's time for every size sampled is
 *   within 25% of the true one (the worst over seeds 1-3000 was 15.2%; the default seed is
 *   fixed);
 * - the disk changes speed: after 200 samples at the new rate the fit follows it (old samples'
 *   weight 0.95^200 = 3.5e-5). */
#include <math.h>

#include "costfit.h"
#include "rng.h"
#include "testutil.h"

#define MB 1048576.0

int main(void)
{
    struct costfit f;
    double rate, fixed;

    costfit_init(&f, 0.95);
    CHECK(!costfit_get(&f, &rate, &fixed) && costfit_seconds(&f, MB) < 0, "an empty fit");
    costfit_add(&f, 0, 1e-3);
    costfit_add(&f, MB, 0);
    costfit_add(&f, -MB, 1e-3);
    CHECK(!costfit_get(&f, &rate, &fixed), "zero size, zero time or a negative size taught it");

    /* exact: 1.5 GB/s and 0.3 ms a batch */
    for (int i = 0; i < 30; i++) {
        double x = (1 + i % 3) * 4 * MB;
        costfit_add(&f, x, 3e-4 + x / 1.5e9);
    }
    CHECK(costfit_get(&f, &rate, &fixed), "no fit after 30 samples");
    printf("exact: %.6g B/s + %.6g s\n", rate, fixed);
    CHECK(fabs(rate / 1.5e9 - 1) < 1e-9 && fabs(fixed - 3e-4) < 1e-9, "exact: %g B/s + %g s", rate,
          fixed);
    CHECK(fabs(costfit_seconds(&f, 10 * MB) - (3e-4 + 10 * MB / 1.5e9)) < 1e-12, "seconds");

    /* one size: through the origin */
    costfit_init(&f, 0.95);
    for (int i = 0; i < 10; i++)
        costfit_add(&f, 8 * MB, 4e-3);
    CHECK(costfit_get(&f, &rate, &fixed) && fixed == 0 && fabs(rate / (8 * MB / 4e-3) - 1) < 1e-9,
          "one size: %g B/s + %g s", rate, fixed);
    /* larger batches relatively faster (a negative intercept): through the origin */
    costfit_init(&f, 0.95);
    costfit_add(&f, 1 * MB, 1e-3);
    costfit_add(&f, 4 * MB, 5e-3);
    CHECK(costfit_get(&f, &rate, &fixed) && fixed == 0 && rate > 0,
          "negative intercept: %g B/s + %g s", rate, fixed);

    /* noisy: each time off by up to 5% */
    struct rng r;
    rng_seed(&r, test_seed("test_costfit"), 0);
    costfit_init(&f, 0.95);
    for (int i = 0; i < 400; i++) {
        double x = (1 + rng_below(&r, 16)) * MB;
        double u = 0.05 * (2.0 * rng_f32(&r) - 1.0);
        costfit_add(&f, x, (2e-4 + x / 2e9) * (1 + u));
    }
    CHECK(costfit_get(&f, &rate, &fixed), "no noisy fit");
    double worst = 0;
    for (int k = 1; k <= 16; k++) {
        double truth = 2e-4 + k * MB / 2e9, err = fabs(costfit_seconds(&f, k * MB) / truth - 1);
        worst = err > worst ? err : worst;
    }
    printf("noisy: %.4g GB/s + %.4g ms (truth 2 GB/s + 0.2 ms); worst time off by %.2f%%\n",
           rate / 1e9, fixed * 1e3, 100 * worst);
    CHECK(worst <= 0.25, "noisy: a time off by %.2f%%", 100 * worst);

    /* the rate changes from 2 to 0.5 GB/s */
    for (int i = 0; i < 200; i++) {
        double x = (1 + i % 16) * MB;
        costfit_add(&f, x, 2e-4 + x / 0.5e9);
    }
    CHECK(costfit_get(&f, &rate, &fixed), "no fit after the change");
    printf("after the change: %.4g GB/s + %.4g ms (truth 0.5 GB/s + 0.2 ms)\n", rate / 1e9,
           fixed * 1e3);
    CHECK(fabs(rate / 0.5e9 - 1) < 0.01, "the fit did not follow the new rate: %g", rate);
    return test_finish("test_costfit");
}
