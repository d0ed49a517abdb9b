/* disk_tier: the host tier read from the file (disk_tier.h). */
#include "disk_tier.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"
#include "costfit.h"
#include "errors.h"
#include "gguf.h"
#include "model.h"
#include "topo.h"

#define DT_ALIGN 4096u /* O_DIRECT's offset, length and buffer alignment */

/* Where one expert's three parts lie in the file. */
struct dt_part {
    uint64_t off, len; /* the part's bytes */
    const char *tensor;
};

struct dt_slot {
    int layer, expert; /* -1: free */
    uint64_t used;     /* call stamp of the last use */
    bool pending;      /* a read-ahead in flight */
    bool ahead;        /* filled by a read-ahead, not looked up since */
    bool bad;          /* a read-ahead into it failed */
};

struct disk_tier {
    int fd;
    bool direct, uring, registered;
    uint64_t map_size;  /* the file as the model mapped it: size, */
    int64_t map_mtime;  /* and modification time */
    struct io_uring ring;
    int depth;
    uint64_t chunk; /* a demand read's pieces (a multiple of DT_ALIGN), 0: whole parts */
    int n_layer, n_expert;
    uint64_t file_size;
    uint64_t (*base)[3];      /* (n_layer) file offset of expert 0's gate, up, down */
    uint64_t (*stride)[3];    /* (n_layer) bytes between experts of each */
    uint64_t (*len)[3];       /* (n_layer) bytes of one expert's part */
    const char *(*name)[3];   /* (n_layer) tensor names */
    const char *path;
    uint8_t *pool; /* n_slots * slot_bytes, an anonymous mapping */
    size_t pool_bytes;
    uint64_t slot_bytes;
    int n_slots;
    struct dt_slot *slots;
    int32_t *where;           /* (n_layer * n_expert) slot or -1 */
    uint64_t stamp;
    struct disk_tier_stats st;
    /* one call's reads */
    struct dt_read {
        uint8_t *dst;
        uint64_t off, need, len; /* aligned file span [off, off + len), need bytes required */
        int slot, part;
    } *reads;
    struct dt_read *ahead;  /* (3 n_slots) the read-ahead's reads */
    int n_ahead, ahead_inflight;
    /* the disk's cost, learned (disk_tier.h, COST) */
    double (*clock)(void);
    struct costfit cost; /* a call's reads: bytes against seconds waited */
    double ahead_at;     /* when the last read-ahead was asked for; 0: none since the call */
    double window_s;     /* decayed mean of the time from a read-ahead to the next call */
    bool pace;
};

static uint64_t dt_down(uint64_t x)
{
    return x / DT_ALIGN * DT_ALIGN;
}

static uint64_t dt_up(uint64_t x)
{
    return (x + DT_ALIGN - 1) / DT_ALIGN * DT_ALIGN;
}

/* The aligned span of part p of expert e of layer l and where it lands in its slot. */
static void dt_span(const struct disk_tier *t, int l, int e, int p, uint64_t *off, uint64_t *len,
                    uint64_t *at, uint64_t *skip)
{
    uint64_t o = t->base[l][p] + (uint64_t)e * t->stride[l][p];
    *off = dt_down(o);
    *skip = o - *off;
    *len = dt_up(o + t->len[l][p]) - *off;
    *at = 0;
    for (int q = 0; q < p; q++) {
        uint64_t oq = t->base[l][q] + (uint64_t)e * t->stride[l][q];
        *at += dt_up(oq + t->len[l][q]) - dt_down(oq);
    }
}

static int dt_layout(struct disk_tier *t, const struct model *m)
{
    const struct gguf_file *f = m->file;
    t->n_layer = (int)m->hp.n_layer;
    t->n_expert = (int)m->hp.n_expert;
    t->base = calloc((size_t)t->n_layer, sizeof(*t->base));
    t->stride = calloc((size_t)t->n_layer, sizeof(*t->stride));
    t->len = calloc((size_t)t->n_layer, sizeof(*t->len));
    t->name = calloc((size_t)t->n_layer, sizeof(*t->name));
    if (!t->base || !t->stride || !t->len || !t->name)
        return err_set(-ENOMEM, "out of memory");
    for (int l = 0; l < t->n_layer; l++) {
        const struct layer_weights *lw = &m->layers[l];
        const struct weight *w[3] = {&lw->gate_exps, &lw->up_exps, &lw->down_exps};
        uint64_t need = 0;
        for (int p = 0; p < 3; p++) {
            const struct gguf_tensor *gt = w[p]->name ? gguf_find_tensor(f, w[p]->name) : NULL;
            if (!gt || !w[p]->bytes)
                return err_set(-EINVAL, "host tier: layer %d has no stacked experts in the file",
                               l);
            t->base[l][p] = f->data_offset + gt->offset;
            t->stride[l][p] = w[p]->bytes / (uint64_t)t->n_expert;
            t->len[l][p] = t->stride[l][p];
            t->name[l][p] = gt->name;
            /* the aligned span can start up to DT_ALIGN - 1 bytes early and end as late */
            need += dt_up(t->len[l][p] + 2 * DT_ALIGN);
        }
        t->slot_bytes = need > t->slot_bytes ? need : t->slot_bytes;
    }
    return 0;
}

static int dt_open_file(struct disk_tier *t, const struct disk_tier_config *cfg)
{
    struct stat sb;
    t->fd = cfg->buffered ? -1 : open(t->path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    t->direct = t->fd >= 0;
    if (t->fd < 0)
        t->fd = open(t->path, O_RDONLY | O_CLOEXEC);
    if (t->fd < 0)
        return err_set(-errno, "host tier: %s: %s", t->path, strerror(errno));
    if (fstat(t->fd, &sb))
        return err_set(-errno, "host tier: %s: %s", t->path, strerror(errno));
    t->file_size = (uint64_t)sb.st_size;
    int64_t mtime = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
    if (t->file_size != t->map_size || (t->map_mtime && mtime != t->map_mtime))
        return err_set(-ESTALE,
                       "host tier: %s changed on disk since it was loaded (%llu bytes then, %llu "
                       "now; modification time moved by %.3f s): load it again",
                       t->path, (unsigned long long)t->map_size,
                       (unsigned long long)t->file_size, (mtime - t->map_mtime) / 1e9);
    return 0;
}

/* io_uring with the file (and, where the memlock limit allows, the slots) registered. */
static int dt_open_uring(struct disk_tier *t, const struct disk_tier_config *cfg)
{
    t->depth = cfg->queue_depth > 0 ? cfg->queue_depth : 64;
    int rc = io_uring_queue_init((unsigned)t->depth, &t->ring, 0);
    if (rc)
        return rc;
    t->uring = true;
    rc = io_uring_register_files(&t->ring, &t->fd, 1);
    if (rc) {
        io_uring_queue_exit(&t->ring);
        t->uring = false;
        return rc;
    }
    if (t->n_slots <= 16384 && t->slot_bytes <= (1u << 30)) {
        struct iovec *iov = malloc(sizeof(*iov) * (size_t)t->n_slots);
        for (int i = 0; iov && i < t->n_slots; i++)
            iov[i] = (struct iovec){t->pool + (size_t)i * t->slot_bytes, t->slot_bytes};
        t->registered = iov && io_uring_register_buffers(&t->ring, iov, (unsigned)t->n_slots) == 0;
        free(iov);
    }
    return 0;
}

/* The slots: one anonymous mapping (page aligned, as O_DIRECT wants), on huge pages where the
 * kernel gives them, its pages bound to NUMA node `node` when >= 0 (best effort: a machine
 * without NUMA places them by first touch). */
static int dt_map_pool(struct disk_tier *t, size_t bytes, int node)
{
    void *p = mmap(NULL, bytes ? bytes : DT_ALIGN, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return err_set(-ENOMEM, "host tier: cannot map %.1f MiB of slots", bytes / 1048576.0);
    t->pool = p;
    t->pool_bytes = bytes ? bytes : DT_ALIGN;
    madvise(p, t->pool_bytes, MADV_HUGEPAGE);
    t->st.numa_node = -1;
    struct topo *tp = NULL;
    if (node >= 0 && topo_open(&tp) == 0 && topo_membind_area(tp, p, t->pool_bytes, node) == 0)
        t->st.numa_node = node;
    topo_close(tp);
    return 0;
}

int disk_tier_open(const struct model *m, const struct disk_tier_config *cfg,
                   struct disk_tier **out)
{
    struct disk_tier *t = calloc(1, sizeof(*t));
    int rc;
    if (!t)
        return err_set(-ENOMEM, "out of memory");
    t->fd = -1;
    t->clock = cfg->clock ? cfg->clock : clock_now_s;
    costfit_init(&t->cost, 0.95);
    const char *pace = getenv("STRATA_TIER_PACE");
    t->pace = !pace || strcmp(pace, "0");
    const char *chunk = getenv("STRATA_TIER_CHUNK_KIB");
    t->chunk = chunk ? strtoull(chunk, NULL, 10) * 1024 / DT_ALIGN * DT_ALIGN : 0;
    t->path = m->file->path;
    t->map_size = m->file->size;
    t->map_mtime = m->file->mtime_ns;
    if (!t->path || m->copy) {
        free(t);
        return err_set(-EINVAL, "host tier: the model must be read from its file (not --no-mmap)");
    }
    rc = dt_layout(t, m);
    if (!rc) {
        uint64_t slots = cfg->host_budget / t->slot_bytes;
        if (slots < (uint64_t)t->n_expert)
            rc = err_set(-EINVAL,
                         "--host-budget %.1f MiB holds %llu experts of %.2f MiB; one layer has "
                         "%d: at least %.1f MiB",
                         cfg->host_budget / 1048576.0, (unsigned long long)slots,
                         t->slot_bytes / 1048576.0, t->n_expert,
                         (double)t->slot_bytes * t->n_expert / 1048576.0);
        else
            t->n_slots = slots > (uint64_t)t->n_layer * t->n_expert
                             ? t->n_layer * t->n_expert : (int)slots;
    }
    size_t pool = (size_t)t->n_slots * t->slot_bytes;
    if (!rc)
        rc = dt_map_pool(t, pool, cfg->numa_bind ? cfg->numa_node : -1);
    if (!rc && (!(t->slots = malloc(sizeof(*t->slots) * (size_t)t->n_slots)) ||
                !(t->where = malloc(sizeof(int32_t) * (size_t)t->n_layer * t->n_expert)) ||
                !(t->reads = malloc(sizeof(*t->reads) * 3 * (size_t)t->n_slots)) ||
                !(t->ahead = malloc(sizeof(*t->ahead) * 3 * (size_t)t->n_slots))))
        rc = err_set(-ENOMEM, "out of memory");
    rc = rc ? rc : dt_open_file(t, cfg);
    if (rc) {
        disk_tier_close(t);
        return rc;
    }
    for (int i = 0; i < t->n_slots; i++)
        t->slots[i] = (struct dt_slot){-1, -1, 0, false, false, false};
    for (size_t i = 0; i < (size_t)t->n_layer * t->n_expert; i++)
        t->where[i] = -1;
    const char *why = NULL;
    if (cfg->io != DISK_TIER_IO_PREAD) {
        rc = dt_open_uring(t, cfg);
        if (rc && cfg->io == DISK_TIER_IO_URING) {
            disk_tier_close(t);
            return err_set(rc, "host tier: io_uring: %s", strerror(-rc));
        }
        why = rc ? strerror(-rc) : NULL;
    }
    char node[32] = "placed by first touch";
    if (t->st.numa_node >= 0)
        snprintf(node, sizeof(node), "on NUMA node %d", t->st.numa_node);
    if (cfg->log)
        fprintf(cfg->log,
                "strata: host tier: %d expert slots of %.2f MiB (%.2f GiB), read from %s with "
                "%s%s%s%s, %s; slots %s\n",
                t->n_slots, t->slot_bytes / 1048576.0, pool / 1073741824.0, t->path,
                t->uring ? "io_uring" : "pread", why ? " (io_uring: " : "", why ? why : "",
                why ? ")" : "",
                t->direct ? "O_DIRECT" : "buffered (the file system refused O_DIRECT)", node);
    t->st.n_slots = t->n_slots;
    t->st.slot_bytes = t->slot_bytes;
    t->st.uring = t->uring;
    t->st.direct = t->direct;
    t->st.registered = t->registered;
    *out = t;
    return 0;
}

void disk_tier_memory(const struct disk_tier *t, uint8_t **pool, size_t *bytes)
{
    *pool = t->pool;
    *bytes = (size_t)t->n_slots * t->slot_bytes;
}

void disk_tier_close(struct disk_tier *t)
{
    if (!t)
        return;
    if (t->uring) {
        while (t->ahead_inflight > 0) { /* the kernel must not write into freed slots */
            struct io_uring_cqe *cqe;
            if (io_uring_wait_cqe(&t->ring, &cqe) < 0)
                break;
            io_uring_cqe_seen(&t->ring, cqe);
            t->ahead_inflight--;
        }
        io_uring_queue_exit(&t->ring);
    }
    if (t->fd >= 0)
        close(t->fd);
    free(t->base);
    free(t->stride);
    free(t->len);
    free(t->name);
    if (t->pool)
        munmap(t->pool, t->pool_bytes);
    free(t->slots);
    free(t->where);
    free(t->reads);
    free(t->ahead);
    free(t);
}

static int dt_fail(const struct disk_tier *t, const struct dt_read *r, int layer, int expert,
                   long long got)
{
    if (got < 0)
        return err_set(-EIO, "host tier: %s: reading %llu bytes at offset %llu (%s, layer %d "
                             "expert %d): %s",
                       t->path, (unsigned long long)r->len, (unsigned long long)r->off,
                       t->name[layer][r->part], layer, expert, strerror((int)-got));
    return err_set(-EIO,
                   "host tier: %s: reading %llu bytes at offset %llu (%s, layer %d expert %d): "
                   "the file ends after %lld of them (changed on disk?)",
                   t->path, (unsigned long long)r->need, (unsigned long long)r->off,
                   t->name[layer][r->part], layer, expert, got);
}

/* Reads t->reads[0..n) with pread. */
static int dt_read_pread(struct disk_tier *t, int n, int layer)
{
    for (int i = 0; i < n; i++) {
        struct dt_read *r = &t->reads[i];
        uint64_t done = 0;
        while (done < r->need) {
            ssize_t got = pread(t->fd, r->dst + done, r->len - done, (off_t)(r->off + done));
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0)
                return dt_fail(t, r, layer, t->slots[r->slot].expert, got < 0 ? -errno : (long long)done);
            done += (uint64_t)got;
        }
    }
    return 0;
}

/* Piece `at` of read r (t->chunk bytes from there, or the rest): *len bytes asked, *need of
 * them required. */
static void dt_piece(const struct disk_tier *t, const struct dt_read *r, uint64_t at, uint64_t *len,
                     uint64_t *need)
{
    *len = t->chunk && r->len - at > t->chunk ? t->chunk : r->len - at;
    *need = r->need <= at ? 0 : r->need - at < *len ? r->need - at : *len;
}

/* Reads t->reads[0..n) through io_uring, up to depth in flight, each in pieces of t->chunk
 * bytes (0: whole). */
static int dt_read_uring(struct disk_tier *t, int n, int layer)
{
    int next = 0, inflight = 0, rc = 0;
    uint64_t next_at = 0; /* where the next piece of reads[next] starts */
    while ((next < n || inflight) && !rc) {
        while (next < n && inflight < t->depth) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&t->ring);
            if (!sqe)
                break;
            struct dt_read *r = &t->reads[next];
            uint64_t len, need;
            dt_piece(t, r, next_at, &len, &need);
            if (t->registered)
                io_uring_prep_read_fixed(sqe, 0, r->dst + next_at, (unsigned)len, r->off + next_at,
                                         r->slot);
            else
                io_uring_prep_read(sqe, 0, r->dst + next_at, (unsigned)len, r->off + next_at);
            sqe->flags |= IOSQE_FIXED_FILE;
            /* the read in the high half, the piece's start in 4 KiB units in the low */
            io_uring_sqe_set_data64(sqe, (uint64_t)next << 32 | next_at / DT_ALIGN);
            next_at += len;
            if (next_at >= r->len)
                next++, next_at = 0;
            inflight++;
        }
        int s = io_uring_submit(&t->ring);
        if (s < 0)
            return err_set(s, "host tier: io_uring_submit: %s", strerror(-s));
        struct io_uring_cqe *cqe;
        int w = io_uring_wait_cqe(&t->ring, &cqe);
        if (w < 0)
            return err_set(w, "host tier: io_uring_wait_cqe: %s", strerror(-w));
        do {
            uint64_t data = io_uring_cqe_get_data64(cqe);
            struct dt_read *r = &t->reads[data >> 32];
            uint64_t at = (data & 0xffffffffu) * DT_ALIGN, len, need;
            dt_piece(t, r, at, &len, &need);
            int res = cqe->res;
            io_uring_cqe_seen(&t->ring, cqe);
            inflight--;
            if (!rc && (res < 0 || (uint64_t)res < need)) {
                /* a short read that is not an error: the rest with pread, as the kernel may
                 * split a read; an error ends the call */
                struct dt_read rest = *r;
                rest.dst += at;
                rest.off += at;
                rest.len = len;
                rest.need = need;
                if (res > 0) {
                    rest.dst += res;
                    rest.off += (uint64_t)res;
                    rest.len -= (uint64_t)res;
                    rest.need -= (uint64_t)res;
                    struct dt_read keep = t->reads[0];
                    t->reads[0] = rest;
                    rc = dt_read_pread(t, 1, layer);
                    t->reads[0] = keep;
                } else {
                    rc = dt_fail(t, &rest, layer, t->slots[r->slot].expert, res);
                }
            }
        } while (!rc && inflight && io_uring_peek_cqe(&t->ring, &cqe) == 0);
    }
    while (inflight > 0) { /* reap what an error left in flight before the slots are reused */
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&t->ring, &cqe) < 0)
            break;
        io_uring_cqe_seen(&t->ring, cqe);
        inflight--;
    }
    return rc;
}

static void dt_reap_ahead(struct disk_tier *t);

int disk_tier_get(struct disk_tier *t, int layer, const int32_t *experts, int n,
                  const uint8_t **ptrs)
{
    if (layer < 0 || layer >= t->n_layer || n < 0 || n > t->n_slots)
        return err_set(-EINVAL, "host tier: %d experts of layer %d (%d slots)", n, layer,
                       t->n_slots);
    double now = t->clock();
    if (t->ahead_at > 0) { /* the window the last read-ahead had */
        double w = now - t->ahead_at;
        t->window_s = t->window_s > 0 ? 0.8 * t->window_s + 0.2 * w : w;
        t->ahead_at = 0;
    }
    if (t->ahead_inflight || t->n_ahead) {
        dt_reap_ahead(t);
        t->st.read_seconds += t->clock() - now;
    }
    t->stamp++;
    int n_reads = 0;
    /* hits first, so that no expert of this call is chosen as a victim for another */
    for (int i = 0; i < n; i++) {
        if (experts[i] < 0 || experts[i] >= t->n_expert)
            return err_set(-EINVAL, "host tier: expert %d of %d", experts[i], t->n_expert);
        int s = t->where[(size_t)layer * t->n_expert + experts[i]];
        if (s >= 0)
            t->slots[s].used = t->stamp;
    }
    for (int i = 0; i < n; i++) {
        int e = experts[i], s = t->where[(size_t)layer * t->n_expert + e];
        if (s >= 0) {
            t->st.hits++;
            if (t->slots[s].ahead) {
                t->slots[s].ahead = false;
                t->st.ahead_used++;
            }
        } else {
            t->st.misses++;
            int v = -1;
            for (int j = 0; j < t->n_slots; j++) { /* the least recent slot not in this call */
                if (t->slots[j].used == t->stamp)
                    continue;
                if (v < 0 || t->slots[j].used < t->slots[v].used)
                    v = j;
            }
            if (v < 0)
                return err_set(-EINVAL, "host tier: %d experts in one call (%d slots)", n,
                               t->n_slots);
            if (t->slots[v].layer >= 0)
                t->where[(size_t)t->slots[v].layer * t->n_expert + t->slots[v].expert] = -1;
            t->slots[v] = (struct dt_slot){layer, e, t->stamp, false, false, false};
            t->where[(size_t)layer * t->n_expert + e] = v;
            s = v;
            for (int p = 0; p < 3; p++) {
                uint64_t off, len, at, skip;
                dt_span(t, layer, e, p, &off, &len, &at, &skip);
                uint64_t end = t->base[layer][p] + (uint64_t)e * t->stride[layer][p] +
                               t->len[layer][p];
                t->reads[n_reads++] = (struct dt_read){
                    .dst = t->pool + (size_t)s * t->slot_bytes + at, .off = off,
                    .need = end - off, .len = off + len > dt_up(t->file_size) ? dt_up(t->file_size) - off : len,
                    .slot = s, .part = p,
                };
            }
        }
        for (int p = 0; p < 3; p++) {
            uint64_t off, len, at, skip;
            dt_span(t, layer, e, p, &off, &len, &at, &skip);
            ptrs[3 * i + p] = t->pool + (size_t)s * t->slot_bytes + at + skip;
        }
    }
    if (!n_reads)
        return 0;
    double t0 = t->clock();
    int rc = t->uring ? dt_read_uring(t, n_reads, layer) : dt_read_pread(t, n_reads, layer);
    double waited = t->clock() - t0;
    t->st.read_seconds += waited;
    uint64_t bytes = 0;
    for (int i = 0; i < n_reads; i++)
        bytes += t->reads[i].len;
    t->st.bytes_read += bytes;
    if (!rc)
        costfit_add(&t->cost, (double)bytes, waited);
    if (rc) /* the slots of this call hold nothing usable */
        for (int i = 0; i < n_reads; i++) {
            struct dt_slot *sl = &t->slots[t->reads[i].slot];
            if (sl->layer >= 0)
                t->where[(size_t)sl->layer * t->n_expert + sl->expert] = -1;
            *sl = (struct dt_slot){-1, -1, 0, false, false, false};
        }
    return rc;
}

/* Waits for every read-ahead in flight; a slot one of them failed is emptied (its expert is a
 * miss when asked for). */
static void dt_reap_ahead(struct disk_tier *t)
{
    while (t->ahead_inflight > 0) {
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&t->ring, &cqe) < 0)
            break;
        const struct dt_read *r = &t->ahead[io_uring_cqe_get_data64(cqe)];
        if (cqe->res < 0 || (uint64_t)cqe->res < r->need)
            t->slots[r->slot].bad = true;
        io_uring_cqe_seen(&t->ring, cqe);
        t->ahead_inflight--;
    }
    for (int i = 0; i < t->n_ahead; i++) {
        struct dt_slot *sl = &t->slots[t->ahead[i].slot];
        if (sl->bad || t->ahead_inflight) { /* a wait that failed: nothing of it is trusted */
            if (sl->layer >= 0)
                t->where[(size_t)sl->layer * t->n_expert + sl->expert] = -1;
            *sl = (struct dt_slot){-1, -1, 0, false, false, false};
        }
        sl->pending = false;
    }
    t->n_ahead = 0;
}

/* Bytes of the file a read-ahead may ask for now: what the learned disk reads in the learned
 * window before the next call, less its per-batch latency; unbounded until both are known. */
static double dt_ahead_room(const struct disk_tier *t)
{
    double rate, fixed;
    if (!t->pace || !(t->window_s > 0) || !costfit_get(&t->cost, &rate, &fixed))
        return 1e300;
    double room = (t->window_s - fixed) * rate;
    return room > 0 ? room : 0;
}

/* The file bytes of expert e of layer (its three aligned spans). */
static uint64_t dt_expert_span(const struct disk_tier *t, int layer, int e)
{
    uint64_t sum = 0;
    for (int p = 0; p < 3; p++) {
        uint64_t off, len, at, skip;
        dt_span(t, layer, e, p, &off, &len, &at, &skip);
        sum += len;
    }
    return sum;
}

int disk_tier_read_ahead(struct disk_tier *t, int layer, const int32_t *experts, int n)
{
    int started = 0;
    if (!t->uring || layer < 0 || layer >= t->n_layer)
        return 0;
    double now = t->clock();
    if (t->ahead_at > 0) /* no call since the last read-ahead: its window ended here */
        t->window_s =
            t->window_s > 0 ? 0.8 * t->window_s + 0.2 * (now - t->ahead_at) : now - t->ahead_at;
    t->ahead_at = now;
    double room = dt_ahead_room(t), asked = 0;
    for (int i = 0; i < n; i++) {
        int e = experts[i];
        if (e < 0 || e >= t->n_expert || t->where[(size_t)layer * t->n_expert + e] >= 0)
            continue;
        asked += (double)dt_expert_span(t, layer, e);
        if (asked > room) {
            t->st.ahead_paced++;
            continue;
        }
        if (t->ahead_inflight + 3 > t->depth || io_uring_sq_space_left(&t->ring) < 3 ||
            t->n_ahead + 3 > 3 * t->n_slots)
            break;
        int v = -1;
        for (int j = 0; j < t->n_slots; j++) {
            if (t->slots[j].used == t->stamp || t->slots[j].pending)
                continue;
            if (v < 0 || t->slots[j].used < t->slots[v].used)
                v = j;
        }
        if (v < 0)
            break;
        if (t->slots[v].layer >= 0)
            t->where[(size_t)t->slots[v].layer * t->n_expert + t->slots[v].expert] = -1;
        t->slots[v] = (struct dt_slot){layer, e, t->stamp, true, true, false};
        t->where[(size_t)layer * t->n_expert + e] = v;
        for (int p = 0; p < 3; p++) {
            uint64_t off, len, at, skip;
            dt_span(t, layer, e, p, &off, &len, &at, &skip);
            uint64_t end = t->base[layer][p] + (uint64_t)e * t->stride[layer][p] +
                           t->len[layer][p];
            struct dt_read *r = &t->ahead[t->n_ahead];
            *r = (struct dt_read){
                .dst = t->pool + (size_t)v * t->slot_bytes + at, .off = off, .need = end - off,
                .len = off + len > dt_up(t->file_size) ? dt_up(t->file_size) - off : len,
                .slot = v, .part = p,
            };
            struct io_uring_sqe *sqe = io_uring_get_sqe(&t->ring);
            if (t->registered)
                io_uring_prep_read_fixed(sqe, 0, r->dst, (unsigned)r->len, r->off, v);
            else
                io_uring_prep_read(sqe, 0, r->dst, (unsigned)r->len, r->off);
            sqe->flags |= IOSQE_FIXED_FILE;
            io_uring_sqe_set_data64(sqe, (uint64_t)t->n_ahead);
            t->n_ahead++;
            t->ahead_inflight++;
            t->st.bytes_read += r->len;
        }
        started++;
    }
    if (started) {
        int s = io_uring_submit(&t->ring);
        if (s < 0) { /* nothing went out: forget them */
            t->ahead_inflight = 0;
            for (int i = 0; i < t->n_ahead; i++) {
                struct dt_slot *sl = &t->slots[t->ahead[i].slot];
                if (sl->layer >= 0)
                    t->where[(size_t)sl->layer * t->n_expert + sl->expert] = -1;
                *sl = (struct dt_slot){-1, -1, 0, false, false, false};
            }
            t->n_ahead = 0;
            return 0;
        }
    }
    t->st.ahead += (uint64_t)started;
    return started;
}

void disk_tier_get_stats(const struct disk_tier *t, struct disk_tier_stats *out)
{
    *out = t->st;
    double rate, fixed;
    if (costfit_get(&t->cost, &rate, &fixed)) {
        out->disk_bps = rate;
        out->disk_lat_s = fixed;
    }
    out->window_s = t->window_s;
}

void disk_tier_reset_stats(struct disk_tier *t)
{
    t->st.hits = t->st.misses = t->st.bytes_read = t->st.ahead_paced = 0;
    t->st.read_seconds = 0;
}

double disk_tier_probe(const char *path, uint64_t off, uint64_t bytes, size_t block, int depth,
                       bool *direct, bool *uring)
{
    struct io_uring ring;
    uint8_t *buf = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    *direct = fd >= 0;
    *uring = false;
    if (fd < 0)
        fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat sb;
    block = dt_up(block ? block : 1);
    off = dt_down(off);
    if (fstat(fd, &sb) || (uint64_t)sb.st_size <= off) {
        close(fd);
        return -EINVAL;
    }
    bytes = dt_down(bytes < (uint64_t)sb.st_size - off ? bytes : (uint64_t)sb.st_size - off);
    depth = depth > 0 ? depth : 1;
    if (posix_memalign((void **)&buf, DT_ALIGN, block * (size_t)depth)) {
        close(fd);
        return -ENOMEM;
    }
    uint64_t n = (bytes + block - 1) / block, next = 0, done = 0, got = 0;
    double t0 = clock_now_s();
    int rc = io_uring_queue_init((unsigned)depth, &ring, 0);
    if (rc == 0) {
        *uring = true;
        int inflight = 0;
        while (done < n && rc >= 0) {
            while (next < n && inflight < depth) {
                struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
                if (!sqe)
                    break;
                uint64_t len = next + 1 == n ? bytes - next * block : block;
                io_uring_prep_read(sqe, fd, buf + (next % (uint64_t)depth) * block, (unsigned)len,
                                   off + next * block);
                next++;
                inflight++;
            }
            io_uring_submit(&ring);
            struct io_uring_cqe *cqe;
            rc = io_uring_wait_cqe(&ring, &cqe);
            if (rc < 0)
                break;
            if (cqe->res < 0)
                rc = cqe->res;
            else
                got += (uint64_t)cqe->res;
            io_uring_cqe_seen(&ring, cqe);
            inflight--;
            done++;
        }
        while (inflight-- > 0 && done < next) {
            struct io_uring_cqe *cqe;
            if (io_uring_wait_cqe(&ring, &cqe) < 0)
                break;
            io_uring_cqe_seen(&ring, cqe);
        }
        io_uring_queue_exit(&ring);
    } else {
        rc = 0;
        for (uint64_t i = 0; i < n && rc >= 0; i++) {
            uint64_t len = i + 1 == n ? bytes - i * block : block;
            ssize_t r = pread(fd, buf, len, (off_t)(off + i * block));
            rc = r < 0 ? -errno : 0;
            got += r > 0 ? (uint64_t)r : 0;
        }
    }
    double dt = clock_now_s() - t0;
    free(buf);
    close(fd);
    return rc < 0 ? rc : dt > 0 ? got / dt : 0;
}
