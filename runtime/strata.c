/* strata: the public API (include/strata.h) over the engine. A struct strata is a model
 * (core/model.h) and one backend (runtime/backend.h) configured from struct strata_config; a
 * struct strata_stream wraps a struct stream (runtime/stream.h). Tokens go through
 * core/tokenizer.h, sampling through core/sampler.h, generation through runtime/generate.h.
 * Messages are core/errors.h's: strata_error() is err_msg().
 */
#include "strata.h"
#include "strata_internal.h"

#include <omp.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arch.h"
#include "backend.h"
#include "backend_profile.h"
#include "budget.h"
#include "clock.h"
#include "cuda_info.h"
#include "cuda_mem.h"
#include "disk_tier.h"
#include "errors.h"
#include "generate.h"
#include "gguf.h"
#include "model.h"
#include "model_arch.h"
#include "sampler.h"
#include "strata_priv.h"
#include "stream.h"
#include "sysinfo.h"
#include "tokenizer.h"
#include "topo.h"

_Static_assert(STRATA_MAX_STOP == GENERATE_MAX_STOP, "stop strings: strata.h and generate.h");

struct strata_sampler {
    struct sampler smp;
};

static _Thread_local enum strata_step strata_last_step;

static int strata_fail(enum strata_step step, int rc)
{
    strata_last_step = step;
    return rc;
}

enum strata_step strata_failed_step(void)
{
    return strata_last_step;
}

const char *strata_error(void)
{
    return err_msg();
}

void strata_config_init(struct strata_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->device = STRATA_DEVICE_CPU;
    cfg->placement = STRATA_PLACEMENT_AUTO;
    cfg->cpu_moe_layers = -1;
    cfg->fill = STRATA_FILL_COPY;
    cfg->n_ctx = 4096;
    cfg->n_streams = 1;
    cfg->n_batch = 512;
}

/* Options that only the CUDA backend has. */
static bool strata_config_needs_gpu(const struct strata_config *cfg)
{
    return cfg->vram_budget || cfg->expert_slots > 0 || cfg->placement == STRATA_PLACEMENT_HYBRID ||
           cfg->placement == STRATA_PLACEMENT_STATIC;
}

static int strata_config_check(const struct strata_config *cfg)
{
    if (!cfg->model_path)
        return err_set(-EINVAL, "strata_config: model_path is required");
    if (cfg->host_budget && cfg->device != STRATA_DEVICE_CPU &&
        cfg->placement != STRATA_PLACEMENT_STATIC && cfg->fill != STRATA_FILL_COPY)
        return err_set(-ENOTSUP,
                       "strata_config: host_budget %llu: with a GPU the host tier serves static "
                       "placement's CPU layers and the expert cache's copy path and hybrid lane; "
                       "zero-copy misses are read from host memory at any time",
                       (unsigned long long)cfg->host_budget);
    if (cfg->host_budget && (cfg->flags & STRATA_FLAG_NO_MMAP))
        return err_set(-EINVAL, "strata_config: host_budget reads the experts from the file; "
                                "STRATA_FLAG_NO_MMAP copies them all to memory");
    if ((unsigned)cfg->device > STRATA_DEVICE_CUDA ||
        (unsigned)cfg->placement > STRATA_PLACEMENT_AUTO || (unsigned)cfg->fill > STRATA_FILL_GPU)
        return err_set(-EINVAL, "strata_config: device %d, placement %d or fill %d unknown",
                       (int)cfg->device, (int)cfg->placement, (int)cfg->fill);
    if (cfg->placement == STRATA_PLACEMENT_STATIC && cfg->cpu_moe_layers == 0)
        return err_set(-EINVAL, "strata_config: static placement of 0 layers (-1 = automatic, "
                                "or N >= 1)");
    if (cfg->n_ctx <= 0 || cfg->n_batch <= 0 || cfg->n_threads < 0 || cfg->expert_slots < 0 ||
        cfg->cuda_device < 0 || cfg->n_streams < 1 || cfg->n_streams > 4096)
        return err_set(-EINVAL,
                       "strata_config: n_ctx %d, n_batch %d and n_streams %d (up to 4096) must be "
                       "positive, n_threads %d, "
                       "expert_slots %d and cuda_device %d not negative",
                       cfg->n_ctx, cfg->n_batch, cfg->n_streams, cfg->n_threads, cfg->expert_slots,
                       cfg->cuda_device);
    if (cfg->prefetch_depth < 0 || cfg->prefetch_depth > 4)
        return err_set(-EINVAL, "strata_config: prefetch_depth %d (0..4)", cfg->prefetch_depth);
    if (cfg->prefetch_top < 0 || cfg->prefetch_top > 32)
        return err_set(-EINVAL, "strata_config: prefetch_top %d (0..32)", cfg->prefetch_top);
    if (cfg->device == STRATA_DEVICE_CPU && strata_config_needs_gpu(cfg))
        return err_set(-EINVAL, "strata_config: vram_budget, expert_slots and hybrid or static "
                                "placement need a CUDA device (device is STRATA_DEVICE_CPU)");
    return 0;
}

/* STRATA_FLAG_BIND: OpenMP threads one per physical core, near the GPU when one may be used. */
static int strata_bind(struct strata *s)
{
    struct topo *t;
    struct cuda_device_info d;
    int node = -1, rc;

    rc = topo_open(&t);
    if (rc)
        return rc;
    if (s->cfg.device != STRATA_DEVICE_CPU && cuda_device_info_get(s->cfg.cuda_device, &d) == 0)
        node = topo_pci_numa_node(t, d.pci_bus_id);
    rc = topo_bind_openmp(t, node, s->cfg.n_threads);
    topo_close(t);
    if (rc < 0)
        return rc;
    s->bound = rc;
    s->bind_node = node;
    return 0;
}

/* n_threads above the online processors is capped to their count (more threads than
 * processors only contend); 0 (OpenMP's default) stays. */
static int strata_threads_cap(int n_threads)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 && n_threads > n ? (int)n : n_threads;
}

int strata_load(const struct strata_config *cfg, struct strata **out)
{
    struct strata *s;
    int rc = strata_config_check(cfg);

    if (rc)
        return strata_fail(STRATA_STEP_CONFIG, rc);
    s = calloc(1, sizeof(*s));
    if (!s || !(s->path = strdup(cfg->model_path))) {
        free(s);
        return strata_fail(STRATA_STEP_CONFIG, err_set(-ENOMEM, "out of memory"));
    }
    s->cfg = *cfg;
    s->cfg.model_path = s->path;
    s->cfg.n_threads = strata_threads_cap(cfg->n_threads);
    s->bind_node = -1;
    struct model_open_opts mo = {.skip_mtp = (cfg->flags & STRATA_FLAG_NO_MTP) != 0};
    rc = model_open_opts(s->path, &mo, &s->model);
    if (rc) {
        strata_close(s);
        return strata_fail(STRATA_STEP_LOAD, rc);
    }
    if ((cfg->flags & STRATA_FLAG_BIND) && (rc = strata_bind(s))) {
        strata_close(s);
        return strata_fail(STRATA_STEP_BIND, rc);
    }
    if (cfg->flags & STRATA_FLAG_NO_MMAP) {
        double t0 = clock_now_s();
        rc = model_load_copy(s->model, cfg->n_threads);
        s->t_copy = clock_now_s() - t0;
        if (rc) {
            strata_close(s);
            return strata_fail(STRATA_STEP_COPY, rc);
        }
    }
    *out = s;
    return 0;
}

/* Adapts the MoE layer's routing event to the public one (the same fields). */
static void strata_route_trampoline(void *ctx, const struct moe_route_event *ev)
{
    const struct strata *s = ctx;
    const struct strata_route_event e = {
        .layer = ev->layer,
        .n_tok = ev->n_tok,
        .k = ev->k,
        .pos0 = ev->pos0,
        .ids = ev->ids,
        .weights = ev->weights,
        .in = ev->in,
    };
    s->cfg.route_observer(s->cfg.route_ctx, &e);
}

/* The CUDA backend; auto_cuda: a model that does not fit is retried under a budget of 90% of
 * the free device memory. */
/* The routed experts' bytes, the trunk's (on the CPU device, where it stays in the page
 * cache; else 0), the memory available now (the tighter of the system's and the cgroup's)
 * and the margin kept free of it (a tenth, at least 512 MiB). */
static void strata_host_sizes(const struct strata *s, uint64_t *experts, uint64_t *trunk,
                              uint64_t *avail, uint64_t *margin)
{
    uint64_t slot = 0;
    budget_model_sizes(s->model, trunk, &slot);
    *trunk = s->cuda ? 0 : *trunk;
    *experts = 0;
    for (uint32_t l = 0; l < s->model->hp.n_layer; l++) {
        const struct layer_weights *lw = &s->model->layers[l];
        *experts += lw->gate_exps.bytes + lw->up_exps.bytes + lw->down_exps.bytes;
    }
    *avail = sysinfo_mem_available();
    *margin = *avail / 10 > (512ull << 20) ? *avail / 10 : 512ull << 20;
}

/* host_budget 0 on a placement that reads experts from host memory (the CPU device, static
 * placement, the expert cache's copy path; `cache`: the CUDA backend caches experts): whether
 * the experts do not fit in the memory available, so that a tier of what does fit
 * (STRATA_HOST_BUDGET_AUTO) reads them instead of the page cache thrashing. */
static bool strata_host_tier_needed(const struct strata *s, bool cache)
{
    const struct strata_config *cfg = &s->cfg;
    if (cfg->host_budget || (cfg->flags & (STRATA_FLAG_NO_HOST_TIER | STRATA_FLAG_NO_MMAP)) ||
        s->model->copy || s->model->hp.n_expert == 0)
        return false;
    if (s->cuda && cfg->placement != STRATA_PLACEMENT_STATIC &&
        (!cache || cfg->fill != STRATA_FILL_COPY))
        return false;
    uint64_t experts, trunk, avail, margin;
    strata_host_sizes(s, &experts, &trunk, &avail, &margin);
    if (!avail || experts + trunk + margin <= avail)
        return false;
    if (cfg->log)
        fprintf(cfg->log,
                "strata: the experts (%.1f GiB) do not fit in the %.1f GiB of memory available: "
                "they are read through a host tier (--host-budget auto; --host-budget 0 keeps "
                "the mapping)\n",
                experts / 1073741824.0, avail / 1073741824.0);
    return true;
}

/* STRATA_HOST_BUDGET_AUTO: the host tier gets the memory available now, less the margin and
 * the trunk (strata_host_sizes); at most every expert. Said in the log. */
static int strata_host_budget_auto(struct strata *s)
{
    const double gib = 1073741824.0;
    uint64_t experts, trunk, avail, margin;
    strata_host_sizes(s, &experts, &trunk, &avail, &margin);
    uint64_t keep = margin + trunk;
    if (avail <= keep)
        return err_set(-ENOMEM,
                       "--host-budget auto: %.1f GiB of memory available, no more than the %.1f "
                       "GiB kept free%s: give --host-budget a size",
                       avail / gib, keep / gib, s->cuda ? "" : " and for the trunk");
    uint64_t b = avail - keep;
    /* a slot holds an expert's aligned spans: a little more than its bytes */
    uint64_t all = experts + experts / 16 + ((uint64_t)s->model->hp.n_layer << 24);
    s->cfg.host_budget = b < all ? b : all;
    if (s->cfg.log)
        fprintf(s->cfg.log,
                "strata: --host-budget auto: %.2f GiB for the host tier (%.1f GiB available, "
                "%.1f GiB kept free, %.1f GiB for the trunk)\n",
                s->cfg.host_budget / gib, avail / gib, margin / gib, s->cuda ? 0.0 : trunk / gib);
    return 0;
}

static int strata_start_cuda(struct strata *s, bool auto_cuda)
{
    const struct strata_config *cfg = &s->cfg;
    struct backend_cuda_config cc = {
        .device = cfg->cuda_device,
        .vram_budget = cfg->vram_budget,
        .n_ctx = cfg->n_ctx,
        .n_streams = cfg->n_streams,
        .max_tok = cfg->n_batch,
        .expert_slots = cfg->expert_slots,
        .residency = cfg->fill == STRATA_FILL_ZEROCOPY ? BACKEND_RESIDENCY_ZEROCOPY
                     : cfg->fill == STRATA_FILL_GPU    ? BACKEND_RESIDENCY_GPU
                                                       : BACKEND_RESIDENCY_COPY,
        .graph = cfg->flags & STRATA_FLAG_GRAPH,
        .graph_resident =
            cfg->placement == STRATA_PLACEMENT_AUTO && !(cfg->flags & STRATA_FLAG_NO_GRAPH),
        .gather_copies = cfg->flags & STRATA_FLAG_GATHER,
        .prefetch = cfg->flags & STRATA_FLAG_PREFETCH,
        .prefetch_depth = cfg->prefetch_depth,
        .prefetch_top = cfg->prefetch_top,
        .hybrid = cfg->placement == STRATA_PLACEMENT_HYBRID,
        .auto_place = cfg->placement == STRATA_PLACEMENT_AUTO,
        .hybrid_no_admit = cfg->flags & STRATA_FLAG_NO_HYBRID_ADMIT,
        .cpu_moe_layers = cfg->placement == STRATA_PLACEMENT_STATIC ? cfg->cpu_moe_layers : 0,
        .host_budget = cfg->host_budget,
        .tier_pread = cfg->flags & STRATA_FLAG_NO_URING,
        .tier_buffered = cfg->flags & STRATA_FLAG_NO_DIRECT,
        .tier_ahead = cfg->flags & STRATA_FLAG_READ_AHEAD,
        .log = cfg->log,
        .route_observer = cfg->route_observer ? strata_route_trampoline : NULL,
        .route_ctx = s,
    };
    size_t free_b = 0, total_b = 0;
    int rc;

    /* the CPU lane's OpenMP threads (backend_cpu_open does the same for the CPU backend) */
    if (cfg->n_threads > 0)
        omp_set_num_threads(cfg->n_threads);
    rc = backend_cuda_open(s->model, &cc, &s->core);

    if (rc == -ENOMEM && auto_cuda && !cc.vram_budget && cuda_mem_info(&free_b, &total_b) == 0) {
        /* the whole model does not fit: keep the trunk resident and cache experts */
        cc.vram_budget = free_b / 10 * 9;
        if (cfg->log)
            fprintf(cfg->log,
                    "strata: the model does not fit in the GPU's %.2f GiB free; running with "
                    "--vram-budget %.2f GiB (experts cached from host memory)\n",
                    free_b / 1073741824.0, cc.vram_budget / 1073741824.0);
        if (strata_host_tier_needed(s, true)) {
            s->cfg.host_budget = STRATA_HOST_BUDGET_AUTO;
            int rt = strata_host_budget_auto(s);
            if (rt)
                return rt;
            cc.host_budget = s->cfg.host_budget;
        }
        rc = backend_cuda_open(s->model, &cc, &s->core);
    }
    return rc;
}

int strata_start(struct strata *s)
{
    const struct strata_config *cfg = &s->cfg;
    const char *why = NULL;
    bool auto_cuda = false;
    int rc;

    if (s->backend)
        return strata_fail(STRATA_STEP_ENGINE, err_set(-EINVAL, "strata: already started"));
    const struct arch *arch = arch_find(s->model->arch->name);
    if (!arch)
        return strata_fail(STRATA_STEP_ENGINE,
                           err_set(-ENOTSUP, "architecture %s: loaded, but strata has no "
                                             "forward pass for it yet",
                                   s->model->arch->name));
    if (cfg->device == STRATA_DEVICE_AUTO) {
        auto_cuda = cuda_device_count(&why) > 0;
        if (!auto_cuda && strata_config_needs_gpu(cfg))
            return strata_fail(STRATA_STEP_ENGINE,
                               err_set(-ENODEV,
                                       "vram_budget, expert_slots and hybrid or static "
                                       "placement need a CUDA device: %s",
                                       why ? why : "none found"));
    }
    s->cuda = auto_cuda || cfg->device == STRATA_DEVICE_CUDA;
    if (strata_host_tier_needed(s, cfg->vram_budget || cfg->expert_slots > 0))
        s->cfg.host_budget = STRATA_HOST_BUDGET_AUTO;
    if (cfg->host_budget == STRATA_HOST_BUDGET_AUTO && (rc = strata_host_budget_auto(s)))
        return strata_fail(STRATA_STEP_ENGINE, rc);
    if (s->cuda) {
        rc = strata_start_cuda(s, auto_cuda);
    } else {
        struct backend_cpu_config bc = {
            .n_threads = cfg->n_threads,
            .host_budget = cfg->host_budget,
            .tier_pread = cfg->flags & STRATA_FLAG_NO_URING,
            .tier_buffered = cfg->flags & STRATA_FLAG_NO_DIRECT,
            .tier_ahead = cfg->flags & STRATA_FLAG_READ_AHEAD,
            .log = cfg->log,
            .route_observer = cfg->route_observer ? strata_route_trampoline : NULL,
            .route_ctx = s,
        };
        rc = backend_cpu_open(s->model, &bc, &s->core);
    }
    if (rc) {
        s->core = NULL;
        return strata_fail(STRATA_STEP_ENGINE, rc);
    }
    s->backend = s->core;
    rc = cfg->profile ? strata_restore(s) : 0;
    return rc ? strata_fail(STRATA_STEP_ENGINE, rc) : 0;
}

int strata_open(const struct strata_config *cfg, struct strata **out)
{
    struct strata *s = NULL;
    int rc = strata_load(cfg, &s);

    if (rc)
        return rc;
    rc = strata_start(s);
    if (rc) {
        strata_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

void strata_close(struct strata *s)
{
    if (!s)
        return;
    strata_restore_free(s);
    backend_close(s->backend);
    model_close(s->model);
    free(s->path);
    free(s);
}

int strata_profile_open(struct strata *s)
{
    int rc;
    if (!s->backend || s->cuda)
        return strata_fail(STRATA_STEP_ENGINE,
                           err_set(-EINVAL, "profiling needs a started CPU backend"));
    rc = backend_profile_open(s->backend, &s->backend);
    return rc ? strata_fail(STRATA_STEP_ENGINE, rc) : 0;
}

struct model *strata_model_of(struct strata *s)
{
    return s->model;
}

struct backend *strata_backend_of(struct strata *s)
{
    return s->backend;
}

struct stream *strata_stream_of(struct strata_stream *st)
{
    return st->st;
}

double strata_copy_seconds(const struct strata *s)
{
    return s->t_copy;
}

int strata_bound_threads(const struct strata *s, int *node)
{
    *node = s->bind_node;
    return s->bound;
}

void strata_model_info(const struct strata *s, struct strata_model_info *out)
{
    const struct model_hparams *hp = &s->model->hp;
    *out = (struct strata_model_info){
        .arch = s->model->arch->name,
        .n_layer = hp->n_layer,
        .n_embd = hp->n_embd,
        .n_head = hp->n_head,
        .n_head_kv = hp->n_head_kv,
        .head_dim = hp->head_dim,
        .n_expert = hp->n_expert,
        .n_expert_used = hp->n_expert_used,
        .n_ff_exp = hp->n_ff_exp,
        .n_vocab = hp->n_vocab,
        .n_ctx_train = hp->n_ctx_train,
        .device = s->cuda ? "cuda" : "cpu",
        .n_threads = omp_get_max_threads(),
        .has_tokenizer = s->model->tok != NULL,
    };
}

/* ---- tokens ------------------------------------------------------------------------------- */

int strata_tokenize(const struct strata *s, const char *text, size_t len, unsigned flags,
                    int32_t *ids, int cap)
{
    uint32_t tf = 0;

    if (!s->model->tok)
        return err_set(-ENOTSUP, "%s has no tokenizer (tokenizer.ggml.* keys)", s->path);
    if (cap < 0)
        return err_set(-EINVAL, "strata_tokenize: capacity %d", cap);
    if (flags & STRATA_TOKENIZE_SPECIAL)
        tf |= TOKENIZER_ENCODE_PARSE_SPECIAL;
    if (flags & STRATA_TOKENIZE_ADD_BOS)
        tf |= TOKENIZER_ENCODE_ADD_SPECIAL;
    return tokenizer_encode(s->model->tok, text, len, tf, ids, (size_t)cap);
}

const char *strata_token_text(const struct strata *s, int32_t id, size_t *len)
{
    if (!s->model->tok)
        return NULL;
    return (const char *)tokenizer_token_bytes(s->model->tok, id, len);
}

bool strata_token_is_eog(const struct strata *s, int32_t id)
{
    return s->model->tok && tokenizer_is_eog(s->model->tok, id);
}

/* ---- streams ------------------------------------------------------------------------------ */

/* The sizes of a stream of n_ctx tokens against the memory it would take, before anything is
 * allocated: on the CPU, the host memory available now; on CUDA the backend's budget already
 * counted the stream (backend_cuda_config's n_ctx), or the device allocation fails. */
static int strata_stream_check(const struct strata *s, int n_ctx)
{
    struct stream_size sz;
    uint64_t avail;
    int rc = stream_size_get(s->model, n_ctx, s->cfg.n_batch, &sz);

    if (rc || s->cuda)
        return rc;
    avail = sysinfo_mem_available();
    return avail ? stream_size_check_host(&sz, n_ctx, avail) : 0;
}

int strata_streams_check(const struct strata *s, int n_streams, int n_ctx)
{
    struct stream_size sz;
    const double gib = 1073741824.0;
    if (n_streams < 1 || n_ctx < 0)
        return err_set(-EINVAL, "strata_streams_check: %d streams of %d positions", n_streams,
                       n_ctx);
    n_ctx = n_ctx ? n_ctx : s->cfg.n_ctx;
    int rc = stream_size_get(s->model, n_ctx, s->cfg.n_batch, &sz);
    if (rc)
        return rc;
    double one = (double)(sz.kv_bytes + sz.arena_bytes), need = one * n_streams;
    if (s->cuda && s->cfg.vram_budget) {
        /* the budget was planned for cfg.n_streams streams of cfg.n_ctx positions */
        if (n_streams <= s->cfg.n_streams && n_ctx <= s->cfg.n_ctx)
            return 0;
        return err_set(-ENOSPC,
                       "%d streams of %d positions: --vram-budget was planned for %d of %d "
                       "(strata_config n_streams and n_ctx)",
                       n_streams, n_ctx, s->cfg.n_streams, s->cfg.n_ctx);
    }
    if (s->cuda) {
        size_t free_b = 0, total_b = 0;
        if (cuda_mem_info(&free_b, &total_b) || need <= (double)(free_b / 10 * 9))
            return 0;
        return err_set(-ENOMEM,
                       "%d streams of %d positions need %d x %.2f GiB (KV cache %.2f + activations "
                       "%.2f) = %.1f GiB, more than 90%% of the GPU's %.1f GiB free: at most %d "
                       "such streams fit",
                       n_streams, n_ctx, n_streams, one / gib, sz.kv_bytes / gib,
                       sz.arena_bytes / gib, need / gib, free_b / gib,
                       (int)((double)(free_b / 10 * 9) / one));
    }
    uint64_t avail = sysinfo_mem_available();
    if (!avail || need <= (double)(avail / 10 * 9))
        return 0;
    return err_set(-ENOMEM,
                   "%d streams of %d positions need %d x %.2f GiB (KV cache %.2f + activations "
                   "%.2f) = %.1f GiB, more than 90%% of the %.1f GiB available: at most %d "
                   "such streams fit",
                   n_streams, n_ctx, n_streams, one / gib, sz.kv_bytes / gib, sz.arena_bytes / gib,
                   need / gib, avail / gib, (int)((double)(avail / 10 * 9) / one));
}

int strata_stream_open(struct strata *s, int n_ctx, struct strata_stream **out)
{
    struct strata_stream *st;
    int rc;

    if (!s->backend)
        return err_set(-EINVAL, "strata_stream_open: the engine is not started");
    if (n_ctx < 0)
        return err_set(-EINVAL, "strata_stream_open: context %d", n_ctx);
    n_ctx = n_ctx ? n_ctx : s->cfg.n_ctx;
    rc = strata_stream_check(s, n_ctx);
    if (rc)
        return rc;
    st = calloc(1, sizeof(*st));
    if (!st)
        return err_set(-ENOMEM, "out of memory");
    st->s = s;
    rc = stream_open(s->backend, n_ctx, s->cfg.n_batch, &st->st);
    if (rc) {
        free(st);
        return rc;
    }
    *out = st;
    return 0;
}

void strata_stream_close(struct strata_stream *st)
{
    if (!st)
        return;
    stream_close(st->st);
    free(st);
}

int strata_stream_pos(const struct strata_stream *st)
{
    return st->st->pos;
}

int strata_stream_n_ctx(const struct strata_stream *st)
{
    return st->st->n_ctx;
}

int strata_stream_truncate(struct strata_stream *st, int pos)
{
    return stream_truncate(st->st, pos < 0 ? 0 : pos);
}

void strata_stream_set_progress(struct strata_stream *st, strata_progress_fn fn, void *ctx)
{
    st->st->progress = fn;
    st->st->progress_ctx = ctx;
}

/* -EINVAL (message) when n is negative or an id lies outside the vocabulary. */
static int strata_check_ids(const struct strata_stream *st, const int32_t *ids, int n)
{
    uint32_t nv = st->st->m->hp.n_vocab;
    if (n < 0 || (n > 0 && !ids))
        return err_set(-EINVAL, "strata_eval: %d ids", n);
    for (int i = 0; i < n; i++) {
        if ((uint32_t)ids[i] >= nv)
            return err_set(-EINVAL, "token id %d (at %d) is outside the vocabulary (%u)", ids[i], i,
                           nv);
    }
    return 0;
}

int strata_eval(struct strata_stream *st, const int32_t *ids, int n, float *logits)
{
    int rc = strata_check_ids(st, ids, n);
    return rc ? rc : stream_eval(st->st, ids, n, logits);
}

int strata_eval_argmax(struct strata_stream *st, const int32_t *ids, int n, int32_t *next)
{
    int rc = strata_check_ids(st, ids, n);
    return rc ? rc : stream_eval_argmax(st->st, ids, n, next);
}

/* ---- sampling and generation -------------------------------------------------------------- */

static struct sampler_config strata_sampler_config(const struct strata_sampling *p)
{
    return (struct sampler_config){
        .temperature = p->temperature,
        .top_k = p->top_k,
        .top_p = p->top_p,
        .min_p = p->min_p,
        .repeat_penalty = p->repeat_penalty,
        .repeat_last_n = p->repeat_last_n,
        .seed = p->seed,
    };
}

void strata_sampling_init(struct strata_sampling *p)
{
    struct sampler_config d = sampler_config_default();
    *p = (struct strata_sampling){
        .temperature = d.temperature,
        .top_k = d.top_k,
        .top_p = d.top_p,
        .min_p = d.min_p,
        .repeat_penalty = d.repeat_penalty,
        .repeat_last_n = d.repeat_last_n,
        .seed = d.seed,
    };
}

unsigned strata_sampling_from_model(const struct strata *s, struct strata_sampling *p)
{
    return strata_sampling_from_gguf(s && s->model ? s->model->file : NULL, p);
}

unsigned strata_sampling_from_gguf(const struct gguf_file *f, struct strata_sampling *p)
{
    unsigned set = 0;
    float x;
    int64_t n;
    if (!f || !p)
        return 0;
    /* each key where present and in the range the CLI flag takes; anything else is ignored */
    if (!gguf_get_f32(f, "general.sampling.temp", &x) && x >= 0 && x <= 100)
        p->temperature = x, set |= STRATA_SAMPLING_TEMP;
    if (!gguf_get_i64(f, "general.sampling.top_k", &n) && n >= 0 && n <= (1 << 24))
        p->top_k = (int)n, set |= STRATA_SAMPLING_TOP_K;
    if (!gguf_get_f32(f, "general.sampling.top_p", &x) && x >= 0 && x <= 1)
        p->top_p = x, set |= STRATA_SAMPLING_TOP_P;
    if (!gguf_get_f32(f, "general.sampling.min_p", &x) && x >= 0 && x <= 1)
        p->min_p = x, set |= STRATA_SAMPLING_MIN_P;
    if (!gguf_get_f32(f, "general.sampling.penalty_repeat", &x) && x >= 0.01f && x <= 100)
        p->repeat_penalty = x, set |= STRATA_SAMPLING_REPEAT_PENALTY;
    if (!gguf_get_i64(f, "general.sampling.penalty_last_n", &n) && n >= 0 && n <= (1 << 20))
        p->repeat_last_n = (int)n, set |= STRATA_SAMPLING_REPEAT_LAST_N;
    err_clear();
    return set;
}

int strata_sampler_open(const struct strata *s, const struct strata_sampling *p,
                        struct strata_sampler **out)
{
    struct sampler_config sc = strata_sampler_config(p);
    struct strata_sampler *sm = calloc(1, sizeof(*sm));
    int rc;

    if (!sm)
        return err_set(-ENOMEM, "out of memory");
    rc = sampler_init(&sm->smp, &sc, (int)s->model->hp.n_vocab);
    if (rc) {
        free(sm);
        return rc;
    }
    *out = sm;
    return 0;
}

void strata_sampler_close(struct strata_sampler *sm)
{
    if (!sm)
        return;
    sampler_free(&sm->smp);
    free(sm);
}

int32_t strata_sampler_sample(struct strata_sampler *sm, float *logits)
{
    return sampler_sample(&sm->smp, logits);
}

int32_t strata_sampler_sample_draft(struct strata_sampler *sm, float *logits, int32_t draft,
                                    bool *accepted)
{
    return sampler_sample_draft(&sm->smp, logits, draft, accepted);
}

int strata_draft_len(double accept_ema, int draft_max)
{
    return generate_draft_len(accept_ema, draft_max);
}

void strata_draft_pace_init(struct strata_draft_pace *p)
{
    generate_pace_init(p);
}

int strata_draft_pace_len(struct strata_draft_pace *p, int draft_max)
{
    return generate_pace_len(p, draft_max);
}

void strata_draft_pace_update(struct strata_draft_pace *p, int k, int accepted)
{
    generate_pace_update(p, k, accepted);
}

int strata_ngram_source(const int32_t *hist, int n_hist, int ngram)
{
    return generate_ngram_source(hist, n_hist, ngram);
}

int strata_ngram_draft(const int32_t *hist, int n_hist, int ngram, int k, int32_t *out)
{
    return generate_ngram_draft(hist, n_hist, ngram, k, out);
}

void strata_sampler_accept(struct strata_sampler *sm, int32_t id)
{
    sampler_accept(&sm->smp, id);
}

void strata_generate_params_init(struct strata_generate_params *p)
{
    memset(p, 0, sizeof(*p));
    p->n_predict = 128;
    p->draft_ngram = 3;
    strata_sampling_init(&p->sampling);
}

int strata_generate(struct strata_stream *st, const int32_t *prompt, int n_prompt,
                    const struct strata_generate_params *p, strata_emit_fn emit, void *ctx,
                    int32_t *out_ids, struct strata_generate_stats *stats)
{
    struct generate_config gc = {
        .n_predict = p->n_predict,
        .sampling = strata_sampler_config(&p->sampling),
        .n_stop = p->n_stop,
        .ignore_eos = p->ignore_eos,
        .draft_max = p->draft_max,
        .draft_ngram = p->draft_ngram,
        .draft_fn = p->draft_fn,
        .draft_ctx = p->draft_ctx,
        .lookahead = p->lookahead,
    };
    struct generate_stats gs;
    int rc;

    if (p->draft_max < 0 || p->draft_max > 64 || (p->draft_max && p->draft_ngram < 2))
        return err_set(-EINVAL, "strata_generate: draft_max %d (0..64), draft_ngram %d (>= 2)",
                       p->draft_max, p->draft_ngram);
    if (p->lookahead < STRATA_LOOKAHEAD_DRAFTS || p->lookahead > STRATA_LOOKAHEAD_OFF)
        return err_set(-EINVAL, "strata_generate: lookahead %d (STRATA_LOOKAHEAD_*)", p->lookahead);
    if (p->n_stop < 0 || p->n_stop > STRATA_MAX_STOP || p->n_predict < 0)
        return err_set(-EINVAL, "strata_generate: %d stop strings (at most %d), n_predict %d",
                       p->n_stop, STRATA_MAX_STOP, p->n_predict);
    for (int i = 0; i < p->n_stop; i++)
        gc.stop[i] = p->stop[i] ? p->stop[i] : "";
    rc = strata_check_ids(st, prompt, n_prompt);
    if (rc)
        return rc;
    rc = generate_run(st->st, st->s->model->tok, prompt, n_prompt, &gc, emit, ctx, out_ids, &gs);
    if (stats)
        *stats = (struct strata_generate_stats){
            .n_prompt = gs.n_prompt,
            .n_gen = gs.n_gen,
            .t_prompt_s = gs.t_prompt_s,
            .t_gen_s = gs.t_gen_s,
            .stopped_eog = gs.stopped_eog,
            .stopped_string = gs.stopped_string,
            .stopped_ctx = gs.stopped_ctx,
            .n_verify = gs.n_verify,
            .n_drafted = gs.n_drafted,
            .n_accepted = gs.n_accepted,
            .spec_unavailable = gs.spec_unavailable,
            .n_paused = gs.n_paused,
            .n_lookahead = gs.n_lookahead,
            .lookahead_experts = gs.lookahead_experts,
        };
    if (stats)
        for (int i = 0; i < 16 && i < GENERATE_SPEC_POS; i++) {
            stats->drafted_at[i] = gs.drafted_at[i];
            stats->accepted_at[i] = gs.accepted_at[i];
        }
    return rc;
}

/* ---- statistics --------------------------------------------------------------------------- */

void strata_get_stats(const struct strata *s, struct strata_stats *out)
{
    struct moe_cache_totals t;

    memset(out, 0, sizeof(*out));
    struct disk_tier_stats ts;
    if (s->core &&
        (s->cuda ? backend_cuda_tier_stats(s->core, &ts) : backend_cpu_tier_stats(s->core, &ts))) {
        out->has_host_tier = true;
        out->tier_slots = ts.n_slots;
        out->tier_hits = ts.hits;
        out->tier_misses = ts.misses;
        out->tier_bytes_read = ts.bytes_read;
        out->tier_read_seconds = ts.read_seconds;
        out->tier_ahead = ts.ahead;
        out->tier_ahead_used = ts.ahead_used;
        out->tier_uring = ts.uring;
        out->tier_direct = ts.direct;
        out->tier_ahead_paced = ts.ahead_paced;
        out->tier_disk_bps = ts.disk_bps;
        out->tier_disk_lat_s = ts.disk_lat_s;
        out->tier_window_s = ts.window_s;
        out->tier_numa_node = ts.numa_node;
    }
    out->threads = omp_get_max_threads();
    out->placement = "cpu";
    if (!s->cuda || !s->core)
        return;
    out->placement = backend_cuda_placement(s->core);
    out->placement_timing = backend_cuda_auto_timing(s->core);
    out->vram_bytes = backend_cuda_vram_bytes(s->core);
    out->graph = backend_cuda_graph(s->core);
    out->cpu_moe_layers = backend_cuda_cpu_moe_layers(s->core);
    out->cpu_lane_seconds = backend_cuda_cpu_lane_seconds(s->core);
    backend_cuda_lane_rates(s->core, &out->lane_pcie_bps, &out->lane_cpu_bps_open,
                            &out->lane_cpu_bps);
    if (backend_cuda_cache_totals(s->core, &t) == 0) {
        out->has_cache = true;
        out->slots = t.slots;
        out->hits = t.hits;
        out->misses = t.misses;
        out->evictions = t.evictions;
        out->bytes_streamed = t.bytes_copied;
        out->bytes_zero_copy = t.bytes_zerocopy;
        out->cpu_computed = t.cpu_computed;
        out->cpu_admitted = t.cpu_admitted;
        out->prefetched = t.prefetched;
        out->prefetch_used = t.prefetch_used;
        out->prefetch_late = t.prefetch_late;
        out->prefetch_wasted = t.prefetch_wasted;
        out->prefetch_jobs = t.worker_jobs;
    }
}

/* The host tier's counts (T1 against T2), and what it learned of the disk. */
static void strata_print_tier_stats(const struct strata *s, FILE *f)
{
    struct strata_stats st;
    strata_get_stats(s, &st);
    if (!st.has_host_tier)
        return;
    uint64_t uses = st.tier_hits + st.tier_misses;
    fprintf(f,
            "host tier: %d slots (%s, %s), %llu hits and %llu misses of %llu expert uses "
            "(%.1f%%), %.2f GB read from the file, %.2f s waited for reads\n",
            st.tier_slots, st.tier_uring ? "io_uring" : "pread",
            st.tier_direct ? "O_DIRECT" : "buffered", (unsigned long long)st.tier_hits,
            (unsigned long long)st.tier_misses, (unsigned long long)uses,
            uses ? 100.0 * st.tier_hits / uses : 0.0, st.tier_bytes_read / 1e9,
            st.tier_read_seconds);
    if (st.tier_disk_bps > 0)
        fprintf(f, "host tier: the disk as learned from its reads: %.2f GB/s + %.2f ms a batch\n",
                st.tier_disk_bps / 1e9, st.tier_disk_lat_s * 1e3);
    if (st.tier_ahead || st.tier_ahead_paced)
        fprintf(f,
                "host tier: read ahead %llu experts, %llu of them used; %llu predicted experts "
                "not read ahead (the disk would not land them within the %.2f ms before their "
                "layer)\n",
                (unsigned long long)st.tier_ahead, (unsigned long long)st.tier_ahead_used,
                (unsigned long long)st.tier_ahead_paced, st.tier_window_s * 1e3);
}

int strata_print_cache_stats(const struct strata *s, FILE *f)
{
    int rc = s->cuda && s->core ? backend_cuda_print_stats(s->core, f) : 0;
    strata_print_tier_stats(s, f);
    struct strata_stats st;
    strata_get_stats(s, &st);
    if (st.lane_cpu_bps > 0)
        fprintf(f,
                "hybrid lanes: measured at open PCIe %.1f GB/s, CPU %.1f GB/s; the CPU lane ran "
                "at %.1f GB/s over %.2f s of experts\n",
                st.lane_pcie_bps / 1e9, st.lane_cpu_bps_open / 1e9, st.lane_cpu_bps / 1e9,
                st.cpu_lane_seconds);
    return rc;
}

int strata_write_cache_stats_json(const struct strata *s, const char *path)
{
    return s->cuda && s->core ? backend_cuda_write_stats_json(s->core, path) : 0;
}
