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
    /* on the CPU a matmul row's bits do not depend on its batch (cpu_kernels/vec_dot.h), so
     * every lockstep row equals its single-stream row bit for bit, the default model's (Q4_K
     * gate/up: the batched rows take the gemm kernels) included */
    check_model(&cpu, "tiny f32", f32, &(struct tolerance){0, 100});
    check_model(&cpu, "tiny q8_0", q8, &(struct tolerance){0, 100});
    test_data_path(path, sizeof(path), "../../models/strata-default.gguf");
    if (access(path, R_OK) == 0)
        check_model(&cpu, "default model", path, &(struct tolerance){0, 100});
    unlink(f32);
    unlink(q8);
    rmdir(tmpdir);
    return test_finish("test_batch");
}
