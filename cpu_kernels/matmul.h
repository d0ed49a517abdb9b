/* matmul: y = W x on the CPU for a quantized weight matrix W (n_out rows of n_in) and a small
 * batch of m = 1..MATMUL_MAX_BATCH activation rows (m = 1 is the decode matvec), OpenMP.
 *
 * The activations are converted once per call to the format of vec_dot (vec_dot.h); threads
 * then take contiguous ranges of output rows (so each streams its own part of W in order).
 * Batches of GEMM_MIN_M rows or more go through the gemm kernel where the host has one
 * (gemm.h: 16 weight rows at a time against every activation row); otherwise each weight row
 * is used for up to 16 activation rows while it is in L1. Every output element is computed by
 * one thread, and every path (vec_dot, vec_dot_rows, gemm) gives it the bits of vec_dot on its
 * row, so results depend neither on the thread count nor on the number of activation rows in
 * the call: a batch of m rows gives each row what m = 1 gives it.
 */
#ifndef STRATA_MATMUL_H
#define STRATA_MATMUL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MATMUL_MAX_BATCH 64

struct matmul_args {
    uint32_t wtype;       /* ggml type id of W; vec_dot_supported(wtype) */
    const void *w;        /* (n_out rows of w_stride bytes) weight rows, any host memory */
    size_t w_stride;      /* bytes between weight rows, >= vec_dot_row_bytes(wtype, n_in) */
    int64_t n_in;         /* elements per weight row, a multiple of vec_dot_block(wtype) */
    int64_t n_out;        /* weight rows = outputs per activation row */
    int m;                /* activation rows, 1..MATMUL_MAX_BATCH */
    const float *x;       /* (m rows of x_stride floats) activations, n_in used per row */
    int64_t x_stride;     /* floats between activation rows, >= n_in */
    float *y;             /* (m rows of y_stride floats) outputs, n_out written per row */
    int64_t y_stride;     /* floats between output rows, >= n_out */
    void *scratch;        /* matmul_scratch_bytes() bytes for the converted activations,
                           * caller-owned; NULL: allocated and freed inside the call */
    size_t scratch_bytes; /* size of scratch */
    int n_threads;        /* threads to use; 0: OpenMP's default */
};

/* Scratch bytes matmul_run needs for these shapes (0 for F32/F16/BF16 weights, whose
 * activations are used as they are). */
size_t matmul_scratch_bytes(uint32_t wtype, int64_t n_in, int m);

/* Validates the arguments: 0, or -EINVAL for an unsupported type, a shape that is not a block
 * multiple, m out of range, a stride too small, a NULL pointer or too little scratch. */
int matmul_check(const struct matmul_args *a);

/* y = W x. Returns 0, -EINVAL (see matmul_check) or -ENOMEM (scratch allocation). */
int matmul_run(const struct matmul_args *a);

/* y_i = W_i x for the n (1..MATMUL_MAX_N) calls a[i], which share wtype, n_in, m, x and
 * x_stride (a layer's q, k and v): one parallel region, the activations converted once, the
 * rows of all n matrices handed out as one range. Each output as matmul_run gives it. Returns
 * 0, -EINVAL (matmul_check of any call, or calls that differ in what they share) or -ENOMEM. */
#define MATMUL_MAX_N 4
int matmul_run_n(int n, const struct matmul_args *a);

/* Rows go out in units of 16 (a cache line of outputs), or of 4 for one activation row where
 * 16-row units would leave threads without work (fewer than two a thread: a MoE router's 128
 * rows); either way each row's dot is the same. 0 keeps 16 for every matrix (as
 * STRATA_MATMUL_FINE=0 in the environment does), for comparisons and tests. */
void matmul_set_fine_units(int on);

/* ---- pieces for callers that run their own parallel region (expert_ffn) ---- */

/* The OpenMP team for a call with `units` independent pieces of work: 1 when there is only
 * one, else n_threads (> 0) or all of OpenMP's threads, never fewer because the work is small.
 * libgomp ends the pool threads a smaller team leaves out and starts new ones for the next
 * larger team; alternating a router's 8-thread team with 16-thread expert calls cost 0.3-0.9
 * ms a layer in thread starts on the 16-vCPU guest (bench/cpu-decode.md). Threads without work
 * wait at the region's end. */
int matmul_team(int n_threads, int64_t units);

/* Hands out items [0, total) in contiguous chunks from the shared counter *next (0 before the
 * first call): a chunk of half a thread's share of what is left (at least one item) when
 * `shrink`, else one item. Returns the chunk's first item and sets *n to its size, 0 once
 * everything is taken. The chunks shrink towards the end, so the threads finish close together;
 * and since any thread may take any chunk, one the OS or hypervisor preempts does not hold up
 * the rest. */
int64_t matmul_grab(atomic_llong *next, int64_t total, int nth, bool shrink, int64_t *n);

/* Row range [*r0, *r1) of thread ith of nth: contiguous, in units of 16 rows (64 bytes of
 * float output) so that threads never share an output cache line. */
void matmul_split(int64_t n_out, int ith, int nth, int64_t *r0, int64_t *r1);

/* Rows [r0, r1) of y = W x for activations already converted: act holds a->m rows of
 * act_stride bytes in the vec_dot format of a->wtype (a->x and a->scratch are not used). */
void matmul_rows(const struct matmul_args *a, const void *act, size_t act_stride, int64_t r0,
                 int64_t r1);

#endif
