/* disk_tier: a host tier of expert slots with its own budget (T1), filled from the GGUF file
 * on disk (T2) with io_uring or pread, for the CPU device (docs/DESIGN.md §6, the tiers).
 *
 * DESIGN. The tier owns n_slots host buffers (4096-byte aligned) of slot_bytes each, holding
 * one expert (its gate, up and down rows) at a time, keyed by (layer, expert); the least
 * recently used slot not in use by the current call is the victim. A call asks for the experts
 * one layer step needs (at most n_slots, so the budget holds at least a layer's experts); the
 * misses are read in one batch: three reads per expert, each of the 4096-aligned file span
 * around its bytes, all submitted before any is reaped (io_uring: queue_depth in flight, the
 * file registered, the slots registered where the memlock limit allows), or one pread after
 * another. A file whose size or modification time differs from the mapped one is refused at
 * open (-ESTALE). disk_tier_read_ahead starts the reads of a predicted next call without waiting
 * (io_uring), into slots outside the current call; the next call reaps them before anything
 * else, and a read-ahead that failed is only a miss then. The file is opened with O_DIRECT where the file system takes it, else buffered (the
 * log says which); a read that fails or comes back short ends the call with the file, offset,
 * tensor and expert named. Single-threaded: the MoE layer that owns it calls every function.
 */
#ifndef STRATA_DISK_TIER_H
#define STRATA_DISK_TIER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct model;

enum disk_tier_io {
    DISK_TIER_IO_AUTO = 0, /* io_uring where it works, else pread */
    DISK_TIER_IO_URING = 1,
    DISK_TIER_IO_PREAD = 2,
};

struct disk_tier_config {
    uint64_t host_budget;  /* bytes of slots; must hold one layer's experts */
    enum disk_tier_io io;
    bool buffered;         /* never O_DIRECT */
    int queue_depth;       /* reads in flight with io_uring; 0 = 64 */
    bool numa_bind;        /* the slots' pages on numa_node (hwloc logical index), else where
                            * first touched */
    int numa_node;
    double (*clock)(void); /* seconds for the cost's samples; NULL = the monotonic clock */
    FILE *log;             /* what was chosen (O_DIRECT or not, io_uring or pread), NULL = quiet */
};

struct disk_tier_stats {
    uint64_t hits, misses;  /* expert lookups */
    uint64_t ahead, ahead_used; /* experts read ahead (disk_tier_read_ahead); of those, looked
                                 * up by the layer they were read for */
    uint64_t bytes_read;    /* file bytes read (aligned spans) */
    double read_seconds;    /* wall time waiting for reads (a read-ahead's overlap with the
                             * caller's compute is not in it) */
    uint64_t ahead_paced;   /* predicted experts not read ahead: the learned disk would not
                             * have landed them before the next call */
    double disk_bps;        /* learned: read bandwidth, bytes/s (0: nothing learned yet) */
    double disk_lat_s;      /* learned: seconds a batch of reads costs beyond its bytes */
    double window_s;        /* learned: seconds from a read-ahead to the next call */
    int numa_node;          /* where the slots are (-1: not bound) */
    int n_slots;
    uint64_t slot_bytes;
    bool uring, direct, registered; /* the paths in use */
};

struct disk_tier;

/* A tier for m's routed experts, read from m's file. 0, -EINVAL (a budget below one layer's
 * experts: the message has the arithmetic), -ENOMEM, or the open's -errno. */
int disk_tier_open(const struct model *m, const struct disk_tier_config *cfg,
                   struct disk_tier **out);
void disk_tier_close(struct disk_tier *t);

/* Makes experts[0..n) of layer resident (n <= the slots; distinct ids) and returns, for each,
 * the host addresses of its gate, up and down rows in ptrs[3 i + 0..2]. The slots of this call
 * stay valid until the next call. 0, -EINVAL, or -EIO (a failed or short read, named). */
int disk_tier_get(struct disk_tier *t, int layer, const int32_t *experts, int n,
                  const uint8_t **ptrs);

/* Starts reading experts[0..n) of layer (a prediction of its next call) into slots that the
 * last disk_tier_get's call does not use, without waiting: they land while the caller computes,
 * and the next disk_tier_get reaps them first. With io_uring only (else nothing is read); as
 * many as free ring entries and slots allow. Returns how many experts were started. */
int disk_tier_read_ahead(struct disk_tier *t, int layer, const int32_t *experts, int n);

void disk_tier_get_stats(const struct disk_tier *t, struct disk_tier_stats *out);

/* The slots' memory, one block: every address disk_tier_get returns lies inside it (the expert
 * cache registers it for DMA). */
void disk_tier_memory(const struct disk_tier *t, uint8_t **pool, size_t *bytes);

/* The disk's read bandwidth for the tier: `bytes` of path from offset `off` (both rounded to
 * 4096) in blocks of `block` bytes, `depth` of them in flight through io_uring (pread one at a
 * time where io_uring does not work), O_DIRECT unless the file system refuses it (*direct
 * says). Bytes per second, or -errno. */
double disk_tier_probe(const char *path, uint64_t off, uint64_t bytes, size_t block, int depth,
                       bool *direct, bool *uring);
void disk_tier_reset_stats(struct disk_tier *t);

#endif
