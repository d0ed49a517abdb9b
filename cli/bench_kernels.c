/* strata bench-kernels: CPU matvec speed per weight type, measured against the host's read
 * bandwidth in the same run.
 *
 * For each type a weight matrix larger than the caches (default >= 1 GiB) is filled with
 * rows quantized by quant_ref from random normals (a tile of rows repeated), and
 * y = W x (matmul, m = 1) is timed with one thread and with all threads. The read bandwidth
 * is a streaming sum over a buffer as large as the largest matrix, with the same thread counts
 * and the same static contiguous split, timed alternately with each matvec so that the
 * fraction compares runs made under the same machine state (shared hosts drift). Every figure
 * is the median of repetitions run for --seconds each. GB = 1e9 bytes.
 */
#include <errno.h>
#include <getopt.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "args.h"
#include "cli.h"
#include "cpu_features.h"
#include "errors.h"
#include "gemm.h"
#include "matmul.h"
#include "membw.h"
#include "quant.h"
#include "quant_ref.h"
#include "rng.h"
#include "sysinfo.h"
#include "vec_dot.h"

#define BENCH_DEFAULT_TYPES "q8_0,q4_0,mxfp4,q4_k,q5_k,q6_k,f16,bf16"
#define BENCH_DEFAULT_COLS 4096
#define BENCH_DEFAULT_MIB 1024
#define BENCH_DEFAULT_SECONDS 1.0
#define BENCH_MAX_TYPES 16
#define BENCH_MIN_REPS 3
#define BENCH_MAX_REPS 200
#define BENCH_TILE_ROWS 256 /* distinct quantized rows, repeated to fill the matrix */

struct bench_opts {
    int threads; /* all-threads count */
    enum quant_type types[BENCH_MAX_TYPES];
    int n_types;
    int64_t rows; /* 0: from mib */
    int64_t cols;
    int64_t mib;
    double seconds; /* per measurement */
    int batch;      /* > 1: also time m = batch */
};

static void bench_usage(FILE *out)
{
    fprintf(out,
            "usage: strata bench-kernels [options]\n\n"
            "Times CPU matvec (y = W x) per weight type with one thread and with all threads,\n"
            "next to the host read bandwidth measured in the same run (alternating with it), and\n"
            "prints GB/s of weight bytes and the fraction of read bandwidth. Medians of\n"
            "repetitions; GB = 1e9 bytes.\n\n"
            "options:\n"
            "  --threads N     threads for the all-threads column (default: OpenMP's, %d)\n"
            "  --types LIST    comma-separated weight types (default %s)\n"
            "  --rows R        weight rows (default: enough for --mib)\n"
            "  --cols C        weight columns (default %d)\n"
            "  --mib M         minimum matrix size in MiB when --rows is not given (default %d)\n"
            "  --seconds S     time per measurement (default %.1f)\n"
            "  --batch M       also time m = M activation rows, 2..%d (default: only m = 1)\n"
            "  -h, --help      this text\n",
            omp_get_max_threads(), BENCH_DEFAULT_TYPES, BENCH_DEFAULT_COLS, BENCH_DEFAULT_MIB,
            BENCH_DEFAULT_SECONDS, MATMUL_MAX_BATCH);
}

static int bench_usage_error(const char *what, const char *arg)
{
    fprintf(stderr,
            "strata bench-kernels: %s '%s'\n(strata bench-kernels --help lists the "
            "options)\n",
            what, arg);
    return 2;
}

static int parse_types(const char *list, struct bench_opts *o)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", list);
    o->n_types = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        enum quant_type t;
        if (o->n_types == BENCH_MAX_TYPES)
            return err_set(-EINVAL, "more than %d types", BENCH_MAX_TYPES);
        if (quant_type_parse(tok, &t))
            return -EINVAL;
        if (!vec_dot_supported(t))
            return err_set(-EINVAL, "no CPU dot kernel for %s", quant_type_name(t));
        o->types[o->n_types++] = t;
    }
    return o->n_types ? 0 : err_set(-EINVAL, "empty type list");
}

#define BK "bench-kernels"

static int bench_parse(int argc, char **argv, struct bench_opts *o)
{
    static const struct option longopts[] = {{"threads", required_argument, NULL, 't'},
                                             {"types", required_argument, NULL, 'y'},
                                             {"rows", required_argument, NULL, 'r'},
                                             {"cols", required_argument, NULL, 'c'},
                                             {"mib", required_argument, NULL, 'm'},
                                             {"seconds", required_argument, NULL, 's'},
                                             {"batch", required_argument, NULL, 'b'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    long long v;
    int c;

    *o = (struct bench_opts){.threads = omp_get_max_threads(),
                             .cols = BENCH_DEFAULT_COLS,
                             .mib = BENCH_DEFAULT_MIB,
                             .seconds = BENCH_DEFAULT_SECONDS,
                             .batch = 1};
    if (parse_types(BENCH_DEFAULT_TYPES, o))
        return cli_fail("bench-kernels");
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 't':
            if (args_threads(BK, "--threads", optarg, 1, ARGS_MAX_THREADS, &o->threads))
                return 2;
            break;
        case 'y':
            if (parse_types(optarg, o))
                return cli_fail("bench-kernels --types");
            break;
        case 'r':
            if (args_int(BK, "--rows", optarg, 1, INT64_C(1) << 32, &v))
                return 2;
            o->rows = v;
            break;
        case 'c':
            if (args_int(BK, "--cols", optarg, 1, INT64_C(1) << 24, &v))
                return 2;
            o->cols = v;
            break;
        case 'm':
            if (args_int(BK, "--mib", optarg, 1, INT64_C(1) << 20, &v))
                return 2;
            o->mib = v;
            break;
        case 's':
            if (args_float(BK, "--seconds", optarg, 0, 3600, &o->seconds))
                return 2;
            if (!(o->seconds > 0 && o->seconds < 3600))
                return args_fail(BK, "--seconds", optarg, "a duration in seconds, 0 < S < 3600");
            break;
        case 'b':
            if (args_i32(BK, "--batch", optarg, 1, MATMUL_MAX_BATCH, &o->batch))
                return 2;
            break;
        case 'h':
            bench_usage(stdout);
            return 0;
        default:
            return 2;
        }
    }
    if (optind < argc)
        return bench_usage_error("unexpected argument", argv[optind]);
    for (int i = 0; i < o->n_types; i++)
        if (o->cols % vec_dot_block(o->types[i]))
            return bench_usage_error("--cols is not a multiple of the block size of",
                                     quant_type_name(o->types[i]));
    return -1; /* go on */
}

/* ---- timing ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* Alternates runs of a(ctx_a) and b(ctx_b) for about `seconds` (BENCH_MIN_REPS..BENCH_MAX_REPS
 * pairs, after one warm-up pair) and stores the median duration of each: interleaving makes
 * the two see the same machine state (other load, memory clock) so their ratio is stable. */
static void time_pair(void (*a)(void *), void *ctx_a, void (*b)(void *), void *ctx_b,
                      double seconds, double *ta, double *tb)
{
    double da[BENCH_MAX_REPS], db[BENCH_MAX_REPS];
    int n = 0;
    a(ctx_a);
    b(ctx_b);
    double start = now_s();
    while (n < BENCH_MAX_REPS && (n < BENCH_MIN_REPS || now_s() - start < seconds)) {
        double t0 = now_s();
        a(ctx_a);
        double t1 = now_s();
        b(ctx_b);
        da[n] = t1 - t0;
        db[n++] = now_s() - t1;
    }
    *ta = median(da, n);
    *tb = median(db, n);
}

/* ---- read bandwidth: the shared probe (cpu_kernels/membw.h) ---- */

struct read_ctx {
    const uint8_t *buf;
    size_t bytes; /* multiple of 64 * threads */
    int threads;
    uint64_t sink;
};

static void read_run(void *p)
{
    struct read_ctx *c = p;
    c->sink += membw_sweep(c->buf, c->bytes, c->threads);
}

/* ---- matvec ---- */

struct mv_ctx {
    struct matmul_args args;
    int rc;
};

static void mv_run(void *p)
{
    struct mv_ctx *c = p;
    int rc = matmul_run(&c->args);
    if (rc)
        c->rc = rc;
}

/* Fills rows x cols of `type` at w: BENCH_TILE_ROWS rows quantized from random normals, then
 * copied over the whole matrix in parallel (first touch by the threads that will read it). */
static int fill_matrix(uint32_t type, uint8_t *w, int64_t rows, int64_t cols, int threads)
{
    size_t row_bytes = vec_dot_row_bytes(type, cols);
    int64_t tile_rows = rows < BENCH_TILE_ROWS ? rows : BENCH_TILE_ROWS;
    uint8_t *tile = malloc((size_t)tile_rows * row_bytes);
    float *x = malloc((size_t)cols * sizeof(float));
    struct rng r;
    if (!tile || !x) {
        free(tile), free(x);
        return err_set(-ENOMEM, "no memory for the weight tile");
    }
    rng_seed(&r, 1, type);
    for (int64_t i = 0; i < tile_rows; i++) {
        uint8_t *dst = tile + i * row_bytes;
        for (int64_t j = 0; j < cols; j++)
            x[j] = 0.02f * rng_normal(&r);
        if (quant_ref_can_quantize(type)) {
            quant_ref_quantize(type, x, dst, cols);
        } else {
            /* random codes (the speed does not depend on the values); masking every byte
             * with 0x3b keeps each f16 field's exponent below 15, so scales stay finite */
            for (size_t k = 0; k < row_bytes; k++)
                dst[k] = (uint8_t)(rng_u32(&r) & 0x3b);
        }
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < rows; i++)
        memcpy(w + i * row_bytes, tile + (i % tile_rows) * row_bytes, row_bytes);
    free(tile);
    free(x);
    return 0;
}

struct type_result {
    double read_gbs[2]; /* read bandwidth: 1 thread, all threads */
    double mv_gbs[2];   /* matvec GB/s of weights: 1 thread, all threads */
    double batch_gbs;   /* all threads, m = batch (0: not measured) */
};

/* Times one type: matvec interleaved with the read kernel over `rd` at each thread count. */
static int bench_type(const struct bench_opts *o, uint32_t type, int64_t rows, struct read_ctx *rd,
                      struct type_result *res)
{
    size_t row_bytes = vec_dot_row_bytes(type, o->cols);
    size_t bytes = (size_t)rows * row_bytes;
    uint8_t *w = membw_alloc(bytes, o->threads);
    float *x = malloc((size_t)(MATMUL_MAX_BATCH * o->cols) * sizeof(float));
    float *y = malloc((size_t)(MATMUL_MAX_BATCH * rows) * sizeof(float));
    size_t sbytes = matmul_scratch_bytes(type, o->cols, MATMUL_MAX_BATCH);
    void *scratch = sbytes ? malloc(sbytes) : NULL;
    int rc = 0;

    if (!w || !x || !y || (sbytes && !scratch)) {
        rc = err_set(-ENOMEM, "no memory for a %.0f MiB %s matrix", bytes / 1048576.0,
                     quant_type_name(type));
        goto out;
    }
    if ((rc = fill_matrix(type, w, rows, o->cols, o->threads)))
        goto out;
    struct rng r;
    rng_seed(&r, 2, type);
    for (int64_t i = 0; i < MATMUL_MAX_BATCH * o->cols; i++)
        x[i] = rng_normal(&r);

    struct mv_ctx c = {.args = {.wtype = type,
                                .w = w,
                                .w_stride = row_bytes,
                                .n_in = o->cols,
                                .n_out = rows,
                                .m = 1,
                                .x = x,
                                .x_stride = o->cols,
                                .y = y,
                                .y_stride = rows,
                                .scratch = scratch,
                                .scratch_bytes = sbytes}};
    const int threads[2] = {1, o->threads};
    for (int k = 0; k < 2; k++) {
        double t_read, t_mv;
        c.args.n_threads = rd->threads = threads[k];
        time_pair(read_run, rd, mv_run, &c, o->seconds, &t_read, &t_mv);
        res->read_gbs[k] = rd->bytes / t_read * 1e-9;
        res->mv_gbs[k] = bytes / t_mv * 1e-9;
    }
    if (o->batch > 1) {
        double t_read, t_mv;
        c.args.m = o->batch;
        time_pair(read_run, rd, mv_run, &c, o->seconds, &t_read, &t_mv);
        res->batch_gbs = bytes / t_mv * 1e-9;
    }
    if (c.rc)
        rc = err_set(c.rc, "matmul_run refused the %s matrix", quant_type_name(type));
out:
    free(w), free(x), free(y), free(scratch);
    return rc;
}

/* Rows for a type: --rows, or enough for --mib, rounded up to 16. */
static int64_t rows_for(const struct bench_opts *o, uint32_t type)
{
    if (o->rows)
        return o->rows;
    size_t row_bytes = vec_dot_row_bytes(type, o->cols);
    int64_t rows = (int64_t)(((uint64_t)o->mib << 20) + row_bytes - 1) / (int64_t)row_bytes;
    return (rows + 15) / 16 * 16;
}

static void print_header(int argc, char **argv, const struct bench_opts *o)
{
    struct sysinfo_host h;
    time_t t = time(NULL);
    char date[64];

    strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S %Z", localtime(&t));
    printf("# command: strata");
    for (int i = 0; i < argc; i++)
        printf(" %s", argv[i]);
    printf("\n# date:    %s\n", date);
    if (sysinfo_host_get(&h) == 0)
        printf("# machine: %s; %d package(s), %d cores, %d threads, %d NUMA node(s), %.1f GiB\n",
               h.cpu_model, h.packages, h.cores, h.pus, h.numa_nodes, h.ram_bytes / 1073741824.0);
    const char *amx = gemm_amx_status();
    printf("# kernels: %s (AMX tiles for m >= 16: %s); OpenMP threads: 1 and %d; %.1f s per "
           "measurement (median)\n",
           cpu_isa_name(cpu_isa_best()), amx ? amx : "yes", o->threads, o->seconds);
}

int cmd_bench_kernels(int argc, char **argv)
{
    struct bench_opts o;
    int rc = bench_parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    print_header(argc, argv, &o);

    /* read bandwidth over a buffer as large as the largest matrix */
    size_t max_bytes = 0;
    for (int i = 0; i < o.n_types; i++) {
        size_t b = (size_t)rows_for(&o, o.types[i]) * vec_dot_row_bytes(o.types[i], o.cols);
        max_bytes = b > max_bytes ? b : max_bytes;
    }
    size_t unit = (size_t)64 * o.threads;
    struct read_ctx rd = {.bytes = (max_bytes + unit - 1) / unit * unit};
    uint8_t *buf = membw_alloc(rd.bytes, o.threads);
    if (!buf) {
        err_set(-ENOMEM, "no memory for a %.0f MiB read buffer", rd.bytes / 1048576.0);
        return cli_fail("bench-kernels");
    }
    rd.buf = buf; /* membw_alloc filled it, by the threads that will read it */
    printf("# read bandwidth: streaming sum (%s loads) over a %.0f MiB buffer, timed "
           "alternately with each matvec\n\n",
           membw_wide() ? "64-byte" : "16-byte", rd.bytes / 1048576.0);
    printf("%-6s %9s %6s | %-27s | %-27s", "", "", "", "1 thread", "all threads");
    printf("\n%-6s %9s %6s | %8s %10s %6s | %8s %10s %6s", "type", "rows", "MiB", "read", "matvec",
           "frac", "read", "matvec", "frac");
    if (o.batch > 1)
        printf(" | m=%-2d matvec", o.batch);
    printf("\n");
    for (int i = 0; i < o.n_types; i++) {
        uint32_t type = o.types[i];
        int64_t rows = rows_for(&o, type);
        struct type_result res = {0};
        if (bench_type(&o, type, rows, &rd, &res)) {
            free(buf);
            return cli_fail("bench-kernels");
        }
        printf("%-6s %9lld %6.0f", quant_type_name(type), (long long)rows,
               rows * (double)vec_dot_row_bytes(type, o.cols) / 1048576.0);
        for (int k = 0; k < 2; k++)
            printf(" | %8.1f %10.1f %5.0f%%", res.read_gbs[k], res.mv_gbs[k],
                   100 * res.mv_gbs[k] / res.read_gbs[k]);
        if (o.batch > 1)
            printf(" | %11.1f", res.batch_gbs);
        printf("\n");
        fflush(stdout);
    }
    free(buf);
    return 0;
}
