/* strata_batch: lockstep batches in the public API (include/strata.h) over stream_batch
 * (stream.h). */
#include <errno.h>
#include <stdlib.h>

#include "errors.h"
#include "strata.h"
#include "model.h"
#include "strata_priv.h"
#include "stream.h"

struct strata_batch {
    struct strata *s;
    struct stream_batch *bt;
    struct stream **ss; /* (max_n) scratch: the engine streams of a step */
};

int strata_batch_open(struct strata *s, int max_streams, struct strata_batch **out)
{
    return strata_batch_open_rows(s, max_streams, max_streams, out);
}

int strata_batch_open_rows(struct strata *s, int max_streams, int max_rows,
                           struct strata_batch **out)
{
    struct strata_batch *b;
    int rc;

    if (!s->backend)
        return err_set(-EINVAL, "strata_batch_open: the engine is not started");
    b = calloc(1, sizeof(*b));
    if (!b)
        return err_set(-ENOMEM, "out of memory");
    b->s = s;
    b->ss = calloc((size_t)(max_streams > 0 ? max_streams : 1), sizeof(*b->ss));
    rc = b->ss ? stream_batch_open(s->backend, max_streams, max_rows, &b->bt)
               : err_set(-ENOMEM, "out of memory");
    if (rc) {
        free(b->ss);
        free(b);
        return rc;
    }
    *out = b;
    return 0;
}

void strata_batch_close(struct strata_batch *b)
{
    if (!b)
        return;
    stream_batch_close(b->bt);
    free(b->ss);
    free(b);
}

int strata_batch_eval(struct strata_batch *b, struct strata_stream *const *sts, int n,
                      const int32_t *ids, float *logits)
{
    return strata_batch_eval_chunks(b, sts, NULL, n, ids, logits);
}

static int batch_check(struct strata_batch *b, struct strata_stream *const *sts, const int *n_tok,
                       int n, const int32_t *ids);

int strata_batch_eval_chunks(struct strata_batch *b, struct strata_stream *const *sts,
                             const int *n_tok, int n, const int32_t *ids, float *logits)
{
    int rc = batch_check(b, sts, n_tok, n, ids);
    return rc ? rc : stream_batch_eval(b->bt, b->ss, n_tok, n, ids, logits);
}

int strata_batch_eval_rows(struct strata_batch *b, struct strata_stream *const *sts,
                           const int *n_tok, int n, const int32_t *ids, float *logits)
{
    int rc = batch_check(b, sts, n_tok, n, ids);
    return rc ? rc : stream_batch_eval_rows(b->bt, b->ss, n_tok, n, ids, logits);
}

/* The arguments of a step, and b->ss filled with the engine streams. 0 or -errno. */
static int batch_check(struct strata_batch *b, struct strata_stream *const *sts, const int *n_tok,
                       int n, const int32_t *ids)
{
    const struct model_hparams *hp = &b->s->model->hp;
    int rows = 0;
    if (n < 1 || n > b->bt->max_streams)
        return err_set(-EINVAL, "strata_batch_eval: %d streams (1..%d)", n, b->bt->max_streams);
    for (int i = 0; i < n; i++) {
        int t = n_tok ? n_tok[i] : 1;
        if (sts[i]->s != b->s)
            return err_set(-EINVAL, "strata_batch_eval: stream %d is of another model", i);
        if (t < 1 || t > b->bt->max_n - rows)
            return err_set(-EINVAL, "strata_batch_eval: %d tokens of stream %d after %d (at most "
                                    "%d in a step)", t, i, rows, b->bt->max_n);
        for (int j = rows; j < rows + t; j++)
            if (ids[j] < 0 || (uint32_t)ids[j] >= hp->n_vocab)
                return err_set(-EINVAL, "strata_batch_eval: token %d of stream %d is outside "
                                        "the vocabulary (%u)", ids[j], i, hp->n_vocab);
        rows += t;
        b->ss[i] = sts[i]->st;
    }
    return 0;
}
