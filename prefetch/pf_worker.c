#include "pf_worker.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "cuda_mem.h"
#include "errors.h"
#include "expert_cache.h"

struct pf_worker {
    struct expert_cache *c;
    int device;
    bool threaded;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    bool busy, stop, started;
    int rc; /* the last job's error, until a settle returns it */
    unsigned long long kicked, made;
};

static void *pf_main(void *arg)
{
    struct pf_worker *w = arg;
    int dev_rc = cuda_set_device(w->device);
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->busy && !w->stop)
            pthread_cond_wait(&w->work, &w->mu);
        if (!w->busy) /* stop, nothing in flight */
            break;
        pthread_mutex_unlock(&w->mu);
        int rc = dev_rc ? dev_rc : expert_cache_run_pending(w->c);
        pthread_mutex_lock(&w->mu);
        w->rc = w->rc ? w->rc : rc;
        w->made++;
        w->busy = false;
        pthread_cond_broadcast(&w->done);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* expert_cache_settle_fn: waits for the job in flight; its error, once. */
static int pf_settle(void *ctx)
{
    struct pf_worker *w = ctx;
    if (!w->threaded)
        return 0;
    pthread_mutex_lock(&w->mu);
    while (w->busy)
        pthread_cond_wait(&w->done, &w->mu);
    int rc = w->rc;
    w->rc = 0;
    pthread_mutex_unlock(&w->mu);
    return rc;
}

int pf_worker_open(struct pf_worker **out, struct expert_cache *c, int device, bool threaded)
{
    *out = NULL;
    struct pf_worker *w = calloc(1, sizeof(*w));
    if (!w)
        return err_set(-ENOMEM, "out of memory");
    w->c = c;
    w->device = device;
    w->threaded = threaded;
    if (threaded) {
        int e = pthread_mutex_init(&w->mu, NULL);
        if (!e && (e = pthread_cond_init(&w->work, NULL)))
            pthread_mutex_destroy(&w->mu);
        if (!e && (e = pthread_cond_init(&w->done, NULL))) {
            pthread_cond_destroy(&w->work);
            pthread_mutex_destroy(&w->mu);
        }
        if (!e && (e = pthread_create(&w->thread, NULL, pf_main, w))) {
            pthread_cond_destroy(&w->done);
            pthread_cond_destroy(&w->work);
            pthread_mutex_destroy(&w->mu);
        }
        if (e) {
            free(w);
            return err_set(-e, "the prefetch worker's thread could not start");
        }
        w->started = true;
    }
    int rc = expert_cache_defer_prefetch(c, pf_settle, w);
    if (rc) {
        pf_worker_close(w);
        return rc;
    }
    *out = w;
    return 0;
}

int pf_worker_kick(struct pf_worker *w)
{
    if (!expert_cache_has_pending(w->c))
        return 0;
    w->kicked++;
    if (!w->threaded) {
        w->made++;
        return expert_cache_run_pending(w->c);
    }
    pthread_mutex_lock(&w->mu);
    w->busy = true;
    pthread_cond_signal(&w->work);
    pthread_mutex_unlock(&w->mu);
    return 0;
}

bool pf_worker_threaded(const struct pf_worker *w)
{
    return w->threaded;
}

void pf_worker_counts(const struct pf_worker *w, unsigned long long *kicked,
                      unsigned long long *made)
{
    *kicked = w ? w->kicked : 0;
    *made = w ? w->made : 0;
}

void pf_worker_close(struct pf_worker *w)
{
    if (!w)
        return;
    /* settles (a job in flight finishes, one still pending is made here) and undefers */
    (void)expert_cache_defer_prefetch(w->c, NULL, NULL);
    if (w->started) {
        pthread_mutex_lock(&w->mu);
        w->stop = true;
        pthread_cond_signal(&w->work);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
        pthread_cond_destroy(&w->done);
        pthread_cond_destroy(&w->work);
        pthread_mutex_destroy(&w->mu);
    }
    free(w);
}
