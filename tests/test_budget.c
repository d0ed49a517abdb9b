/* budget: size parsing (units, errors) and the slot arithmetic of --vram-budget, including
 * the message that names the shortfall, and the trunk/slot sizes of a generated model against
 * its tensor table. */
#include <string.h>
#include <unistd.h>

#include "budget.h"
#include "errors.h"
#include "gen.h"
#include "gguf.h"
#include "model.h"
#include "testutil.h"

int main(void)
{
    uint64_t v = 0;
    struct budget_plan p;

    CHECK(budget_parse_size("8G", &v) == 0 && v == 8ull << 30, "8G -> %llu", (unsigned long long)v);
    CHECK(budget_parse_size("7.5GiB", &v) == 0 && v == 15ull << 29, "7.5GiB");
    CHECK(budget_parse_size("8000MB", &v) == 0 && v == 8000000000ull, "8000MB");
    CHECK(budget_parse_size("512m", &v) == 0 && v == 512ull << 20, "512m");
    CHECK(budget_parse_size("123", &v) == 0 && v == 123, "plain bytes");
    CHECK(budget_parse_size("8X", &v) == -EINVAL && strstr(err_msg(), "unknown unit"), "8X");
    CHECK(budget_parse_size("lots", &v) == -EINVAL, "no number");
    CHECK(budget_parse_size("-1G", &v) == -EINVAL, "negative");

    /* 8 GiB, 2 GiB trunk, 0.5 GiB kv, 0.25 GiB scratch, 3 MiB slots, 48 layers */
    CHECK(budget_plan_slots(8ull << 30, 2ull << 30, 1ull << 29, 1ull << 28, 3ull << 20, 48, &p) == 0,
          "plan");
    CHECK(p.n_slots == ((8ull << 30) - (2ull << 30) - (1ull << 29) - (1ull << 28)) / (3ull << 20),
          "slots %llu", (unsigned long long)p.n_slots);
    CHECK(p.n_slots == 1792 && p.per_layer == 1792.0 / 48, "5.25 GiB / 3 MiB = 1792 slots, %g per layer", p.per_layer);
    CHECK(budget_plan_slots(2ull << 30, 2ull << 30, 1ull << 29, 0, 3ull << 20, 48, &p) == -ENOSPC &&
              strstr(err_msg(), "512.0 MiB short"),
          "shortfall message: %s", err_msg());
    /* sizes from 1 GiB up in GiB, smaller ones in MiB (a tiny model's is not "0.00 GiB") */
    CHECK(budget_plan_slots(1ull << 30, 3ull << 30, 1ull << 20, 0, 3ull << 20, 48, &p) == -ENOSPC &&
              strstr(err_msg(), "1.00 GiB is 2.00 GiB short") && strstr(err_msg(), "1.0 MiB"),
          "shortfall message: %s", err_msg());
    CHECK(budget_plan_slots(1ull << 30, 0, 0, 0, 0, 48, &p) == -EINVAL, "zero slot");

    /* a generated model: trunk + experts = every tensor's bytes */
    char dir[] = "/tmp/strata-test-budget-XXXXXX", path[256];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof(path), "%s/tiny.gguf", dir);
    struct gen_config gc = {.arch = "qwen3moe", .preset = *gen_preset_find("tiny"),
                            .mix = QUANT_MIX_Q4_K_M, .seed = 3, .n_threads = 2, .out_path = path};
    struct model *m = NULL;
    if (gen_file_write(&gc, NULL) == 0 && model_open(path, &m) == 0) {
        uint64_t trunk, slot, all = 0, experts = 0;
        budget_model_sizes(m, &trunk, &slot);
        for (uint64_t i = 0; i < m->file->n_tensors; i++)
            all += m->file->tensors[i].size;
        for (uint32_t l = 0; l < m->hp.n_layer; l++)
            experts += model_expert_bytes(m, l) * m->hp.n_expert;
        CHECK(trunk + experts == all, "trunk %llu + experts %llu != %llu",
              (unsigned long long)trunk, (unsigned long long)experts, (unsigned long long)all);
        CHECK(slot == model_expert_bytes(m, 0), "slot size");
        model_close(m);
    } else {
        CHECK(0, "gen/open: %s", err_msg());
    }
    unlink(path);
    rmdir(dir);
    return test_finish("test_budget");
}
