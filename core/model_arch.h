/* model_arch: the loaders of the architectures strata reads, one per GGUF general.architecture:
 * each reads its {arch}.* keys into m->hp and fills m's weights, validating keys, shapes and
 * types (the forwards live in runtime/arch/). */
#ifndef STRATA_MODEL_ARCH_H
#define STRATA_MODEL_ARCH_H

struct model;

struct model_arch {
    const char *name; /* general.architecture */
    int (*load)(struct model *m); /* 0 or -errno, message set */
};

/* The loader of architecture NAME, or NULL. */
const struct model_arch *model_arch_find(const char *name);

int model_qwen3moe_load(struct model *m);
int model_gptoss_load(struct model *m);
int model_qwen3next_load(struct model *m); /* qwen3next and qwen35moe */

#endif
