/* batch: lockstep decode (strata_batch_*, runtime/stream.h's stream_batch) on the CPU, against
 * the same streams decoded one at a time (tests/batchcheck.h), on generated `tiny` checkpoints
 * in f32 and q8_0 and on the shipped default model (q4_k_m). Models are fixed (gen seeds). */
#include <stdlib.h>
#include <unistd.h>

#include "batchcheck.h"
#include "gen.h"
#include "quant_mix.h"

static char tmpdir[] = "/tmp/strata-test-batch-XXXXXX";

int main(void)
{
    char f32[512], q8[512], path[512];
    struct strata_config cpu;
    strata_config_init(&cpu);
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    const struct gen_preset *p = gen_preset_find("tiny");
    if (test_gen_model(p, QUANT_MIX_F32, 7, tmpdir, "tiny", f32, sizeof(f32)) ||
        test_gen_model(p, QUANT_MIX_Q8_0, 7, tmpdir, "tiny", q8, sizeof(q8))) {
        fprintf(stderr, "setup: %s\n", strata_error());
        return 1;
    }
    /* measured on the development machine: the tiny f32 and q8_0 models give every lockstep
     * row bit for bit (0), the default model (Q4_K gate/up: the batched rows take the gemm
     * kernels) 4.0e-7; the tolerances leave a margin of over 10x */
    check_model(&cpu, "tiny f32", f32, &(struct tolerance){1e-6, 95});
    check_model(&cpu, "tiny q8_0", q8, &(struct tolerance){1e-6, 95});
    test_data_path(path, sizeof(path), "../../models/strata-default.gguf");
    if (access(path, R_OK) == 0)
        check_model(&cpu, "default model", path, &(struct tolerance){1e-5, 95});
    unlink(f32);
    unlink(q8);
    rmdir(tmpdir);
    return test_finish("test_batch");
}
