/* costfit: an affine cost learned online (costfit.h). */
#include "costfit.h"

#define CF_UNIT 1048576.0 /* x is kept in MiB-sized units so that x^2 sums stay well scaled */

void costfit_init(struct costfit *f, double keep)
{
    *f = (struct costfit){.keep = keep > 0 && keep <= 1 ? keep : 0.95};
}

void costfit_add(struct costfit *f, double x, double seconds)
{
    if (!(x > 0) || !(seconds > 0))
        return;
    x /= CF_UNIT;
    f->w = f->w * f->keep + 1;
    f->sx = f->sx * f->keep + x;
    f->sy = f->sy * f->keep + seconds;
    f->sxx = f->sxx * f->keep + x * x;
    f->sxy = f->sxy * f->keep + x * seconds;
    f->n++;
}

bool costfit_get(const struct costfit *f, double *rate, double *fixed)
{
    if (f->n == 0 || !(f->sx > 0))
        return false;
    double mx = f->sx / f->w, my = f->sy / f->w;
    double vx = f->sxx / f->w - mx * mx, cxy = f->sxy / f->w - mx * my;
    /* a slope needs sizes that differ by more than rounding: a relative spread above 1e-3 */
    if (vx > 1e-6 * mx * mx && cxy > 0) {
        double slope = cxy / vx, icpt = my - slope * mx;
        if (icpt >= 0) {
            *rate = CF_UNIT / slope;
            *fixed = icpt;
            return true;
        }
    }
    /* through the origin: seconds = x / rate */
    double slope = f->sxy / f->sxx;
    if (!(slope > 0))
        slope = my > 0 ? my / mx : 1e-12;
    *rate = CF_UNIT / slope;
    *fixed = 0;
    return true;
}

double costfit_seconds(const struct costfit *f, double x)
{
    double rate, fixed;
    if (!costfit_get(f, &rate, &fixed))
        return -1;
    return fixed + x / rate;
}
