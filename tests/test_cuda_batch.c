/* cuda batch: lockstep decode on the GPU against the same streams decoded one at a time
 * (tests/batchcheck.h), in every placement: all resident (also with each step shape recorded
 * once as a CUDA graph and replayed), the expert cache with too few slots
 * for one step's experts (copy and zero-copy fills), hybrid (misses split with the CPU lane),
 * static (layer 0's experts on the CPU), on a generated `tiny` f32 checkpoint, and all resident
 * and copy-cached on the shipped default model (q4_k_m). Exits 77 without a GPU.
 * Tolerances: measured errors are printed. On an H200 every placement but hybrid gave the
 * single-stream logits bit for bit (tiny f32) or within 3.5e-7 (the default model's chunked
 * prompt); the bounds are 1e-3 and 5e-2. Hybrid's lanes are chosen by measured costs, so a row
 * may be computed by the CPU in one run and the GPU in the other: 2.8e-7 (tiny f32) and 0.078
 * (default model, 8-bit activations on both lanes, 16 steps), held to test_cuda_residency's
 * CPU-lane bound of 0.2 and 90% of the argmaxes. */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "batchcheck.h"
#include "gen.h"
#include "quant_mix.h"

static char tmpdir[] = "/tmp/strata-test-cuda-batch-XXXXXX";

struct place {
    const char *name;
    enum strata_placement placement;
    enum strata_fill fill;
    int slots, cpu_layers;
    unsigned flags;
};

static void check_places(const char *model, const char *path, const struct place *pl, int n,
                         const struct tolerance *tol, const struct tolerance *tol_hybrid)
{
    for (int i = 0; i < n; i++) {
        struct strata_config cfg;
        char label[128];
        strata_config_init(&cfg);
        cfg.device = STRATA_DEVICE_CUDA;
        cfg.placement = pl[i].placement;
        cfg.fill = pl[i].fill;
        cfg.expert_slots = pl[i].slots;
        cfg.cpu_moe_layers = pl[i].cpu_layers;
        cfg.flags = pl[i].flags;
        snprintf(label, sizeof(label), "%s, %s", model, pl[i].name);
        check_model(&cfg, label, path,
                    pl[i].placement == STRATA_PLACEMENT_HYBRID ? tol_hybrid : tol);
    }
}

int main(void)
{
    char f32[512], path[512];

    if (!test_gpu_available("test_cuda_batch"))
        return TEST_SKIP;
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    const struct gen_preset *p = gen_preset_find("tiny");
    if (test_gen_model(p, QUANT_MIX_F32, 7, tmpdir, "tiny", f32, sizeof(f32))) {
        fprintf(stderr, "setup: %s\n", strata_error());
        return 1;
    }
    /* tiny: 2 layers of 8 experts, 2 used; four streams select up to 8 per layer */
    const struct place tiny[] = {
        {"all resident", STRATA_PLACEMENT_STREAM, STRATA_FILL_COPY, 0, 0, 0},
        /* head_dim 32: no one-launch attention, so --graph runs lockstep steps eagerly */
        {"all resident, --graph", STRATA_PLACEMENT_STREAM, STRATA_FILL_COPY, 0, 0,
         STRATA_FLAG_GRAPH},
        {"3 slots, copy", STRATA_PLACEMENT_STREAM, STRATA_FILL_COPY, 3, 0, 0},
        {"6 slots, copy", STRATA_PLACEMENT_STREAM, STRATA_FILL_COPY, 6, 0, 0},
        {"3 slots, zero-copy", STRATA_PLACEMENT_STREAM, STRATA_FILL_ZEROCOPY, 3, 0, 0},
        {"6 slots, hybrid", STRATA_PLACEMENT_HYBRID, STRATA_FILL_COPY, 6, 0, 0},
        {"static, layer 0 on the CPU", STRATA_PLACEMENT_STATIC, STRATA_FILL_COPY, 0, 1, 0},
    };
    check_places("tiny f32", f32, tiny, 7, &(struct tolerance){1e-3, 95},
                 &(struct tolerance){1e-3, 95});
    test_data_path(path, sizeof(path), "../../models/strata-default.gguf");
    if (access(path, R_OK) == 0) {
        const struct place def[] = {
            {"all resident", STRATA_PLACEMENT_STREAM, STRATA_FILL_COPY, 0, 0, 0},
            {"all resident, graphs", STRATA_PLACEMENT_STREAM, STRATA_FILL_COPY, 0, 0,
             STRATA_FLAG_GRAPH},
            {"40 slots, copy", STRATA_PLACEMENT_STREAM, STRATA_FILL_COPY, 40, 0, 0},
            {"40 slots, zero-copy", STRATA_PLACEMENT_STREAM, STRATA_FILL_ZEROCOPY, 40, 0, 0},
            {"40 slots, hybrid", STRATA_PLACEMENT_HYBRID, STRATA_FILL_COPY, 40, 0, 0},
        };
        check_places("default model", path, def, 5, &(struct tolerance){5e-2, 90},
                     &(struct tolerance){2e-1, 90});
    }
    unlink(f32);
    rmdir(tmpdir);
    return test_finish("test_cuda_batch");
}
