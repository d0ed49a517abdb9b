/* strata_mtp: the model's own multi-token-prediction block as a draft source (include/strata.h,
 * strata_mtp; the state it keeps on the stream is runtime/mtp.h's). */
#include <stdlib.h>

#include "clock.h"
#include "errors.h"
#include "mtp.h"
#include "strata.h"
#include "strata_priv.h"
#include "stream.h"

struct strata_mtp {
    struct stream *s; /* the stream it drafts for (its MTP state lives there) */
    double seconds;   /* in strata_mtp_draft */
};

int strata_mtp_open(struct strata_stream *st, struct strata_mtp **out)
{
    struct strata_mtp *d = calloc(1, sizeof(*d));
    int rc;

    if (!d)
        return err_set(-ENOMEM, "out of memory");
    if ((rc = mtp_open(st->st))) {
        free(d);
        return rc;
    }
    d->s = st->st;
    *out = d;
    return 0;
}

void strata_mtp_close(struct strata_mtp *d)
{
    if (!d)
        return;
    mtp_close(d->s);
    free(d);
}

int strata_mtp_draft(void *mtp, const int32_t *hist, int n_hist, int k, int32_t *out)
{
    struct strata_mtp *d = mtp;
    if (n_hist < 1 || k < 1)
        return 0;
    double t0 = clock_now_s();
    int n = mtp_draft(d->s, hist[n_hist - 1], k, out);
    d->seconds += clock_now_s() - t0;
    return n > 0 ? n : 0;
}

void strata_mtp_stats(const struct strata_mtp *d, long long *n_rows, double *seconds)
{
    *n_rows = d->s->mtp ? d->s->mtp->n_rows : 0;
    *seconds = d->seconds;
}
