/* cuda_devcache's kernel against its scalar reference (cuda_devcache_ref.h) on random
 * state and random calls: 3 layers of 64 experts whose parts have odd strides, 40 slots spread
 * over the layers' lists (some pinned), calls of 1 to 64 pairs with repeats and bad ids, a third
 * of them predictions (prefetch = 1, by 7 blocks; the others by the default grid). Half the
 * predictions only list their copies as the layer's batch (by one block, as the cache runs
 * them); cuda_devcache_copy makes the batch at once or later, so that calls of the layer in
 * between find their prefetched experts still to copy and copy them themselves (a closing
 * round per layer makes sure of 12 such hits). After
 * every call the device's slot map, owners, stamps, clock, use counts, table, copy list, batches,
 * pending slots and counters equal the reference's, and the slots hold the bytes the copies
 * brought. Every sixth call is a real one that selects its 1 to 8 experts from router logits
 * (half of them on a grid, so that logits tie): the ids the kernel writes equal
 * moe_route_softmax_topk's and its weights cuda_softmax_topk's bits. Exits 77 without a GPU. */
#include <stdlib.h>
#include <string.h>

#include "cuda_devcache.h"
/* the reference runs on host copies of the state whose slot pointers are device memory: it
 * moves no bytes, the slots are checked against the host data instead */
#define DEVCACHE_REF_COPY_BYTES(dst, src, n) ((void)(dst), (void)(src), (void)(n))
#include "cuda_devcache_ref.h"
#include "cuda_mem.h"
#include "cuda_ops.h"
#include "moe.h"
#include "testutil.h"

#define NL 3
#define NE 64
#define NS 40
#define CALLS 300

static const uint64_t stride[3] = {16 * 1500 + 16, 33000 + 5, 16 * 2100}; /* odd and even */

struct state {
    int32_t slot_of[NL * NE], owner[NS], list[NS];
    uint8_t pf[NS];
    uint32_t stamp[NS], clock[NL], freq[NL * NE];
    void *tab[NL * 3 * NE];
    unsigned long long stats[NL * DEVCACHE_NSTAT];
    struct cuda_devcache_job jobs[3 * NE];
    uint32_t n_jobs[2];
    uint32_t sync;
    int32_t pend[NS];
    struct cuda_devcache_job bjobs[NL][3 * NE]; /* each layer's prefetch batch */
    uint32_t bn_jobs[NL][2], claim[NL][3 * NE], done[NL][3 * NE];
};

static uint64_t expert_bytes(void)
{
    return stride[0] + stride[1] + stride[2];
}

int main(void)
{
    struct rng r;
    if (!test_gpu_available("test_cuda_devcache"))
        return TEST_SKIP;
    rng_seed(&r, test_seed("test_cuda_devcache"), 5);
    uint64_t off[3] = {0, 0, 0};
    off[1] = (stride[0] + 255) / 256 * 256;
    off[2] = off[1] + (stride[1] + 255) / 256 * 256;
    uint64_t slot_bytes = off[2] + (stride[2] + 255) / 256 * 256;
    size_t host_bytes = (size_t)NL * NE * expert_bytes();
    void *host = NULL, *mapped = NULL;
    uint8_t *slots = NULL;
    struct state *h = calloc(1, sizeof(*h)), *d = NULL, *back = calloc(1, sizeof(*back));
    int32_t *ids_d = NULL, ids[64];
    float logits[NE], sel_w[64], *logits_d = NULL, *w_d = NULL;
    int n_select = 0;
    if (!h || !back || cuda_host_alloc(&host, host_bytes, &mapped) ||
        cuda_malloc((void **)&slots, (size_t)NS * slot_bytes) ||
        cuda_malloc((void **)&d, sizeof(*d)) || cuda_malloc((void **)&ids_d, sizeof(ids)) ||
        cuda_malloc((void **)&logits_d, sizeof(logits)) ||
        cuda_malloc((void **)&w_d, sizeof(float) * 64)) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    uint8_t *hb = host;
    for (size_t i = 0; i < host_bytes; i++)
        hb[i] = (uint8_t)rng_below(&r, 256);
    /* each layer's parts: gate of every expert, then up, then down */
    const uint8_t *lay_mapped[NL][3];
    for (int l = 0; l < NL; l++) {
        const uint8_t *base = (const uint8_t *)mapped + (size_t)l * NE * expert_bytes();
        lay_mapped[l][0] = base;
        lay_mapped[l][1] = base + NE * stride[0];
        lay_mapped[l][2] = base + NE * (stride[0] + stride[1]);
    }
    uint8_t *slot_ptr_h[NS], **slot_ptr_d = NULL;
    for (int s = 0; s < NS; s++)
        slot_ptr_h[s] = slots + (size_t)s * slot_bytes;
    CHECK(cuda_malloc((void **)&slot_ptr_d, sizeof(slot_ptr_h)) == 0, "slot pointers");
    cuda_h2d(slot_ptr_d, slot_ptr_h, sizeof(slot_ptr_h), NULL);
    /* lists: 13, 13, 14 slots in a shuffled order; a few experts resident, two pinned */
    int perm[NS], at[NL] = {0, 13, 26}, n_list[NL] = {13, 13, 14};
    for (int s = 0; s < NS; s++)
        perm[s] = s;
    for (int s = NS - 1; s > 0; s--) {
        int j = (int)rng_below(&r, (uint64_t)s + 1), t = perm[s];
        perm[s] = perm[j], perm[j] = t;
    }
    for (int i = 0; i < NL * NE; i++)
        h->slot_of[i] = -1;
    for (int l = 0; l < NL; l++) {
        h->clock[l] = 40 + 3 * (uint32_t)l; /* use counts halve within the first calls */
        for (int e = 0; e < NE; e++)
            for (int p = 0; p < 3; p++)
                h->tab[(l * 3 + p) * NE + e] = (void *)(lay_mapped[l][p] + (uint64_t)e * stride[p]);
        for (int i = 0; i < n_list[l]; i++) {
            int s = perm[at[l] + i];
            h->list[at[l] + i] = s;
            h->owner[s] = -1;
            if (i < 5) { /* resident, with its bytes in place */
                int e = 7 * i + l;
                h->owner[s] = e;
                h->slot_of[l * NE + e] = s;
                h->stamp[s] = i < 2 ? CUDA_DEVCACHE_PINNED : 1;
                for (int p = 0; p < 3; p++) {
                    h->tab[(l * 3 + p) * NE + e] = slot_ptr_h[s] + off[p];
                    cuda_h2d(slot_ptr_h[s] + off[p],
                             (const uint8_t *)host + (lay_mapped[l][p] - (const uint8_t *)mapped) +
                                 (uint64_t)e * stride[p],
                             stride[p], NULL);
                }
            }
        }
    }
    cuda_h2d(d, h, sizeof(*h), NULL);
    cuda_stream_sync(NULL);
    /* a layer's batch not yet copied, and whether a call of the layer ran since its listing */
    int batch_pending[NL] = {0}, consumed[NL] = {0}, n_listed = 0, n_late = 0;
#define RUN_BATCH(l)                                                                               \
    do {                                                                                           \
        devcache_ref_copy_batch(h->bjobs[l], h->bn_jobs[l], h->claim[l], h->done[l]);              \
        CHECK(cuda_devcache_copy(d->bjobs[l], d->bn_jobs[l], d->claim[l], d->done[l], 3, NULL) ==  \
                  0,                                                                               \
              "batch copy launch failed");                                                         \
        batch_pending[l] = consumed[l] = 0;                                                        \
    } while (0)
    int bad_state = 0, bad_bytes = 0;
    unsigned long long copies = 0, inplace = 0;
    int last_n[NL] = {0}, all_hit = 0, pred_n[NL] = {0};
    int32_t last_ids[NL][64], pred_ids[NL][64]; /* the last real call's; the last listing's */
    /* CALLS random calls, then for each layer: a call of no valid id (every slot's stamp below
     * the next call's), a listing of four experts no slot holds (four victims: 11 slots or more
     * of each list are not pinned) and the layer's call of them before the batch's copy launch:
     * 12 hits on pending slots whatever the seed */
    for (int call = 0; call < CALLS + 3 * NL && !bad_state; call++) {
        const int closing = call >= CALLS ? call - CALLS : -1, step = closing % 3;
        int l = (int)rng_below(&r, NL);
        int prefetch = rng_below(&r, 3) == 0; /* a prediction for the layer's next call */
        int list_only = prefetch && rng_below(&r, 2);
        const bool select = closing < 0 && call % 6 == 1; /* selected from router logits */
        if (select)
            prefetch = list_only = 0;
        if (closing >= 0) {
            l = closing / 3;
            prefetch = list_only = step == 1;
        }
        /* the cache's order: a listing follows the previous batch's copies, and a second call
         * of the layer after one listing waits for them */
        if (batch_pending[l] && (list_only || consumed[l]))
            RUN_BATCH(l);
        int n = 1 + (int)rng_below(&r, call % 10 == 0 ? 64 : 8);
        if (select) { /* 1 to 8 experts; half the time on a grid, so that logits tie */
            n = 1 + (int)rng_below(&r, 8);
            const bool grid = rng_below(&r, 2);
            for (int e = 0; e < NE; e++) {
                logits[e] = 2.0f * ((float)rng_below(&r, 1u << 20) / (float)(1u << 20)) - 1.0f +
                            (e < 16 ? 1.0f : 0.0f); /* low ids more often */
                logits[e] = grid ? roundf(logits[e] * 4.0f) / 4.0f : logits[e];
            }
            moe_route_softmax_topk(logits, 1, NE, n, ids, sel_w);
        } else if (closing >= 0 && step == 0) {
            n = 1;
            ids[0] = -1;
        } else if (!prefetch && batch_pending[l] && !consumed[l] &&
                   (closing >= 0 || rng_below(&r, 2))) {
            n = pred_n[l]; /* the prediction was right: its experts may still be copying */
            memcpy(ids, pred_ids[l], sizeof(int32_t) * (size_t)n);
        } else if (closing >= 0) { /* the listing: four experts in no slot */
            n = 0;
            for (int e = 0; e < NE && n < 4; e++)
                if (h->slot_of[l * NE + e] < 0)
                    ids[n++] = e;
        } else if (last_n[l] && rng_below(&r, 4) == 0) { /* the layer's last ids again: all hit */
            n = last_n[l];
            memcpy(ids, last_ids[l], sizeof(int32_t) * (size_t)n);
        } else {
            for (int i = 0; i < n; i++) /* skewed: low ids more often; now and then a bad one */
                ids[i] = rng_below(&r, 50) == 0
                             ? (rng_below(&r, 2) ? -1 : NE + 3)
                             : (int32_t)(rng_below(&r, NE) * rng_below(&r, NE) / NE);
        }
        if (list_only) {
            pred_n[l] = n;
            memcpy(pred_ids[l], ids, sizeof(int32_t) * (size_t)n);
        }
        if (!prefetch) {
            last_n[l] = n;
            memcpy(last_ids[l], ids, sizeof(int32_t) * (size_t)n);
        }
        bool hit_all = true; /* the kernel's shortcut: every valid id resident */
        for (int i = 0; i < n; i++)
            hit_all &= ids[i] < 0 || ids[i] >= NE || h->slot_of[l * NE + ids[i]] >= 0;
        all_hit += hit_all;
        cuda_h2d(ids_d, ids, sizeof(int32_t) * (size_t)n, NULL);
        struct cuda_devcache_call a = {
            .n_pairs = n,
            .n_expert = NE,
            .n_list = n_list[l],
            .prefetch = prefetch,
            .list_only = list_only,
            .slot_ptr = slot_ptr_d,
            .by_recency = call % 7 == 3,       /* now and then the comparisons' victim rule */
            .gate = prefetch && call % 3 == 1, /* admissions by use count now and then */
        };
        for (int p = 0; p < 3; p++) {
            a.mapped[p] = lay_mapped[l][p];
            a.stride[p] = stride[p];
            a.off[p] = off[p];
        }
        /* the reference on the host copy, the kernels on the device one */
        struct cuda_devcache_call ah = a, ad = a;
        uint8_t *ref_slot_ptr[NS];
        memcpy(ref_slot_ptr, slot_ptr_h, sizeof(ref_slot_ptr));
        ah.ids = ids, ah.slot_of = h->slot_of + l * NE, ah.list = h->list + at[l];
        ah.owner = h->owner, ah.stamp = h->stamp, ah.clock = h->clock + l;
        ah.freq = h->freq + l * NE;
        ah.tab = h->tab + l * 3 * NE, ah.slot_ptr = ref_slot_ptr;
        ah.stats = h->stats + l * DEVCACHE_NSTAT, ah.jobs = h->jobs, ah.n_jobs = h->n_jobs;
        ah.pf = h->pf;
        ah.pend = h->pend, ah.pf_jobs = h->bjobs[l], ah.pf_claim = h->claim[l];
        ah.pf_done = h->done[l];
        if (list_only)
            ah.jobs = h->bjobs[l], ah.n_jobs = h->bn_jobs[l];
        if (batch_pending[l] && !prefetch)
            for (int i = 0; i < n; i++) /* a hit on a slot of the batch not copied yet */
                n_late += ids[i] >= 0 && ids[i] < NE && h->slot_of[l * NE + ids[i]] >= 0 &&
                          h->pend[h->slot_of[l * NE + ids[i]]];
        devcache_ref_lookup(&ah); /* its copies: the bytes are checked in the slots below */
        ad.ids = ids_d, ad.slot_of = d->slot_of + l * NE, ad.list = d->list + at[l];
        ad.owner = d->owner, ad.stamp = d->stamp, ad.clock = d->clock + l;
        ad.freq = d->freq + l * NE;
        ad.tab = d->tab + l * 3 * NE;
        ad.stats = d->stats + l * DEVCACHE_NSTAT, ad.jobs = d->jobs, ad.n_jobs = d->n_jobs;
        ad.pf = d->pf, ad.sync = &d->sync;
        ad.pend = d->pend, ad.pf_jobs = d->bjobs[l], ad.pf_claim = d->claim[l];
        ad.pf_done = d->done[l];
        if (list_only)
            ad.jobs = d->bjobs[l], ad.n_jobs = d->bn_jobs[l];
        if (select) { /* the kernel selects from the logits: ids_d is its output */
            cuda_h2d(logits_d, logits, sizeof(logits), NULL);
            test_dev_poison(ids_d, sizeof(ids));
            ad.logits = logits_d, ad.ids_w = ids_d, ad.w_w = w_d;
        }
        int rc = cuda_devcache_run(&ad, list_only ? 1 : prefetch ? 7 : 0, NULL);
        if (select && rc == 0) { /* ids exactly the router's; weights the top-k kernel's bits */
            int32_t got[64], want_ids[64];
            float w_got[64], w_want[64];
            struct cuda_topk_args tk = {logits_d, 1, NE, n, ids_d + 32, w_d + 32, NULL};
            rc = cuda_softmax_topk(&tk);
            rc = rc ? rc : cuda_d2h(got, ids_d, sizeof(int32_t) * (size_t)n, NULL);
            rc = rc ? rc : cuda_d2h(w_got, w_d, sizeof(float) * (size_t)n, NULL);
            rc = rc ? rc : cuda_d2h(want_ids, ids_d + 32, sizeof(int32_t) * (size_t)n, NULL);
            rc = rc ? rc : cuda_d2h(w_want, w_d + 32, sizeof(float) * (size_t)n, NULL);
            rc = rc ? rc : cuda_stream_sync(NULL);
            const bool ok = !memcmp(got, ids, sizeof(int32_t) * (size_t)n) &&
                            !memcmp(want_ids, ids, sizeof(int32_t) * (size_t)n) &&
                            !memcmp(w_got, w_want, sizeof(float) * (size_t)n);
            n_select++;
            CHECK(rc == 0 && ok, "call %d: the selection from the logits differs", call);
        }
        if (list_only) {
            n_listed++;
            batch_pending[l] = 1, consumed[l] = 0;
            if (closing < 0 && rng_below(&r, 2)) /* copied at once, or left for later calls */
                RUN_BATCH(l);
        } else if (batch_pending[l]) {
            consumed[l] = 1;
        }
        rc = rc ? rc : cuda_d2h(back, d, sizeof(*back), NULL);
        rc = rc ? rc : cuda_stream_sync(NULL);
        CHECK(rc == 0, "call %d: launch failed", call);
        if (rc)
            break;
        /* job lists compare entry by entry up to the count (the rest is stale scratch) */
        bool same = !memcmp(back->slot_of, h->slot_of, sizeof(h->slot_of)) &&
                    !memcmp(back->owner, h->owner, sizeof(h->owner)) &&
                    !memcmp(back->pf, h->pf, sizeof(h->pf)) &&
                    !memcmp(back->stamp, h->stamp, sizeof(h->stamp)) &&
                    !memcmp(back->clock, h->clock, sizeof(h->clock)) &&
                    !memcmp(back->freq, h->freq, sizeof(h->freq)) &&
                    !memcmp(back->tab, h->tab, sizeof(h->tab)) &&
                    !memcmp(back->stats, h->stats, sizeof(h->stats)) &&
                    !memcmp(back->n_jobs, h->n_jobs, sizeof(h->n_jobs)) &&
                    !memcmp(back->jobs, h->jobs, sizeof(h->jobs[0]) * h->n_jobs[0]) &&
                    !memcmp(back->pend, h->pend, sizeof(h->pend)) &&
                    !memcmp(back->bn_jobs, h->bn_jobs, sizeof(h->bn_jobs));
        for (int k = 0; k < NL && same; k++)
            same =
                !memcmp(back->bjobs[k], h->bjobs[k], sizeof(h->bjobs[k][0]) * h->bn_jobs[k][0]) &&
                !memcmp(back->done[k], h->done[k], sizeof(h->done[k][0]) * h->bn_jobs[k][0]);
        if (!same) {
            bad_state++;
            CHECK(0,
                  "call %d (layer %d, %d pairs): the kernel's state differs from the "
                  "reference's",
                  call, l, n);
        }
        copies += (list_only ? h->bn_jobs[l][0] : h->n_jobs[0]) / 3;
    }
    for (int l = 0; l < NL; l++)
        if (batch_pending[l])
            RUN_BATCH(l);
    cuda_stream_sync(NULL);
    /* every resident expert's slot holds its bytes */
    uint8_t *buf = malloc(slot_bytes);
    for (int l = 0; l < NL && buf; l++)
        for (int e = 0; e < NE; e++) {
            int s = h->slot_of[l * NE + e];
            if (s < 0)
                continue;
            cuda_d2h(buf, slot_ptr_h[s], slot_bytes, NULL);
            cuda_stream_sync(NULL);
            for (int p = 0; p < 3; p++) {
                const uint8_t *want = (const uint8_t *)host +
                                      (lay_mapped[l][p] - (const uint8_t *)mapped) +
                                      (uint64_t)e * stride[p];
                bad_bytes += memcmp(buf + off[p], want, stride[p]) != 0;
            }
        }
    for (int l = 0; l < NL; l++)
        inplace += h->stats[l * DEVCACHE_NSTAT + DEVCACHE_BYTES_INPLACE] / expert_bytes();
    printf("test_cuda_devcache: %d calls: state equal to the reference's after each; %llu "
           "experts copied, %llu read in place; %d slot parts with wrong bytes\n",
           CALLS, copies, inplace, bad_bytes);
    CHECK(bad_bytes == 0, "%d slot parts hold wrong bytes", bad_bytes);
    unsigned long long pf = 0, pf_used = 0, wasted = 0;
    for (int l = 0; l < NL; l++) {
        pf += h->stats[l * DEVCACHE_NSTAT + DEVCACHE_PF_ADMITTED];
        pf_used += h->stats[l * DEVCACHE_NSTAT + DEVCACHE_PF_USED];
        wasted += h->stats[l * DEVCACHE_NSTAT + DEVCACHE_PF_WASTED_BYTES];
    }
    printf("test_cuda_devcache: %llu prefetched, %llu of them used, %llu wasted\n", pf, pf_used,
           wasted / expert_bytes());
    printf("test_cuda_devcache: %d calls hit every expert; %d batches listed, %d hits on a "
           "batch's slot before its copy launch\n",
           all_hit, n_listed, n_late);
    printf("test_cuda_devcache: %d calls selected their experts from router logits, ids and "
           "weights equal to the router's\n",
           n_select);
    CHECK(n_listed >= 10 && n_late >= 10, "the batches were not exercised");
    CHECK(n_select == CALLS / 6, "%d calls selected from logits, not %d", n_select, CALLS / 6);
    CHECK(copies > 100 && inplace > 0, "the calls did not exercise eviction and in-place reads");
    CHECK(all_hit >= CALLS / 20, "only %d calls hit every expert", all_hit);
    CHECK(pf > 0 && pf_used > 0 && wasted > 0, "the predictions did not exercise every counter");
    for (int l = 0; l < NL; l++) /* pinned experts never left */
        for (int i = 0; i < 2; i++)
            CHECK(h->slot_of[l * NE + 7 * i + l] >= 0, "pinned expert %d of layer %d evicted",
                  7 * i + l, l);
    free(buf);
    free(h);
    free(back);
    cuda_free(d);
    cuda_free(slots);
    cuda_free(ids_d);
    cuda_free(logits_d);
    cuda_free(w_d);
    cuda_free(slot_ptr_d);
    cuda_host_free(host);
    return test_finish("test_cuda_devcache");
}
